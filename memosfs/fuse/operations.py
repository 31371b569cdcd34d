"""The filesystem: MemosOperations, the pyfuse3 handlers over the store.

MemosOperations is composed of one mixin per concern, each in its own
module, over the state and helpers they share (core.py):

    namespace.py  lookup, getattr, setattr, mkdir, rmdir, readdir, statfs,
                  unlink, rename (names, directories, lookup counts)
    persist.py    restore at mount; what the tiers keep of the namespace
    opening.py    create and open (which version a handle gets; the page
                  cache and ESTALE rules)
    files.py      read, write, fallocate, truncate, flush, fsync, release
    publish.py    a draft becomes the slot's new version
    xattrs.py     extended attributes, MEMOS_IOC_ACK, poll
    notify.py     what the kernel is told (invalidations, page-cache pushes)

Beside the handlers, two trees of their own: the control plane `.memos/`
(control.py, `ControlTree`) and `.federated` (fedtree.py, `FedTree`), which
gets every request on its inodes and handles through one routing table
(routing.py; the guard that answers EIO instead of dying is there too).
unmount.py holds the mount busy while slots cannot be saved.  The nodes (Node, Dir, Slot, Pseudo, Handle) are in nodes.py.

Owns: MemosOperations itself: its construction (the store's prefetcher and
the namespace callbacks are attached here), the public surface the CLI and
the two trees use, `check` (the tests' consistency check).

May call: every module of memosfs.fuse, the store, knobs, trace.  All
handlers run on the trio thread; none awaits while it holds a partial
change, so each handler is atomic.
"""

from __future__ import annotations

import stat
import time
from typing import Any, Optional

import pyfuse3
import trio

from memosfs.knobs import KNOBS
from memosfs.trace import Trace
from memosfs.fuse.coherence import Coherence
from memosfs.fuse.control import ControlTree
from memosfs.fuse.core import (
    FIRST_DYNAMIC_INO, Refused, physical_memory, refuse, tgid_of)
from memosfs.fuse.fedtree import FedTree
from memosfs.fuse.files import FileOps
from memosfs.fuse.namespace import NamespaceOps
from memosfs.fuse.nodes import (
    AGENT, CONTROL_DIR, FIXED_LOOKUPS, NAME_MAX, ROOT, Dir, Handle, Node, Pseudo, Slot,
    Special, now_ns)
from memosfs.fuse.notify import KernelNotify
from memosfs.fuse.opening import OpenOps
from memosfs.fuse.pagecache import PageCachePusher, Refresher
from memosfs.fuse.persist import NamespacePersistence
from memosfs.fuse.passthrough import PassthroughOps
from memosfs.fuse.publish import PublishOps
from memosfs.fuse.routing import guard_handlers, route_federated
from memosfs.fuse.tenants import Tenants
from memosfs.fuse.unmount import UnmountGuard
from memosfs.fuse.why import Reasons
from memosfs.fuse.slots import SlotTable
from memosfs.fuse.xattrs import XattrOps
from memosfs.store.store import Store

try:
    from memosfs import _fuseshim
except ImportError:             # not built: fallocate is EOPNOTSUPP, every
    _fuseshim = None            # flush of a writer publishes

# requests the shim takes in a row while it waits for a client's next one
# (burst_poll_us): other trio tasks wait at most this many
BURST_MAX = 64

__all__ = ["MemosOperations", "NAME_MAX", "CONTROL_DIR", "physical_memory", "tgid_of",
           "refuse", "Refused", "Node", "Dir", "Slot", "Pseudo", "Handle"]


class MemosOperations(NamespaceOps, NamespacePersistence, OpenOps, FileOps, PublishOps,
                      PassthroughOps,
                      XattrOps, KernelNotify, pyfuse3.Operations):
    """The memosfs request handlers (see the module docstring)."""

    enable_writeback_cache = False      # (per mount: the writeback_cache knob, below)

    def __init__(self, store: Store, knobs: Optional[dict[str, Any]] = None,
                 trace: Optional[Trace] = None) -> None:
        super().__init__()
        self.store = store
        self.trace = trace or store.trace
        # the knobs' values, typed (memosfs/knobs.py); every component reads
        # this one mapping, and control.py's `apply` is the one writer: at the
        # end of this constructor for every knob (knobs: the -o options), then
        # for each write into a knob's file
        self.knobs: dict[str, Any] = {k.name: k.default for k in KNOBS}
        self.knobs["capacity"] = store.cache.capacity
        self.inodes: dict[int, Node] = {}
        self.handles: dict[int, Handle] = {}
        # every slot's state: the one owner (slots.py over native/slot.c)
        self.slots = SlotTable(FIRST_DYNAMIC_INO, self.inodes, self._slot_like,
                               self._slot_forgotten)
        self._next_fh = 1
        self._dir_opens: dict[int, tuple[int, int]] = {}  # directory handle ->
                                        # (its inode, the opener's tgid): readdir
                                        # lists what lookup finds for that process
        self._lookup_misses = 0
        self._refused = 0
        self._read_requests = 0
        self.mounted = False            # set once pyfuse3.init succeeded: the
                                        # kernel can then be told of changes
        self.pusher: Optional[PageCachePusher] = None
        self._refresher = Refresher()
        self.root = Dir(pyfuse3.ROOT_INODE, "", None, 0o1777, 0, 0, ROOT)
        self.root.lookups = FIXED_LOOKUPS   # the kernel never forgets the root
        self.inodes[self.root.ino] = self.root
        self.why = Reasons()            # each uid's last refusal (.memos/why)
        self.unmount_guard = UnmountGuard(self)     # unmount.py: no unmount loses slots
        self.control = ControlTree(self)    # .memos/: inodes 2 .. FIRST_DYNAMIC_INO
        self.fed = FedTree(self)        # .federated/ (fedtree.py): inodes >= FED_INO
        self.trio_token = None          # set when serving: other threads post here
        self._writeback: Optional[tuple[int, int]] = None  # (fh, off) of a WRITE
                                        # from the kernel's page cache (mmap writeback)
        self._sent_back: dict[int, float] = {}    # writer pid -> when it got ESTALE
        self._private_writers = 0       # retried writers given a draft of their own
        self._flusher: Optional[tuple[int, int]] = None   # (fh, pid) of the FLUSH
                                        # being served (memosfs._fuseshim)
        self._evicted_due: dict[bytes, str] = {}  # evicted keys whose names go
                                        # on the trio thread (notify.py)
        if _fuseshim is not None:
            _fuseshim.install(self.fallocate, self._flush_note, self.coherence_interrupt,
                              self._write_note, self.ioctl)
            if hasattr(_fuseshim, "set_kill_suidgid"):
                _fuseshim.set_kill_suidgid(self._kill_suidgid)
        self.coherence = Coherence(self.knobs, self.trace, self._invalidate_pages)
        self.coherence.drop_pages = self._drop_pages_now
        self.tenants = Tenants(store, self.knobs)
        self.prefetch = store.start_prefetch(self.knobs)
        try:
            self.control.apply_at_mount(dict(knobs or {}))
        except BaseException:
            self.prefetch.close()
            raise
        store.attach_namespace(self._slot_meta, self._namespace,
                               self._slot_dropped_any_thread)

    # ---- the surface the CLI, the tests and the control tree use ----

    def stats(self) -> dict[str, object]:
        """Every counter, by name (what .memos/cache/stats prints)."""
        return self.control.stats()

    def set_knob(self, name: str, text: str) -> None:
        """Parse, check and apply a knob; KnobError leaves everything unchanged."""
        self.control.set_knob(name, text)

    def op_counts(self) -> Optional[dict[str, int]]:
        """Every request the kernel sent since the mount, by kind (the shim
        counts them as it reads them); None without the shim's reads."""
        if _fuseshim is None or not hasattr(_fuseshim, "op_counts"):
            return None
        return _fuseshim.op_counts()

    def request_stats(self) -> dict[str, int]:
        """The handlers' own counters."""
        fast = _fuseshim.fast_stats() if _fuseshim is not None and \
            hasattr(_fuseshim, "fast_stats") else dict.fromkeys(
                ("fast_writes", "fast_reads", "fast_xattrs", "fast_other",
                 "burst_requests"), 0)
        ops = self.op_counts() or {}
        return {"lookup_misses": self._lookup_misses,
                "requests": sum(ops.values()), "write_requests": ops.get("write", 0),
                "cpu_ms": time.process_time_ns() // 1_000_000,
                "open_handles": len(self.handles),
                "read_requests": self._read_requests,
                "requests_refused": self._refused,
                "private_writers": self._private_writers,
                "room_waits": self._room_waits,
                "fast_requests": sum(fast[k] for k in ("fast_writes", "fast_reads",
                                                           "fast_xattrs", "fast_other")),
                "burst_requests": fast["burst_requests"],
                "page_cache_pushed_bytes": self.pusher.pushed_bytes if self.pusher else 0,
                "page_cache_pushes": self.pusher.pushes if self.pusher else 0}

    def configure_fast_path(self, fast: Optional[bool] = None,
                            poll_us: Optional[int] = None) -> None:
        """Install (or take away) the synchronous read/write/getxattr
        callbacks memosfs._fuseshim answers requests with, per the knobs
        fast_path and burst_poll_us (or the values given, not yet stored)."""
        if _fuseshim is None or not hasattr(_fuseshim, "install_fast"):
            return
        if fast is None:
            fast = bool(self.knobs["fast_path"])
        if poll_us is None:
            poll_us = int(self.knobs["burst_poll_us"])
        if fast:
            _fuseshim.install_fast(self.fast_write, self.fast_read, self.fast_getxattr,
                                   self.fast_flush, self.fast_release, self.fast_getattr,
                                   self.fast_lookup, self.fast_open, self.fast_create,
                                   self.fast_truncate, poll_us * 1000,
                                   BURST_MAX if poll_us else 0)
        else:
            _fuseshim.install_fast(None, None, None, None, None, None, None, None, None, None,
                                   0, 0)

    def tree_counts(self) -> tuple[int, int]:
        """(agents, sessions) in the tree."""
        agents = [a for a in self.root.children.values()
                  if isinstance(a, Dir) and a.level == AGENT]
        return len(agents), sum(1 for a in agents for s in a.children.values()
                                if isinstance(s, Dir))

    def slot_at(self, path: str) -> Optional[Slot]:
        """The slot named agent/session/.../name, or None."""
        return self._slot_by_key(path.encode("utf-8", "surrogateescape"))

    async def background(self) -> None:
        """Long-running tasks of a mounted filesystem (run by the CLI)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.coherence.batch_loop)
            nursery.start_soon(self.unmount_guard.watch)

    def _kill_suidgid(self, ino: int) -> None:
        """The kernel asks (FUSE_HANDLE_KILLPRIV_V2, with the writeback cache)
        that a write, truncate or O_TRUNC open by a caller without CAP_FSETID
        clear the file's set-user-ID bit, and its set-group-ID bit when it is
        group-executable, as the kernel itself does otherwise (and a chown
        of a special file: nodes.Special)."""
        node = self.inodes.get(ino)
        if node is None or not isinstance(node, (Slot, Special)):
            return
        kill = stat.S_ISUID | (stat.S_ISGID if node.mode & stat.S_IXGRP else 0)
        if node.mode & kill:
            node.mode &= ~kill
            node.ctime_ns = now_ns()
            self._metadata_changed(node)

    def _slot_forgotten(self, node: Slot, holders) -> None:
        """The slot table forgot node's inode: what held its bytes goes."""
        for f in (holders.pt_mirror, holders.pt_draft, holders.pt_file):
            if f is not None and hasattr(f, "close"):
                f.close()
        if holders.base is not None:
            holders.base.release()
        if holders.draft is not None:
            holders.draft.free()
        pt = self._pt_state
        if pt is not None:
            pt.mirrors.pop(id(node), None)
            pt.drafts.pop(id(node), None)

    # ---- consistency (tests) ----

    def check(self) -> None:
        """Namespace, handles and store agree; raises AssertionError if not."""
        self.store.cache.check()
        live = set(self.store.cache.keys())
        if self.store.ssd is not None:
            live |= set(self.store.ssd.keys())
        named = set()
        for slot in self._walk_slots(self.root):
            if slot.version:
                named.add(slot.key)
        if self.store.remote is not None:       # names made from remote manifests
            named = {k for k in named if k in live or not self.store.remote.known_present(k)}
        assert named == live, f"namespace {sorted(named - live)} vs store {sorted(live - named)}"
        readers: dict[int, int] = {}
        for h in self.handles.values():
            if h.kind == "read" and not h.dio:
                readers[h.node.ino] = readers.get(h.node.ino, 0) + 1
        for node in self.inodes.values():
            if isinstance(node, Slot):
                assert node.readers == readers.get(node.ino, 0), node.name
        self.slots.check()

    def check_all(self) -> list[str]:
        """Every consistency check, as at the end of each mounted test (as
        s3ql runs its fsck after every test): the namespace against the
        store and the handles, memory (index, arena, policy), the coherence
        directory, the SSD tier's index against its folder.  Returns what
        failed (empty: all agree).  Run once requests have stopped."""
        self.apply_evictions()
        problems = []
        checks = [("namespace", self.check), ("coherence", self.coherence.dir.check)]
        if self.store.ssd is not None:
            checks.append(("ssd", self.store.ssd.check))
        for name, fn in checks:
            try:
                fn()
            except (AssertionError, RuntimeError, OSError) as e:
                problems.append(f"{name}: {e}")
        return problems


route_federated(MemosOperations)        # .federated requests go to self.fed
guard_handlers(MemosOperations)         # outermost: no request kills the daemon
