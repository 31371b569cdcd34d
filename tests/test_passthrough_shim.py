"""FUSE passthrough through memosfs._fuseshim (native/fuse/passthrough.c): the
shim asks the kernel for FUSE_PASSTHROUGH in the INIT reply
(set_passthrough), registers backing files on /dev/fuse (backing_open,
backing_close) and turns an OPEN or CREATE reply whose fh was attached
(attach) into a passthrough open.  The kernel then reads and writes the
backing file itself: the daemon sees no READ or WRITE.

Each test mounts a minimal filesystem of its own, this file run as a script
(`python test_passthrough_shim.py MNT DIR [off]`: memosfs is imported first so
that the shim is interposed under pyfuse3), in a temporary folder, and
unmounts it (fusermount3 -u) in teardown.  The filesystem has one file `f`
backed by DIR/backing-f; what an open does is set by looking up a command
name (`.cmd-mode-same` ...), and `.cmd-stats` writes the shim's request
counts to DIR/stats.json (lookups: neither a READ nor a WRITE).  Skipped, with
the reason, where the kernel does not grant passthrough or without root
(FUSE_DEV_IOC_BACKING_OPEN needs CAP_SYS_ADMIN).
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import stat
import subprocess
import sys
import time
import traceback
from pathlib import Path

import memosfs  # noqa: F401  (first: the shim is loaded before pyfuse3)

CONTENT = b"".join(b"backing line %04d\n" % i for i in range(300))

# --------------------------------------------------------------- the daemon


def serve(mnt: str, folder: str, passthrough: bool, writeback: bool = False) -> None:
    import pyfuse3
    import trio
    from memosfs import _fuseshim

    class PassFS(pyfuse3.Operations):
        """Files backed by files in `folder`: `f` (DIR/backing-f) and those
        created through the mount (DIR/backing-NAME)."""

        enable_writeback_cache = writeback  # the kernel refuses passthrough with it

        def __init__(self) -> None:
            super().__init__()
            self.dir = Path(folder)
            self.names = {b"f": 2}
            self.paths = {2: self.dir / "backing-f"}
            self.next_ino = 3
            self.next_fh = 1
            self.mode = "same"
            self.inode_id: dict[int, int] = {}     # ino -> its backing id (kept)
            self.to_close: list[int] = []
            self.closed: list[object] = []         # backing_close results
            self.errors: list[str] = []
            self.flood: dict = {}

        # -- helpers
        def attr(self, ino: int) -> "pyfuse3.EntryAttributes":
            a = pyfuse3.EntryAttributes()
            a.st_ino = ino
            a.generation = 0
            a.entry_timeout = 60
            a.attr_timeout = 60
            if ino == pyfuse3.ROOT_INODE:
                a.st_mode = stat.S_IFDIR | 0o755
                a.st_nlink = 2
                a.st_size = 0
            else:
                st = os.stat(self.paths[ino])
                a.st_mode = stat.S_IFREG | 0o644
                a.st_nlink = 1
                a.st_size = st.st_size
                a.st_mtime_ns = st.st_mtime_ns
                a.st_ctime_ns = st.st_ctime_ns
                a.st_atime_ns = st.st_atime_ns
            a.st_blksize = 4096
            a.st_blocks = (a.st_size + 511) // 512
            return a

        def register(self, path: Path) -> int:
            """A backing id for a new open of `path` (the kernel keeps its
            own reference: the descriptor is closed at once)."""
            fd = os.open(path, os.O_RDWR)
            try:
                return _fuseshim.backing_open(fd)
            finally:
                os.close(fd)

        def command(self, cmd: str) -> None:
            if cmd.startswith("mode-"):
                self.mode = cmd[5:]
            elif cmd == "close":
                for bid in self.to_close:
                    for _ in range(2):          # the second: the kernel's answer
                        try:
                            _fuseshim.backing_close(bid)
                            self.closed.append(0)
                        except OSError as e:
                            self.closed.append(e.errno)
                self.to_close = []
            elif cmd == "flood":
                # attach notes whose replies never come: the table stays
                # bounded, the oldest notes go
                bid = self.inode_id.get(2) or self.register(self.paths[2])
                self.inode_id[2] = bid
                base = 1 << 40
                for i in range(1000):
                    _fuseshim.attach(base + i, bid)
                st = _fuseshim.passthrough_stats()
                self.flood = {"notes": st["notes"], "dropped": st["notes_dropped"],
                              "oldest_kept": _fuseshim.detach(base),
                              "newest_kept": _fuseshim.detach(base + 999)}
                for i in range(1000):
                    _fuseshim.detach(base + i)
                self.flood["left"] = _fuseshim.passthrough_stats()["notes"]
            elif cmd == "stats":
                out = {"op_counts": _fuseshim.op_counts(),
                       "granted": _fuseshim.passthrough_granted(),
                       "pt": _fuseshim.passthrough_stats(),
                       "opens": _fuseshim.passthrough_opens(),
                       "closed": self.closed, "errors": self.errors,
                       "flood": self.flood}
                tmp = self.dir / "stats.json.tmp"
                tmp.write_text(json.dumps(out))
                os.replace(tmp, self.dir / "stats.json")

        def open_info(self, ino: int) -> "pyfuse3.FileInfo":
            fh = self.next_fh
            self.next_fh += 1
            if self.mode == "none" or not _fuseshim.passthrough_granted():
                return pyfuse3.FileInfo(fh=fh)             # a cached open
            if self.mode == "same":
                if ino not in self.inode_id:
                    self.inode_id[ino] = self.register(self.paths[ino])
                bid = self.inode_id[ino]
            elif self.mode == "other":
                other = self.dir / ("other-%d" % fh)
                other.write_bytes(b"other file\n")
                bid = self.register(other)
            elif self.mode == "fresh-close":
                bid = self.register(self.paths[ino])
                self.to_close.append(bid)
            else:
                raise pyfuse3.FUSEError(errno.EINVAL)
            _fuseshim.attach(fh, bid)
            # flags the shim must clear: they would send reads and writes to
            # the daemon (direct_io) or make the kernel refuse the open
            return pyfuse3.FileInfo(fh=fh, direct_io=True, keep_cache=True)

        def check(self, fn, *args):
            try:
                return fn(*args)
            except pyfuse3.FUSEError:
                raise
            except Exception:
                self.errors.append(traceback.format_exc())
                raise pyfuse3.FUSEError(errno.EIO)

        # -- the requests
        async def lookup(self, parent, name, ctx):
            if name.startswith(b".cmd-"):
                self.check(self.command, name[5:].decode())
                raise pyfuse3.FUSEError(errno.ENOENT)
            if parent != pyfuse3.ROOT_INODE or name not in self.names:
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self.attr(self.names[name])

        async def getattr(self, ino, ctx):
            return self.check(self.attr, ino)

        async def setattr(self, ino, attr, fields, fh, ctx):
            if fields.update_size:
                os.truncate(self.paths[ino], attr.st_size)
            return self.attr(ino)

        async def opendir(self, ino, ctx):
            return ino

        async def readdir(self, ino, off, token):
            for i, (name, child) in enumerate(sorted(self.names.items())):
                if i >= off and not pyfuse3.readdir_reply(token, name, self.attr(child), i + 1):
                    break

        async def releasedir(self, fh):
            pass

        async def open(self, ino, flags, ctx):
            return self.check(self.open_info, ino)

        async def create(self, parent, name, mode, flags, ctx):
            ino = self.next_ino
            self.next_ino += 1
            path = self.dir / ("backing-" + name.decode())
            path.write_bytes(b"")
            self.paths[ino] = path
            self.names[name] = ino
            return self.check(self.open_info, ino), self.attr(ino)

        # READ and WRITE (not passthrough opens) on the backing file too
        async def read(self, fh, off, size):
            ino = self.fh_ino(fh)
            with open(self.paths[ino], "rb") as f:
                f.seek(off)
                return f.read(size)

        async def write(self, fh, off, buf):
            ino = self.fh_ino(fh)
            with open(self.paths[ino], "r+b") as f:
                f.seek(off)
                return f.write(buf)

        def fh_ino(self, fh: int) -> int:
            return 2                            # (only f is read without passthrough)

        async def flush(self, fh):
            pass

        async def release(self, fh):
            pass

        async def forget(self, inode_list):
            pass

    if passthrough:
        _fuseshim.set_passthrough(True)
    ops = PassFS()
    pyfuse3.init(ops, mnt, {"fsname=ptshim", "default_permissions"})
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=False)


# ---------------------------------------------------------------- the tests

if __name__ != "__main__":
    import pytest

    from conftest import FUSE_REASON

    pytestmark = pytest.mark.mount

    class PassMount:
        def __init__(self, tmp: Path, mode: str = "on") -> None:
            self.dir = tmp / "back"
            self.dir.mkdir()
            self.mnt = tmp / "mnt"
            self.mnt.mkdir()
            (self.dir / "backing-f").write_bytes(CONTENT)
            self.log = open(tmp / "daemon.log", "w+")
            env = dict(os.environ)
            root = str(Path(__file__).resolve().parents[1])
            env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
            self.proc = subprocess.Popen(
                [sys.executable, __file__, str(self.mnt), str(self.dir), mode],
                stdout=self.log, stderr=subprocess.STDOUT, env=env)
            deadline = time.monotonic() + 20
            while not os.path.ismount(self.mnt):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise AssertionError("the test filesystem did not mount:\n" +
                                         self.log_text())

        def log_text(self) -> str:
            self.log.flush()
            self.log.seek(0)
            return self.log.read()

        def cmd(self, name: str) -> None:
            assert not os.path.exists(self.mnt / (".cmd-" + name))

        def stats(self) -> dict:
            self.cmd("stats")
            return json.loads((self.dir / "stats.json").read_text())

        def count(self, s: dict, op: str) -> int:
            return int((s["op_counts"] or {}).get(op, 0))

        def wait_count(self, op: str, at_least: int, timeout: float = 10) -> dict:
            """Stats once the daemon has seen `at_least` requests of `op`
            (RELEASE comes after close(2) returns)."""
            deadline = time.monotonic() + timeout
            while True:
                s = self.stats()
                if self.count(s, op) >= at_least or time.monotonic() > deadline:
                    return s
                time.sleep(0.02)

        def stop(self) -> None:
            if os.path.ismount(self.mnt):
                r = subprocess.run(["fusermount3", "-u", str(self.mnt)], capture_output=True)
                if r.returncode != 0:
                    subprocess.run(["fusermount3", "-u", "-z", str(self.mnt)],
                                   capture_output=True)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
            self.log.close()

    def _start(tmp_path: Path, mode: str) -> "PassMount":
        if FUSE_REASON:
            pytest.skip(FUSE_REASON)
        return PassMount(tmp_path, mode)

    @pytest.fixture
    def ptfs(tmp_path):
        """A mount that asked for passthrough; skips unless it was granted."""
        if os.geteuid() != 0:
            pytest.skip("passthrough needs root: FUSE_DEV_IOC_BACKING_OPEN asks for "
                        "CAP_SYS_ADMIN")
        m = _start(tmp_path, "on")
        try:
            s = m.stats()
            if not s["granted"]:
                pytest.skip("the kernel did not grant FUSE passthrough (offered: %s; "
                            "needs Linux 6.9+ with CONFIG_FUSE_PASSTHROUGH)"
                            % s["pt"]["offered"])
            yield m
            s = m.stats()
            assert not s["errors"], s["errors"]
            assert "Traceback" not in m.log_text(), m.log_text()
        finally:
            m.stop()

    def test_reads_and_writes_go_to_the_backing_file(ptfs):
        f = ptfs.mnt / "f"
        back = ptfs.dir / "backing-f"
        s0 = ptfs.stats()
        fd = os.open(f, os.O_RDWR)
        try:
            assert os.pread(fd, len(CONTENT) + 100, 0) == CONTENT
            assert os.pread(fd, 16, 18) == CONTENT[18:34]
            # a change made to the backing file is seen at once (no page cache)
            with open(back, "r+b") as b:
                b.seek(0)
                b.write(b"CHANGED")
            assert os.pread(fd, 7, 0) == b"CHANGED"
            assert os.pwrite(fd, b"through", 100) == 7
            tail = b"appended past the end\n" * 500
            assert os.pwrite(fd, tail, len(CONTENT)) == len(tail)
        finally:
            os.close(fd)
        expect = bytearray(CONTENT)
        expect[0:7] = b"CHANGED"
        expect[100:107] = b"through"
        expect += tail
        assert back.read_bytes() == bytes(expect)
        assert os.stat(f).st_size == len(expect)
        s1 = ptfs.wait_count("release", ptfs.count(s0, "release") + 1)
        assert ptfs.count(s1, "read") == ptfs.count(s0, "read")
        assert ptfs.count(s1, "write") == ptfs.count(s0, "write")
        assert ptfs.count(s1, "open") == ptfs.count(s0, "open") + 1
        assert s1["opens"] == s0["opens"] + 1
        # FLUSH and RELEASE still reach the daemon
        assert ptfs.count(s1, "flush") == ptfs.count(s0, "flush") + 1
        assert ptfs.count(s1, "release") == ptfs.count(s0, "release") + 1
        with open(f, "rb") as r:
            assert r.read() == bytes(expect)

    def test_ftruncate_reaches_the_daemon(ptfs):
        f = ptfs.mnt / "f"
        s0 = ptfs.stats()
        fd = os.open(f, os.O_RDWR)
        try:
            os.ftruncate(fd, 1000)
            assert os.fstat(fd).st_size == 1000
            assert os.pread(fd, 2000, 0) == CONTENT[:1000]
            os.fsync(fd)
        finally:
            os.close(fd)
        s1 = ptfs.stats()
        # truncate and fsync are the daemon's to apply to the backing file
        assert ptfs.count(s1, "setattr") == ptfs.count(s0, "setattr") + 1
        assert ptfs.count(s1, "fsync") == ptfs.count(s0, "fsync") + 1
        assert ptfs.count(s1, "read") == ptfs.count(s0, "read")
        assert (ptfs.dir / "backing-f").stat().st_size == 1000
        assert os.stat(f).st_size == 1000

    def test_mmap_maps_the_backing_file(ptfs):
        f = ptfs.mnt / "f"
        s0 = ptfs.stats()
        fd = os.open(f, os.O_RDWR)
        try:
            with mmap.mmap(fd, len(CONTENT)) as m:
                assert m[:] == CONTENT
                m[0:6] = b"MAPPED"
                m.flush()
            assert (ptfs.dir / "backing-f").read_bytes()[:6] == b"MAPPED"
            assert os.pread(fd, 6, 0) == b"MAPPED"
        finally:
            os.close(fd)
        s1 = ptfs.stats()
        assert ptfs.count(s1, "read") == ptfs.count(s0, "read")
        assert ptfs.count(s1, "write") == ptfs.count(s0, "write")

    def test_create_passes_through(ptfs):
        new = ptfs.mnt / "new"
        s0 = ptfs.stats()
        fd = os.open(new, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
        try:
            assert os.write(fd, b"created " * 1000) == 8000
            assert os.pread(fd, 8, 8) == b"created "
        finally:
            os.close(fd)
        assert (ptfs.dir / "backing-new").read_bytes() == b"created " * 1000
        assert os.stat(new).st_size == 8000
        s1 = ptfs.stats()
        assert ptfs.count(s1, "create") == ptfs.count(s0, "create") + 1
        assert ptfs.count(s1, "read") == ptfs.count(s0, "read")
        assert ptfs.count(s1, "write") == ptfs.count(s0, "write")
        assert s1["opens"] == s0["opens"] + 1

    def test_second_open_needs_the_same_backing_file(ptfs):
        f = ptfs.mnt / "f"
        s0 = ptfs.stats()
        first = os.open(f, os.O_RDONLY)
        try:
            # another backing file for an inode open in passthrough: EIO
            ptfs.cmd("mode-other")
            with pytest.raises(OSError) as e:
                os.close(os.open(f, os.O_RDONLY))
            assert e.value.errno == errno.EIO
            # a cached (not passthrough) open of it: EIO too
            ptfs.cmd("mode-none")
            with pytest.raises(OSError) as e:
                os.close(os.open(f, os.O_RDONLY))
            assert e.value.errno == errno.EIO
            # the same backing id: fine
            ptfs.cmd("mode-same")
            second = os.open(f, os.O_RDWR)
            try:
                assert os.pread(second, 20, 0) == CONTENT[:20]
                os.pwrite(second, b"SECOND", 0)
                assert os.pread(first, 6, 0) == b"SECOND"
            finally:
                os.close(second)
        finally:
            os.close(first)
        # the daemon answered 4 opens: each gets its RELEASE, the refused too
        s1 = ptfs.wait_count("release", ptfs.count(s0, "release") + 4)
        assert ptfs.count(s1, "open") == ptfs.count(s0, "open") + 4
        assert ptfs.count(s1, "release") == ptfs.count(s0, "release") + 4
        # once no passthrough open is left, a cached open works again
        ptfs.cmd("mode-none")
        s0 = ptfs.stats()
        with open(f, "rb") as r:
            assert r.read(6) == b"SECOND"
        s1 = ptfs.stats()
        assert ptfs.count(s1, "read") > ptfs.count(s0, "read")

    def test_backing_close_after_the_reply(ptfs):
        f = ptfs.mnt / "f"
        ptfs.cmd("mode-fresh-close")
        fd = os.open(f, os.O_RDWR)
        try:
            ptfs.cmd("close")
            s = ptfs.stats()
            # the first close drops the id, the second finds none
            assert s["closed"] == [0, errno.ENOENT]
            assert os.pread(fd, 20, 0) == CONTENT[:20]
            os.pwrite(fd, b"after close", 0)
        finally:
            os.close(fd)
        assert (ptfs.dir / "backing-f").read_bytes()[:11] == b"after close"
        s1 = ptfs.stats()
        assert s1["opens"] == s["opens"]
        assert ptfs.count(s1, "read") == ptfs.count(s, "read")

    def test_attach_notes_are_bounded(ptfs):
        ptfs.cmd("flood")
        fl = ptfs.stats()["flood"]
        assert 0 < fl["notes"] < 1000
        assert fl["dropped"] == 1000 - fl["notes"]
        assert fl["oldest_kept"] is False and fl["newest_kept"] is True
        assert fl["left"] == 0
        # and the mount still passes through
        with open(ptfs.mnt / "f", "rb") as r:
            assert r.read() == CONTENT

    def test_without_set_passthrough_nothing_changes(tmp_path):
        m = _start(tmp_path, "off")
        try:
            s0 = m.stats()
            assert not s0["granted"] and not s0["pt"]["wanted"]
            with open(m.mnt / "f", "rb") as r:
                assert r.read() == CONTENT
            s1 = m.stats()
            assert m.count(s1, "read") > m.count(s0, "read")
            assert s1["opens"] == 0 and s1["pt"]["requests"] == 0
            assert "Traceback" not in m.log_text(), m.log_text()
        finally:
            m.stop()

    def test_not_with_the_writeback_cache(tmp_path):
        """The kernel ignores FUSE_PASSTHROUGH beside FUSE_WRITEBACK_CACHE:
        the shim does not add it, and says so."""
        m = _start(tmp_path, "writeback")
        try:
            s = m.stats()
            assert s["pt"]["wanted"] and not s["granted"]
            with open(m.mnt / "f", "rb") as r:
                assert r.read() == CONTENT
            assert "Traceback" not in m.log_text(), m.log_text()
        finally:
            m.stop()

    def test_attach_without_passthrough_is_refused():
        from memosfs import _fuseshim
        if not _fuseshim.passthrough_granted():
            with pytest.raises(OSError) as e:
                _fuseshim.attach(1, 1)
            assert e.value.errno == errno.EOPNOTSUPP
        with pytest.raises(ValueError):
            _fuseshim.attach(1, 0)
        assert _fuseshim.detach(12345) is False


if __name__ == "__main__":
    serve(sys.argv[1], sys.argv[2], sys.argv[3] != "off", sys.argv[3] == "writeback")
