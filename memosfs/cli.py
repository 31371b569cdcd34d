"""The `memosfs` command.

    memosfs SOURCE MOUNTPOINT [-o opts] [-f]   mount (the mount(8) convention)
    memosfs mount  SOURCE MOUNTPOINT [...]     the same, spelled out
    memosfs umount MOUNTPOINT [-l] [--force]   unmount (waits for the daemon to persist
                                               everything; refused while dirty slots cannot
                                               be written back, unless --force; exit 1 if
                                               it lost slots)
    memosfs stat   MOUNTPOINT [--json]         the stats as a table
    memosfs df     MOUNTPOINT... [--json]      each tier's size, use and room, as df
                                               shows them (df adds the two tiers up)
    memosfs why    MOUNTPOINT                  why your last request there was refused
    memosfs top    MOUNTPOINT [--interval S] [--once]
                                               a live view: hit ratio, tiers, evictions,
                                               write-back, coherence, usage per agent
    memosfs ls     [-l] [--json] [PATH...]     the slots below PATH: tier (mem, ssd,
                                               remote), size, stored bytes, age, hits,
                                               dirty, pinned (memosfs/cachectl.py)
    memosfs evict  PATH...                     slots leave memory for the SSD tier
    memosfs drop   PATH...                     slots the SSD tier holds leave memory
    memosfs pin    PATH... / unpin PATH...     keep slots in memory, or not
    memosfs calc-size --tokens N --layers L (--hidden H | --kv-heads K --head-dim D)
                      [--dtype fp16] [--redundancy 2]
    memosfs knobs [--markdown]                 the knob table
    memosfs --version                          the version
    memosfs bench io [--json] ...              benchmarks (see `memosfs bench -h`)

Mount options (-o, comma-separated): every knob of `.memos/cache/` by name
(capacity=4G, evict_batch=24, ...), ssd=DIR, log=FILE, debug,
remote=redis://HOST:PORT[,HOST:PORT...] (a Redis cluster shared with other
mounts; docs/remote.md), remote_durable=0|1, nonempty (the same as --force);
the rest go to libfuse (allow_other, fsname=, ...).  default_permissions is
always on.

One daemon per SSD directory: a daemon holds an exclusive lock on DIR/.lock
for as long as it runs, and a second one on the same directory is refused
(exit 1) before it touches anything there.  A mountpoint that already has a
FUSE filesystem mounted on it (another memosfs, say) is refused too, unless
--force or -o nonempty asks to mount over it.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Optional, Sequence

from memosfs.knobs import KNOB_BY_NAME, KNOBS, KnobError

log = logging.getLogger("memosfs")

DEFAULT_SSD = "/var/lib/memosfs/memos"
DEFAULT_LOG = "/var/log/memosfs.log"
# mount(8)/mount.fuse3 add or pass these; they mean nothing to us beyond libfuse.
_IGNORED_OPTS = {"nofail", "_netdev", "auto", "noauto", "user", "users", "defaults"}

DTYPE_BYTES = {"fp32": 4, "float32": 4, "fp16": 2, "float16": 2, "bf16": 2,
               "bfloat16": 2, "fp8": 1, "int8": 1, "int4": 0.5, "fp64": 8}


# ---------------------------------------------------------------- mount


def self_command() -> str:
    """How to run this memosfs from a shell, for the messages that name a
    command: `memosfs` when that name is on the PATH (`make run` and `make
    install` put it there), else the path this one was started by (the
    virtual environment's script), else `python -m memosfs` with this
    interpreter."""
    if shutil.which("memosfs"):
        return "memosfs"
    argv0 = sys.argv[0] if sys.argv else ""
    if os.path.basename(argv0) == "memosfs" and os.access(argv0, os.X_OK):
        return os.path.abspath(argv0)
    return f"{sys.executable} -m memosfs"



# the options memosfs itself takes besides the knobs
OWN_OPTIONS = ("ssd", "log", "debug", "foreground", "remote", "remote_durable", "nonempty")
# what libfuse 3 and the kernel take (fuse(8), mount(8)'s filesystem-independent
# flags); anything else is refused before the mount touches anything
FUSE_OPTIONS = ("allow_other", "allow_root", "auto_unmount", "blkdev", "default_permissions",
                "ro", "rw", "suid", "nosuid", "dev", "nodev", "exec", "noexec", "sync",
                "async", "dirsync", "atime", "noatime", "diratime", "nodiratime",
                "relatime", "norelatime", "strictatime", "nostrictatime", "lazytime",
                "nolazytime", "silent", "loud")
FUSE_VALUE_OPTIONS = ("fsname", "subtype", "max_read", "blksize", "user_id", "group_id",
                      "rootmode", "context", "fscontext", "defcontext", "rootcontext")


def parse_mount_options(opts: Sequence[str]) -> tuple[dict, dict, set]:
    """Split -o values into (knobs, own options, libfuse options); knob
    values typed (memosfs/knobs.py).  SystemExit, saying why, for a bad
    knob value or an option nobody takes (with the closest name)."""
    knobs: dict[str, object] = {}
    own: dict[str, str] = {}
    fuse: set[str] = set()
    for group in opts:
        for opt in _join_remote_hosts(group.split(",")):
            opt = opt.strip()
            if not opt or opt in _IGNORED_OPTS or opt.startswith(("x-", "comment=")):
                continue
            name, eq, value = opt.partition("=")
            if name in KNOB_BY_NAME:
                try:
                    knobs[name] = KNOB_BY_NAME[name].parse(value)
                except KnobError as e:
                    raise SystemExit(f"memosfs: bad option {opt!r}: {e}")
            elif name in OWN_OPTIONS:
                own[name] = value
            elif (name in FUSE_OPTIONS and not eq) or (name in FUSE_VALUE_OPTIONS and eq):
                fuse.add(opt)
            else:
                raise SystemExit(f"memosfs: unknown option {opt!r}{_closest(name)}; "
                                 f"`{self_command()} knobs` lists the knobs, "
                                 f"`{self_command()} mount -h` the other options")
    return knobs, own, fuse


# Every mount is nodev,nosuid, whatever starts it: libfuse mounts so by
# default, but mount.fuse3 (mount(8), fstab, a systemd mount unit) adds
# `dev,suid` to every mount that does not say nodev/nosuid, and mount(8)
# passes an explicit `dev` or `suid` in the same way, so neither can be told
# from the other.  Slots are neither device nodes nor programs to run as
# their owner (docs/semantics.md).
ALWAYS_OPTIONS = ("nodev", "nosuid")


def _without_dev_suid(fuse: set[str]) -> set[str]:
    """The libfuse options with `dev` and `suid` replaced by ALWAYS_OPTIONS."""
    given = fuse & {"dev", "suid"}
    if given:
        log.info("mount options %s: not taken (memosfs mounts nodev,nosuid whatever starts "
                 "it; mount.fuse3 adds dev,suid to every mount)", ",".join(sorted(given)))
    return (fuse - {"dev", "suid"}) | set(ALWAYS_OPTIONS)


def _closest(name: str) -> str:
    """`: did you mean X?` for the option name nearest to a mistyped one."""
    import difflib
    names = [k.name for k in KNOBS] + list(OWN_OPTIONS) + list(FUSE_OPTIONS) \
        + list(FUSE_VALUE_OPTIONS)
    near = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return f" (did you mean {near[0]!r}?)" if near else ""


def _join_remote_hosts(parts: list[str]) -> list[str]:
    """remote=redis://h1:1,h2:2?opts arrives split at its commas: put the
    host:port pieces that follow a remote= option back onto it."""
    import re
    host = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):\d+")
    out: list[str] = []
    for p in parts:
        if out and out[-1].strip().startswith("remote=") and "?" not in out[-1] \
                and host.fullmatch(p.strip().split("?", 1)[0]):
            out[-1] += "," + p.strip()
        else:
            out.append(p)
    return out


def _setup_logging(path: Optional[str], debug: bool) -> None:
    """Log to path (made 0600 if new, group/other access taken off if it
    was there with it: the log names agents, sessions and slots), else stderr."""
    from memosfs.private import tighten_file
    handler: logging.Handler
    tightened = False
    problem = None
    if path:
        try:
            _created, tightened = tighten_file(path)
        except OSError as e:            # FileHandler says why it cannot open it
            problem = e
        handler = logging.FileHandler(path)
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(
        "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if debug else logging.INFO)
    if tightened:
        log.warning("log file %s: took group/other access off it (it names agents, "
                    "sessions and slots; kept 0600)", path)
    elif problem is not None:
        log.error("log file %s: cannot check its mode: %s; other users may read it",
                  path, problem)


def _mount_device(mountpoint: str) -> Optional[str]:
    """`major:minor` of the mount at mountpoint, from /proc/self/mountinfo
    (a stat() would ask the filesystem itself, which is not serving yet)."""
    dev = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and fields[4] == mountpoint:
                    dev = fields[2]     # the last one wins: mounts stack
    except OSError:
        pass
    return dev


def _unescape_mountinfo(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash as \\ooo."""
    import re
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts_at(mountpoint: str) -> list[str]:
    """The filesystem types mounted at mountpoint (bottom first), from
    /proc/self/mountinfo: no request to the mount itself, which may be hung.
    The mountpoint is taken as given and with its parent's links resolved
    (a realpath of the mountpoint itself would stat the mount)."""
    mountpoint = os.path.abspath(mountpoint)
    names = {mountpoint, os.path.join(os.path.realpath(os.path.dirname(mountpoint)),
                                      os.path.basename(mountpoint))}
    found = []
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and _unescape_mountinfo(fields[4]) in names \
                        and "-" in fields[5:]:
                    rest = fields[fields.index("-", 5) + 1:]
                    found.append(rest[0] if rest else "")
    except OSError:
        pass
    return found


def _live_fuse_mount(mountpoint: str) -> Optional[str]:
    """The refusal message if a FUSE filesystem is mounted at mountpoint."""
    fuse = [t for t in _mounts_at(mountpoint) if t == "fuse" or t.startswith("fuse.")]
    if not fuse:
        return None
    daemon = _read_run_file(_run_file(mountpoint, "pid")) or {}
    pid = daemon.get("pid")
    who = f" (pid {pid})" if isinstance(pid, int) and _alive(pid) else ""
    return (f"memosfs: {mountpoint} already has a {fuse[-1]} mount{who}; unmount it "
            f"first ({self_command()} umount {mountpoint}) or pass -o nonempty / --force to "
            f"mount over it")


def _mark_mountpoint(mountpoint: str) -> None:
    """Mark the mount point directory (abi.MOUNTPOINT_XATTR, on the
    directory beneath the mount) so that a client can tell a path below it
    from any other once nothing is mounted there (memosfs/client/mounts.py).
    Not over a live mount (its root is no directory of ours, and may hang)."""
    from memosfs.abi import MOUNTPOINT_XATTR
    if _mounts_at(mountpoint):
        return
    try:
        os.getxattr(mountpoint, MOUNTPOINT_XATTR)
        return
    except OSError:
        pass
    try:
        os.setxattr(mountpoint, MOUNTPOINT_XATTR, b"1")
    except OSError as e:                # (a file system without user attributes)
        log.debug("mount point %s not marked: %s", mountpoint, e)


def _raise_readahead(mountpoint: str, kib: int = 8192) -> None:
    """FUSE starts with 128 KiB readahead; slots are large, so read ahead more."""
    dev = _mount_device(mountpoint)
    if dev is None:
        return
    try:
        with open(f"/sys/class/bdi/{dev}/read_ahead_kb", "w") as f:
            f.write(str(kib))
    except OSError as e:
        log.debug("read_ahead_kb unchanged: %s", e)


def cmd_mount(args: argparse.Namespace) -> int:
    knobs, own, fuse_opts = parse_mount_options(args.o or [])
    foreground = args.foreground or "foreground" in own
    debug = "debug" in own or args.debug
    logfile = own.get("log") or (None if foreground else DEFAULT_LOG)
    _setup_logging(logfile, debug)
    mountpoint = os.path.abspath(args.mountpoint)
    if not (args.force or "nonempty" in own):   # before any stat of it: it may hang
        refused = _live_fuse_mount(mountpoint)
        if refused:
            if logfile:                 # else the log is stderr: say it once
                log.error("%s", refused.removeprefix("memosfs: "))
            print(refused, file=sys.stderr)
            return 1
    if not os.path.isdir(mountpoint):
        print(f"memosfs: mountpoint {mountpoint} is not a directory", file=sys.stderr)
        return 1
    ssd = own.get("ssd") or DEFAULT_SSD

    from memosfs.fuse.control import check_capacity
    capacity = knobs.get("capacity", KNOB_BY_NAME["capacity"].default)
    try:                                # the memory tier is made before the knobs apply
        check_capacity(capacity)
    except KnobError as e:
        print(f"memosfs: bad option capacity={capacity}: {e}", file=sys.stderr)
        return 1

    # One daemon per SSD directory: the lock first, before anything reads or
    # changes the directory (the tightening walk, the scan, the writes).
    lock = None
    if ssd != "none":
        from memosfs.private import private_makedirs
        from memosfs.store.ssd import DirectoryInUse, DirLock
        try:
            private_makedirs(ssd)
            lock = DirLock.acquire(ssd, mountpoint, still_serving=_mounts_at)
        except DirectoryInUse as e:
            if logfile:
                log.error("cannot mount %s: %s", mountpoint, e)
            print(f"memosfs: cannot mount {mountpoint}: {e}", file=sys.stderr)
            return 1
        except OSError as e:
            print(f"memosfs: cannot use ssd directory {ssd}: {e.strerror}", file=sys.stderr)
            return 1
    try:
        return _mount_locked(args, knobs, own, fuse_opts, foreground, mountpoint, ssd, lock)
    finally:
        if lock is not None:            # the daemon's own copy stays open after a fork
            lock.close()


def _mount_locked(args, knobs, own, fuse_opts, foreground, mountpoint, ssd, lock) -> int:
    """The rest of cmd_mount, once the SSD directory is ours."""
    import pyfuse3
    import trio

    from memosfs import _native
    from memosfs.fuse.core import flush_folded
    from memosfs.fuse.operations import MemosOperations
    from memosfs.store.ssd import SSDTier
    from memosfs.store.store import Store, UnsavedSlots

    _native.tune_malloc()
    tier = None
    if ssd != "none":                   # ssd=none: a memory-only cache
        try:
            tier = SSDTier(ssd)         # (its capacity is a knob: applied below)
        except OSError as e:
            print(f"memosfs: cannot use ssd directory {ssd}: {e.strerror}", file=sys.stderr)
            return 1
    remote = None
    if own.get("remote"):               # remote=redis://host:port,...: the shared tier
        from memosfs.store.remote import RemoteRefused, RemoteTier, hide_url_passwords
        hide_url_passwords()            # not in ps or /proc/PID/cmdline
        durable = own.get("remote_durable", "0")
        if durable not in ("0", "1"):
            print(f"memosfs: remote_durable takes 0 or 1, not {durable!r}", file=sys.stderr)
            return 1
        try:
            remote = RemoteTier(own["remote"], durable=durable == "1")
        except (ValueError, ImportError) as e:
            print(f"memosfs: bad remote= option: {e}", file=sys.stderr)
            return 1
        try:                            # refused credentials or TLS: fail the mount now
            unreachable = remote.check()
        except RemoteRefused as e:
            log.error("remote tier %s refused: %s", remote.config.redacted(), e)
            print(f"memosfs: cannot mount {mountpoint}: remote tier "
                  f"{remote.config.redacted()} refused: {e}", file=sys.stderr)
            return 1
        if unreachable:
            log.warning("remote tier %s: %s", remote.config.redacted(), unreachable)
    # the memory tier is made at its capacity; every knob, that one too, is
    # then applied by the same function as a write into its file
    store = Store(int(knobs.get("capacity", KNOB_BY_NAME["capacity"].default)), ssd=tier,
                  remote=remote)
    try:
        ops = MemosOperations(store, knobs)
    except KnobError as e:
        print(f"memosfs: bad option {e}", file=sys.stderr)
        store.close()
        return 1
    restored = ops.restore()
    if tier is not None and (restored or tier.corrupt):
        log.info("ssd tier %s: %d slots (%d bytes), %d corrupt files set aside", ssd,
                 restored, tier.used_bytes, tier.corrupt)

    options = set(pyfuse3.default_options)
    options |= {f"fsname={args.source}", "subtype=memosfs", "default_permissions"}
    if os.geteuid() == 0:
        options.add("allow_other")
    options |= _without_dev_suid(fuse_opts)
    _negotiate_kernel_flags(ops)
    _mark_mountpoint(mountpoint)
    try:
        pyfuse3.init(ops, mountpoint, options)
    except RuntimeError as e:
        print(f"memosfs: cannot mount {mountpoint}: {e}", file=sys.stderr)
        return 1
    ops.start_kernel_notifications(mountpoint)
    _raise_readahead(mountpoint)

    if not foreground:
        if not _daemonize():
            return 0                  # the parent: the mount is up
        if lock is not None:
            lock.note(os.getpid(), mountpoint)      # the daemon holds it now
    else:
        print(f"memosfs: mounted {args.source} at {mountpoint} "
              f"(capacity {store.cache.capacity} bytes, ssd {ssd}); "
              f"Ctrl-C or `{self_command()} umount {mountpoint}` unmounts", flush=True)
    log.info("mounted %s at %s, capacity %d, options %s", args.source, mountpoint,
             store.cache.capacity, ",".join(sorted(options)))

    _note_daemon(mountpoint)            # for `memosfs umount`: who to wait for
    store.start_background()
    if remote is not None and not remote.wait_ready(3.0):
        log.warning("remote tier %s not reachable yet; serving local tiers, retrying in "
                    "the background", remote.config.redacted())
    bar = _ProgressBar("warm-up") if foreground and sys.stdout.isatty() else None
    store.start_warmup(ops.knobs["warmup_ratio"], bar.update if bar else None)
    unmount = True
    status = 0
    unsaved = 0
    error = ""
    lost: list[str] = []
    try:
        unmount = trio.run(_serve, ops)
    except BaseException:
        log.exception("main loop failed")
        status = 1
        error = "the main loop failed"
        raise
    finally:
        ops.stop_kernel_notifications()
        if os.environ.get("MEMOSFS_CHECK_AT_UNMOUNT") == "1":
            problems = ops.check_all()
            for p in problems:
                log.error("consistency check at unmount failed: %s", p)
            if not problems:
                log.info("consistency check at unmount: ok")
        ops.unmount_guard.release()     # (else our own unmount below is EBUSY)
        try:
            store.close()               # persists every dirty slot
        except UnsavedSlots as e:       # each one is in the log, at ERROR
            log.error("unmount: %s", e.strerror)
            unsaved, error, status = e.count, e.strerror, 1
            lost = [k.decode("utf-8", "replace") for k in e.keys[:LOST_NAMED]]
        except OSError as e:
            said = e.strerror or str(e)
            log.error("unmount: could not persist every dirty slot: %s", said)
            error, status = f"could not persist every dirty slot: {said}", 1
        finally:
            pyfuse3.close(unmount=unmount)
        flush_folded()                  # (a refusal that came again: its count)
        log.info("unmounted %s", mountpoint)
        if error:
            print(f"memosfs: unmount of {mountpoint}: {error}", file=sys.stderr, flush=True)
        if foreground:
            print(f"memosfs: unmounted {mountpoint}", flush=True)
        _note_exit(mountpoint, status, unsaved, error, lost)
    return status


LOST_NAMED = 100        # slots lost at unmount that the exit report names


FUSE_HANDLE_KILLPRIV_V2 = 1 << 28      # <linux/fuse.h>: the server clears suid/sgid


def _negotiate_kernel_flags(ops) -> None:
    """FUSE_HANDLE_KILLPRIV_V2 (libfuse 3.14 does not know it;
    memosfs._fuseshim adds it to the INIT reply): the kernel then stops
    asking for security.capability before every write(2) (once per inode
    until its attributes are refreshed) and leaves the suid/sgid clearing to
    the handlers (the KILL_SUIDGID flags): a 4 KiB write stream sends one
    request per write instead of two, and with the writeback cache a small
    write costs no request at all."""
    try:
        from memosfs import _fuseshim
    except ImportError:
        return
    if hasattr(_fuseshim, "set_init_flags"):
        _fuseshim.set_init_flags(FUSE_HANDLE_KILLPRIV_V2)
    ops.want_passthrough()


# A mounted daemon leaves its pid in the run folder, and at exit how its
# unmount went, so that `memosfs umount` (another process) can wait for it
# and report slots it could not save.

def _run_dir() -> Optional[str]:
    """/run/memosfs as root, else $XDG_RUNTIME_DIR/memosfs or /tmp/memosfs-UID;
    None if it cannot be made ours."""
    uid = os.geteuid()
    if uid == 0:
        base = "/run/memosfs"
    elif os.environ.get("XDG_RUNTIME_DIR"):
        base = os.path.join(os.environ["XDG_RUNTIME_DIR"], "memosfs")
    else:
        base = f"/tmp/memosfs-{uid}"
    from memosfs.private import private_makedirs
    import stat
    try:
        private_makedirs(base)
        st = os.lstat(base)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid:
        return None
    if stat.S_IMODE(st.st_mode) & 0o077:    # ours, made looser: ours alone again
        try:
            os.chmod(base, stat.S_IMODE(st.st_mode) & 0o700)
        except OSError:
            return None
    return base


def _run_file(mountpoint: str, kind: str) -> Optional[str]:
    import hashlib
    base = _run_dir()
    if base is None:
        return None
    # abspath, not realpath: a stat of the mountpoint would ask the mount itself
    # (in the daemon before it serves: a deadlock)
    tag = hashlib.sha256(os.path.abspath(mountpoint).encode()).hexdigest()[:24]
    return os.path.join(base, f"{tag}.{kind}")


def _write_run_file(path: Optional[str], obj: dict) -> None:
    if path is None:
        return
    try:
        from memosfs.private import open_private
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(open_private(tmp, os.O_WRONLY | os.O_TRUNC), "w") as f:
            json.dump(obj, f)
        os.replace(tmp, path)
    except OSError as e:
        log.debug("run file %s not written: %s", path, e)


def _note_daemon(mountpoint: str) -> None:
    path = _run_file(mountpoint, "pid")
    _write_run_file(path, {"pid": os.getpid(), "mountpoint": mountpoint})
    if path is not None:                # what dead daemons left (kill -9), old reports
        base = os.path.dirname(path)
        for name in os.listdir(base):
            f = os.path.join(base, name)
            try:
                if name.endswith(".pid"):
                    stale = not _alive(int((_read_run_file(f) or {}).get("pid", 0)))
                else:
                    stale = name.endswith(".exit") and \
                        time.time() - os.stat(f).st_mtime > 3600
                if stale:
                    os.unlink(f)
            except (OSError, ValueError, TypeError):
                pass


def _note_exit(mountpoint: str, status: int, unsaved: int, error: str,
               lost: Sequence[str] = ()) -> None:
    _write_run_file(_run_file(mountpoint, "exit"),
                    {"pid": os.getpid(), "status": status, "slots_unsaved": unsaved,
                     "error": error, "lost": list(lost)})
    pid_file = _run_file(mountpoint, "pid")
    try:
        with open(pid_file or "") as f:
            if json.load(f).get("pid") == os.getpid():
                os.unlink(pid_file)
    except (OSError, ValueError):
        pass


def _read_run_file(path: Optional[str]) -> Optional[dict]:
    try:
        with open(path or "") as f:
            obj = json.load(f)
        return obj if isinstance(obj, dict) else None
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    """pid runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


async def _serve(ops) -> bool:
    """Run the FUSE loop until the kernel unmounts (returns False) or a signal
    asks us to stop (returns True: we unmount).  SIGINT and SIGHUP are
    refused once while dirty slots cannot be written back (the terminal and
    the log say which; the next one unmounts and loses them); SIGTERM
    unmounts at once (memosfs/fuse/unmount.py)."""
    import pyfuse3
    import trio

    ops.trio_token = trio.lowlevel.current_trio_token()
    stopped_by_signal = False
    async with trio.open_nursery() as nursery:
        async def on_signals() -> None:
            nonlocal stopped_by_signal
            refused = False
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM,
                                           signal.SIGHUP) as signals:
                async for sig in signals:
                    if sig != signal.SIGTERM and not refused:
                        held = await ops.unmount_guard.refuse_signal()
                        if held is not None:
                            refused = True
                            said = (f"not unmounting {ops.mountpoint}: {held.say()}. Make "
                                    f"room, or send the signal again (Ctrl-C) to unmount "
                                    f"and lose them")
                            log.warning("signal %d: %s", sig, said)
                            print(f"memosfs: {said}", file=sys.stderr, flush=True)
                            continue
                    log.info("signal %d: unmounting", sig)
                    stopped_by_signal = True
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(on_signals)
        nursery.start_soon(ops.background)
        await pyfuse3.main()
        nursery.cancel_scope.cancel()
    return stopped_by_signal


def _daemonize() -> bool:
    """Double fork; returns False in the original process once the daemon runs."""
    r, w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(w)
        os.read(r, 1)
        os.close(r)
        os.waitpid(pid, 0)
        return False
    os.close(r)
    os.setsid()
    if os.fork():
        os._exit(0)
    os.chdir("/")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.write(w, b"1")
    os.close(w)
    return True


class _ProgressBar:
    """`warm-up [#######.........]  45%  460/1024 MiB` on a terminal."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.last = -1

    def update(self, done: int, total: int) -> None:
        pct = 100 if total == 0 else int(100 * done / total)
        if pct == self.last:
            return
        self.last = pct
        filled = pct * 30 // 100
        print(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] {pct:3d}%  "
              f"{done >> 20}/{total >> 20} MiB", end="\n" if pct >= 100 else "", flush=True)


def _unsaved_at(mountpoint: str):
    """Write every dirty slot back now (root writes 1 into cache/flush);
    what the SSD tier could not take (memosfs/fuse/unmount.py's Unsaved),
    or None when nothing is unsaved or this user may not ask."""
    from memosfs.fuse.unmount import Unsaved
    cache = os.path.join(mountpoint, ".memos", "cache")
    try:
        fd = os.open(os.path.join(cache, "flush"), os.O_WRONLY)
    except OSError:                     # (not root: the daemon's hold still refuses)
        return None
    try:
        os.write(fd, b"1\n")
        return None
    except OSError:
        pass                            # slots remain dirty: which, below
    finally:
        os.close(fd)
    try:
        with open(os.path.join(cache, "unsaved")) as f:
            got = Unsaved.parse(f.read())
    except (OSError, ValueError):
        return None
    return got if got.count else None


def cmd_umount(args: argparse.Namespace) -> int:
    """Unmount; unless lazy, wait for the daemon to persist everything and
    exit 1 (saying how many on stderr) if it could not save every slot.
    Refused (exit 1, naming the slots and the room missing) while dirty
    slots cannot be written back to the SSD tier, unless --force."""
    mountpoint = os.path.abspath(args.mountpoint)
    mounted = _mounts_at(mountpoint)
    if "fuse.memosfs" not in mounted:
        what = f"a {mounted[-1]} filesystem is mounted there" if mounted else \
            "nothing is mounted there" if os.path.isdir(mountpoint) else \
            "no such directory"
        print(f"memosfs: {mountpoint} is not a memosfs mount ({what})", file=sys.stderr)
        return 1
    unsaved = _unsaved_at(mountpoint)
    if unsaved is not None and not args.force:
        print(f"memosfs: not unmounting {mountpoint}: {unsaved.say()}. Make room in the SSD "
              f"directory (or raise ssd_capacity) and run it again, or `{self_command()} "
              f"umount --force {mountpoint}` to unmount and lose them", file=sys.stderr)
        return 1
    if unsaved is not None:             # --force: the daemon lets the mount go
        try:
            with open(os.path.join(mountpoint, ".memos", "cache", "unmount_unsaved"),
                      "w") as f:
                f.write("lose\n")
        except OSError as e:
            print(f"memosfs: {mountpoint}: cannot set unmount_unsaved=lose: {e.strerror}",
                  file=sys.stderr)
            return 1
    daemon = _read_run_file(_run_file(mountpoint, "pid"))
    pid = daemon.get("pid") if daemon else None
    if not isinstance(pid, int) or not _alive(pid):
        pid = None
    cmd = ["fusermount3", "-u"] + (["-z"] if args.lazy else []) + [args.mountpoint]
    if shutil.which("fusermount3") is None:
        cmd = ["umount"] + (["-l"] if args.lazy else []) + [args.mountpoint]
    r = subprocess.run(cmd)
    if r.returncode != 0:
        print(f"memosfs: {mountpoint} is still mounted: a process has a file or its "
              f"working directory there, or the daemon holds it because dirty slots "
              f"cannot be written back to the SSD tier (its log says which; root's "
              f"`{self_command()} umount` names them)", file=sys.stderr)
    if r.returncode != 0 or args.lazy or pid is None:
        return r.returncode
    exit_file = _run_file(mountpoint, "exit")
    deadline = time.monotonic() + args.timeout
    while True:
        report = _read_run_file(exit_file)
        if report is not None and report.get("pid") == pid:
            break
        if not _alive(pid):
            report = _read_run_file(exit_file)
            if report is None or report.get("pid") != pid:
                print(f"memosfs: the daemon of {mountpoint} (pid {pid}) ended without "
                      "saying how its unmount went", file=sys.stderr)
                return 1
            break
        if time.monotonic() > deadline:
            print(f"memosfs: the daemon of {mountpoint} (pid {pid}) is still persisting "
                  f"after {args.timeout:g} s", file=sys.stderr)
            return 1
        time.sleep(0.05)
    try:
        os.unlink(exit_file or "")
    except OSError:
        pass
    if report.get("status", 0) != 0 or report.get("slots_unsaved", 0):
        lost = report.get("lost") or []
        more = report.get("slots_unsaved", 0) - len(lost)
        named = (": " + ", ".join(lost) + (f" and {more} more" if more > 0 else "")) \
            if lost else ""
        print(f"memosfs: unmount of {mountpoint}: "
              f"{report.get('error') or 'the daemon failed'}{named}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------- stat


def cmd_stat(args: argparse.Namespace) -> int:
    path = os.path.join(args.mountpoint, ".memos", "cache", "stats.json")
    try:
        with open(path) as f:
            stats = json.load(f)
    except OSError as e:
        print(f"memosfs: {args.mountpoint} is not a memosfs mount ({e.strerror})",
              file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(stats, indent=2))
        return 0
    width = max(len(k) for k in stats)
    for k, v in stats.items():
        if isinstance(v, float):
            shown = f"{v:.4f}"
        elif isinstance(v, int) and ("bytes" in k or k == "capacity"):
            shown = f"{v:>14,d}  ({_human(v)})"
        elif isinstance(v, int):
            shown = f"{v:>14,d}"
        else:
            shown = str(v)
        print(f"{k:<{width}}  {shown}")
    return 0


def tier_usage(mountpoint: str) -> list[dict]:
    """Each tier's size, used bytes and room (what `memosfs df` prints):
    memory from the stats; the SSD tier's bytes from the stats, its size
    and room from what statfs gives beyond the memory tier's (namespace.py
    `statfs`), so that the rows add up to `df`'s.  OSError when mountpoint
    is not a memosfs mount."""
    with open(os.path.join(mountpoint, ".memos", "cache", "stats.json")) as f:
        stats = json.load(f)
    v = os.statvfs(mountpoint)
    page = v.f_frsize
    cap = int(stats["capacity"])
    mem_free = min(cap, int(stats["free_pages"]) * page)
    rows = [{"tier": "memory", "size": cap, "used": cap - mem_free, "avail": mem_free}]
    if "ssd_bytes" in stats:
        rows.append({"tier": "ssd", "size": max(0, v.f_blocks * page - cap),
                     "used": int(stats["ssd_bytes"]),
                     "avail": max(0, v.f_bavail * page - mem_free)})
    for r in rows:
        # df's Use%: used / (used + avail), rounded up
        total = r["used"] + r["avail"]
        r["use_pct"] = -(-100 * r["used"] // total) if total else 0
        r["mountpoint"] = mountpoint
    return rows


def _df_size(n: int) -> str:
    """A size as `df -h` prints it (powers of 1024, one decimal below 10)."""
    for unit in ("B", "K", "M", "G", "T", "P"):
        if n < 1024 or unit == "P":
            if unit == "B":
                return f"{n}B" if n else "0"
            return f"{n:.1f}{unit}" if n < 10 else f"{n:.0f}{unit}"
        n /= 1024
    return str(n)


def cmd_df(args: argparse.Namespace) -> int:
    """Each tier of each mount on a line of its own: `df` adds the tiers up,
    so a full memory tier beside a large disk shows as 1%; here the memory
    row's Use% is the memory tier's."""
    rows, rc = [], 0
    for mp in args.mountpoint:
        try:
            rows += tier_usage(mp)
        except (OSError, ValueError, KeyError) as e:
            print(f"memosfs: {mp} is not a memosfs mount "
                  f"({getattr(e, 'strerror', None) or e})", file=sys.stderr)
            rc = 1
    if args.json:
        print(json.dumps(rows, indent=2))
        return rc
    table = [("Tier", "Size", "Used", "Avail", "Use%", "Mounted on")]
    table += [(r["tier"], _df_size(r["size"]), _df_size(r["used"]), _df_size(r["avail"]),
               f"{r['use_pct']}%", r["mountpoint"]) for r in rows]
    if rows:
        widths = [max(len(row[i]) for row in table) for i in range(5)]
        for row in table:
            print(f"{row[0]:<{widths[0]}} " + " ".join(
                f"{c:>{w}}" for c, w in zip(row[1:5], widths[1:])) + f" {row[5]}")
    return rc


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def cmd_why(args: argparse.Namespace) -> int:
    """Why the caller's last request on the mount was refused (.memos/why)."""
    path = os.path.join(args.mountpoint, ".memos", "why")
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        print(f"memosfs: {args.mountpoint} is not a memosfs mount ({e.strerror})",
              file=sys.stderr)
        return 1
    print(text, end="")
    return 0


# ---------------------------------------------------------------- calc-size


def calc_size(tokens: int, layers: int, kv_width: int, dtype_bytes: float,
              redundancy: float) -> int:
    """layers × tokens × kv_width × 2 (key and value) × dtype bytes × redundancy."""
    return int(layers * tokens * kv_width * 2 * dtype_bytes * redundancy)


def cmd_calc_size(args: argparse.Namespace) -> int:
    if args.hidden is not None:
        width = args.hidden
    elif args.kv_heads is not None and args.head_dim is not None:
        width = args.kv_heads * args.head_dim
    else:
        print("memosfs calc-size: give --hidden, or --kv-heads and --head-dim",
              file=sys.stderr)
        return 2
    dtype = args.dtype.lower()
    if dtype not in DTYPE_BYTES:
        print(f"memosfs calc-size: unknown dtype {args.dtype!r} "
              f"(one of {', '.join(DTYPE_BYTES)})", file=sys.stderr)
        return 2
    for name in ("tokens", "layers"):
        if getattr(args, name) <= 0:
            print(f"memosfs calc-size: --{name} must be positive", file=sys.stderr)
            return 2
    if width <= 0 or args.redundancy <= 0:
        print("memosfs calc-size: width and redundancy must be positive", file=sys.stderr)
        return 2
    n = calc_size(args.tokens, args.layers, width, DTYPE_BYTES[dtype], args.redundancy)
    if args.json:
        print(json.dumps({"bytes": n, "tokens": args.tokens, "layers": args.layers,
                          "kv_width": width, "dtype": dtype,
                          "redundancy": args.redundancy}))
    else:
        print(f"{n} bytes ({_human(n)})")
    return 0


# ---------------------------------------------------------------- knobs


def knob_table_markdown() -> str:
    """docs/knobs.md's knob table, made from the knob table itself.  A `|`
    in a cell is escaped (`\\|`), so every row has its five cells in any
    GitHub-style renderer."""
    rows = ["| knob | default | accepts | takes effect | meaning |", "|---|---|---|---|---|"]
    for k in KNOBS:
        default = _human_size(k.default) if k.name == "capacity" else k.format(k.default).strip()
        cells = [f"`{k.name}`", default, k.range_text(), k.effect, k.meaning]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows) + "\n"


def _human_size(n: int) -> str:
    for suffix, mult in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n % mult == 0:
            return f"{n // mult}{suffix}"
    return str(n)


def cmd_knobs(args: argparse.Namespace) -> int:
    if args.markdown:
        print(knob_table_markdown(), end="")
        return 0
    for k in KNOBS:
        print(f"{k.name:<22} default {k.format(k.default).strip():<10} accepts {k.range_text()}: "
              f"{k.meaning} ({k.effect})")
    return 0


# ---------------------------------------------------------------- main


def version() -> str:
    """The installed distribution's version (pyproject.toml's; the package's
    `__version__` is the same, tests/test_version.py)."""
    from importlib import metadata
    try:
        return metadata.version("memosfs")
    except metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e . in the checkout)"


class _PrintVersion(argparse.Action):
    """-V, --version: `memosfs X.Y.Z`, exit 0 (asked only when given)."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, help="print the version and exit")

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"memosfs {version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="memosfs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-V", "--version", action=_PrintVersion)
    sub = p.add_subparsers(dest="cmd")

    m = sub.add_parser("mount", help="mount memosfs")
    m.add_argument("source")
    m.add_argument("mountpoint")
    m.add_argument("-o", action="append", metavar="OPTS",
                   help="comma-separated options: " + ", ".join(k.name for k in KNOBS)
                   + ", ssd=DIR (one daemon per directory: a second one is refused), "
                   "log=FILE, debug, nonempty (see --force), and libfuse options")
    m.add_argument("-f", "--foreground", action="store_true")
    m.add_argument("-d", "--debug", action="store_true")
    m.add_argument("--force", action="store_true",
                   help="mount even if MOUNTPOINT already has a FUSE filesystem (another "
                   "memosfs, say) mounted on it: stack this one on top (-o nonempty "
                   "does the same); without it such a mount is refused")
    m.set_defaults(fn=cmd_mount)

    u = sub.add_parser("umount", help="unmount")
    u.add_argument("mountpoint")
    u.add_argument("-l", "--lazy", action="store_true")
    u.add_argument("--force", action="store_true",
                   help="unmount even if dirty slots cannot be written back to the SSD "
                        "tier (they are lost, and named)")
    u.add_argument("--timeout", type=float, default=600,
                   help="seconds to wait for the daemon to persist everything")
    u.set_defaults(fn=cmd_umount)

    s = sub.add_parser("stat", help="show the stats of a mount")
    s.add_argument("mountpoint")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_stat)

    d = sub.add_parser("df", help="each tier's size, use and room (df adds them up)")
    d.add_argument("mountpoint", nargs="+")
    d.add_argument("--json", action="store_true")
    d.set_defaults(fn=cmd_df)

    w = sub.add_parser("why", help="why your last request on the mount was refused")
    w.add_argument("mountpoint")
    w.set_defaults(fn=cmd_why)

    from memosfs import top
    top.add_parser(sub)
    from memosfs import cachectl
    cachectl.add_parsers(sub)

    c = sub.add_parser("calc-size", help="bytes of a KV cache")
    c.add_argument("--tokens", type=int, required=True)
    c.add_argument("--layers", type=int, required=True)
    c.add_argument("--hidden", type=int, help="hidden size (multi-head attention)")
    c.add_argument("--kv-heads", type=int, help="KV heads (grouped-query attention)")
    c.add_argument("--head-dim", type=int)
    c.add_argument("--dtype", default="fp16")
    c.add_argument("--redundancy", type=float, default=1.0)
    c.add_argument("--json", action="store_true")
    c.set_defaults(fn=cmd_calc_size)

    k = sub.add_parser("knobs", help="list the knobs of .memos/cache/")
    k.add_argument("--markdown", action="store_true", help="as the table of docs/knobs.md")
    k.set_defaults(fn=cmd_knobs)

    from memosfs.bench import cli as bench
    bench.add_parser(sub)
    return p


SUBCOMMANDS = {"mount", "umount", "stat", "df", "why", "top", "calc-size", "bench", "knobs", "ls",
               "evict", "drop", "pin", "unpin", "-h", "--help", "-V", "--version"}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in SUBCOMMANDS:
        argv = ["mount"] + argv      # memosfs SOURCE MOUNTPOINT -o ... (mount.fuse3)
    args = build_parser().parse_args(argv)
    if not getattr(args, "fn", None):
        build_parser().print_help()
        return 2
    try:
        return args.fn(args) or 0
    except BrokenPipeError:             # `memosfs stat MNT | head -1`: the reader left
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())     # (nothing left to flush at exit)
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
