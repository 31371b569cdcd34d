/*
 * test_prefetch.c — unit tests of prefetch.c: stride detection (unit,
 * non-unit, negative, confirmation count, jumps, re-reads, a stride that
 * changes, clearing), sessions kept apart and bounded; the heat table
 * (accumulation, decay by half-life, eviction of the coldest, top-k order,
 * weighted sampling without replacement, removal, a randomized run against a
 * reference), bad configs, and two threads on one table.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "prefetch.h"
#include "tcheck.h"

static char why[256];

static void check_ok(pf_table *p)
{
    int rc = pf_check(p, why, sizeof why);
    if (rc != MEMOS_OK)
        fprintf(stderr, "pf_check: %s\n", why);
    CHECK_EQ(rc, MEMOS_OK);
}

static pf_table *table(uint32_t sessions, uint32_t heat, uint32_t confirm, double halflife)
{
    pf_config c = { .sessions = sessions, .heat_capacity = heat, .confirm = confirm,
                    .halflife = halflife };
    pf_table *p = pf_new(&c);
    CHECK(p != NULL);
    return p;
}

/* ---- stride ---- */

static void test_unit_stride(void)
{
    pf_table *p = table(16, 16, 2, 100);
    CHECK_EQ(pf_stride_observe(p, 7, 0, NULL), 0);      /* first read: nothing known */
    CHECK_EQ(pf_stride_observe(p, 7, 1, NULL), 0);      /* delta 1 once: not confirmed */
    CHECK_EQ(pf_stride_observe(p, 7, 2, NULL), 1);      /* twice: confirmed */
    pf_stride_info st;
    CHECK_EQ(pf_stride_observe(p, 7, 3, &st), 1);
    CHECK_EQ(st.last_index, 3);
    CHECK_EQ(st.candidate, 1);
    CHECK_EQ(st.run, 3);
    CHECK_EQ(st.observations, 4);
    check_ok(p);
    pf_free(p);
}

static void test_non_unit_and_negative(void)
{
    pf_table *p = table(16, 16, 3, 100);
    /* confirm = 3: three equal deltas in a row */
    int64_t idx[] = { 10, 13, 16 };
    for (int i = 0; i < 3; i++)
        CHECK_EQ(pf_stride_observe(p, 1, idx[i], NULL), 0);
    CHECK_EQ(pf_stride_observe(p, 1, 19, NULL), 3);
    /* another session reads backwards by 2 */
    int64_t back[] = { 100, 98, 96 };
    for (int i = 0; i < 3; i++)
        CHECK_EQ(pf_stride_observe(p, 2, back[i], NULL), 0);
    CHECK_EQ(pf_stride_observe(p, 2, 94, NULL), -2);
    /* the first session is unaffected */
    pf_stride_info st;
    CHECK_EQ(pf_stride_get(p, 1, &st), MEMOS_OK);
    CHECK_EQ(st.stride, 3);
    CHECK_EQ(pf_stride_get(p, 3, &st), MEMOS_ENOENT);
    pf_stats s;
    pf_get_stats(p, &s);
    CHECK_EQ(s.sessions, 2);
    CHECK_EQ(s.confirmations, 2);
    CHECK_EQ(s.observations, 8);
    check_ok(p);
    pf_free(p);
}

static void test_interrupted_run_does_not_confirm(void)
{
    pf_table *p = table(16, 16, 2, 100);
    /* deltas 3, 1, 3, 1, ...: never twice the same in a row */
    int64_t i = 0;
    for (int k = 0; k < 20; k++) {
        i += (k % 2) ? 1 : 3;
        CHECK_EQ(pf_stride_observe(p, 5, i, NULL), 0);
    }
    pf_free(p);
}

static void test_rereads_and_jumps(void)
{
    pf_table *p = table(16, 16, 2, 100);
    pf_stride_observe(p, 9, 0, NULL);
    pf_stride_observe(p, 9, 4, NULL);
    CHECK_EQ(pf_stride_observe(p, 9, 4, NULL), 0);      /* a re-read: delta 0 ignored */
    CHECK_EQ(pf_stride_observe(p, 9, 8, NULL), 4);      /* 4, (0), 4: confirmed */
    CHECK_EQ(pf_stride_observe(p, 9, 50, NULL), 4);     /* one jump keeps the stride */
    CHECK_EQ(pf_stride_observe(p, 9, 54, NULL), 4);
    CHECK_EQ(pf_stride_observe(p, 9, 58, NULL), 4);
    /* the pattern changes to stride 1: confirmed after two */
    CHECK_EQ(pf_stride_observe(p, 9, 59, NULL), 4);
    CHECK_EQ(pf_stride_observe(p, 9, 60, NULL), 1);
    pf_free(p);
}

static void test_stride_cleared_by_noise(void)
{
    pf_table *p = table(16, 16, 2, 100);
    for (int64_t i = 0; i <= 6; i += 2)
        pf_stride_observe(p, 4, i, NULL);
    pf_stride_info st;
    pf_stride_get(p, 4, &st);
    CHECK_EQ(st.stride, 2);
    /* deltas 5, 7, 9 keep it (fewer than 2 * confirm misses), 11 clears it */
    int64_t i = 6, d[] = { 5, 7, 9 };
    for (int k = 0; k < 3; k++) {
        i += d[k];
        CHECK_EQ(pf_stride_observe(p, 4, i, NULL), 2);
    }
    CHECK_EQ(pf_stride_observe(p, 4, i + 11, NULL), 0);
    pf_free(p);
}

static void test_sessions_bounded(void)
{
    pf_table *p = table(4, 16, 2, 100);
    for (uint64_t s = 1; s <= 4; s++)
        for (int64_t i = 0; i < 3; i++)
            pf_stride_observe(p, s, i * (int64_t)s, NULL);
    pf_stride_observe(p, 1, 3, NULL);     /* session 1 is now the most recent */
    pf_stride_observe(p, 99, 0, NULL);    /* evicts the least recent: session 2 */
    pf_stride_info st;
    CHECK_EQ(pf_stride_get(p, 2, &st), MEMOS_ENOENT);
    CHECK_EQ(pf_stride_get(p, 1, &st), MEMOS_OK);
    CHECK_EQ(st.stride, 1);
    CHECK_EQ(pf_stride_get(p, 3, &st), MEMOS_OK);
    CHECK_EQ(st.stride, 3);
    CHECK_EQ(pf_stride_get(p, 99, &st), MEMOS_OK);
    pf_stats s;
    pf_get_stats(p, &s);
    CHECK_EQ(s.sessions, 4);
    CHECK_EQ(s.sessions_evicted, 1);
    CHECK_EQ(pf_stride_forget(p, 3), MEMOS_OK);
    CHECK_EQ(pf_stride_forget(p, 3), MEMOS_ENOENT);
    CHECK_EQ(pf_stride_get(p, 3, &st), MEMOS_ENOENT);
    check_ok(p);
    /* many sessions through a small table keep the map consistent */
    for (uint64_t s2 = 0; s2 < 1000; s2++) {
        pf_stride_observe(p, s2 * 7919, 1, NULL);
        if (s2 % 3 == 0)
            pf_stride_forget(p, (s2 / 2) * 7919);
    }
    check_ok(p);
    pf_free(p);
}

/* ---- heat ---- */

static void test_heat_accumulates_and_decays(void)
{
    pf_table *p = table(4, 64, 2, 10);      /* heat halves every 10 touches */
    pf_heat_touch(p, 1, 1.0, NULL);
    /* 9 more touches of another id: 10 touches since id 1's */
    for (int i = 0; i < 9; i++)
        pf_heat_touch(p, 2, 1.0, NULL);
    pf_heat_touch(p, 3, 1.0, NULL);
    double h1 = pf_heat_get(p, 1);
    CHECK(fabs(h1 - 0.5) < 1e-9);           /* exactly one half-life ago */
    CHECK(fabs(pf_heat_get(p, 3) - 1.0) < 1e-9);
    CHECK(pf_heat_get(p, 2) > 5.0 && pf_heat_get(p, 2) < 9.0);
    CHECK(pf_heat_get(p, 42) == 0.0);
    /* weights add */
    pf_heat_touch(p, 3, 2.5, NULL);
    CHECK(pf_heat_get(p, 3) > 3.3 && pf_heat_get(p, 3) < 3.5);
    CHECK_EQ(pf_heat_touch(p, 3, 0.0, NULL), MEMOS_EINVAL);
    CHECK_EQ(pf_heat_touch(p, 3, -1.0, NULL), MEMOS_EINVAL);
    CHECK_EQ(pf_heat_touch(p, 3, NAN, NULL), MEMOS_EINVAL);
    check_ok(p);
    pf_free(p);
}

static void test_heat_rescale_keeps_order(void)
{
    pf_table *p = table(4, 8, 2, 1.0);      /* the scale doubles every touch: rescales often */
    for (int i = 0; i < 5000; i++)
        pf_heat_touch(p, (uint64_t)(i % 3), 1.0, NULL);
    /* the last touch was id 4999 % 3 = 1, before it 0, before that 2 */
    pf_heat_item top[3];
    CHECK_EQ(pf_heat_top(p, top, 3), 3);
    CHECK_EQ(top[0].id, 1);
    CHECK_EQ(top[1].id, 0);
    CHECK_EQ(top[2].id, 2);
    CHECK(isfinite(top[0].heat) && top[0].heat > 1.0 && top[0].heat < 2.0);
    check_ok(p);
    pf_free(p);
}

static void test_heat_evicts_coldest(void)
{
    pf_table *p = table(4, 4, 2, 1e9);      /* no decay to speak of */
    uint64_t ev = 0;
    CHECK_EQ(pf_heat_touch(p, 10, 5.0, &ev), 0);
    CHECK_EQ(pf_heat_touch(p, 11, 1.0, &ev), 0);
    CHECK_EQ(pf_heat_touch(p, 12, 3.0, &ev), 0);
    CHECK_EQ(pf_heat_touch(p, 13, 4.0, &ev), 0);
    CHECK_EQ(pf_heat_touch(p, 12, 1.5, &ev), 0);   /* known id: no eviction */
    CHECK_EQ(pf_heat_touch(p, 14, 2.0, &ev), 1);   /* full: evicts the coldest, 11 */
    CHECK_EQ(ev, 11);
    CHECK(pf_heat_get(p, 11) == 0.0);
    CHECK_EQ(pf_heat_touch(p, 15, 9.0, &ev), 1);   /* now 14 (2.0) is the coldest */
    CHECK_EQ(ev, 14);
    pf_stats s;
    pf_get_stats(p, &s);
    CHECK_EQ(s.heat_entries, 4);
    CHECK_EQ(s.heat_evicted, 2);
    CHECK_EQ(s.heat_touches, 7);
    pf_heat_item top[8];
    CHECK_EQ(pf_heat_top(p, top, 8), 4);
    uint64_t want[] = { 15, 10, 12, 13 };          /* 9, 5, 4.5 (3 + 1.5), 4 */
    for (int i = 0; i < 4; i++)
        CHECK_EQ(top[i].id, want[i]);
    CHECK_EQ(pf_heat_top(p, top, 2), 2);
    CHECK_EQ(top[1].id, 10);
    CHECK_EQ(pf_heat_remove(p, 10), MEMOS_OK);
    CHECK_EQ(pf_heat_remove(p, 10), MEMOS_ENOENT);
    CHECK_EQ(pf_heat_top(p, top, 8), 3);
    CHECK_EQ(top[1].id, 12);
    check_ok(p);
    pf_free(p);
}

static void test_heat_sample(void)
{
    pf_table *p = table(4, 64, 2, 1e9);
    /* id i has heat i + 1 for i < 10; id 100 is the hottest by far */
    for (uint64_t i = 0; i < 10; i++)
        pf_heat_touch(p, i, (double)(i + 1), NULL);
    pf_heat_touch(p, 100, 1000.0, NULL);
    uint64_t rng = 12345, out[16];
    /* distinct ids, only from the pool of the 4 hottest: 100, 9, 8, 7 */
    for (int round = 0; round < 200; round++) {
        size_t n = pf_heat_sample(p, out, 3, 4, &rng);
        CHECK_EQ(n, 3);
        for (size_t a = 0; a < n; a++) {
            CHECK(out[a] == 100 || out[a] == 9 || out[a] == 8 || out[a] == 7);
            for (size_t b = a + 1; b < n; b++)
                CHECK(out[a] != out[b]);
        }
    }
    /* the first draw is proportional to heat: 100 first nearly always */
    int first100 = 0, count[10] = { 0 };
    for (int round = 0; round < 2000; round++) {
        pf_heat_sample(p, out, 1, 64, &rng);
        if (out[0] == 100)
            first100++;
        else if (out[0] < 10)
            count[out[0]]++;
    }
    CHECK(first100 > 1800);
    /* among the rest, heat 10 (id 9) is drawn far more often than heat 1 (id 0) */
    for (int round = 0; round < 4000; round++) {
        size_t n = pf_heat_sample(p, out, 2, 64, &rng);
        CHECK_EQ(n, 2);
        if (out[0] == 100 && out[1] < 10)
            count[out[1]]++;
    }
    CHECK(count[9] > 3 * count[0]);
    /* k larger than what is there */
    CHECK_EQ(pf_heat_sample(p, out, 16, 64, &rng), 11);
    CHECK_EQ(pf_heat_sample(p, out, 0, 64, &rng), 0);
    rng = 0;                                        /* a zero seed is replaced */
    CHECK_EQ(pf_heat_sample(p, out, 2, 2, &rng), 2);
    CHECK(rng != 0);
    pf_free(p);
}

/* A randomized run against a reference (a plain array, exact decay). */
static void test_heat_reference(void)
{
    enum { CAP = 32, IDS = 80, STEPS = 20000 };
    const double H = 50.0;
    pf_table *p = table(4, CAP, 2, H);
    double ref[IDS];            /* heat now, 0 = absent */
    memset(ref, 0, sizeof ref);
    uint64_t rng = 7;
    int bad = 0;
    for (int step = 0; step < STEPS; step++) {
        uint64_t r = rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t id = (r >> 33) % IDS;
        if ((r >> 20) % 11 == 0) {
            int rc = pf_heat_remove(p, id);
            if ((rc == MEMOS_OK) != (ref[id] > 0.0))
                bad++;
            ref[id] = 0.0;
            continue;
        }
        double w = 1.0 + (double)((r >> 40) % 4);
        const double g = 0.9862327044933592;   /* 2^(-1/H), H = 50 */
        for (int i = 0; i < IDS; i++)
            ref[i] *= g;
        int present = 0, live = 0;
        for (int i = 0; i < IDS; i++)
            live += ref[i] > 0.0;
        present = ref[id] > 0.0;
        uint64_t ev = UINT64_MAX;
        int rc = pf_heat_touch(p, id, w, &ev);
        if (!present && live == CAP) {
            /* the reference's coldest (ties: any of them) */
            double cold = INFINITY;
            for (int i = 0; i < IDS; i++)
                if (ref[i] > 0.0 && ref[i] < cold)
                    cold = ref[i];
            if (rc != 1 || ev >= IDS || fabs(ref[ev] - cold) > 1e-9 * cold)
                bad++;
            else
                ref[ev] = 0.0;
        } else if (rc != 0) {
            bad++;
        }
        ref[id] += w;
        if (step % 997 == 0) {
            for (int i = 0; i < IDS; i++) {
                double h = pf_heat_get(p, (uint64_t)i);
                if (fabs(h - ref[i]) > 1e-6 * (1.0 + ref[i]))
                    bad++;
            }
        }
    }
    CHECK_EQ(bad, 0);
    check_ok(p);
    pf_free(p);
}

static void test_bad_config(void)
{
    pf_config c;
    pf_config_default(&c);
    CHECK_EQ(c.confirm, 2);
    pf_table *p = pf_new(NULL);
    CHECK(p != NULL);
    pf_free(p);
    pf_free(NULL);
    pf_config b = c;
    b.sessions = 0;
    errno = 0;
    CHECK(pf_new(&b) == NULL && errno == EINVAL);
    b = c;
    b.confirm = 0;
    CHECK(pf_new(&b) == NULL);
    b = c;
    b.halflife = 0.0;
    CHECK(pf_new(&b) == NULL);
    b = c;
    b.halflife = INFINITY;
    CHECK(pf_new(&b) == NULL);
    b = c;
    b.heat_capacity = (1u << 24) + 1;
    CHECK(pf_new(&b) == NULL);
}

/* Two threads on one table: the internal mutex keeps it consistent. */
static pf_table *shared;

static void *hammer(void *arg)
{
    uint64_t base = (uint64_t)(uintptr_t)arg, rng = base + 1;
    uint64_t out[8];
    pf_heat_item top[8];
    for (int i = 0; i < 20000; i++) {
        pf_stride_observe(shared, base + (uint64_t)(i % 50), i, NULL);
        pf_heat_touch(shared, base + (uint64_t)(i % 300), 1.0, NULL);
        if (i % 64 == 0) {
            pf_heat_sample(shared, out, 4, 32, &rng);
            pf_heat_top(shared, top, 8);
            pf_heat_remove(shared, base + (uint64_t)(i % 7));
            pf_stride_forget(shared, base + (uint64_t)(i % 13));
        }
    }
    return NULL;
}

static void test_threads(void)
{
    shared = table(64, 128, 2, 100);
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, hammer, (void *)(uintptr_t)(i * 1000000));
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    check_ok(shared);
    pf_stats s;
    pf_get_stats(shared, &s);
    CHECK_EQ(s.observations, 40000);
    CHECK_EQ(s.heat_touches, 40000);
    pf_free(shared);
}

int main(void)
{
    RUN(test_unit_stride);
    RUN(test_non_unit_and_negative);
    RUN(test_interrupted_run_does_not_confirm);
    RUN(test_rereads_and_jumps);
    RUN(test_stride_cleared_by_noise);
    RUN(test_sessions_bounded);
    RUN(test_heat_accumulates_and_decays);
    RUN(test_heat_rescale_keeps_order);
    RUN(test_heat_evicts_coldest);
    RUN(test_heat_sample);
    RUN(test_heat_reference);
    RUN(test_bad_config);
    RUN(test_threads);
    return DONE("test_prefetch");
}
