"""The filesystem's nodes and open files: Node, Dir, Slot, Symlink, Special,
Pseudo, Handle.

Owns: the in-memory tree (a Dir holds its children by name), each slot's
versions as the handlers see them (published version, the writers' shared
draft and base, the page-cache bookkeeping), and the one translation between
a slot, a directory, a symbolic link or a special file and the metadata a
tier keeps beside it (`Slot.meta`/`Slot.from_meta`,
`Dir.record`/`Dir.apply_record`, `Entry.record`/`entry_from_record`), used by
the SSD tier (save, and restore at mount) and by the remote tier (a name
another mount published).

Levels.  The root holds agents and the control plane; an agent holds
sessions; a session holds slots and directories (SUBDIR) at any depth; CTL
is a control-plane directory (`.memos/`, `.federated`).

Page-cache fields.  `Slot.pushing` and `Slot.cache_version` are shared with
the page-cache pusher's threads (memosfs/fuse/pagecache.py) and guarded by
PUSH_LOCK; the pusher changes them only through `claim_push`, `own_cache`
and `push_done`, and reads the version through `shows`.

May call: memosfs._native (types only), memosfs.fuse.coherence (Hold, a type).
Nothing here talks to the store or the kernel.
"""

from __future__ import annotations

import collections
import os
import stat
import threading
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional

from memosfs import _native

if TYPE_CHECKING:
    from memosfs.fuse.coherence import Hold

__all__ = ["Node", "Dir", "Slot", "Pseudo", "Handle", "Refusals", "PUSH_LOCK", "NAME_MAX",
           "CONTROL_DIR", "ROOT", "AGENT", "SESSION", "SUBDIR", "CTL", "SLOT_DIRS",
           "FIXED_LOOKUPS", "now_ns", "Entry", "Symlink", "Special", "entry_from_record",
           "LINK_DIRS"]

NAME_MAX = 255
CONTROL_DIR = ".memos"

ROOT, AGENT, SESSION, SUBDIR, CTL = "root", "agent", "session", "dir", "ctl"
SLOT_DIRS = (SESSION, SUBDIR)   # directories that hold slots (and directories)
LINK_DIRS = (AGENT, SESSION, SUBDIR)    # directories that hold symbolic links
                                        # and special files (Entry)
FIXED_LOOKUPS = 1 << 62         # the lookup count of nodes the kernel never forgets

PUSH_LOCK = threading.Lock()    # guards Slot.pushing and cache_version against
                                # the pusher thread; never held across a call
                                # into the kernel


def now_ns() -> int:
    return time.time_ns()


def _hex_map(d: dict[bytes, bytes]) -> dict[str, str]:
    # dict(d) is one step under the GIL: the store's threads read a node's
    # metadata while the request loop may change it (a snapshot of the moment;
    # a later change marks the slot dirty again)
    return {k.hex(): v.hex() for k, v in dict(d).items()}


def _unhex_map(m: Any) -> dict[bytes, bytes]:
    return {bytes.fromhex(k): bytes.fromhex(v) for k, v in m.items()}


# Bumped by every move of a node (Node.move): a slot's cached key is good while
# the generation it was computed in is the current one (a move of a directory
# changes the keys of everything below it).
_moves = [0]


class Node:
    """An inode: a directory, a slot, or a control-plane pseudo-file."""

    def __init__(self, ino: int, name: str, parent: Optional["Dir"], mode: int,
                 uid: int, gid: int) -> None:
        now = now_ns()
        self.ino = ino                  # inode number, never reused while mounted
        self.name = name                # current name in parent (changed by move() only)
        self.parent = parent            # None for the root and for detached nodes
        self.mode = mode                # S_IFMT | permission bits
        self.uid = uid
        self.gid = gid
        self.atime_ns = self.mtime_ns = self.ctime_ns = now
        self.lookups = 0                # kernel lookup count (forget lowers it)
        self.handles = 0                # open handles
        self.detached: Optional[str] = None  # why it left the tree, if it did
        self.xattrs: dict[bytes, bytes] = {}  # user.* attributes set by users

    def move(self, name: str, parent: Optional["Dir"]) -> None:
        """Give the node a new name and parent (a rename): every cached key goes."""
        self.name, self.parent = name, parent
        _moves[0] += 1

    def size(self) -> int:
        return 0

    def blocks(self) -> int:
        return 0

    def nlink(self) -> int:
        return 0 if self.detached else 1


class Children(dict):
    """A directory's entries by name, counting the directories among them
    (a directory's nlink, asked on every stat, in O(1))."""

    __slots__ = ("dirs",)

    def __init__(self) -> None:
        super().__init__()
        self.dirs = 0

    def __setitem__(self, name: str, node: "Node") -> None:
        self.dirs -= isinstance(dict.get(self, name), Dir)
        dict.__setitem__(self, name, node)
        self.dirs += isinstance(node, Dir)

    def __delitem__(self, name: str) -> None:
        self.dirs -= isinstance(dict.__getitem__(self, name), Dir)
        dict.__delitem__(self, name)

    def pop(self, name: str, *default):
        if name in self:
            node = dict.pop(self, name)
            self.dirs -= isinstance(node, Dir)
            return node
        return dict.pop(self, name, *default)

    def clear(self) -> None:
        dict.clear(self)
        self.dirs = 0

    def _refused(self, *args, **kwargs):
        raise TypeError("Children: change entries one by one")

    popitem = setdefault = update = __ior__ = _refused


class Dir(Node):
    def __init__(self, ino: int, name: str, parent: Optional["Dir"], mode: int,
                 uid: int, gid: int, level: str) -> None:
        super().__init__(ino, name, parent, stat.S_IFDIR | mode, uid, gid)
        self.level = level              # ROOT | AGENT | SESSION | SUBDIR | CTL
        self.children: Children = Children()

    def nlink(self) -> int:
        if self.detached:
            return 0
        return 2 + self.children.dirs

    def size(self) -> int:
        return 4096

    def path(self) -> str:
        """agent/session/d1/... below the root ("" for the root)."""
        parts = []
        d: Optional[Dir] = self
        while d is not None and d.level != ROOT:
            parts.append(d.name)
            d = d.parent
        return "/".join(reversed(parts))

    def key_of(self, name: str) -> bytes:
        """The store key of a slot called name in this directory."""
        return f"{self.path()}/{name}".encode("utf-8", "surrogateescape")

    def contains(self, other: "Node") -> bool:
        """Whether other is this directory or lies below it."""
        n: Optional[Node] = other
        while n is not None:
            if n is self:
                return True
            n = n.parent
        return False

    def record(self) -> dict:
        """What namespace.json keeps of this directory."""
        return {"path": self.path(), "mode": stat.S_IMODE(self.mode), "uid": self.uid,
                "gid": self.gid, "mtime_ns": self.mtime_ns,
                "xattrs": _hex_map(self.xattrs)}

    def apply_record(self, rec: dict) -> None:
        """Owner, mode, times and xattrs from a namespace.json record
        (KeyError, ValueError, TypeError on a bad one, part applied)."""
        self.mode = stat.S_IFDIR | (int(rec["mode"]) & 0o7777)
        self.uid, self.gid = int(rec["uid"]), int(rec["gid"])
        self.mtime_ns = self.ctime_ns = int(rec.get("mtime_ns", self.mtime_ns))
        self.xattrs = _unhex_map(rec.get("xattrs", {}))


class Refusals:
    """The byte ranges of a draft whose writes were refused since its last
    publish (EFBIG, ENOSPC, EDQUOT; under the writeback cache, pages the
    kernel could not hand over): while one is left, the draft lacks bytes
    its writers wrote, and it is never published (publish.py).  A range
    goes when a later write covers it (a writer that retries succeeded)
    or a truncate cuts it off (the writers chose the size); an O_TRUNC
    open or a truncate to 0 clears them all.  `code` is the errno of the
    first refusal, the one the writers' close and fsync report.  At most
    MAX ranges are kept: beyond that they merge into one span (stricter,
    never looser)."""

    MAX = 32

    __slots__ = ("spans", "code", "reason", "told")

    def __init__(self) -> None:
        self.spans: list[list[int]] = []    # [start, end) byte ranges, sorted, disjoint
        self.code = 0                       # errno of the first refusal (0: none left)
        self.reason: Optional[str] = None   # why it was refused, as the log said
        self.told = False                   # a publish refused for them was logged

    def __bool__(self) -> bool:
        return bool(self.spans)

    def note(self, start: int, end: int, code: int, reason: Optional[str] = None) -> None:
        """A change of [start, end) was refused with errno code."""
        end = max(end, start + 1)           # (a refused truncate to `start`: one byte)
        if not self.spans:
            self.code, self.reason, self.told = code, reason, False
        out: list[list[int]] = []
        for a, b in self.spans:
            if b < start or a > end:
                out.append([a, b])
            else:
                start, end = min(a, start), max(b, end)
        out.append([start, end])
        out.sort()
        if len(out) > self.MAX:
            out = [[out[0][0], max(b for _, b in out)]]
        self.spans = out

    def written(self, start: int, end: int) -> None:
        """[start, end) was written: what of the refused ranges it covers is there now."""
        if not self.spans or end <= start:
            return
        out: list[list[int]] = []
        for a, b in self.spans:
            if b <= start or a >= end:
                out.append([a, b])
                continue
            if a < start:
                out.append([a, start])
            if b > end:
                out.append([end, b])
        self.spans = out
        if not out:
            self.code, self.reason = 0, None

    def truncated(self, size: int) -> None:
        """The draft was cut (or grown) to size: ranges beyond it are not the draft's."""
        out = [[a, min(b, size)] for a, b in self.spans if a < size]
        self.spans = out
        if not out:
            self.code, self.reason = 0, None

    def clear(self) -> None:
        self.spans = []
        self.code, self.reason = 0, None


class Slot(Node):
    def __init__(self, ino: int, name: str, parent: Dir, mode: int, uid: int,
                 gid: int) -> None:
        super().__init__(ino, name, parent, stat.S_IFREG | mode, uid, gid)
        self.version = 0                # published version (0: never published)
        self.pub_size = 0               # bytes of the published version
        self.stored = 0                 # bytes of pages it holds
        self.readers = 0                # open read handles in page-cache mode
        self.pending: dict[int, float] = {}  # pid of a writer sent here by ESTALE
                                        # -> until when its retry is waited for
        self.writers = 0                # open write handles (they share the draft)
        self.writer_pids: collections.Counter[int] = collections.Counter()
                                        # tgid of each write handle's opener
        self.draft: Optional[_native.Draft] = None   # the writers' shared draft
        self.base: Optional[_native.Ref] = None      # published version the draft
                                        # will start from (copied at the first write)
        self.base_decoded: Optional[bytes] = None    # its logical bytes, if quantized
        self.changed = False            # the draft holds unpublished changes
        self.draft_mtime_ns = 0         # mtime the writers see (and the next publish sets)
        self.refused = Refusals()       # ranges of writes refused since the last publish
        self.trunc_only = False         # the draft is as an O_TRUNC open left it: nothing
                                        # written, truncated or refused since (files.py)
        self.cache_version = -1         # version the kernel may hold pages of (PUSH_LOCK)
        self.pages_trusted = False      # since the first writer opened, the kernel's pages
                                        # of this inode are the writers' draft's
        self.pages_version = 0          # the version the writers of this inode published
                                        # into it last (their pages hold it)
        self.successor: Optional[Slot] = None  # the inode that took our name
        self.replaced_by: Optional[Slot] = None  # the slot renamed over this one
                                        # (a reader whose lookup found this inode
                                        # before the rename is served that one)
        self.pushing = 0                # page-cache pushes in flight (PUSH_LOCK)
        self.privates: dict[int, "Slot"] = {}  # tgid -> the draft of its own a
                                        # retried writer of this inode got (_open_private)
        self.private_of: Optional[Slot] = None  # (such a draft's node) the inode it is for
        self.pt_draft = None            # the writers' file (passthrough.py Draft)
        self.pt_mirror = None           # a published version's file (passthrough.py Mirror)
        self.pt_backing: Optional[tuple] = None  # (backing id, its file, passthrough
                                        # handles open on this inode)
        self.pt_gen = 0                 # publishes on this inode (a mirror's validity)
        self.view_of: Optional[Slot] = None  # a readers' view of that slot (passthrough.py)
        self._key = b""                 # `key`, as of move generation _key_moves
        self._key_moves = -1

    # ---- metadata kept by the tiers ----

    @classmethod
    def from_meta(cls, ino: int, name: str, parent: Dir, meta: dict, version: int,
                  stored: int, size: int, uid: int = 0, gid: int = 0) -> "Slot":
        """A published slot as a tier keeps it: `meta` is what `meta()` gave
        (mode, owner, logical size, times, xattrs; each may be missing: uid
        and gid then default to the arguments, the logical size to `size`);
        unreadable xattrs are left out."""
        node = cls(ino, name, parent, int(meta.get("mode", 0o644)),
                   int(meta.get("uid", uid)), int(meta.get("gid", gid)))
        node.version, node.stored = version, stored
        node.pub_size = int(meta.get("logical_size", size))
        node.mtime_ns = node.ctime_ns = int(meta.get("mtime_ns", node.mtime_ns))
        node.atime_ns = int(meta.get("atime_ns", node.mtime_ns))
        try:
            node.xattrs = _unhex_map(meta.get("xattrs", {}))
        except (ValueError, AttributeError):
            node.xattrs = {}
        return node

    def meta(self) -> dict:
        """What the SSD and remote tiers keep beside the slot's bytes."""
        return {"mode": stat.S_IMODE(self.mode), "uid": self.uid, "gid": self.gid,
                "logical_size": self.pub_size,
                "mtime_ns": self.mtime_ns, "atime_ns": self.atime_ns,
                "xattrs": _hex_map(self.xattrs)}

    # ---- names and sizes ----

    @property
    def key(self) -> bytes:
        """agent/session/.../name, as the store knows it (kept until a move)."""
        if self._key_moves == _moves[0]:
            return self._key
        parts = [self.name]
        d = self.parent
        while d is not None and d.level != ROOT:
            parts.append(d.name)
            d = d.parent
        self._key = "/".join(reversed(parts)).encode("utf-8", "surrogateescape")
        self._key_moves = _moves[0]
        return self._key

    def name_holder(self) -> Optional["Slot"]:
        """For an inode that a rename replaced: the slot that holds its name
        now (following later supersedes and renames over), or None when the
        name is gone or has moved elsewhere since."""
        node = self.latest()
        key = node.key
        seen = 0
        while node.detached == "replaced" and node.replaced_by is not None and seen < 64:
            node = node.replaced_by.latest()
            seen += 1
        if node.detached or node.parent is None or node.key != key \
                or node.parent.children.get(node.name) is not node:
            return None
        return node

    def latest(self) -> "Slot":
        """The inode that holds this slot's name now (itself, or the end of
        its chain of successors)."""
        node = self
        while node.successor is not None:
            node = node.successor
        return node

    @property
    def writer_pending(self) -> bool:
        """Writers sent here by ESTALE are on their way (readers meanwhile read
        around the page cache, so each retry finds no page-cache readers)."""
        if self.pending:
            now = time.monotonic()
            for pid in [p for p, until in self.pending.items() if until <= now]:
                del self.pending[pid]               # never came back
        return bool(self.pending)

    def size(self) -> int:
        """The published version's size: what every process but the
        writers sees (see `OpsCore._attr` for the writers' view)."""
        return self.pub_size

    def draft_size(self) -> int:
        """The size the writers see: their draft's, or the base they will start from."""
        if self.pt_draft is not None:
            return self.pt_draft.size()
        if self.draft is not None:
            return self.draft.size
        if self.base_decoded is not None:
            return len(self.base_decoded)
        if self.base is not None:
            return self.base.size
        return self.pub_size

    def blocks(self) -> int:
        return (self.stored + 511) // 512

    # ---- the page-cache pusher's interface (any thread) ----

    def claim_push(self, version: int) -> bool:
        """A push of `version` into this inode starts; whether the kernel may
        hold pages of another version (they must be dropped first)."""
        with PUSH_LOCK:
            stale = self.cache_version not in (-1, version)
            if not stale:
                self.cache_version = version
            self.pushing += 1
        return stale

    def own_cache(self, version: int) -> None:
        """The kernel's pages of this inode were dropped: they are `version`'s now."""
        with PUSH_LOCK:
            self.cache_version = version

    def push_done(self) -> None:
        with PUSH_LOCK:
            self.pushing -= 1

    def shows(self, version: int) -> bool:
        """Whether this inode still holds the name at `version` (a push of
        that version may go on)."""
        return self.successor is None and not self.detached and self.version == version


class Entry(Node):
    """A name the namespace keeps and no tier stores: a symbolic link or a
    special file, in an agent, a session or a directory below one.  It is
    saved in namespace.json with the directories (`record`), so it is as
    durable as a mkdir, and it is a name like a slot's (unlink, rename)."""

    kind = ""                           # namespace.json's `type`

    def path(self) -> str:
        """agent/.../name below the root."""
        assert self.parent is not None
        return f"{self.parent.path()}/{self.name}"

    def record(self) -> dict:
        """What namespace.json keeps of this entry."""
        return {"path": self.path(), "type": self.kind, "uid": self.uid, "gid": self.gid,
                "mtime_ns": self.mtime_ns, "atime_ns": self.atime_ns,
                "xattrs": _hex_map(self.xattrs)}

    def _apply_times(self, rec: dict) -> None:
        self.mtime_ns = self.ctime_ns = int(rec.get("mtime_ns", self.mtime_ns))
        self.atime_ns = int(rec.get("atime_ns", self.mtime_ns))
        self.xattrs = _unhex_map(rec.get("xattrs", {}))


class Symlink(Entry):
    """A symbolic link: a name and the bytes it points to.  The kernel
    follows it; its mode is always 0777, as on every Linux filesystem."""

    kind = "symlink"

    def __init__(self, ino: int, name: str, parent: Dir, target: bytes, uid: int,
                 gid: int) -> None:
        super().__init__(ino, name, parent, stat.S_IFLNK | 0o777, uid, gid)
        self.target = target            # what readlink returns (any bytes but NUL)

    def size(self) -> int:
        return len(self.target)

    def record(self) -> dict:
        rec = super().record()
        rec["target"] = self.target.decode("utf-8", "surrogateescape")
        return rec

    @classmethod
    def from_record(cls, ino: int, name: str, parent: Dir, rec: dict) -> "Symlink":
        target = str(rec["target"]).encode("utf-8", "surrogateescape")
        if not target or b"\0" in target:
            raise ValueError("empty target or a NUL in it")
        node = cls(ino, name, parent, target, int(rec["uid"]), int(rec["gid"]))
        node._apply_times(rec)
        return node


class Special(Entry):
    """A FIFO, a socket, or a character or block device node (mknod(2),
    mkfifo(3), bind(2) of a Unix socket).  The kernel serves a FIFO and a
    socket itself; a device node does not open on a mount made nodev."""

    kind = "special"
    TYPES = (stat.S_IFIFO, stat.S_IFSOCK, stat.S_IFCHR, stat.S_IFBLK)

    def __init__(self, ino: int, name: str, parent: Dir, mode: int, rdev: int, uid: int,
                 gid: int) -> None:
        if stat.S_IFMT(mode) not in self.TYPES:
            raise ValueError(f"mode {mode:o} is no FIFO, socket or device")
        super().__init__(ino, name, parent, mode, uid, gid)
        self.rdev = rdev                # the device number of a device node (else 0)

    def record(self) -> dict:
        rec = super().record()
        rec["mode"], rec["rdev"] = self.mode, self.rdev
        return rec

    @classmethod
    def from_record(cls, ino: int, name: str, parent: Dir, rec: dict) -> "Special":
        node = cls(ino, name, parent, int(rec["mode"]), int(rec.get("rdev", 0)),
                   int(rec["uid"]), int(rec["gid"]))
        node._apply_times(rec)
        return node


def entry_from_record(ino: int, name: str, parent: Dir, rec: dict) -> Entry:
    """The Symlink or Special a namespace.json record of that `type`
    describes (KeyError, ValueError, TypeError on a bad one)."""
    cls = {"symlink": Symlink, "special": Special}.get(rec.get("type"))
    if cls is None:
        raise ValueError(f"type {rec.get('type')!r}")
    return cls.from_record(ino, name, parent, rec)


class Pseudo(Node):
    """A control-plane file: content made by `read`, writes applied by `write`
    -- or, for a command that waits (for the disk) and acts as its writer,
    awaited as `command(text, uid of the writer)`."""

    def __init__(self, ino: int, name: str, parent: Dir, mode: int,
                 read: Optional[Callable[[], str]],
                 write: Optional[Callable[[str], None]],
                 command: Optional[Callable[[str, int], Awaitable[None]]] = None) -> None:
        super().__init__(ino, name, parent, stat.S_IFREG | mode, 0, 0)
        self.read = read
        self.write = write
        self.command = command


class Handle:
    """An open file.  A write handle has no bytes of its own: every write
    handle on a slot shares the slot's draft (`Slot.draft`), as every
    descriptor of a file shares its pages on any filesystem."""

    __slots__ = ("fh", "node", "flags", "kind", "ref", "append", "data", "decoded",
                 "dio", "hold", "opener", "uid", "pt")

    def __init__(self, fh: int, node: Node, flags: int, kind: str) -> None:
        self.fh = fh
        self.node = node
        self.flags = flags
        self.kind = kind                # "read" | "write" | "pseudo"
        self.ref: Optional[_native.Ref] = None    # reader's pinned snapshot
        self.append = bool(flags & os.O_APPEND)
        self.data = b""                 # pseudo-file snapshot / written text
        self.decoded: Optional[bytes] = None  # logical bytes of a quantized version
        self.dio = False                # a reader reading around the page cache
        self.hold: Optional["Hold"] = None   # its place in the coherence directory
        self.opener = 0                 # tgid of the process that opened it
        self.uid = 0                    # uid of the opener (its share: tenants.py)
        self.pt = False                 # the kernel reads and writes its backing file
