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
into the draft published there last (`Slot.pages_trusted`, files.py
`_writer_gone`).  A reader's close sends no flush (FOPEN_NOFLUSH, set by
the shim on a fast open).  A writer that
cannot share the inode it opened (readers keep it, or another writer
replaces the whole slot) gets ESTALE, which makes the kernel redo the
lookup and retry the open once (`_send_back`); a retry that still cannot
share the inode gets a draft of its own (`_open_private`).

Owns: create, open, the choice of the version a handle gets
(`_open_version`), handles on slots (`_open_slot`: a reader's pinned
snapshot, or a share of the writers' draft) and on pseudo-files
(`_open_pseudo`, whose modes the daemon enforces itself), the coherence
hold a handle takes at open (`_attach`).

May call: the store (get, load, draft, publish, tier_of), coherence
(acquire, release), tenants (hold), publish.py (`_published`,
`_supersede`, `_ready_for_writer`, `_settle_quota`, `_logical`), files.py
(`_changed`, `_draft_call`, `_release_base`), notify.py (`_forget_attrs`),
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
    PUSH_WAIT_S, WRITER_RETRY_S, FastCtx, OpsCore, Refused, log, refuse, tgid_of)
from memosfs.fuse.fedtree import FED_INO
from memosfs.fuse.nodes import (
    PUSH_LOCK, SLOT_DIRS, Dir, Handle, Pseudo, Slot, now_ns)
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
        if node is None:
            gid = parent.gid if parent.mode & stat.S_ISGID else ctx.gid
            node = Slot(self._new_ino(), n, parent, self._new_mode(mode), ctx.uid, gid)
            parent.children[n] = node
            parent.mtime_ns = parent.ctime_ns = now_ns()
            self.inodes[node.ino] = node
        elif flags & os.O_EXCL:
            raise pyfuse3.FUSEError(errno.EEXIST)
        elif isinstance(node, Dir):
            raise refuse(errno.EISDIR, "create %s: a directory", n)
        elif not isinstance(node, Slot):
            raise refuse(errno.EEXIST, "create %s: a symbolic link or a special file", n)
        elif not flags & os.O_TRUNC and flags & os.O_ACCMODE != os.O_RDONLY:
            # O_CREAT of a name that exists (the kernel asks create when its
            # dentry said no, e.g. a slot another process is creating): an
            # open that keeps the content, joining the writers' draft
            return await self._join(node, flags, ctx)
        elif node.readers > 0 or node.pushing > 0 or node.writers > 0:
            # an existing slot with page-cache readers or other writers: they
            # keep this inode, and the name moves to a fresh one for this
            # writer's whole new version (the last publish wins, untorn)
            node = self._supersede(node)
        if flags & os.O_ACCMODE == os.O_RDONLY:
            # creat(2) for reading: nobody will write, so the empty slot is
            # published at once and the caller reads it
            if not node.version:
                d = self._native_call(self.store.draft)
                ref = self._native_call(self.store.publish, d, node.key)
                self._published(node, ref, now_ns())
                ref.release()
            ref = self._native_call(self.store.get, node.key)
            fi = self._open_slot(node, flags, ref, ctx=ctx)
            return fi, self._entry(node, ctx)
        fi = self._open_slot(node, flags | os.O_TRUNC, None, ctx=ctx)
        return fi, self._entry(node, ctx)

    async def _join(self, node: Slot, flags: int, ctx):
        """A writer that keeps the content opens node: it shares the writers'
        draft, or starts one from the published version."""
        if node.readers > 0 or node.pushing > 0:
            node = self._supersede(node)        # its page cache is its readers'
        ref = None
        if node.version and node.draft is None and node.base is None:
            # readers that open while the base is read read around the cache
            node.pending[ctx.pid] = time.monotonic() + WRITER_RETRY_S
            try:
                ref = await self._off_loop(self.store.load, node.key)
            except BaseException:
                node.pending.pop(ctx.pid, None)
                raise
            if ref is None:
                node.pending.pop(ctx.pid, None)
                raise refuse(errno.ENOENT, "open %s: the slot left every tier", node.name)
            if node.draft is not None or node.base is not None \
                    or ref.version != node.version:
                ref.release()                   # another writer came first
                ref = None
        fi = self._open_slot(node, flags, ref, ctx=ctx)
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
        retries the open once."""
        self._ready_for_writer(node, pid, bool(flags & os.O_TRUNC))
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
        whose pages and size its O_TRUNC would take): its draft is its own,
        written around the page cache (direct_io; no shared mmap), and
        published under the name like any other (the last publish wins).

        With the writeback cache there is no such draft: the kernel truncates
        the inode's pages for an O_TRUNC open (its size is the kernel's), so
        the writer shares the inode's draft and truncates it, as O_TRUNC does
        on any filesystem (the other writers' bytes so far go with it)."""
        if self.wb or inode_node.pt_draft is not None:
            # (a writers' file the kernel writes: the only one this inode can have)
            return self._open_slot(inode_node, flags | os.O_TRUNC, None, ctx=ctx)
        shadow = Slot(self._new_ino(), inode_node.name, inode_node.parent,
                      stat.S_IMODE(inode_node.mode), inode_node.uid, inode_node.gid)
        shadow.version = inode_node.version or 1   # (never "unpublished": not in the tree)
        shadow.successor = inode_node              # publishes follow the name
        # its fstat (SEEK_END, O_APPEND) reaches inode_node: answer with its draft
        shadow.private_of = inode_node             # (and no passthrough: not its inode)
        fi = self._open_slot(shadow, flags | os.O_TRUNC, None, ctx=ctx)
        fi.direct_io = True
        inode_node.privates[tgid_of(ctx.pid)] = shadow
        inode_node.pages_trusted = False    # its bytes go around these pages
        self._private_writers += 1
        log.info("%s: a retried writer got a draft of its own (direct I/O)", inode_node.name)
        return fi

    async def _open_version(self, inode, flags, ctx, waited: bool = False, retry: bool = False):
        pid = ctx.pid
        node = self._node(inode)
        acc = flags & os.O_ACCMODE
        inode_node = node               # the inode the kernel opens
        locked = self._holds_inode_lock(flags)     # (then: no wait on this inode's openers)
        if retry and not waited and not locked and (inode_node.readers or inode_node.pushing):
            # The kernel's one retry after ESTALE found an inode whose page
            # cache readers hold (the name moved on again meanwhile: another
            # rename or publish).  A second ESTALE would reach the
            # application: wait (bounded) for them to close, new readers
            # reading around its cache meanwhile, then open as below.
            inode_node.pending[pid] = time.monotonic() + WRITER_RETRY_S
            deadline = trio.current_time() + PUSH_WAIT_S
            while (inode_node.readers or inode_node.pushing) \
                    and trio.current_time() < deadline:
                await trio.sleep(0.002)
            return await self._open_version(inode, flags, ctx, waited=True, retry=retry)
        node = node.latest()            # the one that holds the name now
        if inode_node.view_of is not None and self.pt is not None:
            self._pt_view_opened(inode_node, pid)
        if acc == os.O_RDONLY and inode_node.pt_backing is not None and self.pt is not None:
            self._pt_reader_gate(inode_node, node, pid)
        if node.detached:
            # unlinked or renamed over while this open was on its way.  A
            # reader of a name that a rename replaced is served the slot that
            # holds the name now (rename(2) is atomic: no process finds the
            # new path missing), around this inode's page cache; a reader of
            # an unlinked name finds nothing.  A writer: as if the open came
            # first — its bytes go with the name (they are never published).
            if acc == os.O_RDONLY and node.detached == "replaced":
                holder = node.name_holder()
                if holder is not None and holder.version:
                    ref = await self._reader_ref(holder)
                    return self._open_slot(inode_node, flags, ref, around_cache=True,
                                           ctx=ctx)
            if acc == os.O_RDONLY or node.detached not in ("unlink", "replaced"):
                raise refuse(errno.ENOENT, "open %s: the name is gone", node.name,
                             level=logging.DEBUG)
            if node.readers or node.pushing or inode_node.readers or inode_node.pushing:
                # its page cache is its readers' snapshot: look again (the
                # kernel retries: it finds the slot renamed over the name, or
                # no name, and O_CREAT makes a new one)
                if retry and not inode_node.readers:
                    return self._open_private(inode_node, flags, ctx)
                holder = node.name_holder() if node.detached == "replaced" else None
                raise self._send_back(holder or node, pid, flags,
                                      "the name is gone, readers keep it")
            # on the inode the kernel opened (its fstat asks that one); a
            # second whole-slot writer there gets a draft of its own: two
            # O_TRUNC writers never share one (nor each other's size)
            if inode_node.writers and flags & os.O_TRUNC \
                    and tgid_of(pid) not in inode_node.writer_pids:
                return self._open_private(inode_node, flags, ctx)
            return self._open_slot(inode_node, flags | os.O_TRUNC, None, ctx=ctx)
        if not node.version and tgid_of(pid) not in node.writer_pids \
                and (acc == os.O_RDONLY or not node.writers):
            raise refuse(errno.ENOENT, "open %s: not published yet", node.name,
                         level=logging.DEBUG)
        def busy() -> bool:
            # A page-cache push of the last version is being copied into this
            # inode: a writer's pages must not meet it (the kernel builds a
            # write request from the pages after it unlocks them).  Or a
            # writer sent here (ESTALE) to replace the slot finds another
            # writer in: two O_TRUNC writers never share a draft.
            if locked:
                # (the others' closes need the inode's lock this open holds)
                return bool(node.pushing or inode_node.pushing)
            return bool(node.pushing or inode_node.pushing or (
                flags & os.O_TRUNC and pid in node.pending and node.writers) or (
                # a writer whose lookup found an inode that another writer has
                # since left behind (the name moved on): it makes its version
                # there once that writer is done, instead of a second ESTALE
                # (or its readers are done: the kernel's one retry of an open
                # is spent by then, so a wait beats a second ESTALE)
                flags & os.O_TRUNC and node is not inode_node
                and (inode_node.writers or inode_node.readers)))
        if acc != os.O_RDONLY and not waited and busy():
            # pushes take milliseconds, whole-slot writes little more: wait
            # (bounded), then look again
            deadline = trio.current_time() + PUSH_WAIT_S
            while busy() and trio.current_time() < deadline:
                await trio.sleep(0.002)
            return await self._open_version(inode, flags, ctx, waited=True, retry=retry)
        if node is not inode_node:
            # a stale dentry (or a retry that lost a race): readers get the
            # current version on this old inode, around its page cache, which
            # belongs to the older version's readers; writers look again
            if acc != os.O_RDONLY:
                if flags & os.O_TRUNC and not (inode_node.readers or inode_node.pushing
                                               or inode_node.writers):
                    # a whole new version needs no base: made on the inode
                    # this writer found, published under the name (no retry)
                    return self._open_slot(inode_node, flags, None, ctx=ctx)
                if retry and not inode_node.readers:
                    return self._open_private(inode_node, flags, ctx)
                raise self._send_back(node, pid, flags, "a newer inode holds this name")
            ref = await self._reader_ref(node) if node.version else None
            return self._open_slot(inode_node, flags, ref, around_cache=True, ctx=ctx)
        if acc != os.O_RDONLY and (node.pushing > 0 or (flags & os.O_TRUNC and node.writers)
                                   or pid not in node.pending and (
                node.readers > 0 or (flags & os.O_TRUNC and node.writer_pending))):
            # Writers share the inode's page cache with their draft: readers
            # reading a snapshot through that page cache keep this inode, and
            # the writer (the kernel retries the open on ESTALE) goes to a
            # fresh one, which readers read around the page cache until the
            # writer is in.  So does a writer that replaces the whole slot
            # (O_TRUNC) while others write: each makes a whole version, the
            # last publish wins, nobody publishes a mix of two.
            if retry and not inode_node.readers:
                return self._open_private(inode_node, flags, ctx)
            raise self._send_back(node, pid, flags, "readers or writers keep this inode")
        ref = None
        need_base = acc != os.O_RDONLY and not flags & os.O_TRUNC and node.draft is None \
            and node.base is None and node.pt_draft is None
        if node.version and (acc == os.O_RDONLY or need_base):
            # readers pin the current version (a lookup: hit or SSD hit); the
            # first writer that keeps the content starts from it
            fn = self.store.get if acc == os.O_RDONLY else self.store.load
            tier = self.store.tier_of(node.key)
            early = None
            if self._early is not None and self._early[0] == node.key \
                    and acc == os.O_RDONLY:
                early = self._early[1]          # fast_open promoted it from the SSD
                self._early = None
                tier = "ssd"
            if tier == "ssd" and acc == os.O_RDONLY and self.pt is not None:
                fi = await self._pt_ssd_reader(node, flags, ctx)
                if fi is not None:
                    return fi           # the kernel reads the SSD tier's file
            if tier == "ssd" or (tier != "mem" and self.store.remote is not None):
                if acc != os.O_RDONLY:
                    # a reader that opens while the base is read must read
                    # around the page cache that this writer will use
                    node.pending[pid] = time.monotonic() + WRITER_RETRY_S
                try:
                    # a small slot whose bytes the page cache holds: here, at
                    # once (no thread hand-off); else read back off the loop
                    ref = early if early is not None else self.store.get_resident(node.key) \
                        if tier == "ssd" and acc == os.O_RDONLY else None
                    if ref is None:
                        ref = await self._off_loop(fn, node.key)  # SSD or remote
                except BaseException:
                    if acc != os.O_RDONLY:
                        node.pending.pop(pid, None)
                    raise
            else:
                ref = self._native_call(fn, node.key)
            if ref is None:
                node.pending.pop(pid, None)
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
                    node.version, node.stored, node.pub_size = ref.version, ref.stored, size
                    self._forget_attrs(node)
        # While the SSD read ran, a publish may have moved this inode on to a
        # newer version: then this reader's version must stay out of its pages.
        stale = ref is not None and (ref.version != node.version
                                     or node.successor is not None or bool(node.detached))
        if stale and acc != os.O_RDONLY:
            ref.release()
            raise self._send_back(node, pid, flags, "a newer version landed meanwhile")
        return self._open_slot(node, flags, ref, around_cache=stale, ctx=ctx)

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
                   around_cache: bool = False, ctx=None) -> pyfuse3.FileInfo:
        """A handle on node; `ref` (pinned, taken over) is the reader's
        version or the writers' base."""
        acc = flags & os.O_ACCMODE
        fh = self._fh()
        fi = pyfuse3.FileInfo(fh=fh)
        pid = ctx.pid if ctx is not None else 0
        uid = ctx.uid if ctx is not None else 0
        if acc == os.O_RDONLY and ref is not None:
            try:
                self.tenants.hold(uid, node.ino, ref)
            except OverLimit as e:
                ref.release()
                raise refuse(errno.EDQUOT, "open %s: %s", node.name, e,
                             level=logging.WARNING) from None
        if acc == os.O_RDONLY:
            h = Handle(fh, node, flags, "read")
            h.uid = uid
            h.ref = ref
            h.decoded = self._logical(ref)
            version = ref.version if ref is not None else 0
            if node.writers or node.writer_pending or around_cache:
                # The writers' draft lives in this inode's page cache: read
                # around it.
                fi.direct_io = True
                h.dio = True
                if self.pt is not None and node.pt_backing is not None:
                    # (the gate let it in: the writers' own unpublished file,
                    # or the mirror of its version)
                    h.pt = self._pt_attach(node, fh, node.pt_backing[1])
            elif self.pt is not None and h.decoded is None and self._pt_reader(node, fh, ref):
                h.pt = True             # the kernel reads the version's mirror
            else:
                with PUSH_LOCK:
                    fi.keep_cache = node.cache_version in (version, -1)
                    node.cache_version = version
            if not h.dio:
                if node.writers:
                    log.error("internal check failed: a page-cache reader on %s (inode %d) beside %d writers",
                              node.name, node.ino, node.writers)
                node.readers += 1
            node.atime_ns = now_ns()
        else:
            if node.readers or node.pushing:
                log.error("internal check failed: a writer on %s (inode %d) beside %d page-cache readers, %d pushes",
                          node.name, node.ino, node.readers, node.pushing)
            h = Handle(fh, node, flags, "write")
            h.opener = tgid_of(pid)
            h.uid = uid
            if flags & os.O_TRUNC:
                if ref is not None:
                    ref.release()
                self._release_base(node)
                joined = node.pt_draft is not None
                if self.pt is not None and self._pt_writer(node, fh, whole=True):
                    h.pt = True         # the kernel writes the writers' file
                    if joined:          # (O_TRUNC of the file its own process writes)
                        self._pt_truncate(node, 0)
                elif joined:
                    raise refuse(errno.EBUSY, "open %s: its writers' file is taken",
                                 node.name, level=logging.WARNING)
                elif node.draft is None:
                    node.draft = self._native_call(self.store.draft)
                else:
                    self._draft_call(node, node.draft.truncate, 0)
                node.refused.clear()            # (a whole new version)
                self._changed(node)
                node.trunc_only = True          # (until a write: files.py `_flush_now`)
            elif node.pt_draft is not None:
                if ref is not None:
                    ref.release()
                if not self._pt_writer(node, fh, whole=False):
                    raise refuse(errno.EBUSY, "open %s: its writers' file is taken",
                                 node.name, level=logging.WARNING)
                h.pt = True             # joins the writers' file
            elif ref is not None:
                node.base = ref
                node.base_decoded = self._logical(ref)
            # Writers go through the page cache (shared mmap works, the kernel
            # keeps their size and O_APPEND offsets), which is theirs alone:
            # readers of this inode read around it while a writer is open.
            fi.keep_cache = False
            node.cache_version = -2
            if not node.writers:        # the open drops the pages: what follows is written
                node.pages_trusted = True
                node.pages_version = 0
            node.writers += 1
            node.writer_pids[h.opener] += 1
            node.pending.pop(pid, None)           # the writer sent here is in
        self.handles[fh] = h
        node.handles += 1
        return fi
