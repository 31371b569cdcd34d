/*
 * arena.c — the memory tier of memosfs.
 *
 * Where the memory comes from.  Each superblock is its own anonymous private
 * mapping of 2 MiB, aligned to 2 MiB (we map 4 MiB, then unmap the head and
 * the tail around the aligned middle) and advised MADV_HUGEPAGE so the kernel
 * may back it with one huge page.  Superblocks are mapped when the capacity
 * grows and unmapped only when they are entirely free.
 *
 *     superblock slot s (2 MiB, 2 MiB-aligned)
 *     +----------+----------+-- ... --+-----------+
 *     | block 0  | block 1  |         | block 15  |      16 blocks of 128 KiB
 *     +----------+----------+-- ... --+-----------+
 *     block b: | p0 | p1 | ... | p31 |                     32 pages of 4 KiB
 *
 *     global page number = s * 512 + b * 32 + p
 *
 * Metadata out of band.  Nothing is ever written into a free page: the free
 * state lives in arena_sb beside the mapping pointer:
 *
 *     used[b]   32-bit bitmap, bit p set = page p of block b allocated
 *     nfree[b]  32 - popcount(used[b])
 *     free_blocks / partial_blocks / free_pages   the summary level, so a
 *               search skips a superblock with nothing to offer in O(1)
 *
 * Allocation.  A slot's bytes are whole blocks plus one tail run of k < 32
 * contiguous pages inside a single block.  Whole blocks come first-fit from
 * the lowest superblock with a free block (packing low slots leaves high ones
 * free, so shrinking can unmap them).  Runs go first to partially used blocks
 * (starting at the superblock of the last success) so the tails of many
 * small slots share blocks instead of fragmenting fresh ones; only then do
 * they open a free block.
 *
 * Capacity.  page_limit = target_sb * 512 bounds pages_used whatever is
 * mapped.  Shrinking unmaps free superblocks at once; a superblock that still
 * holds pages stays mapped (over target) until its last page is freed, and
 * allocations are refused past page_limit meanwhile.
 *
 * Invariants (arena_check):
 *   nfree[b] == 32 - popcount(used[b]) for every block of a mapped superblock;
 *   the summary counters equal what the blocks say;
 *   sum over superblocks of allocated pages == pages_used;
 *   an unmapped slot has all-zero metadata; nmapped counts the mapped slots.
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

#include "arena.h"

/* ---- types and constants ---- */

#define PPB   MEMOS_PAGES_PER_BLOCK     /* 32 */
#define BPS   MEMOS_BLOCKS_PER_SB       /* 16 */
#define FULL_MASK 0xffffffffu

/* ---- private prototypes ---- */

static char *map_superblock(int *huge);
static int   map_slot(arena *a);
static void  unmap_slot(arena *a, uint32_t s);
static void  mark(arena *a, uint32_t page, unsigned n, int used);
static int   run_in_block(uint32_t used, unsigned k);
static int   alloc_in_partial(arena *a, unsigned k, arena_run *out);
static int   alloc_free_block(arena *a, arena_run *out);
static int   room_for(arena *a, unsigned k);
static void  reclaim_if_over(arena *a, uint32_t s);
static uint32_t run_mask(unsigned first, unsigned n);

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
    return arena_set_capacity(a, capacity);
}

void arena_destroy(arena *a)
{
    for (uint32_t s = 0; s < a->nslots; s++)
        if (a->sb[s].base)
            munmap(a->sb[s].base, MEMOS_SUPERBLOCK_SIZE);
    free(a->sb);
    memset(a, 0, sizeof *a);
}

/* Grow: map superblocks until nmapped == target (a failure unmaps what this
 * call mapped and leaves the capacity unchanged).  Shrink: unmap free
 * superblocks from the top; busy ones wait for reclaim_if_over. */
int arena_set_capacity(arena *a, uint64_t capacity)
{
    uint64_t target = arena_capacity_for(capacity) / MEMOS_SUPERBLOCK_SIZE;
    if (target > UINT32_MAX / ARENA_PAGES_PER_SB)
        return MEMOS_ENOMEM;
    uint32_t before = a->nmapped;
    while (a->nmapped < target) {
        int rc = map_slot(a);
        if (rc != MEMOS_OK) {
            int saved = errno;
            for (uint32_t s = a->nslots; s-- > 0 && a->nmapped > before;)
                if (a->sb[s].base && a->sb[s].free_blocks == BPS)
                    unmap_slot(a, s);
            errno = saved;
            return rc;
        }
    }
    a->target_sb = (uint32_t)target;
    a->page_limit = target * ARENA_PAGES_PER_SB;
    for (uint32_t s = a->nslots; s-- > 0 && a->nmapped > a->target_sb;)
        reclaim_if_over(a, s);
    return MEMOS_OK;
}

/* ---- API: allocation ---- */

int arena_alloc_block(arena *a, arena_run *out)
{
    if (arena_fail_tick(a))
        return MEMOS_ENOMEM;
    a->last_injected = 0;
    if (!room_for(a, PPB))
        return MEMOS_ENOMEM;
    return alloc_free_block(a, out);
}

int arena_alloc_pages(arena *a, unsigned k, arena_run *out)
{
    assert(k >= 1 && k <= PPB);
    if (k == PPB)
        return arena_alloc_block(a, out);
    if (arena_fail_tick(a))
        return MEMOS_ENOMEM;
    a->last_injected = 0;
    if (!room_for(a, k))
        return MEMOS_ENOMEM;
    if (alloc_in_partial(a, k, out) == MEMOS_OK)
        return MEMOS_OK;
    if (alloc_free_block(a, out) != MEMOS_OK)
        return MEMOS_ENOMEM;
    /* alloc_free_block took all 32 pages: give back the tail. */
    arena_trim(a, out, k);
    return MEMOS_OK;
}

/* Grow run r in place to newk pages if the pages after it are free. */
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
    uint32_t s = r->page / ARENA_PAGES_PER_SB, b = (r->page / PPB) % BPS;
    if (a->sb[s].used[b] & run_mask(first + r->npages, extra))
        return MEMOS_ENOMEM;
    mark(a, r->page + r->npages, extra, 1);
    r->npages = newk;
    return MEMOS_OK;
}

void arena_trim(arena *a, arena_run *r, unsigned newk)
{
    assert(newk >= 1 && newk <= r->npages);
    if (newk == r->npages)
        return;
    mark(a, r->page + newk, r->npages - newk, 0);
    r->npages = newk;
    reclaim_if_over(a, r->page / ARENA_PAGES_PER_SB);
}

void arena_free(arena *a, arena_run r)
{
    assert(r.npages >= 1 && r.npages <= PPB);
    mark(a, r.page, r.npages, 0);
    reclaim_if_over(a, r.page / ARENA_PAGES_PER_SB);
}

void *arena_ptr(const arena *a, uint32_t page)
{
    uint32_t s = page / ARENA_PAGES_PER_SB;
    assert(s < a->nslots && a->sb[s].base);
    return a->sb[s].base + (size_t)(page % ARENA_PAGES_PER_SB) * MEMOS_PAGE_SIZE;
}

/*
 * arena_sweep — the reclaim pass.
 *
 * TODO(lazy mark-sweep): a later issue turns this into the lazy mark-sweep
 * reclaim (mark pages still reachable from entries, sweep the rest a few
 * superblocks per call).  For now it is a coalescing pass: recount the
 * summary level of every superblock from its bitmaps and unmap the fully free
 * superblocks that exceed the target.  Returns the superblocks unmapped.
 */
size_t arena_sweep(arena *a)
{
    size_t unmapped = 0;
    for (uint32_t s = 0; s < a->nslots; s++) {
        arena_sb *sb = &a->sb[s];
        if (!sb->base)
            continue;
        sb->free_blocks = sb->partial_blocks = sb->free_pages = 0;
        for (unsigned b = 0; b < BPS; b++) {
            sb->nfree[b] = (uint8_t)(PPB - __builtin_popcount(sb->used[b]));
            sb->free_pages += sb->nfree[b];
            sb->free_blocks += sb->nfree[b] == PPB;
            sb->partial_blocks += sb->nfree[b] > 0 && sb->nfree[b] < PPB;
        }
    }
    for (uint32_t s = a->nslots; s-- > 0 && a->nmapped > a->target_sb;) {
        uint32_t before = a->nmapped;
        reclaim_if_over(a, s);
        unmapped += before - a->nmapped;
    }
    return unmapped;
}

/* ---- API: counters ---- */

uint64_t arena_pages_used(const arena *a) { return a->pages_used; }
uint64_t arena_superblocks(const arena *a) { return a->nmapped; }
uint64_t arena_page_limit(const arena *a) { return a->page_limit; }
uint64_t arena_page_slots(const arena *a) { return (uint64_t)a->nslots * ARENA_PAGES_PER_SB; }

uint64_t arena_pages_free(const arena *a)
{
    return a->pages_used >= a->page_limit ? 0 : a->page_limit - a->pages_used;
}

int arena_page_allocated(const arena *a, uint32_t page)
{
    uint32_t s = page / ARENA_PAGES_PER_SB;
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

static int room_for(arena *a, unsigned k)
{
    return a->pages_used + k <= a->page_limit;
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

/* Map one superblock into the first unmapped slot (growing the slot array). */
static int map_slot(arena *a)
{
    uint32_t s = 0;
    while (s < a->nslots && a->sb[s].base)
        s++;
    if (s == a->nslots) {
        uint32_t n = a->nslots ? a->nslots * 2 : 4;
        arena_sb *nsb = realloc(a->sb, n * sizeof *nsb);
        if (!nsb)
            return MEMOS_ENOMEM;
        memset(nsb + a->nslots, 0, (n - a->nslots) * sizeof *nsb);
        a->sb = nsb;
        a->nslots = n;
    }
    int huge = 0;
    char *base = map_superblock(&huge);
    if (!base)
        return MEMOS_ESYS;
    arena_sb *sb = &a->sb[s];
    memset(sb, 0, sizeof *sb);
    sb->base = base;
    sb->huge = (uint8_t)huge;
    memset(sb->nfree, PPB, sizeof sb->nfree);
    sb->free_blocks = BPS;
    sb->free_pages = ARENA_PAGES_PER_SB;
    a->huge_pages |= huge;
    a->nmapped++;
    return MEMOS_OK;
}

static void unmap_slot(arena *a, uint32_t s)
{
    arena_sb *sb = &a->sb[s];
    assert(sb->base && sb->free_blocks == BPS);
    munmap(sb->base, MEMOS_SUPERBLOCK_SIZE);
    memset(sb, 0, sizeof *sb);
    a->nmapped--;
}

/* A superblock over the target goes as soon as it is entirely free. */
static void reclaim_if_over(arena *a, uint32_t s)
{
    if (a->nmapped > a->target_sb && a->sb[s].base &&
        a->sb[s].free_blocks == BPS)
        unmap_slot(a, s);
}

/* Set (used=1) or clear the bits of n pages from `page`, keeping the block
 * counters, the superblock summary and pages_used in step. */
static void mark(arena *a, uint32_t page, unsigned n, int used)
{
    uint32_t s = page / ARENA_PAGES_PER_SB, b = (page / PPB) % BPS;
    arena_sb *sb = &a->sb[s];
    uint32_t m = run_mask(page % PPB, n);
    unsigned old = sb->nfree[b];
    if (used) {
        assert((sb->used[b] & m) == 0 && "page allocated twice");
        sb->used[b] |= m;
        sb->nfree[b] = (uint8_t)(old - n);
        sb->free_pages -= n;
        a->pages_used += n;
    } else {
        assert((sb->used[b] & m) == m && "page freed twice");
        sb->used[b] &= ~m;
        sb->nfree[b] = (uint8_t)(old + n);
        sb->free_pages += n;
        a->pages_used -= n;
    }
    unsigned now = sb->nfree[b];
    sb->free_blocks += (now == PPB) - (old == PPB);
    sb->partial_blocks += (now > 0 && now < PPB) - (old > 0 && old < PPB);
}

/* First page of k contiguous free pages in a block, or -1. */
static int run_in_block(uint32_t used, unsigned k)
{
    uint32_t fr = ~used, x = fr;
    for (unsigned i = 1; i < k && x; i++)
        x &= fr >> i;
    return x ? __builtin_ctz(x) : -1;
}

static int alloc_in_partial(arena *a, unsigned k, arena_run *out)
{
    for (uint32_t i = 0; i < a->nslots; i++) {
        uint32_t s = (a->hint + i) % a->nslots;
        arena_sb *sb = &a->sb[s];
        if (!sb->base || !sb->partial_blocks || sb->free_pages < k)
            continue;
        for (unsigned b = 0; b < BPS; b++) {
            if (sb->nfree[b] < k || sb->nfree[b] == PPB)
                continue;
            int p = run_in_block(sb->used[b], k);
            if (p < 0)
                continue;
            out->page = s * ARENA_PAGES_PER_SB + b * PPB + (uint32_t)p;
            out->npages = k;
            mark(a, out->page, k, 1);
            a->hint = s;
            return MEMOS_OK;
        }
    }
    return MEMOS_ENOMEM;
}

static int alloc_free_block(arena *a, arena_run *out)
{
    for (uint32_t s = 0; s < a->nslots; s++) {
        arena_sb *sb = &a->sb[s];
        if (!sb->base || !sb->free_blocks)
            continue;
        for (unsigned b = 0; b < BPS; b++) {
            if (sb->nfree[b] != PPB)
                continue;
            out->page = s * ARENA_PAGES_PER_SB + b * PPB;
            out->npages = PPB;
            mark(a, out->page, PPB, 1);
            return MEMOS_OK;
        }
        assert(!"free_blocks summary disagrees with the blocks");
    }
    return MEMOS_ENOMEM;
}

/* ---- debugging ---- */

int arena_check(const arena *a, char *why, size_t whylen)
{
    uint64_t used = 0;
    uint32_t mapped = 0;
    for (uint32_t s = 0; s < a->nslots; s++) {
        const arena_sb *sb = &a->sb[s];
        if (!sb->base) {
            for (unsigned b = 0; b < BPS; b++)
                if (sb->used[b] || sb->nfree[b]) {
                    snprintf(why, whylen, "arena: unmapped slot %u has metadata", s);
                    return MEMOS_EINVAL;
                }
            continue;
        }
        mapped++;
        unsigned fb = 0, pb = 0, fp = 0;
        for (unsigned b = 0; b < BPS; b++) {
            unsigned nf = PPB - (unsigned)__builtin_popcount(sb->used[b]);
            if (sb->nfree[b] != nf) {
                snprintf(why, whylen, "arena: sb %u block %u nfree %u, bitmap says %u",
                         s, b, sb->nfree[b], nf);
                return MEMOS_EINVAL;
            }
            fb += nf == PPB;
            pb += nf > 0 && nf < PPB;
            fp += nf;
            used += PPB - nf;
        }
        if (fb != sb->free_blocks || pb != sb->partial_blocks || fp != sb->free_pages) {
            snprintf(why, whylen, "arena: sb %u summary %u/%u/%u, blocks say %u/%u/%u",
                     s, sb->free_blocks, sb->partial_blocks, sb->free_pages, fb, pb, fp);
            return MEMOS_EINVAL;
        }
    }
    if (mapped != a->nmapped) {
        snprintf(why, whylen, "arena: %u superblocks mapped, counter says %u",
                 mapped, a->nmapped);
        return MEMOS_EINVAL;
    }
    if (used != a->pages_used) {
        snprintf(why, whylen, "arena: bitmaps hold %llu pages, counter says %llu",
                 (unsigned long long)used, (unsigned long long)a->pages_used);
        return MEMOS_EINVAL;
    }
    if (a->nmapped < a->target_sb) {
        snprintf(why, whylen, "arena: %u mapped below target %u", a->nmapped, a->target_sb);
        return MEMOS_EINVAL;
    }
    return MEMOS_OK;
}
