"""The federated jobs' state: the key-value stores, the job records and the job table.

Owns: the key-value interface FederatedJobs persists through (MemoryKV; DirKV, one
file per key, written atomically and durably, private), the records of a job (Job, and
Entry for a file's owner, time and size) with their JSON form in `<prefix><job>/meta`,
and JobStore: the table of jobs, the layout of their keys in the store
(`meta`, `history`, `params/<gen>`, `updates/<round>/<client>`, `keys/<client>`,
`he/context`, `he/sum/<round>`), restore() at start (dropping what no meta refers to),
and the params generations and public keys read through caches.

Persistence rule: the put of a job's `meta` is the commit point of every change; what
it does not refer to is garbage, deleted after it or at the next restore.

May call: errors, config (epsilon_for, warm_imports), crypto (parse_public_key),
tensors (st_load), memosfs.private, numpy.  Nothing of tree, rounds or engine.
"""

from __future__ import annotations

import errno
import json
import os
import re
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from memosfs.federated.config import epsilon_for, warm_imports
from memosfs.federated.crypto import parse_public_key
from memosfs.federated.errors import FedError, log
from memosfs.federated.tensors import st_load
from memosfs.private import open_private, private_makedirs, tighten_tree

# ---------------------------------------------------------------- key-value stores


class MemoryKV:
    """The key-value interface FederatedJobs persists through, in memory."""

    def __init__(self) -> None:
        self.d: dict[str, bytes] = {}
        self.lock = threading.Lock()

    def get(self, key: str) -> Optional[bytes]:
        with self.lock:
            return self.d.get(key)

    def put(self, key: str, data: bytes) -> None:
        with self.lock:
            self.d[key] = bytes(data)

    def delete(self, key: str) -> None:
        with self.lock:
            self.d.pop(key, None)

    def keys(self, prefix: str = "") -> list[str]:
        with self.lock:
            return sorted(k for k in self.d if k.startswith(prefix))


class DirKV:
    """The same interface on a directory: one file per key (the key percent-quoted),
    written to a temporary file, fsync'd and renamed, so a put is atomic and durable.
    The jobs' parameters, updates and keys are private: the folder is 0700 and its
    files 0600 whatever the umask (looser ones found at start are tightened)."""

    def __init__(self, root: str) -> None:
        self.root = root
        private_makedirs(root)
        tighten_tree(root, "federated state directory")

    def _path(self, key: str) -> str:
        return os.path.join(self.root, urllib.parse.quote(key, safe="") + ".kv")

    def get(self, key: str) -> Optional[bytes]:
        try:
            with open(self._path(key), "rb") as f:
                return f.read()
        except FileNotFoundError:
            return None

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = open_private(tmp, os.O_WRONLY | os.O_TRUNC)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
        dfd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def keys(self, prefix: str = "") -> list[str]:
        out = []
        for name in os.listdir(self.root):
            if name.endswith(".kv"):
                key = urllib.parse.unquote(name[:-3])
                if key.startswith(prefix):
                    out.append(key)
        return sorted(out)


# ---------------------------------------------------------------- job records


def now_ns() -> int:
    return time.time_ns()


@dataclass
class Entry:
    uid: int
    gid: int
    mtime_ns: int
    size: int = 0


@dataclass
class Job:
    name: str
    owner: int
    gid: int
    mode: int
    ctime_ns: int
    config: dict[str, Any]
    pending_config: Optional[dict[str, Any]] = None
    round: int = 0
    phase: str = "collecting"          # collecting | awaiting_decryption
    params_gen: int = 0                # 0: no params yet
    params_entry: Optional[Entry] = None
    config_mtime_ns: int = 0
    bindings: dict[str, int] = field(default_factory=dict)
    updates: dict[str, Entry] = field(default_factory=dict)     # current round
    keys: dict[str, Entry] = field(default_factory=dict)
    he_context: Optional[Entry] = None
    he_sum: Optional[dict[str, Any]] = None     # {"round", "clients", "mtime_ns", "size"}
    events: list[float] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    last_error: str = ""
    # not persisted
    lock: threading.RLock = field(default_factory=threading.RLock)
    busy: bool = False                  # an aggregation is computing outside the lock
    placeholders: dict[tuple[str, str], Entry] = field(default_factory=dict)
    refused: int = 0
    params_cache: Optional[bytes] = None
    key_cache: dict[str, bytes] = field(default_factory=dict)
    eps_cache: Optional[tuple[int, float, float]] = None
    mtime_ns: int = 0
    old_params: int = 0
    he_ctx_cache: Optional[tuple[int, Any]] = None

    def meta(self) -> dict[str, Any]:
        def ent(e: Optional[Entry]):
            return None if e is None else [e.uid, e.gid, e.mtime_ns, e.size]
        return {
            "v": 1, "name": self.name, "owner": self.owner, "gid": self.gid,
            "mode": self.mode, "ctime_ns": self.ctime_ns, "config": self.config,
            "pending_config": self.pending_config, "round": self.round,
            "phase": self.phase, "params_gen": self.params_gen,
            "params_entry": ent(self.params_entry), "config_mtime_ns": self.config_mtime_ns,
            "bindings": self.bindings,
            "updates": {k: ent(v) for k, v in self.updates.items()},
            "keys": {k: ent(v) for k, v in self.keys.items()},
            "he_context": ent(self.he_context), "he_sum": self.he_sum,
            "events": self.events,
            "last_error": self.last_error, "mtime_ns": self.mtime_ns,
            "epsilon": list(self.eps_cache) if self.eps_cache else None,
        }

    @classmethod
    def from_meta(cls, m: dict[str, Any]) -> "Job":
        def ent(x) -> Optional[Entry]:
            return None if x is None else Entry(*x)
        j = cls(name=m["name"], owner=m["owner"], gid=m["gid"], mode=m["mode"],
                ctime_ns=m["ctime_ns"], config=m["config"])
        j.pending_config = m.get("pending_config")
        j.round, j.phase = m["round"], m["phase"]
        j.params_gen, j.params_entry = m["params_gen"], ent(m.get("params_entry"))
        j.config_mtime_ns = m.get("config_mtime_ns", j.ctime_ns)
        j.bindings = {k: int(v) for k, v in m.get("bindings", {}).items()}
        j.updates = {k: ent(v) for k, v in m.get("updates", {}).items()}
        j.keys = {k: ent(v) for k, v in m.get("keys", {}).items()}
        j.he_context, j.he_sum = ent(m.get("he_context")), m.get("he_sum")
        j.events = list(m.get("events", []))
        j.last_error = m.get("last_error", "")
        j.mtime_ns = m.get("mtime_ns", j.ctime_ns)
        if m.get("epsilon"):
            j.eps_cache = tuple(m["epsilon"])  # type: ignore[assignment]
        return j

    def owned_by(self, uid: int) -> bool:
        return uid == 0 or uid == self.owner

    def epsilon(self) -> float:
        """epsilon spent so far, cached per (rounds, delta)."""
        key = (len(self.events), self.config["delta"])
        if self.eps_cache is None or self.eps_cache[:2] != key:
            self.eps_cache = (key[0], key[1], epsilon_for(self.events, self.config["delta"]))
        return self.eps_cache[2]


def history_round(line: str) -> int:
    m = re.match(r"round=(\d+)", line)
    return int(m.group(1)) if m else 0


# ---------------------------------------------------------------- the job table


class JobStore:
    """The jobs by name, and their state in the key-value store `kv` under `prefix`.
    `lock` guards the table (`jobs`, `mtime_ns`); each Job has its own lock for the
    rest.  The methods that take a job expect its lock held."""

    def __init__(self, kv, prefix: str = "fed/") -> None:
        self.kv = kv
        self.prefix = prefix
        self.lock = threading.Lock()
        self.jobs: dict[str, Job] = {}
        self.mtime_ns = now_ns()            # of `.federated` itself

    def job(self, name: str) -> Job:
        j = self.jobs.get(name)
        if j is None:
            raise FedError(errno.ENOENT, f"no federated job {name!r}")
        return j

    def key(self, job: str, *rest: str) -> str:
        return self.prefix + urllib.parse.quote(job, safe="") + "/" + "/".join(rest)

    def put_meta(self, j: Job) -> None:
        self.kv.put(self.key(j.name, "meta"), json.dumps(j.meta()).encode())

    def put_meta_quiet(self, j: Job) -> None:
        try:
            self.put_meta(j)
        except Exception:
            log.exception("federated: job %s: saving its state failed", j.name)

    def restore(self) -> None:
        """Load every job from the store; drop what no job's meta refers to (the
        leftovers of an update or a round that was cut short)."""
        jobs: dict[str, Job] = {}
        unreadable: set[str] = set()
        all_keys = self.kv.keys(self.prefix)
        for key in all_keys:
            if not key.endswith("/meta"):
                continue
            try:
                j = Job.from_meta(json.loads(self.kv.get(key) or b"null"))
            except Exception:
                # kept in the store, untouched, for a person to look at
                log.exception("federated: unreadable job meta %s; job not served", key)
                unreadable.add(key[len(self.prefix):].partition("/")[0])
                continue
            jobs[j.name] = j
        for key in all_keys:
            rest = key[len(self.prefix):]
            qname, _, sub = rest.partition("/")
            if qname in unreadable:
                continue
            j = jobs.get(urllib.parse.unquote(qname))
            if j is None or sub not in self.referenced(j):
                log.info("federated: dropping unreferenced %s", key)
                self.kv.delete(key)
        for j in jobs.values():
            raw = self.kv.get(self.key(j.name, "history")) or b""
            # lines of rounds that a crash kept from committing are dropped
            j.history = [ln for ln in raw.decode("utf-8", "replace").splitlines()
                         if history_round(ln) <= j.round]
        if jobs:
            warm_imports()
        for j in jobs.values():
            log.info("federated: job %s restored at round %d (%s, %d pending updates)",
                     j.name, j.round, j.phase, len(j.updates))
        self.jobs = jobs

    def referenced(self, j: Job) -> set[str]:
        ref = {"meta", "history"}
        if j.params_gen:
            ref.add(f"params/{j.params_gen}")
        ref |= {f"updates/{j.round}/{c}" for c in j.updates}
        ref |= {f"keys/{c}" for c in j.keys}
        if j.he_context is not None:
            ref.add("he/context")
        if j.he_sum is not None:
            ref.add(f"he/sum/{j.he_sum['round']}")
        return ref

    def params(self, j: Job) -> Optional[bytes]:
        if not j.params_gen:
            return None
        if j.params_cache is None:
            j.params_cache = self.kv.get(self.key(j.name, f"params/{j.params_gen}"))
        return j.params_cache

    def params_tensors(self, j: Job) -> dict[str, np.ndarray]:
        data = self.params(j)
        if data is None:
            raise FedError(errno.EAGAIN, "no params")
        return st_load(data)[0]

    def public_key(self, j: Job, name: str) -> bytes:
        if name not in j.key_cache:
            data = self.kv.get(self.key(j.name, f"keys/{name}")) or b""
            j.key_cache[name] = parse_public_key(data)
        return j.key_cache[name]

    def commit_params(self, j: Job, blob: bytes) -> None:
        """Store a new params generation (the meta put that follows makes it current;
        the previous generation is deleted after that by drop_old_params)."""
        old = j.params_gen
        j.params_gen = old + 1
        self.kv.put(self.key(j.name, f"params/{j.params_gen}"), blob)
        j.params_cache = blob
        now = now_ns()
        j.params_entry = Entry(j.owner, j.gid, now, len(blob))
        j.mtime_ns = now
        j.old_params = old

    def drop_old_params(self, j: Job) -> None:
        if j.old_params:
            self.kv.delete(self.key(j.name, f"params/{j.old_params}"))
            j.old_params = 0
