"""`memosfs bench ...`: measurements that print one JSON object, always side by
side with a baseline measured in the same run (these machines are noisy).

    memosfs bench io [--size 256M] [--small 2000] [--repeat 3] [--json]

io: a fresh mount and a tmpfs directory; write one large slot in 1 MiB
writes (close included: that is the publish), read it back (the first read
after the write, then a re-read, then a "cold" read after dropping the
file's pages with posix_fadvise, which on memosfs goes through the daemon),
and a stream of 4 KiB files written and read back one open/read/close each.
Each figure is the best of --repeat.

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
  - kill -9 cycles (memosfs/faults.py, as tests/test_faults.py): cycles,
    slots_checked, slots_lost, slots_corrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Iterator

from memosfs.knobs import parse_size

MiB = 1 << 20


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="benchmarks (JSON, with a baseline in the same run)")
    bsub = b.add_subparsers(dest="bench_cmd", required=True)
    io = bsub.add_parser("io", help="large-slot and 4 KiB-file throughput vs tmpfs")
    io.add_argument("--size", default="256M", help="bytes of the large slot (default 256M)")
    io.add_argument("--small", type=int, default=2000, help="number of 4 KiB files")
    io.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is kept")
    io.add_argument("--opts", default="", help="extra mount options for memosfs")
    io.add_argument("--json", action="store_true", help="print JSON only")
    io.set_defaults(fn=cmd_bench_io)
    ps = bsub.add_parser("persist", help="SSD tier: write-back, restart and warm-up vs raw "
                         "file I/O, kill -9 cycles")
    ps.add_argument("--size", default="256M", help="bytes written and warmed (default 256M)")
    ps.add_argument("--slot", default="8M", help="bytes per slot (default 8M)")
    ps.add_argument("--cycles", type=int, default=10, help="kill -9 cycles (default 10)")
    ps.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is kept")
    ps.add_argument("--seed", type=int, default=0, help="seed of the kill -9 cycles")
    ps.add_argument("--json", action="store_true", help="print JSON only")
    ps.set_defaults(fn=cmd_bench_persist)
    from memosfs.bench import policy as bench_policy; bench_policy.add_parsers(bsub)
    from memosfs.bench import native as bench_native; bench_native.add_parsers(bsub)
    from memosfs.bench import kv as bench_kv; bench_kv.add_parsers(bsub)
    from memosfs.bench import coherence as bench_coherence; bench_coherence.add_parsers(bsub)
    from memosfs.bench import prefetch as bench_prefetch; bench_prefetch.add_parsers(bsub)
    from memosfs.bench import remote as bench_remote; bench_remote.add_parsers(bsub)
    try:                                # numpy (the `federated` extra) is optional
        from memosfs.bench import federated as bench_federated; bench_federated.add_parsers(bsub)
    except ImportError:
        pass


def _mounted(path: str) -> bool:
    p = os.path.realpath(path)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == p for line in f)


@contextlib.contextmanager
def memos_mount(capacity: int, opts: str = "") -> Iterator[str]:
    """A fresh memosfs in a temporary directory, unmounted on exit."""
    tmp = tempfile.mkdtemp(prefix="memosfs-bench-")
    mnt = os.path.join(tmp, "mnt")
    os.mkdir(mnt)
    options = f"capacity={capacity},ssd={tmp}/ssd,log={tmp}/log"
    if opts:
        options += "," + opts
    proc = subprocess.Popen([sys.executable, "-m", "memosfs", "memos", mnt, "-f",
                             "-o", options], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not _mounted(mnt):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"memosfs did not mount (see {tmp}/log)")
            time.sleep(0.05)
        yield mnt
    finally:
        if _mounted(mnt):
            subprocess.run(["fusermount3", "-u", "-z", mnt], stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def tmpfs_dir() -> Iterator[str]:
    """A directory on tmpfs: /dev/shm when it is tmpfs, else a tmpfs we mount."""
    with open("/proc/mounts") as f:
        shm = any(line.split()[1] == "/dev/shm" and line.split()[2] == "tmpfs" for line in f)
    if shm:
        d = tempfile.mkdtemp(prefix="memosfs-bench-", dir="/dev/shm")
        try:
            yield d
        finally:
            shutil.rmtree(d, ignore_errors=True)
        return
    d = tempfile.mkdtemp(prefix="memosfs-bench-tmpfs-")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2g", "tmpfs", d], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", d])
        os.rmdir(d)


def _write_file(path: str, block: memoryview, size: int) -> float:
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = size
        while left:
            left -= os.write(fd, block[:min(left, len(block))])
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def _read_file(path: str, buf: bytearray) -> tuple[float, int]:
    view = memoryview(buf)
    t0 = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    total = 0
    try:
        while n := os.readv(fd, [view]):
            total += n
    finally:
        os.close(fd)
    return time.perf_counter() - t0, total


def _drop_cached_pages(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _large(d: str, size: int, repeat: int) -> dict[str, float]:
    """write; read back; read again; read after dropping the page cache
    (on memosfs that is the daemon's read path; tmpfs keeps its pages)."""
    block = memoryview(os.urandom(MiB))
    buf = bytearray(MiB)
    best = {"write": float("inf"), "read": float("inf"), "reread": float("inf"),
            "cold": float("inf")}
    for i in range(repeat):
        path = os.path.join(d, f"large{i}")
        best["write"] = min(best["write"], _write_file(path, block, size))
        for kind in ("read", "reread", "cold"):
            if kind == "cold":
                _drop_cached_pages(path)
            t, n = _read_file(path, buf)
            if n != size:
                raise RuntimeError(f"read back {n} of {size} bytes from {path}")
            best[kind] = min(best[kind], t)
        os.unlink(path)
    mb = size / 1e6
    return {f"{k}_MBps": mb / t for k, t in best.items()}


def _small(d: str, count: int, repeat: int) -> dict[str, float]:
    data = os.urandom(4096)
    buf = bytearray(8192)
    best_w = best_r = float("inf")
    for i in range(repeat):
        paths = [os.path.join(d, f"small{i}-{j}") for j in range(count)]
        t0 = time.perf_counter()
        for p in paths:
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, data)
            os.close(fd)
        best_w = min(best_w, time.perf_counter() - t0)
        t0 = time.perf_counter()
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            os.readv(fd, [buf])
            os.close(fd)
        best_r = min(best_r, time.perf_counter() - t0)
        for p in paths:
            os.unlink(p)
    return {"small_write_ops": count / best_w, "small_read_ops": count / best_r}


def bench_io(size: int, small: int, repeat: int, opts: str = "") -> dict[str, object]:
    capacity = max(2 * size + 64 * MiB, 256 * MiB)
    with memos_mount(capacity, opts) as mnt:
        sess = os.path.join(mnt, "bench", "io")
        os.makedirs(sess)
        ours = _large(sess, size, repeat) | _small(sess, small, repeat)
    with tmpfs_dir() as d:
        base = _large(d, size, repeat) | _small(d, small, repeat)
    out: dict[str, object] = {
        "bench": "io",
        "size_bytes": size,
        "small_files": small,
        "repeat": repeat,
        "read_MBps": round(ours["read_MBps"], 1),
        "write_MBps": round(ours["write_MBps"], 1),
        "reread_MBps": round(ours["reread_MBps"], 1),
        "tmpfs_read_MBps": round(base["read_MBps"], 1),
        "tmpfs_write_MBps": round(base["write_MBps"], 1),
        "tmpfs_reread_MBps": round(base["reread_MBps"], 1),
        "read_ratio": round(ours["read_MBps"] / base["read_MBps"], 3),
        "write_ratio": round(ours["write_MBps"] / base["write_MBps"], 3),
        "reread_ratio": round(ours["reread_MBps"] / base["reread_MBps"], 3),
        "cold_read_MBps": round(ours["cold_MBps"], 1),
        "cold_read_ratio": round(ours["cold_MBps"] / base["read_MBps"], 3),
        "small_read_ops": round(ours["small_read_ops"]),
        "small_write_ops": round(ours["small_write_ops"]),
        "tmpfs_small_read_ops": round(base["small_read_ops"]),
        "tmpfs_small_write_ops": round(base["small_write_ops"]),
    }
    return out


def cmd_bench_io(args: argparse.Namespace) -> int:
    size = parse_size(args.size)
    if size <= 0 or args.small < 0 or args.repeat < 1:
        print("memosfs bench io: size, small and repeat must be positive", file=sys.stderr)
        return 2
    result = bench_io(size, args.small, args.repeat, args.opts)
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    return 0


# ---------------------------------------------------------------- persist

def drop_page_cache(paths: list[str]) -> str:
    """Drop the page cache: all of it if /proc/sys/vm/drop_caches is
    writable, else the pages of `paths`.  Returns the way it went."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        for p in paths:
            try:
                _drop_cached_pages(p)
            except OSError:
                pass
        return "fadvise"


def _files_under(d: str) -> list[str]:
    out = []
    for root, _dirs, files in os.walk(d):
        out += [os.path.join(root, f) for f in files]
    return sorted(out)


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

    say = progress or (lambda msg: None)
    count = max(1, size // slot)
    total = count * slot
    block = memoryview(os.urandom(MiB))
    buf = bytearray(MiB)
    tmp = tempfile.mkdtemp(prefix="memosfs-bench-persist-")
    ssd = os.path.join(tmp, "ssd")
    daemons: list[faults.Daemon] = []

    def mount(name: str, **opts: object) -> faults.Daemon:
        daemons.append(faults.Daemon(os.path.join(tmp, name), ssd,
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

        files = _files_under(os.path.join(ssd, "slots"))
        loaded = planned = warmed = 0
        for r in range(repeat):
            say(f"[{r + 1}/{repeat}] restart: mount, first slot, warm-up")
            out["cache_drop"] = drop_page_cache(files)
            m = mount(f"mnt-restart{r}", capacity=total + 128 * MiB, warmup_ratio=1.0)
            keep("mount", m.t_mounted - m.t_start)
            t1 = time.perf_counter()
            _t, n = _read_file(os.path.join(m.path, "bench", "persist", "slot0000"), buf)
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
                raw_bytes += _read_file(p, buf)[1]
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
