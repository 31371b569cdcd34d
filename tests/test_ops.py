"""The Operations object without a mount: handlers called directly."""

from __future__ import annotations

import errno
import os

import pyfuse3
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from conftest import CTX, Handlers

MiB = 1 << 20


@pytest.fixture
def fs(make_handlers):
    return make_handlers()


def test_write_read_and_stats(fs):
    fs.mkdirs("a/s")
    fs.write("a/s/x", b"hello")
    assert fs.read("a/s/x") == b"hello"
    st = fs.ops.stats()
    assert st["inserts"] == 1 and st["hits"] == 1 and st["slots"] == 1
    assert st["bytes_used"] == 5


def test_wrong_places(fs):
    fs.mkdirs("a/s")
    root = pyfuse3.ROOT_INODE
    agent = fs.lookup("a")
    sess = fs.lookup("a/s")
    assert fs.errno_of(fs.call, "create", root, b"f", 0o644, os.O_WRONLY, CTX) == errno.EPERM
    assert fs.errno_of(fs.call, "create", agent, b"f", 0o644, os.O_WRONLY, CTX) == errno.EPERM
    # directories at any depth below a session hold slots too (engines keep
    # one per request or prefix hash)
    d = fs.call("mkdir", sess, b"d", 0o755, CTX).st_ino
    e = fs.call("mkdir", d, b"e", 0o755, CTX).st_ino
    fi, _ = fs.call("create", e, b"slot", 0o644, os.O_WRONLY, CTX)
    fs.call("release", fi.fh)
    assert fs.read("a/s/d/e/slot") == b""
    assert fs.errno_of(fs.call, "mkdir", sess, b"x" * 256, 0o755, CTX) == errno.ENAMETOOLONG
    assert fs.errno_of(fs.call, "lookup", sess, b"x" * 256, CTX) == errno.ENAMETOOLONG
    ctl = fs.lookup(".memos")
    assert fs.errno_of(fs.call, "mkdir", ctl, b"d", 0o755, CTX) == errno.EPERM
    assert fs.errno_of(fs.call, "rmdir", root, b".memos", CTX) == errno.EPERM


def test_snapshot_and_supersede(fs):
    fs.mkdirs("a/s")
    fs.write("a/s/x", b"old" * 1000)
    ino_before = fs.lookup("a/s/x")
    fi = fs.open_read("a/s/x")
    fs.write("a/s/x", b"new")
    assert fs.call("read", fi.fh, 0, 10) == b"oldoldoldo"
    ino_after = fs.lookup("a/s/x")
    assert ino_after != ino_before            # the reader kept the old inode
    # (the writer was sent to a fresh inode at its open: ESTALE, then a new lookup)
    # the old inode, opened through a stale dentry, asks the kernel to look again
    # an open of the old inode through a stale dentry reads the current version,
    # around that inode's page cache (which belongs to its snapshot readers)
    stale = fs.call("open", ino_before, os.O_RDONLY, CTX)
    assert stale.direct_io and fs.call("read", stale.fh, 0, 10) == b"new"
    fs.call("release", stale.fh)
    fs.call("release", fi.fh)
    assert fs.read("a/s/x") == b"new"
    # with no reader open, a publish keeps the inode
    fs.write("a/s/x", b"newer")
    assert fs.lookup("a/s/x") == ino_after


def _size_only():
    """setattr's fields for a truncate."""
    fields = type("Fields", (), {f: False for f in (
        "update_mode", "update_uid", "update_gid", "update_atime", "update_mtime")})()
    fields.update_size = True
    return fields


def test_keep_cache_only_for_the_cached_version(fs):
    """Readers keep the inode's pages only when they are the version's: the
    writers' pages are, when every write went through them into the version
    they published; a version made any other way drops them."""
    fs.mkdirs("a/s")
    fs.write("a/s/x", b"v1")
    fi1 = fs.open_read("a/s/x")
    assert fi1.keep_cache                     # the writer's pages hold v1
    fs.call("release", fi1.fh)
    fi2 = fs.open_read("a/s/x")
    assert fi2.keep_cache                     # same version: pages are valid
    fs.call("release", fi2.fh)
    fs.write("a/s/x", b"v2")
    fi3 = fs.open_read("a/s/x")
    assert fi3.keep_cache                     # the writers' pages are v2's
    fs.call("release", fi3.fh)
    # a write refused on the way: the kernel's pages are not the version's
    ino = fs.lookup("a/s/x")
    fw = fs.call("open", ino, os.O_WRONLY | os.O_TRUNC, CTX)
    assert fs.errno_of(fs.call, "write", fw.fh, 0, b"z" * (64 << 20)) == errno.EFBIG
    fs.call("write", fw.fh, 0, b"v3")
    assert fs.errno_of(fs.call, "flush", fw.fh) == errno.EFBIG   # (the bytes refused:
    cut = pyfuse3.EntryAttributes()                              # not published...)
    cut.st_size = 2
    fs.call("setattr", ino, cut, _size_only(), fw.fh, CTX)      # (... until cut off)
    fs.call("flush", fw.fh)
    fs.call("release", fw.fh)
    fi = fs.open_read("a/s/x")
    assert not fi.keep_cache and fs.call("read", fi.fh, 0, 10) == b"v3"
    fs.call("release", fi.fh)
    attr = pyfuse3.EntryAttributes()
    attr.st_size = 1
    fields = type("Fields", (), {f: False for f in (
        "update_mode", "update_uid", "update_gid", "update_atime", "update_mtime")})()
    fields.update_size = True
    fs.call("setattr", fs.lookup("a/s/x"), attr, fields, None, CTX)   # truncate(2)
    fi4 = fs.open_read("a/s/x")
    assert not fi4.keep_cache                 # a version made elsewhere: drop stale pages
    assert fs.call("read", fi4.fh, 0, 10) == b"v"
    fs.call("release", fi4.fh)


def test_writer_sees_its_draft_and_others_do_not(fs):
    fs.mkdirs("a/s")
    fs.write("a/s/x", b"base")
    ino = fs.lookup("a/s/x")
    w = fs.call("open", ino, os.O_RDWR, CTX)
    assert not w.direct_io and not w.keep_cache     # the page cache is the writers'
    fs.call("write", w.fh, 4, b"+more")
    assert fs.call("read", w.fh, 0, 100) == b"base+more"
    assert fs.read("a/s/x") == b"base"
    fs.call("flush", w.fh)
    assert fs.read("a/s/x") == b"base+more"
    fs.call("release", w.fh)


def test_writes_to_unlinked_slot_vanish(fs):
    fs.mkdirs("a/s")
    fs.write("a/s/x", b"base")
    ino = fs.lookup("a/s/x")
    w = fs.call("open", ino, os.O_WRONLY | os.O_TRUNC, CTX)
    fs.call("unlink", fs.lookup("a/s"), b"x", CTX)
    fs.call("write", w.fh, 0, b"late")
    fs.call("release", w.fh)
    assert fs.listdir("a/s") == []
    assert fs.ops.stats()["slots"] == 0


def test_eviction_removes_names_and_keeps_writer_data():
    f = Handlers(capacity=4 * MiB, evict_batch=1)
    f.mkdirs("a/s")
    for i in range(3):
        f.write(f"a/s/{i}", bytes([i]) * MiB)
    ino = f.lookup("a/s/0")
    w = f.call("open", ino, os.O_WRONLY | os.O_TRUNC, CTX)   # base of 0 is not pinned
    for i in range(3, 5):
        f.write(f"a/s/{i}", bytes([i]) * MiB)               # evicts 0 and 1
    assert "0" not in f.listdir("a/s")
    f.call("write", w.fh, 0, b"rewritten")
    f.call("release", w.fh)
    assert f.read("a/s/0") == b"rewritten"
    f.ops.check()
    f.store.close()


def test_knob_table_drives_files(fs):
    cache = fs.lookup(".memos/cache")
    names = set(fs.ops.inodes[cache].children)
    assert {"stats", "stats.json", "capacity", "evict_policy", "evict_batch",
            "ring_slots", "flush", "reset_context"} <= names

    def write_knob(name, text):
        fi = fs.call("open", fs.lookup(f".memos/cache/{name}"), os.O_WRONLY | os.O_TRUNC, CTX)
        try:
            fs.call("write", fi.fh, 0, text)
        finally:
            fs.call("release", fi.fh)

    write_knob("evict_batch", b"24\n")
    assert fs.store.cache.evict_batch == 24
    assert fs.errno_of(write_knob, "evict_batch", b"banana\n") == errno.EINVAL
    assert fs.store.cache.evict_batch == 24
    assert fs.errno_of(write_knob, "capacity", b"12X\n") == errno.EINVAL
    assert fs.errno_of(write_knob, "reset_context", b"nosuch\n") == errno.EINVAL
    assert fs.read(".memos/cache/evict_batch") == b"24\n"


# ---------------------------------------------------------------- a model of the tree

NAMES = st.sampled_from(["a", "b", "c"])
DATA = st.binary(min_size=0, max_size=70000)


class TreeMachine(RuleBasedStateMachine):
    """Random operations on the Operations object against a dict model."""

    def __init__(self):
        super().__init__()
        self.fs = Handlers(capacity=64 * MiB)
        self.model: dict[str, dict[str, dict[str, bytes]]] = {}

    def teardown(self):
        self.fs.store.close()

    @rule(agent=NAMES, sess=NAMES)
    def mkdir(self, agent, sess):
        self.fs.mkdirs(f"{agent}/{sess}")
        self.model.setdefault(agent, {}).setdefault(sess, {})

    @precondition(lambda self: any(self.model.values()))
    @rule(data=st.data(), name=NAMES, payload=DATA)
    def write(self, data, name, payload):
        agent = data.draw(st.sampled_from(sorted(a for a in self.model if self.model[a])))
        sess = data.draw(st.sampled_from(sorted(self.model[agent])))
        self.fs.write(f"{agent}/{sess}/{name}", payload)
        self.model[agent][sess][name] = payload

    @precondition(lambda self: any(s for a in self.model.values() for s in a.values()))
    @rule(data=st.data())
    def unlink(self, data):
        agent, sess, name = data.draw(st.sampled_from(sorted(
            (a, s, n) for a, ss in self.model.items() for s, ns in ss.items() for n in ns)))
        self.fs.call("unlink", self.fs.lookup(f"{agent}/{sess}"), name.encode(), CTX)
        del self.model[agent][sess][name]

    @precondition(lambda self: any(s for a in self.model.values() for s in a.values()))
    @rule(data=st.data(), new=NAMES)
    def rename_slot(self, data, new):
        agent, sess, name = data.draw(st.sampled_from(sorted(
            (a, s, n) for a, ss in self.model.items() for s, ns in ss.items() for n in ns)))
        a2, s2 = data.draw(st.sampled_from(sorted(
            (a, s) for a, ss in self.model.items() for s in ss)))
        self.fs.call("rename", self.fs.lookup(f"{agent}/{sess}"), name.encode(),
                     self.fs.lookup(f"{a2}/{s2}"), new.encode(), 0, CTX)
        payload = self.model[agent][sess].pop(name)
        self.model[a2][s2][new] = payload

    @precondition(lambda self: len(self.model) > 0)
    @rule(data=st.data(), new=NAMES)
    def rename_session(self, data, new):
        agent = data.draw(st.sampled_from(sorted(a for a in self.model if self.model[a])))
        sess = data.draw(st.sampled_from(sorted(self.model[agent])))
        a2 = data.draw(st.sampled_from(sorted(self.model)))
        if (a2, new) == (agent, sess):
            return
        target = self.model[a2].get(new)
        err = self.fs.errno_of(self.fs.call, "rename", self.fs.lookup(agent), sess.encode(),
                               self.fs.lookup(a2), new.encode(), 0, CTX)
        if target:
            assert err == errno.ENOTEMPTY
            return
        assert err == 0
        self.model[a2][new] = self.model[agent].pop(sess)

    @invariant()
    def agrees(self):
        self.fs.ops.check()
        for agent, sessions in self.model.items():
            for sess, slots in sessions.items():
                assert self.fs.listdir(f"{agent}/{sess}") == sorted(slots)
                for name, payload in slots.items():
                    assert self.fs.read(f"{agent}/{sess}/{name}") == payload


TestTree = TreeMachine.TestCase
TestTree.settings = settings(max_examples=40, stateful_step_count=25, deadline=None)


def test_a_failing_handler_answers_eio_and_the_daemon_goes_on(fs, monkeypatch, caplog):
    fs.mkdirs("a/s")
    fs.write("a/s/x", b"data")

    def broken(key):
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(fs.store, "get", broken)
    assert fs.errno_of(fs.open_read, "a/s/x") == errno.EIO
    assert "simulated bug" in caplog.text
    monkeypatch.undo()
    assert fs.read("a/s/x") == b"data"
    assert fs.ops.stats()["requests_refused"] == 1
