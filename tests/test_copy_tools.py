"""Everyday copy tools round-trip a tree through a mount: `cp -a`, `rsync -a`
and `rsync -aX`, `mv` out of the mount and back, `tar` of a session and of
the whole mount — each exits 0 and the trees come back identical (bytes,
modes, times where the tool keeps them, the files' own user.* attributes).

What the cache computes (user.memos.tier and the rest) is not listed, so no
tool copies it out or tries to remove it from a file it makes in the mount
(docs/xattrs.md); `.federated` gives the same size and mtime to every way of
asking, so tar does not see it change (docs/operating.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

needs_tools = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("rsync", "tar", "getfattr", "diff")),
    reason="needs rsync, tar, getfattr and diff (make test installs rsync)")

pytestmark = needs_tools


def run(*cmd: str, cwd=None) -> subprocess.CompletedProcess:
    r = subprocess.run(list(cmd), capture_output=True, text=True, cwd=cwd, timeout=120)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}"
    assert r.stderr == "" or "Removing leading" in r.stderr, r.stderr
    return r


def make_tree(root: Path) -> Path:
    """A session as an engine leaves one: slots of a few sizes, a folder per
    prefix hash, an empty slot, a user.* attribute, modes and old mtimes."""
    s = root / "chat-7"
    (s / "blocks" / "ab12").mkdir(parents=True)
    (s / "turn0").write_bytes(os.urandom(3 << 20))
    (s / "turn1").write_bytes(b"x" * 5000)
    (s / "empty").write_bytes(b"")
    (s / "blocks" / "ab12" / "layer.0").write_bytes(os.urandom(70000))
    os.setxattr(s / "turn1", "user.note", b"kept")
    os.chmod(s / "turn1", 0o640)
    for p in (s / "turn0", s / "turn1", s / "blocks" / "ab12" / "layer.0"):
        os.utime(p, ns=(1_700_000_000_000_000_000, 1_700_000_000_000_000_000))
    return s


def same_tree(a: Path, b: Path, times: bool = True) -> None:
    """diff -r says nothing; modes, mtimes and the user.* attributes agree."""
    run("diff", "-r", str(a), str(b))
    for dirpath, dirs, files in os.walk(a):
        for name in dirs + files:
            pa = Path(dirpath) / name
            pb = b / pa.relative_to(a)
            sa, sb = os.lstat(pa), os.lstat(pb)
            assert sa.st_mode == sb.st_mode, pa
            if times and not pa.is_dir():
                assert sa.st_mtime_ns // 10**9 == sb.st_mtime_ns // 10**9, pa
            assert sorted(os.listxattr(pa)) == sorted(os.listxattr(pb)), pa
            for x in os.listxattr(pa):
                assert os.getxattr(pa, x) == os.getxattr(pb, x), (pa, x)


def test_a_slot_lists_only_its_own_attributes(make_mount, tmp_path):
    m = make_mount(capacity="64M")
    s = make_tree(tmp_path / "src")
    run("rsync", "-aX", str(s), str(m.p("planner")) + "/")
    slot = m.p("planner", "chat-7", "turn1")
    assert os.listxattr(slot) == ["user.note"]
    assert os.getxattr(slot, "user.memos.tier") == b"mem"          # still there by name
    assert os.listxattr(m.p("planner")) == []                     # usage: by name only
    assert int(os.getxattr(m.p("planner"), "user.memos.usage")) > 3 << 20


def test_rsync_cp_and_mv_round_trip_a_session(make_mount, tmp_path):
    m = make_mount(capacity="64M")
    src = make_tree(tmp_path / "src")
    agent = m.p("planner")
    agent.mkdir()
    # in: rsync -aX (it sets the attributes it found and removes what it did
    # not on the temporary files it makes), then again over the same tree
    run("rsync", "-aX", str(src), str(agent) + "/")
    run("rsync", "-aX", str(src), str(agent) + "/")
    same_tree(src, agent / "chat-7")
    # out: cp -a, rsync -aX
    run("cp", "-a", str(agent / "chat-7"), str(tmp_path / "cp-out"))
    same_tree(src, tmp_path / "cp-out")
    run("rsync", "-aX", str(agent / "chat-7") + "/", str(tmp_path / "rsync-out"))
    same_tree(src, tmp_path / "rsync-out")
    for p in (tmp_path / "cp-out").rglob("*"):
        assert not any(x.startswith("user.memos.") for x in os.listxattr(p)), p
    # in: cp -a of a copy
    run("cp", "-a", str(tmp_path / "cp-out"), str(agent / "chat-8"))
    same_tree(src, agent / "chat-8")
    # mv out of the mount and back (a copy, then a removal, each way)
    run("mv", str(agent / "chat-7"), str(tmp_path / "moved"))
    assert not (agent / "chat-7").exists()
    same_tree(src, tmp_path / "moved")
    run("mv", str(tmp_path / "moved"), str(agent / "chat-7"))
    same_tree(src, agent / "chat-7")
    assert (m.stats()["slots"]) >= 8


def test_tar_of_a_session_and_of_the_whole_mount(make_mount, tmp_path):
    m = make_mount(capacity="64M")
    src = make_tree(tmp_path / "src")
    m.p("planner").mkdir()
    run("cp", "-a", str(src), str(m.p("planner")) + "/")
    # a session, with its attributes
    run("tar", "--xattrs", "--xattrs-include=user.*", "-cf", str(tmp_path / "s.tar"),
        "-C", str(m.path), "planner")
    (tmp_path / "s").mkdir()
    run("tar", "--xattrs", "--xattrs-include=user.*", "-xf", str(tmp_path / "s.tar"),
        "-C", str(tmp_path / "s"))
    same_tree(src, tmp_path / "s" / "planner" / "chat-7")
    # the whole mount, as root: every file there can be read (the control
    # plane's files are archived as the size they report)
    x = ("--xattrs", "--xattrs-include=user.*")
    run("tar", *x, "-cf", str(tmp_path / "all.tar"), "-C", str(m.path), ".")
    names = run("tar", "-tf", str(tmp_path / "all.tar")).stdout.split()
    assert "./.federated/" in names and "./.memos/cache/flush" in names
    (tmp_path / "all").mkdir()
    run("tar", *x, "-xf", str(tmp_path / "all.tar"), "-C", str(tmp_path / "all"), "./planner")
    same_tree(src, tmp_path / "all" / "planner" / "chat-7")
    # and back into a second mount: an agent restored from the archive
    m2 = make_mount(capacity="64M")
    run("tar", *x, "-xf", str(tmp_path / "all.tar"), "-C", str(m2.path), "./planner")
    same_tree(src, m2.p("planner", "chat-7"))


def test_federated_shows_one_size_and_mtime_to_every_way_of_asking(make_mount):
    """lookup, readdir(plus) and getattr of `.federated` agree (tar compares
    what the directory walk saw with an fstat of the open directory)."""
    m = make_mount(capacity="64M")
    fed = m.path / ".federated"
    listed = {e.name: e.stat() for e in os.scandir(m.path)}[".federated"]
    fd = os.open(fed, os.O_RDONLY | os.O_DIRECTORY)
    try:
        opened = os.fstat(fd)
    finally:
        os.close(fd)
    looked_up = os.stat(fed)
    for st in (listed, looked_up):
        assert (st.st_mode, st.st_size, st.st_mtime_ns, st.st_nlink) == \
            (opened.st_mode, opened.st_size, opened.st_mtime_ns, opened.st_nlink)


def test_mknod_of_a_regular_file_is_an_empty_slot(make_mount):
    """GNU tar --xattrs makes its files with mknod(S_IFREG): an empty slot,
    published at once with the mode asked for less the mount's umask (077 by
    default; tar's chmod afterwards sets the archived mode).  (A FIFO or a
    device node is a special file: tests/test_special_files.py; at the root it
    is EPERM.)"""
    import stat
    m = make_mount(capacity="64M")
    s = m.p("a", "s")
    s.mkdir(parents=True)
    os.mknod(s / "made", stat.S_IFREG | 0o640)
    st = os.stat(s / "made")
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_size == 0
    assert os.getxattr(s / "made", "user.memos.tier") == b"mem"
    (s / "made").write_bytes(b"then written")
    assert (s / "made").read_bytes() == b"then written"
    for make in (lambda p: os.mkfifo(p), lambda p: os.mknod(p, stat.S_IFCHR | 0o600, 0)):
        with pytest.raises(OSError) as e:
            make(m.p("odd"))
        assert e.value.errno == 1 and not m.p("odd").exists()
    with pytest.raises(FileExistsError):
        os.mknod(s / "made", stat.S_IFREG | 0o600)
    with pytest.raises(PermissionError):
        os.mknod(m.p("a", "at-agent-level"), stat.S_IFREG | 0o600)
