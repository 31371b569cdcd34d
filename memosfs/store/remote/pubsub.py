"""The remote tier's announcements: versions told, invalidations, acknowledgements.

Versions: each upload carries its origin (a random id per mount) and a
version counter; its identity is (version, size, crc32c).  Announcements:
every upload and deletion is PUBLISHed on `memosfs:inval` (PUBLISH reaches
subscribers on every node of a cluster); a subscriber thread calls
`on_invalidate(key, origin, RemoteVersion)` for announcements of other
origins.  Pub/sub is fire-and-forget, so whenever the subscription is
(re)established, `on_reconnect()` is called, and the owner checks what it
holds against the manifests.  While its subscription lasts, a mount does not
accept a remote version older than one it was told about (after a failover,
an older copy can surface: replication is asynchronous); a reconnection
forgets what it was told.

Strong mode: a writer waits until every live peer (those whose subscription
heartbeat is fresh in `memos:{peers}`) has acknowledged the announcement on
`memosfs:ack`, or the ack timeout passes (counted in remote_ack_timeouts).

Owns (as PubSubMixin, one of RemoteTier's bases): the versions this mount
has seen (`_known`), the subscription (`subscribed`, `sub_node`,
`_sub_redis`), the inbox and the handler thread that calls on_invalidate /
on_reconnect, and the acknowledgements (`_acks`, `_ack_cv`); _announce, which the writes
call.  The state is
created by RemoteTier.__init__.  Calls the cluster mixin (_node, _fail,
_live_peers, _sub_candidates, _redis_kwargs, _count, _warn) and wire.
"""

from __future__ import annotations

import collections
import json
import logging
import queue
import threading
import time
import uuid
from typing import Any, Callable, Optional

from memosfs.store.remote.wire import RemoteEntry, RemoteVersion, _k

log = logging.getLogger("memosfs.store.remote")

PING_S = 1.0
KNOWN_MAX = 200_000


class PubSubMixin:
    """Announcements and versions told of RemoteTier (see the module docstring)."""

    config: Any
    origin: str
    on_invalidate: Optional[Callable[[bytes, str, RemoteVersion], None]]
    on_reconnect: Optional[Callable[[], None]]
    _lock: threading.Lock
    _known: "collections.OrderedDict[bytes, RemoteVersion]"
    _ack_cv: threading.Condition
    _acks: dict[str, set[str]]
    _inbox: "queue.Queue[tuple]"
    _channel: bytes
    _ack_channel: bytes
    subscribed: threading.Event
    connected: threading.Event
    _stop: threading.Event

    # ---- versions this mount has seen ----

    def _note(self, key: bytes, v: RemoteVersion, announced: bool = False) -> None:
        """Remember the newest version seen of key (an announcement replaces)."""
        with self._lock:
            old = self._known.get(key)
            if announced or old is None or v.version >= old.version:
                self._known[key] = v
            self._known.move_to_end(key)
            while len(self._known) > KNOWN_MAX:
                self._known.popitem(last=False)

    def _forget_known(self) -> None:
        """Announcements may have been missed: what this mount knew of other
        mounts' versions may be out of date, and must not make it refuse a
        version it was not told of (a slot deleted and made again meanwhile)."""
        with self._lock:
            self._known.clear()

    def known(self, key: bytes) -> Optional[RemoteVersion]:
        with self._lock:
            return self._known.get(key)

    def known_present(self, key: bytes) -> bool:
        """The newest version this mount saw of key is not a deletion."""
        v = self.known(key)
        return v is not None and not v.deleted

    def known_version(self, key: bytes) -> int:
        v = self.known(key)
        return v.version if v is not None else 0

    def _stale(self, entry: RemoteEntry) -> bool:
        v = self.known(entry.key)
        if v is None:
            return False
        return entry.version < v.version or (v.deleted and entry.version <= v.version
                                            and entry.ident() != v.ident())

    # ---- announcements ----

    def _announce(self, r, name: str, key: bytes, v: RemoteVersion, wait_ack: bool) -> None:
        msg_id = uuid.uuid4().hex[:16]
        expected = self._live_peers() if wait_ack else set()
        msg = {"o": self.origin, "k": key.hex(), "v": v.version, "n": v.size, "c": v.crc,
               "d": int(v.deleted), "id": msg_id, "a": int(bool(expected))}
        if expected:
            with self._ack_cv:
                self._acks[msg_id] = set()
        try:
            try:
                r.publish(self._channel, json.dumps(msg, separators=(",", ":")))
            except Exception as e:
                self._fail("announce", name, e)
                return
            if not expected:
                return
            deadline = time.monotonic() + self.config.ack_timeout
            with self._ack_cv:
                while not expected <= self._acks[msg_id]:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._ack_cv.wait(left)
                got = self._acks[msg_id] & expected
            if got == expected:
                self._count("remote_acks")
            else:
                self._count("remote_ack_timeouts")
                self._warn("ack", "%s: %d of %d peers acknowledged within %.1f s", _k(key),
                           len(got), len(expected), self.config.ack_timeout)
        finally:
            with self._ack_cv:
                self._acks.pop(msg_id, None)

    def _subscriber_loop(self) -> None:
        import redis

        back = 0.2
        turn = 0
        while not self._stop.is_set():
            # on_reconnect checks local slots against the manifests: it needs
            # the cluster client, so the subscription waits for it
            if not self.connected.wait(0.25):
                continue
            nodes = self._sub_candidates()
            host, port = nodes[turn % len(nodes)]
            turn += 1
            r = ps = None
            try:
                r = redis.Redis(host=host, port=port, **self._redis_kwargs())
                ps = r.pubsub()
                ps.subscribe(self._channel, self._ack_channel)
                confirmed = 0
                deadline = time.monotonic() + self.config.timeout + self.config.connect_timeout
                while confirmed < 2:
                    m = ps.get_message(timeout=0.1)
                    if m is not None and m.get("type") == "subscribe":
                        confirmed += 1
                    elif time.monotonic() > deadline:
                        raise TimeoutError("no subscribe confirmation")
                    if self._stop.is_set():
                        return
                self.sub_node = (host, port)
                self._sub_redis = r
                self._forget_known()
                self._inbox.put(("reconnect",))
                self._count("remote_reconnects")
                self.subscribed.set()
                log.info("remote: subscribed to invalidations on %s:%d", host, port)
                back = 0.2
                last_rx = last_ping = time.monotonic()
                silent = max(3 * PING_S, 2 * self.config.timeout + PING_S)
                while not self._stop.is_set():
                    m = ps.get_message(timeout=0.25)
                    now = time.monotonic()
                    if m is not None:
                        last_rx = now
                        if m.get("type") == "subscribe" and m.get("channel") == self._channel:
                            # redis-py reconnected and subscribed again by itself:
                            # announcements may have been missed meanwhile
                            self._count("remote_reconnects")
                            log.info("remote: subscription to %s:%d renewed", host, port)
                            self._forget_known()
                            self._inbox.put(("reconnect",))
                        else:
                            self._on_message(m)
                        last_rx = time.monotonic()
                    if now - last_ping >= PING_S:
                        ps.ping()
                        last_ping = now
                    if now - last_rx > silent:
                        raise TimeoutError(f"no answer from {host}:{port} for {silent:.1f} s")
            except Exception as e:
                if not self._stop.is_set():
                    self._warn("subscribe", "invalidation subscription on %s:%d lost or "
                               "refused: %s", host, port, e)
            finally:
                was = self.subscribed.is_set()
                self.subscribed.clear()
                self._sub_redis = None
                for c in (ps, r):
                    try:
                        if c is not None:
                            c.close()
                    except Exception:
                        pass
            if was:
                back = 0.2
            self._stop.wait(back)
            back = min(back * 2, 2.0)

    def _on_message(self, m: dict) -> None:
        if m.get("type") != "message":
            return
        try:
            d = json.loads(m["data"])
        except (ValueError, TypeError):
            self._warn("message", "unreadable message on %r", m.get("channel"))
            return
        try:
            if m["channel"] == self._ack_channel:
                if d.get("to") == self.origin:
                    with self._ack_cv:
                        s = self._acks.get(d.get("id"))
                        if s is not None:
                            s.add(str(d.get("o")))
                            self._ack_cv.notify_all()
                return
            origin = str(d["o"])
            if origin == self.origin:
                return
            key = bytes.fromhex(d["k"])
            v = RemoteVersion(origin, int(d["v"]), int(d["n"]), int(d["c"]), bool(d.get("d")))
        except (KeyError, ValueError, TypeError) as e:
            self._warn("message", "malformed announcement %r: %s", m.get("data"), e)
            return
        self._count("remote_invalidations")
        self._note(key, v, announced=True)
        self._inbox.put(("inv", key, origin, v, d.get("id") if d.get("a") else None))

    def _handler_loop(self) -> None:
        """Runs on_reconnect and on_invalidate in the order they came, and
        acknowledges announcements that ask for it once they are applied."""
        while not self._stop.is_set():
            try:
                job = self._inbox.get(timeout=0.25)
            except queue.Empty:
                continue
            if job[0] == "reconnect":
                if self.on_reconnect is not None:
                    try:
                        self.on_reconnect()
                    except Exception:
                        log.exception("remote: on_reconnect failed")
                continue
            _, key, origin, v, ack_id = job
            if self.on_invalidate is not None:
                try:
                    self.on_invalidate(key, origin, v)
                except Exception:
                    log.exception("remote: on_invalidate failed for %s", _k(key))
                    continue                    # not applied: not acknowledged
            r = self._sub_redis
            if ack_id is not None and r is not None:
                try:
                    r.publish(self._ack_channel, json.dumps({"o": self.origin, "to": origin,
                                                       "id": ack_id}))
                except Exception as e:
                    self._warn("ack", "cannot acknowledge %s: %s", _k(key), e)

