"""`memosfs top MOUNT`: a live view of a mount, for operators.

Every `--interval` seconds (default 1) it reads MOUNT/.memos/cache/stats.json
and the `user.memos.usage` (and `user.memos.quota`) attributes of the agent
directories at the top of MOUNT, and shows

    hit ratio      hits / lookups, memory and SSD hits, misses
    memory         bytes used / capacity, slots
    ssd            bytes used / capacity, slots
    evictions      total and per second, eviction runs, refusals
    write-back     dirty slots queued, written back (per second), unsaved
    coherence      protocol, slots and holders tracked, invalidations, waits
    agents         each agent's bytes in memory, share of the memory capacity,
                   quota; largest first

Rates are over the last refresh; the first frame (and `--once`) shows the
average since the mount started (`uptime_s`).  stats.json carries no names:
the agents are the directories the caller can list and read, so a user sees
the agents their permissions show them (the others are counted, not named).

`--once` prints one frame as plain text and exits (for scripts); on a
terminal the view is drawn with curses (q quits), otherwise a frame is
printed every interval.

A leaf: it reads files and attributes only, and imports nothing of memosfs.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

STATS = (".memos", "cache", "stats.json")
USAGE = "user.memos.usage"
QUOTA = "user.memos.quota"


class NotAMount(Exception):
    """MOUNT has no readable .memos/cache/stats.json."""


@dataclass
class Agent:
    name: str
    usage: int
    quota: Optional[int] = None


@dataclass
class Sample:
    t: float                            # time.monotonic() when read
    stats: dict
    agents: list[Agent] = field(default_factory=list)
    hidden: int = 0                     # agent directories the caller cannot read


def read_stats(mount: str) -> dict:
    path = os.path.join(mount, *STATS)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) else f"unreadable stats: {e}"
        raise NotAMount(f"{mount} is not a memosfs mount ({path}: {why})") from None


def read_agents(mount: str) -> tuple[list[Agent], int]:
    """(agents whose usage the caller can read, largest first; how many
    agent directories it cannot read)."""
    agents, hidden = [], 0
    try:
        names = sorted(os.listdir(mount))
    except OSError:
        return [], 0
    for name in names:
        if name == ".memos":            # the control tree
            continue
        path = os.path.join(mount, name)
        try:
            usage = int(os.getxattr(path, USAGE))
        except OSError as e:
            if e.errno in (errno.EACCES, errno.EPERM):
                hidden += 1
            continue                    # gone meanwhile, or not an agent directory
        except ValueError:
            continue
        try:
            quota: Optional[int] = int(os.getxattr(path, QUOTA))
        except (OSError, ValueError):
            quota = None
        agents.append(Agent(name, usage, quota))
    agents.sort(key=lambda a: (-a.usage, a.name))
    return agents, hidden


def sample(mount: str) -> Sample:
    stats = read_stats(mount)
    agents, hidden = read_agents(mount)
    return Sample(time.monotonic(), stats, agents, hidden)


# ---------------------------------------------------------------- one frame

def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def pct(part: float, whole: float) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def duration(s: float) -> str:
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _rate(name: str, cur: Sample, prev: Optional[Sample]) -> float:
    """Per second: over the last refresh, or since the mount when there is
    no earlier sample (or the counter went back: a remount)."""
    now = cur.stats.get(name, 0) or 0
    if prev is not None and cur.t > prev.t:
        before = prev.stats.get(name, 0) or 0
        if now >= before:
            return (now - before) / (cur.t - prev.t)
    up = cur.stats.get("uptime_s", 0) or 0
    return now / up if up > 0 else 0.0


def render(mount: str, cur: Sample, prev: Optional[Sample] = None,
           interval: Optional[float] = None) -> list[str]:
    """The frame as lines of plain text."""
    s = cur.stats
    g = lambda k: s.get(k, 0) or 0         # noqa: E731
    over = "last refresh" if prev is not None else "average since mount"
    head = f"memosfs top  {mount}  up {duration(g('uptime_s'))}"
    if interval is not None:
        head += f"  every {interval:g}s"
    lines = [head + f"  (rates: {over})", ""]
    lookups = g("lookups")
    lines.append(f"hit ratio   {pct(g('hits'), lookups):>6}  hits {g('hits'):,} of "
                 f"{lookups:,} lookups (memory {g('mem_hits'):,}, ssd {g('ssd_hits'):,})"
                 f"  misses {g('misses'):,}")
    lines.append(f"memory      {human(g('bytes_used')):>10} / {human(g('capacity')):<10} "
                 f"{pct(g('bytes_used'), g('capacity')):>6}  slots {g('slots'):,}  "
                 f"pinned {g('pinned'):,}  drafts {g('drafts'):,}")
    ssd_cap = g("ssd_capacity")
    lines.append(f"ssd         {human(g('ssd_bytes')):>10} / "
                 f"{(human(ssd_cap) if ssd_cap else 'the disk'):<10} "
                 f"{pct(g('ssd_bytes'), ssd_cap):>6}  slots {g('ssd_slots'):,}")
    lines.append(f"evictions   {g('evictions'):,} ({_rate('evictions', cur, prev):.1f}/s)  "
                 f"runs {g('eviction_runs'):,}  refused {g('evict_refused'):,}  "
                 f"written back first {g('evict_writebacks'):,}  lost {g('slots_lost'):,}")
    queue = s.get("writeback_queue")
    lines.append(f"write-back  queue {queue if queue is not None else '-'}  "
                 f"written {g('writebacks'):,} ({_rate('writebacks', cur, prev):.1f}/s)  "
                 f"unsaved {g('slots_unsaved'):,}")
    lines.append(f"coherence   protocol {g('coherence_protocol')}  slots "
                 f"{g('coherence_slots'):,}  holders {g('coherence_holders'):,}  "
                 f"invalidations {g('coherence_invalidations'):,} "
                 f"({_rate('coherence_invalidations', cur, prev):.1f}/s)  "
                 f"waits {g('coherence_pending_waits') + g('coherence_read_waits'):,}  "
                 f"timeouts {g('coherence_timeouts'):,}")
    lines.append("")
    shown = len(cur.agents)
    more = f", {cur.hidden} not readable by you" if cur.hidden else ""
    lines.append(f"agents      {g('agents'):,} on the mount, {shown} shown{more}; "
                 f"sessions {g('sessions'):,}; open handles {g('open_handles'):,}")
    if cur.agents:
        width = max(12, max(len(a.name) for a in cur.agents))
        lines.append(f"  {'AGENT':<{width}}  {'MEMORY':>10}  {'OF CAP':>6}  {'QUOTA':>10}")
        for a in cur.agents:
            quota = human(a.quota) if a.quota else "-"
            lines.append(f"  {a.name:<{width}}  {human(a.usage):>10}  "
                         f"{pct(a.usage, g('capacity')):>6}  {quota:>10}")
    return lines


# ---------------------------------------------------------------- the loops

def _live_curses(mount: str, interval: float) -> int:
    import curses

    def loop(scr) -> int:
        curses.curs_set(0)
        scr.timeout(int(interval * 1000))
        prev: Optional[Sample] = None
        while True:
            try:
                cur = sample(mount)
                lines = render(mount, cur, prev, interval)
                prev = cur
            except NotAMount as e:
                lines = [f"memosfs top: {e}"]
            scr.erase()
            h, w = scr.getmaxyx()
            for y, line in enumerate(lines[:max(h - 1, 0)]):
                scr.addnstr(y, 0, line, max(w - 1, 0),
                            curses.A_BOLD if y == 0 else curses.A_NORMAL)
            if h > 0 and w > 1:
                scr.addnstr(h - 1, 0, "q: quit", w - 1, curses.A_DIM)
            scr.refresh()
            if scr.getch() in (ord("q"), ord("Q"), 27):
                return 0

    return curses.wrapper(loop)


def _live_plain(mount: str, interval: float) -> int:
    prev: Optional[Sample] = None
    while True:
        cur = sample(mount)
        print("\n".join(render(mount, cur, prev, interval)) + "\n", flush=True)
        prev = cur
        time.sleep(interval)


def run(mount: str, interval: float = 1.0, once: bool = False) -> int:
    try:
        first = sample(mount)
        if once:
            print("\n".join(render(mount, first)))
            return 0
        if sys.stdout.isatty() and sys.stdin.isatty():
            return _live_curses(mount, interval)
        return _live_plain(mount, interval)
    except NotAMount as e:
        print(f"memosfs top: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:             # | head: the reader has gone
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def add_parser(sub) -> None:
    t = sub.add_parser("top", help="a live view of a mount (hit ratio, tiers, agents)",
                       description=__doc__.split("\n\n")[0])
    t.add_argument("mountpoint")
    t.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                   help="seconds between refreshes (default 1)")
    t.add_argument("--once", action="store_true",
                   help="print one frame as plain text and exit")
    t.set_defaults(fn=cmd_top)


def cmd_top(args: argparse.Namespace) -> int:
    if not args.interval > 0:
        print("memosfs top: --interval must be positive", file=sys.stderr)
        return 2
    return run(args.mountpoint, args.interval, args.once)


def main(argv: Optional[list[str]] = None) -> int:
    """`python3 top.py MOUNT [--once]`: the module runs alone, with the
    standard library only (a copy of this file is enough)."""
    p = argparse.ArgumentParser(prog="memosfs top")
    add_parser(p.add_subparsers(dest="cmd"))
    return cmd_top(p.parse_args(["top", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
