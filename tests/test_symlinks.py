"""Symbolic links in agents, sessions and the directories below (issue 38,
item 8): `ln -s`, readlink, lchown and lutimes, a link as a name (unlink,
rename of it and over it, rmdir of a directory that holds one), kept with
the namespace across a clean unmount and, once its directory was fsync'd,
across kill -9; `cp -a`, `tar` and `rsync -a` of a tree that holds links.
Hard links stay EPERM (docs/design.md says why)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import time
import warnings
from pathlib import Path

import pytest

from conftest import CTX
from memosfs.testing import faults
from memosfs.testing.daemon import is_mounted

# the owner lchown gives (another uid needs root; a user's own otherwise)
OWNER = (1234, 5678) if os.geteuid() == 0 else (os.getuid(), os.getgid())
OLD_NS = 1_600_000_000_123_456_789


def session(m, agent: str = "a", sess: str = "s") -> Path:
    s = m.p(agent, sess)
    s.mkdir(parents=True)
    return s


def fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def kill9(m) -> None:
    if faults.kill9(m):
        warnings.warn("kill -9 did not end the daemon; the FUSE connection was aborted")
    assert not is_mounted(m.path)


def test_ln_s_readlink_and_following(make_mount):
    m = make_mount(capacity="64M")
    s = session(m)
    (s / "turn0").write_bytes(b"kv state")
    os.symlink("turn0", s / "latest")
    assert os.readlink(s / "latest") == "turn0"
    assert (s / "latest").read_bytes() == b"kv state"
    st = os.lstat(s / "latest")
    assert oct(st.st_mode) == oct(0o120777)
    assert st.st_size == len("turn0")
    assert st.st_uid == os.getuid()
    assert sorted(os.listdir(s)) == ["latest", "turn0"]
    # a link in an agent directory (to a session), and one that dangles
    os.symlink("s", m.p("a", "current"))
    assert sorted(os.listdir(m.p("a", "current"))) == sorted(os.listdir(s))
    os.symlink("/nowhere/at/all", s / "dangling")
    assert os.readlink(s / "dangling") == "/nowhere/at/all"
    with pytest.raises(FileNotFoundError):
        (s / "dangling").read_bytes()
    # bytes that are not UTF-8, the longest target the kernel passes
    os.symlink(b"\xff\xfe-raw", bytes(s / "raw"))
    assert os.readlink(bytes(s / "raw")) == b"\xff\xfe-raw"
    long = "x" * 4095
    os.symlink(long, s / "long")
    assert os.readlink(s / "long") == long
    # a write through the link goes to the slot it names
    (s / "latest").write_bytes(b"new state")
    assert (s / "turn0").read_bytes() == b"new state"
    # a slot through a link that names a new file in a session
    os.symlink("made-through-link", s / "ahead")
    (s / "ahead").write_bytes(b"x")
    assert (s / "made-through-link").read_bytes() == b"x"


def test_where_links_may_live(make_mount):
    m = make_mount(capacity="64M")
    s = session(m)
    for where in (m.p("top"), m.p(".memos", "x"), m.p(".memos", "cache", "x")):
        with pytest.raises(OSError) as e:
            os.symlink("a", where)
        assert e.value.errno == errno.EPERM, where
    with pytest.raises(FileExistsError):
        os.symlink("x", s)
    (s / "slot").write_bytes(b"1")
    with pytest.raises(FileExistsError):
        os.symlink("x", s / "slot")
    with pytest.raises(OSError) as e:
        os.symlink("x", s / ("n" * 256))
    assert e.value.errno == errno.ENAMETOOLONG
    (s / "d" / "e").mkdir(parents=True)
    os.symlink("../../slot", s / "d" / "e" / "up")
    assert (s / "d" / "e" / "up").read_bytes() == b"1"


def test_hard_links_are_eperm(make_mount):
    m = make_mount(capacity="64M")
    s = session(m)
    (s / "slot").write_bytes(b"1")
    os.symlink("slot", s / "l")
    for src in ("slot", "l"):
        with pytest.raises(OSError) as e:
            os.link(s / src, s / "hard", follow_symlinks=False)
        assert e.value.errno == errno.EPERM
    assert sorted(os.listdir(s)) == ["l", "slot"]


def test_a_link_is_a_name(make_mount):
    m = make_mount(capacity="64M")
    s = session(m)
    (s / "slot").write_bytes(b"one")
    (s / "other").write_bytes(b"two")
    os.symlink("slot", s / "l")
    # rename of it: across sessions, and into an agent directory
    s2 = session(m, "b", "t")
    os.rename(s / "l", s2 / "l2")
    assert os.readlink(s2 / "l2") == "slot" and not os.path.lexists(s / "l")
    os.rename(s2 / "l2", m.p("b", "l3"))
    assert os.readlink(m.p("b", "l3")) == "slot"
    with pytest.raises(OSError) as e:
        os.rename(m.p("b", "l3"), m.p("l4"))        # not at the root
    assert e.value.errno == errno.EPERM
    os.rename(m.p("b", "l3"), s / "l")
    # a link renamed over a slot replaces it; a slot renamed over a link too
    os.rename(s / "l", s / "other")
    assert os.readlink(s / "other") == "slot"
    assert sorted(os.listdir(s)) == ["other", "slot"]
    os.symlink("x", s / "l")
    os.rename(s / "slot", s / "l")
    assert not os.path.islink(s / "l") and (s / "l").read_bytes() == b"one"
    # a link over a directory: EISDIR; a directory over a link: ENOTDIR
    (s / "dir").mkdir()
    with pytest.raises(IsADirectoryError):
        os.rename(s / "other", s / "dir")
    with pytest.raises(NotADirectoryError):
        os.rename(s / "dir", s / "other")
    # a directory that holds a link is not empty
    os.symlink("l", s / "dir" / "in")
    with pytest.raises(OSError) as e:
        os.rmdir(s / "dir")
    assert e.value.errno == errno.ENOTEMPTY
    os.unlink(s / "dir" / "in")
    os.rmdir(s / "dir")
    # unlink removes the link, never what it names
    os.unlink(s / "other")
    assert sorted(os.listdir(s)) == ["l"] and (s / "l").read_bytes() == b"one"
    # a session that holds links moves with them
    os.symlink("l", s / "again")
    os.rename(s, m.p("b", "moved"))
    assert (m.p("b", "moved", "again")).read_bytes() == b"one"


def test_lchown_and_lutimes_change_the_link_alone(make_mount):
    m = make_mount(capacity="64M")
    s = session(m)
    (s / "slot").write_bytes(b"1")
    os.symlink("slot", s / "l")
    slot_before = os.stat(s / "slot")
    os.lchown(s / "l", *OWNER)
    os.utime(s / "l", ns=(OLD_NS, OLD_NS), follow_symlinks=False)
    st = os.lstat(s / "l")
    assert (st.st_uid, st.st_gid, st.st_mtime_ns, st.st_atime_ns) == (*OWNER, OLD_NS, OLD_NS)
    after = os.stat(s / "slot")
    assert (after.st_uid, after.st_gid, after.st_mtime_ns) == (
        slot_before.st_uid, slot_before.st_gid, slot_before.st_mtime_ns)


def _links_tree(m) -> Path:
    s = session(m)
    (s / "blocks").mkdir()
    with open(s / "slot", "wb") as f:       # (durable: kill -9 keeps it)
        f.write(b"kv")
        f.flush()
        os.fsync(f.fileno())
    os.symlink("slot", s / "l")
    os.symlink("../slot", s / "blocks" / "up")
    os.symlink("s", m.p("a", "cur"))
    os.symlink(b"\xff\xfe-not-utf8", bytes(s / "raw"))
    os.lchown(s / "l", *OWNER)
    os.utime(s / "l", ns=(OLD_NS, OLD_NS), follow_symlinks=False)
    return s


def _check_links(m) -> None:
    s = m.p("a", "s")
    assert os.readlink(s / "l") == "slot"
    assert os.readlink(s / "blocks" / "up") == "../slot"
    assert os.readlink(m.p("a", "cur")) == "s"
    assert os.readlink(bytes(s / "raw")) == b"\xff\xfe-not-utf8"
    st = os.lstat(s / "l")
    assert (st.st_uid, st.st_gid, st.st_mtime_ns) == (*OWNER, OLD_NS)
    assert (s / "blocks" / "up").read_bytes() == b"kv"


def test_links_come_back_after_a_clean_unmount(make_mount):
    m = make_mount(capacity="64M")
    _links_tree(m)
    m.stop()
    m2 = make_mount(ssd=str(m.ssd), capacity="64M")
    _check_links(m2)
    # an unlink and a rename are kept too
    os.unlink(m2.p("a", "cur"))
    os.rename(m2.p("a", "s", "l"), m2.p("a", "s", "blocks", "l"))
    m2.stop()
    m3 = make_mount(ssd=str(m.ssd), capacity="64M")
    assert not os.path.lexists(m3.p("a", "cur"))
    assert os.readlink(m3.p("a", "s", "blocks", "l")) == "slot"
    assert not os.path.lexists(m3.p("a", "s", "l"))


def test_links_come_back_after_kill9_once_their_directory_was_fsynced(make_mount):
    m = make_mount(capacity="64M", writeback_delay_ms=600000)
    _links_tree(m)
    fsync_dir(m.p("a", "s"))
    kill9(m)
    m2 = make_mount(ssd=str(m.ssd), capacity="64M", writeback_delay_ms=600000)
    _check_links(m2)
    # an unlink made durable the same way never comes back
    os.unlink(m2.p("a", "s", "l"))
    fsync_dir(m2.p("a", "s"))
    kill9(m2)
    m3 = make_mount(ssd=str(m.ssd), capacity="64M")
    assert not os.path.lexists(m3.p("a", "s", "l"))
    assert os.readlink(m3.p("a", "s", "blocks", "up")) == "../slot"


def test_reset_context_drops_the_links_of_the_session(make_mount):
    m = make_mount(capacity="64M")
    s = _links_tree(m)
    m.ctl("reset_context").write_text("a/s\n")
    # (the kernel is told to drop its cached entries asynchronously, as for
    # slots; they go at the latest when their 1 s entry timeout ends)
    deadline = time.monotonic() + 3
    while (os.path.lexists(s / "l") or os.path.lexists(s / "blocks")) \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not os.path.lexists(s / "l") and not os.path.lexists(s / "blocks")
    assert os.readlink(m.p("a", "cur")) == "s"      # the agent's own link stays


needs_tools = pytest.mark.skipif(
    any(shutil.which(t) is None for t in ("rsync", "tar", "diff")),
    reason="needs rsync, tar and diff (make test installs rsync)")


def _run(*cmd: str) -> None:
    r = subprocess.run(list(cmd), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}"


def _source_tree(root: Path) -> Path:
    t = root / "chat"
    (t / "blocks").mkdir(parents=True)
    (t / "turn0").write_bytes(os.urandom(100_000))
    os.symlink("turn0", t / "latest")
    os.symlink("../turn0", t / "blocks" / "first")
    os.symlink("/does/not/exist", t / "dangling")
    os.utime(t / "latest", ns=(OLD_NS, OLD_NS), follow_symlinks=False)
    return t


def _same_links(a: Path, b: Path) -> None:
    _run("diff", "-r", "--no-dereference", str(a), str(b))
    for rel in ("latest", "blocks/first", "dangling"):
        la, lb = os.lstat(a / rel), os.lstat(b / rel)
        assert os.path.islink(b / rel), rel
        assert os.readlink(a / rel) == os.readlink(b / rel), rel
        if rel == "latest":
            assert la.st_mtime_ns // 10**9 == lb.st_mtime_ns // 10**9


@needs_tools
def test_cp_tar_and_rsync_copy_links_in_and_out(make_mount, tmp_path):
    m = make_mount(capacity="64M")
    src = _source_tree(tmp_path / "src")
    agent = m.p("planner")
    agent.mkdir()
    _run("cp", "-a", str(src), str(agent / "cp"))
    _same_links(src, agent / "cp")
    _run("rsync", "-a", str(src) + "/", str(agent / "rs") + "/")
    _same_links(src, agent / "rs")
    tarball = tmp_path / "t.tar"
    _run("tar", "-C", str(src.parent), "-cf", str(tarball), "chat")
    (agent / "tar").mkdir()
    _run("tar", "-C", str(agent / "tar"), "-xf", str(tarball))
    _same_links(src, agent / "tar" / "chat")
    # and back out of the mount
    out = tmp_path / "out"
    out.mkdir()
    _run("cp", "-a", str(agent / "cp"), str(out / "cp"))
    _same_links(src, out / "cp")
    _run("rsync", "-a", str(agent / "rs") + "/", str(out / "rs") + "/")
    _same_links(src, out / "rs")
    _run("tar", "-C", str(agent / "tar"), "-cf", str(tmp_path / "back.tar"), "chat")
    (out / "tar").mkdir()
    _run("tar", "-C", str(out / "tar"), "-xf", str(tmp_path / "back.tar"))
    _same_links(src, out / "tar" / "chat")


@needs_tools
def test_a_tree_with_hard_links_copies_as_docs_operating_says(make_mount, tmp_path):
    """Each name of a hard-linked source becomes a slot of its own with
    `cp -a --no-preserve=links`, `rsync -a` and `tar --hard-dereference`;
    `cp -a` reports the second name's EPERM."""
    m = make_mount(capacity="64M")
    src = tmp_path / "src"
    src.mkdir()
    (src / "a").write_bytes(b"shared")
    os.link(src / "a", src / "b")
    agent = m.p("planner")
    agent.mkdir()
    r = subprocess.run(["cp", "-a", str(src), str(agent / "plain")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and "Operation not permitted" in r.stderr
    _run("cp", "-a", "--no-preserve=links", str(src), str(agent / "cp"))
    _run("rsync", "-a", str(src) + "/", str(agent / "rs") + "/")
    _run("tar", "-C", str(tmp_path), "--hard-dereference", "-cf", str(tmp_path / "h.tar"),
         "src")
    (agent / "tar").mkdir()
    _run("tar", "-C", str(agent / "tar"), "-xf", str(tmp_path / "h.tar"))
    for d in (agent / "cp", agent / "rs", agent / "tar" / "src"):
        assert sorted(os.listdir(d)) == ["a", "b"], d
        assert (d / "a").read_bytes() == (d / "b").read_bytes() == b"shared"
        assert os.stat(d / "a").st_ino != os.stat(d / "b").st_ino


# ---------------------------------------------------------------- restore, without a mount

def _saved_tree(make_handlers, ssd) -> list:
    """a/s/x (a slot on the SSD), a/s/d/e (directories), a/s/l (a link):
    namespace.json's records."""
    h = make_handlers(ssd=ssd)
    s = h.mkdirs("a/s")
    h.mkdirs("a/s/d/e")
    h.write("a/s/x", b"slot bytes")
    h.call("symlink", s, b"l", b"x", CTX)
    h.store.persist(b"a/s/x")
    h.store.save_metadata(durable=True)
    return json.loads((ssd / "namespace.json").read_text())


def _restored(make_handlers, ssd):
    h = make_handlers(ssd=ssd)
    h.ops.restore()
    return h


def test_restore_brings_back_links_from_namespace_json(make_handlers, tmp_path):
    recs = _saved_tree(make_handlers, tmp_path / "ssd")
    [link] = [r for r in recs if r.get("type") == "symlink"]
    assert link["path"] == "a/s/l" and link["target"] == "x"
    h = _restored(make_handlers, tmp_path / "ssd")
    node = h.ops.inodes[h.lookup("a/s/l")]
    assert node.target == b"x" and h.listdir("a/s") == ["d", "l", "x"]


def test_restore_keeps_the_slot_or_the_directory_over_a_link_of_the_same_name(
        make_handlers, tmp_path, caplog):
    ssd = tmp_path / "ssd"
    recs = _saved_tree(make_handlers, ssd)
    # what a crash between two saves could leave: links where a slot and a
    # directory are, and a record that names no place
    extra = [{"path": "a/s/x", "type": "symlink", "target": "t", "uid": 0, "gid": 0},
             {"path": "a/s/d", "type": "symlink", "target": "t", "uid": 0, "gid": 0},
             {"path": "a", "type": "symlink", "target": "t", "uid": 0, "gid": 0},
             {"path": "a/s/bad", "type": "symlink", "uid": 0, "gid": 0}]
    # (the directory a/s/d comes after the link of its name)
    dirs = [r for r in recs if r.get("type") != "symlink" and not r["path"].startswith("a/s/d")]
    later = [r for r in recs if r["path"].startswith("a/s/d")]
    links = [r for r in recs if r.get("type") == "symlink"]
    (ssd / "namespace.json").write_text(json.dumps(dirs + extra + later + links))
    h = _restored(make_handlers, ssd)
    assert h.read("a/s/x") == b"slot bytes"
    assert h.listdir("a/s/d") == ["e"]
    assert h.listdir("a/s") == ["d", "l", "x"]
    assert "a/s/bad" in caplog.text and "'a'" in caplog.text
    assert "a/s/d is a symlink and a directory; the directory is kept" in caplog.text
    assert "b'a/s/x' is a symlink and a slot; the slot is kept" in caplog.text
