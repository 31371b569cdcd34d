"""The store: slot keys, versions and tiers, over the C core.

The store knows slots by key, `b"agent/session/name"`; it knows nothing of
inodes or handles (that is fs.py).  Two tiers: memory (`memosfs._native.Cache`)
in front, and an optional SSD tier (`ssd.SSDTier`) behind it.

Publish: a writer's bytes live in a draft (`Store.draft`); `Store.publish`
makes the draft the slot's new version, atomically, marks it dirty (not yet
on SSD), and returns a pinned reference to it.  Readers pin the version they
open (`Store.get`); a newer publish never changes bytes a reader has pinned.

Write-back: a dirty version reaches the SSD (1) through the C core's
eviction callback, before its pages are freed, (2) from the background
writer, `writeback_delay_ms` after it was published, (3) on `persist` (fsync
of the slot) and `flush`, and (4) at close.  A clean version is on the SSD
already, so evicting it only frees memory; the slot stays listed and is
promoted back on its next read (an SSD hit).  A close that cannot write
every dirty slot (the SSD tier is full) logs each one, counts them
(`slots_unsaved`) and raises UnsavedSlots.

Namespace changes: `rename` moves the SSD copy with the name (copied under
the new key and renamed over the target's file, the old file removed only
after that), so an acknowledged version always has a copy on the SSD; a
dirty memory copy moves too and stays dirty.  `remove` unlinks the SSD file
at once.  Both are durable after `sync_namespace` (the fsync of a
directory), which also writes namespace.json and order.json durably.

Drops: a slot leaves the namespace only when no tier holds it any more
(eviction with no SSD tier, the SSD tier's own capacity eviction, a ring
recycling the oldest slot of a session, reset_context).  Whoever shows the
namespace registers `on_drop(key, reason)` to hear of it.  Evicting a
version that is no longer its key's current one (replaced, renamed or
removed meanwhile) drops nothing: the name belongs to the current version.

Remote tier (optional, `remote.RemoteTier`, a Redis Cluster shared by several
mounts): reads go memory -> SSD -> remote, and a remote hit is promoted into
memory (dirty, so that the background writer also puts it on the SSD).  Every
publish is queued for upload (write-behind); with `remote_durable`, persist
and flush wait for it.  remove, rename, ring recycling and reset_context
delete the remote copy too (a tombstone, announced), so that no mount brings
back a removed slot; evictions do not (the remote copy is what a later miss
finds).  When another mount announces a new version of a key, the local
copies are dropped unless they are that version (or a local publish of it is
still waiting to go up), and the name is dropped so that the next lookup
finds the new version; when the announcement channel (re)connects, every
local slot is checked against its manifest the same way.

Quantized storage (`quant`, memosfs/store/kvfile.py): with the `quantize`
knob on, a draft is published as its quantized container (`quantize`), and
every tier stores that container; readers get the logical bytes
(`logical`, decoded once per version).

The namespace above (memosfs/fuse) attaches itself with `attach_namespace`
(what the SSD tier keeps beside a slot, namespace.json, and the drop
listener) and has the store build its prefetch engine with `start_prefetch`
(memosfs/store/prefetch.py, fed by `get`, evictions, removes and drops).

May call: memosfs._native, memosfs.store.ssd, .remote (given), .kvfile,
.prefetch, memosfs.trace.  Nothing of memosfs.fuse.

Threads: the trio thread calls in; the background writer and the warm-up
thread run beside it.  `self.lock` guards the Python-side maps and is never
held across file I/O; the C core has its own lock.
"""

from __future__ import annotations

import collections
import errno
import logging
import threading
import time
import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Optional

from memosfs import _native
from memosfs.trace import Trace
from memosfs.store import kvfile
from memosfs.store.prefetch import PrefetchEngine
from memosfs.store.ssd import CorruptSlot, SSDEntry, SSDFull, SSDReader, SSDTier
from memosfs.store.statistics import StoreStats

if TYPE_CHECKING:
    from memosfs.store.remote import RemoteEntry, RemoteTier, RemoteVersion
    from memosfs.store.remote.tier import RemoteStats

log = logging.getLogger("memosfs.store.store")

__all__ = ["Store", "StoreStats", "UnsavedSlots", "make_key", "split_key"]

WRITEBACK_RETRY_S = 5.0     # a failed background write-back waits this long
PROMOTE_TRIES = 3           # promotions retried when a newer version lands meanwhile
_RACED = object()
WARMUP_READ_AHEAD = 2       # slots the warm-up asks the disk for ahead of the one it copies


def make_key(agent: str, session: str, name: str) -> bytes:
    return f"{agent}/{session}/{name}".encode("utf-8", "surrogateescape")


def split_key(key: bytes) -> tuple[str, str, str]:
    """(agent, session, name); the name may hold "/" (directories below a
    session: agent/session/d1/d2/slot)."""
    agent, session, name = key.decode("utf-8", "surrogateescape").split("/", 2)
    return agent, session, name


def _session_of(key: bytes) -> bytes:
    """The directory a key is in (its ring): agent/session or deeper."""
    return key.rsplit(b"/", 1)[0]


class UnsavedSlots(OSError):
    """Slots that a flush (they stay in memory, dirty) or a close (they are
    lost) could not write to the SSD tier.  `keys`, `count`; errno is the
    first failure's, ENOSPC when the tier was full."""

    def __init__(self, keys: list[bytes], cause: Optional[OSError] = None,
                 lost: bool = False) -> None:
        self.keys = list(keys)
        self.count = len(self.keys)
        self.cause = cause
        err = cause.errno if cause is not None and cause.errno else errno.ENOSPC
        what = "are lost" if lost else "stay in memory"
        why = f": {cause.strerror or cause}" if cause is not None else ": the SSD tier is full"
        super().__init__(err, f"{self.count} slots could not be saved to the SSD tier "
                              f"and {what}{why}")


def _k(key: bytes) -> str:
    return key.decode("utf-8", "replace")


class Store:
    """Slots by key over the memory tier and, if given, the SSD tier."""

    def __init__(self, capacity: int, evict_batch: int = 16, ring_slots: int = 0,
                 trace: Optional[Trace] = None, ssd: Optional[SSDTier] = None,
                 writeback_delay_ms: int = 1000,
                 remote: Optional["RemoteTier"] = None) -> None:
        self.trace = trace or Trace()
        self.ring_slots = ring_slots
        self.ssd = ssd
        self.writeback_delay_ms = writeback_delay_ms
        self.cache = _native.Cache(capacity, evict_batch, on_evict=self._on_evict)
        self.lock = threading.RLock()
        # Per session, its keys in order of first publish (the ring's order).
        self._order: dict[bytes, collections.OrderedDict[bytes, None]] = {}
        # Every key, least recently used first (the warm-up order, persisted).
        self._recency: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._dirty_since: dict[bytes, float] = {}   # key -> monotonic publish time
        self._drop_listeners: list[Callable[[bytes, str], None]] = []
        self.meta_of: Callable[[bytes], dict[str, Any]] = lambda key: {}
        self.namespace_of: Callable[[], Any] = lambda: []
        self._namespace_dirty = False
        self._recency_dirty = False
        self._meta_lock = threading.Lock()      # one writer of order/namespace.json
        # keys renamed into while their version had no SSD copy: the next
        # sync_namespace writes them, so that the new name is durable
        self._renamed_unsaved: set[bytes] = set()
        self._c = collections.Counter()
        self._warm_total = 0
        self._warm_done = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._last_error_log = 0.0
        self.prefetch: Optional[PrefetchEngine] = None    # built by start_prefetch
        self.quant = kvfile.QuantizedVersions(self.draft)
        self.remote = remote
        if remote is not None:
            remote.on_invalidate = self._remote_invalidated
            remote.on_reconnect = self._remote_reconnected

    # ---- listeners ----

    def on_drop(self, fn: Callable[[bytes, str], None]) -> None:
        """Call fn(key, reason) whenever a slot leaves every tier by itself."""
        self._drop_listeners.append(fn)

    def attach_namespace(self, meta_of: Callable[[bytes], dict[str, Any]],
                         namespace_of: Callable[[], Any],
                         on_drop: Callable[[bytes, str], None]) -> None:
        """The namespace that shows this store's slots: meta_of(key) is what
        the SSD and remote tiers keep beside a slot, namespace_of() the
        directories (namespace.json), on_drop(key, reason) hears of every
        slot that leaves every tier by itself (from any thread)."""
        self.meta_of = meta_of
        self.namespace_of = namespace_of
        self.on_drop(on_drop)

    def start_prefetch(self, knobs: Any) -> PrefetchEngine:
        """Build this store's prefetch engine (its worker thread starts;
        ModeUnavailable for a prefetch_mode it cannot run); it reads the
        prefetch knobs from `knobs` (a live mapping) and is closed by close()."""
        self.prefetch = PrefetchEngine(self.prefetch_fetch, self._in_memory,
                                       self._session_slot_names, knobs)
        self.on_drop(lambda key, reason: self.prefetch.on_remove(key))
        return self.prefetch

    def _session_slot_names(self, agent: str, session: str) -> list[str]:
        """For the prefetcher (its thread): the slot names a session holds, in
        memory or on SSD."""
        return [k.rsplit(b"/", 1)[1].decode("utf-8", "surrogateescape")
                for k in self.session_keys(agent, session)]

    def _forget(self, key: bytes) -> None:
        with self.lock:
            order = self._order.get(_session_of(key))
            if order is not None:
                order.pop(key, None)
            self._recency.pop(key, None)
            self._dirty_since.pop(key, None)
            self._recency_dirty = True

    def _dropped(self, key: bytes, reason: str) -> None:
        self._forget(key)
        for fn in self._drop_listeners:
            try:
                fn(key, reason)
            except Exception:  # a listener must never break the store
                log.exception("drop listener failed for %r", key)

    def _touch(self, key: bytes) -> None:
        with self.lock:
            self._recency.pop(key, None)
            self._recency[key] = None
            self._recency_dirty = True

    # ---- the eviction callback ----

    def _on_evict(self, ref: "_native.Ref") -> bool:
        """From the C core, victim pinned: write it back if dirty, then let it
        go.  A victim that is no longer its key's current version (replaced,
        renamed or removed while its write-back ran) touches no name: the C
        core frees only a victim that is still live.  The name is dropped,
        and the data counted lost, only when no tier holds the key."""
        if ref.dirty and ref.live and self.ssd is not None:
            try:
                self._write_back(ref, durable=False)
                self._c["evict_writebacks"] += 1
            except OSError as e:
                self._log_io_error("eviction kept %s in memory: write-back failed: %s",
                                   _k(ref.key), e)
                return False
        with self.lock:                         # publish and rename take it too
            if not ref.live:
                return True                     # an old version: nothing to drop
            key = ref.key                       # its key now (a rename moves it)
            entry = self.ssd.get(key) if self.ssd is not None else None
            if self.ssd is not None and ref.dirty:
                return False                    # its write-back lost a race: later
            gone = entry is None
            lost = ref.dirty                    # no SSD tier: memory had the only copy
        self.trace.emit("EVICT", key=_k(key), bytes=ref.size, version=ref.version,
                        to="ssd" if self.ssd is not None else "none")
        if lost:
            log.warning("evicting %s (%d bytes): no SSD tier holds it", _k(key), ref.size)
            self._c["drops_lost"] += 1
        if gone:
            self._dropped(key, "evicted")
        if self.prefetch is not None:
            self.prefetch.on_evict(key)
        return True

    # ---- reads ----

    def get(self, key: bytes) -> Optional["_native.Ref"]:
        """Open a slot for reading: a pinned reference to its current version,
        promoted from the SSD if memory lacks it, or None (a miss)."""
        self._c["lookups"] += 1
        ref = self.cache.get(key)
        if ref is not None:
            self._c["mem_hits"] += 1
            self._touch(key)
            if self.prefetch is not None:
                self.prefetch.on_access(key, True)
            return ref
        ref = self._promote(key)
        if ref is None:
            ref = self._promote_remote(key)      # remote_hits: the tier counts them
        else:
            self._c["ssd_hits"] += 1
        if ref is not None:
            self._touch(key)
            if self.prefetch is not None:
                self.prefetch.on_access(key, False)
            return ref
        self._c["misses"] += 1
        return None

    def prefetch_fetch(self, key: bytes) -> bool:
        """For the prefetcher (its own thread): bring key from the SSD into
        memory without counting a lookup; True if this call put it there."""
        if self.ssd is None or self._in_memory(key):
            return False
        ref = self._promote(key)
        if ref is None:
            return False
        ok = isinstance(ref, _native.Ref)        # an SSDReader: memory had no room
        ref.release()
        if ok:
            self._c["prefetched"] += 1
        return ok

    def _promote(self, key: bytes) -> Optional["_native.Ref"]:
        """Read the SSD's version of key into memory (clean); None if absent
        or corrupt (then the slot is gone and the reason logged)."""
        for _ in range(PROMOTE_TRIES):
            entry = self.ssd.get(key) if self.ssd is not None else None
            if entry is None:
                return None
            result = self._promote_entry(key, entry)
            if result is not _RACED:
                return result
        return self.cache.peek(key)

    def _promote_entry(self, key: bytes, entry: SSDEntry):
        """One try at promoting `entry`; _RACED if a newer version replaced
        its file meanwhile (a failed check is then no corruption: try again)."""
        draft = self.cache.draft()
        try:
            self.ssd.load_into(entry, draft)
        except CorruptSlot as e:
            draft.free()
            if self.ssd.get(key) is not entry:
                return _RACED
            self._corrupt(entry, str(e))
            return None
        except OSError as e:
            draft.free()
            if e.errno not in (errno.ENOSPC, errno.EFBIG):
                raise
            # memory cannot take it now: serve it from its file
            try:
                reader = SSDReader(entry)
            except (CorruptSlot, FileNotFoundError) as c:
                if self.ssd.get(key) is not entry:
                    return _RACED
                self._corrupt(entry, str(c))
                return None
            self._c["direct_reads"] += 1
            log.info("%s served from the SSD tier directly: %s", _k(key), e.strerror)
            return reader
        except BaseException:
            draft.free()
            raise
        with self.lock:
            ref = self.cache.peek(key)
            if ref is not None:                     # someone published meanwhile
                draft.free()
                return ref
            if self.ssd.get(key) is not entry:      # replaced or removed meanwhile
                draft.free()
                return _RACED
            ref = self.cache.publish(draft, key, dirty=False, version=entry.version)
        self._c["promotions"] += 1
        self.trace.emit("PROMOTE", key=_k(key), bytes=entry.size, version=entry.version)
        return ref

    def _corrupt(self, entry: SSDEntry, why: str) -> None:
        self.ssd.report_corrupt(entry, why)
        ref = self.cache.peek(entry.key)
        if ref is None:
            self._dropped(entry.key, "corrupt")
            return
        try:                                    # memory's copy is the only one now
            if not ref.dirty:
                ref.dirty = True
                with self.lock:
                    self._dirty_since.setdefault(entry.key, time.monotonic())
        finally:
            ref.release()

    def peek(self, key: bytes) -> Optional["_native.Ref"]:
        """A pinned reference to the in-memory version, without counting."""
        return self.cache.peek(key)

    def _in_memory(self, key: bytes) -> bool:
        ref = self.cache.peek(key)
        if ref is None:
            return False
        ref.release()
        return True

    def load(self, key: bytes) -> Optional["_native.Ref"]:
        """A pinned reference to the current version, promoted from the SSD
        if need be, without counting a lookup (a writer's base)."""
        ref = self.cache.peek(key)
        if ref is None:
            ref = self._promote(key)
        return ref if ref is not None else self._promote_remote(key)

    def tier_of(self, key: bytes) -> str:
        if self._in_memory(key):
            return "mem"
        if self.ssd is not None and key in self.ssd:
            return "ssd"
        if self.remote is not None and self.remote.known_present(key):
            return "remote"
        return "none"

    def ssd_entry(self, key: bytes) -> Optional[SSDEntry]:
        return self.ssd.get(key) if self.ssd is not None else None

    def __contains__(self, key: bytes) -> bool:
        return self._in_memory(key) or (self.ssd is not None and key in self.ssd)

    # ---- writes ----

    def draft(self, base: Optional["_native.Ref"] = None) -> "_native.Draft":
        return self.cache.draft(base)

    def quantize(self, d: "_native.Draft", scheme: str, error_max: str
                 ) -> tuple["_native.Draft", Optional[bytes]]:
        """(draft to publish, logical bytes or None): `d` itself, or its
        quantized container (`d` freed) when `scheme` is not "off" and `d`
        is a safetensors file worth it (kvfile.QuantizedVersions.quantize)."""
        return self.quant.quantize(d, scheme, error_max)

    def logical(self, ref: Optional["_native.Ref"]) -> Optional[bytes]:
        """The logical bytes of a quantized version, None for one stored as
        written; OSError EIO if it cannot be decoded."""
        return self.quant.logical(ref)

    def remember_logical(self, key: bytes, version: int, data: bytes) -> None:
        """A version just published from `data` (its logical bytes)."""
        self.quant.remember((key, version), data)

    def publish(self, draft: "_native.Draft", key: bytes) -> "_native.Ref":
        """Make `draft` the slot's new version (dirty); returns a pinned reference."""
        with self.lock:
            # versions only grow, whichever tier holds the newest
            on_ssd = self.ssd.get(key) if self.ssd is not None else None
            cur = self.cache.peek(key)
            newest = max(on_ssd.version if on_ssd else 0, cur.version if cur else 0,
                         self.remote.known_version(key) if self.remote is not None else 0)
            if cur is not None:
                cur.release()
            ref = self.cache.publish(draft, key, dirty=True, version=newest + 1)
            self._dirty_since[key] = time.monotonic()
            self._c["publishes"] += 1
            sess = _session_of(key)
            order = self._order.setdefault(sess, collections.OrderedDict())
            new_key = key not in order
            order[key] = order.get(key)
        self._touch(key)
        if new_key:
            self._recycle(sess, keep=key)
        self.trace.emit("PUBLISH", key=_k(key), bytes=ref.size, version=ref.version)
        if self.remote is not None:
            self.remote.put_async(key, lambda: self._remote_source(key))
        return ref

    def _recycle(self, sess: bytes, keep: bytes) -> None:
        limit = self.ring_slots
        while limit:
            with self.lock:
                order = self._order.get(sess)
                if order is None or len(order) <= limit:
                    return
                oldest = next(iter(order))
            if oldest == keep:
                return
            self._c["ring_recycles"] += 1
            self._remove_everywhere(oldest)
            self.trace.emit("RING_RECYCLE", key=_k(oldest))
            self._dropped(oldest, "ring")

    def _remove_everywhere(self, key: bytes) -> bool:
        removed = self.cache.remove(key)
        if self.ssd is not None:
            removed = self.ssd.remove(key) or removed
        if self.remote is not None:
            self.remote.delete_async(key)       # a tombstone: nobody brings it back
        return removed

    def remove(self, key: bytes) -> bool:
        if self.prefetch is not None:
            self.prefetch.on_remove(key)
        self._forget(key)
        removed = self._remove_everywhere(key)
        if removed:
            self.trace.emit("REMOVE", key=_k(key))
        return removed

    def rename(self, old: bytes, new: bytes) -> bool:
        """Move a slot to a new key in every tier, replacing what was there.

        An acknowledged version never lacks a copy on the SSD: old's SSD copy
        moves to new (renamed over new's file, which is never removed first),
        even when memory holds a newer, dirty version (that one moves too and
        stays dirty).  A version only memory holds replaces new's file if new
        has one.  Durable after sync_namespace."""
        if self.prefetch is not None:
            self.prefetch.on_remove(old)
            self.prefetch.on_remove(new)
        if self.remote is not None and old not in self:
            ref = self._promote_remote(old)     # only on the remote tier: fetch it first
            if ref is not None:
                ref.release()
        if self.ssd is None:
            with self.lock:
                in_mem = self.cache.rename(old, new)
            on_ssd = False
        else:
            in_mem, on_ssd = self._rename_tiers(old, new)
        with self.lock:
            src = self._order.get(_session_of(old))
            if src is not None:
                src.pop(old, None)
            dst = self._order.get(_session_of(new))
            if dst is not None:
                dst.pop(new, None)
            since = self._dirty_since.pop(old, None)
            self._dirty_since.pop(new, None)
            self._recency.pop(old, None)
            self._renamed_unsaved.discard(old)
            if in_mem or on_ssd:
                self._order.setdefault(_session_of(new), collections.OrderedDict())[new] = None
            if in_mem:
                ref = self.cache.peek(new)
                if ref is not None:
                    if ref.dirty:
                        self._dirty_since[new] = since or time.monotonic()
                        if not on_ssd and self.ssd is not None:
                            self._renamed_unsaved.add(new)
                    ref.release()
        if in_mem or on_ssd:
            self._touch(new)
            self.trace.emit("RENAME", src=_k(old), dst=_k(new))
            if self.remote is not None:
                self.remote.delete_async(old)
                self.remote.put_async(new, lambda: self._remote_source(new))
        return in_mem or on_ssd

    def _rename_tiers(self, old: bytes, new: bytes) -> tuple[bool, bool]:
        """Rename in the SSD tier, then in memory, under the SSD writer lock
        so that no write-back of `old` lands in between (it would bring the
        old name back).  Returns (moved in memory, new has an SSD copy of
        the moved slot)."""
        meta = self.meta_of(new)
        with self.ssd.write_lock:
            ref = self.cache.peek(old)
            try:
                moved = self.ssd.rename(old, new, meta, ref)
            except OSError as e:
                if ref is None:
                    raise                       # nothing changed; only the SSD holds it
                # memory holds it (dirty from here on); the SSD's copies go,
                # so that nothing stale is left under either name
                log.error("rename %s -> %s: the SSD copy could not be moved (%s); the "
                          "memory copy will be written back", _k(old), _k(new), e)
                moved = None
                self.ssd.remove(old)
                self.ssd.remove(new)
            finally:
                if ref is not None:
                    ref.release()
            with self.lock:
                in_mem = self.cache.rename(old, new)
                if not in_mem and moved is not None:
                    self.cache.remove(new)      # the replaced slot's memory copy
                if in_mem:
                    cur = self.cache.peek(new)
                    if cur is not None:
                        entry = self.ssd.get(new)
                        if entry is None or entry.version != cur.version:
                            cur.dirty = True    # memory's copy is newer than the SSD's
                        cur.release()
        return in_mem, moved is not None

    def mark_dirty(self, key: bytes) -> None:
        """The slot's metadata changed: write it back again."""
        ref = self.cache.peek(key)
        if ref is None:
            ref = self._promote(key)
        if ref is not None:
            ref.dirty = True
            ref.release()
            with self.lock:
                self._dirty_since[key] = time.monotonic()

    def session_keys(self, agent: str, session: str) -> list[bytes]:
        with self.lock:
            order = self._order.get(make_key(agent, session, "")[:-1])
            return list(order) if order else []

    def reset_session(self, agent: str, session: str) -> int:
        """Drop every slot of a session, at any depth below it (all tiers);
        returns how many."""
        prefix = make_key(agent, session, "")           # b"agent/session/"
        with self.lock:
            keys = dict.fromkeys(k for group, order in self._order.items()
                                 if group == prefix[:-1] or group.startswith(prefix)
                                 for k in order)
        keys.update(dict.fromkeys(k for k in self.cache.keys() if k.startswith(prefix)))
        if self.ssd is not None:
            keys.update(dict.fromkeys(k for k in self.ssd.keys() if k.startswith(prefix)))
        for key in keys:
            self._remove_everywhere(key)
            self._dropped(key, "reset")
        if self.remote is not None:             # and those only the remote tier has
            self.remote.delete_session_async(prefix[:-1])
        self._c["resets"] += 1
        self.trace.emit("RESET", session=f"{agent}/{session}", slots=len(keys))
        return len(keys)

    # ---- write-back ----

    def _write_back(self, ref: "_native.Ref", durable: bool, room_from_older: bool = False
                    ) -> None:
        """Write the version ref pins to the SSD and mark it clean if it is
        still the current one.  When the tier is over ssd_capacity, room is
        made by evicting SSD versions (least recent first; with
        room_from_older, only versions less recent than this one)."""
        key = ref.key
        meta = self.meta_of(key)
        try:
            entry = self.ssd.put(ref, meta, durable)
        except SSDFull as full:
            self._make_ssd_room(full.excess, keep=key, older_only=room_from_older)
            entry = self.ssd.put(ref, meta, durable)
        with self.lock:
            stored = self.ssd.get(key)
            if ref.live and ref.key == key and stored is not None \
                    and stored.version == ref.version:
                ref.dirty = False
                self._dirty_since.pop(key, None)
                self._renamed_unsaved.discard(key)
        if entry is None:
            return                              # a newer version, a rename or a removal won
        self._c["writebacks"] += 1
        self.trace.emit("WRITEBACK", key=_k(key), bytes=ref.size, version=ref.version)

    def _make_ssd_room(self, excess: int, keep: bytes, older_only: bool = False) -> None:
        """Evict SSD versions, least recent first (with older_only, only those
        less recent than `keep`): those memory does not hold are lost (the
        slot is dropped); those it holds become dirty.  A version replaced
        or removed meanwhile is not touched."""
        with self.lock:
            order = list(reversed(self._recency))     # most recent first
        rank = {k: i for i, k in enumerate(order)}
        floor = rank.get(keep, -1)
        freed = 0
        for entry in self.ssd.lru_candidates(order):
            if freed >= excess:
                break
            if entry.key == keep or (older_only and rank.get(entry.key, -1) <= floor):
                continue
            if not self.ssd.remove(entry.key, entry):
                continue                        # replaced or removed meanwhile
            freed += entry.file_bytes
            with self.lock:
                ref = self.cache.peek(entry.key)
                if ref is not None:
                    ref.dirty = True
                    ref.release()
                    self._dirty_since.setdefault(entry.key, time.monotonic())
            if ref is None:
                self._c["drops_lost"] += 1
                self.trace.emit("SSD_EVICT", key=_k(entry.key), bytes=entry.size)
                self._dropped(entry.key, "ssd-evicted")

    def _log_io_error(self, fmt: str, *args: object) -> None:
        """SSD trouble (a full disk) repeats for every slot: log it at ERROR
        once every WRITEBACK_RETRY_S, the rest at DEBUG."""
        now = time.monotonic()
        if now - self._last_error_log >= WRITEBACK_RETRY_S:
            self._last_error_log = now
            log.error(fmt, *args)
        else:
            log.debug(fmt, *args)

    def persist(self, key: bytes) -> None:
        """Make the slot's current version durable on the SSD (fsync of a slot)
        and, with a durable (or strong) remote tier, uploaded."""
        self._persist_local(key)
        self.remote_wait(key)

    def _persist_local(self, key: bytes) -> None:
        if self.ssd is None:
            return
        ref = self.cache.peek(key)
        if ref is None:
            self.ssd.sync()                         # only on the SSD: make its rename durable
            return
        try:
            if ref.dirty:
                self._write_back(ref, durable=True)
            self.ssd.sync()
        finally:
            ref.release()

    def flush(self) -> int:
        """Persist every dirty slot (durably), save the order and namespace,
        then reclaim memory.  Returns the number of slots written; raises
        UnsavedSlots (an OSError, ENOSPC when the SSD tier is full) naming
        the slots it could not write, which stay in memory, dirty.  The most
        recent slots go first, and room on a full tier is made only from
        less recent ones, so what cannot be saved is the least recent."""
        self._c["flushes"] += 1
        written = 0
        if self.ssd is not None:
            tried: dict[bytes, int] = {}            # key -> the version flushed
            failed: Optional[OSError] = None
            for key in self._keys_most_recent_first():
                ref = self.cache.peek(key)
                if ref is None:
                    continue
                try:
                    if ref.dirty:
                        tried[key] = ref.version
                        self._write_back(ref, durable=False, room_from_older=True)
                        written += 1
                except OSError as e:
                    log.error("flush could not write %s: %s", _k(key), e)
                    failed = failed or e
                finally:
                    ref.release()
            self.ssd.sync()
            self.save_metadata(durable=True)
            # what failed, and what lost its fresh SSD copy to make room
            unsaved = [k for k, v in tried.items() if self._dirty_version(k) == v]
            if unsaved or failed is not None:
                raise UnsavedSlots(unsaved, failed)
        swept = self.cache.sweep()              # then reclaim memory
        if self.remote is not None and self.remote.durable and not self.remote.wait_all():
            raise OSError(errno.EIO, "remote tier: queued uploads not done")
        self.trace.emit("FLUSH", written=written, swept_pages=swept)
        return written

    def keys_lru_first(self, prefix: bytes) -> list[bytes]:
        """The keys under prefix that memory holds, least recently used first."""
        with self.lock:
            order = [k for k in self._recency if k.startswith(prefix)]
        return order

    def demote(self, key: bytes) -> bool:
        """Move key's current version out of memory, keeping it on the SSD
        tier (written back first if dirty): an agent over its quota makes
        room this way.  False, and nothing changes, when it cannot: no SSD
        tier, not in memory, pinned, or its write-back failed."""
        if self.ssd is None:
            return False
        ref = self.cache.peek(key)
        if ref is None:
            return False
        try:
            if ref.sticky:
                return False
            if ref.dirty:
                try:
                    self._write_back(ref, durable=False)
                except OSError as e:
                    self._log_io_error("quota: %s stays in memory: write-back failed: %s",
                                       _k(key), e)
                    return False
            with self.lock:                     # publish and rename take it too
                cur = self.cache.peek(key)
                if cur is None:
                    return False
                try:
                    same = cur.version == ref.version and not cur.dirty and not cur.sticky
                finally:
                    cur.release()
                entry = self.ssd.get(key)
                if not same or entry is None or entry.version != ref.version:
                    return False
                self.cache.remove(key)
            self._c["demotions"] += 1
            self.trace.emit("EVICT", key=_k(key), bytes=ref.size, version=ref.version,
                            to="ssd", cause="quota")
            if self.prefetch is not None:
                self.prefetch.on_evict(key)
            return True
        finally:
            ref.release()

    def _keys_most_recent_first(self) -> list[bytes]:
        with self.lock:
            keys = dict.fromkeys(reversed(self._recency))
        keys.update(dict.fromkeys(self.cache.keys()))
        return list(keys)

    def _dirty_version(self, key: bytes) -> Optional[int]:
        """The version of key memory holds if it is dirty, else None."""
        ref = self.cache.peek(key)
        if ref is None:
            return None
        try:
            return ref.version if ref.dirty else None
        finally:
            ref.release()

    def sync_namespace(self) -> None:
        """The fsync of a directory: make every rename, unlink and mkdir done
        so far durable (call it off the trio thread: it does file I/O).  A
        slot renamed while it had no SSD copy is written first, so that its
        new name exists after a crash; then the SSD folders touched are
        fsync'd, and namespace.json and order.json written durably."""
        if self.ssd is None:
            return
        with self.lock:
            renamed, self._renamed_unsaved = self._renamed_unsaved, set()
        for key in renamed:
            ref = self.cache.peek(key)
            if ref is None:
                continue
            try:
                if ref.dirty and self.ssd.get(key) is None:
                    self._write_back(ref, durable=False)
            except OSError:
                with self.lock:
                    self._renamed_unsaved.add(key)
                raise
            finally:
                ref.release()
        self.ssd.sync()
        self.save_metadata(durable=True)

    def save_metadata(self, durable: bool) -> None:
        """order.json (keys, most recent first) and namespace.json."""
        if self.ssd is None:
            return
        with self._meta_lock:                   # the writer thread and an fsync may race
            with self.lock:
                recency = [k.decode("utf-8", "surrogateescape")
                           for k in reversed(self._recency)]
                self._recency_dirty = False
                self._namespace_dirty = False
            try:
                self.ssd.write_json("order.json", recency, durable)
                self.ssd.write_json("namespace.json", self.namespace_of(), durable)
            except BaseException:
                self._recency_dirty = self._namespace_dirty = True
                raise

    def namespace_changed(self) -> None:
        self._namespace_dirty = True

    # ---- background work ----

    def start_background(self) -> None:
        """The background writer (and nothing else without an SSD tier)."""
        if self.remote is not None:
            self.remote.start()
        if self.ssd is None:
            return
        t = threading.Thread(target=self._writer_loop, name="memosfs-writeback", daemon=True)
        t.start()
        self._threads.append(t)

    def _writer_loop(self) -> None:
        while not self._stop.is_set():
            delay = self.writeback_delay_ms / 1000.0
            self._wake.wait(timeout=max(0.05, min(delay / 2, 0.5)))
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._write_back_due(time.monotonic() - delay)
                if self._recency_dirty or self._namespace_dirty:
                    self.save_metadata(durable=False)
            except OSError as e:
                self._log_io_error("background writer: %s", e)
            except Exception:
                log.exception("background writer")

    def _write_back_due(self, before: float) -> None:
        with self.lock:
            due = [k for k, t in self._dirty_since.items() if t <= before]
        for key in due:
            if self._stop.is_set():
                return
            ref = self.cache.peek(key)
            if ref is None:
                with self.lock:
                    self._dirty_since.pop(key, None)
                continue
            try:
                if ref.dirty:
                    self._write_back(ref, durable=False)
                else:
                    with self.lock:
                        self._dirty_since.pop(key, None)
            except OSError as e:
                # try again later; say so once a while, not every round
                with self.lock:
                    if key in self._dirty_since:
                        self._dirty_since[key] = time.monotonic() + WRITEBACK_RETRY_S
                self._log_io_error("background write-back of %s failed (retrying in %.0f s): %s",
                                   _k(key), WRITEBACK_RETRY_S, e)
            finally:
                ref.release()

    def restore(self) -> list:
        """At mount: rebuild the SSD index and the recency order; returns the
        namespace saved last time and the SSD entries."""
        if self.ssd is None:
            return []
        entries = self.ssd.scan()
        saved = [k.encode("utf-8", "surrogateescape")
                 for k in self.ssd.read_json("order.json", [])]
        present = {e.key: e for e in entries}
        rank = {k: i for i, k in enumerate(saved)}
        # least recent first: saved order reversed, unknown keys (newer than
        # the last save) by file time as the most recent
        unknown = sorted((k for k in present if k not in rank),
                         key=lambda k: _mtime(present[k].path))
        known = sorted((k for k in present if k in rank), key=lambda k: -rank[k])
        with self.lock:
            for k in known + unknown:
                self._recency[k] = None
                self._order.setdefault(_session_of(k), collections.OrderedDict())[k] = None
        return entries

    def start_warmup(self, ratio: float, progress: Optional[Callable[[int, int], None]] = None
                     ) -> None:
        """Preload the most recently used SSD slots, up to ratio × capacity,
        in a background thread."""
        if self.ssd is None or ratio <= 0:
            self._warm_done = 1
            return
        budget = int(ratio * self.cache.capacity)
        with self.lock:
            keys = list(reversed(self._recency))
        plan, total = [], 0
        for key in keys:
            e = self.ssd.get(key)
            if e is None or total + e.size > budget:
                continue
            plan.append(e)
            total += e.size
        self._warm_total = total
        t = threading.Thread(target=self._warmup, args=(plan, progress),
                             name="memosfs-warmup", daemon=True)
        t.start()
        self._threads.append(t)

    def _warmup(self, plan: list[SSDEntry], progress) -> None:
        loaded = 0
        ahead = 0                               # plan[:ahead] were asked to be read in
        try:
            for i, entry in enumerate(plan):
                if self._stop.is_set():
                    return
                # keep the disk busy: ask for the next slots while copying this one
                while ahead < len(plan) and ahead <= i + WARMUP_READ_AHEAD:
                    self.ssd.prefetch(plan[ahead])
                    ahead += 1
                if self._in_memory(entry.key):
                    loaded += entry.size
                    self._c["warmup_loaded_bytes"] = loaded
                    continue
                if self.cache.stats()["free_pages"] * _native.PAGE_SIZE < entry.size:
                    log.info("warm-up stops: memory is full")
                    break
                ref = self._promote(entry.key)
                if ref is not None:
                    ref.release()
                loaded += entry.size
                self._c["warmup_loaded_bytes"] = loaded
                if progress:
                    progress(loaded, self._warm_total)
        except Exception:
            log.exception("warm-up failed")
        finally:
            self._warm_done = 1
            if progress:
                progress(loaded, self._warm_total)
            log.info("warm-up done: %d of %d bytes", loaded, self._warm_total)

    # ---- knobs and stats ----

    def set_capacity(self, n: int) -> None:
        self.cache.set_capacity(n)

    def set_evict_batch(self, n: int) -> None:
        self.cache.set_evict_batch(n)

    def statistics(self, lookup_misses: int = 0) -> StoreStats:
        """The store's own figures (memosfs/store/statistics.py).
        lookup_misses: the filesystem's lookups of a name no tier has,
        counted as misses."""
        c = self._c
        remote = self.remote.statistics().remote_hits if self.remote is not None else 0
        hits = c["mem_hits"] + c["ssd_hits"] + remote
        misses = c["misses"] + lookup_misses
        lookups = hits + misses
        return StoreStats(
            lookups=lookups, hits=hits, mem_hits=c["mem_hits"], ssd_hits=c["ssd_hits"],
            misses=misses, hit_rate=(hits / lookups) if lookups else 0.0,
            publishes=c["publishes"], promotions=c["promotions"], writebacks=c["writebacks"],
            evict_writebacks=c["evict_writebacks"], slots_lost=c["drops_lost"],
            slots_unsaved=c["slots_unsaved"], warmup_loaded_bytes=c["warmup_loaded_bytes"],
            warmup_total_bytes=self._warm_total, warmup_done=self._warm_done,
            ring_recycles=c["ring_recycles"], resets=c["resets"], flushes=c["flushes"],
            ring_slots=self.ring_slots, direct_reads=c["direct_reads"],
            **self.quant.statistics())

    def read_statistics(self) -> dict[str, int]:
        """The read figures of StoreStats alone: reads served straight from
        an SSD file (direct_reads), and quantized storage (quant_*)."""
        return {"direct_reads": self._c["direct_reads"], **self.quant.statistics()}

    def close(self) -> None:
        """Stop the threads, persist everything, free memory.  Dirty slots
        that cannot be written (the SSD tier is full, or fails) are lost:
        each is logged at ERROR, counted in `slots_unsaved`, and close
        raises UnsavedSlots (ENOSPC or the error met) once memory is freed."""
        if self.prefetch is not None:
            self.prefetch.close()
        self._stop.set()
        self._wake.set()
        for t in self._threads:
            t.join(timeout=30)
        failed: Optional[OSError] = None
        unsaved: list[bytes] = []
        try:
            try:
                self.flush()
            except UnsavedSlots as e:
                failed = e.cause                # the slots are counted below
            except OSError as e:
                failed = e
            if self.ssd is not None:
                for key in self._keys_most_recent_first():
                    ref = self.cache.peek(key)
                    if ref is None:
                        continue
                    if ref.dirty:
                        unsaved.append(key)
                        log.error("unmount: %s (version %d, %d bytes) could not be saved "
                                  "to the SSD tier: it is lost", _k(key), ref.version,
                                  ref.size)
                    ref.release()
                self._c["slots_unsaved"] += len(unsaved)
        finally:
            if self.remote is not None:
                self.remote.close()             # uploads what is queued (bounded)
            self.cache.close()
        if unsaved:
            raise UnsavedSlots(unsaved, failed, lost=True)
        if failed is not None:
            raise failed

    # ---- the remote tier ----

    def _promote_remote(self, key: bytes) -> Optional["_native.Ref"]:
        """Fetch key's remote version into memory; None on a miss (the tier
        logs and counts why: absent, unreachable, partial, corrupt, stale)."""
        if self.remote is None:
            return None
        draft = self.cache.draft()
        try:
            entry = self.remote.get_into(key, draft.write)
        except OSError as e:                    # memory cannot take it
            draft.free()
            log.info("%s: remote version not promoted: %s", _k(key), e.strerror or e)
            return None
        except BaseException:
            draft.free()
            raise
        if entry is None:
            draft.free()
            return None
        dirty = self.ssd is not None            # the background writer puts it on the SSD
        with self.lock:
            ref = self.cache.peek(key)
            local = ref is not None or (self.ssd is not None and key in self.ssd)
            if not local:
                ref = self.cache.publish(draft, key, dirty=dirty, version=entry.version)
                if dirty:
                    self._dirty_since[key] = time.monotonic()
                self._order.setdefault(_session_of(key),
                                       collections.OrderedDict()).setdefault(key, None)
        if local:                               # a local version arrived meanwhile
            draft.free()
            return ref if ref is not None else self._promote(key)
        self._c["remote_promotions"] += 1
        self.trace.emit("PROMOTE", key=_k(key), bytes=entry.size, version=entry.version,
                        source="remote")
        return ref

    def _remote_source(self, key: bytes):
        """For the remote writer: the current local version of key to upload,
        (payload, version, meta, release), or None if no tier holds it."""
        ref = self.cache.peek(key)
        if ref is not None:
            return ref, ref.version, self.meta_of(key), ref.release
        entry = self.ssd.get(key) if self.ssd is not None else None
        if entry is None:
            return None
        try:
            reader = SSDReader(entry)
        except (CorruptSlot, OSError):
            return None
        return reader, entry.version, self.meta_of(key), reader.release

    def remote_lookup(self, key: bytes) -> Optional["RemoteEntry"]:
        """The remote manifest of a slot no local tier holds (a lookup that
        found no name): version, size and meta to make a name from; None if
        the remote tier has none, or there is no remote tier.  Network I/O:
        call it off the trio thread."""
        if self.remote is None:
            return None
        return self.remote.stat(key)

    def remote_wait(self, key: bytes, timeout: Optional[float] = None) -> None:
        """With a durable or strong remote tier: wait until key's current
        version is uploaded (and, strong, acknowledged or timed out).  A
        durable tier that could not take it raises OSError(EIO)."""
        r = self.remote
        if r is None or not (r.durable or r.strong):
            return
        if r.pending(key) is None and r.last_failed(key) and key in self:
            r.put_async(key, lambda: self._remote_source(key))     # try again now
        if not r.wait(key, timeout) and r.durable:
            raise OSError(errno.EIO, f"remote tier did not take {_k(key)}")

    def set_remote_strong(self, on: bool) -> None:
        """coherence_protocol=2: writers wait for other mounts' acknowledgements."""
        if self.remote is not None:
            self.remote.strong = on

    def remote_statistics(self) -> Optional[RemoteStats]:
        """The remote tier's record, with the two figures the store counts
        for it (remote_drops, remote_promotions); None without the tier."""
        if self.remote is None:
            return None
        return dataclasses.replace(self.remote.statistics(),
                                   remote_drops=self._c["remote_drops"],
                                   remote_promotions=self._c["remote_promotions"])

    def _local_ident(self, key: bytes, want_crc_for: Optional[tuple] = None):
        """(version, size, crc32c) of the current local copy, or None.  The
        crc of a memory copy is computed only when version and size match
        `want_crc_for` (it reads the whole slot)."""
        ref = self.cache.peek(key)
        if ref is not None:
            try:
                v, n = ref.version, ref.size
                if want_crc_for is not None and (v, n) == tuple(want_crc_for[:2]):
                    return (v, n, ref.crc32c())
                return (v, n, None)
            finally:
                ref.release()
        entry = self.ssd.get(key) if self.ssd is not None else None
        if entry is not None:
            return (entry.version, entry.size, entry.crc)
        return None

    def _drop_unless(self, key: bytes, keep: Optional[tuple], reason: str) -> bool:
        """Drop key's local copies (memory, SSD) and its name unless the
        current local copy is version `keep` (version, size, crc).  A local
        publish that lands meanwhile is kept.  Returns whether it dropped."""
        cur = self._local_ident(key, keep)
        if cur is not None and keep is not None and cur == tuple(keep):
            return False
        dropped = False
        if cur is not None:
            with self.lock:
                ref = self.cache.peek(key)
                if ref is not None:
                    newer = ref.version > cur[0]
                    ref.release()
                    if newer:
                        return False            # published here meanwhile: ours goes up
                    self.cache.remove(key)
                    dropped = True
            if self.ssd is not None:
                entry = self.ssd.get(key)
                if entry is not None and entry.version <= cur[0]:
                    dropped = self.ssd.remove(key) or dropped
        if dropped:
            self._c["remote_drops"] += 1
        self.trace.emit("REMOTE_INVALIDATE", key=_k(key), dropped=int(dropped), why=reason)
        self._dropped(key, reason)              # the name goes; a lookup finds the new one
        return True

    def _remote_invalidated(self, key: bytes, origin: str, v: "RemoteVersion") -> None:
        """Another mount published (or deleted) key.  Announcements from
        different mounts may arrive out of order, so the manifest decides:
        local copies stay only if they are the version it names."""
        pending = self.remote.pending(key)
        if pending == "queued":
            return                              # our newer version goes up after theirs
        if pending == "inflight":
            self.remote.wait(key)               # then the manifest says who came last
        cur = self._local_ident(key, None if v.deleted else v.ident())
        if cur is None:
            self._dropped(key, "remote-invalidated")    # a name made from an older manifest
            return
        if pending is None and not v.deleted and cur == v.ident():
            return                              # we hold what was announced
        res = self.remote.stat_many([key]).get(key)
        keep = None if isinstance(res, Exception) or res is None or res.deleted else res.ident()
        self._drop_unless(key, keep, "remote-invalidated")

    def _remote_reconnected(self) -> None:
        """The announcement channel is (re)connected: some may have been
        missed, so check every local slot against its remote manifest.  Kept:
        the same version as the manifest, no remote copy at all (never
        uploaded, or evicted there), a local publish still queued.  Dropped:
        another version, a tombstone, a manifest that cannot be read now."""
        keys = set(self.cache.keys())
        if self.ssd is not None:
            keys.update(self.ssd.keys())
        keys = [k for k in keys if self.remote.pending(k) is None]
        if not keys:
            return
        results = self.remote.stat_many(keys)
        dropped = 0
        for key, res in results.items():
            if res is None or self.remote.pending(key) is not None:
                continue
            keep = None if isinstance(res, Exception) or res.deleted else res.ident()
            dropped += self._drop_unless(key, keep, "remote-reconnect")
        log.info("remote: checked %d local slots after (re)connecting; %d dropped",
                 len(results), dropped)


def _mtime(path: str) -> float:
    import os
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
