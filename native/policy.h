/*
 * policy.h — the eviction policy: who goes first when the arena is full.
 * See policy.c.  Not thread-safe: the cache lock guards every call.
 */
#ifndef MEMOS_POLICY_H
#define MEMOS_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "memos.h"

#define POLICY_LEVELS 9   /* LFU frequency buckets: level = bit length of freq, capped */

typedef struct policy_node {
    struct policy_node *prev, *next;    /* recency list, MRU at head.next (cache lock) */
    struct policy_node *fprev, *fnext;  /* LFU level list, MRU first (cache lock) */
    uint32_t freq;                      /* touches since admit, saturating (cache lock) */
    uint8_t  level;                     /* LFU level the node is linked in (cache lock) */
    uint8_t  linked;                    /* 1 while admitted (cache lock) */
} policy_node;

enum policy_kind { POLICY_LRU = 0, POLICY_LFU = 1 };

/* Returns 1 if the node may be a victim now (not pinned, not evicting...). */
typedef int (*policy_evictable_fn)(const policy_node *n, void *ctx);

typedef struct policy {
    char             name[16];          /* "lru" or "lfu" */
    enum policy_kind kind;              /* which victim order */
    policy_node      head;              /* recency sentinel */
    policy_node      lvl[POLICY_LEVELS];/* LFU level sentinels */
    uint64_t         count;             /* nodes admitted */
    policy_evictable_fn evictable;      /* victim filter, may be NULL */
    void            *ctx;               /* argument of evictable */
} policy;

int    policy_init(policy *p, const char *name, policy_evictable_fn fn, void *ctx); /* MEMOS_OK, MEMOS_EINVAL */
int    policy_select(policy *p, const char *name);   /* MEMOS_OK, MEMOS_EINVAL */
void   policy_admit(policy *p, policy_node *n);
void   policy_touch(policy *p, policy_node *n);
void   policy_remove(policy *p, policy_node *n);
size_t policy_victims(policy *p, policy_node **out, size_t n);
void   policy_foreach(policy *p, void (*fn)(void *ctx, policy_node *n), void *ctx); /* MRU first */
uint64_t policy_count(const policy *p);
int    policy_check(const policy *p, char *why, size_t whylen); /* MEMOS_OK, MEMOS_EINVAL */

#endif /* MEMOS_POLICY_H */
