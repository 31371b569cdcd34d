"""The remote tier over a real TLS Redis Cluster with an ACL user
(memosfs/localcluster.py starts it: TLS only, TLS cluster bus, a throwaway
CA made with openssl; the tenant user may touch only keys and channels
under its prefix and run only the commands `remote.acl_rules()` lists).

Skips when redis-server lacks TLS, or openssl, redis-py or FUSE is missing.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memosfs.testing.localcluster import LocalCluster, make_test_ca, redis_tls_missing

REASON = redis_tls_missing()
try:
    import redis  # noqa: F401
except ImportError:
    REASON = REASON or "redis-py is not installed (pip install 'redis[hiredis]')"

pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

from conftest import FUSE_REASON, is_mounted  # noqa: E402
from memosfs.store import remote as rt  # noqa: E402
from memosfs.store.remote import RemoteRefused, RemoteTier, acl_rules, parse_url  # noqa: E402

MiB = 1 << 20
PREFIX = "t1"
USER = "tenant"
PASSWORD = "Pw-7f3a9c1e-never-logged"
ADMIN_PASSWORD = "admin-5be0d2"

mounted = pytest.mark.skipif(FUSE_REASON is not None, reason=FUSE_REASON or "")


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(masters=3, replicas=0, tls=True, admin_password=ADMIN_PASSWORD) as c:
        c.add_user(USER, PASSWORD, *acl_rules(PREFIX))
        yield c


def tenant_url(c: LocalCluster, password: str = PASSWORD, ca: str | None = None,
               extra: str = "") -> str:
    hosts = c.url.split("://", 1)[1]
    return (f"rediss://{USER}:{password}@{hosts}?ssl_ca_certs={ca or c.ca_file}"
            f"&prefix={PREFIX}{extra}")


def write_synced(path: Path, data: bytes) -> None:
    """Write and fsync: with remote_durable=1 the upload is done on return."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view[:1 << 20]):]
        os.fsync(fd)
    finally:
        os.close(fd)


def no_secret_in(text: str | bytes, where: str) -> None:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    assert PASSWORD not in text, f"the password appears in {where}"


def mount_refused(tmp_path: Path, url: str, name: str) -> tuple[int, str, str]:
    """Mount with url; the mount must fail: (exit status, its output, the log)."""
    mp = tmp_path / name
    mp.mkdir()
    logf = tmp_path / f"{name}.log"
    cmd = [sys.executable, "-m", "memosfs", "memos", str(mp), "-f", "-o",
           f"ssd={tmp_path / (name + '-ssd')},log={logf},remote={url}"]
    try:
        r = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=60)
    finally:
        if is_mounted(mp):                      # a bug: do not leave it behind
            subprocess.run(["fusermount3", "-u", "-z", str(mp)])
    log = logf.read_text() if logf.exists() else ""
    assert not is_mounted(mp)
    return r.returncode, r.stdout + r.stderr, log


# ---------------------------------------------------------------- the tier


def test_prefix_option_and_acl_rules():
    c = parse_url("rediss://u:p@h:1?prefix=team-a.x&ssl_ca_certs=/ca.pem")
    assert c.prefix == "team-a.x" and c.tls_options == {"ssl_ca_certs": "/ca.pem"}
    assert parse_url("redis://h:1").prefix == ""
    for bad in ("", "a{b}", "a b", "x" * 65):
        with pytest.raises(ValueError):
            parse_url(f"redis://h:1?prefix={bad}")
    assert rt.manifest_key(b"a/b/c", "t1") == "t1:" + rt.manifest_key(b"a/b/c")
    assert rt.chunk_key(b"a/b/c", "tag", 3, "t1") == "t1:" + rt.chunk_key(b"a/b/c", "tag", 3)
    rules = acl_rules("t1")
    assert rules[:3] == ["~t1:*", "&t1:*", "-@all"] and "+cluster|slots" in rules
    # a URL that does not parse is not echoed back (it may hold a password)
    with pytest.raises(ValueError) as e:
        parse_url(f"redis:/{USER}:{PASSWORD}@h:1")
    no_secret_in(str(e.value), "a parse error")


def test_tier_works_with_only_the_acl_permissions(cluster):
    """Two strong-mode tiers as the tenant: uploads (inline and chunked),
    reads, the session index, announcements and acknowledgements, deletes:
    every key under the prefix, nothing refused."""
    url = tenant_url(cluster, extra="&chunk=64K")
    assert RemoteTier(url).check() is None
    a = RemoteTier(url, strong=True).start()
    b = RemoteTier(url, strong=True, durable=True).start()
    try:
        assert a.wait_ready(10) and b.wait_ready(10)
        deadline = time.monotonic() + 10       # b's heartbeat makes it a live peer
        while b.origin not in a._live_peers() and time.monotonic() < deadline:
            time.sleep(0.05)
        seen = []
        b.on_invalidate = lambda key, origin, v: seen.append(key)
        big = os.urandom(300_000)
        assert a.put_sync(b"ag/s/big", big, 1) is not None
        assert a.put_sync(b"ag/s/small", b"small", 1) is not None
        assert b.get(b"ag/s/big")[1] == big and b.get(b"ag/s/small")[1] == b"small"
        assert set(b.names(b"ag/s")) == {b"big", b"small"}
        assert b.put_sync(b"ag/s/fromb", b"b" * 100, 1) is not None
        assert a.statistics()["remote_acks"] >= 1          # b acknowledged on t1:memosfs:ack
        assert b"ag/s/big" in seen
        assert a.delete_sync(b"ag/s/small") and b.get(b"ag/s/small") is None
        keys = cluster.scan("*")
        assert keys and all(k.startswith(PREFIX + ":") for k in keys), keys
        assert rt.manifest_key(b"ag/s/big", PREFIX) in keys
        assert sum(":c:" in k for k in keys) == 5       # 300 000 bytes in 64 KiB chunks
        for t in (a, b):
            s = t.statistics()
            assert s["remote_errors"] == 0 and s["remote_put_failures"] == 0, s
    finally:
        a.close(drain_s=2)
        b.close(drain_s=2)


def test_check_names_the_refusal(cluster, tmp_path):
    with pytest.raises(RemoteRefused, match="authentication failed") as e:
        RemoteTier(tenant_url(cluster, password="wrong")).check()
    assert f"127.0.0.1:{cluster.master_ports[0]}" in str(e.value)
    other = make_test_ca(str(tmp_path), "other")
    with pytest.raises(RemoteRefused, match="TLS handshake failed.*certificate verify failed"):
        RemoteTier(tenant_url(cluster, ca=other[0])).check()
    # keys outside the tenant's prefix: refused at once, not a silent half-working tier
    hosts = cluster.url.split("://", 1)[1]
    with pytest.raises(RemoteRefused, match="lacks a permission"):
        RemoteTier(f"rediss://{USER}:{PASSWORD}@{hosts}?ssl_ca_certs={cluster.ca_file}"
                   "&prefix=t2").check()
    # no node answering is not a refusal: the mount goes on and retries
    assert "no node reachable" in RemoteTier(
        f"rediss://{USER}:{PASSWORD}@127.0.0.1:1?ssl_ca_certs={cluster.ca_file}").check()


# ---------------------------------------------------------------- through mounts


@mounted
def test_mounts_share_slots_over_tls_as_the_tenant(cluster, make_mount):
    url = tenant_url(cluster, extra="&chunk=1M")
    m0 = make_mount(capacity="256M", remote=url, remote_durable=1)
    m0.p("ag", "s").mkdir(parents=True)
    small, big = os.urandom(100_000), os.urandom(3 * MiB + 17)
    write_synced(m0.p("ag", "s", "small"), small)
    write_synced(m0.p("ag", "s", "big"), big)
    # the slots are in Redis, under the tenant's prefix (seen as the admin)
    keys = cluster.scan(f"{PREFIX}:*")
    assert rt.manifest_key(b"ag/s/small", PREFIX) in keys
    assert rt.manifest_key(b"ag/s/big", PREFIX) in keys
    assert sum(":c:" in k for k in keys) == 4
    assert all(k.startswith(PREFIX + ":") for k in cluster.scan("*"))
    # a second mount with a fresh SSD directory reads them back from the remote
    # tier (logging at DEBUG: redis-py's messages are grepped too)
    m1 = make_mount(capacity="256M", remote=url, remote_durable=1, debug=1)
    m1.p("ag", "s").mkdir(parents=True)
    assert os.getxattr(m1.p("ag", "s", "big"), "user.memos.tier") == b"remote"
    assert m1.p("ag", "s", "big").read_bytes() == big
    assert m1.p("ag", "s", "small").read_bytes() == small
    s1 = m1.stats()
    assert s1["remote_hits"] == 2 and s1["remote_errors"] == 0
    # the password is nowhere: daemon logs, stats, process titles
    for m in (m0, m1):
        no_secret_in(m.ctl("stats").read_text(), "stats")
        no_secret_in(Path(f"/proc/{m.proc.pid}/cmdline").read_bytes(), "the process title")
        assert f"{USER}:***@".encode() in Path(f"/proc/{m.proc.pid}/cmdline").read_bytes()
    m1.stop()
    for m in (m0, m1):
        text = m.logtext()
        assert f"connected to rediss://{USER}:***@127.0.0.1:" in text
        no_secret_in(text, "the daemon log")
    # the slots the remote tier brought in, kept on the SSD tier, are private
    # (the tier itself writes no files: manifests and queues live in Redis
    # and in memory)
    files = [Path(d, f) for d, _, fs in os.walk(m1.ssd) for f in fs if f.endswith(".slot")]
    assert len(files) == 2
    for f in files:
        assert stat.S_IMODE(os.stat(f).st_mode) == 0o600, f


@mounted
@pytest.mark.mount
def test_wrong_password_refused_at_mount(cluster, tmp_path):
    rc, out, log = mount_refused(tmp_path, tenant_url(cluster, password="wrong-pw"), "bad")
    assert rc != 0
    assert "authentication failed" in out and f"127.0.0.1:{cluster.master_ports[0]}" in out
    assert "Traceback" not in out and "Traceback" not in log
    assert "wrong-pw" not in out and "wrong-pw" not in log
    assert "authentication failed" in log


@mounted
@pytest.mark.mount
def test_unknown_ca_refused_at_mount(cluster, tmp_path):
    other = make_test_ca(str(tmp_path), "other")
    rc, out, log = mount_refused(tmp_path, tenant_url(cluster, ca=other[0]), "badca")
    assert rc != 0
    assert "TLS handshake failed" in out and "certificate verify failed" in out
    assert f"127.0.0.1:{cluster.master_ports[0]}" in out
    assert "Traceback" not in out and "Traceback" not in log
    no_secret_in(out, "the mount's output")
    no_secret_in(log, "the daemon log")
