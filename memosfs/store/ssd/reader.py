"""SSDReader: a version read straight from the SSD tier, for when memory
cannot take it; each kind's module has the part that reads it (whole.py
FileReader, logged.py LoggedReader, packed.py PackedReader)."""

from __future__ import annotations

from typing import Optional

from memosfs.store import spill as _spill
from memosfs.store.ssd.format import SSDEntry
from memosfs.store.ssd.logged import LoggedReader
from memosfs.store.ssd.packed import PackedReader
from memosfs.store.ssd.whole import FileReader

# the readers of the kinds, by SSDEntry.kind (tier.py has the same table of
# the kinds' operations, bound to a tier)
READERS = {"file": FileReader, "logged": LoggedReader, "packed": PackedReader}


class SSDReader:
    """A version read straight from its file, for when memory cannot take it
    (full of pinned or unwritable data, or the slot is larger than memory).
    Quacks like a pinned `_native.Ref` for readers; the open descriptor keeps
    this version readable even if a newer one replaces the file (a packed
    record: its bytes, read and checked).  StaleEntry: look again;
    CorruptSlot: it does not check out."""

    dirty = False
    live = True
    hits = 0
    sticky = False

    def __init__(self, entry: SSDEntry) -> None:
        self.key = entry.key
        self.version = entry.version
        self.size = entry.size
        self.stored = entry.file_bytes
        self.entry = entry
        self._part = READERS[entry.kind](entry)

    def read(self, off: int, n: int) -> bytes:
        return self._part.read(off, max(0, min(n, self.size - off)))

    def overlay_base(self) -> Optional["_spill.BaseView"]:
        """This version as the base of an overlay draft (spill.py), over
        duplicated descriptors; None for a packed record or a file of an
        older memosfs (no seq: a log cannot name it)."""
        return self._part.overlay_base()

    def plain_fd(self) -> Optional[int]:
        """The descriptor of this version's file when its bytes [0, size)
        are the version (no extent log, not packed), else None."""
        return self._part.plain_fd()

    def release(self) -> None:
        self._part.release()
