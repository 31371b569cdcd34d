/*
 * m_hybrid.c — a setting of lru_lfu's own hybrid ("lru_lfu@i") as a simulated member: the live hybrid's code (hybrid.c) over nodes of its own ("ref:lru_lfu@i", the tests' check that a setting is its own code).
 * See member.h for the shared store and the table of functions.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "member.h"

/* ---- a hybrid setting (lru_lfu@i, policy.c's own) as a member: the
 * table's xnode i and hyb_node i go together ---- */


static hyb_node *hyb_at(const member *x, uint32_t i)
{
    return &x->chunk[i / HYB_CHUNK][i % HYB_CHUNK];
}

static int hyb_room(member *x)                      /* hyb_nodes for every xnode */
{
    while ((size_t)x->nchunks * HYB_CHUNK < x->nalloc) {
        hyb_node **c = realloc(x->chunk, (x->nchunks + 1) * sizeof *c);
        if (!c)
            goto oom;
        x->chunk = c;
        if (!(c[x->nchunks] = calloc(HYB_CHUNK, sizeof **c)))
            goto oom;
        x->nchunks++;
    }
    return MEMOS_OK;
oom:
    x->dead = 1;
    return MEMOS_ENOMEM;
}

static void hyb_evict_to(member *x, size_t cap)
{
    while (x->resident > cap) {
        policy_node *v;
        if (policy_victims(x->pol, &v, 1) != 1)
            return;
        uint32_t i = ((hyb_node *)v)->idx;
        policy_note_evict(x->pol, v);
        policy_remove(x->pol, v);
        x->resident--;
        xfree_node(x, i);
    }
}

static int hyb_access(member *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (i) {
        policy_touch(x->pol, &hyb_at(x, i)->pn);
        return 1;
    }
    if (x->resident >= x->cap)
        hyb_evict_to(x, x->cap - 1);
    if ((i = xnew(x, key)) == XNIL)
        return 0;
    if (hyb_room(x) != MEMOS_OK) {
        xfree_node(x, i);
        return 0;
    }
    hyb_node *h = hyb_at(x, i);
    memset(h, 0, sizeof *h);
    h->idx = i;
    policy_admit(x->pol, &h->pn, key);
    x->resident++;
    return 0;
}

static int hyb_init(member *x)
{
    char name[16];
    snprintf(name, sizeof name, "lru_lfu@%u", (unsigned)x->hyb);
    if (!(x->pol = malloc(sizeof *x->pol)))
        return MEMOS_ENOMEM;
    if (policy_init(x->pol, name, NULL, NULL) != MEMOS_OK) {
        free(x->pol);
        x->pol = NULL;
        return MEMOS_ENOMEM;
    }
    return MEMOS_OK;
}

static void hyb_fini(member *x)
{
    if (x->pol) {
        policy_destroy(x->pol);
        free(x->pol);
    }
    for (uint32_t c = 0; c < x->nchunks; c++)
        free(x->chunk[c]);
    free(x->chunk);
}

static void hyb_remove(member *x, uint64_t key)
{
    uint32_t i = xfind(x, key);
    if (!i)
        return;
    policy_remove(x->pol, &hyb_at(x, i)->pn);
    x->resident--;
    xfree_node(x, i);
}

static void hyb_resize(member *x, size_t cap)
{
    x->cap = cap;
    hyb_evict_to(x, cap);
}

static int hyb_check(const member *x, char *why, size_t whylen)
{
    int rc = xtable_check(x, NULL, why, whylen);
    return rc == MEMOS_OK ? policy_check(x->pol, why, whylen) : rc;
}

const member_ops member_hybrid_ops = {
    "lru_lfu@i", hyb_init, hyb_fini, hyb_access, hyb_evict_to, hyb_remove, hyb_resize, hyb_check,
};
