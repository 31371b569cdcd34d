"""The llama.cpp that `make engines-llama` built runs on any x86-64 machine of
its level, whatever CPU built it (issue 30: a build on a CPU with AMX, native
by llama.cpp's default, crashed on prompts of 256 tokens or more).

The check reads the machine code (memosfs/testing/isa.py: objdump of
llama-cpp-python's libraries, llama-server and the libraries it loads) and
llama.cpp's own report of its build (llama_print_system_info), so it says
the same on a build machine with AVX-512 and AMX as on one without: for the
default flavour, x86-64-v3, no AVX-512 (no EVEX instruction, no zmm or
opmask register), no AMX tile instruction, no VEX extension above AVX2; and
the AVX2/FMA code is there (not a baseline build by mistake).  After
`make engines-llama NATIVE=1` (flavour `native`) there is no level to check.
"""

from __future__ import annotations

import platform
import sys

import pytest

from memosfs.bench import engines_llamacpp as eng
from memosfs.testing import isa

pytestmark = [pytest.mark.engines,
              pytest.mark.skipif(eng.missing() is not None, reason=str(eng.missing()))]


def test_the_engines_flavour_is_recorded():
    flavour = eng.build_flavour()
    assert flavour is not None, f"{eng.FLAVOUR_FILE} is missing: `make engines-llama` writes it"
    if platform.machine() == "x86_64":
        assert flavour in isa.FLAVOURS, flavour


def test_the_built_llama_cpp_holds_nothing_above_its_level():
    flavour = eng.build_flavour()
    if flavour != isa.PORTABLE:
        pytest.skip(f"flavour {flavour}: built for the build machine's CPU, no level to check")
    server = eng.server_binary()
    files = isa.engine_files(sys.prefix, server)
    names = [f.name for f in files]
    assert any(n.startswith("libggml-cpu") for n in names), names
    if server is not None:
        assert any(str(f).endswith("llama-server") for f in files), names
    scans = [isa.scan(f) for f in files]
    info = isa.system_info(sys.executable)
    assert info, "llama_cpp does not import in this interpreter"
    assert isa.problems(flavour, scans, info) == []
    cpu = [s for s in scans if "libggml-cpu" in s["path"]]
    assert all(s["ymm"] > 0 and s["fma"] > 0 and s["f16c"] > 0 for s in cpu), cpu
    flags = isa.info_flags(info)
    assert flags.get("AVX2") == 1 and flags.get("FMA") == 1, info
    assert not any(v for k, v in flags.items() if k.startswith(("AVX512", "AMX"))), info
