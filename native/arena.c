/*
 * arena.c — the memory tier of memosfs.
 *
 * Where the memory comes from.  Each superblock is its own anonymous private
 * mapping of 2 MiB, aligned to 2 MiB (we map 4 MiB, then unmap the head and
 * the tail around the aligned middle) and advised MADV_HUGEPAGE so the kernel
 * may back it with one huge page; where the advice is refused (no THP) the
 * superblock is used with 4 KiB pages, nothing else changes.  Superblocks are
 * mapped when the capacity grows and unmapped only when a sweep finds them
 * entirely free while more are mapped than the capacity asks for.
 *
 *     superblock slot s (2 MiB, 2 MiB-aligned)
 *     +----------+----------+-- ... --+-----------+
 *     | block 0  | block 1  |         | block 15  |      16 blocks of 128 KiB
 *     +----------+----------+-- ... --+-----------+
 *     block b: | p0 | p1 | ... | p31 |                     32 pages of 4 KiB
 *
 *     global page number = s * 512 + b * 32 + p
 *
 * Metadata out of band.  Nothing is ever written into a free page: the state
 * of every page lives in arena_sb beside the mapping pointer, as two bitmaps
 * per block, and a page is in exactly one of three states:
 *
 *     used[b]  freed[b]
 *        1        0      allocated (held by an entry)
 *        0        1      freed, awaiting the sweep (not allocatable yet)
 *        0        0      allocatable
 *
 * The summary level lets a search skip whatever has nothing to offer:
 *
 *     per block       nfree[b] = allocatable pages
 *     per superblock  free_mask / partial_mask / dirty_mask (16 bits each:
 *                     blocks wholly free / partly free / holding freed pages)
 *     per arena       sb_free / sb_partial / sb_dirty (one bit per slot:
 *                     the superblock's mask is non-zero)
 *
 * so finding a page is two count-trailing-zeros over the arena bitmaps and
 * the superblock masks, then one over the block's bitmap.
 *
 * Allocation.  A slot's bytes are whole blocks plus one tail run of k < 32
 * contiguous pages inside a single block.  Runs go first to partly used
 * blocks, lowest superblock first, so the tails of many small slots share
 * blocks instead of fragmenting fresh ones; only then do they open a free
 * block.  Whole blocks come first-fit from the lowest superblock (packing low
 * slots leaves high ones free, so shrinking can unmap them).
 *
 * Lazy reclaim (mark-sweep).  Freeing only marks: the pages move from used[]
 * to freed[] and the block is flagged dirty; no summary changes, no unmap.
 * A sweep visits the dirty blocks only (through sb_dirty and dirty_mask),
 * turns their freed pages allocatable, which coalesces them into whole free
 * blocks and wholly free superblocks, and unmaps the free superblocks beyond
 * the target.  Marked pages are not reused before the sweep, so neighbours
 * freed together come back as one whole block rather than being nibbled by
 * small runs in between.  The sweep runs:
 *
 *   - at an allocation, when pages are pending and the allocatable pages
 *     within the capacity fall below reclaim_free_ratio (default 0.20);
 *   - at an allocation that fails for the (reclaim_fail_limit + 1)-th time in
 *     a row (default: the 4th), which then retries once;
 *   - on demand: arena_sweep / arena_reclaim (the cache's flush, a capacity
 *     change, and the cache before it reports that nothing is left).
 *
 * Capacity.  page_limit = target_sb * 512 bounds pages_used whatever is
 * mapped.  Shrinking sweeps and unmaps free superblocks at once; a superblock
 * that still holds pages stays mapped (over target) until a sweep finds it
 * free, and allocations are refused past page_limit meanwhile.
 *
 * Invariants (arena_check):
 *   used[b] & freed[b] == 0; nfree[b] == 32 - popcount(used[b] | freed[b]);
 *   the masks, the arena bitmaps and every counter equal what the blocks say;
 *   sum of allocated pages == pages_used, of freed pages == pages_pending;
 *   an unmapped slot has all-zero metadata and no bit in the arena bitmaps.
 *
 * Locking: none here; the cache lock guards every call.
 */
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "arena.h"

/* ---- types and constants ---- */

#define PPB   MEMOS_PAGES_PER_BLOCK     /* 32 */
#define BPS   MEMOS_BLOCKS_PER_SB       /* 16 */
#define SBP   ARENA_PAGES_PER_SB        /* 512 */
#define FULL_MASK  0xffffffffu
#define ALL_BLOCKS 0xffffu

/* ---- private prototypes ---- */

static char *map_superblock(int *huge);
static int   grow_slots(arena *a);
static int   map_slot(arena *a);
static void  unmap_slot(arena *a, uint32_t s);
static void  unmap_over_target(arena *a);
static void  set_bit(uint64_t *bm, uint32_t s, int on);
static void  block_state(arena *a, uint32_t s, unsigned b, unsigned nfree);
static void  take(arena *a, uint32_t s, unsigned b, unsigned first, unsigned k, arena_run *out);
static void  release(arena *a, uint32_t page, unsigned n);
static int   run_in_block(uint32_t busy, unsigned k);
static int   alloc_in_partial(arena *a, unsigned k, arena_run *out);
static int   alloc_free_block(arena *a, unsigned k, arena_run *out);
static int   alloc_run(arena *a, unsigned k, arena_run *out);
static int   room_for(const arena *a, unsigned k);
static uint64_t free_now(const arena *a);
static uint32_t run_mask(unsigned first, unsigned n);
static uint64_t now_ns(void);

/* ---- API: lifetime ---- */

uint64_t arena_capacity_for(uint64_t capacity)
{
    uint64_t sbs = (capacity + MEMOS_SUPERBLOCK_SIZE - 1) / MEMOS_SUPERBLOCK_SIZE;
    if (sbs == 0)
        sbs = 1;
    return sbs * MEMOS_SUPERBLOCK_SIZE;
}

int arena_init(arena *a, uint64_t capacity)
{
    memset(a, 0, sizeof *a);
    a->reclaim_free_ratio = ARENA_RECLAIM_FREE_RATIO;
    a->reclaim_fail_limit = ARENA_RECLAIM_FAIL_LIMIT;
    return arena_set_capacity(a, capacity);
}

void arena_destroy(arena *a)
{
    for (uint32_t s = 0; s < a->nslots; s++)
        if (a->sb[s].base)
            munmap(a->sb[s].base, MEMOS_SUPERBLOCK_SIZE);
    free(a->sb);
    free(a->sb_free);
    free(a->sb_partial);
    free(a->sb_dirty);
    memset(a, 0, sizeof *a);
}

/* Grow: map superblocks until nmapped == target (a failure unmaps what this
 * call mapped and leaves the capacity unchanged).  Shrink: sweep, then unmap
 * free superblocks from the top; busy ones wait for a later sweep. */
int arena_set_capacity(arena *a, uint64_t capacity)
{
    uint64_t target = arena_capacity_for(capacity) / MEMOS_SUPERBLOCK_SIZE;
    if (target > UINT32_MAX / SBP)
        return MEMOS_ENOMEM;
    if (a->pages_pending)
        arena_sweep(a);
    uint32_t before = a->nmapped;
    while (a->nmapped < target) {
        int rc = map_slot(a);
        if (rc != MEMOS_OK) {
            int saved = errno;
            for (uint32_t s = a->nslots; s-- > 0 && a->nmapped > before;)
                if (a->sb[s].base && a->sb[s].free_mask == ALL_BLOCKS)
                    unmap_slot(a, s);
            errno = saved;
            return rc;
        }
    }
    a->target_sb = (uint32_t)target;
    a->page_limit = target * SBP;
    a->reclaim_below = (uint64_t)(a->reclaim_free_ratio * (double)a->page_limit);
    unmap_over_target(a);
    return MEMOS_OK;
}

/* MEMOS_OK, or MEMOS_EINVAL when free_ratio is outside [0, 1]. */
int arena_set_reclaim(arena *a, double free_ratio, unsigned fail_limit)
{
    if (!(free_ratio >= 0.0 && free_ratio <= 1.0))
        return MEMOS_EINVAL;
    a->reclaim_free_ratio = free_ratio;
    a->reclaim_fail_limit = fail_limit;
    a->reclaim_below = (uint64_t)(free_ratio * (double)a->page_limit);
    return MEMOS_OK;
}

/* ---- API: allocation ---- */

int arena_alloc_block(arena *a, arena_run *out)
{
    return alloc_run(a, PPB, out);
}

int arena_alloc_pages(arena *a, unsigned k, arena_run *out)
{
    assert(k >= 1 && k <= PPB);
    return alloc_run(a, k, out);
}

/* Grow run r in place to newk pages if the pages after it are allocatable
 * (pages freed but not yet swept are not).  A refusal here is not counted
 * as an allocation failure: the caller falls back to a fresh run. */
int arena_extend(arena *a, arena_run *r, unsigned newk)
{
    assert(newk > r->npages && newk <= PPB);
    unsigned first = r->page % PPB;
    if (first + newk > PPB)
        return MEMOS_ENOMEM;
    if (arena_fail_tick(a))
        return MEMOS_ENOMEM;
    a->last_injected = 0;
    unsigned extra = newk - r->npages;
    if (!room_for(a, extra))
        return MEMOS_ENOMEM;
    uint32_t s = r->page / SBP, b = (r->page / PPB) % BPS;
    arena_sb *sb = &a->sb[s];
    if ((sb->used[b] | sb->freed[b]) & run_mask(first + r->npages, extra))
        return MEMOS_ENOMEM;
    arena_run tail;
    take(a, s, b, first + r->npages, extra, &tail);
    r->npages = newk;
    return MEMOS_OK;
}

void arena_trim(arena *a, arena_run *r, unsigned newk)
{
    assert(newk >= 1 && newk <= r->npages);
    if (newk == r->npages)
        return;
    release(a, r->page + newk, r->npages - newk);
    r->npages = newk;
}

void arena_free(arena *a, arena_run r)
{
    assert(r.npages >= 1 && r.npages <= PPB);
    release(a, r.page, r.npages);
}

void *arena_ptr(const arena *a, uint32_t page)
{
    uint32_t s = page / SBP;
    assert(s < a->nslots && a->sb[s].base);
    return a->sb[s].base + (size_t)(page % SBP) * MEMOS_PAGE_SIZE;
}

/*
 * arena_sweep — the reclaim pass: every block marked dirty gets its freed
 * pages back as allocatable, then the wholly free superblocks beyond the
 * target are unmapped.  Costs O(dirty blocks + words of sb_dirty), not
 * O(capacity).  Returns the superblocks unmapped.
 */
size_t arena_sweep(arena *a)
{
    uint64_t t0 = now_ns();
    uint32_t nwords = a->nslots / 64;
    for (uint32_t w = 0; w < nwords; w++) {
        uint64_t bits = a->sb_dirty[w];
        a->sb_dirty[w] = 0;
        while (bits) {
            uint32_t s = w * 64 + (uint32_t)__builtin_ctzll(bits);
            bits &= bits - 1;
            arena_sb *sb = &a->sb[s];
            unsigned m = sb->dirty_mask;
            while (m) {
                unsigned b = (unsigned)__builtin_ctz(m);
                m &= m - 1;
                unsigned n = (unsigned)__builtin_popcount(sb->freed[b]);
                sb->freed[b] = 0;
                block_state(a, s, b, sb->nfree[b] + n);
            }
            a->pages_pending -= sb->pending;
            sb->pending = 0;
            sb->dirty_mask = 0;
        }
    }
    assert(a->pages_pending == 0);
    uint32_t before = a->nmapped;
    unmap_over_target(a);
    a->fail_streak = 0;
    a->reclaim_runs++;
    a->sweep_ns = now_ns() - t0;
    if (a->sweep_ns > a->sweep_ns_max)
        a->sweep_ns_max = a->sweep_ns;
    return before - a->nmapped;
}

uint64_t arena_reclaim(arena *a)
{
    uint64_t n = a->pages_pending;
    if (n)
        arena_sweep(a);
    return n;
}

/* ---- API: counters ---- */

uint64_t arena_pages_used(const arena *a) { return a->pages_used; }
uint64_t arena_pages_pending(const arena *a) { return a->pages_pending; }
uint64_t arena_superblocks(const arena *a) { return a->nmapped; }
uint64_t arena_page_limit(const arena *a) { return a->page_limit; }
uint64_t arena_page_slots(const arena *a) { return (uint64_t)a->nslots * SBP; }

uint64_t arena_pages_free(const arena *a)
{
    return a->pages_used >= a->page_limit ? 0 : a->page_limit - a->pages_used;
}

double arena_fragmentation(const arena *a)
{
    return a->avail_pages ? (double)a->frag_pages / (double)a->avail_pages : 0.0;
}

int arena_page_allocated(const arena *a, uint32_t page)
{
    uint32_t s = page / SBP;
    if (s >= a->nslots || !a->sb[s].base)
        return 0;
    uint32_t b = (page / PPB) % BPS;
    return (a->sb[s].used[b] >> (page % PPB)) & 1u;
}

/* ---- API: failure injection ---- */

void arena_fail_after(arena *a, long n)
{
    a->fail_countdown = n > 0 ? n : 0;
}

int arena_fail_tick(arena *a)
{
    if (a->fail_countdown > 0 && --a->fail_countdown == 0) {
        a->last_injected = 1;
        return 1;
    }
    return 0;
}

/* ---- private helpers ---- */

static uint32_t run_mask(unsigned first, unsigned n)
{
    assert(n >= 1 && first + n <= PPB);
    uint32_t m = n == PPB ? FULL_MASK : ((1u << n) - 1u);
    return m << first;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int room_for(const arena *a, unsigned k)
{
    return a->pages_used + k <= a->page_limit;
}

/* Allocatable pages within the capacity (pending pages do not count). */
static uint64_t free_now(const arena *a)
{
    uint64_t busy = a->pages_used + a->pages_pending;
    return busy >= a->page_limit ? 0 : a->page_limit - busy;
}

static void set_bit(uint64_t *bm, uint32_t s, int on)
{
    uint64_t bit = 1ull << (s % 64);
    if (on)
        bm[s / 64] |= bit;
    else
        bm[s / 64] &= ~bit;
}

/* k pages (1..32): the triggers of the sweep, then the search. */
static int alloc_run(arena *a, unsigned k, arena_run *out)
{
    if (arena_fail_tick(a))
        return MEMOS_ENOMEM;
    a->last_injected = 0;
    if (a->pages_pending && free_now(a) < a->reclaim_below)
        arena_sweep(a);
    for (int retried = 0;; retried = 1) {
        if (room_for(a, k) &&
            ((k < PPB && alloc_in_partial(a, k, out) == MEMOS_OK) ||
             alloc_free_block(a, k, out) == MEMOS_OK)) {
            a->fail_streak = 0;
            return MEMOS_OK;
        }
        if (retried || ++a->fail_streak <= a->reclaim_fail_limit || !a->pages_pending)
            return MEMOS_ENOMEM;
        arena_sweep(a);
    }
}

/* Record that block b of slot s now has `nfree` allocatable pages, keeping
 * the superblock masks, the arena bitmaps and the counters in step. */
static void block_state(arena *a, uint32_t s, unsigned b, unsigned nfree)
{
    arena_sb *sb = &a->sb[s];
    unsigned old = sb->nfree[b];
    if (old == nfree)
        return;
    uint16_t bit = (uint16_t)(1u << b);
    sb->nfree[b] = (uint8_t)nfree;
    sb->free_pages = (uint16_t)(sb->free_pages + nfree - old);
    a->avail_pages += (uint64_t)nfree - old;   /* wraps back correctly when smaller */
    int was_part = old > 0 && old < PPB, is_part = nfree > 0 && nfree < PPB;
    a->frag_pages += (uint64_t)(is_part ? nfree : 0) - (was_part ? old : 0);
    if ((old == PPB) != (nfree == PPB)) {
        sb->free_mask ^= bit;
        set_bit(a->sb_free, s, sb->free_mask != 0);
    }
    if (was_part != is_part) {
        sb->partial_mask ^= bit;
        set_bit(a->sb_partial, s, sb->partial_mask != 0);
    }
}

/* Allocate pages first..first+k-1 of block b of slot s (all allocatable). */
static void take(arena *a, uint32_t s, unsigned b, unsigned first, unsigned k, arena_run *out)
{
    arena_sb *sb = &a->sb[s];
    uint32_t m = run_mask(first, k);
    assert(((sb->used[b] | sb->freed[b]) & m) == 0 && "page allocated twice");
    sb->used[b] |= m;
    a->pages_used += k;
    block_state(a, s, b, sb->nfree[b] - k);
    out->page = s * SBP + b * PPB + first;
    out->npages = k;
}

/* Mark n pages from `page` freed: they wait for the sweep. */
static void release(arena *a, uint32_t page, unsigned n)
{
    uint32_t s = page / SBP, b = (page / PPB) % BPS;
    arena_sb *sb = &a->sb[s];
    uint32_t m = run_mask(page % PPB, n);
    assert((sb->used[b] & m) == m && "page freed twice");
    sb->used[b] &= ~m;
    sb->freed[b] |= m;
    sb->pending = (uint16_t)(sb->pending + n);
    a->pages_used -= n;
    a->pages_pending += n;
    if (!sb->dirty_mask)
        set_bit(a->sb_dirty, s, 1);
    sb->dirty_mask |= (uint16_t)(1u << b);
}

/* First page of k contiguous clear bits in `busy`, or -1. */
static int run_in_block(uint32_t busy, unsigned k)
{
    uint32_t fr = ~busy, x = fr;
    for (unsigned i = 1; i < k && x; i++)
        x &= fr >> i;
    return x ? __builtin_ctz(x) : -1;
}

static int alloc_in_partial(arena *a, unsigned k, arena_run *out)
{
    uint32_t nwords = a->nslots / 64;
    for (uint32_t w = 0; w < nwords; w++) {
        for (uint64_t bits = a->sb_partial[w]; bits; bits &= bits - 1) {
            uint32_t s = w * 64 + (uint32_t)__builtin_ctzll(bits);
            arena_sb *sb = &a->sb[s];
            if (sb->free_pages < k)
                continue;
            for (unsigned m = sb->partial_mask; m; m &= m - 1) {
                unsigned b = (unsigned)__builtin_ctz(m);
                if (sb->nfree[b] < k)
                    continue;
                int p = run_in_block(sb->used[b] | sb->freed[b], k);
                if (p >= 0) {
                    take(a, s, b, (unsigned)p, k, out);
                    return MEMOS_OK;
                }
            }
        }
    }
    return MEMOS_ENOMEM;
}

/* The first k pages of the lowest wholly free block. */
static int alloc_free_block(arena *a, unsigned k, arena_run *out)
{
    uint32_t nwords = a->nslots / 64;
    for (uint32_t w = 0; w < nwords; w++) {
        if (!a->sb_free[w])
            continue;
        uint32_t s = w * 64 + (uint32_t)__builtin_ctzll(a->sb_free[w]);
        assert(a->sb[s].base && a->sb[s].free_mask);
        take(a, s, (unsigned)__builtin_ctz(a->sb[s].free_mask), 0, k, out);
        return MEMOS_OK;
    }
    return MEMOS_ENOMEM;
}

static char *map_superblock(int *huge)
{
    size_t len = 2 * (size_t)MEMOS_SUPERBLOCK_SIZE;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    uintptr_t al = ((uintptr_t)p + MEMOS_SUPERBLOCK_SIZE - 1) &
                   ~(uintptr_t)(MEMOS_SUPERBLOCK_SIZE - 1);
    size_t head = al - (uintptr_t)p;
    size_t tail = len - head - MEMOS_SUPERBLOCK_SIZE;
    if (head)
        munmap(p, head);
    if (tail)
        munmap((char *)al + MEMOS_SUPERBLOCK_SIZE, tail);
#ifdef MADV_HUGEPAGE
    *huge = madvise((void *)al, MEMOS_SUPERBLOCK_SIZE, MADV_HUGEPAGE) == 0;
#else
    *huge = 0;
#endif
    return (char *)al;
}

/* Prefault: the next mapped superblock nobody has prefaulted yet, marked so
 * that it is handed out once (cache lock held).  The caller faults it in with
 * the lock dropped, by madvise(MADV_POPULATE_WRITE), which fills page tables
 * and memory without touching contents, so allocations may go on in it
 * meanwhile (and a superblock unmapped meanwhile only makes the madvise fail).
 * The first write into a superblock then pays no page fault: on a virtual
 * machine the first touch of a huge page has been measured at ~12 ms.  Only
 * `ahead` superblocks beyond what is allocated are faulted in, so a large,
 * little-used memory tier does not take all its memory at once. */
char *arena_next_unfaulted(arena *a, uint32_t ahead)
{
    /* allocation takes the lowest slots first: stay `ahead` superblocks
     * beyond the ones the allocated pages would fill */
    uint64_t limit = a->pages_used / SBP + ahead;
    for (uint32_t s = 0; s < a->nslots && s < limit; s++) {
        if (a->sb[s].base && !a->sb[s].faulted) {
            a->sb[s].faulted = 1;
            return a->sb[s].base;
        }
    }
    return NULL;
}

/* Double the slot array and the three arena bitmaps (64 slots at least). */
static int grow_slots(arena *a)
{
    uint32_t n = a->nslots ? a->nslots * 2 : 64;
    size_t ow = a->nslots / 64, nw = n / 64;
    arena_sb *nsb = realloc(a->sb, n * sizeof *nsb);
    if (!nsb)
        return MEMOS_ENOMEM;
    a->sb = nsb;
    memset(nsb + a->nslots, 0, (n - a->nslots) * sizeof *nsb);
    uint64_t **bms[3] = { &a->sb_free, &a->sb_partial, &a->sb_dirty };
    for (int i = 0; i < 3; i++) {
        uint64_t *bm = realloc(*bms[i], nw * sizeof *bm);
        if (!bm)
            return MEMOS_ENOMEM;   /* arrays already grown stay grown: harmless */
        memset(bm + ow, 0, (nw - ow) * sizeof *bm);
        *bms[i] = bm;
    }
    a->nslots = n;
    return MEMOS_OK;
}

/* Map one superblock into the first unmapped slot (growing the slot array). */
static int map_slot(arena *a)
{
    uint32_t s = 0;
    while (s < a->nslots && a->sb[s].base)
        s++;
    if (s == a->nslots && grow_slots(a) != MEMOS_OK)
        return MEMOS_ENOMEM;
    int huge = 0;
    char *base = map_superblock(&huge);
    if (!base)
        return MEMOS_ESYS;
    arena_sb *sb = &a->sb[s];
    memset(sb, 0, sizeof *sb);
    sb->base = base;
    sb->huge = (uint8_t)huge;
    memset(sb->nfree, PPB, sizeof sb->nfree);
    sb->free_mask = ALL_BLOCKS;
    sb->free_pages = SBP;
    set_bit(a->sb_free, s, 1);
    a->avail_pages += SBP;
    a->huge_pages |= huge;
    a->nmapped++;
    return MEMOS_OK;
}

static void unmap_slot(arena *a, uint32_t s)
{
    arena_sb *sb = &a->sb[s];
    assert(sb->base && sb->free_mask == ALL_BLOCKS && !sb->dirty_mask);
    munmap(sb->base, MEMOS_SUPERBLOCK_SIZE);
    memset(sb, 0, sizeof *sb);
    set_bit(a->sb_free, s, 0);
    a->avail_pages -= SBP;
    a->nmapped--;
}

/* Unmap wholly free superblocks, highest first, while over the target. */
static void unmap_over_target(arena *a)
{
    for (uint32_t s = a->nslots; s-- > 0 && a->nmapped > a->target_sb;)
        if (a->sb[s].base && a->sb[s].free_mask == ALL_BLOCKS)
            unmap_slot(a, s);
}

/* ---- debugging ---- */

#define FAIL(...) do { snprintf(why, whylen, __VA_ARGS__); return MEMOS_EINVAL; } while (0)

static int bit_of(const uint64_t *bm, uint32_t s)
{
    return (int)((bm[s / 64] >> (s % 64)) & 1u);
}

int arena_check(const arena *a, char *why, size_t whylen)
{
    uint64_t used = 0, pending = 0, avail = 0, frag = 0;
    uint32_t mapped = 0;
    if (a->nslots % 64)
        FAIL("arena: %u slots, not a multiple of 64", a->nslots);
    for (uint32_t s = 0; s < a->nslots; s++) {
        const arena_sb *sb = &a->sb[s];
        if (!sb->base) {
            for (unsigned b = 0; b < BPS; b++)
                if (sb->used[b] || sb->freed[b] || sb->nfree[b])
                    FAIL("arena: unmapped slot %u has metadata", s);
            if (sb->free_mask || sb->partial_mask || sb->dirty_mask ||
                bit_of(a->sb_free, s) || bit_of(a->sb_partial, s) || bit_of(a->sb_dirty, s))
                FAIL("arena: unmapped slot %u is in a summary", s);
            continue;
        }
        mapped++;
        unsigned fm = 0, pm = 0, dm = 0, fp = 0, pend = 0;
        for (unsigned b = 0; b < BPS; b++) {
            if (sb->used[b] & sb->freed[b])
                FAIL("arena: sb %u block %u: page both allocated and freed", s, b);
            unsigned nf = PPB - (unsigned)__builtin_popcount(sb->used[b] | sb->freed[b]);
            if (sb->nfree[b] != nf)
                FAIL("arena: sb %u block %u nfree %u, bitmaps say %u", s, b, sb->nfree[b], nf);
            fm |= (unsigned)(nf == PPB) << b;
            pm |= (unsigned)(nf > 0 && nf < PPB) << b;
            dm |= (unsigned)(sb->freed[b] != 0) << b;
            fp += nf;
            frag += nf > 0 && nf < PPB ? nf : 0;
            pend += (unsigned)__builtin_popcount(sb->freed[b]);
            used += (unsigned)__builtin_popcount(sb->used[b]);
        }
        if (fm != sb->free_mask || pm != sb->partial_mask || dm != sb->dirty_mask ||
            fp != sb->free_pages || pend != sb->pending)
            FAIL("arena: sb %u summary %04x/%04x/%04x/%u/%u, blocks say %04x/%04x/%04x/%u/%u",
                 s, sb->free_mask, sb->partial_mask, sb->dirty_mask, sb->free_pages,
                 sb->pending, fm, pm, dm, fp, pend);
        if (bit_of(a->sb_free, s) != (fm != 0) || bit_of(a->sb_partial, s) != (pm != 0) ||
            bit_of(a->sb_dirty, s) != (dm != 0))
            FAIL("arena: sb %u: arena bitmaps disagree with its masks", s);
        avail += fp;
        pending += pend;
    }
    if (mapped != a->nmapped)
        FAIL("arena: %u superblocks mapped, counter says %u", mapped, a->nmapped);
    if (used != a->pages_used)
        FAIL("arena: bitmaps hold %llu pages, counter says %llu",
             (unsigned long long)used, (unsigned long long)a->pages_used);
    if (pending != a->pages_pending)
        FAIL("arena: %llu pages freed, counter says %llu",
             (unsigned long long)pending, (unsigned long long)a->pages_pending);
    if (avail != a->avail_pages || frag != a->frag_pages)
        FAIL("arena: %llu/%llu allocatable/fragmented, counters say %llu/%llu",
             (unsigned long long)avail, (unsigned long long)frag,
             (unsigned long long)a->avail_pages, (unsigned long long)a->frag_pages);
    if (a->nmapped < a->target_sb)
        FAIL("arena: %u mapped below target %u", a->nmapped, a->target_sb);
    return MEMOS_OK;
}
