"""The kind "logged": a slot file and its extent log (memosfs/store/extentlog.py).

A large slot's write-back that changed a few extents of the version its
file holds (`Ref.changes()`) appends them to the slot's extent log beside
the file (`<name>.log`, `SSDEntry.log`) instead of writing a new file; the
log is folded (the whole version written as whole.py writes one, then the
log unlinked) when it grows.  The file is never changed in place, so a
crash leaves the log ending before the new record or inside it (cut at
mount): the version before or the new one.  A fold's rename is fsync'd
before its log's unlink, since the base without its log is an older
version (a crash before the unlink leaves an old log, removed at mount).

LoggedFiles is WholeFiles (a logged version is in a slot file too) with
the operations the log changes: reads by the version's extents, a rename
or new metadata that folds the log into the copy (or, for metadata, a
record with no runs), the log's fsync, the check of its records.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import mmap
import os
from typing import Any, Optional

from memosfs import _native
from memosfs.private import open_private
from memosfs.store import extentlog as _extentlog
from memosfs.store import spill as _spill
from memosfs.store.ssd.fileio import _copy_between, _discard, _fsync_dir, _fsync_path, \
    _pwrite_all
from memosfs.store.ssd.format import CorruptSlot, SSDEntry, StaleEntry, open_entry, \
    read_trailer
from memosfs.store.ssd.whole import WholeFiles

log = logging.getLogger("memosfs.store.ssd")

# An overlay draft (spill.py) published as a log record reads its runs into
# memory: at most this many bytes of them (more: published whole)
OVERLAY_PAYLOAD_MAX = 64 << 20


class LoggedFiles(WholeFiles):
    """The operations on slot files with an extent log, and the appends
    that give a file one (`tier`: SSDTier)."""

    # ---- appends (the tier's writer lock held) ----

    def plan(self, ref: "_native.Ref", current: Optional[SSDEntry]
             ) -> Optional[tuple[int, list[tuple[int, int]]]]:
        """(cut, runs) when ref's version is best written back as a record
        appended to current's extent log: the C core knows how it differs
        from the version the tier holds (Ref.changes), that version is a slot
        file of this daemon's (not packed, its seq known), the new version is
        not packed either, and the changed bytes and the log stay small
        (extentlog.LOG_*).  None: write it whole (folding a log away)."""
        changes = getattr(ref, "changes", None)
        if changes is None or current is None or current.base_ident is None \
                or self.tier.segs.packs(ref.size):
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

    def crc_after(self, current: SSDEntry, ref: Any, cut: int,
                  runs: list[tuple[int, int]]) -> Optional[int]:
        """ref's crc32c from current's (the version it changes, in its slot
        file) and the record's runs (extentlog.crc_after_runs), reading only
        the runs' bytes of both; None where a cut into current or a file
        that cannot be opened leaves reading ref whole."""
        if cut < current.size:
            return None
        try:
            ext, fds = self.tier.kind_of(current).view(current)
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

    def append(self, ref: Any, current: SSDEntry, meta: dict[str, Any], durable: bool,
               crc: int, cut: int, runs: list[tuple[int, int]],
               payload: Optional[bytes] = None) -> SSDEntry:
        """Append a record making ref's version (ref.version, ref.size, crc:
        current's bytes cut to `cut`, zeros to ref.size, then `runs` of ref)
        to current's extent log, creating the log if current has none.  The
        slot file is not touched: a crash leaves the log ending before the
        record, or inside it (cut off at mount), so the key has current's
        version or the new one.  durable: the log (and the slot file, if it
        may not be yet) fsync'd before this returns."""
        tier = self.tier
        key = current.key
        if payload is None:
            payload = b"".join(ref.read(o, n) for o, n in runs)
        if len(payload) != sum(n for _o, n in runs):
            raise OSError(errno.EIO, f"short read of {key!r}")
        stamped = tier.segs.stamp(meta)
        lg = current.log
        rec = _extentlog.encode(current.fseq, (current.version, current.size, current.crc),
                                ref.version, ref.size, crc, cut, runs, payload, stamped)
        fresh = lg is None
        lpath = _extentlog.log_path_of(current.path)
        start = lg.length if lg else 0
        data = (_extentlog.header() if fresh else b"") + rec
        tier._check_room(key, current.file_bytes + len(data))
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
                    tier._hook("appended")
                    if durable:
                        os.fsync(fd)
                        if current.synced is not True:
                            _fsync_path(current.path)
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
            tier._write_failed(e)
        tier.trouble = None
        off = start + (_extentlog.LOG_HEAD if fresh else 0)
        r = _extentlog.parse(rec, 0, check_payload=False)
        r = dataclasses.replace(r, off=off, data_off=off + r.data_off)
        slog = _extentlog.SlotLog(
            lpath, ino, off + len(rec),
            lg.base if lg else (current.version, current.size, current.crc), current.fseq,
            lg.base_bytes if lg else current.file_bytes, current.bare,
            (lg.records if lg else ()) + (r,))
        entry = SSDEntry(key, ref.version, ref.size, crc, current.path,
                         current.file_bytes + len(data), dict(meta), synced=durable,
                         ino=current.ino, bare=current.bare, fseq=current.fseq, log=slog)
        with tier.lock:
            tier.install(entry, wrote=len(data))
            tier.log_appends += 1
        if fresh:
            if durable:
                _fsync_dir(sdir)
            else:
                with tier.lock:
                    tier._dirty_dirs.add(sdir)
        return entry

    def put_overlay(self, key: bytes, sp: "_spill.SpillDraft", meta: dict[str, Any],
                    version: int, crc: int) -> Optional[SSDEntry]:
        """SSDTier.put_overlay: an overlay draft (spill.py) published as key's
        version `version` by one record appended to the slot's extent log:
        its base cut to sp.cut, zeros to sp.size, then sp.runs() (the bytes
        written since), like a write-back of a version whose changes the C
        core knows (`plan`'s limits; its payload read into memory, so at
        most OVERLAY_PAYLOAD_MAX).  None when it is not: the base is no
        longer key's version here, or the runs or the log are too large
        (the caller then publishes the draft whole).  SSDFull as put_file."""
        tier = self.tier
        with tier.write_lock:
            current = tier.get(key)
            size = sp.size
            if current is None or current.base_ident is None or tier.segs.packs(size) \
                    or sp.base_ident != current.base_ident:
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
            entry = self.append(_Made(key, version, size), current, meta, False, crc,
                                sp.cut, runs, payload)
            # the version is read from the slot's files from now on (its
            # spill file and its base's descriptors go: no chain of them)
            try:
                sp.adopt(self.view(entry))
            except OSError as e:
                log.warning("ssd: %s: its new version is read from its spill file (%s)",
                            entry.path, e)
            return entry

    def drop_log(self, entry: SSDEntry, sdir: str, fold: bool,
                 dir_synced: bool = False) -> bool:
        """A file was renamed over the base of entry's log: the folder is
        fsync'd (the rename durable) before the log goes, since the base
        without its log is an older version (fold: a fold, counted).  A crash
        before the unlink leaves an old log, removed at mount."""
        tier = self.tier
        if fold:
            tier._hook("folded")
        if not dir_synced:
            _fsync_dir(sdir)
        _discard(entry.log.path)
        with tier.lock:
            if fold:
                tier.folds += 1
            tier._dirty_dirs.add(sdir)
        return True

    # ---- reads ----

    def load_from(self, entry: SSDEntry, fd: int, draft: "_native.Draft") -> None:
        """The slot file's bytes and the records' runs into the draft, by the
        version's extents."""
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

    def prefetch(self, entry: SSDEntry) -> None:
        super().prefetch(entry)
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

    def backing(self, entry: SSDEntry) -> Optional[int]:
        return None                     # (its file alone is an older version)

    def reader(self, entry: SSDEntry) -> "LoggedReader":
        return LoggedReader(entry)

    def view(self, entry: SSDEntry) -> tuple[list, dict[int, int]]:
        fd = open_entry(entry)
        try:
            lfd = _open_log(entry.log)
        except BaseException:
            os.close(fd)
            raise
        return entry.log.extents(), {_extentlog.BASE: fd, _extentlog.LOG: lfd}

    def materialize(self, entry: SSDEntry, src: int, dst: int) -> None:
        """entry's version into dst at offset 0 (holes kept), from its slot
        file (src) and its extent log; dst is entry.size long afterwards."""
        lg = entry.log
        lfd = _open_log(lg)
        try:
            for s, e, where, so in lg.extents():
                if where != _extentlog.ZERO:
                    _copy_between(src if where == _extentlog.BASE else lfd, dst, so, s, e - s)
        finally:
            os.close(lfd)
        os.ftruncate(dst, entry.size)

    def copy_for_rename(self, entry: SSDEntry, src: int, dst: int) -> None:
        self.materialize(entry, src, dst)       # (the log folded into the copy)

    # ---- damage ----

    def report_locked(self, entry: SSDEntry, why: str) -> bool:
        """report_corrupt of a version with an extent log (writer lock held,
        the index still points at entry): its slot file and log are read
        again, by the base's trailer, the records and the whole version's
        crc32c; if they fail, both are set aside."""
        tier = self.tier
        try:
            try:
                fd = open_entry(entry)
            except StaleEntry:
                log.error("ssd: %s: the file of %r vanished (%s)", entry.path, entry.key, why)
                tier._forget(entry)
                return False
            try:
                _check_logged(entry, fd)
            finally:
                os.close(fd)
            log.warning("ssd: %s checks out when read again (%s before)", entry.path, why)
            return False
        except (CorruptSlot, OSError) as e:
            why = str(e)
        tier._forget(entry)
        tier._set_aside(entry.path, why)
        try:
            os.replace(entry.log.path, os.path.join(tier.corrupt_dir,
                                                    os.path.basename(entry.log.path)))
        except OSError:
            _discard(entry.log.path)
        return True

    # ---- metadata (the writer lock held) ----

    def rewrite_meta(self, entry: SSDEntry, meta: dict[str, Any]) -> Optional[SSDEntry]:
        """A record with no runs (the same version, the new metadata) rather
        than a copy of the slot, unless the kernel reads the files itself
        (passthrough: a slot with a log is not handed to it, so the log is
        folded: WholeFiles.rewrite_meta with this kind's materialize)."""
        lg = entry.log
        if self.tier.write_bare is not True and len(lg.records) < _extentlog.LOG_MAX_RECORDS:
            return self.append(_SameVersion(entry), entry, meta, entry.synced is not False,
                               entry.crc, entry.size, [], b"")
        return super().rewrite_meta(entry, meta)

    # ---- durability and consistency ----

    def fsync_more(self, entry: SSDEntry) -> bool:
        try:                                    # the records appended since
            _fsync_path(entry.log.path)
        except FileNotFoundError:
            return False                        # folded or removed meanwhile
        return True

    def check_found(self, e: SSDEntry, found: SSDEntry, files: set[str]) -> SSDEntry:
        files.discard(e.log.path)
        return _check_log_file(e, found)

    def stats(self, index: dict[bytes, SSDEntry]) -> dict[str, int]:
        """The SSDStats fields of the logs (the tier's lock held)."""
        logs = [e.log for e in index.values() if e.log is not None]
        return {"ssd_logs": len(logs), "ssd_log_bytes": sum(lg.length for lg in logs)}

    # ---- at mount ----

    def attach(self, found: dict[bytes, SSDEntry], logs: list[str]) -> list[SSDEntry]:
        """Each extent log with its slot file (found entries change to the
        version the log's records make); a log without its slot file, or an
        old one (its records name another base file or version: a crash
        between a fold's rename and the log's unlink), is removed; a torn tail
        (an append a crash cut short) is cut off; a record that fails its
        checks is copied into corrupt/ (ssd_corrupt) and cut off with all that
        follows, so the slot is the version before it.  Returns the entries
        with a log."""
        tier = self.tier
        by_path = {e.path: e for e in found.values()}
        out = []
        for lpath in logs:
            base = by_path.get(lpath[:-4] + ".slot")
            if base is None or not base.fseq:
                log.info("ssd: %s: an extent log without its slot file; removed", lpath)
                _discard(lpath)
                tier._dirty_dirs.add(os.path.dirname(lpath))
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

    def superseded(self, found: dict[bytes, SSDEntry], with_log: list[SSDEntry]) -> None:
        """After the scan: the logs of those of with_log (`attach`) that are
        no longer their key's entry (a newer packed record won, the file
        went) go too."""
        for entry in with_log:
            if found.get(entry.key) is not entry:
                _discard(entry.log.path)

    def _read_log(self, base: SSDEntry, lpath: str) -> SSDEntry:
        """base's entry with the records of its log (see attach)."""
        tier = self.tier
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
                tier._set_aside_bytes(f"{os.path.basename(lpath)}@{end}", buf[end:],
                                      f"{lpath}@{end}: {bad} (the slot is the version "
                                      f"before it)")
            if not recs:
                _discard(lpath)
                tier._dirty_dirs.add(os.path.dirname(lpath))
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


class _Made:
    """The version an overlay's record makes, as `append` reads a Ref."""

    live = True

    def __init__(self, key: bytes, version: int, size: int) -> None:
        self.key, self.version, self.size = key, version, size


class _SameVersion:
    """A record of entry's very version (rewrite_meta appends one, runs
    none, to give a logged version new metadata)."""

    def __init__(self, entry: SSDEntry) -> None:
        self.version, self.size = entry.version, entry.size


class LoggedReader:
    """SSDReader's part for a slot file with an extent log: both
    descriptors and the version's extents, the whole version's crc32c
    checked."""

    def __init__(self, entry: SSDEntry) -> None:
        self.entry = entry
        self.fd: Optional[int] = open_entry(entry)     # StaleEntry: look again
        self.lfd: Optional[int] = None
        try:
            self.lfd = _open_log(entry.log)
            self.ext = entry.log.extents()
            if _extentlog.crc_extents(self.ext, self.fd, self.lfd, entry.size) != entry.crc:
                raise CorruptSlot(f"{entry.path}: payload checksum mismatch (with "
                                  f"its extent log)")
        except BaseException:
            self.release()
            raise

    def read(self, off: int, n: int) -> bytes:
        if self.fd is None:
            raise ValueError("reference was released")
        if n <= 0:
            return b""
        return _extentlog.read_extents(self.ext, self.fd, self.lfd, off, n)

    def overlay_base(self) -> Optional["_spill.BaseView"]:
        ident = self.entry.base_ident
        if self.fd is None or ident is None:
            return None
        assert self.lfd is not None
        return _spill.dup_view(ident, {_extentlog.BASE: self.fd, _extentlog.LOG: self.lfd},
                               self.ext)

    def plain_fd(self) -> Optional[int]:
        return None                     # (its bytes are the file's and the log's)

    def release(self) -> None:
        for name in ("fd", "lfd"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)


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
