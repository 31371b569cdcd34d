"""The format of a slot file (docs/ssd-format.md, "Slot files"), the index
entry every kind of version shares (SSDEntry), and the errors of the tier.

A slot file is payload-only (`SSDEntry.bare`, what this code writes):

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
A file that ends before the end its layout gives it is `TornSlot` (what a
power loss leaves of a write-back renamed into place unsynced, or a file
truncated: the tier's scan tells which, tier.py); any other failure is
`CorruptSlot`.

Imports memosfs._native and extentlog (an entry's log) only: every other
module of the tier imports this one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Optional

from memosfs import _native
from memosfs.store import extentlog as _extentlog

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


class SSDFull(OSError):
    """The SSD tier is over ssd_capacity by `excess` bytes (room can be made)."""

    def __init__(self, excess: int) -> None:
        super().__init__(errno.ENOSPC, f"ssd tier {excess} bytes over ssd_capacity")
        self.excess = excess


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
    # (written by this daemon without an fsync: see WholeFiles.write),
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


    @property
    def kind(self) -> str:
        """Which module's operations apply (the tier's one table of kinds,
        tier.py): "file" (the slot file alone: whole.py), "logged" (the
        file and its extent log: logged.py); a packed record is "packed"
        (packed.py)."""
        return "file" if self.log is None else "logged"

    @property
    def base_ident(self) -> Optional[tuple[int, int, int, int]]:
        """(seq, version, size, crc) by which an extent log record or an
        overlay draft (spill.py) names this version as its base; None where
        nothing can be based on it (a file of an older memosfs, without a
        seq; a packed record)."""
        return (self.fseq, self.version, self.size, self.crc) if self.fseq else None


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



def _int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0



def _trailer_bound(key: bytes, meta: dict[str, Any]) -> int:
    """The bytes a trailer for key and meta takes (the room check's estimate)."""
    return _FIXED.size + len(key) + len(json.dumps(meta, separators=(",", ":"))) \
        + _FOOTER.size



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

