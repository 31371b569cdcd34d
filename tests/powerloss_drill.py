"""The power-loss drill: a workload on a memosfs mount whose SSD directory
loses power, again and again, and a checker of what came back.

One cycle: mount memosfs (the same SSD directory every time) -> check the
tree against what the writer was told is durable -> start the writer ->
after a random 0.5-3 s, kill -9 the daemon -> the power loss (LazyFS drops
its unsynced writes, or the file system is shut down without flushing its
log: tests/lazyfs.py) -> sometimes a byte of a slot file or segment record
on the disk is flipped (damage the next mount must detect: a byte the slot's
version reads, so in a slot file with an extent log not one the log's
records overwrote or cut off, which no read of the slot sees).  After the last
cycle: a short write burst, a clean unmount, and every latest state must be
there exactly.

The writer (`python tests/powerloss_drill.py writer MNT JOURNAL ...`, its own
process, so nothing in the checker waits on the dead mount) works under
agent `pl`: sessions s0-s2 and directories below them, holding slots small
(packed in segments), large (slot files; partly rewritten in place, so that
write-backs append to extent logs) and larger than the memory tier (drafts
that spill to the SSD directory), symbolic links, FIFOs and device nodes;
it renames and unlinks slots (in a session and across sessions, over other
slots), makes and removes directories, chmods and chowns directories and
slots, sets the agent's quota, and fsyncs slots and directories.  A slot's
bytes begin with a header naming its version (unique across the drill);
the journal gives each version's sha256, so any copy can be told whole.

Journal (one JSON object a line, written before and after each call):
  set   path value ns   the path takes value (it may or may not have, until
                        acknowledged); ns: a namespace change (a directory
                        fsync acknowledges it) rather than a slot's bytes or
                        its owner and mode (its own fsync does)
  move  src dst         a rename: dst takes one of the values src may hold
  sync  path value      fsync(path) returned: the slot holds value, durably
  dsync dir             fsync of a directory returned: the namespace
                        changes of its entries (and its own) are durable
  hash  version digest  the sha256 of a version's bytes
  err   ...             the writer's first error (after the kill: expected)

The rule the checker applies to every path: what is there now is one of the
values the path took since its last acknowledged one (that one included);
a path that was never acknowledged may hold its value from before the cycle
or any it took since.  Slots present whose bytes are not a version written
or renamed there are corrupt (served); an older value than the acknowledged
one is resurrected (a slot removed or renamed away, or an old version, back)
or lost (gone, or older metadata); a path damaged on purpose may be absent,
unreadable (EIO) or an older version, never wrong bytes.  A directory
whose mkdir was never acknowledged may also come back with the mode and
owner the mount gives a folder it makes for a durable slot below it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import stat
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

AGENT = "pl"
QAGENT = "plq"                          # an agent with a quota (and no slots, which it bounds)
SESSIONS = ("s0", "s1", "s2")
MAGIC = b"PWRLOSS1"
HEAD = struct.Struct("<8sQQ")           # magic, version, size
PAGE = 4096
KiB, MiB = 1 << 10, 1 << 20
QUOTA = "user.memos.quota"
ABSENT = ("absent",)
DUMP_DIR = ""                           # where observe() keeps a slot's bad bytes


# ---------------------------------------------------------------- content

def version_bytes(version: int, size: int) -> bytes:
    """A whole write's bytes: the header, then bytes seeded by the version."""
    head = HEAD.pack(MAGIC, version, size)
    return head + random.Random(version).randbytes(max(0, size - HEAD.size))[:size - HEAD.size]


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def version_of(data: bytes) -> int:
    """The version a slot's bytes say they are (ValueError: no header)."""
    if len(data) < HEAD.size:
        raise ValueError(f"{len(data)} bytes, shorter than the header")
    magic, version, size = HEAD.unpack_from(data)
    if magic != MAGIC:
        raise ValueError(f"no header magic ({magic[:8]!r})")
    if size != len(data):
        raise ValueError(f"the header says version {version} of {size} bytes, the slot "
                         f"has {len(data)}")
    return version


# ---------------------------------------------------------------- the tree as it is

def observe(mnt: str) -> dict[str, Any]:
    """Every path under mnt/AGENT (AGENT itself included) -> its value, as
    the checker compares them: ("slot", version, mode, uid, gid) or
    ("bad", why) for a slot whose bytes are no version (or ("eio", why)
    where its read failed), ("dir", mode, uid, gid, quota), ("link",
    target, uid, gid), ("special", st_mode, rdev, uid, gid).  A name gone
    between its directory's listing and its lstat or open is absent: the
    mount set the slot aside meanwhile (its warm-up read it first and found
    the damage done on purpose), which a later look would not list either."""
    out: dict[str, Any] = {}

    def walk(rel: str) -> None:
        full = os.path.join(mnt, rel)
        try:
            st = os.lstat(full)
        except FileNotFoundError:
            return
        if stat.S_ISDIR(st.st_mode):
            try:
                quota = os.getxattr(full, QUOTA, follow_symlinks=False).decode()
            except OSError:
                quota = None
            out[rel] = ("dir", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, quota)
            for name in sorted(os.listdir(full)):
                walk(f"{rel}/{name}")
        elif stat.S_ISLNK(st.st_mode):
            out[rel] = ("link", os.readlink(full), st.st_uid, st.st_gid)
        elif stat.S_ISREG(st.st_mode):
            try:
                with open(full, "rb") as f:
                    data = f.read()
            except FileNotFoundError:
                return
            except OSError as e:
                out[rel] = ("eio", f"{e}")
                return
            try:
                v = version_of(data)
            except ValueError as e:
                out[rel] = ("bad", str(e))
                if DUMP_DIR:                    # (the bytes, for whoever looks into it)
                    with open(os.path.join(DUMP_DIR, f"bad-{rel.replace('/', '_')}-"
                                           f"{time.monotonic_ns()}"), "wb") as f:
                        f.write(data)
                return
            out[rel] = ("slot", v, stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
            out[("hash", rel)] = digest(data)
        else:
            out[rel] = ("special", st.st_mode, st.st_rdev, st.st_uid, st.st_gid)

    for agent in (AGENT, QAGENT):
        if os.path.lexists(os.path.join(mnt, agent)):
            walk(agent)
    return out


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] if "/" in path else ""


# ---------------------------------------------------------------- the writer

class Writer:
    """The workload (see the module docstring); its view of the tree is the
    tree as it found it plus what it did since."""

    def __init__(self, mnt: str, journal: str, seed: int, base: int) -> None:
        self.mnt = mnt
        self.rng = random.Random(seed)
        self.version = base
        self.jfd = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        seen = observe(mnt)
        self.tree: dict[str, Any] = {p: v for p, v in seen.items() if isinstance(p, str)}
        self.stage = "start"

    def j(self, **ev: Any) -> None:
        os.write(self.jfd, (json.dumps(ev) + "\n").encode())

    def full(self, path: str) -> str:
        return os.path.join(self.mnt, path)

    def kinds(self, kind: str) -> list[str]:
        return sorted(p for p, v in self.tree.items() if v[0] == kind)

    def set(self, path: str, value: Any, ns: bool) -> None:
        self.j(op="set", path=path, value=value, ns=ns)
        if value == ABSENT:
            self.tree.pop(path, None)
        else:
            self.tree[path] = tuple(value)

    # ---- directories that hold slots, links, and the rest

    def slot_dirs(self) -> list[str]:
        return [p for p in self.kinds("dir") if p.count("/") >= 1]

    def free_name(self, d: str, prefix: str, n: int) -> str:
        return f"{d}/{prefix}{self.rng.randrange(n)}"

    # ---- operations

    def fsync_path(self, path: str) -> None:
        self.stage = f"fsync {path}"
        fd = os.open(self.full(path), os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.j(op="sync", path=path, value=self.tree[path])

    def fsync_dir(self, d: str) -> None:
        self.stage = f"fsync of directory {d}"
        fd = os.open(self.full(d), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        self.j(op="dsync", dir=d)

    def maybe_dsync(self, *dirs: str) -> None:
        if self.rng.random() < 0.6:
            for d in dict.fromkeys(dirs):
                self.fsync_dir(d)

    def write_whole(self, size: int) -> None:
        dirs = self.slot_dirs()
        if not dirs:
            return
        path = self.free_name(self.rng.choice(dirs), "k", 10)
        cur = self.tree.get(path)
        if cur is not None and cur[0] != "slot":
            return
        self.version += 1
        data = version_bytes(self.version, size)
        self.j(op="hash", version=self.version, digest=digest(data))
        self.stage = f"write {path}"
        fd = os.open(self.full(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if cur:
                mode, uid, gid = cur[2], cur[3], cur[4]
            else:                               # (the mount's own defaults for a new slot)
                st = os.fstat(fd)
                mode, uid, gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
            self.set(path, ["slot", self.version, mode, uid, gid], ns=False)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view[:MiB]):]
        finally:
            os.close(fd)
        if self.rng.random() < 0.5:
            self.fsync_path(path)

    def patch(self) -> None:
        """Rewrite a few pages of a large slot in place (an extent log's
        record, or an overlay draft's when it spills)."""
        large = [p for p in self.kinds("slot") if self.size_of(p) >= 256 * KiB]
        if not large:
            return
        path = self.rng.choice(large)
        self.stage = f"read {path}"
        with open(self.full(path), "rb") as f:
            data = bytearray(f.read())
        cur = self.tree[path]
        self.version += 1
        data[:HEAD.size] = HEAD.pack(MAGIC, self.version, len(data))
        pages = {0} | {self.rng.randrange(len(data) // PAGE) for _ in range(self.rng.randint(1, 3))}
        for pg in pages:
            end = min(len(data), pg * PAGE + PAGE)
            start = max(pg * PAGE, HEAD.size if pg == 0 else 0)
            data[start:end] = self.rng.randbytes(end - start)
        self.j(op="hash", version=self.version, digest=digest(bytes(data)))
        self.set(path, ["slot", self.version, cur[2], cur[3], cur[4]], ns=False)
        self.stage = f"patch {path}"
        fd = os.open(self.full(path), os.O_WRONLY)
        try:
            for pg in sorted(pages):
                end = min(len(data), pg * PAGE + PAGE)
                os.pwrite(fd, bytes(data[pg * PAGE:end]), pg * PAGE)
        finally:
            os.close(fd)
        if self.rng.random() < 0.5:
            self.fsync_path(path)

    def size_of(self, path: str) -> int:
        try:
            return os.stat(self.full(path)).st_size
        except OSError:
            return 0

    def rename(self) -> None:
        slots = self.kinds("slot")
        dirs = self.slot_dirs()
        if not slots or not dirs:
            return
        src = self.rng.choice(slots)
        d = _parent(src) if self.rng.random() < 0.6 else self.rng.choice(dirs)
        dst = self.free_name(d, "k", 10)
        if dst == src or (dst in self.tree and self.tree[dst][0] != "slot"):
            return
        self.j(op="move", src=src, dst=dst)
        self.stage = f"rename {src} {dst}"
        os.rename(self.full(src), self.full(dst))
        self.tree[dst] = self.tree.pop(src)
        self.maybe_dsync(_parent(src), _parent(dst))

    def unlink(self) -> None:
        names = self.kinds("slot") + self.kinds("link") + self.kinds("special")
        if not names:
            return
        path = self.rng.choice(names)
        self.set(path, ABSENT, ns=True)
        self.stage = f"unlink {path}"
        os.unlink(self.full(path))
        self.maybe_dsync(_parent(path))

    def mkdir(self) -> None:
        sessions = [p for p in self.kinds("dir") if p.count("/") == 1]
        if not sessions:
            return
        path = self.free_name(self.rng.choice(sessions), "d", 4)
        if path in self.tree:
            return
        mode = self.rng.choice([0o700, 0o750, 0o755])
        self.set(path, ["dir", mode, 0, 0, None], ns=True)
        self.stage = f"mkdir {path}"
        os.mkdir(self.full(path), mode)
        os.chmod(self.full(path), mode)         # (whatever the umask took)
        self.maybe_dsync(_parent(path))

    def rmdir(self) -> None:
        empty = [p for p in self.kinds("dir") if p.count("/") == 2
                 and not any(q.startswith(p + "/") for q in self.tree)]
        if not empty:
            return
        path = self.rng.choice(empty)
        self.set(path, ABSENT, ns=True)
        self.stage = f"rmdir {path}"
        os.rmdir(self.full(path))
        self.maybe_dsync(_parent(path))

    def symlink(self) -> None:
        dirs = self.slot_dirs()
        if not dirs:
            return
        path = self.free_name(self.rng.choice(dirs), "l", 3)
        if path in self.tree:
            return
        target = f"../t{self.rng.randrange(1000)}"
        self.set(path, ["link", target, 0, 0], ns=True)
        self.stage = f"symlink {path}"
        os.symlink(target, self.full(path))
        self.maybe_dsync(_parent(path))

    def special(self) -> None:
        dirs = self.slot_dirs()
        if not dirs:
            return
        path = self.free_name(self.rng.choice(dirs), "p", 3)
        if path in self.tree:
            return
        if self.rng.random() < 0.5:
            mode, rdev = stat.S_IFIFO | 0o640, 0
        else:
            mode, rdev = stat.S_IFCHR | 0o600, os.makedev(1, self.rng.choice([3, 5, 7]))
        self.set(path, ["special", mode, rdev, 0, 0], ns=True)
        self.stage = f"mknod {path}"
        os.mknod(self.full(path), mode, rdev)
        self.maybe_dsync(_parent(path))

    def chattr_dir(self) -> None:
        dirs = self.kinds("dir")
        path = self.rng.choice(dirs)
        cur = list(self.tree[path])
        if self.rng.random() < 0.5:
            cur[1] = self.rng.choice([0o700, 0o711, 0o750, 0o755])
            self.set(path, cur, ns=True)
            self.stage = f"chmod {path}"
            os.chmod(self.full(path), cur[1])
        elif path == QAGENT:
            cur[4] = str(self.rng.randint(3 * MiB, 4 * MiB))
            self.set(path, cur, ns=True)
            self.stage = f"setxattr {path}"
            os.setxattr(self.full(path), QUOTA, cur[4].encode())
        else:
            cur[2], cur[3] = self.rng.choice([(0, 0), (1000, 1000), (1234, 5678)])
            self.set(path, cur, ns=True)
            self.stage = f"chown {path}"
            os.chown(self.full(path), cur[2], cur[3])
        if self.rng.random() < 0.6:
            self.fsync_dir(path if self.rng.random() < 0.5 or "/" not in path else _parent(path))

    def chattr_slot(self) -> None:
        slots = self.kinds("slot")
        if not slots:
            return
        path = self.rng.choice(slots)
        cur = list(self.tree[path])
        if self.rng.random() < 0.5:
            cur[2] = self.rng.choice([0o600, 0o640, 0o644])
            self.set(path, cur, ns=False)
            self.stage = f"chmod {path}"
            os.chmod(self.full(path), cur[2])
        else:
            cur[3], cur[4] = self.rng.choice([(0, 0), (1000, 1000), (1234, 5678)])
            self.set(path, cur, ns=False)
            self.stage = f"chown {path}"
            os.chown(self.full(path), cur[3], cur[4])
        if self.rng.random() < 0.6:
            self.fsync_path(path)

    def run(self, max_seconds: float, count: int) -> None:
        for agent in (AGENT, QAGENT):
            if agent not in self.tree:
                self.set(agent, ["dir", 0o755, 0, 0, None], ns=True)
                self.stage = f"mkdir {agent}"
                os.mkdir(self.full(agent))
                os.chmod(self.full(agent), 0o755)
        for s in SESSIONS:
            path = f"{AGENT}/{s}"
            if path not in self.tree:
                self.set(path, ["dir", 0o755, 0, 0, None], ns=True)
                self.stage = f"mkdir {path}"
                os.mkdir(self.full(path))
                os.chmod(self.full(path), 0o755)
                self.fsync_dir(AGENT)
        ops: list[tuple[float, Callable[[], None]]] = [
            (14, lambda: self.write_whole(self.rng.randint(HEAD.size, 48 * KiB))),
            (9, lambda: self.write_whole(self.rng.randint(80 * KiB, 1536 * KiB))),
            (1.5, lambda: self.write_whole(self.rng.randint(5 * MiB, 6 * MiB))),
            (6, self.patch), (6, self.rename), (4, self.unlink), (2, self.mkdir),
            (1, self.rmdir), (2, self.symlink), (2, self.special), (3, self.chattr_dir),
            (3, self.chattr_slot),
            (2, lambda: self.fsync_dir(self.rng.choice(self.kinds("dir")))),
        ]
        weights = [w for w, _ in ops]
        deadline = time.monotonic() + max_seconds
        done = 0
        while time.monotonic() < deadline and (not count or done < count):
            self.rng.choices(ops, weights)[0][1]()
            done += 1


def writer_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="powerloss_drill.py writer")
    ap.add_argument("mnt")
    ap.add_argument("journal")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=60)
    ap.add_argument("--count", type=int, default=0)
    a = ap.parse_args(argv)
    os.umask(0)
    try:
        w = Writer(a.mnt, a.journal, a.seed, a.base)
    except OSError as e:                    # (killed while it looked at the tree)
        fd = os.open(a.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, (json.dumps({"op": "err", "errno": e.errno or 0,
                                  "ns": time.monotonic_ns(), "stage": "start",
                                  "what": str(e)}) + "\n").encode())
        os.close(fd)
        return 0
    try:
        w.run(a.max_seconds, a.count)
    except OSError as e:
        w.j(op="err", errno=e.errno or 0, ns=time.monotonic_ns(), stage=w.stage, what=str(e))
    return 0


# ---------------------------------------------------------------- the checker

def _t(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


@dataclass
class Path_:
    states: list[set] = field(default_factory=list)     # the values it took, in order
    ns: list[bool] = field(default_factory=list)        # each from a namespace change
    acked: int = 0                                      # the last acknowledged state
    acked_new: bool = False                             # acknowledged during this cycle


@dataclass
class History:
    paths: dict[str, Path_] = field(default_factory=dict)
    hashes: dict[int, str] = field(default_factory=dict)     # version -> sha256
    damaged: set[str] = field(default_factory=set)          # damaged on purpose
    events: int = 0

    def path(self, p: str) -> Path_:
        got = self.paths.get(p)
        if got is None:
            got = self.paths[p] = Path_([{ABSENT}], [True], 0)
        return got

    def acceptable(self, p: str) -> set:
        h = self.paths.get(p)
        if h is None:
            return {ABSENT}
        out: set = set()
        for s in h.states[h.acked:]:
            out |= s
        return out

    def apply(self, events: list[dict]) -> None:
        for ev in events:
            self.events += 1
            op = ev["op"]
            if op == "hash":
                self.hashes[int(ev["version"])] = ev["digest"]
            elif op == "set":
                h = self.path(ev["path"])
                h.states.append({_t(ev["value"])})
                h.ns.append(bool(ev["ns"]))
            elif op == "move":
                src, dst = self.path(ev["src"]), self.path(ev["dst"])
                moved = {v for v in self.acceptable(ev["src"]) if v != ABSENT}
                dst.states.append(moved)
                dst.ns.append(True)
                src.states.append({ABSENT})
                src.ns.append(True)
            elif op == "sync":
                h = self.path(ev["path"])
                h.states.append({_t(ev["value"])})
                h.ns.append(False)
                h.acked, h.acked_new = len(h.states) - 1, True
            elif op == "dsync":
                d = ev["dir"]
                for p, h in self.paths.items():
                    if p != d and _parent(p) != d:
                        continue
                    last = max((i for i, ns in enumerate(h.ns) if ns), default=0)
                    if last > h.acked:
                        h.acked, h.acked_new = last, True

    def all_durable(self) -> None:
        """After a clean unmount: every latest state is durable."""
        for h in self.paths.values():
            if len(h.states) - 1 > h.acked:
                h.acked, h.acked_new = len(h.states) - 1, True


@dataclass
class Check:
    versions: int = 0           # acknowledged slot versions (or their metadata) checked
    namespace: int = 0          # acknowledged namespace changes checked
    lost: int = 0
    resurrected: int = 0
    corrupt_served: int = 0
    unreadable: int = 0         # reads that failed (EIO): damaged on purpose, detected
    problems: list[str] = field(default_factory=list)


def check(mnt: str, hist: History) -> Check:
    """Hold the tree against the history; afterwards what is there is the
    only value each path has (durable: a power loss has just shown it)."""
    res = Check()
    seen = observe(mnt)
    present = {p: v for p, v in seen.items() if isinstance(p, str)}
    for p in sorted(set(present) | set(hist.paths)):
        got = present.get(p, ABSENT)
        ok = hist.acceptable(p)
        h = hist.paths.get(p)
        if h is not None and h.acked_new:
            if any(v[0] == "slot" for v in h.states[h.acked]):
                res.versions += 1
            else:
                res.namespace += 1
        damaged = p in hist.damaged
        if got[0] in ("bad", "eio"):
            if damaged and got[0] == "eio":
                res.unreadable += 1
                continue
            res.corrupt_served += 1
            res.problems.append(f"{p}: served bytes that are no version: {got[1]}")
            continue
        if got[0] == "slot":
            want = hist.hashes.get(got[1])
            if want is not None and seen.get(("hash", p)) != want:
                res.corrupt_served += 1
                res.problems.append(f"{p}: version {got[1]} served with other bytes (torn "
                                    f"or mixed)")
                continue
        if got in ok:
            continue
        if got[0] == "dir" and ABSENT in ok and got[1:] in _made_for_slots(p, present):
            continue                        # made again for a durable slot below it
        if damaged and (got == ABSENT or (got[0] == "slot" and h is not None and any(
                got in s for s in h.states))):
            continue                        # a damaged version set aside: an older one, or none
        earlier = h is not None and any(got in s for s in h.states[:h.acked])
        if got == ABSENT:
            res.lost += 1
            res.problems.append(f"{p}: gone; it was durably {sorted(ok, key=str)}")
        elif ABSENT in ok and all(v == ABSENT for v in ok):
            res.resurrected += 1
            res.problems.append(f"{p}: back as {got}; it was durably gone")
        elif earlier:
            kind = "resurrected" if got[0] == "slot" and not any(
                v[0] == "slot" and v[1] == got[1] for v in ok) else "lost"
            setattr(res, kind, getattr(res, kind) + 1)
            res.problems.append(f"{p}: {got} is an older state; it was durably "
                                f"{sorted(ok, key=str)} ({kind})")
        elif got[0] == "slot" and not any(v[0] == "slot" and v[1] == got[1]
                                         for s in (h.states if h else []) for v in s):
            res.corrupt_served += 1
            res.problems.append(f"{p}: version {got[1]} was never written or renamed here")
        else:
            res.lost += 1
            res.problems.append(f"{p}: {got}; it was durably {sorted(ok, key=str)}")
    names: dict[int, list[str]] = {}
    for p, v in present.items():
        if v[0] == "slot":
            names.setdefault(v[1], []).append(p)
    for v, where in sorted(names.items()):
        if len(where) > 1:
            res.resurrected += 1
            res.problems.append(f"version {v} is under {len(where)} names: {where} (a "
                                f"rename that happened half, or a name back)")
    for p in set(hist.paths) | set(present):
        h = hist.path(p)
        now = present.get(p, ABSENT)
        if now[0] == "eio":
            now = ABSENT                    # (set aside when it was read)
        h.states, h.ns, h.acked, h.acked_new = [{now}], [True], 0, False
    hist.damaged.clear()
    return res


NEW_DIR_MODE = 0o755 & ~0o077         # a folder the mount makes (its umask knob: 077)


def _made_for_slots(p: str, present: dict[str, Any]) -> set:
    """The states a directory whose mkdir no fsync acknowledged may come
    back in when a slot below it is durable (its own fsync acknowledged it):
    the mount makes the folders namespace.json does not know for it, as a
    new one is made (NEW_DIR_MODE, the slot's owner, no quota); the mode
    the mkdir gave it was never durable."""
    return {(NEW_DIR_MODE, v[3], v[4], None) for q, v in present.items()
            if q.startswith(p + "/") and v[0] == "slot"}


# ---------------------------------------------------------------- damage

def damage_one(ssd: str, rng: random.Random, mnt_agent: str = AGENT
               ) -> Optional[tuple[str, str]]:
    """Flip one payload byte of a slot file or of a segment record under the
    SSD directory `ssd` (the daemon not running): returns (the path under
    the mount of the slot it belongs to, the file damaged), or None if
    there was nothing to damage."""
    from memosfs.store.ssd import packed as _seg
    from memosfs.store.ssd import read_trailer
    from memosfs.store import extentlog as _xl
    files = []
    for root, _dirs, names in os.walk(os.path.join(ssd, "slots")):
        files += [os.path.join(root, n) for n in names if n.endswith(".slot")]
    segs = [os.path.join(ssd, "segments", n) for n in os.listdir(os.path.join(ssd, "segments"))
            if n.endswith(".seg")] if os.path.isdir(os.path.join(ssd, "segments")) else []
    rng.shuffle(files)
    rng.shuffle(segs)
    if files and (not segs or rng.random() < 0.5):
        for f in files:
            fd = os.open(f, os.O_RDWR)
            try:
                e = read_trailer(fd, f)
                if e.size < 2 or not e.key.startswith(mnt_agent.encode() + b"/"):
                    continue
                spans = _read_from_base(f, e, _xl)
                if not spans:
                    continue
                s0, s1 = rng.choice(spans)
                off = rng.randrange(s0, s1)
                b = os.pread(fd, 1, off)
                os.pwrite(fd, bytes([b[0] ^ 0x5A]), off)
                os.fsync(fd)
                return e.key.decode("utf-8", "surrogateescape"), f
            except Exception:
                continue
            finally:
                os.close(fd)
    for s in segs:
        with open(s, "rb") as f:
            buf = f.read()
        recs = [r for r in _seg.records(buf) if r.kind == _seg.KIND_SLOT and r.size > 1]
        if not recs:
            continue
        r = rng.choice(recs)
        off = r.off + r.length - r.size + rng.randrange(r.size)
        fd = os.open(s, os.O_RDWR)
        try:
            os.pwrite(fd, bytes([buf[off] ^ 0x5A]), off)
            os.fsync(fd)
        finally:
            os.close(fd)
        return r.key.decode("utf-8", "surrogateescape"), s
    return None


def _read_from_base(path: str, e: Any, xl: Any) -> list[tuple[int, int]]:
    """The spans [start, end) of a slot file's payload that its slot's
    version reads: all of it, or with an extent log beside the file, what
    the log's records did not overwrite or cut (a byte flipped elsewhere is
    in no version the mount serves: no read can see it, and none must)."""
    try:
        with open(xl.log_path_of(path), "rb") as f:
            buf = f.read()
    except FileNotFoundError:
        return [(0, e.size)]
    recs, _end, _bad = xl.scan_log(buf, int(e.meta.get("seq", 0)), (e.version, e.size, e.crc))
    if not recs:
        return [(0, e.size)]                # (an old log: removed at mount)
    return [(so, so + (b - a)) for a, b, where, so in xl.extents(e.size, recs)
            if where == xl.BASE and b - a > 0]


# ---------------------------------------------------------------- cycles

@dataclass
class DrillReport:
    fs: str = ""
    cycles: int = 0
    versions_checked: int = 0       # acknowledged slot versions (and slot metadata)
    namespace_checked: int = 0      # acknowledged namespace changes
    lost: int = 0
    resurrected: int = 0
    corrupt_served: int = 0
    damaged: int = 0                # bytes flipped on purpose
    corrupt_detected: int = 0       # ssd_corrupt, all mounts
    corrupt_unexplained: int = 0    # of those, in mounts after no damage
    error_lines: int = 0            # ERROR lines of mounts after no damage
    writes: int = 0
    acks: int = 0                   # slot fsyncs and directory fsyncs that returned
    writer_errors: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d.pop("problems")
        d["seconds"] = round(self.seconds, 1)
        return d

    def add(self, c: Check, where: str) -> None:
        self.versions_checked += c.versions
        self.namespace_checked += c.namespace
        self.lost += c.lost
        self.resurrected += c.resurrected
        self.corrupt_served += c.corrupt_served
        self.problems += [f"{where}: {p}" for p in c.problems]


def run_drill(workdir: str, cycles: int, mount: Callable[[], Any],
              power_loss: Callable[[], None], ssd_on_disk: Callable[[], str],
              kill: Callable[[Any], None], seed: int = 0, fs: str = "",
              damage_every: int = 4, run_s: tuple[float, float] = (0.5, 3.0),
              progress: Optional[Callable[[str], None]] = None) -> DrillReport:
    """`cycles` power-loss cycles (see the module docstring).  mount() ->
    a mount (memosfs/testing/daemon.Daemon-like: .path, .stats(),
    .logtext(), .stop()); kill(m): kill -9 of its daemon; power_loss(): the
    loss itself (the daemon gone); ssd_on_disk(): the SSD directory as the
    disk holds it (where damage is done, nothing mounted over it)."""
    global DUMP_DIR
    DUMP_DIR = workdir
    rng = random.Random(seed)
    hist = History()
    rep = DrillReport(fs=fs)
    t0 = time.monotonic()
    damaged: list[str] = []                 # files damaged before the next mount

    def new_mount(where: str) -> Any:
        return mount()

    def after_check(m: Any, where: str) -> None:
        """ssd_corrupt once the check read every slot: the damage done
        must be detected (unless the scan removed the file as stale), and
        nothing else called corrupt."""
        bad = int(m.stats().get("ssd_corrupt", 0))
        rep.corrupt_detected += bad
        if damaged:
            cdir = os.path.join(ssd_on_disk(), "corrupt")
            aside = os.listdir(cdir) if os.path.isdir(cdir) else []
            gone = [f for f in damaged if not os.path.exists(f)
                    and not any(n.startswith(os.path.basename(f)) for n in aside)]
            if bad < len(damaged) - len(gone):
                rep.problems.append(f"{where}: {len(damaged)} file(s) damaged, ssd_corrupt "
                                    f"{bad}")
        elif bad:
            rep.corrupt_unexplained += bad
            rep.problems.append(f"{where}: ssd_corrupt {bad} with no damage done")
        m.drill_damaged = bool(damaged)
        damaged.clear()

    def errors_of(m: Any, where: str) -> None:
        """The ERROR lines of a mount's whole life (none, unless damage
        was done before it)."""
        if getattr(m, "drill_damaged", False):
            return
        errors = [ln for ln in m.logtext().splitlines() if " ERROR " in ln]
        rep.error_lines += len(errors)
        if errors:
            rep.problems.append(f"{where}: {len(errors)} ERROR lines: " + " | ".join(errors[:5]))

    try:
        for cycle in range(1, cycles + 1):
            where = f"cycle {cycle}"
            m = new_mount(where)
            try:
                rep.add(check(str(m.path), hist), where)
                after_check(m, where)
                journal = os.path.join(workdir, f"journal{cycle}")
                w = subprocess.Popen(
                    [sys.executable, os.path.abspath(__file__), "writer", str(m.path), journal,
                     "--seed", str(rng.getrandbits(32)), "--base", str(cycle * 1_000_000),
                     "--max-seconds", "60"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                try:
                    deadline = time.monotonic() + 20
                    while not os.path.exists(journal) and w.poll() is None \
                            and time.monotonic() < deadline:
                        time.sleep(0.01)
                    time.sleep(rng.uniform(*run_s))
                    killed_ns = time.monotonic_ns()
                    kill(m)
                finally:
                    try:
                        w.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        w.kill()
                        w.wait()
                        rep.problems.append(f"{where}: the writer hung on the dead mount")
                    err = w.stderr.read().decode(errors="replace") if w.stderr else ""
                    if w.stderr:
                        w.stderr.close()
            except BaseException:
                m.stop()
                raise
            errors_of(m, where)
            events = read_journal(journal)
            hist.apply(events)
            rep.writes += sum(e["op"] == "hash" for e in events)
            rep.acks += sum(e["op"] in ("sync", "dsync") for e in events)
            if w.returncode != 0:
                rep.writer_errors += 1
                rep.problems.append(f"{where}: writer exit {w.returncode}: {err[-2000:]}")
            for e in events:
                if e["op"] == "err" and e["ns"] < killed_ns:
                    rep.writer_errors += 1
                    rep.problems.append(f"{where}: writer error before the kill: "
                                        f"{e['stage']}: {e['what']}")
            power_loss()
            if damage_every and cycle % damage_every == 0:
                hit = damage_one(ssd_on_disk(), rng)
                if hit is not None:
                    hist.damaged.add(hit[0])
                    damaged.append(hit[1])
                    rep.damaged += 1
            rep.cycles += 1
            if progress:
                progress(f"{where}: {sum(e['op'] == 'hash' for e in events)} versions "
                         f"written, {sum(e['op'] in ('sync', 'dsync') for e in events)} "
                         f"fsyncs acknowledged")
        # the last restart; then a burst, a clean unmount: everything is there
        m = new_mount("after the last power loss")
        rep.add(check(str(m.path), hist), "after the last power loss")
        after_check(m, "after the last power loss")
        journal = os.path.join(workdir, "journal-clean")
        subprocess.run([sys.executable, os.path.abspath(__file__), "writer", str(m.path),
                        journal, "--seed", str(rng.getrandbits(32)),
                        "--base", str((cycles + 1) * 1_000_000), "--count", "60"],
                       stdout=subprocess.DEVNULL, timeout=300)
        events = read_journal(journal)
        hist.apply(events)
        for e in events:
            if e["op"] == "err":
                rep.writer_errors += 1
                rep.problems.append(f"clean round: writer error {e['stage']}: {e['what']}")
        m.stop()
        errors_of(m, "after the last power loss")
        hist.all_durable()
        m = new_mount("after a clean unmount")
        rep.add(check(str(m.path), hist), "after a clean unmount")
        after_check(m, "after a clean unmount")
        m.stop()
        errors_of(m, "after a clean unmount")
    finally:
        rep.seconds = time.monotonic() - t0
    return rep


def read_journal(path: str) -> list[dict]:
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            pass                            # (a line the kill cut short: none so far)
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["writer"]:
        sys.exit(writer_main(sys.argv[2:]))
    print("usage: powerloss_drill.py writer MNT JOURNAL [--seed N] [--base N]", file=sys.stderr)
    sys.exit(2)
