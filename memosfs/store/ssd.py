"""The SSD tier: one self-describing, checksummed file per slot.

Format (one file per slot, named by a hash of its key, in 256 shard folders).
A file is payload-only (`SSDEntry.bare`, what this code writes):

    [0, size)            the slot's bytes (the payload) and nothing else, so a
                         file maps as the slot and the kernel can read it as a
                         FUSE passthrough backing file
    attribute `user.memosfs.slot` (XATTR):
                         trailer: version u64, size u64, payload crc32c u32,
                         flags u32 (FLAG_BARE), key length u32, meta length u32,
                         key, meta (JSON); then a footer: H u32 (the trailer's
                         length), trailer crc32c u32, magic "MEMOSLT1"

or, where the folder's file system refuses the attribute (no user xattrs,
or a metadata too large for it) and in folders older memosfs wrote, the
trailer layout, the same bytes after the payload (flags 0):

    [0, size)            the payload
    [size, size+H)       trailer
    [size+H, size+H+16)  footer

Each file is read by its own layout: a file with the attribute is
payload-only (its size must be the trailer's), any other by its footer.

Crash safety: a version is written to a temporary name in the same folder,
fsync'd, then renamed over the old file, so after a crash at any point the
name holds either the old version or the new one, never a mix (the
attribute is set on the temporary file before its fsync and rename, so
each version is self-describing).  A durable
write (fsync of a slot, flush, unmount) also fsyncs the folder, so the
rename itself survives.  Temporary files left by a crash are removed at
mount.  A slot renamed to another key is copied under the new key's name
(renamed over whatever file that key had: never removed first), its folder
fsync'd, and only then is the old key's file removed: at every point one of
the two names holds it.  Removals and renames are durable once `sync` has
fsync'd the folders they touched (the fsync of a directory on the mount).
Power loss: what recovery depends on is fsync'd before what assumes it (a
fold's rename before its log's unlink, a tombstone before the slot file it
shadows goes, namespace.json's bytes before its rename, a new folder into
its parent); a scan first syncfs'es the folder's file system, so nothing it
acts on is lost to a later power loss; an empty slot file (a write-back a
power loss took before its bytes reached the disk) is removed at mount, not
called corrupt, and after a daemon that did not unmount cleanly (RUNNING is
there: every mount makes it, a clean unmount removes it) one the power loss
cut short (`TornSlot`: never fsync'd, so never acknowledged) is set aside as
`<name>.torn`, not counted (docs/ssd-format.md, "What a power loss leaves").

A file whose footer, trailer or size does not check out is reported (log
and `ssd_corrupt`) and moved aside into `corrupt/` at mount; a payload whose
checksum fails is caught when it is read, reported the same way, and never
served.  A payload-only file handed to the kernel as a passthrough backing
file (`open_backing`) is not read by the daemon on every read: its whole
payload is read and checked the first time this daemon opens that file's
version so (the pages stay in the page cache for the reader that follows),
and later opens of the same file skip the check.

Readers and writers.  An index entry names its file by path and by inode
number (`SSDEntry.ino`): a file is renamed into place and the index changed
in one step under `lock`, so whoever holds an entry either opens that very
file (same inode: a stable snapshot for as long as the descriptor is open,
whatever replaces the name later) or finds another inode under the path, a
newer version (`StaleEntry`: look the key up again), never pairs an entry
with another version's bytes.  A file is declared corrupt only by
`report_corrupt`, under both locks, only while the index still points at the
entry that failed and the path still holds that entry's inode, and only
after the file's own trailer was checked: a valid file is never set aside.

Besides the slots, the folder holds `order.json` (keys, most recently used
first: the warm-up order), `namespace.json` (agents and sessions with
their owners and modes) and `policy.json` (the state of the eviction policy
the tier evicts by beyond ssd_capacity: memosfs/store/ssdpolicy.py), each
replaced atomically, and `.lock`: the daemon
that uses the folder holds an exclusive flock on it for its whole life, so a
second daemon on the same folder is refused before it touches anything
(DirLock, at the end of this file; the kernel drops the lock when the
daemon dies, so a crash leaves no stale lock).

All of it is the daemon's user's alone: folders 0700, files 0600, set
explicitly whatever the umask; a folder with looser modes (an older memosfs
made it 0755, its JSON files 0644) is tightened when the tier opens, with a
WARNING in the log (memosfs/private.py).

A large slot's write-back that changed a few extents of the version its
file holds (`Ref.changes()`) appends them to the slot's extent log beside
the file (`<name>.log`, `SSDEntry.log`; memosfs/store/extentlog.py) instead
of writing a new file; the log is folded (the whole version written as
above, then the log unlinked) when it grows.  The file is never changed in
place, so a crash leaves the log ending before the new record or inside it
(cut at mount): the version before or the new one.

Slots smaller than `ssd_pack_below` are not files but records appended to
segment files (memosfs/store/segments.py, `self.segs`, PackedEntry in the
index); the hooks here hand those entries to it.

A writers' draft the memory tier had no room for lives in a spill file of
`spill/` (memosfs/store/spill.py); `put_file` makes such a file a slot's
version: finished and renamed into place like a write-back's temporary
file, never copied.

The tier interface is small — put, load, remove, rename, keys, sizes — so
that another tier (a shared remote one) can stand beside it.
"""

from __future__ import annotations

import dataclasses
import errno
import hashlib
import itertools
import json
import logging
import mmap
import os
import shutil
import struct
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable, NoReturn, Optional

from memosfs import _native
from memosfs.private import open_private, private_dir, private_makedirs, tighten_tree
from memosfs.stats import Record, counter, gauge
from memosfs.store import extentlog as _extentlog
from memosfs.store import spill as _spill
from memosfs.store.ssdpolicy import STATE_NAME, SSDPolicy

log = logging.getLogger("memosfs.store.ssd")

__all__ = ["SSDTier", "SSDEntry", "SSDStats", "CorruptSlot", "StaleEntry", "MAGIC",
           "XATTR", "DirLock", "DirectoryInUse", "LOCK_NAME"]

MAGIC = b"MEMOSLT1"
_FOOTER = struct.Struct("<II8s")          # trailer length, trailer crc, magic
_FIXED = struct.Struct("<QQIIII")         # version, size, crc, flags, klen, mlen
MAX_TRAILER = 1 << 20
XATTR = "user.memosfs.slot"               # a payload-only file's trailer and footer
FLAG_BARE = 1                             # trailer flag: it is the file's XATTR
# Write payload-only files (the trailer in XATTR).  False writes the trailer
# layout every file had before (tests use it to make an older folder).
WRITE_BARE = True
# what setxattr answers when the folder's file system will not keep the
# attribute (no user xattrs; a value larger than it takes: ext4 keeps about
# one block of attributes per file): that file gets the trailer layout
_ATTR_REFUSED = frozenset((errno.ENOTSUP, errno.EOPNOTSUPP, errno.E2BIG, errno.ENOSPC,
                           errno.ERANGE))
_ATTR_ABSENT = frozenset((errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP))
VERIFIED_FILES = 8192                     # open_backing's cache of checked files
# An overlay draft (spill.py) published as a log record reads its runs into
# memory: at most this many bytes of them (more: published whole)
OVERLAY_PAYLOAD_MAX = 64 << 20
POLICY_SAVE_S = 10.0                      # background saves of policy.json, at most this often
RUNNING = ".running"                      # from a mount's scan until its clean unmount


class CorruptSlot(Exception):
    """A slot file that does not check out; the message says how."""


class TornSlot(CorruptSlot):
    """A slot file that ends before the end its own layout gives it (a
    trailer-layout file without its footer, a payload-only file shorter than
    its attribute says): what a power loss leaves of a write-back renamed
    into place before all its bytes were on the disk, or a file truncated."""


class StaleEntry(Exception):
    """The entry's file is no longer under its path (a newer version replaced
    it, or it was removed or renamed away): look the key up again."""


@dataclass
class SSDEntry:
    """A slot version on the SSD."""
    key: bytes
    version: int
    size: int                   # payload bytes
    crc: int                    # payload crc32c
    path: str
    # bytes the version takes: payload, trailer and footer, in the file or
    # (bare) in its attribute; what ssd_capacity counts
    file_bytes: int
    meta: dict[str, Any] = field(default_factory=dict)
    # whether the file's bytes are known durable: True (fsync'd), False
    # (written by this daemon without an fsync: see SSDTier._write_locked),
    # None (found at mount: a daemon killed before may have left it unsynced)
    synced: Optional[bool] = None
    ino: int = 0                # the file's inode number (0: not known, never checked)
    # the file holds the payload alone, its trailer in the XATTR attribute
    # (a passthrough backing file: open_backing); False: the trailer layout
    bare: bool = False
    # the seq in the file's trailer (0: not known, or a file of an older
    # memosfs): an extent log names its base file by it
    fseq: int = 0
    # the version is the file's (the base) changed by the records of its
    # extent log (memosfs/store/extentlog.py); None: the file alone.  Then
    # file_bytes counts the base and the log, and version, size and crc are
    # the last record's
    log: Optional[_extentlog.SlotLog] = None

    @property
    def maybe_durable(self) -> bool:
        """Whether the file may hold a version an fsync made durable: then a
        write replacing it is fsync'd first.  A slot file with an extent log
        may, whatever its last record (synced False says only that the last
        appends wait for an fsync)."""
        return self.synced is not False or self.log is not None

    @property
    def file_size(self) -> int:
        """The length of the slot's file: the payload alone when bare."""
        if self.log is not None:
            return self.log.base[1] if self.log.base_bare else self.log.base_bytes
        return self.size if self.bare else self.file_bytes


def _name_of(key: bytes) -> str:
    return hashlib.sha256(key).hexdigest()[:40]


def _meta_bytes(meta: dict[str, Any]) -> bytes:
    return json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()


def _encode(key: bytes, version: int, size: int, crc: int, m: bytes, flags: int) -> bytes:
    trailer = _FIXED.pack(version, size, crc, flags, len(key), len(m)) + key + m
    return trailer + _FOOTER.pack(len(trailer), _native.crc32c(trailer), MAGIC)


def encode_trailer(key: bytes, version: int, size: int, crc: int,
                   meta: dict[str, Any], flags: int = 0) -> bytes:
    """Trailer and footer: after the payload (flags 0), or a payload-only
    file's XATTR value (flags FLAG_BARE)."""
    return _encode(key, version, size, crc, _meta_bytes(meta), flags)


def _slot_attr(fd: int) -> Optional[bytes]:
    """The file's XATTR value, None if it has none (or its file system keeps
    no user attributes: then it is a trailer-layout file)."""
    try:
        return os.getxattr(fd, XATTR)
    except OSError as e:
        if e.errno in _ATTR_ABSENT:
            return None
        raise


def _decode(trailer: bytes, tcrc: int, path: str, where: str
            ) -> tuple[int, int, int, int, bytes, dict[str, Any]]:
    """(version, size, crc, flags, key, meta) of a trailer whose checksum
    should be tcrc; CorruptSlot says what does not check out."""
    if _native.crc32c(trailer) != tcrc:
        raise CorruptSlot(f"{path}: {where} checksum mismatch")
    version, size, crc, flags, klen, mlen = _FIXED.unpack_from(trailer)
    if _FIXED.size + klen + mlen != len(trailer):
        raise CorruptSlot(f"{path}: {where} lengths disagree")
    key = trailer[_FIXED.size:_FIXED.size + klen]
    try:
        meta = json.loads(trailer[_FIXED.size + klen:])
    except ValueError as e:
        raise CorruptSlot(f"{path}: bad metadata: {e}") from None
    return version, size, crc, flags, key, meta


def read_trailer(fd: int, path: str) -> SSDEntry:
    """Parse and check a slot file's trailer, from its XATTR attribute (a
    payload-only file) or, without one, from its footer (not the payload)."""
    st = os.fstat(fd)
    total = st.st_size
    attr = _slot_attr(fd)
    if attr is not None:
        if len(attr) < _FOOTER.size + _FIXED.size:
            raise CorruptSlot(f"{path}: its {XATTR} attribute is too short ({len(attr)} bytes)")
        tlen, tcrc, magic = _FOOTER.unpack_from(attr, len(attr) - _FOOTER.size)
        if magic != MAGIC or tlen != len(attr) - _FOOTER.size:
            raise CorruptSlot(f"{path}: its {XATTR} attribute is not a slot trailer")
        version, size, crc, flags, key, meta = _decode(
            attr[:tlen], tcrc, path, f"{XATTR} attribute's trailer")
        if not flags & FLAG_BARE:
            raise CorruptSlot(f"{path}: its {XATTR} attribute is not marked payload-only")
        if size != total:
            kind = TornSlot if total < size else CorruptSlot
            raise kind(f"{path}: sizes disagree (payload {size}, file {total}: "
                       f"truncated or extended)")
        return SSDEntry(key, version, size, crc, path, size + len(attr), meta,
                        ino=st.st_ino, bare=True)
    if total < _FOOTER.size:
        raise TornSlot(f"{path}: {total} bytes, shorter than a footer "
                       f"(and no {XATTR} attribute)")
    tlen, tcrc, magic = _FOOTER.unpack(os.pread(fd, _FOOTER.size, total - _FOOTER.size))
    if magic != MAGIC:
        # (a footer one byte of which is wrong is damage; a file that ends in
        # anything else stops before its footer)
        kind = CorruptSlot if _near(magic, MAGIC) else TornSlot
        raise kind(f"{path}: no footer magic and no {XATTR} attribute "
                   f"(truncated, attribute lost, or not a slot file)")
    if tlen < _FIXED.size or tlen > MAX_TRAILER or tlen > total - _FOOTER.size:
        raise CorruptSlot(f"{path}: trailer length {tlen} does not fit the file")
    start = total - _FOOTER.size - tlen
    trailer = os.pread(fd, tlen, start)
    if len(trailer) != tlen:
        raise CorruptSlot(f"{path}: trailer checksum mismatch (short read)")
    version, size, crc, flags, key, meta = _decode(trailer, tcrc, path, "trailer")
    if size != start:
        raise CorruptSlot(f"{path}: sizes disagree (payload {size}, file {total})")
    if flags & FLAG_BARE:
        raise CorruptSlot(f"{path}: a payload-only file's trailer after a payload")
    return SSDEntry(key, version, size, crc, path, total, meta, ino=st.st_ino)


def _near(a: bytes, b: bytes) -> bool:
    """a differs from b in at most one byte (damage, not another file's end)."""
    return len(a) == len(b) and sum(x != y for x, y in zip(a, b)) <= 1


def open_entry(entry: "SSDEntry") -> int:
    """A read-only descriptor of entry's own file (close-on-exec): StaleEntry
    if the path holds another inode now or nothing (replaced, removed or
    renamed away since the entry was looked up)."""
    try:
        fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise StaleEntry(f"{entry.path}: gone") from None
    if entry.ino and os.fstat(fd).st_ino != entry.ino:
        os.close(fd)
        raise StaleEntry(f"{entry.path}: replaced by another version")
    return fd


@dataclass(frozen=True)
class SSDStats(Record):
    """The SSD tier (with -o ssd=)."""
    ssd_slots: int = gauge("slots on the SSD tier")
    ssd_bytes: int = gauge("bytes of the slots on the SSD tier")
    ssd_capacity: int = gauge("setting: bytes the SSD tier may hold")
    ssd_corrupt: int = counter("slot files that failed their checks (set aside in corrupt/)")
    ssd_writes: int = counter("slot files written")
    ssd_writes_unsynced: int = counter("of those, written back without an fsync (no one had "
                                       "acknowledged the version; fsync'd by the next sync)")
    ssd_write_bytes: int = counter("bytes written to slot files (their holes not; "
                                   "copies for renames and metadata changes included) "
                                   "and extent logs")
    ssd_write_errors: int = counter("slot file writes that failed")
    ssd_reads: int = counter("slot files read back into memory")
    ssd_read_bytes: int = counter("bytes read back from slot files")
    ssd_evictions: int = counter("slot files evicted to keep within ssd_capacity (policy order)")
    ssd_policy_probation: int = gauge("SSD tier, lru_lfu: slots in probation")
    ssd_policy_protected: int = gauge("SSD tier, lru_lfu: slots in protected")
    ssd_packed: int = gauge("of ssd_slots, small ones packed in segment files")
    ssd_segments: int = gauge("segment files (small slots packed, docs/ssd-format.md)")
    ssd_segment_bytes: int = gauge("bytes of the segment files, dead records included")
    ssd_tombstones: int = counter("tombstone records written (removals of packed slots)")
    ssd_compactions: int = counter("segment files compacted away")
    ssd_log_appends: int = counter("write-backs appended to a slot's extent log (the changed "
                                   "extents only) instead of a whole slot file")
    ssd_log_bytes: int = gauge("bytes of the slots' extent logs (within ssd_bytes)")
    ssd_logs: int = gauge("slots whose file has an extent log")
    ssd_folds: int = counter("extent logs folded: the slot written whole, the log removed")


class SSDTier:
    """Slots as files under `root`.  Thread-safe: one lock guards the index;
    file I/O runs outside it, and one writer lock orders the writes."""

    def __init__(self, root: str, capacity: int = 0) -> None:
        self.root = os.path.abspath(root)
        self.capacity = capacity                # bytes; 0 = the disk's free space
        self.write_bare: Optional[bool] = None  # new files payload-only: a mount sets
                                                # it (with passthrough, whose readers
                                                # read the file itself); None: WRITE_BARE
        self.slots_dir = os.path.join(self.root, "slots")
        self.corrupt_dir = os.path.join(self.root, "corrupt")
        # every agent's keys, owners and data are here: the daemon's user alone
        # reads it (a folder an older memosfs made 0755 is tightened now)
        # (a folder made is fsync'd into its parent: a slot made durable in
        # it must not lose the folder's name to a power loss)
        if private_makedirs(self.root):
            _fsync_dir(os.path.dirname(self.root))
        self.tightened = tighten_tree(self.root, "ssd directory")
        if private_dir(self.slots_dir):
            _fsync_dir(self.root)
        self.index: dict[bytes, SSDEntry] = {}
        self.lock = threading.RLock()           # guards index and counters
        # one writer at a time; reentrant, so that the store can hold it
        # across a rename of both tiers
        self.write_lock = threading.RLock()
        self._seq = itertools.count()
        self.used_bytes = 0                     # file bytes of indexed slots
        self.corrupt = 0                        # files found bad
        self.writes = 0                         # versions written
        self.unsynced_writes = 0                # of those, without an fsync
        self._unsynced: dict[bytes, SSDEntry] = {}   # written without an fsync (lock)
        self.write_bytes = 0                    # payload bytes written
        self.write_errors = 0                   # writes that failed (ENOSPC, EIO)
        self.reads = 0                          # versions read back
        self.read_bytes = 0
        self._dirty_dirs: set[str] = set()      # folders with renames not yet fsync'd
        self.policy = SSDPolicy()               # eviction order (ssdpolicy.py; lock)
        self.evictions = 0                      # versions evicted for ssd_capacity
        # what stops writes now, in words (`disk_trouble`): the disk is full, or
        # ssd_capacity is reached and may not be made room in; None once a
        # write succeeds or a file goes
        self.trouble: Optional[str] = None
        self._policy_saved = -POLICY_SAVE_S     # monotonic time of the last policy.json
        # fault hooks for tests, by point name ("renamed": a file was renamed
        # into place, under `lock`, before the index learns it); empty in use
        self.hooks: dict[str, Any] = {}
        self.segs = _segments.SegmentStore(self)    # small slots, packed (segments.py)
        # the folder's file system keeps the XATTR attribute (False after it
        # said it keeps no user attributes: every file gets the trailer layout)
        self._attrs_ok = True
        self._attr_refusals: set[int] = set()   # errnos logged (once each)
        # open_backing: files whose payload was checked, by (st_dev, st_ino,
        # version, size, mtime_ns, crc), least recent first (lock)
        self._verified: OrderedDict[tuple[int, ...], None] = OrderedDict()
        self.log_appends = 0                    # records appended to extent logs
        self.folds = 0                          # extent logs folded away

    # ---- mount ----

    def scan(self) -> list[SSDEntry]:
        """Rebuild the index from the files; returns the entries found."""
        found: dict[bytes, SSDEntry] = {}
        logs: list[str] = []                    # extent logs, read after their slot files
        # What a daemon killed before us left in the page cache (records,
        # tombstones, renames, files it had not fsync'd) is made durable
        # before the scan acts on it: a losing file removed, a rename
        # completed, a torn tail cut must not be undone by a power loss
        # that takes back what they assumed.
        _syncfs(self.root)
        # RUNNING there: the daemon before us died without its clean
        # unmount, so a write-back of it nobody acknowledged (never fsync'd)
        # may have been torn by a power loss since
        after_crash = os.path.exists(os.path.join(self.root, RUNNING))
        for name in os.listdir(self.root):
            if name.endswith(".tmp"):           # a metadata file a crash cut short
                _discard(os.path.join(self.root, name))
        for shard in sorted(os.listdir(self.slots_dir)):
            sdir = os.path.join(self.slots_dir, shard)
            if not os.path.isdir(sdir):
                continue
            for name in os.listdir(sdir):
                path = os.path.join(sdir, name)
                if name.startswith("."):
                    os.unlink(path)                 # a write a crash cut short
                    continue
                if name.endswith(".log"):
                    logs.append(path)
                    continue
                try:
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        if os.fstat(fd).st_size == 0 and _empty_left(fd):
                            # a write-back a power loss took before any of
                            # its bytes reached the disk (never fsync'd:
                            # nobody had acknowledged it): nothing to set aside
                            log.info("ssd: %s: an empty slot file (a write-back a power "
                                     "loss cut off before its bytes were on the disk); "
                                     "removed", path)
                            os.unlink(path)
                            self._dirty_dirs.add(sdir)
                            continue
                        entry = read_trailer(fd, path)
                    finally:
                        os.close(fd)
                    if _name_of(entry.key) + ".slot" != name:
                        raise CorruptSlot(f"{path}: holds key {entry.key!r} of another name")
                except TornSlot as e:
                    if not after_crash:
                        self._set_aside(path, str(e))
                        continue
                    # A file is fsync'd before its rename when its version was
                    # acknowledged or it replaces one that may be durable, so
                    # one a power loss cut short held neither: no corruption
                    # (as an empty one), but its bytes are kept
                    log.warning("ssd: %s (after a daemon that did not unmount cleanly: a "
                                "write-back a power loss cut short before all its bytes "
                                "were on the disk, never acknowledged); set aside as "
                                "%s.torn, not counted as corrupt", e, name)
                    self._move_aside(path, name + ".torn")
                    self._dirty_dirs.add(sdir)
                    continue
                except CorruptSlot as e:
                    self._set_aside(path, str(e))
                    continue
                except OSError as e:
                    log.error("ssd: cannot read %s: %s", path, e)
                    continue
                entry.fseq = _int(entry.meta.get("seq", 0))
                found[entry.key] = entry
        with_log = self._attach_logs(found, logs)
        self.segs.scan(found)                   # packed slots; newest of each key wins
        self._complete_renames(found)
        for entry in with_log:                  # a slot file a record replaced: its log too
            if found.get(entry.key) is not entry:
                _discard(entry.log.path)
        with self.lock:
            self.index = found
            self.used_bytes = sum(e.file_bytes for e in found.values())
            # until restore_policy: oldest file first
            self.policy.reset(sorted(found, key=lambda k: _mtime(found[k].path)))
        if not after_crash:
            self._mark_running()
        return list(found.values())

    def _mark_running(self) -> None:
        """RUNNING made durable before this daemon writes anything back (a
        power loss from now on finds it: `scan`)."""
        path = os.path.join(self.root, RUNNING)
        try:
            fd = open_private(path, os.O_WRONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            _fsync_dir(self.root)
        except OSError as e:
            log.warning("ssd: cannot make %s (%s): a slot file a power loss cuts short "
                        "will be called corrupt at the next mount", path, e)

    def closed_clean(self) -> None:
        """At a clean unmount, once every slot is saved: every file this daemon
        wrote is fsync'd, then RUNNING goes (the next mount calls any slot file
        that stops short corrupt).  A failure is logged (RUNNING stays)."""
        path = os.path.join(self.root, RUNNING)
        try:
            self.sync()
            os.unlink(path)
            _fsync_dir(self.root)
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("ssd: cannot end the mount cleanly in %s (%s): the next mount "
                        "takes a slot file that stops short for a power loss's", path, e)

    def _complete_renames(self, found: dict[bytes, SSDEntry]) -> None:
        """A rename moves a slot by copying its file under the new key's name
        (marked `moved_from`: the old file's key, seq, inode and ctime), then
        unlinking the old file.  A crash between the two leaves both; the old
        file, still the very one the copy came from (the seq of its trailer, or
        for a file without one the same inode and ctime: not a later slot of
        that name), goes now, so the slot has exactly one
        name, as rename(2) leaves it."""
        for entry in list(found.values()):
            mark = entry.meta.get("moved_from")
            if not isinstance(mark, dict):
                continue
            try:
                src = found.get(bytes.fromhex(str(mark.get("key", ""))))
            except ValueError:
                continue
            if src is None or src is entry or isinstance(src, _segments.PackedEntry):
                continue
            if mark.get("seq") and src.fseq:
                # (the old file's own seq: its inode and ctime may not be what
                # they were once a power loss took a change of them back)
                if _int(mark["seq"]) != src.fseq:
                    continue
            else:
                try:
                    st = os.stat(src.path)
                except OSError:
                    continue
                if (st.st_ino, st.st_ctime_ns) != (mark.get("ino"), mark.get("ctime_ns")):
                    continue
            log.info("ssd: completing a rename a crash interrupted: %r -> %r",
                     src.key, entry.key)
            try:
                os.unlink(src.path)
            except OSError as e:
                log.error("ssd: cannot remove %s (%s)", src.path, e)
                continue
            if src.log is not None:
                _discard(src.log.path)
            del found[src.key]
            self._dirty_dirs.add(os.path.dirname(src.path))

    def _attach_logs(self, found: dict[bytes, SSDEntry], logs: list[str]) -> list[SSDEntry]:
        """At mount: each extent log with its slot file (found entries change
        to the version the log's records make); a log without its slot file,
        or an old one (its records name another base file or version: a crash
        between a fold's rename and the log's unlink), is removed; a torn tail
        (an append a crash cut short) is cut off; a record that fails its
        checks is copied into corrupt/ (ssd_corrupt) and cut off with all that
        follows, so the slot is the version before it.  Returns the entries
        with a log."""
        by_path = {e.path: e for e in found.values()}
        out = []
        for lpath in logs:
            base = by_path.get(lpath[:-4] + ".slot")
            if base is None or not base.fseq:
                log.info("ssd: %s: an extent log without its slot file; removed", lpath)
                _discard(lpath)
                self._dirty_dirs.add(os.path.dirname(lpath))
                continue
            try:
                entry = self._read_log(base, lpath)
            except OSError as e:
                log.error("ssd: cannot read %s (%s); the slot is its file alone", lpath, e)
                continue
            if entry is not base:
                found[entry.key] = entry
                out.append(entry)
        return out

    def _read_log(self, base: SSDEntry, lpath: str) -> SSDEntry:
        """base's entry with the records of its log (see _attach_logs)."""
        fd = os.open(lpath, os.O_RDWR | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            with os.fdopen(os.dup(fd), "rb") as f:
                buf = f.read()
            recs, end, bad = _extentlog.scan_log(buf, base.fseq,
                                                 (base.version, base.size, base.crc))
            if recs is None:
                log.info("ssd: %s: an old extent log (its records are not of the slot "
                         "file beside it: a fold a crash interrupted); removed", lpath)
                recs, end = [], 0
            elif bad is not None and bad.torn:
                log.info("ssd: %s: %d bytes at its end are not a whole record (an append "
                         "a crash cut short): %s; cut off", lpath, len(buf) - end, bad)
            elif bad is not None:
                self._set_aside_bytes(f"{os.path.basename(lpath)}@{end}", buf[end:],
                                      f"{lpath}@{end}: {bad} (the slot is the version "
                                      f"before it)")
            if not recs:
                _discard(lpath)
                self._dirty_dirs.add(os.path.dirname(lpath))
                return base
            if end < len(buf):
                os.ftruncate(fd, end)
        finally:
            os.close(fd)
        last = recs[-1]
        meta = dict(last.meta)
        slog = _extentlog.SlotLog(lpath, st.st_ino, end, (base.version, base.size, base.crc),
                                  base.fseq, base.file_bytes, base.bare, tuple(recs))
        return SSDEntry(base.key, last.version, last.size, last.crc, base.path,
                        base.file_bytes + end, meta, ino=base.ino, bare=base.bare,
                        fseq=base.fseq, log=slog)

    def _set_aside_bytes(self, name: str, data: bytes, why: str) -> None:
        """Copy bytes that failed their checks into corrupt/name (counted once:
        a copy already there is not counted again)."""
        dest = os.path.join(self.corrupt_dir, name)
        log.error("ssd: corrupt bytes set aside: %s", why)
        if os.path.exists(dest):
            return
        with self.lock:
            self.corrupt += 1
        try:
            private_dir(self.corrupt_dir)
            with open(open_private(dest, os.O_WRONLY | os.O_EXCL), "wb") as f:
                f.write(data)
        except OSError as e:
            log.error("ssd: cannot copy them into %s (%s)", dest, e)

    def _set_aside(self, path: str, why: str) -> None:
        """Move a file that failed its checks into corrupt/ (counted once per
        file: callers make sure it is the file that failed)."""
        with self.lock:
            self.corrupt += 1
        log.error("ssd: corrupt slot file set aside: %s", why)
        self._move_aside(path, os.path.basename(path))

    def _move_aside(self, path: str, name: str) -> None:
        """Move a file into corrupt/name (removed if it cannot be moved)."""
        try:
            private_dir(self.corrupt_dir)
            os.replace(path, os.path.join(self.corrupt_dir, name))
        except OSError as e:
            log.error("ssd: cannot move %s aside (%s); removing it", path, e)
            try:
                os.unlink(path)
            except OSError:
                pass

    # ---- the tier interface ----

    def get(self, key: bytes) -> Optional[SSDEntry]:
        with self.lock:
            return self.index.get(key)

    def keys(self) -> list[bytes]:
        with self.lock:
            return list(self.index)

    def entries(self) -> list[SSDEntry]:
        with self.lock:
            return list(self.index.values())

    def __contains__(self, key: bytes) -> bool:
        with self.lock:
            return key in self.index

    def put(self, ref: "_native.Ref", meta: dict[str, Any], durable: bool) -> Optional[SSDEntry]:
        """Write the version `ref` pins; returns its entry, or None when that
        version no longer needs writing (replaced, renamed or removed
        meanwhile: a stale write must never cover a newer version or bring
        back a removed or renamed slot).  OSError (ENOSPC, EIO) leaves the
        previous version in place and the index unchanged."""
        key = ref.key
        # (a version that will be a log record gets its checksum from the
        # record's runs alone, under the lock; any other is read whole
        # before it, as the lock is for the file operations)
        crc: Optional[int] = None
        if self._log_plan(ref, self.get(key)) is None:
            crc = ref.crc32c()
        self._check_room(key, ref.size + _trailer_bound(key, meta))
        with self.write_lock:
            # checked under the writer lock, which remove() and rename() take too
            current = self.get(key)
            if not ref.live or ref.key != key \
                    or (current is not None and current.version > ref.version):
                return None
            plan = self._log_plan(ref, current)
            if plan is not None:
                assert current is not None
                if crc is None:
                    crc = self._crc_after(current, ref, *plan)
                if crc is None:
                    crc = ref.crc32c()
                return self._append_locked(ref, current, meta, durable, crc, *plan)
            return self._write_locked(ref, key, meta, durable, crc)

    def _crc_after(self, current: SSDEntry, ref: Any, cut: int,
                   runs: list[tuple[int, int]]) -> Optional[int]:
        """ref's crc32c from current's (the version it changes, in its slot
        file) and the record's runs (extentlog.crc_after_runs), reading only
        the runs' bytes of both; None where a cut into current or a file
        that cannot be opened leaves reading ref whole."""
        if cut < current.size:
            return None
        try:
            ext, fds = entry_view(current)
        except (OSError, StaleEntry, CorruptSlot):
            return None
        try:
            def new(o: int, n: int) -> bytes:
                got = ref.read(o, n)
                if len(got) != n:
                    raise OSError(errno.EIO, f"short read of {ref.key!r}")
                return got

            return _extentlog.crc_after_runs(
                current.crc, current.size, ref.size, runs,
                lambda o, n: _extentlog.read_view(ext, fds, o, n), new)
        finally:
            for fd in fds.values():
                os.close(fd)

    # ---- extent logs (memosfs/store/extentlog.py) ----

    def _log_plan(self, ref: "_native.Ref", current: Optional[SSDEntry]
                  ) -> Optional[tuple[int, list[tuple[int, int]]]]:
        """(cut, runs) when ref's version is best written back as a record
        appended to current's extent log: the C core knows how it differs
        from the version the tier holds (Ref.changes), that version is a slot
        file of this daemon's (not packed, its seq known), the new version is
        not packed either, and the changed bytes and the log stay small
        (extentlog.LOG_*).  None: write it whole (folding a log away)."""
        changes = getattr(ref, "changes", None)
        if changes is None or current is None or isinstance(current, _segments.PackedEntry) \
                or not current.fseq or self.segs.packs(ref.size):
            return None
        ch = changes()
        if ch is None:
            return None
        base_version, base_size, cut, runs = ch
        if (current.version, current.size) != (base_version, base_size):
            return None
        runs = [(int(o), int(n)) for o, n in runs if n > 0]
        changed = sum(n for _o, n in runs)
        if changed > ref.size * _extentlog.LOG_RUN_SHARE:
            return None
        lg = current.log
        grown = (lg.length if lg else _extentlog.LOG_HEAD) + _extentlog.REC_HEAD \
            + 16 * len(runs) + changed
        if (lg is not None and len(lg.records) >= _extentlog.LOG_MAX_RECORDS) \
                or grown > ref.size * _extentlog.LOG_FOLD_SHARE:
            return None
        return cut, runs

    def _append_locked(self, ref: Any, current: SSDEntry, meta: dict[str, Any],
                       durable: bool, crc: int, cut: int, runs: list[tuple[int, int]],
                       payload: Optional[bytes] = None) -> SSDEntry:
        """Append a record making ref's version (ref.version, ref.size, crc:
        current's bytes cut to `cut`, zeros to ref.size, then `runs` of ref)
        to current's extent log, creating the log if current has none
        (writer lock held).  The slot file is not touched: a crash leaves the
        log ending before the record, or inside it (cut off at mount), so the
        key has current's version or the new one.  durable: the log (and the
        slot file, if it may not be yet) fsync'd before this returns."""
        key = current.key
        if payload is None:
            payload = b"".join(ref.read(o, n) for o, n in runs)
        if len(payload) != sum(n for _o, n in runs):
            raise OSError(errno.EIO, f"short read of {key!r}")
        stamped = self.segs.stamp(meta)
        lg = current.log
        rec = _extentlog.encode(current.fseq, (current.version, current.size, current.crc),
                                ref.version, ref.size, crc, cut, runs, payload, stamped)
        fresh = lg is None
        lpath = _extentlog.log_path_of(current.path)
        start = lg.length if lg else 0
        data = (_extentlog.header() if fresh else b"") + rec
        self._check_room(key, current.file_bytes + len(data))
        sdir = os.path.dirname(current.path)
        try:
            if fresh:
                _discard(lpath)                 # (a leftover no entry names)
                fd = open_private(lpath, os.O_WRONLY | os.O_EXCL)
            else:
                fd = os.open(lpath, os.O_WRONLY | os.O_CLOEXEC)
            try:
                if not fresh and os.fstat(fd).st_ino != lg.ino:
                    raise OSError(errno.ESTALE, f"{lpath}: not the log the index names")
                try:
                    _pwrite_all(fd, data, start)
                    self._hook("appended")
                    if durable:
                        os.fsync(fd)
                        if current.synced is not True:
                            self._fsync_path(current.path)
                except BaseException:
                    try:                        # take the append back
                        if fresh:
                            _discard(lpath)
                        else:
                            os.ftruncate(fd, start)
                    except OSError as e:
                        log.error("ssd: cannot take back a failed append to %s (%s)",
                                  lpath, e)
                    raise
                ino = os.fstat(fd).st_ino
            finally:
                os.close(fd)
        except OSError as e:
            self._write_failed(e)
        self.trouble = None
        off = start + (_extentlog.LOG_HEAD if fresh else 0)
        r = _extentlog.parse(rec, 0, check_payload=False)
        r = dataclasses.replace(r, off=off, data_off=off + r.data_off)
        slog = _extentlog.SlotLog(
            lpath, ino, off + len(rec),
            lg.base if lg else (current.version, current.size, current.crc), current.fseq,
            lg.base_bytes if lg else current.file_bytes, current.bare,
            (lg.records if lg else ()) + (r,))
        synced = durable
        entry = SSDEntry(key, ref.version, ref.size, crc, current.path,
                         current.file_bytes + len(data), dict(meta), synced=synced,
                         ino=current.ino, bare=current.bare, fseq=current.fseq, log=slog)
        with self.lock:
            self.index[key] = entry
            self.used_bytes += len(data)
            self.policy.written(key)
            self.writes += 1
            self.write_bytes += len(data)
            self.log_appends += 1
            if synced:
                self._unsynced.pop(key, None)
            else:
                self._unsynced[key] = entry
                self.unsynced_writes += 1
        if fresh:
            if durable:
                _fsync_dir(sdir)
            else:
                with self.lock:
                    self._dirty_dirs.add(sdir)
        return entry

    def _write_failed(self, e: OSError) -> NoReturn:
        """A write of a version failed with e (its files already taken
        back): counted, and raised again in words a user knows (a full disk,
        not the failing call's name, "write_to_fd"), noted as the tier's
        trouble; an OSError without an errno as it was."""
        with self.lock:
            self.write_errors += 1
        if e.errno is None:
            raise e
        said = self.disk_trouble(e.errno)
        self.trouble = said
        raise OSError(e.errno, said) from e

    def _fsync_path(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _materialize(self, entry: SSDEntry, src: int, dst: int) -> None:
        """entry's version into dst at offset 0 (holes kept), from its slot
        file (src) and its extent log; dst is entry.size long afterwards."""
        lg = entry.log
        if lg is None:
            _copy_sparse(src, dst, entry.size)
            return
        lfd = _open_log(lg)
        try:
            for s, e, where, so in lg.extents():
                if where != _extentlog.ZERO:
                    _copy_between(src if where == _extentlog.BASE else lfd, dst, so, s, e - s)
        finally:
            os.close(lfd)
        os.ftruncate(dst, entry.size)

    def _write_locked(self, ref: "_native.Ref", key: bytes, meta: dict[str, Any],
                      durable: bool, crc: Optional[int] = None) -> SSDEntry:
        """Write ref's bytes as `key`'s version, atomically replacing the file
        key had (writer lock held)."""
        size = ref.size
        if crc is None:
            crc = ref.crc32c()
        if self.segs.packs(size):
            return self.segs.put(ref, key, meta, durable, crc)
        # (its seq orders it with packed records: segments.py)
        stamped = self.segs.stamp(meta)
        sdir, final = self._path_of(key)
        self._shard_dir(sdir)
        tmp = self._tmp_path(sdir, key)
        # The file is fsync'd before its rename when the caller needs it
        # durable, or when it replaces a version that may be (an
        # acknowledged version is never replaced by bytes a power loss could
        # take).  Otherwise (write-back of a version nobody acknowledged:
        # eviction, the background writer, with no durable file under the
        # name) the kernel writes it back in its own time, and `sync` or
        # `sync_key` fsyncs it when it must be durable; a power loss before
        # then can leave it torn, which its crc32c tells at load (a version
        # nobody acknowledged may be lost, never served torn).
        with self.lock:
            old = self.index.get(key)
        sync_now = durable or (old is not None and old.maybe_durable)
        try:
            fd = open_private(tmp, os.O_WRONLY | os.O_EXCL)
            try:
                data_bytes = 0
                if size:
                    written = ref.write_to_fd(fd, sparse=True)   # holes stay holes
                    if written != size:
                        raise OSError(errno.EIO, f"short write ({written} of {size})")
                    # what was written: the payload's bytes, its holes not
                    data_bytes = min(size, os.fstat(fd).st_blocks * 512)
                total, bare = self._finish_file(fd, key, ref.version, size, crc, stamped)
                if sync_now:
                    os.fsync(fd)
                ino = os.fstat(fd).st_ino
            finally:
                os.close(fd)
            entry = SSDEntry(key, ref.version, size, crc, final, total, dict(meta),
                             synced=sync_now, ino=ino, bare=bare, fseq=stamped["seq"])
            with self.lock:
                # the file and the index entry change together (see the
                # module docstring: a reader never pairs one with the other's)
                os.rename(tmp, final)
                self._hook("renamed")
                old = self.index.get(key)
                self.used_bytes += total - (old.file_bytes if old else 0)
                self.index[key] = entry
                self.policy.written(key)
                self.writes += 1
                self.write_bytes += data_bytes
                if sync_now:
                    self._unsynced.pop(key, None)
                else:
                    self._unsynced[key] = entry
                    self.unsynced_writes += 1
        except OSError as e:
            _discard(tmp)
            self._write_failed(e)
        self.trouble = None
        if old is not None and old.log is not None:
            self._fold_done(old.log.path, sdir)
        elif durable:
            _fsync_dir(sdir)
        else:
            with self.lock:
                self._dirty_dirs.add(sdir)
        return entry

    def _fold_done(self, lpath: str, sdir: str) -> None:
        """A fold renamed the whole version over the base of the log at
        lpath: the folder is fsync'd (the rename durable) before the log
        goes, since the base without its log is an older version.  A crash
        before the unlink leaves an old log, removed at mount."""
        self._hook("folded")
        _fsync_dir(sdir)
        _discard(lpath)
        with self.lock:
            self.folds += 1
            self._dirty_dirs.add(sdir)

    def put_file(self, key: bytes, fd: int, path: str, size: int, meta: dict[str, Any],
                 version: int, durable: bool, crc: int) -> SSDEntry:
        """Make the file at `path`, open at `fd` and holding bytes [0, size)
        (a spilled draft: memosfs/store/spill.py), key's version `version`
        without copying it: finished as _write_locked finishes its temporary
        file (`_finish_file`), fsync'd under the same rule, renamed into the
        slot's place (same file system) with the index, used bytes, policy
        and unsynced bookkeeping of _write_locked.  Below ssd_pack_below it
        is appended as a packed record instead (the file stays at `path`
        for the caller to remove).  SSDFull when ssd_capacity has no room
        for it (the caller makes room or refuses); other OSErrors leave the
        file at `path` as it was (its bytes, no trailer), the previous
        version in place and the index unchanged."""
        self._check_room(key, size + _trailer_bound(key, meta))
        with self.write_lock:
            if self.segs.packs(size):
                return self.segs.put(_FileVersion(fd, size, version), key, meta, durable, crc)
            stamped = self.segs.stamp(meta)
            sdir, final = self._path_of(key)
            with self.lock:
                old = self.index.get(key)
            sync_now = durable or (old is not None and old.maybe_durable)
            try:
                self._shard_dir(sdir)
                try:
                    total, bare = self._finish_file(fd, key, version, size, crc, stamped)
                    if sync_now:
                        os.fsync(fd)
                    st = os.fstat(fd)
                    ino = st.st_ino
                    written = min(size, st.st_blocks * 512)     # (its holes: none)
                    entry = SSDEntry(key, version, size, crc, final, total, dict(meta),
                                     synced=sync_now, ino=ino, bare=bare,
                                     fseq=stamped["seq"])
                    with self.lock:
                        os.rename(path, final)
                        self._hook("renamed")
                        old = self.index.get(key)
                        self.used_bytes += total - (old.file_bytes if old else 0)
                        self.index[key] = entry
                        self.policy.written(key)
                        self.writes += 1
                        self.write_bytes += written
                        if sync_now:
                            self._unsynced.pop(key, None)
                        else:
                            self._unsynced[key] = entry
                            self.unsynced_writes += 1
                except BaseException:
                    # the draft goes on as it was: its bytes alone
                    try:
                        os.ftruncate(fd, size)
                        os.removexattr(fd, XATTR)
                    except OSError:
                        pass
                    raise
            except OSError as e:
                self._write_failed(e)
            self.trouble = None
            if old is not None and old.log is not None:
                # the log of the version this replaces (_fold_done; not
                # counted as a fold)
                _fsync_dir(sdir)
                _discard(old.log.path)
                with self.lock:
                    self._dirty_dirs.add(sdir)
            elif durable:
                _fsync_dir(sdir)
            else:
                with self.lock:
                    self._dirty_dirs.add(sdir)
            return entry

    def put_overlay(self, key: bytes, sp: "_spill.SpillDraft", meta: dict[str, Any],
                    version: int, crc: int) -> Optional[SSDEntry]:
        """An overlay draft (spill.py) published as key's version `version`
        by one record appended to the slot's extent log: its base cut to
        sp.cut, zeros to sp.size, then sp.runs() (the bytes written since),
        like a write-back of a version whose changes the C core knows
        (_log_plan's limits; its payload read into memory, so at most
        OVERLAY_PAYLOAD_MAX).  None when it is not: the base is no longer
        key's version here, or the runs or the log are too large (the
        caller then publishes the draft whole).  SSDFull as put_file."""
        with self.write_lock:
            current = self.get(key)
            size = sp.size
            if current is None or isinstance(current, _segments.PackedEntry) \
                    or not current.fseq or self.segs.packs(size) \
                    or sp.base_ident != (current.fseq, current.version, current.size,
                                         current.crc):
                return None
            runs = sp.runs()
            changed = sum(n for _o, n in runs)
            if changed > size * _extentlog.LOG_RUN_SHARE or changed > OVERLAY_PAYLOAD_MAX:
                return None
            lg = current.log
            grown = (lg.length if lg else _extentlog.LOG_HEAD) + _extentlog.REC_HEAD \
                + 16 * len(runs) + changed
            if (lg is not None and len(lg.records) >= _extentlog.LOG_MAX_RECORDS) \
                    or grown > size * _extentlog.LOG_FOLD_SHARE:
                return None
            payload = b"".join(sp.read(o, n) for o, n in runs)
            entry = self._append_locked(_Made(key, version, size), current, meta, False, crc,
                                        sp.cut, runs, payload)
            # the version is read from the slot's files from now on (its
            # spill file and its base's descriptors go: no chain of them)
            try:
                sp.adopt(entry_view(entry))
            except OSError as e:
                log.warning("ssd: %s: its new version is read from its spill file (%s)",
                            entry.path, e)
            return entry

    def _finish_file(self, fd: int, key: bytes, version: int, size: int, crc: int,
                     meta: dict[str, Any]) -> tuple[int, bool]:
        """Give a temporary slot file whose payload is written (bytes [0,
        size), holes allowed) its trailer: in its XATTR attribute, the file
        the payload alone, or where the file system refuses the attribute,
        after the payload (the trailer layout; logged once for each reason).
        Before the file's fsync and rename, so each version under the name is
        whole and self-describing.  Returns (file_bytes, bare)."""
        m = _meta_bytes(meta)
        if WRITE_BARE and self.write_bare is not False and self._attrs_ok:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)          # a payload that ends in a hole
            value = _encode(key, version, size, crc, m, FLAG_BARE)
            try:
                os.setxattr(fd, XATTR, value)
                return size + len(value), True
            except OSError as e:
                if e.errno not in _ATTR_REFUSED:
                    raise
                self._attr_refused(e.errno, len(value))
        trailer = _encode(key, version, size, crc, m, 0)
        _pwrite_all(fd, trailer, size)
        return size + len(trailer), False

    def _attr_refused(self, code: int, n: int) -> None:
        if code in (errno.ENOTSUP, errno.EOPNOTSUPP):
            self._attrs_ok = False              # no user attributes here: stop asking
        with self.lock:
            if code in self._attr_refusals:
                return
            self._attr_refusals.add(code)
        log.warning("ssd: the file system of %s refused a slot file's %s attribute (%s; "
                    "%d bytes%s): such files keep their trailer after the payload, as "
                    "older memosfs wrote them (readable, but not payload-only)",
                    self.root, XATTR, os.strerror(code), n,
                    "; no more attempts" if not self._attrs_ok else
                    "; a large metadata, as a slot's many xattrs make")

    def _hook(self, point: str) -> None:
        fn = self.hooks.get(point)
        if fn is not None:
            fn()

    def _path_of(self, key: bytes) -> tuple[str, str]:
        """(shard folder, file path) of key's slot file."""
        name = _name_of(key)
        sdir = os.path.join(self.slots_dir, name[:2])
        return sdir, os.path.join(sdir, name + ".slot")

    def _shard_dir(self, sdir: str) -> None:
        """Make a shard folder (0700) if missing, and slots/ too if it went;
        a folder made is fsync'd into its parent (once per folder)."""
        try:
            made = private_dir(sdir)
        except FileNotFoundError:
            if private_dir(self.slots_dir):
                _fsync_dir(self.root)
            made = private_dir(sdir)
        if made:
            _fsync_dir(self.slots_dir)

    def _tmp_path(self, sdir: str, key: bytes) -> str:
        return os.path.join(sdir, f".{_name_of(key)}.{os.getpid()}.{next(self._seq)}.tmp")

    def disk_trouble(self, code: int) -> str:
        """What an errno from writing a slot file means, in words a user knows."""
        where = f"({self.root})"
        if code == errno.ENOSPC:
            return f"the SSD directory's disk is full {where}"
        if code == errno.EDQUOT:
            return f"the SSD directory's disk quota is used up {where}"
        if code == errno.EROFS:
            return f"the SSD directory's file system is read-only {where}"
        if code == errno.EIO:
            return f"the SSD directory's disk failed a write (I/O error) {where}"
        return f"the SSD directory cannot be written: {os.strerror(code)} {where}"

    def _check_room(self, key: bytes, total: int) -> None:
        if not self.capacity:
            return
        with self.lock:
            old = self.index.get(key)
            after = self.used_bytes - (old.file_bytes if old else 0) + total
        if total > self.capacity:
            raise OSError(errno.ENOSPC, f"the slot ({total} bytes) is larger than the SSD "
                          f"tier's ssd_capacity ({self.capacity} bytes)")
        if after > self.capacity:
            raise SSDFull(after - self.capacity)

    def load_into(self, entry: SSDEntry, draft: "_native.Draft") -> None:
        """Read a version into a draft, checking its payload checksum.
        StaleEntry: the path holds another version now (look again);
        CorruptSlot: entry's own file does not check out (`report_corrupt`
        decides)."""
        if isinstance(entry, _segments.PackedEntry):
            return self.segs.load_into(entry, draft)
        fd = open_entry(entry)
        try:
            if os.fstat(fd).st_size != entry.file_size:
                raise CorruptSlot(f"{entry.path}: size changed on disk")
            if entry.log is not None:
                _load_logged(entry, fd, draft)
            elif entry.size:
                # MAP_POPULATE reads the file in with full readahead up front,
                # far faster than faulting it in page by page from a cold cache
                with mmap.mmap(fd, entry.size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                               prot=mmap.PROT_READ) as mm:
                    draft.write(0, mm)
        finally:
            os.close(fd)
        if draft.crc32c() != entry.crc:
            raise CorruptSlot(f"{entry.path}: payload checksum mismatch")
        with self.lock:
            self.reads += 1
            self.read_bytes += entry.size

    def prefetch(self, entry: SSDEntry) -> None:
        """Start reading a version in the background (warm-up reads ahead)."""
        if isinstance(entry, _segments.PackedEntry):
            return self.segs.prefetch(entry)
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        try:
            os.posix_fadvise(fd, 0, entry.file_size, os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        finally:
            os.close(fd)
        if entry.log is not None:
            try:
                lfd = os.open(entry.log.path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return
            try:
                os.posix_fadvise(lfd, 0, entry.log.length, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass
            finally:
                os.close(lfd)

    def open_backing(self, key: bytes) -> Optional[tuple[int, SSDEntry]]:
        """For the FUSE passthrough reader: (an O_RDONLY descriptor, the
        entry) of key's payload-only file — the very file the index names
        (same inode, as open_entry checks), whose payload checks out — or
        None: no such file (absent, a packed record, a trailer-layout file),
        or the file failed its check, which went through report_corrupt as
        a failed read does (set aside, counted in ssd_corrupt).  The caller
        closes the descriptor; it keeps reading this version whatever
        replaces the name later.  StaleEntry: the key's file was replaced
        under every look (a writer busy on it): read it the usual way.

        The payload is checked once per file and version in this daemon's
        life: the first open of a (st_dev, st_ino, version, size, mtime_ns,
        crc) reads the whole payload and checks its crc32c (the readahead it
        asks for leaves the pages in the page cache for the reader that
        follows); later opens of the same file do not read it (a cache of
        VERIFIED_FILES files, least recent first out).  The kernel reads
        the file directly afterwards, unchecked: docs/ssd-format.md."""
        for _ in range(3):
            entry = self.get(key)
            if entry is None or isinstance(entry, _segments.PackedEntry) or not entry.bare \
                    or entry.log is not None:   # (its file alone is an older version)
                return None
            try:
                fd = open_entry(entry)
            except StaleEntry:
                continue                        # a newer version's file: look again
            try:
                st = os.fstat(fd)
                if st.st_size != entry.size:
                    raise CorruptSlot(f"{entry.path}: size changed on disk")
                mark = (st.st_dev, st.st_ino, entry.version, entry.size, st.st_mtime_ns,
                        entry.crc)
                with self.lock:
                    known = mark in self._verified
                    if known:
                        self._verified.move_to_end(mark)
                if not known:
                    _verify_payload(fd, entry)
                    with self.lock:
                        self._verified[mark] = None
                        while len(self._verified) > VERIFIED_FILES:
                            self._verified.popitem(last=False)
                return fd, entry
            except CorruptSlot as e:
                os.close(fd)
                if self.report_corrupt(entry, str(e)):
                    return None                 # set aside: the key is gone from the tier
                continue                        # the index moved on, or a passing glitch
            except BaseException:
                os.close(fd)
                raise
        raise StaleEntry(f"{key!r}: its file kept being replaced while opened")

    def report_corrupt(self, entry: SSDEntry, why: str) -> bool:
        """A version failed its check when read.  Under the writer lock (no
        file can be renamed in or out meanwhile) and only while the index
        still points at `entry`: the file under its path is checked again,
        by its own trailer and payload; if it is entry's file and fails, the
        entry goes and the file is set aside (True).  Otherwise nothing is
        set aside (False): the index moved on (a newer version), or the path
        holds a valid file of this key, which the index then takes."""
        if isinstance(entry, _segments.PackedEntry):
            return self.segs.report_corrupt(entry, why)
        with self.write_lock:
            with self.lock:
                if self.index.get(entry.key) is not entry:
                    return False
            if entry.log is not None:
                return self._report_corrupt_logged(entry, why)
            try:
                fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                log.error("ssd: %s: the file of %r vanished (%s)", entry.path, entry.key, why)
                self._forget(entry)
                return False
            try:
                found: Optional[SSDEntry] = read_trailer(fd, entry.path)
                if found.key != entry.key:
                    raise CorruptSlot(f"{entry.path}: holds key {found.key!r}")
                if os.fstat(fd).st_ino == entry.ino and (found.version, found.crc) \
                        == (entry.version, entry.crc):
                    _check_payload(fd, found)
                    found = None            # entry's file, whole: a passing glitch
            except CorruptSlot as e:
                why = str(e)
                found = entry
            finally:
                os.close(fd)
            if found is None:
                log.warning("ssd: %s checks out when read again (%s before)",
                            entry.path, why)
                return False
            if found is not entry:
                # a valid file of this key the index had not learnt: take it
                with self.lock:
                    if self.index.get(entry.key) is entry:
                        self.index[entry.key] = found       # (synced: not known)
                        self.used_bytes += found.file_bytes - entry.file_bytes
                log.warning("ssd: %s holds version %d, not %d: the index follows the file",
                            entry.path, found.version, entry.version)
                return False
            self._forget(entry)
            self._set_aside(entry.path, why)
            return True

    def _report_corrupt_logged(self, entry: SSDEntry, why: str) -> bool:
        """report_corrupt of a version with an extent log (writer lock held,
        the index still points at entry): its slot file and log are read
        again, by the base's trailer, the records and the whole version's
        crc32c; if they fail, both are set aside."""
        try:
            try:
                fd = open_entry(entry)
            except StaleEntry:
                log.error("ssd: %s: the file of %r vanished (%s)", entry.path, entry.key, why)
                self._forget(entry)
                return False
            try:
                _check_logged(entry, fd)
            finally:
                os.close(fd)
            log.warning("ssd: %s checks out when read again (%s before)", entry.path, why)
            return False
        except (CorruptSlot, OSError) as e:
            why = str(e)
        self._forget(entry)
        self._set_aside(entry.path, why)
        try:
            os.replace(entry.log.path, os.path.join(self.corrupt_dir,
                                                    os.path.basename(entry.log.path)))
        except OSError:
            _discard(entry.log.path)
        return True

    def _forget(self, entry: SSDEntry) -> None:
        with self.lock:
            if self.index.get(entry.key) is not entry:
                return
            del self.index[entry.key]
            self.used_bytes -= entry.file_bytes
            self.policy.removed(entry.key)
            self._unsynced.pop(entry.key, None)
        # no older record comes back: the tombstone is durable before a slot
        # file that shadowed the record is set aside
        self.segs.forgotten(entry.key, durable=not isinstance(entry, _segments.PackedEntry))

    def remove(self, key: bytes, entry: Optional[SSDEntry] = None,
               evicted: bool = False) -> bool:
        """Forget key and unlink its file (durable at the next `sync`); with
        `entry`, only if that is still key's version (a newer one stays).
        evicted: it goes to make room (the policy remembers it in a ghost)."""
        with self.write_lock:               # orders it with put()'s check
            with self.lock:
                current = self.index.get(key)
                if current is None or (entry is not None and current is not entry):
                    return False
                del self.index[key]
                self.used_bytes -= current.file_bytes
                self.policy.removed(key, evicted=evicted)
                self.evictions += evicted
            # a tombstone if a segment holds a record of key; before a slot
            # file goes it is durable, or a power loss that keeps the unlink
            # and not the tombstone brings the older record back
            self.segs.forgotten(key, durable=not isinstance(current, _segments.PackedEntry))
            self._unlink_locked(current.path)
        self.trouble = None                 # (room came: the next write tells)
        return True

    def _unlink_locked(self, path: str) -> None:
        if self.segs.holds(path):
            return                              # a packed record's segment: not the slot's
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        finally:
            # its extent log, if any, after it (a crash between leaves a log
            # without its file: removed at mount)
            lpath = _extentlog.log_path_of(path) if path.endswith(".slot") else ""
            if lpath and os.path.lexists(lpath):
                _discard(lpath)
        with self.lock:
            self._dirty_dirs.add(os.path.dirname(path))

    def rename(self, old: bytes, new: bytes, meta: dict[str, Any],
               ref: Optional["_native.Ref"] = None) -> Optional[SSDEntry]:
        """Give old's stored version the key `new`, replacing new's: the file
        is copied under new's name (the key lives in the file) and renamed
        over new's file, new's folder is fsync'd, and only then does old's
        file go.  Without a stored version of old, `ref` (old's version in
        memory, if any) is written as new's when new has a file, so that
        new's file is replaced, never left holding the replaced version.
        Returns new's entry, or None if nothing was written (nothing stored
        for old; new's file, if any, is left alone).  OSError: nothing changed."""
        with self.write_lock:
            entry = self.get(old)
            if entry is None:
                if ref is None or self.get(new) is None:
                    return None
                # the version check does not apply: new's file is the
                # replaced slot's, whatever its version
                self._check_room(new, ref.size + _trailer_bound(new, meta))
                return self._write_locked(ref, new, meta, durable=False)
            if isinstance(entry, _segments.PackedEntry):
                return self.segs.rename(entry, old, new, meta)
            sdir, final = self._path_of(new)
            # the file under new's name says which file it was copied from: a
            # crash between its rename into place and the unlink of old's file
            # leaves both, and the next scan completes the rename (see scan)
            try:
                st = os.stat(entry.path)
                mark = {"key": old.hex(), "ino": st.st_ino, "ctime_ns": st.st_ctime_ns}
                if entry.fseq:
                    # the seq in the old file's trailer names that very file
                    # whatever a power loss does to its inode's times
                    mark["seq"] = entry.fseq
                meta = dict(meta, moved_from=mark)
            except FileNotFoundError:
                pass
            stamped = self.segs.stamp(meta)
            self._check_room(new, entry.size + _trailer_bound(new, stamped))
            self._shard_dir(sdir)
            tmp = self._tmp_path(sdir, new)
            try:
                src = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    dst = open_private(tmp, os.O_WRONLY | os.O_EXCL)
                    try:
                        if entry.log is not None:     # the log folded into the copy
                            self._materialize(entry, src, dst)
                        else:
                            _copy_range(src, dst, entry.size)
                        copied = min(entry.size, os.fstat(dst).st_blocks * 512)
                        total, bare = self._finish_file(dst, new, entry.version, entry.size,
                                                        entry.crc, stamped)
                        os.fsync(dst)
                        ino = os.fstat(dst).st_ino
                    finally:
                        os.close(dst)
                finally:
                    os.close(src)
                moved = SSDEntry(new, entry.version, entry.size, entry.crc, final, total,
                                 dict(meta), synced=True, ino=ino, bare=bare,
                                 fseq=stamped["seq"])
                with self.lock:
                    # the file and both index entries change together
                    os.rename(tmp, final)
                    self._hook("renamed")
                    self.write_bytes += copied
                    replaced = self.index.pop(new, None)
                    if replaced is not None:
                        self.used_bytes -= replaced.file_bytes
                        self._unsynced.pop(new, None)
                    self.index[new] = moved
                    self.used_bytes += total
                    if self.index.get(old) is entry:
                        del self.index[old]
                        self.used_bytes -= entry.file_bytes
                        self._unsynced.pop(old, None)
                        self.policy.renamed(old, new)
                    else:
                        self.policy.written(new)
                _fsync_dir(sdir)                # new's name is durable before old's goes
            except OSError:
                with self.lock:
                    self.write_errors += 1
                _discard(tmp)
                raise
            if replaced is not None and replaced.log is not None:
                # the replaced version's log, now that the rename over its
                # base is durable (a crash before: an old log, removed at mount)
                _discard(replaced.log.path)
                with self.lock:
                    self._dirty_dirs.add(sdir)
            # old's tombstone (if a segment holds a record of it) is durable
            # before old's file goes: the unlink kept and the tombstone lost
            # would bring that older record back under old's name
            self.segs.forgotten(old, durable=True)
            self._unlink_locked(entry.path)
            return moved

    def rewrite_meta(self, key: bytes, meta: dict[str, Any]) -> Optional[SSDEntry]:
        """Give key's stored version new metadata (owner, mode, times, xattrs
        changed while memory did not hold the slot): its payload is copied,
        holes kept, beside the new trailer into a temporary file renamed over
        the old one, as a write is, so a crash leaves the old metadata or the
        new.  Returns the new entry (the same entry when its metadata is
        already `meta`), None when the tier holds no version of key.
        OSError: nothing changed."""
        with self.write_lock:
            entry = self.get(key)
            if entry is None:
                return None
            if entry.meta == meta:
                return entry
            if isinstance(entry, _segments.PackedEntry):
                return self.segs.rewrite_meta(entry, meta)     # a packed slot: a new record
            lg = entry.log
            # a slot with a log: a record with no runs (the same version, the
            # new metadata) rather than a copy of the slot, unless the kernel
            # reads the files itself (passthrough: a slot with a log is not
            # handed to it, so the log is folded)
            if lg is not None and self.write_bare is not True \
                    and len(lg.records) < _extentlog.LOG_MAX_RECORDS:
                same = _SameVersion(entry)
                return self._append_locked(same, entry, meta, entry.synced is not False,
                                           entry.crc, entry.size, [], b"")
            # (a seq newer than any packed record of the key: segments.py)
            stamped = self.segs.stamp(meta)
            bound = entry.size + _trailer_bound(key, stamped)
            if bound > entry.file_bytes:
                self._check_room(key, bound)
            sdir, final = self._path_of(key)
            tmp = self._tmp_path(sdir, key)
            sync_now = entry.maybe_durable          # (as _write_locked decides)
            try:
                try:
                    src = open_entry(entry)
                except StaleEntry:
                    return None                 # set aside meanwhile
                try:
                    dst = open_private(tmp, os.O_WRONLY | os.O_EXCL)
                    try:
                        self._materialize(entry, src, dst)      # (a log folded in)
                        copied = min(entry.size, os.fstat(dst).st_blocks * 512)
                        total, bare = self._finish_file(dst, key, entry.version, entry.size,
                                                        entry.crc, stamped)
                        if sync_now:
                            os.fsync(dst)
                        ino = os.fstat(dst).st_ino
                    finally:
                        os.close(dst)
                finally:
                    os.close(src)
                new = SSDEntry(key, entry.version, entry.size, entry.crc, final, total,
                               dict(meta), synced=sync_now, ino=ino, bare=bare,
                               fseq=stamped["seq"])
                with self.lock:
                    os.rename(tmp, final)
                    self._hook("renamed")
                    self.write_bytes += copied
                    self.index[key] = new
                    self.used_bytes += total - entry.file_bytes
                    self._dirty_dirs.add(sdir)
                    if sync_now:
                        self._unsynced.pop(key, None)
                    else:
                        self._unsynced[key] = new
            except OSError:
                with self.lock:
                    self.write_errors += 1
                _discard(tmp)
                raise
            if entry.log is not None:
                self._fold_done(entry.log.path, sdir)
            return new

    # ---- consistency (tests; memosfs at unmount with MEMOSFS_CHECK_AT_UNMOUNT=1) ----

    def check(self) -> None:
        """The index and the folder agree: every entry's file is there, is
        the entry's inode, and its trailer says the entry's key, version,
        size and checksum; every slot file is indexed; used_bytes is their
        sum.  AssertionError says what does not.  (Payloads are not read.)"""
        with self.write_lock, self.lock:
            index = dict(self.index)
            used = self.used_bytes
            files = set()
            for shard in os.listdir(self.slots_dir):
                sdir = os.path.join(self.slots_dir, shard)
                if os.path.isdir(sdir):
                    files |= {os.path.join(sdir, n) for n in os.listdir(sdir)
                              if n.endswith((".slot", ".log"))}
            self.segs.check(index)
            for key, e in index.items():
                assert e.key == key, f"ssd: entry of {key!r} says {e.key!r}"
                if isinstance(e, _segments.PackedEntry):
                    continue
                try:
                    fd = os.open(e.path, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    raise AssertionError(f"ssd: {key!r}: its file {e.path} is missing") \
                        from None
                try:
                    found = read_trailer(fd, e.path)
                    if e.log is not None:
                        found = _check_log_file(e, found)
                        files.discard(e.log.path)
                except CorruptSlot as c:
                    raise AssertionError(f"ssd: {key!r}: {c}") from None
                finally:
                    os.close(fd)
                assert not e.ino or found.ino == e.ino, \
                    f"ssd: {key!r}: {e.path} is inode {found.ino}, the index says {e.ino}"
                assert (found.key, found.version, found.size, found.crc, found.file_bytes,
                        found.bare) == (e.key, e.version, e.size, e.crc, e.file_bytes, e.bare), \
                    f"ssd: {key!r}: the file says version {found.version} of {found.key!r}, " \
                    f"the index version {e.version}"
                files.discard(e.path)
            assert not files, f"ssd: slot files or logs no entry names: {sorted(files)[:5]}"
            assert used == sum(e.file_bytes for e in index.values()), \
                f"ssd: used_bytes {used}, the entries {sum(e.file_bytes for e in index.values())}"
            tracked = set(self.policy.keys())
            assert tracked == set(index), \
                f"ssd: the policy tracks {sorted(tracked - set(index))[:5]} beyond the " \
                f"index, misses {sorted(set(index) - tracked)[:5]}"
            native_policy = getattr(self.policy, "policy", None)
            if native_policy is not None:
                native_policy.check()

    # ---- durability ----

    def sync_key(self, key: bytes) -> None:
        """Make key's stored version durable: its file fsync'd if it may not
        be, then every folder with a rename or unlink not yet durable."""
        with self.write_lock:
            entry = self.get(key)
            if entry is not None and entry.synced is not True:
                self._fsync_entry(entry)
        self.sync_dirs()

    def _fsync_entry(self, entry: SSDEntry) -> None:
        """fsync an entry's file (writer lock held)."""
        if isinstance(entry, _segments.PackedEntry):
            return self.segs.fsync_entry(entry)
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return                          # removed or replaced meanwhile
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if entry.log is not None:               # the records appended since
            try:
                self._fsync_path(entry.log.path)
            except FileNotFoundError:
                return                          # folded or removed meanwhile
        entry.synced = True

    def sync(self) -> None:
        """fsync every file this daemon wrote without one, then every folder
        with a rename or unlink not yet durable (flush, unmount, fsync of a
        directory)."""
        with self.write_lock:
            with self.lock:
                pending, self._unsynced = list(self._unsynced.values()), {}
            for i, e in enumerate(pending):
                try:
                    if e.synced is False:
                        self._fsync_entry(e)
                except OSError:
                    with self.lock:             # still not durable: next time
                        for rest in pending[i:]:
                            self._unsynced.setdefault(rest.key, rest)
                    raise
        self.sync_dirs()

    def sync_dirs(self) -> None:
        """fsync every folder with a rename or unlink not yet durable."""
        with self.lock:
            dirs, self._dirty_dirs = sorted(self._dirty_dirs), set()
        for i, d in enumerate(dirs):
            try:
                _fsync_dir(d)
            except FileNotFoundError:
                pass
            except OSError:
                with self.lock:                 # still not durable: next time
                    self._dirty_dirs.update(dirs[i:])
                raise
        self.segs.sync()                        # segments: tombstones, unsynced records

    def write_json(self, name: str, obj: Any, durable: bool, fsync: bool = True,
                   dir_sync: bool = True) -> None:
        """Replace root/name atomically with obj as JSON: a temporary file,
        fdatasync'd (unless fsync is False), renamed over the old one.
        durable: the rename too is made durable (the folder fsync'd, unless
        dir_sync is False: the caller fsyncs it once for several files,
        sync_root).  A file whose bytes were not fsync'd before its rename
        can be left empty by a power loss that keeps the rename: only the
        files the mount can do without (order.json, policy.json: the mount
        falls back) are written so (fsync=False), never namespace.json."""
        path = os.path.join(self.root, name)
        tmp = f"{path}.{os.getpid()}.{next(self._seq)}.tmp"     # callers may race
        data = json.dumps(obj, separators=(",", ":")).encode()
        try:
            with open(open_private(tmp, os.O_WRONLY | os.O_EXCL), "wb") as f:
                f.write(data)
                if durable or fsync:
                    f.flush()
                    os.fdatasync(f.fileno())
            os.replace(tmp, path)
        except OSError:
            _discard(tmp)
            raise
        if durable and dir_sync:
            _fsync_dir(self.root)

    def sync_root(self) -> None:
        """fsync the SSD directory itself (the renames of its JSON files)."""
        _fsync_dir(self.root)

    def read_json(self, name: str, default: Any, level: int = logging.ERROR) -> Any:
        """root/name as JSON; default if it is missing, or unreadable (logged
        at `level`: ERROR for namespace.json, whose loss loses directories;
        WARNING for the files the mount rebuilds otherwise)."""
        path = os.path.join(self.root, name)
        try:
            with open(path, "rb") as f:
                return json.loads(f.read())
        except FileNotFoundError:
            return default
        except (OSError, ValueError) as e:
            log.log(level, "ssd: %s unreadable (%s); using defaults", path, e)
            return default

    def disk_free(self) -> int:
        return shutil.disk_usage(self.root).free

    def statistics(self) -> SSDStats:
        with self.lock:
            ps = self.policy.stats()
            return SSDStats(
                ssd_evictions=self.evictions, ssd_policy_probation=ps["probation"],
                ssd_policy_protected=ps["protected"],
                ssd_slots=len(self.index), ssd_bytes=self.used_bytes,
                ssd_capacity=self.capacity, ssd_corrupt=self.corrupt, ssd_writes=self.writes, ssd_writes_unsynced=self.unsynced_writes,
                ssd_write_bytes=self.write_bytes, ssd_write_errors=self.write_errors,
                ssd_reads=self.reads, ssd_read_bytes=self.read_bytes,
                ssd_log_appends=self.log_appends, ssd_folds=self.folds,
                ssd_logs=sum(1 for e in self.index.values() if e.log is not None),
                ssd_log_bytes=sum(e.log.length for e in self.index.values()
                                  if e.log is not None),
                **self.segs.stats(self.index))

    # ---- the eviction order (ssdpolicy.py) ----

    def used(self, key: bytes) -> None:
        """A use of key (a read, a new version published): the policy counts it."""
        with self.lock:
            self.policy.used(key)

    def set_policy(self, name: str) -> None:
        """The evict_policy knob (lru_lfu, lru, lfu); ValueError otherwise."""
        with self.lock:
            self.policy.select(name)

    def victims(self, n: int, skip: Iterable[bytes] = ()) -> list[SSDEntry]:
        """Up to n entries, best victim first by the policy, none of `skip`."""
        with self.lock:
            keys = self.policy.victims(n, skip)
            return [self.index[k] for k in keys if k in self.index]

    def policy_stats(self) -> dict[str, Any]:
        with self.lock:
            return self.policy.stats()

    @property
    def policy_dirty(self) -> bool:
        return self.policy.dirty

    def save_policy(self, durable: bool, dir_sync: bool = True) -> None:
        """policy.json, as order.json is written (atomically, 0600; fsync'd
        when durable).  A save that is not durable is skipped when the last
        one is less than POLICY_SAVE_S old (the state is larger than
        order.json: its ghosts hold up to 6 hashes per slot); a crash then
        loses at most that much of the order's history."""
        now = time.monotonic()
        with self.lock:
            if not durable and now - self._policy_saved < POLICY_SAVE_S:
                return
            state = self.policy.state()
            self.policy.dirty = False
            self._policy_saved = now
        try:
            # (not fsync'd unless durable: a power loss that empties it
            # costs the eviction history only, restore_policy falls back)
            self.write_json(STATE_NAME, state, durable, fsync=durable, dir_sync=dir_sync)
        except BaseException:
            self.policy.dirty = True
            raise

    def restore_policy(self, order_lru_first: list[bytes]) -> str:
        """At mount, after scan: the saved policy state for the slots found,
        else order_lru_first (keys least recent first); returns how
        ("state", "order": no file, "fallback": a file that did not check out)."""
        path = os.path.join(self.root, STATE_NAME)
        saved: Any = None
        try:
            with open(path, "rb") as f:
                saved = json.loads(f.read())
            if saved is None:
                saved = "null"                  # present but not a state
        except FileNotFoundError:
            saved = None
        except (OSError, ValueError) as e:
            saved = {"unreadable": str(e)}     # (policy.restore says so: a WARNING)
        with self.lock:
            self.policy.restore(saved, set(self.index), order_lru_first, path)
            return self.policy.restored


class SSDReader:
    """A version read straight from its file, for when memory cannot take it
    (full of pinned or unwritable data, or the slot is larger than memory).
    Quacks like a pinned `_native.Ref` for readers; the open descriptor keeps
    this version readable even if a newer one replaces the file."""

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
        self._data: Optional[bytes] = None
        self._lfd: Optional[int] = None
        self._ext: Optional[list] = None
        if isinstance(entry, _segments.PackedEntry):    # small: its checked bytes
            self._data = _segments.read_checked(entry)
            self._fd: Optional[int] = None
            return
        self._fd = open_entry(entry)     # StaleEntry: look again
        try:
            if entry.log is not None:       # the file and its extent log
                self._lfd = _open_log(entry.log)
                self._ext = entry.log.extents()
                if _extentlog.crc_extents(self._ext, self._fd, self._lfd,
                                          entry.size) != entry.crc:
                    raise CorruptSlot(f"{entry.path}: payload checksum mismatch (with "
                                      f"its extent log)")
            else:
                _check_payload(self._fd, entry)
        except BaseException:
            self.release()
            raise

    def read(self, off: int, n: int) -> bytes:
        if self._data is not None:
            return self._data[off:off + max(0, n)]
        if self._fd is None:
            raise ValueError("reference was released")
        n = max(0, min(n, self.size - off))
        if not n:
            return b""
        if self._ext is not None:
            return _extentlog.read_extents(self._ext, self._fd, self._lfd, off, n)
        return os.pread(self._fd, n, off)

    def overlay_base(self) -> Optional["_spill.BaseView"]:
        """This version as the base of an overlay draft (spill.py), over
        duplicated descriptors; None for a packed record or a file of an
        older memosfs (no seq: a log cannot name it)."""
        if self._fd is None or self._data is not None or not self.entry.fseq:
            return None
        e = self.entry
        ident = (e.fseq, e.version, e.size, e.crc)
        if self._ext is not None:
            assert self._lfd is not None
            return _spill.dup_view(ident, {_extentlog.BASE: self._fd,
                                           _extentlog.LOG: self._lfd}, self._ext)
        return _spill.dup_view(ident, {_extentlog.BASE: self._fd},
                               [(0, self.size, _extentlog.BASE, 0)] if self.size else [])

    def plain_fd(self) -> Optional[int]:
        """The descriptor of this version's file when its bytes [0, size)
        are the version (no extent log, not packed), else None."""
        return self._fd if self._ext is None and self._data is None else None

    def release(self) -> None:
        self._data = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lfd is not None:
            os.close(self._lfd)
            self._lfd = None


class _Made:
    """The version an overlay's record makes, as _append_locked reads a Ref."""

    live = True

    def __init__(self, key: bytes, version: int, size: int) -> None:
        self.key, self.version, self.size = key, version, size


class _FileVersion:
    """A version's bytes in an open file, as segments.put reads a Ref's
    (SSDTier.put_file of a small spilled draft)."""

    def __init__(self, fd: int, size: int, version: int) -> None:
        self.fd, self.size, self.version = fd, size, version

    def read(self, off: int, n: int) -> bytes:
        n = max(0, min(n, self.size - off))
        return os.pread(self.fd, n, off) if n else b""


class SSDFull(OSError):
    """The SSD tier is over ssd_capacity by `excess` bytes (room can be made)."""

    def __init__(self, excess: int) -> None:
        super().__init__(errno.ENOSPC, f"ssd tier {excess} bytes over ssd_capacity")
        self.excess = excess


def _check_payload(fd: int, entry: SSDEntry) -> None:
    """CorruptSlot unless the first entry.size bytes of fd have entry's crc32c."""
    # (without the GIL; a sparse slot's holes are not read)
    try:
        crc = _native.crc32c_file(fd, 0, entry.size)
    except OSError as e:
        if e.errno != errno.EIO:
            raise
        raise CorruptSlot(f"{entry.path}: shorter than its payload") from None
    if crc != entry.crc:
        raise CorruptSlot(f"{entry.path}: payload checksum mismatch")


class _SameVersion:
    """A record of entry's very version (rewrite_meta appends one, runs
    none, to give a logged version new metadata)."""

    def __init__(self, entry: SSDEntry) -> None:
        self.version, self.size = entry.version, entry.size


def _int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


def entry_view(entry: SSDEntry) -> tuple[list, dict[int, int]]:
    """(extents, descriptors) of a slot file's version, its log included,
    for reading it as spill.read_view does (not checked: for the version
    this daemon just wrote)."""
    fd = open_entry(entry)
    if entry.log is None:
        return ([(0, entry.size, _extentlog.BASE, 0)] if entry.size else [],
                {_extentlog.BASE: fd})
    try:
        lfd = _open_log(entry.log)
    except BaseException:
        os.close(fd)
        raise
    return entry.log.extents(), {_extentlog.BASE: fd, _extentlog.LOG: lfd}


def _open_log(lg: "_extentlog.SlotLog") -> int:
    """A read-only descriptor of the log an entry names (StaleEntry: folded,
    removed or replaced since; CorruptSlot: shorter than its records)."""
    try:
        fd = os.open(lg.path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise StaleEntry(f"{lg.path}: gone") from None
    st = os.fstat(fd)
    if st.st_ino != lg.ino:
        os.close(fd)
        raise StaleEntry(f"{lg.path}: replaced by another log")
    if st.st_size < lg.length:
        os.close(fd)
        raise CorruptSlot(f"{lg.path}: shorter than its records ({st.st_size} of "
                          f"{lg.length} bytes)")
    return fd


def _load_logged(entry: SSDEntry, fd: int, draft: "_native.Draft") -> None:
    """load_into of a version with an extent log: the slot file's bytes and
    the records' runs into the draft, by the version's extents."""
    lg = entry.log
    lfd = _open_log(lg)
    try:
        draft.truncate(entry.size)
        mm = None
        if lg.base[1]:
            mm = mmap.mmap(fd, lg.base[1], flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                           prot=mmap.PROT_READ)
        try:
            for s, e, where, so in lg.extents():
                if where == _extentlog.BASE:
                    with memoryview(mm) as mv:
                        draft.write(s, mv[so:so + (e - s)])
                elif where == _extentlog.LOG:
                    data = os.pread(lfd, e - s, so)
                    if len(data) != e - s:
                        raise CorruptSlot(f"{lg.path}: short read")
                    draft.write(s, data)
        finally:
            if mm is not None:
                mm.close()
    finally:
        os.close(lfd)


def _check_log_file(entry: SSDEntry, base: SSDEntry) -> SSDEntry:
    """check(): entry's slot file (base, its trailer read) and log agree with
    the entry; returns what they describe, as an entry to compare."""
    lg = entry.log
    if (base.version, base.size, base.crc, base.file_bytes) != \
            (*lg.base, lg.base_bytes):
        raise CorruptSlot(f"{entry.path}: the file is version {base.version}, its log "
                          f"applies to {lg.base[0]}")
    with open(lg.path, "rb") as f:
        buf = f.read(lg.length)
    recs, end, bad = _extentlog.scan_log(buf, lg.base_seq, lg.base)
    if recs is None or bad is not None or end != lg.length or tuple(recs) != lg.records:
        raise CorruptSlot(f"{lg.path}: its records are not the index's ({bad})")
    last = recs[-1]
    return SSDEntry(base.key, last.version, last.size, last.crc, base.path,
                    base.file_bytes + end, ino=base.ino, bare=base.bare)


def _check_logged(entry: SSDEntry, fd: int) -> None:
    """CorruptSlot unless entry's file and log check out whole: the file's
    trailer, the records and the whole version's crc32c."""
    base = read_trailer(fd, entry.path)
    _check_log_file(entry, base)
    lfd = _open_log(entry.log)
    try:
        if _extentlog.crc_extents(entry.log.extents(), fd, lfd, entry.size) != entry.crc:
            raise CorruptSlot(f"{entry.path}: payload checksum mismatch (with its "
                              f"extent log)")
    finally:
        os.close(lfd)


def _copy_between(src: int, dst: int, src_off: int, dst_off: int, n: int) -> None:
    """Bytes [src_off, src_off+n) of src to dst at dst_off."""
    while n > 0:
        try:
            done = os.copy_file_range(src, dst, n, src_off, dst_off)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            done = 0
        if done == 0:
            chunk = os.pread(src, min(n, 1 << 20), src_off)
            if not chunk:
                raise OSError(errno.EIO, "source file shorter than its index entry says")
            _pwrite_all(dst, chunk, dst_off)
            done = len(chunk)
        src_off += done
        dst_off += done
        n -= done


def _verify_payload(fd: int, entry: SSDEntry) -> None:
    """_check_payload for open_backing: read through the page cache, the
    whole file asked for up front (WILLNEED, and a doubled readahead window
    while the check reads it in order), so the check waits on large reads
    and leaves the pages cached for the passthrough reader that follows.
    The descriptor is that reader's backing file: its readahead is set back
    to the default afterwards (the reader's pattern is its own)."""
    advised = True
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        os.posix_fadvise(fd, 0, entry.size, os.POSIX_FADV_WILLNEED)
    except OSError:
        advised = False
    try:
        _check_payload(fd, entry)
    finally:
        if advised:
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_NORMAL)
            except OSError:
                pass


def _trailer_bound(key: bytes, meta: dict[str, Any]) -> int:
    """The bytes a trailer for key and meta takes (the room check's estimate)."""
    return _FIXED.size + len(key) + len(json.dumps(meta, separators=(",", ":"))) \
        + _FOOTER.size


def _pwrite_all(fd: int, data: bytes, off: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, off)
        view = view[n:]
        off += n


def _copy_range(src: int, dst: int, n: int) -> None:
    _copy_range_at(src, dst, 0, n)


def _copy_range_at(src: int, dst: int, start: int, n: int) -> None:
    """Bytes [start, start+n) of src to the same offsets of dst."""
    off, n = start, start + n
    while off < n:
        try:
            done = os.copy_file_range(src, dst, n - off, off, off)
        except OSError as e:
            if e.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            done = 0
        if done == 0:
            chunk = os.pread(src, min(n - off, 1 << 20), off)
            if not chunk:
                raise OSError(errno.EIO, "source file shorter than its trailer says")
            _pwrite_all(dst, chunk, off)
            done = len(chunk)
        off += done


def _copy_sparse(src: int, dst: int, n: int) -> None:
    """The first n bytes of src into dst, holes left holes (a slot written
    back with its holes keeps them when its metadata is rewritten)."""
    off = 0
    while off < n:
        try:
            start = os.lseek(src, off, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:          # only a hole is left
                break
            if e.errno != errno.EINVAL:
                raise
            _copy_range_at(src, dst, off, n - off)      # no SEEK_DATA here
            break
        if start >= n:
            break
        end = min(os.lseek(src, start, os.SEEK_HOLE), n)
        _copy_range_at(src, dst, start, end - start)
        off = end
    os.ftruncate(dst, n)


def _discard(path: str) -> None:
    """Remove a temporary file a failed write left, if it is there."""
    try:
        os.unlink(path)
    except OSError:
        pass


def _empty_left(fd: int) -> bool:
    """A 0-byte slot file is what a power loss leaves of a write-back it took
    before any byte reached the disk, unless it is a valid empty slot (its
    attribute says 0 bytes)."""
    try:
        attr = _slot_attr(fd)
    except OSError:
        return True
    if attr is None or len(attr) < _FIXED.size:
        return True
    return _FIXED.unpack_from(attr)[1] != 0


_libc = None


def _syncfs(path: str) -> None:
    """syncfs(2) of the file system holding path (every dirty page and
    inode of it written and flushed); a failure is logged, not raised."""
    global _libc
    try:
        if _libc is None:
            import ctypes
            import ctypes.util
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            if _libc.syncfs(fd) != 0:
                import ctypes
                code = ctypes.get_errno()
                raise OSError(code, os.strerror(code))
        finally:
            os.close(fd)
    except (OSError, AttributeError) as e:
        log.warning("ssd: cannot syncfs %s (%s): what a crashed daemon left unsynced "
                    "may still be lost to a power loss", path, e)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the directory's lock
#
# One daemon at a time owns an SSD directory (and the federated state under
# it): two would overwrite each other's order.json, namespace.json and slot
# files.  The owner holds flock(LOCK_EX) on `.lock` in the directory for its
# whole life, on a descriptor that is close-on-exec (no child it spawns keeps
# it); the kernel drops the lock when the daemon dies, however it dies, so a
# crash never leaves a stale lock.  The file says who holds it (`pid
# mountpoint`), for the message another daemon gives when it is refused.

LOCK_NAME = ".lock"


class DirectoryInUse(Exception):
    """Another process holds the directory's lock: `pid` and `mountpoint`
    as it wrote them (None when it had not written them yet)."""

    def __init__(self, root: str, pid: Optional[int], mountpoint: Optional[str]) -> None:
        self.root, self.pid, self.mountpoint = root, pid, mountpoint
        who = f"pid {pid}" if pid else "another process"
        where = f" (mounted at {mountpoint})" if mountpoint else ""
        super().__init__(f"the SSD directory {root} is in use by {who}{where}")


class DirLock:
    """The exclusive lock of a directory (see above).  `acquire` takes it or
    raises DirectoryInUse; it only opens (creating if missing) the lock file
    and reads it, so a refused daemon changes nothing in the directory."""

    def __init__(self, root: str, fd: int) -> None:
        self.root, self.fd = root, fd

    @classmethod
    def acquire(cls, root: str, mountpoint: str, wait: float = 5.0,
                still_serving=None) -> "DirLock":
        """Lock root/.lock and write our pid and mountpoint into it.  A holder
        may be a daemon that is still exiting: retry for up to `wait` seconds,
        unless still_serving(holder's mountpoint) says the holder serves a
        mount (then refuse at once)."""
        import fcntl
        import time
        root = os.path.abspath(root)
        path = os.path.join(root, LOCK_NAME)
        fd = _open_lock_file(path)
        deadline = time.monotonic() + wait
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    pid, mnt = _read_holder(fd)
                    if (time.monotonic() >= deadline
                            or (pid and mnt and still_serving and still_serving(mnt))):
                        raise DirectoryInUse(root, pid, mnt) from None
                    time.sleep(0.05)
            lock = cls(root, fd)
            lock.note(os.getpid(), mountpoint)
            return lock
        except BaseException:
            os.close(fd)
            raise

    def note(self, pid: int, mountpoint: str) -> None:
        """Say who holds the lock (again after a fork: the daemon's pid)."""
        data = f"{pid} {mountpoint}\n".encode()
        try:
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, data, 0)
        except OSError as e:            # only the refusal message loses the pid
            log.warning("ssd: cannot write the holder into %s: %s",
                        os.path.join(self.root, LOCK_NAME), e)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)           # drops the lock
            self.fd = -1


def _open_lock_file(path: str) -> int:
    """Open the lock file read-write and close-on-exec; create it (0600) only
    if it is missing: a refused daemon must not change it."""
    for _ in range(10):
        try:
            return os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            pass
        try:
            return open_private(path, os.O_RDWR | os.O_EXCL | os.O_NOFOLLOW)
        except FileExistsError:         # another daemon made it just now
            continue
    return os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)


def _read_holder(fd: int) -> tuple[Optional[int], Optional[str]]:
    try:
        text = os.pread(fd, 4096, 0).decode(errors="replace").strip()
    except OSError:
        return None, None
    pid, _, mnt = text.partition(" ")
    try:
        return int(pid), mnt or None
    except ValueError:
        return None, None


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


# the packed small slots build on the classes above (segments.py imports them)
from memosfs.store import segments as _segments  # noqa: E402
