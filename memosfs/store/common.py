"""What every seam of the store shares: slot keys and the flush/close error.

Owns: make_key / split_key (a slot's key, b"agent/session/name"), the
private key helpers the seams use (_session_of: the ring a key is in; _k: a
key for log lines), and UnsavedSlots (the OSError flush and close raise).
memosfs.store.store re-exports the public ones, as the single module had
them.  Calls nothing of memosfs.
"""

from __future__ import annotations

import errno
from typing import Optional


def make_key(agent: str, session: str, name: str) -> bytes:
    return f"{agent}/{session}/{name}".encode("utf-8", "surrogateescape")


def split_key(key: bytes) -> tuple[str, str, str]:
    """(agent, session, name); the name may hold "/" (directories below a
    session: agent/session/d1/d2/slot)."""
    agent, session, name = key.decode("utf-8", "surrogateescape").split("/", 2)
    return agent, session, name


def _session_of(key: bytes) -> bytes:
    """The directory a key is in (its ring): agent/session or deeper."""
    return key.rsplit(b"/", 1)[0]


class UnsavedSlots(OSError):
    """Slots that a flush (they stay in memory, dirty) or a close (they are
    lost) could not write to the SSD tier.  `keys`, `count`; errno is the
    first failure's, ENOSPC when the tier was full."""

    def __init__(self, keys: list[bytes], cause: Optional[OSError] = None,
                 lost: bool = False) -> None:
        self.keys = list(keys)
        self.count = len(self.keys)
        self.cause = cause
        err = cause.errno if cause is not None and cause.errno else errno.ENOSPC
        what = "are lost" if lost else "stay in memory"
        why = f": {cause.strerror or cause}" if cause is not None else ": the SSD tier is full"
        super().__init__(err, f"{self.count} slots could not be saved to the SSD tier "
                              f"and {what}{why}")


def said(e: OSError) -> str:
    """An OSError in words, for the log: its message without "[Errno N]"
    (the SSD tier's say what is wrong: "the SSD directory's disk is full")."""
    return e.strerror or str(e)


def _k(key: bytes) -> str:
    return key.decode("utf-8", "replace")

