/*
 * prefetch.h — the prefetcher's tables: a per-session stride detector and a
 * heat table of recently hot slots.  See prefetch.c.
 *
 * One pf_table is an object of its own (no global state, not part of the
 * cache).  Thread-safety: every pf_* function but pf_new/pf_free takes the
 * table's own mutex, so callers need no lock of theirs; pf_free must not race
 * with any other call.
 *
 * Stride detector.  Per session (a 64-bit id, e.g. a hash of "agent/session"),
 * the detector sees the indices of the slots read in that session, in order
 * (an index is the slot's position in the session's natural order).  The
 * delta between two consecutive reads is a candidate stride; when the same
 * non-zero delta comes `confirm` times in a row, it becomes the session's
 * confirmed stride (negative strides too: reading backwards).  A confirmed
 * stride survives isolated jumps (a new turn starting elsewhere) and is
 * cleared after 2 * confirm deltas in a row that differ from it, unless
 * another stride was confirmed meanwhile.  A re-read of the same index
 * (delta 0) changes nothing.  Sessions are bounded: when the table is full,
 * the least recently observed session is forgotten.
 *
 * Heat table.  Per slot (a 64-bit id, e.g. a hash of the key), a heat that
 * grows by `weight` on each touch and halves every `halflife` touches of the
 * whole table (exponential decay on a logical clock; stored pre-scaled, so a
 * touch is O(1)).  Bounded: when full, a touch of a new id evicts the coldest
 * entry (an exact scan of a dense array).  pf_heat_top returns the k hottest;
 * pf_heat_sample draws k distinct ids, with probability proportional to heat,
 * among the `pool` hottest.
 */
#ifndef MEMOS_PREFETCH_H
#define MEMOS_PREFETCH_H

#include <stddef.h>
#include <stdint.h>

#include "memos.h"

typedef struct pf_table pf_table;

typedef struct pf_config {
    uint32_t sessions;       /* stride detector entries (sessions tracked), 1..2^24 */
    uint32_t heat_capacity;  /* heat table entries, 1..2^24 */
    uint32_t confirm;        /* equal deltas in a row that confirm a stride, 1..64 */
    double   halflife;       /* heat half-life in touches, > 0 */
} pf_config;

/* Defaults: 4096 sessions, 4096 heat entries, confirm 2, half-life 1024. */
void pf_config_default(pf_config *cfg);

typedef struct pf_stride_info {
    int64_t  last_index;     /* the index observed last */
    int64_t  candidate;      /* the last non-zero delta (0 = none yet) */
    uint32_t run;            /* how many times in a row `candidate` came */
    uint32_t misses;         /* deltas in a row that differed from `stride` */
    int64_t  stride;         /* the confirmed stride, 0 = none */
    uint64_t observations;   /* indices observed in this session */
} pf_stride_info;

typedef struct pf_heat_item {
    uint64_t id;
    double   heat;           /* the decayed heat now */
} pf_heat_item;

typedef struct pf_stats {
    uint64_t sessions;           /* sessions tracked now */
    uint64_t sessions_evicted;   /* sessions forgotten to make room */
    uint64_t observations;       /* pf_stride_observe calls */
    uint64_t confirmations;      /* times a stride became confirmed (a new value) */
    uint64_t heat_entries;       /* ids in the heat table now */
    uint64_t heat_evicted;       /* ids evicted to make room */
    uint64_t heat_touches;       /* pf_heat_touch calls (the decay clock) */
} pf_stats;

/* A new table, or NULL with errno set (EINVAL: a config value out of range,
 * ENOMEM).  cfg NULL = defaults. */
pf_table *pf_new(const pf_config *cfg);
void      pf_free(pf_table *p);

/* ---- stride detector ---- */

/* Observe a read of `index` in `session`; returns the session's confirmed
 * stride after this observation (0 = none).  `info` (may be NULL) receives the
 * session's state after it. */
int64_t pf_stride_observe(pf_table *p, uint64_t session, int64_t index, pf_stride_info *info);
/* The session's state: MEMOS_OK, or MEMOS_ENOENT if it is not tracked. */
int     pf_stride_get(pf_table *p, uint64_t session, pf_stride_info *info);
/* Forget a session: MEMOS_OK or MEMOS_ENOENT. */
int     pf_stride_forget(pf_table *p, uint64_t session);

/* ---- heat table ---- */

/* Add `weight` (> 0, finite) to id's heat.  Returns 1 and sets *evicted (may
 * be NULL) if another id was evicted to make room, 0 if not, MEMOS_EINVAL for
 * a bad weight. */
int    pf_heat_touch(pf_table *p, uint64_t id, double weight, uint64_t *evicted);
/* The decayed heat of id now; 0 if absent. */
double pf_heat_get(pf_table *p, uint64_t id);
/* Remove id: MEMOS_OK or MEMOS_ENOENT. */
int    pf_heat_remove(pf_table *p, uint64_t id);
/* The min(k, entries) hottest, hottest first (ties: smaller id first);
 * returns how many were written to out[]. */
size_t pf_heat_top(pf_table *p, pf_heat_item *out, size_t k);
/* Draw min(k, pool, entries) distinct ids among the `pool` hottest, each draw
 * with probability proportional to heat among those left; *rng is the state
 * of a xorshift64* generator (any non-zero seed; 0 is replaced).  Returns
 * how many were written to out[]. */
size_t pf_heat_sample(pf_table *p, uint64_t *out, size_t k, size_t pool, uint64_t *rng);

void pf_get_stats(pf_table *p, pf_stats *out);

/* Check the internal invariants (map <-> dense arrays); MEMOS_OK or
 * MEMOS_EINVAL with a reason in why. For tests. */
int pf_check(pf_table *p, char *why, size_t whylen);

#endif /* MEMOS_PREFETCH_H */
