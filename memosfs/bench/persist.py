"""`memosfs bench persist`: the SSD tier against raw file I/O, and kill -9 cycles.

    memosfs bench persist [--size 256M] [--slot 8M] [--cycles 10] [--repeat 3] [--json]

persist: the SSD tier, in one temporary directory (on the filesystem that
holds $TMPDIR), each figure beside a baseline on the same filesystem:
  - write-back during eviction: --size bytes of --slot slots written through
    a mount of 64M memory (writeback_delay_ms high, so eviction does the
    write-back), a final flush included -> writeback_MBps; the same bytes
    written as files with os.write and an fsync per file -> raw_write_MBps;
  - restart: clean unmount, page cache dropped (drop_caches, else
    posix_fadvise DONTNEED per file), mount with warmup_ratio=1.0 and room
    for all of it: mount_s (until the mountpoint is a mount), first_slot_s
    (from the start of the mount until one slot was opened and read whole;
    first_read_s is the open+read alone), warmup_MBps (the bytes warm-up
    loaded, by the daemon's log line: warmup_done_bytes, over the time from
    the mount until stats.json says warmup_done) against raw_read_MBps (the
    SSD directory's slot files read sequentially after dropping the page
    cache again);
  each of these is the best of --repeat;
  - kill -9 cycles (memosfs/testing/faults.py, as tests/test_faults.py): cycles,
    slots_checked, slots_lost, slots_corrupted.

May call: memosfs.bench.common, memosfs.testing.daemon (mounts kept across a
restart) and memosfs.testing.faults (the kill -9 cycles).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import time

from memosfs.bench.common import MiB, drop_page_cache, files_under, read_file
from memosfs.knobs import parse_size


def add_parsers(bsub) -> None:
    ps = bsub.add_parser("persist", help="SSD tier: write-back, restart and warm-up vs raw "
                         "file I/O, kill -9 cycles")
    ps.add_argument("--size", default="256M", help="bytes written and warmed (default 256M)")
    ps.add_argument("--slot", default="8M", help="bytes per slot (default 8M)")
    ps.add_argument("--cycles", type=int, default=10, help="kill -9 cycles (default 10)")
    ps.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is kept")
    ps.add_argument("--seed", type=int, default=0, help="seed of the kill -9 cycles")
    ps.add_argument("--json", action="store_true", help="print JSON only")
    ps.set_defaults(fn=cmd_bench_persist)


def _write_slot(path: str, block: memoryview, size: int, tag: int, fsync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, tag.to_bytes(8, "little"))        # slots differ from the first byte
        off = 8
        while off < size:
            off += os.write(fd, block[:min(size - off, len(block))])
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def bench_persist(size: int, slot: int, cycles: int, repeat: int = 3, seed: int = 0,
                  progress=None) -> dict[str, object]:
    from memosfs.testing import faults
    from memosfs.testing.daemon import Daemon

    say = progress or (lambda msg: None)
    count = max(1, size // slot)
    total = count * slot
    block = memoryview(os.urandom(MiB))
    buf = bytearray(MiB)
    tmp = tempfile.mkdtemp(prefix="memosfs-bench-persist-")
    ssd = os.path.join(tmp, "ssd")
    daemons: list[Daemon] = []

    def mount(name: str, **opts: object) -> Daemon:
        daemons.append(Daemon(os.path.join(tmp, name), ssd,
                                     os.path.join(tmp, name + ".log"), opts))
        return daemons[-1]

    out: dict[str, object] = {"bench": "persist", "size_bytes": total, "slot_bytes": slot,
                              "slots": count, "repeat": repeat}
    best: dict[str, float] = {}

    def keep(name: str, seconds: float) -> None:
        best[name] = min(best.get(name, float("inf")), seconds)

    try:
        for r in range(repeat):
            # the baseline: files with an fsync each, then the folder's
            say(f"[{r + 1}/{repeat}] raw write: {count} files of {slot} bytes, fsync each")
            raw = os.path.join(tmp, "raw")
            os.mkdir(raw)
            os.sync()                   # start both sides with no dirty pages queued
            t0 = time.perf_counter()
            for i in range(count):
                _write_slot(os.path.join(raw, f"slot{i:04d}"), block, slot, i, fsync=True)
            fd = os.open(raw, os.O_RDONLY | os.O_DIRECTORY)
            os.fsync(fd)
            os.close(fd)
            keep("raw_write", time.perf_counter() - t0)
            shutil.rmtree(raw)

            say(f"[{r + 1}/{repeat}] write-back: the same through a 64M mount, "
                "eviction writing back, a flush at the end")
            shutil.rmtree(ssd, ignore_errors=True)
            m = mount(f"mnt-write{r}", capacity="64M", writeback_delay_ms=3_600_000,
                      warmup_ratio=0)
            sess = os.path.join(m.path, "bench", "persist")
            os.makedirs(sess)
            os.sync()
            t0 = time.perf_counter()
            for i in range(count):
                _write_slot(os.path.join(sess, f"slot{i:04d}"), block, slot, i, fsync=False)
            with open(os.path.join(m.path, ".memos", "cache", "flush"), "w") as f:
                f.write("1")
            keep("writeback", time.perf_counter() - t0)
            st = m.stats()
            m.stop()
            if m.proc.returncode != 0:
                raise RuntimeError(f"memosfs exited {m.proc.returncode} (see {m.log})")

        files = files_under(os.path.join(ssd, "slots"))
        loaded = planned = warmed = 0
        for r in range(repeat):
            say(f"[{r + 1}/{repeat}] restart: mount, first slot, warm-up")
            out["cache_drop"] = drop_page_cache(files)
            m = mount(f"mnt-restart{r}", capacity=total + 128 * MiB, warmup_ratio=1.0)
            keep("mount", m.t_mounted - m.t_start)
            t1 = time.perf_counter()
            _t, n = read_file(os.path.join(m.path, "bench", "persist", "slot0000"), buf)
            keep("first_read", time.perf_counter() - t1)
            keep("first_slot", time.perf_counter() - m.t_start)
            if n != slot:
                raise RuntimeError(f"first slot: {n} of {slot} bytes")
            while True:
                ws = m.stats()
                if ws.get("warmup_done"):
                    break
                if time.perf_counter() - m.t_mounted > 600:
                    raise RuntimeError("warm-up did not finish in 10 minutes")
                time.sleep(0.005)
            warmup_s = time.perf_counter() - m.t_mounted
            m.stop()
            if "warmup" not in best or warmup_s < best["warmup"]:
                loaded, planned = int(ws["warmup_loaded_bytes"]), int(ws["warmup_total_bytes"])
                # the daemon's own count: stats.json leaves out slots a reader
                # had promoted before warm-up reached them
                done = re.findall(r"warm-up done: (\d+) of (\d+) bytes", m.logtext())
                warmed = int(done[-1][0]) if done else loaded
            keep("warmup", warmup_s)

            say(f"[{r + 1}/{repeat}] raw read of the SSD folder's files")
            drop_page_cache(files)
            t0 = time.perf_counter()
            raw_bytes = 0
            for p in files:
                raw_bytes += read_file(p, buf)[1]
            keep("raw_read", time.perf_counter() - t0)

        say(f"kill -9: {cycles} cycles")
        rep = faults.run_cycles(os.path.join(tmp, "faults"), cycles, seed=seed,
                                progress=say)
        for k in ("cycles", "slots_checked", "slots_lost", "slots_corrupted"):
            out[k] = rep.summary()[k]
        raw_read_MBps = raw_bytes / 1e6 / best["raw_read"]
        warmup_MBps = warmed / 1e6 / best["warmup"]
        out |= {
            "writeback_MBps": round(total / 1e6 / best["writeback"], 1),
            "raw_write_MBps": round(total / 1e6 / best["raw_write"], 1),
            "writeback_ratio": round(best["raw_write"] / best["writeback"], 3),
            "evict_writebacks": int(st.get("evict_writebacks", 0)),
            "flush_writebacks": int(st.get("writebacks", 0) - st.get("evict_writebacks", 0)),
            "mount_s": round(best["mount"], 3),
            "first_slot_s": round(best["first_slot"], 3),
            "first_read_s": round(best["first_read"], 4),
            "warmup_loaded_bytes": loaded,
            "warmup_total_bytes": planned,
            "warmup_done_bytes": warmed,
            "warmup_s": round(best["warmup"], 3),
            "warmup_MBps": round(warmup_MBps, 1),
            "raw_read_MBps": round(raw_read_MBps, 1),
            "warmup_ratio": round(warmup_MBps / raw_read_MBps, 3),
            "kill_writes": rep.writes,
            "kill_fsyncs_acked": rep.acked,
            "kills_stuck": rep.kills_stuck,
            "kill_problems": (rep.problems + rep.stuck)[:20],
        }
        return out
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def cmd_bench_persist(args: argparse.Namespace) -> int:
    size, slot = parse_size(args.size), parse_size(args.slot)
    if size <= 0 or slot < 64 or slot > size or args.cycles < 0 or args.repeat < 1:
        print("memosfs bench persist: need 64 <= slot <= size, cycles >= 0, repeat >= 1",
              file=sys.stderr)
        return 2
    say = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    result = bench_persist(size, slot, args.cycles, args.repeat, args.seed, progress=say)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0 if not (result["slots_lost"] or result["slots_corrupted"]) else 1
