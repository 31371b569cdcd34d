"""The control plane `.memos/`: pseudo-files over the knobs, the statistics,
the trace and a few commands.

Pseudo-files (all owned by root, served with direct_io, st_size 0, read as a
snapshot taken at open).  Their modes say what they do and the daemon itself
enforces them, with or without `default_permissions`: a uid other than 0 gets
the "other" bits, root the owner bits (so root too gets EACCES writing a
read-only file).  The command files (flush, reset_context, revoke) are
0600: root writes them, and reads an empty file, so that `tar` or `cp -a`
of the whole mount reads every file there.  chmod, chown and utimes of any
control file or directory are EPERM, for root too.

=====================  ====  =====================================================
file                   mode  meaning
=====================  ====  =====================================================
cache/stats            0444  `name value` lines, one per counter (no names: only
                             counts, sizes and the eviction policy)
cache/stats.json       0444  the same counters as one JSON object
cache/<knob>           0644  `value\\n`; root writing a valid value sets it at once,
                             anything else is EINVAL and changes nothing
cache/flush            0600  root writes 1: persist every dirty slot, then reclaim
                             memory
cache/revoke           0600  root writes `agent/session/slot`: revoke every reader of it
                             (coherence protocol 2; their reads fail with ESTALE)
cache/reset_context    0600  root writes `agent/session`: drop that session's slots
cache/unsaved          0444  the dirty slots the SSD tier could not take (what an
                             unmount now would lose: unmount.py): `name value`
                             lines, then `slot BYTES PATH` (root only)
cache/evict            0622  root or the owner writes `agent[/session[/.../slot]]`:
                             those slots leave memory for the SSD tier (written back
                             first if dirty), never deleted (steer.py)
cache/drop             0622  the same, for slots the SSD tier already holds (clean)
debug/trace            0600  root only.  write 1 (on, clears the buffer) or 0 (off);
                             read: one event a line, `<ns> <EVENT> field=value ...`
debug/requests         0444  `kind count` lines: every request the kernel sent since
                             the mount, by kind (lookup, write, ...), most first
metrics                0444  Prometheus text exposition of the stats
why                    0444  the reader's own last refused request: when, the
                             errno and the reason the log gives (why.py)
=====================  ====  =====================================================

Knobs (memosfs/knobs.py has the table of names, types, ranges and
defaults).  One function applies a knob, `ControlTree.apply`: at mount for
every knob (its `-o` value or its default, in table order) and at run time
for each write into its file.  It takes the typed value (text is parsed and
checked by the knob first), hands it to the knob's entry in `KNOB_APPLY`
(every knob has one: the component it configures, or `_read_at_use` for a
knob its reader looks up in `ops.knobs` when it needs it) and records it in
`ops.knobs`.  A KnobError leaves everything unchanged: at mount the daemon
exits naming the option; at run time the write is EINVAL (files.py
`_write_pseudo` logs the reason, and `.memos/why` shows it to the writer).

Owns: `ControlTree`, built like the federated tree (`FedTree`, fedtree.py):
its nodes live in the filesystem's inode table under fixed inode numbers
(2 up to FIRST_DYNAMIC_INO), added through `ops.add_fixed`; the knob
writes; the flush, reset_context, revoke and trace writers; the evict and
drop files (their commands are steer.py's `Steering`); the list of
statistics records every stats file prints (`statistics()`, STATS_RECORDS)
and the filesystem's own record, FilesystemStats.

May call: the store (set_capacity, set_evict_batch, cache, ssd, flush,
statistics), the prefetcher, coherence (revoke, statistics), tenants
(statistics), the trace, and of the filesystem (`ops`) only: add_fixed,
find_session, reset_session, slot_at, request_stats, tree_counts, knobs.
"""

from __future__ import annotations

import errno
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional

from memosfs.knobs import KNOB_BY_NAME, KNOBS, KnobError
from memosfs.stats import (Record, as_dict, counter, format_metrics, format_stats, gauge,
                           stats_json)
from memosfs.store.prefetch import PrefetchStats
from memosfs.store.remote.tier import RemoteStats
from memosfs.store.ssd import SSDStats
from memosfs.store.statistics import CacheStats, StoreStats
from memosfs.fuse.core import FIRST_DYNAMIC_INO, physical_memory
from memosfs.fuse.coherence import CoherenceStats
from memosfs.fuse.nodes import CONTROL_DIR, CTL, Dir, Pseudo
from memosfs.fuse.steer import Steering
from memosfs.fuse.tenants import TenantStats
from memosfs.fuse.why import CALLER

if TYPE_CHECKING:
    from memosfs.fuse.operations import MemosOperations

log = logging.getLogger("memosfs.fuse.operations")      # the daemon's lines as before

__all__ = ["ControlTree", "KNOB_APPLY", "check_capacity"]


# ---------------------------------------------------------------- knob writes
#
# Each takes the control tree and the typed value, applies it (KnobError:
# nothing changed) and returns the value to record.


def check_capacity(value: int, current: int = 0) -> None:
    """KnobError if a memory tier of value bytes cannot be had (growing
    beyond the machine's memory); the CLI asks before it makes the tier."""
    memory = physical_memory()
    if value > current and memory and value > memory:
        raise KnobError(f"cannot grow beyond memory: {value} bytes asked, the "
                        f"machine has {memory}")


def _apply_capacity(ctl: "ControlTree", value: int) -> int:
    store = ctl.store
    current = store.cache.capacity
    if value == current:
        return current
    check_capacity(value, current)
    try:
        store.set_capacity(value)
    except OSError as e:
        if value > current:
            raise KnobError(f"cannot grow beyond memory to {value} bytes: "
                            f"{e.strerror}") from e
        raise KnobError(f"cannot shrink to {value} bytes: {e.strerror} "
                        f"(pinned or open slots do not fit)") from e
    ctl.ops.tenants.check_quotas()
    return store.cache.capacity


def _apply_evict_batch(ctl: "ControlTree", value: int) -> int:
    ctl.store.set_evict_batch(value)
    return value


def _apply_evict_policy(ctl: "ControlTree", value: str) -> str:
    ctl.store.set_evict_policy(value)
    return value


def _apply_reclaim_free_ratio(ctl: "ControlTree", value: float) -> float:
    ctl.store.cache.set_reclaim(value, ctl.knobs["reclaim_fail_limit"])
    return value


def _apply_reclaim_fail_limit(ctl: "ControlTree", value: int) -> int:
    ctl.store.cache.set_reclaim(ctl.knobs["reclaim_free_ratio"], value)
    return value


def _apply_ring_slots(ctl: "ControlTree", value: int) -> int:
    ctl.store.ring_slots = value
    return value


def _apply_writeback_delay_ms(ctl: "ControlTree", value: int) -> int:
    ctl.store.writeback_delay_ms = value
    return value


def _apply_ssd_capacity(ctl: "ControlTree", value: int) -> int:
    if ctl.store.ssd is None:
        if value:
            raise KnobError("no SSD tier is mounted")
        return value
    ctl.store.ssd.capacity = value
    ctl.store.ssd.trouble = None        # (the next write-back tells anew)
    return value


def _apply_ssd_full(ctl: "ControlTree", value: str) -> str:
    ctl.store.ssd_full = value
    if ctl.store.ssd is not None:
        ctl.store.ssd.trouble = None    # (the next write-back tells anew)
    return value


def _apply_unmount_unsaved(ctl: "ControlTree", value: str) -> str:
    if value == "lose":                 # (at once: `memosfs umount --force` unmounts next)
        ctl.ops.unmount_guard.release("unmount_unsaved=lose")
    return value


def _apply_ssd_pack_below(ctl: "ControlTree", value: int) -> int:
    if ctl.store.ssd is not None:
        ctl.store.ssd.segs.pack_below = value
    return value


def _apply_prefetch_mode(ctl: "ControlTree", value: str) -> str:
    ctl.store.prefetch.set_mode(value)          # ModeUnavailable is a KnobError
    return value


def _apply_coherence_protocol(ctl: "ControlTree", value: int) -> int:
    if value == 2 and ctl.ops.wb:
        # Strong coherence makes a writer wait for the other holders; under the
        # writeback cache that wait would fall inside the kernel's flush of the
        # writer's pages, which readers of the inode wait for: a deadlock that
        # only a lease break ends.  It needs the write-through mount.
        raise KnobError("coherence_protocol 2 needs a mount with writeback_cache=0 "
                        "(mount with -o writeback_cache=0,coherence_protocol=2)")
    ctl.store.set_remote_strong(value == 2)
    return value


def _apply_fast_path(ctl: "ControlTree", value: bool) -> bool:
    ctl.ops.configure_fast_path(fast=value)
    return value


def _apply_burst_poll_us(ctl: "ControlTree", value: int) -> int:
    ctl.ops.configure_fast_path(poll_us=value)
    return value


def _apply_writeback_cache(ctl: "ControlTree", value: bool) -> bool:
    """Negotiated with the kernel when the mount starts (pyfuse3.init, then the
    INIT reply): settable before that only."""
    ops = ctl.ops
    if ops.is_mounted() and value != ops.wb:
        raise KnobError("writeback_cache is negotiated with the kernel at mount: give it "
                        "with -o writeback_cache=0 or =1")
    ops.enable_writeback_cache = ops.wb = bool(value)
    ops.slots.set_writeback(ops.wb)     # (the slot table plans around the kernel's cache)
    return value


def _at_mount_only(name: str):
    """A knob the mount is set up with (the kernel negotiates it at INIT):
    settable before that only."""
    def apply(ctl: "ControlTree", value: Any) -> Any:
        if ctl.ops.is_mounted() and value != ctl.ops.knobs.get(name):
            raise KnobError(f"{name} is set when the mount starts: give it with -o {name}=...")
        return value
    return apply


def _read_at_use(ctl: "ControlTree", value: Any) -> Any:
    """Recorded in ops.knobs; its reader (named in KNOB_APPLY) looks it up
    each time it needs it, so the next use sees the new value."""
    return value


# Every knob, and what applies it.
KNOB_APPLY: dict[str, Callable[["ControlTree", Any], Any]] = {
    "capacity": _apply_capacity,
    "evict_policy": _apply_evict_policy,
    "evict_batch": _apply_evict_batch,
    "reclaim_free_ratio": _apply_reclaim_free_ratio,
    "reclaim_fail_limit": _apply_reclaim_fail_limit,
    "writeback_delay_ms": _apply_writeback_delay_ms,
    "ssd_capacity": _apply_ssd_capacity,
    "ssd_full": _apply_ssd_full,
    "unmount_unsaved": _apply_unmount_unsaved,  # and the hold's watch (unmount.py)
    "warmup_ratio": _read_at_use,               # the warm-up at mount (cli.py)
    "ssd_pack_below": _apply_ssd_pack_below,
    "quantize": _read_at_use,                   # each publish (publish.py)
    "quant_error_max": _read_at_use,            # each publish (publish.py)
    "page_cache_push": _read_at_use,            # each publish and close (publish.py, files.py)
    "fast_path": _apply_fast_path,
    "writeback_cache": _apply_writeback_cache,  # the mount (cli.py _negotiate_kernel_flags)
    "passthrough": _at_mount_only("passthrough"),      # the mount (passthrough.py)
    "passthrough_min": _read_at_use,            # each open (passthrough.py)
    "passthrough_room": _at_mount_only("passthrough_room"),   # the mount
    "burst_poll_us": _apply_burst_poll_us,
    "coherence_protocol": _apply_coherence_protocol,    # and each open (coherence.py)
    "coherence_timeout_ms": _read_at_use,       # each wait (coherence.py)
    "lease_break_ms": _read_at_use,             # each wait (coherence.py)
    "coherence_batch_ms": _read_at_use,         # each batch (coherence.py)
    "agent_identity": _read_at_use,             # each open (coherence.py)
    "ring_slots": _apply_ring_slots,
    "umask": _read_at_use,                      # each mkdir and create (namespace.py,
                                                # opening.py)
    "pin_max_per_uid": _read_at_use,            # each pin (tenants.py)
    "hold_max_per_uid": _read_at_use,           # each open and write (tenants.py)
    "prefetch_mode": _apply_prefetch_mode,
    "prefetch_stride": _read_at_use,            # each prefetch (store/prefetch.py)
    "prefetch_retrain_below": _read_at_use,     # each accuracy review (store/prefetch.py)
}


# ---------------------------------------------------------------- statistics


@dataclass(frozen=True)
class FilesystemStats(Record):
    """The filesystem (the tree, handles, requests, the page cache).

    Counted by the handlers (memosfs/fuse/)."""
    agents: int = gauge("agent directories now")
    sessions: int = gauge("session directories now")
    open_handles: int = gauge("open file handles now")
    read_requests: int = counter("reads that reached the daemon (not served by the page cache)")
    page_cache_pushed_bytes: int = counter("bytes pushed into the kernel's page cache")
    page_cache_pushes: int = counter("pushes of a slot into the kernel's page cache")
    requests_refused: int = counter("requests answered with an error the log explains")
    private_writers: int = counter("retried whole-slot writers given a draft of their own")
    room_waits: int = counter("waits (50 ms at most), in a worker thread, of a write for a full memory "
                              "tier to make room (the loop serves other requests meanwhile)")
    fast_requests: int = counter("reads, writes and getxattrs answered on the fast path "
                                 "(the C shim's synchronous callback; fast_path)")
    burst_requests: int = counter("of those, taken while waiting for the client's next "
                                  "request (burst_poll_us)")
    requests: int = counter("requests the kernel sent, of every kind (counted as the shim "
                            "reads them; 0 without the shim)")
    write_requests: int = counter("of those, writes (one per request, however many pages)")
    cpu_ms: int = counter("the daemon's CPU time, user and system, every thread (ms)")
    passthrough_opens: int = counter("opens whose reads and writes the kernel does itself, in a "
                                     "file of the daemon's (passthrough)")
    passthrough_mirrors: int = gauge("published versions kept as a file for passthrough readers")
    passthrough_copied_bytes: int = counter("bytes copied from the memory tier into such files")
    passthrough_room_used: int = gauge("bytes of memory passthrough files take now")
    passthrough_refused_full: int = counter("writers' files not published because the "
                                            "passthrough room filled while they were written")
    uptime_s: float = gauge("seconds since the mount", 0.0)


# every record class, in the order the stats files print them (docs/stats.md's table)
STATS_RECORDS = (StoreStats, CacheStats, FilesystemStats, CoherenceStats, TenantStats,
                 PrefetchStats, SSDStats, RemoteStats)


# ---------------------------------------------------------------- the tree


class ControlTree:
    """`.memos/` of a MemosOperations (`ops`): its pseudo-files, knob
    writes, commands and statistics."""

    def __init__(self, ops: "MemosOperations") -> None:
        self.ops = ops
        self.store = ops.store
        self.knobs = ops.knobs
        self.trace = ops.trace
        self._started = time.monotonic()
        self.drops_due: list = []       # revoked readers' nodes whose pages must go
        ino = iter(range(2, FIRST_DYNAMIC_INO))
        ctl = self._dir(next(ino), CONTROL_DIR, ops.root)
        cache = self._dir(next(ino), "cache", ctl)
        debug = self._dir(next(ino), "debug", ctl)
        self._file(next(ino), "stats", cache, 0o444,
                   lambda: format_stats(self.statistics()), None)
        self._file(next(ino), "stats.json", cache, 0o444,
                   lambda: stats_json(self.statistics()), None)
        for knob in KNOBS:
            self._file(next(ino), knob.name, cache, 0o644,
                       (lambda k=knob: k.format(self.knobs[k.name])),
                       (lambda text, k=knob: self.set_knob(k.name, text)))
        # commands: root writes; a read is empty (tar of the whole mount reads it)
        self._file(next(ino), "flush", cache, 0o600, None, self.write_flush)
        self._file(next(ino), "reset_context", cache, 0o600, None, self.write_reset)
        self._file(next(ino), "revoke", cache, 0o600, None, self.write_revoke)
        # steering: root, or the owner of what a line names, moves slots out
        # of memory (never deleting them: steer.py)
        self.steering = Steering(ops)
        self._file(next(ino), "evict", cache, 0o622, None, None, self.steering.evict)
        self._file(next(ino), "drop", cache, 0o622, None, None, self.steering.drop)
        # the trace names every tenant's agents, sessions, slots and uids
        self._file(next(ino), "trace", debug, 0o600, self.trace.text, self.write_trace)
        self._file(next(ino), "metrics", ctl, 0o444,
                   lambda: format_metrics(self.statistics()), None)
        # what an unmount now would lose (unmount.py): names for root only
        self._file(next(ino), "unsaved", cache, 0o444, self._unsaved_text, None)
        # the reader's own last refusal (why.py): each uid sees only its own
        self._file(next(ino), "why", ctl, 0o444, self._why_text, None)
        # every request the kernel sent since the mount, by kind (no names)
        self._file(next(ino), "requests", debug, 0o444, self._requests_text, None)

    def _dir(self, ino: int, name: str, parent: Dir) -> Dir:
        return self.ops.add_fixed(Dir(ino, name, parent, 0o755, 0, 0, CTL))

    def _file(self, ino: int, name: str, parent: Dir, mode: int,
              read: Optional[Callable[[], str]],
              write: Optional[Callable[[str], None]],
              command: Optional[Callable[[str, int], Awaitable[None]]] = None) -> None:
        self.ops.add_fixed(Pseudo(ino, name, parent, mode, read, write, command))

    def _requests_text(self) -> str:
        counts = self.ops.op_counts()
        if counts is None:
            return "# not counted: the session does not read through memosfs._fuseshim\n"
        return "".join(f"{k} {v}\n" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))

    def _unsaved_text(self) -> str:
        caller = CALLER.get()
        return self.ops.unmount_guard.text(caller[0] if caller is not None else None)

    def _why_text(self) -> str:
        caller = CALLER.get()
        return self.ops.why.text(caller[0] if caller is not None else None)

    # ---- writes ----

    def apply(self, name: str, value: Any, quiet: bool = False) -> Any:
        """The one way a knob changes, at mount and at run time: value (text,
        or a value of the knob's type) is checked by the knob, applied by
        its KNOB_APPLY entry and recorded; returns the value recorded.
        KnobError leaves everything unchanged."""
        knob = KNOB_BY_NAME[name]
        value = KNOB_APPLY[name](self, knob.value(value))
        self.knobs[name] = value
        if not quiet:
            self.trace.emit("KNOB", name=name, value=knob.format(value).strip())
            log.info("knob %s = %s", name, knob.format(value).strip())
        return value

    def set_knob(self, name: str, text: str) -> None:
        """A write into a knob's file: parse, check and apply (`apply`)."""
        self.apply(name, text)

    def apply_at_mount(self, given: dict[str, Any]) -> None:
        """Every knob, in table order, through `apply`: its value in given
        (the -o options), else its default.  KnobError names the option."""
        unknown = set(given) - set(KNOB_BY_NAME)
        if unknown:
            raise KnobError(f"unknown knobs: {', '.join(sorted(unknown))}")
        if str(given.get("coherence_protocol", "")).strip() == "2" \
                and "writeback_cache" not in given:
            given = dict(given, writeback_cache="0")    # (protocol 2 needs it off)
            log.info("coherence_protocol=2: the mount writes through (writeback_cache=0)")
        for knob in KNOBS:
            value = given.get(knob.name, self.knobs[knob.name])
            try:
                self.apply(knob.name, value, quiet=knob.name not in given)
            except KnobError as e:
                raise KnobError(f"{knob.name}={value}: {e}") from None

    def write_flush(self, text: str) -> None:
        if text.strip() != "1":
            raise KnobError(f"write 1 to flush, not {text.strip()!r}")
        self.store.flush()
        self.ops.unmount_guard.settle()     # (an unmount may follow at once)

    def write_reset(self, text: str) -> None:
        """agent/session: drop that session's slots and subtree."""
        t = text.strip().strip("/")
        parts = t.split("/")
        if len(parts) != 2 or not all(parts):
            raise KnobError(f"write agent/session, not {text.strip()!r}")
        session = self.ops.find_session(parts[0], parts[1])
        if session is None:
            raise KnobError(f"no session {t!r}")
        self.ops.reset_session(session)

    def write_revoke(self, text: str) -> None:
        """Root revokes every reader of the slot agent/session/slot (see
        memosfs/fuse/coherence.py): their reads fail with ESTALE from now
        on, and a writer waiting for them goes on."""
        t = text.strip().strip("/")
        if len(t.split("/")) < 3 or not all(t.split("/")):
            raise KnobError(f"write agent/session/slot, not {text.strip()!r}")
        node = self.ops.slot_at(t)
        if node is None:
            raise OSError(errno.ENOENT, f"no slot {t!r}")
        node = node.latest()
        # the write returns once the revoked readers' cached pages are gone
        # (FileOps.write awaits them): no read after it sees the old bytes
        self.drops_due += self.ops.coherence.revoke(
            node.key, valid=True, why="root wrote it to .memos/cache/revoke", drop=False)

    def write_trace(self, text: str) -> None:
        t = text.strip()
        if t not in ("0", "1"):
            raise KnobError(f"write 1 or 0, not {t!r}")
        self.trace.set(t == "1")

    # ---- statistics ----

    def statistics(self) -> list[Any]:
        """One record per component, in the order the stats files print:
        the store's, the memory tier's (C core), the filesystem's,
        coherence, tenants, the prefetcher, then the SSD and remote tiers
        where the mount has them (STATS_RECORDS lists every class)."""
        ops = self.ops
        store = self.store
        r = ops.request_stats()
        records: list[Any] = [
            store.statistics(lookup_misses=r["lookup_misses"]),
            CacheStats.from_native(store.cache.stats(), store.cache.policy),
            self._fs_statistics(r), ops.coherence.statistics(), ops.tenants.statistics(),
            store.prefetch.statistics()]
        if store.ssd is not None:
            records.append(store.ssd.statistics())
        remote = store.remote_statistics()
        if remote is not None:
            records.append(remote)
        return records

    def stats(self) -> dict[str, object]:
        """Every figure by name, in order (a view of `statistics()`)."""
        return as_dict(self.statistics())

    def _pt_statistics(self) -> dict[str, int]:
        pt = self.ops._pt_state
        return pt.stats() if pt is not None else {}

    def _fs_statistics(self, r: dict[str, int]) -> FilesystemStats:
        agents, sessions = self.ops.tree_counts()
        return FilesystemStats(
            agents=agents, sessions=sessions, open_handles=r["open_handles"],
            read_requests=r["read_requests"],
            page_cache_pushed_bytes=r["page_cache_pushed_bytes"],
            page_cache_pushes=r["page_cache_pushes"], requests_refused=r["requests_refused"],
            private_writers=r["private_writers"], room_waits=r["room_waits"],
            fast_requests=r["fast_requests"],
            burst_requests=r["burst_requests"],
            requests=r["requests"], write_requests=r["write_requests"],
            cpu_ms=r["cpu_ms"], **self._pt_statistics(),
            uptime_s=round(time.monotonic() - self._started, 3))
