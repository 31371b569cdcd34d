"""The remote tier's write-behind queue: uploads and deletions in a thread.

put_async(key, source) queues an upload (a newer one of the same key replaces
it; a full queue turns it into a deletion, remote_queue_dropped);
delete_async and delete_session_async queue deletions, which go first.  One
writer thread takes the jobs in order and runs them with the tier's
synchronous put_sync / delete_sync / names; wait(key) and wait_all() are what
fsync and flush wait on; pending() and last_failed() say where a key stands.

Owns (as WriteBehindMixin, one of RemoteTier's bases): the queue state
(`_q`, `_puts`, `_dels`, `_sess_dels`, `_inflight`, `_failed`), created by
RemoteTier.__init__, and the writer thread's loop.  Calls the tier's
put_sync, delete_sync, names, _count and _warn (tier.py, cluster.py) and
wire (_k).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Callable, Optional

from memosfs.store.remote.wire import _k

log = logging.getLogger("memosfs.store.remote")

Source = Callable[[], Optional[tuple[Any, int, dict, Optional[Callable[[], None]]]]]


class WriteBehindMixin:
    """The write-behind queue of RemoteTier (see the module docstring)."""

    config: Any
    _q: threading.Condition
    _puts: "collections.OrderedDict[bytes, Source]"
    _dels: "collections.OrderedDict[bytes, None]"
    _sess_dels: list[bytes]
    _inflight: Optional[bytes]
    _failed: set[bytes]
    _stop_writer: threading.Event

    def put_async(self, key: bytes, source: Source) -> None:
        """Queue an upload of key; source() runs in the writer thread and
        returns (payload, version, meta, release-or-None), or None when there
        is nothing to upload any more (the remote copy is then deleted, so
        that no older version stays there).  A newer put of the same key
        replaces a queued one.  When the queue is full the upload is dropped
        (remote_queue_dropped) and replaced by a deletion of the remote copy."""
        with self._q:
            self._dels.pop(key, None)
            self._failed.discard(key)
            if key in self._puts or len(self._puts) < self.config.queue_max:
                self._puts[key] = source
            else:
                self._dels[key] = None
                self._count("remote_queue_dropped")
                self._warn("queue", "upload queue full (%d): %s not uploaded; its remote "
                           "copy is deleted instead", self.config.queue_max, _k(key))
            self._q.notify_all()

    def delete_async(self, key: bytes) -> None:
        with self._q:
            self._puts.pop(key, None)
            self._failed.discard(key)
            self._dels[key] = None
            self._q.notify_all()

    def delete_session_async(self, session: bytes) -> None:
        """Delete every slot the index lists for `agent/session`."""
        with self._q:
            self._sess_dels.append(session)
            self._q.notify_all()

    def _pending_delete(self, key: bytes) -> bool:
        with self._q:
            return key in self._dels

    def pending(self, key: bytes) -> Optional[str]:
        """'queued' (an upload or deletion not started), 'inflight', or None."""
        with self._q:
            if key in self._puts or key in self._dels:
                return "queued"
            if self._inflight == key:
                return "inflight"
        return None

    def last_failed(self, key: bytes) -> bool:
        """The last upload or deletion of key failed (and none is queued)."""
        with self._q:
            return key in self._failed

    def wait(self, key: bytes, timeout: Optional[float] = None) -> bool:
        """Until key's queued upload or deletion is done; True if it succeeded
        (or none was queued), False on failure or timeout."""
        deadline = time.monotonic() + (timeout if timeout is not None
                                       else self._default_wait())
        with self._q:
            while key in self._puts or key in self._dels or self._inflight == key:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._q.wait(left)
            return key not in self._failed

    def wait_all(self, timeout: Optional[float] = None) -> bool:
        """Until the queue is empty; True if it drained in time."""
        deadline = time.monotonic() + (timeout if timeout is not None
                                       else self._default_wait() * 4)
        with self._q:
            while self._puts or self._dels or self._sess_dels or self._inflight is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._q.wait(left)
            return True

    def _default_wait(self) -> float:
        return 4 * self.config.timeout + self.config.ack_timeout + 2

    def _writer_loop(self) -> None:
        while True:
            with self._q:
                while not (self._dels or self._sess_dels or self._puts):
                    if self._stop_writer.is_set():
                        return
                    self._q.wait(0.5)
                if self._dels:
                    key, _ = self._dels.popitem(last=False)
                    job: tuple = ("del", key)
                elif self._sess_dels:
                    sess = self._sess_dels.pop(0)
                    key = b""
                    job = ("sess", sess)
                else:
                    key, source = self._puts.popitem(last=False)
                    job = ("put", key, source)
                self._inflight = key if key else None
            ok = False
            try:
                ok = self._run(job)
            except Exception:
                log.exception("remote writer")
            finally:
                with self._q:
                    self._inflight = None
                    if key:
                        if ok:
                            self._failed.discard(key)
                        elif key not in self._puts and key not in self._dels:
                            self._failed.add(key)
                    self._q.notify_all()

    def _run(self, job: tuple) -> bool:
        if job[0] == "del":
            return self.delete_sync(job[1])
        if job[0] == "sess":
            names = self.names(job[1])
            for n in names or []:
                self.delete_sync(job[1] + b"/" + n)
            return names is not None
        _, key, source = job
        got = source()
        if got is None:
            return self.delete_sync(key)
        payload, version, meta, release = got
        try:
            return self.put_sync(key, payload, version, meta) is not None
        finally:
            if release is not None:
                release()

