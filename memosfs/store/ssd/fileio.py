"""File operations the tier's kinds share: copies between files (holes
kept where asked), whole writes, and the fsyncs and syncfs that order what
a power loss keeps (docs/ssd-format.md, "What a power loss leaves")."""

from __future__ import annotations

import errno
import logging
import os

log = logging.getLogger("memosfs.store.ssd")


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


def _discard(path: str) -> None:
    """Remove a temporary file a failed write left, if it is there."""
    try:
        os.unlink(path)
    except OSError:
        pass


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


def _fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0
