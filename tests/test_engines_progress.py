"""`make engines-llama` shows its long compile's progress (issue 38, item 9):
scripts/install-engines-llama.sh runs pip verbosely into a log and prints a
line once cmake has configured and one per tenth of ninja's build steps; a
failed build prints the end of the log.  The script runs in a copy of the
tree whose `python` prints what pip -v prints (no compiling)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "install-engines-llama.sh"
STEPS = 40

# pip -v of llama-cpp-python: cmake's configure, then ninja's numbered steps;
# exits $FAIL_AT_END (0 by default)
FAKE_PYTHON = r"""#!/bin/sh
case "$*" in
  "-m pip install"*)
    build=$(echo "$*" | sed -n 's/.*build-dir=\([^ ]*\).*/\1/p')
    echo "Processing ./.engines/llama_cpp_python-0.3.36"
    echo "  -- Configuring done (1.0s)"
    echo "  -- Build files have been written to: $build"
    i=1
    while [ $i -le __STEPS__ ]; do
      echo "  [$i/__STEPS__] Building CXX object vendor/llama.cpp/src/part$i.cpp.o"
      i=$((i + 1))
    done
    if [ -n "${FAIL_AT_END:-}" ]; then echo "ninja: build stopped: subcommand failed."; exit 1; fi
    mkdir -p "$build" && touch "$build/CMakeCache.txt" "$STATE/installed"; exit 0 ;;
  "-m memosfs.testing.isa"*) exit 0 ;;
  *find_spec*) exit 0 ;;
  *llama-cpp-python*|*llama_cpp.__version__*)
    [ -f "$STATE/installed" ] && echo 0.3.36; exit 0 ;;
esac
echo "unexpected: python $*" >&2; exit 99
""".replace("__STEPS__", str(STEPS))

pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64", reason="x86-64 flavours")


@pytest.fixture
def tree(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(SCRIPT, tmp_path / "scripts")
    (tmp_path / ".engines" / "llama_cpp_python-0.3.36").mkdir(parents=True)
    py = tmp_path / "venv" / "bin" / "python"
    py.parent.mkdir(parents=True)
    py.write_text(FAKE_PYTHON)
    py.chmod(0o755)
    (tmp_path / "state").mkdir()
    return tmp_path


def _run(tree: Path, **env: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, STATE=str(tree / "state"), VENV=str(tree / "venv"), NATIVE="0",
               ENGINES="llama-cpp-python", **env)
    return subprocess.run(["bash", str(tree / "scripts" / SCRIPT.name)], env=env,
                          capture_output=True, text=True, timeout=60)


def test_the_compile_shows_its_progress_and_keeps_the_whole_output(tree):
    r = _run(tree)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.splitlines()
    assert any("progress below, the whole output in .engines/llama-cpp-python-build.log"
               in ln for ln in out), r.stdout
    assert any(re.fullmatch(r"engines-llama:   llama\.cpp: configured; compiling "
                            r"\(\d+ s so far\)", ln) for ln in out), r.stdout
    shown = [int(m.group(1)) for ln in out
             if (m := re.fullmatch(rf"engines-llama:   llama\.cpp: (\d+) of {STEPS} build "
                                   rf"steps \(\d+%\), \d+ s so far", ln))]
    assert shown == [STEPS * k // 10 for k in range(1, 11)], r.stdout
    log = (tree / ".engines" / "llama-cpp-python-build.log").read_text()
    assert log.count("Building CXX object") == STEPS     # the whole output, in the log
    assert "Building CXX object" not in r.stdout


def test_a_failed_compile_says_so_with_the_end_of_its_log(tree):
    r = _run(tree, FAIL_AT_END="1")
    assert r.returncode == 1
    assert "engines-llama: building llama-cpp-python failed; the end of " \
           ".engines/llama-cpp-python-build.log:" in r.stderr
    assert "ninja: build stopped: subcommand failed." in r.stderr
    assert "llama-cpp-python built in" not in r.stdout
