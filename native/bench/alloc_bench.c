/*
 * alloc_bench.c — 4 KiB page alloc+free under random churn with 512 MiB
 * live: the arena of arena.c against the process's malloc (glibc; jemalloc
 * when the runner sets LD_PRELOAD=libjemalloc.so.2).
 *
 *   build/bench/alloc_bench --mode arena|malloc [--live 512M-in-pages]
 *                           [--capacity-mib 1024] [--ops N] [--batch 256] [--touch]
 *
 * Fill `live` pages, then churn: free `batch` random live pages, allocate
 * `batch` new ones in their places, until `ops` pairs; report ns per
 * alloc+free pair.  (--batch 1, free one and allocate at once, mostly
 * measures a thread cache handing the same block back.)  --touch writes
 * one byte into each new page (the caller would).  The arena also reports
 * its sweeps during the churn, the longest pause of one, the fragmentation
 * after a final sweep, and the pause of a sweep of a large pending set
 * (a quarter of the live pages freed at random); malloc reports its RSS over
 * the live bytes.  Prints one JSON object.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "arena.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;
static inline uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static uint64_t rss_bytes(void)
{
    long pages = 0, rss = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &rss) != 2)
            rss = 0;
        fclose(f);
    }
    return (uint64_t)rss * (uint64_t)sysconf(_SC_PAGESIZE);
}

static int bench_arena(size_t live, uint64_t cap_mib, size_t ops, size_t batch, int touch)
{
    arena a;
    if (arena_init(&a, cap_mib << 20) != MEMOS_OK) {
        fprintf(stderr, "alloc_bench: arena_init failed\n");
        return 1;
    }
    arena_run *r = malloc(live * sizeof *r);
    for (size_t i = 0; i < live; i++)
        if (arena_alloc_pages(&a, 1, &r[i]) != MEMOS_OK) {
            fprintf(stderr, "alloc_bench: fill failed at %zu\n", i);
            return 1;
        }
    for (size_t i = 0; i < live; i++)          /* fault the pages in once */
        *(volatile char *)arena_ptr(&a, r[i].page) = 1;
    size_t warm = ops / 4;
    for (size_t i = 0; i < warm; i++) {
        size_t j = rnd() % live;
        arena_free(&a, r[j]);
        arena_alloc_pages(&a, 1, &r[j]);
    }
    uint64_t runs0 = a.reclaim_runs;
    a.sweep_ns_max = 0;
    size_t *idx = malloc(batch * sizeof *idx);
    double t0 = now();
    for (size_t i = 0; i < ops; i += batch) {
        for (size_t k = 0; k < batch; k++) {
            size_t j = rnd() % live;
            while (r[j].npages == 0)
                j = j + 1 == live ? 0 : j + 1;
            idx[k] = j;
            arena_free(&a, r[j]);
            r[j].npages = 0;
        }
        for (size_t k = 0; k < batch; k++) {
            if (arena_alloc_pages(&a, 1, &r[idx[k]]) != MEMOS_OK) {
                fprintf(stderr, "alloc_bench: churn allocation failed\n");
                return 1;
            }
            if (touch)
                *(volatile char *)arena_ptr(&a, r[idx[k]].page) = 1;
        }
    }
    double ns = (now() - t0) * 1e9 / (double)ops;
    free(idx);
    uint64_t runs = a.reclaim_runs - runs0, pause_max = a.sweep_ns_max;
    arena_sweep(&a);
    double frag = arena_fragmentation(&a);
    /* One sweep of a large pending set: free a quarter of the pages. */
    for (size_t i = 0; i < live / 4; i++) {
        size_t j = rnd() % (live - i);
        arena_free(&a, r[j]);
        r[j] = r[live - i - 1];
    }
    uint64_t pending = arena_pages_pending(&a);
    arena_sweep(&a);
    char why[256];
    int ok = arena_check(&a, why, sizeof why) == MEMOS_OK;
    printf("{\"mode\": \"arena\", \"live_pages\": %zu, \"capacity_mib\": %llu, \"ops\": %zu, "
           "\"touch\": %d, \"batch\": %zu, \"ns\": %.2f, \"sweeps\": %llu, \"sweep_pause_max_us\": %.1f, "
           "\"fragmentation\": %.4f, \"big_sweep_pages\": %llu, \"big_sweep_us\": %.1f, "
           "\"huge_pages\": %d, \"check\": %s}\n",
           live, (unsigned long long)cap_mib, ops, touch, batch, ns, (unsigned long long)runs,
           (double)pause_max / 1e3, frag, (unsigned long long)pending,
           (double)a.sweep_ns / 1e3, a.huge_pages, ok ? "true" : "false");
    if (!ok)
        fprintf(stderr, "alloc_bench: %s\n", why);
    arena_destroy(&a);
    free(r);
    return ok ? 0 : 1;
}

static int bench_malloc(size_t live, size_t ops, size_t batch, int touch)
{
    const char *name = dlsym(RTLD_DEFAULT, "mallctl") ? "jemalloc" : "glibc";
    void **p = malloc(live * sizeof *p);
    for (size_t i = 0; i < live; i++) {
        p[i] = malloc(4096);
        *(volatile char *)p[i] = 1;
    }
    size_t warm = ops / 4;
    for (size_t i = 0; i < warm; i++) {
        size_t j = rnd() % live;
        free(p[j]);
        p[j] = malloc(4096);
    }
    size_t *idx = malloc(batch * sizeof *idx);
    double t0 = now();
    for (size_t i = 0; i < ops; i += batch) {
        for (size_t k = 0; k < batch; k++) {
            size_t j = rnd() % live;
            while (!p[j])
                j = j + 1 == live ? 0 : j + 1;
            idx[k] = j;
            free(p[j]);
            p[j] = NULL;
        }
        for (size_t k = 0; k < batch; k++) {
            p[idx[k]] = malloc(4096);
            if (touch)
                *(volatile char *)p[idx[k]] = 1;
        }
    }
    double ns = (now() - t0) * 1e9 / (double)ops;
    free(idx);
    uint64_t rss = rss_bytes();
    printf("{\"mode\": \"%s\", \"live_pages\": %zu, \"ops\": %zu, \"touch\": %d, \"batch\": %zu, \"ns\": %.2f, "
           "\"rss_over_live\": %.4f}\n",
           name, live, ops, touch, batch, ns, (double)rss / ((double)live * 4096.0) - 1.0);
    for (size_t i = 0; i < live; i++)
        free(p[i]);
    free(p);
    return 0;
}

int main(int argc, char **argv)
{
    const char *mode = "arena";
    size_t live = 131072, ops = 4000000;   /* 512 MiB of 4 KiB pages */
    uint64_t cap_mib = 1024;
    size_t batch = 256;
    int touch = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--touch"))
            touch = 1;
        else if (i + 1 < argc && !strcmp(argv[i], "--mode"))
            mode = argv[++i];
        else if (i + 1 < argc && !strcmp(argv[i], "--live"))
            live = strtoull(argv[++i], NULL, 0);
        else if (i + 1 < argc && !strcmp(argv[i], "--batch"))
            batch = strtoull(argv[++i], NULL, 0);
        else if (i + 1 < argc && !strcmp(argv[i], "--ops"))
            ops = strtoull(argv[++i], NULL, 0);
        else if (i + 1 < argc && !strcmp(argv[i], "--capacity-mib"))
            cap_mib = strtoull(argv[++i], NULL, 0);
        else {
            fprintf(stderr, "usage: %s --mode arena|malloc [--live PAGES] [--ops N] "
                            "[--capacity-mib N] [--touch]\n", argv[0]);
            return 2;
        }
    }
    if (!strcmp(mode, "arena"))
        return bench_arena(live, cap_mib, ops, batch, touch);
    if (!strcmp(mode, "malloc"))
        return bench_malloc(live, ops, batch, touch);
    fprintf(stderr, "alloc_bench: unknown mode %s\n", mode);
    return 2;
}
