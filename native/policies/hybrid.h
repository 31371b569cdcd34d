/*
 * hybrid.h — the two-segment hybrid's calls that lru_lfu.c (the same hybrid
 * with shadows choosing its setting) and the front's dump and restore use.
 * See hybrid.c.
 */
#ifndef MEMOS_POLICY_HYBRID_H
#define MEMOS_POLICY_HYBRID_H

#include "../policy.h"

/* What the ghost table knows of a key being admitted (hybrid_lookup). */
typedef struct hyb_ghost {
    long     slot;                  /* its entry, or -1: not a ghost */
    uint32_t stamp;                 /* its last access (the access clock, to the ghosts' unit) */
    unsigned seg;                   /* the ring: 0 evicted from probation, 1 from protected */
    unsigned age;                   /* epochs of its ring since (an epoch: an eighth of the size) */
    unsigned cls;                   /* the shadows' class bits it left with */
    int      fresh;                 /* within its ring's life (older: a class-bit-0 ghost kept longer) */
} hyb_ghost;

#define HYB_CLS_KEEP 1u                 /* class bit 0: the ghost lives longer (G_KEEP times) */

int    hybrid_start(policy *p);
void   hybrid_stop(policy *p);
void   hybrid_access(policy *p, policy_node *n, int hit);
void   hybrid_prefetch(const policy *p, uint64_t hash);            /* before a lookup */
void   hybrid_lookup(const policy *p, uint64_t hash, hyb_ghost *g);
void   hybrid_admit(policy *p, policy_node *n, const hyb_ghost *g);  /* then the node is stamped */
void   hybrid_touch(policy *p, policy_node *n);                      /* likewise */
size_t hybrid_evict(policy *p, policy_node **out, size_t n);
void   hybrid_remove(policy *p, policy_node *n, int evicted);
void   hybrid_resize(policy *p, uint64_t full);
int    hybrid_check(const policy *p, char *why, size_t whylen);
policy_node *hybrid_list(policy *p, unsigned i);
int    hybrid_place(policy *p, policy_node *n, unsigned i);
int    hybrid_setting(policy *p, unsigned i);       /* MEMOS_OK, MEMOS_EINVAL */
size_t hybrid_dump_ghosts(const policy *p, unsigned r, policy_ghost *out, size_t max, uint64_t *epoch);
int    hybrid_restore_ghosts(policy *p, unsigned r, const policy_ghost *g, size_t len, uint64_t epoch);
int    hybrid_set_balance(policy *p, double pfrac);  /* MEMOS_OK, MEMOS_EINVAL out of range */
uint32_t hybrid_ghost_unit(const policy *p);         /* accesses per unit of a ghost's stamp */

/* The access clock: a stamp at or after another (wraps). */
static inline int stamp_ge(uint32_t a, uint32_t b) { return (int32_t)(a - b) >= 0; }

#endif /* MEMOS_POLICY_HYBRID_H */
