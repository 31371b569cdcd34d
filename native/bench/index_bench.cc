/*
 * index_bench.cc — the cuckoo index of index.c side by side with libcuckoo
 * (cuckoohash_map) and Abseil's flat_hash_map, plus a raw pointer chase
 * over memory the size of our bucket array (the DRAM floor).  The peers are
 * built into this harness only, never into the product.
 *
 *   build/bench/index_bench [--small-buckets 1024] [--large-buckets 2097152]
 *                           [--lookups N] [--tables small,large]
 *
 * For each table (one that fits in cache, one far larger than L3) the same
 * keys ("model/layer<i>/kv", 16..24 bytes, in 64-byte items) go into all
 * three maps; our table has a fixed bucket count and is filled to loads 0.5,
 * 0.9 and 0.95 of its slots; the peers get the same keys and size themselves.
 * At each load, ns per lookup for:
 *
 *   positive   keys present, in random order (query keys read sequentially)
 *   negative   keys absent
 *   dependent  each key taken from the previous result (item->next), so
 *              lookups cannot overlap: latency, not throughput
 *
 * and, once per table, the maximum load our table reaches before its first
 * failed insert (growth disabled).  Prints one JSON object.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <string>
#include <string_view>
#include <vector>

#include <absl/container/flat_hash_map.h>
#include <libcuckoo/cuckoohash_map.hh>

extern "C" {
#include "index.h"
}

struct alignas(64) item {
    index_node node;      /* first: our index points here */
    uint32_t   next;      /* the item whose key a dependent lookup asks next */
    char       key[28];   /* key bytes */
};

struct qkey {
    char     key[28];
    uint32_t len;
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t rng = 88172645463325252ull;
static uint64_t rnd(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

typedef libcuckoo::cuckoohash_map<std::string_view, item *> cuckoo_map;
typedef absl::flat_hash_map<std::string_view, item *> absl_map;

static volatile uint64_t sink;

/* ---- the three maps behind one interface ---- */

static inline item *find_memos(const index_table *t, const char *k, uint32_t len)
{
    return (item *)index_find(t, k, len, index_hash(k, len));
}

static inline item *find_cuckoo(const cuckoo_map *m, const char *k, uint32_t len)
{
    item *v = nullptr;
    m->find(std::string_view(k, len), v);
    return v;
}

static inline item *find_absl(const absl_map *m, const char *k, uint32_t len)
{
    auto it = m->find(std::string_view(k, len));
    return it == m->end() ? nullptr : it->second;
}

template <class F>
static double positive(F find, const std::vector<qkey> &q, size_t n)
{
    uint64_t found = 0;
    double t0 = now();
    for (size_t i = 0; i < n; i++) {
        const qkey &k = q[i % q.size()];
        found += find(k.key, k.len) != nullptr;
    }
    double t = now() - t0;
    if (found != n)
        fprintf(stderr, "index_bench: positive lookups found %llu of %zu\n",
                (unsigned long long)found, n);
    sink += found;
    return t * 1e9 / (double)n;
}

template <class F>
static double dependent(F find, item *items, size_t n)
{
    item *cur = &items[0];
    double t0 = now();
    for (size_t i = 0; i < n; i++) {
        item *next = &items[cur->next];
        cur = find(next->key, next->node.klen);
    }
    double t = now() - t0;
    sink += (uintptr_t)cur;
    return t * 1e9 / (double)n;
}

/* One step per 64-byte line of a random cyclic permutation (Sattolo). */
static double pointer_chase(size_t bytes, size_t steps)
{
    size_t lines = bytes / 64;
    std::vector<uint32_t> perm(lines);
    for (size_t i = 0; i < lines; i++)
        perm[i] = (uint32_t)i;
    for (size_t i = lines - 1; i > 0; i--) {
        size_t j = rnd() % i;
        std::swap(perm[i], perm[j]);
    }
    char *buf = (char *)aligned_alloc(64, lines * 64);
    for (size_t i = 0; i < lines; i++)
        *(void **)(buf + (size_t)i * 64) = buf + (size_t)perm[i] * 64;
    void *p = buf;
    for (size_t i = 0; i < lines && i < steps; i++)   /* warm the TLB / caches */
        p = *(void **)p;
    double t0 = now();
    for (size_t i = 0; i < steps; i++)
        p = *(void **)p;
    double t = now() - t0;
    sink += (uintptr_t)p;
    free(buf);
    return t * 1e9 / (double)steps;
}

static int never_grow(void *ctx)
{
    (void)ctx;
    return 1;
}

/* Load of a table of `buckets` buckets at its first failed insert. */
static double max_load(uint64_t buckets)
{
    index_table t;
    index_init(&t, buckets);
    t.fail_hook = never_grow;
    size_t n = (size_t)buckets * INDEX_SLOTS;
    item *items = (item *)aligned_alloc(64, n * sizeof(item));
    size_t i = 0;
    for (; i < n; i++) {
        int len = snprintf(items[i].key, sizeof items[i].key, "model/layer%zu/kv", i);
        items[i].node.key = (const unsigned char *)items[i].key;
        items[i].node.klen = (uint32_t)len;
        items[i].node.hash = index_hash(items[i].key, (size_t)len);
        if (index_insert(&t, &items[i].node) != MEMOS_OK)
            break;
    }
    double load = (double)index_entries(&t) / (double)n;
    index_destroy(&t);
    free(items);
    return load;
}

static void run_table(const char *name, uint64_t buckets, size_t lookups, int first)
{
    static const double loads[] = { 0.5, 0.9, 0.95 };
    size_t slots = (size_t)buckets * INDEX_SLOTS;
    size_t nmax = (size_t)(slots * 0.95);
    item *items = (item *)aligned_alloc(64, nmax * sizeof(item));
    memset(items, 0, nmax * sizeof(item));
    for (size_t i = 0; i < nmax; i++) {
        int len = snprintf(items[i].key, sizeof items[i].key, "model/layer%zu/kv", i);
        items[i].node.key = (const unsigned char *)items[i].key;
        items[i].node.klen = (uint32_t)len;
        items[i].node.hash = index_hash(items[i].key, (size_t)len);
    }
    index_table t;
    index_init(&t, buckets);
    t.fail_hook = never_grow;    /* the bucket count stays: loads are exact */
    cuckoo_map cm;
    absl_map am;
    size_t have = 0;
    printf("%s\"%s\": {\"buckets\": %llu, \"table_bytes\": %llu, \"loads\": {",
           first ? "" : ", ", name, (unsigned long long)buckets,
           (unsigned long long)(buckets * sizeof(index_bucket)));
    for (int li = 0; li < 3; li++) {
        size_t n = (size_t)(slots * loads[li]);
        for (; have < n; have++) {
            if (index_insert(&t, &items[have].node) != MEMOS_OK) {
                fprintf(stderr, "index_bench: insert failed at load %.4f\n",
                        (double)have / (double)slots);
                exit(1);
            }
            std::string_view k(items[have].key, items[have].node.klen);
            cm.insert(k, &items[have]);
            am.emplace(k, &items[have]);
        }
        /* Dependent chain: a random cycle through the n present items. */
        std::vector<uint32_t> perm(n);
        for (size_t i = 0; i < n; i++)
            perm[i] = (uint32_t)i;
        for (size_t i = n - 1; i > 0; i--)
            std::swap(perm[i], perm[rnd() % i]);
        for (size_t i = 0; i < n; i++)
            items[perm[i]].next = perm[(i + 1) % n];
        size_t nq = n < lookups ? n : lookups;
        std::vector<qkey> pos(nq), neg(nq);
        for (size_t i = 0; i < nq; i++) {
            const item *it = &items[perm[(i * 7 + 3) % n]];
            memcpy(pos[i].key, it->key, sizeof pos[i].key);
            pos[i].len = it->node.klen;
            neg[i].len = (uint32_t)snprintf(neg[i].key, sizeof neg[i].key, "model/absent%zu/kv", i);
        }
        auto fm = [&](const char *k, uint32_t len) { return find_memos(&t, k, len); };
        auto fc = [&](const char *k, uint32_t len) { return find_cuckoo(&cm, k, len); };
        auto fa = [&](const char *k, uint32_t len) { return find_absl(&am, k, len); };
        positive(fm, pos, nq / 4 + 1);   /* warm up */
        double r[3][3];
        r[0][0] = positive(fm, pos, lookups);
        r[1][0] = positive(fc, pos, lookups);
        r[2][0] = positive(fa, pos, lookups);
        uint64_t miss = 0;
        double t0 = now();
        for (size_t i = 0; i < lookups; i++) {
            const qkey &k = neg[i % nq];
            miss += fm(k.key, k.len) == nullptr;
        }
        r[0][1] = (now() - t0) * 1e9 / (double)lookups;
        t0 = now();
        for (size_t i = 0; i < lookups; i++) {
            const qkey &k = neg[i % nq];
            miss += fc(k.key, k.len) == nullptr;
        }
        r[1][1] = (now() - t0) * 1e9 / (double)lookups;
        t0 = now();
        for (size_t i = 0; i < lookups; i++) {
            const qkey &k = neg[i % nq];
            miss += fa(k.key, k.len) == nullptr;
        }
        r[2][1] = (now() - t0) * 1e9 / (double)lookups;
        if (miss != 3 * lookups)
            fprintf(stderr, "index_bench: a negative lookup found something\n");
        r[0][2] = dependent(fm, items, lookups);
        r[1][2] = dependent(fc, items, lookups);
        r[2][2] = dependent(fa, items, lookups);
        static const char *maps[] = { "memos", "libcuckoo", "absl" };
        printf("%s\"%.2f\": {\"keys\": %zu, \"load\": %.4f", li ? ", " : "", loads[li], n,
               index_load(&t));
        for (int m = 0; m < 3; m++)
            printf(", \"%s\": {\"positive\": {\"ns\": %.2f}, \"negative\": {\"ns\": %.2f}, "
                   "\"dependent\": {\"ns\": %.2f}}", maps[m], r[m][0], r[m][1], r[m][2]);
        printf("}");
        fflush(stdout);
    }
    double chase = pointer_chase((size_t)buckets * sizeof(index_bucket), lookups);
    printf("}, \"pointer_chase\": {\"ns\": %.2f}, \"max_load\": %.4f}", chase, max_load(buckets));
    index_destroy(&t);
    free(items);
}

int main(int argc, char **argv)
{
    uint64_t small = 1024, large = 1u << 21;
    size_t lookups = 2000000;
    const char *tables = "small,large";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--small-buckets"))
            small = strtoull(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--large-buckets"))
            large = strtoull(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--lookups"))
            lookups = strtoull(argv[i + 1], NULL, 0);
        else if (!strcmp(argv[i], "--tables"))
            tables = argv[i + 1];
        else {
            fprintf(stderr, "usage: %s [--small-buckets N] [--large-buckets N] "
                            "[--lookups N] [--tables small,large]\n", argv[0]);
            return 2;
        }
    }
#if defined(__AVX2__)
    const char *simd = "sse2+avx2";
#elif defined(__SSE2__)
    const char *simd = "sse2";
#else
    const char *simd = "portable";
#endif
    printf("{\"bench\": \"index\", \"simd\": \"%s\", \"lookups\": %zu, \"tables\": {", simd, lookups);
    int first = 1;
    if (strstr(tables, "small")) {
        run_table("small", small, lookups, first);
        first = 0;
    }
    if (strstr(tables, "large"))
        run_table("large", large, lookups, first);
    printf("}}\n");
    return 0;
}
