"""A request that needs room in a full memory tier waits for it, on the fast
path as on the handlers' path, and gets ENOSPC only when nothing would free
any: the room held by a reader of a replaced version (dead, pinned), by a
reader of a live version, or by another writer's draft comes back when they
close.  Deterministic: the memory is filled by hand, then released by a
timer thread while the request waits."""

from __future__ import annotations

import errno
import os
import threading

import pytest

pytestmark = pytest.mark.mount
MiB = 1 << 20


def _later(seconds: float, fn) -> threading.Timer:
    t = threading.Timer(seconds, fn)
    t.start()
    return t


def _fill(path, size: int) -> None:
    with open(path, "wb") as f:
        f.write(os.urandom(size))


def _grow_while_a_reader_holds_a_replaced_version(d, grow) -> None:
    """A reader keeps a replaced 3 MiB version (dead, pinned) of `big` in a
    4 MiB memory tier; grow(fd) runs on a newly created slot `t` while a
    timer closes the reader half a second later."""
    _fill(d / "big", 3 * MiB)
    r = os.open(d / "big", os.O_RDONLY)
    try:
        assert len(os.pread(r, 4096, 0)) == 4096
        with open(d / "big", "wb") as f:        # replaced: the reader keeps the old one
            f.write(b"new")
        w = os.open(d / "t", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            closer = _later(0.5, lambda: os.close(r))
            try:
                grow(w)
            finally:
                closer.join()
                r = -1
            assert os.fstat(w).st_size == 2 * MiB
        finally:
            os.close(w)
    finally:
        if r >= 0:
            os.close(r)


@pytest.mark.parametrize("fast_path", [1, 0])
def test_ftruncate_waits_for_a_replaced_version_a_reader_holds(make_mount, fast_path):
    """A reader keeps a replaced 3 MiB version (dead, pinned) in a 4 MiB
    memory tier; ftruncate of another open slot to 2 MiB must wait for the
    reader's close, not answer EIO (the fast path's size-only setattr once
    turned "wait for room" into EIO) nor ENOSPC."""
    m = make_mount(capacity="4M", fast_path=fast_path, writeback_delay_ms=60000)
    d = m.p("a", "s")
    d.mkdir(parents=True)

    def grow(w: int) -> None:
        os.ftruncate(w, 2 * MiB)
        os.pwrite(w, b"end", 2 * MiB - 3)
    _grow_while_a_reader_holds_a_replaced_version(d, grow)
    with open(d / "t", "rb") as f:
        data = f.read()
    assert len(data) == 2 * MiB and data.endswith(b"end") and data[:4096] == bytes(4096)
    assert (d / "big").read_bytes() == b"new"
    assert "answering EIO" not in m.logtext()


@pytest.mark.parametrize("fast_path", [1, 0])
def test_a_write_waits_for_another_writers_draft(make_mount, fast_path):
    """Another process's 3 MiB draft (written, not yet closed) fills a 4 MiB
    memory tier: a 2 MiB write waits for that writer's close (its version
    can then be written back and evicted) instead of ENOSPC at once."""
    m = make_mount(capacity="4M", fast_path=fast_path, writeback_delay_ms=0)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    other = os.open(d / "draft", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(other, os.urandom(3 * MiB))
        closer = _later(0.5, lambda: os.close(other))
        try:
            _fill(d / "t", 2 * MiB)
        finally:
            closer.join()
            other = -1
    finally:
        if other >= 0:
            os.close(other)
    assert os.stat(d / "t").st_size == 2 * MiB
    assert os.stat(d / "draft").st_size == 3 * MiB
    assert "answering EIO" not in m.logtext()


def test_fallocate_waits_for_room_too(make_mount):
    """posix_fallocate (through the shim, not pyfuse3) waits for a reader of
    a replaced version like ftruncate does, answered when the room comes."""
    m = make_mount(capacity="4M", writeback_delay_ms=60000)
    d = m.p("a", "s")
    d.mkdir(parents=True)

    def grow(w: int) -> None:
        os.posix_fallocate(w, 0, 2 * MiB)
        # the loop served other requests while it waited
        assert (d / "big").read_bytes() == b"new"
    _grow_while_a_reader_holds_a_replaced_version(d, grow)
    assert os.stat(d / "t").st_size == 2 * MiB
    assert "answering EIO" not in m.logtext()


def test_a_write_larger_than_memory_is_enospc_at_once(make_mount):
    """Nothing would free room (no other draft, no reader): ENOSPC, and the
    log says why.  (Without an SSD tier: with one, the draft spills to it,
    tests/test_spill.py.)"""
    m = make_mount(capacity="4M", ssd="none")
    d = m.p("a", "s")
    d.mkdir(parents=True)
    with pytest.raises(OSError) as e:
        _fill(d / "t", 6 * MiB)
    assert e.value.errno in (errno.ENOSPC, errno.EFBIG)
    assert "answering EIO" not in m.logtext()
