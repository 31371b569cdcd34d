"""The statistics records of the store layer's own figures: the memory tier
(the C core's counters, `CacheStats`) and the store above it (`StoreStats`).

Owns: the two record classes and how they are made from what the C core and
the Store count.  Calls: memosfs.stats (the record machinery) only; the
Store builds its record in `Store.statistics()`, the filesystem's control
plane wraps `Cache.stats()` with `CacheStats.from_native`.  The SSD tier,
the remote tier and the prefetcher keep their records next to their code
(store/ssd/, store/remote/tier.py, store/prefetch.py).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from memosfs.stats import Record, counter, gauge, label

__all__ = ["CacheStats", "StoreStats"]


@dataclass(frozen=True)
class StoreStats(Record):
    """The store (lookups over the tiers, write-back, warm-up).

    Counted above the C core, by memosfs/store/store.py.  A lookup is a read
    open of a slot: a hit when a tier has it (memory, SSD or remote), a miss
    when none has (with the filesystem's lookups of a name no tier has)."""
    lookups: int = counter("hits + misses")
    hits: int = counter("read opens of a stored slot (any tier)")
    mem_hits: int = counter("read opens served from the memory tier")
    ssd_hits: int = counter("read opens read back from the SSD tier")
    misses: int = counter("lookups of an absent slot in a session")
    hit_rate: float = gauge("hits / lookups", 0.0)
    publishes: int = counter("versions published by writers (new slots and replacements)")
    promotions: int = counter("slots brought from the SSD tier into memory")
    writebacks: int = counter("dirty slots written to the SSD tier")
    evict_writebacks: int = counter("dirty slots written to the SSD tier to evict them")
    clean_ahead: int = counter("dirty slots written back ahead of eviction (memory 75% full), "
                               "so that eviction found them clean")
    slots_lost: int = counter("slots no tier kept (evicted or written back with no SSD copy)")
    slots_unsaved: int = counter("dirty slots a clean unmount or flush could not write")
    ssd_evicted_slots: int = counter("slots the SSD tier evicted at ssd_capacity "
                                     "(ssd_full=evict) that no other tier held: gone, a "
                                     "miss next time (counted in slots_lost too)")
    ssd_full_refusals: int = counter("write-backs the SSD tier refused at ssd_capacity "
                                     "(ssd_full=refuse): the slot stayed in memory")
    writeback_queue: int = gauge("dirty slots waiting for the background writer (0 without "
                                 "an SSD tier)")
    warmup_loaded_bytes: int = gauge("bytes the warm-up at mount has loaded so far")
    warmup_total_bytes: int = gauge("bytes the warm-up at mount set out to load")
    warmup_done: int = gauge("1 once the warm-up at mount finished")
    ring_recycles: int = counter("oldest slots removed by a session's ring (ring_slots)")
    resets: int = counter("session resets")
    flushes: int = counter("flush commands")
    moved_out: int = counter("slots the evict and drop commands moved out of memory (kept on "
                             "the SSD tier)")
    ring_slots: int = gauge("setting: slots a session keeps before it recycles (0: no ring)")
    direct_reads: int = counter("reads served straight from an SSD file")
    spills: int = counter("writers' drafts moved to a spill file of the SSD directory because "
                          "the memory tier had no room for them")
    spill_bytes: int = counter("bytes written into spill files (the drafts' bytes copied "
                               "there, and the writes that followed)")
    spill_publishes: int = counter("versions published straight to the SSD tier from a spill "
                                   "file (counted in publishes too)")
    quant_tensors: int = counter("tensors stored quantized")
    quant_fallbacks: int = counter("tensors stored unquantized (quantization refused)")
    quant_saved_bytes: int = counter("bytes quantization saved")

    @property
    def drops_lost(self) -> int:
        """The old name of slots_lost."""
        return self.slots_lost


@dataclass(frozen=True)
class CacheStats(Record):
    """The memory tier (C core).

    The figures of native/memos.c's memos_stats that the stats files show."""
    inserts: int = counter("publishes of a new slot")
    replaces: int = counter("publishes over an existing slot")
    removes: int = counter("slots removed from memory")
    evictions: int = counter("slots evicted from memory")
    eviction_runs: int = counter("eviction runs (each picks up to evict_batch)")
    evict_refused: int = counter("eviction victims the store kept (open, pinned, unwritable)")
    slots: int = gauge("slots in memory")
    bytes_used: int = gauge("logical bytes of the slots in memory")
    capacity: int = gauge("setting: bytes of the memory tier")
    pages_used: int = gauge("pages allocated (live, drafts, dead)")
    free_pages: int = gauge("pages free within capacity")
    superblocks: int = gauge("superblocks mapped")
    huge_pages: int = gauge("1 if the kernel accepted huge pages for the arena")
    index_load_factor: float = gauge("index entries / (index buckets * 4)", 0.0)
    index_entries: int = gauge("entries in the index")
    index_buckets: int = gauge("buckets in the index")
    alloc_failures: int = counter("page allocations that failed before an eviction")
    alloc_waits: int = counter("50 ms waits of an allocation for other threads' write-backs or unpins")
    reclaim_runs: int = counter("arena sweeps (lazy reclaim passes)")
    fragmentation: float = gauge("allocatable pages not in a whole free block / allocatable pages",
                                 0.0)
    pages_pending: int = gauge("pages freed, awaiting the sweep")
    sweep_ns_max: int = gauge("longest sweep so far, ns")
    reclaim_free_ratio: float = gauge("setting: sweep when allocatable / capacity falls below it",
                                      0.0)
    reclaim_fail_limit: int = gauge("setting: sweep after this many allocation failures in a row")
    drafts: int = gauge("drafts (writes) not yet published or freed")
    bytes_draft: int = gauge("logical bytes of drafts")
    pinned: int = gauge("slots held by a reference or a pin")
    dead_pinned: int = gauge("removed or replaced versions kept alive by a reference")
    evict_batch: int = gauge("setting: victims per eviction run")
    evict_policy: str = label("setting: the eviction policy (lru_lfu, lru, lfu)")
    ghost_hits_recency: int = counter("lru_lfu: admits found in the probation ghost")
    ghost_hits_frequency: int = counter("lru_lfu: admits found in the protected ghost")
    policy_recency: float = gauge("lru_lfu: probation's target share (lru 1, lfu 0)", 0.0)
    policy_probation: int = gauge("lru_lfu: slots in probation (seen once)")
    policy_protected: int = gauge("lru_lfu: slots in protected (seen again)")
    prefetch_guarded: int = gauge("prefetched slots not yet read, kept from eviction")
    prefetch_aged: int = counter("prefetch guards that ran out unread (passed over by 8 eviction walks)")
    prefetch_opened: int = counter("eviction walks that took guarded prefetches (nothing else left)")

    @classmethod
    def from_native(cls, d: Mapping[str, Any], policy: str) -> "CacheStats":
        """From `_native.Cache.stats()`'s dict and the cache's policy name
        (figures an older core lacks read 0)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name != "evict_policy":
                out[f.name] = d.get(f.name, f.default)
        return cls(evict_policy=policy, **out)
