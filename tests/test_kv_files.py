"""memosfs.kv's slots as files: their modes follow the creator's umask (no
temporary file renamed into place), save_kv makes the agent and session
directories it needs, its errors name the path the caller gave, and
docs/python.md's "A real model's KV through the mount" example uses the API
it documents (tests/test_docs_examples.py runs it on a mount when the
`model` extra is there).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest

from memosfs.client import kv

PAGE = Path(__file__).resolve().parent.parent / "docs" / "python.md"
OTHER = 5003

needs_root_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="runs commands as another uid: needs root and setpriv")


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def as_other(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["setpriv", f"--reuid={OTHER}", f"--regid={OTHER}",
                           "--clear-groups", *cmd], capture_output=True, timeout=60)


def pairs(layers=2, tokens=8, fill=1.0):
    return [(np.full((1, 2, tokens, 4), fill + i, np.float32),
             np.full((1, 2, tokens, 4), -fill - i, np.float32)) for i in range(layers)]


def mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


# ------------------------------------------------------------ modes, no mount

@pytest.mark.parametrize("mask, want", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_slot_mode_follows_the_umask_on_a_plain_directory(tmp_path, mask, want):
    with umask(mask):
        kv.save_kv(tmp_path / "s", pairs(), model_id="m")
    assert mode(tmp_path / "s") == want
    assert sorted(os.listdir(tmp_path)) == ["s"]          # no temporary file left behind
    assert np.all(kv.load_kv(tmp_path / "s", as_="numpy")[1][0] == 2)


def test_rewrite_keeps_the_slot_and_its_mode(tmp_path):
    p = tmp_path / "s"
    with umask(0o022):
        kv.save_kv(p, pairs(fill=1), model_id="m")
    os.chmod(p, 0o640)
    ino = os.stat(p).st_ino
    kv.save_kv(p, pairs(fill=5), model_id="m")
    assert mode(p) == 0o640 and os.stat(p).st_ino == ino   # written in place, not replaced
    assert np.all(kv.load_kv(p, as_="numpy")[0][0] == 5)


def test_missing_directories_are_made_or_named(tmp_path):
    with umask(0o022):
        meta = kv.save_kv(tmp_path / "planner" / "chat-42" / "turn0", pairs(), model_id="m")
    assert meta["tokens"] == "8"
    assert mode(tmp_path / "planner") == 0o755 and mode(tmp_path / "planner" / "chat-42") == 0o755
    # parents=False: ENOENT naming the path given, not a temporary file
    target = tmp_path / "nowhere" / "turn0"
    with pytest.raises(FileNotFoundError) as e:
        kv.save_kv(target, pairs(), model_id="m", parents=False)
    assert e.value.errno == errno.ENOENT and e.value.filename == str(target)
    assert not (tmp_path / "nowhere").exists()


def test_a_directory_that_cannot_be_made_is_named(tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(OSError) as e:
        kv.save_kv(tmp_path / "file" / "sess" / "turn0", pairs(), model_id="m")
    assert e.value.errno in (errno.ENOTDIR, errno.EEXIST)
    assert str(tmp_path / "file") in str(e.value.filename)


# --------------------------------------------------------------- on a mount

@pytest.mark.parametrize("mask, want_file, want_dir", [(0o022, 0o644, 0o755),
                                                        (0o077, 0o600, 0o700)])
def test_slot_modes_on_a_mount(make_mount, mask, want_file, want_dir):
    m = make_mount(capacity="64M", umask="000")     # the writer's umask alone decides
    slot = m.path / "planner" / "chat-42" / "turn0"
    with umask(mask):
        kv.save_kv(slot, pairs(), model_id="m", tokens=8)
        n, path = kv.save_prefix(m.path / "planner" / "chat-42", pairs(tokens=16),
                                 list(range(16)), model_id="m", block=8)
    assert n == 16
    assert mode(slot) == want_file and mode(path) == want_file
    assert mode(m.path / "planner") == want_dir and mode(m.path / "planner" / "chat-42") == want_dir
    assert sorted(os.listdir(slot.parent)) == sorted(["turn0", os.path.basename(path)])
    assert np.all(kv.load_kv(slot, as_="numpy")[1][1] == -2)


@needs_root_setpriv
def test_another_uid_reads_a_slot_saved_under_umask_022(make_mount):
    # a mount that shares (umask=022; its default, 077, keeps slots private:
    # tests/test_umask.py)
    m = make_mount(world=True, capacity="64M", umask="022")
    slot = m.path / "planner" / "chat-42" / "turn0"
    with umask(0o022):
        kv.save_kv(slot, pairs(), model_id="m")
    r = as_other("cat", str(slot))
    assert r.returncode == 0, r.stderr
    assert r.stdout == slot.read_bytes()
    # and the same slot under umask 077 is closed to it
    with umask(0o077):
        kv.save_kv(m.path / "planner" / "chat-42" / "private", pairs(), model_id="m")
    r = as_other("cat", str(m.path / "planner" / "chat-42" / "private"))
    assert r.returncode != 0 and b"Permission denied" in r.stderr


def test_errors_name_the_given_path_on_a_mount(make_mount):
    m = make_mount(capacity="64M")
    target = m.path / "planner" / "turn0"            # an agent directory takes no slots
    with pytest.raises(OSError) as e:
        kv.save_kv(target, pairs(), model_id="m")
    assert e.value.filename == str(target)
    assert os.listdir(m.path / "planner") == []      # nothing half-made left behind
    with pytest.raises(FileNotFoundError) as e:
        kv.save_kv(m.path / "a" / "b" / "c", pairs(), model_id="m", parents=False)
    assert e.value.filename == str(m.path / "a" / "b" / "c")


# ---------------------------------------------------- docs/python.md's example

def page_example() -> str:
    """The first python block after the heading "A real model's KV through
    the mount"."""
    text = PAGE.read_text()
    at = text.index("## A real model's KV through the mount")
    block = re.search(r"```python[^\n]*\n(.*?)```", text[at:], re.S)
    assert block, "docs/python.md: no python block after the real-model heading"
    return block.group(1)


def test_the_page_example_uses_the_api_it_documents():
    code = page_example()
    assert "/mnt/memos/planner/chat-42/turn0" in code
    assert "kv.save_kv(" in code and "kv.load_kv(" in code
    compile(code, "docs/python.md", "exec")


def test_a_refused_write_leaves_no_slot(make_mount):
    """A slot larger than the memory tier: the write is refused (EFBIG or
    ENOSPC), the error names the slot, and no torn slot is published; the
    earlier version of a rewritten slot goes with it (a miss, not a slot
    that cannot load)."""
    m = make_mount(capacity="4M", ssd_capacity="4M")  # (drafts spill; refused there)
    sess = m.path / "planner" / "chat"
    small = sess / "small"
    kv.save_kv(small, pairs(), model_id="m")
    big = [(np.zeros((1, 8, 4096, 64), np.float32),) * 2]         # 16 MiB
    for target in (sess / "big", small):
        with pytest.raises(OSError) as e:
            kv.save_kv(target, big, model_id="m")
        assert e.value.errno in (errno.EFBIG, errno.ENOSPC) and e.value.filename == str(target)
        assert not target.exists()
    assert os.listdir(sess) == []
    kv.save_kv(small, pairs(fill=3), model_id="m")                # the mount goes on
    assert np.all(kv.load_kv(small, as_="numpy")[0][0] == 3)
