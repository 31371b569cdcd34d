"""Payload-only slot files: the file is the slot's bytes, its trailer the
`user.memosfs.slot` attribute (docs/ssd-format.md), and open_backing, the
descriptor the FUSE passthrough reader hands to the kernel.

Covered: new files carry no trailer and carry the attribute; folders of the
trailer layout (older memosfs; forced here with ssd.WRITE_BARE = False) and
mixed folders scan, load and check; a payload damaged in the new layout is
caught by open_backing and by load (set aside, ssd_corrupt); a damaged or
missing attribute is set aside at scan; a file system that refuses the
attribute (simulated: os.setxattr raising) gets the trailer layout, logged
once; rename and rewrite_meta write the new layout; open_backing checks a
file's payload once; a mount writes payload-only files and mounts an older
folder.  In-process tiers write a file for every slot (PACK_BELOW 0)."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import pytest

import memosfs.store.ssd as ssd_mod
import memosfs.store.ssd.packed as segments
import memosfs.store.ssd.whole as whole
from memosfs import _native
from memosfs.store.ssd import MAGIC, XATTR, CorruptSlot, SSDTier, StaleEntry
from memosfs.store.store import Store

MiB = 1 << 20
KiB = 1 << 10


@pytest.fixture(autouse=True)
def files_only(monkeypatch):
    monkeypatch.setattr(segments, "PACK_BELOW", 0)


@pytest.fixture
def cache():
    c = _native.Cache(64 * MiB)
    yield c
    c.close()


@pytest.fixture
def old_layout(monkeypatch):
    """Write the trailer layout, as memosfs did before payload-only files;
    undo() (or the end of the test) goes back to the new layout."""
    monkeypatch.setattr(whole, "WRITE_BARE", False)
    return monkeypatch


def publish(cache, key: bytes, data: bytes):
    d = cache.draft()
    if data:
        d.write(0, data)
    return cache.publish(d, key)


def put(tier, cache, key: bytes, data: bytes, meta=None, durable=True):
    ref = publish(cache, key, data)
    try:
        return tier.put(ref, meta if meta is not None else {"mode": 0o644}, durable=durable)
    finally:
        ref.release()


def load(tier, cache, key: bytes) -> bytes:
    e = tier.get(key)
    d = cache.draft()
    try:
        tier.load_into(e, d)
        return d.read(0, e.size + 1)
    finally:
        d.free()


def reopen(root) -> SSDTier:
    t = SSDTier(str(root))
    t.scan()
    return t


def file_of(tier, key: bytes) -> Path:
    return Path(tier._path_of(key)[1])


def has_attr(path) -> bool:
    return XATTR in os.listxattr(path)


def slot_files(root) -> list[Path]:
    return sorted(Path(root, "slots").glob("*/*.slot"))


def corrupt_files(root) -> list[str]:
    d = Path(root, "corrupt")
    return sorted(os.listdir(d)) if d.exists() else []


def flip(path: Path, off: int) -> None:
    """Flip one byte of a file in place (same inode, same size)."""
    fd = os.open(path, os.O_RDWR)
    try:
        b = os.pread(fd, 1, off)
        os.pwrite(fd, bytes([b[0] ^ 0x5A]), off)
    finally:
        os.close(fd)


# ---------------------------------------------------------------- the layout


@pytest.mark.parametrize("size", [0, 1, 4095, 64 * KiB, 256 * KiB + 3])
def test_new_files_are_the_payload_alone_with_the_trailer_in_the_attribute(tmp_path, cache,
                                                                            size):
    tier = SSDTier(str(tmp_path))
    payload = os.urandom(size)
    e = put(tier, cache, b"a/s/x", payload, meta={"mode": 0o600, "uid": 7})
    f = file_of(tier, b"a/s/x")
    assert e.bare and f.stat().st_size == size and f.read_bytes() == payload
    value = os.getxattr(f, XATTR)
    assert value[-8:] == MAGIC
    assert e.file_bytes == size + len(value)            # what ssd_capacity counts
    assert tier.statistics().ssd_bytes == e.file_bytes
    tier.check()
    again = reopen(tmp_path)
    [e2] = again.entries()
    assert e2.bare and (e2.key, e2.version, e2.size, e2.crc, e2.file_bytes, e2.meta) == \
        (b"a/s/x", 1, size, e.crc, e.file_bytes, {"mode": 0o600, "uid": 7})
    assert load(again, cache, b"a/s/x") == payload
    again.check()


def test_a_payload_ending_in_zeros_keeps_its_length_and_holes(tmp_path, cache):
    """Holes stay holes (write_to_fd skips zero pieces), and the file is still
    exactly the slot's length although nothing is written at its end."""
    tier = SSDTier(str(tmp_path))
    payload = b"head" + bytes(1 * MiB)
    e = put(tier, cache, b"a/s/z", payload)
    f = file_of(tier, b"a/s/z")
    assert e.bare and f.stat().st_size == len(payload)
    assert f.stat().st_blocks * 512 < len(payload)        # sparse
    assert load(reopen(tmp_path), cache, b"a/s/z") == payload


def test_an_older_folder_mounts_and_reads_unchanged(tmp_path, cache, old_layout):
    blobs = {f"a/s/old{i}".encode(): os.urandom(i * 7000) for i in range(6)}
    tier = SSDTier(str(tmp_path))
    for k, v in blobs.items():
        e = put(tier, cache, k, v, meta={"mode": 0o640})
        assert not e.bare
    before = {f: f.read_bytes() for f in slot_files(tmp_path)}
    assert all(not has_attr(f) for f in before)
    assert all(data[-8:] == MAGIC for data in before.values())
    old_layout.undo()                                       # today's code reads it
    again = reopen(tmp_path)
    assert sorted(again.keys()) == sorted(blobs)
    assert all(not e.bare for e in again.entries()) and again.corrupt == 0
    for k, v in blobs.items():
        assert load(again, cache, k) == v
        assert again.get(k).meta == {"mode": 0o640}
        assert again.open_backing(k) is None                # not payload-only
    again.check()
    # reading changed nothing on disk
    assert {f: f.read_bytes() for f in slot_files(tmp_path)} == before
    # a new version of one is written in the new layout, beside the old ones
    put(again, cache, b"a/s/old3", b"new" * 30000)
    assert again.get(b"a/s/old3").bare
    third = reopen(tmp_path)
    assert load(third, cache, b"a/s/old3") == b"new" * 30000
    assert load(third, cache, b"a/s/old4") == blobs[b"a/s/old4"]
    assert [k for k, e in sorted(third.index.items()) if e.bare] == [b"a/s/old3"]
    third.check()


def test_a_store_promotes_from_both_layouts(tmp_path, old_layout):
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path)))
    d = store.draft()
    d.write(0, b"o" * 100000)
    store.publish(d, b"a/s/old").release()
    store.flush()
    old_layout.undo()
    d = store.draft()
    d.write(0, b"n" * 100000)
    store.publish(d, b"a/s/new").release()
    store.flush()
    store.close()
    store = Store(16 * MiB, ssd=reopen(tmp_path))
    assert {k: e.bare for k, e in store.ssd.index.items()} == {b"a/s/old": False,
                                                               b"a/s/new": True}
    for key, byte in ((b"a/s/old", b"o"), (b"a/s/new", b"n")):
        ref = store.get(key)
        assert ref.read(0, 200000) == byte * 100000
        ref.release()
    store.close()


# ---------------------------------------------------------------- damage


def test_a_damaged_payload_is_caught_by_load_and_set_aside(tmp_path, cache):
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/x", os.urandom(300 * KiB))
    f = file_of(tier, b"a/s/x")
    flip(f, 200 * KiB)
    again = reopen(tmp_path)                                # the attribute checks out ...
    e = again.get(b"a/s/x")
    d = cache.draft()
    with pytest.raises(CorruptSlot, match="payload checksum mismatch"):
        again.load_into(e, d)                               # ... the payload does not
    d.free()
    assert again.report_corrupt(e, "payload checksum mismatch")
    assert again.get(b"a/s/x") is None and not f.exists()
    assert corrupt_files(tmp_path) == [f.name]
    assert again.statistics().ssd_corrupt == 1
    again.check()


def test_a_damaged_payload_is_never_served_by_a_store(tmp_path):
    store = Store(16 * MiB, ssd=SSDTier(str(tmp_path)))
    d = store.draft()
    d.write(0, os.urandom(200 * KiB))
    store.publish(d, b"a/s/x").release()
    store.flush()
    store.close()
    [f] = slot_files(tmp_path)
    flip(f, 5)
    store = Store(16 * MiB, ssd=reopen(tmp_path))
    assert store.get(b"a/s/x") is None
    assert store.ssd.statistics().ssd_corrupt == 1 and corrupt_files(tmp_path) == [f.name]
    store.close()


def test_open_backing_catches_a_damaged_payload(tmp_path, cache):
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/x", os.urandom(300 * KiB))
    f = file_of(tier, b"a/s/x")
    flip(f, 123)
    again = reopen(tmp_path)
    assert again.open_backing(b"a/s/x") is None
    assert again.get(b"a/s/x") is None and not f.exists()
    assert corrupt_files(tmp_path) == [f.name]
    assert again.statistics().ssd_corrupt == 1
    assert again.open_backing(b"a/s/x") is None             # gone: nothing to open
    again.check()


def _damage(f: Path, how: str) -> None:
    if how == "attribute-byte":                 # a flipped byte in the trailer
        v = bytearray(os.getxattr(f, XATTR))
        v[20] ^= 0xFF
        os.setxattr(f, XATTR, bytes(v))
    elif how == "attribute-footer":             # ... in its footer (the magic)
        v = bytearray(os.getxattr(f, XATTR))
        v[-1] ^= 0xFF
        os.setxattr(f, XATTR, bytes(v))
    elif how == "attribute-short":
        os.setxattr(f, XATTR, b"MEMOSLT1")
    elif how == "attribute-missing":            # the file alone: no footer either
        os.removexattr(f, XATTR)
    elif how == "attribute-flag":               # a trailer not marked payload-only
        from memosfs.store.ssd import encode_trailer
        e = read(f)
        os.setxattr(f, XATTR, encode_trailer(e.key, e.version, e.size, e.crc, e.meta))
    elif how == "truncated":
        os.truncate(f, f.stat().st_size - 1000)
    elif how == "extended":
        with open(f, "ab") as fh:
            fh.write(b"tail")
    elif how == "foreign":                      # another key's valid attribute
        from memosfs.store.ssd import encode_trailer
        e = read(f)
        os.setxattr(f, XATTR, encode_trailer(b"b/s/other", e.version, e.size, e.crc, e.meta,
                                             flags=ssd_mod.FLAG_BARE))
    else:
        raise AssertionError(how)


def read(f: Path):
    fd = os.open(f, os.O_RDONLY)
    try:
        return ssd_mod.read_trailer(fd, str(f))
    finally:
        os.close(fd)


@pytest.mark.parametrize("how", ["attribute-byte", "attribute-footer", "attribute-short",
                                 "attribute-missing", "attribute-flag", "truncated",
                                 "extended", "foreign"])
def test_a_bad_attribute_or_size_is_set_aside_at_scan(tmp_path, cache, how, caplog):
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/x", os.urandom(70000))
    put(tier, cache, b"a/s/ok", os.urandom(70000))
    f = file_of(tier, b"a/s/x")
    _damage(f, how)
    with caplog.at_level(logging.ERROR, logger="memosfs.store.ssd"):
        again = reopen(tmp_path)
    assert again.keys() == [b"a/s/ok"]
    assert again.corrupt == 1 and corrupt_files(tmp_path) == [f.name]
    assert "corrupt slot file set aside" in caplog.text
    again.check()


def test_a_trailer_layout_file_whose_trailer_claims_payload_only_is_set_aside(tmp_path, cache,
                                                                              old_layout):
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/x", os.urandom(70000))
    f = file_of(tier, b"a/s/x")
    e = read(f)
    from memosfs.store.ssd import encode_trailer
    with open(f, "r+b") as fh:
        fh.truncate(e.size)
        fh.seek(e.size)
        fh.write(encode_trailer(e.key, e.version, e.size, e.crc, e.meta,
                                flags=ssd_mod.FLAG_BARE))
    again = reopen(tmp_path)
    assert again.keys() == [] and again.corrupt == 1


# ---------------------------------------------------------------- no attributes


def _refuse(monkeypatch, code: int, above: int = -1) -> list[int]:
    """os.setxattr (as ssd/whole.py calls it) raises `code` for values longer
    than `above` bytes; returns the lengths it was asked to set."""
    asked: list[int] = []
    real = os.setxattr

    def fake(target, name, value, *a, **kw):
        asked.append(len(value))
        if len(value) > above:
            raise OSError(code, os.strerror(code))
        return real(target, name, value, *a, **kw)
    monkeypatch.setattr(os, "setxattr", fake)
    return asked


@pytest.mark.parametrize("code", [errno.ENOTSUP, errno.EOPNOTSUPP])
def test_a_file_system_without_user_attributes_gets_the_trailer_layout(tmp_path, cache,
                                                                       monkeypatch, caplog,
                                                                       code):
    asked = _refuse(monkeypatch, code)
    tier = SSDTier(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="memosfs.store.ssd"):
        for i in range(5):
            e = put(tier, cache, f"a/s/k{i}".encode(), os.urandom(20000 + i))
            assert not e.bare
        tier.rename(b"a/s/k0", b"a/s/moved", {"mode": 0o600})
        tier.rewrite_meta(b"a/s/k1", {"mode": 0o400})
    assert len(asked) == 1                                  # not asked again
    warnings = [r for r in caplog.records if "refused" in r.getMessage()]
    assert len(warnings) == 1, caplog.text                  # logged once
    assert XATTR in warnings[0].getMessage()
    for f in slot_files(tmp_path):
        assert not has_attr(f) and f.read_bytes()[-8:] == MAGIC
    tier.check()
    monkeypatch.undo()
    again = reopen(tmp_path)
    assert sorted(again.keys()) == [b"a/s/k1", b"a/s/k2", b"a/s/k3", b"a/s/k4", b"a/s/moved"]
    assert again.get(b"a/s/k1").meta == {"mode": 0o400}
    assert all(not e.bare for e in again.entries()) and again.corrupt == 0
    assert again.open_backing(b"a/s/k2") is None
    again.check()


@pytest.mark.parametrize("code", [errno.E2BIG, errno.ENOSPC])
def test_a_metadata_too_large_for_the_attribute_gets_the_trailer_layout(tmp_path, cache,
                                                                       monkeypatch, caplog,
                                                                       code):
    """ext4 keeps about a block of attributes per file: a slot with many
    xattrs of its own (in its metadata) has a file of the trailer layout, the
    others stay payload-only."""
    asked = _refuse(monkeypatch, code, above=3000)
    tier = SSDTier(str(tmp_path))
    big = {"mode": 0o644, "xattrs": {"757365722e78": "ab" * 4000}}
    with caplog.at_level(logging.WARNING, logger="memosfs.store.ssd"):
        e1 = put(tier, cache, b"a/s/big1", os.urandom(70000), meta=big)
        e2 = put(tier, cache, b"a/s/big2", os.urandom(70000), meta=big)
        e3 = put(tier, cache, b"a/s/small", os.urandom(70000))
    assert (e1.bare, e2.bare, e3.bare) == (False, False, True)
    assert len(asked) == 3                                  # asked each time
    assert len([r for r in caplog.records if "refused" in r.getMessage()]) == 1
    tier.check()
    monkeypatch.undo()
    again = reopen(tmp_path)
    assert again.get(b"a/s/big1").meta == big and not again.get(b"a/s/big1").bare
    assert again.get(b"a/s/small").bare
    assert load(again, cache, b"a/s/big2") == load(tier, cache, b"a/s/big2")
    again.check()


def test_a_metadata_the_real_file_system_refuses_falls_back(tmp_path, cache):
    """The same, on the folder's own file system (ext4 refuses a value over
    its block; a file system that takes it keeps the file payload-only)."""
    tier = SSDTier(str(tmp_path))
    big = {"mode": 0o644, "xattrs": {"757365722e78": "cd" * 20000}}
    payload = os.urandom(70000)
    e = put(tier, cache, b"a/s/big", payload, meta=big)
    f = file_of(tier, b"a/s/big")
    assert f.stat().st_size == (len(payload) if e.bare else e.file_bytes)
    again = reopen(tmp_path)
    assert again.get(b"a/s/big").meta == big and again.get(b"a/s/big").bare == e.bare
    assert load(again, cache, b"a/s/big") == payload


def test_other_setxattr_errors_fail_the_write(tmp_path, cache, monkeypatch):
    _refuse(monkeypatch, errno.EIO)
    tier = SSDTier(str(tmp_path))
    with pytest.raises(OSError) as e:
        put(tier, cache, b"a/s/x", os.urandom(70000))
    assert e.value.errno == errno.EIO
    assert tier.get(b"a/s/x") is None and slot_files(tmp_path) == []
    assert not [n for d in (tmp_path / "slots").iterdir() for n in os.listdir(d)]  # no .tmp


# ---------------------------------------------------------------- rename, rewrite_meta


def test_rename_and_rewrite_meta_write_payload_only_files(tmp_path, cache):
    tier = SSDTier(str(tmp_path))
    payload = os.urandom(200 * KiB)
    put(tier, cache, b"a/s/x", payload)
    moved = tier.rename(b"a/s/x", b"a/s/y", {"mode": 0o600})
    f = file_of(tier, b"a/s/y")
    assert moved.bare and has_attr(f) and f.read_bytes() == payload
    assert not file_of(tier, b"a/s/x").exists()
    again = tier.rewrite_meta(b"a/s/y", {"mode": 0o400, "uid": 3})
    assert again.bare and again.ino != moved.ino
    assert f.read_bytes() == payload and f.stat().st_size == len(payload)
    tier.check()
    t2 = reopen(tmp_path)
    e = t2.get(b"a/s/y")
    assert e.bare and e.meta == {"mode": 0o400, "uid": 3} and t2.keys() == [b"a/s/y"]
    assert "moved_from" not in e.meta                       # rewrite_meta dropped the mark
    assert load(t2, cache, b"a/s/y") == payload
    fd, be = t2.open_backing(b"a/s/y")
    os.close(fd)
    assert be is e


def test_rename_and_rewrite_meta_of_older_files_write_the_new_layout(tmp_path, cache,
                                                                     old_layout):
    tier = SSDTier(str(tmp_path))
    a, b = os.urandom(100 * KiB), b"\0" * (300 * KiB) + b"end"
    put(tier, cache, b"a/s/a", a)
    put(tier, cache, b"a/s/b", b)
    old_layout.undo()
    t = reopen(tmp_path)
    assert not t.get(b"a/s/a").bare and not t.get(b"a/s/b").bare
    assert t.rename(b"a/s/a", b"a/s/a2", {"mode": 0o600}).bare
    assert t.rewrite_meta(b"a/s/b", {"mode": 0o600}).bare
    assert file_of(t, b"a/s/a2").read_bytes() == a
    assert file_of(t, b"a/s/b").read_bytes() == b                 # holes kept, no trailer
    t.check()
    t2 = reopen(tmp_path)
    assert sorted(t2.keys()) == [b"a/s/a2", b"a/s/b"]
    assert all(e.bare for e in t2.entries())
    assert load(t2, cache, b"a/s/a2") == a and load(t2, cache, b"a/s/b") == b


def test_a_rename_a_crash_cut_short_completes_with_payload_only_files(tmp_path, cache):
    """The copy under the new name carries moved_from in its attribute's
    metadata: the next scan removes the source, as with the trailer layout."""
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/x", os.urandom(100 * KiB))
    src = file_of(tier, b"a/s/x")
    tier._unlink_locked = lambda path: None     # the crash: the source's unlink never ran
    moved = tier.rename(b"a/s/x", b"a/s/y", {"mode": 0o600})
    assert moved.bare and src.exists()
    t2 = reopen(tmp_path)
    assert t2.keys() == [b"a/s/y"] and not src.exists()


def test_a_rename_cut_short_completes_when_a_power_loss_changed_the_sources_times(
        tmp_path, cache):
    """The mark names the source by the seq in its trailer: a power loss that
    takes back a change of the source inode's ctime (its rename into place not
    yet committed; LazyFS reports other times after a restart) must not leave
    the slot under both names."""
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/x", os.urandom(100 * KiB))
    src = file_of(tier, b"a/s/x")
    tier._unlink_locked = lambda path: None     # the crash: the source's unlink never ran
    tier.rename(b"a/s/x", b"a/s/y", {"mode": 0o600})
    os.chmod(src, 0o640)                        # (its ctime is another now)
    t2 = reopen(tmp_path)
    assert t2.keys() == [b"a/s/y"] and not src.exists()


# ---------------------------------------------------------------- open_backing


def test_open_backing_gives_the_indexed_file_and_checks_it_once(tmp_path, cache, monkeypatch):
    tier = SSDTier(str(tmp_path))
    payload = os.urandom(256 * KiB)
    e = put(tier, cache, b"a/s/x", payload)
    checks: list[str] = []
    real = whole._check_payload
    monkeypatch.setattr(whole, "_check_payload",
                        lambda fd, entry: (checks.append(entry.path), real(fd, entry)))
    fd, got = tier.open_backing(b"a/s/x")
    try:
        assert got is e and os.fstat(fd).st_ino == e.ino
        assert os.pread(fd, len(payload) + 10, 0) == payload
        assert os.get_inheritable(fd) is False
        assert fcntl_flags(fd) & os.O_ACCMODE == os.O_RDONLY
    finally:
        os.close(fd)
    assert len(checks) == 1
    for _ in range(3):                                      # the same file: no new check
        fd, _e = tier.open_backing(b"a/s/x")
        os.close(fd)
    assert len(checks) == 1
    put(tier, cache, b"a/s/x", os.urandom(256 * KiB))      # a new version: checked again
    fd, e2 = tier.open_backing(b"a/s/x")
    os.close(fd)
    assert e2.version == 2 and len(checks) == 2
    tier.rewrite_meta(b"a/s/x", {"mode": 0o600})            # a new file: checked again
    fd, _e = tier.open_backing(b"a/s/x")
    os.close(fd)
    assert len(checks) == 3
    # another daemon's life (a new tier) checks again
    again = reopen(tmp_path)
    fd, _e = again.open_backing(b"a/s/x")
    os.close(fd)
    assert len(checks) == 4


def fcntl_flags(fd: int) -> int:
    import fcntl
    return fcntl.fcntl(fd, fcntl.F_GETFL)


def resident_pages(path: Path, size: int) -> int:
    """How many of the file's first `size` bytes' pages are in the page
    cache (mincore of a mapping of it: the mapping reads nothing)."""
    import ctypes
    import mmap
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
        try:
            vec = (ctypes.c_ubyte * pages)()
            assert libc.mincore(addr, size, vec) == 0, ctypes.get_errno()
            return sum(v & 1 for v in vec)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def test_open_backing_leaves_the_payload_in_the_page_cache(tmp_path, cache):
    """The check's read leaves the pages cached for the passthrough reader."""
    import mmap
    tier = SSDTier(str(tmp_path))
    size = 2 * MiB
    put(tier, cache, b"a/s/x", os.urandom(size))
    f = file_of(tier, b"a/s/x")
    fd = os.open(f, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)     # out of the page cache
    os.close(fd)
    cold = resident_pages(f, size)
    fd, _e = tier.open_backing(b"a/s/x")
    os.close(fd)
    warm = resident_pages(f, size)
    assert warm == size // mmap.PAGESIZE and cold < warm, (cold, warm)


def test_open_backing_is_none_for_what_is_not_a_payload_only_file(tmp_path, cache,
                                                                  monkeypatch):
    tier = SSDTier(str(tmp_path))
    assert tier.open_backing(b"a/s/absent") is None
    monkeypatch.setattr(segments, "PACK_BELOW", 64 * KiB)
    tier.segs.pack_below = 64 * KiB
    e = put(tier, cache, b"a/s/small", b"tiny")
    assert isinstance(e, segments.PackedEntry)
    assert tier.open_backing(b"a/s/small") is None


def test_open_backing_looks_again_when_the_file_is_replaced(tmp_path, cache, monkeypatch):
    """StaleEntry from the open (a newer version's file under the path): the
    key is looked up again; only a file replaced at every look is StaleEntry."""
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/x", os.urandom(100 * KiB))
    real = whole.open_entry
    stale = [1]

    def racing(entry):
        if stale[0]:
            stale[0] -= 1
            raise StaleEntry(f"{entry.path}: replaced by another version")
        return real(entry)
    monkeypatch.setattr(whole, "open_entry", racing)
    fd, e = tier.open_backing(b"a/s/x")
    os.close(fd)
    assert e is tier.get(b"a/s/x")
    stale[0] = 100
    with pytest.raises(StaleEntry):
        tier.open_backing(b"a/s/x")
    assert tier.corrupt == 0 and tier.get(b"a/s/x") is not None


def test_open_backing_across_a_replacing_write_keeps_the_version_it_opened(tmp_path, cache):
    tier = SSDTier(str(tmp_path))
    v1 = os.urandom(100 * KiB)
    put(tier, cache, b"a/s/x", v1)
    fd, e = tier.open_backing(b"a/s/x")
    try:
        put(tier, cache, b"a/s/x", os.urandom(100 * KiB))
        assert os.pread(fd, len(v1), 0) == v1 and e.version == 1
    finally:
        os.close(fd)
    fd, e2 = tier.open_backing(b"a/s/x")
    os.close(fd)
    assert e2.version == 2


def test_the_cache_of_checked_files_is_bounded(tmp_path, cache, monkeypatch):
    monkeypatch.setattr(whole, "VERIFIED_FILES", 3)
    tier = SSDTier(str(tmp_path))
    for i in range(5):
        put(tier, cache, f"a/s/k{i}".encode(), os.urandom(70000))
    checks: list[str] = []
    real = whole._check_payload
    monkeypatch.setattr(whole, "_check_payload",
                        lambda fd, entry: (checks.append(entry.path), real(fd, entry)))
    for i in range(5):
        fd, _e = tier.open_backing(f"a/s/k{i}".encode())
        os.close(fd)
    assert len(tier._verified) == 3 and len(checks) == 5
    fd, _e = tier.open_backing(b"a/s/k4")                  # still known
    os.close(fd)
    assert len(checks) == 5
    fd, _e = tier.open_backing(b"a/s/k0")                  # pushed out: checked again
    os.close(fd)
    assert len(checks) == 6


def test_a_payload_damaged_after_its_check_is_caught_by_the_next_mount(tmp_path, cache):
    """What the once-per-file check leaves: damage after it is not seen by
    this daemon's passthrough opens (the kernel reads the file), but load
    still checks every read into memory, and the next mount checks again."""
    tier = SSDTier(str(tmp_path))
    put(tier, cache, b"a/s/x", os.urandom(100 * KiB))
    fd, _e = tier.open_backing(b"a/s/x")
    os.close(fd)
    f = file_of(tier, b"a/s/x")
    flip(f, 7)                          # (same inode; mtime changes with a write though)
    with pytest.raises(CorruptSlot):
        d = cache.draft()
        try:
            tier.load_into(tier.get(b"a/s/x"), d)
        finally:
            d.free()
    again = reopen(tmp_path)
    assert again.open_backing(b"a/s/x") is None and again.corrupt == 1


# ---------------------------------------------------------------- mounted


def session(m, agent="agent", sess="s1"):
    m.p(agent).mkdir(exist_ok=True)
    m.p(agent, sess).mkdir(exist_ok=True)
    return m.p(agent, sess)


@pytest.mark.mount
def test_a_mount_writes_payload_only_files_and_reads_them_back(make_mount):
    """A passthrough mount writes payload-only slot files (its readers read
    them in place); one without writes the trailer layout."""
    if os.geteuid() != 0:
        pytest.skip("passthrough needs root")
    m = make_mount(capacity="16M", passthrough=1)
    s = session(m)
    blobs = {f"f{i}": os.urandom(256 * KiB + i) for i in range(4)}
    for n, v in blobs.items():
        (s / n).write_bytes(v)
    os.setxattr(s / "f0", "user.note", b"kept")
    m.stop()
    assert m.proc.returncode == 0, m.logtext()[-2000:]
    files = slot_files(m.ssd)
    assert len(files) == 4
    for f in files:
        assert has_attr(f) and f.stat().st_size in {len(v) for v in blobs.values()}
    m2 = make_mount(ssd=str(m.ssd), warmup_ratio="0")
    s2 = m2.p("agent", "s1")
    for n, v in blobs.items():
        assert (s2 / n).read_bytes() == v
    assert os.getxattr(s2 / "f0", "user.note") == b"kept"
    assert m2.stats()["ssd_corrupt"] == 0


@pytest.mark.mount
def test_a_mount_reads_an_older_folder_unchanged(make_mount, tmp_path, cache, old_layout):
    """A folder the trailer layout fills (an older memosfs; here written by
    the tier in process) mounts, lists and reads; a slot written on the mount
    gets the new layout beside the older files."""
    ssd = tmp_path / "older-ssd"
    tier = SSDTier(str(ssd))
    blobs = {f"o{i}": os.urandom(100 * KiB + i) for i in range(3)}
    for n, v in blobs.items():
        put(tier, cache, f"agent/s1/{n}".encode(), v, meta={"mode": 0o100644})
    tier.sync()
    tier.segs.close()
    old_layout.undo()
    assert all(not has_attr(f) for f in slot_files(ssd))
    if os.geteuid() != 0:
        pytest.skip("passthrough needs root")
    m = make_mount(ssd=str(ssd), capacity="16M", warmup_ratio="0", passthrough=1)
    s = m.p("agent", "s1")
    assert sorted(os.listdir(s)) == sorted(blobs)
    for n, v in blobs.items():
        assert (s / n).read_bytes() == v
    (s / "new").write_bytes(b"N" * (200 * KiB))
    assert m.stats()["ssd_corrupt"] == 0
    m.stop()
    assert m.proc.returncode == 0, m.logtext()[-2000:]
    layouts = {read(f).key: read(f).bare for f in slot_files(ssd)}
    assert layouts[b"agent/s1/new"] is True
    assert [layouts[f"agent/s1/{n}".encode()] for n in blobs] == [False] * 3


@pytest.mark.mount
def test_a_mount_without_passthrough_keeps_the_trailer_in_the_file(make_mount):
    """Without passthrough nothing reads a slot file in place: slot files keep
    their trailer in the file, so a copy of the SSD folder that drops extended
    attributes (cp -r, rsync without -X) stays readable."""
    m = make_mount(capacity="16M", passthrough=0)
    s = session(m)
    data = os.urandom(300 * KiB)
    (s / "t").write_bytes(data)
    m.stop()
    assert m.proc.returncode == 0, m.logtext()[-2000:]
    files = slot_files(m.ssd)
    assert files and all(not has_attr(f) for f in files)
    assert all(f.stat().st_size > len(data) for f in files)     # payload + trailer
    m2 = make_mount(ssd=str(m.ssd), warmup_ratio="0")
    assert m2.p("agent", "s1", "t").read_bytes() == data
