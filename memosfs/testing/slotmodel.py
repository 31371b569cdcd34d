"""A model of docs/semantics.md's rules for slots, the oracle of the slot
state machine (native/slot.c, `memosfs._native.SlotMachine`) as
`memosfs/testing/refpolicies.py` is the policy's.

It knows names, slots, versions, drafts and handles, and nothing of inodes,
the page cache, ESTALE or supersedes: what it answers is only what a
process can observe.

- A **slot** is what a name points at; rename moves it, unlink, a rename
  over it and an eviction take it out of the tree.  It has a published
  version (number, size) or none yet.
- A **draft** belongs to one slot and is shared by every write handle that
  joins it; its **openers** (the processes that opened those handles)
  see its size.  A writer that keeps the content joins the slot's current
  draft, or starts one from the published version; an O_TRUNC writer joins
  an empty current draft, or, when another draft of the slot is being
  written, starts its own, which becomes the slot's current draft (whole
  versions replace each other: the last publish wins).
- **Publish** (the opener's close, fsync, the last release): nothing when
  the draft holds no change, when a process that is not its opener closes,
  or when its slot left the tree by unlink or rename (the bytes go with the
  name); refused (EIO) when one of its writes was refused since the last
  publish, until it is truncated to nothing; else the draft becomes the
  slot's version.  A publish of an evicted slot's draft puts the name back
  if it is free, and otherwise becomes the version of the slot that holds
  the name now.
- **A directory goes** (rmdir) when the caller finds no name in it: the
  names only their writers find (never published) go with it, as unlinked.
- **Who sees what**: a lookup of a name finds its slot when it was published
  or when the caller is an opener of its current draft; the size it shows
  is that draft's for its openers and the published version's for everybody
  else.  A reader keeps the version it opened.  When the current draft's
  last writer leaves a slot that was never published, the name goes.

May call: the standard library only.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

NOTHING, REFUSED, PUBLISHED = "nothing", "refused", "published"


@dataclasses.dataclass(eq=False)
class MSlot:
    name: int
    version: int = 0                   # published version, 0 if never
    size: int = 0                      # its bytes
    gone: Optional[str] = None         # None | "unlink" | "replaced" | "evicted" | "unpublished"
    current: Optional["MDraft"] = None  # the draft being written that the name's writers share
    replaced_by: Optional["MSlot"] = None  # the published slot a rename put on its name


@dataclasses.dataclass(eq=False)
class MDraft:
    slot: MSlot
    size: int
    changed: bool = False
    failed: bool = False
    writers: int = 0                   # write handles
    openers: dict = dataclasses.field(default_factory=dict)   # tgid -> handles


@dataclasses.dataclass(eq=False)
class MHandle:
    kind: str                          # "read" | "write"
    opener: int                        # tgid
    copies: set                        # tgids holding a copy (the opener, forked children)
    draft: Optional[MDraft] = None
    version: int = 0                   # a reader's version


class SlotModel:
    """The rules above over a flat namespace of int names."""

    def __init__(self) -> None:
        self.names: dict[int, MSlot] = {}

    # ---- finding ----

    def find(self, name: int, tgid: int) -> Optional[MSlot]:
        s = self.names.get(name)
        if s is None:
            return None
        if not s.version and not (s.current is not None and tgid in s.current.openers):
            return None                 # created, never published: only its writers
        return s

    def view(self, name: int, tgid: int) -> Optional[tuple[int, int]]:
        """(size, version) that tgid's stat of name shows, or None (ENOENT)."""
        s = self.find(name, tgid)
        if s is None:
            return None
        if s.current is not None and tgid in s.current.openers:
            return s.current.size, s.version
        return s.size, s.version

    # ---- opening ----

    def create(self, name: int, tgid: int, trunc: bool, excl: bool) -> Optional[MHandle]:
        """create(2) of a name the caller's lookup did not find; None: EEXIST."""
        s = self.names.get(name)
        if s is not None and excl:
            return None
        if s is None:
            s = self.names[name] = MSlot(name)
            trunc = True
        return self._writer(s, tgid, trunc)

    def open_read(self, s: MSlot, tgid: int) -> MHandle:
        return MHandle("read", tgid, {tgid}, version=s.version)

    def open_write(self, s: MSlot, tgid: int, trunc: bool) -> MHandle:
        return self._writer(s, tgid, trunc)

    def open_stale_read(self, s: MSlot, tgid: int) -> Optional[MHandle]:
        """A reader whose lookup found s before it left the tree: the slot
        renamed over its name (and over that one's, ...) serves it while it
        holds that name; an unlinked or evicted name is ENOENT."""
        if s.gone is None:
            return self.open_read(s, tgid) if self.find(s.name, tgid) is s else None
        name, node = s.name, s
        for _ in range(64):
            if node.gone != "replaced" or node.replaced_by is None:
                break
            node = node.replaced_by
        if node.gone is None and node.name == name and self.names.get(name) is node \
                and node.version:
            return self.open_read(node, tgid)
        return None

    def _writer(self, s: MSlot, tgid: int, trunc: bool) -> MHandle:
        d = s.current
        if d is None or (trunc and d.writers):
            d = MDraft(s, 0 if trunc else s.size)
            s.current = d
        if trunc:
            d.size, d.failed, d.changed = 0, False, True
        d.writers += 1
        d.openers[tgid] = d.openers.get(tgid, 0) + 1
        return MHandle("write", tgid, {tgid}, draft=d)

    # ---- writing ----

    def write(self, h: MHandle, off: int, n: int, append: bool) -> int:
        d = h.draft
        at = d.size if append else off
        d.size = max(d.size, at + n)
        d.changed = True
        return at

    def refused(self, h: MHandle) -> None:
        h.draft.failed = True

    def truncate(self, h: MHandle, size: int) -> None:
        d = h.draft
        d.size, d.changed = size, True
        if size == 0:
            d.failed = False

    def truncate_path(self, s: MSlot, size: int, version: int) -> None:
        """truncate(2) by path of a slot nobody writes: a version at once."""
        s.version, s.size = version, size

    # ---- publishing and closing ----

    def publish_due(self, h: MHandle, closer: int) -> str:
        """What a flush by closer (0: fsync, or the last release) does."""
        d = h.draft
        if d is None or not d.changed or (closer and closer != h.opener):
            return NOTHING
        if d.slot.gone in ("unlink", "replaced", "unpublished"):
            return NOTHING
        return REFUSED if d.failed else PUBLISHED

    def publish(self, h: MHandle, version: int) -> None:
        d = h.draft
        s = d.slot
        if s.gone == "evicted":
            holder = self.names.get(s.name)
            if holder is None:
                s.gone = None
                self.names[s.name] = holder = s
            s = holder
        s.version, s.size = version, d.size
        d.changed = d.failed = False

    def close_copy(self, h: MHandle, tgid: int) -> bool:
        """tgid closes its copy of h; whether it was the last copy (release)."""
        h.copies.discard(tgid)
        return not h.copies

    def writer_gone(self, h: MHandle) -> None:
        d = h.draft
        d.writers -= 1
        d.openers[h.opener] -= 1
        if not d.openers[h.opener]:
            del d.openers[h.opener]
        if d.writers:
            return
        s = d.slot
        if s.current is d:
            s.current = None
            if not s.version and s.gone is None:
                del self.names[s.name]          # a create that published nothing
                s.gone = "unpublished"

    # ---- the namespace ----

    def unlink(self, name: int) -> None:
        self.names.pop(name).gone = "unlink"

    def rmdir(self, tgid: int) -> Optional[list[int]]:
        """rmdir(2) by tgid of the directory of these names, then a mkdir of
        it again (the same names, a new directory): refused (None, ENOTEMPTY)
        while tgid finds a name in it; otherwise the names only their writers
        find go with it, unlinked (their writers' publishes go nowhere).
        Returns the names that went."""
        if any(self.find(name, tgid) is not None for name in self.names):
            return None
        gone = sorted(self.names)
        for name in gone:
            self.unlink(name)
        return gone

    def rename(self, old: int, new: int) -> None:
        s = self.names.pop(old)
        target = self.names.get(new)
        if target is not None and target is not s:
            target.gone = "replaced"
            if s.version:
                target.replaced_by = s
        s.name = new
        self.names[new] = s

    def drop(self, name: int) -> None:
        self.names.pop(name).gone = "evicted"
