"""`.federated/` through a real mount (memosfs/fuse/fedtree.py over memosfs/federated/engine.py).

A job made with mkdir, configured with the shell, fed by clients that run as
other uids (setpriv), aggregated when the last update closes; refusals seen as
errnos by the writers; the job survives a restart of the mount.  One test calls
the handlers without a mount.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
import threading

import pytest

np = pytest.importorskip("numpy")
F = pytest.importorskip("memosfs.federated")
from memosfs.federated.engine import JOB_ENTRIES  # noqa: E402

from memosfs.testing.errnos import errno_of  # noqa: E402

ALICE, BOB = 1001, 1002

# A client as another uid: `op path`, data on stdin; prints the errno (0: ok).
CLIENT = r"""
import os, sys
op, path = sys.argv[1], sys.argv[2]
code = 0
try:
    if op == "write":
        data = sys.stdin.buffer.read()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
    elif op == "read":
        with open(path, "rb") as f:
            f.read()
    elif op == "list":
        os.listdir(path)
    elif op == "unlink":
        os.unlink(path)
except OSError as e:
    code = e.errno
print(code)
"""

needs_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="runs clients as other uids: needs root and setpriv")


def as_uid(uid: int, op: str, path, data: bytes = b"") -> int:
    r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                        sys.executable, "-c", CLIENT, op, str(path)],
                       input=data, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    return int(r.stdout.split()[-1])


def write_file(path, data: bytes) -> None:
    """Write as the caller; the errno of open, write or close is raised."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def sh(cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd], capture_output=True, timeout=60)


def plain_update(delta: dict, rnd: int, client: str) -> bytes:
    return F.st_save({k: v.astype(np.float32) for k, v in delta.items()},
                     {"round": str(rnd), "encoding": "plain", "client": client})


def expected_params(params: dict, updates: list[dict], C: float, z: float, seed: int,
                    rnd: int) -> dict:
    """The server's arithmetic (docs/federated.md), recomputed here: the mean of
    the clipped updates plus N(0, (zC)^2)/m, seeded by (seed, round)."""
    names = sorted(params)
    total = {k: np.zeros(params[k].shape) for k in names}
    for u in updates:
        norm = np.sqrt(sum(float(np.sum(u[k].astype(np.float64) ** 2)) for k in names))
        f = min(1.0, C / norm) if norm > 0 else 1.0
        for k in names:
            total[k] += u[k].astype(np.float64) * f
    g = np.random.default_rng([seed, rnd])
    for k in names:
        total[k] += g.normal(0.0, z * C, size=total[k].shape)
    return {k: (params[k].astype(np.float64) + total[k] / len(updates)).astype(np.float32)
            for k in names}


def kv(text: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in text.splitlines() if " " in line)


@needs_setpriv
def test_job_through_the_mount(make_mount):
    m = make_mount(world=True, capacity="64M")
    fed = m.p(".federated")
    st = os.stat(fed)
    assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o1777
    assert ".federated" in os.listdir(m.path)
    job = fed / "lr"
    os.mkdir(job, 0o755)
    assert os.listdir(fed) == ["lr"]
    assert sorted(os.listdir(job)) == sorted(JOB_ENTRIES)

    # config with the shell: a bad value is EINVAL and changes nothing
    bad = sh(f"echo 'clip_norm = -1' > {job}/config")
    assert bad.returncode != 0 and b"Invalid argument" in bad.stderr
    assert "clip_norm = 1.0" in (job / "config").read_text()
    ok = sh(f"printf 'clients = alice,bob\\nclip_norm = 1.0\\nnoise_multiplier = 0.5\\n"
            f"seed = 7\\n' > {job}/config")
    assert ok.returncode == 0, ok.stderr
    cfg = (job / "config").read_text()
    assert "clients = alice,bob" in cfg and "noise_multiplier = 0.5" in cfg
    assert as_uid(ALICE, "write", job / "config", b"mode = secure\n") == errno.EACCES

    rng = np.random.default_rng(0)
    p0 = {"W": rng.normal(size=(4, 3)).astype(np.float32), "b": np.zeros(3, np.float32)}
    a0 = {"W": np.full((4, 3), 2.0), "b": np.full(3, 1.0)}         # norm > C: clipped
    b0 = {"W": rng.normal(scale=0.1, size=(4, 3)), "b": rng.normal(scale=0.1, size=3)}
    # an update before any params: EAGAIN
    assert as_uid(ALICE, "write", job / "updates" / "alice.safetensors",
                  plain_update(a0, 0, "alice")) == errno.EAGAIN
    write_file(job / "params.safetensors", F.st_save(p0))
    got, meta = F.st_load((job / "params.safetensors").read_bytes())
    assert np.array_equal(got["W"], p0["W"])

    # round 0: alice (uid 1001) sends; the round waits for bob
    assert as_uid(ALICE, "write", job / "updates" / "alice.safetensors",
                  plain_update(a0, 0, "alice")) == 0
    status = kv((job / "status").read_text())
    assert status["round"] == "0" and status["received_clients"] == "alice"
    assert status["missing"] == "bob"
    # a round with a missing client does not apply, even on the trigger
    trig = sh(f"echo 1 > {job}/aggregate")
    assert trig.returncode != 0 and b"Resource temporarily unavailable" in trig.stderr
    assert (job / "round").read_text() == "0\n"
    # refusals: duplicate, malformed, reading an update, listing the drop box
    assert as_uid(ALICE, "write", job / "updates" / "alice.safetensors",
                  plain_update(a0, 0, "alice")) == errno.EEXIST
    assert as_uid(BOB, "write", job / "updates" / "bob.safetensors",
                  b"not safetensors") == errno.EINVAL
    assert not (job / "updates" / "bob.safetensors").exists()
    assert as_uid(BOB, "write", job / "updates" / "mallory.safetensors",
                  plain_update(b0, 0, "mallory")) == errno.EACCES
    assert errno_of(open, job / "updates" / "alice.safetensors", "rb") == errno.EACCES
    assert as_uid(BOB, "list", job / "updates") == errno.EACCES
    assert os.listdir(job / "updates") == ["alice.safetensors"]      # the owner can
    assert errno_of(os.unlink, job / "config") == errno.EPERM
    assert errno_of(os.rename, job / "config", job / "config2") == errno.EPERM
    assert errno_of(os.chmod, job / "config", 0o666) == errno.EPERM
    assert errno_of(write_file, job / "round", b"5\n") == errno.EACCES
    assert errno_of(write_file, job / "junk", b"x") == errno.EPERM

    # bob (uid 1002) completes the round: aggregated before his close returns
    assert as_uid(BOB, "write", job / "updates" / "bob.safetensors",
                  plain_update(b0, 0, "bob")) == 0
    assert (job / "round").read_text() == "1\n"
    p1, meta = F.st_load((job / "params.safetensors").read_bytes())
    assert meta["round"] == "1"
    want = expected_params(p0, [plain_update_tensors(a0), plain_update_tensors(b0)],
                           1.0, 0.5, 7, 0)
    for k in p0:
        np.testing.assert_allclose(p1[k], want[k], rtol=1e-5, atol=1e-6)
    assert os.listdir(job / "updates") == []
    privacy = kv((job / "privacy").read_text())
    eps = float(privacy["epsilon"])
    assert 0 < eps < float("inf") and privacy["rounds"] == "1"
    assert len((job / "history").read_text().splitlines()) == 1
    assert kv((job / "status").read_text())["refused"] != "0"

    # round 1: late, duplicate, another uid's name
    assert as_uid(ALICE, "write", job / "updates" / "alice.safetensors",
                  plain_update(a0, 0, "alice")) == errno.ESTALE
    assert as_uid(BOB, "write", job / "updates" / "alice.safetensors",
                  plain_update(b0, 1, "alice")) == errno.EACCES
    assert as_uid(ALICE, "write", job / "updates" / "alice.safetensors",
                  plain_update(b0, 1, "alice")) == 0
    assert as_uid(ALICE, "write", job / "updates" / "alice.safetensors",
                  plain_update(b0, 1, "alice")) == errno.EEXIST
    assert as_uid(ALICE, "read", job / "updates" / "alice.safetensors") == errno.EACCES

    # the tools: ls -l, stat, cat
    ls = subprocess.run(["ls", "-l", job], capture_output=True, text=True, check=True).stdout
    lines = {ln.split()[-1]: ln.split() for ln in ls.splitlines()[1:]}
    assert lines["round"][0] == "-r--r--r--" and lines["config"][0] == "-rw-r--r--"
    assert lines["updates"][0] == "drwx-wx-wt" and lines["aggregate"][0] == "--w-------"
    out = subprocess.run(["stat", "-c", "%a %s %F", job / "round"], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out[:2] == ["444", "2"]
    assert subprocess.run(["cat", job / "status"], capture_output=True, text=True,
                          check=True).stdout.startswith("job lr\nround 1\n")
    ls = subprocess.run(["ls", "-l", job / "updates"], capture_output=True, text=True,
                        check=True).stdout
    assert "alice.safetensors" in ls and "--w-------" in ls
    params_before = (job / "params.safetensors").read_bytes()

    # a restart keeps the job: round, params, the pending update, the uid bindings
    m.stop()
    m2 = make_mount(world=True, capacity="64M", ssd=m.ssd)
    job = m2.p(".federated", "lr")
    assert (job / "round").read_text() == "1\n"
    assert (job / "params.safetensors").read_bytes() == params_before
    status = kv((job / "status").read_text())
    assert status["received_clients"] == "alice" and status["missing"] == "bob"
    assert as_uid(ALICE, "write", job / "updates" / "bob.safetensors",
                  plain_update(b0, 1, "bob")) == errno.EACCES
    assert as_uid(BOB, "write", job / "updates" / "bob.safetensors",
                  plain_update(b0, 1, "bob")) == 0
    assert (job / "round").read_text() == "2\n"
    assert float(kv((job / "privacy").read_text())["epsilon"]) > eps
    # only the owner removes the job; then it is gone, also after a restart
    assert as_uid(ALICE, "list", m2.p(".federated")) == 0
    os.rmdir(job)
    assert os.listdir(m2.p(".federated")) == []
    m2.stop()
    m3 = make_mount(world=True, capacity="64M", ssd=m.ssd)
    assert os.listdir(m3.p(".federated")) == []


def plain_update_tensors(delta: dict) -> dict:
    return {k: v.astype(np.float32) for k, v in delta.items()}


def test_secure_round_and_keys_through_the_mount(make_mount):
    """Mode secure with the client helpers on the mounted paths: keys are
    written as text (applied at each write), masked updates cancel in the sum."""
    m = make_mount(capacity="64M", ssd="none")
    job = m.p(".federated", "sec")
    os.mkdir(job)
    (job / "config").write_text("clients = 3\nmode = secure\nnoise_multiplier = 0\n"
                                "clip_norm = 10\n")
    p0 = {"w": np.arange(6, dtype=np.float32)}
    (job / "params.safetensors").write_bytes(F.st_save(p0))
    clients = [F.FedClient(f"c{i}", F.PathTransport(str(job)), "sec", rng=i)
               for i in range(3)]
    # a malformed key is EINVAL for the writer (echo sees it)
    r = sh(f"echo nothex > {job}/keys/c0.pub")
    assert r.returncode != 0 and b"Invalid argument" in r.stderr
    assert not (job / "keys" / "c0.pub").exists()
    for c in clients:
        c.publish_key()
    assert sorted(os.listdir(job / "keys")) == ["c0.pub", "c1.pub", "c2.pub"]
    assert errno_of(clients[0].publish_key) == errno.EEXIST
    deltas = [{"w": np.full(6, float(i + 1), np.float32)} for i in range(3)]
    params, rnd = clients[0].params()
    assert rnd == 0
    errs = []

    def send(i):
        try:
            clients[i].submit(params, deltas[i], 0)
        except OSError as e:
            errs.append(e)
    threads = [threading.Thread(target=send, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errs
    p1, rnd = clients[0].params()
    assert rnd == 1
    np.testing.assert_allclose(p1["w"], p0["w"] + 2.0, atol=1e-6)    # mean of 1, 2, 3
    assert kv((job / "privacy").read_text())["epsilon"] == "inf"      # no noise
    # a plain update in mode secure is malformed
    bad = plain_update({"w": np.zeros(6)}, 1, "c0")
    assert errno_of(write_file, job / "updates" / "c0.safetensors", bad) == errno.EINVAL


def test_handlers_without_a_mount(tmp_path, make_handlers):
    """The hooks in fs.py, called directly (no FUSE): inodes, handles, errnos."""
    import pyfuse3

    from conftest import Ctx
    from memosfs.fuse.fedtree import FED_INO

    ctx, other = Ctx(), Ctx(1001, 1001)

    def make():
        return make_handlers(ssd=tmp_path / "ssd")
    h = make()
    ops, call, err = h.ops, h.call, h.err
    root = pyfuse3.ROOT_INODE
    fed = call("lookup", root, b".federated", ctx)
    assert fed.st_ino == FED_INO
    assert stat.S_IMODE(call("getattr", FED_INO, ctx).st_mode) == 0o1777
    assert err("rmdir", root, b".federated", ctx) == errno.EPERM
    job = call("mkdir", FED_INO, b"j", 0o755, other)
    assert job.st_ino > FED_INO and job.st_uid == 1001 and job.entry_timeout == 0
    assert err("mkdir", FED_INO, b"j", 0o755, ctx) == errno.EEXIST
    assert err("mkdir", job.st_ino, b"d", 0o755, ctx) == errno.EPERM
    assert err("lookup", job.st_ino, b"nope", ctx) == errno.ENOENT
    cfg = call("lookup", job.st_ino, b"config", ctx)
    assert call("lookup", job.st_ino, b"config", ctx).st_ino == cfg.st_ino
    fi = call("open", cfg.st_ino, os.O_WRONLY | os.O_TRUNC, other)
    assert fi.direct_io and fi.fh in ops.fed.handles
    assert err("write", fi.fh, 0, b"clients = -3\n") == errno.EINVAL
    assert call("write", fi.fh, 0, b"clients = 3\n") == len(b"clients = 3\n")
    call("flush", fi.fh)
    call("release", fi.fh)
    assert not ops.fed.handles
    fi = call("open", cfg.st_ino, os.O_RDONLY, ctx)
    assert call("read", fi.fh, 0, 4096).startswith(b"clients = 3\n")
    call("release", fi.fh)
    rnd = call("lookup", job.st_ino, b"round", ctx)
    assert err("open", rnd.st_ino, os.O_WRONLY, ctx) == errno.EACCES
    upd = call("lookup", job.st_ino, b"updates", ctx)
    # a created update that gets no write disappears at release
    fi, entry = call("create", upd.st_ino, b"a.safetensors", 0o644, os.O_WRONLY, ctx)
    assert stat.S_ISREG(entry.st_mode)
    call("release", fi.fh)
    assert err("lookup", upd.st_ino, b"a.safetensors", ctx) == errno.ENOENT
    assert err("rename", upd.st_ino, b"a", root, b"a", 0, ctx) == errno.EXDEV
    assert err("getxattr", cfg.st_ino, b"user.x", ctx) == pyfuse3.ENOATTR
    assert call("listxattr", cfg.st_ino, ctx) == []
    # persisted in <ssd>/federated: a new Operations on the same directory has the job
    assert os.listdir(tmp_path / "ssd" / "federated")
    h2 = make()
    call2, err2 = h2.call, h2.err
    job2 = call2("lookup", FED_INO, b"j", ctx)
    assert job2.st_uid == 1001
    cfg2 = call2("lookup", job2.st_ino, b"config", ctx)
    fi = call2("open", cfg2.st_ino, os.O_RDONLY, ctx)
    assert call2("read", fi.fh, 0, 4096).startswith(b"clients = 3\n")
    call2("release", fi.fh)
    assert err2("rmdir", FED_INO, b"j", Ctx(1002, 1002)) == errno.EACCES
    call2("rmdir", FED_INO, b"j", other)
    assert err2("getattr", job2.st_ino, ctx) == errno.ENOENT
