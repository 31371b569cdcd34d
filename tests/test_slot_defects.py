"""Defects a model-based test of the slot state machine found in the
handlers (tests/test_slot_machine.py, docs/design.md), each on a real mount.

- A private draft's ftruncate: a whole-slot writer that cannot share the
  inode's draft gets one of its own (`_open_private`); its ftruncate
  truncates that draft, not the shared one on the kernel's inode.
"""

from __future__ import annotations

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
