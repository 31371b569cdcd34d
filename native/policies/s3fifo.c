/*
 * s3fifo.c — S3-FIFO (Yang et al., SOSP 2023, Algorithm 1, as libCacheSim runs it) as a simulated member.
 * See member.h for the shared store and the table of functions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "member.h"

/* ---- S3-FIFO (Yang et al., SOSP 2023, Algorithm 1) as libCacheSim runs
 * it: before the first eviction new keys go to M once S is full, and a key
 * moved from S to M does not evict from M at once. ---- */


enum { S3_S = 1, S3_M = 2, S3_G = 3 };

static void s3_evict_m(member *x)
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

static void s3_evict_s(member *x)
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

static void s3_evict(member *x)
{
    x->evicted = 1;
    if (x->l[S3_S].len >= x->c1 || !x->l[S3_M].len)
        s3_evict_s(x);
    else
        s3_evict_m(x);
}

static int s3_access(member *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (i && x->n[i].la != S3_G) {
        if (x->n[i].cnt < 3)
            x->n[i].cnt++;
        return 1;
    }
    if (i)
        xunlink(x, i);                  /* out of G before the evictions (as libCacheSim) */
    while (x->resident >= x->cap)
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

static void s3_sizes(member *x)
{
    size_t c = x->cap;
    int u = c == XUNLIMITED;
    x->c1 = u ? c : (size_t)((double)c * 0.1);
    x->c1 = x->c1 ? x->c1 : 1;
    x->c2 = u ? c : c - x->c1;
    x->c3 = u ? c : (size_t)((double)c * 0.9);
}

static int s3_init(member *x)
{
    s3_sizes(x);
    return MEMOS_OK;
}

static void s3_evict_to(member *x, size_t cap)
{
    while (x->resident > cap)
        s3_evict(x);
    while (x->l[S3_G].len > x->c3) {
        uint32_t g = x->l[S3_G].tail;
        xunlink(x, g);
        xfree_node(x, g);
    }
}

static int s3_resident(const member *x, uint32_t i)
{
    return x->n[i].la != S3_G;
}

static void s3_remove(member *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (!i)
        return;
    x->resident -= (size_t)s3_resident(x, i);
    xunlink(x, i);
    xfree_node(x, i);
}

static void s3_resize(member *x, size_t cap)
{
    x->cap = cap;
    s3_sizes(x);
    s3_evict_to(x, cap);
}

static int s3_check(const member *x, char *why, size_t whylen)
{
    return xtable_check(x, s3_resident, why, whylen);
}

const member_ops member_s3fifo_ops = {
    "S3-FIFO", s3_init, NULL, s3_access, s3_evict_to, s3_remove, s3_resize, s3_check,
};
