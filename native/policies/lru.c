/*
 * lru.c — "lru": victims in recency order, the least recently used first.
 * The recency list the front (policy.c) keeps for every policy is all it
 * needs: no state of its own, no second list.  Every call is O(1) but a
 * victim walk, O(skipped) past entries that may not go.
 */
#include <stdio.h>

#include "lists.h"

static int  lru_start(policy *p) { return MEMOS_OK; }
static void lru_stop(policy *p) {}
static void lru_access(policy *p, policy_node *n, int hit) {}
static void lru_remove(policy *p, policy_node *n, int evicted) {}
static void lru_resize(policy *p, uint64_t full) {}
static int  lru_check(const policy *p, char *why, size_t whylen) { return MEMOS_OK; }

static size_t lru_evict(policy *p, policy_node **out, size_t n)
{
    size_t got = 0;
    for (policy_node *x = p->head.prev; x != &p->head && got < n; x = x->prev)
        if (policy_ok(p, x))
            out[got++] = x;
    return got;
}

const policy_ops policy_lru_ops = {
    .name = "lru", .start = lru_start, .stop = lru_stop, .access = lru_access,
    .evict = lru_evict, .remove = lru_remove, .resize = lru_resize, .check = lru_check,
};
