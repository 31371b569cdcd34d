/*
 * member.h — a simulated policy: one published policy (or one setting of
 * lru_lfu's hybrid) run over unit-size blocks named by 64-bit key hashes,
 * with its own capacity, its own table, lists and ghosts.  Used by
 * policy_simulate ("ref:NAME", bench policy's peers and the tests'
 * reference replays).
 *
 * Every member is reached through one table of functions (member_ops), one
 * file each: m_lru.c, m_lfu.c, arc.c, twoq.c, s3fifo.c, sieve.c, lirs.c,
 * wtinylfu.c, m_hybrid.c.  The node store, the table and the lists they
 * share are in member.c.  Each is the policy as its paper describes it, the
 * same, step for step, as memosfs/testing/refpolicies.py (tests/
 * test_policy_ref.py replays both and asks for equal hits).
 *
 * Nodes live in one growable array per member and link by index (0 is no
 * node); a node is on at most two lists at once (A: prev/next; B:
 * prev2/next2), which list its la/lb says.  Lists run newest (head) to
 * oldest (tail).
 *
 * Not thread-safe: the owner's lock (the cache lock) guards every call.
 */
#ifndef MEMOS_POLICY_MEMBER_H
#define MEMOS_POLICY_MEMBER_H

#include <stddef.h>
#include <stdint.h>

#include "../policy.h"

#define XNIL 0u
#define XLISTS 8
#define XUNLIMITED SIZE_MAX       /* a capacity not known yet */
#define HYB_CHUNK 512u
enum { XLIR = 1, XHIR = 2, XNONRES = 3 };

typedef struct xnode {
    uint64_t key;                 /* key hash (never 0) */
    uint32_t prev, next;          /* list A: towards the head / the tail (node index) */
    uint32_t prev2, next2;        /* list B (LFU: the node's bucket in prev2) */
    uint32_t cnt;                 /* LFU count, S3-FIFO frequency, SIEVE visited bit */
    uint8_t  la, lb;              /* list A / B the node is on (0: none) */
    uint8_t  st;                  /* LIRS: XLIR, XHIR or XNONRES */
    uint8_t  pad;
} xnode;

typedef struct xlist { uint32_t head, tail; size_t len; } xlist;  /* node indexes; nodes */

typedef struct xbucket {          /* LFU: the nodes of one count, newest first */
    uint64_t count;               /* the count */
    uint32_t prev, next;          /* bucket list, ascending counts (0: none) */
    xlist    l;                   /* its nodes */
} xbucket;

typedef struct hyb_node {         /* a key of a hybrid member: its policy links */
    policy_node pn;               /* first */
    uint32_t    idx;              /* its xnode (the table's entry) */
} hyb_node;

struct member_ops;

typedef struct member {
    const struct member_ops *ops; /* what it is */
    uint8_t  hyb;                 /* m_hybrid: the setting (policy_expert_at index) */
    size_t   cap;                 /* resident capacity in blocks (XUNLIMITED) */
    size_t   resident;            /* blocks held */
    int      dead;                /* an allocation failed: out of the running, hits nothing */
    xnode   *n;                   /* nodes (malloc) */
    uint32_t nalloc, freel;       /* array size, free list (through next) */
    uint32_t *tab;                /* node index, 0 empty; linear probing (malloc) */
    size_t   tmask, tused;        /* slots - 1, used */
    xlist    l[XLISTS];           /* the lists, by the member's own ids */
    double   p;                   /* ARC: target size of T1 */
    size_t   c1, c2, c3;          /* 2Q: kin, kout; S3-FIFO: small, main, ghost; LIRS: l_hirs, l_lirs;
                                     W-TinyLFU: window, main, protected */
    uint32_t hand;                /* SIEVE: next to look at (0: the tail) */
    size_t   nlir;                /* LIRS: LIR blocks */
    int      evicted;             /* S3-FIFO: an eviction happened (warm-up over) */
    xbucket *bk;                  /* LFU: buckets, 1-based (malloc) */
    uint32_t bkalloc, bkfree, bkfirst;
    uint8_t *sk;                  /* W-TinyLFU: 4 rows of `skw` 4-bit counters (a byte each) */
    size_t   skw;
    uint64_t adds, sample;        /* W-TinyLFU: additions since the last halving, its period */
    policy  *pol;                 /* m_hybrid: the live hybrid's code over hyb_nodes (malloc) */
    hyb_node **chunk;             /* HYB_CHUNK nodes each; index i: chunk[i / HYB_CHUNK][i % HYB_CHUNK] */
    uint32_t nchunks;
} member;

/* One simulated policy.  access: 1 on a hit; a miss inserts the key and
 * evicts down to the capacity.  evict: evict until at most `cap` blocks
 * are resident.  remove: drop a key (resident or ghost) with no ghost.
 * resize: a new capacity (evicting down to it).  check: the member's own
 * invariants (MEMOS_OK, MEMOS_EINVAL with why).  init and fini (may be
 * NULL) make and free what the kind needs beyond the shared store. */
typedef struct member_ops {
    const char *name;             /* "LRU", "ARC", ..., "lru_lfu@i" */
    int  (*init)(member *x);
    void (*fini)(member *x);
    int  (*access)(member *x, uint64_t key);
    void (*evict)(member *x, size_t cap);
    void (*remove)(member *x, uint64_t key);
    void (*resize)(member *x, size_t cap);
    int  (*check)(const member *x, char *why, size_t whylen);
} member_ops;

extern const member_ops member_lru_ops, member_lfu_ops, member_arc_ops, member_2q_ops,
    member_s3fifo_ops, member_sieve_ops, member_lirs_ops, member_wtinylfu_ops, member_hybrid_ops;

/* member.c: make one by name ("LRU", ..., "lru_lfu@i"; MEMOS_OK, MEMOS_EINVAL
 * unknown name, MEMOS_ENOMEM), or of hybrid setting i; free; and memory. */
int      member_init(member *x, const char *name, size_t cap);
int      member_init_hybrid(member *x, unsigned setting, size_t cap);
void     member_free(member *x);
int      member_access(member *x, uint64_t key);       /* a dead member hits nothing */
void     member_resize(member *x, size_t cap);
void     member_remove(member *x, uint64_t key);
int      member_check(const member *x, char *why, size_t whylen);
uint64_t member_bytes(const member *x);
uint64_t member_mix64(uint64_t x);

/* member.c: the shared store. */
uint32_t xfind(const member *x, uint64_t key);
uint32_t xnew(member *x, uint64_t key);               /* XNIL on no memory (x->dead) */
void     xfree_node(member *x, uint32_t i);
void     xpush(member *x, uint8_t id, uint32_t i);    /* list A, at the head */
void     xunlink(member *x, uint32_t i);              /* off its list A */
void     xpush2(member *x, uint8_t id, uint32_t i);   /* list B, at the head */
void     xunlink2(member *x, uint32_t i);             /* off its list B */
void     xfront(member *x, uint32_t i);               /* to the head of its list A */
int      xtable_check(const member *x, int (*resident)(const member *, uint32_t),
                      char *why, size_t whylen);
static inline uint64_t xkey(const member *x, uint32_t i) { return x->n[i].key; }

#define XFAIL(...) do { snprintf(why, whylen, __VA_ARGS__); return MEMOS_EINVAL; } while (0)

#endif /* MEMOS_POLICY_MEMBER_H */
