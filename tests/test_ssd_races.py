"""Regressions: the SSD tier's readers never pair an index entry with another
version's file, and a valid file is never set aside as corrupt.

A read back from the SSD tier once paired the old index entry with the new
file a concurrent write had just renamed into place, failed the payload
checksum, and set aside the new, valid file (the only durable copy of an
acknowledged version); the name then answered ENOENT.  The `renamed` fault
hook stops a write at that point to make the window reachable at will.
These are races of the per-slot files, so the tiers here pack nothing
(tests/test_segments.py has the packed records' own).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from memosfs import _native
from memosfs.store.reads import _RACED
from memosfs.store.ssd import SSDTier
from memosfs.store.store import Store

MiB = 1 << 20
KEY = b"a/s/k"


@pytest.fixture(autouse=True)
def files_only(monkeypatch):
    import memosfs.store.ssd.packed as segments
    monkeypatch.setattr(segments, "PACK_BELOW", 0)


def _store_with_ssd_only_version(tmp_path: Path, data: bytes) -> Store:
    """A store whose KEY is on the SSD tier only (as after an eviction)."""
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path / "ssd")))
    d = store.draft()
    d.write(0, data)
    store.publish(d, KEY).release()
    assert store.flush() == 1
    store.cache.remove(KEY)
    assert store.tier_of(KEY) == "ssd"
    return store


def _version_elsewhere(data: bytes, version: int):
    """A pinned version of KEY made in a cache of its own (what another
    writer hands the SSD tier)."""
    cache = _native.Cache(8 * MiB)
    d = cache.draft()
    d.write(0, data)
    return cache, cache.publish(d, KEY, version=version)


def _corrupt_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "ssd" / "corrupt").glob("*"))


def test_a_read_during_a_write_back_rename_never_sets_the_new_file_aside(tmp_path):
    old, new = b"o" * 300_000, b"n" * 200_000
    store = _store_with_ssd_only_version(tmp_path, old)
    cache, ref = _version_elsewhere(new, version=store.ssd.get(KEY).version + 1)
    got: list = []

    def reader():
        r = store.get(KEY)
        got.append(None if r is None else r.read(0, r.size))
        if r is not None:
            r.release()

    def in_the_window():
        # the new file is under the name now: a reader comes in
        t = threading.Thread(target=reader)
        t.start()
        t.join(0.5)         # (it waits for the index: it must not run ahead)
        readers.append(t)

    readers: list[threading.Thread] = []
    store.ssd.hooks["renamed"] = in_the_window
    try:
        store.ssd.put(ref, {}, durable=True)
    finally:
        store.ssd.hooks.clear()
    readers[0].join(10)
    ref.release()
    cache.close()
    assert store.ssd.corrupt == 0 and _corrupt_files(tmp_path) == []
    assert got == [new]
    again = store.get(KEY)
    assert again is not None and again.read(0, again.size) == new
    again.release()
    store.close()


def test_a_rename_of_the_key_in_the_window_is_no_corruption_either(tmp_path):
    data = os.urandom(100_000)
    store = _store_with_ssd_only_version(tmp_path, data)
    target = b"a/s/t"
    d = store.draft()
    d.write(0, b"t" * 5000)
    store.publish(d, target).release()
    store.flush()
    store.cache.remove(target)
    got: list = []

    def in_the_window():
        t = threading.Thread(target=lambda: got.append(store.get(target)))
        t.start()
        t.join(0.5)
        threads.append(t)

    threads: list[threading.Thread] = []
    store.ssd.hooks["renamed"] = in_the_window
    try:
        store.ssd.rename(KEY, target, {})
    finally:
        store.ssd.hooks.clear()
    threads[0].join(10)
    [ref] = got
    assert ref is not None and ref.read(0, ref.size) == data
    ref.release()
    assert store.ssd.corrupt == 0 and _corrupt_files(tmp_path) == []
    store.close()


def test_a_reader_holding_an_older_entry_looks_again(tmp_path):
    store = _store_with_ssd_only_version(tmp_path, b"1" * 70_000)
    held = store.ssd.get(KEY)
    cache, ref = _version_elsewhere(b"2" * 90_000, version=held.version + 1)
    store.ssd.put(ref, {}, durable=False)
    ref.release()
    cache.close()
    assert store._promote_entry(KEY, held) is _RACED
    fresh = store.get(KEY)
    assert fresh.read(0, fresh.size) == b"2" * 90_000
    fresh.release()
    assert store.ssd.corrupt == 0
    store.close()


def test_an_index_behind_its_valid_file_follows_the_file(tmp_path):
    """report_corrupt reads the file's own trailer first: a valid file of the
    key is taken into the index, never set aside."""
    store = _store_with_ssd_only_version(tmp_path, b"1" * 70_000)
    held = store.ssd.get(KEY)
    other = SSDTier(str(tmp_path / "ssd"))      # writes behind this tier's back
    other.scan()
    cache, ref = _version_elsewhere(b"3" * 40_000, version=held.version + 2)
    other.put(ref, {}, durable=True)
    ref.release()
    cache.close()
    assert store.ssd.report_corrupt(held, "payload checksum mismatch") is False
    assert store.ssd.get(KEY).version == held.version + 2
    assert store.ssd.corrupt == 0 and _corrupt_files(tmp_path) == []
    got = store.get(KEY)
    assert got.read(0, got.size) == b"3" * 40_000
    got.release()
    store.close()


def test_a_corrupt_file_is_set_aside_and_counted_once(tmp_path):
    store = _store_with_ssd_only_version(tmp_path, b"x" * 50_000)
    entry = store.ssd.get(KEY)
    with open(entry.path, "r+b") as f:          # damage in place: same inode
        f.seek(100)
        f.write(b"y")
    assert store.ssd.report_corrupt(entry, "payload checksum mismatch") is True
    assert store.ssd.report_corrupt(entry, "payload checksum mismatch") is False
    assert store.ssd.corrupt == 1 and len(_corrupt_files(tmp_path)) == 1
    assert store.get(KEY) is None
    store.close()


def _put(tier: SSDTier, cache, key: bytes, data: bytes, version: int = 0):
    d = cache.draft()
    d.write(0, data)
    ref = cache.publish(d, key, version=version) if version else cache.publish(d, key)
    entry = tier.put(ref, {}, durable=True)
    ref.release()
    return entry


def test_a_crash_inside_a_rename_leaves_the_slot_under_one_name(tmp_path, monkeypatch):
    """kill -9 between the copy's rename into place and the unlink of the old
    file once left the content under both names after remount (ext4 leaves
    exactly one).  The next scan completes the rename."""
    cache = _native.Cache(8 * MiB)
    tier = SSDTier(str(tmp_path / "ssd"))
    _put(tier, cache, b"a/s/a", b"A" * 3000)
    _put(tier, cache, b"a/s/b", b"B" * 5000)
    monkeypatch.setattr(tier, "_unlink_locked", lambda path: None)   # killed here
    tier.rename(b"a/s/a", b"a/s/b", {})
    monkeypatch.undo()
    again = SSDTier(str(tmp_path / "ssd"))
    entries = {e.key: e for e in again.scan()}
    assert sorted(entries) == [b"a/s/b"]
    d = cache.draft()
    again.load_into(entries[b"a/s/b"], d)
    assert d.read(0, 10_000) == b"A" * 3000
    d.free()
    cache.close()


def test_a_later_slot_under_the_old_name_is_not_taken_for_a_leftover(tmp_path):
    """The mark names the old file by inode and ctime: a slot made under the
    old name after the rename (even with the same version and bytes) stays."""
    cache = _native.Cache(8 * MiB)
    tier = SSDTier(str(tmp_path / "ssd"))
    _put(tier, cache, b"a/s/a", b"", version=1)
    tier.rename(b"a/s/a", b"a/s/b", {})
    _put(tier, cache, b"a/s/a", b"", version=1)        # same version, same (no) bytes
    again = SSDTier(str(tmp_path / "ssd"))
    assert sorted(e.key for e in again.scan()) == [b"a/s/a", b"a/s/b"]
    cache.close()
