"""What every handler module of MemosOperations shares: the inode table,
handle numbers, attributes, errors.

Owns: `OpsCore`, the base of the handler mixins (namespace.py, persist.py,
opening.py, files.py, publish.py, xattrs.py, notify.py; composed in
operations.py).  Its state (`inodes`, `handles`, `root`, the counters) is
set up by `MemosOperations.__init__`; here are the helpers over it, `refuse`
(a FUSEError whose reason is logged, naming the slot the request acts on,
`SUBJECT`, and folding identical lines: `flush_folded`), the store's errors
in words a user knows (`_said`, `_room_trouble`), and the narrow public interface that
the two trees built beside the handlers use (`FedTree` in fedtree.py,
`ControlTree` in control.py): `add_fixed`, `new_fh`, `parse_name`,
`root_entry`, `root_attr`, `count_refused`, `is_mounted`.

May call: memosfs.fuse.nodes, the store (through `_native_call` and
`_off_loop`, which turn its OSErrors into the caller's errno), pyfuse3 types.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import time
from contextvars import ContextVar
from typing import TYPE_CHECKING, Iterator, Optional

import pyfuse3
import trio

from memosfs import _native
from memosfs.fuse.nodes import (
    FIXED_LOOKUPS, NAME_MAX, Dir, Handle, Node, Pseudo, Slot, now_ns)
from memosfs.fuse.why import Reasons, note_refusal

if TYPE_CHECKING:
    from memosfs.fuse.coherence import Coherence
    from memosfs.fuse.control import ControlTree
    from memosfs.fuse.fedtree import FedTree
    from memosfs.fuse.pagecache import PageCachePusher, Refresher
    from memosfs.fuse.tenants import Tenants
    from memosfs.store.prefetch import PrefetchEngine
    from memosfs.store.store import Store
    from memosfs.trace import Trace

# every handler module logs here: the daemon's lines read as they always did
log = logging.getLogger("memosfs.fuse.operations")

SLOT_BLKSIZE = 1 << 20          # st_blksize: cp/cat size their buffers by it
ENTRY_TIMEOUT = 1.0
ATTR_TIMEOUT = 1.0
FIRST_DYNAMIC_INO = 1000
WRITER_RETRY_S = 5.0            # how long an ESTALE'd writer's retry is waited for
PUSH_WAIT_S = 5.0               # how long a writer waits for a push into its inode,
                                # or for another writer to replace the slot first
PUSH_MIN_BYTES = 1 << 20        # smaller versions: reading them through the daemon costs less than a push (its attribute refresh is a round trip)
PUSH_AFTER_WRITERS_BYTES = 4 << 20   # a version published by writers is pushed after the last
                                     # one closes from this size on (it pins the version meanwhile)


class FastCtx:
    """The caller of a request the fast path answers (the fields of
    pyfuse3.RequestContext that the handlers read)."""

    __slots__ = ("uid", "gid", "pid", "umask")

    def __init__(self, uid: int, gid: int, pid: int, umask: int = 0) -> None:
        self.uid, self.gid, self.pid, self.umask = uid, gid, pid, umask


def tgid_of(pid: int) -> int:
    """The process (thread group) a FUSE request's thread belongs to: the
    kernel sends the calling thread's id, and a writer's view and the right
    to publish belong to the whole process.  The id itself if /proc cannot
    tell (the thread is gone)."""
    if pid <= 0:
        return pid
    now = time.monotonic()
    hit = _TGIDS.get(pid)
    if hit is not None and now - hit[1] < TGID_CACHE_S:
        return hit[0]
    tgid = pid
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"Tgid:"):
                    tgid = int(line.split()[1])
                    break
    except (OSError, ValueError):
        return pid                      # (gone: not remembered)
    if len(_TGIDS) >= 4096:
        _TGIDS.clear()
    _TGIDS[pid] = (tgid, now)
    return tgid


# tgid_of's answers, kept TGID_CACHE_S: a thread id is reused only after the
# kernel has handed out every other id up to pid_max (32,768 at least), more
# than 100,000 thread creations a second for this long; a request stream from
# one process costs a /proc read per quarter second instead of one per request.
TGID_CACHE_S = 0.25
_TGIDS: dict[int, tuple[int, float]] = {}


def physical_memory() -> int:
    """Bytes of memory of the machine (0 when unknown)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return 0


ROOM_WAIT_S = 30.0              # how long a request waits for other threads' write-backs
                                # to make room in a full memory tier (then ENOSPC)
ROOM_DEAD_WAIT_S = 1.0          # ... for replaced versions that readers still pin
ROOM_HELD_WAIT_S = 5.0          # ... for other writers' drafts and readers' pins
ROOM_POLL_MS = 50               # one wait for room, in a worker thread
SPILL_HELD_WAIT_S = 0.1         # a writer whose draft can spill waits this long (not
                                # ROOM_HELD_WAIT_S) for other writers' drafts and
                                # readers' pins, then continues in a spill file


class NeedRoom(Exception):
    """A store call on the request loop found the memory tier full of
    versions other threads are writing back (or replaced versions still
    pinned): nothing changed, and the request waits for room in a worker
    thread (`_with_room`) rather than blocking the loop, then runs again."""


class NoMemory(NeedRoom):
    """A change to a memory draft that the memory tier refused (ENOSPC: no
    room can be made; EFBIG: larger than the tier), raised instead of the
    refusal where the draft may spill (an SSD tier, no passthrough): the
    request's `_with_room` moves the draft to a spill file and runs again,
    or refuses as `_native_call` would have (`_memory_refused`).  `node`
    and `span`: the draft and the bytes the change would have written
    (set by files.py `_draft_call`/`_draft_for`), noted as refused if it
    is refused after all.  A NeedRoom, so that a fast twin declines it."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(cause)
        self.cause = cause
        self.node: Optional[Slot] = None
        self.span: tuple[int, int] = (0, 1)
        self.lossless = False           # a change that loses no byte refused (fallocate)


class Refused(pyfuse3.FUSEError):
    """A FUSEError whose reason has been logged: `reason` (None for one
    logged below INFO: a refusal the kernel retries by itself), `noted`
    (whether `.memos/why` has it for the caller yet; why.py)."""

    reason: Optional[str] = None
    bare: Optional[str] = None      # the reason without the slot's name
    noted = False


# The slot a request acts on, set while its handler runs (routing.py's
# guard, `OpsCore._answer` for the fast path): a node, or (parent directory,
# name) for a create.  `refuse` names it (its path below the mount) in the
# reason when the reason does not already; it is made into text only then.
SUBJECT: ContextVar[object] = ContextVar("memosfs_subject", default=None)


def subject_text(subject: object) -> Optional[str]:
    """The path below the mount of a SUBJECT, or None."""
    try:
        if isinstance(subject, tuple):
            parent, name = subject
            key = parent.key_of(name.decode("utf-8", "surrogateescape"))
        else:
            key = subject.key if isinstance(subject, Slot) else None
    except Exception:               # (a name the tree refuses: said by the refusal)
        return None
    return key.decode("utf-8", "replace") if isinstance(key, bytes) else None

FOLD_S = 10.0                   # identical refusals within this long share one log line


class _Fold:
    """The last refusal logged and how often it came again since (one
    refused save can be dozens of refused writes, each the same line)."""

    text = ""
    level = logging.INFO
    since = 0.0
    repeats = 0


def refuse(code: int, fmt: str, *args: object, level: int = logging.INFO) -> Refused:
    """A FUSEError for code whose reason goes to the log and, at INFO or
    above, to the caller's `.memos/why` (memosfs/fuse/why.py).  The reason
    names the slot the request acts on (SUBJECT); a line identical to the
    one before within FOLD_S is counted, not logged again, and the count is
    logged with the next line that differs (or comes later)."""
    r = Refused(code)
    if level < logging.INFO:
        log.log(level, "refused (%s): " + fmt, errno.errorcode.get(code, code), *args)
        return r
    reason = r.bare = fmt % args if args else fmt
    subject = subject_text(SUBJECT.get())
    if subject and subject not in reason:
        reason = f"{subject}: {reason}"
    r.reason = reason
    _log_folded(level, f"refused ({errno.errorcode.get(code, code)}): {reason}")
    r.noted = note_refusal(code, r.reason)
    return r


def _log_folded(level: int, text: str) -> None:
    now = time.monotonic()
    if text == _Fold.text and now - _Fold.since < FOLD_S:
        _Fold.repeats += 1
        return
    flush_folded()
    _Fold.text, _Fold.level, _Fold.since = text, level, now
    log.log(level, "%s", text)


def flush_folded() -> None:
    """Log how often the last refusal came again, if it did (before another
    line, and at unmount)."""
    if _Fold.repeats:
        log.log(_Fold.level, "%s (%d more times in %.0f s)", _Fold.text, _Fold.repeats,
                time.monotonic() - _Fold.since)
    _Fold.repeats = 0
    _Fold.text = ""


class OpsCore:
    """The state and helpers the handler mixins share (see the module docstring)."""

    # set by MemosOperations.__init__
    store: "Store"
    trace: "Trace"
    knobs: dict[str, object]
    inodes: dict[int, Node]
    handles: dict[int, Handle]
    root: Dir
    mounted: bool               # pyfuse3.init succeeded: the kernel can be told of changes
    wb: bool = False            # the kernel's writeback cache is on (knob writeback_cache):
                                # it keeps a regular file's size and mtime itself, so an
                                # inode's bytes change only through its own page cache
                                # (its writers) -- any other new version of a name gets a
                                # fresh inode (publish.py `_published`)
    coherence: "Coherence"
    tenants: "Tenants"
    prefetch: "PrefetchEngine"
    pusher: Optional["PageCachePusher"]
    fed: "FedTree"
    control: "ControlTree"
    why: Reasons                # each uid's last refusal (.memos/why)
    trio_token: object          # set when serving: other threads post here
    _room_ok = False            # in a section that may raise NeedRoom (see _native_call)
    _running_now = False        # inside _run_now (a fast twin's coroutine)
    _early = None               # (key, Ref): fast_open's promotion from the SSD, for its open
    _room_waits = 0             # waits for room made off the loop
    mountpoint: str             # set by start_kernel_notifications
    _refresher: "Refresher"
    _next_fh: int
    _dir_opens: dict[int, tuple[int, int]]   # directory handle -> (inode, opener's tgid)
    _lookup_misses: int         # lookups of a name no tier has (counted as misses)
    _refused: int               # requests refused for a store error or a bad write
    _read_requests: int
    _private_writers: int       # retried writers given a draft of their own

    # ---- the interface of the trees built beside the handlers ----

    def add_fixed(self, node: Node) -> Node:
        """Put a node the kernel never forgets (a control-plane directory or
        file) into its parent and the inode table."""
        node.lookups = FIXED_LOOKUPS
        assert node.parent is not None
        node.parent.children[node.name] = node
        self.inodes[node.ino] = node
        return node

    def new_fh(self) -> int:
        """A file handle number (one allocator for every tree)."""
        return self._fh()

    def parse_name(self, raw: bytes) -> str:
        """A name from the kernel; ENAMETOOLONG beyond NAME_MAX."""
        return self._name(raw)

    def root_entry(self) -> pyfuse3.EntryAttributes:
        """The root's entry (a lookup of `..` from a top-level tree)."""
        return self._entry(self.root)

    def root_attr(self) -> pyfuse3.EntryAttributes:
        return self._attr(self.root)

    def count_refused(self) -> None:
        self._refused += 1

    def is_mounted(self) -> bool:
        return self.mounted

    # ---- inodes and names ----

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
        return self.slots.new_ino()     # (one numbering: the slot table's)

    def _new_slot(self, ino: int, name: str, parent: Dir, mode: int, uid: int,
                  gid: int) -> Slot:
        """The Slot object of an inode the slot table made."""
        return Slot(self.slots, ino, name, parent, mode, uid, gid)

    def _slot_like(self, ino: int, like: Slot) -> Slot:
        """The object of an inode the slot table made for like's name (a
        fresh inode, a private draft, a view): its metadata."""
        node = Slot(self.slots, ino, like.name, like.parent, stat.S_IMODE(like.mode),
                    like.uid, like.gid)
        node.like(like)
        pt = getattr(self, "_pt_state", None)
        if pt is not None and like.pt_mirror is not None \
                and like._f(_native.SLOT_F_SUCCESSOR) == ino \
                and like.state == _native.SLOT_SUPERSEDED:
            pt.move_mirror(like, node)  # (a fresh inode of the same version)
        return node

    def _looked_up(self, node: Node, k: int) -> None:
        """The kernel learned (k > 0) or forgot (k < 0) node k times."""
        if isinstance(node, Slot):
            self.slots.lookups(node, k)
        else:
            node.lookups += k

    def _fh(self) -> int:
        fh = self._next_fh
        self._next_fh += 1
        return fh

    @staticmethod
    def _name(raw: bytes) -> str:
        if len(raw) > NAME_MAX:
            raise refuse(errno.ENAMETOOLONG, "name of %d bytes (NAME_MAX is %d)",
                         len(raw), NAME_MAX)
        return raw.decode("utf-8", "surrogateescape")

    def _slot_by_key(self, key: bytes) -> Optional[Slot]:
        node: Optional[Node] = self.root
        for part in key.decode("utf-8", "surrogateescape").split("/"):
            if not isinstance(node, Dir):
                return None
            node = node.children.get(part)
        return node if isinstance(node, Slot) else None

    def _walk_slots(self, d: Dir) -> Iterator[Slot]:
        for child in d.children.values():
            if isinstance(child, Slot):
                yield child
            elif isinstance(child, Dir):
                yield from self._walk_slots(child)

    def _new_mode(self, mode: int) -> int:
        """The permission bits of a new agent, session, directory or slot:
        what the creator asked for (the kernel took its umask away already)
        less the mount's `umask` knob (077 by default: private to its uid)."""
        return stat.S_IMODE(mode) & ~int(self.knobs["umask"])

    # ---- attributes ----

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
        a.st_rdev = getattr(node, "rdev", 0)    # (a device node's: nodes.Special)
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
        if isinstance(node, Slot):
            self._slot_attr(node, a, ctx)
        return a

    def _slot_attr(self, node: Slot, a: pyfuse3.EntryAttributes, ctx) -> None:
        """A slot's size, blocks, mtime and timeouts as the caller sees them
        (the writers' view: the slot table's `stat`)."""
        writers = node.writers
        if writers or node.draft_kind:
            if not self.wb and node.version:
                # (with the writeback cache the kernel keeps a regular file's
                # size and mtime itself and asks for nothing per write: a
                # zero timeout would cost a GETATTR per write(2))
                a.attr_timeout = 0
            if ctx is None or node.is_writer(tgid_of(ctx.pid)):
                if node.pt_draft is not None:
                    self._pt_poll(node)     # (what the kernel wrote into its file)
                size = node.draft_size()
                a.st_size = size
                a.st_blocks = max(node.blocks(), (size + 511) // 512)
                if node.changed:
                    a.st_mtime_ns = a.st_ctime_ns = node._f(_native.SLOT_F_DRAFT_MTIME)
        if node.privates:
            a.attr_timeout = 0          # a retried writer's own draft (its view)
            own = self.slots.own_private(node, tgid_of(ctx.pid)) if ctx is not None else None
            if own is not None and own.writers:
                size = own.draft_size()
                a.st_size = size
                a.st_blocks = max(node.blocks(), (size + 511) // 512)
                if own.changed:
                    a.st_mtime_ns = a.st_ctime_ns = own._f(_native.SLOT_F_DRAFT_MTIME)
        if not node.version:
            a.entry_timeout = 0         # unpublished: others get ENOENT (lookup)
        if node.view_of is not None or node.pt_draft is not None:
            # a readers' view, or the inode a writers' file backs: every
            # process looks the name up again (readers find a view)
            a.entry_timeout = a.attr_timeout = 0

    def _entry(self, node: Node, ctx=None) -> pyfuse3.EntryAttributes:
        self._looked_up(node, 1)
        return self._attr(node, ctx)

    # ---- leaving the tree ----

    def _detach(self, node: Node, reason: str) -> None:
        """node leaves the tree (a slot: through the slot table, `reason`
        "unlink", "rmdir", or any reason no tier holds it by: a drop)."""
        parent = node.parent
        pt = getattr(self, "_pt_state", None)
        if pt is not None and getattr(node, "pt_mirror", None) is not None:
            pt.drop_mirror(node)    # (kept while files read it: their
                                                # last release drops it)
        if isinstance(node, Slot):
            if parent is not None and parent.children.get(node.name) is node:
                if reason in ("unlink", "rmdir"):
                    self.slots.remove(parent, node.name, reason)
                else:
                    self.slots.drop(parent, node.name)
                parent.mtime_ns = parent.ctime_ns = now_ns()
            node.ctime_ns = now_ns()
            return
        if parent is not None and parent.children.get(node.name) is node:
            del parent.children[node.name]
            parent.mtime_ns = parent.ctime_ns = now_ns()
        node.detached = reason
        node.ctime_ns = now_ns()
        self._maybe_forget(node)

    def _maybe_forget(self, node: Node) -> None:
        """Drop an inode that left the tree once the kernel forgot it and no
        handle is open (a slot: the slot table forgets it itself)."""
        if isinstance(node, Slot):
            return
        if node.detached and node.lookups <= 0 and node.handles <= 0:
            self.inodes.pop(node.ino, None)

    # ---- calls into the store ----

    def _answer(self, what: str, fn, *args):
        """A fast twin's answer: fn(*args), -errno for a refusal, -EIO (and
        the log says why) for anything else; the daemon never dies on a
        request.  None when the memory tier must make room first (NeedRoom:
        the request goes to its handler, which waits off the loop)."""
        self._room_ok = True
        about = SUBJECT.set(args[0].node) if args and type(args[0]) is Handle else None
        try:
            return fn(*args)
        except NeedRoom:
            return None
        except pyfuse3.FUSEError as e:
            if getattr(e, "reason", None) and not e.noted:
                self._note_fast_refusal(e, args, what)
            return -e.errno
        except Exception:
            self._refused += 1
            log.exception("%s failed; answering EIO", what)
            return -errno.EIO
        finally:
            self._room_ok = False
            if about is not None:
                SUBJECT.reset(about)

    def _note_fast_refusal(self, e: "Refused", args: tuple, what: str) -> None:
        """`.memos/why` for a refusal on the fast path (of request `what`),
        whose caller is the uid of the context or handle among the twin's
        arguments (why.py)."""
        uid = next((a.uid for a in args if isinstance(a, (FastCtx, Handle))), None)
        if uid is not None:
            self.why.note(uid, e.errno, e.reason or "", what)

    def _run_now(self, coro):
        """A handler's coroutine that the checks say cannot wait: one send
        finishes it; -errno for a refusal; None when it must wait for room
        after all (nothing changed: the request goes to its handler)."""
        self._running_now = True
        try:
            coro.send(None)
        except StopIteration as done:
            return done.value
        except NeedRoom:
            return None
        except pyfuse3.FUSEError as e:
            return -e.errno
        finally:
            self._running_now = False
        # it waited after all: the checks missed a way to wait (a bug); the
        # log names where (the awaiting frames, outermost first)
        where, c = [], coro
        while c is not None:
            f = getattr(c, "cr_frame", None) or getattr(c, "gi_frame", None)
            if f is not None:
                where.append(f"{f.f_code.co_name}:{f.f_lineno}")
            c = getattr(c, "cr_await", None) or getattr(c, "gi_yieldfrom", None)
        coro.close()
        self._refused += 1
        log.error("internal check failed: a handler waited on the fast path (%s); answering "
                  "EIO", " > ".join(where) or "?")
        return -errno.EIO

    async def _with_room(self, fn, *args, node: Optional[Slot] = None,
                         span: tuple[int, int] = (0, 1), lossless: bool = False):
        """fn(*args) on the loop, where the store calls it makes do not wait
        for room (NeedRoom): the wait happens in a worker thread, the loop
        serves other requests meanwhile (the closes that unpin what a full
        memory tier holds), then fn runs again.  ENOSPC after ROOM_WAIT_S
        (ROOM_DEAD_WAIT_S when only pinned replaced versions would free
        room, ROOM_HELD_WAIT_S when only other writers' drafts and readers'
        pins would); `node` then has the bytes `span` of its draft refused.
        Where node's draft may spill (an SSD tier, no passthrough: files.py
        `_may_spill`), it spills instead (`_spill_draft`) and fn runs again:
        after SPILL_HELD_WAIT_S when only other writers' drafts and readers'
        pins would make room, at the limits above otherwise, and at once
        when memory refuses the draft's change outright (NoMemory).  A
        `lossless` change (a fallocate, an extending truncate) refused loses
        no byte: it is not noted against the draft."""
        waited = dead = held = 0.0
        while True:
            self._room_ok = True
            nomem: Optional[NoMemory] = None
            try:
                return fn(*args)
            except NoMemory as e:
                nomem = e
            except NeedRoom:
                pass
            finally:
                self._room_ok = False
            if self._running_now:
                raise NeedRoom()        # (from a fast twin: its handler runs it)
            if nomem is not None:
                # memory refused the draft's change outright: it continues in
                # a spill file (and the change runs again), or is refused
                where = nomem.node if nomem.node is not None else node
                if self._spill_draft(where, nomem.span if nomem.node is not None else span):
                    continue
                raise self._memory_refused(nomem)
            spills = node is not None and self._may_spill(node)
            if spills and (held >= SPILL_HELD_WAIT_S or waited >= ROOM_WAIT_S
                           or dead >= ROOM_DEAD_WAIT_S):
                # only other writers' drafts and readers' pins would make
                # room (or nothing did in time): the draft spills
                if self._spill_draft(node, span):
                    continue
            if waited >= ROOM_WAIT_S or dead >= ROOM_DEAD_WAIT_S or held >= ROOM_HELD_WAIT_S:
                self._refused += 1
                e = refuse(errno.ENOSPC, "%s (no room after %.1f s of waiting for "
                           "write-backs and pinned versions)", self._room_trouble(), waited,
                           level=logging.WARNING)
                if node is not None and not lossless:
                    self.slots.refused(node, span[0], span[1], errno.ENOSPC, e.bare)
                raise e
            self._room_waits += 1
            t0 = time.monotonic()
            why = await self._off_loop(self.store.cache.wait_room, ROOM_POLL_MS)
            spent = time.monotonic() - t0
            waited += spent
            if why == 2:
                dead += spent
            elif why == 3:
                held += spent
            elif why == 0:
                await trio.sleep(0)     # the room came meanwhile: try again now

    def _native_call(self, fn, *args, memory: bool = False):
        """Call into the store; its OSErrors become the caller's errno.  In a
        section that can run again (`_answer`, `_with_room`) an allocation
        that would wait for room raises NeedRoom instead, and with `memory`
        (fn changes a memory draft) one that memory refuses raises NoMemory
        where drafts may spill (`_may_spill`)."""
        nowait = self._room_ok
        if nowait:
            was = _native.set_nowait(True)
        try:
            return fn(*args)
        except OSError as e:
            if nowait and isinstance(e, BlockingIOError):
                raise NeedRoom() from None
            if nowait and memory and e.errno in (errno.ENOSPC, errno.EFBIG) \
                    and self._may_spill(None):
                raise NoMemory(e) from None
            self._refused += 1
            raise refuse(e.errno or errno.EIO, "%s", self._said(e),
                         level=logging.WARNING) from None
        except ValueError as e:
            self._refused += 1
            raise refuse(errno.EINVAL, "%s", e, level=logging.WARNING) from None
        finally:
            if nowait:
                _native.set_nowait(was)

    def _memory_refused(self, e: NoMemory) -> "Refused":
        """The refusal `_native_call` would have raised for e's memory error,
        e's span of its draft noted as refused (a draft that did not spill)."""
        self._refused += 1
        r = refuse(e.cause.errno or errno.EIO, "%s", self._said(e.cause), level=logging.WARNING)
        if e.node is not None and not e.lossless:
            self.slots.refused(e.node, e.span[0], e.span[1], r.errno, r.bare)
        return r

    def _may_spill(self, node: Optional[Slot]) -> bool:
        """Whether node's draft could move to a spill file (None: whether any
        could; files.py overrides it)."""
        return False

    def _spill_draft(self, node: Optional[Slot], span: tuple[int, int]) -> bool:
        """Move node's draft to a spill file (files.py overrides it); False
        when it cannot spill."""
        return False

    async def _off_loop(self, fn, *args):
        """Run blocking store work (SSD I/O) in a worker thread while the loop
        serves other requests; inline when not mounted (tests)."""
        try:
            if self.mounted:
                return await trio.to_thread.run_sync(fn, *args)
            return fn(*args)
        except OSError as e:
            self._refused += 1
            raise refuse(e.errno or errno.EIO, "%s", self._said(e),
                         level=logging.WARNING) from None

    # ---- the store's errors in words a user knows ----

    def _said(self, e: OSError) -> str:
        """An error of the store as the log and `.memos/why` give it: the C
        core's "memory tier full: draft write" says why memory is full (the
        SSD directory's disk may be), its EFBIG says how large memory is."""
        text = e.strerror or str(e)
        if e.errno == errno.ENOSPC and text.startswith("memory tier full"):
            return self._room_trouble()
        if e.errno == errno.EFBIG and text.startswith("larger than the memory tier"):
            return (f"the slot would be larger than the memory tier "
                    f"(capacity {self.store.cache.stats()['capacity']} bytes)")
        return text

    def _room_trouble(self) -> str:
        """Why the memory tier has no room: the SSD tier takes nothing (its
        disk is full, or ssd_capacity is reached under ssd_full=refuse), or
        what fills memory cannot go."""
        ssd = self.store.ssd
        trouble = ssd.trouble if ssd is not None else None
        if trouble:
            return (f"{trouble}, so the memory tier, full, cannot write slots back to "
                    f"make room")
        return ("the memory tier is full of slots that cannot go now (open, pinned, or "
                "still being written back)")


__all__ = ["OpsCore", "Refused", "NoMemory", "refuse", "tgid_of", "physical_memory", "log", "FastCtx",
           "SUBJECT", "subject_text", "flush_folded"]
