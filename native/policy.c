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
 * A second list, through fprev/fnext, depends on the policy:
 *
 *   lfu        POLICY_LEVELS lists; a node sits in level = bit length of its
 *              touch count (capped): level 0 never touched, 1 once, 2 two or
 *              three times...  Victims: rarest level first, oldest first.
 *
 *   lru_lfu    two segments, after ARC, 2Q and S3-FIFO:
 *
 *        admit ──► probation (FIFO) ──hit──► protected (LRU + aging clock)
 *                     │ evict                     │ evict (ref == 0)
 *                     ▼                           ▼
 *              ghost 0 (2 × count hashes)   ghost 1 (1 × count hashes)
 *                     │                           │
 *                     └──── an admit whose key hash is in a ghost goes
 *                           straight to protected ◄┘
 *
 *     A hit in probation promotes to protected (ref = 0); a hit in protected
 *     moves the node to the front and adds 1 to its 2-bit `ref` (max 3).
 *     Victims come from probation while it holds more than its target
 *     (pfrac × count), else from protected: its oldest node with ref == 0;
 *     a node with ref > 0 passed on the way loses 1 and goes back to the
 *     front (a clock: frequency that ages, so old popularity fades).
 *
 *     Settings ("experts").  What the hybrid does is set by a
 *     policy_expert: pfrac, the probation target as a share of count (fixed,
 *     or moved by the ghost rule below); lru, victims in plain recency
 *     order; gadmit, where a ghost hit is admitted:
 *       1  protected;
 *       2  protected while it has room (count - target, less one batch of
 *          victims, the most last asked for, so a batch eviction still
 *          finds them in probation), else probation;
 *       3  as 2, or, for a ghost evicted within the last `count` evictions of
 *          its ring, in place of the first ref-0 node met in up to 2 clock
 *          steps over protected's oldest (it goes back to probation; a node
 *          with ref > 0 loses one and goes to the front); it enters with
 *          ref 1, and victims come from probation first whatever its size.
 *          LIRS-like: a loop larger than the cache keeps its protected part,
 *          and a new working set still displaces a stale one.
 *     EXPERTS lists six: 0 LRU, 1 the ghost rule (ARC-like), 2 pfrac 0.1
 *     (S3-FIFO-like), 3 pfrac 0.01 gadmit 2, 4 pfrac 0.3, 5 pfrac 0.01
 *     gadmit 3.
 *
 *     Ghost rule (expert 1).  pfrac starts at 0.5 and moves by 1/count on
 *     each ghost hit that a slightly larger segment would have turned into a
 *     hit: a key found in ghost g among its W = count/4 most recent
 *     insertions.  Ghost 0 → probation too small → pfrac up; ghost 1 →
 *     protected too small → pfrac down; clamped to [0.01, 0.9].
 *
 *     Adaptation: shadow simulation (issue 18).  No setting wins everywhere
 *     (LRU on recency-bound streams, small probation on Zipf, LIRS-like on
 *     loops, the ghost rule on the Mooncake trace), so the policy runs every
 *     candidate on a sample of the keys and uses the one that hits most.
 *     The shadow holds one copy of the cache per expert, each a fixed policy
 *     of its own over unit-size nodes.  Keys are sampled spatially (SHARDS):
 *     a key hash is in when its remix is divisible by 2^shift, and every
 *     copy holds size / 2^shift nodes, where size is the cache's count when
 *     full (the count when victims were last asked for, or the count if
 *     larger, so a batch of evictions does not shrink the copies).  shift
 *     starts at 0 (small caches: full copies, exact) and goes up by one
 *     whenever size / 2^shift would pass SHADOW_CAP (4096) nodes; the sample
 *     then halves (a subset: the copies drop the keys no longer sampled).
 *     Every admit and touch of the live policy is one access of the stream:
 *     if sampled, each copy looks the key up (a hit: touch; a miss: evict to
 *     its capacity, admit), and its score decays by 1 - 1/max(1024, 2 ×
 *     copy capacity) and adds the hit.  Every 32 sampled accesses the live
 *     policy takes the best-scoring expert (exact ties: the LIRS-like 3 and 5
 *     first, LRU last) if its lead over the one in force passes three tests:
 *       - more than 1% + 1 (near-ties stay);
 *       - more than 3 standard errors (SWITCH_SIGMA): two copies' scores
 *         differ only on the accesses where one hit and the other missed
 *         (a decayed count kept per pair); were neither better, each would
 *         go either way, so a fluctuation leads by about the square root of
 *         that count (a sign test).  Within a lap of a loop, or between
 *         settings that hit different keys about as often, the scores swing
 *         by more than 1% without either being better;
 *       - more than 1.25 times (SWITCH_SETTLE) what the live cache still
 *         trails the copy of the setting in force (the live policy's own
 *         hits on the sampled accesses, decayed alike): that lag is the
 *         measured cost of the switches so far, paid while the live state
 *         built under the old setting settles; a new switch must win more.
 *     A switch changes `mode` (and pfrac: the expert's fixed one, or its
 *     copy's adapted one) and nothing else — segments, refs and ghosts stay,
 *     so it is O(1) and the next victims follow the new setting.  It starts
 *     with expert 1.  On the suite (bench policy --suite) this rule took the
 *     loops at 2.7% of the keys from 13 switches to 1 (gap to LIRS -3.8 →
 *     -0.1 points), and the shifting popularity at 5.5%, where the settings
 *     alone are within 1% of each other, from 36 to 4 (gap to LRU -0.57 →
 *     -0.09).  Everything is a function of the
 *     access sequence: the replay is deterministic.  policy_fix_expert (and
 *     the simulation name "lru_lfu@i") runs one expert alone, no shadow.
 *
 *     Ghosts remember key hashes only, independent of the freed entries: two
 *     FIFO rings of (hash, seq) and one open-addressing table hash → (seq,
 *     ring).  A ghost hit deletes the table slot and leaves its ring slot
 *     stale (recognised by its seq when it reaches the tail).  About 48
 *     bytes per ghost, at most 3 × count live ghosts (6 × count ring slots).
 *
 * Memory.  48 bytes per entry (policy_node, unchanged) plus the ghosts
 * (at most 3 × count live, about 48 bytes each) plus the shadow, a fixed
 * cost whatever the cache's size: six copies of at most 4,096 nodes, each
 * at most about 1.2 MB with its table and ghosts (7.3 MB in all; 4.3 MB
 * measured on the Mooncake trace at 49k blocks: policy_stats shadow_bytes),
 * allocated on the first access; if that fails, the setting in force stays
 * for good.
 *
 * Cost: admit, touch and remove are O(1); a victim is O(skipped) (pinned
 * nodes, and at most 3 clock passes per protected node); ghost upkeep is
 * amortized O(1).  Segments count entries, not bytes.  Under lru_lfu an
 * admit or touch also feeds the shadow: for a sampled key, one lookup and
 * O(1) policy work in each of the six copies, and 15 pair counts (about
 * 1.2 us an access measured for a cache under 4,096 entries, where every
 * key is sampled; 0.2 us at 20k entries).
 *
 * Victims are filtered by the owner's evictable() predicate (the cache skips
 * pinned, sticky, evicting and just-refused entries) and are not removed
 * here: the cache calls policy_note_evict then policy_remove for each one
 * that it really evicts.
 *
 * Invariants (policy_check): the recency list is well linked and holds
 * `count` nodes, each marked linked; under lfu each node is on the level list
 * its freq says; under lru_lfu each node is on the segment its seg says and
 * the segment counts add up to count; every ghost in the table is live in
 * its ring.
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
#define EXPERT_START    1u      /* the adaptive ghost rule, the policy before any evidence */
#define SHADOW_CAP      4096u   /* most nodes in one shadow copy */
#define SHADOW_WINDOW   1024u   /* score memory floor, sampled accesses */
#define SHADOW_EVERY    32u     /* sampled accesses between two choices */
#define DEMOTE_STEPS    2u      /* gadmit 3: clock steps one ghost hit may take */
#define SHADOW_SALT     0x9e3779b97f4a7c15ull
#define SWITCH_SIGMA    3.0     /* a switch needs a lead of this many standard errors */
#define SWITCH_SETTLE   1.25    /* ... and of this many times the live cache's lag behind its setting */

/* The candidate settings (policy.h: policy_expert).  Index 0 is plain LRU,
 * so the shadow always knows what LRU would have hit. */
static const policy_expert EXPERTS[POLICY_EXPERTS] = {
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
static void     shadow_access(policy *p, uint64_t h, int hit);
static int      demote_one(policy *p, unsigned steps);
static void     shadow_free(policy *p);
static uint64_t shadow_bytes(const policy *p);
static unsigned shadow_shift(const policy *p);

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
    p->expert = EXPERT_START;
    p->mode = EXPERTS[EXPERT_START];
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
    shadow_free(p);
}

/* Switch the victim order.  The second lists are rebuilt from the recency
 * list, LRU first so each stays MRU-first; switching to lru_lfu puts every
 * node in protected (they have earned their place), ref 0.  Ghosts and the
 * balance survive a switch. */
int policy_select(policy *p, const char *name)
{
    enum policy_kind k;
    if (kind_of(name, &k) != MEMOS_OK)
        return MEMOS_EINVAL;
    if (k == p->kind)
        return MEMOS_OK;
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
            n->seg = POLICY_PROTECTED;
            n->ref = 0;
            flink_after(&p->seg[POLICY_PROTECTED], n);
            p->nseg[POLICY_PROTECTED]++;
        }
    }
    return MEMOS_OK;
}

void policy_admit(policy *p, policy_node *n, uint64_t hash)
{
    assert(!n->linked);
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
    shadow_access(p, n->hash, 0);
}

void policy_touch(policy *p, policy_node *n)
{
    assert(n->linked);
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
        shadow_access(p, n->hash, 1);
    }
}

void policy_remove(policy *p, policy_node *n)
{
    assert(n->linked && p->count > 0);
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

/* A victim is going: remember its key hash in the ghost of its segment. */
void policy_note_evict(policy *p, policy_node *n)
{
    assert(n->linked);
    if (p->kind == POLICY_LRU_LFU)
        ghost_add(p, n->seg, n->hash);
}

void policy_rekey(policy_node *n, uint64_t hash) { n->hash = norm_hash(hash); }

/* Up to n evictable nodes, best victim first. */
size_t policy_victims(policy *p, policy_node **out, size_t n)
{
    size_t got = 0;
    p->full = p->count;
    p->batch = n;
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
    out->shadow_shift = shadow_shift(p);
    out->expert_switches = p->switches;
    out->shadow_bytes = shadow_bytes(p);
}

const policy_expert *policy_expert_at(unsigned i)
{
    return i < POLICY_EXPERTS ? &EXPERTS[i] : NULL;
}

int policy_fix_expert(policy *p, unsigned i)
{
    if (i >= POLICY_EXPERTS || p->kind != POLICY_LRU_LFU)
        return MEMOS_EINVAL;
    shadow_free(p);
    p->fixed = 1;
    p->expert = i;
    p->mode = EXPERTS[i];
    if (p->mode.pfrac >= 0)
        p->pfrac = p->mode.pfrac;
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

/* ---- the shadow: sampled copies of the cache, one per expert ---- */

typedef struct shadow_copy {
    policy     pol;       /* the expert, fixed */
    sim_node  *nodes;     /* SHADOW_CAP + 1 */
    sim_table  t;         /* key hash -> node */
    uint32_t  *freelist;  /* free node indexes */
    size_t     nfree;
    double     score;     /* hits, decayed by 1 - 1/window per sampled access */
} shadow_copy;

struct policy_shadow {
    unsigned    shift;    /* a key is sampled when 2^shift divides its remixed hash */
    uint64_t    samples;  /* sampled accesses */
    shadow_copy c[POLICY_EXPERTS];
    double      dis[POLICY_EXPERTS][POLICY_EXPERTS];
    double      m1[POLICY_EXPERTS][POLICY_EXPERTS], m2[POLICY_EXPERTS][POLICY_EXPERTS];
    double      window;
    double      live;     /* the live policy's hits on sampled accesses, decayed as score */  /* i < j: decayed count of accesses one hit, the other not */
};

static int sampled(uint64_t h, unsigned shift)
{
    return ((mix64(h ^ SHADOW_SALT) >> 20) & ((1ull << shift) - 1)) == 0;
}

static void shadow_free(policy *p)
{
    struct policy_shadow *s = p->shadow;
    if (!s)
        return;
    for (unsigned e = 0; e < POLICY_EXPERTS; e++) {
        policy_destroy(&s->c[e].pol);
        free(s->c[e].nodes);
        free(s->c[e].t.slot);
        free(s->c[e].freelist);
    }
    free(s);
    p->shadow = NULL;
}

static struct policy_shadow *shadow_new(void)
{
    struct policy_shadow *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    size_t slots = 16;
    while (slots < 2 * (SHADOW_CAP + 1))
        slots *= 2;
    int bad = 0;
    for (unsigned e = 0; e < POLICY_EXPERTS; e++) {
        shadow_copy *c = &s->c[e];
        policy_init(&c->pol, "lru_lfu", NULL, NULL);
        policy_fix_expert(&c->pol, e);
        c->nodes = calloc(SHADOW_CAP + 1, sizeof *c->nodes);
        c->t.slot = calloc(slots, sizeof *c->t.slot);
        c->t.mask = slots - 1;
        c->freelist = malloc((SHADOW_CAP + 1) * sizeof *c->freelist);
        if (!c->nodes || !c->t.slot || !c->freelist) {
            bad = 1;
            continue;
        }
        c->nfree = SHADOW_CAP + 1;
        for (size_t i = 0; i <= SHADOW_CAP; i++)
            c->freelist[i] = (uint32_t)(SHADOW_CAP - i);
    }
    if (bad) {
        policy tmp = { .shadow = s };
        shadow_free(&tmp);
        return NULL;
    }
    return s;
}

static void copy_drop(shadow_copy *c, sim_node *x)
{
    policy_remove(&c->pol, &x->pn);
    sim_delete(&c->t, c->nodes, sim_find(&c->t, c->nodes, x->key, mix64(x->key)));
    c->freelist[c->nfree++] = (uint32_t)(x - c->nodes);
}

/* One sampled access in one copy of `cap` nodes; 1 on a hit. */
static int copy_access(shadow_copy *c, uint64_t h, size_t cap)
{
    uint64_t mh = mix64(h);
    size_t i = sim_find(&c->t, c->nodes, h, mh);
    if (c->t.slot[i]) {
        policy_touch(&c->pol, &c->nodes[c->t.slot[i] - 1].pn);
        return 1;
    }
    int moved = 0;
    while (c->pol.count >= cap || c->nfree == 0) {
        policy_node *v;
        if (policy_victims(&c->pol, &v, 1) != 1)
            return 0;
        policy_note_evict(&c->pol, v);
        copy_drop(c, (sim_node *)v);
        moved = 1;
    }
    if (moved)
        i = sim_find(&c->t, c->nodes, h, mh);
    uint32_t idx = c->freelist[--c->nfree];
    c->nodes[idx].key = h;
    c->t.slot[i] = idx + 1;
    policy_admit(&c->pol, &c->nodes[idx].pn, h);
    return 0;
}

/* The cache grew past what the copies can hold at this rate: sample half as
 * many keys (a subset: the kept ones stay), dropping the others. */
static void shadow_halve(struct policy_shadow *s)
{
    s->shift++;
    for (unsigned e = 0; e < POLICY_EXPERTS; e++) {
        shadow_copy *c = &s->c[e];
        for (policy_node *x = c->pol.head.next; x != &c->pol.head;) {
            policy_node *next = x->next;
            if (!sampled(((sim_node *)x)->key, s->shift))
                copy_drop(c, (sim_node *)x);
            x = next;
        }
    }
}

/* Ties (copies that hit exactly alike over the window, as when every
 * setting holds the working set) go to the first of this order: the
 * LIRS-like settings first, which keep a loop that outgrows the cache (and
 * lose nothing while the working set fits), the plain-LRU setting last. */
static const unsigned TIE_ORDER[POLICY_EXPERTS] = { 3, 5, 2, 4, 1, 0 };

/* Take the best-scoring expert if its lead over the one in force is real
 * and worth a switch:
 *   - more than 1% + 1 (near-ties stay);
 *   - more than SWITCH_SIGMA standard errors: the two copies' scores differ
 *     only on accesses where one hit and the other missed; if neither were
 *     better, each such access would go either way, so the lead of a mere
 *     fluctuation is about sqrt(disagreements) (a sign test);
 *   - more than SWITCH_SETTLE times what the live cache still trails the
 *     copy of the setting in force: a switch costs hits while the live
 *     state (segments, refs, ghosts built under the old setting) settles,
 *     and while the last switch has not paid off, the next one must win by
 *     more than it cost. */
static void shadow_choose(policy *p)
{
    struct policy_shadow *s = p->shadow;
    unsigned best = p->expert;
    for (unsigned o = 0; o < POLICY_EXPERTS; o++)
        if (s->c[TIE_ORDER[o]].score > s->c[best].score)
            best = TIE_ORDER[o];
    if (best == p->expert)
        return;
    double cur = s->c[p->expert].score, lead = s->c[best].score - cur;
    unsigned i = best < p->expert ? best : p->expert, j = best ^ p->expert ^ i;
    double settle = cur - s->live;
    if (lead <= cur * 0.01 + 1.0 || lead * lead <= SWITCH_SIGMA * SWITCH_SIGMA * s->dis[i][j] ||
        lead <= SWITCH_SETTLE * (settle > 0 ? settle : 0))
        return;
    p->expert = best;
    p->mode = EXPERTS[best];
    p->pfrac = p->mode.pfrac >= 0 ? p->mode.pfrac : s->c[best].pol.pfrac;
    p->switches++;
}

/* Every access of the live policy (an admit or a touch) under lru_lfu. */
static void shadow_access(policy *p, uint64_t h, int live_hit)
{
    if (p->fixed || p->kind != POLICY_LRU_LFU)
        return;
    if (!p->shadow && !(p->shadow = shadow_new())) {
        p->fixed = 1;     /* no memory: keep the setting in force */
        return;
    }
    struct policy_shadow *s = p->shadow;
    /* the copies model the cache when full: its count at the last eviction
     * (not the count between two runs of a batch), or more */
    uint64_t size = p->count > p->full ? p->count : p->full;
    while ((size >> s->shift) > SHADOW_CAP)
        shadow_halve(s);
    if (!sampled(h, s->shift))
        return;
    size_t cap = (size_t)((size + (1ull << s->shift) - 1) >> s->shift);
    cap = cap < 1 ? 1 : cap > SHADOW_CAP ? SHADOW_CAP : cap;
    double window = 2.0 * (double)cap;
    double decay = 1.0 - 1.0 / (window < SHADOW_WINDOW ? SHADOW_WINDOW : window);
    s->live = s->live * decay + live_hit;
    int hit[POLICY_EXPERTS];
    for (unsigned e = 0; e < POLICY_EXPERTS; e++) {
        hit[e] = copy_access(&s->c[e], h, cap);
        s->c[e].score = s->c[e].score * decay + hit[e];
    }
    for (unsigned i = 0; i < POLICY_EXPERTS; i++)
        for (unsigned j = i + 1; j < POLICY_EXPERTS; j++)
            s->dis[i][j] = s->dis[i][j] * decay + (hit[i] != hit[j]);
    if (++s->samples % SHADOW_EVERY == 0)
        shadow_choose(p);
}

static unsigned shadow_shift(const policy *p) { return p->shadow ? p->shadow->shift : 0; }

static uint64_t shadow_bytes(const policy *p)
{
    const struct policy_shadow *s = p->shadow;
    if (!s)
        return 0;
    uint64_t b = sizeof *s;
    for (unsigned e = 0; e < POLICY_EXPERTS; e++) {
        const shadow_copy *c = &s->c[e];
        b += (SHADOW_CAP + 1) * (sizeof *c->nodes + sizeof *c->freelist) +
             (c->t.mask + 1) * sizeof *c->t.slot +
             (c->pol.ring[0].cap + c->pol.ring[1].cap) * 2 * sizeof(uint64_t) +
             (c->pol.gtab ? (c->pol.gmask + 1) * sizeof *c->pol.gtab : 0);
    }
    return b;
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
    if (rc == MEMOS_OK && p->expert >= POLICY_EXPERTS)
        FAIL("policy: setting %u out of range", p->expert);
    for (unsigned e = 0; rc == MEMOS_OK && p->shadow && e < POLICY_EXPERTS; e++) {
        const struct policy_shadow *s = p->shadow;
        if (s->c[e].pol.count > SHADOW_CAP || s->c[e].pol.count + s->c[e].nfree != SHADOW_CAP + 1)
            FAIL("policy: shadow copy %u holds %llu nodes", e, (unsigned long long)s->c[e].pol.count);
        rc = policy_check(&s->c[e].pol, why, whylen);
    }
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
    return p->kind == POLICY_LFU ? POLICY_LEVELS : p->kind == POLICY_LRU_LFU ? 2 : 0;
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
    if (i >= POLICY_EXPERTS)
        return MEMOS_EINVAL;
    /* the setting in force comes back; its shadow copies start anew (their
     * scores are not kept: they rebuild within one scoring window) */
    p->expert = i;
    p->mode = EXPERTS[i];
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
    n->level = (uint8_t)level_of(n->freq);
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
    if (r > 1 || p->kind != POLICY_LRU_LFU || clock < len || p->ring[r].len)
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
