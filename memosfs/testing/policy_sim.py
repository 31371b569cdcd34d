"""The eviction policy's trace loader and the evict_batch cost measurement,
for `memosfs bench policy` and tests/test_policy.py.

load_trace: the trace formats people hand over (Mooncake JSONL with each
request's `hash_ids`, JSON lines of one key, one key a line or CSV/TSV with
a key column, libCacheSim's oracleGeneral binary; .zst/.gz decompressed),
renumbered 0..unique-1.  next_access: for Belady.  batch_cost: puts of `slot`-byte slots
into a full native cache, timed one by one.  policy_cost_pair: the cost of
policies side by side in full native caches (ns per hit, puts/s, P99 of an
evicting put), in short alternating rounds; policy_rss: the resident memory of a fresh process
holding such a cache.

May call: memosfs._native, the standard library, the zstd command or the zstandard
module (.zst traces).
"""

from __future__ import annotations

import gzip
import json
import random
import shutil
import struct
import subprocess
import time
from typing import Optional

from memosfs import _native


TRACE_FORMATS = ("auto", "mooncake", "jsonl", "text", "oracleGeneral")

# Column names taken as the key when a text trace has a header line.
KEY_COLUMNS = ("key", "obj_id", "object_id", "id", "block", "block_id", "lba", "offset",
               "hash", "hash_id", "addr", "address", "anonymized key")

_ORACLE = struct.Struct("<IQIq")      # libCacheSim oracleGeneral: time, obj_id, size, next access


def _open_bytes(path: str) -> bytes:
    """The file's bytes; .zst and .gz are decompressed (zstd: the `zstd`
    command, or the zstandard module where installed)."""
    if path.endswith(".gz"):
        with gzip.open(path, "rb") as f:
            return f.read()
    if path.endswith(".zst"):
        try:
            import zstandard          # type: ignore[import-not-found]
            with open(path, "rb") as f:
                return zstandard.ZstdDecompressor().stream_reader(f).read()
        except ImportError:
            pass
        if shutil.which("zstd"):
            return subprocess.run(["zstd", "-dc", path], check=True, capture_output=True).stdout
        raise ValueError(f"{path}: a .zst trace needs the zstd command or `pip install zstandard`")
    with open(path, "rb") as f:
        return f.read()


def trace_format(data: bytes, path: str = "") -> str:
    """Which of TRACE_FORMATS a trace's bytes are (not "auto")."""
    name = path[:-4] if path.endswith((".zst", ".gz")) else path
    if name.endswith((".oracleGeneral", ".oracleGeneral.bin")):
        return "oracleGeneral"
    head = data[:4096]
    if b"\0" in head:
        if len(data) % _ORACLE.size:
            raise ValueError(f"{path or 'trace'}: binary, but not whole 24-byte oracleGeneral records")
        return "oracleGeneral"
    first = next((ln.strip() for ln in head.splitlines() if ln.strip()), b"")
    if first.startswith(b"{"):
        return "mooncake" if b'"hash_ids"' in first else "jsonl"
    return "text"


def load_trace(path: str, fmt: str = "auto", column: Optional[str] = None) -> list[int]:
    """Block ids in access order, renumbered 0..unique-1 (first seen, first
    numbered).  Formats (fmt, "auto" by the file's content and name):

      mooncake       JSON lines, each request's `hash_ids` (its blocks, in order)
      jsonl          JSON lines, one access each: the field `column`, else the
                     first of KEY_COLUMNS present
      text           one access a line: a key, or CSV / tab / space separated
                     fields; the key is field `column` (a 0-based number or a
                     header name), else the header's first KEY_COLUMNS name,
                     else the first field (a header line is one whose key field
                     is a KEY_COLUMNS name or, with a number expected, not one)
      oracleGeneral  libCacheSim's binary records (uint32 time, uint64 obj_id,
                     uint32 size, int64 next access; little-endian), obj_id
                     the key

    A .zst or .gz file is decompressed first.  ValueError on a trace that is
    none of these (or empty)."""
    data = _open_bytes(path)
    fmt = trace_format(data, path) if fmt == "auto" else fmt
    if fmt not in TRACE_FORMATS:
        raise ValueError(f"unknown trace format {fmt!r} ({', '.join(TRACE_FORMATS)})")
    ids: dict[object, int] = {}
    out: list[int] = []
    if fmt == "oracleGeneral":
        if len(data) % _ORACLE.size:
            raise ValueError(f"{path}: not whole 24-byte oracleGeneral records")
        for _, obj, _, _ in _ORACLE.iter_unpack(data):
            out.append(ids.setdefault(obj, len(ids)))
    elif fmt in ("mooncake", "jsonl"):
        for n, line in enumerate(data.decode("utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                if fmt == "mooncake":
                    keys = rec["hash_ids"]
                else:
                    name = column or next(k for k in KEY_COLUMNS if k in rec)
                    keys = [rec[name]]
            except (ValueError, KeyError, StopIteration, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a {fmt} record ({e})") from None
            for h in keys:
                out.append(ids.setdefault(json.dumps(h) if isinstance(h, (list, dict)) else h, len(ids)))
    else:
        _load_text(data.decode("utf-8", "surrogateescape"), column, ids, out)
    if not out:
        raise ValueError(f"{path}: no accesses in the trace")
    return out


def _split(line: str, sep: Optional[str]) -> list[str]:
    return [f.strip() for f in (line.split(sep) if sep else line.split())]


def _load_text(text: str, column: Optional[str], ids: dict, out: list[int]) -> None:
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        return
    first = lines[0]
    sep = "," if "," in first else "\t" if "\t" in first else None
    head = _split(first, sep)
    lower = [h.lower() for h in head]
    col = 0
    skip = 0
    if column is not None and not column.lstrip("-").isdigit():
        if column.lower() not in lower:
            raise ValueError(f"no column {column!r} in the header ({', '.join(head)})")
        col, skip = lower.index(column.lower()), 1
    else:
        if column is not None:
            col = int(column)
        named = [i for i, h in enumerate(lower) if h in KEY_COLUMNS]
        if column is None and named:
            col, skip = named[0], 1
        elif len(head) > col and lower[col] in KEY_COLUMNS:
            skip = 1
    for n, line in enumerate(lines[skip:], skip + 1):
        fields = _split(line, sep)
        if len(fields) <= col:
            raise ValueError(f"line {n}: no field {col} in {line!r}")
        out.append(ids.setdefault(fields[col], len(ids)))


def next_access(keys: list[int]) -> list[int]:
    """For each access, the index of the next access of its key (-1: none)."""
    nxt = [-1] * len(keys)
    last: dict[int, int] = {}
    for i in range(len(keys) - 1, -1, -1):
        k = keys[i]
        nxt[i] = last.get(k, -1)
        last[k] = i
    return nxt


def _pct(xs: list[int], q: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] / 1000.0


def batch_cost(batch: int, puts: int, slot: int = 64 << 10, capacity: int = 32 << 20) -> dict:
    """Puts of `slot`-byte slots into a full cache, through the native API."""
    c = _native.Cache(capacity, batch)
    data = b"x" * slot
    clock = time.perf_counter_ns
    for i in range(2 * capacity // slot):       # fill, so every later run evicts
        d = c.draft()
        d.write(0, data)
        c.publish(d, b"w%d" % i, dirty=False).release()
    lat, lat_evict = [], []
    runs = c.stats()["eviction_runs"]
    t0 = clock()
    for i in range(puts):
        key = b"k%d" % i
        a = clock()
        d = c.draft()
        d.write(0, data)
        c.publish(d, key, dirty=False).release()
        dt = clock() - a
        lat.append(dt)
        r = c.stats()["eviction_runs"]
        if r != runs:
            lat_evict.append(dt)
            runs = r
    # stats() calls are outside each put's timing but inside the wall time:
    # take ops/s from the summed put latencies.
    total = sum(lat)
    wall = clock() - t0
    c.check()
    c.close()
    return {"evict_batch": batch, "puts": puts, "slot_bytes": slot,
            "ops_per_s": round(puts / (total / 1e9)) if total else 0,
            "p50_us": _pct(lat, 0.50), "p99_us": _pct(lat, 0.99),
            "evicting_puts": len(lat_evict), "evicting_p50_us": _pct(lat_evict, 0.50),
            "evicting_p99_us": _pct(lat_evict, 0.99), "wall_s": round(wall / 1e9, 3)}


def _fill(c, n: int, data: bytes, prefix: bytes = b"f") -> None:
    for i in range(n):
        d = c.draft()
        d.write(0, data)
        c.publish(d, b"%s%d" % (prefix, i), dirty=False).release()


_RSS_PROBE = r"""
import random, sys
from memosfs import _native
policy, entries, slot = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
c = _native.Cache(entries * slot)
c.set_policy(policy)
data = b"x" * slot
rnd = random.Random(1)
for i in range(5 * entries):       # keys from 20 x the entries: the ghosts fill
    k = b"k%d" % (rnd.randrange(20 * entries) if i > entries else i)
    r = c.get(k)
    if r is not None:
        r.release()
        continue
    d = c.draft()
    d.write(0, data)
    c.publish(d, k, dirty=False).release()
s = c.stats()
print(rss(), s["slots"])
"""


def policy_rss(policy: str, entries: int = 60_000, slot: int = 4096) -> dict:
    """The resident memory of a process holding a full cache of `entries`
    slots under `policy`, after a churn of four times as many accesses over
    twenty times as many keys (every ghost ring full; a fresh interpreter:
    nothing else in it)."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-c", _RSS_PROBE, policy, str(entries), str(slot)],
                         capture_output=True, text=True, check=True).stdout.split()
    return {"policy": policy, "rss_bytes": int(out[0]), "slots": int(out[1])}


def policy_cost_pair(policies: tuple[str, ...], entries: int, rounds: int = 20,
                     gets: int = 5000, puts: int = 500, slot: int = 4096, seed: int = 1) -> dict:
    """The cost of each policy in `policies`, measured side by side: one
    full cache of `entries` slots each, the same gets (a skewed reuse of the
    slots present) and puts (new slots, each making room) run on each cache
    in turn, `rounds` short rounds (so a busy machine's swings fall on every
    policy alike).  Per policy: ns per hit and puts/s (medians over rounds,
    with each round's ratio to the first policy), the P50/P99 of the puts that
    ran an eviction (all rounds)."""
    data = b"x" * slot
    caches = []
    for p in policies:
        c = _native.Cache(entries * slot)
        c.set_policy(p)
        _fill(c, 2 * entries, data)
        caches.append(c)
    rnd = random.Random(seed)
    present = [c.keys() for c in caches]
    clock = time.perf_counter_ns
    hit_ns: list[list[float]] = [[] for _ in policies]
    put_rate: list[list[float]] = [[] for _ in policies]
    evicting: list[list[int]] = [[] for _ in policies]
    nxt = 0
    for r in range(rounds):
        order = [rnd.random() for _ in range(gets)]
        for j, c in enumerate(caches):
            keys = present[j]
            hot = max(1, len(keys) // 5)
            t = hits = 0
            for u in order:
                k = keys[int(u * 1e9) % hot] if u < 0.8 else keys[int(u * 1e9) % len(keys)]
                a = clock()
                g = c.get(k)
                if g is not None:
                    g.release()
                    t += clock() - a
                    hits += 1
            hit_ns[j].append(t / hits if hits else 0.0)
            runs = c.stats()["eviction_runs"]
            total = 0
            for i in range(puts):
                key = b"p%d" % (nxt + i)
                a = clock()
                d = c.draft()
                d.write(0, data)
                c.publish(d, key, dirty=False).release()
                dt = clock() - a
                total += dt
                e = c.stats()["eviction_runs"]
                if e != runs:
                    evicting[j].append(dt)
                    runs = e
            put_rate[j].append(puts / (total / 1e9) if total else 0.0)
            present[j] = c.keys()
        nxt += puts
    out: dict = {"entries": entries, "rounds": rounds}
    for j, p in enumerate(policies):
        hx = [hit_ns[j][r] / hit_ns[0][r] for r in range(rounds) if hit_ns[0][r]]
        px = [put_rate[j][r] / put_rate[0][r] for r in range(rounds) if put_rate[0][r]]
        out[p] = {"ns_per_hit": round(_median(hit_ns[j])), "puts_per_s": round(_median(put_rate[j])),
                  "hit_x": round(_median(hx), 3), "puts_x": round(_median(px), 3),
                  "evicting_puts": len(evicting[j]), "evicting_p50_us": _pct(evicting[j], 0.50),
                  "evicting_p99_us": _pct(evicting[j], 0.99)}
    for c in caches:
        c.check()
        c.close()
    return out


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    return s[len(s) // 2] if s else 0.0
