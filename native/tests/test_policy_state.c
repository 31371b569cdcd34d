/*
 * test_policy_state.c — unit tests of policy.c's state dump and restore (the
 * SSD tier's policy): a restored policy passes policy_check, holds the same
 * lists, ghosts and balance, and picks the same victims as the one dumped,
 * now and after the same future (lru, lfu, a hybrid setting); lru_lfu comes
 * back with its entries in the same order and the member it followed, its
 * hybrid settings and the setting in force; damaged restores are refused.
 */
#include <stdlib.h>
#include <string.h>

#include "policy.h"
#include "tcheck.h"

#define N 400

typedef struct obj {
    policy_node pn;   /* first: the policy links */
    int id;
    int in;           /* admitted */
} obj;

static char why[256];
static uint64_t rng = 88172645463325252ull;

static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static uint64_t hash_of(int id) { return (uint64_t)id * 0x9E3779B97F4A7C15ull + 1; }

/* Admits, touches, evictions and returns of evicted keys (ghost hits). */
static void churn(policy *p, obj *o, int steps, uint64_t seed)
{
    rng = seed;
    policy_node *v[4];
    for (int s = 0; s < steps; s++) {
        int id = (int)(next_rand() % N);
        uint64_t r = next_rand() % 10;
        if (!o[id].in && r < 6) {
            policy_admit(p, &o[id].pn, hash_of(id));
            o[id].in = 1;
        } else if (o[id].in && r < 9) {
            policy_touch(p, &o[id].pn);
        } else {
            size_t got = policy_victims(p, v, 3);
            for (size_t i = 0; i < got; i++) {
                obj *x = (obj *)v[i];
                policy_note_evict(p, &x->pn);
                policy_remove(p, &x->pn);
                x->in = 0;
            }
        }
    }
}

/* Copy p's state into q (empty, same kind) through the dump/restore calls. */
static int copy_state(const policy *p, obj *po, policy *q, obj *qo)
{
    policy_node *v[N];
    size_t n = policy_dump_list(p, -1, v, N);
    for (size_t i = 0; i < n; i++) {
        obj *x = (obj *)v[i];
        policy_restore_node(q, &qo[x->id].pn, x->pn.hash, x->pn.freq, x->pn.ref);
        policy_restore_stamp(q, &qo[x->id].pn, x->pn.stamp, x->pn.mcls, policy_dump_tick(p));
        qo[x->id].in = 1;
    }
    for (unsigned l = 0; l < policy_dump_lists(p); l++) {
        size_t k = policy_dump_list(p, (int)l, v, N);
        for (size_t i = 0; i < k; i++)
            if (policy_restore_place(q, &qo[((obj *)v[i])->id].pn, l) != MEMOS_OK)
                return MEMOS_EINVAL;
    }
    if (policy_dump_rings(p) && policy_restore_ghost_size(q, policy_dump_ghost_size(p)) != MEMOS_OK)
        return MEMOS_EINVAL;
    for (unsigned r = 0; r < policy_dump_rings(p); r++) {
        uint64_t epoch;
        size_t len = policy_dump_ghosts(p, r, NULL, 0, &epoch);
        policy_ghost *g = malloc((len ? len : 1) * sizeof *g);
        CHECK_EQ(policy_dump_ghosts(p, r, g, len, &epoch), len);
        int rc = policy_restore_ghosts(q, r, g, len, epoch);
        free(g);
        if (rc != MEMOS_OK)
            return rc;
    }
    uint64_t hits[2];
    double pfrac = policy_dump_balance(p, hits);
    if (policy_restore_expert(q, policy_dump_expert(p)) != MEMOS_OK)
        return MEMOS_EINVAL;
    (void)po;
    return policy_restore_finish(q, pfrac, hits, why, sizeof why);
}

static void same_victims(policy *p, policy *q, size_t n)
{
    policy_node *a[64], *b[64];
    size_t ga = policy_victims(p, a, n), gb = policy_victims(q, b, n);
    CHECK_EQ(ga, gb);
    for (size_t i = 0; i < ga && i < gb; i++)
        CHECK_EQ(((obj *)a[i])->id, ((obj *)b[i])->id);
}

/* What dump and restore keep (not lru_lfu's shadows, which start anew; the
 * ghost table's slots, some of them aged out, are not compared). */
static void same_state(const policy_stats *a, const policy_stats *b)
{
    CHECK_EQ(a->ghost_hits_recency, b->ghost_hits_recency);
    CHECK_EQ(a->ghost_hits_frequency, b->ghost_hits_frequency);
    CHECK_EQ(a->probation, b->probation);
    CHECK_EQ(a->protected_, b->protected_);
    CHECK(a->recency == b->recency);
    CHECK_EQ(a->expert, b->expert);
}

/* fixed >= 0: the hybrid setting lru_lfu@fixed */
static void roundtrip(const char *name, int fixed)
{
    static obj po[N], qo[N];
    memset(po, 0, sizeof po);
    memset(qo, 0, sizeof qo);
    for (int i = 0; i < N; i++)
        po[i].id = qo[i].id = i;
    policy p, q;
    CHECK_EQ(policy_init(&p, name, NULL, NULL), MEMOS_OK);
    CHECK_EQ(policy_init(&q, name, NULL, NULL), MEMOS_OK);
    if (fixed >= 0) {
        char setting[16];
        snprintf(setting, sizeof setting, "lru_lfu@%d", fixed);
        CHECK_EQ(policy_select(&p, setting), MEMOS_OK);
        CHECK_EQ(policy_select(&q, setting), MEMOS_OK);
    }
    CHECK_EQ(policy_dump_format(&p) != 0, strncmp(name, "lru_lfu", 7) == 0);
    churn(&p, po, 20000, 1234);
    CHECK_EQ(policy_check(&p, why, sizeof why), MEMOS_OK);
    int rc = copy_state(&p, po, &q, qo);
    if (rc != MEMOS_OK)
        fprintf(stderr, "restore: %s\n", why);
    CHECK_EQ(rc, MEMOS_OK);
    policy_stats a, b;
    policy_get_stats(&p, &a);
    policy_get_stats(&q, &b);
    same_state(&a, &b);
    for (unsigned r = 0; r < policy_dump_rings(&p); r++) {   /* every live ghost came back */
        uint64_t e1, e2;
        CHECK_EQ(policy_dump_ghosts(&p, r, NULL, 0, &e1), policy_dump_ghosts(&q, r, NULL, 0, &e2));
        CHECK_EQ(e1, e2);
    }
    same_victims(&p, &q, 40);
    /* the same further workload: the same choices (lru_lfu's shadows start
     * anew from the restored stamps, so its rule is held: only the
     * setting's own state is compared) */
    if (strcmp(name, "lru_lfu") == 0 && fixed < 0) {
        policy_restore_expert(&p, 7);
        policy_restore_expert(&q, 7);
        policy_select(&p, "lru_lfu@7");
        policy_select(&q, "lru_lfu@7");
    }
    churn(&p, po, 5000, 999);
    churn(&q, qo, 5000, 999);
    CHECK_EQ(policy_check(&q, why, sizeof why), MEMOS_OK);
    same_victims(&p, &q, 60);
    policy_get_stats(&p, &a);
    policy_get_stats(&q, &b);
    same_state(&a, &b);
    policy_destroy(&p);
    policy_destroy(&q);
}

static void test_refusals(void)
{
    static obj o[4];
    memset(o, 0, sizeof o);
    policy q;
    CHECK_EQ(policy_init(&q, "lru_lfu", NULL, NULL), MEMOS_OK);
    CHECK_EQ(policy_select(&q, "lru_lfu@1"), MEMOS_OK);
    policy_restore_node(&q, &o[0].pn, 1, 0, 0);
    policy_restore_node(&q, &o[1].pn, 2, 3, 1);
    CHECK_EQ(policy_restore_place(&q, &o[0].pn, 0), MEMOS_OK);
    CHECK_EQ(policy_restore_place(&q, &o[0].pn, 1), MEMOS_EINVAL);   /* placed twice */
    CHECK_EQ(policy_restore_place(&q, &o[1].pn, 2), MEMOS_EINVAL);   /* no such list */
    uint64_t hits[2] = { 0, 0 };
    CHECK_EQ(policy_restore_finish(&q, 0.5, hits, why, sizeof why), MEMOS_EINVAL);  /* o[1] unplaced */
    policy_ghost g[2] = { { 7, 0, 0, 0 }, { 7, 0, 1, 0 } };
    CHECK_EQ(policy_restore_ghosts(&q, 0, g, 2, 2), MEMOS_EINVAL);     /* a fingerprint twice */
    policy_ghost wide[1] = { { 1ull << 40, 0, 0, 0 } };
    CHECK_EQ(policy_restore_ghosts(&q, 1, wide, 1, 1), MEMOS_EINVAL);  /* not a fingerprint */
    policy_ghost old[1] = { { 9, 0, 200, 0 } };
    CHECK_EQ(policy_restore_ghosts(&q, 1, old, 1, 300), MEMOS_EINVAL); /* past its ring's life */
    policy_destroy(&q);
    policy l;
    CHECK_EQ(policy_init(&l, "lfu", NULL, NULL), MEMOS_OK);
    policy_restore_node(&l, &o[2].pn, 3, 5, 0);                         /* level 3 */
    CHECK_EQ(policy_restore_place(&l, &o[2].pn, 1), MEMOS_EINVAL);
    CHECK_EQ(policy_restore_place(&l, &o[2].pn, 3), MEMOS_OK);
    CHECK_EQ(policy_restore_finish(&l, 0.5, hits, why, sizeof why), MEMOS_OK);
    policy_destroy(&l);
    /* lru_lfu: its segments, ghost rings and the setting in force come back;
     * a setting it does not have is refused */
    static obj b[2];
    memset(b, 0, sizeof b);
    policy k;
    CHECK_EQ(policy_init(&k, "lru_lfu", NULL, NULL), MEMOS_OK);
    CHECK_EQ(policy_dump_format(&k), (unsigned)POLICY_STATE_VERSION);
    CHECK_EQ(policy_dump_lists(&k), 2u);
    CHECK_EQ(policy_dump_rings(&k), 2u);
    policy_restore_node(&k, &b[0].pn, 11, 2, 1);
    CHECK_EQ(policy_restore_place(&k, &b[0].pn, 1), MEMOS_OK);
    CHECK_EQ(policy_restore_ghosts(&k, 0, g, 1, 1), MEMOS_OK);
    CHECK_EQ(policy_restore_expert(&k, 99), MEMOS_EINVAL);
    CHECK_EQ(policy_restore_expert(&k, 5), MEMOS_OK);
    CHECK_EQ(policy_restore_finish(&k, 0.5, hits, why, sizeof why), MEMOS_OK);
    policy_node *v[1];
    CHECK_EQ(policy_victims(&k, v, 1), 1);
    policy_stats st;
    policy_get_stats(&k, &st);
    CHECK_EQ(st.expert, 5u);
    CHECK_EQ(st.ghost_entries, 1u);
    CHECK_EQ(policy_check(&k, why, sizeof why), MEMOS_OK);
    policy_destroy(&k);
}

static void test_roundtrip_lru_lfu(void) { roundtrip("lru_lfu", -1); }
static void test_roundtrip_hybrid(void) { roundtrip("lru_lfu", 1); }
static void test_roundtrip_hybrid_loops(void) { roundtrip("lru_lfu", 5); }
static void test_roundtrip_lru(void) { roundtrip("lru", -1); }
static void test_roundtrip_lfu(void) { roundtrip("lfu", -1); }

int main(void)
{
    RUN(test_roundtrip_lru_lfu);
    RUN(test_roundtrip_hybrid);
    RUN(test_roundtrip_hybrid_loops);
    RUN(test_roundtrip_lru);
    RUN(test_roundtrip_lfu);
    RUN(test_refusals);
    return DONE("test_policy_state");
}
