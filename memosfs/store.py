"""The store: slot keys, versions and tiers, over the C core.

The store knows slots by key, `b"agent/session/name"`; it knows nothing of
inodes or handles (that is fs.py).  Today it has one tier, memory, held by
`memosfs._native.Cache`; the SSD tier plugs in behind the eviction callback.

Publish: a writer's bytes live in a draft (`Store.draft`); `Store.publish`
makes the draft the slot's new version, atomically, and returns a pinned
reference to it.  Readers pin the version they open (`Store.get`); a newer
publish never changes bytes a reader has pinned.

Drops: a slot can leave the store on its own (eviction, a ring recycling the
oldest slot of a session, reset_context).  Whoever shows the namespace
registers `on_drop(key, reason)` to hear of it.
"""

from __future__ import annotations

import collections
import logging
import threading
from dataclasses import dataclass
from typing import Callable, Optional

from . import _native
from .control import Trace

log = logging.getLogger("memosfs.store")

__all__ = ["Store", "StoreStats", "make_key", "split_key"]


def make_key(agent: str, session: str, name: str) -> bytes:
    return f"{agent}/{session}/{name}".encode("utf-8", "surrogateescape")


def split_key(key: bytes) -> tuple[str, str, str]:
    agent, session, name = key.decode("utf-8", "surrogateescape").split("/", 2)
    return agent, session, name


def _session_of(key: bytes) -> bytes:
    return key.rsplit(b"/", 1)[0]


@dataclass(frozen=True)
class StoreStats:
    """Counters kept above the C core."""
    publishes: int
    ring_recycles: int
    resets: int
    flushes: int
    drops_evicted: int


class Store:
    """Slots by key over the memory tier.  Not thread-safe: one caller (the
    trio loop) at a time; the C core has its own lock for background work."""

    def __init__(self, capacity: int, evict_batch: int = 16, ring_slots: int = 0,
                 trace: Optional[Trace] = None) -> None:
        self.trace = trace or Trace()
        self.ring_slots = ring_slots
        self.cache = _native.Cache(capacity, evict_batch, on_evict=self._on_evict)
        # Per session, its keys in order of first publish (the ring's order).
        self._order: dict[bytes, collections.OrderedDict[bytes, None]] = {}
        self._drop_listeners: list[Callable[[bytes, str], None]] = []
        self._lock = threading.RLock()
        self._publishes = 0
        self._ring_recycles = 0
        self._resets = 0
        self._flushes = 0
        self._drops_evicted = 0

    # ---- listeners ----

    def on_drop(self, fn: Callable[[bytes, str], None]) -> None:
        """Call fn(key, reason) whenever a slot leaves the store by itself."""
        self._drop_listeners.append(fn)

    def _dropped(self, key: bytes, reason: str) -> None:
        order = self._order.get(_session_of(key))
        if order is not None:
            order.pop(key, None)
        for fn in self._drop_listeners:
            try:
                fn(key, reason)
            except Exception:  # a listener must never break the store
                log.exception("drop listener failed for %r", key)

    def _on_evict(self, ref: "_native.Ref") -> bool:
        """Eviction callback from the C core (the victim is pinned)."""
        key = ref.key
        self.trace.emit("EVICT", key=key.decode("utf-8", "replace"), bytes=ref.size,
                        version=ref.version, dirty=int(ref.dirty))
        if ref.dirty:
            log.info("evicting dirty slot %s (%d bytes): no SSD tier holds it",
                     key.decode("utf-8", "replace"), ref.size)
        self._drops_evicted += 1
        self._dropped(key, "evicted")
        return True

    # ---- reads ----

    def get(self, key: bytes) -> Optional["_native.Ref"]:
        """Open a slot for reading: a pinned reference, counted as a hit, or None."""
        return self.cache.get(key)

    def peek(self, key: bytes) -> Optional["_native.Ref"]:
        """A pinned reference without counting or touching the policy."""
        return self.cache.peek(key)

    def __contains__(self, key: bytes) -> bool:
        ref = self.cache.peek(key)
        if ref is None:
            return False
        ref.release()
        return True

    # ---- writes ----

    def draft(self, base: Optional["_native.Ref"] = None) -> "_native.Draft":
        return self.cache.draft(base)

    def publish(self, draft: "_native.Draft", key: bytes) -> "_native.Ref":
        """Make `draft` the slot's new version; returns a pinned reference."""
        ref = self.cache.publish(draft, key, dirty=True)
        self._publishes += 1
        sess = _session_of(key)
        order = self._order.setdefault(sess, collections.OrderedDict())
        if key not in order:
            order[key] = None
            self._recycle(sess, order, keep=key)
        self.trace.emit("PUBLISH", key=key.decode("utf-8", "replace"), bytes=ref.size,
                        version=ref.version)
        return ref

    def _recycle(self, sess: bytes, order: "collections.OrderedDict[bytes, None]",
                 keep: bytes) -> None:
        limit = self.ring_slots
        while limit and len(order) > limit:
            oldest = next(iter(order))
            if oldest == keep:
                break
            self._ring_recycles += 1
            self.cache.remove(oldest)
            self.trace.emit("RING_RECYCLE", key=oldest.decode("utf-8", "replace"))
            self._dropped(oldest, "ring")

    def remove(self, key: bytes) -> bool:
        order = self._order.get(_session_of(key))
        if order is not None:
            order.pop(key, None)
        removed = self.cache.remove(key)
        if removed:
            self.trace.emit("REMOVE", key=key.decode("utf-8", "replace"))
        return removed

    def rename(self, old: bytes, new: bytes) -> bool:
        """Move a slot to a new key, replacing what was there."""
        ok = self.cache.rename(old, new)
        src = self._order.get(_session_of(old))
        if src is not None:
            src.pop(old, None)
        dst = self._order.get(_session_of(new))
        if dst is not None:
            dst.pop(new, None)
        if ok:
            sess = _session_of(new)
            self._order.setdefault(sess, collections.OrderedDict())[new] = None
            self.trace.emit("RENAME", src=old.decode("utf-8", "replace"),
                            dst=new.decode("utf-8", "replace"))
        return ok

    def session_keys(self, agent: str, session: str) -> list[bytes]:
        order = self._order.get(f"{agent}/{session}".encode("utf-8", "surrogateescape"))
        return list(order) if order else []

    def reset_session(self, agent: str, session: str) -> int:
        """Drop every slot of a session (all tiers); returns how many."""
        keys = self.session_keys(agent, session)
        for key in keys:
            self.cache.remove(key)
            self._dropped(key, "reset")
        self._resets += 1
        self.trace.emit("RESET", session=f"{agent}/{session}", slots=len(keys))
        return len(keys)

    def flush(self) -> None:
        """Persist every dirty slot, then reclaim memory.  With the memory
        tier alone there is nothing to persist to; the reclaim still runs."""
        self._flushes += 1
        self.trace.emit("FLUSH")

    # ---- knobs and stats ----

    def set_capacity(self, n: int) -> None:
        self.cache.set_capacity(n)

    def set_evict_batch(self, n: int) -> None:
        self.cache.set_evict_batch(n)

    def statistics(self) -> StoreStats:
        return StoreStats(self._publishes, self._ring_recycles, self._resets,
                          self._flushes, self._drops_evicted)

    def close(self) -> None:
        self.cache.close()
