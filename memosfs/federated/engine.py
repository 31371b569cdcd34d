"""The federated job engine's face: FederatedJobs, the `.federated` tree's operations.

Owns: FederatedJobs, the API memosfs/fuse/fedtree.py maps to inodes and handles
(docs/federated.md, "For fs.py"): the namespace changes (mkdir/rmdir of a job, create,
discard and unlink of updates and keys), the open-time checks, and the write
dispatcher, which checks who may write what (owner, client bindings, read-only files)
and applies config, params, keys and updates.  It holds the job table (state.JobStore)
and delegates reads to tree.JobTree, and validation, aggregation and mode he's files
(he/context, he/decrypted.safetensors) to rounds.Rounds.  The stores it persists
through (MemoryKV, DirKV) and the names a filesystem needs (FED_ROOT_MODE,
JOB_ENTRIES, FedError) are exported from here too.

May call: state, tree, rounds, config, crypto, tensors, errors, numpy.  Imported by
memosfs/fuse/fedtree.py, the benchmark and the tests; the client side (client.py)
never imports it.
"""

from __future__ import annotations

import errno
from typing import Callable, Optional, Sequence

import numpy as np

from memosfs.federated.config import (CONFIG_DEFAULTS, NAME_RE, expected_count, named_clients,
                                      parse_config, warm_imports)
from memosfs.federated.crypto import parse_public_key
from memosfs.federated.errors import FedError, log, refuse, refuse_job
from memosfs.federated.rounds import Rounds
from memosfs.federated.state import DirKV, Entry, Job, JobStore, MemoryKV, now_ns
from memosfs.federated.tensors import st_header, st_load, st_save
from memosfs.federated.tree import (DIR_MODES, FED_ROOT_MODE, FILE_MODES, HE_FILE_MODES,
                                    JOB_ENTRIES, KEY_SUFFIX, UPDATE_SUFFIX, JobTree,
                                    strip_suffix)

__all__ = ["FederatedJobs", "FedError", "MemoryKV", "DirKV", "FED_ROOT_MODE", "JOB_ENTRIES"]


class FederatedJobs:
    """The `.federated` tree, keyed by path components below it.

    Every method takes `parts`, a tuple of names relative to `.federated` (`()` is
    `.federated` itself, `("job1", "updates", "alice.safetensors")` an update), and
    raises FedError(errno, reason) to refuse (the reason is logged at INFO).

      getattr(parts) -> {"kind": "dir"|"file", "size", "mode", "uid", "gid",
                         "mtime", "mtime_ns"}      mode: permission bits only
      readdir(parts) -> [names]
      read(parts) -> bytes                         the whole file
      create(parts, uid, gid, mode) -> attr        O_CREAT of an update or key file
      write(parts, data, uid, gid=None)            the whole new content, at close/fsync
      discard(parts)                               a created file that got no write
      mkdir(parts, uid, gid, mode)                 a job (parts == (job,))
      unlink(parts, uid)                           an update or a key
      rmdir(parts, uid)                            a whole job
      resume() -> [jobs]                           aggregate rounds left complete by a restart

    Threads: every method may be called from any thread; one lock per job (and one
    for the job table) is held only briefly.  write() of the last update of a round
    (and of `aggregate`, `he/decrypted.safetensors`) runs the aggregation in the
    calling thread before it returns -- milliseconds for small models, seconds for
    large ones or in mode he -- with the job lock released while it computes, so call
    write() from a worker thread (trio.to_thread.run_sync), not the event loop.

    notify(paths) is called, outside any lock, with the parts whose content or
    existence changed after each state change (so fs.py can invalidate the kernel's
    attributes, pages and dentries).  Contents of every file change without a write
    by the reader, so the files should be served with direct_io (or invalidated).
    """


    def __init__(self, kv, notify: Optional[Callable[[list[tuple[str, ...]]], None]] = None,
                 prefix: str = "fed/", root_uid: int = 0, root_gid: int = 0) -> None:
        self.store = JobStore(kv, prefix)
        self.notify = notify
        self.tree = JobTree(self.store, root_uid, root_gid)
        self.rounds = Rounds(self.store, self._changed)
        self.restore()

    @property
    def kv(self):
        return self.store.kv

    @property
    def jobs(self) -> dict[str, Job]:
        """The jobs by name (read-only use: the table belongs to the store)."""
        return self.store.jobs

    def restore(self) -> None:
        """Load every job from the store; drop what no job's meta refers to (the
        leftovers of an update or a round that was cut short)."""
        self.store.restore()

    def resume(self) -> list[str]:
        """Aggregate every job whose round has all its updates (a restart between the
        last update and the commit).  Returns the jobs that advanced."""
        return self.rounds.resume()

    def _changed(self, paths: list[tuple[str, ...]]) -> None:
        if self.notify and paths:
            try:
                self.notify(paths)
            except Exception:
                log.exception("federated: notify failed")

    # ------------------------------------------------------------ getattr / readdir / read

    def getattr(self, parts: Sequence[str]) -> dict:
        return self.tree.getattr(parts)

    def readdir(self, parts: Sequence[str]) -> list[str]:
        return self.tree.readdir(parts)

    def read(self, parts: Sequence[str]) -> bytes:
        return self.tree.read(parts)

    # ------------------------------------------------------------ namespace changes

    def mkdir(self, parts: Sequence[str], uid: int, gid: int, mode: int = 0o755) -> dict:
        parts = tuple(parts)
        if len(parts) != 1:
            raise refuse(errno.EPERM, "mkdir %s: only jobs are made in .federated",
                         "/".join(parts))
        name = parts[0]
        if len(name.encode()) > 255:
            raise refuse(errno.ENAMETOOLONG, "job name longer than 255 bytes")
        if not NAME_RE.match(name):
            raise refuse(errno.EINVAL, "bad job name %r (letters, digits, _.@+- ; "
                         "not starting with a dot)", name)
        with self.store.lock:
            if name in self.store.jobs:
                raise refuse(errno.EEXIST, "job %s exists", name)
            now = now_ns()
            j = Job(name=name, owner=uid, gid=gid, mode=mode & 0o7777, ctime_ns=now,
                    config=dict(CONFIG_DEFAULTS), config_mtime_ns=now, mtime_ns=now)
            self.store.put_meta(j)
            self.store.jobs[name] = j
            self.store.mtime_ns = now
        warm_imports()
        log.info("federated: job %s created by uid %d", name, uid)
        self._changed([()])
        return self.getattr(parts)

    def rmdir(self, parts: Sequence[str], uid: int) -> None:
        parts = tuple(parts)
        if len(parts) != 1:
            raise refuse(errno.EPERM, "rmdir %s: the tree of a job is fixed",
                         "/".join(parts))
        with self.store.lock:
            j = self.store.job(parts[0])
            with j.lock:
                if not j.owned_by(uid):
                    raise refuse_job(j, errno.EACCES, "rmdir by uid %d: not the owner", uid)
                if j.busy:
                    raise refuse_job(j, errno.EBUSY, "rmdir while a round is aggregating")
                self.store.kv.delete(self.store.key(j.name, "meta"))   # the commit point
                for key in self.store.kv.keys(self.store.key(j.name)):
                    self.store.kv.delete(key)
                del self.store.jobs[j.name]
                self.store.mtime_ns = now_ns()
        log.info("federated: job %s removed by uid %d", parts[0], uid)
        self._changed([(), parts])

    def create(self, parts: Sequence[str], uid: int, gid: int, mode: int = 0o644) -> dict:
        """O_CREAT of updates/<client>.safetensors or keys/<client>.pub: checks the
        name (EPERM in a wrong place, EACCES for a client the job does not expect,
        EEXIST for a second update in the round or a second key) and shows an empty
        placeholder, owned by uid, until write() or discard()."""
        parts = tuple(parts)
        if len(parts) < 2:
            raise refuse(errno.EPERM, "create %s: only update and key files are created",
                         "/".join(parts) or ".federated")
        j = self.store.job(parts[0])
        with j.lock:
            try:
                self.tree.getattr_locked(j, parts)
                exists = True
            except FedError:
                exists = False
            if exists:
                if len(parts) == 3 and (parts[1], parts[2]) in j.placeholders:
                    return self.tree.getattr_locked(j, parts)
                raise refuse_job(j, errno.EEXIST, "%s exists", "/".join(parts[1:]))
            self._check_new_name(j, parts, uid)
            j.placeholders[(parts[1], parts[2])] = Entry(uid, gid, now_ns(), 0)
            return self.tree.getattr_locked(j, parts)

    def _check_new_name(self, j: Job, parts: tuple[str, ...], uid: int) -> str:
        if len(parts) != 3 or parts[1] not in ("updates", "keys"):
            raise refuse_job(j, errno.EPERM, "%s: only updates/<client>%s and "
                             "keys/<client>%s are created", "/".join(parts[1:]),
                             UPDATE_SUFFIX, KEY_SUFFIX)
        sub, leaf = parts[1], parts[2]
        suffix = UPDATE_SUFFIX if sub == "updates" else KEY_SUFFIX
        client = strip_suffix(leaf, suffix)
        if not client or not NAME_RE.match(client):
            raise refuse_job(j, errno.EPERM, "%s/%s: files here are named <client>%s",
                             sub, leaf, suffix)
        self._check_client(j, client, uid)
        if sub == "updates" and client in j.updates:
            raise refuse_job(j, errno.EEXIST, "%s already sent its update for round %d",
                             client, j.round)
        if sub == "keys" and client in j.keys:
            raise refuse_job(j, errno.EEXIST, "%s already has a key (unlink it first)",
                             client)
        return client

    def _same_key(self, j: Job, parts: tuple[str, ...], data: bytes, uid: int) -> bool:
        """A key written again, identical, by its owner: a no-op (fs.py re-applies a
        small file's text at every write())."""
        client = strip_suffix(parts[2], KEY_SUFFIX)
        if client not in j.keys or j.keys[client].uid != uid and uid != 0:
            return False
        try:
            return parse_public_key(data) == self.store.public_key(j, client)
        except ValueError:
            return False

    def _check_client(self, j: Job, client: str, uid: int) -> None:
        names = named_clients(j.config)
        if names is not None and client not in names:
            raise refuse_job(j, errno.EACCES, "client %s is not one of the job's "
                             "clients", client)
        bound = j.bindings.get(client)
        if bound is not None and bound != uid and uid != 0:
            raise refuse_job(j, errno.EACCES, "client %s belongs to uid %d, not %d",
                             client, bound, uid)
        if names is None and bound is None and \
                len(j.bindings) >= expected_count(j.config):
            raise refuse_job(j, errno.EACCES, "client %s: the job expects %d clients "
                             "and has them (%s)", client, expected_count(j.config),
                             ", ".join(sorted(j.bindings)))

    APPLY_ON_EACH_WRITE = ("config", "aggregate")

    def write_mode(self, parts: Sequence[str]) -> str:
        """"each": a small text file (config, aggregate, keys/<client>.pub) that fs.py
        should apply at every write() with the handle's whole text so far (as it does
        for knobs), so that `echo ... > file` sees the errno -- a shell does not report
        errors from close(); re-applying the same text is harmless.  "close": apply
        once, with the whole content, at flush/fsync/release (params, updates, he/*)."""
        parts = tuple(parts)
        if len(parts) == 2 and parts[1] in self.APPLY_ON_EACH_WRITE:
            return "each"
        if len(parts) == 3 and parts[1] == "keys":
            return "each"
        return "close"

    def check_open(self, parts: Sequence[str], uid: int, write: bool) -> None:
        """Refusals known at open(2) time, so that even root (whom default_permissions
        lets through) gets them at once: writing a read-only file (EACCES), reading an
        update (EACCES), writing an owner's file as someone else (EACCES), writing an
        update already sent this round or a key already there (EEXIST)."""
        parts = tuple(parts)
        if not parts:
            if write:
                raise refuse(errno.EISDIR, "open .federated for writing")
            return
        j = self.store.job(parts[0])
        with j.lock:
            attr = self.tree.getattr_locked(j, parts)
            if attr["kind"] == "dir":
                if write:
                    raise refuse_job(j, errno.EISDIR, "open %s for writing", "/".join(parts))
                return
            rel = "/".join(parts[1:])
            if len(parts) == 3 and parts[1] == "updates":
                if not write:
                    raise refuse_job(j, errno.EACCES, "updates are never read back (%s)", rel)
                if (parts[1], parts[2]) not in j.placeholders:
                    raise refuse_job(j, errno.EEXIST, "%s: already sent for round %d", rel,
                                     j.round)
                return
            if len(parts) == 3 and parts[1] == "keys":
                if write and (parts[1], parts[2]) not in j.placeholders:
                    raise refuse_job(j, errno.EEXIST, "%s exists (unlink it first)", rel)
                return
            if not write:
                return
            if attr["mode"] & 0o222 == 0:
                raise refuse_job(j, errno.EACCES, "%s is read-only", rel)
            if not j.owned_by(uid):
                raise refuse_job(j, errno.EACCES, "%s is written by the job's owner "
                                 "(uid %d), not uid %d", rel, j.owner, uid)

    def discard(self, parts: Sequence[str]) -> None:
        parts = tuple(parts)
        if len(parts) == 3 and parts[0] in self.store.jobs:
            j = self.store.jobs[parts[0]]
            with j.lock:
                j.placeholders.pop((parts[1], parts[2]), None)

    def unlink(self, parts: Sequence[str], uid: int) -> None:
        """Withdraw an update of the current round (its writer, the owner or root), or
        remove a key (same; EBUSY in mode secure while updates are pending)."""
        parts = tuple(parts)
        if len(parts) != 3 or parts[1] not in ("updates", "keys"):
            if len(parts) >= 1 and parts[0] in self.store.jobs:
                self.store.job(parts[0]).refused += 1
            raise refuse(errno.EPERM, "unlink %s: only updates and keys are removed",
                         "/".join(parts) or ".federated")
        j = self.store.job(parts[0])
        changed: list[tuple[str, ...]] = []
        with j.lock:
            sub, leaf = parts[1], parts[2]
            if (sub, leaf) in j.placeholders:
                del j.placeholders[(sub, leaf)]
                return
            if sub == "updates":
                client = strip_suffix(leaf, UPDATE_SUFFIX)
                e = j.updates.get(client) if client else None
                if e is None:
                    raise FedError(errno.ENOENT, "/".join(parts))
                if not (j.owned_by(uid) or uid == e.uid):
                    raise refuse_job(j, errno.EACCES, "unlink %s by uid %d", leaf, uid)
                if j.busy or j.phase != "collecting":
                    raise refuse_job(j, errno.EBUSY, "unlink %s: round %d is being "
                                     "aggregated", leaf, j.round)
                del j.updates[client]
                j.mtime_ns = now_ns()
                self.store.put_meta(j)
                self.store.kv.delete(self.store.key(j.name, f"updates/{j.round}/{client}"))
                log.info("federated: job %s: update of %s for round %d withdrawn by uid %d",
                         j.name, client, j.round, uid)
            else:
                client = strip_suffix(leaf, KEY_SUFFIX)
                e = j.keys.get(client) if client else None
                if e is None:
                    raise FedError(errno.ENOENT, "/".join(parts))
                if not (j.owned_by(uid) or uid == e.uid):
                    raise refuse_job(j, errno.EACCES, "unlink %s by uid %d", leaf, uid)
                if j.config["mode"] == "secure" and (j.updates or j.busy):
                    raise refuse_job(j, errno.EBUSY, "key %s: round %d has masked updates "
                                     "made with it", client, j.round)
                del j.keys[client]
                j.key_cache.pop(client, None)
                if client not in j.updates:
                    j.bindings.pop(client, None)
                j.mtime_ns = now_ns()
                self.store.put_meta(j)
                self.store.kv.delete(self.store.key(j.name, f"keys/{client}"))
            changed = self.rounds.maybe_apply_pending(j) + [parts, (j.name, parts[1]),
                                                      (j.name, "status")]
        self._changed(changed)

    # ------------------------------------------------------------ writes

    def write(self, parts: Sequence[str], data: bytes, uid: int, gid: Optional[int] = None) -> None:
        """The whole new content of a file (fs.py buffers a handle's writes and calls
        this once, at flush/fsync/release).  Refusals raise FedError and change
        nothing; the last update of a round aggregates it before this returns."""
        parts = tuple(parts)
        data = bytes(data)
        if not parts:
            raise refuse(errno.EISDIR, "write to .federated")
        j = self.store.job(parts[0])
        if len(parts) == 1 or (len(parts) == 2 and parts[1] in DIR_MODES):
            raise refuse_job(j, errno.EISDIR, "write to %s", "/".join(parts))
        if len(parts) == 2:
            name = parts[1]
            if name in ("round", "status", "privacy", "history"):
                raise refuse_job(j, errno.EACCES, "%s is read-only", name)
            if name not in FILE_MODES:
                raise refuse_job(j, errno.EPERM, "%s: no such file in a job", name)
            if not j.owned_by(uid):
                raise refuse_job(j, errno.EACCES, "%s is written by the job's owner "
                                 "(uid %d), not uid %d", name, j.owner, uid)
            if name == "config":
                return self._write_config(j, data)
            if name == "params.safetensors":
                return self._write_params(j, data)
            if name == "aggregate":
                if data.strip() != b"1":
                    raise refuse_job(j, errno.EINVAL, "aggregate: write 1")
                return self.rounds.aggregate(j, trigger=True)
        if len(parts) == 3 and parts[1] == "updates":
            return self._write_update(j, parts, data, uid, j.gid if gid is None else gid)
        if len(parts) == 3 and parts[1] == "keys":
            return self._write_key(j, parts, data, uid, j.gid if gid is None else gid)
        if len(parts) == 3 and parts[1] == "he":
            leaf = parts[2]
            if leaf == "sum":
                raise refuse_job(j, errno.EACCES, "he/sum is read-only")
            if leaf not in HE_FILE_MODES:
                raise refuse_job(j, errno.EPERM, "he/%s: no such file", leaf)
            if not j.owned_by(uid):
                raise refuse_job(j, errno.EACCES, "he/%s is written by the job's owner",
                                 leaf)
            if leaf == "context":
                return self.rounds.write_he_context(j, data)
            return self.rounds.write_decrypted(j, data)
        raise refuse_job(j, errno.EPERM, "%s: no such file in a job", "/".join(parts[1:]))

    def _write_config(self, j: Job, data: bytes) -> None:
        with j.lock:
            base = j.pending_config if j.pending_config is not None else j.config
            try:
                cfg = parse_config(data, base)
            except (ValueError, UnicodeDecodeError) as e:
                raise refuse_job(j, errno.EINVAL, "config: %s", e) from None
            j.config_mtime_ns = now_ns()
            if j.updates or j.busy or j.phase != "collecting":
                j.pending_config = cfg if cfg != j.config else None
                log.info("federated: job %s: config change pending until round %d",
                         j.name, j.round + 1)
            else:
                self.rounds.set_config(j, cfg)
            self.store.put_meta(j)
        self._changed([(j.name, "config"), (j.name, "status"), (j.name, "privacy")])

    def _write_params(self, j: Job, data: bytes) -> None:
        try:
            tensors, meta = st_load(data)
        except ValueError as e:
            raise refuse_job(j, errno.EINVAL, "params.safetensors: %s", e) from None
        if not tensors:
            raise refuse_job(j, errno.EINVAL, "params.safetensors holds no tensor")
        for k, a in tensors.items():
            if a.dtype.kind != "f":
                raise refuse_job(j, errno.EINVAL, "params: tensor %s is %s (floats only)",
                                 k, a.dtype)
            if not np.all(np.isfinite(a)):
                raise refuse_job(j, errno.EINVAL, "params: tensor %s not finite", k)
        with j.lock:
            if j.updates or j.busy or j.phase != "collecting":
                raise refuse_job(j, errno.EBUSY, "params: round %d has pending updates",
                                 j.round)
            meta = dict(meta)
            meta.update({"round": str(j.round), "job": j.name})
            self.store.commit_params(j, st_save(tensors, meta))
            self.store.put_meta(j)
            log.info("federated: job %s: params set by the owner (%d tensors, %d bytes)",
                     j.name, len(tensors), j.params_entry.size)
        self._changed([(j.name, "params.safetensors"), (j.name, "status")])

    def _write_key(self, j: Job, parts: tuple[str, ...], data: bytes, uid: int, gid: int) -> None:
        changed = [parts, (j.name, "keys"), (j.name, "status")]
        try:
            with j.lock:
                if self._same_key(j, parts, data, uid):
                    return
                j.placeholders.pop((parts[1], parts[2]), None)
                client = self._check_new_name(j, parts, uid)
                try:
                    raw = parse_public_key(data)
                except ValueError as e:
                    raise refuse_job(j, errno.EINVAL, "key %s: %s", client, e) from None
                if j.config["mode"] == "secure" and (j.updates or j.busy):
                    raise refuse_job(j, errno.EBUSY, "key %s: round %d already has masked "
                                     "updates", client, j.round)
                text = (raw.hex() + "\n").encode()
                self.store.kv.put(self.store.key(j.name, f"keys/{client}"), text)
                j.keys[client] = Entry(uid, gid, now_ns(), len(text))
                j.key_cache[client] = raw
                j.bindings.setdefault(client, uid)
                j.mtime_ns = now_ns()
                self.store.put_meta(j)
        finally:
            self._changed(changed)
        log.info("federated: job %s: key of %s registered (uid %d)", j.name, client, uid)

    def _write_update(self, j: Job, parts: tuple[str, ...], data: bytes, uid: int,
                      gid: int) -> None:
        changed = [parts, (j.name, "updates"), (j.name, "status")]
        try:
            with j.lock:
                j.placeholders.pop((parts[1], parts[2]), None)
                client = self._check_new_name_round(j, parts, uid, data)
                if j.busy or j.phase != "collecting":
                    raise refuse_job(j, errno.ESTALE, "update of %s: round %d is closed "
                                     "(%s)", client, j.round,
                                     "aggregating" if j.busy else j.phase)
                if not j.params_gen:
                    raise refuse_job(j, errno.EAGAIN, "update of %s: the job has no params "
                                     "yet", client)
                self.rounds.validate_update(j, client, data)
                self.store.kv.put(self.store.key(j.name, f"updates/{j.round}/{client}"), data)
                now = now_ns()
                j.updates[client] = Entry(uid, gid, now, len(data))
                j.bindings.setdefault(client, uid)
                j.mtime_ns = now
                self.store.put_meta(j)     # the commit point of the update
                log.info("federated: job %s: update of %s for round %d accepted (%d bytes, "
                         "%d of %d)", j.name, client, j.round, len(data), len(j.updates),
                         expected_count(j.config))
                complete = self.rounds.complete(j)
        finally:
            self._changed(changed)
        if complete:
            try:
                self.rounds.aggregate(j, trigger=False)
            except FedError:
                pass    # logged, and in status (last_error); the update was accepted

    def _check_new_name_round(self, j: Job, parts: tuple[str, ...], uid: int,
                              data: bytes) -> str:
        """Name and client checks, then the round (ESTALE before EEXIST: a late update
        is late even if the client already sent this round's)."""
        try:
            self._check_new_name(j, parts, uid)
        except FedError as e:
            if e.errno != errno.EEXIST:
                raise
            try:
                r = st_header(data)[2].get("round")
            except ValueError:
                r = None
            if r is not None and r != str(j.round):
                raise refuse_job(j, errno.ESTALE, "update of %s is for round %s; the job "
                                 "is at round %d", strip_suffix(parts[2], UPDATE_SUFFIX), r,
                                 j.round) from None
            raise
        return strip_suffix(parts[2], UPDATE_SUFFIX) or ""
