"""The debug/trace event buffer (`.memos/debug/trace`).

Trace encoding: every value in a trace line (and the event name) is
percent-encoded so that a line is always exactly one event and splits
unambiguously at spaces and at the first `=` of each field: the value is
taken as UTF-8 (names that are not UTF-8 keep their bytes), and every byte
outside the printable ASCII range 0x21-0x7E, and `%` and `=` themselves, is
written `%XX` (two upper-case hex digits): a space is `%20`, a newline `%0A`,
`%` is `%25`, `=` is `%3D`.  Decoding is `urllib.parse.unquote`.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

__all__ = ["Trace", "trace_quote"]


_TRACE_SAFE = frozenset(range(0x21, 0x7F)) - {ord("%"), ord("=")}


def trace_quote(value: Any) -> str:
    """A trace field value with every byte outside printable ASCII, and `%`
    and `=`, percent-encoded (`%0A`, `%20`, `%25`, `%3D`): no whitespace, no
    control character, no `=` (see the module docstring)."""
    if isinstance(value, (bytes, bytearray)):
        raw = bytes(value)
    else:
        raw = str(value).encode("utf-8", "surrogateescape")
    if all(b in _TRACE_SAFE for b in raw):
        return raw.decode("ascii")
    return "".join(chr(b) if b in _TRACE_SAFE else f"%{b:02X}" for b in raw)


class Trace:
    """The debug/trace event buffer: a bounded ring of text lines."""

    def __init__(self, maxlen: int = 65536) -> None:
        self.enabled = False
        self._lines: collections.deque[str] = collections.deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def set(self, on: bool) -> None:
        with self._lock:
            if on and not self.enabled:
                self._lines.clear()
            self.enabled = on

    def emit(self, event: str, **fields: Any) -> None:
        """Append `<ns> <EVENT> field=value ...`; every value is encoded by
        `trace_quote`, so no name can split or forge a line."""
        if not self.enabled:
            return
        kv = " ".join(f"{trace_quote(k)}={trace_quote(v)}" for k, v in fields.items())
        with self._lock:
            self._lines.append(f"{time.time_ns()} {trace_quote(event)} {kv}".rstrip())

    def text(self) -> str:
        with self._lock:
            return "".join(line + "\n" for line in self._lines)
