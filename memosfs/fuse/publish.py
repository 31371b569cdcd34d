"""Publishing: a writers' draft becomes the slot's new version (a mixin of
MemosOperations; composed in operations.py).

A publish points the name at the new version: in place, or, when readers
or a page-cache push hold the inode, on a fresh inode (`_supersede`; the
old one keeps serving its readers their snapshot and answers ESTALE to new
writers).  The writers go on from what they published (a lazily copied
base).  Large versions are then pushed into the kernel page cache
(pagecache.py): `_published` returns the claimed push for the caller to run.
With the `quantize` knob on, the store stores the draft's quantized
container (memosfs/store/kvfile.py) and the slot shows its logical size.

Owns: `_publish`, `_published`, `_supersede`, `_ready_for_writer` (the
inode a writer sent back with ESTALE will find), `_settle_quota`, and the
handlers' view of quantized storage (`_logical`, `_maybe_quantize`: the
store's, with its errors as errnos).

May call: the store (publish, peek, quantize, logical, remember_logical),
coherence (published), tenants (make_room), the pusher (claim), files.py
(`_ensure_draft`, `_draft_from`, `_release_base`), notify.py
(`_forget_attrs`, `_forget_entry`), the OpsCore helpers (core.py).
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
            src.changed = False
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
            told, r.told = r.told, True     # (said once: the close, then the release)
            raise refuse(r.code or errno.EIO, "%s: not published: a write to it was refused "
                         "(%s), so it lacks bytes its writers wrote; %s",
                         node.key.decode("utf-8", "replace"),
                         r.reason or errno.errorcode.get(r.code, "refused"), before,
                         level=logging.DEBUG if told else logging.WARNING)
        pt = src.pt_draft is not None
        if pt:
            # the kernel wrote the writers' file: a snapshot of it is the draft
            d = self._pt_snapshot(src, h)
        else:
            d = self._ensure_draft(src)
        held = None
        if getattr(d, "in_memory", False):
            # a memory-only tier's draft that waited in a memory file: its
            # room is made now that its size is known, whole or not at all
            # (nothing is evicted for a draft that is then refused)
            held, d = d, self._native_call(self.store.unspill, d)
        # The writers go on from what is published now: their draft moves to
        # the store, they keep a (lazily copied) base.
        src.draft = None
        try:
            d, logical = self._maybe_quantize(d)
        except BaseException:
            if pt:
                d.free()
            elif held is not None:
                d.free()
                src.draft = held
            else:
                src.draft = d
            raise
        key = node.key
        mtime_ns = src.draft_mtime_ns or now_ns()
        try:
            if getattr(d, "spilled", False):
                # a spilled draft goes straight to the SSD tier, which keeps
                # the slot's metadata as this publish makes it
                meta = dict(node.meta(), logical_size=d.size, mtime_ns=mtime_ns)
                ref = self._native_call(self.store.publish, d, key, meta)
            else:
                ref = self._native_call(self.store.publish, d, key)
        except BaseException:
            # nothing changes: the writers keep their draft
            if pt:
                d.free()
            elif held is not None:
                d.free()
                src.draft = held
            elif logical is None:
                src.draft = d
            else:
                d.free()
                src.draft = self._draft_from(None, logical)
            raise
        if held is not None:
            held.free()
        if pt and logical is None:      # (quantized: readers read other bytes)
            self._pt_published(src, ref.version)
        self._settle_quota(key)
        self.tenants.pin_kept(key, ref)     # (a pin stays with the slot)
        self._release_base(src)
        src.base = ref                  # the writers go on from this version
        src.base_decoded = logical
        if logical is not None:
            self.store.remember_logical(key, ref.version, logical)
        src.changed = False
        self.coherence.published(h.hold)
        parent = node.parent
        current = parent.children.get(node.name)
        if node.detached:                      # dropped by the cache meanwhile
            if current is None:
                node.detached = None
                parent.children[node.name] = node
                current = node
        target = current if isinstance(current, Slot) else node
        job = self._published(target, ref, mtime_ns, logical,
                              own=target is src)
        if target is src and src.version == ref.version and logical is None:
            src.pages_version = ref.version     # its writers' pages hold this version
        else:
            target.pages_trusted = False        # another inode's bytes under this one
        return job

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

    def _published(self, node: Slot, ref: "_native.Ref", mtime_ns: int,
                   logical: Optional[bytes] = None, own: bool = True) -> Optional[tuple]:
        """Point the name at the new version: in place, or on a fresh inode
        when readers hold this one (they keep their snapshot).  own: the
        version was written through this inode (its writers' pages, or the
        kernel's own setattr); with the writeback cache the kernel keeps the
        size of an inode it knows, so a version from elsewhere (a writer on
        an older inode, a draft of its own) gets a fresh inode too."""
        if node.readers > 0 or node.pushing > 0 or (
                self.wb and not own and (node.lookups > 0 or node.handles > 0)):
            node = self._supersede(node)
        node.cache_version = -2 if node.writers else node.cache_version
        node.pt_gen += 1                # (its mirror, if any, is an older version's)
        node.version = ref.version
        node.pub_size = len(logical) if logical is not None else ref.size
        node.stored = ref.stored
        node.mtime_ns = mtime_ns
        node.ctime_ns = now_ns()
        self._forget_attrs(node)
        if self.pusher is not None and self.knobs["page_cache_push"] \
                and node.pub_size >= PUSH_MIN_BYTES and not self._pt_reads(node, logical) \
                and not node.writers and not node.writer_pending:
            # (with writers open, the page cache holds their draft: no push)
            pin = self.store.peek(node.key)
            if pin is not None:
                source = pin if logical is None else BytesSource(logical, pin)
                return self.pusher.claim(node, source)
        return None

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

    def _ready_for_writer(self, node: Slot, pid: int = 0, trunc: bool = True) -> None:
        """Before an O_TRUNC writer is sent back (ESTALE) to look the name up
        again: make sure what it will find has no page-cache readers, and
        stays so until it arrives (readers meanwhile read around the cache),
        so the kernel's one retry succeeds.  (A node that no longer holds
        its name is left as it is: the retry will not find it.)"""
        holds = not node.detached and node.parent is not None \
            and node.parent.children.get(node.name) is node
        if holds and (node.readers > 0 or node.pushing > 0 or (trunc and (
                node.writers > 0 or node.writer_pending))):
            node = self._supersede(node)
        # By pid (the kernel retries from the same thread): several writers may
        # have been sent here, and each must find no page-cache readers on its
        # one retry, however many other writers come and go meanwhile.
        node.pending[pid] = time.monotonic() + WRITER_RETRY_S

    def _supersede(self, node: Slot) -> Slot:
        """Give node's name a fresh inode holding the same version; node keeps
        serving the handles open on it (their snapshot) and answers ESTALE to
        new opens, which makes the kernel look the name up again.  node must
        hold its name (callers check): a node that left the tree is never
        put back."""
        assert node.parent is not None and node.parent.children.get(node.name) is node, \
            f"supersede of {node.name!r} (inode {node.ino}), which does not hold its name"
        new = Slot(self._new_ino(), node.name, node.parent, stat.S_IMODE(node.mode),
                   node.uid, node.gid)
        new.xattrs = dict(node.xattrs)
        new.atime_ns, new.mtime_ns, new.ctime_ns = node.atime_ns, node.mtime_ns, node.ctime_ns
        new.version, new.pub_size, new.stored = node.version, node.pub_size, node.stored
        # writers sent (ESTALE) to look this name up will find the new inode
        new.pending, node.pending = node.pending, {}
        node.parent.children[node.name] = new
        node.successor = new
        if node.pt_mirror is not None and self._pt_state is not None:
            self._pt_state.move_mirror(node, new)   # (same version; unless files read it)
        self.inodes[new.ino] = new
        self._forget_entry(node.parent, node.name)
        return new

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
