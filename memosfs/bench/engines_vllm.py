"""vLLM on the mount: time to first token with and without an external KV cache.

`bench(...)` returns one dict (the lead's `memosfs bench engines` prints it):

    ttft_s          {"none": cold engine, no external cache,
                     "example_disk": vLLM's ExampleConnector on the local disk, second process,
                     "memosfs": the memosfs connector on a session of a fresh mount,
                                second process (cold engine, warm cache)}
    first_ttft_s    the same columns' first (storing) process
    ratio           memosfs TTFT / no-cache TTFT
    save / load     per column: seconds, bytes, files (the connector's own counts)
    tokens_identical  every column's greedy tokens equal the no-cache run's
    prompt_tokens, block_tokens, max_tokens, engine_start_s, ...

Each engine run is a separate process (`python -m memosfs.bench.engines_vllm child
CONFIG.json`, run with the vLLM environment's python, `.venv-vllm/bin/python` by
default): `run_engine(config)` below is what it does.  vLLM runs in that process
(VLLM_ENABLE_V1_MULTIPROCESSING=0, VLLM_CPU_KVCACHE_SPACE=1, enforce_eager), on
the converted SmolLM2 (`make model-deps`), prefix caching off so every reuse is
the external cache's.  Nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from memosfs.bench.common import EngineFailed
from memosfs.testing import models

DEFAULT_PYTHON = os.environ.get("MEMOSFS_VLLM_PYTHON") or str(
    Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python")
MARK = "MEMOSFS-VLLM-RESULT "

ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONHASHSEED": "0",
}


def vllm_missing(python: str = DEFAULT_PYTHON) -> str | None:
    """None when `python` has vLLM, else why not (with the fix)."""
    if not os.path.exists(python):
        return f"{python} is missing: make engines-vllm"
    try:
        subprocess.run([python, "-c", "import vllm, memosfs.client.vllm"], check=True,
                       capture_output=True, timeout=300)
    except subprocess.CalledProcessError as e:
        return f"{python} cannot import vllm: {e.stderr.decode(errors='replace')[-500:]}"
    return None


# ------------------------------------------------------------- the child

def _timed_safetensors() -> dict[str, float]:
    """Count the time and bytes of safetensors' save_file/load_file (what vLLM's
    ExampleConnector calls, through the module attribute)."""
    import safetensors.torch as st

    acc = {"save_s": 0.0, "save_bytes": 0, "saves": 0, "load_s": 0.0, "load_bytes": 0,
           "loads": 0}
    save0, load0 = st.save_file, st.load_file

    def save_file(tensors, filename, metadata=None):
        t0 = time.perf_counter()
        out = save0(tensors, filename, metadata=metadata)
        acc["save_s"] += time.perf_counter() - t0
        acc["saves"] += 1
        acc["save_bytes"] += sum(t.numel() * t.element_size() for t in tensors.values())
        return out

    def load_file(filename, device="cpu"):
        t0 = time.perf_counter()
        out = load0(filename, device=device)
        acc["load_s"] += time.perf_counter() - t0
        acc["loads"] += 1
        acc["load_bytes"] += sum(t.numel() * t.element_size() for t in out.values())
        return out

    st.save_file, st.load_file = save_file, load_file
    return acc


def run_engine(cfg: dict[str, Any]) -> dict[str, Any]:
    """One engine process: build the LLM (with the connector cfg["connector"]: None,
    {"kind": "example", "path": DIR} or {"kind": "memosfs", "path": DIR, ...extra}),
    run each prompt (token ids) greedily for max_tokens, one request at a time;
    per prompt the tokens, TTFT (the engine's first-token latency) and wall time."""
    for k, v in ENGINE_ENV.items():
        os.environ.setdefault(k, v)
    import logging

    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig

    conn = cfg.get("connector")
    ktc = None
    acc = None
    if conn and conn["kind"] == "example":
        acc = _timed_safetensors()
        ktc = KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_both",
                               kv_connector_extra_config={"shared_storage_path": conn["path"]})
    elif conn and conn["kind"] == "memosfs":
        extra = {k: v for k, v in conn.items() if k != "kind"}
        ktc = KVTransferConfig(kv_connector="MemosConnector", kv_role="kv_both",
                               kv_connector_module_path="memosfs.client.vllm",
                               kv_connector_extra_config=extra)
        logging.getLogger("memosfs.vllm").setLevel(logging.INFO)
    t0 = time.perf_counter()
    llm = LLM(model=cfg["model"], tokenizer=cfg["model"], dtype=cfg.get("dtype", "float32"),
              enforce_eager=True, enable_prefix_caching=False,
              max_model_len=cfg.get("max_model_len", 4096), seed=0,
              disable_log_stats=False, kv_transfer_config=ktc)
    start_s = time.perf_counter() - t0
    sp = SamplingParams(max_tokens=cfg.get("max_tokens", 8), temperature=0.0, logprobs=1)
    if cfg.get("warmup", True):
        # the first request of an engine pays one-time costs (kernels, allocator); a
        # prompt shorter than any connector block stores and loads nothing
        t0 = time.perf_counter()
        llm.generate([{"prompt_token_ids": list(range(100, 116))}],
                     SamplingParams(max_tokens=2, temperature=0.0), use_tqdm=False)
        if cfg.get("warmup_ids"):
            # a prompt as long as the timed one, of other text (nothing in any
            # cache matches it): the kernels and buffers of a long prefill
            # exist before the timed run, in every column alike
            llm.generate([{"prompt_token_ids": list(cfg["warmup_ids"])}],
                         SamplingParams(max_tokens=2, temperature=0.0), use_tqdm=False)
        start_s += time.perf_counter() - t0
    if conn and conn["kind"] == "memosfs":
        from memosfs.client import vllm as mv
        mv.reset_stats()
    elif acc is not None:
        acc.update(dict.fromkeys(acc, 0))
    outs = []
    for ids in cfg["prompts"]:
        runs = []
        # repeat: the same prompt again (no local prefix cache: each run prefills, or
        # loads from the connector, anew); TTFT on a shared machine is noisy
        for _ in range(max(1, int(cfg.get("repeat", 1)))):
            t0 = time.perf_counter()
            (res,) = llm.generate([{"prompt_token_ids": list(ids)}], sp, use_tqdm=False)
            wall = time.perf_counter() - t0
            comp = res.outputs[0]
            m = getattr(res, "metrics", None)
            ttft = getattr(m, "first_token_latency", 0.0) or None
            lp = [float(d[t].logprob) for d, t in zip(comp.logprobs or [], comp.token_ids)]
            runs.append({"tokens": list(comp.token_ids), "logprobs": lp, "ttft_s": ttft,
                         "wall_s": wall,
                         "num_cached_tokens": getattr(res, "num_cached_tokens", None)})
        o = dict(runs[0])
        ttfts = [r["ttft_s"] for r in runs if r["ttft_s"] is not None]
        o["ttft_runs_s"] = ttfts
        o["ttft_min_s"] = min(ttfts) if ttfts else None
        o["repeats_identical"] = all(r["tokens"] == runs[0]["tokens"] for r in runs)
        outs.append(o)
    out: dict[str, Any] = {"engine_start_s": start_s, "outputs": outs}
    if conn and conn["kind"] == "memosfs":
        from memosfs.client import vllm as mv
        from vllm.distributed.kv_transfer import get_kv_transfer_group
        t0 = time.perf_counter()
        with contextlib.suppress(Exception):
            get_kv_transfer_group().flush()
        out["flush_s"] = time.perf_counter() - t0
        out["stats"] = {k: v for k, v in mv.STATS.items()}
    elif acc is not None:
        out["stats"] = acc
    return out


def _child_main(path: str) -> None:
    cfg = json.loads(Path(path).read_text())
    out = run_engine(cfg)
    sys.stdout.flush()
    print(MARK + json.dumps(out), flush=True)
    # vLLM's engine threads can keep an interpreter alive at exit
    os._exit(0)


def spawn(cfg: dict[str, Any], python: str = DEFAULT_PYTHON, timeout: float = 1800,
          log: str | None = None) -> dict[str, Any]:
    """Run one engine process with `cfg`; its result dict (EngineFailed with the
    return code, the signal that ended it and the tail of its output when it
    ends without a result).  `log`: also keep the output there."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cfg, f)
    env = dict(ENGINE_ENV, **os.environ)           # the caller's settings win
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    try:
        p = subprocess.run([python, "-m", "memosfs.bench.engines_vllm", "child", f.name],
                           env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise EngineFailed("vLLM process", None, e.stderr,
                           f"gave no answer in {timeout:g} s (killed)") from None
    finally:
        os.unlink(f.name)
    text = p.stdout + p.stderr
    if log:
        with open(log, "a") as g:
            g.write(text)
    for line in p.stdout.splitlines()[::-1]:
        if line.startswith(MARK):
            res = json.loads(line[len(MARK):])
            res["log_tail"] = text[-4000:]
            return res
    raise EngineFailed("vLLM process", p.returncode, text[-20000:])


# ------------------------------------------------------------- prompts

def prompt_ids(n_tokens: int, *, offset_chars: int = 0, tail: str = "") -> list[int]:
    """n_tokens token ids of English text (the corpus), then `tail`'s tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(models.convert()))
    text = models.corpus_text(offset_chars + 8 * n_tokens + 1000)[offset_chars:]
    ids = tok(text).input_ids[:n_tokens]
    if len(ids) < n_tokens:
        raise ValueError(f"corpus too short for {n_tokens} tokens")
    return ids + (tok(tail).input_ids if tail else [])


# ------------------------------------------------------------- the bench

def _col(res: dict[str, Any]) -> dict[str, Any]:
    st = res.get("stats") or {}
    loads = st.get("loads", 0)
    return {"save_s": st.get("save_s", 0.0), "save_bytes": st.get("save_bytes", 0),
            "saves": st.get("saves", 0), "load_s": st.get("load_s", 0.0),
            "load_bytes": st.get("load_bytes", 0), "loads": loads,
            "flush_s": res.get("flush_s")}


def bench(prompt_tokens: int = 2048, *, max_tokens: int = 8, block_tokens: int = 512,
          repeat: int = 3, python: str = DEFAULT_PYTHON, capacity: str = "2G",
          disk_dir: str | None = None, log: str | None = None) -> dict[str, Any]:
    """TTFT of a prompt_tokens-long prompt: no external cache, vLLM's ExampleConnector
    on the local disk (second process), and the memosfs connector on a session of a
    fresh mount (second process: cold engine, warm cache); save/load seconds and
    bytes per column; tokens identical in every column.  The reading processes run
    the prompt `repeat` times (each run prefills or loads anew: vLLM's own prefix
    cache is off), after a warm-up on a prompt as long of other text: ttft_s is the
    first timed run's, ttft_min_s the least."""
    from memosfs.testing.daemon import memos_mount

    model = str(models.convert())
    ids = prompt_ids(prompt_tokens)
    base = {"model": model, "prompts": [ids], "max_tokens": max_tokens}
    # the reading processes warm up on a prompt as long, of other text (the
    # first long prefill of a process pays ~5 s of one-time costs, cache or not)
    rd = dict(base, repeat=repeat, warmup_ids=prompt_ids(prompt_tokens, offset_chars=150_000))
    runs: dict[str, Any] = {}
    runs["none"] = spawn(dict(rd), python, log=log)
    disk = tempfile.mkdtemp(prefix="memosfs-vllm-disk-", dir=disk_dir)
    try:
        c = dict(base, connector={"kind": "example", "path": disk})
        runs["example_disk_store"] = spawn(c, python, log=log)
        runs["example_disk"] = spawn(dict(c, repeat=repeat, warmup_ids=rd["warmup_ids"]),
                                     python, log=log)
    finally:
        shutil.rmtree(disk, ignore_errors=True)
    with memos_mount(capacity) as mnt:
        sess = os.path.join(mnt, "bench", "vllm")
        os.makedirs(sess)
        c = dict(base, connector={"kind": "memosfs", "path": sess, "block_tokens": block_tokens,
                                  "model_id": models.MODEL_ID})
        runs["memosfs_store"] = spawn(c, python, log=log)
        runs["memosfs"] = spawn(dict(c, repeat=repeat, warmup_ids=rd["warmup_ids"]),
                                python, log=log)
    ref = runs["none"]["outputs"][0]["tokens"]
    cols = ("none", "example_disk", "memosfs")
    ttft = {k: runs[k]["outputs"][0]["ttft_s"] for k in cols}
    tmin = {k: runs[k]["outputs"][0]["ttft_min_s"] for k in cols}
    return {
        "engine": "vllm",
        "prompt_tokens": prompt_tokens, "max_tokens": max_tokens, "block_tokens": block_tokens,
        "ttft_s": ttft,
        "first_ttft_s": {"example_disk": runs["example_disk_store"]["outputs"][0]["ttft_s"],
                         "memosfs": runs["memosfs_store"]["outputs"][0]["ttft_s"]},
        "ratio": {k: (ttft[k] / ttft["none"] if ttft[k] and ttft["none"] else None)
                  for k in ("example_disk", "memosfs")},
        "ttft_min_s": tmin, "repeat": repeat,
        "ttft_runs_s": {k: runs[k]["outputs"][0]["ttft_runs_s"] for k in cols},
        "ratio_min": {k: (tmin[k] / tmin["none"] if tmin[k] and tmin["none"] else None)
                      for k in ("example_disk", "memosfs")},
        "save": {"example_disk": _col(runs["example_disk_store"]),
                 "memosfs": _col(runs["memosfs_store"])},
        "load": {"example_disk": _col(runs["example_disk"]), "memosfs": _col(runs["memosfs"])},
        "matched_tokens": (runs["memosfs"].get("stats") or {}).get("last_matched_tokens"),
        "engine_start_s": {k: r["engine_start_s"] for k, r in runs.items()},
        "tokens_identical": all(r["outputs"][0]["tokens"] == ref and
                                r["outputs"][0]["repeats_identical"] for r in runs.values()),
        "tokens": ref,
    }


def bench_example_storage(prompt_tokens: int = 1536, *, python: str = DEFAULT_PYTHON,
                          capacity: str = "1G", log: str | None = None) -> dict[str, Any]:
    """vLLM's own ExampleConnector (one file per layer, in a directory per prompt
    hash) with shared_storage_path on tmpfs (/dev/shm), the local disk (a temporary
    folder) and a session of a fresh mount: per place, the storing process's save
    seconds and the second process's load seconds (safetensors save_file/load_file,
    timed inside the engine process), files, bytes, and whether the second
    process's tokens equal the first's."""
    from memosfs.testing.daemon import memos_mount

    model = str(models.convert())
    base = {"model": model, "prompts": [prompt_ids(prompt_tokens)], "max_tokens": 4}
    out: dict[str, Any] = {"prompt_tokens": prompt_tokens}

    def place(name: str, path: str) -> None:
        c = dict(base, connector={"kind": "example", "path": path})
        a, b = spawn(c, python, log=log), spawn(c, python, log=log)
        out[name] = {"save_s": a["stats"]["save_s"], "saves": a["stats"]["saves"],
                     "save_bytes": a["stats"]["save_bytes"], "load_s": b["stats"]["load_s"],
                     "loads": b["stats"]["loads"], "load_bytes": b["stats"]["load_bytes"],
                     "ttft_store_s": a["outputs"][0]["ttft_s"],
                     "ttft_load_s": b["outputs"][0]["ttft_s"],
                     "tokens_identical": a["outputs"][0]["tokens"] == b["outputs"][0]["tokens"]}

    for name, parent in (("tmpfs", "/dev/shm"), ("disk", None)):
        d = tempfile.mkdtemp(prefix="memosfs-vllm-", dir=parent)
        try:
            place(name, d)
        finally:
            shutil.rmtree(d, ignore_errors=True)
    with memos_mount(capacity) as mnt:
        sess = os.path.join(mnt, "agent", "session")
        os.makedirs(sess)
        place("memosfs_session", sess)
    return out


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "child":
        _child_main(sys.argv[2])
    elif len(sys.argv) >= 2 and sys.argv[1] == "example-storage":
        print(json.dumps(bench_example_storage(*(int(a) for a in sys.argv[2:3])), indent=2))
    else:
        try:
            print(json.dumps(bench(int(sys.argv[1]) if len(sys.argv) > 1 else 2048), indent=2))
        except EngineFailed as e:     # one of its engine processes died: say how, as JSON
            print(json.dumps(e.report()))
            sys.exit(3)
