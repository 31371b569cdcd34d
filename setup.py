"""Build the C core (native/) as the extension module memosfs._native."""
import glob
import os
import subprocess

from setuptools import Extension, setup

CFLAGS = ["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
          "-fvisibility=hidden"]
if os.environ.get("MEMOS_SANITIZE"):
    CFLAGS += ["-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"]

sources = sorted(glob.glob("native/*.c")) + sorted(glob.glob("native/policies/*.c"))


def _pkg_includes(pkg: str) -> list[str]:
    try:
        out = subprocess.run(["pkg-config", "--cflags-only-I", pkg], capture_output=True,
                             text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return ["/usr/include/fuse3"]
    return [f[2:] for f in out.split() if f.startswith("-I")]


FUSE_INCLUDES = _pkg_includes("fuse3")

setup(
    ext_modules=[
        Extension(
            "memosfs._native",
            sources=sources,
            depends=sorted(glob.glob("native/*.h")) + sorted(glob.glob("native/policies/*.h")),
            include_dirs=["native"],
            extra_compile_args=CFLAGS,
            libraries=["pthread"],
        ),
        # fallocate and the flusher's pid for pyfuse3 (loaded before it, RTLD_GLOBAL)
        Extension(
            "memosfs._fuseshim",
            sources=sorted(glob.glob("native/fuse/*.c")),
            depends=sorted(glob.glob("native/fuse/*.h")),
            include_dirs=FUSE_INCLUDES,
            extra_compile_args=["-O2", "-std=gnu11", "-Wall", "-Wextra",
                                "-Wno-unused-parameter", "-fvisibility=hidden"],
            libraries=["fuse3", "dl"],
        ),
    ]
)
