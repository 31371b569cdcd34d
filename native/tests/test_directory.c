/*
 * test_directory.c — unit tests of directory.c: every transition of the
 * coherence directory under protocols 1 and 2, acknowledgements by ack, by
 * reopening and by release (a holder that dies without acknowledging),
 * timeouts, the message queue, the event ring, and a random run checked
 * against the invariants.
 */
#include <stdlib.h>
#include <string.h>

#include "directory.h"
#include "tcheck.h"

#define K "agent/sess/slot"
#define KL (sizeof K - 1)

enum { A = 1000, B = 1001, C = 1002 };

static size_t drain_msgs(dir_table *d, uint64_t *agents, size_t max)
{
    dir_msg m[64];
    size_t n = dir_take_msgs(d, m, 64);
    for (size_t i = 0; i < n; i++) {
        if (agents && i < max)
            agents[i] = m[i].agent;
        free(m[i].key);
    }
    return n;
}

static size_t drain_events(dir_table *d)
{
    dir_event e[256];
    size_t n, total = 0;
    while ((n = dir_take_events(d, e, 256)) > 0) {
        for (size_t i = 0; i < n; i++)
            free(e[i].key);
        total += n;
    }
    return total;
}

/* The seed's workflow: A reads → S; B writes → A invalidated → A acks → B in E → publish → M. */
static void test_workflow_protocol2(void)
{
    dir_table *d = dir_new();
    CHECK_EQ(dir_read(d, K, KL, A, 2), DIR_GRANTED);
    CHECK_EQ(dir_state(d, K, KL, A), DIR_S);
    CHECK_EQ(dir_write(d, K, KL, B, 2, 0), DIR_PENDING);
    CHECK_EQ(dir_state(d, K, KL, B), DIR_P);
    CHECK_EQ(dir_state(d, K, KL, A), DIR_I);
    uint64_t who[4];
    CHECK_EQ(drain_msgs(d, who, 4), 1);
    CHECK_EQ(who[0], A);
    CHECK_EQ(dir_ack(d, K, KL, A), 1);            /* the last ack grants */
    CHECK_EQ(dir_state(d, K, KL, B), DIR_E);
    CHECK_EQ(dir_publish(d, K, KL, B), MEMOS_OK);
    CHECK_EQ(dir_state(d, K, KL, B), DIR_M);
    dir_stats st;
    dir_get_stats(d, &st);
    CHECK_EQ(st.invalidations, 1);
    CHECK_EQ(st.acks, 1);
    CHECK_EQ(st.pending_waits, 1);
    CHECK_EQ(st.writes, 1);
    CHECK_EQ(st.publishes, 1);
    /* the events name each transition in order */
    dir_event e[32];
    size_t n = dir_take_events(d, e, 32);
    int seen_s = 0, seen_i = 0, seen_ack = 0, seen_e = 0, seen_m = 0;
    for (size_t i = 0; i < n; i++) {
        if (e[i].agent == A && e[i].to == DIR_S && e[i].cause == DIR_CAUSE_READ)
            seen_s = 1;
        if (e[i].agent == A && e[i].to == DIR_I && e[i].cause == DIR_CAUSE_INVALIDATE)
            seen_i = seen_s;
        if (e[i].agent == A && e[i].cause == DIR_CAUSE_ACK)
            seen_ack = seen_i;
        if (e[i].agent == B && e[i].to == DIR_E && e[i].cause == DIR_CAUSE_GRANT)
            seen_e = seen_ack;
        if (e[i].agent == B && e[i].to == DIR_M)
            seen_m = seen_e;
        CHECK(e[i].klen == KL && memcmp(e[i].key, K, KL) == 0);
        free(e[i].key);
    }
    CHECK(seen_m);
    CHECK_EQ(dir_check(d), MEMOS_OK);
    dir_release(d, K, KL, A, 0);
    dir_release(d, K, KL, B, 1);
    dir_get_stats(d, &st);
    CHECK_EQ(st.slots, 0);
    CHECK_EQ(st.holders, 0);
    dir_delete(d);
}

/* Protocol 1: the writer goes on at once; the invalidation is only queued. */
static void test_protocol1_batched(void)
{
    dir_table *d = dir_new();
    CHECK_EQ(dir_read(d, K, KL, A, 1), DIR_GRANTED);
    CHECK_EQ(dir_read(d, K, KL, C, 1), DIR_GRANTED);
    CHECK_EQ(dir_write(d, K, KL, B, 1, 0), DIR_GRANTED);
    CHECK_EQ(dir_state(d, K, KL, B), DIR_E);
    CHECK_EQ(dir_state(d, K, KL, A), DIR_I);
    CHECK_EQ(dir_state(d, K, KL, C), DIR_I);
    CHECK_EQ(dir_msgs_queued(d), 2);
    /* a reader arriving while B is in E reads the published version (S); B's
     * publish invalidates it in turn */
    CHECK_EQ(dir_read(d, K, KL, C, 1), DIR_GRANTED);   /* reopen acks C */
    CHECK_EQ(dir_state(d, K, KL, C), DIR_S);
    CHECK_EQ(dir_publish(d, K, KL, B), MEMOS_OK);
    CHECK_EQ(dir_state(d, K, KL, C), DIR_I);
    uint64_t who[8];
    size_t n = drain_msgs(d, who, 8);
    CHECK_EQ(n, 3);
    CHECK_EQ(dir_check(d), MEMOS_OK);
    dir_delete(d);
}

/* A holder that dies without acknowledging: the kernel's release counts. */
static void test_release_counts_as_ack(void)
{
    dir_table *d = dir_new();
    dir_read(d, K, KL, A, 2);
    dir_read(d, K, KL, A, 2);                     /* two handles */
    CHECK_EQ(dir_write(d, K, KL, B, 2, 0), DIR_PENDING);
    CHECK_EQ(dir_release(d, K, KL, A, 0), 0);     /* one handle left: still waiting */
    CHECK_EQ(dir_state(d, K, KL, B), DIR_P);
    CHECK_EQ(dir_release(d, K, KL, A, 0), 1);     /* the last one: granted */
    CHECK_EQ(dir_state(d, K, KL, B), DIR_E);
    dir_stats st;
    dir_get_stats(d, &st);
    CHECK_EQ(st.acks, 1);
    CHECK_EQ(dir_check(d), MEMOS_OK);
    drain_msgs(d, NULL, 0);
    dir_delete(d);
}

/* Protocol 2: no reader opens while a writer is granted or pending. */
static void test_protocol2_readers_wait(void)
{
    dir_table *d = dir_new();
    CHECK_EQ(dir_write(d, K, KL, B, 2, 0), DIR_GRANTED);   /* nobody to invalidate */
    CHECK_EQ(dir_read(d, K, KL, A, 2), DIR_WAIT);
    CHECK_EQ(dir_state(d, K, KL, A), DIR_I);
    CHECK_EQ(dir_write(d, K, KL, C, 2, 0), DIR_WAIT);      /* one writer at a time */
    CHECK_EQ(dir_publish(d, K, KL, B), MEMOS_OK);
    CHECK_EQ(dir_write(d, K, KL, C, 2, 0), DIR_WAIT);      /* B's write handle is open */
    /* after the publish a reader may come: B is downgraded to S */
    CHECK_EQ(dir_read(d, K, KL, A, 2), DIR_GRANTED);
    CHECK_EQ(dir_state(d, K, KL, B), DIR_S);
    CHECK_EQ(dir_release(d, K, KL, B, 1), 0);
    CHECK_EQ(dir_state(d, K, KL, B), DIR_I);
    CHECK_EQ(dir_write(d, K, KL, C, 2, 0), DIR_PENDING);   /* A must ack */
    dir_stats st;
    dir_get_stats(d, &st);
    CHECK(st.read_waits >= 1);
    CHECK_EQ(st.downgrades, 1);
    CHECK_EQ(dir_check(d), MEMOS_OK);
    drain_msgs(d, NULL, 0);
    dir_delete(d);
}

/* A timeout restores every holder that had not acknowledged. */
static void test_cancel_restores(void)
{
    dir_table *d = dir_new();
    dir_read(d, K, KL, A, 2);
    dir_read(d, K, KL, C, 2);
    CHECK_EQ(dir_write(d, K, KL, B, 2, 0), DIR_PENDING);
    CHECK_EQ(dir_ack(d, K, KL, C), 0);            /* A has not acked yet */
    CHECK_EQ(dir_cancel(d, K, KL, B, 0), MEMOS_OK);
    CHECK_EQ(dir_state(d, K, KL, A), DIR_S);      /* nothing changed for A */
    CHECK_EQ(dir_state(d, K, KL, C), DIR_I);      /* C dropped its copy already */
    CHECK_EQ(dir_state(d, K, KL, B), DIR_I);
    CHECK_EQ(dir_cancel(d, K, KL, B, 0), MEMOS_ENOENT);
    dir_stats st;
    dir_get_stats(d, &st);
    CHECK_EQ(st.timeouts, 1);
    CHECK_EQ(dir_check(d), MEMOS_OK);
    /* a pending writer that closes cancels the same way */
    CHECK_EQ(dir_write(d, K, KL, B, 2, 0), DIR_PENDING);
    CHECK_EQ(dir_release(d, K, KL, B, 1), 0);
    CHECK_EQ(dir_state(d, K, KL, A), DIR_S);
    CHECK_EQ(dir_check(d), MEMOS_OK);
    drain_msgs(d, NULL, 0);
    dir_delete(d);
}

/* The same agent reading and writing is one holder; M → S on its own release. */
static void test_same_agent_and_upgrade(void)
{
    dir_table *d = dir_new();
    dir_read(d, K, KL, A, 1);
    CHECK_EQ(dir_write(d, K, KL, A, 1, 0), DIR_GRANTED);
    CHECK_EQ(dir_state(d, K, KL, A), DIR_E);
    CHECK_EQ(dir_msgs_queued(d), 0);
    dir_publish(d, K, KL, A);
    dir_release(d, K, KL, A, 1);
    CHECK_EQ(dir_state(d, K, KL, A), DIR_S);      /* still reading */
    /* a writer downgraded by a reader regains E with an upgrade */
    dir_write(d, K, KL, B, 1, 0);
    dir_publish(d, K, KL, B);
    dir_read(d, K, KL, C, 1);
    CHECK_EQ(dir_state(d, K, KL, B), DIR_S);
    CHECK_EQ(dir_write(d, K, KL, B, 1, 1), DIR_GRANTED);
    CHECK_EQ(dir_state(d, K, KL, B), DIR_E);
    CHECK_EQ(dir_state(d, K, KL, C), DIR_I);
    uint8_t states[8];
    uint64_t agents[8];
    CHECK_EQ(dir_holders(d, K, KL, agents, states, 8), 3);
    CHECK_EQ(dir_check(d), MEMOS_OK);
    CHECK_EQ(dir_forget(d, K, KL), 3);
    dir_stats st;
    dir_get_stats(d, &st);
    CHECK_EQ(st.slots, 0);
    drain_msgs(d, NULL, 0);
    dir_delete(d);
}

/* The event ring keeps the newest events and counts the dropped ones. */
static void test_event_ring_bound(void)
{
    dir_table *d = dir_new();
    for (int i = 0; i < 3000; i++) {
        dir_read(d, K, KL, A, 1);
        dir_release(d, K, KL, A, 0);
    }
    dir_stats st;
    dir_get_stats(d, &st);
    CHECK(st.events_dropped > 0);
    CHECK_EQ(drain_events(d), 4096);
    dir_delete(d);
}

static uint64_t rng = 88172645463325252ull;
static unsigned rnd(unsigned n)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (unsigned)(rng % n);
}

/* Random operations by 5 agents on 7 slots, against handle counts kept
 * here; the invariants hold throughout and everything is freed at the end. */
static void test_random(void)
{
    dir_table *d = dir_new();
    enum { NA = 5, NS = 7 };
    int reads[NA][NS] = {{0}}, writes[NA][NS] = {{0}};
    char keys[NS][16];
    for (int s = 0; s < NS; s++)
        snprintf(keys[s], sizeof keys[s], "a/s/%d", s);
    for (int step = 0; step < 200000; step++) {
        int a = rnd(NA), s = rnd(NS), proto = 1 + rnd(2);
        const char *k = keys[s];
        size_t kl = strlen(k);
        switch (rnd(7)) {
        case 0:
            if (dir_read(d, k, kl, a, proto) == DIR_GRANTED)
                reads[a][s]++;
            break;
        case 1: {
            int rc = dir_write(d, k, kl, a, proto, 0);
            if (rc == DIR_GRANTED || rc == DIR_PENDING)
                writes[a][s]++;
            break;
        }
        case 2:
            dir_ack(d, k, kl, a);
            break;
        case 3:
            if (reads[a][s] > 0) {
                dir_release(d, k, kl, a, 0);
                reads[a][s]--;
            }
            break;
        case 4:
            if (writes[a][s] > 0) {
                dir_release(d, k, kl, a, 1);
                writes[a][s]--;
            }
            break;
        case 5:
            if (dir_state(d, k, kl, a) == DIR_E)
                dir_publish(d, k, kl, a);
            break;
        case 6:
            if (dir_state(d, k, kl, a) == DIR_P && dir_cancel(d, k, kl, a, 0) == MEMOS_OK)
                writes[a][s]--;
            break;
        }
        if (step % 997 == 0) {
            CHECK_EQ(dir_check(d), MEMOS_OK);
            drain_msgs(d, NULL, 0);
            drain_events(d);
        }
    }
    CHECK_EQ(dir_check(d), MEMOS_OK);
    for (int a = 0; a < NA; a++)
        for (int s = 0; s < NS; s++) {
            while (reads[a][s]-- > 0)
                dir_release(d, keys[s], strlen(keys[s]), a, 0);
            while (writes[a][s]-- > 0)
                dir_release(d, keys[s], strlen(keys[s]), a, 1);
        }
    dir_stats st;
    dir_get_stats(d, &st);
    CHECK_EQ(st.slots, 0);
    CHECK_EQ(st.holders, 0);
    dir_delete(d);
}

int main(void)
{
    RUN(test_workflow_protocol2);
    RUN(test_protocol1_batched);
    RUN(test_release_counts_as_ack);
    RUN(test_protocol2_readers_wait);
    RUN(test_cancel_restores);
    RUN(test_same_agent_and_upgrade);
    RUN(test_event_ring_bound);
    RUN(test_random);
    return DONE("test_directory");
}
