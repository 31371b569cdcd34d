"""Tests on a real mount: POSIX tools and syscalls against memosfs."""

from __future__ import annotations

import errno
import json
import os
import stat
import subprocess
import sys
import time

import pytest

from conftest import is_mounted

MiB = 1 << 20


def sh(cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, **kw)


def session(m, agent="agent", sess="s1"):
    m.p(agent).mkdir(exist_ok=True)
    m.p(agent, sess).mkdir(exist_ok=True)
    return m.p(agent, sess)


# ---------------------------------------------------------------- data path


def test_cp_and_cmp_roundtrip(mnt, tmp_path):
    s = session(mnt)
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 * MiB + 12345))
    r = sh(f"cp {src} {s}/turn0 && cmp {src} {s}/turn0")
    assert r.returncode == 0, r.stderr
    assert os.stat(s / "turn0").st_size == 3 * MiB + 12345


def test_dd_in_and_out(mnt, tmp_path):
    s = session(mnt)
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(8 * MiB))
    r = sh(f"dd if={src} of={s}/kv bs=1M status=none && "
           f"dd if={s}/kv of={tmp_path}/back bs=1M status=none && cmp {src} {tmp_path}/back")
    assert r.returncode == 0, r.stderr


def test_written_slot_is_visible_right_after_close(mnt):
    s = session(mnt)
    for i in range(20):
        data = os.urandom(4096 + i)
        (s / "x").write_bytes(data)
        assert (s / "x").read_bytes() == data


def test_empty_slot_from_touch(mnt):
    s = session(mnt)
    assert sh(f"touch {s}/empty").returncode == 0
    assert (s / "empty").read_bytes() == b""
    assert os.getxattr(s / "empty", "user.memos.version") == b"1"


def test_append_truncate_and_in_place_write(mnt):
    s = session(mnt)
    f = s / "f"
    f.write_bytes(b"hello")
    with open(f, "ab") as fh:
        fh.write(b" world")
    assert f.read_bytes() == b"hello world"
    r = sh(f"printf 'J' | dd of={f} bs=1 seek=6 conv=notrunc status=none")
    assert r.returncode == 0, r.stderr
    assert f.read_bytes() == b"hello Jorld"
    os.truncate(f, 5)
    assert f.read_bytes() == b"hello"
    with open(f, "r+b") as fh:
        fh.truncate(2)
        fh.seek(10)
        fh.write(b"!")
    assert f.read_bytes() == b"he" + b"\0" * 8 + b"!"


def test_reader_keeps_its_version_during_overwrite(mnt):
    s = session(mnt)
    old = os.urandom(2 * MiB)
    new = os.urandom(MiB // 3)
    (s / "slot").write_bytes(old)
    with open(s / "slot", "rb") as reader:
        first = reader.read(MiB)
        with open(s / "slot", "wb") as writer:     # O_TRUNC while the reader is open
            writer.write(new[:1000])
            # not yet published: a new reader still sees the old version
            assert (s / "slot").read_bytes() == old
            writer.write(new[1000:])
        # published: new opens see the new bytes ...
        assert (s / "slot").read_bytes() == new
        # ... while the old reader reads the rest of its own version, whole
        rest = reader.read()
    assert first + rest == old
    assert (s / "slot").read_bytes() == new


def test_reader_snapshot_with_mmap(mnt):
    import mmap
    s = session(mnt)
    old = os.urandom(256 * 1024)
    (s / "m").write_bytes(old)
    with open(s / "m", "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        (s / "m").write_bytes(b"new" * 1000)
        assert mm[:] == old
        mm.close()
    assert (s / "m").read_bytes() == b"new" * 1000


def test_concurrent_writers_last_publish_wins(mnt):
    s = session(mnt)
    with open(s / "w", "wb") as a, open(s / "w", "wb") as b:
        a.write(b"A" * 5000)
        b.write(b"B" * 7000)
        a.close()
        assert (s / "w").read_bytes() == b"A" * 5000
    assert (s / "w").read_bytes() == b"B" * 7000


def test_unlink_while_reading(mnt):
    s = session(mnt)
    data = os.urandom(MiB)
    (s / "u").write_bytes(data)
    with open(s / "u", "rb") as f:
        os.unlink(s / "u")
        assert not (s / "u").exists()
        assert f.read() == data


# ---------------------------------------------------------------- namespace


def test_wrong_places_and_names(mnt):
    s = session(mnt)
    with pytest.raises(PermissionError):
        (mnt.path / "file").write_bytes(b"x")
    with pytest.raises(PermissionError):
        (mnt.path / "agent" / "file").write_bytes(b"x")
    (s / "sub" / "deeper").mkdir(parents=True)     # directories below a session
    (s / "sub" / "deeper" / "slot").write_bytes(b"nested")
    assert (s / "sub" / "deeper" / "slot").read_bytes() == b"nested"
    with pytest.raises(OSError) as e:
        (s / ("n" * 256)).write_bytes(b"x")
    assert e.value.errno == errno.ENAMETOOLONG
    (s / ("n" * 255)).write_bytes(b"ok")
    assert (s / ("n" * 255)).read_bytes() == b"ok"
    with pytest.raises(FileNotFoundError):
        (s / "absent").read_bytes()
    with pytest.raises(FileExistsError):
        (mnt.path / ".memos").mkdir()
    with pytest.raises(OSError) as e:
        os.link(s / ("n" * 255), s / "hard")
    assert e.value.errno == errno.EPERM


def test_rename_unlink_rmdir(mnt):
    s1 = session(mnt, "a", "s1")
    s2 = session(mnt, "b", "s2")
    (s1 / "x").write_bytes(b"one")
    (s1 / "y").write_bytes(b"two")
    os.rename(s1 / "x", s2 / "x2")
    assert (s2 / "x2").read_bytes() == b"one"
    assert not (s1 / "x").exists()
    os.rename(s1 / "y", s2 / "x2")                 # replaces
    assert (s2 / "x2").read_bytes() == b"two"
    assert sorted(os.listdir(s2)) == ["x2"]
    os.rename(s2, mnt.p("a", "s3"))                 # session to another agent
    assert (mnt.p("a", "s3", "x2")).read_bytes() == b"two"
    os.rename(mnt.p("a"), mnt.p("c"))               # agent rename carries its slots
    assert mnt.p("c", "s3", "x2").read_bytes() == b"two"
    with pytest.raises(PermissionError):
        os.rename(mnt.p("c", "s3"), mnt.p("s3"))     # a session at the root
    with pytest.raises(OSError) as e:
        os.rmdir(mnt.p("c", "s3"))
    assert e.value.errno == errno.ENOTEMPTY
    os.unlink(mnt.p("c", "s3", "x2"))
    os.rmdir(mnt.p("c", "s3"))
    os.rmdir(mnt.p("c", "s1"))
    os.rmdir(mnt.p("c"))
    assert sorted(os.listdir(mnt.path)) == [".federated", ".memos", "b"]
    st = mnt.stats()
    assert st["slots"] == 0


def test_timestamps_and_modes(mnt):
    s = session(mnt)
    f = s / "t"
    f.write_bytes(b"x")
    st1 = os.stat(f)
    time.sleep(0.05)
    f.write_bytes(b"yy")
    st2 = os.stat(f)
    assert st2.st_mtime_ns > st1.st_mtime_ns
    os.utime(f, ns=(1_000_000_000, 2_000_000_000))
    assert os.stat(f).st_mtime_ns == 2_000_000_000
    os.chmod(f, 0o600)
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o600
    r = sh(f"cp -p {f} {s}/copy && stat -c %Y {s}/copy")
    assert r.returncode == 0 and r.stdout.strip() == "2", r.stderr
    assert stat.S_ISDIR(os.stat(s).st_mode)


def test_statfs_reports_memory_tier(make_mount):
    """Without an SSD tier, df is the memory tier (docs/operating.md; with one:
    tests/test_df.py)."""
    mnt = make_mount(capacity="64M", ssd="none")
    v = os.statvfs(mnt.path)
    assert v.f_frsize * v.f_blocks == 64 * MiB
    assert v.f_namemax == 255
    s = session(mnt)
    (s / "big").write_bytes(os.urandom(4 * MiB))
    v2 = os.statvfs(mnt.path)
    assert v.f_bfree - v2.f_bfree == 4 * MiB // 4096


def test_xattrs(mnt):
    s = session(mnt)
    f = s / "x"
    f.write_bytes(b"z" * 10000)
    # computed status is read by name, never listed (copy tools list)
    assert os.listxattr(f) == []
    for n in ("user.memos.tier", "user.memos.dirty", "user.memos.version",
              "user.memos.hits", "user.memos.stored_bytes", "user.memos.pin",
              "user.memos.state"):
        assert os.getxattr(f, n)
    assert os.getxattr(f, "user.memos.tier") == b"mem"
    assert os.getxattr(f, "user.memos.version") == b"1"
    assert int(os.getxattr(f, "user.memos.stored_bytes")) == 12288
    f.read_bytes()
    assert int(os.getxattr(f, "user.memos.hits")) >= 1
    f.write_bytes(b"q")
    assert os.getxattr(f, "user.memos.version") == b"2"
    os.setxattr(f, "user.memos.pin", b"1")
    assert os.getxattr(f, "user.memos.pin") == b"1"
    os.setxattr(f, "user.note", b"hello")
    assert os.getxattr(f, "user.note") == b"hello"
    assert os.listxattr(f) == ["user.note"]
    # a computed attribute set or removed (a copy made by an older memosfs
    # coming back) is accepted and changes nothing
    os.setxattr(f, "user.memos.version", b"9")
    assert os.getxattr(f, "user.memos.version") == b"2"
    os.removexattr(f, "user.memos.tier")
    assert os.getxattr(f, "user.memos.tier") == b"mem"
    assert "computed by the cache, nothing stored" in mnt.logtext()
    with pytest.raises(OSError) as e:
        os.setxattr(f, "user.memos.other", b"9")
    assert e.value.errno == errno.EPERM
    with pytest.raises(OSError) as e:
        os.setxattr(f, "user.memos.pin", b"banana")
    assert e.value.errno == errno.EINVAL
    r = sh(f"getfattr -n user.memos.tier {f}; getfattr -n user.memos.version {f}")
    assert "user.memos.tier=\"mem\"" in r.stdout, r.stdout + r.stderr
    assert "user.memos.version=\"2\"" in r.stdout, r.stdout + r.stderr
    r = sh(f"getfattr -d {f}")
    assert "user.note=\"hello\"" in r.stdout and "user.memos" not in r.stdout


# ---------------------------------------------------------------- capacity


def test_capacity_overflow_evicts_by_lru_without_ssd(make_mount):
    m = make_mount(capacity="8M", evict_batch=1, ssd="none")
    s = session(m)
    for i in range(7):
        (s / f"s{i}").write_bytes(bytes([i]) * MiB)
    assert (s / "s0").read_bytes() == b"\0" * MiB       # s0 is now the most recent
    for i in range(7, 10):
        (s / f"s{i}").write_bytes(bytes([i]) * MiB)
    names = set(os.listdir(s))
    assert "s0" in names                                # touched: kept
    assert "s1" not in names and "s2" not in names      # least recently used: gone
    assert {"s7", "s8", "s9"} <= names
    with pytest.raises(FileNotFoundError):
        (s / "s1").read_bytes()
    for n in names:
        i = int(n[1:])
        assert (s / n).read_bytes() == bytes([i]) * MiB
    # 8 MiB hold eight 1 MiB slots: s8 and s9 each took one victim (evict_batch=1)
    assert m.stats()["evictions"] == 2


def test_capacity_overflow_goes_to_ssd_by_lru(make_mount):
    m = make_mount(capacity="8M", evict_batch=1, writeback_delay_ms=3600000)
    s = session(m)
    for i in range(7):
        (s / f"s{i}").write_bytes(bytes([i]) * MiB)
    assert (s / "s0").read_bytes() == b"\0" * MiB       # s0 is now the most recent
    for i in range(7, 10):
        (s / f"s{i}").write_bytes(bytes([i]) * MiB)
    st = m.stats()
    # the victims were written back, by eviction or ahead of it (memory 75% full)
    assert st["evictions"] == 2 and st["evict_writebacks"] + st["clean_ahead"] >= 2
    assert sorted(os.listdir(s)) == [f"s{i}" for i in range(10)]   # both tiers listed
    tier = {n: os.getxattr(s / n, "user.memos.tier").decode() for n in os.listdir(s)}
    assert tier["s1"] == tier["s2"] == "ssd"
    assert tier["s0"] == tier["s9"] == "mem"
    before = m.stats()
    for i in range(10):
        assert (s / f"s{i}").read_bytes() == bytes([i]) * MiB   # SSD hits promote
    after = m.stats()
    assert after["ssd_hits"] - before["ssd_hits"] >= 2
    assert after["promotions"] - before["promotions"] >= 2
    assert after["slots_lost"] == 0


def test_slot_larger_than_memory_is_efbig(make_mount):
    m = make_mount(capacity="4M", ssd="none")  # (with an SSD tier the draft spills)
    s = session(m)
    with pytest.raises(OSError) as e:
        with open(s / "huge", "wb") as f:
            for _ in range(6):
                f.write(b"x" * MiB)
    assert e.value.errno == errno.EFBIG
    assert "EFBIG" in m.logtext()


# ---------------------------------------------------------------- control plane


def test_knobs_read_write_and_einval(mnt):
    assert mnt.ctl("evict_batch").read_text() == "16\n"
    r = sh(f"echo 24 > {mnt.ctl('evict_batch')}")
    assert r.returncode == 0, r.stderr
    assert mnt.ctl("evict_batch").read_text() == "24\n"
    r = sh(f"echo banana > {mnt.ctl('evict_batch')}")
    assert r.returncode != 0 and "Invalid argument" in r.stderr
    assert mnt.ctl("evict_batch").read_text() == "24\n"
    for bad in ("0", "-3", "99999", "", "1.5"):
        with pytest.raises(OSError) as e:
            mnt.ctl("evict_batch").write_text(bad + "\n")
        assert e.value.errno == errno.EINVAL
    assert mnt.ctl("evict_batch").read_text() == "24\n"
    assert sh(f"echo 128M > {mnt.ctl('capacity')}").returncode == 0
    assert mnt.ctl("capacity").read_text() == f"{128 * MiB}\n"
    assert os.statvfs(mnt.path).f_blocks * 4096 > 128 * MiB     # and the SSD tier
    assert sh(f"echo lru > {mnt.ctl('evict_policy')}").returncode == 0
    assert sh(f"echo belady > {mnt.ctl('evict_policy')}").returncode != 0
    with pytest.raises(PermissionError):
        mnt.ctl("stats").write_text("1")
    assert "banana" in mnt.logtext()


def test_stats_counters_move(mnt):
    s = session(mnt)
    before = mnt.stats()
    (s / "a").write_bytes(b"x" * 5000)
    (s / "a").read_bytes()
    with pytest.raises(FileNotFoundError):
        (s / "missing").read_bytes()
    after = mnt.stats()
    assert after["inserts"] == before["inserts"] + 1
    assert after["hits"] >= before["hits"] + 1
    assert after["misses"] >= before["misses"] + 1
    assert after["lookups"] == after["hits"] + after["misses"]
    assert after["slots"] == before["slots"] + 1
    assert after["bytes_used"] == before["bytes_used"] + 5000
    for key in ("lookups", "hits", "mem_hits", "misses", "hit_rate", "inserts",
                "evictions", "slots", "bytes_used", "capacity", "index_load_factor",
                "free_pages", "superblocks"):
        assert key in after
    js = json.loads(mnt.ctl("stats.json").read_text())
    assert js["slots"] == after["slots"]
    metrics = (mnt.path / ".memos" / "metrics").read_text()
    assert "# TYPE memosfs_hits_total counter" in metrics
    assert f"memosfs_slots {int(after['slots'])}" in metrics


def test_reset_context_and_flush(mnt):
    s = session(mnt, "a", "s")
    keep = session(mnt, "a", "other")
    for i in range(3):
        (s / f"t{i}").write_bytes(b"x" * 100)
    (keep / "k").write_bytes(b"k")
    assert sh(f"echo a/s > {mnt.ctl('reset_context')}").returncode == 0
    assert os.listdir(s) == []
    assert os.listdir(keep) == ["k"]
    assert sh(f"echo a/nosuch > {mnt.ctl('reset_context')}").returncode != 0
    assert sh(f"echo 1 > {mnt.ctl('flush')}").returncode == 0
    assert mnt.stats()["flushes"] == 1
    assert sh(f"echo 2 > {mnt.ctl('flush')}").returncode != 0


def test_ring_slots_recycles_oldest(mnt):
    s = session(mnt)
    assert sh(f"echo 3 > {mnt.ctl('ring_slots')}").returncode == 0
    for i in range(5):
        (s / f"turn{i}").write_bytes(b"t")
    assert sorted(os.listdir(s)) == ["turn2", "turn3", "turn4"]


def test_debug_trace(mnt):
    s = session(mnt)
    trace = mnt.path / ".memos" / "debug" / "trace"
    assert sh(f"echo 1 > {trace}").returncode == 0
    (s / "a").write_bytes(b"x")
    lines = trace.read_text().splitlines()
    assert any(" PUBLISH " in ln and "key=agent/s1/a" in ln for ln in lines)
    ns, event = lines[-1].split()[:2]
    assert int(ns) > 0
    assert sh(f"echo 0 > {trace}").returncode == 0
    (s / "b").write_bytes(b"x")
    assert not any("key=agent/s1/b" in ln for ln in trace.read_text().splitlines())


def test_memosfs_stat_command(mnt):
    import sys
    r = subprocess.run([sys.executable, "-m", "memosfs", "stat", str(mnt.path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert any(line.split()[0] == "hit_rate" for line in r.stdout.splitlines())


# ---------------------------------------------------------------- unmount


def test_unmount_with_open_files(make_mount):
    m = make_mount()
    s = session(m)
    (s / "open").write_bytes(b"x" * MiB)
    reader = open(s / "open", "rb")
    writer = open(s / "w", "wb")
    writer.write(b"draft")
    r = subprocess.run(["fusermount3", "-u", str(m.path)], capture_output=True, text=True)
    assert r.returncode != 0                           # busy, like any filesystem
    assert is_mounted(m.path)
    m.umount(lazy=True)                                # detach; the daemon still serves fds
    assert not is_mounted(m.path)
    assert reader.read(10) == b"x" * 10
    reader.close()
    writer.close()
    assert m.proc.wait(timeout=20) == 0


def test_sigterm_unmounts_cleanly(make_mount):
    import signal
    m = make_mount()
    session(m)
    m.proc.send_signal(signal.SIGTERM)
    assert m.proc.wait(timeout=20) == 0
    assert not is_mounted(m.path)


# ---------------------------------------------------------------- permissions


def _as_user(uid: int):
    def drop():
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    return drop


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch uids")
def test_agents_are_kept_apart_by_modes(make_mount):
    mnt = make_mount(world=True)
    s = session(mnt, "alice", "s")
    os.chmod(mnt.p("alice"), 0o700)
    (s / "secret").write_bytes(b"alice's kv")
    r = subprocess.run(["cat", str(s / "secret")], capture_output=True,
                       preexec_fn=_as_user(12345))
    assert r.returncode != 0 and b"Permission denied" in r.stderr
    # another uid can make its own agent (the root is sticky and world-writable)
    r = subprocess.run(["mkdir", "-p", str(mnt.p("bob", "s"))], capture_output=True,
                       preexec_fn=_as_user(12345))
    assert r.returncode == 0, r.stderr
    assert os.stat(mnt.p("bob")).st_uid == 12345
    r = subprocess.run(["rmdir", str(mnt.p("bob", "s"))], capture_output=True,
                       preexec_fn=_as_user(23456))
    assert r.returncode != 0
    r = subprocess.run(["sh", "-c", f"echo 3 > {mnt.ctl('evict_batch')}"],
                       capture_output=True, preexec_fn=_as_user(12345))
    assert r.returncode != 0


# ---------------------------------------------------------------- a shell user


def test_shell_scenario(mnt, tmp_path):
    script = os.path.join(os.path.dirname(__file__), "scripts", "scenario.sh")
    r = subprocess.run(["bash", script, str(mnt.path), str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr + mnt.logtext()
    assert "scenario ok" in r.stdout


# ---------------------------------------------------------------- page cache


def test_published_slot_is_read_from_the_page_cache(mnt):
    s = session(mnt)
    data = os.urandom(3 * MiB + 5)
    (s / "pc").write_bytes(data)
    assert (s / "pc").read_bytes() == data          # the first read fills the cache
    before = mnt.stats()["read_requests"]
    assert (s / "pc").read_bytes() == data          # then: no request
    assert mnt.stats()["read_requests"] == before
    # a version published without a writer (truncate(2)) drops the stale pages
    os.truncate(s / "pc", 2 * MiB)
    assert (s / "pc").read_bytes() == data[:2 * MiB]


# ---------------------------------------------------------------- policy and reclaim knobs


def test_policy_and_reclaim_knobs_apply_live(mnt):
    assert mnt.ctl("evict_policy").read_text() == "lru_lfu\n"
    stats = json.loads(mnt.ctl("stats.json").read_text())
    assert stats["evict_policy"] == "lru_lfu"
    for name in ("lfu", "lru", "lru_lfu"):
        assert sh(f"echo {name} > {mnt.ctl('evict_policy')}").returncode == 0
        assert json.loads(mnt.ctl("stats.json").read_text())["evict_policy"] == name
    assert sh(f"echo arc > {mnt.ctl('evict_policy')}").returncode != 0
    assert mnt.ctl("reclaim_free_ratio").read_text() == "0.2\n"
    assert sh(f"echo 0.5 > {mnt.ctl('reclaim_free_ratio')}").returncode == 0
    assert sh(f"echo 7 > {mnt.ctl('reclaim_fail_limit')}").returncode == 0
    stats = json.loads(mnt.ctl("stats.json").read_text())
    assert (stats["reclaim_free_ratio"], stats["reclaim_fail_limit"]) == (0.5, 7)
    for bad in ("1.5", "-1", "x"):
        assert sh(f"echo {bad} > {mnt.ctl('reclaim_free_ratio')}").returncode != 0
    s = session(mnt)
    for i in range(4):
        (s / f"x{i}").write_bytes(os.urandom(300_000))
    for i in range(4):
        os.unlink(s / f"x{i}")
    before = mnt.stats()["reclaim_runs"]
    assert sh(f"echo 1 > {mnt.ctl('flush')}").returncode == 0      # persists, then sweeps
    assert mnt.stats()["reclaim_runs"] > before


def test_regression_a_refused_write_changes_nothing(make_mount):
    """A write the memory tier cannot take (EFBIG, ENOSPC) fails alone: the
    writes acknowledged before it stay in the draft, and once the writer
    cuts off the refused bytes (the draft is never published while they are
    missing: tests/test_refused_saves.py), close publishes exactly those."""
    m = make_mount(capacity="4M", ssd_capacity="4M")  # (drafts spill; refused there)
    s = session(m)
    (s / "slot").write_bytes(b"old" * 1000)
    fd = os.open(s / "slot", os.O_WRONLY | os.O_TRUNC)
    try:
        first = os.urandom(1 << 20)
        assert os.write(fd, first) == len(first)
        with pytest.raises(OSError) as e:
            os.pwrite(fd, b"y", 64 << 20)                  # beyond the memory tier
        assert e.value.errno in (errno.ENOSPC, errno.EFBIG)
        assert os.fstat(fd).st_size == len(first)
        with pytest.raises(OSError) as e:
            os.ftruncate(fd, 64 << 20)
        assert e.value.errno in (errno.ENOSPC, errno.EFBIG)
        assert os.fstat(fd).st_size == len(first)
        assert os.write(fd, b"tail") == 4                  # the handle goes on
        os.ftruncate(fd, len(first) + 4)        # (the refused bytes beyond: not wanted)
    finally:
        os.close(fd)
    assert (s / "slot").read_bytes() == first + b"tail"


def test_regression_a_create_that_never_published_leaves_nothing(make_mount):
    m = make_mount(capacity="4M", ssd_capacity="4M")  # (drafts spill; refused there)
    s = session(m)
    fd = os.open(s / "new", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        assert os.path.exists(s / "new")                   # the writer sees it
        other = subprocess.run([sys.executable, "-c",
                                f"import os; print(os.path.exists({str(s / 'new')!r}))"],
                               capture_output=True, text=True, check=True)
        assert other.stdout.strip() == "False"             # not a hit for others
        with pytest.raises(OSError) as e:
            os.pwrite(fd, b"z", 64 << 20)                  # beyond the memory tier
        assert e.value.errno in (errno.ENOSPC, errno.EFBIG)
    finally:
        with pytest.raises(OSError) as e:
            os.close(fd)                                    # (the close says so too)
    assert e.value.errno in (errno.ENOSPC, errno.EFBIG)
    assert not os.path.exists(s / "new")
    assert "new" not in os.listdir(s)
