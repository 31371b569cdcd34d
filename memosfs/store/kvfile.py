"""KV slot files: safetensors parsing and quantized storage.

With the `quantize` knob on, a published slot that is a safetensors file has
its floating tensors stored quantized; a read returns a safetensors file with
the same header, shapes and dtypes, holding the dequantized values.  Nothing
else changes for the client: `st_size` is the logical size, `st_blocks` and
`user.memos.stored_bytes` show what is stored.

Schemes (x has shape [..., tokens, head_dim], the transformers cache layout):

    int8-layer  one scale per tensor (the source design's "per layer")
    int8        symmetric int8; keys (`*.key`) one scale per channel (over the
                tokens), values and other tensors one scale per token (over
                the channels).  The default: ~4x finer error than int8-layer.
    int4        asymmetric 4-bit (scale and minimum) in groups of 32: keys per
                channel in groups of 32 tokens, values per token in groups of
                32 channels (KIVI-style); two codes a byte.

A tensor whose relative error ||x - x_hat|| / ||x|| exceeds `quant_error_max`
is kept at full precision (a fallback).  Tensors of fewer than two dimensions
and non-float tensors are kept as they are.

Scales (and int4 minimums) are kept as float16 where that loses nothing
(finite, no value flushed to zero), else float32.

Stored form (the "container"): magic `MEMOSQ01`, u32 header length, u32
header crc32c, a JSON header (the original file's size and a list of
segments covering it in order: raw bytes or a quantized tensor with its
codes and scales), then the segments' bytes.  Decoding rebuilds the logical
file segment by segment.  All arithmetic is vectorized numpy.

The store's side (`QuantizedVersions`, one per Store): a draft becomes its
container at publish (`quantize`), a stored version is decoded once and its
logical bytes kept for its readers (`logical`, a cache of
DECODED_CACHE_BYTES), and the quant_* counters.  The SSD and remote tiers
store the container as it is.

May call: memosfs._native (crc32c; drafts made by the store's allocator).
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from memosfs import _native

__all__ = ["SCHEMES", "parse_safetensors", "encode", "decode", "is_container",
           "EncodeResult", "quantize_tensor", "dequantize_tensor", "QuantizedVersions",
           "quant_error_limit", "DECODED_CACHE_BYTES"]

log = logging.getLogger("memosfs.store.kvfile")
DECODED_CACHE_BYTES = 512 << 20   # logical bytes of quantized versions kept decoded

SCHEMES = ("int8", "int8-layer", "int4")
MAGIC = b"MEMOSQ01"
_HEAD = struct.Struct("<8sII")
GROUP = 32
FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": None, "F64": np.float64}


# ---------------------------------------------------------------- safetensors


def parse_safetensors(buf: memoryview) -> Optional[tuple[int, dict]]:
    """(data offset, header) of a well-formed safetensors file, else None."""
    if len(buf) < 8:
        return None
    (n,) = struct.unpack_from("<Q", buf, 0)
    if n < 2 or 8 + n > len(buf) or n > 100 << 20:
        return None
    try:
        header = json.loads(bytes(buf[8:8 + n]))
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(header, dict):
        return None
    data_len = len(buf) - 8 - n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, end = info["data_offsets"]
            shape = info["shape"]
            info["dtype"]
        except (KeyError, TypeError, ValueError):
            return None
        if not (0 <= begin <= end <= data_len) or any(
                not isinstance(d, int) or d < 0 for d in shape):
            return None
    return 8 + n, header


# ---------------------------------------------------------------- dtypes


def _to_f32(raw: memoryview, dtype: str, shape: list[int]) -> np.ndarray:
    if dtype == "BF16":
        u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32).reshape(shape)
    return np.frombuffer(raw, dtype=np.dtype(FLOAT_DTYPES[dtype]).newbyteorder("<")
                         ).astype(np.float32).reshape(shape)


def _from_f32(x: np.ndarray, dtype: str) -> bytes:
    if dtype == "BF16":
        u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
        # round to nearest even, as torch does
        rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
        return rounded.astype("<u2").tobytes()
    return np.ascontiguousarray(x, dtype=np.dtype(FLOAT_DTYPES[dtype]).newbyteorder("<")
                                ).tobytes()


# ---------------------------------------------------------------- one tensor


def _axis(name: str) -> int:
    """The axis a scale is shared along: keys per channel share it over the
    tokens (-2), values per token over the channels (-1)."""
    return -2 if name.endswith("key") or name.endswith("keys") else -1


def _params_dtype(*arrays: np.ndarray) -> np.dtype:
    """float16 for scales and minimums where that loses nothing that matters
    (finite, no non-zero value flushed to zero), else float32."""
    for a in arrays:
        h = a.astype(np.float16)
        if not np.all(np.isfinite(h)) or np.any((h == 0) & (a != 0)):
            return np.dtype(np.float32)
    return np.dtype(np.float16)


def quantize_tensor(x: np.ndarray, scheme: str, name: str) -> tuple[dict, list[bytes], np.ndarray]:
    """Quantize x (float32, ndim >= 2).  Returns (params, byte blobs, x_hat);
    x_hat is exactly what decoding will give (stored scales included)."""
    axis = _axis(name)
    if scheme in ("int8", "int8-layer"):
        if scheme == "int8-layer":
            amax = np.max(np.abs(x)).reshape((1,) * x.ndim)
        else:
            amax = np.max(np.abs(x), axis=axis, keepdims=True)
        scale = (amax / 127.0).astype(np.float32)
        pdt = _params_dtype(scale)
        scale = scale.astype(pdt).astype(np.float32)
        safe = np.where(scale == 0, np.float32(1), scale)
        q = np.clip(np.rint(x / safe), -127, 127).astype(np.int8)
        x_hat = q.astype(np.float32) * scale
        params = {"codes": "int8", "scale_shape": list(scale.shape), "pdtype": pdt.str}
        return params, [q.tobytes(), scale.astype(pdt).tobytes()], x_hat
    if scheme == "int4":
        g, shape = _grouped(x, axis)
        lo = g.min(axis=-1, keepdims=True)
        hi = g.max(axis=-1, keepdims=True)
        scale = ((hi - lo) / 15.0).astype(np.float32)
        pdt = _params_dtype(scale, lo)
        scale = scale.astype(pdt).astype(np.float32)
        lo = lo.astype(pdt).astype(np.float32)
        safe = np.where(scale == 0, np.float32(1), scale)
        q = np.clip(np.rint((g - lo) / safe), 0, 15).astype(np.uint8)
        g_hat = q.astype(np.float32) * scale + lo
        x_hat = _ungrouped(g_hat, axis, shape)
        flat = q.reshape(-1)
        if flat.size % 2:
            flat = np.concatenate([flat, np.zeros(1, np.uint8)])
        packed = (flat[0::2] | (flat[1::2] << 4)).astype(np.uint8)
        params = {"codes": "int4", "group_shape": list(g.shape), "pdtype": pdt.str}
        return params, [packed.tobytes(), scale.astype(pdt).tobytes(),
                        lo.astype(pdt).tobytes()], x_hat
    raise ValueError(f"unknown scheme {scheme!r}")


def _grouped(x: np.ndarray, axis: int) -> tuple[np.ndarray, tuple]:
    """Move `axis` last and split it into groups of GROUP (zero-padded)."""
    m = np.moveaxis(x, axis, -1)
    n = m.shape[-1]
    pad = (-n) % GROUP
    if pad:
        # pad with the group's own edge value so padding never widens the range
        m = np.concatenate([m, np.repeat(m[..., -1:], pad, axis=-1)], axis=-1)
    return m.reshape(m.shape[:-1] + (m.shape[-1] // GROUP, GROUP)), x.shape


def _ungrouped(g: np.ndarray, axis: int, shape: tuple) -> np.ndarray:
    m = g.reshape(g.shape[:-2] + (g.shape[-2] * GROUP,))
    n = shape[axis]
    m = m[..., :n]
    return np.moveaxis(m, -1, axis)


def dequantize_tensor(params: dict, blobs: list[memoryview], shape: list[int],
                      name: str) -> np.ndarray:
    axis = _axis(name)
    pdt = np.dtype(params.get("pdtype", "<f4"))
    if params["codes"] == "int8":
        q = np.frombuffer(blobs[0], dtype=np.int8).reshape(shape)
        scale = np.frombuffer(blobs[1], dtype=pdt).astype(np.float32).reshape(
            params["scale_shape"])
        return q.astype(np.float32) * scale
    gshape = tuple(params["group_shape"])
    count = int(np.prod(gshape))
    packed = np.frombuffer(blobs[0], dtype=np.uint8)
    q = np.empty(packed.size * 2, np.uint8)
    q[0::2] = packed & 0x0F
    q[1::2] = packed >> 4
    q = q[:count].reshape(gshape)
    scale = np.frombuffer(blobs[1], dtype=pdt).astype(np.float32).reshape(gshape[:-1] + (1,))
    lo = np.frombuffer(blobs[2], dtype=pdt).astype(np.float32).reshape(gshape[:-1] + (1,))
    return _ungrouped(q.astype(np.float32) * scale + lo, axis, tuple(shape))


# ---------------------------------------------------------------- a whole file


@dataclass
class EncodeResult:
    """A quantized slot: the stored container and the logical bytes it reads
    as; both None when nothing was worth quantizing (fallbacks still count)."""
    container: Optional[bytes]
    logical: Optional[bytes]
    tensors: int                    # float tensors seen
    quantized: int                  # stored quantized
    fallbacks: int                  # kept at full precision for their error
    errors: dict[str, float] = field(default_factory=dict)   # name -> relative error


def encode(buf: memoryview, scheme: str, error_max: float) -> Optional[EncodeResult]:
    """Quantize a safetensors file; None if it is not one or nothing would shrink."""
    parsed = parse_safetensors(buf)
    if parsed is None:
        return None
    data_off, header = parsed
    tensors = sorted(((info["data_offsets"][0] + data_off, info["data_offsets"][1] + data_off,
                       name, info) for name, info in header.items() if name != "__metadata__"),
                     key=lambda t: t[0])
    segments: list[dict] = []
    body: list[bytes] = []
    logical: list[bytes] = []
    pos = 0
    body_len = 0
    seen = done = fallbacks = 0
    errors: dict[str, float] = {}

    def raw(begin: int, end: int) -> None:
        nonlocal body_len
        if end > begin:
            chunk = bytes(buf[begin:end])
            segments.append({"kind": "raw", "len": end - begin, "blobs": [len(chunk)]})
            body.append(chunk)
            logical.append(chunk)
            body_len += len(chunk)

    for begin, end, name, info in tensors:
        if begin < pos:                     # overlapping tensors: not ours to touch
            return None
        raw(pos, begin)
        pos = begin
        dtype, shape = info["dtype"], info["shape"]
        if dtype not in FLOAT_DTYPES or len(shape) < 2 or end == begin:
            raw(begin, end)
            pos = end
            continue
        seen += 1
        x = _to_f32(buf[begin:end], dtype, shape)
        params, blobs, x_hat = quantize_tensor(x, scheme, name)
        norm = float(np.linalg.norm(x))
        err = float(np.linalg.norm(x - x_hat)) / norm if norm else 0.0
        errors[name] = err
        if err > error_max or not np.isfinite(err):
            fallbacks += 1
            raw(begin, end)
            pos = end
            continue
        done += 1
        out = _from_f32(x_hat, dtype)
        seg = {"kind": "q", "len": end - begin, "name": name, "dtype": dtype,
               "shape": shape, "blobs": [len(b) for b in blobs]}
        seg.update(params)
        segments.append(seg)
        body.extend(blobs)
        body_len += sum(len(b) for b in blobs)
        logical.append(out)
        pos = end
    raw(pos, len(buf))
    if not done:
        return EncodeResult(None, None, seen, 0, fallbacks, errors) if seen else None
    head = json.dumps({"size": len(buf), "scheme": scheme, "segments": segments},
                      separators=(",", ":")).encode()
    container = _HEAD.pack(MAGIC, len(head), _native.crc32c(head)) + head + b"".join(body)
    if len(container) >= len(buf):
        return EncodeResult(None, None, seen, 0, fallbacks, errors)
    return EncodeResult(container, b"".join(logical), seen, done, fallbacks, errors)


def is_container(first: bytes) -> bool:
    return len(first) >= _HEAD.size and first[:8] == MAGIC


def container_header(buf: memoryview) -> Optional[tuple[int, dict]]:
    """(body offset, header) of a container, checked; None if not one."""
    if len(buf) < _HEAD.size:
        return None
    magic, hlen, hcrc = _HEAD.unpack_from(buf, 0)
    if magic != MAGIC or _HEAD.size + hlen > len(buf):
        return None
    head = bytes(buf[_HEAD.size:_HEAD.size + hlen])
    if _native.crc32c(head) != hcrc:
        return None
    try:
        return _HEAD.size + hlen, json.loads(head)
    except ValueError:
        return None


def decode(buf: memoryview) -> bytes:
    """The logical file a container reads as."""
    parsed = container_header(buf)
    if parsed is None:
        raise ValueError("not a memosfs quantized container")
    off, head = parsed
    out: list[bytes] = []
    for seg in head["segments"]:
        blobs = []
        for n in seg["blobs"]:
            blobs.append(buf[off:off + n])
            off += n
        if seg["kind"] == "raw":
            out.append(bytes(blobs[0]))
        else:
            x_hat = dequantize_tensor(seg, blobs, seg["shape"], seg["name"])
            out.append(_from_f32(x_hat, seg["dtype"]))
    data = b"".join(out)
    if len(data) != head["size"]:
        raise ValueError(f"decoded {len(data)} bytes, header says {head['size']}")
    return data


def logical_size(buf: memoryview) -> Optional[int]:
    parsed = container_header(buf)
    return None if parsed is None else int(parsed[1]["size"])


def describe(result: EncodeResult) -> dict[str, Any]:
    return {"tensors": result.tensors, "quantized": result.quantized,
            "fallbacks": result.fallbacks, "stored": len(result.container),
            "logical": len(result.logical)}


def quant_error_limit(scheme: str, knob: str) -> float:
    """quant_error_max: a number, or auto (0.03 for int8 schemes, 0.12 for int4)."""
    if knob != "auto":
        return float(knob)
    return 0.12 if scheme == "int4" else 0.03


# ---------------------------------------------------------------- the store's side


class QuantizedVersions:
    """Quantized storage of one store: encoding at publish, decoding for
    readers (each version decoded once, kept while DECODED_CACHE_BYTES
    allow), and its counters.  Trio thread only."""

    def __init__(self, new_draft: Callable[[], "_native.Draft"],
                 cache_bytes: int = DECODED_CACHE_BYTES) -> None:
        self._new_draft = new_draft
        self.cache_bytes = cache_bytes
        self._decoded: "collections.OrderedDict[tuple, bytes]" = collections.OrderedDict()
        self.counts: collections.Counter = collections.Counter()  # tensors, fallbacks,
                                                                  # saved_bytes

    def logical(self, ref: Optional["_native.Ref"]) -> Optional[bytes]:
        """The logical bytes of a quantized version (decoded once, shared by
        its readers); None for a version stored as it was written.  OSError
        EIO (logged) when the container cannot be decoded."""
        if ref is None or ref.size < 16 or not is_container(ref.read(0, 16)):
            return None
        key = (ref.key, ref.version)
        data = self._decoded.get(key)
        if data is None:
            view = ref.read(0, ref.size)
            try:
                data = decode(memoryview(view))
            except (ValueError, KeyError) as e:
                log.error("slot %s v%d: quantized form unreadable: %s",
                          ref.key.decode("utf-8", "replace"), ref.version, e)
                raise OSError(errno.EIO, f"slot {ref.key!r} cannot be decoded") from None
            self.remember(key, data)
        return data

    def forget(self, slot_key: bytes) -> None:
        """Drop every decoded version of a slot that was removed or renamed
        (its entries would otherwise stay until the LRU pushed them out)."""
        for k in [k for k in list(self._decoded) if k[0] == slot_key]:
            self._decoded.pop(k, None)

    def remember(self, key: tuple, data: bytes) -> None:
        """Keep the logical bytes of version key = (slot key, version)."""
        self._decoded[key] = data
        self._decoded.move_to_end(key)
        total = sum(len(v) for v in self._decoded.values())
        while total > self.cache_bytes and len(self._decoded) > 1:
            _, old = self._decoded.popitem(last=False)
            total -= len(old)

    def quantize(self, d: "_native.Draft", scheme: str, error_max: str
                 ) -> tuple["_native.Draft", Optional[bytes]]:
        """A safetensors draft becomes its quantized container (scheme "off":
        never); returns (draft to publish, logical bytes or None).  `d` is
        freed when replaced; OSError of the allocator leaves it as it was."""
        if scheme == "off" or d.size < 16:
            return d, None
        result = encode(memoryview(d.read(0, d.size)), scheme,
                        quant_error_limit(scheme, error_max))
        if result is None:
            return d, None
        self.counts["fallbacks"] += result.fallbacks
        if result.container is None:
            return d, None
        self.counts["tensors"] += result.quantized
        self.counts["saved_bytes"] += len(result.logical) - len(result.container)
        q = self._new_draft()
        try:
            q.write(0, result.container)
        except BaseException:
            q.free()
            raise
        d.free()
        return q, result.logical

    def statistics(self) -> dict[str, int]:
        return {"quant_tensors": self.counts["tensors"],
                "quant_fallbacks": self.counts["fallbacks"],
                "quant_saved_bytes": self.counts["saved_bytes"]}
