"""The kind "file": a slot version that is one slot file alone (format.py),
written whole to a temporary name in its shard folder and renamed over the
key's file.

Crash safety: a version is written to a temporary name in the same folder,
fsync'd, then renamed over the old file, so after a crash at any point the
name holds either the old version or the new one, never a mix (the
attribute is set on the temporary file before its fsync and rename, so
each version is self-describing).  The file is fsync'd before its rename
when the caller needs it durable, or when it replaces a version that may
be; a write-back nobody acknowledged is fsync'd by the tier's next `sync`.
A durable write (fsync of a slot, flush, unmount) also fsyncs the folder,
so the rename itself survives.  A slot renamed to another key is copied
under the new key's name (renamed over whatever file that key had: never
removed first), its folder fsync'd, and only then is the old key's file
removed: at every point one of the two names holds it (a crash between
leaves both; the scan completes the rename, `complete_renames`).

A payload-only file handed to the kernel as a passthrough backing file
(`backing`) is not read by the daemon on every read: its whole payload is
read and checked the first time this daemon opens that file's version so
(the pages stay in the page cache for the reader that follows), and later
opens of the same file skip the check.

WholeFiles holds the operations every kind has (tier.py's table): write,
load_into, prefetch, report_corrupt, rename, rewrite_meta, fsync, check,
view and a reader; logged.py builds on them for a file with an extent log.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
from typing import Any, Optional

from memosfs import _native
from memosfs.private import open_private
from memosfs.store import extentlog as _extentlog
from memosfs.store import spill as _spill
from memosfs.store.ssd.fileio import (_copy_range, _copy_sparse, _discard, _fsync_dir,
                                      _pwrite_all)
from memosfs.store.ssd.format import (_ATTR_REFUSED, FLAG_BARE, XATTR, CorruptSlot,
                                      SSDEntry, StaleEntry, _check_payload, _encode, _int,
                                      _meta_bytes, _trailer_bound, open_entry, read_trailer)

log = logging.getLogger("memosfs.store.ssd")

# Write payload-only files (the trailer in XATTR).  False writes the trailer
# layout every file had before (tests use it to make an older folder).
WRITE_BARE = True
VERIFIED_FILES = 8192                     # backing's cache of checked files

class WholeFiles:
    """The operations on slot files of one tier (`tier`: SSDTier)."""

    FILE = True                 # a version in a slot file (a tombstone before it goes)
    RESIDENT = False            # never read on the event loop (reads.get_resident)

    def __init__(self, tier: Any) -> None:
        self.tier = tier

    # ---- writes (the tier's writer lock held) ----

    def write(self, ref: "_native.Ref", key: bytes, meta: dict[str, Any], durable: bool,
              crc: int) -> SSDEntry:
        """Write ref's bytes as `key`'s version, atomically replacing the file
        key had."""
        tier = self.tier
        size = ref.size
        # (its seq orders it with packed records: packed.py)
        stamped = tier.segs.stamp(meta)
        sdir, final = tier._path_of(key)
        tier._shard_dir(sdir)
        tmp = tier._tmp_path(sdir, key)
        # The file is fsync'd before its rename when the caller needs it
        # durable, or when it replaces a version that may be (an
        # acknowledged version is never replaced by bytes a power loss could
        # take).  Otherwise (write-back of a version nobody acknowledged:
        # eviction, the background writer, with no durable file under the
        # name) the kernel writes it back in its own time, and `sync` or
        # `sync_key` fsyncs it when it must be durable; a power loss before
        # then can leave it torn: cut short (the scan sets it aside, tier.py)
        # or torn inside, which its crc32c tells at load (a version nobody
        # acknowledged may be lost, never served torn).
        old = tier.get(key)
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
                total, bare = self.finish(fd, key, ref.version, size, crc, stamped)
                if sync_now:
                    os.fsync(fd)
                ino = os.fstat(fd).st_ino
            finally:
                os.close(fd)
            entry = SSDEntry(key, ref.version, size, crc, final, total, dict(meta),
                             synced=sync_now, ino=ino, bare=bare, fseq=stamped["seq"])
            with tier.lock:
                # the file and the index entry change together (see tier.py:
                # a reader never pairs one with the other's)
                os.rename(tmp, final)
                tier._hook("renamed")
                old = tier.install(entry, wrote=data_bytes)
        except OSError as e:
            _discard(tmp)
            tier._write_failed(e)
        tier.trouble = None
        self.replaced(old, sdir, durable, fold=True)
        return entry

    def replaced(self, old: Optional[SSDEntry], sdir: str, durable: bool,
                 fold: bool) -> None:
        """A file was renamed over old's (old: what the index held): the
        folder fsync'd when durable, else left for the next sync; old's
        extent log, if any, goes after the rename is durable (logged.py)."""
        if old is not None and self.tier.kind_of(old).drop_log(old, sdir, fold):
            return
        if durable:
            _fsync_dir(sdir)
        else:
            with self.tier.lock:
                self.tier._dirty_dirs.add(sdir)

    def drop_log(self, entry: SSDEntry, sdir: str, fold: bool,
                 dir_synced: bool = False) -> bool:
        """A file was renamed over entry's: its extent log goes (logged.py);
        True if it did (the folder fsync'd first)."""
        return False                    # (no log)

    def put_file(self, key: bytes, fd: int, path: str, size: int, meta: dict[str, Any],
                 version: int, durable: bool, crc: int) -> SSDEntry:
        """SSDTier.put_file of a version that is not packed: the file at
        `path` finished as `write` finishes its temporary file, fsync'd
        under the same rule, renamed into the slot's place."""
        tier = self.tier
        stamped = tier.segs.stamp(meta)
        sdir, final = tier._path_of(key)
        old = tier.get(key)
        sync_now = durable or (old is not None and old.maybe_durable)
        try:
            tier._shard_dir(sdir)
            try:
                total, bare = self.finish(fd, key, version, size, crc, stamped)
                if sync_now:
                    os.fsync(fd)
                st = os.fstat(fd)
                written = min(size, st.st_blocks * 512)     # (its holes: none)
                entry = SSDEntry(key, version, size, crc, final, total, dict(meta),
                                 synced=sync_now, ino=st.st_ino, bare=bare,
                                 fseq=stamped["seq"])
                with tier.lock:
                    os.rename(path, final)
                    tier._hook("renamed")
                    old = tier.install(entry, wrote=written)
            except BaseException:
                # the draft goes on as it was: its bytes alone
                try:
                    os.ftruncate(fd, size)
                    os.removexattr(fd, XATTR)
                except OSError:
                    pass
                raise
        except OSError as e:
            tier._write_failed(e)
        tier.trouble = None
        # (the log of the version this replaces goes: not counted as a fold)
        self.replaced(old, sdir, durable, fold=False)
        return entry

    def finish(self, fd: int, key: bytes, version: int, size: int, crc: int,
               meta: dict[str, Any]) -> tuple[int, bool]:
        """Give a temporary slot file whose payload is written (bytes [0,
        size), holes allowed) its trailer: in its XATTR attribute, the file
        the payload alone, or where the file system refuses the attribute,
        after the payload (the trailer layout; logged once for each reason).
        Before the file's fsync and rename, so each version under the name is
        whole and self-describing.  Returns (file_bytes, bare)."""
        m = _meta_bytes(meta)
        if WRITE_BARE and self.tier.write_bare is not False and self.tier._attrs_ok:
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
        tier = self.tier
        if code in (errno.ENOTSUP, errno.EOPNOTSUPP):
            tier._attrs_ok = False              # no user attributes here: stop asking
        with tier.lock:
            if code in tier._attr_refusals:
                return
            tier._attr_refusals.add(code)
        log.warning("ssd: the file system of %s refused a slot file's %s attribute (%s; "
                    "%d bytes%s): such files keep their trailer after the payload, as "
                    "older memosfs wrote them (readable, but not payload-only)",
                    self.tier.root, XATTR, os.strerror(code), n,
                    "; no more attempts" if not tier._attrs_ok else
                    "; a large metadata, as a slot's many xattrs make")

    # ---- reads ----

    def load_into(self, entry: SSDEntry, draft: "_native.Draft") -> None:
        """SSDTier.load_into: the version into the draft, its payload
        checksum checked (CorruptSlot; StaleEntry: look again)."""
        fd = open_entry(entry)
        try:
            if os.fstat(fd).st_size != entry.file_size:
                raise CorruptSlot(f"{entry.path}: size changed on disk")
            self.load_from(entry, fd, draft)
        finally:
            os.close(fd)
        if draft.crc32c() != entry.crc:
            raise CorruptSlot(f"{entry.path}: payload checksum mismatch")
        with self.tier.lock:
            self.tier.reads += 1
            self.tier.read_bytes += entry.size

    def load_from(self, entry: SSDEntry, fd: int, draft: "_native.Draft") -> None:
        if entry.size:
            # MAP_POPULATE reads the file in with full readahead up front,
            # far faster than faulting it in page by page from a cold cache
            with mmap.mmap(fd, entry.size, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                           prot=mmap.PROT_READ) as mm:
                draft.write(0, mm)

    def prefetch(self, entry: SSDEntry) -> None:
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

    def backing(self, entry: SSDEntry) -> Optional[int]:
        """SSDTier.open_backing for this entry: a descriptor of its file if
        it is payload-only, its payload checked once per file and version
        (the tier's `_verified`); None for a trailer-layout file.
        StaleEntry, CorruptSlot as open_entry and the check raise them."""
        if not entry.bare:
            return None
        tier = self.tier
        fd = open_entry(entry)
        try:
            st = os.fstat(fd)
            if st.st_size != entry.size:
                raise CorruptSlot(f"{entry.path}: size changed on disk")
            mark = (st.st_dev, st.st_ino, entry.version, entry.size, st.st_mtime_ns,
                    entry.crc)
            with tier.lock:
                known = mark in tier._verified
                if known:
                    tier._verified.move_to_end(mark)
            if not known:
                _verify_payload(fd, entry)
                with tier.lock:
                    tier._verified[mark] = None
                    while len(tier._verified) > VERIFIED_FILES:
                        tier._verified.popitem(last=False)
            return fd
        except BaseException:
            os.close(fd)
            raise

    def read_resident(self, entry: SSDEntry) -> None:
        return None                     # (not RESIDENT: read off the event loop)

    def reader(self, entry: SSDEntry) -> "FileReader":
        return FileReader(entry)

    def view(self, entry: SSDEntry) -> tuple[list, dict[int, int]]:
        """(extents, descriptors) of the version, for reading it as
        spill.read_view does (not checked: for the version this daemon
        just wrote)."""
        fd = open_entry(entry)
        return ([(0, entry.size, _extentlog.BASE, 0)] if entry.size else [],
                {_extentlog.BASE: fd})

    def materialize(self, entry: SSDEntry, src: int, dst: int) -> None:
        """entry's version into dst at offset 0 (holes kept), from its slot
        file (src); dst is entry.size long afterwards."""
        _copy_sparse(src, dst, entry.size)

    def copy_for_rename(self, entry: SSDEntry, src: int, dst: int) -> None:
        _copy_range(src, dst, entry.size)

    # ---- damage ----

    def report_corrupt(self, entry: SSDEntry, why: str) -> bool:
        """SSDTier.report_corrupt of a slot file: under the writer lock (no
        file can be renamed in or out meanwhile) and only while the index
        still points at `entry`, the file under its path is checked again,
        by its own trailer and payload; if it is entry's file and fails, the
        entry goes and the file is set aside (True).  Otherwise nothing is
        set aside (False): the index moved on (a newer version), or the path
        holds a valid file of this key, which the index then takes."""
        tier = self.tier
        with tier.write_lock:
            if tier.get(entry.key) is not entry:
                return False
            return self.report_locked(entry, why)

    def report_locked(self, entry: SSDEntry, why: str) -> bool:
        tier = self.tier
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            log.error("ssd: %s: the file of %r vanished (%s)", entry.path, entry.key, why)
            tier._forget(entry)
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
            log.warning("ssd: %s checks out when read again (%s before)", entry.path, why)
            return False
        if found is not entry:
            # a valid file of this key the index had not learnt: take it
            tier.install(found, over=entry, write=False, track_sync=False)
            log.warning("ssd: %s holds version %d, not %d: the index follows the file",
                        entry.path, found.version, entry.version)
            return False
        tier._forget(entry)
        tier._set_aside(entry.path, why)
        return True

    # ---- renames, metadata, removal (the writer lock held) ----

    def rename(self, entry: SSDEntry, old: bytes, new: bytes, meta: dict[str, Any]
               ) -> SSDEntry:
        """SSDTier.rename of a version in a slot file: the file is copied
        under new's name (the key lives in the file; with `materialize`, so
        a log is folded into the copy) and renamed over new's file, new's
        folder is fsync'd, and only then does old's file go.  The copy says
        which file it was copied from: a crash between its rename into
        place and the unlink of old's file leaves both, and the next scan
        completes the rename (`complete_renames`)."""
        tier = self.tier
        sdir, final = tier._path_of(new)
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
        stamped = tier.segs.stamp(meta)
        tier._check_room(new, entry.size + _trailer_bound(new, stamped))
        tier._shard_dir(sdir)
        tmp = tier._tmp_path(sdir, new)
        try:
            src = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                dst = open_private(tmp, os.O_WRONLY | os.O_EXCL)
                try:
                    self.copy_for_rename(entry, src, dst)
                    copied = min(entry.size, os.fstat(dst).st_blocks * 512)
                    total, bare = self.finish(dst, new, entry.version, entry.size,
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
            with tier.lock:
                # the file and both index entries change together
                os.rename(tmp, final)
                tier._hook("renamed")
                replaced = tier.install(moved, wrote=copied, moved_from=entry)
            _fsync_dir(sdir)                # new's name is durable before old's goes
        except OSError:
            with tier.lock:
                tier.write_errors += 1
            _discard(tmp)
            raise
        if replaced is not None:
            # the replaced version's log, now that the rename over its
            # base is durable (a crash before: an old log, removed at mount)
            tier.kind_of(replaced).drop_log(replaced, sdir, fold=False, dir_synced=True)
        # old's tombstone (if a segment holds a record of it) is durable
        # before old's file goes: the unlink kept and the tombstone lost
        # would bring that older record back under old's name
        tier.segs.forgotten(old, durable=True)
        tier._unlink_locked(entry.path)
        return moved

    def rewrite_meta(self, entry: SSDEntry, meta: dict[str, Any]) -> Optional[SSDEntry]:
        """SSDTier.rewrite_meta of a version in a slot file: its payload is
        copied, holes kept (`materialize` of its kind: a log folded in),
        beside the new trailer into a temporary file renamed over the old
        one, as a write is, so a crash leaves the old metadata or the new.
        None when the file went meanwhile (set aside)."""
        tier = self.tier
        key = entry.key
        # (a seq newer than any packed record of the key: packed.py)
        stamped = tier.segs.stamp(meta)
        bound = entry.size + _trailer_bound(key, stamped)
        if bound > entry.file_bytes:
            tier._check_room(key, bound)
        sdir, final = tier._path_of(key)
        tmp = tier._tmp_path(sdir, key)
        sync_now = entry.maybe_durable          # (as `write` decides)
        try:
            try:
                src = open_entry(entry)
            except StaleEntry:
                return None                 # set aside meanwhile
            try:
                dst = open_private(tmp, os.O_WRONLY | os.O_EXCL)
                try:
                    self.materialize(entry, src, dst)
                    copied = min(entry.size, os.fstat(dst).st_blocks * 512)
                    total, bare = self.finish(dst, key, entry.version, entry.size,
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
            with tier.lock:
                os.rename(tmp, final)
                tier._hook("renamed")
                tier.install(new, wrote=copied, write=False)
                tier._dirty_dirs.add(sdir)
        except OSError:
            with tier.lock:
                tier.write_errors += 1
            _discard(tmp)
            raise
        self.drop_log(entry, sdir, fold=True)
        return new

    def unlink(self, entry: SSDEntry) -> None:
        """SSDTier.remove: the entry's file goes (its log after it)."""
        self.tier._unlink_locked(entry.path)

    # ---- durability and consistency ----

    def fsync(self, entry: SSDEntry) -> None:
        """fsync the entry's file (writer lock held)."""
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return                          # removed or replaced meanwhile
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if self.fsync_more(entry):
            entry.synced = True

    def fsync_more(self, entry: SSDEntry) -> bool:
        return True                         # (the file alone: logged.py adds its log)

    def check(self, key: bytes, e: SSDEntry, files: set[str]) -> None:
        """SSDTier.check of one entry: its file is there, is the entry's
        inode, and its trailer says the entry's key, version, size and
        checksum (AssertionError)."""
        try:
            fd = os.open(e.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise AssertionError(f"ssd: {key!r}: its file {e.path} is missing") from None
        try:
            found = self.check_found(e, read_trailer(fd, e.path), files)
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

    def check_found(self, e: SSDEntry, found: SSDEntry, files: set[str]) -> SSDEntry:
        return found                        # (logged.py: with the log's records)

    # ---- at mount ----

    def complete_renames(self, found: dict[bytes, SSDEntry]) -> None:
        """A rename moves a slot by copying its file under the new key's name
        (marked `moved_from`: the old file's key, seq, inode and ctime), then
        unlinking the old file.  A crash between the two leaves both; the old
        file, still the very one the copy came from (the seq of its trailer, or
        for a file without one the same inode and ctime: not a later slot of
        that name), goes now, so the slot has exactly one
        name, as rename(2) leaves it."""
        tier = self.tier
        for entry in list(found.values()):
            mark = entry.meta.get("moved_from")
            if not isinstance(mark, dict):
                continue
            try:
                src = found.get(bytes.fromhex(str(mark.get("key", ""))))
            except ValueError:
                continue
            if src is None or src is entry or not tier.kind_of(src).FILE:
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
            _discard(_extentlog.log_path_of(src.path))     # (its log, if it had one)
            del found[src.key]
            tier._dirty_dirs.add(os.path.dirname(src.path))


class FileReader:
    """SSDReader's part for a slot file: its descriptor (a stable snapshot
    of this version whatever replaces the name), the payload checked."""

    def __init__(self, entry: SSDEntry) -> None:
        self.entry = entry
        self.fd: Optional[int] = open_entry(entry)     # StaleEntry: look again
        try:
            self.check()
        except BaseException:
            self.release()
            raise

    def check(self) -> None:
        assert self.fd is not None
        _check_payload(self.fd, self.entry)

    def read(self, off: int, n: int) -> bytes:
        if self.fd is None:
            raise ValueError("reference was released")
        return os.pread(self.fd, n, off) if n > 0 else b""

    def overlay_base(self) -> Optional["_spill.BaseView"]:
        """This version as the base of an overlay draft (spill.py), over
        duplicated descriptors; None for a file of an older memosfs (no
        seq: a log cannot name it)."""
        ident = self.entry.base_ident
        if self.fd is None or ident is None:
            return None
        return _spill.dup_view(ident, {_extentlog.BASE: self.fd},
                               [(0, self.entry.size, _extentlog.BASE, 0)]
                               if self.entry.size else [])

    def plain_fd(self) -> Optional[int]:
        return self.fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _verify_payload(fd: int, entry: SSDEntry) -> None:
    """_check_payload for `backing`: read through the page cache, the
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
