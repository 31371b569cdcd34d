"""Every `memosfs` subcommand runs, at a tiny size, and says what it
measured: the benchmarks that have no test of their own elsewhere (io,
index, alloc, coherence, prefetch, remote, federated) and `knobs`.  The
others run in their own tests: clients (test_bench_clients.py), engines
(test_bench_engines.py), persist (test_faults.py), policy (test_policy.py),
kv (test_kv.py), calc-size (test_cli.py), stat and umount (test_mount.py,
test_durability.py), top (test_top.py).

Regression: `bench index`, `bench alloc` and `bench prefetch` failed on a
source checkout (paths computed for the layout before the package was
split) and nothing noticed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from memosfs.knobs import KNOBS


def memosfs(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memosfs", *args], capture_output=True,
                          text=True, timeout=timeout)


def bench(*args: str, timeout: float = 300) -> dict:
    r = memosfs("bench", *args, "--json", timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_bench_index_builds_its_harness_and_measures_every_table():
    out = bench("index", "--repeat", "1", "--lookups", "2000", "--small-buckets", "64",
                "--large-buckets", "256")
    assert out["bench"] == "index" and set(out["tables"]) == {"small", "large"}
    for table in ("small", "large"):
        assert 0.5 < out["max_load"][table] <= 1.0
    assert out["ratios"] and all(v > 0 for r in out["ratios"].values() for v in r.values()
                                 if isinstance(v, (int, float)))


def test_bench_alloc_runs_the_arena_and_its_peers():
    out = bench("alloc", "--repeat", "1", "--ops", "2000", "--live-mib", "4",
                "--capacity-mib", "16")
    assert out["bench"] == "alloc"
    for peer in ("arena", "glibc", "jemalloc"):
        assert out[peer]["ns"] > 0
    assert set(out["ratios"]) == {"glibc", "jemalloc"}


@pytest.mark.mount
def test_bench_io_measures_memosfs_beside_tmpfs():
    out = bench("io", "--size", "4M", "--small", "50", "--repeat", "1")
    assert out["size_bytes"] == 4 << 20 and out["small_files"] == 50
    for k in ("read_MBps", "write_MBps", "tmpfs_read_MBps", "tmpfs_write_MBps",
              "small_read_ops", "tmpfs_small_read_ops"):
        assert out[k] > 0, k
    assert out["write_ratio"] == pytest.approx(out["write_MBps"] / out["tmpfs_write_MBps"],
                                               rel=0.02)


@pytest.mark.mount
def test_bench_coherence_runs_every_protocol_and_the_locks():
    out = bench("coherence", "--agents", "2", "--slots", "4", "--slot-size", "4096",
                "--seconds", "0.5")
    assert out["agents"] == 2 and out["modes"]
    for name, mode in out["modes"].items():
        assert mode["ops"] > 0 and mode["torn_reads"] == 0 and mode["failed"] == 0, name


def test_bench_prefetch_sim_on_the_synthetic_workloads():
    out = bench("prefetch", "--sim", "--workloads", "conversation,strided",
                "--modes", "off,sequential", "--requests", "40")
    assert set(out["workloads"]) == {"conversation", "strided"}
    for w in out["workloads"].values():
        assert set(w["modes"]) == {"off", "sequential"}


def test_bench_prefetch_without_a_trace_skips_the_trace_workload(monkeypatch, capsys):
    """From a clone with nothing beside it: the trace workload is skipped and
    said so; asked for by name, it is refused with the option to use."""
    from memosfs.bench import prefetch
    from memosfs.cli import main
    monkeypatch.setattr(prefetch, "DEFAULT_TRACE", "/nonexistent/trace.jsonl")
    monkeypatch.setattr(prefetch, "WORKLOADS", ("mooncake", "strided"))
    assert main(["bench", "prefetch", "--sim", "--modes", "off", "--requests", "20",
                 "--json"]) == 0
    cap = capsys.readouterr()
    assert "mooncake workload is skipped: no trace" in cap.err
    assert set(json.loads(cap.out)["workloads"]) == {"strided"}
    assert main(["bench", "prefetch", "--sim", "--workloads", "mooncake", "--json"]) == 2
    assert "(--trace FILE)" in capsys.readouterr().err


@pytest.mark.cluster
def test_bench_remote_starts_a_cluster_and_reads_through_the_tier():
    out = bench("remote", "--slot", "1M", "--slots", "2", "--repeat", "1", timeout=600)
    for k in ("remote_hit_read_MBps", "redis_py_get_MBps", "ssd_hit_read_MBps",
              "mem_hit_read_MBps"):
        assert out[k] > 0, k


def test_bench_federated_inproc_trains_and_reports_epsilon():
    out = bench("federated", "--inproc", "--clients", "2", "--rounds", "2",
                "--modes", "plain")
    assert out["clients"] == 2 and out["rounds"] == 2
    by = {r["label"]: r for r in out["results"]}
    assert by["plain_nodp"]["epsilon"] == "inf"             # no noise: no guarantee
    assert by["plain"]["epsilon"] > 0 and by["plain"]["noise_multiplier"] > 0
    for r in by.values():
        assert 0 <= r["accuracy"] <= 1 and r["rounds"] == 2


def test_knobs_lists_every_knob():
    r = memosfs("knobs")
    assert r.returncode == 0, r.stderr
    for k in KNOBS:
        assert k.name in r.stdout
    md = memosfs("knobs", "--markdown")
    assert md.returncode == 0 and md.stdout.startswith("|")
