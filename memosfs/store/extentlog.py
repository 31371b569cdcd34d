"""Extent logs: a large slot's changes appended beside its file.

A version that differs from the version the SSD tier holds in a few
extents (the C core says which: `Ref.changes()`) is written back as a
record appended to the slot's log, `<name>.log` beside `<name>.slot`,
instead of a whole new file (docs/ssd-format.md, "Extent logs").  The
slot file (the base) is never touched by an append; the log is folded —
the whole version written as a new file, renamed over the base, then the
log unlinked — when it would grow past LOG_FOLD_SHARE of the slot or
LOG_MAX_RECORDS records.

Format:

    log       [0, 16)    "MEMOSXL1", 8 reserved bytes (zero)
              [16, ...)  records, back to back
    record    [0, 80)    magic "MXRC", flags u32 (0), the base file's seq u64
                         (its trailer's "seq": which file the log belongs to),
                         the version it applies to: version u64, size u64,
                         crc32c u32;
                         the version it makes: version u64, size u64, crc32c
                         u32 (of the whole version's bytes); cut u64, runs
                         u32, meta length u32, payload crc32c u32, header
                         crc32c u32 (over the 76 bytes before it, the runs
                         table and the meta)
              then       runs table: (offset u64, length u64) per run
                         meta (JSON: owner, mode, times, xattrs, seq)
                         payload: the runs' bytes, in the table's order

The record's version is the one it applies to cut to `cut` bytes, zeros up
to `size`, then each run's bytes at its offset.  The first record applies
to the base file's version; each later one to the version the record
before it made.  A log whose first record names another base file (its
seq) or another version than its base's is an old one (a crash between a
fold's rename and the log's unlink) and is removed.

This module parses and encodes; memosfs/store/ssd/logged.py owns the files.
"""

from __future__ import annotations

import bisect
import json
import os
import struct
from dataclasses import dataclass
from typing import Any, Callable, Optional

from memosfs import _native

LOG_MAGIC = b"MEMOSXL1"
LOG_HEAD = 16
REC_MAGIC = b"MXRC"
# magic flags bseq bver bsize bcrc ver size crc cut nruns mlen pcrc
_REC = struct.Struct("<4sIQQQIQQIQIII")
_HCRC = struct.Struct("<I")
REC_HEAD = _REC.size + _HCRC.size        # 80
_RUN = struct.Struct("<QQ")
MAX_RUNS = 1 << 20

# A write-back appends to the log only while: the changed bytes are at most
# LOG_RUN_SHARE of the new version, the log (after the append) is at most
# LOG_FOLD_SHARE of the version's size, and it holds fewer than
# LOG_MAX_RECORDS records.  Otherwise the version is written whole (the log,
# if any, folded away).
LOG_RUN_SHARE = 0.25
LOG_FOLD_SHARE = 0.5
LOG_MAX_RECORDS = 256

ZERO, BASE, LOG = 0, 1, 2               # where an extent's bytes are


class BadRecord(Exception):
    """A log record that does not check out; `torn`: the log ends inside it
    (an append a crash cut short), else its bytes are wrong."""

    def __init__(self, why: str, torn: bool) -> None:
        super().__init__(why)
        self.torn = torn


@dataclass(frozen=True)
class LogRecord:
    off: int                    # the record's offset in the log
    length: int                 # its bytes, header to payload's end
    data_off: int               # its payload's offset in the log
    base_seq: int               # the base file's seq
    base: tuple[int, int, int]  # (version, size, crc) it applies to
    version: int
    size: int
    crc: int
    cut: int
    runs: tuple[tuple[int, int], ...]
    meta: dict[str, Any]

    @property
    def made(self) -> tuple[int, int, int]:
        return (self.version, self.size, self.crc)


@dataclass(frozen=True)
class SlotLog:
    """A slot's log as an index entry sees it: its file and the records
    from the base through the entry's version (appends after this entry was
    made are not this entry's)."""
    path: str
    ino: int
    length: int                 # bytes through the last record
    base: tuple[int, int, int]  # the base file's (version, size, crc)
    base_seq: int               # the base file's seq
    base_bytes: int             # the base's file bytes (payload + trailer)
    base_bare: bool
    records: tuple[LogRecord, ...]

    def extents(self) -> list[tuple[int, int, int, int]]:
        return extents(self.base[1], self.records)


def log_path_of(slot_path: str) -> str:
    """The log beside a slot file."""
    assert slot_path.endswith(".slot")
    return slot_path[:-5] + ".log"


def header() -> bytes:
    return LOG_MAGIC + bytes(LOG_HEAD - len(LOG_MAGIC))


def encode(base_seq: int, base: tuple[int, int, int], version: int, size: int, crc: int, cut: int,
           runs: list[tuple[int, int]], payload: bytes, meta: dict[str, Any]) -> bytes:
    """A record (header, runs table, meta, payload)."""
    m = json.dumps(meta, separators=(",", ":"), sort_keys=True).encode()
    table = b"".join(_RUN.pack(o, n) for o, n in runs)
    fixed = _REC.pack(REC_MAGIC, 0, base_seq, base[0], base[1], base[2], version, size, crc, cut,
                      len(runs), len(m), _native.crc32c(payload))
    hcrc = _native.crc32c(fixed + table + m)
    return fixed + _HCRC.pack(hcrc) + table + m + payload


def parse(buf: bytes, off: int, check_payload: bool = True) -> LogRecord:
    """The record at buf[off:]; BadRecord says what does not check out."""
    left = len(buf) - off
    if left < REC_HEAD:
        if buf[off:] == bytes(left) or buf[off:off + 4] == REC_MAGIC[:min(4, left)]:
            raise BadRecord(f"{left} bytes, not a whole record header", torn=True)
        raise BadRecord("bytes that are not a record", torn=False)
    (magic, _flags, bseq, bver, bsize, bcrc, version, size, crc, cut, nruns, mlen,
     pcrc) = _REC.unpack_from(buf, off)
    if magic != REC_MAGIC:
        torn = buf[off:] == bytes(left)         # a tail of zeros: an append cut short
        raise BadRecord("no record magic", torn=torn)
    if nruns > MAX_RUNS or mlen > (1 << 24):
        raise BadRecord(f"a header that does not check out ({nruns} runs)", torn=False)
    hlen = REC_HEAD + _RUN.size * nruns + mlen
    if hlen > left:
        raise BadRecord(f"{left} bytes, the record's header needs {hlen}", torn=True)
    (hcrc,) = _HCRC.unpack_from(buf, off + _REC.size)
    head = bytes(buf[off:off + _REC.size]) + bytes(buf[off + REC_HEAD:off + hlen])
    if _native.crc32c(head) != hcrc:
        raise BadRecord("header checksum mismatch", torn=False)
    runs = []
    pos = off + REC_HEAD
    total = 0
    end_prev = 0
    for _ in range(nruns):
        o, n = _RUN.unpack_from(buf, pos)
        pos += _RUN.size
        if n == 0 or o < end_prev or o + n > size:
            raise BadRecord(f"a run ({o}, {n}) out of order or past the size {size}",
                            torn=False)
        end_prev = o + n
        runs.append((o, n))
        total += n
    if cut > bsize or cut > size:
        raise BadRecord(f"cut {cut} past a size ({bsize}, {size})", torn=False)
    try:
        meta = json.loads(bytes(buf[pos:pos + mlen])) if mlen else {}
    except ValueError as e:
        raise BadRecord(f"bad metadata ({e})", torn=False) from None
    pos += mlen
    if pos + total > len(buf):
        raise BadRecord(f"{len(buf) - off} bytes, the record needs {pos + total - off}",
                        torn=True)
    if check_payload and _native.crc32c(bytes(buf[pos:pos + total])) != pcrc:
        raise BadRecord("payload checksum mismatch", torn=False)
    return LogRecord(off, pos + total - off, pos, bseq, (bver, bsize, bcrc), version, size, crc,
                     cut, tuple(runs), meta if isinstance(meta, dict) else {})


def extents(base_size: int, records: tuple[LogRecord, ...] | list[LogRecord]
            ) -> list[tuple[int, int, int, int]]:
    """Where each byte of the last record's version is: sorted, contiguous
    (start, end, ZERO|BASE|LOG, offset in the base or the log)."""
    ext: list[tuple[int, int, int, int]] = [(0, base_size, BASE, 0)] if base_size else []
    for r in records:
        ext = _clip(ext, r.cut)
        if r.size > r.cut:
            ext.append((r.cut, r.size, ZERO, 0))
        pos = r.data_off
        for o, n in r.runs:
            ext = _overlay(ext, o, o + n, pos)
            pos += n
    return ext


def _clip(ext: list, end: int) -> list:
    out = []
    for s, e, src, so in ext:
        if s >= end:
            break
        out.append((s, min(e, end), src, so))
    return out


def _overlay(ext: list, a: int, b: int, pos: int) -> list:
    out = []
    placed = False
    for s, e, src, so in ext:
        if e <= a or s >= b:
            if s >= b and not placed:
                out.append((a, b, LOG, pos))
                placed = True
            out.append((s, e, src, so))
            continue
        if s < a:                               # the part before the run
            out.append((s, a, src, so))
        if not placed:
            out.append((a, b, LOG, pos))
            placed = True
        if e > b:                               # the part after it
            out.append((b, e, src, so + (b - s) if src != ZERO else 0))
    if not placed:
        out.append((a, b, LOG, pos))
    return out


def read_extents(ext: list, base_fd: int, log_fd: int, off: int, n: int) -> bytes:
    """Bytes [off, off+n) of a version by its extents."""
    return read_view(ext, {BASE: base_fd, LOG: log_fd}, off, n)


def crc_extents(ext: list, base_fd: int, log_fd: int, size: int) -> int:
    """The crc32c of a whole version read by its extents."""
    return crc_view(ext, {BASE: base_fd, LOG: log_fd}, 0, size)


def _pieces(ext: list[tuple[int, int, int, int]], off: int, end: int):
    """(source, offset there, length) of bytes [off, end) by extents."""
    i = bisect.bisect_right(ext, (off, 1 << 63)) - 1
    for s, e, src, so in ext[max(i, 0):]:
        if e <= off:
            continue
        if s >= end:
            break
        a, b = max(s, off), min(e, end)
        yield src, (0 if src == ZERO else so + (a - s)), b - a


def read_view(ext: list[tuple[int, int, int, int]], fds: dict[int, int],
              off: int, n: int) -> bytes:
    """Bytes [off, off+n) of a version by its extents (sources in fds)."""
    out = bytearray()
    for src, at, want in _pieces(ext, off, off + n):
        if src == ZERO:
            out += bytes(want)
            continue
        got = os.pread(fds[src], want, at)
        if len(got) != want:
            raise OSError(5, f"short read ({len(got)} of {want})")
        out += got
    return bytes(out)


def crc_view(ext: list[tuple[int, int, int, int]], fds: dict[int, int],
             off: int, end: int) -> int:
    """The crc32c of bytes [off, end) by extents: file pieces in C without
    the GIL (their holes not read), zeros arithmetically."""
    crc = 0
    for src, at, n in _pieces(ext, off, end):
        if src == ZERO:
            crc = _native.crc32c_zeros(n, crc)
        else:
            crc = _native.crc32c_file(fds[src], at, n, crc)
    return crc


DELTA_CRC_MAX = 64 << 20        # crc_after_runs reads at most this many bytes of runs


def crc_after_runs(base_crc: int, base_size: int, size: int, runs: list[tuple[int, int]],
                   read_old: Callable[[int, int], bytes], read_new: Callable[[int, int], bytes]
                   ) -> Optional[int]:
    """The crc32c of a version that is a base version (base_crc over
    base_size bytes, all kept: no cut) with zeros to `size` (>= base_size)
    and then `runs` (offset, length; sorted, disjoint) of new bytes, from
    the base's crc and the runs alone: a CRC is affine over GF(2), so for
    messages of one length crc(A ^ B) = crc(A) ^ crc(B) ^ crc(zeros).  A is
    the base with zeros to the size (its crc: the base's continued over the
    zeros), B the runs' new bytes XOR A's there and zeros elsewhere.
    read_old(off, n) gives the base's bytes (off + n <= base_size),
    read_new(off, n) the new version's.  None when the runs are more than
    DELTA_CRC_MAX bytes (reading the whole version is then as cheap)."""
    if size < base_size or sum(n for _o, n in runs) > DELTA_CRC_MAX:
        return None
    crc_b, pos = 0, 0
    for o, n in runs:
        crc_b = _native.crc32c_zeros(o - pos, crc_b)
        new = read_new(o, n)
        old = read_old(o, min(o + n, base_size) - o) if o < base_size else b""
        x = (int.from_bytes(old, "little") ^ int.from_bytes(new, "little")).to_bytes(
            n, "little")
        crc_b = _native.crc32c(x, crc_b)
        pos = o + n
    crc_b = _native.crc32c_zeros(size - pos, crc_b)
    crc_a = _native.crc32c_zeros(size - base_size, base_crc)
    return crc_a ^ crc_b ^ _native.crc32c_zeros(size, 0)


def scan_log(buf: bytes, base_seq: int, base: tuple[int, int, int]
             ) -> tuple[Optional[list[LogRecord]], int, Optional[BadRecord]]:
    """The records of a log read whole (buf) that chain from base: (None, 0,
    None) when the log is an old one (its first record names another base
    file or applies to another version); else (records, the offset where they end, the BadRecord that
    stopped the walk or None)."""
    if len(buf) < LOG_HEAD:
        return [], len(buf), (BadRecord("a log shorter than its header", torn=True)
                              if len(buf) else None)
    if buf[:len(LOG_MAGIC)] != LOG_MAGIC:
        return [], 0, BadRecord("not a log (no magic)", torn=False)
    recs: list[LogRecord] = []
    off, cur = LOG_HEAD, base
    while off < len(buf):
        try:
            r = parse(buf, off)
        except BadRecord as bad:
            return recs, off, bad
        if r.base != cur or r.base_seq != base_seq:
            if not recs:
                return None, 0, None
            return recs, off, BadRecord(f"a record applying to version {r.base[0]}, "
                                        f"not {cur[0]}", torn=False)
        recs.append(r)
        cur = r.made
        off += r.length
    return recs, off, None
