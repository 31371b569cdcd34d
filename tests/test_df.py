"""What df shows: both tiers (docs/operating.md, "What df shows").

Size = capacity + the SSD tier's files + the room left to it; Used = the
memory tier's bytes + the SSD tier's files; Avail = memory free + the SSD
tier's room (the disk's free space, within ssd_capacity).  With ssd=none,
the memory tier alone."""

from __future__ import annotations

import os
import subprocess
from types import SimpleNamespace

from memosfs.fuse import namespace

MiB = 1 << 20
PAGE = 4096


def statfs(h):
    return h.call("statfs", None)


def test_without_an_ssd_tier_df_is_the_memory_tier(make_handlers):
    h = make_handlers(capacity=16 * MiB)
    s = statfs(h)
    assert s.f_frsize == PAGE and s.f_blocks * PAGE == 16 * MiB
    assert s.f_bfree == s.f_bavail == s.f_blocks
    h.mkdirs("a/s")
    h.write("a/s/x", b"x" * MiB)
    s2 = statfs(h)
    assert (s.f_bfree - s2.f_bfree) * PAGE == MiB


def test_with_an_ssd_tier_df_adds_it(make_handlers, tmp_path, monkeypatch):
    disk = {"free": 1000 * MiB}
    real = os.statvfs

    def fake_statvfs(path):
        if str(path).startswith(str(tmp_path)):
            return SimpleNamespace(f_bavail=disk["free"] // PAGE, f_frsize=PAGE)
        return real(path)

    monkeypatch.setattr(namespace.os, "statvfs", fake_statvfs)
    h = make_handlers(capacity=16 * MiB, ssd=tmp_path / "ssd")
    ssd = h.store.ssd
    s = statfs(h)
    assert s.f_blocks * PAGE == 16 * MiB + 1000 * MiB      # capacity + the disk's room
    assert (s.f_blocks - s.f_bfree) * PAGE == 0
    h.mkdirs("a/s")
    h.write("a/s/x", b"x" * MiB)
    h.store.flush()                                         # written back: both tiers
    used_ssd = ssd.used_bytes
    assert used_ssd > MiB
    disk["free"] = 900 * MiB                                # the disk gave it the room
    s = statfs(h)
    assert s.f_blocks == (16 * MiB + used_ssd + 900 * MiB) // PAGE
    assert s.f_bavail * PAGE == 15 * MiB + 900 * MiB
    assert s.f_blocks - s.f_bfree == (MiB + used_ssd) // PAGE      # used: both tiers
    # within ssd_capacity: the room is what is left of it
    h.ops.set_knob("ssd_capacity", "64M")
    s = statfs(h)
    assert s.f_blocks * PAGE == 16 * MiB + 64 * MiB
    assert s.f_bavail * PAGE == 15 * MiB + (64 * MiB - used_ssd) // PAGE * PAGE
    # and a disk fuller than that: the disk's free space
    disk["free"] = 8 * MiB
    s = statfs(h)
    assert s.f_bavail * PAGE == 15 * MiB + 8 * MiB


def test_df_on_a_mount_counts_what_is_written_in_both_tiers(make_mount):
    m = make_mount(capacity="64M", ssd_capacity="64M", writeback_delay_ms="3600000")

    def df() -> tuple[int, int, int]:
        r = subprocess.run(["df", "-B1", "--output=size,used,avail", str(m.path)],
                           capture_output=True, text=True, check=True)
        return tuple(int(x) for x in r.stdout.split("\n")[1].split())

    assert df() == (128 * MiB, 0, 128 * MiB)
    m.p("a", "s").mkdir(parents=True)
    m.p("a", "s", "slot").write_bytes(os.urandom(10 * MiB))
    assert df() == (128 * MiB, 10 * MiB, 118 * MiB)
    m.ctl("flush").write_text("1\n")
    size, used, avail = df()
    assert size == 128 * MiB and 20 * MiB < used <= 20 * MiB + 2 * PAGE
    assert used + avail == size
