"""The package's dependency rule, checked on the source of every module.

    cli → fuse → store → _native
    fuse may use federated (the .federated tree); federated and store use leaves;
    knobs, trace, stats, abi, private, top, cachectl are leaves (nothing of the
    package);
    client imports nothing of the daemon (only abi);
    only the CLI, tests and bench import testing/ and bench/;
    nothing below fuse imports pyfuse3 or trio.

Every import statement counts, at module level or inside a function.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "memosfs"

LEAVES = {"memosfs.knobs", "memosfs.trace", "memosfs.stats", "memosfs.abi",
          "memosfs.private", "memosfs.top", "memosfs.cachectl"}
NATIVE = {"memosfs._native", "memosfs._fuseshim"}

# layer -> the layers it may import (besides itself)
ALLOWED = {
    "leaf": set(),
    "store": {"leaf", "native"},
    "federated": {"leaf", "native"},
    "fuse": {"store", "federated", "leaf", "native"},
    "client": {"abi"},
    "cli": {"fuse", "store", "federated", "leaf", "native", "bench", "testing", "client"},
    "testing": {"fuse", "store", "federated", "leaf", "native", "client", "cli"},
    "bench": {"fuse", "store", "federated", "leaf", "native", "client", "testing", "cli"},
    "top": {"cli", "native", "client"},          # __init__, __main__, the old-name aliases
}
NO_FUSE_LIBS = {"store", "federated", "leaf", "client"}


def layer_of(module: str) -> str:
    if module in LEAVES:
        return "abi" if module == "memosfs.abi" else "leaf"
    if module in NATIVE:
        return "native"
    parts = module.split(".")
    if len(parts) >= 2 and parts[1] in ("fuse", "store", "federated", "client", "testing",
                                          "bench"):
        return parts[1]
    if module == "memosfs.cli":
        return "cli"
    return "top"


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """(line, imported module) for every import in source."""
    out = []
    base = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                root = base[:len(base) - node.level + 1]
                mod = ".".join(root + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod in ("memosfs",) or (node.level and not node.module):
                out += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, mod))
    return out


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    mine = layer_of(module)
    allowed = ALLOWED["leaf" if mine == "abi" else mine]
    if mine not in ("leaf", "abi"):
        allowed = allowed | {mine}          # a layer uses its own modules
    if "leaf" in allowed:
        allowed = allowed | {"abi"}         # abi is a leaf too
    bad = []
    for line, target in imports_of(source, module, is_package):
        top = target.split(".")[0]
        if mine in NO_FUSE_LIBS and top in ("pyfuse3", "trio"):
            bad.append(f"{module}:{line} imports {target} (no FUSE below memosfs.fuse)")
            continue
        if top != "memosfs" or target == "memosfs":
            continue
        theirs = layer_of(target)
        if theirs == "top" and target not in ("memosfs",):
            theirs = "top"
        if theirs not in allowed:
            bad.append(f"{module}:{line} ({mine}) imports {target} ({theirs})")
    return bad


def all_modules():
    for path in sorted(PKG.rglob("*.py")):
        yield path, module_name(path)


def test_every_module_keeps_the_dependency_rule():
    bad = []
    for path, module in all_modules():
        bad += violations(path.read_text(), module, path.name == "__init__.py")
    assert not bad, "imports that break the layering:\n" + "\n".join(bad)


def test_every_module_has_a_layer():
    seen = {layer_of(m) for _, m in all_modules()}
    assert {"leaf", "store", "fuse", "client", "testing", "bench", "cli"} <= seen


@pytest.mark.parametrize("module, source", [
    ("memosfs.store.store", "from memosfs.fuse.operations import MemosOperations\n"),
    ("memosfs.store.ssd", "def f():\n    from memosfs import cli\n"),
    ("memosfs.store.prefetch", "import pyfuse3\n"),
    ("memosfs.client.kv", "from memosfs.store import kvfile\n"),
    ("memosfs.fuse.operations", "from memosfs.testing import faults\n"),
    ("memosfs.fuse.operations", "from ..bench import io\n"),
    ("memosfs.knobs", "from memosfs.trace import Trace\n"),
    ("memosfs.federated.engine", "from memosfs.fuse.nodes import Slot\n"),
])
def test_the_check_catches_a_broken_rule(module, source):
    assert violations(source, module)


@pytest.mark.parametrize("module, source", [
    ("memosfs.fuse.operations", "from memosfs.store.store import Store\nimport pyfuse3\n"),
    ("memosfs.store.store", "from . import ssd\nfrom memosfs import _native\n"),
    ("memosfs.client.shared", "from memosfs.abi import MEMOS_IOC_ACK\n"),
    ("memosfs.cli", "from memosfs.bench import cli\n"),
])
def test_the_check_allows_the_rule(module, source):
    assert not violations(source, module)
