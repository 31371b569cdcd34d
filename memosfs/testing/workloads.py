"""Seeded synthetic key streams for the eviction-policy robustness suite
(`memosfs bench policy --suite`) and tests/test_policy.py.

Each generator returns a list of int block ids in access order (every id is a
lookup; a miss is followed by an insert), is deterministic for a given seed
(random.Random, no global state), and is sized to 100k-200k accesses so the
whole suite replays in a few minutes.  Ids are not dense; the bench renumbers
them.  Cache sizes in the suite are fractions of the unique ids of each
stream, as for the Mooncake trace.

FAMILIES maps each family name to its generator and keyword arguments; one
family may have several members (zipf at three skews).

May call: the standard library only.
"""

from __future__ import annotations

import heapq
import itertools
import random

# Suite sizes, fractions of the unique blocks (same as memosfs.bench.policy.SIZES).
SIZES = (0.005, 0.027, 0.055, 0.11, 0.27)


def _zipf_cum(n: int, alpha: float) -> list[float]:
    """Cumulative weights of ranks 1..n under Zipf(alpha)."""
    return list(itertools.accumulate((r + 1) ** -alpha for r in range(n)))


class _Ids:
    """Fresh ids from a counter (one-time blocks, new chains)."""

    def __init__(self, start: int = 1) -> None:
        self.next = start

    def take(self, n: int = 1) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def prefix_suffix(n: int = 160_000, prompts: int = 300, families: int = 24,
                  alpha: float = 1.0, suffix_mean: float = 10.0, seed: int = 11) -> list[int]:
    """Shared system-prompt prefixes with long unique suffixes.

    Every request reads a chain of blocks in order, as in the Mooncake trace:
    a root block shared by all requests, then a family prefix (one of
    `families`, 2-6 blocks), then the prompt's own part (1-10 blocks): the
    system prompt, picked among `prompts` by Zipf(`alpha`) popularity, so
    prompts of one family share their first blocks (a prefix tree).  Then a
    unique suffix (the user's turn), geometric with mean `suffix_mean` blocks,
    never read again: most blocks are one-hit wonders, and the reusable ones
    are the prefixes, whose value is their frequency.
    """
    rnd = random.Random(seed)
    ids = _Ids(1)
    fam = [ids.take(rnd.randint(2, 6)) for _ in range(families)]
    chains = [[0] + fam[rnd.randrange(families)] + ids.take(rnd.randint(1, 10))
              for _ in range(prompts)]
    order = list(range(prompts))
    rnd.shuffle(order)           # popularity unrelated to creation order
    cum = _zipf_cum(prompts, alpha)
    p_stop = 1.0 / suffix_mean
    out: list[int] = []
    while len(out) < n:
        out += chains[order[rnd.choices(range(prompts), cum_weights=cum)[0]]]
        k = 1
        while rnd.random() > p_stop:
            k += 1
        out += ids.take(k)
    return out[:n]


def sessions(n: int = 160_000, prompts: int = 60, gap_mean: float = 400.0,
             turns_mean: float = 4.0, new_per_turn: int = 4, seed: int = 12) -> list[int]:
    """Multi-turn chat sessions that come back after a gap.

    A session starts with one of `prompts` system prompts (Zipf 1.0, 3-12
    blocks).  Each turn re-reads the session's whole chain (prompt plus every
    earlier turn's blocks, in order) and appends 1..`new_per_turn` new blocks
    (the new exchange).  After a turn the session returns after a gap drawn
    from an exponential distribution with mean `gap_mean` requests (other
    sessions run meanwhile; a quarter of the gaps are 8x longer, the user who
    comes back after minutes); it ends after a geometric number of turns (mean
    `turns_mean`).  Reuse is by recency at a distance: a chain is worth
    keeping only if the cache holds it until the session returns.
    """
    rnd = random.Random(seed)
    ids = _Ids(1)
    cum = _zipf_cum(prompts, 1.0)
    plist = [ids.take(rnd.randint(3, 12)) for _ in range(prompts)]
    due: list[tuple[int, int]] = []          # (request index, session)
    chains: dict[int, list[int]] = {}
    sid = itertools.count()
    out: list[int] = []
    req = 0
    while len(out) < n:
        if due and due[0][0] <= req:
            _, s = heapq.heappop(due)
        else:
            s = next(sid)
            chains[s] = list(plist[rnd.choices(range(prompts), cum_weights=cum)[0]])
        chain = chains[s]
        out += chain
        new = ids.take(rnd.randint(1, new_per_turn))
        out += new
        chain += new
        if rnd.random() < 1.0 - 1.0 / turns_mean:
            gap = rnd.expovariate(1.0 / gap_mean) * (8.0 if rnd.random() < 0.25 else 1.0)
            heapq.heappush(due, (req + 1 + int(gap), s))
        else:
            del chains[s]
        req += 1
    return out[:n]


def loops(n: int = 150_000, unique: int = 20_000, stretch: float = 1.1,
          rounds: int = 2, seed: int = 13) -> list[int]:
    """Loops slightly larger than the cache, with one-time noise.

    The stream is `rounds` x 5 phases; phase f cycles in order over the first
    L_f = `stretch` x f x `unique` loop keys, for each suite size f, so at
    every suite size one phase is a loop 10% larger than the cache (LRU and
    FIFO hit nothing in it), smaller loops fit and larger ones thrash.
    One-time keys are sprinkled at random places so the stream has exactly
    `unique` distinct ids and the suite's cache sizes line up with the loops.
    """
    rnd = random.Random(seed)
    lens = [max(2, round(stretch * f * unique)) for f in SIZES]
    cold = unique - max(lens)
    body_n = n - cold
    per_phase = body_n // (rounds * len(lens))
    body: list[int] = []
    for _ in range(rounds):
        for L in lens:
            body += [i % L for i in range(per_phase)]
    body += [i % lens[-1] for i in range(body_n - len(body))]
    # the cold ids go in at sorted random positions, in one pass
    where = sorted(rnd.sample(range(n), cold))
    out: list[int] = []
    j = 0
    nxt = 1 << 40
    b = iter(body)
    for i in range(n):
        if j < cold and where[j] == i:
            out.append(nxt)
            nxt += 1
            j += 1
        else:
            out.append(next(b))
    return out


def scan_hot(n: int = 160_000, hot: int = 2_000, alpha: float = 0.8,
             hot_share: float = 0.6, scan_min: int = 200, scan_max: int = 4_000,
             seed: int = 14) -> list[int]:
    """Scans mixed with a hot set.

    `hot` keys read with Zipf(`alpha`) popularity take `hot_share` of the
    accesses; the rest are sequential scans of never-seen keys in bursts of
    `scan_min`..`scan_max` (a bulk prefill, a batch job), interleaved with
    the hot reads.  A policy must not let a scan flush the hot set.
    """
    rnd = random.Random(seed)
    cum = _zipf_cum(hot, alpha)
    perm = list(range(hot))
    rnd.shuffle(perm)
    out: list[int] = []
    nxt = 1 << 40
    scan_left = 0
    while len(out) < n:
        if rnd.random() < hot_share:
            out.append(perm[rnd.choices(range(hot), cum_weights=cum)[0]])
        else:
            if scan_left == 0:
                scan_left = rnd.randint(scan_min, scan_max)
            out.append(nxt)
            nxt += 1
            scan_left -= 1
    return out


def shifting(n: int = 150_000, window: int = 6_000, step: int = 1_500,
             phase: int = 10_000, alpha: float = 0.9, seed: int = 15) -> list[int]:
    """Popularity that shifts over time.

    Zipf(`alpha`) over a window of `window` keys; every `phase` accesses the
    window slides by `step` keys (the oldest leave, new ones arrive) and the
    popularity ranks are re-drawn at random over the window, so yesterday's
    hot keys cool and new ones heat up.  Frequency counts go stale; a policy
    must age them.
    """
    rnd = random.Random(seed)
    cum = _zipf_cum(window, alpha)
    out: list[int] = []
    base = 0
    while len(out) < n:
        rank = list(range(base, base + window))
        rnd.shuffle(rank)
        out += [rank[r] for r in rnd.choices(range(window), cum_weights=cum, k=min(phase, n - len(out)))]
        base += step
    return out


def zipf(n: int = 150_000, keys: int = 30_000, alpha: float = 0.9, seed: int = 16) -> list[int]:
    """Independent reads under Zipf(`alpha`) popularity over `keys` keys
    (ids shuffled), at skews 0.6 (flat: little to gain), 0.9 and 1.2 (a few
    keys dominate).  The textbook frequency-friendly stream: LFU-like
    policies lead, LRU trails."""
    rnd = random.Random(seed)
    cum = _zipf_cum(keys, alpha)
    perm = list(range(keys))
    rnd.shuffle(perm)
    return [perm[r] for r in rnd.choices(range(keys), cum_weights=cum, k=n)]


def _geometric(rnd: random.Random, mean: float) -> int:
    """1, 2, ... with the given mean."""
    k, p = 1, 1.0 / mean
    while rnd.random() > p:
        k += 1
    return k


def tool_loops(n: int = 160_000, prompts: int = 8, tools: int = 5, agents_alpha: float = 1.0,
               steps_mean: float = 12.0, concurrent: int = 24, result_max: int = 3,
               seed: int = 21) -> list[int]:
    """Agents in tool-call loops over shared system prompts.

    An agent run starts from one of `prompts` system prompts (Zipf
    `agents_alpha`, 6-24 blocks each) followed by one of `tools` tool-schema
    blocks sets (2-8 blocks, shared by every agent that uses the same tools),
    so the first part of every chain is shared across runs.  Each step of a
    run re-reads its whole chain (prompt, tools, every earlier step) and
    appends the model's call and the tool's result (1..`result_max` new
    blocks); a run takes a geometric number of steps (mean `steps_mean`).
    `concurrent` runs are in flight, steps interleaved at random, so a run's
    chain comes back after a few dozen other steps (seconds, not minutes):
    long chains re-read often, a shared head read by all, a tail read once.
    """
    rnd = random.Random(seed)
    ids = _Ids(1)
    cum = _zipf_cum(prompts, agents_alpha)
    plist = [ids.take(rnd.randint(6, 24)) for _ in range(prompts)]
    tlist = [ids.take(rnd.randint(2, 8)) for _ in range(tools)]
    runs: list[list[int]] = []
    left: list[int] = []
    out: list[int] = []
    while len(out) < n:
        while len(runs) < concurrent:
            p = rnd.choices(range(prompts), cum_weights=cum)[0]
            runs.append(list(plist[p]) + list(tlist[(p + rnd.randrange(2)) % tools]))
            left.append(_geometric(rnd, steps_mean))
        i = rnd.randrange(len(runs))
        out += runs[i]
        runs[i] += ids.take(rnd.randint(1, result_max))
        left[i] -= 1
        if left[i] == 0:
            runs.pop(i)
            left.pop(i)
    return out[:n]


def rag_docs(n: int = 160_000, docs: int = 3_000, doc_alpha: float = 0.9, k_min: int = 3,
             k_max: int = 6, prompts: int = 3, seed: int = 22) -> list[int]:
    """Retrieval-augmented requests over shared documents in varying order.

    A corpus of `docs` documents (2-8 blocks each) whose KV is cached per
    document, so a document's blocks are the same whatever its place in the
    prompt (position-independent reuse, as a document store of KV would keep
    them).  A request reads one of `prompts` system prompts (4 blocks), then
    k_min..k_max documents drawn by Zipf(`doc_alpha`) popularity in the order
    the retriever ranked them (shuffled: the same documents come back in
    another order), then its query (1-2 new blocks, never read again).
    Reuse is by document frequency, in bursts of a few blocks.
    """
    rnd = random.Random(seed)
    ids = _Ids(1)
    sys_prompts = [ids.take(4) for _ in range(prompts)]
    corpus = [ids.take(rnd.randint(2, 8)) for _ in range(docs)]
    order = list(range(docs))
    rnd.shuffle(order)
    cum = _zipf_cum(docs, doc_alpha)
    out: list[int] = []
    while len(out) < n:
        out += sys_prompts[rnd.randrange(prompts)]
        picked: list[int] = []
        for d in rnd.choices(range(docs), cum_weights=cum, k=rnd.randint(k_min, k_max)):
            if order[d] not in picked:
                picked.append(order[d])
        rnd.shuffle(picked)
        for d in picked:
            out += corpus[d]
        out += ids.take(rnd.randint(1, 2))
    return out[:n]


def shared_prefix(n: int = 160_000, prefix: int = 60, turns_mean: float = 3.0,
                  new_max: int = 8, gap_mean: float = 20.0, seed: int = 23) -> list[int]:
    """Many short sessions under one long shared prefix.

    Every request starts with the same `prefix` blocks (a long system prompt,
    a repository or a manual loaded as context), then its session's own
    blocks.  Sessions are short: a geometric number of turns (mean
    `turns_mean`), each appending 2..`new_max` blocks and coming back after
    an exponential gap of `gap_mean` requests.  The prefix is read by every
    request: at small sizes it does not fit and is a loop over the cache, at
    larger ones it is the hot set; session blocks are read a few times and
    forgotten.
    """
    rnd = random.Random(seed)
    ids = _Ids(1)
    head = ids.take(prefix)
    due: list[tuple[int, int]] = []
    chains: dict[int, list[int]] = {}
    left: dict[int, int] = {}
    sid = itertools.count()
    out: list[int] = []
    req = 0
    while len(out) < n:
        if due and due[0][0] <= req:
            _, s = heapq.heappop(due)
        else:
            s = next(sid)
            chains[s] = []
            left[s] = _geometric(rnd, turns_mean)
        out += head
        out += chains[s]
        chains[s] += ids.take(rnd.randint(2, new_max))
        left[s] -= 1
        if left[s]:
            heapq.heappush(due, (req + 1 + int(rnd.expovariate(1.0 / gap_mean)), s))
        else:
            del chains[s], left[s]
        req += 1
    return out[:n]


# name -> (family, generator, kwargs).  The suite runs them in this order.
WORKLOADS: dict[str, tuple[str, object, dict]] = {
    "prefix_suffix": ("prefix_suffix", prefix_suffix, {}),
    "sessions": ("sessions", sessions, {}),
    "loops": ("loops", loops, {}),
    "scan_hot": ("scan_hot", scan_hot, {}),
    "zipf0.6": ("zipf", zipf, {"alpha": 0.6}),
    "zipf0.9": ("zipf", zipf, {"alpha": 0.9}),
    "zipf1.2": ("zipf", zipf, {"alpha": 1.2}),
    "shifting": ("shifting", shifting, {}),
}

# Unseen variants: each family again with another seed and a changed parameter,
# made after the policy was tuned and never used to tune it; not in the default
# suite (`bench policy --suite --workloads variants`, or by name).
VARIANTS: dict[str, tuple[str, object, dict]] = {
    "prefix_suffix_v2": ("prefix_suffix", prefix_suffix, {"seed": 111, "prompts": 500, "alpha": 0.8}),
    "sessions_v2": ("sessions", sessions, {"seed": 112, "gap_mean": 1200.0}),
    "loops_v2": ("loops", loops, {"seed": 113, "stretch": 1.3}),
    "scan_hot_v2": ("scan_hot", scan_hot, {"seed": 114, "hot": 5000}),
    "zipf0.75_v2": ("zipf", zipf, {"seed": 116, "alpha": 0.75}),
    "shifting_v2": ("shifting", shifting, {"seed": 115, "step": 3000}),
}

# Agent workloads (issue 29), written after lru_lfu's switching rule was
# settled and never used to tune it: the three families, and a variant of
# each (another seed, a parameter changed).  Not in the default suite
# (`bench policy --suite --workloads agents`, or by name); reported last and
# apart.
AGENTS: dict[str, tuple[str, object, dict]] = {
    "tool_loops": ("tool_loops", tool_loops, {}),
    "rag_docs": ("rag_docs", rag_docs, {}),
    "shared_prefix": ("shared_prefix", shared_prefix, {}),
    "tool_loops_v2": ("tool_loops", tool_loops, {"seed": 121, "concurrent": 64, "steps_mean": 20.0}),
    "rag_docs_v2": ("rag_docs", rag_docs, {"seed": 122, "docs": 8_000, "doc_alpha": 0.7}),
    "shared_prefix_v2": ("shared_prefix", shared_prefix, {"seed": 123, "prefix": 300,
                                                          "gap_mean": 60.0}),
}

# The family held out while the issue-18 policy was tuned (reported last).
HELD_OUT = "shifting"
# Families held out from the issue-29 tuning (every agent family).
HELD_OUT_29 = frozenset(f for f, _, _ in AGENTS.values())


def _spec(name: str) -> tuple[str, object, dict]:
    """(family, generator, kwargs) of a suite workload, variant or agent
    workload (KeyError if unknown)."""
    for table in (WORKLOADS, VARIANTS, AGENTS):
        if name in table:
            return table[name]
    raise KeyError(name)


def known(name: str) -> bool:
    return name in WORKLOADS or name in VARIANTS or name in AGENTS


def generate(name: str) -> list[int]:
    """The named workload's key stream (KeyError for an unknown name)."""
    _, fn, kw = _spec(name)
    return fn(**kw)   # type: ignore[operator]


def family_of(name: str) -> str:
    """The generator family of a suite workload or variant (KeyError if unknown)."""
    return _spec(name)[0]


def expand(names: list[str]) -> list[str]:
    """Workload names with "variants" standing for every unseen variant and
    "agents" for every agent workload."""
    out: list[str] = []
    for n in names:
        out += list(VARIANTS) if n == "variants" else list(AGENTS) if n == "agents" else [n]
    return out
