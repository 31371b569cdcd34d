"""The eviction policy's trace loader and the evict_batch cost measurement,
for `memosfs bench policy` and tests/test_policy.py.

load_trace: Mooncake JSONL (`hash_ids` of each request, in order) or one key a
line (CSV: the first field; a non-numeric header is skipped), renumbered
0..unique-1.  next_access: for Belady.  batch_cost: puts of `slot`-byte slots
into a full native cache, timed one by one.  policy_cost: a policy's cost in
a full native cache (ns per hit, puts/s, P99 of an evicting put);
policy_rss: the resident memory of a fresh process holding such a cache.

May call: memosfs._native and the standard library.
"""

from __future__ import annotations

import json
import random
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


def _fill(c, n: int, data: bytes, prefix: bytes = b"f") -> None:
    for i in range(n):
        d = c.draft()
        d.write(0, data)
        c.publish(d, b"%s%d" % (prefix, i), dirty=False).release()


def policy_cost(policy: str, entries: int, puts: int = 20000, gets: int = 100_000,
                slot: int = 4096, seed: int = 1) -> dict:
    """The cost of `policy` in a full cache of `entries` slots of `slot`
    bytes, through the native API (Python's call overhead included, the same
    for every policy): ns per hit (a get of a present slot and its release),
    puts per second of new slots (each makes room), and the P50/P99 of the
    puts that ran an eviction."""
    c = _native.Cache(entries * slot)
    c.set_policy(policy)
    data = b"x" * slot
    _fill(c, 2 * entries, data)                  # full: every later put evicts
    rnd = random.Random(seed)
    present = c.keys()
    # a skewed reuse (a fifth of the slots take most gets), drawn beforehand
    hot = present[: max(1, len(present) // 5)]
    order = [rnd.choice(hot) if rnd.random() < 0.8 else rnd.choice(present) for _ in range(gets)]
    clock = time.perf_counter_ns
    hits = 0
    t = 0
    for k in order:
        a = clock()
        r = c.get(k)
        if r is not None:
            r.release()
            t += clock() - a
            hits += 1
    lat, lat_evict = [], []
    runs = c.stats()["eviction_runs"]
    for i in range(puts):
        key = b"p%d" % i
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
    c.check()
    c.close()
    total = sum(lat)
    return {"policy": policy, "entries": entries, "ns_per_hit": round(t / hits) if hits else None,
            "hits": hits, "puts_per_s": round(puts / (total / 1e9)) if total else 0,
            "evicting_puts": len(lat_evict), "evicting_p50_us": _pct(lat_evict, 0.50),
            "evicting_p99_us": _pct(lat_evict, 0.99)}


_RSS_PROBE = r"""
import random, sys
from memosfs import _native
policy, entries, slot = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
c = _native.Cache(entries * slot)
c.set_policy(policy)
data = b"x" * slot
rnd = random.Random(1)
for i in range(3 * entries):
    k = b"k%d" % (rnd.randrange(2 * entries) if i > entries else i)
    r = c.get(k)
    if r is not None:
        r.release()
        continue
    d = c.draft()
    d.write(0, data)
    c.publish(d, k, dirty=False).release()
s = c.stats()
print(rss(), s["slots"])
"""


def policy_rss(policy: str, entries: int = 60_000, slot: int = 4096) -> dict:
    """The resident memory of a process holding a full cache of `entries`
    slots under `policy`, after a churn of three times as many accesses (a
    fresh interpreter: nothing else in it)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _RSS_PROBE, policy, str(entries), str(slot)],
                         capture_output=True, text=True, check=True).stdout.split()
    return {"policy": policy, "rss_bytes": int(out[0]), "slots": int(out[1])}
