"""`memosfs bench NAME ...`: the registry of benchmark parsers.

Each benchmark module exposes `add_parsers(bsub)`, which adds its
subcommands (with `fn` set) to the `bench` subparsers; this module lists the
modules in the order `memosfs bench -h` shows them.  memosfs/cli.py calls
`add_parser(sub)`.  A module whose optional dependencies are missing
(federated: numpy) is left out.

May call: every memosfs.bench module (and nothing imports this but the CLI).
"""

from __future__ import annotations

import importlib

# (module, optional): an optional module that does not import is left out
BENCHES = (
    ("io", False),
    ("clients", False),         # torch, safetensors optional (patterns skipped)
    ("engines", False),         # the engines optional (reported skipped)
    ("persist", False),
    ("ssd", False),
    ("policy", False),
    ("native", False),
    ("kv", False),
    ("coherence", False),
    ("prefetch", False),
    ("remote", False),
    ("federated", True),        # numpy (the `federated` extra)
)


def add_parser(sub) -> None:
    b = sub.add_parser("bench", help="benchmarks (JSON, with a baseline in the same run)")
    bsub = b.add_subparsers(dest="bench_cmd", required=True)
    for name, optional in BENCHES:
        try:
            mod = importlib.import_module(f"memosfs.bench.{name}")
        except ImportError:
            if not optional:
                raise
            continue
        mod.add_parsers(bsub)
