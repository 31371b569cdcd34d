"""KV slots: a model's past keys/values as a safetensors file (docs/design.md,
"KV slot files").

A slot written by `save_kv` is an ordinary safetensors file (serialized by
the `safetensors` library, written with one open/write/close so that it gets
the creator's umask-derived mode) with, for each layer i, the tensors

    layers.<i>.key     [batch, kv_heads, tokens, head_dim]   (transformers' cache layout)
    layers.<i>.value   [batch, kv_heads, tokens, head_dim]

in float32, float16 or bfloat16, and string `__metadata__`:

    format       memosfs-kv/1
    model        the model id (e.g. HuggingFaceTB/SmolLM2-135M-Instruct)
    dtype        float32 | float16 | bfloat16
    tokens       number of cached tokens
    layers, kv_heads, head_dim, batch
    prefix_hash  the chained prefix hash of the cached tokens ("" when unknown)
    prefix_block the block size that hash was computed with
    hash         sha256-chain/int32le (how prefix hashes are made, below)
    ...          anything passed as extra_meta

`load_kv` checks that metadata against the model it is given (layers,
kv_heads, head_dim, dtype, model id, and the tensors against the metadata)
and raises `KVMismatch` naming the field, what was expected and what was
found: a KV cache never loads silently into the wrong model.  Loading maps
the file (safetensors `safe_open`, numpy views of an mmap): no copy until a
tensor is written, and readers of one slot share the page cache.

Prefix keys.  `prefix_hashes(tokens, block=512, seed=b"")` returns
h_1..h_n with

    h_0 = seed                                   (bytes; a str is UTF-8 encoded)
    h_i = sha256(h_{i-1} || tokens[(i-1)*block : i*block] as little-endian int32)

as 64-character hex strings (usable as slot names); the int32 bytes are fixed
whatever the integer type of the input (token ids must lie in [0, 2**31)).
h_i names the prefix of the first i*block tokens, so agents that share a
system prompt find each other's slots: `save_prefix` writes a cache under
the name of its longest whole-block prefix, `find_longest_prefix` finds the
longest one present in a session and `load_longest_prefix` loads it.  Pass
`seed=` (e.g. the model id) to keep different models' prefixes apart by name;
the metadata check keeps them apart in any case.

A path below a memosfs mount point with nothing mounted on it (the daemon
marks its mount points; /etc/fstab names them) is refused with NotOnMount
(an OSError, ENODEV, naming the mount point) by the helpers that write,
list or load slots, instead of writing onto the disk beneath; any other
path works, on any filesystem (memosfs/client/mounts.py).

torch and transformers are imported only when needed: numpy arrays work
without them (`as_="numpy"`).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import mmap
import os
import struct
from typing import Any, Sequence

import numpy as np

from memosfs.client.mounts import NotOnMount, check_path  # noqa: F401 (kv.NotOnMount)

FORMAT = "memosfs-kv/1"
HASH_SCHEME = "sha256-chain/int32le"
DEFAULT_BLOCK = 512
RESERVED = ("format", "model", "dtype", "tokens", "layers", "kv_heads", "head_dim", "batch",
            "prefix_hash", "prefix_block", "hash")
_ST_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16"}
_NP_DTYPES = {"float32": np.float32, "float16": np.float16}


class KVFormatError(ValueError):
    """The file is not a memosfs KV slot, or its tensors contradict its metadata."""


class KVMismatch(ValueError):
    """The slot's metadata does not match the model (or the expectation) it
    was loaded for.  `mismatches` is a list of (field, expected, found);
    `field`, `expected`, `found` are the first of them."""

    def __init__(self, path: str, mismatches: list[tuple[str, Any, Any]]):
        self.path = path
        self.mismatches = mismatches
        self.field, self.expected, self.found = mismatches[0]
        what = "; ".join(f"{f}: expected {e!r}, found {v!r}" for f, e, v in mismatches)
        super().__init__(f"KV slot {path} does not match the model: {what}")


# ---------------------------------------------------------------- prefix keys

def canonical_token_bytes(tokens: Any) -> bytes:
    """Token ids as little-endian int32 bytes (lists, numpy arrays, torch
    tensors; 1-D, or [1, n])."""
    if hasattr(tokens, "detach"):                       # torch tensor
        tokens = tokens.detach().cpu().numpy()
    arr = np.asarray(tokens)
    if arr.ndim == 2 and arr.shape[0] == 1:
        arr = arr[0]
    if arr.ndim != 1:
        raise ValueError(f"tokens must be 1-D (or [1, n]), got shape {arr.shape}")
    if arr.size == 0:
        return b""
    if arr.dtype.kind not in "iu":
        if arr.dtype.kind == "f" and np.all(arr == np.floor(arr)):
            arr = arr.astype(np.int64)
        else:
            raise ValueError(f"token ids must be integers, got {arr.dtype}")
    if int(arr.min()) < 0 or int(arr.max()) >= 2**31:
        raise ValueError("token ids must lie in [0, 2**31)")
    return arr.astype("<i4").tobytes()


def _seed_bytes(seed: bytes | str) -> bytes:
    return seed.encode() if isinstance(seed, str) else bytes(seed)


def prefix_hashes(tokens: Any, block: int = DEFAULT_BLOCK, seed: bytes | str = b"",
                  partial: bool = False) -> list[str]:
    """[h_1, ..., h_n]: h_i names the first i*block tokens (see the module
    doc).  With partial=True and a length that is not a multiple of block,
    one more hash names the whole sequence."""
    if block <= 0:
        raise ValueError("block must be positive")
    data = canonical_token_bytes(tokens)
    step = 4 * block
    h = _seed_bytes(seed)
    out = []
    end = len(data) if partial else len(data) - len(data) % step
    for off in range(0, end, step):
        h = hashlib.sha256(h + data[off:off + step]).digest()
        out.append(h.hex())
    return out


def prefix_hash(tokens: Any, block: int = DEFAULT_BLOCK, seed: bytes | str = b"") -> str:
    """The name of the whole token sequence (its last chained hash, the tail
    block included); "" for no tokens."""
    hs = prefix_hashes(tokens, block, seed, partial=True)
    return hs[-1] if hs else ""


_whole_prefix_hash = prefix_hash


def _n_tokens(tokens: Any) -> int:
    return len(canonical_token_bytes(tokens)) // 4


def find_longest_prefix(session_dir: str | os.PathLike, tokens: Any,
                        block: int = DEFAULT_BLOCK, seed: bytes | str = b"",
                        partial: bool = True) -> tuple[int, str | None]:
    """(n_tokens, path) of the longest prefix of `tokens` cached in
    `session_dir` (slots named by prefix hash), or (0, None).  One readdir,
    no lookups of absent slots.  partial=True also considers the whole
    sequence when its length is not a multiple of block."""
    for n, _, path in _cached_prefixes(session_dir, tokens, block, seed, partial):
        return n, path
    return 0, None


def _cached_prefixes(session_dir, tokens, block, seed, partial):
    """(n_tokens, prefix hash, path) of every cached prefix of `tokens` in
    `session_dir`, longest first, from one directory listing."""
    hashes = prefix_hashes(tokens, block, seed, partial=partial)
    check_path(session_dir)
    try:
        present = set(os.listdir(session_dir))
    except FileNotFoundError:
        return
    n_total = _n_tokens(tokens)
    for i in range(len(hashes) - 1, -1, -1):
        if hashes[i] in present:
            yield (min((i + 1) * block, n_total), hashes[i],
                   os.path.join(os.fspath(session_dir), hashes[i]))


def load_longest_prefix(session_dir: str | os.PathLike, tokens: Any, *, model: Any = None,
                        block: int = DEFAULT_BLOCK, seed: bytes | str = b"",
                        device: str = "cpu", as_: str = "dynamic",
                        partial: bool = True) -> tuple[int, Any]:
    """(n_tokens, cache) for the longest cached prefix of `tokens`, checked
    against `model` and against the prefix (token count and hash); (0, None)
    when nothing is cached.  A slot that disappears between the listing and
    the open (evicted from a memory-only cache) makes it try the next shorter
    one; a mismatch raises."""
    for n, prefix_hash, path in _cached_prefixes(session_dir, tokens, block, seed, partial):
        try:
            cache = load_kv(path, model=model, tokens=n, prefix_hash=prefix_hash,
                            device=device, as_=as_)
        except FileNotFoundError:
            continue
        return n, cache
    return 0, None


# ------------------------------------------------------------------- saving

def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def kv_pairs(past_key_values: Any) -> list[tuple[Any, Any]]:
    """[(key, value), ...] per layer from a transformers cache (recent:
    `cache.layers[i].keys/.values`; older: `key_cache/value_cache`), a
    legacy tuple of (k, v) pairs, or a sequence of numpy pairs."""
    pkv = past_key_values
    layers = getattr(pkv, "layers", None)
    if layers is not None and not isinstance(pkv, (list, tuple)):
        pairs = []
        for i, layer in enumerate(layers):
            k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
            if k is None or v is None or (hasattr(k, "numel") and k.numel() == 0):
                raise ValueError(f"cache layer {i} holds no keys/values")
            pairs.append((k, v))
        return pairs
    if hasattr(pkv, "key_cache") and hasattr(pkv, "value_cache"):
        return list(zip(pkv.key_cache, pkv.value_cache))
    if hasattr(pkv, "to_legacy_cache"):
        return [(p[0], p[1]) for p in pkv.to_legacy_cache()]
    if isinstance(pkv, (list, tuple)):
        pairs = []
        for i, item in enumerate(pkv):
            if not isinstance(item, (list, tuple)) or len(item) < 2:
                raise TypeError(f"layer {i}: expected a (key, value) pair, got {type(item).__name__}")
            pairs.append((item[0], item[1]))
        return pairs
    raise TypeError(f"cannot read keys/values from a {type(pkv).__name__}")


def _dtype_name(x: Any) -> str:
    if _is_torch(x):
        return str(x.dtype).replace("torch.", "")
    return np.dtype(x.dtype).name


def save_kv(path: str | os.PathLike, past_key_values: Any, *, model_id: str,
            prefix_hash: str | None = None, tokens: Any = None,
            extra_meta: dict[str, Any] | None = None, block: int = DEFAULT_BLOCK,
            parents: bool = True) -> dict[str, str]:
    """Write a KV slot (see the module doc); returns its metadata.

    `tokens` is the number of cached tokens, or the token ids themselves
    (then, unless `prefix_hash` is given, the metadata names their prefix
    hash: `prefix_hash(tokens, block)`, no seed); either must agree with the
    cache.  `block` is recorded as prefix_block.

    The slot is written with one open/write/close (`write_slot`): its mode
    is 0666 & ~umask like any new file's (0644 under umask 022), so agents
    of other uids can read it as the directory allows; on memosfs it is
    published whole when the file is closed.  With parents=True (the
    default) missing directories on the way (the agent and session
    directories on a mount) are created first, like `mkdir -p`, with mode
    0777 & ~umask; a directory that cannot be created raises that
    OSError, naming it.  Errors name `path` (or that directory), never a
    temporary file.
    """
    pairs = kv_pairs(past_key_values)
    if not pairs:
        raise ValueError("no layers to save")
    k0 = pairs[0][0]
    if len(k0.shape) != 4:
        raise ValueError(f"keys must be [batch, kv_heads, tokens, head_dim], got {tuple(k0.shape)}")
    batch, heads, n, hdim = (int(d) for d in k0.shape)
    dtype = _dtype_name(k0)
    if dtype not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"unsupported dtype {dtype} (float32, float16, bfloat16)")
    torch_mode = _is_torch(k0)
    tensors: dict[str, Any] = {}
    for i, (k, v) in enumerate(pairs):
        for name, t in (("key", k), ("value", v)):
            if tuple(int(d) for d in t.shape) != (batch, heads, n, hdim) or _dtype_name(t) != dtype:
                raise ValueError(f"layer {i} {name}: shape {tuple(t.shape)} {_dtype_name(t)} differs "
                                 f"from layer 0's {(batch, heads, n, hdim)} {dtype}")
            if _is_torch(t) != torch_mode:
                raise TypeError("mix of torch tensors and numpy arrays")
            if torch_mode:
                t = t.detach()
                if t.device.type != "cpu":
                    t = t.cpu()
                t = t.contiguous()
            else:
                t = np.ascontiguousarray(t)
            tensors[f"layers.{i}.{name}"] = t
    if tokens is not None:
        if isinstance(tokens, (int, np.integer)):
            count = int(tokens)
        else:
            count = _n_tokens(tokens)
            if prefix_hash is None:
                prefix_hash = _whole_prefix_hash(tokens, block)
        if count != n:
            raise ValueError(f"tokens says {count} tokens, the cache holds {n}")
    meta = {
        "format": FORMAT, "model": str(model_id), "dtype": dtype, "tokens": str(n),
        "layers": str(len(pairs)), "kv_heads": str(heads), "head_dim": str(hdim),
        "batch": str(batch), "prefix_hash": prefix_hash or "",
        "prefix_block": str(block), "hash": HASH_SCHEME,
    }
    for key, value in (extra_meta or {}).items():
        if key in RESERVED:
            raise ValueError(f"extra_meta may not set the reserved field {key!r}")
        meta[str(key)] = str(value)
    path = os.fspath(path)
    check_path(path)                        # (before a directory is made for it)
    if torch_mode:
        from safetensors.torch import save
    else:
        from safetensors.numpy import save
    data = save(tensors, metadata=meta)
    if parents:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
    _write_slot(path, data)
    return meta


def write_slot(path: str | os.PathLike, data: bytes | memoryview) -> None:
    """Write `data` as the whole file `path` with one open/write/close: the
    file is created with mode 0666 & ~umask (an existing one keeps its mode
    and owner), as any program's files are.  On memosfs the close publishes
    the slot whole, so readers never see a part of it; elsewhere the file is
    written in place.  When a write fails, the name is unlinked before the
    close (a missing slot is a miss; a torn one would not load) and the
    error is raised, naming `path`.  A path below a memosfs mount point with
    nothing mounted on it is refused (NotOnMount, memosfs/client/mounts.py)."""
    path = os.fspath(path)
    check_path(path)
    _write_slot(path, data)


def _write_slot(path: str, data: bytes | memoryview) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        view = memoryview(data).cast("B")
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:done + (1 << 30)])
    except BaseException as e:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.close(fd)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = path
        raise
    try:
        os.close(fd)                        # memosfs publishes here
    except OSError as e:
        if e.filename is None:
            e.filename = path
        raise


def save_prefix(session_dir: str | os.PathLike, past_key_values: Any, tokens: Any, *,
                model_id: str, block: int = DEFAULT_BLOCK, seed: bytes | str = b"",
                extra_meta: dict[str, Any] | None = None) -> tuple[int, str | None]:
    """Save the longest whole-block prefix of a cache under its prefix hash
    in `session_dir` (views of the cache, no copy); (n_tokens, path), or
    (0, None) when the cache holds less than one block.  `tokens` are the
    ids the cache was computed from (at least as many as it holds)."""
    pairs = kv_pairs(past_key_values)
    held = int(pairs[0][0].shape[2])
    hashes = prefix_hashes(tokens, block, seed)
    k = min(len(hashes), held // block)
    if k == 0:
        return 0, None
    n = k * block
    cut = [(kk[:, :, :n, :], vv[:, :, :n, :]) for kk, vv in pairs]
    path = os.path.join(os.fspath(session_dir), hashes[k - 1])
    save_kv(path, cut, model_id=model_id, prefix_hash=hashes[k - 1], tokens=n,
            extra_meta=extra_meta, block=block)
    return n, path


# ------------------------------------------------------------------- loading

def read_header(path: str | os.PathLike) -> tuple[dict[str, str], dict[str, dict]]:
    """(metadata, {tensor name: {dtype, shape, data_offsets}}) of a
    safetensors file, reading only its header."""
    try:
        f = open(path, "rb")
    except OSError:
        check_path(path)                    # (NotOnMount says why, if it can)
        raise
    with f:
        raw = f.read(8)
        if len(raw) < 8:
            raise KVFormatError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (hlen,) = struct.unpack("<Q", raw)
        if hlen > 100 << 20:
            raise KVFormatError(f"{path}: not a safetensors file (header length {hlen})")
        try:
            header = json.loads(f.read(hlen))
        except ValueError as e:
            raise KVFormatError(f"{path}: not a safetensors file ({e})") from None
    meta = header.pop("__metadata__", None) or {}
    return meta, header


def model_expectation(model: Any, model_id: str | None = None) -> dict[str, str]:
    """The metadata a slot must carry to load into `model` (a transformers
    model, its config, or a dict of expected fields)."""
    if model is None:
        exp: dict[str, str] = {}
    elif isinstance(model, dict):
        exp = {k: str(v) for k, v in model.items()}
    else:
        cfg = getattr(model, "config", model)
        if hasattr(cfg, "get_text_config"):
            cfg = cfg.get_text_config(decoder=True) if "decoder" in inspect.signature(
                cfg.get_text_config).parameters else cfg.get_text_config()
        heads = getattr(cfg, "num_attention_heads", None)
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        hdim = getattr(cfg, "head_dim", None) or (cfg.hidden_size // heads if heads else None)
        exp = {"layers": str(cfg.num_hidden_layers)}
        if kv_heads:
            exp["kv_heads"] = str(kv_heads)
        if hdim:
            exp["head_dim"] = str(hdim)
        dtype = getattr(model, "dtype", None)
        if dtype is not None and hasattr(model, "config"):
            exp["dtype"] = str(dtype).replace("torch.", "")
        name = getattr(cfg, "name_or_path", None) or getattr(
            getattr(model, "config", None), "name_or_path", None)
        if name:
            exp["model"] = str(name)
    if model_id is not None:
        exp["model"] = model_id
    return exp


def check_kv(path: str | os.PathLike, model: Any = None, *, model_id: str | None = None,
             tokens: int | None = None, prefix_hash: str | None = None
             ) -> tuple[dict[str, str], dict[str, dict]]:
    """Check a slot's header against the model and the expectations without
    loading tensors; returns (metadata, tensor table).  Raises KVFormatError
    for a file that is not a consistent memosfs KV slot, KVMismatch when it
    is one for something else."""
    path = os.fspath(path)
    check_path(path)
    meta, table = read_header(path)
    if meta.get("format") != FORMAT:
        raise KVFormatError(f"{path}: not a memosfs KV slot (format {meta.get('format')!r}, "
                            f"expected {FORMAT!r})")
    try:
        L, B, H, N, D = (int(meta[k]) for k in ("layers", "batch", "kv_heads", "tokens", "head_dim"))
    except (KeyError, ValueError) as e:
        raise KVFormatError(f"{path}: bad or missing metadata field {e}") from None
    shape = [B, H, N, D]
    for i in range(L):
        for name in ("key", "value"):
            t = table.get(f"layers.{i}.{name}")
            if t is None:
                raise KVFormatError(f"{path}: tensor layers.{i}.{name} is missing")
            if t.get("shape") != shape or _ST_DTYPES.get(t.get("dtype")) != meta.get("dtype"):
                raise KVFormatError(
                    f"{path}: layers.{i}.{name} is {t.get('dtype')} {t.get('shape')}, the metadata "
                    f"says {meta.get('dtype')} {shape}")
    exp = model_expectation(model, model_id)
    if tokens is not None:
        exp["tokens"] = str(tokens)
    if prefix_hash is not None:
        exp["prefix_hash"] = prefix_hash
    bad = [(f, e, meta.get(f)) for f, e in exp.items() if meta.get(f) != e]
    if bad:
        raise KVMismatch(path, bad)
    return meta, table


def _np_views(path: str, meta: dict[str, str], table: dict[str, dict]) -> list[tuple[Any, Any]]:
    dt = _NP_DTYPES.get(meta["dtype"])
    if dt is None:
        raise KVFormatError(f"{path}: a {meta['dtype']} slot cannot load as numpy "
                            "(use as_='tuple' or 'dynamic')")
    with open(path, "rb") as f:
        hlen = struct.unpack("<Q", f.read(8))[0]
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    base = 8 + hlen
    out = []
    for i in range(int(meta["layers"])):
        pair = []
        for name in ("key", "value"):
            t = table[f"layers.{i}.{name}"]
            start, end = t["data_offsets"]
            a = np.frombuffer(mm, dtype=dt, count=(end - start) // np.dtype(dt).itemsize,
                              offset=base + start).reshape(t["shape"])
            pair.append(a)
        out.append((pair[0], pair[1]))
    return out


def _torch_pairs(path: str, meta: dict[str, str], device: str) -> list[tuple[Any, Any]]:
    from safetensors import safe_open
    out = []
    with safe_open(path, framework="pt", device=str(device)) as f:
        for i in range(int(meta["layers"])):
            out.append((f.get_tensor(f"layers.{i}.key"), f.get_tensor(f"layers.{i}.value")))
    return out


def to_dynamic_cache(pairs: Sequence[tuple[Any, Any]], config: Any = None) -> Any:
    """A transformers DynamicCache holding these tensors (without a copy
    where the installed version allows)."""
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=config) if config is not None else DynamicCache()
    except TypeError:                                   # older transformers: no config
        cache = DynamicCache()
    for i, (k, v) in enumerate(pairs):
        layers = getattr(cache, "layers", None)
        layer = layers[i] if layers is not None and i < len(layers) else None
        if layer is not None and type(layer).__name__ == "DynamicLayer" \
                and hasattr(layer, "lazy_initialization"):
            layer.lazy_initialization(k, v)
            layer.keys, layer.values = k, v
        else:
            cache.update(k, v, i)
    return cache


def load_kv(path: str | os.PathLike, *, model: Any = None, model_id: str | None = None,
            tokens: int | None = None, prefix_hash: str | None = None,
            device: str = "cpu", as_: str = "dynamic") -> Any:
    """Load a KV slot, checked against `model` (a transformers model or
    config: layers, kv_heads, head_dim, dtype, model id = its
    config.name_or_path unless `model_id` is given; or a dict of expected
    metadata fields) and the optional expected `tokens` / `prefix_hash`.

    as_="dynamic": a transformers DynamicCache ready to continue generation;
    "tuple": ((k, v), ...) torch tensors; "numpy": [(k, v), ...] read-only
    numpy arrays (no torch needed).  The tensors map the file; keep it (and
    on memosfs the version you opened) for as long as they are used.
    """
    path = os.fspath(path)
    meta, table = check_kv(path, model, model_id=model_id, tokens=tokens, prefix_hash=prefix_hash)
    if as_ == "numpy":
        return _np_views(path, meta, table)
    if as_ not in ("dynamic", "tuple"):
        raise ValueError(f"as_ must be 'dynamic', 'tuple' or 'numpy', not {as_!r}")
    pairs = _torch_pairs(path, meta, device)
    if as_ == "tuple":
        return tuple(pairs)
    config = getattr(model, "config", None) if model is not None and not isinstance(model, dict) \
        else None
    return to_dynamic_cache(pairs, config)


def read_meta(path: str | os.PathLike) -> dict[str, str]:
    """A slot's `__metadata__` (header only)."""
    return read_header(path)[0]


# -------------------------------------------------- running a model on a cache

def _cache_kwarg(model: Any) -> str:
    """transformers 5 renamed forward's past_key_values to cache."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def forward(model: Any, input_ids: Any, cache: Any = None) -> tuple[Any, Any]:
    """(logits, cache) of one forward pass of `input_ids` ([1, n]) after the
    tokens already in `cache` (a fresh DynamicCache when None)."""
    if cache is None:
        cache = to_dynamic_cache([], getattr(model, "config", None))
    out = model(input_ids=input_ids, use_cache=True, **{_cache_kwarg(model): cache})
    new = getattr(out, "cache", None)
    if new is None:
        new = getattr(out, "past_key_values", None)
    return out.logits, new if new is not None else cache


def prefill(model: Any, input_ids: Any, chunk: int = 512, cache: Any = None) -> tuple[Any, Any]:
    """Run `input_ids` ([1, n]) through the model in chunks of `chunk`
    tokens; (logits of the last chunk, cache).  Recomputing a prefix with the
    same chunking gives bit-identical keys/values."""
    import torch

    logits = None
    with torch.inference_mode():
        for s in range(0, input_ids.shape[1], chunk):
            logits, cache = forward(model, input_ids[:, s:s + chunk], cache)
    return logits, cache

