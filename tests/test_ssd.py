"""The SSD tier: its file format alone, then restarts of real mounts.

These tests look at the per-slot files, so the tiers they make in process
pack nothing (PACK_BELOW 0) and the mounts that look at files are mounted
with ssd_pack_below=0; tests/test_segments.py runs the store-level ones
again with small slots packed."""

from __future__ import annotations

import errno
import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from conftest import is_mounted
from memosfs import _native
from memosfs.store.ssd import MAGIC, XATTR, CorruptSlot, SSDTier, _name_of
from memosfs.store.store import Store

MiB = 1 << 20


# ---------------------------------------------------------------- format


def _publish(cache, key: bytes, data: bytes):
    d = cache.draft()
    d.write(0, data)
    return cache.publish(d, key)


@pytest.fixture(autouse=True)
def files_only(monkeypatch):
    """In-process tiers write a file for every slot (the format under test)."""
    import memosfs.store.ssd.packed as segments
    monkeypatch.setattr(segments, "PACK_BELOW", 0)


@pytest.fixture
def cache():
    c = _native.Cache(32 * MiB)
    yield c
    c.close()


def slot_files(root: Path) -> list[Path]:
    return sorted((root / "slots").glob("*/*.slot"))


def test_put_scan_load_roundtrip(tmp_path, cache):
    tier = SSDTier(str(tmp_path))
    payload = os.urandom(3 * 131072 + 5)
    ref = _publish(cache, b"a/s/x", payload)
    entry = tier.put(ref, {"mode": 0o600}, durable=True)
    ref.release()
    assert entry.size == len(payload) and entry.version == 1
    [f] = slot_files(tmp_path)
    assert f.read_bytes() == payload            # the file is the slot (payload-only) ...
    assert os.getxattr(f, XATTR)[-8:] == MAGIC  # ... its trailer in an attribute
    assert entry.bare
    again = SSDTier(str(tmp_path))
    [e] = again.scan()
    assert (e.key, e.version, e.size, e.meta) == (b"a/s/x", 1, len(payload), {"mode": 0o600})
    d = cache.draft()
    again.load_into(e, d)
    assert d.read(0, len(payload) + 1) == payload
    d.free()


def test_empty_slot_roundtrip(tmp_path, cache):
    tier = SSDTier(str(tmp_path))
    ref = _publish(cache, b"a/s/empty", b"")
    tier.put(ref, {}, durable=False)
    ref.release()
    [e] = SSDTier(str(tmp_path)).scan()
    assert e.size == 0


@pytest.mark.parametrize("damage", ["truncate", "trailer", "footer", "foreign"])
def test_bad_files_are_set_aside_at_scan(tmp_path, cache, damage, caplog, monkeypatch):
    """Files of the trailer layout (what older memosfs wrote; payload-only
    files' damage: tests/test_ssd_bare.py)."""
    import memosfs.store.ssd.whole as whole
    monkeypatch.setattr(whole, "WRITE_BARE", False)
    tier = SSDTier(str(tmp_path))
    ref = _publish(cache, b"a/s/x", os.urandom(10000))
    tier.put(ref, {}, durable=True)
    ref.release()
    [f] = slot_files(tmp_path)
    raw = bytearray(f.read_bytes())
    if damage == "truncate":
        raw = raw[:7000]
    elif damage == "trailer":
        raw[10000 + 3] ^= 0xFF
    elif damage == "footer":
        raw[-1] ^= 0xFF
    elif damage == "empty":
        raw = bytearray()
    elif damage == "foreign":                # a valid file under another key's name
        other = SSDTier(str(tmp_path / "other"))
        r2 = _publish(cache, b"b/s/y", b"y" * 10)
        other.put(r2, {}, durable=True)
        r2.release()
        raw = bytearray(slot_files(tmp_path / "other")[0].read_bytes())
    f.write_bytes(bytes(raw))
    again = SSDTier(str(tmp_path))
    assert again.scan() == []
    assert again.corrupt == 1
    assert list((tmp_path / "corrupt").iterdir())
    assert "corrupt slot file set aside" in caplog.text


@pytest.mark.parametrize("bare", [False, True])
def test_an_empty_slot_file_is_what_a_power_loss_left_not_corruption(tmp_path, cache, caplog,
                                                                      monkeypatch, bare):
    """A slot file renamed into place before its bytes reached the disk (a
    write-back nobody acknowledged, never fsync'd) is left empty by a power
    loss: removed at mount with an INFO line, not set aside as corrupt.  An
    empty slot (its trailer says 0 bytes) stays."""
    import logging

    import memosfs.store.ssd as ssd_mod
    monkeypatch.setattr(ssd_mod.whole, "WRITE_BARE", bare)
    tier = SSDTier(str(tmp_path))
    for key, data in ((b"a/s/x", os.urandom(10000)), (b"a/s/empty", b"")):
        ref = _publish(cache, key, data)
        tier.put(ref, {}, durable=False)
        ref.release()
    f = next(p for p in slot_files(tmp_path) if p.name.startswith(_name_of(b"a/s/x")))
    os.truncate(f, 0)                   # (what the power loss left of its bytes)
    caplog.set_level(logging.INFO)
    again = SSDTier(str(tmp_path))
    assert [e.key for e in again.scan()] == [b"a/s/empty"]
    assert again.corrupt == 0 and not (tmp_path / "corrupt").exists()
    assert not f.exists() and "an empty slot file" in caplog.text
    assert "corrupt" not in caplog.text


@pytest.mark.parametrize("bare", [False, True])
@pytest.mark.parametrize("clean", [False, True])
def test_a_slot_file_cut_short_after_a_crash_is_what_a_power_loss_left(
        tmp_path, cache, caplog, monkeypatch, bare, clean):
    """A write-back nobody acknowledged is renamed into place unsynced; a
    power loss can keep the rename and part of its bytes (ext4
    noauto_da_alloc, xfs): the file stops before its footer, or is shorter
    than its attribute says.  After a daemon that did not unmount cleanly
    (RUNNING left) that is no corruption: set aside as .torn, WARNING,
    ssd_corrupt 0.  After a clean unmount every file was fsync'd, so the
    same file is damage (ERROR, counted), and so is a footer one byte of
    which is wrong, even after a crash."""
    import logging

    import memosfs.store.ssd as ssd_mod
    monkeypatch.setattr(ssd_mod.whole, "WRITE_BARE", bare)
    tier = SSDTier(str(tmp_path))
    assert tier.scan() == []                    # (a mount: RUNNING made)
    for key in (b"a/s/x", b"a/s/y", b"a/s/kept"):
        ref = _publish(cache, key, os.urandom(30000))
        tier.put(ref, {}, durable=False)
        ref.release()
    if clean:
        tier.closed_clean()
    assert (tmp_path / ssd_mod.RUNNING).exists() is not clean
    f = next(p for p in slot_files(tmp_path) if p.name.startswith(_name_of(b"a/s/x")))
    os.truncate(f, 12288)                       # (what the power loss left of its bytes)
    g = next(p for p in slot_files(tmp_path) if p.name.startswith(_name_of(b"a/s/y")))
    raw = bytearray(g.read_bytes())
    if bare:                                    # (its attribute's magic, one byte off)
        value = bytearray(os.getxattr(g, XATTR))
        value[-1] ^= 0x01
        os.setxattr(g, XATTR, bytes(value))
    else:
        raw[-1] ^= 0x01
        g.write_bytes(bytes(raw))
    caplog.set_level(logging.INFO)
    again = SSDTier(str(tmp_path))
    assert [e.key for e in again.scan()] == [b"a/s/kept"]
    aside = sorted(p.name for p in (tmp_path / "corrupt").iterdir())
    if clean:
        assert again.corrupt == 2 and aside == sorted([f.name, g.name])
        assert "set aside as" not in caplog.text
    else:
        assert again.corrupt == 1 and aside == sorted([f.name + ".torn", g.name])
        assert f"set aside as {f.name}.torn, not counted as corrupt" in caplog.text
        assert [r for r in caplog.records if r.levelno >= logging.ERROR
                and f.name in r.getMessage()] == []
    assert (tmp_path / ssd_mod.RUNNING).exists()    # (this mount's, until its clean end)


def test_payload_damage_is_caught_on_read_and_never_served(tmp_path, cache):
    tier = SSDTier(str(tmp_path))
    ref = _publish(cache, b"a/s/x", os.urandom(50000))
    tier.put(ref, {}, durable=True)
    ref.release()
    [f] = slot_files(tmp_path)
    raw = bytearray(f.read_bytes())
    raw[1234] ^= 0x01
    f.write_bytes(bytes(raw))
    again = SSDTier(str(tmp_path))
    [e] = again.scan()                       # the trailer checks out ...
    d = cache.draft()
    with pytest.raises(CorruptSlot, match="payload checksum mismatch"):
        again.load_into(e, d)                # ... the payload does not
    d.free()


def test_leftover_temporary_files_are_removed(tmp_path):
    (tmp_path / "slots" / "ab").mkdir(parents=True)
    tmp = tmp_path / "slots" / "ab" / ".abcdef.123.0.tmp"
    tmp.write_bytes(b"half a write")
    assert SSDTier(str(tmp_path)).scan() == []
    assert not tmp.exists()


def test_store_promotes_and_drops_corrupt(tmp_path):
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path)))
    dropped = []
    store.on_drop(lambda key, why: dropped.append((key, why)))
    d = store.draft()
    d.write(0, b"x" * 5000)
    store.publish(d, b"a/s/x").release()
    assert store.flush() == 1
    store.cache.remove(b"a/s/x")             # as if evicted (clean)
    ref = store.get(b"a/s/x")
    assert ref is not None and ref.read(0, 10) == b"x" * 10 and not ref.dirty
    ref.release()
    assert store.statistics().ssd_hits == 1
    store.cache.remove(b"a/s/x")
    [f] = slot_files(tmp_path)
    raw = bytearray(f.read_bytes())
    raw[0] ^= 0xFF
    f.write_bytes(bytes(raw))
    assert store.get(b"a/s/x") is None
    assert dropped == [(b"a/s/x", "corrupt")]
    assert store.ssd.corrupt == 1
    store.close()


def test_ssd_capacity_evicts_least_recent_ssd_slots(tmp_path):
    store = Store(64 * MiB, ssd=SSDTier(str(tmp_path), capacity=3 * MiB + 4096))
    dropped = []
    store.on_drop(lambda key, why: dropped.append(key))
    for i in range(4):
        d = store.draft()
        d.write(0, bytes([i]) * MiB)
        store.publish(d, f"a/s/{i}".encode()).release()
        store.flush()
        store.cache.remove(f"a/s/{i}".encode())  # keep only the SSD copy
    assert dropped == [b"a/s/0"]                  # the least recent went
    assert sorted(store.ssd.keys()) == [b"a/s/1", b"a/s/2", b"a/s/3"]
    store.close()


# ---------------------------------------------------------------- mounted


def session(m, agent="agent", sess="s1"):
    m.p(agent).mkdir(exist_ok=True)
    m.p(agent, sess).mkdir(exist_ok=True)
    return m.p(agent, sess)


def remount(make_mount, m, **opts):
    """Unmount m cleanly, then mount its SSD directory again."""
    m.stop()
    assert m.proc.returncode == 0
    return make_mount(ssd=str(m.ssd), **opts)


def test_a_mount_marks_its_ssd_directory_running_until_its_clean_unmount(make_mount):
    """RUNNING (ssd/state.py) is there while a daemon uses the directory and
    after one is killed; a clean unmount removes it, a kill -9 leaves it."""
    from memosfs.store.ssd import RUNNING
    from memosfs.testing.daemon import kill9
    m = make_mount(capacity="16M")
    (session(m) / "k").write_bytes(os.urandom(100_000))
    assert (Path(m.ssd) / RUNNING).exists()
    m.stop()
    assert m.proc.returncode == 0
    assert not (Path(m.ssd) / RUNNING).exists()
    m2 = make_mount(ssd=str(m.ssd), capacity="16M")
    assert (m2.p("agent", "s1", "k")).stat().st_size == 100_000
    assert (Path(m2.ssd) / RUNNING).exists()
    assert not kill9(m2)
    assert (Path(m2.ssd) / RUNNING).exists()


def wait_warm(m, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = json.loads(m.ctl("stats.json").read_text())
        if st["warmup_done"]:
            return st
        time.sleep(0.05)
    raise AssertionError("warm-up did not finish")


def test_a_rename_before_the_newest_version_is_written_back_survives_a_crash_whole(
        make_mount):
    """A slot whose stored (fsync'd) version is large and whose newest one,
    in memory and not written back, is small, renamed, the directory
    fsync'd, then kill -9: the new name holds one of the two versions whole.
    The SSD tier copies its stored version under the new name; the metadata
    beside it must keep that version's logical size, not the newer one's
    (a restore then served the first bytes of the large version as a slot
    of the small one's size)."""
    from memosfs.testing.daemon import kill9
    m = make_mount(capacity="16M", writeback_delay_ms=600000)
    s = session(m)
    big, small = os.urandom(1 << 20), os.urandom(15181)
    (s / "k3").write_bytes(big)
    fd = os.open(s / "k3", os.O_RDONLY)
    os.fsync(fd)                                # (the large version on the SSD)
    os.close(fd)
    (s / "k3").write_bytes(small)               # (in memory, not written back)
    (s / "k5").write_bytes(b"replaced")
    os.rename(s / "k3", s / "k5")
    fd = os.open(s, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(fd)
    os.close(fd)
    assert (s / "k5").read_bytes() == small
    assert not kill9(m)
    m2 = make_mount(ssd=str(m.ssd), capacity="16M")
    got = m2.p("agent", "s1", "k5").read_bytes()
    assert got == big or got == small, (len(got), "the large version's first bytes",
                                        got == big[:len(got)])
    assert not m2.p("agent", "s1", "k3").exists()


def test_restart_keeps_slots_dirs_and_metadata(make_mount):
    m = make_mount(capacity="16M")
    s = session(m, "alice", "chat")
    os.chmod(m.p("alice"), 0o750)
    data = {f"t{i}": os.urandom(200_000 * (i + 1)) for i in range(4)}
    for name, payload in data.items():
        (s / name).write_bytes(payload)
    os.chmod(s / "t1", 0o600)
    os.setxattr(s / "t2", "user.note", b"kept")
    os.utime(s / "t3", ns=(5_000_000_000, 6_000_000_000))
    m.p("alice", "empty-session").mkdir()
    m2 = remount(make_mount, m, capacity="16M")
    s2 = m2.p("alice", "chat")
    assert sorted(os.listdir(s2)) == sorted(data)
    for name, payload in data.items():
        assert (s2 / name).read_bytes() == payload
    assert stat.S_IMODE(os.stat(m2.p("alice")).st_mode) == 0o750
    assert stat.S_IMODE(os.stat(s2 / "t1").st_mode) == 0o600
    assert os.getxattr(s2 / "t2", "user.note") == b"kept"
    assert os.stat(s2 / "t3").st_mtime_ns == 6_000_000_000
    assert m2.p("alice", "empty-session").is_dir()
    assert os.getxattr(s2 / "t0", "user.memos.version") == b"1"
    (s2 / "t0").write_bytes(b"v2")
    assert os.getxattr(s2 / "t0", "user.memos.version") == b"2"   # versions go on


def test_warmup_loads_most_recent_first(make_mount):
    m = make_mount(capacity="8M")
    s = session(m)
    for i in range(6):
        (s / f"s{i}").write_bytes(bytes([i]) * MiB)
    (s / "s2").read_bytes()                  # most recent, then s5, s4 ...
    (s / "s0").read_bytes()                  # ... no: s0 is the most recent now
    # 2 MiB of warm-up budget: exactly the two most recently used slots
    m2 = remount(make_mount, m, capacity="8M", warmup_ratio="0.25")
    st = wait_warm(m2)
    assert st["warmup_total_bytes"] == 2 * MiB
    s2 = m2.p("agent", "s1")
    tiers = {n: os.getxattr(s2 / n, "user.memos.tier").decode() for n in os.listdir(s2)}
    assert {n for n, t in tiers.items() if t == "mem"} == {"s0", "s2"}
    assert all(t == "ssd" for n, t in tiers.items() if n not in ("s0", "s2"))


def test_fsync_is_durable_across_kill_9(make_mount):
    m = make_mount(capacity="16M", writeback_delay_ms=3600000)
    s = session(m)
    payload = os.urandom(3 * MiB)
    with open(s / "durable", "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    (s / "volatile").write_bytes(b"not fsync'd")   # dirty, only in memory
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait(timeout=10)
    m.umount(lazy=True)
    assert not is_mounted(m.path)
    m2 = make_mount(ssd=str(m.ssd), capacity="16M")
    assert m2.p("agent", "s1", "durable").read_bytes() == payload
    assert not m2.p("agent", "s1", "volatile").exists()


def test_flush_and_clean_unmount_persist_everything(make_mount):
    m = make_mount(capacity="16M", writeback_delay_ms=3600000)
    s = session(m)
    (s / "a").write_bytes(b"a" * 1000)
    assert os.getxattr(s / "a", "user.memos.dirty") == b"1"
    assert subprocess.run(["sh", "-c", f"echo 1 > {m.ctl('flush')}"]).returncode == 0
    assert os.getxattr(s / "a", "user.memos.dirty") == b"0"
    (s / "b").write_bytes(b"b" * 1000)                # persisted by the unmount
    m2 = remount(make_mount, m)
    assert "unmount: 1 dirty slot written to the SSD tier" in m.logtext()
    assert m2.p("agent", "s1", "a").read_bytes() == b"a" * 1000
    assert m2.p("agent", "s1", "b").read_bytes() == b"b" * 1000


def test_background_writer_persists_after_the_delay(make_mount):
    m = make_mount(writeback_delay_ms=100, ssd_pack_below=0)
    s = session(m)
    (s / "a").write_bytes(b"z" * 4096)
    deadline = time.monotonic() + 10
    while os.getxattr(s / "a", "user.memos.dirty") != b"0":
        assert time.monotonic() < deadline, "never written back"
        time.sleep(0.05)
    assert len(slot_files(m.ssd)) == 1


def test_unlink_rename_and_reset_reach_the_ssd(make_mount):
    m = make_mount(capacity="16M", ssd_pack_below=0)
    s = session(m)
    for n in ("gone", "moved", "r1", "r2"):
        (s / n).write_bytes(n.encode() * 100)
    m.p("agent", "other").mkdir()
    m2 = remount(make_mount, m, warmup_ratio="0")     # everything on SSD only
    s2 = m2.p("agent", "s1")
    assert os.getxattr(s2 / "moved", "user.memos.tier") == b"ssd"
    os.unlink(s2 / "gone")
    os.rename(s2 / "moved", m2.p("agent", "other", "moved"))
    assert m2.p("agent", "other", "moved").read_bytes() == b"moved" * 100
    m3 = remount(make_mount, m2)
    assert sorted(os.listdir(m3.p("agent", "s1"))) == ["r1", "r2"]
    assert m3.p("agent", "other", "moved").read_bytes() == b"moved" * 100
    assert subprocess.run(["sh", "-c", f"echo agent/s1 > {m3.ctl('reset_context')}"]
                          ).returncode == 0
    m4 = remount(make_mount, m3)
    assert os.listdir(m4.p("agent", "s1")) == []
    assert len(slot_files(m4.ssd)) == 1


def test_corrupt_files_found_at_mount_are_reported_and_skipped(make_mount):
    m = make_mount(ssd_pack_below=0)
    s = session(m)
    (s / "good").write_bytes(b"g" * 5000)
    (s / "bad").write_bytes(b"b" * 5000)
    (s / "rotten").write_bytes(b"r" * 5000)
    m.stop()
    files = {}
    for f in slot_files(m.ssd):
        files[f.read_bytes()[:1]] = f
    files[b"b"].write_bytes(files[b"b"].read_bytes()[:3000])          # truncated
    raw = bytearray(files[b"r"].read_bytes())
    raw[100] ^= 0xFF                                                   # payload rot
    files[b"r"].write_bytes(bytes(raw))
    m2 = make_mount(ssd=str(m.ssd), warmup_ratio="0", ssd_pack_below=0)
    s2 = m2.p("agent", "s1")
    assert sorted(os.listdir(s2)) == ["good", "rotten"]
    assert m2.stats()["ssd_corrupt"] == 1
    with pytest.raises(OSError) as e:
        (s2 / "rotten").read_bytes()
    assert e.value.errno == errno.ENOENT
    assert m2.stats()["ssd_corrupt"] == 2
    assert "rotten" not in os.listdir(s2)
    assert (s2 / "good").read_bytes() == b"g" * 5000
    assert "payload checksum mismatch" in m2.logtext()
    assert "truncated" in m2.logtext() or "footer" in m2.logtext()


# ---------------------------------------------------------------- regressions


def _put(store, key, data):
    d = store.draft()
    d.write(0, data)
    store.publish(d, key).release()


def test_regression_stale_write_back_never_covers_a_newer_durable_version(tmp_path):
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path)))
    key = b"a/s/k"
    _put(store, key, b"v1" * 1000)
    stale = store.cache.peek(key)            # the background writer picked up v1 ...
    _put(store, key, b"v2" * 1000)
    store.persist(key)                       # ... v2 was fsync'd meanwhile
    store._write_back(stale, durable=False)  # ... then v1's write-back runs
    stale.release()
    assert store.ssd.get(key).version == 2
    store.cache.remove(key)
    ref = store.get(key)
    assert ref.version == 2 and ref.read(0, 4) == b"v2v2"
    ref.release()
    store.close()


def test_regression_write_back_after_unlink_does_not_bring_the_slot_back(tmp_path):
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path)))
    key = b"a/s/k"
    _put(store, key, b"x" * 1000)
    stale = store.cache.peek(key)
    store.remove(key)
    store._write_back(stale, durable=False)
    stale.release()
    assert key not in store.ssd and slot_files(tmp_path) == []
    store.close()
    assert SSDTier(str(tmp_path)).scan() == []


def test_metadata_change_rewrites_the_same_version(tmp_path):
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path)))
    meta = {"mode": 0o644}
    store.meta_of = lambda key: dict(meta)
    _put(store, b"a/s/k", b"x" * 100)
    store.flush()
    meta["mode"] = 0o600
    store.mark_dirty(b"a/s/k")
    store.flush()
    store.close()
    [e] = SSDTier(str(tmp_path)).scan()
    assert e.meta["mode"] == 0o600 and e.version == 1


def test_ssd_capacity_bounds_the_directory_on_a_mount(make_mount):
    m = make_mount(capacity="4M", ssd_capacity="3M", evict_batch=1, evict_policy="lru",
                   writeback_delay_ms=3600000)
    s = session(m)
    for i in range(8):
        (s / f"s{i}").write_bytes(bytes([i]) * (900 * 1024))
    st = m.stats()
    assert st["ssd_bytes"] <= 3 * MiB
    assert st["slots_lost"] > 0                       # beyond both tiers: gone
    names = sorted(os.listdir(s))
    assert "s7" in names and "s0" not in names          # the least recent went first
    assert len(names) * 900 * 1024 <= 7 * MiB           # what both tiers can hold
    tiers = {n: os.getxattr(s / n, "user.memos.tier") for n in names}
    assert set(tiers.values()) == {b"mem", b"ssd"}
    # (reading an SSD slot back promotes it, which may push another one out: a cache)
    assert (s / "s7").read_bytes() == bytes([7]) * (900 * 1024)
    assert subprocess.run(["sh", "-c", f"echo 10M > {m.ctl('ssd_capacity')}"]).returncode == 0
    assert m.ctl("ssd_capacity").read_text() == f"{10 * MiB}\n"


def test_write_back_nobody_acknowledged_skips_the_fsync_until_a_sync(tmp_path, cache, monkeypatch):
    """A version written back with no durable file under its name (eviction,
    the background writer) is not fsync'd; one that replaces a possibly
    durable file is, before its rename; sync_key (fsync of a slot) and sync
    (flush, unmount, fsync of a directory) fsync what was left unsynced."""
    synced: list[str] = []
    real = os.fsync

    def spy(fd):
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(".slot") or path.endswith(".tmp"):
            synced.append(path)
        real(fd)
    monkeypatch.setattr(os, "fsync", spy)
    tier = SSDTier(str(tmp_path))
    ref = _publish(cache, b"a/s/x", b"one")
    e1 = tier.put(ref, {}, durable=False)
    ref.release()
    assert synced == [] and e1.synced is False and tier.unsynced_writes == 1
    ref = _publish(cache, b"a/s/x", b"two")               # over an unsynced file
    e2 = tier.put(ref, {}, durable=False)
    ref.release()
    assert synced == [] and e2.synced is False
    tier.sync_key(b"a/s/x")
    assert [os.path.basename(p) for p in synced] == [os.path.basename(e2.path)]
    assert tier.get(b"a/s/x").synced is True
    synced.clear()
    ref = _publish(cache, b"a/s/x", b"three")             # over a durable file
    e3 = tier.put(ref, {}, durable=False)
    ref.release()
    assert len(synced) == 1 and synced[0].endswith(".tmp") and e3.synced is True
    synced.clear()
    ref = _publish(cache, b"a/s/y", b"other")
    ey = tier.put(ref, {}, durable=False)
    ref.release()
    assert synced == [] and ey.synced is False
    tier.sync()
    assert [os.path.basename(p) for p in synced] == [os.path.basename(ey.path)]
    assert tier.get(b"a/s/y").synced is True
    assert tier.statistics().ssd_writes_unsynced == 3
