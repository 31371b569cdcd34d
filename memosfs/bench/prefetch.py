"""`memosfs bench prefetch`: the prefetch modes side by side with `off`, in the
same run, on a real conversation trace and on synthetic workloads.

    memosfs bench prefetch [--trace FILE] [--workloads mooncake,conversation,strided]
                           [--modes off,sequential,random,hybrid,learned] [--sim]
                           [--capacity-slots N] [--stride 2] [--requests N] [--json]

Workloads (each a list of requests; a request reads slots in order, and a
read of a slot that does not exist is followed by its write, as a client
that recomputes a missing KV block does):

- mooncake: the Mooncake conversation trace (--trace FILE; by default
  memosfs/bench/data/mooncake_conversation_trace.jsonl, shipped in the
  repository (its source in the README beside it); without a trace this
  workload is skipped, and said so,
  unless it was asked for by name).  Each request reads its prefix blocks in order; block `h`
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

The workloads and the simulator live in memosfs/testing/prefetch_sim.py (the
tests use them too).  May call: memosfs.bench.common, memosfs.store.prefetch
(MODES), memosfs.testing.prefetch_sim.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from memosfs.bench.common import memos_mount, percentile, stats
from memosfs.store.prefetch import MODES, learned_available
from memosfs.testing.prefetch_sim import (WORKLOADS, Request, load_workload, simulate,
                                          unique_slots)

# beside the checkout (a clone with nothing beside it runs the synthetic workloads)
DEFAULT_TRACE = str(Path(__file__).resolve().parent / "data" /
                    "mooncake_conversation_trace.jsonl")


def add_parsers(bsub) -> None:
    p = bsub.add_parser("prefetch", help="prefetch modes vs off: accuracy, memory hit ratio, "
                        "read latency (mount, or --sim)")
    _arguments(p)
    p.set_defaults(fn=cmd_bench_prefetch)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", default=None,
                   help=f"Mooncake JSONL trace (default: {DEFAULT_TRACE} if it exists)")
    p.add_argument("--workloads", default=None,
                   help="comma-separated: " + ", ".join(WORKLOADS) + " (default: all; "
                        "mooncake only with a trace)")
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


# ---------------------------------------------------------------- on a mount

def replay_mount(reqs: list[Request], mode: str, capacity_bytes: int, slot: int, stride: int,
                 retrain_below: float, opts: str = "", think_ms: float = 0.0
                 ) -> dict[str, Any]:
    """Replay on a fresh mount; `think_ms` pauses between requests (an engine
    computes between two turns: the window a prefetch has), not timed."""
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
        st = stats(mnt)
    mem, ssd = int(st.get("mem_hits", 0)), int(st.get("ssd_hits", 0))
    out: dict[str, Any] = {
        "mode": mode,
        "reads": len(lat),
        "mem_hits": mem,
        "ssd_hits": ssd,
        "mem_hit_ratio": round(mem / (mem + ssd), 4) if mem + ssd else 0.0,
        "read_mean_us": round(1e6 * sum(lat) / len(lat), 1) if lat else 0.0,
        "read_p99_us": round(1e6 * percentile(lat, 0.99), 1),
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
    if args.trace is None and os.path.exists(DEFAULT_TRACE):
        args.trace = DEFAULT_TRACE
    if args.workloads is None:
        workloads = [w for w in WORKLOADS if w != "mooncake" or args.trace is not None]
        if args.trace is None:
            print(f"memosfs bench prefetch: the mooncake workload is skipped: no trace "
                  f"(--trace FILE; none at {DEFAULT_TRACE})", file=sys.stderr)
    else:
        workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [w for w in workloads if w not in WORKLOADS] + [m for m in modes if m not in MODES]
    if bad or args.stride < 0 or args.fetch_budget < 0 or not 0 <= args.retrain_below <= 1:
        print(f"memosfs bench prefetch: bad workloads/modes {bad} or a negative number",
              file=sys.stderr)
        return 2
    if "mooncake" in workloads and (args.trace is None or not os.path.exists(args.trace)):
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
