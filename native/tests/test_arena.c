/*
 * test_arena.c — unit tests of arena.c: blocks, runs, bitmaps, counters,
 * capacity growth and shrink, failure injection, a randomized stress.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "tcheck.h"

#define SB MEMOS_SUPERBLOCK_SIZE
#define PPB MEMOS_PAGES_PER_BLOCK

static char why[256];

static void check_ok(arena *a)
{
    int rc = arena_check(a, why, sizeof why);
    if (rc != MEMOS_OK)
        fprintf(stderr, "arena_check: %s\n", why);
    CHECK_EQ(rc, MEMOS_OK);
}

static void test_init_counters(void)
{
    arena a;
    CHECK_EQ(arena_init(&a, 5u << 20), MEMOS_OK);
    CHECK_EQ(arena_superblocks(&a), 3);
    CHECK_EQ(arena_page_limit(&a), 3 * 512);
    CHECK_EQ(arena_pages_used(&a), 0);
    CHECK_EQ(arena_pages_free(&a), 3 * 512);
    CHECK_EQ(arena_capacity_for(0), SB);
    CHECK_EQ(arena_capacity_for(SB + 1), 2 * SB);
    for (uint32_t s = 0; s < a.nslots; s++)
        if (a.sb[s].base)
            CHECK(((uintptr_t)a.sb[s].base & (SB - 1)) == 0);
    check_ok(&a);
    arena_destroy(&a);
}

static void test_blocks(void)
{
    arena a;
    arena_init(&a, 2 * SB);
    arena_run r[33];
    for (int i = 0; i < 32; i++) {
        CHECK_EQ(arena_alloc_block(&a, &r[i]), MEMOS_OK);
        CHECK_EQ(r[i].npages, PPB);
        CHECK_EQ(r[i].page % PPB, 0);
    }
    CHECK_EQ(arena_alloc_block(&a, &r[32]), MEMOS_ENOMEM);
    CHECK_EQ(arena_alloc_pages(&a, 1, &r[32]), MEMOS_ENOMEM);
    CHECK_EQ(arena_pages_used(&a), 1024);
    CHECK_EQ(arena_pages_free(&a), 0);
    check_ok(&a);
    for (int i = 0; i < 32; i += 2)
        arena_free(&a, r[i]);
    CHECK_EQ(arena_pages_used(&a), 512);
    check_ok(&a);
    for (int i = 1; i < 32; i += 2)
        arena_free(&a, r[i]);
    CHECK_EQ(arena_pages_used(&a), 0);
    CHECK_EQ(a.sb[0].free_blocks, 16);
    check_ok(&a);
    arena_destroy(&a);
}

static void test_runs_prefer_partial(void)
{
    arena a;
    arena_init(&a, SB);
    arena_run x, y, z, b;
    CHECK_EQ(arena_alloc_pages(&a, 5, &x), MEMOS_OK);
    CHECK_EQ(arena_alloc_pages(&a, 3, &y), MEMOS_OK);
    CHECK_EQ(x.page / PPB, y.page / PPB);          /* same block */
    CHECK_EQ(y.page, x.page + 5);                  /* packed after x */
    CHECK_EQ(a.sb[0].partial_blocks, 1);
    CHECK_EQ(a.sb[0].free_blocks, 15);
    CHECK_EQ(a.sb[0].used[0], 0xffu);
    CHECK_EQ(arena_alloc_pages(&a, 24, &z), MEMOS_OK);
    CHECK_EQ(z.page / PPB, x.page / PPB);          /* fills the block */
    CHECK_EQ(a.sb[0].partial_blocks, 0);
    CHECK_EQ(arena_alloc_block(&a, &b), MEMOS_OK);
    CHECK(b.page / PPB != x.page / PPB);
    arena_free(&a, y);                              /* hole of 3 pages */
    arena_run w;
    CHECK_EQ(arena_alloc_pages(&a, 3, &w), MEMOS_OK);
    CHECK_EQ(w.page, y.page);                       /* reuses the hole */
    CHECK_EQ(arena_pages_used(&a), 64);
    check_ok(&a);
    arena_free(&a, x);
    arena_free(&a, w);
    arena_free(&a, z);
    arena_free(&a, b);
    CHECK_EQ(arena_pages_used(&a), 0);
    check_ok(&a);
    arena_destroy(&a);
}

static void test_extend_trim(void)
{
    arena a;
    arena_init(&a, SB);
    arena_run x, y;
    CHECK_EQ(arena_alloc_pages(&a, 4, &x), MEMOS_OK);
    CHECK_EQ(arena_extend(&a, &x, 10), MEMOS_OK);
    CHECK_EQ(x.npages, 10);
    CHECK_EQ(arena_alloc_pages(&a, 2, &y), MEMOS_OK);
    CHECK_EQ(y.page, x.page + 10);
    CHECK_EQ(arena_extend(&a, &x, 11), MEMOS_ENOMEM);  /* y is in the way */
    CHECK_EQ(a.last_injected, 0);
    arena_trim(&a, &x, 3);
    CHECK_EQ(x.npages, 3);
    CHECK_EQ(arena_pages_used(&a), 5);
    check_ok(&a);
    arena_free(&a, x);
    arena_free(&a, y);
    check_ok(&a);
    arena_destroy(&a);
}

static void test_pointers(void)
{
    arena a;
    arena_init(&a, 2 * SB);
    arena_run r[64];
    int n = 0;
    while (n < 64 && arena_alloc_pages(&a, 17, &r[n]) == MEMOS_OK)
        n++;
    CHECK_EQ(n, 32);   /* 17 + 17 > 32: one run per block */
    for (int i = 0; i < n; i++)
        memset(arena_ptr(&a, r[i].page), i + 1, (size_t)r[i].npages * MEMOS_PAGE_SIZE - 1);
    for (int i = 0; i < n; i++) {
        unsigned char *p = arena_ptr(&a, r[i].page);
        CHECK(p[0] == i + 1 && p[r[i].npages * MEMOS_PAGE_SIZE - 2] == i + 1);
        CHECK_EQ(arena_page_allocated(&a, r[i].page), 1);
    }
    for (int i = 0; i < n; i++)
        arena_free(&a, r[i]);
    CHECK_EQ(arena_page_allocated(&a, r[0].page), 0);
    check_ok(&a);
    arena_destroy(&a);
}

static void test_capacity(void)
{
    arena a;
    arena_init(&a, SB);
    arena_run r[48];
    for (int i = 0; i < 16; i++)
        CHECK_EQ(arena_alloc_block(&a, &r[i]), MEMOS_OK);
    CHECK_EQ(arena_alloc_block(&a, &r[16]), MEMOS_ENOMEM);
    CHECK_EQ(arena_set_capacity(&a, 3 * SB), MEMOS_OK);
    CHECK_EQ(arena_superblocks(&a), 3);
    for (int i = 16; i < 48; i++)
        CHECK_EQ(arena_alloc_block(&a, &r[i]), MEMOS_OK);
    check_ok(&a);
    /* Shrink to one superblock while all three are busy: nothing unmapped,
     * allocations refused beyond the limit. */
    for (int i = 16; i < 32; i++)
        arena_free(&a, r[i]);         /* superblock 1 now free */
    CHECK_EQ(arena_set_capacity(&a, SB), MEMOS_OK);
    CHECK_EQ(arena_superblocks(&a), 2);
    CHECK_EQ(arena_page_limit(&a), 512);
    CHECK_EQ(arena_pages_free(&a), 0);
    arena_run x;
    CHECK_EQ(arena_alloc_pages(&a, 1, &x), MEMOS_ENOMEM);
    check_ok(&a);
    for (int i = 32; i < 47; i++)
        arena_free(&a, r[i]);
    CHECK_EQ(arena_superblocks(&a), 2);
    arena_free(&a, r[47]);            /* last page of an over-target superblock */
    CHECK_EQ(arena_superblocks(&a), 1);
    check_ok(&a);
    arena_free(&a, r[0]);
    CHECK_EQ(arena_alloc_pages(&a, 1, &x), MEMOS_OK);
    arena_free(&a, x);
    for (int i = 1; i < 16; i++)
        arena_free(&a, r[i]);
    CHECK_EQ(arena_pages_used(&a), 0);
    CHECK_EQ(arena_sweep(&a), 0);
    check_ok(&a);
    arena_destroy(&a);
}

static void test_fail_injection(void)
{
    arena a;
    arena_init(&a, SB);
    arena_run r[4];
    arena_fail_after(&a, 3);
    CHECK_EQ(arena_alloc_pages(&a, 2, &r[0]), MEMOS_OK);
    CHECK_EQ(arena_alloc_block(&a, &r[1]), MEMOS_OK);
    CHECK_EQ(arena_alloc_pages(&a, 2, &r[2]), MEMOS_ENOMEM);
    CHECK_EQ(a.last_injected, 1);
    CHECK_EQ(arena_alloc_pages(&a, 2, &r[2]), MEMOS_OK);
    CHECK_EQ(a.last_injected, 0);
    CHECK_EQ(arena_pages_used(&a), 36);
    for (int i = 0; i < 3; i++)
        arena_free(&a, r[i]);
    check_ok(&a);
    arena_destroy(&a);
}

static void test_fragmentation(void)
{
    arena a;
    arena_init(&a, SB);
    arena_run r[16], x;
    for (int i = 0; i < 16; i++)
        CHECK_EQ(arena_alloc_pages(&a, 31, &r[i]), MEMOS_OK);
    CHECK_EQ(arena_pages_free(&a), 16);
    CHECK_EQ(arena_alloc_pages(&a, 2, &x), MEMOS_ENOMEM);   /* 16 lone pages */
    CHECK_EQ(arena_alloc_pages(&a, 1, &x), MEMOS_OK);
    arena_free(&a, x);
    for (int i = 0; i < 16; i++)
        arena_free(&a, r[i]);
    check_ok(&a);
    arena_destroy(&a);
}

/* Random allocs and frees against a reference page-ownership table. */
static void test_random_stress(void)
{
    arena a;
    arena_init(&a, 4 * SB);
    enum { N = 512 };
    arena_run held[N];
    int nheld = 0;
    static int owner[4 * 512];
    memset(owner, -1, sizeof owner);
    uint64_t used = 0;
    srand(7);
    for (int step = 0; step < 50000; step++) {
        if (nheld < N && (rand() % 3 != 0 || nheld == 0)) {
            unsigned k = 1 + (unsigned)(rand() % 32);
            arena_run r;
            if (arena_alloc_pages(&a, k, &r) != MEMOS_OK)
                continue;
            for (uint32_t p = r.page; p < r.page + r.npages; p++) {
                CHECK(owner[p] == -1);
                owner[p] = nheld;
            }
            held[nheld++] = r;
            used += k;
        } else {
            int i = rand() % nheld;
            for (uint32_t p = held[i].page; p < held[i].page + held[i].npages; p++)
                owner[p] = -1;
            used -= held[i].npages;
            arena_free(&a, held[i]);
            held[i] = held[--nheld];
            for (uint32_t p = held[i].page; i < nheld && p < held[i].page + held[i].npages; p++)
                owner[p] = i;
        }
        if (step % 5000 == 0) {
            CHECK_EQ(arena_pages_used(&a), used);
            check_ok(&a);
        }
    }
    for (int i = 0; i < nheld; i++)
        arena_free(&a, held[i]);
    CHECK_EQ(arena_pages_used(&a), 0);
    check_ok(&a);
    arena_destroy(&a);
}

int main(void)
{
    RUN(test_init_counters);
    RUN(test_blocks);
    RUN(test_runs_prefer_partial);
    RUN(test_extend_trim);
    RUN(test_pointers);
    RUN(test_capacity);
    RUN(test_fail_injection);
    RUN(test_fragmentation);
    RUN(test_random_stress);
    return DONE("test_arena");
}
