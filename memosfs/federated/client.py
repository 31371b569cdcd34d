"""The client side of a federated job: update encoding, transports and FedClient.

Owns: make_update (a delta clipped, noised and encoded for the job's mode: plain,
secure = fixed point + pairwise masks, he = CKKS ciphertexts), decrypted_sum_bytes (the
key holder's step in mode he), the transports a client speaks through (PathTransport:
a job directory of a mount; InprocTransport: any object with FederatedJobs' path API,
called in-process, without FUSE) and FedClient (keys, params, updates of one client).

May call: tensors, crypto, config, errors (FedError), numpy.  It imports nothing of
the job engine (state, tree, rounds, engine): what an agent imports to take part in a
job does not pull in the server.
"""

from __future__ import annotations

import errno
import math
import os
from typing import Any, Optional

import numpy as np

from memosfs.federated.config import NAME_RE, expected_count, parse_config
from memosfs.federated.crypto import (generate_keypair, he_chunks, he_context, he_decrypt,
                                      he_encrypt, he_pack, mask_update, parse_public_key,
                                      peers_digest)
from memosfs.federated.errors import FedError
from memosfs.federated.tensors import (FRAC_BITS, as_numpy, clip_gradients, encode_fixed,
                                       flatten, make_rng, noise_injection, st_load,
                                       st_save, unflatten)


def make_update(params: dict[str, np.ndarray], delta: dict[str, Any], round_: int,
                config: dict[str, Any], *, client: str = "", job: str = "",
                rng: Any = None, private_key=None, peers: Optional[dict[str, bytes]] = None,
                he_public=None) -> bytes:
    """The bytes of updates/<client>.safetensors for this round and config.

    plain:  the delta clipped to clip_norm (the server clips again and adds the noise);
    secure: clipped, plus this client's noise share N(0, (zC)^2/n), fixed-point encoded
            and masked against `peers` (names -> public keys of all participants);
    he:     clipped, plus the noise share, CKKS-encrypted under `he_public` (a context).
    """
    mode = config["mode"]
    C = float(config["clip_norm"])
    z = float(config["noise_multiplier"])
    n = expected_count(config)
    if sorted(delta) != sorted(params):
        raise ValueError("delta tensors must be named as the params")
    d = clip_gradients({k: as_numpy(v).astype(np.float64) for k, v in delta.items()}, C)
    meta = {"round": str(round_), "encoding": mode}
    if client:
        meta["client"] = client
    if mode == "plain":
        return st_save({k: d[k].astype(params[k].dtype) for k in d}, meta)
    if z > 0:
        d = noise_injection(d, z * C / math.sqrt(n), rng)
    vec = flatten(d)
    if mode == "secure":
        if private_key is None or peers is None:
            raise ValueError("secure mode needs the private key and the peers' keys")
        masked = mask_update(encode_fixed(vec), client, private_key, peers, job, round_)
        meta["peers"] = peers_digest(peers)
        meta["frac_bits"] = str(FRAC_BITS)
        return st_save(unflatten(masked, params, np.uint64), meta)
    if mode == "he":
        if he_public is None:
            raise ValueError("he mode needs the public context")
        meta["n"] = str(len(vec))
        return st_save(he_pack(he_encrypt(he_public, vec)), meta)
    raise ValueError(f"unknown mode {mode!r}")


def decrypted_sum_bytes(secret_ctx, he_sum: bytes, params: dict[str, np.ndarray]) -> bytes:
    """The key holder's step in mode he: decrypt he/sum and return the bytes of
    he/decrypted.safetensors (float64 tensors named like the params)."""
    tensors, meta = st_load(he_sum)
    vec = he_decrypt(secret_ctx, he_chunks(tensors))
    n = int(meta.get("n", len(vec)))
    out = unflatten(vec[:n], params, np.float64)
    return st_save(out, {"round": meta.get("round", ""), "encoding": "he-decrypted"})


class InprocTransport:
    """A job reached through a FederatedJobs (memosfs.federated.engine) directly, as the
    filesystem would call it."""

    def __init__(self, jobs: Any, job: str, uid: int = 0, gid: int = 0) -> None:
        self.jobs, self.job, self.uid, self.gid = jobs, job, uid, gid

    def _parts(self, rel: str) -> tuple[str, ...]:
        return (self.job,) + tuple(p for p in rel.split("/") if p)

    def read(self, rel: str) -> bytes:
        return self.jobs.read(self._parts(rel))

    def write(self, rel: str, data: bytes) -> None:
        parts = self._parts(rel)
        try:
            self.jobs.getattr(parts)
        except FedError as e:
            if e.errno != errno.ENOENT:
                raise
            self.jobs.create(parts, self.uid, self.gid, 0o644)
        self.jobs.write(parts, data, self.uid, self.gid)

    def listdir(self, rel: str) -> list[str]:
        return self.jobs.readdir(self._parts(rel))

    def exists(self, rel: str) -> bool:
        try:
            self.jobs.getattr(self._parts(rel))
            return True
        except FedError:
            return False


class PathTransport:
    """A job directory in a mount: plain file I/O (a refusal is an OSError from
    close or write, with the errno)."""

    def __init__(self, jobdir: str) -> None:
        self.jobdir = jobdir

    def read(self, rel: str) -> bytes:
        with open(os.path.join(self.jobdir, rel), "rb") as f:
            return f.read()

    def write(self, rel: str, data: bytes) -> None:
        fd = os.open(os.path.join(self.jobdir, rel), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        except BaseException:
            try:
                os.close(fd)
            finally:
                raise
        os.close(fd)

    def listdir(self, rel: str) -> list[str]:
        return sorted(os.listdir(os.path.join(self.jobdir, rel)))

    def exists(self, rel: str) -> bool:
        return os.path.exists(os.path.join(self.jobdir, rel))


class FedClient:
    """One client of a job: keys, params, updates, through a transport."""

    def __init__(self, name: str, transport, job: str, rng: Any = None,
                 key_seed: Optional[bytes] = None) -> None:
        if not NAME_RE.match(name):
            raise ValueError(f"bad client name {name!r}")
        self.name, self.t, self.job = name, transport, job
        self.rng = make_rng(rng)
        self.private_key, self.public_key = generate_keypair(key_seed)
        self._he: Optional[tuple[bytes, Any]] = None

    def config(self) -> dict[str, Any]:
        return parse_config(self.t.read("config"))

    def publish_key(self) -> None:
        self.t.write(f"keys/{self.name}.pub", (self.public_key.hex() + "\n").encode())

    def peers(self, config: Optional[dict[str, Any]] = None) -> dict[str, bytes]:
        """The secure round's participants: names -> public keys (the configured names
        where the job names its clients, else every key in keys/)."""
        cfg = config or self.config()
        named = cfg["clients"] if isinstance(cfg["clients"], list) else None
        out = {}
        for fn in self.t.listdir("keys"):
            name = fn[:-4]
            if fn.endswith(".pub") and (named is None or name in named):
                out[name] = parse_public_key(self.t.read(f"keys/{fn}"))
        return out

    def params(self) -> tuple[dict[str, np.ndarray], int]:
        tensors, meta = st_load(self.t.read("params.safetensors"))
        return tensors, int(meta.get("round", "0"))

    def he_public(self):
        data = self.t.read("he/context")
        if self._he is None or self._he[0] != data:
            self._he = (data, he_context(data))
        return self._he[1]

    def submit(self, params: dict[str, np.ndarray], delta: dict[str, Any], round_: int,
               config: Optional[dict[str, Any]] = None,
               peers: Optional[dict[str, bytes]] = None) -> int:
        """Write this client's update for round_; returns its size in bytes."""
        cfg = config or self.config()
        kw: dict[str, Any] = {}
        if cfg["mode"] == "secure":
            kw = {"private_key": self.private_key, "peers": peers or self.peers(cfg)}
        elif cfg["mode"] == "he":
            kw = {"he_public": self.he_public()}
        data = make_update(params, delta, round_, cfg, client=self.name, job=self.job,
                           rng=self.rng, **kw)
        self.t.write(f"updates/{self.name}.safetensors", data)
        return len(data)
