/*
 * member.c — what every simulated policy shares (member.h): the node store
 * (one growable array, a free list through `next`), the key table (linear
 * probing, backward-shift deletion), the two kinds of list links, and the
 * registry of members by name.  See member.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "member.h"

static const member_ops *const MEMBERS[] = {
    &member_lru_ops, &member_lfu_ops, &member_arc_ops, &member_2q_ops, &member_s3fifo_ops,
    &member_sieve_ops, &member_lirs_ops, &member_wtinylfu_ops,
};
#define NMEMBERS (sizeof MEMBERS / sizeof MEMBERS[0])

/* ---- API ---- */

uint64_t member_mix64(uint64_t x)
{
    x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27; x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static int start(member *x, const member_ops *ops, unsigned hyb, size_t cap)
{
    memset(x, 0, sizeof *x);
    x->ops = ops;
    x->hyb = (uint8_t)hyb;
    x->cap = cap ? cap : 1;
    int rc = ops->init ? ops->init(x) : MEMOS_OK;
    if (rc != MEMOS_OK)
        member_free(x);
    return rc;
}

int member_init(member *x, const char *name, size_t cap)
{
    memset(x, 0, sizeof *x);
    for (unsigned i = 0; i < NMEMBERS; i++)
        if (strcmp(MEMBERS[i]->name, name) == 0)
            return start(x, MEMBERS[i], 0, cap);
    if (strncmp(name, "lru_lfu@", 8) == 0 && name[8] >= '0' && name[8] <= '9' && !name[9])
        return member_init_hybrid(x, (unsigned)(name[8] - '0'), cap);
    return MEMOS_EINVAL;
}

int member_init_hybrid(member *x, unsigned setting, size_t cap)
{
    memset(x, 0, sizeof *x);
    if (!policy_expert_at(setting))
        return MEMOS_EINVAL;
    return start(x, &member_hybrid_ops, setting, cap);
}

void member_free(member *x)
{
    if (x->ops && x->ops->fini)
        x->ops->fini(x);
    free(x->n);
    free(x->tab);
    memset(x, 0, sizeof *x);
}

int member_access(member *x, uint64_t key)
{
    return x->dead ? 0 : x->ops->access(x, key ? key : 1);
}

void member_resize(member *x, size_t cap)
{
    cap = cap ? cap : 1;
    if (!x->dead && cap != x->cap)
        x->ops->resize(x, cap);
}

void member_remove(member *x, uint64_t key)
{
    if (!x->dead)
        x->ops->remove(x, key ? key : 1);
}

int member_check(const member *x, char *why, size_t whylen)
{
    if (x->dead)
        return MEMOS_OK;
    if (x->cap != XUNLIMITED && x->resident > x->cap)
        XFAIL("policy: member %s holds %zu over its capacity %zu", x->ops->name, x->resident, x->cap);
    return x->ops->check(x, why, whylen);
}

uint64_t member_bytes(const member *x)
{
    uint64_t b = (uint64_t)x->nalloc * sizeof(xnode) + (x->tab ? (x->tmask + 1) * sizeof *x->tab : 0) +
                 (uint64_t)x->bkalloc * sizeof(xbucket) + 4 * (uint64_t)x->skw;
    if (x->pol)
        b += sizeof *x->pol + (uint64_t)x->nchunks * HYB_CHUNK * sizeof(hyb_node) +
             policy_ghost_bytes(x->pol);
    return b;
}

/* Every table entry found from its key; resident(x, i) says which count. */
int xtable_check(const member *x, int (*resident)(const member *, uint32_t), char *why, size_t whylen)
{
    size_t res = 0;
    for (size_t s = 0; x->tab && s <= x->tmask; s++) {
        uint32_t i = x->tab[s];
        if (!i)
            continue;
        if (i >= x->nalloc || xfind(x, x->n[i].key) != i)
            XFAIL("policy: member %s: table entry %zu is wrong", x->ops->name, s);
        res += resident ? (size_t)resident(x, i) : 1;
    }
    if (res != x->resident)
        XFAIL("policy: member %s holds %zu, counts %zu", x->ops->name, res, x->resident);
    return MEMOS_OK;
}

/* ---- the shared store ---- */

static uint32_t xalloc(member *x, uint64_t key)
{
    if (x->freel == XNIL) {
        uint32_t n = x->nalloc ? x->nalloc * 2 : 64;
        if (n < x->nalloc || n > UINT32_MAX / 2) {
            x->dead = 1;
            return XNIL;
        }
        xnode *a = realloc(x->n, (size_t)n * sizeof *a);
        if (!a) {
            x->dead = 1;
            return XNIL;
        }
        memset(a + x->nalloc, 0, (size_t)(n - x->nalloc) * sizeof *a);
        for (uint32_t i = n - 1; i >= (x->nalloc ? x->nalloc : 1); i--) {
            a[i].next = x->freel;
            x->freel = i;
        }
        x->n = a;
        x->nalloc = n;
    }
    uint32_t i = x->freel;
    x->freel = x->n[i].next;
    memset(&x->n[i], 0, sizeof x->n[i]);
    x->n[i].key = key;
    return i;
}

static size_t xslot(const member *x, uint64_t key)
{
    size_t i = member_mix64(key) & x->tmask;
    while (x->tab[i] && x->n[x->tab[i]].key != key)
        i = (i + 1) & x->tmask;
    return i;
}

uint32_t xfind(const member *x, uint64_t key)
{
    return x->tab ? x->tab[xslot(x, key)] : XNIL;
}

static int xtab_grow(member *x)
{
    size_t n = x->tab ? (x->tmask + 1) * 2 : 256;
    uint32_t *t = calloc(n, sizeof *t);
    if (!t) {
        x->dead = 1;
        return MEMOS_ENOMEM;
    }
    uint32_t *old = x->tab;
    size_t oldn = old ? x->tmask + 1 : 0;
    x->tab = t;
    x->tmask = n - 1;
    for (size_t i = 0; i < oldn; i++)
        if (old[i])
            x->tab[xslot(x, x->n[old[i]].key)] = old[i];
    free(old);
    return MEMOS_OK;
}

/* A new node for key (not in the table), entered in the table. */
uint32_t xnew(member *x, uint64_t key)
{
    if ((x->tused + 1) * 2 > (x->tab ? x->tmask + 1 : 0) && xtab_grow(x) != MEMOS_OK)
        return XNIL;
    uint32_t i = xalloc(x, key);
    if (i == XNIL)
        return XNIL;
    x->tab[xslot(x, key)] = i;
    x->tused++;
    return i;
}

/* Out of the table (backward-shift deletion) and back to the free list. */
void xfree_node(member *x, uint32_t i)
{
    size_t s = xslot(x, x->n[i].key);
    x->tab[s] = XNIL;
    x->tused--;
    for (size_t j = (s + 1) & x->tmask; x->tab[j]; j = (j + 1) & x->tmask) {
        size_t home = member_mix64(x->n[x->tab[j]].key) & x->tmask;
        if (((j - home) & x->tmask) >= ((j - s) & x->tmask)) {
            x->tab[s] = x->tab[j];
            x->tab[j] = XNIL;
            s = j;
        }
    }
    x->n[i].next = x->freel;
    x->n[i].la = x->n[i].lb = 0;
    x->freel = i;
}

void xpush(member *x, uint8_t id, uint32_t i)          /* list A, at the head */
{
    xlist *l = &x->l[id];
    xnode *n = &x->n[i];
    n->la = id;
    n->prev = XNIL;
    n->next = l->head;
    if (l->head)
        x->n[l->head].prev = i;
    else
        l->tail = i;
    l->head = i;
    l->len++;
}

void xunlink(member *x, uint32_t i)                    /* off its list A */
{
    xnode *n = &x->n[i];
    xlist *l = &x->l[n->la];
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
}

void xpush2(member *x, uint8_t id, uint32_t i)         /* list B, at the head */
{
    xlist *l = &x->l[id];
    xnode *n = &x->n[i];
    n->lb = id;
    n->prev2 = XNIL;
    n->next2 = l->head;
    if (l->head)
        x->n[l->head].prev2 = i;
    else
        l->tail = i;
    l->head = i;
    l->len++;
}

void xunlink2(member *x, uint32_t i)                   /* off its list B */
{
    xnode *n = &x->n[i];
    xlist *l = &x->l[n->lb];
    if (n->prev2)
        x->n[n->prev2].next2 = n->next2;
    else
        l->head = n->next2;
    if (n->next2)
        x->n[n->next2].prev2 = n->prev2;
    else
        l->tail = n->prev2;
    l->len--;
    n->lb = 0;
    n->prev2 = n->next2 = XNIL;
}


void xfront(member *x, uint32_t i)                     /* to the head of its list A */
{
    uint8_t id = x->n[i].la;
    xunlink(x, i);
    xpush(x, id, i);
}
