"""`memosfs bench clients`: what the usual client calls cost on memosfs, beside
tmpfs and the local disk, with the same bytes, in one run.

    memosfs bench clients [--repeat 3] [--scale 1.0] [--only a,b] [--json]
                          [--with-persist-coherence] [--profile]

Three targets: a fresh memosfs mount (default options, capacity 1G or more),
beside it a second one with the kernel's writeback cache (`memosfs_wbc`),
a folder on tmpfs (/dev/shm) and a folder on the local disk (under /var/tmp;
its filesystem type is in the JSON).  Times are the client's own calls, open
to close; no fsync is added (on disk the bytes may still be in the page
cache when the clock stops, as they are for the client).  The patterns
(sizes at --scale 1):

  write_4k      a 32 MiB file written with 4 KiB os.write()s, then closed
  write_64k     the same with 64 KiB writes
  write_1m      the same with 1 MiB writes
  safetensors   safetensors.torch.save_file of 30 tensors of 2 MB (float16),
                one per file (the vLLM connector's pattern); load_file of the
                30 files right after (load_warm) and after dropping their
                pages (load_cold)
  torch         torch.save of a dict of 25 tensors of 4 MB; torch.load, warm
                and cold
  pickle        pickle.dump of a dict of 100 bytes objects of 1 MB; pickle.load,
                warm and cold
  small         2,000 files of 4 KiB: create+write+close, then open+read+close
  slot          a 256 MiB slot read cold by 1 reader, then by 4 threads each
                reading a quarter (pread, 1 MiB at a time)
  persist       (with --with-persist-coherence) `bench persist`'s write-back
                during eviction vs raw write+fsync (and its restart figures),
                256M in 8M slots (96M at least, more than its 64M mount), no
                kill -9 cycles
  coherence     (with --with-persist-coherence) `bench coherence --agents 8`
                at 10% and at 1% writes, 5 s per mode (1 s at least)

--profile adds, per pattern and memosfs column, what the daemon saw while the
pattern ran (all repeats): the requests the kernel sent, requests per MB
moved, write requests per MB, and the daemon's CPU per request and per MB
(its stats `requests`, `write_requests`, `cpu_ms`; the stats reads themselves
subtracted).

"Cold" drops the files' pages with posix_fadvise(DONTNEED) first (on disk
after an fsync, so the pages are clean and do go); on memosfs the read then
goes through the daemon, on tmpfs the pages are the storage and stay.  Each
figure is the best of --repeat, in seconds per target, with a rate (MB/s or
ops/s) and the ratios memosfs_vs_tmpfs and memosfs_vs_disk: memosfs's time
over the other's (above 1: memosfs is slower).  A pattern whose module
(torch, safetensors) is missing is reported as {"skipped": reason}.

May call: memosfs.bench.common (the mount, the tmpfs folder, timed file I/O,
dropping pages), memosfs.knobs; and, for --with-persist-coherence, the
functions of memosfs.bench.persist and memosfs.bench.coherence.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import pickle
import shutil
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Iterator, Optional

from memosfs.bench.common import (
    MiB, drop_cached_pages, memos_mount, nullfs_mount, set_knob, tmpfs_dir, write_file)

TARGETS = ("memosfs", "tmpfs", "disk")
# Two more columns, in the same run: memosfs with fast_path=0 (every request
# through the async handlers: the data path before the fast path), and
# nullfs (native/bench/nullfs.c: a C FUSE file system that keeps nothing —
# what the kernel's round trip alone costs; no FUSE file system without the
# writeback cache goes below it).  nullfs has no directories and reads
# zeros, so loads are not timed on it.
# And memosfs_wbc: a mount with the kernel's writeback cache (-o writeback_cache=1),
# writers' pages handed over at close (docs/semantics.md).
# And memosfs_pt: a mount with FUSE passthrough (-o passthrough=1; root only):
# the kernel reads and writes slots' files itself (docs/semantics.md).
EXTRA_TARGETS = ("memosfs_nofast", "memosfs_wbc", "memosfs_pt", "nullfs")
PATTERNS = ("write_4k", "write_64k", "write_1m", "safetensors", "torch", "pickle", "small", "slot")
EXTRA = ("persist", "coherence")        # only with --with-persist-coherence or --only


def add_parsers(bsub) -> None:
    p = bsub.add_parser("clients", help="client calls (write(), safetensors, torch.save, "
                        "pickle, small files, slot reads) on memosfs vs tmpfs vs disk")
    p.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is kept")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiply every size and count (e.g. 0.1 for a quick run)")
    p.add_argument("--only", default="",
                   help="comma-separated patterns: " + ",".join(PATTERNS + EXTRA))
    p.add_argument("--with-persist-coherence", action="store_true",
                   help="also run bench persist (write-back) and bench coherence "
                   "(8 agents, 10%% and 1%% writes); off by default (about 80 s more at "
                   "--scale 1)")
    p.add_argument("--disk-dir", default="/var/tmp",
                   help="where the disk target's folder is made (default /var/tmp)")
    p.add_argument("--profile", action="store_true",
                   help="per pattern and memosfs column: the daemon's requests "
                   "and CPU, per MB moved and per request")
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.set_defaults(fn=cmd_bench_clients)


# ---------------------------------------------------------------- helpers

def fstype(path: str) -> str:
    """The type of the filesystem holding path, from /proc/self/mountinfo."""
    p = os.path.realpath(path)
    best, kind = "", "?"
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            mnt = fields[4]
            rest = line.split(" - ", 1)[1].split()
            if (p == mnt or p.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, kind = mnt, rest[0]
    return kind


@contextlib.contextmanager
def disk_dir(base: str) -> Iterator[str]:
    d = tempfile.mkdtemp(prefix="memosfs-bench-clients-", dir=base)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def drop(target: str, paths: list[str]) -> None:
    """Drop the pages of `paths`: on disk fsync first (dirty pages would stay)."""
    for p in paths:
        if target == "disk":
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        drop_cached_pages(p)


def write_in(path: str, size: int, chunk: int, block: memoryview) -> float:
    """`size` bytes in os.write()s of `chunk` bytes, close included; seconds."""
    return write_file(path, block[:chunk], size)


def pread_range(path: str, off: int, length: int, buf: bytearray) -> int:
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        done = 0
        while done < length:
            n = os.preadv(fd, [view[:min(len(view), length - done)]], off + done)
            if n <= 0:
                break
            done += n
        return done
    finally:
        os.close(fd)


PROFILED = ("memosfs", "memosfs_nofast", "memosfs_wbc", "memosfs_pt")
COUNTS = ("requests", "write_requests", "cpu_ms")


def daemon_counts(root: str) -> dict[str, int]:
    """The daemon's own request and CPU counters (its stats.json)."""
    with open(os.path.join(root, ".memos", "cache", "stats.json")) as f:
        d = json.load(f)
    return {k: int(d.get(k, 0)) for k in COUNTS}


class Profile:
    """Per target, the daemon's counters summed over a pattern's runs, less
    what reading them costs (measured once per mount)."""

    def __init__(self, roots: dict[str, str]) -> None:
        self.roots = roots
        self.probe: dict[str, int] = {}
        for t, root in roots.items():
            a = daemon_counts(root)
            b = daemon_counts(root)
            self.probe[t] = b["requests"] - a["requests"]
        self.sums: dict[str, dict[str, int]] = {}
        self.phases: dict[str, dict[str, dict[str, int]]] = {}

    @contextlib.contextmanager
    def run(self, target: str) -> Iterator[None]:
        if target not in self.roots:
            yield
            return
        a = daemon_counts(self.roots[target])
        try:
            yield
        finally:
            b = daemon_counts(self.roots[target])
            d = self.sums.setdefault(target, dict.fromkeys(COUNTS, 0))
            for k in COUNTS:
                d[k] += b[k] - a[k]
            d["requests"] -= self.probe[target]

    @contextlib.contextmanager
    def phase(self, target: str, name: str, ops: int) -> Iterator[None]:
        """Count one phase of a pattern's run on its own (the small files'
        creates, their reads): requests and daemon CPU per operation."""
        if target not in self.roots:
            yield
            return
        a = daemon_counts(self.roots[target])
        try:
            yield
        finally:
            b = daemon_counts(self.roots[target])
            d = self.phases.setdefault(target, {}).setdefault(
                name, {"ops": 0, "requests": 0, "cpu_ms": 0})
            d["ops"] += ops
            d["requests"] += b["requests"] - a["requests"] - self.probe[target]
            d["cpu_ms"] += b["cpu_ms"] - a["cpu_ms"]

    def report(self, mb_per_run: float, runs: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        mb = mb_per_run * runs
        for t, d in self.sums.items():
            r = max(d["requests"], 0)
            out[t] = {"requests": r, "write_requests": d["write_requests"],
                      "cpu_ms": d["cpu_ms"], "MB": round(mb, 3),
                      "requests_per_MB": round(r / mb, 2) if mb else None,
                      "write_requests_per_MB": round(d["write_requests"] / mb, 2) if mb else None,
                      "cpu_us_per_request": round(1000 * d["cpu_ms"] / r, 1) if r else None,
                      "cpu_ms_per_MB": round(d["cpu_ms"] / mb, 2) if mb else None}
            phases = self.phases.get(t, {})
            if phases:
                out[t]["per_op"] = {
                    name: {"requests": round(p["requests"] / p["ops"], 2),
                           "cpu_us": round(1000 * p["cpu_ms"] / p["ops"], 1)}
                    for name, p in phases.items() if p["ops"]}
        self.sums = {}
        self.phases = {}
        return out


class Timer:
    """Best-of per (figure, target)."""

    def __init__(self, prof: Optional[Profile] = None) -> None:
        self.best: dict[str, dict[str, float]] = {}
        self.prof = prof

    def phase(self, target: str, name: str, ops: int):
        """The profile's count of one phase (a no-op without --profile)."""
        return self.prof.phase(target, name, ops) if self.prof else contextlib.nullcontext()

    def keep(self, figure: str, target: str, seconds: float) -> None:
        d = self.best.setdefault(figure, {})
        d[target] = min(d.get(target, float("inf")), seconds)


def figure(seconds: dict[str, float], amount: float, unit: str) -> dict[str, Any]:
    """One figure: seconds per target, the rate (amount/s in `unit`), and the
    ratios of memosfs's time to each baseline's (and, where timed, of
    memosfs with fast_path=0 and of nullfs to tmpfs's)."""
    here = [t for t in TARGETS + EXTRA_TARGETS if t in seconds]
    out: dict[str, Any] = {"seconds": {t: round(seconds[t], 9) for t in here}}
    out[unit] = {t: round(amount / seconds[t], 1) if seconds[t] > 0 else None for t in here}
    s = out["seconds"]

    def ratio(a: str, b: str) -> float | None:
        return round(s[a] / s[b], 4) if a in s and s.get(b) else None
    out["memosfs_vs_tmpfs"] = ratio("memosfs", "tmpfs")
    out["memosfs_vs_disk"] = ratio("memosfs", "disk")
    for t, key in (("memosfs_nofast", "nofast_vs_tmpfs"), ("memosfs_wbc", "wbc_vs_tmpfs"),
                   ("memosfs_pt", "pt_vs_tmpfs"), ("nullfs", "nullfs_vs_tmpfs")):
        if t in s:
            out[key] = ratio(t, "tmpfs")
    if "memosfs_wbc" in s:
        out["wbc_vs_disk"] = ratio("memosfs_wbc", "disk")
    if "memosfs_pt" in s:
        out["pt_vs_disk"] = ratio("memosfs_pt", "disk")
    if "nullfs" in s:
        out["memosfs_vs_nullfs"] = ratio("memosfs", "nullfs")
    return out


def scratch(d: str, target: str, name: str) -> tuple[Callable[[str], str], Callable[[], None]]:
    """A folder `name` in d for a pattern's files: (path of a file in it,
    cleanup).  On nullfs (no directories) the files go in d, `name-` before
    their names."""
    sub = os.path.join(d, name)
    if target != "nullfs":
        os.mkdir(sub)
        return (lambda n: os.path.join(sub, n)), (lambda: shutil.rmtree(sub))
    made: list[str] = []

    def path(n: str) -> str:
        made.append(f"{sub}-{n}")
        return made[-1]

    def cleanup() -> None:
        for p in made:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
    return path, cleanup


def missing(*mods: str) -> str | None:
    """The reason a pattern is skipped: the first module that does not import."""
    for m in mods:
        try:
            importlib.import_module(m)
        except ImportError as e:
            return f"{m} not importable: {e}"
    return None


# ---------------------------------------------------------------- the patterns
# Each runs once on one target folder, keeping its times in `tm`; the caller
# repeats it and alternates the targets.

def p_write(chunk: int, size: int) -> Callable:
    block = memoryview(os.urandom(max(chunk, 64 << 10)))

    def run(d: str, target: str, tm: Timer, i: int) -> None:
        path = os.path.join(d, f"write{chunk}-{i}")
        tm.keep("write", target, write_in(path, size, chunk, block))
        if os.stat(path).st_size != size:
            raise RuntimeError(f"{target}: {path} has {os.stat(path).st_size} of {size} bytes")
        os.unlink(path)
    return run


def _loads(d: str, target: str, tm: Timer, paths: list[str], load: Callable[[], int],
           expect: int) -> None:
    """load_warm (right after the save), then load_cold (pages dropped);
    not on nullfs, which reads zeros."""
    if target == "nullfs":
        return
    for kind in ("load_warm", "load_cold"):
        if kind == "load_cold":
            drop(target, paths)
        t0 = time.perf_counter()
        got = load()
        tm.keep(kind, target, time.perf_counter() - t0)
        if got != expect:
            raise RuntimeError(f"{target}: loaded {got} bytes of {expect}")


def p_safetensors(nfiles: int, tensor_bytes: int) -> Callable:
    import torch
    from safetensors.torch import load_file, save_file
    numel = max(1, tensor_bytes // 2)
    tensors = [{"kv": torch.randn(numel).to(torch.float16)} for _ in range(nfiles)]
    total = nfiles * numel * 2

    def run(d: str, target: str, tm: Timer, i: int) -> None:
        at, cleanup = scratch(d, target, f"st{i}")
        paths = [at(f"layer{j:03d}.safetensors") for j in range(nfiles)]
        t0 = time.perf_counter()
        for p, t in zip(paths, tensors):
            save_file(t, p)
        tm.keep("save", target, time.perf_counter() - t0)

        def load() -> int:
            n = 0
            for p in paths:
                for v in load_file(p).values():
                    n += v.numel() * v.element_size()
            return n
        _loads(d, target, tm, paths, load, total)
        cleanup()
    return run


def p_torch(ntensors: int, tensor_bytes: int) -> Callable:
    import torch
    numel = max(1, tensor_bytes // 2)
    obj = {f"layer{j}": torch.randn(numel).to(torch.float16) for j in range(ntensors)}
    total = ntensors * numel * 2

    def run(d: str, target: str, tm: Timer, i: int) -> None:
        path = os.path.join(d, f"torch{i}.pt")
        t0 = time.perf_counter()
        torch.save(obj, path)
        tm.keep("save", target, time.perf_counter() - t0)

        def load() -> int:
            got = torch.load(path)
            return sum(v.numel() * v.element_size() for v in got.values())
        _loads(d, target, tm, [path], load, total)
        os.unlink(path)
    return run


def p_pickle(nobjs: int, obj_bytes: int) -> Callable:
    obj = {f"block{j}": os.urandom(obj_bytes) for j in range(nobjs)}
    total = nobjs * obj_bytes

    def run(d: str, target: str, tm: Timer, i: int) -> None:
        path = os.path.join(d, f"pickle{i}.pkl")
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            pickle.dump(obj, f, protocol=pickle.HIGHEST_PROTOCOL)
        tm.keep("dump", target, time.perf_counter() - t0)

        def load() -> int:
            with open(path, "rb") as f:
                got = pickle.load(f)
            return sum(len(v) for v in got.values())
        _loads(d, target, tm, [path], load, total)
        os.unlink(path)
    return run


def p_small(count: int) -> Callable:
    data = os.urandom(4096)
    buf = bytearray(8192)

    def run(d: str, target: str, tm: Timer, i: int) -> None:
        at, cleanup = scratch(d, target, f"small{i}")
        paths = [at(f"f{j:05d}") for j in range(count)]
        with tm.phase(target, "create", count):
            t0 = time.perf_counter()
            for p in paths:
                fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.write(fd, data)
                os.close(fd)
            tm.keep("create", target, time.perf_counter() - t0)
        n = 0
        with tm.phase(target, "read", count):
            t0 = time.perf_counter()
            for p in paths:
                fd = os.open(p, os.O_RDONLY)
                n += os.readv(fd, [buf])
                os.close(fd)
            tm.keep("read", target, time.perf_counter() - t0)
        if n != 4096 * count:
            raise RuntimeError(f"{target}: read {n} of {4096 * count} bytes")
        cleanup()
    return run


def p_slot(size: int, readers: int = 4) -> Callable:
    block = memoryview(os.urandom(MiB))

    def run(d: str, target: str, tm: Timer, i: int) -> None:
        path = os.path.join(d, f"slot{i}")
        write_file(path, block, size)
        for nr in (1, readers):
            drop(target, [path])
            part = size // nr
            ranges = [(k * part, size - k * part if k == nr - 1 else part) for k in range(nr)]
            got = [0] * nr
            errs: list[BaseException] = []

            def reader(k: int) -> None:
                try:
                    got[k] = pread_range(path, ranges[k][0], ranges[k][1], bytearray(MiB))
                except BaseException as e:          # noqa: BLE001 - reported below
                    errs.append(e)
            threads = [threading.Thread(target=reader, args=(k,)) for k in range(nr)]
            t0 = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            tm.keep(f"read_cold_{nr}", target, time.perf_counter() - t0)
            if errs:
                raise errs[0]
            if sum(got) != size:
                raise RuntimeError(f"{target}: {nr} readers read {sum(got)} of {size} bytes")
        os.unlink(path)
    return run


# ---------------------------------------------------------------- the run

def plan(scale: float) -> dict[str, dict[str, Any]]:
    """Per pattern: its sizes, its module requirements, how to build its runner,
    and the amount (bytes or operations) each figure's rate divides."""
    def sz(n: float, align: int = 4096) -> int:
        return max(align, int(n * scale) // align * align)

    w = sz(32 * MiB, 64 << 10)
    w1 = sz(128 * MiB, MiB)
    st_n, st_b = 30, sz(2_000_000, 2)
    t_n, t_b = 25, sz(4_000_000, 2)
    p_n, p_b = 100, sz(1_000_000, 1)
    small = max(10, int(2000 * scale))
    slot = sz(256 * MiB, 4 * 4096)
    return {
        "write_4k": {"needs": (), "make": lambda: p_write(4096, w),
                     "info": {"bytes": w, "write_bytes": 4096},
                     "amount": {"write": (w / 1e6, "MBps")}},
        "write_64k": {"needs": (), "make": lambda: p_write(64 << 10, w),
                      "info": {"bytes": w, "write_bytes": 64 << 10},
                      "amount": {"write": (w / 1e6, "MBps")}},
        "write_1m": {"needs": (), "make": lambda: p_write(MiB, w1),
                     "info": {"bytes": w1, "write_bytes": MiB},
                     "amount": {"write": (w1 / 1e6, "MBps")}},
        "safetensors": {"needs": ("torch", "safetensors.torch"),
                        "make": lambda: p_safetensors(st_n, st_b),
                        "info": {"files": st_n, "tensor_bytes": st_b, "bytes": st_n * st_b,
                                 "dtype": "float16"},
                        "amount": {k: (st_n * st_b / 1e6, "MBps")
                                   for k in ("save", "load_warm", "load_cold")}},
        "torch": {"needs": ("torch",), "make": lambda: p_torch(t_n, t_b),
                  "info": {"tensors": t_n, "tensor_bytes": t_b, "bytes": t_n * t_b,
                           "dtype": "float16"},
                  "amount": {k: (t_n * t_b / 1e6, "MBps")
                             for k in ("save", "load_warm", "load_cold")}},
        "pickle": {"needs": (), "make": lambda: p_pickle(p_n, p_b),
                   "info": {"objects": p_n, "object_bytes": p_b, "bytes": p_n * p_b,
                            "protocol": pickle.HIGHEST_PROTOCOL},
                   "amount": {k: (p_n * p_b / 1e6, "MBps")
                              for k in ("dump", "load_warm", "load_cold")}},
        "small": {"needs": (), "make": lambda: p_small(small),
                  "info": {"files": small, "file_bytes": 4096},
                  "amount": {k: (small, "ops_per_s") for k in ("create", "read")}},
        "slot": {"needs": (), "make": lambda: p_slot(slot),
                 "info": {"bytes": slot, "readers": [1, 4], "read_bytes": MiB},
                 "amount": {k: (slot / 1e6, "MBps") for k in ("read_cold_1", "read_cold_4")}},
    }


def moved_mb(p: dict[str, Any]) -> float:
    """MB a pattern's run moves between client and file system: each figure's
    bytes (a 4 KiB file per small-file operation)."""
    return sum(a if unit == "MBps" else a * 4096 / 1e6
               for a, unit in p["amount"].values())


def bench_clients(repeat: int = 3, scale: float = 1.0, only: tuple[str, ...] = PATTERNS,
                  disk_base: str = "/var/tmp",
                  progress: Callable[[str], None] | None = None,
                  profile: bool = False) -> dict[str, Any]:
    say = progress or (lambda msg: None)
    pl = plan(scale)
    out: dict[str, Any] = {"bench": "clients", "repeat": repeat, "scale": scale,
                           "cpus": os.cpu_count(), "targets": {}, "patterns": {}}
    wanted = [p for p in PATTERNS if p in only]
    runners: dict[str, Callable] = {}
    for name in wanted:
        why = missing(*pl[name]["needs"])
        if why:
            out["patterns"][name] = {"skipped": why}
        else:
            runners[name] = pl[name]["make"]()
    biggest = max([pl[n]["info"]["bytes"] for n in runners if "bytes" in pl[n]["info"]] + [0])
    capacity = max(1 << 30, 4 * biggest)
    t_start = time.perf_counter()
    if runners:
        with contextlib.ExitStack() as stack:
            mnt = stack.enter_context(memos_mount(capacity))
            dirs = {"memosfs": mnt,
                    "tmpfs": stack.enter_context(tmpfs_dir()),
                    "disk": stack.enter_context(disk_dir(disk_base))}
            null, why = stack.enter_context(nullfs_mount())
            sess = os.path.join(dirs["memosfs"], "bench", "clients")
            os.makedirs(sess)
            for t, d in dirs.items():
                out["targets"][t] = {"dir": sess if t == "memosfs" else d, "fstype": fstype(d)}
            out["targets"]["memosfs"]["capacity"] = capacity
            dirs["memosfs"] = dirs["memosfs_nofast"] = sess
            out["targets"]["memosfs_nofast"] = {"dir": sess, "knobs": {"fast_path": "0"}}
            wbc_root = stack.enter_context(memos_mount(capacity, "writeback_cache=1"))
            wbc = os.path.join(wbc_root, "bench", "clients")
            os.makedirs(wbc)
            dirs["memosfs_wbc"] = wbc
            out["targets"]["memosfs_wbc"] = {"dir": wbc, "fstype": fstype(wbc),
                                             "knobs": {"writeback_cache": "1"}}
            pt_root = None
            if os.geteuid() == 0:
                pt_root = stack.enter_context(memos_mount(capacity, "passthrough=1"))
                pt = os.path.join(pt_root, "bench", "clients")
                os.makedirs(pt)
                dirs["memosfs_pt"] = pt
                out["targets"]["memosfs_pt"] = {"dir": pt, "fstype": fstype(pt),
                                                "knobs": {"passthrough": "1"}}
            else:
                out["targets"]["memosfs_pt"] = {"skipped": "passthrough needs root"}
            if null is not None:
                dirs["nullfs"] = null
                out["targets"]["nullfs"] = {"dir": null, "fstype": fstype(null)}
            else:
                out["targets"]["nullfs"] = {"skipped": why}
            targets = tuple(t for t in TARGETS + EXTRA_TARGETS if t in dirs)
            prof = Profile({"memosfs": mnt, "memosfs_nofast": mnt, "memosfs_wbc": wbc_root,
                            **({"memosfs_pt": pt_root} if pt_root else {})}) \
                if profile else None
            for name, run in runners.items():
                tm = Timer(prof)
                for i in range(repeat):
                    say(f"[{i + 1}/{repeat}] {name}")
                    # alternate which target goes first, so none always runs right
                    # after the same neighbour
                    k = i % len(targets)
                    for t in targets[k:] + targets[:k]:
                        if t == "memosfs_nofast":
                            set_knob(mnt, "fast_path", 0)
                        try:
                            with prof.run(t) if prof else contextlib.nullcontext():
                                run(dirs[t], t, tm, i)
                        finally:
                            if t == "memosfs_nofast":
                                set_knob(mnt, "fast_path", 1)
                res: dict[str, Any] = dict(pl[name]["info"])
                res["figures"] = {fig: figure(tm.best[fig], *pl[name]["amount"][fig])
                                  for fig in pl[name]["amount"]}
                if prof:
                    res["profile"] = prof.report(moved_mb(pl[name]), repeat)
                out["patterns"][name] = res
    out["clients_s"] = round(time.perf_counter() - t_start, 2)
    return out


def persist_coherence(repeat: int, scale: float, which: tuple[str, ...],
                      progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """`bench persist`'s write-back figures (no kill -9 cycles) and
    `bench coherence --agents 8` at 10% and 1% writes, scaled."""
    out: dict[str, Any] = {}
    if "persist" in which:
        from memosfs.bench.persist import bench_persist
        slot = 8 * MiB
        # more than the 64M mount holds, so eviction does write back
        size = max(12 * slot, int(256 * MiB * scale) // slot * slot)
        t0 = time.perf_counter()
        r = bench_persist(size, slot, 0, repeat, progress=progress)
        keys = ("size_bytes", "slot_bytes", "slots", "repeat", "writeback_MBps",
                "raw_write_MBps", "writeback_ratio", "evict_writebacks", "flush_writebacks",
                "mount_s", "first_slot_s", "warmup_MBps", "raw_read_MBps", "warmup_ratio")
        out["persist"] = {k: r[k] for k in keys if k in r}
        out["persist"]["seconds"] = round(time.perf_counter() - t0, 2)
    if "coherence" in which:
        from memosfs.bench.coherence import bench_coherence
        seconds = max(1.0, 5.0 * scale)
        res: dict[str, Any] = {"agents": 8, "seconds_per_mode": seconds}
        t0 = time.perf_counter()
        for ratio in (0.1, 0.01):
            if progress:
                progress(f"coherence: 8 agents, {ratio:.0%} writes, {seconds} s per mode")
            r = bench_coherence(agents=8, seconds=seconds, write_ratio=ratio)
            res[f"writes_{ratio:g}"] = {
                "modes": {m: {k: v[k] for k in ("ops_per_s", "mean_ms", "p99_ms", "failed",
                                                "torn_reads")}
                          for m, v in r["modes"].items()},
                "ratios": r["ratios"]}
        res["seconds"] = round(time.perf_counter() - t0, 2)
        out["coherence"] = res
    return out


def cmd_bench_clients(args: argparse.Namespace) -> int:
    if args.repeat < 1 or not args.scale > 0:
        print("memosfs bench clients: repeat must be >= 1 and scale > 0", file=sys.stderr)
        return 2
    only = tuple(x for x in args.only.split(",") if x)
    bad = [x for x in only if x not in PATTERNS + EXTRA]
    if bad:
        print(f"memosfs bench clients: unknown pattern(s) {', '.join(bad)} "
              f"(choose from {', '.join(PATTERNS + EXTRA)})", file=sys.stderr)
        return 2
    if not only:
        only = PATTERNS + (EXTRA if args.with_persist_coherence else ())
    elif args.with_persist_coherence:
        only = only + EXTRA
    say = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    result = bench_clients(args.repeat, args.scale, only, args.disk_dir, progress=say,
                           profile=args.profile)
    extra = tuple(x for x in EXTRA if x in only)
    if extra:
        result |= persist_coherence(args.repeat, args.scale, extra, progress=say)
    for x in EXTRA:
        result.setdefault(x, {"skipped": "not selected (--with-persist-coherence "
                                         f"or --only {x})"})
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0
