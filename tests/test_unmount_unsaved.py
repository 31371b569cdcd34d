"""An unmount never loses a slot it could keep (memosfs/fuse/unmount.py).

The SSD directory on a small tmpfs, filled: slots whose writers' closes
succeeded stay in memory, dirty, because the tier cannot take them.
`memosfs umount` then refuses, naming them and the room missing, unless
--force; umount(8) and fusermount3 -u find the mount busy; a lazy unmount
and a second Ctrl-C lose them, saying so; once room comes, the unmount
saves every one."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import is_mounted
from memosfs.fuse.unmount import Unsaved

MiB = 1 << 20


def test_the_report_reads_back_and_says_what_and_how_much():
    u = Unsaved.of([("a/s/k3", 4 * MiB), ("a/s/k2", 4 * MiB)], 3 * MiB,
                   "the SSD directory's disk is full (/d)")
    back = Unsaved.parse(u.text())
    assert back == u and back.missing == 5 * MiB
    assert back.say() == ("2 slots (8.0 MiB) cannot be written back to the SSD tier: the "
                          "SSD directory's disk is full (/d); it has room for 3.0 MiB, about "
                          "5.0 MiB more is needed: a/s/k3 (4.0 MiB), a/s/k2 (4.0 MiB)")
    nameless = Unsaved.parse(u.text(names=False))   # (what a uid other than root reads)
    assert nameless.count == 2 and nameless.slots == [] and "a/s" not in nameless.say()


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs for the SSD directory (grown by `grow(disk)`),
    unmounted at teardown, after the mounts (ask for it first)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "small-disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield disk
    finally:
        if subprocess.run(["umount", str(disk)]).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)])


def grow(disk: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)


def memosfs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memosfs", *args], capture_output=True,
                          text=True, timeout=120)


def full(make_mount, disk: Path):
    """A mount whose SSD tier is full with two of its three 4 MiB slots
    still dirty in memory; (mount, {name: bytes})."""
    m = make_mount(capacity="32M", ssd=disk / "ssd", writeback_delay_ms=0)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    kept = {}
    for i in range(3):
        kept[f"k{i}"] = os.urandom(4 * MiB)
        (d / f"k{i}").write_bytes(kept[f"k{i}"])     # every close succeeds (memory)
    return m, kept


def wait_for(pred, what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def held(m) -> bool:
    return "unmount refused until room is made" in m.logtext()


def test_memosfs_umount_refuses_names_the_slots_and_saves_them_once_room_comes(
        small_disk, make_mount):
    m, kept = full(make_mount, small_disk)
    r = memosfs("umount", str(m.path))
    assert r.returncode == 1
    assert r.stderr.startswith(f"memosfs: not unmounting {m.path}: 2 slots (8.0 MiB) cannot be "
                               "written back to the SSD tier: the SSD directory's disk is full")
    assert "more is needed: a/s/k" in r.stderr and "umount --force" in r.stderr, r.stderr
    assert is_mounted(m.path)
    for name, data in kept.items():
        assert m.p("a", "s", name).read_bytes() == data
    grow(small_disk)
    r = memosfs("umount", str(m.path))
    assert r.returncode == 0, r.stderr
    assert not is_mounted(m.path)
    assert "it is lost" not in m.logtext()
    again = make_mount(capacity="32M", ssd=small_disk / "ssd")
    for name, data in kept.items():
        assert again.p("a", "s", name).read_bytes() == data


def test_force_unmounts_and_names_what_is_lost(small_disk, make_mount):
    m, kept = full(make_mount, small_disk)
    r = memosfs("umount", "--force", str(m.path))
    assert not is_mounted(m.path)
    assert r.returncode == 1
    lost = r.stderr.rsplit(": ", 1)[1].strip().split(", ")
    assert len(lost) == 2 and set(lost) <= {f"a/s/{n}" for n in kept}, r.stderr
    assert "2 slots could not be saved to the SSD tier and are lost" in r.stderr


def test_umount_and_fusermount_find_the_mount_busy_and_a_lazy_unmount_lets_go(
        small_disk, make_mount):
    m, kept = full(make_mount, small_disk)
    wait_for(lambda: held(m), "the daemon never held its mount")
    for cmd in (["umount", str(m.path)], ["fusermount3", "-u", str(m.path)]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode != 0 and "busy" in r.stderr, (cmd, r)
        assert is_mounted(m.path)
    subprocess.run(["umount", "-l", str(m.path)], check=True)
    m.proc.wait(timeout=20)                     # the daemon lets go and ends
    log = m.logtext()
    assert "the mount was detached (umount -l): 2 slots" in log, log
    assert log.count("it is lost") == 2


def test_ctrl_c_is_refused_once_then_unmounts(small_disk, make_mount):
    m, kept = full(make_mount, small_disk)
    m.proc.send_signal(signal.SIGINT)
    wait_for(lambda: "signal 2: not unmounting" in m.logtext(), "the signal was not refused")
    assert is_mounted(m.path) and m.proc.poll() is None
    assert m.p("a", "s", "k2").read_bytes() == kept["k2"]
    m.proc.send_signal(signal.SIGINT)
    m.proc.wait(timeout=20)
    assert not is_mounted(m.path)
    assert "2 slots could not be saved to the SSD tier and are lost" in m.logtext()


def test_with_room_every_way_unmounts_as_before(make_mount):
    m = make_mount(capacity="32M", writeback_delay_ms=0)
    m.p("a", "s").mkdir(parents=True)
    m.p("a", "s", "x").write_bytes(b"x" * MiB)
    assert (m.ctl("unsaved").read_text().splitlines()[0]) == "slots 0"
    subprocess.run(["umount", str(m.path)], check=True)
    m.proc.wait(timeout=20)
    assert "could not be saved" not in m.logtext() and not held(m)
