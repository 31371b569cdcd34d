"""_native.crc32c_file: a file's CRC-32C without reading its holes (their
zeros extend the CRC arithmetically, native/crc32c.c memos_crc32c_zeros);
the same value as crc32c over the bytes, whatever the holes and ranges."""

from __future__ import annotations

import errno
import os

import pytest
from hypothesis import given, settings, strategies as st

from memosfs import _native as N


@pytest.mark.parametrize("n", [0, 1, 3, 7, 8, 64, 4095, 4096, 65537, 1 << 20, 3 * (1 << 20) + 5])
def test_zeros_extend_like_bytes(tmp_path, n):
    p = tmp_path / "f"
    with open(p, "wb") as f:
        f.write(b"head")
        f.truncate(4 + n)                       # a hole of n bytes after 4 bytes
    fd = os.open(p, os.O_RDONLY)
    try:
        assert N.crc32c_file(fd, 0, 4 + n) == N.crc32c(b"head" + bytes(n))
        assert N.crc32c_file(fd, 4, n, 0x1234) == N.crc32c(bytes(n), 0x1234)
    finally:
        os.close(fd)


@settings(max_examples=60, deadline=None)
@given(pieces=st.lists(st.tuples(st.integers(0, 3 << 20), st.binary(min_size=1, max_size=9000)),
                       max_size=6),
       size=st.integers(0, 4 << 20), cut=st.integers(0, 1 << 16))
def test_matches_the_bytes(tmp_path_factory, pieces, size, cut):
    p = tmp_path_factory.mktemp("c") / "f"
    with open(p, "wb") as f:
        f.truncate(size)
        for off, data in pieces:
            f.seek(off)
            f.write(data)
    body = p.read_bytes()
    fd = os.open(p, os.O_RDONLY)
    try:
        off = min(cut, len(body))
        assert N.crc32c_file(fd, off, len(body) - off) == N.crc32c(body[off:])
        with pytest.raises(OSError) as e:
            N.crc32c_file(fd, 0, len(body) + 1)     # past the end: a short file
        assert e.value.errno == errno.EIO
    finally:
        os.close(fd)
