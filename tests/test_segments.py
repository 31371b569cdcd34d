"""Small slots packed in segment files (memosfs/store/ssd/packed.py): the
records alone, restarts, tombstones, torn tails, corruption, compaction
and durability in process, then on real mounts.  The store-level tests of
tests/test_ssd.py run here again with packing on (imported below)."""

from __future__ import annotations

import errno
import logging
import os
import signal
from pathlib import Path

import pytest

from conftest import is_mounted
from memosfs import _native
from memosfs.store.ssd import packed as segments
from memosfs.store.ssd.packed import PackedEntry
from memosfs.store.ssd import CorruptSlot, SSDTier
from memosfs.store.store import Store
# the store-level tests of the SSD tier, with small slots packed this time
from test_ssd import (test_regression_stale_write_back_never_covers_a_newer_durable_version,  # noqa: F401
                      test_regression_write_back_after_unlink_does_not_bring_the_slot_back,  # noqa: F401
                      test_metadata_change_rewrites_the_same_version,  # noqa: F401
                      test_ssd_capacity_evicts_least_recent_ssd_slots)  # noqa: F401

MiB = 1 << 20


@pytest.fixture
def cache():
    c = _native.Cache(32 * MiB)
    yield c
    c.close()


def _publish(cache, key: bytes, data: bytes):
    d = cache.draft()
    d.write(0, data)
    return cache.publish(d, key)


def put(tier, cache, key: bytes, data: bytes, durable: bool = False, meta=None):
    ref = _publish(cache, key, data)
    try:
        return tier.put(ref, meta or {}, durable)
    finally:
        ref.release()


def load(tier, cache, key: bytes) -> bytes:
    e = tier.get(key)
    assert e is not None, key
    d = cache.draft()
    try:
        tier.load_into(e, d)
        return d.read(0, e.size)
    finally:
        d.free()


def reopen(root) -> SSDTier:
    t = SSDTier(str(root))
    t.scan()
    t.check()
    return t


def seg_files(root) -> list[Path]:
    return sorted(Path(root, "segments").glob("*.seg"))


def slot_files(root) -> list[Path]:
    return sorted(Path(root, "slots").glob("*/*.slot"))


# ---------------------------------------------------------------- packing


def test_small_slots_share_a_segment_and_large_ones_keep_a_file(tmp_path, cache):
    tier = SSDTier(str(tmp_path))
    blobs = {f"a/s/{i}".encode(): os.urandom(4096) for i in range(50)}
    for k, v in blobs.items():
        assert isinstance(put(tier, cache, k, v), PackedEntry)
    big = os.urandom(segments.PACK_BELOW)
    assert not isinstance(put(tier, cache, b"a/s/big", big), PackedEntry)
    assert len(seg_files(tmp_path)) == 1 and len(slot_files(tmp_path)) == 1
    tier.check()
    st = tier.statistics()
    assert (st.ssd_slots, st.ssd_packed, st.ssd_segments) == (51, 50, 1)
    # the records cost little beyond the slots' bytes
    assert st.ssd_segment_bytes < 1.2 * sum(len(v) for v in blobs.values())
    for k, v in blobs.items():
        assert load(tier, cache, k) == v
    assert load(tier, cache, b"a/s/big") == big


def test_restart_rebuilds_the_index_newest_version_first(tmp_path, cache):
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/k", b"one" * 100, meta={"mode": 0o600})
    put(tier, cache, b"a/s/k", b"two" * 100, meta={"mode": 0o640})
    put(tier, cache, b"a/s/empty", b"")
    tier.sync()
    again = reopen(tmp_path)
    e = again.get(b"a/s/k")
    assert isinstance(e, PackedEntry) and e.meta == {"mode": 0o640}
    assert load(again, cache, b"a/s/k") == b"two" * 100
    assert load(again, cache, b"a/s/empty") == b""
    assert sorted(again.keys()) == [b"a/s/empty", b"a/s/k"]
    # a new record after the restart is newer than every one before it
    put(again, cache, b"a/s/k", b"three")
    assert load(reopen(tmp_path), cache, b"a/s/k") == b"three"


def test_an_older_directory_of_slot_files_is_read_and_taken_over(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(segments, "PACK_BELOW", 0)
    old = SSDTier(str(tmp_path))
    put(old, cache, b"a/s/keep", b"k" * 3000)
    put(old, cache, b"a/s/over", b"o" * 3000)
    monkeypatch.undo()
    tier = reopen(tmp_path)
    assert not isinstance(tier.get(b"a/s/keep"), PackedEntry)
    assert load(tier, cache, b"a/s/keep") == b"k" * 3000
    put(tier, cache, b"a/s/over", b"new")          # packed now: its file goes
    assert isinstance(tier.get(b"a/s/over"), PackedEntry)
    assert len(slot_files(tmp_path)) == 1
    again = reopen(tmp_path)
    assert load(again, cache, b"a/s/over") == b"new"
    assert load(again, cache, b"a/s/keep") == b"k" * 3000


def test_a_file_left_beside_a_newer_record_loses_to_it(tmp_path, cache, monkeypatch):
    """An older memosfs's file (no seq) and a record of the same key: the
    record wins and the file goes at mount (the unlink a crash lost)."""
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/k", b"packed")
    monkeypatch.setattr(segments, "PACK_BELOW", 0)
    other = SSDTier(str(tmp_path / "other"))
    put(other, cache, b"a/s/k", b"an old file")
    [f] = slot_files(tmp_path / "other")
    dest = tmp_path / "slots" / f.parent.name / f.name
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.rename(f, dest)
    monkeypatch.undo()
    again = reopen(tmp_path)
    assert load(again, cache, b"a/s/k") == b"packed" and not dest.exists()


def test_a_slot_that_grows_past_the_threshold_and_is_removed_stays_gone(tmp_path, cache):
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/k", b"small")
    put(tier, cache, b"a/s/k", os.urandom(segments.PACK_BELOW + 1))     # a file now
    assert load(reopen(tmp_path), cache, b"a/s/k") != b"small"
    tier.remove(b"a/s/k")
    assert reopen(tmp_path).get(b"a/s/k") is None      # the small record stays dead
    put(tier, cache, b"a/s/k", os.urandom(segments.PACK_BELOW + 1))
    put(tier, cache, b"a/s/k", b"small again")          # the file goes
    assert slot_files(tmp_path) == []
    assert load(reopen(tmp_path), cache, b"a/s/k") == b"small again"


def test_ssd_capacity_evicts_packed_slots_in_policy_order_and_they_stay_gone(tmp_path):
    store = Store(64 * MiB, ssd=SSDTier(str(tmp_path), capacity=MiB + MiB // 2))
    dropped = []
    store.on_drop(lambda key, why: dropped.append(key))
    for i in range(30):                         # 30 x 60 KB > 1.5 MiB, each one packed
        k = f"a/s/{i}".encode()
        d = store.draft()
        d.write(0, bytes([i]) * 60_000)
        store.publish(d, k).release()
        store.flush()
        store.cache.remove(k)                   # only the SSD holds it
    st = store.ssd.statistics()
    assert st.ssd_packed == st.ssd_slots and st.ssd_bytes <= MiB + MiB // 2
    assert dropped and dropped == [f"a/s/{i}".encode() for i in range(len(dropped))]
    assert st.ssd_tombstones == len(dropped)
    store.ssd.check()
    kept = sorted(store.ssd.keys())
    store.close()
    assert sorted(reopen(tmp_path).keys()) == kept      # the evicted stay evicted


def test_the_knob_turns_packing_off(tmp_path, cache):
    tier = SSDTier(str(tmp_path))
    tier.segs.pack_below = 0
    assert not isinstance(put(tier, cache, b"a/s/k", b"x" * 10), PackedEntry)
    assert len(slot_files(tmp_path)) == 1 and seg_files(tmp_path) == []


# ---------------------------------------------------------------- tombstones


def test_removed_slots_stay_removed_after_a_restart(tmp_path, cache):
    tier = SSDTier(str(tmp_path))
    for i in range(5):
        put(tier, cache, f"a/s/{i}".encode(), bytes([i]) * 100)
    assert tier.remove(b"a/s/1") and tier.remove(b"a/s/3", evicted=True)
    assert tier.statistics().ssd_tombstones == 2
    again = reopen(tmp_path)
    assert sorted(again.keys()) == [b"a/s/0", b"a/s/2", b"a/s/4"]
    # and a slot made again under a removed name is the new one
    put(again, cache, b"a/s/1", b"back")
    assert load(reopen(tmp_path), cache, b"a/s/1") == b"back"


def test_rename_moves_the_record_and_the_old_name_stays_gone(tmp_path, cache):
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/old", b"payload" * 10)
    put(tier, cache, b"a/s/new", b"replaced")
    moved = tier.rename(b"a/s/old", b"a/s/new", {"mode": 0o600})
    assert isinstance(moved, PackedEntry) and moved.synced is True
    assert tier.get(b"a/s/old") is None
    tier.check()
    again = reopen(tmp_path)
    assert again.keys() == [b"a/s/new"]
    assert load(again, cache, b"a/s/new") == b"payload" * 10


def test_a_rename_cut_short_before_its_tombstone_is_completed_at_mount(tmp_path, cache,
                                                                       monkeypatch):
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/old", b"payload")
    monkeypatch.setattr(tier.segs, "tombstone", lambda key, sync=False: None)  # the crash
    tier.rename(b"a/s/old", b"a/s/new", {})
    again = reopen(tmp_path)
    assert again.keys() == [b"a/s/new"]
    # the completion is recorded: a later version of new (no moved_from)
    # does not bring old back
    put(again, cache, b"a/s/new", b"rewritten")
    assert reopen(tmp_path).keys() == [b"a/s/new"]


def test_a_later_slot_under_the_old_name_is_not_taken_for_a_leftover(tmp_path, cache):
    """moved_from names the old record by its seq: a slot made under the old
    name after the rename (same version, same bytes) is not completed away."""
    tier = SSDTier(str(tmp_path))
    ref = _publish(cache, b"a/s/a", b"same")
    tier.put(ref, {}, durable=True)
    ref.release()
    tier.rename(b"a/s/a", b"a/s/b", {})
    d = cache.draft()
    d.write(0, b"same")
    ref = cache.publish(d, b"a/s/a", version=1)
    tier.put(ref, {}, durable=True)
    ref.release()
    assert sorted(reopen(tmp_path).keys()) == [b"a/s/a", b"a/s/b"]


# ---------------------------------------------------------------- crashes and damage


def test_a_torn_tail_is_ignored_and_the_previous_version_wins(tmp_path, cache, caplog):
    caplog.set_level(logging.INFO, logger="memosfs.store.ssd")
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/k", b"v1" * 500)
    put(tier, cache, b"a/s/j", b"j" * 100)
    put(tier, cache, b"a/s/k", b"v2" * 500)            # the write the crash cuts
    [seg] = seg_files(tmp_path)
    raw = seg.read_bytes()
    seg.write_bytes(raw[:len(raw) - 700])
    again = reopen(tmp_path)
    assert load(again, cache, b"a/s/k") == b"v1" * 500
    assert load(again, cache, b"a/s/j") == b"j" * 100
    assert again.corrupt == 0 and "not a whole record" in caplog.text
    # the torn end is cut off and the segment sealed: the next mount is quiet
    assert seg.stat().st_size == again.get(b"a/s/j").off + again.get(b"a/s/j").file_bytes
    caplog.clear()
    assert reopen(tmp_path).corrupt == 0 and "not a whole record" not in caplog.text


def test_damage_inside_a_sealed_segment_is_counted_and_set_aside(tmp_path, cache,
                                                                  small_segments):
    tier = SSDTier(str(tmp_path))
    for i in range(40):                         # 40 x 3 KB: the first segment is sealed
        put(tier, cache, f"a/s/{i}".encode(), bytes([i]) * 3000)
    first, *rest = seg_files(tmp_path)
    assert rest and first.read_bytes()[8] == segments.SEALED
    e = tier.get(b"a/s/3")
    assert e.path == str(first)
    raw = bytearray(first.read_bytes())
    raw[e.off] ^= 0xFF                          # a record header goes bad
    first.write_bytes(bytes(raw))
    again = reopen(tmp_path)
    assert again.corrupt == 1
    assert (tmp_path / "corrupt" / f"{first.name}@{e.off}.rec").exists()
    assert again.get(b"a/s/3") is None          # and the rest of that segment with it
    last = f"a/s/{39}".encode()
    assert load(again, cache, last) == bytes([39]) * 3000


def test_a_rotten_record_is_set_aside_at_mount_once(tmp_path, cache):
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/k", b"v1" * 500)
    put(tier, cache, b"a/s/k", b"v2" * 500)
    put(tier, cache, b"a/s/j", b"j" * 100)
    e = tier.get(b"a/s/k")
    [seg] = seg_files(tmp_path)
    raw = bytearray(seg.read_bytes())
    raw[e.data_off + 10] ^= 0xFF
    seg.write_bytes(bytes(raw))
    again = reopen(tmp_path)
    assert again.corrupt == 1
    assert load(again, cache, b"a/s/k") == b"v1" * 500     # the version before it
    assert load(again, cache, b"a/s/j") == b"j" * 100
    assert [p.name for p in (tmp_path / "corrupt").iterdir()] == [f"{seg.name}@{e.off}.rec"]
    assert reopen(tmp_path).corrupt == 0                    # counted once


def test_a_record_that_rots_after_mount_is_never_served_and_stays_gone(tmp_path, cache):
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/k", b"k" * 1000)
    put(tier, cache, b"a/s/j", b"j" * 1000)
    e = tier.get(b"a/s/k")
    with open(e.path, "r+b") as f:
        f.seek(e.data_off)
        f.write(b"X")
    d = cache.draft()
    with pytest.raises(CorruptSlot, match="payload checksum mismatch"):
        tier.load_into(e, d)
    d.free()
    assert tier.report_corrupt(e, "test") is True
    assert tier.get(b"a/s/k") is None and tier.corrupt == 1
    tier.check()
    again = reopen(tmp_path)
    assert again.keys() == [b"a/s/j"]


def test_a_store_drops_a_rotten_packed_slot(tmp_path):
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path)))
    dropped = []
    store.on_drop(lambda key, why: dropped.append((key, why)))
    d = store.draft()
    d.write(0, b"x" * 5000)
    store.publish(d, b"a/s/x").release()
    assert store.flush() == 1
    store.cache.remove(b"a/s/x")
    e = store.ssd.get(b"a/s/x")
    with open(e.path, "r+b") as f:
        f.seek(e.data_off)
        f.write(b"\0")
    assert store.get(b"a/s/x") is None
    assert dropped == [(b"a/s/x", "corrupt")] and store.ssd.corrupt == 1
    store.close()


def test_get_resident_promotes_a_cached_record_and_leaves_the_rest_to_get(tmp_path):
    """The event loop's read back: a packed record the page cache holds is
    promoted at once; a rotten one is not served, and get() then reports it."""
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path)))
    for k in (b"a/s/x", b"a/s/y"):
        d = store.draft()
        d.write(0, k * 1000)
        store.publish(d, k).release()
    assert store.flush() == 2
    for k in (b"a/s/x", b"a/s/y"):
        store.cache.remove(k)
    ref = store.get_resident(b"a/s/x")
    assert ref is not None and ref.read(0, ref.size) == b"a/s/x" * 1000 and not ref.dirty
    ref.release()
    st = store.statistics()
    assert (st.ssd_hits, st.promotions) == (1, 1)
    assert store.tier_of(b"a/s/x") == "mem"
    e = store.ssd.get(b"a/s/y")
    with open(e.path, "r+b") as f:
        f.seek(e.data_off)
        f.write(b"!")
    assert store.get_resident(b"a/s/y") is None
    assert store.statistics().ssd_hits == 1 and store.ssd.corrupt == 0
    assert store.get(b"a/s/y") is None and store.ssd.corrupt == 1
    assert store.get_resident(b"a/s/big") is None       # nothing there: get() says so
    store.close()


def test_a_failed_append_changes_nothing_and_never_comes_back(tmp_path, cache, monkeypatch):
    """ENOSPC halfway through a record: the put fails, the index keeps the
    previous version, and the half record is taken back (a restart does not
    find it, and the next append is whole)."""
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/k", b"old" * 100)
    [seg] = seg_files(tmp_path)
    size = seg.stat().st_size
    real = os.pwrite

    def half(fd, data, off):
        real(fd, bytes(data)[:len(data) // 2], off)
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(segments.os, "pwrite", half)
    with pytest.raises(OSError) as e:
        put(tier, cache, b"a/s/k", b"new" * 100, durable=True)
    assert e.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert seg.stat().st_size == size and tier.statistics().ssd_write_errors == 1
    assert load(tier, cache, b"a/s/k") == b"old" * 100
    tier.check()
    assert load(reopen(tmp_path), cache, b"a/s/k") == b"old" * 100
    put(tier, cache, b"a/s/j", b"after")
    again = reopen(tmp_path)
    assert load(again, cache, b"a/s/j") == b"after" and again.corrupt == 0


# ---------------------------------------------------------------- compaction


@pytest.fixture
def small_segments(monkeypatch):
    monkeypatch.setattr(segments, "SEGMENT_BYTES", 64 << 10)
    monkeypatch.setattr(segments, "COMPACT_SMALL", 0)
    monkeypatch.setattr(segments, "COMPACT_GAP_S", 0.0)


def test_compaction_rewrites_sparse_segments_and_loses_nothing(tmp_path, cache, small_segments):
    tier = SSDTier(str(tmp_path))
    want = {}
    for rnd in range(6):                        # every key rewritten: old segments go dead
        for i in range(20):
            k = f"a/s/{i}".encode()
            want[k] = os.urandom(3000)
            put(tier, cache, k, want[k])
    for i in range(0, 20, 4):                   # some removed: their tombstones matter
        k = f"a/s/{i}".encode()
        tier.remove(k)
        del want[k]
    before = len(seg_files(tmp_path))
    assert tier.segs.maintain() > 0
    assert len(seg_files(tmp_path)) < before and tier.statistics().ssd_compactions > 0
    tier.check()
    for k, v in want.items():
        assert load(tier, cache, k) == v
    again = reopen(tmp_path)
    assert sorted(again.keys()) == sorted(want)
    for k, v in want.items():
        assert load(again, cache, k) == v


def test_a_damaged_record_compacted_away_leaves_the_count_of_its_keys_records(
        tmp_path, cache, small_segments):
    """A record whose payload fails its checksum at mount is set aside and
    its key falls back to its record before; a compaction then drops the
    damaged one as dead.  The key's count of records must still include
    the older one, or its removal writes no tombstone and the older record
    comes back at the next mount."""
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/k", b"one" * 500, durable=True)
    e = put(tier, cache, b"a/s/k", b"two" * 500, durable=True)
    for i in range(30):                     # more segments, so the damaged one is sealed
        put(tier, cache, f"a/s/o{i}".encode(), os.urandom(3000), durable=True)
    tier.segs.close()
    raw = bytearray(Path(e.path).read_bytes())
    raw[e.data_off + 7] ^= 0xFF
    Path(e.path).write_bytes(bytes(raw))
    tier = SSDTier(str(tmp_path))
    tier.scan()
    assert tier.corrupt == 1 and load(tier, cache, b"a/s/k") == b"one" * 500
    for i in range(30):                     # the segment goes dead, and is compacted
        tier.remove(f"a/s/o{i}".encode())
    assert tier.segs.maintain() > 0
    tier.check()
    tier.remove(b"a/s/k")
    tier.sync()
    tier.segs.close()
    assert b"a/s/k" not in reopen(tmp_path).keys()


def test_a_compaction_cut_short_before_the_old_segments_went(tmp_path, cache, small_segments):
    """The new segment is in place and the old ones still there (the crash
    came before their unlink): every record twice, the same result."""
    tier = SSDTier(str(tmp_path))
    for rnd in range(4):
        for i in range(20):
            put(tier, cache, f"a/s/{i}".encode(), bytes([rnd, i]) * 1500)
    tier.remove(b"a/s/0")
    saved = {p.name: p.read_bytes() for p in seg_files(tmp_path)}
    assert tier.segs.maintain() > 0
    for name, raw in saved.items():             # the old segments come back
        (tmp_path / "segments" / name).write_bytes(raw)
    again = reopen(tmp_path)
    assert sorted(again.keys()) == sorted(f"a/s/{i}".encode() for i in range(1, 20))
    for i in range(1, 20):
        assert load(again, cache, f"a/s/{i}".encode()) == bytes([3, i]) * 1500


def test_a_reader_of_a_compacted_segment_is_told_to_look_again(tmp_path, cache, small_segments):
    from memosfs.store.ssd import StaleEntry
    tier = SSDTier(str(tmp_path))
    for rnd in range(3):
        for i in range(30):
            put(tier, cache, f"a/s/{i}".encode(), bytes([rnd]) * 3000)
    old = tier.get(b"a/s/0")
    for i in range(30):
        put(tier, cache, f"a/s/{i}".encode(), b"new" * 1000)
    assert tier.segs.maintain() > 0
    d = cache.draft()
    with pytest.raises(StaleEntry):
        tier.load_into(old, d)
    d.free()
    assert load(tier, cache, b"a/s/0") == b"new" * 1000


def test_compaction_racing_writers_and_readers(tmp_path, small_segments, monkeypatch):
    """Writers rewrite and remove keys, compaction runs again and again, and
    readers load what the index names: every read is a whole version of its
    key (or a stale entry, looked up again), and the end state survives a
    restart."""
    import threading
    from memosfs.store.ssd import StaleEntry
    # every call of maintain looks (not once per COMPACT_GAP_S: a writer that
    # finishes within one gap would race no compaction at all)
    monkeypatch.setattr(segments, "COMPACT_GAP_S", 0.0)
    cache = _native.Cache(64 * MiB)
    tier = SSDTier(str(tmp_path))
    keys = [f"a/s/{i}".encode() for i in range(24)]
    last: dict[bytes, bytes] = {}
    stop = threading.Event()
    errors: list[str] = []

    def body(k: bytes, n: int) -> bytes:
        return (k + b"#%d#" % n) * 200

    def writer():
        try:
            for n in range(40):
                for i, k in enumerate(keys):
                    if (n + i) % 7 == 0:
                        tier.remove(k)
                        last.pop(k, None)
                    else:
                        put(tier, cache, k, body(k, n))
                        last[k] = body(k, n)
        except Exception as e:          # reported below
            errors.append(f"writer: {e!r}")
        finally:
            stop.set()

    def compactor():
        while not stop.is_set():
            tier.segs._changed = True
            tier.segs.maintain()
            stop.wait(0.001)

    def reader():
        d = cache.draft()
        try:
            while not stop.is_set():
                for k in keys:
                    e = tier.get(k)
                    if e is None:
                        continue
                    try:
                        tier.load_into(e, d)
                    except StaleEntry:
                        continue
                    got = d.read(0, e.size)
                    if not got.startswith(k + b"#") or got != got[:len(got) // 200] * 200:
                        errors.append(f"reader: {k!r} read {got[:40]!r}")
        except Exception as e:
            errors.append(f"reader: {e!r}")
        finally:
            d.free()

    threads = [threading.Thread(target=f) for f in (writer, compactor, reader)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors[:5]
    # (whether the compactor got the interpreter during the race is the
    # scheduler's; the dead records it leaves are compacted now in any case)
    tier.segs._changed = True
    tier.segs.maintain()
    assert tier.statistics().ssd_compactions > 0
    tier.check()
    again = reopen(tmp_path)
    assert sorted(again.keys()) == sorted(last)
    for k, v in last.items():
        assert load(again, cache, k) == v
    cache.close()


# ---------------------------------------------------------------- durability


def test_durable_writes_fdatasync_their_segment_and_others_wait_for_a_sync(tmp_path, cache,
                                                                          monkeypatch):
    synced: list[str] = []
    real = os.fdatasync

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)
    monkeypatch.setattr(segments.os, "fdatasync", spy)
    tier = SSDTier(str(tmp_path))
    e = put(tier, cache, b"a/s/x", b"one")
    # (only the new segment's header, fdatasync'd before its rename into place)
    assert [p.endswith(".seg.tmp") for p in synced] == [True]
    assert e.synced is False and tier.unsynced_writes == 1
    synced.clear()
    e = put(tier, cache, b"a/s/y", b"two", durable=True)
    assert len(synced) == 1 and synced[0].endswith(".seg") and e.synced is True
    synced.clear()
    put(tier, cache, b"a/s/x", b"three")
    tier.sync_key(b"a/s/x")
    assert len(synced) == 1 and tier.get(b"a/s/x").synced is True
    synced.clear()
    tier.remove(b"a/s/y")                       # a tombstone: durable at the next sync
    assert synced == []
    tier.sync_dirs()
    assert len(synced) == 1
    synced.clear()
    tier.sync()                                 # nothing left to sync
    assert synced == []


def test_a_record_replacing_a_durable_file_is_synced_before_the_file_goes(tmp_path, cache,
                                                                         monkeypatch):
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/k", os.urandom(segments.PACK_BELOW), durable=True)
    [f] = slot_files(tmp_path)
    put(tier, cache, b"a/s/other", b"x")        # (the segment is there: its creation syncs)
    order: list[str] = []
    real_sync, real_unlink = os.fdatasync, os.unlink
    monkeypatch.setattr(segments.os, "fdatasync", lambda fd: (order.append("sync"),
                                                               real_sync(fd)))
    monkeypatch.setattr(os, "unlink", lambda p: (order.append(os.path.basename(p)),
                                                 real_unlink(p)))
    e = put(tier, cache, b"a/s/k", b"small now")
    assert e.synced is True and order == ["sync", f.name]


# ---------------------------------------------------------------- mounted


def session(m, agent="agent", sess="s1"):
    m.p(agent).mkdir(exist_ok=True)
    m.p(agent, sess).mkdir(exist_ok=True)
    return m.p(agent, sess)


def remount(make_mount, m, **opts):
    m.stop()
    assert m.proc.returncode == 0, m.logtext()[-2000:]
    return make_mount(ssd=str(m.ssd), **opts)


def test_mounted_small_slots_come_back_from_segments(make_mount):
    m = make_mount(capacity="16M", writeback_delay_ms=3600000)
    s = session(m)
    blobs = {f"k{i}": os.urandom(4096) for i in range(200)}
    for n, v in blobs.items():
        (s / n).write_bytes(v)
    (s / "big").write_bytes(b"B" * (1 << 20))
    m2 = remount(make_mount, m, warmup_ratio="0")
    s2 = m2.p("agent", "s1")
    assert slot_files(m2.ssd) and len(slot_files(m2.ssd)) == 1      # only the large one
    assert seg_files(m2.ssd)
    st = m2.stats()
    assert st["ssd_packed"] == 200 and st["ssd_slots"] == 201
    for n, v in blobs.items():
        assert os.getxattr(s2 / n, "user.memos.tier") == b"ssd"
        assert (s2 / n).read_bytes() == v
    assert (s2 / "big").read_bytes() == b"B" * (1 << 20)


def test_mounted_unlink_and_rename_survive_a_remount(make_mount):
    m = make_mount(capacity="16M")
    s = session(m)
    for n in ("gone", "moved", "kept", "over"):
        (s / n).write_bytes(n.encode() * 300)
    m2 = remount(make_mount, m, warmup_ratio="0")      # all of them on the SSD only
    s2 = m2.p("agent", "s1")
    os.unlink(s2 / "gone")
    os.rename(s2 / "moved", s2 / "over")
    m2.p("agent", "s2").mkdir()
    os.rename(s2 / "kept", m2.p("agent", "s2", "kept"))
    m3 = remount(make_mount, m2, warmup_ratio="0")
    assert sorted(os.listdir(m3.p("agent", "s1"))) == ["over"]
    assert (m3.p("agent", "s1", "over")).read_bytes() == b"moved" * 300
    assert m3.p("agent", "s2", "kept").read_bytes() == b"kept" * 300
    assert m3.stats()["ssd_slots"] == 2


def test_mounted_fsync_of_a_small_slot_survives_kill_9(make_mount):
    m = make_mount(capacity="16M", writeback_delay_ms=3600000)
    s = session(m)
    fd = os.open(s / "durable", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"d" * 4096)
    os.fsync(fd)
    os.close(fd)
    (s / "removed").write_bytes(b"r" * 100)
    rfd = os.open(s / "removed", os.O_RDONLY)
    os.fsync(rfd)
    os.close(rfd)
    os.unlink(s / "removed")
    dfd = os.open(s, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.close(dfd)
    m.proc.send_signal(signal.SIGKILL)
    m.proc.wait()
    m.umount(lazy=True)
    assert not is_mounted(m.path)
    m2 = make_mount(ssd=str(m.ssd), capacity="16M")
    s2 = m2.p("agent", "s1")
    assert (s2 / "durable").read_bytes() == b"d" * 4096
    assert not (s2 / "removed").exists()
    with pytest.raises(OSError) as e:
        os.stat(s2 / "removed")
    assert e.value.errno == errno.ENOENT


def _requests(m) -> dict[str, int]:
    out = {}
    for line in (m.path / ".memos/debug/requests").read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def test_mounted_first_read_of_a_packed_slot_is_answered_at_once(make_mount):
    """After a remount, a small slot whose record the page cache holds is
    promoted by the open itself, on the shim's fast path: the reader's close
    then sends no FLUSH (as for a slot in memory), and the bytes are the
    slot's.  A record the page cache lost still comes back (off the loop).
    (The default mode: a passthrough mount's opens of SSD slots go their own
    way, docs/semantics.md.)"""
    m = make_mount(capacity="16M", writeback_delay_ms=3600000, passthrough=0)
    s = session(m)
    blobs = {f"k{i}": os.urandom(4096 + i) for i in range(60)}
    for n, v in blobs.items():
        (s / n).write_bytes(v)
    m2 = remount(make_mount, m, warmup_ratio="0", passthrough=0)
    s2 = m2.p("agent", "s1")
    names = sorted(blobs)
    for n in names:                             # lookups first: dentries cached
        os.stat(s2 / n)
    before = _requests(m2)
    for n in names[:40]:
        assert os.getxattr(s2 / n, "user.memos.tier") == b"ssd"
        with open(s2 / n, "rb") as f:
            assert f.read() == blobs[n]
    after = _requests(m2)
    # (the requests file's own open and close count once)
    assert after.get("open", 0) - before.get("open", 0) == 41
    assert after.get("flush", 0) - before.get("flush", 0) <= 1
    assert m2.stats()["ssd_hits"] >= 40
    # the rest, their segment dropped from the page cache: read back off the loop
    for seg in seg_files(m2.ssd):
        fd = os.open(seg, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    for n in names[40:]:
        assert (s2 / n).read_bytes() == blobs[n]
