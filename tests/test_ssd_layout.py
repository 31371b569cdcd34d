"""The SSD tier's structure (memosfs/store/ssd/, docs/layout.md): the tier
and one module per kind of entry, none over 1,200 lines nor a class over
600; the kinds never import the tier (no circle: they reach it through the
object it hands them); nothing outside a kind's module tests which kind an
entry is (isinstance of an entry class); every kind has the operations the
tier calls through its table."""

from __future__ import annotations

import ast
from pathlib import Path

SSD = Path(__file__).resolve().parent.parent / "memosfs" / "store" / "ssd"
STORE = SSD.parent
KINDS = {"whole", "logged", "packed"}
# what a kind's module may import of the package
KIND_IMPORTS = {"format", "fileio", "whole"}
ENTRY_CLASSES = {"SSDEntry", "PackedEntry"}
OPERATIONS = ("load_into", "prefetch", "report_corrupt", "rename", "rewrite_meta", "fsync",
              "check", "reader", "read_resident", "backing", "drop_log", "unlink")


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _package_imports(tree: ast.Module) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("memosfs.store.ssd."):
                out.add(node.module.rsplit(".", 1)[1])
            elif node.module == "memosfs.store.ssd":
                out |= {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name.rsplit(".", 1)[1] for a in node.names
                    if a.name.startswith("memosfs.store.ssd.")}
    return out


def test_no_module_over_1200_lines_nor_class_over_600():
    big = []
    for path in sorted(SSD.glob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > 1200:
            big.append(f"{path.name}: {len(text.splitlines())} lines")
        for node in _tree(path).body:
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > 600:
                big.append(f"{path.name}: class {node.name} "
                           f"{node.end_lineno - node.lineno + 1} lines")
    assert big == []
    assert not (STORE / "ssd.py").exists() and not (STORE / "segments.py").exists()


def test_the_kinds_do_not_import_the_tier():
    for kind in sorted(KINDS | {"format", "fileio"}):
        got = _package_imports(_tree(SSD / f"{kind}.py"))
        assert got <= KIND_IMPORTS - {kind}, f"{kind}.py imports {sorted(got)}"


def test_no_kind_test_outside_the_kinds_modules():
    """isinstance(x, SSDEntry or PackedEntry) only in the module that
    defines the kind (packed.py: its records)."""
    found = []
    for path in sorted(STORE.rglob("*.py")):
        if path.parent == SSD and path.stem in KINDS:
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" \
                    and len(node.args) == 2:
                names = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)} | \
                    {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
                if names & ENTRY_CLASSES:
                    found.append(f"{path.relative_to(STORE)}:{node.lineno}")
    assert found == []


def test_every_kind_has_the_operations_of_the_table(tmp_path):
    from memosfs.store.ssd import SSDTier
    tier = SSDTier(str(tmp_path))
    assert set(tier.kinds) == {"file", "logged", "packed"}
    for name, kind in tier.kinds.items():
        missing = [op for op in OPERATIONS if not callable(getattr(kind, op, None))]
        assert missing == [], f"{name}: {missing}"
        assert isinstance(kind.FILE, bool) and isinstance(kind.RESIDENT, bool)
