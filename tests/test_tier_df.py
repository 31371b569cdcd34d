"""`memosfs df`: each tier on a line of its own (issue 38, item 9).  `df`
adds both tiers up (docs/operating.md), so a full memory tier beside a large
disk shows as 1%; `memosfs df MNT` prints the memory tier's own Use% — the
pressure an operator looks for — and the SSD tier's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from memosfs.testing.daemon import is_mounted

MiB = 1 << 20


def memosfs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memosfs", *args], capture_output=True,
                          text=True, timeout=60)


def rows_of(mnt) -> dict[str, dict]:
    r = memosfs("df", "--json", str(mnt))
    assert r.returncode == 0, r.stderr
    return {row["tier"]: row for row in json.loads(r.stdout)}


def test_df_of_the_tiers_shows_the_memory_tier_filling(make_mount):
    m = make_mount(capacity="16M", ssd_capacity="64M", writeback_delay_ms=3600000)
    before = rows_of(m.path)
    assert set(before) == {"memory", "ssd"}
    mem = before["memory"]
    assert mem["size"] == 16 * MiB and mem["used"] + mem["avail"] == mem["size"]
    m.p("a", "s").mkdir(parents=True)
    m.p("a", "s", "k").write_bytes(os.urandom(12 * MiB))
    after = rows_of(m.path)
    mem = after["memory"]
    assert mem["used"] - before["memory"]["used"] >= 12 * MiB
    assert mem["use_pct"] >= 75                         # 12 of 16 MiB, and its pages
    ssd = after["ssd"]
    assert ssd["used"] == m.stats("json")["ssd_bytes"]
    assert ssd["size"] == 64 * MiB                      # ssd_capacity
    # what plain df shows at the same moment: both tiers added up
    v = os.statvfs(m.path)
    total = v.f_blocks * v.f_frsize
    assert total == mem["size"] + ssd["size"]
    assert v.f_bavail * v.f_frsize == mem["avail"] + ssd["avail"]

    text = memosfs("df", str(m.path))
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["Tier", "Size", "Used", "Avail", "Use%", "Mounted", "on"]
    memory = [ln.split() for ln in lines if ln.startswith("memory ")]
    assert len(memory) == 1 and memory[0][1] == "16M"
    assert memory[0][4] == f"{mem['use_pct']}%" and memory[0][5] == str(m.path)
    assert [ln.split()[0] for ln in lines[1:]] == ["memory", "ssd"]


def test_without_an_ssd_tier_df_shows_the_memory_tier_alone(make_mount):
    m = make_mount(capacity="16M", ssd="none")
    rows = rows_of(m.path)
    assert list(rows) == ["memory"] and rows["memory"]["size"] == 16 * MiB


def test_df_of_a_folder_that_is_no_mount_says_so(tmp_path):
    try:
        r = memosfs("df", str(tmp_path))
    finally:
        # (a memosfs that takes `df` for a mount's source mounts the folder)
        if is_mounted(tmp_path):
            subprocess.run(["fusermount3", "-u", "-z", str(tmp_path)])
    assert r.returncode == 1
    assert r.stderr.startswith(f"memosfs: {tmp_path} is not a memosfs mount (")
