"""memosfs.client.vllm without vLLM: the chain of block slots (plan_chain), the
agent's loader (load_prefix), model identity, and the module importing without
vLLM.  The real engine is in tests/engines/test_vllm.py (make test-engines-vllm)."""

from __future__ import annotations

import numpy as np
import pytest

from memosfs.client import kv
from memosfs.client import vllm as mv

L, H, D = 3, 2, 4
MODEL = "org/model"


def blocks_kv(n_tokens, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((1, H, n_tokens, D)).astype(np.float32),
             rng.standard_normal((1, H, n_tokens, D)).astype(np.float32)) for _ in range(L)]


def save_blocks(sess, tokens, pairs, block, model=MODEL, upto=None, skip=()):
    """Block slots as the connector writes them (start, tokens=block)."""
    hashes = kv.prefix_hashes(tokens, block)
    for i, h in enumerate(hashes[:upto]):
        if i in skip:
            continue
        cut = [(k[:, :, i * block:(i + 1) * block], v[:, :, i * block:(i + 1) * block])
               for k, v in pairs]
        kv.save_kv(sess / h, cut, model_id=model, prefix_hash=h, tokens=block, block=block,
                   extra_meta={"start": i * block, "producer": "vllm"})
    return hashes


EXPECT = {"model": MODEL, "layers": str(L), "kv_heads": str(H), "head_dim": str(D),
          "dtype": "float32"}


def test_module_imports_without_vllm_and_names_the_connector_lazily():
    import importlib.util
    assert hasattr(mv, "load_prefix") and hasattr(mv, "plan_chain")
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ImportError):
            mv.MemosConnector      # noqa: B018  (built on first use, needs vLLM)


def test_chain_covers_the_longest_run_of_blocks(tmp_path):
    tokens = list(range(1, 41))
    pairs = blocks_kv(40)
    save_blocks(tmp_path, tokens, pairs, 8, upto=3)           # blocks 1..3 of 5
    covered, pieces, refused = mv.plan_chain(tmp_path, tokens, block=8, expect=EXPECT)
    assert covered == 24 and [p.start for p in pieces] == [0, 8, 16] and refused == []
    # a different tail reuses the shared full blocks only
    other = tokens[:20] + [99] * 20
    covered, pieces, _ = mv.plan_chain(tmp_path, other, block=8, expect=EXPECT)
    assert covered == 16 and len(pieces) == 2


def test_chain_stops_at_a_hole(tmp_path):
    tokens = list(range(1, 41))
    save_blocks(tmp_path, tokens, blocks_kv(40), 8, skip=(1,))
    covered, pieces, _ = mv.plan_chain(tmp_path, tokens, block=8, expect=EXPECT)
    assert covered == 8 and len(pieces) == 1


def test_a_whole_prefix_slot_of_an_agent_counts(tmp_path):
    tokens = list(range(1, 41))
    pairs = blocks_kv(40)
    n, path = kv.save_prefix(tmp_path, [(k[:, :, :32], v[:, :, :32]) for k, v in pairs], tokens,
                             model_id=MODEL, block=8)
    assert n == 32
    covered, pieces, _ = mv.plan_chain(tmp_path, tokens, block=8, expect=EXPECT)
    assert covered == 32 and len(pieces) == 1 and pieces[0].start == 0


def test_a_slot_of_another_model_is_refused(tmp_path):
    tokens = list(range(1, 41))
    save_blocks(tmp_path, tokens, blocks_kv(40), 8, model="other/model")
    covered, pieces, refused = mv.plan_chain(tmp_path, tokens, block=8, expect=EXPECT)
    assert covered == 0 and pieces == []
    assert len(refused) == 5 and "model: expected 'org/model', found 'other/model'" in refused[0][1]


def test_agent_loads_the_chain_as_one_cache(tmp_path):
    torch = pytest.importorskip("torch")
    tokens = list(range(1, 41))
    pairs = blocks_kv(40)
    save_blocks(tmp_path, tokens, pairs, 8, upto=4)
    n, cache = mv.load_prefix(tmp_path, tokens, model=EXPECT, block=8, as_="tuple")
    assert n == 32 and len(cache) == L
    for (k, v), (k0, v0) in zip(cache, pairs):
        assert torch.equal(k, torch.from_numpy(k0[:, :, :32]))
        assert torch.equal(v, torch.from_numpy(v0[:, :, :32]))
    assert mv.load_prefix(tmp_path, [7] * 40, model=EXPECT, block=8) == (0, None)


def test_agent_refuses_another_models_blocks(tmp_path):
    pytest.importorskip("torch")
    tokens = list(range(1, 41))
    save_blocks(tmp_path, tokens, blocks_kv(40), 8)
    with pytest.raises(kv.KVMismatch) as e:
        mv.load_prefix(tmp_path, tokens, model=dict(EXPECT, layers="30"), block=8)
    assert e.value.field == "layers" and e.value.found == "3"


def test_pages_round_trip_in_the_cpu_backend_layout():
    """vLLM's CPU cache [pages, H, P, 2D] seen as [pages, H, 2P, D], keys
    transposed in each tile: a block written into pages 5 and 2 comes back whole;
    other pages are untouched; a layout of another backend is refused."""
    torch = pytest.importorskip("torch")
    P = 4
    cache = torch.zeros(8, H, P, 2 * D)
    view = mv.page_view(cache, P, H, D)
    k = torch.randn(H, 2 * P, D)
    v = torch.randn(H, 2 * P, D)
    mv._to_pages(view, [5, 2], k, v, P)
    got = mv._from_pages(view, [5, 2])                       # [2, H, 2P, D]
    k2, v2 = mv._pages_to_kv(got, P)
    assert torch.equal(k2[0], k) and torch.equal(v2[0], v)
    k3, v3 = mv._pages_to_kv(got.numpy(), P)
    assert np.array_equal(k3[0], k.numpy()) and np.array_equal(v3[0], v.numpy())
    # the backend's own reading: a tile holds K^T [D, P], then V [P, D]
    tile = cache[5].reshape(H, 2 * P * D)
    assert torch.equal(tile[:, :P * D].reshape(H, D, P), k[:, :P].transpose(1, 2))
    assert torch.equal(tile[:, P * D:].reshape(H, P, D), v[:, :P])
    assert int(torch.count_nonzero(cache[[0, 1, 3, 4, 6, 7]])) == 0
    with pytest.raises(ValueError, match="unsupported paged KV layout"):
        mv.page_view(torch.zeros(2, 8, P, H, D), P, H, D)
    assert mv.layer_index("model.layers.17.self_attn.attn") == 17
