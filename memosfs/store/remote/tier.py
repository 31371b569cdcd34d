"""RemoteTier: slots on a Redis Cluster that several mounts share.

The package docstring (__init__.py) says what the tier does; this module is
its facade and its write path:

Write: the chunks are SET with an expiry, in pipelines; then one MULTI/EXEC on
the manifest's master replaces the manifest, PERSISTs the chunks and returns
the header it replaced (GETRANGE), whose chunks are deleted afterwards.  A
reader therefore sees a whole old version or a whole new one; an upload cut
short leaves chunks that expire.  With `durable`, the writer also WAITs for
one replica when the master has one.  A write then announces itself
(pubsub.py's _announce) and records the slot in its session's index.

Owns: RemoteTier, its state (created in __init__ here, used by its bases),
its threads' lifecycle, statistics() and its record RemoteStats, and the
synchronous writes (put_sync, delete_sync).  Its bases are the other
seams: ReadMixin (reads.py: stat, get, names), ClusterMixin (cluster.py:
connections, node health, the mount check), PubSubMixin (pubsub.py:
versions told, announcements, acknowledgements), WriteBehindMixin
(writebehind.py: the upload queue).
Calls url (parse_url), wire (keys, manifests) and memosfs._native (crc32c).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional

from memosfs import _native
from memosfs.stats import Record, counter, gauge
from memosfs.store.remote.cluster import ClusterMixin, _Failed, _Unavailable
from memosfs.store.remote.pubsub import PubSubMixin
from memosfs.store.remote.reads import ReadMixin
from memosfs.store.remote.url import RemoteConfig, _pre, parse_url
from memosfs.store.remote.wire import (ACK_CHANNEL, CHANNEL, CHUNK_TTL_S, FIXED, PEERS_KEY,
                                       PIPE_BYTES, TOMBSTONE_TTL_S, RemoteEntry, RemoteVersion,
                                       _k, _old_chunks, _session_and_name, chunk_key,
                                       encode_header, index_key, manifest_key)
from memosfs.store.remote.writebehind import Source, WriteBehindMixin

log = logging.getLogger("memosfs.store.remote")



@dataclass(frozen=True)
class RemoteStats(Record):
    """The remote tier (with -o remote=).

    Counted by the tier (its counters are the `_count` calls of this package),
    except remote_drops and remote_promotions, which the Store counts and
    fills in (Store.remote_statistics)."""
    remote_hits: int = counter("slots read from the remote tier")
    remote_misses: int = counter("remote reads that found no slot")
    remote_bytes_in: int = counter("bytes read from the remote tier")
    remote_bytes_out: int = counter("bytes uploaded to the remote tier")
    remote_errors: int = counter("remote requests that failed (logged)")
    remote_corrupt: int = counter("remote slots that failed their checks (not served)")
    remote_partial: int = counter("remote reads that found a chunk missing (not served)")
    remote_stale: int = counter("remote versions older than one announced (not served)")
    remote_skipped: int = counter("remote requests skipped: not connected or node backing off")
    remote_queue_dropped: int = counter("uploads dropped because the upload queue was full")
    remote_invalidations: int = counter("announcements of a newer version received")
    remote_puts: int = counter("versions uploaded")
    remote_deletes: int = counter("deletions sent")
    remote_put_failures: int = counter("uploads that failed")
    remote_reconnects: int = counter("reconnections of the announcement subscription")
    remote_acks: int = counter("acknowledgements of an announcement received (strong mode)")
    remote_ack_timeouts: int = counter("announcements not acknowledged in time (strong mode)")
    remote_queue: int = gauge("uploads and deletions queued now")
    remote_connected: int = gauge("1 while connected to the cluster")
    remote_subscribed: int = gauge("1 while subscribed to the announcements")
    remote_drops: int = counter("local copies dropped for a newer remote version")
    remote_promotions: int = counter("slots brought from the remote tier into memory")


class RemoteTier(ReadMixin, ClusterMixin, PubSubMixin, WriteBehindMixin):
    """Slots on a Redis Cluster.  Thread-safe; no method raises for a remote fault.

    Synchronous (any thread): stat, get, get_into, put_sync, delete_sync,
    names.  Write-behind (a background thread): put_async, delete_async,
    delete_session_async; wait(key) / wait_all() for fsync and flush."""

    def __init__(self, url: "str | RemoteConfig", durable: bool = False,
                 origin: Optional[str] = None, subscribe: bool = True,
                 strong: bool = False) -> None:
        self.config = parse_url(url) if isinstance(url, str) else url
        # every key and channel of this tier, under the URL's prefix= (ACLs)
        self._prefix = self.config.prefix
        self._channel = _pre(self._prefix).encode() + CHANNEL
        self._ack_channel = _pre(self._prefix).encode() + ACK_CHANNEL
        self._peers_key = _pre(self._prefix) + PEERS_KEY
        self.durable = durable
        self.strong = strong
        self.origin = origin or uuid.uuid4().hex[:16]
        self.on_invalidate: Optional[Callable[[bytes, str, RemoteVersion], None]] = None
        self.on_reconnect: Optional[Callable[[], None]] = None
        self._subscribe = subscribe
        self._rc = None                         # redis.cluster.RedisCluster once connected
        self._lock = threading.Lock()           # counters, down table, known versions
        self._c: collections.Counter = collections.Counter()
        self._down: dict[str, tuple[float, float]] = {}     # node -> (until, back-off)
        self._last_warn: dict[str, float] = {}
        self._quiet: collections.Counter = collections.Counter()
        self._known: "collections.OrderedDict[bytes, RemoteVersion]" = collections.OrderedDict()
        # write-behind
        self._q = threading.Condition()
        self._puts: "collections.OrderedDict[bytes, Source]" = collections.OrderedDict()
        self._dels: "collections.OrderedDict[bytes, None]" = collections.OrderedDict()
        self._sess_dels: list[bytes] = []
        self._inflight: Optional[bytes] = None
        self._failed: set[bytes] = set()
        # acknowledgements (strong mode)
        self._ack_cv = threading.Condition()
        self._acks: dict[str, set[str]] = {}
        self.subscribed = threading.Event()
        self.sub_node: Optional[tuple[str, int]] = None     # where the subscription is
        self._sub_redis = None                  # its node's client (acks are sent there)
        # announcements and reconnections, in order, for the handler thread (so
        # that a slow on_invalidate never holds up acknowledgements)
        self._inbox: "queue.Queue[tuple]" = queue.Queue()
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._stop_writer = threading.Event()
        self._kick = threading.Event()
        self._last_refresh = 0.0
        self._threads: list[threading.Thread] = []
        self._started = False

    # ---- lifecycle ----

    def start(self) -> "RemoteTier":
        if self._started:
            return self
        self._started = True
        for name, fn in (("maint", self._maint_loop), ("writer", self._writer_loop)) + \
                ((("subscriber", self._subscriber_loop), ("handler", self._handler_loop))
                 if self._subscribe else ()):
            t = threading.Thread(target=fn, name=f"memosfs-remote-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def wait_ready(self, timeout: float) -> bool:
        """Until connected (and subscribed, if subscribing), at most timeout s."""
        deadline = time.monotonic() + timeout
        if not self.connected.wait(timeout):
            return False
        if self._subscribe:
            return self.subscribed.wait(max(0.0, deadline - time.monotonic()))
        return True

    def close(self, drain_s: float = 10.0) -> bool:
        """Upload what is queued (at most drain_s), then stop the threads.
        Returns whether the queue was drained."""
        drained = self.wait_all(drain_s) if self._started else True
        if not drained:
            with self._q:
                left = len(self._puts) + len(self._dels)
            log.warning("remote: %d queued uploads or deletions not done at close", left)
        self._stop_writer.set()
        self._stop.set()
        self._kick.set()
        with self._q:
            self._q.notify_all()
        for t in self._threads:
            t.join(timeout=self.config.timeout * 3 + 2)
        if self._subscribe and self._rc is not None:
            try:                                # strong writers stop waiting for us
                name, r = self._node(self._peers_key)
                r.zrem(self._peers_key, self.origin)
            except Exception:
                pass
        rc, self._rc = self._rc, None
        if rc is not None:
            try:
                rc.close()
            except Exception:
                pass
        return drained

    def statistics(self) -> RemoteStats:
        with self._lock:
            c = dict(self._c)
        with self._q:
            queued = len(self._puts) + len(self._dels) + len(self._sess_dels)
        counted = {f.name: int(c.get(f.name, 0)) for f in dataclasses.fields(RemoteStats)
                   if f.metadata["kind"] == "counter"}
        return RemoteStats(**counted, remote_queue=queued,
                           remote_connected=int(self.connected.is_set()),
                           remote_subscribed=int(self.subscribed.is_set()))

    # ---- writes ----

    def put_sync(self, key: bytes, payload: Any, version: int, meta: Optional[dict] = None,
                 announce: bool = True, wait_ack: Optional[bool] = None
                 ) -> Optional[RemoteEntry]:
        """Upload one version now.  payload: bytes-like, or an object with
        .size and .read(off, n) (a pinned Ref, an SSDReader).  Returns its
        entry, or None if it failed (counted and logged)."""
        try:
            return self._put(key, payload, version, meta or {}, announce,
                             self.strong if wait_ack is None else wait_ack)
        except (_Unavailable, _Failed):
            pass
        except Exception as e:
            self._count("remote_errors")
            self._warn("put", "put %s: %s: %s", _k(key), type(e).__name__, e)
            log.debug("remote put", exc_info=True)
        self._count("remote_put_failures")
        return None

    def _put(self, key: bytes, payload: Any, version: int, meta: dict, announce: bool,
             wait_ack: bool) -> RemoteEntry:
        if hasattr(payload, "read") and hasattr(payload, "size"):
            size = int(payload.size)
            read = payload.read
        else:
            mv = memoryview(payload).cast("B")
            size = len(mv)

            def read(off: int, n: int):
                return mv[off:off + n]
        cs = self.config.chunk_size
        mkey = manifest_key(key, self._prefix)
        name, r = self._node(mkey)
        tag = os.urandom(6).hex()
        crcs: list[int] = []
        crc = 0
        inline = b""
        try:
            if size <= cs:
                inline = read(0, size) if size else b""
                if len(inline) != size:
                    raise _Failed(f"source gave {len(inline)} of {size} bytes")
                crc = _native.crc32c(inline)
            else:
                n = -(-size // cs)
                per = max(1, PIPE_BYTES // cs)
                for first in range(0, n, per):
                    p = r.pipeline(transaction=False)
                    for i in range(first, min(first + per, n)):
                        off = i * cs
                        data = read(off, min(cs, size - off))
                        if len(data) != min(cs, size - off):
                            raise _Failed(f"source gave a short chunk {i}")
                        c = _native.crc32c(data)
                        crcs.append(c)
                        crc = _native.crc32c(data, crc)
                        p.set(chunk_key(key, tag, i, self._prefix), data, ex=CHUNK_TTL_S)
                    p.execute()
                    del p
            header = encode_header(key, self.origin, version, size, crc, tag, cs, crcs, meta)
            p = r.pipeline(transaction=False)
            p.execute_command("MULTI")
            p.execute_command("GETRANGE", mkey, 0, FIXED.size - 1)
            p.execute_command("SET", mkey, header)
            if size and not crcs:
                p.execute_command("APPEND", mkey, inline)    # no copy of header + payload
            for i in range(len(crcs)):
                p.execute_command("PERSIST", chunk_key(key, tag, i, self._prefix))
            p.execute_command("EXEC")
            waited = self.durable and self._has_replica(mkey)
            if waited:
                p.execute_command("WAIT", 1, max(1, int(self.config.timeout * 500)))
            res = p.execute()
        except _Failed:
            raise
        except Exception as e:
            raise self._fail("put", name, e) from None
        self._ok(name)
        exec_res = res[-2] if waited else res[-1]
        appended = 1 if size and not crcs else 0
        if not isinstance(exec_res, list) or len(exec_res) != 2 + appended + len(crcs):
            self._count("remote_errors")
            self._warn("put", "put %s: transaction answered %r", _k(key), exec_res)
            raise _Failed("transaction failed")
        if crcs and not all(x == 1 for x in exec_res[2:]):
            self._count("remote_errors")
            self._warn("put", "put %s: chunks expired before their manifest", _k(key))
            raise _Failed("chunks lost")
        if waited and res[-1] < 1:
            self._warn("wait", "put %s: no replica acknowledged within %.1f s", _k(key),
                       self.config.timeout)
        old_tag, old_n = _old_chunks(exec_res[0])
        self._drop_chunks(r, name, key, old_tag, old_n, keep=tag)
        entry = RemoteEntry(key, self.origin, version, size, crc, tag, len(crcs), cs, crcs,
                            meta, False, len(header))
        self._count("remote_puts")
        self._count("remote_bytes_out", size)
        self._note(key, entry.as_version())
        self._index(key, add=True)
        if announce:
            self._announce(r, name, key, entry.as_version(), wait_ack)
        return entry

    def _has_replica(self, mkey: str) -> bool:
        try:
            rc = self._rc
            return len(rc.nodes_manager.slots_cache.get(rc.keyslot(mkey), ())) > 1
        except Exception:
            return False

    def _drop_chunks(self, r, name: str, key: bytes, tag: str, n: int, keep: str = "") -> None:
        if not n or not tag or tag == keep:
            return
        try:
            r.delete(*[chunk_key(key, tag, i, self._prefix) for i in range(n)])
        except Exception as e:
            self._fail("cleanup", name, e)      # they stay until the LRU takes them

    def _index(self, key: bytes, add: bool) -> None:
        sess, slot = _session_and_name(key)
        ik = index_key(sess, self._prefix)
        try:
            name, r = self._node(ik)
        except _Unavailable:
            return
        try:
            (r.sadd if add else r.srem)(ik, slot)
        except Exception as e:
            self._fail("index", name, e)

    def delete_sync(self, key: bytes, announce: bool = True) -> bool:
        """Replace key's manifest by a tombstone (so that no mount serves or
        resurrects an older copy), delete its chunks, announce the deletion."""
        mkey = manifest_key(key, self._prefix)
        try:
            name, r = self._node(mkey)
            version = self.known_version(key) + 1
            tomb = encode_header(key, self.origin, version, 0, 0, "0" * 12,
                                 self.config.chunk_size, [], {}, deleted=True)
            try:
                p = r.pipeline(transaction=False)
                p.execute_command("MULTI")
                p.execute_command("GETRANGE", mkey, 0, FIXED.size - 1)
                p.execute_command("SET", mkey, tomb, "EX", TOMBSTONE_TTL_S)
                p.execute_command("EXEC")
                res = p.execute()
            except Exception as e:
                raise self._fail("delete", name, e) from None
            self._ok(name)
            exec_res = res[-1]
            old = exec_res[0] if isinstance(exec_res, list) and exec_res else b""
            self._drop_chunks(r, name, key, *_old_chunks(old))
            v = RemoteVersion(self.origin, version, 0, 0, True)
            self._note(key, v, announced=True)
            self._count("remote_deletes")
            self._index(key, add=False)
            if announce:
                self._announce(r, name, key, v, self.strong)
            return True
        except (_Unavailable, _Failed):
            return False
        except Exception as e:
            self._count("remote_errors")
            self._warn("delete", "delete %s: %s: %s", _k(key), type(e).__name__, e)
            return False

