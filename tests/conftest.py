"""Fixtures: real mounts in temporary directories, always unmounted; the
handlers without a mount; the test layers as markers.

`make_mount(...)` starts `memosfs ... -f` as a child process (through
memosfs/testing/daemon.py, as the fault runner and the benchmarks do), waits
until the mountpoint is a mount, and on teardown unmounts (lazily if a test
left a file open), stops the child by its pid and asserts that the daemon
logged no traceback.  Mounted tests skip with a reason where FUSE is not
available.

`make_handlers(...)` builds a Store and a MemosOperations without FUSE
(`Handlers`: each handler run to completion synchronously); teardown runs the
consistency check and closes the store.

Markers (registered in pyproject.toml): `mount` (a real FUSE mount; set here
on every test that uses make_mount or mnt, by pytestmark elsewhere), `slow`
(over ~10 s), `model` (the real offline model), `cluster` (starts a Redis
Cluster).  `pytest -m "not mount and not slow"` (make test-fast) is the fast
layer.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Optional

import pytest

from memosfs.testing.daemon import Daemon, is_mounted  # noqa: F401  (tests import it here)
from memosfs.testing.errnos import errno_of

FUSE_REASON = None
if not os.path.exists("/dev/fuse"):
    FUSE_REASON = "/dev/fuse is missing"
elif shutil.which("fusermount3") is None:
    FUSE_REASON = "fusermount3 is not installed"

needs_fuse = pytest.mark.skipif(FUSE_REASON is not None, reason=FUSE_REASON or "")

# A test that uses one of these fixtures (directly or through another) gets the mark.
MARK_BY_FIXTURE = {"make_mount": "mount", "mnt": "mount", "cluster": "cluster",
                   "real_model": "model"}


def pytest_collection_modifyitems(config, items):
    """Mark the layers from the fixtures each test uses: a test that mounts
    through make_mount or mnt is a `mount` test, one that uses a `cluster`
    fixture a `cluster` test, one that uses `real_model` a `model` test."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for name in sorted({m for f, m in MARK_BY_FIXTURE.items() if f in used}):
            item.add_marker(getattr(pytest.mark, name))


# ---------------------------------------------------------------- mounts

class Mount(Daemon):
    """A running memosfs at `tmp/name` (SSD folder `tmp/name-ssd` unless opts
    has ssd=, log `tmp/name.log`): `.path` is the mountpoint, `.proc` the
    daemon; `stats()` reads the text `stats` file as floats."""

    def __init__(self, tmp: Path, opts: dict[str, object], name: str) -> None:
        self.tmp = tmp
        opts = dict(opts)
        if os.environ.get("MEMOSFS_TEST_PASSTHROUGH") == "1" and "passthrough" not in opts \
                and str(opts.get("writeback_cache", "0")) != "1":
            opts["passthrough"] = 1         # (the suite run on the passthrough path)
        ssd = Path(str(opts.pop("ssd", tmp / (name + "-ssd"))))
        super().__init__(tmp / name, ssd, tmp / (name + ".log"), opts, capture=True,
                         stats_format="text", stop_timeout=15,
                         env={"MEMOSFS_CHECK_AT_UNMOUNT": "1"})


@pytest.fixture
def make_mount(tmp_path):
    """make_mount(capacity="64M", evict_batch=1, ...) -> Mount; unmounted at
    teardown.  world=True mounts where every uid can reach the mountpoint."""
    if FUSE_REASON:
        pytest.skip(FUSE_REASON)
    mounts: list[Mount] = []
    public: list[str] = []

    def factory(world: bool = False, **opts: object) -> Mount:
        base = tmp_path
        if world:
            public.append(tempfile.mkdtemp(prefix="memosfs-test-"))
            os.chmod(public[-1], 0o755)
            base = Path(public[-1])
        m = Mount(base, opts, f"mnt{len(mounts)}")
        mounts.append(m)
        return m

    yield factory
    for m in mounts:
        m.stop()
    for d in public:
        shutil.rmtree(d, ignore_errors=True)
    for m in mounts:
        text = m.logtext()
        assert "Traceback" not in text, f"daemon logged a traceback:\n{text}"
        # every mount ends with the consistency checks (memory, namespace,
        # coherence, SSD index against its folder): see MemosOperations.check_all
        assert "consistency check at unmount failed" not in text, \
            "\n".join(line for line in text.splitlines() if "consistency check" in line)
        if f"unmounted {m.path}" in text:        # (a daemon killed never gets there)
            assert "consistency check at unmount: ok" in text, text[-3000:]


@pytest.fixture(autouse=True)
def cpu_hogs():
    """MEMOSFS_HOGS=N (make test-stress): N busy processes run beside every
    test, so that races that need a busy machine to show (a thread preempted
    between two steps) show here too.  Stopped by pid at teardown."""
    n = int(os.environ.get("MEMOSFS_HOGS", "0") or 0)
    hogs = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(n)]
    yield n
    for h in hogs:
        h.kill()
        h.wait()


@pytest.fixture
def mnt(make_mount):
    return make_mount(capacity="64M")


# ---------------------------------------------------------------- handlers without a mount

MiB = 1 << 20


class Ctx:
    """A request context as pyfuse3 passes it (gid defaults to uid)."""

    def __init__(self, uid: int = 0, gid: Optional[int] = None) -> None:
        self.uid, self.gid = uid, uid if gid is None else gid
        self.pid, self.umask = os.getpid(), 0o022


CTX = Ctx()


class Handlers:
    """A Store and a MemosOperations over it, no FUSE: `call(name, *args)`
    runs a handler to completion (handlers never wait on anything, so one
    send() finishes them, and that is checked).  Path helpers act as root.
    ssd: a folder for an SSD tier (none by default)."""

    errno_of = staticmethod(errno_of)

    def __init__(self, capacity: int = 16 * MiB, evict_batch: int = 16, ring_slots: int = 0,
                 ssd: Optional[str | os.PathLike] = None) -> None:
        from memosfs.fuse.operations import MemosOperations
        from memosfs.store.store import Store
        if ssd is None:
            self.store = Store(capacity, evict_batch, ring_slots)
        else:
            from memosfs.store.ssd import SSDTier
            self.store = Store(capacity, evict_batch, ring_slots, ssd=SSDTier(str(ssd)))
        self.ops = MemosOperations(self.store)

    def call(self, name: str, *args: Any) -> Any:
        coro = getattr(self.ops, name)(*args)
        try:
            coro.send(None)
        except StopIteration as done:
            return done.value
        coro.close()
        raise AssertionError(f"handler {name} suspended")

    def err(self, name: str, *args: Any) -> int:
        """The errno handler `name` answered (0: it succeeded)."""
        return errno_of(self.call, name, *args)

    def lookup(self, path: str, ctx: Ctx = CTX) -> int:
        import pyfuse3
        ino = pyfuse3.ROOT_INODE
        for part in path.strip("/").split("/"):
            if part:
                ino = self.call("lookup", ino, part.encode(), ctx).st_ino
        return ino

    def mkdirs(self, path: str) -> int:
        import pyfuse3
        ino = pyfuse3.ROOT_INODE
        for part in path.strip("/").split("/"):
            try:
                ino = self.call("lookup", ino, part.encode(), CTX).st_ino
            except pyfuse3.FUSEError:
                ino = self.call("mkdir", ino, part.encode(), 0o755, CTX).st_ino
        return ino

    def write(self, path: str, data: bytes, flags: int = os.O_WRONLY | os.O_TRUNC) -> None:
        import pyfuse3
        d, name = path.rsplit("/", 1)
        parent = self.lookup(d)
        for attempt in range(2):            # the kernel retries an open on ESTALE
            try:
                ino = self.call("lookup", parent, name.encode(), CTX).st_ino
                fi = self.call("open", ino, flags, CTX)
                break
            except pyfuse3.FUSEError as e:
                if e.errno == errno.ESTALE and attempt == 0:
                    continue
                if e.errno != errno.ENOENT:
                    raise
                fi, _ = self.call("create", parent, name.encode(), 0o644, flags, CTX)
                break
        self.call("write", fi.fh, 0, data)
        self.call("flush", fi.fh)
        self.call("release", fi.fh)

    def open_read(self, path: str) -> Any:
        return self.call("open", self.lookup(path), os.O_RDONLY, CTX)

    def read(self, path: str) -> bytes:
        fi = self.open_read(path)
        out = b""
        while chunk := self.call("read", fi.fh, len(out), 1 << 20):
            out += chunk
        self.call("release", fi.fh)
        return out

    def listdir(self, path: str) -> list[str]:
        node = self.ops.inodes[self.lookup(path)]
        return sorted(node.children)

    def close(self, check: bool = True) -> None:
        if check:
            self.ops.check()
        self.store.close()


@pytest.fixture
def make_handlers():
    """make_handlers(capacity=16 MiB, evict_batch=16, ring_slots=0, ssd=None)
    -> Handlers; at teardown each is checked (ops.check()) and closed."""
    made: list[Handlers] = []

    def factory(**kw: Any) -> Handlers:
        made.append(Handlers(**kw))
        return made[-1]

    yield factory
    for h in made:
        h.close()
