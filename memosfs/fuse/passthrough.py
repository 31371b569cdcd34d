"""Passthrough: the kernel reads and writes a slot's bytes in a backing file
itself, without a request to the daemon (FUSE_PASSTHROUGH, kernel 6.9+;
memosfs._fuseshim negotiates it and attaches a backing file to an open's
reply).

Where the files live (`Room`): a tmpfs of its own, `passthrough_room` bytes
(default: one and a half times the memory tier's capacity: mirrors take a
third at most, so writers' files have the tier's capacity), mounted nowhere (fsopen/fsmount: no
other process can reach it, and it goes with the daemon, however the daemon
ends), each file an unnamed O_TMPFILE.  Without the new mount API: memfds.

What they hold:

* a **mirror** of a published version (`Mirror`, on the Slot): its bytes,
  copied from the memory tier at the first passthrough open of a version
  that has none, or the writers' file once they published it and left.  It
  takes the place the kernel page cache holds for a cached-mode reader: the
  C arena stays the version's authority (eviction, the SSD tier, quotas),
  and a mirror can be dropped whenever no open file uses it (least recently
  used first, when mirrors take more than a third of the room).
* a **writers' file** (`Draft`, on the Slot): a whole new version (an
  O_TRUNC open or a create) is written by the kernel into a file of the
  room; the opener's close (or fsync) copies it into a draft in the arena
  and publishes that as before (quantize, quotas, room, coherence).

The kernel's rules, kept here: an inode has at most one backing file while
files are open on it in passthrough mode (`Slot.pt_backing`: the backing
id, its file and the count of passthrough handles; a second backing file is
EIO at open), and an inode is in passthrough or in cached mode, not both:
the opening rules (opening.py) already keep page-cache readers and writers
of one inode apart, and an inode whose open handles are cached keeps its
new opens cached (and the other way round).

A write the room refuses (ENOSPC: the room is full) never reaches the
daemon.  The room fills only by writes and empties only by the daemon
(dropping a mirror, a truncate, a published writers' file closed), so the
daemon checks, before it frees anything and at each publish, whether the
room is full: if it is, every writers' file open then is tainted (a write to
it may have been refused) and is never published: the close reports ENOSPC
and the version before stays.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import logging
import os
import stat
import time
from typing import Optional

from memosfs import _native
from memosfs.fuse.core import refuse

log = logging.getLogger("memosfs")

__all__ = ["Room", "Mirror", "Draft", "Passthrough"]

_SYS_FSOPEN, _SYS_FSCONFIG, _SYS_FSMOUNT = 430, 431, 432    # x86_64 and arm64 alike
_FSCONFIG_SET_STRING, _FSCONFIG_CMD_CREATE = 1, 6
_FSOPEN_CLOEXEC = _FSMOUNT_CLOEXEC = 1
VIEW_RETRY_S = 5.0
_POPULATE = getattr(__import__("mmap"), "MAP_POPULATE", 0)   # (one fault for the whole map)                      # a reader sent back finds its view this long


class Room:
    """Anonymous files for passthrough (see the module docstring)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.mnt: Optional[int] = None
        try:
            self.mnt = _private_tmpfs(size)
        except OSError as e:
            log.info("passthrough files are memfds (a private tmpfs could not be made: %s)",
                     os.strerror(e.errno or errno.EIO))

    def new_file(self) -> int:
        """A new empty file, O_RDWR, unnamed."""
        if self.mnt is not None:
            return os.open(".", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600,
                           dir_fd=self.mnt)
        return os.memfd_create("memosfs-slot", os.MFD_CLOEXEC)

    def used(self) -> int:
        if self.mnt is None:
            return 0
        st = os.fstatvfs(self.mnt)
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    def full(self) -> bool:
        """Whether the room has no page left (a write may have been refused)."""
        if self.mnt is None:
            return False
        return os.fstatvfs(self.mnt).f_bfree == 0

    def close(self) -> None:
        if self.mnt is not None:
            os.close(self.mnt)
            self.mnt = None


def _private_tmpfs(size: int) -> int:
    """A tmpfs of `size` bytes mounted nowhere: its root's descriptor."""
    libc = ctypes.CDLL(None, use_errno=True)
    sys = libc.syscall
    sys.restype = ctypes.c_long
    fs = sys(_SYS_FSOPEN, b"tmpfs", _FSOPEN_CLOEXEC)
    if fs < 0:
        raise OSError(ctypes.get_errno(), "fsopen")
    try:
        for k, v in ((b"size", str(max(size, 1 << 20)).encode()), (b"mode", b"0700"),
                     (b"huge", b"never")):
            if sys(_SYS_FSCONFIG, fs, _FSCONFIG_SET_STRING, k, v, 0) < 0:
                raise OSError(ctypes.get_errno(), "fsconfig")
        if sys(_SYS_FSCONFIG, fs, _FSCONFIG_CMD_CREATE, None, None, 0) < 0:
            raise OSError(ctypes.get_errno(), "fsconfig create")
        mnt = sys(_SYS_FSMOUNT, fs, _FSMOUNT_CLOEXEC, 0)
        if mnt < 0:
            raise OSError(ctypes.get_errno(), "fsmount")
        return int(mnt)
    finally:
        os.close(fs)


def _file_crc(fd: int, size: int) -> int:
    """CRC-32C of a file's first `size` bytes."""
    import mmap
    if size == 0:
        return 0
    with mmap.mmap(fd, size, mmap.MAP_SHARED | _POPULATE, mmap.PROT_READ) as m:
        mv = memoryview(m)
        try:
            return _native.crc32c(mv)
        finally:
            mv.release()


def _stamp(fd: int) -> tuple[int, int, int]:
    st = os.fstat(fd)
    return (st.st_ctime_ns, st.st_mtime_ns, st.st_size)


class Mirror:
    """A published version's bytes in a file of the room."""

    __slots__ = ("fd", "version", "size", "gen", "ssd")

    def __init__(self, fd: int, version: int, size: int, gen: int, ssd: bool = False) -> None:
        self.fd, self.version, self.size, self.gen = fd, version, size, gen
        self.ssd = ssd                  # the SSD tier's own file (takes no room)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Draft:
    """The writers' file of a whole new version."""

    __slots__ = ("fd", "seen", "tainted", "published", "snap")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.seen = _stamp(fd)          # (ctime, mtime, size) when last looked at
        self.tainted = False            # the room was full while it was open
        self.published: Optional[tuple[int, tuple[int, int, int], int]] = None
                                        # (version, stamp, crc32c) of its last publish
        self.snap: Optional[tuple[tuple[int, int, int], int]] = None
                                        # (stamp, crc32c) of the last snapshot taken

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def poll(self) -> bool:
        """Whether it changed since the last look (a write, a truncate)."""
        now = _stamp(self.fd)
        changed, self.seen = now != self.seen, now
        return changed

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class Passthrough:
    """The mount's passthrough state: the room, the shim, the mirrors kept."""

    def __init__(self, shim, room: Room, slots) -> None:
        self.shim = shim
        self.room = room
        self.slots = slots              # the slot table: a node's files are its holders
        self.mirrors: "collections.OrderedDict[int, object]" = collections.OrderedDict()
        self.drafts: "dict[int, object]" = {}       # id(node) -> node with a writers' file
        self.opens = 0                  # passthrough opens answered
        self.mirror_bytes_copied = 0
        self.tainted = 0                # writers' files refused at publish (room full)

    # -- the room's fill --------------------------------------------------

    def before_free(self) -> None:
        """Before the daemon frees room: a full room means a write to any
        writers' file open now may have been refused."""
        try:
            full = self.room.full()
        except OSError:
            full = True
        if full:
            for node in self.drafts.values():
                d = node.pt_draft
                if d is not None and not d.tainted:
                    d.tainted = True
                    self.tainted += 1

    # -- mirrors ----------------------------------------------------------

    def keep_mirror(self, node, attaching: bool = False) -> None:
        """node's mirror is the most recently used; others go if mirrors take
        more than their share of the room (a third: writers need the rest).
        attaching: an open is about to read it (it stays)."""
        self.mirrors[id(node)] = node
        self.mirrors.move_to_end(id(node))
        self.trim(keep=node if attaching else None)

    def drop_mirror(self, node) -> None:
        m = node.pt_mirror
        if m is None:
            return
        if node.pt_backing is not None and node.pt_backing[1] is m:
            return                      # open files read it
        self.before_free()
        self.slots.set_pt_mirror(node, None)
        self.mirrors.pop(id(node), None)
        m.close()

    def move_mirror(self, old, new) -> None:
        """old's name went to a fresh inode, new, holding the same version:
        old's mirror goes with it, unless open files read it on old (it goes
        with their last release then)."""
        m = old.pt_mirror
        if m is None or (old.pt_backing is not None and old.pt_backing[1] is m) \
                or new.pt_mirror is not None or m.version != new.version:
            return
        self.slots.set_pt_mirror(old, None)
        self.mirrors.pop(id(old), None)
        m.gen = new.pubs
        self.slots.set_pt_mirror(new, m)
        self.mirrors[id(new)] = new

    def mirror_bytes(self) -> int:
        return sum(n.pt_mirror.size for n in self.mirrors.values()
                   if n.pt_mirror is not None and not n.pt_mirror.ssd)

    def trim(self, keep=None) -> None:
        """Mirrors no open file reads go, least recently used first, while
        mirrors take more than a third of the room."""
        budget = self.room.size // 3
        total = self.mirror_bytes()
        for key in list(self.mirrors):
            if total <= budget:
                return
            node = self.mirrors[key]
            m = node.pt_mirror
            if m is None:
                self.mirrors.pop(key, None)
                continue
            busy = node.pt_backing is not None and node.pt_backing[1] is m
            if not busy and node is not keep:
                total -= m.size
                self.drop_mirror(node)

    def stats(self) -> dict[str, int]:
        try:
            used = self.room.used()
        except OSError:
            used = 0
        return {"passthrough_opens": self.opens, "passthrough_mirrors": len(self.mirrors),
                "passthrough_copied_bytes": self.mirror_bytes_copied,
                "passthrough_room_used": used, "passthrough_refused_full": self.tainted}


def _pwritev_all(fd: int, views: list, off: int) -> None:
    while views:
        w = os.pwritev(fd, views, off)
        if w <= 0:
            raise OSError(errno.ENOSPC, "short write")
        off += w
        while views and w >= len(views[0]):
            w -= len(views[0])
            views = views[1:]
        if w:
            views = [memoryview(views[0])[w:]] + views[1:]


def _copy_ref(ref, fd: int) -> int:
    """The bytes of a pinned version into fd (views of its pages: one copy)."""
    off, size = 0, ref.size
    while off < size:
        views: list = []
        n = 0
        while off + n < size and len(views) < 64 and n < (8 << 20):
            v = ref.view(off + n, min(size - off - n, (8 << 20) - n))
            if not len(v):
                break
            views.append(v)
            n += len(v)
        if not views:
            data = ref.read(off, min(size - off, 8 << 20))
            if not data:
                raise OSError(errno.EIO, "short read of a version")
            views, n = [data], len(data)
        _pwritev_all(fd, views, off)
        off += n
    return size


def _copy_file(fd: int, draft, size: int) -> None:
    """A writers' file's first `size` bytes into an arena draft: its data
    extents (SEEK_DATA/SEEK_HOLE: holes stay holes), then its size."""
    import mmap
    if size == 0:
        return
    with mmap.mmap(fd, size, mmap.MAP_SHARED | _POPULATE, mmap.PROT_READ) as m:
        mv = memoryview(m)
        try:
            pos = 0
            step = 8 << 20
            while pos < size:
                try:
                    start = os.lseek(fd, pos, os.SEEK_DATA)
                except OSError as e:
                    if e.errno == errno.ENXIO:
                        break           # only a hole is left
                    start = pos
                if start >= size:
                    break
                try:
                    end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
                except OSError:
                    end = size
                for off in range(start, end, step):
                    draft.write(off, mv[off:min(off + step, end)])
                pos = end
        finally:
            mv.release()
    if draft.size < size:
        draft.truncate(size)


class PassthroughOps:
    """The handlers' side of passthrough (a mixin of MemosOperations): which
    open gets a backing file, the writers' files at publish, the release of
    backing ids.  `self.pt` is None when the mount has no passthrough."""

    _pt_state: Optional[Passthrough] = None
    _pt_asked = False                   # the shim asks the kernel at INIT

    def want_passthrough(self) -> None:
        """Before the mount: ask the kernel for passthrough, if the knob says
        so and it can be had (root: registering a backing file needs
        CAP_SYS_ADMIN; not with the writeback cache, which the kernel does not
        combine with it)."""
        try:
            from memosfs import _fuseshim as shim
        except ImportError:
            return
        ssd = self.store.ssd
        if not self.knobs.get("passthrough") or self.wb or os.geteuid() != 0 \
                or not hasattr(shim, "set_passthrough"):
            if hasattr(shim, "set_passthrough"):
                shim.set_passthrough(0)
            if ssd is not None:
                # slot files keep their trailer in the file (a copy of the SSD
                # folder without extended attributes stays readable)
                ssd.write_bare = False
            return
        shim.set_passthrough(1)
        self._pt_asked = True
        if ssd is not None:
            ssd.write_bare = True       # the kernel reads a slot file from 0 to its end

    @property
    def pt(self) -> Optional[Passthrough]:
        """The mount's passthrough, once the kernel granted it (known from the
        first request on: INIT comes before any)."""
        if self._pt_asked and self.mounted:
            self._pt_asked = False
            from memosfs import _fuseshim as shim
            if shim.passthrough_granted():
                # (a page and more past 1.5x capacity: writers' files that fill the
                # room to its last page look like a refused write; round sizes
                # that add up to a round room would)
                size = self.knobs.get("passthrough_room") \
                    or self.store.cache.capacity * 3 // 2 + (4 << 20) + 4096
                self._pt_state = Passthrough(shim, Room(size), self.slots)
                log.info("passthrough: the kernel reads and writes slots' files itself "
                         "(room %d bytes)", size)
            else:
                log.info("passthrough: the kernel did not grant it; every read and write "
                         "goes through the daemon")
                if self.store.ssd is not None:
                    self.store.ssd.write_bare = False
        return self._pt_state

    def _pt_attach(self, node, fh: int, file) -> bool:
        """Attach `file` (a Mirror or a Draft) to the open fh of node's inode:
        the inode's backing file, registered once while passthrough files
        are open on it.  False (the open stays on the daemon's path) when the
        inode's open files use another backing file or the kernel refuses."""
        pt = self.pt
        cur = node.pt_backing
        if cur is not None:
            bid, held, count = cur
            if held is not file:
                return False
        else:
            try:
                bid = pt.shim.backing_open(file.fd)
            except OSError as e:
                log.warning("passthrough for %s: the kernel refused its backing file (%s); "
                            "served by the daemon", node.name,
                            os.strerror(e.errno or errno.EIO))
                return False
        self.slots.backing_attach(node, bid, file)
        pt.shim.attach(fh, bid)
        pt.opens += 1
        return True

    def _pt_reader_gate(self, inode_node, holder, pid: int) -> None:
        """A reader opening inode_node (the name's slot now: holder) where
        the kernel would force it onto a backing file that does not hold the
        version it must read (a writers' file whose bytes are not published,
        a mirror of another version): ESTALE, and the kernel's retry looks
        the name up again from this thread, which then finds a reader's view
        of holder (`_pt_found`) or holder itself."""
        cur = inode_node.pt_backing
        if cur is None:
            return
        held = cur[1]
        if isinstance(held, Draft):
            if not inode_node.version and holder is inode_node:
                return                  # its writer's process reads its own bytes
        elif holder is inode_node and not holder.detached and not holder.writers \
                and holder.version == held.version:
            return                      # the mirror of the version it reads
        if holder.detached:
            found = holder.name_holder() if holder.detached == "replaced" else None
            holder = found if found is not None else holder
        views = self.__dict__.setdefault("_pt_views_due", {})
        now = time.monotonic()
        if len(views) > 4096:
            for p in [p for p, due in views.items() if due[1] < now]:
                del views[p]
        views[pid] = ((id(holder.parent), holder.name), now + VIEW_RETRY_S)
        raise refuse(errno.ESTALE, "open %s for reading: its inode's file is another "
                     "version's (the lookup again finds one to read)", inode_node.name,
                     level=logging.DEBUG)

    def _pt_found(self, node, pid: int):
        """lookup of node's name by pid: a reader's view of the slot that holds
        the name when this pid was sent back by `_pt_reader_gate` for that
        name (None: node itself).  A view has no backing file, so its open
        never meets one: it reads the name's version by the daemon.  The same
        view for every lookup of that pid until it opens it (the kernel may
        look the name up twice: once to revalidate its entry, once more for
        the new one) or the wait ends."""
        views = self.__dict__.get("_pt_views_due")
        if not views:
            return None
        due = views.get(pid)
        if due is None or due[0] != (id(node.parent), node.name):
            return None
        if due[1] < time.monotonic() or not node.version:
            del views[pid]
            return None
        view = due[2] if len(due) > 2 else None
        # (the kernel forgets the view its revalidation found, then looks the
        # name up again: the same view while the table keeps it, else a new one)
        if view is None or view.ino not in self.inodes or view.version != node.version \
                or view.successor is not node:
            view = self._pt_view(node)
            views[pid] = (due[0], due[1], view)
        return view

    def _pt_view_opened(self, view, pid: int) -> None:
        """pid opened the view it was sent to: its later lookups find the name."""
        views = self.__dict__.get("_pt_views_due")
        if views:
            due = views.get(pid)
            if due is not None and len(due) > 2 and due[2] is view:
                del views[pid]

    def _pt_view(self, node):
        """An inode for readers of node's published version while its writers'
        file backs node's inode: not in the tree (like a superseded inode: its
        opens read the name's version around its page cache, by the daemon),
        looked up again at every use (timeouts 0)."""
        return self.slots.view(node)

    def _pt_reads(self, node, logical) -> bool:
        """Whether readers of node's published version read it by passthrough
        (a page-cache push would then be wasted)."""
        return self.pt is not None and logical is None \
            and node.pub_size >= self.knobs["passthrough_min"]

    def _pt_detach(self, node) -> None:
        """A passthrough handle on node's inode was released."""
        if node.pt_backing is None:
            return
        bid, last, held = self.slots.backing_detach(node)
        if not last:
            return
        try:
            self.pt.shim.backing_close(bid)
        except OSError as e:
            log.warning("passthrough for %s: closing backing id %d: %s", node.name, bid,
                        os.strerror(e.errno or errno.EIO))
        if isinstance(held, Draft) and held is not node.pt_draft:
            self.pt.before_free()       # a writers' file its writers left, read till now
            held.close()
        if node.pt_mirror is not None and (node.detached or node.successor is not None
                                           or node.pt_mirror.ssd):
            # (nobody opens that inode's version again; an SSD file is read
            # from memory or opened again next time: its descriptor would
            # keep a replaced file's blocks)
            self.pt.drop_mirror(node)

    def _pt_reader(self, node, fh: int, ref) -> bool:
        """A page-cache reader's open of node's version `ref`: read from the
        version's mirror by the kernel (made now if need be).  False: the
        daemon serves it (small, quantized, no room, or the inode's open
        files are in cached mode)."""
        pt = self.pt
        if pt is None or ref is None or not isinstance(ref, _native.Ref):
            return False
        cur = node.pt_backing
        if cur is None and (node.readers > 0 or ref.size < self.knobs["passthrough_min"]):
            return False                # (its open readers are in cached mode)
        m = node.pt_mirror
        if m is None or m.version != ref.version or m.size != ref.size \
                or m.gen != node.pubs:
            if cur is not None:
                return False            # (cannot happen: one version per inode's readers)
            if m is not None:
                pt.drop_mirror(node)
            try:
                fd = pt.room.new_file()
            except OSError as e:
                log.info("passthrough for %s: no file for its mirror (%s)", node.name,
                         os.strerror(e.errno or errno.EIO))
                return False
            try:
                _copy_ref(ref, fd)
            except OSError as e:
                os.close(fd)
                pt.before_free()
                log.info("passthrough for %s: no room for its mirror (%s); served by the "
                         "daemon", node.name, os.strerror(e.errno or errno.EIO))
                return False
            m = Mirror(fd, ref.version, ref.size, node.pubs)
            self.slots.set_pt_mirror(node, m)
            pt.mirror_bytes_copied += ref.size
        pt.keep_mirror(node, attaching=True)
        return self._pt_attach(node, fh, m)

    async def _pt_ssd_reader(self, node, flags: int, ctx):
        """A reader's open of a slot only the SSD tier holds: the kernel reads
        the SSD tier's file itself (a FileInfo), or None (the usual way:
        the slot is read back into memory)."""
        if self.pt is None or node.pub_size < self.knobs["passthrough_min"] \
                or node.writers or node.writer_pending or node.detached \
                or node.successor is not None or node.pushing:
            return None
        cur = node.pt_backing
        if cur is None and node.readers > 0:
            return None                 # (its readers are in cached mode)
        if cur is None:
            got = await self._off_loop(self.store.ssd_backing, node.key)
            if got is None:
                return None
            fd, entry = got
            if entry.version != node.version or entry.size != node.pub_size \
                    or node.pt_backing is not None or node.readers > 0 or node.writers \
                    or node.writer_pending or node.pushing or node.detached \
                    or node.successor is not None:
                os.close(fd)            # (quantized, or things moved meanwhile)
                return None
            if node.pt_mirror is not None:
                self.pt.drop_mirror(node)
            m = Mirror(fd, entry.version, entry.size, node.pubs, ssd=True)
            self.slots.set_pt_mirror(node, m)
        else:
            m = cur[1]
            if not isinstance(m, Mirror) or m.version != node.version:
                return None
        fi = self._open_pt_handle(node, flags, ctx, m)
        if fi is None and node.pt_backing is None and m.ssd:
            self.pt.drop_mirror(node)
        return fi

    def _open_pt_handle(self, node, flags: int, ctx, m: "Mirror"):
        """A reader's handle on node whose bytes the kernel reads from m."""
        import pyfuse3
        from memosfs.fuse.nodes import Handle, now_ns
        fh = self._fh()
        if not self._pt_attach(node, fh, m):
            return None
        self.pt.keep_mirror(node, attaching=True)
        h = Handle(fh, node, flags, "read")
        h.uid = ctx.uid if ctx is not None else 0
        h.pt = True
        self.handles[fh] = h
        self.slots.attach_reader(node, m.version, 2)    # (by passthrough: no pages)
        node.atime_ns = now_ns()
        return pyfuse3.FileInfo(fh=fh)

    def _pt_writer(self, node, fh: int, whole: bool) -> bool:
        """A writer's open of node (the slot table has it in already): the
        writers' file when it has one (they share it), a new one for a
        whole new version (`whole`: O_TRUNC or a create) when no other
        writer is in; False: the daemon's path (the draft in the arena)."""
        pt = self.pt
        if pt is None:
            return False
        d = node.pt_draft
        if d is None:
            # a whole new version on an inode nobody else has open: the kernel
            # lets every open of an inode with a backing file use that file, so
            # a reader that comes meanwhile is sent to a view of the published
            # version (`_pt_reader_gate`)
            if not whole or node.writers > 1 or node.handles > 1 \
                    or node.draft is not None or node.private_of is not None \
                    or node.pt_backing is not None:
                return False
            try:
                fd = pt.room.new_file()
            except OSError:
                return False
            d = Draft(fd)
            self.slots.set_pt_draft(node, d)
            pt.drafts[id(node)] = node
        if self._pt_attach(node, fh, d):
            return True
        if node.writers <= 1:
            self._pt_drop_draft(node)
        return False

    def _pt_drop_draft(self, node) -> None:
        d = node.pt_draft
        if d is None:
            return
        self.pt.before_free()
        self.slots.set_pt_draft(node, None)
        self.pt.drafts.pop(id(node), None)
        d.close()

    def _pt_truncate(self, node, size: int) -> None:
        """ftruncate of the writers' file (a truncate, an O_TRUNC open)."""
        d = node.pt_draft
        if size < d.size():
            self.pt.before_free()
        os.ftruncate(d.fd, size)
        d.poll()
        self.slots.changed(node, size, d.seen[1])

    def _pt_poll(self, node) -> None:
        """What the kernel wrote into the writers' file since the last look
        marks the draft changed (the daemon sees no write request)."""
        d = node.pt_draft
        if d is not None and d.poll() and node.writers:
            self.slots.changed(node, d.seen[2], d.seen[1])

    def _pt_snapshot(self, node, h) -> "_native.Draft":
        """An arena draft holding the writers' file's bytes, for publish.
        ENOSPC when the room filled while the file was open (a write to it
        may have been refused)."""
        pt = self.pt
        d = node.pt_draft
        if not d.tainted and pt.room.full():
            pt.before_free()
        if d.tainted:
            raise refuse(errno.ENOSPC, "%s: not published: the memory tier's passthrough room "
                         "filled while it was written (a write to it may have been "
                         "refused); the version before stays",
                         node.key.decode("utf-8", "replace"), level=logging.WARNING)
        stamp = _stamp(d.fd)
        size = stamp[2]
        draft = self._native_call(self.store.draft)
        try:
            self._fair_share(h, node, draft, size)      # (quotas, per-uid bounds: EDQUOT)
            self._native_call(_copy_file, d.fd, draft, size)
        except BaseException:
            draft.free()
            raise
        d.seen = stamp
        d.snap = (stamp, _file_crc(d.fd, size))
        return draft

    def _pt_published(self, node, version: int) -> None:
        """The snapshot just taken of node's writers' file is version `version`."""
        d = node.pt_draft
        if d is not None and d.snap is not None:
            d.published = (version, d.snap[0], d.snap[1])

    def _pt_last_writer(self, node) -> None:
        """Before a writer's close, fsync or last release: what the kernel
        wrote into the writers' file since the last look marks the draft
        changed, and so does a change no timestamp shows (a write through a
        shared mapping, which tmpfs does not stamp), found by the checksum
        of a file published before."""
        d = node.pt_draft
        if d is None:
            return
        self._pt_poll(node)
        if node.changed or d.published is None or d.published[0] != node.version:
            return
        if _file_crc(d.fd, d.seen[2]) != d.published[2] and node.writers:
            self.slots.changed(node, d.seen[2], d.seen[1])

    def _pt_writers_gone(self, node) -> None:
        """The last writer of node closed: its file becomes the mirror of the
        version it published, if nothing changed it since (else it goes)."""
        d = node.pt_draft
        if d is None:
            return
        self.slots.set_pt_draft(node, None)
        self.pt.drafts.pop(id(node), None)
        keep = (d.published is not None and not d.tainted and node.version
                and d.published[0] == node.version and not node.detached
                and not node.changed and _stamp(d.fd) == d.published[1]
                and d.published[1][2] >= self.knobs["passthrough_min"])
        if keep:
            if node.pt_mirror is not None and node.pt_mirror is not d:
                self.pt.drop_mirror(node)
            if node.pt_mirror is None:
                m = Mirror(d.fd, node.version, d.published[1][2], node.pubs)
                self.slots.set_pt_mirror(node, m)
                d.fd = -1
                if node.pt_backing is not None and node.pt_backing[1] is d:
                    # (its writer's process still reads it: the same file)
                    self.slots.set_pt_file(node, m)
                self.pt.keep_mirror(node)
                return
        if node.pt_backing is not None and node.pt_backing[1] is d:
            return                      # (read still; it goes with its last reader)
        self.pt.before_free()
        d.close()
