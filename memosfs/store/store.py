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

Modules, each one seam of Store; an arrow is "may import":

    common.py       make_key, split_key, UnsavedSlots, the key helpers
                                                      -> nothing of memosfs
    reads.py        ReadMixin: get, load, peek, tier_of, promotion from the
                    SSD tier                          -> common, ssd, _native
    writes.py       WriteMixin: publish, remove, rename, the ring,
                    reset_session                     -> common
    writeback.py    WriteBackMixin: the eviction callback, write-back, SSD
                    room, persist, flush, demote, the background writer's
                    loop                              -> common, ssd
    namespace.py    NamespaceMixin: order and recency, the drop listeners'
                    call, sync_namespace, order.json / namespace.json,
                    restore                           -> common
    warmup.py       WarmupMixin: the warm-up thread   -> ssd, _native
    remoteglue.py   RemoteGlueMixin: remote promotion, uploads' source,
                    remote_wait, invalidations from other mounts
                                                      -> common, ssd
    store.py        Store (the facade: state, attachments, lifecycle,
                    knobs, statistics, close), built on the six mixins, and
                    StoreStats                        -> all above

The mixins share the state Store.__init__ creates (each module's docstring
says which part it uses) and call one another only through self.  What
other code imports comes from here: `from memosfs.store.store import Store,
StoreStats, UnsavedSlots, make_key, split_key`.  One logger for all:
memosfs.store.store.

May call: memosfs._native, memosfs.store.ssd, .remote (given), .kvfile,
.prefetch, memosfs.trace.  Nothing of memosfs.fuse.

Threads: the trio thread calls in; the background writer and the warm-up
thread run beside it.  `self.lock` guards the Python-side maps and is never
held across file I/O; the C core has its own lock.  self.lock is taken
inside ssd.write_lock (rename, write-back) and inside _meta_lock
(save_metadata), never the other way round.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

from memosfs import _native
from memosfs.trace import Trace
from memosfs.store import kvfile
from memosfs.store.common import UnsavedSlots, _k, make_key, said, split_key
from memosfs.store.namespace import NamespaceMixin
from memosfs.store.prefetch import PrefetchEngine
from memosfs.store.reads import ReadMixin
from memosfs.store.remoteglue import RemoteGlueMixin
from memosfs.store.ssd import SSDTier
from memosfs.store.statistics import StoreStats
from memosfs.store.warmup import WarmupMixin
from memosfs.store.writeback import WriteBackMixin
from memosfs.store.writes import WriteMixin

if TYPE_CHECKING:
    from memosfs.store.remote import RemoteTier

log = logging.getLogger("memosfs.store.store")

PREFAULT_AHEAD_BYTES = 128 << 20   # memory kept faulted in beyond what is allocated
PREFAULT_POLL_S = 0.05              # how often the prefaulter looks again when ahead

__all__ = ["Store", "StoreStats", "UnsavedSlots", "make_key", "split_key"]


class Store(ReadMixin, WriteMixin, WriteBackMixin, NamespaceMixin, WarmupMixin,
            RemoteGlueMixin):
    """Slots by key over the memory tier and, if given, the SSD tier.

    The facade: its state (created here, used by its bases), the
    attachments (namespace, drop listeners, prefetch engine, quantized
    storage), the threads' start and close, knobs and statistics.  Its
    bases are the other seams (the module docstring lists them)."""

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
        # key -> why its last write-back failed (cleared when one succeeds):
        # with the key still dirty in memory, what an unmount now would lose
        self._unsaved: dict[bytes, str] = {}
        self._drop_listeners: list[Callable[[bytes, str], None]] = []
        self.meta_of: Callable[[bytes], dict[str, Any]] = lambda key: {}
        self.namespace_of: Callable[[], Any] = lambda: []
        self._namespace_dirty = False
        self._recency_dirty = False
        self._meta_lock = threading.Lock()      # one writer of order/namespace.json
        # keys renamed into while their version had no SSD copy: the next
        # sync_namespace writes them, so that the new name is durable
        self._renamed_unsaved: set[bytes] = set()
        # keys whose metadata changed since the SSD tier last saved it -> the
        # change's sequence number (mark_dirty; a write-back that read the
        # metadata before a later change leaves the key pending)
        self._meta_pending: dict[bytes, int] = {}
        self._meta_seq = itertools.count(1)
        self._c = collections.Counter()
        self._warm_total = 0
        self._warm_done = 0
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._last_error_log = 0.0
        self.ssd_full = "evict"         # the ssd_full knob: evict | refuse (writeback.py)
        self._ssd_evict_log: list = [0, [], float("-inf")]   # SSD evictions folded
                                        # since the last line: count, names, when (lock)
        self.prefetch: Optional[PrefetchEngine] = None    # built by start_prefetch
        self.quant = kvfile.QuantizedVersions(self.draft)
        self.remote = remote
        if ssd is None and remote is None:
            # an eviction here loses the slot: nothing is evicted for a draft
            # that may still be refused; one memory has no room for continues
            # in a memory file and makes its room whole at its publish
            # (writes.py `spill`, `unspill`)
            self.cache.set_draft_evicts(False)
        if remote is not None:
            remote.on_invalidate = self._remote_invalidated
            remote.on_reconnect = self._remote_reconnected

    # ---- listeners and attachments ----

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

    # ---- quantized storage ----

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

    # ---- background work ----

    def start_background(self) -> None:
        """The memory tier's prefaulter, the remote tier's threads, and the
        background writer (with an SSD tier)."""
        t = threading.Thread(target=self._prefault_loop, name="memosfs-prefault", daemon=True)
        t.start()
        self._threads.append(t)
        if self.remote is not None:
            self.remote.start()
        if self.ssd is None:
            return
        t = threading.Thread(target=self._writer_loop, name="memosfs-writeback", daemon=True)
        t.start()
        self._threads.append(t)

    def _prefault_loop(self) -> None:
        """Keep PREFAULT_AHEAD_BYTES of the memory tier beyond what is
        allocated faulted in (native Cache.prefault), so that a write into
        memory never pays the first touch of its pages — on a virtual
        machine ~12 ms per 2 MiB superblock, more than the copy.  Stops where
        the kernel cannot (no MADV_POPULATE_WRITE)."""
        ahead = max(1, PREFAULT_AHEAD_BYTES >> 21)
        while not self._stop.is_set():
            try:
                r = self.cache.prefault(ahead)
            except ValueError:                  # (the cache was closed)
                return
            if r < 0:
                log.info("memory tier: the kernel cannot prefault (MADV_POPULATE_WRITE); "
                         "first writes fault their pages in")
                return
            if r == 0:
                self._stop.wait(PREFAULT_POLL_S)

    # ---- knobs and stats ----

    def set_capacity(self, n: int) -> None:
        self.cache.set_capacity(n)

    def set_evict_batch(self, n: int) -> None:
        self.cache.set_evict_batch(n)

    def set_evict_policy(self, name: str) -> None:
        """The evict_policy knob: memory's victim order and the SSD tier's."""
        self.cache.set_policy(name)
        if self.ssd is not None:
            self.ssd.set_policy(name)

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
            evict_writebacks=c["evict_writebacks"], clean_ahead=c["clean_ahead"],
            slots_lost=c["drops_lost"], ssd_evicted_slots=c["ssd_evicted_slots"],
            ssd_full_refusals=c["ssd_full_refusals"],
            slots_unsaved=c["slots_unsaved"], writeback_queue=self._writeback_queue(),
            warmup_loaded_bytes=c["warmup_loaded_bytes"],
            warmup_total_bytes=self._warm_total, warmup_done=self._warm_done,
            ring_recycles=c["ring_recycles"], resets=c["resets"], flushes=c["flushes"],
            moved_out=c["moved_out"],
            ring_slots=self.ring_slots, direct_reads=c["direct_reads"],
            spills=c["spills"], spill_bytes=c["spill_bytes"],
            spill_publishes=c["spill_publishes"],
            **self.quant.statistics())

    def _writeback_queue(self) -> int:
        if self.ssd is None:
            return 0
        with self.lock:
            return len(self._dirty_since)

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
                wrote = self.flush()
                if self.ssd is not None:
                    log.info("unmount: %d dirty slot%s written to the SSD tier", wrote,
                             "" if wrote == 1 else "s")
            except UnsavedSlots as e:
                failed = e.cause                # the slots are counted below
            except OSError as e:
                failed = e
            if self.ssd is not None:
                self.flush_eviction_log()
                for key in self._keys_most_recent_first():
                    ref = self.cache.peek(key)
                    if ref is None:
                        continue
                    if ref.dirty:
                        unsaved.append(key)
                        cause = said(failed) if failed is not None else self.ssd.trouble
                        log.error("unmount: %s (version %d, %d bytes) could not be saved "
                                  "to the SSD tier%s: it is lost", _k(key), ref.version,
                                  ref.size, f" ({cause})" if cause else "")
                    ref.release()
                self._c["slots_unsaved"] += len(unsaved)
                if failed is None and not unsaved:
                    self.ssd.closed_clean()     # (ssd/state.py RUNNING: a clean unmount)
        finally:
            if self.remote is not None:
                self.remote.close()             # uploads what is queued (bounded)
            self.cache.close()
        if unsaved:
            raise UnsavedSlots(unsaved, failed, lost=True)
        if failed is not None:
            raise failed
