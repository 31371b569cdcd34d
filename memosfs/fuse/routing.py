"""Wrappers put around the pyfuse3 handlers of MemosOperations once, when
the class is made: the `.federated` routing and the guard.

Routing.  Requests on `.federated` (memosfs/fuse/fedtree.py: inodes from
FED_INO up, and the handles FedTree opened) go to the handler of the same
name on `ops.fed`.  FED_ROUTES says, handler by handler, how a request is
recognised as one of them; it is the one place where the handlers meet the
federated tree.  Handlers not listed (forget, statfs, releasedir, poll,
link, symlink, mknod) never see `.federated` or treat it as any node.

Guard.  The daemon never dies on a request: a handler that fails with
anything but a FUSEError answers EIO and logs why (pyfuse3 would otherwise
stop the main loop).  The guard is outermost, so a failure in the
federated tree is caught the same way.  It also says who the caller is
while the handler runs (why.CALLER: the context's uid, or for read, write,
flush, release and fsync the uid of the handle's opener) and which
request it is (why.OPERATION), so that a refusal reaches that uid's
`.memos/why`, a refused save or open kept visible there.

It also says which slot the request acts on (core.SUBJECT: its path
below the mount), so that every refusal's log line names it.

May call: `ops.fed` (FedTree), `ops.handles`, `ops.inodes` and `ops.why` (to
know and tell the caller and the slot), the handlers it wraps; nothing else.
"""

from __future__ import annotations

import errno
import functools
import logging
from typing import Callable, Optional

import pyfuse3

from memosfs.fuse.core import SUBJECT, NeedRoom
from memosfs.fuse.fedtree import FED_INO
from memosfs.fuse.nodes import SLOT_DIRS
from memosfs.fuse.why import CALLER, OPERATION

log = logging.getLogger("memosfs.fuse.operations")

__all__ = ["FED_ROUTES", "route_federated", "guard_handlers"]


def _by_inode(ops, ino, *rest) -> bool:
    """The first argument is an inode (or a directory handle, which is its inode)."""
    return ino >= FED_INO


def _by_handle(ops, fh, *rest) -> bool:
    """The first argument is a file handle FedTree opened."""
    return fh in ops.fed.handles


def _by_either_parent(ops, parent_old, name_old, parent_new, *rest) -> bool:
    """rename: either directory is under `.federated` (FedTree refuses the
    crossing with EXDEV)."""
    return max(parent_old, parent_new) >= FED_INO


FED_ROUTES: dict[str, Callable[..., bool]] = {
    "lookup": _by_inode, "getattr": _by_inode, "setattr": _by_inode,
    "mkdir": _by_inode, "rmdir": _by_inode, "unlink": _by_inode,
    "rename": _by_either_parent,
    "opendir": _by_inode, "readdir": _by_inode, "fsyncdir": _by_inode,
    "create": _by_inode, "open": _by_inode,
    "read": _by_handle, "write": _by_handle, "flush": _by_handle,
    "fsync": _by_handle, "release": _by_handle,
    "getxattr": _by_inode, "listxattr": _by_inode, "setxattr": _by_inode,
    "removexattr": _by_inode,
}


def _routed(name: str, test: Callable[..., bool], fn):
    @functools.wraps(fn)
    async def handler(self, *args):
        if test(self, *args):
            return await getattr(self.fed, name)(*args)
        return await fn(self, *args)
    return handler


def route_federated(cls: type) -> None:
    """Wrap each handler FED_ROUTES names so that `.federated` requests go to
    `self.fed`."""
    for name, test in FED_ROUTES.items():
        setattr(cls, name, _routed(name, test, getattr(cls, name)))


# handlers whose first argument is a file handle (and that have no context)
_BY_FH = frozenset(("read", "write", "flush", "release", "fsync"))


def _caller_uid(ops, name: str, args: tuple) -> Optional[int]:
    """The uid a request comes from, or None where the handler cannot say."""
    uid = getattr(args[-1], "uid", None) if args else None
    if uid is None and name in _BY_FH and args:
        h = ops.handles.get(args[0]) or ops.fed.handles.get(args[0])
        uid = getattr(h, "uid", None)
    return uid if isinstance(uid, int) else None


# handlers whose first argument is an inode (the slot a refusal names)
_BY_INODE = frozenset(("open", "setattr", "getxattr", "setxattr", "removexattr"))


def _subject(ops, name: str, args: tuple) -> object:
    """The slot a request acts on (core.SUBJECT: a node, or the parent and
    the name of a create), or None."""
    if name in _BY_FH and args:
        h = ops.handles.get(args[0])
        return getattr(h, "node", None)
    if name in _BY_INODE and args:
        return ops.inodes.get(args[0])
    if name == "create" and len(args) > 1:
        parent = ops.inodes.get(args[0])
        if getattr(parent, "level", None) in SLOT_DIRS:
            return (parent, args[1])
    return None


def _guard(fn):
    name = fn.__name__

    @functools.wraps(fn)
    async def handler(self, *args):
        uid = _caller_uid(self, name, args)
        token = CALLER.set((uid, self.why)) if uid is not None else None
        op = OPERATION.set(name)
        subject = _subject(self, name, args)
        about = SUBJECT.set(subject) if subject is not None else None
        try:
            return await fn(self, *args)
        except (pyfuse3.FUSEError, NeedRoom):
            # NeedRoom: a fast twin ran the handler (_run_now) and the memory
            # tier must make room first; the twin declines and the request
            # comes back to this handler, which then waits for room
            raise
        except Exception:
            self._refused += 1
            log.exception("%s failed; answering EIO", name)
            if uid is not None:
                self.why.note(uid, errno.EIO, f"{name} failed: an internal error (the "
                              f"daemon's log has the traceback)", name)
            raise pyfuse3.FUSEError(errno.EIO) from None
        finally:
            if about is not None:
                SUBJECT.reset(about)
            OPERATION.reset(op)
            if token is not None:
                CALLER.reset(token)

    return handler


def guard_handlers(cls: type) -> None:
    """Put the guard around every pyfuse3 handler cls (or its mixins) defines."""
    for name, default in vars(pyfuse3.Operations).items():
        if name.startswith("_") or not callable(default):
            continue
        fn = getattr(cls, name)
        if fn is not default:
            setattr(cls, name, _guard(fn))
