"""Power losses for tests: LazyFS, and a file system shut down on a loop device.

LazyFS (a FUSE file system with a page cache of its own, public source
github.com/dsrhaslab/lazyfs) keeps every write in that cache until the file
is fsync'd; `lazyfs::clear-cache` written to its command FIFO drops what
was not, as a power loss drops the kernel's page cache.  Metadata calls
(create, rename, unlink, mkdir, setxattr) go straight to the folder below
it, so under LazyFS a rename is kept at once while the bytes it names may
be lost: the harshest order a power loss can leave.  It is built outside
the repository (docs/reliability.md says how); the tests find its binary
in MEMOSFS_LAZYFS or as `lazyfs` on PATH, and skip, saying so, without it.

`ShutdownFS` is the other power loss: a file system (xfs, or ext4 with
noauto_da_alloc) made on a loop device, shut down with `xfs_io -x -c
shutdown` (FS_IOC_SHUTDOWN without a log flush: what was not committed
to its log is gone, data and metadata alike, renames and unlinks
included), then unmounted and mounted again (log recovery).  It needs
root, /dev/loop-control and the file system's mkfs; the tests skip
without them.

Both run as the tests' own child processes or mounts, stopped by pid or
mountpoint at teardown.
"""

from __future__ import annotations

import errno
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

ENV = "MEMOSFS_LAZYFS"


def lazyfs_binary() -> Optional[str]:
    """The LazyFS binary: $MEMOSFS_LAZYFS, else `lazyfs` on PATH; None if neither."""
    path = os.environ.get(ENV) or shutil.which("lazyfs")
    return path if path and os.access(path, os.X_OK) else None


def lazyfs_reason() -> Optional[str]:
    """Why LazyFS tests cannot run here (None: they can)."""
    if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        return "FUSE is not available (/dev/fuse, fusermount3)"
    if lazyfs_binary() is None:
        return (f"LazyFS is not built: set {ENV} to its binary (lazyfs/build/lazyfs of "
                f"github.com/dsrhaslab/lazyfs, built as docs/reliability.md says)")
    return None


def _mounted(path: str | os.PathLike) -> bool:
    p = os.path.realpath(path)
    with open("/proc/mounts") as f:
        return any(line.split()[1] == p for line in f)


class LazyFS:
    """A LazyFS over `root`, mounted at `mnt` (both made if missing); its
    config, FIFOs and log in `work`.  start() mounts it, power_loss() drops
    its unsynced writes and mounts it afresh (a new cache: a reboot),
    stop() unmounts it."""

    def __init__(self, root: Path, mnt: Path, work: Path, cache: str = "256mb") -> None:
        self.root, self.mnt, self.work = Path(root), Path(mnt), Path(work)
        self.binary = lazyfs_binary()
        if self.binary is None:
            raise RuntimeError(lazyfs_reason())
        for d in (self.root, self.mnt, self.work):
            d.mkdir(parents=True, exist_ok=True)
        self.fifo = self.work / "faults.fifo"
        self.done = self.work / "done.fifo"
        self.log = self.work / "lazyfs.log"
        self.config = self.work / "lazyfs.toml"
        self.config.write_text(
            "[faults]\n"
            f'fifo_path="{self.fifo}"\n'
            f'fifo_path_completed="{self.done}"\n'
            "[cache]\napply_eviction=false\n"
            f'[cache.simple]\ncustom_size="{cache}"\nblocks_per_page=1\n'
            f'[filesystem]\nlog_all_operations=false\nlogfile="{self.log}"\n')
        self.proc: Optional[subprocess.Popen] = None
        self._done_fd = -1
        self.clears = 0

    def start(self, timeout: float = 60) -> None:
        for f in (self.fifo, self.done):
            try:
                os.unlink(f)
            except FileNotFoundError:
                pass
        out = open(self.work / "lazyfs.out", "ab")
        try:
            self.proc = subprocess.Popen(
                # (the config named relative to its folder: LazyFS takes a
                # path that holds "-o" anywhere, as pytest's folders do, for
                # an option and reads a default config instead)
                [self.binary, str(self.mnt), "--config-path", self.config.name,
                 "-o", "allow_other", "-o", "modules=subdir", "-o", f"subdir={self.root}",
                 "-f"], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                cwd=self.work)
        finally:
            out.close()
        deadline = time.monotonic() + timeout
        # its command thread opens the completion FIFO for writing, which
        # waits for a reader: open ours as soon as the FIFO is there
        while self._done_fd < 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"LazyFS did not start: {self._tail()}")
            try:
                self._done_fd = os.open(self.done, os.O_RDONLY | os.O_NONBLOCK)
            except FileNotFoundError:
                time.sleep(0.02)
        while not _mounted(self.mnt):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"LazyFS did not mount at {self.mnt}: {self._tail()}")
            time.sleep(0.02)

    def _tail(self) -> str:
        try:
            return (self.work / "lazyfs.out").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def clear_cache(self, timeout: float = 60) -> None:
        """Drop every write not fsync'd (lazyfs::clear-cache), and wait until
        LazyFS says it is done."""
        fd = os.open(self.fifo, os.O_WRONLY)
        try:
            os.write(fd, b"lazyfs::clear-cache\n")
        finally:
            os.close(fd)
        got = b""
        deadline = time.monotonic() + timeout
        while b"finished::clear-cache" not in got:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError("LazyFS did not finish clearing its cache")
            r, _, _ = select.select([self._done_fd], [], [], min(left, 0.5))
            if r:
                try:
                    got += os.read(self._done_fd, 4096)
                except BlockingIOError:
                    pass
        self.clears += 1

    def power_loss(self) -> None:
        """What a power loss leaves: the unsynced writes dropped, then LazyFS
        mounted again with an empty cache (nothing of the old one served).
        Whatever used the mount must be gone (the daemon killed)."""
        self.clear_cache()
        self.stop()
        self.start()

    def stop(self) -> None:
        if self._done_fd >= 0:
            os.close(self._done_fd)
            self._done_fd = -1
        if self.proc is None:
            return
        deadline = time.monotonic() + 30
        while _mounted(self.mnt) and time.monotonic() < deadline:
            if subprocess.run(["fusermount3", "-u", str(self.mnt)],
                              stderr=subprocess.DEVNULL).returncode != 0:
                time.sleep(0.1)
        if _mounted(self.mnt):
            subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)],
                           stderr=subprocess.DEVNULL)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


# ---------------------------------------------------------------- a loop device

MKFS = {"xfs": ["mkfs.xfs", "-q", "-f"], "ext4": ["mkfs.ext4", "-q", "-F"]}


def shutdown_reason(fstype: str) -> Optional[str]:
    """Why ShutdownFS(fstype) cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (a loop device, mount)"
    if not os.path.exists("/dev/loop-control"):
        return "no /dev/loop-control"
    for tool in (MKFS[fstype][0], "xfs_io", "losetup"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install xfsprogs)"
    return None


class ShutdownFS:
    """`fstype` on a loop device over an image file of `size` in `work`,
    mounted at `mnt` with `options`; power_loss() shuts it down without
    flushing its log, unmounts it and mounts it again."""

    def __init__(self, work: Path, fstype: str, options: str = "", size: str = "768M") -> None:
        self.work = Path(work)
        self.work.mkdir(parents=True, exist_ok=True)
        self.fstype, self.options = fstype, options
        self.image = self.work / f"{fstype}.img"
        self.mnt = self.work / f"{fstype}-mnt"
        self.mnt.mkdir(exist_ok=True)
        subprocess.run(["truncate", "-s", size, str(self.image)], check=True)
        self.loop = subprocess.run(["losetup", "-f", "--show", str(self.image)], check=True,
                                   capture_output=True, text=True).stdout.strip()
        try:
            subprocess.run(MKFS[fstype] + [self.loop], check=True, capture_output=True)
        except BaseException:
            self._detach()
            raise
        self.shutdowns = 0

    def start(self) -> None:
        cmd = ["mount", "-t", self.fstype] + (["-o", self.options] if self.options else []) \
            + [self.loop, str(self.mnt)]
        subprocess.run(cmd, check=True, capture_output=True)

    def power_loss(self) -> None:
        subprocess.run(["xfs_io", "-x", "-c", "shutdown", str(self.mnt)], check=True,
                       capture_output=True)
        self.shutdowns += 1
        self._umount()
        self.start()

    def _umount(self) -> None:
        deadline = time.monotonic() + 30
        while _mounted(self.mnt):
            r = subprocess.run(["umount", str(self.mnt)], capture_output=True)
            if r.returncode == 0:
                break
            if time.monotonic() > deadline:
                subprocess.run(["umount", "-l", str(self.mnt)], capture_output=True)
                break
            time.sleep(0.2)

    def _detach(self) -> None:
        subprocess.run(["losetup", "-d", self.loop], capture_output=True)

    def stop(self) -> None:
        self._umount()
        self._detach()
        try:
            self.image.unlink()
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise
