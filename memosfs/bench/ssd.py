"""`memosfs bench ssd`: many small slots through the SSD tier and back,
beside the same bytes as files on the filesystem that holds $TMPDIR.

    memosfs bench ssd [--slots 20000] [--slot-size 4K] [--formats packed,files]
                      [--repeat 1] [--json]

For each format (packed: the default ssd_pack_below, small slots in segment
files; files: ssd_pack_below=0, a file per slot, the format before segments):
  - write: --slots slots of --slot-size bytes created through a mount
    (capacity for all of them, writeback_delay_ms high, warmup_ratio=0):
    daemon_cpu_create_us (the daemon's CPU per slot created, before any
    write-back); then writeback_delay_ms=0 and the background writer writes
    them all back, unsynced: daemon_cpu_writeback_us (the daemon's CPU per
    slot meanwhile), writeback_s; then `flush` makes them durable: flush_s,
    daemon_cpu_flush_us (a file per slot: an fsync each; packed: one per
    segment);
  - space: ssd_bytes_on_disk (st_blocks of everything under the SSD
    directory) over the slots' bytes -> space_ratio; slot_data_ratio counts
    the slot files and segments only (not order.json, policy.json,
    namespace.json);
  - read back: unmount (umount_s), mount again (mount_s), then `cat` of every
    slot (xargs cat, in the session folder) while the SSD directory is still
    in the page cache -> readback_warm_s; then unmount, drop the page cache
    (drop_caches, else posix_fadvise DONTNEED on every file), mount, `cat`
    all again -> readback_cold_s.  passthrough: as files, read back by mounts
    with passthrough=1 (the kernel reads each slot's SSD file; its checksum is
    checked at the first open, one read of the file).  reread_memory_s: the second `cat` of all in
    the first remount (every slot promoted into memory by then: what the
    mount costs without the SSD).
The baseline: the same bytes as --slots files in one folder on $TMPDIR's
filesystem, `cat` the same way, once in the page cache (ext4_warm_s) and
once after dropping it (ext4_cold_s); *_ratio = memosfs time / ext4's.

    memosfs bench ssd --case inplace [--slot-size 64M] [--changes 50] [--json]

A large slot changed in place (--case slots, many small slots, is the
default): one slot of --slot-size (64 MiB unless given) written and
fsync'd through a mount, then --changes times a 4 KiB pwrite at a page
spread over the slot and an fsync.  Prints what reached the SSD after the
first write-back: ssd_write_bytes (the stat: slot files and extent logs),
proc_write_bytes (the daemon's /proc/PID/io write_bytes delta), the extent
log's appends and folds, each over (the slot + the changed bytes)
(*_ratio); beside the same pwrite+fsync loop on a file in $TMPDIR
(ext4_write_bytes: the sectors the disk under $TMPDIR wrote meanwhile,
/sys/dev/block/M:m/stat, journal included; /proc/self/io counts the
file's first 64 MiB there too, written back during the loop).  The
bytes read back through the mount, after an `evict` and after a remount,
are compared with what was written (content_ok); changes_s and
ext4_changes_s time the two loops.  --capacity below twice the slot (the
memory tier cannot take it) measures the changes of a slot larger than
memory: each is a draft that spills as an overlay (spills, spill_bytes).

    memosfs bench ssd --case writers [--writers 2] [--slot-size 48M]
                      [--capacity 64M] [--json]

Writers whose drafts together exceed the memory tier: --writers threads
each write a new slot of --slot-size (1 MiB writes; all have written half
before any goes on, so the drafts are open together) through a
mount with --capacity of memory and an SSD directory; prints how many
finished (finished, errors), their time (memosfs_s) beside the same
writes of files in $TMPDIR (ext4_s, ratio_to_ext4), the spills, and
whether every finished slot reads back the same, before and after a
remount (content_ok).

May call: memosfs.bench.common (mounts, dropping caches) and the standard
library.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional

from memosfs.bench.common import Daemon, drop_page_cache, files_under
from memosfs.knobs import parse_size

FORMATS = {"packed": None, "files": 0, "passthrough": 0}   # ssd_pack_below (None: the default)
# read back by a mount with passthrough=1: the kernel reads each slot's SSD file
# itself (root only; slots below passthrough_min are read as by "files")
READ_OPTS = {"passthrough": {"passthrough": 1, "passthrough_min": 0}}


def add_parsers(bsub) -> None:
    p = bsub.add_parser("ssd", help="SSD tier: many small slots written back, remounted and "
                        "read back, vs the same files on the local filesystem")
    p.add_argument("--slots", type=int, default=20000, help="slots (default 20000)")
    p.add_argument("--slot-size", default="4K", help="bytes per slot (default 4K)")
    p.add_argument("--formats", default="packed,files",
                   help="comma-separated: packed (segments), files (a file per slot), "
                   "passthrough (files, read back by a passthrough=1 mount)")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of each format; each time and CPU figure is the best")
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.add_argument("--writers", type=int, default=2,
                   help="--case writers: concurrent writers (default 2)")
    p.add_argument("--capacity", default=None,
                   help="--case writers: the memory tier (default 64M); --case inplace: "
                   "the memory tier (default 256M or twice the slot; below twice the "
                   "slot, its changes are drafts that spill: overlays)")
    p.add_argument("--case", choices=("slots", "inplace", "writers"), default="slots",
                   help="slots (default): many small slots; inplace: one large slot "
                   "changed in place, 4 KiB pwrite + fsync at a time; writers: writers whose "
                   "drafts together exceed the memory tier")
    p.add_argument("--changes", type=int, default=50,
                   help="--case inplace: the pwrite+fsync changes (default 50)")
    p.set_defaults(fn=cmd_bench_ssd)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cat_all(folder: str, names: list[str]) -> float:
    """Seconds to `cat` every name in folder to /dev/null (xargs cat)."""
    t0 = time.perf_counter()
    subprocess.run(["xargs", "-0", "cat"], input=b"\0".join(n.encode() for n in names),
                   cwd=folder, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def _disk_bytes(root: str, only: tuple[str, ...] = ()) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        if only and rel.split(os.sep)[0] not in only:
            continue
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_blocks * 512
            except OSError:
                pass
    return total


def _write_all(folder: str, names: list[str], blobs: list[bytes]) -> None:
    for n, b in zip(names, blobs):
        fd = os.open(os.path.join(folder, n), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, b)
        finally:
            os.close(fd)


def bench_ssd(slots: int, size: int, formats: list[str], repeat: int = 1,
              progress=None) -> dict[str, object]:
    say = progress or (lambda msg: None)
    names = [f"k{i:06d}" for i in range(slots)]
    block = os.urandom(size + slots)
    blobs = [i.to_bytes(8, "little") + block[i:i + size - 8] if size >= 8 else block[i:i + size]
             for i in range(slots)]
    tmp = tempfile.mkdtemp(prefix="memosfs-bench-ssd-")
    out: dict[str, object] = {"bench": "ssd", "slots": slots, "slot_bytes": size,
                              "data_bytes": slots * size}
    daemons: list[Daemon] = []

    def mount(name: str, ssd: str, **opts: object) -> Daemon:
        d = Daemon(os.path.join(tmp, name), ssd, os.path.join(tmp, name + ".log"),
                   {"capacity": max(256 << 20, 4 * slots * max(size, 4096)),
                    "warmup_ratio": 0, "writeback_delay_ms": 3_600_000, **opts},
                   timeout=120, stop_timeout=300)
        daemons.append(d)
        return d

    def stop(d: Daemon) -> float:
        t0 = time.perf_counter()
        d.stop()
        if d.proc.returncode != 0:
            raise RuntimeError(f"memosfs exited {d.proc.returncode} (see {d.log})")
        return time.perf_counter() - t0

    try:
        say(f"ext4: {slots} files of {size} bytes")
        raw = os.path.join(tmp, "raw")
        os.mkdir(raw)
        _write_all(raw, names, blobs)
        os.sync()
        _cat_all(raw, names)                        # in the page cache now
        warm, cold = [], []
        for _ in range(repeat):
            warm.append(_cat_all(raw, names))
            out["cache_drop"] = drop_page_cache(files_under(raw))
            cold.append(_cat_all(raw, names))
        out["ext4_warm_s"] = round(min(warm), 3)
        out["ext4_cold_s"] = round(min(cold), 3)
        for run, fmt in [(i, f) for i in range(repeat) for f in formats]:
            say(f"[{run + 1}/{repeat}] {fmt}: write {slots} slots through a mount, flush")
            ssd = os.path.join(tmp, f"ssd-{fmt}-{run}")
            opts = {} if FORMATS[fmt] is None else {"ssd_pack_below": FORMATS[fmt]}
            m = mount(f"mnt-{fmt}-{run}-w", ssd, **opts)
            sess = m.p("bench", "ssd")
            os.makedirs(sess)
            c0 = _cpu_s(m.proc.pid)
            _write_all(str(sess), names, blobs)
            c1 = _cpu_s(m.proc.pid)
            # the background writer writes them all back (no fsync: nobody
            # acknowledged them), then flush makes them durable
            t0 = time.perf_counter()
            with open(m.ctl("writeback_delay_ms"), "w") as f:
                f.write("0")
            while m.stats().get("writebacks", 0) < slots:
                if time.perf_counter() - t0 > 600:
                    raise RuntimeError("the background writer did not finish in 10 minutes")
                time.sleep(0.05)
            wb = time.perf_counter() - t0
            c2 = _cpu_s(m.proc.pid)
            t0 = time.perf_counter()
            with open(m.ctl("flush"), "w") as f:
                f.write("1")
            fl = time.perf_counter() - t0
            c3 = _cpu_s(m.proc.pid)
            st = m.stats()
            r: dict[str, object] = {
                "daemon_cpu_create_us": round((c1 - c0) / slots * 1e6, 1),
                "daemon_cpu_writeback_us": round((c2 - c1) / slots * 1e6, 1),
                "writeback_s": round(wb, 3),
                "flush_s": round(fl, 3),
                "daemon_cpu_flush_us": round((c3 - c2) / slots * 1e6, 1),
                "ssd_writes": int(st.get("ssd_writes", 0)),
            }
            r["umount_s"] = round(stop(m), 3)
            disk = _disk_bytes(ssd)
            data = _disk_bytes(ssd, ("slots", "segments"))
            r |= {"ssd_bytes_on_disk": disk, "space_ratio": round(disk / (slots * size), 3),
                  "slot_data_bytes_on_disk": data,
                  "slot_data_ratio": round(data / (slots * size), 3)}

            say(f"{fmt}: remount, cat every slot (SSD directory in the page cache)")
            m = mount(f"mnt-{fmt}-{run}-r1", ssd, **opts, **READ_OPTS.get(fmt, {}))
            r["mount_s"] = round(m.t_mounted - m.t_start, 3)
            r["readback_warm_s"] = round(_cat_all(str(m.p("bench", "ssd")), names), 3)
            # again: every slot in memory now (the mount's own floor)
            r["reread_memory_s"] = round(_cat_all(str(m.p("bench", "ssd")), names), 3)
            st = m.stats()
            r["ssd_hits"] = int(st.get("ssd_hits", 0))
            stop(m)

            say(f"{fmt}: drop the page cache, remount, cat every slot")
            r["cache_drop"] = drop_page_cache(files_under(ssd))
            m = mount(f"mnt-{fmt}-{run}-r2", ssd, **opts, **READ_OPTS.get(fmt, {}))
            r["readback_cold_s"] = round(_cat_all(str(m.p("bench", "ssd")), names), 3)
            stop(m)
            shutil.rmtree(ssd, ignore_errors=True)
            best = out.setdefault(fmt, r)
            for k, v in r.items():
                if k.endswith(("_s", "_us")):
                    best[k] = min(best[k], v)
        for fmt in formats:
            r = out[fmt]
            r["warm_ratio"] = round(r["readback_warm_s"] / out["ext4_warm_s"], 2)
            r["cold_ratio"] = round(r["readback_cold_s"] / out["ext4_cold_s"], 2)
        return out
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _io_write_bytes(pid: object = "self") -> int:
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


def _disk_write_bytes(path: str) -> int:
    """Bytes the block device under path has written (its sectors written
    * 512; 0 where the kernel does not tell)."""
    dev = os.stat(path).st_dev
    try:
        with open(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat") as f:
            return int(f.read().split()[6]) * 512
    except (OSError, IndexError, ValueError):
        return 0


def bench_inplace(size: int, changes: int, progress=None,
                  capacity: Optional[int] = None) -> dict[str, object]:
    """--case inplace (the module docstring)."""
    say = progress or (lambda msg: None)
    capacity = capacity or max(256 << 20, 2 * size)
    page = 4096
    tmp = tempfile.mkdtemp(prefix="memosfs-bench-inplace-")
    data = bytearray(os.urandom(size))
    pages = max(1, size // page)
    offs = [(i * 7919 % pages) * page for i in range(changes)]
    pieces = [os.urandom(page) for _ in range(changes)]
    changed = len(set(offs)) * page
    out: dict[str, object] = {"bench": "ssd", "case": "inplace", "slot_bytes": size,
                              "changes": changes, "change_bytes": page,
                              "changed_bytes": changed, "capacity": capacity}
    d = None
    try:
        say("ext4: the same changes on a file in $TMPDIR")
        raw = os.path.join(tmp, "raw")
        with open(raw, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        io0 = _disk_write_bytes(tmp)
        t0 = time.perf_counter()
        fd = os.open(raw, os.O_WRONLY)
        try:
            for off, piece in zip(offs, pieces):
                os.pwrite(fd, piece, off)
                os.fsync(fd)
        finally:
            os.close(fd)
        out["ext4_changes_s"] = round(time.perf_counter() - t0, 3)
        out["ext4_write_bytes"] = _disk_write_bytes(tmp) - io0
        os.unlink(raw)
        say(f"memosfs: a {size}-byte slot, {changes} x 4 KiB pwrite + fsync")
        ssd = os.path.join(tmp, "ssd")
        d = Daemon(os.path.join(tmp, "mnt"), ssd, os.path.join(tmp, "mnt.log"),
                   {"capacity": capacity, "warmup_ratio": 0,
                    "writeback_delay_ms": 3_600_000}, timeout=120, stop_timeout=300)
        sess = d.p("bench", "ssd")
        os.makedirs(sess)
        path = os.path.join(sess, "big")
        with open(path, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        st0 = d.stats()
        io0 = _io_write_bytes(d.proc.pid)
        t0 = time.perf_counter()
        fd = os.open(path, os.O_WRONLY)
        try:
            for off, piece in zip(offs, pieces):
                os.pwrite(fd, piece, off)
                data[off:off + page] = piece
                os.fsync(fd)
        finally:
            os.close(fd)
        out["changes_s"] = round(time.perf_counter() - t0, 3)
        out["changes_ratio_to_ext4"] = round(out["changes_s"] / out["ext4_changes_s"], 2) \
            if out["ext4_changes_s"] else None
        st = d.stats()
        out["first_write_bytes"] = st0.get("ssd_write_bytes", 0)
        out["ssd_write_bytes"] = st.get("ssd_write_bytes", 0) - out["first_write_bytes"]
        out["proc_write_bytes"] = _io_write_bytes(d.proc.pid) - io0
        for k in ("ssd_log_appends", "ssd_folds", "ssd_log_bytes", "spills",
                  "spill_bytes"):
            out[k] = st.get(k, 0)
        whole = size + changed
        out["ssd_write_ratio"] = round((out["first_write_bytes"] + out["ssd_write_bytes"])
                                       / whole, 4)
        out["proc_write_ratio"] = round(out["proc_write_bytes"] / whole, 4)
        out["ssd_write_after_first_ratio"] = round(out["ssd_write_bytes"] / whole, 4)
        out["ext4_write_ratio"] = round(out["ext4_write_bytes"] / whole, 4)
        ok = _read(path) == data
        try:
            with open(d.ctl("evict"), "w") as f:
                f.write("bench/ssd/big\n")
        except OSError:
            pass                        # (a slot memory does not hold: nothing to evict)
        ok = ok and _read(path) == data
        d.stop()
        d = Daemon(os.path.join(tmp, "mnt"), ssd, os.path.join(tmp, "mnt2.log"),
                   {"capacity": capacity, "warmup_ratio": 0},
                   timeout=120, stop_timeout=300)
        out["content_ok"] = ok and _read(path) == data
        return out
    finally:
        if d is not None:
            d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()



def bench_writers(size: int, writers: int, capacity: int, progress=None) -> dict[str, object]:
    """--case writers (the module docstring)."""
    import threading
    say = progress or (lambda msg: None)
    tmp = tempfile.mkdtemp(prefix="memosfs-bench-writers-")
    blobs = [os.urandom(size) for _ in range(writers)]
    out: dict[str, object] = {"bench": "ssd", "case": "writers", "writers": writers,
                              "slot_bytes": size, "capacity": capacity}

    def write_all(folder: str) -> tuple[float, list[Optional[str]]]:
        errors: list[Optional[str]] = [None] * writers
        half = threading.Barrier(writers)

        def one(i: int) -> None:
            # every writer has half its slot written before any goes on: the
            # drafts are open together (no writer finishes before another starts)
            try:
                with open(os.path.join(folder, f"w{i}"), "wb") as f:
                    for off in range(0, size, 1 << 20):
                        if off == (size // 2) & ~((1 << 20) - 1):
                            half.wait(timeout=120)
                        f.write(blobs[i][off:off + (1 << 20)])
            except OSError as e:
                half.abort()
                errors[i] = os.strerror(e.errno) if e.errno else str(e)
            except threading.BrokenBarrierError:
                errors[i] = "another writer failed"

        threads = [threading.Thread(target=one, args=(i,)) for i in range(writers)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - t0, errors

    d = None
    try:
        say(f"ext4: {writers} writers of {size} bytes in $TMPDIR")
        raw = os.path.join(tmp, "raw")
        os.mkdir(raw)
        out["ext4_s"] = round(write_all(raw)[0], 3)
        shutil.rmtree(raw)
        say(f"memosfs: the same into a {capacity}-byte memory tier with an SSD directory")
        ssd = os.path.join(tmp, "ssd")
        d = Daemon(os.path.join(tmp, "mnt"), ssd, os.path.join(tmp, "mnt.log"),
                   {"capacity": capacity, "warmup_ratio": 0}, timeout=120, stop_timeout=300)
        sess = d.p("bench", "ssd")
        os.makedirs(sess)
        took, errors = write_all(str(sess))
        out["memosfs_s"] = round(took, 3)
        out["ratio_to_ext4"] = round(took / out["ext4_s"], 2) if out["ext4_s"] else None
        out["errors"] = errors
        out["finished"] = sum(e is None for e in errors)
        st = d.stats()
        for k in ("spills", "spill_bytes", "spill_publishes", "evictions"):
            out[k] = st.get(k, 0)
        ok = all(e is not None or _read(os.path.join(sess, f"w{i}")) == blobs[i]
                 for i, e in enumerate(errors))
        d.stop()
        d = Daemon(os.path.join(tmp, "mnt"), ssd, os.path.join(tmp, "mnt2.log"),
                   {"capacity": capacity, "warmup_ratio": 0}, timeout=120, stop_timeout=300)
        out["content_ok"] = ok and all(
            e is not None or _read(os.path.join(d.p("bench", "ssd"), f"w{i}")) == blobs[i]
            for i, e in enumerate(errors))
        return out
    finally:
        if d is not None:
            d.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def cmd_bench_ssd(args: argparse.Namespace) -> int:
    say = None if args.json else (lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.case == "writers":
        size = parse_size(args.slot_size) if args.slot_size != "4K" else 48 << 20
        result = bench_writers(size, max(1, args.writers), parse_size(args.capacity or "64M"),
                               progress=say)
        print(json.dumps(result) if args.json else json.dumps(result, indent=2))
        return 0
    if args.case == "inplace":
        size = parse_size(args.slot_size) if args.slot_size != "4K" else 64 << 20
        if size < 4096 or args.changes < 1:
            print("memosfs bench ssd --case inplace: need --slot-size >= 4K, --changes >= 1",
                  file=sys.stderr)
            return 2
        result = bench_inplace(size, args.changes, progress=say,
                               capacity=parse_size(args.capacity) if args.capacity else None)
        print(json.dumps(result) if args.json else json.dumps(result, indent=2))
        return 0
    size = parse_size(args.slot_size)
    formats = [f for f in args.formats.split(",") if f]
    if args.slots < 1 or size < 1 or not formats or any(f not in FORMATS for f in formats):
        print("memosfs bench ssd: need --slots >= 1, --slot-size >= 1, --formats of "
              f"{', '.join(FORMATS)}", file=sys.stderr)
        return 2
    result = bench_ssd(args.slots, size, formats, max(1, args.repeat), progress=say)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0
