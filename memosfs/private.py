"""Files and folders that only the daemon's user may read.

Everything the daemon keeps on disk — the SSD directory (slot files, their
shard folders, `corrupt/`, `order.json`, `namespace.json`, temporary files),
the federated jobs' state under it, the log file, the run files of `memosfs
umount` — holds tenants' keys, owners and data, so folders are made 0700 and
files 0600, whatever the daemon's umask: each mode is set explicitly after
the mkdir or open (the umask can only take bits away, and an odd umask such
as 0277 would otherwise leave a file the daemon cannot reopen).

`tighten_tree` brings a folder made by an older memosfs (0755 folders, 0644
files) or by hand to those modes at mount: it only takes group and other bits
away, never adds one, and never follows a symbolic link.
"""

from __future__ import annotations

import logging
import os
import stat

log = logging.getLogger("memosfs.private")

__all__ = ["DIR_MODE", "FILE_MODE", "private_dir", "private_makedirs", "open_private",
           "tighten_tree", "tighten_file"]

DIR_MODE = 0o700
FILE_MODE = 0o600
_LOOSE = 0o077          # group and other bits: what "looser" means


def private_dir(path: str) -> bool:
    """mkdir path 0700 (its parent must exist); True if it was made, False if
    it was there (its mode is left to tighten_tree)."""
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return False
    os.chmod(path, DIR_MODE)            # the umask may have taken owner bits
    return True


def private_makedirs(path: str) -> bool:
    """private_dir, making missing parents with the usual modes first (the
    folder that holds the private one need not be private)."""
    parent = os.path.dirname(os.path.abspath(path))
    if parent and not os.path.isdir(parent):
        os.makedirs(parent, exist_ok=True)
    return private_dir(path)


def open_private(path: str, flags: int) -> int:
    """os.open(path, flags | O_CREAT | O_CLOEXEC, 0600), the mode set on the
    descriptor too; with O_EXCL it is exactly 0600, else a file that was
    there is tightened (never loosened) if it is a regular file."""
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        want = FILE_MODE if flags & os.O_EXCL else mode & ~(_LOOSE | 0o7000)
        if stat.S_ISREG(st.st_mode) and mode != want:
            os.fchmod(fd, want)
    except BaseException:
        os.close(fd)
        raise
    return fd


def tighten_file(path: str) -> tuple[bool, bool]:
    """Make the regular file at path (following a link the caller named)
    0600 if new, or take group/other bits off it if it is there.
    Returns (created, tightened).  OSError if it cannot be opened or changed."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK)
        created = False
    except FileNotFoundError:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL
                         | os.O_CLOEXEC, FILE_MODE)
            created = True
        except FileExistsError:         # made meanwhile: look again
            return tighten_file(path)
    try:
        st = os.fstat(fd)
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISREG(st.st_mode):
            return created, False       # /dev/stderr, a fifo: not ours to change
        if created:
            if mode != FILE_MODE:
                os.fchmod(fd, FILE_MODE)
            return True, False
        if mode & (_LOOSE | 0o7000):
            os.fchmod(fd, mode & ~(_LOOSE | 0o7000))
            return False, True
        return False, False
    finally:
        os.close(fd)


def tighten_tree(root: str, what: str = "directory") -> int:
    """Take group and other bits off root and everything below it (folders
    to at most 0700, files to at most 0600); symbolic links are neither
    followed nor changed.  A folder is tightened before it is listed, so no
    other user can slip an entry into it meanwhile.  Logs once at WARNING
    when anything changed; an entry that cannot be changed is logged at
    ERROR and skipped.  Returns how many entries were tightened."""
    counts = [0, 0]                     # tightened, failed
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        log.error("%s %s: cannot open it to check its modes: %s", what, root, e)
        return 0
    _tighten_dir(fd, root, what, counts)
    count, failed = counts
    if count:
        log.warning("%s %s: took group/other access off %d entries (folders are "
                    "kept 0700 and files 0600: they hold every agent's keys and data)",
                    what, root, count)
    if failed:
        log.error("%s %s: %d entries could not be checked or tightened; other users "
                  "may still read them", what, root, failed)
    return count


def _tighten_dir(dfd: int, dpath: str, what: str, counts: list[int]) -> None:
    """tighten_tree below the open folder dfd (closed here)."""
    def fail(msg: str, path: str, e: OSError) -> None:
        counts[1] += 1
        log.error("%s: %s %s: %s", what, msg, path, e)

    try:
        mode = stat.S_IMODE(os.fstat(dfd).st_mode)
        if mode & (_LOOSE | 0o7000):
            try:
                os.fchmod(dfd, mode & DIR_MODE)
                counts[0] += 1
            except OSError as e:
                fail("cannot take group/other access off", dpath, e)
        try:
            names = os.listdir(dfd)
        except OSError as e:
            fail("cannot list, to check its modes,", dpath, e)
            return
        for name in names:
            path = os.path.join(dpath, name)
            try:
                st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as e:
                fail("cannot stat", path, e)
                continue
            if stat.S_ISDIR(st.st_mode):
                try:
                    cfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                                  | os.O_CLOEXEC, dir_fd=dfd)
                except OSError as e:
                    fail("cannot open, to check its modes,", path, e)
                    continue
                _tighten_dir(cfd, path, what, counts)
                continue
            if stat.S_ISLNK(st.st_mode):
                continue                # never followed, and its mode means nothing
            emode = stat.S_IMODE(st.st_mode)
            if emode & (_LOOSE | 0o7000):
                # the folder is ours alone by now, so the entry stat saw is the
                # one chmod changes (no other user can swap a link in)
                try:
                    os.chmod(name, emode & FILE_MODE, dir_fd=dfd)
                    counts[0] += 1
                except OSError as e:
                    fail("cannot take group/other access off", path, e)
    finally:
        os.close(dfd)
