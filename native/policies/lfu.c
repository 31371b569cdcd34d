/*
 * lfu.c — "lfu": POLICY_LEVELS lists through fprev/fnext; a node sits in
 * level = bit length of its touch count (capped).  Victims: the rarest
 * level first, its oldest first.  O(1) a call, a victim O(skipped).
 */
#include <stdio.h>

#include "lists.h"

static unsigned level_of(uint32_t freq)
{
    unsigned l = freq ? 32u - (unsigned)__builtin_clz(freq) : 0;
    return l < POLICY_LEVELS ? l : POLICY_LEVELS - 1;
}

static int lfu_start(policy *p)
{
    for (unsigned i = 0; i < POLICY_LEVELS; i++)
        flist_init(&p->lvl[i]);
    for (policy_node *n = p->head.prev; n != &p->head; n = n->prev) {
        n->level = (uint8_t)level_of(n->freq);
        flink_after(&p->lvl[n->level], n);
    }
    return MEMOS_OK;
}

static void lfu_stop(policy *p) {}      /* (the level links are left: a start relinks them) */

static void lfu_access(policy *p, policy_node *n, int hit)
{
    if (hit)
        funlink(n);
    n->level = (uint8_t)level_of(n->freq);
    flink_after(&p->lvl[n->level], n);
}

static size_t lfu_evict(policy *p, policy_node **out, size_t n)
{
    size_t got = 0;
    for (unsigned l = 0; l < POLICY_LEVELS && got < n; l++)
        for (policy_node *x = p->lvl[l].fprev; x != &p->lvl[l] && got < n; x = x->fprev)
            if (policy_ok(p, x))
                out[got++] = x;
    return got;
}

static void lfu_remove(policy *p, policy_node *n, int evicted) { funlink(n); }
static void lfu_resize(policy *p, uint64_t full) {}

static int lfu_check(const policy *p, char *why, size_t whylen)
{
    uint64_t m = 0;
    for (unsigned l = 0; l < POLICY_LEVELS; l++)
        for (const policy_node *x = p->lvl[l].fnext; x != &p->lvl[l]; x = x->fnext) {
            if (x->level != l || level_of(x->freq) != l || x->fnext->fprev != x)
                PFAIL("policy: node on wrong lfu level %u", l);
            if (++m > p->count)
                break;
        }
    if (m != p->count)
        PFAIL("policy: lfu levels hold %llu, count says %llu",
              (unsigned long long)m, (unsigned long long)p->count);
    return MEMOS_OK;
}

static policy_node *lfu_list(policy *p, unsigned i) { return &p->lvl[i]; }

static int lfu_place(policy *p, policy_node *n, unsigned i)
{
    if (i != level_of(n->freq))
        return MEMOS_EINVAL;
    n->level = (uint8_t)i;
    flink_after(p->lvl[i].fprev, n);
    return MEMOS_OK;
}

const policy_ops policy_lfu_ops = {
    .name = "lfu", .lists = POLICY_LEVELS, .start = lfu_start, .stop = lfu_stop,
    .access = lfu_access, .evict = lfu_evict, .remove = lfu_remove, .resize = lfu_resize,
    .check = lfu_check, .list = lfu_list, .place = lfu_place,
};
