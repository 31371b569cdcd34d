"""The control plane: the knob table and the `.memos/` pseudo-files.

Every setting lives in one table, `KNOBS`: its name, how a written value is
parsed and checked, its default, and what it means.  The knob files under
`.memos/cache/`, their validation, the mount options and the README's knob
list all come from this table.

Pseudo-files (all served with direct_io, st_size 0, read as a snapshot taken
at open):

=====================  ====  =====================================================
file                   mode  meaning
=====================  ====  =====================================================
cache/stats            0444  `name value` lines, one per counter
cache/stats.json       0444  the same counters as one JSON object
cache/<knob>           0644  `value\\n`; writing a valid value sets it at once,
                             anything else is EINVAL and changes nothing
cache/flush            0200  write 1: persist every dirty slot, then reclaim memory
cache/reset_context    0200  write `agent/session`: drop that session's slots
debug/trace            0644  write 1 (on, clears the buffer) or 0 (off); read: one
                             event a line, `<ns> <EVENT> key=value ...`
metrics                0444  Prometheus text exposition of the stats
=====================  ====  =====================================================
"""

from __future__ import annotations

import collections
import json
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

__all__ = ["Knob", "KNOBS", "KNOB_BY_NAME", "parse_size", "Trace", "format_stats",
           "format_metrics", "KnobError"]


class KnobError(ValueError):
    """A value that a knob refuses; the message says why."""


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?[bB])?\s*$")
_SIZE_MULT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """Parse `4G`, `512M`, `1.5g`, `65536` (binary multiples) into bytes."""
    m = _SIZE_RE.match(text)
    if not m:
        raise KnobError(f"not a size: {text.strip()!r} (use bytes or a K/M/G/T suffix)")
    return int(float(m.group(1)) * _SIZE_MULT[m.group(2).lower()])


def _int_in(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        t = text.strip()
        if not re.fullmatch(r"[+]?\d+", t):
            raise KnobError(f"not an integer: {t!r}")
        v = int(t)
        if not lo <= v <= hi:
            raise KnobError(f"{v} is out of range [{lo}, {hi}]")
        return v
    return parse


def _size_in(lo: int, hi: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        v = parse_size(text)
        if not lo <= v <= hi:
            raise KnobError(f"{v} bytes is out of range [{lo}, {hi}]")
        return v
    return parse


def _ratio(text: str) -> float:
    t = text.strip()
    try:
        v = float(t)
    except ValueError:
        raise KnobError(f"not a number: {t!r}") from None
    if not 0.0 <= v <= 1.0:
        raise KnobError(f"{v} is out of range [0, 1]")
    return v


def _size_or_zero(text: str) -> int:
    v = parse_size(text)
    if v and v < (1 << 20):
        raise KnobError(f"{v} bytes is too small (0 = no limit, else at least 1M)")
    return v


def _error_max(text: str) -> str:
    t = text.strip()
    if t == "auto":
        return t
    try:
        v = float(t)
    except ValueError:
        raise KnobError(f"not a number or auto: {t!r}") from None
    if not 0.0 < v <= 1.0:
        raise KnobError(f"{v} is out of range (0, 1]")
    return repr(v)


def _choice(*names: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        t = text.strip()
        if t not in names:
            raise KnobError(f"{t!r} is not one of {', '.join(names)}")
        return t
    return parse


@dataclass(frozen=True)
class Knob:
    """One setting: name, parser (str -> value, raises KnobError), default,
    meaning (one line, for the README and `memosfs --help`), and when a
    change takes effect."""
    name: str
    parse: Callable[[str], Any]
    default: Any
    meaning: str
    effect: str = "at once"

    def format(self, value: Any) -> str:
        return f"{value}\n"


KNOBS: tuple[Knob, ...] = (
    Knob("capacity", _size_in(2 << 20, 1 << 50), 1 << 30,
         "memory tier size in bytes (accepts 512M, 4G); rounded up to 2 MiB superblocks; "
         "shrinking evicts"),
    Knob("evict_policy", _choice("lru_lfu", "lru", "lfu"), "lru_lfu",
         "eviction policy: lru_lfu (adaptive recency/frequency hybrid with ghost lists), "
         "lru or lfu; switching keeps every slot"),
    Knob("evict_batch", _int_in(1, 4096), 16,
         "victims chosen per eviction run (a larger batch trades P99 put latency for throughput)"),
    Knob("reclaim_free_ratio", _ratio, 0.2,
         "lazy reclaim: the arena sweeps freed pages back into whole blocks when its "
         "allocatable share of capacity falls below this (0 = only after failures and on "
         "flush)"),
    Knob("reclaim_fail_limit", _int_in(0, 1_000_000), 3,
         "lazy reclaim: the arena also sweeps after more than this many allocation "
         "failures in a row"),
    Knob("writeback_delay_ms", _int_in(0, 3_600_000), 1000,
         "a published (dirty) slot is written to the SSD tier this long after its "
         "publish, by the background writer"),
    Knob("ssd_capacity", _size_or_zero, 0,
         "bytes the SSD tier may hold (accepts 100G); beyond it, its least recently used "
         "slots go; 0 = as much as the disk has"),
    Knob("warmup_ratio", _ratio, 0.5,
         "share of capacity preloaded from the SSD tier at mount, most recently used "
         "first, in the background", "at the next mount"),
    Knob("quantize", _choice("off", "int8", "int8-layer", "int4"), "off",
         "store safetensors slots' float tensors quantized: int8 (keys per channel, values "
         "per token), int8-layer (one scale per tensor), int4 (groups of 32); reads return "
         "the dequantized tensors in their dtype and layout", "on the next publish"),
    Knob("quant_error_max", _error_max, "auto",
         "relative error ||x-x^||/||x|| above which a tensor stays at full precision; auto "
         "= 0.03 for int8 schemes, 0.12 for int4", "on the next publish"),
    Knob("page_cache_push", _choice("0", "1"), "1",
         "1: copy each published version (of 1 MiB or more) into the kernel page cache, so local readers "
         "and mmap find it without a request (as after a write on a local filesystem); "
         "0: readers fetch from the daemon"),
    Knob("coherence_protocol", _choice("0", "1", "2"), "1",
         "agents sharing slots: 0 no tracking (last publish wins); 1 batched invalidation "
         "(a writer goes on at once, holders are told in batches and keep their snapshot); "
         "2 strong (a writer's open waits until every holder has acknowledged, and no "
         "reader opens while a write is granted)", "on the next open"),
    Knob("coherence_timeout_ms", _int_in(1, 3_600_000), 5000,
         "protocol 2: how long an open waits for acknowledgements or for a writer before "
         "it fails with ETIMEDOUT and nothing changes", "on the next open"),
    Knob("lease_break_ms", _int_in(1, 3_600_000), 1000,
         "protocol 2: a holder that has not acknowledged this long after a writer started "
         "waiting is revoked (its reads fail with ESTALE) and the writer goes on; no effect "
         "when not shorter than coherence_timeout_ms", "on the next wait"),
    Knob("coherence_batch_ms", _int_in(0, 60_000), 2,
         "protocol 1: invalidations are delivered in batches at most this often "
         "(0 = at once)"),
    Knob("agent_identity", _choice("uid", "pid"), "uid",
         "who is an agent for the coherence directory: every uid (its processes share a "
         "state) or every process", "on the next open"),
    Knob("ring_slots", _int_in(0, 1 << 30), 0,
         "slots a session keeps before its oldest is recycled (0 = no limit)",
         "on the next publish in a session"),
    Knob("prefetch_mode", _choice("off", "sequential", "random", "hybrid", "learned"), "off",
         "bring slots from the SSD tier into memory before they are read: sequential (the "
         "next prefetch_stride slots of the session, by its detected stride), random (hot "
         "slots from the heat table), hybrid (whichever of the two is more accurate), "
         "learned (an LSTM over the session's moves; needs torch) or off"),
    Knob("prefetch_stride", _int_in(0, 64), 2,
         "slots fetched ahead per read (sequential: the next N at the session's stride; "
         "random and learned: up to N)"),
    Knob("prefetch_retrain_below", _ratio, 0.70,
         "prefetch accuracy (used before eviction / fetched, over a window) below which "
         "learned retrains and hybrid re-chooses"),
)
KNOB_BY_NAME = {k.name: k for k in KNOBS}


class Trace:
    """The debug/trace event buffer: a bounded ring of text lines."""

    def __init__(self, maxlen: int = 65536) -> None:
        self.enabled = False
        self._lines: collections.deque[str] = collections.deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def set(self, on: bool) -> None:
        with self._lock:
            if on and not self.enabled:
                self._lines.clear()
            self.enabled = on

    def emit(self, event: str, **fields: Any) -> None:
        if not self.enabled:
            return
        kv = " ".join(f"{k}={v}" for k, v in fields.items())
        with self._lock:
            self._lines.append(f"{time.time_ns()} {event} {kv}".rstrip())

    def text(self) -> str:
        with self._lock:
            return "".join(line + "\n" for line in self._lines)


def format_stats(stats: dict[str, Any]) -> str:
    """`name value` lines; floats with 6 significant digits."""
    out = []
    for k, v in stats.items():
        out.append(f"{k} {_fmt(v)}\n")
    return "".join(out)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


_GAUGES = {"slots", "bytes_used", "capacity", "index_load_factor", "free_pages",
           "superblocks", "hit_rate", "drafts", "pinned", "pages_used", "bytes_draft",
           "evict_batch", "ring_slots", "agents", "sessions", "open_handles",
           "dead_pinned", "index_buckets", "index_entries", "huge_pages", "uptime_s",
           "fragmentation", "pages_pending", "sweep_ns_max", "policy_recency",
           "policy_probation", "policy_protected", "ssd_slots", "ssd_bytes",
           "ssd_capacity", "warmup_loaded_bytes", "warmup_total_bytes", "warmup_done",
           "reclaim_free_ratio", "reclaim_fail_limit", "open_handles",
           "coherence_slots", "coherence_holders", "coherence_protocol"}


_GAUGE_PREFIXES = ("prefetch_queue", "prefetch_outstanding", "prefetch_hybrid_random",
                   "prefetch_learned_loss", "remote_queue")


def format_metrics(stats: dict[str, Any]) -> str:
    """Prometheus text exposition format (version 0.0.4)."""
    out = []
    for k, v in stats.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            continue
        gauge = k in _GAUGES or k.startswith(_GAUGE_PREFIXES) or "accuracy" in k
        name = "memosfs_" + k + ("" if gauge else "_total")
        kind = "gauge" if gauge else "counter"
        out.append(f"# TYPE {name} {kind}\n{name} {_fmt(v)}\n")
    return "".join(out)


def stats_json(stats: dict[str, Any]) -> str:
    return json.dumps(stats, sort_keys=False) + "\n"
