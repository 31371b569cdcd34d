/*
 * arena.h — the memory tier: superblocks → blocks → pages, free space kept
 * out of band in bitmaps with a summary level, freed pages reclaimed lazily
 * by a mark-sweep pass.  See arena.c for the layout and the invariants.
 *
 * Not thread-safe: the cache lock guards every call.
 */
#ifndef MEMOS_ARENA_H
#define MEMOS_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "memos.h"

#define ARENA_PAGES_PER_SB  (MEMOS_PAGES_PER_BLOCK * MEMOS_BLOCKS_PER_SB)  /* 512 */
#define ARENA_RECLAIM_FREE_RATIO  0.20   /* default: sweep when free < 20 % */
#define ARENA_RECLAIM_FAIL_LIMIT  3u     /* default: sweep after > 3 failures in a row */

/* A run of pages inside one block.  `page` is a global page number:
 * superblock slot * 512 + block * 32 + page in block. */
typedef struct arena_run {
    uint32_t page;      /* first page (global page number) */
    uint32_t npages;    /* pages in the run, 1..32, never crossing a block */
} arena_run;

typedef struct arena_sb {
    char    *base;                        /* 2 MiB-aligned mapping, NULL = unmapped slot */
    uint32_t used[MEMOS_BLOCKS_PER_SB];   /* per block: bit p set = page p allocated */
    uint32_t freed[MEMOS_BLOCKS_PER_SB];  /* per block: bit p set = freed, awaiting the sweep */
    uint8_t  nfree[MEMOS_BLOCKS_PER_SB];  /* per block: allocatable pages, 32 - popcount(used|freed) */
    uint16_t free_mask;                   /* summary: bit b = block b wholly allocatable */
    uint16_t partial_mask;                /* summary: bit b = block b has 1..31 allocatable pages */
    uint16_t dirty_mask;                  /* summary: bit b = block b has freed pages */
    uint16_t free_pages;                  /* summary: sum of nfree, pages */
    uint16_t pending;                     /* summary: freed pages awaiting the sweep */
    uint8_t  huge;                        /* 1 if MADV_HUGEPAGE was accepted */
    uint8_t  faulted;                     /* handed to arena_next_unfaulted (prefault) */
} arena_sb;

typedef struct arena {
    arena_sb *sb;            /* superblock slots, nslots long (cache lock) */
    uint64_t *sb_free;       /* bit s: slot s has a wholly free block (cache lock) */
    uint64_t *sb_partial;    /* bit s: slot s has a partial block (cache lock) */
    uint64_t *sb_dirty;      /* bit s: slot s has freed pages awaiting the sweep (cache lock) */
    uint32_t  nslots;        /* slots in sb[] (mapped or not); a multiple of 64 */
    uint32_t  nmapped;       /* superblocks currently mapped */
    uint32_t  target_sb;     /* superblocks the capacity asks for */
    uint64_t  page_limit;    /* pages: target_sb * 512; pages_used stops here */
    uint64_t  pages_used;    /* pages allocated across all superblocks */
    uint64_t  pages_pending; /* pages freed but not yet swept */
    uint64_t  avail_pages;   /* allocatable pages in mapped superblocks (sum of nfree) */
    uint64_t  frag_pages;    /* allocatable pages in partial blocks (not a whole block) */
    uint64_t  reclaim_below; /* pages: the free-ratio trigger, ratio * page_limit */
    double    reclaim_free_ratio; /* knob: sweep when free / capacity falls below it */
    unsigned  reclaim_fail_limit; /* knob: sweep after more failures in a row than this */
    unsigned  fail_streak;   /* allocation failures since the last success */
    uint64_t  reclaim_runs;  /* sweeps done */
    uint64_t  sweep_ns;      /* duration of the last sweep, ns */
    uint64_t  sweep_ns_max;  /* longest sweep, ns */
    int       huge_pages;    /* 1 if any MADV_HUGEPAGE was accepted */
    long      fail_countdown;/* allocations until an injected failure, 0 = never */
    int       last_injected; /* 1 if the last failed allocation was injected */
} arena;

/* ---- lifetime ---- */
int   arena_init(arena *a, uint64_t capacity);          /* MEMOS_OK, MEMOS_ESYS, MEMOS_ENOMEM */
void  arena_destroy(arena *a);
int   arena_set_capacity(arena *a, uint64_t capacity);  /* MEMOS_OK, MEMOS_ESYS, MEMOS_ENOMEM */
uint64_t arena_capacity_for(uint64_t capacity);         /* rounded to whole superblocks, >= 1 */
int   arena_set_reclaim(arena *a, double free_ratio, unsigned fail_limit); /* MEMOS_OK, MEMOS_EINVAL */

/* ---- allocation ---- */
int   arena_alloc_block(arena *a, arena_run *out);               /* MEMOS_OK, MEMOS_ENOMEM */
int   arena_alloc_pages(arena *a, unsigned k, arena_run *out);   /* 1..32; MEMOS_OK, MEMOS_ENOMEM */
int   arena_extend(arena *a, arena_run *r, unsigned newk);       /* grow in place; MEMOS_OK, MEMOS_ENOMEM */
void  arena_trim(arena *a, arena_run *r, unsigned newk);         /* free the tail, keep newk >= 1 pages */
void  arena_free(arena *a, arena_run r);                         /* marks; the sweep reclaims */
void *arena_ptr(const arena *a, uint32_t page);
size_t arena_sweep(arena *a);       /* reclaim every freed page; returns superblocks unmapped */
uint64_t arena_reclaim(arena *a);   /* sweep if pages are pending; returns the pages reclaimed */
char *arena_next_unfaulted(arena *a, uint32_t ahead); /* a superblock to prefault (marked), or NULL */

/* ---- counters ---- */
uint64_t arena_pages_used(const arena *a);
uint64_t arena_pages_free(const arena *a);      /* free within the page limit (pending included) */
uint64_t arena_pages_pending(const arena *a);   /* freed, not yet swept */
uint64_t arena_superblocks(const arena *a);
uint64_t arena_page_limit(const arena *a);
double   arena_fragmentation(const arena *a);   /* frag_pages / avail_pages, 0 when nothing is free */
int      arena_page_allocated(const arena *a, uint32_t page);
uint64_t arena_page_slots(const arena *a);      /* nslots * 512: bound of page numbers */

/* ---- failure injection ---- */
void  arena_fail_after(arena *a, long n);   /* n-th next allocation fails; 0 = never */
int   arena_fail_tick(arena *a);            /* 1 if this allocation must fail */

/* ---- debugging ---- */
int   arena_check(const arena *a, char *why, size_t whylen);   /* MEMOS_OK or MEMOS_EINVAL */

#endif /* MEMOS_ARENA_H */
