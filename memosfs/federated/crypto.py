"""Keys, pairwise masks and homomorphic encryption for the federated package.

Owns: X25519 key pairs and the keys/<client>.pub format (parse_public_key), the
pairwise additive masks of mode secure (X25519 -> HKDF-SHA256 -> ChaCha20 keystream in
Z/2^64; pair_mask, mask_update, peers_digest), and mode he's CKKS helpers over TenSEAL
(he_keygen, he_context, he_encrypt, he_decrypt, and the ckks.NNNN chunk layout of an
encrypted update: he_chunks / he_pack).  `cryptography` is imported on first use;
tenseal is optional (HE_AVAILABLE) and imported on first use too (~0.3 s, which a
mount should not pay at start).

May call: numpy, cryptography, tenseal, the standard library.  Imports nothing of
memosfs; the client (client.py) and the job engine (rounds.py, engine.py) call it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from typing import Any, Optional, Sequence

import numpy as np

HE_AVAILABLE = importlib.util.find_spec("tenseal") is not None
_ts: Any = None


def tenseal():
    """The tenseal module, imported on first use."""
    global _ts
    if _ts is None:
        import tenseal
        _ts = tenseal
    return _ts


# ---------------------------------------------------------------- keys and masks


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


def need_he():
    if not HE_AVAILABLE:
        raise RuntimeError("mode he needs tenseal (pip install tenseal)")
    return tenseal()


def he_keygen():
    """(secret TenSEAL CKKS context, public context bytes without the secret key)."""
    ts = need_he()
    ctx = ts.context(ts.SCHEME_TYPE.CKKS, HE_POLY_DEGREE,
                     coeff_mod_bit_sizes=[60, 40, 40, 60])
    ctx.global_scale = 2 ** 40
    pub = ctx.serialize(save_public_key=True, save_secret_key=False,
                        save_galois_keys=False, save_relin_keys=False)
    return ctx, pub


def he_context(data: bytes):
    return need_he().context_from(bytes(data))


def he_encrypt(ctx, vec: np.ndarray) -> list[bytes]:
    """A float vector as CKKS ciphertexts of at most HE_SLOTS values each."""
    ts = need_he()
    v = np.asarray(vec, dtype=np.float64)
    return [ts.ckks_vector(ctx, v[i:i + HE_SLOTS].tolist()).serialize()
            for i in range(0, max(len(v), 1), HE_SLOTS)]


def he_decrypt(secret_ctx, chunks: Sequence[bytes]) -> np.ndarray:
    ts = need_he()
    parts = [np.asarray(ts.ckks_vector_from(secret_ctx, bytes(c)).decrypt(), dtype=np.float64)
             for c in chunks]
    return np.concatenate(parts) if parts else np.zeros(0)


def he_chunks(tensors: dict[str, np.ndarray]) -> list[bytes]:
    names = sorted(k for k in tensors if k.startswith("ckks."))
    if not names or set(tensors) != set(names):
        raise ValueError("an he update holds only tensors ckks.0000, ckks.0001, ...")
    if names != [f"ckks.{i:04d}" for i in range(len(names))]:
        raise ValueError("ckks chunks are numbered ckks.0000, ckks.0001, ...")
    return [tensors[k].tobytes() for k in names]


def he_pack(chunks: Sequence[bytes]) -> dict[str, np.ndarray]:
    return {f"ckks.{i:04d}": np.frombuffer(c, dtype=np.uint8) for i, c in enumerate(chunks)}

