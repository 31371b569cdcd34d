"""`memosfs bench io`: FUSE throughput against tmpfs, in the same run.

    memosfs bench io [--size 256M] [--small 2000] [--repeat 3] [--json]

io: a fresh mount and a tmpfs directory; write one large slot in 1 MiB
writes (close included: that is the publish), read it back (the first read
after the write, then a re-read, then a "cold" read after dropping the
file's pages with posix_fadvise, which on memosfs goes through the daemon),
and a stream of 4 KiB files written and read back one open/read/close each.
Each figure is the best of --repeat.

May call: memosfs.bench.common (the mount, the tmpfs folder, timed file I/O).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from memosfs.bench.common import (MiB, drop_cached_pages, memos_mount, read_file, tmpfs_dir,
                                  write_file)
from memosfs.knobs import parse_size


def add_parsers(bsub) -> None:
    io = bsub.add_parser("io", help="large-slot and 4 KiB-file throughput vs tmpfs")
    io.add_argument("--size", default="256M", help="bytes of the large slot (default 256M)")
    io.add_argument("--small", type=int, default=2000, help="number of 4 KiB files")
    io.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is kept")
    io.add_argument("--opts", default="", help="extra mount options for memosfs")
    io.add_argument("--json", action="store_true", help="print JSON only")
    io.set_defaults(fn=cmd_bench_io)


def _large(d: str, size: int, repeat: int) -> dict[str, float]:
    """write; read back; read again; read after dropping the page cache
    (on memosfs that is the daemon's read path; tmpfs keeps its pages)."""
    block = memoryview(os.urandom(MiB))
    buf = bytearray(MiB)
    best = {"write": float("inf"), "read": float("inf"), "reread": float("inf"),
            "cold": float("inf")}
    for i in range(repeat):
        path = os.path.join(d, f"large{i}")
        best["write"] = min(best["write"], write_file(path, block, size))
        for kind in ("read", "reread", "cold"):
            if kind == "cold":
                drop_cached_pages(path)
            t, n = read_file(path, buf)
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
