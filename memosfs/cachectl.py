"""`memosfs ls | evict | drop | pin | unpin`: see and steer what is cached.

    memosfs ls [-l] [--json] [PATH...]   the slots at or below each PATH (default .):
                                         tier (mem, ssd, remote), size; with -l also
                                         the bytes stored, age, hits, dirty, pinned
    memosfs evict PATH...                slots leave memory for the SSD tier (written
                                         back first if dirty); never deleted
    memosfs drop PATH...                 slots the SSD tier already holds leave memory
    memosfs pin PATH... / unpin PATH...  keep slots in memory / let them go again

A PATH is a slot, or a directory on the mount (an agent, a session or a folder
below one): the command covers every slot below it.  `ls` reads each slot's
`user.memos.*` attributes, `pin` and `unpin` set `user.memos.pin` on each,
and `evict` and `drop` write the PATH relative to the mount into
`.memos/cache/evict` or `.memos/cache/drop` (memosfs/fuse/steer.py): the
kernel and the daemon decide, by owners and modes, what the caller may see
and steer, so any user may run them on their own agents, and root on all.
A slot that stays (pinned, dirty for `drop`, no SSD tier) is named on stderr
with the reason, and the exit status is 1.  A PATH on no memosfs mount is
said once (`PATH: not a memosfs mount`, exit 1) and never walked.

The age of a slot is the time since its current version was written (its
mtime); hits count the reads of the version memory holds (0 once it left).

A leaf: files, attributes and the standard library only.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import stat
import sys
import time
from dataclasses import asdict, dataclass
from typing import Iterator, Optional

__all__ = ["SlotInfo", "slot_info", "walk", "mount_root", "add_parsers"]

ATTR = "user.memos."


@dataclass
class SlotInfo:
    path: str                   # as reached from the PATH given
    tier: str                   # mem, ssd, remote (none: left every tier)
    size: int                   # logical bytes
    stored_bytes: int           # bytes the tier holding it uses
    age_s: float                # seconds since its version was written
    hits: int                   # reads of the version memory holds
    dirty: bool                 # in memory, not yet on the SSD tier
    pinned: bool
    version: int
    uid: int
    gid: int
    mode: int


def _attr(path: str, name: str) -> str:
    try:
        return os.getxattr(path, ATTR + name, follow_symlinks=False).decode("ascii", "replace")
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP):
            return ""
        raise


def slot_info(path: str, now: Optional[float] = None) -> SlotInfo:
    """One slot's listing; OSError from stat or getxattr (ENOTSUP: not on a
    memosfs mount)."""
    st = os.lstat(path)
    tier = _attr(path, "tier")
    if not tier:
        raise OSError(errno.ENOTSUP, "not a slot of a memosfs mount", path)

    def num(name: str) -> int:
        text = _attr(path, name)
        return int(text) if text.isdigit() else 0

    return SlotInfo(path=path, tier=tier, size=st.st_size, stored_bytes=num("stored_bytes"),
                    age_s=round(max(0.0, (now or time.time()) - st.st_mtime), 3),
                    hits=num("hits"), dirty=_attr(path, "dirty") == "1",
                    pinned=_attr(path, "pin") == "1", version=num("version"),
                    uid=st.st_uid, gid=st.st_gid, mode=stat.S_IMODE(st.st_mode))


def walk(path: str, errors: list[str]) -> Iterator[str]:
    """The regular files at or below path, in name order; what cannot be
    read is noted in errors (`PATH: reason`) and passed over."""
    try:
        st = os.lstat(path)
    except OSError as e:
        errors.append(f"{path}: {e.strerror}")
        return
    if stat.S_ISREG(st.st_mode):
        yield path
        return
    if not stat.S_ISDIR(st.st_mode):
        return
    try:
        names = sorted(os.listdir(path))
    except OSError as e:
        errors.append(f"{path}: {e.strerror}")
        return
    for name in names:
        if name in (".memos", ".federated") and _is_mount_root(path):
            continue                    # the control plane and the federated jobs
        yield from walk(os.path.join(path, name), errors)


def _is_mount_root(path: str) -> bool:
    return os.path.isfile(os.path.join(path, ".memos", "cache", "stats"))


def mount_root(path: str) -> tuple[str, str]:
    """(the memosfs mount holding path, path relative to it); OSError ENOTSUP
    when path is on no memosfs mount."""
    full = os.path.abspath(path)
    d = full
    while True:
        if _is_mount_root(d) and os.path.ismount(d):
            return d, os.path.relpath(full, d)
        parent = os.path.dirname(d)
        if parent == d:
            raise OSError(errno.ENOTSUP, "not on a memosfs mount", path)
        d = parent


# ---------------------------------------------------------------- ls


def _human(n: float) -> str:
    for unit in ("B", "K", "M", "G", "T"):
        if n < 1024 or unit == "T":
            return f"{int(n)}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024
    return str(n)


def _age(s: float) -> str:
    for unit, secs in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= secs:
            return f"{s / secs:.1f}{unit}"
    return f"{s:.0f}s"


def _off_mount(path: str) -> Optional[str]:
    """`PATH: not a memosfs mount` when path exists on no memosfs mount (ls,
    pin and unpin then never walk it: a home directory is no cache), else
    None (a path that does not exist is said by the walk)."""
    if not os.path.lexists(path):
        return None
    for p in (path, os.path.realpath(path)):
        try:
            mount_root(p)
            return None
        except OSError:
            pass
    return f"{path}: not a memosfs mount"


def cmd_ls(args: argparse.Namespace) -> int:
    errors: list[str] = []
    rows: list[SlotInfo] = []
    now = time.time()
    for top in args.paths or ["."]:
        off = _off_mount(top)
        if off:
            errors.append(off)
            continue
        for path in walk(top, errors):
            try:
                rows.append(slot_info(path, now))
            except OSError as e:
                errors.append(f"{path}: {e.strerror}")
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=1))
    elif args.long:
        print(f"{'TIER':<6} {'SIZE':>8} {'STORED':>8} {'AGE':>6} {'HITS':>6} "
              f"{'DIRTY':<5} {'PIN':<3} PATH")
        for r in rows:
            print(f"{r.tier:<6} {_human(r.size):>8} {_human(r.stored_bytes):>8} "
                  f"{_age(r.age_s):>6} {r.hits:>6} {'yes' if r.dirty else '-':<5} "
                  f"{'yes' if r.pinned else '-':<3} {r.path}")
        by_tier: dict[str, int] = {}
        for r in rows:
            by_tier[r.tier] = by_tier.get(r.tier, 0) + 1
        tiers = ", ".join(f"{n} {t}" for t, n in sorted(by_tier.items()))
        print(f"total {len(rows)} slot{'s' if len(rows) != 1 else ''}"
              f"{': ' + tiers if tiers else ''}; "
              f"{_human(sum(r.size for r in rows))} in all, "
              f"{_human(sum(r.size for r in rows if r.tier == 'mem'))} in memory, "
              f"{sum(r.dirty for r in rows)} dirty, {sum(r.pinned for r in rows)} pinned")
    else:
        for r in rows:
            print(f"{r.tier:<6} {_human(r.size):>8}  {r.path}")
    for line in errors:
        print(f"memosfs ls: {line}", file=sys.stderr)
    return 1 if errors else 0


# ---------------------------------------------------------------- evict, drop


def _why(root: str) -> str:
    try:
        with open(os.path.join(root, ".memos", "why")) as f:
            line = f.readline().strip()       # (the last refusal: the first line)
    except OSError:
        return ""
    # `time ERRNO (message): reason`: the reason is what the caller needs
    return line.split("): ", 1)[1] if "): " in line else line


def cmd_steer(args: argparse.Namespace) -> int:
    status = 0
    for path in args.paths:
        try:
            root, rel = mount_root(path)
        except OSError as e:
            print(f"memosfs {args.cmd}: {path}: {e.strerror}", file=sys.stderr)
            status = 1
            continue
        ctl = os.path.join(root, ".memos", "cache", args.cmd)
        try:
            fd = os.open(ctl, os.O_WRONLY)
        except OSError as e:
            print(f"memosfs {args.cmd}: {ctl}: {e.strerror}", file=sys.stderr)
            return 1
        try:
            os.write(fd, (rel if rel != "." else "").encode("utf-8", "surrogateescape")
                     + b"\n")
        except OSError as e:                # the daemon's refusal: .memos/why says why
            reason = _why(root).removeprefix(f"{args.cmd}: ")
            print(f"memosfs {args.cmd}: {path}: {e.strerror}"
                  + (f": {reason}" if reason else ""), file=sys.stderr)
            status = 1
            continue
        finally:
            os.close(fd)
        if args.verbose:
            errors: list[str] = []
            tiers: dict[str, int] = {}
            for p in walk(path, errors):
                try:
                    t = slot_info(p).tier
                except OSError:
                    continue
                tiers[t] = tiers.get(t, 0) + 1
            print(f"{path}: " + (", ".join(f"{n} {t}" for t, n in sorted(tiers.items()))
                                 or "no slots"))
    return status


# ---------------------------------------------------------------- pin, unpin


def cmd_pin(args: argparse.Namespace) -> int:
    value = b"1" if args.cmd == "pin" else b"0"
    status = 0
    errors: list[str] = []
    for top in args.paths:
        off = _off_mount(top)
        if off:
            errors.append(off)
            continue
        for path in walk(top, errors):
            try:
                os.setxattr(path, ATTR + "pin", value, follow_symlinks=False)
            except OSError as e:
                reason = ""
                if e.errno not in (errno.EACCES, errno.EPERM):  # (the kernel's own)
                    try:
                        reason = _why(mount_root(path)[0])
                    except OSError:
                        pass
                errors.append(f"{path}: {e.strerror}" + (f": {reason}" if reason else ""))
    for line in errors:
        print(f"memosfs {args.cmd}: {line}", file=sys.stderr)
        status = 1
    return status


def add_parsers(sub) -> None:
    ls = sub.add_parser("ls", help="list cached slots: tier, size, age, hits, dirty, pinned",
                        description=__doc__.split("\n\n")[0])
    ls.add_argument("paths", nargs="*", metavar="PATH")
    ls.add_argument("-l", "--long", action="store_true",
                    help="stored bytes, age, hits, dirty and pinned too, and a total")
    ls.add_argument("--json", action="store_true", help="one JSON object per slot")
    ls.set_defaults(fn=cmd_ls)
    for name, text in (("evict", "move slots out of memory to the SSD tier (written back "
                                 "first if dirty; nothing is deleted)"),
                       ("drop", "drop from memory the slots the SSD tier already holds")):
        p = sub.add_parser(name, help=text)
        p.add_argument("paths", nargs="+", metavar="PATH")
        p.add_argument("-v", "--verbose", action="store_true",
                       help="then count the slots of each PATH by tier")
        p.set_defaults(fn=cmd_steer, cmd=name)
    for name, text in (("pin", "keep slots in memory (user.memos.pin=1)"),
                       ("unpin", "let pinned slots be evicted again")):
        p = sub.add_parser(name, help=text)
        p.add_argument("paths", nargs="+", metavar="PATH")
        p.set_defaults(fn=cmd_pin, cmd=name)
