"""Extent logs: a large slot's write-back of a few changed extents appends
them to the slot's log instead of rewriting its file (memosfs/store/
extentlog.py, docs/ssd-format.md "Extent logs").

The store-level tests drive SSDTier with a stand-in for a published Ref
whose changes() says how its bytes differ from an older version (the C
core's Ref.changes); the mounted ones need the C core's own."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from memosfs import _native
from memosfs.store import extentlog
from memosfs.store.ssd import CorruptSlot, SSDReader, SSDTier

KiB, MiB = 1 << 10, 1 << 20


class FakeRef:
    """A published version: its bytes, and how they differ from base."""

    live = True
    dirty = True

    def __init__(self, key: bytes, data: bytes, version: int, changes=None) -> None:
        self.key, self.data, self.version = key, bytes(data), version
        self.size = len(self.data)
        self._changes = changes

    def changes(self):
        return self._changes

    def read(self, off: int, n: int) -> bytes:
        return self.data[off:off + n]

    def crc32c(self, off: int = 0, n: int = -1) -> int:
        return _native.crc32c(self.data)

    def write_to_fd(self, fd: int, off: int = 0, n: int = -1, sparse: bool = False) -> int:
        view = memoryview(self.data)
        done = 0
        while done < len(view):
            done += os.pwrite(fd, view[done:], done)
        return done


class Slot:
    """A key's versions, as the C core would publish them."""

    def __init__(self, key: bytes, data: bytes) -> None:
        self.key, self.data, self.version = key, bytearray(data), 1
        self.clean: tuple[int, int] | None = None       # (version, size) written back
        self.cut = len(data)
        self.runs: dict[int, int] = {}

    def ref(self) -> FakeRef:
        ch = None
        if self.clean is not None:
            runs = sorted(self.runs.items())
            ch = (self.clean[0], self.clean[1], self.cut, runs)
        return FakeRef(self.key, self.data, self.version, ch)

    def written(self) -> None:
        self.clean = (self.version, len(self.data))
        self.cut = len(self.data)
        self.runs = {}

    def pwrite(self, off: int, data: bytes) -> None:
        end = off + len(data)
        if end > len(self.data):
            self.data.extend(bytes(end - len(self.data)))
        self.data[off:end] = data
        self.version += 1
        for page in range(off // 4096, (end + 4095) // 4096):
            self.runs[page * 4096] = 4096
        self._clip()

    def truncate(self, size: int) -> None:
        if size < len(self.data):
            del self.data[size:]
            self.cut = min(self.cut, size)
        else:
            self.data.extend(bytes(size - len(self.data)))
        self.version += 1
        self._clip()

    def _clip(self) -> None:
        size = len(self.data)
        runs = {}
        for o, n in self.runs.items():
            if o < size:
                runs[o] = min(n, size - o)
        self.runs = runs


def put(tier: SSDTier, slot: Slot, durable: bool = True, meta=None):
    e = tier.put(slot.ref(), meta or {"mode": 0o600}, durable)
    slot.written()
    return e


def content(tier: SSDTier, key: bytes) -> bytes:
    e = tier.get(key)
    cache = _native.Cache(256 * MiB)
    try:
        d = cache.draft()
        tier.load_into(e, d)
        data = d.read(0, e.size + 1)
        d.free()
    finally:
        cache.close()
    r = SSDReader(e)
    try:
        assert r.read(0, e.size + 1) == data
        if e.size > 5000:
            assert r.read(4000, 1000) == data[4000:5000]
    finally:
        r.release()
    return data


def logs(root: Path) -> list[Path]:
    return sorted((root / "slots").glob("*/*.log"))


def rescan(root: Path) -> SSDTier:
    t = SSDTier(str(root))
    t.scan()
    t.check()
    return t


@pytest.fixture
def tier(tmp_path):
    return SSDTier(str(tmp_path))


def test_in_place_changes_append_extents_not_the_slot(tmp_path, tier):
    size = 8 * MiB
    s = Slot(b"a/s/big", os.urandom(size))
    put(tier, s)
    first = tier.statistics().ssd_write_bytes
    changed = 0
    for i in range(50):
        s.pwrite((i * 37 % 2048) * 4096, os.urandom(4096))
        changed += 4096
        put(tier, s)
    st = tier.statistics()
    assert st.ssd_log_appends == 50 and st.ssd_folds == 0 and st.ssd_logs == 1
    assert st.ssd_write_bytes - first <= 2 * changed
    assert st.ssd_write_bytes <= 2 * (size + changed)
    assert st.ssd_bytes == tier.used_bytes and st.ssd_log_bytes > changed
    tier.check()
    assert content(tier, s.key) == bytes(s.data)
    again = rescan(tmp_path)
    e = again.get(s.key)
    assert (e.version, e.size) == (s.version, len(s.data)) and e.log is not None
    assert content(again, s.key) == bytes(s.data)
    assert e.meta == {"mode": 0o600}


def test_truncate_shrink_grow_and_write_keeps_the_zeros_beyond_the_cut(tmp_path, tier):
    s = Slot(b"a/s/t", os.urandom(2 * MiB))
    put(tier, s)
    s.truncate(300_001)
    s.truncate(1_500_000)
    s.pwrite(1_000_000, b"x" * 5000)
    put(tier, s)
    assert tier.get(s.key).log is not None
    data = content(tier, s.key)
    assert data == bytes(s.data)
    assert data[300_001:1_000_000] == bytes(1_000_000 - 300_001)
    # then a grow past the base's size, a write there, and a shrink
    s.truncate(3 * MiB)
    s.pwrite(2 * MiB + 4096, b"y" * 4096)
    put(tier, s)
    s.truncate(2 * MiB + 6000)
    put(tier, s)
    assert content(tier, s.key) == bytes(s.data)
    assert content(rescan(tmp_path), s.key) == bytes(s.data)


def test_the_log_is_folded_when_it_grows(tmp_path, tier):
    s = Slot(b"a/s/f", os.urandom(1 * MiB))
    put(tier, s)
    for i in range(80):                         # 80 x 8 KiB: past half of 1 MiB
        s.pwrite(i * 8192, os.urandom(8192))
        put(tier, s, durable=False)
    st = tier.statistics()
    assert st.ssd_folds >= 1 and st.ssd_log_appends >= 40
    assert len(logs(tmp_path)) <= 1
    tier.sync()
    tier.check()
    assert content(tier, s.key) == bytes(s.data)
    assert content(rescan(tmp_path), s.key) == bytes(s.data)


def test_too_many_records_fold(tmp_path, tier, monkeypatch):
    monkeypatch.setattr(extentlog, "LOG_MAX_RECORDS", 5)
    s = Slot(b"a/s/m", os.urandom(1 * MiB))
    put(tier, s)
    for i in range(7):
        s.pwrite(i * 4096, b"z" * 10)
        put(tier, s)
    assert tier.statistics().ssd_folds == 1
    assert content(rescan(tmp_path), s.key) == bytes(s.data)


def test_rename_with_a_log_then_remount(tmp_path, tier):
    s = Slot(b"a/s/old", os.urandom(1 * MiB))
    put(tier, s)
    s.pwrite(4096, b"q" * 4096)
    put(tier, s)
    other = Slot(b"a/s/new", os.urandom(1 * MiB))
    put(tier, other)
    other.pwrite(0, b"r" * 4096)
    put(tier, other)
    assert len(logs(tmp_path)) == 2
    moved = tier.rename(b"a/s/old", b"a/s/new", {"mode": 0o640})
    assert moved is not None and moved.log is None
    assert tier.get(b"a/s/old") is None and logs(tmp_path) == []
    tier.check()
    again = rescan(tmp_path)
    assert again.keys() == [b"a/s/new"]
    assert content(again, b"a/s/new") == bytes(s.data)


def test_remove_takes_the_log(tmp_path, tier):
    s = Slot(b"a/s/rm", os.urandom(1 * MiB))
    put(tier, s)
    s.pwrite(0, b"1" * 100)
    put(tier, s)
    assert logs(tmp_path)
    assert tier.remove(s.key)
    assert logs(tmp_path) == [] and tier.used_bytes == 0
    tier.check()
    assert rescan(tmp_path).keys() == []


def _two_records(tmp_path, tier, key: bytes):
    """A 1 MiB slot with two log records: (the slot, its version before
    the last record, the log)."""
    s = Slot(key, os.urandom(1 * MiB))
    put(tier, s)
    s.pwrite(8192, b"a" * 4096)
    put(tier, s)
    before = bytes(s.data)
    s.pwrite(16384, b"b" * 4096)
    put(tier, s)
    [lg] = logs(tmp_path)
    return s, before, lg


def test_a_torn_log_tail_is_cut_and_the_version_before_served(tmp_path, tier, caplog):
    s, before, lg = _two_records(tmp_path, tier, b"a/s/torn")
    caplog.set_level(logging.INFO)
    with open(lg, "r+b") as f:
        f.truncate(lg.stat().st_size - 7)
    again = rescan(tmp_path)
    assert "cut off" in caplog.text
    assert again.statistics().ssd_corrupt == 0
    assert content(again, s.key) == before
    # and the next append chains from the version before
    s2 = Slot(s.key, before)
    s2.version, s2.clean = again.get(s.key).version, (again.get(s.key).version, len(before))
    s2.cut = len(before)
    s2.pwrite(0, b"c" * 4096)
    put(again, s2)
    assert content(rescan(tmp_path), s.key) == bytes(s2.data)


@pytest.mark.parametrize("where", ["payload", "header"])
def test_a_corrupt_record_is_never_served(tmp_path, tier, where):
    s, before, lg = _two_records(tmp_path, tier, b"a/s/bad")
    buf = bytearray(lg.read_bytes())
    off = len(buf) - 100 if where == "payload" else tier.get(s.key).log.records[-1].off + 30
    buf[off] ^= 0xFF
    lg.write_bytes(bytes(buf))
    again = rescan(tmp_path)
    assert again.statistics().ssd_corrupt == 1
    assert content(again, s.key) == before
    assert list((tmp_path / "corrupt").iterdir())


def test_damage_after_the_mount_is_caught_on_read(tmp_path, tier):
    s = Slot(b"a/s/late", os.urandom(1 * MiB))
    put(tier, s)
    s.pwrite(8192, b"a" * 4096)
    put(tier, s)
    again = rescan(tmp_path)
    [lg] = logs(tmp_path)
    buf = bytearray(lg.read_bytes())
    buf[-10] ^= 1
    lg.write_bytes(bytes(buf))
    e = again.get(s.key)
    cache = _native.Cache(16 * MiB)
    d = cache.draft()
    with pytest.raises(CorruptSlot):
        again.load_into(e, d)
    d.free()
    cache.close()
    with pytest.raises(CorruptSlot):
        SSDReader(e)
    assert again.report_corrupt(e, "test") is True
    assert again.get(s.key) is None and again.statistics().ssd_corrupt == 1
    assert logs(tmp_path) == []


class Crash(Exception):
    pass


def test_a_crash_between_the_folds_rename_and_the_logs_unlink(tmp_path, tier, caplog,
                                                             monkeypatch):
    s = Slot(b"a/s/crash", os.urandom(1 * MiB))
    put(tier, s)
    s.pwrite(0, b"a" * 4096)
    put(tier, s)
    monkeypatch.setattr(extentlog, "LOG_MAX_RECORDS", 1)

    def crash():
        raise Crash()
    tier.hooks["folded"] = crash
    s.pwrite(4096, b"b" * 4096)
    with pytest.raises(Crash):
        tier.put(s.ref(), {"mode": 0o600}, True)
    assert len(logs(tmp_path)) == 1              # the old log is still there
    caplog.set_level(logging.INFO)
    again = rescan(tmp_path)
    assert "an old extent log" in caplog.text
    assert logs(tmp_path) == []
    assert content(again, s.key) == bytes(s.data)


def test_a_crash_during_an_append_leaves_the_version_before(tmp_path, tier):
    s = Slot(b"a/s/app", os.urandom(1 * MiB))
    put(tier, s)
    before = bytes(s.data)

    def crash():
        raise Crash()
    tier.hooks["appended"] = crash
    s.pwrite(0, b"a" * 4096)
    with pytest.raises(Crash):
        tier.put(s.ref(), {}, True)
    assert content(rescan(tmp_path), s.key) == before


def test_metadata_change_of_a_logged_slot_appends_a_record(tmp_path, tier):
    s = Slot(b"a/s/meta", os.urandom(1 * MiB))
    put(tier, s)
    s.pwrite(0, b"a" * 4096)
    put(tier, s)
    written = tier.statistics().ssd_write_bytes
    e = tier.rewrite_meta(s.key, {"mode": 0o644, "uid": 7})
    assert e.log is not None and len(e.log.records) == 2
    assert tier.statistics().ssd_write_bytes - written < 4096
    again = rescan(tmp_path)
    assert again.get(s.key).meta == {"mode": 0o644, "uid": 7}
    assert content(again, s.key) == bytes(s.data)


def test_a_slot_shrinking_below_the_packing_threshold_leaves_no_log(tmp_path, tier):
    s = Slot(b"a/s/small", os.urandom(1 * MiB))
    put(tier, s)
    s.pwrite(0, b"a" * 4096)
    put(tier, s)
    s.truncate(1000)
    put(tier, s)
    assert logs(tmp_path) == []
    again = rescan(tmp_path)
    assert content(again, s.key) == bytes(s.data)


def test_trailer_layout_base(tmp_path, tier, monkeypatch):
    import memosfs.store.ssd.whole as whole
    monkeypatch.setattr(whole, "WRITE_BARE", False)
    s = Slot(b"a/s/trailer", os.urandom(1 * MiB + 17))
    put(tier, s)
    s.pwrite(1 * MiB, b"t" * 17)
    s.pwrite(4096, b"u" * 100)
    put(tier, s)
    e = tier.get(s.key)
    assert e.log is not None and not e.bare
    assert tier.open_backing(s.key) is None
    assert content(rescan(tmp_path), s.key) == bytes(s.data)


def test_an_unsynced_append_is_fsynced_by_sync(tmp_path, tier, monkeypatch):
    s = Slot(b"a/s/sync", os.urandom(1 * MiB))
    put(tier, s)
    s.pwrite(0, b"a" * 4096)
    put(tier, s, durable=False)
    assert tier.get(s.key).synced is False
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(
        f"/proc/self/fd/{fd}")), real(fd)))
    tier.sync_key(s.key)
    assert any(p.endswith(".log") for p in synced)
    assert tier.get(s.key).synced is True


def test_extents_model():
    """extentlog.extents against bytes built step by step."""
    import random
    rnd = random.Random(5)
    base = bytes(rnd.randrange(256) for _ in range(50_000))
    logbuf = bytearray(b"L" * 10)
    recs = []
    cur = bytearray(base)
    for _ in range(30):
        cut = rnd.randrange(0, len(cur) + 1) if rnd.random() < 0.3 else len(cur)
        size = rnd.randrange(cut, 70_000) if rnd.random() < 0.3 else max(cut, len(cur) if
                                                                         cut == len(cur)
                                                                         else cut)
        nxt = bytearray(cur[:cut]) + bytearray(size - cut)
        runs, o = [], 0
        while o < size:
            o += rnd.randrange(0, 9000)
            n = min(rnd.randrange(1, 5000), size - o)
            if n <= 0:
                break
            runs.append((o, n))
            o += n
        pos = len(logbuf)
        for ro, n in runs:
            piece = bytes(rnd.randrange(256) for _ in range(n))
            nxt[ro:ro + n] = piece
            logbuf += piece
        recs.append(extentlog.LogRecord(0, 0, pos, 1, (0, 0, 0), 0, size, 0, cut,
                                        tuple(runs), {}))
        cur = nxt
        ext = extentlog.extents(len(base), recs)
        out = bytearray()
        for s, e, where, so in ext:
            assert s == len(out)
            out += (bytes(e - s) if where == extentlog.ZERO else
                    base[so:so + e - s] if where == extentlog.BASE else logbuf[so:so + e - s])
        assert bytes(out) == bytes(cur)


# ---------------------------------------------------------------- mounted

needs_changes = pytest.mark.skipif(not hasattr(_native.Ref, "changes"),
                                   reason="the C core has no Ref.changes")


def _session(m):
    m.p("agent").mkdir(exist_ok=True)
    m.p("agent", "s1").mkdir(exist_ok=True)
    return m.p("agent", "s1")


def _stats(m) -> dict:
    import json
    return json.loads(m.ctl("stats.json").read_text())


def _proc_write_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                return int(line.split()[1])
    return 0


@needs_changes
def test_mounted_64m_slot_changed_in_place_50_times(make_mount):
    m = make_mount(capacity="256M", writeback_delay_ms=3600000)
    s = _session(m)
    size, n, page = 64 * MiB, 50, 4096
    data = bytearray(os.urandom(size))
    path = s / "big"
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    first = _stats(m)["ssd_write_bytes"]
    io0 = _proc_write_bytes(m.proc.pid)
    fd = os.open(path, os.O_WRONLY)
    try:
        for i in range(n):
            off = (i * 7919 % (size // page)) * page
            piece = os.urandom(page)
            os.pwrite(fd, piece, off)
            data[off:off + page] = piece
            os.fsync(fd)
    finally:
        os.close(fd)
    st = _stats(m)
    changed = n * page
    wrote = st["ssd_write_bytes"]
    assert st["ssd_log_appends"] >= n - 1, st
    assert wrote <= 2 * (size + changed), (first, wrote)
    assert wrote - first <= 4 * changed
    assert _proc_write_bytes(m.proc.pid) - io0 <= 2 * (size + changed)
    assert path.read_bytes() == bytes(data)
    # out of memory, read back from the SSD (file and log)
    m.ctl("evict").write_text("agent/s1/big\n")
    assert os.getxattr(path, "user.memos.tier") == b"ssd"
    assert path.read_bytes() == bytes(data)
    m.stop()
    assert m.proc.returncode == 0
    m2 = make_mount(ssd=str(m.ssd), capacity="256M")
    assert m2.p("agent", "s1", "big").read_bytes() == bytes(data)


@needs_changes
def test_mounted_truncate_rename_unlink_and_remount(make_mount):
    m = make_mount(capacity="64M", writeback_delay_ms=3600000)
    s = _session(m)
    data = bytearray(os.urandom(4 * MiB))
    (s / "a").write_bytes(data)
    with open(s / "a", "r+b") as f:
        os.fsync(f.fileno())
        f.truncate(1_000_003)
        f.truncate(3 * MiB)
        f.seek(2 * MiB)
        f.write(b"w" * 10000)
        f.flush()
        os.fsync(f.fileno())
    want = bytearray(data[:1_000_003]) + bytearray(3 * MiB - 1_000_003)
    want[2 * MiB:2 * MiB + 10000] = b"w" * 10000
    assert _stats(m)["ssd_log_appends"] >= 1
    assert (s / "a").read_bytes() == bytes(want)
    (s / "b").write_bytes(b"b" * MiB)
    with open(s / "b", "r+b") as f:
        os.fsync(f.fileno())
        f.seek(4096)
        f.write(b"x" * 4096)
        f.flush()
        os.fsync(f.fileno())
    os.rename(s / "a", s / "c")
    os.unlink(s / "b")
    m.ctl("flush").write_text("1\n")
    assert sorted((m.ssd / "slots").glob("*/*.log")) == []
    m.stop()
    assert m.proc.returncode == 0
    m2 = make_mount(ssd=str(m.ssd), capacity="64M")
    s2 = m2.p("agent", "s1")
    assert sorted(os.listdir(s2)) == ["c"]
    assert (s2 / "c").read_bytes() == bytes(want)


def test_a_fold_over_an_unsynced_append_is_fsynced_before_its_rename(tmp_path, tier,
                                                                     monkeypatch):
    """The base and the first records may be durable (acknowledged) even when
    the last append is not: the whole version replacing them is fsync'd
    before it is renamed over the base."""
    s = Slot(b"a/s/fold", os.urandom(1 * MiB))
    put(tier, s)                                   # durable
    s.pwrite(0, b"a" * 4096)
    put(tier, s, durable=False)
    assert tier.get(s.key).synced is False
    monkeypatch.setattr(extentlog, "LOG_MAX_RECORDS", 1)
    order = []
    real_fsync, real_rename = os.fsync, os.rename
    monkeypatch.setattr(os, "fsync", lambda fd: (order.append("fsync"), real_fsync(fd)))
    monkeypatch.setattr(os, "rename", lambda a, b: (order.append("rename"),
                                                    real_rename(a, b)))
    s.pwrite(8192, b"b" * 4096)
    put(tier, s, durable=False)
    assert order[:2] == ["fsync", "rename"] and tier.statistics().ssd_folds == 1


def test_a_metadata_change_of_a_logged_slot_folds_on_a_passthrough_mount(tmp_path, tier):
    s = Slot(b"a/s/chown", os.urandom(2 * MiB))
    put(tier, s)
    s.pwrite(0, b"a" * 4096)
    put(tier, s)
    written = tier.statistics().ssd_write_bytes
    for uid in range(3):
        e = tier.rewrite_meta(s.key, {"mode": 0o600, "uid": uid})
    assert e.log is not None and len(e.log.records) == 4
    assert tier.statistics().ssd_write_bytes - written < 4096
    tier.write_bare = True                      # a passthrough mount: the log folds
    e = tier.rewrite_meta(s.key, {"mode": 0o600, "uid": 9})
    assert e.log is None and tier.statistics().ssd_folds == 1 and not logs(tmp_path)
    fd, _entry = tier.open_backing(s.key)
    os.close(fd)
    again = rescan(tmp_path)
    assert again.get(s.key).meta == {"mode": 0o600, "uid": 9}
    assert content(again, s.key) == bytes(s.data)


def test_a_logged_write_back_reads_only_its_runs_for_its_checksum(tmp_path, tier, monkeypatch):
    """A write-back that becomes a log record gets its version's crc32c from
    the version before and the changed runs (extentlog.crc_after_runs), not
    by reading the whole version; with a cut into the version before it
    reads the whole.  Either way the crc checks out when read back."""
    s = Slot(b"a/s/crc", os.urandom(4 * MiB))
    put(tier, s)
    whole = []
    monkeypatch.setattr(FakeRef, "crc32c",
                        lambda self, off=0, n=-1: whole.append(1) or _native.crc32c(self.data))
    for i in range(5):
        s.pwrite(i * 300_000 + 7, os.urandom(5000))
        put(tier, s)
    s.truncate(len(s.data) + 70_000)            # grown: still from the runs
    s.pwrite(len(s.data) - 10, b"tail")
    put(tier, s)
    assert whole == [] and tier.statistics().ssd_log_appends == 6
    assert content(tier, s.key) == bytes(s.data)
    s.truncate(1 * MiB)                         # a cut: read whole
    s.pwrite(5, b"x")
    put(tier, s)
    assert whole == [1]
    assert content(tier, s.key) == bytes(s.data)
    assert content(rescan(tmp_path), s.key) == bytes(s.data)


def test_crc_after_runs_matches_a_whole_read():
    import random
    rng = random.Random(5)
    for _ in range(200):
        base = rng.randbytes(rng.randrange(0, 3000))
        size = len(base) + rng.choice((0, 0, rng.randrange(1, 2000)))
        new = bytearray(base) + bytes(size - len(base))
        runs = []
        pos = 0
        while pos < size and rng.random() < 0.8:
            o = rng.randrange(pos, size)
            n = rng.randrange(1, min(300, size - o) + 1)
            new[o:o + n] = rng.randbytes(n)
            runs.append((o, n))
            pos = o + n
        got = extentlog.crc_after_runs(_native.crc32c(base), len(base), size, runs,
                                       lambda o, n: base[o:o + n],
                                       lambda o, n: bytes(new[o:o + n]))
        assert got == _native.crc32c(bytes(new))
