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

/* Embedded in every live entry: 56 bytes on x86-64, whatever the policy. */
typedef struct policy_node {
    struct policy_node *prev, *next;    /* recency list, MRU at head.next (cache lock) */
    struct policy_node *fprev, *fnext;  /* lfu: level list; lru_lfu: segment list, MRU first (cache lock) */
    uint64_t hash;                      /* key hash, recorded in a ghost on eviction (cache lock) */
    uint32_t freq;                      /* touches since admit, saturating (cache lock) */
    uint32_t stamp;                     /* lru_lfu: the policy's access clock at the last access (cache lock) */
    uint8_t  level;                     /* lfu: level the node is linked in (cache lock) */
    uint8_t  linked;                    /* 1 while admitted (cache lock) */
    uint8_t  seg;                       /* lru_lfu: POLICY_PROBATION or POLICY_PROTECTED (cache lock) */
    uint8_t  ref;                       /* lru_lfu: aging frequency 0..3, +1 a hit, -1 a clock pass (cache lock) */
    uint8_t  mcls;                      /* lru_lfu: the shadow policies' class bits (shadow.h) (cache lock) */
} policy_node;

enum { POLICY_PROBATION = 0, POLICY_PROTECTED = 1 };

/* Returns 1 if the node may be a victim now (not pinned, not evicting...). */
typedef int (*policy_evictable_fn)(const policy_node *n, void *ctx);

/* A ghost as a dump holds it (policy_dump_ghosts): an evicted key the
 * hybrid still remembers, in ring `seg` (0: evicted from probation, 1: from
 * protected). */
typedef struct policy_ghost {
    uint64_t fp;                        /* 32-bit fingerprint of the key hash */
    uint32_t stamp;                     /* the key's last access (the access clock, to its unit) */
    uint16_t age;                       /* epochs of its ring since it was evicted */
    uint8_t  cls;                       /* the shadow policies' class bits */
} policy_ghost;

/* A setting of lru_lfu's two-segment hybrid (hybrid.c: HYBRIDS), "lru_lfu@i". */
typedef struct policy_expert {
    double  pfrac;                      /* probation target share, fixed; < 0: adaptive (ghost rule) */
    uint8_t lru;                        /* 1: victims in recency order (plain LRU) */
    uint8_t gadmit;                     /* ghost hit -> protected: 0 never, 1 always, 2 while protected has room, 3 or in place of a cold one */
    uint8_t lirs;                       /* 1: protected is LIRS's LIR set (a key enters it if its last access is
                                           more recent than protected's oldest); 2: the same with the aging clock */
    uint8_t arc;                        /* 1: ARC: probation T1, protected T2 (no clock), its target p adapted
                                           by ghost hits within B1 and B2 */
} policy_expert;

#define POLICY_GHOST_PENDING 32        /* ghosts an eviction run leaves for the admits after it */
#define POLICY_EXPERTS 9                /* hybrid settings "lru_lfu@0..8" (hybrid.c: HYBRIDS) */
#define POLICY_SIM_N 3                  /* the policies lru_lfu's shadows judge (lru_lfu.c: CANDIDATES) */
#define POLICY_STATE_VERSION 4          /* lru_lfu's dump format (3: ghost rings of bare fingerprints; 2: the bank's) */

struct policy;
struct policy_chooser;                  /* lru_lfu.c: the shadows and the rule that follows them */

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
    uint64_t sim_bytes;                 /* lru_lfu: memory of the shadows and the rule (fixed) */
    uint32_t sim_cap;                   /* lru_lfu: the size the shadows judge (0: not known yet) */
    uint64_t sim_decisions;             /* lru_lfu: windows decided */
    uint64_t sim_accesses;              /* lru_lfu: accesses the shadows judged */
    uint32_t sim_settings[POLICY_SIM_N];/* lru_lfu: the setting each shadow stands for */
    double   sim_hits[POLICY_SIM_N];    /* lru_lfu: each shadow's hits so far (estimated) */
    uint64_t sim_time[POLICY_SIM_N];    /* lru_lfu: accesses served under each one's setting */
    uint64_t live_hits;                 /* lru_lfu: hits of the live cache as the rule counted them */
    char     decided[64];               /* what decided the victims (policy_decided) */
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
    double           arcp;              /* ARC setting: T1's target in entries (0..count) */
    uint64_t        *gtab;              /* ghost table: gbuckets buckets of 8 entries (malloc, 64-byte aligned) */
    uint64_t        *gsum;              /* a bucket's summary: bit fp % 64 of each entry's fp (after gtab) */
    size_t           gbuckets, gused;   /* buckets, entries in use */
    uint64_t         gfull;             /* the size the table was made for */
    uint64_t         gunit;             /* evictions of a ring per epoch (gfull / 8) */
    uint64_t         gev[2];            /* evictions into each ring since its last epoch */
    uint16_t         gepoch[2];         /* each ring's epoch (12 bits, wraps) */
    uint16_t         glimit[2][2];      /* epochs a ghost lives: [ring][class bit 0] */
    uint32_t         grecip[2][2];      /* 2^20 / glimit: how far through its life an epoch takes a ghost */
    uint64_t         gpmask;            /* bit fp % 64 of each pending ghost's fingerprint (0: none pending) */
    uint8_t          gshift;            /* a ghost's stamp is the access clock >> gshift */
    uint8_t          gpn, gph;          /* ghosts pending: how many, the oldest's index in gpend */
    uint64_t         gpend[POLICY_GHOST_PENDING]; /* the latest ghosts, entries as the table holds them,
                                           not yet in it: one goes in at each admit, its bucket
                                           fetched an admit before (an eviction run writes no
                                           line of the table; 0: used up) */
    uint32_t         tick;              /* the access clock: admits and touches so far (wraps) */
    uint64_t         ghits[2];          /* ghost hits per ring */
    int              lirfill;           /* lirs settings: new keys fill the LIR set (until it is first full) */
    int              oom;               /* a ghost allocation failed: ghosts stay as they are */
    policy_expert    mode;              /* the setting in force */
    unsigned         expert;            /* its index in HYBRIDS */
    uint64_t         switches;          /* lru_lfu: changes of the setting */
    struct policy_chooser *sim;         /* lru_lfu: the shadows and the rule (malloc) */
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
/* What decided the victims: "LRU", "LFU", "lru_lfu@i (fixed)", or lru_lfu's
 * rule: the setting in force and why (into buf). */
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
uint32_t policy_dump_tick(const policy *p);         /* the access clock */
uint64_t policy_dump_ghost_size(const policy *p);   /* the size the ghost table was made for (0: none) */
unsigned policy_dump_format(const policy *p);       /* lru_lfu: POLICY_STATE_VERSION, else 0 */
/* Nodes of list `list` (-1: recency, MRU first; else second list `list`,
 * front first) into out[0..max); returns how many the list holds. */
size_t   policy_dump_list(const policy *p, int list, policy_node **out, size_t max);
/* The ghosts of ring r (in table order) into out[0..max); returns how many
 * it holds; *epoch gets the ring's epoch. */
size_t   policy_dump_ghosts(const policy *p, unsigned r, policy_ghost *out, size_t max,
                            uint64_t *epoch);
unsigned policy_dump_expert(const policy *p);        /* lru_lfu: the setting in force */
int    policy_restore_expert(policy *p, unsigned i);  /* MEMOS_OK, MEMOS_EINVAL; lru_lfu's shadows start anew */
double   policy_dump_balance(const policy *p, uint64_t ghits[2]);  /* pfrac; ghost hits */

void     policy_restore_node(policy *p, policy_node *n, uint64_t hash, uint32_t freq, uint8_t ref);
void     policy_restore_stamp(policy *p, policy_node *n, uint32_t stamp, uint8_t cls, uint32_t tick);
int      policy_restore_place(policy *p, policy_node *n, unsigned list);  /* MEMOS_OK, MEMOS_EINVAL */
/* Before the ghosts: the ghost table made for `size` (policy_dump_ghost_size). */
int      policy_restore_ghost_size(policy *p, uint64_t size);         /* MEMOS_OK, EINVAL, ENOMEM */
int      policy_restore_ghosts(policy *p, unsigned r, const policy_ghost *g, size_t len,
                               uint64_t epoch);                           /* MEMOS_OK, EINVAL, ENOMEM */
int      policy_restore_finish(policy *p, double pfrac, const uint64_t ghits[2],
                               char *why, size_t whylen);                 /* MEMOS_OK, MEMOS_EINVAL */

#endif /* MEMOS_POLICY_H */
