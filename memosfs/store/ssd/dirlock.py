"""The SSD directory's lock: one daemon at a time (docs/ssd-format.md, "One
daemon per SSD directory")."""

from __future__ import annotations

import logging
import os
from typing import Optional

from memosfs.private import open_private

log = logging.getLogger("memosfs.store.ssd")


# ---------------------------------------------------------------- the directory's lock
#
# One daemon at a time owns an SSD directory (and the federated state under
# it): two would overwrite each other's order.json, namespace.json and slot
# files.  The owner holds flock(LOCK_EX) on `.lock` in the directory for its
# whole life, on a descriptor that is close-on-exec (no child it spawns keeps
# it); the kernel drops the lock when the daemon dies, however it dies, so a
# crash never leaves a stale lock.  The file says who holds it (`pid
# mountpoint`), for the message another daemon gives when it is refused.

LOCK_NAME = ".lock"


class DirectoryInUse(Exception):
    """Another process holds the directory's lock: `pid` and `mountpoint`
    as it wrote them (None when it had not written them yet)."""

    def __init__(self, root: str, pid: Optional[int], mountpoint: Optional[str]) -> None:
        self.root, self.pid, self.mountpoint = root, pid, mountpoint
        who = f"pid {pid}" if pid else "another process"
        where = f" (mounted at {mountpoint})" if mountpoint else ""
        super().__init__(f"the SSD directory {root} is in use by {who}{where}")


class DirLock:
    """The exclusive lock of a directory (see above).  `acquire` takes it or
    raises DirectoryInUse; it only opens (creating if missing) the lock file
    and reads it, so a refused daemon changes nothing in the directory."""

    def __init__(self, root: str, fd: int) -> None:
        self.root, self.fd = root, fd

    @classmethod
    def acquire(cls, root: str, mountpoint: str, wait: float = 5.0,
                still_serving=None) -> "DirLock":
        """Lock root/.lock and write our pid and mountpoint into it.  A holder
        may be a daemon that is still exiting: retry for up to `wait` seconds,
        unless still_serving(holder's mountpoint) says the holder serves a
        mount (then refuse at once)."""
        import fcntl
        import time
        root = os.path.abspath(root)
        path = os.path.join(root, LOCK_NAME)
        fd = _open_lock_file(path)
        deadline = time.monotonic() + wait
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    pid, mnt = _read_holder(fd)
                    if (time.monotonic() >= deadline
                            or (pid and mnt and still_serving and still_serving(mnt))):
                        raise DirectoryInUse(root, pid, mnt) from None
                    time.sleep(0.05)
            lock = cls(root, fd)
            lock.note(os.getpid(), mountpoint)
            return lock
        except BaseException:
            os.close(fd)
            raise

    def note(self, pid: int, mountpoint: str) -> None:
        """Say who holds the lock (again after a fork: the daemon's pid)."""
        data = f"{pid} {mountpoint}\n".encode()
        try:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, data, 0)
        except OSError as e:            # only the refusal message loses the pid
            log.warning("ssd: cannot write the holder into %s: %s",
                        os.path.join(self.root, LOCK_NAME), e)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)           # drops the lock
            self.fd = -1


def _open_lock_file(path: str) -> int:
    """Open the lock file read-write and close-on-exec; create it (0600) only
    if it is missing: a refused daemon must not change it."""
    for _ in range(10):
        try:
            return os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            pass
        try:
            return open_private(path, os.O_RDWR | os.O_EXCL | os.O_NOFOLLOW)
        except FileExistsError:         # another daemon made it just now
            continue
    return os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)


def _read_holder(fd: int) -> tuple[Optional[int], Optional[str]]:
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    except OSError:
        return None, None
    pid, _, mnt = text.partition(" ")
    try:
        return int(pid), mnt or None
    except ValueError:
        return None, None
