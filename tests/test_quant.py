"""Quantized storage of safetensors slots: the codec alone, then on a mount."""

from __future__ import annotations

import os

import numpy as np
import pytest
from safetensors.numpy import load, save

from memosfs.store import kvfile

MiB = 1 << 20


def kv_file(layers=3, heads=3, tokens=256, dim=64, dtype=np.float32, seed=0, outliers=True):
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(layers):
        k = rng.standard_normal((1, heads, tokens, dim)).astype(np.float32)
        if outliers:   # a few channels much larger, as real keys have
            k *= np.where(rng.random((1, heads, 1, dim)) > 0.9, 8.0, 1.0).astype(np.float32)
        v = rng.standard_normal((1, heads, tokens, dim)).astype(np.float32)
        tensors[f"layers.{i}.key"] = k.astype(dtype)
        tensors[f"layers.{i}.value"] = v.astype(dtype)
    tensors["token_ids"] = np.arange(tokens, dtype=np.int64)
    return tensors, save(tensors, metadata={"model": "test", "tokens": str(tokens)})


def rel_err(a, b):
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(a)


@pytest.mark.parametrize("scheme", kvfile.SCHEMES)
def test_roundtrip_keeps_header_shapes_and_dtypes(scheme):
    tensors, raw = kv_file()
    r = kvfile.encode(memoryview(raw), scheme, 1.0)
    assert r is not None and r.quantized == 6 and r.fallbacks == 0
    logical = kvfile.decode(memoryview(r.container))
    assert logical == r.logical and len(logical) == len(raw)
    assert logical[:8 + int.from_bytes(raw[:8], "little")] == raw[:8 + int.from_bytes(raw[:8], "little")]
    back = load(logical)
    assert set(back) == set(tensors)
    for name, x in tensors.items():
        assert back[name].shape == x.shape and back[name].dtype == x.dtype
    assert (back["token_ids"] == tensors["token_ids"]).all()       # not a float: exact
    assert len(r.container) < len(raw)


def test_error_bounds_and_scheme_order():
    tensors, raw = kv_file()
    errs = {}
    for scheme in kvfile.SCHEMES:
        back = load(kvfile.decode(memoryview(kvfile.encode(memoryview(raw), scheme, 1.0).container)))
        errs[scheme] = max(rel_err(tensors[n], back[n]) for n in tensors if "layers" in n)
    # keys per channel / values per token beat one scale per tensor by far
    assert errs["int8"] < 0.01
    assert errs["int8"] * 2 < errs["int8-layer"]
    assert errs["int4"] < 0.12


def test_sizes_against_fp16_and_fp32():
    _, raw32 = kv_file(dtype=np.float32, tokens=512)
    _, raw16 = kv_file(dtype=np.float16, tokens=512)
    r8 = kvfile.encode(memoryview(raw16), "int8", 1.0)
    r4 = kvfile.encode(memoryview(raw16), "int4", 1.0)
    assert len(r8.container) <= 0.52 * len(raw16)
    assert len(r4.container) <= 0.33 * len(raw16)
    assert len(kvfile.encode(memoryview(raw32), "int8", 1.0).container) <= 0.27 * len(raw32)


def test_bfloat16_roundtrip():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 64, 32)).astype(np.float32)
    bf = (x.view(np.uint32) >> 16).astype(np.uint16)             # truncate to bf16
    header = b'{"layers.0.key":{"dtype":"BF16","shape":[1,2,64,32],"data_offsets":[0,%d]}}' % bf.nbytes
    header += b" " * ((8 - len(header) % 8) % 8)
    raw = len(header).to_bytes(8, "little") + header + bf.tobytes()
    r = kvfile.encode(memoryview(raw), "int8", 1.0)
    logical = kvfile.decode(memoryview(r.container))
    back = np.frombuffer(logical[8 + len(header):], dtype=np.uint16).astype(np.uint32) << 16
    ref = bf.astype(np.uint32) << 16
    assert rel_err(ref.view(np.float32).ravel(), back.view(np.float32)) < 0.01


def test_fallback_keeps_full_precision():
    tensors, raw = kv_file()
    r = kvfile.encode(memoryview(raw), "int8-layer", 0.02)     # per-tensor error ~3%: too much
    assert r.fallbacks > 0
    r = kvfile.encode(memoryview(raw), "int8", 0.02)
    assert r.fallbacks == 0
    mixed = kvfile.encode(memoryview(raw), "int8-layer", 0.025)
    if mixed.container is not None:
        back = load(kvfile.decode(memoryview(mixed.container)))
        exact = [n for n in tensors if "layers" in n and (back[n] == tensors[n]).all()]
        assert len(exact) == mixed.fallbacks


@pytest.mark.parametrize("blob", [b"", b"hello world" * 100, b"\xff" * 64,
                                  (10).to_bytes(8, "little") + b"{not json}"])
def test_not_safetensors_is_left_alone(blob):
    assert kvfile.encode(memoryview(blob), "int8", 0.03) is None


def test_nothing_quantized_still_counts_fallbacks():
    _, raw = kv_file()
    r = kvfile.encode(memoryview(raw), "int8", 1e-6)
    assert r.container is None and r.fallbacks == 6 and r.quantized == 0


def test_damaged_container_is_refused():
    _, raw = kv_file()
    c = bytearray(kvfile.encode(memoryview(raw), "int8", 1.0).container)
    c[20] ^= 0xFF
    with pytest.raises(ValueError):
        kvfile.decode(memoryview(bytes(c)))


# ---------------------------------------------------------------- on a mount


def session(m):
    m.p("a").mkdir(exist_ok=True)
    m.p("a", "s").mkdir(exist_ok=True)
    return m.p("a", "s")


def test_quantized_slot_on_the_mount(make_mount):
    m = make_mount(capacity="64M", quantize="int8")
    s = session(m)
    tensors, raw = kv_file(dtype=np.float16, tokens=512)
    (s / "kv").write_bytes(raw)
    st = os.stat(s / "kv")
    assert st.st_size == len(raw)                               # logical size
    stored = int(os.getxattr(s / "kv", "user.memos.stored_bytes"))
    assert stored <= 0.55 * len(raw)
    assert st.st_blocks * 512 <= 0.55 * len(raw)
    back = load((s / "kv").read_bytes())
    for name, x in tensors.items():
        assert back[name].dtype == x.dtype and back[name].shape == x.shape
        if "layers" in name:
            assert rel_err(x, back[name]) < 0.03
    assert m.stats()["quant_tensors"] == 6
    # opaque bytes stay exact
    (s / "blob").write_bytes(b"\x00\x01" * 5000)
    assert (s / "blob").read_bytes() == b"\x00\x01" * 5000
    # an append to a quantized slot starts from its logical bytes
    with open(s / "kv", "ab") as f:
        f.write(b"tail")
    data = (s / "kv").read_bytes()
    assert len(data) == len(raw) + 4 and data.endswith(b"tail")


def test_quantized_slot_survives_restart_and_eviction(make_mount):
    m = make_mount(capacity="8M", quantize="int4", evict_batch=1, evict_policy="lru")
    s = session(m)
    tensors, raw = kv_file(dtype=np.float32, tokens=256)
    (s / "kv").write_bytes(raw)
    first = (s / "kv").read_bytes()
    for i in range(12):                                          # push it out to the SSD
        (s / f"filler{i}").write_bytes(os.urandom(MiB))
    assert os.getxattr(s / "kv", "user.memos.tier") == b"ssd"
    assert (s / "kv").read_bytes() == first                      # promoted, decoded alike
    m.stop()
    m2 = make_mount(ssd=str(m.ssd), capacity="8M", warmup_ratio="0")
    again = m2.p("a", "s", "kv")
    assert os.stat(again).st_size == len(raw)
    assert again.read_bytes() == first


def test_fallbacks_are_counted(make_mount):
    m = make_mount(quantize="int8-layer", quant_error_max="0.001")
    s = session(m)
    tensors, raw = kv_file()
    (s / "kv").write_bytes(raw)
    assert (s / "kv").read_bytes() == raw                        # all kept exact
    assert m.stats()["quant_fallbacks"] == 6


def test_quantize_knob_values(make_mount):
    import subprocess
    m = make_mount()
    knob = m.ctl("quantize")
    assert knob.read_text() == "off\n"
    assert subprocess.run(["sh", "-c", f"echo int4 > {knob}"]).returncode == 0
    assert knob.read_text() == "int4\n"
    assert subprocess.run(["sh", "-c", f"echo int3 > {knob}"], capture_output=True).returncode != 0
    assert m.ctl("quant_error_max").read_text() == "auto\n"
    assert subprocess.run(["sh", "-c", f"echo 2 > {m.ctl('quant_error_max')}"],
                          capture_output=True).returncode != 0
