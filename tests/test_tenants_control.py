"""The control plane between tenants: `.memos/` files say by their modes what
they do and the daemon enforces them; the trace is root's and one event is
one line whatever the names; knob input is strict ASCII within each knob's
bounds from the one table; no stat names a tenant.

Other uids are real processes under setpriv running the system Python with a
stdlib-only client, so a private checkout does not matter."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import types
from pathlib import Path
from urllib.parse import unquote

import pyfuse3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memosfs.cli import parse_mount_options
from memosfs.knobs import KNOB_BY_NAME, KNOBS, KnobError
from memosfs.trace import Trace, trace_quote
from memosfs.fuse.operations import physical_memory
from memosfs.testing.errnos import errno_of

from conftest import Ctx

MiB = 1 << 20
OTHER = 20011                       # a uid that is not root and owns nothing here

CONTROL_MODES = {
    ".memos": stat.S_IFDIR | 0o755,
    ".memos/cache": stat.S_IFDIR | 0o755,
    ".memos/debug": stat.S_IFDIR | 0o755,
    ".memos/cache/stats": stat.S_IFREG | 0o444,
    ".memos/cache/stats.json": stat.S_IFREG | 0o444,
    ".memos/metrics": stat.S_IFREG | 0o444,
    ".memos/cache/flush": stat.S_IFREG | 0o600,
    ".memos/cache/reset_context": stat.S_IFREG | 0o600,
    ".memos/cache/revoke": stat.S_IFREG | 0o600,
    ".memos/why": stat.S_IFREG | 0o444,
    ".memos/debug/trace": stat.S_IFREG | 0o600,
    **{f".memos/cache/{k.name}": stat.S_IFREG | 0o644 for k in KNOBS},
}

SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

CLIENT = r"""
import os, sys
op, path, arg = sys.argv[1], sys.argv[2], sys.argv[3]
code = 0
try:
    if op == "read":
        fd = os.open(path, os.O_RDONLY)
        os.read(fd, 1 << 16)
        os.close(fd)
    elif op == "write":
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, arg.encode())
        finally:
            os.close(fd)
    elif op == "chmod":
        os.chmod(path, int(arg, 8))
    elif op == "chown":
        os.chown(path, int(arg), int(arg))
    elif op == "utime":
        os.utime(path, (1, 1))
except OSError as e:
    code = e.errno
print(code)
"""

needs_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="runs clients as other uids: needs root and setpriv")


def as_uid(uid: int, op: str, path, arg: str = "") -> int:
    """errno of `op` on path by a process of uid (0: it succeeded)."""
    r = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                        SYSTEM_PYTHON, "-I", "-c", CLIENT, op, str(path), arg],
                       capture_output=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr.decode()
    return int(r.stdout.split()[-1])


def write_value(path: Path, data: bytes) -> int:
    """Write data as a shell's `>` does; the errno of open, write or close."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    except OSError as e:
        return e.errno
    try:
        os.write(fd, data)
    except OSError as e:
        return e.errno
    finally:
        os.close(fd)
    return 0


# ---------------------------------------------------------------- modes and owners


def test_control_modes_say_what_the_files_do(mnt):
    for rel, mode in CONTROL_MODES.items():
        st_ = os.stat(mnt.p(rel))
        assert (st_.st_mode, st_.st_uid, st_.st_gid) == (mode, 0, 0), rel


def test_chmod_chown_utimes_of_the_control_plane_are_eperm_for_root(mnt):
    for rel, mode in CONTROL_MODES.items():
        p = mnt.p(rel)
        assert errno_of(os.chmod, p, 0o666) == errno.EPERM, rel
        assert errno_of(os.chmod, p, stat.S_IMODE(mode)) == errno.EPERM, rel
        assert errno_of(os.chown, p, OTHER, OTHER) == errno.EPERM, rel
        assert errno_of(os.utime, p, (1, 1)) == errno.EPERM, rel
        assert errno_of(os.setxattr, p, "user.note", b"x") == errno.ENOTSUP, rel
        st_ = os.stat(p)
        assert (st_.st_mode, st_.st_uid, st_.st_gid) == (mode, 0, 0), rel
        assert st_.st_mtime != 1, rel
    assert "the control plane is fixed" in mnt.logtext()
    # what the modes promise still works
    assert write_value(mnt.ctl("evict_batch"), b"20\n") == 0
    assert mnt.ctl("evict_batch").read_text() == "20\n"


@needs_setpriv
def test_other_uid_reads_stats_and_knobs_but_changes_nothing(make_mount):
    m = make_mount(world=True)
    trace = m.p(".memos", "debug", "trace")
    for rel in CONTROL_MODES:
        assert as_uid(OTHER, "chmod", m.p(rel), "666") == errno.EPERM, rel
        assert as_uid(OTHER, "chown", m.p(rel), str(OTHER)) == errno.EPERM, rel
    for name in ("stats", "stats.json", "evict_batch", "capacity"):
        assert as_uid(OTHER, "read", m.ctl(name)) == 0, name
    assert as_uid(OTHER, "read", m.p(".memos", "metrics")) == 0
    for k in KNOBS:
        assert as_uid(OTHER, "write", m.ctl(k.name), f"{k.default}\n") == errno.EACCES, k.name
    assert as_uid(OTHER, "write", m.ctl("flush"), "1\n") == errno.EACCES
    assert as_uid(OTHER, "write", m.ctl("reset_context"), "a/s\n") == errno.EACCES
    assert as_uid(OTHER, "read", trace) == errno.EACCES
    assert as_uid(OTHER, "write", trace, "1\n") == errno.EACCES
    assert m.ctl("evict_batch").read_text() == "16\n"
    assert os.stat(m.ctl("stats")).st_mode == stat.S_IFREG | 0o444


def test_root_gets_eacces_against_the_mode_too(mnt):
    """Root writing a read-only file: EACCES, as the modes say
    (CAP_DAC_OVERRIDE lets the kernel pass it on; the daemon refuses).  The
    command files are 0600: root reads them as empty files (so that tar
    and cp -a of the whole mount read every file), others nothing."""
    for name in ("flush", "reset_context", "revoke"):
        assert mnt.ctl(name).read_bytes() == b"", name
    for p in (mnt.ctl("stats"), mnt.ctl("stats.json"), mnt.p(".memos", "metrics"),
              mnt.p(".memos", "why")):
        assert errno_of(os.open, p, os.O_WRONLY) == errno.EACCES, p
    assert write_value(mnt.ctl("flush"), b"1\n") == 0
    trace = mnt.p(".memos", "debug", "trace")
    assert write_value(trace, b"1\n") == 0
    trace.read_text()


def test_daemon_enforces_the_modes_without_default_permissions(make_handlers):
    """The handlers themselves refuse (a mount without default_permissions
    gets no check from the kernel): called directly, as test_ops does."""
    h = make_handlers(capacity=16 * MiB)
    call, ino = h.call, h.lookup

    def open_errno(path, flags, uid):
        try:
            fi = call("open", ino(path), flags, Ctx(uid))
        except pyfuse3.FUSEError as e:
            return e.errno
        call("release", fi.fh)
        return 0

    trace, knob = ".memos/debug/trace", ".memos/cache/evict_batch"
    assert open_errno(trace, os.O_RDONLY, OTHER) == errno.EACCES
    assert open_errno(trace, os.O_WRONLY, OTHER) == errno.EACCES
    assert open_errno(trace, os.O_RDONLY, 0) == 0
    assert open_errno(knob, os.O_WRONLY | os.O_TRUNC, OTHER) == errno.EACCES
    assert open_errno(knob, os.O_RDONLY, OTHER) == 0
    assert open_errno(knob, os.O_WRONLY | os.O_TRUNC, 0) == 0
    assert open_errno(".memos/cache/flush", os.O_WRONLY, OTHER) == errno.EACCES
    assert open_errno(".memos/cache/flush", os.O_RDONLY, 0) == 0
    assert open_errno(".memos/cache/flush", os.O_RDONLY, OTHER) == errno.EACCES
    assert open_errno(".memos/cache/stats", os.O_WRONLY, 0) == errno.EACCES
    assert open_errno(".memos/cache/stats", os.O_RDONLY, OTHER) == 0
    attr = pyfuse3.EntryAttributes()
    attr.st_mode = 0o666
    fields = types.SimpleNamespace(update_mode=True, update_uid=False, update_gid=False,
                                   update_size=False, update_atime=False,
                                   update_mtime=False, update_ctime=False)
    with pytest.raises(pyfuse3.FUSEError) as e:
        call("setattr", ino(".memos/cache/stats"), attr, fields, None, Ctx(0))
    assert e.value.errno == errno.EPERM


# ---------------------------------------------------------------- the trace


TRACE_LINE = re.compile(r"[0-9]+ [A-Z_]+( [^\s=%]*(%[0-9A-F]{2}[^\s=%]*)*="
                        r"[^\s=%]*(%[0-9A-F]{2}[^\s=%]*)*)*")


def test_a_name_cannot_forge_a_trace_line(mnt):
    trace = mnt.p(".memos", "debug", "trace")
    s = mnt.p("agent", "s")
    s.mkdir(parents=True)
    assert write_value(trace, b"1\n") == 0
    evil = "x bytes=1 version=1\n1700000000000000000 REMOVE key=alice"
    odd = "100% a=b\tc\x01\u00e9"
    (s / evil).write_bytes(b"v")
    (s / odd).write_bytes(b"w")
    raw = os.fsdecode(b"raw\xff")
    (s / raw).write_bytes(b"z")
    os.unlink(s / odd)
    lines = trace.read_text().splitlines()
    for line in lines:
        assert TRACE_LINE.fullmatch(line), line
    assert not any(line.split()[1] == "REMOVE" and "alice" in line for line in lines)
    publishes = [dict(f.split("=", 1) for f in line.split()[2:])
                 for line in lines if line.split()[1] == "PUBLISH"]
    keys = [unquote(p["key"]) for p in publishes]
    assert keys.count(f"agent/s/{evil}") == 1
    assert keys.count(f"agent/s/{odd}") == 1
    assert keys.count("agent/s/raw\ufffd") == 1      # not UTF-8: shown replaced
    removes = [unquote(line.split("key=", 1)[1]) for line in lines
               if line.split()[1] == "REMOVE"]
    assert removes == [f"agent/s/{odd}"]


def test_trace_quote_round_trips():
    t = Trace()
    t.set(True)
    for value in ("plain/key", "a b", "x=y", "50%", "\n", "", "\u0663", "uid:20001"):
        t.emit("EV", key=value, n=3)
        line = t.text().splitlines()[-1]
        assert TRACE_LINE.fullmatch(line), line
        fields = dict(f.split("=", 1) for f in line.split()[2:])
        assert unquote(fields["key"]) == value and fields["n"] == "3"
    assert trace_quote(b"\xff") == "%FF"
    assert trace_quote("a=b c%") == "a%3Db%20c%25"


# ---------------------------------------------------------------- stats carry no names


def test_stats_and_metrics_name_no_tenant(mnt):
    s = mnt.p("secretagent", "secretsession")
    s.mkdir(parents=True)
    (s / "secretslot").write_bytes(b"x" * 5000)
    os.chown(mnt.p("secretagent"), 31337, 31337)
    texts = [mnt.ctl("stats").read_text(), mnt.ctl("stats.json").read_text(),
             mnt.p(".memos", "metrics").read_text()]
    for text in texts:
        assert "secret" not in text and "31337" not in text
    js = json.loads(texts[1])
    assert js["agents"] == 1 and js["sessions"] == 1
    assert all(isinstance(v, (int, float)) for k, v in js.items() if k != "evict_policy")


# ---------------------------------------------------------------- strict knob input


BAD_FOR_EVERY_KNOB = [
    "\u0663", "\u0663\u0663", "\uff13", "\uff11\uff10", "3\u0663", "\u00b2", "\u2167",
    "+1", "-1", "-0", "-0.0", "+0", "1e3", "1E3", "1e-1", "nan", "NaN", "inf", "-inf",
    "Infinity", "0x10", "1_000", "2**70", "1 2", "1,5", "1\x00", "\x00", "\n", "  \n",
    "\t\n", "1" + "0" * 70, "\u00a03", "3\u2028", "lru\u200b", "\uff4c\uff52\uff55",
    "auto\x00", "\x0b3",
]

BAD_BY_KIND = {
    "int": ["1.5", "1.", ".5", "99999999999999999999999999"],
    "size": ["0.5", "1.5", "1.", "1P", "1KK", "2M3", "-1M", str(1 << 70), "1025T"],
    "ratio": ["1.5", "1.0001", "2", ".5", "0.", "1/2"],
    "error_max": ["0", "0.0", "1.5", "AUTO", "auto1"],
    "choice": ["LRU", "on", "yes", "o ff"],
    "flag": ["2", "on", "yes", "true", "01", "1.0"],
    "share": ["0%", "101%", "-5%", "5.5%", "%", "25 %", "\u0663%", "1P", "0.5"],
    "mask": ["8", "0778", "07777", "1000", "0o77", "u=rwx", "7.0", "\u0667\u0667"],
}

GOOD = {
    "capacity": [("128M", f"{128 * MiB}\n"), (" 96MiB \n", f"{96 * MiB}\n"),
                 (str(64 * MiB), f"{64 * MiB}\n")],
    "evict_policy": [("lru\n", "lru\n"), ("lru_lfu", "lru_lfu\n")],
    "evict_batch": [("24\n", "24\n"), ("4096", "4096\n"), ("007", "7\n")],
    "reclaim_free_ratio": [("0.25\n", "0.25\n"), ("0", "0.0\n"), ("1", "1.0\n")],
    "reclaim_fail_limit": [("0", "0\n"), ("1000000", "1000000\n")],
    "writeback_delay_ms": [("0", "0\n"), ("3600000", "3600000\n")],
    "ssd_capacity": [("0", "0\n"), ("1M", f"{MiB}\n"), ("1.5G", f"{3 << 29}\n")],
    "ssd_full": [("refuse\n", "refuse\n"), ("evict", "evict\n")],
    "unmount_unsaved": [("lose\n", "lose\n"), ("refuse", "refuse\n")],
    "ssd_pack_below": [("0", "0\n"), ("4K", "4096\n"), ("65536\n", "65536\n")],
    "warmup_ratio": [("0.75", "0.75\n")],
    "quantize": [("int8", "int8\n"), ("off", "off\n")],
    "quant_error_max": [("0.05", "0.05\n"), ("1", "1.0\n"), ("auto", "auto\n")],
    "page_cache_push": [("0", "0\n"), ("1", "1\n")],
    "fast_path": [("0", "0\n"), ("1", "1\n")],
    "burst_poll_us": [("0", "0\n"), ("1000", "1000\n"), ("30", "30\n")],
    # (2 needs a write-through mount: tests/test_coherence*.py mount so)
    "coherence_protocol": [("0", "0\n"), ("1", "1\n")],
    "writeback_cache": [("0", "0\n")],     # (negotiated at mount: the same value only)
    "passthrough": [("0", "0\n")],         # (negotiated at mount: the same value only)
    "passthrough_min": [("0", "0\n"), ("1M", f"{MiB}\n"), ("262144\n", "262144\n")],
    "passthrough_room": [("0", "0\n")],    # (set at mount: the same value only)
    "coherence_timeout_ms": [("1", "1\n"), ("5000", "5000\n")],
    "lease_break_ms": [("1", "1\n"), ("250", "250\n"), ("1000", "1000\n")],
    "coherence_batch_ms": [("60000", "60000\n"), ("2", "2\n")],
    "agent_identity": [("pid", "pid\n"), ("uid", "uid\n")],
    "ring_slots": [("1073741824", "1073741824\n"), ("0", "0\n")],
    "prefetch_mode": [("sequential", "sequential\n"), ("off", "off\n")],
    "prefetch_stride": [("64", "64\n"), ("2", "2\n")],
    "prefetch_retrain_below": [("0.5", "0.5\n")],
    "pin_max_per_uid": [("10%", "10%\n"), ("16M", f"{16 * MiB}\n"), ("25%", "25%\n")],
    "hold_max_per_uid": [("100%", "100%\n"), ("1G", f"{1 << 30}\n"), ("50%", "50%\n")],
    "umask": [("022", "0022\n"), ("0", "0000\n"), ("777", "0777\n"), ("0077\n", "0077\n")],
}


def test_every_knob_has_good_values_here():
    assert set(GOOD) == set(KNOB_BY_NAME)


def _out_of_range(k) -> list[str]:
    if k.kind in ("int", "size", "share"):
        lo, hi = k.bounds
        out = [str(hi + 1)]
        below = lo - 1 if not (k.zero and lo - 1 == 0) else lo // 2
        if lo > 0 and not (k.zero and below == 0):     # (0 is a good value there)
            out.append(str(below))
        return out
    return []


def test_strict_knob_input_through_the_mount(mnt):
    """Every bad value on every knob file: EINVAL, the value unchanged, the
    reason in the log; good values set and read back."""
    for k in KNOBS:
        path = mnt.ctl(k.name)
        before = path.read_text()
        bad = BAD_FOR_EVERY_KNOB + BAD_BY_KIND[k.kind] + _out_of_range(k)
        for value in bad:
            assert write_value(path, value.encode("utf-8")) == errno.EINVAL, \
                (k.name, value)
            assert path.read_text() == before, (k.name, value)
        # bytes that are not UTF-8 at all
        assert write_value(path, b"\xff3\n") == errno.EINVAL, k.name
        assert path.read_text() == before
        for value, shown in GOOD[k.name]:
            assert write_value(path, value.encode()) == 0, (k.name, value, mnt.logtext()[-500:])
            assert path.read_text() == shown, (k.name, value)
    log = mnt.logtext()
    assert "not ASCII" in log and "out of range" in log and "not an integer" in log


def test_capacity_beyond_memory_says_so(mnt):
    before = mnt.ctl("capacity").read_text()
    memory = physical_memory()
    for value in (b"1024T\n", str(memory + (2 << 20)).encode()):
        assert write_value(mnt.ctl("capacity"), value) == errno.EINVAL, value
        assert mnt.ctl("capacity").read_text() == before
    log = mnt.logtext()
    assert "cannot grow beyond memory" in log
    assert "cannot shrink" not in log


def test_mount_refuses_capacity_beyond_memory(make_mount):
    with pytest.raises(RuntimeError, match="cannot grow beyond memory"):
        make_mount(capacity="1024T")


def test_mount_options_use_the_same_strict_parsers():
    knobs, _, _ = parse_mount_options(["capacity=64M,evict_batch=8,reclaim_free_ratio=0.5"])
    assert knobs == {"capacity": 64 * MiB, "evict_batch": 8, "reclaim_free_ratio": 0.5}
    for opt in ("capacity=\u0663G", "evict_batch=\uff13", "reclaim_free_ratio=-0",
                "warmup_ratio=nan", "ssd_capacity=1e3", "capacity=2048T", "evict_batch=+3"):
        with pytest.raises(SystemExit, match="bad option"):
            parse_mount_options([opt])


@settings(max_examples=400, deadline=None)
@given(knob=st.sampled_from(KNOBS), text=st.one_of(
    st.text(max_size=12),
    st.text(alphabet="0123456789.+-eEkKmMgGtTiIbB \n\t\u0663\uff13\x00", max_size=10)))
def test_a_knob_accepts_only_ascii_values_in_its_bounds(knob, text):
    try:
        value = knob.parse(text)
    except KnobError:
        return
    assert text.isascii()
    if knob.kind == "choice":
        assert value in knob.bounds
    elif knob.kind == "flag":
        assert value in (True, False) and text.strip(" \t\r\n") == str(int(value))
        assert knob.parse(knob.format(value)) is value
    elif knob.kind == "error_max" and value == "auto":
        pass
    elif knob.kind == "share" and isinstance(value, str):
        assert value.endswith("%") and 1 <= int(value[:-1]) <= 100
        assert knob.parse(knob.format(value)) == value
    else:
        v = float(value) if knob.kind == "error_max" else value
        lo, hi = knob.bounds
        assert (knob.zero and v == 0) or lo <= v <= hi
        assert str(v) not in ("-0.0", "nan", "inf")
        assert knob.parse(knob.format(value)) == value      # reads back as written


def test_writeback_cache_is_a_mount_time_choice_and_protocol_2_writes_through(make_mount):
    """writeback_cache is negotiated with the kernel at mount: changing it
    on a live mount is EINVAL with the reason; coherence protocol 2 needs
    the write-through mount (EINVAL on a writeback one), and asking for it
    at mount turns the writeback cache off unless that was asked for too."""
    assert make_mount().ctl("writeback_cache").read_text() == "0\n"    # the default
    m = make_mount(writeback_cache=1)
    assert m.ctl("writeback_cache").read_text() == "1\n"
    assert write_value(m.ctl("writeback_cache"), b"0\n") == errno.EINVAL
    assert write_value(m.ctl("coherence_protocol"), b"2\n") == errno.EINVAL
    assert m.ctl("coherence_protocol").read_text() == "1\n"
    log = m.logtext()
    assert "negotiated with the kernel at mount" in log
    assert "coherence_protocol 2 needs a mount with writeback_cache=0" in log
    strong = make_mount(coherence_protocol=2)
    assert strong.ctl("writeback_cache").read_text() == "0\n"
    assert strong.ctl("coherence_protocol").read_text() == "2\n"
    through = make_mount(writeback_cache=0)
    assert write_value(through.ctl("coherence_protocol"), b"2\n") == 0
