/*
 * hybrid.c — lru_lfu's two-segment hybrid, at one of its settings
 * ("lru_lfu@i"; lru_lfu.c runs it with shadows choosing the setting).
 * After ARC, 2Q, S3-FIFO and LIRS:
 *
 *        admit ──► probation (FIFO) ──hit──► protected (LRU + aging clock)
 *                     │ evict                     │ evict (ref == 0)
 *                     ▼                           ▼
 *              ghost ring 0 (2 × size)      ghost ring 1 (1 × size)
 *                     │                           │
 *                     └──── an admit whose key is in a ghost goes
 *                           straight to protected ◄┘
 *
 * A hit in probation promotes to protected (ref = 0); a hit in protected
 * moves the node to the front and adds 1 to its 2-bit `ref` (max 3).
 * Victims come from probation while it holds more than its target (pfrac ×
 * count), else from protected: its oldest node with ref == 0; a node with
 * ref > 0 passed on the way loses 1 and goes back to the front (a clock:
 * frequency that ages), at most CLOCK_STEPS passes a victim (then the
 * oldest goes whatever its ref: an eviction's cost is bounded).
 *
 * HYBRIDS lists eight settings (policy_expert): 0 LRU, 1 the ghost rule
 * (pfrac starts at 0.5 and moves by 1/count on each ghost hit of the last
 * two epochs of its ring: ghost 0 up, ghost 1 down, clamped to [0.01,
 * 0.9]), 2 pfrac 0.1, 3 pfrac 0.01 with ghost hits admitted to protected
 * only while it has room, 4 pfrac 0.3, 5 pfrac 0.01 where a recent ghost hit
 * may also take the place of a cold protected node, 6 LIRS (Jiang and
 * Zhang, SIGMETRICS 2002) in the hybrid's terms: protected is the LIR set,
 * probation (1%) the resident HIR blocks; protected fills first, then a key
 * enters it only if its last access (its stamp: the policy's access clock)
 * is more recent than that of protected's oldest node, which goes back to
 * probation; 7 the same with the aging clock choosing who goes back.
 *
 * Ghosts: a table of 8-entry buckets (one 64-byte line each, found by a
 * 32-bit fingerprint of the key hash), an entry of 8 bytes holding the
 * fingerprint, the key's last stamp (to the unit gshift), its ring, the
 * ring's epoch when it came, and the shadows' class bits (lru_lfu.c).  An
 * epoch of a ring is an eighth of the size in evictions into it; a ghost
 * ages out after 16 epochs of ring 0 (2 × the size) or 8 of ring 1 (1 ×),
 * or when its bucket has no older entry to give.  The table is sized to the
 * cache — 4 entries per entry of the size when full (hybrid_resize), remade
 * when that size moves by more than an eighth: 32 bytes an entry, and a
 * summary word a bucket (a bit of each entry's fingerprint: most lookups of
 * a key that is no ghost read no line of the table), 36 in all.  An
 * eviction run writes no line of the table: its ghosts wait in a pending
 * ring of POLICY_GHOST_PENDING entries (in the policy, with a summary word
 * of its own; a lookup reads it first), and each admit moves the oldest
 * into the table, its bucket (and the key's summary word) fetched when
 * the admit begins, while the shadows judge it (hybrid_prefetch) — so an
 * evicting put's latency holds no miss of the table.  A fingerprint
 * collision (2^-32 a lookup and entry) makes one admit look like a ghost
 * hit: harmless.
 *
 * Cost.  admit, touch and remove O(1): list moves, and on an admit one
 * bucket of the ghost table read and one written (a pending ghost's); a
 * victim O(skipped) plus at most CLOCK_STEPS clock passes.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hybrid.h"
#include "lists.h"

/* ---- types and constants ---- */

#define REF_MAX         3u
#define PFRAC_INIT      0.5
#define PFRAC_MIN       0.01
#define PFRAC_MAX       0.9
#define DEMOTE_STEPS    2u      /* gadmit 3: clock steps one ghost hit may take */
#define LIRS_STEPS      32u     /* lirs 2: clock steps before protected's oldest goes back */
#define CLOCK_STEPS     8u      /* clock passes a victim at most */
#define GB              8u      /* entries a bucket (64 bytes) */
#define GB_MIN          8u      /* buckets at least */
#define G_SLOTS         4u      /* entries per entry of the size */
#define G_STAMP_BITS    16u
#define G_STAMP_MASK    ((1u << G_STAMP_BITS) - 1)
#define G_STAMP_UNIT    64u     /* a ghost's stamp: the clock in units of about size / this */

#define G_FLOOR         1024u   /* the table has room for the ghosts of a size of at least this */
#define G_KEEP          32u     /* a ghost of class bit 0 (HYB_CLS_KEEP) lives this many times longer, */
#define G_KEEP_MIN      8192u   /* ... and at least this many evictions of its ring */
#define G_EPOCH_MASK    0xfffu  /* epochs as an entry keeps them (12 bits) */

static const unsigned G_LIMIT[2] = { 16, 8 };   /* epochs a ghost of each ring lives */

static const policy_expert HYBRIDS[POLICY_EXPERTS] = {
    { 0.5,  1, 1, 0, 0 },  /* 0 lru: victims in recency order */
    { -1.0, 0, 1, 0, 0 },  /* 1 adaptive split, ghost hits to protected (ARC-like) */
    { 0.1,  0, 1, 0, 0 },  /* 2 small probation, ghost hits to protected (S3-FIFO-like) */
    { 0.01, 0, 2, 0, 0 },  /* 3 tiny probation, ghost hits only fill protected */
    { 0.3,  0, 1, 0, 0 },  /* 4 medium probation */
    { 0.01, 0, 3, 0, 0 },  /* 5 tiny probation, ghost hits replace cold protected nodes (loops) */
    { 0.01, 0, 0, 1, 0 },  /* 6 LIRS: protected the LIR set, entered by a recency under its oldest's */
    { 0.01, 0, 0, 2, 0 },  /* 7 LIRS with the aging clock */
    { -1.0, 0, 1, 0, 1 },  /* 8 ARC: probation T1, protected T2, p by ghost hits in B1 and B2 */
};

/* ---- private prototypes ---- */

static uint32_t fp_of(uint64_t hash);
static size_t   bucket_of(const policy *p, uint32_t fp);
static int      ghost_live(const policy *p, uint64_t e);
static unsigned g_limit(const policy *p, uint64_t e);
static void     set_limits(policy *p);
static void     ghost_add(policy *p, unsigned r, uint64_t hash, uint32_t stamp, unsigned cls);
static void     ghost_drain(policy *p);
static void     ghost_drain_all(policy *p);
static int      ghost_put(policy *p, uint64_t *tab, uint64_t *sum, size_t nb, uint64_t e);
static unsigned furthest(const policy *p, const uint64_t *b);
static void     summarize(const uint64_t *tab, uint64_t *sum, size_t b);
static uint64_t summary_of(const uint64_t *tab, size_t b);
static uint32_t ghost_stamp(const policy *p, uint64_t e);
static size_t   take_probation(policy *p, policy_node **out, size_t n, policy_node **cur);
static size_t   take_protected(policy *p, policy_node **out, size_t n);
static int      demote_one(policy *p, unsigned steps);
static void     lirs_demote(policy *p);
static uint64_t lir_cap(const policy *p);
static int      arc_ghost(policy *p, const hyb_ghost *g);

static inline uint32_t e_fp(uint64_t e) { return (uint32_t)e; }
static inline uint32_t e_stamp(uint64_t e) { return (uint32_t)(e >> 32) & G_STAMP_MASK; }
static inline unsigned e_epoch(uint64_t e) { return (unsigned)(e >> 48) & G_EPOCH_MASK; }
static inline unsigned e_seg(uint64_t e) { return (unsigned)(e >> 60) & 1u; }
static inline unsigned e_cls(uint64_t e) { return (unsigned)(e >> 61) & 7u; }
static inline uint64_t e_make(uint32_t fp, uint32_t cstamp, unsigned epoch, unsigned seg, unsigned cls)
{
    return (uint64_t)fp | (uint64_t)(cstamp & G_STAMP_MASK) << 32 | (uint64_t)(epoch & G_EPOCH_MASK) << 48 |
           (uint64_t)(seg & 1u) << 60 | (uint64_t)(cls & 7u) << 61;
}
static inline unsigned e_age(const policy *p, uint64_t e)
{
    return (unsigned)(p->gepoch[e_seg(e)] - e_epoch(e)) & G_EPOCH_MASK;
}

/* ---- API ---- */

const policy_expert *policy_expert_at(unsigned i)
{
    return i < POLICY_EXPERTS ? &HYBRIDS[i] : NULL;
}

/* Take over the recency list's nodes: all of them protected (ref 0), so
 * the first victims are the least recently used; stamped in recency order. */
int hybrid_start(policy *p)
{
    flist_init(&p->seg[0]);
    flist_init(&p->seg[1]);
    p->nseg[0] = p->nseg[1] = 0;
    if (!(p->pfrac >= PFRAC_MIN && p->pfrac <= PFRAC_MAX))
        p->pfrac = PFRAC_INIT;
    if (p->mode.pfrac >= 0)
        p->pfrac = p->mode.pfrac;
    for (policy_node *n = p->head.prev; n != &p->head; n = n->prev) {
        n->seg = POLICY_PROTECTED;
        n->ref = 0;
        n->mcls = 0;
        n->stamp = p->tick++;
        flink_after(&p->seg[POLICY_PROTECTED], n);
        p->nseg[POLICY_PROTECTED]++;
    }
    return MEMOS_OK;
}

void hybrid_stop(policy *p)
{
    free(p->gtab);
    p->gtab = NULL;
    p->gsum = NULL;
    p->gbuckets = p->gused = 0;
    p->gpn = p->gph = 0;
    p->gpmask = 0;
    p->gfull = 0;
    p->nseg[0] = p->nseg[1] = 0;        /* (the nodes' segment links are left: a start relinks them) */
}

int hybrid_setting(policy *p, unsigned i)
{
    if (i >= POLICY_EXPERTS)
        return MEMOS_EINVAL;
    p->lirfill = HYBRIDS[i].lirs && (p->expert != i || !p->mode.lirs);   /* (entering a lirs setting) */
    p->expert = i;
    p->mode = HYBRIDS[i];
    if (p->mode.pfrac >= 0)
        p->pfrac = p->mode.pfrac;
    return MEMOS_OK;
}

int hybrid_set_balance(policy *p, double pfrac)
{
    if (!(pfrac >= PFRAC_MIN && pfrac <= PFRAC_MAX))
        return MEMOS_EINVAL;
    p->pfrac = pfrac;
    return MEMOS_OK;
}

void hybrid_access(policy *p, policy_node *n, int hit)
{
    if (hit) {
        hybrid_touch(p, n);
    } else {
        hyb_ghost g;
        hybrid_lookup(p, n->hash, &g);
        hybrid_admit(p, n, &g);
    }
    n->stamp = p->tick++;
}

/* A hit.  n->stamp is still its last access (the caller stamps it after). */
void hybrid_touch(policy *p, policy_node *n)
{
    funlink(n);
    if (n->seg == POLICY_PROBATION && p->mode.lirs) {
        /* a resident HIR block: LIR if its recency is under the LIR set's oldest */
        policy_node *tail = p->seg[POLICY_PROTECTED].fprev;
        if (p->nseg[POLICY_PROTECTED] < lir_cap(p) || tail == &p->seg[POLICY_PROTECTED] ||
            stamp_ge(n->stamp, tail->stamp)) {
            p->nseg[POLICY_PROBATION]--;
            p->nseg[POLICY_PROTECTED]++;
            n->seg = POLICY_PROTECTED;
            n->ref = 0;
            flink_after(&p->seg[POLICY_PROTECTED], n);
            if (p->nseg[POLICY_PROTECTED] > lir_cap(p))
                lirs_demote(p);
        } else {
            flink_after(&p->seg[POLICY_PROBATION], n);
        }
        return;
    }
    if (n->seg == POLICY_PROBATION) {
        p->nseg[POLICY_PROBATION]--;
        p->nseg[POLICY_PROTECTED]++;
        n->seg = POLICY_PROTECTED;
        n->ref = 0;
    } else if (n->ref < REF_MAX && !p->mode.arc) {
        n->ref++;
    }
    flink_after(&p->seg[POLICY_PROTECTED], n);
}

/* What the ghosts know of `hash`. */
void hybrid_lookup(const policy *p, uint64_t hash, hyb_ghost *g)
{
    g->slot = -1;
    if (!p->gtab)
        return;
    uint32_t fp = fp_of(hash);
    for (unsigned i = 0; p->gpmask >> (fp & 63) & 1 && i < p->gpn; i++) {   /* the latest, not yet in the table */
        unsigned k = (p->gph + i) % POLICY_GHOST_PENDING;
        uint64_t e = p->gpend[k];
        if (e_fp(e) == fp && ghost_live(p, e)) {
            g->slot = (long)(p->gbuckets * GB + k);
            g->stamp = ghost_stamp(p, e);
            g->seg = e_seg(e);
            g->age = e_age(p, e);
            g->cls = e_cls(e);
            g->fresh = g->age < G_LIMIT[g->seg];
            return;
        }
    }
    size_t bk = bucket_of(p, fp);
    if (!(p->gsum[bk] >> (fp & 63) & 1))
        return;                         /* (the summary, in cache: no line of the table read) */
    const uint64_t *b = p->gtab + bk * GB;
    for (unsigned i = 0; i < GB; i++) {
        uint64_t e = b[i];
        if (e_fp(e) == fp && ghost_live(p, e)) {
            g->slot = (long)(b - p->gtab) + (long)i;
            g->stamp = ghost_stamp(p, e);
            g->seg = e_seg(e);
            g->age = e_age(p, e);
            g->cls = e_cls(e);
            g->fresh = g->age < G_LIMIT[g->seg];
            return;
        }
    }
}

/* Before a miss's lookup: the lines it and the admit will read (the key's
 * summary word, the bucket the oldest pending ghost goes into), fetched
 * together while the shadows judge. */
void hybrid_prefetch(const policy *p, uint64_t hash)
{
    if (!p->gtab)
        return;
    __builtin_prefetch(&p->gsum[bucket_of(p, fp_of(hash))], 0, 3);
    uint64_t e = p->gpn ? p->gpend[p->gph] : 0;
    if (e)
        __builtin_prefetch(p->gtab + bucket_of(p, e_fp(e)) * GB, 1, 3);
}

/* A miss: n goes to probation, or to protected if its ghost says so (the
 * ghost is used up). */
void hybrid_admit(policy *p, policy_node *n, const hyb_ghost *g)
{
    n->seg = POLICY_PROBATION;
    n->ref = 0;
    if (g->slot >= (long)(p->gbuckets * GB)) {          /* (used up, fresh or not) */
        p->gpend[(size_t)g->slot - p->gbuckets * GB] = 0;
    } else if (g->slot >= 0) {
        p->gtab[g->slot] = 0;
        p->gused--;
        summarize(p->gtab, p->gsum, (size_t)g->slot / GB);
    }
    if (p->gpn)                         /* one pending ghost into the table an admit */
        ghost_drain(p);
    if (g->slot >= 0 && g->fresh) {
        unsigned r = g->seg;
        p->ghits[r]++;
        if (p->mode.lirs) {
            policy_node *tail = p->seg[POLICY_PROTECTED].fprev;
            if (tail != &p->seg[POLICY_PROTECTED] &&    /* (its stamp: the start of its unit) */
                stamp_ge(g->stamp + hybrid_ghost_unit(p) - 1, tail->stamp)) {
                n->seg = POLICY_PROTECTED;
                flink_after(&p->seg[POLICY_PROTECTED], n);
                p->nseg[POLICY_PROTECTED]++;
                if (p->nseg[POLICY_PROTECTED] > lir_cap(p))
                    lirs_demote(p);
                return;
            }
        } else {
            if (p->mode.arc) {
                if (arc_ghost(p, g))
                    n->seg = POLICY_PROTECTED;
                goto link;
            }
            if (g->age <= 1 && p->mode.pfrac < 0) {
                double step = 1.0 / (double)p->count;
                p->pfrac += r == 0 ? step : -step;
                p->pfrac = p->pfrac < PFRAC_MIN ? PFRAC_MIN : p->pfrac > PFRAC_MAX ? PFRAC_MAX : p->pfrac;
            }
            if (p->mode.gadmit == 1 ||
                (p->mode.gadmit >= 2 &&     /* room, leaving probation a batch of victims */
                 (double)(p->nseg[POLICY_PROTECTED] + p->batch) < (1.0 - p->pfrac) * (double)p->count))
                n->seg = POLICY_PROTECTED;
            else if (p->mode.gadmit == 3 && g->age < 8 && demote_one(p, DEMOTE_STEPS))
                n->seg = POLICY_PROTECTED;
            if (p->mode.gadmit == 3 && n->seg == POLICY_PROTECTED)
                n->ref = 1;   /* one clock pass of grace: it must outlive a lap */
        }
    }
    if (p->mode.lirs && p->lirfill) {    /* the LIR set fills first, once (not again after a
                                           batch of victims took from it: new keys would fill it) */
        if (p->nseg[POLICY_PROTECTED] < lir_cap(p))
            n->seg = POLICY_PROTECTED;
    }
link:
    flink_after(&p->seg[n->seg], n);
    p->nseg[n->seg]++;
}

size_t hybrid_evict(policy *p, policy_node **out, size_t n)
{
    size_t got = 0;
    if (p->mode.lru) {
        for (policy_node *x = p->head.prev; x != &p->head && got < n; x = x->prev)
            if (policy_ok(p, x))
                out[got++] = x;
        return got;
    }
    uint64_t target = p->mode.gadmit == 3 || p->mode.lirs ? 0 :
                      p->mode.arc ? (uint64_t)p->arcp : (uint64_t)(p->pfrac * (double)p->count);
    uint64_t over = p->nseg[POLICY_PROBATION] > target ? p->nseg[POLICY_PROBATION] - target : 0;
    policy_node *cur = p->seg[POLICY_PROBATION].fprev;
    got = take_probation(p, out, over < n ? (size_t)over : n, &cur);
    if (got < n)
        got += take_protected(p, out + got, n - got);
    if (got < n)
        got += take_probation(p, out + got, n - got, &cur);
    return got;
}

/* An evicted node leaves its fingerprint, stamp and class bits in the ghost
 * ring of its segment. */
void hybrid_remove(policy *p, policy_node *n, int evicted)
{
    if (evicted)
        ghost_add(p, n->seg, n->hash, n->stamp, n->mcls);
    if (evicted && p->lirfill && p->nseg[POLICY_PROTECTED] >= lir_cap(p))
        p->lirfill = 0;                 /* the LIR set was full at an eviction: filled */
    funlink(n);
    p->nseg[n->seg]--;
}

/* The cache's size when full: the ghost table is made for it (remade, its
 * ghosts kept, when the size moves by more than an eighth). */
void hybrid_resize(policy *p, uint64_t full)
{
    full = full ? full : 1;
    if (p->gtab && full + p->gfull / 8 >= p->gfull && full <= p->gfull + p->gfull / 8)
        return;
    ghost_drain_all(p);                 /* (into the old table, then moved with it) */
    uint64_t room = full < G_FLOOR ? G_FLOOR : full;
    size_t nb = (size_t)((room * G_SLOTS + GB - 1) / GB);
    nb = nb < GB_MIN ? GB_MIN : nb;
    void *mem = NULL;
    if (nb > SIZE_MAX / ((GB + 1) * sizeof(uint64_t)) ||
        posix_memalign(&mem, 64, nb * (GB + 1) * sizeof(uint64_t))) {
        p->oom = 1;                     /* the old table (or none) stays */
        return;
    }
    uint64_t *tab = mem, *sum = tab + nb * GB;
    memset(tab, 0, nb * (GB + 1) * sizeof *tab);
    unsigned shift = 0;
    while (((uint64_t)G_STAMP_UNIT << (shift + 1)) <= full)
        shift++;
    size_t used = 0;
    uint64_t *old = p->gtab;
    size_t oldn = old ? p->gbuckets * GB : 0;
    uint8_t oldshift = p->gshift;
    p->gshift = (uint8_t)shift;
    for (size_t i = 0; i < oldn; i++) {
        uint64_t e = old[i];
        if (!e || !ghost_live(p, e))
            continue;
        uint32_t now = p->tick >> oldshift;
        uint32_t st = (now - ((now - e_stamp(e)) & G_STAMP_MASK)) << oldshift;
        used += (size_t)ghost_put(p, tab, sum, nb, e_make(e_fp(e), st >> shift, e_epoch(e), e_seg(e), e_cls(e)));
    }
    free(old);
    p->gtab = tab;
    p->gsum = sum;
    p->gbuckets = nb;
    p->gused = used;
    p->gfull = full;
    p->gunit = full / 8 ? full / 8 : 1;
    set_limits(p);
}

policy_node *hybrid_list(policy *p, unsigned i) { return &p->seg[i]; }

int hybrid_place(policy *p, policy_node *n, unsigned i)
{
    n->seg = (uint8_t)i;
    flink_after(p->seg[i].fprev, n);
    p->nseg[i]++;
    return MEMOS_OK;
}

uint64_t policy_ghost_bytes(const policy *p)
{
    return p->gtab ? (uint64_t)p->gbuckets * (GB + 1) * sizeof *p->gtab : 0;
}

uint32_t hybrid_ghost_unit(const policy *p) { return 1u << p->gshift; }

static int hyb_start_fixed(policy *p)
{
    unsigned i = (unsigned)(p->ops->name[8] - '0');
    p->pfrac = PFRAC_INIT;
    hybrid_setting(p, i);
    return hybrid_start(p);
}

#define HYB_OPS(i) { .name = "lru_lfu@" #i, .lists = 2, .rings = 2, .format = POLICY_STATE_VERSION, \
    .start = hyb_start_fixed, .stop = hybrid_stop, .access = hybrid_access, .evict = hybrid_evict, \
    .remove = hybrid_remove, .resize = hybrid_resize, .check = hybrid_check, .list = hybrid_list, \
    .place = hybrid_place, .setting = hybrid_setting }

const policy_ops policy_hybrid_ops[POLICY_EXPERTS] = {
    HYB_OPS(0), HYB_OPS(1), HYB_OPS(2), HYB_OPS(3), HYB_OPS(4), HYB_OPS(5), HYB_OPS(6), HYB_OPS(7),
    HYB_OPS(8),
};

/* ---- private helpers: victims ---- */

/* Oldest evictable probation nodes, walking from *cur towards the front. */
static size_t take_probation(policy *p, policy_node **out, size_t n, policy_node **cur)
{
    size_t got = 0;
    policy_node *h = &p->seg[POLICY_PROBATION];
    while (*cur != h && got < n) {
        policy_node *x = *cur;
        *cur = x->fprev;
        if (policy_ok(p, x))
            out[got++] = x;
    }
    return got;
}

/* The clock over protected: from the oldest, a node with ref > 0 loses one
 * and goes to the front; one with ref 0 is a victim.  At most CLOCK_STEPS
 * passes a victim: past them the oldest goes whatever its ref (each node is
 * then seen once more at most, so the walk ends). */
static size_t take_protected(policy *p, policy_node **out, size_t n)
{
    size_t got = 0;
    policy_node *h = &p->seg[POLICY_PROTECTED];
    uint64_t budget = (uint64_t)CLOCK_STEPS * n;
    uint64_t seen = 0, len = p->nseg[POLICY_PROTECTED];
    for (policy_node *x = h->fprev; x != h && got < n && seen <= len + budget; seen++) {
        policy_node *prev = x->fprev;
        if (x->ref > 0 && budget > 0) {
            x->ref--;
            budget--;
            if (prev == h) {   /* already the front: pass it again */
                prev = x;
            } else {
                funlink(x);
                flink_after(h, x);
            }
        } else if (policy_ok(p, x)) {
            out[got++] = x;
        }
        x = prev;
    }
    return got;
}

/* gadmit 3: a ghost hit finds protected full.  Up to `steps` clock steps
 * over its oldest node: one with ref 0 (not hit since the clock last passed)
 * goes back to probation's front and the ghost hit takes its place (returns
 * 1); one with ref > 0 loses one and goes to the front.  If none is found
 * the ghost hit waits in probation (returns 0). */
static int demote_one(policy *p, unsigned steps)
{
    policy_node *h = &p->seg[POLICY_PROTECTED];
    for (; steps > 0; steps--) {
        policy_node *x = h->fprev;
        if (x == h)
            return 1;
        funlink(x);
        if (x->ref > 0) {
            x->ref--;
            flink_after(h, x);
            continue;
        }
        x->seg = POLICY_PROBATION;
        flink_after(&p->seg[POLICY_PROBATION], x);
        p->nseg[POLICY_PROTECTED]--;
        p->nseg[POLICY_PROBATION]++;
        return 1;
    }
    return 0;
}

/* The LIR set's size: the count less the resident HIR blocks (pfrac of
 * it, at least one; a batch of victims larger than that comes from the
 * LIR set's oldest, by the clock). */
static uint64_t lir_cap(const policy *p)
{
    uint64_t hir = (uint64_t)(p->pfrac * (double)p->count + 0.5);
    hir = hir < 1 ? 1 : hir;
    return p->count > hir ? p->count - hir : 0;
}

/* lirs: protected is over the LIR set's size: its oldest goes back to
 * probation's front (lirs 2: an oldest with ref > 0 loses one and goes to
 * the front instead, LIRS_STEPS times at most). */
static void lirs_demote(policy *p)
{
    policy_node *h = &p->seg[POLICY_PROTECTED];
    policy_node *x = h->fprev;
    for (unsigned s = 0; p->mode.lirs == 2 && s < LIRS_STEPS && x->ref > 0 && x != h; s++) {
        x->ref--;
        funlink(x);
        flink_after(h, x);
        x = h->fprev;
    }
    if (x == h)
        return;
    funlink(x);
    x->seg = POLICY_PROBATION;
    x->ref = 0;
    flink_after(&p->seg[POLICY_PROBATION], x);
    p->nseg[POLICY_PROTECTED]--;
    p->nseg[POLICY_PROBATION]++;
}

/* arc: a ghost hit within B1 (evicted from T1 among the last size - |T1|
 * evictions of ring 0) moves p up by max(1, |B2| / |B1|), one within B2
 * down by max(1, |B1| / |B2|) (|B1| ~ size - |T1|, |B2| ~ size - |T2|), and
 * returns 1: the key goes to T2.  Older ghosts: 0 (a new key, to T1). */
static int arc_ghost(policy *p, const hyb_ghost *g)
{
    double c = (double)p->count, t1 = (double)p->nseg[POLICY_PROBATION];
    double t2 = (double)p->nseg[POLICY_PROTECTED];
    double b1 = c - t1 > 1 ? c - t1 : 1, b2 = c - t2 > 1 ? c - t2 : 1;
    double age = (double)g->age * (double)p->gunit;
    if (g->seg == 0 && age < b1) {
        p->arcp += b2 > b1 ? b2 / b1 : 1.0;
        p->arcp = p->arcp < c ? p->arcp : c;
        return 1;
    }
    if (g->seg == 1 && age < b2) {
        p->arcp -= b1 > b2 ? b1 / b2 : 1.0;
        p->arcp = p->arcp > 0 ? p->arcp : 0;
        return 1;
    }
    return 0;
}

/* ---- private helpers: ghosts ---- */

static uint32_t fp_of(uint64_t hash)
{
    uint64_t x = hash;
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    uint32_t f = (uint32_t)(x >> 32);
    return f ? f : 1;
}

static size_t bucket_of(const policy *p, uint32_t fp)
{
    return (size_t)(((uint64_t)fp * p->gbuckets) >> 32);
}

/* Epochs a ghost lives: its ring's limit, longer for class bit 0 (set by
 * hybrid_resize). */
static unsigned g_limit(const policy *p, uint64_t e)
{
    return p->glimit[e_seg(e)][e_cls(e) & HYB_CLS_KEEP];
}

static void set_limits(policy *p)
{
    for (unsigned r = 0; r < 2; r++) {
        uint64_t k = G_KEEP_MIN / p->gunit + 1;
        k = k > (uint64_t)G_LIMIT[r] * G_KEEP ? k : (uint64_t)G_LIMIT[r] * G_KEEP;
        p->glimit[r][0] = (uint16_t)G_LIMIT[r];
        p->glimit[r][1] = (uint16_t)(k < G_EPOCH_MASK / 2 ? k : G_EPOCH_MASK / 2);
        p->grecip[r][0] = (1u << 20) / p->glimit[r][0];
        p->grecip[r][1] = (1u << 20) / p->glimit[r][1];
    }
}

static int ghost_live(const policy *p, uint64_t e)
{
    return e && e_age(p, e) < g_limit(p, e);
}

/* A ghost's stamp as the access clock (the start of its unit). */
static uint32_t ghost_stamp(const policy *p, uint64_t e)
{
    uint32_t now = p->tick >> p->gshift;
    return (now - ((now - e_stamp(e)) & G_STAMP_MASK)) << p->gshift;
}

/* Into its bucket of tab (nb buckets): over an entry of the same
 * fingerprint, else an empty one, else the one furthest through its life
 * (one aged out first).  Returns 1 if it took an empty entry. */
static int ghost_put(policy *p, uint64_t *tab, uint64_t *sum, size_t nb, uint64_t e)
{
    size_t bk = (size_t)(((uint64_t)e_fp(e) * nb) >> 32);
    uint64_t *b = tab + bk * GB;
    unsigned pick = GB, empty = GB;
    for (unsigned i = 0; i < GB; i++) {
        if (!b[i]) {
            empty = empty < GB ? empty : i;
        } else if (e_fp(b[i]) == e_fp(e)) {
            pick = i;
            break;
        }
    }
    if (pick == GB)
        pick = empty < GB ? empty : furthest(p, b);
    uint64_t old = b[pick];
    b[pick] = e;
    if (!old)
        sum[bk] |= 1ull << (e_fp(e) & 63);
    else if (e_fp(old) != e_fp(e))
        summarize(tab, sum, bk);
    return !old;
}

/* A full bucket's entry furthest through its life: the first aged out, else
 * the largest age x 2^20 / limit (the last of equals). */
static unsigned furthest(const policy *p, const uint64_t *b)
{
    unsigned pick = 0;
    uint64_t best = 0;
    for (unsigned i = 0; i < GB; i++) {
        uint64_t x = b[i];
        unsigned r = e_seg(x), k = e_cls(x) & HYB_CLS_KEEP;
        unsigned a = (unsigned)(p->gepoch[r] - e_epoch(x)) & G_EPOCH_MASK;
        if (a >= p->glimit[r][k])
            return i;
        uint64_t sc = (uint64_t)a * p->grecip[r][k];
        if (sc >= best) {
            best = sc;
            pick = i;
        }
    }
    return pick;
}

/* Bucket b's summary: the bit (fp % 64) of each entry's fingerprint, so a
 * lookup whose bit is clear reads no line of the table (exact: no ghost is
 * missed; an aged-out entry may leave its bit until it is overwritten). */
static uint64_t summary_of(const uint64_t *tab, size_t b)
{
    uint64_t s = 0;
    for (unsigned i = 0; i < GB; i++)
        s |= tab[b * GB + i] ? 1ull << (e_fp(tab[b * GB + i]) & 63) : 0;
    return s;
}

static void summarize(const uint64_t *tab, uint64_t *sum, size_t b)
{
    sum[b] = summary_of(tab, b);
}

/* Remember the evicted key in ring r; on no table the ghosts stay as they
 * are (the policy still works, it adapts less). */
static void ghost_add(policy *p, unsigned r, uint64_t hash, uint32_t stamp, unsigned cls)
{
    if (!p->gtab)
        return;
    uint32_t fp = fp_of(hash);
    if (p->gpn == POLICY_GHOST_PENDING)
        ghost_drain(p);                 /* (a batch larger than the pending room) */
    if (!p->gpn)
        __builtin_prefetch(p->gtab + bucket_of(p, fp) * GB, 1, 1);
    p->gpend[(p->gph + p->gpn++) % POLICY_GHOST_PENDING] = e_make(fp, stamp >> p->gshift, p->gepoch[r], r, cls);
    p->gpmask |= 1ull << (fp & 63);
    if (++p->gev[r] >= p->gunit) {
        p->gev[r] = 0;
        p->gepoch[r] = (uint16_t)((p->gepoch[r] + 1) & G_EPOCH_MASK);
    }
}

/* The oldest pending ghost into the table (one that was used up: nothing),
 * the next one's bucket fetched for the next admit. */
static void ghost_drain(policy *p)
{
    uint64_t e = p->gpend[p->gph];
    p->gpend[p->gph] = 0;
    p->gph = (uint8_t)((p->gph + 1) % POLICY_GHOST_PENDING);
    p->gpn--;
    p->gpmask = p->gpn ? p->gpmask : 0;
    if (e && ghost_live(p, e))
        p->gused += (size_t)ghost_put(p, p->gtab, p->gsum, p->gbuckets, e);
    if (p->gpn && p->gpend[p->gph])
        __builtin_prefetch(p->gtab + bucket_of(p, e_fp(p->gpend[p->gph])) * GB, 1, 1);
}

static void ghost_drain_all(policy *p)
{
    while (p->gpn && p->gtab)
        ghost_drain(p);
    p->gpn = p->gtab ? p->gpn : 0;
    p->gpmask = p->gpn ? p->gpmask : 0;
}

/* ---- dump and restore of the ghosts ---- */

/* A live ghost of fingerprint fp in the table (a pending one will replace it). */
static int in_table(const policy *p, uint32_t fp)
{
    const uint64_t *b = p->gtab + bucket_of(p, fp) * GB;
    for (unsigned i = 0; i < GB; i++)
        if (e_fp(b[i]) == fp && ghost_live(p, b[i]))
            return 1;
    return 0;
}

size_t hybrid_dump_ghosts(const policy *p, unsigned r, policy_ghost *out, size_t max, uint64_t *epoch)
{
    size_t k = 0;
    *epoch = p->gepoch[r & 1];
    for (size_t i = 0; p->gtab && i < p->gbuckets * GB; i++) {
        uint64_t e = p->gtab[i];
        if (!ghost_live(p, e) || e_seg(e) != (r & 1))
            continue;
        if (k < max) {
            out[k].fp = e_fp(e);
            out[k].stamp = ghost_stamp(p, e);
            out[k].age = (uint16_t)e_age(p, e);
            out[k].cls = (uint8_t)e_cls(e);
        }
        k++;
    }
    for (unsigned i = 0; p->gtab && i < p->gpn; i++) {  /* (the pending ones: not yet in the table) */
        uint64_t e = p->gpend[(p->gph + i) % POLICY_GHOST_PENDING];
        if (!ghost_live(p, e) || e_seg(e) != (r & 1) || in_table(p, e_fp(e)))
            continue;                   /* (a fingerprint once: the pending one replaces it) */
        if (k < max) {
            out[k].fp = e_fp(e);
            out[k].stamp = ghost_stamp(p, e);
            out[k].age = (uint16_t)e_age(p, e);
            out[k].cls = (uint8_t)e_cls(e);
        }
        k++;
    }
    return k;
}

/* Ring r's ghosts into the table (made for the count if there is none yet);
 * MEMOS_EINVAL if one is not a ghost or a fingerprint comes twice. */
int hybrid_restore_ghosts(policy *p, unsigned r, const policy_ghost *g, size_t len, uint64_t epoch)
{
    if (r > 1 || epoch > G_EPOCH_MASK)
        return MEMOS_EINVAL;
    if (!p->gtab)
        hybrid_resize(p, p->count ? p->count : 1);
    if (!p->gtab)
        return MEMOS_ENOMEM;
    ghost_drain_all(p);
    p->gepoch[r] = (uint16_t)epoch;
    for (size_t i = 0; i < len; i++) {
        if (!g[i].fp || g[i].fp > UINT32_MAX || g[i].cls > 7 ||
            g[i].age >= g_limit(p, e_make(1, 0, 0, r, g[i].cls)))
            return MEMOS_EINVAL;
        uint32_t fp = (uint32_t)g[i].fp;
        uint64_t *b = p->gtab + bucket_of(p, fp) * GB;
        unsigned free_ = GB;
        for (unsigned j = 0; j < GB; j++) {
            if (b[j] && e_fp(b[j]) == fp)
                return MEMOS_EINVAL;        /* a fingerprint twice: not a dump */
            if (!b[j] && free_ == GB)
                free_ = j;
        }
        if (free_ == GB)
            continue;                       /* (a smaller table: its bucket is full) */
        b[free_] = e_make(fp, g[i].stamp >> p->gshift, (unsigned)(epoch - g[i].age) & G_EPOCH_MASK, r,
                          g[i].cls);
        summarize(p->gtab, p->gsum, bucket_of(p, fp));
        p->gused++;
    }
    return MEMOS_OK;
}

/* ---- debugging ---- */

static int check_ghosts(const policy *p, char *why, size_t whylen)
{
    size_t used = 0;
    for (size_t i = 0; p->gtab && i < p->gbuckets * GB; i++) {
        uint64_t e = p->gtab[i];
        if (!e)
            continue;
        used++;
        if (bucket_of(p, e_fp(e)) != i / GB)
            PFAIL("policy: ghost %zu is outside its bucket", i);
        for (size_t j = i / GB * GB; j < i; j++)
            if (p->gtab[j] && e_fp(p->gtab[j]) == e_fp(e))
                PFAIL("policy: ghost %zu twice in its bucket", i);
    }
    if (used != p->gused)
        PFAIL("policy: ghost table holds %zu, counter says %zu", used, p->gused);
    for (size_t b = 0; p->gtab && b < p->gbuckets; b++)
        if (p->gsum[b] != summary_of(p->gtab, b))
            PFAIL("policy: ghost bucket %zu's summary is not its entries'", b);
    return MEMOS_OK;
}

int hybrid_check(const policy *p, char *why, size_t whylen)
{
    uint64_t m = 0;
    for (unsigned s = 0; s < 2; s++) {
        uint64_t k = 0;
        for (const policy_node *x = p->seg[s].fnext; x != &p->seg[s]; x = x->fnext) {
            if (x->seg != s || x->fnext->fprev != x || !x->linked || x->ref > REF_MAX)
                PFAIL("policy: node on wrong lru_lfu segment %u", s);
            if (++k > p->count)
                break;
        }
        if (k != p->nseg[s])
            PFAIL("policy: segment %u holds %llu, counter says %llu", s,
                  (unsigned long long)k, (unsigned long long)p->nseg[s]);
        m += k;
    }
    if (m != p->count)
        PFAIL("policy: segments hold %llu, count says %llu",
              (unsigned long long)m, (unsigned long long)p->count);
    if (p->pfrac < PFRAC_MIN || p->pfrac > PFRAC_MAX)
        PFAIL("policy: balance %g out of range", p->pfrac);
    if (p->expert >= POLICY_EXPERTS)
        PFAIL("policy: setting %u out of range", p->expert);
    return check_ghosts(p, why, whylen);
}
