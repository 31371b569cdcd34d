"""The filesystem: pyfuse3 Operations over the store.

Namespace.  The root holds agents and the control plane `.memos/`; an agent
holds sessions; a session holds slots.  A slot file anywhere else, or a
directory inside a session, is EPERM.  Names follow NAME_MAX (255 bytes).

Versions and the page cache.  A slot's bytes change only by publish (a
writer's flush/close or fsync).  Writers open with direct_io, so their draft
never enters the kernel's page cache; readers go through the page cache with
keep_cache, so a re-read costs no request.  The invariant that makes this
safe: *all reader handles open on one inode read the same version*.  A
publish while readers hold the inode therefore gives the name a fresh inode
(the old one is "superseded" and keeps serving its readers their snapshot);
a publish with no reader open updates the inode in place, and the next
reader's open drops the stale pages (keep_cache off once).  Opening a
superseded inode through a stale dentry returns ESTALE, which makes the
kernel redo the lookup and find the new inode.

Lookup counts.  Every entry handed to the kernel (lookup, create, mkdir,
readdirplus) adds one to `Node.lookups`; `forget` takes them away.  A node
that left the tree is deleted from the inode table once it has no lookups
and no open handles.
"""

from __future__ import annotations

import collections
import errno
import functools
import logging
import os
import stat
import threading
import time
from typing import Callable, Iterator, Optional

import pyfuse3
import trio

from memosfs import _native
from memosfs.store import kvfile

try:
    from memosfs import _fuseshim
except ImportError:             # not built: fallocate is EOPNOTSUPP, every
    _fuseshim = None            # flush of a writer publishes
from memosfs.knobs import KNOB_BY_NAME, KNOBS, KnobError, parse_size
from memosfs.trace import Trace
from memosfs.stats import format_metrics, format_stats, stats_json
from memosfs.fuse.coherence import Coherence, Hold, agent_name
from memosfs.abi import MEMOS_IOC_ACK
from memosfs.fuse.tenants import QUOTA_XATTR, USAGE_XATTR, OverLimit, Tenants
from memosfs.fuse.fedtree import FED_INO, FedTree
from memosfs.store.prefetch import PrefetchEngine
from memosfs.fuse.pagecache import PUSH_LOCK, BytesSource, PageCachePusher, Refresher
from memosfs.store.store import Store, make_key, split_key

log = logging.getLogger("memosfs.fuse.operations")

__all__ = ["MemosOperations", "NAME_MAX", "CONTROL_DIR"]

NAME_MAX = 255
CONTROL_DIR = ".memos"
SLOT_BLKSIZE = 1 << 20          # st_blksize: cp/cat size their buffers by it
ENTRY_TIMEOUT = 1.0
ATTR_TIMEOUT = 1.0
FIRST_DYNAMIC_INO = 1000
WRITER_RETRY_S = 5.0            # how long an ESTALE'd writer's retry is waited for
PUSH_WAIT_S = 5.0               # how long a writer waits for a push into its inode,
                                # or for another writer to replace the slot first
PUSH_MIN_BYTES = 1 << 20        # smaller versions: reading them through the daemon costs less than a push (its attribute refresh is a round trip)
DECODED_CACHE_BYTES = 512 << 20   # logical bytes of quantized versions kept decoded

ROOT, AGENT, SESSION, SUBDIR, CTL = "root", "agent", "session", "dir", "ctl"
SLOT_DIRS = (SESSION, SUBDIR)   # directories that hold slots (and directories)


def _now() -> int:
    return time.time_ns()



def tgid_of(pid: int) -> int:
    """The process (thread group) a FUSE request's thread belongs to: the
    kernel sends the calling thread's id, and a writer's view and the right
    to publish belong to the whole process.  The id itself if /proc cannot
    tell (the thread is gone)."""
    if pid <= 0:
        return pid
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return pid


def physical_memory() -> int:
    """Bytes of memory of the machine (0 when unknown)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


class Refused(pyfuse3.FUSEError):
    """A FUSEError whose reason has been logged."""


def refuse(code: int, fmt: str, *args: object, level: int = logging.INFO) -> Refused:
    log.log(level, "refused (%s): " + fmt, errno.errorcode.get(code, code), *args)
    return Refused(code)


# ---------------------------------------------------------------- nodes


class Node:
    """An inode: a directory, a slot, or a control-plane pseudo-file."""

    def __init__(self, ino: int, name: str, parent: Optional["Dir"], mode: int,
                 uid: int, gid: int) -> None:
        now = _now()
        self.ino = ino                  # inode number, never reused while mounted
        self.name = name                # current name in parent
        self.parent = parent            # None for the root and for detached nodes
        self.mode = mode                # S_IFMT | permission bits
        self.uid = uid
        self.gid = gid
        self.atime_ns = self.mtime_ns = self.ctime_ns = now
        self.lookups = 0                # kernel lookup count (forget lowers it)
        self.handles = 0                # open handles
        self.detached: Optional[str] = None  # why it left the tree, if it did
        self.xattrs: dict[bytes, bytes] = {}  # user.* attributes set by users

    def size(self) -> int:
        return 0

    def blocks(self) -> int:
        return 0

    def nlink(self) -> int:
        return 0 if self.detached else 1


class Dir(Node):
    def __init__(self, ino: int, name: str, parent: Optional["Dir"], mode: int,
                 uid: int, gid: int, level: str) -> None:
        super().__init__(ino, name, parent, stat.S_IFDIR | mode, uid, gid)
        self.level = level              # ROOT | AGENT | SESSION | CTL
        self.children: dict[str, Node] = {}

    def nlink(self) -> int:
        if self.detached:
            return 0
        return 2 + sum(1 for c in self.children.values() if isinstance(c, Dir))

    def size(self) -> int:
        return 4096

    def path(self) -> str:
        """agent/session/d1/... below the root ("" for the root)."""
        parts = []
        d: Optional[Dir] = self
        while d is not None and d.level != ROOT:
            parts.append(d.name)
            d = d.parent
        return "/".join(reversed(parts))

    def key_of(self, name: str) -> bytes:
        """The store key of a slot called name in this directory."""
        return f"{self.path()}/{name}".encode("utf-8", "surrogateescape")

    def contains(self, other: "Node") -> bool:
        """Whether other is this directory or lies below it."""
        n: Optional[Node] = other
        while n is not None:
            if n is self:
                return True
            n = n.parent
        return False


class Slot(Node):
    @property
    def writer_pending(self) -> bool:
        """Writers sent here by ESTALE are on their way (readers meanwhile read
        around the page cache, so each retry finds no page-cache readers)."""
        if self.pending:
            now = time.monotonic()
            for pid in [p for p, until in self.pending.items() if until <= now]:
                del self.pending[pid]               # never came back
        return bool(self.pending)

    def __init__(self, ino: int, name: str, parent: Dir, mode: int, uid: int,
                 gid: int) -> None:
        super().__init__(ino, name, parent, stat.S_IFREG | mode, uid, gid)
        self.version = 0                # published version (0: never published)
        self.pub_size = 0               # bytes of the published version
        self.stored = 0                 # bytes of pages it holds
        self.readers = 0                # open read handles in page-cache mode
        self.pending: dict[int, float] = {}  # pid of a writer sent here by ESTALE
                                        # -> until when its retry is waited for
        self.writers = 0                # open write handles (they share the draft)
        self.writer_pids: collections.Counter[int] = collections.Counter()
                                        # tgid of each write handle's opener
        self.draft: Optional[_native.Draft] = None   # the writers' shared draft
        self.base: Optional[_native.Ref] = None      # published version the draft
                                        # will start from (copied at the first write)
        self.base_decoded: Optional[bytes] = None    # its logical bytes, if quantized
        self.changed = False            # the draft holds unpublished changes
        self.draft_mtime_ns = 0         # mtime the writers see (and the next publish sets)
        self.write_failed = False       # a write was refused since the last publish
        self.cache_version = -1         # version the kernel may hold pages of
        self.successor: Optional[Slot] = None  # the inode that took our name
        self.pushing = 0                # page-cache pushes in flight (PUSH_LOCK)

    @property
    def key(self) -> bytes:
        parts = [self.name]
        d = self.parent
        while d is not None and d.level != ROOT:
            parts.append(d.name)
            d = d.parent
        return "/".join(reversed(parts)).encode("utf-8", "surrogateescape")

    def size(self) -> int:
        """The published version's size: what every process but the
        writers sees (see `MemosOperations._attr` for the writers' view)."""
        return self.pub_size

    def draft_size(self) -> int:
        """The size the writers see: their draft's, or the base they will start from."""
        if self.draft is not None:
            return self.draft.size
        if self.base_decoded is not None:
            return len(self.base_decoded)
        if self.base is not None:
            return self.base.size
        return self.pub_size

    def blocks(self) -> int:
        return (self.stored + 511) // 512


class Pseudo(Node):
    """A control-plane file: content made by `read`, writes applied by `write`."""

    def __init__(self, ino: int, name: str, parent: Dir, mode: int,
                 read: Optional[Callable[[], str]],
                 write: Optional[Callable[[str], None]]) -> None:
        super().__init__(ino, name, parent, stat.S_IFREG | mode, 0, 0)
        self.read = read
        self.write = write


def quant_error_limit(scheme: str, knob: str) -> float:
    """quant_error_max: a number, or auto (0.03 for int8 schemes, 0.12 for int4)."""
    if knob != "auto":
        return float(knob)
    return 0.12 if scheme == "int4" else 0.03


class Handle:
    """An open file.  A write handle has no bytes of its own: every write
    handle on a slot shares the slot's draft (`Slot.draft`), as every
    descriptor of a file shares its pages on any filesystem."""

    __slots__ = ("fh", "node", "flags", "kind", "ref", "append", "data", "decoded",
                 "dio", "hold", "opener", "uid")

    def __init__(self, fh: int, node: Node, flags: int, kind: str) -> None:
        self.fh = fh
        self.node = node
        self.flags = flags
        self.kind = kind                # "read" | "write" | "pseudo"
        self.ref: Optional[_native.Ref] = None    # reader's pinned snapshot
        self.append = bool(flags & os.O_APPEND)
        self.data = b""                 # pseudo-file snapshot / written text
        self.decoded: Optional[bytes] = None  # logical bytes of a quantized version
        self.dio = False                # a reader reading around the page cache
        self.hold: Optional[Hold] = None   # its place in the coherence directory
        self.opener = 0                 # tgid of the process that opened it
        self.uid = 0                    # uid of the opener (its share: tenants.py)


# ---------------------------------------------------------------- operations


class MemosOperations(pyfuse3.Operations):
    """The memosfs request handlers.  All run on the trio thread; none awaits
    while it holds a partial change, so each handler is atomic."""

    enable_writeback_cache = False

    def __init__(self, store: Store, knobs: Optional[dict[str, object]] = None,
                 trace: Optional[Trace] = None) -> None:
        super().__init__()
        self.store = store
        self.trace = trace or store.trace
        self.knobs: dict[str, object] = {k.name: k.default for k in KNOBS}
        self.knobs.update(knobs or {})
        self.knobs["capacity"] = store.cache.capacity
        store.cache.set_policy(str(self.knobs["evict_policy"]))
        store.cache.set_reclaim(float(self.knobs["reclaim_free_ratio"]),
                                int(self.knobs["reclaim_fail_limit"]))
        self.inodes: dict[int, Node] = {}
        self.handles: dict[int, Handle] = {}
        self._next_ino = FIRST_DYNAMIC_INO
        self._next_fh = 1
        self._started = time.monotonic()
        self._lookup_misses = 0
        self._refused = 0
        self._read_requests = 0
        self._decoded: "collections.OrderedDict[tuple, bytes]" = collections.OrderedDict()
        self._quant = collections.Counter()
        self.mounted = False            # set once pyfuse3.init succeeded: the
                                        # kernel can then be told of changes
        self.pusher: Optional[PageCachePusher] = None
        self._refresher = Refresher()
        self.root = Dir(pyfuse3.ROOT_INODE, "", None, 0o1777, 0, 0, ROOT)
        self.root.lookups = 1 << 62     # the kernel never forgets the root
        self.inodes[self.root.ino] = self.root
        self._build_control()
        self.fed = FedTree(self)        # .federated/ (memosfs/fedfs.py): inodes >= FED_INO
        self.trio_token = None          # set when serving: other threads post here
        self._writeback: Optional[tuple[int, int]] = None  # (fh, off) of a WRITE
                                        # from the kernel's page cache (mmap writeback)
        self._sent_back: dict[int, float] = {}    # writer pid -> when it got ESTALE
        self._private_writers = 0       # retried writers given a draft of their own
        self._flusher: Optional[tuple[int, int]] = None   # (fh, pid) of the FLUSH
                                        # being served (memosfs._fuseshim)
        if _fuseshim is not None:
            _fuseshim.install(self.fallocate, self._flush_note, self.coherence_interrupt,
                              self._write_note, self.ioctl)
        self.coherence = Coherence(self.knobs, self.trace, self._invalidate_pages)
        self.coherence.drop_pages = self._drop_pages_now
        self.tenants = Tenants(store, self.knobs)
        store.prefetch = self.prefetch = PrefetchEngine(
            store.prefetch_fetch, store._in_memory, self._session_slot_names, self.knobs)
        store.on_drop(lambda key, reason: self.prefetch.on_remove(key))
        store.on_drop(self._slot_dropped_any_thread)
        store.meta_of = self._slot_meta
        store.namespace_of = self._namespace

    def _session_slot_names(self, agent: str, session: str) -> list[str]:
        """For the prefetcher (its thread): the slot names a session holds, in
        memory or on SSD (the store's view; the namespace is the loop's)."""
        return [k.rsplit(b"/", 1)[1].decode("utf-8", "surrogateescape")
                for k in self.store.session_keys(agent, session)]

    # ---- persistence of the namespace ----

    def _slot_meta(self, key: bytes) -> dict:
        """What the SSD tier keeps beside a slot's bytes."""
        node = self._slot_by_key(key)
        if node is None:
            return {}
        return {"mode": stat.S_IMODE(node.mode), "uid": node.uid, "gid": node.gid,
                "logical_size": node.pub_size,
                "mtime_ns": node.mtime_ns, "atime_ns": node.atime_ns,
                "xattrs": {k.hex(): v.hex() for k, v in node.xattrs.items()}}

    def _namespace(self) -> list[dict]:
        """Every directory below the root, parents first, with owners, modes
        and times (namespace.json)."""
        out = []
        todo = [a for a in self.root.children.values()
                if isinstance(a, Dir) and a.level == AGENT]
        while todo:
            d = todo.pop(0)
            out.append(self._dir_record(d.path(), d))
            todo.extend(c for c in list(d.children.values()) if isinstance(c, Dir))
        return out

    @staticmethod
    def _dir_record(path: str, d: "Dir") -> dict:
        return {"path": path, "mode": stat.S_IMODE(d.mode), "uid": d.uid, "gid": d.gid,
                "mtime_ns": d.mtime_ns, "xattrs": {k.hex(): v.hex() for k, v in d.xattrs.items()}}

    def restore(self) -> int:
        """At mount: directories and slots as the SSD tier kept them."""
        entries = self.store.restore()
        records = self.store.ssd.read_json("namespace.json", []) if self.store.ssd else []
        for rec in records:
            try:
                parts = rec["path"].split("/")
                if not all(parts) or CONTROL_DIR in parts[:1]:
                    raise ValueError(rec["path"])
                d = self._ensure_dirs(parts, rec["uid"], rec["gid"], rec["mode"])
                d.mode = stat.S_IFDIR | (int(rec["mode"]) & 0o7777)
                d.uid, d.gid = int(rec["uid"]), int(rec["gid"])
                d.mtime_ns = d.ctime_ns = int(rec.get("mtime_ns", d.mtime_ns))
                d.xattrs = {bytes.fromhex(k): bytes.fromhex(v)
                            for k, v in rec.get("xattrs", {}).items()}
                if d.level == AGENT and QUOTA_XATTR in d.xattrs:
                    self.tenants.set_quota(d.name, int(d.xattrs[QUOTA_XATTR]))
            except (KeyError, ValueError, TypeError, OSError) as e:
                log.error("namespace.json: bad record %r (%s); skipped", rec, e)
        for e in entries:
            parts = e.key.decode("utf-8", "surrogateescape").split("/")
            if len(parts) < 3 or not all(parts):
                log.error("SSD tier: slot key %r has no place in the tree; skipped", e.key)
                continue
            m = e.meta
            sess = self._ensure_dirs(parts[:-1], m.get("uid", 0), m.get("gid", 0), 0o755)
            name = parts[-1]
            if name in sess.children:
                log.error("SSD tier: %r is a directory and a slot; the slot is skipped", e.key)
                continue
            node = Slot(self._new_ino(), name, sess, int(m.get("mode", 0o644)),
                        int(m.get("uid", 0)), int(m.get("gid", 0)))
            node.version, node.stored = e.version, e.file_bytes
            node.pub_size = int(m.get("logical_size", e.size))
            node.mtime_ns = node.ctime_ns = int(m.get("mtime_ns", node.mtime_ns))
            node.atime_ns = int(m.get("atime_ns", node.mtime_ns))
            node.xattrs = {bytes.fromhex(k): bytes.fromhex(v)
                           for k, v in m.get("xattrs", {}).items()}
            sess.children[name] = node
            self.inodes[node.ino] = node
        return len(entries)

    def _ensure_dirs(self, parts: list[str], uid: int, gid: int, mode: int) -> "Dir":
        d = self.root
        for depth, name in enumerate(parts):
            level = (AGENT, SESSION)[depth] if depth < 2 else SUBDIR
            child = d.children.get(name)
            if not isinstance(child, Dir):
                child = Dir(self._new_ino(), name, d, int(mode) & 0o7777, int(uid),
                            int(gid), level)
                d.children[name] = child
                self.inodes[child.ino] = child
            d = child
        return d

    def _slot_by_key(self, key: bytes) -> Optional["Slot"]:
        node: Optional[Node] = self.root
        for part in key.decode("utf-8", "surrogateescape").split("/"):
            if not isinstance(node, Dir):
                return None
            node = node.children.get(part)
        return node if isinstance(node, Slot) else None

    # ---- the control plane ----

    def _build_control(self) -> None:
        ino = iter(range(2, FIRST_DYNAMIC_INO))
        ctl = self._add_perm_dir(next(ino), CONTROL_DIR, self.root)
        cache = self._add_perm_dir(next(ino), "cache", ctl)
        debug = self._add_perm_dir(next(ino), "debug", ctl)
        self._add_pseudo(next(ino), "stats", cache, 0o444,
                         lambda: format_stats(self.stats()), None)
        self._add_pseudo(next(ino), "stats.json", cache, 0o444,
                         lambda: stats_json(self.stats()), None)
        for knob in KNOBS:
            self._add_pseudo(next(ino), knob.name, cache, 0o644,
                             (lambda k=knob: k.format(self.knobs[k.name])),
                             (lambda text, k=knob: self.set_knob(k.name, text)))
        self._add_pseudo(next(ino), "flush", cache, 0o200, None, self._write_flush)
        self._add_pseudo(next(ino), "reset_context", cache, 0o200, None,
                         self._write_reset)
        self._add_pseudo(next(ino), "revoke", cache, 0o200, None, self._write_revoke)
        # the trace names every tenant's agents, sessions, slots and uids
        self._add_pseudo(next(ino), "trace", debug, 0o600, self.trace.text,
                         self._write_trace)
        self._add_pseudo(next(ino), "metrics", ctl, 0o444,
                         lambda: format_metrics(self.stats()), None)

    def _add_perm_dir(self, ino: int, name: str, parent: Dir) -> Dir:
        d = Dir(ino, name, parent, 0o755, 0, 0, CTL)
        d.lookups = 1 << 62
        parent.children[name] = d
        self.inodes[ino] = d
        return d

    def _add_pseudo(self, ino: int, name: str, parent: Dir, mode: int,
                    read: Optional[Callable[[], str]],
                    write: Optional[Callable[[str], None]]) -> None:
        p = Pseudo(ino, name, parent, mode, read, write)
        p.lookups = 1 << 62
        parent.children[name] = p
        self.inodes[ino] = p

    def set_knob(self, name: str, text: str) -> None:
        """Parse, check and apply a knob; KnobError leaves everything unchanged."""
        knob = KNOB_BY_NAME[name]
        value = knob.parse(text)
        if name == "capacity":
            current = self.store.cache.capacity
            memory = physical_memory()
            if value > current and memory and value > memory:
                raise KnobError(f"cannot grow beyond memory: {value} bytes asked, the "
                                f"machine has {memory}")
            try:
                self.store.set_capacity(value)
            except OSError as e:
                if value > current:
                    raise KnobError(f"cannot grow beyond memory to {value} bytes: "
                                    f"{e.strerror}") from e
                raise KnobError(f"cannot shrink to {value} bytes: {e.strerror} "
                                f"(pinned or open slots do not fit)") from e
            value = self.store.cache.capacity
        elif name == "evict_batch":
            self.store.set_evict_batch(value)
        elif name == "evict_policy":
            self.store.cache.set_policy(value)
        elif name in ("reclaim_free_ratio", "reclaim_fail_limit"):
            ratio = value if name == "reclaim_free_ratio" else self.knobs["reclaim_free_ratio"]
            limit = value if name == "reclaim_fail_limit" else self.knobs["reclaim_fail_limit"]
            self.store.cache.set_reclaim(float(ratio), int(limit))
        elif name == "ring_slots":
            self.store.ring_slots = value
        elif name == "writeback_delay_ms":
            self.store.writeback_delay_ms = value
        elif name == "ssd_capacity":
            if self.store.ssd is None:
                raise KnobError("no SSD tier is mounted")
            self.store.ssd.capacity = value
        elif name == "prefetch_mode":
            self.prefetch.set_mode(value)          # ModeUnavailable is a KnobError
        elif name == "coherence_protocol" and self.store.remote is not None:
            self.store.set_remote_strong(value == "2")
        self.knobs[name] = value
        self.trace.emit("KNOB", name=name, value=value)
        log.info("knob %s = %s", name, value)

    def _write_flush(self, text: str) -> None:
        if text.strip() != "1":
            raise KnobError(f"write 1 to flush, not {text.strip()!r}")
        self.store.flush()

    def _write_reset(self, text: str) -> None:
        t = text.strip().strip("/")
        parts = t.split("/")
        if len(parts) != 2 or not all(parts):
            raise KnobError(f"write agent/session, not {text.strip()!r}")
        agent = self.root.children.get(parts[0])
        session = agent.children.get(parts[1]) if isinstance(agent, Dir) else None
        if not isinstance(session, Dir) or session.level != SESSION:
            raise KnobError(f"no session {t!r}")
        self.store.reset_session(parts[0], parts[1])
        # the whole subtree goes: slots no tier holds now, then the directories
        for slot in list(self._walk_slots(session)):
            if not slot.writers:
                parent = slot.parent
                self._detach(slot, "reset")
                self._forget_entry(parent, slot.name)
        for child in [c for c in session.children.values() if isinstance(c, Dir)]:
            if not any(True for _ in self._walk_slots(child)):
                self._drop_tree(child)
        self.store.namespace_changed()

    def _write_revoke(self, text: str) -> None:
        """Root revokes every reader of the slot agent/session/slot (see
        memosfs/coherence.py): their reads fail with ESTALE from now on, and
        a writer waiting for them goes on."""
        t = text.strip().strip("/")
        if len(t.split("/")) < 3 or not all(t.split("/")):
            raise KnobError(f"write agent/session/slot, not {text.strip()!r}")
        node = self._slot_by_key(t.encode("utf-8", "surrogateescape"))
        if node is None:
            raise OSError(errno.ENOENT, f"no slot {t!r}")
        while node.successor is not None:
            node = node.successor
        self.coherence.revoke(node.key, valid=True, why="root wrote it to .memos/cache/revoke")

    def _drop_tree(self, d: Dir) -> None:
        for child in [c for c in d.children.values() if isinstance(c, Dir)]:
            self._drop_tree(child)
        parent = d.parent
        self._detach(d, "reset")
        if parent is not None:
            self._forget_entry(parent, d.name)

    def _write_trace(self, text: str) -> None:
        t = text.strip()
        if t not in ("0", "1"):
            raise KnobError(f"write 1 or 0, not {t!r}")
        self.trace.set(t == "1")

    def stats(self) -> dict[str, object]:
        """Every counter, by name: the C core's, then the store's and ours."""
        c = self.store.cache.stats()
        s = self.store.statistics()
        hits = s.mem_hits + s.ssd_hits + s.remote_hits
        misses = s.misses + self._lookup_misses
        lookups = hits + misses
        agents = [a for a in self.root.children.values()
                  if isinstance(a, Dir) and a.level == AGENT]
        out: dict[str, object] = {
            "lookups": lookups,
            "hits": hits,
            "mem_hits": s.mem_hits,
            "ssd_hits": s.ssd_hits,
            "misses": misses,
            "hit_rate": (hits / lookups) if lookups else 0.0,
            "inserts": c["inserts"],
            "replaces": c["replaces"],
            "publishes": s.publishes,
            "promotions": s.promotions,
            "writebacks": s.writebacks,
            "evict_writebacks": s.evict_writebacks,
            "slots_lost": s.drops_lost,
            "slots_unsaved": getattr(s, "slots_unsaved", 0),
            "warmup_loaded_bytes": s.warmup_loaded_bytes,
            "warmup_total_bytes": s.warmup_total_bytes,
            "warmup_done": s.warmup_done,
            "removes": c["removes"],
            "evictions": c["evictions"],
            "eviction_runs": c["eviction_runs"],
            "evict_refused": c["evict_refused"],
            "ring_recycles": s.ring_recycles,
            "resets": s.resets,
            "flushes": s.flushes,
            "slots": c["slots"],
            "bytes_used": c["bytes_used"],
            "capacity": c["capacity"],
            "pages_used": c["pages_used"],
            "free_pages": c["free_pages"],
            "superblocks": c["superblocks"],
            "huge_pages": c["huge_pages"],
            "index_load_factor": c["index_load_factor"],
            "index_entries": c["index_entries"],
            "index_buckets": c["index_buckets"],
            "alloc_failures": c["alloc_failures"],
            "alloc_waits": c["alloc_waits"],
            "reclaim_runs": c.get("reclaim_runs", 0),
            "fragmentation": c.get("fragmentation", 0.0),
            "pages_pending": c.get("pages_pending", 0),
            "sweep_ns_max": c.get("sweep_ns_max", 0),
            "reclaim_free_ratio": c.get("reclaim_free_ratio", 0.0),
            "reclaim_fail_limit": c.get("reclaim_fail_limit", 0),
            "drafts": c["drafts"],
            "bytes_draft": c["bytes_draft"],
            "pinned": c["pinned"],
            "dead_pinned": c["dead_pinned"],
            "evict_batch": c["evict_batch"],
            "evict_policy": self.store.cache.policy,
            "ghost_hits_recency": c.get("ghost_hits_recency", 0),
            "ghost_hits_frequency": c.get("ghost_hits_frequency", 0),
            "policy_recency": c.get("policy_recency", 0.0),
            "policy_probation": c.get("policy_probation", 0),
            "policy_protected": c.get("policy_protected", 0),
            "ring_slots": self.store.ring_slots,
            "agents": len(agents),
            "sessions": sum(1 for a in agents for s_ in a.children.values()
                            if isinstance(s_, Dir)),
            "open_handles": len(self.handles),
            "read_requests": self._read_requests,
            "direct_reads": self.store._c["direct_reads"],
            "quant_tensors": self._quant["tensors"],
            "quant_fallbacks": self._quant["fallbacks"],
            "quant_saved_bytes": self._quant["saved_bytes"],
            "page_cache_pushed_bytes": self.pusher.pushed_bytes if self.pusher else 0,
            "page_cache_pushes": self.pusher.pushes if self.pusher else 0,
            "requests_refused": self._refused,
            "private_writers": self._private_writers,
            "uptime_s": round(time.monotonic() - self._started, 3),
        }
        out.update(self.coherence.stats())
        out.update(self.tenants.stats())
        out.update(self.prefetch.stats())
        if self.store.ssd is not None:
            out.update(self.store.ssd.statistics())
        out.update(self.store.remote_statistics())
        return out

    # ---- helpers ----

    def _node(self, ino: int) -> Node:
        try:
            return self.inodes[ino]
        except KeyError:
            raise refuse(errno.ENOENT, "inode %d is unknown", ino) from None

    def _dir(self, ino: int) -> Dir:
        node = self._node(ino)
        if not isinstance(node, Dir):
            raise refuse(errno.ENOTDIR, "inode %d is not a directory", ino)
        return node

    def _new_ino(self) -> int:
        ino = self._next_ino
        self._next_ino += 1
        return ino

    @staticmethod
    def _name(raw: bytes) -> str:
        if len(raw) > NAME_MAX:
            raise refuse(errno.ENAMETOOLONG, "name of %d bytes (NAME_MAX is %d)",
                         len(raw), NAME_MAX)
        return raw.decode("utf-8", "surrogateescape")

    def _attr(self, node: Node, ctx=None) -> pyfuse3.EntryAttributes:
        """node's attributes as the caller sees them: while a slot is open for
        writing, the processes that opened it for writing see the draft (size,
        mtime) and everybody else the published version; neither is cached
        by the kernel then (attr_timeout 0), so each asks again.  Without a
        caller (readdirplus) the writers' view is given: a writer must never
        have its size taken back under its pages; other processes' stat asks
        again anyway."""
        a = pyfuse3.EntryAttributes()
        a.st_ino = node.ino
        a.generation = 0
        a.st_mode = node.mode
        a.st_nlink = node.nlink()
        a.st_uid = node.uid
        a.st_gid = node.gid
        a.st_rdev = 0
        a.st_size = node.size()
        a.st_blocks = node.blocks()
        a.st_atime_ns = node.atime_ns
        a.st_mtime_ns = node.mtime_ns
        a.st_ctime_ns = node.ctime_ns
        if isinstance(node, Pseudo):
            a.st_blksize = 4096
            a.attr_timeout = 0
            a.entry_timeout = 3600
            return a
        a.st_blksize = SLOT_BLKSIZE if isinstance(node, Slot) else 4096
        a.attr_timeout = ATTR_TIMEOUT
        a.entry_timeout = ENTRY_TIMEOUT
        if isinstance(node, Slot) and (node.writers or node.draft is not None):
            a.attr_timeout = 0
            if ctx is None or tgid_of(ctx.pid) in node.writer_pids:
                size = node.draft_size()
                a.st_size = size
                a.st_blocks = max(node.blocks(), (size + 511) // 512)
                if node.changed:
                    a.st_mtime_ns = a.st_ctime_ns = node.draft_mtime_ns
        if isinstance(node, Slot) and not node.version:
            a.entry_timeout = 0         # unpublished: others get ENOENT (lookup)
        return a

    def _entry(self, node: Node, ctx=None) -> pyfuse3.EntryAttributes:
        node.lookups += 1
        return self._attr(node, ctx)

    def _detach(self, node: Node, reason: str) -> None:
        parent = node.parent
        if parent is not None and parent.children.get(node.name) is node:
            del parent.children[node.name]
            parent.mtime_ns = parent.ctime_ns = _now()
        node.detached = reason
        node.ctime_ns = _now()
        self._maybe_forget(node)

    def _maybe_forget(self, node: Node) -> None:
        if node.detached and node.lookups <= 0 and node.handles <= 0:
            self.inodes.pop(node.ino, None)

    def _slot_dropped_any_thread(self, key: bytes, reason: str) -> None:
        """Drops can come from the store's threads: apply them on the trio thread."""
        token = self.trio_token
        if token is None or threading.current_thread() is threading.main_thread():
            self._slot_dropped(key, reason)
            return
        try:
            trio.from_thread.run_sync(self._slot_dropped, key, reason, trio_token=token)
        except trio.RunFinishedError:
            pass

    def _slot_dropped(self, key: bytes, reason: str) -> None:
        """The store let a slot go (eviction, ring, reset): remove its name."""
        node = self._slot_by_key(key)
        if node is None:
            return
        parent = node.parent
        self._detach(node, reason)
        self._forget_entry(parent, node.name)

    def _forget_attrs(self, node: Node) -> None:
        """Make the kernel ask for node's attributes again (its cached size may
        be an older version's).  Attributes only: no page lock, no inode lock
        is taken, so this is safe inside a handler."""
        if self.mounted:
            try:
                pyfuse3.invalidate_inode(node.ino, attr_only=True)
            except OSError:
                pass                    # the kernel does not know this inode

    def _forget_entry(self, parent: Dir, name: str) -> None:
        """Tell the kernel to drop its cached dentry (from pyfuse3's thread)."""
        if self.mounted:
            pyfuse3.invalidate_entry_async(parent.ino, name.encode("utf-8", "surrogateescape"),
                                           ignore_enoent=True)

    def _walk_slots(self, d: Dir) -> Iterator[Slot]:
        for child in d.children.values():
            if isinstance(child, Slot):
                yield child
            elif isinstance(child, Dir):
                yield from self._walk_slots(child)

    # ---- lookup and attributes ----

    async def lookup(self, parent_inode, name, ctx):
        """Find name in a directory; +1 lookup on success."""
        if parent_inode >= FED_INO:
            return await self.fed.lookup(parent_inode, name, ctx)
        parent = self._dir(parent_inode)
        n = self._name(name)
        if n == ".":
            return self._entry(parent)
        if n == "..":
            return self._entry(parent.parent or parent)
        node = parent.children.get(n)
        if node is None and parent.level in SLOT_DIRS and self.store.remote is not None:
            node = await self._remote_name(parent, n)
        if isinstance(node, Slot) and not node.version \
                and tgid_of(ctx.pid) not in node.writer_pids:
            node = None                 # created, never published: not a hit
        if node is None:
            if parent.level in SLOT_DIRS:
                self._lookup_misses += 1
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._entry(node, ctx)

    async def _remote_name(self, sess: "Dir", n: str) -> Optional["Node"]:
        """A name no local tier has: made from the remote tier's manifest (a
        slot another mount published), or None.  Network: off the loop."""
        key = sess.key_of(n)
        try:
            if self.mounted:
                e = await trio.to_thread.run_sync(self.store.remote_lookup, key)
            else:
                e = self.store.remote_lookup(key)
        except Exception:
            log.exception("remote lookup of %s", n)
            return None
        node = sess.children.get(n)
        if node is not None or e is None or sess.detached:
            return node                 # made meanwhile, absent, or the directory went
        m = e.meta
        node = Slot(self._new_ino(), n, sess, int(m.get("mode", 0o644)),
                    int(m.get("uid", sess.uid)), int(m.get("gid", sess.gid)))
        node.version, node.stored = e.version, e.size
        node.pub_size = int(m.get("logical_size", e.size))
        node.mtime_ns = node.ctime_ns = int(m.get("mtime_ns", node.mtime_ns))
        node.atime_ns = int(m.get("atime_ns", node.mtime_ns))
        try:
            node.xattrs = {bytes.fromhex(k): bytes.fromhex(v)
                           for k, v in m.get("xattrs", {}).items()}
        except (ValueError, AttributeError):
            node.xattrs = {}
        sess.children[n] = node
        self.inodes[node.ino] = node
        return node

    async def forget(self, inode_list):
        """The kernel dropped `nlookup` references to each inode."""
        for ino, nlookup in inode_list:
            node = self.inodes.get(ino)
            if node is None:
                continue
            node.lookups -= nlookup
            self._maybe_forget(node)

    async def getattr(self, inode, ctx):
        """Attributes; a slot shows its published version, and its draft to
        the processes writing it (see `_attr`)."""
        if inode >= FED_INO:
            return await self.fed.getattr(inode, ctx)
        return self._attr(self._node(inode), ctx)

    async def setattr(self, inode, attr, fields, fh, ctx):
        """chmod, chown, utimens, truncate (path truncate publishes at once)."""
        if inode >= FED_INO:
            return await self.fed.setattr(inode, attr, fields, fh, ctx)
        node = self._node(inode)
        if isinstance(node, Pseudo) or (isinstance(node, Dir) and node.level == CTL):
            if fields.update_mode or fields.update_uid or fields.update_gid or (
                    (fields.update_atime or fields.update_mtime) and not fields.update_size):
                raise refuse(errno.EPERM, "chmod/chown/utimes of %s: the control plane "
                             "is fixed", node.name)
            return self._attr(node, ctx)    # O_TRUNC of a knob file: nothing to do
        now = _now()
        if fields.update_size:
            if isinstance(node, Dir):
                raise refuse(errno.EISDIR, "truncate of directory %s", node.name)
            if isinstance(node, Slot):
                await self._truncate(node, attr.st_size, fh, ctx)
        if fields.update_mode:
            node.mode = stat.S_IFMT(node.mode) | stat.S_IMODE(attr.st_mode)
        if fields.update_uid:
            node.uid = attr.st_uid
        if fields.update_gid:
            node.gid = attr.st_gid
        if fields.update_atime:
            node.atime_ns = attr.st_atime_ns
        if fields.update_mtime:
            node.mtime_ns = attr.st_mtime_ns
            if isinstance(node, Slot):
                node.draft_mtime_ns = attr.st_mtime_ns
        node.ctime_ns = now
        self._metadata_changed(node, fields.update_mode or fields.update_uid
                               or fields.update_gid or fields.update_mtime)
        return self._attr(node, ctx)

    def _metadata_changed(self, node: Node, persisted: bool = True) -> None:
        """Owner, mode, times or xattrs changed: the SSD tier must learn it."""
        if not persisted:
            return
        if isinstance(node, Slot) and node.version and not node.detached \
                and node.successor is None:
            self.store.mark_dirty(node.key)
        elif isinstance(node, Dir) and node.level in (AGENT, SESSION, SUBDIR):
            self.store.namespace_changed()

    async def _truncate(self, node: Slot, size: int, fh: Optional[int], ctx) -> None:
        """ftruncate, or truncate(2) by a process writing the slot: the shared
        draft.  truncate(2) by anybody else: a new version at once."""
        h = self.handles.get(fh) if fh is not None else None
        if h is not None and h.kind == "pseudo":
            return
        if (h is not None and h.kind == "write") or node.writers:
            if h is not None and h.hold is not None:
                await self.coherence.upgrade(h.hold, bool(h.flags & os.O_NONBLOCK))
            d = self._ensure_draft(node)
            self._draft_call(node, d.truncate, size)
            self._changed(node)
            return
        base = self._native_call(self.store.load, node.key) if node.version else None
        try:
            d = self._draft_from(base, self._logical(base))
        finally:
            if base is not None:
                base.release()
        try:
            self._native_call(d.truncate, size)
        except BaseException:
            d.free()
            raise
        d, logical = self._maybe_quantize(d)
        ref = self._native_call(self.store.publish, d, node.key)
        job = self._published(node, ref, _now(), logical)
        ref.release()
        if job is not None:
            trio.lowlevel.spawn_system_task(self.pusher.run, job)

    # ---- directories ----

    async def mkdir(self, parent_inode, name, mode, ctx):
        """An agent (in the root), a session (in an agent), or a directory
        at any depth below a session; +1 lookup."""
        if parent_inode >= FED_INO:
            return await self.fed.mkdir(parent_inode, name, mode, ctx)
        parent = self._dir(parent_inode)
        n = self._name(name)
        if parent.level == ROOT:
            level = AGENT
        elif parent.level == AGENT:
            level = SESSION
        elif parent.level in SLOT_DIRS:
            level = SUBDIR
        else:
            raise refuse(errno.EPERM, "mkdir %s: the control plane is fixed", n)
        if n in parent.children:
            raise refuse(errno.EEXIST, "mkdir %s: exists", n, level=logging.DEBUG)
        if len(parent.key_of(n)) + 2 > _native.KEY_MAX:
            raise refuse(errno.ENAMETOOLONG, "mkdir %s: no slot would fit below it "
                         "(paths below the mount are at most %d bytes)", n, _native.KEY_MAX)
        gid = parent.gid if parent.mode & stat.S_ISGID else ctx.gid
        d = Dir(self._new_ino(), n, parent, stat.S_IMODE(mode), ctx.uid, gid, level)
        if parent.mode & stat.S_ISGID:
            d.mode |= stat.S_ISGID
        parent.children[n] = d
        parent.mtime_ns = parent.ctime_ns = _now()
        self.inodes[d.ino] = d
        self.trace.emit("MKDIR", level=level, name=n, uid=ctx.uid)
        self.store.namespace_changed()
        return self._entry(d, ctx)

    async def rmdir(self, parent_inode, name, ctx):
        """Remove an empty directory."""
        if parent_inode >= FED_INO:
            return await self.fed.rmdir(parent_inode, name, ctx)
        parent = self._dir(parent_inode)
        n = self._name(name)
        node = parent.children.get(n)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if not isinstance(node, Dir):
            raise refuse(errno.ENOTDIR, "rmdir %s: not a directory", n)
        if node.level == CTL:
            raise refuse(errno.EPERM, "rmdir %s: the control plane is fixed", n)
        if node.children:
            raise refuse(errno.ENOTEMPTY, "rmdir %s: not empty", n, level=logging.DEBUG)
        if QUOTA_XATTR in node.xattrs:
            self.tenants.set_quota(node.name, 0)
        self._detach(node, "rmdir")
        self.store.namespace_changed()

    async def opendir(self, inode, ctx):
        if inode >= FED_INO:
            return await self.fed.opendir(inode, ctx)
        self._dir(inode)
        return inode

    async def readdir(self, fh, start_id, token):
        """List a directory: `.`, `..`, then the children in creation order.
        Each child handed over adds one lookup (the kernel takes none for
        `.` and `..`)."""
        if fh >= FED_INO:
            return await self.fed.readdir(fh, start_id, token)
        d = self._dir(fh)
        items: list[tuple[str, Node]] = [(".", d), ("..", d.parent or d)]
        items += list(d.children.items())
        for i in range(start_id, len(items)):
            name, node = items[i]
            attr = self._attr(node)
            if not pyfuse3.readdir_reply(token, name.encode("utf-8", "surrogateescape"),
                                         attr, i + 1):
                break
            if i >= 2:
                node.lookups += 1

    async def releasedir(self, fh):
        pass

    async def statfs(self, ctx):
        """The memory tier, in 4 KiB blocks."""
        c = self.store.cache.stats()
        s = pyfuse3.StatvfsData()
        s.f_bsize = _native.PAGE_SIZE
        s.f_frsize = _native.PAGE_SIZE
        s.f_blocks = c["capacity"] // _native.PAGE_SIZE
        s.f_bfree = c["free_pages"]
        s.f_bavail = c["free_pages"]
        s.f_files = 1 << 32
        s.f_ffree = s.f_files - len(self.inodes)
        s.f_favail = s.f_ffree
        s.f_namemax = NAME_MAX
        return s

    # ---- names ----

    async def unlink(self, parent_inode, name, ctx):
        """Remove a slot; open readers keep their version until they close."""
        if parent_inode >= FED_INO:
            return await self.fed.unlink(parent_inode, name, ctx)
        parent = self._dir(parent_inode)
        n = self._name(name)
        node = parent.children.get(n)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if isinstance(node, Dir):
            raise refuse(errno.EISDIR, "unlink %s: a directory", n)
        if isinstance(node, Pseudo):
            raise refuse(errno.EPERM, "unlink %s: the control plane is fixed", n)
        self.store.remove(node.key)
        self._detach(node, "unlink")

    async def rename(self, parent_inode_old, name_old, parent_inode_new, name_new,
                     flags, ctx):
        """Move a slot between sessions, a session between agents, or rename an
        agent; replacing a target as rename(2) does."""
        if max(parent_inode_old, parent_inode_new) >= FED_INO:
            return await self.fed.rename(parent_inode_old, name_old, parent_inode_new,
                                         name_new, flags, ctx)
        src_dir = self._dir(parent_inode_old)
        dst_dir = self._dir(parent_inode_new)
        old, new = self._name(name_old), self._name(name_new)
        node = src_dir.children.get(old)
        if node is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        if flags & pyfuse3.RENAME_EXCHANGE:
            raise refuse(errno.EINVAL, "rename %s: RENAME_EXCHANGE is not supported", old)
        if isinstance(node, Pseudo) or (isinstance(node, Dir) and node.level == CTL) \
                or dst_dir.level == CTL:
            raise refuse(errno.EPERM, "rename %s: the control plane is fixed", old)
        level = getattr(node, "level", None)
        want = {AGENT: (ROOT,), SESSION: (AGENT,)}.get(level, SLOT_DIRS)
        if dst_dir.level not in want:
            raise refuse(errno.EPERM, "rename %s: a %s belongs in a %s", old,
                         level or "slot", " or ".join(want))
        if isinstance(node, Dir) and node.contains(dst_dir):
            raise refuse(errno.EINVAL, "rename %s: into itself", old)
        target = dst_dir.children.get(new)
        if target is node:
            return
        if target is not None:
            if flags & pyfuse3.RENAME_NOREPLACE:
                raise refuse(errno.EEXIST, "rename to %s: exists", new, level=logging.DEBUG)
            if isinstance(node, Dir) and not isinstance(target, Dir):
                raise refuse(errno.ENOTDIR, "rename %s over a file", old)
            if not isinstance(node, Dir) and isinstance(target, Dir):
                raise refuse(errno.EISDIR, "rename %s over a directory", old)
            if isinstance(target, Dir) and target.children:
                raise refuse(errno.ENOTEMPTY, "rename over %s: not empty", new)
            if isinstance(target, Dir) and target.level != level:
                raise refuse(errno.EPERM, "rename %s over %s: a %s is not a %s", old, new,
                             level, target.level)
        longest = len(dst_dir.key_of(new)) + self._depth_bytes(node)
        if longest > _native.KEY_MAX:
            raise refuse(errno.ENAMETOOLONG, "rename %s to %s: a path below the mount "
                         "would be %d bytes (at most %d)", old, new, longest, _native.KEY_MAX)
        if isinstance(node, Dir):
            old_keys = [(s, s.key) for s in self._walk_slots(node)]
        else:
            old_keys = [(node, node.key)]
        if target is not None:
            if isinstance(target, Slot) and not (isinstance(node, Slot) and node.version):
                # (a published slot replaces the target in every tier
                # itself, atomically: its durable copy is never removed first)
                self.store.remove(target.key)
            self._detach(target, "replaced")
        del src_dir.children[old]
        node.name, node.parent = new, dst_dir
        dst_dir.children[new] = node
        for slot, key in old_keys:
            if slot.version:
                self.store.rename(key, slot.key)
        if isinstance(node, Dir) and node.level == AGENT:
            # a quota belongs to the agent directory: it follows the name
            if isinstance(target, Dir) and QUOTA_XATTR in target.xattrs:
                self.tenants.set_quota(new, 0)
            if QUOTA_XATTR in node.xattrs:
                self.tenants.set_quota(old, 0)
                self.tenants.set_quota(new, int(node.xattrs[QUOTA_XATTR]))
        now = _now()
        node.ctime_ns = src_dir.mtime_ns = src_dir.ctime_ns = now
        dst_dir.mtime_ns = dst_dir.ctime_ns = now
        if isinstance(node, Dir):
            self.store.namespace_changed()

    def _depth_bytes(self, node: Node) -> int:
        """The longest path below node, "/" included (0 for a slot; a
        directory counts room for a one-byte slot)."""
        if not isinstance(node, Dir):
            return 0
        best = 2
        for name, child in node.children.items():
            best = max(best, 1 + len(name.encode("utf-8", "surrogateescape"))
                       + self._depth_bytes(child))
        return best

    async def link(self, inode, new_parent_inode, new_name, ctx):
        raise refuse(errno.EPERM, "link: slots have one name")

    async def symlink(self, parent_inode, name, target, ctx):
        raise refuse(errno.EPERM, "symlink: only slots and directories live here")

    async def mknod(self, parent_inode, name, mode, rdev, ctx):
        raise refuse(errno.EPERM, "mknod: only slots and directories live here")

    # ---- open, read, write ----

    def _fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    async def create(self, parent_inode, name, mode, flags, ctx):
        """A new slot in a session (or a directory below one), open for
        writing; it is published (as an empty or written version) by the
        opener's close or fsync.  Until then only the writing process finds
        it.  +1 lookup."""
        if parent_inode >= FED_INO:
            return await self.fed.create(parent_inode, name, mode, flags, ctx)
        parent = self._dir(parent_inode)
        n = self._name(name)
        if parent.level not in SLOT_DIRS:
            raise refuse(errno.EPERM, "create %s: a slot belongs in agent/session/ or below",
                         n)
        existing = parent.children.get(n)
        if existing is not None and flags & os.O_EXCL:
            raise pyfuse3.FUSEError(errno.EEXIST)
        key = parent.key_of(n)
        if len(key) > _native.KEY_MAX:
            raise refuse(errno.ENAMETOOLONG, "create %s: the path below the mount is %d "
                         "bytes (at most %d)", n, len(key), _native.KEY_MAX)
        hold = await self.coherence.acquire(key, self.coherence.agent_of(ctx), True,
                                            bool(flags & os.O_NONBLOCK), pid=ctx.pid)
        try:
            fi, entry = await self._create(parent, n, mode, flags, ctx)
        except BaseException:
            self.coherence.release(hold)
            raise
        self._attach(fi, hold)
        return fi, entry

    async def _create(self, parent: Dir, n: str, mode: int, flags: int, ctx):
        node = parent.children.get(n)
        if node is None:
            gid = parent.gid if parent.mode & stat.S_ISGID else ctx.gid
            node = Slot(self._new_ino(), n, parent, stat.S_IMODE(mode), ctx.uid, gid)
            parent.children[n] = node
            parent.mtime_ns = parent.ctime_ns = _now()
            self.inodes[node.ino] = node
        elif flags & os.O_EXCL:
            raise pyfuse3.FUSEError(errno.EEXIST)
        elif not isinstance(node, Slot):
            raise refuse(errno.EISDIR, "create %s: a directory", n)
        elif not flags & os.O_TRUNC and flags & os.O_ACCMODE != os.O_RDONLY:
            # O_CREAT of a name that exists (the kernel asks create when its
            # dentry said no, e.g. a slot another process is creating): an
            # open that keeps the content, joining the writers' draft
            return await self._join(node, flags, ctx)
        elif node.readers > 0 or node.pushing > 0 or node.writers > 0:
            # an existing slot with page-cache readers or other writers: they
            # keep this inode, and the name moves to a fresh one for this
            # writer's whole new version (the last publish wins, untorn)
            node = self._supersede(node)
        if flags & os.O_ACCMODE == os.O_RDONLY:
            # creat(2) for reading: nobody will write, so the empty slot is
            # published at once and the caller reads it
            if not node.version:
                d = self._native_call(self.store.draft)
                ref = self._native_call(self.store.publish, d, node.key)
                self._published(node, ref, _now())
                ref.release()
            ref = self._native_call(self.store.get, node.key)
            fi = self._open_slot(node, flags, ref, ctx=ctx)
            return fi, self._entry(node, ctx)
        fi = self._open_slot(node, flags | os.O_TRUNC, None, ctx=ctx)
        return fi, self._entry(node, ctx)

    async def _join(self, node: Slot, flags: int, ctx):
        """A writer that keeps the content opens node: it shares the writers'
        draft, or starts one from the published version."""
        if node.readers > 0 or node.pushing > 0:
            node = self._supersede(node)        # its page cache is its readers'
        ref = None
        if node.version and node.draft is None and node.base is None:
            # readers that open while the base is read read around the cache
            node.pending[ctx.pid] = time.monotonic() + WRITER_RETRY_S
            try:
                ref = await self._off_loop(self.store.load, node.key)
            except BaseException:
                node.pending.pop(ctx.pid, None)
                raise
            if ref is None:
                node.pending.pop(ctx.pid, None)
                raise refuse(errno.ENOENT, "open %s: the slot left every tier", node.name)
            if node.draft is not None or node.base is not None \
                    or ref.version != node.version:
                ref.release()                   # another writer came first
                ref = None
        fi = self._open_slot(node, flags, ref, ctx=ctx)
        return fi, self._entry(node, ctx)

    async def open(self, inode, flags, ctx):
        """Readers pin the version they open (a snapshot); writers share the
        slot's draft.  First the agent becomes a holder in the coherence
        directory (under protocol 2 this waits for acknowledgements or for a
        writer)."""
        if inode >= FED_INO:
            return await self.fed.open(inode, flags, ctx)
        node = self._node(inode)
        if isinstance(node, Dir):
            raise pyfuse3.FUSEError(errno.EISDIR)
        if isinstance(node, Pseudo):
            return self._open_pseudo(node, flags, ctx)
        live = node
        while live.successor is not None:
            live = live.successor
        hold = await self.coherence.acquire(
            live.key, self.coherence.agent_of(ctx), (flags & os.O_ACCMODE) != os.O_RDONLY,
            bool(flags & os.O_NONBLOCK), pid=ctx.pid)
        try:
            fi = await self._open_version(inode, flags, ctx, retry=self._is_retry(flags, ctx.pid))
        except BaseException:
            self.coherence.release(hold)
            raise
        self._attach(fi, hold)
        return fi

    def _attach(self, fi: pyfuse3.FileInfo, hold: Optional[Hold]) -> None:
        if hold is not None:
            h = self.handles[fi.fh]
            h.hold = hold
            hold.handle = h

    def _is_retry(self, flags: int, pid: int) -> bool:
        """Whether this open of a whole-slot writer is the kernel's retry of
        one we answered ESTALE (it retries once; a second ESTALE would reach
        the application)."""
        sent = self._sent_back.pop(pid, None)
        return bool(flags & os.O_TRUNC) and sent is not None \
            and sent > time.monotonic() - WRITER_RETRY_S

    def _send_back(self, node: Slot, pid: int, flags: int, why: str) -> Refused:
        """ESTALE for a writer: the kernel looks the name up again and
        retries the open once."""
        self._ready_for_writer(node, pid, bool(flags & os.O_TRUNC))
        now = time.monotonic()
        if len(self._sent_back) > 4096:
            self._sent_back = {p: t for p, t in self._sent_back.items()
                               if t > now - WRITER_RETRY_S}
        self._sent_back[pid] = now
        return refuse(errno.ESTALE, "open %s for writing: %s", node.name, why,
                      level=logging.DEBUG)

    def _open_private(self, inode_node: Slot, flags: int, ctx) -> pyfuse3.FileInfo:
        """A whole-slot writer's retried open that still cannot share
        inode_node's draft (other writers are in; never page-cache readers,
        whose pages and size its O_TRUNC would take): its draft is its own,
        written around the page cache (direct_io; no shared mmap), and
        published under the name like any other (the last publish wins)."""
        shadow = Slot(self._new_ino(), inode_node.name, inode_node.parent,
                      stat.S_IMODE(inode_node.mode), inode_node.uid, inode_node.gid)
        shadow.version = inode_node.version or 1   # (never "unpublished": not in the tree)
        shadow.successor = inode_node              # publishes follow the name
        fi = self._open_slot(shadow, flags | os.O_TRUNC, None, ctx=ctx)
        fi.direct_io = True
        self._private_writers += 1
        log.info("%s: a retried writer got a draft of its own (direct I/O)", inode_node.name)
        return fi

    async def _open_version(self, inode, flags, ctx, waited: bool = False, retry: bool = False):
        pid = ctx.pid
        node = self._node(inode)
        acc = flags & os.O_ACCMODE
        inode_node = node               # the inode the kernel opens
        while node.successor is not None:
            node = node.successor       # the one that holds the name now
        if node.detached:
            # unlinked or renamed over while this open was on its way: as if
            # the open came first — a writer's bytes go with the name (they
            # are never published), a reader finds nothing
            if acc == os.O_RDONLY or node.detached not in ("unlink", "replaced"):
                raise refuse(errno.ENOENT, "open %s: the name is gone", node.name,
                             level=logging.DEBUG)
            if node.readers or node.pushing or inode_node.readers or inode_node.pushing:
                # its page cache is its readers' snapshot: look again (the
                # kernel retries; the name is gone, so O_CREAT makes a new one)
                if retry and not inode_node.readers:
                    return self._open_private(inode_node, flags, ctx)
                raise self._send_back(node, pid, flags, "the name is gone, readers keep it")
            return self._open_slot(node, flags | os.O_TRUNC, None, ctx=ctx)
        if not node.version and tgid_of(pid) not in node.writer_pids \
                and (acc == os.O_RDONLY or not node.writers):
            raise refuse(errno.ENOENT, "open %s: not published yet", node.name,
                         level=logging.DEBUG)
        def busy() -> bool:
            # A page-cache push of the last version is being copied into this
            # inode: a writer's pages must not meet it (the kernel builds a
            # write request from the pages after it unlocks them).  Or a
            # writer sent here (ESTALE) to replace the slot finds another
            # writer in: two O_TRUNC writers never share a draft.
            return bool(node.pushing or inode_node.pushing or (
                flags & os.O_TRUNC and pid in node.pending and node.writers) or (
                # a writer whose lookup found an inode that another writer has
                # since left behind (the name moved on): it makes its version
                # there once that writer is done, instead of a second ESTALE
                # (or its readers are done: the kernel's one retry of an open
                # is spent by then, so a wait beats a second ESTALE)
                flags & os.O_TRUNC and node is not inode_node
                and (inode_node.writers or inode_node.readers)))
        if acc != os.O_RDONLY and not waited and busy():
            # pushes take milliseconds, whole-slot writes little more: wait
            # (bounded), then look again
            deadline = trio.current_time() + PUSH_WAIT_S
            while busy() and trio.current_time() < deadline:
                await trio.sleep(0.002)
            return await self._open_version(inode, flags, ctx, waited=True, retry=retry)
        if node is not inode_node:
            # a stale dentry (or a retry that lost a race): readers get the
            # current version on this old inode, around its page cache, which
            # belongs to the older version's readers; writers look again
            if acc != os.O_RDONLY:
                if flags & os.O_TRUNC and not (inode_node.readers or inode_node.pushing
                                               or inode_node.writers):
                    # a whole new version needs no base: made on the inode
                    # this writer found, published under the name (no retry)
                    return self._open_slot(inode_node, flags, None, ctx=ctx)
                if retry and not inode_node.readers:
                    return self._open_private(inode_node, flags, ctx)
                raise self._send_back(node, pid, flags, "a newer inode holds this name")
            ref = None
            if node.version:
                ref = await self._off_loop(self.store.get, node.key)
                if ref is None:
                    raise refuse(errno.ENOENT, "open %s: the slot left every tier", node.name)
            return self._open_slot(inode_node, flags, ref, around_cache=True, ctx=ctx)
        if acc != os.O_RDONLY and (node.pushing > 0 or (flags & os.O_TRUNC and node.writers)
                                   or pid not in node.pending and (
                node.readers > 0 or (flags & os.O_TRUNC and node.writer_pending))):
            # Writers share the inode's page cache with their draft: readers
            # reading a snapshot through that page cache keep this inode, and
            # the writer (the kernel retries the open on ESTALE) goes to a
            # fresh one, which readers read around the page cache until the
            # writer is in.  So does a writer that replaces the whole slot
            # (O_TRUNC) while others write: each makes a whole version, the
            # last publish wins, nobody publishes a mix of two.
            if retry and not inode_node.readers:
                return self._open_private(inode_node, flags, ctx)
            raise self._send_back(node, pid, flags, "readers or writers keep this inode")
        ref = None
        need_base = acc != os.O_RDONLY and not flags & os.O_TRUNC and node.draft is None \
            and node.base is None
        if node.version and (acc == os.O_RDONLY or need_base):
            # readers pin the current version (a lookup: hit or SSD hit); the
            # first writer that keeps the content starts from it
            fn = self.store.get if acc == os.O_RDONLY else self.store.load
            tier = self.store.tier_of(node.key)
            if tier == "ssd" or (tier != "mem" and self.store.remote is not None):
                if acc != os.O_RDONLY:
                    # a reader that opens while the base is read must read
                    # around the page cache that this writer will use
                    node.pending[pid] = time.monotonic() + WRITER_RETRY_S
                try:
                    ref = await self._off_loop(fn, node.key)  # read back from SSD or remote
                except BaseException:
                    if acc != os.O_RDONLY:
                        node.pending.pop(pid, None)
                    raise
            else:
                ref = self._native_call(fn, node.key)
            if ref is None:
                node.pending.pop(pid, None)
                raise refuse(errno.ENOENT, "open %s: the slot left every tier", node.name)
            if tier != "mem":
                self._settle_quota(node.key)    # brought in: its agent stays in its quota
            if self.store.remote is not None and tier not in ("mem", "ssd") \
                    and node.successor is None and not node.detached and not node.writers:
                # the remote tier may have had another mount's newer version
                # than the manifest this name was made from: show that one
                logical = self._logical(ref)
                size = len(logical) if logical is not None else ref.size
                if (ref.version, size) != (node.version, node.pub_size):
                    node.version, node.stored, node.pub_size = ref.version, ref.stored, size
                    self._forget_attrs(node)
        # While the SSD read ran, a publish may have moved this inode on to a
        # newer version: then this reader's version must stay out of its pages.
        stale = ref is not None and (ref.version != node.version
                                     or node.successor is not None or bool(node.detached))
        if stale and acc != os.O_RDONLY:
            ref.release()
            raise self._send_back(node, pid, flags, "a newer version landed meanwhile")
        return self._open_slot(node, flags, ref, around_cache=stale, ctx=ctx)

    async def _off_loop(self, fn, *args):
        """Run blocking store work (SSD I/O) in a worker thread while the loop
        serves other requests; inline when not mounted (tests)."""
        try:
            if self.mounted:
                return await trio.to_thread.run_sync(fn, *args)
            return fn(*args)
        except OSError as e:
            self._refused += 1
            raise refuse(e.errno or errno.EIO, "%s", e, level=logging.WARNING) from None

    def _open_pseudo(self, node: Pseudo, flags: int, ctx=None) -> pyfuse3.FileInfo:
        """The mode is enforced here too (a mount without default_permissions
        must not open the trace or the knobs to every uid): root gets the
        owner bits, every other uid the other bits."""
        acc = flags & os.O_ACCMODE
        uid = ctx.uid if ctx is not None else 0
        bits = (node.mode >> 6) & 7 if uid == 0 else node.mode & 7
        if acc != os.O_WRONLY and not bits & 4:
            raise refuse(errno.EACCES, "open %s for reading by uid %d: mode %o",
                         node.name, uid, stat.S_IMODE(node.mode))
        if acc != os.O_RDONLY and not bits & 2:
            raise refuse(errno.EACCES, "open %s for writing by uid %d: mode %o",
                         node.name, uid, stat.S_IMODE(node.mode))
        fh = self._fh()
        h = Handle(fh, node, flags, "pseudo")
        if acc != os.O_WRONLY and node.read is not None:
            h.data = node.read().encode()
        self.handles[fh] = h
        node.handles += 1
        fi = pyfuse3.FileInfo(fh=fh)
        fi.direct_io = True
        fi.keep_cache = False
        return fi

    def _open_slot(self, node: Slot, flags: int, ref: Optional["_native.Ref"],
                   around_cache: bool = False, ctx=None) -> pyfuse3.FileInfo:
        """A handle on node; `ref` (pinned, taken over) is the reader's
        version or the writers' base."""
        acc = flags & os.O_ACCMODE
        fh = self._fh()
        fi = pyfuse3.FileInfo(fh=fh)
        pid = ctx.pid if ctx is not None else 0
        uid = ctx.uid if ctx is not None else 0
        if acc == os.O_RDONLY and ref is not None:
            try:
                self.tenants.hold(uid, node.ino, ref)
            except OverLimit as e:
                ref.release()
                raise refuse(errno.EDQUOT, "open %s: %s", node.name, e,
                             level=logging.WARNING) from None
        if acc == os.O_RDONLY:
            h = Handle(fh, node, flags, "read")
            h.uid = uid
            h.ref = ref
            h.decoded = self._logical(ref)
            version = ref.version if ref is not None else 0
            if node.writers or node.writer_pending or around_cache:
                # The writers' draft lives in this inode's page cache: read
                # around it.
                fi.direct_io = True
                h.dio = True
            else:
                with PUSH_LOCK:
                    fi.keep_cache = node.cache_version in (version, -1)
                    node.cache_version = version
            if not h.dio:
                if node.writers:
                    log.error("internal check failed: a page-cache reader on %s (inode %d) beside %d writers",
                              node.name, node.ino, node.writers)
                node.readers += 1
            node.atime_ns = _now()
        else:
            if node.readers or node.pushing:
                log.error("internal check failed: a writer on %s (inode %d) beside %d page-cache readers, %d pushes",
                          node.name, node.ino, node.readers, node.pushing)
            h = Handle(fh, node, flags, "write")
            h.opener = tgid_of(pid)
            h.uid = uid
            if flags & os.O_TRUNC:
                if ref is not None:
                    ref.release()
                self._release_base(node)
                if node.draft is None:
                    node.draft = self._native_call(self.store.draft)
                else:
                    self._draft_call(node, node.draft.truncate, 0)
                self._changed(node)
            elif ref is not None:
                node.base = ref
                node.base_decoded = self._logical(ref)
            # Writers go through the page cache (shared mmap works, the kernel
            # keeps their size and O_APPEND offsets), which is theirs alone:
            # readers of this inode read around it while a writer is open.
            fi.keep_cache = False
            node.cache_version = -2
            node.writers += 1
            node.writer_pids[h.opener] += 1
            node.pending.pop(pid, None)           # the writer sent here is in
        self.handles[fh] = h
        node.handles += 1
        return fi

    async def read(self, fh, off, size):
        """Bytes of the handle's version (a reader's snapshot, the writers' draft)."""
        if fh in self.fed.handles:
            return await self.fed.read(fh, off, size)
        h = self.handles[fh]
        if h.kind == "pseudo":
            return h.data[off:off + size]
        self._read_requests += 1
        if h.hold is not None and h.hold.revoked:
            raise refuse(errno.ESTALE, "read %s: the handle's hold was revoked (reopen it)",
                         h.node.name)
        if h.kind == "read":
            if h.decoded is not None:
                return h.decoded[off:off + size]
            return h.ref.read(off, size) if h.ref is not None else b""
        node = h.node
        if node.draft is not None:
            return node.draft.read(off, size)
        if node.base_decoded is not None:
            return node.base_decoded[off:off + size]
        return node.base.read(off, size) if node.base is not None else b""

    async def write(self, fh, off, buf):
        """Into the writers' shared draft; visible to others once the opener
        closes or fsyncs.  A refused write changes nothing."""
        if fh in self.fed.handles:
            return await self.fed.write(fh, off, buf)
        h = self.handles[fh]
        if h.kind == "pseudo":
            return self._write_pseudo(h, off, buf)
        if h.kind != "write":
            raise refuse(errno.EBADF, "write on a read handle")
        writeback, self._writeback = self._writeback == (fh, off), None
        if h.hold is not None:
            await self.coherence.upgrade(h.hold, bool(h.flags & os.O_NONBLOCK))
        node = h.node
        d = self._ensure_draft(node)
        if h.append and off != d.size and not writeback:
            # the kernel placed this append by a size another process's stat
            # gave it: the record goes to the end all the same, and the
            # kernel's copy of these pages is dropped
            off = d.size
            self._invalidate_pages(node)
        self._fair_share(h, node, d, off + len(buf))
        self._draft_call(node, d.write, off, buf)
        self._changed(node)
        return len(buf)

    def _fair_share(self, h: Handle, node: Slot, d: "_native.Draft", end: int) -> None:
        """Before a draft grows to end bytes: the writer's uid stays within
        hold_max_per_uid and the agent within its quota (making room from
        its own slots first).  EDQUOT otherwise; nothing changes."""
        if end <= d.size:
            return
        self.tenants.draft_started(h.uid, node)
        try:
            self.tenants.check_draft(h.uid, node, end)
            agent = node.key.split(b"/", 1)[0].decode("utf-8", "surrogateescape")
            self.tenants.make_room(agent, end, keep=None)
        except OverLimit as e:
            self._refused += 1
            raise refuse(errno.EDQUOT, "write %s: %s", node.name, e,
                         level=logging.WARNING) from None

    def fallocate(self, fh: int, mode: int, offset: int, length: int) -> int:
        """fallocate(2) (through memosfs._fuseshim, on the trio thread):
        mode 0 extends the writers' draft to offset+length (zeros); other
        modes are EOPNOTSUPP.  Returns an errno (0: done)."""
        h = self.handles.get(fh)
        if h is None or h.kind != "write":
            return errno.EBADF
        if mode != 0:
            log.info("refused (EOPNOTSUPP): fallocate mode %#x on %s", mode, h.node.name)
            return errno.EOPNOTSUPP
        if offset < 0 or length <= 0:
            return errno.EINVAL
        node = h.node
        try:
            d = self._ensure_draft(node)
            if offset + length > d.size:
                self._fair_share(h, node, d, offset + length)
                self._draft_call(node, d.truncate, offset + length)
                self._changed(node)
        except pyfuse3.FUSEError as e:
            return e.errno
        return 0

    def _write_pseudo(self, h: Handle, off: int, buf: bytes) -> int:
        node = h.node
        assert isinstance(node, Pseudo) and node.write is not None
        text = (h.data[:off] + buf) if off else buf
        try:
            node.write(text.decode("utf-8", "surrogateescape"))
        except KnobError as e:
            self._refused += 1
            raise refuse(errno.EINVAL, "%s: %s", node.name, e, level=logging.WARNING)
        except OSError as e:
            self._refused += 1
            raise refuse(e.errno or errno.EIO, "%s: %s", node.name, e,
                         level=logging.WARNING)
        h.data = text
        return len(buf)

    def _changed(self, node: Slot) -> None:
        node.changed = True
        node.draft_mtime_ns = _now()

    def _draft_call(self, node: Slot, fn, *args):
        """A change to the draft; refused, it changes nothing (the C core
        leaves a draft as it was when a write or truncate fails)."""
        try:
            return self._native_call(fn, *args)
        except pyfuse3.FUSEError:
            node.write_failed = True
            raise

    def _ensure_draft(self, node: Slot) -> "_native.Draft":
        """The writers' draft, made from the base at the first change."""
        if node.draft is None:
            node.draft = self._draft_from(node.base, node.base_decoded)
            self._release_base(node)    # the draft holds its own copy now: let the
                                        # published version be evicted if need be
        return node.draft

    def _release_base(self, node: Slot) -> None:
        if node.base is not None:
            node.base.release()
            node.base = None
        node.base_decoded = None

    def _draft_from(self, base: Optional["_native.Ref"],
                    decoded: Optional[bytes]) -> "_native.Draft":
        """A draft holding a version's logical bytes."""
        if decoded is None and base is not None and not isinstance(base, _native.Ref):
            decoded = base.read(0, base.size)          # a version read from its file
        if decoded is None:
            return self._native_call(self.store.draft, base)
        d = self._native_call(self.store.draft)
        try:
            self._native_call(d.write, 0, decoded)
        except BaseException:
            d.free()
            raise
        return d

    # ---- quantized storage ----

    def _logical(self, ref: Optional["_native.Ref"]) -> Optional[bytes]:
        """The logical bytes of a quantized version (decoded once, shared by
        its readers); None for a version stored as it was written."""
        if ref is None or ref.size < 16 or not kvfile.is_container(ref.read(0, 16)):
            return None
        key = (ref.key, ref.version)
        data = self._decoded.get(key)
        if data is None:
            view = ref.read(0, ref.size)
            try:
                data = kvfile.decode(memoryview(view))
            except (ValueError, KeyError) as e:
                log.error("slot %s v%d: quantized form unreadable: %s",
                          ref.key.decode("utf-8", "replace"), ref.version, e)
                raise refuse(errno.EIO, "slot %s cannot be decoded", ref.key) from None
            self._remember_decoded(key, data)
        return data

    def _remember_decoded(self, key: tuple, data: bytes) -> None:
        self._decoded[key] = data
        self._decoded.move_to_end(key)
        total = sum(len(v) for v in self._decoded.values())
        while total > DECODED_CACHE_BYTES and len(self._decoded) > 1:
            _, old = self._decoded.popitem(last=False)
            total -= len(old)

    def _maybe_quantize(self, d: "_native.Draft") -> tuple["_native.Draft", Optional[bytes]]:
        """With `quantize` on, a safetensors draft becomes its quantized
        container; returns (draft to publish, logical bytes or None)."""
        scheme = self.knobs["quantize"]
        if scheme == "off" or d.size < 16:
            return d, None
        result = kvfile.encode(memoryview(d.read(0, d.size)), scheme,
                               quant_error_limit(scheme, self.knobs["quant_error_max"]))
        if result is None:
            return d, None
        self._quant["fallbacks"] += result.fallbacks
        if result.container is None:
            return d, None
        self._quant["tensors"] += result.quantized
        self._quant["saved_bytes"] += len(result.logical) - len(result.container)
        q = self._native_call(self.store.draft)
        try:
            self._native_call(q.write, 0, result.container)
        except BaseException:
            q.free()
            raise
        d.free()
        return q, result.logical

    def _native_call(self, fn, *args):
        """Call into the store; its OSErrors become the caller's errno."""
        try:
            return fn(*args)
        except OSError as e:
            self._refused += 1
            raise refuse(e.errno or errno.EIO, "%s", e, level=logging.WARNING) from None
        except ValueError as e:
            self._refused += 1
            raise refuse(errno.EINVAL, "%s", e, level=logging.WARNING) from None

    def ioctl(self, fh: int, cmd: int, pid: int) -> int:
        """From memosfs._fuseshim (trio thread): ioctl(2) on an open file.
        MEMOS_IOC_ACK acknowledges the invalidation of the handle's agent —
        the way a holder without write permission (no user.* xattrs) acks
        without closing; EINVAL when there is nothing to acknowledge.
        Returns an errno (0: done)."""
        h = self.handles.get(fh)
        if h is None or fh in self.fed.handles or h.kind == "pseudo":
            return errno.ENOTTY
        if cmd != MEMOS_IOC_ACK:
            log.debug("ioctl %#x on %s by pid %d: not ours (ENOTTY)", cmd, h.node.name, pid)
            return errno.ENOTTY
        hold = h.hold
        if hold is None or hold.revoked or not self.coherence.ack(hold.key, hold.agent):
            self._refused += 1
            refuse(errno.EINVAL, "MEMOS_IOC_ACK on %s by pid %d: %s", h.node.name, pid,
                   "the handle holds nothing (protocol 0)" if hold is None else
                   "its hold was revoked" if hold.revoked else
                   f"{agent_name(hold.agent)} has no invalidation to acknowledge")
            return errno.EINVAL
        return 0

    def coherence_interrupt(self, pid: int) -> None:
        """From memosfs._fuseshim: the kernel interrupted an open or create of
        thread pid; a coherence wait it is in ends with EINTR."""
        self.coherence.interrupt(pid)

    def _write_note(self, fh: int, off: int, writepage: int) -> None:
        """From memosfs._fuseshim, just before write(fh, off): whether the
        kernel writes back cached pages (their offset holds, O_APPEND or not)."""
        self._writeback = (fh, off) if writepage else None

    def _flush_note(self, fh: int, pid: int, lock_owner: int) -> None:
        """From memosfs._fuseshim, just before flush(fh) runs: who closes."""
        self._flusher = (fh, pid)

    async def flush(self, fh):
        """close(2) of one descriptor.  Publishes the draft only when the
        closing process is the one that opened this handle for writing (its
        threads included): a forked or exec'd child closing an inherited
        copy publishes nothing.  Returns once the new version is in the
        kernel page cache too."""
        if fh in self.fed.handles:
            return await self.fed.flush(fh)
        note, self._flusher = self._flusher, None
        h = self.handles[fh]
        if h.kind != "write" or not h.node.changed:
            return
        if note is not None and note[0] == fh and note[1] != h.opener \
                and tgid_of(note[1]) != h.opener:
            log.debug("%s: closed by pid %d, not by its opener %d: not published",
                      h.node.name, note[1], h.opener)
            return
        job = self._publish(h)
        if job is not None:
            try:
                await self.pusher.run(job)
            except Exception:           # a push failure is the push's problem
                log.warning("page-cache push of %s failed", h.node.name, exc_info=True)

    async def fsync(self, fh, datasync):
        """Publish, then return once this slot's version is durable on the SSD."""
        if fh in self.fed.handles:
            return await self.fed.fsync(fh, datasync)
        h = self.handles[fh]
        if h.kind == "pseudo":
            return
        node = h.node
        if h.kind == "write" and node.changed:
            job = self._publish(h)
            if job is not None:
                # not awaited: the kernel holds this inode's lock during fsync,
                # and the push's attribute refresh may wait on a lock held by
                # someone who waits for that one
                trio.lowlevel.spawn_system_task(self.pusher.run, job)
        while isinstance(node, Slot) and node.successor is not None:
            node = node.successor
        if isinstance(node, Slot) and node.version and not node.detached:
            await self._off_loop(self.store.persist, node.key)

    async def fsyncdir(self, fh, datasync):
        """fsync of a directory: every rename, unlink and mkdir made so far
        is durable when it returns."""
        if fh >= FED_INO:
            return
        sync = getattr(self.store, "sync_namespace", None)
        if sync is not None:
            await self._off_loop(sync)

    async def release(self, fh):
        """The last copy of a descriptor is gone: the last writer of a slot
        publishes what its opener left unpublished (a child's writes after
        the opener closed, or an opener that died); unpin, free."""
        if fh in self.fed.handles:
            return await self.fed.release(fh)
        h = self.handles.pop(fh)
        node = h.node
        try:
            if h.kind == "write" and node.writers == 1 and node.changed:
                try:
                    job = self._publish(h)
                except pyfuse3.FUSEError:
                    job = None  # already logged; release cannot report it
                if job is not None:
                    trio.lowlevel.spawn_system_task(self.pusher.run, job)
        finally:
            if h.ref is not None:
                if h.kind == "read":
                    self.tenants.unhold(h.uid, node.ino, h.ref)
                h.ref.release()
            self.coherence.release(h.hold)
            node.handles -= 1
            if isinstance(node, Slot):
                if h.kind == "read" and not h.dio:
                    node.readers -= 1
                elif h.kind == "write":
                    self._writer_gone(node, h)
            self._maybe_forget(node)

    def _writer_gone(self, node: Slot, h: Handle) -> None:
        node.writers -= 1
        node.writer_pids[h.opener] -= 1
        if node.writer_pids[h.opener] <= 0:
            del node.writer_pids[h.opener]
        if node.writers:
            return
        # the last writer: its draft goes; the pages it left in the kernel
        # are the published version's when everything was published
        clean = not node.changed and node.base_decoded is None   # (quantized: the
                                        # published bytes are not the written ones)
        if node.draft is not None:
            node.draft.free()
            node.draft = None
        self._release_base(node)
        node.changed = node.write_failed = False
        with PUSH_LOCK:
            # the writers' pages are not trusted to be the published version
            # (the kernel may have kept pages of several drafts): only a push
            # of it (flush) makes this inode's pages a version's
            if not (clean and node.version and node.cache_version == node.version):
                node.cache_version = -2
        self._forget_attrs(node)
        if not node.version and not node.detached and node.parent is not None:
            # created and never published (its writes were refused): the
            # failed create leaves nothing behind
            parent = node.parent
            log.info("%s: never published; the name goes", node.name)
            self._detach(node, "unpublished")
            self._forget_entry(parent, node.name)

    # ---- publish ----

    def _publish(self, h: Handle) -> Optional[tuple]:
        """Publish the writers' draft; returns a page-cache push to run, if any."""
        node = h.node
        assert isinstance(node, Slot)
        while node.successor is not None:
            node = node.successor
        src = h.node
        if node.detached in ("unlink", "replaced", "unpublished") or node.parent is None \
                or node.parent.detached:
            # Written to a name that is gone: the bytes go with it (POSIX).
            src.changed = False
            return None
        if not node.version and src.write_failed and src.draft_size() == 0:
            # a create whose writes were all refused: nothing to publish (the
            # name goes with the last writer)
            src.changed = False
            return None
        d = self._ensure_draft(src)
        # The writers go on from what is published now: their draft moves to
        # the store, they keep a (lazily copied) base.
        src.draft = None
        try:
            d, logical = self._maybe_quantize(d)
        except BaseException:
            src.draft = d
            raise
        key = node.key
        try:
            ref = self._native_call(self.store.publish, d, key)
        except BaseException:
            # nothing changes: the writers keep their draft
            if logical is None:
                src.draft = d
            else:
                d.free()
                src.draft = self._draft_from(None, logical)
            raise
        self._settle_quota(key)
        self._release_base(src)
        src.base = ref                  # the writers go on from this version
        src.base_decoded = logical
        if logical is not None:
            self._remember_decoded((key, ref.version), logical)
        src.changed = False
        src.write_failed = False
        self.coherence.published(h.hold)
        parent = node.parent
        current = parent.children.get(node.name)
        if node.detached:                      # dropped by the cache meanwhile
            if current is None:
                node.detached = None
                parent.children[node.name] = node
                current = node
        target = current if isinstance(current, Slot) else node
        return self._published(target, ref, src.draft_mtime_ns or _now(), logical)

    def _settle_quota(self, key: bytes) -> None:
        """After a publish: an agent beyond its quota moves its own least
        recently used slots (not this one) to the SSD tier."""
        agent = key.split(b"/", 1)[0].decode("utf-8", "surrogateescape")
        if agent not in self.tenants.quotas:
            return
        try:
            self.tenants.make_room(agent, 0, keep=key)
        except OverLimit as e:
            log.warning("%s: %s (it stays beyond its quota until its slots can go)",
                        key.decode("utf-8", "replace"), e)

    def _published(self, node: Slot, ref: "_native.Ref", mtime_ns: int,
                   logical: Optional[bytes] = None) -> Optional[tuple]:
        """Point the name at the new version: in place, or on a fresh inode
        when readers hold this one (they keep their snapshot)."""
        if node.readers > 0 or node.pushing > 0:
            node = self._supersede(node)
        node.cache_version = -2 if node.writers else node.cache_version
        node.version = ref.version
        node.pub_size = len(logical) if logical is not None else ref.size
        node.stored = ref.stored
        node.mtime_ns = mtime_ns
        node.ctime_ns = _now()
        self._forget_attrs(node)
        if self.pusher is not None and self.knobs["page_cache_push"] == "1" \
                and node.pub_size >= PUSH_MIN_BYTES \
                and not node.writers and not node.writer_pending:
            # (with writers open, the page cache holds their draft: no push)
            pin = self.store.peek(node.key)
            if pin is not None:
                source = pin if logical is None else BytesSource(logical, pin)
                return self.pusher.claim(node, source)
        return None

    def _ready_for_writer(self, node: Slot, pid: int = 0, trunc: bool = True) -> None:
        """Before an O_TRUNC writer is sent back (ESTALE) to look the name up
        again: make sure what it will find has no page-cache readers, and
        stays so until it arrives (readers meanwhile read around the cache),
        so the kernel's one retry succeeds."""
        if node.readers > 0 or node.pushing > 0 or (trunc and (node.writers > 0
                                                               or node.writer_pending)):
            node = self._supersede(node)
        # By pid (the kernel retries from the same thread): several writers may
        # have been sent here, and each must find no page-cache readers on its
        # one retry, however many other writers come and go meanwhile.
        node.pending[pid] = time.monotonic() + WRITER_RETRY_S

    def _supersede(self, node: Slot) -> Slot:
        """Give node's name a fresh inode holding the same version; node keeps
        serving the handles open on it (their snapshot) and answers ESTALE to
        new opens, which makes the kernel look the name up again."""
        new = Slot(self._new_ino(), node.name, node.parent, stat.S_IMODE(node.mode),
                   node.uid, node.gid)
        new.xattrs = dict(node.xattrs)
        new.atime_ns, new.mtime_ns, new.ctime_ns = node.atime_ns, node.mtime_ns, node.ctime_ns
        new.version, new.pub_size, new.stored = node.version, node.pub_size, node.stored
        # writers sent (ESTALE) to look this name up will find the new inode
        new.pending, node.pending = node.pending, {}
        node.parent.children[node.name] = new
        node.successor = new
        self.inodes[new.ino] = new
        self._forget_entry(node.parent, node.name)
        return new

    def start_kernel_notifications(self, mountpoint: str) -> None:
        """Called once mounted: dentry invalidations and page-cache pushes."""
        self.mounted = True
        self.mountpoint = mountpoint
        self.pusher = PageCachePusher(pyfuse3.notify_store, pyfuse3.invalidate_inode,
                                      self._refresh_kernel_attrs)
        self.fed.start()                # notifications on; resume interrupted rounds

    def _refresh_kernel_attrs(self, node: Slot) -> None:
        """From a worker thread: have the slot stat'ed through the mount, so the
        kernel holds its new mtime and size (the trio thread serves it)."""
        self._refresher.stat(os.path.join(self.mountpoint, os.fsdecode(node.key)))

    def stop_kernel_notifications(self) -> None:
        self.fed.stop()
        if self.pusher is not None:
            self.pusher.close()
            self.pusher = None
        self._refresher.close()
        self.mounted = False

    # ---- extended attributes ----

    _MEMOS_ATTRS = (b"user.memos.tier", b"user.memos.dirty", b"user.memos.version",
                    b"user.memos.hits", b"user.memos.stored_bytes", b"user.memos.pin")

    def _memos_attr(self, node: Slot, name: bytes) -> bytes:
        ref = self.store.peek(node.key) if node.version else None
        if ref is None:
            entry = self.store.ssd_entry(node.key) if node.version else None
            if entry is None and node.version and self.store.tier_of(node.key) == "remote":
                return {b"user.memos.tier": b"remote",
                        b"user.memos.version": str(node.version).encode(),
                        b"user.memos.stored_bytes": str(node.stored).encode()}.get(
                            name, b"0")
            if entry is None:
                return {b"user.memos.tier": b"none", b"user.memos.version": b"0"}.get(
                    name, b"0")
            return {b"user.memos.tier": b"ssd",
                    b"user.memos.version": str(entry.version).encode(),
                    b"user.memos.stored_bytes": str(entry.file_bytes).encode()}.get(
                        name, b"0")
        try:
            values = {
                b"user.memos.tier": b"mem",
                b"user.memos.dirty": b"1" if ref.dirty else b"0",
                b"user.memos.version": str(ref.version).encode(),
                b"user.memos.hits": str(ref.hits).encode(),
                b"user.memos.stored_bytes": str(ref.stored).encode(),
                b"user.memos.pin": b"1" if ref.sticky else b"0",
            }
            return values[name]
        finally:
            ref.release()

    async def getxattr(self, inode, name, ctx):
        if inode >= FED_INO:
            return await self.fed.getxattr(inode, name, ctx)
        node = self._node(inode)
        if isinstance(node, Slot) and name == b"user.memos.state":
            while node.successor is not None:
                node = node.successor
            return self.coherence.state(node.key, self.coherence.agent_of(ctx)).encode()
        if isinstance(node, Slot) and name in self._MEMOS_ATTRS:
            return self._memos_attr(node, name)
        if name == USAGE_XATTR and isinstance(node, Dir) and node.level == AGENT:
            t = self.tenants.usage(node.name) if QUOTA_XATTR in node.xattrs else None
            return str(t[1] if t else 0).encode()
        try:
            return node.xattrs[name]
        except KeyError:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR) from None

    async def listxattr(self, inode, ctx):
        if inode >= FED_INO:
            return await self.fed.listxattr(inode, ctx)
        node = self._node(inode)
        names = list(self._MEMOS_ATTRS) + [b"user.memos.state"] \
            if isinstance(node, Slot) else []
        if QUOTA_XATTR in node.xattrs:
            names.append(USAGE_XATTR)
        return names + list(node.xattrs)

    async def setxattr(self, inode, name, value, ctx):
        if inode >= FED_INO:
            return await self.fed.setxattr(inode, name, value, ctx)
        node = self._node(inode)
        if name == b"user.memos.ack" and isinstance(node, Slot):
            # the caller acknowledges that its copy of this slot is stale
            while node.successor is not None:
                node = node.successor
            agent = self.coherence.agent_of(ctx)
            if not self.coherence.ack(node.key, agent):
                raise refuse(errno.EINVAL, "ack %s: %s has no invalidation to acknowledge",
                             node.name, agent_name(agent))
            return
        if name == b"user.memos.pin" and isinstance(node, Slot):
            if value.strip() not in (b"0", b"1"):
                raise refuse(errno.EINVAL, "user.memos.pin takes 0 or 1, not %r", value)
            while node.successor is not None:
                node = node.successor
            if not node.version:
                raise refuse(errno.ENOENT, "pin %s: nothing published yet", node.name)
            on = value.strip() == b"1"
            ref = self.store.peek(node.key)
            if ref is None and not on:
                return                          # not in memory: not pinned
            if ref is None:                     # on the SSD (or remote) tier: bring it in
                ref = await self._off_loop(self.store.load, node.key)
                if ref is None:
                    raise refuse(errno.ENOENT, "pin %s: the slot left every tier", node.name)
                if not isinstance(ref, _native.Ref):
                    ref.release()
                    raise refuse(errno.ENOSPC, "pin %s: the memory tier cannot take it",
                                 node.name)
            try:
                if on:
                    self.tenants.check_pin(ctx.uid, node, ref)
            except OverLimit as e:
                ref.release()
                self._refused += 1
                raise refuse(errno.EDQUOT, "pin %s: %s", node.name, e,
                             level=logging.WARNING) from None
            ref.sticky = on
            self.tenants.pinned(ctx.uid, node, ref, on)
            ref.release()
            self.trace.emit("PIN", key=node.key.decode("utf-8", "replace"),
                            on=value.strip().decode())
            return
        if name == QUOTA_XATTR:
            return self._set_quota(node, bytes(value), ctx)
        if name.startswith(b"user.memos."):
            raise refuse(errno.EPERM, "%s is read-only", name.decode("utf-8", "replace"))
        if not name.startswith(b"user.") or isinstance(node, Pseudo) \
                or (isinstance(node, Dir) and node.level == CTL):
            raise refuse(errno.ENOTSUP, "xattr %s: only user.* attributes are kept",
                         name.decode("utf-8", "replace"))
        node.xattrs[name] = bytes(value)
        node.ctime_ns = _now()
        self._metadata_changed(node)

    def _set_quota(self, node: Node, value: bytes, ctx) -> None:
        """user.memos.quota on an agent directory (root only): its share of
        the memory tier, in bytes (4G, 512M; 0 takes it away)."""
        if not isinstance(node, Dir) or node.level != AGENT:
            raise refuse(errno.EINVAL, "user.memos.quota belongs on an agent directory")
        if ctx.uid != 0:
            raise refuse(errno.EPERM, "user.memos.quota on %s: only root sets quotas "
                         "(uid %d tried)", node.name, ctx.uid, level=logging.WARNING)
        try:
            text = value.decode("ascii").strip()
            n = parse_size(text) if text else -1
        except (UnicodeDecodeError, KnobError):
            n = -1
        if n < 0 or n > 1 << 50:
            raise refuse(errno.EINVAL, "user.memos.quota on %s: %r is not a size "
                         "(bytes, or 512M, 4G)", node.name, value)
        try:
            self.tenants.set_quota(node.name, n)
        except (ValueError, OSError) as e:
            raise refuse(errno.ENOSPC if isinstance(e, OSError) else errno.EINVAL,
                         "user.memos.quota on %s: %s", node.name, e,
                         level=logging.WARNING) from None
        if n:
            node.xattrs[QUOTA_XATTR] = str(n).encode()
        else:
            node.xattrs.pop(QUOTA_XATTR, None)
        log.info("agent %s: quota %d bytes", node.name, n)
        node.ctime_ns = _now()
        self.store.namespace_changed()
        if n:
            try:
                self.tenants.make_room(node.name, 0)
            except OverLimit as e:
                log.warning("%s (its slots stay until they can go)", e)

    async def removexattr(self, inode, name, ctx):
        if inode >= FED_INO:
            return await self.fed.removexattr(inode, name, ctx)
        node = self._node(inode)
        if name == QUOTA_XATTR and isinstance(node, Dir) and QUOTA_XATTR in node.xattrs:
            return self._set_quota(node, b"0", ctx)
        if name.startswith(b"user.memos."):
            raise refuse(errno.EPERM, "%s is read-only", name.decode("utf-8", "replace"))
        if node.xattrs.pop(name, None) is None:
            raise pyfuse3.FUSEError(pyfuse3.ENOATTR)
        node.ctime_ns = _now()
        self._metadata_changed(node)

    # ---- coherence ----

    async def poll(self, inode, fh, ph, ctx):
        """POLLPRI once another agent's write invalidated this handle's copy."""
        h = self.handles.get(fh)
        if h is None:
            raise pyfuse3.FUSEError(errno.EBADF)
        return self.coherence.poll(h.hold, ph)

    def _invalidate_pages(self, node: Node) -> None:
        """An invalidation reached the holders of node: drop the kernel's
        cached pages of it (from a worker thread: the kernel may call back)."""
        if not self.mounted or not isinstance(node, Slot):
            return
        ino = node.ino
        trio.lowlevel.spawn_system_task(self._invalidate_inode_off_loop, ino)

    async def _drop_pages_now(self, node: Node) -> None:
        """As _invalidate_pages, but returns once the kernel dropped them."""
        if self.mounted and isinstance(node, Slot):
            await self._invalidate_inode_off_loop(node.ino)

    async def _invalidate_inode_off_loop(self, ino: int) -> None:
        try:
            await trio.to_thread.run_sync(pyfuse3.invalidate_inode, ino, False)
        except OSError as e:          # the kernel forgot the inode: nothing cached
            log.debug("invalidate_inode(%d): %s", ino, e)

    async def background(self) -> None:
        """Long-running tasks of a mounted filesystem (run by the CLI)."""
        await self.coherence.batch_loop()

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
        assert named == live, f"namespace {sorted(named - live)} vs store {sorted(live - named)}"
        readers: dict[int, int] = {}
        for h in self.handles.values():
            if h.kind == "read" and not h.dio:
                readers[h.node.ino] = readers.get(h.node.ino, 0) + 1
        for node in self.inodes.values():
            if isinstance(node, Slot):
                assert node.readers == readers.get(node.ino, 0), node.name


# ---------------------------------------------------------------- the guard


def _guard(fn):
    """The daemon never dies on a request: a handler that fails unexpectedly
    answers EIO and logs why (pyfuse3 would otherwise stop the main loop)."""

    @functools.wraps(fn)
    async def handler(self, *args):
        try:
            return await fn(self, *args)
        except pyfuse3.FUSEError:
            raise
        except Exception:
            self._refused += 1
            log.exception("%s failed; answering EIO", fn.__name__)
            raise pyfuse3.FUSEError(errno.EIO) from None

    return handler


for _name, _fn in list(vars(MemosOperations).items()):
    if _name in vars(pyfuse3.Operations) and callable(_fn) and not _name.startswith("_"):
        setattr(MemosOperations, _name, _guard(_fn))
