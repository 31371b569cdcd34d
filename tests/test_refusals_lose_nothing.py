"""A refusal loses nothing it did not have to (docs/semantics.md, "Errors
change nothing"; "Capacity"):

- on a memory-only mount (`ssd=none`), where an eviction loses the slot it
  takes, a save larger than the memory tier is refused (EFBIG, every time)
  before anything is evicted for it: the other slots and the version it
  would have replaced stay, and `.memos/why` says so truthfully.  A draft
  memory has no room for waits in a memory file and makes its room whole at
  its publish, so a save that fits still evicts what it must;
- a refused call that loses no bytes -- fallocate, an extending ftruncate --
  is reported to its caller and changes nothing else: the save it was part
  of is published at the close;
- `rm -rf` of a session while a process writes a new slot in it: the name
  only its writer could see does not keep the directory alive, the directory
  goes, and the writer's close publishes nothing (its `.memos/why` says why).
"""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

MiB = 1 << 20


def _memory_only(make_mount, capacity="8M"):
    m = make_mount(ssd="none", capacity=capacity)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    return m, d


def _sh(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120)


def test_a_save_larger_than_memory_evicts_nothing_on_a_memory_only_mount(make_mount):
    """`head -c 20M > big` on an 8M memory-only tier: File too large, and
    `other` (1 MiB) and `big`'s version before (21 bytes) are both still
    there, byte for byte; the log evicted nothing."""
    m, d = _memory_only(make_mount)
    other = os.urandom(MiB)
    (d / "other").write_bytes(other)
    (d / "big").write_bytes(b"the version before, 21"[:21])
    for attempt in range(2):
        r = _sh(f"head -c 20M /dev/zero > {d}/big")
        assert r.returncode != 0
        assert "File too large" in r.stderr, r.stderr      # one cause, one errno
        assert (d / "other").read_bytes() == other
        assert (d / "big").read_bytes() == b"the version before, 21"[:21]
    assert sorted(os.listdir(d)) == ["big", "other"]
    assert "evicting" not in m.logtext()
    why = (m.path / ".memos" / "why").read_text()
    assert "EFBIG" in why and "the version before stays" in why, why


def test_a_python_writer_larger_than_memory_keeps_every_slot(make_mount):
    m, d = _memory_only(make_mount)
    keep = {f"k{i}": os.urandom(512 * 1024) for i in range(6)}       # 3 MiB of 8
    for name, data in keep.items():
        (d / name).write_bytes(data)
    for _ in range(2):
        with pytest.raises(OSError) as e:
            with open(d / "huge", "wb") as f:
                for _ in range(20):
                    f.write(b"y" * MiB)
        assert e.value.errno == errno.EFBIG
    assert not (d / "huge").exists()
    for name, data in keep.items():
        assert (d / name).read_bytes() == data, name
    assert m.stats()["slots"] == len(keep)


def test_a_save_that_fits_still_evicts_what_it_must(make_mount):
    """The cache still works as a cache: a 6 MiB save on an 8M tier holding
    5 MiB of older slots is published, and older slots make the room."""
    m, d = _memory_only(make_mount)
    for i in range(5):
        (d / f"old{i}").write_bytes(bytes([i]) * MiB)
    new = os.urandom(6 * MiB)
    (d / "new").write_bytes(new)
    assert (d / "new").read_bytes() == new
    left = [n for n in os.listdir(d) if n.startswith("old")]
    assert len(left) < 5                            # some made room
    for n in left:                                  # and the rest are whole
        assert (d / n).read_bytes() == bytes([int(n[3:])]) * MiB
    # small saves into a full tier keep working, one after the other
    for i in range(40):
        (d / f"small{i}").write_bytes(b"%d" % i * 30000)
    assert (d / "small39").read_bytes() == b"39" * 30000


def test_a_rewrite_in_place_larger_than_memory_keeps_the_version_before(make_mount):
    """A writer that keeps the content (no O_TRUNC) and grows the slot past
    the memory tier: refused, and the version before stays."""
    m, d = _memory_only(make_mount)
    before = os.urandom(2 * MiB)
    (d / "k").write_bytes(before)
    fd = os.open(d / "k", os.O_WRONLY)
    try:
        with pytest.raises(OSError) as e:
            for i in range(12):
                os.pwrite(fd, b"z" * MiB, 2 * MiB + i * MiB)
        assert e.value.errno == errno.EFBIG
    finally:
        with pytest.raises(OSError):
            os.close(fd)
    assert (d / "k").read_bytes() == before


@pytest.mark.parametrize("ssd", ["none", "disk"])
def test_a_refused_fallocate_does_not_fail_the_save(make_mount, ssd):
    """write 4 KiB; posix_fallocate(16 TiB) -> ENOSPC; close() succeeds and
    the 4 KiB are the slot (as on tmpfs and ext4)."""
    m = make_mount(ssd="none", capacity="16M") if ssd == "none" else make_mount(capacity="16M")
    d = m.p("a", "s")
    d.mkdir(parents=True)
    data = os.urandom(4096)
    for name, trunc in (("new", True), ("old", False)):
        if not trunc:
            (d / name).write_bytes(b"before")
        fd = os.open(d / name, os.O_CREAT | os.O_WRONLY | (os.O_TRUNC if trunc else 0), 0o644)
        os.write(fd, data)
        with pytest.raises(OSError) as e:
            os.posix_fallocate(fd, 0, 16 << 40)
        assert e.value.errno in (errno.ENOSPC, errno.EFBIG)
        assert os.fstat(fd).st_size == 4096         # nothing else changed
        os.close(fd)
        assert (d / name).read_bytes() == data


@pytest.mark.parametrize("ssd", ["none", "disk"])
def test_a_refused_extending_ftruncate_does_not_fail_the_save(make_mount, ssd):
    m = make_mount(ssd="none", capacity="16M") if ssd == "none" else make_mount(capacity="16M")
    d = m.p("a", "s")
    d.mkdir(parents=True)
    data = os.urandom(10000)
    with open(d / "t", "wb") as f:
        f.write(data)
        f.flush()
        with pytest.raises(OSError) as e:
            os.ftruncate(f.fileno(), 16 << 40)
        assert e.value.errno in (errno.EFBIG, errno.ENOSPC)
        assert os.fstat(f.fileno()).st_size == len(data)
    assert (d / "t").read_bytes() == data


def test_a_refused_write_after_a_refused_fallocate_still_fails_the_save(make_mount):
    """Only missing bytes keep a draft from publishing, and they still do."""
    m, d = _memory_only(make_mount)
    fd = os.open(d / "x", os.O_CREAT | os.O_WRONLY, 0o644)
    os.write(fd, b"a" * 4096)
    with pytest.raises(OSError):
        os.posix_fallocate(fd, 0, 16 << 40)
    with pytest.raises(OSError) as e:
        os.pwrite(fd, b"b" * MiB, 9 * MiB)         # beyond the 8M tier: refused
    assert e.value.errno == errno.EFBIG
    with pytest.raises(OSError) as e:
        os.close(fd)
    assert e.value.errno == errno.EFBIG
    assert not (d / "x").exists()


def test_rm_rf_of_a_session_being_written_removes_it_for_good(make_mount):
    m = make_mount(capacity="64M")
    (m.p("a", "s")).mkdir(parents=True)
    (m.p("a", "s", "kept")).write_bytes(b"published")
    (m.p("a", "t", "d")).mkdir(parents=True)
    fd = os.open(m.p("a", "t", "d", "slot"), os.O_CREAT | os.O_WRONLY, 0o644)
    try:
        os.write(fd, b"q" * 1000)
        r = subprocess.run(["rm", "-rf", str(m.p("a", "t"))], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        assert sorted(os.listdir(m.p("a"))) == ["s"]
        os.write(fd, b"more")                   # the writer goes on, unaware
    finally:
        os.close(fd)                            # (succeeds: an unlinked name's writer)
    assert sorted(os.listdir(m.p("a"))) == ["s"]
    assert not m.p("a", "t").exists()
    why = (m.path / ".memos" / "why").read_text()
    assert "a/t/d/slot: not published: its directory was removed" in why, why
    # and after a remount it stays gone
    ssd = m.ssd
    m.stop()
    m2 = make_mount(capacity="64M", ssd=ssd)
    assert sorted(os.listdir(m2.p("a"))) == ["s"]
    assert m2.p("a", "s", "kept").read_bytes() == b"published"


def test_rmdir_still_refuses_a_directory_with_names_the_caller_sees(make_mount):
    m = make_mount(capacity="64M")
    (m.p("a", "s")).mkdir(parents=True)
    with open(m.p("a", "s", "mine"), "wb") as f:
        f.write(b"1")
        with pytest.raises(OSError) as e:       # the writer itself sees its name
            os.rmdir(m.p("a", "s"))
        assert e.value.errno == errno.ENOTEMPTY
    with pytest.raises(OSError) as e:
        os.rmdir(m.p("a", "s"))
    assert e.value.errno == errno.ENOTEMPTY
    assert m.p("a", "s", "mine").read_bytes() == b"1"
