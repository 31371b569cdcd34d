"""Private by default: the mount's `umask` (issue 38, item 6).

A mount allows every uid in (allow_other), and a conversation can be rebuilt
from its KV state, so a new agent, session, directory or slot is private to
its creator unless the mount (`-o umask=022`) or the agent (chmod, chgrp)
chose to share.  The mount's umask is taken away on top of the creator's own
umask, as vfat's and ntfs-3g's umask= options do.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess

import pytest

from conftest import CTX, Ctx

SETPRIV = shutil.which("setpriv")
needs_root_setpriv = pytest.mark.skipif(
    SETPRIV is None or os.geteuid() != 0, reason="needs root and setpriv (another uid)")
OTHER = 20002


def as_uid(uid: int, script: str) -> subprocess.CompletedProcess:
    return subprocess.run([SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           "sh", "-c", script], capture_output=True, text=True, timeout=60)


def mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def make_tree(m, umask: int = 0o022):
    """planner/chat-42/turn0 and planner/chat-42/blocks/b0, made by root
    under `umask` with the usual modes (mkdir 0777, create 0666)."""
    old = os.umask(umask)
    try:
        blocks = m.p("planner", "chat-42", "blocks")
        os.makedirs(blocks)
        m.p("planner", "chat-42", "turn0").write_bytes(b"kv of turn 0")
        (blocks / "b0").write_bytes(b"kv of block 0")
    finally:
        os.umask(old)
    return m.p("planner")


@needs_root_setpriv
def test_a_new_agent_is_private_by_default(make_mount):
    m = make_mount(world=True, capacity="64M")
    assert m.ctl("umask").read_text() == "0077\n"
    agent = make_tree(m)                    # the creator's umask (022) would share
    sess = agent / "chat-42"
    assert (mode(agent), mode(sess), mode(sess / "blocks")) == (0o700, 0o700, 0o700)
    assert (mode(sess / "turn0"), mode(sess / "blocks" / "b0")) == (0o600, 0o600)
    for script in (f"ls {agent}", f"cat {sess}/turn0", f"stat {sess}/turn0",
                   f"echo x > {sess}/mine"):
        r = as_uid(OTHER, script)
        assert r.returncode != 0 and "Permission denied" in r.stderr, (script, r)
    # the modes survive a remount
    ssd = str(m.ssd)
    m.stop()
    m2 = make_mount(world=True, capacity="64M", ssd=ssd)
    s2 = m2.p("planner", "chat-42")
    assert (mode(m2.p("planner")), mode(s2), mode(s2 / "turn0")) == (0o700, 0o700, 0o600)
    assert (s2 / "turn0").read_bytes() == b"kv of turn 0"


@needs_root_setpriv
def test_an_agent_shares_on_purpose_with_chmod(make_mount):
    m = make_mount(world=True, capacity="64M")
    agent = make_tree(m)
    r = subprocess.run(["chmod", "-R", "go+rX", str(agent)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = as_uid(OTHER, f"cat {agent}/chat-42/turn0 {agent}/chat-42/blocks/b0")
    assert r.returncode == 0 and r.stdout == "kv of turn 0kv of block 0", r.stderr
    # reading is not writing
    r = as_uid(OTHER, f"echo x > {agent}/chat-42/turn0")
    assert r.returncode != 0 and "Permission denied" in r.stderr


@needs_root_setpriv
def test_a_mount_with_umask_022_shares_reading(make_mount):
    m = make_mount(world=True, capacity="64M", umask="022")
    assert m.ctl("umask").read_text() == "0022\n"
    agent = make_tree(m)
    sess = agent / "chat-42"
    assert (mode(agent), mode(sess), mode(sess / "turn0")) == (0o755, 0o755, 0o644)
    r = as_uid(OTHER, f"cat {sess}/turn0")
    assert r.returncode == 0 and r.stdout == "kv of turn 0", r.stderr
    # the creator's own umask still applies beneath the mount's
    old = os.umask(0o077)
    try:
        m.p("planner", "chat-42", "mine").write_bytes(b"x")
    finally:
        os.umask(old)
    assert mode(sess / "mine") == 0o600


def test_root_changes_the_umask_for_what_is_made_next(make_mount):
    m = make_mount(capacity="64M")
    made_before = make_tree(m)
    m.ctl("umask").write_text("027\n")
    old = os.umask(0)
    try:
        os.makedirs(m.p("team", "s"))
        m.p("team", "s", "kv").write_bytes(b"x")
    finally:
        os.umask(old)
    assert (mode(m.p("team")), mode(m.p("team", "s")), mode(m.p("team", "s", "kv"))) == \
        (0o750, 0o750, 0o640)
    assert mode(made_before) == 0o700           # what exists keeps its mode
    with pytest.raises(OSError) as e:
        m.ctl("umask").write_text("0778\n")
    assert e.value.errno == errno.EINVAL
    assert m.ctl("umask").read_text() == "0027\n"


def test_a_bad_umask_option_is_refused_at_mount(tmp_path):
    from memosfs.cli import parse_mount_options
    assert parse_mount_options(["umask=022"])[0] == {"umask": 0o022}
    with pytest.raises(SystemExit) as e:
        parse_mount_options(["umask=9"])
    assert "umask=9" in str(e.value) and "octal" in str(e.value)


def test_handlers_apply_the_umask_without_a_mount(make_handlers):
    import pyfuse3
    fs = make_handlers()
    agent = fs.call("mkdir", pyfuse3.ROOT_INODE, b"a", 0o777, Ctx(1001)).st_ino
    assert stat.S_IMODE(fs.ops.inodes[agent].mode) == 0o700
    sess = fs.call("mkdir", agent, b"s", 0o2775, Ctx(1001)).st_ino
    assert stat.S_IMODE(fs.ops.inodes[sess].mode) == 0o2700      # setgid kept
    fi, entry = fs.call("create", sess, b"x", 0o666, os.O_WRONLY, Ctx(1001))
    fs.call("release", fi.fh)
    assert stat.S_IMODE(entry.st_mode) == 0o600
    fs.ops.control.apply("umask", "0")
    fi, entry = fs.call("create", sess, b"y", 0o664, os.O_WRONLY, CTX)
    fs.call("release", fi.fh)
    assert stat.S_IMODE(entry.st_mode) == 0o664
