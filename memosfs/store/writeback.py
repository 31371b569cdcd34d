"""The store's write-back: dirty versions to the SSD tier.

A dirty version reaches the SSD (1) through the C core's eviction callback
(_on_evict), before its pages are freed, (2) from the background writer
thread (_writer_loop), `writeback_delay_ms` after it was published,
(3) on persist (fsync of a slot) and flush, and (4) at close (store.py).
A tier over ssd_capacity makes room by evicting versions in its policy's
order (_make_ssd_room; memosfs/store/ssdpolicy.py).  move_out takes a
version out of memory, keeping it on the SSD tier: for the quotas (demote)
and for the operator's `evict` and `drop` commands.
SSD errors repeat for every slot: _log_io_error logs them at ERROR once
every WRITEBACK_RETRY_S, the rest at DEBUG.

Owns (as WriteBackMixin, one of Store's bases): _on_evict, _write_back,
_make_ssd_room, _save_meta_pending, persist, flush, demote, move_out,
keys_lru_first, the background writer's loop (started by
Store.start_background) and their helpers.  Uses the state Store.__init__ creates (cache, ssd, remote, lock, _recency,
_dirty_since, _meta_pending, _renamed_unsaved, _c, trace, prefetch, meta_of,
writeback_delay_ms, _stop, _wake, _last_error_log).  Calls, through self,
remote_wait (remoteglue.py), save_metadata and _dropped (namespace.py);
imports memosfs.store.ssd and common.  Lock order: ssd.write_lock (inside
ssd.put), then self.lock; self.lock is never held across file I/O.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from typing import TYPE_CHECKING, Optional

from memosfs.store.common import UnsavedSlots, _k, said
from memosfs.store.ssd import SSDFull

if TYPE_CHECKING:
    from memosfs import _native

log = logging.getLogger("memosfs.store.store")     # one logger for the whole store

WRITEBACK_RETRY_S = 5.0     # a failed background write-back waits this long
CLEAN_AHEAD_AT = 0.75       # memory this full: dirty versions are written back ahead of eviction
CLEAN_AHEAD_TO = 0.5        # ... until the dirty ones beyond this share of memory are clean
CLEAN_AHEAD_WAKE = 1 << 20  # a publish this large wakes the background writer to check
META_SAVE_GAP_S = 0.5       # order.json / policy.json in the background at most this often
SSD_VICTIMS_BATCH = 8       # SSD victims asked of the policy at a time
EVICT_LOG_GAP_S = 5.0       # SSD evictions are logged at most this often (the rest folded)
EVICT_LOG_NAMES = 5         # slots a folded line names (then a count)


class WriteBackMixin:
    """Dirty versions to the SSD (a base of Store; see the module docstring)."""

    # ---- the eviction callback ----

    def _on_evict(self, ref: "_native.Ref") -> bool:
        """From the C core, victim pinned: write it back if dirty, then let it
        go.  A victim that is no longer its key's current version (replaced,
        renamed or removed while its write-back ran) touches no name: the C
        core frees only a victim that is still live.  The name is dropped,
        and the data counted lost, only when no tier holds the key."""
        if ref.dirty and ref.live and self.ssd is not None:
            try:
                self._write_back(ref, durable=False)
                self._c["evict_writebacks"] += 1
            except OSError as e:
                self._log_io_error("eviction kept %s in memory: write-back failed: %s",
                                   _k(ref.key), said(e))
                return False
        with self.lock:                         # publish and rename take it too
            if not ref.live:
                return True                     # an old version: nothing to drop
            key = ref.key                       # its key now (a rename moves it)
            entry = self.ssd.get(key) if self.ssd is not None else None
            if self.ssd is not None and ref.dirty:
                return False                    # its write-back lost a race: later
            gone = entry is None
            lost = ref.dirty                    # no SSD tier: memory had the only copy
        self.trace.emit("EVICT", key=_k(key), bytes=ref.size, version=ref.version,
                        to="ssd" if self.ssd is not None else "none")
        if lost:
            log.warning("evicting %s (%d bytes): no SSD tier holds it", _k(key), ref.size)
            self._c["drops_lost"] += 1
        if gone:
            self._dropped(key, "evicted")
        if self.prefetch is not None:
            self.prefetch.on_evict(key)
        return True

    # ---- write-back ----

    def _write_back(self, ref: "_native.Ref", durable: bool, room_from_older: bool = False
                    ) -> None:
        """Write the version ref pins to the SSD and mark it clean if it is
        still the current one.  When the tier is over ssd_capacity, room is
        made by evicting SSD versions (least recent first; with
        room_from_older, only versions less recent than this one)."""
        key = ref.key
        with self.lock:
            seq = self._meta_pending.get(key)   # the metadata change meta includes
        meta = self.meta_of(key)
        try:
            entry = self._put_or_make_room(ref, meta, durable, room_from_older)
        except OSError as e:
            with self.lock:                     # (unmount.py: what an unmount would lose)
                self._unsaved.pop(key, None)
                self._unsaved[key] = said(e)
            raise
        with self.lock:
            stored = self.ssd.get(key)
            if ref.live and ref.key == key and stored is not None \
                    and stored.version == ref.version \
                    and self._meta_pending.get(key) == seq:
                # (a chown after meta was read keeps it dirty: written again)
                ref.dirty = False
                self._dirty_since.pop(key, None)
                self._renamed_unsaved.discard(key)
                self._meta_pending.pop(key, None)
                self._unsaved.pop(key, None)
        if entry is None:
            return                              # a newer version, a rename or a removal won
        self._c["writebacks"] += 1
        self.trace.emit("WRITEBACK", key=_k(key), bytes=ref.size, version=ref.version)

    def _put_or_make_room(self, ref: "_native.Ref", meta: dict, durable: bool,
                          room_from_older: bool):
        """ssd.put; over ssd_capacity, room made first (ssd_full=evict) or
        ENOSPC (ssd_full=refuse)."""
        key = ref.key
        try:
            return self.ssd.put(ref, meta, durable)
        except SSDFull as full:
            if self.ssd_full == "refuse":
                # the tier keeps what it holds: this version stays in memory
                # (dirty), and new writes are refused once memory is full
                self._c["ssd_full_refusals"] += 1
                said = (f"the SSD tier reached its ssd_capacity ({self.ssd.capacity} bytes) "
                        f"and ssd_full=refuse keeps the slots it holds")
                self.ssd.trouble = said
                raise OSError(errno.ENOSPC, said) from None
            self._make_ssd_room(full.excess, keep=key, older_only=room_from_older)
            try:
                return self.ssd.put(ref, meta, durable)
            except SSDFull:                     # (no slot less recent left to evict)
                raise OSError(errno.ENOSPC, f"the SSD tier reached its ssd_capacity "
                              f"({self.ssd.capacity} bytes) and holds no less recent "
                              f"slot to make room with") from None

    def _make_ssd_room(self, excess: int, keep: bytes, older_only: bool = False) -> None:
        """Evict SSD versions in the SSD tier's policy order (the evict_policy
        knob, as in memory; with older_only, only versions less recent than
        `keep`): those memory does not hold are lost (the slot is dropped);
        those it holds become dirty.  A version replaced or removed meanwhile
        is not touched."""
        rank: dict[bytes, int] = {}
        if older_only:
            with self.lock:
                order = list(reversed(self._recency))     # most recent first
            rank = {k: i for i, k in enumerate(order)}
        floor = rank.get(keep, -1)
        freed = 0
        tried: set[bytes] = {keep}
        while freed < excess:
            batch = self.ssd.victims(SSD_VICTIMS_BATCH, skip=tried)
            if not batch:
                break
            for entry in batch:
                if freed >= excess:
                    break
                tried.add(entry.key)
                if older_only and rank.get(entry.key, -1) <= floor:
                    continue
                if not self.ssd.remove(entry.key, entry, evicted=True):
                    continue                    # replaced or removed meanwhile
                freed += entry.file_bytes
                with self.lock:
                    ref = self.cache.peek(entry.key)
                    if ref is not None:
                        ref.dirty = True
                        ref.release()
                        self._dirty_since.setdefault(entry.key, time.monotonic())
                if ref is None:
                    self._c["drops_lost"] += 1
                    self._c["ssd_evicted_slots"] += 1
                    self.trace.emit("SSD_EVICT", key=_k(entry.key), bytes=entry.size)
                    self._note_ssd_eviction(entry.key, keep)
                    self._dropped(entry.key, "ssd-evicted")

    def _note_ssd_eviction(self, key: bytes, keep: bytes) -> None:
        """Log a slot the SSD tier evicted (no other tier holds it: it is gone),
        at most once every EVICT_LOG_GAP_S: the first at once, the ones that
        follow folded into the next line (count and the first few names)."""
        with self.lock:
            folded = self._ssd_evict_log
            folded[0] += 1
            if len(folded[1]) < EVICT_LOG_NAMES:
                folded[1].append(_k(key))
            now = time.monotonic()
            if now - folded[2] < EVICT_LOG_GAP_S:
                return
            count, names = folded[0], folded[1]
            self._ssd_evict_log = [0, [], now]
        self._log_ssd_evictions(count, names, f"to make room for {_k(keep)}")

    def _log_ssd_evictions(self, count: int, names: list, why: str) -> None:
        more = f" and {count - len(names)} more" if count > len(names) else ""
        log.warning("the SSD tier reached its ssd_capacity (%d bytes): %d slot%s evicted from "
                    "it %s, the coldest first (no other tier held them: they are gone): %s%s "
                    "(ssd_full=evict; ssd_full=refuse refuses new writes instead)",
                    self.ssd.capacity, count, "" if count == 1 else "s", why,
                    ", ".join(names), more)

    def flush_eviction_log(self, due_only: bool = False) -> None:
        """Log the SSD evictions folded since the last line (at unmount; with
        due_only, from the background writer, once EVICT_LOG_GAP_S has
        passed since that line)."""
        with self.lock:
            count, names, last = self._ssd_evict_log
            if not count or (due_only and time.monotonic() - last < EVICT_LOG_GAP_S):
                return
            self._ssd_evict_log = [0, [], time.monotonic()]
        self._log_ssd_evictions(count, names, "since the last such line")

    def _save_meta_pending(self, only: Optional[bytes] = None) -> None:
        """Metadata changed while memory did not hold the slot (mark_dirty):
        rewrite it beside the SSD tier's version (SSDTier.rewrite_meta).  A
        slot memory holds dirty is left to its write-back, which carries the
        metadata.  only: that key alone (the fsync of a slot).  OSError: the
        first failure, after trying the others (they stay pending)."""
        with self.lock:
            pending = dict(self._meta_pending)
        if only is not None:
            pending = {only: pending[only]} if only in pending else {}
        failed: Optional[OSError] = None
        for key, seq in pending.items():
            ref = self.cache.peek(key)
            if ref is not None:
                try:
                    if ref.dirty:
                        continue
                finally:
                    ref.release()
            meta = self.meta_of(key)
            try:
                if meta:                        # ({}: the name is gone meanwhile)
                    self.ssd.rewrite_meta(key, meta)
            except OSError as e:
                self._log_io_error("the new owner, mode or attributes of %s could not be "
                                   "saved to the SSD tier (kept pending): %s", _k(key), e)
                failed = failed or e
                continue
            with self.lock:
                if self._meta_pending.get(key) == seq:
                    del self._meta_pending[key]
        if failed is not None:
            raise failed

    def _log_io_error(self, fmt: str, *args: object) -> None:
        """SSD trouble (a full disk) repeats for every slot: log it at ERROR
        once every WRITEBACK_RETRY_S, the rest at DEBUG."""
        now = time.monotonic()
        if now - self._last_error_log >= WRITEBACK_RETRY_S:
            self._last_error_log = now
            log.error(fmt, *args)
        else:
            log.debug(fmt, *args)

    def persist(self, key: bytes) -> None:
        """Make the slot's current version durable on the SSD (fsync of a slot)
        and, with a durable (or strong) remote tier, uploaded."""
        self._persist_local(key)
        self.remote_wait(key)

    def _persist_local(self, key: bytes) -> None:
        if self.ssd is None:
            return
        ref = self.cache.peek(key)
        if ref is None:
            self._save_meta_pending(only=key)       # a chown since it left memory
            self.ssd.sync_key(key)                  # only on the SSD: its file and rename
            return
        try:
            if ref.dirty:
                self._write_back(ref, durable=True)
            self.ssd.sync_key(key)                  # (written back before without an fsync)
        finally:
            ref.release()

    def flush(self) -> int:
        """Persist every dirty slot (durably), save the order and namespace,
        then reclaim memory.  Returns the number of slots written; raises
        UnsavedSlots (an OSError, ENOSPC when the SSD tier is full) naming
        the slots it could not write, which stay in memory, dirty.  The most
        recent slots go first, and room on a full tier is made only from
        less recent ones, so what cannot be saved is the least recent."""
        self._c["flushes"] += 1
        written = 0
        if self.ssd is not None:
            tried: dict[bytes, int] = {}            # key -> the version flushed
            failed: Optional[OSError] = None
            for key in self._keys_most_recent_first():
                ref = self.cache.peek(key)
                if ref is None:
                    continue
                try:
                    if ref.dirty:
                        tried[key] = ref.version
                        self._write_back(ref, durable=False, room_from_older=True)
                        written += 1
                except OSError as e:
                    log.error("flush could not write %s: %s", _k(key), said(e))
                    failed = failed or e
                finally:
                    ref.release()
            try:
                self._save_meta_pending()
            except OSError as e:
                failed = failed or e
            self.ssd.sync()
            self.save_metadata(durable=True)
            # what failed, and what lost its fresh SSD copy to make room (a
            # version on the SSD tier kept dirty by a chown during its
            # write-back is saved: its metadata goes with the next one)
            unsaved = [k for k, v in tried.items() if self._dirty_version(k) == v
                       and getattr(self.ssd.get(k), "version", None) != v]
            if unsaved or failed is not None:
                raise UnsavedSlots(unsaved, failed)
        swept = self.cache.sweep()              # then reclaim memory
        if self.remote is not None and self.remote.durable and not self.remote.wait_all():
            raise OSError(errno.EIO, "remote tier: queued uploads not done")
        self.trace.emit("FLUSH", written=written, swept_pages=swept)
        return written

    def demote(self, key: bytes) -> bool:
        """Move key's current version out of memory, keeping it on the SSD
        tier (written back first if dirty): an agent over its quota makes
        room this way.  False, and nothing changes, when it cannot: no SSD
        tier, not in memory, pinned, or its write-back failed."""
        try:
            return self.move_out(key, cause="quota") == "moved"
        except OSError as e:
            self._log_io_error("quota: %s stays in memory: write-back failed: %s",
                               _k(key), said(e))
            return False

    def move_out(self, key: bytes, write_back: bool = True, cause: str = "operator") -> str:
        """Take key's current version out of memory, keeping it on the SSD
        tier; nothing is ever deleted.  write_back: a dirty version is written
        back first (the `evict` command, the quotas); without it (`drop`) only
        a version the SSD tier already holds goes.  Returns "moved", or why
        nothing changed: "out" (memory does not hold it), "no-ssd" (no tier
        to keep it), "pinned", "dirty" (not written back yet, write_back
        False), "changed" (replaced, written or pinned meanwhile).  OSError:
        its write-back failed (it stays in memory, dirty)."""
        ref = self.cache.peek(key)
        if ref is None:
            return "out"
        try:
            if self.ssd is None:
                return "no-ssd"
            if ref.sticky:
                return "pinned"
            if ref.dirty:
                if not write_back:
                    return "dirty"
                self._write_back(ref, durable=False)
            with self.lock:                     # publish and rename take it too
                cur = self.cache.peek(key)
                if cur is None:
                    return "out"
                try:
                    same = cur.version == ref.version and not cur.dirty and not cur.sticky
                finally:
                    cur.release()
                entry = self.ssd.get(key)
                if not same or entry is None or entry.version != ref.version:
                    return "changed"
                self.cache.remove(key)
            self._c["demotions" if cause == "quota" else "moved_out"] += 1
            self.trace.emit("EVICT", key=_k(key), bytes=ref.size, version=ref.version,
                            to="ssd", cause=cause)
            if self.prefetch is not None:
                self.prefetch.on_evict(key)
            return "moved"
        finally:
            ref.release()

    def keys_lru_first(self, prefix: bytes) -> list[bytes]:
        """The keys under prefix that memory holds, least recently used first."""
        with self.lock:
            order = [k for k in self._recency if k.startswith(prefix)]
        return order

    def _keys_most_recent_first(self) -> list[bytes]:
        with self.lock:
            keys = dict.fromkeys(reversed(self._recency))
        keys.update(dict.fromkeys(self.cache.keys()))
        return list(keys)

    def _dirty_version(self, key: bytes) -> Optional[int]:
        """The version of key memory holds if it is dirty, else None."""
        ref = self.cache.peek(key)
        if ref is None:
            return None
        try:
            return ref.version if ref.dirty else None
        finally:
            ref.release()

    # ---- what an unmount would lose (memosfs/fuse/unmount.py) ----

    def unsaved(self) -> list[tuple[bytes, int, int, str]]:
        """(key, version, bytes, why) of each slot memory holds dirty whose
        last write-back to the SSD tier failed, the latest failure first:
        what an unmount now would lose.  Empty without an SSD tier
        (memory-only: nothing is ever written back).  Cheap when nothing
        failed (the unmount guard asks twice a second)."""
        if self.ssd is None or not self._unsaved:
            return []
        with self.lock:
            failed = dict(self._unsaved)
        out = []
        for key in reversed(list(failed)):
            ref = self.cache.peek(key)
            if ref is None:
                with self.lock:                 # (removed, renamed, or left memory saved)
                    self._unsaved.pop(key, None)
                continue
            try:
                if ref.dirty:
                    out.append((key, ref.version, ref.size, failed[key]))
                else:
                    with self.lock:
                        self._unsaved.pop(key, None)
            finally:
                ref.release()
        return out

    def ssd_room(self) -> Optional[int]:
        """Bytes the SSD tier can still take: the room left on its disk, or
        below ssd_capacity if that is less; None without an SSD tier or when
        the disk cannot say."""
        if self.ssd is None:
            return None
        try:
            st = os.statvfs(self.ssd.root)
        except OSError:
            return None
        room = st.f_bavail * st.f_frsize
        if self.ssd.capacity:
            room = min(room, max(0, self.ssd.capacity - self.ssd.used_bytes))
        return room

    # ---- the background writer ----

    def _writer_loop(self) -> None:
        last_meta = 0.0
        while not self._stop.is_set():
            delay = self.writeback_delay_ms / 1000.0
            self._wake.wait(timeout=max(0.05, min(delay / 2, 0.5)))
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._write_back_due(time.monotonic() - delay)
                self.ssd.segs.maintain()            # compaction of packed slots
                if self._meta_pending:
                    self._save_meta_pending()
                self._clean_ahead()
                self.flush_eviction_log(due_only=True)
                now = time.monotonic()
                if now - last_meta < META_SAVE_GAP_S:
                    continue                        # (woken by publishes: not each time)
                last_meta = now
                if self._recency_dirty or self._namespace_dirty:
                    self.save_metadata(durable=False)
                elif self.ssd.policy_dirty:
                    self.ssd.save_policy(durable=False)     # rate-limited
            except OSError as e:
                self._log_io_error("background writer: %s", said(e))
            except Exception:
                log.exception("background writer")

    def _clean_ahead(self) -> None:
        """Write-back ahead of eviction: when memory is CLEAN_AHEAD_AT full,
        the dirty versions are written back now, longest dirty first (the
        background writer's order), on this thread, until what is dirty among
        them would leave CLEAN_AHEAD_TO of memory for clean victims — so a
        writer that needs room finds clean victims and its request does not
        wait for the SSD.  Publishes of large versions wake this thread."""
        st = self.cache.stats()
        cap = st["capacity"]
        if not cap or st["bytes_used"] < CLEAN_AHEAD_AT * cap:
            return
        with self.lock:                         # (the dirty keys only, not every key)
            since = dict(self._dirty_since)
        dirty = sorted(since, key=since.__getitem__)
        budget = st["bytes_used"] - CLEAN_AHEAD_TO * cap
        for key in dirty:
            if budget <= 0 or self._stop.is_set():
                return
            ref = self.cache.peek(key)
            if ref is None:
                continue
            try:
                if ref.dirty and ref.live:
                    self._write_back(ref, durable=False)
                    self._c["clean_ahead"] += 1
                    budget -= ref.size
            except OSError as e:
                self._log_io_error("write-back ahead of eviction of %s failed: %s", _k(key),
                                   said(e))
                return
            finally:
                ref.release()

    def _write_back_due(self, before: float) -> None:
        with self.lock:
            due = [k for k, t in self._dirty_since.items() if t <= before]
        for key in due:
            if self._stop.is_set():
                return
            ref = self.cache.peek(key)
            if ref is None:
                with self.lock:
                    self._dirty_since.pop(key, None)
                continue
            try:
                if ref.dirty:
                    self._write_back(ref, durable=False)
                else:
                    with self.lock:
                        self._dirty_since.pop(key, None)
            except OSError as e:
                # try again later; say so once a while, not every round
                with self.lock:
                    if key in self._dirty_since:
                        self._dirty_since[key] = time.monotonic() + WRITEBACK_RETRY_S
                self._log_io_error("background write-back of %s failed (retrying in %.0f s): %s",
                                   _k(key), WRITEBACK_RETRY_S, said(e))
            finally:
                ref.release()
