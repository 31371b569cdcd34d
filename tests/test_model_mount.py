"""A model-based test on a real mount: random operations of one writing
process on memosfs and on a reference directory on tmpfs (/dev/shm), side by
side (hypothesis, stateful).

What the writing process sees must be what tmpfs shows: fstat size,
SEEK_END, O_APPEND offsets across descriptors, ftruncate both ways,
copy_file_range, shared mmap writes, renames and unlinks while open.  What
other processes see is the model's published version (the content at the
opener's last close or fsync), checked through a forked child, which also
exercises "a child's close of an inherited descriptor publishes nothing".
Readers keep the version they opened, whole.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from conftest import FUSE_REASON, Mount

pytestmark = [pytest.mark.skipif(FUSE_REASON is not None, reason=FUSE_REASON or ""),
              pytest.mark.mount, pytest.mark.slow]      # one mount for the module

NAMES = st.sampled_from(["x", "y", "z"])
SIZES = st.integers(0, 200_000)
DATA = st.binary(min_size=1, max_size=9000)

_mount: dict[str, Mount] = {}
_counter = itertools.count()


@pytest.fixture(scope="module", autouse=True)
def shared_mount():
    if FUSE_REASON:
        yield
        return
    base = Path(tempfile.mkdtemp(prefix="memosfs-model-"))
    m = Mount(base, {"capacity": "64M", "writeback_delay_ms": 50}, "mnt")
    _mount["m"] = m
    try:
        yield
    finally:
        m.stop()
        shutil.rmtree(base, ignore_errors=True)
        text = m.logtext()
        assert "Traceback" not in text, text


def other_process_view(path: Path) -> tuple[int, bytes] | None:
    """(st_size, content) as a forked child sees it, or None (ENOENT).  The
    child inherits every open descriptor and closes them at exit."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                                    # the child
        try:
            os.close(r)
            try:
                size = os.stat(path).st_size
                with open(path, "rb") as f:
                    data = f.read()
                out = b"%d\n" % size + data
            except FileNotFoundError:
                out = b"-\n"
            with os.fdopen(w, "wb") as pipe:
                pipe.write(out)
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as pipe:
        out = pipe.read()
    os.waitpid(pid, 0)
    head, _, data = out.partition(b"\n")
    return None if head == b"-" else (int(head), data)


class Fd:
    def __init__(self, name: str, ours: int, ref: int, kind: str, snapshot: bytes = b""):
        self.name = name            # the name it was opened by (follows renames)
        self.ours = ours
        self.ref = ref
        self.kind = kind            # "w" | "r"
        self.snapshot = snapshot    # a reader's version
        self.orphan = False         # its name was unlinked or replaced


class WriterModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        m = _mount["m"]
        n = next(_counter)
        self.ours = m.p("model", f"s{n}")
        self.ours.mkdir(parents=True)
        self.ref = Path(tempfile.mkdtemp(prefix="memosfs-ref-", dir="/dev/shm"))
        self.published: dict[str, bytes] = {}       # what other processes see
        self.fds: list[Fd] = []

    def teardown(self):
        for fd in self.fds:
            os.close(fd.ours)
            os.close(fd.ref)
        shutil.rmtree(self.ref, ignore_errors=True)

    # ---- helpers ----

    def writers(self, name=None):
        return [f for f in self.fds if f.kind == "w" and not f.orphan
                and (name is None or f.name == name)]

    def both(self, fn, *args):
        """Run fn on ours and on the reference; both succeed alike or fail alike."""
        try:
            a = fn(*args[0])
        except OSError as e:
            a = e.errno
        try:
            b = fn(*args[1])
        except OSError as e:
            b = e.errno
        assert a == b, (fn, a, b)
        return a

    def publish(self, name: str) -> None:
        self.published[name] = (self.ref / name).read_bytes()

    # ---- opening ----

    @rule(name=NAMES, trunc=st.booleans(), append=st.booleans())
    def open_writer(self, name, trunc, append):
        if trunc and self.writers(name):
            trunc = False           # O_TRUNC beside another writer: a draft of its own
                                    # on memosfs (whole versions), one file on tmpfs
        flags = os.O_RDWR | os.O_CREAT | (os.O_TRUNC if trunc else 0) \
            | (os.O_APPEND if append else 0)
        fd = Fd(name, os.open(self.ours / name, flags, 0o644),
                os.open(self.ref / name, flags, 0o644), "w")
        self.fds.append(fd)

    @precondition(lambda self: self.published)
    @rule(data=st.data())
    def open_reader(self, data):
        name = data.draw(st.sampled_from(sorted(self.published)))
        if self.writers(name):
            return                  # (a writer's own reads go through its draft)
        fd = Fd(name, os.open(self.ours / name, os.O_RDONLY),
                os.open(self.ref / name, os.O_RDONLY), "r", self.published[name])
        self.fds.append(fd)

    # ---- a writer's view ----

    @precondition(lambda self: self.writers())
    @rule(data=st.data(), off=SIZES, payload=DATA)
    def pwrite(self, data, off, payload):
        fd = data.draw(st.sampled_from(self.writers()))
        self.both(os.pwrite, (fd.ours, payload, off), (fd.ref, payload, off))

    @precondition(lambda self: self.writers())
    @rule(data=st.data(), payload=DATA)
    def write(self, data, payload):
        fd = data.draw(st.sampled_from(self.writers()))
        self.both(os.write, (fd.ours, payload), (fd.ref, payload))
        assert os.lseek(fd.ours, 0, os.SEEK_CUR) == os.lseek(fd.ref, 0, os.SEEK_CUR)

    @precondition(lambda self: self.writers())
    @rule(data=st.data(), size=SIZES)
    def ftruncate(self, data, size):
        fd = data.draw(st.sampled_from(self.writers()))
        self.both(os.ftruncate, (fd.ours, size), (fd.ref, size))

    @precondition(lambda self: self.writers())
    @rule(data=st.data(), size=st.integers(1, 100_000))
    def fallocate(self, data, size):
        fd = data.draw(st.sampled_from(self.writers()))
        self.both(os.posix_fallocate, (fd.ours, 0, size), (fd.ref, 0, size))

    @precondition(lambda self: self.writers())
    @rule(data=st.data())
    def seek_end_and_fstat(self, data):
        fd = data.draw(st.sampled_from(self.writers()))
        assert os.fstat(fd.ours).st_size == os.fstat(fd.ref).st_size
        assert os.lseek(fd.ours, 0, os.SEEK_END) == os.lseek(fd.ref, 0, os.SEEK_END)

    @precondition(lambda self: self.writers())
    @rule(data=st.data(), off=SIZES, n=st.integers(1, 100_000))
    def pread(self, data, off, n):
        fd = data.draw(st.sampled_from(self.writers()))
        assert os.pread(fd.ours, n, off) == os.pread(fd.ref, n, off)

    @precondition(lambda self: len(self.writers()) >= 1)
    @rule(data=st.data(), off=st.integers(0, 50_000), n=st.integers(1, 80_000))
    def copy_file_range(self, data, off, n):
        src = data.draw(st.sampled_from(self.writers()))
        dst = data.draw(st.sampled_from(self.writers()))
        if src.name == dst.name:
            return                  # overlapping copies within a file: not modelled
        self.both(os.copy_file_range, (src.ours, dst.ours, n, off, off),
                  (src.ref, dst.ref, n, off, off))

    @precondition(lambda self: self.writers())
    @rule(data=st.data(), payload=st.binary(min_size=1, max_size=300))
    def mmap_write(self, data, payload):
        fd = data.draw(st.sampled_from(self.writers()))
        size = os.fstat(fd.ref).st_size
        assert os.fstat(fd.ours).st_size == size
        if size < len(payload):
            return
        off = data.draw(st.integers(0, size - len(payload)))
        for f in (fd.ours, fd.ref):
            mm = mmap.mmap(f, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            mm[off:off + len(payload)] = payload
            mm.close()
        # Python's mmap holds a dup of the descriptor and closes it with the
        # map: a close by the opener's process, so the pages are written back
        # and the draft is published
        self.publish(fd.name)

    # ---- publishing ----

    @precondition(lambda self: self.fds)
    @rule(data=st.data())
    def close(self, data):
        fd = data.draw(st.sampled_from(self.fds))
        self.fds.remove(fd)
        os.close(fd.ours)
        os.close(fd.ref)
        if fd.kind == "w" and not fd.orphan:
            self.publish(fd.name)           # the opener's close publishes

    @precondition(lambda self: self.writers())
    @rule(data=st.data())
    def fsync(self, data):
        fd = data.draw(st.sampled_from(self.writers()))
        os.fsync(fd.ours)
        os.fsync(fd.ref)
        self.publish(fd.name)

    # ---- names ----

    @precondition(lambda self: self.published or self.writers())
    @rule(data=st.data(), new=NAMES)
    def rename(self, data, new):
        names = sorted(set(self.published) | {f.name for f in self.writers()})
        old = data.draw(st.sampled_from(names))
        if old == new:
            return
        os.rename(self.ours / old, self.ours / new)
        os.rename(self.ref / old, self.ref / new)
        for f in self.fds:
            if f.kind == "w" and f.name == new and not f.orphan:
                f.orphan = True             # its file was replaced: its bytes go with it
        for f in self.fds:
            if f.name == old and not f.orphan:
                f.name = new
        self.published.pop(new, None)
        if old in self.published:
            self.published[new] = self.published.pop(old)

    @precondition(lambda self: self.published)
    @rule(data=st.data())
    def unlink(self, data):
        name = data.draw(st.sampled_from(sorted(self.published)))
        if self.writers(name):
            return          # (an unlinked file's writer: covered by rename-over)
        os.unlink(self.ours / name)
        os.unlink(self.ref / name)
        del self.published[name]

    # ---- what others see ----

    @precondition(lambda self: self.published or self.writers())
    @rule(data=st.data())
    def other_process(self, data):
        names = sorted(set(self.published) | {f.name for f in self.writers()})
        name = data.draw(st.sampled_from(names))
        seen = other_process_view(self.ours / name)
        if name in self.published:
            assert seen == (len(self.published[name]), self.published[name])
        else:
            assert seen is None         # created, not yet published: not a hit

    @invariant()
    def readers_keep_their_snapshot(self):
        for fd in self.fds:
            if fd.kind == "r":
                assert os.pread(fd.ours, len(fd.snapshot) + 10, 0) == fd.snapshot

    @invariant()
    def names_agree(self):
        assert sorted(os.listdir(self.ours)) == sorted(os.listdir(self.ref))


TestWriterModel = WriterModel.TestCase
TestWriterModel.settings = settings(
    max_examples=int(os.environ.get("MEMOSFS_MODEL_EXAMPLES") or 60),
    stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
