"""The eviction policy's trace loader and the evict_batch cost measurement,
for `memosfs bench policy` and tests/test_policy.py.

load_trace: Mooncake JSONL (`hash_ids` of each request, in order) or one key a
line (CSV: the first field; a non-numeric header is skipped), renumbered
0..unique-1.  next_access: for Belady.  batch_cost: puts of `slot`-byte slots
into a full native cache, timed one by one.

May call: memosfs._native and the standard library.
"""

from __future__ import annotations

import json
import time

from memosfs import _native


def load_trace(path: str) -> list[int]:
    """Block ids in access order, renumbered 0..unique-1."""
    ids: dict[object, int] = {}
    out: list[int] = []
    with open(path) as f:
        first = ""
        for line in f:
            if line.strip():
                first = line.strip()
                break
        f.seek(0)
        if first.startswith("{"):
            for line in f:
                if line.strip():
                    for h in json.loads(line)["hash_ids"]:
                        out.append(ids.setdefault(h, len(ids)))
            return out
        for n, line in enumerate(f):
            key = line.strip().split(",")[0].strip()
            if not key:
                continue
            if n == 0 and not key.lstrip("-").isdigit() and key.lower() in ("key", "id", "obj_id", "block"):
                continue   # a header
            out.append(ids.setdefault(key, len(ids)))
    return out


def next_access(keys: list[int]) -> list[int]:
    """For each access, the index of the next access of its key (-1: none)."""
    nxt = [-1] * len(keys)
    last: dict[int, int] = {}
    for i in range(len(keys) - 1, -1, -1):
        k = keys[i]
        nxt[i] = last.get(k, -1)
        last[k] = i
    return nxt


def _pct(xs: list[int], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] / 1000.0


def batch_cost(batch: int, puts: int, slot: int = 64 << 10, capacity: int = 32 << 20) -> dict:
    """Puts of `slot`-byte slots into a full cache, through the native API."""
    c = _native.Cache(capacity, batch)
    data = b"x" * slot
    clock = time.perf_counter_ns
    for i in range(2 * capacity // slot):       # fill, so every later run evicts
        d = c.draft()
        d.write(0, data)
        c.publish(d, b"w%d" % i, dirty=False).release()
    lat, lat_evict = [], []
    runs = c.stats()["eviction_runs"]
    t0 = clock()
    for i in range(puts):
        key = b"k%d" % i
        a = clock()
        d = c.draft()
        d.write(0, data)
        c.publish(d, key, dirty=False).release()
        dt = clock() - a
        lat.append(dt)
        r = c.stats()["eviction_runs"]
        if r != runs:
            lat_evict.append(dt)
            runs = r
    # stats() calls are outside each put's timing but inside the wall time:
    # take ops/s from the summed put latencies.
    total = sum(lat)
    wall = clock() - t0
    c.check()
    c.close()
    return {"evict_batch": batch, "puts": puts, "slot_bytes": slot,
            "ops_per_s": round(puts / (total / 1e9)) if total else 0,
            "p50_us": _pct(lat, 0.50), "p99_us": _pct(lat, 0.99),
            "evicting_puts": len(lat_evict), "evicting_p50_us": _pct(lat_evict, 0.50),
            "evicting_p99_us": _pct(lat_evict, 0.99), "wall_s": round(wall / 1e9, 3)}
