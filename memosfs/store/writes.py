"""The store's namespace writes: publish, remove, rename, ring recycling.

Publish makes a draft the slot's new version (dirty, its version one past
the newest any tier holds), records it in its session's ring, recycles the
ring's oldest slot past `ring_slots`, and queues the upload to the remote
tier.  remove, ring recycling and reset_session remove the slot from every
tier (a remote tombstone).  rename moves the slot in every tier under the
SSD writer lock, so that no write-back of the old key lands in between.

Owns (as WriteMixin, one of Store's bases): draft, spill, publish, mark_dirty,
remove, rename, session_keys, reset_session and their helpers (_recycle,
_remove_everywhere, _rename_tiers).  Uses the state Store.__init__ creates
(cache, ssd, remote, lock, _order, _recency, _dirty_since, _meta_pending,
_meta_seq, _renamed_unsaved, _c, trace, prefetch, ring_slots, meta_of,
_wake, ssd_full).  Calls, through self, _promote_remote and _remote_source
(remoteglue.py), _touch, _forget and _dropped (namespace.py),
_make_ssd_room (writeback.py); imports common, spill, ssd (SSDFull).  Lock
order: ssd.write_lock, then self.lock.

Spilled drafts (spill.py): `spill` makes a draft in a file of the SSD
directory for a writer the memory tier has no room for, and `publish` of
such a draft makes it the SSD tier's version directly (`_publish_spilled`:
the file renamed into place, memory's older version removed).
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import time
from typing import Optional

from memosfs import _native
from memosfs.store.common import _k, _session_of, make_key
from memosfs.store.spill import COPY_CHUNK, SpilledRef, SpillDraft
from memosfs.store.ssd import CorruptSlot, SSDFull, SSDReader, StaleEntry
from memosfs.store.writeback import CLEAN_AHEAD_WAKE

log = logging.getLogger("memosfs.store.store")     # one logger for the whole store


class WriteMixin:
    """Publish, remove, rename, the ring (a base of Store; see the module docstring)."""

    # ---- publish ----

    def draft(self, base: Optional["_native.Ref"] = None) -> "_native.Draft":
        return self.cache.draft(base)

    def spill(self, key: bytes, source=None, data: Optional[bytes] = None) -> SpillDraft:
        """A draft in a spill file of the SSD directory (spill.py) holding the
        bytes of `source` (a memory draft, a pinned version in memory or one
        read from its file, or None) or `data`: for a draft the memory tier
        has no room for.  OSError (a full disk, ssd_capacity) leaves no file."""
        ssd = self.ssd
        if ssd is None:
            # a memory-only tier: the draft waits in a memory file of its own
            # (no eviction is made for it until its publish knows its size)
            sp = SpillDraft(None, lambda: self.cache.capacity, self._memory_trouble, self._c)
        else:
            sp = SpillDraft(ssd.root, lambda: ssd.capacity, ssd.disk_trouble, self._c)
        try:
            if ssd is not None and source is not None \
                    and self._spill_as_overlay(key, source, sp):
                pass                                # what differs from the SSD's version only
            elif data is not None:
                sp.fill(lambda off, n: data[off:off + n], len(data))
            elif isinstance(source, _native.Ref):
                sp.fill_ref(source)
            elif source is not None:
                base = source.overlay_base() if hasattr(source, "overlay_base") else None
                fd = source.plain_fd() if hasattr(source, "plain_fd") else None
                if base is not None:
                    sp.overlay(base)                # nothing copied (spill.py)
                elif fd is not None:
                    sp.fill_file(fd, source.size)   # its data extents, in the kernel
                else:
                    sp.fill(source.read, source.size)
        except BaseException:
            sp.free()
            raise
        self._c["spills"] += 1
        self.trace.emit("SPILL", key=_k(key), bytes=sp.size)
        return sp

    def _memory_trouble(self, code: int) -> str:
        return (f"the host has no memory left for a draft the memory tier (full) "
                f"cannot take yet ({os.strerror(code)})")

    def unspill(self, sp: SpillDraft) -> "_native.Draft":
        """A memory-only tier's spilled draft as a memory draft, to publish:
        the room for its whole size is made first, evicting what it must,
        or nothing is evicted and OSError(ENOSPC) says why (EFBIG: larger
        than the memory tier).  sp is left as it was (freed by the caller
        once the draft is published)."""
        size = sp.size
        d = self.cache.draft()
        try:
            d.reserve(size)
            fd, off = sp.fd, 0
            while off < size:
                try:
                    data_at = os.lseek(fd, off, os.SEEK_DATA)
                except OSError:
                    break                           # (only a hole is left: zeros)
                hole = min(os.lseek(fd, data_at, os.SEEK_HOLE), size)
                while data_at < hole:
                    chunk = os.pread(fd, min(hole - data_at, COPY_CHUNK), data_at)
                    if not chunk:
                        break
                    d.write(data_at, chunk)
                    data_at += len(chunk)
                off = hole
        except BaseException:
            d.free()
            raise
        return d

    def _spill_as_overlay(self, key: bytes, source, sp: SpillDraft) -> bool:
        """Fill sp as an overlay (spill.py) of the version the SSD tier holds
        when source -- a memory draft or version -- is that version changed
        in pages the C core knows (`changes()`: the base's bytes to a cut,
        zeros to the size, its own pages), or is that version itself: only
        those pages are written.  False (sp untouched) otherwise."""
        ssd = self.ssd
        changes = getattr(source, "changes", None)
        if changes is None:
            return False
        ch = changes()
        if ch is None:
            if getattr(source, "dirty", True) or not getattr(source, "version", 0):
                return False
            ch = (source.version, source.size, source.size, [])    # clean: the SSD's own
        bver, bsize, cut, runs = ch
        entry = ssd.get(key)
        if entry is None or entry.base_ident is None \
                or (entry.version, entry.size) != (bver, bsize):
            return False
        try:
            reader = SSDReader(entry)               # (its checksum checked)
        except (OSError, StaleEntry, CorruptSlot):
            return False
        try:
            base = reader.overlay_base()
        finally:
            reader.release()
        if base is None:
            return False
        sp.overlay(base)
        if cut < bsize:
            sp.truncate(cut)
        if source.size != sp.size:
            sp.truncate(source.size)
        for off, n in runs:
            end = off + n
            while off < end:
                k = min(end - off, 4 << 20)
                sp.write(off, source.read(off, k))
                off += k
        return True

    def publish(self, draft: "_native.Draft", key: bytes,
                meta: Optional[dict] = None) -> "_native.Ref":
        """Make `draft` the slot's new version (dirty); returns a pinned
        reference.  A spilled draft becomes the SSD tier's version instead
        (`_publish_spilled`), with `meta` beside it (default: meta_of(key);
        the namespace gives the metadata the publish makes)."""
        if isinstance(draft, SpillDraft):
            return self._publish_spilled(draft, key, meta)
        with self.lock:
            # versions only grow, whichever tier holds the newest
            on_ssd = self.ssd.get(key) if self.ssd is not None else None
            cur = self.cache.peek(key)
            newest = max(on_ssd.version if on_ssd else 0, cur.version if cur else 0,
                         self.remote.known_version(key) if self.remote is not None else 0)
            if cur is not None:
                cur.release()
            ref = self.cache.publish(draft, key, dirty=True, version=newest + 1)
            self._dirty_since[key] = time.monotonic()
            self._c["publishes"] += 1
            sess = _session_of(key)
            order = self._order.setdefault(sess, collections.OrderedDict())
            new_key = key not in order
            order[key] = order.get(key)
        self._touch(key)
        if new_key:
            self._recycle(sess, keep=key)
        self.trace.emit("PUBLISH", key=_k(key), bytes=ref.size, version=ref.version)
        if ref.size >= CLEAN_AHEAD_WAKE and self.ssd is not None:
            self._wake.set()                        # (write-back ahead of eviction)
        if self.remote is not None:
            self.remote.put_async(key, lambda: self._remote_source(key))
        return ref

    def _publish_spilled(self, sp: SpillDraft, key: bytes,
                         meta: Optional[dict] = None) -> SpilledRef:
        """Make a spilled draft the slot's new version on the SSD tier, with
        no memory: its file is renamed into place (SSDTier.put_file; version
        one past the newest any tier holds), memory's older version goes so
        that readers find this one, and the rest is publish's (the ring and
        order, the trace, the upload).  Returns the version read from the
        same file; `sp` is consumed.  OSError (ENOSPC: the disk, or
        ssd_capacity under ssd_full=refuse or with nothing left to evict)
        changes nothing: the writers keep their draft."""
        ssd = self.ssd
        with self.lock:
            seq = self._meta_pending.get(key)   # the metadata change meta includes
        if meta is None:
            meta = self.meta_of(key)
        crc = sp.crc32c()
        size = sp.size
        try:
            entry = self._put_spilled(sp, key, meta, crc)
        except SSDFull as full:
            if self.ssd_full == "refuse":
                self._c["ssd_full_refusals"] += 1
                said = (f"the SSD tier reached its ssd_capacity ({ssd.capacity} bytes) "
                        f"and ssd_full=refuse keeps the slots it holds")
                ssd.trouble = said
                raise OSError(errno.ENOSPC, said) from None
            self._make_ssd_room(full.excess, keep=key)
            try:
                entry = self._put_spilled(sp, key, meta, crc)
            except SSDFull:
                raise OSError(errno.ENOSPC, f"the SSD tier has no room for the slot "
                              f"({size} bytes) within its ssd_capacity ({ssd.capacity} "
                              f"bytes)") from None
        path = sp.path
        ref = sp.published(key, entry.version, entry.file_bytes, entry.base_ident)
        if entry.path != path:                  # (packed: the record is a copy; an
            try:                                # overlay's record: its runs a copy)
                os.unlink(path)
            except OSError:
                pass
        with self.lock:
            self._dirty_since.pop(key, None)
            self._renamed_unsaved.discard(key)
            if self._meta_pending.get(key) == seq:
                self._meta_pending.pop(key, None)
            self._c["publishes"] += 1
            self._c["spill_publishes"] += 1
            sess = _session_of(key)
            order = self._order.setdefault(sess, collections.OrderedDict())
            new_key = key not in order
            order[key] = order.get(key)
        self._touch(key)
        if new_key:
            self._recycle(sess, keep=key)
        self.trace.emit("PUBLISH", key=_k(key), bytes=size, version=entry.version,
                        tier="ssd")
        if self.remote is not None:
            self.remote.put_async(key, lambda: self._remote_source(key))
        return ref

    def _put_spilled(self, sp: SpillDraft, key: bytes, meta: dict, crc: int):
        """The SSD tier's part of _publish_spilled, under its writer lock (no
        write-back of key lands in between): the version number, the file
        into place, memory's older version gone."""
        ssd = self.ssd
        with ssd.write_lock:
            with self.lock:
                on_ssd = ssd.get(key)
                cur = self.cache.peek(key)
                newest = max(on_ssd.version if on_ssd else 0, cur.version if cur else 0,
                             self.remote.known_version(key) if self.remote is not None
                             else 0)
                if cur is not None:
                    cur.release()
            entry = None
            if sp.overlaid:
                # what changed, appended to the slot's extent log
                entry = ssd.put_overlay(key, sp, meta, newest + 1, crc)
            if entry is None:
                sp.materialize()
                entry = ssd.put_file(key, sp.fd, sp.path, sp.size, meta, newest + 1,
                                     durable=False, crc=crc)
            with self.lock:
                self.cache.remove(key)          # readers find the SSD tier's version
        return entry

    def mark_dirty(self, key: bytes) -> None:
        """The slot's metadata (owner, mode, times, xattrs) changed: the SSD
        tier must keep the new one.  The change is pending (_meta_pending)
        until a write-back that read the metadata after it has landed: a
        version in memory is marked dirty, and its write-back carries the
        metadata; one memory does not hold gets its metadata rewritten on
        the SSD tier (_save_meta_pending, by the background writer, flush
        and fsync) -- never promoted for it: memory may be unable to take it
        (then a reader is served from the file), and the change was lost."""
        if self.ssd is None:
            return                              # memory only: the namespace has it
        with self.lock:
            self._meta_pending[key] = next(self._meta_seq)
        ref = self.cache.peek(key)
        if ref is None:
            self._wake.set()
            return
        ref.dirty = True
        ref.release()
        with self.lock:
            self._dirty_since[key] = time.monotonic()

    # ---- the ring and removals ----

    def _recycle(self, sess: bytes, keep: bytes) -> None:
        limit = self.ring_slots
        while limit:
            with self.lock:
                order = self._order.get(sess)
                if order is None or len(order) <= limit:
                    return
                oldest = next(iter(order))
            if oldest == keep:
                return
            self._c["ring_recycles"] += 1
            self._remove_everywhere(oldest)
            self.trace.emit("RING_RECYCLE", key=_k(oldest))
            self._dropped(oldest, "ring")

    def _remove_everywhere(self, key: bytes) -> bool:
        removed = self.cache.remove(key)
        if self.ssd is not None:
            removed = self.ssd.remove(key) or removed
        if self.remote is not None:
            self.remote.delete_async(key)       # a tombstone: nobody brings it back
        return removed

    def remove(self, key: bytes) -> bool:
        if self.prefetch is not None:
            self.prefetch.on_remove(key)
        self._forget(key)
        removed = self._remove_everywhere(key)
        if removed:
            self.trace.emit("REMOVE", key=_k(key))
        return removed

    def session_keys(self, agent: str, session: str) -> list[bytes]:
        with self.lock:
            order = self._order.get(make_key(agent, session, "")[:-1])
            return list(order) if order else []

    def reset_session(self, agent: str, session: str) -> int:
        """Drop every slot of a session, at any depth below it (all tiers);
        returns how many."""
        prefix = make_key(agent, session, "")           # b"agent/session/"
        with self.lock:
            keys = dict.fromkeys(k for group, order in self._order.items()
                                 if group == prefix[:-1] or group.startswith(prefix)
                                 for k in order)
        keys.update(dict.fromkeys(k for k in self.cache.keys() if k.startswith(prefix)))
        if self.ssd is not None:
            keys.update(dict.fromkeys(k for k in self.ssd.keys() if k.startswith(prefix)))
        for key in keys:
            self._remove_everywhere(key)
            self._dropped(key, "reset")
        if self.remote is not None:             # and those only the remote tier has
            self.remote.delete_session_async(prefix[:-1])
        self._c["resets"] += 1
        self.trace.emit("RESET", session=f"{agent}/{session}", slots=len(keys))
        return len(keys)

    # ---- rename ----

    def rename(self, old: bytes, new: bytes) -> bool:
        """Move a slot to a new key in every tier, replacing what was there.

        An acknowledged version never lacks a copy on the SSD: old's SSD copy
        moves to new (renamed over new's file, which is never removed first),
        even when memory holds a newer, dirty version (that one moves too and
        stays dirty).  A version only memory holds replaces new's file if new
        has one.  Durable after sync_namespace."""
        if self.prefetch is not None:
            self.prefetch.on_remove(old)
            self.prefetch.on_remove(new)
        if self.remote is not None and old not in self:
            ref = self._promote_remote(old)     # only on the remote tier: fetch it first
            if ref is not None:
                ref.release()
        if self.ssd is None:
            with self.lock:
                in_mem = self.cache.rename(old, new)
            on_ssd = False
        else:
            in_mem, on_ssd = self._rename_tiers(old, new)
        with self.lock:
            self._order_pop(old)
            self._order_pop(new)
            self.quant.forget(old)
            self.quant.forget(new)
            since = self._dirty_since.pop(old, None)
            self._dirty_since.pop(new, None)
            self._recency.pop(old, None)
            self._renamed_unsaved.discard(old)
            if in_mem or on_ssd:
                self._order.setdefault(_session_of(new), collections.OrderedDict())[new] = None
            if in_mem:
                ref = self.cache.peek(new)
                if ref is not None:
                    if ref.dirty:
                        self._dirty_since[new] = since or time.monotonic()
                        if not on_ssd and self.ssd is not None:
                            self._renamed_unsaved.add(new)
                    ref.release()
        if in_mem or on_ssd:
            self._touch(new)
            self.trace.emit("RENAME", src=_k(old), dst=_k(new))
            if self.remote is not None:
                self.remote.delete_async(old)
                self.remote.put_async(new, lambda: self._remote_source(new))
        return in_mem or on_ssd

    def _rename_tiers(self, old: bytes, new: bytes) -> tuple[bool, bool]:
        """Rename in the SSD tier, then in memory, under the SSD writer lock
        so that no write-back of `old` lands in between (it would bring the
        old name back).  Returns (moved in memory, new has an SSD copy of
        the moved slot)."""
        meta = self.meta_of(new)
        with self.ssd.write_lock:
            ref = self.cache.peek(old)
            try:
                moved = self.ssd.rename(old, new, meta, ref)
            except OSError as e:
                if ref is None:
                    raise                       # nothing changed; only the SSD holds it
                # memory holds it (dirty from here on); the SSD's copies go,
                # so that nothing stale is left under either name
                log.error("rename %s -> %s: the SSD copy could not be moved (%s); the "
                          "memory copy will be written back", _k(old), _k(new), e)
                moved = None
                self.ssd.remove(old)
                self.ssd.remove(new)
            finally:
                if ref is not None:
                    ref.release()
            with self.lock:
                in_mem = self.cache.rename(old, new)
                if not in_mem and moved is not None:
                    self.cache.remove(new)      # the replaced slot's memory copy
                if in_mem:
                    cur = self.cache.peek(new)
                    if cur is not None:
                        entry = self.ssd.get(new)
                        if entry is None or entry.version != cur.version:
                            cur.dirty = True    # memory's copy is newer than the SSD's
                        cur.release()
        return in_mem, moved is not None
