"""Opening files: create and open of slots and control-plane files (a mixin
of MemosOperations; composed in operations.py).

Versions and the page cache.  A slot's bytes change only by publish (a
writer's flush/close or fsync: files.py, publish.py).  Readers go through
the page cache with keep_cache, so a re-read costs no request.  Writers go
through it too (shared mmap works, the kernel keeps their size and O_APPEND
offsets), and it is theirs alone while they are open: readers of that inode
read around it (direct_io).  The invariant that makes this safe: *all
reader handles open on one inode's page cache read the same version*.  A
publish while readers hold the inode therefore gives the name a fresh inode
(the old one is "superseded" and keeps serving its readers their snapshot);
a publish with no reader open updates the inode in place, and the next
reader's open drops the stale pages (keep_cache off once) -- unless they
are the version's: the pages its writers' writes left, when every write
since the first writer's open (which dropped the pages) went through them
into the draft published there last (the slot table's `trusted`, files.py
`_writer_gone`).  A reader's close sends no flush (FOPEN_NOFLUSH, set by
the shim on a fast open).  A writer that
cannot share the inode it opened (readers keep it, or another writer
replaces the whole slot) gets ESTALE, which makes the kernel redo the
lookup and retry the open once (`_send_back`); a retry that still cannot
share the inode gets a draft of its own (`_open_private`).

The slot table decides (`SlotTable.open_plan`, native/slot.c): which inode
a handle goes on, whether it waits, is refused, is sent back, or gets a
draft of its own; this module carries the plan out -- the version read
back from a tier, the base a writer starts from, the passthrough files.

Owns: create, open, the carrying out of the table's plans (`_open_version`,
`_version_ref`), handles on slots (`_open_slot`: a reader's pinned
snapshot, or a share of the writers' draft) and on pseudo-files
(`_open_pseudo`, whose modes the daemon enforces itself), the coherence
hold a handle takes at open (`_attach`).

May call: the slot table, the store (get, load, draft, publish, tier_of),
coherence (acquire, release), tenants (hold), publish.py (`_settle_quota`,
`_logical`), passthrough.py, notify.py (`_forget_attrs`, `_forget_entry`),
the OpsCore helpers (core.py).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from typing import Optional

import pyfuse3
import trio

from memosfs import _native
from memosfs.fuse.coherence import Hold
from memosfs.fuse.core import (
    PUSH_WAIT_S, WRITER_RETRY_S, FastCtx, NeedRoom, OpsCore, Refused, log, refuse, tgid_of)
from memosfs.fuse.fedtree import FED_INO
from memosfs.fuse.nodes import SLOT_DIRS, Dir, Handle, Pseudo, Slot, now_ns
from memosfs.fuse.tenants import OverLimit

__all__ = ["OpenOps"]


class OpenOps(OpsCore):
    """Opening slots and control files (see the module docstring)."""

    # -- the fast path (memosfs._fuseshim.install_fast; see files.py) -------
    #
    # open and create are answered on the spot only where nothing in them
    # can wait: coherence protocol 0 or 1 (no holder to wait for), a reader
    # of a version in memory, or of a small SSD version whose record the page
    # cache holds (promoted by fast_open itself: no read that waits), never
    # one the SSD or the remote tier must read back,
    # a create of a new name or a whole new version (O_TRUNC: no base to read
    # back), no page-cache push to wait out.  The checks mirror every await
    # of the handlers below; the handler itself then runs, one send finishing it.

    def fast_open(self, inode: int, flags: int, uid: int, gid: int, pid: int, umask: int):
        """open answered on the spot (a FileInfo or -errno), or None."""
        if inode >= FED_INO or self.coherence.protocol > 1 \
                or flags & os.O_ACCMODE != os.O_RDONLY:
            return None
        node = self.inodes.get(inode)
        if not isinstance(node, Slot) or node.latest() is not node or node.detached \
                or not node.version:
            return None
        tier = self.store.tier_of(node.key)
        if tier == "ssd" and self.pt is None:
            # a small slot only the SSD tier holds, whose record the page
            # cache holds: promoted here (one pread that never waits, its
            # checksum), handed to the open below (_open_version)
            early = self.store.get_resident(node.key)
            if early is None:
                return None
            self._early = (node.key, early)
        elif tier != "mem":
            return None
        try:
            return self._run_now(self.open(inode, flags, FastCtx(uid, gid, pid, umask)))
        finally:
            left = self._early
            self._early = None
            if left is not None:
                left[1].release()               # the open did not take it

    def fast_create(self, parent_inode: int, name: bytes, mode: int, flags: int, uid: int,
                    gid: int, pid: int, umask: int):
        """create answered on the spot ((FileInfo, EntryAttributes) or
        -errno), or None."""
        if parent_inode >= FED_INO or self.coherence.protocol > 1:
            return None
        parent = self.inodes.get(parent_inode)
        if not isinstance(parent, Dir):
            return None
        existing = parent.children.get(name.decode("utf-8", "surrogateescape"))
        if existing is not None:
            if not (flags & os.O_TRUNC) or not isinstance(existing, Slot) \
                    or existing.pushing or existing.readers or existing.writers:
                return None
        return self._run_now(self.create(parent_inode, name, mode, flags,
                                         FastCtx(uid, gid, pid, umask)))

    async def create(self, parent_inode, name, mode, flags, ctx):
        """A new slot in a session (or a directory below one), open for
        writing; it is published (as an empty or written version) by the
        opener's close or fsync.  Until then only the writing process finds
        it.  +1 lookup."""
        # A writer sent back (ESTALE) whose name was gone by the kernel's
        # retry comes back here, not to open: its retry is spent, and a later
        # open of its own is a first try (`_is_retry`)
        self._sent_back.pop(ctx.pid, None)
        parent = self._dir(parent_inode)
        n = self._name(name)
        if parent.level not in SLOT_DIRS:
            raise refuse(errno.EPERM, "create %s: a slot belongs in agent/session/ or below",
                         n)
        existing = parent.children.get(n)
        if existing is not None and flags & os.O_EXCL:
            raise pyfuse3.FUSEError(errno.EEXIST)
        key = parent.key_of(n)
        if len(key) > _native.KEY_MAX:
            raise refuse(errno.ENAMETOOLONG, "create %s: the path below the mount is %d "
                         "bytes (at most %d)", n, len(key), _native.KEY_MAX)
        hold = await self.coherence.acquire(key, self.coherence.agent_of(ctx), True,
                                            bool(flags & os.O_NONBLOCK), pid=ctx.pid)
        try:
            fi, entry = await self._create(parent, n, mode, flags, ctx)
        except BaseException:
            self.coherence.release(hold)
            raise
        self._attach(fi, hold)
        return fi, entry

    async def _create(self, parent: Dir, n: str, mode: int, flags: int, ctx):
        node = parent.children.get(n)
        tgid = tgid_of(ctx.pid)
        if node is None:
            gid = parent.gid if parent.mode & stat.S_ISGID else ctx.gid
            perm = self._new_mode(mode)

            def make(ino: int) -> Slot:
                return self._new_slot(ino, n, parent, perm, ctx.uid, gid)
            parent.mtime_ns = parent.ctime_ns = now_ns()
            if flags & os.O_ACCMODE == os.O_RDONLY:
                # creat(2) for reading: nobody will write, so the empty slot
                # is published at once and the caller reads it
                d = self._native_call(self.store.draft)
                ref = self._native_call(self.store.publish, d, parent.key_of(n))
                node = self.slots.restore(parent, n, ref.version, 0, ref.stored, make)
                ref.release()
                fi = await self._open_version(node.ino, flags, ctx)
                return fi, self._entry(node, ctx)
            node, fx = self.slots.create(parent, n, tgid, ctx.pid, True, False, make)
            fi = self._open_slot(node, flags | os.O_TRUNC, None, ctx=ctx, attached=fx)
            return fi, self._entry(node, ctx)
        if flags & os.O_EXCL:
            raise pyfuse3.FUSEError(errno.EEXIST)
        if isinstance(node, Dir):
            raise refuse(errno.EISDIR, "create %s: a directory", n)
        if not isinstance(node, Slot):
            raise refuse(errno.EEXIST, "create %s: a symbolic link or a special file", n)
        if flags & os.O_ACCMODE == os.O_RDONLY:
            # creat(2) for reading of a name another process is creating:
            # its empty version is published, and the caller reads it
            if not node.version:
                d = self._native_call(self.store.draft)
                ref = self._native_call(self.store.publish, d, node.key)
                node, _ = self.slots.set_version(node, ref.version, 0, ref.stored)
                ref.release()
            fi = await self._open_version(node.latest().ino, flags & ~os.O_TRUNC, ctx)
            return fi, self._entry(node.latest(), ctx)
        if not flags & os.O_TRUNC:
            # O_CREAT of a name that exists (the kernel asks create when its
            # dentry said no, e.g. a slot another process is creating): an
            # open that keeps the content, joining the writers' draft
            return await self._join(parent, node, flags, ctx)
        # a whole new version: readers, pushes or other writers keep the
        # inode they have, and the name moves to a fresh one for this writer
        # (the last publish wins, untorn)
        node, fx = self.slots.create(parent, n, tgid, ctx.pid, True, False, None)
        fi = self._open_slot(node, flags | os.O_TRUNC, None, ctx=ctx, attached=fx)
        return fi, self._entry(node, ctx)

    async def _join(self, parent: Dir, node: Slot, flags: int, ctx):
        """A writer that keeps the content opens node: it shares the writers'
        draft, or starts one from the published version (read first)."""
        ref = None
        if node.version and node.draft is None and node.base is None \
                and node.pt_draft is None:
            # readers that open while the base is read read around the cache
            self.slots.wait_mark(node, ctx.pid)
            try:
                ref = await self._off_loop(self.store.load, node.key)
            except BaseException:
                self.slots.pending_pop(node, ctx.pid)
                raise
            if ref is None:
                self.slots.pending_pop(node, ctx.pid)
                raise refuse(errno.ENOENT, "open %s: the slot left every tier", node.name)
        node, fx = self.slots.create(parent, node.name, tgid_of(ctx.pid), ctx.pid, False,
                                     False, None)
        fi = self._open_slot(node, flags, ref, ctx=ctx, attached=fx)
        return fi, self._entry(node, ctx)

    async def open(self, inode, flags, ctx):
        """Readers pin the version they open (a snapshot); writers share the
        slot's draft.  First the agent becomes a holder in the coherence
        directory (under protocol 2 this waits for acknowledgements or for a
        writer)."""
        node = self._node(inode)
        if isinstance(node, Dir):
            raise pyfuse3.FUSEError(errno.EISDIR)
        if isinstance(node, Pseudo):
            return self._open_pseudo(node, flags, ctx)
        live = node.latest()
        hold = await self.coherence.acquire(
            live.key, self.coherence.agent_of(ctx), (flags & os.O_ACCMODE) != os.O_RDONLY,
            bool(flags & os.O_NONBLOCK), pid=ctx.pid, defer=self._holds_inode_lock(flags))
        try:
            fi = await self._open_version(inode, flags, ctx, retry=self._is_retry(flags, ctx.pid))
        except BaseException:
            self.coherence.release(hold)
            raise
        self._attach(fi, hold)
        return fi

    def _holds_inode_lock(self, flags: int) -> bool:
        """Whether the kernel holds the opened inode's lock until this open is
        answered: an O_TRUNC open under the writeback cache (it truncates the
        inode's pages at once).  Such an open must not wait for anything that
        needs that lock: another opener's close (FLUSH takes it), a holder's
        setxattr acknowledgement."""
        return self.wb and bool(flags & os.O_TRUNC) \
            and flags & os.O_ACCMODE != os.O_RDONLY

    def _attach(self, fi: pyfuse3.FileInfo, hold: Optional[Hold]) -> None:
        if hold is not None:
            h = self.handles[fi.fh]
            h.hold = hold
            hold.handle = h

    def _is_retry(self, flags: int, pid: int) -> bool:
        """Whether this open of a whole-slot writer is the kernel's retry of
        one we answered ESTALE (it retries once; a second ESTALE would reach
        the application)."""
        sent = self._sent_back.pop(pid, None)
        return bool(flags & os.O_TRUNC) and sent is not None \
            and sent > time.monotonic() - WRITER_RETRY_S

    def _send_back(self, node: Slot, pid: int, flags: int, why: str) -> Refused:
        """ESTALE for a writer: the kernel looks the name up again and
        retries the open once; the slot table makes what the retry will find
        ready for it (a fresh inode when readers keep node)."""
        fx = self.slots.send_back(node, pid, bool(flags & os.O_TRUNC))
        if fx & _native.SLOT_FX_FORGET_ENTRY and node.parent is not None:
            self._forget_entry(node.parent, node.name)
        now = time.monotonic()
        if len(self._sent_back) > 4096:
            self._sent_back = {p: t for p, t in self._sent_back.items()
                               if t > now - WRITER_RETRY_S}
        self._sent_back[pid] = now
        return refuse(errno.ESTALE, "open %s for writing: %s", node.name, why,
                      level=logging.DEBUG)

    def _open_private(self, inode_node: Slot, flags: int, ctx) -> pyfuse3.FileInfo:
        """A whole-slot writer's retried open that still cannot share
        inode_node's draft (other writers are in; never page-cache readers,
        whose pages and size its O_TRUNC would take): its draft is its own
        (a PRIVATE inode of the slot table), written around the page cache
        (direct_io; no shared mmap), and published under the name like any
        other (the last publish wins).  (With the writeback cache, or beside
        a writers' file, the table plans no such draft: the writer shares
        the inode's draft and truncates it, as O_TRUNC does on any
        filesystem.)"""
        shadow, fx = self.slots.private(inode_node, tgid_of(ctx.pid), ctx.pid)
        fi = self._open_slot(shadow, flags | os.O_TRUNC, None, ctx=ctx, attached=fx)
        fi.direct_io = True
        self._private_writers += 1
        log.info("%s: a retried writer got a draft of its own (direct I/O)", inode_node.name)
        return fi

    async def _open_version(self, inode, flags, ctx, waited: bool = False, retry: bool = False):
        """The open of a slot, as the slot table plans it (`open_plan`):
        wait (bounded) and plan again, ENOENT, ESTALE for a writer the
        kernel retries, a draft of its own, or a handle -- a reader of the
        version the plan names (read back from a tier if need be), or a
        writer (its base read first when it keeps the content)."""
        pid = ctx.pid
        node = self._node(inode)        # the inode the kernel opens
        assert isinstance(node, Slot)
        acc = flags & os.O_ACCMODE
        write, trunc = acc != os.O_RDONLY, bool(flags & os.O_TRUNC)
        locked = self._holds_inode_lock(flags)     # (then: no wait on this inode's openers)
        holder = node.latest()
        if node.view_of is not None and self.pt is not None:
            self._pt_view_opened(node, pid)
        if not write and node.pt_backing is not None and self.pt is not None:
            self._pt_reader_gate(node, holder, pid)
        plan = self.slots.open_plan(node, tgid_of(pid), pid, write, trunc, retry, waited,
                                    locked)
        act, ino, target, version, fx = plan
        if act == _native.SLOT_OPEN_WAIT:
            # a push into the inode, a writer replacing the slot, readers of
            # the inode a retried writer found: milliseconds; wait, then plan
            # again (pending meanwhile where the table says: readers read
            # around the page cache that this writer will use)
            if target:
                self.slots.wait_mark(node, pid)
            deadline = trio.current_time() + PUSH_WAIT_S
            while trio.current_time() < deadline and self.slots.open_plan(
                    node, tgid_of(pid), pid, write, trunc, retry, False, locked)[0] \
                    == _native.SLOT_OPEN_WAIT:
                await trio.sleep(0.002)
            return await self._open_version(inode, flags, ctx, waited=True, retry=retry)
        if act == _native.SLOT_OPEN_ENOENT:
            why = "the name is gone" if holder.detached else "not published yet"
            raise refuse(errno.ENOENT, "open %s: %s", node.name, why, level=logging.DEBUG)
        if act == _native.SLOT_OPEN_SEND_BACK:
            back = self.slots.node(target) or holder
            raise self._send_back(back, pid, flags, "readers or writers keep this inode"
                                  if back is node else "a newer inode holds this name")
        if act == _native.SLOT_OPEN_PRIVATE:
            return self._open_private(node, flags, ctx)
        opened = self.slots.node(ino) or node
        if act == _native.SLOT_OPEN_WRITE:
            if fx & _native.SLOT_FX_TRUNC_DRAFT:
                return self._open_slot(opened, flags | os.O_TRUNC, None, ctx=ctx)
            ref = None
            if fx & _native.SLOT_FX_NEED_BASE:
                ref = await self._version_ref(opened, True, pid)
                if ref is not None and (ref.version != opened.version
                                        or opened.successor is not None
                                        or bool(opened.detached)):
                    # a publish moved this inode on while the base was read
                    ref.release()
                    raise self._send_back(opened, pid, flags,
                                          "a newer version landed meanwhile")
            return self._open_slot(opened, flags, ref, ctx=ctx)
        # a reader: of the version the plan names, held by `target`
        src = self.slots.node(target) or opened
        around = bool(fx & _native.SLOT_FX_DIRECT_IO)
        if around:
            ref = await self._reader_ref(src) if version else None
            return self._open_slot(opened, flags, ref, around_cache=True, ctx=ctx)
        if opened.version and self.store.tier_of(opened.key) == "ssd" and self.pt is not None \
                and not (self._early is not None and self._early[0] == opened.key):
            fi = await self._pt_ssd_reader(opened, flags, ctx)
            if fi is not None:
                return fi               # the kernel reads the SSD tier's file
        ref = await self._version_ref(opened, False, pid) if opened.version else None
        # While the SSD read ran, a publish may have moved this inode on to a
        # newer version: then this reader's version must stay out of its pages.
        stale = ref is not None and (ref.version != opened.version
                                     or opened.successor is not None or bool(opened.detached))
        return self._open_slot(opened, flags, ref, around_cache=stale, ctx=ctx)

    async def _version_ref(self, node: Slot, write: bool, pid: int):
        """The published version of node (which holds its name), pinned: a
        reader's (a lookup: hit or SSD hit) or a writer's base; read back
        from the SSD or the remote tier if need be (off the loop; a small
        one whose bytes the page cache holds at once).  ENOENT when no tier
        has it."""
        fn = self.store.load if write else self.store.get
        tier = self.store.tier_of(node.key)
        early = None
        if self._early is not None and self._early[0] == node.key and not write:
            early = self._early[1]              # fast_open promoted it from the SSD
            self._early = None
            tier = "ssd"
        if tier == "ssd" or (tier != "mem" and self.store.remote is not None):
            if write:
                # a reader that opens while the base is read must read
                # around the page cache that this writer will use
                self.slots.wait_mark(node, pid)
            try:
                ref = early if early is not None else self.store.get_resident(node.key) \
                    if tier == "ssd" and not write else None
                if ref is None:
                    if self._running_now:
                        # (the fast path: the slot left memory since fast_open
                        # looked -- an eviction runs beside the loop: its
                        # handler reads it back)
                        raise NeedRoom()
                    ref = await self._off_loop(fn, node.key)  # SSD or remote
            except BaseException:
                if write:
                    self.slots.pending_pop(node, pid)
                raise
        else:
            ref = self._native_call(fn, node.key)
        if ref is None:
            self.slots.pending_pop(node, pid)
            raise refuse(errno.ENOENT, "open %s: the slot left every tier", node.name)
        if tier != "mem":
            self._settle_quota(node.key)    # brought in: its agent stays in its quota
        if self.store.remote is not None and tier not in ("mem", "ssd") \
                and node.successor is None and not node.detached and not node.writers:
            # the remote tier may have had another mount's newer version
            # than the manifest this name was made from: show that one
            logical = self._logical(ref)
            size = len(logical) if logical is not None else ref.size
            if (ref.version, size) != (node.version, node.pub_size):
                self.slots.set_version(node, ref.version, size, ref.stored)
                self._forget_attrs(node)
        return ref

    async def _reader_ref(self, node: Slot) -> "_native.Ref":
        """A reader's pinned version of the slot `node` (which holds its name),
        read back from the SSD or remote tier if need be; ENOENT if no tier
        has it."""
        if self.store.tier_of(node.key) == "mem":
            ref = self._native_call(self.store.get, node.key)
        else:
            ref = await self._off_loop(self.store.get, node.key)
        if ref is None:
            raise refuse(errno.ENOENT, "open %s: the slot left every tier", node.name)
        return ref

    def _open_pseudo(self, node: Pseudo, flags: int, ctx=None) -> pyfuse3.FileInfo:
        """The mode is enforced here too (a mount without default_permissions
        must not open the trace or the knobs to every uid): root gets the
        owner bits, every other uid the other bits."""
        acc = flags & os.O_ACCMODE
        uid = ctx.uid if ctx is not None else 0
        bits = (node.mode >> 6) & 7 if uid == 0 else node.mode & 7
        if acc != os.O_WRONLY and not bits & 4:
            raise refuse(errno.EACCES, "open %s for reading by uid %d: mode %o",
                         node.name, uid, stat.S_IMODE(node.mode))
        if acc != os.O_RDONLY and not bits & 2:
            raise refuse(errno.EACCES, "open %s for writing by uid %d: mode %o",
                         node.name, uid, stat.S_IMODE(node.mode))
        fh = self._fh()
        h = Handle(fh, node, flags, "pseudo")
        h.uid = uid
        if acc != os.O_WRONLY and node.read is not None:
            h.data = node.read().encode()
        self.handles[fh] = h
        node.handles += 1
        fi = pyfuse3.FileInfo(fh=fh)
        fi.direct_io = True
        fi.keep_cache = False
        return fi

    def _open_slot(self, node: Slot, flags: int, ref: Optional["_native.Ref"],
                   around_cache: bool = False, ctx=None,
                   attached: Optional[int] = None) -> pyfuse3.FileInfo:
        """A handle on node; `ref` (pinned, taken over) is the reader's
        version or the writers' base.  The slot table attaches it (attached:
        the effects of an attach already made, by a create)."""
        acc = flags & os.O_ACCMODE
        fh = self._fh()
        fi = pyfuse3.FileInfo(fh=fh)
        pid = ctx.pid if ctx is not None else 0
        uid = ctx.uid if ctx is not None else 0
        if acc == os.O_RDONLY:
            if ref is not None:
                try:
                    self.tenants.hold(uid, node.ino, ref)
                except OverLimit as e:
                    ref.release()
                    raise refuse(errno.EDQUOT, "open %s: %s", node.name, e,
                                 level=logging.WARNING) from None
            h = Handle(fh, node, flags, "read")
            h.uid = uid
            h.ref = ref
            h.decoded = self._logical(ref)
            version = ref.version if ref is not None else 0
            mode = 0
            if node.writers or node.writer_pending or around_cache:
                # The writers' draft lives in this inode's page cache: read
                # around it.
                mode = 1
                fi.direct_io = True
                h.dio = True
                if self.pt is not None and node.pt_backing is not None:
                    # (the gate let it in: the writers' own unpublished file,
                    # or the mirror of its version)
                    h.pt = self._pt_attach(node, fh, node.pt_backing[1])
            elif self.pt is not None and h.decoded is None and self._pt_reader(node, fh, ref):
                h.pt = True             # the kernel reads the version's mirror
                mode = 2
            if self.pt is not None and not h.pt and node.pt_backing is not None:
                # the kernel would refuse (EIO) any open of this inode that
                # is not on its backing file: a reader's view serves this one
                if ref is not None:
                    self.tenants.unhold(uid, node.ino, ref)
                    ref.release()
                raise self._pt_to_view(node, node.latest(), pid)
            fx = self.slots.attach_reader(node, version, mode)
            if mode == 0:
                if fx & _native.SLOT_FX_DIRECT_IO:      # (cannot be: checked above)
                    fi.direct_io = h.dio = True
                fi.keep_cache = bool(fx & _native.SLOT_FX_KEEP_CACHE)
            node.atime_ns = now_ns()
        else:
            if node.readers or node.pushing:
                log.error("internal check failed: a writer on %s (inode %d) beside %d page-cache readers, %d pushes",
                          node.name, node.ino, node.readers, node.pushing)
            h = Handle(fh, node, flags, "write")
            h.opener = tgid_of(pid)
            h.uid = uid
            trunc = bool(flags & os.O_TRUNC)
            joined = node.pt_draft is not None
            fx = attached if attached is not None else \
                self.slots.attach_writer(node, h.opener, pid, trunc)
            try:
                if self.pt is not None and (trunc or joined) \
                        and self._pt_writer(node, fh, trunc):
                    h.pt = True         # the kernel writes the writers' file
                elif joined:
                    raise refuse(errno.EBUSY, "open %s: its writers' file is taken",
                                 node.name, level=logging.WARNING)
                elif self.pt is not None and node.pt_backing is not None:
                    # (readers' passthrough files keep the inode: the slot
                    # table sends such a writer to a fresh one first)
                    raise refuse(errno.EBUSY, "open %s for writing: the kernel reads its "
                                 "inode by passthrough", node.name, level=logging.WARNING)
            except BaseException:
                if ref is not None:
                    ref.release()
                self.slots.writer_gone(node, h.opener)
                raise
            if trunc:
                if ref is not None:
                    ref.release()
                if h.pt:
                    if joined:          # (O_TRUNC of the file its own process writes)
                        self._pt_truncate(node, 0)
                elif node.draft is None:
                    self.slots.set_draft(node, self._native_call(self.store.draft),
                                         _native.SLOT_DRAFT_ARENA)
                else:
                    node.draft.truncate(0)      # (shrinking: never refused)
            elif h.pt:
                if ref is not None:
                    ref.release()       # (joins the writers' file)
            elif fx & _native.SLOT_FX_NEED_BASE:
                if ref is None or ref.version != node.version:
                    if ref is not None:
                        ref.release()
                    ref = self._native_call(self.store.load, node.key)
                if ref is not None:
                    self.slots.set_base(node, ref, self._logical(ref))
            elif ref is not None:
                ref.release()           # (another writer came first: its draft or base)
            # Writers go through the page cache (shared mmap works, the kernel
            # keeps their size and O_APPEND offsets), which is theirs alone:
            # readers of this inode read around it while a writer is open.
            fi.keep_cache = False
        self.handles[fh] = h
        return fi
