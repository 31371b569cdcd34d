"""`memosfs bench prefetch`: the prefetch modes side by side with `off`, in the
same run, on a real conversation trace and on synthetic workloads.

    memosfs bench prefetch [--trace FILE] [--workloads mooncake,conversation,strided]
                           [--modes off,sequential,random,hybrid,learned] [--sim]
                           [--capacity-slots N] [--stride 2] [--requests N] [--json]

Workloads (each a list of requests; a request reads slots in order, and a
read of a slot that does not exist is followed by its write, as a client
that recomputes a missing KV block does):

- mooncake: the Mooncake conversation trace (default
  ../shared/traces/mooncake_conversation_trace.jsonl, relative to the
  repository).  Each request reads its prefix blocks in order; block `h`
  is slot `mooncake/c<first block after the root>/block-<h>` (a session is
  the subtree of one first block; block ids grow along a chain, so the
  session's natural order is chain order), the shared root block is
  `mooncake/root/block-0`.
- conversation: synthetic multi-turn conversations: 8 agents x 6 sessions,
  12 turns each, interleaved at random; turn t re-reads turns 0..t-1 (the
  prefix KV) and writes turn t.
- strided: sessions of 30 slots written once, then read every 3rd slot
  (0, 3, 6, ...), a few reads per session (a sparse-attention or
  summarizing reader): a fixed non-unit stride that a per-session stride
  detector sees only after a few reads, and a learned model from the first.

--sim (fast, in-process): the real engine (memosfs.prefetch, background
off) against a simulated memory tier (LRU, --capacity-slots slots) over an
unbounded SSD; after each demand read the engine may complete
--fetch-budget prefetches (the SSD's pace relative to the reader), and
between requests it drains its queue (the reader's think time).  Reports
accuracy, memory hit ratio (memory hits / reads of existing slots) and the
SSD reads (demand + prefetch).  No latency: nothing is timed in the model.

Without --sim: each mode gets a fresh mount (`-o prefetch_mode=MODE,
prefetch_stride=S,capacity=...,ssd=DIR`) whose memory tier is smaller than
the working set; slots of --slot bytes are written and read through it
(open, read whole, close, each read timed); stats come from
`.memos/cache/stats.json` (mem_hits, ssd_hits, prefetch_*).  Reports
accuracy, memory hit ratio, mean and P99 read latency (open + read + close).
Slower (every slot that misses is written through the mount, and evictions
write back to the SSD directory): by default only the first 600 requests of
each workload.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from memosfs.store.prefetch import MODES, PrefetchEngine, learned_available

Op = tuple[str, tuple[str, str, str]]          # ("r" | "w", (agent, session, name))
Request = list[Op]

WORKLOADS = ("mooncake", "conversation", "strided")
DEFAULT_TRACE = str(Path(__file__).resolve().parent.parent.parent / "shared" / "traces" /
                    "mooncake_conversation_trace.jsonl")


def add_parsers(bsub) -> None:
    p = bsub.add_parser("prefetch", help="prefetch modes vs off: accuracy, memory hit ratio, "
                        "read latency (mount, or --sim)")
    _arguments(p)
    p.set_defaults(fn=cmd_bench_prefetch)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", default=DEFAULT_TRACE,
                   help="Mooncake JSONL trace (default: %(default)s)")
    p.add_argument("--workloads", default=",".join(WORKLOADS),
                   help="comma-separated: " + ", ".join(WORKLOADS) + " (default: all)")
    p.add_argument("--modes", default=",".join(MODES),
                   help="comma-separated prefetch modes; off is always run (default: all; "
                        "learned is skipped without torch)")
    p.add_argument("--sim", action="store_true",
                   help="simulate the memory tier in-process instead of mounting")
    p.add_argument("--stride", type=int, default=2, help="prefetch_stride (default 2)")
    p.add_argument("--retrain-below", type=float, default=0.70,
                   help="prefetch_retrain_below (default 0.70)")
    p.add_argument("--requests", type=int, default=0,
                   help="use only the first N requests of each workload (default: all with "
                        "--sim, 600 on a mount)")
    p.add_argument("--capacity-slots", type=int, default=0,
                   help="memory tier in slots (default: 5%% of the workload's unique slots, "
                        "at least 64)")
    p.add_argument("--fetch-budget", type=int, default=1,
                   help="--sim: prefetches completed per demand read (default 1)")
    p.add_argument("--no-think", action="store_true",
                   help="--sim: do not drain the prefetch queue between requests")
    p.add_argument("--slot", default="16K", help="mount: bytes per slot (default 16K)")
    p.add_argument("--opts", default="", help="mount: extra mount options")
    p.add_argument("--think-ms", type=float, default=2.0,
                   help="mount: pause between requests, the engine's compute between two "
                        "turns (default 2; not timed)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic workloads")
    p.add_argument("--json", action="store_true", help="print JSON only")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Standalone: python -m memosfs.bench.prefetch [args]."""
    p = argparse.ArgumentParser(prog="memosfs bench prefetch", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _arguments(p)
    return cmd_bench_prefetch(p.parse_args(argv))


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


# ---------------------------------------------------------------- on a mount

def _percentile(xs: list[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _stats(mnt: str) -> dict[str, Any]:
    with open(os.path.join(mnt, ".memos", "cache", "stats.json")) as f:
        return json.load(f)


def replay_mount(reqs: list[Request], mode: str, capacity_bytes: int, slot: int, stride: int,
                 retrain_below: float, opts: str = "", think_ms: float = 0.0
                 ) -> dict[str, Any]:
    """Replay on a fresh mount; `think_ms` pauses between requests (an engine
    computes between two turns: the window a prefetch has), not timed."""
    from memosfs.bench.io import memos_mount
    options = (f"prefetch_mode={mode},prefetch_stride={stride},"
               f"prefetch_retrain_below={retrain_below}")
    if opts:
        options += "," + opts
    payload = os.urandom(slot)
    buf = bytearray(slot + 4096)
    lat: list[float] = []
    t_start = time.perf_counter()
    with memos_mount(capacity_bytes, options) as mnt:
        made: set[str] = set()

        def write(k: tuple[str, str, str]) -> None:
            d = os.path.join(mnt, k[0], k[1])
            if d not in made:
                os.makedirs(d, exist_ok=True)
                made.add(d)
            with open(os.path.join(d, k[2]), "wb") as f:
                f.write(payload)

        for req in reqs:
            if think_ms:
                time.sleep(think_ms / 1000)
            for op, k in req:
                if op == "w":
                    write(k)
                    continue
                p = os.path.join(mnt, k[0], k[1], k[2])
                t0 = time.perf_counter()
                try:
                    fd = os.open(p, os.O_RDONLY)
                except FileNotFoundError:
                    write(k)
                    continue
                try:
                    while os.readv(fd, [buf]):
                        pass
                finally:
                    os.close(fd)
                lat.append(time.perf_counter() - t0)
        st = _stats(mnt)
    mem, ssd = int(st.get("mem_hits", 0)), int(st.get("ssd_hits", 0))
    out: dict[str, Any] = {
        "mode": mode,
        "reads": len(lat),
        "mem_hits": mem,
        "ssd_hits": ssd,
        "mem_hit_ratio": round(mem / (mem + ssd), 4) if mem + ssd else 0.0,
        "read_mean_us": round(1e6 * sum(lat) / len(lat), 1) if lat else 0.0,
        "read_p99_us": round(1e6 * _percentile(lat, 0.99), 1),
        "wall_s": round(time.perf_counter() - t_start, 2),
    }
    if "prefetch_issued" in st:
        out["accuracy"] = round(float(st.get("prefetch_accuracy", 0.0)), 4)
        for k in ("prefetch_issued", "prefetch_used", "prefetch_dropped", "prefetch_retrains"):
            out[k] = st.get(k, 0)
    else:
        out["accuracy"] = None
        out["note"] = "the mount reports no prefetch_* stats: the engine is not wired in yet"
    return out


# ---------------------------------------------------------------- the command

def bench_prefetch(workloads: list[str], modes: list[str], sim: bool, trace: str,
                   stride: int = 2, retrain_below: float = 0.70, requests: int = 0,
                   capacity_slots: int = 0, fetch_budget: int = 1, think: bool = True,
                   slot: int = 16 << 10, opts: str = "", seed: int = 0,
                   progress=None, think_ms: float = 0.0) -> dict[str, Any]:
    say = progress or (lambda msg: None)
    if "off" not in modes:
        modes = ["off"] + modes
    skipped = []
    if "learned" in modes and not learned_available():
        modes = [m for m in modes if m != "learned"]
        skipped.append("learned (torch is not importable)")
    out: dict[str, Any] = {"bench": "prefetch", "sim": sim, "stride": stride,
                           "retrain_below": retrain_below, "modes": modes,
                           "skipped": skipped, "workloads": {}}
    if sim:
        out |= {"fetch_budget": fetch_budget, "think": think}
    else:
        out["slot_bytes"] = slot
        out["think_ms"] = think_ms
    limit = requests or (0 if sim else 600)
    for w in workloads:
        reqs = load_workload(w, trace, limit, seed)
        uniq = unique_slots(reqs)
        cap = capacity_slots or max(64, uniq // 20)
        res: dict[str, Any] = {"requests": len(reqs), "unique_slots": uniq,
                               "capacity_slots": cap, "modes": {}}
        for m in modes:
            say(f"{w}: {m} ({len(reqs)} requests, memory {cap} of {uniq} slots)")
            if sim:
                r = simulate(reqs, m, cap, stride, retrain_below, fetch_budget, think, seed)
            else:
                cap_bytes = max(4 << 20, -(-cap * slot // (2 << 20)) * (2 << 20))
                res["capacity_bytes"] = cap_bytes
                r = replay_mount(reqs, m, cap_bytes, slot, stride, retrain_below, opts, think_ms)
            res["modes"][m] = r
        base = res["modes"]["off"]["mem_hit_ratio"]
        acc = {m: r.get("accuracy") for m, r in res["modes"].items() if m != "off"}
        scored = {m: a for m, a in acc.items() if a is not None}
        best = max(scored, key=lambda m: scored[m]) if scored else None
        res["best_mode"] = best
        res["best_accuracy"] = scored.get(best) if best else None
        res["best_mem_hit_ratio_gain"] = (round(res["modes"][best]["mem_hit_ratio"] - base, 4)
                                          if best else None)
        out["workloads"][w] = res
    return out


def cmd_bench_prefetch(args: argparse.Namespace) -> int:
    from memosfs.knobs import parse_size
    workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [w for w in workloads if w not in WORKLOADS] + [m for m in modes if m not in MODES]
    if bad or args.stride < 0 or args.fetch_budget < 0 or not 0 <= args.retrain_below <= 1:
        print(f"memosfs bench prefetch: bad workloads/modes {bad} or a negative number",
              file=sys.stderr)
        return 2
    if "mooncake" in workloads and not os.path.exists(args.trace):
        print(f"memosfs bench prefetch: no trace at {args.trace} (--trace FILE)",
              file=sys.stderr)
        return 2
    say = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    result = bench_prefetch(workloads, modes, args.sim, args.trace, args.stride,
                            args.retrain_below, args.requests, args.capacity_slots,
                            args.fetch_budget, not args.no_think, parse_size(args.slot),
                            args.opts, args.seed, progress=say, think_ms=args.think_ms)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
