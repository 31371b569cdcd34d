"""The kernel page cache, seen from the daemon: pushing published versions
into it (write-through), and refreshing the kernel's attributes of a slot
without the daemon ever sending a request to its own mount.

Owns: the pusher's worker threads and counters, the refresher child process.
May call: the kernel notifications it is given (notify_store,
invalidate_inode, an attribute refresh), and a slot's pusher interface
(`Slot.claim_push`, `own_cache`, `push_done`, `shows`: memosfs/fuse/nodes.py);
it changes no other field of a slot."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from typing import TYPE_CHECKING, Callable, Optional

import trio

from memosfs import _native

if TYPE_CHECKING:
    from memosfs.fuse.nodes import Slot

log = logging.getLogger("memosfs.fuse.pagecache")

__all__ = ["PageCachePusher", "BytesSource", "Refresher"]


class PageCachePusher:
    """Copies each newly published version into the kernel page cache, so
    local readers (read(2) and mmap) find it there without a request, as
    they would on a local filesystem after a write.  close(2) and fsync(2)
    return once the push is done (write-through); the bytes are pushed from a
    worker thread while the trio loop goes on serving requests, because the
    kernel may make notify_store wait for a page that a read request has
    locked.

    Safety rests on the fs invariants: while a push is in flight on an inode,
    a publish gives the name a fresh inode instead of changing this one
    (`Slot.pushing`), so every page pushed into an inode belongs to the
    version that its readers read."""

    CHUNK = 1 << 20                     # bytes per notify_store
    SPLIT = 8 << 20                     # versions this large push on two threads

    def __init__(self, store_fn: Callable[[int, int, bytes], None],
                 invalidate_fn: Callable[[int], None],
                 refresh_fn: Callable[["Slot"], None]) -> None:
        self._store = store_fn
        self._invalidate = invalidate_fn
        self._refresh = refresh_fn
        self._stopping = False
        self._count_lock = threading.Lock()     # pushed_bytes: several threads add
        self.limiter = trio.CapacityLimiter(2)
        self.pushed_bytes = 0           # bytes stored into the page cache
        self.pushes = 0                 # versions pushed (wholly or in part)
        self.outstanding = 0            # claimed and not done (trio thread)

    def claim(self, node: "Slot", ref: "_native.Ref") -> tuple:
        """Mark a push of ref's version into node as in flight (trio thread)."""
        self.outstanding += 1
        return (node, ref, node.claim_push(ref.version))

    async def run(self, job: tuple) -> None:
        """Push a claimed version; large ones in two halves on two threads
        (the writer waits on close meanwhile, so its core is free)."""
        node, ref, stale = job
        try:
            try:
                await self._push(node, ref, stale)
            except* (OSError, ValueError) as group:
                # (the kernel forgot the inode, the version went: the readers
                # fetch from the daemon)
                log.debug("page-cache push into inode %d stopped: %s", node.ino,
                          group.exceptions[0])
        except Exception:
            # run() is also a system task: nothing may escape it (it would
            # stop the daemon)
            log.warning("page-cache push into inode %d failed", node.ino, exc_info=True)
        finally:
            ref.release()
            node.push_done()
            self.outstanding -= 1

    async def _push(self, node: "Slot", ref: "_native.Ref", stale: bool) -> None:
        await self._thread(self._prepare, node, ref, stale)
        size = ref.size
        if size < self.SPLIT:
            await self._thread(self._push_range, node, ref, 0, size)
        else:
            mid = (size // 2) // self.CHUNK * self.CHUNK
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._thread, self._push_range, node, ref, 0, mid)
                nursery.start_soon(self._thread, self._push_range, node, ref, mid, size)
        self.pushes += 1

    async def _thread(self, fn, *args) -> None:
        await trio.to_thread.run_sync(fn, *args, limiter=self.limiter,
                                      abandon_on_cancel=True)

    def _prepare(self, node: "Slot", ref: "_native.Ref", stale: bool) -> None:
        # The kernel drops an inode's pages when it sees a new mtime
        # (auto_inval_data), so let it see the new attributes first.
        self._refresh(node)
        if stale:
            # pages of an older version may be cached: drop them, then claim
            self._invalidate(node.ino)
            node.own_cache(ref.version)

    def _push_range(self, node: "Slot", ref: "_native.Ref", off: int, end: int) -> None:
        version = ref.version
        while off < end:
            if self._stopping or not node.shows(version):
                return
            with ref.view(off, min(self.CHUNK, end - off)) as data:  # no copy
                n = len(data)
                self._store(node.ino, off, data)
            off += n
            with self._count_lock:
                self.pushed_bytes += n

    def close(self) -> None:
        self._stopping = True


class BytesSource:
    """A version's logical bytes as the pusher reads them (quantized slots):
    the pin keeps the version current for the pusher's checks."""

    def __init__(self, data: bytes, pin: "_native.Ref") -> None:
        self._data = memoryview(data)
        self._pin = pin
        self.version = pin.version
        self.size = len(data)

    def view(self, off: int, n: int) -> memoryview:
        return self._data[off:off + n]

    def release(self) -> None:
        self._pin.release()


_REFRESHER_CODE = r"""
import os, sys
inp, out = sys.stdin.buffer, sys.stdout.buffer
buf = b""
while True:
    chunk = os.read(inp.fileno(), 65536)
    if not chunk:
        break
    buf += chunk
    while b"\0" in buf:
        path, buf = buf.split(b"\0", 1)
        try:
            os.stat(path)
            out.write(b"1\n")
        except OSError:
            out.write(b"0\n")
        out.flush()
"""


class Refresher:
    """A child process that stats paths on our own mount for us.

    The daemon must never send requests to its own mount from one of its own
    threads: if the daemon is killed while such a request is in flight, that
    thread waits for an answer nobody will give, and the process can never
    finish exiting.  A child process holds no /dev/fuse descriptor, so when
    the daemon dies the connection aborts and the child's stat simply fails."""

    def __init__(self) -> None:
        self._proc: Optional[subprocess.Popen] = None
        self._lock = threading.Lock()

    def stat(self, path: str) -> bool:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._proc = subprocess.Popen([sys.executable, "-c", _REFRESHER_CODE],
                                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                              close_fds=True)
            try:
                self._proc.stdin.write(os.fsencode(path) + b"\0")
                self._proc.stdin.flush()
                return self._proc.stdout.readline() == b"1\n"
            except (OSError, ValueError):
                return False

    def close(self) -> None:
        """Stop the child at once (no lock: a stat may be waiting on a loop
        that no longer runs; killing the child ends it)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.kill()
            proc.wait()
