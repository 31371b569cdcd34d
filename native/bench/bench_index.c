/*
 * bench_index.c — throughput of the cuckoo index: inserts (with growth),
 * positive and negative lookups, removes, for N keys of ~20 bytes.
 *
 *   make -C native bench
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "index.h"

typedef struct item {
    index_node node;   /* first: the index points here */
    char key[24];      /* key bytes */
} item;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 2000000;
    item *it = calloc((size_t)n, sizeof *it);
    for (long i = 0; i < n; i++) {
        int len = snprintf(it[i].key, sizeof it[i].key, "model/layer%ld/kv", i);
        it[i].node.key = (const unsigned char *)it[i].key;
        it[i].node.klen = (uint32_t)len;
    }
    index_table t;
    index_init(&t, 16);
    double t0 = now();
    for (long i = 0; i < n; i++)
        it[i].node.hash = index_hash(it[i].key, it[i].node.klen);
    double t1 = now();
    for (long i = 0; i < n; i++)
        index_insert(&t, &it[i].node);
    double t2 = now();
    long found = 0;
    for (long i = 0; i < n; i++) {
        long j = (i * 7919) % n;
        found += index_find(&t, it[j].key, it[j].node.klen, it[j].node.hash) != NULL;
    }
    double t3 = now();
    long miss = 0;
    for (long i = 0; i < n; i++)
        miss += index_find(&t, "absent", 6, it[i].node.hash ^ 0x5555) == NULL;
    double t4 = now();
    for (long i = 0; i < n; i++)
        index_remove(&t, &it[i].node);
    double t5 = now();
    printf("keys %ld  buckets %llu  load %.3f (max before growth %.3f)\n", n,
           (unsigned long long)index_buckets(&t), (double)n / (double)(index_buckets(&t) * 4),
           (double)t.max_load_seen / 1e6);
    printf("hash   %6.1f ns/key\n", (t1 - t0) * 1e9 / (double)n);
    printf("insert %6.1f ns/key (with growth)\n", (t2 - t1) * 1e9 / (double)n);
    printf("hit    %6.1f ns/key (%ld found)\n", (t3 - t2) * 1e9 / (double)n, found);
    printf("miss   %6.1f ns/key (%ld missed)\n", (t4 - t3) * 1e9 / (double)n, miss);
    printf("remove %6.1f ns/key\n", (t5 - t4) * 1e9 / (double)n);
    index_destroy(&t);
    free(it);
    return 0;
}
