"""The SSD tier evicts by the memory tier's policy (evict_policy), and its
policy state survives a restart (memosfs/store/ssdpolicy.py, policy.json)."""

from __future__ import annotations

import json
import os
import random
import stat

import pytest

from memosfs import _native
from memosfs.store.ssd import SSDTier, _name_of
from memosfs.store.ssdpolicy import SSDPolicy
from memosfs.store.store import Store

KiB = 1 << 10
MiB = 1 << 20
SLOT = 100 * KiB


# ---------------------------------------------------------------- the native Policy


def _churn(p: "_native.Policy", rng: random.Random, n: int) -> None:
    """A mixed workload: admits, re-reads of a hot set, evictions."""
    live: list[int] = list(p.ids())
    nxt = max(live, default=0) + 1
    for _ in range(n):
        r = rng.random()
        if r < 0.45 or not live:
            p.admit(nxt, nxt * 0x9E3779B97F4A7C15 % (1 << 64))
            live.append(nxt)
            nxt += 1
        elif r < 0.8:
            p.touch(live[min(len(live) - 1, int(rng.expovariate(0.2)))])
        elif r < 0.85 and nxt > 50:
            old = rng.randrange(1, nxt)      # a key coming back: maybe a ghost hit
            if old not in p:
                p.admit(old, old * 0x9E3779B97F4A7C15 % (1 << 64))
                live.append(old)
        else:
            for v in p.victims(3):
                p.remove(v, evicted=True)
                live.remove(v)


@pytest.mark.parametrize("name", ["lru", "lfu"])
def test_dump_restore_gives_the_same_victims(name):
    rng = random.Random(7)
    p = _native.Policy(name)
    _churn(p, rng, 3000)
    p.check()
    state = json.loads(json.dumps(p.dump()))           # through JSON, as on disk
    q = _native.Policy("lru")                          # the dump names its policy
    q.restore(state)
    q.check()
    assert q.name == name and len(q) == len(p) and q.ids() == p.ids()
    qs, ps = q.stats(), p.stats()
    qs.pop("ghost_entries"), ps.pop("ghost_entries")    # (table slots: some aged out, not dumped)
    assert qs == ps
    assert q.dump() == p.dump()
    # the same victims now, and after the same future
    assert q.victims(50) == p.victims(50)
    _churn(p, random.Random(11), 2000)
    _churn(q, random.Random(11), 2000)
    assert q.victims(100) == p.victims(100)
    qs, ps = q.stats(), p.stats()
    qs.pop("ghost_entries"), ps.pop("ghost_entries")    # (table slots: some aged out, not dumped)
    assert qs == ps


def test_lru_lfu_restores_its_segments_ghosts_and_setting():
    """lru_lfu's dump is its hybrid's state (recency order, uses, stamps and
    class bits, the two segments, the ghosts of fingerprints with their
    stamps and ages) and the setting in force; the restored policy picks the
    same victims, now and, with its setting held, after the same future (its
    shadows start anew from the stamps)."""
    rng = random.Random(7)
    p = _native.Policy("lru_lfu")
    _churn(p, rng, 3000)
    p.check()
    state = json.loads(json.dumps(p.dump()))
    assert state["format"] == 4 and len(state["lists"]) == 2 and len(state["ghosts"]) == 2
    g = state["ghosts"][0]
    assert g["hash"] and all(0 < h < 1 << 32 for h in g["hash"])
    assert len(g["stamp"]) == len(g["age"]) == len(g["cls"]) == len(g["hash"])
    assert all(len(n) == 6 for n in state["nodes"]) and state["tick"] > 0 and state["ghost_size"] > 0
    q = _native.Policy("lru")
    q.restore(state)
    q.check()
    assert q.name == "lru_lfu" and q.ids() == p.ids()
    assert q.stats()["setting"] == p.stats()["setting"]
    assert q.victims(50) == p.victims(50)
    assert q.dump() == p.dump()
    for x in (p, q):                    # the setting held: the same future, the same choices
        x.select("lru_lfu@%d" % p.stats()["setting"])
    _churn(p, random.Random(11), 2000)
    _churn(q, random.Random(11), 2000)
    q.check()
    assert q.victims(100) == p.victims(100)
    qs, ps = q.stats(), p.stats()
    qs.pop("ghost_entries"), ps.pop("ghost_entries")    # (table slots: some aged out, not dumped)
    assert qs == ps
    # with the LIRS setting in force (learnt before the dump), a slot used
    # again and again outlives a scan of the restored cache
    r = _native.Policy("lru_lfu")
    r.restore({"policy": "lru_lfu", "format": 4, "expert": 7, "pfrac": 0.5,
               "ghost_hits_recency": 0, "ghost_hits_frequency": 0, "tick": 0, "ghost_size": 0,
               "nodes": [], "lists": [[], []],
               "ghosts": [{"hash": [], "stamp": [], "age": [], "cls": [], "epoch": 0}] * 2})
    for i in range(1, 11):
        r.admit(i, i * 1000003)
    for _ in range(5):
        r.touch(1)
    s = _native.Policy("lru_lfu")
    s.restore(r.dump())
    for i in range(100, 130):
        (v,) = s.victims(1)
        s.remove(v, evicted=True)
        s.admit(i, i * 1000003)
    assert 1 in s and 2 not in s and s.stats()["setting"] == 7


def test_restore_refuses_a_damaged_state_and_stays_usable():
    for name, damages in (
            ("lru_lfu", (lambda s: s["lists"].append([3]),      # a list it does not keep
                         lambda s: s["ghosts"].append({}),      # a ring it does not keep
                         lambda s: s.pop("format"),             # the format before the bank
                         lambda s: s.update(format=2),
                         lambda s: (s.pop("format"), s.update(bank=2)),   # the bank's format
                         lambda s: [s["ghosts"][0][f].append(x) for f, x in   # not a fingerprint
                                    (("hash", 1 << 40), ("stamp", 0), ("age", 0), ("cls", 0))],
                         lambda s: s["ghosts"][0]["age"].append(1),          # lists that disagree
                         lambda s: s.update(format=3),          # ghost rings of bare fingerprints
                         lambda s: s["nodes"].append(list(s["nodes"][0])),   # an id twice
                         lambda s: s.update(expert=99),         # no such setting
                         lambda s: s.update(nodes="x"))),
            ("lfu", (lambda s: s["lists"][0].append(3),         # on two lists
                     lambda s: s["lists"].pop(),                # a level missing
                     lambda s: s["nodes"].append([99, 1, 0, 0, 0, 0]),   # on no list
                     lambda s: s.update(format=3)))):
        p = _native.Policy(name)
        for i in range(1, 20):
            p.admit(i, i)
        p.touch(3)
        good = p.dump()
        for damage in damages:
            bad = json.loads(json.dumps(good))
            damage(bad)
            q = _native.Policy(name)
            with pytest.raises(ValueError):
                q.restore(bad)
            assert len(q) == 0
            q.admit(1, 1)                                # still a working policy
            q.check()


def test_ssd_policy_falls_back_to_the_order_on_a_bad_state(tmp_path, caplog):
    keys = [f"a/s/{i}".encode() for i in range(5)]
    sp = SSDPolicy()
    for k in keys:
        sp.written(k)
    sp.used(keys[0])
    state = json.loads(json.dumps(sp.state()))
    restored = SSDPolicy()
    restored.restore(state, set(keys[1:]), keys, "test")      # keys[0] is gone
    assert restored.restored == "state" and keys[0] not in restored
    assert restored.victims(4) == keys[1:]
    state["state"].pop("format")                # an lru_lfu state of an older format
    state["state"]["bank"] = 2
    broken = SSDPolicy()
    broken.restore(state, set(keys), list(reversed(keys)), "test")
    assert broken.restored == "fallback"
    assert broken.victims(5) == list(reversed(keys))            # the order given
    assert "policy state unusable" in caplog.text


def test_store_evicts_ssd_slots_by_the_policy(tmp_path):
    """A slot read again and again, written back each time a scan pushed it
    out, outlives the scans under lru_lfu once its shadows have seen that
    LIRS keeps it (a few rounds: it starts as LRU, never below it), never
    under lru."""
    kept = {}
    for name in ("lru_lfu", "lru"):
        root = tmp_path / name
        store = Store(64 * MiB, ssd=SSDTier(str(root), capacity=8 * (SLOT + 4 * KiB)))
        store.set_evict_policy(name)
        kept[name] = []
        for r in range(24):
            if store.ssd.get(b"a/s/hot") is None:
                _publish(store, b"a/s/hot")     # (computed again: a miss)
            for _ in range(3):
                ref = store.get(b"a/s/hot")     # promoted from the SSD, then memory hits
                ref.release()
            store.cache.remove(b"a/s/hot")      # only the SSD holds it
            for i in range(12):
                _publish(store, f"a/s/scan{r}.{i}".encode())
            kept[name].append(store.ssd.get(b"a/s/hot") is not None)
        assert store.ssd.statistics().ssd_evictions >= 24 * 12 - 8
        if name == "lru_lfu":
            assert store.ssd.policy.stats()["decided"].startswith("lru_lfu@7 (shadows: LIRS led")
        store.close()
    assert not any(kept["lru"])
    assert not kept["lru_lfu"][0] and all(kept["lru_lfu"][-6:]), kept["lru_lfu"]


def test_the_evict_policy_knob_sets_both_tiers(tmp_path):
    store = Store(64 * MiB, ssd=SSDTier(str(tmp_path)))
    for name in ("lfu", "lru", "lru_lfu"):
        store.set_evict_policy(name)
        assert store.cache.stats()["evict_policy"] == store.ssd.policy.name == name
    with pytest.raises(ValueError):
        store.set_evict_policy("fifo")
    store.close()


def _publish(store: Store, key: bytes) -> None:
    d = store.draft()
    d.write(0, os.urandom(SLOT))
    store.publish(d, key).release()
    store.persist(key)                  # on the SSD now (fsync of the slot)
    store.cache.remove(key)             # and only there


# ---------------------------------------------------------------- mounted


def _ssd_file(m, key: bytes):
    name = _name_of(key)
    return m.ssd / "slots" / name[:2] / (name + ".slot")


def _scan(s, first: int, n: int) -> None:
    for i in range(first, first + n):
        p = s / f"scan{i}"
        with open(p, "wb") as f:
            f.write(os.urandom(SLOT))
            f.flush()
            os.fsync(f.fileno())        # written to the SSD tier now


def _drop_memory_only(s, m) -> None:
    """Remove the scan slots the SSD tier no longer holds (memory holds them,
    dirty: an unmount could not save them all, the SSD tier being full)."""
    for p in s.iterdir():
        if p.name.startswith("scan") and not _ssd_file(m, f"agent/s1/{p.name}".encode()).exists():
            p.unlink()


@pytest.mark.parametrize("policy", ["lru_lfu", "lru"])
def test_frequent_slot_outlives_a_scan_across_a_remount(make_mount, policy):
    """A slot used again and again, written again each time the SSD tier
    lost it to a scan: lru_lfu's shadows see that LIRS keeps it and follow
    (within a few rounds), and the slot outlives every later scan, across a
    remount too (the setting comes back with the state); lru keeps losing
    it."""
    opts = dict(capacity="64M", ssd_capacity=str(10 * (SLOT + 4 * KiB)), evict_policy=policy,
                writeback_delay_ms=3600000, warmup_ratio="0")
    m = make_mount(**opts)
    m.p("agent").mkdir()
    s = m.p("agent", "s1")
    s.mkdir()
    hot = os.urandom(SLOT)
    hot_file = _ssd_file(m, b"agent/s1/hot")
    kept = []
    for r in range(24):
        if not hot_file.exists():       # lost to the last scan: written again
            with open(s / "hot", "wb") as f:
                f.write(hot)
                f.flush()
                os.fsync(f.fileno())
        assert hot_file.exists()
        for _ in range(3):              # used again and again
            assert (s / "hot").read_bytes() == hot
        _scan(s, 12 * r, 12)            # a scan of slots written once
        kept.append(hot_file.exists())
    st = m.stats()
    assert st["ssd_evictions"] >= 240 and st["ssd_bytes"] <= 10 * (SLOT + 4 * KiB)
    if policy == "lru":
        assert not any(kept)            # least recent: every scan pushed it out
        assert os.getxattr(s / "hot", "user.memos.dirty") == b"1"   # only memory has it
        return
    assert not kept[0] and all(kept[-5:]), kept     # kept: the shadows followed LIRS

    # restart: the policy's state comes back from policy.json
    _drop_memory_only(s, m)
    m.stop()
    assert m.proc.returncode == 0
    state_file = m.ssd / "policy.json"
    assert stat.S_IMODE(os.stat(state_file).st_mode) == 0o600
    saved = json.loads(state_file.read_text())
    assert saved["state"]["policy"] == policy and len(saved["state"]["nodes"]) == 10
    assert saved["state"]["expert"] == 7            # the LIRS setting in force
    assert saved["state"]["format"] == 4
    m2 = make_mount(ssd=str(m.ssd), **opts)
    s2 = m2.p("agent", "s1")
    _scan(s2, 1000, 30)                 # another scan, hot not read since the restart
    assert hot_file.exists()
    assert (s2 / "hot").read_bytes() == hot
    assert "policy state unusable" not in m2.logtext()
    assert "no policy state" not in m2.logtext()


def test_a_corrupt_policy_state_falls_back_and_mounts(make_mount):
    opts = dict(capacity="64M", ssd_capacity=str(10 * (SLOT + 4 * KiB)),
                writeback_delay_ms=3600000, warmup_ratio="0")
    m = make_mount(**opts)
    m.p("agent").mkdir()
    s = m.p("agent", "s1")
    s.mkdir()
    _scan(s, 0, 5)
    m.stop()
    assert m.proc.returncode == 0
    (m.ssd / "policy.json").write_text('{"version": 1, "keys": {"1": 2}, "state": []}')
    m2 = make_mount(ssd=str(m.ssd), **opts)
    assert sorted(os.listdir(m2.p("agent", "s1"))) == sorted(f"scan{i}" for i in range(5))
    assert "policy state unusable" in m2.logtext()
    _scan(m2.p("agent", "s1"), 5, 20)           # evicts by the rebuilt order
    assert m2.stats()["ssd_evictions"] > 0
    _drop_memory_only(m2.p("agent", "s1"), m2)
    m2.stop()
    assert m2.proc.returncode == 0
    saved = json.loads((m.ssd / "policy.json").read_text())    # a good one written again
    assert saved["version"] == 1 and saved["state"]["nodes"]
