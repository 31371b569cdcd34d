"""One daemon per SSD directory, and no mount stacked on a live one by accident.

Real daemons: through make_mount (always unmounted at teardown) or as
`python -m memosfs memos MNT -f` children started here, stopped by their pid.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from conftest import FUSE_REASON, is_mounted

pytestmark = [pytest.mark.mount,
              pytest.mark.skipif(FUSE_REASON is not None, reason=FUSE_REASON or "")]


def memosfs(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memosfs", *args],
                          capture_output=True, text=True, timeout=timeout)


def snapshot(root) -> dict:
    """Every entry under root (root too): mode, size, inode, mtime; and the
    bytes of every regular file at the top (namespace.json, order.json, .lock)."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in [""] + dirs + files:
            p = os.path.join(d, name) if name else d
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_size, st.st_ino,
                                             st.st_mtime_ns)
    for name in os.listdir(root):
        p = os.path.join(root, name)
        if os.path.isfile(p):
            with open(p, "rb") as f:
                out["content:" + name] = f.read()
    return out


def quiet_snapshot(root, tries: int = 50) -> dict:
    """A snapshot that stays the same across half a second (the daemon that
    owns root has nothing left to write)."""
    last = snapshot(root)
    for _ in range(tries):
        time.sleep(0.5)
        now = snapshot(root)
        if now == last:
            return now
        last = now
    raise AssertionError(f"{root} keeps changing")


def mounts_at(path) -> list[str]:
    """The filesystem types mounted at path, bottom first."""
    p = os.path.realpath(path)
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == p:
                out.append(fields[fields.index("-", 5) + 1])
    return out


def populate(m) -> bytes:
    """A session with a slot, fsync'd (so namespace.json, order.json and the
    slot file are on the SSD)."""
    s = m.p("agent", "s1")
    s.mkdir(parents=True)
    data = os.urandom(300_000)
    fd = os.open(s / "turn0", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    dfd = os.open(s, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return data


def holder_of(ssd) -> str:
    return (ssd / ".lock").read_text()


# ---------------------------------------------------------------- one daemon per SSD directory


def test_second_daemon_on_the_same_ssd_dir_is_refused_and_touches_nothing(make_mount, tmp_path):
    a = make_mount(capacity="64M")
    populate(a)
    assert (a.ssd / "namespace.json").exists() and (a.ssd / "order.json").exists()
    assert oct(os.stat(a.ssd / ".lock").st_mode & 0o777) == oct(0o600)
    assert holder_of(a.ssd) == f"{a.proc.pid} {a.path}\n"
    # held on one close-on-exec descriptor: no child the daemon spawns keeps it
    fds = [fd for fd in os.listdir(f"/proc/{a.proc.pid}/fd")
           if os.readlink(f"/proc/{a.proc.pid}/fd/{fd}") == str(a.ssd / ".lock")]
    assert len(fds) == 1
    with open(f"/proc/{a.proc.pid}/fdinfo/{fds[0]}") as f:
        flags = int(next(ln for ln in f if ln.startswith("flags:")).split()[1], 8)
    assert flags & os.O_CLOEXEC
    before = quiet_snapshot(a.ssd)

    b = tmp_path / "b"
    b.mkdir()
    t0 = time.monotonic()
    r = memosfs("memos", str(b), "-f", "-o",
                f"ssd={a.ssd},capacity=64M,log={tmp_path / 'b.log'}")
    assert r.returncode != 0
    assert r.stderr.strip() == (f"memosfs: cannot mount {b}: the SSD directory {a.ssd} is in "
                                f"use by pid {a.proc.pid} (mounted at {a.path})"), r.stderr
    # the holder serves its mount: refused at once, not after the wait for one exiting
    assert time.monotonic() - t0 < 5
    assert not is_mounted(b)
    assert snapshot(a.ssd) == before
    assert "in use by pid" in (tmp_path / "b.log").read_text()
    # the holder is untouched and still serves its data
    assert (a.p("agent", "s1", "turn0")).stat().st_size == 300_000


def test_kill9_of_the_holder_leaves_no_stale_lock(make_mount):
    a = make_mount(capacity="64M")
    data = populate(a)
    assert a.kill9() in (True, False)          # reaped, its mount lazily unmounted
    assert not is_mounted(a.path)
    assert holder_of(a.ssd).startswith(f"{a.proc.pid} ")   # what it left: no lock now
    b = make_mount(ssd=a.ssd, capacity="64M")
    assert is_mounted(b.path)
    assert holder_of(a.ssd) == f"{b.proc.pid} {b.path}\n"
    assert (b.p("agent", "s1", "turn0")).read_bytes() == data


def test_a_holder_that_lets_go_within_the_wait_is_waited_for(make_mount, tmp_path):
    """A daemon that is still exiting (it no longer serves a mount) may hold
    the lock for a moment: the next one waits up to 5 s for it."""
    ssd = tmp_path / "ssd"
    ssd.mkdir(mode=0o700)
    fd = os.open(ssd / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, f"{os.getpid()} {tmp_path / 'gone'}\n".encode())
    letgo = threading.Timer(1.5, os.close, (fd,))
    letgo.start()
    try:
        m = make_mount(ssd=ssd, capacity="64M")
    finally:
        letgo.join()
    assert is_mounted(m.path)
    assert holder_of(ssd) == f"{m.proc.pid} {m.path}\n"


def test_a_holder_that_keeps_it_is_named_after_the_wait(tmp_path):
    ssd = tmp_path / "ssd"
    ssd.mkdir(mode=0o700)
    fd = os.open(ssd / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, f"{os.getpid()} {tmp_path / 'gone'}\n".encode())
        before = snapshot(ssd)
        mnt = tmp_path / "mnt"
        mnt.mkdir()
        r = memosfs("memos", str(mnt), "-f", "-o", f"ssd={ssd},capacity=64M")
        assert r.returncode != 0
        assert (f"the SSD directory {ssd} is in use by pid {os.getpid()} "
                f"(mounted at {tmp_path / 'gone'})") in r.stderr, r.stderr
        assert not is_mounted(mnt)
        assert snapshot(ssd) == before
    finally:
        os.close(fd)


# ---------------------------------------------------------------- a mount over a live one


def test_mount_over_a_live_memosfs_is_refused(make_mount, tmp_path):
    a = make_mount(capacity="64M")
    other = tmp_path / "other-ssd"
    r = memosfs("memos", str(a.path), "-f", "-o", f"ssd={other},capacity=64M")
    assert r.returncode != 0
    # the command it names runs from here: `memosfs` where that is on the PATH
    # (make install), else this interpreter (tests/test_first_steps.py)
    me = "memosfs" if shutil.which("memosfs") else f"{sys.executable} -m memosfs"
    assert r.stderr.strip() == (
        f"memosfs: {a.path} already has a fuse.memosfs mount (pid {a.proc.pid}); unmount it "
        f"first ({me} umount {a.path}) or pass -o nonempty / --force to mount over it"), \
        r.stderr
    assert mounts_at(a.path) == ["fuse.memosfs"]
    assert not other.exists()                   # refused before the SSD directory was made
    assert memosfs("memos", "--help").stdout.count("--force") >= 1


@pytest.mark.parametrize("ask", [["--force"], ["-o", "nonempty"]])
def test_mount_over_a_live_memosfs_when_asked(make_mount, tmp_path, ask):
    a = make_mount(capacity="64M")
    populate(a)
    other = tmp_path / "other-ssd"
    proc = subprocess.Popen([sys.executable, "-m", "memosfs", "memos", str(a.path), "-f",
                             "-o", f"ssd={other},capacity=64M,log={tmp_path / 'top.log'}",
                             *ask], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while len(mounts_at(a.path)) < 2:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the second mount did not come up"
            time.sleep(0.02)
        assert mounts_at(a.path) == ["fuse.memosfs", "fuse.memosfs"]
        assert "agent" not in os.listdir(a.path)    # the top one: its own, empty, namespace
        assert holder_of(other) == f"{proc.pid} {a.path}\n"
        subprocess.run(["fusermount3", "-u", str(a.path)], check=True)   # the top one
        assert proc.wait(timeout=30) == 0
        assert mounts_at(a.path) == ["fuse.memosfs"]
        assert a.p("agent", "s1", "turn0").stat().st_size == 300_000
    finally:
        if proc.poll() is None:
            if len(mounts_at(a.path)) > 1:
                subprocess.run(["fusermount3", "-u", "-z", str(a.path)])
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        proc.stderr.close()
    text = (tmp_path / "top.log").read_text()
    assert "Traceback" not in text, text
