/*
 * test_policy.c — unit tests of policy.c: LRU order, victims skipping
 * pinned nodes, remove, foreach order, the LFU variant, a randomized run
 * against a reference recency array.
 */
#include <stdlib.h>
#include <string.h>

#include "policy.h"
#include "tcheck.h"

typedef struct obj {
    policy_node pn;   /* first: the policy links */
    int id;           /* test id */
    int pinned;       /* 1 = not a victim */
} obj;

static char why[256];

static int evictable(const policy_node *n, void *ctx)
{
    (void)ctx;
    return !((const obj *)n)->pinned;
}

static void check_ok(policy *p)
{
    int rc = policy_check(p, why, sizeof why);
    if (rc != MEMOS_OK)
        fprintf(stderr, "policy_check: %s\n", why);
    CHECK_EQ(rc, MEMOS_OK);
}

static int ids[64], nids;
static void collect(void *ctx, policy_node *n) { (void)ctx; ids[nids++] = ((obj *)n)->id; }

static void test_lru_order(void)
{
    policy p;
    CHECK_EQ(policy_init(&p, "lru", evictable, NULL), MEMOS_OK);
    obj o[4] = { { .id = 0 }, { .id = 1 }, { .id = 2 }, { .id = 3 } };
    for (int i = 0; i < 4; i++)
        policy_admit(&p, &o[i].pn);
    policy_node *v[4];
    CHECK_EQ(policy_victims(&p, v, 4), 4);
    CHECK(v[0] == &o[0].pn && v[1] == &o[1].pn && v[2] == &o[2].pn && v[3] == &o[3].pn);
    policy_touch(&p, &o[0].pn);
    CHECK_EQ(policy_victims(&p, v, 2), 2);
    CHECK(v[0] == &o[1].pn && v[1] == &o[2].pn);
    nids = 0;
    policy_foreach(&p, collect, NULL);
    CHECK(nids == 4 && ids[0] == 0 && ids[1] == 3 && ids[2] == 2 && ids[3] == 1);
    check_ok(&p);
}

static void test_victims_skip_pinned(void)
{
    policy p;
    policy_init(&p, "lru", evictable, NULL);
    obj o[5];
    memset(o, 0, sizeof o);
    for (int i = 0; i < 5; i++) {
        o[i].id = i;
        policy_admit(&p, &o[i].pn);
    }
    o[0].pinned = o[2].pinned = 1;
    policy_node *v[5];
    CHECK_EQ(policy_victims(&p, v, 5), 3);
    CHECK(v[0] == &o[1].pn && v[1] == &o[3].pn && v[2] == &o[4].pn);
    for (int i = 0; i < 5; i++)
        o[i].pinned = 1;
    CHECK_EQ(policy_victims(&p, v, 5), 0);
    policy_remove(&p, &o[2].pn);
    CHECK_EQ(policy_count(&p), 4);
    CHECK_EQ(o[2].pn.linked, 0);
    check_ok(&p);
}

static void test_lfu(void)
{
    policy p;
    CHECK_EQ(policy_init(&p, "lfu", evictable, NULL), MEMOS_OK);
    obj o[4];
    memset(o, 0, sizeof o);
    for (int i = 0; i < 4; i++) {
        o[i].id = i;
        policy_admit(&p, &o[i].pn);
    }
    for (int k = 0; k < 5; k++)
        policy_touch(&p, &o[0].pn);
    policy_touch(&p, &o[1].pn);
    policy_node *v[4];
    CHECK_EQ(policy_victims(&p, v, 4), 4);
    CHECK(v[0] == &o[2].pn && v[1] == &o[3].pn && v[2] == &o[1].pn && v[3] == &o[0].pn);
    check_ok(&p);
    /* Switching back to lru keeps the recency order. */
    CHECK_EQ(policy_select(&p, "lru"), MEMOS_OK);
    CHECK_EQ(policy_victims(&p, v, 1), 1);
    CHECK(v[0] == &o[2].pn);
    CHECK_EQ(policy_select(&p, "lfu"), MEMOS_OK);
    check_ok(&p);
    CHECK_EQ(policy_select(&p, "lru_lfu"), MEMOS_EINVAL);
    CHECK_EQ(policy_select(&p, "bogus"), MEMOS_EINVAL);
    CHECK(strcmp(p.name, "lfu") == 0);
    policy_remove(&p, &o[0].pn);
    check_ok(&p);
}

/* Random admits/touches/removes; reference: an array in MRU-first order. */
static void test_random_vs_reference(void)
{
    enum { N = 300 };
    static obj o[N];
    int ref[N], nref = 0;
    memset(o, 0, sizeof o);
    policy p;
    policy_init(&p, "lru", evictable, NULL);
    srand(3);
    for (int i = 0; i < N; i++)
        o[i].id = i;
    for (int step = 0; step < 100000; step++) {
        int i = rand() % N, pos = -1;
        for (int k = 0; k < nref; k++)
            if (ref[k] == i)
                pos = k;
        int op = rand() % 3;
        if (pos < 0) {
            policy_admit(&p, &o[i].pn);
            memmove(ref + 1, ref, (size_t)nref * sizeof *ref);
            ref[0] = i;
            nref++;
        } else if (op == 0) {
            policy_remove(&p, &o[i].pn);
            memmove(ref + pos, ref + pos + 1, (size_t)(nref - pos - 1) * sizeof *ref);
            nref--;
        } else {
            policy_touch(&p, &o[i].pn);
            memmove(ref + 1, ref, (size_t)pos * sizeof *ref);
            ref[0] = i;
        }
        if (step % 1000 == 0) {
            policy_node *v[8];
            size_t got = policy_victims(&p, v, 8);
            CHECK_EQ(got, nref < 8 ? nref : 8);
            for (size_t k = 0; k < got; k++)
                CHECK_EQ(((obj *)v[k])->id, ref[nref - 1 - (int)k]);
            check_ok(&p);
        }
    }
    CHECK_EQ(policy_count(&p), nref);
}

int main(void)
{
    RUN(test_lru_order);
    RUN(test_victims_skip_pinned);
    RUN(test_lfu);
    RUN(test_random_vs_reference);
    return DONE("test_policy");
}
