/*
 * shadow.h — policies judged beside the live cache, from the state the live
 * cache already keeps for each key: its last access (policy_node.stamp, the
 * ghost's stamp) and a few class bits (policy_node.mcls, the ghost's).  See
 * shadow.c.
 *
 * Not thread-safe: the owner's lock (the cache lock) guards every call.
 */
#ifndef MEMOS_POLICY_SHADOW_H
#define MEMOS_POLICY_SHADOW_H

#include <stddef.h>
#include <stdint.h>

#define TC_NB 1024u                     /* buckets of a count (a power of two) */
#define TC_BOUNDS 2u                    /* sets a count may judge at once */

/* One set over a count: the keys of the newest buckets, bucket lo in part. */
typedef struct tbound {
    uint64_t lo;                        /* oldest bucket (partly) in */
    double   lo_in;                     /* keys of bucket lo still in */
    int64_t  above;                     /* keys in buckets (lo, hi] */
    int64_t  lim;                       /* keys buckets (lo, hi] may hold: floor(cap - lo_in) */
    double   cap;                       /* keys the set holds */
} tbound;

/* Keys of one class counted by the bucket of their stamp (stamp >> ws),
 * and up to TC_BOUNDS sets of the newest of them (of other capacities). */
typedef struct tcount {
    uint32_t *cnt;                      /* keys whose stamp is in bucket b, at b % TC_NB (shadow.cnt) */
    uint64_t hi;                        /* newest bucket */
    unsigned ws;                        /* a bucket: 2^ws accesses */
    unsigned nb;                        /* sets judged */
    int      started;                   /* a key came */
    tbound   b[TC_BOUNDS];              /* the sets, b[0] the smallest */
} tcount;

enum { SHADOW_LRU = 0, SHADOW_LIRS = 1, SHADOW_ARC = 2, SHADOWS = 3 };

/* The shadow policies: LRU, LIRS as the hybrid's setting 7 runs it, ARC. */
typedef struct shadow {
    tcount   lru;                       /* LRU: every key by its last access */
    tcount   lir;                       /* LIRS: the LIR set by last access */
    tcount   arc_r;                     /* ARC: keys seen once, T1 (b[0], p) within L1 (b[1], size) */
    tcount   arc_f;                     /* ARC: keys seen again, T2 (b[0], size - p) within L2 (b[1]) */
    double   p;                         /* ARC: T1's target */
    uint64_t now;                       /* accesses so far (64-bit) */
    uint32_t now32;                     /* the same as the policy's clock counts it */
    double   cap;                       /* the size judged (0: not known yet) */
    double   hir;                       /* LIRS: resident HIR blocks */
    double   hits[SHADOWS];             /* judged hits so far */
    uint32_t cnt[4][TC_NB];             /* the four counts' buckets (apart: the counts' fields share
                                           a few cache lines) */
} shadow;

#define SHADOW_LIR   1u                 /* class bit: in the LIRS shadow's LIR set (its ghost lives
                                           longer: hybrid.h HYB_CLS_KEEP) */
#define SHADOW_ARC_F 2u                 /* class bit: ARC's T2/B2 (seen again), else T1/B1 */

void   shadow_init(shadow *s, uint32_t tick);
void   shadow_resize(shadow *s, double cap, double hir);
/* An access at clock `tick`; known: the key was seen (resident, or a ghost)
 * at `stamp` with class bits *cls (updated).  Adds each shadow's hit (0..1)
 * to s->hits. */
void   shadow_access(shadow *s, uint32_t tick, int known, uint32_t stamp, uint8_t *cls);
/* A key of the LIR class last seen at `stamp`: still in the LIR set? */
int    shadow_in_lir(const shadow *s, uint32_t stamp);
/* A key that was seen at `stamp` leaves every shadow (deleted, not evicted). */
void   shadow_forget(shadow *s, uint32_t stamp, uint8_t cls);
int    shadow_check(const shadow *s, char *why, size_t whylen);

#endif /* MEMOS_POLICY_SHADOW_H */
