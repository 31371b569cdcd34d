/*
 * cache.c — the memos_* API of memos.h: entries, drafts, publish, eviction.
 *
 * A cache ties four components together under one mutex:
 *
 *     arena   (arena.c)    pages of slot bytes
 *     index   (index.c)    key → live entry
 *     policy  (policy.c)   victim order of live entries
 *     all     (here)       list of every entry: live, draft or dead
 *
 * Entry layout.  An entry of `size` bytes holds P = ceil(size / 4 KiB) pages
 * as extents: P / 32 whole blocks, then, if P % 32 != 0, one run of P % 32
 * pages inside one block.  Each extent keeps the address of its first byte
 * (computed under the lock), so readers of a pinned entry never look at the
 * arena's tables, which may move when the capacity grows.
 *
 *     byte off → extent off / 128 KiB, at off % 128 KiB inside it
 *
 * States (flags, all under the lock):
 *
 *     draft ──publish──► live ──remove/replace/evict──► dead ──last unpin──► freed
 *       └──draft_free──► freed
 *
 *   live   in index and policy;  dead  in neither, kept while refs > 0;
 *   busy   a draft between the two locked phases of a write (below).
 *
 * Copies without the lock.  A write to a draft runs in three phases:
 *   1. locked: allocate the pages the new size needs (evicting if full);
 *      if the old tail run cannot grow in place it is reallocated and the
 *      old run parked in `moving`; mark the draft busy;
 *   2. unlocked: copy the parked tail, zero-fill any hole, copy the data;
 *   3. locked: free the parked run, publish the new size, clear busy.
 * Reads of a pinned entry and the base copy of draft_new take no lock at all.
 *
 * Eviction runs (do_evict_run) pick up to evict_batch victims from the
 * policy, pin them and mark them evicting, drop the lock to call the
 * callback for each, then retake it: a victim the callback let go is killed
 * (freed at its last unpin), a refused one is stamped with the run's
 * generation so the allocation retrying in the same operation skips it.
 * An allocation that still fails when no victim is left is MEMOS_ENOMEM.
 *
 * Failure injection.  memos_fail_after(n) arms the arena's countdown; every
 * page allocation and every metadata malloc (entries, extent arrays, key
 * copies, index growth) ticks it.  An injected failure is final for the
 * operation (no eviction), so error paths are what gets tested.
 *
 * Invariants (memos_check): see the function.
 */
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <sys/mman.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "arena.h"
#include "index.h"
#include "memos.h"
#include "policy.h"

/* ---- types and constants ---- */

#define EVICT_CHUNK     64      /* victims handled per callback round */
#define EVICT_BATCH_MAX 4096u

typedef struct extent {
    char     *ptr;   /* address of the run's first byte (stable while held) */
    arena_run run;   /* the pages */
} extent;

/* What a draft (and the version it becomes) changed since the last version
 * of its lineage that was clean (written back): that version's bytes [0, cut),
 * zeros to the size, then the pages set in bits written by this lineage.  The
 * SSD tier writes only those pages when it holds exactly base_version
 * (memos_entry_changes).  Unknown (NULL) whenever in doubt: the version is then
 * written whole.  Costs a pointer per entry; the struct and its bitmap (a bit
 * per 4 KiB page) exist only for drafts made from a base and what they become. */
typedef struct changes {
    uint64_t  base_version;   /* the clean version this lineage started from */
    uint64_t  base_size;      /* its size */
    uint64_t  cut;            /* the smallest size since (<= base_size) */
    uint64_t *bits;           /* pages written, nwords words (NULL: none yet) */
    uint32_t  nwords;
} changes;

struct memos_entry {
    index_node   inode;       /* key copy, klen, hash; key NULL for drafts (lock) */
    policy_node  pnode;       /* policy links (lock) */
    memos_entry *all_prev;    /* list of every entry (lock) */
    memos_entry *all_next;    /* list of every entry (lock) */
    extent      *ext;         /* extents, next used of cap_ext (lock; fixed unless draft) */
    uint32_t     next;        /* extents in use */
    uint32_t     cap_ext;     /* extents allocated */
    extent       moving;      /* draft: old tail parked during a write, npages 0 = none */
    uint32_t     moving_idx;  /* draft: extent that receives the parked tail */
    uint32_t     refs;        /* references (lock) */
    uint32_t     refused_gen; /* eviction generation that refused it (lock) */
    uint64_t     pages;       /* pages held in ext (lock) */
    uint64_t     size;        /* logical bytes (lock; fixed unless draft) */
    uint64_t     version;     /* version number (lock) */
    uint64_t     hits;        /* memos_get hits (lock) */
    uint8_t      live;        /* in index and policy (lock) */
    uint8_t      dead;        /* removed, replaced or evicted, still pinned (lock) */
    uint8_t      draft;       /* a draft (lock) */
    uint8_t      evicting;    /* pinned by an eviction run (lock) */
    uint8_t      dirty;       /* not yet persisted (lock) */
    uint8_t      sticky;      /* sticky pin, never a victim (lock) */
    uint8_t      busy;        /* draft inside an unlocked write phase (lock) */
    uint8_t      prefetched;  /* prefetched, unread: passes left before it may be a victim (lock) */
    uint16_t     tenant;      /* live: 1 + index of its agent's tenant, 0 = none (lock) */
    changes     *chg;         /* what changed since an older version, NULL = unknown (lock) */
};

/* A tenant: an agent (the key's first component) with a byte quota.  Its
 * live entries' pages are counted; while they are within the quota, none of
 * them is a victim (evictable() skips them), so other tenants' writes cannot
 * push it below its share.  Entries are linked to their tenant at publish
 * and rename, unlinked when they die; memos_check recounts. */
typedef struct tenant {
    unsigned char name[MEMOS_TENANT_NAME_MAX];
    uint32_t      len;        /* 0: a free slot */
    uint64_t      quota;      /* protected bytes (pages * 4 KiB) */
    uint64_t      bytes;      /* pages * 4 KiB of its live entries */
    uint64_t      slots;      /* its live entries */
} tenant;

struct memos_cache {
    pthread_mutex_t lock;       /* guards everything below */
    arena        ar;            /* pages (lock) */
    index_table  idx;           /* key → live entry (lock) */
    policy       pol;           /* victim order (lock) */
    memos_entry  all;           /* sentinel of the list of every entry (lock) */
    unsigned     evict_batch;   /* victims per run (lock) */
    memos_evict_fn cb;          /* eviction callback, may be NULL (set once) */
    void        *cb_ctx;        /* its argument (set once) */
    uint32_t     gen;           /* last eviction generation handed out (lock) */
    uint32_t     victim_gen;    /* generation the policy filter skips (lock) */
    memos_stats  st;            /* counters kept incrementally (lock) */
    unsigned     evicting;      /* victims in other threads' callbacks now (lock) */
    pthread_cond_t evicted;     /* signalled when an eviction run's callbacks end (lock) */
    tenant       tenants[MEMOS_TENANT_MAX];  /* agents with a quota (lock) */
    unsigned     ntenants;      /* slots of tenants[] ever used (lock) */
    unsigned     prefetch_open; /* 1: guarded prefetches may be victims (lock) */
    uint64_t     prefetch_passed; /* guarded entries the current walk passed over (lock) */
    uint64_t     prefetch_pages;  /* pages of the guarded entries (lock) */
    int          draft_evicts;  /* 1: a draft's write may evict; 0: it is refused
                                   instead (memos_set_draft_evicts) (lock) */
};

/* How long an allocation waits for other threads' evictions (write-backs to
 * the SSD) to free pages before it gives up with MEMOS_ENOMEM. */
#define ALLOC_WAIT_MS 30000
/* How long it waits, at most, for replaced versions that are still pinned
 * (dead_pinned: a reader finishing, a page-cache push copying the previous
 * version) to be released, when nothing is being evicted. */
#define DEAD_WAIT_MS  1000

/* Set by memos_set_nowait: this thread's allocations return MEMOS_EAGAIN
 * where they would wait. */
static __thread int tl_nowait;

/* ---- private prototypes ---- */

static void    *meta_alloc(memos_cache *c, size_t n);
static int      evictable(const policy_node *n, void *ctx);
static void     unguard(memos_cache *c, memos_entry *e);
static memos_entry *entry_of_pnode(const policy_node *n);
static memos_entry *entry_new(memos_cache *c);
static void     entry_destroy(memos_cache *c, memos_entry *e);
static void     kill_entry(memos_cache *c, memos_entry *e, int in_index);
static void     do_unpin(memos_cache *c, memos_entry *e);
static int      held_by_others(memos_cache *c);
static int      do_alloc(memos_cache *c, unsigned k, uint32_t gen, int may_evict,
                         extent *out);
static uint64_t do_room_pages(memos_cache *c);
static int      do_evict_run(memos_cache *c, uint32_t gen, size_t *picked);
static int      draft_reserve(memos_cache *c, memos_entry *d, uint64_t size, int may_evict);
static void     draft_shrink(memos_cache *c, memos_entry *d, uint64_t size);
static int      draft_fill(memos_cache *c, memos_entry *d, uint64_t off,
                           const void *src, size_t n, int set_size, int may_evict);
static void     entry_copy_in(memos_entry *e, uint64_t off, const void *src, size_t n);
static void     entry_zero(memos_entry *e, uint64_t off, uint64_t n);
static void     changes_free(memos_entry *e);
static void     changes_start(memos_entry *d, const memos_entry *base);
static void     changes_note(memos_entry *d, uint64_t off, uint64_t n, uint64_t new_size);
static uint64_t pages_for(uint64_t size);
static extent   make_extent(memos_cache *c, arena_run r);

static void     tenant_link(memos_cache *c, memos_entry *e);
static void     tenant_unlink(memos_cache *c, memos_entry *e);

static inline void lock(memos_cache *c) { pthread_mutex_lock(&c->lock); }
static inline void unlock(memos_cache *c) { pthread_mutex_unlock(&c->lock); }

/* ---- API: lifetime and knobs ---- */

static int index_fail_hook(void *ctx)
{
    return arena_fail_tick(&((memos_cache *)ctx)->ar);
}

memos_cache *memos_cache_new(uint64_t capacity, unsigned evict_batch,
                             memos_evict_fn cb, void *cb_ctx)
{
    if (evict_batch == 0 || evict_batch > EVICT_BATCH_MAX) {
        errno = EINVAL;
        return NULL;
    }
    memos_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    int rc = arena_init(&c->ar, capacity);
    if (rc != MEMOS_OK) {
        int saved = rc == MEMOS_ESYS ? errno : ENOMEM;
        arena_destroy(&c->ar);
        free(c);
        errno = saved;
        return NULL;
    }
    if (index_init(&c->idx, 64) != MEMOS_OK) {
        arena_destroy(&c->ar);
        free(c);
        errno = ENOMEM;
        return NULL;
    }
    c->idx.fail_hook = index_fail_hook;
    c->idx.fail_ctx = c;
    policy_init(&c->pol, "lru_lfu", evictable, c);
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->evicted, NULL);
    c->all.all_next = c->all.all_prev = &c->all;
    c->evict_batch = evict_batch;
    c->draft_evicts = 1;
    c->cb = cb;
    c->cb_ctx = cb_ctx;
    return c;
}

void memos_cache_free(memos_cache *c)
{
    if (!c)
        return;
    for (memos_entry *e = c->all.all_next; e != &c->all;) {
        memos_entry *next = e->all_next;
        free((void *)e->inode.key);
        free(e->ext);
        changes_free(e);
        free(e);
        e = next;
    }
    index_destroy(&c->idx);
    policy_destroy(&c->pol);
    arena_destroy(&c->ar);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->evicted);
    free(c);
}

int memos_set_capacity(memos_cache *c, uint64_t capacity)
{
    if (capacity == 0)
        return MEMOS_EINVAL;
    uint64_t bytes = arena_capacity_for(capacity);
    uint64_t pages = bytes / MEMOS_PAGE_SIZE;
    lock(c);
    uint32_t gen = ++c->gen;
    while (arena_pages_used(&c->ar) > pages) {
        size_t picked = 0;
        do_evict_run(c, gen, &picked);
        if (picked == 0) {
            unlock(c);
            return MEMOS_ENOMEM;
        }
    }
    int rc = arena_set_capacity(&c->ar, bytes);
    unlock(c);
    return rc;
}

int memos_set_policy(memos_cache *c, const char *name)
{
    lock(c);
    int rc = policy_select(&c->pol, name);
    unlock(c);
    return rc;
}

const char *memos_policy_name(memos_cache *c)
{
    lock(c);
    const char *name = c->pol.ops->name;    /* (a static string of the policy's table) */
    unlock(c);
    return name;
}

int memos_set_evict_batch(memos_cache *c, unsigned n)
{
    if (n == 0 || n > EVICT_BATCH_MAX)
        return MEMOS_EINVAL;
    lock(c);
    c->evict_batch = n;
    unlock(c);
    return MEMOS_OK;
}

void memos_get_stats(memos_cache *c, memos_stats *out)
{
    lock(c);
    *out = c->st;
    out->pinned = 0;
    for (policy_node *n = c->pol.head.next; n != &c->pol.head; n = n->next) {
        memos_entry *e = entry_of_pnode(n);
        out->pinned += e->refs > 0 || e->sticky;
    }
    out->pages_used = arena_pages_used(&c->ar);
    out->free_pages = arena_pages_free(&c->ar);
    out->capacity = arena_page_limit(&c->ar) * MEMOS_PAGE_SIZE;
    out->superblocks = arena_superblocks(&c->ar);
    out->huge_pages = (uint64_t)c->ar.huge_pages;
    out->evict_batch = c->evict_batch;
    out->index_buckets = index_buckets(&c->idx);
    out->index_entries = index_entries(&c->idx);
    out->index_load_factor = index_load(&c->idx);
    policy_stats ps;
    policy_get_stats(&c->pol, &ps);
    out->ghost_hits_recency = ps.ghost_hits_recency;
    out->ghost_hits_frequency = ps.ghost_hits_frequency;
    out->ghost_entries = ps.ghost_entries;
    out->policy_probation = ps.probation;
    out->policy_protected = ps.protected_;
    out->policy_recency = ps.recency;
    out->reclaim_runs = c->ar.reclaim_runs;
    out->fragmentation = arena_fragmentation(&c->ar);
    out->pages_pending = arena_pages_pending(&c->ar);
    out->sweep_ns = c->ar.sweep_ns;
    out->sweep_ns_max = c->ar.sweep_ns_max;
    out->reclaim_free_ratio = c->ar.reclaim_free_ratio;
    out->reclaim_fail_limit = c->ar.reclaim_fail_limit;
    unlock(c);
}

int memos_set_reclaim(memos_cache *c, double free_ratio, unsigned fail_limit)
{
    lock(c);
    int rc = arena_set_reclaim(&c->ar, free_ratio, fail_limit);
    unlock(c);
    return rc;
}

long memos_sweep(memos_cache *c)
{
    lock(c);
    uint64_t n = arena_reclaim(&c->ar);
    unlock(c);
    return (long)n;
}

/* Fault in one more superblock of the arena, at most `ahead` beyond the
 * allocated pages (see arena_next_unfaulted): 1 done, 0 none to do now, -1
 * the kernel cannot (no MADV_POPULATE_WRITE: then
 * first writes pay their faults, as before). */
int memos_prefault(memos_cache *c, unsigned ahead)
{
    lock(c);
    char *base = arena_next_unfaulted(&c->ar, ahead);
    unlock(c);
    if (!base)
        return 0;
#ifdef MADV_POPULATE_WRITE
    if (madvise(base, MEMOS_SUPERBLOCK_SIZE, MADV_POPULATE_WRITE) == 0)
        return 1;
    return errno == EINVAL ? -1 : 1;     /* (ENOMEM: unmapped meanwhile) */
#else
    return -1;
#endif
}

/* ---- API: lookups ---- */

int memos_get(memos_cache *c, const void *key, size_t klen, memos_entry **out)
{
    uint64_t h = index_hash(key, klen);
    lock(c);
    c->st.lookups++;
    index_node *n = klen <= MEMOS_KEY_MAX ? index_find(&c->idx, key, klen, h) : NULL;
    if (!n) {
        c->st.misses++;
        unlock(c);
        return MEMOS_ENOENT;
    }
    memos_entry *e = (memos_entry *)n;   /* inode is the first field */
    e->refs++;
    e->hits++;
    c->st.hits++;
    unguard(c, e);                       /* read: a prefetch has done its job */
    policy_touch(&c->pol, &e->pnode);
    unlock(c);
    *out = e;
    return MEMOS_OK;
}

int memos_peek(memos_cache *c, const void *key, size_t klen, memos_entry **out)
{
    uint64_t h = index_hash(key, klen);
    lock(c);
    index_node *n = klen <= MEMOS_KEY_MAX ? index_find(&c->idx, key, klen, h) : NULL;
    if (!n) {
        unlock(c);
        return MEMOS_ENOENT;
    }
    memos_entry *e = (memos_entry *)n;
    e->refs++;
    unlock(c);
    *out = e;
    return MEMOS_OK;
}

void memos_ref(memos_cache *c, memos_entry *e)
{
    lock(c);
    assert(e->refs > 0 || e->live || e->draft);
    e->refs++;
    unlock(c);
}

void memos_unpin(memos_cache *c, memos_entry *e)
{
    lock(c);
    do_unpin(c, e);
    unlock(c);
}

/* ---- API: drafts and publish ---- */

int memos_draft_new(memos_cache *c, memos_entry *base, memos_entry **out)
{
    lock(c);
    memos_entry *d = entry_new(c);
    if (!d) {
        unlock(c);
        return MEMOS_ENOMEM;
    }
    if (!base || base->size == 0) {
        unlock(c);
        *out = d;
        return MEMOS_OK;
    }
    int rc = draft_reserve(c, d, base->size, c->draft_evicts);
    if (rc != MEMOS_OK) {
        c->st.drafts--;
        entry_destroy(c, d);
        unlock(c);
        return rc;
    }
    assert(d->moving.run.npages == 0 && d->next == base->next);
    d->size = base->size;
    c->st.bytes_draft += d->size;
    changes_start(d, base);
    d->busy = 1;
    unlock(c);
    /* Same size, same layout: copy extent by extent, without the lock. */
    uint64_t left = d->size;
    for (uint32_t i = 0; i < d->next; i++) {
        size_t n = left < MEMOS_BLOCK_SIZE ? (size_t)left : MEMOS_BLOCK_SIZE;
        memcpy(d->ext[i].ptr, base->ext[i].ptr, n);
        left -= n;
    }
    lock(c);
    d->busy = 0;
    unlock(c);
    *out = d;
    return MEMOS_OK;
}

int memos_draft_write(memos_cache *c, memos_entry *d, uint64_t off,
                      const void *src, size_t n)
{
    if (n == 0)
        return MEMOS_OK;
    if (off > UINT64_MAX - n)
        return MEMOS_ETOOBIG;
    return draft_fill(c, d, off, src, n, 0, -1);
}

int memos_draft_truncate(memos_cache *c, memos_entry *d, uint64_t size)
{
    return draft_fill(c, d, size, NULL, 0, 1, -1);
}

void memos_set_draft_evicts(memos_cache *c, int on)
{
    lock(c);
    c->draft_evicts = on != 0;
    unlock(c);
}

int memos_draft_reserve(memos_cache *c, memos_entry *d, uint64_t size)
{
    lock(c);
    if (!d->draft || d->busy || size < d->size) {
        unlock(c);
        return MEMOS_EINVAL;
    }
    uint64_t want = pages_for(size);
    if (want > arena_page_limit(&c->ar)) {
        unlock(c);
        return MEMOS_ETOOBIG;
    }
    /* all or nothing: nothing is evicted for a draft the room cannot be
     * made for whole */
    if (want > d->pages && want - d->pages > do_room_pages(c)) {
        c->st.alloc_failures++;
        unlock(c);
        return MEMOS_ENOMEM;
    }
    unlock(c);
    return draft_fill(c, d, size, NULL, 0, 1, 1);
}

void memos_draft_free(memos_cache *c, memos_entry *d)
{
    lock(c);
    assert(d->draft && !d->busy);
    c->st.drafts--;
    c->st.bytes_draft -= d->size;
    entry_destroy(c, d);
    pthread_cond_broadcast(&c->evicted);   /* an allocation may be waiting */
    unlock(c);
}

int memos_publish(memos_cache *c, memos_entry *d, const void *key, size_t klen,
                  uint64_t version, int dirty)
{
    if (klen == 0 || klen > MEMOS_KEY_MAX)
        return MEMOS_EINVAL;
    uint64_t h = index_hash(key, klen);
    lock(c);
    if (!d->draft || d->busy) {
        unlock(c);
        return MEMOS_EINVAL;
    }
    unsigned char *k = meta_alloc(c, klen);
    if (!k) {
        unlock(c);
        return MEMOS_ENOMEM;
    }
    memcpy(k, key, klen);
    d->inode = (index_node){ h, k, (uint32_t)klen };
    memos_entry *old = (memos_entry *)index_find(&c->idx, key, klen, h);
    if (old) {
        index_replace(&c->idx, &old->inode, &d->inode);
        d->version = version ? version : old->version + 1;
        d->sticky = old->sticky;            /* a pin belongs to the key, not the version */
        kill_entry(c, old, 0);
        c->st.replaces++;
    } else {
        if (index_insert(&c->idx, &d->inode) != MEMOS_OK) {
            d->inode = (index_node){ 0, NULL, 0 };
            free(k);
            unlock(c);
            return MEMOS_ENOMEM;
        }
        d->version = version ? version : 1;
        c->st.inserts++;
    }
    d->draft = 0;
    d->live = 1;
    d->dirty = dirty != 0;
    tenant_link(c, d);
    c->st.drafts--;
    c->st.bytes_draft -= d->size;
    c->st.slots++;
    c->st.bytes_used += d->size;
    policy_admit(&c->pol, &d->pnode, h);
    unlock(c);
    return MEMOS_OK;
}

/* ---- API: removal and renaming ---- */

int memos_remove(memos_cache *c, const void *key, size_t klen)
{
    if (klen > MEMOS_KEY_MAX)
        return MEMOS_ENOENT;
    uint64_t h = index_hash(key, klen);
    lock(c);
    memos_entry *e = (memos_entry *)index_find(&c->idx, key, klen, h);
    if (!e) {
        unlock(c);
        return MEMOS_ENOENT;
    }
    kill_entry(c, e, 1);
    c->st.removes++;
    unlock(c);
    return MEMOS_OK;
}

int memos_rename(memos_cache *c, const void *from, size_t flen,
                 const void *to, size_t tlen)
{
    if (tlen == 0 || tlen > MEMOS_KEY_MAX)
        return MEMOS_EINVAL;
    if (flen > MEMOS_KEY_MAX)
        return MEMOS_ENOENT;
    uint64_t fh = index_hash(from, flen), th = index_hash(to, tlen);
    lock(c);
    memos_entry *e = (memos_entry *)index_find(&c->idx, from, flen, fh);
    if (!e) {
        unlock(c);
        return MEMOS_ENOENT;
    }
    if (flen == tlen && memcmp(from, to, flen) == 0) {
        unlock(c);
        return MEMOS_OK;
    }
    unsigned char *k = meta_alloc(c, tlen);
    if (!k) {
        unlock(c);
        return MEMOS_ENOMEM;
    }
    memcpy(k, to, tlen);
    memos_entry *target = (memos_entry *)index_find(&c->idx, to, tlen, th);
    index_node saved = e->inode;
    index_remove(&c->idx, &e->inode);
    tenant_unlink(c, e);
    e->inode = (index_node){ th, k, (uint32_t)tlen };
    if (target) {
        index_replace(&c->idx, &target->inode, &e->inode);
        kill_entry(c, target, 0);
    } else if (index_insert(&c->idx, &e->inode) != MEMOS_OK) {
        /* The slot e left is still free: putting it back cannot fail. */
        e->inode = saved;
        int rc = index_insert(&c->idx, &e->inode);
        assert(rc == MEMOS_OK);
        (void)rc;
        tenant_link(c, e);
        free(k);
        unlock(c);
        return MEMOS_ENOMEM;
    }
    policy_rekey(&c->pol, &e->pnode, th);
    tenant_link(c, e);
    free((void *)saved.key);
    unlock(c);
    return MEMOS_OK;
}

int memos_evict_run(memos_cache *c)
{
    lock(c);
    size_t picked = 0;
    int n = do_evict_run(c, ++c->gen, &picked);
    unlock(c);
    return n;
}

int memos_set_nowait(int on)
{
    int was = tl_nowait;
    tl_nowait = on != 0;
    return was;
}

int memos_wait_room(memos_cache *c, unsigned ms)
{
    lock(c);
    int why = c->evicting > 0 ? 1 : c->st.dead_pinned > 0 ? 2 : held_by_others(c) ? 3 : 0;
    if (why && ms) {
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += ms / 1000;
        until.tv_nsec += (long)(ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->evicted, &c->lock, &until);
    }
    unlock(c);
    return why;
}

typedef struct foreach_ctx {
    void (*fn)(void *ctx, memos_entry *e);   /* caller's function */
    void *ctx;                               /* its argument */
} foreach_ctx;

static void foreach_adapter(void *ctx, policy_node *n)
{
    foreach_ctx *f = ctx;
    f->fn(f->ctx, entry_of_pnode(n));
}

void memos_foreach(memos_cache *c, void (*fn)(void *ctx, memos_entry *e), void *ctx)
{
    foreach_ctx f = { fn, ctx };
    lock(c);
    policy_foreach(&c->pol, foreach_adapter, &f);
    unlock(c);
}

/* ---- API: entries ---- */

uint64_t memos_entry_size(const memos_entry *e) { return e->size; }
uint64_t memos_entry_stored(const memos_entry *e) { return e->pages * MEMOS_PAGE_SIZE; }
uint64_t memos_entry_version(const memos_entry *e) { return e->version; }
uint64_t memos_entry_hits(const memos_entry *e) { return e->hits; }
int      memos_entry_dirty(const memos_entry *e) { return e->dirty; }
int      memos_entry_live(const memos_entry *e) { return e->live; }
int      memos_entry_sticky(const memos_entry *e) { return e->sticky; }

const void *memos_entry_key(const memos_entry *e, size_t *klen)
{
    if (klen)
        *klen = e->inode.klen;
    return e->inode.key;
}

void memos_set_dirty(memos_cache *c, memos_entry *e, int dirty)
{
    lock(c);
    e->dirty = dirty != 0;
    unlock(c);
}

void memos_set_sticky(memos_cache *c, memos_entry *e, int on)
{
    lock(c);
    e->sticky = on != 0;
    unlock(c);
}

size_t memos_entry_read(const memos_entry *e, uint64_t off, void *dst, size_t n)
{
    if (off >= e->size)
        return 0;
    if (n > e->size - off)
        n = (size_t)(e->size - off);
    char *out = dst;
    size_t done = 0;
    while (done < n) {
        uint64_t at = off + done;
        size_t in = (size_t)(at % MEMOS_BLOCK_SIZE);
        size_t chunk = MEMOS_BLOCK_SIZE - in;
        if (chunk > n - done)
            chunk = n - done;
        memcpy(out + done, e->ext[at / MEMOS_BLOCK_SIZE].ptr + in, chunk);
        done += chunk;
    }
    return n;
}

int memos_entry_iov(const memos_entry *e, uint64_t off, size_t n,
                    struct iovec *iov, int max)
{
    if (off >= e->size || max <= 0)
        return 0;
    if (n > e->size - off)
        n = (size_t)(e->size - off);
    int cnt = 0;
    size_t done = 0;
    while (done < n && cnt < max) {
        uint64_t at = off + done;
        size_t in = (size_t)(at % MEMOS_BLOCK_SIZE);
        size_t chunk = MEMOS_BLOCK_SIZE - in;
        if (chunk > n - done)
            chunk = n - done;
        iov[cnt].iov_base = e->ext[at / MEMOS_BLOCK_SIZE].ptr + in;
        iov[cnt].iov_len = chunk;
        cnt++;
        done += chunk;
    }
    return cnt;
}

/* ---- API: testing ---- */

void memos_fail_after(memos_cache *c, long n)
{
    lock(c);
    arena_fail_after(&c->ar, n);
    unlock(c);
}

/* ---- private helpers ---- */

static memos_entry *entry_of_pnode(const policy_node *n)
{
    return (memos_entry *)((char *)n - offsetof(memos_entry, pnode));
}

static void *meta_alloc(memos_cache *c, size_t n)
{
    if (arena_fail_tick(&c->ar))
        return NULL;
    return malloc(n ? n : 1);
}

static int evictable(const policy_node *n, void *ctx)
{
    memos_cache *c = ctx;
    memos_entry *e = (memos_entry *)entry_of_pnode(n);
    if (e->refs || e->sticky || e->evicting || e->refused_gen == c->victim_gen)
        return 0;
    if (e->tenant) {
        const tenant *t = &c->tenants[e->tenant - 1];
        if (t->bytes <= t->quota)
            return 0;                   /* within its quota: protected */
    }
    if (e->prefetched && !c->prefetch_open) {
        /* a prefetch not read yet: passed over, a bounded number of times */
        if (--e->prefetched > 0) {
            c->prefetch_passed++;
            return 0;
        }
        c->st.prefetch_guarded--;
        c->prefetch_pages -= e->pages;
        c->st.prefetch_aged++;
    }
    return 1;
}

/* ---- prefetched entries (memos_mark_prefetched) ---- */

static void unguard(memos_cache *c, memos_entry *e)
{
    if (e->prefetched) {
        e->prefetched = 0;
        c->st.prefetch_guarded--;
        c->prefetch_pages -= e->pages;
    }
}

/* Guarded entries hold at most half the memory tier's pages. */
int memos_mark_prefetched(memos_cache *c, memos_entry *e)
{
    lock(c);
    int ok = e->live && (e->prefetched ||
                         c->prefetch_pages + e->pages <= arena_page_limit(&c->ar) / 2);
    if (ok && !e->prefetched) {
        e->prefetched = MEMOS_PREFETCH_PASSES;
        c->st.prefetch_guarded++;
        c->prefetch_pages += e->pages;
    }
    unlock(c);
    return ok;
}

/* ---- tenants ---- */

/* The length of the key's first component (the agent). */
static size_t agent_len(const unsigned char *key, size_t klen)
{
    const unsigned char *slash = memchr(key, '/', klen);
    return slash ? (size_t)(slash - key) : klen;
}

static tenant *tenant_find(memos_cache *c, const void *name, size_t len)
{
    for (unsigned i = 0; i < c->ntenants; i++) {
        tenant *t = &c->tenants[i];
        if (t->len == len && memcmp(t->name, name, len) == 0)
            return t;
    }
    return NULL;
}

/* Count a live entry to the tenant its key names, if that agent is one. */
static void tenant_link(memos_cache *c, memos_entry *e)
{
    e->tenant = 0;
    if (c->ntenants == 0 || !e->inode.key)
        return;
    size_t n = agent_len(e->inode.key, e->inode.klen);
    tenant *t = tenant_find(c, e->inode.key, n);
    if (!t)
        return;
    e->tenant = (uint16_t)(t - c->tenants + 1);
    t->bytes += e->pages * MEMOS_PAGE_SIZE;
    t->slots++;
}

static void tenant_unlink(memos_cache *c, memos_entry *e)
{
    if (!e->tenant)
        return;
    tenant *t = &c->tenants[e->tenant - 1];
    t->bytes -= e->pages * MEMOS_PAGE_SIZE;
    t->slots--;
    e->tenant = 0;
}

int memos_tenant_set(memos_cache *c, const void *name, size_t len, uint64_t quota)
{
    if (len == 0 || len > MEMOS_TENANT_NAME_MAX || memchr(name, '/', len))
        return MEMOS_EINVAL;
    lock(c);
    tenant *t = tenant_find(c, name, len);
    if (quota == 0) {                   /* no quota: no tenant, nothing protected */
        if (t) {
            for (policy_node *n = c->pol.head.next; n != &c->pol.head; n = n->next) {
                memos_entry *e = entry_of_pnode(n);
                if (e->tenant && &c->tenants[e->tenant - 1] == t)
                    e->tenant = 0;
            }
            memset(t, 0, sizeof *t);
        }
        unlock(c);
        return MEMOS_OK;
    }
    if (!t) {
        for (unsigned i = 0; i < c->ntenants && !t; i++)
            if (c->tenants[i].len == 0)
                t = &c->tenants[i];
        if (!t && c->ntenants < MEMOS_TENANT_MAX)
            t = &c->tenants[c->ntenants++];
        if (!t) {
            unlock(c);
            return MEMOS_ENOMEM;
        }
        memset(t, 0, sizeof *t);
        memcpy(t->name, name, len);
        t->len = (uint32_t)len;
        for (policy_node *n = c->pol.head.next; n != &c->pol.head; n = n->next) {
            memos_entry *e = entry_of_pnode(n);
            if (!e->tenant && agent_len(e->inode.key, e->inode.klen) == len &&
                memcmp(e->inode.key, name, len) == 0) {
                e->tenant = (uint16_t)(t - c->tenants + 1);
                t->bytes += e->pages * MEMOS_PAGE_SIZE;
                t->slots++;
            }
        }
    }
    t->quota = quota;
    unlock(c);
    return MEMOS_OK;
}

int memos_tenant_get(memos_cache *c, const void *name, size_t len, uint64_t *quota,
                     uint64_t *bytes, uint64_t *slots)
{
    lock(c);
    tenant *t = len ? tenant_find(c, name, len) : NULL;
    if (t) {
        *quota = t->quota;
        *bytes = t->bytes;
        *slots = t->slots;
    }
    unlock(c);
    return t ? MEMOS_OK : MEMOS_ENOENT;
}

static uint64_t pages_for(uint64_t size)
{
    return (size + MEMOS_PAGE_SIZE - 1) / MEMOS_PAGE_SIZE;
}

static extent make_extent(memos_cache *c, arena_run r)
{
    return (extent){ arena_ptr(&c->ar, r.page), r };
}

/* A new empty draft with one reference, linked on the all list. */
static memos_entry *entry_new(memos_cache *c)
{
    memos_entry *e = meta_alloc(c, sizeof *e);
    if (!e)
        return NULL;
    memset(e, 0, sizeof *e);
    e->draft = 1;
    e->refs = 1;
    e->all_next = c->all.all_next;
    e->all_prev = &c->all;
    c->all.all_next->all_prev = e;
    c->all.all_next = e;
    c->st.drafts++;
    return e;
}

/* Free an entry's pages and memory; it is in neither index nor policy. */
static void entry_destroy(memos_cache *c, memos_entry *e)
{
    assert(!e->live && !e->pnode.linked);
    for (uint32_t i = 0; i < e->next; i++)
        arena_free(&c->ar, e->ext[i].run);
    if (e->moving.run.npages)
        arena_free(&c->ar, e->moving.run);
    e->all_prev->all_next = e->all_next;
    e->all_next->all_prev = e->all_prev;
    free((void *)e->inode.key);
    free(e->ext);
    changes_free(e);
    free(e);
}

/* Live → dead; freed now if nobody holds it.  in_index == 0 when the caller
 * already took it out of the index (replace). */
static void kill_entry(memos_cache *c, memos_entry *e, int in_index)
{
    assert(e->live);
    if (in_index) {
        int rc = index_remove(&c->idx, &e->inode);
        assert(rc == MEMOS_OK);
        (void)rc;
    }
    policy_remove(&c->pol, &e->pnode);
    tenant_unlink(c, e);
    unguard(c, e);
    e->live = 0;
    e->dead = 1;
    c->st.slots--;
    c->st.bytes_used -= e->size;
    if (e->refs == 0)
        entry_destroy(c, e);
    else
        c->st.dead_pinned++;
}

static void do_unpin(memos_cache *c, memos_entry *e)
{
    assert(e->refs > 0);
    if (--e->refs == 0 && e->dead) {
        c->st.dead_pinned--;
        entry_destroy(c, e);
        pthread_cond_broadcast(&c->evicted);   /* an allocation may be waiting */
    } else if (e->refs == 0) {
        pthread_cond_broadcast(&c->evicted);   /* a victim again: the same */
    }
}

/* Whether pages that no eviction can take now will come free by themselves:
 * another draft (its writer publishes or drops it, and a published version
 * can be evicted) or a live version a reader holds (not a sticky pin, which
 * only its owner lifts).  Lock held. */
static int held_by_others(memos_cache *c)
{
    if (c->st.drafts > 1)
        return 1;
    for (policy_node *n = c->pol.head.next; n != &c->pol.head; n = n->next) {
        memos_entry *e = entry_of_pnode(n);
        if (e->refs > 0 && !e->sticky && !e->evicting)
            return 1;
    }
    return 0;
}

/* Pages an allocation could have now: free ones (freed pages awaiting the
 * sweep included) and those of every entry an eviction could take (no
 * reader, no pin, not being evicted, not protected by its agent's quota).
 * Lock held; O(entries), for the all-or-nothing reserve only. */
typedef struct room_ctx {
    memos_cache *c;             /* the cache (lock held) */
    uint64_t     pages;         /* pages counted so far */
} room_ctx;

static void room_count(void *ctx, policy_node *n)
{
    room_ctx *r = ctx;
    const memos_entry *e = entry_of_pnode(n);
    if (e->refs || e->sticky || e->evicting)
        return;
    if (e->tenant) {
        const tenant *t = &r->c->tenants[e->tenant - 1];
        if (t->bytes <= t->quota)
            return;
    }
    r->pages += e->pages;
}

static uint64_t do_room_pages(memos_cache *c)
{
    room_ctx r = { c, arena_pages_free(&c->ar) };
    policy_foreach(&c->pol, room_count, &r);
    return r.pages;
}

/* k pages (32 = a whole block), evicting until they fit.  Lock held; it is
 * dropped and retaken around eviction callbacks. */
static int do_alloc(memos_cache *c, unsigned k, uint32_t gen, int may_evict, extent *out)
{
    unsigned waited_ms = 0;
    for (;;) {
        arena_run r;
        if (arena_alloc_pages(&c->ar, k, &r) == MEMOS_OK) {
            *out = make_extent(c, r);
            return MEMOS_OK;
        }
        c->st.alloc_failures++;
        if (c->ar.last_injected)
            return MEMOS_ENOMEM;
        if (!may_evict) {
            /* a draft that may not evict (memos_set_draft_evicts): freed
             * pages awaiting the sweep are all it may take */
            if (arena_reclaim(&c->ar) == 0)
                return MEMOS_ENOMEM;
            continue;
        }
        size_t picked = 0;
        do_evict_run(c, gen, &picked);
        /* No victim left: pages still awaiting the sweep are the last resort,
         * then the victims other threads are writing back right now (their
         * pages are freed when the write-back ends), then replaced versions
         * that are still pinned (freed at their last unpin): wait for them,
         * bounded. */
        if (picked == 0 && arena_reclaim(&c->ar) == 0) {
            int wait_evict = c->evicting > 0 && waited_ms < ALLOC_WAIT_MS;
            int wait_dead = c->st.dead_pinned > 0 && waited_ms < DEAD_WAIT_MS;
            if (!wait_evict && !wait_dead) {
                /* a caller that waits outside (memos_set_nowait: the
                 * filesystem's request loop, which bounds the wait) is told
                 * to wait when what fills memory is other requests' drafts
                 * and readers' pins, released in a moment */
                if (tl_nowait && held_by_others(c))
                    return MEMOS_EAGAIN;
                return MEMOS_ENOMEM;
            }
            if (tl_nowait)
                return MEMOS_EAGAIN;
            struct timespec until;
            clock_gettime(CLOCK_REALTIME, &until);
            until.tv_nsec += 50 * 1000000L;
            if (until.tv_nsec >= 1000000000L) {
                until.tv_sec++;
                until.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&c->evicted, &c->lock, &until);
            waited_ms += 50;
            c->st.alloc_waits++;
        }
    }
}

/* One eviction run; returns the entries evicted, *picked the victims tried.
 * Lock held on entry and exit, dropped around the callbacks. */
static int do_evict_run(memos_cache *c, uint32_t gen, size_t *picked)
{
    policy_node *v[EVICT_CHUNK];
    int rcs[EVICT_CHUNK];
    int evicted = 0;
    size_t left = c->evict_batch;
    c->st.eviction_runs++;
    *picked = 0;
    while (left > 0) {
        c->victim_gen = gen;
        c->prefetch_passed = 0;
        size_t got = policy_victims(&c->pol, v, left < EVICT_CHUNK ? left : EVICT_CHUNK);
        if (got == 0 && c->prefetch_passed && *picked == 0) {
            /* only unread prefetches left, and this run found nothing else:
             * they go rather than nothing (a run that took victims already
             * stops here; the allocation runs another if it needs more) */
            c->prefetch_open = 1;
            got = policy_victims(&c->pol, v, left < EVICT_CHUNK ? left : EVICT_CHUNK);
            c->prefetch_open = 0;
            c->st.prefetch_opened++;
        }
        if (got == 0)
            break;
        left -= got;
        *picked += got;
        for (size_t i = 0; i < got; i++) {
            memos_entry *e = entry_of_pnode(v[i]);
            e->refs++;
            e->evicting = 1;
            rcs[i] = MEMOS_OK;
        }
        if (c->cb) {
            c->evicting += (unsigned)got;
            unlock(c);
            for (size_t i = 0; i < got; i++)
                rcs[i] = c->cb(c->cb_ctx, entry_of_pnode(v[i]));
            lock(c);
            c->evicting -= (unsigned)got;
        }
        for (size_t i = 0; i < got; i++) {
            memos_entry *e = entry_of_pnode(v[i]);
            e->evicting = 0;
            if (rcs[i] == MEMOS_OK) {
                if (e->live) {
                    policy_note_evict(&c->pol, &e->pnode);
                    kill_entry(c, e, 1);
                    c->st.evictions++;
                    evicted++;
                }
            } else {
                e->refused_gen = gen;
                c->st.evict_refused++;
            }
            do_unpin(c, e);
        }
        if (c->cb)
            pthread_cond_broadcast(&c->evicted);
    }
    return evicted;
}

/* Grow draft d's pages to hold `size` bytes (lock held; may drop it to
 * evict).  On failure d holds exactly what it held before. */
static int draft_reserve(memos_cache *c, memos_entry *d, uint64_t size, int may_evict)
{
    uint64_t want = pages_for(size), had = d->pages;
    if (want <= had)
        return MEMOS_OK;
    if (want > arena_page_limit(&c->ar))
        return MEMOS_ETOOBIG;
    uint64_t next_want = want / MEMOS_PAGES_PER_BLOCK + (want % MEMOS_PAGES_PER_BLOCK != 0);
    if (next_want > UINT32_MAX)
        return MEMOS_ETOOBIG;
    if (next_want > d->cap_ext) {
        uint32_t cap = d->cap_ext ? d->cap_ext : 1;
        while (cap < next_want)
            cap *= 2;
        extent *ne = arena_fail_tick(&c->ar) ? NULL : realloc(d->ext, cap * sizeof *ne);
        if (!ne)
            return MEMOS_ENOMEM;
        d->ext = ne;
        d->cap_ext = cap;
    }
    uint32_t gen = ++c->gen;
    uint32_t old_next = d->next;
    extent old_tail = old_next ? d->ext[old_next - 1] : (extent){ 0 };
    int moved = 0, rc = MEMOS_OK;
    /* 1. A partial tail grows to a whole block or to the new tail size. */
    if (old_next && old_tail.run.npages < MEMOS_PAGES_PER_BLOCK) {
        unsigned k = want / MEMOS_PAGES_PER_BLOCK > had / MEMOS_PAGES_PER_BLOCK
                         ? MEMOS_PAGES_PER_BLOCK
                         : (unsigned)(want % MEMOS_PAGES_PER_BLOCK);
        arena_run r = old_tail.run;
        if (arena_extend(&c->ar, &r, k) == MEMOS_OK) {
            d->ext[old_next - 1].run = r;
        } else if (c->ar.last_injected) {
            c->st.alloc_failures++;
            return MEMOS_ENOMEM;
        } else {
            extent x;
            if ((rc = do_alloc(c, k, gen, may_evict, &x)) != MEMOS_OK)
                return rc;
            d->ext[old_next - 1] = x;
            moved = 1;
        }
        d->pages += k - old_tail.run.npages;
    }
    /* 2. Whole blocks, then the tail run. */
    while (d->pages < want) {
        uint64_t left = want - d->pages;
        unsigned k = left >= MEMOS_PAGES_PER_BLOCK ? MEMOS_PAGES_PER_BLOCK : (unsigned)left;
        extent x;
        if ((rc = do_alloc(c, k, gen, may_evict, &x)) != MEMOS_OK)
            break;
        d->ext[d->next++] = x;
        d->pages += k;
    }
    if (rc == MEMOS_OK) {
        if (moved) {
            d->moving = old_tail;
            d->moving_idx = old_next - 1;
        }
        return MEMOS_OK;
    }
    /* Roll back to what d held before. */
    while (d->next > old_next) {
        extent x = d->ext[--d->next];
        arena_free(&c->ar, x.run);
    }
    if (old_next) {
        arena_run r = d->ext[old_next - 1].run;
        if (moved)
            arena_free(&c->ar, r);
        else if (r.npages > old_tail.run.npages)
            arena_trim(&c->ar, &r, old_tail.run.npages);
        d->ext[old_next - 1] = old_tail;
    }
    d->pages = had;
    return rc;
}

/* Drop the pages beyond `size` (lock held). */
static void draft_shrink(memos_cache *c, memos_entry *d, uint64_t size)
{
    uint64_t want = pages_for(size);
    while (d->next > 0 && d->pages - d->ext[d->next - 1].run.npages >= want) {
        extent x = d->ext[--d->next];
        d->pages -= x.run.npages;
        arena_free(&c->ar, x.run);
    }
    if (d->pages > want) {
        extent *x = &d->ext[d->next - 1];
        arena_trim(&c->ar, &x->run, (unsigned)(x->run.npages - (d->pages - want)));
        d->pages = want;
    }
    c->st.bytes_draft -= d->size - size;
    d->size = size;
}

/* Write n bytes of src at off (set_size == 0), or set the size to off
 * (set_size == 1), in the three phases described at the top. */
static int draft_fill(memos_cache *c, memos_entry *d, uint64_t off,
                      const void *src, size_t n, int set_size, int may_evict)
{
    lock(c);
    if (may_evict < 0)
        may_evict = c->draft_evicts;
    if (!d->draft || d->busy) {
        unlock(c);
        return MEMOS_EINVAL;
    }
    uint64_t old_size = d->size;
    uint64_t new_size = set_size ? off : (off + n > old_size ? off + n : old_size);
    if (set_size && new_size <= old_size) {
        draft_shrink(c, d, new_size);
        changes_note(d, 0, 0, new_size);
        unlock(c);
        return MEMOS_OK;
    }
    int rc = draft_reserve(c, d, new_size, may_evict);
    if (rc != MEMOS_OK) {
        unlock(c);
        return rc;
    }
    extent mv = d->moving;
    char *mv_to = mv.run.npages ? d->ext[d->moving_idx].ptr : NULL;
    d->busy = 1;
    unlock(c);

    if (mv.run.npages)
        memcpy(mv_to, mv.ptr, (size_t)mv.run.npages * MEMOS_PAGE_SIZE);
    uint64_t zend = set_size ? new_size : off;
    if (zend > old_size)
        entry_zero(d, old_size, zend - old_size);
    if (n)
        entry_copy_in(d, off, src, n);

    lock(c);
    if (mv.run.npages) {
        arena_free(&c->ar, mv.run);
        d->moving = (extent){ 0 };
    }
    c->st.bytes_draft += new_size - d->size;
    d->size = new_size;
    changes_note(d, off, set_size ? 0 : n, new_size);
    d->busy = 0;
    unlock(c);
    return MEMOS_OK;
}

static void entry_copy_in(memos_entry *e, uint64_t off, const void *src, size_t n)
{
    const char *in = src;
    size_t done = 0;
    while (done < n) {
        uint64_t at = off + done;
        size_t o = (size_t)(at % MEMOS_BLOCK_SIZE);
        size_t chunk = MEMOS_BLOCK_SIZE - o;
        if (chunk > n - done)
            chunk = n - done;
        memcpy(e->ext[at / MEMOS_BLOCK_SIZE].ptr + o, in + done, chunk);
        done += chunk;
    }
}

static void entry_zero(memos_entry *e, uint64_t off, uint64_t n)
{
    uint64_t done = 0;
    while (done < n) {
        uint64_t at = off + done;
        size_t o = (size_t)(at % MEMOS_BLOCK_SIZE);
        uint64_t chunk = MEMOS_BLOCK_SIZE - o;
        if (chunk > n - done)
            chunk = n - done;
        memset(e->ext[at / MEMOS_BLOCK_SIZE].ptr + o, 0, (size_t)chunk);
        done += chunk;
    }
}

/* ---- what a lineage of drafts changed (lock held) ---- */

static void changes_free(memos_entry *e)
{
    if (e->chg) {
        free(e->chg->bits);
        free(e->chg);
        e->chg = NULL;
    }
}

/* d: a new draft copying base.  A clean base is the start of a lineage; a
 * dirty one passes on what its lineage changed (its versions in between were
 * never written back).  Otherwise unknown. */
static void changes_start(memos_entry *d, const memos_entry *base)
{
    changes_free(d);
    if (base->draft || !base->version || (base->dirty && !base->chg))
        return;                                 /* unknown: written whole */
    changes *g = malloc(sizeof *g);
    if (!g)
        return;
    if (!base->dirty) {
        *g = (changes){ base->version, base->size, base->size, NULL, 0 };
    } else {
        *g = *base->chg;
        g->bits = NULL;
        if (g->nwords) {
            g->bits = malloc((size_t)g->nwords * sizeof *g->bits);
            if (!g->bits) {
                free(g);
                return;
            }
            memcpy(g->bits, base->chg->bits, (size_t)g->nwords * sizeof *g->bits);
        }
    }
    d->chg = g;
}

/* Bytes [off, off+n) were written (n may be 0) and the size is new_size:
 * those pages are marked, and cut follows the size down. */
static void changes_note(memos_entry *d, uint64_t off, uint64_t n, uint64_t new_size)
{
    changes *g = d->chg;
    if (!g)
        return;
    if (new_size < g->cut)
        g->cut = new_size;
    if (!n)
        return;
    uint64_t first = off / MEMOS_PAGE_SIZE, last = (off + n - 1) / MEMOS_PAGE_SIZE;
    uint64_t need = last / 64 + 1;
    if (need > UINT32_MAX) {
        changes_free(d);
        return;
    }
    if (need > g->nwords) {
        uint64_t grow = need < 2 * (uint64_t)g->nwords ? 2 * (uint64_t)g->nwords : need;
        if (grow > UINT32_MAX)
            grow = need;
        uint64_t *b = realloc(g->bits, (size_t)grow * sizeof *b);
        if (!b) {
            changes_free(d);
            return;
        }
        memset(b + g->nwords, 0, (size_t)(grow - g->nwords) * sizeof *b);
        g->bits = b;
        g->nwords = (uint32_t)grow;
    }
    for (uint64_t p = first; p <= last; ) {
        if (p % 64 == 0 && last - p >= 63) {
            g->bits[p / 64] = ~(uint64_t)0;
            p += 64;
        } else {
            g->bits[p / 64] |= (uint64_t)1 << (p % 64);
            p++;
        }
    }
}

static int changes_of(memos_cache *c, const memos_entry *e, int draft, memos_changes *out,
                      uint64_t *runs, size_t max_runs)
{
    lock(c);
    const changes *g = e->chg;
    if (!g || !e->draft != !draft) {
        unlock(c);
        return -1;
    }
    out->base_version = g->base_version;
    out->base_size = g->base_size;
    out->cut = g->cut < e->size ? g->cut : e->size;
    out->runs = 0;
    out->bytes = 0;
    uint64_t pages = (e->size + MEMOS_PAGE_SIZE - 1) / MEMOS_PAGE_SIZE;
    uint64_t limit = (uint64_t)g->nwords * 64 < pages ? (uint64_t)g->nwords * 64 : pages;
    uint64_t p = 0;
    while (p < limit) {
        uint64_t w = g->bits[p / 64] >> (p % 64);
        if (!w) {
            p = (p / 64 + 1) * 64;
            continue;
        }
        p += (uint64_t)__builtin_ctzll(w);
        if (p >= limit)
            break;
        uint64_t start = p;
        while (p < limit && (g->bits[p / 64] >> (p % 64) & 1))
            p++;
        uint64_t off = start * MEMOS_PAGE_SIZE, end = p * MEMOS_PAGE_SIZE;
        if (end > e->size)
            end = e->size;
        if (out->runs < max_runs && runs) {
            runs[2 * out->runs] = off;
            runs[2 * out->runs + 1] = end - off;
        }
        out->runs++;
        out->bytes += end - off;
    }
    unlock(c);
    return 0;
}

int memos_entry_changes(memos_cache *c, const memos_entry *e, memos_changes *out,
                        uint64_t *runs, size_t max_runs)
{
    return changes_of(c, e, 0, out, runs, max_runs);
}

int memos_draft_changes(memos_cache *c, const memos_entry *d, memos_changes *out,
                        uint64_t *runs, size_t max_runs)
{
    return changes_of(c, d, 1, out, runs, max_runs);
}

/* ---- debugging ---- */

#define FAIL(...) do { snprintf(why, whylen, __VA_ARGS__); rc = MEMOS_EINVAL; goto out; } while (0)

/* Own every page of run r in the ownership bitmap; 0 on a conflict. */
static int own_run(const memos_cache *c, uint8_t *owned, arena_run r, char *why, size_t whylen)
{
    for (uint32_t p = r.page; p < r.page + r.npages; p++) {
        if (!arena_page_allocated(&c->ar, p)) {
            snprintf(why, whylen, "cache: page %u held by an entry is free in the arena", p);
            return 0;
        }
        if (owned[p / 8] & (1u << (p % 8))) {
            snprintf(why, whylen, "cache: page %u owned twice", p);
            return 0;
        }
        owned[p / 8] |= (uint8_t)(1u << (p % 8));
    }
    return 1;
}

/*
 * Invariants:
 *   arena, index and policy each pass their own check;
 *   every live entry is in the index (found under its key) and on the policy
 *   list, exactly once, and is neither draft nor dead;
 *   slots == live entries == index entries == policy nodes;
 *   drafts, dead_pinned, bytes_used, bytes_draft equal what the entries say;
 *   a dead entry is pinned (else it would have been freed);
 *   every extent is allocated in the arena, owned by one entry only, all but
 *   the last a whole aligned block, and each ptr matches the arena;
 *   pages held == ceil(size / 4 KiB) for an entry not inside a write;
 *   pages owned by entries == the arena's pages_used (no leak).
 */
int memos_check(memos_cache *c, char *why, size_t whylen)
{
    char dummy[8];
    if (!why || !whylen) {
        why = dummy;
        whylen = sizeof dummy;
    }
    why[0] = 0;
    lock(c);
    int rc = MEMOS_OK;
    uint64_t slots_bits = arena_page_slots(&c->ar);
    uint8_t *owned = calloc(slots_bits / 8 + 1, 1);
    if (!owned)
        FAIL("cache: no memory for the check");
    if ((rc = arena_check(&c->ar, why, whylen)) != MEMOS_OK)
        goto out;
    if ((rc = index_check(&c->idx, why, whylen)) != MEMOS_OK)
        goto out;
    if ((rc = policy_check(&c->pol, why, whylen)) != MEMOS_OK)
        goto out;
    uint64_t live = 0, drafts = 0, dead = 0, bytes_used = 0, bytes_draft = 0, pages = 0;
    uint64_t guarded = 0, guarded_pages = 0;
    for (memos_entry *e = c->all.all_next; e != &c->all; e = e->all_next) {
        if (e->prefetched && !e->live)
            FAIL("cache: a non-live entry is guarded as a prefetch");
        guarded += e->prefetched != 0;
        guarded_pages += e->prefetched ? e->pages : 0;
        if (e->all_next->all_prev != e)
            FAIL("cache: all-entries list broken");
        if (e->live + e->dead + e->draft != 1)
            FAIL("cache: entry in %d states", e->live + e->dead + e->draft);
        if (e->live) {
            live++;
            bytes_used += e->size;
            if (index_find(&c->idx, e->inode.key, e->inode.klen, e->inode.hash) != &e->inode)
                FAIL("cache: live entry not found in the index under its key");
            if (!e->pnode.linked)
                FAIL("cache: live entry missing from the policy");
            if (e->inode.hash != index_hash(e->inode.key, e->inode.klen))
                FAIL("cache: live entry with a stale hash");
        } else {
            if (e->pnode.linked)
                FAIL("cache: non-live entry on the policy list");
            if (e->inode.key &&
                index_find(&c->idx, e->inode.key, e->inode.klen, e->inode.hash) == &e->inode)
                FAIL("cache: non-live entry in the index");
        }
        if (e->dead) {
            dead++;
            if (e->refs == 0)
                FAIL("cache: dead entry without a reference was not freed");
        }
        if (e->draft) {
            drafts++;
            bytes_draft += e->size;
        }
        uint64_t held = 0;
        for (uint32_t i = 0; i < e->next; i++) {
            arena_run r = e->ext[i].run;
            if (i + 1 < e->next && (r.npages != MEMOS_PAGES_PER_BLOCK || r.page % MEMOS_PAGES_PER_BLOCK))
                FAIL("cache: extent %u of %u is not a whole block", i, e->next);
            if (r.npages == 0 || r.page % MEMOS_PAGES_PER_BLOCK + r.npages > MEMOS_PAGES_PER_BLOCK)
                FAIL("cache: extent %u crosses a block", i);
            if (!own_run(c, owned, r, why, whylen)) {
                rc = MEMOS_EINVAL;
                goto out;
            }
            if (e->ext[i].ptr != arena_ptr(&c->ar, r.page))
                FAIL("cache: extent %u has a stale address", i);
            held += r.npages;
        }
        if (e->moving.run.npages) {
            if (!e->busy)
                FAIL("cache: parked tail outside a write");
            if (!own_run(c, owned, e->moving.run, why, whylen)) {
                rc = MEMOS_EINVAL;
                goto out;
            }
            pages += e->moving.run.npages;
        }
        if (held != e->pages)
            FAIL("cache: entry holds %llu pages, counter says %llu",
                 (unsigned long long)held, (unsigned long long)e->pages);
        if (!e->busy && held != pages_for(e->size))
            FAIL("cache: entry of %llu bytes holds %llu pages",
                 (unsigned long long)e->size, (unsigned long long)held);
        pages += held;
    }
    if (guarded_pages != c->prefetch_pages)
        FAIL("cache: guarded prefetches hold %llu pages, counter says %llu",
             (unsigned long long)guarded_pages, (unsigned long long)c->prefetch_pages);
    if (guarded != c->st.prefetch_guarded)
        FAIL("cache: %llu guarded prefetches, counter says %llu",
             (unsigned long long)guarded, (unsigned long long)c->st.prefetch_guarded);
    if (live != c->st.slots || live != index_entries(&c->idx) || live != policy_count(&c->pol))
        FAIL("cache: %llu live entries, slots %llu, index %llu, policy %llu",
             (unsigned long long)live, (unsigned long long)c->st.slots,
             (unsigned long long)index_entries(&c->idx),
             (unsigned long long)policy_count(&c->pol));
    if (drafts != c->st.drafts)
        FAIL("cache: %llu drafts, counter says %llu",
             (unsigned long long)drafts, (unsigned long long)c->st.drafts);
    if (dead != c->st.dead_pinned)
        FAIL("cache: %llu dead entries, counter says %llu",
             (unsigned long long)dead, (unsigned long long)c->st.dead_pinned);
    if (bytes_used != c->st.bytes_used || bytes_draft != c->st.bytes_draft)
        FAIL("cache: byte counters disagree with the entries");
    for (unsigned i = 0; i < c->ntenants; i++) {
        tenant *t = &c->tenants[i];
        uint64_t tb = 0, ts = 0;
        for (memos_entry *e = c->all.all_next; e != &c->all; e = e->all_next) {
            if (e->tenant == i + 1) {
                if (!e->live)
                    FAIL("cache: a non-live entry counted to tenant %u", i);
                tb += e->pages * MEMOS_PAGE_SIZE;
                ts++;
            } else if (e->live && t->len && agent_len(e->inode.key, e->inode.klen) == t->len
                       && memcmp(e->inode.key, t->name, t->len) == 0) {
                FAIL("cache: a live entry of tenant %u is not counted to it", i);
            }
        }
        if (tb != t->bytes || ts != t->slots)
            FAIL("cache: tenant %u holds %llu bytes in %llu slots, counters say %llu in %llu",
                 i, (unsigned long long)tb, (unsigned long long)ts,
                 (unsigned long long)t->bytes, (unsigned long long)t->slots);
    }
    if (pages != arena_pages_used(&c->ar))
        FAIL("cache: entries own %llu pages, arena has %llu in use (leak)",
             (unsigned long long)pages, (unsigned long long)arena_pages_used(&c->ar));
out:
    unlock(c);
    free(owned);
    return rc;
}
