"""`.federated/` in the mount: pyfuse3 handlers over memosfs.federated.FederatedJobs.

FederatedJobs (memosfs/federated/jobs.py, docs/federated.md) is a path-keyed virtual
filesystem; this module gives it inodes and file handles, and MemosOperations hands
it every request on them (the routing table FED_ROUTES in routing.py).

Of the filesystem (`ops`, MemosOperations) it uses only this narrow interface
(core.py): `store` (its SSD tier's folder), `add_fixed`, `new_fh`, `parse_name`,
`root_entry`, `root_attr`, `count_refused`, `is_mounted`.  It may call
memosfs.federated.jobs (imported when the tree is made), pyfuse3, trio.

Inodes.  `.federated` is inode FED_INO, far above the other inodes (which count up from
FIRST_DYNAMIC_INO), and every path below it gets the next number the first time the
kernel sees it; a path keeps its number while the mount lives (a path never changes
type), except that removing a job forgets the numbers of its paths, so a job made
again under the same name gets fresh inodes.  The routing (routing.py) tests
`inode >= FED_INO` (and, for directories, the handle, which is the inode as in the
rest of the mount), or for files whether FedTree opened the handle.  The mount keeps a
placeholder directory node under the same number in the root, so that the root's
lookup, readdir, rmdir and rename treat `.federated` like `.memos` (fixed, EPERM).

Handles.  Numbers come from the mount's allocator (`ops.new_fh()`), so they never collide;
the handles themselves live in `self.handles`.  A handle opened for reading holds a
snapshot of the file taken at open.  A handle opened for writing buffers; files whose
`write_mode` is "each" (config, aggregate, keys/*) are applied at every write() with
the handle's whole text, as the control plane does for knobs, so that `echo ... > file` sees the
errno; the others (params, updates, he/*) are applied once, at flush (close) or
fsync, so a refused update makes close(2) fail with the documented errno.  A file
made by O_CREAT that never got a successful write is discarded at release.

Threads.  Every call into FederatedJobs runs in a worker thread when mounted
(`trio.to_thread.run_sync`): a job's lock is held across durable puts (fsync), and the
write of a round's last update aggregates before it returns.  Unmounted (tests that
call the handlers directly), calls run inline, so a handler never suspends.

Kernel caches.  Every entry and attribute goes out with zero timeouts and every file
is opened with direct_io (no page cache; reads are not bounded by the cached size),
so the kernel asks again each time; `notify` additionally invalidates the attributes
of the inodes FederatedJobs names after a change.  Attribute-only invalidation takes
no lock in the kernel, so it is safe from any thread, inside a handler too (notify.py's
`_forget_attrs` does the same).  Dentries are not invalidated: with entry_timeout 0
every path walk revalidates them anyway, and `invalidate_entry` may block while a
related request is pending.

Persistence.  The jobs' store is a DirKV in `<ssd>/federated/` (one file per key,
written with fsync and rename; the folder 0700 and its files 0600, as everything under
the SSD directory), or a MemoryKV with `ssd=none`; the jobs are restored
when the mount starts, and `start()` (called once the kernel mount exists) runs
`resume()` in a thread, which applies a round whose updates were all in when the
previous mount stopped.  If memosfs.federated cannot be imported (numpy missing) or
its directory cannot be made, the mount serves no `.federated`, and says why in the log.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from typing import Any, Optional

import pyfuse3
import trio

from memosfs.fuse.nodes import CTL, Dir
from memosfs.fuse.why import note_refusal

log = logging.getLogger("memosfs.fuse.fedtree")

__all__ = ["FedTree", "FED_INO", "FED_NAME"]

FED_INO = 1 << 40               # `.federated`; its descendants count up from here
FED_NAME = ".federated"
BLKSIZE = 4096
JOB_SUBDIRS = 3                 # updates, keys, he: a job directory's nlink is 2 + 3


class FedHandle:
    """An open file under `.federated`."""

    __slots__ = ("fh", "parts", "uid", "gid", "write", "mode", "append", "data",
                 "dirty", "need_base", "created", "applied")

    def __init__(self, fh: int, parts: tuple[str, ...], uid: int, gid: int) -> None:
        self.fh = fh
        self.parts = parts
        self.uid, self.gid = uid, gid       # the opener: writes are applied as them
        self.write = False                  # opened for writing
        self.mode = ""                      # "each" | "close" (write handles)
        self.append = False
        self.data = bytearray()             # the read snapshot / the written content
        self.dirty = False                  # written since the last apply ("close" files)
        self.need_base = False              # fetch the current content before a write
        self.created = False                # made by create(): discard if never written
        self.applied = False                # a write was accepted


class FedTree:
    """The `.federated` subtree of a MemosOperations (`ops`)."""

    def __init__(self, ops: Any) -> None:
        self.ops = ops
        self.jobs = None                    # FederatedJobs, when served
        self.handles: dict[int, FedHandle] = {}
        self._ino_of: dict[tuple[str, ...], int] = {(): FED_INO}
        self._path_of: dict[int, tuple[str, ...]] = {FED_INO: ()}
        self._next_ino = FED_INO + 1
        self._map_lock = threading.Lock()
        self._active = False                # the kernel may be told of changes
        self._notify_lock = threading.Lock()
        try:
            from memosfs.federated import engine as F
            ssd = getattr(ops.store, "ssd", None)
            if ssd is not None:
                kv = F.DirKV(os.path.join(ssd.root, "federated"))
            else:
                kv = F.MemoryKV()
            self.jobs = F.FederatedJobs(kv, notify=self._notify)
        except (ImportError, OSError) as e:
            log.error("%s is not served: %s", FED_NAME, e)
            return
        d = ops.add_fixed(Dir(FED_INO, FED_NAME, ops.root, 0o755, 0, 0, CTL))
        d.mode = stat.S_IFDIR | F.FED_ROOT_MODE

    # ---- mount life ----

    def start(self) -> None:
        """The kernel mount exists: notifications on; finish interrupted rounds."""
        if self.jobs is None:
            return
        with self._notify_lock:
            self._active = True
        threading.Thread(target=self._resume, name="memosfs-fed-resume", daemon=True).start()

    def stop(self) -> None:
        """Before the FUSE session goes away: no more notifications."""
        with self._notify_lock:
            self._active = False

    def _resume(self) -> None:
        try:
            done = self.jobs.resume()
            if done:
                log.info("federated: resumed the rounds of %s", ", ".join(done))
        except Exception:
            log.exception("federated: resume failed")

    def _notify(self, paths: list[tuple[str, ...]]) -> None:
        """FederatedJobs changed these paths (any thread): drop the kernel's
        attributes of the inodes it knows."""
        with self._notify_lock:
            if not self._active:
                return
            for p in paths:
                ino = self._ino_of.get(tuple(p))
                if ino is None:
                    continue
                try:
                    pyfuse3.invalidate_inode(ino, attr_only=True)
                except OSError:
                    pass                # the kernel does not know this inode

    # ---- inodes and attributes ----

    def _ino(self, parts: tuple[str, ...]) -> int:
        with self._map_lock:
            ino = self._ino_of.get(parts)
            if ino is None:
                ino = self._next_ino
                self._next_ino += 1
                self._ino_of[parts] = ino
                self._path_of[ino] = parts
            return ino

    def _parts(self, ino: int) -> tuple[str, ...]:
        parts = self._path_of.get(ino)
        if parts is None or self.jobs is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return parts

    def _forget_job(self, job: str) -> None:
        with self._map_lock:
            for parts in [p for p in self._ino_of if p and p[0] == job]:
                del self._path_of[self._ino_of.pop(parts)]

    def _entry(self, parts: tuple[str, ...], a: dict) -> pyfuse3.EntryAttributes:
        e = pyfuse3.EntryAttributes()
        e.st_ino = self._ino(parts)
        e.generation = 0
        e.entry_timeout = 0
        e.attr_timeout = 0
        if a["kind"] == "dir":
            e.st_mode = stat.S_IFDIR | a["mode"]
            if not parts:
                e.st_nlink = 2 + len(self.jobs.jobs)
            else:
                e.st_nlink = 2 + (JOB_SUBDIRS if len(parts) == 1 else 0)
        else:
            e.st_mode = stat.S_IFREG | a["mode"]
            e.st_nlink = 1
        e.st_uid = a["uid"]
        e.st_gid = a["gid"]
        e.st_rdev = 0
        e.st_size = a["size"]
        e.st_blksize = BLKSIZE
        e.st_blocks = (a["size"] + 511) // 512
        e.st_atime_ns = e.st_mtime_ns = e.st_ctime_ns = a["mtime_ns"]
        return e

    async def _run(self, fn, *args):
        """A FederatedJobs call: in a worker thread when mounted; a refusal
        (FedError, or an OSError of its store) becomes the FUSE errno."""
        try:
            if self.ops.is_mounted():
                return await trio.to_thread.run_sync(fn, *args)
            return fn(*args)
        except OSError as e:
            code = e.errno or errno.EIO
            if code != errno.ENOENT:
                self.ops.count_refused()
                note_refusal(code, e.strerror or str(e))
            if not isinstance(e, self._fed_error()):
                log.warning("federated: %s%s failed: %s", fn.__name__, args[:1], e)
            raise pyfuse3.FUSEError(code) from None

    @staticmethod
    def _fed_error():
        from memosfs.federated.errors import FedError
        return FedError

    @staticmethod
    def _refuse(code: int, fmt: str, *args: object) -> pyfuse3.FUSEError:
        reason = fmt % args if args else fmt
        log.info("refused (%s): %s", errno.errorcode.get(code, code), reason)
        note_refusal(code, reason)
        return pyfuse3.FUSEError(code)

    def _child(self, parent_inode: int, name: bytes) -> tuple[str, ...]:
        return self._parts(parent_inode) + (self.ops.parse_name(name),)

    # ---- lookup and attributes ----

    def root_attr(self) -> pyfuse3.EntryAttributes:
        """`.federated`'s own attributes, for the root's lookup and readdir
        of it (namespace.py): the same as its getattr, so that a walk of the
        mount (tar) sees one size and one mtime for it."""
        return self._entry((), self.jobs.getattr(()))

    async def lookup(self, parent_inode, name, ctx):
        parent = self._parts(parent_inode)
        n = self.ops.parse_name(name)
        if n == "..":
            if not parent:
                return self.ops.root_entry()
            parts = parent[:-1]
        else:
            parts = parent if n == "." else parent + (n,)
        return self._entry(parts, await self._run(self.jobs.getattr, parts))

    async def getattr(self, inode, ctx):
        parts = self._parts(inode)
        return self._entry(parts, await self._run(self.jobs.getattr, parts))

    async def setattr(self, inode, attr, fields, fh, ctx):
        """truncate (of a write handle's buffer); times are ignored; modes and
        owners are fixed (EPERM)."""
        parts = self._parts(inode)
        if fields.update_mode or fields.update_uid or fields.update_gid:
            self.ops.count_refused()
            raise self._refuse(errno.EPERM, "chmod/chown %s/%s: modes and owners in %s "
                               "are fixed", FED_NAME, "/".join(parts), FED_NAME)
        if fields.update_size:
            h = self.handles.get(fh) if fh is not None else None
            a = await self._run(self.jobs.getattr, parts)
            if a["kind"] == "dir":
                raise self._refuse(errno.EISDIR, "truncate of directory %s", "/".join(parts))
            if h is not None and h.write:
                size = attr.st_size
                if h.need_base and size:
                    h.data = bytearray(await self._run(self.jobs.read, parts))
                h.need_base = False
                if size <= len(h.data):
                    del h.data[size:]
                else:
                    h.data.extend(b"\0" * (size - len(h.data)))
                if h.mode == "each":
                    h.data = bytearray()    # the next write() brings the whole text
            else:
                # truncate(2) by path: allowed where an open for writing is, and
                # changes nothing (as for .memos pseudo-files): the content of
                # these files is only ever replaced whole, by a write
                await self._run(self.jobs.check_open, parts, ctx.uid, True)
        return self._entry(parts, await self._run(self.jobs.getattr, parts))

    # ---- directories ----

    async def mkdir(self, parent_inode, name, mode, ctx):
        parts = self._child(parent_inode, name)
        a = await self._run(self.jobs.mkdir, parts, ctx.uid, ctx.gid, stat.S_IMODE(mode))
        return self._entry(parts, a)

    async def rmdir(self, parent_inode, name, ctx):
        parts = self._child(parent_inode, name)
        await self._run(self.jobs.rmdir, parts, ctx.uid)
        if len(parts) == 1:
            self._forget_job(parts[0])

    async def unlink(self, parent_inode, name, ctx):
        await self._run(self.jobs.unlink, self._child(parent_inode, name), ctx.uid)

    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new,
                     flags, ctx):
        if parent_inode_old < FED_INO or parent_inode_new < FED_INO:
            # mv falls back to copy and unlink
            raise self._refuse(errno.EXDEV, "rename across %s", FED_NAME)
        self.ops.count_refused()
        raise self._refuse(errno.EPERM, "rename in %s: names there are fixed", FED_NAME)

    async def opendir(self, inode, ctx):
        parts = self._parts(inode)
        a = await self._run(self.jobs.getattr, parts)
        if a["kind"] != "dir":
            raise pyfuse3.FUSEError(errno.ENOTDIR)
        return inode

    async def readdir(self, fh, start_id, token):
        """`.`, `..`, then the names; each with its attributes (readdirplus)."""
        parts = self._parts(fh)
        names = await self._run(self.jobs.readdir, parts)
        items: list[tuple[str, Optional[tuple[str, ...]]]] = [(".", parts)]
        items.append(("..", parts[:-1] if parts else None))     # None: the mount's root
        items += [(n, parts + (n,)) for n in names]
        jobs = self.jobs
        fed_error = self._fed_error()

        def attrs() -> list[tuple[int, str, Optional[tuple[str, ...]], Optional[dict]]]:
            out = []
            for i in range(start_id, len(items)):
                n, p = items[i]
                if p is None:
                    out.append((i, n, None, None))
                    continue
                try:
                    out.append((i, n, p, jobs.getattr(p)))
                except fed_error:
                    continue                # gone meanwhile
            return out

        for i, n, p, a in await self._run(attrs):
            attr = self.ops.root_attr() if p is None else self._entry(p, a)
            if not pyfuse3.readdir_reply(token, n.encode("utf-8", "surrogateescape"),
                                         attr, i + 1):
                break

    # ---- files ----

    def _new_handle(self, parts: tuple[str, ...], flags: int, ctx) -> FedHandle:
        h = FedHandle(self.ops.new_fh(), parts, ctx.uid, ctx.gid)
        h.write = (flags & os.O_ACCMODE) != os.O_RDONLY
        if h.write:
            h.mode = self.jobs.write_mode(parts)
            h.append = bool(flags & os.O_APPEND)
        return h

    def _file_info(self, h: FedHandle) -> pyfuse3.FileInfo:
        self.handles[h.fh] = h
        fi = pyfuse3.FileInfo(fh=h.fh)
        fi.direct_io = True
        fi.keep_cache = False
        return fi

    async def open(self, inode, flags, ctx):
        parts = self._parts(inode)
        acc = flags & os.O_ACCMODE
        snapshot = acc != os.O_WRONLY and not flags & os.O_TRUNC
        jobs = self.jobs

        def check_and_read() -> Optional[bytes]:        # one trip to a worker thread
            jobs.check_open(parts, ctx.uid, acc != os.O_RDONLY)
            return jobs.read(parts) if snapshot else None
        data = await self._run(check_and_read)
        h = self._new_handle(parts, flags, ctx)
        if data is not None:
            h.data = bytearray(data)
        elif h.write and h.mode == "close" and not flags & os.O_TRUNC:
            h.need_base = True              # a write without O_TRUNC keeps the rest
        return self._file_info(h)

    async def create(self, parent_inode, name, mode, flags, ctx):
        """O_CREAT of an update or a key (FederatedJobs shows a placeholder until
        the first accepted write, and forgets it if none comes)."""
        parts = self._child(parent_inode, name)
        try:
            a = await self._run(self.jobs.create, parts, ctx.uid, ctx.gid, stat.S_IMODE(mode))
        except pyfuse3.FUSEError as e:
            if e.errno != errno.EEXIST or flags & os.O_EXCL:
                raise
            # made by someone else since the kernel looked: open it, as open(2) would
            fi = await self.open(self._ino(parts), flags, ctx)
            return fi, self._entry(parts, await self._run(self.jobs.getattr, parts))
        h = self._new_handle(parts, flags | os.O_WRONLY, ctx)
        h.created = True
        return self._file_info(h), self._entry(parts, a)

    async def read(self, fh, off, size):
        h = self.handles[fh]
        return bytes(h.data[off:off + size])

    async def write(self, fh, off, buf):
        h = self.handles[fh]
        if not h.write:
            raise pyfuse3.FUSEError(errno.EBADF)
        if h.mode == "each":
            # the handle's whole text so far, applied now (as .memos knobs)
            text = (bytes(h.data[:off]) + bytes(buf)) if off else bytes(buf)
            await self._run(self.jobs.write, h.parts, text, h.uid, h.gid)
            h.data = bytearray(text)
            h.applied = True
            return len(buf)
        if h.need_base:
            h.data = bytearray(await self._run(self.jobs.read, h.parts))
            h.need_base = False
        if h.append:
            off = len(h.data)
        if off > len(h.data):
            h.data.extend(b"\0" * (off - len(h.data)))
        h.data[off:off + len(buf)] = buf
        h.dirty = True
        return len(buf)

    async def _apply(self, h: FedHandle) -> None:
        """A "close" file's content, applied once (a refusal is not retried)."""
        if h.dirty:
            h.dirty = False
            await self._run(self.jobs.write, h.parts, bytes(h.data), h.uid, h.gid)
            h.applied = True

    async def flush(self, fh):
        await self._apply(self.handles[fh])

    async def fsync(self, fh, datasync):
        await self._apply(self.handles[fh])     # FederatedJobs' puts are durable

    async def release(self, fh):
        h = self.handles.pop(fh)
        try:
            await self._apply(h)
        except pyfuse3.FUSEError:
            pass                                # logged; release cannot report it
        finally:
            if h.created and not h.applied:
                await self._run(self.jobs.discard, h.parts)

    # ---- extended attributes: none ----

    async def fsyncdir(self, fh, datasync):
        """Nothing to make durable: every change is durable when it is accepted."""

    async def getxattr(self, inode, name, ctx):
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)

    async def listxattr(self, inode, ctx):
        return []

    async def setxattr(self, inode, name, value, ctx):
        raise self._refuse(errno.ENOTSUP, "xattr %s: %s keeps no extended attributes",
                           name.decode("utf-8", "replace"), FED_NAME)

    async def removexattr(self, inode, name, ctx):
        raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
