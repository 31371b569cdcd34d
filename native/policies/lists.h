/*
 * lists.h — the circular doubly-linked lists through policy_node that every
 * live policy uses: the recency list (prev/next) and a second list
 * (fprev/fnext: an LFU level, a hybrid segment), each with a sentinel.
 */
#ifndef MEMOS_POLICY_LISTS_H
#define MEMOS_POLICY_LISTS_H

#include "../policy.h"

static inline void list_init(policy_node *h) { h->prev = h->next = h; }
static inline void flist_init(policy_node *h) { h->fprev = h->fnext = h; }

static inline void link_after(policy_node *h, policy_node *n)
{
    n->prev = h;
    n->next = h->next;
    h->next->prev = n;
    h->next = n;
}

static inline void unlink_node(policy_node *n)
{
    n->prev->next = n->next;
    n->next->prev = n->prev;
    n->prev = n->next = NULL;
}

static inline void flink_after(policy_node *h, policy_node *n)
{
    n->fprev = h;
    n->fnext = h->fnext;
    h->fnext->fprev = n;
    h->fnext = n;
}

static inline void funlink(policy_node *n)
{
    n->fprev->fnext = n->fnext;
    n->fnext->fprev = n->fprev;
    n->fprev = n->fnext = NULL;
}

static inline int policy_ok(policy *p, policy_node *x)
{
    return !p->evictable || p->evictable(x, p->ctx);
}

#define PFAIL(...) do { snprintf(why, whylen, __VA_ARGS__); return MEMOS_EINVAL; } while (0)

#endif /* MEMOS_POLICY_LISTS_H */
