"""llama.cpp on a real mount, with its own file formats and nothing changed.

llama-cpp-python: `llama_state_save_file` at MNT/agent/session/NAME after a
prompt, `llama_state_load_file` in another process (and after an unmount and
a mount of the same SSD folder: a cold restore) -> the same greedy tokens
and bit-identical first logits as the run that computed the prompt.

llama-server: `--slot-save-path MNT/agent/session`, POST
/slots/0?action=save|restore|erase; a second server restores the slot and
evaluates one token of the prompt instead of all of them, with the same
output.

Each engine run is a child process (memosfs/bench/engines_llamacpp.py).
Skipped with the reason when the engine is not installed (`make engines-llama`).
"""

from __future__ import annotations

import os

import pytest

from memosfs.bench import engines_llamacpp as eng

pytestmark = [pytest.mark.engines, pytest.mark.slow]

N_TOKENS = 512
GEN = 8


def _same(a: dict, b: dict) -> None:
    assert b.get("error") is None, b
    assert b["tokens"] == a["tokens"]
    assert b["logits_sha256"] == a["logits_sha256"], (a["logits_head"], b["logits_head"])


@pytest.mark.skipif(eng.missing() is not None, reason=str(eng.missing()))
def test_state_file_on_a_session_restores_in_another_process_and_after_remount(make_mount):
    m = make_mount(capacity="256M")
    session = m.p("agent", "session")
    os.makedirs(session)
    path = session / "llama-state.bin"

    plain = eng.run_worker("plain", None, N_TOKENS, GEN)
    saved = eng.run_worker("save", path, N_TOKENS, GEN)
    assert saved.get("error") is None, saved
    _same(plain, saved)                       # saving does not change the run
    size = os.path.getsize(path)
    assert size == saved["bytes"] > 1 << 20   # the KV of 511 tokens, published on close

    warm = eng.run_worker("load", path, N_TOKENS, GEN)
    _same(plain, warm)
    assert warm["n_restored"] == N_TOKENS - 1 and warm["restored_tokens_match"]
    assert warm["n_evaluated"] == 1

    ssd = m.ssd
    m.stop()
    m2 = make_mount(capacity="256M", ssd=ssd)
    path2 = m2.p("agent", "session", "llama-state.bin")
    assert os.path.getsize(path2) == size
    cold = eng.run_worker("load", path2, N_TOKENS, GEN)
    _same(plain, cold)
    assert cold["n_restored"] == N_TOKENS - 1 and cold["n_evaluated"] == 1


@pytest.mark.skipif(eng.missing() is not None, reason=str(eng.missing()))
def test_state_file_missing_on_the_mount_is_a_failed_load_not_a_crash(make_mount):
    m = make_mount(capacity="64M")
    os.makedirs(m.p("agent", "session"))
    out = eng.run_worker("load", m.p("agent", "session", "absent.bin"), 64, 1)
    assert "failed" in out.get("error", ""), out


@pytest.mark.skipif(eng.server_missing() is not None, reason=str(eng.server_missing()))
def test_llama_server_slots_save_restore_erase_on_a_session(make_mount):
    m = make_mount(capacity="256M")
    session = m.p("agent", "session")
    os.makedirs(session)
    probe = eng.Server(session)
    try:
        prompt = eng.server_prompt(probe, N_TOKENS)
        # a slot file that is not there: the server answers an error and goes on
        status, body = probe.slot("restore", "absent.bin")
        assert status >= 400, body
        assert probe.get("/health").get("status") == "ok"
    finally:
        probe.stop()

    r = eng._server_cycle(session, prompt, GEN, threads=1)
    assert r["cold_prompt_n"] == N_TOKENS
    assert r["n_restored"] >= N_TOKENS - 1, r      # the prompt (and what it generated)
    assert r["tokens_identical"], r
    assert r["warm_prompt_n"] <= 1, r          # the restored request evaluated one token
    assert r["erase_status"] == 200
    assert os.path.getsize(session / "slot0.bin") == r["bytes"]

    # after an unmount and a mount of the same SSD folder, a new server restores it
    ssd = m.ssd
    m.stop()
    m2 = make_mount(capacity="256M", ssd=ssd)
    srv = eng.Server(m2.p("agent", "session"))
    try:
        status, restored = srv.slot("restore", "slot0.bin")
        assert status == 200, restored
        out = srv.complete(prompt, GEN)
        assert out["timings"]["prompt_n"] <= 1
        assert out["tokens"] == r["tokens"]
    finally:
        srv.stop()
