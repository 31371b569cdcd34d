"""Eight processes mixing every namespace and data operation on one session for
a while (MEMOSFS_STRESS_SECONDS, default 20; `make test-stress` runs 300), on a
64 MiB memory tier that has to evict to the SSD tier, then a remount.

Layout under the session a/s (each worker w has a private directory pw<w>):

  k0..k7, n/k0..n/k3, n/m/k0..n/m/k1   shared slots: every worker rewrites them
        whole (O_TRUNC) or by the engine pattern (tmp, fsync, rename over),
        renames them onto each other, unlinks them, reads and stats them
  log0, log1, n/log2                   shared logs: every worker appends records
        (O_APPEND, one write per record), nobody truncates, renames or unlinks
  pw<w>/p0..p5, pw<w>/d/q0..q3         private slots: only worker w writes them
        (tmp + fsync + rename, renames among them, unlinks, sometimes an O_TRUNC
        rewrite); every worker reads and stats them

Every slot body carries a header (magic, writer, sequence, length, sha256 of the
body); every log record is one line `wid seq payload check`.  The checks:

- torn reads: every read of any slot is whole (header and sha256 agree) or empty
  (a shared slot whose rewrite was refused for want of memory and truncated by its
  careful writer); every log read is whole records, none twice, each worker's in
  its order, and it holds every record the reader itself appended and closed;
- the writer's view: after its writes and before it closes, a writer's fstat shows
  the size it wrote, however many other processes stat the name meanwhile;
- private slots: the owner reads back exactly what it last acknowledged, a stat
  shows that size; pinning or unpinning one works on whichever tier holds it, and
  a pinned one reports pin=1 and tier=mem (pins of shared slots and logs may meet
  a name that is gone: ENOENT);
- at the end, 0 lost records: every acknowledged append is in its log exactly once,
  no refused one is, nothing else is; 0 vanished names: each private directory
  holds exactly the names its owner's acknowledged operations left, with the
  contents it last acknowledged (a name an owner never unlinked does not vanish);
- the daemon is alive, slots_lost 0 (the SSD had room), no SSD write error or
  corrupt file;
- flush, snapshot (every path, sha256 of every slot), unmount (exit 0: nothing
  unsaved), mount the same SSD directory again: the same snapshot.

Any other errno than the ones each operation may meet (ENOENT where another
worker may have removed the name; ENOSPC/EFBIG for writes) is a failure too.
So is an ERROR line in the daemon's log (its internal checks log there).
The logs exist before the workers start; two appenders creating a log together,
a pin of a slot on the SSD tier, and an appender meeting a reader on a log that
the SSD tier holds, have tests of their own below.
MEMOSFS_STRESS_SEED varies the workers' seeds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

WORKERS = 8
DURATION = float(os.environ.get("MEMOSFS_STRESS_SECONDS", "20"))
# make test-stress runs it again on a smaller memory tier: more evictions,
# more reads back from the SSD tier, more writes waiting for room
CAPACITY = os.environ.get("MEMOSFS_STRESS_CAPACITY", "64M")

SHARED = ["k%d" % i for i in range(8)] + ["n/k%d" % i for i in range(4)] \
    + ["n/m/k%d" % i for i in range(2)]
LOGS = ["log0", "log1", "n/log2"]
PRIVATE = ["p%d" % i for i in range(6)] + ["d/q%d" % i for i in range(4)]

# Shared by the workers and the final check: the slot body format and the record.
COMMON = r'''
import hashlib, struct
MAGIC = b"MSTR"
HDR = struct.Struct("<4sBQQ32s")          # magic, writer, seq, body length, sha256

def make_slot(wid, seq, body):
    return HDR.pack(MAGIC, wid, seq, len(body), hashlib.sha256(body).digest()) + body

def parse_slot(data):
    """(wid, seq, sha256 hex) of a whole slot body, None for an empty one;
    raises ValueError on a torn one."""
    if not data:
        return None
    if len(data) < HDR.size:
        raise ValueError("short: %d bytes" % len(data))
    magic, wid, seq, n, digest = HDR.unpack_from(data)
    if magic != MAGIC:
        raise ValueError("bad magic %r" % data[:4])
    if len(data) != HDR.size + n:
        raise ValueError("length %d, header says %d" % (len(data), HDR.size + n))
    if hashlib.sha256(data[HDR.size:]).digest() != digest:
        raise ValueError("sha256 mismatch (wid %d seq %d)" % (wid, seq))
    return wid, seq, hashlib.sha256(data).hexdigest()

def record(wid, seq, payload):
    core = "%02d %09d %s" % (wid, seq, payload)
    return (core + " " + hashlib.sha256(core.encode()).hexdigest()[:16] + "\n").encode()

def parse_log(data):
    """[(wid, seq)] of a log's records; raises ValueError on a torn or foreign line."""
    out = []
    if data and not data.endswith(b"\n"):
        raise ValueError("log ends mid-record: %r" % data[-80:])
    for i, line in enumerate(data.split(b"\n")[:-1]):
        parts = line.split(b" ")
        if len(parts) != 4:
            raise ValueError("record %d malformed: %r" % (i, line[:120]))
        core = b" ".join(parts[:3])
        if hashlib.sha256(core).hexdigest()[:16].encode() != parts[3]:
            raise ValueError("record %d checksum: %r" % (i, line[:120]))
        out.append((int(parts[0]), int(parts[1])))
    return out
'''

WORKER = COMMON + textwrap.dedent(r'''
import errno, json, os, random, sys, time

root, wid, seed, duration, out_path = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                       float(sys.argv[4]), sys.argv[5])
SHARED = json.loads(sys.argv[6]); LOGS = json.loads(sys.argv[7])
PRIVATE = json.loads(sys.argv[8]); NWORKERS = int(sys.argv[9])
rng = random.Random(seed)
mine = os.path.join(root, "pw%d" % wid)
ops = {}                 # op -> count of acknowledged operations
errs = {}                # "op:errno" -> count of tolerated refusals
failures = []            # every failed check, with its details
appended = {l: [] for l in LOGS}     # acknowledged records (seq) per log
refused = {l: [] for l in LOGS}      # records whose write was refused
closed_upto = {l: 0 for l in LOGS}   # my records in each log published by my close
seen_size = {}           # log -> largest size seen (published logs only grow)
expect = {}              # my private names -> sha256 hex of their whole content
seq = 0
deadline = time.monotonic() + duration

failed = {}              # kind of failed check -> count (details: the first 5)

def fail(kind, **kw):
    failed[kind] = failed.get(kind, 0) + 1
    if failed[kind] > 5:
        return
    kw["kind"] = kind
    kw["wid"] = wid
    kw["t"] = round(time.monotonic() - (deadline - duration), 3)
    failures.append(kw)
    print("FAIL", json.dumps(kw), flush=True)

def count(op):
    ops[op] = ops.get(op, 0) + 1

def tolerated(op, e, allowed):
    if e.errno in allowed:
        k = "%s:%s" % (op, errno.errorcode.get(e.errno, e.errno))
        errs[k] = errs.get(k, 0) + 1
        return True
    fail("errno", op=op, errno=errno.errorcode.get(e.errno, e.errno), msg=str(e))
    return False

def next_seq():
    global seq
    seq += 1
    return seq

def body_size():
    # about 1.5 MiB on average: the 8 private directories alone outgrow the
    # 64 MiB memory tier, so slots are evicted to the SSD and come back
    sizes = [64, 5000, 70000, 300000, 1500000, 3000000, 6000000]
    return rng.choice(sizes)

def read_all(path):
    with open(path, "rb") as f:
        return f.read()

def write_whole(fd, data):
    """os.write until done (an OSError goes to the caller)."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise RuntimeError("write returned %d" % n)
        view = view[n:]

NOSPACE = (errno.ENOSPC, errno.EFBIG)

def rewrite(path, data):
    """Whole-slot rewrite (O_TRUNC); returns the sha256 of what the name holds
    now: data's, or the empty slot's when a write was refused (ENOSPC, EFBIG:
    the writer truncates its draft, so no partial version is published)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    ok = False
    try:
        try:
            write_whole(fd, data)
            st = os.fstat(fd)
            if st.st_size != len(data):
                fail("writer-view", path=path, fstat=st.st_size, wrote=len(data))
            if rng.random() < 0.2:
                os.fsync(fd)
                count("fsync")
            ok = True
        except OSError as e:
            if e.errno not in NOSPACE:
                raise
            tolerated("rewrite", e, NOSPACE)
            os.ftruncate(fd, 0)          # a careful writer leaves no partial slot
    finally:
        os.close(fd)
    return hashlib.sha256(data).hexdigest() if ok else hashlib.sha256(b"").hexdigest()

def tmp_rename(final, data, tmpdir):
    """The engine pattern; True when the rename was acknowledged."""
    tmp = os.path.join(tmpdir, "tmp-%d-%d" % (wid, next_seq()))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        try:
            write_whole(fd, data)
            os.fsync(fd)
        except OSError as e:
            if e.errno not in NOSPACE:
                raise
            tolerated("tmp-write", e, NOSPACE)
            os.ftruncate(fd, 0)
            os.close(fd)
            fd = -1
            try:
                os.unlink(tmp)
            except OSError as e2:
                tolerated("tmp-unlink", e2, (errno.ENOENT,))
            return False
    finally:
        if fd >= 0:
            os.close(fd)
    os.rename(tmp, final)
    return True

def check_slot(path, data, op):
    try:
        return parse_slot(data)
    except ValueError as e:
        fail("torn", op=op, path=path, size=len(data), why=str(e))
        return None

def check_log(log, data):
    try:
        recs = parse_log(data)
    except ValueError as e:
        fail("torn-log", log=log, size=len(data), why=str(e))
        return
    if len(set(recs)) != len(recs):
        dup = [r for r in set(recs) if recs.count(r) > 1][:5]
        fail("duplicate-record", log=log, dups=dup)
    last = {}
    for w, s in recs:
        if s <= last.get(w, 0):
            fail("record-order", log=log, wid=w, seq=s, after=last[w])
            break
        last[w] = s
    have = set(s for w, s in recs if w == wid)
    missing = [s for s in appended[log][:closed_upto[log]] if s not in have]
    if missing:
        fail("record-missing-after-close", log=log, missing=missing[:10],
             nmissing=len(missing))
    bad = [s for s in refused[log] if s in have]
    if bad:
        fail("refused-record-present", log=log, seqs=bad[:10])
    if len(data) < seen_size.get(log, 0):
        fail("log-shrank", log=log, size=len(data), seen=seen_size[log])
    seen_size[log] = max(seen_size.get(log, 0), len(data))

def op_append():
    log = rng.choice(LOGS)
    path = os.path.join(root, log)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        for _ in range(rng.randint(1, 8)):
            s = next_seq()
            rec = record(wid, s, "%x" % rng.getrandbits(rng.choice([40, 200, 800])))
            try:
                n = os.write(fd, rec)
            except OSError as e:
                if e.errno not in NOSPACE:
                    raise
                tolerated("append", e, NOSPACE)
                refused[log].append(s)
                break
            if n != len(rec):
                fail("short-append", log=log, wrote=n, len=len(rec))
                break
            appended[log].append(s)
            count("append-record")
        if rng.random() < 0.1:
            os.fsync(fd)
            count("fsync")
    finally:
        os.close(fd)
    closed_upto[log] = len(appended[log])
    count("append")

def op_shared_rewrite():
    name = rng.choice(SHARED)
    s = next_seq()
    rewrite(os.path.join(root, name), make_slot(wid, s, rng.randbytes(body_size())))
    count("shared-rewrite")

def op_shared_engine():
    name = rng.choice(SHARED)
    s = next_seq()
    tmpdir = os.path.join(root, rng.choice(["", "n", "n/m"]))
    if tmp_rename(os.path.join(root, name), make_slot(wid, s, rng.randbytes(body_size())),
                  tmpdir):
        count("shared-engine")

def op_shared_read():
    name = rng.choice(SHARED)
    path = os.path.join(root, name)
    data = read_all(path)
    check_slot(path, data, "shared-read")
    count("shared-read")

def op_shared_unlink():
    os.unlink(os.path.join(root, rng.choice(SHARED)))
    count("shared-unlink")

def op_shared_rename():
    a, b = rng.sample(SHARED, 2)
    os.rename(os.path.join(root, a), os.path.join(root, b))
    count("shared-rename")

def op_log_read():
    log = rng.choice(LOGS)
    check_log(log, read_all(os.path.join(root, log)))
    count("log-read")

def op_stat():
    kind = rng.random()
    if kind < 0.4:
        log = rng.choice(LOGS)
        st = os.stat(os.path.join(root, log))
        if st.st_size < seen_size.get(log, 0):
            fail("log-stat-shrank", log=log, size=st.st_size, seen=seen_size[log])
        seen_size[log] = max(seen_size.get(log, 0), st.st_size)
    elif kind < 0.8:
        os.stat(os.path.join(root, rng.choice(SHARED)))
    else:
        other = rng.randrange(NWORKERS)
        os.stat(os.path.join(root, "pw%d" % other, rng.choice(PRIVATE)))
    count("stat")

def tier_of(path):
    try:
        return os.getxattr(path, "user.memos.tier").decode()
    except OSError as e:
        return "(getxattr: %s)" % e

def op_pin():
    kind = rng.random()
    if kind < 0.4:
        path = os.path.join(root, rng.choice(SHARED))
    elif kind < 0.6:
        path = os.path.join(root, rng.choice(LOGS))
    else:
        name = rng.choice(PRIVATE)
        path = os.path.join(mine, name)
        if name in expect and rng.random() < 0.5:
            # my slot exists (only I write it): pinning and unpinning it must
            # work whichever tier holds it, and a pinned one is in memory
            value = b"1" if rng.random() < 0.3 else b"0"
            try:
                os.setxattr(path, "user.memos.pin", value)
            except OSError as e:
                fail("pin" if value == b"1" else "unpin", path=path,
                     errno=errno.errorcode.get(e.errno, e.errno), msg=str(e),
                     tier=tier_of(path))
                return
            pin = os.getxattr(path, "user.memos.pin")
            tier = os.getxattr(path, "user.memos.tier")
            if pin != value or (value == b"1" and tier != b"mem"):
                fail("pin-state", path=path, set=value.decode(), pin=pin.decode(),
                     tier=tier.decode())
            count("pin")
            return
    os.setxattr(path, "user.memos.pin", rng.choice([b"1", b"0", b"0"]))
    count("pin")

def op_private_write():
    name = rng.choice(PRIVATE)
    path = os.path.join(mine, name)
    data = make_slot(wid, next_seq(), rng.randbytes(body_size()))
    if name in expect and rng.random() < 0.3:
        expect[name] = rewrite(path, data)
        count("private-rewrite")
        return
    # the rename is acknowledged or refused as a whole: on an error other than
    # the write's ENOSPC the worker fails, so `expect` never guesses
    if tmp_rename(path, data, rng.choice([mine, os.path.join(mine, "d")])):
        expect[name] = hashlib.sha256(data).hexdigest()
        count("private-engine")

def op_private_rename():
    have = list(expect)
    if not have:
        return
    a = rng.choice(have)
    b = rng.choice(PRIVATE)
    if a == b:
        return
    os.rename(os.path.join(mine, a), os.path.join(mine, b))
    expect[b] = expect.pop(a)
    count("private-rename")

def op_private_unlink():
    have = list(expect)
    if not have:
        return
    a = rng.choice(have)
    os.unlink(os.path.join(mine, a))
    del expect[a]
    count("private-unlink")

def op_private_check():
    name = rng.choice(PRIVATE)
    path = os.path.join(mine, name)
    try:
        data = read_all(path)
    except FileNotFoundError:
        if name in expect:
            fail("private-vanished", path=path)
        count("private-check")
        return
    if name not in expect:
        fail("private-resurrected", path=path, size=len(data))
        return
    got = hashlib.sha256(data).hexdigest()
    if got != expect[name]:
        fail("private-content", path=path, size=len(data), got=got[:16],
             want=expect[name][:16], parsed=str(check_slot(path, data, "private-check")))
    st = os.stat(path)
    if st.st_size != len(data):
        fail("private-stat", path=path, stat=st.st_size, read=len(data))
    count("private-check")

def op_other_read():
    other = rng.randrange(NWORKERS)
    path = os.path.join(root, "pw%d" % other, rng.choice(PRIVATE))
    data = read_all(path)
    r = check_slot(path, data, "other-read")
    if r is not None and r[0] != other:
        fail("foreign-writer", path=path, wid=r[0])
    count("other-read")

OPS = [(op_shared_rewrite, 10), (op_shared_engine, 8), (op_shared_read, 14),
       (op_shared_unlink, 3), (op_shared_rename, 3), (op_append, 14), (op_log_read, 4),
       (op_stat, 8), (op_pin, 4), (op_private_write, 10), (op_private_rename, 3),
       (op_private_unlink, 2), (op_private_check, 8), (op_other_read, 6)]
funcs = [f for f, w in OPS for _ in range(w)]

SHARED_ERRNOS = {op_shared_rewrite: NOSPACE, op_shared_engine: NOSPACE,
                 op_shared_read: (errno.ENOENT,), op_shared_unlink: (errno.ENOENT,),
                 op_shared_rename: (errno.ENOENT,), op_stat: (errno.ENOENT,),
                 op_pin: (errno.ENOENT,), op_other_read: (errno.ENOENT,),
                 op_append: NOSPACE}
try:
    while time.monotonic() < deadline and sum(failed.values()) < 500:
        f = rng.choice(funcs)
        try:
            f()
        except OSError as e:
            if not tolerated(f.__name__[3:], e, SHARED_ERRNOS.get(f, ())) and \
                    f in (op_private_write, op_private_rename, op_private_unlink):
                # what my private directory holds is unknown now: stop here
                break
finally:
    # leave no pin behind on my private slots (pins on shared ones come and go)
    for name in list(expect):
        path = os.path.join(mine, name)
        try:
            os.setxattr(path, "user.memos.pin", b"0")
        except OSError as e:
            fail("unpin", path=path, errno=errno.errorcode.get(e.errno, e.errno),
                 msg=str(e), tier=tier_of(path))
    with open(out_path, "w") as f:
        json.dump({"wid": wid, "ops": ops, "errs": errs, "failures": failures,
                   "failed": failed,
                   "appended": appended, "refused": refused, "expect": expect}, f)
sys.exit(1 if failed else 0)
''')

ns: dict = {}
exec(COMMON, ns)
parse_slot, parse_log = ns["parse_slot"], ns["parse_log"]


def snapshot(top: str) -> dict[str, str]:
    """Every path below top: 'dir' for a directory, sha256 hex for a slot."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(top):
        rel = os.path.relpath(dirpath, top)
        for d in dirnames:
            out[os.path.normpath(os.path.join(rel, d))] = "dir"
        for f in filenames:
            with open(os.path.join(dirpath, f), "rb") as fh:
                out[os.path.normpath(os.path.join(rel, f))] = \
                    hashlib.sha256(fh.read()).hexdigest()
    return out


@pytest.mark.slow
def test_mixed_stress_then_remount(make_mount, tmp_path):
    m = make_mount(capacity=CAPACITY, writeback_delay_ms=50)
    root = m.p("a", "s")
    for d in ["n/m"] + [f"pw{w}/d" for w in range(WORKERS)]:
        (root / d).mkdir(parents=True)
    for log in LOGS:        # the logs exist before the appenders start (the race of
        (root / log).write_bytes(b"")   # their creation is the test below)
    results_dir = tmp_path / "results"
    results_dir.mkdir()
    t0 = time.monotonic()
    procs = []
    for w in range(WORKERS):
        seed = int(os.environ.get("MEMOSFS_STRESS_SEED", "0")) * 100 + w
        out = results_dir / f"w{w}.json"
        cmd = [sys.executable, "-c", WORKER, str(root), str(w), str(seed), str(DURATION),
               str(out), json.dumps(SHARED), json.dumps(LOGS), json.dumps(PRIVATE),
               str(WORKERS)]
        procs.append((subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, text=True), out))
    outputs = []
    for p, _ in procs:
        try:
            text, _ = p.communicate(timeout=DURATION + 180)
        except subprocess.TimeoutExpired:
            # a hung operation: the workers are ours; stop this one by its pid
            p.kill()
            text, _ = p.communicate()
            text = "TIMED OUT (hung in the filesystem?)\n" + text
        outputs.append((p.returncode, text))
    elapsed = time.monotonic() - t0

    results = []
    for (rc, text), (_, out) in zip(outputs, procs):
        assert out.exists(), f"worker left no result (rc {rc}):\n{text}\n{m.logtext()[-4000:]}"
        results.append(json.loads(out.read_text()))
    failures = [f for r in results for f in r["failures"]]
    failed: dict[str, int] = {}
    for r in results:
        for k, v in r["failed"].items():
            failed[k] = failed.get(k, 0) + v
    totals: dict[str, int] = {}
    errs: dict[str, int] = {}
    for r in results:
        for k, v in r["ops"].items():
            totals[k] = totals.get(k, 0) + v
        for k, v in r["errs"].items():
            errs[k] = errs.get(k, 0) + v
    assert m.proc.poll() is None, "the daemon died:\n" + m.logtext()[-4000:]

    # 0 lost records: every acknowledged append exactly once, no refused one
    lost, extra, dup = [], [], []
    records = 0
    for log in LOGS:
        data = (root / log).read_bytes() if (root / log).exists() else b""
        recs = parse_log(data)                  # raises on a torn record
        records += len(recs)
        have = {}
        for r in recs:
            have[r] = have.get(r, 0) + 1
        dup += [(log, r) for r, n in have.items() if n > 1]
        acked = {(r["wid"], s) for r in results for s in r["appended"][log]}
        nacked = {(r["wid"], s) for r in results for s in r["refused"][log]}
        lost += [(log, r) for r in acked if r not in have]
        extra += [(log, r) for r in have if r not in acked]
        assert not (nacked & set(have)), f"{log}: refused records present"

    # 0 vanished names: each private directory is exactly what its owner left
    vanished, resurrected, wrong = [], [], []
    for r in results:
        mine = root / f"pw{r['wid']}"
        present = {os.path.relpath(os.path.join(dp, f), mine)
                   for dp, _, fs in os.walk(mine) for f in fs}
        for name, sha in r["expect"].items():
            if name not in present:
                vanished.append(f"pw{r['wid']}/{name}")
            elif hashlib.sha256((mine / name).read_bytes()).hexdigest() != sha:
                wrong.append(f"pw{r['wid']}/{name}")
        resurrected += [f"pw{r['wid']}/{n}" for n in present - set(r["expect"])]
    torn_final = []
    for name in SHARED:
        try:
            parse_slot((root / name).read_bytes())
        except FileNotFoundError:
            pass
        except ValueError as e:
            torn_final.append(f"{name}: {e}")

    stats = m.stats()
    summary = {"seconds": round(elapsed, 1), "ops": totals, "refusals": errs,
               "records": records, "failed": failed,
               "torn": sum(v for k, v in failed.items() if k.startswith("torn")),
               "lost": len(lost), "extra": len(extra), "dup": len(dup),
               "vanished": len(vanished), "resurrected": len(resurrected),
               "wrong": len(wrong),
               "stats": {k: stats.get(k) for k in
                         ("slots_lost", "slots_unsaved", "evictions", "evict_writebacks",
                          "writebacks", "ssd_hits", "ssd_write_errors", "ssd_corrupt",
                          "alloc_waits", "alloc_failures", "requests_refused")}}
    print("SUMMARY", json.dumps(summary, sort_keys=True))
    failures.sort(key=lambda f: (f["kind"], f["t"]))
    detail = "\n".join(json.dumps(f) for f in failures[:60])
    problems = []
    if failed:
        problems.append(f"failed checks in the workers {failed}, the first ones:\n{detail}")
    for what, lst in [("lost records", lost), ("unacknowledged records", extra),
                      ("duplicate records", dup), ("vanished names", vanished),
                      ("names that should be gone", resurrected),
                      ("wrong contents", wrong), ("torn shared slots", torn_final)]:
        if lst:
            problems.append(f"{what} ({len(lst)}): {lst[:10]}")
    for rc, text in outputs:
        if rc != 0 and not failed:
            problems.append(f"a worker exited {rc}:\n{text[-3000:]}")
    disk_free = shutil.disk_usage(m.ssd).free
    if disk_free > 1 << 30:             # the SSD had room: nothing may be lost
        if stats["slots_lost"] != 0:
            problems.append(f"slots_lost {stats['slots_lost']} with {disk_free} bytes free")
    for k in ("ssd_write_errors", "ssd_corrupt"):
        if stats.get(k, 0) != 0:
            problems.append(f"{k} {stats[k]}")
    errors = [line for line in m.logtext().splitlines() if " ERROR " in line]
    if errors:
        problems.append(f"the daemon logged {len(errors)} errors:\n" + "\n".join(errors[:10]))
    if totals.get("append-record", 0) == 0 or totals.get("shared-engine", 0) == 0:
        problems.append("the workers did too little")
    log1 = m.logtext()

    # flush, snapshot, unmount, mount the same SSD directory, compare (after the
    # checks above failed too, as long as the daemon is up: more to report)
    m.ctl("flush").write_text("1\n")
    before = snapshot(str(m.path / "a"))
    m.stop()
    log1 = m.logtext()
    if m.proc.returncode != 0:
        problems.append(f"unmount: the daemon exited {m.proc.returncode}")
    m2 = make_mount(capacity=CAPACITY, ssd=m.ssd)
    after = snapshot(str(m2.path / "a"))
    if before != after:
        only_before = sorted(set(before) - set(after))
        only_after = sorted(set(after) - set(before))
        changed = sorted(k for k in set(before) & set(after) if before[k] != after[k])
        problems.append(f"after the remount: missing {only_before[:10]}, new "
                        f"{only_after[:10]}, changed {changed[:10]}\n"
                        f"second mount's log:\n{m2.logtext()[-3000:]}")
    if len(before) <= len(LOGS) + WORKERS:
        problems.append(f"the snapshot is nearly empty: {sorted(before)}")
    if m2.stats()["ssd_corrupt"] != 0:
        problems.append("ssd_corrupt after the remount")
    print("REMOUNT", json.dumps({"paths": len(before), "identical": before == after}))
    assert not problems, "\n".join(problems) + f"\nsummary: {summary}\n" \
        + "daemon log tail:\n" + log1[-6000:]


CREATOR = r'''
import os, sys, time
path, tag, start, hold = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
while time.time() < start:
    pass
fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
assert os.write(fd, (tag + "\n").encode()) == len(tag) + 1
time.sleep(hold)
os.close(fd)
'''


@pytest.mark.parametrize("holds", [(0.0, 0.0), (0.0, 0.05), (0.2, 0.0)])
def test_appenders_creating_a_log_together(make_mount, holds):
    """Two processes open a log that does not exist yet with O_APPEND|O_CREAT at
    the same moment, each appends one record and closes (after `holds` seconds):
    both records are in the log, whoever created it and whoever closes first."""
    m = make_mount(capacity="64M", writeback_delay_ms=50)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    bad = []
    for i in range(6):
        path = d / f"log{i}"
        start = time.time() + 0.3
        procs = [subprocess.Popen([sys.executable, "-c", CREATOR, str(path), f"w{k}",
                                   str(start), str(holds[k])]) for k in range(2)]
        for p in procs:
            assert p.wait(timeout=30) == 0
        try:
            got = path.read_text()
        except FileNotFoundError:
            got = "<ENOENT>"
        if sorted(got.split()) != ["w0", "w1"]:
            bad.append((path.name, got))
    assert not bad, f"acknowledged records lost: {bad}\n{m.logtext()[-3000:]}"


def test_pin_a_slot_on_the_ssd_tier(make_mount):
    """A slot that was evicted to the SSD tier is still a slot: pinning it brings
    it back to memory and keeps it there, unpinning it works (both were ENOENT,
    "nothing published yet", when no memory copy existed)."""
    m = make_mount(capacity="4M")
    d = m.p("a", "s")
    d.mkdir(parents=True)
    size = 1_500_000                                    # two fit in memory, three do not
    for name in ("x", "y", "w"):
        (d / name).write_bytes(os.urandom(size))        # w evicts x
    assert os.getxattr(d / "x", "user.memos.tier") == b"ssd"
    os.setxattr(d / "x", "user.memos.pin", b"1")        # brought back, pinned
    assert os.getxattr(d / "x", "user.memos.pin") == b"1"
    assert os.getxattr(d / "x", "user.memos.tier") == b"mem"
    for i in range(3):
        (d / f"z{i}").write_bytes(os.urandom(size))     # evict everything else
    assert os.getxattr(d / "x", "user.memos.tier") == b"mem"
    os.setxattr(d / "x", "user.memos.pin", b"0")
    assert os.getxattr(d / "y", "user.memos.tier") == b"ssd"
    os.setxattr(d / "y", "user.memos.pin", b"0")       # on the SSD tier: a no-op


RACER = r'''
import os, sys, time
d, role, t0, rounds = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
log = os.path.join(d, "log")
torn = []
for i in range(rounds):
    slot = t0 + i * 0.4
    if role == "a":
        while time.time() < slot:
            time.sleep(0.001)
        with open(os.path.join(d, "filler%d" % (i % 2)), "wb") as f:
            f.write(os.urandom(3_500_000))              # sends the log to the SSD tier
    while time.time() < slot + 0.2:
        pass
    if role == "a":
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
        for _ in range(20):
            assert os.write(fd, b"y" * 99 + b"\n") == 100
        os.close(fd)
    else:
        for _ in range(3):
            with open(log, "rb") as f:
                data = f.read()
            if b"\0" in data or not data.endswith(b"\n"):
                torn.append((i, len(data), data.find(b"\0"), data.count(b"\0")))
print("TORN", torn)
sys.exit(1 if torn else 0)
'''


def test_appender_and_readers_of_a_log_on_the_ssd_tier(make_mount):
    """An appender opens a log that only the SSD tier holds while a reader opens
    it: the reader reads a whole published version (whole records), never the
    appender's draft size filled with zeros."""
    m = make_mount(capacity="6M", writeback_delay_ms=50)
    d = m.p("a", "s")
    d.mkdir(parents=True)
    (d / "log").write_bytes((b"x" * 99 + b"\n") * 10000)
    t0 = time.time() + 1.0
    rounds = 25
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(d), role, str(t0),
                               str(rounds)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for role in "ar"]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert procs[0].returncode == 0, outs[0]
    log = m.logtext()
    assert procs[1].returncode == 0, \
        f"torn reads (round, size, first NUL, NULs): {outs[1]}\n{log[-3000:]}"
    assert "internal check failed" not in log, log[-3000:]
    data = (d / "log").read_bytes()
    assert data == (b"x" * 99 + b"\n") * 10000 + (b"y" * 99 + b"\n") * 20 * rounds
