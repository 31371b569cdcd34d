"""The eviction policy's trace loader and the evict_batch cost measurement,
for `memosfs bench policy` and tests/test_policy.py.

load_trace: Mooncake JSONL (`hash_ids` of each request, in order) or one key a
line (CSV: the first field; a non-numeric header is skipped), renumbered
0..unique-1.  next_access: for Belady.  batch_cost: puts of `slot`-byte slots
into a full native cache, timed one by one.  policy_cost_pair: the cost of
policies side by side in full native caches (ns per hit, puts/s, P99 of an
evicting put), in short alternating rounds; policy_rss: the resident memory of a fresh process
holding such a cache.

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
for i in range(5 * entries):       # keys from 20 x the entries: the ghosts fill
    k = b"k%d" % (rnd.randrange(20 * entries) if i > entries else i)
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
    slots under `policy`, after a churn of four times as many accesses over
    twenty times as many keys (every ghost ring full; a fresh interpreter:
    nothing else in it)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _RSS_PROBE, policy, str(entries), str(slot)],
                         capture_output=True, text=True, check=True).stdout.split()
    return {"policy": policy, "rss_bytes": int(out[0]), "slots": int(out[1])}


def policy_cost_pair(policies: tuple[str, ...], entries: int, rounds: int = 20,
                     gets: int = 5000, puts: int = 500, slot: int = 4096, seed: int = 1) -> dict:
    """The cost of each policy in `policies`, measured side by side: one
    full cache of `entries` slots each, the same gets (a skewed reuse of the
    slots present) and puts (new slots, each making room) run on each cache
    in turn, `rounds` short rounds (so a busy machine's swings fall on every
    policy alike).  Per policy: ns per hit and puts/s (medians over rounds,
    with each round's ratio to the first policy), the P50/P99 of the puts that
    ran an eviction (all rounds)."""
    data = b"x" * slot
    caches = []
    for p in policies:
        c = _native.Cache(entries * slot)
        c.set_policy(p)
        _fill(c, 2 * entries, data)
        caches.append(c)
    rnd = random.Random(seed)
    present = [c.keys() for c in caches]
    clock = time.perf_counter_ns
    hit_ns: list[list[float]] = [[] for _ in policies]
    put_rate: list[list[float]] = [[] for _ in policies]
    evicting: list[list[int]] = [[] for _ in policies]
    nxt = 0
    for r in range(rounds):
        order = [rnd.random() for _ in range(gets)]
        for j, c in enumerate(caches):
            keys = present[j]
            hot = max(1, len(keys) // 5)
            t = hits = 0
            for u in order:
                k = keys[int(u * 1e9) % hot] if u < 0.8 else keys[int(u * 1e9) % len(keys)]
                a = clock()
                g = c.get(k)
                if g is not None:
                    g.release()
                    t += clock() - a
                    hits += 1
            hit_ns[j].append(t / hits if hits else 0.0)
            runs = c.stats()["eviction_runs"]
            total = 0
            for i in range(puts):
                key = b"p%d" % (nxt + i)
                a = clock()
                d = c.draft()
                d.write(0, data)
                c.publish(d, key, dirty=False).release()
                dt = clock() - a
                total += dt
                e = c.stats()["eviction_runs"]
                if e != runs:
                    evicting[j].append(dt)
                    runs = e
            put_rate[j].append(puts / (total / 1e9) if total else 0.0)
            present[j] = c.keys()
        nxt += puts
    out: dict = {"entries": entries, "rounds": rounds}
    for j, p in enumerate(policies):
        hx = [hit_ns[j][r] / hit_ns[0][r] for r in range(rounds) if hit_ns[0][r]]
        px = [put_rate[j][r] / put_rate[0][r] for r in range(rounds) if put_rate[0][r]]
        out[p] = {"ns_per_hit": round(_median(hit_ns[j])), "puts_per_s": round(_median(put_rate[j])),
                  "hit_x": round(_median(hx), 3), "puts_x": round(_median(px), 3),
                  "evicting_puts": len(evicting[j]), "evicting_p50_us": _pct(evicting[j], 0.50),
                  "evicting_p99_us": _pct(evicting[j], 0.99)}
    for c in caches:
        c.check()
        c.close()
    return out


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if s else 0.0
