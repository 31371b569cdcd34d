"""`memosfs --version` prints the version (issue 38, item 9: it was taken
for a mount and failed with the mount's usage error)."""

from __future__ import annotations

import importlib.metadata as md
import subprocess
import sys

import pytest

import memosfs


def _installed() -> str:
    try:
        return md.version("memosfs")
    except md.PackageNotFoundError:
        pytest.skip("memosfs is not installed as a distribution")


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version_prints_the_version_and_exits_0(flag):
    r = subprocess.run([sys.executable, "-m", "memosfs", flag], capture_output=True,
                       text=True, timeout=60)
    assert (r.returncode, r.stdout, r.stderr) == (0, f"memosfs {_installed()}\n", "")


def test_the_installed_version_is_the_package_s():
    assert _installed() == memosfs.__version__
