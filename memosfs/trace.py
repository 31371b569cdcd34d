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

    def __init__(self, maxlen: int = 65536, maxbytes: int = 16 << 20) -> None:
        self.enabled = False
        # bounded twice: `maxlen` lines and `maxbytes` characters (a line names
        # keys, which may be long: 65536 lines of 4 KiB paths would be 256 MiB)
        self.maxbytes = maxbytes
        self._bytes = 0
        self._lines: collections.deque[str] = collections.deque()
        self._maxlen = maxlen
        self._lock = threading.Lock()

    def set(self, on: bool) -> None:
        with self._lock:
            if on and not self.enabled:
                self._lines.clear()
                self._bytes = 0
            self.enabled = on

    def emit(self, event: str, **fields: Any) -> None:
        """Append `<ns> <EVENT> field=value ...`; every value is encoded by
        `trace_quote`, so no name can split or forge a line."""
        if not self.enabled:
            return
        kv = " ".join(f"{trace_quote(k)}={trace_quote(v)}" for k, v in fields.items())
        line = f"{time.time_ns()} {trace_quote(event)} {kv}".rstrip()
        with self._lock:
            self._lines.append(line)
            self._bytes += len(line) + 1
            while len(self._lines) > self._maxlen or \
                    (self._bytes > self.maxbytes and len(self._lines) > 1):
                self._bytes -= len(self._lines.popleft()) + 1

    def text(self) -> str:
        with self._lock:
            return "".join(line + "\n" for line in self._lines)
