"""The operator's steering commands: `.memos/cache/evict` and `.memos/cache/drop`.

A line written into either names a slot, a session, an agent or any
directory below a session (`agent/session/slot`, `agent/session`, `agent`),
and acts on every slot at or below it:

    evict   the slot leaves memory for the SSD tier: a dirty version is
            written back first, then its pages are freed.  It stays listed,
            and its next read brings it back (an SSD hit).
    drop    the slot leaves memory only if the SSD tier already holds its
            version (clean): no write, no wait for the disk.  A dirty slot
            stays (EBUSY): `evict` writes it back first.

Neither ever deletes a slot (`reset_context` does): what leaves memory stays
on the SSD tier.  A pinned slot stays (EBUSY: unpin it first), and so does
every slot of a mount without an SSD tier (EOPNOTSUPP: memory holds the only
copy).  A slot written or replaced while the command ran is left as it is.
The command goes on past a slot that stays, and the write then fails with
the errno of the first one, naming it (the log, and `.memos/why` for the
writer); the others moved.

Who: root, or the owner of what the line names -- a uid other than 0 acts
only on the slots it owns (others below the directory it names are passed
over), and gets EACCES for a name it does not own or that does not exist
below something it does not own (so a name in another agent's private tree
is not confirmed by ENOENT).  The files are 0622: every uid may write, only
root reads (an empty file).  Pinning is the slot's `user.memos.pin`
attribute (memosfs/fuse/xattrs.py); `memosfs ls`, `evict`, `drop`, `pin`
and `unpin` (memosfs/cachectl.py) are the commands over all of it.

Owns: `Steering` (parsing the lines, the owner rule, the walk over the
slots, the summary line).  May call: the store (move_out), trio (the
write-backs run in a worker thread); of the filesystem (`ops`) only root
and mounted.
"""

from __future__ import annotations

import errno
import logging
from typing import TYPE_CHECKING, Iterator, Optional

import trio

from memosfs.fuse.nodes import CONTROL_DIR, Dir, Node, Slot

if TYPE_CHECKING:
    from memosfs.fuse.operations import MemosOperations

log = logging.getLogger("memosfs.fuse.operations")      # the daemon's lines as before

__all__ = ["Steering"]

# what move_out answers -> (errno, words) of a slot that stays
_STAYS = {
    "pinned": (errno.EBUSY, "pinned (unpin it first: memosfs unpin, or setfattr -n "
                            "user.memos.pin -v 0)"),
    "dirty": (errno.EBUSY, "dirty: not on the SSD tier yet (evict writes it back first)"),
    "no-ssd": (errno.EOPNOTSUPP, "the mount has no SSD tier (ssd=none): memory holds "
                                 "its only copy"),
    "changed": (errno.EAGAIN, "written or replaced meanwhile"),
}
_SHOWN = 3                                  # slots that stay named in the message


class Steering:
    """`evict` and `drop` of a MemosOperations (`ops`)."""

    def __init__(self, ops: "MemosOperations") -> None:
        self.ops = ops
        self.store = ops.store

    async def evict(self, text: str, uid: int) -> None:
        await self._command("evict", text, uid, write_back=True)

    async def drop(self, text: str, uid: int) -> None:
        await self._command("drop", text, uid, write_back=False)

    # ---- the command ----

    async def _command(self, what: str, text: str, uid: int, write_back: bool) -> None:
        """Every line of text names a node; every slot at or below it that
        uid may steer leaves memory (see the module docstring).  OSError
        for a bad line, a name uid may not steer, or a slot that stays."""
        paths = [line.strip().strip("/") for line in text.splitlines() if line.strip()]
        if not paths:
            raise OSError(errno.EINVAL, f"write agent[/session[/.../slot]] to {what}")
        nodes = [self._resolve(what, p, uid) for p in paths]
        moved = out = 0
        moved_bytes = 0
        stays: list[tuple[str, str]] = []           # (path, outcome)
        for path, node in zip(paths, nodes):
            for slot in self._slots(node, uid):
                outcome = await self._move_out(slot, write_back)
                if outcome == "changed":             # once more, as it is now
                    outcome = await self._move_out(slot, write_back)
                if outcome == "moved":
                    moved += 1
                    moved_bytes += slot.stored
                elif outcome == "out":
                    out += 1
                else:
                    stays.append((slot.key.decode("utf-8", "replace"), outcome))
        log.info("%s %s (uid %d): %d slot%s left memory (%d bytes), %d %s not in memory, "
                 "%d stay", what, ", ".join(paths), uid, moved, "" if moved == 1 else "s",
                 moved_bytes, out, "was" if out == 1 else "were", len(stays))
        if stays:
            code = _STAYS.get(stays[0][1], (errno.EIO, ""))[0]
            shown = "; ".join(f"{key}: {_STAYS.get(o, (0, o))[1]}"
                              for key, o in stays[:_SHOWN])
            more = f" (and {len(stays) - _SHOWN} more)" if len(stays) > _SHOWN else ""
            n = len(stays)
            raise OSError(code, f"{n} slot{'s stay' if n != 1 else ' stays'} in memory, "
                                f"{moved} left it: {shown}{more}")

    async def _move_out(self, slot: Slot, write_back: bool) -> str:
        """store.move_out of the slot's current name (the write-back, if any,
        in a worker thread); a failed write-back is an OSError naming it."""
        key = slot.key
        try:
            if self.ops.mounted:
                return await trio.to_thread.run_sync(self.store.move_out, key, write_back)
            return self.store.move_out(key, write_back)
        except OSError as e:
            raise OSError(e.errno or errno.EIO,
                          f"{key.decode('utf-8', 'replace')} stays in memory: its "
                          f"write-back to the SSD tier failed: {e.strerror or e}") from None

    # ---- names and owners ----

    def _resolve(self, what: str, path: str, uid: int) -> Node:
        """The agent, session, directory or slot `path` names, if uid may
        steer it (root; else its owner).  OSError EINVAL, ENOENT, EACCES."""
        parts = path.split("/")
        if not all(parts) or any(p in (".", "..") for p in parts) \
                or parts[0] in (CONTROL_DIR, ".federated"):
            raise OSError(errno.EINVAL, f"{what}: {path!r} is not agent[/session[/.../slot]]")
        node: Optional[Node] = self.ops.root
        deepest: Node = self.ops.root
        for part in parts:
            node = node.children.get(part) if isinstance(node, Dir) else None
            if node is None:
                break
            deepest = node
        if uid != 0 and deepest.uid != uid:
            raise OSError(errno.EACCES, f"{what} {path}: uid {uid} owns no such slot or "
                                        f"directory (root or the owner may {what})")
        if node is None:
            raise OSError(errno.ENOENT, f"{what} {path}: no such slot or directory")
        return node

    def _slots(self, node: Node, uid: int) -> Iterator[Slot]:
        """The published slots at or below node that uid may steer."""
        todo: list[Node] = [node]
        while todo:
            n = todo.pop()
            if isinstance(n, Dir):
                todo.extend(reversed(list(n.children.values())))
            elif isinstance(n, Slot) and n.version and not n.detached \
                    and (uid == 0 or n.uid == uid):
                yield n
