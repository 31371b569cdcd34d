"""Holds that can be broken (coherence protocol 2): a holder that does not
acknowledge within lease_break_ms is revoked and the writer goes on; root
revokes the readers of a slot through .memos/cache/revoke; a read-only
holder acknowledges with ioctl(MEMOS_IOC_ACK); an acknowledgement with
nothing to acknowledge is refused (EINVAL).  Real processes under other
uids (setpriv), as in test_coherence.py."""

from __future__ import annotations

import errno
import os
import signal

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from memosfs import _native as N
from memosfs.client.shared import MEMOS_IOC_ACK, ack
from test_coherence import Agents
from test_coherence import agents, coherence_lines, knob, run_as, shared_slot  # noqa: F401

OLD = b"old!" * 4096          # 16 KiB: several pages of the kernel's cache
NEW = b"new"


def strong(m, lease_ms: int) -> None:
    """Protocol 2 with a long open timeout, so only a lease break (or an
    acknowledgement) lets a writer in before it (on a write-through mount:
    writeback_cache=0, which protocol 2 needs)."""
    knob(m, "coherence_protocol", "2")
    knob(m, "coherence_timeout_ms", "20000")
    knob(m, "lease_break_ms", str(lease_ms))
    (m.path / ".memos" / "debug" / "trace").write_text("1\n")


# ---------------------------------------------------------------- the directory


def test_directory_revoke():
    d, k = N.Directory(), b"a/s/x"
    assert d.read(k, 1, 2) == N.DIR_GRANTED and d.read(k, 3, 2) == N.DIR_GRANTED
    assert d.write(k, 2, 2) == N.DIR_PENDING
    assert d.unacked(k, 1) and d.unacked(k, 3) and not d.unacked(k, 2)
    assert d.ack(k, 3) == 0                           # 1 still holds the writer back
    assert d.revoke(k) == [1]                         # only the one that did not ack
    assert d.state(k, 2) == "E" and not d.unacked(k, 1)
    assert d.state(k, 1) == "I"
    events = d.take_events()
    assert (k, 1, "I", "I", "revoke") in events and (k, 2, "P", "E", "grant") in events
    assert d.stats()["coherence_revoked"] == 1
    # valid=True (root): S holders too, never a holder with a write handle
    assert d.read(k, 4, 1) == N.DIR_GRANTED
    assert sorted(d.revoke(k, True)) == [4]
    assert d.state(k, 4) == "I" and d.state(k, 2) == "E"
    d.check()


def test_directory_break_exclusive():
    """A writer in E that keeps another agent waiting past the lease goes to
    S; its next write (upgrade) invalidates the others and waits for them."""
    d, k = N.Directory(), b"a/s/x"
    assert d.write(k, 2, 2) == N.DIR_GRANTED and d.state(k, 2) == "E"
    assert d.read(k, 1, 2) == N.DIR_WAIT
    assert d.break_exclusive(k, 1) == [2] and d.state(k, 2) == "S"
    assert d.break_exclusive(k, 1) == []                  # nothing left to break
    assert d.read(k, 1, 2) == N.DIR_GRANTED
    assert d.write(k, 2, 2, True) == N.DIR_PENDING        # the reader must ack first
    assert d.unacked(k, 1)
    assert d.ack(k, 1) == 1 and d.state(k, 2) == "E"
    assert (k, 2, "E", "S", "revoke") in d.take_events()
    # a waiting writer breaks an M holder that keeps a write handle open
    d.publish(k, 2)
    assert d.state(k, 2) == "M" and d.write(k, 3, 2) == N.DIR_WAIT
    assert d.break_exclusive(k, 3) == [2]
    assert d.write(k, 3, 2) in (N.DIR_GRANTED, N.DIR_PENDING)
    d.check()


class RevokingAgents(Agents):
    """test_coherence's model of agents over the directory and the cache,
    with lease breaks and root's revoke at any step: a revoked reader reads
    nothing more (its reads fail), every other guarantee of the model holds
    (no read granted beside a granted or pending write under protocol 2,
    readers granted after a publish see it, the directory stays consistent),
    and a revoked reader stays in I while its handle is open."""

    def __init__(self):
        super().__init__()
        self.revoked = set()

    @rule(valid=st.booleans())
    def revoke(self, valid):
        for a in self.dir.revoke(self.key, valid):
            # (a writer whose E a later protocol-1 writer took loses its
            # unacknowledged invalidation: its next write acquires again)
            assert self.dir.state(self.key, a) == "I"
            if a in self.readers:
                self.revoked.add(a)
        self._retry_parked()

    @rule(a=st.integers(0, Agents.AGENTS - 1))
    def read_piece(self, a):
        if a not in self.revoked:
            super().read_piece(a)

    @rule(a=st.integers(0, Agents.AGENTS - 1))
    def close(self, a):
        self.revoked.discard(a)
        super().close(a)

    @invariant()
    def revoked_readers_stay_invalid(self):
        for a in self.revoked:
            assert self.dir.state(self.key, a) == "I"


TestRevokingAgents = RevokingAgents.TestCase
TestRevokingAgents.settings = settings(max_examples=100, stateful_step_count=60,
                                       deadline=None)


# ---------------------------------------------------------------- lease break


def test_stopped_reader_is_revoked_and_the_writer_goes_on(make_mount, agents):
    """A reader under uid A, stopped (SIGSTOP) while it holds the slot, keeps
    no writer under uid B out past lease_break_ms; once it runs again, its
    old handle fails with ESTALE (it never reads the old version from the
    kernel's page cache), and a fresh open reads the new version."""
    m = make_mount(world=True, writeback_cache=0)
    slot = shared_slot(m, OLD)
    strong(m, 1500)
    a, b = agents(20001), agents(20002)
    assert a(f"open {slot} r") == "ok"
    assert a("read") == OLD.hex()                     # its pages are in the cache now
    b.send(f"open {slot} w")
    assert a("poll 5000") == "pri"
    # invalidated (the pages were dropped), not acknowledged: a read of its
    # snapshot fills the cache with the old version again — unless the lease
    # broke already (a slow machine), which the rest checks all the same
    assert a("read") in (OLD.hex(), "err ESTALE")
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        assert b.recv(timeout=25) == "ok"
        assert b("write " + NEW.hex()) == "ok" and b("close") == "ok"
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    assert slot.read_bytes() == NEW
    assert a("read") == "err ESTALE"
    assert a("read") == "err ESTALE"                  # every time, not once
    assert a("poll 0") == "pri"
    assert a("close") == "ok"
    assert a(f"open {slot} r") == "ok" and a("read") == NEW.hex()
    s = m.stats()
    assert s["coherence_revoked"] == 1 and s["coherence_timeouts"] == 0
    assert any("agent=uid:20001" in line and "cause=revoke" in line
               for line in coherence_lines(m)), coherence_lines(m)
    log = m.logtext()
    assert "revoked uid:20001" in log and "lease_break_ms=1500" in log


def test_stopped_writer_does_not_keep_readers_out(make_mount, agents):
    """A writer under uid B, stopped (SIGSTOP) while it holds the slot
    exclusively, keeps no reader under uid A waiting past lease_break_ms
    (before: until the open timed out).  The reader reads the last published
    version; once the writer runs again, its publish first takes the slot
    back from the reader (invalidation, then the reader's lease), and the
    slot holds the writer's version."""
    m = make_mount(world=True, writeback_cache=0)
    slot = shared_slot(m, OLD)
    strong(m, 1000)
    a, b = agents(20001), agents(20002)
    assert b(f"open {slot} w") == "ok"
    assert b("write " + NEW.hex()) == "ok"
    os.kill(b.proc.pid, signal.SIGSTOP)
    try:
        assert a(f"open {slot} r", timeout=15) == "ok"
        assert a("read") == OLD.hex()
    finally:
        os.kill(b.proc.pid, signal.SIGCONT)
    assert b("close", timeout=15) == "ok"             # waits for a's ack or lease
    assert slot.read_bytes() == NEW
    assert a("read") in (OLD.hex(), "err ESTALE")
    assert a("close") == "ok"
    s = m.stats()
    assert s["coherence_timeouts"] == 0 and s["coherence_revoked"] >= 1
    assert "its exclusive hold is broken" in m.logtext()


def test_acknowledging_holders_are_not_revoked(make_mount, agents):
    m = make_mount(world=True, writeback_cache=0)
    slot = shared_slot(m, OLD)
    strong(m, 60000)
    a, b = agents(20001), agents(20002)
    assert a(f"open {slot} r") == "ok"
    b.send(f"open {slot} w")
    assert b.recv(0.5) is None                        # waits for A (no lease break yet)
    assert a("poll 5000") == "pri"
    assert a(f"ack {slot}") == "ok"
    assert b.recv() == "ok"
    assert a("read") == OLD.hex()                     # acknowledged: keeps its snapshot
    assert m.stats()["coherence_revoked"] == 0


def test_lease_break_ms_is_checked(make_mount):
    m = make_mount()
    assert m.ctl("lease_break_ms").read_text() == "1000\n"
    for bad in ("0", "-1", "x", "3600001"):
        with pytest.raises(OSError) as e:
            m.ctl("lease_break_ms").write_text(bad + "\n")
        assert e.value.errno == errno.EINVAL
    assert m.ctl("lease_break_ms").read_text() == "1000\n"


# ---------------------------------------------------------------- root revokes


def test_root_revokes_through_the_control_file(make_mount, agents):
    m = make_mount(world=True, writeback_cache=0)
    slot = shared_slot(m, OLD)
    strong(m, 60000)                                  # no lease break: only root's
    revoke = m.path / ".memos" / "cache" / "revoke"
    assert os.stat(revoke).st_mode & 0o777 == 0o600
    a, b = agents(20001), agents(20002)
    assert a(f"open {slot} r") == "ok" and a("read") == OLD.hex()
    b.send(f"open {slot} w")
    assert b.recv(0.5) is None, "the writer must wait for A"
    assert a("poll 5000") == "pri"
    # invalidated (its pages were dropped) but not acknowledged: it reads its
    # snapshot again, which fills the kernel's cache with the old version
    assert a("read") == OLD.hex()
    # nobody but root may revoke
    r = run_as(20003, ["sh", "-c", f"echo shared/s/prompt > {revoke}"])
    assert r.returncode != 0 and "Permission denied" in r.stderr
    assert b.recv(0.3) is None
    revoke.write_text("shared/s/prompt\n")
    assert b.recv() == "ok"
    assert a("read") == "err ESTALE"
    assert b("write " + NEW.hex()) == "ok" and b("close") == "ok"
    assert slot.read_bytes() == NEW
    assert m.stats()["coherence_revoked"] == 1
    assert "root wrote it to .memos/cache/revoke" in m.logtext()


def test_root_revokes_a_valid_reader(make_mount, agents):
    """Without a writer: the reader's copy (S) is voided all the same."""
    m = make_mount(world=True, writeback_cache=0)
    slot = shared_slot(m, OLD)
    strong(m, 60000)
    a = agents(20001)
    assert a(f"open {slot} r") == "ok" and a("read") == OLD.hex()
    assert a(f"state {slot}") == "S"
    (m.path / ".memos" / "cache" / "revoke").write_text("shared/s/prompt\n")
    assert a(f"state {slot}") == "I"
    assert a("poll 0") == "pri"
    assert a("read") == "err ESTALE"
    assert a("ioctlack") == "err EINVAL"              # revoked: nothing to acknowledge
    assert any("agent=uid:20001 from=S to=I cause=revoke" in line
               for line in coherence_lines(m))


def test_revoke_refuses_what_is_not_a_slot(make_mount):
    m = make_mount()
    revoke = m.path / ".memos" / "cache" / "revoke"
    for text, code in (("shared/s/nothing\n", errno.ENOENT), ("justone\n", errno.EINVAL)):
        with pytest.raises(OSError) as e:
            revoke.write_text(text)
        assert e.value.errno == code, text


# ---------------------------------------------------------------- ioctl ack


def test_read_only_holder_acks_with_ioctl(make_mount, agents):
    """A slot of mode 0444 owned by another uid: its reader may not set
    user.memos.ack (the kernel wants write permission), but acknowledges
    with ioctl(MEMOS_IOC_ACK) on the descriptor it reads from, without
    closing it, and the pending writer goes on."""
    m = make_mount(world=True, writeback_cache=0)
    slot = shared_slot(m, OLD)
    os.chown(slot, 20003, 20003)
    os.chmod(slot, 0o444)
    strong(m, 60000)
    a, b = agents(20001), agents(0)                   # root writes even a 0444 slot
    assert a(f"open {slot} r") == "ok"
    b.send(f"open {slot} w")
    assert b.recv(0.5) is None
    assert a("poll 5000") == "pri"
    assert a(f"ack {slot}") in ("err EACCES", "err EPERM")
    assert b.recv(0.3) is None, "a refused setxattr acknowledged nothing"
    assert a("ioctlack") == "ok"
    assert b.recv() == "ok"
    assert a("poll 0") == "none"                      # acknowledged
    assert a("ioctlack") == "err EINVAL"              # and only once
    assert b("write " + NEW.hex()) == "ok" and b("close") == "ok"
    assert slot.read_bytes() == NEW
    s = m.stats()
    assert s["coherence_revoked"] == 0 and s["coherence_timeouts"] == 0


def test_ack_with_nothing_to_acknowledge_is_refused(make_mount, agents):
    m = make_mount(world=True, writeback_cache=0)
    slot = shared_slot(m, OLD)
    strong(m, 60000)
    a, c = agents(20001), agents(20004)
    assert c(f"ack {slot}") == "err EINVAL"           # holds nothing
    assert a(f"open {slot} r") == "ok"
    assert a(f"ack {slot}") == "err EINVAL"           # holds a valid copy
    assert a("ioctlack") == "err EINVAL"
    assert m.stats()["coherence_acks"] == 0
    assert "no invalidation to acknowledge" in m.logtext()
    # memosfs.shared.ack says so without raising
    assert MEMOS_IOC_ACK == 0x4D01
    fd = os.open(slot, os.O_RDONLY)
    try:
        assert ack(fd) is False
    finally:
        os.close(fd)
    # not a slot: ENOTTY
    fd = os.open(m.path / ".memos" / "cache" / "stats", os.O_RDONLY)
    try:
        with pytest.raises(OSError) as e:
            ack(fd)
        assert e.value.errno == errno.ENOTTY
    finally:
        os.close(fd)


def test_protocol_0_ioctl_ack_is_refused(make_mount, agents):
    m = make_mount(world=True, writeback_cache=0)
    slot = shared_slot(m, OLD)
    knob(m, "coherence_protocol", "0")
    a = agents(20001)
    assert a(f"open {slot} r") == "ok"
    assert a("ioctlack") == "err EINVAL"


def test_shared_slots_after_a_revoke(make_mount):
    """memosfs.shared.SharedSlots drops a revoked copy (its watcher sees
    POLLERR) and reads the slot afresh."""
    from memosfs.client.shared import SharedSlots
    m = make_mount(world=True, writeback_cache=0)
    slot = shared_slot(m, OLD)
    strong(m, 60000)
    with SharedSlots() as slots:
        assert slots.read(str(slot)) == OLD
        (m.path / ".memos" / "cache" / "revoke").write_text("shared/s/prompt\n")
        assert slots.read(str(slot)) == OLD
        assert slots.opens == 2 and slots.invalidations == 1
    assert m.stats()["coherence_revoked"] == 1
