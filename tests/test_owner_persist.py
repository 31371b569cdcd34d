"""A slot's owner survives a clean unmount (issue 38, item 1).

fsstress chowns files at random; after a clean unmount and a remount, a few
of them came back with another owner (often 0:0).  Two paths lost the
change: (1) a chown of a slot the memory tier did not hold, when memory could
not take it back (the promotion the chown asked for was served from the SSD
file instead, and nothing was marked to be written), and (2) a chown that
landed while a write-back of the slot was running: the write-back had read
the old owner, then marked the slot clean, so the new owner was never
written.  The tests below take each path on purpose, on the handlers and on
a real mount.
"""

from __future__ import annotations

import os

import pyfuse3

from conftest import CTX, MiB, Handlers
from memosfs.fuse.operations import MemosOperations
from memosfs.store.ssd import SSDTier
from memosfs.store.store import Store
from memosfs.testing import faults


def _chown(fs: Handlers, path: str, uid: int, gid: int) -> None:
    attr = pyfuse3.EntryAttributes()
    attr.st_uid, attr.st_gid = uid, gid
    fields = type("Fields", (), {f: False for f in (
        "update_mode", "update_atime", "update_mtime", "update_size")})()
    fields.update_uid = fields.update_gid = True
    fs.call("setattr", fs.lookup(path), attr, fields, None, CTX)


def _pin(fs: Handlers, path: str) -> None:
    fs.call("setxattr", fs.lookup(path), b"user.memos.pin", b"1", CTX)


def _reopen(ssd) -> tuple[Store, MemosOperations]:
    store = Store(16 * MiB, ssd=SSDTier(str(ssd)))
    ops = MemosOperations(store)
    ops.restore()
    return store, ops


def test_chown_of_a_slot_memory_cannot_take_back_is_kept(tmp_path):
    ssd = tmp_path / "ssd"
    fs = Handlers(capacity=4 * MiB, ssd=ssd)
    fs.mkdirs("a/s")
    fs.write("a/s/cold", b"c" * (3 * MiB))
    fs.store.flush()                              # on the SSD tier, clean
    fs.write("a/s/hot", b"h" * (3 * MiB))         # takes its place in memory
    _pin(fs, "a/s/hot")                           # and keeps it: no room for cold
    assert fs.store.tier_of(b"a/s/cold") == "ssd"
    _chown(fs, "a/s/cold", 4242, 4343)
    assert (fs.ops.slot_at("a/s/cold").uid, fs.ops.slot_at("a/s/cold").gid) == (4242, 4343)
    fs.close()                                    # a clean unmount
    store, ops = _reopen(ssd)
    try:
        cold = ops.slot_at("a/s/cold")
        assert (cold.uid, cold.gid) == (4242, 4343)
        assert (ops.slot_at("a/s/hot").uid, ops.slot_at("a/s/hot").gid) == (0, 0)
        ops.check()
    finally:
        store.close()


def test_chown_during_a_write_back_is_written_again(tmp_path):
    ssd = tmp_path / "ssd"
    fs = Handlers(capacity=16 * MiB, ssd=ssd)
    fs.mkdirs("a/s")
    fs.write("a/s/x", b"x" * 100_000)
    meta_of = fs.store.meta_of
    raced = []

    def meta_then_chown(key: bytes) -> dict:
        meta = meta_of(key)                       # what the write-back writes ...
        if key == b"a/s/x" and not raced:
            raced.append(key)
            _chown(fs, "a/s/x", 5151, 5252)       # ... and a chown right after
        return meta

    fs.store.meta_of = meta_then_chown
    fs.store.flush()
    assert raced
    ref = fs.store.peek(b"a/s/x")
    try:
        assert ref.dirty, "the chown after the write-back read the metadata was dropped"
    finally:
        ref.release()
    fs.store.meta_of = meta_of
    fs.close()
    store, ops = _reopen(ssd)
    try:
        x = ops.slot_at("a/s/x")
        assert (x.uid, x.gid) == (5151, 5252)
        ops.check()
    finally:
        store.close()


def test_rewrite_meta_keeps_the_payload_and_its_holes(tmp_path):
    from memosfs import _native
    tier = SSDTier(str(tmp_path / "ssd"))
    cache = _native.Cache(16 * MiB, 16)
    d = cache.draft()
    d.write(0, b"head")
    d.write(3 * MiB, b"tail")
    ref = cache.publish(d, b"a/s/x", dirty=True, version=7)
    try:
        entry = tier.put(ref, {"uid": 1, "gid": 1, "mode": 0o600}, durable=True)
    finally:
        ref.release()
    new = tier.rewrite_meta(b"a/s/x", {"uid": 9, "gid": 8, "mode": 0o600})
    assert (new.version, new.size, new.crc) == (entry.version, entry.size, entry.crc)
    assert tier.rewrite_meta(b"a/s/none", {"uid": 9}) is None
    found = {e.key: e for e in SSDTier(str(tmp_path / "ssd")).scan()}
    assert found[b"a/s/x"].meta == {"uid": 9, "gid": 8, "mode": 0o600}
    with open(new.path, "rb") as f:
        data = f.read(new.size)
    assert data[:4] == b"head" and data[3 * MiB:3 * MiB + 4] == b"tail"
    assert data[4:3 * MiB] == bytes(3 * MiB - 4)
    st = os.stat(new.path)
    assert st.st_blocks * 512 < st.st_size        # the hole stayed a hole
    tier.check()
    cache.close()


def test_chown_of_an_evicted_slot_survives_a_remount(make_mount):
    m = make_mount(capacity="8M")
    ssd = str(m.ssd)
    sess = m.path / "a" / "s"
    sess.mkdir(parents=True)
    (sess / "cold").write_bytes(b"c" * (5 * MiB))
    with open(m.path / ".memos" / "cache" / "flush", "w") as f:
        f.write("1")
    (sess / "hot").write_bytes(b"h" * (5 * MiB))
    os.setxattr(sess / "hot", "user.memos.pin", b"1")
    assert os.getxattr(sess / "cold", "user.memos.tier") == b"ssd"
    os.chown(sess / "cold", 4242, 4343)
    os.chmod(sess / "cold", 0o640)
    m.stop()
    m2 = make_mount(capacity="8M", ssd=ssd)
    st = os.stat(m2.path / "a" / "s" / "cold")
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777, st.st_size) == \
        (4242, 4343, 0o640, 5 * MiB)
    assert (m2.path / "a" / "s" / "cold").read_bytes() == b"c" * (5 * MiB)


def test_fsync_after_a_chown_makes_the_owner_durable(make_mount):
    """The owner of a slot memory does not hold, then of one it holds, is
    durable once the slot is fsync'd: it comes back after kill -9."""
    m = make_mount(capacity="8M", writeback_delay_ms=3_600_000)
    ssd = str(m.ssd)
    sess = m.path / "a" / "s"
    sess.mkdir(parents=True)
    (sess / "cold").write_bytes(b"c" * (5 * MiB))
    with open(m.path / ".memos" / "cache" / "flush", "w") as f:
        f.write("1")
    (sess / "hot").write_bytes(b"h" * (5 * MiB))
    os.setxattr(sess / "hot", "user.memos.pin", b"1")
    (sess / "warm").write_bytes(b"w" * 1000)
    assert os.getxattr(sess / "cold", "user.memos.tier") == b"ssd"
    assert os.getxattr(sess / "warm", "user.memos.tier") == b"mem"
    for name, uid in (("cold", 4242), ("warm", 4343)):
        os.chown(sess / name, uid, uid + 1)
        fd = os.open(sess / name, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    faults.kill9(m)                               # (True: it had to abort the connection)
    m2 = make_mount(capacity="8M", ssd=ssd)
    for name, uid in (("cold", 4242), ("warm", 4343)):
        st = os.stat(m2.path / "a" / "s" / name)
        assert (st.st_uid, st.st_gid) == (uid, uid + 1), name
    assert (m2.path / "a" / "s" / "cold").read_bytes() == b"c" * (5 * MiB)


def test_chown_of_an_inode_that_gave_its_name_away_reaches_the_slot(tmp_path):
    """A writer's O_TRUNC open while page-cache readers hold the slot gives
    the name a fresh inode (ESTALE: the kernel looks the name up again); a
    chown that reached the old inode meanwhile (fsstress's lchown racing its
    own writers) changes the slot: what stat shows and what a remount
    brings back."""
    import errno as errno_
    ssd = tmp_path / "ssd"
    fs = Handlers(ssd=ssd)
    fs.mkdirs("a/s")
    fs.write("a/s/x", b"v1")
    old_ino = fs.lookup("a/s/x")
    reader = fs.open_read("a/s/x")
    assert fs.err("open", old_ino, os.O_WRONLY | os.O_TRUNC, CTX) == errno_.ESTALE
    assert fs.lookup("a/s/x") != old_ino              # the name has a new inode
    attr = pyfuse3.EntryAttributes()
    attr.st_uid, attr.st_gid, attr.st_mode = 6161, 6262, 0o640
    fields = type("Fields", (), {f: False for f in (
        "update_atime", "update_mtime", "update_size")})()
    fields.update_uid = fields.update_gid = fields.update_mode = True
    fs.call("setattr", old_ino, attr, fields, None, CTX)
    st = fs.call("getattr", fs.lookup("a/s/x"), CTX)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (6161, 6262, 0o640)
    fs.call("release", reader.fh)
    fs.close()
    store, ops = _reopen(ssd)
    try:
        x = ops.slot_at("a/s/x")
        assert (x.uid, x.gid, x.mode & 0o7777) == (6161, 6262, 0o640)
    finally:
        store.close()
