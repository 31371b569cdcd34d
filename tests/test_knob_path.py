"""One knob path: every knob is applied by one function (ControlTree.apply)
at mount, for its -o value or its default, and at run time, for a write
into its file, with typed values; what lasts across a remount is what the
mount's options say (docs/knobs.md)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from memosfs.fuse.control import KNOB_APPLY, ControlTree
from memosfs.fuse.operations import MemosOperations
from memosfs.knobs import KNOB_BY_NAME, KNOBS, KnobError, parse_size
from memosfs.store.store import Store

MiB = 1 << 20


def test_every_knob_has_its_entry_in_the_one_table():
    assert list(KNOB_APPLY) == [k.name for k in KNOBS]


def test_a_mount_applies_every_knob_through_the_function_echo_uses(monkeypatch):
    calls = []
    real = ControlTree.apply

    def spy(self, name, value, quiet=False):
        calls.append((name, value))
        return real(self, name, value, quiet)

    monkeypatch.setattr(ControlTree, "apply", spy)
    ops = MemosOperations(Store(16 * MiB), {"evict_batch": 24, "coherence_protocol": "2",
                                            "page_cache_push": False})
    try:
        assert [n for n, _ in calls] == [k.name for k in KNOBS]
        assert dict(calls)["evict_batch"] == 24
        assert ops.knobs["coherence_protocol"] == 2 and ops.knobs["page_cache_push"] is False
        assert ops.store.cache.stats()["evict_batch"] == 24
        calls.clear()
        ops.set_knob("evict_batch", "32\n")
        assert calls == [("evict_batch", "32\n")] and ops.knobs["evict_batch"] == 32
        assert ops.store.cache.stats()["evict_batch"] == 32
    finally:
        ops.prefetch.close()
        ops.store.close()


def test_values_are_typed_and_read_back_as_written():
    ops = MemosOperations(Store(16 * MiB))
    try:
        for name, text, typed in (("evict_batch", "7", 7), ("fast_path", "0", False),
                                  ("page_cache_push", "1", True),
                                  ("coherence_protocol", "0", 0),
                                  ("reclaim_free_ratio", "0.25", 0.25),
                                  ("quant_error_max", "0.05", 0.05),
                                  ("quant_error_max", "auto", "auto"),
                                  ("pin_max_per_uid", "10%", "10%"),
                                  ("hold_max_per_uid", "8M", 8 * MiB),
                                  ("capacity", "32M", 32 * MiB)):
            ops.set_knob(name, text)
            value = ops.knobs[name]
            assert value == typed and type(value) is type(typed), (name, value)
            knob = KNOB_BY_NAME[name]
            assert knob.parse(knob.format(value)) == value
    finally:
        ops.prefetch.close()
        ops.store.close()


def test_a_value_that_cannot_be_applied_stops_the_mount_naming_it():
    store = Store(16 * MiB)
    try:
        with pytest.raises(KnobError, match=r"^ssd_capacity=1073741824: no SSD tier is mounted$"):
            MemosOperations(store, {"ssd_capacity": 1 << 30})
        with pytest.raises(KnobError, match=r"^unknown knobs: capcity$"):
            MemosOperations(store, {"capcity": 1})
    finally:
        store.close()


def test_sizes_binary_and_decimal():
    assert parse_size("512M") == parse_size("512MiB") == parse_size("512m") == 512 * MiB
    assert parse_size("512MB") == 512_000_000
    assert parse_size("1kB") == 1000 and parse_size("1K") == parse_size("1KiB") == 1024
    assert parse_size("4GB") == 4_000_000_000 and parse_size("1.5G") == 3 << 29
    assert parse_size("65536B") == 65536
    for bad in ("4Gi", "1P", "1.5", "M", "1MBB"):
        with pytest.raises(KnobError, match="not a"):
            parse_size(bad)


def _memosfs(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memosfs", *args], capture_output=True,
                          text=True, timeout=60, **kw)


def test_an_unknown_option_is_refused_before_anything_is_touched(tmp_path):
    mnt, ssd, log = tmp_path / "mnt", tmp_path / "ssd", tmp_path / "log"
    mnt.mkdir()
    r = _memosfs("memos", str(mnt), "-f", "-o", f"capcity=256M,ssd={ssd},log={log}")
    assert r.returncode == 1
    assert r.stderr.startswith("memosfs: unknown option 'capcity=256M' (did you mean "
                               "'capacity'?); `")
    assert not ssd.exists() and not log.exists()
    r = _memosfs("memos", str(mnt), "-f", "-o", f"ssd={ssd},evict_batch=banana")
    assert r.returncode == 1 and not ssd.exists()
    assert r.stderr == "memosfs: bad option 'evict_batch=banana': not an integer: 'banana' " \
        "(decimal digits, no sign)\n"
    r = _memosfs("memos", str(mnt), "-f", "-o", "allow_other,nodev,fsname=x,frobnicate")
    assert r.returncode == 1 and "unknown option 'frobnicate'" in r.stderr


def test_a_knob_that_cannot_apply_at_mount_is_refused_by_the_daemon(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = _memosfs("memos", str(mnt), "-f", "-o", "ssd=none,capacity=8M,ssd_capacity=1G")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "memosfs: bad option ssd_capacity=1073741824: no SSD tier is mounted" in r.stderr


def test_an_option_and_an_echo_give_the_same_state(make_mount):
    given = {"evict_batch": "24", "prefetch_stride": "5", "coherence_protocol": "2",
             "page_cache_push": "0", "reclaim_free_ratio": "0.25", "ring_slots": "9",
             "evict_policy": "lru", "capacity": "96M"}
    a = make_mount(**given)         # (protocol 2 at mount: the mount writes through)
    b = make_mount(capacity="64M", writeback_cache=0)
    for name, text in given.items():
        b.ctl(name).write_text(text + "\n")
    for name in given:
        assert a.ctl(name).read_text() == b.ctl(name).read_text(), name
    sa, sb = a.stats(), b.stats()
    for name in ("evict_batch", "ring_slots", "capacity", "coherence_protocol"):
        assert sa[name] == sb[name], name


def test_echo_lasts_until_the_unmount_and_options_at_every_mount(make_mount):
    m = make_mount(capacity="64M", evict_batch="24")
    ssd = m.ssd
    m.p("alice", "s").mkdir(parents=True)
    os.setxattr(m.p("alice"), "user.memos.quota", b"8M")
    m.ctl("evict_batch").write_text("32\n")
    m.ctl("ring_slots").write_text("5\n")
    assert m.ctl("evict_batch").read_text() == "32\n"
    m.stop()
    again = make_mount(capacity="64M", evict_batch="24", ssd=ssd)     # the same fstab line
    assert again.ctl("evict_batch").read_text() == "24\n"
    assert again.ctl("ring_slots").read_text() == "0\n"             # the default
    assert os.getxattr(again.p("alice"), "user.memos.quota") == str(8 * MiB).encode()
    again.stop()
    bare = make_mount(capacity="64M", ssd=ssd)
    assert bare.ctl("evict_batch").read_text() == "16\n"


def test_a_quota_larger_than_the_memory_tier_is_refused(make_mount):
    m = make_mount(capacity="64M")
    for agent in ("alice", "bob"):
        m.p(agent).mkdir()
    with pytest.raises(OSError) as e:
        os.setxattr(m.p("alice"), "user.memos.quota", b"4G")
    assert e.value.errno == errno.EINVAL
    assert "a quota of 4294967296 bytes is larger than the memory tier (67108864 bytes" \
        in m.logtext()
    os.setxattr(m.p("alice"), "user.memos.quota", b"40M")
    assert "add up to" not in m.logtext()
    os.setxattr(m.p("bob"), "user.memos.quota", b"40M")          # kept, with a warning
    assert os.getxattr(m.p("bob"), "user.memos.quota") == str(40 * MiB).encode()
    assert "WARNING memosfs.fuse.tenants: agent quotas add up to 83886080 bytes, more than " \
        "the memory tier (67108864 bytes)" in m.logtext()
