"""The prefetch engine: predict the slots a reader asks for next and bring
them from the SSD tier into memory before the demand read comes.

Modes (knob `prefetch_mode`):

- ``off``: nothing.
- ``sequential``: after slot N of a session is read, fetch the next
  `prefetch_stride` slots of that session, in the session's natural order
  (numeric suffixes: ``turn-2`` before ``turn-10``).  Where the session's
  stride detector (native/prefetch.c) has confirmed a stride s (the reader
  takes every s-th slot, or goes backwards), fetch N+s, N+2s, ... instead.
- ``random``: sample `prefetch_stride` slots, by heat, from the heat table of
  recently hot slots (any session) that memory does not hold.
- ``hybrid``: sequential or random, whichever is more accurate: both are
  evaluated in the shadow all the time (what each would have fetched, and
  whether a demand read came for it within a horizon); when the accuracy of
  the one in charge drops below `prefetch_retrain_below`, hybrid re-chooses.
- ``learned``: a small LSTM (torch; embedding 16, hidden 32) reads the last 8
  moves of the reader within a session (deltas of the slot's position,
  |delta| <= 16 as their own tokens, longer jumps as two "far" tokens) and
  predicts the next move; the engine rolls it out `prefetch_stride` steps
  while the predicted path's probability stays >= 0.25.  The weights are
  shared by every session, so a pattern learned in one session (read every
  3rd slot) applies to the next one from its first read, where a stride
  detector needs a few reads to confirm.  Trained online on recent history
  (one Adam step per 16 new moves, off the request path); retrained (40
  steps on the last 512 moves) when accuracy drops below the threshold.
  Without torch (and numpy) the mode is unavailable: setting it raises
  `ModeUnavailable`, a `KnobError`.

Accuracy = prefetched slots read by demand before they left memory /
prefetched slots.  Cumulative counts are `prefetch_issued`, `prefetch_used`
and `prefetch_accuracy` (also per mode: `prefetch_issued_sequential`, ...);
the retrain trigger looks at a window of the last `WINDOW` prefetches whose
fate is known (used, evicted or removed, or not used within `HORIZON` demand
reads).

Threads.  `on_access`, `on_evict` and `on_remove` are O(1) under a short
lock and never wait for I/O or the model: they record the event and wake a
background worker.  The worker keeps the per-session state, makes the
predictions and runs the fetches, one at a time, from a bounded queue; a
queued prefetch is dropped (`prefetch_dropped`) when the queue is full (the
oldest goes) or when the demand read for its slot came first (late).  The
learned model trains on a thread of its own (torch with one CPU thread).
With ``background=False`` there are no threads and `run_pending()` does the
worker's work in the caller (tests and the simulator).

Integration (what the store and the filesystem call):

    engine = PrefetchEngine(fetch, in_memory, session_slots, knobs)
    engine.on_access(key, hit)   # every demand open of an existing slot
    engine.on_evict(key)         # the memory tier let the slot go
    engine.on_remove(key)        # the slot is gone (unlink, rename away, reset, ring)
    engine.statistics()          # its record, PrefetchStats (stats / stats.json)
    engine.set_mode(name)        # the knob; ModeUnavailable for learned without torch
    engine.close()

`fetch(key) -> bool` brings the slot from the SSD into memory and says
whether it did (False: not on the SSD, already in memory, no room);
`in_memory(key) -> bool`; `session_slots(agent, session) -> list[str]` the
slot names the session has (any tier, any order); `knobs`: a mapping with
`prefetch_stride` and `prefetch_retrain_below`, read live.
"""

from __future__ import annotations

import collections
import functools
import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from memosfs.knobs import KnobError
from memosfs.stats import Record, counter, gauge
from memosfs.store.prefetch_learned import (_Learned, _Tok, learned_available,
                                            learned_unavailable_reason)

log = logging.getLogger("memosfs.store.prefetch")

__all__ = ["PrefetchEngine", "ModeUnavailable", "MODES", "learned_available",
           "natural_key", "DEFAULT_KNOBS"]

MODES = ("off", "sequential", "random", "hybrid", "learned")
ACTIVE_MODES = ("sequential", "random", "hybrid", "learned")
SUB_MODES = ("sequential", "random")          # what hybrid chooses between

DEFAULT_KNOBS = {"prefetch_mode": "off", "prefetch_stride": 2, "prefetch_retrain_below": 0.70}


@dataclass(frozen=True)
class PrefetchStats(Record):
    """The prefetcher (knob prefetch_mode).

    Accuracy = prefetched slots read by demand before they left memory /
    prefetched slots; per mode as well (`_sequential`, `_random`, `_hybrid`,
    `_learned`: the mode that issued the prefetch)."""
    prefetch_issued: int = counter("slots prefetched into memory")
    prefetch_used: int = counter("prefetched slots read by demand before they left memory")
    prefetch_accuracy: float = gauge("prefetch_used / prefetch_issued", 0.0)
    prefetch_retrains: int = counter("re-choices (hybrid) and retrainings (learned): low accuracy")
    prefetch_dropped: int = counter("queued prefetches dropped (late or queue full)")
    prefetch_dropped_late: int = counter("queued prefetches dropped: the demand read came first")
    prefetch_dropped_full: int = counter("queued prefetches dropped: the queue was full")
    prefetch_wasted: int = counter("prefetched slots that left memory unread")
    prefetch_failed: int = counter("prefetches that could not fetch (not on the SSD, no room)")
    prefetch_skipped: int = counter("prefetches skipped: the slot was in memory already")
    prefetch_events_dropped: int = counter("access events dropped: the worker fell behind")
    prefetch_window_accuracy: float = gauge("accuracy of the current mode over its last prefetches",
                                            0.0)
    prefetch_queue: int = gauge("prefetches queued now")
    prefetch_outstanding: int = gauge("prefetched slots in memory, not yet judged")
    prefetch_issued_sequential: int = counter("prefetch_issued by sequential")
    prefetch_used_sequential: int = counter("prefetch_used by sequential")
    prefetch_accuracy_sequential: float = gauge("prefetch_accuracy of sequential", 0.0)
    prefetch_issued_random: int = counter("prefetch_issued by random")
    prefetch_used_random: int = counter("prefetch_used by random")
    prefetch_accuracy_random: float = gauge("prefetch_accuracy of random", 0.0)
    prefetch_issued_hybrid: int = counter("prefetch_issued by hybrid")
    prefetch_used_hybrid: int = counter("prefetch_used by hybrid")
    prefetch_accuracy_hybrid: float = gauge("prefetch_accuracy of hybrid", 0.0)
    prefetch_issued_learned: int = counter("prefetch_issued by learned")
    prefetch_used_learned: int = counter("prefetch_used by learned")
    prefetch_accuracy_learned: float = gauge("prefetch_accuracy of learned", 0.0)
    prefetch_retrains_hybrid: int = counter("hybrid's re-choices on low accuracy")
    prefetch_retrains_learned: int = counter("learned's retrainings on low accuracy")
    prefetch_hybrid_random: int = gauge("1 while hybrid follows random, 0 while sequential")
    prefetch_hybrid_switches: int = counter("times hybrid changed the sub-mode it follows")
    prefetch_shadow_accuracy_sequential: float = gauge(
        "hybrid: sequential's accuracy in the shadow (recent window)", 0.0)
    prefetch_shadow_accuracy_random: float = gauge(
        "hybrid: random's accuracy in the shadow (recent window)", 0.0)
    prefetch_learned_steps: int = counter("training steps of the learned model")
    prefetch_learned_loss: float = gauge("the learned model's last training loss", 0.0)


QUEUE_MAX = 64          # queued prefetches; beyond, the oldest is dropped
EVENTS_MAX = 4096       # demand reads waiting for the worker; beyond, the oldest are dropped
WINDOW = 100            # prefetch outcomes in the accuracy window
WINDOW_MIN = 50         # outcomes needed before the window can trigger a retrain
HORIZON = 512           # demand reads after which an unused prefetch counts as a miss (window)
SESSIONS_MAX = 4096     # sessions whose slot order the worker keeps
SMALL_SESSION = 64      # a session of at most this many listed slots is dropped when it empties
OUTSTANDING_MAX = 1 << 16
REFRESH_EVERY = 8       # events of a session between re-listings for a prefetch past the end
HYBRID_REVIEW = 256     # events between hybrid's periodic look at the shadow accuracies
HYBRID_MARGIN = 0.10    # ... where it switches if the other is better by this much

_log_errors_at = 0.0


def _log_error(fmt: str, *args: object) -> None:
    """Errors from the callbacks repeat: say so once a minute, the rest at DEBUG."""
    global _log_errors_at
    now = time.monotonic()
    if now - _log_errors_at >= 60:
        _log_errors_at = now
        log.error(fmt, *args, exc_info=True)
    else:
        log.debug(fmt, *args)


class ModeUnavailable(KnobError):
    """A prefetch mode that this installation cannot run (learned without torch)."""


_NUM_RE = re.compile(r"(\d+)")


@functools.lru_cache(maxsize=1 << 16)
def natural_key(name: str) -> tuple:
    """Sort key: text parts as text, digit runs as numbers (`turn-2` < `turn-10`,
    `block-9` < `block-12`, `2` < `10`), the name itself last to break ties."""
    parts: list[Any] = _NUM_RE.split(name)
    for i in range(1, len(parts), 2):
        parts[i] = int(parts[i])
    parts.append(name)
    return tuple(parts)


def _split(key: bytes) -> tuple[str, str, str]:
    agent, session, name = key.decode("utf-8", "surrogateescape").split("/", 2)
    return agent, session, name


def _key(agent: str, session: str, name: str) -> bytes:
    return f"{agent}/{session}/{name}".encode("utf-8", "surrogateescape")


# ---------------------------------------------------------------- state

class _Session:
    """The worker's view of one session: its slots in natural order."""
    __slots__ = ("sid", "agent", "session", "names", "rank", "last_rank", "hist",
                 "listed_at", "stale")

    def __init__(self, sid: int, agent: str, session: str) -> None:
        self.sid = sid
        self.agent = agent
        self.session = session
        self.names: list[str] = []
        self.rank: dict[str, int] = {}
        self.last_rank: Optional[int] = None
        self.hist: collections.deque[int] = collections.deque(maxlen=_Tok.CTX)
        self.listed_at = -(1 << 62)
        self.stale = True


@dataclass
class _Item:
    key: bytes
    mode: str           # the mode that asked (the engine's mode: hybrid, not its choice)
    seq: int            # demand-read clock when predicted
    late: bool = False  # a demand read for key came first


@dataclass
class _Out:
    mode: str
    seq: int            # demand-read clock when fetched
    judged: bool = False  # already counted in the window (as a miss, by age)


class _Counters:
    def __init__(self) -> None:
        self.c: collections.Counter[str] = collections.Counter()

    def add(self, name: str, mode: Optional[str] = None, n: int = 1) -> None:
        self.c[name] += n
        if mode is not None:
            self.c[f"{name}_{mode}"] += n


class _Judging:
    """How well the modes do: the shadow record of what each sub-mode would
    have fetched, hybrid's choice between them, and the accuracy window
    that triggers a retrain.  A part of PrefetchEngine (its state is the
    engine's; worker thread only)."""

    def _shadow_record(self, m: str, targets: list[bytes], seq: int) -> None:
        sh = self._shadow[m]
        for t in targets:
            if t not in sh:
                sh[t] = seq
                self._shadow_log[m].append((seq, t))

    def _hybrid_review(self, seq: int) -> None:
        if seq - self._hybrid_reviewed < HYBRID_REVIEW:
            return
        self._hybrid_reviewed = seq
        other = "random" if self.hybrid_choice == "sequential" else "sequential"
        a, b = self._shadow_acc(self.hybrid_choice), self._shadow_acc(other)
        if a is not None and b is not None and b > a + HYBRID_MARGIN:
            self.hybrid_choice = other
            self._cnt.add("prefetch_hybrid_switches")

    def _shadow_acc(self, m: str) -> Optional[float]:
        w = self._shadow_win[m]
        return sum(w) / len(w) if len(w) >= self.window_min else None

    def _rechoose(self) -> None:
        best, best_acc = self.hybrid_choice, self._shadow_acc(self.hybrid_choice)
        for m in SUB_MODES:
            acc = self._shadow_acc(m)
            if acc is not None and (best_acc is None or acc > best_acc):
                best, best_acc = m, acc
        if best != self.hybrid_choice:
            self.hybrid_choice = best
            self._cnt.add("prefetch_hybrid_switches")

    # -- accuracy --

    def _judge_old(self) -> None:
        """Prefetches not used within `horizon` demand reads count as misses
        in the window (they may still be used later: the cumulative counts
        take that)."""
        with self._lock:
            now = self._seq
            log_ = self._issue_log
            while log_ and log_[0][0] <= now - self.horizon:
                _s, key = log_.popleft()
                out = self._outstanding.get(key)
                if out is not None and not out.judged and out.seq <= now - self.horizon:
                    out.judged = True
                    self._win[out.mode].append(False)
        for m in SUB_MODES:
            sh, lg = self._shadow[m], self._shadow_log[m]
            while lg and lg[0][0] <= now - self.horizon:
                s, key = lg.popleft()
                if sh.get(key) == s:
                    del sh[key]
                    self._shadow_win[m].append(False)

    def _check_accuracy(self) -> None:
        mode = self.mode
        if mode not in ("hybrid", "learned"):
            return
        with self._lock:
            w = self._win[mode]
            if len(w) < self.window_min or sum(w) / len(w) >= self.retrain_below:
                return
            w.clear()
            self._cnt.add("prefetch_retrains", mode)
        if mode == "learned":
            self._retrain_due = True
            log.info("prefetch: learned accuracy below %.2f: retraining", self.retrain_below)
        else:
            self._rechoose()
            log.info("prefetch: hybrid accuracy below %.2f: now %s", self.retrain_below,
                     self.hybrid_choice)

    # -- the queue and the fetches --


class PrefetchEngine(_Judging):
    """See the module docstring."""

    def __init__(self, fetch: Callable[[bytes], bool], in_memory: Callable[[bytes], bool],
                 session_slots: Callable[[str, str], list[str]],
                 knobs: Optional[Mapping[str, Any]] = None, *, background: bool = True,
                 queue_max: int = QUEUE_MAX, window: int = WINDOW,
                 window_min: int = WINDOW_MIN, horizon: int = HORIZON, seed: int = 0,
                 heat_capacity: int = 4096, heat_halflife: float = 1024.0,
                 confirm: int = 2) -> None:
        from memosfs import _native
        self._fetch = fetch
        self._in_memory = in_memory
        self._session_slots = session_slots
        self.knobs: Mapping[str, Any] = knobs if knobs is not None else dict(DEFAULT_KNOBS)
        self.background = background
        self.queue_max = max(1, queue_max)
        self.window = max(1, window)
        self.window_min = max(1, min(window_min, self.window))
        self.horizon = max(1, horizon)
        self.seed = seed
        self.native = _native.Prefetcher(sessions=SESSIONS_MAX, heat_capacity=heat_capacity,
                                         confirm=confirm, halflife=heat_halflife,
                                         seed=(seed * 2654435761 + 1) & ((1 << 64) - 1) or 1)
        self._key_id = _native.Prefetcher.key_id
        self.mode = "off"
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        # -- shared with the request path (under _lock) --
        self._seq = 0                                      # demand reads seen
        self._events: collections.deque = collections.deque()
        self._queue: collections.deque[_Item] = collections.deque()
        self._queued: dict[bytes, _Item] = {}
        self._outstanding: collections.OrderedDict[bytes, _Out] = collections.OrderedDict()
        self._inflight: Optional[bytes] = None
        self._inflight_demanded = False
        self._win: dict[str, collections.deque[bool]] = {
            m: collections.deque(maxlen=self.window) for m in ACTIVE_MODES}
        self._cnt = _Counters()
        # -- the worker's own --
        self._sessions: collections.OrderedDict[bytes, _Session] = collections.OrderedDict()
        self._heat_keys: dict[int, bytes] = {}
        self._issue_log: collections.deque[tuple[int, bytes]] = collections.deque()
        self._shadow: dict[str, dict[bytes, int]] = {m: {} for m in SUB_MODES}
        self._shadow_log: dict[str, collections.deque] = {m: collections.deque()
                                                          for m in SUB_MODES}
        self._shadow_win: dict[str, collections.deque[bool]] = {
            m: collections.deque(maxlen=self.window) for m in SUB_MODES}
        self.hybrid_choice = "sequential"
        self._hybrid_reviewed = 0
        self._learned: Optional[_Learned] = None
        self._train_due = 0
        self._retrain_due = False
        # -- threads --
        self._stop = False
        self._threads: list[threading.Thread] = []
        self._train_wake = threading.Event()
        mode = str(self.knobs.get("prefetch_mode", "off"))
        if mode != "off":
            self.set_mode(mode)         # ModeUnavailable before any thread starts
        if background:
            t = threading.Thread(target=self._worker_loop, name="memosfs-prefetch", daemon=True)
            t.start()
            self._threads.append(t)

    # ---- knobs ----

    @property
    def depth(self) -> int:
        return max(0, int(self.knobs.get("prefetch_stride", DEFAULT_KNOBS["prefetch_stride"])))

    @property
    def retrain_below(self) -> float:
        return float(self.knobs.get("prefetch_retrain_below",
                                    DEFAULT_KNOBS["prefetch_retrain_below"]))

    def set_mode(self, name: str) -> None:
        """Switch modes.  Unknown: KnobError; learned without torch:
        ModeUnavailable (nothing changes).  Queued prefetches are dropped; the
        first switch to learned imports torch (a second or two)."""
        if name not in MODES:
            raise KnobError(f"{name!r} is not one of {', '.join(MODES)}")
        if name == "learned":
            if not learned_available():
                raise ModeUnavailable(
                    "prefetch_mode learned needs torch and numpy (make model-deps, or "
                    f"pip install 'memosfs[model]'): {learned_unavailable_reason()}")
            if self._learned is None:
                self._learned = _Learned(self.seed)
                if self.background:
                    t = threading.Thread(target=self._trainer_loop,
                                         name="memosfs-prefetch-train", daemon=True)
                    t.start()
                    self._threads.append(t)
        with self._lock:
            if name == self.mode:
                return
            self.mode = name
            for it in self._queue:
                it.late = True
            self._queue.clear()
            self._queued.clear()
            if name in self._win:
                self._win[name].clear()
            self._wake.notify_all()
        log.info("prefetch mode %s", name)

    # ---- the hooks (request path: O(1), no I/O) ----

    def on_access(self, key: bytes, hit: bool) -> None:
        """A demand open of an existing slot; hit: memory served it."""
        with self._lock:
            self._seq += 1
            out = self._outstanding.pop(key, None)
            if out is not None:
                if hit:
                    self._cnt.add("prefetch_used", out.mode)
                    if not out.judged:
                        self._win[out.mode].append(True)
                elif not out.judged:
                    self._win[out.mode].append(False)
            it = self._queued.pop(key, None)
            if it is not None:
                it.late = True
                self._cnt.add("prefetch_dropped")
                self._cnt.add("prefetch_dropped_late")
            if key == self._inflight:
                self._inflight_demanded = True
            if self.mode != "off":
                self._push("access", key)

    def _push(self, kind: str, key: bytes) -> None:
        """Record an event for the worker (under _lock)."""
        if len(self._events) >= EVENTS_MAX:
            self._events.popleft()
            self._cnt.add("prefetch_events_dropped")
        self._events.append((kind, key, self._seq))
        self._wake.notify()

    def on_evict(self, key: bytes) -> None:
        """The memory tier let the slot go (it may stay on the SSD)."""
        with self._lock:
            out = self._outstanding.pop(key, None)
            if out is not None:
                self._cnt.add("prefetch_wasted", out.mode)
                if not out.judged:
                    self._win[out.mode].append(False)

    def on_remove(self, key: bytes) -> None:
        """The slot is gone from every tier (or renamed away)."""
        self.on_evict(key)
        with self._lock:
            it = self._queued.pop(key, None)
            if it is not None:
                it.late = True
            if self.mode != "off":
                self._push("remove", key)

    # ---- stats ----

    def statistics(self) -> PrefetchStats:
        with self._lock:
            c = dict(self._cnt.c)
            qlen = len(self._queue)
            wins = {m: (sum(w) / len(w) if w else 0.0) for m, w in self._win.items()}
            mode = self.mode
            outstanding = len(self._outstanding)
            shadow = {m: tuple(self._shadow_win[m]) for m in SUB_MODES}
        out: dict[str, Any] = {}
        for name in ("prefetch_issued", "prefetch_used", "prefetch_retrains",
                     "prefetch_dropped", "prefetch_dropped_late", "prefetch_dropped_full",
                     "prefetch_wasted", "prefetch_failed", "prefetch_skipped",
                     "prefetch_events_dropped", "prefetch_retrains_hybrid",
                     "prefetch_retrains_learned", "prefetch_hybrid_switches"):
            out[name] = c.get(name, 0)
        out["prefetch_accuracy"] = (out["prefetch_used"] / out["prefetch_issued"]
                                    if out["prefetch_issued"] else 0.0)
        out["prefetch_window_accuracy"] = wins.get(mode, 0.0)
        out["prefetch_queue"] = qlen
        out["prefetch_outstanding"] = outstanding
        for m in ACTIVE_MODES:
            issued, used = c.get(f"prefetch_issued_{m}", 0), c.get(f"prefetch_used_{m}", 0)
            out[f"prefetch_issued_{m}"] = issued
            out[f"prefetch_used_{m}"] = used
            out[f"prefetch_accuracy_{m}"] = used / issued if issued else 0.0
        out["prefetch_hybrid_random"] = int(self.hybrid_choice == "random")
        for m, w in shadow.items():
            out[f"prefetch_shadow_accuracy_{m}"] = sum(w) / len(w) if w else 0.0
        lrn = self._learned
        out["prefetch_learned_steps"] = lrn.steps if lrn else 0
        out["prefetch_learned_loss"] = round(lrn.loss, 4) if lrn else 0.0
        return PrefetchStats(**out)

    stats = statistics          # the older name (tests, the simulator)

    # ---- the worker ----

    def run_pending(self, fetch_budget: Optional[int] = None) -> int:
        """Without background threads: process every recorded event, train
        if due, then run up to `fetch_budget` queued fetches (None: all).
        Returns the fetches run."""
        if self.background:
            raise RuntimeError("run_pending is for engines made with background=False")
        self._process_events()
        if self._learned is not None and (self._train_due or self._retrain_due):
            self._train_now()
        done = 0
        while fetch_budget is None or done < fetch_budget:
            if not self._fetch_one():
                break
            done += 1
        return done

    def close(self) -> None:
        with self._lock:
            self._stop = True
            self._wake.notify_all()
        self._train_wake.set()
        for t in self._threads:
            t.join(timeout=10)
        self._threads.clear()

    def _worker_loop(self) -> None:
        while True:
            with self._lock:
                while not self._stop and not self._events and not self._queue:
                    self._wake.wait(timeout=1.0)
                if self._stop:
                    return
            try:
                self._process_events()
                if self._train_due or self._retrain_due:
                    self._train_wake.set()
                self._fetch_one()
            except Exception:
                _log_error("prefetch worker")
                time.sleep(0.01)
            time.sleep(0)           # let a request thread have the GIL

    def _trainer_loop(self) -> None:
        while not self._stop:
            self._train_wake.wait(timeout=1.0)
            self._train_wake.clear()
            if self._stop:
                return
            try:
                self._train_now()
            except Exception:
                _log_error("prefetch trainer")

    def _train_now(self) -> None:
        lrn = self._learned
        if lrn is None:
            return
        if self._retrain_due:
            self._retrain_due = False
            self._train_due = 0
            lrn.train(lrn.RETRAIN_STEPS, lrn.RETRAIN_RECENT)
        steps, self._train_due = self._train_due, 0
        if steps:
            lrn.train(steps, lrn.RECENT)

    def _process_events(self) -> None:
        n = 0
        while True:
            with self._lock:
                if not self._events or self._stop:
                    break
                kind, key, seq = self._events.popleft()
                mode = self.mode
            if kind == "access":
                self._access(key, seq, mode)
            else:
                self._removed(key)
            n += 1
            if self.background and n % 16 == 0:
                time.sleep(0)
        if n:
            self._judge_old()
            self._check_accuracy()

    def _session(self, key: bytes) -> Optional[tuple[_Session, str]]:
        try:
            agent, session, name = _split(key)
        except ValueError:
            return None
        path = key.rsplit(b"/", 1)[0]
        # one stride detector per directory: below a session, "session" is
        # the directory's path from the agent on (session/d1/d2)
        agent, _, session = path.decode("utf-8", "surrogateescape").partition("/")
        name = key.rsplit(b"/", 1)[1].decode("utf-8", "surrogateescape")
        s = self._sessions.get(path)
        if s is None:
            s = _Session(self._key_id(path), agent, session)
            self._sessions[path] = s
            if len(self._sessions) > SESSIONS_MAX:
                _p, old = self._sessions.popitem(last=False)
                self.native.stride_forget(old.sid)
        else:
            self._sessions.move_to_end(path)
        return s, name

    def _relist(self, s: _Session, seq: int) -> None:
        try:
            names = list(self._session_slots(s.agent, s.session))
        except Exception:
            _log_error("prefetch: listing %s/%s failed", s.agent, s.session)
            names = []
        names.sort(key=natural_key)
        s.names = names
        s.rank = {n: i for i, n in enumerate(names)}
        s.listed_at = seq
        s.stale = False

    def _access(self, key: bytes, seq: int, mode: str) -> None:
        found = self._session(key)
        if found is None:
            return
        s, name = found
        if s.stale or name not in s.rank:
            self._relist(s, seq)
        rank = s.rank.get(name)
        # heat: every slot read, any session
        kid = self._key_id(key)
        self._heat_keys[kid] = key
        ev = self.native.heat_touch(kid, 1.0)
        if ev is not None:
            self._heat_keys.pop(ev, None)
        # shadow outcomes (hybrid)
        if mode == "hybrid":
            for m in SUB_MODES:
                if self._shadow[m].pop(key, None) is not None:
                    self._shadow_win[m].append(True)
        if rank is None:
            return
        stride = self.native.stride_observe(s.sid, rank)
        # the learned model's history: moves within the session
        if s.last_rank is None:
            s.hist.clear()
            s.hist.extend([_Tok.START] * _Tok.CTX)
        elif rank != s.last_rank:
            tok = _Tok.of(rank - s.last_rank)
            if self._learned is not None:
                self._train_due += self._learned.add(tuple(s.hist), tok)
            s.hist.append(tok)
        s.last_rank = rank
        depth = self.depth
        if mode == "off" or depth == 0:
            return
        if mode == "sequential":
            targets = self._sequential(s, rank, stride, depth, seq)
        elif mode == "random":
            targets = self._random(key, depth)
        elif mode == "learned":
            targets = self._predict_learned(s, rank, depth, seq)
        else:
            seq_t = self._sequential(s, rank, stride, depth, seq)
            rnd_t = self._random(key, depth)
            self._shadow_record("sequential", seq_t, seq)
            self._shadow_record("random", rnd_t, seq)
            targets = seq_t if self.hybrid_choice == "sequential" else rnd_t
            self._hybrid_review(seq)
        for t in targets:
            self._enqueue(t, mode, seq)

    def _removed(self, key: bytes) -> None:
        path = key.rsplit(b"/", 1)[0]
        s = self._sessions.get(path)
        if s is not None:
            s.stale = True
            # a small directory whose last slot went (made, used and removed:
            # a scratch folder) leaves the table at once rather than when
            # SESSIONS_MAX newer ones push it out; a big one is not listed on
            # every removal (it goes by the LRU if it empties)
            if len(s.names) <= SMALL_SESSION:
                try:
                    left = self._session_slots(s.agent, s.session)
                except Exception:
                    left = [None]
                if not left:
                    del self._sessions[path]
                    self.native.stride_forget(s.sid)
        kid = self._key_id(key)
        if self._heat_keys.pop(kid, None) is not None:
            self.native.heat_remove(kid)
        for m in SUB_MODES:
            self._shadow[m].pop(key, None)

    def _name_at(self, s: _Session, r: int, seq: int) -> Optional[str]:
        if r < 0:
            return None
        if r >= len(s.names) and seq - s.listed_at >= REFRESH_EVERY:
            self._relist(s, seq)          # slots published since the last listing
        return s.names[r] if r < len(s.names) else None

    def _sequential(self, s: _Session, rank: int, stride: int, depth: int,
                    seq: int) -> list[bytes]:
        step = stride if stride else 1
        out = []
        for j in range(1, depth + 1):
            name = self._name_at(s, rank + step * j, seq)
            if name is None:
                break
            out.append(_key(s.agent, s.session, name))
        return self._resident_filter(out)

    def _random(self, key: bytes, depth: int) -> list[bytes]:
        out = []
        for kid in self.native.heat_sample(4 * depth, pool=64):
            k = self._heat_keys.get(kid)
            if k is None or k == key:
                continue
            out.append(k)
        return self._resident_filter(out)[:depth]

    def _predict_learned(self, s: _Session, rank: int, depth: int, seq: int) -> list[bytes]:
        lrn = self._learned
        if lrn is None:
            return []
        out = []
        for d in lrn.predict(tuple(s.hist), depth):
            name = self._name_at(s, rank + d, seq)
            if name is not None:
                out.append(_key(s.agent, s.session, name))
        return self._resident_filter(out)

    def _resident_filter(self, keys: list[bytes]) -> list[bytes]:
        out = []
        for k in keys:
            try:
                if self._in_memory(k):
                    continue
            except Exception:
                _log_error("prefetch: in_memory failed")
                continue
            out.append(k)
        return out

    # -- hybrid --

    def _enqueue(self, key: bytes, mode: str, seq: int) -> None:
        with self._lock:
            if key in self._queued or key in self._outstanding or key == self._inflight:
                return
            if len(self._queue) >= self.queue_max:
                old = self._queue.popleft()
                if not old.late:
                    self._queued.pop(old.key, None)
                    self._cnt.add("prefetch_dropped")
                    self._cnt.add("prefetch_dropped_full")
            it = _Item(key, mode, seq)
            self._queue.append(it)
            self._queued[key] = it

    def _fetch_one(self) -> bool:
        """Run the oldest queued prefetch; False if the queue was empty."""
        with self._lock:
            while self._queue:
                it = self._queue.popleft()
                if it.late:
                    continue
                self._queued.pop(it.key, None)
                break
            else:
                return False
            self._inflight = it.key
            self._inflight_demanded = False
        ok = resident = False
        try:
            resident = bool(self._in_memory(it.key))
            ok = not resident and bool(self._fetch(it.key))
        except Exception:
            _log_error("prefetch of %r failed", it.key)
        with self._lock:
            self._inflight = None
            if resident:
                self._cnt.add("prefetch_skipped")
            elif self._inflight_demanded:
                self._cnt.add("prefetch_dropped")
                self._cnt.add("prefetch_dropped_late")
            elif ok:
                self._cnt.add("prefetch_issued", it.mode)
                self._outstanding[it.key] = _Out(it.mode, self._seq)
                self._issue_log.append((self._seq, it.key))
                if len(self._outstanding) > OUTSTANDING_MAX:
                    _k, old = self._outstanding.popitem(last=False)
                    if not old.judged:
                        self._win[old.mode].append(False)
            else:
                self._cnt.add("prefetch_failed")
        return True
