"""The SSD tier: slot versions in the SSD directory (docs/ssd-format.md).

    tier.py     SSDTier: the index, its locks, the scan at mount, the one
                place an entry is installed, the table of kinds
    state.py    what it keeps beside the index: order.json, namespace.json,
                policy.json, the RUNNING mark, corrupt/, the eviction order
    format.py   a slot file's format (trailer, attribute), SSDEntry, errors
    whole.py    kind "file": a version in one slot file
    logged.py   kind "logged": a slot file and its extent log (extentlog.py)
    packed.py   kind "packed": small versions as records in segment files
    reader.py   SSDReader: a version read straight from its file or record
    fileio.py   copies, fsyncs and syncfs the kinds share
    dirlock.py  one daemon per SSD directory
    stats.py    SSDStats

Each kind's module has the same operations (load_into, prefetch,
report_corrupt, rename, rewrite_meta, fsync, check, reader, ...); the tier
calls them through `SSDTier.kind_of(entry)`, and nothing outside a kind's
module tests which kind an entry is.  The kinds import format.py and
fileio.py, never tier.py: they reach the tier through the object it gives
them.
"""

from memosfs.store.ssd.dirlock import LOCK_NAME, DirectoryInUse, DirLock
from memosfs.store.ssd.format import (FLAG_BARE, MAGIC, XATTR, CorruptSlot, SSDEntry,
                                      SSDFull, StaleEntry, TornSlot, _name_of,
                                      encode_trailer, open_entry, read_trailer)
from memosfs.store.ssd.reader import SSDReader
from memosfs.store.ssd.state import RUNNING
from memosfs.store.ssd.stats import SSDStats
from memosfs.store.ssd.tier import SSDTier

__all__ = ["SSDTier", "SSDEntry", "SSDStats", "SSDReader", "SSDFull", "CorruptSlot",
           "TornSlot", "StaleEntry", "MAGIC", "XATTR", "FLAG_BARE", "RUNNING", "DirLock",
           "DirectoryInUse", "LOCK_NAME", "encode_trailer", "open_entry", "read_trailer",
           "_name_of"]
