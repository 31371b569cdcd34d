"""Is a path on a memosfs mount?  The client refuses one meant for a mount
that is not there.

A program that saves slots under /mnt/memos after the mount went (an
unmount, a daemon that died, a reboot before fstab's mount) would write onto
the bare mount point directory, on the root disk, and find out only when an
attribute of memosfs's is missing.  `check_path` tells those apart from any
other path:

- on a memosfs mount (its directory, or the nearest one that exists, is on
  a filesystem /proc/self/mountinfo lists as `fuse.memosfs`): fine;
- below a memosfs mount point with nothing mounted on it (a directory on
  the way carries the daemon's mark, `abi.MOUNTPOINT_XATTR`, or /etc/fstab
  names it as a `fuse.memosfs` mount point): `NotOnMount`, naming it;
- anywhere else: fine too.  The kv helpers work on any filesystem (a test's
  temporary directory, a copy on local disk); only a path that can be told
  to be meant for memosfs is refused.

A leaf: the standard library and `memosfs.abi` only.
"""

from __future__ import annotations

import errno
import os
from typing import Optional

from memosfs.abi import MOUNTPOINT_XATTR

__all__ = ["NotOnMount", "check_path", "on_memosfs"]

FSTAB = "/etc/fstab"


class NotOnMount(OSError):
    """A path below a memosfs mount point with nothing mounted on it
    (ENODEV); `mountpoint` names that directory."""

    def __init__(self, path: str, mountpoint: str) -> None:
        self.mountpoint = mountpoint
        super().__init__(errno.ENODEV, f"{mountpoint} is a memosfs mount point with nothing "
                                       f"mounted on it (mount it first: `make run`, or "
                                       f"`mount {mountpoint}`)", path)


def _existing(path: str) -> str:
    """path, or its nearest ancestor that exists."""
    p = path
    while not os.path.lexists(p):
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return p


def _unescape(field: str) -> str:
    """mountinfo and fstab write a space, a tab, a newline and a backslash as \\ooo."""
    import re
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def on_memosfs(path: str | os.PathLike) -> Optional[bool]:
    """Whether path (or its nearest existing ancestor) is on a memosfs mount;
    None when /proc cannot say."""
    try:
        st = os.stat(_existing(os.path.abspath(os.fspath(path))))
        dev = f"{os.major(st.st_dev)}:{os.minor(st.st_dev)}"
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and fields[2] == dev and "-" in fields[5:]:
                    rest = fields[fields.index("-", 5) + 1:]
                    if rest and rest[0] == "fuse.memosfs":
                        return True
    except OSError:
        return None
    return False


def _fstab_points() -> set[str]:
    """Mount points /etc/fstab gives a fuse.memosfs filesystem."""
    points = set()
    try:
        with open(FSTAB) as f:
            for line in f:
                fields = line.split("#", 1)[0].split()
                if len(fields) >= 3 and fields[2] == "fuse.memosfs":
                    points.add(os.path.normpath(_unescape(fields[1])))
    except OSError:
        pass
    return points


def _marked(d: str) -> bool:
    try:
        os.getxattr(d, MOUNTPOINT_XATTR)
        return True
    except OSError:
        return False


def check_path(path: str | os.PathLike) -> None:
    """NotOnMount when path lies below a memosfs mount point that has no
    memosfs mounted (module docstring); nothing otherwise."""
    full = os.path.abspath(os.fspath(path))
    if on_memosfs(full) is not False:
        return
    fstab = _fstab_points()
    seen = set()
    for start in (full, os.path.realpath(_existing(full))):
        d = start
        while d not in seen:
            seen.add(d)
            if d in fstab or (os.path.isdir(d) and _marked(d)):
                raise NotOnMount(os.fspath(path), d)
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
