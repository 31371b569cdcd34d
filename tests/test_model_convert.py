"""The converted model names every weight, the tied pair included
(memosfs/testing/models.py): vLLM reads `model.embed_tokens.weight` itself, and a
copy converted before that is completed in place without the GGUF."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from memosfs.testing import models


def header_names(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    meta = h.pop("__metadata__", None)
    return set(h), meta


def old_style_copy(d, keep="lm_head.weight"):
    """A directory as the old conversion left it: one name of the tied pair,
    the other only as safetensors' alias note in the metadata."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    emb = rng.standard_normal((16, 4)).astype(np.float32)
    other = "model.embed_tokens.weight" if keep == "lm_head.weight" else "lm_head.weight"
    d.mkdir()
    save_file({keep: emb, "model.norm.weight": np.ones(4, np.float32)},
              str(d / "model.safetensors"), metadata={other: keep})
    return emb


@pytest.mark.parametrize("keep", ["lm_head.weight", "model.embed_tokens.weight"])
def test_old_copy_is_completed_in_place(tmp_path, keep):
    from safetensors.numpy import load_file

    d = tmp_path / "smollm2"
    emb = old_style_copy(d, keep)
    missing = models.missing_tied_weights(d)
    assert missing == [({"lm_head.weight", "model.embed_tokens.weight"} - {keep}).pop()]
    # convert() completes it without the GGUF (the copy exists)
    assert models.convert(d) == d
    names, meta = header_names(d / "model.safetensors")
    assert {"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"} <= names
    assert meta == {"format": "pt"}
    state = load_file(str(d / "model.safetensors"))
    assert np.array_equal(state["lm_head.weight"], emb)
    assert np.array_equal(state["model.embed_tokens.weight"], emb)
    assert (d / "model.safetensors").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in d.iterdir()] == ["model.safetensors"]     # no temporary left
    assert models.missing_tied_weights(d) == []
    assert models.ensure_tied_weights(d) is False                     # nothing to do twice


MODEL_REASON = models.model_missing()


@pytest.mark.model
@pytest.mark.skipif(MODEL_REASON is not None, reason=MODEL_REASON or "")
def test_converted_smollm2_has_both_tied_names_and_loads_alike():
    """The real copy has model.embed_tokens.weight and lm_head.weight, equal;
    transformers loads it with the output projection equal to the embedding."""
    import torch
    from safetensors import safe_open

    d = models.convert()
    names, _ = header_names(d / "model.safetensors")
    assert {"lm_head.weight", "model.embed_tokens.weight"} <= names
    with safe_open(str(d / "model.safetensors"), framework="pt") as f:
        assert torch.equal(f.get_tensor("lm_head.weight"), f.get_tensor("model.embed_tokens.weight"))
        emb = f.get_tensor("model.embed_tokens.weight")
    model, tok = models.load_model()
    assert torch.equal(model.get_input_embeddings().weight, emb)
    assert torch.equal(model.get_output_embeddings().weight, emb)
    ids = tok("The cache remembers", return_tensors="pt").input_ids
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == ids.shape[1] + 4 and int(out[0, -4:].max()) > 0
