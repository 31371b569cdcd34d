"""FIFOs, Unix sockets and device nodes in agents, sessions and below
(pjdfstest's symlink tests make them as the names a symlink must not
replace): kept with the namespace like symbolic links (tests/test_symlinks.py),
served by the kernel (a FIFO passes bytes, a socket accepts a connection), a
device node does not open on the nodev mount; not at the root or in the
control plane (EPERM)."""

from __future__ import annotations

import errno
import os
import socket
import stat
import threading
import warnings

import pytest

from memosfs.testing import faults
from memosfs.testing.daemon import is_mounted

# the owner lchown gives (another uid needs root; a user's own otherwise)
OWNER = (1234, 5678) if os.geteuid() == 0 else (os.getuid(), os.getgid())

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device and chown to "
                                "another uid need root")


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


def session(m):
    s = m.p("a", "s")
    s.mkdir(parents=True)
    return s


def fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def test_a_fifo_passes_bytes_and_is_a_name(make_mount):
    m = make_mount(capacity="64M")
    s = session(m)
    os.mkfifo(s / "pipe", 0o640)
    st = os.lstat(s / "pipe")
    assert stat.S_ISFIFO(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o640 & ~_umask()
    got = []
    reader = threading.Thread(target=lambda: got.append((s / "pipe").read_bytes()))
    reader.start()
    (s / "pipe").write_bytes(b"through the kernel")
    reader.join(30)
    assert got == [b"through the kernel"]
    os.chmod(s / "pipe", 0o600)
    assert stat.S_IMODE(os.lstat(s / "pipe").st_mode) == 0o600
    os.rename(s / "pipe", m.p("a", "pipe2"))            # into the agent, like a link
    assert stat.S_ISFIFO(os.lstat(m.p("a", "pipe2")).st_mode)
    with pytest.raises(OSError) as e:
        os.mkfifo(m.p("top"))
    assert e.value.errno == errno.EPERM
    with pytest.raises(OSError) as e:
        os.mkfifo(m.p(".memos", "cache", "fifo"))
    assert e.value.errno == errno.EPERM
    with pytest.raises(FileExistsError):
        os.mkfifo(m.p("a", "pipe2"))
    os.unlink(m.p("a", "pipe2"))
    assert sorted(os.listdir(m.p("a"))) == ["s"]


def test_a_unix_socket_binds_and_accepts(make_mount):
    m = make_mount(capacity="64M")
    s = session(m)
    path = str(s / "sock")
    srv = socket.socket(socket.AF_UNIX)
    cli = socket.socket(socket.AF_UNIX)
    try:
        srv.bind(path)
        srv.listen(1)
        assert stat.S_ISSOCK(os.lstat(path).st_mode)
        cli.connect(path)
        conn, _ = srv.accept()
        cli.sendall(b"ping")
        assert conn.recv(4) == b"ping"
        conn.close()
    finally:
        cli.close()
        srv.close()
    os.unlink(path)


@needs_root
def test_a_device_node_keeps_its_number_and_does_not_open(make_mount):
    m = make_mount(capacity="64M")
    s = session(m)
    os.mknod(s / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    st = os.lstat(s / "null")
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    with pytest.raises(PermissionError):                # the mount is nodev
        open(s / "null", "rb")


def test_special_files_come_back_after_kill9_once_their_directory_was_fsynced(make_mount):
    m = make_mount(capacity="64M", writeback_delay_ms=600000)
    s = session(m)
    os.mkfifo(s / "pipe")
    os.chmod(s / "pipe", 0o620)
    os.lchown(s / "pipe", *OWNER)
    if os.geteuid() == 0:
        os.mknod(s / "blk", stat.S_IFBLK | 0o600, os.makedev(7, 9))
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(s / "sock"))
    sock.close()
    fsync_dir(s)
    if faults.kill9(m):
        warnings.warn("kill -9 did not end the daemon; the FUSE connection was aborted")
    assert not is_mounted(m.path)
    m2 = make_mount(ssd=str(m.ssd), capacity="64M")
    s2 = m2.p("a", "s")
    st = os.lstat(s2 / "pipe")
    assert stat.S_ISFIFO(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o620
    assert (st.st_uid, st.st_gid) == OWNER
    assert stat.S_ISSOCK(os.lstat(s2 / "sock").st_mode)
    if os.geteuid() == 0:
        st = os.lstat(s2 / "blk")
        assert stat.S_ISBLK(st.st_mode) and st.st_rdev == os.makedev(7, 9)
    m2.stop()
    m3 = make_mount(ssd=str(m.ssd), capacity="64M")        # and after a clean unmount
    assert stat.S_ISFIFO(os.lstat(m3.p("a", "s", "pipe")).st_mode)


@needs_root
def test_chown_of_a_special_file_clears_its_set_id_bits(make_mount):
    """As for a slot (and on any Linux filesystem): a chown clears the
    set-user-ID bit, and the set-group-ID bit of a group-executable file."""
    m = make_mount(capacity="64M")
    s = session(m)
    os.mkfifo(s / "pipe")
    os.chmod(s / "pipe", 0o6555)
    os.chown(s / "pipe", 65534, 65533)
    st = os.lstat(s / "pipe")
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o555, 65534, 65533)
