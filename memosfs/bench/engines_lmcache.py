"""LMCache's storage engine against the mount: `local_disk` and `fs://` at a session.

LMCache (0.5.6) keeps KV chunks (256 tokens each, named by the chained hash
of their tokens) in a storage backend given by its config:

    local_disk: "file://MNT/agent/session/"     max_local_disk_size: 1  (GB)
    remote_url: "fs://host:0/MNT/agent/session"  remote_serde: naive

Its vLLM integration cannot run on this CPU machine (see
`vllm_integration_error()`), so the engine here is LMCache's own
`LMCacheEngine` with a small CPU connector (`CPUConnector`: the KV of the
"serving engine" is one CPU tensor [2, layers, tokens, hidden]): store()
cuts it into chunks and puts them to the backend; retrieve() in another
process (PYTHONHASHSEED fixed: LMCache's chunk hashes use Python's hash())
gets them back into a zeroed tensor, and every chunk's SHA-256 is compared.

`local_disk` keeps its index in memory (a dict filled by puts), so a new
LMCache process finds nothing there on any filesystem; `fs://` looks a chunk
up by its file name, so on memosfs the files are the index: a new process,
and one after the daemon's unmount and mount of the same SSD folder, get every
chunk back.

`bench_lmcache()` returns a dict: store (save) and retrieve (load) seconds and
bytes for fs:// on tmpfs, the local disk and memosfs, plus local_disk on
memosfs; tokens_identical (every retrieved chunk's checksum matched).  There is
no TTFT column: no LMCache-integrated engine runs on CPU here.

May call: memosfs.testing (the daemon).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

from memosfs.bench.common import engine_places, run_json_child

ROOT = Path(__file__).resolve().parents[2]
INSTALL_HINT = "make engines-llama"
# SmolLM2-135M's KV geometry: 30 layers, 3 KV heads of 64.
LAYERS, KV_HEADS, HEAD_DIM = 30, 3, 64
CHUNK = 256
HASHSEED = "0"


def missing() -> Optional[str]:
    """Why LMCache cannot run here (None: it can)."""
    try:
        import lmcache  # noqa: F401
        from lmcache.v1.cache_engine import LMCacheEngineBuilder  # noqa: F401
    except Exception as e:
        return f"lmcache is not installed ({e.__class__.__name__}: {e}): {INSTALL_HINT}"
    return None


def config_for(backend: str, folder: str | os.PathLike) -> dict[str, Any]:
    """The LMCache config (as a user writes it in YAML) for `backend` at `folder`."""
    folder = str(folder).rstrip("/")
    base = {"chunk_size": CHUNK, "local_cpu": False, "max_local_cpu_size": 1.0,
            "lmcache_instance_id": "memosfs-bench"}
    if backend == "local_disk":
        return dict(base, local_disk=f"file://{folder}/", max_local_disk_size=1.0)
    if backend == "fs":
        return dict(base, remote_url=f"fs://host:0{folder}", remote_serde="naive")
    raise ValueError(f"backend is local_disk or fs, not {backend!r}")


# ---------------------------------------------------------------- the engine (child)

def _kv(n_tokens: int) -> Any:
    """The serving engine's KV for the prompt: fixed random fp16 values."""
    import torch
    g = torch.Generator().manual_seed(1234)
    return torch.randn((2, LAYERS, n_tokens, KV_HEADS * HEAD_DIM), generator=g).half()


def _tokens(n_tokens: int) -> list[int]:
    return [(i * 7919 + 13) % 49152 for i in range(n_tokens)]


def _chunk_sums(kv: Any, n_tokens: int) -> list[str]:
    return [hashlib.sha256(kv[:, :, s:min(s + CHUNK, n_tokens)].contiguous().numpy().tobytes())
            .hexdigest() for s in range(0, n_tokens, CHUNK)]


def _engine(backend: str, folder: str):
    import torch
    from lmcache.v1.cache_engine import LMCacheEngineBuilder
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.gpu_connector.gpu_connectors import GPUConnectorInterface
    from lmcache.v1.metadata import LMCacheMetadata

    class CPUConnector(GPUConnectorInterface):
        """The serving engine's KV is a CPU tensor [2, layers, tokens, hidden]
        (kwarg kvcaches); chunks are copied in and out of it."""

        def __init__(self) -> None:
            self.kvcaches = None

        def from_gpu(self, memory_obj, start, end, **kw):
            src = kw["kvcaches"][:, :, start:end]
            memory_obj.tensor.copy_(src.reshape(memory_obj.tensor.shape))

        def to_gpu(self, memory_obj, start, end, **kw):
            dst = kw["kvcaches"][:, :, start:end]
            dst.copy_(memory_obj.tensor.reshape(dst.shape))

        def batched_from_gpu(self, memory_objs, starts, ends, **kw):
            for m, s, e in zip(memory_objs, starts, ends):
                self.from_gpu(m, s, e, **kw)

        def batched_to_gpu(self, memory_objs=None, starts=None, ends=None, **kw):
            for m, s, e in zip(memory_objs, starts, ends):
                self.to_gpu(m, s, e, **kw)

        def get_shape(self, num_tokens):
            return torch.Size([2, LAYERS, num_tokens, KV_HEADS * HEAD_DIM])

    config = LMCacheEngineConfig.from_defaults(**config_for(backend, folder))
    metadata = LMCacheMetadata(model_name="SmolLM2-135M", world_size=1, local_world_size=1,
                               worker_id=0, local_worker_id=0, kv_dtype=torch.float16,
                               kv_shape=(LAYERS, 2, CHUNK, KV_HEADS, HEAD_DIM))
    engine = LMCacheEngineBuilder.get_or_create("memosfs-bench", config, metadata,
                                                CPUConnector(), lambda t, r: None,
                                                lambda o, r: o)
    engine.post_init()
    return engine


def _chunk_files(backend: str, folder: str) -> list[Path]:
    suffix = ".pt" if backend == "local_disk" else ".data"
    return sorted(p for p in Path(folder).rglob("*" + suffix) if p.is_file())


def _wait_files(backend: str, folder: str, n: int, timeout: float = 120) -> None:
    """Puts are asynchronous: wait until the n chunk files are in place."""
    deadline = time.monotonic() + timeout
    while len(_chunk_files(backend, folder)) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{backend}: {len(_chunk_files(backend, folder))} of {n} "
                               f"chunk files after {timeout} s in {folder}")
        time.sleep(0.002)


def worker(mode: str, backend: str, folder: str, n_tokens: int) -> dict:
    """store: put the prompt's KV (then, in the same process, retrieve it
    back into zeros); retrieve: a fresh engine gets the prompt's KV back.
    Checksums are compared chunk by chunk with the KV that store() was given."""
    import torch
    from lmcache.v1.cache_engine import LMCacheEngineBuilder

    tokens = torch.tensor(_tokens(n_tokens), dtype=torch.long)
    kv = _kv(n_tokens)
    want = _chunk_sums(kv, n_tokens)
    n_chunks = len(want)
    out: dict[str, Any] = {"mode": mode, "backend": backend, "n_tokens": n_tokens,
                           "n_chunks": n_chunks,
                           "pythonhashseed": os.environ.get("PYTHONHASHSEED")}
    engine = _engine(backend, folder)
    try:
        if mode == "store":
            t0 = time.perf_counter()
            engine.store(tokens, kvcaches=kv)
            _wait_files(backend, folder, n_chunks)
            out["save_s"] = time.perf_counter() - t0
            files = _chunk_files(backend, folder)
            out["files"] = len(files)
            out["bytes"] = sum(p.stat().st_size for p in files)
        got = torch.zeros_like(kv)
        t0 = time.perf_counter()
        mask = engine.retrieve(tokens, kvcaches=got)
        out["load_s"] = time.perf_counter() - t0
        out["retrieved"] = int(mask.sum())
        sums = _chunk_sums(got, n_tokens)
        out["chunks_matching"] = sum(a == b for a, b in zip(sums, want))
        out["checksums_ok"] = out["retrieved"] == n_tokens and sums == want
    finally:
        LMCacheEngineBuilder.destroy("memosfs-bench")
    return out


def run_worker(mode: str, backend: str, folder: str | os.PathLike, n_tokens: int = 1536,
               hashseed: Optional[str] = HASHSEED, timeout: float = 300) -> dict:
    """worker() in a child process (PYTHONHASHSEED=hashseed; None: unset); its
    JSON answer, or EngineFailed (signal, return code, stderr tail)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("PYTHONHASHSEED", None)
    env.setdefault("LMCACHE_LOG_LEVEL", "WARNING")
    if hashseed is not None:
        env["PYTHONHASHSEED"] = hashseed
    cmd = [sys.executable, "-m", "memosfs.bench.engines_lmcache", "worker", "--mode", mode,
           "--backend", backend, "--folder", str(folder), "--tokens", str(n_tokens)]
    return run_json_child(cmd, f"lmcache worker ({mode}, {backend})", timeout=timeout, env=env)


def vllm_integration_error() -> str:
    """What LMCache's vLLM integration says on this CPU machine: the
    connector factory that LMCacheConnectorV1 calls
    (lmcache.v1.gpu_connector.CreateGPUConnector(..., EngineType.VLLM)),
    in its own words; 'ok' if it builds a connector."""
    code = ("import torch\n"
            "from lmcache.utils import EngineType\n"
            "from lmcache.v1.config import LMCacheEngineConfig\n"
            "from lmcache.v1.gpu_connector import CreateGPUConnector\n"
            "from lmcache.v1.metadata import LMCacheMetadata\n"
            "md = LMCacheMetadata(model_name='m', world_size=1, local_world_size=1, worker_id=0,\n"
            "    local_worker_id=0, kv_dtype=torch.float16, kv_shape=(30, 2, 256, 3, 64))\n"
            "try:\n"
            "    CreateGPUConnector(LMCacheEngineConfig.from_defaults(), md, EngineType.VLLM)\n"
            "    print('ok')\n"
            "except Exception as e:\n"
            "    print(f'{type(e).__name__}: {e}')\n")
    env = dict(os.environ, LMCACHE_LOG_LEVEL="ERROR")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=300, env=env)
    lines = r.stdout.strip().splitlines()
    return lines[-1] if lines else f"rc={r.returncode}: {r.stderr.strip()[-300:]}"


# ---------------------------------------------------------------- the benchmark

def _places(mount: Optional[str]):
    """tmpfs, the local disk and a memosfs session (memosfs/bench/common.py)."""
    return engine_places(mount, "memosfs-lmcache-")


def bench_lmcache(n_tokens: int = 1536, mount: Optional[str] = None) -> dict:
    """fs:// on tmpfs, the local disk and memosfs (store in one process,
    retrieve in another), local_disk on memosfs (same process; a second
    process finds nothing: LMCache's index is in memory)."""
    why = missing()
    if why:
        return {"engine": "lmcache", "skipped": why}
    import importlib.metadata
    res: dict[str, Any] = {"engine": "lmcache", "version": importlib.metadata.version("lmcache"),
                           "prompt_tokens": n_tokens, "chunk_size": CHUNK,
                           "kv": f"fp16 {LAYERS} layers x {KV_HEADS} heads x {HEAD_DIM}",
                           "ttft": "n/a: no LMCache-integrated engine runs on CPU"}
    ok = True
    with _places(mount) as places:
        for name, folder in places.items():
            d = folder / "fs"
            s = run_worker("store", "fs", d, n_tokens)
            r = run_worker("retrieve", "fs", d, n_tokens)
            ok = ok and s["checksums_ok"] and r["checksums_ok"]
            res[f"fs_{name}"] = {"save_s": s["save_s"], "load_s": r["load_s"],
                                 "bytes": s["bytes"], "files": s["files"],
                                 "retrieved_other_process": r["retrieved"],
                                 "tokens_identical": r["checksums_ok"]}
        d = places["memosfs"] / "local_disk"
        s = run_worker("store", "local_disk", d, n_tokens)
        r = run_worker("retrieve", "local_disk", d, n_tokens)
        ok = ok and s["checksums_ok"]
        res["local_disk_memosfs"] = {"save_s": s["save_s"], "load_s_same_process": s["load_s"],
                                     "bytes": s["bytes"], "files": s["files"],
                                     "retrieved_same_process": s["retrieved"],
                                     "retrieved_other_process": r["retrieved"],
                                     "tokens_identical": s["checksums_ok"]}
    res["tokens_identical"] = ok
    res["vllm_integration"] = vllm_integration_error()
    if "fs_tmpfs" in res:
        res["save_ratio_vs_tmpfs"] = res["fs_memosfs"]["save_s"] / max(res["fs_tmpfs"]["save_s"], 1e-9)
        res["load_ratio_vs_tmpfs"] = res["fs_memosfs"]["load_s"] / max(res["fs_tmpfs"]["load_s"], 1e-9)
    return res


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m memosfs.bench.engines_lmcache")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--mode", choices=("store", "retrieve"), required=True)
    w.add_argument("--backend", choices=("local_disk", "fs"), required=True)
    w.add_argument("--folder", required=True)
    w.add_argument("--tokens", type=int, default=1536)
    b = sub.add_parser("bench")
    b.add_argument("--tokens", type=int, default=1536)
    a = ap.parse_args(argv)
    if a.cmd == "worker":
        print(json.dumps(worker(a.mode, a.backend, a.folder, a.tokens)), flush=True)
        return 0
    print(json.dumps(bench_lmcache(a.tokens), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
