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

/* Embedded in every live entry: 48 bytes on x86-64. */
typedef struct policy_node {
    struct policy_node *prev, *next;    /* recency list, MRU at head.next (cache lock) */
    struct policy_node *fprev, *fnext;  /* lfu: level list; lru_lfu: segment list, MRU first (cache lock) */
    uint64_t hash;                      /* key hash, recorded in a ghost on eviction (cache lock) */
    uint32_t freq;                      /* touches since admit, saturating (cache lock) */
    uint8_t  level;                     /* lfu: level the node is linked in (cache lock) */
    uint8_t  linked;                    /* 1 while admitted (cache lock) */
    uint8_t  seg;                       /* lru_lfu: POLICY_PROBATION or POLICY_PROTECTED (cache lock) */
    uint8_t  ref;                       /* lru_lfu: aging frequency 0..3, +1 a hit, -1 a clock pass (cache lock) */
} policy_node;

enum policy_kind { POLICY_LRU = 0, POLICY_LFU = 1, POLICY_LRU_LFU = 2 };
enum { POLICY_PROBATION = 0, POLICY_PROTECTED = 1 };

/* Returns 1 if the node may be a victim now (not pinned, not evicting...). */
typedef int (*policy_evictable_fn)(const policy_node *n, void *ctx);

/* Ghosts: key hashes of evicted entries, in two FIFO rings (0: evicted from
 * probation, 1: from protected), found through one open-addressing table. */
typedef struct ghost_ring {
    uint64_t *hash;                     /* ring of hashes, oldest at tail (malloc) */
    uint64_t *seq;                      /* ring: sequence number of each insertion (malloc) */
    size_t    cap, len, tail;           /* allocated, used, index of the oldest */
    size_t    live;                     /* slots still in the table (not stale) */
    uint64_t  next_seq;                 /* insertions so far (the ring's clock) */
} ghost_ring;

typedef struct ghost_slot {
    uint64_t hash;                      /* 0 = empty */
    uint64_t seq;                       /* (insertion seq << 1) | ring */
} ghost_slot;

/* lru_lfu's settings of its own two-segment hybrid (policy.c: HYBRIDS), run
 * as members of the bank and by the simulation name "lru_lfu@i". */
typedef struct policy_expert {
    double  pfrac;                      /* probation target share, fixed; < 0: adaptive (ghost rule) */
    uint8_t lru;                        /* 1: victims in recency order (plain LRU) */
    uint8_t gadmit;                     /* ghost hit -> protected: 0 never, 1 always, 2 while protected has room, 3 or in place of a cold one */
} policy_expert;

#define POLICY_EXPERTS 6                /* hybrid settings "lru_lfu@0..5" (policy.c: HYBRIDS) */
#define POLICY_BANK_MAX 12              /* members of lru_lfu's bank (policy.c: BANK) */
#define POLICY_BANK_VERSION 2           /* lru_lfu's dump format (1: the segments-and-ghosts one) */

struct policy_bank;                     /* policy.c: the published policies lru_lfu follows */

typedef struct policy_stats {
    uint64_t ghost_hits_recency;        /* admits found in the probation ghost */
    uint64_t ghost_hits_frequency;      /* admits found in the protected ghost */
    uint64_t ghost_entries;             /* hashes in both ghosts */
    uint64_t probation;                 /* nodes in probation (lru_lfu@i); lru_lfu: outsiders */
    uint64_t protected_;                /* nodes in protected (lru_lfu@i) */
    double   recency;                   /* probation target / nodes, 0..1 (lru 1, lfu 0) */
    uint32_t expert;                    /* lru_lfu: the bank member followed (index in BANK) */
    uint32_t shadow_shift;              /* (always 0: the bank sees every key) */
    uint64_t expert_switches;           /* lru_lfu: times the member followed changed */
    uint64_t shadow_bytes;              /* lru_lfu: memory of the bank (every member, the map) */
    uint32_t bank_n;                    /* lru_lfu: members */
    uint64_t bank_hits[POLICY_BANK_MAX];/* lru_lfu: each member's hits since the bank started */
    uint64_t bank_accesses;             /* lru_lfu: accesses the bank has seen */
} policy_stats;

typedef struct policy {
    char             name[16];          /* "lru_lfu", "lru" or "lfu" */
    enum policy_kind kind;              /* which victim order */
    policy_node      head;              /* recency sentinel */
    policy_node      lvl[POLICY_LEVELS];/* lfu: level sentinels */
    policy_node      seg[2];            /* lru_lfu: probation (FIFO) and protected (LRU + clock) */
    uint64_t         nseg[2];           /* nodes in each segment */
    uint64_t         count;             /* nodes admitted */
    double           pfrac;             /* lru_lfu: probation target, share of count */
    ghost_ring       ring[2];           /* lru_lfu: ghost FIFOs */
    ghost_slot      *gtab;              /* ghost table, gmask + 1 slots (malloc) */
    size_t           gmask, gused;      /* table size - 1, slots used */
    uint64_t         ghits[2];          /* ghost hits per ring */
    int              oom;               /* a ghost allocation failed: ghosts stay as they are */
    policy_evictable_fn evictable;      /* victim filter, may be NULL */
    void            *ctx;               /* argument of evictable */
    policy_expert    mode;              /* lru_lfu@i: the hybrid setting */
    unsigned         expert;            /* lru_lfu@i: its index in HYBRIDS; lru_lfu: the member followed */
    uint64_t         switches;          /* lru_lfu: changes of the member followed */
    struct policy_bank *bank;           /* lru_lfu: the members (malloc, lazily; policy.c) */
    int              fixed;             /* 1: a hybrid setting alone (lru_lfu@i), no bank */
    uint64_t         full;              /* lru_lfu: count when victims were last asked for (the cache full) */
    uint64_t         batch;             /* lru_lfu: victims last asked for at once */
    unsigned         restore_leader;    /* lru_lfu: the member a restore asked for (+1; 0: none) */
} policy;

int    policy_init(policy *p, const char *name, policy_evictable_fn fn, void *ctx); /* MEMOS_OK, MEMOS_EINVAL */
void   policy_destroy(policy *p);                    /* frees the ghosts */
int    policy_select(policy *p, const char *name);   /* MEMOS_OK, MEMOS_EINVAL */
void   policy_admit(policy *p, policy_node *n, uint64_t hash);
void   policy_touch(policy *p, policy_node *n);
void   policy_remove(policy *p, policy_node *n);
void   policy_note_evict(policy *p, policy_node *n); /* before policy_remove of a victim */
void   policy_rekey(policy *p, policy_node *n, uint64_t hash);  /* the entry was renamed */
size_t policy_victims(policy *p, policy_node **out, size_t n);
void   policy_foreach(policy *p, void (*fn)(void *ctx, policy_node *n), void *ctx); /* MRU first */
uint64_t policy_count(const policy *p);
void   policy_get_stats(const policy *p, policy_stats *out);
int    policy_check(const policy *p, char *why, size_t whylen); /* MEMOS_OK, MEMOS_EINVAL */

/* lru_lfu only: run hybrid setting `i` of HYBRIDS for good, with no bank
 * (MEMOS_OK, MEMOS_EINVAL).  policy_simulate takes it as the name "lru_lfu@i". */
int    policy_fix_expert(policy *p, unsigned i);
/* The hybrid setting `i` (NULL past the last). */
const policy_expert *policy_expert_at(unsigned i);
/* The name of bank member `i` ("LRU", "ARC", ..., "lru_lfu@1"; NULL past the
 * last).  policy_simulate runs member i alone as "ref:NAME". */
const char *policy_bank_name(unsigned i);

/* Replay `n` keys through a cache of `capacity` unit-size blocks run by the
 * named policy (lookup; a miss inserts, evicting `batch` victims when full),
 * with the same policy_* calls the cache makes.  "ref:NAME" replays bank
 * member NAME alone (its own cache of `capacity` blocks, no policy_* calls).
 * Returns the hits, or -1 (MEMOS_EINVAL name / capacity 0, or no memory). */
long long policy_simulate(const char *name, const uint64_t *keys, size_t n,
                          size_t capacity, unsigned batch, policy_stats *st);

/* ---- state dump and restore (appended block) ----
 *
 * For a policy whose state outlives the process (the SSD tier's, persisted
 * beside order.json).  A dump is read through these calls; a restore runs on
 * a freshly initialised, empty policy of the same kind: every node with
 * policy_restore_node (MRU first), then each node placed on its second list
 * with policy_restore_place (front first), the ghost rings with
 * policy_restore_ghosts, then policy_restore_finish, which checks the whole
 * (MEMOS_EINVAL: the caller must throw the policy away and start afresh). */

unsigned policy_dump_lists(const policy *p);        /* second lists: lru 0, lfu POLICY_LEVELS, lru_lfu@i 2, lru_lfu 0 */
unsigned policy_dump_rings(const policy *p);        /* ghost rings: lru_lfu@i 2, else 0 */
unsigned policy_dump_bank(const policy *p);         /* lru_lfu: POLICY_BANK_VERSION, else 0 */
/* Nodes of list `list` (-1: recency, MRU first; else second list `list`,
 * front first) into out[0..max); returns how many the list holds. */
size_t   policy_dump_list(const policy *p, int list, policy_node **out, size_t max);
/* Ghost ring r, oldest slot first: hash and whether it is live (stale slots
 * are left by ghost hits), into [0..max); returns the ring's length; *clock
 * gets the ring's insertion count. */
size_t   policy_dump_ghosts(const policy *p, unsigned r, uint64_t *hash, uint8_t *live,
                            size_t max, uint64_t *clock);
unsigned policy_dump_expert(const policy *p);        /* lru_lfu: the setting in force */
int    policy_restore_expert(policy *p, unsigned i);  /* MEMOS_OK, MEMOS_EINVAL; shadows start anew */
double   policy_dump_balance(const policy *p, uint64_t ghits[2]);  /* pfrac; ghost hits */

void     policy_restore_node(policy *p, policy_node *n, uint64_t hash, uint32_t freq, uint8_t ref);
int      policy_restore_place(policy *p, policy_node *n, unsigned list);  /* MEMOS_OK, MEMOS_EINVAL */
int      policy_restore_ghosts(policy *p, unsigned r, const uint64_t *hash, const uint8_t *live,
                               size_t len, uint64_t clock);               /* MEMOS_OK, EINVAL, ENOMEM */
int      policy_restore_finish(policy *p, double pfrac, const uint64_t ghits[2],
                               char *why, size_t whylen);                 /* MEMOS_OK, MEMOS_EINVAL */

#endif /* MEMOS_POLICY_H */
