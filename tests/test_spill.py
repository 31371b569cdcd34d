"""Drafts spill to the SSD tier (docs/semantics.md, "When memory is full";
docs/design.md, "Spilled drafts"): a writer whose draft the memory tier has
no room for continues in a file of the SSD directory's spill/ folder, and
its publish makes that file the slot's version on the SSD tier; ENOSPC only
when the SSD directory's ssd_capacity or its disk is full.  Real mounts in
the default mode (no passthrough)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

MiB = 1 << 20


def _spill_files(m) -> list[str]:
    try:
        return os.listdir(Path(m.ssd) / "spill")
    except FileNotFoundError:
        return []


def _pattern(seed: int, n: int) -> bytes:
    """n bytes that differ at every MiB (a misplaced chunk shows)."""
    return b"".join(bytes([seed]) * 4096 + i.to_bytes(4, "little") * ((MiB - 4096) // 4)
                    for i in range(n // MiB))


def _mount(make_mount, **opts):
    if os.environ.get("MEMOSFS_TEST_PASSTHROUGH") == "1":
        opts.setdefault("passthrough", 0)       # (the default mode is what spills)
    m = make_mount(**opts)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    return m, d


def test_two_writers_48m_each_on_a_64m_tier_both_finish_and_survive_a_remount(make_mount):
    m, d = _mount(make_mount, capacity="64M")
    data = {f"w{i}": _pattern(i, 48 * MiB) for i in (1, 2)}
    errors: list = []
    go = threading.Barrier(2)

    def write(name: str) -> None:
        try:
            go.wait()
            with open(d / name, "wb") as f:
                buf = memoryview(data[name])
                for off in range(0, len(buf), MiB):
                    f.write(buf[off:off + MiB])
        except OSError as e:
            errors.append((name, e))

    ts = [threading.Thread(target=write, args=(name,)) for name in data]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    for name, want in data.items():
        assert (d / name).read_bytes() == want, name
    st = m.stats()
    assert st["spills"] >= 1 and st["spill_publishes"] >= 1, st
    assert st["slots_lost"] == 0
    assert _spill_files(m) == []
    m.stop()
    m2 = make_mount(capacity="64M", ssd=m.ssd)
    for name, want in data.items():
        assert m2.p("a", "s", name).read_bytes() == want, name


def test_one_writer_larger_than_memory_reads_its_own_draft_and_truncates(make_mount):
    """A slot larger than the memory tier (EFBIG before drafts spilled): the
    writer sees its own unpublished bytes and size, others the version
    before; ftruncate and fallocate work on the spilled draft."""
    m, d = _mount(make_mount, capacity="16M")
    old = b"old version" * 1000
    (d / "big").write_bytes(old)
    want = _pattern(7, 40 * MiB)
    with open(d / "big", "r+b") as f:
        f.truncate(0)
        f.write(want)
        f.flush()
        assert os.fstat(f.fileno()).st_size == len(want)
        f.seek(0)
        assert f.read() == want                     # its own bytes, before the close
        seen = subprocess.run([sys.executable, "-c",
                               "import os,sys; print(os.stat(sys.argv[1]).st_size)",
                               str(d / "big")], capture_output=True, text=True, timeout=60)
        assert int(seen.stdout) == len(old)         # others: the published version
        assert (d / "big").open("rb").read(11) == b"old version"
        f.truncate(30 * MiB)                        # shrink the spilled draft
        want = want[:30 * MiB]
        os.posix_fallocate(f.fileno(), 0, 33 * MiB)     # and grow it (zeros)
        want += bytes(3 * MiB)
        f.seek(0, os.SEEK_END)
        f.write(b"tail")
        want += b"tail"
    assert (d / "big").read_bytes() == want
    st = m.stats()
    assert st["spills"] == 1 and st["spill_publishes"] == 1, st
    assert st["spill_bytes"] >= 16 * MiB
    assert _spill_files(m) == []
    # the writer of a spilled version goes on from it (in place, no O_TRUNC)
    with open(d / "big", "r+b") as f:
        f.seek(5 * MiB)
        f.write(b"X" * MiB)
    want = want[:5 * MiB] + b"X" * MiB + want[6 * MiB:]
    assert (d / "big").read_bytes() == want
    m.stop()
    m2 = make_mount(capacity="16M", ssd=m.ssd)
    assert m2.p("a", "s", "big").read_bytes() == want


def test_fsync_of_a_spilled_draft_is_durable_across_kill9(make_mount):
    m, d = _mount(make_mount, capacity="16M")
    want = _pattern(3, 24 * MiB)
    fd = os.open(d / "durable", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, want)
        os.fsync(fd)
        assert m.stats()["spills"] == 1
        m.kill9()
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    m2 = make_mount(capacity="16M", ssd=m.ssd)
    assert m2.p("a", "s", "durable").read_bytes() == want


def test_kill9_while_spilled_keeps_the_version_before_and_leaves_no_spill_file(make_mount):
    m, d = _mount(make_mount, capacity="16M")
    before = _pattern(1, 2 * MiB)
    with open(d / "slot", "wb") as f:
        f.write(before)
        os.fsync(f.fileno())
    fd = os.open(d / "slot", os.O_WRONLY | os.O_TRUNC)
    try:
        os.write(fd, _pattern(2, 24 * MiB))         # spilled, never published
        assert len(_spill_files(m)) == 1
        m.kill9()
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    assert len(_spill_files(m)) == 1                # what the crash left ...
    m2 = make_mount(capacity="16M", ssd=m.ssd)
    assert _spill_files(m2) == []                   # ... goes at mount
    assert m2.p("a", "s", "slot").read_bytes() == before


def test_enospc_when_ssd_capacity_cannot_hold_the_spilled_draft(make_mount):
    m, d = _mount(make_mount, capacity="16M", ssd_capacity="24M")
    before = b"before" * 1000
    (d / "slot").write_bytes(before)
    f = open(d / "slot", "wb")
    with pytest.raises(OSError) as got:
        for _ in range(40):
            f.write(b"z" * MiB)
            f.flush()
    assert got.value.errno == errno.ENOSPC
    with pytest.raises(OSError) as got:
        f.close()                                   # not published: a write was refused
    assert got.value.errno == errno.ENOSPC
    assert (d / "slot").read_bytes() == before
    why = m.path.joinpath(".memos", "why").read_text()
    assert "ssd_capacity" in why, why
    assert _spill_files(m) == []
    # a new name refused so leaves no name
    f = open(d / "new", "wb")
    with pytest.raises(OSError):
        for _ in range(40):
            f.write(b"n" * MiB)
            f.flush()
    with pytest.raises(OSError):
        f.close()
    assert not (d / "new").exists()


def test_rename_and_unlink_while_spilled(make_mount):
    m, d = _mount(make_mount, capacity="16M")
    want = _pattern(5, 20 * MiB)
    with open(d / "tmp", "wb") as f:
        f.write(want[:18 * MiB])
        assert len(_spill_files(m)) == 1
        os.rename(d / "tmp", d / "final")           # the engine pattern, mid-write
        f.write(want[18 * MiB:])
    assert not (d / "tmp").exists()
    assert (d / "final").read_bytes() == want
    with open(d / "gone", "wb") as f:
        f.write(want)
        assert len(_spill_files(m)) == 1
        os.unlink(d / "gone")
        f.write(b"more")
    assert not (d / "gone").exists()
    assert _spill_files(m) == []
    assert m.stats()["spills"] == 2
    # cut below ssd_pack_below: published as a packed record
    with open(d / "small", "wb") as f:
        f.write(want)
        f.truncate(100)
    assert (d / "small").read_bytes() == want[:100]
    # fsync publishes; the writer goes on from that version (spilling again)
    with open(d / "synced", "wb") as f:
        f.write(want)
        os.fsync(f.fileno())
        f.write(b"after the fsync")
    assert (d / "synced").read_bytes() == want + b"after the fsync"
    assert _spill_files(m) == []
    m.stop()
    m2 = make_mount(capacity="16M", ssd=m.ssd)
    assert m2.p("a", "s", "small").read_bytes() == want[:100]
    assert m2.p("a", "s", "final").read_bytes() == want
    assert m2.p("a", "s", "synced").read_bytes() == want + b"after the fsync"


def test_without_an_ssd_tier_nothing_spills(make_mount):
    m, d = _mount(make_mount, capacity="16M", ssd="none")
    f = open(d / "big", "wb")
    with pytest.raises(OSError) as got:
        for _ in range(24):
            f.write(b"b" * MiB)
            f.flush()
    assert got.value.errno in (errno.ENOSPC, errno.EFBIG)
    with pytest.raises(OSError):
        f.close()
    assert not (d / "big").exists()


def test_a_spill_under_the_writeback_cache(make_mount):
    """The kernel hands the pages over at close: the draft spills then, and
    the close publishes it whole."""
    m, d = _mount(make_mount, capacity="16M", writeback_cache=1)
    want = _pattern(9, 24 * MiB)
    with open(d / "wb", "wb") as f:
        f.write(want)
    assert (d / "wb").read_bytes() == want
    assert m.stats()["spill_publishes"] == 1


def test_a_spilled_rewrite_of_a_slot_with_an_extent_log_replaces_it_and_its_log(make_mount):
    """A large slot changed in place has an extent log beside its file; a
    whole rewrite larger than memory spills, and its publish puts a new file
    in place: the log goes with the version it belonged to, and after a
    remount the name reads the spilled version."""
    m, d = _mount(make_mount, capacity="16M")
    first = _pattern(3, 8 * MiB)
    (d / "big").write_bytes(first)
    fd = os.open(d / "big", os.O_WRONLY)
    try:
        os.fsync(fd)                            # written whole
        os.pwrite(fd, b"x" * 4096, 4 * MiB)
        os.fsync(fd)                            # a record of the log
    finally:
        os.close(fd)
    assert m.stats()["ssd_log_appends"] >= 1
    logs = [p for p in Path(m.ssd, "slots").rglob("*.log")]
    assert logs
    second = _pattern(4, 24 * MiB)              # more than the memory tier
    with open(d / "big", "wb") as f:
        f.write(second)
    assert m.stats()["spill_publishes"] >= 1
    assert not [p for p in Path(m.ssd, "slots").rglob("*.log")]
    m.stop()
    m2 = make_mount(ssd=str(m.ssd), capacity="16M")
    assert (m2.p("a", "s", "big")).read_bytes() == second


def test_a_change_to_a_sparse_slot_larger_than_memory_stays_sparse(make_mount):
    """A 1 GiB sparse slot on a 16M tier: a change that keeps its content
    starts its draft in a spill file copied from the SSD file's data extents
    (its holes stay holes, nothing read whole into memory), and the slot
    reads back as written, after a remount too."""
    m, d = _mount(make_mount, capacity="16M")
    big = 1 << 30
    with open(d / "sparse", "wb") as f:
        f.truncate(big)
        f.seek(512 * MiB)
        f.write(b"middle")
    def rchar() -> int:                         # bytes the daemon's reads returned
        for line in open(f"/proc/{m.proc.pid}/io"):
            if line.startswith("rchar:"):
                return int(line.split()[1])
        raise AssertionError("no rchar")

    before = rchar()
    fd = os.open(d / "sparse", os.O_WRONLY)
    try:
        os.pwrite(fd, b"early", 100 * MiB)
        os.pwrite(fd, b"end", big - 3)
    finally:
        os.close(fd)
    assert m.stats()["spill_publishes"] >= 2
    assert rchar() - before < 64 * MiB         # its data, not its 1 GiB of holes

    def check(path):
        assert os.stat(path).st_size == big
        fd = os.open(path, os.O_RDONLY)
        try:
            assert os.pread(fd, 5, 100 * MiB) == b"early"
            assert os.pread(fd, 6, 512 * MiB) == b"middle"
            assert os.pread(fd, 3, big - 3) == b"end"
            assert os.pread(fd, 4096, 300 * MiB) == bytes(4096)
        finally:
            os.close(fd)

    check(d / "sparse")
    files = [p for p in Path(m.ssd, "slots").rglob("*") if p.is_file()]
    assert files and max(p.stat().st_blocks * 512 for p in files) < 64 * MiB
    m.stop()
    m2 = make_mount(ssd=str(m.ssd), capacity="16M")
    check(m2.p("a", "s", "sparse"))


def test_truncate_by_path_beyond_memory_spills(make_mount):
    """truncate(2) of a slot nobody has open makes its new version at once:
    one larger than the memory tier is made in a spill file, not refused
    (EFBIG before), and keeps the bytes below the old size."""
    m, d = _mount(make_mount, capacity="16M")
    (d / "t").write_bytes(b"keep" * 1024)
    os.truncate(d / "t", 100 * MiB)
    assert os.stat(d / "t").st_size == 100 * MiB
    with open(d / "t", "rb") as f:
        assert f.read(4096) == b"keep" * 1024
        f.seek(50 * MiB)
        assert f.read(4096) == bytes(4096)
    os.truncate(d / "t", 8)                     # and back below memory's half
    assert (d / "t").read_bytes() == b"keepkeep"
    m.stop()
    m2 = make_mount(ssd=str(m.ssd), capacity="16M")
    assert m2.p("a", "s", "t").read_bytes() == b"keepkeep"
