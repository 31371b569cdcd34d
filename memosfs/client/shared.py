"""A client-side cache of shared slots that follows the coherence protocol.

An agent that reads the same slots again and again (a shared system prompt,
a tool context) keeps them open: the open handle is its Shared copy, and a
re-read is a `pread` that the kernel serves from its page cache without a
request to the daemon.  When another agent rewrites a slot, memosfs marks
the handle (POLLPRI); a watcher thread sees it at once and closes the handle,
which acknowledges the invalidation (so a strong-protocol writer is not kept
waiting), and the next read opens the new version.

    from memosfs.client.shared import SharedSlots
    with SharedSlots() as slots:
        prefix = slots.read("/mnt/memos/team/s/system-prompt")   # bytes

The watcher acknowledges with `ioctl(fd, MEMOS_IOC_ACK)` before it closes:
the ioctl returns once memosfs has counted the acknowledgement (a close only
sends it on its way), and it needs no write permission, unlike
`setfattr -n user.memos.ack`, so a read-only holder (a slot of mode 0444
owned by another uid) can use it on the descriptor it reads from:

    import fcntl
    from memosfs.client.shared import MEMOS_IOC_ACK
    fcntl.ioctl(fd, MEMOS_IOC_ACK)      # EINVAL: nothing to acknowledge

`read` always returns a whole version (never a torn or mixed one).  Under
protocol 1 a read may return the previous version until the invalidation
arrives (at most `coherence_batch_ms` after the writer's open); under
protocol 2 a writer's open returns only after this cache has dropped its copy.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import threading
from typing import Optional

from memosfs.abi import MEMOS_IOC_ACK
from memosfs.client.mounts import check_path

__all__ = ["SharedSlots", "MEMOS_IOC_ACK", "ack"]


def ack(fd: int) -> bool:
    """Acknowledge the invalidation of the slot open on fd.  False when there
    was none to acknowledge (EINVAL); other errors raise OSError."""
    try:
        fcntl.ioctl(fd, MEMOS_IOC_ACK)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return False
        raise
    return True


class SharedSlots:
    """Open handles kept per path, dropped when memosfs invalidates them."""

    def __init__(self, max_open: int = 256) -> None:
        self.max_open = max_open
        self._lock = threading.Lock()
        self._fds: dict[str, int] = {}          # path -> fd (our Shared copy)
        self._paths: dict[int, str] = {}
        self._ep = select.epoll()
        self._wake_r, self._wake_w = os.pipe()
        self._ep.register(self._wake_r, select.EPOLLIN)
        self.invalidations = 0
        self.opens = 0
        self._closed = False
        self._thread = threading.Thread(target=self._watch, name="memosfs-shared",
                                        daemon=True)
        self._thread.start()

    # ---- reading ----

    def read(self, path: str) -> bytes:
        """The slot's bytes: from our open copy, or a fresh open."""
        while True:
            with self._lock:
                fd = self._fds.get(path)
                if fd is not None:
                    try:
                        size = os.fstat(fd).st_size
                        return os.pread(fd, size + 1, 0) if size else b""
                    except OSError as e:
                        self._revoked(path, e)
                        continue
            self._open(path)

    def readinto(self, path: str, buf: bytearray) -> int:
        """Read the slot into buf; returns the bytes read."""
        while True:
            with self._lock:
                fd = self._fds.get(path)
                if fd is not None:
                    try:
                        return os.preadv(fd, [buf], 0)
                    except OSError as e:
                        self._revoked(path, e)
                        continue
            self._open(path)

    def _revoked(self, path: str, e: OSError) -> None:
        """A read failed: ESTALE means memosfs revoked our copy (we did not
        acknowledge in time); drop it and open again.  Other errors raise."""
        if e.errno != errno.ESTALE:
            raise e
        self._drop(path)
        self.invalidations += 1

    def forget(self, path: str) -> None:
        """Drop our copy (e.g. before rewriting the slot ourselves)."""
        with self._lock:
            self._drop(path)

    def _open(self, path: str) -> None:
        # Outside the lock: under protocol 2 an open may wait for a writer,
        # and the watcher must meanwhile be free to acknowledge for us.
        check_path(path)                        # (NotOnMount: the mount is not there)
        fd = os.open(path, os.O_RDONLY)
        with self._lock:
            if path in self._fds:                 # another thread was first
                os.close(fd)
                return
            if len(self._fds) >= self.max_open:
                self._drop(next(iter(self._fds)))     # the oldest
            self._fds[path] = fd
            self._paths[fd] = path
            self._ep.register(fd, select.EPOLLPRI)
            self.opens += 1

    def _drop(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is None:
            return
        self._paths.pop(fd, None)
        try:
            self._ep.unregister(fd)
        except OSError:
            pass
        os.close(fd)                              # closing acknowledges

    # ---- the watcher ----

    def _watch(self) -> None:
        while not self._closed:
            try:
                events = self._ep.poll(1.0)
            except OSError:
                return
            for fd, ev in events:
                if fd == self._wake_r:
                    continue
                if ev & (select.EPOLLPRI | select.EPOLLERR | select.EPOLLHUP):
                    with self._lock:
                        path = self._paths.get(fd)
                        if path is not None and self._stale(fd):
                            self._ack(fd)
                            self._drop(path)
                            self.invalidations += 1

    @staticmethod
    def _stale(fd: int) -> bool:
        """Whether fd still reports the invalidation: a reader that found its
        copy revoked may have dropped it and opened again meanwhile, under
        the same descriptor number."""
        p = select.poll()
        p.register(fd, select.POLLPRI)
        try:
            return bool(p.poll(0))
        except OSError:
            return True

    def _ack(self, fd: int) -> None:
        """Acknowledge at once (the close that follows counts too, but only
        once the kernel sends its release)."""
        try:
            ack(fd)
        except OSError:
            pass                                  # not memosfs, or an older one

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        os.write(self._wake_w, b"x")
        self._thread.join()
        with self._lock:
            for path in list(self._fds):
                self._drop(path)
        self._ep.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def __enter__(self) -> "SharedSlots":
        return self

    def __exit__(self, *exc: object) -> Optional[bool]:
        self.close()
        return None
