"""Crash testing: kill -9 the daemon in the middle of write loops, remount,
check what the SSD tier kept.  Shared by `tests/test_faults.py` and
`memosfs bench persist`.

One cycle: mount (the same SSD directory every time) -> check every slot
against what the writer ever wrote -> start the writer -> after a random
50-500 ms, SIGKILL the daemon by its pid -> wait for it, lazily unmount.
After the last cycle: mount, check, a short write burst, a clean unmount,
mount again and check that every slot holds exactly its newest version.

The writer (`python -m memosfs.testing.faults writer ...`, a separate process so that
nothing in the checker can block on the dead mount) loops over a small pool
of keys (agent `fault`, sessions s0.., slots k00..), writing whole slots of
random sizes (1 KiB - 3 MiB) whose bytes are a function of (key, version)
(`slot_bytes`), so the checker can recompute any version.  Versions are
unique (one counter for all keys) and grow from cycle to cycle (`base` + the
counter).  Before each write it journals `W key version size`; after an
fsync that returned, `A key version` (acknowledged: durable); after a close
that returned, `C key version`; on the first error, `X errno monotonic_ns
stage: error` and it stops (an error before the kill is a failure of its own).

With --renames, --unlinks and --mkdirs (shares of the operations; 0 by
default), it also changes the namespace the way applications make files
durable, each change followed by an fsync of the directory (`S dir` before,
`D dir` once it returned; dir is a session, or `.` for the agent directory):
  - a rename over an existing slot: write `key.tmp` (whose bytes are those of
    `key`'s version: `content_key`), fsync it, `N key.tmp key version`,
    rename(2), `M key.tmp key version`, fsync of the session;
  - an unlink: `U key`, unlink(2) (ENOENT is fine), `V key`, fsync of the session;
  - a mkdir of a new session `mVERSION`: `K name`, mkdir(2), `L name`, fsync of
    the agent directory.

The rules the checker applies, per name:
  - a slot present must be byte for byte one version the writer wrote, or
    renamed, to that name (header, size and every byte; never torn, never a
    mix) — else corrupted;
  - the newest version known durable (fsync-acknowledged, moved here by a
    rename whose directory fsync returned, or read back after an earlier
    restart) must be present, as that version or a later one — else lost;
  - a rename not yet made durable may or may not have happened, but its
    acknowledged version is under one of the two names — else lost;
  - a rename that may or may not have happened happened whole: its version is
    never under both names (ext4 leaves exactly one) — else duplicated;
  - a name unlinked or renamed away, durably (its directory fsync returned),
    or found absent after a restart, never comes back with a version older
    than that — else resurrected;
  - a session made by a durable mkdir is there — else lost;
  - after the clean unmount, the namespace is exactly what the writer left;
  - files the mount set aside as corrupt (`ssd_corrupt`) count as corrupted.

A kill -9 that does not end the daemon (a thread of it waits, unkillably, on
a request to its own mount) is counted as `kills_stuck`; `kill9` then aborts
the FUSE connection through fusectl so that nothing hangs.

May call: memosfs.testing.daemon (starting, stopping and killing daemons);
nothing of the daemon itself (the writer and the checker go through the mount).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from memosfs.testing.daemon import (  # noqa: F401  (re-exported)
    FUSECTL, Daemon, MountLike, abort_connection, fuse_connection, is_mounted, kill9,
    read_stats)
MiB = 1 << 20
AGENT = "fault"
HEADER = struct.Struct("<8sQQ16s")       # magic, version, size, key digest
MAGIC = b"FLTSLOT1"
MIN_SIZE = 1024
MAX_SIZE = 3 * MiB


# ---------------------------------------------------------------- content

def _digest(key: str) -> bytes:
    return hashlib.blake2b(key.encode(), digest_size=16).digest()


def slot_bytes(key: str, version: int, size: int) -> bytes:
    """The bytes of `version` of `key`: a header, then bytes seeded by both."""
    assert size >= HEADER.size
    head = HEADER.pack(MAGIC, version, size, _digest(key))
    return head + random.Random(f"{key}:{version}").randbytes(size - HEADER.size)


def parse_slot(key: str, data: bytes) -> int:
    """The version `data` is, or ValueError saying why it is none."""
    if len(data) < HEADER.size:
        raise ValueError(f"{len(data)} bytes, shorter than the header")
    magic, version, size, digest = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ValueError(f"no header magic ({magic!r})")
    if digest != _digest(key):
        raise ValueError("header of another key")
    if size != len(data):
        raise ValueError(f"header says {size} bytes, slot has {len(data)}")
    if data != slot_bytes(key, version, size):
        raise ValueError(f"bytes differ from version {version} (torn or mixed)")
    return version


def slot_keys(sessions: int, per_session: int) -> list[str]:
    return [f"s{s}/k{i:02d}" for s in range(sessions) for i in range(per_session)]


TMP_SUFFIX = ".tmp"


def content_key(name: str) -> str:
    """The key whose versions a name holds: `key.tmp` holds `key`'s (it is
    renamed over `key` once written)."""
    return name[:-len(TMP_SUFFIX)] if name.endswith(TMP_SUFFIX) else name


def _dir_of(name: str) -> str:
    return name.rsplit("/", 1)[0] if "/" in name else "."


# ---------------------------------------------------------------- mounts
# Starting, stopping and killing daemons is memosfs/testing/daemon.py's; the
# names stay importable from here (tests and `bench persist` use faults.X).

# ---------------------------------------------------------------- the writer

def writer_main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m memosfs.testing.faults writer")
    ap.add_argument("mnt")
    ap.add_argument("journal")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--base", type=int, default=0, help="first version number - 1")
    ap.add_argument("--sessions", type=int, default=3)
    ap.add_argument("--per-session", type=int, default=16)
    ap.add_argument("--fsync", type=float, default=0.3, help="share of writes fsync'd")
    ap.add_argument("--renames", type=float, default=0.0,
                    help="share of operations that write key.tmp, fsync it, rename it "
                         "over key and fsync the directory")
    ap.add_argument("--unlinks", type=float, default=0.0,
                    help="share of operations that unlink a slot and fsync the directory")
    ap.add_argument("--mkdirs", type=float, default=0.0,
                    help="share of operations that make a session and fsync the agent "
                         "directory")
    ap.add_argument("--min-size", type=int, default=MIN_SIZE)
    ap.add_argument("--max-size", type=int, default=MAX_SIZE)
    ap.add_argument("--count", type=int, default=0, help="stop after this many (0: never)")
    ap.add_argument("--max-seconds", type=float, default=60)
    a = ap.parse_args(argv)
    rng = random.Random(a.seed)
    keys = slot_keys(a.sessions, a.per_session)
    root = os.path.join(a.mnt, AGENT)
    jfd = os.open(a.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def journal(line: str) -> None:
        os.write(jfd, (line + "\n").encode())

    def write(name: str, version: int, size: int, sync: bool) -> None:
        nonlocal stage
        data = slot_bytes(content_key(name), version, size)
        journal(f"W {name} {version} {size}")
        stage = "open"
        fd = os.open(os.path.join(root, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            stage = "write"
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view[:MiB]):]
            if sync:
                stage = "fsync"
                os.fsync(fd)
                journal(f"A {name} {version}")
        except OSError:
            try:
                os.close(fd)
            except OSError:
                pass
            raise
        stage = "close"
        os.close(fd)
        journal(f"C {name} {version}")

    def sync_dir(d: str) -> None:
        nonlocal stage
        journal(f"S {d}")
        stage = f"fsync of directory {d}"
        fd = os.open(os.path.join(root, d), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        journal(f"D {d}")

    version = a.base
    deadline = time.monotonic() + a.max_seconds
    done = 0
    stage = "mkdir"
    try:
        for s in range(a.sessions):
            os.makedirs(os.path.join(root, f"s{s}"), exist_ok=True)
        journal("R")
        while time.monotonic() < deadline and (not a.count or done < a.count):
            key = rng.choice(keys)
            size = rng.randint(a.min_size, a.max_size)
            r = rng.random()
            version += 1
            if r < a.renames:
                tmp = key + TMP_SUFFIX
                write(tmp, version, size, sync=True)
                journal(f"N {tmp} {key} {version}")
                stage = "rename"
                os.rename(os.path.join(root, tmp), os.path.join(root, key))
                journal(f"M {tmp} {key} {version}")
                sync_dir(_dir_of(key))
            elif r < a.renames + a.unlinks:
                journal(f"U {key}")
                stage = "unlink"
                try:
                    os.unlink(os.path.join(root, key))
                except FileNotFoundError:
                    pass
                journal(f"V {key}")
                sync_dir(_dir_of(key))
            elif r < a.renames + a.unlinks + a.mkdirs:
                name = f"m{version}"
                journal(f"K {name}")
                stage = "mkdir"
                os.mkdir(os.path.join(root, name))
                journal(f"L {name}")
                sync_dir(".")
            else:
                write(key, version, size, sync=rng.random() < a.fsync)
            done += 1
    except OSError as e:
        journal(f"X {e.errno or 0} {time.monotonic_ns()} {stage}: {e}".replace("\n", " "))
        return 0
    finally:
        journal("E")
    return 0


def start_writer(mnt: str | os.PathLike, journal: str, seed: int, base: int,
                 **opts: object) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "memosfs.testing.faults", "writer", str(mnt), journal,
           "--seed", str(seed), "--base", str(base)]
    for k, v in opts.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def read_journal(path: str) -> list[list[str]]:
    try:
        with open(path) as f:
            return [line.split(" ", 3) for line in f.read().splitlines() if line]
    except FileNotFoundError:
        return []


# ---------------------------------------------------------------- the checker

@dataclass
class History:
    """What the writer ever did, per name, across cycles (see the rules in
    the module's docstring)."""
    written: dict[str, set[int]] = field(default_factory=dict)  # versions a name may hold
    floor: dict[str, int] = field(default_factory=dict)     # newest known durable
    gone: dict[str, int] = field(default_factory=dict)      # no version <= this may be back
    # renames not yet durable: src -> (dst, the acknowledged version of src)
    pending: dict[str, tuple[str, int]] = field(default_factory=dict)
    # the last rename started from each name since the last restart: src -> (dst, version)
    renaming: dict[str, tuple[str, int]] = field(default_factory=dict)
    sessions: set[str] = field(default_factory=set)         # made by a durable mkdir
    state: dict[str, int] = field(default_factory=dict)     # the namespace, as the writer left it
    dirs: set[str] = field(default_factory=set)             # its sessions
    newest: int = 0                                         # the newest version written
    writes: int = 0
    acked: int = 0
    renames: int = 0            # renames that returned
    unlinks: int = 0            # unlinks that returned
    mkdirs: int = 0             # mkdirs that returned
    dir_syncs: int = 0          # directory fsyncs that returned
    # namespace changes that returned, waiting for their directory's fsync
    _moved: list[tuple[str, str, int]] = field(default_factory=list)
    _unlinked: list[tuple[str, int]] = field(default_factory=list)
    _made: list[str] = field(default_factory=list)

    def apply(self, events: list[list[str]]) -> None:
        for ev in events:
            kind = ev[0]
            if kind == "W":
                v = int(ev[2])
                self.written.setdefault(ev[1], set()).add(v)
                self.newest = max(self.newest, v)
                self.writes += 1
            elif kind == "A":
                v = int(ev[2])
                self.floor[ev[1]] = max(self.floor.get(ev[1], 0), v)
                self.acked += 1
            elif kind == "C":
                self.state[ev[1]] = int(ev[2])
            elif kind == "N":                   # rename src dst: may or may not happen
                src, dst, v = ev[1], ev[2], int(ev[3])
                self.written.setdefault(dst, set()).add(v)
                self.renaming[src] = (dst, v)
                if src in self.floor:
                    self.pending[src] = (dst, self.floor.pop(src))
            elif kind == "M":
                src, dst, v = ev[1], ev[2], int(ev[3])
                self.state[dst] = self.state.pop(src, v)
                self._moved.append((src, dst, v))
                self.renames += 1
            elif kind == "U":                   # the unlinked version need not survive
                self.floor.pop(ev[1], None)
            elif kind == "V":
                self.state.pop(ev[1], None)
                self._unlinked.append((ev[1], self.newest))
                self.unlinks += 1
            elif kind == "L":
                self.dirs.add(ev[1])
                self._made.append(ev[1])
                self.mkdirs += 1
            elif kind == "D":                   # what changed in that directory is durable
                d = ev[1]
                self.dir_syncs += 1
                for src, dst, v in [m for m in self._moved if _dir_of(m[1]) == d]:
                    self.floor[dst] = max(self.floor.get(dst, 0), v)
                    self.pending.pop(src, None)
                    self.floor.pop(src, None)
                    self.gone[src] = max(self.gone.get(src, 0), v)
                self._moved = [m for m in self._moved if _dir_of(m[1]) != d]
                for name, newest in [u for u in self._unlinked if _dir_of(u[0]) == d]:
                    self.gone[name] = max(self.gone.get(name, 0), newest)
                self._unlinked = [u for u in self._unlinked if _dir_of(u[0]) != d]
                if d == ".":
                    self.sessions.update(self._made)
                    self._made = []


@dataclass
class Check:
    checked: int = 0
    lost: int = 0
    corrupted: int = 0
    resurrected: int = 0
    problems: list[str] = field(default_factory=list)


def check_mount(mnt: str | os.PathLike, hist: History, exact: bool = False) -> Check:
    """Read every slot under mnt/fault and hold it against the history;
    then what was read back is durable: floors rise to it, names absent
    stay absent.  exact: the namespace must be exactly the one the writer
    left (after a clean unmount)."""
    res = Check()
    root = os.path.join(mnt, AGENT)
    present: dict[str, int] = {}
    try:
        sessions = sorted(os.listdir(root))
    except FileNotFoundError:
        sessions = []
    for sess in sessions:
        for name in sorted(os.listdir(os.path.join(root, sess))):
            key = f"{sess}/{name}"
            res.checked += 1
            try:
                with open(os.path.join(root, key), "rb") as f:
                    data = f.read()
            except OSError as e:
                res.corrupted += 1
                res.problems.append(f"{key}: listed but unreadable: {e}")
                continue
            try:
                v = parse_slot(content_key(key), data)
            except ValueError as e:
                res.corrupted += 1
                res.problems.append(f"{key}: {e}")
                continue
            if v not in hist.written.get(key, ()):
                res.corrupted += 1
                res.problems.append(f"{key}: version {v} was never written (or renamed) here")
                continue
            if v <= hist.gone.get(key, 0):
                res.resurrected += 1
                res.problems.append(f"{key}: version {v} is back; the name was gone "
                                    f"durably (up to version {hist.gone[key]})")
            present[key] = v
    for key, floor in sorted(hist.floor.items()):
        v = present.get(key)
        if v is None:
            res.checked += 1
            res.lost += 1
            res.problems.append(f"{key}: version {floor} was durable, the slot is gone")
        elif v < floor:
            res.lost += 1
            res.problems.append(f"{key}: version {v} came back, {floor} was durable")
    for src, (dst, v) in sorted(hist.renaming.items()):
        if present.get(src) == v and present.get(dst) == v:
            res.corrupted += 1
            res.problems.append(f"{src}: version {v} is under both {src} and {dst}: the "
                                f"rename happened half")
    for src, (dst, v) in sorted(hist.pending.items()):
        if present.get(src, 0) < v and present.get(dst, 0) < v:
            res.lost += 1
            res.problems.append(f"{src}: version {v} was durable and renamed to {dst} "
                                f"(not yet durably); it is under neither name")
    for sess in sorted(hist.sessions - set(sessions)):
        res.lost += 1
        res.problems.append(f"{sess}: the session was made durably, it is gone")
    if exact:
        for key in sorted(set(hist.state) | set(present)):
            want, got = hist.state.get(key), present.get(key)
            if want == got:
                continue
            if want is None:
                res.resurrected += 1
                res.problems.append(f"{key}: version {got} is there, the writer left no "
                                    "such name")
            else:
                res.lost += 1
                res.problems.append(f"{key}: version {got} is there, the writer left "
                                    f"{want}")
        for sess in sorted(hist.dirs - set(sessions)):
            res.lost += 1
            res.problems.append(f"{sess}: the writer made this session, it is gone")
    # what the restart shows is durable from now on
    for key, v in present.items():
        hist.floor[key] = max(hist.floor.get(key, 0), v)
    for key, versions in hist.written.items():
        if key not in present:              # absent stays absent (a loss is told once)
            hist.gone[key] = max(hist.gone.get(key, 0), max(versions))
            hist.floor.pop(key, None)
    hist.pending.clear()
    hist.renaming.clear()
    hist._moved, hist._unlinked, hist._made = [], [], []
    hist.state = dict(present)
    hist.dirs = set(sessions)
    return res


# ---------------------------------------------------------------- cycles

@dataclass
class FaultReport:
    cycles: int = 0
    slots_checked: int = 0
    slots_lost: int = 0
    slots_corrupted: int = 0
    slots_resurrected: int = 0      # names back after their durable unlink or rename
    ssd_corrupt: int = 0            # files the mounts set aside (in slots_corrupted too)
    writes: int = 0                 # slot writes started
    acked: int = 0                  # fsyncs acknowledged
    renames: int = 0                # renames over a slot that returned
    unlinks: int = 0                # unlinks that returned
    mkdirs: int = 0                 # mkdirs of sessions that returned
    dir_syncs: int = 0              # fsyncs of a directory that returned
    writer_errors: int = 0          # errors before the kill (not the dead mount's)
    kills_stuck: int = 0            # kill -9 alone did not end the daemon (see kill9)
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)

    def add(self, c: Check, where: str) -> None:
        self.slots_checked += c.checked
        self.slots_lost += c.lost
        self.slots_corrupted += c.corrupted
        self.slots_resurrected += c.resurrected
        self.problems += [f"{where}: {p}" for p in c.problems]

    def summary(self) -> dict[str, object]:
        return {"cycles": self.cycles, "slots_checked": self.slots_checked,
                "slots_lost": self.slots_lost, "slots_corrupted": self.slots_corrupted,
                "slots_resurrected": self.slots_resurrected,
                "ssd_corrupt": self.ssd_corrupt, "writes": self.writes,
                "acked": self.acked, "renames": self.renames, "unlinks": self.unlinks,
                "mkdirs": self.mkdirs, "dir_syncs": self.dir_syncs,
                "writer_errors": self.writer_errors,
                "kills_stuck": self.kills_stuck,
                "seconds": round(self.seconds, 2)}


MountFn = Callable[[str, dict], MountLike]


def daemon_factory(workdir: str) -> MountFn:
    """Mount with a Daemon: mountpoint and log under workdir, one per mount."""
    n = [0]

    def mount(ssd: str, opts: dict) -> Daemon:
        n[0] += 1
        return Daemon(os.path.join(workdir, f"mnt{n[0]}"), ssd,
                      os.path.join(workdir, f"mnt{n[0]}.log"), opts)
    return mount


def run_cycles(workdir: str, cycles: int, seed: int = 0, mount: Optional[MountFn] = None,
               capacity: str = "16M", writeback_delay_ms: int = 50,
               delay_ms: tuple[int, int] = (50, 500), sessions: int = 3,
               per_session: int = 16, fsync: float = 0.3, renames: float = 0.0,
               unlinks: float = 0.0, mkdirs: float = 0.0,
               progress: Optional[Callable[[str], None]] = None) -> FaultReport:
    """`cycles` kill -9 cycles on one SSD directory under workdir, then the
    clean-unmount round; every mount it makes is gone when it returns.
    renames, unlinks, mkdirs: shares of the writer's operations that change
    the namespace (each followed by an fsync of the directory)."""
    mount = mount or daemon_factory(workdir)
    ssd = os.path.join(workdir, "ssd")
    os.makedirs(ssd, exist_ok=True)
    opts = {"capacity": capacity, "writeback_delay_ms": writeback_delay_ms}
    rng = random.Random(seed)
    hist = History()
    rep = FaultReport()
    t0 = time.monotonic()
    wopts = {"sessions": sessions, "per_session": per_session, "fsync": fsync,
             "renames": renames, "unlinks": unlinks, "mkdirs": mkdirs}
    live: list[MountLike] = []

    def new_mount() -> MountLike:
        m = mount(ssd, opts)
        live.append(m)
        stats = read_stats(m.path)
        bad = int(stats.get("ssd_corrupt", 0))
        rep.ssd_corrupt += bad
        rep.slots_corrupted += bad
        if bad:
            rep.problems.append(f"mount {len(live)}: {bad} slot files set aside as corrupt")
        return m

    try:
        for cycle in range(1, cycles + 1):
            m = new_mount()
            rep.add(check_mount(m.path, hist), f"cycle {cycle}")
            journal = os.path.join(workdir, f"journal{cycle}")
            w = start_writer(m.path, journal, seed=rng.getrandbits(32),
                             base=cycle * 1_000_000, **wopts)
            try:
                deadline = time.monotonic() + 20
                while not read_journal(journal) and w.poll() is None \
                        and time.monotonic() < deadline:
                    time.sleep(0.005)
                time.sleep(rng.uniform(*delay_ms) / 1000)
                killed_ns = time.monotonic_ns()
                if kill9(m):
                    rep.kills_stuck += 1
                    rep.stuck.append(f"cycle {cycle}: kill -9 left daemon {m.proc.pid} "
                                     "hanging in a request to its own mount; aborted "
                                     "the FUSE connection")
            finally:
                try:
                    w.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    w.kill()
                    w.wait()
                    rep.problems.append(f"cycle {cycle}: the writer hung on the dead mount")
                err = w.stderr.read().decode(errors="replace") if w.stderr else ""
                if w.stderr:
                    w.stderr.close()
            events = read_journal(journal)
            hist.apply(events)
            if w.returncode != 0:
                rep.writer_errors += 1
                rep.problems.append(f"cycle {cycle}: writer exit {w.returncode}: {err[-2000:]}")
            for ev in events:
                if ev[0] == "X":
                    # after the kill the kernel answers: ENOTCONN mostly, and
                    # EIO or ENOENT for requests the abort cut short
                    when = int(ev[2])
                    if when < killed_ns:
                        rep.writer_errors += 1
                        rep.problems.append(
                            f"cycle {cycle}: writer error {(when - killed_ns) / 1e6:+.1f} ms "
                            f"from the kill: {ev[3] if len(ev) > 3 else ev[1]}")
            rep.cycles += 1
            if progress:
                progress(f"cycle {cycle}: {sum(e[0] == 'W' for e in events)} writes, "
                         f"{sum(e[0] == 'A' for e in events)} fsyncs acknowledged, "
                         f"{sum(e[0] == 'D' for e in events)} directory fsyncs")
        # the last restart, then a clean unmount must keep every newest version
        m = new_mount()
        rep.add(check_mount(m.path, hist), "after the last kill")
        journal = os.path.join(workdir, "journal-clean")
        w = start_writer(m.path, journal, seed=rng.getrandbits(32),
                         base=(cycles + 1) * 1_000_000, count=12, **wopts)
        try:
            w.wait(timeout=120)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()
        events = read_journal(journal)
        hist.apply(events)
        for ev in events:
            if ev[0] == "X":
                rep.writer_errors += 1
                rep.problems.append(f"clean round: writer error {' '.join(ev[1:])}")
        m.stop()                        # everything the writer left must survive
        m = new_mount()
        rep.add(check_mount(m.path, hist, exact=True), "after a clean unmount")
        m.stop()
    finally:
        for m in live:
            if m.proc.poll() is None or is_mounted(m.path):
                try:
                    m.stop()
                except Exception:
                    kill9(m)
        for i, m in enumerate(live, 1):
            logtext = getattr(m, "logtext", None)
            if logtext is not None and "Traceback" in logtext():
                rep.problems.append(f"mount {i}: the daemon logged a traceback ({m.log})")
        rep.writes, rep.acked = hist.writes, hist.acked
        rep.renames, rep.unlinks, rep.mkdirs = hist.renames, hist.unlinks, hist.mkdirs
        rep.dir_syncs = hist.dir_syncs
        rep.seconds = time.monotonic() - t0
    return rep


def main(argv: Optional[list[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["writer"]:
        return writer_main(argv[1:])
    print("usage: python -m memosfs.testing.faults writer MNT JOURNAL [options]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
