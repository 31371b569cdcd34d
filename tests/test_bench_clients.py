"""`memosfs bench clients` end to end, small: one JSON object in which every
pattern is there, measured on the three targets or skipped with a reason,
and every ratio is the memosfs time over the baseline's; no timing asserts."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import FUSE_REASON

pytestmark = pytest.mark.skipif(FUSE_REASON is not None, reason=FUSE_REASON or "")

PATTERNS = {
    "write_4k": ("write",),
    "write_64k": ("write",),
    "write_1m": ("write",),
    "safetensors": ("save", "load_warm", "load_cold"),
    "torch": ("save", "load_warm", "load_cold"),
    "pickle": ("dump", "load_warm", "load_cold"),
    "small": ("create", "read"),
    "slot": ("read_cold_1", "read_cold_4"),
}
TARGETS = ("memosfs", "tmpfs", "disk")


def _mounts_under(d) -> list[str]:
    d = os.path.realpath(d)
    with open("/proc/self/mounts") as f:
        return [ln.split()[1] for ln in f if ln.split()[1].startswith(d + "/")]


@pytest.mark.mount          # the bench mounts through its own daemon
@pytest.mark.slow
def test_bench_clients_small(tmp_path):
    tmp = tmp_path / "tmpdir"
    disk = tmp_path / "disk"
    tmp.mkdir()
    disk.mkdir()
    r = subprocess.run([sys.executable, "-m", "memosfs", "bench", "clients", "--json",
                        "--scale", "0.02", "--repeat", "1", "--disk-dir", str(disk),
                        "--profile"],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, TMPDIR=str(tmp)))
    assert r.returncode == 0, f"exit {r.returncode}\n{r.stdout}\n{r.stderr[-4000:]}"
    out = json.loads(r.stdout)
    assert out["bench"] == "clients" and out["repeat"] == 1 and out["scale"] == 0.02
    assert set(out["targets"]) == set(TARGETS) | {"memosfs_nofast", "memosfs_wbc",
                                                   "memosfs_pt", "nullfs"}
    # the passthrough mount: root only (registering a backing file needs it)
    pt = "skipped" not in out["targets"]["memosfs_pt"]
    assert pt == (os.geteuid() == 0), out["targets"]["memosfs_pt"]
    if pt:
        assert out["targets"]["memosfs_pt"]["knobs"] == {"passthrough": "1"}
        assert out["targets"]["memosfs_pt"]["fstype"].startswith("fuse")
    assert out["targets"]["memosfs"]["fstype"].startswith("fuse")
    assert out["targets"]["memosfs_nofast"]["knobs"] == {"fast_path": "0"}
    assert out["targets"]["memosfs_wbc"]["knobs"] == {"writeback_cache": "1"}
    assert out["targets"]["memosfs_wbc"]["fstype"].startswith("fuse")
    null = "skipped" not in out["targets"]["nullfs"]
    if null:
        assert out["targets"]["nullfs"]["fstype"].startswith("fuse")
    assert out["targets"]["tmpfs"]["fstype"] == "tmpfs"
    assert set(out["patterns"]) == set(PATTERNS)
    measured = 0
    for name, figs in PATTERNS.items():
        pat = out["patterns"][name]
        if "skipped" in pat:
            # only the torch patterns may be skipped, and only without torch
            assert name in ("torch", "safetensors"), (name, pat)
            assert "not importable" in pat["skipped"]
            continue
        measured += 1
        assert set(pat["figures"]) == set(figs), (name, pat)
        # --profile: what each memosfs daemon saw while the pattern ran
        prof = pat["profile"]
        assert set(prof) == {"memosfs", "memosfs_nofast", "memosfs_wbc"} | (
            {"memosfs_pt"} if pt else set()), prof
        for t, p in prof.items():
            assert p["requests"] > 0 and p["MB"] > 0, (name, t, p)
            assert p["write_requests"] <= p["requests"], (name, t, p)
            want = p["requests"] / p["MB"]
            assert abs(p["requests_per_MB"] - want) <= 0.01 + 1e-3 * want, (name, t, p)
            if name == "small":
                # a created file costs at least its create, write and release
                # (the writer's flush publishes); a read at least open and release
                assert set(p["per_op"]) == {"create", "read"}, (t, p)
                assert p["per_op"]["create"]["requests"] >= 3, (t, p)
                assert p["per_op"]["read"]["requests"] >= 2, (t, p)
            else:
                assert "per_op" not in p, (name, t, p)
            if name.startswith("write_"):
                # at least one request per write() without the writeback cache;
                # with passthrough none (the kernel writes the daemon's file)
                if t == "memosfs_pt":
                    assert p["write_requests"] == 0, (name, t, p)
                    continue
                if t != "memosfs_wbc":
                    assert p["write_requests"] >= pat["bytes"] // pat["write_bytes"], (t, p)
                assert p["write_requests"] >= 1, (name, t, p)
        for fig, f in pat["figures"].items():
            s = f["seconds"]
            # every target, nullfs where it can be (it reads zeros: no loads)
            timed = set(TARGETS) | {"memosfs_nofast", "memosfs_wbc"} | (
                {"memosfs_pt"} if pt else set())
            if null and not fig.startswith("load"):
                timed.add("nullfs")
            assert set(s) == timed and all(s[t] > 0 for t in timed), (name, fig, f)
            unit = "ops_per_s" if name == "small" else "MBps"
            assert set(f[unit]) == timed, (name, fig, f)
            ratios = [("memosfs", "tmpfs", "memosfs_vs_tmpfs"), ("memosfs", "disk", "memosfs_vs_disk"),
                      ("memosfs_nofast", "tmpfs", "nofast_vs_tmpfs"),
                      ("memosfs_wbc", "tmpfs", "wbc_vs_tmpfs"), ("memosfs_wbc", "disk", "wbc_vs_disk")]
            if pt:
                ratios += [("memosfs_pt", "tmpfs", "pt_vs_tmpfs"), ("memosfs_pt", "disk", "pt_vs_disk")]
            if "nullfs" in timed:
                ratios += [("nullfs", "tmpfs", "nullfs_vs_tmpfs"),
                           ("memosfs", "nullfs", "memosfs_vs_nullfs")]
            for a, base, key in ratios:
                want = s[a] / s[base]
                got = f[key]
                assert abs(got - want) <= 1e-4 + 1e-3 * want, (name, fig, key, got, want)
            # the rates say the same as the times: faster means a higher rate
            for a in timed:
                for b in timed:
                    if s[a] < s[b] * 0.99:
                        assert f[unit][a] >= f[unit][b], (name, fig, f)
    assert measured >= 5
    for name in ("persist", "coherence"):
        assert "skipped" in out[name], out[name]
    # everything it made is gone: no mount, no folder left behind
    assert _mounts_under(tmp_path) == []
    assert list(tmp.iterdir()) == [] and list(disk.iterdir()) == []


def test_bench_clients_refuses_unknown_pattern():
    r = subprocess.run([sys.executable, "-m", "memosfs", "bench", "clients", "--only",
                        "write_4k,nosuch"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "nosuch" in r.stderr
