"""Fair share on one mount shared by several uids (memosfs/tenants.py).

Every test runs real processes under other uids (setpriv) against a real
mount: pins beyond `pin_max_per_uid` and opens beyond `hold_max_per_uid`
are EDQUOT for that uid and leave room for the others; an agent directory's
`user.memos.quota` (root only) bounds and protects its share of the memory
tier, moves its own slots to the SSD tier first, and survives a remount.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import time

import pytest

SETPRIV = shutil.which("setpriv")
MiB = 1 << 20

pytestmark = [
    pytest.mark.skipif(SETPRIV is None, reason="setpriv (util-linux) is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run processes as other uids"),
]


def as_uid(uid: int, script: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a shell script as uid (its own group, no others)."""
    return subprocess.run([SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           "sh", "-c", script], capture_output=True, text=True,
                          timeout=timeout, cwd="/")


def start_as_uid(uid: int, script: str) -> subprocess.Popen:
    return subprocess.Popen([SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                             "sh", "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd="/")


def agent_dir(m, name: str, uid: int, mode: int = 0o700):
    """An agent with one session, owned by uid."""
    d = m.p(name, "s")
    d.mkdir(parents=True)
    for p in (m.p(name), d):
        os.chown(p, uid, uid)
        os.chmod(p, mode)
    return d


def stats(m) -> dict[str, float]:
    return m.stats()


def test_pins_are_bounded_per_uid(make_mount):
    """uid 5001 pins slots until pin_max_per_uid: the next pin is EDQUOT
    (the log says why), another uid can still write 8 MiB, root is not
    bounded, and an unpin gives the share back."""
    m = make_mount(world=True, capacity="64M", pin_max_per_uid="16M")
    d = agent_dir(m, "alice", 5001)
    r = as_uid(5001, f"""set -e
        cd {d}
        for i in 1 2 3 4 5; do head -c 4194304 /dev/zero > p$i; done
        for i in 1 2 3 4; do setfattr -n user.memos.pin -v 1 p$i; done
        if setfattr -n user.memos.pin -v 1 p5 2>err; then echo PINNED5; fi
        cat err""")
    assert r.returncode == 0, r.stderr
    assert "PINNED5" not in r.stdout
    assert "Disk quota exceeded" in r.stdout
    assert "pin_max_per_uid" in m.logtext()
    assert stats(m)["pin_refused"] == 1
    assert os.getxattr(d / "p4", "user.memos.pin") == b"1"
    assert os.getxattr(d / "p5", "user.memos.pin") == b"0"
    # another uid still finds room for 8 MiB (16 MiB pinned of 64)
    e = agent_dir(m, "bob", 5002)
    r = as_uid(5002, f"head -c 8388608 /dev/urandom > {e}/big && echo OK")
    assert r.stdout.strip() == "OK", r.stderr
    # an unpin gives the share back
    r = as_uid(5001, f"setfattr -n user.memos.pin -v 0 {d}/p1 && "
                     f"setfattr -n user.memos.pin -v 1 {d}/p5 && echo OK")
    assert r.stdout.strip() == "OK", r.stderr
    # root is not bounded
    for i in (1, 2, 3):
        os.setxattr(d / f"p{i}", "user.memos.pin", b"1")
    assert os.getxattr(d / "p1", "user.memos.pin") == b"1"


def test_pin_share_follows_capacity_and_knob(make_mount):
    """The default is a share of capacity (25%); the knob takes a size or a
    share and refuses anything else."""
    m = make_mount(world=True, capacity="32M")
    assert m.ctl("pin_max_per_uid").read_text() == "25%\n"
    d = agent_dir(m, "alice", 5001)
    r = as_uid(5001, f"""cd {d}
        for i in 1 2 3; do head -c 3145728 /dev/zero > p$i; done
        setfattr -n user.memos.pin -v 1 p1 && setfattr -n user.memos.pin -v 1 p2 && echo TWO
        setfattr -n user.memos.pin -v 1 p3 || echo THIRD-REFUSED""")
    assert "TWO" in r.stdout and "THIRD-REFUSED" in r.stdout, (r.stdout, r.stderr)
    m.ctl("pin_max_per_uid").write_text("50%\n")
    r = as_uid(5001, f"setfattr -n user.memos.pin -v 1 {d}/p3 && echo OK")
    assert r.stdout.strip() == "OK", r.stderr
    for bad in ("0%", "101%", "-5%", "12", "lots", "25 %"):
        with pytest.raises(OSError) as ei:
            m.ctl("pin_max_per_uid").write_text(bad + "\n")
        assert ei.value.errno == errno.EINVAL, bad
    assert m.ctl("pin_max_per_uid").read_text() == "50%\n"
    m.ctl("pin_max_per_uid").write_text("8M\n")
    assert m.ctl("pin_max_per_uid").read_text() == f"{8 * MiB}\n"


def test_open_handles_are_bounded_per_uid(make_mount):
    """A uid that holds slots open for reading keeps at most
    hold_max_per_uid of memory from eviction: the next open is EDQUOT; a
    second handle on a version it already holds costs nothing; closing
    gives the share back; root is not bounded; writers' drafts count too."""
    m = make_mount(world=True, capacity="64M", hold_max_per_uid="12M")
    d = agent_dir(m, "alice", 5001, mode=0o755)
    for i in range(5):
        (d / f"r{i}").write_bytes(bytes([i]) * (4 * MiB))
        os.chmod(d / f"r{i}", 0o644)
    holder = start_as_uid(5001, f"""exec 3<{d}/r0 4<{d}/r1 5<{d}/r2 6<{d}/r2
        echo HELD; exec sleep 120""")
    try:
        assert holder.stdout.readline().strip() == "HELD", holder.stderr.read()
        r = as_uid(5001, f"cat {d}/r3 > /dev/null")
        assert r.returncode != 0 and "Disk quota exceeded" in r.stderr
        assert "hold_max_per_uid" in m.logtext()
        # another uid is not bounded by alice's handles
        r = as_uid(5002, f"cat {d}/r3 | wc -c")
        assert r.stdout.strip() == str(4 * MiB), r.stderr
        # nor is root
        assert (d / "r4").read_bytes() == bytes([4]) * (4 * MiB)
        # a writer's draft counts against the same share
        r = as_uid(5001, f"head -c 2097152 /dev/zero > {d}/w || echo WRITE-REFUSED")
        assert "WRITE-REFUSED" in r.stdout, (r.stdout, r.stderr)
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 10
    while True:
        r = as_uid(5001, f"cat {d}/r3 | wc -c")
        if r.stdout.strip() == str(4 * MiB) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert r.stdout.strip() == str(4 * MiB), r.stderr
    assert stats(m)["hold_refused"] >= 2


def test_agent_quota_bounds_and_protects(make_mount):
    """root gives alice 8 MiB: getfattr shows it; alice's writes beyond it
    move her own oldest slots to the SSD tier (still readable), so she
    never holds more than 8 MiB of memory; bob filling memory never
    evicts alice's slots within the quota; only root sets a quota; it
    survives a remount."""
    m = make_mount(world=True, capacity="32M")
    a = agent_dir(m, "alice", 5001)
    b = agent_dir(m, "bob", 5002)
    os.setxattr(m.p("alice"), "user.memos.quota", b"8M")
    assert os.getxattr(m.p("alice"), "user.memos.quota") == str(8 * MiB).encode()
    assert os.listxattr(m.p("alice")) == ["user.memos.quota"]    # usage: computed
    r = as_uid(5001, f"setfattr -n user.memos.quota -v 1G {m.p('alice')} || echo REFUSED")
    assert "REFUSED" in r.stdout
    r = as_uid(5002, f"setfattr -n user.memos.quota -v 1G {m.p('bob')} || echo REFUSED")
    assert "REFUSED" in r.stdout
    with pytest.raises(OSError) as ei:
        os.setxattr(m.p("alice", "s"), "user.memos.quota", b"1M")
    assert ei.value.errno == errno.EINVAL
    with pytest.raises(OSError) as ei:
        os.setxattr(m.p("alice"), "user.memos.quota", b"\xd9\xa3M")
    assert ei.value.errno == errno.EINVAL
    # alice writes 6 x 2 MiB: the oldest go to the SSD tier, none is lost
    r = as_uid(5001, f"""set -e; cd {a}
        for i in 0 1 2 3 4 5; do head -c 2097152 /dev/urandom > a$i; done
        md5sum a0 a1 a2 a3 a4 a5""")
    assert r.returncode == 0, r.stderr
    sums = dict(line.split()[::-1] for line in r.stdout.splitlines())
    usage = int(os.getxattr(m.p("alice"), "user.memos.usage"))
    assert 0 < usage <= 8 * MiB
    assert os.getxattr(a / "a0", "user.memos.tier") == b"ssd"
    assert os.getxattr(a / "a5", "user.memos.tier") == b"mem"
    assert stats(m)["quota_evictions"] >= 2
    # bob fills the memory tier twice over: alice's slots within the quota stay
    in_mem = [n for n in sums if os.getxattr(a / n, "user.memos.tier") == b"mem"]
    r = as_uid(5002, f"""set -e; cd {b}
        for i in $(seq 0 31); do head -c 2097152 /dev/zero > b$i; done; echo OK""")
    assert r.stdout.strip() == "OK", r.stderr
    for n in in_mem:
        assert os.getxattr(a / n, "user.memos.tier") == b"mem", n
    r = as_uid(5001, f"cd {a} && md5sum a0 a1 a2 a3 a4 a5")
    assert dict(line.split()[::-1] for line in r.stdout.splitlines()) == sums
    # a single write larger than the quota is EDQUOT
    r = as_uid(5001, f"head -c 10485760 /dev/zero > {a}/huge || echo REFUSED")
    assert "REFUSED" in r.stdout and "Disk quota exceeded" in r.stderr
    assert stats(m)["quota_refused"] >= 1
    assert stats(m)["quota_agents"] == 1
    # the quota survives a remount
    ssd = m.ssd
    m.stop()
    m2 = make_mount(world=True, capacity="32M", ssd=ssd)
    assert os.getxattr(m2.p("alice"), "user.memos.quota") == str(8 * MiB).encode()
    assert m2.stats()["quota_agents"] == 1
    # root takes it away
    os.removexattr(m2.p("alice"), "user.memos.quota")
    assert "user.memos.quota" not in os.listxattr(m2.p("alice"))
    assert m2.stats()["quota_agents"] == 0


def test_quota_without_ssd_tier_refuses_instead_of_dropping(make_mount, tmp_path):
    """With nothing to move slots to, an agent at its quota gets EDQUOT and
    keeps every slot it has."""
    m = make_mount(world=True, capacity="32M", ssd="none")
    a = agent_dir(m, "alice", 5001)
    os.setxattr(m.p("alice"), "user.memos.quota", b"4M")
    r = as_uid(5001, f"""cd {a}
        head -c 2097152 /dev/urandom > a0 && head -c 1048576 /dev/urandom > a1 && echo TWO
        head -c 2097152 /dev/urandom > a2 || echo REFUSED
        wc -c < a0; wc -c < a1""")
    assert "TWO" in r.stdout and "REFUSED" in r.stdout, (r.stdout, r.stderr)
    assert r.stdout.split()[-2:] == [str(2 * MiB), str(MiB)]


def test_quota_follows_an_agent_rename_and_rmdir(make_mount):
    """The quota belongs to the agent directory: renamed, the agent keeps
    it (and its slots stay counted under the new name); removed, it goes."""
    m = make_mount(world=True, capacity="32M")
    a = agent_dir(m, "alice", 5001)
    os.setxattr(m.p("alice"), "user.memos.quota", b"6M")
    (a / "x").write_bytes(b"x" * (2 * MiB))
    assert int(os.getxattr(m.p("alice"), "user.memos.usage")) == 2 * MiB
    os.rename(m.p("alice"), m.p("alice2"))
    assert os.getxattr(m.p("alice2"), "user.memos.quota") == str(6 * MiB).encode()
    assert int(os.getxattr(m.p("alice2"), "user.memos.usage")) == 2 * MiB
    for i in range(4):
        (m.p("alice2", "s") / f"y{i}").write_bytes(b"y" * (2 * MiB))
    assert int(os.getxattr(m.p("alice2"), "user.memos.usage")) <= 6 * MiB
    assert m.stats()["quota_agents"] == 1
    for f in m.p("alice2", "s").iterdir():
        f.unlink()
    m.p("alice2", "s").rmdir()
    m.p("alice2").rmdir()
    assert m.stats()["quota_agents"] == 0


def test_a_pin_stays_with_a_rewritten_slot_and_within_the_share(make_mount):
    """Regression: a pin disappeared without a word when the pinned slot was
    rewritten (the pin was the old version's).  It stays with the slot
    through O_TRUNC and in-place rewrites (also while a reader holds the
    old version), and is taken away, with a warning, only when the new
    version takes its uid past pin_max_per_uid."""
    m = make_mount(world=True, capacity="64M", pin_max_per_uid="8M")
    d = agent_dir(m, "alice", 5001)
    r = as_uid(5001, f"""set -e
        cd {d}
        head -c 1048576 /dev/urandom > p
        setfattr -n user.memos.pin -v 1 p
        head -c 2097152 /dev/urandom > p
        getfattr --only-values -n user.memos.pin p; echo
        exec 3<p
        printf 'in place' | dd of=p conv=notrunc status=none
        getfattr --only-values -n user.memos.pin p; echo
        exec 3<&-
        head -c 12582912 /dev/zero > p
        getfattr --only-values -n user.memos.pin p; echo""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["1", "1", "0"]
    assert "past pin_max_per_uid" in m.logtext()
    assert os.getxattr(d / "p", "user.memos.tier") == b"mem"
