"""`memosfs bench engines`: real inference engines with their KV on the mount.

    memosfs bench engines [--tokens 1536] [--vllm-tokens 2048] [--only a,b] [--json]

One JSON object with one entry per engine, each measured by its own module
against a fresh memosfs mount, tmpfs and the local disk, with tokens
compared in every column:

  llamacpp     llama-cpp-python state files (memosfs/bench/engines_llamacpp.py):
               time to first token with no cache and with the state restored
               from each place, save and load times, bytes
  llama_server llama-server's --slot-save-path (same module)
  lmcache      LMCache's storage engine, `fs://` and `local_disk`, retrieve
               in a second process (memosfs/bench/engines_lmcache.py)
  vllm         two vLLM processes, the second one's TTFT for a shared prompt
               with no external cache, vLLM's own storage connector on the
               local disk, and the memosfs connector (memosfs.client.vllm);
               run with the vLLM venv's Python ($MEMOSFS_VLLM_PYTHON, default
               .venv-vllm/bin/python; memosfs/bench/engines_vllm.py)

An engine that is not installed is reported as {"skipped": reason} with the
make target that installs it (`make engines-llama`, `make engines-vllm`).  An
engine whose process dies (llama.cpp's native code faulting: SIGSEGV, SIGILL)
or fails is reported in its place as {"failed": what, "returncode": -11,
"signal": "SIGSEGV", "stderr_tail": [last lines]} and the others still run;
the command then exits 1, after printing the JSON.

May call: memosfs.bench.engines_llamacpp, engines_lmcache, engines_vllm.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import traceback
from typing import Any, Callable

from memosfs.bench.common import EngineFailed, tail_lines

ENGINES = ("llamacpp", "llama_server", "lmcache", "vllm")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def add_parsers(bsub) -> None:
    p = bsub.add_parser("engines", help="inference engines (llama.cpp, LMCache, vLLM) with "
                        "their KV on the mount vs tmpfs and disk: TTFT, save, load")
    p.add_argument("--tokens", type=int, default=1536,
                   help="prompt tokens for llama.cpp and LMCache (default 1536)")
    p.add_argument("--vllm-tokens", type=int, default=2048,
                   help="the shared prompt of the two vLLM processes (default 2048)")
    p.add_argument("--only", default="", help="comma-separated: " + ",".join(ENGINES))
    p.add_argument("--mount-opts", default="",
                   help="mount options for the engines' memosfs mounts (e.g. passthrough=1)")
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.set_defaults(fn=cmd_bench_engines)


def _guarded(name: str, run: Callable[[], dict], install: str) -> dict:
    """An engine's figures; {"skipped": why} when it is not installed;
    {"failed": ..., "signal": ..., "stderr_tail": ...} when one of its
    processes died (EngineFailed), or the error when anything else failed, so
    that the next engine still runs."""
    try:
        return run()
    except ImportError as e:
        return {"skipped": f"{name} is not installed ({e}); `{install}` installs it"}
    except FileNotFoundError as e:
        return {"skipped": f"{name}: {e}; `{install}` installs it"}
    except EngineFailed as e:
        return {"engine": name, **e.report()}
    except Exception as e:                     # the others still run; the error is shown
        return {"engine": name, "failed": f"{type(e).__name__}: {e}",
                "traceback_tail": tail_lines(traceback.format_exc(), 12)}


def _vllm(tokens: int) -> dict:
    """The vLLM columns, from the vLLM venv's python (memosfs/bench/engines_vllm.py
    prints its figures, or with exit 3 the report of an engine process that died)."""
    py = os.environ.get("MEMOSFS_VLLM_PYTHON", os.path.join(ROOT, ".venv-vllm", "bin", "python"))
    if not os.path.exists(py):
        return {"skipped": f"no vLLM venv at {py}; `make engines-vllm` makes it"}
    r = subprocess.run([py, "-m", "memosfs.bench.engines_vllm", str(tokens)], cwd=ROOT,
                       capture_output=True, text=True)
    if r.returncode == 3 and r.stdout.strip().startswith("{"):
        return {"engine": "vllm", **json.loads(r.stdout.strip().splitlines()[-1])}
    if r.returncode != 0:
        raise EngineFailed("vLLM benchmark", r.returncode, r.stderr or r.stdout)
    return json.loads(r.stdout)


def bench_engines(tokens: int, vllm_tokens: int, only: tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {"bench": "engines", "tokens": tokens, "vllm_tokens": vllm_tokens}
    if "llamacpp" in only:
        def llamacpp() -> dict:
            from memosfs.bench import engines_llamacpp
            return engines_llamacpp.bench_llamacpp(tokens)
        out["llamacpp"] = _guarded("llama-cpp-python", llamacpp, "make engines-llama")
    if "llama_server" in only:
        def server() -> dict:
            from memosfs.bench import engines_llamacpp
            return engines_llamacpp.bench_llama_server(tokens)
        out["llama_server"] = _guarded("llama-server", server, "make engines-llama")
    if "lmcache" in only:
        def lmcache() -> dict:
            from memosfs.bench import engines_lmcache
            return engines_lmcache.bench_lmcache(tokens)
        out["lmcache"] = _guarded("lmcache", lmcache, "make engines-llama")
    if "vllm" in only:
        out["vllm"] = _guarded("vllm", lambda: _vllm(vllm_tokens), "make engines-vllm")
    return out


def failed(result: dict[str, Any]) -> list[str]:
    """The engines of a result that failed."""
    return [k for k in ENGINES if isinstance(result.get(k), dict) and "failed" in result[k]]


def cmd_bench_engines(args: argparse.Namespace) -> int:
    only = tuple(x for x in args.only.split(",") if x) or ENGINES
    bad = [x for x in only if x not in ENGINES]
    if bad:
        print(f"memosfs bench engines: unknown engine(s) {', '.join(bad)} "
              f"(choose from {', '.join(ENGINES)})", file=sys.stderr)
        return 2
    if args.mount_opts:
        # every memosfs mount of the run, in this process and the engines' children
        os.environ["MEMOSFS_BENCH_MOUNT_OPTS"] = args.mount_opts
    result = bench_engines(args.tokens, args.vllm_tokens, only)
    result["mount_opts"] = args.mount_opts
    print(json.dumps(result) if args.json else json.dumps(result, indent=2), flush=True)
    bad = failed(result)
    if bad:
        print(f"memosfs bench engines: {', '.join(bad)} failed: its \"failed\" entry in the "
              "JSON says how", file=sys.stderr)
        return 1
    return 0
