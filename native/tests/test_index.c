/*
 * test_index.c — unit tests of index.c: insert/find/remove/replace, a
 * randomized run against a reference table, planted collisions, the load
 * factor reached before the first growth (>= 95 %), growth only on a failed
 * insert, growth failure injection, the SIMD and portable tag compares.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"
#include "tcheck.h"

typedef struct item {
    index_node node;   /* first: the index points here */
    char key[32];      /* key bytes */
} item;

static char why[256];

static void check_ok(index_table *t)
{
    int rc = index_check(t, why, sizeof why);
    if (rc != MEMOS_OK)
        fprintf(stderr, "index_check: %s\n", why);
    CHECK_EQ(rc, MEMOS_OK);
}

static void make_item(item *it, const char *fmt, long i)
{
    int n = snprintf(it->key, sizeof it->key, fmt, i);
    it->node.key = (const unsigned char *)it->key;
    it->node.klen = (uint32_t)n;
    it->node.hash = index_hash(it->key, (size_t)n);
}

static index_node *find(index_table *t, const char *k)
{
    return index_find(t, k, strlen(k), index_hash(k, strlen(k)));
}

static void test_basic(void)
{
    index_table t;
    CHECK_EQ(index_init(&t, 1), MEMOS_OK);
    item a, b, c, a2;
    make_item(&a, "alpha%ld", 0);
    make_item(&b, "beta%ld", 0);
    make_item(&c, "gamma%ld", 0);
    CHECK_EQ(index_insert(&t, &a.node), MEMOS_OK);
    CHECK_EQ(index_insert(&t, &b.node), MEMOS_OK);
    CHECK(find(&t, "alpha0") == &a.node);
    CHECK(find(&t, "beta0") == &b.node);
    CHECK(find(&t, "gamma0") == NULL);
    CHECK(find(&t, "alpha") == NULL);
    CHECK_EQ(index_entries(&t), 2);
    make_item(&a2, "alpha%ld", 0);
    CHECK_EQ(index_replace(&t, &a.node, &a2.node), MEMOS_OK);
    CHECK(find(&t, "alpha0") == &a2.node);
    CHECK_EQ(index_remove(&t, &a.node), MEMOS_ENOENT);
    CHECK_EQ(index_remove(&t, &a2.node), MEMOS_OK);
    CHECK(find(&t, "alpha0") == NULL);
    CHECK_EQ(index_remove(&t, &c.node), MEMOS_ENOENT);
    CHECK_EQ(index_entries(&t), 1);
    check_ok(&t);
    index_destroy(&t);
}

static void test_hash_quality(void)
{
    enum { N = 200000 };
    uint64_t *h = malloc(N * sizeof *h);
    char k[32];
    unsigned ones[64] = { 0 };
    for (long i = 0; i < N; i++) {
        int n = snprintf(k, sizeof k, "layer/%ld", i);
        h[i] = index_hash(k, (size_t)n);
        for (int b = 0; b < 64; b++)
            ones[b] += (h[i] >> b) & 1;
    }
    for (int b = 0; b < 64; b++)            /* every bit near 1/2 */
        CHECK(ones[b] > N * 0.48 && ones[b] < N * 0.52);
    int dup = 0;
    for (long i = 1; i < N; i++)
        dup += h[i] == h[i - 1];
    CHECK_EQ(dup, 0);
    /* Lengths 0..64 of the same bytes all differ. */
    char buf[64] = { 0 };
    for (int n = 1; n < 64; n++)
        CHECK(index_hash(buf, (size_t)n) != index_hash(buf, (size_t)n - 1));
    free(h);
}

/* Random inserts/removes/lookups over a key space; the reference is a
 * plain "present" array indexed by key number. */
static void test_random_vs_reference(void)
{
    enum { KEYS = 60000, STEPS = 400000 };
    item *it = calloc(KEYS, sizeof *it);
    char *present = calloc(KEYS, 1);
    index_table t;
    index_init(&t, 4);
    for (long i = 0; i < KEYS; i++)
        make_item(&it[i], i % 2 ? "slot/%ld" : "a-much-longer-key-prefix/%06ld", i);
    long n = 0;
    srand(42);
    for (long s = 0; s < STEPS; s++) {
        long i = rand() % KEYS;
        int op = rand() % 4;
        if (op < 2 && !present[i]) {
            CHECK_EQ(index_insert(&t, &it[i].node), MEMOS_OK);
            present[i] = 1;
            n++;
        } else if (op == 2 && present[i]) {
            CHECK_EQ(index_remove(&t, &it[i].node), MEMOS_OK);
            present[i] = 0;
            n--;
        } else {
            index_node *f = index_find(&t, it[i].key, it[i].node.klen, it[i].node.hash);
            CHECK(f == (present[i] ? &it[i].node : NULL));
        }
        if (s % 100000 == 0)
            check_ok(&t);
    }
    CHECK_EQ(index_entries(&t), n);
    for (long i = 0; i < KEYS; i++) {
        index_node *f = index_find(&t, it[i].key, it[i].node.klen, it[i].node.hash);
        CHECK(f == (present[i] ? &it[i].node : NULL));
    }
    check_ok(&t);
    index_destroy(&t);
    free(it);
    free(present);
}

/* Planted collisions: keys that share a hash (so a tag and both buckets)
 * are told apart by their bytes; the ninth cannot fit anywhere. */
static void test_collisions(void)
{
    index_table t;
    index_init(&t, 64);
    item it[9];
    for (long i = 0; i < 9; i++) {
        make_item(&it[i], "collide-%ld", i);
        it[i].node.hash = 0x1234567890abcdefULL;
    }
    for (int i = 0; i < 8; i++)
        CHECK_EQ(index_insert(&t, &it[i].node), MEMOS_OK);
    for (int i = 0; i < 8; i++)
        CHECK(index_find(&t, it[i].key, it[i].node.klen, it[i].node.hash) == &it[i].node);
    CHECK_EQ(index_insert(&t, &it[8].node), MEMOS_ENOMEM);
    CHECK(index_find(&t, it[8].key, it[8].node.klen, it[8].node.hash) == NULL);
    CHECK_EQ(index_remove(&t, &it[3].node), MEMOS_OK);
    CHECK_EQ(index_insert(&t, &it[8].node), MEMOS_OK);
    CHECK(index_find(&t, it[3].key, it[3].node.klen, it[3].node.hash) == NULL);
    CHECK(index_find(&t, it[8].key, it[8].node.klen, it[8].node.hash) == &it[8].node);
    check_ok(&t);
    /* Same tag, different buckets: tags match, keys don't. */
    item u[2];
    make_item(&u[0], "tagmate-%ld", 0);
    make_item(&u[1], "tagmate-%ld", 1);
    u[0].node.hash = 0xabcd000000000001ULL;
    u[1].node.hash = 0xabcd000000000002ULL;
    CHECK_EQ(index_insert(&t, &u[0].node), MEMOS_OK);
    CHECK_EQ(index_insert(&t, &u[1].node), MEMOS_OK);
    CHECK(index_find(&t, u[0].key, u[0].node.klen, u[0].node.hash) == &u[0].node);
    CHECK(index_find(&t, u[1].key, u[1].node.klen, u[1].node.hash) == &u[1].node);
    CHECK(index_find(&t, u[1].key, u[1].node.klen, u[0].node.hash) == NULL);
    check_ok(&t);
    index_destroy(&t);
}

/* Fill a fixed table until its first growth; report the load reached. */
static double fill_until_growth(uint64_t buckets, const char *fmt)
{
    index_table t;
    index_init(&t, buckets);
    uint64_t slots = buckets * INDEX_SLOTS;
    item *it = calloc(slots + 1, sizeof *it);
    double load = 0;
    for (uint64_t i = 0; i <= slots; i++) {
        make_item(&it[i], fmt, (long)i);
        load = index_load(&t);
        CHECK_EQ(index_insert(&t, &it[i].node), MEMOS_OK);
        if (t.grows)
            break;
    }
    check_ok(&t);
    index_destroy(&t);
    free(it);
    return load;
}

static void test_load_factor(void)
{
    double worst = 1.0;
    uint64_t sizes[] = { 1024, 16384, 65536 };
    for (int i = 0; i < 3; i++) {
        double l1 = fill_until_growth(sizes[i], "kv/%ld");
        double l2 = fill_until_growth(sizes[i], "model-a/layer-%ld/kv");
        printf("index load factor before first growth: %llu buckets: %.4f, %.4f\n",
               (unsigned long long)sizes[i], l1, l2);
        worst = l1 < worst ? l1 : worst;
        worst = l2 < worst ? l2 : worst;
    }
    CHECK(worst >= 0.95);
}

static int fail_once;
static int fail_hook(void *ctx) { (void)ctx; return fail_once-- > 0; }

static void test_growth_failure(void)
{
    index_table t;
    index_init(&t, 4);
    t.fail_hook = fail_hook;
    item it[200];
    int failed = 0;
    for (long i = 0; i < 200; i++) {
        make_item(&it[i], "g%ld", i);
        if (i == 100)
            fail_once = 1;
        int rc = index_insert(&t, &it[i].node);
        if (rc != MEMOS_OK) {
            failed++;
            CHECK(index_find(&t, it[i].key, it[i].node.klen, it[i].node.hash) == NULL);
            CHECK_EQ(index_insert(&t, &it[i].node), MEMOS_OK);   /* retry grows */
        }
        check_ok(&t);
    }
    CHECK(failed <= 1);
    CHECK_EQ(index_entries(&t), 200);
    index_destroy(&t);
}

/* SIMD and SWAR tag compares agree with a plain loop, duplicates included. */
static void test_tag_match(void)
{
    static index_bucket b[2];
    srand(3);
    for (int round = 0; round < 100000; round++) {
        for (int k = 0; k < 2; k++)
            for (int s = 0; s < INDEX_SLOTS; s++) {
                int r = rand() % 4;
                b[k].tag[s] = (uint16_t)(r == 0 ? 0 : r == 1 ? 0x8000 : r == 2 ? 7 : rand());
            }
        uint16_t tag = (uint16_t)(rand() % 3 == 0 ? 7 : rand() % 2 ? 0x8000 : rand());
        unsigned want = 0;
        for (int k = 0; k < 2; k++)
            for (int s = 0; s < INDEX_SLOTS; s++)
                want |= (unsigned)(b[k].tag[s] == tag) << (k * 4 + s);
        CHECK_EQ(index_tag_match(&b[0], &b[1], tag), want);
        CHECK_EQ(index_tag_match_portable(&b[0], &b[1], tag), want);
        if (t_cur_failed)
            return;
    }
}

/* The table never grows before an insert fails, and that is past 95 %. */
static void test_grow_only_on_failure(void)
{
    index_table t;
    index_init(&t, 1024);
    enum { N = 1024 * 4 };
    item *it = calloc(N, sizeof *it);
    long i = 0;
    for (; i < N; i++) {
        make_item(&it[i], "grow/%ld", i);
        uint64_t buckets = index_buckets(&t);
        CHECK_EQ(index_insert(&t, &it[i].node), MEMOS_OK);
        if (index_buckets(&t) != buckets) {
            CHECK_EQ(t.grows, 1);
            CHECK((double)i / (1024.0 * INDEX_SLOTS) >= 0.95);
            break;
        }
    }
    check_ok(&t);
    index_destroy(&t);
    free(it);
}

int main(void)
{
    RUN(test_basic);
    RUN(test_hash_quality);
    RUN(test_random_vs_reference);
    RUN(test_collisions);
    RUN(test_load_factor);
    RUN(test_growth_failure);
    RUN(test_tag_match);
    RUN(test_grow_only_on_failure);
    return DONE("test_index");
}
