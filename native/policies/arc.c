/*
 * arc.c — ARC (Megiddo and Modha, FAST 2003, Fig. 4) as a simulated member.
 * See member.h for the shared store and the table of functions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "member.h"

/* ---- ARC (Megiddo and Modha, FAST 2003, Fig. 4) ---- */


enum { ARC_T1 = 1, ARC_T2 = 2, ARC_B1 = 3, ARC_B2 = 4 };

static void arc_replace(member *x, int in_b2)
{
    size_t t1 = x->l[ARC_T1].len;
    if ((t1 && ((double)t1 > x->p || (in_b2 && (double)t1 == x->p))) || !x->l[ARC_T2].len) {
        uint32_t v = x->l[ARC_T1].tail;
        xunlink(x, v);
        xpush(x, ARC_B1, v);
        x->resident--;
    } else {
        uint32_t v = x->l[ARC_T2].tail;
        xunlink(x, v);
        xpush(x, ARC_B2, v);
        x->resident--;
    }
}

static void arc_drop(member *x, uint8_t list)                /* a ghost's LRU end goes */
{
    uint32_t v = x->l[list].tail;
    xunlink(x, v);
    xfree_node(x, v);
}

/* Ghosts within ARC's bounds: |T1| + |B1| <= c, all four <= 2c. */
static int arc_access(member *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    double c = (double)x->cap;
    if (i && (x->n[i].la == ARC_T1 || x->n[i].la == ARC_T2)) {   /* case I */
        xunlink(x, i);
        xpush(x, ARC_T2, i);
        return 1;
    }
    int full = x->resident >= x->cap;
    if (i) {                                                   /* cases II, III */
        double b1 = (double)x->l[ARC_B1].len, b2 = (double)x->l[ARC_B2].len;
        int in_b2 = x->n[i].la == ARC_B2;
        if (!in_b2) {
            double d = b2 / b1 > 1.0 ? b2 / b1 : 1.0;
            x->p = x->p + d < c ? x->p + d : c;
        } else {
            double d = b1 / b2 > 1.0 ? b1 / b2 : 1.0;
            x->p = x->p - d > 0.0 ? x->p - d : 0.0;
        }
        xunlink(x, i);
        if (full)
            arc_replace(x, in_b2);
        xpush(x, ARC_T2, i);
        x->resident++;
        return 0;
    }
    size_t l1 = x->l[ARC_T1].len + x->l[ARC_B1].len;          /* case IV */
    if (full) {
        if (l1 >= x->cap) {
            if (x->l[ARC_T1].len < x->cap) {
                arc_drop(x, ARC_B1);
                arc_replace(x, 0);
            } else {
                uint32_t v = x->l[ARC_T1].tail;
                xunlink(x, v);
                x->resident--;
                xfree_node(x, v);
            }
        } else {
            if (l1 + x->l[ARC_T2].len + x->l[ARC_B2].len >= 2 * x->cap && x->l[ARC_B2].len)
                arc_drop(x, ARC_B2);
            arc_replace(x, 0);
        }
    }
    if ((i = xnew(x, key)) == XNIL)
        return 0;
    xpush(x, ARC_T1, i);
    x->resident++;
    return 0;
}

static void arc_evict(member *x, size_t cap)
{
    x->p = x->p < (double)cap ? x->p : (double)cap;
    while (x->resident > cap)
        arc_replace(x, 0);
    while (x->l[ARC_T1].len + x->l[ARC_B1].len > cap && x->l[ARC_B1].len)
        arc_drop(x, ARC_B1);
    while (x->resident + x->l[ARC_B1].len + x->l[ARC_B2].len > 2 * cap && x->l[ARC_B2].len)
        arc_drop(x, ARC_B2);
}

static int arc_resident(const member *x, uint32_t i)
{
    return x->n[i].la == ARC_T1 || x->n[i].la == ARC_T2;
}

static void arc_remove(member *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (!i)
        return;
    x->resident -= (size_t)arc_resident(x, i);
    xunlink(x, i);
    xfree_node(x, i);
}

static void arc_resize(member *x, size_t cap)
{
    x->cap = cap;
    arc_evict(x, cap);
}

static int arc_check(const member *x, char *why, size_t whylen)
{
    return xtable_check(x, arc_resident, why, whylen);
}

const member_ops member_arc_ops = {
    "ARC", NULL, NULL, arc_access, arc_evict, arc_remove, arc_resize, arc_check,
};
