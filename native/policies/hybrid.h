/*
 * hybrid.h — the two-segment hybrid's calls that lru_lfu.c (the same hybrid
 * with a miniature simulation choosing its setting) and the front's dump
 * and restore use.  See hybrid.c.
 */
#ifndef MEMOS_POLICY_HYBRID_H
#define MEMOS_POLICY_HYBRID_H

#include "../policy.h"

int    hybrid_start(policy *p);
void   hybrid_stop(policy *p);
void   hybrid_access(policy *p, policy_node *n, int hit);
size_t hybrid_evict(policy *p, policy_node **out, size_t n);
void   hybrid_remove(policy *p, policy_node *n, int evicted);
int    hybrid_check(const policy *p, char *why, size_t whylen);
policy_node *hybrid_list(policy *p, unsigned i);
int    hybrid_place(policy *p, policy_node *n, unsigned i);
int    hybrid_setting(policy *p, unsigned i);       /* MEMOS_OK, MEMOS_EINVAL */
size_t hybrid_dump_ghosts(const policy *p, unsigned r, uint64_t *fp, uint8_t *live,
                          size_t max, uint64_t *clock);
int    hybrid_restore_ghosts(policy *p, unsigned r, const uint64_t *fp, const uint8_t *live,
                             size_t len, uint64_t clock);
int    hybrid_set_balance(policy *p, double pfrac);  /* MEMOS_OK, MEMOS_EINVAL out of range */

#endif /* MEMOS_POLICY_HYBRID_H */
