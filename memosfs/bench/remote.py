"""`memosfs bench remote`: the remote tier (a Redis Cluster) against its baselines.

    memosfs bench remote [--slot 64M] [--slots 4] [--repeat 3] [--url redis://...] [--json]

In one run, on one cluster (a fresh 3-master cluster on loopback ports unless
--url names one; needs redis-server), with the same bytes:

  - remote_hit_read_MBps: a mount that holds nothing (fresh SSD directory)
    opens and reads each slot: lookup (the manifest), fetch from the
    cluster, checks, promotion into memory, then the read through FUSE;
  - redis_py_get_MBps: redis-py (hiredis) GETs of the same chunks, pipelined
    per slot, from the same cluster: what a client of the cluster alone pays;
  - tier_get_MBps: RemoteTier.get of the same slots (the tier without FUSE);
  - ssd_hit_read_MBps: the same mount restarted (its SSD tier now holds the
    slots, warmup_ratio=0, page cache dropped): SSD hits through FUSE;
  - mem_hit_read_MBps: a re-read served from the daemon's memory (the
    kernel's cached pages dropped first);
  - upload_MBps: the writer's write+fsync with remote_durable=1 (the upload
    is done when fsync returns).
Each figure is the best of --repeat.  Ratios: remote_vs_redis_py,
remote_vs_ssd.

May call: memosfs.bench.common (daemons, timed reads, dropping the page
cache), memosfs.store.remote (RemoteTier), memosfs.testing.localcluster.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from typing import Iterator, Optional, Sequence

from memosfs.bench.common import Daemon, MiB, drop_cached_pages, drop_page_cache, read_file
from memosfs.knobs import parse_size



def add_parsers(bsub) -> None:
    p = bsub.add_parser("remote", help="remote tier (Redis Cluster): remote-hit reads vs "
                        "redis-py GET vs a local SSD hit")
    _arguments(p)
    p.set_defaults(fn=lambda args: run(args))


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--slot", default="64M", help="bytes per slot (default 64M)")
    p.add_argument("--slots", type=int, default=4, help="slots (default 4)")
    p.add_argument("--repeat", type=int, default=3, help="runs per figure; the best is kept")
    p.add_argument("--url", default="", help="an existing cluster (default: start one)")
    p.add_argument("--json", action="store_true", help="print JSON only")


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="memosfs bench remote", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    _arguments(p)
    return run(p.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    try:
        slot = parse_size(args.slot)
    except Exception:
        slot = -1
    if slot <= 0 or args.slots < 1 or args.repeat < 1:
        print("memosfs bench remote: slot, slots and repeat must be positive", file=sys.stderr)
        return 2
    try:
        result = bench_remote(slot, args.slots, args.repeat, args.url)
    except RuntimeError as e:
        print(f"memosfs bench remote: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))
    return 0


@contextlib.contextmanager
def _cluster(url: str, maxmemory: str) -> Iterator[tuple[str, str]]:
    """(url, description): the given cluster, or a fresh local one."""
    if url:
        yield url, "given"
        return
    from memosfs.testing.localcluster import LocalCluster, redis_server_missing
    why = redis_server_missing()
    if why:
        raise RuntimeError(why)
    with LocalCluster(masters=3, replicas=0, maxmemory=maxmemory) as c:
        yield c.url, "local, 3 masters, no replicas"


def _daemon(base: str, name: str, opts: str, ssd: Optional[str] = None) -> Daemon:
    """A memosfs mount in `base/name`, with its own SSD directory."""
    return Daemon(os.path.join(base, name), ssd or os.path.join(base, name + "-ssd"),
                  os.path.join(base, name + ".log"), opts)


def _read_all(paths: list[str], size: int) -> float:
    buf = bytearray(4 * MiB)
    total_t = 0.0
    for p in paths:
        t, n = read_file(p, buf)
        if n != size:
            raise RuntimeError(f"read {n} of {size} bytes from {p}")
        total_t += t
    return total_t


def bench_remote(slot: int, slots: int, repeat: int, url: str = "") -> dict[str, object]:
    from memosfs.store.remote import RemoteTier, chunk_key, manifest_key
    import redis.utils

    total = slot * slots
    capacity = max(2 * total + 64 * MiB, 256 * MiB)
    # one master holds each slot whole: leave it room
    maxmemory = f"{max(512, (2 * total + 2 * slot) // MiB)}mb"
    tmp = tempfile.mkdtemp(prefix="memosfs-bench-remote-")
    best = {k: float("inf") for k in ("remote", "ssd", "mem", "upload", "redis", "tier")}
    cache_drop = "fadvise"
    daemons: list[Daemon] = []
    try:
        with _cluster(url, maxmemory) as (curl, described):
            opts = f"capacity={capacity},remote={curl},remote_durable=1,writeback_delay_ms=100"
            names = [f"slot{i}" for i in range(slots)]
            keys = [f"bench/remote/{n}".encode() for n in names]
            block = os.urandom(slot)
            writer = _daemon(tmp, "writer", opts)
            daemons.append(writer)
            os.makedirs(writer.p("bench", "remote"))
            for r in range(repeat):
                t0 = time.perf_counter()
                for i, n in enumerate(names):
                    fd = os.open(writer.p("bench", "remote", n),
                                 os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    try:
                        os.write(fd, i.to_bytes(8, "little") + bytes([r]))
                        view = memoryview(block)[9:]
                        while view:
                            view = view[os.write(fd, view[:4 * MiB]):]
                        os.fsync(fd)            # remote_durable=1: uploaded on return
                    finally:
                        os.close(fd)
                best["upload"] = min(best["upload"], time.perf_counter() - t0)
            writer.stop()
            daemons.remove(writer)

            for r in range(repeat):
                # a fresh reader each round: nothing local, every open a remote hit
                ssd = os.path.join(tmp, f"reader{r}-ssd")
                reader = _daemon(tmp, f"reader{r}", opts + ",warmup_ratio=0", ssd=ssd)
                daemons.append(reader)
                os.makedirs(reader.p("bench", "remote"))
                paths = [reader.p("bench", "remote", n) for n in names]
                best["remote"] = min(best["remote"], _read_all(paths, slot))
                s = reader.stats()
                if s.get("remote_hits", 0) < slots:
                    raise RuntimeError(f"expected {slots} remote hits, stats say {s}")
                for p in paths:
                    drop_cached_pages(p)
                best["mem"] = min(best["mem"], _read_all(paths, slot))
                deadline = time.monotonic() + 60         # the promoted copies reach the SSD
                while reader.stats().get("ssd_slots", 0) < slots:
                    if time.monotonic() > deadline:
                        raise RuntimeError("promoted slots did not reach the SSD tier")
                    time.sleep(0.1)
                reader.stop()
                daemons.remove(reader)
                files = [os.path.join(dp, f) for dp, _, fs in os.walk(ssd) for f in fs]
                cache_drop = drop_page_cache(files)
                again = _daemon(tmp, f"again{r}", opts + ",warmup_ratio=0", ssd=ssd)
                daemons.append(again)
                paths = [again.p("bench", "remote", n) for n in names]
                best["ssd"] = min(best["ssd"], _read_all(paths, slot))
                s = again.stats()
                if s.get("ssd_hits", 0) < slots:
                    raise RuntimeError(f"expected {slots} SSD hits, stats say {s}")
                again.stop()
                daemons.remove(again)
                shutil.rmtree(ssd, ignore_errors=True)

            tier = RemoteTier(curl, subscribe=False).start()
            try:
                if not tier.wait_ready(10):
                    raise RuntimeError("cannot reach the cluster")
                entries = [tier.stat(k) for k in keys]
                if any(e is None for e in entries):
                    raise RuntimeError("a slot is missing from the cluster")
                rc = tier._rc
                for _ in range(repeat):
                    t0 = time.perf_counter()
                    for k in keys:
                        got = tier.get(k)
                        if got is None or len(got[1]) != slot:
                            raise RuntimeError("tier get failed")
                        del got
                    best["tier"] = min(best["tier"], time.perf_counter() - t0)
                    # the same bytes with redis-py alone: GETs pipelined per slot
                    t0 = time.perf_counter()
                    for k, e in zip(keys, entries):
                        r = rc.get_redis_connection(rc.get_node_from_key(manifest_key(k)))
                        p = r.pipeline(transaction=False)
                        if e.nchunks == 0:
                            p.get(manifest_key(k))
                        for i in range(e.nchunks):
                            p.get(chunk_key(k, e.tag, i))
                        n = sum(len(v) for v in p.execute())
                        if n < slot:
                            raise RuntimeError("redis-py GET came short")
                    best["redis"] = min(best["redis"], time.perf_counter() - t0)
                hiredis = bool(redis.utils.HIREDIS_AVAILABLE)
                chunk = tier.config.chunk_size
            finally:
                tier.close(drain_s=1)
    finally:
        for d in daemons:
            d.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    mb = total / 1e6
    rate = {k: mb / t for k, t in best.items()}
    return {
        "bench": "remote",
        "slot_bytes": slot,
        "slots": slots,
        "repeat": repeat,
        "chunk_bytes": chunk,
        "cluster": described,
        "hiredis": hiredis,
        "page_cache_drop": cache_drop,
        "remote_hit_read_MBps": round(rate["remote"], 1),
        "redis_py_get_MBps": round(rate["redis"], 1),
        "tier_get_MBps": round(rate["tier"], 1),
        "ssd_hit_read_MBps": round(rate["ssd"], 1),
        "mem_hit_read_MBps": round(rate["mem"], 1),
        "upload_MBps": round(rate["upload"], 1),
        "remote_vs_redis_py": round(rate["remote"] / rate["redis"], 3),
        "remote_vs_ssd": round(rate["remote"] / rate["ssd"], 3),
    }


if __name__ == "__main__":
    sys.exit(main())
