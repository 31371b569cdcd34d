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

A draft that starts from a version the SSD tier holds in a slot file (a
version memory could not take, read from its file: `overlay_base`) copies
nothing: it is an *overlay*.  Its spill file holds only the bytes written
since (`_dirty`, the runs; elsewhere a hole), `_cut` is the shortest size a
truncate gave it, and every other byte is read from the base version's
file (and its extent log), kept open.  Published, an overlay whose base is
still the tier's version becomes one record of the slot's extent log
(SSDTier.put_overlay: the base cut to `_cut`, zeros to the size, then the
runs), so what a change of a large slot writes is what changed; otherwise
(the base was replaced, the runs are too large) the base's bytes are
copied into the spill file by the kernel first (`materialize`) and it is
published whole as above.

A spill file is never a published version: one left by a crash (its writers
never had it acknowledged) is removed at mount (`clear`).

Owns: SpillDraft, SpilledRef, BaseView, clear, SPILL_DIR.  May call:
memosfs._native (crc32c), memosfs.private, memosfs.store.extentlog (its
extent codes).  Nothing else of the package.
"""

from __future__ import annotations

import bisect
import errno
import itertools
import logging
import os
from typing import Any, Callable, Optional

from memosfs import _native
from memosfs.private import open_private, private_dir
from memosfs.store.extentlog import BASE, ZERO, crc_after_runs, crc_view, read_view

log = logging.getLogger("memosfs.store.store")     # one logger for the whole store

__all__ = ["SpillDraft", "SpilledRef", "BaseView", "clear", "SPILL_DIR"]

SPILL_DIR = "spill"             # under the SSD directory
COPY_CHUNK = 4 << 20            # bytes a copy or a checksum reads at a time
_ZEROS = bytes(COPY_CHUNK)
_seq = itertools.count(1)
OWN = -1                        # an overlay's extent code for its own spill file


class BaseView:
    """A published version's bytes as an overlay's base: `ident` (the SSD
    entry's fseq, version, size, crc32c: which version of which slot file),
    `ext` its extents (start, end, source code, offset there), sorted and
    covering [0, size), and `fds` the open descriptors of the sources
    (ZERO needs none), owned by this view."""

    def __init__(self, ident: tuple[int, int, int, int], fds: dict[int, int],
                 ext: list[tuple[int, int, int, int]]) -> None:
        self.ident = ident
        self.fds = fds
        self.ext = ext

    @property
    def size(self) -> int:
        return self.ident[2]

    def close(self) -> None:
        fds, self.fds = self.fds, {}
        for fd in fds.values():
            try:
                os.close(fd)
            except OSError:
                pass


def dup_view(ident: tuple[int, int, int, int], fds: dict[int, int],
             ext: list[tuple[int, int, int, int]]) -> BaseView:
    """A BaseView over duplicates of fds (the caller keeps its own); an
    overlay's own file among them (OWN: a version an overlay published)
    gets a code of its own, so that the next overlay's OWN is its file."""
    fresh = max([c for c in fds if c != OWN] + [ZERO, BASE]) + 1
    mine: dict[int, int] = {}
    try:
        for code, fd in fds.items():
            mine[fresh if code == OWN else code] = os.dup(fd)
    except OSError:
        for fd in mine.values():
            os.close(fd)
        raise
    return BaseView(ident, mine, [(s, e, fresh if src == OWN else src, so)
                                  for s, e, src, so in ext])


def _at(src: int, so: int, d: int) -> int:
    return 0 if src == ZERO else so + d


def combine(base: list[tuple[int, int, int, int]], cut: int, size: int,
            starts: list[int], ends: list[int]) -> list[tuple[int, int, int, int]]:
    """An overlay's extents: base's cut to `cut`, zeros to `size`, the
    runs [starts[i], ends[i]) (sorted, disjoint, within size) from its own
    file (OWN, same offsets)."""
    under: list[tuple[int, int, int, int]] = []
    for s, e, src, so in base:
        if s >= cut:
            break
        under.append((s, min(e, cut), src, so))
    if size > cut:
        under.append((cut, size, ZERO, 0))
    out: list[tuple[int, int, int, int]] = []
    j, nd = 0, len(starts)
    for s, e, src, so in under:
        pos = s
        while j < nd and ends[j] <= pos:
            j += 1
        k = j
        while pos < e:
            if k < nd and starts[k] < e:
                a, b = starts[k], ends[k]
                if a > pos:
                    out.append((pos, a, src, _at(src, so, pos - s)))
                pos = min(max(pos, b), e)
                if b <= e:
                    k += 1
            else:
                out.append((pos, e, src, _at(src, so, pos - s)))
                pos = e
    out.extend((a, b, OWN, a) for a, b in zip(starts, ends))
    out.sort()
    return out




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

    def __init__(self, root: Optional[str], capacity: Callable[[], int],
                 trouble: Callable[[int], str], counts: Any) -> None:
        self._capacity = capacity           # the SSD tier's ssd_capacity now (0: none);
                                            # in memory: the memory tier's capacity
        self._trouble = trouble             # errno -> the SSD directory's trouble in words
        self._counts = counts               # the store's counters (spill_bytes)
        self.in_memory = root is None       # a memory-only tier's draft: a memory file
        if root is None:
            self.path = ""
            try:
                self.fd: Optional[int] = os.memfd_create("memosfs-draft", os.MFD_CLOEXEC)
            except OSError as e:
                raise self._said(e) from None
        else:
            sdir = os.path.join(root, SPILL_DIR)
            self.path = os.path.join(sdir, f"{os.getpid()}.{next(_seq)}.spill")
            try:
                self.fd = open_private(self.path, os.O_RDWR | os.O_EXCL)
            except FileNotFoundError:
                private_dir(sdir)
                self.fd = open_private(self.path, os.O_RDWR | os.O_EXCL)
            except OSError as e:
                raise self._said(e) from None
        self._size = 0
        self._base: Optional[BaseView] = None   # an overlay's base (module docstring)
        self._cut = 0
        self._starts: list[int] = []            # its runs, sorted and disjoint
        self._ends: list[int] = []
        self._ext: Optional[list] = None        # its extents (combine), while unchanged
        self._adopted: Optional[tuple[list, dict[int, int]]] = None     # (adopt)

    # ---- filling it ----

    def overlay(self, base: BaseView) -> None:
        """Start as base's version without copying it (an overlay: the
        module docstring); this draft owns base from now on."""
        try:
            self._room(base.size)
            os.ftruncate(self._fd(), base.size)     # a hole: nothing written
        except OSError as e:
            base.close()
            raise self._said(e) from None
        self._base = base
        self._cut = self._size = base.size
        self._starts, self._ends, self._ext = [], [], None

    @property
    def overlaid(self) -> bool:
        return self._base is not None

    @property
    def base_ident(self) -> Optional[tuple[int, int, int, int]]:
        return self._base.ident if self._base is not None else None

    @property
    def cut(self) -> int:
        """An overlay's shortest size since its base: base bytes from here
        on are not the draft's."""
        return self._cut

    def runs(self) -> list[tuple[int, int]]:
        """An overlay's bytes of its own: (offset, length), sorted."""
        return [(a, b - a) for a, b in zip(self._starts, self._ends)]

    def _view(self) -> tuple[list, dict[int, int]]:
        base = self._base
        assert base is not None
        if self._ext is None:
            self._ext = combine(base.ext, self._cut, self._size, self._starts, self._ends)
        fds = dict(base.fds)
        fds[OWN] = self._fd()
        return self._ext, fds

    def _crc_by_delta(self) -> Optional[int]:
        """An overlay's whole crc32c from its base's and its runs alone
        (extentlog.crc_after_runs); None where a truncate cut into the base
        or the runs are large (then every byte is read)."""
        base = self._base
        assert base is not None
        if self._cut < base.size:
            return None
        fd = self._fd()

        def new(o: int, n: int) -> bytes:
            got = os.pread(fd, n, o)
            if len(got) != n:
                raise OSError(errno.EIO, f"{self.path}: shorter than its draft")
            return got

        return crc_after_runs(base.ident[3], base.size, self._size, self.runs(),
                              lambda o, n: read_view(base.ext, base.fds, o, n), new)

    def _mark(self, a: int, b: int) -> None:
        """Bytes [a, b) are the overlay's own now."""
        if a >= b:
            return
        st, en = self._starts, self._ends
        i = bisect.bisect_left(en, a)               # the first run ending at a or later
        j = bisect.bisect_right(st, b)              # past the last starting at b or before
        if i < j:
            a, b = min(a, st[i]), max(b, en[j - 1])
        st[i:j] = [a]
        en[i:j] = [b]
        self._ext = None

    def _clip(self, size: int) -> None:
        """The overlay cut to size bytes."""
        self._cut = min(self._cut, size)
        k = bisect.bisect_left(self._starts, size)
        del self._starts[k:], self._ends[k:]
        if self._ends and self._ends[-1] > size:
            self._ends[-1] = size
        self._ext = None

    def materialize(self) -> None:
        """An overlay becomes a whole spill file: its base's bytes copied in
        where they show (by the kernel, copy_file_range; holes stay holes),
        the base closed.  Nothing changes if it fails."""
        if self._base is None:
            return
        ext, fds = self._view()
        dst = self._fd()
        try:
            for s, e, src, so in ext:
                if src in (ZERO, OWN):
                    continue
                pos = s
                while pos < e:
                    n = os.copy_file_range(fds[src], dst, e - pos, so + (pos - s), pos)
                    if n <= 0:
                        raise OSError(errno.EIO, f"short copy while spilling ({pos} of {e})")
                    pos += n
                    self._counts["spill_bytes"] += n
        except OSError as e:
            raise self._said(e) from None
        base, self._base = self._base, None
        base.close()
        self._starts, self._ends, self._ext = [], [], None

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
            if self._base is not None:
                # what a partial write left is the file's: the overlay shows
                # the file there, as a plain spill file would
                self._mark(off, min(end, self._size))
            raise self._said(e) from None
        self._size = max(self._size, end)
        if self._base is not None:
            self._mark(off, end)
        return n

    def read(self, off: int, n: int) -> bytes:
        n = max(0, min(n, self._size - off))
        if not n:
            return b""
        if self._base is not None:
            ext, fds = self._view()
            return read_view(ext, fds, off, n)
        return os.pread(self._fd(), n, off)

    def crc32c(self, off: int = 0, n: int = -1) -> int:
        end = self._size if n < 0 else min(self._size, off + n)
        if off >= end:
            return 0
        if self._base is not None:
            if off == 0 and end == self._size:
                crc = self._crc_by_delta()
                if crc is not None:
                    return crc
            ext, fds = self._view()
            return crc_view(ext, fds, off, end)
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
        if self._base is not None and size < self._size:
            self._clip(size)
        self._size = size
        self._ext = None

    def free(self) -> None:
        """Abort the draft: its file goes."""
        view, self._adopted = getattr(self, "_adopted", None), None
        if view is not None:
            for fd in view[1].values():
                os.close(fd)
        if getattr(self, "_base", None) is not None:
            base, self._base = self._base, None
            base.close()
        if getattr(self, "fd", None) is None:
            return                      # (published, freed, or never opened)
        fd, self.fd = self.fd, None
        os.close(fd)
        if self.path:
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

    def adopt(self, view: tuple[list, dict[int, int]]) -> None:
        """After an overlay's publish as a log record: the published version
        is read by `view` (the slot's file and log: ssd/logged.py view), not by
        this draft's files, which go at `published`."""
        self._adopted = view

    def published(self, key: bytes, version: int, stored: int,
                  ident: Optional[tuple[int, int, int, int]]) -> "SpilledRef":
        """The version published from this draft, read from its file (and,
        an overlay published as a log record, its base's files); ident: the
        SSD entry's (fseq, version, size, crc) when it is a slot file whose
        bytes are the file's or the overlay's (None: a packed record).  This
        draft is consumed."""
        size = self._size
        if self._base is None:
            return SpilledRef(key, version, size, stored, self.take(), ident)
        view, self._adopted = self._adopted, None
        if view is not None:
            self.free()                         # (the spill file goes)
            return SpilledRef(key, version, size, stored, next(iter(view[1].values())),
                              ident, view)
        ext, fds = self._view()
        base, self._base = self._base, None
        self.fd = None                          # (now fds[OWN], the ref's)
        base.fds = {}
        return SpilledRef(key, version, size, stored, fds[OWN], ident, (ext, fds))

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
        if self.in_memory and end > cap:
            raise OSError(errno.EFBIG, f"the slot would be larger than the memory tier "
                          f"(capacity {cap} bytes)")
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

    def __init__(self, key: bytes, version: int, size: int, stored: int, fd: int,
                 ident: Optional[tuple[int, int, int, int]] = None,
                 view: Optional[tuple[list, dict[int, int]]] = None) -> None:
        self.key = key
        self.version = version
        self.size = size
        self.stored = stored
        self._fd: Optional[int] = fd
        self._ident = ident                 # the SSD entry it is (overlay_base)
        self._view = view                   # an overlay's (extents, descriptors): fd among them

    def read(self, off: int, n: int) -> bytes:
        if self._fd is None:
            raise ValueError("reference was released")
        n = max(0, min(n, self.size - off))
        if not n:
            return b""
        if self._view is not None:
            return read_view(self._view[0], self._view[1], off, n)
        return os.pread(self._fd, n, off)

    def overlay_base(self) -> Optional[BaseView]:
        """This version as the base of an overlay (spill.py), over
        duplicated descriptors; None: not a slot file's version."""
        if self._fd is None or self._ident is None or not self._ident[0]:
            return None
        if self._view is not None:
            return dup_view(self._ident, self._view[1], self._view[0])
        return dup_view(self._ident, {BASE: self._fd},
                        [(0, self.size, BASE, 0)] if self.size else [])

    def release(self) -> None:
        if self._view is not None:
            fds, self._view = self._view[1], None
            for fd in fds.values():
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._fd = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __del__(self) -> None:
        self.release()
