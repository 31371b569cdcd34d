"""Build the C core (native/) as the extension module memosfs._native."""
import glob
import os

from setuptools import Extension, setup

CFLAGS = ["-O2", "-std=gnu11", "-Wall", "-Wextra", "-Wno-unused-parameter",
          "-fvisibility=hidden"]
if os.environ.get("MEMOS_SANITIZE"):
    CFLAGS += ["-O1", "-g", "-fsanitize=address,undefined", "-fno-omit-frame-pointer"]

sources = sorted(glob.glob("native/*.c"))

setup(
    ext_modules=[
        Extension(
            "memosfs._native",
            sources=sources,
            depends=sorted(glob.glob("native/*.h")),
            include_dirs=["native"],
            extra_compile_args=CFLAGS,
            libraries=["pthread"],
        )
    ]
)
