"""memosfs: a KV-cache memory for LLM agents, mounted as a filesystem.

The public surface: `memosfs.cli.main` (the `memosfs` command), `Store`
(slots over the C core) and `MemosOperations` (the pyfuse3 handlers).
"""

__version__ = "0.1.0"

__all__ = ["__version__"]


def _preload_fuse_shim() -> None:
    """Load memosfs._fuseshim with RTLD_GLOBAL before anything imports
    pyfuse3, so that pyfuse3's session gets fallocate and the flusher's pid
    (native/fuse/interpose.c explains how)."""
    import os
    import sys
    if "pyfuse3" in sys.modules:
        return
    flags = sys.getdlopenflags()
    sys.setdlopenflags(flags | os.RTLD_GLOBAL)
    try:
        from memosfs import _fuseshim  # noqa: F401
    except ImportError:
        pass                    # not built: fallocate stays EOPNOTSUPP
    finally:
        sys.setdlopenflags(flags)


_preload_fuse_shim()
