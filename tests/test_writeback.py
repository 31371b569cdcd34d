"""The kernel's writeback cache (-o writeback_cache=1): what changes for
clients, as docs/semantics.md states it, pinned here; and what does not (a
reader never sees unpublished bytes, publish on close)."""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import stat
import subprocess

import pytest

SETPRIV = shutil.which("setpriv")
SETPRIV_OK = SETPRIV is not None and os.geteuid() == 0


def as_uid(uid: int, script: str) -> subprocess.CompletedProcess:
    return subprocess.run([SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           "sh", "-c", script], capture_output=True, text=True, timeout=60)

pytestmark = pytest.mark.mount
MiB = 1 << 20


def test_small_writes_reach_the_daemon_as_few_large_requests(make_mount):
    """2,048 writes of 4 KiB: the kernel keeps them and hands them over at
    close in requests of up to 1 MiB (and asks nothing per write: no
    security.capability getxattr, no getattr)."""
    m = make_mount(capacity="64M", writeback_cache=1)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    before = m.stats()["fast_requests"]
    fd = os.open(d / "k", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(2048):
            os.write(fd, bytes([i % 251]) * 4096)
    finally:
        os.close(fd)
    asked = m.stats()["fast_requests"] - before
    assert asked < 64, asked                # 8 MiB: 8 writes, a flush, a release, ...
    data = (d / "k").read_bytes()
    assert len(data) == 8 * MiB and data[4096 * 7:4096 * 8] == bytes([7]) * 4096


def test_write_through_mount_sends_every_write(make_mount):
    m = make_mount(capacity="64M", writeback_cache=0)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    before = m.stats()["fast_requests"]
    with open(d / "k", "wb", buffering=0) as f:
        for _ in range(256):
            f.write(b"x" * 4096)
    assert m.stats()["fast_requests"] - before >= 256


def test_readers_never_see_a_writers_unpublished_pages(make_mount):
    """While a writer rewrites a slot in place, a reader that opens reads the
    published version, through read and through mmap; another process's stat
    shows the writer's size (the kernel keeps it); the writer's close
    publishes."""
    m = make_mount(capacity="64M", writeback_cache=1)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    (d / "k").write_bytes(b"old!" * 1024)
    w = os.open(d / "k", os.O_RDWR)
    try:
        os.pwrite(w, b"NEW!" * 4096, 0)     # 16 KiB, in the writer's pages only
        probe = subprocess.run(["stat", "-c", "%s", str(d / "k")], capture_output=True,
                               text=True)
        assert probe.stdout.strip() == str(16384)   # the writer's size, as documented
        reader = subprocess.run(
            ["python3", "-c", "import sys,mmap;f=open(sys.argv[1],'rb');d=f.read();"
             "print(len(d), set(d[:4096]) <= set(b'old!'))", str(d / "k")],
            capture_output=True, text=True)
        assert reader.stdout.split() == ["4096", "True"], reader
        with open(d / "k", "rb") as f:      # (another descriptor of this process)
            pass
    finally:
        os.close(w)
    assert (d / "k").read_bytes() == b"NEW!" * 4096
    with open(d / "k", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
        assert mm[:8] == b"NEW!NEW!" and len(mm) == 16384


def test_a_slot_larger_than_memory_fails_the_close_and_publishes_nothing(make_mount):
    """write(2) goes to the kernel's cache and succeeds; the close that hands
    the pages over fails, the version before stays, the reason is logged."""
    m = make_mount(capacity="4M", ssd_capacity="4M", writeback_cache=1)  # (spilled, refused there)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    (d / "k").write_bytes(b"v1")
    fd = os.open(d / "k", os.O_WRONLY | os.O_TRUNC)
    os.write(fd, b"x" * (6 * MiB))          # accepted by the page cache
    with pytest.raises(OSError) as e:
        os.close(fd)
    assert e.value.errno in (errno.EIO, errno.EFBIG, errno.ENOSPC)
    assert (d / "k").read_bytes() == b"v1"
    assert "larger than the SSD tier's ssd_capacity" in m.logtext()


def test_the_write_through_mount_refuses_the_write_itself(make_mount):
    """... and the close fails too (the draft lacks the refused bytes: it is
    not published, tests/test_refused_saves.py), the version before stays."""
    m = make_mount(capacity="4M", ssd_capacity="4M", writeback_cache=0)  # (spilled, refused there)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    (d / "k").write_bytes(b"v1")
    fd = os.open(d / "k", os.O_WRONLY | os.O_TRUNC)
    try:
        with pytest.raises(OSError) as e:
            for _ in range(6):
                os.write(fd, b"x" * MiB)
        assert e.value.errno == errno.ENOSPC
    finally:
        with pytest.raises(OSError) as e:
            os.close(fd)
    assert e.value.errno == errno.ENOSPC
    assert (d / "k").read_bytes() == b"v1"


@pytest.mark.skipif(not SETPRIV_OK, reason="needs root and setpriv")
@pytest.mark.parametrize("wb", [0, 1])
def test_a_write_by_another_uid_clears_the_set_user_id_bit(make_mount, wb):
    """The mount clears suid (and sgid of a group-executable file) when the
    kernel asks (FUSE_HANDLE_KILLPRIV_V2, negotiated with and without the
    writeback cache): a write, a truncate or an O_TRUNC open by a uid without
    CAP_FSETID; root's write keeps them."""
    m = make_mount(world=True, capacity="64M", writeback_cache=wb)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    os.chmod(m.p("a"), 0o777)
    os.chmod(d, 0o777)
    f = d / "k"
    f.write_bytes(b"x")
    os.chmod(f, 0o6777)
    with open(f, "ab") as w:                # root: kept
        w.write(b"y")
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o6777
    r = as_uid(5001, f"printf z >> {f}")
    assert r.returncode == 0, r.stderr
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o0777
    # sgid of a file that is not group-executable stays (it marks mandatory
    # locking, not privilege); suid goes, by truncate and by an O_TRUNC open
    for how in (f"truncate -s 1 {f}", f": > {f}"):
        os.chmod(f, 0o6767)
        r = as_uid(5001, how)
        assert r.returncode == 0, (how, r.stderr)
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o2767, how


def _requests(m) -> dict[str, int]:
    text = (m.path / ".memos" / "debug" / "requests").read_text()
    return {k: int(v) for k, v in (line.split() for line in text.splitlines())}


@pytest.mark.parametrize("wb", [0, 1])
def test_a_4k_write_stream_sends_no_request_besides_its_writes(make_mount, wb):
    """FUSE_HANDLE_KILLPRIV_V2 lets the kernel skip its security.capability
    getxattr before every write (once per inode): a 4 KiB write stream is one
    WRITE per write without the writeback cache, and a handful with it
    (.memos/debug/requests counts what the kernel sent)."""
    m = make_mount(capacity="64M", writeback_cache=wb)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    block = os.urandom(4096)
    before = _requests(m)
    fd = os.open(d / "k", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for _ in range(512):
            assert os.write(fd, block) == 4096
    finally:
        os.close(fd)
    after = _requests(m)
    sent = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert sent.get("getxattr", 0) <= 2, sent
    if wb:
        assert 1 <= sent["write"] <= 4, sent
    else:
        assert sent["write"] == 512, sent
    # all of it there, in order
    assert (d / "k").read_bytes() == block * 512
    assert sum(sent.values()) <= sent["write"] + 16, sent
