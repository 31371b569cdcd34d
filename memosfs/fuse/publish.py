"""Publishing: a writers' draft becomes the slot's new version (a mixin of
MemosOperations; composed in operations.py).

A publish points the name at the new version: the slot table decides where
(`SlotTable.published`: in place, or, when readers or a page-cache push hold
the inode, on a fresh inode -- the old one keeps serving its readers their
snapshot and answers ESTALE to new writers).  The writers go on from what
they published (a lazily copied base).  Large versions are then pushed into
the kernel page cache (pagecache.py): `_version_landed` returns the claimed
push for the caller to run.  With the `quantize` knob on, the store stores
the draft's quantized container (memosfs/store/kvfile.py) and the slot shows
its logical size.

Owns: `_publish`, `_version_landed` (what follows a new version on the
caller's side: times, the kernel told, a push), `_push_after_writers`,
`_tell_unpublished`, `_settle_quota`, and the handlers' view of quantized
storage (`_logical`, `_maybe_quantize`: the store's, with its errors as
errnos).

May call: the slot table (publish decisions and records), the store
(publish, peek, quantize, logical, remember_logical, unspill), coherence
(published), tenants (make_room), the pusher (claim), files.py
(`_ensure_draft`, `_draft_from`), notify.py (`_forget_attrs`,
`_forget_entry`), the OpsCore helpers (core.py).
"""

from __future__ import annotations

import errno
import logging
import stat
import time
from typing import Optional

from memosfs import _native
from memosfs.fuse.core import (PUSH_AFTER_WRITERS_BYTES, PUSH_MIN_BYTES, WRITER_RETRY_S,
                               OpsCore, log, refuse)
from memosfs.fuse.nodes import Handle, Slot, now_ns
from memosfs.fuse.pagecache import BytesSource
from memosfs.fuse.tenants import OverLimit

__all__ = ["PublishOps"]


class PublishOps(OpsCore):
    """Publishing drafts and moving names to fresh inodes (see the module docstring)."""

    def _publish(self, h: Handle) -> Optional[tuple]:
        """Publish the writers' draft; returns a page-cache push to run, if any."""
        node = h.node
        assert isinstance(node, Slot)
        node = node.latest()
        src = h.node
        if node.detached in ("unlink", "replaced", "unpublished", "rmdir") \
                or node.parent is None or node.parent.detached:
            # Written to a name that is gone: the bytes go with it (POSIX).
            if src.changed and (node.detached == "rmdir" or (
                    node.parent is not None and node.parent.detached)):
                self._tell_unpublished(node, h.uid)
            self.slots.discarded(src)
            return None
        if src.refused:
            # A write was refused since the last publish (EFBIG, ENOSPC,
            # EDQUOT; under the writeback cache, pages the kernel could not
            # hand over): the draft lacks bytes its writers wrote, and a
            # version is never published with holes where written bytes were.
            # The version before stays (a new name never appears: it goes with
            # the last writer), and the close or fsync fails with the refused
            # write's errno.  The draft publishes again once the refused bytes
            # are written after all, or a truncate (O_TRUNC, ftruncate) cuts
            # them off.
            r = src.refused
            before = "the version before stays" if node.version else \
                "the name goes with its last writer"
            told = r.told
            self.slots.refusal_told(src)    # (said once: the close, then the release)
            raise refuse(r.code or errno.EIO, "%s: not published: a write to it was refused "
                         "(%s), so it lacks bytes its writers wrote; %s",
                         node.key.decode("utf-8", "replace"),
                         r.reason or errno.errorcode.get(r.code, "refused"), before,
                         level=logging.DEBUG if told else logging.WARNING)
        pt = src.pt_draft is not None
        if pt:
            # the kernel wrote the writers' file: a snapshot of it is the draft
            d = self._pt_snapshot(src, h)
            held = None
        else:
            d = held = self._ensure_draft(src)
            if getattr(d, "in_memory", False):
                # a memory-only tier's draft that waited in a memory file: its
                # room is made now that its size is known, whole or not at all
                # (nothing is evicted for a draft that is then refused)
                d = self._native_call(self.store.unspill, d)
            else:
                held = None
            self.slots.take_draft(src)
        # The writers go on from what is published now: their draft moves to
        # the store, they keep a (lazily copied) base.  Refused, nothing
        # changes: the writers keep their draft.

        def keep(draft) -> None:
            if pt:
                draft.free()
            elif held is not None:
                draft.free()
                self.slots.put_back_draft(src, held)
            else:
                self.slots.put_back_draft(src, draft)
        try:
            d, logical = self._maybe_quantize(d)
        except BaseException:
            keep(d)
            raise
        key = node.key
        mtime_ns = src._f(_native.SLOT_F_DRAFT_MTIME) or now_ns()
        try:
            if getattr(d, "spilled", False):
                # a spilled draft goes straight to the SSD tier, which keeps
                # the slot's metadata as this publish makes it
                meta = dict(node.meta(), logical_size=d.size, mtime_ns=mtime_ns)
                ref = self._native_call(self.store.publish, d, key, meta)
            else:
                ref = self._native_call(self.store.publish, d, key)
        except BaseException:
            if logical is None:
                keep(d)
            else:
                d.free()
                keep(self._draft_from(None, logical))
            raise
        if held is not None:
            held.free()
        if pt and logical is None:      # (quantized: readers read other bytes)
            self._pt_published(src, ref.version)
        self._settle_quota(key)
        self.tenants.pin_kept(key, ref)     # (a pin stays with the slot)
        size = len(logical) if logical is not None else ref.size
        holder, fx = self.slots.published(src, ref.version, size, ref.stored)
        self.slots.set_base(src, ref, logical)      # the writers go on from this version
        if logical is not None:
            self.store.remember_logical(key, ref.version, logical)
        self.coherence.published(h.hold)
        return self._version_landed(holder, fx, ref, mtime_ns, logical)

    def _version_landed(self, node: Slot, fx: int, ref, mtime_ns: int,
                        logical: Optional[bytes]) -> Optional[tuple]:
        """A new version of node's name landed on node (the slot table's
        `published` or `set_version` put it there, on a fresh inode when
        readers kept the old): its times, the kernel told (fx), and a push
        of it into the page cache claimed when the table says one may start
        (no writer open: then the pages are theirs)."""
        node.mtime_ns = mtime_ns
        node.ctime_ns = now_ns()
        if fx & _native.SLOT_FX_FORGET_ATTRS:
            self._forget_attrs(node)
        if fx & _native.SLOT_FX_FORGET_ENTRY and node.parent is not None:
            self._forget_entry(node.parent, node.name)
        if fx & _native.SLOT_FX_PUSH and self.pusher is not None \
                and self.knobs["page_cache_push"] and node.pub_size >= PUSH_MIN_BYTES \
                and not self._pt_reads(node, logical):
            pin = self.store.peek(node.key)
            if pin is not None:
                source = pin if logical is None else BytesSource(logical, pin)
                return self.pusher.claim(node, source)
        return None

    def _tell_unpublished(self, node: Slot, uid: int) -> None:
        """A writer's draft of a name whose directory was removed while it
        was written: published nowhere; the log and the writer's
        `.memos/why` say so (its close succeeds, as for any name unlinked
        while it is written)."""
        text = (f"{node.key.decode('utf-8', 'replace')}: not published: its directory "
                f"was removed while it was written (rmdir), so the bytes went with it")
        log.info("%s", text)
        self.why.note(uid, errno.ENOENT, text)

    def _settle_quota(self, key: bytes) -> None:
        """After a publish: an agent beyond its quota moves its own least
        recently used slots (not this one) to the SSD tier."""
        agent = key.split(b"/", 1)[0].decode("utf-8", "surrogateescape")
        if agent not in self.tenants.quotas:
            return
        try:
            self.tenants.make_room(agent, 0, keep=key)
        except OverLimit as e:
            log.warning("%s: %s (it stays beyond its quota until its slots can go)",
                        key.decode("utf-8", "replace"), e)

    def _push_after_writers(self, node: Slot) -> Optional[tuple]:
        """The last writer of node is gone: a push of the published version
        into its page cache (while writers were open the pages were theirs,
        so the version their close published was not pushed), so that the
        readers that follow read at page-cache speed, as after a write on a
        local filesystem.  None when there is nothing to push, or when two
        pushes are already under way (each pins its version in memory until
        it is done: a burst of closes must not pin the memory tier full)."""
        node = node.latest()
        if self.pusher is None or not self.knobs["page_cache_push"] \
                or self.pusher.outstanding >= 2 \
                or node.detached or not node.version or node.writers \
                or node.writer_pending or node.readers or node.pushing \
                or node.pub_size < PUSH_AFTER_WRITERS_BYTES or self._pt_reads(node, None) \
                or node.cache_version == node.version:
            return None
        pin = self.store.peek(node.key)
        if pin is None:
            return None
        if pin.version != node.version:
            pin.release()
            return None
        try:
            logical = self._logical(pin)
        except BaseException:
            pin.release()
            raise
        source = pin if logical is None else BytesSource(logical, pin)
        return self.pusher.claim(node, source)

    # ---- quantized storage (the store's: memosfs/store/kvfile.py) ----

    def _logical(self, ref: Optional["_native.Ref"]) -> Optional[bytes]:
        """The logical bytes of a quantized version (decoded once, shared by
        its readers); None for a version stored as it was written."""
        try:
            return self.store.logical(ref)
        except OSError:
            raise refuse(errno.EIO, "slot %s cannot be decoded", ref.key) from None

    def _maybe_quantize(self, d: "_native.Draft") -> tuple["_native.Draft", Optional[bytes]]:
        """With `quantize` on, a safetensors draft becomes its quantized
        container; returns (draft to publish, logical bytes or None).  A
        spilled draft (the memory tier had no room for it) is published as
        written."""
        if getattr(d, "spilled", False):
            return d, None
        try:
            return self.store.quantize(d, self.knobs["quantize"], self.knobs["quant_error_max"])
        except OSError as e:
            self._refused += 1
            raise refuse(e.errno or errno.EIO, "%s", e, level=logging.WARNING) from None
