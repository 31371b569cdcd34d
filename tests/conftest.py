"""Fixtures: real mounts in temporary directories, always unmounted.

`mount()` starts `memosfs ... -f` as a child process, waits until the
mountpoint is a mount, and on teardown unmounts (lazily if a test left a
file open) and stops the child by its pid.  Mounted tests skip with a reason
where FUSE is not available.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

FUSE_REASON = None
if not os.path.exists("/dev/fuse"):
    FUSE_REASON = "/dev/fuse is missing"
elif shutil.which("fusermount3") is None:
    FUSE_REASON = "fusermount3 is not installed"

needs_fuse = pytest.mark.skipif(FUSE_REASON is not None, reason=FUSE_REASON or "")


def is_mounted(path: Path) -> bool:
    p = os.path.realpath(path)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == p for line in f)


class Mount:
    """A running memosfs: `.path` is the mountpoint, `.proc` the daemon."""

    def __init__(self, tmp: Path, opts: dict[str, object], name: str) -> None:
        self.tmp = tmp
        self.path = tmp / name
        opts = dict(opts)
        self.ssd = Path(str(opts.pop("ssd", tmp / (name + "-ssd"))))
        self.log = tmp / (name + ".log")
        self.path.mkdir()
        optlist = [f"ssd={self.ssd}", f"log={self.log}"]
        optlist += [f"{k}={v}" for k, v in opts.items()]
        cmd = [sys.executable, "-m", "memosfs", "memos", str(self.path), "-f",
               "-o", ",".join(optlist)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not is_mounted(self.path):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                out = self.proc.stdout.read().decode() if self.proc.poll() is not None else ""
                self.stop()
                raise RuntimeError(f"memosfs did not mount: {out}\n{self.logtext()}")
            time.sleep(0.05)

    def p(self, *parts: str) -> Path:
        return self.path.joinpath(*parts)

    def ctl(self, name: str) -> Path:
        return self.path / ".memos" / "cache" / name

    def stats(self) -> dict[str, float]:
        out = {}
        for line in self.ctl("stats").read_text().splitlines():
            k, v = line.split()
            try:
                out[k] = float(v)
            except ValueError:          # a name, such as evict_policy
                pass
        return out

    def logtext(self) -> str:
        try:
            return self.log.read_text()
        except OSError:
            return ""

    def umount(self, lazy: bool = False) -> None:
        if is_mounted(self.path):
            cmd = ["fusermount3", "-u"] + (["-z"] if lazy else []) + [str(self.path)]
            subprocess.run(cmd, stderr=subprocess.DEVNULL)

    def stop(self) -> None:
        """Unmount and wait for the daemon; kill it by pid only as a last resort."""
        self.umount()
        if is_mounted(self.path):
            self.umount(lazy=True)
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        if self.proc.stdout:
            self.proc.stdout.close()


@pytest.fixture
def make_mount(tmp_path):
    """make_mount(capacity="64M", evict_batch=1, ...) -> Mount; unmounted at
    teardown.  world=True mounts where every uid can reach the mountpoint."""
    if FUSE_REASON:
        pytest.skip(FUSE_REASON)
    mounts: list[Mount] = []
    public: list[str] = []

    def factory(world: bool = False, **opts: object) -> Mount:
        base = tmp_path
        if world:
            public.append(tempfile.mkdtemp(prefix="memosfs-test-"))
            os.chmod(public[-1], 0o755)
            base = Path(public[-1])
        m = Mount(base, opts, f"mnt{len(mounts)}")
        mounts.append(m)
        return m

    yield factory
    for m in mounts:
        m.stop()
    for d in public:
        shutil.rmtree(d, ignore_errors=True)
    for m in mounts:
        text = m.logtext()
        assert "Traceback" not in text, f"daemon logged a traceback:\n{text}"


@pytest.fixture
def mnt(make_mount):
    return make_mount(capacity="64M")
