"""Federated aggregation on the cache: clipped, noised, securely summed updates.

A federated job is a directory of the mount, `.federated/<job>/` (docs/federated.md
has the whole contract).  This module holds both sides:

  client helpers   clip_gradients, noise_injection, fixed-point encoding, pairwise
                   additive masks (X25519 -> HKDF-SHA256 -> ChaCha20), CKKS encryption
                   (TenSEAL, optional), update encoders, and FedClient, which speaks to
                   a job through a transport (a mounted directory or FederatedJobs
                   in-process);
  server side      FederatedJobs: the `.federated` tree as a path-keyed virtual
                   filesystem that fs.py maps to inodes.  State goes through a small
                   key-value interface (get/put/delete/keys) so that a restart or a
                   failed round loses nothing.

Conventions.  An update is a model *delta* (local model minus the global model the
client started from); the server applies `params += learning_rate * aggregate`, with
`aggregate = (sum of clipped updates + noise) / m` over the m updates of the round.  A
client that has a gradient g sends -g (times its own step size).  Noise on the sum has
standard deviation noise_multiplier * clip_norm, i.e. sigma = z * C / m on the mean.

Modes.
  plain   the server sees every update: it clips each one to clip_norm (whatever the
          client did) and adds the Gaussian noise to the sum itself (central DP).
  secure  pairwise additive masking in the ring Z/2^64: the server only ever sees
          masked vectors, which are uniformly distributed whatever the data, and the
          masks cancel exactly in the sum of *all* participants.  The server cannot
          clip or add noise to what it cannot see: each client clips, adds its share
          N(0, (zC)^2 / n) of the noise (distributed DP; the shares sum to N(0, (zC)^2))
          and masks.  Dropout: if one participant is missing, the masks do not cancel,
          so the round cannot be aggregated (EAGAIN) until it arrives or the owner
          changes the participant set for a later round.  No mask recovery (SecAgg's
          Shamir-shared seeds) is implemented.
  he      CKKS homomorphic encryption (TenSEAL): the job owner is the key holder; it
          writes a public context (no secret key) to he/context; clients clip, add their
          noise share and encrypt; the server adds ciphertexts and publishes the
          encrypted sum as he/sum; the owner decrypts it and writes the plaintext sum to
          he/decrypted.safetensors; the server then applies it.  Partial participation
          works (the trigger), and the accounting uses the noise actually present.

Accounting: each applied round is one Gaussian mechanism with sensitivity C on the sum
(add/remove one client, user-level DP) and effective noise multiplier z_eff (= z, or
z * sqrt(m/n) when only m of n distributed-noise shares arrived); sampling rate q = 1
(every expected client takes part, no amplification claimed).  epsilon for the
configured delta comes from dp-accounting's RdpAccountant, recomputed from the list of
per-round z_eff.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import logging
import math
import os
import re
import secrets
import struct
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import numpy as np

from memosfs.private import open_private, private_makedirs, tighten_tree

log = logging.getLogger("memosfs.federated.jobs")

__all__ = [
    "FedError", "MemoryKV", "DirKV", "FederatedJobs",
    "clip_gradients", "noise_injection", "global_norm",
    "encode_fixed", "decode_fixed", "generate_keypair", "public_key_bytes",
    "pair_mask", "mask_update", "peers_digest",
    "HE_AVAILABLE", "he_keygen", "he_encrypt", "he_decrypt",
    "make_update", "decrypted_sum_bytes", "FedClient", "InprocTransport",
    "PathTransport", "epsilon_for", "parse_config", "format_config",
    "st_load", "st_save",
]

# Optional libraries, imported on first use: dp-accounting takes ~2 s to import (scipy)
# and tenseal ~0.3 s, which a mount should not pay at start.
HE_AVAILABLE = importlib.util.find_spec("tenseal") is not None
ACCOUNTANT_AVAILABLE = importlib.util.find_spec("dp_accounting") is not None
_ts: Any = None


def _tenseal():
    global _ts
    if _ts is None:
        import tenseal
        _ts = tenseal
    return _ts


def _accountant():
    from dp_accounting import dp_event, rdp
    return dp_event, rdp


_warmed = False


def _warm_imports() -> None:
    """Import dp-accounting in a background thread once a job exists, so that the
    first round's accounting does not wait ~2 s for it."""
    global _warmed
    if _warmed or not ACCOUNTANT_AVAILABLE:
        return
    _warmed = True

    def imp() -> None:
        try:
            _accountant()
        except Exception:
            log.exception("federated: importing dp-accounting failed")
    threading.Thread(target=imp, name="memosfs-fed-import", daemon=True).start()


# ---------------------------------------------------------------- errors


class FedError(OSError):
    """A refused request: `.errno` is the code to answer, the message the reason
    (already logged when it came from FederatedJobs)."""

    def __init__(self, code: int, msg: str) -> None:
        super().__init__(code, msg)


def _refuse(code: int, fmt: str, *args: object) -> FedError:
    msg = fmt % args if args else fmt
    log.info("refused (%s): %s", errno.errorcode.get(code, code), msg)
    return FedError(code, msg)


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


# ---------------------------------------------------------------- safetensors

_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
              "U64": np.uint64, "I64": np.int64, "U8": np.uint8, "I32": np.int32,
              "U32": np.uint32}
_ST_NAMES = {np.dtype(v).str: k for k, v in _ST_DTYPES.items()}
FLOAT_DTYPES = ("F64", "F32", "F16")


def st_header(buf: bytes) -> tuple[int, dict, dict]:
    """(data offset, tensor infos, metadata) of a well-formed safetensors file; else
    ValueError with the reason."""
    if len(buf) < 8:
        raise ValueError("shorter than a safetensors header")
    (n,) = struct.unpack_from("<Q", buf, 0)
    if n < 2 or 8 + n > len(buf) or n > 100 << 20:
        raise ValueError("bad safetensors header length")
    try:
        header = json.loads(bytes(buf[8:8 + n]))
    except (ValueError, UnicodeDecodeError):
        raise ValueError("safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise ValueError("safetensors header is not an object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("bad __metadata__")
    data_len = len(buf) - 8 - n
    spans = []
    for name, info in header.items():
        try:
            dtype = info["dtype"]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"bad tensor entry {name!r}") from None
        if dtype not in _ST_DTYPES:
            raise ValueError(f"tensor {name!r}: dtype {dtype} not supported")
        if any(d < 0 for d in shape) or not 0 <= begin <= end <= data_len:
            raise ValueError(f"tensor {name!r}: bad shape or offsets")
        need = int(np.prod(shape, dtype=np.int64)) * np.dtype(_ST_DTYPES[dtype]).itemsize
        if end - begin != need:
            raise ValueError(f"tensor {name!r}: {end - begin} bytes for {need}")
        info["shape"] = shape
        info["data_offsets"] = [begin, end]
        spans.append((begin, end))
    spans.sort()
    for (b0, e0), (b1, _) in zip(spans, spans[1:]):
        if b1 < e0:
            raise ValueError("overlapping tensors")
    return 8 + n, header, meta


def st_load(buf: bytes) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Tensors (numpy, copies) and metadata of a safetensors file; ValueError if
    malformed."""
    off, header, meta = st_header(buf)
    out = {}
    for name, info in header.items():
        b, e = info["data_offsets"]
        dt = np.dtype(_ST_DTYPES[info["dtype"]]).newbyteorder("<")
        out[name] = np.frombuffer(buf, dtype=dt, count=(e - b) // dt.itemsize,
                                  offset=off + b).reshape(info["shape"]).astype(
                                      dt.newbyteorder("="), copy=True)
    return out, meta


def st_save(tensors: dict[str, np.ndarray], metadata: Optional[dict[str, str]] = None) -> bytes:
    """Safetensors bytes, tensors in name order, 8-byte aligned header."""
    header: dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    pos = 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        a = a.astype(a.dtype.newbyteorder("<"), copy=False)
        key = np.dtype(a.dtype).newbyteorder("=").str
        if a.dtype.newbyteorder("=").str not in _ST_NAMES:
            raise ValueError(f"dtype {a.dtype} not supported")
        raw = a.tobytes()
        header[name] = {"dtype": _ST_NAMES[key], "shape": list(a.shape),
                        "data_offsets": [pos, pos + len(raw)]}
        blobs.append(raw)
        pos += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-(len(h)) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


# ---------------------------------------------------------------- tensors (client helpers)


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _as_numpy(x: Any) -> np.ndarray:
    if _is_torch(x):
        return x.detach().cpu().double().numpy()
    return np.asarray(x)


def global_norm(update: dict[str, Any]) -> float:
    """L2 norm over all tensors of an update (numpy arrays or torch tensors)."""
    total = 0.0
    for v in update.values():
        a = _as_numpy(v).astype(np.float64, copy=False)
        total += float(np.dot(a.ravel(), a.ravel()))
    return math.sqrt(total)


def clip_gradients(update: dict[str, Any], clip_norm: float) -> dict[str, Any]:
    """Per-client L2 clipping over all tensors together: the update scaled by
    min(1, clip_norm / ||update||).  Works on dicts of numpy arrays or torch
    tensors (torch is not imported here); returns a new dict of the same types and
    dtypes."""
    if not clip_norm > 0:
        raise ValueError("clip_norm must be > 0")
    norm = global_norm(update)
    scale = 1.0 if norm <= clip_norm else clip_norm / norm
    out = {}
    for k, v in update.items():
        if _is_torch(v):
            out[k] = v * scale if scale != 1.0 else v.clone()
        else:
            a = np.asarray(v)
            out[k] = (a * scale).astype(a.dtype) if scale != 1.0 else a.copy()
    # float rounding may leave the norm a hair above clip_norm in low precision
    return out


def _rng(rng: Any) -> np.random.Generator:
    if rng is None:
        return np.random.Generator(np.random.PCG64(secrets.randbits(128)))
    if isinstance(rng, np.random.Generator):
        return rng
    return np.random.default_rng(rng)


def noise_injection(update: dict[str, Any], sigma: float, rng: Any = None) -> dict[str, Any]:
    """The update plus independent N(0, sigma^2) noise on every element.  rng: a numpy
    Generator, a seed, or None (seeded from the OS).  Torch tensors get their noise
    drawn by numpy and moved to their dtype and device."""
    if not sigma >= 0:
        raise ValueError("sigma must be >= 0")
    g = _rng(rng)
    out = {}
    for k in sorted(update):
        v = update[k]
        if _is_torch(v):
            import torch  # only when the caller uses torch
            n = g.normal(0.0, sigma, size=tuple(v.shape)) if sigma else np.zeros(tuple(v.shape))
            out[k] = v + torch.from_numpy(n).to(dtype=v.dtype, device=v.device)
        else:
            a = np.asarray(v)
            n = g.normal(0.0, sigma, size=a.shape) if sigma else 0.0
            out[k] = (a.astype(np.float64) + n).astype(a.dtype if a.dtype.kind == "f" else np.float64)
    return out


def _flatten(update: dict[str, Any]) -> np.ndarray:
    names = sorted(update)
    if not names:
        return np.zeros(0)
    return np.concatenate([_as_numpy(update[k]).astype(np.float64).ravel() for k in names])


def _unflatten(vec: np.ndarray, like: dict[str, np.ndarray], dtype: Any = None) -> dict[str, np.ndarray]:
    out, pos = {}, 0
    for k in sorted(like):
        shape = tuple(like[k].shape)
        n = int(np.prod(shape, dtype=np.int64))
        out[k] = vec[pos:pos + n].reshape(shape).astype(dtype or like[k].dtype)
        pos += n
    if pos != len(vec):
        raise ValueError(f"vector of {len(vec)} for {pos} parameters")
    return out


# ---------------------------------------------------------------- fixed point ring

FRAC_BITS = 32          # resolution 2^-32 (2.3e-10)
MAX_ABS = float(1 << 20)   # per client and coordinate; with <= 1024 clients the sum fits in 2^62
MAX_CLIENTS = 1024


def encode_fixed(vec: np.ndarray, frac_bits: int = FRAC_BITS) -> np.ndarray:
    """Floats -> elements of Z/2^64 (uint64): round(x * 2^frac_bits), two's complement."""
    v = np.asarray(vec, dtype=np.float64)
    if not np.all(np.isfinite(v)):
        raise ValueError("non-finite value")
    if v.size and float(np.max(np.abs(v))) >= MAX_ABS:
        raise ValueError(f"value beyond the fixed-point range (|x| < {MAX_ABS:g})")
    return np.rint(v * float(1 << frac_bits)).astype(np.int64).view(np.uint64)


def decode_fixed(u: np.ndarray, frac_bits: int = FRAC_BITS) -> np.ndarray:
    """Elements of Z/2^64 -> floats (the inverse of encode_fixed, also for sums)."""
    return np.asarray(u, dtype=np.uint64).view(np.int64).astype(np.float64) / float(1 << frac_bits)


# ---------------------------------------------------------------- keys and masks

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}$")


def _crypto():
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric.x25519 import (X25519PrivateKey,
                                                                  X25519PublicKey)
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    return hashes, X25519PrivateKey, X25519PublicKey, Cipher, algorithms, HKDF


def generate_keypair(seed: Optional[bytes] = None):
    """(X25519 private key, 32-byte public key).  seed (32 bytes) only for tests."""
    _, X25519PrivateKey, _, _, _, _ = _crypto()
    priv = (X25519PrivateKey.from_private_bytes(seed) if seed is not None
            else X25519PrivateKey.generate())
    return priv, public_key_bytes(priv)


def public_key_bytes(priv) -> bytes:
    from cryptography.hazmat.primitives import serialization
    return priv.public_key().public_bytes(serialization.Encoding.Raw,
                                          serialization.PublicFormat.Raw)


def parse_public_key(data: bytes) -> bytes:
    """A keys/<client>.pub file: 64 hex digits (whitespace around allowed) or 32 raw
    bytes; ValueError otherwise, or if it is not a usable X25519 key."""
    _, _, X25519PublicKey, _, _, _ = _crypto()
    raw: Optional[bytes] = None
    try:
        text = data.decode("ascii").strip()
        if re.fullmatch(r"[0-9a-fA-F]{64}", text):
            raw = bytes.fromhex(text)
    except UnicodeDecodeError:
        pass
    if raw is None and len(data) == 32:
        raw = bytes(data)
    if raw is None:
        raise ValueError("a public key is 64 hex digits (X25519, raw)")
    X25519PublicKey.from_public_bytes(raw)
    if raw == bytes(32):
        raise ValueError("all-zero public key")
    return raw


def pair_mask(priv, peer_public: bytes, job: str, round_: int, a: str, b: str,
              n: int) -> np.ndarray:
    """The mask shared by clients a < b for this job and round: n uint64 words of
    ChaCha20 keystream under HKDF-SHA256(X25519(priv, peer_public)).  Both ends
    derive the same words; the job name, round and pair go into the HKDF info, so
    every round gets fresh masks from the same key pair."""
    hashes, _, X25519PublicKey, Cipher, algorithms, HKDF = _crypto()
    shared = priv.exchange(X25519PublicKey.from_public_bytes(peer_public))
    lo, hi = sorted((a, b))
    info = b"\0".join([b"memosfs-fed-mask-v1", job.encode(), str(round_).encode(),
                       lo.encode(), hi.encode()])
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)
    enc = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()
    stream = enc.update(bytes(8 * n))
    return np.frombuffer(stream, dtype="<u8").astype(np.uint64)


def mask_update(fixed: np.ndarray, me: str, priv, peers: dict[str, bytes], job: str,
                round_: int) -> np.ndarray:
    """Client `me`'s masked vector: fixed + sum_{j > me} m_ij - sum_{j < me} m_ij in
    Z/2^64, over every other participant j in peers (names -> public keys; `me` may
    be in it).  Summed over all participants the masks cancel exactly."""
    out = np.array(fixed, dtype=np.uint64, copy=True)
    for name in sorted(peers):
        if name == me:
            continue
        m = pair_mask(priv, peers[name], job, round_, me, name, len(out))
        if me < name:
            out += m
        else:
            out -= m
    return out


def peers_digest(peers: dict[str, bytes]) -> str:
    """Names and keys of a secure round's participants, hashed: an update carries the
    digest of the set it masked against, and the server refuses a mismatch."""
    h = hashlib.sha256()
    for name in sorted(peers):
        h.update(name.encode() + b" " + peers[name].hex().encode() + b"\n")
    return h.hexdigest()[:32]


# ---------------------------------------------------------------- homomorphic encryption

HE_POLY_DEGREE = 8192
HE_SLOTS = HE_POLY_DEGREE // 2


def _need_he():
    if not HE_AVAILABLE:
        raise RuntimeError("mode he needs tenseal (pip install tenseal)")
    return _tenseal()


def he_keygen():
    """(secret TenSEAL CKKS context, public context bytes without the secret key)."""
    ts = _need_he()
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, HE_POLY_DEGREE,
                      coeff_mod_bit_sizes=[60, 40, 40, 60])
    ctx.global_scale = 2 ** 40
    pub = ctx.serialize(save_public_key=True, save_secret_key=False,
                        save_galois_keys=False, save_relin_keys=False)
    return ctx, pub


def he_context(data: bytes):
    return _need_he().context_from(bytes(data))


def he_encrypt(ctx, vec: np.ndarray) -> list[bytes]:
    """A float vector as CKKS ciphertexts of at most HE_SLOTS values each."""
    ts = _need_he()
    v = np.asarray(vec, dtype=np.float64)
    return [ts.ckks_vector(ctx, v[i:i + HE_SLOTS].tolist()).serialize()
            for i in range(0, max(len(v), 1), HE_SLOTS)]


def he_decrypt(secret_ctx, chunks: Sequence[bytes]) -> np.ndarray:
    ts = _need_he()
    parts = [np.asarray(ts.ckks_vector_from(secret_ctx, bytes(c)).decrypt(), dtype=np.float64)
             for c in chunks]
    return np.concatenate(parts) if parts else np.zeros(0)


def _he_chunks(tensors: dict[str, np.ndarray]) -> list[bytes]:
    names = sorted(k for k in tensors if k.startswith("ckks."))
    if not names or set(tensors) != set(names):
        raise ValueError("an he update holds only tensors ckks.0000, ckks.0001, ...")
    if names != [f"ckks.{i:04d}" for i in range(len(names))]:
        raise ValueError("ckks chunks are numbered ckks.0000, ckks.0001, ...")
    return [tensors[k].tobytes() for k in names]


def _he_pack(chunks: Sequence[bytes]) -> dict[str, np.ndarray]:
    return {f"ckks.{i:04d}": np.frombuffer(c, dtype=np.uint8) for i, c in enumerate(chunks)}


# ---------------------------------------------------------------- update encoding (client side)


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
    n = _expected_count(config)
    if sorted(delta) != sorted(params):
        raise ValueError("delta tensors must be named as the params")
    d = clip_gradients({k: _as_numpy(v).astype(np.float64) for k, v in delta.items()}, C)
    meta = {"round": str(round_), "encoding": mode}
    if client:
        meta["client"] = client
    if mode == "plain":
        return st_save({k: d[k].astype(params[k].dtype) for k in d}, meta)
    if z > 0:
        d = noise_injection(d, z * C / math.sqrt(n), rng)
    vec = _flatten(d)
    if mode == "secure":
        if private_key is None or peers is None:
            raise ValueError("secure mode needs the private key and the peers' keys")
        masked = mask_update(encode_fixed(vec), client, private_key, peers, job, round_)
        meta["peers"] = peers_digest(peers)
        meta["frac_bits"] = str(FRAC_BITS)
        return st_save(_unflatten(masked, params, np.uint64), meta)
    if mode == "he":
        if he_public is None:
            raise ValueError("he mode needs the public context")
        meta["n"] = str(len(vec))
        return st_save(_he_pack(he_encrypt(he_public, vec)), meta)
    raise ValueError(f"unknown mode {mode!r}")


def decrypted_sum_bytes(secret_ctx, he_sum: bytes, params: dict[str, np.ndarray]) -> bytes:
    """The key holder's step in mode he: decrypt he/sum and return the bytes of
    he/decrypted.safetensors (float64 tensors named like the params)."""
    tensors, meta = st_load(he_sum)
    vec = he_decrypt(secret_ctx, _he_chunks(tensors))
    n = int(meta.get("n", len(vec)))
    out = _unflatten(vec[:n], params, np.float64)
    return st_save(out, {"round": meta.get("round", ""), "encoding": "he-decrypted"})


# ---------------------------------------------------------------- config

CONFIG_DEFAULTS: dict[str, Any] = {
    "clients": 2,                 # a count, or a list of names
    "min_clients": 0,             # for the aggregate trigger; 0 = all expected clients
    "mode": "plain",
    "clip_norm": 1.0,
    "noise_multiplier": 1.0,
    "learning_rate": 1.0,
    "delta": 1e-5,
    "seed": None,                 # server noise seed (tests only); None = OS entropy
}
CONFIG_ORDER = list(CONFIG_DEFAULTS)
MODES = ("plain", "secure", "he")


def _expected_count(cfg: dict[str, Any]) -> int:
    c = cfg["clients"]
    return len(c) if isinstance(c, list) else int(c)


def _finite(text: str, name: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{name}: not a number: {text!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name}: not finite")
    return v


def _parse_value(key: str, raw: Any) -> Any:
    text = raw if isinstance(raw, str) else json.dumps(raw) if not isinstance(raw, list) else raw
    if key == "clients":
        if isinstance(raw, int) and not isinstance(raw, bool):
            n = raw
            if not 1 <= n <= MAX_CLIENTS:
                raise ValueError(f"clients: 1..{MAX_CLIENTS}")
            return n
        names = raw if isinstance(raw, list) else re.split(r"[\s,]+", str(raw).strip())
        names = [str(x) for x in names if str(x)]
        if len(names) == 1 and names[0].isdigit():
            return _parse_value(key, int(names[0]))
        if not names:
            raise ValueError("clients: a count or a list of names")
        for nm in names:
            if not _NAME_RE.match(nm):
                raise ValueError(f"clients: bad client name {nm!r}")
        if len(set(names)) != len(names) or len(names) > MAX_CLIENTS:
            raise ValueError("clients: names must be distinct (at most 1024)")
        return sorted(names)
    if key == "min_clients":
        t = str(text).strip().strip('"')
        if t in ("all", "0"):
            return 0
        if not t.isdigit() or not 1 <= int(t) <= MAX_CLIENTS:
            raise ValueError("min_clients: a positive integer or all")
        return int(t)
    if key == "mode":
        t = str(text).strip().strip('"')
        if t not in MODES:
            raise ValueError(f"mode: one of {', '.join(MODES)}")
        if t == "he" and not HE_AVAILABLE:
            raise ValueError("mode he is unavailable: tenseal is not installed")
        return t
    if key in ("clip_norm", "learning_rate"):
        v = _finite(str(text), key)
        if v <= 0:
            raise ValueError(f"{key}: must be > 0")
        return v
    if key == "noise_multiplier":
        v = _finite(str(text), key)
        if v < 0:
            raise ValueError(f"{key}: must be >= 0")
        return v
    if key == "delta":
        v = _finite(str(text), key)
        if not 0 < v < 1:
            raise ValueError("delta: 0 < delta < 1")
        return v
    if key == "seed":
        t = str(text).strip().strip('"')
        if t in ("none", "null", ""):
            return None
        if not t.isdigit():
            raise ValueError("seed: a non-negative integer or none")
        return int(t)
    raise ValueError(f"unknown key {key!r}")


def parse_config(data: bytes | str, current: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Merge a config write into `current` (defaults if None): either a JSON object or
    lines `key = value` (also `key=value` or `key value`; `#` starts a comment).  Keys
    not named keep their value.  ValueError (-> EINVAL) if anything is wrong; then
    nothing changes."""
    cfg = dict(current if current is not None else CONFIG_DEFAULTS)
    text = data.decode() if isinstance(data, (bytes, bytearray)) else data
    stripped = text.strip()
    items: list[tuple[str, Any]] = []
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
        except ValueError as e:
            raise ValueError(f"bad JSON: {e}") from None
        if not isinstance(obj, dict):
            raise ValueError("config JSON must be an object")
        items = list(obj.items())
    else:
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            m = re.match(r"^([A-Za-z_]+)\s*(?:=\s*|\s+)(.*)$", line)
            if not m:
                raise ValueError(f"bad line {line!r} (key = value)")
            items.append((m.group(1), m.group(2).strip()))
    for k, v in items:
        if k not in CONFIG_DEFAULTS:
            raise ValueError(f"unknown key {k!r}")
        cfg[k] = _parse_value(k, v)
    if cfg["min_clients"] > _expected_count(cfg):
        raise ValueError("min_clients exceeds clients")
    return cfg


def format_config(cfg: dict[str, Any]) -> str:
    out = []
    for k in CONFIG_ORDER:
        v = cfg[k]
        if isinstance(v, list):
            v = ",".join(v)
        elif v is None:
            v = "none"
        elif k == "min_clients" and v == 0:
            v = "all"
        out.append(f"{k} = {v}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- accounting


def epsilon_for(noise_multipliers: Sequence[float], delta: float) -> float:
    """epsilon after one Gaussian mechanism per round with these noise multipliers
    (sampling rate 1), by dp-accounting's RdpAccountant; 0 for no rounds, inf if any
    round had no noise."""
    if not noise_multipliers:
        return 0.0
    if any(z <= 0 for z in noise_multipliers):
        return math.inf
    if not ACCOUNTANT_AVAILABLE:
        return math.nan
    dp_event, rdp = _accountant()
    acc = rdp.RdpAccountant()
    counts: dict[float, int] = {}
    for z in noise_multipliers:
        counts[z] = counts.get(z, 0) + 1
    for z, c in counts.items():
        acc.compose(dp_event.GaussianDpEvent(z), c)
    return float(acc.get_epsilon(delta))


# ---------------------------------------------------------------- transports and the client


class InprocTransport:
    """A job reached through FederatedJobs directly, as the filesystem would call it."""

    def __init__(self, jobs: "FederatedJobs", job: str, uid: int = 0, gid: int = 0) -> None:
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
        if not _NAME_RE.match(name):
            raise ValueError(f"bad client name {name!r}")
        self.name, self.t, self.job = name, transport, job
        self.rng = _rng(rng)
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


# ---------------------------------------------------------------- the server: jobs

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


def _now_ns() -> int:
    return time.time_ns()


@dataclass
class _Entry:
    uid: int
    gid: int
    mtime_ns: int
    size: int = 0


@dataclass
class _Job:
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
    params_entry: Optional[_Entry] = None
    config_mtime_ns: int = 0
    bindings: dict[str, int] = field(default_factory=dict)
    updates: dict[str, _Entry] = field(default_factory=dict)     # current round
    keys: dict[str, _Entry] = field(default_factory=dict)
    he_context: Optional[_Entry] = None
    he_sum: Optional[dict[str, Any]] = None     # {"round", "clients", "mtime_ns", "size"}
    events: list[float] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    last_error: str = ""
    # not persisted
    lock: threading.RLock = field(default_factory=threading.RLock)
    busy: bool = False                  # an aggregation is computing outside the lock
    placeholders: dict[tuple[str, str], _Entry] = field(default_factory=dict)
    refused: int = 0
    params_cache: Optional[bytes] = None
    key_cache: dict[str, bytes] = field(default_factory=dict)
    eps_cache: Optional[tuple[int, float, float]] = None
    mtime_ns: int = 0
    old_params: int = 0
    he_ctx_cache: Optional[tuple[int, Any]] = None

    def meta(self) -> dict[str, Any]:
        def ent(e: Optional[_Entry]):
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
    def from_meta(cls, m: dict[str, Any]) -> "_Job":
        def ent(x) -> Optional[_Entry]:
            return None if x is None else _Entry(*x)
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
        self.kv = kv
        self.prefix = prefix
        self.notify = notify
        self.root_uid, self.root_gid = root_uid, root_gid
        self._lock = threading.Lock()
        self.jobs: dict[str, _Job] = {}
        self.mtime_ns = _now_ns()
        self.restore()

    # ------------------------------------------------------------ persistence

    def _k(self, job: str, *rest: str) -> str:
        return self.prefix + urllib.parse.quote(job, safe="") + "/" + "/".join(rest)

    def _put_meta(self, j: _Job) -> None:
        self.kv.put(self._k(j.name, "meta"), json.dumps(j.meta()).encode())

    def restore(self) -> None:
        """Load every job from the store; drop what no job's meta refers to (the
        leftovers of an update or a round that was cut short)."""
        jobs: dict[str, _Job] = {}
        unreadable: set[str] = set()
        all_keys = self.kv.keys(self.prefix)
        for key in all_keys:
            if not key.endswith("/meta"):
                continue
            try:
                j = _Job.from_meta(json.loads(self.kv.get(key) or b"null"))
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
            if j is None or sub not in self._referenced(j):
                log.info("federated: dropping unreferenced %s", key)
                self.kv.delete(key)
        for j in jobs.values():
            raw = self.kv.get(self._k(j.name, "history")) or b""
            # lines of rounds that a crash kept from committing are dropped
            j.history = [ln for ln in raw.decode("utf-8", "replace").splitlines()
                         if _history_round(ln) <= j.round]
        if jobs:
            _warm_imports()
        for j in jobs.values():
            log.info("federated: job %s restored at round %d (%s, %d pending updates)",
                     j.name, j.round, j.phase, len(j.updates))
        self.jobs = jobs

    def _referenced(self, j: _Job) -> set[str]:
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

    def resume(self) -> list[str]:
        """Aggregate every job whose round has all its updates (a restart between the
        last update and the commit).  Returns the jobs that advanced."""
        done = []
        for name in list(self.jobs):
            j = self.jobs.get(name)
            if j is None:
                continue
            with j.lock:
                ready = (j.phase == "collecting" and not j.busy and
                         self._complete(j))
            if ready:
                try:
                    r0 = j.round
                    self._aggregate(j, trigger=False)
                    if j.round != r0 or j.phase != "collecting":
                        done.append(name)
                except FedError:
                    pass
        return done

    # ------------------------------------------------------------ helpers

    def _job(self, name: str) -> _Job:
        j = self.jobs.get(name)
        if j is None:
            raise FedError(errno.ENOENT, f"no federated job {name!r}")
        return j

    @staticmethod
    def _attr(kind: str, size: int, mode: int, uid: int, gid: int, mtime_ns: int) -> dict:
        return {"kind": kind, "size": size, "mode": mode, "uid": uid, "gid": gid,
                "mtime_ns": mtime_ns, "mtime": mtime_ns / 1e9}

    def _is_owner(self, j: _Job, uid: int) -> bool:
        return uid == 0 or uid == j.owner

    def _changed(self, paths: list[tuple[str, ...]]) -> None:
        if self.notify and paths:
            try:
                self.notify(paths)
            except Exception:
                log.exception("federated: notify failed")

    def _refuse(self, j: Optional[_Job], code: int, fmt: str, *args: object) -> FedError:
        if j is not None:
            j.refused += 1
            fmt = "job %s: " + fmt
            args = (j.name,) + args
        return _refuse(code, fmt, *args)

    def _params(self, j: _Job) -> Optional[bytes]:
        if not j.params_gen:
            return None
        if j.params_cache is None:
            j.params_cache = self.kv.get(self._k(j.name, f"params/{j.params_gen}"))
        return j.params_cache

    def _params_tensors(self, j: _Job) -> dict[str, np.ndarray]:
        data = self._params(j)
        if data is None:
            raise FedError(errno.EAGAIN, "no params")
        return st_load(data)[0]

    def _participants(self, j: _Job) -> Optional[list[str]]:
        """The expected clients by name, where known: the configured names; else, in
        mode secure, the holders of keys once there are `clients` of them."""
        c = j.config["clients"]
        if isinstance(c, list):
            return c
        return None

    def _complete(self, j: _Job) -> bool:
        names = self._participants(j)
        if names is not None:
            return all(n in j.updates for n in names)
        return len(j.updates) >= _expected_count(j.config)

    def _secure_peers(self, j: _Job) -> dict[str, bytes]:
        names = self._participants(j)
        if names is None:
            names = sorted(j.keys)
            if len(names) != _expected_count(j.config):
                raise FedError(errno.EAGAIN, f"waiting for keys ({len(names)} of "
                                             f"{_expected_count(j.config)})")
        missing = [n for n in names if n not in j.keys]
        if missing:
            raise FedError(errno.EAGAIN, "waiting for keys of " + ", ".join(missing))
        return {n: self._key(j, n) for n in names}

    def _key(self, j: _Job, name: str) -> bytes:
        if name not in j.key_cache:
            data = self.kv.get(self._k(j.name, f"keys/{name}")) or b""
            j.key_cache[name] = parse_public_key(data)
        return j.key_cache[name]

    # ------------------------------------------------------------ text files

    def _text(self, j: _Job, name: str) -> bytes:
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
            eps = self._epsilon(j)
            return (f"epsilon {_fmt(eps)}\n"
                    f"delta {j.config['delta']:g}\n"
                    f"rounds {len(j.events)}\n"
                    f"noise_multiplier {j.config['noise_multiplier']:g}\n"
                    f"noise_multipliers_applied {_runs(j.events)}\n"
                    f"sampling_rate 1\n"
                    f"clip_norm {j.config['clip_norm']:g}\n"
                    f"accountant rdp (dp-accounting)\n"
                    f"neighboring add_or_remove_one_client\n").encode()
        if name == "status":
            names = self._participants(j)
            expected = _expected_count(j.config)
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

    def _epsilon(self, j: _Job) -> float:
        key = (len(j.events), j.config["delta"])
        if j.eps_cache is None or j.eps_cache[:2] != key:
            j.eps_cache = (key[0], key[1], epsilon_for(j.events, j.config["delta"]))
        return j.eps_cache[2]

    # ------------------------------------------------------------ getattr / readdir / read

    def getattr(self, parts: Sequence[str]) -> dict:
        parts = tuple(parts)
        if not parts:
            return self._attr("dir", 0, FED_ROOT_MODE, self.root_uid, self.root_gid,
                              self.mtime_ns)
        j = self._job(parts[0])
        with j.lock:
            return self._getattr_locked(j, parts)

    def _getattr_locked(self, j: _Job, parts: tuple[str, ...]) -> dict:
        enoent = FedError(errno.ENOENT, "/".join(parts))
        if len(parts) == 1:
            return self._attr("dir", 0, j.mode, j.owner, j.gid, j.mtime_ns)
        name = parts[1]
        if len(parts) == 2:
            if name in DIR_MODES:
                return self._attr("dir", 0, DIR_MODES[name], j.owner, j.gid, j.mtime_ns)
            if name == "params.safetensors":
                e = j.params_entry
                return self._attr("file", e.size if e else 0, FILE_MODES[name], j.owner,
                                  j.gid, e.mtime_ns if e else j.ctime_ns)
            if name in FILE_MODES:
                mt = j.config_mtime_ns if name == "config" else j.mtime_ns
                return self._attr("file", len(self._text(j, name)), FILE_MODES[name],
                                  j.owner, j.gid, mt)
            raise enoent
        if len(parts) != 3:
            raise enoent
        sub, leaf = name, parts[2]
        if sub == "updates":
            client = _strip(leaf, UPDATE_SUFFIX)
            e = j.updates.get(client) if client else None
            e = e or j.placeholders.get((sub, leaf))
            if e is None:
                raise enoent
            return self._attr("file", e.size, UPDATE_MODE, e.uid, e.gid, e.mtime_ns)
        if sub == "keys":
            client = _strip(leaf, KEY_SUFFIX)
            e = j.keys.get(client) if client else None
            e = e or j.placeholders.get((sub, leaf))
            if e is None:
                raise enoent
            return self._attr("file", e.size, KEY_MODE, e.uid, e.gid, e.mtime_ns)
        if sub == "he":
            if leaf == "context":
                e = j.he_context
                return self._attr("file", e.size if e else 0, HE_FILE_MODES[leaf], j.owner,
                                  j.gid, e.mtime_ns if e else j.ctime_ns)
            if leaf == "sum" and j.he_sum is not None:
                return self._attr("file", j.he_sum["size"], HE_FILE_MODES[leaf], j.owner,
                                  j.gid, j.he_sum["mtime_ns"])
            if leaf == "decrypted.safetensors":
                return self._attr("file", 0, HE_FILE_MODES[leaf], j.owner, j.gid, j.mtime_ns)
        raise enoent

    def readdir(self, parts: Sequence[str]) -> list[str]:
        parts = tuple(parts)
        if not parts:
            with self._lock:
                return sorted(self.jobs)
        j = self._job(parts[0])
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
            attr = self._getattr_locked(j, parts)
            raise FedError(errno.ENOTDIR if attr["kind"] == "file" else errno.ENOENT,
                           "/".join(parts))

    def read(self, parts: Sequence[str]) -> bytes:
        parts = tuple(parts)
        if not parts:
            raise FedError(errno.EISDIR, ".federated")
        j = self._job(parts[0])
        with j.lock:
            attr = self._getattr_locked(j, parts)
            if attr["kind"] == "dir":
                raise FedError(errno.EISDIR, "/".join(parts))
            if len(parts) == 2:
                if parts[1] == "params.safetensors":
                    return self._params(j) or b""
                return self._text(j, parts[1])
            sub, leaf = parts[1], parts[2]
            if sub == "updates":
                raise self._refuse(j, errno.EACCES, "updates are never read back (%s)", leaf)
            if sub == "keys":
                client = _strip(leaf, KEY_SUFFIX)
                if client not in j.keys:
                    return b""    # a placeholder
                return (self._key(j, client).hex() + "\n").encode()
            if leaf == "context":
                if j.he_context is None:
                    return b""
                return self.kv.get(self._k(j.name, "he/context")) or b""
            if leaf == "sum":
                return self.kv.get(self._k(j.name, f"he/sum/{j.he_sum['round']}")) or b""
            return b""

    # ------------------------------------------------------------ namespace changes

    def mkdir(self, parts: Sequence[str], uid: int, gid: int, mode: int = 0o755) -> dict:
        parts = tuple(parts)
        if len(parts) != 1:
            raise _refuse(errno.EPERM, "mkdir %s: only jobs are made in .federated",
                          "/".join(parts))
        name = parts[0]
        if len(name.encode()) > 255:
            raise _refuse(errno.ENAMETOOLONG, "job name longer than 255 bytes")
        if not _NAME_RE.match(name):
            raise _refuse(errno.EINVAL, "bad job name %r (letters, digits, _.@+- ; "
                          "not starting with a dot)", name)
        with self._lock:
            if name in self.jobs:
                raise _refuse(errno.EEXIST, "job %s exists", name)
            now = _now_ns()
            j = _Job(name=name, owner=uid, gid=gid, mode=mode & 0o7777, ctime_ns=now,
                     config=dict(CONFIG_DEFAULTS), config_mtime_ns=now, mtime_ns=now)
            self._put_meta(j)
            self.jobs[name] = j
            self.mtime_ns = now
        _warm_imports()
        log.info("federated: job %s created by uid %d", name, uid)
        self._changed([()])
        return self.getattr(parts)

    def rmdir(self, parts: Sequence[str], uid: int) -> None:
        parts = tuple(parts)
        if len(parts) != 1:
            raise _refuse(errno.EPERM, "rmdir %s: the tree of a job is fixed",
                          "/".join(parts))
        with self._lock:
            j = self._job(parts[0])
            with j.lock:
                if not self._is_owner(j, uid):
                    raise self._refuse(j, errno.EACCES, "rmdir by uid %d: not the owner", uid)
                if j.busy:
                    raise self._refuse(j, errno.EBUSY, "rmdir while a round is aggregating")
                self.kv.delete(self._k(j.name, "meta"))   # the commit point
                for key in self.kv.keys(self._k(j.name)):
                    self.kv.delete(key)
                del self.jobs[j.name]
                self.mtime_ns = _now_ns()
        log.info("federated: job %s removed by uid %d", parts[0], uid)
        self._changed([(), parts])

    def create(self, parts: Sequence[str], uid: int, gid: int, mode: int = 0o644) -> dict:
        """O_CREAT of updates/<client>.safetensors or keys/<client>.pub: checks the
        name (EPERM in a wrong place, EACCES for a client the job does not expect,
        EEXIST for a second update in the round or a second key) and shows an empty
        placeholder, owned by uid, until write() or discard()."""
        parts = tuple(parts)
        if len(parts) < 2:
            raise _refuse(errno.EPERM, "create %s: only update and key files are created",
                          "/".join(parts) or ".federated")
        j = self._job(parts[0])
        with j.lock:
            try:
                self._getattr_locked(j, parts)
                exists = True
            except FedError:
                exists = False
            if exists:
                if len(parts) == 3 and (parts[1], parts[2]) in j.placeholders:
                    return self._getattr_locked(j, parts)
                raise self._refuse(j, errno.EEXIST, "%s exists", "/".join(parts[1:]))
            self._check_new_name(j, parts, uid)
            j.placeholders[(parts[1], parts[2])] = _Entry(uid, gid, _now_ns(), 0)
            return self._getattr_locked(j, parts)

    def _check_new_name(self, j: _Job, parts: tuple[str, ...], uid: int) -> str:
        if len(parts) != 3 or parts[1] not in ("updates", "keys"):
            raise self._refuse(j, errno.EPERM, "%s: only updates/<client>%s and "
                               "keys/<client>%s are created", "/".join(parts[1:]),
                               UPDATE_SUFFIX, KEY_SUFFIX)
        sub, leaf = parts[1], parts[2]
        suffix = UPDATE_SUFFIX if sub == "updates" else KEY_SUFFIX
        client = _strip(leaf, suffix)
        if not client or not _NAME_RE.match(client):
            raise self._refuse(j, errno.EPERM, "%s/%s: files here are named <client>%s",
                               sub, leaf, suffix)
        self._check_client(j, client, uid)
        if sub == "updates" and client in j.updates:
            raise self._refuse(j, errno.EEXIST, "%s already sent its update for round %d",
                               client, j.round)
        if sub == "keys" and client in j.keys:
            raise self._refuse(j, errno.EEXIST, "%s already has a key (unlink it first)",
                               client)
        return client

    def _same_key(self, j: _Job, parts: tuple[str, ...], data: bytes, uid: int) -> bool:
        """A key written again, identical, by its owner: a no-op (fs.py re-applies a
        small file's text at every write())."""
        client = _strip(parts[2], KEY_SUFFIX)
        if client not in j.keys or j.keys[client].uid != uid and uid != 0:
            return False
        try:
            return parse_public_key(data) == self._key(j, client)
        except ValueError:
            return False

    def _check_client(self, j: _Job, client: str, uid: int) -> None:
        names = self._participants(j)
        if names is not None and client not in names:
            raise self._refuse(j, errno.EACCES, "client %s is not one of the job's "
                               "clients", client)
        bound = j.bindings.get(client)
        if bound is not None and bound != uid and uid != 0:
            raise self._refuse(j, errno.EACCES, "client %s belongs to uid %d, not %d",
                               client, bound, uid)
        if names is None and bound is None and \
                len(j.bindings) >= _expected_count(j.config):
            raise self._refuse(j, errno.EACCES, "client %s: the job expects %d clients "
                               "and has them (%s)", client, _expected_count(j.config),
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
                raise _refuse(errno.EISDIR, "open .federated for writing")
            return
        j = self._job(parts[0])
        with j.lock:
            attr = self._getattr_locked(j, parts)
            if attr["kind"] == "dir":
                if write:
                    raise self._refuse(j, errno.EISDIR, "open %s for writing", "/".join(parts))
                return
            rel = "/".join(parts[1:])
            if len(parts) == 3 and parts[1] == "updates":
                if not write:
                    raise self._refuse(j, errno.EACCES, "updates are never read back (%s)", rel)
                if (parts[1], parts[2]) not in j.placeholders:
                    raise self._refuse(j, errno.EEXIST, "%s: already sent for round %d", rel,
                                       j.round)
                return
            if len(parts) == 3 and parts[1] == "keys":
                if write and (parts[1], parts[2]) not in j.placeholders:
                    raise self._refuse(j, errno.EEXIST, "%s exists (unlink it first)", rel)
                return
            if not write:
                return
            if attr["mode"] & 0o222 == 0:
                raise self._refuse(j, errno.EACCES, "%s is read-only", rel)
            if not self._is_owner(j, uid):
                raise self._refuse(j, errno.EACCES, "%s is written by the job's owner "
                                   "(uid %d), not uid %d", rel, j.owner, uid)

    def discard(self, parts: Sequence[str]) -> None:
        parts = tuple(parts)
        if len(parts) == 3 and parts[0] in self.jobs:
            j = self.jobs[parts[0]]
            with j.lock:
                j.placeholders.pop((parts[1], parts[2]), None)

    def unlink(self, parts: Sequence[str], uid: int) -> None:
        """Withdraw an update of the current round (its writer, the owner or root), or
        remove a key (same; EBUSY in mode secure while updates are pending)."""
        parts = tuple(parts)
        if len(parts) != 3 or parts[1] not in ("updates", "keys"):
            if len(parts) >= 1 and parts[0] in self.jobs:
                self._job(parts[0]).refused += 1
            raise _refuse(errno.EPERM, "unlink %s: only updates and keys are removed",
                          "/".join(parts) or ".federated")
        j = self._job(parts[0])
        changed: list[tuple[str, ...]] = []
        with j.lock:
            sub, leaf = parts[1], parts[2]
            if (sub, leaf) in j.placeholders:
                del j.placeholders[(sub, leaf)]
                return
            if sub == "updates":
                client = _strip(leaf, UPDATE_SUFFIX)
                e = j.updates.get(client) if client else None
                if e is None:
                    raise FedError(errno.ENOENT, "/".join(parts))
                if not (self._is_owner(j, uid) or uid == e.uid):
                    raise self._refuse(j, errno.EACCES, "unlink %s by uid %d", leaf, uid)
                if j.busy or j.phase != "collecting":
                    raise self._refuse(j, errno.EBUSY, "unlink %s: round %d is being "
                                       "aggregated", leaf, j.round)
                del j.updates[client]
                j.mtime_ns = _now_ns()
                self._put_meta(j)
                self.kv.delete(self._k(j.name, f"updates/{j.round}/{client}"))
                log.info("federated: job %s: update of %s for round %d withdrawn by uid %d",
                         j.name, client, j.round, uid)
            else:
                client = _strip(leaf, KEY_SUFFIX)
                e = j.keys.get(client) if client else None
                if e is None:
                    raise FedError(errno.ENOENT, "/".join(parts))
                if not (self._is_owner(j, uid) or uid == e.uid):
                    raise self._refuse(j, errno.EACCES, "unlink %s by uid %d", leaf, uid)
                if j.config["mode"] == "secure" and (j.updates or j.busy):
                    raise self._refuse(j, errno.EBUSY, "key %s: round %d has masked updates "
                                       "made with it", client, j.round)
                del j.keys[client]
                j.key_cache.pop(client, None)
                if client not in j.updates:
                    j.bindings.pop(client, None)
                j.mtime_ns = _now_ns()
                self._put_meta(j)
                self.kv.delete(self._k(j.name, f"keys/{client}"))
            changed = self._maybe_apply_pending(j) + [parts, (j.name, parts[1]),
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
            raise _refuse(errno.EISDIR, "write to .federated")
        j = self._job(parts[0])
        if len(parts) == 1 or (len(parts) == 2 and parts[1] in DIR_MODES):
            raise self._refuse(j, errno.EISDIR, "write to %s", "/".join(parts))
        if len(parts) == 2:
            name = parts[1]
            if name in ("round", "status", "privacy", "history"):
                raise self._refuse(j, errno.EACCES, "%s is read-only", name)
            if name not in FILE_MODES:
                raise self._refuse(j, errno.EPERM, "%s: no such file in a job", name)
            if not self._is_owner(j, uid):
                raise self._refuse(j, errno.EACCES, "%s is written by the job's owner "
                                   "(uid %d), not uid %d", name, j.owner, uid)
            if name == "config":
                return self._write_config(j, data)
            if name == "params.safetensors":
                return self._write_params(j, data)
            if name == "aggregate":
                if data.strip() != b"1":
                    raise self._refuse(j, errno.EINVAL, "aggregate: write 1")
                return self._aggregate(j, trigger=True)
        if len(parts) == 3 and parts[1] == "updates":
            return self._write_update(j, parts, data, uid, j.gid if gid is None else gid)
        if len(parts) == 3 and parts[1] == "keys":
            return self._write_key(j, parts, data, uid, j.gid if gid is None else gid)
        if len(parts) == 3 and parts[1] == "he":
            leaf = parts[2]
            if leaf == "sum":
                raise self._refuse(j, errno.EACCES, "he/sum is read-only")
            if leaf not in HE_FILE_MODES:
                raise self._refuse(j, errno.EPERM, "he/%s: no such file", leaf)
            if not self._is_owner(j, uid):
                raise self._refuse(j, errno.EACCES, "he/%s is written by the job's owner",
                                   leaf)
            if leaf == "context":
                return self._write_he_context(j, data)
            return self._write_decrypted(j, data)
        raise self._refuse(j, errno.EPERM, "%s: no such file in a job", "/".join(parts[1:]))

    def _write_config(self, j: _Job, data: bytes) -> None:
        with j.lock:
            base = j.pending_config if j.pending_config is not None else j.config
            try:
                cfg = parse_config(data, base)
            except (ValueError, UnicodeDecodeError) as e:
                raise self._refuse(j, errno.EINVAL, "config: %s", e) from None
            j.config_mtime_ns = _now_ns()
            if j.updates or j.busy or j.phase != "collecting":
                j.pending_config = cfg if cfg != j.config else None
                log.info("federated: job %s: config change pending until round %d",
                         j.name, j.round + 1)
            else:
                self._set_config(j, cfg)
            self._put_meta(j)
        self._changed([(j.name, "config"), (j.name, "status"), (j.name, "privacy")])

    def _set_config(self, j: _Job, cfg: dict[str, Any]) -> None:
        old = j.config
        j.config, j.pending_config = cfg, None
        self._epsilon(j)        # here, in the writer's thread, not in a later getattr
        if cfg["clients"] != old["clients"]:
            # bindings of clients no longer expected are forgotten
            names = cfg["clients"] if isinstance(cfg["clients"], list) else None
            if names is not None:
                j.bindings = {k: v for k, v in j.bindings.items() if k in names}

    def _maybe_apply_pending(self, j: _Job) -> list[tuple[str, ...]]:
        if (j.pending_config is not None and not j.updates and not j.busy
                and j.phase == "collecting"):
            self._set_config(j, j.pending_config)
            self._put_meta(j)
            return [(j.name, "config"), (j.name, "privacy")]
        return []

    def _write_params(self, j: _Job, data: bytes) -> None:
        try:
            tensors, meta = st_load(data)
        except ValueError as e:
            raise self._refuse(j, errno.EINVAL, "params.safetensors: %s", e) from None
        if not tensors:
            raise self._refuse(j, errno.EINVAL, "params.safetensors holds no tensor")
        for k, a in tensors.items():
            if a.dtype.kind != "f":
                raise self._refuse(j, errno.EINVAL, "params: tensor %s is %s (floats only)",
                                   k, a.dtype)
            if not np.all(np.isfinite(a)):
                raise self._refuse(j, errno.EINVAL, "params: tensor %s not finite", k)
        with j.lock:
            if j.updates or j.busy or j.phase != "collecting":
                raise self._refuse(j, errno.EBUSY, "params: round %d has pending updates",
                                   j.round)
            meta = dict(meta)
            meta.update({"round": str(j.round), "job": j.name})
            self._commit_params(j, st_save(tensors, meta))
            self._put_meta(j)
            log.info("federated: job %s: params set by the owner (%d tensors, %d bytes)",
                     j.name, len(tensors), j.params_entry.size)
        self._changed([(j.name, "params.safetensors"), (j.name, "status")])

    def _commit_params(self, j: _Job, blob: bytes) -> None:
        """Store a new params generation (the meta put that follows makes it current;
        the previous generation is deleted after that by _drop_params)."""
        old = j.params_gen
        j.params_gen = old + 1
        self.kv.put(self._k(j.name, f"params/{j.params_gen}"), blob)
        j.params_cache = blob
        now = _now_ns()
        j.params_entry = _Entry(j.owner, j.gid, now, len(blob))
        j.mtime_ns = now
        j.old_params = old

    def _drop_old_params(self, j: _Job) -> None:
        if j.old_params:
            self.kv.delete(self._k(j.name, f"params/{j.old_params}"))
            j.old_params = 0

    def _write_key(self, j: _Job, parts: tuple[str, ...], data: bytes, uid: int, gid: int) -> None:
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
                    raise self._refuse(j, errno.EINVAL, "key %s: %s", client, e) from None
                if j.config["mode"] == "secure" and (j.updates or j.busy):
                    raise self._refuse(j, errno.EBUSY, "key %s: round %d already has masked "
                                       "updates", client, j.round)
                text = (raw.hex() + "\n").encode()
                self.kv.put(self._k(j.name, f"keys/{client}"), text)
                j.keys[client] = _Entry(uid, gid, _now_ns(), len(text))
                j.key_cache[client] = raw
                j.bindings.setdefault(client, uid)
                j.mtime_ns = _now_ns()
                self._put_meta(j)
        finally:
            self._changed(changed)
        log.info("federated: job %s: key of %s registered (uid %d)", j.name, client, uid)

    def _validate_update(self, j: _Job, client: str, data: bytes) -> dict[str, np.ndarray]:
        """Check an update against the job; FedError (logged) if it is refused."""
        try:
            tensors, meta = st_load(data)
        except ValueError as e:
            raise self._refuse(j, errno.EINVAL, "update of %s: not safetensors: %s",
                               client, e) from None
        r = meta.get("round")
        if r is None or not r.lstrip("-").isdigit():
            raise self._refuse(j, errno.EINVAL, "update of %s: metadata names no round",
                               client)
        if int(r) != j.round:
            raise self._refuse(j, errno.ESTALE, "update of %s is for round %s; the job "
                               "is at round %d", client, r, j.round)
        if meta.get("client", client) != client:
            raise self._refuse(j, errno.EINVAL, "update of %s says it is from %s",
                               client, meta.get("client"))
        mode = j.config["mode"]
        enc = meta.get("encoding", "plain")
        if enc != mode:
            raise self._refuse(j, errno.EINVAL, "update of %s is %s; the job's mode is %s",
                               client, enc, mode)
        params = self._params_tensors(j)
        if mode == "he":
            ctx = self._he_ctx(j)
            try:
                chunks = _he_chunks(tensors)
                n = int(meta.get("n", "-1"))
            except ValueError as e:
                raise self._refuse(j, errno.EINVAL, "update of %s: %s", client, e) from None
            total = sum(a.size for a in params.values())
            want = max(1, -(-total // HE_SLOTS))
            if n != total or len(chunks) != want:
                raise self._refuse(j, errno.EINVAL, "update of %s: %d values in %d chunks; "
                                   "the params have %d (%d chunks)", client, n, len(chunks),
                                   total, want)
            for i, c in enumerate(chunks):
                try:
                    v = _tenseal().ckks_vector_from(ctx, c)
                except Exception as e:
                    raise self._refuse(j, errno.EINVAL, "update of %s: chunk %d is not a "
                                       "CKKS vector of this job's context (%s)", client, i,
                                       e) from None
                size = min(HE_SLOTS, total - i * HE_SLOTS)
                if v.size() != size:
                    raise self._refuse(j, errno.EINVAL, "update of %s: chunk %d holds %d "
                                       "values, not %d", client, i, v.size(), size)
            return tensors
        if sorted(tensors) != sorted(params):
            raise self._refuse(j, errno.EINVAL, "update of %s: tensors %s; the params have %s",
                               client, sorted(tensors)[:8], sorted(params)[:8])
        for k, p in params.items():
            a = tensors[k]
            if tuple(a.shape) != tuple(p.shape):
                raise self._refuse(j, errno.EINVAL, "update of %s: tensor %s is %s, not %s",
                                   client, k, tuple(a.shape), tuple(p.shape))
            want_dt = np.uint64 if mode == "secure" else p.dtype
            if a.dtype != want_dt:
                raise self._refuse(j, errno.EINVAL, "update of %s: tensor %s is %s, not %s",
                                   client, k, a.dtype, np.dtype(want_dt))
            if mode == "plain" and not np.all(np.isfinite(a)):
                raise self._refuse(j, errno.EINVAL, "update of %s: tensor %s not finite",
                                   client, k)
        if mode == "secure":
            if meta.get("frac_bits") != str(FRAC_BITS):
                raise self._refuse(j, errno.EINVAL, "update of %s: frac_bits %s, not %d",
                                   client, meta.get("frac_bits"), FRAC_BITS)
            try:
                peers = self._secure_peers(j)
            except FedError as e:
                raise self._refuse(j, e.errno, "update of %s: %s", client, e.strerror) from None
            if meta.get("peers") != peers_digest(peers):
                raise self._refuse(j, errno.EINVAL, "update of %s was masked against another "
                                   "set of keys than the round's (%s)", client,
                                   ", ".join(sorted(peers)))
            if client not in peers:
                raise self._refuse(j, errno.EACCES, "update of %s: no key registered", client)
        return tensors

    def _he_ctx(self, j: _Job):
        if not HE_AVAILABLE:
            raise self._refuse(j, errno.EOPNOTSUPP, "mode he needs tenseal")
        if j.he_context is None:
            raise self._refuse(j, errno.EAGAIN, "mode he: the owner has not written "
                               "he/context yet")
        cached = j.he_ctx_cache
        if cached is None or cached[0] != j.he_context.mtime_ns:
            ctx = he_context(self.kv.get(self._k(j.name, "he/context")) or b"")
            j.he_ctx_cache = cached = (j.he_context.mtime_ns, ctx)
        return cached[1]

    def _write_update(self, j: _Job, parts: tuple[str, ...], data: bytes, uid: int, gid: int) -> None:
        changed = [parts, (j.name, "updates"), (j.name, "status")]
        try:
            with j.lock:
                j.placeholders.pop((parts[1], parts[2]), None)
                client = self._check_new_name_round(j, parts, uid, data)
                if j.busy or j.phase != "collecting":
                    raise self._refuse(j, errno.ESTALE, "update of %s: round %d is closed "
                                       "(%s)", client, j.round,
                                       "aggregating" if j.busy else j.phase)
                if not j.params_gen:
                    raise self._refuse(j, errno.EAGAIN, "update of %s: the job has no params "
                                       "yet", client)
                self._validate_update(j, client, data)
                self.kv.put(self._k(j.name, f"updates/{j.round}/{client}"), data)
                now = _now_ns()
                j.updates[client] = _Entry(uid, gid, now, len(data))
                j.bindings.setdefault(client, uid)
                j.mtime_ns = now
                self._put_meta(j)     # the commit point of the update
                log.info("federated: job %s: update of %s for round %d accepted (%d bytes, "
                         "%d of %d)", j.name, client, j.round, len(data), len(j.updates),
                         _expected_count(j.config))
                complete = self._complete(j)
        finally:
            self._changed(changed)
        if complete:
            try:
                self._aggregate(j, trigger=False)
            except FedError:
                pass    # logged, and in status (last_error); the update was accepted

    def _check_new_name_round(self, j: _Job, parts: tuple[str, ...], uid: int,
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
                raise self._refuse(j, errno.ESTALE, "update of %s is for round %s; the job "
                                   "is at round %d", _strip(parts[2], UPDATE_SUFFIX), r,
                                   j.round) from None
            raise
        return _strip(parts[2], UPDATE_SUFFIX) or ""

    def _write_he_context(self, j: _Job, data: bytes) -> None:
        if not HE_AVAILABLE:
            raise self._refuse(j, errno.EOPNOTSUPP, "he/context: tenseal is not installed")
        try:
            ctx = he_context(data)
        except Exception as e:
            raise self._refuse(j, errno.EINVAL, "he/context: not a TenSEAL context (%s)",
                               e) from None
        if ctx.is_private():
            raise self._refuse(j, errno.EINVAL, "he/context holds the secret key; write the "
                               "public context only")
        with j.lock:
            if j.busy or j.phase != "collecting" or (j.config["mode"] == "he" and j.updates):
                raise self._refuse(j, errno.EBUSY, "he/context: round %d has encrypted "
                                   "updates", j.round)
            self.kv.put(self._k(j.name, "he/context"), data)
            j.he_context = _Entry(j.owner, j.gid, _now_ns(), len(data))
            j.he_ctx_cache = (j.he_context.mtime_ns, ctx)
            self._put_meta(j)
        self._changed([(j.name, "he", "context"), (j.name, "status")])

    # ------------------------------------------------------------ aggregation

    def _aggregate(self, j: _Job, trigger: bool) -> None:
        """Aggregate the current round: phase 1 under the lock (checks, snapshot),
        the arithmetic without it, the commit under it again."""
        with j.lock:
            if j.busy:
                raise self._refuse(j, errno.EBUSY, "round %d is already being aggregated",
                                   j.round)
            if j.phase != "collecting":
                raise self._refuse(j, errno.EBUSY, "round %d awaits decryption of he/sum",
                                   j.round)
            if not j.params_gen:
                raise self._refuse(j, errno.EAGAIN, "aggregate: the job has no params")
            cfg = dict(j.config)
            mode = cfg["mode"]
            n = _expected_count(cfg)
            m = len(j.updates)
            if not self._complete(j):
                need = cfg["min_clients"] or n
                if mode == "secure":
                    raise self._refuse(j, errno.EAGAIN, "aggregate: mode secure needs every "
                                       "participant (masks cancel only in the full sum): "
                                       "%d of %d updates", m, n)
                if not trigger or m < need:
                    raise self._refuse(j, errno.EAGAIN, "aggregate: %d of %d updates (at "
                                       "least %d needed)", m, n, need)
            if m == 0:
                raise self._refuse(j, errno.EAGAIN, "aggregate: no updates")
            clients = sorted(j.updates)
            rnd = j.round
            blobs = {c: self.kv.get(self._k(j.name, f"updates/{rnd}/{c}")) for c in clients}
            params_blob = self._params(j)
            he_ctx = self._he_ctx(j) if mode == "he" else None
            j.busy = True
        t0 = time.perf_counter()
        try:
            if mode == "he":
                result = self._he_sum(j, he_ctx, blobs, rnd, clients, n)
            else:
                result = self._compute(j, cfg, params_blob, blobs, rnd, m, n)
        except FedError as e:
            with j.lock:
                j.busy = False
                j.last_error = f"round {rnd}: {e.strerror}"
                self._put_meta_quiet(j)
            raise
        except Exception as e:
            log.exception("federated: job %s: round %d failed", j.name, rnd)
            with j.lock:
                j.busy = False
                j.last_error = f"round {rnd}: {type(e).__name__}: {e}"
                self._put_meta_quiet(j)
            raise self._refuse(j, errno.EIO, "round %d failed: %s", rnd, e) from None
        secs = time.perf_counter() - t0
        with j.lock:
            try:
                if mode == "he":
                    changed = self._commit_he_sum(j, result, rnd, clients, secs)
                else:
                    changed = self._commit_round(j, result, rnd, clients, cfg, m, n, secs)
            except Exception as e:
                log.exception("federated: job %s: committing round %d failed", j.name, rnd)
                j.last_error = f"round {rnd}: commit failed: {e}"
                raise self._refuse(j, errno.EIO, "round %d: commit failed: %s", rnd,
                                   e) from None
            finally:
                j.busy = False
        self._changed(changed)

    def _put_meta_quiet(self, j: _Job) -> None:
        try:
            self._put_meta(j)
        except Exception:
            log.exception("federated: job %s: saving its state failed", j.name)

    def _compute(self, j: _Job, cfg: dict, params_blob: bytes, blobs: dict[str, bytes],
                 rnd: int, m: int, n: int) -> tuple[bytes, float, float]:
        """plain / secure: the new params blob, the effective noise multiplier and the
        norm of the applied mean."""
        params, pmeta = st_load(params_blob)
        C, z, lr = cfg["clip_norm"], cfg["noise_multiplier"], cfg["learning_rate"]
        names = sorted(params)
        if cfg["mode"] == "plain":
            total = {k: np.zeros(params[k].shape, np.float64) for k in names}
            for c, blob in blobs.items():
                u, _ = st_load(blob)
                u = clip_gradients({k: u[k].astype(np.float64) for k in names}, C)
                for k in names:
                    total[k] += u[k]
            if z > 0:
                seed = cfg.get("seed")
                g = (np.random.default_rng([seed, rnd]) if seed is not None else _rng(None))
                for k in names:
                    total[k] += g.normal(0.0, z * C, size=total[k].shape)
            z_eff = z
        else:  # secure
            acc = {k: np.zeros(params[k].shape, np.uint64) for k in names}
            for c, blob in blobs.items():
                u, _ = st_load(blob)
                for k in names:
                    acc[k] += u[k]      # wraps mod 2^64
            total = {k: decode_fixed(acc[k]) for k in names}
            norm = math.sqrt(sum(float(np.sum(t * t)) for t in total.values()))
            d = sum(t.size for t in total.values())
            bound = m * C + 8.0 * z * C * math.sqrt(d) + 1.0
            if not norm <= bound:
                raise self._refuse(j, errno.EIO, "round %d: the unmasked sum has norm %.3g, "
                                   "beyond %.3g: masks did not cancel or a client did not "
                                   "clip; round not applied, updates kept", rnd, norm, bound)
            z_eff = z
        mean = {k: total[k] / m for k in names}
        new = {k: (params[k].astype(np.float64) + lr * mean[k]).astype(params[k].dtype)
               for k in names}
        meta = dict(pmeta)
        meta.update({"round": str(rnd + 1), "job": j.name})
        norm_mean = math.sqrt(sum(float(np.sum(v * v)) for v in mean.values()))
        return st_save(new, meta), z_eff, norm_mean

    def _commit_round(self, j: _Job, result: tuple[bytes, float, float], rnd: int,
                      clients: list[str], cfg: dict, m: int, n: int, secs: float,
                      mode: Optional[str] = None) -> list[tuple[str, ...]]:
        blob, z_eff, norm = result
        if j.round != rnd:
            raise RuntimeError("the round moved while it was aggregated")
        self._commit_params(j, blob)
        old_updates = list(j.updates)
        j.updates = {}
        j.round = rnd + 1
        j.phase = "collecting"
        j.events.append(float(z_eff))
        j.last_error = ""
        eps = self._epsilon(j)
        mode = mode or cfg["mode"]
        sigma = cfg["noise_multiplier"] * cfg["clip_norm"] / m
        line = (f"round={rnd + 1} mode={mode} clients={m}/{n} clip_norm={cfg['clip_norm']:g} "
                f"noise_multiplier={z_eff:g} sigma_mean={sigma:.6g} "
                f"update_norm={norm:.6g} epsilon={_fmt(eps)} delta={j.config['delta']:g} "
                f"seconds={secs:.4f} time={time.strftime('%Y-%m-%dT%H:%M:%S')}")
        j.history.append(line)
        del j.history[:-HISTORY_MAX]
        self.kv.put(self._k(j.name, "history"), "".join(h + "\n" for h in j.history).encode())
        he_sum = j.he_sum
        j.he_sum = None
        self._put_meta(j)             # the commit point of the round
        for c in old_updates:
            self.kv.delete(self._k(j.name, f"updates/{rnd}/{c}"))
        if he_sum is not None:
            self.kv.delete(self._k(j.name, f"he/sum/{he_sum['round']}"))
        self._drop_old_params(j)
        log.info("federated: job %s: %s", j.name, line)
        changed = [(j.name, x) for x in ("params.safetensors", "round", "privacy", "status",
                                         "history", "updates")]
        changed += [(j.name, "updates", c + UPDATE_SUFFIX) for c in old_updates]
        if he_sum is not None:
            changed += [(j.name, "he"), (j.name, "he", "sum")]
        changed += self._maybe_apply_pending(j)
        return changed

    def _he_sum(self, j: _Job, ctx, blobs: dict[str, bytes], rnd: int, clients: list[str],
                n: int) -> bytes:
        total = None
        count = 0
        for c in clients:
            chunks = _he_chunks(st_load(blobs[c])[0])
            vecs = [_tenseal().ckks_vector_from(ctx, ch) for ch in chunks]
            total = vecs if total is None else [a + b for a, b in zip(total, vecs)]
            count = sum(v.size() for v in vecs)
        meta = {"round": str(rnd), "clients": ",".join(clients), "n": str(count),
                "job": j.name, "encoding": "ckks-sum"}
        return st_save(_he_pack([v.serialize() for v in total]), meta)

    def _commit_he_sum(self, j: _Job, blob: bytes, rnd: int, clients: list[str],
                       secs: float) -> list:
        if j.round != rnd:
            raise RuntimeError("the round moved while it was aggregated")
        self.kv.put(self._k(j.name, f"he/sum/{rnd}"), blob)
        j.he_sum = {"round": rnd, "clients": clients, "mtime_ns": _now_ns(),
                    "size": len(blob), "config": dict(j.config), "seconds": secs}
        j.phase = "awaiting_decryption"
        j.mtime_ns = _now_ns()
        self._put_meta(j)
        log.info("federated: job %s: round %d: encrypted sum of %d updates published in "
                 "he/sum; awaiting decryption by the owner", j.name, rnd, len(clients))
        return [(j.name, "he"), (j.name, "he", "sum"), (j.name, "status")]

    def _write_decrypted(self, j: _Job, data: bytes) -> None:
        try:
            tensors, meta = st_load(data)
        except ValueError as e:
            raise self._refuse(j, errno.EINVAL, "he/decrypted.safetensors: %s", e) from None
        with j.lock:
            if j.phase != "awaiting_decryption" or j.he_sum is None or j.busy:
                raise self._refuse(j, errno.EAGAIN, "he/decrypted.safetensors: no sum "
                                   "awaits decryption")
            rnd = j.round
            if meta.get("round") != str(rnd):
                raise self._refuse(j, errno.ESTALE, "he/decrypted.safetensors is for round "
                                   "%s; the sum awaiting is round %d", meta.get("round"), rnd)
            params, pmeta = st_load(self._params(j))
            if sorted(tensors) != sorted(params):
                raise self._refuse(j, errno.EINVAL, "he/decrypted.safetensors: tensors are "
                                   "not named as the params")
            for k, p in params.items():
                a = tensors[k]
                if tuple(a.shape) != tuple(p.shape) or a.dtype.kind != "f" or \
                        not np.all(np.isfinite(a)):
                    raise self._refuse(j, errno.EINVAL, "he/decrypted.safetensors: tensor %s "
                                       "is not a finite float tensor of shape %s", k,
                                       tuple(p.shape))
            cfg = dict(j.he_sum.get("config") or j.config)
            clients = list(j.he_sum["clients"])
            m, n = len(clients), _expected_count(cfg)
            lr = cfg["learning_rate"]
            new = {k: (params[k].astype(np.float64) + lr * tensors[k].astype(np.float64) / m)
                   .astype(params[k].dtype) for k in params}
            pm = dict(pmeta)
            pm.update({"round": str(rnd + 1), "job": j.name})
            norm = math.sqrt(sum(float(np.sum((tensors[k] / m) ** 2)) for k in params))
            z_eff = cfg["noise_multiplier"] * math.sqrt(m / n)
            changed = self._commit_round(j, (st_save(new, pm), z_eff, norm), rnd, clients,
                                         cfg, m, n, float(j.he_sum.get("seconds", 0.0)),
                                         mode="he")
        self._changed(changed)


def _history_round(line: str) -> int:
    m = re.match(r"round=(\d+)", line)
    return int(m.group(1)) if m else 0


def _runs(values: Sequence[float]) -> str:
    """1 1 1 0.5 -> '1x3 0.5x1'."""
    out: list[list] = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return " ".join(f"{v:g}x{c}" for v, c in out) or "-"


def _strip(name: str, suffix: str) -> Optional[str]:
    if name.endswith(suffix) and len(name) > len(suffix):
        return name[:-len(suffix)]
    return None


def _fmt(x: float) -> str:
    if math.isinf(x):
        return "inf"
    if math.isnan(x):
        return "unavailable"
    return f"{x:.6g}"
