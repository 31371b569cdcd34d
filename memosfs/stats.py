"""Statistics records, and how they are shown.

Each component keeps its own figures and hands them out as one frozen record
(trio's `statistics()` habit): a dataclass whose every field is declared
with `counter(...)`, `gauge(...)` or `label(...)`, saying what kind of figure
it is and what it means.  Everything a user sees is made from the records:

    stats        `name value` lines                      format_stats(records)
    stats.json   one JSON object                         stats_json(records)
    /metrics     Prometheus text, counters as `_total`   format_metrics(records)
    docs         the stats table (docs/stats.md)         stats_table_markdown(classes)

so a figure is documented exactly once, next to the code that counts it, and
a counter can never be exported as a gauge or the other way round.

    @dataclass(frozen=True)
    class CoherenceStats:
        coherence_acks: int = counter("acknowledgements received")
        coherence_holders: int = gauge("handles in the directory now")

A counter only grows while the mount lives; a gauge is a level that goes up
and down (sizes, ratios, settings); a label is text (exported to /metrics as
an info-style gauge `memosfs_<name>_info{value="..."} 1`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterable, Iterator

__all__ = ["Record", "counter", "gauge", "label", "fields_of", "as_dict", "format_stats",
           "format_metrics", "stats_json", "stats_table_markdown"]

COUNTER, GAUGE, LABEL = "counter", "gauge", "label"


def counter(meaning: str) -> Any:
    """A field that only grows (events, bytes moved)."""
    return dataclasses.field(default=0, metadata={"kind": COUNTER, "meaning": meaning})


def gauge(meaning: str, default: Any = 0) -> Any:
    """A field that is a level now (a size, a ratio, a setting)."""
    return dataclasses.field(default=default, metadata={"kind": GAUGE, "meaning": meaning})


def label(meaning: str, default: str = "") -> Any:
    """A field that is text (a policy's name)."""
    return dataclasses.field(default=default, metadata={"kind": LABEL, "meaning": meaning})


class Record:
    """Base of the records: a figure also reads by name (`record["name"]`,
    `record.get("name", default)`), as the name -> value maps the records
    replaced did."""

    __slots__ = ()

    def __getitem__(self, name: str) -> Any:
        if not isinstance(name, str) or name not in self.names():
            raise KeyError(name)
        return getattr(self, name)

    def get(self, name: str, default: Any = None) -> Any:
        return getattr(self, name) if name in self.names() else default

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def as_dict(self) -> dict[str, Any]:
        return {n: getattr(self, n) for n in self.names()}


def fields_of(cls_or_record: Any) -> Iterator[tuple[str, str, str]]:
    """(name, kind, meaning) of every field of a record class, in order."""
    for f in dataclasses.fields(cls_or_record):
        kind = f.metadata.get("kind")
        if kind is None:
            raise TypeError(f"{type(cls_or_record).__name__}.{f.name}: declare it with "
                            "counter(), gauge() or label()")
        yield f.name, kind, f.metadata["meaning"]


def as_dict(records: Iterable[Any]) -> dict[str, Any]:
    """Every field of every record, by name, in order (names are unique)."""
    out: dict[str, Any] = {}
    for r in records:
        for name, _, _ in fields_of(r):
            if name in out:
                raise ValueError(f"statistic {name!r} is in two records")
            out[name] = getattr(r, name)
    return out


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def format_stats(records: Iterable[Any]) -> str:
    """`name value` lines; floats with 6 significant digits."""
    return "".join(f"{k} {_fmt(v)}\n" for k, v in as_dict(records).items())


def stats_json(records: Iterable[Any]) -> str:
    return json.dumps(as_dict(records), sort_keys=False) + "\n"


def format_metrics(records: Iterable[Any]) -> str:
    """Prometheus text exposition format (version 0.0.4), typed by the
    records: counters as `memosfs_<name>_total`, gauges as `memosfs_<name>`,
    labels as `memosfs_<name>_info{value="..."} 1`."""
    out = []
    for r in records:
        for name, kind, meaning in fields_of(r):
            v = getattr(r, name)
            help_ = meaning.replace("\\", "\\\\").replace("\n", " ")
            if kind == LABEL:
                m = f"memosfs_{name}_info"
                text = str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
                out.append(f"# HELP {m} {help_}\n# TYPE {m} gauge\n"
                           f'{m}{{value="{text}"}} 1\n')
                continue
            if isinstance(v, bool):
                v = int(v)
            m = f"memosfs_{name}_total" if kind == COUNTER else f"memosfs_{name}"
            out.append(f"# HELP {m} {help_}\n# TYPE {m} {kind}\n{m} {_fmt(v)}\n")
    return "".join(out)


def stats_table_markdown(classes: Iterable[type]) -> str:
    """docs/stats.md's table: one section row per record, then its fields."""
    rows = ["| stat | kind | meaning |", "|---|---|---|"]
    for cls in classes:
        title = (cls.__doc__ or cls.__name__).strip().splitlines()[0].rstrip(".")
        rows.append(f"| **{title}** | | |")
        for name, kind, meaning in fields_of(cls):
            rows.append(f"| `{name}` | {kind} | {meaning} |")
    return "\n".join(rows) + "\n"
