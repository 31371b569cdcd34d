"""The SSD tier's statistics (`memosfs stats`, .memos/stats.json)."""

from __future__ import annotations

from dataclasses import dataclass

from memosfs.stats import Record, counter, gauge


@dataclass(frozen=True)
class SSDStats(Record):
    """The SSD tier (with -o ssd=)."""
    ssd_slots: int = gauge("slots on the SSD tier")
    ssd_bytes: int = gauge("bytes of the slots on the SSD tier")
    ssd_capacity: int = gauge("setting: bytes the SSD tier may hold")
    ssd_corrupt: int = counter("slot files that failed their checks (set aside in corrupt/)")
    ssd_writes: int = counter("slot files written")
    ssd_writes_unsynced: int = counter("of those, written back without an fsync (no one had "
                                       "acknowledged the version; fsync'd by the next sync)")
    ssd_write_bytes: int = counter("bytes written to slot files (their holes not; "
                                   "copies for renames and metadata changes included) "
                                   "and extent logs")
    ssd_write_errors: int = counter("slot file writes that failed")
    ssd_reads: int = counter("slot files read back into memory")
    ssd_read_bytes: int = counter("bytes read back from slot files")
    ssd_evictions: int = counter("slot files evicted to keep within ssd_capacity (policy order)")
    ssd_policy_probation: int = gauge("SSD tier, lru_lfu: slots in probation")
    ssd_policy_protected: int = gauge("SSD tier, lru_lfu: slots in protected")
    ssd_packed: int = gauge("of ssd_slots, small ones packed in segment files")
    ssd_segments: int = gauge("segment files (small slots packed, docs/ssd-format.md)")
    ssd_segment_bytes: int = gauge("bytes of the segment files, dead records included")
    ssd_tombstones: int = counter("tombstone records written (removals of packed slots)")
    ssd_compactions: int = counter("segment files compacted away")
    ssd_log_appends: int = counter("write-backs appended to a slot's extent log (the changed "
                                   "extents only) instead of a whole slot file")
    ssd_log_bytes: int = gauge("bytes of the slots' extent logs (within ssd_bytes)")
    ssd_logs: int = gauge("slots whose file has an extent log")
    ssd_folds: int = counter("extent logs folded: the slot written whole, the log removed")
