/*
 * policy.c — the eviction policy's front: who goes first when the arena is
 * full.  Three policies, each one file behind one table of functions
 * (policy.h: policy_ops; native/policies/):
 *
 *   lru       victims in recency order (policies/lru.c)
 *   lfu       the rarest first, by levels of touch counts (policies/lfu.c)
 *   lru_lfu   the default: a two-segment hybrid (probation FIFO, protected
 *             LRU with an aging clock, ghosts of the evicted) at one of nine
 *             settings (policies/hybrid.c), the setting — LRU, LIRS or ARC —
 *             chosen by shadows of those three judged on every access from
 *             the stamps and class bits the live cache keeps
 *             (policies/shadow.c, policies/lru_lfu.c); "lru_lfu@i" runs
 *             setting i alone (policy_simulate and the tests).
 *
 * The front keeps what every policy shares: the recency list, a circular
 * doubly-linked list through prev/next with a sentinel (head.next the most
 * recently used; memos_foreach's order and lru's victim order), the count,
 * the victim filter, and the cache's size when full (the count when victims
 * were last asked for: the policy's `resize`).  It never asks which policy
 * runs: every difference is in the table.
 *
 * Simulated members (policies/member.h: the published policies LRU, LFU,
 * ARC, 2Q, S3-FIFO, SIEVE, LIRS, W-TinyLFU and the hybrid's settings, each
 * over unit-size blocks of its own) are what policy_simulate replays as
 * "ref:NAME" (bench policy's reference peers; tests/test_policy_ref.py holds
 * them equal to memosfs/testing/refpolicies.py).
 *
 * Memory.  56 bytes per entry (policy_node), whatever the policy; lru_lfu
 * adds its ghosts (36 bytes per entry, a table of at least 36 KB,
 * policies/hybrid.c) and fixed shadows of 17 KB (policies/shadow.c); lfu a
 * few sentinels.
 *
 * Cost.  admit, touch and remove are O(1) under every policy (lru_lfu: an
 * eviction leaves its ghost pending, an admit reads one bucket of the ghost
 * table and moves one pending ghost into it; the shadows' counts on every
 * access, their lines fetched at once); a victim is O(skipped) plus at most
 * 8 clock passes (lru_lfu).
 *
 * Victims are filtered by the owner's evictable() predicate (the cache skips
 * pinned, sticky, evicting and just-refused entries) and are not removed
 * here: the cache calls policy_note_evict then policy_remove for each one
 * that it really evicts.
 *
 * Invariants (policy_check): the recency list is well linked and holds
 * `count` nodes, each marked linked; then the policy's own (its check).
 *
 * Locking: none here; the cache lock guards every call.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy.h"
#include "policies/hybrid.h"
#include "policies/lists.h"
#include "policies/member.h"

/* ---- types and constants ---- */

#define POLICY_FREQ_MAX 0xffffu

static const policy_ops *const POLICIES[] = {
    &policy_lru_lfu_ops, &policy_lru_ops, &policy_lfu_ops,
    &policy_hybrid_ops[0], &policy_hybrid_ops[1], &policy_hybrid_ops[2],
    &policy_hybrid_ops[3], &policy_hybrid_ops[4], &policy_hybrid_ops[5],
    &policy_hybrid_ops[6], &policy_hybrid_ops[7], &policy_hybrid_ops[8],
};
#define NPOLICIES (sizeof POLICIES / sizeof POLICIES[0])

/* ---- private prototypes ---- */

static const policy_ops *ops_of(const char *name);
static uint64_t norm_hash(uint64_t h);
static uint64_t mix64(uint64_t x);

/* ---- API ---- */

int policy_init(policy *p, const char *name, policy_evictable_fn fn, void *ctx)
{
    memset(p, 0, sizeof *p);
    list_init(&p->head);
    p->evictable = fn;
    p->ctx = ctx;
    return policy_select(p, name ? name : "lru_lfu");
}

void policy_destroy(policy *p)
{
    if (p->ops)
        p->ops->stop(p);
    p->ops = NULL;
}

/* Switch the victim order: the old policy lets go of the nodes, the new one
 * takes them over from the recency list (LRU first).  On no memory for the
 * new one the old one stays (MEMOS_ENOMEM). */
int policy_select(policy *p, const char *name)
{
    const policy_ops *o = ops_of(name);
    if (!o)
        return MEMOS_EINVAL;
    if (o == p->ops)
        return MEMOS_OK;
    const policy_ops *was = p->ops;
    if (was)
        was->stop(p);
    p->ops = o;
    if (o->start(p) != MEMOS_OK) {
        o->stop(p);
        p->ops = was;
        if (was)
            was->start(p);
        return MEMOS_ENOMEM;
    }
    snprintf(p->name, sizeof p->name, "%s", o->name);
    if (p->full)
        o->resize(p, p->full);
    return MEMOS_OK;
}

void policy_admit(policy *p, policy_node *n, uint64_t hash)
{
    assert(!n->linked);
    n->hash = norm_hash(hash);
    n->freq = 0;
    n->level = 0;
    n->ref = 0;
    n->mcls = 0;
    n->linked = 1;
    n->fprev = n->fnext = NULL;
    link_after(&p->head, n);
    p->count++;
    p->ops->access(p, n, 0);
}

void policy_touch(policy *p, policy_node *n)
{
    assert(n->linked);
    unlink_node(n);
    link_after(&p->head, n);
    if (n->freq < POLICY_FREQ_MAX)
        n->freq++;
    p->ops->access(p, n, 1);
}

void policy_remove(policy *p, policy_node *n)
{
    assert(n->linked && p->count > 0);
    p->ops->remove(p, n, p->evicting == n);
    p->evicting = NULL;
    unlink_node(n);
    n->linked = 0;
    p->count--;
}

/* A victim is going: policy_remove is told it is an eviction, not a
 * deletion (lru_lfu remembers it in a ghost). */
void policy_note_evict(policy *p, policy_node *n)
{
    assert(n->linked);
    p->evicting = n;
}

/* The entry was renamed (its stamp, and so the shadows' view, stays). */
void policy_rekey(policy *p, policy_node *n, uint64_t hash)
{
    n->hash = norm_hash(hash);
}

/* Up to n evictable nodes, best victim first. */
size_t policy_victims(policy *p, policy_node **out, size_t n)
{
    if (p->count && p->count != p->full) {  /* (an empty cache asked: its size when full stands) */
        p->full = p->count;
        p->ops->resize(p, p->full);
    }
    p->batch = n;
    return p->ops->evict(p, out, n);
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
    for (unsigned i = 0; i < p->gpn; i++)      /* (and those not yet in the table) */
        out->ghost_entries += p->gpend[(p->gph + i) % POLICY_GHOST_PENDING] != 0;
    out->ghost_bytes = policy_ghost_bytes(p);
    out->probation = p->nseg[POLICY_PROBATION];
    out->protected_ = p->nseg[POLICY_PROTECTED];
    out->recency = !p->ops->setting ? (p->ops->lists ? 0.0 : 1.0) : p->mode.lru ? 1.0 :
                   p->mode.arc ? (p->count ? p->arcp / (double)p->count : 0.0) : p->pfrac;
    out->expert = p->expert;
    out->expert_switches = p->switches;
    if (p->ops->stats)
        p->ops->stats(p, out);
    policy_decided(p, out->decided, sizeof out->decided);
}

const char *policy_decided(const policy *p, char *buf, size_t len)
{
    if (p->ops->decided)
        return p->ops->decided(p, buf, len);
    if (p->ops->setting)
        snprintf(buf, len, "%s (fixed)", p->ops->name);
    else
        snprintf(buf, len, "%s", p->ops->lists ? "LFU" : "LRU");
    return buf;
}

int policy_check(const policy *p, char *why, size_t whylen)
{
    uint64_t n = 0;
    const policy_node *h = &p->head;
    for (const policy_node *x = h->next; x != h; x = x->next) {
        if (x->next->prev != x || x->prev->next != x)
            PFAIL("policy: recency list broken at node %llu", (unsigned long long)n);
        if (!x->linked)
            PFAIL("policy: unlinked node on the list");
        if (++n > p->count)
            PFAIL("policy: list longer than count %llu", (unsigned long long)p->count);
    }
    if (n != p->count)
        PFAIL("policy: list holds %llu, count says %llu",
              (unsigned long long)n, (unsigned long long)p->count);
    return p->ops->check(p, why, whylen);
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

/* "ref:NAME": the simulated member alone. */
static long long member_simulate(const char *name, const uint64_t *keys, size_t n, size_t capacity)
{
    member x;
    if (capacity == 0 || member_init(&x, name, capacity) != MEMOS_OK)
        return -1;
    long long hits = 0;
    for (size_t r = 0; r < n && !x.dead; r++)
        hits += member_access(&x, norm_hash(mix64(keys[r])));
    int dead = x.dead;
    member_free(&x);
    return dead ? -1 : hits;
}

long long policy_simulate(const char *name, const uint64_t *keys, size_t n,
                          size_t capacity, unsigned batch, policy_stats *st)
{
    if (st) {
        memset(st, 0, sizeof *st);
        snprintf(st->decided, sizeof st->decided, "%s", name ? name : "");
    }
    if (name && strncmp(name, "ref:", 4) == 0)
        return batch ? member_simulate(name + 4, keys, n, capacity) : -1;
    if (capacity == 0 || batch == 0 || capacity > UINT32_MAX / 4 || !ops_of(name))
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
    int ready = 0;
    if (!t.slot || !nodes || !freelist || !v || policy_init(&p, name, NULL, NULL) != MEMOS_OK)
        goto out;
    ready = 1;
    /* the capacity is known from the start, as the peers of this capacity
     * know it: the policy is told its size before the first access */
    p.full = capacity;
    p.ops->resize(&p, p.full);
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
out:
    if (ready)
        policy_destroy(&p);
    free(t.slot);
    free(nodes);
    free(freelist);
    free(v);
    return hits;
}

/* ---- private helpers ---- */

static const policy_ops *ops_of(const char *name)
{
    for (unsigned i = 0; name && i < NPOLICIES; i++)
        if (strcmp(POLICIES[i]->name, name) == 0)
            return POLICIES[i];
    return NULL;
}

static uint64_t norm_hash(uint64_t h) { return h ? h : 1; }

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* ---- state dump and restore (the SSD tier's policy; see policy.h) ----
 *
 * Kept apart from the rest: it reads and rebuilds the lists, the balance and
 * the ghost rings exactly as they are, so a restored policy picks the same
 * victims as the one dumped.  A ring is restored slot for slot (stale slots
 * too), because a ghost's place in its ring follows from its sequence number. */

unsigned policy_dump_lists(const policy *p) { return p->ops->lists; }
unsigned policy_dump_rings(const policy *p) { return p->ops->rings; }
unsigned policy_dump_format(const policy *p) { return p->ops->format; }

size_t policy_dump_list(const policy *p, int list, policy_node **out, size_t max)
{
    size_t k = 0;
    if (list < 0) {
        for (policy_node *x = p->head.next; x != &p->head; x = x->next, k++)
            if (k < max)
                out[k] = x;
        return k;
    }
    if ((unsigned)list >= p->ops->lists)
        return 0;
    const policy_node *h = p->ops->list((policy *)p, (unsigned)list);
    for (policy_node *x = h->fnext; x != h; x = x->fnext, k++)
        if (k < max)
            out[k] = x;
    return k;
}

size_t policy_dump_ghosts(const policy *p, unsigned r, policy_ghost *out, size_t max,
                          uint64_t *epoch)
{
    *epoch = 0;
    return r < p->ops->rings ? hybrid_dump_ghosts(p, r, out, max, epoch) : 0;
}

uint32_t policy_dump_tick(const policy *p) { return p->tick; }
uint64_t policy_dump_ghost_size(const policy *p) { return p->gtab ? p->gfull : 0; }

int policy_restore_ghost_size(policy *p, uint64_t size)
{
    if (!p->ops->rings || size > (1ull << 40))
        return MEMOS_EINVAL;
    if (size)
        hybrid_resize(p, size);
    return !size || p->gtab ? MEMOS_OK : MEMOS_ENOMEM;
}

unsigned policy_dump_expert(const policy *p) { return p->expert; }

int policy_restore_expert(policy *p, unsigned i)
{
    return p->ops->setting ? p->ops->setting(p, i) : MEMOS_OK;   /* (lru, lfu: no settings) */
}

double policy_dump_balance(const policy *p, uint64_t ghits[2])
{
    ghits[0] = p->ghits[0];
    ghits[1] = p->ghits[1];
    return p->pfrac;
}

/* Link n at the LRU end of the recency list (nodes come MRU first; each is
 * stamped one access before the one restored before it, the clock after
 * the first, until policy_restore_stamp says otherwise). */
void policy_restore_node(policy *p, policy_node *n, uint64_t hash, uint32_t freq, uint8_t ref)
{
    n->hash = norm_hash(hash);
    n->freq = freq > POLICY_FREQ_MAX ? POLICY_FREQ_MAX : freq;
    n->level = 0;
    n->ref = ref > 3 ? 3 : ref;
    n->seg = POLICY_PROBATION;
    n->stamp = (uint32_t)0 - (uint32_t)p->count;
    n->mcls = 0;
    p->tick = 1;
    n->linked = 1;
    n->fprev = n->fnext = NULL;
    link_after(p->head.prev, n);
    p->count++;
}

/* A restored node's stamp and class bits, and the clock they count by. */
void policy_restore_stamp(policy *p, policy_node *n, uint32_t stamp, uint8_t cls, uint32_t tick)
{
    n->stamp = stamp;
    n->mcls = cls;
    p->tick = tick;
}

/* Append n at the back of second list `list` (nodes come front first). */
int policy_restore_place(policy *p, policy_node *n, unsigned list)
{
    if (!n->linked || n->fprev || list >= p->ops->lists)
        return MEMOS_EINVAL;
    return p->ops->place(p, n, list);
}

int policy_restore_ghosts(policy *p, unsigned r, const policy_ghost *g, size_t len,
                          uint64_t epoch)
{
    if (r >= p->ops->rings)
        return MEMOS_EINVAL;
    return hybrid_restore_ghosts(p, r, g, len, epoch);
}

int policy_restore_finish(policy *p, double pfrac, const uint64_t ghits[2],
                          char *why, size_t whylen)
{
    for (policy_node *x = p->head.next; x != &p->head; x = x->next)
        if (p->ops->lists && !x->fprev) {
            snprintf(why, whylen, "policy: a restored node is on no list");
            return MEMOS_EINVAL;
        }
    if (p->ops->setting && p->mode.pfrac < 0 && hybrid_set_balance(p, pfrac) != MEMOS_OK) {
        snprintf(why, whylen, "policy: balance %g out of range", pfrac);
        return MEMOS_EINVAL;
    }
    p->ghits[0] = ghits[0];
    p->ghits[1] = ghits[1];
    return policy_check(p, why, whylen);
}
