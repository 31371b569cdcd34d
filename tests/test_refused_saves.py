"""A save that had a write refused is never published (issue 38, item 2; the
rule issue 34 keeps): a refused create leaves no name, a refused rewrite
leaves the version before, and the writer's close and fsync report the
refused write's errno -- with `head -c`, the shell's `>`, and a Python
writer, in the default mode and under the kernel's writeback cache
(docs/semantics.md, "Errors change nothing").  The saves here are larger
than the SSD tier's ssd_capacity (a draft the 8M memory tier has no room for
continues in a spill file, tests/test_spill.py, and is refused there: ENOSPC);
the handlers' test, without an SSD tier, has the memory tier's EFBIG.  A full
SSD disk is tests/test_ssd_full.py."""

from __future__ import annotations

import collections
import errno
import os
import subprocess
import sys

import pyfuse3
import pytest
from conftest import CTX

MiB = 1 << 20
MODES = [pytest.param(0, id="write-through"), pytest.param(1, id="writeback-cache")]


def _tier(make_mount, wb: int):
    # a draft the memory tier has no room for spills to the SSD directory,
    # whose ssd_capacity refuses it (ENOSPC) beyond 10 MiB (tests/test_spill.py)
    m = make_mount(capacity="8M", ssd_capacity="10M", writeback_cache=wb)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    return m, d


def _sh(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("wb", MODES)
def test_head_beyond_the_tier_into_a_new_name_leaves_no_name(make_mount, wb):
    """`head -c 20M /dev/zero > slot` beyond the tiers: the shell's `>` opens
    with O_TRUNC and closes its own descriptor (after dup2) before head
    writes; head's writes are refused (ENOSPC): no name is left behind."""
    m, d = _tier(make_mount, wb)
    r = _sh(f"head -c 20M /dev/zero > {d}/new")
    assert r.returncode != 0, r
    assert not (d / "new").exists()
    assert "new" not in os.listdir(d)
    log = m.logtext()
    refusals = [line.split(" ", 4)[-1] for line in log.splitlines() if "refused (" in line]
    assert refusals and all("a/s/new" in line for line in refusals), refusals
    # one refused save, a few lines: identical refusals are folded (their count)
    assert max(collections.Counter(refusals).values()) == 1, refusals
    assert len(refusals) <= 6, refusals


@pytest.mark.parametrize("wb", MODES)
def test_head_beyond_the_tier_over_a_slot_keeps_the_version_before(make_mount, wb):
    m, d = _tier(make_mount, wb)
    (d / "k").write_bytes(b"version one")
    r = _sh(f"head -c 20M /dev/zero > {d}/k")
    assert r.returncode != 0, r
    assert (d / "k").read_bytes() == b"version one"
    assert os.stat(d / "k").st_size == len(b"version one")


@pytest.mark.parametrize("wb", MODES)
def test_a_python_writer_refused_leaves_no_new_name(make_mount, wb):
    m, d = _tier(make_mount, wb)
    with pytest.raises(OSError) as e:
        with open(d / "py", "wb") as f:
            f.write(b"x" * (20 * MiB))
    assert e.value.errno in (errno.ENOSPC, errno.EIO)
    assert not (d / "py").exists()


@pytest.mark.parametrize("wb", MODES)
def test_close_and_fsync_report_the_refused_write(make_mount, wb):
    """The writes up to the tier's size are accepted, then one is refused;
    fsync and close fail (the refused write's errno in the write-through
    mode), and what is published is still the version before."""
    m, d = _tier(make_mount, wb)
    (d / "k").write_bytes(b"v1" * 100)
    fd = os.open(d / "k", os.O_WRONLY | os.O_TRUNC)
    refused = None
    try:
        try:
            for _ in range(12):
                os.write(fd, b"y" * MiB)
        except OSError as e:
            refused = e.errno
        if wb:
            assert refused is None          # (the kernel's page cache took them)
        else:
            assert refused == errno.ENOSPC
        with pytest.raises(OSError) as e:
            os.fsync(fd)
        assert e.value.errno == (errno.ENOSPC if not wb else e.value.errno)
        assert e.value.errno in (errno.EFBIG, errno.EIO, errno.ENOSPC)
    finally:
        with pytest.raises(OSError) as e:
            os.close(fd)
    assert e.value.errno in (errno.EFBIG, errno.EIO, errno.ENOSPC)
    assert (d / "k").read_bytes() == b"v1" * 100


def test_a_writer_that_truncates_below_the_refused_bytes_publishes(make_mount):
    """A refused write keeps the draft from publishing only while its bytes
    are missing: a writer that cuts them off (ftruncate) chose the size,
    and its close publishes what it kept."""
    m, d = _tier(make_mount, 0)
    fd = os.open(d / "k", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"z" * MiB)
        assert _write_until_refused(fd, MiB) == errno.ENOSPC
        os.ftruncate(fd, MiB)
    finally:
        os.close(fd)
    assert (d / "k").read_bytes() == b"z" * MiB


def _write_until_refused(fd: int, off: int) -> int:
    """1 MiB writes from off on until one is refused: its errno."""
    for i in range(16):
        try:
            os.pwrite(fd, b"w" * MiB, off + i * MiB)
        except OSError as e:
            return e.errno
    return 0


def test_the_handlers_publish_nothing_after_a_refused_write(make_handlers):
    """The rule below the mount: flush and fsync answer the refused write's
    errno, the version before stays, a refused create's name goes with its
    last writer; a truncate below the refused bytes lets the draft publish."""
    fs = make_handlers(capacity=4 * MiB)
    fs.mkdirs("a/s")
    fs.write("a/s/k", b"v1")
    ctx = CTX
    fi = fs.call("open", fs.lookup("a/s/k"), os.O_WRONLY | os.O_TRUNC, ctx)
    fs.call("write", fi.fh, 0, b"v2")
    assert fs.err("write", fi.fh, 2, b"x" * (8 * MiB)) == errno.EFBIG
    assert fs.err("flush", fi.fh) == errno.EFBIG
    assert fs.err("fsync", fi.fh, False) == errno.EFBIG
    assert fs.read("a/s/k") == b"v1"
    fs.call("release", fi.fh)
    assert fs.read("a/s/k") == b"v1"
    parent = fs.lookup("a/s")
    fi, _ = fs.call("create", parent, b"new", 0o644, os.O_WRONLY | os.O_TRUNC, ctx)
    assert fs.err("write", fi.fh, 0, b"x" * (8 * MiB)) == errno.EFBIG
    assert fs.err("flush", fi.fh) == errno.EFBIG
    fs.call("release", fi.fh)
    assert fs.err("lookup", parent, b"new", ctx) == errno.ENOENT
    fi = fs.call("open", fs.lookup("a/s/k"), os.O_WRONLY, ctx)
    fs.call("write", fi.fh, 2, b"+")
    assert fs.err("write", fi.fh, 3, b"x" * (8 * MiB)) == errno.EFBIG
    assert fs.err("flush", fi.fh) == errno.EFBIG
    cut = pyfuse3.EntryAttributes()
    cut.st_size = 3
    fields = type("Fields", (), {f: False for f in (
        "update_mode", "update_uid", "update_gid", "update_atime", "update_mtime")})()
    fields.update_size = True
    fs.call("setattr", fs.lookup("a/s/k"), cut, fields, fi.fh, ctx)     # ftruncate(3)
    assert fs.err("flush", fi.fh) == 0
    fs.call("release", fi.fh)
    assert fs.read("a/s/k") == b"v1+"


def test_refused_ranges_go_when_written_again_or_cut_off():
    """The bookkeeping behind the rule (the slot table, native/slot.c): a
    refused range goes when a later write covers it or a truncate cuts it
    off; while one is left, the draft's publish is refused with the first
    refusal's errno."""
    from memosfs import _native as n
    m = n.SlotMachine(first_ino=10)
    ino, _ = m.create(1, 7, 7, True, False, 0)
    m.wrote(ino, 0, 1000, 0)

    def left():
        return m.field(ino, n.SLOT_F_REFUSED)

    def plan():
        return m.publish_plan(ino, 7, 7)[0]
    m.refused(ino, 100, 200, errno.ENOSPC)
    m.refused(ino, 300, 400, errno.EFBIG)
    assert left() == 2 and m.field(ino, n.SLOT_F_REFUSED_CODE) == errno.ENOSPC
    assert plan() == n.SLOT_PUBLISH_REFUSED
    m.wrote(ino, 100, 50, 0)
    assert left() == 2                      # [150, 200) and [300, 400) are left
    m.wrote(ino, 140, 70, 0)                # a retry of the rest succeeded
    assert left() == 1 and plan() == n.SLOT_PUBLISH_REFUSED
    m.truncated(ino, 350, 0)
    assert left() == 1                      # [300, 350)
    m.truncated(ino, 300, 0)                # the writer chose a size below it
    assert left() == 0 and m.field(ino, n.SLOT_F_REFUSED_CODE) == 0
    assert plan() == n.SLOT_PUBLISH_DO
    for i in range(20):                     # many: merged, never fewer bytes
        m.refused(ino, i * 10, i * 10 + 1, errno.EIO)
    assert 1 <= left() <= 8 and plan() == n.SLOT_PUBLISH_REFUSED
    m.wrote(ino, 0, 100, 0)                 # (merged: a write inside is not enough)
    assert plan() == n.SLOT_PUBLISH_REFUSED
    m.wrote(ino, 0, 300, 0)
    assert left() == 0 and plan() == n.SLOT_PUBLISH_DO
    m.refused(ino, 5, 5, errno.EIO)         # a refused truncate to 5: one byte
    assert left() == 1
    m.check()


def test_the_shells_truncating_redirect_of_nothing_still_publishes(make_mount):
    """`: > slot` and `echo x > slot` (the descriptor dup'd onto stdout and
    the opened one closed first) publish as before: an empty slot, a new
    version."""
    m, d = _tier(make_mount, 0)
    r = _sh(f": > {d}/e && echo hello > {d}/h && cat {d}/e {d}/h")
    assert r.returncode == 0 and r.stdout == "hello\n", r
    (d / "k").write_bytes(b"old")
    r = _sh(f"printf new > {d}/k && cat {d}/k")
    assert r.stdout == "new"
    assert (d / "e").stat().st_size == 0


def test_an_opener_with_two_opens_publishes_at_the_first_close(make_mount):
    """The wait for the shell's dup'd descriptor applies to a copy of the
    same open only: a process that opened a new name twice (nothing written)
    publishes the empty slot when it closes one of them, as the opener's
    close always does (found by tests/test_model_mount.py's writer model)."""
    m, d = _tier(make_mount, 0)
    a = os.open(d / "y", os.O_WRONLY | os.O_CREAT, 0o644)
    b = os.open(d / "y", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.close(a)
        r = _sh(f"stat -c %s {d}/y")
        assert r.returncode == 0 and r.stdout.strip() == "0", r
    finally:
        os.close(b)


def test_a_dup_d_close_after_the_roots_attributes_expired_does_not_hang(make_mount):
    """The close of an O_TRUNC descriptor with nothing written while its
    process holds a copy (the shell's `>`) makes the daemon look up its own
    mount in /proc; it must never stat the mountpoint for that: from the
    thread that serves requests, a stat the kernel sends to the mount (the
    root's attributes expired, ATTR_TIMEOUT) would wait for itself (found
    by fsx at its exit: the mount hung)."""
    m, d = _tier(make_mount, 0)
    script = ("import os, sys, time\n"
              "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)\n"
              "copy = os.dup(fd)\n"
              "time.sleep(2.5)\n"                   # (past the root's attribute timeout)
              "os.close(fd)\n"
              "os.write(copy, b'after')\n"
              "os.close(copy)\n")
    try:
        r = subprocess.run([sys.executable, "-c", script, str(d / "late")], timeout=60,
                           capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        m.kill9()
        pytest.fail("the close hung: the daemon waited on a request to its own mount")
    assert r.returncode == 0, r.stderr
    assert (d / "late").read_bytes() == b"after"
