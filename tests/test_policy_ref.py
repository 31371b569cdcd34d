"""The published policies in memosfs/testing/refpolicies.py, each on a short
sequence checked by hand against its paper; the C simulated members
(native/policies/, "ref:NAME") equal to them access for access; a setting
of lru_lfu in force picks what it picks alone; and libCacheSim beside
them: where it runs the published algorithm, and where it does not (the
bench's REFERENCE_PEERS)."""

from __future__ import annotations

import array
import random

import pytest

from memosfs import _native as N
from memosfs.bench import policy as bench
from memosfs.testing import refpolicies as R


def run(policy, keys):
    return [policy.access(k) for k in keys]


# ---- by hand ----

def test_lru_by_hand():
    c = R.LRU(2)
    assert run(c, [1, 2, 1, 3, 2]) == [False, False, True, False, False]
    assert c.resident() == {3, 2}          # 3 pushed out 2, then 2 pushed out 1


def test_lfu_by_hand():
    c = R.LFU(2)
    assert run(c, [1, 1, 2, 3, 3, 2]) == [False, True, False, False, True, False]
    # 3 evicted 2 (count 1); then 1 and 3 both count 2: 1 reached it first
    assert c.resident() == {2, 3}


def test_arc_by_hand():
    # c = 2: 1, 2 fill T1; 1 hits (to T2); 3 evicts T1's LRU 2 into B1;
    # 2 comes back from B1: p 0 -> 1, and since |T1| = 1 is not above p the
    # victim is T2's LRU 1 (into B2); 1 comes back from B2: p 1 -> 0, and
    # REPLACE evicts T1's 3 into B1
    c = R.ARC(2)
    assert run(c, [1, 2, 1, 3, 2]) == [False, False, True, False, False]
    assert c.p == 1 and list(c.b1) == [] and list(c.b2) == [1]
    assert run(c, [1]) == [False]
    assert c.p == 0 and list(c.b1) == [3] and c.resident() == {1, 2}
    assert list(c.t2) == [2, 1]


def test_2q_by_hand():
    # 4 slots, Kin = 1, Kout = 2
    c = R.TwoQ(4)
    assert run(c, [1, 2, 3, 4, 5, 1, 5, 6]) == [False] * 6 + [True, False]
    # 5 pushed 1 from A1in to A1out; 1's return goes to Am (pushing 2 out);
    # 5 hits in A1in (no move); 6 pushes 3 out
    assert list(c.am) == [1] and list(c.a1in) == [4, 5, 6] and list(c.a1out) == [2, 3]


def test_s3fifo_by_hand():
    keys = list(range(1, 11)) + [1, 1, 11, 2]
    c = R.S3FIFO(10)                        # S 1, M 9, G 9: Algorithm 1
    assert sum(run(c, keys)) == 2
    # 11: S's tail 1 (freq 2) moves to M, 2 (freq 0) goes to G; 2's return
    # evicts 3 to G and, found in G, enters M
    assert list(c.m) == [1, 2] and list(c.g) == [3]
    assert c.resident() == {1, 2} | set(range(4, 12))
    lib = R.S3FIFO(10, libcachesim=True)    # before the first eviction, S full: to M
    assert sum(run(lib, keys)) == 2
    assert list(lib.s) == [2] and list(lib.g) == [11]
    assert lib.resident() == set(range(1, 11))   # 2 (from M) went, without a ghost


def test_sieve_by_hand():
    keys = [1, 4, 0, 2, 0, 3, 3, 3, 5, 3, 1, 0, 3, 0, 3, 3, 4, 0, 5, 3]
    c = R.SIEVE(3)
    hits = run(c, keys)
    assert sum(hits) == 10 and hits[-1] is False
    assert c.resident() == {0, 3, 5}
    assert c.laps == 2                      # the hand went past the head twice


def test_lirs_by_hand():
    # 3 blocks: L_lirs 2, L_hirs 1
    c = R.LIRS(3)
    keys = [1, 2, 3, 4, 1, 2, 5, 3, 5, 1, 3]
    hits = run(c, keys)
    assert [i for i, h in enumerate(hits) if h] == [4, 5, 9]
    # 5's return while non-resident in S makes it LIR and demotes 1; 3's
    # return does the same to 2; 1 (a HIR block out of S) was hit at step 9
    assert c.resident() == {2, 3, 5}
    assert c.state[5] == c.state[3] == R.LIRS.LIR and c.state[2] == R.LIRS.HIR
    assert c.state[1] == R.LIRS.NONRES and 1 in c.s


def test_wtinylfu_by_hand():
    # 3 blocks: window 1, main 2 (protected 1)
    c = R.WTinyLFU(3)
    assert run(c, [1, 1, 1, 2, 3, 4]) == [False, True, True, False, False, False]
    assert c.estimate(1) == 3 and c.estimate(4) == 1
    # 4's arrival pushes 3 out of the window: its count (1) does not beat the
    # main victim 1's (3): 3 goes
    assert c.resident() == {1, 2, 4}
    assert run(c, [3]) == [False]            # 4 (count 1) loses to 1 (3)
    assert c.resident() == {1, 2, 3}


# ---- the C members ----

def streams():
    rnd = random.Random(5)
    for _ in range(12):
        nk = rnd.choice([50, 300, 2000])
        cap = rnd.choice([3, 10, 37, 150, 400])
        keys = [int(rnd.paretovariate(0.8)) % nk if rnd.random() < 0.7 else rnd.randrange(nk)
                for _ in range(5000)]
        yield keys, cap


@pytest.mark.parametrize("name", list(R.POLICIES))
def test_the_c_member_is_the_reference(name):
    for keys, cap in streams():
        ref = R.S3FIFO(cap, libcachesim=True) if name == "S3-FIFO" else R.POLICIES[name](cap)
        want = sum(run(ref, keys))
        got = N.policy_simulate("ref:" + name, array.array("Q", keys).tobytes(), cap)["hits"]
        assert got == want, (name, cap)


def _stream_for(setting: int, cap: int) -> list[int]:
    """A stream whose shadows keep `setting` in force from the start: a
    sliding working set (recency: LRU, 0) or a loop a tenth longer than the
    cache (LIRS, 7)."""
    rnd = random.Random(9)
    if setting == 0:
        return [i // 4 + rnd.randrange(cap) for i in range(20 * cap)]
    return [i % (cap + cap // 10) for i in range(20 * cap)]


@pytest.mark.parametrize("setting", [0, 7])
def test_a_setting_in_force_picks_what_it_picks_alone(setting):
    """lru_lfu with a setting in force (a restored state naming it) that its
    shadows keep hits exactly as that setting alone, and as the simulated
    member of that setting (the live hybrid's own code)."""
    cap = 300
    keys = _stream_for(setting, cap)
    p = N.Policy("lru_lfu")
    p.restore({"policy": "lru_lfu", "format": 4, "expert": setting, "pfrac": 0.5,
               "ghost_hits_recency": 0, "ghost_hits_frequency": 0, "tick": 0, "ghost_size": 0,
               "nodes": [], "lists": [[], []],
               "ghosts": [{"hash": [], "stamp": [], "age": [], "cls": [], "epoch": 0}] * 2})
    hits = 0
    for k in keys:
        if k in p:
            p.touch(k)
            hits += 1
            continue
        if len(p) >= cap:
            (v,) = p.victims(1)
            p.remove(v, evicted=True)
        p.admit(k, R.mix64(k) or 1)
    name = {0: "LRU", 7: "LIRS"}[setting]
    assert p.stats()["decided"] == f"lru_lfu@{setting} (shadows: {name}, no lead passed)"
    assert p.stats()["switches"] == 0
    buf = array.array("Q", keys).tobytes()
    assert hits == N.policy_simulate(f"lru_lfu@{setting}", buf, cap)["hits"]
    assert hits == N.policy_simulate(f"ref:lru_lfu@{setting}", buf, cap)["hits"]
    assert hits > 0
    p.check()


# ---- libCacheSim ----

def lib_hits(name, keys, cap):
    lcs = pytest.importorskip("libcachesim")
    classes, _ = bench._lcs_classes()
    c = classes[name](cap, hashpower=12)
    req = lcs.Request()
    req.obj_size = 1
    out = []
    for i, k in enumerate(keys):
        req.obj_id = k
        req.clock_time = i
        out.append(bool(c.get(req)))
    return out


def lib_streams():
    rnd = random.Random(1)
    for _ in range(6):
        yield [rnd.randrange(160) for _ in range(3000)], 100   # (libCacheSim's S3-FIFO
                                                               # and W-TinyLFU need 100 blocks)


@pytest.mark.parametrize("name", ["LRU", "LFU", "ARC", "2Q", "SIEVE", "S3-FIFO"])
def test_libcachesim_runs_the_published_policy(name):
    for keys, cap in lib_streams():
        ref = R.S3FIFO(cap, libcachesim=True) if name == "S3-FIFO" else R.POLICIES[name](cap)
        assert lib_hits(name, keys, cap) == run(ref, keys), name


@pytest.mark.parametrize("name", sorted(bench.REFERENCE_PEERS))
def test_libcachesim_parts_from_the_published_policy(name):
    """Where the bench's goal uses the reference: libCacheSim parts from it
    (if a later libCacheSim runs the paper's algorithm, REFERENCE_PEERS can
    go)."""
    parted = False
    for keys, cap in lib_streams():
        parted |= lib_hits(name, keys, cap) != run(R.POLICIES[name](cap), keys)
    assert parted


def test_sieve_is_lfu_until_its_hand_laps():
    """SIEVE's hand sweeps from the oldest entry to the newest; until it
    passes the newest once, every entry behind it was hit since it came in
    and every entry before it that was not is one LFU counts once: the oldest
    of those is both SIEVE's victim and LFU's (ties go to the first to reach
    the count).  On streams of mostly one-time blocks the hand never laps
    and the two hit alike, access for access."""
    rnd = random.Random(3)
    hot = list(range(50))
    keys, cold = [], 1000
    for _ in range(20_000):
        if rnd.random() < 0.3:
            keys.append(rnd.choice(hot))
        else:
            keys.append(cold)
            cold += 1
    s, f = R.SIEVE(200), R.LFU(200)
    assert run(s, keys) == run(f, keys) and s.laps == 0
    s, f = R.SIEVE(40), R.LFU(40)            # the hot set does not fit: the hand laps
    assert run(s, keys) != run(f, keys) and s.laps > 0
