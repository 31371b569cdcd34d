"""renameat2(RENAME_EXCHANGE) is EINVAL and changes nothing (issue 38,
item 9: docs/semantics.md, "Names: links and renames", says so and why);
RENAME_NOREPLACE works."""

from __future__ import annotations

import ctypes
import errno
import os
from pathlib import Path

import pytest

AT_FDCWD = -100
RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
ROOT = Path(__file__).resolve().parents[1]

_libc = ctypes.CDLL(None, use_errno=True)


def renameat2(old, new, flags: int) -> int:
    """0, or the errno renameat2(2) set."""
    fn = getattr(_libc, "renameat2", None)
    if fn is None:
        pytest.skip("the C library has no renameat2")
    rc = fn(AT_FDCWD, os.fsencode(old), AT_FDCWD, os.fsencode(new), flags)
    return 0 if rc == 0 else ctypes.get_errno()


def test_rename_exchange_is_einval_and_changes_nothing(make_mount):
    m = make_mount(capacity="64M")
    s = m.p("a", "s")
    (s / "d").mkdir(parents=True)
    (s / "x").write_bytes(b"one")
    (s / "y").write_bytes(b"two")
    os.symlink("x", s / "l")
    for a, b in (("x", "y"), ("x", "l"), ("d", "x"), ("l", "d")):
        assert renameat2(s / a, s / b, RENAME_EXCHANGE) == errno.EINVAL, (a, b)
    assert (s / "x").read_bytes() == b"one" and (s / "y").read_bytes() == b"two"
    assert os.readlink(s / "l") == "x" and (s / "d").is_dir()
    assert sorted(os.listdir(s)) == ["d", "l", "x", "y"]
    assert "RENAME_EXCHANGE is not supported" in m.logtext()


def test_rename_noreplace_refuses_an_existing_target(make_mount):
    m = make_mount(capacity="64M")
    s = m.p("a", "s")
    s.mkdir(parents=True)
    (s / "x").write_bytes(b"one")
    (s / "y").write_bytes(b"two")
    assert renameat2(s / "x", s / "y", RENAME_NOREPLACE) == errno.EEXIST
    assert renameat2(s / "x", s / "z", RENAME_NOREPLACE) == 0
    assert (s / "z").read_bytes() == b"one" and (s / "y").read_bytes() == b"two"


def test_semantics_says_so():
    text = (ROOT / "docs" / "semantics.md").read_text()
    row = [ln for ln in text.splitlines() if ln.startswith("| `renameat2(RENAME_EXCHANGE)`")]
    assert len(row) == 1 and "| EINVAL, nothing changes" in row[0]
