"""A vLLM KV connector that keeps KV blocks as memosfs slots, shared by engines and agents.

Load it with vLLM's `kv_connector_module_path` (vLLM 0.32, the V1 connector API):

    from vllm import LLM
    from vllm.config import KVTransferConfig
    llm = LLM(model=..., kv_transfer_config=KVTransferConfig(
        kv_connector="MemosConnector", kv_role="kv_both",
        kv_connector_module_path="memosfs.client.vllm",
        kv_connector_extra_config={"path": "/mnt/memos/agent/session",
                                   "model_id": "HuggingFaceTB/SmolLM2-135M-Instruct"}))

(`--kv-transfer-config '{"kv_connector":"MemosConnector","kv_role":"kv_both",
"kv_connector_module_path":"memosfs.client.vllm","kv_connector_extra_config":{...}}'`
for `vllm serve`.)  kv_connector_extra_config:

    path          the directory the slots live in: a session on the mount (made if absent)
    model_id      the model's name recorded in and checked against every slot
                  (default: vLLM's served model name)
    block_tokens  tokens per slot (default 512, memosfs.kv's DEFAULT_BLOCK); a multiple
                  of vLLM's block_size (128 on CPU)
    seed          the prefix-hash seed (default "", as memosfs.kv's default)
    save          "async" (default: slots are written by a background thread after the
                  forward pass) or "sync" (written in wait_for_save, before the step ends)

The slots.  The prompt is cut into blocks of block_tokens tokens; block i is stored
as one slot named h_i, the chained prefix hash of the first i blocks
(memosfs.client.kv.prefix_hashes, sha256-chain/int32le): a memosfs KV slot
(format memosfs-kv/1) holding, for every layer, `layers.<l>.key` and
`layers.<l>.value` as [1, kv_heads, block_tokens, head_dim] (transformers' layout)
for that block's tokens only, with the metadata fields of memosfs.kv plus
`start` (the block's first token) and `producer`.  A request reuses the longest
chain h_1..h_k present, even when its tail differs; two engines on the same
directory share blocks; a slot written by `memosfs.kv.save_prefix` (one slot for
the whole prefix, start 0) is reused as well.  `load_prefix` below is the agent's
side: it loads the longest chain into a transformers DynamicCache.

Model identity.  Every slot's metadata (model, layers, kv_heads, head_dim, dtype)
is checked before it is used; a slot of another model is refused: the engine
logs an error naming the slot and the field, recomputes instead, and does not
overwrite it (`STATS["refused"]` counts them); `load_prefix` raises
memosfs.client.kv.KVMismatch.

Layouts.  vLLM's CPU attention backend (CPU_ATTN, its "vec" kernels: fp32/fp16, or
bf16 without AMX) keeps each layer's paged cache as [num_pages, kv_heads,
page_tokens, 2 * head_size]; within each (page, head) tile the first
page_tokens * head_size numbers are the keys transposed, [head_size, page_tokens],
and the next ones the values, [page_tokens, head_size].  Keys are stored after
RoPE, as transformers' cache holds them.  Another shape is refused when the caches
are registered, and another kernel family (AMX's bf16 tiles, vec16) when the first
layer is seen: the connector then logs why and stays off (no loads, no saves).

This module imports without vLLM (the connector class is built on first use), so
agents use `load_prefix` from the project's own environment.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from memosfs.client import kv
from memosfs.client.mounts import check_path

log = logging.getLogger("memosfs.vllm")

DEFAULT_BLOCK = kv.DEFAULT_BLOCK
PRODUCER = "vllm"

# Counters of this process's connectors (scheduler and worker sides share them when
# vLLM runs in one process, VLLM_ENABLE_V1_MULTIPROCESSING=0).
STATS: dict[str, Any] = {}
# Set (with "reason") when the worker finds a paged layout it cannot map; the
# scheduler then matches nothing (one process: VLLM_ENABLE_V1_MULTIPROCESSING=0).
DISABLED: dict[str, str] = {}


def reset_stats() -> None:
    STATS.clear()
    STATS.update(requests=0, matched_tokens=0, last_matched_tokens=0, loads=0,
                 load_bytes=0, load_s=0.0, saves=0, save_bytes=0, save_s=0.0,
                 save_skipped=0, refused=0, errors=0, matched_by_request={})


reset_stats()


# ------------------------------------------------------------------ the chain

@dataclass
class Piece:
    """One slot of a chain: covers tokens [start, start + tokens)."""
    path: str
    name: str
    start: int
    tokens: int


def _meta_int(meta: dict[str, str], key: str, default: int | None = None) -> int | None:
    try:
        return int(meta[key])
    except (KeyError, ValueError):
        return default


def plan_chain(session_dir: str | os.PathLike, tokens: Any, *, block: int = DEFAULT_BLOCK,
               seed: bytes | str = b"", expect: dict[str, str] | None = None,
               headers: dict[str, dict[str, str]] | None = None
               ) -> tuple[int, list[Piece], list[tuple[str, str]]]:
    """(covered tokens, pieces, refused) for the longest prefix of `tokens` that the
    slots in `session_dir` hold: per-block slots h_1..h_k (start = (i-1)*block) and
    whole-prefix slots (start 0, as memosfs.kv.save_prefix writes), from one
    directory listing and the headers of the slots present.  `expect` are the
    metadata fields a slot must carry (model identity); a slot that contradicts them
    is left out and listed in `refused` as (name, reason).  `headers` caches headers
    by slot name (names are content hashes)."""
    hashes = kv.prefix_hashes(tokens, block, seed)
    check_path(session_dir)
    try:
        present = set(os.listdir(session_dir))
    except (FileNotFoundError, NotADirectoryError):
        return 0, [], []
    covered, pieces, refused = 0, [], []
    for i, h in enumerate(hashes, start=1):
        if h not in present:
            continue
        path = os.path.join(os.fspath(session_dir), h)
        meta = headers.get(h) if headers is not None else None
        if meta is None:
            try:
                meta = kv.read_header(path)[0]
            except (OSError, kv.KVFormatError) as e:
                refused.append((h, f"unreadable: {e}"))
                continue
            if headers is not None:
                headers[h] = meta
        if meta.get("format") != kv.FORMAT:
            refused.append((h, f"not a memosfs KV slot (format {meta.get('format')!r})"))
            continue
        bad = [(f, e, meta.get(f)) for f, e in (expect or {}).items() if meta.get(f) != e]
        if bad:
            refused.append((h, "; ".join(f"{f}: expected {e!r}, found {v!r}"
                                         for f, e, v in bad)))
            continue
        n, start = _meta_int(meta, "tokens"), _meta_int(meta, "start", 0)
        if meta.get("prefix_hash") not in ("", h):
            refused.append((h, f"its prefix_hash is {meta.get('prefix_hash')!r}"))
            continue
        if start == 0 and n == i * block:                   # a whole prefix
            covered, pieces = n, [Piece(path, h, 0, n)]
        elif start == (i - 1) * block and n == block and covered == start:
            covered = i * block
            pieces.append(Piece(path, h, start, block))
    return covered, pieces, refused


def load_prefix(session_dir: str | os.PathLike, tokens: Any, *, model: Any = None,
                model_id: str | None = None, block: int = DEFAULT_BLOCK,
                seed: bytes | str = b"", as_: str = "dynamic") -> tuple[int, Any]:
    """The agent's side: (n_tokens, cache) for the longest cached prefix of `tokens`
    that a vLLM engine (or memosfs.kv.save_prefix) stored in `session_dir`, checked
    against `model` (a transformers model: layers, kv_heads, head_dim, dtype and
    model id, as memosfs.kv.load_kv checks) and concatenated from its block slots;
    (0, None) when nothing is cached.  as_="dynamic" (a transformers DynamicCache)
    or "tuple" (((k, v), ...) torch tensors [1, kv_heads, n, head_dim]).  A slot of
    another model raises memosfs.client.kv.KVMismatch."""
    import torch

    expect = kv.model_expectation(model, model_id)
    covered, pieces, refused = plan_chain(session_dir, tokens, block=block, seed=seed)
    # plan_chain without `expect` keeps the chain whole; check every piece now so a
    # mismatch is an error for the agent, not a silent miss.
    for p in pieces:
        meta = kv.read_header(p.path)[0]
        bad = [(f, e, meta.get(f)) for f, e in expect.items() if meta.get(f) != e]
        if bad:
            raise kv.KVMismatch(p.path, bad)
    if not pieces:
        return 0, None
    parts = [kv.load_kv(p.path, as_="tuple", tokens=p.tokens, prefix_hash=p.name)
             for p in pieces]
    pairs = []
    for layer in range(len(parts[0])):
        k = torch.cat([part[layer][0] for part in parts], dim=2)
        v = torch.cat([part[layer][1] for part in parts], dim=2)
        pairs.append((k, v))
    if as_ == "tuple":
        return covered, tuple(pairs)
    config = getattr(model, "config", None) if model is not None and not isinstance(model, dict) \
        else None
    return covered, kv.to_dynamic_cache(pairs, config)


# --------------------------------------------------------- the paged layout

def page_view(kv_layer: Any, block_size: int, kv_heads: int, head_dim: int) -> Any:
    """A layer's paged cache as [num_pages, kv_heads, 2 * block_size, head_dim]
    (keys in rows :block_size, values after them), a view of the CPU backend's
    [num_pages, kv_heads, block_size, 2 * head_dim]; ValueError for another layout."""
    shape = tuple(kv_layer.shape)
    if len(shape) == 4 and shape[1:] == (kv_heads, block_size, 2 * head_dim) \
            and kv_layer.is_contiguous():
        return kv_layer.view(shape[0], kv_heads, 2 * block_size, head_dim)
    raise ValueError(
        f"memosfs.client.vllm: unsupported paged KV layout {shape} (stride "
        f"{tuple(kv_layer.stride())}); expected the CPU backend's contiguous "
        f"[pages, {kv_heads}, {block_size}, {2 * head_dim}]")


SUPPORTED_ISA = ("vec",)


def _to_pages(view: Any, pages: list[int], k: Any, v: Any, P: int) -> None:
    """Write keys and values [H, n, D] (n = len(pages) * P) into the pages of a
    page_view (keys transposed, module doc), one page and head at a time: copies
    small enough that torch runs them on the calling thread (no thread pool of its
    own beside the engine's)."""
    D = view.shape[-1]
    for j, pg in enumerate(pages):
        for h in range(view.shape[1]):
            view[pg, h, :P].view(D, P).copy_(k[h, j * P:(j + 1) * P].t())
            view[pg, h, P:].copy_(v[h, j * P:(j + 1) * P])


def _pages_to_kv(g: Any, P: int) -> tuple[Any, Any]:
    """Copied pages [n_pages, H, 2P, D] (numpy or torch) -> keys, values
    [1, H, n_pages * P, D] in transformers' layout."""
    n, H, _, D = g.shape
    k = g[:, :, :P, :].reshape(n, H, D, P)                  # K^T per tile
    if hasattr(k, "permute"):
        k = k.permute(1, 0, 3, 2)
        v = g[:, :, P:, :].permute(1, 0, 2, 3)
    else:
        k = k.transpose(1, 0, 3, 2)
        v = g[:, :, P:, :].transpose(1, 0, 2, 3)
    return k.reshape(1, H, n * P, D), v.reshape(1, H, n * P, D)


def _from_pages(view: Any, pages: list[int]) -> Any:
    """A copy of the given pages of a page_view: [len(pages), H, 2P, D]."""
    import torch

    out = torch.empty((len(pages),) + tuple(view.shape[1:]), dtype=view.dtype)
    for j, pg in enumerate(pages):
        for h in range(view.shape[1]):
            out[j, h].copy_(view[pg, h])
    return out


def layer_index(name: str) -> int:
    """model.layers.7.self_attn.attn -> 7"""
    m = re.search(r"(?:^|\.)layers\.(\d+)\.", name)
    if not m:
        raise ValueError(f"memosfs.client.vllm: cannot tell the layer number of {name!r}")
    return int(m.group(1))


# ------------------------------------------------------------ the writer

class _Writer:
    """One background thread that writes slots in order; flush() waits for it."""

    def __init__(self) -> None:
        self.q: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._run, name="memosfs-kv-writer", daemon=True)
        self.thread.start()
        atexit.register(self.flush)

    def _run(self) -> None:
        while True:
            job = self.q.get()
            try:
                job()
            except Exception:                              # logged, the engine goes on
                STATS["errors"] += 1
                log.exception("memosfs: saving a KV slot failed")
            finally:
                self.q.task_done()

    def submit(self, job) -> None:
        self.q.put(job)

    def flush(self) -> None:
        self.q.join()


# -------------------------------------------------------- the connector

@dataclass
class LoadSpec:
    req_id: str
    block_ids: list[int]
    start: int                  # first token to load (what vLLM had already computed)
    end: int                    # one past the last
    pieces: list[Piece]


@dataclass
class SaveSpec:
    req_id: str
    name: str                   # prefix hash of the block
    start: int
    block_ids: list[int]        # vLLM pages of tokens [start, start + block_tokens)


@dataclass
class _ReqState:
    tokens: list[int]
    hashes: list[str]
    block_ids: list[int] = field(default_factory=list)
    saved: set = field(default_factory=set)          # block indexes saved or present


def _build_class():
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)

    @dataclass
    class MemosConnectorMetadata(KVConnectorMetadata):
        loads: list[LoadSpec] = field(default_factory=list)
        saves: list[SaveSpec] = field(default_factory=list)

    # module-level names, so the metadata pickles between vLLM's processes
    MemosConnectorMetadata.__qualname__ = "MemosConnectorMetadata"
    MemosConnectorMetadata.__module__ = __name__
    globals()["MemosConnectorMetadata"] = MemosConnectorMetadata

    class MemosConnector(KVConnectorBase_V1):
        """KV blocks as memosfs slots named by chained prefix hashes (module doc)."""

        def __init__(self, vllm_config, role, kv_cache_config=None):
            super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
            cfg = self._kv_transfer_config
            mc = vllm_config.model_config
            self.path = cfg.get_from_extra_config("path", None)
            if not self.path:
                raise ValueError("memosfs.client.vllm: kv_connector_extra_config needs "
                                 "\"path\" (a session directory on the mount)")
            self.page = vllm_config.cache_config.block_size
            self.block = int(cfg.get_from_extra_config("block_tokens", DEFAULT_BLOCK))
            if self.block <= 0 or self.block % self.page:
                raise ValueError(f"memosfs.client.vllm: block_tokens={self.block} must be a "
                                 f"multiple of vLLM's block_size {self.page}")
            self.seed = str(cfg.get_from_extra_config("seed", ""))
            self.save_mode = str(cfg.get_from_extra_config("save", "async"))
            if self.save_mode not in ("async", "sync"):
                raise ValueError("memosfs.client.vllm: save is \"async\" or \"sync\"")
            cache_dtype = getattr(vllm_config.cache_config, "cache_dtype", "auto")
            if cache_dtype != "auto":
                raise ValueError(f"memosfs.client.vllm: kv_cache_dtype={cache_dtype} is not "
                                 "supported (slots hold the model's dtype)")
            served = mc.served_model_name
            if isinstance(served, (list, tuple)):
                served = served[0]
            self.model_id = str(cfg.get_from_extra_config("model_id", None) or served or mc.model)
            self.kv_heads = mc.get_total_num_kv_heads()
            self.head_dim = mc.get_head_size()
            self.layers = mc.get_num_layers(vllm_config.parallel_config)
            self.dtype = str(mc.dtype).replace("torch.", "")
            self.expect = {"model": self.model_id, "layers": str(self.layers),
                           "kv_heads": str(self.kv_heads), "head_dim": str(self.head_dim),
                           "dtype": self.dtype}
            check_path(self.path)               # (NotOnMount: the mount is not there)
            os.makedirs(self.path, exist_ok=True)
            # scheduler side
            self._headers: dict[str, dict[str, str]] = {}
            self._reqs: dict[str, _ReqState] = {}
            self._pending_loads: dict[str, tuple[int, int, list[Piece]]] = {}
            self._plans: dict[str, tuple[int, list[Piece]]] = {}
            self._refused_logged: set[str] = set()
            # worker side
            self._kv: dict[int, Any] = {}
            self._gathered: dict[tuple[str, str], dict[int, Any]] = {}
            self._writer: _Writer | None = None
            self._load_errors: set[int] = set()
            self._isa: str | None = None
            log.info("memosfs connector: %s, %d-token slots, model %s", self.path,
                     self.block, self.model_id)

        # ---------------------------------------------------- scheduler side

        def _plan(self, tokens: list[int]) -> tuple[int, list[Piece]]:
            covered, pieces, refused = plan_chain(self.path, tokens, block=self.block,
                                                  seed=self.seed, expect=self.expect,
                                                  headers=self._headers)
            for name, why in refused:
                if name not in self._refused_logged:
                    self._refused_logged.add(name)
                    STATS["refused"] += 1
                    log.error("memosfs: refused KV slot %s: %s (this engine: %s); "
                              "recomputing, the slot is left as it is",
                              os.path.join(self.path, name), why, self.expect)
            return covered, pieces

        def get_num_new_matched_tokens(self, request, num_computed_tokens):
            tokens = list(request.prompt_token_ids or [])
            if len(tokens) < 2 or getattr(request, "mm_features", None) or DISABLED:
                return 0, False
            covered, pieces = self._plan(tokens)
            # vLLM computes at least the last prompt token; loads end on a page boundary.
            end = min(covered, len(tokens) - 1) // self.page * self.page
            self._plans[request.request_id] = (end, pieces)
            return max(0, end - num_computed_tokens), False

        def update_state_after_alloc(self, request, blocks, num_external_tokens):
            rid = request.request_id
            tokens = list(request.prompt_token_ids or [])
            state = self._reqs.get(rid)
            if state is None:
                state = self._reqs[rid] = _ReqState(
                    tokens, kv.prefix_hashes(tokens, self.block, self.seed))
            end, pieces = self._plans.pop(rid, (0, []))
            matched = 0
            if num_external_tokens > 0:
                start = end - num_external_tokens
                self._pending_loads[rid] = (start, end, pieces)
                matched = end
                for i in range(end // self.block):
                    state.saved.add(i)
            STATS["requests"] += 1
            STATS["matched_tokens"] += matched
            STATS["last_matched_tokens"] = matched
            STATS["matched_by_request"][rid] = matched

        def build_connector_meta(self, scheduler_output):
            meta = MemosConnectorMetadata()
            steps = []
            for new in scheduler_output.scheduled_new_reqs:
                state = self._reqs.get(new.req_id)
                if state is None:
                    tokens = list(new.prompt_token_ids or [])
                    state = self._reqs[new.req_id] = _ReqState(
                        tokens, kv.prefix_hashes(tokens, self.block, self.seed))
                state.block_ids = list(new.block_ids[0])
                pend = self._pending_loads.pop(new.req_id, None)
                if pend is not None:
                    start, end, pieces = pend
                    meta.loads.append(LoadSpec(new.req_id, list(state.block_ids), start, end,
                                               pieces))
                steps.append((new.req_id, new.num_computed_tokens))
            cached = scheduler_output.scheduled_cached_reqs
            for i, rid in enumerate(cached.req_ids):
                state = self._reqs.get(rid)
                if state is None:
                    continue
                new_ids = cached.new_block_ids[i]
                if new_ids is not None:
                    if rid in cached.resumed_req_ids:
                        state.block_ids = list(new_ids[0])
                    else:
                        state.block_ids.extend(new_ids[0])
                steps.append((rid, cached.num_computed_tokens[i]))
            present = None
            for rid, computed in steps:
                state = self._reqs[rid]
                done = computed + scheduler_output.num_scheduled_tokens.get(rid, 0)
                full = min(done, len(state.tokens)) // self.block
                for b in range(full):
                    if b in state.saved:
                        continue
                    state.saved.add(b)
                    if present is None:
                        try:
                            present = set(os.listdir(self.path))
                        except OSError:
                            present = set()
                    name = state.hashes[b]
                    if name in present:
                        STATS["save_skipped"] += 1
                        continue
                    first = b * self.block // self.page
                    pages = state.block_ids[first:first + self.block // self.page]
                    if len(pages) < self.block // self.page:
                        continue                   # not allocated (cannot happen once computed)
                    meta.saves.append(SaveSpec(rid, name, b * self.block, list(pages)))
            return meta

        def request_finished(self, request, block_ids):
            self._reqs.pop(request.request_id, None)
            self._plans.pop(request.request_id, None)
            self._pending_loads.pop(request.request_id, None)
            return False, None

        # ------------------------------------------------------- worker side

        def register_kv_caches(self, kv_caches):
            for name, t in kv_caches.items():
                self._kv[layer_index(name)] = page_view(t, self.page, self.kv_heads,
                                                        self.head_dim)
            if sorted(self._kv) != list(range(self.layers)):
                raise ValueError(f"memosfs.client.vllm: expected {self.layers} attention "
                                 f"layers, vLLM registered {sorted(self._kv)}")

        def _views(self, forward_context):
            if self._kv:
                return self._kv
            for name, layer in forward_context.no_compile_layers.items():
                t = getattr(layer, "kv_cache", None)
                if isinstance(t, torch.Tensor) and t.numel():
                    self._kv[layer_index(name)] = page_view(t, self.page, self.kv_heads,
                                                            self.head_dim)
            return self._kv

        def _layout_ok(self, forward_context) -> bool:
            """The attention kernels' family, checked once (module doc)."""
            if self._isa is None:
                isas = {getattr(layer, "isa", None)
                        for layer in forward_context.no_compile_layers.values()
                        if getattr(layer, "kv_cache", None) is not None}
                isas.discard(None)
                self._isa = ",".join(sorted(isas)) or "unknown"
                if self._isa not in SUPPORTED_ISA:
                    DISABLED["reason"] = (
                        f"vLLM's CPU attention uses the {self._isa!r} kernels, whose paged "
                        f"layout memosfs.client.vllm does not map (it maps {SUPPORTED_ISA})")
                    log.error("memosfs: connector off: %s; nothing is loaded or saved",
                              DISABLED["reason"])
            return self._isa in SUPPORTED_ISA

        def start_load_kv(self, forward_context, **kwargs):
            meta = self._get_connector_metadata()
            if not isinstance(meta, MemosConnectorMetadata):
                return
            P = self.page
            if not self._layout_ok(forward_context):
                for spec in meta.loads:                       # vLLM recomputes them
                    self._load_errors.update(spec.block_ids[spec.start // P:spec.end // P])
                return
            if not meta.loads:
                return
            views = self._views(forward_context)
            for spec in meta.loads:
                t0 = time.perf_counter()
                try:
                    nbytes = self._load(spec, views)
                except Exception as e:                      # evicted, unreadable: recompute
                    STATS["errors"] += 1
                    self._load_errors.update(spec.block_ids[spec.start // P:spec.end // P])
                    log.error("memosfs: loading %d tokens of %s failed (%s: %s); vLLM "
                              "recomputes them", spec.end - spec.start, spec.req_id,
                              type(e).__name__, e)
                    continue
                dt = time.perf_counter() - t0
                STATS["loads"] += 1
                STATS["load_bytes"] += nbytes
                STATS["load_s"] += dt
                log.info("memosfs: loaded %d tokens of %s in %.1f ms", spec.end - spec.start,
                         spec.req_id, dt * 1e3)

        def get_block_ids_with_load_errors(self):
            out, self._load_errors = self._load_errors, set()
            return out

        def _load(self, spec, views):
            from safetensors import safe_open
            P = self.page
            nbytes = 0
            for piece in spec.pieces:
                lo = max(spec.start, piece.start)
                hi = min(spec.end, piece.start + piece.tokens)
                if hi <= lo:
                    continue
                # lo and hi are page aligned (starts are multiples of block_tokens)
                pages = spec.block_ids[lo // P:hi // P]
                a = lo - piece.start
                with safe_open(piece.path, framework="pt") as f:
                    for li, view in views.items():
                        k = f.get_slice(f"layers.{li}.key")[:, :, a:a + hi - lo, :]
                        v = f.get_slice(f"layers.{li}.value")[:, :, a:a + hi - lo, :]
                        nbytes += k.numel() * k.element_size() * 2
                        _to_pages(view, pages, k[0].to(view.dtype), v[0].to(view.dtype), P)
            return nbytes

        def wait_for_layer_load(self, layer_name):
            return

        def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
            meta = self._get_connector_metadata()
            if not isinstance(meta, MemosConnectorMetadata) or not meta.saves \
                    or self._isa not in SUPPORTED_ISA:
                return
            li = layer_index(layer_name)
            view = self._kv.get(li)
            if view is None:
                view = self._kv[li] = page_view(kv_layer, self.page, self.kv_heads,
                                                self.head_dim)
            for spec in meta.saves:
                # a copy: the pages may be reused once the step is over
                self._gathered.setdefault((spec.req_id, spec.name), {})[li] = \
                    _from_pages(view, spec.block_ids)

        def wait_for_save(self):
            meta = self._get_connector_metadata()
            if not isinstance(meta, MemosConnectorMetadata) or not meta.saves \
                    or self._isa not in SUPPORTED_ISA:
                return
            if self._writer is None and self.save_mode == "async":
                self._writer = _Writer()
            for spec in meta.saves:
                got = self._gathered.pop((spec.req_id, spec.name), None)
                if not got or len(got) != self.layers:
                    log.error("memosfs: block %s of %s: %d of %d layers captured; not saved",
                              spec.name, spec.req_id, len(got or {}), self.layers)
                    STATS["errors"] += 1
                    continue
                job = self._save_job(spec, got)
                if self._writer is not None:
                    self._writer.submit(job)
                else:
                    job()

        def _save_job(self, spec, got):
            P, B = self.page, self.block

            def job():
                t0 = time.perf_counter()
                pairs = []
                for li in range(self.layers):
                    g = got[li]                                      # [pages, H, 2P, D]
                    if g.dtype in (torch.float32, torch.float16):
                        g = g.numpy()               # numpy: no thread pool beside vLLM's
                    pairs.append(_pages_to_kv(g, P))
                path = os.path.join(self.path, spec.name)
                kv.save_kv(path, pairs, model_id=self.model_id, prefix_hash=spec.name,
                           tokens=B, block=B,
                           extra_meta={"start": spec.start, "producer": PRODUCER,
                                       "page_tokens": P})
                dt = time.perf_counter() - t0
                STATS["saves"] += 1
                STATS["save_bytes"] += sum(int(k.nbytes) * 2 for k, _ in pairs)
                STATS["save_s"] += dt
            return job

        def flush(self):
            """Wait until every slot submitted so far is written."""
            if self._writer is not None:
                self._writer.flush()

        def shutdown(self):
            self.flush()

    MemosConnector.__qualname__ = "MemosConnector"
    MemosConnector.__module__ = __name__
    MemosConnector.Metadata = MemosConnectorMetadata
    return MemosConnector


_CLASS = None


def __getattr__(name: str):
    """MemosConnector (and its metadata class) are built on first use: importing
    this module needs no vLLM."""
    global _CLASS
    if name in ("MemosConnector", "MemosConnectorMetadata"):
        if _CLASS is None:
            _CLASS = _build_class()
            globals()["MemosConnector"] = _CLASS
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
