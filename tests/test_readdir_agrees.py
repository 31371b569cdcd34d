"""readdir agrees with lookup (issue: a slot another process is creating was
listed but answered ENOENT, so `ls -l`, `du`, `tar`, `rsync` and `rm -r` of a
session an engine writes to failed on it).

A created slot that was never published is found by lookup only for its
writing process (docs/semantics.md); a listing shows exactly that: the
writer lists it, every other process lists only names it can stat.
"""

from __future__ import annotations

import os
import subprocess
import sys

LIST_AND_STAT = (
    "import os,sys\n"
    "d=sys.argv[1]; names=sorted(os.listdir(d))\n"
    "for n in names: os.stat(os.path.join(d,n))\n"
    "print(' '.join(names))\n")


def listed_by_another_process(path) -> list[str]:
    """The names another process lists, each of which it could stat (the
    child fails with FileNotFoundError otherwise)."""
    r = subprocess.run([sys.executable, "-c", LIST_AND_STAT, str(path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_a_slot_being_created_is_listed_only_to_its_writer(mnt):
    s = mnt.p("a", "s")
    s.mkdir(parents=True)
    (s / "done").write_bytes(b"published")
    fd = os.open(s / "new", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, b"draft")
        assert listed_by_another_process(s) == ["done"]
        assert sorted(os.listdir(s)) == ["done", "new"]    # the writer's own view
        os.stat(s / "new")
    finally:
        os.close(fd)
    assert listed_by_another_process(s) == ["done", "new"]


def test_tools_walk_a_session_while_a_slot_is_being_created(mnt):
    s = mnt.p("a", "s")
    (s / "sub").mkdir(parents=True)
    for i in range(3):
        (s / "sub" / f"k{i}").write_bytes(b"x" * 100)
    fd = os.open(s / "sub" / "writing", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"y" * 100)
        for cmd in (["ls", "-l", str(s / "sub")], ["du", "-s", str(s)],
                    ["tar", "-cf", "/dev/null", "-C", str(s), "."]):
            r = subprocess.run(cmd, capture_output=True, text=True)
            assert r.returncode == 0, (cmd, r.stderr)
            assert "No such file" not in r.stderr
    finally:
        os.close(fd)
    r = subprocess.run(["ls", str(s / "sub")], capture_output=True, text=True, check=True)
    assert r.stdout.split() == ["k0", "k1", "k2", "writing"]
