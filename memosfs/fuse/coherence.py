"""Coherence between agents that share slots: the filesystem side of the
directory in native/directory.c.

An agent is the uid of the process that opens a slot (or, with
`agent_identity = pid`, the process itself).  Each open handle of a slot
makes its agent a holder:

    read handle   ->  S                      (dir.read)
    write handle  ->  E, or P then E         (dir.write: the others go to I)
    publish       ->  M                      (dir.publish)
    close         ->  the last one leaves    (dir.release; counts as an ack)

Invalidations reach the holders' handles: `poll()` on a handle reports
POLLPRI from then on (until the agent acknowledges); under protocol 2 the
kernel's cached pages of the inode they hold are dropped too.  An agent acknowledges by closing
its handles, by opening the slot again, with
`setfattr -n user.memos.ack -v 1 SLOT` (needs write permission on SLOT: the
kernel's rule for user.* attributes), or with `ioctl(fd, MEMOS_IOC_ACK)` on
any handle it holds, read-only ones included (memosfs.shared.MEMOS_IOC_ACK,
`_IO('M', 1)`).  An acknowledgement from an agent, or on a handle, with
nothing to acknowledge (it holds nothing, or was not invalidated, or was
revoked) fails with EINVAL.

Lease break (protocol 2, as Linux breaks a lease): a holder that has not
acknowledged `lease_break_ms` after a writer entered P is revoked: it is
taken as acknowledged (it stays in I) and the writer goes on.  Its read
handles are void from then on: every later read(2) on them fails with
ESTALE (and an mmap of one gets SIGBUS), the inode's cached pages are
dropped before the writer is let in, and `poll()` reports POLLERR|POLLPRI.
ESTALE, not EIO: nothing failed, the handle's version is no longer the
slot's, and the remedy is the one ESTALE always means, to open the name
again.  Root revokes every reader of a slot at once by writing its key to
`.memos/cache/revoke`.  Revocations are counted (`coherence_revoked`),
logged, and traced (`cause=revoke`).  Holders with a write handle are never
revoked.

`coherence_protocol`:

0  nothing is tracked; the last publish wins.
1  a writer goes on at once; invalidations are delivered in batches, at most
   every `coherence_batch_ms`; old handles keep their snapshot.
2  a writer's open waits (P) until every holder has acknowledged; a reader's
   open waits while a writer is pending or holds E.  A wait longer than
   `coherence_timeout_ms` fails the open with ETIMEDOUT and changes nothing;
   with O_NONBLOCK the open fails at once with EAGAIN.

Every transition goes to the trace as a CACHE_COHERENCE line:
`CACHE_COHERENCE key=a/s/x agent=uid:1000 from=S to=I cause=invalidate`.

Owns: `Coherence` (the directory's holders, waits, batches, revokes),
`Hold` (a handle's place in it) and `CoherenceStats` (its figures).  May
call: memosfs._native (the directory), the trace, and the two page-drop
callbacks the filesystem gives it (notify.py); nothing else of the
filesystem.
"""

from __future__ import annotations

import errno
import logging
import select
from dataclasses import dataclass
from typing import Awaitable, Callable, Optional

import pyfuse3
import trio

from memosfs import _native
from memosfs.stats import Record, counter, gauge
from memosfs.fuse.why import note_refusal

log = logging.getLogger("memosfs.fuse.coherence")


@dataclass(frozen=True)
class CoherenceStats(Record):
    """Coherence (knob coherence_protocol).

    The directory's figures (native/directory.c) and the delivery's."""
    coherence_slots: int = gauge("slots with at least one holder now")
    coherence_holders: int = gauge("(slot, agent) holders now")
    coherence_reads: int = counter("read grants")
    coherence_writes: int = counter("write grants")
    coherence_invalidations: int = counter("holders invalidated by a writer")
    coherence_acks: int = counter("invalidations acknowledged (explicitly or by release)")
    coherence_pending_waits: int = counter("writers that waited in P for acknowledgements")
    coherence_read_waits: int = counter("protocol 2 reads told to wait for a writer")
    coherence_timeouts: int = counter("pending writers cancelled")
    coherence_downgrades: int = counter("M holders moved to S by a reader")
    coherence_publishes: int = counter("publishes the directory saw")
    coherence_msgs_queued: int = counter("invalidation messages queued for delivery")
    coherence_events_dropped: int = counter("directory events lost to a full event ring")
    coherence_revoked: int = counter("holders whose copy was revoked (lease break, root)")
    coherence_protocol: int = gauge("setting: 0 last publish wins, 1 invalidate, 2 wait for acks")
    coherence_delivered: int = counter("invalidation messages delivered to agents")
    coherence_batches: int = counter("delivery batches run")
    coherence_wait_ms: int = counter("milliseconds requests waited on coherence, in all")
    coherence_interrupts: int = counter("coherence waits ended by a signal")


GRANTED = _native.DIR_GRANTED
WAIT = _native.DIR_WAIT
PENDING = _native.DIR_PENDING

PID_AGENT = 1 << 32          # pid agents are told apart from uids


def agent_name(agent: int) -> str:
    return f"pid:{agent - PID_AGENT}" if agent >= PID_AGENT else f"uid:{agent}"


class Hold:
    """A handle's place in the directory."""

    __slots__ = ("key", "agent", "writer", "invalidated", "poll_handle", "handle",
                 "revoked")

    def __init__(self, key: bytes, agent: int, writer: bool, handle: object) -> None:
        self.key = key
        self.agent = agent
        self.writer = writer
        self.invalidated = False        # told of a newer version, not yet acked
        self.poll_handle: Optional[pyfuse3.PollHandle] = None
        self.handle = handle            # the fs Handle (its node, for the page cache)
        self.revoked = False            # a lease break or root voided its copy


class _Deadline:
    """A wait's end, fixed by the first wait (no clock read when nothing waits)."""

    __slots__ = ("ms", "start", "end", "pid", "interrupted")

    def __init__(self, ms: int, pid: int = 0) -> None:
        self.ms = ms
        self.start: Optional[float] = None
        self.end = 0.0
        self.pid = pid                  # the caller's thread (for interrupts)
        self.interrupted = False

    def at(self) -> float:
        if self.start is None:
            self.start = trio.current_time()
            self.end = self.start + self.ms / 1000
        return self.end

    def waited_ns(self) -> int:
        if self.start is None:
            return 0
        return int((trio.current_time() - self.start) * 1e9)


class Coherence:
    """The directory, the knobs that drive it, and delivery to handles.  All
    methods run on the trio thread."""

    def __init__(self, knobs: dict, trace, invalidate_pages: Callable[[object], None]
                 ) -> None:
        self.dir = _native.Directory()
        self.knobs = knobs
        self.trace = trace
        self._invalidate_pages = invalidate_pages   # fs: drop a node's cached pages
        # fs: drop a node's cached pages and return once they are gone (None:
        # as _invalidate_pages, without waiting)
        self.drop_pages: Optional[Callable[[object], Awaitable[None]]] = None
        self.holds: dict[tuple[bytes, int], set[Hold]] = {}
        self._changed: dict[bytes, trio.Event] = {}   # key -> its waiters' event
        self._delivered = 0
        self._batches = 0
        self._wait_ns = 0
        self._batch_due = False
        self._batch_wake: Optional[trio.Event] = None   # set when a batch is due
        self._waiting: dict[int, set[trio.CancelScope]] = {}   # caller's thread -> its waits
        self._interrupted: set[int] = set()     # threads whose wait the kernel interrupted
        self._interrupts = 0

    # ---- knobs ----

    @property
    def protocol(self) -> int:
        return int(self.knobs["coherence_protocol"])

    def agent_of(self, ctx) -> int:
        if self.knobs["agent_identity"] == "pid":
            return PID_AGENT + int(ctx.pid)
        return int(ctx.uid)

    # ---- acquire / release ----

    async def acquire(self, key: bytes, agent: int, writer: bool, nonblock: bool,
                      handle: object = None, pid: int = 0, defer: bool = False
                      ) -> Optional[Hold]:
        """Register a handle; under protocol 2 wait for the right to.  Returns
        None when the protocol is 0 (nothing tracked).  A wait that ends
        without a grant (timeout, O_NONBLOCK, the kernel interrupting thread
        `pid`: EINTR) changes nothing.

        defer (a writer): never wait here.  The writer asks once: granted, it
        holds E; pending, it stays in P (the holders are told now); told to
        wait for another writer, it holds nothing yet.  Either way its first
        write or its publish waits instead (`upgrade`: may_write is false
        until it holds E).  For an O_TRUNC open under the kernel's writeback
        cache, which holds the inode's lock for the whole open: the holders
        it would wait for may need that lock to acknowledge (a setxattr, a
        close)."""
        protocol = self.protocol
        if protocol == 0:
            return None
        deadline = _Deadline(int(self.knobs["coherence_timeout_ms"]), pid)
        if writer and defer and protocol >= 2:
            rc = self.dir.write(key, agent, protocol)
            self._after_change()
            hold = Hold(key, agent, True, handle)
            self.holds.setdefault((key, agent), set()).add(hold)
            if rc == PENDING:
                self.deliver()
            return hold
        if writer:
            rc = await self._request(lambda: self.dir.write(key, agent, protocol),
                                     key, agent, nonblock, deadline)
        else:
            rc = await self._request(lambda: self.dir.read(key, agent, protocol),
                                     key, agent, nonblock, deadline)
        hold = Hold(key, agent, writer, handle)
        self.holds.setdefault((key, agent), set()).add(hold)
        if rc == PENDING:
            if not await self._granted(key, agent, nonblock, deadline, keep_handle=False):
                self._drop(hold)
                self._wait_ns += deadline.waited_ns()
                raise self._not_acknowledged(key, agent, nonblock, deadline)
            self._wait_ns += deadline.waited_ns()
        elif writer and protocol == 1:
            self._schedule_delivery()
        return hold

    def may_write(self, hold: Hold) -> bool:
        """Whether a write on hold's handle needs no upgrade (its agent holds
        E or M): the request can be answered without waiting."""
        return self.dir.state(hold.key, hold.agent) in ("E", "M")

    async def upgrade(self, hold: Hold, nonblock: bool) -> None:
        """A write on a handle whose agent lost E/M (a reader downgraded it, or
        a later writer invalidated it): acquire the write again."""
        key, agent = hold.key, hold.agent
        if self.dir.state(key, agent) in ("E", "M"):
            return
        protocol = max(self.protocol, 1)
        deadline = _Deadline(int(self.knobs["coherence_timeout_ms"]))
        rc = await self._request(lambda: self.dir.write(key, agent, protocol, True),
                                 key, agent, nonblock, deadline)
        if rc != PENDING:
            self._schedule_delivery()
        elif not await self._granted(key, agent, nonblock, deadline, keep_handle=True):
            raise self._not_acknowledged(key, agent, nonblock, deadline)

    async def _request(self, call: Callable[[], int], key: bytes, agent: int,
                       nonblock: bool, deadline: "_Deadline") -> int:
        """Ask the directory until it does not say WAIT (protocol 2: a writer
        holds the slot); EAGAIN with O_NONBLOCK, ETIMEDOUT at the deadline.
        A writer that keeps the slot exclusively past lease_break_ms (a
        stopped process) loses its exclusive hold (`_break_exclusive`), so no
        stopped writer keeps readers or other writers waiting until their
        opens time out."""
        lease = self._lease(deadline)
        while True:
            rc = call()
            self._after_change()
            if rc != WAIT:
                return rc
            if nonblock:
                raise self._refuse(errno.EAGAIN, key, agent,
                                   "a writer holds the slot (O_NONBLOCK)")
            if lease is not None:
                if await self._wait(key, lease):
                    continue
                if lease.interrupted:
                    deadline.interrupted = True
                elif trio.current_time() < deadline.at():
                    self._break_exclusive(key, agent)
                    lease = self._lease(deadline)
                    continue
            if not await self._wait(key, deadline):
                self._wait_ns += deadline.waited_ns()
                if deadline.interrupted:
                    raise self._refuse(errno.EINTR, key, agent,
                                       "the caller was interrupted while a writer held the slot")
                raise self._refuse(errno.ETIMEDOUT, key, agent,
                                   "a writer held the slot past coherence_timeout_ms")

    async def _granted(self, key: bytes, agent: int, nonblock: bool,
                       deadline: "_Deadline", keep_handle: bool) -> bool:
        """A writer in P: tell the holders now, then wait until every one has
        acknowledged (True), or give up at the deadline — at once with
        O_NONBLOCK — restoring the holders (False)."""
        self.deliver()
        lease = self._lease(deadline)
        while self.dir.state(key, agent) == "P":
            if not nonblock and lease is not None:
                if await self._wait(key, lease):
                    continue
                if lease.interrupted:
                    deadline.interrupted = True
                elif trio.current_time() < deadline.at():
                    # the holders had lease_break_ms: those that did not
                    # acknowledge lose their copy, and the writer goes on
                    await self._break_leases(key, agent)
                    lease = self._lease(deadline)
                    continue
            elif not nonblock and await self._wait(key, deadline):
                continue
            if self.dir.cancel(key, agent, keep_handle):
                self._after_change()
                return False
            break                                 # granted at the last moment
        return True

    def _not_acknowledged(self, key: bytes, agent: int, nonblock: bool,
                          deadline: Optional["_Deadline"] = None) -> pyfuse3.FUSEError:
        if deadline is not None and deadline.interrupted:
            return self._refuse(errno.EINTR, key, agent,
                                "the caller was interrupted before holders acknowledged")
        if nonblock:
            return self._refuse(errno.EAGAIN, key, agent,
                                "holders have not acknowledged (O_NONBLOCK)")
        return self._refuse(errno.ETIMEDOUT, key, agent,
                            "holders did not acknowledge within coherence_timeout_ms: "
                            + ", ".join(f"{agent_name(a)}={s}"
                                        for a, s in self.dir.holders(key) if a != agent))

    def release(self, hold: Optional[Hold]) -> None:
        if hold is None:
            return
        self._drop(hold)
        self.dir.release(hold.key, hold.agent, hold.writer)
        self._after_change()

    def published(self, hold: Optional[Hold]) -> None:
        if hold is None:
            return
        self.dir.publish(hold.key, hold.agent)
        self._after_change()
        self._schedule_delivery()

    def ack(self, key: bytes, agent: int) -> bool:
        """The agent acknowledges its invalidation of key; False (nothing
        changed) when it has none to acknowledge: it holds nothing, was not
        invalidated, already acknowledged, or was revoked."""
        if not self.dir.unacked(key, agent):
            return False
        self.dir.ack(key, agent)
        for hold in self.holds.get((key, agent), ()):
            hold.invalidated = False
        self._after_change()
        return True

    # ---- lease break and revocation ----

    def _lease(self, deadline: "_Deadline") -> Optional["_Deadline"]:
        """The wait of a pending writer until its holders' lease breaks (the
        same thread, so an interrupt ends it), or None if the open would time
        out first."""
        ms = int(self.knobs["lease_break_ms"])
        if self.protocol < 2 or ms >= deadline.ms:
            return None
        lease = _Deadline(ms, deadline.pid)
        if lease.at() > deadline.at():
            lease.end = deadline.end
        return lease

    async def _break_leases(self, key: bytes, writer: int) -> None:
        """The holders of key that did not acknowledge in time are revoked;
        their pages are gone before this returns (bounded)."""
        nodes = self.revoke(key, valid=False,
                            why=f"no acknowledgement within lease_break_ms="
                                f"{int(self.knobs['lease_break_ms'])} while "
                                f"{agent_name(writer)} waited to write",
                            drop=self.drop_pages is None)
        if nodes and self.drop_pages is not None:
            with trio.move_on_after(max(int(self.knobs["lease_break_ms"]), 1000) / 1000):
                for node in nodes:
                    await self.drop_pages(node)

    def _break_exclusive(self, key: bytes, waiter: int) -> None:
        """The writers that kept key exclusively past lease_break_ms while
        `waiter` waited lose that hold (E -> S): their handles stay open, and
        their next write or publish acquires E again, invalidating the
        others first (upgrade)."""
        for agent in self.dir.break_exclusive(key, waiter):
            log.warning("%s kept %s exclusively past lease_break_ms=%d while %s waited: "
                        "its exclusive hold is broken (it acquires it again at its next "
                        "write or publish)", agent_name(agent),
                        key.decode("utf-8", "replace"), int(self.knobs["lease_break_ms"]),
                        agent_name(waiter))
        self._after_change()

    def revoke(self, key: bytes, valid: bool, why: str, drop: bool = True) -> list:
        """Revoke key's holders (see the module docstring): the directory
        voids their copies, their read handles fail from now on, their
        pollers are told.  `valid`: also holders whose copy is still valid
        (root's explicit revoke), not only those that did not acknowledge.
        Returns the nodes whose pages must go; with `drop` they are being
        dropped already (without waiting)."""
        agents = self.dir.revoke(key, valid)
        nodes = {}
        for agent in agents:
            n = 0
            for hold in self.holds.get((key, agent), ()):
                hold.invalidated = False
                if hold.writer:
                    continue            # a write handle acquires again on its next write
                hold.revoked = True
                n += 1
                self._tell(hold, nodes)
            log.warning("revoked %s's hold on %s (%d read handle(s) now fail with ESTALE): %s",
                        agent_name(agent), key.decode("utf-8", "replace"), n, why)
        self._after_change()
        if drop:
            for node in nodes.values():
                self._invalidate_pages(node)
        return list(nodes.values())

    def state(self, key: bytes, agent: int) -> str:
        if self.protocol == 0 and not self.holds.get((key, agent)):
            return "off"
        return self.dir.state(key, agent)

    def poll(self, hold: Optional[Hold], ph: Optional[pyfuse3.PollHandle]) -> int:
        """POLLPRI once the handle's agent was invalidated (until it acks)."""
        mask = select.POLLIN | select.POLLRDNORM
        if hold is None:
            return mask
        if hold.writer:
            mask |= select.POLLOUT | select.POLLWRNORM
        if hold.revoked:
            return mask | select.POLLPRI | select.POLLERR
        if hold.invalidated:
            return mask | select.POLLPRI
        if ph is not None:
            hold.poll_handle = ph
        return mask

    # ---- delivery ----

    def _schedule_delivery(self) -> None:
        if self.dir.msgs_queued() == 0:
            return
        if int(self.knobs["coherence_batch_ms"]) == 0 or self.protocol >= 2:
            self.deliver()
        else:
            self._batch_due = True
            if self._batch_wake is not None:
                self._batch_wake.set()

    def deliver(self) -> int:
        """Hand every queued invalidation to its agent's handles."""
        msgs = self.dir.take_msgs()
        if not msgs:
            return 0
        self._batches += 1
        nodes = {}
        for key, agent, writer in msgs:
            for hold in self.holds.get((key, agent), ()):
                hold.invalidated = True
                self._tell(hold, nodes)
            self._delivered += 1
        if self.protocol >= 2:
            # Strong: every holder must drop its copy, and no reader shares the
            # inode meanwhile (readers wait): drop the kernel's pages at once.
            # Under protocol 1 the pages stay valid for the version the holders
            # keep, which is still the current one until the writer publishes
            # (a publish moves the name to fresh pages by itself).
            for node in nodes.values():
                self._invalidate_pages(node)
        return len(msgs)

    async def batch_loop(self) -> None:
        """Protocol 1's batches: deliver what queued up, at most every
        coherence_batch_ms.  Asleep while nothing is queued (the request
        thread is not woken 500 times a second for nothing)."""
        while True:
            if not self._batch_due:
                self._batch_wake = trio.Event()
                await self._batch_wake.wait()
                self._batch_wake = None
            await trio.sleep(max(int(self.knobs["coherence_batch_ms"]), 1) / 1000)
            if self._batch_due:
                self._batch_due = False
                self.deliver()

    # ---- internals ----

    @staticmethod
    def _tell(hold: Hold, nodes: dict) -> None:
        """Wake the hold's poller (POLLPRI) and note its node, whose cached
        pages the caller may drop."""
        if hold.poll_handle is not None:
            ph, hold.poll_handle = hold.poll_handle, None
            try:
                ph.notify()
            except Exception as e:    # the poller may be gone
                log.debug("poll notify for %s failed: %s", agent_name(hold.agent), e)
        node = getattr(hold.handle, "node", None)
        if node is not None:
            nodes[id(node)] = node

    def _drop(self, hold: Hold) -> None:
        group = self.holds.get((hold.key, hold.agent))
        if group is not None:
            group.discard(hold)
            if not group:
                del self.holds[(hold.key, hold.agent)]

    async def _wait(self, key: bytes, deadline: "_Deadline") -> bool:
        """Until key's holders change (True) or the deadline (False)."""
        at = deadline.at()
        if deadline.interrupted or trio.current_time() >= at:
            return False
        ev = self._changed.get(key)
        if ev is None:
            ev = self._changed[key] = trio.Event()
        scope = trio.move_on_at(at)
        scopes = self._waiting.setdefault(deadline.pid, set()) if deadline.pid else None
        if scopes is not None:
            scopes.add(scope)
        woke = False
        try:
            with scope:
                await ev.wait()
                woke = True
        finally:
            if scopes is not None:
                scopes.discard(scope)
                if not scopes:
                    self._waiting.pop(deadline.pid, None)
            # the last waiter of an event nobody set takes it away (the key may
            # never change again: removed), so _changed holds only awaited keys
            if not ev.is_set() and ev.statistics().tasks_waiting == 0 \
                    and self._changed.get(key) is ev:
                del self._changed[key]
        if woke:
            # an interrupt that came as the event fired: the wait is over anyway
            # (the thread id may be reused: nothing of it may stay behind)
            self._interrupted.discard(deadline.pid)
            return True
        if deadline.pid in self._interrupted:
            self._interrupted.discard(deadline.pid)
            deadline.interrupted = True
        return False

    def interrupt(self, pid: int) -> None:
        """The kernel interrupted a request of thread pid (a signal reached
        it): its waits end, and fail with EINTR."""
        scopes = self._waiting.get(pid)
        if not scopes:
            return
        self._interrupts += 1
        self._interrupted.add(pid)
        for scope in list(scopes):
            scope.cancel()

    def _after_change(self) -> None:
        """Trace the directory's transitions and wake whoever waits on a key
        that changed (only those: a wait that changes nothing wakes nobody)."""
        events = self.dir.take_events()
        if len(events) >= 4096:                 # the ring may have dropped some
            for ev in self._changed.values():
                ev.set()
            self._changed.clear()
        for key, agent, frm, to, cause in events:
            if cause == "ack":
                for hold in self.holds.get((key, agent), ()):
                    hold.invalidated = False
            if self.trace.enabled:
                self.trace.emit("CACHE_COHERENCE", **{
                    "key": key.decode("utf-8", "replace"), "agent": agent_name(agent),
                    "from": frm, "to": to, "cause": cause})
            ev = self._changed.pop(key, None)
            if ev is not None:
                ev.set()

    def _refuse(self, code: int, key: bytes, agent: int, why: str) -> pyfuse3.FUSEError:
        log.info("open %s by %s: %s (%s)", key.decode("utf-8", "replace"),
                 agent_name(agent), why, errno.errorcode.get(code, code))
        self.trace.emit("CACHE_COHERENCE", key=key.decode("utf-8", "replace"),
                        agent=agent_name(agent), refused=errno.errorcode.get(code, code))
        # the caller's .memos/why: without the other holders' names
        note_refusal(code, f"open {key.decode('utf-8', 'replace')}: {why.split(': ')[0]}")
        return pyfuse3.FUSEError(code)

    def statistics(self) -> CoherenceStats:
        return CoherenceStats(
            coherence_protocol=self.protocol, **self.dir.stats(),
            coherence_delivered=self._delivered, coherence_batches=self._batches,
            coherence_wait_ms=self._wait_ns // 1_000_000,
            coherence_interrupts=self._interrupts)
