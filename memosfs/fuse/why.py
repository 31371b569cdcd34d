"""Why a caller's last request was refused: the `.memos/why` file.

A refused request reaches the caller as an errno alone ("Invalid argument",
"Operation not permitted"); the daemon's log has the reason.  Every refusal
the log explains (`core.refuse` at INFO or above, a coherence wait that
failed, a refused `.federated` request) is also noted here for the uid that
made the request, and reading `.memos/why` shows the reader's own uid's last
one:

    # echo banana > /mnt/memos/.memos/cache/evict_batch
    bash: echo: write error: Invalid argument
    # cat /mnt/memos/.memos/why
    2026-12-04 21:22:24 EINVAL (Invalid argument): evict_batch: not an integer: 'banana' ...

Below it, a uid whose slots the SSD tier evicted at ssd_capacity (ssd_full=
evict: no tier keeps them, the next open misses) reads how many and the
last one's name.

A refusal that failed a save or an open (a request of SAVE_OR_OPEN: create,
open, read, write, flush, release, fsync) stays visible after later ones of
other requests: `cp -a` and `rsync -X` try attributes the mount does not
keep (system.posix_acl_access: ENOTSUP, harmless, the copy goes on), and
such a refusal, shown first, does not hide the refused save before it,
which the next line shows:

    2026-12-04 21:22:30 ENOTSUP (Operation not supported): a/s/x: xattr system.posix_acl_access: ...
    2026-12-04 21:22:24 last refused save or open: EFBIG (File too large): a/s/big: ...

A uid sees only its own refusals (they name its slots); refusals the kernel
retries by itself (an ESTALE'd writer's open, logged at DEBUG) are not
noted.  At most MAX_UIDS uids are remembered, the least recently refused
forgotten first.

Who the caller is: the guard around every handler (routing.py) sets
`CALLER` for the request (its context's uid, or the uid of the handle's
opener for read, write, flush, release and fsync) and `OPERATION` (the
handler's name); a refusal on the fast path is noted by `OpsCore._answer`
from the handle or context and the name it was given.

Owns: `Reasons` (the per-uid notes), `CALLER`, `OPERATION`, `note_refusal`.
May call: the standard library only.
"""

from __future__ import annotations

import collections
import errno
import os
import time
from contextvars import ContextVar
from typing import Optional

__all__ = ["Reasons", "CALLER", "OPERATION", "SAVE_OR_OPEN", "note_refusal"]

MAX_UIDS = 4096
# the requests whose refusal fails a save or an open (kept visible: above)
SAVE_OR_OPEN = frozenset(("create", "open", "read", "write", "flush", "release", "fsync"))


class Reasons:
    """The last refusal of each uid: (wall time, errno, reason)."""

    def __init__(self) -> None:
        self._by_uid: collections.OrderedDict[int, tuple[float, int, str]] = \
            collections.OrderedDict()
        # each uid's last refusal that failed a save or an open (SAVE_OR_OPEN)
        self._saves: collections.OrderedDict[int, tuple[float, int, str]] = \
            collections.OrderedDict()
        # slots of each uid that a tier let go to make room (SSD evictions):
        # uid -> [wall time of the last, count, its name, why]
        self._evicted: collections.OrderedDict[int, list] = collections.OrderedDict()

    def evicted(self, uid: int, name: str, why: str) -> None:
        """A slot of uid's (`name`, its path below the mount) was evicted
        from every tier (`why`: what made room)."""
        got = self._evicted.get(uid)
        count = got[1] + 1 if got is not None else 1
        self._evicted[uid] = [time.time(), count, name, why]
        self._evicted.move_to_end(uid)
        while len(self._evicted) > MAX_UIDS:
            self._evicted.popitem(last=False)

    def note(self, uid: int, code: int, reason: str, op: Optional[str] = None) -> None:
        """uid's request `op` (a handler's name; None: not known) was refused."""
        got = (time.time(), code, reason)
        books = [self._by_uid] + ([self._saves] if op in SAVE_OR_OPEN else [])
        for book in books:
            book[uid] = got
            book.move_to_end(uid)
            while len(book) > MAX_UIDS:
                book.popitem(last=False)

    def last(self, uid: int) -> Optional[tuple[float, int, str]]:
        return self._by_uid.get(uid)

    def text(self, uid: Optional[int]) -> str:
        """What `.memos/why` shows uid: one line, `time ERRNO (message): reason`."""
        got = self._by_uid.get(uid) if uid is not None else None
        if got is None:
            out = "nothing of yours was refused since the mount\n"
        else:
            t, code, reason = got
            out = f"{_stamp(t)} {_said(code)}: {reason}\n"
            save = self._saves.get(uid)
            if save is not None and save is not got:
                t, code, reason = save
                out += f"{_stamp(t)} last refused save or open: {_said(code)}: {reason}\n"
        ev = self._evicted.get(uid) if uid is not None else None
        if ev is not None:
            t, count, last, why = ev
            many = f"{count} of your slots were" if count > 1 else "a slot of yours was"
            out += (f"{_stamp(t)} evicted: {many} evicted since the mount, the last "
                    f"{last}: {why}\n")
        return out

    def __len__(self) -> int:
        return len(self._by_uid)


def _said(code: int) -> str:
    """`EINVAL (Invalid argument)`."""
    return f"{errno.errorcode.get(code, str(code))} ({os.strerror(code)})"


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


# (uid, the mount's Reasons) of the request being served; None outside one
CALLER: ContextVar[Optional[tuple[int, Reasons]]] = ContextVar("memosfs_caller", default=None)
# the name of the handler serving it (routing.py's guard); None outside one
OPERATION: ContextVar[Optional[str]] = ContextVar("memosfs_operation", default=None)


def note_refusal(code: int, reason: str) -> bool:
    """Note a refusal for the caller of the request being served; False
    when there is none (a refusal outside a request, or on the fast path:
    its caller notes it)."""
    caller = CALLER.get()
    if caller is None:
        return False
    caller[1].note(caller[0], code, reason, OPERATION.get())
    return True
