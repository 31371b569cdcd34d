"""The learned prefetch mode's model: a small LSTM over a session's moves.

Owns the move tokens (`_Tok`), the model with its training buffer and the
numpy copy of its weights used for inference (`_Learned`), and the check
whether torch is there at all (`learned_available`).  torch is imported
lazily, only when the mode is chosen.  Imports nothing of the package; used
by memosfs/store/prefetch.py (see its docstring for the mode).
"""

from __future__ import annotations

import collections
import importlib
import logging
import random
import threading
from typing import Optional

log = logging.getLogger("memosfs.store.prefetch")

_learned_ok: Optional[bool] = None
_learned_why = ""


def learned_available() -> bool:
    """True if the learned mode can run: torch and numpy import.  The first
    call imports torch (a second or two); the answer is cached."""
    global _learned_ok, _learned_why
    if _learned_ok is None:
        try:
            importlib.import_module("numpy")
            importlib.import_module("torch")
            _learned_ok = True
        except Exception as e:          # ImportError, or a broken install
            _learned_ok = False
            _learned_why = f"{type(e).__name__}: {e}"
    return _learned_ok


def learned_unavailable_reason() -> str:
    learned_available()
    return _learned_why




class _Tok:
    """Moves within a session as tokens: delta -16..-1 -> 0..15, +1..+16 ->
    16..31, a far jump forward 32, backward 33, the session's start 34."""
    V = 16
    FAR_FWD = 2 * V
    FAR_BACK = 2 * V + 1
    START = 2 * V + 2
    N = 2 * V + 3
    CTX = 8

    @classmethod
    def of(cls, delta: int) -> int:
        if delta > cls.V:
            return cls.FAR_FWD
        if delta < -cls.V:
            return cls.FAR_BACK
        return delta + cls.V if delta < 0 else delta + cls.V - 1

    @classmethod
    def delta(cls, tok: int) -> Optional[int]:
        if tok < cls.V:
            return tok - cls.V
        if tok < 2 * cls.V:
            return tok - cls.V + 1
        return None


class _Learned:
    """The LSTM, its training buffer and a numpy copy of its weights for
    inference (a forward pass of 8 steps in numpy costs ~0.1 ms, in torch
    ~0.4 ms: at these sizes the per-op overhead is all there is)."""

    EMB, HIDDEN = 16, 32
    BATCH = 64
    LR = 0.01
    TRAIN_EVERY = 32        # new samples per online step
    PUBLISH_EVERY = 4       # online steps between fresh weights for inference
    RECENT = 1024           # online steps draw from the last RECENT samples
    RETRAIN_STEPS = 40
    RETRAIN_RECENT = 512
    WARMUP = 64             # samples before the first training (20 steps)
    P_MIN = 0.25            # a rolled-out path stops below this probability

    def __init__(self, seed: int = 0) -> None:
        import numpy as np
        import torch
        self.np = np
        self.torch = torch
        torch.set_num_threads(1)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model = _make_lstm(torch, _Tok.N, self.EMB, self.HIDDEN)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=self.LR)
        self.rng = random.Random(seed)
        self.samples: collections.deque[tuple[tuple[int, ...], int]] = \
            collections.deque(maxlen=4096)
        self.lock = threading.Lock()        # samples
        self.train_lock = threading.Lock()  # model + optimizer
        self.new_samples = 0
        self.steps = 0
        self.loss = 0.0
        self.weights: Optional[tuple] = None   # numpy snapshot, swapped whole
        self.cache: dict[tuple, list[int]] = {}  # (context, depth) -> prediction ...
        self.cache_for: Optional[tuple] = None   # ... by these weights
        self.trained_once = False
        self.warm_asked = False

    # -- data --

    def add(self, ctx: tuple[int, ...], target: int) -> int:
        """Record one move; returns the training steps now due (0 or more)."""
        with self.lock:
            self.samples.append((ctx, target))
            self.new_samples += 1
            n = len(self.samples)
        if not self.trained_once:
            if n >= self.WARMUP and not self.warm_asked:
                self.warm_asked = True
                return 20
            return 0
        if self.new_samples >= self.TRAIN_EVERY:
            self.new_samples = 0
            return 1
        return 0

    # -- training (any thread but the request path) --

    def train(self, steps: int, recent: int) -> float:
        torch = self.torch
        with self.lock:
            pool = list(self.samples)[-recent:]
        if not pool:
            return self.loss
        with self.train_lock:
            self.model.train()
            loss_v = 0.0
            for _ in range(steps):
                batch = [pool[self.rng.randrange(len(pool))] for _ in range(self.BATCH)]
                x = torch.tensor([b[0] for b in batch], dtype=torch.long)
                y = torch.tensor([b[1] for b in batch], dtype=torch.long)
                self.opt.zero_grad()
                logits = self.model(x)
                loss = torch.nn.functional.cross_entropy(logits, y)
                loss.backward()
                self.opt.step()
                loss_v = float(loss.detach())
                self.steps += 1
            self.loss = loss_v
            if steps > 1 or not self.trained_once or self.steps % self.PUBLISH_EVERY == 0:
                self.weights = self._snapshot()
            self.trained_once = True
        return loss_v

    def _snapshot(self) -> tuple:
        m = self.model
        with self.torch.no_grad():
            emb = m.emb.weight.detach().numpy().astype("float64")
            w_ih = m.lstm.weight_ih_l0.detach().numpy().astype("float64")
            w_hh = m.lstm.weight_hh_l0.detach().numpy().astype("float64")
            b = (m.lstm.bias_ih_l0 + m.lstm.bias_hh_l0).detach().numpy().astype("float64")
            w_o = m.out.weight.detach().numpy().astype("float64")
            b_o = m.out.bias.detach().numpy().astype("float64")
        table = emb @ w_ih.T + b          # the input projection of every token, [N, 4H]
        return (table, w_hh.copy(), w_o.copy(), b_o.copy())

    # -- inference (the worker) --

    def predict(self, ctx: tuple[int, ...], depth: int) -> list[int]:
        """Cumulative deltas of the predicted next `depth` moves (fewer where
        the path's probability falls below P_MIN or a far jump is next)."""
        w = self.weights
        if w is None or depth <= 0:
            return []
        ck = (ctx, depth)
        cache = self.cache
        if self.cache_for is not w or len(cache) > 8192:   # new weights: forget old answers
            cache.clear()
            self.cache_for = w
        hit = cache.get(ck)
        if hit is not None:
            return hit
        np = self.np
        table, w_hh, w_o, b_o = w
        H = self.HIDDEN
        h = np.zeros(H)
        c = np.zeros(H)
        exp, tanh = np.exp, np.tanh

        def step(tok: int, h, c):
            g = table[tok] + w_hh @ h
            s = 1.0 / (1.0 + exp(-g))           # gates i, f, (g), o: PyTorch's order
            c = s[H:2 * H] * c + s[:H] * tanh(g[2 * H:3 * H])
            return s[3 * H:] * tanh(c), c

        for tok in ctx:
            h, c = step(tok, h, c)
        out: list[int] = []
        total, p_path = 0, 1.0
        for _ in range(depth):
            z = w_o @ h + b_o
            z = np.exp(z - z.max())
            probs = z / z.sum()
            tok = int(probs.argmax())
            p_path *= float(probs[tok])
            d = _Tok.delta(tok)
            if d is None or p_path < self.P_MIN:
                break
            total += d
            out.append(total)
            h, c = step(tok, h, c)
        cache[ck] = out
        return out


def _make_lstm(torch, n_tokens: int, emb: int, hidden: int):
    nn = torch.nn

    class NextMove(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(n_tokens, emb)
            self.lstm = nn.LSTM(emb, hidden, batch_first=True)
            self.out = nn.Linear(hidden, n_tokens)

        def forward(self, x):
            y, _ = self.lstm(self.emb(x))
            return self.out(y[:, -1])

    return NextMove()


# ---------------------------------------------------------------- the engine

