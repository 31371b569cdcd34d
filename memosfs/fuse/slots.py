"""The slot table: the one owner of every slot's state.

Each slot inode's state -- its named state (CREATED, PUBLISHED, WRITING,
SUPERSEDED, PRIVATE, VIEW, GONE and why), its published version, its
writers' draft (the kind that holds its bytes, its size, changed, the
refused byte ranges and their errno, trunc_only), its handles and lookups,
the kernel page-cache bookkeeping (page-cache readers, pushes, the version
the pages hold, writers on their way), the links between the inodes of one
name (successor, replaced_by, private_of, view_of) and the passthrough
backing id -- lives in one C table, native/slot.c, reached through
`_native.SlotMachine`.  It decides (open and publish plans) and records
(attach, wrote, published, ...); every call returns the effects the caller
carries out (SLOT_FX_*).  Nothing else writes any of it: `Slot`
(nodes.py) reads it through properties, and the handlers change it only
through the methods below, one per event.

What the table names but does not hold are the bytes: a draft's holder (a
memory draft, a spill file, a writers' file), the base a writer starts
from (a pinned version and its decoded bytes), a passthrough mirror or
backing file.  They are kept here beside the table, one `Holders` per inode
(`holders(node)`), put and taken by the methods of this class only, as the
effects say.  A refusal's reason (the log's words) is kept with them.

Names.  The table knows a name as a number (`name_id`: the parent
directory's inode and the name's string; a directory's rename moves no
slot's number); the tree of directories and strings is the caller's.  After
each call that can move a name to another inode (a publish while readers
hold the inode, a send-back, a rename, an unlink, a drop), `_settle(parent,
name)` points the directory's entry at the inode the table says holds the
name.  Inodes the table forgets (no lookup, handle, push or link keeps
them) leave the caller's inode map too (`_reap`).

One thread: every call is made with the GIL held and none releases it, so
the table's calls are serialized (the page-cache pusher's threads call
`push_*` too).

May call: memosfs._native (SlotMachine), memosfs.fuse.nodes (Slot, Dir).
"""

from __future__ import annotations

import errno
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from memosfs import _native as n

if TYPE_CHECKING:
    from memosfs.fuse.nodes import Dir, Node, Slot

__all__ = ["SlotTable", "Holders", "KIND_NAMES", "GONE_NAMES"]

F = n                                   # (the SLOT_F_* field numbers)
KIND_NAMES = {n.SLOT_DRAFT_NONE: "none", n.SLOT_DRAFT_ARENA: "arena",
              n.SLOT_DRAFT_SPILL: "spill", n.SLOT_DRAFT_OVERLAY: "overlay",
              n.SLOT_DRAFT_FILE: "file"}
GONE_NAMES = {n.SLOT_GONE_NOT: None, n.SLOT_GONE_UNPUBLISHED: "unpublished",
              n.SLOT_GONE_UNLINK: "unlink", n.SLOT_GONE_REPLACED: "replaced",
              n.SLOT_GONE_EVICTED: "evicted", n.SLOT_GONE_RMDIR: "rmdir"}
WHY = {"unlink": n.SLOT_GONE_UNLINK, "rmdir": n.SLOT_GONE_RMDIR}
NAME_MASK = (1 << 63) - 1


def _now() -> int:
    # the table's clock is the wall clock: the drafts' mtimes are taken from
    # it (a writer's stat shows them); its waits are seconds long
    return time.time_ns()


class Holders:
    """What holds a slot inode's bytes, beside the table (see the module
    docstring): none of it is state; the table's kind and flags say which
    are there."""

    __slots__ = ("draft", "base", "base_decoded", "pt_draft", "pt_mirror", "pt_file",
                 "reason")

    def __init__(self) -> None:
        self.draft: Any = None          # the writers' draft: _native.Draft or a SpillDraft
        self.base: Any = None           # the published version the writers start from
        self.base_decoded: Optional[bytes] = None   # its logical bytes, if quantized
        self.pt_draft: Any = None       # the writers' file (passthrough.py Draft)
        self.pt_mirror: Any = None      # a published version's file (passthrough.py Mirror)
        self.pt_file: Any = None        # the file the inode's backing id was registered for
        self.reason: Optional[str] = None   # the first refusal's words (the log's)

    def empty(self) -> bool:
        return self.draft is None and self.base is None and self.pt_draft is None \
            and self.pt_mirror is None and self.pt_file is None


class SlotTable:
    """The slot table (see the module docstring).  `inodes` is the caller's
    inode map (ino -> Node), `make(ino, like)` makes the Slot object of an
    inode the table made (like: the inode whose name and metadata it
    takes), `forgotten(node, holders)` hears of an inode the table forgot."""

    def __init__(self, first_ino: int, inodes: dict[int, "Node"],
                 make: Callable[[int, "Slot"], "Slot"],
                 forgotten: Callable[["Slot", Holders], None]) -> None:
        self.m = n.SlotMachine(first_ino=first_ino)
        self.inodes = inodes
        self._make = make
        self._forgotten = forgotten
        self._holders: dict[int, Holders] = {}

    # ---- numbers ----

    def new_ino(self) -> int:
        """An inode number (one numbering for every node of the mount)."""
        return self.m.new_ino()

    @staticmethod
    def name_id(parent: "Dir", name: str) -> int:
        """The table's number for `name` in `parent` (a directory's rename
        moves none)."""
        return (hash((parent.ino, name)) & NAME_MASK) or 1

    def set_writeback(self, on: bool) -> None:
        self.m.set_writeback(on)

    # ---- reading ----

    def field(self, ino: int, f: int, default: int = 0) -> int:
        try:
            return self.m.field(ino, f)
        except KeyError:
            return default

    def node(self, ino: int) -> Optional["Slot"]:
        return self.inodes.get(ino) if ino else None  # type: ignore[return-value]

    def holders(self, node: "Slot") -> Holders:
        """The bytes holders of node's inode (read; the methods below change them)."""
        h = self._holders.get(node.ino)
        if h is None:
            h = self._holders[node.ino] = Holders()
        return h

    def peek_holders(self, ino: int) -> Optional[Holders]:
        return self._holders.get(ino)

    def stat(self, node: "Slot", tgid: int) -> dict:
        return self.m.stat(node.ino, tgid, _now())

    def is_writer(self, node: "Slot", tgid: int) -> bool:
        return self.m.is_writer(node.ino, tgid)

    def own_private(self, node: "Slot", tgid: int) -> Optional["Slot"]:
        """tgid's own draft of node (a retried writer's), or None."""
        return self.node(self.m.private_of_tgid(node.ino, tgid))

    def check(self) -> None:
        """The table's invariants (AssertionError naming the first broken one),
        and the caller's map agreeing with it."""
        self.m.check()

    # ---- inodes and names ----

    def restore(self, parent: "Dir", name: str, version: int, size: int,
                stored: int, like: Callable[[int], "Slot"]) -> "Slot":
        """A published slot under name (mount, a remote name, creat(2) for
        reading): `like(ino)` makes its Slot object."""
        ino = self.m.restore(self.name_id(parent, name), version, size, stored, _now())
        node = like(ino)
        self.inodes[ino] = node
        parent.children[name] = node
        return node

    def lookups(self, node: "Slot", k: int) -> None:
        """The kernel learned (k > 0) or forgot (k < 0) node k times."""
        try:
            self.m.lookups(node.ino, k)
        except KeyError:
            return
        self._reap()

    def create(self, parent: "Dir", name: str, tgid: int, pid: int, trunc: bool,
               excl: bool, new: Callable[[int], "Slot"]) -> tuple["Slot", int]:
        """create(2) of name (a writer): a new CREATED inode (`new(ino)` makes
        its object), or an open of the one that holds it (a fresh inode if
        readers keep it).  FileExistsError with excl."""
        nid = self.name_id(parent, name)
        before = self.m.holder(nid)
        ino, fx = self.m.create(nid, tgid, pid, trunc, excl, _now())
        if not before:
            node = new(ino)
            self.inodes[ino] = node
            parent.children[name] = node
        else:
            self._settle(parent, name, like=self.node(before))
        node = self.node(ino)
        assert node is not None
        return node, fx

    def _settle(self, parent: "Dir", name: str, like: Optional["Slot"] = None) -> None:
        """Point parent's entry `name` at the inode the table says holds it
        (making its object, like `like` or the entry it replaces)."""
        from memosfs.fuse.nodes import Slot
        holder = self.m.holder(self.name_id(parent, name))
        cur = parent.children.get(name)
        if not holder:
            if isinstance(cur, Slot):
                del parent.children[name]
            return
        node = self.inodes.get(holder)
        if node is None:
            base = like if like is not None else cur if isinstance(cur, Slot) else None
            assert base is not None, f"no inode to make {name!r}'s new one like"
            node = self._make(holder, base)
            self.inodes[holder] = node
        if cur is not node:
            parent.children[name] = node

    def _made(self, ino: int, like: "Slot") -> "Slot":
        node = self.inodes.get(ino)
        if node is None:
            node = self._make(ino, like)
            self.inodes[ino] = node
        return node  # type: ignore[return-value]

    def _reap(self) -> None:
        """Inodes the table forgot leave the caller's map (their holders go)."""
        for ino in self.m.take_freed():
            node = self.inodes.pop(ino, None)
            h = self._holders.pop(ino, None)
            if node is not None:
                self._forgotten(node, h if h is not None else Holders())

    # ---- opening ----

    def open_plan(self, node: "Slot", tgid: int, pid: int, write: bool, trunc: bool,
                  retry: bool, waited: bool, locked: bool) -> tuple[int, int, int, int, int]:
        """(action, inode, target, version, fx) for an open of node (pure)."""
        return self.m.open_plan(node.ino, tgid, pid, write, trunc, retry, waited, _now(),
                                locked)

    def attach_reader(self, node: "Slot", version: int, mode: int) -> int:
        """A reader handle (mode 0: the page cache; 1: around it; 2: by
        passthrough); returns fx (KEEP_CACHE, DIRECT_IO)."""
        return self.m.attach_reader(node.ino, version, mode, _now())

    def attach_writer(self, node: "Slot", tgid: int, pid: int, trunc: bool) -> int:
        """A writer handle; returns fx (NEED_BASE, TRUNC_DRAFT, FREE_DRAFT).
        The holders of a base an O_TRUNC open lets go are released here."""
        fx = self.m.attach_writer(node.ino, tgid, pid, trunc, _now())
        if fx & n.SLOT_FX_FREE_DRAFT:
            self.release_base(node)
        return fx

    def private(self, node: "Slot", tgid: int, pid: int) -> tuple["Slot", int]:
        """A retried O_TRUNC writer's own draft of node: its PRIVATE inode."""
        ino, fx = self.m.private(node.ino, tgid, pid, _now())
        return self._made(ino, node), fx

    def send_back(self, node: "Slot", pid: int, trunc: bool) -> int:
        """Before an ESTALE to a writer: what its retry finds is made ready
        (a fresh inode for the name when readers or writers keep node)."""
        fx = self.m.send_back(node.ino, pid, trunc, _now())
        if node.parent is not None:
            self._settle(node.parent, node.name, like=node)
        return fx

    def wait_mark(self, node: "Slot", pid: int) -> None:
        """pid is on its way to node (readers meanwhile read around its cache)."""
        self.m.wait_mark(node.ino, pid, _now())

    def pending_pop(self, node: "Slot", pid: int) -> None:
        try:
            self.m.pending_pop(node.ino, pid)
        except KeyError:
            pass

    def is_pending(self, node: "Slot", pid: int) -> bool:
        try:
            return self.m.is_pending(node.ino, pid)
        except KeyError:
            return False

    def view(self, node: "Slot") -> "Slot":
        """A readers' view of the slot node holds its name for."""
        return self._made(self.m.view(node.ino, _now()), node)

    # ---- the draft ----

    def write_plan(self, node: "Slot", off: int, append: bool) -> tuple[int, int]:
        return self.m.write_plan(node.ino, off, append)

    def wrote(self, node: "Slot", at: int, k: int) -> None:
        self.m.wrote(node.ino, at, k, _now())

    def truncated(self, node: "Slot", size: int) -> None:
        self.m.truncated(node.ino, size, _now())

    def refused(self, node: "Slot", start: int, end: int, code: int,
                reason: Optional[str]) -> None:
        """A write of [start, end) was refused with errno code (reason: the log's)."""
        first = not node.refused
        self.m.refused(node.ino, start, max(end, start + 1), code)
        if first:
            self.holders(node).reason = reason

    def refusal_told(self, node: "Slot") -> None:
        self.m.refusal_told(node.ino)

    def changed(self, node: "Slot", size: int, mtime_ns: int) -> None:
        """The draft changed without a write request (the kernel wrote the
        writers' file)."""
        self.m.changed(node.ino, size, mtime_ns)

    def draft_mtime(self, node: "Slot", mtime_ns: int) -> None:
        self.m.draft_mtime(node.ino, mtime_ns)

    def set_draft(self, node: "Slot", draft: Any, kind: int) -> None:
        """The writers' draft is `draft` now (made from the base, an O_TRUNC's
        empty one, a spill), of that kind; the base goes."""
        h = self.holders(node)
        h.draft = draft
        self.release_base(node)
        self.m.draft_made(node.ino, kind, draft.size)

    def take_draft(self, node: "Slot") -> Any:
        """The writers' draft, handed to a publish (the table learns of it
        from `published`)."""
        h = self.holders(node)
        d, h.draft = h.draft, None
        return d

    def put_back_draft(self, node: "Slot", draft: Any) -> None:
        """A publish that did not happen: the writers keep their draft."""
        self.holders(node).draft = draft

    def set_base(self, node: "Slot", ref: Any, decoded: Optional[bytes]) -> None:
        """The published version the writers will start from (NEED_BASE)."""
        h = self.holders(node)
        if h.base is not None and h.base is not ref:
            h.base.release()
        h.base, h.base_decoded = ref, decoded

    def release_base(self, node: "Slot") -> None:
        h = self._holders.get(node.ino)
        if h is None:
            return
        if h.base is not None:
            h.base.release()
        h.base = None
        h.base_decoded = None

    # ---- publishing ----

    def publish_plan(self, node: "Slot", opener: int, closer: int) -> tuple[int, int]:
        return self.m.publish_plan(node.ino, opener, closer)

    def published(self, node: "Slot", version: int, size: int,
                  stored: int) -> tuple["Slot", int]:
        """The writers of node published `version`: the inode that holds
        the name now (a fresh one when readers keep the old), and fx."""
        holder, fx = self.m.published(node.ino, version, size, stored, _now())
        target = self.node(self.field(node.ino, F.SLOT_F_LATEST))
        like = target if target is not None else node
        h = self._made(holder, like)
        if h.parent is not None:
            self._settle(h.parent, h.name, like=like)
        return h, fx

    def set_version(self, node: "Slot", version: int, size: int,
                    stored: int) -> tuple["Slot", int]:
        """A new version made by no writer of node (truncate(2) by path, a
        newer version another mount published): its holder and fx."""
        holder, fx = self.m.set_version(node.ino, version, size, stored, _now())
        h = self._made(holder, node)
        if h.parent is not None:
            self._settle(h.parent, h.name, like=node)
        return h, fx

    def discarded(self, node: "Slot") -> None:
        """The writers' changes went with a name that is gone."""
        self.m.discarded(node.ino)

    # ---- closing ----

    def reader_gone(self, node: "Slot", dio: bool) -> None:
        self.m.reader_gone(node.ino, dio)
        self._reap()

    def writer_gone(self, node: "Slot", tgid: int) -> int:
        """A write handle is released; the last writer's draft and base go
        (FREE_DRAFT); a create that published nothing loses its name."""
        fx = self.m.writer_gone(node.ino, tgid, _now())
        if fx & n.SLOT_FX_FREE_DRAFT:
            h = self._holders.get(node.ino)
            if h is not None:
                if h.draft is not None:
                    h.draft.free()
                    h.draft = None
                h.reason = None
            self.release_base(node)
        if node.parent is not None and fx & n.SLOT_FX_FORGET_ENTRY:
            self._settle(node.parent, node.name, like=node)
        self._reap()
        return fx

    # ---- the namespace ----

    def remove(self, parent: "Dir", name: str, why: str = "unlink") -> int:
        """unlink(2) of name (why: "unlink", or "rmdir": its directory went)."""
        fx = self.m.remove(self.name_id(parent, name), WHY[why])
        self._settle(parent, name)
        self._reap()
        return fx

    def rename(self, src: "Dir", old: str, dst: "Dir", new: str) -> int:
        """rename(2) of a slot over whatever slot holds `new`."""
        fx = self.m.rename(self.name_id(src, old), self.name_id(dst, new))
        self._reap()
        return fx

    def drop(self, parent: "Dir", name: str) -> int:
        """No tier holds the name's slot now: the name goes."""
        try:
            fx = self.m.drop(self.name_id(parent, name))
        except KeyError:
            return 0
        self._settle(parent, name)
        self._reap()
        return fx

    # ---- the page-cache pusher (any thread: the GIL serializes) ----

    def push_claim(self, node: "Slot", version: int) -> bool:
        return self.m.push_claim(node.ino, version)

    def own_cache(self, node: "Slot", version: int) -> None:
        try:
            self.m.own_cache(node.ino, version)
        except KeyError:
            pass

    def push_done(self, node: "Slot") -> None:
        try:
            self.m.push_done(node.ino)
        except (KeyError, ValueError):
            return
        self._reap()

    def shows(self, node: "Slot", version: int) -> bool:
        """Whether node still holds its name at `version` (a push may go on)."""
        m, ino = self.m, node.ino
        try:
            return not m.field(ino, F.SLOT_F_SUCCESSOR) and m.field(ino, F.SLOT_F_GONE) == 0 \
                and m.field(ino, F.SLOT_F_VERSION) == version
        except KeyError:
            return False

    def pages_stale(self, node: "Slot") -> None:
        """The kernel's pages of node hold no version's bytes (quantized
        writers): not the writers' draft, not any version."""
        try:
            self.m.pages_stale(node.ino)
        except KeyError:
            pass

    def pages_dropped(self, node: "Slot") -> None:
        try:
            self.m.pages_dropped(node.ino)
        except KeyError:
            pass

    # ---- passthrough ----

    def backing_attach(self, node: "Slot", bid: int, file: Any) -> None:
        self.m.backing_attach(node.ino, bid)
        self.holders(node).pt_file = file

    def backing_detach(self, node: "Slot") -> tuple[int, bool, Any]:
        """(backing id, whether it was the last handle, the file it backs)."""
        bid, last = self.m.backing_detach(node.ino)
        h = self.holders(node)
        file = h.pt_file
        if last:
            h.pt_file = None
        return bid, last, file

    def set_pt_draft(self, node: "Slot", d: Any) -> None:
        """The writers' file of a whole new version (kind FILE), or None."""
        self.holders(node).pt_draft = d
        if d is not None:
            self.m.draft_made(node.ino, n.SLOT_DRAFT_FILE, d.size())

    def set_pt_mirror(self, node: "Slot", m: Any) -> None:
        self.holders(node).pt_mirror = m

    def set_pt_file(self, node: "Slot", f: Any) -> None:
        self.holders(node).pt_file = f


def errno_name(code: int) -> str:
    return errno.errorcode.get(code, "refused")
