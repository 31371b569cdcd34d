"""Extended attributes, and the other two ways a holder talks to the
coherence directory: the MEMOS_IOC_ACK ioctl and poll (a mixin of
MemosOperations; composed in operations.py).

Attributes.  `user.*` attributes are kept on slots and directories (saved
with them); `user.memos.*` are the daemon's: tier, dirty, version, hits,
stored_bytes and pin of a slot (pin set to 0 or 1 within the caller's
share), state (the caller's coherence state), ack (write: acknowledge an
invalidation), quota on an agent directory (root only) and usage on every
agent directory (its bytes in memory, quota or not).  Control-plane nodes
take no user.* attributes (ENOTSUP).

Computed attributes and copy tools.  What the cache computes (tier,
dirty, version, hits, stored_bytes, pin, state, usage) is status of the
cache, not an attribute of the file: getxattr reads it by name
(`getfattr -n user.memos.tier`), but listxattr does not list it, so
`cp -a`, `rsync -X`, `mv` and `tar --xattrs` neither copy it out (where it
would be stale at once) nor try to remove it from a file they make in the
mount.  Setting or removing one (a copy made by an older memosfs coming
back) is accepted and changes nothing, with a line in the log.  A quota is
the directory's own (stored, listed, copied with it).  docs/xattrs.md has
the table.

Owns: getxattr, listxattr, setxattr, removexattr, `_set_quota`, ioctl,
poll, coherence_interrupt.

May call: the store (peek, ssd_entry, tier_of, load, namespace_changed),
coherence (state, ack, poll, interrupt), tenants (quotas, pins), the
OpsCore helpers (core.py), `_metadata_changed` (namespace.py).
"""

from __future__ import annotations

import errno
import logging

import pyfuse3

from memosfs import _native
from memosfs.abi import MEMOS_IOC_ACK
from memosfs.knobs import KnobError, parse_size
from memosfs.fuse.coherence import agent_name
from memosfs.fuse.core import OpsCore, log, refuse
from memosfs.fuse.fedtree import FED_INO
from memosfs.fuse.nodes import AGENT, CTL, Dir, Node, Pseudo, Slot, now_ns
from memosfs.fuse.tenants import QUOTA_XATTR, USAGE_XATTR, OverLimit

__all__ = ["XattrOps"]


class XattrOps(OpsCore):
    """Extended attributes, MEMOS_IOC_ACK and poll (see the module docstring)."""

    _MEMOS_ATTRS = (b"user.memos.tier", b"user.memos.dirty", b"user.memos.version",
                    b"user.memos.hits", b"user.memos.stored_bytes", b"user.memos.pin")
    # computed, never listed; a set or a removal of one changes nothing
    COMPUTED = frozenset(_MEMOS_ATTRS + (b"user.memos.state", USAGE_XATTR)) - {
        b"user.memos.pin"}

    def _memos_attr(self, node: Slot, name: bytes) -> bytes:
        ref = self.store.peek(node.key) if node.version else None
        if ref is None:
            entry = self.store.ssd_entry(node.key) if node.version else None
            if entry is None and node.version and self.store.tier_of(node.key) == "remote":
                return {b"user.memos.tier": b"remote",
                        b"user.memos.version": str(node.version).encode(),
                        b"user.memos.stored_bytes": str(node.stored).encode()}.get(
                            name, b"0")
            if entry is None:
                return {b"user.memos.tier": b"none", b"user.memos.version": b"0"}.get(
                    name, b"0")
            return {b"user.memos.tier": b"ssd",
                    b"user.memos.version": str(entry.version).encode(),
                    b"user.memos.stored_bytes": str(entry.file_bytes).encode()}.get(
                        name, b"0")
        try:
            values = {
                b"user.memos.tier": b"mem",
                b"user.memos.dirty": b"1" if ref.dirty else b"0",
                b"user.memos.version": str(ref.version).encode(),
                b"user.memos.hits": str(ref.hits).encode(),
                b"user.memos.stored_bytes": str(ref.stored).encode(),
                b"user.memos.pin": b"1" if ref.sticky else b"0",
            }
            return values[name]
        finally:
            ref.release()

    def fast_getxattr(self, inode: int, name: bytes):
        """getxattr answered on the spot by memosfs._fuseshim (the kernel asks
        for security.capability before every write): an attribute the node
        keeps, ENOATTR, or None for the handler below (memosfs's own
        attributes, `.federated`, unknown inodes)."""
        if inode >= FED_INO or name.startswith(b"user.memos."):
            return None
        node = self.inodes.get(inode)
        if node is None:
            return None
        value = node.xattrs.get(name)
        return -pyfuse3.ENOATTR if value is None else value

    async def getxattr(self, inode, name, ctx):
        node = self._node(inode)
        if isinstance(node, Slot) and name == b"user.memos.state":
            node = node.latest()
            return self.coherence.state(node.key, self.coherence.agent_of(ctx)).encode()
        if isinstance(node, Slot) and name in self._MEMOS_ATTRS:
            return self._memos_attr(node, name)
        if name == USAGE_XATTR and isinstance(node, Dir) and node.level == AGENT:
            return str(self.tenants.memory_bytes(node.name)).encode()
        try:
            return node.xattrs[name]
        except KeyError:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR) from None

    async def listxattr(self, inode, ctx):
        """The node's own attributes (user.*, a quota); not the computed
        user.memos.* status (see the module docstring)."""
        return list(self._node(inode).xattrs)

    def _computed_write(self, node: Node, name: bytes, what: str) -> bool:
        """A set or removal of a computed attribute: True (accepted, nothing
        changes) where the node has that attribute."""
        if name not in self.COMPUTED or not (
                isinstance(node, Slot) if name != USAGE_XATTR
                else isinstance(node, Dir) and node.level == AGENT):
            return False
        log.info("%s %s on %s: computed by the cache, nothing stored (accepted, "
                 "unchanged)", what, name.decode("utf-8", "replace"), node.name)
        return True

    async def setxattr(self, inode, name, value, ctx):
        node = self._node(inode)
        if name == b"user.memos.ack" and isinstance(node, Slot):
            # the caller acknowledges that its copy of this slot is stale
            node = node.latest()
            agent = self.coherence.agent_of(ctx)
            if not self.coherence.ack(node.key, agent):
                raise refuse(errno.EINVAL, "ack %s: %s has no invalidation to acknowledge",
                             node.name, agent_name(agent))
            return
        if name == b"user.memos.pin" and isinstance(node, Slot):
            if value.strip() not in (b"0", b"1"):
                raise refuse(errno.EINVAL, "user.memos.pin takes 0 or 1, not %r", value)
            node = node.latest()
            if not node.version:
                raise refuse(errno.ENOENT, "pin %s: nothing published yet", node.name)
            on = value.strip() == b"1"
            ref = self.store.peek(node.key)
            if ref is None and not on:
                return                          # not in memory: not pinned
            if ref is None:                     # on the SSD (or remote) tier: bring it in
                ref = await self._off_loop(self.store.load, node.key)
                if ref is None:
                    raise refuse(errno.ENOENT, "pin %s: the slot left every tier", node.name)
                if not isinstance(ref, _native.Ref):
                    ref.release()
                    raise refuse(errno.ENOSPC, "pin %s: the memory tier cannot take it",
                                 node.name)
            try:
                if on:
                    self.tenants.check_pin(ctx.uid, node, ref)
            except OverLimit as e:
                ref.release()
                self._refused += 1
                raise refuse(errno.EDQUOT, "pin %s: %s", node.name, e,
                             level=logging.WARNING) from None
            ref.sticky = on
            self.tenants.pinned(ctx.uid, node, ref, on)
            ref.release()
            self.trace.emit("PIN", key=node.key.decode("utf-8", "replace"),
                            on=value.strip().decode())
            return
        if name == QUOTA_XATTR:
            return self._set_quota(node, bytes(value), ctx)
        if self._computed_write(node, name, "setxattr"):
            return
        if name.startswith(b"user.memos."):
            raise refuse(errno.EPERM, "%s is read-only", name.decode("utf-8", "replace"))
        if not name.startswith(b"user.") or isinstance(node, Pseudo) \
                or (isinstance(node, Dir) and node.level == CTL):
            raise refuse(errno.ENOTSUP, "xattr %s: only user.* attributes are kept",
                         name.decode("utf-8", "replace"))
        node.xattrs[name] = bytes(value)
        node.ctime_ns = now_ns()
        self._metadata_changed(node)

    def _set_quota(self, node: Node, value: bytes, ctx) -> None:
        """user.memos.quota on an agent directory (root only): its share of
        the memory tier, in bytes (4G, 512M; 0 takes it away)."""
        if not isinstance(node, Dir) or node.level != AGENT:
            raise refuse(errno.EINVAL, "user.memos.quota belongs on an agent directory")
        if ctx.uid != 0:
            raise refuse(errno.EPERM, "user.memos.quota on %s: only root sets quotas "
                         "(uid %d tried)", node.name, ctx.uid, level=logging.WARNING)
        try:
            text = value.decode("ascii").strip()
            n = parse_size(text) if text else -1
        except (UnicodeDecodeError, KnobError):
            n = -1
        if n < 0 or n > 1 << 50:
            raise refuse(errno.EINVAL, "user.memos.quota on %s: %r is not a size "
                         "(bytes, or 512M, 4G)", node.name, value)
        try:
            if n:
                self.tenants.check_quota(node.name, n)
            self.tenants.set_quota(node.name, n)
        except (ValueError, OSError) as e:
            raise refuse(errno.ENOSPC if isinstance(e, OSError) else errno.EINVAL,
                         "user.memos.quota on %s: %s", node.name, e,
                         level=logging.WARNING) from None
        if n:
            node.xattrs[QUOTA_XATTR] = str(n).encode()
        else:
            node.xattrs.pop(QUOTA_XATTR, None)
        log.info("agent %s: quota %d bytes", node.name, n)
        self.tenants.check_quotas()
        node.ctime_ns = now_ns()
        self.store.namespace_changed()
        if n:
            try:
                self.tenants.make_room(node.name, 0)
            except OverLimit as e:
                log.warning("%s (its slots stay until they can go)", e)

    async def removexattr(self, inode, name, ctx):
        node = self._node(inode)
        if name == QUOTA_XATTR and isinstance(node, Dir) and QUOTA_XATTR in node.xattrs:
            return self._set_quota(node, b"0", ctx)
        if self._computed_write(node, name, "removexattr"):
            return
        if name.startswith(b"user.memos."):
            raise refuse(errno.EPERM, "%s is read-only", name.decode("utf-8", "replace"))
        if node.xattrs.pop(name, None) is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        node.ctime_ns = now_ns()
        self._metadata_changed(node)

    def ioctl(self, fh: int, cmd: int, pid: int) -> int:
        """From memosfs._fuseshim (trio thread): ioctl(2) on an open file.
        MEMOS_IOC_ACK acknowledges the invalidation of the handle's agent —
        the way a holder without write permission (no user.* xattrs) acks
        without closing; EINVAL when there is nothing to acknowledge.
        Returns an errno (0: done)."""
        h = self.handles.get(fh)       # (a `.federated` handle is not in it:
        if h is None or h.kind == "pseudo":     # one allocator numbers both)
            return errno.ENOTTY
        if cmd != MEMOS_IOC_ACK:
            log.debug("ioctl %#x on %s by pid %d: not ours (ENOTTY)", cmd, h.node.name, pid)
            return errno.ENOTTY
        hold = h.hold
        if hold is None or hold.revoked or not self.coherence.ack(hold.key, hold.agent):
            self._refused += 1
            refuse(errno.EINVAL, "MEMOS_IOC_ACK on %s by pid %d: %s", h.node.name, pid,
                   "the handle holds nothing (protocol 0)" if hold is None else
                   "its hold was revoked" if hold.revoked else
                   f"{agent_name(hold.agent)} has no invalidation to acknowledge")
            return errno.EINVAL
        return 0

    async def poll(self, inode, fh, ph, ctx):
        """POLLPRI once another agent's write invalidated this handle's copy."""
        h = self.handles.get(fh)
        if h is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return self.coherence.poll(h.hold, ph)

    def coherence_interrupt(self, pid: int) -> None:
        """From memosfs._fuseshim: the kernel interrupted an open or create of
        thread pid; a coherence wait it is in ends with EINTR."""
        self.coherence.interrupt(pid)
