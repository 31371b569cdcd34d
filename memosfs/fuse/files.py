"""Open files: read, write, fallocate, truncate, flush, fsync and release
(a mixin of MemosOperations; composed in operations.py).

Writers share one draft per slot (`Slot.draft`), made lazily from the base
version at the first change; a refused write or truncate changes nothing.
A writer's close publishes (flush, when the closing process is the opener),
so does fsync (which also waits until the version is durable), and the last
release publishes what the opener left; publish.py does the publishing and
returns a page-cache push that is run here.  A write to a control-plane
file is applied at once (`_write_pseudo`: EINVAL for a bad value, with the
reason logged).

A draft the memory tier has no room for (`_with_room` gives up waiting,
or memory refuses it outright: ENOSPC, EFBIG) spills, on a mount with an
SSD tier and without passthrough: `_spill_draft` moves its bytes to a file
in the SSD directory's spill/ folder (memosfs/store/spill.py, a SpillDraft
that quacks like a memory draft) and frees its memory; every later change,
read and size of it goes to that file, and its publish makes the file the
SSD tier's version.  Refused there (the disk, ssd_capacity), the write is
refused as a memory refusal was.

Owns: the handlers above, the writers' drafts (`_ensure_draft`,
`_draft_from`, `_release_base`, `_may_spill`, `_spill_draft`), the
writers' fair share (`_fair_share`: EDQUOT), and the notes
memosfs._fuseshim sends before a write or a flush (`_write_note`,
`_flush_note`).

May call: the store (draft, spill, publish, load, persist, sync_namespace),
coherence (upgrade, release), tenants, publish.py (`_publish`,
`_version_landed`, `_maybe_quantize`, `_logical`, `_settle_quota`), notify.py
(`_invalidate_pages`, `_forget_attrs`, `_forget_entry`), the pusher, the
OpsCore helpers (core.py).
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Optional

import pyfuse3
import trio

from memosfs import _native
from memosfs.knobs import KnobError
from memosfs.fuse.core import NeedRoom, NoMemory, OpsCore, log, refuse, tgid_of
from memosfs.fuse.nodes import Handle, Pseudo, Slot, now_ns
from memosfs.fuse.tenants import OverLimit

__all__ = ["FileOps"]

VIEW_READ_MIN = 64 << 10       # reads this large are answered from page views


def _views(ref: "_native.Ref", off: int, size: int) -> Optional[list]:
    """Memoryviews of ref's bytes [off, off+size), one per contiguous run
    of pages; None when that takes more than 64 (the bytes are copied
    then: a short answer would tell the kernel the file ends there)."""
    end = min(off + size, ref.size)
    out: list = []
    while off < end:
        if len(out) == 64:
            return None
        v = ref.view(off, end - off)
        if not len(v):
            return None
        out.append(v)
        off += len(v)
    return out


class FileOps(OpsCore):
    """Reading, writing and closing open files (see the module docstring)."""

    async def read(self, fh, off, size):
        """Bytes of the handle's version (a reader's snapshot, the writers' draft)."""
        h = self.handles[fh]
        if h.kind == "pseudo":
            return h.data[off:off + size]
        return self._read_now(h, off, size)

    def _read_now(self, h: Handle, off: int, size: int):
        self._read_requests += 1
        if h.hold is not None and h.hold.revoked:
            raise refuse(errno.ESTALE, "read %s: the handle's hold was revoked (reopen it)",
                         h.node.name)
        if h.kind == "read":
            if h.decoded is not None:
                return h.decoded[off:off + size]
            return h.ref.read(off, size) if h.ref is not None else b""
        node = h.node
        if node.draft is not None:
            return node.draft.read(off, size)
        if node.base_decoded is not None:
            return node.base_decoded[off:off + size]
        return node.base.read(off, size) if node.base is not None else b""

    async def write(self, fh, off, buf):
        """Into the writers' shared draft; visible to others once the opener
        closes or fsyncs.  A refused write changes nothing."""
        h = self.handles[fh]
        if h.kind == "pseudo":
            n = await self._write_pseudo(h, off, buf)
            drops, self.control.drops_due = self.control.drops_due, []
            if drops and self.is_mounted():
                with trio.move_on_after(1.0):   # (bounded: the kernel answers fast)
                    for node in drops:
                        await self._drop_pages_now(node)
            return n
        if h.kind != "write":
            raise refuse(errno.EBADF, "write on a read handle")
        writeback, self._writeback = self._writeback == (fh, off), None
        if h.hold is not None:
            await self.coherence.upgrade(h.hold, bool(h.flags & os.O_NONBLOCK))
        return await self._with_room(self._write_now, h, off, buf, writeback, node=h.node,
                                     span=(off, off + len(buf)))

    def _write_now(self, h: Handle, off: int, buf, writeback: bool) -> int:
        """The write, once the handle may write (coherence granted)."""
        node = h.node
        d = self._draft_for(node, off, off + len(buf))
        if h.append and off != d.size and not writeback:
            # the kernel placed this append by a size another process's stat
            # gave it: the record goes to the end all the same, and the
            # kernel's copy of these pages is dropped
            off = d.size
            self._invalidate_pages(node)
        end = off + len(buf)
        try:
            self._fair_share(h, node, d, end)
        except pyfuse3.FUSEError as e:
            self._refused_span(node, off, end, e)   # (EDQUOT: refused like any write)
            raise
        self._draft_call(node, d.write, off, buf, span=(off, end))
        self.slots.wrote(node, off, len(buf))       # (what was refused there is written)
        return len(buf)

    # -- the fast path (memosfs._fuseshim.install_fast) --------------------
    #
    # Synchronous twins of read and write, called by the shim on the trio
    # thread before pyfuse3 would make a task of the request: they answer
    # (bytes, a byte count, or -errno) when nothing needs to wait, and return
    # None otherwise, and the request then goes through the handlers above.

    def fast_write(self, fh: int, off: int, buf: memoryview, writepage: int):
        """write(fh, off, buf) answered on the spot, or None.  `buf` is valid
        only during the call."""
        h = self.handles.get(fh)
        if h is None or h.kind != "write" or fh in self.fed.handles:
            return None
        if h.hold is not None and not self.coherence.may_write(h.hold):
            return None
        self._writeback = None
        return self._answer("write", self._write_now, h, off, buf, bool(writepage))

    def fast_read(self, fh: int, off: int, size: int):
        """read(fh, off, size) answered on the spot, or None.  A reader of a
        version in memory is answered with views of its pages (the shim
        writes them to the kernel in one writev: no copy here)."""
        h = self.handles.get(fh)
        if h is None or h.kind == "pseudo" or fh in self.fed.handles:
            return None
        if h.kind == "read" and h.decoded is None and isinstance(h.ref, _native.Ref) \
                and size >= VIEW_READ_MIN and not (h.hold is not None and h.hold.revoked):
            views = self._answer("read", _views, h.ref, off, size)
            if views is not None:
                if isinstance(views, list):
                    self._read_requests += 1
                return views
        return self._answer("read", self._read_now, h, off, size)

    def _fair_share(self, h: Handle, node: Slot, d: "_native.Draft", end: int) -> None:
        """Before a draft grows to end bytes: the writer's uid stays within
        hold_max_per_uid and the agent within its quota (making room from
        its own slots first).  EDQUOT otherwise; nothing changes.  ENOSPC
        while the SSD tier takes nothing under ssd_full=refuse.  A spilled
        draft holds no memory: only the SSD tier's bounds apply to it."""
        if end <= d.size:
            return
        ssd = self.store.ssd
        if ssd is not None and ssd.trouble and self.store.ssd_full == "refuse":
            # the SSD tier takes nothing more and may not evict: a slot
            # written now could not be saved (ssd_full=refuse)
            self._refused += 1
            raise refuse(errno.ENOSPC, "%s; new writes are refused until there is room",
                         ssd.trouble, level=logging.WARNING)
        if getattr(d, "spilled", False):
            return                      # (a spilled draft holds no memory: spill.py)
        self.tenants.draft_started(h.uid, node)
        try:
            self.tenants.check_draft(h.uid, node, end)
            agent = node.key.split(b"/", 1)[0].decode("utf-8", "surrogateescape")
            self.tenants.make_room(agent, end, keep=None)
        except OverLimit as e:
            self._refused += 1
            raise refuse(errno.EDQUOT, "write %s: %s", node.name, e,
                         level=logging.WARNING) from None

    def fallocate(self, fh: int, mode: int, offset: int, length: int,
                  token: int = 0) -> Optional[int]:
        """fallocate(2) (through memosfs._fuseshim, on the trio thread):
        mode 0 extends the writers' draft to offset+length (zeros); other
        modes are EOPNOTSUPP.  Returns an errno (0: done), or None when the
        memory tier must make room first: a task waits for it (as a write
        does, `_with_room`) and answers with _fuseshim.fallocate_reply(token)
        (token 0: the shim cannot wait, ENOSPC now)."""
        h = self.handles.get(fh)
        if h is None or h.kind != "write":
            return errno.EBADF
        if mode != 0:
            log.info("refused (EOPNOTSUPP): fallocate mode %#x on %s", mode, h.node.name)
            return errno.EOPNOTSUPP
        if offset < 0 or length <= 0:
            return errno.EINVAL
        if h.node.pt_draft is not None:
            # the writers' file (passthrough): allocated there, as on tmpfs
            try:
                os.posix_fallocate(h.node.pt_draft.fd, offset, length)
            except OSError as e:
                return e.errno or errno.EIO
            self._pt_poll(h.node)
            return 0
        end = offset + length
        room = self._room_for_draft(h.node)
        if end > room:
            # more than the tiers could ever hold: refused before anything
            # moves (a refused fallocate changes nothing, the draft included)
            self._refused += 1
            e = refuse(errno.ENOSPC, "fallocate %s to %d bytes: the tiers have room for %d "
                       "bytes at most", h.node.name, end, room, level=logging.WARNING)
            self.why.note(h.uid, e.errno, e.reason or "")
            return errno.ENOSPC
        self._room_ok = True
        try:
            self._extend(h, end)
            return 0
        except NeedRoom:
            pass
        except pyfuse3.FUSEError as e:
            return e.errno
        finally:
            self._room_ok = False
        if not token or not self.mounted:
            return errno.ENOSPC
        trio.lowlevel.spawn_system_task(self._fallocate_later, token, h, end)
        return None

    def _room_for_draft(self, node: Slot) -> int:
        """The largest draft the tiers could take: the memory tier's
        capacity, or, where the draft may spill, what the SSD directory has
        room for besides (its disk's free space, within ssd_capacity)."""
        room = self.store.cache.capacity
        ssd = self.store.ssd
        if ssd is not None and self._may_spill(None):
            try:
                st = os.statvfs(ssd.root)
                free = st.f_bavail * st.f_frsize
            except OSError:
                free = 0
            if ssd.capacity:
                free = min(free, ssd.capacity)
            room = max(room, free + node.draft_size())
        return room


    def _extend(self, h: Handle, end: int) -> None:
        """fallocate mode 0: the draft grows to end (zeros).  Refused, it
        loses no byte: the caller is told, nothing else changes (the draft
        publishes as it would have: docs/semantics.md)."""
        node = h.node
        d = self._draft_for(node, end - 1, end, lossless=True)
        if end > d.size:
            self._fair_share(h, node, d, end)
            self._draft_call(node, d.truncate, end, span=(d.size, end), lossless=True)
            self.slots.truncated(node, end)

    async def _fallocate_later(self, token: int, h: Handle, end: int) -> None:
        """The rest of a fallocate that waits for room; answered exactly once."""
        err = errno.EIO
        try:
            await self._with_room(self._extend, h, end, node=h.node, span=(end - 1, end),
                                  lossless=True)
            err = 0
        except pyfuse3.FUSEError as e:
            err = e.errno
        except Exception:
            self._refused += 1
            log.exception("fallocate failed; answering EIO")
        finally:
            from memosfs import _fuseshim
            _fuseshim.fallocate_reply(token, err)

    async def _write_pseudo(self, h: Handle, off: int, buf: bytes) -> int:
        node = h.node
        assert isinstance(node, Pseudo) and (node.write or node.command) is not None
        text = (h.data[:off] + buf) if off else buf
        try:
            if node.command is not None:
                await node.command(text.decode("utf-8", "surrogateescape"), h.uid)
            else:
                node.write(text.decode("utf-8", "surrogateescape"))
        except KnobError as e:
            self._refused += 1
            raise refuse(errno.EINVAL, "%s: %s", node.name, e, level=logging.WARNING)
        except OSError as e:
            self._refused += 1
            raise refuse(e.errno or errno.EIO, "%s: %s", node.name, e.strerror or e,
                         level=logging.WARNING)
        h.data = text
        return len(buf)

    def _draft_call(self, node: Slot, fn, *args, span: tuple[int, int] = (0, 1),
                    lossless: bool = False):
        """A change to the draft's bytes `span`; refused, it changes nothing
        (the C core leaves a draft as it was when a write or truncate fails),
        and the draft is not published until those bytes are there
        (the slot table's refusals) -- unless the change loses no byte when
        refused (`lossless`: a fallocate, an extending truncate).  One the
        memory tier refuses raises NoMemory where the draft may spill
        (`_with_room` moves it to a spill file)."""
        try:
            return self._native_call(fn, *args, memory=node.draft is None
                                     or not getattr(node.draft, "spilled", False))
        except NoMemory as e:
            e.node, e.span, e.lossless = node, span, lossless
            raise
        except pyfuse3.FUSEError as e:
            if not lossless:
                self._refused_span(node, span[0], span[1], e)
            raise

    def _refused_span(self, node: Slot, start: int, end: int, e: pyfuse3.FUSEError) -> None:
        self.slots.refused(node, start, end, e.errno, getattr(e, "bare", None))

    def _draft_for(self, node: Slot, start: int, end: int,
                   lossless: bool = False) -> "_native.Draft":
        """The writers' draft for a change of bytes [start, end): one that
        cannot be made (memory is full) refuses that change (the slot
        table's refusals; not a `lossless` one)."""
        try:
            return self._ensure_draft(node)
        except NoMemory as e:
            e.node, e.span, e.lossless = node, (start, end), lossless
            raise
        except pyfuse3.FUSEError as e:
            if not lossless:
                self._refused_span(node, start, end, e)
            raise

    def _ensure_draft(self, node: Slot) -> "_native.Draft":
        """The writers' draft, made from the base at the first change (the
        draft holds its own copy then: the published version may be evicted
        if need be)."""
        d = node.draft
        if d is None:
            d = self._draft_from(node.base, node.base_decoded)
            self.slots.set_draft(node, d, _native.SLOT_DRAFT_ARENA)
        return d

    def _release_base(self, node: Slot) -> None:
        self.slots.release_base(node)

    def _draft_from(self, base: Optional["_native.Ref"],
                    decoded: Optional[bytes]) -> "_native.Draft":
        """A draft holding a version's logical bytes."""
        if decoded is None and base is not None and not isinstance(base, _native.Ref):
            if self._room_ok and self._may_spill(None) \
                    and base.size > self.store.cache.capacity // 2:
                # a version memory could not take at its open, half the memory
                # tier or more: its draft starts in a spill file (copied from
                # the SSD file's data extents), not read whole into memory first
                raise NoMemory(OSError(errno.EFBIG, f"a version of {base.size} bytes, read "
                                       f"from the SSD: larger than half the memory tier"))
            decoded = base.read(0, base.size)          # a version read from its file
        if decoded is None:
            return self._native_call(self.store.draft, base, memory=True)
        d = self._native_call(self.store.draft)
        try:
            self._native_call(d.write, 0, decoded, memory=True)
        except BaseException:
            d.free()
            raise
        return d

    # ---- spilled drafts (memosfs/store/spill.py) ----

    def _may_spill(self, node: Optional[Slot]) -> bool:
        """Whether node's draft may move to a spill file when the memory tier
        has no room for it: a mount with an SSD tier and without
        passthrough (its writers' files have their own room), a draft that
        is not spilled already (None: whether any draft may)."""
        if self.pt is not None:
            return False
        if node is None:
            return True
        return isinstance(node, Slot) and node.pt_draft is None \
            and not getattr(node.draft, "spilled", False)

    def _spill_draft(self, node: Optional[Slot], span: tuple[int, int]) -> bool:
        """Move node's draft -- or, before its first change, the version it
        would start from -- to a spill file in the SSD directory (its bytes
        copied, its memory freed: other writers get the room), where every
        later change, read and size of it goes.  False when it may not
        spill; a spill the SSD directory refuses (its disk is full, the
        draft is beyond ssd_capacity) refuses the change `span` instead."""
        if node is None or not self._may_spill(node):
            return False
        d = node.draft
        try:
            if d is not None:
                sp = self._native_call(self.store.spill, node.key, d)
            elif node.base_decoded is not None:
                sp = self._native_call(self.store.spill, node.key, None, node.base_decoded)
            else:
                sp = self._native_call(self.store.spill, node.key, node.base)
        except pyfuse3.FUSEError as e:
            self._refused_span(node, span[0], span[1], e)
            raise
        if d is not None:
            d.free()                    # the room goes to the other writers
        self.slots.set_draft(node, sp, _native.SLOT_DRAFT_OVERLAY if sp.overlaid
                             else _native.SLOT_DRAFT_SPILL)
        log.info("%s: the memory tier has no room for its draft (%d bytes): it continues "
                 "in %s", node.key.decode("utf-8", "replace"), sp.size,
                 "a memory file until its publish makes room" if sp.in_memory
                 else "a spill file of the SSD directory")
        return True

    async def _truncate(self, node: Slot, size: int, fh: Optional[int], ctx) -> None:
        """ftruncate, or truncate(2) by a process writing the slot: the shared
        draft.  truncate(2) by anybody else: a new version at once.  An
        ftruncate on a handle with a draft of its own (`_open_private`: node
        is the kernel's inode, the handle's node a private one) cuts that
        draft, never the inode's shared one."""
        h = self.handles.get(fh) if fh is not None else None
        if h is not None and h.kind == "pseudo":
            return
        if h is not None and h.kind == "write" and isinstance(h.node, Slot) \
                and h.node.private_of is not None:
            node = h.node
        if (h is not None and h.kind == "write") or node.writers:
            if h is not None and h.hold is not None:
                await self.coherence.upgrade(h.hold, bool(h.flags & os.O_NONBLOCK))
            # (refused, an extending truncate loses no byte: nothing else changes)
            grows = size > node.draft_size()
            await self._with_room(self._truncate_draft, node, size, grows, node=node,
                                  span=(size, size + 1), lossless=grows)
            return
        base = self._native_call(self.store.load, node.key) if node.version else None
        try:
            logical = self._logical(base) if base is not None else None
            d = None
            big = max(size, base.size if base is not None else 0) \
                > self.store.cache.capacity // 2
            if not (big and self._may_spill(node)):
                try:
                    d = self._draft_from(base, logical)
                    self._native_call(d.truncate, size)
                except pyfuse3.FUSEError as e:
                    if d is not None:
                        d.free()
                        d = None
                    if e.errno not in (errno.ENOSPC, errno.EFBIG) or not self._may_spill(node):
                        raise
            if d is None:
                # the memory tier has no room for the new version: it is made
                # in a spill file and published on the SSD tier (as a
                # writer's draft that spills, docs/semantics.md)
                d = self._native_call(self.store.spill, node.key,
                                      base if logical is None else None, logical)
                try:
                    self._native_call(d.truncate, size)
                except BaseException:
                    d.free()
                    raise
        finally:
            if base is not None:
                base.release()
        d, logical = self._maybe_quantize(d)
        ref = self._native_call(self.store.publish, d, node.key)
        size = len(logical) if logical is not None else ref.size
        holder, fx = self.slots.set_version(node, ref.version, size, ref.stored)
        job = self._version_landed(holder, fx, ref, now_ns(), logical)
        ref.release()
        if job is not None:
            trio.lowlevel.spawn_system_task(self.pusher.run, job)

    def _truncate_draft(self, node: Slot, size: int, lossless: bool = False) -> None:
        if node.pt_draft is not None:
            self._pt_truncate(node, size)
            return
        d = self._draft_for(node, size, size + 1, lossless=lossless)
        self._draft_call(node, d.truncate, size, span=(size, size + 1), lossless=lossless)
        self.slots.truncated(node, size)    # (what was refused beyond size is not wanted)

    def _write_note(self, fh: int, off: int, writepage: int) -> None:
        """From memosfs._fuseshim, just before write(fh, off): whether the
        kernel writes back cached pages (their offset holds, O_APPEND or not)."""
        self._writeback = (fh, off) if writepage else None

    def _flush_note(self, fh: int, pid: int, lock_owner: int) -> None:
        """From memosfs._fuseshim, just before flush(fh) runs: who closes."""
        self._flusher = (fh, pid)

    async def flush(self, fh):
        """close(2) of one descriptor.  Publishes the draft only when the
        closing process is the one that opened this handle for writing (its
        threads included): a forked or exec'd child closing an inherited
        copy publishes nothing.  Returns once the new version is in the
        kernel page cache too."""
        h = self.handles[fh]
        note, self._flusher = self._flusher, None
        if h.pt:
            self._pt_last_writer(h.node)    # (what the kernel wrote, mappings included)
        if not (note is not None and note[0] == fh and note[1] != h.opener
                and tgid_of(note[1]) != h.opener):
            await self._may_publish(h)          # (the opener closes: it publishes)
        job = await self._with_room(self._flush_now, fh, h, note)
        if job is not None:
            try:
                await self.pusher.run(job)
            except Exception:           # a push failure is the push's problem
                log.warning("page-cache push of %s failed", h.node.name, exc_info=True)

    async def _may_publish(self, h: Handle) -> None:
        """A writer about to publish whose agent lost its exclusive hold (a
        lease break while it was stopped; a later writer) acquires it again
        first: under protocol 2 the others acknowledge before they see the
        new version."""
        if h.kind == "write" and h.node.changed and h.hold is not None \
                and not self.coherence.may_write(h.hold):
            await self.coherence.upgrade(h.hold, bool(h.flags & os.O_NONBLOCK))

    def _flush_now(self, fh: int, h: Handle, note: Optional[tuple[int, int]]) -> Optional[tuple]:
        """flush's work: the publish (if due; `note` is who closes); returns
        the page-cache push to run, if any."""
        if h.kind != "write" or not (h.node.changed or h.node.refused):
            return None
        if note is not None and note[0] == fh and note[1] != h.opener \
                and tgid_of(note[1]) != h.opener:
            log.debug("%s: closed by pid %d, not by its opener %d: not published",
                      h.node.name, note[1], h.opener)
            return None
        if h.node.trunc_only and note is not None and note[0] == fh \
                and not self._other_writer_handle(h) \
                and self._holds_another(note[1], h.node):
            # The shell's `>`: it opens with O_TRUNC, dup2()s the descriptor
            # onto stdout and closes the one it opened, before its command
            # writes a byte.  Publishing that empty draft would replace the
            # version before (or make the name appear) even if every write
            # that follows is refused: the close of the last descriptor
            # publishes (or reports the refusal) instead.
            log.debug("%s: closed while pid %d holds another descriptor of it, nothing "
                      "written since O_TRUNC: published at the last close", h.node.name,
                      note[1])
            return None
        return self._publish(h)

    def _other_writer_handle(self, h: Handle) -> bool:
        """Whether h's opener has another write handle (another open of its
        own) on h's slot: a descriptor it still holds may then be that open's,
        which the rule "the opener's close publishes" leaves alone; only a
        descriptor that can be a copy of h itself (the shell's dup2) waits."""
        return any(o is not h and o.kind == "write" and o.node is h.node
                   and o.opener == h.opener for o in self.handles.values())

    def _holds_another(self, pid: int, node: Slot) -> bool:
        """Whether process pid still has a descriptor open on node's inode
        (its fdinfo names this mount and this inode), read from /proc without
        a request to the mount; False when /proc cannot tell."""
        mnt = self._mount_id()
        if mnt is None:
            return False
        proc = f"/proc/{pid}"
        try:
            fds = os.listdir(proc + "/fd")
        except OSError:
            return False
        tail = "/" + node.name
        for fd in fds:
            try:
                if not os.readlink(f"{proc}/fd/{fd}").endswith(tail):
                    continue                # (a cheap filter: the name)
                with open(f"{proc}/fdinfo/{fd}") as f:
                    info = f.read()
            except OSError:
                continue
            if f"\nmnt_id:\t{mnt}\n" in info and f"\nino:\t{node.ino}\n" in info:
                return True
        return False

    def _mount_id(self) -> Optional[int]:
        """This mount's id in /proc/self/mountinfo (cached), or None."""
        got = getattr(self, "_mnt_id", None)
        if got is not None or not self.mounted:
            return got
        where = getattr(self, "mountpoint", None)
        if not where:
            return None
        # The parent resolved, never the mountpoint itself: a stat of it is a
        # request to this mount, which this thread (the one serving them)
        # would wait for forever once the kernel's attributes of the root
        # have expired.
        where = os.path.abspath(where)
        where = os.path.join(os.path.realpath(os.path.dirname(where)), os.path.basename(where))
        try:
            with open("/proc/self/mountinfo") as f:
                for line in f:
                    fields = line.split()
                    point = fields[4].encode().decode("unicode_escape")
                    if point == where:
                        self._mnt_id = int(fields[0])
        except (OSError, ValueError, IndexError):
            return None
        return getattr(self, "_mnt_id", None)

    def fast_flush(self, fh: int, pid: int, lock_owner: int):
        """flush answered on the spot (0 or -errno), or None.  A publish whose
        version is pushed into the page cache (not the case while the writer
        is open, i.e. always but for a handle on a superseded inode) goes to
        the handler above, which returns once the push is done."""
        h = self.handles.get(fh)
        if h is None or fh in self.fed.handles:
            return None
        if h.pt:
            self._pt_last_writer(h.node)    # (what the kernel wrote, mappings included)
        if h.kind == "write" and h.node.changed and (
                h.node.latest() is not h.node
                or (h.hold is not None and not self.coherence.may_write(h.hold))):
            return None
        self._flusher = None
        done = self._answer("flush", lambda h: (self._flush_now(fh, h, (fh, pid)),), h)
        if done is None or isinstance(done, int):
            return done                 # (None: room must be made first, by the handler)
        job, = done
        if job is not None:
            trio.lowlevel.spawn_system_task(self.pusher.run, job)
        return 0

    def fast_release(self, fh: int):
        """release answered on the spot (it never waits), or None for
        `.federated` handles."""
        if fh not in self.handles or fh in self.fed.handles:
            return None
        try:
            self._release_now(fh)
        except Exception:
            self._refused += 1
            log.exception("release failed")
        return 0

    async def fsync(self, fh, datasync):
        """Publish, then return once this slot's version is durable on the SSD."""
        h = self.handles[fh]
        if h.kind == "pseudo":
            return
        node = h.node
        if h.pt:
            self._pt_last_writer(node)      # (what the kernel wrote, mappings included)
        if h.kind == "write" and (node.changed or node.refused):
            await self._may_publish(h)
            job = await self._with_room(self._publish, h)
            if job is not None:
                # not awaited: the kernel holds this inode's lock during fsync,
                # and the push's attribute refresh may wait on a lock held by
                # someone who waits for that one
                trio.lowlevel.spawn_system_task(self.pusher.run, job)
        if isinstance(node, Slot):
            node = node.latest()
        if isinstance(node, Slot) and node.version and not node.detached:
            await self._off_loop(self.store.persist, node.key)

    async def fsyncdir(self, fh, datasync):
        """fsync of a directory: every rename, unlink and mkdir made so far
        is durable when it returns."""
        sync = getattr(self.store, "sync_namespace", None)
        if sync is not None:
            await self._off_loop(sync)

    async def release(self, fh):
        """The last copy of a descriptor is gone: the last writer of a slot
        publishes what its opener left unpublished (a child's writes after
        the opener closed, or an opener that died); unpin, free."""
        self._release_now(fh)

    def _release_now(self, fh: int) -> None:
        h = self.handles.pop(fh)
        node = h.node
        try:
            if h.kind == "write" and node.writers == 1 and node.pt_draft is not None:
                self._pt_last_writer(node)
            if h.kind == "write" and node.writers == 1 and (node.changed or node.refused):
                try:
                    job = self._publish(h)
                except pyfuse3.FUSEError:
                    job = None  # already logged; release cannot report it
                if job is not None:
                    trio.lowlevel.spawn_system_task(self.pusher.run, job)
        finally:
            if h.ref is not None:
                if h.kind == "read":
                    self.tenants.unhold(h.uid, node.ino, h.ref)
                h.ref.release()
            self.coherence.release(h.hold)
            if h.pt:
                self._pt_detach(node)
            if not isinstance(node, Slot):
                node.handles -= 1
                self._maybe_forget(node)
            elif h.kind == "read":
                self.slots.reader_gone(node, h.dio)
            elif h.kind == "write":
                self._writer_gone(node, h)
                if not node.writers:
                    try:
                        job = self._push_after_writers(node)
                    except pyfuse3.FUSEError:
                        job = None      # (logged) the readers fetch from the daemon
                    if job is not None:
                        trio.lowlevel.spawn_system_task(self.pusher.run, job)

    def _writer_gone(self, node: Slot, h: Handle) -> None:
        """A write handle is gone (the slot table decides the rest: the last
        writer's draft and base go, the pages it left are the version's when
        everything was published through them, a create that published
        nothing loses its name; with the writeback cache a refused save
        leaves the name to a fresh inode)."""
        last = node.writers == 1
        if last and node.pt_draft is not None:
            self._pt_writers_gone(node)
        if last and node.base_decoded is not None:
            self.slots.pages_stale(node)    # (quantized: the published bytes are
                                            # not the written ones)
        elif last and not self.knobs["page_cache_push"]:
            self.slots.pages_dropped(node)  # (without pushes the writers' pages are
                                            # never trusted to be a version's)
        parent, name = node.parent, node.name
        unpublished = not node.version and not node.detached
        fx = self.slots.writer_gone(node, h.opener)
        if fx & _native.SLOT_FX_FORGET_ATTRS:
            self._forget_attrs(node)
        if fx & _native.SLOT_FX_FORGET_ENTRY and parent is not None:
            if unpublished and node.detached:
                # created and never published (its writes were refused): the
                # failed create leaves nothing behind
                log.info("%s: never published; the name goes",
                         node.key.decode("utf-8", "replace"))
                parent.mtime_ns = parent.ctime_ns = now_ns()
            self._forget_entry(parent, name)
