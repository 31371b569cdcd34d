"""A job's config and its privacy accounting.

Owns: the config keys, their defaults and order (CONFIG_DEFAULTS, CONFIG_ORDER, MODES),
parse_config (a JSON object or `key = value` lines merged into the current config;
ValueError -> EINVAL) and format_config, the client-name syntax (NAME_RE, also the job
names'), expected_count / named_clients (who a round waits for), and the accounting:
epsilon_for (dp-accounting's RdpAccountant over the per-round noise multipliers) and
fmt_epsilon.  dp-accounting takes ~2 s to import (scipy): it is imported on first use,
or early in a background thread once a job exists (warm_imports).

May call: errors (the logger), tensors (MAX_CLIENTS), crypto (HE_AVAILABLE),
dp-accounting, the standard library.  Used by the client (client.py) and the engine.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import threading
from typing import Any, Optional, Sequence

from memosfs.federated.crypto import HE_AVAILABLE
from memosfs.federated.errors import log
from memosfs.federated.tensors import MAX_CLIENTS

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}$")
ACCOUNTANT_AVAILABLE = importlib.util.find_spec("dp_accounting") is not None


def accountant():
    from dp_accounting import dp_event, rdp
    return dp_event, rdp


_warmed = False


def warm_imports() -> None:
    """Import dp-accounting in a background thread once a job exists, so that the
    first round's accounting does not wait ~2 s for it."""
    global _warmed
    if _warmed or not ACCOUNTANT_AVAILABLE:
        return
    _warmed = True

    def imp() -> None:
        try:
            accountant()
        except Exception:
            log.exception("federated: importing dp-accounting failed")
    threading.Thread(target=imp, name="memosfs-fed-import", daemon=True).start()


# ---------------------------------------------------------------- config

CONFIG_DEFAULTS: dict[str, Any] = {
    "clients": 2,                 # a count, or a list of names
    "min_clients": 0,             # for the aggregate trigger; 0 = all expected clients
    "mode": "plain",
    "clip_norm": 1.0,
    "noise_multiplier": 1.0,
    "learning_rate": 1.0,
    "delta": 1e-5,
    "seed": None,                 # server noise seed (tests only); None = OS entropy
}
CONFIG_ORDER = list(CONFIG_DEFAULTS)
MODES = ("plain", "secure", "he")


def expected_count(cfg: dict[str, Any]) -> int:
    c = cfg["clients"]
    return len(c) if isinstance(c, list) else int(c)


def named_clients(cfg: dict[str, Any]) -> Optional[list[str]]:
    """The expected clients by name where the config names them; None where it gives
    a count (then clients bind their names by writing first)."""
    c = cfg["clients"]
    if isinstance(c, list):
        return c
    return None


def _finite(text: str, name: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{name}: not a number: {text!r}") from None
    if not math.isfinite(v):
        raise ValueError(f"{name}: not finite")
    return v


def _parse_value(key: str, raw: Any) -> Any:
    text = raw if isinstance(raw, str) else json.dumps(raw) if not isinstance(raw, list) else raw
    if key == "clients":
        if isinstance(raw, int) and not isinstance(raw, bool):
            n = raw
            if not 1 <= n <= MAX_CLIENTS:
                raise ValueError(f"clients: 1..{MAX_CLIENTS}")
            return n
        names = raw if isinstance(raw, list) else re.split(r"[\s,]+", str(raw).strip())
        names = [str(x) for x in names if str(x)]
        if len(names) == 1 and names[0].isdigit():
            return _parse_value(key, int(names[0]))
        if not names:
            raise ValueError("clients: a count or a list of names")
        for nm in names:
            if not NAME_RE.match(nm):
                raise ValueError(f"clients: bad client name {nm!r}")
        if len(set(names)) != len(names) or len(names) > MAX_CLIENTS:
            raise ValueError("clients: names must be distinct (at most 1024)")
        return sorted(names)
    if key == "min_clients":
        t = str(text).strip().strip('"')
        if t in ("all", "0"):
            return 0
        if not t.isdigit() or not 1 <= int(t) <= MAX_CLIENTS:
            raise ValueError("min_clients: a positive integer or all")
        return int(t)
    if key == "mode":
        t = str(text).strip().strip('"')
        if t not in MODES:
            raise ValueError(f"mode: one of {', '.join(MODES)}")
        if t == "he" and not HE_AVAILABLE:
            raise ValueError("mode he is unavailable: tenseal is not installed")
        return t
    if key in ("clip_norm", "learning_rate"):
        v = _finite(str(text), key)
        if v <= 0:
            raise ValueError(f"{key}: must be > 0")
        return v
    if key == "noise_multiplier":
        v = _finite(str(text), key)
        if v < 0:
            raise ValueError(f"{key}: must be >= 0")
        return v
    if key == "delta":
        v = _finite(str(text), key)
        if not 0 < v < 1:
            raise ValueError("delta: 0 < delta < 1")
        return v
    if key == "seed":
        t = str(text).strip().strip('"')
        if t in ("none", "null", ""):
            return None
        if not t.isdigit():
            raise ValueError("seed: a non-negative integer or none")
        return int(t)
    raise ValueError(f"unknown key {key!r}")


def parse_config(data: bytes | str, current: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Merge a config write into `current` (defaults if None): either a JSON object or
    lines `key = value` (also `key=value` or `key value`; `#` starts a comment).  Keys
    not named keep their value.  ValueError (-> EINVAL) if anything is wrong; then
    nothing changes."""
    cfg = dict(current if current is not None else CONFIG_DEFAULTS)
    text = data.decode() if isinstance(data, (bytes, bytearray)) else data
    stripped = text.strip()
    items: list[tuple[str, Any]] = []
    if stripped.startswith("{"):
        try:
            obj = json.loads(stripped)
        except ValueError as e:
            raise ValueError(f"bad JSON: {e}") from None
        if not isinstance(obj, dict):
            raise ValueError("config JSON must be an object")
        items = list(obj.items())
    else:
        for line in text.splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            m = re.match(r"^([A-Za-z_]+)\s*(?:=\s*|\s+)(.*)$", line)
            if not m:
                raise ValueError(f"bad line {line!r} (key = value)")
            items.append((m.group(1), m.group(2).strip()))
    for k, v in items:
        if k not in CONFIG_DEFAULTS:
            raise ValueError(f"unknown key {k!r}")
        cfg[k] = _parse_value(k, v)
    if cfg["min_clients"] > expected_count(cfg):
        raise ValueError("min_clients exceeds clients")
    return cfg


def format_config(cfg: dict[str, Any]) -> str:
    out = []
    for k in CONFIG_ORDER:
        v = cfg[k]
        if isinstance(v, list):
            v = ",".join(v)
        elif v is None:
            v = "none"
        elif k == "min_clients" and v == 0:
            v = "all"
        out.append(f"{k} = {v}")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- accounting


def epsilon_for(noise_multipliers: Sequence[float], delta: float) -> float:
    """epsilon after one Gaussian mechanism per round with these noise multipliers
    (sampling rate 1), by dp-accounting's RdpAccountant; 0 for no rounds, inf if any
    round had no noise."""
    if not noise_multipliers:
        return 0.0
    if any(z <= 0 for z in noise_multipliers):
        return math.inf
    if not ACCOUNTANT_AVAILABLE:
        return math.nan
    dp_event, rdp = accountant()
    acc = rdp.RdpAccountant()
    counts: dict[float, int] = {}
    for z in noise_multipliers:
        counts[z] = counts.get(z, 0) + 1
    for z, c in counts.items():
        acc.compose(dp_event.GaussianDpEvent(z), c)
    return float(acc.get_epsilon(delta))



def fmt_epsilon(x: float) -> str:
    if math.isinf(x):
        return "inf"
    if math.isnan(x):
        return "unavailable"
    return f"{x:.6g}"
