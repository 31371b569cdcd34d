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

/* Embedded in every live entry: 48 bytes on x86-64, whatever the policy. */
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

enum { POLICY_PROBATION = 0, POLICY_PROTECTED = 1 };

/* Returns 1 if the node may be a victim now (not pinned, not evicting...). */
typedef int (*policy_evictable_fn)(const policy_node *n, void *ctx);

/* Ghosts of the hybrid: 32-bit fingerprints (the key hash's high half) of
 * evicted entries in two FIFO rings (0: evicted from probation, 1: from
 * protected), found through one open-addressing table of ring positions. */
typedef struct ghost_ring {
    uint32_t *fp;                       /* ring of fingerprints, oldest at tail (malloc) */
    size_t    cap, len, tail;           /* allocated, used, index of the oldest */
    size_t    live;                     /* slots still in the table (not stale) */
    uint64_t  next_seq;                 /* insertions so far (the ring's clock) */
} ghost_ring;

/* A setting of lru_lfu's two-segment hybrid (hybrid.c: HYBRIDS), "lru_lfu@i". */
typedef struct policy_expert {
    double  pfrac;                      /* probation target share, fixed; < 0: adaptive (ghost rule) */
    uint8_t lru;                        /* 1: victims in recency order (plain LRU) */
    uint8_t gadmit;                     /* ghost hit -> protected: 0 never, 1 always, 2 while protected has room, 3 or in place of a cold one */
} policy_expert;

#define POLICY_EXPERTS 6                /* hybrid settings "lru_lfu@0..5" (hybrid.c: HYBRIDS) */
#define POLICY_SIM_N 4                  /* settings lru_lfu's miniature simulation runs (minisim.c) */
#define POLICY_STATE_VERSION 3          /* lru_lfu's dump format (2: the bank's; 0/1: before it) */

struct policy;
struct policy_minisim;                  /* lru_lfu.c: the miniature simulation */

typedef struct policy_stats {
    uint64_t ghost_hits_recency;        /* admits found in the probation ghost */
    uint64_t ghost_hits_frequency;      /* admits found in the protected ghost */
    uint64_t ghost_entries;             /* fingerprints in both ghosts */
    uint64_t probation;                 /* nodes in probation */
    uint64_t protected_;                /* nodes in protected */
    double   recency;                   /* probation target / nodes, 0..1 (lru 1, lfu 0) */
    uint32_t expert;                    /* the hybrid setting in force */
    uint64_t expert_switches;           /* lru_lfu: times the setting changed */
    uint64_t ghost_bytes;               /* memory of the ghosts (rings and table) */
    uint64_t sim_bytes;                 /* lru_lfu: memory of the miniature simulation */
    uint32_t sim_cap;                   /* lru_lfu: each simulated cache's capacity (0: not running) */
    double   sim_rate;                  /* lru_lfu: share of the keys sampled */
    uint64_t sim_sampled;               /* lru_lfu: sampled accesses so far */
    uint64_t sim_decisions;             /* lru_lfu: windows decided */
    uint32_t sim_settings[POLICY_SIM_N];/* lru_lfu: the settings simulated */
    uint64_t sim_hits[POLICY_SIM_N];    /* lru_lfu: each one's hits so far */
    char     decided[40];               /* what decided the victims (policy_decided) */
} policy_stats;

/* One policy: a table of functions, one file each (native/policies/).
 *   start   take over the nodes on the recency list (LRU first), making
 *           what the policy keeps beside them (MEMOS_OK, MEMOS_ENOMEM)
 *   stop    free it
 *   access  a node admitted (hit 0: already on the recency list's front)
 *           or touched (hit 1: moved to the front)
 *   evict   up to n evictable nodes, best victim first (not removed)
 *   remove  a node goes (evicted 1: policy_note_evict came first)
 *   resize  the cache's size in entries when full (asked for victims)
 *   check   the policy's own invariants (MEMOS_OK, MEMOS_EINVAL + why)
 *   list    second list i's sentinel (dump), place: restore a node onto it
 *   setting the hybrid setting i (NULL: the policy has none)
 *   stats, decided  what policy_get_stats and policy_decided add */
typedef struct policy_ops {
    const char *name;                   /* "lru", "lfu", "lru_lfu", "lru_lfu@i" */
    unsigned    lists, rings;           /* second lists and ghost rings a dump holds */
    unsigned    format;                 /* dump format (POLICY_STATE_VERSION; 0: none) */
    int    (*start)(struct policy *p);
    void   (*stop)(struct policy *p);
    void   (*access)(struct policy *p, policy_node *n, int hit);
    size_t (*evict)(struct policy *p, policy_node **out, size_t n);
    void   (*remove)(struct policy *p, policy_node *n, int evicted);
    void   (*resize)(struct policy *p, uint64_t full);
    int    (*check)(const struct policy *p, char *why, size_t whylen);
    policy_node *(*list)(struct policy *p, unsigned i);
    int    (*place)(struct policy *p, policy_node *n, unsigned i);
    int    (*setting)(struct policy *p, unsigned i);
    void   (*stats)(const struct policy *p, policy_stats *out);          /* may be NULL */
    const char *(*decided)(const struct policy *p, char *buf, size_t len); /* may be NULL */
} policy_ops;

extern const policy_ops policy_lru_ops, policy_lfu_ops, policy_lru_lfu_ops,
    policy_hybrid_ops[POLICY_EXPERTS];

typedef struct policy {
    char             name[16];          /* "lru_lfu", "lru", "lfu" or "lru_lfu@i" */
    const policy_ops *ops;              /* the policy in force */
    policy_node      head;              /* recency sentinel */
    uint64_t         count;             /* nodes admitted */
    policy_evictable_fn evictable;      /* victim filter, may be NULL */
    void            *ctx;               /* argument of evictable */
    uint64_t         full;              /* count when victims were last asked for (the cache full) */
    uint64_t         batch;             /* victims last asked for at once */
    const policy_node *evicting;        /* the node policy_note_evict was last told of */
    /* lfu */
    policy_node      lvl[POLICY_LEVELS];/* level sentinels */
    /* the hybrid (lru_lfu, lru_lfu@i) */
    policy_node      seg[2];            /* probation (FIFO) and protected (LRU + clock) */
    uint64_t         nseg[2];           /* nodes in each segment */
    double           pfrac;             /* probation target, share of count */
    ghost_ring       ring[2];           /* ghost FIFOs */
    uint32_t        *gtab;              /* ghost table, gmask + 1 slots (malloc): ring position + 1 */
    size_t           gmask, gused;      /* table size - 1, slots used */
    uint64_t         ghits[2];          /* ghost hits per ring */
    int              oom;               /* a ghost allocation failed: ghosts stay as they are */
    policy_expert    mode;              /* the setting in force */
    unsigned         expert;            /* its index in HYBRIDS */
    uint64_t         switches;          /* lru_lfu: changes of the setting */
    struct policy_minisim *sim;         /* lru_lfu: the miniature simulation (malloc) */
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

/* The hybrid setting `i` (NULL past the last). */
const policy_expert *policy_expert_at(unsigned i);
/* Bytes of the hybrid's ghosts (rings and table). */
uint64_t policy_ghost_bytes(const policy *p);
/* What decided the victims: "LRU", "LFU", "lru_lfu@i (fixed)", "lru_lfu@i
 * (start)" or "lru_lfu@i (simulated)" (a static string of its own, into buf). */
const char *policy_decided(const policy *p, char *buf, size_t len);

/* Replay `n` keys through a cache of `capacity` unit-size blocks run by the
 * named policy (lookup; a miss inserts, evicting `batch` victims when full),
 * with the same policy_* calls the cache makes ("lru_lfu@i": hybrid setting
 * i alone).  "ref:NAME" replays the simulated member NAME (policies/
 * member.h: "LRU", "ARC", ..., "lru_lfu@i") alone, no policy_* calls.
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

unsigned policy_dump_lists(const policy *p);        /* second lists: lru 0, lfu POLICY_LEVELS, lru_lfu 2 */
unsigned policy_dump_rings(const policy *p);        /* ghost rings: lru_lfu 2, else 0 */
unsigned policy_dump_format(const policy *p);       /* lru_lfu: POLICY_STATE_VERSION, else 0 */
/* Nodes of list `list` (-1: recency, MRU first; else second list `list`,
 * front first) into out[0..max); returns how many the list holds. */
size_t   policy_dump_list(const policy *p, int list, policy_node **out, size_t max);
/* Ghost ring r, oldest slot first: hash and whether it is live (stale slots
 * are left by ghost hits), into [0..max); returns the ring's length; *clock
 * gets the ring's insertion count. */
size_t   policy_dump_ghosts(const policy *p, unsigned r, uint64_t *hash, uint8_t *live,
                            size_t max, uint64_t *clock);
unsigned policy_dump_expert(const policy *p);        /* lru_lfu: the setting in force */
int    policy_restore_expert(policy *p, unsigned i);  /* MEMOS_OK, MEMOS_EINVAL; the simulation starts anew */
double   policy_dump_balance(const policy *p, uint64_t ghits[2]);  /* pfrac; ghost hits */

void     policy_restore_node(policy *p, policy_node *n, uint64_t hash, uint32_t freq, uint8_t ref);
int      policy_restore_place(policy *p, policy_node *n, unsigned list);  /* MEMOS_OK, MEMOS_EINVAL */
int      policy_restore_ghosts(policy *p, unsigned r, const uint64_t *hash, const uint8_t *live,
                               size_t len, uint64_t clock);               /* MEMOS_OK, EINVAL, ENOMEM */
int      policy_restore_finish(policy *p, double pfrac, const uint64_t ghits[2],
                               char *why, size_t whylen);                 /* MEMOS_OK, MEMOS_EINVAL */

#endif /* MEMOS_POLICY_H */
