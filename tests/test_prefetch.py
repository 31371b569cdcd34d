"""The prefetch engine: the native stride detector and heat table through
their Python type, natural slot order, each mode's predictions, accuracy
accounting (used, wasted, late, dropped), the retrain trigger below the
threshold, the background worker never running a fetch on the caller's
thread, and the learned mode beating sequential on a fixed non-unit stride
(skipped without torch)."""

from __future__ import annotations

import errno
import os
import threading

import pytest

from memosfs import _native
from memosfs.store import prefetch_learned as learned
from memosfs.testing.prefetch_sim import SimTier, simulate, strided_requests
from memosfs.knobs import KNOB_BY_NAME, KnobError
from memosfs.store.prefetch import ModeUnavailable, PrefetchEngine, natural_key


# ---------------------------------------------------------------- native tables

def test_stride_detector_confirms_after_repeats():
    p = _native.Prefetcher(confirm=2)
    assert [p.stride_observe(1, i) for i in (0, 3, 6, 9)] == [0, 0, 3, 3]
    assert [p.stride_observe(2, i) for i in (20, 18, 16)] == [0, 0, -2]
    info = p.stride_info(1)
    assert info["stride"] == 3 and info["last_index"] == 9 and info["observations"] == 4
    assert p.stride_info(3) is None
    # confirm=3 needs one more equal delta
    q = _native.Prefetcher(confirm=3)
    assert [q.stride_observe(7, i) for i in (0, 5, 10, 15)] == [0, 0, 0, 5]
    # alternating deltas never confirm
    r = _native.Prefetcher(confirm=2)
    idx, out = 0, []
    for k in range(12):
        idx += 1 if k % 2 else 2
        out.append(r.stride_observe(1, idx))
    assert out == [0] * 12
    assert p.stride_forget(1) is True and p.stride_forget(1) is False
    p.check()


def test_heat_table_through_python():
    p = _native.Prefetcher(heat_capacity=3, halflife=1e12)
    assert p.heat_touch(10, 5.0) is None
    assert p.heat_touch(11, 1.0) is None
    assert p.heat_touch(12, 3.0) is None
    assert p.heat_touch(13, 2.0) == 11              # full: the coldest goes
    assert [i for i, _h in p.heat_top(5)] == [10, 12, 13]
    assert p.heat(10) == pytest.approx(5.0)
    assert p.heat(11) == 0.0
    picks = p.heat_sample(2, pool=2)
    assert sorted(picks) == [10, 12]                # the 2 hottest, distinct
    assert p.heat_remove(12) is True and p.heat_remove(12) is False
    assert [i for i, _h in p.heat_top(5)] == [10, 13]
    assert p.stats()["heat_evicted"] == 1
    # decay: a half-life of 4 touches
    d = _native.Prefetcher(halflife=4.0)
    d.heat_touch(1)
    for _ in range(4):
        d.heat_touch(2)
    assert d.heat(1) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        d.heat_touch(1, -1.0)
    with pytest.raises(ValueError):
        _native.Prefetcher(confirm=0)
    with pytest.raises(TypeError):
        d.heat_touch("x")
    assert _native.Prefetcher.key_id(b"a/b/c") == _native.Prefetcher.key_id(b"a/b/c")
    assert _native.Prefetcher.key_id(b"a/b/c") != _native.Prefetcher.key_id(b"a/b/d")
    d.check()


def test_natural_order():
    names = ["turn-10", "turn-2", "turn-0003", "turn-1", "block-12", "block-9", "10", "2", "x"]
    assert sorted(names, key=natural_key) == ["2", "10", "block-9", "block-12", "turn-1",
                                              "turn-2", "turn-0003", "turn-10", "x"]


def test_knobs_in_the_table():
    assert KNOB_BY_NAME["prefetch_mode"].parse("hybrid") == "hybrid"
    with pytest.raises(KnobError):
        KNOB_BY_NAME["prefetch_mode"].parse("psychic")
    assert KNOB_BY_NAME["prefetch_stride"].parse("3") == 3
    assert KNOB_BY_NAME["prefetch_retrain_below"].default == 0.70


# ---------------------------------------------------------------- the engine, synchronously

def _tier_with(capacity: int, sessions: dict[tuple[str, str], int]) -> SimTier:
    """Every slot written, then memory emptied: all of them on the SSD only."""
    tier = SimTier(capacity)
    for (a, s), n in sessions.items():
        for i in range(n):
            tier.write(f"{a}/{s}/turn-{i}".encode())
    tier.mem.clear()
    return tier


def _engine(tier: SimTier, mode: str, **kw) -> PrefetchEngine:
    knobs = {"prefetch_stride": kw.pop("stride", 2),
             "prefetch_retrain_below": kw.pop("retrain_below", 0.70)}
    eng = PrefetchEngine(tier.fetch, tier.in_memory, tier.session_slots, knobs,
                         background=False, **kw)
    eng.set_mode(mode)
    tier.engine = eng
    return eng


def _read(tier: SimTier, eng: PrefetchEngine, key: bytes, budget=None) -> str:
    where = tier.read(key)
    assert where is not None
    eng.on_access(key, where == "mem")
    eng.run_pending(budget)
    return where


def test_sequential_fetches_the_next_slots_and_counts_them_used():
    tier = _tier_with(100, {("a", "s"): 10})
    eng = _engine(tier, "sequential", stride=2)
    assert _read(tier, eng, b"a/s/turn-0") == "ssd"
    assert tier.in_memory(b"a/s/turn-1") and tier.in_memory(b"a/s/turn-2")
    assert not tier.in_memory(b"a/s/turn-3")
    st = eng.stats()
    assert st["prefetch_issued"] == 2 and st["prefetch_used"] == 0
    assert _read(tier, eng, b"a/s/turn-1") == "mem"     # the prefetch made it a hit
    assert _read(tier, eng, b"a/s/turn-2") == "mem"
    st = eng.stats()
    assert st["prefetch_used"] == 2 and st["prefetch_used_sequential"] == 2
    assert st["prefetch_issued"] == 4                   # turn-3, turn-4 on the way
    assert st["prefetch_accuracy"] == pytest.approx(0.5)
    # the end of the session: nothing past the last slot
    for i in range(3, 10):
        _read(tier, eng, f"a/s/turn-{i}".encode())
    st = eng.stats()
    assert st["prefetch_issued"] == 9 and st["prefetch_used"] == 9
    assert st["prefetch_accuracy"] == 1.0 and st["prefetch_failed"] == 0


def test_sequential_follows_a_detected_stride():
    tier = _tier_with(100, {("a", "s"): 30})
    eng = _engine(tier, "sequential", stride=2)
    for i in (0, 3, 6):
        _read(tier, eng, f"a/s/turn-{i}".encode())
    # confirmed stride 3 after 0, 3, 6: the next fetches are 9 and 12, not 7 and 8
    assert tier.in_memory(b"a/s/turn-9") and tier.in_memory(b"a/s/turn-12")
    assert not tier.in_memory(b"a/s/turn-8")
    assert _read(tier, eng, b"a/s/turn-9") == "mem"


def test_random_samples_hot_slots_not_in_memory():
    tier = _tier_with(4, {("kb", "docs"): 20})
    eng = _engine(tier, "random", stride=2)
    hot = [b"kb/docs/turn-5", b"kb/docs/turn-7"]
    for _ in range(5):
        for k in hot:
            _read(tier, eng, k)
    # push the hot ones out of memory with cold reads (no prefetch budget for them)
    for i in (11, 12, 13, 14):
        key = f"kb/docs/turn-{i}".encode()
        tier.read(key)
    assert not any(tier.in_memory(k) for k in hot)
    _read(tier, eng, b"kb/docs/turn-15")
    assert all(tier.in_memory(k) for k in hot)           # brought back by heat
    assert eng.stats()["prefetch_issued_random"] >= 2


def test_evicted_before_use_is_wasted_and_late_ones_are_dropped():
    tier = _tier_with(3, {("a", "s"): 10})
    eng = _engine(tier, "sequential", stride=2)
    _read(tier, eng, b"a/s/turn-0")                      # fetches turn-1, turn-2
    # reads elsewhere push the prefetched slots out before they are used
    tier2_keys = [b"a/s/turn-7", b"a/s/turn-8", b"a/s/turn-9"]
    for k in tier2_keys:
        tier.read(k)
    assert not tier.in_memory(b"a/s/turn-1")
    st = eng.stats()
    assert st["prefetch_wasted"] == 2 and st["prefetch_used"] == 0
    # demand first: a queued prefetch whose slot is read before it ran is dropped late
    tier3 = _tier_with(100, {("b", "s"): 10})
    eng3 = _engine(tier3, "sequential", stride=2)
    _read(tier3, eng3, b"b/s/turn-0", budget=0)          # queued: turn-1, turn-2
    _read(tier3, eng3, b"b/s/turn-1", budget=0)          # turn-1 read before its prefetch
    st3 = eng3.stats()
    assert st3["prefetch_dropped_late"] == 1 and st3["prefetch_dropped"] == 1
    eng3.run_pending(None)
    st3 = eng3.stats()
    assert st3["prefetch_issued"] == 2                   # turn-2 and turn-3, not turn-1


def test_full_queue_drops_the_oldest():
    tier = _tier_with(1000, {("a", f"s{i}"): 5 for i in range(10)})
    eng = _engine(tier, "sequential", stride=2, queue_max=4)
    for i in range(10):
        _read(tier, eng, f"a/s{i}/turn-0".encode(), budget=0)
    st = eng.stats()
    assert st["prefetch_queue"] == 4
    assert st["prefetch_dropped_full"] == 16 and st["prefetch_dropped"] == 16
    eng.run_pending(None)
    # the newest survive: sessions 8 and 9
    assert tier.in_memory(b"a/s9/turn-1") and tier.in_memory(b"a/s8/turn-2")
    assert not tier.in_memory(b"a/s0/turn-1")


def _mixed_workload(tier: SimTier, eng: PrefetchEngine, rounds: int) -> None:
    """Sessions read front to back for a while, then one slot each at random
    (sequential's predictions stop being used)."""
    import random
    rng = random.Random(1)
    for r in range(rounds):
        s = f"a/s{r % 20}"
        if r < rounds // 3:
            for i in range(8):
                _read(tier, eng, f"{s}/turn-{i}".encode(), budget=2)
        else:
            _read(tier, eng, f"{s}/turn-{rng.randrange(30)}".encode(), budget=2)


def test_hybrid_rechooses_when_accuracy_drops_below_threshold():
    sessions = {("a", f"s{i}"): 30 for i in range(20)}
    counts = {}
    for threshold in (0.70, 0.0):
        tier = _tier_with(40, sessions)
        eng = _engine(tier, "hybrid", stride=2, retrain_below=threshold, window=40,
                      window_min=20, horizon=64)
        _mixed_workload(tier, eng, 900)
        st = eng.stats()
        counts[threshold] = st["prefetch_retrains"]
        assert st["prefetch_retrains"] == st["prefetch_retrains_hybrid"]
        assert st["prefetch_issued_hybrid"] == st["prefetch_issued"] > 0
    assert counts[0.70] >= 1            # accuracy fell below 0.70: re-chose
    assert counts[0.0] == 0             # never below 0


def test_hybrid_follows_the_better_mode():
    """Knowledge retrieval: a few hot documents read among cold reads that push
    them out of a small memory.  The next slot in order is useless there; the
    heat table is not: hybrid moves to random, and beats sequential."""
    import random
    res = {}
    for mode in ("sequential", "hybrid"):
        tier = _tier_with(8, {("kb", "docs"): 60, **{("u", f"s{i}"): 60 for i in range(10)}})
        eng = _engine(tier, mode, stride=2, window=40, window_min=20, horizon=64)
        rng = random.Random(5)
        for _ in range(1500):
            if rng.random() < 0.5:
                key = f"kb/docs/turn-{rng.choice([5, 17, 33, 41])}"
            else:
                key = f"u/s{rng.randrange(10)}/turn-{rng.randrange(60)}"
            _read(tier, eng, key.encode(), budget=2)
        res[mode] = (eng.stats(), tier.c["mem_hits"])
    st, hits = res["hybrid"]
    assert st["prefetch_hybrid_random"] == 1 and st["prefetch_hybrid_switches"] >= 1
    assert st["prefetch_shadow_accuracy_random"] > st["prefetch_shadow_accuracy_sequential"]
    assert hits > res["sequential"][1]
    assert st["prefetch_accuracy"] > res["sequential"][0]["prefetch_accuracy"]
    # and on conversations (turn t re-reads turns 0..t-1) it stays sequential,
    # fetching exactly what sequential fetches
    res = {}
    for mode in ("sequential", "hybrid"):
        tier = _tier_with(30, {("a", f"s{i}"): 12 for i in range(8)})
        eng = _engine(tier, mode, stride=2)
        for turn in range(1, 12):
            for i in range(8):
                for j in range(turn):
                    _read(tier, eng, f"a/s{i}/turn-{j}".encode(), budget=1)
        res[mode] = eng.stats()
    assert res["hybrid"]["prefetch_hybrid_random"] == 0
    assert res["hybrid"]["prefetch_used"] == res["sequential"]["prefetch_used"] > 0
    assert res["hybrid"]["prefetch_issued"] == res["sequential"]["prefetch_issued"]


def test_accuracy_window_counts_unused_prefetches_as_misses():
    tier = _tier_with(1000, {("a", f"s{i}"): 10 for i in range(40)})
    eng = _engine(tier, "sequential", stride=2, window=10, window_min=5, horizon=8)
    # read only slot 0 of each session: every prefetch (1 and 2) goes unused
    for i in range(40):
        _read(tier, eng, f"a/s{i}/turn-0".encode())
    st = eng.stats()
    assert st["prefetch_issued"] == 80 and st["prefetch_used"] == 0
    assert st["prefetch_window_accuracy"] == 0.0
    assert st["prefetch_outstanding"] == 80     # still in memory: maybe used later


def test_modes_are_checked():
    tier = SimTier(10)
    eng = _engine(tier, "off")
    with pytest.raises(KnobError):
        eng.set_mode("psychic")
    old = learned._learned_ok, learned._learned_why
    learned._learned_ok, learned._learned_why = False, "ImportError: No module named 'torch'"
    try:
        with pytest.raises(ModeUnavailable, match="torch"):
            eng.set_mode("learned")
        assert eng.mode == "off"
        assert issubclass(ModeUnavailable, KnobError)
    finally:
        learned._learned_ok, learned._learned_why = old
    # off: nothing is recorded or fetched
    tier.write(b"a/s/turn-0")
    tier.write(b"a/s/turn-1")
    tier.mem.clear()
    _read(tier, eng, b"a/s/turn-0")
    assert eng.stats()["prefetch_issued"] == 0 and not tier.in_memory(b"a/s/turn-1")
    with pytest.raises(RuntimeError):
        PrefetchEngine(tier.fetch, tier.in_memory, tier.session_slots).run_pending()


# ---------------------------------------------------------------- the background worker

def test_background_worker_fetches_off_the_callers_thread():
    tier = _tier_with(100, {("a", "s"): 10})
    entered, release = threading.Event(), threading.Event()
    fetched: list[tuple[bytes, int]] = []
    lock = threading.Lock()

    def slow_fetch(key: bytes) -> bool:
        entered.set()
        release.wait(timeout=60)        # a slow SSD: blocks until the test lets it go
        with lock:
            fetched.append((key, threading.get_ident()))
            return tier.fetch(key)

    knobs = {"prefetch_mode": "sequential", "prefetch_stride": 2}
    eng = PrefetchEngine(slow_fetch, tier.in_memory, tier.session_slots, knobs)
    tier.engine = eng
    try:
        eng.on_access(b"a/s/turn-0", tier.read(b"a/s/turn-0") == "mem")
        assert entered.wait(timeout=60)             # the worker is inside a fetch
        # demand reads go on while the prefetcher is stuck in that fetch
        for i in range(5, 10):
            key = f"a/s/turn-{i}".encode()
            eng.on_access(key, tier.read(key) == "mem")
        assert fetched == []
        release.set()
        for _ in range(6000):                       # until the worker is idle
            st = eng.stats()
            if st["prefetch_queue"] == 0 and st["prefetch_issued"] >= 2:
                break
            threading.Event().wait(0.01)
        assert st["prefetch_issued"] >= 2
        assert tier.in_memory(b"a/s/turn-1") and tier.in_memory(b"a/s/turn-2")
        with lock:
            assert fetched and all(tid != threading.get_ident() for _k, tid in fetched)
    finally:
        release.set()
        eng.close()


# ---------------------------------------------------------------- learned

def test_learned_beats_sequential_on_a_fixed_non_unit_stride():
    pytest.importorskip("torch")
    pytest.importorskip("numpy")
    reqs = strided_requests(seed=3, sessions=120, slots=30, stride=3, reads=5)
    cap = 150
    seq = simulate(reqs, "sequential", cap, stride=2, seed=0)
    lrn = simulate(reqs, "learned", cap, stride=2, seed=0)
    off = simulate(reqs, "off", cap, stride=2)
    assert lrn["learned_steps"] > 0
    assert lrn["accuracy"] > seq["accuracy"] + 0.15
    assert lrn["prefetch_used"] > seq["prefetch_used"]
    assert lrn["mem_hit_ratio"] > seq["mem_hit_ratio"] > off["mem_hit_ratio"]


def test_learned_retrains_when_the_pattern_changes():
    pytest.importorskip("torch")
    pytest.importorskip("numpy")
    counts = {}
    for threshold in (0.70, 0.0):
        tier = _tier_with(60, {("a", f"s{i}"): 40 for i in range(30)})
        eng = _engine(tier, "learned", stride=1, retrain_below=threshold, window=30,
                      window_min=15, horizon=32, seed=0)
        # stride 3 everywhere, then stride 2 backwards from the end: the model's
        # +3 predictions stop being used until it retrains
        for r in range(60):
            s = f"a/s{r % 30}"
            for i in range(0, 30, 3):
                _read(tier, eng, f"{s}/turn-{i}".encode(), budget=1)
        before = eng.stats()["prefetch_retrains"]
        for r in range(60):
            s = f"a/s{r % 30}"
            for i in range(39, 9, -2):
                _read(tier, eng, f"{s}/turn-{i}".encode(), budget=1)
        st = eng.stats()
        counts[threshold] = (before, st["prefetch_retrains"])
        assert st["prefetch_retrains"] == st["prefetch_retrains_learned"]
        assert st["prefetch_learned_steps"] > 0
    assert counts[0.70][1] > counts[0.70][0]    # retrained after the change
    assert counts[0.0][1] == 0


# ---------------------------------------------------------------- on a mount


def _tier(path) -> str:
    return os.getxattr(path, "user.memos.tier").decode()


def _conversation(m, turns: int, size: int):
    s = m.p("bot", "chat")
    s.mkdir(parents=True)
    for i in range(turns):
        (s / f"turn-{i:04d}").write_bytes(bytes([i]) * size)
    (m.path / ".memos" / "cache" / "flush").write_text("1\n")
    return s


@pytest.mark.parametrize("mode", ["sequential", "off"])
def test_mount_sequential_prefetch_makes_the_next_turn_a_hit(make_mount, mode):
    """Memory holds ~14 of 40 turns; reading turn i brings turn i+1 into
    memory ahead of its read under sequential prefetch, and not under off."""
    import time
    # evict_batch=1: a batch of 16 victims in a 14-slot memory would take
    # the prefetched turns with it; lru: under lru_lfu a prefetched slot not
    # yet read is the newest of the probation segment, which the adaptive
    # policy may sacrifice first (docs/known-issues.md)
    m = make_mount(capacity="8M", writeback_delay_ms=0, warmup_ratio=0, evict_batch=1,
                   evict_policy="lru",
                   prefetch_mode=mode, prefetch_stride=2)
    size = 512 << 10
    s = _conversation(m, 40, size)
    found_in_memory = 0
    for i in range(0, 8):
        assert (s / f"turn-{i:04d}").read_bytes() == bytes([i]) * size
        nxt = s / f"turn-{i + 1:04d}"
        deadline = time.monotonic() + (5 if mode == "sequential" else 0.3)
        while _tier(nxt) != "mem" and time.monotonic() < deadline:
            time.sleep(0.02)
        found_in_memory += _tier(nxt) == "mem"
    st = m.stats()
    if mode == "sequential":
        assert found_in_memory == 8
        assert st["prefetch_issued"] >= 8 and st["prefetch_used"] >= 7
        assert st["prefetch_accuracy"] > 0.5
    else:
        assert found_in_memory == 0
        assert st["prefetch_issued"] == 0


def test_mount_prefetch_mode_knob(make_mount):
    m = make_mount(capacity="8M")
    knob = m.ctl("prefetch_mode")
    assert knob.read_text() == "off\n"
    knob.write_text("hybrid\n")
    assert knob.read_text() == "hybrid\n"
    with pytest.raises(OSError) as e:
        knob.write_text("psychic\n")
    assert e.value.errno == errno.EINVAL
    assert knob.read_text() == "hybrid\n"


def test_mount_sequential_prefetch_per_directory_below_a_session(make_mount):
    """Engines keep one directory per request below a session: the stride
    detector and the slot list are per directory, so reading layer i of a
    request brings layer i+1 of the same request into memory."""
    import time
    m = make_mount(capacity="8M", writeback_delay_ms=0, warmup_ratio=0, evict_batch=1,
                   evict_policy="lru", prefetch_mode="sequential", prefetch_stride=2)
    size = 512 << 10
    d = m.p("a", "s", "req-1")
    d.mkdir(parents=True)
    for i in range(40):
        (d / f"layer-{i:04d}").write_bytes(bytes([i]) * size)
    (m.path / ".memos" / "cache" / "flush").write_text("1\n")
    found_in_memory = 0
    for i in range(0, 8):
        assert (d / f"layer-{i:04d}").read_bytes() == bytes([i]) * size
        nxt = d / f"layer-{i + 1:04d}"
        deadline = time.monotonic() + 5
        while _tier(nxt) != "mem" and time.monotonic() < deadline:
            time.sleep(0.02)
        found_in_memory += _tier(nxt) == "mem"
    assert found_in_memory == 8
    assert m.stats()["prefetch_issued"] >= 8
