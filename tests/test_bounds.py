"""Tables that grow with keys, inodes or threads keep nothing of what is gone
(the bounds listed in docs/memory-bounds.md; tests/test_soak.py watches the
whole daemon for a long time, these check each fixed leak in seconds)."""

from __future__ import annotations

import os
import time

import trio

from memosfs.fuse.coherence import Coherence
from memosfs.store.kvfile import QuantizedVersions
from memosfs.store.store import Store
from memosfs.trace import Trace

MiB = 1 << 20


def _put(store: Store, key: bytes, data: bytes) -> None:
    d = store.draft()
    d.write(0, data)
    store.publish(d, key).release()


def test_store_forgets_the_directories_of_removed_keys(tmp_path):
    """Keys in directories made and removed one after another (new names each
    time): once their keys are gone, the store's rings (_order), recency and
    dirty tables hold nothing of them; a rename out of a directory likewise."""
    store = Store(16 * MiB, 16, 0)
    try:
        _put(store, b"a/s/keep", b"k" * 100)
        for i in range(50):
            keys = [b"a/s/t%d/u/x%d" % (i, j) for j in range(3)]
            for k in keys:
                _put(store, k, b"x" * 1000)
            store.rename(keys[0], b"a/s/t%d/v/y" % i)
            for k in keys[1:] + [b"a/s/t%d/v/y" % i]:
                assert store.remove(k)
        assert set(store._order) == {b"a/s"}, sorted(store._order)[:5]
        assert list(store._recency) == [b"a/s/keep"]
        assert set(store._dirty_since) <= {b"a/s/keep"}
        # a removed key touched afterwards (a reader's get racing the unlink)
        # does not come back into the recency order
        store._touch(b"a/s/t0/u/x0")
        assert list(store._recency) == [b"a/s/keep"]
    finally:
        store.close()


def test_decoded_versions_of_a_removed_slot_go():
    q = QuantizedVersions(lambda: None)
    q.remember((b"a/s/k", 1), b"x" * 10)
    q.remember((b"a/s/k", 2), b"y" * 10)
    q.remember((b"a/s/other", 1), b"z" * 10)
    q.forget(b"a/s/k")
    assert list(q._decoded) == [(b"a/s/other", 1)]


def test_trace_ring_is_bounded_in_bytes_too():
    t = Trace(maxlen=1000, maxbytes=64 * 1024)
    t.set(True)
    for i in range(500):
        t.emit("PUBLISH", key="a/s/" + "n" * 1000 + str(i))
    text = t.text()
    assert len(text) <= 64 * 1024
    assert text.endswith("n499\n")                  # the newest are kept
    for i in range(2000):
        t.emit("X", i=i)
    assert len(t.text().splitlines()) == 1000


def test_superseded_inodes_leave_the_inode_table(make_mount):
    """A whole-slot rewrite while a reader has the slot open gives the name a
    fresh inode; the old one goes from the daemon's inode table once its
    reader closes and the kernel forgets it (statvfs: f_files - f_ffree is
    the table's size).  Before, every such rewrite left one inode behind."""
    m = make_mount(capacity="64M")
    d = m.p("a", "s")
    d.mkdir(parents=True)
    (d / "k").write_bytes(b"x" * 10000)

    def used() -> int:
        st = os.statvfs(m.path)
        return st.f_files - st.f_ffree

    start = used()
    for i in range(100):
        with open(d / "k", "rb") as r:
            with open(d / "k", "wb") as w:
                w.write(b"%d" % i * 1000)
            assert r.read(1) == b"x" or i > 0
    deadline = time.monotonic() + 10
    while used() > start + 5 and time.monotonic() < deadline:
        with open("/proc/sys/vm/drop_caches", "w") as f:    # kernel forgets
            f.write("2\n")
        time.sleep(0.2)
    assert used() <= start + 5, f"{used() - start} inodes left behind by 100 rewrites"
    assert (d / "k").read_bytes() == b"99" * 1000


def test_coherence_waits_leave_no_event_or_interrupt_behind():
    """A wait that times out on a key that never changes (removed, say)
    leaves no event in _changed; an interrupt that raced a wake-up leaves no
    thread id in _interrupted."""
    from memosfs.fuse.coherence import _Deadline
    coh = Coherence.__new__(Coherence)
    coh._changed, coh._waiting, coh._interrupted, coh._interrupts = {}, {}, set(), 0

    async def main():
        dl = _Deadline(50, pid=4242)
        assert await coh._wait(b"a/s/gone", dl) is False
        assert coh._changed == {} and coh._waiting == {}
        # woken and interrupted at once: the wake wins, nothing stays
        dl = _Deadline(5000, pid=4242)
        async with trio.open_nursery() as n:
            async def waiter():
                assert await coh._wait(b"a/s/k", dl) is True
            n.start_soon(waiter)
            await trio.sleep(0.01)
            coh._changed[b"a/s/k"].set()
            coh.interrupt(4242)
        assert coh._interrupted == set() and coh._waiting == {}

    trio.run(main)


def test_prefetch_forgets_a_directory_once_emptied():
    """Scratch directories (made, read, emptied, never used again) leave the
    prefetcher's session and heat tables when their last slot goes, not when
    SESSIONS_MAX newer ones push them out."""
    from memosfs.store.prefetch import PrefetchEngine
    names: dict = {}
    eng = PrefetchEngine(lambda k: False, lambda k: False,
                         lambda a, s: list(names.get((a, s), ())),
                         {"prefetch_stride": 2}, background=False)
    try:
        eng.set_mode("hybrid")
        for i in range(200):
            sess = f"s/t{i}/u"
            names[("a", sess)] = ["x0", "x1", "x2"]
            for n in ("x0", "x1", "x2"):
                eng.on_access(f"a/{sess}/{n}".encode(), False)
            eng.run_pending()
            del names[("a", sess)]
            for n in ("x0", "x1", "x2"):
                eng.on_remove(f"a/{sess}/{n}".encode())
            eng.run_pending()
        assert len(eng._sessions) == 0, list(eng._sessions)[:5]
        assert len(eng._heat_keys) == 0
    finally:
        eng.close()
