"""The store's side of the remote tier (memosfs.store.remote, given to Store).

Reads go memory -> SSD -> remote: _promote_remote fetches the remote version
into memory (dirty when there is an SSD tier, so that the background writer
puts it there too).  Uploads take their bytes from _remote_source (the
current local version).  remote_wait is what persist and fsync wait for
with a durable or strong tier.  When another mount announces a version
(_remote_invalidated) or the announcement channel (re)connects
(_remote_reconnected), local copies that are not the manifest's version
are dropped with their name (_drop_unless).

Owns (as RemoteGlueMixin, one of Store's bases): _promote_remote,
_remote_source, remote_lookup, remote_wait, set_remote_strong,
remote_statistics and the invalidation handlers (the tier's on_invalidate
and on_reconnect, set by Store.__init__).  Uses the state Store.__init__
creates (cache, ssd, remote, lock, _order, _dirty_since, _c, trace,
meta_of).  Calls, through self, _promote (reads.py) and _dropped
(namespace.py); imports memosfs.store.ssd and common (the remote tier's
types only for annotations).
"""

from __future__ import annotations

import collections
import dataclasses
import errno
import logging
import time
from typing import TYPE_CHECKING, Optional

from memosfs.store.common import _k, _session_of
from memosfs.store.ssd import CorruptSlot, SSDReader, StaleEntry

if TYPE_CHECKING:
    from memosfs.store.remote.tier import RemoteStats
    from memosfs import _native
    from memosfs.store.remote import RemoteEntry, RemoteVersion

log = logging.getLogger("memosfs.store.store")     # one logger for the whole store


class RemoteGlueMixin:
    """The remote tier's glue (a base of Store; see the module docstring)."""

    # ---- promotion and upload ----

    def _promote_remote(self, key: bytes) -> Optional["_native.Ref"]:
        """Fetch key's remote version into memory; None on a miss (the tier
        logs and counts why: absent, unreachable, partial, corrupt, stale)."""
        if self.remote is None:
            return None
        draft = self.cache.draft()
        try:
            entry = self.remote.get_into(key, draft.write)
        except OSError as e:                    # memory cannot take it
            draft.free()
            log.info("%s: remote version not promoted: %s", _k(key), e.strerror or e)
            return None
        except BaseException:
            draft.free()
            raise
        if entry is None:
            draft.free()
            return None
        dirty = self.ssd is not None            # the background writer puts it on the SSD
        with self.lock:
            ref = self.cache.peek(key)
            local = ref is not None or (self.ssd is not None and key in self.ssd)
            if not local:
                ref = self.cache.publish(draft, key, dirty=dirty, version=entry.version)
                if dirty:
                    self._dirty_since[key] = time.monotonic()
                self._order.setdefault(_session_of(key),
                                       collections.OrderedDict()).setdefault(key, None)
        if local:                               # a local version arrived meanwhile
            draft.free()
            return ref if ref is not None else self._promote(key)
        self._c["remote_promotions"] += 1
        self.trace.emit("PROMOTE", key=_k(key), bytes=entry.size, version=entry.version,
                        source="remote")
        return ref

    def _remote_source(self, key: bytes):
        """For the remote writer: the current local version of key to upload,
        (payload, version, meta, release), or None if no tier holds it."""
        ref = self.cache.peek(key)
        if ref is not None:
            return ref, ref.version, self.meta_of(key), ref.release
        entry = self.ssd.get(key) if self.ssd is not None else None
        if entry is None:
            return None
        try:
            reader = SSDReader(entry)
        except (CorruptSlot, StaleEntry, OSError):
            return None                 # (a newer version is queued in its turn)
        return reader, entry.version, self.meta_of(key), reader.release

    def remote_lookup(self, key: bytes) -> Optional["RemoteEntry"]:
        """The remote manifest of a slot no local tier holds (a lookup that
        found no name): version, size and meta to make a name from; None if
        the remote tier has none, or there is no remote tier.  Network I/O:
        call it off the trio thread."""
        if self.remote is None:
            return None
        return self.remote.stat(key)

    def remote_wait(self, key: bytes, timeout: Optional[float] = None) -> None:
        """With a durable or strong remote tier: wait until key's current
        version is uploaded (and, strong, acknowledged or timed out).  A
        durable tier that could not take it raises OSError(EIO)."""
        r = self.remote
        if r is None or not (r.durable or r.strong):
            return
        if r.pending(key) is None and r.last_failed(key) and key in self:
            r.put_async(key, lambda: self._remote_source(key))     # try again now
        if not r.wait(key, timeout) and r.durable:
            raise OSError(errno.EIO, f"remote tier did not take {_k(key)}")

    def set_remote_strong(self, on: bool) -> None:
        """coherence_protocol=2: writers wait for other mounts' acknowledgements."""
        if self.remote is not None:
            self.remote.strong = on

    def remote_statistics(self) -> Optional[RemoteStats]:
        """The remote tier's record, with the two figures the store counts
        for it (remote_drops, remote_promotions); None without the tier."""
        if self.remote is None:
            return None
        return dataclasses.replace(self.remote.statistics(),
                                   remote_drops=self._c["remote_drops"],
                                   remote_promotions=self._c["remote_promotions"])

    def _local_ident(self, key: bytes, want_crc_for: Optional[tuple] = None):
        """(version, size, crc32c) of the current local copy, or None.  The
        crc of a memory copy is computed only when version and size match
        `want_crc_for` (it reads the whole slot)."""
        ref = self.cache.peek(key)
        if ref is not None:
            try:
                v, n = ref.version, ref.size
                if want_crc_for is not None and (v, n) == tuple(want_crc_for[:2]):
                    return (v, n, ref.crc32c())
                return (v, n, None)
            finally:
                ref.release()
        entry = self.ssd.get(key) if self.ssd is not None else None
        if entry is not None:
            return (entry.version, entry.size, entry.crc)
        return None

    def _drop_unless(self, key: bytes, keep: Optional[tuple], reason: str) -> bool:
        """Drop key's local copies (memory, SSD) and its name unless the
        current local copy is version `keep` (version, size, crc).  A local
        publish that lands meanwhile is kept.  Returns whether it dropped."""
        cur = self._local_ident(key, keep)
        if cur is not None and keep is not None and cur == tuple(keep):
            return False
        dropped = False
        if cur is not None:
            with self.lock:
                ref = self.cache.peek(key)
                if ref is not None:
                    newer = ref.version > cur[0]
                    ref.release()
                    if newer:
                        return False            # published here meanwhile: ours goes up
                    self.cache.remove(key)
                    dropped = True
            if self.ssd is not None:
                entry = self.ssd.get(key)
                if entry is not None and entry.version <= cur[0]:
                    dropped = self.ssd.remove(key) or dropped
        if dropped:
            self._c["remote_drops"] += 1
        self.trace.emit("REMOTE_INVALIDATE", key=_k(key), dropped=int(dropped), why=reason)
        self._dropped(key, reason)              # the name goes; a lookup finds the new one
        return True

    def _remote_invalidated(self, key: bytes, origin: str, v: "RemoteVersion") -> None:
        """Another mount published (or deleted) key.  Announcements from
        different mounts may arrive out of order, so the manifest decides:
        local copies stay only if they are the version it names."""
        pending = self.remote.pending(key)
        if pending == "queued":
            return                              # our newer version goes up after theirs
        if pending == "inflight":
            self.remote.wait(key)               # then the manifest says who came last
        cur = self._local_ident(key, None if v.deleted else v.ident())
        if cur is None:
            self._dropped(key, "remote-invalidated")    # a name made from an older manifest
            return
        if pending is None and not v.deleted and cur == v.ident():
            return                              # we hold what was announced
        res = self.remote.stat_many([key]).get(key)
        keep = None if isinstance(res, Exception) or res is None or res.deleted else res.ident()
        self._drop_unless(key, keep, "remote-invalidated")

    def _remote_reconnected(self) -> None:
        """The announcement channel is (re)connected: some may have been
        missed, so check every local slot against its remote manifest.  Kept:
        the same version as the manifest, no remote copy at all (never
        uploaded, or evicted there), a local publish still queued.  Dropped:
        another version, a tombstone, a manifest that cannot be read now."""
        keys = set(self.cache.keys())
        if self.ssd is not None:
            keys.update(self.ssd.keys())
        keys = [k for k in keys if self.remote.pending(k) is None]
        if not keys:
            return
        results = self.remote.stat_many(keys)
        dropped = 0
        for key, res in results.items():
            if res is None or self.remote.pending(key) is not None:
                continue
            keep = None if isinstance(res, Exception) or res.deleted else res.ident()
            dropped += self._drop_unless(key, keep, "remote-reconnect")
        log.info("remote: checked %d local slots after (re)connecting; %d dropped",
                 len(results), dropped)
