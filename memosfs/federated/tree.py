"""The `.federated` tree as the filesystem sees it: names, modes, attributes, listings
and the contents of every file a job serves.

Owns: the shape of a job directory (JOB_ENTRIES, the modes in FILE_MODES, DIR_MODES,
HE_FILE_MODES, UPDATE_MODE, KEY_MODE, the file suffixes) and JobTree, the read side of
the tree: getattr, readdir and read of `.federated`, a job, its files and the
updates/, keys/ and he/ folders, with the text files rendered from the job's state
(config, round, status, privacy, history).

May call: state (the job table, params and keys through its caches), config
(format_config, named_clients, fmt_epsilon), errors.  Nothing of rounds or engine.
"""

from __future__ import annotations

import errno
from typing import Optional, Sequence

from memosfs.federated.config import (CONFIG_ORDER, expected_count, fmt_epsilon,
                                      format_config, named_clients)
from memosfs.federated.errors import FedError, refuse_job
from memosfs.federated.state import Job, JobStore

FED_ROOT_MODE = 0o1777
FILE_MODES = {
    "config": 0o644, "params.safetensors": 0o644, "round": 0o444, "status": 0o444,
    "privacy": 0o444, "history": 0o444, "aggregate": 0o200,
}
DIR_MODES = {"updates": 0o1733, "keys": 0o1777, "he": 0o755}
HE_FILE_MODES = {"context": 0o644, "sum": 0o444, "decrypted.safetensors": 0o200}
UPDATE_MODE = 0o200
KEY_MODE = 0o644
UPDATE_SUFFIX = ".safetensors"
KEY_SUFFIX = ".pub"
JOB_ENTRIES = ["aggregate", "config", "he", "history", "keys", "params.safetensors",
               "privacy", "round", "status", "updates"]
HISTORY_MAX = 10000


def strip_suffix(name: str, suffix: str) -> Optional[str]:
    """The client of `<client><suffix>`; None for another name."""
    if name.endswith(suffix) and len(name) > len(suffix):
        return name[:-len(suffix)]
    return None


def runs(values: Sequence[float]) -> str:
    """1 1 1 0.5 -> '1x3 0.5x1'."""
    out: list[list] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return " ".join(f"{v:g}x{c}" for v, c in out) or "-"


def make_attr(kind: str, size: int, mode: int, uid: int, gid: int, mtime_ns: int) -> dict:
    return {"kind": kind, "size": size, "mode": mode, "uid": uid, "gid": gid,
            "mtime_ns": mtime_ns, "mtime": mtime_ns / 1e9}


class JobTree:
    """Attributes, listings and contents of the tree over a JobStore; `.federated`
    itself is owned by root_uid:root_gid.  getattr/readdir/read take the job's lock;
    getattr_locked and text expect it held."""

    def __init__(self, store: JobStore, root_uid: int = 0, root_gid: int = 0) -> None:
        self.store = store
        self.root_uid, self.root_gid = root_uid, root_gid

    def getattr(self, parts: Sequence[str]) -> dict:
        parts = tuple(parts)
        if not parts:
            return make_attr("dir", 0, FED_ROOT_MODE, self.root_uid, self.root_gid,
                             self.store.mtime_ns)
        j = self.store.job(parts[0])
        with j.lock:
            return self.getattr_locked(j, parts)

    def getattr_locked(self, j: Job, parts: tuple[str, ...]) -> dict:
        enoent = FedError(errno.ENOENT, "/".join(parts))
        if len(parts) == 1:
            return make_attr("dir", 0, j.mode, j.owner, j.gid, j.mtime_ns)
        name = parts[1]
        if len(parts) == 2:
            if name in DIR_MODES:
                return make_attr("dir", 0, DIR_MODES[name], j.owner, j.gid, j.mtime_ns)
            if name == "params.safetensors":
                e = j.params_entry
                return make_attr("file", e.size if e else 0, FILE_MODES[name], j.owner,
                                 j.gid, e.mtime_ns if e else j.ctime_ns)
            if name in FILE_MODES:
                mt = j.config_mtime_ns if name == "config" else j.mtime_ns
                return make_attr("file", len(self.text(j, name)), FILE_MODES[name],
                                 j.owner, j.gid, mt)
            raise enoent
        if len(parts) != 3:
            raise enoent
        sub, leaf = name, parts[2]
        if sub == "updates":
            client = strip_suffix(leaf, UPDATE_SUFFIX)
            e = j.updates.get(client) if client else None
            e = e or j.placeholders.get((sub, leaf))
            if e is None:
                raise enoent
            return make_attr("file", e.size, UPDATE_MODE, e.uid, e.gid, e.mtime_ns)
        if sub == "keys":
            client = strip_suffix(leaf, KEY_SUFFIX)
            e = j.keys.get(client) if client else None
            e = e or j.placeholders.get((sub, leaf))
            if e is None:
                raise enoent
            return make_attr("file", e.size, KEY_MODE, e.uid, e.gid, e.mtime_ns)
        if sub == "he":
            if leaf == "context":
                e = j.he_context
                return make_attr("file", e.size if e else 0, HE_FILE_MODES[leaf], j.owner,
                                 j.gid, e.mtime_ns if e else j.ctime_ns)
            if leaf == "sum" and j.he_sum is not None:
                return make_attr("file", j.he_sum["size"], HE_FILE_MODES[leaf], j.owner,
                                 j.gid, j.he_sum["mtime_ns"])
            if leaf == "decrypted.safetensors":
                return make_attr("file", 0, HE_FILE_MODES[leaf], j.owner, j.gid, j.mtime_ns)
        raise enoent

    def readdir(self, parts: Sequence[str]) -> list[str]:
        parts = tuple(parts)
        if not parts:
            with self.store.lock:
                return sorted(self.store.jobs)
        j = self.store.job(parts[0])
        with j.lock:
            if len(parts) == 1:
                return list(JOB_ENTRIES)
            if len(parts) == 2 and parts[1] == "updates":
                names = {c + UPDATE_SUFFIX for c in j.updates}
                names |= {leaf for (d, leaf) in j.placeholders if d == "updates"}
                return sorted(names)
            if len(parts) == 2 and parts[1] == "keys":
                names = {c + KEY_SUFFIX for c in j.keys}
                names |= {leaf for (d, leaf) in j.placeholders if d == "keys"}
                return sorted(names)
            if len(parts) == 2 and parts[1] == "he":
                names = ["context", "decrypted.safetensors"]
                if j.he_sum is not None:
                    names.append("sum")
                return sorted(names)
            attr = self.getattr_locked(j, parts)
            raise FedError(errno.ENOTDIR if attr["kind"] == "file" else errno.ENOENT,
                           "/".join(parts))

    def read(self, parts: Sequence[str]) -> bytes:
        parts = tuple(parts)
        if not parts:
            raise FedError(errno.EISDIR, ".federated")
        j = self.store.job(parts[0])
        with j.lock:
            attr = self.getattr_locked(j, parts)
            if attr["kind"] == "dir":
                raise FedError(errno.EISDIR, "/".join(parts))
            if len(parts) == 2:
                if parts[1] == "params.safetensors":
                    return self.store.params(j) or b""
                return self.text(j, parts[1])
            sub, leaf = parts[1], parts[2]
            if sub == "updates":
                raise refuse_job(j, errno.EACCES, "updates are never read back (%s)", leaf)
            if sub == "keys":
                client = strip_suffix(leaf, KEY_SUFFIX)
                if client not in j.keys:
                    return b""    # a placeholder
                return (self.store.public_key(j, client).hex() + "\n").encode()
            if leaf == "context":
                if j.he_context is None:
                    return b""
                return self.store.kv.get(self.store.key(j.name, "he/context")) or b""
            if leaf == "sum":
                key = self.store.key(j.name, f"he/sum/{j.he_sum['round']}")
                return self.store.kv.get(key) or b""
            return b""

    # ------------------------------------------------------------ text files

    def text(self, j: Job, name: str) -> bytes:
        if name == "config":
            text = format_config(j.config)
            if j.pending_config is not None:
                text += "# from round %d (after the pending updates):\n" % (j.round + 1)
                for k in CONFIG_ORDER:
                    if j.pending_config[k] != j.config[k]:
                        text += "#   " + format_config(j.pending_config).splitlines()[
                            CONFIG_ORDER.index(k)] + "\n"
            return text.encode()
        if name == "round":
            return f"{j.round}\n".encode()
        if name == "privacy":
            eps = j.epsilon()
            return (f"epsilon {fmt_epsilon(eps)}\n"
                    f"delta {j.config['delta']:g}\n"
                    f"rounds {len(j.events)}\n"
                    f"noise_multiplier {j.config['noise_multiplier']:g}\n"
                    f"noise_multipliers_applied {runs(j.events)}\n"
                    f"sampling_rate 1\n"
                    f"clip_norm {j.config['clip_norm']:g}\n"
                    f"accountant rdp (dp-accounting)\n"
                    f"neighboring add_or_remove_one_client\n").encode()
        if name == "status":
            names = named_clients(j.config)
            expected = expected_count(j.config)
            lines = [f"job {j.name}", f"round {j.round}", f"mode {j.config['mode']}",
                     f"phase {'aggregating' if j.busy else j.phase}",
                     f"expected {expected}", f"received {len(j.updates)}",
                     f"received_clients {' '.join(sorted(j.updates)) or '-'}"]
            if names is not None:
                miss = [n for n in names if n not in j.updates]
                lines.append(f"missing {' '.join(miss) or '-'}")
            else:
                lines.append(f"missing {max(0, expected - len(j.updates))}")
            lines += [f"keys {' '.join(sorted(j.keys)) or '-'}",
                      f"params {'yes' if j.params_gen else 'no'}",
                      f"he_context {'yes' if j.he_context else 'no'}",
                      f"config_pending {'yes' if j.pending_config else 'no'}",
                      f"refused {j.refused}",
                      f"last_error {j.last_error or '-'}"]
            return ("\n".join(lines) + "\n").encode()
        if name == "history":
            return "".join(h + "\n" for h in j.history).encode()
        if name == "aggregate":
            return b""
        raise FedError(errno.ENOENT, name)
