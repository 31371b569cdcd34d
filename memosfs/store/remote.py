"""The remote tier: slots on a Redis Cluster that several mounts share.

    remote=redis://[user:pass@]host:port[,host:port...][?timeout=1&connect_timeout=0.5]
    remote=rediss://...      TLS (ssl_ca_certs=FILE, ssl_cert_reqs=required|none,
                             ssl_certfile=, ssl_keyfile=, ssl_check_hostname=0|1)

Other URL options: chunk=32M (chunk size, at most 32 MiB), queue=1024 (uploads
waiting), ack_timeout=1 (seconds a strong-mode writer waits for acknowledgements),
prefix=NAME (every key becomes NAME:memos:..., every channel NAME:memosfs:...;
1-64 of A-Z a-z 0-9 _ . - :).  The hosts are seed nodes; the rest of the
cluster is discovered from them.  A password with , @ / ? & in it is
percent-encoded (%2C %40 %2F %3F %26).

Tenants.  A Redis ACL user restricted to one prefix is enough for the tier:
`acl_rules(prefix)` gives the rules (keys ~NAME:*, channels &NAME:*, and only
the commands in ACL_COMMANDS), e.g. on every node of the cluster (ACLs are
per node):

    ACL SETUSER tenant on >PASSWORD ~t1:* &t1:* -@all +get +set +getrange +append
        +persist +del +multi +exec +wait +time +zadd +zrem +zremrangebyscore
        +zrangebyscore +sadd +srem +smembers +publish +subscribe +unsubscribe
        +ping +hello +auth +command +cluster|slots

At mount, `check()` asks the seed nodes once: a wrong password, a missing
permission or a failed TLS handshake (unknown CA, name mismatch) fails the
mount with a message that names the node (RemoteRefused); nodes that do not
answer do not (the mount serves its local tiers and keeps trying).  The
password is never logged (RemoteConfig.redacted() writes user:***), and
`hide_url_passwords()` overwrites it in the process's command line.

Layout.  A slot's keys share one hash tag, h = the first 40 hex digits of
sha256(slot key), so they live in one hash slot on one master:

    memos:{h}:m              manifest: a fixed header (32 bytes), a JSON header,
                             and, for a slot up to one chunk, the payload itself
    memos:{h}:c:<tag>:<i>    chunk i (at most `chunk` bytes) of the version whose
                             manifest names <tag>; the tag is random per upload, so
                             two versions never share a chunk key
    memos:ix:{<sha(session)>}  the slot names of a session (a set, best effort)
    memos:{peers}            live mounts: origin -> server time of their heartbeat

Fixed header: magic "MEMOSRT1", u32 chunk count, 12-byte tag, u32 JSON length,
u32 crc32c of the JSON.  JSON: k (the key, hex), o (origin mount), v (version),
n (size), c (crc32c of the payload), cs (chunk size), cc (crc32c of each chunk),
m (the slot's metadata: owner, mode, xattrs...), d (1: a tombstone), t (time).

Write: the chunks are SET with an expiry, in pipelines; then one MULTI/EXEC on
the manifest's master replaces the manifest, PERSISTs the chunks and returns
the header it replaced (GETRANGE), whose chunks are deleted afterwards.  A
reader therefore sees a whole old version or a whole new one; an upload cut
short leaves chunks that expire.  With `durable`, the writer also WAITs for
one replica when the master has one.

Read: GET the manifest, check its header, GET the chunks in pipelines, check
each chunk's crc32c and the payload's; a missing chunk, a short one or a
checksum mismatch is a miss (logged, counted), never served.  A manifest
replaced while it was read is read again once.

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

Faults: connect and operation timeouts are short; a node that fails is
skipped for a back-off period (0.5 s doubling to 5 s), so requests for its
keys are misses at once instead of waits; the slot map is refreshed in the
background; warnings are rate limited.  No method raises for a remote
failure: reads are misses, writes return None/False and are counted.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import queue
import re
import struct
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional
from urllib.parse import parse_qsl, unquote

from memosfs import _native

log = logging.getLogger("memosfs.store.remote")

__all__ = ["RemoteTier", "RemoteEntry", "RemoteVersion", "RemoteConfig", "RemoteRefused",
           "parse_url", "manifest_key", "chunk_key", "acl_rules", "hide_url_passwords",
           "CHUNK_MAX"]

MAGIC = b"MEMOSRT1"
FIXED = struct.Struct("<8sI12sII")      # magic, chunks, tag, json length, json crc
PROBE = 4096                            # bytes of a manifest read to learn its header
CHUNK_MAX = 32 << 20
JSON_MAX = 1 << 20
CHUNK_TTL_S = 600                       # chunks not yet adopted by a manifest expire
TOMBSTONE_TTL_S = 86400
CHANNEL = b"memosfs:inval"
ACK_CHANNEL = b"memosfs:ack"
PEERS_KEY = "memos:{peers}"
HEARTBEAT_S = 1.0
PEER_TTL_S = 3.5
PING_S = 1.0
PIPE_BYTES = 64 << 20                   # bytes of chunks per pipeline round trip
WARN_EVERY_S = 5.0
KNOWN_MAX = 200_000
DOWN_MIN_S, DOWN_MAX_S = 0.5, 5.0
REFRESH_MIN_S = 1.0


def _hash(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()[:40]


def _pre(prefix: str) -> str:
    return prefix + ":" if prefix else ""


def manifest_key(key: bytes, prefix: str = "") -> str:
    return f"{_pre(prefix)}memos:{{{_hash(key)}}}:m"


def chunk_key(key: bytes, tag: str, i: int, prefix: str = "") -> str:
    return f"{_pre(prefix)}memos:{{{_hash(key)}}}:c:{tag}:{i}"


def index_key(session: bytes, prefix: str = "") -> str:
    return f"{_pre(prefix)}memos:ix:{{{_hash(session)}}}"


def _session_and_name(key: bytes) -> tuple[bytes, bytes]:
    sess, _, name = key.rpartition(b"/")
    return sess, name


def _k(key: bytes) -> str:
    return key.decode("utf-8", "replace")


# ---------------------------------------------------------------- configuration


@dataclass
class RemoteConfig:
    nodes: list[tuple[str, int]]
    username: Optional[str] = None
    password: Optional[str] = None
    tls: bool = False
    tls_options: dict[str, Any] = field(default_factory=dict)
    timeout: float = 1.0                # seconds an operation may wait for a reply
    connect_timeout: float = 0.5
    chunk_size: int = CHUNK_MAX
    queue_max: int = 1024
    ack_timeout: float = 1.0
    prefix: str = ""                    # keys "<prefix>:memos:...", channels "<prefix>:memosfs:..."

    def redacted(self) -> str:
        scheme = "rediss" if self.tls else "redis"
        auth = ""
        if self.username or self.password:
            auth = (self.username or "") + (":***" if self.password else "") + "@"
        hosts = ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in self.nodes)
        return f"{scheme}://{auth}{hosts}"


def _size(text: str) -> int:
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    mult = 1
    if t and t[-1] in "KMG":
        mult = 1 << {"K": 10, "M": 20, "G": 30}[t[-1]]
        t = t[:-1]
    return int(float(t) * mult)


_PREFIX_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}")   # no braces: they would move hash tags


def parse_url(url: str) -> RemoteConfig:
    """redis://[user:pass@]host:port[,host:port...][/0][?opts]; ValueError if bad."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep or scheme not in ("redis", "rediss"):
        raise ValueError(f"remote URL must start with redis:// or rediss://, not "
                         f"{(scheme + sep) if sep else 'that'}")      # never echo a password
    rest, _, query = rest.partition("?")
    rest, _, path = rest.partition("/")
    if path not in ("", "0"):
        raise ValueError("a Redis cluster has only database 0")
    userinfo, at, hosts = rest.rpartition("@")
    cfg = RemoteConfig(nodes=[], tls=scheme == "rediss")
    if at:
        user, colon, pw = userinfo.partition(":")
        cfg.username = unquote(user) or None
        cfg.password = unquote(pw) if colon else None
        if not colon and cfg.username:         # redis://password@host (old style)
            cfg.username, cfg.password = None, cfg.username
    for h in hosts.split(","):
        h = h.strip()
        if not h:
            continue
        if h.startswith("["):
            host, _, port = h[1:].partition("]")
            port = port.lstrip(":")
        elif h.count(":") == 1:
            host, _, port = h.partition(":")
        else:
            host, port = h, ""
        if not host:
            raise ValueError(f"remote URL: empty host in {h!r}")
        try:
            p = int(port) if port else 6379
        except ValueError:
            raise ValueError(f"remote URL: bad port in {h!r}") from None
        if not 0 < p < 65536:
            raise ValueError(f"remote URL: port {p} out of range")
        cfg.nodes.append((host, p))
    if not cfg.nodes:
        raise ValueError("remote URL names no host")
    for name, value in parse_qsl(query, keep_blank_values=True):
        try:
            if name == "timeout":
                cfg.timeout = float(value)
            elif name == "connect_timeout":
                cfg.connect_timeout = float(value)
            elif name == "chunk":
                cfg.chunk_size = _size(value)
                if not 4096 <= cfg.chunk_size <= CHUNK_MAX:
                    raise ValueError(f"chunk must be 4K..32M, not {value}")
            elif name == "queue":
                cfg.queue_max = int(value)
            elif name == "ack_timeout":
                cfg.ack_timeout = float(value)
            elif name == "prefix":
                if not _PREFIX_RE.fullmatch(value):
                    raise ValueError(f"prefix must be 1-64 of A-Z a-z 0-9 _ . - :, "
                                     f"not {value!r}")
                cfg.prefix = value
            elif name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_ca_path"):
                cfg.tls_options[name] = value
            elif name == "ssl_cert_reqs":
                cfg.tls_options[name] = value.lower()
            elif name == "ssl_check_hostname":
                cfg.tls_options[name] = value.lower() in ("1", "yes", "true")
            else:
                raise ValueError(f"unknown option {name!r}")
        except ValueError as e:
            raise ValueError(f"remote URL: {e}") from None
    if cfg.timeout <= 0 or cfg.connect_timeout <= 0 or cfg.queue_max < 1:
        raise ValueError("remote URL: timeouts and queue must be positive")
    return cfg


# Every command the tier (and redis-py's cluster client) sends: an ACL user
# with these, on the keys and channels of its prefix, is enough.
ACL_COMMANDS = ("get", "set", "getrange", "append", "persist", "del", "multi", "exec",
                "wait", "time", "zadd", "zrem", "zremrangebyscore", "zrangebyscore",
                "sadd", "srem", "smembers", "publish", "subscribe", "unsubscribe", "ping",
                "hello", "auth", "command", "cluster|slots")


def acl_rules(prefix: str) -> list[str]:
    """The ACL SETUSER rules for a tenant whose mounts use `?prefix=<prefix>`:
    its keys and channels only, and only the commands the tier sends."""
    if not _PREFIX_RE.fullmatch(prefix):
        raise ValueError(f"bad prefix {prefix!r}")
    return [f"~{prefix}:*", f"&{prefix}:*", "-@all", *(f"+{c}" for c in ACL_COMMANDS)]


def _redact_arg(arg: bytes) -> bytes:
    out, pos = [], 0
    for m in re.finditer(rb"rediss?://", arg):
        if m.start() < pos:
            continue
        rest = arg[m.end():]
        authority = rest.partition(b"?")[0].partition(b"/")[0]
        userinfo, at, _ = authority.rpartition(b"@")
        if not at:
            continue
        user, colon, _ = userinfo.partition(b":")
        hidden = user + b":***" if colon else b"***"
        out += [arg[pos:m.end()], hidden]
        pos = m.end() + len(userinfo)
    out.append(arg[pos:])
    return b"".join(out)


def hide_url_passwords() -> bool:
    """Overwrite the password of every redis[s]:// URL in this process's
    command line (what ps and /proc/PID/cmdline show) with ***.  The
    arguments live in this process's memory at /proc/self/stat's
    arg_start..arg_end; Python keeps its own copy (sys.argv is unchanged).
    True if something was hidden."""
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        fields = stat[stat.rindex(b")") + 2:].split()
        start, end = int(fields[45]), int(fields[46])        # fields 48 and 49
        if not 0 < start < end:
            return False
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            old = mem.read(end - start)
            new = b"\0".join(_redact_arg(a) for a in old.split(b"\0"))
            if new == old:
                return False
            mem.seek(start)
            mem.write(new.ljust(len(old), b"\0"))
        return True
    except (OSError, ValueError, IndexError) as e:
        log.warning("remote: cannot hide the URL password in the command line: %s", e)
        return False


# ---------------------------------------------------------------- records


class RemoteVersion(NamedTuple):
    """What an announcement says about a key's new version."""
    origin: str
    version: int
    size: int
    crc: int
    deleted: bool = False

    def ident(self) -> tuple[int, int, int]:
        return (self.version, self.size, self.crc)


@dataclass
class RemoteEntry:
    """A version's manifest."""
    key: bytes
    origin: str
    version: int
    size: int
    crc: int
    tag: str
    nchunks: int
    chunk_size: int
    chunk_crcs: list[int]
    meta: dict[str, Any]
    deleted: bool = False
    header_bytes: int = 0

    def ident(self) -> tuple[int, int, int]:
        return (self.version, self.size, self.crc)

    @property
    def vid(self) -> str:
        return f"{self.origin}:{self.version}:{self.crc:08x}:{self.size}"

    def as_version(self) -> RemoteVersion:
        return RemoteVersion(self.origin, self.version, self.size, self.crc, self.deleted)


class _Corrupt(Exception):
    pass


class _Short(Exception):
    def __init__(self, need: int) -> None:
        super().__init__(need)
        self.need = need


class _Unavailable(Exception):
    """The tier cannot ask now (not connected, node backing off): a fast miss."""


class _Failed(Exception):
    """A remote error already counted and logged."""


class RemoteRefused(Exception):
    """The cluster refuses this mount: wrong credentials, a TLS handshake that
    fails (unknown CA, certificate mismatch), a permission the tier needs is
    missing.  Retrying does not help; raised by RemoteTier.check() at mount."""


class _Retry(Exception):
    pass


class _SinkError(Exception):
    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


def encode_header(key: bytes, origin: str, version: int, size: int, crc: int, tag: str,
                  chunk_size: int, chunk_crcs: list[int], meta: dict[str, Any],
                  deleted: bool = False) -> bytes:
    doc = {"k": key.hex(), "o": origin, "v": version, "n": size, "c": crc,
           "cs": chunk_size, "cc": chunk_crcs, "m": meta, "t": round(time.time(), 3)}
    if deleted:
        doc["d"] = 1
    js = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    if len(js) > JSON_MAX:
        raise ValueError(f"slot metadata too large for a manifest ({len(js)} bytes)")
    return FIXED.pack(MAGIC, len(chunk_crcs), tag.encode().ljust(12, b"0")[:12],
                      len(js), _native.crc32c(js)) + js


def parse_header(key: bytes, blob: bytes) -> RemoteEntry:
    """A manifest's header; _Short(n) if blob holds fewer than the n bytes it needs."""
    if len(blob) < FIXED.size:
        raise _Corrupt(f"manifest of {len(blob)} bytes, shorter than its fixed header")
    magic, nchunks, tag, jlen, jcrc = FIXED.unpack_from(blob)
    if magic != MAGIC:
        raise _Corrupt("manifest without magic")
    if jlen > JSON_MAX:
        raise _Corrupt(f"manifest header length {jlen} too large")
    end = FIXED.size + jlen
    if len(blob) < end:
        raise _Short(end)
    js = bytes(blob[FIXED.size:end])
    if _native.crc32c(js) != jcrc:
        raise _Corrupt("manifest header checksum mismatch")
    try:
        d = json.loads(js)
        if bytes.fromhex(d["k"]) != key:
            raise _Corrupt("manifest of another key")
        entry = RemoteEntry(key, str(d["o"]), int(d["v"]), int(d["n"]), int(d["c"]),
                            tag.decode("ascii"), int(nchunks), int(d["cs"]),
                            [int(c) for c in d["cc"]], dict(d.get("m") or {}),
                            bool(d.get("d")), end)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise _Corrupt(f"manifest header unreadable: {e}") from None
    if entry.nchunks != len(entry.chunk_crcs) or entry.size < 0 or entry.chunk_size <= 0:
        raise _Corrupt("manifest header inconsistent")
    if entry.nchunks and (entry.nchunks - 1) * entry.chunk_size >= entry.size \
            or entry.nchunks and entry.nchunks * entry.chunk_size < entry.size:
        raise _Corrupt("manifest chunk count does not match its size")
    return entry


def _old_chunks(fixed: Any) -> tuple[str, int]:
    """(tag, chunks) of a replaced manifest's fixed header; ('', 0) if none."""
    if not isinstance(fixed, (bytes, bytearray)) or len(fixed) < FIXED.size:
        return "", 0
    magic, nchunks, tag, _, _ = FIXED.unpack_from(fixed)
    if magic != MAGIC:
        return "", 0
    try:
        return tag.decode("ascii"), int(nchunks)
    except UnicodeDecodeError:
        return "", 0


# ---------------------------------------------------------------- the tier


Source = Callable[[], Optional[tuple[Any, int, dict, Optional[Callable[[], None]]]]]


class RemoteTier:
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

    def statistics(self) -> dict[str, int]:
        with self._lock:
            c = dict(self._c)
        with self._q:
            queued = len(self._puts) + len(self._dels) + len(self._sess_dels)
        out = {name: int(c.get(name, 0)) for name in (
            "remote_hits", "remote_misses", "remote_bytes_in", "remote_bytes_out",
            "remote_errors", "remote_corrupt", "remote_partial", "remote_stale",
            "remote_skipped", "remote_queue_dropped", "remote_invalidations",
            "remote_puts", "remote_deletes", "remote_put_failures", "remote_reconnects",
            "remote_acks", "remote_ack_timeouts")}
        out["remote_queue"] = queued
        out["remote_connected"] = int(self.connected.is_set())
        out["remote_subscribed"] = int(self.subscribed.is_set())
        return out

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

    # ---- reads ----

    def stat(self, key: bytes) -> Optional[RemoteEntry]:
        """The manifest of key's current version (no payload); None if absent,
        deleted, older than a version this mount was told of, or unreachable."""
        if self._pending_delete(key):
            return None
        mkey = manifest_key(key, self._prefix)
        try:
            name, r = self._node(mkey)
            entry = self._stat_on(r, name, key, mkey)
        except (_Unavailable, _Failed):
            return None
        if entry is None or entry.deleted or self._stale(entry):
            return None
        return entry

    def _stat_on(self, r, name: str, key: bytes, mkey: str,
                 head: Optional[bytes] = None) -> Optional[RemoteEntry]:
        try:
            if head is None:
                head = r.getrange(mkey, 0, PROBE - 1)
            if not head:
                self._ok(name)
                return None
            try:
                entry = parse_header(key, head)
            except _Short as s:
                entry = parse_header(key, r.getrange(mkey, 0, s.need - 1))
            self._ok(name)
        except _Short:
            return None                     # replaced by a shorter one meanwhile
        except _Corrupt as e:
            self._count("remote_corrupt")
            self._warn("corrupt", "manifest of %s: %s", _k(key), e)
            return None
        except Exception as e:
            raise self._fail("stat", name, e) from None
        self._note(key, entry.as_version())
        return entry

    def stat_many(self, keys: list[bytes]) -> dict[bytes, "RemoteEntry | None | Exception"]:
        """Manifests of many keys, pipelined per node: an entry, None (absent or
        deleted), or an exception instance where the tier could not tell."""
        out: dict[bytes, Any] = {}
        by_node: dict[str, tuple[Any, list[bytes]]] = {}
        for key in keys:
            try:
                name, r = self._node(manifest_key(key, self._prefix))
            except _Unavailable as e:
                out[key] = e
                continue
            by_node.setdefault(name, (r, []))[1].append(key)
        for name, (r, ks) in by_node.items():
            for i in range(0, len(ks), 256):
                batch = ks[i:i + 256]
                try:
                    p = r.pipeline(transaction=False)
                    for key in batch:
                        p.getrange(manifest_key(key, self._prefix), 0, PROBE - 1)
                    heads = p.execute()
                except Exception as e:
                    err = self._fail("stat", name, e)
                    for key in ks[i:]:
                        out[key] = err
                    break
                for key, head in zip(batch, heads):
                    try:
                        e = self._stat_on(r, name, key, manifest_key(key, self._prefix), head)
                    except _Failed as f:
                        out[key] = f
                        continue
                    out[key] = e
        return out

    def get(self, key: bytes) -> Optional[tuple[RemoteEntry, bytes]]:
        """(entry, payload) of key's current version, checked; None: a miss."""
        parts: list = []

        def sink(off: int, data) -> None:
            parts.append(data)

        entry = self.get_into(key, sink)
        return None if entry is None else (entry, b"".join(parts))

    def get_into(self, key: bytes, sink: Callable[[int, Any], Any]) -> Optional[RemoteEntry]:
        """Read key's current version, calling sink(offset, bytes) in order;
        returns its entry, or None (a miss: absent, partial, corrupt, stale,
        unreachable).  The caller must discard what sink got when None comes
        back.  An exception raised by sink propagates."""
        if self._pending_delete(key):
            self._count("remote_misses")
            return None
        for attempt in range(2):
            try:
                entry = self._get_once(key, sink)
            except _Retry:
                continue
            except _SinkError as s:
                raise s.exc
            except (_Unavailable, _Failed):
                entry = None
            except Exception as e:              # never out of the tier
                self._count("remote_errors")
                self._warn("get", "get %s: %s: %s", _k(key), type(e).__name__, e)
                log.debug("remote get", exc_info=True)
                entry = None
            if entry is None:
                self._count("remote_misses")
            return entry
        self._count("remote_misses")
        return None

    def _get_once(self, key: bytes, sink) -> Optional[RemoteEntry]:
        mkey = manifest_key(key, self._prefix)
        name, r = self._node(mkey)
        try:
            blob = r.get(mkey)
        except Exception as e:
            raise self._fail("get", name, e) from None
        self._ok(name)
        if blob is None:
            return None
        try:
            entry = parse_header(key, blob)
        except (_Corrupt, _Short) as e:
            return self._corrupt(key, f"manifest: {e}")
        if entry.deleted:
            return None
        if self._stale(entry):
            self._count("remote_stale")
            self._warn("stale", "%s: remote version %d is older than version %d announced; "
                       "not served", _k(key), entry.version, self.known_version(key))
            return None
        if entry.nchunks == 0:
            payload = memoryview(blob)[entry.header_bytes:]
            if len(payload) != entry.size:
                return self._corrupt(key, f"inline payload of {len(payload)} bytes, "
                                     f"manifest says {entry.size}")
            if _native.crc32c(payload) != entry.crc:
                return self._corrupt(key, "payload checksum mismatch")
            if entry.size:
                self._sink(sink, 0, payload)
        else:
            if len(blob) != entry.header_bytes:
                return self._corrupt(key, "chunked manifest carries a payload")
            per = max(1, PIPE_BYTES // entry.chunk_size)
            off, crc = 0, 0
            for first in range(0, entry.nchunks, per):
                idx = range(first, min(first + per, entry.nchunks))
                try:
                    p = r.pipeline(transaction=False)
                    for i in idx:
                        p.get(chunk_key(key, entry.tag, i, self._prefix))
                    values = p.execute()
                except Exception as e:
                    raise self._fail("get", name, e) from None
                for i, v in zip(idx, values):
                    want = min(entry.chunk_size, entry.size - i * entry.chunk_size)
                    if v is None:
                        self._check_replaced(r, name, key, mkey, entry)
                        self._count("remote_partial")
                        self._warn("partial", "%s: chunk %d of %d missing; not served",
                                   _k(key), i, entry.nchunks)
                        return None
                    if len(v) != want:
                        return self._corrupt(key, f"chunk {i} has {len(v)} bytes, not {want}")
                    # one pass: the payload's crc runs over the chunks; the
                    # chunks' own crcs only say which one was bad
                    crc = _native.crc32c(v, crc)
                    self._sink(sink, off, v)
                    off += len(v)
                del values
            if crc != entry.crc:
                self._check_replaced(r, name, key, mkey, entry)
                bad = [i for i in range(entry.nchunks) if self._chunk_bad(r, key, entry, i)]
                return self._corrupt(key, f"payload checksum mismatch (chunks {bad})")
        self._count("remote_hits")
        self._count("remote_bytes_in", entry.size)
        self._note(key, entry.as_version())
        return entry

    @staticmethod
    def _sink(sink, off: int, data) -> None:
        try:
            sink(off, data)
        except BaseException as e:
            raise _SinkError(e) from None

    def _chunk_bad(self, r, key: bytes, entry: RemoteEntry, i: int) -> bool:
        try:
            v = r.get(chunk_key(key, entry.tag, i, self._prefix))
        except Exception:
            return True
        return v is None or _native.crc32c(v) != entry.chunk_crcs[i]

    def _check_replaced(self, r, name: str, key: bytes, mkey: str, entry: RemoteEntry) -> None:
        """A chunk went missing: if the manifest moved on meanwhile, read again."""
        try:
            fixed = r.getrange(mkey, 0, FIXED.size - 1)
        except Exception as e:
            raise self._fail("get", name, e) from None
        tag, _ = _old_chunks(fixed)
        if tag != entry.tag:
            raise _Retry()

    def _corrupt(self, key: bytes, why: str) -> None:
        self._count("remote_corrupt")
        self._warn("corrupt", "%s: %s; not served", _k(key), why)
        return None

    def names(self, session: bytes) -> Optional[list[bytes]]:
        """Slot names the index lists for a session (`agent/session`); None if
        the tier cannot tell.  Best effort: a name may have no slot."""
        ik = index_key(session, self._prefix)
        try:
            name, r = self._node(ik)
            members = r.smembers(ik)
            self._ok(name)
        except _Unavailable:
            return None
        except Exception as e:
            self._fail("names", name, e)
            return None
        return sorted(members)

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

    # ---- write-behind ----

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

    # ---- announcements ----

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
