"""Refusals of the federated package: FedError and the `memosfs.federated` logger.

Owns: FedError (an OSError carrying the errno to answer), refuse() / refuse_job(), which
log a refusal at INFO with its reason before it is raised, and the one logger every
module of the package writes to (`memosfs.federated`, as docs/federated.md names it).

May call: the standard library only.  Every other module of memosfs/federated may
import this one; it imports none of them.
"""

from __future__ import annotations

import errno
import logging

log = logging.getLogger("memosfs.federated")


class FedError(OSError):
    """A refused request: `.errno` is the code to answer, the message the reason
    (already logged when it came from FederatedJobs)."""

    def __init__(self, code: int, msg: str) -> None:
        super().__init__(code, msg)


def refuse(code: int, fmt: str, *args: object) -> FedError:
    msg = fmt % args if args else fmt
    log.info("refused (%s): %s", errno.errorcode.get(code, code), msg)
    return FedError(code, msg)


def refuse_job(j, code: int, fmt: str, *args: object) -> FedError:
    """refuse(), counted in the job's `refused` and prefixed with its name (j: a
    state.Job, or None for a refusal outside any job)."""
    if j is not None:
        j.refused += 1
        fmt = "job %s: " + fmt
        args = (j.name,) + args
    return refuse(code, fmt, *args)
