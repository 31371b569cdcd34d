"""What instruction sets a built library uses: the engines' portability check.

`make engines-llama` compiles llama.cpp (llama-cpp-python's libraries and
llama-server) for a fixed level, x86-64-v3 (SSE4.2 AVX F16C FMA AVX2 BMI2),
unless NATIVE=1 (scripts/install-engines-llama.sh).  A library built for the
build machine instead can hold AVX-512 or AMX code, which faults on a CPU
without them (and the AMX code crashed llama.cpp on a CPU with them: issue
30).  This module reads the machine code itself, so the check does not depend
on the CPU it runs on:

  - `scan(path)`: `objdump -d -w` of an ELF file, each instruction classified:
    AMX (ldtilecfg, tileloadd, tdp*...), AVX-512 (any EVEX-encoded instruction,
    first opcode byte 0x62, and the VEX-encoded opmask instructions on %k0-7),
    the VEX extensions above AVX2 (AVX-VNNI, AVX-IFMA, AVX-NE-CONVERT,
    AVX-VNNI-INT8, VAES/VPCLMULQDQ/GFNI on ymm), and for the report the
    x86-64-v3 features in use (ymm registers, FMA, F16C, BMI2);
  - `system_info(python)`: the string llama.cpp reports about its own build
    (`llama_print_system_info()`: "AVX512 = 0 | AMX_INT8 = 0 | ...", set by the
    compiler's defines, not by the CPU);
  - `problems(flavour, scans, info)`: what is above the flavour's level
    (nothing is above `native`; `baseline-*`, another architecture, is not
    checked).

    python -m memosfs.testing.isa --flavour x86-64-v3 --venv .venv \\
        --server .engines/bin/llama-server [--json] [FILE...]

exits 1 and names the files and instructions when a portable build holds
anything above its level (the install runs it after a build; so does
tests/engines/test_built_isa.py).

May call: objdump and ldd (binutils, libc-bin), the venv's python.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterable, Optional

PORTABLE = "x86-64-v3"
FLAVOURS = (PORTABLE, "native")

# Prefixes that may stand before an EVEX prefix (segment overrides, address size).
_SKIP_PREFIXES = {0x26, 0x2E, 0x36, 0x3E, 0x64, 0x65, 0x67}
_AMX = re.compile(r"^(ldtilecfg|sttilecfg|tileloadd\w*|tilestored|tilezero|tilerelease|"
                  r"tdp\w+|tcmmi\w+|tcmmr\w+|ttdp\w+|tmmul\w+)$")
_OPMASK = re.compile(r"%k[0-7]\b")
# VEX-encoded extensions above AVX2 (their EVEX forms are AVX-512 and counted there).
_ABOVE_V3_VEX = re.compile(r"^(vpdpb\w+|vpdpw\w+|vpmadd52\w+|vcvtne\w+|vbcstne\w+|"
                           r"vgf2p8\w+|vaes\w+|vpclmulqdq|vsha512\w+|vsm3\w+|vsm4\w+)$")
_V3 = {
    "fma": re.compile(r"^vf(n)?m(add|sub|addsub|subadd)\d{3}"),
    "f16c": re.compile(r"^vcvt(ph2ps|ps2ph)$"),
    "bmi2": re.compile(r"^(bzhi|mulx|pdep|pext|rorx|sarx|shlx|shrx)$"),
}
_LINE = re.compile(r"^\s*[0-9a-f]+:\t([0-9a-f ]+)\t(.*)$")
KINDS = ("amx", "avx512", "above_v3_vex")


def classify(raw: str, text: str) -> Optional[str]:
    """One instruction (its bytes as objdump prints them, and its text):
    "amx", "avx512", "above_v3_vex" or None (x86-64-v3 or below)."""
    parts = text.split()
    if not parts:
        return None
    if parts[0] in ("{vex}", "{evex}", "{vex3}"):
        parts = parts[1:] or [""]
    mnemonic = parts[0]
    if _AMX.match(mnemonic):
        return "amx"
    opcodes = [int(b, 16) for b in raw.split()]
    i = 0
    while i < len(opcodes) and opcodes[i] in _SKIP_PREFIXES:
        i += 1
    if i < len(opcodes) and opcodes[i] == 0x62 and mnemonic != "(bad)":
        return "avx512"          # EVEX (0x62 is no instruction of its own in 64-bit code)
    if "%zmm" in text or _OPMASK.search(text):
        return "avx512"          # the VEX-encoded opmask instructions (kmovw, kortestw, ...)
    if _ABOVE_V3_VEX.match(mnemonic):
        if mnemonic.startswith(("vaes", "vpclmul")) and "%ymm" not in text:
            return None          # AES-NI/PCLMUL in their 128-bit VEX form: below AVX2 level
        return "above_v3_vex"
    return None


def scan(path: str | os.PathLike, examples: int = 5) -> dict[str, Any]:
    """objdump -d -w of one ELF file: instructions counted by kind, the first
    few of each kind above x86-64-v3 (address and text), and the v3 features
    used (ymm, fma, f16c, bmi2)."""
    p = subprocess.run(["objdump", "-d", "-w", str(path)], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"objdump -d {path} failed (rc {p.returncode}): {p.stderr.strip()[-500:]}")
    out: dict[str, Any] = {"path": str(path), "instructions": 0,
                           **{k: 0 for k in KINDS}, "examples": {k: [] for k in KINDS},
                           "ymm": 0, **{k: 0 for k in _V3}}
    for line in p.stdout.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        raw, text = m.group(1), m.group(2).strip()
        out["instructions"] += 1
        kind = classify(raw, text)
        if kind:
            out[kind] += 1
            if len(out["examples"][kind]) < examples:
                out["examples"][kind].append(line.split(":")[0].strip() + ": " + text)
            continue
        if "%ymm" in text:
            out["ymm"] += 1
        mnemonic = text.split()[0] if text else ""
        for k, rx in _V3.items():
            if rx.match(mnemonic):
                out[k] += 1
    return out


def system_info(python: str | os.PathLike) -> Optional[str]:
    """llama.cpp's report of its own build, from the given interpreter (None
    when llama_cpp does not import there)."""
    code = "import llama_cpp, sys; sys.stdout.write(llama_cpp.llama_print_system_info().decode())"
    p = subprocess.run([str(python), "-c", code], capture_output=True, text=True, timeout=120)
    return p.stdout.strip() if p.returncode == 0 else None


def info_flags(info: str) -> dict[str, int]:
    """"CPU : SSE3 = 1 | AVX512 = 0 | ..." -> {"SSE3": 1, "AVX512": 0, ...}."""
    return {k: int(v) for k, v in re.findall(r"([A-Z][A-Z0-9_]*) = (\d+)", info)}


def problems(flavour: str, scans: Iterable[dict], info: Optional[str] = None) -> list[str]:
    """What is above the flavour's level: one line per file (counts and
    examples) and one for llama.cpp's own report.  Empty when the build is
    what the flavour says (always for `native` and `baseline-*`)."""
    if flavour != PORTABLE:
        return []
    bad = []
    for s in scans:
        found = {k: s[k] for k in KINDS if s[k]}
        if found:
            ex = "; ".join(e for k in KINDS for e in s["examples"][k][:2])
            bad.append(f"{s['path']}: {found} instructions above {PORTABLE} (e.g. {ex})")
    if info is not None:
        flags = info_flags(info)
        high = sorted(k for k, v in flags.items() if v and (k.startswith(("AVX512", "AMX"))
                                                            or k == "AVX_VNNI"))
        if high:
            bad.append(f"llama_print_system_info reports {', '.join(high)}: {info}")
        if flags.get("AVX2") == 0:
            bad.append(f"llama_print_system_info reports AVX2 = 0, not {PORTABLE}: {info}")
    return bad


def engine_files(venv: str | os.PathLike, server: Optional[str | os.PathLike] = None) -> list[Path]:
    """The llama.cpp code of the engines: llama-cpp-python's libraries in the
    venv, and llama-server with the llama/ggml libraries it loads (ldd); each
    content once."""
    files: list[Path] = []
    for d in glob.glob(os.path.join(str(venv), "lib", "python3*", "site-packages", "llama_cpp", "lib")):
        files += sorted(Path(d).glob("lib*.so*"))
    if server and os.path.exists(server):
        exe = Path(os.path.realpath(server))
        files.append(exe)
        p = subprocess.run(["ldd", str(exe)], capture_output=True, text=True)
        for m in re.finditer(r"=>\s+(\S*/lib(?:ggml|llama|mtmd)[^/\s]*\.so[^\s]*)", p.stdout):
            files.append(Path(os.path.realpath(m.group(1))))
    seen, out = set(), []
    for f in files:                 # each content once (the wheel's libs are copies of
        r = os.path.realpath(f)     # one another and of the build folder's)
        if not os.path.isfile(r):
            continue
        with open(r, "rb") as fh:
            digest = hashlib.file_digest(fh, "sha256").hexdigest()
        if digest not in seen:
            seen.add(digest)
            out.append(Path(r))
    return out


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m memosfs.testing.isa",
                                 description="fail a portable llama.cpp build that holds "
                                 "instructions above its level")
    ap.add_argument("--flavour", default=PORTABLE,
                    help=f"{', '.join(FLAVOURS)} or baseline-ARCH (default {PORTABLE})")
    ap.add_argument("--venv", help="llama-cpp-python's libraries in VENV, and its "
                    "llama_print_system_info()")
    ap.add_argument("--server", help="llama-server and the libraries it loads")
    ap.add_argument("--json", action="store_true", help="one JSON object")
    ap.add_argument("files", nargs="*", help="more ELF files to scan")
    a = ap.parse_args(argv)
    files = (engine_files(a.venv, a.server) if (a.venv or a.server) else []) + \
        [Path(f) for f in a.files]
    if not files:
        print("memosfs.testing.isa: nothing to check (no llama_cpp/lib in --venv, no --server, "
              "no FILE)", file=sys.stderr)
        return 2
    scans = [scan(f) for f in files]
    info = system_info(Path(a.venv) / "bin" / "python") if a.venv else None
    bad = problems(a.flavour, scans, info)
    if a.json:
        print(json.dumps({"flavour": a.flavour, "system_info": info, "files": scans,
                          "problems": bad}))
    else:
        for s in scans:
            counts = ", ".join(f"{k} {s[k]}" for k in (*KINDS, "ymm", *_V3))
            print(f"isa: {s['path']}: {s['instructions']} instructions: {counts}")
        if info:
            print(f"isa: llama_print_system_info: {info}")
        for b in bad:
            print(f"isa: ABOVE THE LEVEL: {b}", file=sys.stderr)
        print(f"isa: {len(files)} files, flavour {a.flavour}: "
              + (f"{len(bad)} problem(s)" if bad else
                 "nothing above the level" if a.flavour == PORTABLE else "not checked against a level"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
