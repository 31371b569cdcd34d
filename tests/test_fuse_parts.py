"""The parts MemosOperations is made of, without a mount: the one
translation between a slot and its tier metadata, the knob table of the
control plane, the `.federated` routing table, the store's quantized storage."""

from __future__ import annotations

import errno
import os

import pyfuse3
import pytest

from memosfs.fuse import fedtree, routing
from memosfs.fuse.control import KNOB_APPLY
from memosfs.fuse.slots import SlotTable
from memosfs.fuse.nodes import AGENT, ROOT, SESSION, SUBDIR, Dir, Slot
from memosfs.fuse.operations import MemosOperations
from memosfs.knobs import KNOB_BY_NAME, KnobError
from memosfs.store.ssd import SSDTier
from memosfs.store.store import Store

MiB = 1 << 20


class Ctx:
    def __init__(self, uid=0, gid=0):
        self.uid, self.gid, self.pid, self.umask = uid, gid, os.getpid(), 0o022


def call(ops, name, *args):
    coro = getattr(ops, name)(*args)
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise AssertionError(f"handler {name} suspended")


def errno_of(ops, name, *args):
    try:
        call(ops, name, *args)
    except pyfuse3.FUSEError as e:
        return e.errno
    return 0


def session_dir():
    root = Dir(1, "", None, 0o755, 0, 0, ROOT)
    agent = Dir(2, "a", root, 0o755, 7, 8, AGENT)
    return Dir(3, "s", agent, 0o750, 7, 8, SESSION)


def _table():
    inodes: dict = {}
    return SlotTable(100, inodes, lambda ino, like: None, lambda node, held: None)


def _restored(table, sess, name, meta, version, stored, size, uid=0, gid=0):
    def make(ino):
        node = Slot(table, ino, name, sess, int(meta.get("mode", 0o644)) & 0o7777,
                    int(meta.get("uid", uid)), int(meta.get("gid", gid)))
        node.apply_meta(meta)
        return node
    return table.restore(sess, name, version, int(meta.get("logical_size", size)), stored,
                         make)


def test_slot_meta_round_trip():
    sess = session_dir()
    t = _table()
    s = _restored(t, sess, "x", {"mode": 0o640, "uid": 1001, "gid": 1002,
                                 "logical_size": 5000}, 4, 8192, 5000)
    s.mtime_ns, s.atime_ns = 111, 222
    s.xattrs = {b"user.tag": b"\x00\xffv"}
    back = _restored(_table(), sess, "x", s.meta(), version=4, stored=8192, size=3000)
    assert (back.mode, back.uid, back.gid) == (s.mode, 1001, 1002)
    assert (back.version, back.stored, back.pub_size) == (4, 8192, 5000)
    assert (back.mtime_ns, back.ctime_ns, back.atime_ns) == (111, 111, 222)
    assert back.xattrs == s.xattrs and back.key == b"a/s/x"


def test_slot_from_sparse_or_damaged_meta():
    sess = session_dir()
    s = _restored(_table(), sess, "y", {"xattrs": {"zz": "not hex"}}, version=2,
                  stored=4096, size=100, uid=7, gid=8)
    assert (s.mode & 0o7777, s.uid, s.gid) == (0o644, 7, 8)
    assert s.pub_size == 100 and s.xattrs == {}
    assert s.atime_ns == s.mtime_ns


def test_restore_rebuilds_slots_and_directories(tmp_path):
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path / "ssd")))
    ops = MemosOperations(store)
    root = pyfuse3.ROOT_INODE
    a = call(ops, "mkdir", root, b"a", 0o755, Ctx(1001, 1001)).st_ino
    s = call(ops, "mkdir", a, b"s", 0o700, Ctx(1001, 1001)).st_ino
    fi, _ = call(ops, "create", s, b"x", 0o600, os.O_WRONLY, Ctx(1001, 1001))
    call(ops, "write", fi.fh, 0, b"payload")
    call(ops, "flush", fi.fh)
    call(ops, "release", fi.fh)
    call(ops, "setxattr", ops.slot_at("a/s/x").ino, b"user.k", b"v", Ctx(1001, 1001))
    store.close()
    store2 = Store(16 * MiB, ssd=SSDTier(str(tmp_path / "ssd")))
    ops2 = MemosOperations(store2)
    assert ops2.restore() == 1
    x = ops2.slot_at("a/s/x")
    assert (x.uid, x.mode & 0o7777, x.pub_size) == (1001, 0o600, len(b"payload"))
    assert x.xattrs == {b"user.k": b"v"}
    assert ops2.find_session("a", "s").mode & 0o7777 == 0o700
    ops2.check()
    store2.close()


def test_every_knob_write_goes_through_the_table():
    assert set(KNOB_APPLY) <= set(KNOB_BY_NAME)
    ops = MemosOperations(Store(16 * MiB))
    ops.set_knob("evict_batch", "7")
    assert ops.stats()["evict_batch"] == 7 and ops.knobs["evict_batch"] == 7
    before = dict(ops.knobs)
    with pytest.raises(KnobError, match=r"^no SSD tier is mounted$"):
        ops.set_knob("ssd_capacity", "1G")
    assert ops.knobs == before


def test_federated_routes_name_real_handlers(tmp_path):
    for name in routing.FED_ROUTES:
        assert callable(getattr(fedtree.FedTree, name)), name
        assert name in vars(pyfuse3.Operations), name
    ops = MemosOperations(Store(16 * MiB, ssd=SSDTier(str(tmp_path / "ssd"))))
    if ops.fed.jobs is None:
        pytest.skip(".federated is not served here (memosfs.federated does not import)")
    ctx = Ctx()
    fed = call(ops, "lookup", pyfuse3.ROOT_INODE, b".federated", ctx).st_ino
    a = call(ops, "mkdir", pyfuse3.ROOT_INODE, b"a", 0o755, ctx).st_ino
    # a rename across the two trees is refused by the federated one
    assert errno_of(ops, "rename", a, b"x", fed, b"y", 0, ctx) == errno.EXDEV
    assert call(ops, "fsyncdir", fed, 0) is None


def test_the_store_quantizes_and_decodes():
    np = pytest.importorskip("numpy")
    store = Store(16 * MiB)
    from memosfs.store import kvfile
    header = b'{"k.key":{"dtype":"F32","shape":[64,64],"data_offsets":[0,16384]}}'
    header += b" " * (-len(header) % 8)
    data = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32).tobytes()
    blob = len(header).to_bytes(8, "little") + header + data
    d = store.draft()
    d.write(0, blob)
    q, logical = store.quantize(d, "int8", "auto")
    assert logical is not None and len(logical) == len(blob) and q.size < len(blob)
    ref = store.publish(q, b"a/s/k")
    assert kvfile.is_container(ref.read(0, 16))
    assert store.logical(ref) == logical
    stats = store.read_statistics()
    assert stats["quant_tensors"] == 1 and stats["quant_saved_bytes"] == len(blob) - ref.size
    ref.release()
    plain = store.draft()
    plain.write(0, b"not a tensor file at all")
    same, none = store.quantize(plain, "int8", "auto")
    assert same is plain and none is None
    plain.free()
    store.close()



def test_a_retried_writer_with_a_draft_of_its_own_sees_its_size(make_handlers):
    """A retried whole-slot writer that got a draft of its own
    (`_open_private`) stats the inode the kernel opened: it sees its own
    draft's size, the other writers theirs, everyone else the published one
    (the soak caught it seeing another writer's 3 MiB)."""
    from conftest import Ctx
    h = make_handlers()
    h.mkdirs("a/s")
    h.write("a/s/x", b"p" * 100)                       # published: 100 bytes
    ops = h.ops
    node = ops.slot_at("a/s/x")
    other, mine, third = Ctx(), Ctx(), Ctx()
    other.pid, mine.pid, third.pid = 1 << 22, (1 << 22) + 1, (1 << 22) + 2   # no such pids
    # another writer's draft on the inode: 3000 bytes
    fi_other = h.call("open", node.ino, os.O_WRONLY | os.O_TRUNC, other)
    h.call("write", fi_other.fh, 0, b"o" * 3000)
    # a retried writer's draft of its own: 7 bytes
    fi_mine = ops._open_private(node, os.O_WRONLY | os.O_TRUNC, mine)
    h.call("write", fi_mine.fh, 0, b"m" * 7)
    assert h.call("getattr", node.ino, mine).st_size == 7
    assert h.call("getattr", node.ino, other).st_size == 3000
    assert h.call("getattr", node.ino, third).st_size == 100
    assert h.call("getattr", node.ino, third).attr_timeout == 0
    h.call("release", fi_mine.fh)                       # publishes its 7 bytes
    assert not node.privates
    h.call("release", fi_other.fh)                      # the last publish wins
    assert h.call("getattr", node.ino, third).st_size == 3000


def test_a_directory_counts_its_subdirectories_for_nlink():
    """nlink = 2 + subdirectories, kept as entries come and go (replaced,
    deleted, popped), never by walking the entries."""
    s = session_dir()
    assert s.nlink() == 2
    d1 = Dir(10, "d1", s, 0o755, 0, 0, SUBDIR)
    s.children["d1"] = d1
    s.children["f"] = Slot(_table(), 11, "f", s, 0o644, 0, 0)
    s.children["d2"] = Dir(12, "d2", s, 0o755, 0, 0, SUBDIR)
    assert s.nlink() == 4
    s.children["d2"]= Slot(_table(), 13, "d2", s, 0o644, 0, 0)     # a rename over it
    assert s.nlink() == 3
    s.children["f"] = Dir(14, "f", s, 0o755, 0, 0, SUBDIR)
    assert s.nlink() == 4
    del s.children["d1"]
    assert s.children.pop("f").ino == 14
    assert s.children.pop("absent", None) is None
    assert s.nlink() == 2 + sum(isinstance(c, Dir) for c in s.children.values()) == 2
    with pytest.raises(TypeError):
        s.children.update({"x": d1})


def test_tgid_of_a_thread_is_its_process():
    """A request's thread id maps to its process, asked again (the cached
    answer) too; an id /proc does not know is itself."""
    import threading

    from memosfs.fuse.core import tgid_of
    seen = []
    t = threading.Thread(target=lambda: seen.extend(
        [threading.get_native_id(), tgid_of(threading.get_native_id()),
         tgid_of(threading.get_native_id())]))
    t.start()
    t.join()
    assert seen[0] != os.getpid() and seen[1:] == [os.getpid(), os.getpid()]
    assert tgid_of(os.getpid()) == os.getpid()
    with open("/proc/sys/kernel/pid_max") as f:
        unused = int(f.read()) + 7          # above pid_max: never a live id
    assert tgid_of(unused) == unused


def test_a_writer_on_an_inode_whose_name_moved_on_and_went_sees_its_size(make_handlers):
    """The kernel opens an inode whose name has since moved to a newer inode
    that was then unlinked (an open racing an unlink): the writer's bytes go
    with the name, and its fstat (a getattr of the inode it opened) shows
    what it wrote, not the old version's size (the stress test caught a
    117-byte answer after 1.5 MB were written)."""
    from conftest import Ctx
    h = make_handlers()
    parent = h.mkdirs("a/s")
    h.write("a/s/x", b"p" * 117)
    ops = h.ops
    old = ops.slot_at("a/s/x")
    reader = h.open_read("a/s/x")           # keeps the old inode: the next publish moves on
    h.write("a/s/x", b"q" * 300)
    new = ops.slot_at("a/s/x")
    assert new is not old and old.successor is new
    h.call("release", reader.fh)
    h.call("unlink", parent, b"x", Ctx())   # the name goes while our open is on its way
    mine, other = Ctx(), Ctx()
    mine.pid, other.pid = 1 << 22, (1 << 22) + 1     # no such pids
    fi = h.call("open", old.ino, os.O_WRONLY | os.O_TRUNC, mine)
    h.call("write", fi.fh, 0, b"m" * 5000)
    assert h.call("getattr", old.ino, mine).st_size == 5000
    # a second whole-slot writer of that inode gets a draft of its own
    fi2 = h.call("open", old.ino, os.O_WRONLY | os.O_TRUNC, other)
    h.call("write", fi2.fh, 0, b"o" * 64)
    assert h.call("getattr", old.ino, other).st_size == 64
    assert h.call("getattr", old.ino, mine).st_size == 5000
    h.call("write", fi.fh, 5000, b"m")
    for f in (fi2, fi):
        h.call("flush", f.fh)
        h.call("release", f.fh)
    assert h.err("lookup", parent, b"x", Ctx()) == errno.ENOENT   # nothing published


def test_a_slot_key_follows_every_move_above_it():
    """A slot's key is kept between moves; a move of the slot or of any
    directory above it gives the new key at once."""
    s = session_dir()
    d = Dir(20, "d", s, 0o755, 0, 0, SUBDIR)
    s.children["d"] = d
    x = Slot(_table(), 21, "x", d, 0o644, 0, 0)
    assert x.key == b"a/s/d/x" and x.key is x.key          # computed once, then kept
    d.move("e", s)                                         # a directory above it
    assert x.key == b"a/s/e/x"
    other = Dir(22, "t", s.parent, 0o755, 0, 0, SESSION)
    x.move("y", other)
    assert x.key == b"a/t/y"
    s.parent.move("b", s.parent.parent)                    # the agent
    assert x.key == b"b/t/y" and Slot(_table(), 23, "z", d, 0o644, 0, 0).key == b"b/s/e/z"


class _Token:
    """A trio token whose run_sync_soon queues the call (run by `run`)."""

    def __init__(self):
        self.queued = []

    def run_sync_soon(self, fn, *args):
        self.queued.append((fn, args))

    def run(self):
        while self.queued:
            fn, args = self.queued.pop(0)
            fn(*args)


def test_an_eviction_drop_spares_a_version_published_after_it(make_handlers):
    """Known race, closed: an eviction's drop of a name is decided before the
    C core frees the victim; a publish of the key landing in between left the
    new version without a name.  The drop now waits for the trio thread and
    takes the name only if no tier holds the key by then."""
    fs = make_handlers()
    fs.mkdirs("a/s")
    fs.write("a/s/k", b"one")
    fs.write("a/s/gone", b"two")
    token = fs.ops.trio_token = _Token()
    try:
        fs.store._dropped(b"a/s/k", "evicted")          # decided ...
        fs.store._dropped(b"a/s/gone", "evicted")
        fs.store.cache.remove(b"a/s/gone")              # (its victim is freed)
        assert fs.listdir("a/s") == ["gone", "k"]       # ... not applied yet
        token.run()
    finally:
        fs.ops.trio_token = None
    assert fs.listdir("a/s") == ["k"]                   # k's version is in memory
    assert fs.read("a/s/k") == b"one"


def test_the_tree_is_read_safely_from_the_store_threads(make_handlers):
    """The background writer reads slots' metadata and the directory records
    while the request loop changes them: no 'changed size during iteration'."""
    import sys
    import threading
    fs = make_handlers()
    fs.mkdirs("a/s")
    fs.write("a/s/k", b"x")
    node = fs.ops.slot_at("a/s/k")
    node.xattrs.update({b"user.base%d" % i: b"v" for i in range(300)})
    errors, stop = [], threading.Event()

    def reader():
        while not stop.is_set():
            try:
                fs.ops._slot_meta(b"a/s/k")
                fs.ops._namespace()
            except Exception as e:      # noqa: BLE001 (what the test looks for)
                errors.append(e)
                return

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    t = threading.Thread(target=reader)
    t.start()
    try:
        for i in range(100000):
            node.xattrs[b"user.k%d" % (i % 7)] = b"v"
            if i % 7 == 6:
                for j in range(7):
                    node.xattrs.pop(b"user.k%d" % j, None)
            if i % 5000 == 0:
                fs.mkdirs(f"a/d{i}")
            if errors:
                break
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert errors == []
