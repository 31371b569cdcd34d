"""The memosfs command outside a mount: calc-size, option parsing, help."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from memosfs.cli import calc_size, parse_mount_options
from memosfs.knobs import KNOBS


def memosfs(*args):
    return subprocess.run([sys.executable, "-m", "memosfs", *args], capture_output=True,
                          text=True)


def test_calc_size_design_example():
    # docs/design.md, "Sizing": 2048 tokens, 12 layers, width 768, fp16, 2x redundancy.
    r = memosfs("calc-size", "--tokens", "2048", "--layers", "12", "--hidden", "768",
                "--dtype", "fp16", "--redundancy", "2")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[0] == "150994944"
    assert calc_size(2048, 12, 768, 2, 2) == 2048 * 12 * 768 * 2 * 2 * 2


def test_calc_size_gqa_and_json():
    # Llama-3-8B: 32 layers, 8 KV heads x 128, fp16, one 512-token block = 64 MiB
    r = memosfs("calc-size", "--tokens", "512", "--layers", "32", "--kv-heads", "8",
                "--head-dim", "128", "--dtype", "fp16", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["bytes"] == 64 * 1024 * 1024 and out["kv_width"] == 1024


@pytest.mark.parametrize("args", [
    ["--tokens", "10", "--layers", "2"],                          # no width
    ["--tokens", "10", "--layers", "2", "--hidden", "8", "--dtype", "fp7"],
    ["--tokens", "0", "--layers", "2", "--hidden", "8"],
])
def test_calc_size_refuses_bad_input(args):
    r = memosfs("calc-size", *args)
    assert r.returncode == 2 and r.stderr.startswith("memosfs calc-size: ")


def test_mount_options_split():
    knobs, own, fuse = parse_mount_options(["capacity=1G,evict_batch=24,ssd=/x",
                                            "allow_other,nofail,log=/l,fsname=m"])
    assert knobs == {"capacity": 1 << 30, "evict_batch": 24}
    assert own == {"ssd": "/x", "log": "/l"}
    assert fuse == {"allow_other", "fsname=m"}
    with pytest.raises(SystemExit, match="evict_batch"):
        parse_mount_options(["evict_batch=banana"])


def test_help_lists_subcommands():
    r = memosfs("--help")
    assert r.returncode == 0
    for word in ("umount", "stat", "calc-size", "bench"):
        assert word in r.stdout


def test_the_knobs_page_table_comes_from_the_knob_table():
    from pathlib import Path

    from memosfs.cli import knob_table_markdown
    page = (Path(__file__).resolve().parent.parent / "docs" / "knobs.md").read_text()
    assert knob_table_markdown() in page


def _cells(row: str) -> list[str]:
    """A GitHub-style table row's cells: split at `|` not escaped as `\\|`."""
    import re
    return [c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def test_every_knob_row_has_five_cells_in_a_github_renderer():
    """Choices and meanings hold no bare `|` (it would end a cell: 7 knobs
    lost their meaning so); `memosfs knobs --markdown` prints the same."""
    from memosfs.cli import knob_table_markdown
    table = knob_table_markdown()
    assert memosfs("knobs", "--markdown").stdout == table
    rows = table.splitlines()
    assert len(rows) == 2 + len(KNOBS)
    for row, knob in zip(rows[2:], KNOBS):
        cells = _cells(row)
        assert len(cells) == 5, row
        assert cells[0] == f"`{knob.name}`" and cells[4] == knob.meaning.replace("|", "\\|")
    assert _cells(rows[2 + [k.name for k in KNOBS].index("evict_policy")])[2] == \
        "lru_lfu, lru or lfu"
    assert _cells("| a \\| b | c |") == ["a \\| b", "c"]
