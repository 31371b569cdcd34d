"""The knob table: every setting of a mount, in one place.

Every setting lives in one table, `KNOBS`: its name, its kind and bounds (how
a written value is parsed and checked), its default, what it means and when
a change takes effect.  The knob files under `.memos/cache/`, their
validation, the mount options and the knob list in docs/knobs.md all come
from this table; memosfs/fuse/control.py applies a value (`KNOB_APPLY`, one
function for a mount option and for an `echo` into the knob's file).

Values are typed: `Knob.parse` turns text into the knob's Python value
(int, float, bool, or the name of a choice) and `Knob.format` turns it back
into the text its file shows, so `parse(format(v)) == v`.

Knob input is strict: ASCII only (any other byte is EINVAL, so are Unicode
digits such as U+0663 or full-width ones), surrounding spaces, tabs and
newlines are ignored, and then the whole text must be

* an integer knob: decimal digits `[0-9]+`, no sign, no exponent;
* a flag: `0` or `1`;
* a size knob: digits with an optional fraction and an optional suffix:
  `K`, `M`, `G`, `T` or `KiB`, `MiB`, `GiB`, `TiB` are binary (1024,
  1024², ...), `KB`, `MB`, `GB`, `TB` are decimal (1000, 1000², ..., as
  dd(1) and truncate(1) read them): `512M` is 536,870,912 bytes, `512MB`
  512,000,000; the result must be a whole number of bytes;
* a ratio knob: `[0-9]+` or `[0-9]+.[0-9]+` (so no `-0`, `nan`, `inf`, `1e-1`);
* a choice knob: one of its names exactly;
* a mode mask (umask): one to four octal digits `[0-7]`, as umask(1) takes
  them (`077`, `0022`);

and within the knob's bounds in `KNOBS` (see `Knob.range_text`).  At most 64
bytes are read.  The mount options (`-o capacity=4G,...`) go through the same
parser.

What lasts: a value written into a knob file lasts until the unmount; every
mount starts from the defaults and the `-o` options (an fstab line), as
sysctl settings last until a reboot unless a configuration file sets them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Knob", "KNOBS", "KNOB_BY_NAME", "KnobError", "parse_size"]


class KnobError(ValueError):
    """A value that a knob refuses; the message says why."""


MAX_INPUT = 64                          # bytes of a knob value looked at, at most
_BLANK = " \t\r\n"
_INT_RE = re.compile(r"[0-9]+", re.ASCII)
_SIZE_RE = re.compile(r"([0-9]+)(?:\.([0-9]+))?(?:([kKmMgGtT])([iI]?)([bB]?)|[bB])?", re.ASCII)
_RATIO_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?", re.ASCII)
_OCTAL_RE = re.compile(r"[0-7]{1,4}", re.ASCII)
_SIZE_POWER = {"k": 1, "m": 2, "g": 3, "t": 4}


def _clean(text: str) -> str:
    """The text of a written value: ASCII, short, not blank; stripped of
    surrounding spaces, tabs and newlines."""
    if len(text) > MAX_INPUT:
        raise KnobError(f"a value of {len(text)} characters (at most {MAX_INPUT})")
    if not text.isascii():
        raise KnobError(f"not ASCII: {text!r}")
    t = text.strip(_BLANK)
    if not t:
        raise KnobError("an empty value")
    return t


def parse_size(text: str) -> int:
    """Parse `4G`, `512M`, `1.5g`, `65536`, `96MiB` (binary multiples) or
    `512MB`, `4GB` (decimal multiples) into bytes; ASCII digits only, no
    sign, no exponent, a whole number of bytes."""
    t = _clean(text)
    m = _SIZE_RE.fullmatch(t)
    if not m or (m.group(4) and not m.group(5)):        # "4Gi": no unit
        raise KnobError(f"not a size: {t!r} (use bytes or a K/M/G/T suffix: "
                        f"binary K, M, G, T, KiB, MiB, GiB, TiB; decimal KB, MB, GB, TB)")
    whole, frac, letter = m.group(1), m.group(2) or "", (m.group(3) or "").lower()
    decimal = bool(letter and m.group(5) and not m.group(4))
    mult = 1 if not letter else (1000 if decimal else 1024) ** _SIZE_POWER[letter]
    num = int(whole + frac) * mult
    den = 10 ** len(frac)
    if num % den:
        raise KnobError(f"not a whole number of bytes: {t!r}")
    return num // den


def _parse_int(text: str) -> int:
    t = _clean(text)
    if not _INT_RE.fullmatch(t):
        raise KnobError(f"not an integer: {t!r} (decimal digits, no sign)")
    return int(t)


def _parse_ratio(text: str) -> float:
    t = _clean(text)
    if not _RATIO_RE.fullmatch(t):
        raise KnobError(f"not a number: {t!r} (digits with an optional .fraction)")
    return float(t)


def _fmt_bound(kind: str, v: Any) -> str:
    if kind in ("size", "share"):
        for suffix, mult in (("T", 1 << 40), ("G", 1 << 30), ("M", 1 << 20),
                             ("K", 1 << 10)):
            if v and v % mult == 0:
                return f"{v // mult}{suffix}"
    if kind == "mask":
        return f"{v:04o}"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


@dataclass(frozen=True)
class Knob:
    """One setting: name; kind; bounds; default (typed); meaning (one
    line, for docs/knobs.md and `memosfs knobs`); when a change takes
    effect; for sizes, whether 0 is also allowed (`zero`); for ratios,
    whether lo itself is excluded (`open_lo`).

    Kinds and their values: int (an int in [lo, hi]), size (an int of
    bytes), ratio (a float in [lo, hi]), flag (a bool, written 0 or 1),
    choice (one of the names in bounds, a str), error_max (a float, or the
    str `auto`), share (an int of bytes, or a str `N%` of capacity), mask
    (an int of permission bits, written in octal)."""
    name: str
    kind: str
    bounds: tuple
    default: Any
    meaning: str
    effect: str = "at once"
    zero: bool = False
    open_lo: bool = False

    def parse(self, text: str) -> Any:
        """The typed value of written text, or KnobError saying why not."""
        if self.kind == "choice":
            t = _clean(text)
            if t not in self.bounds:
                raise KnobError(f"{t!r} is not one of {', '.join(self.bounds)}")
            return t
        if self.kind == "flag":
            t = _clean(text)
            if t not in ("0", "1"):
                raise KnobError(f"{t!r} is not 0 or 1")
            return t == "1"
        if self.kind == "error_max" and _clean(text) == "auto":
            return "auto"
        if self.kind == "share" and _clean(text).endswith("%"):
            t = _clean(text)
            if not _INT_RE.fullmatch(t[:-1]) or not 1 <= int(t[:-1]) <= 100:
                raise KnobError(f"{t!r} is not a share of capacity in [1%, 100%]")
            return f"{int(t[:-1])}%"
        if self.kind == "mask":
            t = _clean(text)
            if not _OCTAL_RE.fullmatch(t):
                raise KnobError(f"not a mode mask: {t!r} (octal digits, as umask takes them)")
            v: Any = int(t, 8)
        elif self.kind == "int":
            v = _parse_int(text)
        elif self.kind in ("size", "share"):
            v = parse_size(text)
            if v == 0 and self.zero:
                return 0
        else:                                   # ratio, error_max
            v = _parse_ratio(text)
        lo, hi = self.bounds
        if v < lo or v > hi or (self.open_lo and v == lo):
            unit = " bytes" if self.kind in ("size", "share") else ""
            raise KnobError(f"{v}{unit} is out of range {self.range_text()}")
        return v

    def value(self, given: Any) -> Any:
        """A typed value from text (parsed) or from a value of the knob's
        type (checked the same way, through its text): KnobError if not."""
        if isinstance(given, str):
            return self.parse(given)
        if self.kind == "flag" and isinstance(given, (bool, int)) and given in (0, 1):
            return bool(given)
        if isinstance(given, bool) or not isinstance(given, (int, float)):
            raise KnobError(f"{given!r} is not a value of {self.name}")
        return self.parse(self.format(given))

    def range_text(self) -> str:
        """The accepted values, for messages and docs/knobs.md (no `|`:
        the text goes into Markdown table cells)."""
        if self.kind == "choice":
            return ", ".join(self.bounds[:-1]) + " or " + self.bounds[-1]
        if self.kind == "flag":
            return "0 or 1"
        lo, hi = (_fmt_bound(self.kind, b) for b in self.bounds)
        text = f"{'(' if self.open_lo else '['}{lo}, {hi}]"
        if self.zero:
            text = f"0 or {text}"
        if self.kind == "error_max":
            text = f"auto or {text}"
        if self.kind == "share":
            text = f"{text} or [1%, 100%] of capacity"
        return text

    def format(self, value: Any) -> str:
        """The text of a value, as the knob's file shows it."""
        if self.kind == "flag":
            return "1\n" if value else "0\n"
        if self.kind == "mask":
            return f"{value:04o}\n"
        return f"{value}\n"


def _choice(name, names, default, meaning, effect="at once") -> Knob:
    return Knob(name, "choice", tuple(names), default, meaning, effect)


KNOBS: tuple[Knob, ...] = (
    Knob("capacity", "size", (2 << 20, 1 << 50), 1 << 30,
         "memory tier size in bytes (accepts 512M, 4G); rounded up to 2 MiB superblocks; "
         "shrinking evicts"),
    _choice("evict_policy", ("lru_lfu", "lru", "lfu"), "lru_lfu",
            "eviction policy of both tiers: lru_lfu (a probation/protected hybrid at one of "
            "four settings, the setting chosen once a window by replaying each on a 1% sample "
            "of the keys beside the cache; a slot read again and again outlives a scan), lru "
            "or lfu; switching keeps every slot"),
    Knob("evict_batch", "int", (1, 4096), 16,
         "victims chosen per eviction run (a larger batch trades P99 put latency for throughput)"),
    Knob("reclaim_free_ratio", "ratio", (0.0, 1.0), 0.2,
         "lazy reclaim: the arena sweeps freed pages back into whole blocks when its "
         "allocatable share of capacity falls below this (0 = only after failures and on "
         "flush)"),
    Knob("reclaim_fail_limit", "int", (0, 1_000_000), 3,
         "lazy reclaim: the arena also sweeps after more than this many allocation "
         "failures in a row"),
    Knob("writeback_delay_ms", "int", (0, 3_600_000), 1000,
         "a published (dirty) slot is written to the SSD tier this long after its "
         "publish, by the background writer (sooner when memory is 75% full: dirty slots "
         "are then written back ahead of eviction, longest dirty first)"),
    Knob("ssd_capacity", "size", (1 << 20, 1 << 50), 0,
         "bytes the SSD tier may hold (accepts 100G); beyond it, its least recently used "
         "slots go (ssd_full); 0 = as much as the disk has", zero=True),
    _choice("ssd_full", ("evict", "refuse"), "evict",
            "what the SSD tier does at ssd_capacity: evict (its coldest slots go, as "
            "memory's do: logged, counted in ssd_evicted_slots, shown in .memos/why) or "
            "refuse (it keeps every slot it holds; a slot that does not fit stays in memory, "
            "and new writes get ENOSPC once memory is full of such slots)"),
    _choice("unmount_unsaved", ("refuse", "lose"), "refuse",
            "an unmount while dirty slots cannot be written back to the SSD tier (its disk "
            "full; ssd_capacity with ssd_full=refuse): refuse (the mount is held busy: umount "
            "says 'target is busy', memosfs umount names the slots and the room missing) or "
            "lose (the unmount goes on and each slot lost is logged; memosfs umount --force "
            "sets it)"),
    Knob("warmup_ratio", "ratio", (0.0, 1.0), 0.5,
         "share of capacity preloaded from the SSD tier at mount, most recently used "
         "first, in the background", "at mount (give it with -o)"),
    Knob("ssd_pack_below", "size", (1, 1 << 20), 64 << 10,
         "SSD tier: versions smaller than this are packed, several to a segment file, "
         "instead of a file each (docs/ssd-format.md); 0 = a file for every slot",
         "on the next write-back", zero=True),
    _choice("quantize", ("off", "int8", "int8-layer", "int4"), "off",
            "store safetensors slots' float tensors quantized: int8 (keys per channel, values "
            "per token), int8-layer (one scale per tensor), int4 (groups of 32); reads return "
            "the dequantized tensors in their dtype and layout", "on the next publish"),
    Knob("quant_error_max", "error_max", (0.0, 1.0), "auto",
         "relative error (norm of x - x^ over norm of x) above which a tensor stays at "
         "full precision; auto = 0.03 for int8 schemes, 0.12 for int4", "on the next publish", open_lo=True),
    Knob("page_cache_push", "flag", (), True,
         "1: local readers and mmap find each published version in the kernel page cache "
         "without a request (as after a write on a local filesystem): the pages its writers' "
         "writes left there when they hold it, otherwise a copy pushed in (versions of 1 MiB "
         "or more; one that writers published, of 4 MiB or more, once the last of them "
         "closes); 0: readers fetch from the daemon"),
    Knob("fast_path", "flag", (), True,
         "1: reads and writes on open slots (and getxattr, which the kernel sends before "
         "every write) are answered on the spot by the C shim's callback, without a "
         "scheduler round per request; 0: every request goes through the async handlers"),
    Knob("writeback_cache", "flag", (), False,
         "1: writers write into the kernel page cache, whose pages reach the daemon in "
         "requests of up to 1 MiB at close, fsync or the kernel's writeback (small writes "
         "at page-cache speed); while a slot is rewritten in place, other processes' stat "
         "shows the writer's size, a write the memory tier refuses fails the close or "
         "fsync, and two whole-slot writers of one inode share its draft "
         "(docs/semantics.md); 0: every write(2) is a request, refused at once",
         "at mount (give it with -o)"),
    Knob("passthrough", "flag", (), False,
         "1: the kernel reads and writes slots' bytes in files of the daemon's own "
         "(FUSE passthrough, kernel 6.9 or later, a daemon run as root, not with "
         "writeback_cache): a published version of passthrough_min bytes or more is read "
         "from a copy in memory, and a whole new version (a create, O_TRUNC) is written into "
         "one and copied into the memory tier at the close (docs/semantics.md, \"Passthrough\"); "
         "its costs today: such a version is held twice while its copy is kept (a 100 MB "
         "slot takes 200 MB: the memory tier's and the copy, the copies within a third of "
         "passthrough_room), and whole-file saves are slower than with 0 (the copy at the "
         "close; docs/benchmarks.md); 0: every read and write is a request to the daemon",
         "at mount (give it with -o)"),
    Knob("passthrough_min", "size", (0, 1 << 50), 256 << 10,
         "the smallest published version readers read by passthrough (smaller ones come "
         "from the kernel page cache)", "on the next open"),
    Knob("passthrough_room", "size", (1 << 20, 1 << 50), 0,
         "bytes of memory for passthrough files (writers' files and the copies readers "
         "read; the copies take a third at most); 0 = 1.5 times the memory tier's capacity and 4 MiB", "at mount (give it with -o)", zero=True),
    Knob("burst_poll_us", "int", (0, 1000), 30,
         "after answering a request on the fast path, how long the daemon waits for the "
         "client's next one to take it at once (a stream of small writes); 0: no waiting"),
    Knob("coherence_protocol", "int", (0, 2), 1,
         "agents sharing slots: 0 no tracking (last publish wins); 1 batched invalidation "
         "(a writer goes on at once, holders are told in batches and keep their snapshot); "
         "2 strong (a writer's open waits until every holder has acknowledged, and no "
         "reader opens while a write is granted)", "on the next open"),
    Knob("coherence_timeout_ms", "int", (1, 3_600_000), 5000,
         "protocol 2: how long an open waits for acknowledgements or for a writer before "
         "it fails with ETIMEDOUT and nothing changes", "on the next open"),
    Knob("lease_break_ms", "int", (1, 3_600_000), 1000,
         "protocol 2: a holder that has not acknowledged this long after a writer started "
         "waiting is revoked (its reads fail with ESTALE) and the writer goes on; no effect "
         "when not shorter than coherence_timeout_ms", "on the next wait"),
    Knob("coherence_batch_ms", "int", (0, 60_000), 2,
         "protocol 1: invalidations are delivered in batches at most this often "
         "(0 = at once)"),
    _choice("agent_identity", ("uid", "pid"), "uid",
            "who is an agent for the coherence directory: every uid (its processes share a "
            "state) or every process", "on the next open"),
    Knob("ring_slots", "int", (0, 1 << 30), 0,
         "slots a session keeps before its oldest is recycled (0 = no limit)",
         "on the next publish in a session"),
    Knob("umask", "mask", (0, 0o777), 0o077,
         "permission bits taken away from every new agent, session, directory and slot, "
         "on top of the creator's umask (as vfat's umask=): 077 keeps each agent private "
         "to its uid, 022 lets every uid read; chmod shares one on purpose",
         "on the next mkdir or create"),
    Knob("pin_max_per_uid", "share", (1 << 20, 1 << 50), "25%",
         "bytes one uid may pin with user.memos.pin (a size, or a share of capacity: 25%); "
         "a pin beyond it is EDQUOT; root is not bounded"),
    Knob("hold_max_per_uid", "share", (1 << 20, 1 << 50), "50%",
         "memory one uid's open handles may keep from eviction (versions open for "
         "reading, drafts of its writers; a size or a share of capacity); an open or a "
         "write beyond it is EDQUOT; root is not bounded"),
    _choice("prefetch_mode", ("off", "sequential", "random", "hybrid", "learned"), "off",
            "bring slots from the SSD tier into memory before they are read: sequential (the "
            "next prefetch_stride slots of the session, by its detected stride), random (hot "
            "slots from the heat table), hybrid (whichever of the two is more accurate), "
            "learned (an LSTM over the session's moves; needs torch) or off"),
    Knob("prefetch_stride", "int", (0, 64), 2,
         "slots fetched ahead per read (sequential: the next N at the session's stride; "
         "random and learned: up to N)"),
    Knob("prefetch_retrain_below", "ratio", (0.0, 1.0), 0.70,
         "prefetch accuracy (used before eviction / fetched, over a window) below which "
         "learned retrains and hybrid re-chooses"),
)
KNOB_BY_NAME = {k.name: k for k in KNOBS}
