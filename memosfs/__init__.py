"""memosfs: a KV-cache memory for LLM agents, mounted as a filesystem.

The public surface: `memosfs.cli.main` (the `memosfs` command), `Store`
(slots over the C core) and `MemosOperations` (the pyfuse3 handlers).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
