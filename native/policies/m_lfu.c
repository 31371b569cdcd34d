/*
 * m_lfu.c — LFU as a simulated member: counts while cached, ties to the first to reach the count (O(1) buckets).
 * See member.h for the shared store and the table of functions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "member.h"

/* ---- LFU: counts while cached; ties: the first to reach the count ----
 * Buckets of equal counts in ascending order (O(1) per access, after
 * Shah, Mitra and Matani, "An O(1) algorithm for implementing the LFU cache
 * eviction scheme", 2010); a node's bucket is in prev2. */


static uint32_t bk_new(member *x, uint64_t count, uint32_t after)
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

static void bk_put(member *x, uint32_t b, uint32_t i)         /* at the bucket's head */
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

static void bk_take(member *x, uint32_t i)                    /* off its bucket; empty buckets go */
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

static int lfu_access(member *x, uint64_t key)
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
    while (x->resident >= x->cap) {
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

static void lfu_evict(member *x, size_t cap)
{
    while (x->resident > cap) {
        uint32_t v = x->bk[x->bkfirst].l.tail;
        bk_take(x, v);
        x->resident--;
        xfree_node(x, v);
    }
}

static void lfu_remove(member *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (!i)
        return;
    bk_take(x, i);
    x->resident--;
    xfree_node(x, i);
}

static void lfu_resize(member *x, size_t cap)
{
    x->cap = cap;
    lfu_evict(x, cap);
}

static int lfu_check(const member *x, char *why, size_t whylen)
{
    return xtable_check(x, NULL, why, whylen);
}

static void lfu_fini(member *x)
{
    free(x->bk);
}

const member_ops member_lfu_ops = {
    "LFU", NULL, lfu_fini, lfu_access, lfu_evict, lfu_remove, lfu_resize, lfu_check,
};
