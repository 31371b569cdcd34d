/*
 * twoq.c — 2Q (Johnson and Shasha, VLDB 1994, the full version) as a simulated member.
 * See member.h for the shared store and the table of functions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "member.h"

/* ---- 2Q (Johnson and Shasha, VLDB 1994, the full version) ---- */


enum { Q2_IN = 1, Q2_OUT = 2, Q2_AM = 3 };

static void q2_reclaim(member *x)
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

static int q2_access(member *x, uint64_t key)
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
        q2_reclaim(x);
        xpush(x, Q2_AM, i);
        x->resident++;
        return 0;
    }
    q2_reclaim(x);
    if ((i = xnew(x, key)) == XNIL)
        return 0;
    xpush(x, Q2_IN, i);
    x->resident++;
    return 0;
}

static void q2_sizes(member *x)
{
    int u = x->cap == XUNLIMITED;
    x->c1 = u ? x->cap : (size_t)((double)x->cap * 0.25);
    x->c2 = u ? x->cap : (size_t)((double)x->cap * 0.5);
}

static int q2_init(member *x)
{
    q2_sizes(x);
    return MEMOS_OK;
}

static void q2_evict(member *x, size_t cap)
{
    while (x->resident > cap) {
        size_t was = x->cap;
        x->cap = x->resident;           /* q2_reclaim evicts when the lists fill the cap */
        q2_reclaim(x);
        x->cap = was;
    }
    while (x->l[Q2_OUT].len > x->c2) {
        uint32_t g = x->l[Q2_OUT].tail;
        xunlink(x, g);
        xfree_node(x, g);
    }
}

static int q2_resident(const member *x, uint32_t i)
{
    return x->n[i].la != Q2_OUT;
}

static void q2_remove(member *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (!i)
        return;
    x->resident -= (size_t)q2_resident(x, i);
    xunlink(x, i);
    xfree_node(x, i);
}

static void q2_resize(member *x, size_t cap)
{
    x->cap = cap;
    q2_sizes(x);
    q2_evict(x, cap);
}

static int q2_check(const member *x, char *why, size_t whylen)
{
    return xtable_check(x, q2_resident, why, whylen);
}

const member_ops member_2q_ops = {
    "2Q", q2_init, NULL, q2_access, q2_evict, q2_remove, q2_resize, q2_check,
};
