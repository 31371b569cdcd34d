"""The fast path (memosfs._fuseshim.install_fast, knobs fast_path and
burst_poll_us): reads, writes, getxattr, flush and release answered on the
spot by the shim's synchronous callbacks, with the same results, errnos and
publish points as the async handlers; and a page-cache push the kernel
refuses never stops the daemon."""

from __future__ import annotations

import errno
import hashlib
import os

import pytest
import trio

from memosfs.fuse.slots import SlotTable
from memosfs.fuse.nodes import AGENT, ROOT, SESSION, Dir, Slot
from memosfs.fuse.pagecache import PageCachePusher

MiB = 1 << 20


def stream(path, chunk: int, total: int) -> str:
    """Write total bytes in chunk-sized write(2)s, close; the md5 written."""
    h = hashlib.md5()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(total // chunk):
            block = (i.to_bytes(8, "little") * (chunk // 8 + 1))[:chunk]
            h.update(block)
            assert os.write(fd, block) == chunk
    finally:
        os.close(fd)
    return h.hexdigest()


def md5_of(path, chunk: int = 4096) -> str:
    h = hashlib.md5()
    with open(path, "rb", buffering=0) as f:
        while True:
            b = f.read(chunk)
            if not b:
                return h.hexdigest()
            h.update(b)


def test_small_writes_take_the_fast_path_and_read_back(make_mount):
    """A stream of 4 KiB writes is answered by the fast path (and mostly in
    bursts); what is read back is what was written; the knob turns it off
    and the same stream goes through the async handlers, same bytes."""
    m = make_mount(capacity="64M")
    os.makedirs(m.p("a", "s"))
    before = m.stats()
    want = stream(m.p("a", "s", "x"), 4096, 4 * MiB)
    after = m.stats()
    assert md5_of(m.p("a", "s", "x")) == want
    # every write (the kernel's security.capability getxattr before each
    # one is gone: FUSE_HANDLE_KILLPRIV_V2)
    assert after["fast_requests"] - before["fast_requests"] >= 1024
    assert after["burst_requests"] > before["burst_requests"]

    m.ctl("fast_path").write_text("0")
    assert m.ctl("fast_path").read_text().strip() == "0"
    before = m.stats()
    want = stream(m.p("a", "s", "y"), 4096, 1 * MiB)
    after = m.stats()
    assert after["fast_requests"] == before["fast_requests"]
    assert md5_of(m.p("a", "s", "y")) == want
    m.ctl("fast_path").write_text("1")
    m.ctl("burst_poll_us").write_text("0")       # answered on the spot, no waiting
    before = m.stats()
    want = stream(m.p("a", "s", "z"), 4096, 1 * MiB)
    after = m.stats()
    assert after["fast_requests"] - before["fast_requests"] >= 256
    assert after["burst_requests"] == before["burst_requests"]
    assert md5_of(m.p("a", "s", "z")) == want


def test_a_refused_write_on_the_fast_path_gets_its_errno(make_mount):
    """An agent quota of 1 MiB and one slot growing past it (an open draft
    cannot move to the SSD tier): the write that would cross it is EDQUOT
    through the fast path, nothing of it is stored (the close fails too: a
    draft with a refused write is not published), and the daemon goes on."""
    m = make_mount(capacity="32M")
    os.makedirs(m.p("q", "s"))
    os.setxattr(m.p("q"), "user.memos.quota", b"1M")
    before = m.stats()
    fd = os.open(m.p("q", "s", "big"), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        assert os.write(fd, b"a" * 4096) == 4096
        with pytest.raises(OSError) as ei:
            for _ in range(2 * 256):
                os.write(fd, b"b" * 4096)
        assert ei.value.errno == errno.EDQUOT
    finally:
        with pytest.raises(OSError) as ei:
            os.close(fd)
    assert ei.value.errno == errno.EDQUOT
    after = m.stats()
    assert after["quota_refused"] > before["quota_refused"]
    assert after["fast_requests"] > before["fast_requests"]
    assert not os.path.exists(m.p("q", "s", "big"))     # a refused create leaves no name
    (m.p("q", "s", "small")).write_bytes(b"a" * 4096)    # the daemon goes on
    assert m.p("q", "s", "small").read_bytes() == b"a" * 4096


def test_getxattr_flush_and_release_on_the_fast_path(make_mount):
    """A user xattr reads back (and a missing one is ENODATA) with the
    fast path answering; a writer's close publishes for the next reader; a
    reader's close and release leave no handle behind."""
    m = make_mount(capacity="64M")
    os.makedirs(m.p("a", "s"))
    path = m.p("a", "s", "k")
    path.write_bytes(b"v1")
    os.setxattr(path, "user.note", b"hello")
    before = m.stats()
    assert os.getxattr(path, "user.note") == b"hello"
    with pytest.raises(OSError) as ei:
        os.getxattr(path, "user.absent")
    assert ei.value.errno == errno.ENODATA
    assert m.stats()["fast_requests"] >= before["fast_requests"] + 2
    for i in range(50):
        path.write_bytes(b"version %d" % i)
        assert path.read_bytes() == b"version %d" % i
    assert m.stats()["open_handles"] == 0 or _settles(m)


def test_small_files_are_created_and_opened_on_the_fast_path(make_mount):
    """create of new names and opens for reading of slots in memory are
    answered on the spot (protocol 1): the whole create+write+close and
    open+read+close loops add fast requests and nothing reaches the async
    handlers but what must; under protocol 2 opens go through the handlers
    (they may wait), with the same bytes."""
    m = make_mount(capacity="64M")
    os.makedirs(m.p("a", "s"))
    blobs = {f"f{i:03d}": os.urandom(4096) for i in range(100)}
    before = m.stats()
    for name, data in blobs.items():
        fd = os.open(m.p("a", "s", name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
        os.write(fd, data)
        os.close(fd)
    for name, data in blobs.items():
        fd = os.open(m.p("a", "s", name), os.O_RDONLY)
        assert os.read(fd, 8192) == data
        os.close(fd)
    after = m.stats()
    # per file: create, getxattr, write, flush, release; open, release (the
    # writer's page is the version's, and a reader's close sends no flush)
    assert after["fast_requests"] - before["fast_requests"] >= 7 * len(blobs)
    # (0640 less the mount's umask, 077 by default: the fast path applies it too)
    assert oct(os.stat(m.p("a", "s", "f000")).st_mode & 0o777) == "0o600"
    m.ctl("coherence_protocol").write_text("2")
    for name, data in list(blobs.items())[:10]:
        with open(m.p("a", "s", name), "rb") as f:
            assert f.read() == data
    assert _settles(m)


def test_readers_after_the_writer_read_its_pages(make_mount):
    """A version its writer leaves is read from the pages the writes left in
    the kernel (no request but for a partial last page), with the right
    bytes; after a refused write they are dropped and read through the
    daemon, with the right bytes too."""
    m = make_mount(capacity="64M", ssd_capacity="64M")  # (a draft spills; refused there)
    os.makedirs(m.p("a", "s"))
    path = m.p("a", "s", "x")
    data = os.urandom(3 * MiB) + b"tail"
    with open(path, "wb") as f:
        for i in range(0, len(data), 65536):
            f.write(data[i:i + 65536])
    before = m.stats()["read_requests"]
    assert path.read_bytes() == data
    assert path.read_bytes() == data
    assert m.stats()["read_requests"] - before <= 2
    # a rewrite in place (O_TRUNC, same inode): its pages again
    data = os.urandom(2 * MiB)
    with open(path, "r+b") as f:
        f.truncate(0)
        f.write(data)
    before = m.stats()["read_requests"]
    assert path.read_bytes() == data
    assert m.stats()["read_requests"] - before <= 2
    # a refused write on the way: the pages go, the reads reach the daemon
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        view = memoryview(bytes(65 * MiB))      # more than the memory tier
        with pytest.raises(OSError) as e:
            while view:
                view = view[os.write(fd, view):]
        assert e.value.errno in (errno.EFBIG, errno.ENOSPC)
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"short", 0)
    finally:
        os.close(fd)
    before = m.stats()["read_requests"]
    assert path.read_bytes() == b"short"
    assert m.stats()["read_requests"] - before >= 1


def test_truncate_on_the_fast_path(make_mount):
    """ftruncate of a writer's slot (safetensors sets the length first) and
    truncate(2) by path are answered on the spot with the same results:
    the draft grows with zeros, shrinks, and a path truncate publishes."""
    m = make_mount(capacity="64M")
    os.makedirs(m.p("a", "s"))
    path = m.p("a", "s", "t")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        before = m.stats()["fast_requests"]
        os.ftruncate(fd, 3 * 4096 + 80)
        assert os.fstat(fd).st_size == 3 * 4096 + 80
        os.pwrite(fd, b"head", 0)
        os.ftruncate(fd, 4096)
        assert os.pread(fd, 8192, 0) == b"head" + bytes(4092)
        assert m.stats()["fast_requests"] > before
    finally:
        os.close(fd)
    assert path.read_bytes() == b"head" + bytes(4092)
    os.truncate(path, 2)
    assert path.read_bytes() == b"he"
    assert os.stat(path).st_size == 2


def _settles(m) -> bool:
    """Releases reach the daemon after close(2) returns: wait for them."""
    import time
    for _ in range(100):
        if m.stats()["open_handles"] == 0:
            return True
        time.sleep(0.05)
    return False


class _Ref:
    """A pinned version as the pusher sees it."""

    def __init__(self, size: int) -> None:
        self.version, self.size, self.released = 1, size, False

    def view(self, off: int, n: int) -> memoryview:
        return memoryview(bytes(n))

    def release(self) -> None:
        self.released = True


def test_a_push_the_kernel_refuses_never_stops_the_daemon():
    """notify_store answering ENOENT (the kernel forgot the inode) in both
    halves of a large push, run as a system task as release runs it: the
    push ends, its pin goes, and trio goes on (an exception group escaping
    a system task used to stop the daemon)."""
    def refuse(ino, off, data):
        raise FileNotFoundError(errno.ENOENT, "fuse_lowlevel_notify_store: no such inode")

    pusher = PageCachePusher(refuse, lambda ino: None, lambda node: None)
    root = Dir(1, "", None, 0o755, 0, 0, ROOT)
    agent = Dir(2, "a", root, 0o755, 0, 0, AGENT)
    session = Dir(3, "s", agent, 0o755, 0, 0, SESSION)
    inodes: dict = {}
    table = SlotTable(100, inodes, lambda ino, like: None, lambda node, held: None)
    node = table.restore(session, "x", 1, 2 * PageCachePusher.SPLIT, 0,
                         lambda ino: Slot(table, ino, "x", session, 0o644, 0, 0))
    ref = _Ref(2 * PageCachePusher.SPLIT)

    async def main():
        job = pusher.claim(node, ref)
        trio.lowlevel.spawn_system_task(pusher.run, job)
        with trio.fail_after(10):
            while pusher.outstanding:
                await trio.sleep(0.01)

    trio.run(main)
    assert ref.released and node.pushing == 0 and pusher.pushes == 0
