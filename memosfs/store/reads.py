"""The store's read path: lookups and promotion from the SSD tier.

Read: memory first (`cache.get`); a miss promotes the SSD's version into
memory (clean), or, when memory cannot take it now, serves it from its file
(an SSDReader, counted in direct_reads); past the SSD, the remote tier
(remoteglue.py).  A promotion that finds the SSD file replaced meanwhile
tries again (PROMOTE_TRIES); one that finds it corrupt drops the slot, or
marks memory's copy dirty when memory holds one.

Owns (as ReadMixin, one of Store's bases): get, load, peek, tier_of,
ssd_entry, `key in store`, prefetch_fetch, and the SSD promotion (_promote,
_promote_entry, _corrupt).  Uses the state Store.__init__ creates (cache,
ssd, remote, lock, _c, _dirty_since, trace, prefetch).  Calls, through self,
_promote_remote (remoteglue.py), _touch and _dropped (namespace.py); imports
memosfs._native, memosfs.store.ssd and common.
"""

from __future__ import annotations

import errno
import logging
import time
from typing import Optional

from memosfs import _native
from memosfs.store.common import _k
from memosfs.store.ssd import CorruptSlot, SSDEntry, SSDReader, StaleEntry

log = logging.getLogger("memosfs.store.store")     # one logger for the whole store

RESIDENT_SLACK = 32 << 20   # get_resident: memory free beyond the slot (at most a
                            # quarter of capacity), or off the loop
RESIDENT_ROOM_S = 0.5       # get_resident: how often it asks the cache how much is free
PROMOTE_TRIES = 64          # promotions retried while newer versions land meanwhile
                            # (each try looks the key up again: a name rewritten this
                            # often is still there, and one try that opens the file
                            # holds a stable snapshot of it)
_RACED = object()


class ReadMixin:
    """Lookups and promotion (a base of Store; see the module docstring)."""

    _resident_room = (0, float("-inf"))     # get_resident: (bytes free beyond the
                                            # slack, when asked)

    # ---- reads ----

    def get(self, key: bytes) -> Optional["_native.Ref"]:
        """Open a slot for reading: a pinned reference to its current version,
        promoted from the SSD if memory lacks it, or None (a miss)."""
        self._c["lookups"] += 1
        ref = self.cache.get(key)
        if ref is not None:
            self._c["mem_hits"] += 1
            self._touch(key)
            if self.prefetch is not None:
                self.prefetch.on_access(key, True)
            return ref
        ref = self._promote(key)
        if ref is None:
            ref = self._promote_remote(key)      # remote_hits: the tier counts them
        else:
            self._c["ssd_hits"] += 1
        if ref is not None:
            self._touch(key)
            if self.prefetch is not None:
                self.prefetch.on_access(key, False)
            return ref
        self._c["misses"] += 1
        return None

    def ssd_backing(self, key: bytes):
        """For a reader the kernel serves from the SSD tier's file itself
        (passthrough): (descriptor, entry) of key's payload-only file, its
        checksum checked once per daemon (SSDTier.open_backing), counted as
        an SSD hit and a use; None when memory holds key, the file is packed
        or in the older layout, or it fails its check (the caller reads the
        slot the usual way then).  Worker thread."""
        if self.ssd is None or self._in_memory(key):
            return None
        got = self.ssd.open_backing(key)
        if got is None:
            return None
        self._ssd_hit(key)
        return got

    def _ssd_hit(self, key: bytes) -> None:
        """A read served by the SSD tier (get's own counting, for its twins)."""
        self._c["lookups"] += 1
        self._c["ssd_hits"] += 1
        self._touch(key)
        if self.prefetch is not None:
            self.prefetch.on_access(key, False)

    def get_resident(self, key: bytes) -> Optional["_native.Ref"]:
        """get() for the event loop, when memory lacks key: a packed SSD
        version whose bytes the page cache holds is read (one pread that
        never waits for the disk, and its checksum) and promoted here, with
        no thread hand-off, when memory has room for it without evicting.
        None otherwise, and nothing counted: the caller does get() off the
        loop (a cold read, a large slot, a corrupt one, a race)."""
        entry = self.ssd.get(key) if self.ssd is not None else None
        if entry is None or not self.ssd.may_be_resident(entry):
            return None
        now = time.monotonic()
        room, when = self._resident_room
        if now - when > RESIDENT_ROOM_S or room < entry.size:
            # (the cache's figures cost ~1 ms: asked every RESIDENT_ROOM_S,
            # what this path takes counted off in between; what other
            # threads take meanwhile is what the slack is for)
            st = self.cache.stats()
            room = st["free_pages"] * _native.PAGE_SIZE \
                - min(RESIDENT_SLACK, st["capacity"] // 4)
            when = now
        self._resident_room = (room, when)
        if room < entry.size:
            return None                         # room would be made: not on the loop
        data = self.ssd.read_resident(entry)
        if data is None:
            return None
        self._resident_room = (room - entry.size, when)
        self.ssd.segs.count_read(entry.size)
        ref = self._promote_entry(key, entry, data=data)
        if ref is None or ref is _RACED:
            return None
        self._ssd_hit(key)
        return ref

    def load(self, key: bytes) -> Optional["_native.Ref"]:
        """A pinned reference to the current version, promoted from the SSD
        if need be, without counting a lookup (a writer's base)."""
        ref = self.cache.peek(key)
        if ref is None:
            ref = self._promote(key)
        return ref if ref is not None else self._promote_remote(key)

    def peek(self, key: bytes) -> Optional["_native.Ref"]:
        """A pinned reference to the in-memory version, without counting."""
        return self.cache.peek(key)

    def tier_of(self, key: bytes) -> str:
        if self._in_memory(key):
            return "mem"
        if self.ssd is not None and key in self.ssd:
            return "ssd"
        if self.remote is not None and self.remote.known_present(key):
            return "remote"
        return "none"

    def ssd_entry(self, key: bytes) -> Optional[SSDEntry]:
        return self.ssd.get(key) if self.ssd is not None else None

    def __contains__(self, key: bytes) -> bool:
        return self._in_memory(key) or (self.ssd is not None and key in self.ssd)

    def _in_memory(self, key: bytes) -> bool:
        ref = self.cache.peek(key)
        if ref is None:
            return False
        ref.release()
        return True

    def prefetch_fetch(self, key: bytes) -> bool:
        """For the prefetcher (its own thread): bring key from the SSD into
        memory without counting a lookup; True if this call put it there."""
        if self.ssd is None or self._in_memory(key):
            return False
        ref = self._promote(key, prefetched=True)
        if ref is None:
            return False
        ok = isinstance(ref, _native.Ref)        # an SSDReader: memory had no room
        ref.release()
        if ok:
            self._c["prefetched"] += 1
        return ok

    # ---- promotion from the SSD tier ----

    def _promote(self, key: bytes, prefetched: bool = False) -> Optional["_native.Ref"]:
        """Read the SSD's version of key into memory (clean); None if absent
        or corrupt (then the slot is gone and the reason logged).
        prefetched: for the prefetcher, the version is kept from eviction
        until it is read (Cache.mark_prefetched, bounded)."""
        for _ in range(PROMOTE_TRIES):
            entry = self.ssd.get(key) if self.ssd is not None else None
            if entry is None:
                return None
            result = self._promote_entry(key, entry, prefetched)
            if result is not _RACED:
                return result
        return self.cache.peek(key)

    def _promote_entry(self, key: bytes, entry: SSDEntry, prefetched: bool = False,
                       data: Optional[bytes] = None):
        """One try at promoting `entry`; _RACED if a newer version replaced
        its file meanwhile (a failed check is then no corruption: try again).
        Memory that would have to wait for room (other threads' write-backs)
        is not waited for: the version is served from its file instead.
        data: its payload, read and checked already (get_resident)."""
        draft = self.cache.draft()
        try:
            was = _native.set_nowait(True)
            try:
                if data is None:
                    self.ssd.load_into(entry, draft)
                elif data:
                    draft.write(0, data)
            finally:
                _native.set_nowait(was)
        except StaleEntry:
            draft.free()
            return _RACED                   # a newer version's file: look again
        except CorruptSlot as e:
            draft.free()
            return self._corrupt(entry, str(e))
        except OSError as e:
            draft.free()
            if e.errno not in (errno.ENOSPC, errno.EFBIG, errno.EAGAIN):
                raise
            # memory cannot take it now: serve it from its file
            try:
                reader = SSDReader(entry)
            except StaleEntry:
                return _RACED
            except CorruptSlot as c:
                return self._corrupt(entry, str(c))
            self._c["direct_reads"] += 1
            log.info("%s served from the SSD tier directly: the memory tier has no room "
                     "for it now", _k(key))
            return reader
        except BaseException:
            draft.free()
            raise
        with self.lock:
            ref = self.cache.peek(key)
            if ref is not None:                     # someone published meanwhile
                draft.free()
                return ref
            if self.ssd.get(key) is not entry:      # replaced or removed meanwhile
                draft.free()
                return _RACED
            ref = self.cache.publish(draft, key, dirty=False, version=entry.version)
            if prefetched:
                self.cache.mark_prefetched(ref)     # pinned: no eviction in between
        self._c["promotions"] += 1
        self.trace.emit("PROMOTE", key=_k(key), bytes=entry.size, version=entry.version)
        return ref

    def _corrupt(self, entry: SSDEntry, why: str):
        """entry's file failed a check when read: None if it was set aside
        (then the slot is gone from every tier, unless memory holds it),
        _RACED if the SSD tier found the index had moved on or the file
        valid after all (look again)."""
        if not self.ssd.report_corrupt(entry, why):
            return _RACED
        ref = self.cache.peek(entry.key)
        if ref is None:
            if self.ssd.get(entry.key) is None:
                self._dropped(entry.key, "corrupt")
            return None
        try:                                    # memory's copy is the only one now
            if not ref.dirty:
                ref.dirty = True
                with self.lock:
                    self._dirty_since.setdefault(entry.key, time.monotonic())
        finally:
            ref.release()
        return None
