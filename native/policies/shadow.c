/*
 * shadow.c — policies judged beside the live cache, with no memory of their
 * own per key: what LRU, LIRS and ARC would hit at the live cache's size,
 * access by access, from the state the live cache already keeps (lru_lfu.c
 * follows the best).
 *
 * Each key the live cache knows — resident, or in a ghost — carries its
 * last access (a stamp of the policy's access clock) and class bits.  A
 * policy that keeps the most recently used keys of a class, as LRU keeps
 * the most recent of all, holds exactly the `cap` keys of that class with
 * the newest stamps.  So a count of the class's keys by the bucket of their
 * stamp (a tcount: TC_NB buckets of 2^ws accesses) says who is in: the keys
 * of the buckets after `lo`, and a share of bucket `lo`:
 *
 *      bucket:   ... | lo (lo_in of cnt[lo] in) | lo+1 | ... | hi (now)
 *                      └──────── `cap` keys: the set ────────────┘
 *
 * An access of a key seen at stamp s is a hit of the set if s's bucket is
 * after lo (1), lo itself (lo_in / cnt[lo]: the expected share) or before
 * (0); the key then moves to the newest bucket, and lo moves on while the
 * set holds more than cap (never back: a key that left stays out, as in the
 * policy).  O(1) an access, amortised (lo passes each bucket once); when
 * the set spans more than TC_NB buckets they are merged in pairs (ws + 1).
 *
 *   LRU   the class of every key.  Exact to a bucket, as long as the ghosts
 *         remember every key LRU holds (they hold three sizes of evictions).
 *   LIRS  (Jiang and Zhang, SIGMETRICS 2002) the LIR set is the most recent
 *         cap - hir keys of the LIR class (SHADOW_LIR): a key enters it if
 *         the set is not full, or if its last access is more recent than
 *         the set's oldest (its stamp's bucket at or after lo) — LIRS's "its
 *         recency is under the LIR stack's bottom"; the set's oldest then
 *         leaves, as LIRS demotes its bottom.  A hit: a key of the set.
 *         (Resident HIR blocks, 1% of the cache, are not counted.)  This is
 *         the hybrid's setting 7 without its clock.
 *
 *   ARC   (Megiddo and Modha, FAST 2003) two classes: keys seen once
 *         (T1, B1) and keys seen again (T2, B2).  T1 is the newest p keys
 *         of the first class, L1 = T1 + B1 the newest `size` of them; T2 the
 *         newest size - p of the second, L2 the newest `size`.  A hit in T1
 *         or T2 (a key of the set) moves the key to T2; a miss found in B1
 *         (in L1, not T1) moves p up by max(1, |B2| / |B1|), one in B2 down
 *         by max(1, |B1| / |B2|), and the key goes to T2; any other miss to
 *         T1.  A count may carry two sets (TC_BOUNDS): T1 and L1 are two
 *         sets over the first class's count, T2 and L2 over the second's.
 *
 * Memory: four counts, 16 KB, whatever the size.  Bucket `lo` is judged by
 * its share, so a judgement is off at most for the keys of one bucket.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../memos.h"
#include "shadow.h"

#define TC_INF 1e18
#define TC_UNIT 64u             /* a bucket: about the size / this many accesses, at least */

#define LIKELY(x)   __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- private prototypes ---- */

static void tc_init(tcount *t, unsigned nb, uint32_t *cnt);
static void tc_start(tcount *t, uint64_t b);
static void tc_fit(tcount *t, unsigned j);
static void tc_coarsen(tcount *t);
static void tc_grow(tcount *t, uint64_t stamp);
static void tc_setcap(tcount *t, unsigned j, double cap);
static void arc_access(shadow *s, int known, uint64_t st, uint8_t *cls);
static void arc_replace(shadow *s, int b2hit);
static void tc_shrink(tcount *t, unsigned j, double k);

/* ---- a count by buckets of stamps (inline: every access takes them) ---- */

static inline void tc_lim(tbound *x)
{
    double r = x->cap - x->lo_in;
    x->lim = r > 9e18 ? INT64_MAX / 2 : r < 0 ? -1 : (int64_t)r;
}

static inline uint64_t tc_minlo(const tcount *t)
{
    uint64_t m = t->b[0].lo;
    for (unsigned j = 1; j < t->nb; j++)
        m = t->b[j].lo < m ? t->b[j].lo : m;
    return m;
}

static inline int tc_full(const tcount *t, unsigned j)
{
    return t->started && t->b[j].above >= t->b[j].lim;
}

/* Keys in set j. */
static inline double tc_in(const tcount *t, unsigned j)
{
    return t->started ? (double)t->b[j].above + t->b[j].lo_in : 0.0;
}

/* 1 if a key of bucket b is in set j, 0 if not, the expected share in bucket lo. */
static inline double tc_judge(const tcount *t, unsigned j, uint64_t b)
{
    const tbound *x = &t->b[j];
    if (b > x->lo && b <= t->hi)
        return 1.0;
    if (b != x->lo || !t->started)
        return 0.0;
    uint32_t c = t->cnt[b % TC_NB];
    return c ? x->lo_in / c : 0.0;
}

/* A key of bucket b leaves the class (it was accessed, or it is gone). */
static inline void tc_del(tcount *t, uint64_t b)
{
    if (!t->started || b > t->hi || b < tc_minlo(t))
        return;
    uint32_t *c = &t->cnt[b % TC_NB];
    if (!*c)
        return;
    for (unsigned j = 0; j < t->nb; j++) {
        tbound *x = &t->b[j];
        if (b > x->lo) {
            x->above--;
        } else if (b == x->lo) {
            x->lo_in -= x->lo_in / *c;
            tc_lim(x);
        }
    }
    (*c)--;
}

/* A key comes at `stamp` (the newest): into every set, whose oldest leave
 * while it holds more than its cap. */
static inline void tc_add(tcount *t, uint64_t stamp)
{
    uint64_t b = stamp >> t->ws;
    if (UNLIKELY(b != t->hi || !t->started)) {
        tc_grow(t, stamp);
        b = stamp >> t->ws;
    }
    t->cnt[b % TC_NB]++;
    for (unsigned j = 0; j < t->nb; j++) {
        tbound *x = &t->b[j];
        if (b > x->lo) {
            x->above++;
        } else {
            x->lo_in += 1;
            tc_lim(x);
        }
        if (x->above > x->lim) {            /* over: the oldest leave */
            double ex = (double)x->above + x->lo_in - x->cap;
            if (LIKELY(ex > 0 && x->lo_in >= ex)) {
                x->lo_in -= ex;
                tc_lim(x);
            } else {
                tc_fit(t, j);
            }
        }
    }
}

/* A key of bucket b (known, of this class) is accessed now: its judgement
 * in set 0, then it moves to the newest bucket.  A count of one set takes
 * no branch that depends on b in the common case (b after lo, now in the
 * newest bucket). */
static inline double tc_touch(tcount *t, uint64_t b, uint64_t now)
{
    uint64_t bn = now >> t->ws;
    tbound *x = &t->b[0];
    if (UNLIKELY(t->nb != 1 || b == x->lo || bn != t->hi || x->lo == t->hi || !t->started)) {
        double h = tc_judge(t, 0, b);
        tc_del(t, b);
        tc_add(t, now);
        return h;
    }
    int64_t in = (b > x->lo) & (b <= t->hi) & (t->cnt[b % TC_NB] > 0);
    t->cnt[b % TC_NB] -= (uint32_t)in;
    t->cnt[bn % TC_NB]++;
    x->above += 1 - in;
    if (UNLIKELY(x->above > x->lim))
        tc_fit(t, 0);
    return (double)in;
}

static uint64_t abs_stamp(const shadow *s, uint32_t stamp)
{
    uint32_t age = s->now32 - stamp;
    return age > (1u << 31) || age > s->now ? 0 : s->now - age;
}

/* ---- API ---- */

void shadow_init(shadow *s, uint32_t tick)
{
    memset(s, 0, sizeof *s);
    tc_init(&s->lru, 1, s->cnt[0]);
    tc_init(&s->lir, 1, s->cnt[1]);
    tc_init(&s->arc_r, 2, s->cnt[2]);
    tc_init(&s->arc_f, 2, s->cnt[3]);
    s->now = 1u << 20;                  /* (room below for stamps before the start) */
    s->now32 = tick;
}

/* The size judged (cap keys, hir of them LIRS's resident HIR blocks); a
 * bucket becomes at least cap / TC_UNIT accesses wide. */
void shadow_resize(shadow *s, double cap, double hir)
{
    unsigned ws = 0;
    while ((double)(TC_UNIT << (ws + 1)) <= cap)
        ws++;
    tcount *all[4] = { &s->lru, &s->lir, &s->arc_r, &s->arc_f };
    for (unsigned i = 0; i < 4; i++)
        while (all[i]->ws < ws)
            tc_coarsen(all[i]);
    s->cap = cap;
    s->hir = hir;
    s->p = s->p < cap ? s->p : cap;
    tc_setcap(&s->lru, 0, cap);
    tc_setcap(&s->lir, 0, cap > hir ? cap - hir : 1);
    tc_setcap(&s->arc_r, 1, cap);
    tc_setcap(&s->arc_f, 1, cap);
    arc_replace(s, 0);
}

void shadow_access(shadow *s, uint32_t tick, int known, uint32_t stamp, uint8_t *cls)
{
    s->now += (uint32_t)(tick - s->now32);
    s->now32 = tick;
    if (UNLIKELY(!known)) {
        tc_add(&s->lru, s->now);
        if (!tc_full(&s->lir, 0)) {
            tc_add(&s->lir, s->now);
            *cls |= SHADOW_LIR;
        } else {
            *cls &= (uint8_t)~SHADOW_LIR;
        }
        arc_access(s, 0, 0, cls);
        return;
    }
    uint64_t st = abs_stamp(s, stamp);
    s->hits[SHADOW_LRU] += tc_touch(&s->lru, st >> s->lru.ws, s->now);
    arc_access(s, 1, st, cls);
    uint64_t b = st >> s->lir.ws;
    if (*cls & SHADOW_LIR) {
        double h = tc_judge(&s->lir, 0, b);
        if (LIKELY(h > 0)) {
            s->hits[SHADOW_LIRS] += tc_touch(&s->lir, b, s->now);
            return;
        }
    }
    if (!tc_full(&s->lir, 0) || (s->lir.started && b >= s->lir.b[0].lo)) {
        tc_add(&s->lir, s->now);    /* into the LIR set; its oldest leaves if it is full */
        *cls |= SHADOW_LIR;
    } else {
        *cls &= (uint8_t)~SHADOW_LIR;
    }
}

int shadow_in_lir(const shadow *s, uint32_t stamp)
{
    return tc_judge(&s->lir, 0, abs_stamp(s, stamp) >> s->lir.ws) > 0;
}

void shadow_forget(shadow *s, uint32_t stamp, uint8_t cls)
{
    uint64_t st = abs_stamp(s, stamp);
    tc_del(&s->lru, st >> s->lru.ws);
    if (cls & SHADOW_LIR)
        tc_del(&s->lir, st >> s->lir.ws);
    tcount *a = cls & SHADOW_ARC_F ? &s->arc_f : &s->arc_r;
    tc_del(a, st >> a->ws);
}

static int tc_check(const tcount *t, const char *name, char *why, size_t whylen)
{
    if (!t->started)
        return MEMOS_OK;
    uint64_t mlo = tc_minlo(t);
    for (unsigned j = 0; j < t->nb; j++) {
        const tbound *x = &t->b[j];
        int64_t above = 0;
        for (uint64_t b = x->lo + 1; b <= t->hi; b++)
            above += t->cnt[b % TC_NB];
        if (above != x->above || t->hi - mlo >= TC_NB || x->lo_in < -1e-6 ||
            x->lo_in > (double)t->cnt[x->lo % TC_NB] + 1e-6 || (double)above + x->lo_in > x->cap + 1e-6) {
            snprintf(why, whylen, "policy: shadow %s, set %u: %lld keys after bucket %llu, count "
                     "says %lld; %g of bucket %llu in (it holds %u); capacity %g", name, j,
                     (long long)above, (unsigned long long)x->lo, (long long)x->above, x->lo_in,
                     (unsigned long long)x->lo, t->cnt[x->lo % TC_NB], x->cap);
            return MEMOS_EINVAL;
        }
    }
    return MEMOS_OK;
}

int shadow_check(const shadow *s, char *why, size_t whylen)
{
    int rc = tc_check(&s->lru, "LRU", why, whylen);
    rc = rc == MEMOS_OK ? tc_check(&s->lir, "LIRS", why, whylen) : rc;
    rc = rc == MEMOS_OK ? tc_check(&s->arc_r, "ARC (seen once)", why, whylen) : rc;
    rc = rc == MEMOS_OK ? tc_check(&s->arc_f, "ARC (seen again)", why, whylen) : rc;
    if (rc == MEMOS_OK && s->cap > 0 && (s->p < 0 || s->p > s->cap)) {
        snprintf(why, whylen, "policy: shadow ARC: target %g outside [0, %g]", s->p, s->cap);
        rc = MEMOS_EINVAL;
    }
    return rc;
}

/* ---- private helpers ---- */

/* ARC's step for one access (see the top). */
static void arc_access(shadow *s, int known, uint64_t st, uint8_t *cls)
{
    if (!known) {
        tc_add(&s->arc_r, s->now);
        *cls &= (uint8_t)~SHADOW_ARC_F;
        arc_replace(s, 0);
        return;
    }
    int f = (*cls & SHADOW_ARC_F) != 0;
    tcount *t = f ? &s->arc_f : &s->arc_r;
    uint64_t b = st >> t->ws, bn = s->now >> t->ws;
    if (LIKELY(f && b > t->b[0].lo && b > t->b[1].lo && b <= t->hi && bn == t->hi &&
               t->cnt[b % TC_NB] > 0)) {        /* a hit in T2, the commonest: the key moves on */
        t->cnt[b % TC_NB]--;
        t->cnt[bn % TC_NB]++;
        s->hits[SHADOW_ARC] += 1;
        return;
    }
    double in_t = tc_judge(t, 0, b), in_l = tc_judge(t, 1, b);
    if (in_t > 0) {                             /* a hit: to T2 */
        s->hits[SHADOW_ARC] += in_t;
    } else if (in_l > 0 && s->cap > 0) {        /* a ghost hit: p moves, to T2 */
        double b1 = tc_in(&s->arc_r, 1) - tc_in(&s->arc_r, 0);
        double b2 = tc_in(&s->arc_f, 1) - tc_in(&s->arc_f, 0);
        if (!f) {
            double d = b1 > 0 && b2 > b1 ? b2 / b1 : 1.0;
            s->p = s->p + d < s->cap ? s->p + d : s->cap;
        } else {
            double d = b2 > 0 && b1 > b2 ? b1 / b2 : 1.0;
            s->p = s->p - d > 0 ? s->p - d : 0;
        }
    } else {                                    /* gone from ARC's lists: new, to T1 */
        tc_del(t, b);
        tc_add(&s->arc_r, s->now);
        *cls &= (uint8_t)~SHADOW_ARC_F;
        arc_replace(s, 0);
        return;
    }
    tc_del(t, b);
    tc_add(&s->arc_f, s->now);
    *cls |= SHADOW_ARC_F;
    arc_replace(s, f && in_t <= 0);
}

/* ARC's REPLACE: while T1 and T2 hold more than the size, T1's oldest go
 * if T1 is over p (or at p, on a B2 hit), else T2's; then L2 is bounded by
 * twice the size less L1. */
static void arc_replace(shadow *s, int b2hit)
{
    if (s->cap <= 0)
        return;
    double t1 = tc_in(&s->arc_r, 0), t2 = tc_in(&s->arc_f, 0);
    double excess = t1 + t2 - s->cap;
    if (excess > 1e-9) {
        if (t1 >= 1 && (t1 > s->p || (b2hit && t1 >= s->p))) {
            double k = t1 - s->p > 1 ? t1 - s->p : 1;
            k = k < excess ? k : excess;
            tc_shrink(&s->arc_r, 0, k);
            excess -= k;
        }
        if (excess > 1e-9)
            tc_shrink(&s->arc_f, 0, excess < t2 ? excess : t2);
    }
    double l2 = 2 * s->cap - tc_in(&s->arc_r, 1);
    if (tc_in(&s->arc_f, 1) > l2 + 1e-9)
        tc_setcap(&s->arc_f, 1, l2);
    else
        s->arc_f.b[1].cap = l2 > 0 ? l2 : 0, tc_lim(&s->arc_f.b[1]);
}

/* The k oldest keys leave set j (its cap stays unlimited). */
static void tc_shrink(tcount *t, unsigned j, double k)
{
    if (!t->started || k <= 0)
        return;
    if (t->b[j].lo_in >= k) {               /* (most often: within bucket lo) */
        t->b[j].lo_in -= k;
        tc_lim(&t->b[j]);
        return;
    }
    t->b[j].cap = tc_in(t, j) - k;
    tc_fit(t, j);
    t->b[j].cap = TC_INF;
    tc_lim(&t->b[j]);
}

static void tc_init(tcount *t, unsigned nb, uint32_t *cnt)
{
    memset(t, 0, sizeof *t);
    t->cnt = cnt;
    t->nb = nb;
    for (unsigned j = 0; j < nb; j++) {
        t->b[j].cap = TC_INF;
        tc_lim(&t->b[j]);
    }
}

static void tc_start(tcount *t, uint64_t b)
{
    t->started = 1;
    t->hi = b;
    memset(t->cnt, 0, TC_NB * sizeof *t->cnt);
    for (unsigned j = 0; j < t->nb; j++) {
        t->b[j].lo = b;
        t->b[j].above = 0;
        t->b[j].lo_in = 0;
        tc_lim(&t->b[j]);
    }
}

/* The newest bucket moves on to stamp's (coarser buckets while the oldest
 * set would span more than TC_NB). */
static void tc_grow(tcount *t, uint64_t stamp)
{
    if (!t->started)
        tc_start(t, stamp >> t->ws);
    while ((stamp >> t->ws) - tc_minlo(t) >= TC_NB)
        tc_coarsen(t);
    for (uint64_t b = stamp >> t->ws; t->hi < b; t->hi++)
        t->cnt[(t->hi + 1) % TC_NB] = 0;
}

static void tc_setcap(tcount *t, unsigned j, double cap)
{
    t->b[j].cap = cap > 0 ? cap : 0;
    tc_lim(&t->b[j]);
    if (t->started && (double)t->b[j].above + t->b[j].lo_in > t->b[j].cap + 1e-9)
        tc_fit(t, j);
}

/* While set j holds more than its cap: its oldest leave (lo moves on). */
static void tc_fit(tcount *t, unsigned j)
{
    tbound *x = &t->b[j];
    while (t->started && (double)x->above + x->lo_in > x->cap + 1e-9) {   /* (lo_in may be part of a key) */
        double excess = (double)x->above + x->lo_in - x->cap;
        if (x->lo_in > 1e-9) {
            x->lo_in -= excess < x->lo_in ? excess : x->lo_in;
            continue;
        }
        if (x->lo == t->hi) {
            x->lo_in = 0;
            break;
        }
        x->lo++;
        uint32_t c = t->cnt[x->lo % TC_NB];
        x->above -= c;
        x->lo_in = c;
    }
    tc_lim(x);
}

/* Buckets twice as wide: pairs merged. */
static void tc_coarsen(tcount *t)
{
    if (!t->started) {
        t->ws++;
        return;
    }
    uint32_t old[TC_NB];
    memcpy(old, t->cnt, sizeof old);
    memset(t->cnt, 0, TC_NB * sizeof *t->cnt);
    uint64_t mlo = tc_minlo(t), hi = t->hi;
    for (uint64_t b = mlo; b <= hi; b++)
        t->cnt[(b >> 1) % TC_NB] += old[b % TC_NB];
    t->hi = hi >> 1;
    t->ws++;
    for (unsigned j = 0; j < t->nb; j++) {
        tbound *x = &t->b[j];
        double lo_in = x->lo_in + (!(x->lo & 1) && x->lo + 1 <= hi ? old[(x->lo + 1) % TC_NB] : 0);
        x->lo >>= 1;
        uint32_t c = t->cnt[x->lo % TC_NB];
        x->lo_in = lo_in < c ? lo_in : c;
        x->above = 0;
        for (uint64_t b = x->lo + 1; b <= t->hi; b++)
            x->above += t->cnt[b % TC_NB];
        tc_lim(x);
    }
}
