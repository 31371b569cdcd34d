/*
 * memos.h — the public contract of the memosfs C core.
 *
 * The core holds the memory tier of the KV-cache: an arena of page frames
 * (arena.c), an index from slot key to entry (index.c), an eviction policy
 * (policy.c), and the cache that ties them together (cache.c).  Python reaches
 * it only through pymodule.c (memosfs._native).
 *
 * Entries.  A slot's bytes live in an entry: a list of extents in the arena.
 * Every extent but the last is one whole 128 KiB block; the last is a run of
 * 4 KiB pages inside one block.  So byte offset `off` lives in extent
 * off / MEMOS_BLOCK_SIZE, at off % MEMOS_BLOCK_SIZE inside it.
 *
 * Life of an entry:
 *
 *     draft_new ──write/truncate──► draft ──publish(key)──► live (in index + policy)
 *         │                                                    │  remove / replace /
 *         └──draft_free──► freed            freed ◄──refs==0── dead ◄─ evict
 *
 * A reference (`refs`) pins an entry: a pinned entry is never a victim and its
 * pages never move or get freed, so its bytes may be copied without the cache
 * lock.  get/peek/publish return a reference; memos_unpin drops it.  A live
 * entry replaced by a newer version, removed, or evicted becomes dead and is
 * freed when its last reference goes.
 *
 * Locking.  One mutex per cache guards index, policy, arena and every entry's
 * metadata.  Functions named memos_* take it themselves.  Copies of slot bytes
 * (memos_entry_read, memos_draft_write) run without it, on pinned entries.
 * The eviction callback runs without the lock, on a pinned victim.
 *
 * Return codes: every int-returning function returns MEMOS_OK or a negative
 * MEMOS_E* code, documented at the function.
 */
#ifndef MEMOS_H
#define MEMOS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#define MEMOS_OK        0
#define MEMOS_ENOMEM   (-1)  /* no memory even after evicting every candidate */
#define MEMOS_ETOOBIG  (-2)  /* larger than the whole memory tier */
#define MEMOS_ENOENT   (-3)  /* no such key */
#define MEMOS_EINVAL   (-4)  /* bad argument */
#define MEMOS_ESYS     (-5)  /* the OS refused (mmap); errno says why */
#define MEMOS_EBUSY    (-6)  /* the callback refused to let a victim go */
#define MEMOS_EAGAIN   (-7)  /* room needs a wait and the thread does not wait */

#define MEMOS_PAGE_SIZE        4096u
#define MEMOS_BLOCK_SIZE       (128u * 1024u)
#define MEMOS_SUPERBLOCK_SIZE  (2u * 1024u * 1024u)
#define MEMOS_PAGES_PER_BLOCK  (MEMOS_BLOCK_SIZE / MEMOS_PAGE_SIZE)        /* 32 */
#define MEMOS_BLOCKS_PER_SB    (MEMOS_SUPERBLOCK_SIZE / MEMOS_BLOCK_SIZE) /* 16 */
#define MEMOS_KEY_MAX          16384u
#define MEMOS_TENANT_MAX       1024u   /* agents with a quota */
#define MEMOS_TENANT_NAME_MAX  255u    /* an agent's name, bytes */

typedef struct memos_cache memos_cache;
typedef struct memos_entry memos_entry;

/* Called for each victim of an eviction run, without the cache lock, with the
 * victim pinned by the evictor.  Return MEMOS_OK to let it go; anything else
 * keeps the victim in the cache (it is then skipped by this run). */
typedef int (*memos_evict_fn)(void *ctx, memos_entry *victim);

typedef struct memos_stats {
    uint64_t lookups;          /* memos_get calls */
    uint64_t hits;             /* memos_get calls that found the key */
    uint64_t misses;           /* memos_get calls that did not */
    uint64_t inserts;          /* publishes of a new key */
    uint64_t replaces;         /* publishes over an existing key */
    uint64_t removes;          /* memos_remove calls that removed */
    uint64_t evictions;        /* entries evicted */
    uint64_t eviction_runs;    /* eviction runs (each picks up to evict_batch) */
    uint64_t evict_refused;    /* victims the callback kept */
    uint64_t alloc_failures;   /* page allocations that failed before eviction */
    uint64_t alloc_waits;      /* 50 ms waits of an allocation for other threads' write-backs or unpins */
    uint64_t slots;            /* live entries */
    uint64_t drafts;           /* drafts not yet published or freed */
    uint64_t dead_pinned;      /* dead entries kept alive by a reference */
    uint64_t pinned;           /* live entries with a reference or a sticky pin */
    uint64_t bytes_used;       /* logical bytes of live entries */
    uint64_t bytes_draft;      /* logical bytes of drafts */
    uint64_t pages_used;       /* pages allocated (live, drafts, dead) */
    uint64_t free_pages;       /* pages free within capacity */
    uint64_t capacity;         /* bytes, a multiple of MEMOS_SUPERBLOCK_SIZE */
    uint64_t superblocks;      /* superblocks mapped */
    uint64_t huge_pages;       /* 1 if MADV_HUGEPAGE was accepted */
    uint64_t evict_batch;      /* victims per run */
    uint64_t index_buckets;    /* buckets in the index */
    uint64_t index_entries;    /* entries in the index */
    double   index_load_factor;/* index_entries / (index_buckets * 4) */
    uint64_t reclaim_runs;     /* arena sweeps (lazy mark-sweep reclaim passes) */
    double   fragmentation;    /* allocatable pages not in a whole free block / allocatable pages */
    uint64_t pages_pending;    /* pages freed, awaiting the sweep */
    uint64_t sweep_ns;         /* duration of the last sweep, ns */
    uint64_t sweep_ns_max;     /* longest sweep, ns */
    double   reclaim_free_ratio; /* knob: sweep when allocatable / capacity falls below it */
    uint64_t reclaim_fail_limit; /* knob: sweep after more allocation failures in a row */
    uint64_t ghost_hits_recency;   /* lru_lfu: admits found in the probation ghost */
    uint64_t ghost_hits_frequency; /* lru_lfu: admits found in the protected ghost */
    uint64_t ghost_entries;    /* lru_lfu: evicted key hashes remembered */
    uint64_t policy_probation; /* lru_lfu: entries in probation (seen once) */
    uint64_t policy_protected; /* lru_lfu: entries in protected (seen again) */
    double   policy_recency;   /* recency/frequency balance: probation target share (lru 1, lfu 0) */
    uint64_t prefetch_guarded; /* prefetched entries not yet read, kept from being victims */
    uint64_t prefetch_aged;    /* guards that ran out (passed over MEMOS_PREFETCH_PASSES times) */
    uint64_t prefetch_opened;  /* eviction walks that took guarded entries: nothing else to take */
} memos_stats;

/* ---- cache lifetime and knobs ---- */

/* Create a cache whose memory tier holds `capacity` bytes (rounded up to whole
 * superblocks, at least one).  `evict_batch` >= 1.  `cb` may be NULL.
 * Returns NULL with errno set on failure. */
memos_cache *memos_cache_new(uint64_t capacity, unsigned evict_batch,
                             memos_evict_fn cb, void *cb_ctx);
/* Free the cache and every entry (references must be gone). */
void memos_cache_free(memos_cache *c);
/* Change capacity: growing maps superblocks, shrinking evicts (through the
 * callback) until the used pages fit.  MEMOS_OK, MEMOS_EINVAL (0),
 * MEMOS_ENOMEM (pinned data does not fit: capacity unchanged), MEMOS_ESYS. */
int memos_set_capacity(memos_cache *c, uint64_t capacity);
/* MEMOS_OK or MEMOS_EINVAL (0 or > 4096). */
int memos_set_evict_batch(memos_cache *c, unsigned n);
/* Snapshot of the counters. */
void memos_get_stats(memos_cache *c, memos_stats *out);
/* Switch the eviction policy live: "lru_lfu" (the default: adaptive
 * recency/frequency hybrid, see policy.c), "lru" or "lfu".
 * MEMOS_OK or MEMOS_EINVAL (unknown name: nothing changes). */
int memos_set_policy(memos_cache *c, const char *name);
/* The current policy's name (a static string). */
const char *memos_policy_name(memos_cache *c);
/* Lazy reclaim triggers of the arena: a sweep runs when the allocatable part
 * of the capacity falls below `free_ratio` (0..1, default 0.20; 0 = never for
 * this reason) and after more than `fail_limit` (default 3) allocation
 * failures in a row.  MEMOS_OK or MEMOS_EINVAL (ratio outside 0..1). */
int memos_set_reclaim(memos_cache *c, double free_ratio, unsigned fail_limit);
/* Sweep now (flush): every freed page becomes allocatable again, free
 * superblocks over the capacity go back to the OS.  Returns the pages
 * reclaimed (>= 0). */
long memos_sweep(memos_cache *c);
int  memos_prefault(memos_cache *c, unsigned ahead); /* fault in a superblock: 1, 0 none now, -1 unsupported */

/* ---- lookups ---- */

/* Find `key`; on success pin it, touch the policy, count a hit, and store
 * it in *out.  MEMOS_OK or MEMOS_ENOENT (counted as a miss). */
int memos_get(memos_cache *c, const void *key, size_t klen, memos_entry **out);
/* As memos_get, but no statistics and no policy touch (for stat/ls). */
int memos_peek(memos_cache *c, const void *key, size_t klen, memos_entry **out);
/* Add a reference to an entry the caller already holds. */
void memos_ref(memos_cache *c, memos_entry *e);
/* Drop one reference; frees a dead entry whose last reference this was. */
void memos_unpin(memos_cache *c, memos_entry *e);

/* ---- drafts and publish ---- */

/* A new draft, empty, or holding a copy of `base` (a pinned entry) if given.
 * MEMOS_OK, MEMOS_ENOMEM, MEMOS_ETOOBIG. */
int memos_draft_new(memos_cache *c, memos_entry *base, memos_entry **out);
/* Write n bytes at off, growing the draft (zero-filling any hole); evicts
 * through the callback when the arena is full.  Releases no lock the caller
 * holds.  MEMOS_OK, MEMOS_ENOMEM, MEMOS_ETOOBIG, MEMOS_EINVAL (not a draft). */
int memos_draft_write(memos_cache *c, memos_entry *d, uint64_t off,
                      const void *src, size_t n);
/* Set the draft's size (shrinking frees pages, growing zero-fills). */
int memos_draft_truncate(memos_cache *c, memos_entry *d, uint64_t size);
/* Whether a draft's writes, truncates and copies may evict to make room
 * (default 1).  With 0 they return MEMOS_ENOMEM where they would evict (a
 * tier whose evictions lose slots: nothing is evicted for a draft that may
 * still be refused); memos_draft_reserve evicts all the same. */
void memos_set_draft_evicts(memos_cache *c, int on);
/* Grow draft d (zero-filled) to size, evicting what it must, all or
 * nothing: MEMOS_ENOMEM, with nothing evicted, when even every evictable
 * entry would not make room; MEMOS_ETOOBIG beyond the tier's capacity;
 * MEMOS_EINVAL (not a draft, in use, size below its size). */
int memos_draft_reserve(memos_cache *c, memos_entry *d, uint64_t size);
/* Drop a draft that will not be published. */
void memos_draft_free(memos_cache *c, memos_entry *d);
/* Make draft d the live entry for key, replacing (and killing) any older one.
 * The caller's reference on the draft becomes a reference on the live entry.
 * version = old version + 1 (1 for a new key), unless `version` != 0 is
 * given, which is used as is.  `dirty` marks it not yet persisted.
 * MEMOS_OK, MEMOS_EINVAL (key too long, not a draft), MEMOS_ENOMEM (index). */
int memos_publish(memos_cache *c, memos_entry *d, const void *key, size_t klen,
                  uint64_t version, int dirty);

/* ---- removal and renaming ---- */

/* Remove key (the entry dies; readers keep it until they unpin).
 * MEMOS_OK or MEMOS_ENOENT. */
int memos_remove(memos_cache *c, const void *key, size_t klen);
/* Move the entry of `from` to `to`, replacing any entry at `to`.
 * MEMOS_OK, MEMOS_ENOENT, MEMOS_EINVAL, MEMOS_ENOMEM. */
int memos_rename(memos_cache *c, const void *from, size_t flen,
                 const void *to, size_t tlen);
/* Run one eviction run now (up to evict_batch victims); returns the number
 * evicted (>= 0). */
int memos_evict_run(memos_cache *c);
/* Whether allocations made by the calling thread may wait for room (other
 * threads' write-backs, replaced versions still pinned): with on != 0 they
 * return MEMOS_EAGAIN instead, and nothing changes (a request loop that
 * must not block waits in memos_wait_room on another thread, then tries
 * again).  Such a caller also gets MEMOS_EAGAIN, not MEMOS_ENOMEM, when
 * nothing can be evicted but other drafts or readers' pins hold pages (it
 * bounds that wait itself).  Per thread; returns the previous setting. */
int memos_set_nowait(int on);
/* Wait up to ms for room an allocation was told to wait for: returns 1
 * after waiting for other threads' write-backs, 2 after waiting for
 * replaced versions still pinned (none being written back), 3 after
 * waiting for other drafts or readers' pins (neither of those), 0 at once
 * when there is none of them (an allocation would evict or fail now). */
int memos_wait_room(memos_cache *c, unsigned ms);
/* Call fn(ctx, entry) for every live entry, in LRU order, most recent first,
 * under the lock: fn must not call back into the cache. */
void memos_foreach(memos_cache *c, void (*fn)(void *ctx, memos_entry *e),
                   void *ctx);

/* ---- entries (valid while the caller holds a reference) ---- */

uint64_t memos_entry_size(const memos_entry *e);        /* logical bytes */
uint64_t memos_entry_stored(const memos_entry *e);      /* bytes of pages held */
uint64_t memos_entry_version(const memos_entry *e);
uint64_t memos_entry_hits(const memos_entry *e);        /* memos_get hits */
int      memos_entry_dirty(const memos_entry *e);
int      memos_entry_live(const memos_entry *e);        /* in the index */
int      memos_entry_sticky(const memos_entry *e);

/* A prefetched entry (brought in ahead of a demand read): it is kept from
 * being a victim until its first memos_get, or until eviction walks have
 * passed over it MEMOS_PREFETCH_PASSES times, or when nothing else can be
 * evicted; guarded entries hold at most half the capacity's pages.  The caller holds a reference.  Returns 1 if guarded, 0 if not
 * (not live, or the bound is reached). */
#define MEMOS_PREFETCH_PASSES 8
int      memos_mark_prefetched(memos_cache *c, memos_entry *e);
const void *memos_entry_key(const memos_entry *e, size_t *klen);
void     memos_set_dirty(memos_cache *c, memos_entry *e, int dirty);
/* A sticky pin keeps a live entry out of eviction (user.memos.pin). */
void     memos_set_sticky(memos_cache *c, memos_entry *e, int on);

/* Tenants: an agent (a key's first component, up to '/') given a byte quota
 * keeps its live entries out of eviction while their pages total at most
 * the quota.  quota 0 removes the tenant.  EINVAL for a bad name, ENOMEM
 * when MEMOS_TENANT_MAX agents already have one. */
int      memos_tenant_set(memos_cache *c, const void *name, size_t len, uint64_t quota);
/* A tenant's quota, live bytes (pages * 4 KiB) and slots; ENOENT if none. */
int      memos_tenant_get(memos_cache *c, const void *name, size_t len, uint64_t *quota,
                          uint64_t *bytes, uint64_t *slots);
/* Copy up to n bytes at off into dst; returns the bytes copied (0 at EOF).
 * Takes no lock: the entry must be pinned (or a draft of the caller). */
size_t   memos_entry_read(const memos_entry *e, uint64_t off, void *dst, size_t n);
/* Describe up to n bytes at off as iovecs (at most max); returns the count.
 * Same rules as memos_entry_read; for writev/pwritev without a copy. */
int      memos_entry_iov(const memos_entry *e, uint64_t off, size_t n,
                         struct iovec *iov, int max);

/* What a version changed since an older version of its key: its bytes are
 * version base_version's (base_size bytes long) cut to `cut`, zero-filled to
 * its size, then overwritten at each run (offset, length: 4 KiB aligned,
 * sorted, disjoint, within its size).  base_version is the last version of
 * its lineage that was clean (written back) when a draft copied it. */
typedef struct memos_changes {
    uint64_t base_version;
    uint64_t base_size;
    uint64_t cut;
    uint64_t runs;             /* runs in all (more than max_runs: call again) */
    uint64_t bytes;            /* bytes the runs cover */
} memos_changes;
/* Fill *out and up to max_runs pairs (offset, length) into runs; 0, or -1
 * when unknown (the version must be written whole).  e is pinned. */
int      memos_entry_changes(memos_cache *c, const memos_entry *e, memos_changes *out,
                             uint64_t *runs, size_t max_runs);
/* The same for a draft d (not yet published): how it differs from the
 * clean version its lineage started from, so far. */
int      memos_draft_changes(memos_cache *c, const memos_entry *d, memos_changes *out,
                             uint64_t *runs, size_t max_runs);

/* ---- checksums ---- */

/* CRC-32C (Castagnoli) of n bytes, continuing from a previous result `crc`
 * (0 to start): memos_crc32c(memos_crc32c(0, a, na), b, nb) is the CRC of a
 * followed by b; memos_crc32c(0, "123456789", 9) == 0xE3069283.  Uses the
 * SSE4.2 crc32 instruction when the CPU has it.  Thread-safe, no lock. */
uint32_t memos_crc32c(uint32_t crc, const void *buf, size_t n);
/* memos_crc32c of n zero bytes after `crc`, in O(log n) (a file's holes). */
uint32_t memos_crc32c_zeros(uint32_t crc, uint64_t n);

/* ---- testing ---- */

/* Make the n-th next page or metadata allocation fail (0 = never). */
void memos_fail_after(memos_cache *c, long n);
/* Check that index, policy and arena agree (every live entry is in both the
 * index and the policy list exactly once, page counts add up, no page is
 * owned twice or leaked).  Returns MEMOS_OK or MEMOS_EINVAL with a reason
 * written to why (if given). */
int memos_check(memos_cache *c, char *why, size_t whylen);

#endif /* MEMOS_H */
