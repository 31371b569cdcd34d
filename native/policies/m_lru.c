/*
 * m_lru.c — LRU as a simulated member: one list, most recent first.
 * See member.h for the shared store and the table of functions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "member.h"

/* ---- LRU: one list, most recent first ---- */


enum { LRU_Q = 1 };

static int lru_access(member *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (i) {
        xfront(x, i);
        return 1;
    }
    while (x->resident >= x->cap) {
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

static void lru_evict(member *x, size_t cap)
{
    while (x->resident > cap) {
        uint32_t v = x->l[LRU_Q].tail;
        xunlink(x, v);
        x->resident--;
        xfree_node(x, v);
    }
}

static void lru_remove(member *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (!i)
        return;
    xunlink(x, i);
    x->resident--;
    xfree_node(x, i);
}

static void lru_resize(member *x, size_t cap)
{
    x->cap = cap;
    lru_evict(x, cap);
}

static int lru_check(const member *x, char *why, size_t whylen)
{
    return xtable_check(x, NULL, why, whylen);
}

const member_ops member_lru_ops = {
    "LRU", NULL, NULL, lru_access, lru_evict, lru_remove, lru_resize, lru_check,
};
