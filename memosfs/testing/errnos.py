"""`errno_of`: the errno a call failed with, for tests and the harness.

Owns one helper; may call nothing of the package (the errors it reads are
OSError and its kin — FedError — and pyfuse3.FUSEError, all of which carry an
int `.errno`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional


def errno_of(fn: Callable[..., Any], *args: Any,
             raises: Optional[type[BaseException] | tuple[type[BaseException], ...]] = None
             ) -> int:
    """fn(*args); the errno it raised (OSError, pyfuse3.FUSEError, or any
    error with an int `.errno`), or 0 if it returned.  raises: only these
    exception types count (another is raised on, as is one with no errno)."""
    try:
        fn(*args)
    except Exception as e:
        if raises is not None and not isinstance(e, raises):
            raise
        code = getattr(e, "errno", None)
        if isinstance(code, int):
            return code
        raise
    return 0
