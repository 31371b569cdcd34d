"""What the benchmarks share: a fresh mount (`memos_mount`, from the harness's
one daemon helper), a tmpfs folder for baselines, whole-file reads and writes
timed, dropping cached pages, and the mount's statistics.

May call: memosfs.testing.daemon (starting and stopping daemons, is_mounted,
read_stats) and the standard library.  Every bench module imports its helpers
from here; none imports another bench module (memosfs/bench/cli.py gathers
their parsers).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from memosfs.testing.daemon import Daemon, is_mounted, memos_mount, read_stats  # noqa: F401

MiB = 1 << 20


# ---------------------------------------------------------------- engine processes

def signal_name(returncode: Optional[int]) -> Optional[str]:
    """"SIGSEGV" for a process that a signal ended (a negative return code
    from subprocess), else None."""
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def tail_lines(text: str | bytes | None, n: int = 20) -> list[str]:
    """The last n non-empty lines of a process's output."""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return [ln for ln in (text or "").splitlines() if ln.strip()][-n:]


class EngineFailed(RuntimeError):
    """An engine's process that ended without its answer: what it was, its
    return code, the signal that ended it (by name: an engine's native code
    that faults is killed by SIGSEGV or SIGILL, rc -11 or -4) and the last
    lines of its stderr.  `report()` is what `memosfs bench engines` prints
    in that engine's place before it goes on with the others."""

    def __init__(self, what: str, returncode: Optional[int], output: str | bytes | None = "",
                 how: str = "") -> None:
        self.what = what
        self.returncode = returncode
        self.signal = signal_name(returncode)
        self.stderr_tail = tail_lines(output)
        self.how = how or (f"killed by {self.signal} (rc {returncode})" if self.signal
                           else f"exited with rc {returncode} without its answer")
        super().__init__(f"{what} {self.how}" +
                         "".join("\n  " + ln for ln in self.stderr_tail))

    def report(self) -> dict[str, Any]:
        return {"failed": f"{self.what} {self.how}", "returncode": self.returncode,
                "signal": self.signal, "stderr_tail": self.stderr_tail}


def run_json_child(cmd: list[str], what: str, *, timeout: float,
                   env: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """Run an engine's worker process and return the last JSON object line of
    its stdout; EngineFailed (return code, signal, stderr tail) when it exits
    non-zero, by a signal, without a JSON line, or not within `timeout`."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as e:
        raise EngineFailed(what, None, e.stderr, f"gave no answer in {timeout:g} s (killed)")
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        raise EngineFailed(what, r.returncode, r.stderr or r.stdout)
    return json.loads(lines[-1])


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


NATIVE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "native")


@contextlib.contextmanager
def nullfs_mount() -> Iterator[tuple[str | None, str]]:
    """native/bench/nullfs (a C FUSE file system that keeps nothing: the
    kernel's round trip alone) mounted in a temporary folder: (path, "")
    — or (None, why) when it cannot be built or mounted here (no source
    checkout, no compiler or libfuse3-dev)."""
    exe = os.path.join(NATIVE, "build", "bench", "nullfs")
    if not os.path.exists(os.path.join(NATIVE, "bench", "nullfs.c")):
        yield None, "native/bench/nullfs.c is not here (not a source checkout)"
        return
    r = subprocess.run(["make", "-s", "-C", NATIVE, "build/bench/nullfs"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        yield None, "nullfs did not build: " + (r.stderr.strip().splitlines() or ["?"])[-1]
        return
    d = tempfile.mkdtemp(prefix="memosfs-bench-nullfs-")
    proc = subprocess.Popen([exe, d], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not is_mounted(d):
            if proc.poll() is not None or time.monotonic() > deadline:
                yield None, "nullfs did not mount"
                return
            time.sleep(0.01)
        yield d, ""
    finally:
        if is_mounted(d):
            subprocess.run(["fusermount3", "-u", d], capture_output=True)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.rmdir(d)


@contextlib.contextmanager
def engine_places(mount: str | None, prefix: str = "memosfs-engines-"
                  ) -> Iterator[dict[str, Path]]:
    """Folders for an engine's files, the same bytes in each: "tmpfs"
    (/dev/shm, when there), "disk" ($TMPDIR) and "memosfs" (MNT/agent/session
    of `mount`, or of a fresh mount of 512M made here and stopped after)."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    shm = Path(tempfile.mkdtemp(prefix=prefix, dir="/dev/shm")) \
        if os.path.isdir("/dev/shm") else None
    d = None
    try:
        if mount is None:
            opts = os.environ.get("MEMOSFS_BENCH_MOUNT_OPTS", "")
            d = Daemon(tmp / "mnt", tmp / "ssd", tmp / "log",
                       "capacity=512M" + ("," + opts if opts else ""))
            mount = str(d.path)
        session = Path(mount) / "agent" / "session"
        session.mkdir(parents=True, exist_ok=True)
        (tmp / "disk").mkdir()
        places = {"disk": tmp / "disk", "memosfs": session}
        if shm is not None:
            places["tmpfs"] = shm
        yield places
    finally:
        if d is not None:
            d.stop(lazy=True)
        shutil.rmtree(tmp, ignore_errors=True)
        if shm is not None:
            shutil.rmtree(shm, ignore_errors=True)


def write_file(path: str | os.PathLike, block: memoryview, size: int) -> float:
    """Write `size` bytes (repeating `block`), close included; seconds taken."""
    t0 = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        left = size
        while left:
            left -= os.write(fd, block[:min(left, len(block))])
    finally:
        os.close(fd)
    return time.perf_counter() - t0


def read_file(path: str | os.PathLike, buf: bytearray) -> tuple[float, int]:
    """Read the whole file through `buf`: (seconds, bytes)."""
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


def drop_cached_pages(path: str | os.PathLike) -> None:
    """posix_fadvise(DONTNEED) on one file: its pages leave the page cache
    (on memosfs the next read goes through the daemon)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


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
                drop_cached_pages(p)
            except OSError:
                pass
        return "fadvise"


def files_under(d: str) -> list[str]:
    """Every file below d, sorted."""
    out = []
    for root, _dirs, files in os.walk(d):
        out += [os.path.join(root, f) for f in files]
    return sorted(out)


def stats(mnt: str | os.PathLike) -> dict[str, Any]:
    """The mount's stats.json."""
    return read_stats(mnt)


def set_knob(mnt: str | os.PathLike, name: str, value: object) -> None:
    """Write `value` to .memos/cache/NAME."""
    with open(os.path.join(mnt, ".memos", "cache", name), "w") as f:
        f.write(f"{value}\n")


def percentile(xs: list[float], q: float) -> float:
    """The q-quantile of xs, nearest rank below (0.0 when empty)."""
    if not xs:
        return 0.0
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]
