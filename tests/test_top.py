"""`memosfs top`: one frame (`--once`) from a real mount with two agents
shows the hit ratio, the tiers, evictions, write-back and every agent's
memory usage, and its numbers are the mount's (stats.json, the agents'
user.memos.usage); another uid sees only the agents it may read; the
live view refreshes; a path that is no mount is exit 1."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from memosfs import top

MiB = 1 << 20
TOP_PY = Path(top.__file__)

needs_root_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="runs commands as another uid: needs root and setpriv")


def memosfs(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memosfs", *args], capture_output=True,
                          text=True, timeout=60)


def agent(m, name: str, uid: int, mode: int) -> Path:
    d = m.p(name, "s")
    d.mkdir(parents=True)
    for p in (m.p(name), d):
        os.chown(p, uid, uid)
        os.chmod(p, mode)
    return d


def line(frame: str, head: str) -> str:
    got = [ln for ln in frame.splitlines() if ln.startswith(head)]
    assert len(got) == 1, f"no single {head!r} line in:\n{frame}"
    return got[0]


def agent_row(frame: str, name: str) -> list[str]:
    got = [ln.split() for ln in frame.splitlines() if ln.startswith(f"  {name} ")]
    assert len(got) == 1, f"no row for {name} in:\n{frame}"
    return got[0]


def two_agents(m):
    """alice (uid 5001, 0700) with 3 MiB in two slots and a quota; bob (uid
    5002, 0755) with 1 MiB; a few hits and a miss."""
    a = agent(m, "alice", 5001, 0o700)
    b = agent(m, "bob", 5002, 0o755)
    (a / "x").write_bytes(os.urandom(2 * MiB))
    (a / "y").write_bytes(os.urandom(MiB))
    (b / "z").write_bytes(os.urandom(MiB))
    for p in (a / "x", a / "y", b / "z"):
        p.read_bytes()
    with pytest.raises(FileNotFoundError):
        open(b / "absent", "rb")
    os.setxattr(m.p("alice"), "user.memos.quota", b"16M")


def test_once_frame_matches_the_mount(make_mount):
    m = make_mount(capacity="64M", world=True)
    two_agents(m)
    r = memosfs("top", str(m.path), "--once")
    assert r.returncode == 0, r.stderr
    frame = r.stdout
    s = m.stats("json")
    usage = {n: int(os.getxattr(m.p(n), "user.memos.usage")) for n in ("alice", "bob")}
    assert usage["alice"] >= 3 * MiB and MiB <= usage["bob"] < 2 * MiB
    # hit ratio and its counts
    hit = line(frame, "hit ratio")
    assert s["lookups"] > s["hits"] >= 3 and s["misses"] >= 1
    assert f"{100 * s['hits'] / s['lookups']:.1f}%" in hit
    assert f"hits {s['hits']:,} of {s['lookups']:,} lookups" in hit
    assert f"misses {s['misses']:,}" in hit
    # tiers, evictions, write-back, coherence
    mem = line(frame, "memory")
    assert f"{top.human(s['bytes_used'])} / {top.human(s['capacity'])}" in mem
    assert f"slots {s['slots']:,}" in mem and s["slots"] == 3
    assert f"slots {s['ssd_slots']:,}" in line(frame, "ssd")
    assert f"evictions   {s['evictions']:,} (" in line(frame, "evictions")
    wb = line(frame, "write-back")
    assert f"queue {s['writeback_queue']}" in wb and f"written {s['writebacks']:,}" in wb
    assert f"protocol {s['coherence_protocol']}" in line(frame, "coherence")
    # both agents, largest first, their usage and alice's quota
    assert f"agents      {s['agents']:,} on the mount, 2 shown" in frame
    rows = [ln.split()[0] for ln in frame.splitlines() if re.match(r"  (alice|bob) ", ln)]
    assert rows == ["alice", "bob"]
    arow, brow = agent_row(frame, "alice"), agent_row(frame, "bob")
    assert " ".join(arow[1:3]) == top.human(usage["alice"])
    assert " ".join(brow[1:3]) == top.human(usage["bob"])
    assert " ".join(arow[-2:]) == top.human(16 * MiB) and brow[-1] == "-"


@needs_root_setpriv
def test_another_uid_sees_the_agents_it_may_read(make_mount):
    """top run by bob's uid (a copy of top.py, standard library only)
    shows bob and counts alice (0700) without her usage."""
    m = make_mount(capacity="64M", world=True)
    two_agents(m)
    d = tempfile.mkdtemp(prefix="memosfs-top-")
    try:
        os.chmod(d, 0o755)
        copy = os.path.join(d, "top.py")
        shutil.copyfile(TOP_PY, copy)
        os.chmod(copy, 0o644)
        python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
        r = subprocess.run(["setpriv", "--reuid=5002", "--regid=5002", "--clear-groups",
                            python, copy, str(m.path), "--once"], capture_output=True,
                           text=True, timeout=60, cwd="/")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert r.returncode == 0, r.stderr
    assert "1 shown, 1 not readable by you" in r.stdout
    bob = int(os.getxattr(m.p("bob"), "user.memos.usage"))
    assert " ".join(agent_row(r.stdout, "bob")[1:3]) == top.human(bob)
    assert "alice" not in r.stdout


def test_usage_xattr_is_on_every_agent_directory(make_mount):
    """With or without a quota, user.memos.usage is the agent's bytes in
    memory (the quota's own account when it has one); read by name, not
    listed (computed, like a slot's status), and gone with the slots."""
    m = make_mount(capacity="64M")
    d = m.p("carol", "s")
    d.mkdir(parents=True)
    assert os.getxattr(m.p("carol"), "user.memos.usage") == b"0"
    (d / "a").write_bytes(b"x" * (MiB + 1))
    free = int(os.getxattr(m.p("carol"), "user.memos.usage"))
    assert MiB < free <= MiB + 2 * 4096
    assert "user.memos.usage" not in os.listxattr(m.p("carol"))
    os.setxattr(m.p("carol"), "user.memos.quota", b"8M")
    assert int(os.getxattr(m.p("carol"), "user.memos.usage")) == free
    os.removexattr(m.p("carol"), "user.memos.quota")
    (d / "a").unlink()
    assert os.getxattr(m.p("carol"), "user.memos.usage") == b"0"
    with pytest.raises(OSError):                    # a session is no agent
        os.getxattr(d, "user.memos.usage")


def test_live_view_refreshes_and_rates_follow(make_mount):
    """Without a terminal the live view prints a frame per interval; the
    second frame's rates are over the last refresh."""
    m = make_mount(capacity="64M")
    m.p("a", "s").mkdir(parents=True)
    p = subprocess.Popen([sys.executable, "-m", "memosfs", "top", str(m.path),
                          "--interval", "0.2"], stdout=subprocess.PIPE, text=True)
    try:
        frames = []
        for ln in p.stdout:
            if ln.startswith("memosfs top"):
                frames.append(ln)
                if len(frames) == 3:
                    break
    finally:
        p.kill()
        p.wait()
    assert "every 0.2s" in frames[0] and "average since mount" in frames[0]
    assert "last refresh" in frames[1] and "last refresh" in frames[2]


def test_not_a_mount(tmp_path):
    r = memosfs("top", str(tmp_path), "--once")
    assert r.returncode == 1
    assert "is not a memosfs mount" in r.stderr and "stats.json" in r.stderr
    assert memosfs("top", str(tmp_path), "--interval", "0").returncode == 2


def test_render_is_plain_text_from_stats_alone():
    """A stats.json without writeback_queue (an older daemon) shows '-'."""
    s = {"uptime_s": 10, "lookups": 4, "hits": 3, "misses": 1, "evictions": 20,
         "capacity": 64 * MiB, "bytes_used": 16 * MiB, "agents": 1}
    prev = top.Sample(0.0, dict(s, evictions=10))
    cur = top.Sample(2.0, s, [top.Agent("a", 4 * MiB, None)])
    frame = "\n".join(top.render("/m", cur, prev))
    assert "75.0%" in line(frame, "hit ratio")
    assert "20 (5.0/s)" in line(frame, "evictions")          # (20 - 10) / 2 s
    assert "queue -" in line(frame, "write-back")
    assert agent_row(frame, "a")[1:4] == ["4.0", "MiB", "6.2%"]
    once = "\n".join(top.render("/m", cur))
    assert "20 (2.0/s)" in line(once, "evictions")           # 20 over 10 s up
