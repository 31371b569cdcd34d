/*
 * arena.h — the memory tier: superblocks → blocks → pages, free space kept
 * out of band in bitmaps.  See arena.c for the layout and the invariants.
 *
 * Not thread-safe: the cache lock guards every call.
 */
#ifndef MEMOS_ARENA_H
#define MEMOS_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "memos.h"

#define ARENA_PAGES_PER_SB  (MEMOS_PAGES_PER_BLOCK * MEMOS_BLOCKS_PER_SB)  /* 512 */

/* A run of pages inside one block.  `page` is a global page number:
 * superblock slot * 512 + block * 32 + page in block. */
typedef struct arena_run {
    uint32_t page;      /* first page (global page number) */
    uint32_t npages;    /* pages in the run, 1..32, never crossing a block */
} arena_run;

typedef struct arena_sb {
    char    *base;                           /* 2 MiB-aligned mapping, NULL = unmapped slot */
    uint32_t used[MEMOS_BLOCKS_PER_SB];      /* per block: bit i set = page i allocated */
    uint8_t  nfree[MEMOS_BLOCKS_PER_SB];     /* per block: free pages (popcount of ~used) */
    uint16_t free_blocks;                    /* summary: blocks with nfree == 32 */
    uint16_t partial_blocks;                 /* summary: blocks with 0 < nfree < 32 */
    uint16_t free_pages;                     /* summary: sum of nfree */
    uint8_t  huge;                           /* 1 if MADV_HUGEPAGE was accepted */
} arena_sb;

typedef struct arena {
    arena_sb *sb;            /* superblock slots, nslots long (guarded by cache lock) */
    uint32_t  nslots;        /* slots in sb[] (mapped or not) */
    uint32_t  nmapped;       /* superblocks currently mapped */
    uint32_t  target_sb;     /* superblocks the capacity asks for */
    uint64_t  page_limit;    /* pages: target_sb * 512; allocations stop here */
    uint64_t  pages_used;    /* pages allocated across all superblocks */
    uint32_t  hint;          /* slot where the last partial-run allocation succeeded */
    int       huge_pages;    /* 1 if any MADV_HUGEPAGE was accepted */
    long      fail_countdown;/* allocations until an injected failure, 0 = never */
    int       last_injected; /* 1 if the last failed allocation was injected */
} arena;

/* ---- lifetime ---- */
int   arena_init(arena *a, uint64_t capacity);          /* MEMOS_OK, MEMOS_ESYS, MEMOS_ENOMEM */
void  arena_destroy(arena *a);
int   arena_set_capacity(arena *a, uint64_t capacity);  /* MEMOS_OK, MEMOS_ESYS, MEMOS_ENOMEM */
uint64_t arena_capacity_for(uint64_t capacity);         /* rounded to whole superblocks, >= 1 */

/* ---- allocation ---- */
int   arena_alloc_block(arena *a, arena_run *out);               /* MEMOS_OK, MEMOS_ENOMEM */
int   arena_alloc_pages(arena *a, unsigned k, arena_run *out);   /* 1..32; MEMOS_OK, MEMOS_ENOMEM */
int   arena_extend(arena *a, arena_run *r, unsigned newk);       /* grow in place; MEMOS_OK, MEMOS_ENOMEM */
void  arena_trim(arena *a, arena_run *r, unsigned newk);         /* free the tail, keep newk >= 1 pages */
void  arena_free(arena *a, arena_run r);
void *arena_ptr(const arena *a, uint32_t page);
size_t arena_sweep(arena *a);                                    /* reclaim pass; superblocks unmapped */

/* ---- counters ---- */
uint64_t arena_pages_used(const arena *a);
uint64_t arena_pages_free(const arena *a);      /* free within the page limit */
uint64_t arena_superblocks(const arena *a);
uint64_t arena_page_limit(const arena *a);
int      arena_page_allocated(const arena *a, uint32_t page);
uint64_t arena_page_slots(const arena *a);      /* nslots * 512: bound of page numbers */

/* ---- failure injection ---- */
void  arena_fail_after(arena *a, long n);   /* n-th next allocation fails; 0 = never */
int   arena_fail_tick(arena *a);            /* 1 if this allocation must fail */

/* ---- debugging ---- */
int   arena_check(const arena *a, char *why, size_t whylen);   /* MEMOS_OK or MEMOS_EINVAL */

#endif /* MEMOS_ARENA_H */
