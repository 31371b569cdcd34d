"""The engines' portability check (memosfs/testing/isa.py) on code compiled
here for known levels: a library built for x86-64-v3 passes, the same source
built with AVX-512, AVX-VNNI or AMX fails and the instructions are named.
The check reads machine code (objdump), so it answers the same on any CPU;
`make test-engines` runs it on the real engines (tests/engines/test_built_isa.py)."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys

import pytest

from memosfs.testing import isa

pytestmark = pytest.mark.skipif(
    platform.machine() != "x86_64" or not shutil.which("gcc") or not shutil.which("objdump"),
    reason="needs x86-64, gcc and objdump")

AXPY = """
void axpy(float *restrict y, const float *restrict x, float a, int n)
{ for (int i = 0; i < n; i++) y[i] += a * x[i]; }
"""
AMX = """
#include <immintrin.h>
void tile(const void *a, const void *b, void *c, const void *cfg) {
    _tile_loadconfig(cfg); _tile_loadd(1, a, 64); _tile_loadd(2, b, 64); _tile_zero(0);
    _tile_dpbssd(0, 1, 2); _tile_stored(0, c, 64); _tile_release(); }
"""
VNNI = """
#include <immintrin.h>
__m256i dot(__m256i acc, __m256i a, __m256i b) { return _mm256_dpbusd_avx_epi32(acc, a, b); }
"""
OPMASK = """
#include <immintrin.h>
unsigned short mask(__m512 a, __m512 b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
"""


def _lib(tmp_path, name: str, source: str, *flags: str):
    c = tmp_path / f"{name}.c"
    c.write_text(source)
    so = tmp_path / f"lib{name}.so"
    subprocess.run(["gcc", "-O3", "-shared", "-fPIC", *flags, str(c), "-o", str(so)], check=True)
    return so


def _check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memosfs.testing.isa", *args],
                          capture_output=True, text=True, timeout=120)


def test_a_library_built_for_x86_64_v3_passes_and_its_avx2_fma_is_seen(tmp_path):
    so = _lib(tmp_path, "v3", AXPY, "-march=x86-64-v3")
    s = isa.scan(so)
    assert s["instructions"] > 0 and s["ymm"] > 0 and s["fma"] > 0
    assert (s["amx"], s["avx512"], s["above_v3_vex"]) == (0, 0, 0)
    assert isa.problems(isa.PORTABLE, [s]) == []
    r = _check("--flavour", "x86-64-v3", str(so))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "nothing above the level" in r.stdout


@pytest.mark.parametrize("name,source,flags,kind,example", [
    ("avx512", AXPY, ("-march=x86-64-v3", "-mavx512f", "-mprefer-vector-width=512"),
     "avx512", "%zmm"),
    ("opmask", OPMASK, ("-march=x86-64-v3", "-mavx512f"), "avx512", "%k"),
    ("amx", AMX, ("-mamx-tile", "-mamx-int8"), "amx", "tileloadd"),
    ("avxvnni", VNNI, ("-march=x86-64-v3", "-mavxvnni"), "above_v3_vex", "vpdpbusd"),
])
def test_code_above_x86_64_v3_fails_the_portable_check_and_is_named(tmp_path, name, source,
                                                                    flags, kind, example):
    so = _lib(tmp_path, name, source, *flags)
    s = isa.scan(so)
    assert s[kind] > 0, s
    assert any(example in e for e in s["examples"][kind]), s["examples"]
    bad = isa.problems(isa.PORTABLE, [s])
    assert len(bad) == 1 and str(so) in bad[0] and kind in bad[0]
    assert isa.problems("native", [s]) == []          # native: whatever the build machine has
    r = _check("--flavour", "x86-64-v3", str(so))
    assert r.returncode == 1 and "ABOVE THE LEVEL" in r.stderr and example in r.stderr


def test_llama_cpps_own_report_is_read():
    info = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
            "AVX512 = 0 | AMX_INT8 = 0 | LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |")
    assert isa.info_flags(info)["AVX2"] == 1 and isa.info_flags(info)["AVX512"] == 0
    assert isa.problems(isa.PORTABLE, [], info) == []
    native = info.replace("AVX512 = 0", "AVX512 = 1 | AVX512_VNNI = 1").replace(
        "AMX_INT8 = 0", "AMX_INT8 = 1")
    bad = isa.problems(isa.PORTABLE, [], native)
    assert len(bad) == 1 and "AMX_INT8" in bad[0] and "AVX512_VNNI" in bad[0]
    assert isa.problems("native", [], native) == []


def test_nothing_to_check_is_an_error(tmp_path):
    r = _check("--venv", str(tmp_path))
    assert r.returncode == 2 and "nothing to check" in r.stderr
