"""Random file operations on the mount against the same operations on a
local file (an fsx-style oracle): one descriptor at a time, so POSIX and
memosfs's publish-on-close semantics agree byte for byte."""

from __future__ import annotations

import os
import random

import pytest

OPS = 400


@pytest.mark.parametrize("seed,capacity", [(1, "64M"), (2, "64M"), (3, "8M"), (4, "8M")])
def test_random_ops_match_a_local_file(make_mount, tmp_path, seed, capacity):
    m = make_mount(capacity=capacity, writeback_delay_ms=20)
    sess = m.p("fsx", "s")
    sess.mkdir(parents=True)
    ours, ref = sess / "f", tmp_path / "f"
    rng = random.Random(seed)
    fd_o = fd_r = None
    for step in range(OPS):
        op = rng.choice(["open", "close", "write", "write", "read", "truncate",
                         "append", "reopen_trunc", "stat", "noise"])
        if op == "noise":               # other slots push this one out to the SSD
            (sess / f"noise{step % 6}").write_bytes(rng.randbytes(1 << 20))
            continue
        if fd_o is None and op not in ("open", "reopen_trunc"):
            op = "open"
        if op in ("open", "reopen_trunc"):
            if fd_o is not None:
                os.close(fd_o)
                os.close(fd_r)
            flags = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if op == "reopen_trunc" else 0)
            fd_o, fd_r = os.open(ours, flags, 0o644), os.open(ref, flags, 0o644)
        elif op == "close":
            os.close(fd_o)
            os.close(fd_r)
            fd_o = fd_r = None
            assert ours.read_bytes() == ref.read_bytes(), f"step {step}: after close"
        elif op == "write":
            off = rng.randrange(0, 3 << 20)
            data = rng.randbytes(rng.choice([1, 100, 4096, 70000, 300000]))
            assert os.pwrite(fd_o, data, off) == os.pwrite(fd_r, data, off)
        elif op == "append":
            data = rng.randbytes(rng.randrange(1, 20000))
            end = os.fstat(fd_r).st_size
            os.pwrite(fd_o, data, end)
            os.pwrite(fd_r, data, end)
        elif op == "read":
            size = os.fstat(fd_r).st_size
            off = rng.randrange(0, size + 10)
            n = rng.randrange(1, 200000)
            assert os.pread(fd_o, n, off) == os.pread(fd_r, n, off), f"step {step}: read"
        elif op == "truncate":
            size = rng.randrange(0, 3 << 20)
            os.ftruncate(fd_o, size)
            os.ftruncate(fd_r, size)
        elif op == "stat":                  # a draft is invisible until published,
            os.fsync(fd_o)                  # its size too: fsync publishes it
            os.fsync(fd_r)
            assert os.fstat(fd_o).st_size == os.fstat(fd_r).st_size, f"step {step}: size"
    if fd_o is not None:
        os.close(fd_o)
        os.close(fd_r)
    assert ours.read_bytes() == ref.read_bytes()
