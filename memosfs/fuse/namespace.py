"""Names and directories: the namespace handlers of MemosOperations (a mixin;
composed in operations.py).

Owns: lookup, forget, getattr, setattr (chmod, chown, utimes; truncate goes
to files.py), mkdir, rmdir, opendir, readdir, statfs, unlink, rename,
symlink, readlink, mknod, and the refusal of link; `_metadata_changed`
(what the SSD tier must learn of a change) and the tree surgery of the
control plane's reset_context (`find_session`, `reset_session`).

The tree.  The root holds agents and the control plane `.memos/` (and
`.federated`); an agent holds sessions; a session holds slots and
directories at any depth.  A slot anywhere else, or a directory inside the
control plane, is EPERM.  Symbolic links and special files (FIFOs,
sockets, device nodes) live in agents, sessions and the directories below
(`Entry`: a name kept with the namespace like a directory; the store never
sees them).  Hard links are EPERM: a slot's one path is its key in every
tier.  Names follow NAME_MAX (255 bytes), paths
below the mount the store's KEY_MAX.

Lookup counts.  Every entry handed to the kernel (lookup, create, mkdir,
readdirplus) adds one to `Node.lookups`; `forget` takes them away.  A node
that left the tree is deleted from the inode table once it has no lookups
and no open handles.

May call: the store (remove, rename, reset_session, mark_dirty,
namespace_changed, cache.stats), tenants (quotas follow agent directories),
persist.py (`_remote_name`), files.py (`_truncate`), opening.py (`create`,
for a regular file made by mknod), notify.py
(`_forget_entry`), the OpsCore helpers (core.py).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from typing import Optional

import pyfuse3

from memosfs import _native
from memosfs.fuse.core import FastCtx, OpsCore, log, refuse, tgid_of
from memosfs.fuse.fedtree import FED_INO
from memosfs.fuse.nodes import (
    AGENT, CTL, LINK_DIRS, NAME_MAX, ROOT, SESSION, SLOT_DIRS, SUBDIR, Dir, Node, Pseudo,
    Entry, Slot, Special, Symlink, now_ns)
from memosfs.fuse.tenants import QUOTA_XATTR

__all__ = ["NamespaceOps"]


class _SizeOnlyFields:
    """pyfuse3.SetattrFields of a setattr that changes the size alone."""

    update_size = True
    update_atime = update_mtime = update_ctime = update_mode = update_uid = \
        update_gid = False


_SIZE_ONLY = _SizeOnlyFields()


class NamespaceOps(OpsCore):
    """Names and directories (see the module docstring)."""

    async def lookup(self, parent_inode, name, ctx):
        """Find name in a directory; +1 lookup on success."""
        parent = self._dir(parent_inode)
        n = self._name(name)
        if n == ".":
            return self._entry(parent)
        if n == "..":
            return self._entry(parent.parent or parent)
        node = parent.children.get(n)
        if node is None and parent.level in SLOT_DIRS and self.store.remote is not None:
            node = await self._remote_name(parent, n)
        return self._found(parent, node, ctx)

    def _found(self, parent: Dir, node: Optional[Node], ctx) -> pyfuse3.EntryAttributes:
        """lookup's answer once the name's node (or None) is known."""
        if isinstance(node, Slot) and not node.version \
                and not node.is_writer(tgid_of(ctx.pid)):
            node = None                 # created, never published: not a hit
        if node is None:
            if parent.level in SLOT_DIRS:
                self._lookup_misses += 1
            raise pyfuse3.FUSEError(errno.ENOENT)
        if node.ino == FED_INO:         # `.federated`: what its getattr says
            self._looked_up(node, 1)
            return self.fed.root_attr()
        if isinstance(node, Slot) and self.__dict__.get("_pt_views_due"):
            view = self._pt_found(node, ctx.pid)
            if view is not None:
                return self._entry(view, ctx)
        return self._entry(node, ctx)

    # -- the fast path (memosfs._fuseshim.install_fast; see files.py) -------

    def fast_lookup(self, parent_inode: int, name: bytes, uid: int, gid: int, pid: int):
        """lookup answered on the spot (attributes or -errno), or None: the
        remote tier may know the name, `.federated`, unknown inodes."""
        if parent_inode >= FED_INO:
            return None
        parent = self.inodes.get(parent_inode)
        if not isinstance(parent, Dir):
            return None
        return self._answer("lookup", self._lookup_now, parent, name, FastCtx(uid, gid, pid))

    def _lookup_now(self, parent: Dir, name: bytes, ctx):
        n = self._name(name)
        if n in (".", ".."):
            return None
        node = parent.children.get(n)
        if node is None and parent.level in SLOT_DIRS and self.store.remote is not None:
            return None                 # (the remote tier may know it: the handler asks)
        return self._found(parent, node, ctx)

    def fast_getattr(self, inode: int, uid: int, gid: int, pid: int):
        """getattr answered on the spot, or None (`.federated`, unknown inodes)."""
        node = self.inodes.get(inode) if inode < FED_INO else None
        if node is None:
            return None
        return self._answer("getattr", self._attr, node, FastCtx(uid, gid, pid))

    def fast_truncate(self, inode: int, size: int, fh: int, uid: int, gid: int, pid: int):
        """setattr of the size alone answered on the spot (attributes or
        -errno), or None: a writer whose coherence hold must be upgraded
        first may wait (and `.federated`, unknown inodes)."""
        node = self.inodes.get(inode) if inode < FED_INO else None
        if node is None:
            return None
        h = self.handles.get(fh) if fh >= 0 else None
        if h is not None and (fh in self.fed.handles or (
                h.kind == "write" and h.hold is not None
                and not self.coherence.may_write(h.hold))):
            return None
        attr = pyfuse3.EntryAttributes()
        attr.st_size = size
        return self._run_now(self.setattr(inode, attr, _SIZE_ONLY, None if fh < 0 else fh,
                                          FastCtx(uid, gid, pid)))

    async def forget(self, inode_list):
        """The kernel dropped `nlookup` references to each inode."""
        for ino, nlookup in inode_list:
            node = self.inodes.get(ino)
            if node is None:
                continue
            self._looked_up(node, -nlookup)
            self._maybe_forget(node)

    async def getattr(self, inode, ctx):
        """Attributes; a slot shows its published version, and its draft to
        the processes writing it (see `_attr`)."""
        return self._attr(self._node(inode), ctx)

    async def setattr(self, inode, attr, fields, fh, ctx):
        """chmod, chown, utimens, truncate (path truncate publishes at once)."""
        node = self._node(inode)
        if isinstance(node, Pseudo) or (isinstance(node, Dir) and node.level == CTL):
            if fields.update_mode or fields.update_uid or fields.update_gid or (
                    (fields.update_atime or fields.update_mtime) and not fields.update_size
                    and fh is None):
                raise refuse(errno.EPERM, "chmod/chown/utimes of %s: the control plane "
                             "is fixed", node.name)
            # O_TRUNC of a knob file, or the times a write through an open
            # descriptor sets (the kernel's writeback cache): nothing to do
            return self._attr(node, ctx)
        now = now_ns()
        if fields.update_size:
            if isinstance(node, Dir):
                raise refuse(errno.EISDIR, "truncate of directory %s", node.name)
            if isinstance(node, Slot):
                await self._truncate(node, attr.st_size, fh, ctx)
        # (an inode that gave its name to a fresh one, for the kernel's retry
        # of a writer's open, is the same slot: its owner and mode go to the
        # inode that holds the name too, which is the one the tiers save)
        same = [node]
        while isinstance(same[-1], Slot) and same[-1].successor is not None:
            same.append(same[-1].successor)
        for n in same:
            if fields.update_mode:
                n.mode = stat.S_IFMT(n.mode) | stat.S_IMODE(attr.st_mode)
            if fields.update_uid:
                n.uid = attr.st_uid
            if fields.update_gid:
                n.gid = attr.st_gid
        if fields.update_atime:
            node.atime_ns = attr.st_atime_ns
        if fields.update_mtime:
            if isinstance(node, Slot) and node.pt_draft is not None:
                self._pt_poll(node)         # (writes before these times are older)
            node.mtime_ns = attr.st_mtime_ns
            if isinstance(node, Slot):
                self.slots.draft_mtime(node, attr.st_mtime_ns)
        node.ctime_ns = now
        # (the times a writer's close or the kernel's writeback sets through an
        # open descriptor go with the version its publish makes: the
        # published one is not written back again for them)
        by_writer = fh is not None and isinstance(node, Slot) and node.writers > 0
        owner = fields.update_mode or fields.update_uid or fields.update_gid
        self._metadata_changed(node, owner or (fields.update_mtime and not by_writer))
        if owner and len(same) > 1:
            same[-1].ctime_ns = now
            self._metadata_changed(same[-1])
        return self._attr(node, ctx)

    def _metadata_changed(self, node: Node, persisted: bool = True) -> None:
        """Owner, mode, times or xattrs changed: the SSD tier must learn it."""
        if not persisted:
            return
        if isinstance(node, Slot) and node.version and not node.detached \
                and node.successor is None:
            self.store.mark_dirty(node.key)
        elif isinstance(node, Entry) or (isinstance(node, Dir)
                                           and node.level in (AGENT, SESSION, SUBDIR)):
            self.store.namespace_changed()

    async def mkdir(self, parent_inode, name, mode, ctx):
        """An agent (in the root), a session (in an agent), or a directory
        at any depth below a session; +1 lookup."""
        parent = self._dir(parent_inode)
        n = self._name(name)
        if parent.level == ROOT:
            level = AGENT
        elif parent.level == AGENT:
            level = SESSION
        elif parent.level in SLOT_DIRS:
            level = SUBDIR
        else:
            raise refuse(errno.EPERM, "mkdir %s: the control plane is fixed", n)
        if n in parent.children:
            raise refuse(errno.EEXIST, "mkdir %s: exists", n, level=logging.DEBUG)
        if len(parent.key_of(n)) + 2 > _native.KEY_MAX:
            raise refuse(errno.ENAMETOOLONG, "mkdir %s: no slot would fit below it "
                         "(paths below the mount are at most %d bytes)", n, _native.KEY_MAX)
        gid = parent.gid if parent.mode & stat.S_ISGID else ctx.gid
        d = Dir(self._new_ino(), n, parent, self._new_mode(mode), ctx.uid, gid, level)
        if parent.mode & stat.S_ISGID:
            d.mode |= stat.S_ISGID
        parent.children[n] = d
        parent.mtime_ns = parent.ctime_ns = now_ns()
        self.inodes[d.ino] = d
        self.trace.emit("MKDIR", level=level, name=n, uid=ctx.uid)
        self.store.namespace_changed()
        return self._entry(d, ctx)

    async def rmdir(self, parent_inode, name, ctx):
        """Remove an empty directory."""
        parent = self._dir(parent_inode)
        n = self._name(name)
        node = parent.children.get(n)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if not isinstance(node, Dir):
            raise refuse(errno.ENOTDIR, "rmdir %s: not a directory", n)
        if node.level == CTL:
            raise refuse(errno.EPERM, "rmdir %s: the control plane is fixed", n)
        if node.children:
            # A slot created and never published is a name only its writers
            # find (lookup, readdir): to everybody else the directory is
            # empty, and it goes.  Those names go with it, and their writers'
            # close publishes nothing (publish.py: the writer is told why).
            tgid = tgid_of(ctx.pid)
            hidden = [c for c in node.children.values() if isinstance(c, Slot)
                      and not c.version and not c.is_writer(tgid)]
            if len(hidden) != len(node.children):
                raise refuse(errno.ENOTEMPTY, "rmdir %s: not empty", n, level=logging.DEBUG)
            for c in hidden:
                log.info("rmdir %s: %s was being written and was never published: it "
                         "goes with its directory", n, c.key.decode("utf-8", "replace"))
                self.store.remove(c.key)
                self._detach(c, "rmdir")
        if QUOTA_XATTR in node.xattrs:
            self.tenants.set_quota(node.name, 0)
        self._detach(node, "rmdir")
        self.store.namespace_changed()

    async def opendir(self, inode, ctx):
        """A handle on a directory, which remembers who opened it: readdir
        lists what lookup finds for that process."""
        self._dir(inode)
        fh = self._fh()
        self._dir_opens[fh] = (inode, tgid_of(ctx.pid))
        return fh

    async def readdir(self, fh, start_id, token):
        """List a directory: `.`, `..`, then the children in creation order.
        A slot that is being created and was never published is listed only
        to its writers, as lookup finds it only for them (so `ls -l`, `du`,
        `tar`, `rsync` and `rm -r` never meet a listed name that is
        ENOENT).  Offsets count every child, listed or not, so that a
        listing continued after a publish neither repeats nor skips a name.
        Each child handed over adds one lookup (the kernel takes none for
        `.` and `..`)."""
        ino, tgid = self._dir_opens.get(fh, (fh, 0))
        d = self._dir(ino)
        items: list[tuple[str, Node]] = [(".", d), ("..", d.parent or d)]
        items += list(d.children.items())
        for i in range(start_id, len(items)):
            name, node = items[i]
            if i >= 2 and isinstance(node, Slot) and not node.version \
                    and not node.is_writer(tgid):
                continue                # created, not published: not found (lookup)
            attr = self.fed.root_attr() if node.ino == FED_INO else self._attr(node)
            if not pyfuse3.readdir_reply(token, name.encode("utf-8", "surrogateescape"),
                                         attr, i + 1):
                break
            if i >= 2:
                self._looked_up(node, 1)

    async def releasedir(self, fh):
        self._dir_opens.pop(fh, None)

    async def statfs(self, ctx):
        """Both tiers, in 4 KiB blocks (what df shows; docs/operating.md; `memosfs df`
        prints each tier on its own):

        Size   memory capacity + the SSD tier's size: what its files hold
               plus the room it has left;
        Used   bytes the memory tier holds + bytes the SSD tier's files
               hold (a slot in both tiers counts in both);
        Avail  memory free + the SSD tier's room: the free space of the
               filesystem its directory is on, within ssd_capacity if set.

        Without an SSD tier (ssd=none) it is the memory tier alone."""
        c = self.store.cache.stats()
        page = _native.PAGE_SIZE
        size, free = c["capacity"], c["free_pages"] * page
        ssd = self.store.ssd
        if ssd is not None:
            try:
                v = os.statvfs(ssd.root)
                disk_free = v.f_bavail * v.f_frsize
            except OSError:
                disk_free = 0
            used = ssd.used_bytes
            room = disk_free if not ssd.capacity else max(0, min(ssd.capacity - used,
                                                                 disk_free))
            size += used + room
            free += room
        s = pyfuse3.StatvfsData()
        s.f_bsize = page
        s.f_frsize = page
        s.f_blocks = size // page
        s.f_bfree = min(free // page, s.f_blocks)
        s.f_bavail = s.f_bfree
        s.f_files = 1 << 32
        s.f_ffree = s.f_files - len(self.inodes)
        s.f_favail = s.f_ffree
        s.f_namemax = NAME_MAX
        return s

    async def unlink(self, parent_inode, name, ctx):
        """Remove a slot (open readers keep their version until they close),
        a symbolic link or a special file."""
        parent = self._dir(parent_inode)
        n = self._name(name)
        node = parent.children.get(n)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if isinstance(node, Dir):
            raise refuse(errno.EISDIR, "unlink %s: a directory", n)
        if isinstance(node, Pseudo):
            raise refuse(errno.EPERM, "unlink %s: the control plane is fixed", n)
        if isinstance(node, Entry):
            self._detach(node, "unlink")
            self.store.namespace_changed()
            return
        self.store.remove(node.key)
        self._detach(node, "unlink")

    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new,
                     flags, ctx):
        """Move a slot, a link or a special file between sessions, a session between
        agents, or rename an agent; replacing a target as rename(2) does.
        RENAME_EXCHANGE is EINVAL (docs/semantics.md)."""
        src_dir = self._dir(parent_inode_old)
        dst_dir = self._dir(parent_inode_new)
        old, new = self._name(name_old), self._name(name_new)
        node = src_dir.children.get(old)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise refuse(errno.EINVAL, "rename %s: RENAME_EXCHANGE is not supported", old)
        if isinstance(node, Pseudo) or (isinstance(node, Dir) and node.level == CTL) \
                or dst_dir.level == CTL:
            raise refuse(errno.EPERM, "rename %s: the control plane is fixed", old)
        level = getattr(node, "level", None)
        want = {AGENT: (ROOT,), SESSION: (AGENT,)}.get(
            level, LINK_DIRS if isinstance(node, Entry) else SLOT_DIRS)
        if dst_dir.level not in want:
            raise refuse(errno.EPERM, "rename %s: a %s belongs in a %s", old,
                         level or ("slot" if isinstance(node, Slot) else node.kind),
                         " or ".join(want))
        if isinstance(node, Dir) and node.contains(dst_dir):
            raise refuse(errno.EINVAL, "rename %s: into itself", old)
        target = dst_dir.children.get(new)
        if target is node:
            return
        if target is not None:
            if flags & pyfuse3.RENAME_NOREPLACE:
                raise refuse(errno.EEXIST, "rename to %s: exists", new, level=logging.DEBUG)
            if isinstance(node, Dir) and not isinstance(target, Dir):
                raise refuse(errno.ENOTDIR, "rename %s over a file", old)
            if not isinstance(node, Dir) and isinstance(target, Dir):
                raise refuse(errno.EISDIR, "rename %s over a directory", old)
            if isinstance(target, Dir) and target.children:
                raise refuse(errno.ENOTEMPTY, "rename over %s: not empty", new)
            if isinstance(target, Dir) and target.level != level:
                raise refuse(errno.EPERM, "rename %s over %s: a %s is not a %s", old, new,
                             level, target.level)
        longest = len(dst_dir.key_of(new)) + self._depth_bytes(node)
        if longest > _native.KEY_MAX:
            raise refuse(errno.ENAMETOOLONG, "rename %s to %s: a path below the mount "
                         "would be %d bytes (at most %d)", old, new, longest, _native.KEY_MAX)
        if isinstance(node, Dir):
            old_keys = [(s, s.key) for s in self._walk_slots(node)]
        elif isinstance(node, Slot):
            old_keys = [(node, node.key)]
        else:
            old_keys = []
        if target is not None:
            if isinstance(target, Slot) and not (isinstance(node, Slot) and node.version):
                # (a published slot replaces the target in every tier
                # itself, atomically: its durable copy is never removed first)
                self.store.remove(target.key)
            if isinstance(target, Slot) and isinstance(node, Slot):
                # rename(2): no process finds the new path missing.  The
                # slot table takes the target out (replaced): a reader whose
                # lookup found it before the rename opens it after and is
                # served the slot that holds the name now, and writers sent
                # back (ESTALE) to this name will find the slot renamed in
                if self._pt_state is not None and target.pt_mirror is not None:
                    self._pt_state.drop_mirror(target)
            elif isinstance(target, Slot):
                self._detach(target, "unlink")  # (a link or a special file over it)
            else:
                self._detach(target, "replaced")
        if isinstance(node, Slot):
            self.slots.rename(src_dir, old, dst_dir, new)
        del src_dir.children[old]
        node.move(new, dst_dir)
        dst_dir.children[new] = node
        for slot, key in old_keys:
            if slot.version:
                self.store.rename(key, slot.key)
        if isinstance(node, Dir) and node.level == AGENT:
            # a quota belongs to the agent directory: it follows the name
            if isinstance(target, Dir) and QUOTA_XATTR in target.xattrs:
                self.tenants.set_quota(new, 0)
            if QUOTA_XATTR in node.xattrs:
                self.tenants.set_quota(old, 0)
                self.tenants.set_quota(new, int(node.xattrs[QUOTA_XATTR]))
        now = now_ns()
        node.ctime_ns = src_dir.mtime_ns = src_dir.ctime_ns = now
        dst_dir.mtime_ns = dst_dir.ctime_ns = now
        if not isinstance(node, Slot) or isinstance(target, (Dir, Entry)):
            self.store.namespace_changed()

    def _depth_bytes(self, node: Node) -> int:
        """The longest path below node, "/" included (0 for a slot; a
        directory counts room for a one-byte slot)."""
        if not isinstance(node, Dir):
            return 0
        best = 2
        for name, child in node.children.items():
            best = max(best, 1 + len(name.encode("utf-8", "surrogateescape"))
                       + self._depth_bytes(child))
        return best

    async def link(self, inode, new_parent_inode, new_name, ctx):
        """Hard links are EPERM: a slot's path is its key in every tier (the
        memory index, the SSD file, the remote manifest, the coherence
        directory, the session's ring), so a second name would be a second
        slot; docs/design.md says more."""
        raise refuse(errno.EPERM, "link %s: a slot has one name (its path is its key in "
                     "every tier); use a symbolic link", self._name(new_name))

    async def symlink(self, parent_inode, name, target, ctx):
        """A symbolic link in an agent, a session or a directory below one,
        owned by the caller (the group as mkdir's); the namespace keeps it,
        durable as a mkdir is (fsync of its directory).  +1 lookup."""
        if parent_inode >= FED_INO:
            raise refuse(errno.EPERM, "symlink %s: .federated holds jobs only",
                         self._name(name))
        parent = self._dir(parent_inode)
        n = self._name(name)
        self._entry_place(parent, n, "symlink")
        gid = parent.gid if parent.mode & stat.S_ISGID else ctx.gid
        link = Symlink(self._new_ino(), n, parent, bytes(target), ctx.uid, gid)
        return self._add_entry(parent, link, ctx)

    def _add_entry(self, parent: Dir, node: Entry, ctx) -> pyfuse3.EntryAttributes:
        parent.children[node.name] = node
        parent.mtime_ns = parent.ctime_ns = now_ns()
        self.inodes[node.ino] = node
        self.store.namespace_changed()
        return self._entry(node, ctx)

    def _entry_place(self, parent: Dir, n: str, what: str) -> None:
        """The checks before a link or a special file is made: the place, the
        name free, the path within KEY_MAX."""
        if parent.level not in LINK_DIRS:
            raise refuse(errno.EPERM, "%s %s: it belongs in an agent, a session or below",
                         what, n)
        if n in parent.children:
            raise refuse(errno.EEXIST, "%s %s: exists", what, n, level=logging.DEBUG)
        if len(parent.key_of(n)) > _native.KEY_MAX:
            raise refuse(errno.ENAMETOOLONG, "%s %s: the path below the mount is "
                         "longer than %d bytes", what, n, _native.KEY_MAX)

    async def readlink(self, inode, ctx):
        """The target of a symbolic link; EINVAL for anything else."""
        node = self.inodes.get(inode) if inode < FED_INO else None
        if not isinstance(node, Symlink):
            raise pyfuse3.FUSEError(errno.EINVAL)
        return node.target

    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        """A regular file made with mknod(2) (GNU tar makes its files so when it
        restores their attributes) is an empty slot, published at once, as
        creat() and close() make one.  A FIFO, a socket or a device node is a
        special file where a symbolic link may be (`Special`: kept with the
        namespace; the kernel serves FIFOs and sockets itself, and checked
        CAP_MKNOD for a device).  +1 lookup."""
        if not stat.S_ISREG(mode):
            if parent_inode >= FED_INO:
                raise refuse(errno.EPERM, "mknod %s: .federated holds jobs only",
                             self._name(name))
            parent = self._dir(parent_inode)
            n = self._name(name)
            self._entry_place(parent, n, "mknod")
            if stat.S_IFMT(mode) not in Special.TYPES:
                raise refuse(errno.EINVAL, "mknod %s: file type %o", n, stat.S_IFMT(mode))
            gid = parent.gid if parent.mode & stat.S_ISGID else ctx.gid
            node = Special(self._new_ino(), n, parent, stat.S_IFMT(mode) | stat.S_IMODE(mode),
                           rdev if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else 0,
                           ctx.uid, gid)
            return self._add_entry(parent, node, ctx)
        fi, entry = await self.create(parent_inode, name, stat.S_IMODE(mode),
                                      os.O_RDONLY | os.O_CREAT | os.O_EXCL, ctx)
        await self.release(fi.fh)
        return entry

    # ---- reset_context (the control plane's) ----

    def find_session(self, agent: str, session: str) -> Optional[Dir]:
        """The session directory agent/session, or None."""
        a = self.root.children.get(agent)
        s = a.children.get(session) if isinstance(a, Dir) else None
        return s if isinstance(s, Dir) and s.level == SESSION else None

    def reset_session(self, session: Dir) -> None:
        """Drop every slot of a session from every tier, and its whole
        subtree from the namespace: slots no tier holds now (those being
        written keep their names), then the directories left empty of slots."""
        self.store.reset_session(session.parent.name, session.name)
        for link in [c for c in session.children.values() if isinstance(c, Entry)]:
            self._detach(link, "reset")
            self._forget_entry(session, link.name)
        for slot in list(self._walk_slots(session)):
            if not slot.writers:
                parent = slot.parent
                self._detach(slot, "reset")
                self._forget_entry(parent, slot.name)
        for child in [c for c in session.children.values() if isinstance(c, Dir)]:
            if not any(True for _ in self._walk_slots(child)):
                self._drop_tree(child)
        self.store.namespace_changed()

    def _drop_tree(self, d: Dir) -> None:
        for child in [c for c in d.children.values() if isinstance(c, Entry)]:
            self._detach(child, "reset")
            self._forget_entry(d, child.name)
        for child in [c for c in d.children.values() if isinstance(c, Dir)]:
            self._drop_tree(child)
        parent = d.parent
        self._detach(d, "reset")
        if parent is not None:
            self._forget_entry(parent, d.name)
