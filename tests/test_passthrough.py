"""Passthrough (docs/semantics.md, "Passthrough"): on a mount the kernel
granted FUSE_PASSTHROUGH, a whole new version is written by the kernel into a
file of the daemon's and a large published version is read from a copy in
memory, without READ or WRITE requests; what a reader, a writer, a full
room, a mapping kept after close and a remount see stays what the daemon's
own path gives."""

from __future__ import annotations

import errno
import mmap
import os
import subprocess
import sys

import pytest

MiB = 1 << 20


def _requests(m) -> dict[str, int]:
    text = m.p(".memos", "debug", "requests").read_text()
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def _pt_mount(make_mount, **opts):
    m = make_mount(**opts)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    (d / "probe").write_bytes(b"x")         # (the first request decides passthrough)
    if m.stats().get("passthrough_opens", 0) == 0:
        pytest.skip("the kernel did not grant passthrough here (not root, or a kernel "
                    "before 6.9)")
    return m, d


def test_large_slot_written_and_read_without_read_or_write_requests(make_mount):
    m, d = _pt_mount(make_mount, passthrough=1, capacity="64M")
    data = os.urandom(8 * MiB)
    before = _requests(m)
    with open(d / "big", "wb") as f:
        for off in range(0, len(data), 64 << 10):
            f.write(data[off:off + (64 << 10)])
    mid = _requests(m)
    assert m.stats()["write_requests"] == 0
    assert (d / "big").read_bytes() == data
    with open(d / "big", "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
        assert mm[:4096] == data[:4096] and mm[-4096:] == data[-4096:]
    after = _requests(m)
    assert m.stats()["read_requests"] == 0
    assert os.stat(d / "big").st_size == len(data)
    assert m.stats()["passthrough_opens"] >= 3


def test_a_reader_keeps_its_version_while_a_writer_replaces_it(make_mount):
    m, d = _pt_mount(make_mount, passthrough=1, capacity="64M")
    old, new = os.urandom(2 * MiB), os.urandom(3 * MiB)
    (d / "k").write_bytes(old)
    with open(d / "k", "rb") as r:
        assert r.read(4096) == old[:4096]
        with open(d / "k", "wb") as w:
            w.write(new)
            # not published until the writer's close: others see the old version
            assert (d / "k").read_bytes() == old
        r.seek(0)
        assert r.read() == old                 # the snapshot it opened
        assert (d / "k").read_bytes() == new
    assert (d / "k").read_bytes() == new
    assert os.stat(d / "k").st_size == len(new)


def test_sizes_seen_while_writing_and_truncates(make_mount):
    m, d = _pt_mount(make_mount, passthrough=1, capacity="64M")
    with open(d / "t", "wb") as f:
        f.write(b"a" * 5000)
        f.flush()
        assert os.fstat(f.fileno()).st_size == 5000
        os.ftruncate(f.fileno(), 1000)
        assert os.fstat(f.fileno()).st_size == 1000
        os.posix_fallocate(f.fileno(), 0, 3 * MiB)
        assert os.fstat(f.fileno()).st_size == 3 * MiB
        os.ftruncate(f.fileno(), 2000)
    got = (d / "t").read_bytes()
    assert got == b"a" * 1000 + b"\0" * 1000


def test_a_mapping_written_after_close_is_published_at_release(make_mount):
    """numpy.memmap's way: open, size, map, close the descriptor, write through
    the mapping, unmap.  The daemon sees no write: the release finds the
    change and publishes it."""
    m, d = _pt_mount(make_mount, passthrough=1, capacity="64M")
    size = 2 * MiB
    fd = os.open(d / "mm", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    os.ftruncate(fd, size)
    mm = mmap.mmap(fd, size)
    os.close(fd)                                # publishes the zeros
    mm[:5] = b"hello"
    mm[size - 5:] = b"world"
    mm.flush()
    mm.close()                                  # the release
    for _ in range(100):
        got = (d / "mm").read_bytes()
        if got[:5] == b"hello":
            break
    assert got[:5] == b"hello" and got[-5:] == b"world" and len(got) == size


def test_a_full_room_refuses_the_save_and_the_version_before_stays(make_mount):
    """A new name written through the kernel into a room too small: the
    write fails (ENOSPC), the name never appears; a writer that published
    once (fsync) and then had a write refused leaves that version."""
    m, d = _pt_mount(make_mount, passthrough=1, capacity="64M", passthrough_room="4M")
    r = subprocess.run(["sh", "-c", f"head -c 6M /dev/zero > {d}/new"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "No space left" in r.stderr
    assert not (d / "new").exists()
    assert m.stats()["passthrough_refused_full"] >= 1
    with pytest.raises(OSError) as e:
        with open(d / "synced", "wb") as f:
            f.write(b"v1" * 1000)
            f.flush()
            os.fsync(f.fileno())
            assert (d / "synced").read_bytes() == b"v1" * 1000
            for _ in range(6):
                f.write(b"v2" * (MiB // 2))
                f.flush()
    assert e.value.errno == errno.ENOSPC
    assert (d / "synced").read_bytes() == b"v1" * 1000
    # and the room is usable again once the refused files are gone
    (d / "after").write_bytes(b"z" * MiB)
    assert (d / "after").read_bytes() == b"z" * MiB


def test_a_python_writer_sees_enospc_at_the_write_or_the_close(make_mount):
    m, d = _pt_mount(make_mount, passthrough=1, capacity="64M", passthrough_room="4M")
    with pytest.raises(OSError) as e:
        with open(d / "py", "wb") as f:
            for _ in range(6):
                f.write(b"y" * MiB)
    assert e.value.errno == errno.ENOSPC
    assert not (d / "py").exists()


def test_saved_through_passthrough_survives_a_remount(make_mount, tmp_path):
    m, d = _pt_mount(make_mount, passthrough=1, capacity="64M", ssd=str(tmp_path / "ssd"))
    data = os.urandom(3 * MiB)
    (d / "p").write_bytes(data)
    small = b"small" * 10
    (d / "q").write_bytes(small)
    m.stop()
    m2 = make_mount(capacity="64M", ssd=str(tmp_path / "ssd"))
    assert m2.p("a", "s", "p").read_bytes() == data
    assert m2.p("a", "s", "q").read_bytes() == small


def test_eviction_to_the_ssd_and_back_reads_the_same_bytes(make_mount):
    m, d = _pt_mount(make_mount, passthrough=1, capacity="16M")
    blobs = {f"e{i}": os.urandom(3 * MiB) for i in range(10)}     # 30 MiB on a 16M tier
    for name, data in blobs.items():
        (d / name).write_bytes(data)
    for name, data in blobs.items():
        assert (d / name).read_bytes() == data, name


def test_off_with_the_knob(make_mount):
    m = make_mount(capacity="64M", passthrough=0)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    (d / "x").write_bytes(os.urandom(MiB))
    (d / "x").read_bytes()
    assert m.stats().get("passthrough_opens", 0) == 0


def test_a_slot_only_on_the_ssd_is_read_from_its_file(make_mount):
    """A large slot the memory tier let go is read by the kernel from the
    SSD tier's own file (checked once), not brought back into memory."""
    m, d = _pt_mount(make_mount, passthrough=1, capacity="64M")
    data = os.urandom(6 * MiB)
    (d / "cold").write_bytes(data)
    m.p(".memos", "cache", "evict").write_text("a/s/cold\n")
    assert os.getxattr(d / "cold", "user.memos.tier") == b"ssd"
    before = m.stats()
    with open(d / "cold", "rb") as f:
        assert f.read() == data
        with mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
            assert mm[-100:] == data[-100:]
    after = m.stats()
    assert after["read_requests"] == before["read_requests"]
    assert after["passthrough_opens"] > before["passthrough_opens"]
    assert os.getxattr(d / "cold", "user.memos.tier") == b"ssd"   # not brought back
    # a second reader, and a rewrite while it reads
    with open(d / "cold", "rb") as r:
        new = os.urandom(MiB)
        (d / "cold").write_bytes(new)
        assert r.read() == data
    assert (d / "cold").read_bytes() == new


READ_IN_CHILD = "import sys; sys.stdout.buffer.write(open(sys.argv[1], 'rb').read())"


def test_a_rewrite_is_written_by_the_kernel_and_others_read_the_version_before(make_mount):
    """An O_TRUNC rewrite of a published slot is written into a writers' file
    (no WRITE request); another process reading meanwhile is sent to a view
    of the published version (the kernel's retry of its open: it sees none
    of it) and reads the version before, whole."""
    m, d = _pt_mount(make_mount, passthrough=1, capacity="64M")
    v1, v2 = os.urandom(3 * MiB), os.urandom(2 * MiB)
    (d / "r").write_bytes(v1)
    before = m.stats()["write_requests"]
    with open(d / "r", "wb") as w:
        w.write(v2[:MiB])
        w.flush()
        os.fsync(w.fileno())                      # published: v2's first MiB
        w.write(v2[MiB:])
        w.flush()
        seen = subprocess.run([sys.executable, "-c", READ_IN_CHILD, str(d / "r")],
                              capture_output=True, timeout=60)
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout == v2[:MiB]            # the published version, not the draft
    assert (d / "r").read_bytes() == v2
    with open(d / "r2", "wb") as f:
        f.write(v1)
    with open(d / "r2", "wb") as f:              # O_TRUNC of a published name
        f.write(v2)
        seen = subprocess.run([sys.executable, "-c", READ_IN_CHILD, str(d / "r2")],
                              capture_output=True, timeout=60)
        assert seen.stdout == v1
    assert (d / "r2").read_bytes() == v2
    assert m.stats()["write_requests"] == before


def test_two_writers_larger_together_than_memory_both_finish(make_mount):
    """Two writers of 48 MiB each on a 64M memory tier: their files are the
    room's, and each close makes room in memory for its version (the other's
    goes to the SSD tier): both are published, whole."""
    m, d = _pt_mount(make_mount, passthrough=1, capacity="64M")
    errors = []

    def write(name: str, byte: bytes) -> None:
        try:
            with open(d / name, "wb") as f:
                for _ in range(48):
                    f.write(byte * MiB)
        except OSError as e:
            errors.append((name, e))

    import threading
    ts = [threading.Thread(target=write, args=(f"w{i}", bytes([48 + i]))) for i in (1, 2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    for i in (1, 2):
        assert (d / f"w{i}").read_bytes() == bytes([48 + i]) * (48 * MiB)
    assert m.stats()["slots_lost"] == 0


def test_the_memory_a_slot_takes_is_what_the_pages_say(make_mount):
    """A version written by passthrough is held twice while the kernel's copy
    is kept: the memory tier's and the copy (README, docs/semantics.md and the
    knob table say so; when a version is held once, they must say that)."""
    from pathlib import Path
    m, d = _pt_mount(make_mount, passthrough=1, capacity="64M")
    (d / "big").write_bytes(os.urandom(8 * MiB))
    with open(d / "big", "rb") as f:
        f.read()
    st = m.stats()
    assert st["passthrough_mirrors"] >= 1
    assert st["bytes_used"] >= 8 * MiB and st["passthrough_room_used"] >= 8 * MiB
    root = Path(__file__).resolve().parent.parent
    said = {"README.md": "a 100 MB slot: 200 MB",
            "docs/semantics.md": "a 100 MB slot takes 200 MB",
            "docs/knobs.md": "a 100 MB slot takes 200 MB"}
    for page, text in said.items():
        assert text in (root / page).read_text(), page
