"""What the daemon writes to disk is its user's alone.

The SSD directory (slot files, shard folders, order.json, namespace.json,
the federated jobs' state), the log file and the run files of `memosfs
umount` hold every agent's keys, owners and data: folders are 0700 and files
0600 whatever the daemon's umask, a folder left looser (an older memosfs made
it 0755 with 0644 files) is tightened at mount with a WARNING, and another
uid can neither list nor read any of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

OTHER = 5002

needs_root_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="runs commands as another uid: needs root and setpriv")


@contextlib.contextmanager
def umask(mask: int):
    """The daemon started inside inherits this umask."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def as_other(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={OTHER}", f"--regid={OTHER}",
                           "--clear-groups", *cmd], capture_output=True, timeout=60)


def modes_under(root: Path) -> dict[str, tuple[str, int]]:
    """relative path -> (kind, permission bits) of root and everything below,
    links not followed."""
    out = {".": ("dir", stat.S_IMODE(os.lstat(root).st_mode))}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = os.lstat(p)
            kind = "dir" if stat.S_ISDIR(st.st_mode) else \
                "link" if stat.S_ISLNK(st.st_mode) else "file"
            out[str(p.relative_to(root))] = (kind, stat.S_IMODE(st.st_mode))
    return out


def assert_private(root: Path) -> dict[str, tuple[str, int]]:
    modes = modes_under(root)
    wrong = {p: (k, oct(m)) for p, (k, m) in modes.items()
             if (k == "dir" and m != 0o700) or (k == "file" and m != 0o600)}
    assert not wrong, f"not 0700/0600 under {root}: {wrong}"
    return modes


def assert_other_locked_out(root: Path, modes: dict[str, tuple[str, int]]) -> None:
    """uid OTHER reaches root's parent but cannot list root or read a file in it."""
    reach = as_other("ls", str(root.parent))
    assert reach.returncode == 0, reach.stderr     # the parent is open: the check means something
    r = as_other("ls", str(root))
    assert r.returncode != 0 and b"Permission denied" in r.stderr, r
    files = [p for p, (k, _) in modes.items() if k == "file"]
    assert files
    for rel in files:
        r = as_other("cat", str(root / rel))
        assert r.returncode != 0 and b"Permission denied" in r.stderr, (rel, r)


def write_private_slots(m) -> None:
    agent = m.p("alice")
    os.mkdir(agent, 0o700)                      # a private agent
    os.mkdir(agent / "s1", 0o700)
    (agent / "s1" / "slot0").write_bytes(b"secret kv " * 5000)
    os.makedirs(agent / "s1" / "req7")
    (agent / "s1" / "req7" / "slot1").write_bytes(b"prefix " * 300)


@needs_root_setpriv
@pytest.mark.parametrize("pack", ["0", "64K"])
def test_ssd_dir_is_private_while_mounted_and_after(make_mount, pack):
    """Slot files (ssd_pack_below=0) and the segments small slots are packed
    in (the default) alike."""
    kind = ".slot" if pack == "0" else ".seg"
    with umask(0):                              # the modes must not come from the umask
        m = make_mount(world=True, capacity="64M", ssd_pack_below=pack)
    write_private_slots(m)
    m.ctl("flush").write_text("1\n")            # persists every slot, order and namespace
    modes = assert_private(m.ssd)
    assert any(p.endswith(kind) for p in modes)
    assert "order.json" in modes and "namespace.json" in modes
    assert_other_locked_out(m.ssd, modes)

    # more writes after the flush, then unmount: what close writes is private too
    (m.p("alice", "s1", "slot2")).write_bytes(b"late " * 1000)
    m.stop()
    modes = assert_private(m.ssd)
    if pack == "0":
        assert sum(p.endswith(".slot") for p in modes) == 3
    else:
        assert any(p.endswith(".seg") for p in modes)
    # the file that must not leak does name the private agent
    assert "alice" in (m.ssd / "namespace.json").read_text()
    assert_other_locked_out(m.ssd, modes)


@pytest.fixture
def public_base():
    """A folder every uid can reach (removed after the mounts in it are down:
    ask for it before make_mount)."""
    base = Path(tempfile.mkdtemp(prefix="memosfs-test-"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


@needs_root_setpriv
def test_loose_ssd_dir_is_tightened_at_mount(public_base, make_mount):
    ssd = public_base / "ssd"
    m = make_mount(ssd=ssd, capacity="64M")
    write_private_slots(m)
    m.stop()
    # what an older memosfs (or a careless operator) left: 0755 folders, 0644 files
    loosened = 0
    for dirpath, _dirnames, filenames in os.walk(ssd):
        os.chmod(dirpath, 0o755)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o644)
        loosened += 1 + len(filenames)
    (ssd / "notes.txt").write_text("x")
    os.chmod(ssd / "notes.txt", 0o644)
    loosened += 1
    (ssd / "readonly").write_text("x")
    os.chmod(ssd / "readonly", 0o400)           # already tight: never loosened
    os.mkdir(ssd / "tight", 0o700)
    # links are neither followed nor changed
    outside = public_base / "outside"
    outside.mkdir()
    (outside / "f").write_text("x")
    os.chmod(outside, 0o755)
    os.chmod(outside / "f", 0o644)
    os.symlink(outside, ssd / "link-to-dir")
    os.symlink(outside / "f", ssd / "link-to-file")
    assert modes_under(ssd)["."] == ("dir", 0o755)
    assert as_other("cat", str(ssd / "namespace.json")).returncode == 0   # the leak

    m2 = make_mount(ssd=ssd, capacity="64M")
    modes = modes_under(ssd)
    wrong = {p: (k, oct(mode)) for p, (k, mode) in modes.items()
             if k == "dir" and mode != 0o700
             or k == "file" and p != "readonly" and mode != 0o600}
    assert not wrong, wrong
    assert modes["readonly"] == ("file", 0o400)
    assert modes["link-to-dir"][0] == "link" and modes["link-to-file"][0] == "link"
    assert stat.S_IMODE(os.stat(outside).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(outside / "f").st_mode) == 0o644
    found = re.findall(r"WARNING memosfs\.private: ssd directory (\S+): took group/"
                       r"other access off (\d+) entries", m2.logtext())
    assert found == [(str(ssd), str(loosened))], m2.logtext()
    # the slots are all there and read back
    assert m2.p("alice", "s1", "slot0").read_bytes() == b"secret kv " * 5000
    assert m2.p("alice", "s1", "req7", "slot1").read_bytes() == b"prefix " * 300
    r = as_other("cat", str(ssd / "namespace.json"))
    assert r.returncode != 0 and b"Permission denied" in r.stderr
    m2.stop()
    # a second mount finds nothing to tighten and says nothing
    m3 = make_mount(ssd=ssd, capacity="64M")
    assert "took group/other access" not in m3.logtext()


def test_log_file_is_private(make_mount, tmp_path):
    # a new log file: 0600 even under umask 0
    with umask(0):
        m = make_mount(capacity="64M")
    assert stat.S_IMODE(os.stat(m.log).st_mode) == 0o600
    m.stop()
    assert stat.S_IMODE(os.stat(m.log).st_mode) == 0o600
    assert "took group/other access off it" not in m.logtext()
    # a log file that is there, 0644: tightened, kept (appended to), and said so
    # (the fixture's next mount logs to mnt1.log)
    loose = m.tmp / "mnt1.log"
    loose.write_text("an older mount's line\n")
    os.chmod(loose, 0o644)
    m1 = make_mount(capacity="64M")
    assert m1.log == loose
    assert stat.S_IMODE(os.stat(loose).st_mode) == 0o600
    text = m1.logtext()
    assert text.startswith("an older mount's line\n")
    assert f"WARNING memosfs: log file {loose}: took group/other access off it" in text


def test_log_file_that_is_not_a_regular_file_is_left_alone(tmp_path):
    from memosfs.private import tighten_file
    assert tighten_file("/dev/null") == (False, False)
    assert stat.S_IMODE(os.stat("/dev/null").st_mode) == 0o666


def test_tighten_tree_takes_only_group_and_other_bits(tmp_path):
    from memosfs.private import tighten_tree
    root = tmp_path / "d"
    (root / "sub").mkdir(parents=True)
    os.chmod(root, 0o2775)
    os.chmod(root / "sub", 0o500)
    (root / "exe").write_text("x")
    os.chmod(root / "exe", 0o755)
    (root / "suid").write_text("x")
    os.chmod(root / "suid", 0o4600)
    (root / "ok").write_text("x")
    os.chmod(root / "ok", 0o600)
    os.chmod(root / "sub", 0o700)
    (root / "sub" / "f").write_text("x")
    os.chmod(root / "sub" / "f", 0o666)
    os.chmod(root / "sub", 0o500)           # tight already, and not made writable
    assert tighten_tree(str(root)) == 4
    assert modes_under(root) == {".": ("dir", 0o700), "sub": ("dir", 0o500),
                                 "exe": ("file", 0o600), "suid": ("file", 0o600),
                                 "ok": ("file", 0o600), "sub/f": ("file", 0o600)}
    assert tighten_tree(str(root)) == 0
    os.chmod(root / "sub", 0o700)


@needs_root_setpriv
def test_federated_state_is_private(make_mount):
    pytest.importorskip("numpy")
    F = pytest.importorskip("memosfs.federated")
    import numpy as np
    with umask(0):
        m = make_mount(world=True, capacity="64M")
    job = m.p(".federated", "lr")
    os.mkdir(job, 0o700)
    (job / "params.safetensors").write_bytes(
        F.st_save({"W": np.ones((4, 3), np.float32)}))
    state = m.ssd / "federated"
    modes = assert_private(state)
    assert any(p.endswith(".kv") for p in modes), modes
    assert_private(m.ssd)
    os.chmod(m.ssd, 0o755)          # open the way to it: the state folder itself must hold
    try:
        assert_other_locked_out(state, modes)
    finally:
        os.chmod(m.ssd, 0o700)
    m.stop()
    # state an older memosfs left 0755/0644 is tightened at the next mount
    for dirpath, _dirs, files in os.walk(state):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
    os.chmod(m.ssd, 0o755)
    m2 = make_mount(ssd=m.ssd, capacity="64M")
    assert_private(m.ssd)
    assert "lr" in os.listdir(m2.p(".federated"))       # the job came back
    assert re.search(r"WARNING memosfs\.private: ssd directory \S+: took group/other "
                     r"access off \d+ entries", m2.logtext())


def run_file(mountpoint: Path, kind: str) -> Path:
    base = Path("/run/memosfs") if os.geteuid() == 0 else Path(
        os.environ.get("XDG_RUNTIME_DIR", "")) / "memosfs" \
        if os.environ.get("XDG_RUNTIME_DIR") else Path(f"/tmp/memosfs-{os.geteuid()}")
    tag = hashlib.sha256(os.path.abspath(mountpoint).encode()).hexdigest()[:24]
    return base / f"{tag}.{kind}"


def test_run_files_are_private(make_mount):
    with umask(0):
        m = make_mount(capacity="64M")
    pid = run_file(m.path, "pid")
    assert json.loads(pid.read_text())["pid"] == m.proc.pid
    assert stat.S_IMODE(os.stat(pid).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(pid.parent).st_mode) == 0o700
    m.stop()
    exit_file = run_file(m.path, "exit")
    assert json.loads(exit_file.read_text())["pid"] == m.proc.pid
    assert stat.S_IMODE(os.stat(exit_file).st_mode) == 0o600
