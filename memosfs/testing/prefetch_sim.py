"""The prefetch workloads and the in-process simulator, for `memosfs bench
prefetch --sim` and tests/test_prefetch.py: the real PrefetchEngine
(background off) against `SimTier`, an LRU memory tier of N slots over an
unbounded SSD.

Workloads are lists of requests; a request is a list of ("r" | "w", (agent,
session, name)); see memosfs/bench/prefetch.py for what each one models.

May call: memosfs.store.prefetch (the engine) and the standard library.
"""

from __future__ import annotations

import collections
import json
import random
import time
from typing import Any, Iterable, Optional

from memosfs.store.prefetch import PrefetchEngine

Op = tuple[str, tuple[str, str, str]]          # ("r" | "w", (agent, session, name))
Request = list[Op]

WORKLOADS = ("mooncake", "conversation", "strided")


# ---------------------------------------------------------------- workloads

def mooncake_requests(path: str, limit: int = 0) -> list[Request]:
    out: list[Request] = []
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            ids = json.loads(line)["hash_ids"]
            if not ids:
                continue
            req: Request = [("r", ("mooncake", "root", f"block-{ids[0]}"))]
            if len(ids) > 1:
                sess = f"c{ids[1]}"
                req += [("r", ("mooncake", sess, f"block-{h}")) for h in ids[1:]]
            out.append(req)
            if limit and len(out) >= limit:
                break
    return out


def conversation_requests(seed: int = 0, agents: int = 8, sessions: int = 6, turns: int = 12,
                          limit: int = 0) -> list[Request]:
    """Interleaved multi-turn conversations: turn t re-reads turns 0..t-1, writes t."""
    rng = random.Random(seed)
    live = [(f"agent{a}", f"chat{s}") for a in range(agents) for s in range(sessions)]
    turn = {c: 0 for c in live}
    out: list[Request] = []
    while live:
        c = rng.choice(live)
        t = turn[c]
        req: Request = [("r", (c[0], c[1], f"turn-{i:04d}")) for i in range(t)]
        req.append(("w", (c[0], c[1], f"turn-{t:04d}")))
        out.append(req)
        turn[c] = t + 1
        if turn[c] >= turns:
            live.remove(c)
        if limit and len(out) >= limit:
            break
    return out


def strided_requests(seed: int = 0, sessions: int = 150, slots: int = 30, stride: int = 3,
                     reads: int = 5, limit: int = 0) -> list[Request]:
    """Sessions written whole, then read every `stride`-th slot from a random
    start, `reads` slots per request; sessions interleave (each request is one
    session's sparse read)."""
    rng = random.Random(seed)
    out: list[Request] = []
    for s in range(sessions):
        sess = ("sparse", f"doc{s:04d}")
        out.append([("w", (sess[0], sess[1], f"block-{i:03d}")) for i in range(slots)])
    order = [s for s in range(sessions) for _ in range(2)]
    rng.shuffle(order)
    for s in order:
        start = rng.randrange(0, stride)
        idx = [start + stride * j for j in range(reads) if start + stride * j < slots]
        out.append([("r", ("sparse", f"doc{s:04d}", f"block-{i:03d}")) for i in idx])
        if limit and len(out) >= limit:
            break
    return out


def load_workload(name: str, trace: str, limit: int, seed: int) -> list[Request]:
    if name == "mooncake":
        return mooncake_requests(trace, limit)
    if name == "conversation":
        return conversation_requests(seed, limit=limit)
    if name == "strided":
        return strided_requests(seed, limit=limit)
    raise ValueError(f"unknown workload {name!r} (one of {', '.join(WORKLOADS)})")


def unique_slots(reqs: Iterable[Request]) -> int:
    return len({k for r in reqs for _op, k in r})


def _key(k: tuple[str, str, str]) -> bytes:
    return f"{k[0]}/{k[1]}/{k[2]}".encode("utf-8", "surrogateescape")


# ---------------------------------------------------------------- the simulator

class SimTier:
    """A memory tier of `capacity` slots (LRU) over an unbounded SSD that
    holds every slot ever written (a write goes to memory and, through
    write-back, to the SSD)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self.mem: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self.ssd: set[bytes] = set()
        self.names: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
        self.engine: Optional[PrefetchEngine] = None
        self.c: collections.Counter[str] = collections.Counter()

    def _insert(self, key: bytes) -> None:
        self.mem[key] = None
        self.mem.move_to_end(key)
        while len(self.mem) > self.capacity:
            victim, _ = self.mem.popitem(last=False)
            self.c["evictions"] += 1
            if self.engine is not None:
                self.engine.on_evict(victim)

    def write(self, key: bytes) -> None:
        if key not in self.ssd:
            a, s, n = key.decode().split("/", 2)
            self.names[(a, s)].append(n)
        self.ssd.add(key)
        self._insert(key)
        self.c["writes"] += 1

    def read(self, key: bytes) -> Optional[str]:
        """A demand read: 'mem', 'ssd' (promoted) or None (no such slot)."""
        if key in self.mem:
            self.mem.move_to_end(key)
            self.c["mem_hits"] += 1
            return "mem"
        if key in self.ssd:
            self._insert(key)
            self.c["ssd_hits"] += 1
            self.c["ssd_reads"] += 1
            return "ssd"
        self.c["misses"] += 1
        return None

    # the engine's callbacks
    def fetch(self, key: bytes) -> bool:
        if key in self.mem or key not in self.ssd:
            return False
        self._insert(key)
        self.c["ssd_reads"] += 1
        self.c["prefetch_reads"] += 1
        return True

    def in_memory(self, key: bytes) -> bool:
        return key in self.mem

    def session_slots(self, agent: str, session: str) -> list[str]:
        return list(self.names.get((agent, session), ()))


def simulate(reqs: list[Request], mode: str, capacity: int, stride: int = 2,
             retrain_below: float = 0.70, fetch_budget: int = 1, think: bool = True,
             seed: int = 0) -> dict[str, Any]:
    """Replay `reqs` through a SimTier with the engine in `mode`."""
    tier = SimTier(capacity)
    knobs = {"prefetch_mode": "off", "prefetch_stride": stride,
             "prefetch_retrain_below": retrain_below}
    eng = PrefetchEngine(tier.fetch, tier.in_memory, tier.session_slots, knobs,
                         background=False, seed=seed)
    eng.set_mode(mode)
    tier.engine = eng
    t0 = time.perf_counter()
    try:
        for req in reqs:
            for op, k in req:
                key = _key(k)
                if op == "w":
                    tier.write(key)
                    continue
                where = tier.read(key)
                if where is None:
                    tier.write(key)
                    continue
                eng.on_access(key, where == "mem")
                eng.run_pending(fetch_budget)
            if think:
                eng.run_pending(None)
        st = eng.stats()
    finally:
        eng.close()
    c = tier.c
    reads = c["mem_hits"] + c["ssd_hits"]
    out: dict[str, Any] = {
        "mode": mode,
        "reads": reads,
        "lookups": reads + c["misses"],
        "mem_hits": c["mem_hits"],
        "ssd_hits": c["ssd_hits"],
        "mem_hit_ratio": round(c["mem_hits"] / reads, 4) if reads else 0.0,
        "ssd_reads": c["ssd_reads"],
        "accuracy": round(st["prefetch_accuracy"], 4),
        "prefetch_issued": st["prefetch_issued"],
        "prefetch_used": st["prefetch_used"],
        "prefetch_dropped": st["prefetch_dropped"],
        "prefetch_retrains": st["prefetch_retrains"],
        "sim_s": round(time.perf_counter() - t0, 2),
    }
    if mode == "hybrid":
        out["hybrid_final_choice"] = "random" if st["prefetch_hybrid_random"] else "sequential"
        out["hybrid_switches"] = st["prefetch_hybrid_switches"]
    if mode == "learned":
        out["learned_steps"] = st["prefetch_learned_steps"]
    return out
