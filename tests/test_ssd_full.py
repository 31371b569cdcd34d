"""When the SSD tier cannot take more (issue 38, items 2 to 4).

A full disk under the SSD directory (a small tmpfs here): a refused save is
never published (no new name, the version before stays), and `.memos/why`,
the log and the unmount's message call the disk full by its name, naming the
slot, without dozens of identical lines.  Reaching `ssd_capacity`: with
`ssd_full=evict` (the default) the coldest slots go, and that is logged,
counted (`ssd_evicted_slots`) and shown in `.memos/why`; with
`ssd_full=refuse` no stored slot goes and new writes get ENOSPC
(docs/knobs.md, docs/semantics.md)."""

from __future__ import annotations

import collections
import errno
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

MiB = 1 << 20
MB = 1000 * 1000


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB tmpfs for the SSD directory, unmounted at teardown (after
    the mounts of make_mount: ask for this fixture first)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "small-disk"
    disk.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(disk)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield disk / "ssd"
    finally:
        if subprocess.run(["umount", str(disk)]).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)])


def _sh(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120)


def _fill(d: Path, prefix: str, n: int, size: int) -> dict[str, bytes]:
    """Write n slots of `size` random bytes; returns those whose close succeeded."""
    kept = {}
    for i in range(n):
        data = os.urandom(size)
        try:
            with open(d / f"{prefix}{i}", "wb") as f:
                f.write(data)
        except OSError as e:
            assert e.errno == errno.ENOSPC, e
            continue
        kept[f"{prefix}{i}"] = data
    return kept


def _repeats(log: str) -> int:
    """The most times one line (less its time stamp) is in the log."""
    lines = [re.sub(r"^\S+ \S+ \d+ ", "", line) for line in log.splitlines()]
    return max(collections.Counter(lines).values())


@pytest.mark.parametrize("wb", [0, 1], ids=["write-through", "writeback-cache"])
def test_a_full_ssd_disk_publishes_no_torn_slot_and_is_called_by_its_name(
        small_disk, make_mount, wb):
    m = make_mount(capacity="8M", ssd=small_disk, writeback_cache=wb,
                   writeback_delay_ms=0)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    kept = _fill(d, "k", 6, 3 * MiB)           # 18 MiB into 8 + 8: some are refused
    assert kept and len(kept) < 6
    assert sorted(os.listdir(d)) == sorted(kept)    # a refused Python writer: no name
    r = _sh(f"head -c 10M /dev/urandom > {d}/k7")
    assert r.returncode != 0 and "No space left" in r.stderr + r.stdout or wb, r
    assert not (d / "k7").exists()              # a new name never appears
    old = next(iter(kept))
    r = _sh(f"head -c 10M /dev/urandom > {d}/{old}")
    assert r.returncode != 0, r
    assert (d / old).read_bytes() == kept[old]  # the version before stays
    for name, data in kept.items():
        assert (d / name).read_bytes() == data
    why = m.p(".memos", "why").read_text()
    assert "the SSD directory's disk is full" in why, why
    for jargon in ("[Errno", "draft write", "write_to_fd"):
        assert jargon not in why, why
    log = m.logtext()
    refusals = [line for line in log.splitlines() if "refused (ENOSPC)" in line]
    assert refusals and all(re.search(r"a/s/k\d", line) for line in refusals), refusals
    assert any("the SSD directory's disk is full" in line for line in refusals), refusals
    assert "draft write" not in log and "write_to_fd" not in log
    assert _repeats(log) <= 3, log
    m.stop()
    log = m.logtext()
    assert "write_to_fd" not in log and "[Errno 28]" not in log, log
    lost = [line for line in log.splitlines() if "could not be saved" in line]
    for line in lost:
        assert "the SSD directory's disk is full" in line, line


def _cap_mount(make_mount, **opts):
    m = make_mount(capacity="16M", ssd_capacity="16M", evict_policy="lru", **opts)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    return m, d


def test_reaching_ssd_capacity_evicts_loudly(make_mount):
    """16M + 16M, 12 x 3 MB written: every write succeeds and the coldest
    slots go, as a cache's do -- with a log line naming them (a few lines,
    not one per slot), a count, and a note in the owner's `.memos/why`."""
    m, d = _cap_mount(make_mount)
    kept = _fill(d, "k", 12, 3 * MB)
    assert len(kept) == 12
    names = set(os.listdir(d))
    gone = set(kept) - names
    assert gone, names
    st = m.stats()
    assert st["ssd_evicted_slots"] == len(gone)
    assert st["ssd_evictions"] >= len(gone)
    log = m.logtext()
    lines = [line for line in log.splitlines() if "evicted from it" in line]
    assert lines and len(lines) < len(gone) + 1
    assert "ssd_capacity" in lines[0] and re.search(r"a/s/k\d", lines[0]), lines
    why = m.p(".memos", "why").read_text()
    assert "evicted" in why and "ssd_capacity" in why, why
    assert re.search(r"a/s/k\d+", why), why
    for name in names:
        try:
            data = (d / name).read_bytes()
        except FileNotFoundError:
            continue        # (a read promotes a slot, which may push another out: a cache)
        assert data == kept[name]


def test_ssd_full_refuse_keeps_every_stored_slot_and_refuses_new_writes(make_mount):
    m, d = _cap_mount(make_mount, ssd_full="refuse", writeback_delay_ms=0)
    assert m.ctl("ssd_full").read_text() == "refuse\n"
    kept = _fill(d, "k", 12, 3 * MB)
    assert 0 < len(kept) < 12                   # the later writes were refused
    st = m.stats()
    assert st["ssd_evictions"] == 0 and st["ssd_evicted_slots"] == 0
    assert st["slots_lost"] == 0
    assert sorted(os.listdir(d)) == sorted(kept)    # no refused name, no slot gone
    for name, data in kept.items():
        assert (d / name).read_bytes() == data
    with pytest.raises(OSError) as e:
        (d / "more").write_bytes(b"x" * (3 * MB))
    assert e.value.errno == errno.ENOSPC
    why = m.p(".memos", "why").read_text()
    assert "ssd_capacity" in why and "ssd_full=refuse" in why, why
    # the knob back to evict: writes succeed again, the coldest slots go
    m.ctl("ssd_full").write_text("evict")
    (d / "more").write_bytes(b"y" * (3 * MB))
    m.ctl("flush").write_text("1")              # (every dirty slot to the SSD tier)
    assert m.stats()["ssd_evictions"] > 0
    assert (d / "more").read_bytes() == b"y" * (3 * MB)


def test_the_ssd_full_knob_takes_its_two_values_only(make_mount):
    m = make_mount(capacity="8M")
    assert m.ctl("ssd_full").read_text() == "evict\n"
    with pytest.raises(OSError) as e:
        m.ctl("ssd_full").write_text("drop")
    assert e.value.errno == errno.EINVAL
    m.ctl("ssd_full").write_text("refuse")
    assert m.ctl("ssd_full").read_text() == "refuse\n"
