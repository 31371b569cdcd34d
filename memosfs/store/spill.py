"""Spilled drafts: a writers' draft that continues in a file of the SSD
directory because the memory tier has no room for it.

A draft normally lives in the memory tier (a `_native.Draft`).  When memory
cannot take a write, a truncate or the draft itself (full of other writers'
drafts and readers' versions, or the slot is larger than the memory tier),
the filesystem moves the draft here (`Store.spill`): its bytes so far are
copied into a private file (0600) in `spill/` of the SSD directory, its
memory is freed (so the other writers get room), and every later write,
read, truncate and size of that draft goes to the file.  `SpillDraft`
quacks like `_native.Draft` (write, read, crc32c, truncate, free, size) so
that the handlers treat both alike; its OSErrors name the SSD directory's
trouble in words a user knows (a full disk; a draft larger than
ssd_capacity).

Publishing it (`Store.publish`, writes.py `_publish_spilled`) renames the
file into the SSD tier as the slot's new version (`SSDTier.put_file`), with
no copy and no memory; what it returns is a `SpilledRef`, the published
version read from the same open file (like ssd.SSDReader).

A spill file is never a published version: one left by a crash (its writers
never had it acknowledged) is removed at mount (`clear`).

Owns: SpillDraft, SpilledRef, clear, SPILL_DIR.  May call: memosfs._native
(crc32c), memosfs.private.  Nothing else of the package.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
from typing import Any, Callable, Optional

from memosfs import _native
from memosfs.private import open_private, private_dir

log = logging.getLogger("memosfs.store.store")     # one logger for the whole store

__all__ = ["SpillDraft", "SpilledRef", "clear", "SPILL_DIR"]

SPILL_DIR = "spill"             # under the SSD directory
COPY_CHUNK = 4 << 20            # bytes a copy or a checksum reads at a time
_ZEROS = bytes(COPY_CHUNK)
_seq = itertools.count(1)


def clear(root: str) -> int:
    """At mount: remove the spill files a crash left in root/spill/ (drafts
    nobody published: never acknowledged); returns how many."""
    sdir = os.path.join(root, SPILL_DIR)
    try:
        names = os.listdir(sdir)
    except FileNotFoundError:
        return 0
    gone = 0
    for name in names:
        try:
            os.unlink(os.path.join(sdir, name))
            gone += 1
        except IsADirectoryError:
            continue
        except OSError as e:
            log.error("ssd: cannot remove the leftover spill file %s (%s)", name, e)
    if gone:
        log.info("ssd: %d spill file%s of unpublished drafts left by a crash removed",
                 gone, "" if gone == 1 else "s")
    return gone


class SpillDraft:
    """A writers' draft in a file (see the module docstring).  Used on the
    filesystem's request thread only; `fd` and `path` pass to the SSD tier
    when it is published (`take`)."""

    spilled = True

    def __init__(self, root: str, capacity: Callable[[], int],
                 trouble: Callable[[int], str], counts: Any) -> None:
        sdir = os.path.join(root, SPILL_DIR)
        self.path = os.path.join(sdir, f"{os.getpid()}.{next(_seq)}.spill")
        self._capacity = capacity           # the SSD tier's ssd_capacity now (0: none)
        self._trouble = trouble             # errno -> the SSD directory's trouble in words
        self._counts = counts               # the store's counters (spill_bytes)
        try:
            self.fd: Optional[int] = open_private(self.path, os.O_RDWR | os.O_EXCL)
        except FileNotFoundError:
            private_dir(sdir)
            self.fd = open_private(self.path, os.O_RDWR | os.O_EXCL)
        except OSError as e:
            raise self._said(e) from None
        self._size = 0

    # ---- filling it ----

    def fill(self, read: Callable[[int, int], bytes], size: int) -> None:
        """Copy a version's bytes [0, size) in (read(off, n) gives them):
        chunks of zeros stay holes."""
        self._room(size)
        off = 0
        try:
            while off < size:
                n = min(COPY_CHUNK, size - off)
                chunk = read(off, n)
                if len(chunk) != n:
                    raise OSError(errno.EIO, f"short read while spilling ({len(chunk)} of {n})")
                if chunk != _ZEROS[:n]:
                    self._pwrite(chunk, off)
                off += n
            os.ftruncate(self._fd(), size)
        except OSError as e:
            raise self._said(e) from None
        self._size = size

    def fill_file(self, src: int, size: int) -> None:
        """Copy bytes [0, size) of the file open at `src` in: its data
        extents only (SEEK_DATA / SEEK_HOLE), copied by the kernel
        (copy_file_range, no bytes through Python); its holes stay holes."""
        self._room(size)
        dst = self._fd()
        try:
            off = 0
            while off < size:
                try:
                    data = os.lseek(src, off, os.SEEK_DATA)
                except OSError as e:
                    if e.errno == errno.ENXIO:
                        break                   # a hole to the end
                    raise
                if data >= size:
                    break
                hole = min(os.lseek(src, data, os.SEEK_HOLE), size)
                pos = data
                while pos < hole:
                    n = os.copy_file_range(src, dst, hole - pos, pos, pos)
                    if n <= 0:
                        raise OSError(errno.EIO, f"short copy while spilling ({pos} of {size})")
                    pos += n
                    self._counts["spill_bytes"] += n
                off = hole
            os.ftruncate(dst, size)
        except OSError as e:
            raise self._said(e) from None
        self._size = size

    def fill_ref(self, ref: "_native.Ref") -> None:
        """Copy a pinned memory version in (holes stay holes)."""
        self._room(ref.size)
        try:
            if ref.size:
                written = ref.write_to_fd(self._fd(), sparse=True)
                if written != ref.size:
                    raise OSError(errno.EIO, f"short write ({written} of {ref.size})")
            os.ftruncate(self._fd(), ref.size)
        except OSError as e:
            raise self._said(e) from None
        self._size = ref.size
        self._counts["spill_bytes"] += ref.size

    # ---- the Draft interface ----

    @property
    def size(self) -> int:
        self._fd()
        return self._size

    def write(self, off: int, data) -> int:
        n = len(data) if not isinstance(data, memoryview) else data.nbytes
        if off < 0:
            raise ValueError("offset must be >= 0")
        end = off + n
        if end > self._size:
            self._room(end)
        try:
            self._pwrite(data, off)
        except OSError as e:
            if end > self._size:
                try:
                    os.ftruncate(self._fd(), self._size)    # a refused write changes nothing
                except OSError:
                    pass
            raise self._said(e) from None
        self._size = max(self._size, end)
        return n

    def read(self, off: int, n: int) -> bytes:
        n = max(0, min(n, self._size - off))
        return os.pread(self._fd(), n, off) if n else b""

    def crc32c(self, off: int = 0, n: int = -1) -> int:
        end = self._size if n < 0 else min(self._size, off + n)
        if off >= end:
            return 0
        try:
            # without the GIL, the file's holes not read
            return _native.crc32c_file(self._fd(), off, end - off)
        except OSError as e:
            if e.errno == errno.EIO:
                raise OSError(errno.EIO, f"{self.path}: shorter than its draft") from None
            raise

    def truncate(self, size: int) -> None:
        if size < 0:
            raise ValueError("size must be >= 0")
        if size > self._size:
            self._room(size)
        try:
            os.ftruncate(self._fd(), size)
        except OSError as e:
            raise self._said(e) from None
        self._size = size

    def free(self) -> None:
        """Abort the draft: its file goes."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        os.close(fd)
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def __del__(self) -> None:
        self.free()                     # (a draft dropped unpublished: its file goes)

    # ---- publishing (the store) ----

    def take(self) -> int:
        """The open file, handed over to the version published from it
        (`SpilledRef`): this draft is consumed."""
        fd, self.fd = self._fd(), None
        return fd

    # ---- helpers ----

    def _fd(self) -> int:
        if self.fd is None:
            raise ValueError("draft was published or freed")
        return self.fd

    def _pwrite(self, data, off: int) -> None:
        view = memoryview(data).cast("B")
        while view:
            n = os.pwrite(self._fd(), view, off)
            view = view[n:]
            off += n
            self._counts["spill_bytes"] += n

    def _room(self, end: int) -> None:
        cap = self._capacity()
        if cap and end > cap:
            raise OSError(errno.ENOSPC, f"the slot would be larger than the SSD tier's "
                          f"ssd_capacity ({cap} bytes), where a draft the memory tier "
                          f"has no room for continues")

    def _said(self, e: OSError) -> OSError:
        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS):
            return OSError(e.errno, self._trouble(e.errno))
        return e


class SpilledRef:
    """A version published from a spill file, read from that file's open
    descriptor (now the SSD tier's file of the version, or a record's
    source): quacks like a pinned `_native.Ref` for the writers that go on
    from it, as ssd.SSDReader does for readers."""

    dirty = False
    live = True
    hits = 0
    sticky = False

    def __init__(self, key: bytes, version: int, size: int, stored: int, fd: int) -> None:
        self.key = key
        self.version = version
        self.size = size
        self.stored = stored
        self._fd: Optional[int] = fd

    def read(self, off: int, n: int) -> bytes:
        if self._fd is None:
            raise ValueError("reference was released")
        n = max(0, min(n, self.size - off))
        return os.pread(self._fd, n, off) if n else b""

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.release()
