"""`memosfs bench policy`: hit ratios of the C eviction policy against the
published ones on a real trace, and the cost of an eviction batch.

    memosfs bench policy --trace FILE [--sizes 0.005,0.027,...] [--json]
    memosfs bench policy --suite [--trace FILE] [--workloads a,b|variants|agents] [--json]
    memosfs bench policy --check-peers [--trace FILE] [--json]

Trace formats (--trace-format, by default found from the file): Mooncake
JSONL (one request a line, `hash_ids` its blocks in order), JSON lines of one
key each, a text file of one access a line (a key, or CSV / TSV / space
separated fields: the key column is --trace-column, else the header's key /
obj_id / ... column, else the first), libCacheSim's oracleGeneral binary
(24-byte records, obj_id the key); .zst and .gz files are decompressed
(memosfs/testing/policy_sim.py: load_trace).  Every block of a request is a
lookup; a miss is followed by an insert.  Keys are renumbered densely.

Ours: the policy code of the mount (native/policy.c, native/policies/),
driven over unit-size blocks by `_native.policy_simulate` (capacity in
blocks, one victim per run unless stated, like the simulators it is compared
with; `lru_lfu_batch16` is the mount's default batch).  Each cell says what
decided lru_lfu's victims (`_native.policy_explain`): `decided`, the setting
in force at the end and why ("lru_lfu@7 (shadows: LIRS led, 3 switches)"),
`switches`, `shadows_pct` (what its shadows of LRU, LIRS and ARC judged each
would hit, as hit ratios, keyed by the setting each stands for) and
`time_by_setting` (the share of the accesses served under each setting).

Peers: the published policies LRU, LFU, ARC, LIRS, 2Q, S3-FIFO, SIEVE and
W-TinyLFU, from libCacheSim (PyPI `libcachesim`) where it runs the published
algorithm, and from our reference implementation (memosfs/testing/
refpolicies.py; the same code runs in C as `ref:NAME`, tested equal) where
it does not: LIRS and W-TinyLFU (REFERENCE_PEERS says why; their
libCacheSim figures are reported beside, as "LIRS (libCacheSim)").
`--check-peers` replays every reference beside libCacheSim on short
streams and says where they part, and checks SIEVE against LFU.  Belady
(libCacheSim, each request carrying its next access time) is the oracle.

Seeds (--seeds N): every stream is replayed N times with its keys
relabelled (seed 0: the keys as loaded; seed s: a permutation drawn from s),
which moves every hash the policies take (lru_lfu's ghost fingerprints,
W-TinyLFU's sketch): each cell is the mean over the seeds, with its spread
(max - min).

Goals (issue 45), on the cells' means: lru_lfu never below LRU (every cell
at least LRU - 0.05 points); on the suite a mean gap to the best non-oracle
peer >= -0.5 points and no cell under -5 (SUITE_GOALS); on a --trace, a mean
>= -0.3 and no cell under -1.0 (TRACE_GOALS).  Sizes are fractions of the
unique blocks (--sizes: any list).

Cost (on by default; --no-cost skips it): lru_lfu beside lru in the same
run, a full native cache of `--cost-entries` 4 KiB slots under each, the
same gets and puts on each in turn for `--cost-rounds` short rounds (the
median of the rounds' ratios): ns per hit, puts/s, and the P99 of the puts
that ran an eviction (all rounds); and the resident memory of a fresh
process holding 60,000 slots under each (bytes per entry more than lru).  Goals: a hit <= 1.2x
lru's time, puts/s >= 0.9x, evicting P99 <= 1.5x, <= 64 bytes an entry more.

Batch: puts of 64 KiB slots into a full 32 MiB cache through the native API,
evict_batch 16 vs 24: puts per second, and P50/P99 latency of all puts and
of the puts that ran an eviction.

Suite (--suite): the seeded generators of memosfs/testing/workloads.py (and
the --trace file, if given, as workload "trace"), each at every size, against
the same peers; per workload and size: every hit ratio, the best peer, our
gap to it and to LRU, and the goal.  The agent workloads (--workloads
agents) were written after lru_lfu was tuned: they are reported last and
apart (held_out).  libCacheSim's peers run through process_trace over an
oracleGeneral file, with a hash table sized to the stream (same results as
one request at a time, an order of magnitude faster); --peer-cache FILE
keeps their results between runs (the streams are deterministic).

The Mooncake trace (memosfs/bench/data/, its source and licence in the
README there) is `--trace mooncake`.

The trace loader and the batch measurement live in memosfs/testing/policy_sim.py
(the tests use them too).  May call: memosfs._native, memosfs.testing.policy_sim,
memosfs.testing.refpolicies, memosfs.testing.workloads, libcachesim (the
peers, optional).
"""

from __future__ import annotations

import argparse
import array
import hashlib
import json
import os
import struct
import sys
import tempfile
import random
import statistics
import time
from typing import Iterable, Optional

from memosfs import _native
from memosfs.testing import refpolicies, workloads
from memosfs.testing.policy_sim import (TRACE_FORMATS, batch_cost, load_trace, next_access,
                                        policy_cost_pair,
                                        policy_rss)

SIZES = (0.005, 0.01, 0.02, 0.035, 0.055, 0.08, 0.11, 0.16, 0.22, 0.3)
PEERS = ("LRU", "LFU", "ARC", "LIRS", "2Q", "S3-FIFO", "SIEVE", "W-TinyLFU")
OURS = ("lru_lfu", "lru", "lfu")
# Issue 45's goals, in points of hit ratio: every cell at least LRU's less
# vs_lru (never below LRU), the mean gap to the best peer and the worst cell's
# at least these; the suite's, and those of a trace nobody tuned for.
SUITE_GOALS = {"vs_best_peer": -5.0, "mean_vs_best_peer": -0.5, "vs_lru": -0.05}
TRACE_GOALS = {"vs_best_peer": -1.0, "mean_vs_best_peer": -0.3, "vs_lru": -0.05}
COST_GOALS = {"hit_x": 1.2, "puts_x": 0.9, "evicting_p99_x": 1.5, "bytes_per_entry_more": 64}
MOONCAKE = os.path.join(os.path.dirname(__file__), "data", "mooncake_conversation_trace.jsonl")

# Where libCacheSim (0.3.5) does not run the published algorithm, the goal's
# peer is the reference (`--check-peers` shows the first access where they part).
REFERENCE_PEERS = {
    "LIRS": "a hit on a resident HIR block that is not in the stack S demotes the bottom "
            "LIR block and evicts a resident HIR block (the cache drops to size - 1); "
            "Jiang and Zhang's LIRS only moves the block to the top of S and the end of Q",
    "W-TinyLFU": "the window is not kept at 1% (a window victim that wins its contest "
                 "moves to the main cache and the next one contests again, so the window "
                 "empties), window hits do not count in the sketch, the candidate is "
                 "counted again at every contest, and below 100 blocks the window has no "
                 "room (0 hits); the reference is Caffeine's layout with the paper's sketch",
}


def add_parsers(bsub) -> None:
    p = bsub.add_parser("policy", help="eviction policy hit ratios vs published peers, evict_batch cost")
    p.add_argument("--trace-format", default="auto", choices=TRACE_FORMATS,
                   help="the trace's format (default: by its content and name): Mooncake JSONL "
                   "(hash_ids), JSON lines of one key, text/CSV/TSV of one access a line, "
                   "libCacheSim oracleGeneral binary; .zst and .gz are decompressed")
    p.add_argument("--trace-column", help="text or JSON-lines traces: the key's column (a 0-based "
                   "number or a header name; default: the header's key/obj_id/... column, else "
                   "the first)")
    p.add_argument("--trace", help="a trace file (--trace-format); \"mooncake\": the "
                   "trace in memosfs/bench/data/; required without --suite")
    p.add_argument("--suite", action="store_true",
                   help="the robustness suite: every generated workload (plus --trace) at every size")
    p.add_argument("--workloads", default=",".join(workloads.WORKLOADS),
                   help="suite workloads to run (default: all: %(default)s); "
                   "\"variants\" adds the unseen variants (another seed and parameter "
                   "for each family: " + ",".join(workloads.VARIANTS) + "); \"agents\" the "
                   "agent workloads held out from tuning (" + ",".join(workloads.AGENTS) + ")")
    p.add_argument("--check-peers", action="store_true",
                   help="replay every reference policy beside libCacheSim on short streams "
                   "(and SIEVE beside LFU); with --trace, on that trace too")
    p.add_argument("--peer-cache", help="suite: JSON file keeping the peers' results between runs")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)),
                   help="cache sizes as fractions of the unique blocks (default %(default)s)")
    p.add_argument("--peers", default=",".join(PEERS) + ",Belady",
                   help="peers to run (default: all)")
    p.add_argument("--seeds", type=int, default=1,
                   help="replay each stream with its keys relabelled this many ways (each cell: "
                   "the mean and the spread; default %(default)s)")
    p.add_argument("--no-batch", action="store_true", help="skip the evict_batch 16 vs 24 run")
    p.add_argument("--no-cost", action="store_true",
                   help="skip the cost of lru_lfu beside lru (ns per hit, puts/s, P99, bytes)")
    p.add_argument("--cost-entries", default="512,32768",
                   help="cache sizes in 4 KiB slots for the cost (default %(default)s)")
    p.add_argument("--cost-rounds", type=int, default=20,
                   help="lru and lru_lfu alternate this many times; medians (default %(default)s)")
    p.add_argument("--puts", type=int, default=20000, help="puts per evict_batch run")
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.set_defaults(fn=cmd_bench_policy)


# ---- hit ratios ----

def ours(keys_buf: bytes, n: int, capacity: int, policy: str, batch: int = 1) -> float:
    r = _native.policy_simulate(policy, keys_buf, capacity, batch)
    return 100.0 * r["hits"] / n if n else 0.0


def _lcs_classes():
    import libcachesim as lcs
    return {"LRU": lcs.LRU, "LFU": lcs.LFU, "ARC": lcs.ARC, "LIRS": lcs.LIRS,
            "2Q": lcs.TwoQ, "S3-FIFO": lcs.S3FIFO, "SIEVE": lcs.Sieve,
            "W-TinyLFU": lcs.WTinyLFU, "Belady": lcs.Belady}, lcs


def _have_lcs() -> bool:
    try:
        _lcs_classes()
        return True
    except ImportError:
        return False


# Below these sizes libCacheSim 0.3.5 cannot run a peer: its S3-FIFO stops
# the process ("Invalid cache size configuration"), its W-TinyLFU has no window
# (no hits).  There the reference stands in (it agrees with S3-FIFO elsewhere).
LIB_MIN_BLOCKS = {"S3-FIFO": 10, "W-TinyLFU": 100}


def lib_name(p: str) -> str:
    """The column of libCacheSim's figure for a peer replaced by the reference."""
    return f"{p} (libCacheSim)"


def judge(row: dict[str, float], goals: dict = SUITE_GOALS) -> dict:
    """The goals at one cell (on its means): best peer, gaps, goal_met."""
    peers = {k: v for k, v in row.items() if k in PEERS}
    ours_ = row["lru_lfu"]
    lru = peers.get("LRU", row["lru"])
    out: dict = {"vs_lru": round(ours_ - lru, 2)}
    if not peers:
        return out
    best = max(peers, key=peers.get)
    out.update(best_peer=best, best_peer_pct=peers[best], vs_best_peer=round(ours_ - peers[best], 2),
               x_lru=round(ours_ / lru, 3) if lru else None)
    out["goal_met"] = (ours_ >= peers[best] + goals["vs_best_peer"] - 1e-9 and
                       ours_ >= lru + goals["vs_lru"] - 1e-9)
    return out


def relabel(keys: list[int], seed: int) -> list[int]:
    """The stream with its keys renamed by a permutation drawn from `seed`
    (0: as they are); keys are dense (0..unique-1)."""
    if seed == 0:
        return keys
    ids = list(range(max(keys) + 1 if keys else 0))
    random.Random(seed).shuffle(ids)
    return [ids[k] for k in keys]


def decided_label(labels: list[str]) -> str:
    """What decided a cell over its seeds: one label, or each with its count."""
    seen: dict[str, int] = {}
    for x in labels:
        seen[x] = seen.get(x, 0) + 1
    if len(seen) == 1:
        return labels[0]
    return ", ".join(f"{k} x{v}" for k, v in sorted(seen.items(), key=lambda kv: -kv[1]))


def _peer_file(keys: list[int], nxt: list[int]) -> str:
    """The stream as a libCacheSim oracleGeneral file (a temporary file)."""
    fd, path = tempfile.mkstemp(prefix="memosfs-policy-", suffix=".oracleGeneral")
    rec = struct.Struct("<IQIq")
    with os.fdopen(fd, "wb") as f:
        f.write(b"".join(rec.pack(i & 0xffffffff, k, 1, x if x >= 0 else -1)
                         for i, (k, x) in enumerate(zip(keys, nxt))))
    return path


def lib_peers(keys: list[int], caps: list[int], peers: list[str]) -> dict[int, dict[str, float]]:
    """Every libCacheSim peer's hit ratio at every capacity (process_trace, C speed)."""
    classes, lcs = _lcs_classes()
    nxt = next_access(keys)
    path = _peer_file(keys, nxt)
    # a hash table sized to the stream, not libCacheSim's default 2^24
    # buckets: the same hits, ten times faster (no 128 MiB table per run)
    hp = max(12, (2 * len(set(keys))).bit_length())
    try:
        out: dict[int, dict[str, float]] = {}
        for cap in caps:
            row = out.setdefault(cap, {})
            for p in peers:
                if cap < LIB_MIN_BLOCKS.get(p, 1):
                    continue                    # (it cannot run there: the reference stands in)
                reader = lcs.TraceReader(path, lcs.TraceType.ORACLE_GENERAL_TRACE)
                miss, _ = classes[p](cap, hashpower=hp).process_trace(reader)
                row[p] = round(100.0 * (1.0 - miss), 2)
        return out
    finally:
        os.unlink(path)


def one_row(buf: bytes, n: int, cap: int, peers: list[str], lib: dict[str, float]) -> tuple:
    """One stream (one labelling) at one size: every hit ratio, what decided
    lru_lfu, the peers taken from the reference."""
    row: dict[str, float] = {p: round(ours(buf, n, cap, p), 2) for p in OURS}
    row["lru_lfu_batch16"] = round(ours(buf, n, cap, "lru_lfu", 16), 2)
    sim = _native.policy_explain(buf, cap)
    from_ref = []
    for p in peers:
        if p in REFERENCE_PEERS:
            row[p] = round(ours(buf, n, cap, "ref:" + p), 2)
            if p in lib:
                row[lib_name(p)] = lib[p]
        elif p in lib:
            row[p] = lib[p]
        elif lib and p != "Belady":
            row[p] = round(ours(buf, n, cap, "ref:" + p), 2)    # (libCacheSim cannot run it here)
            from_ref.append(p)
    return row, sim, from_ref


def cell(bufs: list[bytes], n: int, cap: int, peers: list[str], libs: list[dict[str, float]],
         goals: dict = SUITE_GOALS) -> dict:
    """One workload at one size over every labelling: the means, their
    spread, what decided, the goal."""
    rows, sims, from_ref = [], [], []
    for buf, lib in zip(bufs, libs):
        row, sim, fr = one_row(buf, n, cap, peers, lib)
        rows.append(row)
        sims.append(sim)
        from_ref = fr
    cols = [c for c in rows[0] if all(c in r for r in rows)]
    mean = {c: round(statistics.fmean(r[c] for r in rows), 2) for c in cols}
    out = {"blocks": cap, "hit_ratio_pct": mean, **judge(mean, goals),
           "decided": decided_label([x["decided"] for x in sims]),
           "switches": round(statistics.fmean(x["switches"] for x in sims), 1),
           "shadows_pct": {k: round(statistics.fmean(100.0 * x["estimated_hits"][k] / n for x in sims), 2)
                           for k in sims[0]["estimated_hits"]},
           "time_by_setting": {k: round(statistics.fmean(x["accesses_by_setting"][k] / n for x in sims), 3)
                               for k in sims[0]["accesses_by_setting"]},
           "policy_bytes_per_block": round((sims[0]["sim_bytes"] + sims[0]["ghost_bytes"]) / cap)}
    if len(rows) > 1:
        out["seeds"] = len(rows)
        out["spread_pct"] = {c: round(max(r[c] for r in rows) - min(r[c] for r in rows), 2)
                             for c in ("lru_lfu", "lru", "LRU") if c in cols}
        out["vs_best_peer_by_seed"] = [judge(r, goals).get("vs_best_peer") for r in rows]
    if from_ref:
        out["peers_from_reference"] = from_ref
    return out


def _streams_by_seed(keys: list[int], seeds: int) -> list[list[int]]:
    return [relabel(keys, s) for s in range(max(1, seeds))]


def hit_ratios(keys: list[int], sizes: Iterable[float], peers: list[str], seeds: int = 1,
               goals: dict = TRACE_GOALS) -> dict:
    n = len(keys)
    unique = len(set(keys))
    streams = _streams_by_seed(keys, seeds)
    bufs = [array.array("Q", k).tobytes() for k in streams]
    have_lcs = _have_lcs()
    sizes = list(sizes)
    caps = [max(1, round(unique * f)) for f in sizes]
    libs = [lib_peers(k, caps, peers) if have_lcs else {} for k in streams]
    table = {}
    for f, cap in zip(sizes, caps):
        table[f"{f:g}"] = cell(bufs, n, cap, peers, [lb.get(cap, {}) for lb in libs], goals)
    out = {"accesses": n, "unique_blocks": unique, "seeds": len(streams),
           "ceiling_pct": round(100.0 * (n - unique) / n, 2) if n else 0.0,
           "sizes": table}
    if not have_lcs:
        out["peers_missing"] = ("libcachesim is not installed (pip install libcachesim): "
                                "only the reference peers (" + ", ".join(REFERENCE_PEERS) + ")")
    out["bounds"] = goals
    out.update(summarize(list(table.values()), goals))
    return out


def summarize(cells: list[dict], goals: dict = SUITE_GOALS) -> dict:
    """The goals over cells: the mean gap to the best peer, the worst cell,
    the cells below LRU (by more than the goal's slack)."""
    gaps = [c["vs_best_peer"] for c in cells if "vs_best_peer" in c]
    below = sum(1 for c in cells if c["vs_lru"] < goals["vs_lru"] - 1e-9)
    out: dict = {"cells": len(cells), "cells_below_lru": below}
    if gaps:
        out.update(mean_vs_best_peer=round(statistics.fmean(gaps), 2), worst_vs_best_peer=min(gaps))
    out["all_goals_met"] = (below == 0 and all(c.get("goal_met", False) for c in cells) and
                            (not gaps or statistics.fmean(gaps) >= goals["mean_vs_best_peer"] - 1e-9))
    return out


# ---- the cost beside lru ----

def cost_compare(entries: list[int], rounds: int = 20, puts: int = 1000, gets: int = 5000,
                 rss_entries: int = 60_000) -> dict:
    """lru_lfu beside lru: a cache of each, the same gets and puts on each in
    turn, `rounds` short rounds (a busy machine's swings fall on both alike):
    the medians, each round's ratio (its median), the P99 of the evicting
    puts of all rounds; then the RSS of a fresh process holding
    `rss_entries` slots under each (the median of three)."""
    out: dict = {"rounds": rounds, "sizes": {}}
    for e in entries:
        r = policy_cost_pair(("lru", "lru_lfu"), e, rounds=rounds, gets=gets, puts=puts)
        a, b = r["lru_lfu"], r["lru"]
        out["sizes"][str(e)] = {
            "lru": b, "lru_lfu": a, "hit_x": round(a["hit_x"], 2), "puts_x": round(a["puts_x"], 2),
            "evicting_p99_x": round(a["evicting_p99_us"] / b["evicting_p99_us"], 2)
            if b["evicting_p99_us"] else None}
    rss = {p: statistics.median(policy_rss(p, rss_entries)["rss_bytes"] for _ in range(3))
           for p in ("lru", "lru_lfu")}
    out["rss"] = {"entries": rss_entries, "lru_bytes": rss["lru"], "lru_lfu_bytes": rss["lru_lfu"],
                  "bytes_per_entry_more": round((rss["lru_lfu"] - rss["lru"]) / rss_entries, 1)}
    worst = {k: (max if k != "puts_x" else min)(s[k] for s in out["sizes"].values())
             for k in ("hit_x", "puts_x", "evicting_p99_x")}
    worst["bytes_per_entry_more"] = out["rss"]["bytes_per_entry_more"]
    out["worst"] = worst
    out["goals_met"] = (worst["hit_x"] <= COST_GOALS["hit_x"] and
                        worst["puts_x"] >= COST_GOALS["puts_x"] and
                        worst["evicting_p99_x"] <= COST_GOALS["evicting_p99_x"] and
                        worst["bytes_per_entry_more"] <= COST_GOALS["bytes_per_entry_more"])
    out["goals"] = COST_GOALS
    return out


def print_cost(c: dict) -> None:
    print(f"cost, lru_lfu beside lru ({c['rounds']} alternating rounds; x: the median of the "
          "rounds' ratios):")
    print("entries   ns/hit lru  lru_lfu    x   puts/s lru   lru_lfu    x   evicting P99 us lru  lru_lfu    x")
    for e, r in c["sizes"].items():
        a, b = r["lru_lfu"], r["lru"]
        print(f"{e:>7} {b['ns_per_hit']:>12.0f} {a['ns_per_hit']:>8.0f} {r['hit_x']:>5.2f} "
              f"{b['puts_per_s']:>12.0f} {a['puts_per_s']:>9.0f} {r['puts_x']:>5.2f} "
              f"{b['evicting_p99_us']:>20.1f} {a['evicting_p99_us']:>8.1f} {r['evicting_p99_x']:>5.2f}")
    r = c["rss"]
    print(f"RSS with {r['entries']} slots: lru {r['lru_bytes']}, lru_lfu {r['lru_lfu_bytes']}: "
          f"{r['bytes_per_entry_more']} bytes an entry more; goals met: {c['goals_met']}")


# ---- evict_batch cost ----

def batch_compare(puts: int, batches=(16, 24), rounds: int = 3) -> dict:
    """Alternate the batches `rounds` times (noisy machines); keep the median."""
    runs: dict[int, list[dict]] = {b: [] for b in batches}
    for _ in range(rounds):
        for b in batches:
            runs[b].append(batch_cost(b, puts))
    out = {}
    for b, rs in runs.items():
        rs.sort(key=lambda r: r["ops_per_s"])
        out[str(b)] = rs[len(rs) // 2]
    return out


# ---- the peers against the references ----

def check_peers(streams: dict[str, list[int]], fracs=(0.027, 0.11), n: int = 20_000) -> dict:
    """Each reference beside libCacheSim over the first n accesses of each
    stream at each size: the hits of both, and the first access where they
    part (None: they agree on every access).  SIEVE beside LFU: whether they
    hit alike, and how many laps SIEVE's hand made."""
    classes, lcs = _lcs_classes()
    out: dict = {"accesses": n, "streams": {}, "differs": {}}
    for name, keys in streams.items():
        ids: dict[int, int] = {}
        keys = [ids.setdefault(k, len(ids)) for k in keys[:n]]
        unique = len(ids)
        rows = {}
        for f in fracs:
            cap = max(100, round(unique * f))   # (libCacheSim's S3-FIFO and W-TinyLFU need 100)
            row = {}
            for p in PEERS:
                ref = (refpolicies.S3FIFO(cap, libcachesim=True) if p == "S3-FIFO"
                       else refpolicies.POLICIES[p](cap))
                lib = classes[p](cap, hashpower=max(12, (2 * unique).bit_length()))
                req = lcs.Request()
                req.obj_size = 1
                hr = hl = 0
                first = None
                for i, k in enumerate(keys):
                    req.obj_id = k
                    req.clock_time = i
                    a = ref.access(k)
                    b = lib.get(req)
                    hr += a
                    hl += b
                    if first is None and a != b:
                        first = i
                row[p] = {"ref_pct": round(100.0 * hr / len(keys), 2),
                          "lib_pct": round(100.0 * hl / len(keys), 2), "first_difference": first}
                if first is not None:
                    out["differs"].setdefault(p, []).append(f"{name}@{f:g}")
            paper = refpolicies.S3FIFO(cap)
            row["S3-FIFO"]["paper_pct"] = round(100.0 * sum(paper.access(k) for k in keys) / len(keys), 2)
            sv, lf = refpolicies.SIEVE(cap), refpolicies.LFU(cap)
            same = True
            for k in keys:
                same &= sv.access(k) == lf.access(k)
            row["SIEVE"].update(laps=sv.laps, hits_as_lfu=same)
            rows[f"{f:g}"] = {"blocks": cap, "peers": row}
        out["streams"][name] = rows
    out["reference_peers"] = REFERENCE_PEERS
    return out


def sieve_vs_lfu(keys: list[int], sizes: Iterable[float]) -> dict:
    """SIEVE (reference) beside LFU over a whole stream: hit ratios and laps."""
    ids: dict[int, int] = {}
    keys = [ids.setdefault(k, len(ids)) for k in keys]
    out = {}
    for f in sizes:
        cap = max(1, round(len(ids) * f))
        sv, lf = refpolicies.SIEVE(cap), refpolicies.LFU(cap)
        hs = hl = 0
        for k in keys:
            hs += sv.access(k)
            hl += lf.access(k)
        out[f"{f:g}"] = {"blocks": cap, "sieve_pct": round(100.0 * hs / len(keys), 2),
                         "lfu_pct": round(100.0 * hl / len(keys), 2), "laps": sv.laps}
    return out


# ---- command ----

def cmd_bench_policy(args: argparse.Namespace) -> int:
    sizes = [float(x) for x in args.sizes.split(",") if x.strip()]
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    known = set(PEERS) | {"Belady"}
    bad = [p for p in peers if p not in known]
    if bad:
        print(f"unknown peers: {', '.join(bad)} (known: {', '.join(sorted(known))})",
              file=sys.stderr)
        return 2
    if args.check_peers:
        return cmd_check_peers(args)
    if args.suite:
        return cmd_suite(args, sizes, peers)
    if not args.trace:
        print("bench policy: --trace is required without --suite", file=sys.stderr)
        return 2
    trace = MOONCAKE if args.trace == "mooncake" else args.trace
    try:
        keys = load_trace(trace, args.trace_format, args.trace_column)
    except (OSError, ValueError) as e:
        print(f"bench policy: {trace}: {e}", file=sys.stderr)
        return 2
    out = {"trace": trace, "trace_format": args.trace_format, **hit_ratios(keys, sizes, peers, args.seeds)}
    if not args.no_batch:
        out["evict_batch"] = batch_compare(args.puts)
    if not args.no_cost:
        out["cost"] = cost_compare(_cost_entries(args), args.cost_rounds)
    if args.json:
        print(json.dumps(out))
        return 0
    cols = list(OURS) + ["lru_lfu_batch16"] + peers
    print(f"{out['accesses']} accesses, {out['unique_blocks']} unique blocks, "
          f"ceiling {out['ceiling_pct']}%, {out['seeds']} labelling(s): means")
    print("size   blocks " + " ".join(f"{c:>9}" for c in cols) + "  spread  goal   decided")
    for f, row in out["sizes"].items():
        hr = row["hit_ratio_pct"]
        spread = row.get("spread_pct", {}).get("lru_lfu", 0.0)
        print(f"{f:<6} {row['blocks']:>6} " +
              " ".join(f"{hr.get(c, float('nan')):>9.2f}" for c in cols) +
              f"  {spread:>6.2f}  {str(row.get('goal_met', '-')):<5}  {row['decided']}")
    print(f"mean gap to the best peer {out.get('mean_vs_best_peer', float('nan')):+.2f}, worst "
          f"{out.get('worst_vs_best_peer', float('nan')):+.2f}, cells below LRU "
          f"{out['cells_below_lru']} of {out['cells']}")
    for p in REFERENCE_PEERS:
        print(f"{p}: the reference's figures (libCacheSim's: "
              + ", ".join(f"{r['hit_ratio_pct'].get(lib_name(p), float('nan')):.2f}"
                          for r in out["sizes"].values()) + ")")
    if "evict_batch" in out:
        for b, r in out["evict_batch"].items():
            print(f"evict_batch {b}: {r['ops_per_s']} puts/s, p99 {r['p99_us']} us, "
                  f"evicting p99 {r['evicting_p99_us']} us")
    if "cost" in out:
        print_cost(out["cost"])
    return 0


def _cost_entries(args: argparse.Namespace) -> list[int]:
    return [int(x) for x in args.cost_entries.split(",") if x.strip()]


def cmd_check_peers(args: argparse.Namespace) -> int:
    if not _have_lcs():
        print("bench policy --check-peers needs libcachesim (pip install libcachesim)",
              file=sys.stderr)
        return 2
    streams = {name: workloads.generate(name) for name in ("zipf0.9", "loops", "shifting", "sessions")}
    if args.trace:
        streams["trace"] = load_trace(args.trace, args.trace_format, args.trace_column)
    out = check_peers(streams)
    if args.trace:
        out["sieve_vs_lfu_trace"] = sieve_vs_lfu(streams["trace"], SIZES)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"first {out['accesses']} accesses of each stream; ref / libCacheSim hit ratio, "
          "* where they part (first access)")
    for name, rows in out["streams"].items():
        for f, r in rows.items():
            cells = []
            for p, v in r["peers"].items():
                mark = "" if v["first_difference"] is None else f"*{v['first_difference']}"
                cells.append(f"{p} {v['ref_pct']:.2f}/{v['lib_pct']:.2f}{mark}")
            print(f"{name:10} {f:6} {r['blocks']:>6}  " + "  ".join(cells))
    for p, why in out["reference_peers"].items():
        print(f"{p}: the goal uses the reference: {why}")
    return 0


# ---- the robustness suite ----

def _digest(keys: list[int]) -> str:
    return hashlib.sha1(array.array("Q", keys).tobytes()).hexdigest()[:16]


def run_suite(names: list[str], sizes: list[float], peers: list[str],
              trace: Optional[str] = None, peer_cache: Optional[str] = None,
              seeds: int = 1, trace_format: str = "auto", trace_column: Optional[str] = None) -> dict:
    cache: dict = {}
    if peer_cache and os.path.exists(peer_cache):
        with open(peer_cache) as f:
            cache = json.load(f)
    have_lcs = _have_lcs()
    streams: list[tuple[str, str, object]] = []
    if trace:
        streams.append(("trace", "trace", trace))
    for name in names:
        streams.append((name, workloads.family_of(name), name))
    # held out from the tuning: reported last
    streams.sort(key=lambda s: s[1] in workloads.HELD_OUT_29)
    out: dict = {"sizes": [f"{f:g}" for f in sizes],
                 "held_out_families": sorted(workloads.HELD_OUT_29),
                 "bounds": SUITE_GOALS,
                 "seeds": max(1, seeds),
                 "reference_peers": REFERENCE_PEERS, "workloads": {}}
    t0 = time.monotonic()
    for name, family, src in streams:
        keys = (load_trace(src, trace_format, trace_column) if name == "trace"   # type: ignore[arg-type]
                else workloads.generate(src))                                     # type: ignore[arg-type]
        ids: dict[int, int] = {}
        keys = [ids.setdefault(k, len(ids)) for k in keys]
        n, unique = len(keys), len(ids)
        labelled = _streams_by_seed(keys, seeds)
        bufs = [array.array("Q", k).tobytes() for k in labelled]
        caps = [max(1, round(unique * f)) for f in sizes]
        gots = []
        for k in labelled:
            dig = _digest(k)
            got: dict[int, dict[str, float]] = {}
            if have_lcs:
                runs = [(c, p) for c in caps for p in peers if c >= LIB_MIN_BLOCKS.get(p, 1)]
                want = sorted({c for c, p in runs if f"{dig}/{c}/{p}" not in cache})
                if want:
                    for c, row in lib_peers(k, want, peers).items():
                        for p, v in row.items():
                            cache[f"{dig}/{c}/{p}"] = v
                got = {c: {p: cache[f"{dig}/{c}/{p}"] for cc, p in runs if cc == c} for c in caps}
            gots.append(got)
        table = {}
        for f, cap in zip(sizes, caps):
            table[f"{f:g}"] = cell(bufs, n, cap, peers, [g.get(cap, {}) for g in gots])
        out["workloads"][name] = {
            "family": family, "accesses": n, "unique_blocks": unique,
            "ceiling_pct": round(100.0 * (n - unique) / n, 2) if n else 0.0,
            "held_out": family in workloads.HELD_OUT_29, "sizes": table}
    bad = [(w, f, v["held_out"]) for w, v in out["workloads"].items() for f, r in v["sizes"].items()
           if not r.get("goal_met", False)]
    cells = [r for v in out["workloads"].values() for r in v["sizes"].values()]
    held = [r for v in out["workloads"].values() if v["held_out"] for r in v["sizes"].values()]
    out["summary"] = summarize(cells)
    out["summary_held_out"] = summarize(held) if held else None
    out["all_goals_met"] = out["summary"]["all_goals_met"]
    out["goals_missed"] = [f"{w}@{f}" for w, f, h in bad if not h]
    out["goals_missed_held_out"] = [f"{w}@{f}" for w, f, h in bad if h]
    if not have_lcs:
        out["peers_missing"] = ("libcachesim is not installed (pip install libcachesim): "
                                "only the reference peers (" + ", ".join(REFERENCE_PEERS) + ")")
    out["wall_s"] = round(time.monotonic() - t0, 1)
    if peer_cache and have_lcs:
        with open(peer_cache, "w") as f:
            json.dump(cache, f)
    return out


def cmd_suite(args: argparse.Namespace, sizes: list[float], peers: list[str]) -> int:
    names = workloads.expand([w.strip() for w in args.workloads.split(",") if w.strip()])
    bad = [w for w in names if not workloads.known(w)]
    if bad:
        known = (list(workloads.WORKLOADS) + ["variants"] + list(workloads.VARIANTS) +
                 ["agents"] + list(workloads.AGENTS))
        print(f"unknown workloads: {', '.join(bad)} (known: {', '.join(known)})",
              file=sys.stderr)
        return 2
    trace = MOONCAKE if args.trace == "mooncake" else args.trace
    out = run_suite(names, sizes, peers, trace, args.peer_cache, args.seeds, args.trace_format,
                    args.trace_column)
    if not args.no_cost:
        out["cost"] = cost_compare(_cost_entries(args), args.cost_rounds)
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"means over {out['seeds']} labelling(s) of the keys")
    print("workload          size   ours    LRU  best peer          gap best  gap LRU spread  goal   decided")
    held = False
    for name, w in out["workloads"].items():
        if w["held_out"] and not held:
            held = True
            print("-- held out from the tuning (the agent workloads):")
        for f, r in w["sizes"].items():
            hr = r["hit_ratio_pct"]
            bp = f"{r.get('best_peer', '-')} {r.get('best_peer_pct', float('nan')):.2f}"
            print(f"{name:<17} {f:<6} {hr['lru_lfu']:6.2f} "
                  f"{hr.get('LRU', hr['lru']):6.2f}  {bp:<18} {r.get('vs_best_peer', float('nan')):+7.2f} "
                  f"{r['vs_lru']:+8.2f} {r.get('spread_pct', {}).get('lru_lfu', 0.0):6.2f}  "
                  f"{str(r.get('goal_met', '-')):<5}  {r['decided']}")
    for label, sm in (("all", out["summary"]), ("held out", out["summary_held_out"])):
        if sm:
            print(f"{label}: {sm['cells']} cells, mean gap to the best peer "
                  f"{sm.get('mean_vs_best_peer', float('nan')):+.2f}, worst "
                  f"{sm.get('worst_vs_best_peer', float('nan')):+.2f}, below LRU {sm['cells_below_lru']}")
    print(f"missed: {', '.join(out['goals_missed']) or 'none'}; held out: "
          f"{', '.join(out['goals_missed_held_out']) or 'none'}; {out['wall_s']} s")
    if "cost" in out:
        print_cost(out["cost"])
    return 0
