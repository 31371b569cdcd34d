"""Overlay drafts (memosfs/store/spill.py): a draft that starts from a
version the SSD tier holds in a slot file, larger than the memory tier can
take, copies nothing; its spill file holds the bytes written since, and its
publish appends them to the slot's extent log (what changed is what is
written), or, when the base was replaced meanwhile or the change is large,
copies the base's bytes in first and publishes the slot whole."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from memosfs import _native
from memosfs.store.ssd import SSDReader, SSDTier
from memosfs.store.store import Store
from test_spill import _mount, _spill_files

KiB, MiB = 1 << 10, 1 << 20


def _bytes(seed: int, n: int) -> bytes:
    return random.Random(seed).randbytes(n)


def _version(store: Store, key: bytes) -> bytes:
    r = SSDReader(store.ssd.get(key))
    try:
        return r.read(0, r.size)
    finally:
        r.release()


# ---- the store ----

@pytest.fixture
def store(tmp_path):
    s = Store(16 * MiB, ssd=SSDTier(str(tmp_path)))
    yield s
    s.close()


def _publish(store: Store, key: bytes, data: bytes):
    d = store.spill(key, None, data)
    return store.publish(d, key)


def _overlay(store: Store, key: bytes, seed: int, size: int):
    """(an overlay draft of key's version on the SSD tier, that version's bytes)."""
    base = _bytes(seed, size)
    ref = _publish(store, key, base)
    ov = store.spill(key, ref)
    ref.release()
    return ov, base


def test_an_overlay_copies_nothing_and_publishes_a_log_record(store):
    key = b"a/s/big"
    base = _bytes(1, 24 * MiB)
    ref = _publish(store, key, base)
    spilled = store.statistics().spill_bytes
    ov = store.spill(key, ref)
    ref.release()
    assert ov.overlaid
    assert store.statistics().spill_bytes == spilled     # nothing copied
    want = bytearray(base)
    for off in (0, 5 * MiB + 7, 24 * MiB - 3):
        chunk = _bytes(off, 4 * KiB)
        ov.write(off, chunk)
        want[off:off + len(chunk)] = chunk
    assert ov.size == len(want)
    assert ov.read(5 * MiB, 8 * KiB) == bytes(want[5 * MiB:5 * MiB + 8 * KiB])
    appends = store.ssd.log_appends
    written = store.ssd.write_bytes
    ref2 = store.publish(ov, key)
    assert store.ssd.log_appends == appends + 1
    assert store.ssd.write_bytes - written < 64 * KiB    # the runs, not 24 MiB
    assert ref2.read(0, ref2.size) == bytes(want)
    assert _version(store, key) == bytes(want)
    assert os.listdir(Path(store.ssd.root) / "spill") == []
    # and again from the version the log made
    ov2 = store.spill(key, ref2)
    ref2.release()
    assert ov2.overlaid
    ov2.write(1 * MiB, b"second")
    want[1 * MiB:1 * MiB + 6] = b"second"
    store.publish(ov2, key).release()
    assert store.ssd.log_appends == appends + 2
    assert _version(store, key) == bytes(want)


def test_cut_then_grow_shows_zeros_not_the_base(store):
    key = b"a/s/cut"
    ov, base = _overlay(store, key, 2, 20 * MiB)
    ov.truncate(3 * MiB)
    ov.write(4 * MiB, b"x" * 10)           # a hole [3, 4) MiB: zeros, not the base's
    ov.truncate(18 * MiB)
    want = bytearray(base[:3 * MiB]) + bytes(15 * MiB)
    want[4 * MiB:4 * MiB + 10] = b"x" * 10
    assert ov.read(0, ov.size) == bytes(want)
    crc = ov.crc32c()
    assert crc == _native.crc32c(bytes(want))
    store.publish(ov, key).release()
    assert _version(store, key) == bytes(want)
    assert store.ssd.get(key).log is not None


def test_a_base_replaced_meanwhile_publishes_whole(store):
    """Two overlays of one version (a writer's, and another made before the
    first published): the second's base is no longer the slot's version, so
    its bytes are copied in and it is published whole, its own change over
    the base it started from."""
    key = b"a/s/two"
    base = _bytes(3, 20 * MiB)
    ref = _publish(store, key, base)
    ov1 = store.spill(key, ref)
    ov2 = store.spill(key, ref)
    ref.release()
    ov1.write(0, b"one")
    ov2.write(10, b"two")
    store.publish(ov1, key).release()
    appends = store.ssd.log_appends
    r = store.publish(ov2, key)
    assert store.ssd.log_appends == appends          # whole, not a record
    want = bytearray(base)
    want[10:13] = b"two"
    assert r.read(0, r.size) == bytes(want)
    r.release()
    assert _version(store, key) == bytes(want)
    assert store.ssd.get(key).log is None


def test_a_large_change_publishes_whole(store):
    key = b"a/s/large"
    ov, base = _overlay(store, key, 4, 16 * MiB)
    new = _bytes(5, 8 * MiB)                # half the slot: beyond LOG_RUN_SHARE
    ov.write(2 * MiB, new)
    appends = store.ssd.log_appends
    store.publish(ov, key).release()
    assert store.ssd.log_appends == appends
    assert _version(store, key) == base[:2 * MiB] + new + base[10 * MiB:]


def test_an_aborted_overlay_leaves_the_version_and_no_file(store):
    key = b"a/s/abort"
    ov, base = _overlay(store, key, 6, 12 * MiB)
    ov.write(0, b"never")
    ov.free()
    assert _version(store, key) == base
    assert os.listdir(Path(store.ssd.root) / "spill") == []


def test_overlay_against_a_model(store):
    """Random writes, cuts and growths over several publishes, each draft
    read back against a model before and after its publish."""
    rng = random.Random(7)
    key = b"a/s/model"
    want = bytearray(_bytes(8, 12 * MiB))
    ref = _publish(store, key, bytes(want))
    for round_ in range(12):
        ov = store.spill(key, ref)
        ref.release()
        assert ov.overlaid
        for _ in range(rng.randrange(1, 8)):
            op = rng.random()
            if op < 0.7:
                off = rng.randrange(0, len(want) + 64 * KiB)
                data = rng.randbytes(rng.choice((1, 100, 4096, 70000)))
                ov.write(off, data)
                if off > len(want):
                    want += bytes(off - len(want))
                want[off:off + len(data)] = data
            else:
                size = rng.randrange(len(want) // 2, len(want) + MiB)
                ov.truncate(size)
                if size < len(want):
                    del want[size:]
                else:
                    want += bytes(size - len(want))
            for _ in range(3):
                off = rng.randrange(0, len(want))
                n = rng.randrange(1, 300 * KiB)
                assert ov.read(off, n) == bytes(want[off:off + n]), round_
        assert ov.crc32c() == _native.crc32c(bytes(want)), round_
        ref = store.publish(ov, key)
        assert ref.size == len(want)
        assert ref.read(0, ref.size) == bytes(want), round_
        assert _version(store, key) == bytes(want), round_
    ref.release()
    assert store.ssd.log_appends >= 3


# ---- mounted ----


def test_mounted_change_of_a_slot_larger_than_memory_writes_what_changed(make_mount):
    """A 48 MiB slot on a 16M tier changed in place three times: each change
    appends its bytes to the slot's log (nothing copied into a spill file),
    and the slot reads back as changed, after a remount too."""
    m, d = _mount(make_mount, capacity="16M")
    want = bytearray(_bytes(9, 48 * MiB))
    (d / "big").write_bytes(want)
    st0 = m.stats()
    for i, off in enumerate((0, 20 * MiB + 5, 48 * MiB - 4096)):
        with open(d / "big", "r+b") as f:
            f.seek(off)
            chunk = _bytes(100 + i, 4096)
            f.write(chunk)
            want[off:off + 4096] = chunk
    st = m.stats()
    assert st["ssd_log_appends"] - st0["ssd_log_appends"] == 3, st
    assert st["spill_bytes"] - st0["spill_bytes"] <= 3 * 4096, st
    assert st["ssd_write_bytes"] - st0["ssd_write_bytes"] < MiB, st
    assert (d / "big").read_bytes() == bytes(want)
    with open(d / "big", "r+b") as f:           # a cut, and bytes beyond it
        f.truncate(30 * MiB)
        f.seek(31 * MiB)
        f.write(b"tail")
    want = want[:30 * MiB] + bytes(MiB) + b"tail"
    assert (d / "big").read_bytes() == bytes(want)
    assert not list(Path(m.ssd, "spill").glob("*"))
    m.stop()
    m2 = make_mount(ssd=str(m.ssd), capacity="16M")
    assert m2.p("a", "s", "big").read_bytes() == bytes(want)
    assert m2.stats()["ssd_corrupt"] == 0


def test_an_overlays_crc_comes_from_its_runs_alone(store, monkeypatch):
    """Writes and growth only: the version's crc32c is the base's combined
    with the runs' (no other byte read); after a cut into the base every
    byte is read."""
    from memosfs.store import spill
    key = b"a/s/crc"
    ov, base = _overlay(store, key, 10, 20 * MiB)
    want = bytearray(base)
    rng = random.Random(3)
    for _ in range(20):
        off = rng.randrange(0, 21 * MiB)
        data = rng.randbytes(rng.randrange(1, 20000))
        ov.write(off, data)
        if off > len(want):
            want += bytes(off - len(want))
        want[off:off + len(data)] = data
    ov.truncate(len(want) + 12345)
    want += bytes(12345)

    def every_byte(*a):
        raise AssertionError("read every byte")

    monkeypatch.setattr(spill, "crc_view", every_byte)
    assert ov.crc32c() == _native.crc32c(bytes(want))
    ov.truncate(len(base) - 1)
    with pytest.raises(AssertionError):
        ov.crc32c()
    monkeypatch.undo()
    del want[len(base) - 1:]
    assert ov.crc32c() == _native.crc32c(bytes(want))
    ov.free()


def _big(m, d, name: str, seed: int, size: int = 40 * MiB) -> bytearray:
    want = bytearray(_bytes(seed, size))
    (d / name).write_bytes(want)
    return want


def test_mounted_overlay_renamed_and_unlinked_while_written(make_mount):
    m, d = _mount(make_mount, capacity="16M")
    want = _big(m, d, "tmp", 11)
    with open(d / "tmp", "r+b", buffering=0) as f:
        f.seek(MiB)
        f.write(b"one")
        assert len(_spill_files(m)) == 1
        os.rename(d / "tmp", d / "final")           # mid-write, as engines do
        f.seek(30 * MiB)
        f.write(b"two")
    want[MiB:MiB + 3] = b"one"
    want[30 * MiB:30 * MiB + 3] = b"two"
    assert not (d / "tmp").exists()
    assert (d / "final").read_bytes() == bytes(want)
    gone = _big(m, d, "gone", 12)
    with open(d / "gone", "r+b", buffering=0) as f:
        f.write(b"x")
        os.unlink(d / "gone")
        f.write(b"y")
    assert not (d / "gone").exists()
    assert _spill_files(m) == []
    del gone
    m.stop()
    m2 = make_mount(capacity="16M", ssd=m.ssd)
    assert m2.p("a", "s", "final").read_bytes() == bytes(want)
    assert m2.stats()["ssd_corrupt"] == 0


def test_mounted_a_reader_keeps_its_version_while_an_overlay_publishes(make_mount):
    m, d = _mount(make_mount, capacity="16M")
    want = _big(m, d, "shared", 13)
    before = bytes(want)
    r = open(d / "shared", "rb")
    try:
        assert r.read(4096) == before[:4096]
        for i in range(5):
            with open(d / "shared", "r+b") as w:
                w.seek(i * 8 * MiB)
                w.write(b"new%d" % i)
                w.flush()
                os.fsync(w.fileno())
            want[i * 8 * MiB:i * 8 * MiB + 4] = b"new%d" % i
            r.seek(i * 8 * MiB)
            assert r.read(4) == before[i * 8 * MiB:i * 8 * MiB + 4]     # its version
    finally:
        r.close()
    assert (d / "shared").read_bytes() == bytes(want)
    assert m.stats()["ssd_log_appends"] >= 5


def test_mounted_overlay_fsync_survives_kill9_and_an_unsynced_one_leaves_the_version(make_mount):
    m, d = _mount(make_mount, capacity="16M")
    want = _big(m, d, "k", 14)
    fd = os.open(d / "k", os.O_RDWR)
    try:
        os.pwrite(fd, b"durable", 5 * MiB)
        os.fsync(fd)
        want[5 * MiB:5 * MiB + 7] = b"durable"
        os.pwrite(fd, b"lost", 6 * MiB)         # never published
        assert len(_spill_files(m)) == 1
        m.kill9()
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    m2 = make_mount(capacity="16M", ssd=m.ssd)
    assert _spill_files(m2) == []
    assert m2.p("a", "s", "k").read_bytes() == bytes(want)
    assert m2.stats()["ssd_corrupt"] == 0


def test_mounted_overlay_under_the_writeback_cache(make_mount):
    m, d = _mount(make_mount, capacity="16M", writeback_cache=1)
    want = _big(m, d, "wbc", 15)
    with open(d / "wbc", "r+b") as f:
        f.seek(3 * MiB)
        f.write(b"cached")
    want[3 * MiB:3 * MiB + 6] = b"cached"
    assert (d / "wbc").read_bytes() == bytes(want)
    m.stop()
    m2 = make_mount(capacity="16M", ssd=m.ssd)
    assert m2.p("a", "s", "wbc").read_bytes() == bytes(want)


def test_a_memory_draft_that_spills_writes_only_its_changed_pages(store):
    """A draft in memory made from a version the SSD tier holds (written
    back): spilled, only the pages the C core says it changed go to its
    spill file, and its publish is a log record."""
    key = b"a/s/mem"
    base = _bytes(20, 8 * MiB)
    d = store.draft()
    d.write(0, base)
    ref = store.publish(d, key)
    store.flush()                                   # clean: the SSD holds it
    d2 = store.draft(ref)
    ref.release()
    d2.write(5 * 4096 + 3, b"changed")
    d2.truncate(7 * MiB)
    d2.write(7 * MiB + 10, b"grown")
    want = bytearray(base[:7 * MiB]) + bytes(10) + b"grown"
    want[5 * 4096 + 3:5 * 4096 + 10] = b"changed"
    spilled = store.statistics().spill_bytes
    sp = store.spill(key, d2)
    d2.free()
    assert sp.overlaid
    assert store.statistics().spill_bytes - spilled <= 2 * 4096
    assert sp.read(0, sp.size) == bytes(want)
    appends = store.ssd.log_appends
    store.publish(sp, key).release()
    assert store.ssd.log_appends == appends + 1
    assert _version(store, key) == bytes(want)


def test_a_clean_memory_version_spills_as_the_ssd_version_itself(store):
    key = b"a/s/clean"
    base = _bytes(21, 6 * MiB)
    d = store.draft()
    d.write(0, base)
    ref = store.publish(d, key)
    store.flush()
    spilled = store.statistics().spill_bytes
    sp = store.spill(key, ref)
    ref.release()
    assert sp.overlaid and store.statistics().spill_bytes == spilled
    sp.write(100, b"z")
    store.publish(sp, key).release()
    assert _version(store, key) == base[:100] + b"z" + base[101:]


def test_a_draft_of_a_version_never_written_back_spills_whole(store):
    key = b"a/s/dirty"
    base = _bytes(22, 6 * MiB)
    d = store.draft()
    d.write(0, base)
    ref = store.publish(d, key)                     # dirty: the SSD holds nothing
    d2 = store.draft(ref)
    ref.release()
    d2.write(0, b"q")
    sp = store.spill(key, d2)
    d2.free()
    assert not sp.overlaid
    store.publish(sp, key).release()
    assert _version(store, key) == b"q" + base[1:]
