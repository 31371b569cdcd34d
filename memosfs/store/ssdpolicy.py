"""The SSD tier's eviction order: the memory tier's policy (native/policy.c,
knob `evict_policy`: lru_lfu, lru or lfu) over the slots on the SSD.

A slot is admitted when its first version is written to the SSD, touched on
every use the store counts (a read served from memory or promoted from the
SSD, a publish of a new version: Store._touch), and removed when its file
goes; a slot evicted to make room (ssd_capacity) is remembered in the
policy's ghosts, so that one that comes back soon is admitted as frequent.
Victims come in the policy's order (lru_lfu: probation FIFO first, then the
protected segment's clock), so a slot read again and again outlives a scan
of slots written once, where plain LRU would let the scan push it out.

The state survives a restart: `policy.json` beside order.json (0600,
replaced atomically, fsync'd when order.json is) holds the policy's dump
(native Policy.dump: recency order, segments, reference bits, the
recency/frequency balance, the ghost rings) and the key of each id.  At
mount the dump is restored for the slots still on the SSD; slots it does not
know (written after it was saved) are admitted after it, least recent first
by order.json.  A missing, unreadable or inconsistent file falls back to
order.json's recency order (logged, never a failed mount).

Thread-safety: none here; SSDTier calls every method under its lock.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any, Iterable, Optional

from memosfs import _native

log = logging.getLogger("memosfs.store.ssd")

__all__ = ["SSDPolicy", "STATE_NAME", "STATE_VERSION", "key_hash"]

STATE_NAME = "policy.json"
STATE_VERSION = 1


def key_hash(key: bytes) -> int:
    """A 64-bit hash of a key that is the same in every process (the ghosts
    outlive a restart)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") or 1


class SSDPolicy:
    """The policy over the SSD tier's keys (see the module docstring)."""

    def __init__(self, name: str = "lru_lfu") -> None:
        self.policy = _native.Policy(name)
        self._id: dict[bytes, int] = {}
        self._key: dict[int, bytes] = {}
        self._next = 1
        self.dirty = False                  # changed since the last save
        self.restored = "empty"             # how the last restore went (for tests and logs)

    @property
    def name(self) -> str:
        return self.policy.name

    def select(self, name: str) -> None:
        """Switch the victim order (ValueError for an unknown name)."""
        if name != self.policy.name:
            self.policy.select(name)
            self.dirty = True

    # ---- the tier's events ----

    def written(self, key: bytes) -> None:
        """A version of key reached the SSD: admitted if it is new there."""
        if key in self._id:
            return
        pid = self._next
        self._next += 1
        self.policy.admit(pid, key_hash(key))
        self._id[key] = pid
        self._key[pid] = key
        self.dirty = True

    def used(self, key: bytes) -> None:
        pid = self._id.get(key)
        if pid is not None:
            self.policy.touch(pid)
            self.dirty = True

    def removed(self, key: bytes, evicted: bool = False) -> None:
        pid = self._id.pop(key, None)
        if pid is not None:
            del self._key[pid]
            self.policy.remove(pid, evicted=evicted)
            self.dirty = True

    def renamed(self, old: bytes, new: bytes) -> None:
        """old's version now lives under new (new's previous one is gone)."""
        self.removed(new)
        pid = self._id.pop(old, None)
        if pid is None:
            self.written(new)
            return
        self._id[new] = pid
        self._key[pid] = new
        self.policy.rekey(pid, key_hash(new))
        self.dirty = True

    def victims(self, n: int, skip: Iterable[bytes] = ()) -> list[bytes]:
        """Up to n keys, best victim first (not removed)."""
        ids = {self._id[k] for k in skip if k in self._id}
        return [self._key[i] for i in self.policy.victims(n, skip=ids)]

    def keys(self) -> list[bytes]:
        """Every key, most recently used first."""
        return [self._key[i] for i in self.policy.ids()]

    def __contains__(self, key: bytes) -> bool:
        return key in self._id

    def __len__(self) -> int:
        return len(self._id)

    def stats(self) -> dict[str, Any]:
        return self.policy.stats()

    # ---- persistence ----

    def reset(self, keys_lru_first: Iterable[bytes]) -> None:
        """Start afresh with these keys, least recently used first."""
        self.policy = _native.Policy(self.policy.name)
        self._id.clear()
        self._key.clear()
        for k in keys_lru_first:
            self.written(k)
        self.dirty = True

    def state(self) -> dict[str, Any]:
        """What policy.json holds."""
        return {"version": STATE_VERSION,
                "keys": {str(i): k.decode("utf-8", "surrogateescape")
                         for i, k in self._key.items()},
                "next": self._next,
                "state": self.policy.dump()}

    def restore(self, saved: Optional[Any], present: set[bytes],
                order_lru_first: list[bytes], where: str) -> None:
        """Rebuild from a saved state (None: none was found) for the keys in
        `present`; keys it does not know are admitted after it, in
        order_lru_first's order.  A state that does not check out falls back
        to order_lru_first (logged)."""
        name = self.policy.name
        why = self._restore_saved(saved, present) if saved is not None else "no saved state"
        if why is not None:
            if saved is None:
                log.info("ssd: %s: no policy state; eviction order rebuilt from order.json",
                         where)
            else:
                log.warning("ssd: %s: policy state unusable (%s); eviction order rebuilt "
                            "from order.json", where, why)
            self.restored = "order" if saved is None else "fallback"
            self.reset(k for k in order_lru_first if k in present)
        else:
            self.restored = "state"
            known = set(self._id)
            for k in order_lru_first:
                if k in present and k not in known:
                    self.written(k)
        try:
            self.select(name)
        except ValueError:
            pass
        self.dirty = True

    def _restore_saved(self, saved: Any, present: set[bytes]) -> Optional[str]:
        """Restore `saved`; None when done, else why not (the policy is then
        left empty)."""
        try:
            if not isinstance(saved, dict) or saved.get("version") != STATE_VERSION:
                return "unknown version"
            keys = {int(i): k.encode("utf-8", "surrogateescape")
                    for i, k in saved["keys"].items()}
            state = saved["state"]
            if len(set(keys.values())) != len(keys):
                return "a key twice"
            ids = [n[0] for n in state["nodes"]]
            if set(ids) != set(keys):
                return "ids and keys disagree"
            policy = _native.Policy(str(state["policy"]))
            policy.restore(state)
            policy.check()
            nxt = max([int(saved.get("next", 1))] + [i + 1 for i in keys])
        except (KeyError, TypeError, ValueError, AttributeError, AssertionError) as e:
            return str(e) or type(e).__name__
        self.policy = policy
        self._id = {k: i for i, k in keys.items()}
        self._key = dict(keys)
        self._next = nxt
        for k in [k for k in self._id if k not in present]:     # gone since it was saved
            self.removed(k)
        return None
