"""Ref.changes(): what a version changed since the last clean version of its
lineage (native/cache.c, memos_entry_changes), as the SSD tier's extent log
uses it.  The property: rebuilding a version from the clean base's bytes and
the changes gives exactly the version's bytes, whatever the writes,
truncates, publishes and write-backs (clean marks) in between."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from memosfs import _native as N

MiB = 1024 * 1024
PAGE = 4096


def rebuild(base: bytes, ref) -> bytes:
    ch = ref.changes()
    assert ch is not None
    _, base_size, cut, runs = ch
    assert len(base) == base_size and cut <= base_size and cut <= ref.size
    out = bytearray(base[:cut]) + bytes(ref.size - cut)
    last = -1
    for off, n in runs:
        assert off % PAGE == 0 and off > last and n > 0 and off + n <= ref.size
        last = off + n - 1
        out[off:off + n] = ref.read(off, n)
    return bytes(out)


def test_unknown_without_a_clean_base():
    c = N.Cache(8 * MiB)
    d = c.draft()
    d.write(0, b"x" * 10000)
    r = c.publish(d, b"k", dirty=True)
    assert r.changes() is None                   # a new name: written whole
    d = c.draft(r)
    d.write(0, b"y")
    r2 = c.publish(d, b"k", dirty=True)
    assert r2.changes() is None                  # its base was never clean
    r.release(), r2.release()
    c.check()


def test_a_page_written_after_a_clean_version():
    c = N.Cache(8 * MiB)
    d = c.draft()
    d.write(0, bytes(range(256)) * 4096)         # 1 MiB
    r = c.publish(d, b"k", dirty=True)
    r.dirty = False                              # written back
    d = c.draft(r)
    d.write(5000, b"abc")
    r2 = c.publish(d, b"k", dirty=True)
    assert r2.changes() == (r.version, MiB, MiB, [(4096, 4096)])
    d = c.draft(r2)                              # r2 not written back: accumulates
    d.write(MiB - 1, b"zz")                      # grows by one byte
    r3 = c.publish(d, b"k", dirty=True)
    assert r3.changes() == (r.version, MiB, MiB, [(4096, 4096), (MiB - PAGE, PAGE + 1)])
    r3.dirty = False
    d = c.draft(r3)
    d.truncate(100)
    d.truncate(3 * PAGE)
    r4 = c.publish(d, b"k", dirty=True)
    assert r4.changes() == (r3.version, MiB + 1, 100, [])
    for x in (r, r2, r3, r4):
        x.release()
    c.check()


ops = st.lists(st.one_of(
    st.tuples(st.just("w"), st.integers(0, 300_000), st.integers(1, 20_000)),
    st.tuples(st.just("t"), st.integers(0, 300_000)),
    st.tuples(st.just("publish")),
    st.tuples(st.just("clean")),
), max_size=25)


@settings(max_examples=300, deadline=None)
@given(first=st.integers(0, 200_000), ops=ops, seed=st.integers(0, 255))
def test_rebuild_matches(first, ops, seed):
    c = N.Cache(16 * MiB)
    d = c.draft()
    d.write(0, bytes((seed + i) & 0xFF for i in range(first)) if first else b"")
    ref = c.publish(d, b"k", dirty=True)
    ref.dirty = False
    clean = ref.read(0, ref.size)               # what the "SSD" holds
    clean_version = ref.version
    d = c.draft(ref) if ref.size else None
    n = 0
    for op in ops:
        if d is None:                            # an empty base is never tracked
            break
        if op[0] == "w":
            n += 1
            d.write(op[1], bytes([(n * 37) & 0xFF]) * op[2])
        elif op[0] == "t":
            d.truncate(op[1])
        else:
            old = ref
            ref = c.publish(d, b"k", dirty=True)
            old.release()
            ch = ref.changes()
            assert ch is not None and ch[0] == clean_version
            assert rebuild(clean, ref) == ref.read(0, ref.size)
            if op[0] == "clean":
                ref.dirty = False
                clean, clean_version = ref.read(0, ref.size), ref.version
            d = c.draft(ref) if ref.size else None
    if d is not None:
        d.free()
    ref.release()
    c.check()
