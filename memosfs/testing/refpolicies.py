"""Reference implementations of the published eviction policies, one short
class each, written from the papers to check the peers `bench policy`
compares with (libCacheSim) and the simulated members of native/policies/.

Every class is a cache of `capacity` unit-size blocks with one method,
`access(key) -> bool` (a hit; a miss inserts the key, evicting as the
policy says), and `resident()` (the keys it holds).  Keys are ints.  They are
slow (pure Python) but short enough to read against the paper:

  LRU        least recently used.
  LFU        least frequently used: counts live while a block is cached
             (forgotten on eviction); ties go to the block that reached its
             count first (libCacheSim's rule; the LFU literature leaves it open).
  ARC        Megiddo and Modha, "ARC: a self-tuning, low overhead replacement
             cache", FAST 2003 (Fig. 4): T1/T2, ghosts B1/B2, target p.
  TwoQ       Johnson and Shasha, "2Q: a low overhead high performance buffer
             management replacement algorithm", VLDB 1994, full version:
             A1in FIFO (Kin = 25%), A1out ghost FIFO (Kout = 50%), Am LRU.
  S3FIFO     Yang et al., "FIFO queues are all you need for cache eviction",
             SOSP 2023 (Algorithm 1): small FIFO 10%, main FIFO, ghost FIFO of
             the main's size, 2-bit frequency; S -> M when freq > 1.
  SIEVE      Zhang et al., "SIEVE is simpler than LRU", NSDI 2024: one FIFO,
             a visited bit, a hand that moves from the tail towards the head.
  LIRS       Jiang and Zhang, "LIRS: an efficient low inter-reference recency
             set replacement policy", SIGMETRICS 2002: stack S, queue Q,
             L_hirs = 1% (at least 1); the stack keeps at most 2 x capacity
             entries (oldest non-resident HIR entries go first), as in
             libCacheSim and Cacheus, since the paper leaves S unbounded.
  WTinyLFU   Einziger, Friedman and Manes, "TinyLFU: a highly efficient cache
             admission policy", ACM ToS 2017, W-TinyLFU(1%) as in Caffeine:
             window LRU 1%, main SLRU (probation 20%, protected 80%), a
             count-min sketch of 4 rows x (the power of two >= 4 x capacity)
             4-bit counters with minimal increment, halved every 10 x capacity
             increments; the window's victim enters the main cache if its
             estimate beats the main victim's (strictly).  The sketch hashes
             are `sketch_index` (the same in native/policies/wtinylfu.c).

May call: the standard library only.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["LRU", "LFU", "ARC", "TwoQ", "S3FIFO", "SIEVE", "LIRS", "WTinyLFU",
           "POLICIES", "replay", "mix64", "sketch_index"]

M64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finalizer (native/policies/member.c: member_mix64)."""
    x &= M64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def sketch_index(key_hash: int, row: int, mask: int) -> int:
    """Column of `key_hash` in row `row` of the W-TinyLFU sketch."""
    return mix64(key_hash + (row + 1) * 0x9E3779B97F4A7C15) & mask


class LRU:
    def __init__(self, capacity: int) -> None:
        self.cap = capacity
        self.q: OrderedDict[int, None] = OrderedDict()   # LRU first

    def access(self, key: int) -> bool:
        if key in self.q:
            self.q.move_to_end(key)
            return True
        if len(self.q) >= self.cap:
            self.q.popitem(last=False)
        self.q[key] = None
        return False

    def resident(self) -> set[int]:
        return set(self.q)


class LFU:
    def __init__(self, capacity: int) -> None:
        self.cap = capacity
        self.freq: dict[int, int] = {}
        self.bucket: dict[int, OrderedDict[int, None]] = {}   # count -> keys, first to reach it first

    def access(self, key: int) -> bool:
        f = self.freq.get(key)
        if f is not None:
            del self.bucket[f][key]
            if not self.bucket[f]:
                del self.bucket[f]
            self.freq[key] = f + 1
            self.bucket.setdefault(f + 1, OrderedDict())[key] = None
            return True
        if len(self.freq) >= self.cap:
            low = min(self.bucket)
            victim, _ = self.bucket[low].popitem(last=False)
            if not self.bucket[low]:
                del self.bucket[low]
            del self.freq[victim]
        self.freq[key] = 1
        self.bucket.setdefault(1, OrderedDict())[key] = None
        return False

    def resident(self) -> set[int]:
        return set(self.freq)


class ARC:
    def __init__(self, capacity: int) -> None:
        self.c = capacity
        self.p = 0.0
        self.t1: OrderedDict[int, None] = OrderedDict()   # LRU first
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()

    def _replace(self, in_b2: bool) -> None:
        if self.t1 and (len(self.t1) > self.p or (in_b2 and len(self.t1) == self.p)) or not self.t2:
            k, _ = self.t1.popitem(last=False)
            self.b1[k] = None
        else:
            k, _ = self.t2.popitem(last=False)
            self.b2[k] = None

    def access(self, x: int) -> bool:
        if x in self.t1:                        # case I
            del self.t1[x]
            self.t2[x] = None
            return True
        if x in self.t2:
            self.t2.move_to_end(x)
            return True
        full = len(self.t1) + len(self.t2) >= self.c
        if x in self.b1:                        # case II
            self.p = min(self.p + max(len(self.b2) / len(self.b1), 1.0), self.c)
            del self.b1[x]
            if full:
                self._replace(False)
            self.t2[x] = None
            return False
        if x in self.b2:                        # case III
            self.p = max(self.p - max(len(self.b1) / len(self.b2), 1.0), 0.0)
            del self.b2[x]
            if full:
                self._replace(True)
            self.t2[x] = None
            return False
        l1 = len(self.t1) + len(self.b1)        # case IV
        if full:
            if l1 >= self.c:
                if len(self.t1) < self.c:
                    self.b1.popitem(last=False)
                    self._replace(False)
                else:
                    self.t1.popitem(last=False)
            else:
                if l1 + len(self.t2) + len(self.b2) >= 2 * self.c and self.b2:
                    self.b2.popitem(last=False)
                self._replace(False)
        self.t1[x] = None
        return False

    def resident(self) -> set[int]:
        return set(self.t1) | set(self.t2)


class TwoQ:
    def __init__(self, capacity: int, kin: float = 0.25, kout: float = 0.5) -> None:
        self.cap = capacity
        self.kin = int(capacity * kin)
        self.kout = int(capacity * kout)
        self.a1in: OrderedDict[int, None] = OrderedDict()   # oldest first
        self.a1out: OrderedDict[int, None] = OrderedDict()
        self.am: OrderedDict[int, None] = OrderedDict()     # LRU first

    def _reclaim(self) -> None:
        if len(self.a1in) + len(self.am) < self.cap:
            return
        if len(self.a1in) > self.kin or not self.am:
            k, _ = self.a1in.popitem(last=False)
            self.a1out[k] = None
            if len(self.a1out) > self.kout:
                self.a1out.popitem(last=False)
        else:
            self.am.popitem(last=False)

    def access(self, x: int) -> bool:
        if x in self.am:
            self.am.move_to_end(x)
            return True
        if x in self.a1in:
            return True
        if x in self.a1out:
            del self.a1out[x]
            self._reclaim()
            self.am[x] = None
            return False
        self._reclaim()
        self.a1in[x] = None
        return False

    def resident(self) -> set[int]:
        return set(self.a1in) | set(self.am)


class S3FIFO:
    def __init__(self, capacity: int, small: float = 0.1, libcachesim: bool = False) -> None:
        self.cap = capacity
        # libCacheSim's three departures (off: the paper): before the first
        # eviction new keys go to M once S is full; a key moved from S to M
        # does not evict from M at once (M shrinks back at later evictions);
        # a key is looked up in G before the evictions that make room for it
        # (which may push the oldest ghosts out)
        self.lib = libcachesim
        self.evicted = False
        self.s_cap = max(1, int(capacity * small))
        self.m_cap = capacity - self.s_cap
        self.g_cap = int(capacity * 0.9)      # the main queue's share, as libCacheSim sizes it
        self.s: OrderedDict[int, None] = OrderedDict()      # oldest first
        self.m: OrderedDict[int, None] = OrderedDict()
        self.g: OrderedDict[int, None] = OrderedDict()
        self.freq: dict[int, int] = {}

    def _evict_m(self) -> None:
        while self.m:
            t, _ = self.m.popitem(last=False)
            if self.freq[t] > 0:
                self.m[t] = None
                self.freq[t] -= 1
            else:
                del self.freq[t]
                return

    def _evict_s(self) -> None:
        while self.s:
            t, _ = self.s.popitem(last=False)
            if self.freq[t] > 1:
                self.m[t] = None
                self.freq[t] = 0
                if len(self.m) > self.m_cap and not self.lib:
                    self._evict_m()
            else:
                del self.freq[t]
                self.g[t] = None
                if len(self.g) > self.g_cap:
                    self.g.popitem(last=False)
                return

    def access(self, x: int) -> bool:
        if x in self.freq:
            self.freq[x] = min(self.freq[x] + 1, 3)
            return True
        ghost = self.lib and x in self.g
        if ghost:
            del self.g[x]
        while len(self.s) + len(self.m) >= self.cap:
            self.evicted = True
            if len(self.s) >= self.s_cap or not self.m:
                self._evict_s()
            else:
                self._evict_m()
        if ghost or x in self.g:
            self.g.pop(x, None)
            self.m[x] = None
        elif self.lib and not self.evicted and len(self.s) >= self.s_cap:
            self.m[x] = None
        else:
            self.s[x] = None
        self.freq[x] = 0
        return False

    def resident(self) -> set[int]:
        return set(self.freq)


class SIEVE:
    def __init__(self, capacity: int) -> None:
        self.cap = capacity
        self.q: list[int] = []          # index 0 = tail (oldest); the head is the end
        self.visited: dict[int, bool] = {}
        self.hand = 0                   # index into q; moves towards the head
        self.laps = 0                   # times the hand went past the head, back to the tail

    def access(self, x: int) -> bool:
        if x in self.visited:
            self.visited[x] = True
            return True
        if len(self.q) >= self.cap:
            i = self.hand
            while self.visited[self.q[i]]:
                self.visited[self.q[i]] = False
                i += 1
                if i == len(self.q):
                    i = 0
                    self.laps += 1
            del self.visited[self.q[i]]
            del self.q[i]               # O(n): a reference, not a fast cache
            self.hand = i               # the next one towards the head (past it: the tail)
            if i == len(self.q):
                self.hand = 0
                self.laps += 1
        self.q.append(x)
        self.visited[x] = False
        return False

    def resident(self) -> set[int]:
        return set(self.visited)


class LIRS:
    LIR, HIR, NONRES = 0, 1, 2

    def __init__(self, capacity: int, hir: float = 0.01) -> None:
        self.cap = capacity
        self.l_hirs = max(1, int(hir * capacity))
        self.l_lirs = capacity - self.l_hirs
        self.s: OrderedDict[int, None] = OrderedDict()   # bottom (oldest) first
        self.q: OrderedDict[int, None] = OrderedDict()   # resident HIR, front first
        self.state: dict[int, int] = {}                  # key -> LIR/HIR/NONRES (in S or Q)
        self.nonres: OrderedDict[int, None] = OrderedDict()   # non-resident in S, oldest first
        self.n_lir = 0

    def _prune(self) -> None:
        while self.s:
            k = next(iter(self.s))
            if self.state[k] == self.LIR:
                return
            del self.s[k]
            if self.state[k] == self.NONRES:
                del self.state[k]
                del self.nonres[k]

    def _demote_bottom_lir(self) -> None:
        k, _ = self.s.popitem(last=False)
        self.state[k] = self.HIR
        self.n_lir -= 1
        self.q[k] = None
        self._prune()

    def _evict_hir(self) -> None:
        if not self.q and self.s:
            self._demote_bottom_lir()       # a cache too small for any HIR block
        if not self.q:
            return
        k, _ = self.q.popitem(last=False)
        if k in self.s:
            self.state[k] = self.NONRES
            self.nonres[k] = None
        else:
            del self.state[k]

    def _limit(self) -> None:
        while len(self.s) > 2 * self.cap and self.nonres:
            k, _ = self.nonres.popitem(last=False)
            del self.s[k]
            del self.state[k]

    def access(self, x: int) -> bool:
        st = self.state.get(x)
        hit = st in (self.LIR, self.HIR)
        if st == self.LIR:
            self.s.move_to_end(x)
            self._prune()
        elif st == self.HIR:
            if x in self.s:
                self.s.move_to_end(x)
                del self.q[x]
                self.state[x] = self.LIR
                self.n_lir += 1
                self._demote_bottom_lir()
            else:
                self.s[x] = None
                self.q.move_to_end(x)
        else:
            resident = self.n_lir + len(self.q)
            if self.n_lir < self.l_lirs and st is None:
                self.s[x] = None                # warm-up: the first blocks are LIR
                self.state[x] = self.LIR
                self.n_lir += 1
            else:
                if resident >= self.cap:
                    self._evict_hir()
                if st == self.NONRES and x in self.s:
                    del self.nonres[x]
                    self.s.move_to_end(x)
                    self.state[x] = self.LIR
                    self.n_lir += 1
                    if self.n_lir > self.l_lirs:
                        self._demote_bottom_lir()
                else:
                    self.s[x] = None
                    self.q[x] = None
                    self.state[x] = self.HIR
        self._prune()                       # (no LIR block at all: the stack empties)
        self._limit()
        return hit

    def resident(self) -> set[int]:
        return {k for k, v in self.state.items() if v != self.NONRES}


class WTinyLFU:
    ROWS = 4

    def __init__(self, capacity: int, window: float = 0.01, protected: float = 0.8) -> None:
        self.cap = capacity
        self.w_cap = max(1, int(capacity * window))
        self.m_cap = capacity - self.w_cap
        self.p_cap = int(self.m_cap * protected)
        self.win: OrderedDict[int, None] = OrderedDict()    # LRU first
        self.prob: OrderedDict[int, None] = OrderedDict()
        self.prot: OrderedDict[int, None] = OrderedDict()
        width = 16
        while width < 4 * capacity:
            width *= 2
        self.mask = width - 1
        self.table = [[0] * width for _ in range(self.ROWS)]
        self.adds = 0
        self.sample = 10 * capacity

    def _add(self, key: int) -> None:
        h = mix64(key) or 1
        cols = [sketch_index(h, r, self.mask) for r in range(self.ROWS)]
        low = min(self.table[r][c] for r, c in enumerate(cols))
        if low < 15:
            for r, c in enumerate(cols):
                if self.table[r][c] == low:
                    self.table[r][c] += 1
        self.adds += 1
        if self.adds >= self.sample:
            self.adds //= 2
            for row in self.table:
                for i, v in enumerate(row):
                    row[i] = v >> 1

    def estimate(self, key: int) -> int:
        h = mix64(key) or 1
        return min(self.table[r][sketch_index(h, r, self.mask)] for r in range(self.ROWS))

    def access(self, x: int) -> bool:
        self._add(x)
        if x in self.win:
            self.win.move_to_end(x)
            return True
        if x in self.prot:
            self.prot.move_to_end(x)
            return True
        if x in self.prob:
            del self.prob[x]
            self.prot[x] = None
            if len(self.prot) > self.p_cap:
                k, _ = self.prot.popitem(last=False)
                self.prob[k] = None
            return True
        self.win[x] = None
        if len(self.win) > self.w_cap:
            cand, _ = self.win.popitem(last=False)
            if len(self.prob) + len(self.prot) < self.m_cap:
                self.prob[cand] = None
            elif self.prob or self.prot:
                main = self.prob if self.prob else self.prot
                victim = next(iter(main))
                if self.estimate(cand) > self.estimate(victim):
                    del main[victim]
                    self.prob[cand] = None
        return False

    def resident(self) -> set[int]:
        return set(self.win) | set(self.prob) | set(self.prot)


POLICIES = {"LRU": LRU, "LFU": LFU, "ARC": ARC, "2Q": TwoQ, "S3-FIFO": S3FIFO,
            "SIEVE": SIEVE, "LIRS": LIRS, "W-TinyLFU": WTinyLFU}


def replay(name: str, keys, capacity: int) -> int:
    """Hits of the named reference policy over `keys` at `capacity` blocks."""
    c = POLICIES[name](capacity)
    return sum(c.access(k) for k in keys)
