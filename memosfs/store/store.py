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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from memosfs import _native
from memosfs.trace import Trace
from memosfs.store import kvfile
from memosfs.store.common import UnsavedSlots, _k, _session_of, make_key, split_key
from memosfs.store.prefetch import PrefetchEngine
from memosfs.store.reads import ReadMixin
from memosfs.store.ssd import CorruptSlot, SSDEntry, SSDReader, SSDTier
from memosfs.store.writeback import WriteBackMixin
from memosfs.store.writes import WriteMixin

if TYPE_CHECKING:
    from memosfs.store.remote import RemoteEntry, RemoteTier, RemoteVersion

log = logging.getLogger("memosfs.store.store")

__all__ = ["Store", "StoreStats", "UnsavedSlots", "make_key", "split_key"]

WARMUP_READ_AHEAD = 2       # slots the warm-up asks the disk for ahead of the one it copies


@dataclass(frozen=True)
class StoreStats:
    """Counters kept above the C core."""
    lookups: int
    mem_hits: int
    ssd_hits: int
    misses: int
    promotions: int
    publishes: int
    ring_recycles: int
    resets: int
    flushes: int
    writebacks: int
    evict_writebacks: int
    drops_lost: int
    warmup_loaded_bytes: int
    warmup_total_bytes: int
    warmup_done: int
    # the remote tier (all 0 without one)
    remote_hits: int = 0
    remote_misses: int = 0
    remote_bytes_in: int = 0
    remote_bytes_out: int = 0
    remote_errors: int = 0
    remote_corrupt: int = 0
    remote_queue_dropped: int = 0
    remote_invalidations: int = 0
    remote_drops: int = 0
    # dirty slots a close could not write to the SSD tier (they were lost)
    slots_unsaved: int = 0


class Store(ReadMixin, WriteMixin, WriteBackMixin):
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
        """The background writer (and nothing else without an SSD tier)."""
        if self.remote is not None:
            self.remote.start()
        if self.ssd is None:
            return
        t = threading.Thread(target=self._writer_loop, name="memosfs-writeback", daemon=True)
        t.start()
        self._threads.append(t)

    # ---- knobs and stats ----

    def set_capacity(self, n: int) -> None:
        self.cache.set_capacity(n)

    def set_evict_batch(self, n: int) -> None:
        self.cache.set_evict_batch(n)

    def statistics(self) -> StoreStats:
        c = self._c
        remote = self.remote.statistics() if self.remote is not None else {}
        return StoreStats(c["lookups"], c["mem_hits"], c["ssd_hits"], c["misses"],
                          c["promotions"], c["publishes"], c["ring_recycles"], c["resets"],
                          c["flushes"], c["writebacks"], c["evict_writebacks"],
                          c["drops_lost"], c["warmup_loaded_bytes"], self._warm_total,
                          self._warm_done,
                          **{f: remote.get(f, 0) for f in _REMOTE_STATS},
                          remote_drops=c["remote_drops"], slots_unsaved=c["slots_unsaved"])

    def read_statistics(self) -> dict[str, int]:
        """Counters StoreStats does not carry: reads served straight from an
        SSD file (direct_reads), and quantized storage (quant_*)."""
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

    # ---- order and recency ----

    def _touch(self, key: bytes) -> None:
        with self.lock:
            self._recency.pop(key, None)
            self._recency[key] = None
            self._recency_dirty = True

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

    # ---- durability ----

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

    # ---- warm-up ----

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

    # ---- promotion and upload ----

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

    def remote_statistics(self) -> dict[str, int]:
        """Every remote counter (for .memos/cache/stats); {} without the tier."""
        if self.remote is None:
            return {}
        out = self.remote.statistics()
        out["remote_drops"] = self._c["remote_drops"]
        out["remote_promotions"] = self._c["remote_promotions"]
        return out

    # ---- announcements from other mounts ----

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


_REMOTE_STATS = ("remote_hits", "remote_misses", "remote_bytes_in", "remote_bytes_out",
                 "remote_errors", "remote_corrupt", "remote_queue_dropped",
                 "remote_invalidations")


def _mtime(path: str) -> float:
    import os
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
