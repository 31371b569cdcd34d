"""`memosfs bench engines`: the command exists, refuses unknown engines, and
says how to install an engine that is missing (the engines themselves run in
`make test-engines`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def _bench(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memosfs", "bench", "engines", *args],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, **(env or {})))


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
