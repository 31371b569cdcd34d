/*
 * hybrid.c — lru_lfu's two-segment hybrid, at one of its settings
 * ("lru_lfu@i"; lru_lfu.c runs it with a miniature simulation choosing the
 * setting).  After ARC, 2Q and S3-FIFO:
 *
 *        admit ──► probation (FIFO) ──hit──► protected (LRU + aging clock)
 *                     │ evict                     │ evict (ref == 0)
 *                     ▼                           ▼
 *              ghost 0 (2 × count)          ghost 1 (1 × count)
 *                     │                           │
 *                     └──── an admit whose key is in a ghost goes
 *                           straight to protected ◄┘
 *
 * A hit in probation promotes to protected (ref = 0); a hit in protected
 * moves the node to the front and adds 1 to its 2-bit `ref` (max 3).
 * Victims come from probation while it holds more than its target (pfrac ×
 * count), else from protected: its oldest node with ref == 0; a node with
 * ref > 0 passed on the way loses 1 and goes back to the front (a clock:
 * frequency that ages).  HYBRIDS lists six settings (policy_expert): 0 LRU,
 * 1 the ghost rule (pfrac starts at 0.5 and moves by 1/count on each ghost
 * hit among the W = count/4 most recent insertions of its ring: ghost 0 up,
 * ghost 1 down, clamped to [0.01, 0.9]), 2 pfrac 0.1, 3 pfrac 0.01 with
 * ghost hits admitted to protected only while it has room, 4 pfrac 0.3, 5
 * pfrac 0.01 where a recent ghost hit may also take the place of a cold
 * protected node (LIRS-like on loops).
 *
 * Ghosts.  32-bit fingerprints (the high half of the mixed key hash) in two
 * FIFO rings, 4 bytes a slot, and one open-addressing table of uint32 (where
 * the fingerprint is in its ring, and a 7-bit tag of it, so a probe reads a
 * ring slot only on a tag match), grown at 3/4 full: at most 3 × count live
 * ghosts (each ring's target at most GHOST_MAX), stale ring slots (left by
 * ghost hits) at most a quarter of each ring's target; rings and table grow
 * by doubling (powers of two: slots by mask): 31 to 62 bytes per entry
 * with all ghosts live, the slack of growth included.  A fingerprint collision (2^-32 a
 * lookup) makes one admit look like a ghost hit: harmless.
 *
 * Cost.  admit, touch and remove O(1): list moves, and on an admit or an
 * eviction one ghost lookup; a victim O(skipped) plus the clock's passes
 * (each node at most REF_MAX + 1 times a walk).
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
#define GHOST_MIN       16u     /* ring target floor */
#define DEMOTE_STEPS    2u      /* gadmit 3: clock steps one ghost hit may take */
#define SEQ_MASK        0xffffffu   /* a ring's sequence numbers as the table keeps them (24 bits) */
#define SLOT_MASK       0x1ffffffu  /* a table entry's low 25 bits: where; the high 7: a tag of the fingerprint */
#define GHOST_MAX       (1u << 23)  /* a ring's target at most (its length stays under 2^24) */

static const policy_expert HYBRIDS[POLICY_EXPERTS] = {
    { 0.5,  1, 1 },     /* 0 lru: victims in recency order */
    { -1.0, 0, 1 },     /* 1 adaptive split, ghost hits to protected (ARC-like) */
    { 0.1,  0, 1 },     /* 2 small probation, ghost hits to protected (S3-FIFO-like) */
    { 0.01, 0, 2 },     /* 3 tiny probation, ghost hits only fill protected (LIRS-like, loops) */
    { 0.3,  0, 1 },     /* 4 medium probation */
    { 0.01, 0, 3 },     /* 5 tiny probation, ghost hits replace cold protected nodes (loops) */
};

/* ---- private prototypes ---- */

static uint32_t fp_of(uint64_t hash);
static size_t   home(const policy *p, uint32_t fp);
static uint32_t entry_fp(const policy *p, uint32_t v);
static long     ghost_find(const policy *p, uint32_t fp);
static long     ghost_find_entry(const policy *p, uint32_t fp, uint32_t v);
static void     ghost_del(policy *p, size_t i);
static void     ghost_add(policy *p, unsigned r, uint32_t fp);
static void     ghost_insert(policy *p, uint32_t v, uint32_t fp);
static int      ghost_grow_table(policy *p);
static int      ghost_grow_ring(ghost_ring *g);
static size_t   ghost_target(const policy *p, unsigned r);
static size_t   take_probation(policy *p, policy_node **out, size_t n, policy_node **cur);
static size_t   take_protected(policy *p, policy_node **out, size_t n);
static int      demote_one(policy *p, unsigned steps);
static void     admit(policy *p, policy_node *n);

/* ---- API ---- */

const policy_expert *policy_expert_at(unsigned i)
{
    return i < POLICY_EXPERTS ? &HYBRIDS[i] : NULL;
}

/* Take over the recency list's nodes: all of them protected (ref 0), so
 * the first victims are the least recently used. */
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
        flink_after(&p->seg[POLICY_PROTECTED], n);
        p->nseg[POLICY_PROTECTED]++;
    }
    return MEMOS_OK;
}

void hybrid_stop(policy *p)
{
    for (unsigned r = 0; r < 2; r++) {
        free(p->ring[r].fp);
        memset(&p->ring[r], 0, sizeof p->ring[r]);
    }
    free(p->gtab);
    p->gtab = NULL;
    p->gmask = p->gused = 0;
    p->nseg[0] = p->nseg[1] = 0;        /* (the nodes' segment links are left: a start relinks them) */
}

int hybrid_setting(policy *p, unsigned i)
{
    if (i >= POLICY_EXPERTS)
        return MEMOS_EINVAL;
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
    if (!hit) {
        admit(p, n);
        return;
    }
    funlink(n);
    if (n->seg == POLICY_PROBATION) {
        p->nseg[POLICY_PROBATION]--;
        p->nseg[POLICY_PROTECTED]++;
        n->seg = POLICY_PROTECTED;
        n->ref = 0;
    } else if (n->ref < REF_MAX) {
        n->ref++;
    }
    flink_after(&p->seg[POLICY_PROTECTED], n);
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
    uint64_t target = p->mode.gadmit == 3 ? 0 : (uint64_t)(p->pfrac * (double)p->count);
    uint64_t over = p->nseg[POLICY_PROBATION] > target ? p->nseg[POLICY_PROBATION] - target : 0;
    policy_node *cur = p->seg[POLICY_PROBATION].fprev;
    got = take_probation(p, out, over < n ? (size_t)over : n, &cur);
    if (got < n)
        got += take_protected(p, out + got, n - got);
    if (got < n)
        got += take_probation(p, out + got, n - got, &cur);
    return got;
}

/* An evicted node leaves its fingerprint in the ghost of its segment. */
void hybrid_remove(policy *p, policy_node *n, int evicted)
{
    if (evicted)
        ghost_add(p, n->seg, fp_of(n->hash));
    funlink(n);
    p->nseg[n->seg]--;
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
    return (p->ring[0].cap + p->ring[1].cap) * sizeof(uint32_t) +
           (p->gtab ? (p->gmask + 1) * sizeof *p->gtab : 0);
}

static int hyb_start_fixed(policy *p)
{
    unsigned i = (unsigned)(p->ops->name[8] - '0');
    p->pfrac = PFRAC_INIT;
    hybrid_setting(p, i);
    return hybrid_start(p);
}

static void hyb_resize(policy *p, uint64_t full) {}

#define HYB_OPS(i) { .name = "lru_lfu@" #i, .lists = 2, .rings = 2, .format = POLICY_STATE_VERSION, \
    .start = hyb_start_fixed, .stop = hybrid_stop, .access = hybrid_access, .evict = hybrid_evict, \
    .remove = hybrid_remove, .resize = hyb_resize, .check = hybrid_check, .list = hybrid_list, \
    .place = hybrid_place, .setting = hybrid_setting }

const policy_ops policy_hybrid_ops[POLICY_EXPERTS] = {
    HYB_OPS(0), HYB_OPS(1), HYB_OPS(2), HYB_OPS(3), HYB_OPS(4), HYB_OPS(5),
};

/* ---- private helpers: admission, victims ---- */

static void admit(policy *p, policy_node *n)
{
    n->seg = POLICY_PROBATION;
    n->ref = 0;
    uint32_t fp = fp_of(n->hash);
    long i = ghost_find(p, fp);
    if (i >= 0) {
        uint32_t v = (p->gtab[i] & SLOT_MASK) - 1;
        unsigned r = v & 1;
        uint64_t age = (p->ring[r].next_seq - (v >> 1)) & SEQ_MASK;
        uint64_t w = p->count / 4 ? p->count / 4 : 1;
        if (age <= w && p->mode.pfrac < 0) {
            double step = 1.0 / (double)p->count;
            p->pfrac += r == 0 ? step : -step;
            p->pfrac = p->pfrac < PFRAC_MIN ? PFRAC_MIN : p->pfrac > PFRAC_MAX ? PFRAC_MAX : p->pfrac;
        }
        p->ghits[r]++;
        p->ring[r].live--;
        ghost_del(p, (size_t)i);
        if (p->mode.gadmit == 1 ||
            (p->mode.gadmit >= 2 &&     /* room, leaving probation a batch of victims */
             (double)(p->nseg[POLICY_PROTECTED] + p->batch) < (1.0 - p->pfrac) * (double)p->count))
            n->seg = POLICY_PROTECTED;
        else if (p->mode.gadmit == 3 && age <= p->count && demote_one(p, DEMOTE_STEPS))
            n->seg = POLICY_PROTECTED;
        if (p->mode.gadmit == 3 && n->seg == POLICY_PROTECTED)
            n->ref = 1;   /* one clock pass of grace: it must outlive a lap */
    }
    flink_after(&p->seg[n->seg], n);
    p->nseg[n->seg]++;
}

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
 * and goes to the front; one with ref 0 is a victim.  Each node is passed at
 * most REF_MAX + 1 times, so the walk ends. */
static size_t take_protected(policy *p, policy_node **out, size_t n)
{
    size_t got = 0;
    policy_node *h = &p->seg[POLICY_PROTECTED];
    uint64_t budget = (REF_MAX + 1) * p->nseg[POLICY_PROTECTED] + 1;
    for (policy_node *x = h->fprev; x != h && got < n && budget > 0; budget--) {
        policy_node *prev = x->fprev;
        if (x->ref > 0) {
            x->ref--;
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

/* ---- private helpers: ghosts ----
 *
 * A table entry: its low 25 bits v + 1, v = (sequence number & SEQ_MASK)
 * << 1 | ring, its high 7 bits the fingerprint's top 7 (a tag: a probe that
 * passes an entry of another tag reads no ring).  The ring holds the
 * sequence numbers (next_seq - len, next_seq], oldest at tail, so an
 * entry's slot follows from its age; the fingerprint is read there.  Linear
 * probing, backward-shift deletion, no tombstones. */

static uint32_t fp_of(uint64_t hash)
{
    uint64_t x = hash;
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return (uint32_t)(x >> 32);
}

static size_t home(const policy *p, uint32_t fp)
{
    return (size_t)(fp * 2654435761u) & p->gmask;
}

static uint32_t tag_of(uint32_t fp) { return fp >> 25; }
static uint32_t entry_of(uint32_t v, uint32_t fp) { return v | tag_of(fp) << 25; }

static uint32_t entry_fp(const policy *p, uint32_t e)
{
    uint32_t v = (e & SLOT_MASK) - 1;
    const ghost_ring *g = &p->ring[v & 1];
    size_t age = (size_t)((g->next_seq - (v >> 1)) & SEQ_MASK);
    return g->fp[(g->tail + g->len - 1 - age) & (g->cap - 1)];
}

static long ghost_find(const policy *p, uint32_t fp)
{
    if (!p->gtab)
        return -1;
    for (size_t i = home(p, fp); p->gtab[i]; i = (i + 1) & p->gmask)
        if (p->gtab[i] >> 25 == tag_of(fp) && entry_fp(p, p->gtab[i]) == fp)
            return (long)i;
    return -1;
}

static long ghost_find_entry(const policy *p, uint32_t fp, uint32_t v)
{
    if (!p->gtab)
        return -1;
    for (size_t i = home(p, fp); p->gtab[i]; i = (i + 1) & p->gmask)
        if (p->gtab[i] == entry_of(v, fp))
            return (long)i;
    return -1;
}

static void ghost_del(policy *p, size_t i)
{
    p->gtab[i] = 0;
    p->gused--;
    for (size_t j = (i + 1) & p->gmask; p->gtab[j]; j = (j + 1) & p->gmask) {
        size_t h = home(p, entry_fp(p, p->gtab[j]));
        if (((j - h) & p->gmask) >= ((j - i) & p->gmask)) {
            p->gtab[i] = p->gtab[j];
            p->gtab[j] = 0;
            i = j;
        }
    }
}

static void ghost_insert(policy *p, uint32_t v, uint32_t fp)
{
    size_t i = home(p, fp);
    while (p->gtab[i])
        i = (i + 1) & p->gmask;
    p->gtab[i] = entry_of(v & SLOT_MASK, fp);
    p->gused++;
}

static size_t ghost_target(const policy *p, unsigned r)
{
    size_t t = (size_t)(r == 0 ? 2 * p->count : p->count);
    return t < GHOST_MIN ? GHOST_MIN : t > GHOST_MAX ? GHOST_MAX : t;
}

/* Remember fp in ring r (replacing any ghost of the same fingerprint), then
 * drop the oldest ring slots while the live ghosts exceed the ring's target
 * or the ring (stale slots too) exceeds it by a quarter.  On no memory the
 * ghosts stay as they are (the policy still works, it adapts less). */
static void ghost_add(policy *p, unsigned r, uint32_t fp)
{
    ghost_ring *g = &p->ring[r];
    if ((g->len == g->cap && ghost_grow_ring(g) != MEMOS_OK) ||
        ((p->gused + 1) * 4 > (p->gtab ? p->gmask + 1 : 0) * 3 && ghost_grow_table(p) != MEMOS_OK)) {
        p->oom = 1;
        return;
    }
    long old = ghost_find(p, fp);
    if (old >= 0) {
        p->ring[((p->gtab[old] & SLOT_MASK) - 1) & 1].live--;
        ghost_del(p, (size_t)old);
    }
    uint64_t seq = ++g->next_seq;
    g->fp[(g->tail + g->len) & (g->cap - 1)] = fp;
    g->len++;
    g->live++;
    ghost_insert(p, (uint32_t)((((seq & SEQ_MASK) << 1) | r) + 1), fp);
    size_t target = ghost_target(p, r);
    while (g->live > target || g->len > target + target / 4) {
        uint64_t oldest = g->next_seq - g->len + 1;
        long j = ghost_find_entry(p, g->fp[g->tail], (uint32_t)((((oldest & SEQ_MASK) << 1) | r) + 1));
        if (j >= 0) {
            ghost_del(p, (size_t)j);
            g->live--;
        }
        g->tail = (g->tail + 1) & (g->cap - 1);
        g->len--;
    }
}

static int ghost_grow_ring(ghost_ring *g)
{
    size_t cap = g->cap ? g->cap * 2 : 64;     /* a power of two: slots by mask */
    uint32_t *a = malloc(cap * sizeof *a);
    if (!a)
        return MEMOS_ENOMEM;
    for (size_t i = 0; i < g->len; i++)
        a[i] = g->fp[(g->tail + i) & (g->cap - 1)];
    free(g->fp);
    g->fp = a;
    g->cap = cap;
    g->tail = 0;
    return MEMOS_OK;
}

static int ghost_grow_table(policy *p)
{
    size_t n = p->gtab ? (p->gmask + 1) * 2 : 128;
    uint32_t *old = p->gtab;
    size_t oldn = old ? p->gmask + 1 : 0;
    uint32_t *t = calloc(n, sizeof *t);
    if (!t)
        return MEMOS_ENOMEM;
    p->gtab = t;
    p->gmask = n - 1;
    p->gused = 0;
    for (size_t i = 0; i < oldn; i++)
        if (old[i])
            ghost_insert(p, old[i], entry_fp(p, old[i]));
    free(old);
    return MEMOS_OK;
}

/* ---- dump and restore of the ghosts ---- */

size_t hybrid_dump_ghosts(const policy *p, unsigned r, uint64_t *fp, uint8_t *live,
                          size_t max, uint64_t *clock)
{
    const ghost_ring *g = &p->ring[r & 1];
    *clock = g->next_seq;
    for (size_t i = 0; i < g->len && i < max; i++) {
        uint64_t seq = g->next_seq - g->len + 1 + i;
        uint32_t f = g->fp[(g->tail + i) & (g->cap - 1)];
        fp[i] = f;
        live[i] = ghost_find_entry(p, f, (uint32_t)((((seq & SEQ_MASK) << 1) | (r & 1)) + 1)) >= 0;
    }
    return g->len;
}

int hybrid_restore_ghosts(policy *p, unsigned r, const uint64_t *fp, const uint8_t *live,
                          size_t len, uint64_t clock)
{
    ghost_ring *g = &p->ring[r];
    if (clock < len || g->len || len > SEQ_MASK)
        return MEMOS_EINVAL;
    while (g->cap < len)
        if (ghost_grow_ring(g) != MEMOS_OK)
            return MEMOS_ENOMEM;
    g->tail = 0;
    g->next_seq = clock;
    for (size_t i = 0; i < len; i++) {
        if (fp[i] > UINT32_MAX)
            return MEMOS_EINVAL;
        g->fp[i] = (uint32_t)fp[i];
        g->len = i + 1;
    }
    for (size_t i = 0; i < len; i++) {
        if (!live[i])
            continue;
        uint64_t seq = clock - len + 1 + i;
        if ((p->gused + 1) * 4 > (p->gtab ? p->gmask + 1 : 0) * 3 && ghost_grow_table(p) != MEMOS_OK)
            return MEMOS_ENOMEM;
        if (ghost_find(p, g->fp[i]) >= 0)
            return MEMOS_EINVAL;        /* a fingerprint live twice: not a dump */
        ghost_insert(p, (uint32_t)((((seq & SEQ_MASK) << 1) | r) + 1), g->fp[i]);
        g->live++;
    }
    return MEMOS_OK;
}

/* ---- debugging ---- */

static int check_ghosts(const policy *p, char *why, size_t whylen)
{
    size_t used = 0;
    for (size_t i = 0; p->gtab && i <= p->gmask; i++) {
        uint32_t e = p->gtab[i];
        if (!e)
            continue;
        used++;
        uint32_t v = (e & SLOT_MASK) - 1;
        const ghost_ring *g = &p->ring[v & 1];
        if (((g->next_seq - (v >> 1)) & SEQ_MASK) >= g->len)
            PFAIL("policy: ghost %zu is outside its ring", i);
        if (e >> 25 != tag_of(entry_fp(p, e)))
            PFAIL("policy: ghost %zu's tag is not its fingerprint's", i);
        if (ghost_find(p, entry_fp(p, e)) != (long)i)
            PFAIL("policy: ghost %zu unreachable or twice in the table", i);
    }
    if (used != p->gused || used != p->ring[0].live + p->ring[1].live)
        PFAIL("policy: ghost table holds %zu, counters say %zu, rings %zu + %zu", used,
              p->gused, p->ring[0].live, p->ring[1].live);
    for (unsigned r = 0; r < 2; r++)
        if (p->ring[r].len > p->ring[r].cap)
            PFAIL("policy: ghost ring %u overfull", r);
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
