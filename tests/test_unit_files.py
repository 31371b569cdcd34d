"""What mountscripts/ ships, checked as a user meets it (issue 38, item 7):
the systemd mount unit verifies without an ordering cycle, and the wrapper
install.sh writes either runs memosfs for a user other than its installer or
says which directory keeps that user out and what to do."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "mountscripts" / "mnt-memos.mount"
INSTALL = ROOT / "mountscripts" / "install.sh"
NOBODY = 65534


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze is missing (make test installs systemd)")
def test_the_mount_unit_verifies_without_an_ordering_cycle(tmp_path):
    # (a copy, so that verify reads this unit and no other of the same name)
    unit = tmp_path / UNIT.name
    shutil.copy(UNIT, unit)
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                       text=True, timeout=60)
    said = r.stdout + r.stderr
    assert "cycle" not in said, said
    assert "deleted to break" not in said, said
    assert r.returncode == 0, said


def test_the_mount_unit_starts_after_the_local_filesystems():
    unit = UNIT.read_text()
    assert "After=local-fs.target" in unit and "DefaultDependencies=no" in unit
    assert "Conflicts=umount.target" in unit and "Before=umount.target" in unit


@pytest.fixture
def public_dir():
    """A folder every user can search (pytest's own tmp is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="memosfs-wrapper-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _program(where: Path, interp: str) -> Path:
    """A stand-in for a venv's bin/memosfs: a script that prints its arguments."""
    where.mkdir(parents=True, exist_ok=True)
    prog = where / "memosfs"
    prog.write_text(f"#!{interp}\necho ran \"$@\"\n")
    prog.chmod(0o755)
    return prog


def _install(prog: Path, dest: Path) -> subprocess.CompletedProcess:
    r = subprocess.run(["sh", str(INSTALL), str(prog), str(dest)], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return r


def _as_nobody(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=30,
                          user=NOBODY, group=NOBODY, extra_groups=[])


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="runs the wrapper as another "
                                "uid (needs root)")


@needs_root
def test_the_wrapper_runs_for_other_users_where_they_can_reach_it(public_dir):
    prog = _program(public_dir / "venv" / "bin", "/bin/sh")
    dest = public_dir / "memosfs"
    r = _install(prog, dest)
    assert "warning" not in r.stderr
    got = _as_nobody(str(dest), "--version", "x y")
    assert got.returncode == 0, got.stderr
    assert got.stdout == "ran --version x y\n"


@needs_root
def test_the_wrapper_names_a_private_program_directory(public_dir):
    home = public_dir / "home"
    prog = _program(home / "venv" / "bin", "/bin/sh")
    home.chmod(0o700)
    dest = public_dir / "memosfs"
    r = _install(prog, dest)
    assert f"warning: {home} is mode 700" in r.stderr
    got = _as_nobody(str(dest), "--help")
    assert got.returncode == 126
    assert "Permission denied" not in got.stderr
    assert f"memosfs: user nobody cannot run {prog}: {home} is private to its owner " \
           f"(mode 700, owner root)." in got.stderr
    assert "install it where every user can reach it" in got.stderr
    assert "make install PYTHON=/usr/bin/python3 (docs/operating.md, \"Other users\")" \
        in got.stderr, got.stderr
    assert got.stdout == ""


@needs_root
def test_the_wrapper_names_a_private_python(public_dir):
    """The case users hit: the venv is reachable, the Python it links to is not
    (a pyenv below a 0700 home)."""
    home = public_dir / "home"
    (home / "bin").mkdir(parents=True)
    python = home / "bin" / "python3"
    os.symlink(sys.executable, python)
    venv_bin = public_dir / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    (public_dir / "Makefile").write_text("install:\n")     # (a checkout)
    os.symlink(python, venv_bin / "python")
    prog = venv_bin / "memosfs"
    prog.write_text(f"#!{venv_bin / 'python'}\nprint('ran')\n")
    prog.chmod(0o755)
    home.chmod(0o700)
    dest = public_dir / "memosfs-wrapper"
    _install(prog, dest)
    got = _as_nobody(str(dest), "--version")
    assert got.returncode == 126
    assert f"{home} is private to its owner" in got.stderr, got.stderr
    assert f"cd {public_dir} && make install PYTHON=/usr/bin/python3 VENV=venv-shared " \
           f"(docs/operating.md, \"Other users\")" in got.stderr, got.stderr
    assert "Permission denied" not in got.stderr
    ran = subprocess.run([str(dest)], capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0 and ran.stdout == "ran\n", ran.stderr    # its owner runs it
