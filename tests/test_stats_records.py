"""The statistics records: one per component, every figure typed and
documented once, and stats, stats.json and /metrics made from the same
records (memosfs/stats.py, memosfs/fuse/control.py's STATS_RECORDS)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest

from memosfs.fuse.control import STATS_RECORDS
from memosfs.stats import (COUNTER, GAUGE, LABEL, Record, fields_of, format_metrics,
                           format_stats, stats_json, stats_table_markdown)

STATS_PAGE = Path(__file__).resolve().parent.parent / "docs" / "stats.md"


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def test_the_stats_page_table_is_the_records_table():
    section = _section(STATS_PAGE.read_text(), "Every figure")
    table = stats_table_markdown(STATS_RECORDS)
    assert table in section
    # and no hand-written row besides it
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert rows == table.splitlines()


def test_every_name_is_unique():
    names = [n for cls in STATS_RECORDS for n, _, _ in fields_of(cls)]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


def test_every_field_has_a_kind_and_a_meaning():
    for cls in STATS_RECORDS:
        assert issubclass(cls, Record) and dataclasses.is_dataclass(cls)
        assert cls.__dataclass_params__.frozen, cls
        assert (cls.__doc__ or "").strip(), f"{cls.__name__}: no docstring (the title in docs/stats.md)"
        for f in dataclasses.fields(cls):
            kind, meaning = f.metadata.get("kind"), f.metadata.get("meaning", "")
            assert kind in (COUNTER, GAUGE, LABEL), f"{cls.__name__}.{f.name}"
            assert meaning.strip() and "|" not in meaning and "\n" not in meaning, \
                f"{cls.__name__}.{f.name}: {meaning!r}"


def test_a_plain_dict_is_not_a_record():
    with pytest.raises(TypeError):
        format_metrics([{"slots": 1}])


def _metric_types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def test_metrics_types_follow_the_records():
    records = [cls() for cls in STATS_RECORDS]
    types = _metric_types(format_metrics(records))
    want = {}
    for cls in STATS_RECORDS:
        for name, kind, _ in fields_of(cls):
            if kind == COUNTER:
                want[f"memosfs_{name}_total"] = "counter"
            elif kind == GAUGE:
                want[f"memosfs_{name}"] = "gauge"
            else:
                want[f"memosfs_{name}_info"] = "gauge"
    assert types == want
    assert all(n.endswith("_total") for n, t in types.items() if t == "counter")
    # the 0/1 levels of the remote tier are gauges, not counters
    assert types["memosfs_remote_connected"] == "gauge"
    assert types["memosfs_remote_subscribed"] == "gauge"
    assert types["memosfs_remote_queue_dropped_total"] == "counter"
    assert types["memosfs_quota_agents"] == "gauge"


def test_records_read_by_name_like_the_maps_they_replaced():
    from memosfs.store.ssd import SSDStats
    r = SSDStats(ssd_slots=3, ssd_corrupt=1)
    assert r["ssd_slots"] == 3 and r.get("ssd_corrupt") == 1 and r.get("nope", 7) == 7
    with pytest.raises(KeyError):
        r["nope"]
    assert format_stats([r]).splitlines()[0] == "ssd_slots 3"
    assert json.loads(stats_json([r]))["ssd_corrupt"] == 1


def _parse_metrics(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = value
    return out


def test_stats_json_and_metrics_of_a_mount_agree(mnt):
    s = mnt.path / "a" / "s"
    os.makedirs(s)
    (s / "x").write_bytes(b"hello" * 1000)
    assert (s / "x").read_bytes() == b"hello" * 1000
    assert not (s / "absent").exists()
    ctl = mnt.path / ".memos"
    before = json.loads((ctl / "cache" / "stats.json").read_text())
    text = (ctl / "cache" / "stats").read_text()
    metrics = (ctl / "metrics").read_text()
    after = json.loads((ctl / "cache" / "stats.json").read_text())

    # the records a mount without a remote tier shows, in order
    shown = [cls for cls in STATS_RECORDS if cls.__name__ != "RemoteStats"]
    kinds = {n: k for cls in shown for n, k, _ in fields_of(cls)}
    assert list(before) == list(kinds)
    lines = [line.split(" ", 1) for line in text.splitlines()]
    assert [n for n, _ in lines] == list(kinds)
    assert before["slots"] >= 1 and before["hits"] >= 1 and before["misses"] >= 1
    assert before["evict_policy"] == "lru_lfu"

    def agrees(name: str, shown_value: str) -> bool:
        a, b = before[name], after[name]
        if isinstance(a, str):
            return shown_value == a == b
        v = float(shown_value)
        lo, hi = min(a, b), max(a, b)
        return lo - 1e-5 * abs(lo) <= v <= hi + 1e-5 * abs(hi)     # 6 digits shown

    for name, value in lines:
        assert agrees(name, value), (name, value, before[name], after[name])

    samples = _parse_metrics(metrics)
    types = _metric_types(metrics)
    assert len(samples) == len(types) == len(kinds)
    for name, kind in kinds.items():
        if kind == COUNTER:
            m = f"memosfs_{name}_total"
            assert types[m] == "counter" and agrees(name, samples[m]), name
        elif kind == GAUGE:
            m = f"memosfs_{name}"
            assert types[m] == "gauge" and agrees(name, samples[m]), name
        else:
            m = f'memosfs_{name}_info{{value="{before[name]}"}}'
            assert types[f"memosfs_{name}_info"] == "gauge" and samples[m] == "1", name
        assert f"# HELP {m.split('{')[0]} " in metrics


def test_a_mount_with_a_remote_tier_shows_its_record_last(make_mount):
    from memosfs.testing.localcluster import LocalCluster, redis_server_missing
    reason = redis_server_missing()
    try:
        import redis  # noqa: F401
    except ImportError:
        reason = reason or "redis-py is not installed"
    if reason:
        pytest.skip(reason)
    import time

    from memosfs.store.remote.tier import RemoteStats
    with LocalCluster(masters=3, replicas=0) as cluster:
        m = make_mount(capacity="64M", remote=cluster.url)
        metrics_file = m.path / ".memos" / "metrics"
        deadline = time.monotonic() + 20
        while "\nmemosfs_remote_connected 1\n" not in metrics_file.read_text():
            assert time.monotonic() < deadline, "the remote tier did not connect"
            time.sleep(0.1)
        stats = json.loads((m.path / ".memos" / "cache" / "stats.json").read_text())
        remote = [n for n, _, _ in fields_of(RemoteStats)]
        assert list(stats)[-len(remote):] == remote
        types = _metric_types(metrics_file.read_text())
        assert types["memosfs_remote_connected"] == "gauge"
        assert types["memosfs_remote_subscribed"] == "gauge"
        assert types["memosfs_remote_hits_total"] == "counter"
        assert "memosfs_remote_connected_total" not in types
        m.stop()
