"""The remote tier's read path: manifests, payloads, the session index.

Read: GET the manifest, check its header, GET the chunks in pipelines, check
each chunk's crc32c and the payload's; a missing chunk, a short one or a
checksum mismatch is a miss (logged, counted), never served.  A manifest
replaced while it was read is read again once.

stat / stat_many read manifests only; get / get_into read a whole version,
chunk by chunk in pipelines of PIPE_BYTES, checking as they go; names reads
a session's index.  None of them raises for a remote fault.

Owns (as ReadMixin, one of RemoteTier's bases): the synchronous reads and
their private exceptions (_Retry, _SinkError).  Calls the cluster mixin
(_node, _ok, _fail, _count, _warn), the pubsub mixin (_note, _stale,
known_version), the write-behind mixin (_pending_delete), wire and
memosfs._native (crc32c).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from memosfs import _native
from memosfs.store.remote.cluster import _Failed, _Unavailable
from memosfs.store.remote.wire import (FIXED, PIPE_BYTES, PROBE, RemoteEntry, _Corrupt, _k,
                                       _old_chunks, _Short, chunk_key, index_key, manifest_key,
                                       parse_header)

log = logging.getLogger("memosfs.store.remote")


class _Retry(Exception):
    pass


class _SinkError(Exception):
    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc



class ReadMixin:
    """The synchronous reads of RemoteTier (see the module docstring)."""

    _prefix: str

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

