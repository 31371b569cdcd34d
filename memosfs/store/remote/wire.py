"""The remote tier's wire format: key and channel names, manifests, checksums.

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

A chunked version is cut into chunks of `cs` bytes (the last one shorter);
crc32c (the C core's) covers the JSON header, each chunk and the payload.

Owns: the key names (manifest_key, chunk_key, index_key, the peers key and
the channels), the records RemoteVersion and RemoteEntry, encode_header /
parse_header and the header's limits.  Calls memosfs._native (crc32c) and
url (the prefix); no I/O.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from memosfs import _native
from memosfs.store.remote.url import _pre

MAGIC = b"MEMOSRT1"
FIXED = struct.Struct("<8sI12sII")      # magic, chunks, tag, json length, json crc
PROBE = 4096                            # bytes of a manifest read to learn its header
JSON_MAX = 1 << 20
CHUNK_TTL_S = 600                       # chunks not yet adopted by a manifest expire
TOMBSTONE_TTL_S = 86400
CHANNEL = b"memosfs:inval"
ACK_CHANNEL = b"memosfs:ack"
PEERS_KEY = "memos:{peers}"
PIPE_BYTES = 64 << 20                   # bytes of chunks per pipeline round trip


def _hash(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()[:40]


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



# ---------------------------------------------------------------- manifests


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

