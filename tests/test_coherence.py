"""Coherence between agents: the directory's Python type, a model-based test
of the protocols over the real cache, and mounted tests with real processes
under different uids (setpriv) for the protocols and for isolation."""

from __future__ import annotations

import errno
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from memosfs import _native as N

AGENT_PY = Path(__file__).parent / "scripts" / "agent.py"
SETPRIV = shutil.which("setpriv")

# ---------------------------------------------------------------- the model


class Agents(RuleBasedStateMachine):
    """Simulated agents over the directory and the real cache.  An open that
    the directory tells to wait is parked and retried after every step, as a
    blocked open(2) would be.  Readers pin the version they are granted and
    read it in pieces; writers write their draft in pieces, then publish.

    Checked: every read returns one whole published version (never torn or
    mixed); under protocol 2 no read is granted while a write is granted or
    pending, and a reader granted after a publish gets that version or a newer
    one; the directory's invariants hold."""

    SIZE = 3 * 4096 + 100
    AGENTS = 4

    def __init__(self):
        super().__init__()
        self.cache = N.Cache(8 << 20)
        self.dir = N.Directory()
        self.key = b"shared/s/prompt"
        self.protocol = 2
        self.version = 0                       # the newest published version id
        self.published = {0: None}
        self.readers = {}                      # agent -> (Ref, version, pieces read)
        self.writers = {}                      # agent -> (Draft, version id, pieces written)
        self.parked = {}                       # agent -> "read" | "write"
        self.pending = set()                   # writers in P
        self.next_id = 1
        self._publish(self._new_id())

    def _new_id(self):
        self.next_id += 1
        return self.next_id

    def _publish(self, vid, draft=None):
        if draft is None:
            draft = self.cache.draft()
            draft.write(0, bytes([vid % 251]) * self.SIZE)
        ref = self.cache.publish(draft, self.key)
        ref.release()
        self.version = vid
        self.published[vid] = True

    @rule(protocol=st.sampled_from([1, 2]))
    def set_protocol(self, protocol):
        if not self.readers and not self.writers and not self.parked:
            self.protocol = protocol

    def _grant_read(self, a):
        if self.protocol == 2:
            assert not any(self.dir.state(self.key, w) in ("E", "P") for w in self.writers), \
                "a read was granted while a write was granted or pending"
        ref = self.cache.get(self.key)
        assert ref is not None
        vid = ref.read(0, 1)[0]
        if self.protocol == 2:
            assert vid == self.version % 251, "a reader opened an old version"
        self.readers[a] = (ref, vid, 0)

    def _try(self, a, kind):
        if kind == "read":
            rc = self.dir.read(self.key, a, self.protocol)
            if rc == N.DIR_WAIT:
                self.parked[a] = kind
                return
            self._grant_read(a)
        else:
            rc = self.dir.write(self.key, a, self.protocol)
            if rc == N.DIR_WAIT:
                self.parked[a] = kind
                return
            self.writers[a] = (self.cache.draft(), self._new_id(), 0)
            if rc == N.DIR_PENDING:
                self.pending.add(a)
        self.parked.pop(a, None)

    def _retry_parked(self):
        for a, kind in list(self.parked.items()):
            self._try(a, kind)
        for a in list(self.pending):
            if self.dir.state(self.key, a) != "P":
                self.pending.discard(a)

    @rule(a=st.integers(0, AGENTS - 1), write=st.booleans())
    def open(self, a, write):
        if a in self.readers or a in self.writers or a in self.parked:
            return
        self._try(a, "write" if write else "read")
        self._retry_parked()

    @rule(a=st.integers(0, AGENTS - 1))
    def read_piece(self, a):
        if a not in self.readers:
            return
        ref, vid, n = self.readers[a]
        off = n * 4096
        data = ref.read(off, 4096)
        assert data == bytes([vid]) * len(data), "a torn or mixed read"
        self.readers[a] = (ref, vid, (n + 1) % 4)

    @rule(a=st.integers(0, AGENTS - 1))
    def write_piece(self, a):
        if a not in self.writers or a in self.pending:
            return
        d, vid, n = self.writers[a]
        off = n * 4096
        d.write(off, bytes([vid % 251]) * min(4096, self.SIZE - off))
        self.writers[a] = (d, vid, n + 1)

    @rule(a=st.integers(0, AGENTS - 1))
    def publish(self, a):
        if a not in self.writers or a in self.pending:
            return
        d, vid, n = self.writers[a]
        if n < 4:                               # a whole version only
            return
        self.dir.publish(self.key, a)
        self._publish(vid, d)
        self.writers[a] = (self.cache.draft(), self._new_id(), 0)
        self._retry_parked()

    @rule(a=st.integers(0, AGENTS - 1))
    def ack(self, a):
        self.dir.ack(self.key, a)
        self._retry_parked()

    @rule(a=st.integers(0, AGENTS - 1))
    def close(self, a):
        if a in self.readers:
            ref, _, _ = self.readers.pop(a)
            ref.release()
            self.dir.release(self.key, a, False)
        elif a in self.writers:
            d, _, _ = self.writers.pop(a)
            d.free()
            self.pending.discard(a)
            self.dir.release(self.key, a, True)
        self._retry_parked()

    @rule(a=st.integers(0, AGENTS - 1))
    def timeout(self, a):
        if a in self.pending and self.dir.cancel(self.key, a):
            d, _, _ = self.writers.pop(a)
            d.free()
            self.pending.discard(a)
            self._retry_parked()
        elif a in self.parked:
            del self.parked[a]

    @invariant()
    def consistent(self):
        self.dir.check()
        self.cache.check()
        self.dir.take_msgs()
        self.dir.take_events()

    def teardown(self):
        for ref, _, _ in self.readers.values():
            ref.release()
        for d, _, _ in self.writers.values():
            d.free()


TestAgents = Agents.TestCase
TestAgents.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)


# ---------------------------------------------------------------- real agents


def _reachable_by_others(path: Path) -> bool:
    """Whether every directory above path lets other uids through."""
    return all(os.stat(p).st_mode & 0o001 for p in Path(path).resolve().parents)


_AGENT_COPY: list[str] = []


def _agent_argv() -> list[str]:
    """How another uid runs agent.py: from the checkout when it can reach it,
    else a copy in a world-readable temporary folder run by the system
    Python (a checkout in a private folder, such as a fresh mktemp -d clone,
    is closed to other uids; agent.py needs only the standard library)."""
    if _reachable_by_others(AGENT_PY) and _reachable_by_others(Path(sys.executable)):
        return [sys.executable, "-u", str(AGENT_PY)]
    if not _AGENT_COPY:
        d = tempfile.mkdtemp(prefix="memosfs-agent-")
        os.chmod(d, 0o755)
        copy = os.path.join(d, "agent.py")
        shutil.copyfile(AGENT_PY, copy)
        os.chmod(copy, 0o644)
        _AGENT_COPY.append(copy)
    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    return [python, "-u", _AGENT_COPY[0]]


class Agent:
    """tests/scripts/agent.py as another uid: one command a line."""

    def __init__(self, uid: int, gid: int | None = None, groups: str = ""):
        gid = uid if gid is None else gid
        cmd = [SETPRIV, f"--reuid={uid}", f"--regid={gid}"]
        cmd += [f"--groups={groups}"] if groups else ["--clear-groups"]
        cmd += [*_agent_argv()]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, bufsize=1)

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def recv(self, timeout: float = 10.0):
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            return None                         # still blocked
        return self.proc.stdout.readline().strip()

    def __call__(self, line: str, timeout: float = 10.0):
        self.send(line)
        return self.recv(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def agents():
    if SETPRIV is None:
        pytest.skip("setpriv (util-linux) is not installed")
    if os.geteuid() != 0:
        pytest.skip("needs root to run agents under other uids")
    made: list[Agent] = []

    def make(uid: int, **kw) -> Agent:
        made.append(Agent(uid, **kw))
        return made[-1]

    yield make
    for a in made:
        a.stop()


def shared_slot(m, content: bytes = b"v1" * 5000) -> Path:
    """agent `shared`, session `s`, open to every uid; a slot with content."""
    d = m.p("shared", "s")
    d.mkdir(parents=True)
    os.chmod(m.p("shared"), 0o777)
    os.chmod(d, 0o777)
    slot = d / "prompt"
    slot.write_bytes(content)
    os.chmod(slot, 0o666)
    return slot


def knob(m, name: str, value: str) -> None:
    m.ctl(name).write_text(value + "\n")


def coherence_lines(m) -> list[str]:
    text = (m.path / ".memos" / "debug" / "trace").read_text()
    return [line for line in text.splitlines() if " CACHE_COHERENCE " in line]


def test_seed_workflow_in_the_trace(make_mount, agents):
    """A reads -> S; B writes -> A invalidated -> A acks -> B exclusive -> M."""
    m = make_mount(world=True, writeback_cache=0)   # (protocol 2 needs it)
    slot = shared_slot(m)
    knob(m, "coherence_protocol", "2")
    (m.path / ".memos" / "debug" / "trace").write_text("1\n")
    a, b = agents(20001), agents(20002)
    assert a(f"open {slot} r") == "ok"
    assert a(f"state {slot}") == "S"
    b.send(f"open {slot} w")
    assert b.recv(0.5) is None, "the writer must wait for A's acknowledgement"
    assert a(f"state {slot}") == "I"
    assert a("poll 5000") == "pri"
    assert a(f"ack {slot}") == "ok"
    assert b.recv() == "ok"
    assert b(f"state {slot}") == "E"
    assert b("write " + b"v2".hex()) == "ok"
    assert b("close") == "ok"
    assert slot.read_bytes() == b"v2"
    lines = coherence_lines(m)
    order = [
        r"agent=uid:20001 from=I to=S cause=read",
        r"agent=uid:20001 from=S to=I cause=invalidate",
        r"agent=uid:20002 from=I to=P cause=write",
        r"agent=uid:20001 from=I to=I cause=ack",
        r"agent=uid:20002 from=P to=E cause=grant",
        r"agent=uid:20002 from=E to=M cause=publish",
    ]
    pos = 0
    for want in order:
        while pos < len(lines) and not re.search(want, lines[pos]):
            pos += 1
        assert pos < len(lines), f"{want!r} missing or out of order in:\n" + "\n".join(lines)
        assert "key=shared/s/prompt" in lines[pos]
    s = m.stats()
    assert s["coherence_invalidations"] >= 1 and s["coherence_acks"] >= 1
    assert s["coherence_pending_waits"] >= 1


def test_strong_timeout_changes_nothing(make_mount, agents):
    m = make_mount(world=True, writeback_cache=0)   # (protocol 2 needs it)
    slot = shared_slot(m, b"old" * 100)
    knob(m, "coherence_protocol", "2")
    knob(m, "coherence_timeout_ms", "300")
    a, b = agents(20001), agents(20002)
    assert a(f"open {slot} r") == "ok"
    assert b(f"open {slot} w") == "err ETIMEDOUT"
    assert b(f"open {slot} wn") == "err EAGAIN"
    assert slot.read_bytes() == b"old" * 100          # O_TRUNC never happened
    assert a(f"state {slot}") == "S"                  # A keeps its valid copy
    assert a("read") == (b"old" * 100).hex()
    s = m.stats()
    assert s["coherence_timeouts"] >= 2
    assert "ETIMEDOUT" in m.logtext()


def test_strong_holder_killed_counts_as_ack(make_mount, agents):
    m = make_mount(world=True, writeback_cache=0)   # (protocol 2 needs it)
    slot = shared_slot(m)
    knob(m, "coherence_protocol", "2")
    a, b = agents(20001), agents(20002)
    assert a(f"open {slot} r") == "ok"
    b.send(f"open {slot} w")
    assert b.recv(0.5) is None
    a.kill()                                          # never acknowledges
    assert b.recv() == "ok"
    assert b("write " + b"after".hex()) == "ok" and b("close") == "ok"
    assert slot.read_bytes() == b"after"


def test_strong_reader_waits_for_the_writer(make_mount, agents):
    m = make_mount(world=True, writeback_cache=0)   # (protocol 2 needs it)
    slot = shared_slot(m, b"old" * 1000)
    knob(m, "coherence_protocol", "2")
    a, b = agents(20001), agents(20002)
    assert b(f"open {slot} w") == "ok"                # nobody holds it: granted
    assert b("write " + (b"new" * 1000).hex()) == "ok"
    a.send(f"open {slot} r")
    assert a.recv(0.5) is None, "no reader may open the old version once a write is granted"
    assert b("close") == "ok"
    assert a.recv() == "ok"
    assert a("read") == (b"new" * 1000).hex()


def test_batched_writer_goes_on_and_poll_tells_the_holder(make_mount, agents):
    m = make_mount(world=True)
    slot = shared_slot(m, b"old" * 1000)
    assert m.ctl("coherence_protocol").read_text() == "1\n"      # the default
    a, b = agents(20001), agents(20002)
    assert a(f"open {slot} r") == "ok"
    a.send("poll 10000")
    assert a.recv(0.3) is None                        # nothing to report yet
    assert b(f"open {slot} w", timeout=2) == "ok"     # no waiting under protocol 1
    assert a.recv() == "pri"
    assert b("write " + (b"new" * 1000).hex()) == "ok" and b("close") == "ok"
    assert a("read") == (b"old" * 1000).hex()         # the old handle keeps its snapshot
    assert a(f"state {slot}") == "I"
    assert a(f"ack {slot}") == "ok"
    assert a("poll 0") == "none"                      # acknowledged
    a("close")
    assert a(f"open {slot} r") == "ok" and a("read") == (b"new" * 1000).hex()
    assert a(f"state {slot}") == "S"
    s = m.stats()
    assert s["coherence_invalidations"] >= 1 and s["coherence_batches"] >= 1


def test_protocol_0_tracks_nothing(make_mount, agents):
    m = make_mount(world=True)
    slot = shared_slot(m)
    knob(m, "coherence_protocol", "0")
    a, b = agents(20001), agents(20002)
    assert a(f"open {slot} r") == "ok"
    assert b(f"open {slot} w", timeout=2) == "ok"
    assert b("write " + b"x".hex()) == "ok" and b("close") == "ok"
    assert a("poll 200") == "none"
    assert a(f"state {slot}") == "off"
    assert m.stats()["coherence_invalidations"] == 0


def test_agent_identity_pid(make_mount, agents):
    """By default the processes of one uid are one agent; with pid, each is."""
    m = make_mount(world=True)
    slot = shared_slot(m)
    a1, a2 = agents(20001), agents(20001)
    assert a1(f"open {slot} r") == "ok"
    assert a2(f"open {slot} w") == "ok" and a2("close") == "ok"
    assert a1("poll 300") == "none"                   # same agent: no invalidation
    a1("close")
    knob(m, "agent_identity", "pid")
    assert a1(f"open {slot} r") == "ok"
    assert a2(f"open {slot} w") == "ok"
    assert a1("poll 5000") == "pri"


def test_fsync_publishes_and_state_is_per_caller(make_mount, agents):
    m = make_mount(world=True)
    slot = shared_slot(m)
    a, b = agents(20001), agents(20002)
    assert b(f"open {slot} w") == "ok"
    assert b(f"state {slot}") == "E"
    assert b("write " + b"abc".hex()) == "ok" and b("fsync") == "ok"
    assert b(f"state {slot}") == "M"
    assert a(f"state {slot}") == "I"                  # A holds nothing
    assert os.getxattr(slot, "user.memos.state") == b"I"   # nor does root
    assert a(f"open {slot} r") == "ok" and a("read") == b"abc".hex()
    assert a(f"state {slot}") == "S"
    assert b(f"state {slot}") == "S"                  # M shared its version: downgraded


# ---------------------------------------------------------------- isolation


def run_as(uid: int, args: list[str], groups: str = "", gid: int | None = None):
    gid = uid if gid is None else gid
    cmd = [SETPRIV, f"--reuid={uid}", f"--regid={gid}"]
    cmd += [f"--groups={groups}"] if groups else ["--clear-groups"]
    return subprocess.run(cmd + args, capture_output=True, text=True, timeout=30)


def test_isolation_between_uids(make_mount, agents):
    m = make_mount(world=True)
    alice = m.p("alice")
    r = run_as(20001, ["sh", "-c", f"umask 077 && mkdir -p {alice}/s && "
                                   f"echo secret > {alice}/s/kv"])
    assert r.returncode == 0, r.stderr
    st = os.stat(alice)
    assert st.st_uid == 20001 and (st.st_mode & 0o777) == 0o700
    assert (os.stat(alice / "s" / "kv").st_mode & 0o777) == 0o600
    for args in (["ls", str(alice)], ["cat", f"{alice}/s/kv"],
                 ["sh", "-c", f"echo x > {alice}/s/kv2"]):
        r = run_as(20002, args)
        assert r.returncode != 0 and "Permission denied" in r.stderr, (args, r)
    # the owner still reads it
    r = run_as(20001, ["cat", f"{alice}/s/kv"])
    assert r.returncode == 0 and r.stdout == "secret\n"


def test_sharing_through_a_group(make_mount, agents):
    # the mount shares with groups (umask=027); its private default (077)
    # would take the group bits away: tests/test_umask.py
    m = make_mount(world=True, umask="027")
    team = m.p("team")
    r = run_as(20001, ["sh", "-c", f"umask 027 && mkdir -p {team}/s && chgrp -R 30000 {team}"
                                   f" && echo shared > {team}/s/kv && chgrp 30000 {team}/s/kv"],
               groups="30000")
    assert r.returncode == 0, r.stderr
    assert os.stat(team).st_gid == 30000
    # a member of the group reads, but may not write (no group write bit)
    r = run_as(20002, ["cat", f"{team}/s/kv"], groups="30000")
    assert r.returncode == 0 and r.stdout == "shared\n", r.stderr
    r = run_as(20002, ["sh", "-c", f"echo x > {team}/s/new"], groups="30000")
    assert r.returncode != 0 and "Permission denied" in r.stderr
    # someone outside the group cannot even look
    r = run_as(20003, ["ls", str(team)])
    assert r.returncode != 0 and "Permission denied" in r.stderr
    # granting group write makes the group a set of writers
    r = run_as(20001, ["chmod", "-R", "g+w", str(team)], groups="30000")
    assert r.returncode == 0, r.stderr
    r = run_as(20002, ["sh", "-c", f"echo y > {team}/s/new"], groups="30000")
    assert r.returncode == 0, r.stderr
    assert (team / "s" / "new").read_text() == "y\n"


# ---------------------------------------------------------------- the client cache


@pytest.mark.parametrize("protocol", ["1", "2"])
def test_shared_slots_follow_rewrites(make_mount, agents, protocol):
    """memosfs.shared.SharedSlots keeps its copy open (re-reads reach no
    daemon read handler once cached), drops it when invalidated, and under
    protocol 2 acknowledges from its watcher so a writer is not kept waiting."""
    from memosfs.client.shared import SharedSlots
    m = make_mount(world=True, writeback_cache=int(protocol != "2"))
    slot = shared_slot(m, b"one" * 50000)
    knob(m, "coherence_protocol", protocol)
    knob(m, "coherence_timeout_ms", "3000")
    b = agents(20002)
    with SharedSlots() as slots:
        assert slots.read(str(slot)) == b"one" * 50000
        assert slots.read(str(slot)) == b"one" * 50000
        assert slots.opens == 1                       # the second read used the open copy
        assert os.getxattr(slot, "user.memos.state") == b"S"
        t0 = time.monotonic()
        assert b(f"open {slot} w") == "ok"            # protocol 2: our watcher acks
        assert time.monotonic() - t0 < 2.5
        assert b("write " + (b"two" * 1000).hex()) == "ok" and b("close") == "ok"
        deadline = time.monotonic() + 5
        while slots.read(str(slot)) != b"two" * 1000 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert slots.read(str(slot)) == b"two" * 1000
        assert slots.invalidations >= 1 and slots.opens >= 2
    assert m.stats()["coherence_timeouts"] == 0


def test_regression_a_killed_strong_writer_dies_at_once_and_changes_nothing(make_mount, agents):
    """A writer waiting in open() for acknowledgements is killed: FUSE's
    INTERRUPT ends its wait (EINTR), it dies at once, and its O_TRUNC open
    never happens (the shared prompt slot keeps its bytes)."""
    m = make_mount(world=True, writeback_cache=0)   # (protocol 2 needs it)
    slot = shared_slot(m, b"prompt" * 100)
    knob(m, "coherence_protocol", "2")
    knob(m, "coherence_timeout_ms", "30000")
    a, b = agents(20001), agents(20002)
    assert a(f"open {slot} r") == "ok"
    b.send(f"open {slot} w")
    assert b.recv(0.5) is None                        # waiting for a's acknowledgement
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait(timeout=5)                            # not stuck in state D
    assert slot.read_bytes() == b"prompt" * 100
    assert a(f"state {slot}") == "S"
    assert a("read") == (b"prompt" * 100).hex()
    assert m.stats()["coherence_interrupts"] >= 1
    assert "EINTR" in m.logtext()
