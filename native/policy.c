/*
 * policy.c — the eviction policy: lru_lfu (the default, adaptive), lru and lfu.
 *
 * Every live entry embeds a policy_node (48 bytes).  One order is always
 * kept, whatever the policy:
 *
 *   recency    a circular doubly-linked list through prev/next with a
 *              sentinel: head.next is the most recently used, head.prev the
 *              least.  It gives memos_foreach its order and is the victim
 *              order of "lru".
 *
 *   lfu        a second list, through fprev/fnext: POLICY_LEVELS lists; a
 *              node sits in level = bit length of its touch count (capped).
 *              Victims: rarest level first, oldest first.
 *
 *   lru_lfu    follows a bank of policies (issue 29): the published ones
 *              its peers are (bench policy) and three settings of a hybrid
 *              of its own, each run in full beside the cache.
 *
 * ---- lru_lfu: the bank ----
 *
 * No published policy wins everywhere (LRU where recency is all, LIRS on
 * loops larger than the cache, W-TinyLFU and S3-FIFO on skewed popularity,
 * ARC in between), and a policy that approximates them (issue 18's hybrid
 * with sampled copies) falls short of the one it approximates.  So lru_lfu
 * runs the policies themselves and follows one.  BANK lists eleven members:
 * LRU, LFU, ARC (Megiddo and Modha, FAST 2003), 2Q (Johnson and Shasha,
 * VLDB 1994), S3-FIFO (Yang et al., SOSP 2023, as libCacheSim runs it),
 * SIEVE (Zhang et al., NSDI 2024), LIRS (Jiang and Zhang, SIGMETRICS 2002),
 * W-TinyLFU (Einziger, Friedman and Manes, ACM ToS 2017, in Caffeine's
 * layout), and the hybrid's settings 1, 2 and 5 ("lru_lfu@i", below), which
 * beat every published one on some streams.  Each is written step for step
 * as memosfs/testing/refpolicies.py has it (the tests replay both and ask
 * for equal hits; the bench replays the C ones as "ref:NAME").
 *
 * Every member runs twice, over the key hashes of the live entries (unit
 * size: a member counts entries, not bytes):
 *   alone   its own cache of the live cache's size (the count when victims
 *           were last asked for), seeing every access (policy_admit: a miss,
 *           policy_touch: a hit): its hits are what the policy would have
 *           hit on this stream — the scores;
 *   synced  over the live entries themselves: it sees every access, every
 *           eviction (as if it had evicted that entry: into its ghosts) and
 *           every deletion, and never evicts on its own; asked, it names the
 *           entries it would evict next, in its order (x_victims).
 * The live cache's victims are its leader's synced choices (the first that
 * may go; then the least recently used).  Following another member changes
 * who chooses, not what the cache holds, and the new leader's bookkeeping
 * (ghosts, frequencies, segments, LIRS's stack) has followed the live
 * entries all along.  A synced member followed from the start picks what
 * it picks alone (tested, all but ARC and 2Q, whose choice alone depends on
 * the key about to come in, unknown when the cache asks for room).
 *
 * The switching rule (bank_choose): a switch is not free — the live entries
 * were chosen by the old leader, and until they turn over the new one does
 * not hit as it does alone — so the rule is rent or buy.  The start member
 * (BANK_START, lru_lfu@2: a slot read again and again outlives a scan from
 * the first eviction on) leads until the cache has seen BANK_FIRST x its
 * size accesses and BANK_DIVERGED x its size since two members first hit
 * differently (before, the members are one policy: no evidence), then the
 * member with the most hits so far, LRU on a tie (the goal's baseline: where
 * LRU is as good as any, the cache follows it from the first evidence on,
 * not after a switching cost was won back), another member only if its lead
 * passes the first estimate of a switch's cost; from there on,
 * each member's gain over the leader since the last switch must pass what a
 * switch costs (measured: over BANK_MEASURE x the size accesses after each
 * switch, what the new leader hit alone less what the live cache hit; the
 * estimate starts at 1% of the size and is then the mean of itself and the
 * last measure) and BANK_Z standard errors of a sum of correlated steps
 * (the gains of each BANK_EVERY-access period, squared: a request's blocks
 * hit or miss together).  Everything is a function of the access sequence:
 * the replay is deterministic.  Where it falls short (docs/benchmarks.md):
 * streams whose best member changes phase after phase (loops, shifting
 * popularity), where every switch costs a turnover.
 *
 * ---- the hybrid (lru_lfu@i, and lru_lfu when the bank cannot be had) ----
 *
 * Two segments, after ARC, 2Q and S3-FIFO:
 *
 *        admit ──► probation (FIFO) ──hit──► protected (LRU + aging clock)
 *                     │ evict                     │ evict (ref == 0)
 *                     ▼                           ▼
 *              ghost 0 (2 × count hashes)   ghost 1 (1 × count hashes)
 *                     │                           │
 *                     └──── an admit whose key hash is in a ghost goes
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
 * protected node (LIRS-like on loops).  Ghosts remember key hashes only:
 * two FIFO rings of (hash, seq) and one open-addressing table hash → (seq,
 * ring), about 48 bytes per ghost, at most 3 × count.
 *
 * Memory.  48 bytes per entry (policy_node).  lru_lfu's bank, for caches up
 * to BANK_MAX_LIVE (65,536) entries: about 290 KB fixed plus 2.9-4.2 KB per
 * entry measured (22 members' nodes, tables, ghosts and sketches, with the
 * slack of arrays that grow by doubling; policy_stats shadow_bytes): at
 * most about 300 MB at the limit.  A cache with more entries (or a bank
 * that cannot be allocated) drops the bank for good and runs the ghost rule
 * alone (48 bytes + ghosts per entry).  Per member: LRU, LFU, SIEVE,
 * W-TinyLFU (+ a sketch of 16 x size bytes) keep no ghosts; ARC keeps at
 * most `size` of them, 2Q half that, S3-FIFO 0.9 x size, LIRS's stack at most
 * 2 x size entries; a hybrid member the hybrid's.
 *
 * Cost.  admit, touch and remove are O(1) for lru and lfu; a victim is
 * O(skipped).  Under lru_lfu an admit or touch is one access of each of the
 * 22 members (O(1) each: a table lookup and list moves; W-TinyLFU 8 sketch
 * counters) and every BANK_EVERY accesses an O(members) look at the scores:
 * 1.2-5.8 us an access measured on the bench's machine (bench policy,
 * 900-49,000 entries; the larger the cache, the more of it misses the CPU
 * caches).  A victim is O(1) plus the synced leader's walk (pinned entries,
 * CLOCK passes).  An eviction or deletion is one step in each synced member.
 *
 * Victims are filtered by the owner's evictable() predicate (the cache skips
 * pinned, sticky, evicting and just-refused entries) and are not removed
 * here: the cache calls policy_note_evict then policy_remove for each one
 * that it really evicts.
 *
 * Invariants (policy_check): the recency list is well linked and holds
 * `count` nodes, each marked linked; under lfu each node is on the level
 * list its freq says; under a hybrid setting each node is on the segment its
 * seg says, the segment counts add up and every ghost in the table is live
 * in its ring; under lru_lfu every live node is in the map, each member
 * alone holds at most its capacity, each synced member holds the live
 * entries, and each member's table, lists and counts agree.
 *
 * Locking: none here; the cache lock guards every call.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"

/* ---- types and constants ---- */

#define POLICY_FREQ_MAX 0xffffu
#define REF_MAX         3u
#define PFRAC_INIT      0.5
#define PFRAC_MIN       0.01
#define PFRAC_MAX       0.9
#define GHOST_MIN       16u     /* ring capacity floor */
#define HYBRID_START    1u      /* lru_lfu@i: the ghost rule, the hybrid before any evidence */
#define BANK_START      9u      /* lru_lfu: the member followed before any evidence (lru_lfu@2) */
#define BANK_MAX_LIVE   (1u << 16)  /* more live entries than this: the bank goes (its memory) */
#define DEMOTE_STEPS    2u      /* gadmit 3: clock steps one ghost hit may take */
#define SWITCH_SIGMA    3.0     /* a switch needs a lead of this many standard errors */
#define SWITCH_SETTLE   1.25    /* ... and of this many times the live cache's lag behind its leader */

/* The hybrid's settings (policy.h: policy_expert), "lru_lfu@i". */
static const policy_expert HYBRIDS[POLICY_EXPERTS] = {
    { 0.5,  1, 1 },     /* 0 lru: victims in recency order */
    { -1.0, 0, 1 },     /* 1 adaptive split, ghost hits to protected (ARC-like) */
    { 0.1,  0, 1 },     /* 2 small probation, ghost hits to protected (S3-FIFO-like) */
    { 0.01, 0, 2 },     /* 3 tiny probation, ghost hits only fill protected (LIRS-like, loops) */
    { 0.3,  0, 1 },     /* 4 medium probation */
    { 0.01, 0, 3 },     /* 5 tiny probation, ghost hits replace cold protected nodes (loops) */
};

/* ---- private prototypes ---- */

static void     list_init(policy_node *h, int freq);
static void     link_after(policy_node *h, policy_node *n);
static void     unlink_node(policy_node *n);
static void     flink_after(policy_node *h, policy_node *n);
static void     funlink(policy_node *n);
static unsigned level_of(uint32_t freq);
static int      kind_of(const char *name, enum policy_kind *out);
static int      ok(policy *p, policy_node *x);
static size_t   take_probation(policy *p, policy_node **out, size_t n, policy_node **cur);
static size_t   take_protected(policy *p, policy_node **out, size_t n);
static uint64_t norm_hash(uint64_t h);
static long     ghost_find(const policy *p, uint64_t h);
static void     ghost_del(policy *p, size_t i);
static void     ghost_add(policy *p, unsigned r, uint64_t h);
static int      ghost_grow_table(policy *p);
static int      ghost_grow_ring(ghost_ring *g);
static size_t   ghost_target(const policy *p, unsigned r);
static int      demote_one(policy *p, unsigned steps);
static uint64_t mix64(uint64_t x);
static int      bank_start(policy *p);
static void     bank_free(policy *p);
static void     bank_access(policy *p, uint64_t h, int live_hit);
static size_t   bank_victims(policy *p, policy_node **out, size_t n);
static void     bank_live_gone(struct policy_bank *b, uint64_t h);
static int      map_put(struct policy_bank *b, policy_node *n);
static void     map_del(struct policy_bank *b, policy_node *n);
static void     bank_member_remove(policy *p, uint64_t h);
static void     bank_member_rename(policy *p, uint64_t h, uint64_t to);
static uint64_t bank_bytes(const policy *p);
static int      bank_check(const policy *p, char *why, size_t whylen);
static void     bank_stats(const policy *p, policy_stats *out);
static long long bank_member_simulate(const char *name, const uint64_t *keys, size_t n,
                                      size_t capacity);

/* ---- API ---- */

int policy_init(policy *p, const char *name, policy_evictable_fn fn, void *ctx)
{
    memset(p, 0, sizeof *p);
    list_init(&p->head, 0);
    for (unsigned i = 0; i < POLICY_LEVELS; i++)
        list_init(&p->lvl[i], 1);
    list_init(&p->seg[0], 1);
    list_init(&p->seg[1], 1);
    p->pfrac = PFRAC_INIT;
    p->expert = BANK_START;
    p->mode = HYBRIDS[HYBRID_START];
    p->evictable = fn;
    p->ctx = ctx;
    p->kind = (enum policy_kind)-1;
    return policy_select(p, name ? name : "lru_lfu");
}

void policy_destroy(policy *p)
{
    for (unsigned r = 0; r < 2; r++) {
        free(p->ring[r].hash);
        free(p->ring[r].seq);
        memset(&p->ring[r], 0, sizeof p->ring[r]);
    }
    free(p->gtab);
    p->gtab = NULL;
    p->gmask = p->gused = 0;
    bank_free(p);
}

/* lru_lfu follows its bank (not a fixed hybrid setting). */
static int banked(const policy *p) { return p->kind == POLICY_LRU_LFU && !p->fixed; }

/* Run hybrid setting i alone from now on: the bank goes, every node goes to
 * protected (ref 0), as a select of lru_lfu did before the bank. */
static void to_fixed(policy *p, unsigned i)
{
    bank_free(p);
    p->fixed = 1;
    p->expert = i;
    p->mode = HYBRIDS[i];
    if (p->mode.pfrac >= 0)
        p->pfrac = p->mode.pfrac;
    list_init(&p->seg[0], 1);
    list_init(&p->seg[1], 1);
    p->nseg[0] = p->nseg[1] = 0;
    for (policy_node *n = p->head.prev; n != &p->head; n = n->prev) {
        n->seg = POLICY_PROTECTED;
        n->ref = 0;
        flink_after(&p->seg[POLICY_PROTECTED], n);
        p->nseg[POLICY_PROTECTED]++;
    }
}

/* lru_lfu's bank, made on first need; with no memory for it the hybrid's
 * ghost rule runs alone (0). */
static int bank_ready(policy *p)
{
    if (!banked(p))
        return 0;
    if (p->bank)
        return 1;
    if (bank_start(p) == MEMOS_OK)
        return 1;
    to_fixed(p, HYBRID_START);
    return 0;
}

/* Switch the victim order.  The second lists are rebuilt from the recency
 * list, LRU first so each stays MRU-first; switching to lru_lfu starts its
 * bank afresh from the entries (least recently used first).  Ghosts and the
 * balance survive a switch. */
int policy_select(policy *p, const char *name)
{
    enum policy_kind k;
    if (kind_of(name, &k) != MEMOS_OK)
        return MEMOS_EINVAL;
    if (k == p->kind)
        return MEMOS_OK;
    bank_free(p);
    p->fixed = 0;
    for (unsigned i = 0; i < POLICY_LEVELS; i++)
        list_init(&p->lvl[i], 1);
    list_init(&p->seg[0], 1);
    list_init(&p->seg[1], 1);
    p->nseg[0] = p->nseg[1] = 0;
    p->kind = k;
    snprintf(p->name, sizeof p->name, "%s", name);
    for (policy_node *n = p->head.prev; n != &p->head; n = n->prev) {
        if (k == POLICY_LFU) {
            n->level = (uint8_t)level_of(n->freq);
            flink_after(&p->lvl[n->level], n);
        } else if (k == POLICY_LRU_LFU) {
            n->seg = 0;
            n->ref = 0;
            n->level = 0;
            n->fprev = n->fnext = NULL;
        }
    }
    return MEMOS_OK;
}

void policy_admit(policy *p, policy_node *n, uint64_t hash)
{
    assert(!n->linked);
    if (banked(p) && !p->bank)
        bank_ready(p);                  /* (the bank starts from the entries before this one) */
    n->hash = norm_hash(hash);
    n->freq = 0;
    n->level = 0;
    n->ref = 0;
    n->linked = 1;
    link_after(&p->head, n);
    p->count++;
    if (p->kind == POLICY_LFU) {
        flink_after(&p->lvl[0], n);
        return;
    }
    if (p->kind != POLICY_LRU_LFU)
        return;
    n->seg = 0;
    n->fprev = n->fnext = NULL;
    if (bank_ready(p)) {
        if (p->count > BANK_MAX_LIVE || map_put(p->bank, n) != MEMOS_OK) {
            /* too many entries for the bank's memory, or no memory: the
             * ghost rule alone (n joins as every other node, protected) */
            to_fixed(p, HYBRID_START);
            return;
        }
        bank_access(p, n->hash, 0);
        return;
    }
    n->seg = POLICY_PROBATION;
    long i = ghost_find(p, n->hash);
    if (i >= 0) {
        unsigned r = (unsigned)(p->gtab[i].seq & 1);
        uint64_t age = p->ring[r].next_seq - (p->gtab[i].seq >> 1);
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

void policy_touch(policy *p, policy_node *n)
{
    assert(n->linked);
    if (bank_ready(p)) {
        unlink_node(n);
        link_after(&p->head, n);
        if (n->freq < POLICY_FREQ_MAX)
            n->freq++;
        bank_access(p, n->hash, 1);
        return;
    }
    unlink_node(n);
    link_after(&p->head, n);
    if (n->freq < POLICY_FREQ_MAX)
        n->freq++;
    if (p->kind == POLICY_LFU) {
        funlink(n);
        n->level = (uint8_t)level_of(n->freq);
        flink_after(&p->lvl[n->level], n);
    } else if (p->kind == POLICY_LRU_LFU) {
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
}

void policy_remove(policy *p, policy_node *n)
{
    assert(n->linked && p->count > 0);
    if (banked(p)) {
        if (p->bank) {
            map_del(p->bank, n);
            if (n->level)               /* evicted: the synced members see it go */
                bank_live_gone(p->bank, n->hash);
            else                        /* deleted: every member forgets it */
                bank_member_remove(p, n->hash);
        }
        n->level = 0;
        unlink_node(n);
        n->linked = 0;
        p->count--;
        return;
    }
    unlink_node(n);
    if (p->kind == POLICY_LFU) {
        funlink(n);
    } else if (p->kind == POLICY_LRU_LFU) {
        funlink(n);
        p->nseg[n->seg]--;
    }
    n->linked = 0;
    p->count--;
}

/* A victim is going: remember its key hash in the ghost of its segment
 * (lru_lfu: the members keep what they hold; policy_remove is told it is an
 * eviction, not a deletion). */
void policy_note_evict(policy *p, policy_node *n)
{
    assert(n->linked);
    if (banked(p))
        n->level = 1;
    else if (p->kind == POLICY_LRU_LFU)
        ghost_add(p, n->seg, n->hash);
}

void policy_rekey(policy *p, policy_node *n, uint64_t hash)
{
    uint64_t h = norm_hash(hash);
    if (banked(p) && p->bank && n->linked) {
        map_del(p->bank, n);
        uint64_t old = n->hash;
        n->hash = h;
        if (map_put(p->bank, n) != MEMOS_OK) {
            to_fixed(p, HYBRID_START);
            return;
        }
        bank_member_rename(p, old, h);
        return;
    }
    n->hash = h;
}

/* Up to n evictable nodes, best victim first. */
size_t policy_victims(policy *p, policy_node **out, size_t n)
{
    size_t got = 0;
    if (p->count)                       /* (an empty cache asked: its size when full stands) */
        p->full = p->count;
    p->batch = n;
    if (bank_ready(p))
        return bank_victims(p, out, n);
    if (p->kind == POLICY_LRU || (p->kind == POLICY_LRU_LFU && p->mode.lru)) {
        for (policy_node *x = p->head.prev; x != &p->head && got < n; x = x->prev)
            if (ok(p, x))
                out[got++] = x;
        return got;
    }
    if (p->kind == POLICY_LFU) {
        for (unsigned l = 0; l < POLICY_LEVELS && got < n; l++)
            for (policy_node *x = p->lvl[l].fprev; x != &p->lvl[l] && got < n; x = x->fprev)
                if (ok(p, x))
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

void policy_foreach(policy *p, void (*fn)(void *ctx, policy_node *n), void *ctx)
{
    for (policy_node *x = p->head.next; x != &p->head;) {
        policy_node *next = x->next;
        fn(ctx, x);
        x = next;
    }
}

uint64_t policy_count(const policy *p) { return p->count; }

void policy_get_stats(const policy *p, policy_stats *out)
{
    memset(out, 0, sizeof *out);
    out->ghost_hits_recency = p->ghits[0];
    out->ghost_hits_frequency = p->ghits[1];
    out->ghost_entries = p->gused;
    out->probation = p->nseg[POLICY_PROBATION];
    out->protected_ = p->nseg[POLICY_PROTECTED];
    out->recency = p->kind == POLICY_LRU ? 1.0 : p->kind == POLICY_LFU ? 0.0 : p->pfrac;
    out->expert = p->expert;
    out->expert_switches = p->switches;
    if (banked(p))
        bank_stats(p, out);
}

const policy_expert *policy_expert_at(unsigned i)
{
    return i < POLICY_EXPERTS ? &HYBRIDS[i] : NULL;
}

int policy_fix_expert(policy *p, unsigned i)
{
    if (i >= POLICY_EXPERTS || p->kind != POLICY_LRU_LFU)
        return MEMOS_EINVAL;
    to_fixed(p, i);
    return MEMOS_OK;
}

/* ---- simulation (bench policy): unit-size blocks, no arena ---- */

typedef struct sim_node {
    policy_node pn;   /* first: the policy links */
    uint64_t    key;  /* block id */
} sim_node;

typedef struct sim_table {
    uint32_t *slot;   /* node index + 1, 0 = empty */
    size_t    mask;   /* slots - 1 */
} sim_table;

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static size_t sim_find(const sim_table *t, const sim_node *nodes, uint64_t key, uint64_t h)
{
    size_t i = h & t->mask;
    while (t->slot[i] && nodes[t->slot[i] - 1].key != key)
        i = (i + 1) & t->mask;
    return i;
}

static void sim_delete(sim_table *t, const sim_node *nodes, size_t i)
{
    t->slot[i] = 0;
    for (size_t j = (i + 1) & t->mask; t->slot[j]; j = (j + 1) & t->mask) {
        size_t home = mix64(nodes[t->slot[j] - 1].key) & t->mask;
        if (((j - home) & t->mask) >= ((j - i) & t->mask)) {
            t->slot[i] = t->slot[j];
            t->slot[j] = 0;
            i = j;
        }
    }
}

long long policy_simulate(const char *name, const uint64_t *keys, size_t n,
                          size_t capacity, unsigned batch, policy_stats *st)
{
    enum policy_kind k;
    int fix = -1;
    char base[16];
    if (name && strncmp(name, "ref:", 4) == 0)
        return batch ? bank_member_simulate(name + 4, keys, n, capacity) : -1;
    const char *at = name ? strchr(name, '@') : NULL;
    if (at && at - name < (long)sizeof base && at[1] >= '0' && at[1] <= '9' && !at[2]) {
        memcpy(base, name, (size_t)(at - name));
        base[at - name] = 0;
        fix = at[1] - '0';
        name = base;
        if (strcmp(name, "lru_lfu") != 0 || fix >= POLICY_EXPERTS)
            return -1;
    }
    if (capacity == 0 || batch == 0 || capacity > UINT32_MAX / 4 || kind_of(name, &k) != MEMOS_OK)
        return -1;
    size_t slots = 16;
    while (slots < 2 * (capacity + 1))
        slots *= 2;
    sim_table t = { calloc(slots, sizeof *t.slot), slots - 1 };
    sim_node *nodes = calloc(capacity, sizeof *nodes);
    uint32_t *freelist = malloc(capacity * sizeof *freelist);
    policy_node **v = malloc(batch * sizeof *v);
    policy p;
    long long hits = -1;
    if (!t.slot || !nodes || !freelist || !v || policy_init(&p, name, NULL, NULL) != MEMOS_OK)
        goto out;
    if (fix >= 0)
        policy_fix_expert(&p, (unsigned)fix);
    /* the capacity is known from the start: the bank's members run at it
     * (less a batch) from the first access, as peers of this capacity do */
    if (k == POLICY_LRU_LFU && fix < 0) {
        p.full = capacity;
        p.batch = batch;
    }
    size_t nfree = capacity;
    for (size_t i = 0; i < capacity; i++)
        freelist[i] = (uint32_t)(capacity - 1 - i);
    hits = 0;
    for (size_t r = 0; r < n; r++) {
        uint64_t h = mix64(keys[r]);
        size_t i = sim_find(&t, nodes, keys[r], h);
        if (t.slot[i]) {
            policy_touch(&p, &nodes[t.slot[i] - 1].pn);
            hits++;
            continue;
        }
        if (nfree == 0) {
            size_t got = policy_victims(&p, v, batch);
            for (size_t j = 0; j < got; j++) {
                sim_node *x = (sim_node *)v[j];
                policy_note_evict(&p, &x->pn);
                policy_remove(&p, &x->pn);
                sim_delete(&t, nodes, sim_find(&t, nodes, x->key, mix64(x->key)));
                freelist[nfree++] = (uint32_t)(x - nodes);
            }
            if (nfree == 0)
                continue;
            i = sim_find(&t, nodes, keys[r], h);
        }
        uint32_t idx = freelist[--nfree];
        nodes[idx].key = keys[r];
        t.slot[i] = idx + 1;
        policy_admit(&p, &nodes[idx].pn, h);
    }
    if (st)
        policy_get_stats(&p, st);
    policy_destroy(&p);
out:
    free(t.slot);
    free(nodes);
    free(freelist);
    free(v);
    return hits;
}

/* ---- private helpers ---- */

static int kind_of(const char *name, enum policy_kind *out)
{
    if (!name)
        return MEMOS_EINVAL;
    if (strcmp(name, "lru") == 0)
        *out = POLICY_LRU;
    else if (strcmp(name, "lfu") == 0)
        *out = POLICY_LFU;
    else if (strcmp(name, "lru_lfu") == 0)
        *out = POLICY_LRU_LFU;
    else
        return MEMOS_EINVAL;
    return MEMOS_OK;
}

static int ok(policy *p, policy_node *x)
{
    return !p->evictable || p->evictable(x, p->ctx);
}

/* Oldest evictable probation nodes, walking from *cur towards the front. */
static size_t take_probation(policy *p, policy_node **out, size_t n, policy_node **cur)
{
    size_t got = 0;
    policy_node *h = &p->seg[POLICY_PROBATION];
    while (*cur != h && got < n) {
        policy_node *x = *cur;
        *cur = x->fprev;
        if (ok(p, x))
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
        } else if (ok(p, x)) {
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

static unsigned level_of(uint32_t freq)
{
    unsigned l = freq ? 32u - (unsigned)__builtin_clz(freq) : 0;
    return l < POLICY_LEVELS ? l : POLICY_LEVELS - 1;
}

static void list_init(policy_node *h, int freq)
{
    if (freq)
        h->fprev = h->fnext = h;
    else
        h->prev = h->next = h;
}

static void link_after(policy_node *h, policy_node *n)
{
    n->prev = h;
    n->next = h->next;
    h->next->prev = n;
    h->next = n;
}

static void unlink_node(policy_node *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = NULL;
}

static void flink_after(policy_node *h, policy_node *n)
{
    n->fprev = h;
    n->fnext = h->fnext;
    h->fnext->fprev = n;
    h->fnext = n;
}

static void funlink(policy_node *n)
{
    n->fprev->fnext = n->fnext;
    n->fnext->fprev = n->fprev;
    n->fprev = n->fnext = NULL;
}

/* ---- private helpers: ghosts ---- */

static uint64_t norm_hash(uint64_t h) { return h ? h : 1; }

static long ghost_find(const policy *p, uint64_t h)
{
    if (!p->gtab)
        return -1;
    for (size_t i = h & p->gmask;; i = (i + 1) & p->gmask) {
        if (p->gtab[i].hash == h)
            return (long)i;
        if (p->gtab[i].hash == 0)
            return -1;
    }
}

/* Linear probing with backward-shift deletion: no tombstones. */
static void ghost_del(policy *p, size_t i)
{
    p->gtab[i].hash = 0;
    p->gused--;
    for (size_t j = (i + 1) & p->gmask; p->gtab[j].hash; j = (j + 1) & p->gmask) {
        size_t home = p->gtab[j].hash & p->gmask;
        if (((j - home) & p->gmask) >= ((j - i) & p->gmask)) {
            p->gtab[i] = p->gtab[j];
            p->gtab[j].hash = 0;
            i = j;
        }
    }
}

static size_t ghost_target(const policy *p, unsigned r)
{
    size_t t = (size_t)(r == 0 ? 2 * p->count : p->count);
    return t < GHOST_MIN ? GHOST_MIN : t;
}

/* Remember h in ring r (replacing any ghost of the same hash), then drop the
 * oldest ring slots while the live ghosts exceed the ring's target (stale
 * slots, left by ghost hits, are bounded by a second target).  On no memory the ghosts
 * stay as they are (the policy still works, it adapts less). */
static void ghost_add(policy *p, unsigned r, uint64_t h)
{
    ghost_ring *g = &p->ring[r];
    if ((g->len == g->cap && ghost_grow_ring(g) != MEMOS_OK) ||
        ((p->gused + 1) * 2 > p->gmask + 1 && ghost_grow_table(p) != MEMOS_OK)) {
        p->oom = 1;
        return;
    }
    long old = ghost_find(p, h);
    if (old >= 0) {
        p->ring[p->gtab[old].seq & 1].live--;
        ghost_del(p, (size_t)old);
    }
    uint64_t seq = ++g->next_seq;
    size_t at = (g->tail + g->len) % g->cap;
    g->hash[at] = h;
    g->seq[at] = seq;
    g->len++;
    g->live++;
    size_t i = h & p->gmask;
    while (p->gtab[i].hash)
        i = (i + 1) & p->gmask;
    p->gtab[i] = (ghost_slot){ h, (seq << 1) | r };
    p->gused++;
    size_t target = ghost_target(p, r);
    while (g->live > target || g->len > 2 * target) {
        long j = ghost_find(p, g->hash[g->tail]);
        if (j >= 0 && p->gtab[j].seq == ((g->seq[g->tail] << 1) | r)) {
            ghost_del(p, (size_t)j);
            g->live--;
        }
        g->tail = (g->tail + 1) % g->cap;
        g->len--;
    }
}

static int ghost_grow_ring(ghost_ring *g)
{
    size_t cap = g->cap ? g->cap * 2 : 64;
    uint64_t *hs = malloc(cap * sizeof *hs), *ss = malloc(cap * sizeof *ss);
    if (!hs || !ss) {
        free(hs);
        free(ss);
        return MEMOS_ENOMEM;
    }
    for (size_t i = 0; i < g->len; i++) {
        hs[i] = g->hash[(g->tail + i) % g->cap];
        ss[i] = g->seq[(g->tail + i) % g->cap];
    }
    free(g->hash);
    free(g->seq);
    g->hash = hs;
    g->seq = ss;
    g->cap = cap;
    g->tail = 0;
    return MEMOS_OK;
}

static int ghost_grow_table(policy *p)
{
    size_t n = p->gtab ? (p->gmask + 1) * 2 : 128;
    ghost_slot *t = calloc(n, sizeof *t);
    if (!t)
        return MEMOS_ENOMEM;
    for (size_t i = 0; p->gtab && i <= p->gmask; i++) {
        if (!p->gtab[i].hash)
            continue;
        size_t j = p->gtab[i].hash & (n - 1);
        while (t[j].hash)
            j = (j + 1) & (n - 1);
        t[j] = p->gtab[i];
    }
    free(p->gtab);
    p->gtab = t;
    p->gmask = n - 1;
    return MEMOS_OK;
}

/* ---- debugging ---- */

#define FAIL(...) do { snprintf(why, whylen, __VA_ARGS__); return MEMOS_EINVAL; } while (0)

static int check_second_lists(const policy *p, char *why, size_t whylen)
{
    uint64_t m = 0;
    if (p->kind == POLICY_LFU) {
        for (unsigned l = 0; l < POLICY_LEVELS; l++)
            for (const policy_node *x = p->lvl[l].fnext; x != &p->lvl[l]; x = x->fnext) {
                if (x->level != l || level_of(x->freq) != l || x->fnext->fprev != x)
                    FAIL("policy: node on wrong lfu level %u", l);
                if (++m > p->count)
                    break;
            }
        if (m != p->count)
            FAIL("policy: lfu levels hold %llu, count says %llu",
                 (unsigned long long)m, (unsigned long long)p->count);
        return MEMOS_OK;
    }
    if (p->kind != POLICY_LRU_LFU)
        return MEMOS_OK;
    if (banked(p))
        return bank_check(p, why, whylen);
    for (unsigned s = 0; s < 2; s++) {
        uint64_t k = 0;
        for (const policy_node *x = p->seg[s].fnext; x != &p->seg[s]; x = x->fnext) {
            if (x->seg != s || x->fnext->fprev != x || !x->linked || x->ref > REF_MAX)
                FAIL("policy: node on wrong lru_lfu segment %u", s);
            if (++k > p->count)
                break;
        }
        if (k != p->nseg[s])
            FAIL("policy: segment %u holds %llu, counter says %llu", s,
                 (unsigned long long)k, (unsigned long long)p->nseg[s]);
        m += k;
    }
    if (m != p->count)
        FAIL("policy: segments hold %llu, count says %llu",
             (unsigned long long)m, (unsigned long long)p->count);
    if (p->pfrac < PFRAC_MIN || p->pfrac > PFRAC_MAX)
        FAIL("policy: balance %g out of range", p->pfrac);
    return MEMOS_OK;
}

static int check_ghosts(const policy *p, char *why, size_t whylen)
{
    size_t used = 0;
    for (size_t i = 0; p->gtab && i <= p->gmask; i++) {
        const ghost_slot *s = &p->gtab[i];
        if (!s->hash)
            continue;
        used++;
        if (ghost_find(p, s->hash) != (long)i)
            FAIL("policy: ghost %zu unreachable or twice in the table", i);
        const ghost_ring *g = &p->ring[s->seq & 1];
        uint64_t seq = s->seq >> 1;
        if (seq == 0 || seq > g->next_seq || g->next_seq - seq >= g->len)
            FAIL("policy: ghost %zu is outside its ring", i);
        size_t at = (g->tail + g->len - 1 - (size_t)(g->next_seq - seq)) % g->cap;
        if (g->hash[at] != s->hash || g->seq[at] != seq)
            FAIL("policy: ghost %zu disagrees with its ring", i);
    }
    if (used != p->gused || used != p->ring[0].live + p->ring[1].live)
        FAIL("policy: ghost table holds %zu, counters say %zu, rings %zu + %zu", used,
             p->gused, p->ring[0].live, p->ring[1].live);
    for (unsigned r = 0; r < 2; r++)
        if (p->ring[r].len > p->ring[r].cap)
            FAIL("policy: ghost ring %u overfull", r);
    return MEMOS_OK;
}

int policy_check(const policy *p, char *why, size_t whylen)
{
    uint64_t n = 0;
    const policy_node *h = &p->head;
    for (const policy_node *x = h->next; x != h; x = x->next) {
        if (x->next->prev != x || x->prev->next != x)
            FAIL("policy: recency list broken at node %llu", (unsigned long long)n);
        if (!x->linked)
            FAIL("policy: unlinked node on the list");
        if (++n > p->count)
            FAIL("policy: list longer than count %llu", (unsigned long long)p->count);
    }
    if (n != p->count)
        FAIL("policy: list holds %llu, count says %llu",
             (unsigned long long)n, (unsigned long long)p->count);
    int rc = check_second_lists(p, why, whylen);
    if (rc == MEMOS_OK)
        rc = check_ghosts(p, why, whylen);
    if (rc == MEMOS_OK && p->fixed && p->expert >= POLICY_EXPERTS)
        FAIL("policy: setting %u out of range", p->expert);
    return rc;
}


/* ---- state dump and restore (the SSD tier's policy; see policy.h) ----
 *
 * Kept apart from the rest: it reads and rebuilds the lists, the balance and
 * the ghost rings exactly as they are, so a restored policy picks the same
 * victims as the one dumped.  A ring is restored slot for slot (stale slots
 * too), because a ghost's place in its ring follows from its sequence number. */

unsigned policy_dump_lists(const policy *p)
{
    return p->kind == POLICY_LFU ? POLICY_LEVELS : p->kind == POLICY_LRU_LFU && p->fixed ? 2 : 0;
}

unsigned policy_dump_rings(const policy *p)
{
    return p->kind == POLICY_LRU_LFU && p->fixed ? 2 : 0;
}

unsigned policy_dump_bank(const policy *p)
{
    return banked(p) ? POLICY_BANK_VERSION : 0;
}

size_t policy_dump_list(const policy *p, int list, policy_node **out, size_t max)
{
    size_t k = 0;
    if (list < 0) {
        for (policy_node *x = p->head.next; x != &p->head; x = x->next, k++)
            if (k < max)
                out[k] = x;
        return k;
    }
    if ((unsigned)list >= policy_dump_lists(p))
        return 0;
    const policy_node *h = p->kind == POLICY_LFU ? &p->lvl[list] : &p->seg[list];
    for (policy_node *x = h->fnext; x != h; x = x->fnext, k++)
        if (k < max)
            out[k] = x;
    return k;
}

size_t policy_dump_ghosts(const policy *p, unsigned r, uint64_t *hash, uint8_t *live,
                          size_t max, uint64_t *clock)
{
    const ghost_ring *g = &p->ring[r & 1];
    *clock = g->next_seq;
    for (size_t i = 0; i < g->len && i < max; i++) {
        size_t at = (g->tail + i) % g->cap;
        long j = ghost_find(p, g->hash[at]);
        hash[i] = g->hash[at];
        live[i] = j >= 0 && p->gtab[j].seq == ((g->seq[at] << 1) | (r & 1));
    }
    return g->len;
}

unsigned policy_dump_expert(const policy *p)
{
    return p->expert;
}

int policy_restore_expert(policy *p, unsigned i)
{
    if (p->kind != POLICY_LRU_LFU)
        return MEMOS_OK;                /* (only lru_lfu has settings) */
    if (banked(p)) {
        /* the member followed comes back; the bank starts anew from the
         * restored entries (its scores are not kept: they rebuild within
         * one scoring window) */
        if (!policy_bank_name(i))
            return MEMOS_EINVAL;
        p->restore_leader = i + 1;
        p->expert = i;
        return MEMOS_OK;
    }
    if (i >= POLICY_EXPERTS)
        return MEMOS_EINVAL;
    p->expert = i;
    p->mode = HYBRIDS[i];
    return MEMOS_OK;
}

double policy_dump_balance(const policy *p, uint64_t ghits[2])
{
    ghits[0] = p->ghits[0];
    ghits[1] = p->ghits[1];
    return p->pfrac;
}

/* Link n at the LRU end of the recency list (nodes come MRU first). */
void policy_restore_node(policy *p, policy_node *n, uint64_t hash, uint32_t freq, uint8_t ref)
{
    n->hash = norm_hash(hash);
    n->freq = freq > POLICY_FREQ_MAX ? POLICY_FREQ_MAX : freq;
    n->level = banked(p) ? 0 : (uint8_t)level_of(n->freq);
    n->ref = ref > REF_MAX ? REF_MAX : ref;
    n->seg = POLICY_PROBATION;
    n->linked = 1;
    n->fprev = n->fnext = NULL;
    link_after(p->head.prev, n);
    p->count++;
}

/* Append n at the back of second list `list` (nodes come front first). */
int policy_restore_place(policy *p, policy_node *n, unsigned list)
{
    if (!n->linked || n->fprev || list >= policy_dump_lists(p))
        return MEMOS_EINVAL;
    if (p->kind == POLICY_LFU) {
        if (list != n->level)
            return MEMOS_EINVAL;
        flink_after(p->lvl[list].fprev, n);
        return MEMOS_OK;
    }
    n->seg = (uint8_t)list;
    flink_after(p->seg[list].fprev, n);
    p->nseg[list]++;
    return MEMOS_OK;
}

int policy_restore_ghosts(policy *p, unsigned r, const uint64_t *hash, const uint8_t *live,
                          size_t len, uint64_t clock)
{
    if (r >= policy_dump_rings(p) || clock < len || p->ring[r].len)
        return MEMOS_EINVAL;
    ghost_ring *g = &p->ring[r];
    while (g->cap < len)
        if (ghost_grow_ring(g) != MEMOS_OK)
            return MEMOS_ENOMEM;
    for (size_t i = 0; i < len; i++) {
        uint64_t h = norm_hash(hash[i]), seq = clock - len + 1 + i;
        g->hash[i] = h;
        g->seq[i] = seq;
        if (!live[i])
            continue;
        if ((p->gused + 1) * 2 > p->gmask + 1 && ghost_grow_table(p) != MEMOS_OK)
            return MEMOS_ENOMEM;
        if (ghost_find(p, h) >= 0)
            return MEMOS_EINVAL;        /* a hash live twice: not a dump */
        size_t k = h & p->gmask;
        while (p->gtab[k].hash)
            k = (k + 1) & p->gmask;
        p->gtab[k] = (ghost_slot){ h, (seq << 1) | r };
        p->gused++;
        g->live++;
    }
    g->tail = 0;
    g->len = len;
    g->next_seq = clock;
    return MEMOS_OK;
}

int policy_restore_finish(policy *p, double pfrac, const uint64_t ghits[2],
                          char *why, size_t whylen)
{
    for (policy_node *x = p->head.next; x != &p->head; x = x->next)
        if (policy_dump_lists(p) && !x->fprev) {
            snprintf(why, whylen, "policy: a restored node is on no list");
            return MEMOS_EINVAL;
        }
    if (!(pfrac >= PFRAC_MIN && pfrac <= PFRAC_MAX))
        pfrac = PFRAC_INIT;
    p->pfrac = pfrac;
    p->ghits[0] = ghits[0];
    p->ghits[1] = ghits[1];
    return policy_check(p, why, whylen);
}

/* ---- the bank: published policies, each run alone over the key hashes ----
 *
 * A member ("expert") is one policy over unit-size blocks named by 64-bit
 * key hashes, with its own capacity, its own table and its own lists (and
 * ghosts): it is the policy as its paper describes it, the same, step for
 * step, as memosfs/testing/refpolicies.py (tests/test_policy_ref.py replays
 * both).  Nodes live in one growable array per member and link by index (0
 * is no node); a node is on at most two lists at once (A: prev/next; B:
 * prev2/next2), which list its la/lb says.  Lists run newest (head) to
 * oldest (tail).  An access returns 1 on a hit; a miss inserts the key and
 * evicts to the capacity, telling the bank each key it evicts
 * (bank_evicted).  xset_cap changes the capacity (evicting down to it),
 * xremove drops a key with no ghost (the live entry was deleted), xrename
 * moves a key's node to a new hash. */

#define XNIL 0u

typedef struct xnode {
    uint64_t key;                 /* key hash (never 0: norm_hash) */
    uint32_t prev, next;          /* list A: towards the head / the tail */
    uint32_t prev2, next2;        /* list B (LFU: the node's bucket in prev2) */
    uint32_t cnt;                 /* LFU count, S3-FIFO frequency, SIEVE visited bit */
    uint8_t  la, lb;              /* list A / B the node is on (0: none) */
    uint8_t  st;                  /* LIRS: XLIR, XHIR or XNONRES */
    uint8_t  pad;
} xnode;

typedef struct xlist { uint32_t head, tail; size_t len; } xlist;

typedef struct xbucket {          /* LFU: the nodes of one count, newest first */
    uint64_t count;
    uint32_t prev, next;          /* bucket list, ascending counts (0: none) */
    xlist    l;
} xbucket;

enum xkind { X_LRU, X_LFU, X_ARC, X_2Q, X_S3FIFO, X_SIEVE, X_LIRS, X_WTLFU, X_HYB };
enum { XLIR = 1, XHIR = 2, XNONRES = 3 };
#define XLISTS 8
#define XUNLIMITED SIZE_MAX       /* the capacity before the cache was ever full */

struct policy_bank;

typedef struct hyb_node {         /* a key of a hybrid member: its policy links */
    policy_node pn;               /* first */
    uint32_t    idx;              /* its xnode (the table's entry) */
} hyb_node;

typedef struct expert {
    uint8_t  kind;
    uint8_t  hyb;                 /* X_HYB: the setting (HYBRIDS index) */
    unsigned idx;                 /* place in the bank */
    uint8_t  synced;              /* 1: runs over the live cache's entries (evicts nothing itself) */
    size_t   cap;                 /* resident capacity in blocks (XUNLIMITED) */
    size_t   resident;
    int      dead;                /* an allocation failed: out of the running */
    /* nodes and their table */
    xnode   *n;
    uint32_t nalloc, freel;       /* array size, free list (through next) */
    uint32_t *tab;                /* node index, 0 empty; linear probing */
    size_t   tmask, tused;
    xlist    l[XLISTS];
    /* per kind */
    double   p;                   /* ARC: target size of T1 */
    size_t   c1, c2, c3;          /* 2Q: kin, kout; S3-FIFO: small, main, ghost; LIRS: l_hirs, l_lirs;
                                     W-TinyLFU: window, main, protected */
    uint32_t hand;                /* SIEVE: next to look at (0: the tail) */
    size_t   nlir;                /* LIRS: LIR blocks */
    int      evicted;             /* S3-FIFO: an eviction happened (warm-up over) */
    xbucket *bk;                  /* LFU: buckets, 1-based */
    uint32_t bkalloc, bkfree, bkfirst;
    uint8_t *sk;                  /* W-TinyLFU: 4 rows of `skw` 4-bit counters (a byte each) */
    size_t   skw;
    uint64_t adds, sample;
    /* X_HYB: a hybrid setting of policy.c over chunks of hyb_nodes */
    policy  *pol;
    hyb_node **chunk;             /* HYB_CHUNK nodes each; index i: chunk[i / HYB_CHUNK][i % HYB_CHUNK] */
    uint32_t nchunks;
} expert;

#define HYB_CHUNK 512u


/* ---- node store, table and lists ---- */

static uint32_t xalloc(expert *x, uint64_t key)
{
    if (x->freel == XNIL) {
        uint32_t n = x->nalloc ? x->nalloc * 2 : 64;
        if (n < x->nalloc || n > UINT32_MAX / 2) {
            x->dead = 1;
            return XNIL;
        }
        xnode *a = realloc(x->n, (size_t)n * sizeof *a);
        if (!a) {
            x->dead = 1;
            return XNIL;
        }
        memset(a + x->nalloc, 0, (size_t)(n - x->nalloc) * sizeof *a);
        for (uint32_t i = n - 1; i >= (x->nalloc ? x->nalloc : 1); i--) {
            a[i].next = x->freel;
            x->freel = i;
        }
        x->n = a;
        x->nalloc = n;
    }
    uint32_t i = x->freel;
    x->freel = x->n[i].next;
    memset(&x->n[i], 0, sizeof x->n[i]);
    x->n[i].key = key;
    return i;
}

static size_t xslot(const expert *x, uint64_t key)
{
    size_t i = mix64(key) & x->tmask;
    while (x->tab[i] && x->n[x->tab[i]].key != key)
        i = (i + 1) & x->tmask;
    return i;
}

static uint32_t xfind(const expert *x, uint64_t key)
{
    return x->tab ? x->tab[xslot(x, key)] : XNIL;
}

static int xtab_grow(expert *x)
{
    size_t n = x->tab ? (x->tmask + 1) * 2 : 256;
    uint32_t *t = calloc(n, sizeof *t);
    if (!t) {
        x->dead = 1;
        return MEMOS_ENOMEM;
    }
    uint32_t *old = x->tab;
    size_t oldn = old ? x->tmask + 1 : 0;
    x->tab = t;
    x->tmask = n - 1;
    for (size_t i = 0; i < oldn; i++)
        if (old[i])
            x->tab[xslot(x, x->n[old[i]].key)] = old[i];
    free(old);
    return MEMOS_OK;
}

/* A new node for key (not in the table), entered in the table. */
static uint32_t xnew(expert *x, uint64_t key)
{
    if ((x->tused + 1) * 2 > (x->tab ? x->tmask + 1 : 0) && xtab_grow(x) != MEMOS_OK)
        return XNIL;
    uint32_t i = xalloc(x, key);
    if (i == XNIL)
        return XNIL;
    x->tab[xslot(x, key)] = i;
    x->tused++;
    return i;
}

/* Out of the table (backward-shift deletion) and back to the free list. */
static void xfree_node(expert *x, uint32_t i)
{
    size_t s = xslot(x, x->n[i].key);
    x->tab[s] = XNIL;
    x->tused--;
    for (size_t j = (s + 1) & x->tmask; x->tab[j]; j = (j + 1) & x->tmask) {
        size_t home = mix64(x->n[x->tab[j]].key) & x->tmask;
        if (((j - home) & x->tmask) >= ((j - s) & x->tmask)) {
            x->tab[s] = x->tab[j];
            x->tab[j] = XNIL;
            s = j;
        }
    }
    x->n[i].next = x->freel;
    x->n[i].la = x->n[i].lb = 0;
    x->freel = i;
}

static void xpush(expert *x, uint8_t id, uint32_t i)          /* list A, at the head */
{
    xlist *l = &x->l[id];
    xnode *n = &x->n[i];
    n->la = id;
    n->prev = XNIL;
    n->next = l->head;
    if (l->head)
        x->n[l->head].prev = i;
    else
        l->tail = i;
    l->head = i;
    l->len++;
}

static void xunlink(expert *x, uint32_t i)                    /* off its list A */
{
    xnode *n = &x->n[i];
    xlist *l = &x->l[n->la];
    if (n->prev)
        x->n[n->prev].next = n->next;
    else
        l->head = n->next;
    if (n->next)
        x->n[n->next].prev = n->prev;
    else
        l->tail = n->prev;
    l->len--;
    n->la = 0;
    n->prev = n->next = XNIL;
}

static void xpush2(expert *x, uint8_t id, uint32_t i)         /* list B, at the head */
{
    xlist *l = &x->l[id];
    xnode *n = &x->n[i];
    n->lb = id;
    n->prev2 = XNIL;
    n->next2 = l->head;
    if (l->head)
        x->n[l->head].prev2 = i;
    else
        l->tail = i;
    l->head = i;
    l->len++;
}

static void xunlink2(expert *x, uint32_t i)                   /* off its list B */
{
    xnode *n = &x->n[i];
    xlist *l = &x->l[n->lb];
    if (n->prev2)
        x->n[n->prev2].next2 = n->next2;
    else
        l->head = n->next2;
    if (n->next2)
        x->n[n->next2].prev2 = n->prev2;
    else
        l->tail = n->prev2;
    l->len--;
    n->lb = 0;
    n->prev2 = n->next2 = XNIL;
}

static uint64_t xkey(const expert *x, uint32_t i) { return x->n[i].key; }

static void xfront(expert *x, uint32_t i)                     /* to the head of its list A */
{
    uint8_t id = x->n[i].la;
    xunlink(x, i);
    xpush(x, id, i);
}

/* ---- LRU: one list, most recent first ---- */

enum { LRU_Q = 1 };

static int lru_access(expert *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (i) {
        xfront(x, i);
        return 1;
    }
    while (!x->synced && x->resident >= x->cap) {
        uint32_t v = x->l[LRU_Q].tail;
        xunlink(x, v);
        x->resident--;
        xfree_node(x, v);
    }
    if ((i = xnew(x, key)) == XNIL)
        return 0;
    xpush(x, LRU_Q, i);
    x->resident++;
    return 0;
}

/* ---- LFU: counts while cached; ties: the first to reach the count ----
 * Buckets of equal counts in ascending order (O(1) per access, after
 * Shah, Mitra and Matani, "An O(1) algorithm for implementing the LFU cache
 * eviction scheme", 2010); a node's bucket is in prev2. */

static uint32_t bk_new(expert *x, uint64_t count, uint32_t after)
{
    if (!x->bkfree) {
        uint32_t n = x->bkalloc ? x->bkalloc * 2 : 16;
        xbucket *a = realloc(x->bk, (size_t)n * sizeof *a);
        if (!a) {
            x->dead = 1;
            return 0;
        }
        for (uint32_t i = n - 1; i >= (x->bkalloc ? x->bkalloc : 1); i--) {
            a[i].next = x->bkfree;
            x->bkfree = i;
        }
        x->bk = a;
        x->bkalloc = n;
    }
    uint32_t b = x->bkfree;
    x->bkfree = x->bk[b].next;
    memset(&x->bk[b], 0, sizeof x->bk[b]);
    x->bk[b].count = count;
    x->bk[b].prev = after;
    x->bk[b].next = after ? x->bk[after].next : x->bkfirst;
    if (x->bk[b].next)
        x->bk[x->bk[b].next].prev = b;
    if (after)
        x->bk[after].next = b;
    else
        x->bkfirst = b;
    return b;
}

static void bk_put(expert *x, uint32_t b, uint32_t i)         /* at the bucket's head */
{
    xlist *l = &x->bk[b].l;
    xnode *n = &x->n[i];
    n->prev2 = b;
    n->la = 1;
    n->prev = XNIL;
    n->next = l->head;
    if (l->head)
        x->n[l->head].prev = i;
    else
        l->tail = i;
    l->head = i;
    l->len++;
}

static void bk_take(expert *x, uint32_t i)                    /* off its bucket; empty buckets go */
{
    uint32_t b = x->n[i].prev2;
    xlist *l = &x->bk[b].l;
    xnode *n = &x->n[i];
    if (n->prev)
        x->n[n->prev].next = n->next;
    else
        l->head = n->next;
    if (n->next)
        x->n[n->next].prev = n->prev;
    else
        l->tail = n->prev;
    l->len--;
    n->la = 0;
    n->prev = n->next = XNIL;
    if (l->len)
        return;
    xbucket *k = &x->bk[b];
    if (k->prev)
        x->bk[k->prev].next = k->next;
    else
        x->bkfirst = k->next;
    if (k->next)
        x->bk[k->next].prev = k->prev;
    k->next = x->bkfree;
    x->bkfree = b;
}

static int lfu_access(expert *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (i) {
        uint32_t b = x->n[i].prev2;
        uint64_t c = x->bk[b].count + 1;
        uint32_t nb = x->bk[b].next;
        if (!nb || x->bk[nb].count != c) {
            nb = bk_new(x, c, b);
            if (!nb)
                return 1;
        }
        bk_take(x, i);
        bk_put(x, nb, i);
        x->n[i].cnt = c > UINT32_MAX ? UINT32_MAX : (uint32_t)c;
        return 1;
    }
    while (!x->synced && x->resident >= x->cap) {
        uint32_t v = x->bk[x->bkfirst].l.tail;
        bk_take(x, v);
        x->resident--;
        xfree_node(x, v);
    }
    uint32_t b = x->bkfirst;
    if (!b || x->bk[b].count != 1) {
        b = bk_new(x, 1, 0);
        if (!b)
            return 0;
    }
    if ((i = xnew(x, key)) == XNIL)
        return 0;
    bk_put(x, b, i);
    x->n[i].cnt = 1;
    x->resident++;
    return 0;
}

/* ---- ARC (Megiddo and Modha, FAST 2003, Fig. 4) ---- */

enum { ARC_T1 = 1, ARC_T2 = 2, ARC_B1 = 3, ARC_B2 = 4 };

static void arc_replace(expert *x, int in_b2)
{
    size_t t1 = x->l[ARC_T1].len;
    if ((t1 && ((double)t1 > x->p || (in_b2 && (double)t1 == x->p))) || !x->l[ARC_T2].len) {
        uint32_t v = x->l[ARC_T1].tail;
        xunlink(x, v);
        xpush(x, ARC_B1, v);
        x->resident--;
    } else {
        uint32_t v = x->l[ARC_T2].tail;
        xunlink(x, v);
        xpush(x, ARC_B2, v);
        x->resident--;
    }
}

static void arc_drop(expert *x, uint8_t list)                /* a ghost's LRU end goes */
{
    uint32_t v = x->l[list].tail;
    xunlink(x, v);
    xfree_node(x, v);
}

/* Ghosts within ARC's bounds: |T1| + |B1| <= c, all four <= 2c. */
static void arc_trim(expert *x)
{
    if (x->cap == XUNLIMITED)
        return;
    while (x->l[ARC_T1].len + x->l[ARC_B1].len > x->cap && x->l[ARC_B1].len)
        arc_drop(x, ARC_B1);
    while (x->resident + x->l[ARC_B1].len + x->l[ARC_B2].len > 2 * x->cap && x->l[ARC_B2].len)
        arc_drop(x, ARC_B2);
}

static int arc_access(expert *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    double c = (double)x->cap;
    if (i && (x->n[i].la == ARC_T1 || x->n[i].la == ARC_T2)) {   /* case I */
        xunlink(x, i);
        xpush(x, ARC_T2, i);
        return 1;
    }
    int full = !x->synced && x->resident >= x->cap;
    if (i) {                                                   /* cases II, III */
        double b1 = (double)x->l[ARC_B1].len, b2 = (double)x->l[ARC_B2].len;
        int in_b2 = x->n[i].la == ARC_B2;
        if (!in_b2) {
            double d = b2 / b1 > 1.0 ? b2 / b1 : 1.0;
            x->p = x->p + d < c ? x->p + d : c;
        } else {
            double d = b1 / b2 > 1.0 ? b1 / b2 : 1.0;
            x->p = x->p - d > 0.0 ? x->p - d : 0.0;
        }
        xunlink(x, i);
        if (full)
            arc_replace(x, in_b2);
        xpush(x, ARC_T2, i);
        x->resident++;
        return 0;
    }
    size_t l1 = x->l[ARC_T1].len + x->l[ARC_B1].len;          /* case IV */
    if (full) {
        if (l1 >= x->cap) {
            if (x->l[ARC_T1].len < x->cap) {
                arc_drop(x, ARC_B1);
                arc_replace(x, 0);
            } else {
                uint32_t v = x->l[ARC_T1].tail;
                xunlink(x, v);
                x->resident--;
                xfree_node(x, v);
            }
        } else {
            if (l1 + x->l[ARC_T2].len + x->l[ARC_B2].len >= 2 * x->cap && x->l[ARC_B2].len)
                arc_drop(x, ARC_B2);
            arc_replace(x, 0);
        }
    }
    if ((i = xnew(x, key)) == XNIL)
        return 0;
    xpush(x, ARC_T1, i);
    x->resident++;
    if (x->synced)
        arc_trim(x);
    return 0;
}

/* ---- 2Q (Johnson and Shasha, VLDB 1994, the full version) ---- */

enum { Q2_IN = 1, Q2_OUT = 2, Q2_AM = 3 };

static void q2_reclaim(expert *x)
{
    if (x->l[Q2_IN].len + x->l[Q2_AM].len < x->cap)
        return;
    if (x->l[Q2_IN].len > x->c1 || !x->l[Q2_AM].len) {
        uint32_t v = x->l[Q2_IN].tail;
        xunlink(x, v);
        xpush(x, Q2_OUT, v);
        x->resident--;
        if (x->l[Q2_OUT].len > x->c2) {
            uint32_t g = x->l[Q2_OUT].tail;
            xunlink(x, g);
            xfree_node(x, g);
        }
    } else {
        uint32_t v = x->l[Q2_AM].tail;
        xunlink(x, v);
        x->resident--;
        xfree_node(x, v);
    }
}

static int q2_access(expert *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (i && x->n[i].la == Q2_AM) {
        xfront(x, i);
        return 1;
    }
    if (i && x->n[i].la == Q2_IN)
        return 1;
    if (i) {                            /* in A1out */
        xunlink(x, i);
        if (!x->synced)
            q2_reclaim(x);
        xpush(x, Q2_AM, i);
        x->resident++;
        return 0;
    }
    if (!x->synced)
        q2_reclaim(x);
    if ((i = xnew(x, key)) == XNIL)
        return 0;
    xpush(x, Q2_IN, i);
    x->resident++;
    return 0;
}

/* ---- S3-FIFO (Yang et al., SOSP 2023, Algorithm 1) as libCacheSim runs
 * it: before the first eviction new keys go to M once S is full, and a key
 * moved from S to M does not evict from M at once. ---- */

enum { S3_S = 1, S3_M = 2, S3_G = 3 };

static void s3_evict_m(expert *x)
{
    while (x->l[S3_M].len) {
        uint32_t t = x->l[S3_M].tail;
        xunlink(x, t);
        if (x->n[t].cnt > 0) {
            x->n[t].cnt--;
            xpush(x, S3_M, t);
        } else {
            x->resident--;
            xfree_node(x, t);
            return;
        }
    }
}

static void s3_evict_s(expert *x)
{
    while (x->l[S3_S].len) {
        uint32_t t = x->l[S3_S].tail;
        xunlink(x, t);
        if (x->n[t].cnt > 1) {
            x->n[t].cnt = 0;
            xpush(x, S3_M, t);
        } else {
            x->n[t].cnt = 0;
            xpush(x, S3_G, t);
            x->resident--;
            if (x->l[S3_G].len > x->c3) {
                uint32_t g = x->l[S3_G].tail;
                xunlink(x, g);
                xfree_node(x, g);
            }
            return;
        }
    }
}

static void s3_evict(expert *x)
{
    x->evicted = 1;
    if (x->l[S3_S].len >= x->c1 || !x->l[S3_M].len)
        s3_evict_s(x);
    else
        s3_evict_m(x);
}

static int s3_access(expert *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (i && x->n[i].la != S3_G) {
        if (x->n[i].cnt < 3)
            x->n[i].cnt++;
        return 1;
    }
    if (i)
        xunlink(x, i);                  /* out of G before the evictions (as libCacheSim) */
    while (!x->synced && x->resident >= x->cap)
        s3_evict(x);
    if (i) {
        xpush(x, S3_M, i);
    } else {
        if ((i = xnew(x, key)) == XNIL)
            return 0;
        xpush(x, !x->evicted && x->l[S3_S].len >= x->c1 ? S3_M : S3_S, i);
    }
    x->n[i].cnt = 0;
    x->resident++;
    return 0;
}

/* ---- SIEVE (Zhang et al., NSDI 2024): a FIFO, a visited bit, a hand
 * moving from the tail towards the head ---- */

enum { SV_Q = 1 };

static int sieve_access(expert *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (i) {
        x->n[i].cnt = 1;
        return 1;
    }
    while (!x->synced && x->resident >= x->cap) {
        uint32_t o = x->hand ? x->hand : x->l[SV_Q].tail;
        while (x->n[o].cnt) {
            x->n[o].cnt = 0;
            o = x->n[o].prev ? x->n[o].prev : x->l[SV_Q].tail;
        }
        x->hand = x->n[o].prev;
        xunlink(x, o);
        x->resident--;
        xfree_node(x, o);
    }
    if ((i = xnew(x, key)) == XNIL)
        return 0;
    xpush(x, SV_Q, i);
    x->resident++;
    return 0;
}

/* ---- LIRS (Jiang and Zhang, SIGMETRICS 2002): stack S (list A, top at
 * the head), queue Q of resident HIR blocks (list B, its end at the head);
 * non-resident HIR blocks in S are also on list B (LI_NR, oldest at the
 * tail) so the stack is kept to 2 x capacity entries as libCacheSim does ---- */

enum { LI_S = 1, LI_Q = 2, LI_NR = 3 };

static void li_prune(expert *x)
{
    while (x->l[LI_S].len) {
        uint32_t k = x->l[LI_S].tail;
        if (x->n[k].st == XLIR)
            return;
        xunlink(x, k);
        if (x->n[k].st == XNONRES) {
            xunlink2(x, k);
            xfree_node(x, k);
        }
    }
}

static void li_demote(expert *x)                   /* S's bottom LIR block becomes HIR */
{
    uint32_t k = x->l[LI_S].tail;
    xunlink(x, k);
    x->n[k].st = XHIR;
    x->nlir--;
    xpush2(x, LI_Q, k);
    li_prune(x);
}

static void li_evict_hir(expert *x)                /* Q's front leaves the cache */
{
    if (!x->l[LI_Q].len && x->l[LI_S].len)
        li_demote(x);                   /* (a cache too small for any HIR block) */
    uint32_t k = x->l[LI_Q].tail;
    if (!k)
        return;
    xunlink2(x, k);
    x->resident--;
    if (x->n[k].la == LI_S) {
        x->n[k].st = XNONRES;
        xpush2(x, LI_NR, k);
    } else {
        xfree_node(x, k);
    }
}

static void li_limit(expert *x)
{
    while (x->cap != XUNLIMITED && x->l[LI_S].len > 2 * x->cap && x->l[LI_NR].len) {
        uint32_t k = x->l[LI_NR].tail;
        xunlink2(x, k);
        xunlink(x, k);
        xfree_node(x, k);
    }
}

static int lirs_access(expert *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    uint8_t st = i ? x->n[i].st : 0;
    int hit = st == XLIR || st == XHIR;
    if (st == XLIR) {
        xfront(x, i);
        li_prune(x);
    } else if (st == XHIR) {
        if (x->n[i].la == LI_S) {
            xfront(x, i);
            xunlink2(x, i);
            x->n[i].st = XLIR;
            x->nlir++;
            li_demote(x);
        } else {
            xpush(x, LI_S, i);
            xunlink2(x, i);
            xpush2(x, LI_Q, i);
        }
    } else {
        size_t res = x->nlir + x->l[LI_Q].len;
        if (x->nlir < x->c2 && st == 0) {
            if ((i = xnew(x, key)) == XNIL)
                return 0;
            xpush(x, LI_S, i);
            x->n[i].st = XLIR;
            x->nlir++;
            x->resident++;
        } else {
            if (!x->synced && res >= x->cap)
                li_evict_hir(x);
            if (st == XNONRES) {
                xunlink2(x, i);
                xfront(x, i);
                x->n[i].st = XLIR;
                x->nlir++;
                x->resident++;
                if (x->nlir > x->c2)
                    li_demote(x);
            } else {
                if ((i = xnew(x, key)) == XNIL)
                    return 0;
                xpush(x, LI_S, i);
                xpush2(x, LI_Q, i);
                x->n[i].st = XHIR;
                x->resident++;
            }
        }
    }
    li_prune(x);                        /* (no LIR block at all: the stack empties) */
    li_limit(x);
    return hit;
}

/* ---- W-TinyLFU (Einziger, Friedman and Manes, ACM ToS 2017; Caffeine's
 * layout): window LRU 1%, main SLRU (probation 20%, protected 80%), a
 * count-min sketch of 4 rows x skw 4-bit counters (minimal increment,
 * halved every 10 x capacity additions) ---- */

enum { WT_W = 1, WT_P = 2, WT_R = 3, WT_D = 4 };   /* D: synced, lost a contest, still live */
#define WT_ROWS 4

static size_t wt_col(uint64_t key, unsigned row, size_t mask)
{
    return mix64(key + (uint64_t)(row + 1) * 0x9e3779b97f4a7c15ull) & mask;
}

static int wt_sketch(expert *x, size_t cap)         /* a sketch sized for cap, all zero */
{
    size_t w = 16;
    while (w < 4 * cap && w < ((size_t)1 << 40))
        w *= 2;
    uint8_t *s = calloc(WT_ROWS * w, 1);
    if (!s) {
        x->dead = 1;
        return MEMOS_ENOMEM;
    }
    free(x->sk);
    x->sk = s;
    x->skw = w;
    x->adds = 0;
    x->sample = 10 * (uint64_t)cap;
    return MEMOS_OK;
}

static void wt_add(expert *x, uint64_t key)
{
    size_t mask = x->skw - 1, col[WT_ROWS];
    uint8_t low = 255;
    for (unsigned r = 0; r < WT_ROWS; r++) {
        col[r] = r * x->skw + wt_col(key, r, mask);
        if (x->sk[col[r]] < low)
            low = x->sk[col[r]];
    }
    if (low < 15)
        for (unsigned r = 0; r < WT_ROWS; r++)
            if (x->sk[col[r]] == low)
                x->sk[col[r]]++;
    if (++x->adds >= x->sample) {
        x->adds /= 2;
        for (size_t j = 0; j < WT_ROWS * x->skw; j++)
            x->sk[j] >>= 1;
    }
}

static uint8_t wt_est(const expert *x, uint64_t key)
{
    size_t mask = x->skw - 1;
    uint8_t low = 255;
    for (unsigned r = 0; r < WT_ROWS; r++) {
        uint8_t v = x->sk[r * x->skw + wt_col(key, r, mask)];
        if (v < low)
            low = v;
    }
    return low;
}

static void wt_evict_one(expert *x, uint32_t v, uint8_t list)
{
    (void)list;
    xunlink(x, v);
    x->resident--;
    xfree_node(x, v);
}

/* The window's oldest leaves it: into the main cache if there is room or if
 * the sketch says it is more frequent than the main cache's victim. */
static void wt_window_out(expert *x)
{
    uint32_t cand = x->l[WT_W].tail;
    xunlink(x, cand);
    if (x->l[WT_P].len + x->l[WT_R].len < x->c2) {
        xpush(x, WT_P, cand);
        return;
    }
    if (!x->l[WT_P].len && !x->l[WT_R].len) {      /* no main cache (capacity 1) */
        x->resident--;
        xfree_node(x, cand);
        return;
    }
    uint8_t main = x->l[WT_P].len ? WT_P : WT_R;
    uint32_t victim = x->l[main].tail;
    if (wt_est(x, x->n[cand].key) > wt_est(x, x->n[victim].key)) {
        wt_evict_one(x, victim, main);
        xpush(x, WT_P, cand);
    } else {
        x->resident--;
        xfree_node(x, cand);
    }
}

static int wt_access(expert *x, uint64_t key)
{
    if (x->cap == XUNLIMITED && 4 * (x->resident + 1) > x->skw && x->skw < ((size_t)1 << 30))
        wt_sketch(x, 2 * x->skw);       /* not yet full: the sketch grows with the cache */
    if (!x->sk)
        return 0;
    wt_add(x, key);
    uint32_t i = xfind(x, key);
    if (i && (x->n[i].la == WT_W || x->n[i].la == WT_R)) {
        xfront(x, i);
        return 1;
    }
    if (i) {                            /* probation (or lost a contest): to protected */
        xunlink(x, i);
        xpush(x, WT_R, i);
        if (x->l[WT_R].len > x->c3) {
            uint32_t k = x->l[WT_R].tail;
            xunlink(x, k);
            xpush(x, WT_P, k);
        }
        return 1;
    }
    if ((i = xnew(x, key)) == XNIL)
        return 0;
    xpush(x, WT_W, i);
    x->resident++;
    if (x->synced) {
        /* the window's oldest contests the main victim now, as alone; the
         * loser stays live (the live cache evicts) but goes first (D) */
        size_t main = x->l[WT_P].len + x->l[WT_R].len;
        if (x->l[WT_W].len > x->c1 && x->hand && main) {
            /* a slot a batch of victims freed in the main cache: only a
             * candidate that beats the main victim takes it */
            uint32_t c = x->l[WT_W].tail;
            uint8_t ml = x->l[WT_P].len ? WT_P : WT_R;
            xunlink(x, c);
            x->hand--;
            xpush(x, wt_est(x, xkey(x, c)) > wt_est(x, xkey(x, x->l[ml].tail)) ? WT_P : WT_D, c);
        } else if (x->l[WT_W].len > x->c1 && main + x->l[WT_D].len < x->c2) {
            uint32_t c = x->l[WT_W].tail;
            xunlink(x, c);
            xpush(x, WT_P, c);
        } else if (x->l[WT_W].len > x->c1 && main) {
            uint32_t c = x->l[WT_W].tail;
            uint8_t ml = x->l[WT_P].len ? WT_P : WT_R;
            uint32_t v = x->l[ml].tail;
            xunlink(x, c);
            if (wt_est(x, xkey(x, c)) > wt_est(x, xkey(x, v))) {
                xunlink(x, v);
                xpush(x, WT_D, v);
                xpush(x, WT_P, c);
            } else {
                xpush(x, WT_D, c);
            }
        }
        return 0;
    }
    while (x->l[WT_W].len > x->c1 && x->l[WT_P].len + x->l[WT_R].len < x->c2) {
        uint32_t c = x->l[WT_W].tail;         /* room in the main cache: no contest */
        xunlink(x, c);
        xpush(x, WT_P, c);
    }
    if (x->l[WT_W].len > x->c1)
        wt_window_out(x);
    while (x->cap != XUNLIMITED && x->resident > x->cap) {
        /* the main cache above its share since the capacity shrank (the
         * window short of its own): the main victim goes */
        uint8_t m = x->l[WT_P].len ? WT_P : x->l[WT_R].len ? WT_R : WT_W;
        wt_evict_one(x, x->l[m].tail, m);
    }
    return 0;
}

/* ---- a hybrid setting (lru_lfu@i, policy.c's own) as a member: the
 * table's xnode i and hyb_node i go together ---- */

static hyb_node *hyb_at(const expert *x, uint32_t i)
{
    return &x->chunk[i / HYB_CHUNK][i % HYB_CHUNK];
}

static int hyb_room(expert *x)                      /* hyb_nodes for every xnode */
{
    while ((size_t)x->nchunks * HYB_CHUNK < x->nalloc) {
        hyb_node **c = realloc(x->chunk, (x->nchunks + 1) * sizeof *c);
        if (!c)
            goto oom;
        x->chunk = c;
        if (!(c[x->nchunks] = calloc(HYB_CHUNK, sizeof **c)))
            goto oom;
        x->nchunks++;
    }
    return MEMOS_OK;
oom:
    x->dead = 1;
    return MEMOS_ENOMEM;
}

static void hyb_evict_to(expert *x, size_t cap)
{
    while (x->resident > cap) {
        policy_node *v;
        if (policy_victims(x->pol, &v, 1) != 1)
            return;
        uint32_t i = ((hyb_node *)v)->idx;
        policy_note_evict(x->pol, v);
        policy_remove(x->pol, v);
        x->resident--;
        xfree_node(x, i);
    }
}

static int hyb_access(expert *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (i) {
        policy_touch(x->pol, &hyb_at(x, i)->pn);
        return 1;
    }
    if (!x->synced && x->resident >= x->cap)
        hyb_evict_to(x, x->cap - 1);
    if ((i = xnew(x, key)) == XNIL)
        return 0;
    if (hyb_room(x) != MEMOS_OK) {
        xfree_node(x, i);
        return 0;
    }
    hyb_node *h = hyb_at(x, i);
    memset(h, 0, sizeof *h);
    h->idx = i;
    policy_admit(x->pol, &h->pn, key);
    x->resident++;
    return 0;
}

/* ---- a member: make, free, access, capacity, removal, renaming ---- */

typedef struct bank_member {
    const char *name;
    uint8_t     kind, hyb;
} bank_member;

/* The bank: the published policies of bench policy's peers (each as its
 * paper describes it; see refpolicies.py) and three of policy.c's own
 * hybrid settings, which beat every peer on some streams (HYBRIDS 1: the
 * ghost rule, the Mooncake trace; 2: probation 0.1, sessions; 5: tiny
 * probation with ghost hits replacing cold blocks, loops and Zipf). */
static const bank_member BANK[] = {
    { "LRU", X_LRU, 0 },       { "LFU", X_LFU, 0 },         { "ARC", X_ARC, 0 },
    { "2Q", X_2Q, 0 },         { "S3-FIFO", X_S3FIFO, 0 },  { "SIEVE", X_SIEVE, 0 },
    { "LIRS", X_LIRS, 0 },     { "W-TinyLFU", X_WTLFU, 0 }, { "lru_lfu@1", X_HYB, 1 },
    { "lru_lfu@2", X_HYB, 2 }, { "lru_lfu@5", X_HYB, 5 },
};
#define BANK_N (sizeof BANK / sizeof BANK[0])
#define BANK_LRU 0u                 /* BANK[0] */

/* Capacity-derived sizes of each kind (XUNLIMITED: the cache was never full). */
static void x_sizes(expert *x)
{
    size_t c = x->cap;
    int u = c == XUNLIMITED;
    switch (x->kind) {
    case X_2Q:
        x->c1 = u ? c : (size_t)((double)c * 0.25);
        x->c2 = u ? c : (size_t)((double)c * 0.5);
        break;
    case X_S3FIFO:
        x->c1 = u ? c : (size_t)((double)c * 0.1);
        x->c1 = x->c1 ? x->c1 : 1;
        x->c2 = u ? c : c - x->c1;
        x->c3 = u ? c : (size_t)((double)c * 0.9);
        break;
    case X_LIRS:
        x->c1 = u ? 0 : (size_t)(0.01 * (double)c);
        x->c1 = x->c1 ? x->c1 : 1;
        x->c2 = u ? c : c - x->c1;
        break;
    case X_WTLFU:
        x->c1 = u ? c : (size_t)((double)c * 0.01);
        x->c1 = x->c1 ? x->c1 : 1;
        x->c2 = u ? c : c - x->c1;
        x->c3 = u ? c : (size_t)((double)x->c2 * 0.8);
        break;
    default:
        break;
    }
}

static int x_init(expert *x, unsigned member, size_t cap, unsigned idx)
{
    memset(x, 0, sizeof *x);
    x->kind = BANK[member].kind;
    x->hyb = BANK[member].hyb;
    x->idx = idx;
    x->cap = cap ? cap : 1;
    x_sizes(x);
    if (x->kind == X_WTLFU && wt_sketch(x, x->cap == XUNLIMITED ? 1024 : x->cap) != MEMOS_OK)
        return MEMOS_ENOMEM;
    if (x->kind == X_HYB) {
        if (!(x->pol = malloc(sizeof *x->pol)) || policy_init(x->pol, "lru_lfu", NULL, NULL) != MEMOS_OK) {
            free(x->pol);
            x->pol = NULL;
            return MEMOS_ENOMEM;
        }
        policy_fix_expert(x->pol, x->hyb);
    }
    return MEMOS_OK;
}

static void x_free(expert *x)
{
    if (x->pol) {
        policy_destroy(x->pol);
        free(x->pol);
    }
    for (uint32_t c = 0; c < x->nchunks; c++)
        free(x->chunk[c]);
    free(x->chunk);
    free(x->n);
    free(x->tab);
    free(x->bk);
    free(x->sk);
    memset(x, 0, sizeof *x);
}

/* One access of key: 1 on a hit.  A dead member (no memory) hits nothing. */
static int x_access(expert *x, uint64_t key)
{
    if (x->dead)
        return 0;
    switch (x->kind) {
    case X_LRU:    return lru_access(x, key);
    case X_LFU:    return lfu_access(x, key);
    case X_ARC:    return arc_access(x, key);
    case X_2Q:     return q2_access(x, key);
    case X_S3FIFO: return s3_access(x, key);
    case X_SIEVE:  return sieve_access(x, key);
    case X_LIRS:   return lirs_access(x, key);
    case X_WTLFU:  return wt_access(x, key);
    default:       return hyb_access(x, key);
    }
}

static int x_resident(const expert *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (!i)
        return 0;
    switch (x->kind) {
    case X_ARC:    return x->n[i].la == ARC_T1 || x->n[i].la == ARC_T2;
    case X_2Q:     return x->n[i].la != Q2_OUT;
    case X_S3FIFO: return x->n[i].la != S3_G;
    case X_LIRS:   return x->n[i].st != XNONRES;
    default:       return 1;
    }
}

/* Drop key (resident or ghost) without a ghost: the live entry was deleted. */
static void x_remove(expert *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (!i)
        return;
    int res = x_resident(x, key);
    xnode *n = &x->n[i];
    switch (x->kind) {
    case X_LFU:
        bk_take(x, i);
        break;
    case X_SIEVE:
        if (x->hand == i)
            x->hand = n->prev;
        xunlink(x, i);
        break;
    case X_LIRS:
        if (n->st == XLIR)
            x->nlir--;
        if (n->lb)
            xunlink2(x, i);
        if (n->la) {
            xunlink(x, i);
            li_prune(x);
        }
        break;
    case X_HYB:
        policy_remove(x->pol, &hyb_at(x, i)->pn);
        break;
    default:
        xunlink(x, i);
        break;
    }
    if (res)
        x->resident--;
    xfree_node(x, i);
}

/* key's block is now named to (to's own, if any, is gone first). */
static void x_rename(expert *x, uint64_t key, uint64_t to)
{
    if (key == to || x->dead)
        return;
    x_remove(x, to);
    uint32_t i = xfind(x, key);
    if (!i)
        return;
    size_t s = xslot(x, key);
    /* out of the table and back in under the new key, the node kept */
    x->tab[s] = XNIL;
    x->tused--;
    for (size_t j = (s + 1) & x->tmask; x->tab[j]; j = (j + 1) & x->tmask) {
        size_t home = mix64(x->n[x->tab[j]].key) & x->tmask;
        if (((j - home) & x->tmask) >= ((j - s) & x->tmask)) {
            x->tab[s] = x->tab[j];
            x->tab[j] = XNIL;
            s = j;
        }
    }
    x->n[i].key = to;
    x->tab[xslot(x, to)] = i;
    x->tused++;
    if (x->kind == X_HYB)
        policy_rekey(x->pol, &hyb_at(x, i)->pn, to);
}

/* Evict down to the capacity cap (the cache's size changed). */
static void x_set_cap(expert *x, size_t cap)
{
    cap = cap ? cap : 1;
    if (cap == x->cap || x->dead)
        return;
    x->cap = cap;
    x_sizes(x);
    if (x->synced) {                    /* the live cache evicts; only the sizes follow */
        if (x->kind == X_ARC) {
            x->p = x->p < (double)cap ? x->p : (double)cap;
            arc_trim(x);
        } else if (x->kind == X_WTLFU && cap != XUNLIMITED && x->skw < 4 * cap) {
            wt_sketch(x, cap);
        } else if (x->kind == X_WTLFU && cap != XUNLIMITED) {
            x->sample = 10 * (uint64_t)cap;
        }
        return;
    }
    switch (x->kind) {
    case X_LRU:
    case X_SIEVE:
    case X_LFU:
        /* an access of a key it holds evicts nothing: evict as a miss would */
        while (x->resident > cap) {
            uint32_t v;
            if (x->kind == X_LFU) {
                v = x->bk[x->bkfirst].l.tail;
                bk_take(x, v);
            } else if (x->kind == X_LRU) {
                v = x->l[LRU_Q].tail;
                xunlink(x, v);
            } else {
                uint32_t o = x->hand ? x->hand : x->l[SV_Q].tail;
                while (x->n[o].cnt) {
                    x->n[o].cnt = 0;
                    o = x->n[o].prev ? x->n[o].prev : x->l[SV_Q].tail;
                }
                x->hand = x->n[o].prev;
                xunlink(x, o);
                v = o;
            }
            x->resident--;
            xfree_node(x, v);
        }
        break;
    case X_ARC:
        x->p = x->p < (double)cap ? x->p : (double)cap;
        while (x->resident > cap)
            arc_replace(x, 0);
        while (x->l[ARC_T1].len + x->l[ARC_B1].len > cap && x->l[ARC_B1].len)
            arc_drop(x, ARC_B1);
        while (x->resident + x->l[ARC_B1].len + x->l[ARC_B2].len > 2 * cap && x->l[ARC_B2].len)
            arc_drop(x, ARC_B2);
        break;
    case X_2Q:
        while (x->resident > cap) {
            size_t was = x->cap;
            x->cap = x->resident;       /* q2_reclaim evicts when the lists fill the cap */
            q2_reclaim(x);
            x->cap = was;
        }
        while (x->l[Q2_OUT].len > x->c2) {
            uint32_t g = x->l[Q2_OUT].tail;
            xunlink(x, g);
            xfree_node(x, g);
        }
        break;
    case X_S3FIFO:
        while (x->resident > cap)
            s3_evict(x);
        while (x->l[S3_G].len > x->c3) {
            uint32_t g = x->l[S3_G].tail;
            xunlink(x, g);
            xfree_node(x, g);
        }
        break;
    case X_LIRS:
        while (x->nlir > x->c2)
            li_demote(x);
        while (x->resident > cap)
            li_evict_hir(x);
        li_limit(x);
        break;
    case X_WTLFU:
        if (cap == XUNLIMITED)
            ;                           /* the sketch grows with the cache (wt_access) */
        else if (x->skw < 4 * cap)
            wt_sketch(x, cap);
        else
            x->sample = 10 * (uint64_t)cap;
        while (x->l[WT_R].len > x->c3) {
            uint32_t k = x->l[WT_R].tail;
            xunlink(x, k);
            xpush(x, WT_P, k);
        }
        while (x->l[WT_W].len > x->c1 && x->l[WT_P].len + x->l[WT_R].len < x->c2) {
            uint32_t k = x->l[WT_W].tail;
            xunlink(x, k);
            xpush(x, WT_P, k);
        }
        while (x->resident > cap) {
            if (x->l[WT_W].len > x->c1) {
                wt_window_out(x);
            } else {
                uint8_t m = x->l[WT_P].len ? WT_P : x->l[WT_R].len ? WT_R : WT_W;
                wt_evict_one(x, x->l[m].tail, m);
            }
        }
        break;
    default:
        hyb_evict_to(x, cap);
        break;
    }
}

static uint64_t x_bytes(const expert *x)
{
    uint64_t b = (uint64_t)x->nalloc * sizeof(xnode) + (x->tab ? (x->tmask + 1) * sizeof *x->tab : 0) +
                 (uint64_t)x->bkalloc * sizeof(xbucket) + WT_ROWS * (uint64_t)x->skw;
    if (x->pol) {
        const policy *p = x->pol;
        b += sizeof *p + (uint64_t)x->nchunks * HYB_CHUNK * sizeof(hyb_node) +
             (p->ring[0].cap + p->ring[1].cap) * 2 * sizeof(uint64_t) +
             (p->gtab ? (p->gmask + 1) * sizeof *p->gtab : 0);
    }
    return b;
}

/* The member's own invariants: its table holds its nodes, its lists add up. */
static int x_check(const expert *x, char *why, size_t whylen)
{
    if (x->dead)
        return MEMOS_OK;
    size_t listed = 0, res = 0;
    for (unsigned l = 1; l < XLISTS; l++)
        listed += x->l[l].len;
    for (size_t s = 0; x->tab && s <= x->tmask; s++) {
        uint32_t i = x->tab[s];
        if (!i)
            continue;
        if (i >= x->nalloc || xfind(x, x->n[i].key) != i)
            FAIL("policy: bank member %u: table entry %zu is wrong", x->idx, s);
        res += x_resident(x, x->n[i].key);
    }
    if (res != x->resident)
        FAIL("policy: bank member %u holds %zu, counts %zu", x->idx, res, x->resident);
    if (!x->synced && x->cap != XUNLIMITED && x->resident > x->cap)
        FAIL("policy: bank member %u holds %zu over its capacity %zu", x->idx, x->resident, x->cap);
    (void)listed;
    if (x->kind == X_HYB)
        return policy_check(x->pol, why, whylen);
    if (x->kind == X_LIRS) {
        size_t lir = 0;
        if (x->l[LI_S].tail && x->n[x->l[LI_S].tail].st != XLIR)
            FAIL("policy: bank member %u (LIRS): the stack's bottom is not LIR", x->idx);
        for (uint32_t i = x->l[LI_S].head; i; i = x->n[i].next)
            if (x->n[i].la != LI_S)
                FAIL("policy: bank member %u (LIRS): a stack node is marked off it", x->idx);
        for (uint32_t i = x->l[LI_NR].head; i; i = x->n[i].next2)
            if (x->n[i].st != XNONRES || x->n[i].la != LI_S || x->n[i].lb != LI_NR)
                FAIL("policy: bank member %u (LIRS): a non-resident node is out of the stack", x->idx);
        for (uint32_t i = x->l[LI_Q].head; i; i = x->n[i].next2)
            if (x->n[i].st != XHIR || x->n[i].lb != LI_Q)
                FAIL("policy: bank member %u (LIRS): a queue node is not resident HIR", x->idx);
        for (size_t t = 0; t <= x->tmask && x->tab; t++)
            lir += x->tab[t] && x->n[x->tab[t]].st == XLIR;
        if (lir != x->nlir)
            FAIL("policy: bank member %u (LIRS): %zu LIR blocks, counted %zu", x->idx, lir, x->nlir);
    }
    return MEMOS_OK;
}

/* ---- a member over the live cache's entries ("synced") ----
 *
 * The same policy, but the live cache decides the evictions: an access
 * never evicts (a miss inserts), x_victims gives the keys this member would
 * evict next, in its order, without removing them (it may move keys on the
 * way, as the policy does when it looks for a victim: a CLOCK pass, S3-FIFO
 * moving a frequent key from S to M, LIRS demoting its oldest LIR block), and
 * x_evicted removes a key the live cache evicted, as if the member had
 * evicted it (into its ghosts where the policy keeps them). */


static size_t x_victims(expert *x, uint64_t *out, size_t n)
{
    size_t got = 0;
    if (x->dead)
        return 0;
    switch (x->kind) {
    case X_LRU:
        for (uint32_t i = x->l[LRU_Q].tail; i && got < n; i = x->n[i].prev)
            out[got++] = xkey(x, i);
        break;
    case X_LFU:
        for (uint32_t b = x->bkfirst; b && got < n; b = x->bk[b].next)
            for (uint32_t i = x->bk[b].l.tail; i && got < n; i = x->n[i].prev)
                out[got++] = xkey(x, i);
        break;
    case X_SIEVE: {
        uint32_t o = x->hand ? x->hand : x->l[SV_Q].tail, first = XNIL;
        for (size_t steps = 2 * x->resident + 2; o && got < n && steps; steps--) {
            if (o == first)
                break;
            if (x->n[o].cnt) {
                x->n[o].cnt = 0;
            } else {
                if (!first)
                    first = x->hand = o;
                out[got++] = xkey(x, o);
            }
            o = x->n[o].prev ? x->n[o].prev : x->l[SV_Q].tail;
        }
        break;
    }
    case X_ARC: {
        uint32_t a = x->l[ARC_T1].tail, b = x->l[ARC_T2].tail;
        size_t t1 = x->l[ARC_T1].len;
        while (got < n && (a || b)) {
            if (a && ((double)t1 > x->p || !b)) {
                out[got++] = xkey(x, a);
                a = x->n[a].prev;
                t1--;
            } else {
                out[got++] = xkey(x, b);
                b = x->n[b].prev;
            }
        }
        break;
    }
    case X_2Q: {
        uint32_t a = x->l[Q2_IN].tail, m = x->l[Q2_AM].tail;
        size_t in = x->l[Q2_IN].len;
        while (got < n && (a || m)) {
            if (a && (in > x->c1 || !m)) {
                out[got++] = xkey(x, a);
                a = x->n[a].prev;
                in--;
            } else {
                out[got++] = xkey(x, m);
                m = x->n[m].prev;
            }
        }
        break;
    }
    case X_S3FIFO: {
        /* from S while it holds its share (a frequent key moves to M on the
         * way), then one pass over M (a key with frequency goes round again) */
        uint32_t t = x->l[S3_S].tail;
        size_t s_left = x->l[S3_S].len;
        while (t && got < n && (s_left >= x->c1 || !x->l[S3_M].len)) {
            uint32_t prev = x->n[t].prev;
            if (x->n[t].cnt > 1) {
                xunlink(x, t);
                x->n[t].cnt = 0;
                xpush(x, S3_M, t);
            } else {
                out[got++] = xkey(x, t);
            }
            s_left--;
            t = prev;
        }
        uint32_t m = x->l[S3_M].tail, stop = x->l[S3_M].head;
        for (size_t k = x->l[S3_M].len; m && got < n && k; k--) {
            uint32_t prev = x->n[m].prev;
            if (x->n[m].cnt > 0) {
                x->n[m].cnt--;
                xfront(x, m);
            } else {
                out[got++] = xkey(x, m);
            }
            if (m == stop)
                break;
            m = prev;
        }
        for (; t && got < n; t = x->n[t].prev)      /* the rest of S, below its share */
            if (x->n[t].cnt <= 1)
                out[got++] = xkey(x, t);
        break;
    }
    case X_LIRS:
        while (x->nlir > x->c2 && x->l[LI_S].len)
            li_demote(x);
        for (uint32_t i = x->l[LI_Q].tail; i && got < n; i = x->n[i].prev2)
            out[got++] = xkey(x, i);
        for (uint32_t i = x->l[LI_S].tail; i && got < n; i = x->n[i].prev)
            if (x->n[i].st == XLIR)
                out[got++] = xkey(x, i);
        break;
    case X_WTLFU: {
        for (uint32_t d = x->l[WT_D].tail; d && got < n; d = x->n[d].prev)
            out[got++] = xkey(x, d);            /* contests lost first */
        while (x->l[WT_W].len > x->c1 && x->l[WT_P].len + x->l[WT_R].len < x->c2) {
            uint32_t c = x->l[WT_W].tail;     /* room in the main cache: no contest */
            xunlink(x, c);
            xpush(x, WT_P, c);
        }
        uint32_t w = x->l[WT_W].tail, m = x->l[WT_P].tail ? x->l[WT_P].tail : x->l[WT_R].tail;
        uint8_t ml = x->l[WT_P].tail ? WT_P : WT_R;
        size_t wl = x->l[WT_W].len;
        while (got < n && (w || m)) {
            /* (>=: a key is about to arrive in the window, pushing its oldest out) */
            if (w && (wl >= x->c1 || !m)) {
                uint32_t cand = w;
                w = x->n[w].prev;
                wl--;
                if (m && wt_est(x, xkey(x, cand)) > wt_est(x, xkey(x, m))) {
                    out[got++] = xkey(x, m);          /* the window's one wins a place */
                    xunlink(x, cand);
                    xpush(x, WT_P, cand);
                } else {
                    out[got++] = xkey(x, cand);
                    continue;
                }
            } else {
                out[got++] = xkey(x, m);
                x->hand++;                    /* a main slot freed without a contest */
            }
            m = x->n[m].prev;
            if (!m && ml == WT_P) {
                ml = WT_R;
                m = x->l[WT_R].tail;
            }
        }
        break;
    }
    default: {
        policy_node *v[64];
        size_t want = n < 64 ? n : 64;
        size_t k = policy_victims(x->pol, v, want);
        for (size_t j = 0; j < k; j++)
            out[got++] = xkey(x, ((hyb_node *)v[j])->idx);
        break;
    }
    }
    return got;
}

/* The live cache evicted key: out of this member's cache, into its ghosts. */
static void x_evicted(expert *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (!i || x->dead || !x_resident(x, key))
        return;
    xnode *n = &x->n[i];
    x->resident--;
    switch (x->kind) {
    case X_LFU:
        bk_take(x, i);
        xfree_node(x, i);
        return;
    case X_SIEVE:
        if (x->hand == i)
            x->hand = n->prev;
        xunlink(x, i);
        xfree_node(x, i);
        return;
    case X_ARC: {
        uint8_t ghost = n->la == ARC_T1 ? ARC_B1 : ARC_B2;
        xunlink(x, i);
        xpush(x, ghost, i);
        arc_trim(x);
        return;
    }
    case X_2Q:
        if (n->la == Q2_IN) {
            xunlink(x, i);
            xpush(x, Q2_OUT, i);
            while (x->l[Q2_OUT].len > x->c2) {
                uint32_t g = x->l[Q2_OUT].tail;
                xunlink(x, g);
                xfree_node(x, g);
            }
        } else {
            xunlink(x, i);
            xfree_node(x, i);
        }
        return;
    case X_S3FIFO:
        x->evicted = 1;
        if (n->la == S3_S) {
            xunlink(x, i);
            n->cnt = 0;
            xpush(x, S3_G, i);
            while (x->l[S3_G].len > x->c3) {
                uint32_t g = x->l[S3_G].tail;
                xunlink(x, g);
                xfree_node(x, g);
            }
        } else {
            xunlink(x, i);
            xfree_node(x, i);
        }
        return;
    case X_LIRS:
        if (n->st == XHIR) {
            xunlink2(x, i);
            if (n->la == LI_S) {
                n->st = XNONRES;
                xpush2(x, LI_NR, i);
            } else {
                xfree_node(x, i);
            }
        } else {                        /* a LIR block: non-resident, still in S */
            x->nlir--;
            n->st = XNONRES;
            xpush2(x, LI_NR, i);
            li_prune(x);
        }
        li_limit(x);
        return;
    case X_HYB:
        policy_note_evict(x->pol, &hyb_at(x, i)->pn);
        policy_remove(x->pol, &hyb_at(x, i)->pn);
        xfree_node(x, i);
        return;
    default:                            /* LRU, W-TinyLFU: no ghosts */
        xunlink(x, i);
        xfree_node(x, i);
        return;
    }
}

/* ---- the bank, and the live cache that follows one of its members ----
 *
 * Every member runs twice.  Alone (x[e]: its own cache of the live cache's
 * size, over every access of the live cache) it scores: its hits are what
 * the published policy would have hit on this stream.  Synced (y[e]: over
 * the live cache's own entries, told of every access, eviction and
 * deletion) it is ready to choose: the live cache's victims are the synced
 * leader's (x_victims), so following another member changes who chooses,
 * not what the cache holds, and the new leader's bookkeeping (frequencies,
 * ghosts, segments) has followed the live entries all along.  Victims the
 * leader names that cannot go (pinned) are skipped; if it names too few,
 * the least recently used follow.  A map (key hash -> live node) turns the
 * leader's keys into entries.
 *
 * The switching rule (bank_choose) is rent or buy: a switch costs hits
 * (the live entries were chosen by the old leader: until they turn over,
 * the new one does not hit as it does alone), so the leader is kept until
 * another member's lead, counted since the last switch, passes both what a
 * switch costs and chance (policy.c's header gives the numbers). */

#define BANK_EVERY      32u     /* accesses between two looks at the scores */
#define BANK_SLACK      8u      /* victims asked for beyond those needed, when some cannot go */
#define BANK_Z          2.0     /* a lead must pass this many standard errors (sign test) */
#define BANK_COST0      0.01    /* what a switch costs before one was measured, x the cache size */
#define BANK_MEASURE    2.0     /* a switch's cost is measured over this many x the cache size accesses */
#define BANK_FIRST      2.0     /* the first choice, after this many x the cache size accesses */
#define BANK_DIVERGED   0.5     /* ... and this many x the size since two members first hit differently */
#define BANK_WARM_USES  3u      /* a warm start replays an entry at most 1 + this many times */

struct policy_bank {
    expert   x[BANK_N];                     /* each member alone: the scores */
    expert   y[BANK_N];                     /* each member over the live entries: the choices */
    size_t   cap;                           /* the live cache's size when full (XUNLIMITED: not yet) */
    uint64_t hits[BANK_N];                  /* each alone, since the bank started */
    uint64_t accesses, live_hits;
    /* since the last switch */
    uint64_t sw_at, sw_live, sw_hits[BANK_N];  /* accesses, live hits, each member's hits then */
    int64_t  blk[BANK_N];                   /* each member's gain over the leader in this period */
    double   sq[BANK_N];                    /* sum of the squared gains of the periods since the switch */
    double   cost;                          /* what a switch costs (hits), learnt from the last ones */
    int      measuring, measured;           /* the last switch's cost is being / was ever measured */
    policy  *p;                             /* the live policy */
    policy_node **map;                      /* key hash -> live node, linear probing (NULL: empty) */
    size_t   mmask, mused;
    uint64_t diverged_at;                   /* the access when two members first hit differently (0: not yet) */
    uint64_t *vk;                           /* victims' keys, scratch */
    size_t   vkn;
    policy_node **rj;                       /* nodes the cache refused in this call, scratch */
    size_t   rjn;
};

static int map_grow(struct policy_bank *b)
{
    size_t n = b->map ? (b->mmask + 1) * 2 : 64;
    policy_node **m = calloc(n, sizeof *m);
    if (!m)
        return MEMOS_ENOMEM;
    policy_node **old = b->map;
    size_t oldn = old ? b->mmask + 1 : 0;
    b->map = m;
    b->mmask = n - 1;
    for (size_t i = 0; i < oldn; i++)
        if (old[i]) {
            size_t j = mix64(old[i]->hash) & b->mmask;
            while (b->map[j])
                j = (j + 1) & b->mmask;
            b->map[j] = old[i];
        }
    free(old);
    return MEMOS_OK;
}

static int map_put(struct policy_bank *b, policy_node *n)
{
    if ((b->mused + 1) * 2 > (b->map ? b->mmask + 1 : 0) && map_grow(b) != MEMOS_OK)
        return MEMOS_ENOMEM;
    size_t j = mix64(n->hash) & b->mmask;
    while (b->map[j])
        j = (j + 1) & b->mmask;
    b->map[j] = n;
    b->mused++;
    return MEMOS_OK;
}

static policy_node *map_get(const struct policy_bank *b, uint64_t h)
{
    for (size_t j = mix64(h) & b->mmask; b->map[j]; j = (j + 1) & b->mmask)
        if (b->map[j]->hash == h)
            return b->map[j];
    return NULL;
}

static void map_del(struct policy_bank *b, policy_node *n)
{
    size_t i = mix64(n->hash) & b->mmask;
    while (b->map[i] && b->map[i] != n)
        i = (i + 1) & b->mmask;
    if (!b->map[i])
        return;
    b->map[i] = NULL;
    b->mused--;
    for (size_t j = (i + 1) & b->mmask; b->map[j]; j = (j + 1) & b->mmask) {
        size_t home = mix64(b->map[j]->hash) & b->mmask;
        if (((j - home) & b->mmask) >= ((j - i) & b->mmask)) {
            b->map[i] = b->map[j];
            b->map[j] = NULL;
            i = j;
        }
    }
}

static size_t bank_cap(const policy *p)
{
    return p->full ? (size_t)p->full : XUNLIMITED;
}

static void bank_free(policy *p)
{
    struct policy_bank *b = p->bank;
    if (!b)
        return;
    for (unsigned e = 0; e < BANK_N; e++) {
        x_free(&b->x[e]);
        x_free(&b->y[e]);
    }
    free(b->map);
    free(b->vk);
    free(b->rj);
    free(b);
    p->bank = NULL;
}

static void bank_switch(policy *p, unsigned e)
{
    struct policy_bank *b = p->bank;
    p->expert = e;
    p->switches++;
    b->sw_at = b->accesses;
    b->sw_live = b->live_hits;
    for (unsigned k = 0; k < BANK_N; k++) {
        b->sw_hits[k] = b->hits[k];
        b->blk[k] = 0;
        b->sq[k] = 0;
    }
    b->measuring = 1;
}

/* Ties go to the first of this order. */
static const unsigned BANK_TIE[BANK_N] = { 10, 6, 2, 8, 4, 7, 3, 9, 5, 1, 0 };

/* The choice.  Until the cache has seen BANK_FIRST x its size accesses, and
 * BANK_DIVERGED x its size since two members first hit differently, the
 * start member leads (until then the members are one policy: before the
 * first eviction every member holds the same, and a scan without returns
 * hits in none); then, once, the member with the most hits so far, LRU on a
 * tie with the start member or any other — another member only if its lead
 * over the start member passes what a switch is first taken to cost
 * (BANK_COST0 x the size).  From there on,
 * rent or buy: since the last switch, each member has gained some hits over
 * the leader (possibly fewer than none); the live cache switches to the
 * one whose gain most exceeds what a switch costs, if that gain also passes
 * BANK_Z standard errors.  The error is that of a sum of correlated steps:
 * the gains of the BANK_EVERY-access periods since the switch, squared and
 * summed (a request's blocks hit or miss together, so single accesses are
 * not independent; for independent ones this is the sign test over the
 * accesses where the two disagree).  What a switch costs is measured: over
 * BANK_MEASURE x the cache size accesses after a switch, the hits the new
 * leader made alone less those the live cache made (not below 0); the
 * estimate starts at BANK_COST0 x the cache size and is then the mean of
 * itself and each new measure (a switch made before the last one's measure
 * is complete folds in what that one cost so far, scaled to the whole
 * measure, at most the size). */
static void bank_choose(policy *p)
{
    struct policy_bank *b = p->bank;
    unsigned cur = p->expert;
    double size = (double)(b->cap == XUNLIMITED ? p->count : b->cap);
    for (unsigned e = 0; e < BANK_N; e++) {
        b->sq[e] += (double)b->blk[e] * (double)b->blk[e];
        b->blk[e] = 0;
    }
    if (!b->measured) {
        if (b->cap == XUNLIMITED || (double)b->accesses < BANK_FIRST * size || !b->diverged_at ||
            (double)(b->accesses - b->diverged_at) < BANK_DIVERGED * size)
            return;
        unsigned top = cur;
        if (b->hits[BANK_LRU] >= b->hits[cur] && !b->x[BANK_LRU].dead && !b->y[BANK_LRU].dead)
            top = BANK_LRU;
        for (unsigned o = 0; o < BANK_N; o++)
            if (b->hits[BANK_TIE[o]] > b->hits[top] && !b->x[BANK_TIE[o]].dead && !b->y[BANK_TIE[o]].dead)
                top = BANK_TIE[o];
        b->cost = BANK_COST0 * size;
        b->measured = 1;
        if (top != BANK_LRU && (double)(b->hits[top] - b->hits[cur]) <= b->cost)
            top = cur;                  /* a lead that does not pay for the switch */
        bank_switch(p, top);            /* (the baselines of the gains start here) */
        if (top == cur)
            p->switches--;
        b->measuring = 0;
        return;
    }
    uint64_t lead_gain = b->hits[cur] - b->sw_hits[cur];
    if (b->measuring && (double)(b->accesses - b->sw_at) >= BANK_MEASURE * size) {
        double c = (double)lead_gain - (double)(b->live_hits - b->sw_live);
        b->cost = 0.5 * (b->cost + (c > 0 ? c : 0));
        b->measuring = 0;
    }
    unsigned pick = BANK_N;
    double margin = 0;
    for (unsigned o = 0; o < BANK_N; o++) {
        unsigned e = BANK_TIE[o];
        if (e == cur || b->x[e].dead || b->y[e].dead)
            continue;
        double gain = (double)(b->hits[e] - b->sw_hits[e]) - (double)lead_gain;
        if (gain > 0 && gain * gain > BANK_Z * BANK_Z * b->sq[e] && gain > b->cost + 1.0 &&
            gain - b->cost > margin) {
            margin = gain - b->cost;
            pick = e;
        }
    }
    if (pick == BANK_N && (b->x[cur].dead || b->y[cur].dead))
        for (unsigned o = 0; o < BANK_N && pick == BANK_N; o++)
            if (!b->x[BANK_TIE[o]].dead && !b->y[BANK_TIE[o]].dead)
                pick = BANK_TIE[o];
    if (pick != BANK_N && b->measuring) {
        /* switching again before the last switch's cost was measured: what
         * it cost so far, scaled to the whole measure (the turnover is not
         * over: as it stands it is an underestimate, and switches that come
         * fast one after another would keep the estimate low), at most the
         * size */
        double c = (double)lead_gain - (double)(b->live_hits - b->sw_live);
        double f = (double)(b->accesses - b->sw_at) / (BANK_MEASURE * size);
        if (c > 0 && f > 0)
            b->cost = 0.5 * (b->cost + (c / f < size ? c / f : size));
    }
    if (pick != BANK_N)
        bank_switch(p, pick);
}

/* One access of the stream: every member sees it, alone and synced. */
static void bank_access(policy *p, uint64_t h, int live_hit)
{
    struct policy_bank *b = p->bank;
    int lead_hit = 0, hit[BANK_N];
    for (unsigned e = 0; e < BANK_N; e++) {
        hit[e] = x_access(&b->x[e], h);
        x_access(&b->y[e], h);
        b->hits[e] += (uint64_t)hit[e];
    }
    lead_hit = hit[p->expert];
    for (unsigned e = 0; e < BANK_N; e++) {
        b->blk[e] += hit[e] - lead_hit;
        if (hit[e] != lead_hit && !b->diverged_at)
            b->diverged_at = b->accesses + 1;
    }
    b->live_hits += (uint64_t)live_hit;
    if (++b->accesses % BANK_EVERY == 0)
        bank_choose(p);
}

/* The live cache's size when full changed: the members alone take it as
 * their capacity, the synced ones as the size their shares are of. */
static void bank_fit(policy *p)
{
    struct policy_bank *b = p->bank;
    size_t cap = bank_cap(p);
    if (cap == b->cap)
        return;
    b->cap = cap;
    for (unsigned e = 0; e < BANK_N; e++) {
        x_set_cap(&b->x[e], cap);
        x_set_cap(&b->y[e], cap);
    }
}

/* The bank, made when lru_lfu first needs it: the live entries go in the
 * map and, least recently used first, through every member (a warm start;
 * the scores start after it).  On no memory: MEMOS_ENOMEM. */
static int bank_start(policy *p)
{
    if (p->count > BANK_MAX_LIVE)
        return MEMOS_ENOMEM;
    struct policy_bank *b = calloc(1, sizeof *b);
    if (!b)
        return MEMOS_ENOMEM;
    b->p = p;
    b->cap = bank_cap(p);
    p->bank = b;
    int rc = MEMOS_OK;
    for (unsigned e = 0; e < BANK_N && rc == MEMOS_OK; e++) {
        rc = x_init(&b->x[e], e, b->cap, e);
        if (rc == MEMOS_OK)
            rc = x_init(&b->y[e], e, b->cap, e);
        b->y[e].synced = 1;
    }
    for (policy_node *n = p->head.prev; n != &p->head && rc == MEMOS_OK; n = n->prev)
        rc = map_put(b, n);
    if (rc != MEMOS_OK) {
        bank_free(p);
        return MEMOS_ENOMEM;
    }
    unsigned lead = p->restore_leader ? p->restore_leader - 1 : BANK_START;
    p->restore_leader = 0;
    p->expert = lead < BANK_N ? lead : BANK_START;
    /* once each, and again as often as it was used (up to BANK_WARM_USES):
     * what the members know of frequency comes back with a restored state */
    for (policy_node *n = p->head.prev; n != &p->head; n = n->prev) {
        n->seg = 0;
        unsigned uses = 1 + (n->freq < BANK_WARM_USES ? n->freq : BANK_WARM_USES);
        for (unsigned e = 0; e < BANK_N; e++)
            for (unsigned k = 0; k < uses; k++) {
                x_access(&b->x[e], n->hash);
                x_access(&b->y[e], n->hash);
            }
    }
    return MEMOS_OK;
}

static uint64_t bank_bytes(const policy *p)
{
    const struct policy_bank *b = p->bank;
    if (!b)
        return 0;
    uint64_t s = sizeof *b + (b->map ? (b->mmask + 1) * sizeof *b->map : 0) + b->vkn * sizeof *b->vk;
    for (unsigned e = 0; e < BANK_N; e++)
        s += x_bytes(&b->x[e]) + x_bytes(&b->y[e]);
    return s;
}

static int bank_check(const policy *p, char *why, size_t whylen)
{
    const struct policy_bank *b = p->bank;
    if (p->nseg[0] || p->nseg[1] || p->seg[0].fnext != &p->seg[0] || p->seg[1].fnext != &p->seg[1])
        FAIL("policy: lru_lfu keeps no segments");
    for (const policy_node *x = p->head.next; x != &p->head; x = x->next)
        if (x->seg || x->level)
            FAIL("policy: an lru_lfu node is marked");
    if (!b)
        return MEMOS_OK;
    if (b->mused != p->count)
        FAIL("policy: the map holds %zu, count says %llu", b->mused, (unsigned long long)p->count);
    for (const policy_node *x = p->head.next; x != &p->head; x = x->next) {
        size_t j = mix64(x->hash) & b->mmask;
        while (b->map[j] && b->map[j] != x)
            j = (j + 1) & b->mmask;
        if (!b->map[j])
            FAIL("policy: a live node is not in the map");
    }
    if (p->expert >= BANK_N)
        FAIL("policy: following member %u of %u", p->expert, (unsigned)BANK_N);
    for (unsigned e = 0; e < BANK_N; e++) {
        int rc = x_check(&b->x[e], why, whylen);
        if (rc == MEMOS_OK)
            rc = x_check(&b->y[e], why, whylen);
        if (rc != MEMOS_OK)
            return rc;
        if (!b->y[e].dead && b->y[e].resident != p->count)
            FAIL("policy: synced member %s holds %zu, the cache %llu", BANK[e].name,
                 b->y[e].resident, (unsigned long long)p->count);
    }
    return MEMOS_OK;
}

const char *policy_bank_name(unsigned i)
{
    return i < BANK_N ? BANK[i].name : NULL;
}

/* Member `name` alone over the keys, `capacity` blocks: its hits (-1: no
 * such member, no memory). */
static long long bank_member_simulate(const char *name, const uint64_t *keys, size_t n,
                                      size_t capacity)
{
    unsigned m = 0;
    while (m < BANK_N && strcmp(BANK[m].name, name) != 0)
        m++;
    expert x;
    if (m == BANK_N || capacity == 0)
        return -1;
    if (x_init(&x, m, capacity, 0) != MEMOS_OK) {
        x_free(&x);
        return -1;
    }
    long long hits = 0;
    for (size_t r = 0; r < n && !x.dead; r++)
        hits += x_access(&x, norm_hash(mix64(keys[r])));
    int dead = x.dead;
    x_free(&x);
    return dead ? -1 : hits;
}

/* A live entry was deleted (not evicted): every member forgets it. */
static void bank_member_remove(policy *p, uint64_t h)
{
    for (unsigned e = 0; e < BANK_N; e++) {
        x_remove(&p->bank->x[e], h);
        x_remove(&p->bank->y[e], h);
    }
}

static void bank_member_rename(policy *p, uint64_t h, uint64_t to)
{
    for (unsigned e = 0; e < BANK_N; e++) {
        x_rename(&p->bank->x[e], h, to);
        x_rename(&p->bank->y[e], h, to);
    }
}

/* The live cache evicted the entry of hash h: the synced members see it go. */
static void bank_live_gone(struct policy_bank *b, uint64_t h)
{
    for (unsigned e = 0; e < BANK_N; e++)
        x_evicted(&b->y[e], h);
}

static void bank_stats(const policy *p, policy_stats *out)
{
    const struct policy_bank *b = p->bank;
    out->probation = 0;
    out->protected_ = 0;
    out->recency = 0.5;
    out->bank_n = BANK_N;
    out->shadow_bytes = bank_bytes(p);
    if (!b)
        return;
    for (unsigned e = 0; e < BANK_N; e++)
        out->bank_hits[e] = b->hits[e];
    out->bank_accesses = b->accesses;
}

/* lru_lfu's victims: the synced leader's, those that may go; then the
 * least recently used.  Chosen nodes are marked (seg 1) while the walk runs. */
/* A node the cache refused in this call (seg 2): asked once per call, as
 * the other policies do (the cache's guards count the times they are passed
 * over).  Without room to note it, it stays askable. */
static void bank_refused(struct policy_bank *b, policy_node *x, size_t *nrj)
{
    if (*nrj == b->rjn) {
        size_t m = b->rjn ? 2 * b->rjn : 16;
        policy_node **r = realloc(b->rj, m * sizeof *r);
        if (!r)
            return;
        b->rj = r;
        b->rjn = m;
    }
    x->seg = 2;
    b->rj[(*nrj)++] = x;
}

static size_t bank_victims(policy *p, policy_node **out, size_t n)
{
    struct policy_bank *b = p->bank;
    size_t got = 0, nrj = 0;
    bank_fit(p);
    expert *lead = &b->y[p->expert];
    /* exactly as many as needed (asking a member for more than it evicts
     * would move its keys further than the policy does); more only when
     * some of those named cannot go */
    for (size_t want = n, tries = 0; got < n && tries < 4; tries++) {
        if (b->vkn < want) {
            uint64_t *v = realloc(b->vk, want * sizeof *v);
            if (!v)
                break;
            b->vk = v;
            b->vkn = want;
        }
        size_t k = x_victims(lead, b->vk, want);
        for (size_t j = 0; j < k && got < n; j++) {
            policy_node *x = map_get(b, b->vk[j]);
            if (!x || x->seg)
                continue;
            if (ok(p, x)) {
                x->seg = 1;
                out[got++] = x;
            } else {
                bank_refused(b, x, &nrj);
            }
        }
        if (k < want)
            break;
        want += (n - got) + BANK_SLACK;
    }
    for (policy_node *x = p->head.prev; x != &p->head && got < n; x = x->prev)
        if (!x->seg && ok(p, x)) {
            x->seg = 1;
            out[got++] = x;
        }
    for (size_t j = 0; j < got; j++)
        out[j]->seg = 0;
    for (size_t j = 0; j < nrj; j++)
        b->rj[j]->seg = 0;
    return got;
}
