"""The kind "packed": small slot versions, records in append-only segment files.

A slot version whose payload is smaller than PACK_BELOW (64 KiB) is not a
file of its own (whole.py) but a record appended to a segment,
`DIR/segments/<id, 8 hex>.seg`; larger versions keep a file each.

    segment   [0, 16)    "MEMOSEG1", flags u8 (1: sealed), 7 reserved bytes
              [16, ...)  records, back to back, no padding
    record    magic "MREC", kind u8 (1 slot version, 2 tombstone), flags u8,
              reserved u16, key length u32, meta length u32, seq u64,
              version u64, payload size u64, payload crc32c u32,
              header crc32c u32 (over the 44 bytes before it, the key and
              the meta), key, meta (JSON: owner, mode, times, xattrs), payload

`seq` orders every record and every slot file this tier writes (a file's
trailer meta carries it as "seq"; a file written by an older memosfs counts
as 0): at mount, each key's newest record or file wins, whatever segment it
is in, and a tombstone (written when a key is removed, renamed away or
evicted while some segment still holds a record of it) wins as "absent", so
nothing removed comes back.  A losing slot file is unlinked then.

Writing.  Appends go to one active segment under the tier's writer lock (a
new one is started past SEGMENT_BYTES and at each mount; a segment is never
appended to after it was sealed).  A version that must be durable (fsync,
flush, unmount) is fdatasync'd with its segment, and the segments folder
once per new segment; others are synced by the next `sync` (as unsynced
slot files are).  A version that replaces a slot *file* that may be durable
is synced before that file is unlinked; one that replaces a packed record
needs no sync, because the older record stays in its segment until a
compaction, and a compaction syncs everything first.  Conversely a slot
*file* that shadows an older record of its key is unlinked (removed,
evicted, renamed away, set aside) only after the key's tombstone is
fdatasync'd (`forgotten(durable=True)`): a power loss that kept the unlink
and lost the tombstone would bring the old record back.  A new segment is
made as `<id>.seg.tmp`, its header fdatasync'd, then renamed into place; a
segment is fdatasync'd before it is sealed; an empty `.seg` (what an older
memosfs left of a segment a power loss took) is removed at mount.

Crash.  A record torn by a crash fails its header or payload checksum: the
scan stops at a bad header and skips a record whose payload fails (set
aside in corrupt/ as `<segment>@<offset>.rec`, counted in ssd_corrupt once).
What follows a bad header is a torn tail (a crash cut the last append short:
logged, cut off) in a segment that was not sealed, damage in one that was (set
aside and counted); a segment is sealed when appends move on to the next
one, when a compaction writes it, and at the first mount after it was active;
the key then falls back to its previous record, as a slot file torn before
its rename leaves the previous file.  A rename appends the moved version
under the new key (meta `moved_from`: the old key and its record's seq),
fdatasyncs it, and only then appends the old key's tombstone: a crash in
between leaves both, and the scan completes the rename.

Reading.  The index entry (PackedEntry) names the segment and the offset;
a read is one pread of the payload and its crc32c check, on a descriptor
each segment keeps open.  A compaction retires a segment only after the
index points at the new copies; a reader still holding an old entry gets
StaleEntry (look again), and the descriptor is closed when its last reader
leaves.

Compaction (maintain(), from the background writer, at most every
COMPACT_GAP_S): a sealed segment whose live records fill less than
COMPACT_LIVE of it, or several sealed ones smaller than COMPACT_SMALL, are
rewritten into a new segment (live records and the tombstones still
needed, verbatim), which is fsync'd and renamed into place, its folder
fsync'd, the index switched to it, the tier synced, and only then are the
old segments unlinked.  A tombstone is dropped only when its own segment
held the last record of its key, so a crash that brings back any subset of
the old segments brings back no removed slot.

Thread-safety: appends, tombstones, compaction and scan under the tier's
write_lock; the index under its lock; Segment.lock guards a segment's
descriptor and readers.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import struct
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from memosfs import _native
from memosfs.private import open_private, private_dir
from memosfs.store.ssd.fileio import _discard as _unlink
from memosfs.store.ssd.fileio import _fsync_dir
from memosfs.store.ssd.format import CorruptSlot, SSDEntry, StaleEntry, _int

log = logging.getLogger("memosfs.store.ssd")

__all__ = ["SegmentStore", "PackedEntry", "PACK_BELOW", "SEGMENT_BYTES", "FileVersion"]

PACK_BELOW = 64 << 10           # payloads smaller than this are packed (ssd_pack_below)
MAX_PACK = 1 << 20              # the knob's bound: no record's payload is larger
SEGMENT_BYTES = 16 << 20        # the active segment is sealed past this size
COMPACT_LIVE = 0.5              # sealed segments less live than this are rewritten
COMPACT_SMALL = SEGMENT_BYTES // 8  # sealed segments smaller than this are merged
COMPACT_GAP_S = 1.0             # compaction looks at most this often
SEG_MAGIC = b"MEMOSEG1"
SEG_HEAD = 16
SEALED = 1                      # the flags byte at offset 8: no more appends
REC_MAGIC = b"MREC"
KIND_SLOT, KIND_TOMB = 1, 2
_REC = struct.Struct("<4sBBHIIQQQI")    # magic kind flags - klen mlen seq version size crc
_HCRC = struct.Struct("<I")
HEAD = _REC.size + _HCRC.size           # 48
MAX_KEY = 1 << 16
MAX_META = 1 << 20
MAX_RECORD = HEAD + MAX_KEY + MAX_META + (1 << 20)     # what one torn append can leave


class Segment:
    """One segment file and its open descriptor."""

    def __init__(self, sid: int, path: str, fd: int, size: int, synced: bool) -> None:
        self.id = sid
        self.path = path
        self.name = os.path.basename(path)
        self.fd = fd                    # -1 once closed (lock)
        self.size = size                # bytes appended (writer lock)
        self.durable = size if synced else 0    # bytes known fdatasync'd (writer lock)
        self.dir_synced = synced        # its name is durable in the folder
        self.retired = False            # compacted away (lock)
        self.users = 0                  # readers inside pread (lock)
        self.lock = threading.Lock()

    def pread(self, n: int, off: int) -> bytes:
        """n bytes at off; StaleEntry once the segment was compacted away."""
        with self.lock:
            if self.retired or self.fd < 0:
                raise StaleEntry(f"{self.path}: compacted away")
            self.users += 1
        try:
            return os.pread(self.fd, n, off)
        finally:
            with self.lock:
                self.users -= 1
                if self.retired and self.users == 0:
                    self._close()

    def retire(self) -> None:
        with self.lock:
            self.retired = True
            if self.users == 0:
                self._close()

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(eq=False)
class PackedEntry(SSDEntry):
    """A slot version that is a record in a segment (`path` is the segment's;
    `file_bytes` the record's length)."""
    seg: Optional[Segment] = None
    off: int = 0                # the record's offset in the segment
    data_off: int = 0           # its payload's offset
    seq: int = 0

    @property
    def where(self) -> str:
        return f"{self.path}@{self.off}"

    @property
    def kind(self) -> str:
        return "packed"

    @property
    def base_ident(self) -> None:
        return None                     # (no log or overlay names a record)


@dataclass
class _Rec:
    """A record as parsed from a segment."""
    kind: int
    key: bytes
    meta: bytes
    seq: int
    version: int
    size: int
    crc: int
    off: int
    length: int


def encode(kind: int, key: bytes, meta: bytes, seq: int, version: int, size: int,
           crc: int) -> bytes:
    """A record's header, key and meta (the payload follows)."""
    fixed = _REC.pack(REC_MAGIC, kind, 0, 0, len(key), len(meta), seq, version, size, crc)
    hcrc = _native.crc32c(key + meta, _native.crc32c(fixed))
    return fixed + _HCRC.pack(hcrc) + key + meta


def parse(buf: bytes, off: int) -> Optional[_Rec]:
    """The record at buf[off:], header checked (not the payload), or None
    where the bytes are not a whole record (end, torn tail, damage)."""
    if off + HEAD > len(buf):
        return None
    magic, kind, _f, _r, klen, mlen, seq, version, size, crc = _REC.unpack_from(buf, off)
    if magic != REC_MAGIC or kind not in (KIND_SLOT, KIND_TOMB) or klen > MAX_KEY \
            or mlen > MAX_META or size > MAX_PACK:
        return None
    end = off + HEAD + klen + mlen
    if end + size > len(buf):
        return None
    (hcrc,) = _HCRC.unpack_from(buf, off + _REC.size)
    if _native.crc32c(buf[off + HEAD:end], _native.crc32c(buf[off:off + _REC.size])) != hcrc:
        return None
    return _Rec(kind, bytes(buf[off + HEAD:off + HEAD + klen]), bytes(buf[off + HEAD + klen:end]),
                seq, version, size, crc, off, HEAD + klen + mlen + size)


def records(buf: bytes) -> Iterator[_Rec]:
    """The records of a segment's bytes, in order, up to the first that is not
    whole; the caller compares where it stopped with len(buf)."""
    off = SEG_HEAD
    while True:
        rec = parse(buf, off)
        if rec is None:
            return
        yield rec
        off += rec.length


_NOWAIT = getattr(os, "RWF_NOWAIT", 0)     # 0: not here (the caller goes off the loop)


def read_resident(entry: PackedEntry) -> Optional[bytes]:
    """entry's payload if the page cache holds all of it (preadv2 with
    RWF_NOWAIT: never waits for the disk), its crc32c checked; None if it
    would wait, or if anything is amiss (the caller then reads it the
    ordinary way, which reports what is wrong)."""
    seg = entry.seg
    if not _NOWAIT or seg is None:
        return None
    buf = bytearray(entry.size)
    with seg.lock:
        if seg.retired or seg.fd < 0:
            return None
        seg.users += 1
    try:
        n = os.preadv(seg.fd, [buf], entry.data_off, _NOWAIT) if entry.size else 0
    except OSError:
        return None                     # EAGAIN: not all in the page cache
    finally:
        with seg.lock:
            seg.users -= 1
            if seg.retired and seg.users == 0:
                seg._close()
    if n != entry.size or _native.crc32c(buf) != entry.crc:
        return None
    return bytes(buf)


def read_checked(entry: PackedEntry) -> bytes:
    """entry's payload, its crc32c checked (CorruptSlot; StaleEntry: the
    segment was compacted away, look again)."""
    assert entry.seg is not None
    data = entry.seg.pread(entry.size, entry.data_off)
    if len(data) != entry.size or _native.crc32c(data) != entry.crc:
        raise CorruptSlot(f"{entry.where}: payload checksum mismatch (slot {entry.key!r})")
    return data


class FileVersion:
    """A version's bytes in an open file, as `put` reads a Ref's
    (SSDTier.put_file of a small spilled draft)."""

    def __init__(self, fd: int, size: int, version: int) -> None:
        self.fd, self.size, self.version = fd, size, version

    def read(self, off: int, n: int) -> bytes:
        n = max(0, min(n, self.size - off))
        return os.pread(self.fd, n, off) if n else b""


class PackedReader:
    """SSDReader's part for a packed record: its checked bytes."""

    def __init__(self, entry: PackedEntry) -> None:
        self.data: Optional[bytes] = read_checked(entry)

    def read(self, off: int, n: int) -> bytes:
        if self.data is None:
            raise ValueError("reference was released")
        return self.data[off:off + max(0, n)]

    def overlay_base(self) -> None:
        return None

    def plain_fd(self) -> None:
        return None

    def release(self) -> None:
        self.data = None


class SegmentStore:
    """The packed part of an SSDTier (see the module docstring), and the
    operations of the kind (tier.py's table)."""

    FILE = False                # a record: its key's tombstone needs no sync first
    RESIDENT = True             # may be read on the event loop (read_resident)

    def __init__(self, tier: Any) -> None:
        self.tier = tier
        self.dir = os.path.join(tier.root, "segments")
        self.pack_below = PACK_BELOW            # the ssd_pack_below knob
        if private_dir(self.dir):
            _fsync_dir(tier.root)               # (its name durable: once)
        self.segs: dict[int, Segment] = {}      # live segments by id (writer lock)
        self.active: Optional[Segment] = None   # the one appended to (writer lock)
        self.next_id = 1
        self.seq = 1                            # the next record's seq (writer lock)
        self.recs: dict[bytes, int] = {}        # slot records of each key in segments
        self.tombstones = 0                     # tombstones written
        self.compactions = 0                    # segments compacted away
        self.compacted_bytes = 0                # bytes rewritten by compaction
        self._changed = False                   # something died since the last look
        self._looked = 0.0                      # monotonic time of the last look

    def packs(self, size: int) -> bool:
        return size < min(self.pack_below, MAX_PACK + 1)

    def stamp(self, meta: dict[str, Any]) -> dict[str, Any]:
        """meta with the next seq, for a slot file (writer lock held)."""
        seq = self.seq
        self.seq += 1
        return dict(meta, seq=seq)

    def stats(self, index: dict[bytes, SSDEntry]) -> dict[str, int]:
        """The SSDStats fields of the packed part (the tier's lock held)."""
        segs = list(self.segs.values())
        return {"ssd_packed": sum(isinstance(e, PackedEntry) for e in index.values()),
                "ssd_segments": len(segs), "ssd_segment_bytes": sum(s.size for s in segs),
                "ssd_tombstones": self.tombstones, "ssd_compactions": self.compactions}

    # ---- appends (writer lock held) ----

    def _append(self, data: bytes, sync: bool = False) -> tuple[Segment, int]:
        """Append data to the active segment (fdatasync'd with sync).  An
        OSError (ENOSPC, EIO) takes back what part of it was written, so a
        failed write never comes back after a restart."""
        seg = self.active
        if seg is None or seg.size >= SEGMENT_BYTES:
            if seg is not None:
                # its records durable before the mark: a sealed segment's
                # bad bytes are then damage, never appends a power loss took
                self._fsync(seg)
                _seal(seg)
            seg = self._start()
        off = seg.size
        view = memoryview(data)
        pos = off
        try:
            while view:
                n = os.pwrite(seg.fd, view, pos)
                view = view[n:]
                pos += n
            seg.size = pos
            if sync:
                self._fsync(seg)
        except OSError:
            seg.size = off
            seg.durable = min(seg.durable, off)
            try:
                os.ftruncate(seg.fd, off)
            except OSError as e:
                log.error("ssd: cannot take back a failed append to %s (%s)", seg.path, e)
            raise
        return seg, off

    def _start(self) -> Segment:
        """A new active segment: its header written to `<id>.seg.tmp`,
        fdatasync'd, renamed into place (the name durable with the first
        sync of a record, `_fsync`), so that a `.seg` always begins with
        its header: one without it is damage, not a crash in the creation
        (one fdatasync per segment, that is per 16 MiB of records or mount)."""
        sid = self.next_id
        path = os.path.join(self.dir, f"{sid:08x}.seg")
        tmp = path + ".tmp"             # (a leftover one went at mount)
        try:
            fd = open_private(tmp, os.O_RDWR | os.O_EXCL)
        except FileNotFoundError:
            if private_dir(self.dir):
                _fsync_dir(self.tier.root)
            fd = open_private(tmp, os.O_RDWR | os.O_EXCL)
        try:
            os.pwrite(fd, SEG_MAGIC + bytes(SEG_HEAD - len(SEG_MAGIC)), 0)
            os.fdatasync(fd)
            os.rename(tmp, path)
        except OSError:
            os.close(fd)
            _unlink(tmp)
            raise
        self.next_id += 1
        seg = Segment(sid, path, fd, SEG_HEAD, synced=False)
        self.segs[sid] = seg
        self.active = seg
        return seg

    def _fsync(self, seg: Segment) -> None:
        """Make seg's appended bytes durable, its name too."""
        if seg.durable >= seg.size and seg.dir_synced:
            return
        end = seg.size
        os.fdatasync(seg.fd)
        if not seg.dir_synced:
            _fsync_dir(self.dir)
            seg.dir_synced = True
        seg.durable = max(seg.durable, end)

    def put(self, ref: "_native.Ref", key: bytes, meta: dict[str, Any], durable: bool,
            crc: int) -> PackedEntry:
        """Append ref's version of key (SSDTier._write_locked for a small slot)."""
        tier = self.tier
        size = ref.size
        payload = ref.read(0, size) if size else b""
        if len(payload) != size:
            raise OSError(errno.EIO, f"short read of {key!r} ({len(payload)} of {size})")
        m = json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()
        with tier.lock:
            old = tier.index.get(key)
        # a slot file that may be durable is unlinked below: the record first
        sync_now = durable or (old is not None and not isinstance(old, PackedEntry)
                               and old.maybe_durable)
        seq = self.seq
        head = encode(KIND_SLOT, key, m, seq, ref.version, size, crc)
        try:
            seg, off = self._append(head + payload, sync=sync_now)
        except OSError:
            with tier.lock:
                tier.write_errors += 1
            raise
        self.seq += 1
        self.recs[key] = self.recs.get(key, 0) + 1
        entry = PackedEntry(key, ref.version, size, crc, seg.path, len(head) + size,
                            dict(meta), synced=sync_now, seg=seg, off=off,
                            data_off=off + len(head), seq=seq)
        old = tier.install(entry, wrote=size)
        if old is not None and not isinstance(old, PackedEntry):
            tier._unlink_locked(old.path)       # the file this version replaces
        self._changed = True
        return entry

    def rewrite_meta(self, entry: PackedEntry, meta: dict[str, Any]) -> PackedEntry:
        """entry's version with new metadata (owner, mode, times or xattrs
        changed while memory did not hold the slot: SSDTier.rewrite_meta,
        writer lock held): its payload appended again beside the new
        metadata, a newer record of the key than the one it replaces, so a
        crash leaves the old metadata or the new.  OSError: nothing changed."""
        tier = self.tier
        key = entry.key
        payload = entry.seg.pread(entry.size, entry.data_off) if entry.size else b""
        if len(payload) != entry.size:
            raise OSError(errno.EIO, f"{entry.where}: short read")
        m = json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()
        seq = self.seq
        head = encode(KIND_SLOT, key, m, seq, entry.version, entry.size, entry.crc)
        tier._check_room(key, len(head) + entry.size)
        sync_now = entry.synced is not False
        try:
            seg, off = self._append(head + payload, sync=sync_now)
        except OSError:
            with tier.lock:
                tier.write_errors += 1
            raise
        self.seq += 1
        self.recs[key] = self.recs.get(key, 0) + 1
        new = PackedEntry(key, entry.version, entry.size, entry.crc, seg.path,
                          len(head) + entry.size, dict(meta), synced=sync_now, seg=seg,
                          off=off, data_off=off + len(head), seq=seq)
        tier.install(new, over=entry, write=False)
        self._changed = True
        return new

    def tombstone(self, key: bytes, sync: bool = False) -> None:
        """Record that key has no version (a removal, a rename away, a
        record set aside), so that no older record of it comes back."""
        seq = self.seq
        try:
            self._append(encode(KIND_TOMB, key, b"", seq, 0, 0, 0), sync=sync)
            self.seq += 1
        except OSError as e:
            log.error("ssd: cannot record the removal of %r in a segment (%s): it may "
                      "come back after a restart", key, e)
            return
        self.tombstones += 1
        self._changed = True

    def forgotten(self, key: bytes, durable: bool = False) -> None:
        """key no longer has a version on the tier (its entry went): a
        tombstone if some segment still holds a record of it.  durable: it
        is fdatasync'd before this returns (a slot *file* that shadowed the
        record goes next: its unlink must not outlive the tombstone)."""
        if self.recs.get(key):
            with self.tier.write_lock:
                self.tombstone(key, sync=durable)

    def rename(self, entry: PackedEntry, old: bytes, new: bytes,
               meta: dict[str, Any]) -> PackedEntry:
        """Move a packed version from old to new (SSDTier.rename, writer lock
        held): new's record, durable, then old's tombstone."""
        tier = self.tier
        payload = entry.seg.pread(entry.size, entry.data_off) if entry.size else b""
        if len(payload) != entry.size:
            raise OSError(errno.EIO, f"{entry.where}: short read")
        m = json.dumps(dict(meta, moved_from={"key": old.hex(), "seq": entry.seq}),
                       separators=(",", ":"), sort_keys=True).encode()
        seq = self.seq
        head = encode(KIND_SLOT, new, m, seq, entry.version, entry.size, entry.crc)
        tier._check_room(new, len(head) + entry.size)
        try:
            seg, off = self._append(head + payload, sync=True)  # durable before old's goes
            self.seq += 1
        except OSError:
            with tier.lock:
                tier.write_errors += 1
            raise
        self.recs[new] = self.recs.get(new, 0) + 1
        moved = PackedEntry(new, entry.version, entry.size, entry.crc, seg.path,
                            len(head) + entry.size, json.loads(m), synced=True, seg=seg,
                            off=off, data_off=off + len(head), seq=seq)
        replaced = tier.install(moved, moved_from=entry)
        if replaced is not None and not isinstance(replaced, PackedEntry):
            tier._unlink_locked(replaced.path)
        self.tombstone(old)
        return moved

    # ---- reads ----

    def load_into(self, entry: PackedEntry, draft: "_native.Draft") -> None:
        """One pread of the payload, its checksum, into the draft."""
        data = read_checked(entry)
        if data:
            draft.write(0, data)
        self.count_read(entry.size)

    def count_read(self, size: int) -> None:
        with self.tier.lock:
            self.tier.reads += 1
            self.tier.read_bytes += size

    def prefetch(self, entry: PackedEntry) -> None:
        seg = entry.seg
        with seg.lock:
            if seg.fd < 0:
                return
            try:
                os.posix_fadvise(seg.fd, entry.data_off, entry.size, os.POSIX_FADV_WILLNEED)
            except OSError:
                pass

    def report_corrupt(self, entry: PackedEntry, why: str) -> bool:
        """SSDTier.report_corrupt for a packed version: the record is read
        again; if it still fails, the entry goes, the record's bytes are
        copied into corrupt/ and a tombstone keeps it gone after a restart."""
        tier = self.tier
        with tier.write_lock:
            with tier.lock:
                if tier.index.get(entry.key) is not entry:
                    return False
            try:
                head = entry.seg.pread(entry.file_bytes, entry.off)
                rec = parse(head, 0)
                if rec is None or (rec.key, rec.seq, rec.version, rec.size, rec.crc) != \
                        (entry.key, entry.seq, entry.version, entry.size, entry.crc):
                    raise CorruptSlot(f"{entry.where}: record header does not check out "
                                      f"(slot {entry.key!r})")
                read_checked(entry)
                log.warning("ssd: %s checks out when read again (%s before)", entry.where, why)
                return False
            except StaleEntry:
                return False
            except CorruptSlot as e:
                why = str(e)
            except OSError as e:
                why = f"{entry.where}: {e}"
                head = b""
            tier._forget(entry)             # (a tombstone: see forgotten)
            self._set_aside(entry.seg, entry.off, head, why)
            return True

    def _set_aside(self, seg: Segment, off: int, data: bytes, why: str) -> bool:
        """Copy a bad record (or a segment's unreadable rest) into corrupt/,
        counted once: False if it was set aside before."""
        tier = self.tier
        name = os.path.join(tier.corrupt_dir, f"{seg.name}@{off}.rec")
        if os.path.exists(name):
            return False
        with tier.lock:
            tier.corrupt += 1
        log.error("ssd: corrupt record set aside: %s", why)
        try:
            private_dir(tier.corrupt_dir)
            fd = open_private(name, os.O_WRONLY | os.O_EXCL)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as e:
            log.error("ssd: cannot copy %s@%d into %s (%s)", seg.path, off,
                      tier.corrupt_dir, e)
        return True

    # ---- durability ----

    def fsync(self, entry: PackedEntry) -> None:
        seg = entry.seg
        with self.tier.write_lock:
            if not seg.retired:
                self._fsync(seg)
        entry.synced = True

    # ---- the kind's other operations (tier.py's table) ----

    def reader(self, entry: PackedEntry) -> PackedReader:
        return PackedReader(entry)

    def read_resident(self, entry: PackedEntry) -> Optional[bytes]:
        return read_resident(entry)

    def backing(self, entry: PackedEntry) -> None:
        return None                     # (not a file the kernel can read)

    def drop_log(self, entry: PackedEntry, sdir: str, fold: bool,
                 dir_synced: bool = False) -> bool:
        return False                    # (a record has no log)

    def unlink(self, entry: PackedEntry) -> None:
        pass                            # (the record stays until a compaction)

    def check(self, key: bytes, e: PackedEntry, files: set[str]) -> None:
        pass                            # (`check_all` checks every record)

    def sync(self) -> None:
        """fsync every segment with appends not yet durable (tombstones too)."""
        with self.tier.write_lock:
            for seg in list(self.segs.values()):
                self._fsync(seg)

    # ---- mount ----

    def scan(self, found: dict[bytes, SSDEntry]) -> None:
        """Merge the segments into `found` (the slot files scan found):
        each key's newest record or file wins; losing files are unlinked;
        interrupted renames are completed."""
        tier = self.tier
        fseq = {k: _int(e.meta.pop("seq", 0)) for k, e in found.items()}
        max_seq = max(list(fseq.values()) + [0])
        best: dict[bytes, tuple[tuple[int, int], Optional[PackedEntry]]] = {}
        names = sorted(os.listdir(self.dir))
        for name in names:
            if not name.endswith(".seg"):
                _unlink(os.path.join(self.dir, name))   # a compaction a crash cut short
        for name in names:
            if not name.endswith(".seg"):
                continue
            path = os.path.join(self.dir, name)
            try:
                sid = int(name[:-4], 16)
                fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            except (ValueError, OSError) as e:
                log.error("ssd: segment %s unusable (%s); skipped", path, e)
                continue
            with os.fdopen(os.dup(fd), "rb") as f:
                buf = f.read()
            if not buf:
                # created and never synced before a power loss (an older
                # memosfs made segments in place): nothing was in it
                log.info("ssd: %s: an empty segment (a power loss came before any of "
                         "its bytes were on the disk); removed", path)
                os.close(fd)
                _unlink(path)
                tier._dirty_dirs.add(self.dir)
                continue
            seg = Segment(sid, path, fd, len(buf), synced=True)
            self.segs[sid] = seg
            self.next_id = max(self.next_id, sid + 1)
            if buf[:len(SEG_MAGIC)] != SEG_MAGIC:
                self._set_aside(seg, 0, buf, f"{path}: not a segment (no magic)")
                continue
            end = SEG_HEAD
            for rec in records(buf):
                end = rec.off + rec.length
                max_seq = max(max_seq, rec.seq)
                entry = None
                if rec.kind == KIND_SLOT:
                    # every whole record of the key counts, a damaged one too:
                    # a compaction drops it as dead and takes it off the count
                    self.recs[rec.key] = self.recs.get(rec.key, 0) + 1
                    data_off = rec.off + rec.length - rec.size
                    if _native.crc32c(buf[data_off:data_off + rec.size]) != rec.crc:
                        self._set_aside(seg, rec.off, buf[rec.off:end],
                                        f"{path}@{rec.off}: payload checksum mismatch "
                                        f"(slot {rec.key!r})")
                        continue
                    try:
                        meta = json.loads(rec.meta) if rec.meta else {}
                    except ValueError as e:
                        self._set_aside(seg, rec.off, buf[rec.off:end],
                                        f"{path}@{rec.off}: bad metadata ({e})")
                        continue
                    entry = PackedEntry(rec.key, rec.version, rec.size, rec.crc, path,
                                        rec.length, meta, synced=None, seg=seg, off=rec.off,
                                        data_off=data_off, seq=rec.seq)
                rank = (rec.seq, sid)
                if rec.key not in best or rank > best[rec.key][0]:
                    best[rec.key] = (rank, entry)
            sealed = len(buf) > len(SEG_MAGIC) and buf[len(SEG_MAGIC)] & SEALED
            if end < len(buf) and (sealed or len(buf) - end > MAX_RECORD):
                self._set_aside(seg, end, buf[end:],
                                f"{path}@{end}: unreadable from here on "
                                f"({len(buf) - end} bytes)")
            elif end < len(buf):
                log.info("ssd: %s: %d bytes at its end are not a whole record (an append "
                         "a crash cut short); cut off", path, len(buf) - end)
                try:
                    os.ftruncate(fd, end)
                    os.fdatasync(fd)            # (the cut durable before the seal)
                    seg.size = seg.durable = end
                except OSError as e:
                    log.error("ssd: cannot cut the torn end off %s (%s)", path, e)
            if not sealed:
                _seal(seg)
        for key, ((seq, _sid), entry) in best.items():
            f = found.get(key)
            if f is not None:
                if fseq[key] > seq:
                    continue                    # the file is newer
                log.info("ssd: %s is older than %s's record in %s; removed", f.path,
                         key, "a tombstone" if entry is None else entry.where)
                _unlink(f.path)
                tier._dirty_dirs.add(os.path.dirname(f.path))
                del found[key]
            if entry is not None:
                found[key] = entry
        self.seq = max_seq + 1
        done = []
        for entry in list(found.values()):
            mark = entry.meta.get("moved_from") if isinstance(entry, PackedEntry) else None
            if not isinstance(mark, dict) or "seq" not in mark:
                continue
            try:
                src = found.get(bytes.fromhex(str(mark.get("key", ""))))
            except ValueError:
                continue
            if isinstance(src, PackedEntry) and src is not entry and src.seq == mark["seq"]:
                log.info("ssd: completing a rename a crash interrupted: %r -> %r",
                         src.key, entry.key)
                del found[src.key]
                done.append(src.key)
        if done:
            with tier.write_lock:
                for key in done:
                    self.tombstone(key)
                if self.active is not None:
                    self._fsync(self.active)

    # ---- compaction ----

    def maintain(self) -> int:
        """Compact what needs it (the background writer calls this); returns
        the segments compacted away."""
        now = time.monotonic()
        if not self._changed or now - self._looked < COMPACT_GAP_S:
            return 0
        self._looked = now
        self._changed = False
        with self.tier.write_lock:
            picked = _candidates(self)
            if not picked:
                return 0
            return _compact(self, picked)

    # ---- consistency (SSDTier.check) ----

    def check_all(self, index: dict[bytes, SSDEntry]) -> None:
        """Every packed entry's record is in a live segment and says the
        entry's key, seq, version, size and checksum (payloads not read);
        AssertionError otherwise."""
        for key, e in index.items():
            if not isinstance(e, PackedEntry):
                continue
            assert e.seg is not None and self.segs.get(e.seg.id) is e.seg, \
                f"ssd: {key!r}: its segment {e.path} is not live"
            try:
                rec = parse(e.seg.pread(e.file_bytes, e.off), 0)
            except StaleEntry:
                rec = None
            assert rec is not None and rec.kind == KIND_SLOT, \
                f"ssd: {key!r}: no whole record at {e.where}"
            assert (rec.key, rec.seq, rec.version, rec.size, rec.crc, rec.length) == \
                (key, e.seq, e.version, e.size, e.crc, e.file_bytes), \
                f"ssd: {key!r}: the record at {e.where} says version {rec.version} of " \
                f"{rec.key!r}, the index version {e.version}"
            assert self.recs.get(key, 0) >= 1, f"ssd: {key!r}: record count {self.recs.get(key)}"
            assert e.data_off == e.off + rec.length - rec.size, f"ssd: {key!r}: payload offset"
        for name in os.listdir(self.dir):
            if name.endswith(".seg"):
                sid = int(name[:-4], 16)
                assert sid in self.segs, f"ssd: segment {name} is not open"
        for seg in self.segs.values():
            assert os.path.exists(seg.path), f"ssd: segment {seg.path} is missing"

    def close(self) -> None:
        for seg in self.segs.values():
            seg.retire()
        self.segs.clear()
        self.active = None


# ---------------------------------------------------------------- compaction

def _live(store: "SegmentStore") -> dict[int, int]:
    live: dict[int, int] = {}
    with store.tier.lock:
        for e in store.tier.index.values():
            if isinstance(e, PackedEntry):
                live[e.seg.id] = live.get(e.seg.id, 0) + e.file_bytes
    return live

def _candidates(store: "SegmentStore") -> list[Segment]:
    live = _live(store)
    sealed = [s for s in sorted(store.segs.values(), key=lambda s: s.id)
              if s is not store.active]
    sparse = [s for s in sealed
              if live.get(s.id, 0) < COMPACT_LIVE * (s.size - SEG_HEAD)]
    small = [s for s in sealed if s.size < COMPACT_SMALL and s not in sparse]
    picked = sparse + (small if len(small) >= 2 else [])
    out, total = [], 0
    for s in picked:
        if out and total + live.get(s.id, 0) > SEGMENT_BYTES:
            break
        out.append(s)
        total += live.get(s.id, 0)
    return out

def _compact(store: "SegmentStore", segs: list[Segment]) -> int:
    """Rewrite segs' live records and needed tombstones into one new
    segment (writer lock held); see the module docstring (Compaction)."""
    tier = store.tier
    with tier.lock:
        index = dict(tier.index)
    keep: list[tuple[Segment, _Rec, bytes]] = []
    dead: dict[bytes, int] = {}
    for seg in segs:
        try:
            buf = seg.pread(seg.size, 0)
        except (OSError, StaleEntry) as e:
            log.error("ssd: compaction cannot read %s (%s)", seg.path, e)
            return 0
        own: dict[bytes, int] = {}
        tombs = []
        reached = 0
        for rec in records(buf):
            if rec.kind == KIND_TOMB:
                tombs.append(rec)
                continue
            e = index.get(rec.key)
            if isinstance(e, PackedEntry) and e.seg is seg and e.off == rec.off:
                keep.append((seg, rec, buf[rec.off:rec.off + rec.length]))
                reached += 1
            else:
                own[rec.key] = own.get(rec.key, 0) + 1
        if reached != sum(1 for e in index.values()
                          if isinstance(e, PackedEntry) and e.seg is seg):
            log.error("ssd: %s: an indexed record is past the readable part; "
                      "not compacted", seg.path)
            return 0
        for t in tombs:
            # dropped only when this very segment held the key's last records
            if store.recs.get(t.key, 0) - own.get(t.key, 0) > 0:
                keep.append((seg, t, buf[t.off:t.off + t.length]))
        for k, n in own.items():
            dead[k] = dead.get(k, 0) + n
    sid = store.next_id
    path = os.path.join(store.dir, f"{sid:08x}.seg")
    tmp = path + ".tmp"
    moved: list[tuple[PackedEntry, PackedEntry]] = []
    try:
        fd = open_private(tmp, os.O_RDWR | os.O_EXCL)
    except OSError as e:
        log.error("ssd: compaction cannot create %s (%s)", tmp, e)
        return 0
    try:
        chunks = [SEG_MAGIC + bytes([SEALED]) + bytes(SEG_HEAD - len(SEG_MAGIC) - 1)]
        off = SEG_HEAD
        for seg, rec, data in keep:
            if rec.kind == KIND_SLOT:
                old = index[rec.key]
                new = PackedEntry(old.key, old.version, old.size, old.crc, path,
                                  old.file_bytes, old.meta, synced=True, off=off,
                                  data_off=off + (old.data_off - old.off), seq=old.seq)
                moved.append((old, new))
            chunks.append(data)
            off += len(data)
        out = b"".join(chunks)
        pos = 0
        while pos < len(out):
            pos += os.pwrite(fd, memoryview(out)[pos:], pos)
        os.fsync(fd)
        os.rename(tmp, path)
        _fsync_dir(store.dir)
    except OSError as e:
        os.close(fd)
        _unlink(tmp)
        log.error("ssd: compaction of %s failed (%s)",
                  ", ".join(s.name for s in segs), e)
        return 0
    store.next_id += 1
    new_seg = Segment(sid, path, fd, len(out), synced=True)
    store.segs[sid] = new_seg
    with tier.lock:
        for old, new in moved:
            new.seg = new_seg
            tier.install(new, over=old, write=False)
    for k, n in dead.items():
        left = store.recs.get(k, 0) - n
        if left > 0:
            store.recs[k] = left
        else:
            store.recs.pop(k, None)
    try:
        tier.sync()         # whatever superseded the dropped records is durable
    except OSError as e:
        log.error("ssd: compaction keeps %s: sync failed (%s)",
                  ", ".join(s.name for s in segs), e)
        return 0
    for seg in segs:
        del store.segs[seg.id]
        seg.retire()
        _unlink(seg.path)
        store.compacted_bytes += seg.size
    _fsync_dir(store.dir)
    store.compactions += len(segs)
    log.info("ssd: compacted %d segment(s) into %s (%d bytes, %d records)", len(segs),
             new_seg.name, len(out), len(keep))
    return len(segs)


def _seal(seg: Segment) -> None:
    """Mark seg sealed (no more appends: damage at its end is not a torn
    append).  Not synced: a lost mark only makes a later scan lenient."""
    try:
        os.pwrite(seg.fd, bytes([SEALED]), len(SEG_MAGIC))
    except OSError as e:
        log.warning("ssd: cannot mark %s sealed (%s)", seg.path, e)

