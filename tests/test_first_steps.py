"""A newcomer's first steps: `make run` puts `memosfs` on the PATH and
installs only what running needs, the messages that name a command give one
that runs, and the small commands behave at the edges (a closed pipe, a
directory that is not a mount)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from memosfs import cli

ROOT = Path(__file__).resolve().parent.parent


def memosfs(*args, env=None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memosfs", *args], capture_output=True,
                          text=True, timeout=120, env=env, **kw)


def make_dry(*args: str) -> str:
    r = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


# ---------------------------------------------------------------- make

@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_installs_what_running_needs_and_puts_memosfs_on_the_path(tmp_path):
    venv = tmp_path / "venv"                # (not made: -n shows every step)
    out = make_dry("run", f"MOUNT={tmp_path}/m", f"BINDIR={tmp_path}/bin", f"VENV={venv}")
    apt = [ln for ln in out.splitlines() if "dpkg -s" in ln]
    assert len(apt) == 1
    for pkg in ("fuse3", "libfuse3-dev", "pkg-config", "attr"):
        assert f" {pkg} " in apt[0] or f" {pkg};" in apt[0]
    for pkg in ("clang", "redis-server", "libcuckoo-dev", "rsync", "python3.11-doc"):
        assert pkg not in out
    assert "'.[run]'" in out and "test,bench" not in out and "tenseal" not in out
    assert f"mountscripts/install.sh {venv}/bin/memosfs {tmp_path}/bin/memosfs" in out
    assert f"the Python examples run with {venv}/bin/python" in out
    # what the tests need besides comes with make test
    out = make_dry("test", f"VENV={venv}")
    assert "clang" in out and "redis-server" in out and "rsync" in out
    assert "'.[run,test,bench]'" in out


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_install_puts_a_memosfs_that_runs_on_the_path(tmp_path):
    if not os.access(ROOT / ".venv" / "bin" / "memosfs", os.X_OK):
        pytest.skip("no .venv/bin/memosfs in this checkout (make run builds it)")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    r = subprocess.run(["make", "-s", "install", f"BINDIR={bindir}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"installed {bindir}/memosfs -> {ROOT}/.venv/bin/memosfs" in r.stdout
    env = dict(os.environ, PATH=f"{bindir}:/usr/bin:/bin")
    r = subprocess.run(["memosfs", "knobs"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("capacity ")


# ---------------------------------------------------------------- messages

def test_messages_name_a_command_that_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    monkeypatch.setattr(sys, "argv", ["/opt/x/.venv/bin/memosfs"])
    assert cli.self_command() == f"{sys.executable} -m memosfs"    # (not executable)
    script = tmp_path / "memosfs"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    monkeypatch.setattr(sys, "argv", [str(script)])
    assert cli.self_command() == str(script)
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: "/usr/local/bin/memosfs")
    assert cli.self_command() == "memosfs"


def test_the_refusal_of_a_live_mountpoint_names_a_umount_that_runs(make_mount):
    m = make_mount(capacity="64M")
    env = dict(os.environ, PATH="/usr/bin:/bin")                  # no memosfs on it
    r = memosfs("memos", str(m.path), "-f", "-o", f"ssd={m.tmp}/other", env=env)
    assert r.returncode == 1
    said = re.search(r"unmount it first \((.*) umount ", r.stderr)
    assert said, r.stderr
    command = said.group(1).split()
    assert command == [sys.executable, "-m", "memosfs"]
    r = subprocess.run(command + ["umount", str(m.path)], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not os.path.ismount(m.path)


# ---------------------------------------------------------------- edges

def test_umount_of_a_directory_with_no_memosfs_says_so(tmp_path):
    r = memosfs("umount", str(tmp_path))
    assert (r.returncode, r.stderr) == \
        (1, f"memosfs: {tmp_path} is not a memosfs mount (nothing is mounted there)\n")
    r = memosfs("umount", str(tmp_path / "nope"))
    assert r.stderr == f"memosfs: {tmp_path / 'nope'} is not a memosfs mount (no such " \
        "directory)\n"
    r = memosfs("umount", "/proc")
    assert r.stderr == "memosfs: /proc is not a memosfs mount (a proc filesystem is " \
        "mounted there)\n"


def test_a_closed_pipe_is_no_error(make_mount):
    m = make_mount(capacity="64M")
    for args in (["stat", str(m.path)], ["stat", "--json", str(m.path)], ["knobs"]):
        r = subprocess.run(f"{sys.executable} -m memosfs {' '.join(args)} | head -1",
                           shell=True, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and len(r.stdout.splitlines()) == 1, args
        assert r.stderr == "", r.stderr
