"""`.memos/why` and `memosfs why`: each uid sees why its own last request
was refused, in the words of the log (memosfs/fuse/why.py, core.refuse)."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import sys

import pytest

from memosfs.fuse import why
from memosfs.fuse.core import refuse

OTHER = 20041
SYSTEM_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

needs_setpriv = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="runs commands as another uid: needs root and setpriv")


def why_text(m) -> str:
    return m.p(".memos", "why").read_text()


def errno_of(fn, *args) -> int:
    try:
        fn(*args)
    except OSError as e:
        return e.errno
    return 0


# ---------------------------------------------------------------- without a mount

def test_a_refusal_is_noted_for_the_caller_of_the_request():
    book = why.Reasons()
    assert book.text(0) == "nothing of yours was refused since the mount\n"
    token = why.CALLER.set((1234, book))
    try:
        e = refuse(errno.EINVAL, "knob %s: %s", "evict_batch", "not an integer")
        assert e.reason == "knob evict_batch: not an integer" and e.noted
        refuse(errno.ESTALE, "open %s for writing: retried", "x", level=logging.DEBUG)
    finally:
        why.CALLER.reset(token)
    line = book.text(1234)
    assert line.endswith(" EINVAL (Invalid argument): knob evict_batch: not an integer\n")
    assert book.text(0) == "nothing of yours was refused since the mount\n"
    # outside a request nothing is noted (its caller notes it, or nobody asked)
    assert not refuse(errno.EPERM, "background").noted


def test_a_refused_save_stays_visible_after_harmless_refusals():
    book = why.Reasons()
    book.note(7, errno.EFBIG, "a/s/big: not published", "flush")
    book.note(7, errno.ENOTSUP, "a/s/copy: xattr system.posix_acl_access", "setxattr")
    first, second = book.text(7).splitlines()
    assert first.endswith(" ENOTSUP (Operation not supported): a/s/copy: xattr "
                          "system.posix_acl_access")
    assert second.endswith(" last refused save or open: EFBIG (File too large): "
                           "a/s/big: not published")
    book.note(7, errno.EACCES, "open a/s/x", "open")    # a newer one: shown once
    assert book.text(7).splitlines()[1:] == []
    assert book.text(8) == "nothing of yours was refused since the mount\n"


def test_the_book_keeps_the_last_refused_uids():
    book = why.Reasons()
    for uid in range(why.MAX_UIDS + 10):
        book.note(uid, errno.EPERM, f"r{uid}")
    assert len(book) == why.MAX_UIDS
    assert book.last(0) is None and book.last(why.MAX_UIDS + 9)[2] == f"r{why.MAX_UIDS + 9}"


def test_the_handlers_note_the_uid_of_the_context_and_of_the_handle(make_handlers):
    from conftest import Ctx
    import pyfuse3
    h = make_handlers()
    h.mkdirs("a/s")
    root = pyfuse3.ROOT_INODE
    assert h.err("create", root, b"oops", 0o644, os.O_WRONLY, Ctx(77)) == errno.EPERM
    assert "EPERM" in h.ops.why.text(77) and "create oops" in h.ops.why.text(77)
    assert h.ops.why.last(0) is None
    # a write to a knob file carries no context: the handle's opener is the caller
    knob = h.lookup(".memos/cache/evict_batch")
    fi = h.call("open", knob, os.O_WRONLY | os.O_TRUNC, Ctx(0))
    assert h.err("write", fi.fh, 0, b"banana\n") == errno.EINVAL
    h.call("release", fi.fh)
    assert "evict_batch: not an integer: 'banana'" in h.ops.why.text(0)
    assert "create oops" in h.ops.why.text(77)


# ---------------------------------------------------------------- on a mount

@pytest.mark.parametrize("fast", ["1", "0"])
def test_why_says_what_the_log_says(make_mount, fast):
    """The refusal of a create (answered on the fast path or not), of a
    knob write and of an attribute, each in turn, as `.memos/why` and
    `memosfs why` show them."""
    m = make_mount(capacity="64M", fast_path=fast)
    assert why_text(m) == "nothing of yours was refused since the mount\n"
    m.p("planner", "chat").mkdir(parents=True)
    assert errno_of(m.p("planner", "oops").write_bytes, b"x") == errno.EPERM
    assert "EPERM (Operation not permitted): create oops: a slot belongs in agent/session/" \
        in why_text(m)
    r = subprocess.run(["bash", "-c", f"echo banana > {m.ctl('evict_batch')}"],
                       capture_output=True, text=True)
    assert "Invalid argument" in r.stderr
    assert why_text(m).endswith(" EINVAL (Invalid argument): evict_batch: not an integer: "
                                "'banana' (decimal digits, no sign)\n")
    assert errno_of(os.setxattr, m.p("planner", "chat"), "user.memos.quota", b"1M") \
        == errno.EINVAL
    r = subprocess.run([sys.executable, "-m", "memosfs", "why", str(m.path)],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "user.memos.quota belongs on an agent directory" in r.stdout
    assert "refused (EINVAL): user.memos.quota belongs on an agent directory" in m.logtext()
    # a read of the file is not a refusal: it says the same again
    assert why_text(m) == why_text(m)


def test_a_write_refused_on_the_fast_path_is_noted(make_mount):
    m = make_mount(capacity="4M", ssd="none")
    m.p("a", "s").mkdir(parents=True)
    with pytest.raises(OSError) as e:       # (the write, and the close: not published)
        with open(m.p("a", "s", "big"), "wb") as f:
            f.write(b"x" * (6 << 20))
            f.flush()
    assert e.value.errno in (errno.EFBIG, errno.ENOSPC)
    assert errno.errorcode[e.value.errno] in why_text(m)


@pytest.mark.parametrize("fast", ["1", "0"])
def test_cp_a_does_not_hide_the_refused_save_before_it(make_mount, tmp_path, fast):
    """`cp -a` leaves ENOTSUP for system.posix_acl_access (harmless: the copy
    succeeds); the refused save before it stays in `.memos/why`."""
    m = make_mount(capacity="4M", ssd="none", fast_path=fast)
    m.p("a", "s").mkdir(parents=True)
    with pytest.raises(OSError) as e:
        with open(m.p("a", "s", "big"), "wb") as f:
            f.write(b"x" * (6 << 20))
            f.flush()
    refused = errno.errorcode[e.value.errno]
    (tmp_path / "src").write_text("hello")
    r = subprocess.run(["cp", "-a", str(tmp_path / "src"), str(m.p("a", "s", "copy"))],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = why_text(m).splitlines()
    assert "ENOTSUP" in lines[0] and "system.posix_acl_access" in lines[0], lines
    assert f"last refused save or open: {refused}" in lines[1] and "a/s/big" in lines[1]
    assert errno_of(os.setxattr, m.p("a", "s", "copy"), "trusted.x", b"1") == errno.ENOTSUP
    lines = why_text(m).splitlines()
    assert "trusted.x" in lines[0] and "a/s/big" in lines[1], lines
    r = subprocess.run([sys.executable, "-m", "memosfs", "why", str(m.path)],
                       capture_output=True, text=True)
    assert "a/s/big" in r.stdout


def test_a_federated_refusal_is_noted(make_mount):
    m = make_mount(capacity="64M")
    if not (m.path / ".federated").is_dir():
        pytest.skip(".federated is not served here")
    assert errno_of(os.mkdir, m.path / ".federated" / ".hidden") == errno.EINVAL
    assert "bad job name" in why_text(m)


def test_memosfs_why_of_a_directory_that_is_no_mount(tmp_path):
    r = subprocess.run([sys.executable, "-m", "memosfs", "why", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr == \
        f"memosfs: {tmp_path} is not a memosfs mount (No such file or directory)\n"


@needs_setpriv
def test_each_uid_sees_only_its_own(make_mount):
    m = make_mount(capacity="64M", world=True)
    m.p("alice", "s").mkdir(parents=True)
    os.chown(m.p("alice"), OTHER, OTHER)
    os.chown(m.p("alice", "s"), OTHER, OTHER)
    assert errno_of(m.p("oops").write_bytes, b"x") == errno.EPERM          # root's
    # the other uid sets a quota (only root may): its own refusal
    code = ("import os\n"
            "try:\n"
            f"    os.setxattr('{m.p('alice')}', 'user.memos.quota', b'1M')\n"
            "except OSError as e:\n"
            "    print(e.errno)\n"
            f"print(open('{m.p('.memos', 'why')}').read(), end='')\n")
    r = subprocess.run(["setpriv", f"--reuid={OTHER}", f"--regid={OTHER}", "--clear-groups",
                        SYSTEM_PYTHON, "-I", "-c", code], capture_output=True, text=True,
                       cwd="/", timeout=60)
    assert r.returncode == 0, r.stderr
    first, line = r.stdout.split("\n", 1)
    assert int(first) == errno.EPERM
    assert "only root sets quotas" in line and "oops" not in line
    assert "create oops" in why_text(m) and "quota" not in why_text(m)
