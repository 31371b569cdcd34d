/*
 * wtinylfu.c — W-TinyLFU (Einziger, Friedman and Manes, ACM ToS 2017; Caffeine's layout) as a simulated member.
 * See member.h for the shared store and the table of functions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "member.h"

/* ---- W-TinyLFU (Einziger, Friedman and Manes, ACM ToS 2017; Caffeine's
 * layout): window LRU 1%, main SLRU (probation 20%, protected 80%), a
 * count-min sketch of 4 rows x skw 4-bit counters (minimal increment,
 * halved every 10 x capacity additions) ---- */


enum { WT_W = 1, WT_P = 2, WT_R = 3 };
#define WT_ROWS 4

static size_t wt_col(uint64_t key, unsigned row, size_t mask)
{
    return member_mix64(key + (uint64_t)(row + 1) * 0x9e3779b97f4a7c15ull) & mask;
}

static int wt_sketch(member *x, size_t cap)         /* a sketch sized for cap, all zero */
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

static void wt_add(member *x, uint64_t key)
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

static uint8_t wt_est(const member *x, uint64_t key)
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

static void wt_evict_one(member *x, uint32_t v, uint8_t list)
{
    (void)list;
    xunlink(x, v);
    x->resident--;
    xfree_node(x, v);
}

/* The window's oldest leaves it: into the main cache if there is room or if
 * the sketch says it is more frequent than the main cache's victim. */
static void wt_window_out(member *x)
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

static int wt_access(member *x, uint64_t key)
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

static void wt_sizes(member *x)
{
    size_t c = x->cap;
    int u = c == XUNLIMITED;
    x->c1 = u ? c : (size_t)((double)c * 0.01);
    x->c1 = x->c1 ? x->c1 : 1;
    x->c2 = u ? c : c - x->c1;
    x->c3 = u ? c : (size_t)((double)x->c2 * 0.8);
}

static int wt_init(member *x)
{
    wt_sizes(x);
    return wt_sketch(x, x->cap == XUNLIMITED ? 1024 : x->cap);
}

static void wt_fini(member *x)
{
    free(x->sk);
}

static void wt_evict(member *x, size_t cap)
{
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
}

static void wt_remove(member *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (!i)
        return;
    xunlink(x, i);
    x->resident--;
    xfree_node(x, i);
}

static void wt_resize(member *x, size_t cap)
{
    x->cap = cap;
    wt_sizes(x);
    if (cap == XUNLIMITED)
        ;                               /* the sketch grows with the cache (wt_access) */
    else if (x->skw < 4 * cap)
        wt_sketch(x, cap);
    else
        x->sample = 10 * (uint64_t)cap;
    wt_evict(x, cap);
}

static int wt_check(const member *x, char *why, size_t whylen)
{
    return xtable_check(x, NULL, why, whylen);
}

const member_ops member_wtinylfu_ops = {
    "W-TinyLFU", wt_init, wt_fini, wt_access, wt_evict, wt_remove, wt_resize, wt_check,
};
