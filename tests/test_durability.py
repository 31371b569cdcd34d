"""Durability of namespace changes and of what eviction and unmount do.

The store alone (no mount): a rename never leaves an acknowledged version
without a copy on the SSD, at any point where the daemon could die (the
crash is simulated by stopping at each file-system call, then reading the
SSD directory with a fresh tier, as the next mount does); sync_namespace
(the fsync of a directory) makes renames, unlinks and mkdirs durable;
evicting a version that was replaced, renamed or removed meanwhile never
touches the name's current version; a clean unmount that cannot save every
slot says so.

Then on real mounts: rename + fsync of the directory, unlink + fsync, mkdir
+ fsync of the parent, each followed by kill -9 and a remount; and the exit
status and message of an unmount that lost slots.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import FUSE_REASON, is_mounted
from memosfs.testing import faults
from memosfs.store import ssd as ssd_mod
from memosfs.store.ssd import SSDTier
from memosfs.store.store import Store, UnsavedSlots

MiB = 1 << 20


# ---------------------------------------------------------------- helpers


def _put(store: Store, key: bytes, data: bytes) -> None:
    d = store.draft()
    d.write(0, data)
    store.publish(d, key).release()


def on_disk(root) -> dict[bytes, bytes]:
    """What the next mount finds: key -> payload of every slot file or
    packed record (a segment's record: its payload at data_off)."""
    tier = SSDTier(str(root))
    out = {}
    for e in tier.scan():
        with open(e.path, "rb") as f:
            f.seek(getattr(e, "data_off", 0))
            out[e.key] = f.read(e.size)
    assert tier.corrupt == 0
    return out


class Crash(BaseException):
    """The daemon dies here (nothing catches a BaseException on the way)."""


STEPS = ("rename", "replace", "unlink", "fsync", "copy_file_range", "pwrite", "open")


def crash_at(monkeypatch, n: int) -> list[str]:
    """Make the n-th file-system call (0-based) of the ssd module raise
    Crash before it runs; returns the calls seen."""
    seen: list[str] = []
    for name in STEPS:
        real = getattr(os, name)

        def wrapped(*a, _real=real, _name=name, **kw):
            if len(seen) == n:
                seen.append(_name + "!")
                raise Crash(_name)
            seen.append(_name)
            return _real(*a, **kw)
        monkeypatch.setattr(os, name, wrapped)
    return seen


def abandon(store: Store) -> None:
    """The process died: nothing more is written (memory is just freed)."""
    store._stop.set()
    store.cache.close()


TMP, FINAL = b"a/s/k.tmp", b"a/s/k"
OLD, NEW = b"old!" * 5000, b"new!" * 7000


# ---------------------------------------------------------------- rename


def _acked_pair(root) -> Store:
    """final holds OLD and tmp NEW, both fsync'd (acknowledged)."""
    store = Store(16 * MiB, ssd=SSDTier(str(root)))
    _put(store, FINAL, OLD)
    store.persist(FINAL)
    _put(store, TMP, NEW)
    store.persist(TMP)
    return store


@pytest.mark.parametrize("in_memory", [True, False], ids=["in-memory", "ssd-only"])
def test_rename_over_an_acknowledged_target_never_loses_a_durable_copy(
        tmp_path, monkeypatch, in_memory):
    """tmp and final both acknowledged; rename tmp over final; die at each
    file-system call of the rename: final is OLD or NEW, never absent, and
    NEW is there under one of the names."""
    n = 0
    while True:
        root = tmp_path / f"crash{n}"
        store = _acked_pair(root)
        if not in_memory:
            store.cache.remove(TMP)
            store.cache.remove(FINAL)
        with monkeypatch.context() as mp:
            seen = crash_at(mp, n)
            try:
                store.rename(TMP, FINAL)
                crashed = False
            except Crash:
                crashed = True
        abandon(store)
        disk = on_disk(root)
        where = f"crash at call {n} of {seen}"
        assert disk.get(FINAL) in (OLD, NEW), where
        assert NEW in (disk.get(FINAL), disk.get(TMP)), where
        if not crashed:
            break
        n += 1
    assert n > 0                            # it did write something
    # and with the rename complete, the move is on disk
    assert disk[FINAL] == NEW and TMP not in disk


def test_rename_then_sync_namespace_is_the_new_state(tmp_path):
    store = _acked_pair(tmp_path)
    assert store.rename(TMP, FINAL)
    store.sync_namespace()
    abandon(store)
    disk = on_disk(tmp_path)
    assert disk == {FINAL: NEW}


def test_rename_of_a_dirty_slot_moves_its_durable_copy_and_stays_dirty(tmp_path):
    """tmp: version 1 acknowledged, version 2 published on top (dirty): the
    acknowledged copy moves with the name, version 2 is written back later."""
    v1, v2 = b"v1" * 9000, b"v2" * 11000
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path)))
    _put(store, FINAL, OLD)
    store.persist(FINAL)
    _put(store, TMP, v1)
    store.persist(TMP)
    _put(store, TMP, v2)
    assert store.rename(TMP, FINAL)
    disk = on_disk(tmp_path)
    assert disk.get(FINAL) in (v1, v2), "the acknowledged version lost its durable copy"
    ref = store.peek(FINAL)
    assert ref.read(0, 4) == b"v2v2" and ref.dirty
    ref.release()
    assert FINAL in store._dirty_since and TMP not in store._dirty_since
    store.flush()
    assert on_disk(tmp_path) == {FINAL: v2}
    store.close()


def test_rename_of_an_unsaved_slot_over_a_durable_target(tmp_path):
    """tmp only in memory (never fsync'd), final on the SSD: final's file is
    replaced, never removed first, and nothing older blocks the write-back."""
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path)))
    _put(store, FINAL, OLD)
    _put(store, FINAL, OLD + b"2")            # final at version 2
    store.persist(FINAL)
    _put(store, TMP, NEW)                     # tmp at version 1
    assert store.rename(TMP, FINAL)
    assert on_disk(tmp_path).get(FINAL) in (OLD + b"2", NEW)
    store.flush()
    assert on_disk(tmp_path) == {FINAL: NEW}
    store.cache.remove(FINAL)
    ref = store.get(FINAL)
    assert ref.read(0, len(NEW) + 1) == NEW
    ref.release()
    _put(store, FINAL, b"later")
    store.flush()
    assert on_disk(tmp_path) == {FINAL: b"later"}
    store.close()


def test_rename_replaces_the_target_in_memory_and_on_ssd(tmp_path):
    """final in memory (dirty) and on the SSD, tmp on the SSD only: after the
    rename every tier holds tmp's version under final."""
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path)))
    _put(store, TMP, NEW)
    store.persist(TMP)
    store.cache.remove(TMP)
    _put(store, FINAL, OLD)
    store.persist(FINAL)
    _put(store, FINAL, OLD + b"dirty")
    assert store.rename(TMP, FINAL)
    ref = store.get(FINAL)
    assert ref.read(0, len(NEW) + 1) == NEW
    ref.release()
    store.close()
    assert on_disk(tmp_path) == {FINAL: NEW}


def test_write_back_racing_a_rename_never_brings_the_old_name_back(tmp_path):
    """The background writer is writing tmp back when the rename lands."""
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path)))
    _put(store, TMP, NEW)
    ref = store.peek(TMP)
    real = store.ssd._check_room

    def check_room(key, total):             # put() has read the key: rename now
        store.ssd._check_room = real
        assert store.rename(TMP, FINAL)
        return real(key, total)

    store.ssd._check_room = check_room
    store._write_back(ref, durable=False)
    ref.release()
    assert TMP not in store.ssd
    store.flush()
    store.close()
    assert on_disk(tmp_path) == {FINAL: NEW}


# ---------------------------------------------------------------- sync_namespace


def test_sync_namespace_fsyncs_unlinks_and_writes_the_namespace(tmp_path, monkeypatch):
    synced: list[str] = []
    real = ssd_mod.fileio._fsync_dir
    for mod in (ssd_mod.tier, ssd_mod.state):       # (the folders' and the root's fsyncs)
        monkeypatch.setattr(mod, "_fsync_dir", lambda p: (synced.append(p), real(p)))
    tier = SSDTier(str(tmp_path))
    tier.segs.pack_below = 0                # a file's unlink (test_segments: tombstones)
    store = Store(16 * MiB, ssd=tier, writeback_delay_ms=3600000)
    store.namespace_of = lambda: [{"path": "a/s", "mode": 0o755, "uid": 0, "gid": 0}]
    _put(store, b"a/s/x", b"x" * 1000)
    store.persist(b"a/s/x")
    [path] = [e.path for e in store.ssd.entries()]
    store.remove(b"a/s/x")
    assert not os.path.exists(path)          # the unlink reaches the SSD at once
    store.namespace_changed()
    synced.clear()
    store.sync_namespace()
    assert os.path.dirname(path) in synced   # ... and is durable now
    assert str(tmp_path) in synced           # namespace.json and order.json too
    abandon(store)
    assert on_disk(tmp_path) == {}
    assert SSDTier(str(tmp_path)).read_json("namespace.json", None) == \
        [{"path": "a/s", "mode": 0o755, "uid": 0, "gid": 0}]


def test_sync_namespace_writes_a_renamed_slot_that_had_no_copy(tmp_path):
    """rename of a never-fsync'd slot, then fsync of the directory: the new
    name exists after a crash (with its bytes)."""
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path)), writeback_delay_ms=3600000)
    _put(store, TMP, NEW)
    assert store.rename(TMP, FINAL)
    store.sync_namespace()
    abandon(store)
    assert on_disk(tmp_path) == {FINAL: NEW}


def test_reset_session_drops_every_depth_and_nothing_else(tmp_path):
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path)))
    dropped = []
    store.on_drop(lambda key, why: dropped.append(key))
    inside = [b"a/s/x", b"a/s/d1/y", b"a/s/d1/d2/z"]
    outside = [b"a/s2/w", b"a/sx/q", b"b/s/x"]
    for k in inside + outside:
        _put(store, k, k * 100)
    store.flush()
    store.cache.remove(b"a/s/d1/y")          # on the SSD only
    assert store.reset_session("a", "s") == 3
    assert sorted(dropped) == sorted(inside)
    assert sorted(store.ssd.keys()) == sorted(outside)
    assert sorted(store.cache.keys()) == sorted(outside)
    store.close()
    assert sorted(on_disk(tmp_path)) == sorted(outside)


# ---------------------------------------------------------------- eviction


def _evict_store(tmp_path=None) -> tuple[Store, list]:
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path)) if tmp_path else None,
                  writeback_delay_ms=3600000)
    dropped: list = []
    store.on_drop(lambda key, why: dropped.append((key, why)))
    return store, dropped


def test_evicting_a_replaced_version_keeps_the_name(tmp_path):
    """No SSD tier: the victim is an old version (a reader pinned it)."""
    store, dropped = _evict_store()
    _put(store, b"a/s/k", b"v1" * 100)
    old = store.peek(b"a/s/k")
    _put(store, b"a/s/k", b"v2" * 100)
    assert store._on_evict(old) is True
    old.release()
    assert dropped == []
    assert store.statistics().drops_lost == 0
    assert store.tier_of(b"a/s/k") == "mem"
    store.close()


def test_evicting_the_current_version_without_an_ssd_tier_loses_it():
    store, dropped = _evict_store()
    _put(store, b"a/s/k", b"v1" * 100)
    ref = store.peek(b"a/s/k")
    assert store._on_evict(ref) is True
    ref.release()
    assert dropped == [(b"a/s/k", "evicted")]
    assert store.statistics().drops_lost == 1
    store.close()


@pytest.mark.parametrize("meanwhile", ["replaced", "renamed", "removed"])
def test_a_write_back_racing_a_namespace_change_never_drops_the_current_name(
        tmp_path, meanwhile):
    """A dirty victim's write-back runs while the name changes: the name's
    current version (here a new one in memory only) keeps its name."""
    store, dropped = _evict_store(tmp_path)
    key = b"a/s/k"
    _put(store, key, b"v1" * 100)
    victim = store.peek(key)
    real_put = store.ssd.put

    def put(ref, meta, durable):
        if meanwhile == "renamed":
            store.rename(key, b"a/s/moved")
        elif meanwhile == "removed":
            store.remove(key)
        _put(store, key, b"new" * 100)       # the current version: memory only
        return real_put(ref, meta, durable)

    store.ssd.put = put
    evicted = store._on_evict(victim)
    # renamed: the version was written under its new key with the old key's
    # metadata, so it stays dirty and memory keeps it until written again
    assert evicted is (meanwhile != "renamed")
    victim.release()
    store.ssd.put = real_put
    assert dropped == []
    assert store.statistics().drops_lost == 0
    ref = store.peek(key)
    assert ref.read(0, 3) == b"new" and ref.dirty
    ref.release()
    if meanwhile == "renamed":
        assert store.tier_of(b"a/s/moved") in ("mem", "ssd")
    store.close()
    expect = {key: b"new" * 100}
    if meanwhile == "renamed":
        expect[b"a/s/moved"] = b"v1" * 100
    assert on_disk(tmp_path) == expect


def test_a_clean_victim_whose_ssd_copy_went_bad_is_written_again(tmp_path):
    """The SSD copy of a slot memory holds turns out corrupt: the memory copy
    becomes dirty, so evicting it writes it back instead of losing it."""
    store, dropped = _evict_store(tmp_path)
    _put(store, b"a/s/k", b"k" * 5000)
    store.flush()
    entry = store.ssd.get(b"a/s/k")
    with open(entry.path, "r+b") as f:          # the payload goes bad on disk
        f.seek(getattr(entry, "data_off", 0))   # (a packed slot's: in its segment)
        f.write(b"X")
    store._corrupt(entry, "payload checksum mismatch")
    ref = store.peek(b"a/s/k")
    assert ref.dirty
    assert store._on_evict(ref) is True
    ref.release()
    assert dropped == [] and store.statistics().drops_lost == 0
    assert store.ssd.get(b"a/s/k") is not None
    store.close()


def test_making_ssd_room_never_removes_a_newer_version(tmp_path):
    """The policy names a version that a newer write replaced meanwhile."""
    store, dropped = _evict_store(tmp_path)
    k = b"a/s/k"
    _put(store, k, b"1" * 5000)
    store.flush()
    stale = store.ssd.get(k)
    _put(store, k, b"2" * 5000)
    store.flush()
    store.cache.remove(k)                    # only the SSD holds version 2
    _put(store, b"a/s/other", b"o" * 5000)
    store.flush()
    store.ssd.victims = lambda n, skip=(): [] if stale.key in skip else [stale]
    store._make_ssd_room(1, keep=b"a/s/new")
    assert dropped == [] and store.statistics().drops_lost == 0
    assert store.ssd.get(k).version == 2
    store.close()
    assert on_disk(tmp_path)[k] == b"2" * 5000


# ---------------------------------------------------------------- unmount


def test_close_with_a_full_ssd_counts_logs_and_raises(tmp_path, caplog):
    """ssd_capacity fits 5 of 12 slots: the clean unmount keeps the 5 most
    recent and says which of the others are lost."""
    store = Store(32 * MiB, ssd=SSDTier(str(tmp_path), capacity=3 * MiB),
                  writeback_delay_ms=3600000)
    keys = [f"a/s/k{i:02d}".encode() for i in range(12)]
    for k in keys:
        _put(store, k, k * (600 * 1024 // len(k)))
    caplog.set_level(logging.ERROR, logger="memosfs.store.store")
    with pytest.raises(UnsavedSlots) as e:
        store.close()
    lost = e.value.keys
    assert isinstance(e.value, OSError) and e.value.errno == errno.ENOSPC
    assert e.value.count == len(lost) == store.statistics().slots_unsaved > 0
    saved = set(on_disk(tmp_path))
    assert saved | set(lost) == set(keys) and not saved & set(lost)
    assert saved == set(keys[-len(saved):]), "the most recent slots should be kept"
    errors = "\n".join(r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    for k in lost:
        assert k.decode() in errors


def test_close_with_write_errors_counts_them(tmp_path, caplog):
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path)), writeback_delay_ms=3600000)
    for i in range(4):
        _put(store, f"a/s/k{i}".encode(), b"x" * 1000)
    real_put = store.ssd.put

    def put(ref, meta, durable):
        if ref.key in (b"a/s/k1", b"a/s/k3"):
            raise OSError(errno.EIO, "disk error")
        return real_put(ref, meta, durable)

    store.ssd.put = put
    with pytest.raises(UnsavedSlots) as e:
        store.close()
    assert sorted(e.value.keys) == [b"a/s/k1", b"a/s/k3"]
    assert e.value.errno == errno.EIO
    assert store.statistics().slots_unsaved == 2
    assert sorted(on_disk(tmp_path)) == [b"a/s/k0", b"a/s/k2"]


def test_flush_that_cannot_save_everything_raises_and_keeps_the_slots(tmp_path):
    store = Store(32 * MiB, ssd=SSDTier(str(tmp_path), capacity=2 * MiB),
                  writeback_delay_ms=3600000)
    for i in range(6):
        _put(store, f"a/s/k{i}".encode(), bytes([i]) * (600 * 1024))
    with pytest.raises(OSError) as e:
        store.flush()
    assert e.value.errno == errno.ENOSPC
    for i in range(6):                       # nothing is lost by a flush
        assert store.tier_of(f"a/s/k{i}".encode()) == "mem"
    assert store.statistics().slots_unsaved == 0
    store.ssd.capacity = 0
    store.close()
    assert len(on_disk(tmp_path)) == 6


# ---------------------------------------------------------------- mounted

needs_fuse = pytest.mark.skipif(FUSE_REASON is not None, reason=FUSE_REASON or "")
STUCK = "kill -9 did not end the daemon; the FUSE connection was aborted"


def fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_synced(path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def kill9(m) -> None:
    if faults.kill9(m):
        warnings.warn(STUCK)
    assert not is_mounted(m.path)


@needs_fuse
def test_rename_over_a_slot_then_fsync_dir_survives_kill9(make_mount):
    """write tmp; fsync tmp; rename tmp final; fsync dir; kill -9 (this
    depends on fs.py's fsyncdir calling Store.sync_namespace)."""
    m = make_mount(capacity="16M", writeback_delay_ms=600000)
    s = m.p("a", "s")
    s.mkdir(parents=True)
    write_synced(s / "final", OLD)
    write_synced(s / "final.tmp", NEW)
    os.rename(s / "final.tmp", s / "final")
    fsync_dir(s)
    kill9(m)
    m2 = make_mount(ssd=str(m.ssd), capacity="16M")
    assert sorted(os.listdir(m2.p("a", "s"))) == ["final"]
    assert m2.p("a", "s", "final").read_bytes() == NEW


@needs_fuse
def test_rename_over_a_slot_without_fsync_dir_keeps_one_of_the_two(make_mount):
    """Before the directory is fsync'd, a kill -9 may keep the rename or not;
    both versions were acknowledged, so final holds one of them, whole."""
    m = make_mount(capacity="16M", writeback_delay_ms=600000)
    s = m.p("a", "s")
    s.mkdir(parents=True)
    write_synced(s / "final", OLD)
    write_synced(s / "final.tmp", NEW)
    os.rename(s / "final.tmp", s / "final")
    kill9(m)
    m2 = make_mount(ssd=str(m.ssd), capacity="16M")
    s2 = m2.p("a", "s")
    got = (s2 / "final").read_bytes()
    assert got in (OLD, NEW)
    assert got == NEW or (s2 / "final.tmp").read_bytes() == NEW


@needs_fuse
def test_unlink_then_fsync_dir_never_comes_back(make_mount):
    m = make_mount(capacity="16M", writeback_delay_ms=600000)
    s = m.p("a", "s")
    s.mkdir(parents=True)
    write_synced(s / "gone", OLD)
    write_synced(s / "kept", NEW)
    os.unlink(s / "gone")
    fsync_dir(s)
    kill9(m)
    m2 = make_mount(ssd=str(m.ssd), capacity="16M")
    assert os.listdir(m2.p("a", "s")) == ["kept"]
    m2.stop()
    m3 = make_mount(ssd=str(m.ssd), capacity="16M")
    assert os.listdir(m3.p("a", "s")) == ["kept"]


@needs_fuse
def test_mkdir_then_fsync_parent_survives_kill9(make_mount):
    """mkdir of sessions, fsync of the agent directory, kill -9 at once (this
    depends on fs.py's fsyncdir calling Store.sync_namespace)."""
    m = make_mount(capacity="16M", writeback_delay_ms=600000)
    m.p("a").mkdir()
    fsync_dir(m.path)
    for name in ("s1", "s2"):
        m.p("a", name).mkdir()
    m.p("a", "s2", "deep").mkdir()
    fsync_dir(m.p("a"))
    kill9(m)
    m2 = make_mount(ssd=str(m.ssd), capacity="16M")
    assert sorted(os.listdir(m2.p("a"))) == ["s1", "s2"]
    assert os.listdir(m2.p("a", "s2")) == ["deep"]


@needs_fuse
def test_unmount_that_loses_slots_says_so(make_mount):
    """An unmount forced with an SSD tier that cannot take every slot (a
    plain one is refused: tests/test_unmount_unsaved.py): the daemon logs
    each lost slot, prints how many to stderr and exits non-zero, and so
    does `memosfs umount --force`."""
    m = make_mount(capacity="32M", ssd_capacity="3M", writeback_delay_ms=600000)
    s = m.p("a", "s")
    s.mkdir(parents=True)
    for i in range(12):
        (s / f"k{i:02d}").write_bytes(bytes([i]) * (600 * 1024))
    r = subprocess.run([sys.executable, "-m", "memosfs", "umount", str(m.path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "not unmounting" in r.stderr, r
    assert "ssd_capacity (3145728 bytes)" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "memosfs", "umount", "--force", str(m.path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0, r
    assert "could not be saved" in r.stderr, r.stderr
    rc = m.proc.wait(timeout=60)
    out = m.proc.stdout.read().decode()
    assert rc != 0
    said = re.search(r"(\d+) slots? could not be saved", out)
    assert said and int(said.group(1)) >= 1, out
    lost = int(said.group(1))
    assert f"{lost} slot" in r.stderr
    errors = [line for line in m.logtext().splitlines() if " ERROR " in line and "a/s/k" in line]
    assert len(errors) >= lost, m.logtext()


@needs_fuse
def test_clean_unmount_reports_nothing(make_mount):
    m = make_mount(capacity="16M")
    m.p("a", "s").mkdir(parents=True)
    m.p("a", "s", "k").write_bytes(b"k" * 1000)
    r = subprocess.run([sys.executable, "-m", "memosfs", "umount", str(m.path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stderr == "", r
    assert m.proc.wait(timeout=60) == 0
