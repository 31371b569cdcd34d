"""Tensors for the federated package: safetensors bytes, norms, clipping, noise and the
fixed-point ring.

Owns: st_header / st_load / st_save (the safetensors format, validated on load), the
L2 norm and per-client clipping of an update (numpy arrays or torch tensors; torch is
imported only when the caller passes torch tensors), Gaussian noise, the flattening of
a dict of tensors into one vector and back, and the fixed-point encoding of floats
into Z/2^64 (uint64) that mode secure masks and sums.

May call: numpy and the standard library.  Imports nothing of memosfs; the client
(client.py), the masks (crypto.py) and the job engine (rounds.py, engine.py) call it.
"""

from __future__ import annotations

import json
import math
import secrets
import struct
from typing import Any, Optional

import numpy as np

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


# ---------------------------------------------------------------- norms, clipping, noise


def is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def as_numpy(x: Any) -> np.ndarray:
    if is_torch(x):
        return x.detach().cpu().double().numpy()
    return np.asarray(x)


def global_norm(update: dict[str, Any]) -> float:
    """L2 norm over all tensors of an update (numpy arrays or torch tensors)."""
    total = 0.0
    for v in update.values():
        a = as_numpy(v).astype(np.float64, copy=False)
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
        if is_torch(v):
            out[k] = v * scale if scale != 1.0 else v.clone()
        else:
            a = np.asarray(v)
            out[k] = (a * scale).astype(a.dtype) if scale != 1.0 else a.copy()
    # float rounding may leave the norm a hair above clip_norm in low precision
    return out


def make_rng(rng: Any) -> np.random.Generator:
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
    g = make_rng(rng)
    out = {}
    for k in sorted(update):
        v = update[k]
        if is_torch(v):
            import torch  # only when the caller uses torch
            n = g.normal(0.0, sigma, size=tuple(v.shape)) if sigma else np.zeros(tuple(v.shape))
            out[k] = v + torch.from_numpy(n).to(dtype=v.dtype, device=v.device)
        else:
            a = np.asarray(v)
            n = g.normal(0.0, sigma, size=a.shape) if sigma else 0.0
            out[k] = (a.astype(np.float64) + n).astype(a.dtype if a.dtype.kind == "f" else np.float64)
    return out


def flatten(update: dict[str, Any]) -> np.ndarray:
    names = sorted(update)
    if not names:
        return np.zeros(0)
    return np.concatenate([as_numpy(update[k]).astype(np.float64).ravel() for k in names])


def unflatten(vec: np.ndarray, like: dict[str, np.ndarray], dtype: Any = None) -> dict[str, np.ndarray]:
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
