"""A writer's view and who publishes, on a real mount (docs/semantics.md).

The writing process sees its draft exactly as on tmpfs (size, SEEK_END,
O_APPEND offsets, ftruncate both ways, copy_file_range, shared writable
mmap, fallocate), other processes see the published version until the
opener closes or fsyncs, and a forked or exec'd child closing an inherited
descriptor publishes nothing.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import subprocess
import sys
import threading

import pytest

MiB = 1 << 20


def session(m, agent="a", sess="s"):
    p = m.p(agent, sess)
    p.mkdir(parents=True, exist_ok=True)
    return p


def other_process_stat(path) -> tuple[int, bytes]:
    """(st_size, content) as a process that is not writing sees them."""
    code = ("import os,sys; p=sys.argv[1]; print(os.stat(p).st_size); "
            "sys.stdout.flush(); sys.stdout.buffer.write(open(p,'rb').read())")
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                       check=True)
    size, _, content = r.stdout.partition(b"\n")
    return int(size), content


def test_issue_example_writer_sees_its_own_file(mnt):
    s = session(mnt)
    fd = os.open(s / "g", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"aaaa")
    assert os.fstat(fd).st_size == 4
    assert os.lseek(fd, 0, os.SEEK_END) == 4
    assert os.stat(s / "g").st_size == 4            # stat by path, same process
    os.write(fd, b"bbbb")
    os.close(fd)
    assert (s / "g").read_bytes() == b"aaaabbbb"


def test_other_processes_see_the_published_version_until_close(mnt):
    s = session(mnt)
    (s / "v").write_bytes(b"published")
    fd = os.open(s / "v", os.O_RDWR)
    try:
        os.pwrite(fd, b"-and-a-longer-draft", 9)
        assert os.fstat(fd).st_size == 28
        assert other_process_stat(s / "v") == (9, b"published")
        assert os.fstat(fd).st_size == 28               # the writer's view again
        assert os.pread(fd, 100, 0) == b"published-and-a-longer-draft"
        with open(s / "v", "rb") as reader:             # a reader opened meanwhile
            os.fsync(fd)                                # publishes
            assert other_process_stat(s / "v") == (28, b"published-and-a-longer-draft")
            assert reader.read() in (b"published", b"published-and-a-longer-draft")
    finally:
        os.close(fd)


def test_reader_that_opened_earlier_keeps_its_snapshot_whole(mnt):
    s = session(mnt)
    old = os.urandom(2 * MiB)
    (s / "snap").write_bytes(old)
    with open(s / "snap", "rb") as reader:
        head = reader.read(4096)
        fd = os.open(s / "snap", os.O_RDWR)
        os.ftruncate(fd, 1000)                          # shrink, then grow the draft
        os.pwrite(fd, b"n" * 3 * MiB, 0)
        os.close(fd)                                    # published
        assert head + reader.read() == old
    assert (s / "snap").read_bytes() == b"n" * 3 * MiB


def test_ftruncate_both_ways_is_visible_to_the_writer(mnt):
    s = session(mnt)
    fd = os.open(s / "t", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * 100)
        os.ftruncate(fd, 10000)                         # fsx: "no extend on truncate"
        assert os.fstat(fd).st_size == 10000
        assert os.lseek(fd, 0, os.SEEK_END) == 10000
        assert os.pread(fd, 200, 0) == b"x" * 100 + b"\0" * 100
        os.ftruncate(fd, 50)
        assert os.fstat(fd).st_size == 50
        assert os.pread(fd, 200, 0) == b"x" * 50
    finally:
        os.close(fd)
    assert (s / "t").read_bytes() == b"x" * 50


def test_append_offsets_and_mtime(mnt):
    s = session(mnt)
    (s / "log").write_bytes(b"0123")
    fd = os.open(s / "log", os.O_WRONLY | os.O_APPEND)
    try:
        before = os.fstat(fd).st_mtime_ns
        os.write(fd, b"abc")
        assert os.lseek(fd, 0, os.SEEK_CUR) == 7
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, b"de")                             # O_APPEND: at the end anyway
        assert os.lseek(fd, 0, os.SEEK_CUR) == 9
        assert os.fstat(fd).st_size == 9
        assert os.fstat(fd).st_mtime_ns >= before
    finally:
        os.close(fd)
    assert (s / "log").read_bytes() == b"0123abcde"


def test_copy_file_range_reads_the_draft(mnt):
    s = session(mnt)
    src = os.open(s / "src", os.O_RDWR | os.O_CREAT, 0o644)
    dst = os.open(s / "dst", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        data = os.urandom(300_000)
        os.write(src, data)
        done = 0
        while done < len(data):
            n = os.copy_file_range(src, dst, len(data) - done, done, done)
            assert n > 0
            done += n
        assert os.fstat(dst).st_size == len(data)
    finally:
        os.close(src)
        os.close(dst)
    assert (s / "dst").read_bytes() == data


def test_shared_writable_mmap_is_published_by_msync_and_close(mnt):
    s = session(mnt)
    (s / "m").write_bytes(b"\0" * 8192)
    fd = os.open(s / "m", os.O_RDWR)
    try:
        mm = mmap.mmap(fd, 8192, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        mm[100:105] = b"hello"
        mm[5000:5005] = b"world"
        assert other_process_stat(s / "m")[1] == b"\0" * 8192   # not yet published
        mm.flush()                      # msync(MS_SYNC) is an fsync: it publishes
        mm.close()
    finally:
        os.close(fd)
    got = (s / "m").read_bytes()
    assert got[100:105] == b"hello" and got[5000:5005] == b"world" and len(got) == 8192


def test_fallocate_mode_0_extends_other_modes_are_refused(mnt):
    s = session(mnt)
    fd = os.open(s / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"abc")
        os.posix_fallocate(fd, 0, 1 << 16)
        assert os.fstat(fd).st_size == 1 << 16
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
        punch = 0x02 | 0x01                             # PUNCH_HOLE | KEEP_SIZE
        assert libc.fallocate(fd, punch, 0, 4096) == -1
        assert ctypes.get_errno() == errno.EOPNOTSUPP
        assert os.pread(fd, 3, 0) == b"abc"
    finally:
        os.close(fd)
    assert (s / "f").read_bytes() == b"abc" + b"\0" * ((1 << 16) - 3)


# ---------------------------------------------------------------- who publishes


def test_a_tool_run_while_writing_publishes_nothing(mnt):
    """subprocess closes the inherited descriptors in the child (close_fds),
    and exec closes the close-on-exec ones: both FLUSH, neither publishes."""
    s = session(mnt)
    (s / "old").write_bytes(b"OLD-VERSION")
    fd = os.open(s / "old", os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, b"DRAFT-V2-PART1..")
        subprocess.run(["/bin/true"], check=True)
        subprocess.run(["/bin/true"], check=True, close_fds=False)   # fd is inheritable? no: O_CLOEXEC
        os.set_inheritable(fd, True)
        subprocess.run(["/bin/true"], check=True, close_fds=False)   # the child exits holding it
        assert other_process_stat(s / "old") == (11, b"OLD-VERSION")
        os.write(fd, b"PART2")
    finally:
        os.close(fd)
    assert (s / "old").read_bytes() == b"DRAFT-V2-PART1..PART2"


def test_a_forked_child_closing_its_copy_publishes_nothing(mnt):
    s = session(mnt)
    (s / "f").write_bytes(b"v1")
    fd = os.open(s / "f", os.O_WRONLY | os.O_TRUNC)
    os.write(fd, b"half")
    pid = os.fork()
    if pid == 0:
        os.close(fd)
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert other_process_stat(s / "f") == (2, b"v1")
    os.write(fd, b"-whole")
    os.close(fd)
    assert (s / "f").read_bytes() == b"half-whole"


def test_a_child_writing_through_the_inherited_descriptor(mnt):
    """Its bytes join the opener's draft: the opener's close publishes them;
    if the opener closed first, the child's last close does."""
    s = session(mnt)
    (s / "c").write_bytes(b"")
    fd = os.open(s / "c", os.O_WRONLY | os.O_APPEND)
    pid = os.fork()
    if pid == 0:
        os.write(fd, b"child;")
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert other_process_stat(s / "c")[1] == b""        # the child's exit published nothing
    os.write(fd, b"parent;")
    os.close(fd)
    assert (s / "c").read_bytes() == b"child;parent;"
    # the opener closes first: the child's last close publishes what it wrote
    fd = os.open(s / "c", os.O_WRONLY | os.O_APPEND)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)                                   # wait for the parent's close
        os.write(fd, b"late;")
        os.close(fd)
        os._exit(0)
    os.close(r)
    os.close(fd)
    os.close(w)
    assert os.waitpid(pid, 0)[1] == 0
    assert (s / "c").read_bytes() == b"child;parent;late;"


def test_threads_of_the_opener_publish(mnt):
    s = session(mnt)
    fd = os.open(s / "th", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.write(fd, b"from a thread")
    t = threading.Thread(target=os.close, args=(fd,))
    t.start()
    t.join()
    assert other_process_stat(s / "th") == (13, b"from a thread")


# ---------------------------------------------------------------- appends


@pytest.mark.parametrize("how", ["threads", "processes"])
def test_concurrent_appends_lose_no_record(mnt, how):
    s = session(mnt)
    (s / "log").write_bytes(b"")
    n, each = 4, 100

    def appender(i: int) -> None:
        fd = os.open(s / "log", os.O_WRONLY | os.O_APPEND)
        try:
            for j in range(each):
                os.write(fd, f"{i:02d}-{j:04d}-{'x' * 40}\n".encode())
        finally:
            os.close(fd)

    if how == "threads":
        ts = [threading.Thread(target=appender, args=(i,)) for i in range(n)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    else:
        pids = []
        for i in range(n):
            pid = os.fork()
            if pid == 0:
                try:
                    appender(i)
                finally:
                    os._exit(0)
            pids.append(pid)
        for pid in pids:
            assert os.waitpid(pid, 0)[1] == 0
    lines = (s / "log").read_bytes().splitlines()
    assert len(lines) == n * each
    assert sorted(lines) == sorted(f"{i:02d}-{j:04d}-{'x' * 40}".encode()
                                   for i in range(n) for j in range(each))


# ---------------------------------------------------------------- found by pjdfstest


def test_regression_creat_for_reading_makes_an_empty_slot(mnt):
    """open(O_CREAT|O_RDONLY) (pjdfstest's `create`) made a name nobody could
    see, remove or replace: the empty slot is published at once."""
    s = session(mnt)
    fd = os.open(s / "ro", os.O_CREAT | os.O_EXCL | os.O_RDONLY, 0o640)
    try:
        assert os.read(fd, 10) == b""
    finally:
        os.close(fd)
    assert other_process_stat(s / "ro") == (0, b"")
    # (0640 less the mount's umask, 077 by default: private to its creator)
    assert oct(os.stat(s / "ro").st_mode & 0o777) == oct(0o600)
    os.unlink(s / "ro")
    assert os.listdir(s) == []


def test_regression_paths_longer_than_the_store_key_are_enametoolong(mnt):
    """A path below the mount longer than KEY_MAX was half created (EIO at
    close, the name stranded): refused up front, nothing changes.  (Relative
    paths through directory descriptors reach past the kernel's PATH_MAX.)"""
    from memosfs import _native
    s = session(mnt)
    dfd = os.open(s, os.O_RDONLY | os.O_DIRECTORY)
    rel = len("a/s")
    try:
        while True:
            name = "d" * 200
            try:
                os.mkdir(name, dir_fd=dfd)
            except OSError as e:
                assert e.errno == errno.ENAMETOOLONG
                assert rel + 1 + len(name) + 2 > _native.KEY_MAX
                break
            nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=dfd)
            os.close(dfd)
            dfd, rel = nfd, rel + 1 + len(name)
        room = _native.KEY_MAX - rel - 1                # bytes left for a slot's name
        assert 1 <= room
        if room <= 255:
            fd = os.open("f" * room, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=dfd)
            os.write(fd, b"fits")                        # exactly at the limit
            os.close(fd)
        with pytest.raises(OSError) as e:
            os.open("g" * min(255, room + 1), os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=dfd)
        assert e.value.errno == errno.ENAMETOOLONG
        (s / "short").write_bytes(b"moved?")
        with pytest.raises(OSError) as e:
            os.rename(s / "short", "h" * min(255, room + 1), dst_dir_fd=dfd)
        assert e.value.errno == errno.ENAMETOOLONG
        assert (s / "short").read_bytes() == b"moved?"  # nothing changed
    finally:
        os.close(dfd)


def test_regression_holes_stay_holes_on_the_ssd(make_mount):
    """fsstress-style writes at large offsets wrote their holes to the SSD in
    full: a version's zero pieces are left as holes in its SSD file."""
    m = make_mount(capacity="64M")
    s = session(m)
    fd = os.open(s / "sparse", os.O_WRONLY | os.O_CREAT, 0o644)
    os.pwrite(fd, b"head", 0)
    os.pwrite(fd, b"tail", 24 << 20)
    os.fsync(fd)                                        # on the SSD now
    os.close(fd)
    on_disk = sum(os.stat(os.path.join(d, f)).st_blocks * 512
                  for d, _, fs in os.walk(m.ssd) for f in fs)
    assert on_disk < 1 << 20
    data = (s / "sparse").read_bytes()
    assert len(data) == (24 << 20) + 4
    assert data[:4] == b"head" and data[-4:] == b"tail" and not any(data[4:-4])


def test_regression_setuid_is_cleared_when_another_uid_writes(make_mount):
    """pjdfstest chmod/12: 04777 stayed 04777 after `echo x >> f` by another uid."""
    m = make_mount(world=True)
    s = session(m)
    os.chmod(m.p("a"), 0o777)
    os.chmod(s, 0o777)
    (s / "f").write_bytes(b"")
    os.chmod(s / "f", 0o6777)
    r = subprocess.run(["sh", "-c", f"echo x >> {s / 'f'}"], capture_output=True,
                       preexec_fn=lambda: (os.setgid(65534), os.setuid(65534)))
    assert r.returncode == 0, r.stderr
    assert os.stat(s / "f").st_mode & 0o7777 == 0o777
    assert (s / "f").read_bytes() == b"x\n"
