"""The remote tier's URL: parsing, the key prefix, ACL rules, password hiding.

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

The password is never logged (RemoteConfig.redacted() writes user:***), and
`hide_url_passwords()` overwrites it in the process's command line.

Owns: RemoteConfig, parse_url, the prefix (`_pre`, `_PREFIX_RE`), acl_rules,
hide_url_passwords, CHUNK_MAX.  Calls nothing of memosfs: the other modules of
the tier import from here.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Optional
from urllib.parse import parse_qsl, unquote

log = logging.getLogger("memosfs.store.remote")

CHUNK_MAX = 32 << 20


def _pre(prefix: str) -> str:
    return prefix + ":" if prefix else ""



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

