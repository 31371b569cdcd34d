"""Defects a model-based test of the slot state machine found in the
handlers (tests/test_slot_machine.py, docs/design.md), on a real mount where
the race can be staged on demand, else on the handlers without a mount.

- A private draft's ftruncate: a whole-slot writer that cannot share the
  inode's draft gets one of its own (`_open_private`); its ftruncate
  truncates that draft, not the shared one on the kernel's inode (mount).
- A leftover retry mark: a writer sent back (ESTALE) whose retry went
  through create leaves no mark that a later open of its own would be taken
  for the kernel's retry by (handlers).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys


def session(m, agent="a", sess="s"):
    p = m.p(agent, sess)
    p.mkdir(parents=True, exist_ok=True)
    return p


# another process opens the inode by /proc/PID/fd/FD (O_TRUNC), writes 40
# bytes, cuts them to 7 and prints the size it sees before and after
PRIVATE_WRITER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_TRUNC)
os.write(fd, b"p" * 40)
before = os.fstat(fd).st_size
os.ftruncate(fd, 7)
print(before, os.fstat(fd).st_size)
os.close(fd)
"""


def test_ftruncate_of_a_private_draft_truncates_that_draft(mnt):
    """A writer holds an unlinked slot with 20 bytes in its draft; another
    process opens the same inode for a whole new version (O_TRUNC, through
    /proc/PID/fd): two whole-slot writers never share a draft, so it gets
    one of its own.  Its ftruncate(7) cuts its own 40 bytes to 7; the first
    writer's draft keeps its 20 (it used to be the one cut to 7, the
    private draft keeping 40)."""
    path = session(mnt) / "x"
    path.write_bytes(b"old")
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        assert os.write(fd, b"s" * 20) == 20
        os.unlink(path)
        r = subprocess.run([sys.executable, "-c", PRIVATE_WRITER,
                            f"/proc/{os.getpid()}/fd/{fd}"],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == ["40", "7"]          # its own draft, cut to 7
        assert os.fstat(fd).st_size == 20               # the shared draft, untouched
        os.lseek(fd, 0, os.SEEK_SET)
    finally:
        os.close(fd)
    assert not path.exists()


def test_a_retry_through_create_leaves_no_retry_mark(make_handlers):
    """A writer sent back (ESTALE) whose kernel retry goes through create
    (the name was gone by then) leaves no mark behind: its next O_TRUNC open
    of another slot, where another writer writes, is a first try like any
    other (sent back to a fresh inode), not taken for the kernel's retry
    (which gave it a draft of its own on the other writer's inode, or after
    the bounded wait an inode that page-cache readers hold).

    The handlers without a mount: the kernel's retry goes through create
    only when the name leaves between the ESTALE and the retry, a race that
    a mount cannot stage on demand."""
    import pyfuse3
    from conftest import Ctx
    h = make_handlers()
    sess = h.mkdirs("a/s")
    h.write("a/s/x", b"x" * 10)
    h.write("a/s/y", b"y" * 10)
    ops = h.ops
    reader, writer, other = Ctx(), Ctx(), Ctx()
    reader.pid, writer.pid, other.pid = 1 << 22, (1 << 22) + 1, (1 << 22) + 2  # no such pids
    x = h.lookup("a/s/x")
    fi_r = h.call("open", x, os.O_RDONLY, reader)          # a page-cache reader of x
    h.call("unlink", sess, b"x", reader)
    # the writer's dentry still names x's inode: sent back (its readers keep it)
    wflags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    assert h.err("open", x, wflags, writer) == errno.ESTALE
    # the kernel's retry finds no name: create
    fi_w, _ = h.call("create", sess, b"x", 0o644, wflags, writer)
    h.call("write", fi_w.fh, 0, b"new")
    h.call("flush", fi_w.fh)
    h.call("release", fi_w.fh)
    # another writer writes y; the first writer opens y for a whole new version
    y = h.lookup("a/s/y")
    fi_o = h.call("open", y, os.O_WRONLY | os.O_TRUNC, other)
    h.call("write", fi_o.fh, 0, b"o" * 5)
    assert h.err("open", y, os.O_WRONLY | os.O_TRUNC, writer) == errno.ESTALE
    y2 = h.call("lookup", sess, b"y", writer).st_ino        # the kernel's retry
    assert y2 != y
    fi_y = h.call("open", y2, os.O_WRONLY | os.O_TRUNC, writer)
    assert ops.handles[fi_y.fh].node.private_of is None and not fi_y.direct_io
    assert ops.handles[fi_y.fh].node is ops.inodes[y2]
    h.call("write", fi_y.fh, 0, b"w" * 3)
    for fi in (fi_y, fi_o):
        h.call("flush", fi.fh)
        h.call("release", fi.fh)
    h.call("release", fi_r.fh)
    assert h.read("a/s/x") == b"new" and h.read("a/s/y") == b"o" * 5

