/*
 * policy.c — the eviction policy.
 *
 * Every live entry embeds a policy_node.  Two orders are kept:
 *
 *   recency    one circular doubly-linked list through prev/next with a
 *              sentinel: head.next is the most recently used, head.prev the
 *              least.  Always maintained: it gives memos_foreach its order
 *              and is the victim order of "lru".
 *
 *   frequency  (only for "lfu") POLICY_LEVELS lists through fprev/fnext;
 *              a node sits in level = bit length of its touch count (capped),
 *              so level 0 holds never-touched entries, level 1 once-touched,
 *              level 2 two or three times, ...  A touch may lift a node one
 *              level; each list is kept MRU-first so ties go LRU.
 *
 *     lru victims:  head.prev, head.prev.prev, ...           (oldest first)
 *     lfu victims:  lvl[0].fprev ..., then lvl[1].fprev ...  (rarest, oldest)
 *
 * Victims are filtered by the owner's evictable() predicate (the cache skips
 * pinned, sticky, evicting and just-refused entries); the walk is O(skipped).
 * "lru_lfu" is left to a later issue and is refused with MEMOS_EINVAL.
 *
 * Invariants (policy_check): the recency list is well linked and holds
 * `count` nodes, each marked linked; under lfu each node is on the level list
 * its freq says, and the level lists hold `count` nodes together.
 *
 * Locking: none here; the cache lock guards every call.
 */
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "policy.h"

/* ---- types and constants ---- */

#define POLICY_FREQ_MAX 0xffffu

/* ---- private prototypes ---- */

static void     list_init(policy_node *h, int freq);
static void     link_after(policy_node *h, policy_node *n);
static void     unlink_node(policy_node *n);
static void     flink_after(policy_node *h, policy_node *n);
static void     funlink(policy_node *n);
static unsigned level_of(uint32_t freq);
static int      kind_of(const char *name, enum policy_kind *out);

/* ---- API ---- */

int policy_init(policy *p, const char *name, policy_evictable_fn fn, void *ctx)
{
    memset(p, 0, sizeof *p);
    list_init(&p->head, 0);
    for (unsigned i = 0; i < POLICY_LEVELS; i++)
        list_init(&p->lvl[i], 1);
    p->evictable = fn;
    p->ctx = ctx;
    return policy_select(p, name ? name : "lru");
}

/* Switch the victim order; the level lists are rebuilt from the recency
 * list (LRU first, so each level stays MRU-first). */
int policy_select(policy *p, const char *name)
{
    enum policy_kind k;
    if (kind_of(name, &k) != MEMOS_OK)
        return MEMOS_EINVAL;
    for (unsigned i = 0; i < POLICY_LEVELS; i++)
        list_init(&p->lvl[i], 1);
    p->kind = k;
    snprintf(p->name, sizeof p->name, "%s", name);
    if (k == POLICY_LFU)
        for (policy_node *n = p->head.prev; n != &p->head; n = n->prev) {
            n->level = (uint8_t)level_of(n->freq);
            flink_after(&p->lvl[n->level], n);
        }
    return MEMOS_OK;
}

void policy_admit(policy *p, policy_node *n)
{
    assert(!n->linked);
    n->freq = 0;
    n->level = 0;
    n->linked = 1;
    link_after(&p->head, n);
    if (p->kind == POLICY_LFU)
        flink_after(&p->lvl[0], n);
    p->count++;
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
    }
}

void policy_remove(policy *p, policy_node *n)
{
    assert(n->linked && p->count > 0);
    unlink_node(n);
    if (p->kind == POLICY_LFU)
        funlink(n);
    n->linked = 0;
    p->count--;
}

/* Up to n evictable nodes, best victim first. */
size_t policy_victims(policy *p, policy_node **out, size_t n)
{
    size_t got = 0;
    if (p->kind == POLICY_LRU) {
        for (policy_node *x = p->head.prev; x != &p->head && got < n; x = x->prev)
            if (!p->evictable || p->evictable(x, p->ctx))
                out[got++] = x;
        return got;
    }
    for (unsigned l = 0; l < POLICY_LEVELS && got < n; l++)
        for (policy_node *x = p->lvl[l].fprev; x != &p->lvl[l] && got < n; x = x->fprev)
            if (!p->evictable || p->evictable(x, p->ctx))
                out[got++] = x;
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

/* ---- private helpers ---- */

static int kind_of(const char *name, enum policy_kind *out)
{
    if (!name)
        return MEMOS_EINVAL;
    if (strcmp(name, "lru") == 0)
        *out = POLICY_LRU;
    else if (strcmp(name, "lfu") == 0)
        *out = POLICY_LFU;
    else
        return MEMOS_EINVAL;   /* "lru_lfu": a later issue */
    return MEMOS_OK;
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

/* ---- debugging ---- */

int policy_check(const policy *p, char *why, size_t whylen)
{
    uint64_t n = 0;
    const policy_node *h = &p->head;
    for (const policy_node *x = h->next; x != h; x = x->next) {
        if (x->next->prev != x || x->prev->next != x) {
            snprintf(why, whylen, "policy: recency list broken at node %llu",
                     (unsigned long long)n);
            return MEMOS_EINVAL;
        }
        if (!x->linked) {
            snprintf(why, whylen, "policy: unlinked node on the list");
            return MEMOS_EINVAL;
        }
        if (++n > p->count) {
            snprintf(why, whylen, "policy: list longer than count %llu",
                     (unsigned long long)p->count);
            return MEMOS_EINVAL;
        }
    }
    if (n != p->count) {
        snprintf(why, whylen, "policy: list holds %llu, count says %llu",
                 (unsigned long long)n, (unsigned long long)p->count);
        return MEMOS_EINVAL;
    }
    if (p->kind != POLICY_LFU)
        return MEMOS_OK;
    uint64_t m = 0;
    for (unsigned l = 0; l < POLICY_LEVELS; l++)
        for (const policy_node *x = p->lvl[l].fnext; x != &p->lvl[l]; x = x->fnext) {
            if (x->level != l || level_of(x->freq) != l || x->fnext->fprev != x) {
                snprintf(why, whylen, "policy: node on wrong lfu level %u", l);
                return MEMOS_EINVAL;
            }
            if (++m > p->count)
                break;
        }
    if (m != p->count) {
        snprintf(why, whylen, "policy: lfu levels hold %llu, count says %llu",
                 (unsigned long long)m, (unsigned long long)p->count);
        return MEMOS_EINVAL;
    }
    return MEMOS_OK;
}
