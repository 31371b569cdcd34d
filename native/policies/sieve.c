/*
 * sieve.c — SIEVE (Zhang et al., NSDI 2024) as a simulated member: a FIFO, a visited bit, a hand.
 * See member.h for the shared store and the table of functions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "member.h"

/* ---- SIEVE (Zhang et al., NSDI 2024): a FIFO, a visited bit, a hand
 * moving from the tail towards the head ---- */


enum { SV_Q = 1 };

static int sieve_access(member *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (i) {
        x->n[i].cnt = 1;
        return 1;
    }
    while (x->resident >= x->cap) {
        uint32_t o = x->hand ? x->hand : x->l[SV_Q].tail;
        while (x->n[o].cnt) {
            x->n[o].cnt = 0;
            o = x->n[o].prev ? x->n[o].prev : x->l[SV_Q].tail;
        }
        x->hand = x->n[o].prev;
        xunlink(x, o);
        x->resident--;
        xfree_node(x, o);
    }
    if ((i = xnew(x, key)) == XNIL)
        return 0;
    xpush(x, SV_Q, i);
    x->resident++;
    return 0;
}

static void sieve_evict(member *x, size_t cap)
{
    while (x->resident > cap) {
        uint32_t o = x->hand ? x->hand : x->l[SV_Q].tail;
        while (x->n[o].cnt) {
            x->n[o].cnt = 0;
            o = x->n[o].prev ? x->n[o].prev : x->l[SV_Q].tail;
        }
        x->hand = x->n[o].prev;
        xunlink(x, o);
        x->resident--;
        xfree_node(x, o);
    }
}

static void sieve_remove(member *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (!i)
        return;
    if (x->hand == i)
        x->hand = x->n[i].prev;
    xunlink(x, i);
    x->resident--;
    xfree_node(x, i);
}

static void sieve_resize(member *x, size_t cap)
{
    x->cap = cap;
    sieve_evict(x, cap);
}

static int sieve_check(const member *x, char *why, size_t whylen)
{
    return xtable_check(x, NULL, why, whylen);
}

const member_ops member_sieve_ops = {
    "SIEVE", NULL, NULL, sieve_access, sieve_evict, sieve_remove, sieve_resize, sieve_check,
};
