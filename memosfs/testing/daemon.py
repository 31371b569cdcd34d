"""The one way the harness starts, watches and stops a memosfs daemon.

Owns: `Daemon` (`python -m memosfs memos MNT -f -o ...` as a child process,
mounted when the constructor returns), `is_mounted` (from /proc/mounts, no
request to the mount), `read_stats` (.memos/cache/stats.json, or the text
`stats` file as floats), `memos_mount` (a fresh daemon in a temporary folder,
for benchmarks), and the kill -9 path (`kill9`, which aborts a FUSE
connection through fusectl when SIGKILL alone leaves a hung mount).

Used by tests/conftest.py (its `Mount`), memosfs/testing/faults.py and
memosfs/bench/*.  May call: the standard library only; the daemon is a
separate process reached by its command line, its mountpoint and its pid.

Stopping: `stop()` unmounts (`fusermount3 -u`, then `-u -z` if that did not
take: a file left open), waits for the daemon, then SIGTERM, then SIGKILL,
always by the child's pid.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Protocol, Union

Opts = Union[Mapping[str, object], str, None]


def is_mounted(path: str | os.PathLike) -> bool:
    """True if `path` is a mountpoint now (read from /proc/mounts)."""
    p = os.path.realpath(path)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == p for line in f)


def read_stats(mnt: str | os.PathLike, fmt: str = "json") -> dict[str, Any]:
    """The mount's statistics: fmt "json" is .memos/cache/stats.json as it is;
    fmt "text" is the `stats` file, one `name value` a line, numbers as
    floats (names such as evict_policy left out)."""
    if fmt == "json":
        with open(os.path.join(mnt, ".memos", "cache", "stats.json")) as f:
            return json.load(f)
    if fmt != "text":
        raise ValueError(f"read_stats: fmt is json or text, not {fmt!r}")
    out: dict[str, Any] = {}
    with open(os.path.join(mnt, ".memos", "cache", "stats")) as f:
        for line in f.read().splitlines():
            k, v = line.split()
            try:
                out[k] = float(v)
            except ValueError:          # a name, such as evict_policy
                pass
    return out


def option_string(opts: Opts) -> str:
    """`-o` text from a dict ({"capacity": "64M"} -> capacity=64M) or a string."""
    if not opts:
        return ""
    if isinstance(opts, str):
        return opts.strip(",")
    return ",".join(f"{k}={v}" for k, v in opts.items())


class Daemon:
    """`memosfs memos MNT -f -o ssd=SSD,log=LOG,OPTS` as a child process,
    mounted when built (RuntimeError if it exits or is not mounted within
    `timeout` seconds).  `.path`, `.ssd`, `.log` are Paths; `.proc` the child;
    `.t_start`/`.t_mounted` perf_counter() at the start and once mounted.

    capture: the daemon's stdout and stderr go to a pipe (read into the error
    if it does not mount), else to /dev/null.  stats_format: what `stats()`
    reads by default ("json" or "text", see read_stats).  stop_timeout:
    seconds `stop()` waits for the daemon after unmounting before SIGTERM.
    env: variables added to the daemon's environment (the tests set
    MEMOSFS_CHECK_AT_UNMOUNT=1: every consistency check runs at unmount and
    its verdict goes to the log)."""

    def __init__(self, mnt: str | os.PathLike, ssd: str | os.PathLike,
                 log: str | os.PathLike, opts: Opts = None, timeout: float = 30,
                 capture: bool = False, stats_format: str = "json",
                 stop_timeout: float = 60, env: Optional[Mapping[str, str]] = None) -> None:
        self.path = Path(mnt)
        self.ssd = Path(ssd)
        self.log = Path(log)
        self.stats_format = stats_format
        self.stop_timeout = stop_timeout
        self.path.mkdir(parents=True, exist_ok=True)
        options = ",".join(x for x in (f"ssd={self.ssd}", f"log={self.log}",
                                       option_string(opts)) if x)
        out = subprocess.PIPE if capture else subprocess.DEVNULL
        self.t_start = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "memosfs", "memos", str(self.path),
                                      "-f", "-o", options], stdout=out,
                                     stderr=subprocess.STDOUT if capture else subprocess.DEVNULL,
                                     env={**os.environ, **env} if env else None)
        deadline = time.monotonic() + timeout
        while not is_mounted(self.path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                said = ""
                if capture and self.proc.poll() is not None and self.proc.stdout:
                    said = self.proc.stdout.read().decode(errors="replace")
                self.stop()
                raise RuntimeError(f"memosfs did not mount at {self.path} (see {self.log}): "
                                   f"{said}\n{self.logtext()}")
            time.sleep(0.005)
        self.t_mounted = time.perf_counter()

    def p(self, *parts: str) -> Path:
        """A path under the mountpoint."""
        return self.path.joinpath(*parts)

    def ctl(self, name: str) -> Path:
        """A control file: .memos/cache/NAME."""
        return self.path / ".memos" / "cache" / name

    def stats(self, fmt: Optional[str] = None) -> dict[str, Any]:
        return read_stats(self.path, fmt or self.stats_format)

    def logtext(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def umount(self, lazy: bool = False) -> None:
        """fusermount3 -u (-z when lazy), if it is mounted."""
        if is_mounted(self.path):
            cmd = ["fusermount3", "-u"] + (["-z"] if lazy else []) + [str(self.path)]
            subprocess.run(cmd, stderr=subprocess.DEVNULL)

    def stop(self, lazy: bool = False) -> None:
        """Unmount (cleanly, unless lazy; lazily if that did not take) and wait
        for the daemon; SIGTERM, then SIGKILL by pid only if it hangs."""
        if not lazy:
            self.umount()
        self.umount(lazy=True)
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()

    def kill9(self) -> bool:
        """SIGKILL by pid, then clean up the dead mount (see kill9())."""
        return kill9(self)


@contextlib.contextmanager
def memos_mount(capacity: int | str, opts: str = "") -> Iterator[str]:
    """A fresh memosfs of `capacity` bytes in a temporary folder (its SSD
    folder and log there too); yields the mountpoint, unmounted (lazily) and
    the folder removed on exit."""
    tmp = tempfile.mkdtemp(prefix="memosfs-bench-")
    extra = os.environ.get("MEMOSFS_BENCH_MOUNT_OPTS", "")     # (bench engines --mount-opts)
    opts = ",".join(x for x in (opts, extra) if x)
    try:
        d = Daemon(os.path.join(tmp, "mnt"), os.path.join(tmp, "ssd"),
                   os.path.join(tmp, "log"), f"capacity={capacity}," + opts)
        try:
            yield str(d.path)
        finally:
            d.stop(lazy=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- kill -9

class MountLike(Protocol):
    path: Any                       # the mountpoint
    proc: subprocess.Popen          # the daemon (memosfs ... -f)

    def stop(self) -> None: ...


FUSECTL = "/sys/fs/fuse/connections"


def fuse_connection(path: str | os.PathLike) -> Optional[str]:
    """The fusectl connection number of the FUSE mount at path (its device
    minor, from mountinfo: no request to the mount itself)."""
    p = os.path.realpath(path)
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == p and " - fuse" in line:
                return fields[2].split(":")[1]
    return None


def abort_connection(conn: str) -> bool:
    """echo 1 > /sys/fs/fuse/connections/N/abort (mounting fusectl for the
    moment if it is not); True if it was written."""
    ours = False
    if not os.path.isdir(os.path.join(FUSECTL, conn)) and not is_mounted(FUSECTL):
        ours = subprocess.run(["mount", "-t", "fusectl", "none", FUSECTL],
                              stderr=subprocess.DEVNULL).returncode == 0
    try:
        with open(os.path.join(FUSECTL, conn, "abort"), "w") as f:
            f.write("1")
        return True
    except OSError:
        return False
    finally:
        if ours:
            subprocess.run(["umount", FUSECTL], stderr=subprocess.DEVNULL)


def kill9(m: MountLike, timeout: float = 15, grace: float = 3) -> bool:
    """SIGKILL the daemon by pid, reap it, lazily unmount the dead mount;
    raises if a mount or the process is left behind.

    Returns True when kill -9 alone did not end the daemon: a thread of it
    was waiting, uninterruptibly, on a request to its own mount that the
    dead main thread had read and will never answer, so /dev/fuse stayed
    open and the mount hung; the connection had to be aborted (fusectl)."""
    path = str(m.path)
    conn = fuse_connection(path)
    stuck = False
    if m.proc.poll() is None:
        os.kill(m.proc.pid, signal.SIGKILL)
    try:
        m.proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        stuck = True
        if conn is None or not abort_connection(conn):
            raise RuntimeError(f"daemon {m.proc.pid} survives kill -9 and the FUSE "
                               f"connection {conn} of {path} cannot be aborted")
        m.proc.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while is_mounted(path):
        subprocess.run(["fusermount3", "-u", "-z", path], stderr=subprocess.DEVNULL)
        if not is_mounted(path):
            break
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} is still mounted after kill -9 and fusermount3 -u -z")
        time.sleep(0.05)
    return stuck
