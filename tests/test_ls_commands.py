"""See and steer what is cached (issue 38, item 5): `memosfs ls`, `evict`,
`drop`, `pin`, `unpin`, and the control files under them
(`.memos/cache/evict`, `.memos/cache/drop`), on a real mount.

Nothing here ever deletes a slot: what leaves memory stays on the SSD tier,
listed, with its bytes.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys

import pytest

MiB = 1 << 20
SETPRIV = shutil.which("setpriv")
needs_root_setpriv = pytest.mark.skipif(
    SETPRIV is None or os.geteuid() != 0, reason="needs root and setpriv (another uid)")
ALICE, BOB = 20011, 20012


def memosfs(*args: str, uid: int | None = None, cwd=None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "memosfs", *args]
    if uid is not None:
        cmd = [SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *cmd]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def listing(path, uid: int | None = None) -> dict[str, dict]:
    r = memosfs("ls", "--json", str(path), uid=uid)
    assert r.returncode == 0, r.stderr
    return {os.path.relpath(s["path"], path): s for s in json.loads(r.stdout)}


def tiers(path) -> dict[str, str]:
    return {k: v["tier"] for k, v in listing(path).items()}


def fill(m, agent="planner", sessions=("chat-1", "chat-2"), n=3, size=256 << 10):
    data = {}
    for s in sessions:
        d = m.p(agent, s, "blocks")
        d.mkdir(parents=True)
        for i in range(n):
            p = m.p(agent, s, f"turn{i}") if i % 2 == 0 else d / f"b{i}"
            p.write_bytes(os.urandom(size))
            data[p] = p.read_bytes()
    return data


def test_ls_shows_tier_size_hits_dirty_and_pin(make_mount):
    m = make_mount(capacity="64M", writeback_delay_ms=3_600_000)
    fill(m)
    for _ in range(3):
        m.p("planner", "chat-1", "turn0").read_bytes()
    os.setxattr(m.p("planner", "chat-2", "turn2"), "user.memos.pin", b"1")
    got = listing(m.p("planner"))
    assert sorted(got) == ["chat-1/blocks/b1", "chat-1/turn0", "chat-1/turn2",
                           "chat-2/blocks/b1", "chat-2/turn0", "chat-2/turn2"]
    turn0 = got["chat-1/turn0"]
    assert (turn0["tier"], turn0["size"], turn0["dirty"], turn0["pinned"]) == \
        ("mem", 256 << 10, True, False)
    assert turn0["hits"] >= 3 and turn0["stored_bytes"] >= 256 << 10
    assert 0 <= turn0["age_s"] < 3600
    assert got["chat-2/turn2"]["pinned"] and not got["chat-1/turn2"]["pinned"]
    # the long form: a header, one line per slot, a total
    r = memosfs("ls", "-l", str(m.p("planner", "chat-2")))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["TIER", "SIZE", "STORED", "AGE", "HITS", "DIRTY", "PIN",
                                "PATH"]
    assert len(lines) == 1 + 3 + 1 and lines[-1].startswith("total 3 slots: 3 mem")
    assert "1 pinned" in lines[-1] and "3 dirty" in lines[-1]
    # the short form from inside the mount, the control plane left out
    r = memosfs("ls", cwd=m.path)
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()) == 6 and ".memos" not in r.stdout


def test_evict_moves_a_session_to_the_ssd_and_keeps_every_byte(make_mount):
    m = make_mount(capacity="64M", writeback_delay_ms=3_600_000)
    data = fill(m)
    before = m.stats()
    r = memosfs("evict", "-v", str(m.p("planner", "chat-1")))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("3 ssd")
    t = tiers(m.p("planner"))
    assert {k: v for k, v in t.items() if k.startswith("chat-1/")} == \
        {"chat-1/blocks/b1": "ssd", "chat-1/turn0": "ssd", "chat-1/turn2": "ssd"}
    assert all(v == "mem" for k, v in t.items() if k.startswith("chat-2/"))
    after = m.stats()
    assert after["moved_out"] - before["moved_out"] == 3
    assert after["writebacks"] - before["writebacks"] == 3
    # the whole agent, then its bytes read back from the SSD tier
    assert memosfs("evict", str(m.p("planner"))).returncode == 0
    assert set(tiers(m.p("planner")).values()) == {"ssd"}
    for p, b in data.items():
        assert p.read_bytes() == b
    # evicting what is not in memory is no error; a name that is not there is ENOENT
    assert memosfs("evict", str(m.p("planner", "chat-1", "turn0"))).returncode == 0
    r = memosfs("evict", str(m.p("planner", "nope")))
    assert r.returncode == 1 and "No such file or directory" in r.stderr


def test_drop_takes_only_what_the_ssd_holds(make_mount):
    m = make_mount(capacity="64M", writeback_delay_ms=3_600_000)
    fill(m, sessions=("chat-1",))
    sess = m.p("planner", "chat-1")
    r = memosfs("drop", str(sess))
    assert r.returncode == 1
    assert "Device or resource busy" in r.stderr and "3 slots stay in memory" in r.stderr
    assert "planner/chat-1/" in r.stderr and "dirty" in r.stderr
    assert set(tiers(sess).values()) == {"mem"}
    # the control file says the same to a writer that is not the CLI
    with pytest.raises(OSError) as e:
        m.ctl("drop").write_text("planner/chat-1\n")
    assert e.value.errno == errno.EBUSY
    m.ctl("flush").write_text("1")              # clean now: on the SSD tier too
    assert memosfs("drop", str(sess)).returncode == 0
    assert set(tiers(sess).values()) == {"ssd"}
    assert "drop planner/chat-1 (uid 0): 3 slots left memory" in m.logtext()


def test_a_pinned_slot_stays_until_it_is_unpinned(make_mount):
    m = make_mount(capacity="64M")
    fill(m, sessions=("chat-1",))
    sess = m.p("planner", "chat-1")
    r = memosfs("pin", str(sess / "turn0"))
    assert r.returncode == 0, r.stderr
    assert listing(sess)["turn0"]["pinned"]
    r = memosfs("evict", str(sess))
    assert r.returncode == 1
    assert "1 slot stays in memory, 2 left it: planner/chat-1/turn0: pinned" in r.stderr
    assert tiers(sess) == {"blocks/b1": "ssd", "turn0": "mem", "turn2": "ssd"}
    why = memosfs("why", str(m.path))
    assert "planner/chat-1/turn0: pinned" in why.stdout
    assert memosfs("unpin", str(sess)).returncode == 0
    assert memosfs("evict", str(sess)).returncode == 0
    assert set(tiers(sess).values()) == {"ssd"}
    # pin brings a slot back from the SSD tier and keeps it
    assert memosfs("pin", str(sess)).returncode == 0
    got = listing(sess)
    assert all(s["tier"] == "mem" and s["pinned"] for s in got.values()), got


def test_without_an_ssd_tier_nothing_leaves_memory(make_mount):
    m = make_mount(capacity="64M", ssd="none")
    data = fill(m, sessions=("chat-1",))
    r = memosfs("evict", str(m.p("planner")))
    assert r.returncode == 1 and "Operation not supported" in r.stderr
    assert "no SSD tier" in r.stderr
    assert set(tiers(m.p("planner")).values()) == {"mem"}
    for p, b in data.items():
        assert p.read_bytes() == b


def test_bad_lines_are_einval(make_mount):
    m = make_mount(capacity="64M")
    fill(m, sessions=("chat-1",))
    for text in ("\n", "planner/../planner\n", ".memos/cache\n", "planner//chat-1\n"):
        with pytest.raises(OSError) as e:
            m.ctl("evict").write_text(text)
        assert e.value.errno == errno.EINVAL, text
    assert set(tiers(m.p("planner")).values()) == {"mem"}


@needs_root_setpriv
def test_owners_steer_their_own_slots_and_nobody_elses(make_mount):
    m = make_mount(world=True, capacity="64M", writeback_delay_ms=3_600_000)
    for uid, name in ((ALICE, "alice"), (BOB, "bob")):
        r = subprocess.run([SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                            "sh", "-c", f"mkdir -p {m.p(name, 's')} && "
                                        f"head -c 100000 /dev/urandom > {m.p(name, 's', 'kv')}"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    # the control files: every uid writes, only root reads
    assert oct(os.stat(m.ctl("evict")).st_mode & 0o777) == "0o622"
    # bob may not evict alice's agent, nor learn whether a name exists in it
    for target in (m.p("alice"), m.p("alice", "s", "kv"), m.p("alice", "s", "nope")):
        r = memosfs("evict", str(target), uid=BOB)
        assert r.returncode == 1 and "Permission denied" in r.stderr, (target, r)
    r = memosfs("evict", str(m.p("nobody-here")), uid=BOB)
    assert r.returncode == 1 and "Permission denied" in r.stderr
    assert os.getxattr(m.p("alice", "s", "kv"), "user.memos.tier") == b"mem"
    # bob cannot list alice's slots either (the kernel checks her private modes)
    r = memosfs("ls", str(m.p("alice")), uid=BOB)
    assert r.returncode == 1 and "Permission denied" in r.stderr and r.stdout == ""
    # alice evicts her own; a name she owns but that is not there is ENOENT
    r = memosfs("evict", str(m.p("alice")), uid=ALICE)
    assert r.returncode == 0, r.stderr
    assert os.getxattr(m.p("alice", "s", "kv"), "user.memos.tier") == b"ssd"
    assert os.getxattr(m.p("bob", "s", "kv"), "user.memos.tier") == b"mem"
    r = memosfs("evict", str(m.p("alice", "s", "nope")), uid=ALICE)
    assert r.returncode == 1 and "No such file or directory" in r.stderr
    got = listing(m.p("alice"), uid=ALICE)
    assert [(k, v["tier"], v["uid"]) for k, v in got.items()] == [("s/kv", "ssd", ALICE)]
    # root steers everybody's
    r = memosfs("evict", str(m.p("bob")))
    assert r.returncode == 0, r.stderr
    assert os.getxattr(m.p("bob", "s", "kv"), "user.memos.tier") == b"ssd"


def test_outside_a_mount_each_command_says_so_once_and_walks_nothing(tmp_path):
    """`memosfs ls` of a home directory listed every file in it, one error
    line each: a PATH on no memosfs mount is said once, never walked."""
    for i in range(60):
        d = tmp_path / f"d{i % 6}"
        d.mkdir(exist_ok=True)
        (d / f"f{i}").write_bytes(b"x")
    for cmd in ("ls", "pin", "unpin"):
        r = memosfs(cmd, str(tmp_path))
        assert (r.returncode, r.stdout, r.stderr) == \
            (1, "", f"memosfs {cmd}: {tmp_path}: not a memosfs mount\n")
    r = memosfs("ls", cwd=tmp_path)                 # (PATH defaults to .)
    assert (r.returncode, r.stderr) == (1, "memosfs ls: .: not a memosfs mount\n")
    assert not any("user.memos.pin" in os.listxattr(f) for f in tmp_path.rglob("f*"))
    r = memosfs("evict", str(tmp_path / "d0" / "f0"))
    assert r.returncode == 1 and "not on a memosfs mount" in r.stderr
