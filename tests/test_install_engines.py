"""scripts/install-engines-llama.sh's build flavour, without compiling
llama.cpp (~23 min): the script runs in a copy of the tree with `python`
and `cmake` replaced by recorders that do what pip and cmake would leave
behind (an installed llama-cpp-python, a build folder, a llama-server).

  - the default is portable: llama-cpp-python and llama-server are configured
    with -DGGML_NATIVE=OFF, AVX2/FMA/F16C on, every AVX-512 and AMX option off;
  - a build with no record of its flavour (every build before the record
    existed: native, llama.cpp's default) or of another flavour is removed
    (pip uninstall, build folders, llama-server) and built again;
  - the same flavour again builds nothing; NATIVE=1 rebuilds with
    -DGGML_NATIVE=ON; the built code is checked (python -m memosfs.testing.isa)
    against the flavour."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "install-engines-llama.sh"

# `python` as the script calls it: each call is logged (with CMAKE_ARGS); the answers
# are those of a venv where llama-cpp-python is installed when $STATE/installed exists.
FAKE_PYTHON = r"""#!/bin/sh
echo "python $* CMAKE_ARGS=${CMAKE_ARGS:-}" >> "$STATE/log"
case "$*" in
  "-m pip uninstall"*) rm -f "$STATE/installed"; exit 0 ;;
  "-m pip install"*)
    build=$(echo "$*" | sed -n 's/.*build-dir=\([^ ]*\).*/\1/p')
    mkdir -p "$build" && touch "$build/CMakeCache.txt" "$STATE/installed"; exit 0 ;;
  "-m memosfs.testing.isa"*) exit 0 ;;
  *find_spec*) exit 0 ;;
  *llama-cpp-python*|*llama_cpp.__version__*)
    [ -f "$STATE/installed" ] && echo 0.3.36; exit 0 ;;
esac
echo "unexpected: python $*" >&2; exit 99
"""
FAKE_CMAKE = r"""#!/bin/sh
echo "cmake $*" >> "$STATE/log"
if [ "$1" = --build ]; then
  mkdir -p "$2/bin" && printf '#!/bin/sh\n' > "$2/bin/llama-server" && chmod +x "$2/bin/llama-server"
fi
"""

NATIVE_OFF = "-DGGML_NATIVE=OFF"
PORTABLE_ON = ("-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON")
PORTABLE_OFF = ("-DGGML_AVX512=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF",
                "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AVX_VNNI=OFF")

pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 flavours")


@pytest.fixture
def tree(tmp_path):
    """A copy of the script in a tree with the sdist unpacked (nothing is
    downloaded), a venv whose python is the recorder, cmake the other."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts")
    (tmp_path / ".engines" / "llama_cpp_python-0.3.36" / "vendor" / "llama.cpp").mkdir(parents=True)
    for name, text in (("venv/bin/python", FAKE_PYTHON), ("tools/cmake", FAKE_CMAKE)):
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        p.chmod(0o755)
    (tmp_path / "state").mkdir()
    return tmp_path


def _install(tree: Path, native: str = "0") -> tuple[str, list[str]]:
    log = tree / "state" / "log"
    log.write_text("")
    env = dict(os.environ, STATE=str(tree / "state"), VENV=str(tree / "venv"), NATIVE=native,
               ENGINES="llama-cpp-python llama-server",
               PATH=f"{tree / 'tools'}{os.pathsep}{os.environ['PATH']}")
    r = subprocess.run(["bash", str(tree / "scripts" / SCRIPT.name)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout, log.read_text().splitlines()


def _calls(log: list[str], start: str) -> list[str]:
    return [ln for ln in log if ln.startswith(start)]


def test_an_unrecorded_native_build_is_replaced_by_a_portable_one(tree):
    # what an older `make engines-llama` left: installed, a build folder, llama-server; no record
    build = tree / ".engines" / "llama-build"
    build.mkdir()
    (build / "CMakeCache.txt").write_text("GGML_NATIVE:BOOL=ON\n")
    (tree / ".engines" / "bin").mkdir()
    (tree / ".engines" / "bin" / "llama-server").symlink_to(build / "bin" / "llama-server")
    (tree / "state" / "installed").touch()

    out, log = _install(tree)
    assert "unrecorded" in out and "removing it to rebuild" in out
    assert _calls(log, "python -m pip uninstall -q -y llama-cpp-python")
    [pip] = _calls(log, "python -m pip install")
    assert NATIVE_OFF in pip and all(f in pip for f in PORTABLE_ON + PORTABLE_OFF), pip
    server = [c for c in _calls(log, "cmake -S") if "LLAMA_BUILD_SERVER=ON" in c]
    assert len(server) == 1 and NATIVE_OFF in server[0]
    assert all(f in server[0] for f in PORTABLE_ON + PORTABLE_OFF), server
    assert "GGML_NATIVE=ON" not in "\n".join(log)
    [check] = _calls(log, "python -m memosfs.testing.isa")
    assert "--flavour x86-64-v3" in check
    assert (tree / ".engines" / "llama-flavour").read_text().startswith("x86-64-v3 -DGGML_NATIVE=OFF")
    assert os.access(tree / ".engines" / "bin" / "llama-server", os.X_OK)

    # the same flavour again: nothing is built, the check runs
    out, log = _install(tree)
    assert "removing" not in out
    assert not _calls(log, "python -m pip install") and not _calls(log, "cmake")
    assert _calls(log, "python -m memosfs.testing.isa --flavour x86-64-v3")


def test_native_1_rebuilds_for_the_build_machine_and_back(tree):
    _install(tree)
    out, log = _install(tree, native="1")
    assert "this one is native: removing it to rebuild" in out
    [pip] = _calls(log, "python -m pip install")
    assert "-DGGML_NATIVE=ON" in pip and NATIVE_OFF not in pip
    assert _calls(log, "python -m memosfs.testing.isa --flavour native")
    assert (tree / ".engines" / "llama-flavour").read_text().startswith("native ")

    out, log = _install(tree, native="0")
    assert "build here is native, this one is x86-64-v3" in out
    [pip] = _calls(log, "python -m pip install")
    assert NATIVE_OFF in pip


def test_an_unknown_native_value_is_refused(tree):
    env = dict(os.environ, STATE=str(tree / "state"), VENV=str(tree / "venv"), NATIVE="maybe")
    r = subprocess.run(["bash", str(tree / "scripts" / SCRIPT.name)], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "NATIVE=maybe" in r.stderr
