"""Prefetched slots are not evicted before they are read (bounded): the C
core's guard (memos_mark_prefetched, native/cache.c) and the mount's
prefetch_wasted.

On main before the guard, the mounted scenario below (8 MiB of memory, 512
KiB turns, sequential prefetch 4 ahead, lru_lfu) wasted 6 of 31 prefetches
with evict_batch 16 or 64 and 5 of 29 with evict_batch 1: the unread
prefetches sat at the old end of probation and went first."""

from __future__ import annotations

import time

import pytest

from memosfs import _native

KiB = 1 << 10
MiB = 1 << 20
SLOT = 256 * KiB


# ---------------------------------------------------------------- the C core


def _put(c, key: bytes, n: int = SLOT) -> None:
    d = c.draft()
    d.write(0, b"x" * n)
    c.publish(d, key).release()


def _prefetch(c, key: bytes) -> bool:
    d = c.draft()
    d.write(0, b"p" * SLOT)
    ref = c.publish(d, key, dirty=False)
    try:
        return c.mark_prefetched(ref)
    finally:
        ref.release()


def _cache(evict_batch: int = 1):
    evicted: list[bytes] = []

    def on_evict(ref):
        evicted.append(ref.key)
        return True

    c = _native.Cache(4 * MiB, evict_batch, on_evict=on_evict)     # 16 slots of 256 KiB
    c.set_policy("lru_lfu")
    return c, evicted


def test_guarded_prefetches_outlive_other_victims_until_read():
    """Unguarded, the prefetches would be the oldest of probation: the first
    victims."""
    c, evicted = _cache()
    for i in range(4):
        assert _prefetch(c, f"a/s/pf{i}".encode())
    for i in range(12):
        _put(c, f"a/s/old{i}".encode())
    assert c.stats()["prefetch_guarded"] == 4
    for i in range(6):                                   # room for new slots: 6 evictions
        _put(c, f"a/s/new{i}".encode())
    c.check()
    assert evicted == [f"a/s/old{i}".encode() for i in range(6)]
    # a read ends the guard: that prefetch is an ordinary slot again
    c.get(b"a/s/pf0").release()
    assert c.stats()["prefetch_guarded"] == 3
    c.check()
    c.close()


def test_unguarded_prefetches_are_the_first_victims():
    """The same without mark_prefetched (main's behaviour): the prefetches go."""
    c, evicted = _cache()
    for i in range(4):
        d = c.draft()
        d.write(0, b"p" * SLOT)
        c.publish(d, f"a/s/pf{i}".encode(), dirty=False).release()
    for i in range(12):
        _put(c, f"a/s/old{i}".encode())
    for i in range(6):
        _put(c, f"a/s/new{i}".encode())
    assert evicted[:4] == [f"a/s/pf{i}".encode() for i in range(4)]
    c.close()


def test_the_guard_ages_out_and_is_bounded():
    c, evicted = _cache()
    for i in range(8):
        _put(c, f"a/s/old{i}".encode())
    for i in range(8):
        assert _prefetch(c, f"a/s/pf{i}".encode())      # half the memory: the bound
    assert c.stats()["prefetch_guarded"] == 8
    for i in range(40):                                  # much more than memory holds
        _put(c, f"a/s/new{i}".encode())
    c.check()
    st = c.stats()
    assert st["prefetch_guarded"] == 0                   # aged out, all of them
    assert st["prefetch_aged"] == 8
    assert sorted(k for k in evicted if k.startswith(b"a/s/pf")) == \
        [f"a/s/pf{i}".encode() for i in range(8)]
    # never more than half the memory guarded at once
    marked = [_prefetch(c, f"a/s/more{i}".encode()) for i in range(16)]
    assert c.stats()["prefetch_guarded"] == sum(marked) == 8
    assert marked[:8] == [True] * 8 and not any(marked[8:])
    c.check()
    c.close()


def test_only_guarded_slots_left_still_make_room():
    c, evicted = _cache()
    pins = []
    for i in range(8):
        _put(c, f"a/s/pinned{i}".encode())
        pins.append(c.get(f"a/s/pinned{i}".encode()))      # held: never a victim
    for i in range(8):
        assert _prefetch(c, f"a/s/pf{i}".encode())
    _put(c, b"a/s/next")                                 # must not fail for the guards
    c.check()
    assert evicted and all(k.startswith(b"a/s/pf") for k in evicted)
    assert c.stats()["prefetch_opened"] >= 1
    for r in pins:
        r.release()
    c.close()


# ---------------------------------------------------------------- mounted


def _tier(path) -> str:
    import os
    return os.getxattr(path, "user.memos.tier").decode()


@pytest.mark.parametrize("evict_batch", [1, 16])
def test_mount_sequential_prefetches_are_not_wasted(make_mount, evict_batch):
    """Memory holds ~14 of 40 turns; reading 24 turns in order with 4
    prefetched ahead wastes none of them (main: 5 to 6 wasted)."""
    m = make_mount(capacity="8M", writeback_delay_ms=0, warmup_ratio=0,
                   evict_batch=evict_batch, evict_policy="lru_lfu",
                   prefetch_mode="sequential", prefetch_stride=4)
    size = 512 << 10
    s = m.p("bot", "chat")
    s.mkdir(parents=True)
    for i in range(40):
        (s / f"turn-{i:04d}").write_bytes(bytes([i]) * size)
    (m.path / ".memos" / "cache" / "flush").write_text("1\n")
    for i in range(24):
        assert (s / f"turn-{i:04d}").read_bytes() == bytes([i]) * size
        deadline = time.monotonic() + 5
        nxt = s / f"turn-{i + 1:04d}"
        while _tier(nxt) != "mem" and time.monotonic() < deadline:
            time.sleep(0.02)
        while m.stats()["prefetch_queue"] and time.monotonic() < deadline:
            time.sleep(0.02)
    st = m.stats()
    assert st["prefetch_issued"] >= 24
    assert st["prefetch_used"] >= 22
    assert st["prefetch_wasted"] == 0
    assert st["prefetch_guarded"] <= 4                   # the ones not read yet
