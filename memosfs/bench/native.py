"""`memosfs bench index` and `memosfs bench alloc`: the C core's index and
arena beside their peers, measured by the compiled harness in native/bench/
(built with `make -C native bench`; the peers — libcuckoo, Abseil, jemalloc —
live in the harness only, never in the product).

    memosfs bench index [--repeat 3] [--lookups N] [--large-buckets N] [--json]

index: per table (small: fits in cache; large: far larger than L3), per load
(0.5, 0.9, 0.95) and per kind (positive, negative, dependent lookups), ns per
lookup of memosfs's cuckoo index, libcuckoo and absl::flat_hash_map in the
same run, the pointer chase over memory the size of the table (the DRAM
floor), and the maximum load the index reaches before its first failed
insert.  Each figure is the median of --repeat runs, with min and max.

    memosfs bench alloc [--repeat 3] [--ops N] [--touch] [--json]

alloc: ns per 4 KiB page alloc+free under random churn with 512 MiB live:
the arena, glibc malloc, and jemalloc (LD_PRELOAD of Debian's libjemalloc2),
the runs interleaved; each churn step frees --batch random live pages and
then allocates as many; the arena's fragmentation after the churn and the
pause of its sweeps; malloc's RSS over the live bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

NATIVE = Path(__file__).resolve().parents[2] / "native"     # the checkout's native/
JEMALLOC = ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2",
            "/usr/lib64/libjemalloc.so.2")


def add_parsers(bsub) -> None:
    ix = bsub.add_parser("index", help="cuckoo index vs libcuckoo and absl (ns per lookup)")
    ix.add_argument("--repeat", type=int, default=3, help="runs; figures are medians")
    ix.add_argument("--lookups", type=int, default=1000000, help="lookups per figure")
    ix.add_argument("--small-buckets", type=int, default=1024,
                    help="buckets of the cache-resident table (64 B each)")
    ix.add_argument("--large-buckets", type=int, default=1 << 21,
                    help="buckets of the DRAM-resident table (default 2M = 128 MiB)")
    ix.add_argument("--json", action="store_true", help="print JSON only")
    ix.set_defaults(fn=cmd_bench_index)
    al = bsub.add_parser("alloc", help="arena vs glibc malloc and jemalloc (4 KiB churn)")
    al.add_argument("--repeat", type=int, default=3, help="runs; figures are medians")
    al.add_argument("--ops", type=int, default=4000000, help="alloc+free pairs per run")
    al.add_argument("--live-mib", type=int, default=512, help="live memory (default 512)")
    al.add_argument("--capacity-mib", type=int, default=1024, help="arena capacity")
    al.add_argument("--batch", type=int, default=256,
                    help="pages freed, then allocated, per churn step (1: free one, "
                         "allocate one at once)")
    al.add_argument("--touch", action="store_true", help="write a byte into each new page")
    al.add_argument("--json", action="store_true", help="print JSON only")
    al.set_defaults(fn=cmd_bench_alloc)


def _harness(name: str) -> Path:
    """Build native/build/bench/<name> if needed and return its path."""
    if not (NATIVE / "Makefile").exists():
        raise SystemExit(f"memosfs bench: {NATIVE} not found (a source checkout is needed)")
    r = subprocess.run(["make", "-s", "-C", str(NATIVE), f"build/bench/{name}"],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise SystemExit(f"memosfs bench: building the harness failed "
                         f"(make -C native bench; apt packages libcuckoo-dev libabsl-dev "
                         f"libjemalloc2):\n{r.stdout}")
    return NATIVE / "build" / "bench" / name


def _run(cmd: list[str], env: dict | None = None) -> dict:
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       env=env)
    if r.returncode != 0:
        raise SystemExit(f"memosfs bench: {' '.join(cmd)} failed:\n{r.stderr}")
    return json.loads(r.stdout)


def _summary(values: list[float]) -> dict:
    return {"ns": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2), "runs": [round(v, 2) for v in values]}


def _merge(runs: list, leaf=lambda v: isinstance(v, (int, float))):
    """Merge structurally equal JSON trees: {"ns": x} leaves become summaries."""
    first = runs[0]
    if isinstance(first, dict):
        if set(first) == {"ns"}:
            return _summary([r["ns"] for r in runs])
        return {k: _merge([r[k] for r in runs]) for k in first}
    if isinstance(first, float):
        return round(statistics.median(runs), 4)
    return first


def _ratios(index: dict) -> dict:
    """memos / peer for every table, load and kind (< 1: memos is faster)."""
    out = {}
    for tname, t in index["tables"].items():
        for load, row in t["loads"].items():
            for kind in ("positive", "negative", "dependent"):
                m = row["memos"][kind]["ns"]
                key = f"{tname}/{load}/{kind}"
                out[key] = {peer: round(m / row[peer][kind]["ns"], 3)
                            for peer in ("libcuckoo", "absl") if row[peer][kind]["ns"]}
            out[f"{tname}/{load}/dependent"]["pointer_chase"] = round(
                row["memos"]["dependent"]["ns"] / t["pointer_chase"]["ns"], 3)
    return out


def cmd_bench_index(args: argparse.Namespace) -> int:
    exe = _harness("index_bench")
    cmd = [str(exe), "--lookups", str(args.lookups), "--small-buckets", str(args.small_buckets),
           "--large-buckets", str(args.large_buckets)]
    runs = [_run(cmd) for _ in range(max(1, args.repeat))]
    result = _merge(runs)
    result["repeat"] = len(runs)
    result["max_load"] = {t: v["max_load"] for t, v in result["tables"].items()}
    result["ratios"] = _ratios(result)
    result["loadavg"] = os.getloadavg()[0]
    _print(result, args.json)
    return 0


def cmd_bench_alloc(args: argparse.Namespace) -> int:
    exe = _harness("alloc_bench")
    live = str(args.live_mib * 256)
    base = [str(exe), "--live", live, "--ops", str(args.ops), "--batch", str(args.batch)] + \
        (["--touch"] if args.touch else [])
    jem = next((p for p in JEMALLOC if os.path.exists(p)), None)
    per: dict[str, list[dict]] = {"arena": [], "glibc": []}
    if jem:
        per["jemalloc"] = []
    for _ in range(max(1, args.repeat)):     # interleaved: noise hits all alike
        per["arena"].append(_run(base + ["--mode", "arena", "--capacity-mib",
                                         str(args.capacity_mib)]))
        per["glibc"].append(_run(base + ["--mode", "malloc"]))
        if jem:
            per["jemalloc"].append(_run(base + ["--mode", "malloc"],
                                        env={**os.environ, "LD_PRELOAD": jem}))
    result: dict = {"bench": "alloc", "live_mib": args.live_mib, "ops": args.ops,
                    "batch": args.batch, "touch": args.touch, "repeat": max(1, args.repeat)}
    for name, runs in per.items():
        row = {"ns": _summary([r["ns"] for r in runs])["ns"],
               "spread": _summary([r["ns"] for r in runs])}
        for k, v in runs[0].items():
            if k not in ("ns", "mode", "ops", "touch", "live_pages") and isinstance(v, (int, float)) \
                    and not isinstance(v, bool):
                row[k] = round(statistics.median(r[k] for r in runs), 4)
        result[name] = row
    if not jem:
        result["jemalloc"] = None
        print("memosfs bench: libjemalloc.so.2 not found (apt-get install libjemalloc2)",
              file=sys.stderr)
    a = result["arena"]["ns"]
    result["ratios"] = {peer: round(a / result[peer]["ns"], 3)
                        for peer in ("glibc", "jemalloc") if result.get(peer)}
    result["loadavg"] = os.getloadavg()[0]
    _print(result, args.json)
    return 0


def _print(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
