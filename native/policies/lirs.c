/*
 * lirs.c — LIRS (Jiang and Zhang, SIGMETRICS 2002) as a simulated member.
 * See member.h for the shared store and the table of functions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "member.h"

/* ---- LIRS (Jiang and Zhang, SIGMETRICS 2002): stack S (list A, top at
 * the head), queue Q of resident HIR blocks (list B, its end at the head);
 * non-resident HIR blocks in S are also on list B (LI_NR, oldest at the
 * tail) so the stack is kept to 2 x capacity entries as libCacheSim does ---- */


enum { LI_S = 1, LI_Q = 2, LI_NR = 3 };

static void li_prune(member *x)
{
    while (x->l[LI_S].len) {
        uint32_t k = x->l[LI_S].tail;
        if (x->n[k].st == XLIR)
            return;
        xunlink(x, k);
        if (x->n[k].st == XNONRES) {
            xunlink2(x, k);
            xfree_node(x, k);
        }
    }
}

static void li_demote(member *x)                   /* S's bottom LIR block becomes HIR */
{
    uint32_t k = x->l[LI_S].tail;
    xunlink(x, k);
    x->n[k].st = XHIR;
    x->nlir--;
    xpush2(x, LI_Q, k);
    li_prune(x);
}

static void li_evict_hir(member *x)                /* Q's front leaves the cache */
{
    if (!x->l[LI_Q].len && x->l[LI_S].len)
        li_demote(x);                   /* (a cache too small for any HIR block) */
    uint32_t k = x->l[LI_Q].tail;
    if (!k)
        return;
    xunlink2(x, k);
    x->resident--;
    if (x->n[k].la == LI_S) {
        x->n[k].st = XNONRES;
        xpush2(x, LI_NR, k);
    } else {
        xfree_node(x, k);
    }
}

static void li_limit(member *x)
{
    while (x->cap != XUNLIMITED && x->l[LI_S].len > 2 * x->cap && x->l[LI_NR].len) {
        uint32_t k = x->l[LI_NR].tail;
        xunlink2(x, k);
        xunlink(x, k);
        xfree_node(x, k);
    }
}

static int lirs_access(member *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    uint8_t st = i ? x->n[i].st : 0;
    int hit = st == XLIR || st == XHIR;
    if (st == XLIR) {
        xfront(x, i);
        li_prune(x);
    } else if (st == XHIR) {
        if (x->n[i].la == LI_S) {
            xfront(x, i);
            xunlink2(x, i);
            x->n[i].st = XLIR;
            x->nlir++;
            li_demote(x);
        } else {
            xpush(x, LI_S, i);
            xunlink2(x, i);
            xpush2(x, LI_Q, i);
        }
    } else {
        size_t res = x->nlir + x->l[LI_Q].len;
        if (x->nlir < x->c2 && st == 0) {
            if ((i = xnew(x, key)) == XNIL)
                return 0;
            xpush(x, LI_S, i);
            x->n[i].st = XLIR;
            x->nlir++;
            x->resident++;
        } else {
            if (res >= x->cap)
                li_evict_hir(x);
            if (st == XNONRES) {
                xunlink2(x, i);
                xfront(x, i);
                x->n[i].st = XLIR;
                x->nlir++;
                x->resident++;
                if (x->nlir > x->c2)
                    li_demote(x);
            } else {
                if ((i = xnew(x, key)) == XNIL)
                    return 0;
                xpush(x, LI_S, i);
                xpush2(x, LI_Q, i);
                x->n[i].st = XHIR;
                x->resident++;
            }
        }
    }
    li_prune(x);                        /* (no LIR block at all: the stack empties) */
    li_limit(x);
    return hit;
}

static void li_sizes(member *x)
{
    size_t c = x->cap;
    int u = c == XUNLIMITED;
    x->c1 = u ? 0 : (size_t)(0.01 * (double)c);
    x->c1 = x->c1 ? x->c1 : 1;
    x->c2 = u ? c : c - x->c1;
}

static int li_init(member *x)
{
    li_sizes(x);
    return MEMOS_OK;
}

static void li_evict(member *x, size_t cap)
{
    while (x->nlir > x->c2)
        li_demote(x);
    while (x->resident > cap)
        li_evict_hir(x);
    li_limit(x);
}

static int li_resident(const member *x, uint32_t i)
{
    return x->n[i].st != XNONRES;
}

static void li_remove(member *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (!i)
        return;
    xnode *n = &x->n[i];
    x->resident -= (size_t)li_resident(x, i);
    if (n->st == XLIR)
        x->nlir--;
    if (n->lb)
        xunlink2(x, i);
    if (n->la) {
        xunlink(x, i);
        li_prune(x);
    }
    xfree_node(x, i);
}

static void li_resize(member *x, size_t cap)
{
    x->cap = cap;
    li_sizes(x);
    li_evict(x, cap);
}

static int li_check(const member *x, char *why, size_t whylen)
{
    int rc = xtable_check(x, li_resident, why, whylen);
    if (rc != MEMOS_OK)
        return rc;
    size_t lir = 0;
    if (x->l[LI_S].tail && x->n[x->l[LI_S].tail].st != XLIR)
        XFAIL("policy: member LIRS: the stack's bottom is not LIR");
    for (uint32_t i = x->l[LI_S].head; i; i = x->n[i].next)
        if (x->n[i].la != LI_S)
            XFAIL("policy: member LIRS: a stack node is marked off it");
    for (uint32_t i = x->l[LI_NR].head; i; i = x->n[i].next2)
        if (x->n[i].st != XNONRES || x->n[i].la != LI_S || x->n[i].lb != LI_NR)
            XFAIL("policy: member LIRS: a non-resident node is out of the stack");
    for (uint32_t i = x->l[LI_Q].head; i; i = x->n[i].next2)
        if (x->n[i].st != XHIR || x->n[i].lb != LI_Q)
            XFAIL("policy: member LIRS: a queue node is not resident HIR");
    for (size_t t = 0; x->tab && t <= x->tmask; t++)
        lir += x->tab[t] && x->n[x->tab[t]].st == XLIR;
    if (lir != x->nlir)
        XFAIL("policy: member LIRS: %zu LIR blocks, counted %zu", lir, x->nlir);
    return MEMOS_OK;
}

const member_ops member_lirs_ops = {
    "LIRS", li_init, NULL, lirs_access, li_evict, li_remove, li_resize, li_check,
};
