"""An unmount that would lose acknowledged slots is refused.

A slot whose writer's close succeeded lives in memory, dirty, until the
background writer puts it on the SSD tier.  When the tier cannot take it
(its disk is full; ssd_capacity reached with ssd_full=refuse) the slot stays
dirty in memory, and an unmount then would lose it.  While any slot is in
that state (`Store.unsaved`: its last write-back failed and it is still
dirty) and the `unmount_unsaved` knob is `refuse` (the default), the daemon
holds its own mount busy: it keeps an O_PATH descriptor of the mount's root
open, as a shell whose working directory is there would, so umount(8),
fusermount3 -u and systemd's stop of a mount unit fail with EBUSY ("target is
busy") and the slots stay in memory; the log says which slots and how much
room is missing.  The hold goes once nothing is unsaved (room came and the
background writer's retry succeeded, or the slots were removed) or the knob
is `lose` (`memosfs umount --force` writes it).

Each way to unmount, and what it gets:

- `memosfs umount`: writes `1` into cache/flush (every dirty slot written
  back now); if that fails, reads cache/unsaved and refuses, naming the
  slots and the room missing, unless --force (then: lose, unmount, and the
  daemon's report names what was lost).
- umount(8), fusermount3 -u, `systemctl stop` of the mount unit: EBUSY
  while the hold is there.
- umount -l (lazy): detaches at once; no descriptor can stop it.  The daemon
  sees its mount leave /proc/self/mountinfo and lets go: the connection
  ends when the last file open there closes, and the slots are lost, each
  logged.  umount -f and an abort through fusectl end the connection: the
  slots are lost, and the dead mount point stays until a plain umount.
- a signal: SIGINT (Ctrl-C under `make run`) and SIGHUP flush first; while
  slots remain unsaved the first is refused, saying so on the terminal and
  in the log, and the next one unmounts and loses them.  SIGTERM (kill(1),
  the system's shutdown) unmounts at once: what cannot be saved is lost and
  logged.

The hold is taken off the trio thread (the path walk into the mount sends no
request, but a thread that serves requests must never wait on its own
mount) and checked against the mount's id in /proc/self/mountinfo.

Owns: `UnmountGuard` (the hold, its watch loop, the signal decision),
`Unsaved` (what would be lost: slots, bytes, room; the text of
cache/unsaved and its parse, which the CLI reads).
May call: the store (unsaved, ssd_room, flush), ops.knobs, ops.mountpoint,
ops._mount_id, ops.mounted; the standard library and trio.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:
    from memosfs.fuse.operations import MemosOperations

log = logging.getLogger("memosfs.fuse.operations")

__all__ = ["UnmountGuard", "Unsaved", "human"]

WATCH_S = 0.5           # how often the hold is looked at (taken, let go, still mounted)
NAMED = 10              # slots a message names (then a count)


def human(n: float) -> str:
    """Bytes as `4.0 MiB`."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{int(n)} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"


@dataclass
class Unsaved:
    """Dirty slots the SSD tier could not take: what an unmount would lose."""

    slots: list[tuple[str, int]] = field(default_factory=list)  # (path below the mount,
                                                                # bytes), most recent first
    room: Optional[int] = None      # bytes the SSD tier can still take (None: unknown)
    cause: str = ""                 # why the last write-back failed, in words
    count: int = 0                  # slots (the names may be left out: not root)
    size: int = 0                   # their bytes

    @classmethod
    def of(cls, slots: list[tuple[str, int]], room: Optional[int], cause: str) -> "Unsaved":
        return cls(slots, room, cause, len(slots), sum(n for _, n in slots))

    @property
    def missing(self) -> Optional[int]:
        """About how many more bytes the SSD tier needs for them (None:
        unknown; 0: the room is there now, the next write-back may take them)."""
        return None if self.room is None else max(0, self.size - self.room)

    def text(self, names: bool = True) -> str:
        """cache/unsaved: `name value` lines, then `slot BYTES PATH` for each
        slot (root only: the names are other users' slots)."""
        out = [f"slots {self.count}", f"bytes {self.size}",
               f"room {self.room if self.room is not None else -1}",
               f"missing {self.missing if self.missing is not None else -1}",
               f"cause {self.cause}"]
        if names:
            out += [f"slot {n} {path}" for path, n in self.slots]
        return "\n".join(out) + "\n"

    @classmethod
    def parse(cls, text: str) -> "Unsaved":
        u = cls()
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name == "slot":
                n, _, path = value.partition(" ")
                u.slots.append((path, int(n)))
            elif name in ("slots", "bytes", "room"):
                v = int(value)
                if name == "slots":
                    u.count = v
                elif name == "bytes":
                    u.size = v
                else:
                    u.room = v if v >= 0 else None
            elif name == "cause":
                u.cause = value
        return u

    def say(self) -> str:
        """One sentence: how many, how large, why, the room missing, which."""
        many = "1 slot" if self.count == 1 else f"{self.count} slots"
        text = f"{many} ({human(self.size)}) cannot be written back to the SSD tier"
        if self.cause:
            text += f": {self.cause}"
        if self.missing:
            text += (f"; it has room for {human(self.room or 0)}, about "
                     f"{human(self.missing)} more is needed")
        if self.slots:
            shown = ", ".join(f"{p} ({human(n)})" for p, n in self.slots[:NAMED])
            more = f" and {self.count - NAMED} more" if self.count > NAMED else ""
            text += f": {shown}{more}"
        return text


class UnmountGuard:
    """The hold on the mount while slots cannot be saved (module docstring)."""

    def __init__(self, ops: "MemosOperations") -> None:
        self.ops = ops
        self.fd: Optional[int] = None   # O_PATH descriptor of the mount's root
        self.held_for = 0               # slots unsaved when the hold was last said

    # ---- what would be lost ----

    def report(self) -> Unsaved:
        store = self.ops.store
        got = store.unsaved()
        slots = [(key.decode("utf-8", "replace"), size) for key, _v, size, _why in got]
        return Unsaved.of(slots, store.ssd_room(), got[0][3] if got else "")

    def text(self, uid: Optional[int]) -> str:
        """cache/unsaved as uid reads it: names for root only."""
        return self.report().text(names=uid == 0)

    def flush(self) -> Unsaved:
        """Write every dirty slot back now (off the trio thread), then what
        remains unsaved."""
        try:
            self.ops.store.flush()
        except OSError:
            pass                        # (each failure is logged; the report says)
        return self.report()

    # ---- the hold ----

    def refusing(self) -> bool:
        return self.ops.knobs.get("unmount_unsaved", "refuse") == "refuse"

    def release(self, why: str = "", level: int = logging.INFO) -> None:
        """Let the mount go (a close of an O_PATH descriptor sends no request)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            os.close(fd)
            if why:
                log.log(level, "unmount: %s no longer held busy: %s", self.ops.mountpoint, why)

    def settle(self) -> None:
        """After a flush that saved everything: let the mount go now, not at
        the next look of the watch loop (`memosfs umount` unmounts next)."""
        if self.fd is not None and not self.ops.store.unsaved():
            self.release("every slot is saved")

    def _open_hold(self) -> Optional[int]:
        """An O_PATH descriptor of the mount's root, or None if the path
        does not lead to this mount (any more)."""
        where = getattr(self.ops, "mountpoint", None)
        mnt = self.ops._mount_id()
        if not where or mnt is None:
            return None
        try:
            fd = os.open(where, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            log.debug("unmount hold: cannot open %s: %s", where, e)
            return None
        if _fd_mount_id(fd) != mnt:
            os.close(fd)
            return None
        return fd

    async def watch(self) -> None:
        """Take the hold while slots are unsaved and the knob refuses; let it
        go when they are saved, when the knob says lose, or when the mount
        was detached lazily."""
        import trio
        while True:
            await trio.sleep(WATCH_S)
            if not self.ops.mounted:
                continue
            unsaved = self.ops.store.unsaved() if self.refusing() else []
            if self.fd is not None:
                if not unsaved:
                    self.release("every slot is saved" if self.refusing()
                                 else "unmount_unsaved=lose")
                elif not _mount_listed(self.ops._mount_id()):
                    n = len(unsaved)
                    self.release(f"the mount was detached (umount -l): {n} slot"
                                 f"{'' if n == 1 else 's'} that the SSD tier cannot take "
                                 "will be lost", logging.WARNING)
                continue
            if not unsaved:
                continue
            fd = await trio.to_thread.run_sync(self._open_hold)
            if fd is None:
                continue
            if self.fd is not None or not self.refusing():
                os.close(fd)            # (the knob changed meanwhile)
                continue
            self.fd = fd
            log.warning("unmount refused until room is made (the mount is held busy: "
                        "umount says 'target is busy'; `memosfs umount --force` unmounts "
                        "and loses them): %s", self.report().say())

    # ---- a signal ----

    async def refuse_signal(self) -> Optional[Unsaved]:
        """A signal asks to unmount: the slots that stop it (after a flush),
        or None when it may go on."""
        import trio
        if not self.refusing() or self.ops.store.ssd is None:
            return None
        got = await trio.to_thread.run_sync(self.flush)
        return got if got.count else None


def _fd_mount_id(fd: int) -> Optional[int]:
    try:
        with open(f"/proc/self/fdinfo/{fd}") as f:
            for line in f:
                if line.startswith("mnt_id:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _mount_listed(mnt: Optional[int]) -> bool:
    """Whether mount id mnt is still in this namespace's mount table (a
    lazy unmount takes it out at once); True when that cannot be read."""
    if mnt is None:
        return True
    try:
        with open("/proc/self/mountinfo") as f:
            return any(line.split(" ", 1)[0] == str(mnt) for line in f)
    except OSError:
        return True
