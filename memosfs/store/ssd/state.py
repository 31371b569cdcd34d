"""What the SSD tier keeps beside its index (the mixin TierState of
SSDTier, tier.py): the folder's files other than the slots -- order.json,
namespace.json and policy.json, replaced atomically; RUNNING, the mark of a
mount that has not ended cleanly; corrupt/, where what failed its checks is
set aside -- and the eviction order (memosfs/store/ssdpolicy.py) the tier
evicts by beyond ssd_capacity."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Iterable

from memosfs.private import open_private, private_dir
from memosfs.store.ssd.fileio import _discard, _fsync_dir
from memosfs.store.ssd.format import SSDEntry
from memosfs.store.ssdpolicy import STATE_NAME

log = logging.getLogger("memosfs.store.ssd")

POLICY_SAVE_S = 10.0                      # background saves of policy.json, at most this often
RUNNING = ".running"                      # from a mount's scan until its clean unmount


class TierState:
    """SSDTier's methods for the folder's files and the eviction order
    (`self` is the SSDTier: root, lock, policy, corrupt_dir, counters)."""

    # ---- the mark of a mount (docs/ssd-format.md, "What a power loss leaves") ----

    def _mark_running(self) -> None:
        """RUNNING made durable before this daemon writes anything back (a
        power loss from now on finds it: `scan`)."""
        path = os.path.join(self.root, RUNNING)
        try:
            fd = open_private(path, os.O_WRONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            _fsync_dir(self.root)
        except OSError as e:
            log.warning("ssd: cannot make %s (%s): a slot file a power loss cuts short "
                        "will be called corrupt at the next mount", path, e)

    def closed_clean(self) -> None:
        """At a clean unmount, once every slot is saved: every file this daemon
        wrote is fsync'd, then RUNNING goes (the next mount calls any slot file
        that stops short corrupt).  A failure is logged (RUNNING stays)."""
        path = os.path.join(self.root, RUNNING)
        try:
            self.sync()
            os.unlink(path)
            _fsync_dir(self.root)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("ssd: cannot end the mount cleanly in %s (%s): the next mount "
                        "takes a slot file that stops short for a power loss's", path, e)

    # ---- corrupt/ ----

    def _set_aside_bytes(self, name: str, data: bytes, why: str) -> None:
        """Copy bytes that failed their checks into corrupt/name (counted once:
        a copy already there is not counted again)."""
        dest = os.path.join(self.corrupt_dir, name)
        log.error("ssd: corrupt bytes set aside: %s", why)
        if os.path.exists(dest):
            return
        with self.lock:
            self.corrupt += 1
        try:
            private_dir(self.corrupt_dir)
            with open(open_private(dest, os.O_WRONLY | os.O_EXCL), "wb") as f:
                f.write(data)
        except OSError as e:
            log.error("ssd: cannot copy them into %s (%s)", dest, e)

    def _set_aside(self, path: str, why: str) -> None:
        """Move a file that failed its checks into corrupt/ (counted once per
        file: callers make sure it is the file that failed)."""
        with self.lock:
            self.corrupt += 1
        log.error("ssd: corrupt slot file set aside: %s", why)
        self._move_aside(path, os.path.basename(path))

    def _move_aside(self, path: str, name: str) -> None:
        """Move a file into corrupt/name (removed if it cannot be moved)."""
        try:
            private_dir(self.corrupt_dir)
            os.replace(path, os.path.join(self.corrupt_dir, name))
        except OSError as e:
            log.error("ssd: cannot move %s aside (%s); removing it", path, e)
            try:
                os.unlink(path)
            except OSError:
                pass

    # ---- order.json, namespace.json, policy.json ----

    def write_json(self, name: str, obj: Any, durable: bool, fsync: bool = True,
                   dir_sync: bool = True) -> None:
        """Replace root/name atomically with obj as JSON: a temporary file,
        fdatasync'd (unless fsync is False), renamed over the old one.
        durable: the rename too is made durable (the folder fsync'd, unless
        dir_sync is False: the caller fsyncs it once for several files,
        sync_root).  A file whose bytes were not fsync'd before its rename
        can be left empty by a power loss that keeps the rename: only the
        files the mount can do without (order.json, policy.json: the mount
        falls back) are written so (fsync=False), never namespace.json."""
        path = os.path.join(self.root, name)
        tmp = f"{path}.{os.getpid()}.{next(self._seq)}.tmp"     # callers may race
        data = json.dumps(obj, separators=(",", ":")).encode()
        try:
            with open(open_private(tmp, os.O_WRONLY | os.O_EXCL), "wb") as f:
                f.write(data)
                if durable or fsync:
                    f.flush()
                    os.fdatasync(f.fileno())
            os.replace(tmp, path)
        except OSError:
            _discard(tmp)
            raise
        if durable and dir_sync:
            _fsync_dir(self.root)

    def sync_root(self) -> None:
        """fsync the SSD directory itself (the renames of its JSON files)."""
        _fsync_dir(self.root)

    def read_json(self, name: str, default: Any, level: int = logging.ERROR) -> Any:
        """root/name as JSON; default if it is missing, or unreadable (logged
        at `level`: ERROR for namespace.json, whose loss loses directories;
        WARNING for the files the mount rebuilds otherwise)."""
        path = os.path.join(self.root, name)
        try:
            with open(path, "rb") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return default
        except (OSError, ValueError) as e:
            log.log(level, "ssd: %s unreadable (%s); using defaults", path, e)
            return default

    # ---- the eviction order (ssdpolicy.py) ----

    def used(self, key: bytes) -> None:
        """A use of key (a read, a new version published): the policy counts it."""
        with self.lock:
            self.policy.used(key)

    def set_policy(self, name: str) -> None:
        """The evict_policy knob (lru_lfu, lru, lfu); ValueError otherwise."""
        with self.lock:
            self.policy.select(name)

    def victims(self, n: int, skip: Iterable[bytes] = ()) -> list[SSDEntry]:
        """Up to n entries, best victim first by the policy, none of `skip`."""
        with self.lock:
            keys = self.policy.victims(n, skip)
            return [self.index[k] for k in keys if k in self.index]

    def policy_stats(self) -> dict[str, Any]:
        with self.lock:
            return self.policy.stats()

    @property
    def policy_dirty(self) -> bool:
        return self.policy.dirty

    def save_policy(self, durable: bool, dir_sync: bool = True) -> None:
        """policy.json, as order.json is written (atomically, 0600; fsync'd
        when durable).  A save that is not durable is skipped when the last
        one is less than POLICY_SAVE_S old (the state is larger than
        order.json: its ghosts hold up to 6 hashes per slot); a crash then
        loses at most that much of the order's history."""
        now = time.monotonic()
        with self.lock:
            if not durable and now - self._policy_saved < POLICY_SAVE_S:
                return
            state = self.policy.state()
            self.policy.dirty = False
            self._policy_saved = now
        try:
            # (not fsync'd unless durable: a power loss that empties it
            # costs the eviction history only, restore_policy falls back)
            self.write_json(STATE_NAME, state, durable, fsync=durable, dir_sync=dir_sync)
        except BaseException:
            self.policy.dirty = True
            raise

    def restore_policy(self, order_lru_first: list[bytes]) -> str:
        """At mount, after scan: the saved policy state for the slots found,
        else order_lru_first (keys least recent first); returns how
        ("state", "order": no file, "fallback": a file that did not check out)."""
        path = os.path.join(self.root, STATE_NAME)
        saved: Any = None
        try:
            with open(path, "rb") as f:
                saved = json.loads(f.read())
            if saved is None:
                saved = "null"                  # present but not a state
        except FileNotFoundError:
            saved = None
        except (OSError, ValueError) as e:
            saved = {"unreadable": str(e)}     # (policy.restore says so: a WARNING)
        with self.lock:
            self.policy.restore(saved, set(self.index), order_lru_first, path)
            return self.policy.restored
