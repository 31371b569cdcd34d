# memosfs — the two commands are `make run` and `make test`.
#
#   make run    install what is missing, build, mount at $(MOUNT) (foreground; Ctrl-C unmounts)
#   make test   install what is missing, build, run the C unit tests and the pytest suite
#
# Variables: MOUNT=/mnt/memos SSD=/var/lib/memosfs/memos OPTS=capacity=1G,evict_batch=16

PYTHON   ?= python3
VENV     ?= .venv
PY       := $(VENV)/bin/python
MOUNT    ?= /mnt/memos
SSD      ?= /var/lib/memosfs/memos
OPTS     ?=
APT_PKGS := fuse3 libfuse3-dev pkg-config attr gcc make
NATIVE   := $(wildcard native/*.c native/*.h)
PYTEST_ARGS ?=

.PHONY: run test deps system-deps build test-c test-py test-sanitize mount-helper clean bench

run: deps build
	@mkdir -p $(MOUNT) $(SSD)
	$(VENV)/bin/memosfs memos $(MOUNT) -f -o ssd=$(SSD)$(if $(OPTS),$(comma)$(OPTS))

comma := ,

test: deps build test-c test-py

deps: system-deps $(VENV)/.installed

# apt-get only when a package is missing (a fresh machine), never on every run.
system-deps:
	@missing=""; for p in $(APT_PKGS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

$(VENV)/.installed: pyproject.toml setup.py
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel
	$(PY) -m pip install -q -e '.[test]'
	@touch $@

# The extension module, rebuilt when a native source changes.
build: memosfs/_native.stamp

memosfs/_native.stamp: $(NATIVE) setup.py $(VENV)/.installed
	$(PY) setup.py -q build_ext --inplace
	@touch $@

test-c:
	$(MAKE) -C native test

test-sanitize:
	$(MAKE) -C native test-sanitize

test-py: build
	$(PY) -m pytest -q $(PYTEST_ARGS) tests

# Put `memosfs` where mount(8) finds it (mount.fuse3 runs it with a standard PATH).
mount-helper: deps build
	sh mountscripts/install.sh $(CURDIR)/$(VENV)/bin/memosfs

bench: deps build
	$(VENV)/bin/memosfs bench io --json

clean:
	rm -rf build native/build memosfs/_native*.so memosfs/_native.stamp *.egg-info
