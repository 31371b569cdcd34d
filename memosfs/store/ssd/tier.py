"""The SSD tier: the index of every slot version on the SSD directory, its
locks, the scan that rebuilds it at mount, and the one place an entry is
installed (`install`); what each kind of entry is and does is its module's
(the table `kinds`, `kind_of`): a slot file alone (whole.py), a slot file
and its extent log (logged.py), a record in a segment (packed.py).

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

A file whose footer, trailer or size does not check out is reported (log
and `ssd_corrupt`) and moved aside into `corrupt/` at mount; a payload whose
checksum fails is caught when it is read, reported the same way, and never
served.  Removals and renames are durable once `sync` has fsync'd the
folders they touched (the fsync of a directory on the mount).

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

Besides the slots, the folder holds `order.json` (keys, most recently used
first: the warm-up order), `namespace.json` (agents and sessions with
their owners and modes) and `policy.json` (the state of the eviction policy
the tier evicts by beyond ssd_capacity: memosfs/store/ssdpolicy.py), each
replaced atomically, and `.lock` (dirlock.py).

All of it is the daemon's user's alone: folders 0700, files 0600, set
explicitly whatever the umask; a folder with looser modes (an older memosfs
made it 0755, its JSON files 0644) is tightened when the tier opens, with a
WARNING in the log (memosfs/private.py).

The tier interface is small — put, load, remove, rename, keys, sizes — so
that another tier (a shared remote one) can stand beside it.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import shutil
import threading
from collections import OrderedDict
from typing import Any, NoReturn, Optional

from memosfs import _native
from memosfs.private import private_dir, private_makedirs, tighten_tree
from memosfs.store import extentlog as _extentlog
from memosfs.store import spill as _spill
from memosfs.store.ssd.fileio import _discard, _fsync_dir, _mtime, _syncfs
from memosfs.store.ssd.format import (CorruptSlot, SSDEntry, SSDFull, StaleEntry, TornSlot,
                                      _empty_left, _int, _name_of, _trailer_bound,
                                      read_trailer)
from memosfs.store.ssd.logged import LoggedFiles
from memosfs.store.ssd.packed import FileVersion, SegmentStore
from memosfs.store.ssd.state import POLICY_SAVE_S, RUNNING, TierState
from memosfs.store.ssd.stats import SSDStats
from memosfs.store.ssd.whole import WholeFiles
from memosfs.store.ssdpolicy import SSDPolicy

log = logging.getLogger("memosfs.store.ssd")

_ANY = object()


class SSDTier(TierState):
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
        # the kinds of entry and their operations (the one table: kind_of)
        self.files = WholeFiles(self)           # a slot file alone (whole.py)
        self.logs = LoggedFiles(self)           # a slot file and its extent log (logged.py)
        self.segs = SegmentStore(self)          # small slots, packed (packed.py)
        self.kinds: dict[str, Any] = {"file": self.files, "logged": self.logs,
                                      "packed": self.segs}
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
        with_log = self.logs.attach(found, logs)
        self.segs.scan(found)                   # packed slots; newest of each key wins
        self.files.complete_renames(found)
        self.logs.superseded(found, with_log)   # a slot file a record replaced: its log too
        with self.lock:
            self.index = found
            self.used_bytes = sum(e.file_bytes for e in found.values())
            # until restore_policy: oldest file first
            self.policy.reset(sorted(found, key=lambda k: _mtime(found[k].path)))
        if not after_crash:
            self._mark_running()
        return list(found.values())

    # ---- the kinds, and the one place an entry is installed ----

    def kind_of(self, entry: SSDEntry) -> Any:
        """The operations of entry's kind (whole.py, logged.py, packed.py):
        the same names for every kind."""
        return self.kinds[entry.kind]

    def install(self, entry: SSDEntry, *, wrote: int = 0, write: bool = True,
                over: Any = _ANY, moved_from: Optional[SSDEntry] = None,
                track_sync: bool = True) -> Optional[SSDEntry]:
        """Make entry its key's version in the index (the lock is taken: a
        caller renames the entry's file into place under it, so the file and
        the index change together); returns the entry it replaced.
        wrote: the bytes written for it; write: it is a version written (the
        policy and ssd_writes count it), not the same version's new place or
        metadata; over: only if the index holds that entry for the key (else
        nothing changes, None); moved_from: a rename's source entry, which
        goes with it if the index still holds it; track_sync: the unsynced
        bookkeeping follows entry.synced (a file found, not written: no)."""
        key = entry.key
        with self.lock:
            old = self.index.get(key)
            if over is not _ANY and old is not over:
                return None
            self.index[key] = entry
            self.used_bytes += entry.file_bytes - (old.file_bytes if old else 0)
            self.write_bytes += wrote
            if track_sync:
                if entry.synced is not False:
                    self._unsynced.pop(key, None)
                else:
                    self._unsynced[key] = entry
                    self.unsynced_writes += write
            if moved_from is not None:
                if self.index.get(moved_from.key) is moved_from:
                    del self.index[moved_from.key]
                    self.used_bytes -= moved_from.file_bytes
                    self._unsynced.pop(moved_from.key, None)
                    self.policy.renamed(moved_from.key, key)
                else:
                    self.policy.written(key)
            elif write:
                self.policy.written(key)
                self.writes += 1
            return old

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
        if self.logs.plan(ref, self.get(key)) is None:
            crc = ref.crc32c()
        self._check_room(key, ref.size + _trailer_bound(key, meta))
        with self.write_lock:
            # checked under the writer lock, which remove() and rename() take too
            current = self.get(key)
            if not ref.live or ref.key != key \
                    or (current is not None and current.version > ref.version):
                return None
            plan = self.logs.plan(ref, current)
            if plan is not None:
                assert current is not None
                if crc is None:
                    crc = self.logs.crc_after(current, ref, *plan)
                if crc is None:
                    crc = ref.crc32c()
                return self.logs.append(ref, current, meta, durable, crc, *plan)
            return self._write_locked(ref, key, meta, durable, crc)

    def _write_locked(self, ref: "_native.Ref", key: bytes, meta: dict[str, Any],
                      durable: bool, crc: Optional[int] = None) -> SSDEntry:
        """Write ref's bytes as `key`'s version, atomically replacing what
        key had: a packed record below ssd_pack_below, else a slot file
        (writer lock held)."""
        if crc is None:
            crc = ref.crc32c()
        if self.segs.packs(ref.size):
            return self.segs.put(ref, key, meta, durable, crc)
        return self.files.write(ref, key, meta, durable, crc)

    def put_file(self, key: bytes, fd: int, path: str, size: int, meta: dict[str, Any],
                 version: int, durable: bool, crc: int) -> SSDEntry:
        """Make the file at `path`, open at `fd` and holding bytes [0, size)
        (a spilled draft: memosfs/store/spill.py), key's version `version`
        without copying it: finished as a write-back's temporary file is
        (whole.py), fsync'd under the same rule, renamed into the slot's
        place (same file system) with the index, used bytes, policy and
        unsynced bookkeeping of a write.  Below ssd_pack_below it is
        appended as a packed record instead (the file stays at `path` for
        the caller to remove).  SSDFull when ssd_capacity has no room for it
        (the caller makes room or refuses); other OSErrors leave the file at
        `path` as it was (its bytes, no trailer), the previous version in
        place and the index unchanged."""
        self._check_room(key, size + _trailer_bound(key, meta))
        with self.write_lock:
            if self.segs.packs(size):
                return self.segs.put(FileVersion(fd, size, version), key, meta, durable, crc)
            return self.files.put_file(key, fd, path, size, meta, version, durable, crc)

    def put_overlay(self, key: bytes, sp: "_spill.SpillDraft", meta: dict[str, Any],
                    version: int, crc: int) -> Optional[SSDEntry]:
        """An overlay draft (spill.py) published as one record of the slot's
        extent log, or None (logged.py, LoggedFiles.put_overlay)."""
        return self.logs.put_overlay(key, sp, meta, version, crc)

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

    # ---- reads ----

    def load_into(self, entry: SSDEntry, draft: "_native.Draft") -> None:
        """Read a version into a draft, checking its payload checksum.
        StaleEntry: the path holds another version now (look again);
        CorruptSlot: entry's own file does not check out (`report_corrupt`
        decides)."""
        self.kind_of(entry).load_into(entry, draft)

    def prefetch(self, entry: SSDEntry) -> None:
        """Start reading a version in the background (warm-up reads ahead)."""
        self.kind_of(entry).prefetch(entry)

    def may_be_resident(self, entry: SSDEntry) -> bool:
        """Whether `read_resident` may find entry's bytes (a packed record)."""
        return self.kind_of(entry).RESIDENT

    def read_resident(self, entry: SSDEntry) -> Optional[bytes]:
        """entry's bytes if the page cache holds all of them, checked, read
        without waiting for the disk (packed.py); None otherwise."""
        return self.kind_of(entry).read_resident(entry)

    def open_backing(self, key: bytes) -> Optional[tuple[int, SSDEntry]]:
        """For the FUSE passthrough reader: (an O_RDONLY descriptor, the
        entry) of key's payload-only file — the very file the index names
        (same inode, as open_entry checks), whose payload checks out — or
        None: no such file (absent, a packed record, a trailer-layout file,
        a file with an extent log, whose file alone is an older version),
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
        whole.VERIFIED_FILES files, least recent first out).  The kernel
        reads the file directly afterwards, unchecked: docs/ssd-format.md."""
        for _ in range(3):
            entry = self.get(key)
            if entry is None:
                return None
            try:
                fd = self.kind_of(entry).backing(entry)
            except StaleEntry:
                continue                        # a newer version's file: look again
            except CorruptSlot as e:
                if self.report_corrupt(entry, str(e)):
                    return None                 # set aside: the key is gone from the tier
                continue                        # the index moved on, or a passing glitch
            return None if fd is None else (fd, entry)
        raise StaleEntry(f"{key!r}: its file kept being replaced while opened")

    def report_corrupt(self, entry: SSDEntry, why: str) -> bool:
        """A version failed its check when read: its kind checks it again,
        under the writer lock and only while the index still points at
        `entry`; True if it was set aside (the entry gone), False if nothing
        was (the index moved on, or it checks out: whole.py)."""
        return self.kind_of(entry).report_corrupt(entry, why)

    # ---- removal and renames ----

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
        self.segs.forgotten(entry.key, durable=self.kind_of(entry).FILE)

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
            kind = self.kind_of(current)
            self.segs.forgotten(key, durable=kind.FILE)
            kind.unlink(current)
        self.trouble = None                 # (room came: the next write tells)
        return True

    def _unlink_locked(self, path: str) -> None:
        """Unlink a slot file, then its extent log if any (writer lock held;
        durable at the next sync)."""
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
        """Give old's stored version the key `new`, replacing new's (its
        kind's rename: a copy under new's name renamed over new's file, new's
        folder fsync'd before old's file goes; a packed record appended
        under new before old's tombstone).  Without a stored version of old,
        `ref` (old's version in memory, if any) is written as new's when new
        has a file, so that new's file is replaced, never left holding the
        replaced version.  Returns new's entry, or None if nothing was
        written (nothing stored for old; new's file, if any, is left
        alone).  OSError: nothing changed."""
        with self.write_lock:
            entry = self.get(old)
            if entry is None:
                if ref is None or self.get(new) is None:
                    return None
                # the version check does not apply: new's file is the
                # replaced slot's, whatever its version
                self._check_room(new, ref.size + _trailer_bound(new, meta))
                return self._write_locked(ref, new, meta, durable=False)
            return self.kind_of(entry).rename(entry, old, new, _stored_meta(meta, entry))

    def rewrite_meta(self, key: bytes, meta: dict[str, Any]) -> Optional[SSDEntry]:
        """Give key's stored version new metadata (owner, mode, times, xattrs
        changed while memory did not hold the slot), as its kind does it (a
        copy of the file renamed over it, a record with no runs in its
        extent log, a new packed record), so a crash leaves the old metadata
        or the new.  Returns the new entry (the same entry when its metadata
        is already `meta`), None when the tier holds no version of key.
        OSError: nothing changed."""
        with self.write_lock:
            entry = self.get(key)
            if entry is None:
                return None
            meta = _stored_meta(meta, entry)
            if entry.meta == meta:
                return entry
            return self.kind_of(entry).rewrite_meta(entry, meta)

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
            self.segs.check_all(index)
            for key, e in index.items():
                assert e.key == key, f"ssd: entry of {key!r} says {e.key!r}"
                self.kind_of(e).check(key, e, files)
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
        """fsync an entry's file or record (writer lock held)."""
        self.kind_of(entry).fsync(entry)

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
                **self.logs.stats(self.index), **self.segs.stats(self.index))


def _stored_meta(meta: dict[str, Any], entry: SSDEntry) -> dict[str, Any]:
    """The metadata to keep beside entry's own bytes: the caller's (the
    name's owner, mode, times and xattrs) with the logical size of the
    stored version, not the caller's: memory may hold a newer version of
    another size (a rename of a slot whose newest version is not written
    back yet), and a restore that took that size would serve a prefix of
    the stored bytes, or a slot longer than them.  Without a logical size
    of its own the version is its payload's size (persist.py)."""
    out = dict(meta)
    if "logical_size" in entry.meta:
        out["logical_size"] = entry.meta["logical_size"]
    else:
        out.pop("logical_size", None)
    return out
