"""mount(8), umount(8) and the install step in mountscripts/."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FUSE_REASON, is_mounted

ROOT = Path(__file__).resolve().parent.parent
WRAPPER = Path("/usr/local/bin/memosfs")
MARK = "installed by memosfs mountscripts/install.sh"

pytestmark = [
    pytest.mark.skipif(FUSE_REASON is not None, reason=FUSE_REASON or ""),
    pytest.mark.skipif(os.geteuid() != 0, reason="mount(8) of a FUSE type needs root"),
    pytest.mark.skipif(shutil.which("mount") is None, reason="mount(8) is missing"),
    pytest.mark.mount,
]


@pytest.fixture
def helper():
    """The wrapper mount(8) needs, for this checkout; removed if we made it."""
    if WRAPPER.exists() and MARK not in WRAPPER.read_text(errors="replace"):
        pytest.skip(f"{WRAPPER} is another program; not replacing it")
    existed = WRAPPER.exists()
    old = WRAPPER.read_text() if existed else None
    memosfs = Path(sys.executable).parent / "memosfs"
    r = subprocess.run(["sh", str(ROOT / "mountscripts" / "install.sh"), str(memosfs)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    yield
    if existed:
        WRAPPER.write_text(old)
    else:
        WRAPPER.unlink()


def test_mount_t_fuse_memosfs_and_umount(helper, tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    opts = f"capacity=32M,evict_batch=24,ssd={tmp_path}/ssd,log={log},nofail"
    r = subprocess.run(["mount", "-t", "fuse.memosfs", "memos", str(mnt), "-o", opts],
                       capture_output=True, text=True, timeout=60)
    try:
        assert r.returncode == 0, r.stderr + (log.read_text() if log.exists() else "")
        assert is_mounted(mnt)                    # mount(8) returned with the fs up
        fstype = [ln.split()[2] for ln in open("/proc/mounts") if ln.split()[1] == str(mnt)]
        assert fstype == ["fuse.memosfs"]
        assert {"nodev", "nosuid"} <= mount_flags(mnt)    # as make run's (mount.fuse3
                                                          # adds dev,suid)
        assert (mnt / ".memos/cache/evict_batch").read_text() == "24\n"
        (mnt / "a").mkdir()
        (mnt / "a/s").mkdir()
        (mnt / "a/s/x").write_bytes(b"via mount(8)")
        assert (mnt / "a/s/x").read_bytes() == b"via mount(8)"
    finally:
        u = subprocess.run(["umount", str(mnt)], capture_output=True, text=True)
    assert u.returncode == 0, u.stderr
    assert not is_mounted(mnt)
    deadline = time.monotonic() + 20             # the daemon exits after unmount
    while "unmounted" not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    text = log.read_text()
    assert "unmounted" in text and "Traceback" not in text


def mount_flags(mnt: Path) -> set[str]:
    """The per-mount flags of the mount at mnt (/proc/self/mountinfo's sixth field)."""
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        if fields[4] == str(mnt):
            return set(fields[5].split(","))
    raise AssertionError(f"{mnt} is not mounted")


def test_dev_and_suid_are_not_taken_whoever_asks(helper, tmp_path):
    """mount(8) passes an explicit dev,suid as mount.fuse3 adds them: the
    mount is nodev,nosuid all the same (docs/semantics.md)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    log = tmp_path / "daemon.log"
    r = subprocess.run(["mount", "-t", "fuse.memosfs", "memos", str(mnt), "-o",
                        f"capacity=32M,ssd={tmp_path}/ssd,log={log},dev,suid,exec"],
                       capture_output=True, text=True, timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        assert {"nodev", "nosuid"} <= mount_flags(mnt)
        assert "noexec" not in mount_flags(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
    assert "mount options dev,suid: not taken" in log.read_text()


def test_fstab_and_unit_name_the_same_type():
    fstab = (ROOT / "mountscripts" / "fstab.example").read_text()
    unit = (ROOT / "mountscripts" / "mnt-memos.mount").read_text()
    line = [ln for ln in fstab.splitlines() if ln and not ln.startswith("#")][0].split()
    assert line[:3] == ["memos", "/mnt/memos", "fuse.memosfs"]
    assert "Type=fuse.memosfs" in unit and "Where=/mnt/memos" in unit
