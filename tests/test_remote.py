"""The remote tier (memosfs/remote.py) against a real Redis Cluster on
loopback ports (memosfs/localcluster.py), then through mounts.

Skips when redis-server or redis-py are not installed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from memosfs.testing.localcluster import LocalCluster, redis_server_missing

REASON = redis_server_missing()
try:
    import redis  # noqa: F401
except ImportError:
    REASON = REASON or "redis-py is not installed (pip install 'redis[hiredis]')"

pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

from memosfs.store import remote as rt  # noqa: E402
from memosfs.store.remote import RemoteTier, parse_url  # noqa: E402

MiB = 1 << 20


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(masters=3, replicas=0) as c:
        yield c


@pytest.fixture
def tiers(cluster):
    """tiers(n, url_suffix="", **kw) -> n started RemoteTiers, closed afterwards."""
    made: list[RemoteTier] = []

    def make(n: int = 1, suffix: str = "", **kw) -> list[RemoteTier]:
        out = []
        for _ in range(n):
            t = RemoteTier(cluster.url + suffix, **kw).start()
            assert t.wait_ready(10), "remote tier did not connect"
            made.append(t)
            out.append(t)
        return out

    yield make
    for t in made:
        t.close(drain_s=2)


def raw(cluster, key: str) -> "redis.Redis":
    """A plain client on the master that serves `key` (to damage it)."""
    import redis
    return redis.Redis(host="127.0.0.1", port=cluster.master_for(key))


def wait_for(pred, timeout: float = 5.0, step: float = 0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()


# ---------------------------------------------------------------- phase 1: the tier


def test_parse_url():
    c = parse_url("redis://127.0.0.1:7000,127.0.0.1:7001")
    assert c.nodes == [("127.0.0.1", 7000), ("127.0.0.1", 7001)] and not c.tls
    c = parse_url("rediss://alice:p%40ss@h1:7000,[::1]:7001,h3?timeout=0.3&chunk=1M"
                  "&ssl_cert_reqs=none")
    assert c.tls and c.username == "alice" and c.password == "p@ss"
    assert c.nodes == [("h1", 7000), ("::1", 7001), ("h3", 6379)]
    assert c.timeout == 0.3 and c.chunk_size == MiB and c.tls_options == {"ssl_cert_reqs": "none"}
    assert parse_url("redis://:secret@h:1").password == "secret"
    assert "secret" not in parse_url("redis://:secret@h:1").redacted()
    for bad in ("http://h:1", "redis://", "redis://h:99999", "redis://h:1/3",
                "redis://h:1?chunk=64M", "redis://h:1?nope=1", "redis://h:x"):
        with pytest.raises(ValueError):
            parse_url(bad)


def test_round_trip_inline_and_chunked(tiers):
    a, b = tiers(2)
    small, empty = b"hello", b""
    big = os.urandom(70 * MiB)                     # three chunks of at most 32 MiB
    assert a.put_sync(b"ag/s/small", small, 1, {"mode": 0o600}) is not None
    assert a.put_sync(b"ag/s/empty", empty, 1) is not None
    e = a.put_sync(b"ag/s/big", big, 3)
    assert e is not None and e.nchunks == 3 and e.chunk_size == rt.CHUNK_MAX
    got = b.get(b"ag/s/small")
    assert got is not None and got[1] == small and got[0].meta == {"mode": 0o600}
    assert got[0].origin == a.origin and got[0].version == 1
    assert b.get(b"ag/s/empty")[1] == b""
    entry, data = b.get(b"ag/s/big")
    assert data == big and entry.version == 3 and entry.size == len(big)
    st = b.stat(b"ag/s/big")
    assert st.ident() == entry.ident() and st.nchunks == 3
    assert set(b.names(b"ag/s")) >= {b"small", b"empty", b"big"}
    assert b.get(b"ag/s/absent") is None and b.stat(b"ag/s/absent") is None
    s = b.statistics()
    assert s["remote_hits"] == 3 and s["remote_misses"] == 1
    assert s["remote_bytes_in"] == len(big) + len(small)
    assert a.statistics()["remote_bytes_out"] == len(big) + len(small)


def test_many_small_chunks_pipelined(tiers):
    (a,) = tiers(1, "?chunk=4K")
    for size in (4096, 4097, 3 * 4096, MiB + 5):
        data = os.urandom(size)
        e = a.put_sync(b"ag/c/x%d" % size, data, 1)
        assert e.nchunks == -(-size // 4096) or (size <= 4096 and e.nchunks == 0)
        assert a.get(b"ag/c/x%d" % size)[1] == data


def test_payload_objects_with_read(tiers):
    """put_sync takes anything with .size and .read(off, n) (a Ref, an SSDReader)."""
    (a,) = tiers(1, "?chunk=64K")

    class Src:
        def __init__(self, data):
            self.data, self.size = data, len(data)

        def read(self, off, n):
            return self.data[off:off + n]

    data = os.urandom(300_000)
    assert a.put_sync(b"ag/o/x", Src(data), 7) is not None
    assert a.get(b"ag/o/x")[1] == data


def test_rewrite_replaces_whole_version_and_drops_old_chunks(cluster, tiers):
    (a,) = tiers(1, "?chunk=4K")
    key = b"ag/r/x"
    v1, v2 = os.urandom(40_000), os.urandom(20_000)
    e1 = a.put_sync(key, v1, 1)
    e2 = a.put_sync(key, v2, 2)
    assert a.get(key)[1] == v2
    r = raw(cluster, rt.manifest_key(key))
    left = {k.decode() for k in r.scan_iter(match=rt.manifest_key(key)[:-1] + "c:*")}
    assert left == {rt.chunk_key(key, e2.tag, i) for i in range(e2.nchunks)}
    assert all(r.ttl(k) == -1 for k in left)          # adopted chunks do not expire
    assert e1.tag != e2.tag


def test_corrupt_chunk_is_not_served(cluster, tiers):
    (a,) = tiers(1, "?chunk=4K")
    key = b"ag/bad/x"
    data = os.urandom(20_000)
    e = a.put_sync(key, data, 1)
    r = raw(cluster, rt.manifest_key(key))
    ck = rt.chunk_key(key, e.tag, 2)
    r.setrange(ck, 100, b"\xff" if r.getrange(ck, 100, 100) != b"\xff" else b"\x00")
    before = a.statistics()
    assert a.get(key) is None
    after = a.statistics()
    assert after["remote_corrupt"] == before["remote_corrupt"] + 1
    assert after["remote_misses"] == before["remote_misses"] + 1
    # a chunk of the wrong length too
    r.set(ck, b"short")
    assert a.get(key) is None


def test_corrupt_inline_payload_and_manifest(cluster, tiers):
    (a,) = tiers(1)
    key = b"ag/bad/inline"
    e = a.put_sync(key, b"x" * 1000, 1)
    r = raw(cluster, rt.manifest_key(key))
    r.setrange(rt.manifest_key(key), e.header_bytes + 10, b"y")     # the payload
    assert a.get(key) is None
    r.setrange(rt.manifest_key(key), rt.FIXED.size + 3, b"Z")       # the JSON header
    assert a.get(key) is None and a.stat(key) is None
    r.set(rt.manifest_key(key), b"garbage")
    assert a.get(key) is None
    assert a.statistics()["remote_corrupt"] >= 3


def test_missing_chunk_is_a_miss(cluster, tiers):
    (a,) = tiers(1, "?chunk=4K")
    key = b"ag/partial/x"
    e = a.put_sync(key, os.urandom(20_000), 1)
    raw(cluster, rt.manifest_key(key)).delete(rt.chunk_key(key, e.tag, 3))
    assert a.get(key) is None
    assert a.statistics()["remote_partial"] == 1


def test_stale_version_is_not_served(tiers):
    a, b = tiers(2)
    key = b"ag/stale/x"
    a.put_sync(key, b"v3", 3, announce=False)
    # b was told of version 5 (say the master holding it failed over and lost it)
    b._note(key, rt.RemoteVersion("someone", 5, 2, 0), announced=True)
    assert b.get(key) is None and b.statistics()["remote_stale"] == 1
    assert a.get(key)[1] == b"v3"


def test_delete_leaves_a_tombstone(tiers):
    a, b = tiers(2)
    key = b"ag/del/x"
    a.put_sync(key, b"data", 1)
    assert b.get(key) is not None
    assert a.delete_sync(key)
    assert b.get(key) is None and b.stat(key) is None
    assert b"x" not in (b.names(b"ag/del") or [])
    assert wait_for(lambda: b.known(key) is not None and b.known(key).deleted)


def test_write_behind_queue(tiers):
    (a,) = tiers(1, "?queue=2")
    gate = threading.Event()

    def slow():
        gate.wait(10)
        return b"first", 1, {}, None

    a.put_async(b"ag/q/0", slow)
    assert wait_for(lambda: a.pending(b"ag/q/0") == "inflight")
    for i in (1, 2, 3):
        a.put_async(b"ag/q/%d" % i, lambda i=i: (b"v%d" % i, 1, {}, None))
    assert a.statistics()["remote_queue_dropped"] == 1          # q/3: queue full
    assert a.pending(b"ag/q/3") == "queued"                     # ... a deletion instead
    assert not a.wait(b"ag/q/1", timeout=0.2)                   # not yet: writer busy
    gate.set()
    assert a.wait_all(10)
    assert a.get(b"ag/q/0")[1] == b"first"
    assert a.get(b"ag/q/1")[1] == b"v1" and a.get(b"ag/q/2")[1] == b"v2"
    assert a.get(b"ag/q/3") is None
    # a source that has nothing to upload any more deletes the remote copy
    a.put_async(b"ag/q/1", lambda: None)
    assert a.wait(b"ag/q/1", timeout=5) and a.get(b"ag/q/1") is None
    # released after the upload
    released = []
    a.put_async(b"ag/q/4", lambda: (b"x", 1, {}, lambda: released.append(1)))
    assert a.wait(b"ag/q/4", timeout=5) and released == [1]


def test_invalidations_between_two_mounts(tiers):
    a, b = tiers(2)
    seen_a, seen_b = [], []
    a.on_invalidate = lambda k, o, v: seen_a.append((k, o, v))
    b.on_invalidate = lambda k, o, v: seen_b.append((k, o, v))
    a.put_sync(b"ag/inv/x", b"one", 4)
    assert wait_for(lambda: seen_b)
    key, origin, v = seen_b[0]
    assert key == b"ag/inv/x" and origin == a.origin
    assert (v.version, v.size, v.deleted) == (4, 3, False)
    a.delete_sync(b"ag/inv/x")
    assert wait_for(lambda: len(seen_b) == 2) and seen_b[1][2].deleted
    time.sleep(0.2)
    assert seen_a == []                          # nobody hears its own announcements
    assert b.statistics()["remote_invalidations"] == 2


def test_strong_mode_waits_for_acknowledgements(tiers):
    a, b = tiers(2, "?ack_timeout=0.5")
    a.strong = True
    acked = []
    b.on_invalidate = lambda k, o, v: acked.append(k)
    # b is a live peer once its heartbeat is in
    assert wait_for(lambda: b.origin in a._live_peers(), timeout=5)
    assert a.put_sync(b"ag/strong/x", b"v1", 1) is not None
    assert acked == [b"ag/strong/x"]             # handled before the writer went on
    assert a.statistics()["remote_acks"] == 1
    # a peer that cannot apply an invalidation does not acknowledge: the writer
    # times out (cleanly) and says so
    b.on_invalidate = lambda k, o, v: 1 / 0
    t0 = time.monotonic()
    assert a.put_sync(b"ag/strong/x", b"v2", 2) is not None
    assert 0.4 < time.monotonic() - t0 < 3
    assert a.statistics()["remote_ack_timeouts"] == 1


def test_reconnect_callback(cluster, tiers):
    (a,) = tiers(1)
    calls = []
    a.on_reconnect = lambda: calls.append(time.monotonic())
    assert wait_for(a._inbox.empty)             # the first connection's call is done
    time.sleep(0.3)
    calls.clear()
    host, port = a.sub_node
    n0 = a.statistics()["remote_reconnects"]
    # cut the subscription (as a restarted node or a network blip would)
    import redis
    redis.Redis(host=host, port=port).client_kill_filter(_type="pubsub")
    assert wait_for(lambda: a.statistics()["remote_reconnects"] == n0 + 1, timeout=10)
    assert wait_for(lambda: calls, timeout=5)
    assert a.subscribed.is_set() or wait_for(a.subscribed.is_set, timeout=5)


def test_never_connected_is_a_miss():
    t = RemoteTier("redis://127.0.0.1:1?timeout=0.2&connect_timeout=0.2").start()
    try:
        t0 = time.monotonic()
        assert t.get(b"a/b/c") is None and t.stat(b"a/b/c") is None
        assert t.put_sync(b"a/b/c", b"x", 1) is None and not t.delete_sync(b"a/b/c")
        t.put_async(b"a/b/c", lambda: (b"x", 1, {}, None))
        assert t.wait(b"a/b/c", timeout=5) is False
        assert time.monotonic() - t0 < 5
        assert t.statistics()["remote_connected"] == 0
    finally:
        t.close(drain_s=1)


@pytest.mark.cluster
@pytest.mark.slow
def test_killed_and_paused_master(tmp_path):
    """A dead master's keys are misses within the timeout, then at once; the
    others still work; nothing raises; a paused (SIGSTOP) one costs at most
    about one timeout per back-off period."""
    with LocalCluster(masters=3, replicas=0, node_timeout_ms=1000) as c:
        t = RemoteTier(c.url + "?timeout=0.5&connect_timeout=0.3").start()
        try:
            assert t.wait_ready(10)
            keys = [b"ag/f/%d" % i for i in range(30)]
            for k in keys:
                assert t.put_sync(k, k * 100, 1) is not None
            victim = c.master_for(rt.manifest_key(keys[0]))
            on_victim = [k for k in keys if c.master_for(rt.manifest_key(k)) == victim]
            others = [k for k in keys if k not in on_victim]
            c.kill(victim)
            for k in on_victim:
                t0 = time.monotonic()
                assert t.get(k) is None
                assert time.monotonic() - t0 < 1.5
            assert t.put_sync(on_victim[0], b"new", 2) is None
            for k in others:
                assert t.get(k)[1] == k * 100
            assert t.statistics()["remote_errors"] >= 1
            # pause another master: reads of its keys give up after ~timeout
            paused = c.master_for(rt.manifest_key(others[0]))
            c.pause(paused)
            try:
                slow = [k for k in others if c.master_for(rt.manifest_key(k)) == paused]
                t0 = time.monotonic()
                for k in slow:
                    assert t.get(k) is None
                assert time.monotonic() - t0 < 1.0 + 0.6 * len(slow)
            finally:
                c.resume(paused)
            assert wait_for(lambda: t.get(slow[0]) is not None, timeout=10)
        finally:
            t.close(drain_s=1)


@pytest.mark.cluster
@pytest.mark.slow
def test_failover_with_replicas():
    """With a replica per master: a killed master's keys are misses until its
    replica takes over, then hits again (what had reached the replica)."""
    with LocalCluster(masters=3, replicas=1, node_timeout_ms=1000) as c:
        t = RemoteTier(c.all_url + "?timeout=0.5&connect_timeout=0.3",
                       durable=True).start()
        try:
            assert t.wait_ready(10)
            key = b"ag/fo/x"
            data = os.urandom(100_000)
            assert t.put_sync(key, data, 1) is not None
            victim = c.master_for(rt.manifest_key(key))
            c.cli(victim, "wait", "1", "1000")
            c.kill(victim)
            t0 = time.monotonic()
            assert t.get(key) is None
            assert time.monotonic() - t0 < 1.5
            got = wait_for(lambda: t.get(key), timeout=60, step=0.2)   # (failover under load)
            assert got is not None and got[1] == data
        finally:
            t.close(drain_s=1)


# ---------------------------------------------------------------- phase 2: through mounts

from conftest import FUSE_REASON  # noqa: E402

try:
    from memosfs.fuse.operations import MemosOperations
    FS_REASON = None if hasattr(MemosOperations, "_remote_name") else \
        "fs.py does not look names up on the remote tier yet (MemosOperations._remote_name)"
except Exception as e:                    # pragma: no cover
    FS_REASON = f"memosfs.fuse.operations does not import: {e}"

mounted = pytest.mark.skipif(FUSE_REASON is not None or FS_REASON is not None,
                             reason=FUSE_REASON or FS_REASON or "")


def mount_pair(make_mount, url: str, **opts):
    """Two mounts (separate SSD directories) on one cluster, with a session
    directory `ag/s` made on both (directories are per mount)."""
    m0 = make_mount(capacity="256M", remote=url, remote_durable=1, **opts)
    m1 = make_mount(capacity="256M", remote=url, remote_durable=1, **opts)
    for m in (m0, m1):
        m.p("ag", "s").mkdir(parents=True)
    return m0, m1


def write_synced(path: Path, data: bytes) -> None:
    """Write and fsync: with remote_durable=1 the upload is done on return."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view[:1 << 20]):]
        os.fsync(fd)
    finally:
        os.close(fd)


def read_or_none(path: Path):
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


@mounted
def test_mounts_share_slots(cluster, make_mount):
    m0, m1 = mount_pair(make_mount, cluster.url)
    small, big = os.urandom(300_000), os.urandom(40 * MiB + 123)
    write_synced(m0.p("ag", "s", "small"), small)
    write_synced(m0.p("ag", "s", "big"), big)
    assert os.getxattr(m1.p("ag", "s", "big"), "user.memos.tier") == b"remote"
    assert os.stat(m1.p("ag", "s", "big")).st_size == len(big)
    assert m1.p("ag", "s", "big").read_bytes() == big
    assert m1.p("ag", "s", "small").read_bytes() == small
    assert os.getxattr(m1.p("ag", "s", "big"), "user.memos.tier") == b"mem"
    s1 = m1.stats()
    assert s1["remote_hits"] == 2 and s1["remote_bytes_in"] == len(big) + len(small)
    assert m0.stats()["remote_bytes_out"] >= len(big) + len(small)
    assert read_or_none(m1.p("ag", "s", "nothing")) is None


@mounted
def test_rewrite_and_unlink_reach_the_other_mount(cluster, make_mount):
    m0, m1 = mount_pair(make_mount, cluster.url)
    p0, p1 = m0.p("ag", "s", "x"), m1.p("ag", "s", "x")
    write_synced(p0, b"version one" * 1000)
    assert p1.read_bytes() == b"version one" * 1000          # now held by m1 too
    write_synced(p0, b"version two, longer" * 2000)
    got = wait_for(lambda: read_or_none(p1) == b"version two, longer" * 2000, timeout=10)
    assert got, f"m1 still reads {read_or_none(p1)[:20]!r}"
    s1 = m1.stats()
    assert s1["remote_invalidations"] >= 1 and s1["remote_drops"] >= 1
    # and the writer side: m1 rewrites, m0 follows
    write_synced(p1, b"three")
    assert wait_for(lambda: read_or_none(p0) == b"three", timeout=10)
    # a removal is not brought back from the remote tier, here or there
    os.unlink(p0)
    assert wait_for(lambda: read_or_none(p1) is None, timeout=10)
    time.sleep(0.3)
    assert read_or_none(p0) is None and read_or_none(p1) is None


@mounted
def test_rename_and_reset_reach_the_other_mount(cluster, make_mount):
    m0, m1 = mount_pair(make_mount, cluster.url)
    write_synced(m0.p("ag", "s", "a"), b"A" * 5000)
    write_synced(m0.p("ag", "s", "b"), b"B" * 5000)
    assert m1.p("ag", "s", "a").read_bytes() == b"A" * 5000        # m1 holds a
    os.rename(m0.p("ag", "s", "a"), m0.p("ag", "s", "moved"))
    assert wait_for(lambda: read_or_none(m1.p("ag", "s", "moved")) == b"A" * 5000)
    assert wait_for(lambda: read_or_none(m1.p("ag", "s", "a")) is None)
    m0.ctl("reset_context").write_text("ag/s")
    for n in ("moved", "b"):
        assert wait_for(lambda: read_or_none(m1.p("ag", "s", n)) is None), n
        assert read_or_none(m0.p("ag", "s", n)) is None


@mounted
def test_corrupt_chunk_not_served_through_the_mount(cluster, make_mount):
    m0, m1 = mount_pair(make_mount, cluster.url + "?chunk=64K")
    data = os.urandom(1 * MiB)
    write_synced(m0.p("ag", "s", "c"), data)
    key = b"ag/s/c"
    entry = RemoteTier(cluster.url, subscribe=False).start()
    try:
        assert entry.wait_ready(5)
        e = entry.stat(key)
    finally:
        entry.close(drain_s=1)
    assert e is not None and e.nchunks == 16
    r = raw(cluster, rt.manifest_key(key))
    r.setrange(rt.chunk_key(key, e.tag, 5), 1000, b"!corrupt!")
    with pytest.raises(FileNotFoundError):
        m1.p("ag", "s", "c").read_bytes()
    assert m1.stats()["remote_corrupt"] >= 1
    assert m0.p("ag", "s", "c").read_bytes() == data          # the writer's own copy


@mounted
@pytest.mark.cluster
@pytest.mark.slow
def test_killed_master_mid_run_no_hang_no_wrong_bytes(make_mount):
    """Two mounts on a 3+3 cluster; a master is killed while the second
    mount reads: every read ends quickly with the right bytes or ENOENT
    (a miss), never other bytes; after the failover the reads hit again."""
    import concurrent.futures as cf

    with LocalCluster(masters=3, replicas=1, node_timeout_ms=1000) as c:
        url = c.all_url + "?timeout=0.5&connect_timeout=0.3"
        m0, m1 = mount_pair(make_mount, url)
        want = {}
        for i in range(12):
            want[f"k{i}"] = os.urandom(200_000 + i)
            write_synced(m0.p("ag", "s", f"k{i}"), want[f"k{i}"])
        for port in c.masters_now():
            c.cli(port, "wait", "1", "2000")          # replicas have it all
        victim = c.master_for(rt.manifest_key(b"ag/s/k0"))
        pool = cf.ThreadPoolExecutor(4)
        try:
            c.kill(victim)
            outcomes = []
            t_end = time.monotonic() + 5
            while time.monotonic() < t_end:
                # the victim's keys are misses (ENOENT) until its replica takes
                # over; the others are remote hits, then local ones
                futs = {pool.submit(read_or_none, m1.p("ag", "s", n)): n for n in want}
                for f, n in futs.items():
                    got = f.result(timeout=5)         # no request may hang
                    assert got is None or got == want[n], f"wrong bytes for {n}"
                    outcomes.append(got is not None)
                time.sleep(0.2)
            # writes during and after the outage never hang either
            f = pool.submit(write_synced, m0.p("ag", "s", "during"), b"d" * 1000)
            try:
                f.result(timeout=10)
            except OSError:
                pass                                  # EIO: a durable upload failed
            assert any(outcomes)
            # after the failover every key is served again
            def all_back():
                return all(read_or_none(m1.p("ag", "s", n)) == want[n] for n in want)
            assert wait_for(all_back, timeout=20, step=0.3)
        finally:
            pool.shutdown(wait=False)
