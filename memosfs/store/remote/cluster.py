"""The remote tier's cluster: connections, node health, failover, the mount check.

At mount, `check()` asks the seed nodes once: a wrong password, a missing
permission or a failed TLS handshake (unknown CA, name mismatch) fails the
mount with a message that names the node (RemoteRefused); nodes that do not
answer do not (the mount serves its local tiers and keeps trying).  The
check asks the seed nodes with plain redis.Redis clients; the tier itself
uses one redis.cluster.RedisCluster client, connected by the maintenance
thread (and the subscriber one plain client on the node it listens to).

Faults: connect and operation timeouts are short; a node that fails is
skipped for a back-off period (0.5 s doubling to 5 s), so requests for its
keys are misses at once instead of waits; the slot map is refreshed in the
background; warnings are rate limited.  No method raises for a remote
failure: reads are misses, writes return None/False and are counted.

Owns (as ClusterMixin, one of RemoteTier's bases): the cluster client
(`_rc`, `connected`), the down table (`_down`), the counters (`_c`) and the
rate-limited warnings; the maintenance thread (connect, slot map refresh,
this mount's heartbeat in the peers key); check() and RemoteRefused.
The state is created by RemoteTier.__init__ (tier.py).  Calls nothing of
the tier's other modules (self.config is a url.RemoteConfig); redis-py is
imported where it is used.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from typing import Any, Optional

log = logging.getLogger("memosfs.store.remote")

HEARTBEAT_S = 1.0
PEER_TTL_S = 3.5
WARN_EVERY_S = 5.0
DOWN_MIN_S, DOWN_MAX_S = 0.5, 5.0
REFRESH_MIN_S = 1.0


class _Unavailable(Exception):
    """The tier cannot ask now (not connected, node backing off): a fast miss."""


class _Failed(Exception):
    """A remote error already counted and logged."""


class RemoteRefused(Exception):
    """The cluster refuses this mount: wrong credentials, a TLS handshake that
    fails (unknown CA, certificate mismatch), a permission the tier needs is
    missing.  Retrying does not help; raised by RemoteTier.check() at mount."""



class ClusterMixin:
    """Connections and node health of RemoteTier (see the module docstring)."""

    config: Any
    origin: str
    _lock: threading.Lock
    _c: collections.Counter
    _down: dict[str, tuple[float, float]]
    _last_warn: dict[str, float]
    _quiet: collections.Counter

    # ---- counters and logging ----

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._c[name] += n

    def _warn(self, category: str, fmt: str, *args: object) -> None:
        """A warning per category at most every WARN_EVERY_S; the rest at DEBUG."""
        now = time.monotonic()
        with self._lock:
            last = self._last_warn.get(category, 0.0)
            due = now - last >= WARN_EVERY_S
            if due:
                self._last_warn[category] = now
                quiet, self._quiet[category] = self._quiet[category], 0
            else:
                self._quiet[category] += 1
        if due:
            log.warning("remote: " + fmt + (f" ({quiet} similar since)" if quiet else ""), *args)
        else:
            log.debug("remote: " + fmt, *args)

    # ---- connection ----

    def _connect(self) -> None:
        from redis.backoff import NoBackoff
        from redis.cluster import ClusterNode, RedisCluster
        from redis.retry import Retry

        cfg = self.config
        kwargs: dict[str, Any] = dict(
            startup_nodes=[ClusterNode(h, p) for h, p in cfg.nodes],
            username=cfg.username, password=cfg.password,
            socket_timeout=cfg.timeout, socket_connect_timeout=cfg.connect_timeout,
            require_full_coverage=False, retry=Retry(NoBackoff(), 0),
            dynamic_startup_nodes=True)
        if cfg.tls:
            kwargs["ssl"] = True
            kwargs.update(cfg.tls_options)
        self._rc = RedisCluster(**kwargs)
        self.connected.set()
        log.info("remote: connected to %s (%d nodes), origin %s", cfg.redacted(),
                 len(self._rc.get_nodes()), self.origin)

    def check(self) -> Optional[str]:
        """Ask the seed nodes once, in order, until one answers: authenticate,
        CLUSTER SLOTS, and touch this tier's keys and channel (permissions).
        Returns None when a node accepted all of it, or why no node could be
        reached (transient: the mount goes on and keeps trying); raises
        RemoteRefused when a node refuses the credentials or a permission the
        tier needs, or the TLS handshake fails (settings that retrying does
        not mend).  Messages name the node, never the password."""
        import ssl

        try:
            import redis
            from redis import exceptions as rex
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as e:
            raise RemoteRefused(f"redis-py is not installed ({e}): pip install "
                                "'redis[hiredis]'") from None

        cfg = self.config
        who = f" as user {cfg.username!r}" if cfg.username else ""
        for opt in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
            path = cfg.tls_options.get(opt)
            if path and not os.access(path, os.R_OK):
                raise RemoteRefused(f"TLS setup: {opt}={path} cannot be read")
        unreachable = []
        for host, port in cfg.nodes:
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            r = redis.Redis(host=host, port=port, retry=Retry(NoBackoff(), 0),
                            **self._redis_kwargs())
            step = "connect"
            try:
                r.ping()
                step = "CLUSTER SLOTS"
                r.execute_command("CLUSTER", "SLOTS")
                step = f"key {self._peers_key}"
                try:
                    r.zrangebyscore(self._peers_key, "+inf", "+inf")
                except (rex.MovedError, rex.AskError):
                    pass                        # allowed: ACLs are checked before MOVED
                step = f"channel {self._channel.decode()}"
                ps = r.pubsub()
                try:
                    ps.subscribe(self._channel)
                    deadline = time.monotonic() + cfg.timeout
                    while time.monotonic() < deadline:
                        m = ps.get_message(timeout=0.05)
                        if m is not None and m.get("type") == "subscribe":
                            break
                finally:
                    ps.close()
                return None
            except rex.AuthenticationError as e:
                raise RemoteRefused(f"{where}: authentication failed{who}: {e}") from None
            except rex.ResponseError as e:
                text = str(e)
                if text.startswith(("WRONGPASS", "NOAUTH")) or "AUTH" in text[:20]:
                    raise RemoteRefused(f"{where}: authentication failed{who}: {text}") \
                        from None
                if "permission" in text.lower() or text.startswith("NOPERM"):
                    raise RemoteRefused(f"{where}: user {cfg.username or 'default'} lacks a "
                                        f"permission the tier needs ({step}): {text}") from None
                if step == "CLUSTER SLOTS" and "cluster support disabled" in text:
                    raise RemoteRefused(f"{where}: not a Redis Cluster node: {text}") from None
                raise RemoteRefused(f"{where}: {step} refused: {text}") from None
            except (rex.ConnectionError, rex.TimeoutError, OSError) as e:
                cause = e.__cause__ or e.__context__
                text = str(e)
                if isinstance(cause, ssl.SSLError) or isinstance(e, ssl.SSLError) \
                        or "SSL" in text or "certificate" in text.lower():
                    raise RemoteRefused(f"{where}: TLS handshake failed: {text}") from None
                if not cfg.tls and ("reset by peer" in text or "closed by server" in text):
                    text += " (a TLS port? then rediss://)"
                unreachable.append(f"{where}: {text}")
            finally:
                try:
                    r.close()
                except Exception:
                    pass
        return "no node reachable (" + "; ".join(unreachable) + ")"

    def _redis_kwargs(self) -> dict[str, Any]:
        cfg = self.config
        kw: dict[str, Any] = dict(username=cfg.username, password=cfg.password,
                                  socket_timeout=cfg.timeout,
                                  socket_connect_timeout=cfg.connect_timeout)
        if cfg.tls:
            kw["ssl"] = True
            kw.update(cfg.tls_options)
        return kw

    def _node(self, mkey: str):
        """(name, client) of the master serving mkey; _Unavailable if none now."""
        rc = self._rc
        if rc is None:
            self._count("remote_skipped")
            raise _Unavailable("not connected")
        try:
            node = rc.get_node_from_key(mkey)
        except Exception as e:                  # slot not covered, map being rebuilt
            self._kick.set()
            self._count("remote_skipped")
            raise _Unavailable(str(e)) from None
        with self._lock:
            down = self._down.get(node.name)
        if down is not None and down[0] > time.monotonic():
            self._count("remote_skipped")
            raise _Unavailable(f"{node.name} backing off")
        return node.name, rc.get_redis_connection(node)

    def _ok(self, name: str) -> None:
        if self._down:
            with self._lock:
                self._down.pop(name, None)

    def _fail(self, what: str, name: str, e: BaseException) -> _Failed:
        """Count and log a remote error; back off from the node if it is
        unreachable; ask for a fresh slot map when the cluster moved."""
        from redis import exceptions as rex

        self._count("remote_errors")
        if isinstance(e, (rex.ConnectionError, rex.TimeoutError, OSError)):
            now = time.monotonic()
            with self._lock:
                prev = self._down.get(name)
                back = DOWN_MIN_S if prev is None else min(prev[1] * 2, DOWN_MAX_S)
                self._down[name] = (now + back, back)
            self._kick.set()
            self._warn(f"unreachable {name}", "%s: node %s unreachable (%s); its keys are "
                       "misses for %.1f s", what, name, e, back)
        elif isinstance(e, (rex.AskError, rex.ClusterDownError, rex.TryAgainError)):
            self._kick.set()
            self._warn(f"moved {name}", "%s: cluster changing (%s); refreshing the slot map",
                       what, e)
        else:
            self._warn(f"error {what}", "%s on %s failed: %s: %s", what, name,
                       type(e).__name__, e)
        return _Failed(str(e))

    def _maint_loop(self) -> None:
        """Connects (and reconnects), refreshes the slot map after errors,
        keeps this mount's heartbeat while it is subscribed."""
        back = 0.2
        last_beat = 0.0
        while not self._stop.is_set():
            if self._rc is None:
                try:
                    self._connect()
                    back = 0.2
                except Exception as e:
                    self._warn("connect", "cannot reach %s: %s", self.config.redacted(), e)
                    self._stop.wait(back)
                    back = min(back * 2, DOWN_MAX_S)
                    continue
            now = time.monotonic()
            if self.subscribed.is_set() and now - last_beat >= HEARTBEAT_S:
                last_beat = now
                self._heartbeat()
            if self._kick.is_set() or self._down:
                due_in = self._last_refresh + REFRESH_MIN_S - time.monotonic()
                if due_in <= 0:
                    self._kick.clear()
                    self._last_refresh = time.monotonic()
                    try:
                        self._rc.nodes_manager.initialize()
                        live = {n.name for n in self._rc.get_nodes()}
                        with self._lock:        # nodes gone from the map (failed over)
                            for name in [n for n in self._down if n not in live]:
                                del self._down[name]
                    except Exception as e:
                        self._warn("refresh", "slot map refresh failed: %s", e)
                    continue
                self._stop.wait(min(due_in, 0.25))
                continue
            self._kick.wait(HEARTBEAT_S / 2)

    def _heartbeat(self) -> None:
        try:
            name, r = self._node(self._peers_key)
        except _Unavailable:
            return
        try:
            secs, usecs = r.time()
            now = secs + usecs / 1e6
            p = r.pipeline(transaction=False)
            p.zadd(self._peers_key, {self.origin: now})
            p.zremrangebyscore(self._peers_key, "-inf", now - 60)
            p.execute()
            self._ok(name)
        except Exception as e:
            self._fail("heartbeat", name, e)

    def _live_peers(self) -> set[str]:
        try:
            name, r = self._node(self._peers_key)
        except _Unavailable:
            return set()
        try:
            secs, usecs = r.time()
            now = secs + usecs / 1e6
            peers = r.zrangebyscore(self._peers_key, now - PEER_TTL_S, "+inf")
            self._ok(name)
        except Exception as e:
            self._fail("peers", name, e)
            return set()
        return {p.decode() for p in peers} - {self.origin}

    def _sub_candidates(self) -> list[tuple[str, int]]:
        rc = self._rc
        nodes: list[tuple[str, int]] = []
        if rc is not None:
            try:
                now = time.monotonic()
                with self._lock:
                    down = {n for n, (until, _) in self._down.items() if until > now}
                nodes = [(n.host, int(n.port)) for n in rc.get_nodes() if n.name not in down]
            except Exception:
                nodes = []
        return nodes or list(self.config.nodes)

