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

A uid sees only its own refusals (they name its slots); refusals the kernel
retries by itself (an ESTALE'd writer's open, logged at DEBUG) are not
noted.  At most MAX_UIDS uids are remembered, the least recently refused
forgotten first.

Who the caller is: the guard around every handler (routing.py) sets
`CALLER` for the request (its context's uid, or the uid of the handle's
opener for read, write, flush, release and fsync); a refusal on the fast
path is noted by `OpsCore._answer` from the handle or context it was given.

Owns: `Reasons` (the per-uid notes), `CALLER`, `note_refusal`.
May call: the standard library only.
"""

from __future__ import annotations

import collections
import errno
import os
import time
from contextvars import ContextVar
from typing import Optional

__all__ = ["Reasons", "CALLER", "note_refusal"]

MAX_UIDS = 4096


class Reasons:
    """The last refusal of each uid: (wall time, errno, reason)."""

    def __init__(self) -> None:
        self._by_uid: collections.OrderedDict[int, tuple[float, int, str]] = \
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

    def note(self, uid: int, code: int, reason: str) -> None:
        self._by_uid[uid] = (time.time(), code, reason)
        self._by_uid.move_to_end(uid)
        while len(self._by_uid) > MAX_UIDS:
            self._by_uid.popitem(last=False)

    def last(self, uid: int) -> Optional[tuple[float, int, str]]:
        return self._by_uid.get(uid)

    def text(self, uid: Optional[int]) -> str:
        """What `.memos/why` shows uid: one line, `time ERRNO (message): reason`."""
        got = self._by_uid.get(uid) if uid is not None else None
        if got is None:
            out = "nothing of yours was refused since the mount\n"
        else:
            t, code, reason = got
            name = errno.errorcode.get(code, str(code))
            out = f"{_stamp(t)} {name} ({os.strerror(code)}): {reason}\n"
        ev = self._evicted.get(uid) if uid is not None else None
        if ev is not None:
            t, count, last, why = ev
            many = f"{count} of your slots were" if count > 1 else "a slot of yours was"
            out += (f"{_stamp(t)} evicted: {many} evicted since the mount, the last "
                    f"{last}: {why}\n")
        return out

    def __len__(self) -> int:
        return len(self._by_uid)


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


# (uid, the mount's Reasons) of the request being served; None outside one
CALLER: ContextVar[Optional[tuple[int, Reasons]]] = ContextVar("memosfs_caller", default=None)


def note_refusal(code: int, reason: str) -> bool:
    """Note a refusal for the caller of the request being served; False
    when there is none (a refusal outside a request, or on the fast path:
    its caller notes it)."""
    caller = CALLER.get()
    if caller is None:
        return False
    caller[1].note(caller[0], code, reason)
    return True
