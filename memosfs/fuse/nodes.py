"""The filesystem's nodes and open files: Node, Dir, Slot, Symlink, Special,
Pseudo, Handle.

Owns: the in-memory tree (a Dir holds its children by name), the namespace's
metadata of every node (mode, owner, times, xattrs), and the one
translation between a slot, a directory, a symbolic link or a special file
and the metadata a tier keeps beside it (`Slot.meta`/`Slot.apply_meta`,
`Dir.record`/`Dir.apply_record`, `Entry.record`/`entry_from_record`), used by
the SSD tier (save, and restore at mount) and by the remote tier (a name
another mount published).

A slot's state is not here: its versions, draft, handles and lookups, the
kernel page-cache bookkeeping, refusals and the inodes of its name are the
slot table's (memosfs/fuse/slots.py over native/slot.c).  `Slot` reads them
through properties; only the table changes them.

Levels.  The root holds agents and the control plane; an agent holds
sessions; a session holds slots and directories (SUBDIR) at any depth; CTL
is a control-plane directory (`.memos/`, `.federated`).

May call: memosfs._native (types only), memosfs.fuse.slots (the table's
reads), memosfs.fuse.coherence (Hold, a type).  Nothing here talks to the
store or the kernel.
"""

from __future__ import annotations

import collections
import os
import stat
import threading
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional

from memosfs import _native
from memosfs.fuse.slots import GONE_NAMES

if TYPE_CHECKING:
    from memosfs.fuse.coherence import Hold
    from memosfs.fuse.slots import SlotTable

__all__ = ["Node", "Dir", "Slot", "Pseudo", "Handle", "Refusals", "NAME_MAX",
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
        if not isinstance(self, Slot):  # (a slot's are the slot table's)
            self.lookups = 0            # kernel lookup count (forget lowers it)
            self.handles = 0            # open handles
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
    """What a draft's refusals look like to the handlers (read-only; the
    slot table holds them: the byte ranges of writes refused since the last
    publish, the first one's errno, whether its refused publish was told).
    While one is left, the draft lacks bytes its writers wrote, and it is
    never published (publish.py).  A range goes when a later write covers
    it or a truncate cuts it off (the table: `wrote`, `truncated`); an
    O_TRUNC open clears them all."""

    __slots__ = ("_node",)

    def __init__(self, node: "Slot") -> None:
        self._node = node

    def __bool__(self) -> bool:
        return bool(self._node._f(_native.SLOT_F_REFUSED))

    @property
    def code(self) -> int:
        return self._node._f(_native.SLOT_F_REFUSED_CODE)

    @property
    def told(self) -> bool:
        return bool(self._node._f(_native.SLOT_F_REFUSED_TOLD))

    @property
    def reason(self) -> Optional[str]:
        h = self._node._t.peek_holders(self._node.ino)
        return h.reason if h is not None else None


def _field(f: int, doc: str, cast: Callable[[int], Any] = int) -> property:
    return property(lambda self: cast(self._f(f)), doc=doc)


class Slot(Node):
    """A slot's inode as the handlers see it.  Its name, parent and
    metadata (mode, owner, times, xattrs) are the namespace's, here; all
    else -- its state, version, draft, handles and lookups, the kernel
    page-cache bookkeeping, refusals, the inodes of its name -- is the slot
    table's (memosfs/fuse/slots.py over native/slot.c): the properties
    below read it, and only the table's methods change it."""

    def __init__(self, table: "SlotTable", ino: int, name: str, parent: Optional[Dir],
                 mode: int, uid: int, gid: int) -> None:
        self._t = table
        super().__init__(ino, name, parent, stat.S_IFREG | mode, uid, gid)
        self._key = b""                 # `key`, as of move generation _key_moves
        self._key_moves = -1

    def _f(self, f: int) -> int:
        try:
            return self._t.m.field(self.ino, f)
        except KeyError:                # (forgotten by the table: nothing left)
            return 0

    # Node's counts are the table's for a slot
    lookups = _field(_native.SLOT_F_LOOKUPS, "the kernel's lookup count")
    handles = _field(_native.SLOT_F_HANDLES, "open handles")

    @lookups.setter
    def lookups(self, value: int) -> None:
        if value != 0:
            raise AttributeError("a slot's lookups change through the slot table")

    @handles.setter
    def handles(self, value: int) -> None:
        if value != 0:
            raise AttributeError("a slot's handles change through the slot table")

    @property
    def detached(self) -> Optional[str]:
        """Why it left the tree (the table's GONE reason), or None."""
        try:
            return GONE_NAMES[self._t.m.field(self.ino, _native.SLOT_F_GONE)]
        except KeyError:
            return "forgotten"

    @detached.setter
    def detached(self, value: Optional[str]) -> None:
        if value is not None:
            raise AttributeError("a slot leaves the tree through the slot table")

    version = _field(_native.SLOT_F_VERSION, "published version (0: never published)")
    pub_size = _field(_native.SLOT_F_PUB_SIZE, "bytes of the published version")
    stored = _field(_native.SLOT_F_STORED, "bytes of pages it holds")
    readers = _field(_native.SLOT_F_READERS, "open read handles in page-cache mode")
    writers = _field(_native.SLOT_F_WRITERS, "open write handles (they share the draft)")
    pushing = _field(_native.SLOT_F_PUSHING, "page-cache pushes in flight")
    changed = _field(_native.SLOT_F_CHANGED, "the draft holds unpublished changes", bool)
    trunc_only = _field(_native.SLOT_F_TRUNC_ONLY, "the draft is as an O_TRUNC open left "
                        "it: nothing written, truncated or refused since", bool)
    cache_version = _field(_native.SLOT_F_CACHE_VERSION, "version the kernel may hold "
                           "pages of (-1 none known, -2 stale)")
    pages_trusted = _field(_native.SLOT_F_TRUSTED, "since the first writer opened, the "
                           "kernel's pages of this inode are the writers' draft's", bool)
    pages_version = _field(_native.SLOT_F_PAGES_VERSION, "the version the writers of "
                           "this inode published into it last")
    pubs = _field(_native.SLOT_F_PUBS, "publishes on this inode (a mirror's generation)")
    draft_kind = _field(_native.SLOT_F_KIND, "what holds the writers' draft (SLOT_DRAFT_*)")
    writer_pending = _field(_native.SLOT_F_PENDING, "writers sent here by ESTALE are on "
                            "their way (readers meanwhile read around the page cache)", bool)
    state = _field(_native.SLOT_F_STATE, "the table's state (SLOT_CREATED, ...)")

    @property
    def refused(self) -> Refusals:
        return Refusals(self)

    def _link(self, f: int) -> Optional["Slot"]:
        ino = self._f(f)
        return self._t.node(ino) if ino else None

    @property
    def successor(self) -> Optional["Slot"]:
        """The inode that took our name (or, for a private draft or a view,
        the one its publishes and reads follow)."""
        return self._link(_native.SLOT_F_SUCCESSOR)

    @property
    def replaced_by(self) -> Optional["Slot"]:
        return self._link(_native.SLOT_F_REPLACED_BY)

    @property
    def private_of(self) -> Optional["Slot"]:
        """(a retried writer's own draft) the inode the kernel opened."""
        return self._link(_native.SLOT_F_PRIVATE_OF)

    @property
    def view_of(self) -> Optional["Slot"]:
        """(a readers' view) the slot whose writers' file keeps readers off it."""
        return self._link(_native.SLOT_F_VIEW_OF)

    @property
    def privates(self) -> bool:
        """Retried writers' drafts of their own follow this inode."""
        return bool(self._f(_native.SLOT_F_PRIVATES))

    def is_writer(self, tgid: int) -> bool:
        """Whether process tgid has a write handle on this inode."""
        return self._t.is_writer(self, tgid)

    # ---- the bytes holders (the table's; read here) ----

    @property
    def draft(self):
        h = self._t.peek_holders(self.ino)
        return h.draft if h is not None else None

    @property
    def base(self):
        h = self._t.peek_holders(self.ino)
        return h.base if h is not None else None

    @property
    def base_decoded(self) -> Optional[bytes]:
        h = self._t.peek_holders(self.ino)
        return h.base_decoded if h is not None else None

    @property
    def pt_draft(self):
        h = self._t.peek_holders(self.ino)
        return h.pt_draft if h is not None else None

    @property
    def pt_mirror(self):
        h = self._t.peek_holders(self.ino)
        return h.pt_mirror if h is not None else None

    @property
    def pt_backing(self) -> Optional[tuple]:
        """(backing id, its file, passthrough handles) while passthrough
        files are open on this inode."""
        bid = self._f(_native.SLOT_F_BACKING)
        if not bid:
            return None
        h = self._t.peek_holders(self.ino)
        return (bid, h.pt_file if h is not None else None,
                self._f(_native.SLOT_F_BACKING_OPENS))

    # ---- metadata kept by the tiers ----

    def apply_meta(self, meta: dict) -> None:
        """Owner, mode, times and xattrs from what a tier keeps beside a
        slot (`meta()`; each may be missing); unreadable xattrs left out."""
        self.mode = stat.S_IFREG | (int(meta.get("mode", stat.S_IMODE(self.mode))) & 0o7777)
        self.uid = int(meta.get("uid", self.uid))
        self.gid = int(meta.get("gid", self.gid))
        self.mtime_ns = self.ctime_ns = int(meta.get("mtime_ns", self.mtime_ns))
        self.atime_ns = int(meta.get("atime_ns", self.mtime_ns))
        try:
            self.xattrs = _unhex_map(meta.get("xattrs", {}))
        except (ValueError, AttributeError):
            self.xattrs = {}

    def like(self, other: "Slot") -> None:
        """Metadata as other's (a fresh inode of the same name)."""
        self.mode, self.uid, self.gid = other.mode, other.uid, other.gid
        self.xattrs = dict(other.xattrs)
        self.atime_ns, self.mtime_ns, self.ctime_ns = other.atime_ns, other.mtime_ns, \
            other.ctime_ns

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
        return self._link(_native.SLOT_F_NAME_HOLDER)

    def latest(self) -> "Slot":
        """The inode that holds this slot's name now (itself, or the end of
        its chain of successors)."""
        node = self._link(_native.SLOT_F_LATEST)
        return node if node is not None else self

    def nlink(self) -> int:
        return 0 if self.detached else 1

    def size(self) -> int:
        """The published version's size: what every process but the
        writers sees (see `OpsCore._attr` for the writers' view)."""
        return self.pub_size

    def draft_size(self) -> int:
        """The size the writers see: their draft's, or the base they will start from."""
        d = self.pt_draft
        if d is not None:
            return d.size()
        return self._f(_native.SLOT_F_DRAFT_SIZE)

    def blocks(self) -> int:
        return (self.stored + 511) // 512

    # ---- the page-cache pusher's interface (any thread) ----

    def claim_push(self, version: int) -> bool:
        """A push of `version` into this inode starts; whether the kernel may
        hold pages of another version (they must be dropped first)."""
        return self._t.push_claim(self, version)

    def own_cache(self, version: int) -> None:
        """The kernel's pages of this inode were dropped: they are `version`'s now."""
        self._t.own_cache(self, version)

    def push_done(self) -> None:
        self._t.push_done(self)

    def shows(self, version: int) -> bool:
        """Whether this inode still holds the name at `version` (a push of
        that version may go on)."""
        return self._t.shows(self, version)


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
