"""Faults: kill -9 of the daemon in the middle of write loops, and a full SSD.

The kill cycles (memosfs/faults.py holds the writer and the checker, which
`memosfs bench persist` uses too): 8 cycles in the normal suite; set
MEMOSFS_FAULT_CYCLES (`make test-faults` sets 100) for the long run and
MEMOSFS_FAULT_SEED to replay a seed.  Every fsync-acknowledged version must
come back (or a later one), every slot present must be exactly one version
the writer wrote, and no mount may be left behind.  A second run mixes in
namespace changes made durable by an fsync of the directory: renames over
existing slots (write tmp, fsync, rename over, fsync the session), unlinks,
mkdirs of sessions; what those made durable must survive too, and no name
may come back after its durable unlink.

The full SSD: a small tmpfs as the SSD directory; writes fail with ENOSPC,
nothing stored is lost, the daemon keeps serving.
"""

from __future__ import annotations

import errno
import os
import random
import subprocess
import time
import warnings
from pathlib import Path

import pytest

from memosfs.testing import faults
from memosfs.store.ssd import _name_of, read_trailer

from conftest import FUSE_REASON, is_mounted

pytestmark = pytest.mark.skipif(FUSE_REASON is not None, reason=FUSE_REASON or "")

CYCLES = int(os.environ.get("MEMOSFS_FAULT_CYCLES") or 8)
SEED = int(os.environ.get("MEMOSFS_FAULT_SEED") or random.SystemRandom().getrandbits(32))


# A known daemon bug, reported rather than failed on (it is a matter of
# timing, about one kill in fifty): fs.py's page-cache pusher stats the slot
# through the mount from a worker thread; a kill -9 that lands after the
# main thread read that request and before it answered leaves the worker
# waiting uninterruptibly, so the daemon never exits, /dev/fuse stays open
# and the mount hangs until its connection is aborted through fusectl.
STUCK = ("kill -9 did not end the daemon (a thread stuck in a request to its own "
         "mount); the FUSE connection was aborted: ")


def mounts_under(path: Path) -> list[str]:
    p = os.path.realpath(path)
    with open("/proc/mounts") as f:
        return [line.split()[1] for line in f if line.split()[1].startswith(p + "/")]


@pytest.fixture
def no_mounts_left(tmp_path):
    yield
    assert mounts_under(tmp_path) == [], "a mount was left behind"


def _run_kill_cycles(make_mount, tmp_path, **ops) -> faults.FaultReport:
    mounts = []

    def mount(ssd: str, opts: dict):
        mounts.append(make_mount(ssd=ssd, **opts))
        return mounts[-1]

    rep = faults.run_cycles(str(tmp_path / "faults"), CYCLES, seed=SEED, mount=mount, **ops)
    why = f"seed {SEED} (MEMOSFS_FAULT_SEED={SEED} replays it): {rep.summary()}\n" \
          + "\n".join(rep.problems[:50])
    print(why)
    assert rep.cycles == CYCLES, why
    assert rep.slots_corrupted == 0, why
    assert rep.slots_lost == 0, why
    assert rep.slots_resurrected == 0, why
    assert rep.writer_errors == 0, why
    assert rep.problems == [], why
    assert rep.writes > CYCLES and rep.acked > 0 and rep.slots_checked > 0, why
    if rep.kills_stuck:
        warnings.warn(STUCK + "\n".join(rep.stuck))
    assert len(mounts) == CYCLES + 2
    for m in mounts:
        assert m.proc.poll() is not None, "a daemon outlived its cycle"
        assert not is_mounted(m.path)
    return rep


@pytest.mark.slow
def test_kill9_during_write_loops(no_mounts_left, make_mount, tmp_path):
    _run_kill_cycles(make_mount, tmp_path)


@pytest.mark.slow
def test_kill9_during_renames_unlinks_and_mkdirs(no_mounts_left, make_mount, tmp_path):
    """Writes, renames over slots, unlinks and mkdirs, each namespace change
    followed by an fsync of its directory (fs.py's fsyncdir ->
    Store.sync_namespace), killed at random points."""
    rep = _run_kill_cycles(make_mount, tmp_path, renames=0.3, unlinks=0.1, mkdirs=0.05)
    assert rep.renames > 0 and rep.unlinks > 0 and rep.dir_syncs > 0, rep.summary()


def test_kill9_right_after_fsync(no_mounts_left, make_mount, tmp_path):
    """The narrowest case: fsync returns, the daemon dies at once."""
    ssd = tmp_path / "ssd"
    m = make_mount(ssd=ssd, capacity="16M", writeback_delay_ms=600000)
    sess = m.p(faults.AGENT, "s0")
    sess.mkdir(parents=True)
    want = {}
    for i, size in enumerate([1024, 5000, 2 * faults.MiB, 3 * faults.MiB]):
        key = f"s0/k{i:02d}"
        want[key] = faults.slot_bytes(key, i + 1, size)
        fd = os.open(m.p(faults.AGENT, key), os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            os.write(fd, want[key])
            os.fsync(fd)
        finally:
            os.close(fd)
    # a later version, closed but not fsync'd: it may or may not survive
    later = faults.slot_bytes("s0/k00", 9, 4096)
    m.p(faults.AGENT, "s0", "k00").write_bytes(later)
    if faults.kill9(m):
        warnings.warn(STUCK)
    assert not is_mounted(m.path)
    m2 = make_mount(ssd=ssd, capacity="16M")
    for key, data in want.items():
        got = m2.p(faults.AGENT, key).read_bytes()
        assert got == data or (key == "s0/k00" and got == later), key
    assert m2.stats()["ssd_corrupt"] == 0


# ---------------------------------------------------------------- full SSD

@pytest.fixture
def small_tmpfs(tmp_path):
    """An 8 MiB tmpfs, unmounted at teardown; name it before make_mount so
    that the memosfs mounts go first."""
    d = tmp_path / "tmpfs-ssd"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(d)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    yield d
    subprocess.run(["umount", str(d)], check=False)
    if is_mounted(d):
        subprocess.run(["umount", "-l", str(d)], check=False)


SLOT = 300 * 1024


def _content(i: int) -> bytes:
    return faults.slot_bytes(f"s/k{i:03d}", i, SLOT)


def _fill(m) -> tuple[list[int], list[tuple[int, str, int]]]:
    """Write 300 KiB slots, fsync every other one, until a write or close
    fails (fsync may fail first).  Returns (fsync'd, failures)."""
    sess = m.p("a", "s")
    sess.mkdir(parents=True)
    synced: list[int] = []
    failures: list[tuple[int, str, int]] = []
    for i in range(200):
        stage = "open"
        fd = -1
        try:
            fd = os.open(sess / f"k{i:03d}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            stage = "write"
            os.write(fd, _content(i))
            if i % 2 == 0:
                stage = "fsync"
                try:
                    os.fsync(fd)
                    synced.append(i)
                except OSError as e:
                    failures.append((i, stage, e.errno))
            stage = "close"
            fd, closing = -1, fd
            os.close(closing)
        except OSError as e:
            failures.append((i, stage, e.errno))
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError as e2:
                    failures.append((i, "close", e2.errno))
            break
    return synced, failures


def _ssd_payload(ssd: Path, i: int) -> bytes:
    name = _name_of(f"a/s/k{i:03d}".encode())
    path = ssd / "slots" / name[:2] / (name + ".slot")
    with open(path, "rb") as f:
        entry = read_trailer(f.fileno(), str(path))
        return f.read(entry.size)


def test_full_ssd_is_enospc_and_keeps_what_is_stored(no_mounts_left, small_tmpfs, make_mount):
    m = make_mount(ssd=small_tmpfs, capacity="4M", writeback_delay_ms=50)
    synced, failures = _fill(m)
    assert failures, "the SSD never filled"
    assert failures[-1][1] in ("write", "close", "open"), failures
    assert {e for _, _, e in failures} == {errno.ENOSPC}, failures
    assert len(synced) >= 4, (synced, failures)
    # nothing stored is lost: each fsync'd version is on the SSD, whole
    for i in synced:
        assert _ssd_payload(small_tmpfs, i) == _content(i), i
    # the daemon is alive and serves: stats, the slots memory holds, and the
    # fsync'd ones, from their files if memory (full of what the SSD cannot
    # take) has no room for them
    assert m.proc.poll() is None
    assert m.stats()["slots"] > 0
    in_memory = 0
    for i in range(failures[-1][0]):
        p = m.p("a", "s", f"k{i:03d}")
        if os.getxattr(p, "user.memos.tier") == b"mem":
            assert p.read_bytes() == _content(i), i
            in_memory += 1
    assert in_memory > 0
    for i in synced:
        assert m.p("a", "s", f"k{i:03d}").read_bytes() == _content(i), i
    time.sleep(0.3)             # the background writer meets the full disk too
    assert m.proc.poll() is None
    # with room on the SSD again, everything comes back and writes work
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_tmpfs)], check=True)
    (m.ctl("flush")).write_text("1")
    for i in synced:
        assert m.p("a", "s", f"k{i:03d}").read_bytes() == _content(i), i
    m.p("a", "s", "after").write_bytes(b"x" * SLOT)
    assert m.p("a", "s", "after").read_bytes() == b"x" * SLOT
    assert m.proc.poll() is None


# ---------------------------------------------------------------- the bench

@pytest.mark.mount         # the bench mounts through its own daemons
@pytest.mark.slow
def test_bench_persist_small(no_mounts_left, tmp_path):
    """`memosfs bench persist` end to end, small: one JSON object with every
    figure, nothing lost, no mount or temporary folder left."""
    import json
    import sys

    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    r = subprocess.run([sys.executable, "-m", "memosfs", "bench", "persist", "--json",
                        "--size", "16M", "--slot", "2M", "--cycles", "2", "--repeat", "1"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, TMPDIR=str(tmp)))
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-4000:]}"
    out = json.loads(r.stdout)
    for k in ("writeback_MBps", "raw_write_MBps", "writeback_ratio", "mount_s",
              "first_slot_s", "warmup_MBps", "raw_read_MBps", "warmup_ratio"):
        assert out[k] > 0, k
    assert out["cycles"] == 2 and out["slots_checked"] > 0
    assert out["slots_lost"] == out["slots_corrupted"] == 0, out
    assert out["warmup_total_bytes"] == out["size_bytes"] == 16 << 20
    assert list(tmp.iterdir()) == []
