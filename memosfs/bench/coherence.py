"""`memosfs bench coherence`: agents sharing slots, under each coherence
protocol and under the traditional lock scheme, in one run.

N agent processes (each its own agent: `agent_identity=pid`) work on one
mount for a fixed time on a shared set of slots, choosing a slot with a Zipf
skew; 90% of operations read a whole slot (open, read, close) and 10% rewrite
it (open O_TRUNC, write, close).  The modes:

  protocol0     no coherence tracking (last publish wins)
  protocol1     batched invalidation (the default)
  protocol2     strong: writers wait for acknowledgements, readers for writers
  lock_slot     protocol 0, every access under flock(LOCK_EX) of the slot's lock file
  lock_global   protocol 0, every access under flock(LOCK_EX) of one lock file

Reported per mode: total ops/s, mean and P99 latency (all, reads, writes),
failed opens (protocol 2 timeouts), and the directory's counters.  The lock
files live on tmpfs beside the mount, so the lock itself costs a local syscall.

May call: memosfs.bench.common (the mount, the tmpfs folder, knobs, stats),
memosfs.client.shared (in the agent processes).
"""

from __future__ import annotations

import argparse
import bisect
import errno
import fcntl
import json
import multiprocessing as mp
import os
import random
import statistics
import time
from typing import Optional

from memosfs.bench.common import memos_mount, percentile, set_knob, stats, tmpfs_dir
from memosfs.knobs import parse_size

MODES = ("protocol0", "protocol1", "protocol2", "lock_slot", "lock_global")


def add_parsers(bsub) -> None:
    p = bsub.add_parser("coherence", help="agents sharing slots: protocols 0/1/2 vs a "
                        "lock around every access")
    p.add_argument("--agents", type=int, default=8, help="agent processes (default 8)")
    p.add_argument("--slots", type=int, default=32, help="shared slots (default 32)")
    p.add_argument("--slot-size", default="64K", help="bytes per slot (default 64K)")
    p.add_argument("--seconds", type=float, default=5.0, help="per mode (default 5)")
    p.add_argument("--write-ratio", type=float, default=0.1, help="default 0.1")
    p.add_argument("--zipf", type=float, default=1.1, help="key skew exponent (default 1.1)")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--opts", default="", help="extra mount options for memosfs")
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.set_defaults(fn=cmd_bench_coherence)


def _agent(idx: int, slots: list[str], locks: list[str], glock: str, mode: str,
           size: int, write_ratio: float, cum: list[float], start_at: float,
           seconds: float, seed: int, out) -> None:
    """One agent process: the workload until the time is up; results to `out`.

    Under protocols 1 and 2 an agent works as a coherent cache's client does
    (memosfs.shared.SharedSlots): it keeps a slot it has read open (its Shared
    copy, served from the kernel page cache) and re-reads it with pread; a
    watcher thread closes the handle as soon as it reports POLLPRI, which
    acknowledges the invalidation, and the next read opens the new version.  Under protocol 0 and the lock schemes
    nothing tells an agent that its copy is stale, so every read opens the
    slot anew."""
    from memosfs.client.shared import SharedSlots
    rng = random.Random(seed * 1000 + idx)
    payload = bytes([65 + idx]) * size
    buf = bytearray(size + 1)
    reads: list[float] = []
    writes: list[float] = []
    failed = 0
    errors: dict[str, int] = {}
    torn = 0
    cache = SharedSlots() if mode in ("protocol1", "protocol2") else None
    while time.time() < start_at:
        time.sleep(0.001)
    end = start_at + seconds
    while True:
        now = time.perf_counter()
        if time.time() >= end:
            break
        k = bisect.bisect_left(cum, rng.random() * cum[-1])
        path = slots[k]
        write = rng.random() < write_ratio
        lockfd: Optional[int] = None
        if mode == "lock_slot":
            lockfd = os.open(locks[k], os.O_RDWR)
        elif mode == "lock_global":
            lockfd = os.open(glock, os.O_RDWR)
        try:
            if lockfd is not None:
                fcntl.flock(lockfd, fcntl.LOCK_EX)
            if write:
                if cache is not None:
                    cache.forget(path)        # our copy is about to be old
                fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
                try:
                    os.write(fd, payload)
                finally:
                    os.close(fd)
            elif cache is not None:
                n = cache.readinto(path, buf)
            else:
                fd = os.open(path, os.O_RDONLY)
                try:
                    n = os.readv(fd, [buf])
                finally:
                    os.close(fd)
            # a slot is always one agent's whole payload
            if not write and (n != size or buf[0:1] * n != bytes(buf[:n])):
                torn += 1
        except OSError as e:
            failed += 1
            name = ("write " if write else "read ") + errno.errorcode.get(e.errno, str(e.errno))
            errors[name] = errors.get(name, 0) + 1
        finally:
            if lockfd is not None:
                os.close(lockfd)            # also drops the lock
        (writes if write else reads).append(time.perf_counter() - now)
    if cache is not None:
        cache.close()
    out.put({"reads": reads, "writes": writes, "failed": failed, "torn": torn,
             "errors": errors})


def run_mode(mnt: str, lockdir: str, mode: str, agents: int, nslots: int, size: int,
             seconds: float, write_ratio: float, zipf: float, seed: int) -> dict:
    proto = {"protocol1": 1, "protocol2": 2}.get(mode, 0)
    set_knob(mnt, "coherence_protocol", proto)
    sess = os.path.join(mnt, "shared", mode)
    os.makedirs(sess, exist_ok=True)
    slots, locks = [], []
    for i in range(nslots):
        p = os.path.join(sess, f"slot{i:03d}")
        with open(p, "wb") as f:
            f.write(bytes([65]) * size)
        slots.append(p)
        lp = os.path.join(lockdir, f"{mode}-{i:03d}.lock")
        open(lp, "w").close()
        locks.append(lp)
    glock = os.path.join(lockdir, f"{mode}-global.lock")
    open(glock, "w").close()
    weights = [1.0 / (i + 1) ** zipf for i in range(nslots)]
    cum = []
    acc = 0.0
    for w in weights:
        acc += w
        cum.append(acc)
    before = stats(mnt)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    start_at = time.time() + 0.5
    procs = [ctx.Process(target=_agent, args=(i, slots, locks, glock, mode, size,
                                                write_ratio, cum, start_at, seconds,
                                                seed, q)) for i in range(agents)]
    for p in procs:
        p.start()
    results = [q.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    after = stats(mnt)
    reads = [x for r in results for x in r["reads"]]
    writes = [x for r in results for x in r["writes"]]
    both = reads + writes
    ops = len(both)
    delta = {k: after[k] - before.get(k, 0) for k in (
        "coherence_invalidations", "coherence_acks", "coherence_pending_waits",
        "coherence_read_waits", "coherence_timeouts", "coherence_downgrades",
        "read_requests", "lookups") if k in after}
    return {
        "ops": ops,
        "ops_per_s": round(ops / seconds, 1),
        "reads": len(reads),
        "writes": len(writes),
        "failed": sum(r["failed"] for r in results),
        "errors": {k: sum(r["errors"].get(k, 0) for r in results)
                   for k in sorted({k for r in results for k in r["errors"]})},
        "torn_reads": sum(r["torn"] for r in results),
        "mean_ms": round(statistics.fmean(both) * 1e3, 3) if both else 0.0,
        "p99_ms": round(percentile(both, 0.99) * 1e3, 3),
        "read_p99_ms": round(percentile(reads, 0.99) * 1e3, 3),
        "write_p99_ms": round(percentile(writes, 0.99) * 1e3, 3),
        "counters": delta,
    }


def bench_coherence(agents: int = 8, nslots: int = 32, size: int = 64 << 10,
                    seconds: float = 5.0, write_ratio: float = 0.1, zipf: float = 1.1,
                    modes: tuple[str, ...] = MODES, seed: int = 1, opts: str = "") -> dict:
    out: dict[str, object] = {
        "benchmark": "coherence", "agents": agents, "slots": nslots, "slot_bytes": size,
        "seconds": seconds, "write_ratio": write_ratio, "zipf": zipf,
        "cpus": os.cpu_count(), "modes": {}}
    capacity = max(256 << 20, 4 * nslots * size * len(modes))
    # (a write-through mount: protocol 2 needs writeback_cache=0, and every
    # mode is measured on the same mount)
    options = "agent_identity=pid,coherence_timeout_ms=5000" + (
        ",writeback_cache=0" if "protocol2" in modes and "writeback_cache" not in opts
        else "") + (f",{opts}" if opts else "")
    out["opts"] = options
    with memos_mount(capacity, options) as mnt, \
            tmpfs_dir() as lockdir:
        for mode in modes:
            out["modes"][mode] = run_mode(mnt, lockdir, mode, agents, nslots, size,
                                          seconds, write_ratio, zipf, seed)
    m = out["modes"]
    ratios = {}
    for base in ("lock_slot", "lock_global"):
        if base in m and m[base]["ops_per_s"]:
            for mode in ("protocol0", "protocol1", "protocol2"):
                if mode in m:
                    ratios[f"{mode}_vs_{base}"] = round(
                        m[mode]["ops_per_s"] / m[base]["ops_per_s"], 2)
    out["ratios"] = ratios
    return out


def cmd_bench_coherence(args: argparse.Namespace) -> int:
    modes = tuple(x for x in args.modes.split(",") if x)
    bad = [x for x in modes if x not in MODES]
    if bad:
        raise SystemExit(f"unknown mode(s): {', '.join(bad)} (choose from {', '.join(MODES)})")
    res = bench_coherence(args.agents, args.slots, parse_size(args.slot_size), args.seconds,
                          args.write_ratio, args.zipf, modes, args.seed, args.opts)
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"{res['agents']} agents, {res['slots']} slots of {res['slot_bytes']} B, "
          f"{res['write_ratio']:.0%} writes, {res['seconds']} s per mode")
    for mode, r in res["modes"].items():
        print(f"  {mode:12s} {r['ops_per_s']:>9.1f} ops/s  mean {r['mean_ms']:.3f} ms  "
              f"P99 {r['p99_ms']:.3f} ms  failed {r['failed']}  torn {r['torn_reads']}")
    for k, v in res["ratios"].items():
        print(f"  {k}: {v}x")
    return 0
