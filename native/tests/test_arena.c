/*
 * test_arena.c — unit tests of arena.c: blocks, runs, bitmaps, counters,
 * capacity growth and shrink, failure injection, a randomized stress, the
 * lazy mark-sweep reclaim (both triggers, fragmentation, a randomized test
 * against a reference of the three page states) and the cache's reclaim knobs.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "arena.h"
#include "memos.h"
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
    CHECK_EQ(arena_pages_pending(&a), 1024);
    CHECK_EQ(a.sb[0].free_mask, 0);                 /* lazy: nothing reusable yet */
    arena_sweep(&a);
    CHECK_EQ(a.sb[0].free_mask, 0xffff);
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
    CHECK_EQ(a.sb[0].partial_mask, 1);
    CHECK_EQ(__builtin_popcount(a.sb[0].free_mask), 15);
    CHECK_EQ(a.sb[0].used[0], 0xffu);
    CHECK_EQ(arena_alloc_pages(&a, 24, &z), MEMOS_OK);
    CHECK_EQ(z.page / PPB, x.page / PPB);          /* fills the block */
    CHECK_EQ(a.sb[0].partial_mask, 0);
    CHECK_EQ(arena_alloc_block(&a, &b), MEMOS_OK);
    CHECK(b.page / PPB != x.page / PPB);
    arena_free(&a, y);                              /* hole of 3 pages */
    arena_sweep(&a);
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
    CHECK_EQ(arena_superblocks(&a), 2);   /* lazy: the sweep returns it */
    CHECK_EQ(arena_sweep(&a), 1);
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

/* The free-ratio trigger: no sweep while the allocatable pages stay at or
 * above ratio * capacity, one sweep at the first allocation below it. */
static void test_sweep_free_ratio(void)
{
    arena a;
    arena_init(&a, SB);                       /* 512 pages, trigger below 102 */
    CHECK_EQ(a.reclaim_below, 102);
    arena_run r[512];
    for (int i = 0; i < 400; i++)
        CHECK_EQ(arena_alloc_pages(&a, 1, &r[i]), MEMOS_OK);
    for (int i = 0; i < 100; i++)
        arena_free(&a, r[i]);
    CHECK_EQ(arena_pages_pending(&a), 100);
    CHECK_EQ(arena_pages_free(&a), 212);      /* pending pages count as free */
    int n = 400;
    while (512 - a.pages_used - a.pages_pending >= 102) {
        CHECK_EQ(arena_alloc_pages(&a, 1, &r[n++]), MEMOS_OK);
        CHECK_EQ(a.reclaim_runs, 0);
    }
    CHECK_EQ(arena_alloc_pages(&a, 1, &r[n++]), MEMOS_OK);
    CHECK_EQ(a.reclaim_runs, 1);
    CHECK_EQ(arena_pages_pending(&a), 0);
    CHECK(r[n - 1].page < 100);               /* reuses a swept page, lowest first */
    check_ok(&a);
    arena_destroy(&a);
}

/* The failure trigger: with the ratio off, the (limit + 1)-th failure in a
 * row sweeps and retries; a success resets the streak. */
static void test_sweep_fail_limit(void)
{
    arena a;
    arena_init(&a, SB);
    CHECK_EQ(arena_set_reclaim(&a, -0.1, 3), MEMOS_EINVAL);
    CHECK_EQ(arena_set_reclaim(&a, 1.5, 3), MEMOS_EINVAL);
    CHECK_EQ(arena_set_reclaim(&a, 0.0 / 0.0, 3), MEMOS_EINVAL);
    CHECK_EQ(arena_set_reclaim(&a, 0.0, 3), MEMOS_OK);
    arena_run r[16], x;
    for (int i = 0; i < 16; i++)
        CHECK_EQ(arena_alloc_block(&a, &r[i]), MEMOS_OK);
    arena_free(&a, r[5]);
    for (int i = 1; i <= 3; i++) {
        CHECK_EQ(arena_alloc_block(&a, &x), MEMOS_ENOMEM);
        CHECK_EQ(a.fail_streak, i);
        CHECK_EQ(a.reclaim_runs, 0);
    }
    CHECK_EQ(arena_alloc_block(&a, &x), MEMOS_OK);   /* 4th: sweep, retry */
    CHECK_EQ(x.page, r[5].page);
    CHECK_EQ(a.reclaim_runs, 1);
    CHECK_EQ(a.fail_streak, 0);
    /* Nothing pending: failures never sweep. */
    for (int i = 0; i < 6; i++)
        CHECK_EQ(arena_alloc_pages(&a, 1, &x), MEMOS_ENOMEM);
    CHECK_EQ(a.reclaim_runs, 1);
    CHECK(a.sweep_ns_max >= a.sweep_ns);
    for (int i = 0; i < 16; i++)
        arena_free(&a, i == 5 ? (arena_run){ r[5].page, PPB } : r[i]);
    CHECK_EQ(arena_reclaim(&a), 512);
    CHECK_EQ(arena_reclaim(&a), 0);
    CHECK_EQ(a.reclaim_runs, 2);
    check_ok(&a);
    arena_destroy(&a);
}

/* Fragmentation: allocatable pages outside whole free blocks. */
static void test_fragmentation_stat(void)
{
    arena a;
    arena_init(&a, SB);
    CHECK(arena_fragmentation(&a) == 0.0);
    arena_run r[16];
    for (int i = 0; i < 16; i++)
        CHECK_EQ(arena_alloc_pages(&a, 31, &r[i]), MEMOS_OK);
    CHECK(arena_fragmentation(&a) == 1.0);     /* 16 lone pages */
    for (int i = 0; i < 8; i++)
        arena_free(&a, r[i]);
    CHECK(arena_fragmentation(&a) == 1.0);     /* not swept yet */
    arena_sweep(&a);
    CHECK(arena_fragmentation(&a) == 8.0 / (8 * 32 + 8));
    for (int i = 8; i < 16; i++)
        arena_free(&a, r[i]);
    arena_sweep(&a);
    CHECK(arena_fragmentation(&a) == 0.0);
    check_ok(&a);
    arena_destroy(&a);
}

/* Random allocs, extends, trims and frees against a reference that models
 * the three page states and predicts every sweep. */
static void random_lazy(double ratio, unsigned limit, unsigned seed)
{
    enum { NSB = 3, NP = NSB * 512, N = 256 };
    arena a;
    arena_init(&a, NSB * SB);
    CHECK_EQ(arena_set_reclaim(&a, ratio, limit), MEMOS_OK);
    static signed char state[NP];           /* 0 free, 1 used, 2 pending */
    memset(state, 0, sizeof state);
    arena_run held[N];
    int nheld = 0;
    uint64_t used = 0, pending = 0, streak = 0, runs = 0;
    uint64_t below = (uint64_t)(ratio * NP);
    srand(seed);
    for (int step = 0; step < 40000; step++) {
        int op = rand() % 10;
        if (op < 5 && nheld < N) {
            unsigned k = rand() % 4 ? 1 + (unsigned)(rand() % 32) : 32;
            int pred = pending && NP - used - pending < below;
            if (pred) {
                for (int p = 0; p < NP; p++)
                    if (state[p] == 2) state[p] = 0;
                pending = 0;
            }
            arena_run r;
            int rc = arena_alloc_pages(&a, k, &r);
            uint64_t extra = a.reclaim_runs - runs - (uint64_t)pred;
            runs = a.reclaim_runs;
            if (extra) {                    /* the failure trigger */
                CHECK_EQ(extra, 1);
                CHECK(streak + 1 > limit && pending > 0);
                for (int p = 0; p < NP; p++)
                    if (state[p] == 2) state[p] = 0;
                pending = 0;
                streak = 0;
            } else if (rc != MEMOS_OK) {
                streak++;
            }
            if (rc != MEMOS_OK)
                continue;
            streak = 0;
            CHECK_EQ(r.npages, k);
            for (uint32_t p = r.page; p < r.page + k; p++) {
                CHECK_EQ(state[p], 0);
                state[p] = 1;
            }
            used += k;
            held[nheld++] = r;
        } else if (op < 6 && nheld) {
            arena_run *r = &held[rand() % nheld];
            unsigned nk = r->npages + 1 + (unsigned)(rand() % 4);
            if (nk > PPB)
                continue;
            uint32_t old = r->npages;
            if (arena_extend(&a, r, nk) != MEMOS_OK)
                continue;
            for (uint32_t p = r->page + old; p < r->page + nk; p++) {
                CHECK_EQ(state[p], 0);
                state[p] = 1;
            }
            used += nk - old;
        } else if (op < 7 && nheld) {
            arena_run *r = &held[rand() % nheld];
            if (r->npages < 2)
                continue;
            unsigned nk = 1 + (unsigned)(rand() % (r->npages - 1));
            for (uint32_t p = r->page + nk; p < r->page + r->npages; p++)
                state[p] = 2;
            used -= r->npages - nk;
            pending += r->npages - nk;
            arena_trim(&a, r, nk);
        } else if (nheld) {
            int i = rand() % nheld;
            for (uint32_t p = held[i].page; p < held[i].page + held[i].npages; p++)
                state[p] = 2;
            used -= held[i].npages;
            pending += held[i].npages;
            arena_free(&a, held[i]);
            held[i] = held[--nheld];
        }
        CHECK_EQ(arena_pages_used(&a), used);
        CHECK_EQ(arena_pages_pending(&a), pending);
        if (step % 4000 == 0) {
            check_ok(&a);
            for (int p = 0; p < NP; p++)
                CHECK_EQ(arena_page_allocated(&a, (uint32_t)p), state[p] == 1);
        }
    }
    for (int i = 0; i < nheld; i++)
        arena_free(&a, held[i]);
    arena_sweep(&a);
    CHECK_EQ(arena_pages_used(&a), 0);
    CHECK(arena_fragmentation(&a) == 0.0);
    check_ok(&a);
    arena_destroy(&a);
}

static void test_random_lazy(void)
{
    random_lazy(0.20, 3, 11);
    random_lazy(0.0, 0, 12);
    random_lazy(0.0, 5, 13);
    random_lazy(1.0, 3, 14);
}

/* The cache side: knobs, flush sweep, stats, and a failure countdown with
 * lazy reclaim on, after which index, arena and policy still agree. */
static void test_cache_reclaim(void)
{
    memos_cache *c = memos_cache_new(2 * SB, 4, NULL, NULL);
    CHECK_EQ(memos_set_reclaim(c, 1.01, 3), MEMOS_EINVAL);
    CHECK_EQ(memos_set_reclaim(c, 0.0, 1), MEMOS_OK);
    memos_stats st;
    memos_get_stats(c, &st);
    CHECK(st.reclaim_free_ratio == 0.0);
    CHECK_EQ(st.reclaim_fail_limit, 1);
    static char buf[300 * 1024];
    memset(buf, 7, sizeof buf);
    char key[32];
    long ok = 0;
    for (long round = 1; round < 400; round++) {
        memos_fail_after(c, round % 7 ? 0 : round / 7);
        memos_entry *d;
        snprintf(key, sizeof key, "k%ld", round % 23);
        if (memos_draft_new(c, NULL, &d) != MEMOS_OK)
            continue;
        size_t n = (size_t)(round * 7919) % sizeof buf + 1;
        if (memos_draft_write(c, d, 0, buf, n) == MEMOS_OK &&
            memos_publish(c, d, key, strlen(key), 0, 0) == MEMOS_OK) {
            ok++;
            memos_unpin(c, d);
        } else {
            memos_draft_free(c, d);
        }
        if (round % 50 == 0)
            memos_sweep(c);
        char w[256];
        int rc = memos_check(c, w, sizeof w);
        if (rc != MEMOS_OK)
            fprintf(stderr, "round %ld: %s\n", round, w);
        CHECK_EQ(rc, MEMOS_OK);
    }
    memos_fail_after(c, 0);
    CHECK(ok > 300);
    memos_get_stats(c, &st);
    CHECK(st.reclaim_runs > 0 && st.evictions > 0);
    memos_sweep(c);
    memos_get_stats(c, &st);
    CHECK_EQ(st.pages_pending, 0);
    CHECK_EQ(memos_sweep(c), 0);
    CHECK(st.fragmentation >= 0.0 && st.fragmentation <= 1.0);
    memos_cache_free(c);
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
    RUN(test_sweep_free_ratio);
    RUN(test_sweep_fail_limit);
    RUN(test_fragmentation_stat);
    RUN(test_random_lazy);
    RUN(test_cache_reclaim);
    return DONE("test_arena");
}
