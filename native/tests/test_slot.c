/*
 * test_slot.c — the slot state machine (slot.c): each rule of
 * docs/semantics.md it decides, and the races the suite knows, replayed
 * step by step with the clock as an argument.  Every test ends with
 * memos_slot_check over the whole table.
 */
#include <string.h>

#include "slot.h"
#include "tests/tcheck.h"

#define NAME_K   11
#define NAME_TMP 12
#define A 100           /* processes (tgid = pid) */
#define B 200
#define C 300

static int64_t now;

static void checked(slot_table *t)
{
    char why[256];
    int rc = memos_slot_check(t, 0, why, sizeof why);
    if (rc != SLOT_OK)
        fprintf(stderr, "check: %s\n", why);
    CHECK_EQ(rc, SLOT_OK);
}

/* stat(2) of a name by tgid: the size it sees, or -1 for ENOENT */
static long long stat_name(slot_table *t, uint64_t name, uint32_t tgid)
{
    uint64_t ino;
    memos_slot_info in;
    if (memos_slot_lookup(t, name, tgid, &ino) != SLOT_OK)
        return -1;
    memos_slot_stat(t, ino, tgid, now, &in);
    return (long long)in.size;
}

static uint64_t version_of(slot_table *t, uint64_t name)
{
    uint64_t ino;
    memos_slot_info in;
    if (memos_slot_lookup(t, name, 0, &ino) != SLOT_OK)
        return 0;
    memos_slot_stat(t, ino, 0, now, &in);
    return in.version;
}

static void write_n(slot_table *t, uint64_t ino, uint64_t off, uint64_t n)
{
    uint64_t at;
    unsigned fx;
    CHECK_EQ(memos_slot_write_plan(t, ino, off, 0, &at, &fx), SLOT_OK);
    CHECK_EQ(memos_slot_wrote(t, ino, at, n, now), SLOT_OK);
}

static uint64_t next_version = 1;

/* close(2) by closer of a write handle on ino opened by opener, then its
 * release: the publish result (PUBLISH_*) */
static int close_writer(slot_table *t, uint64_t ino, uint32_t opener, uint32_t closer)
{
    uint64_t target, holder;
    unsigned fx;
    memos_slot_info in;
    int act = memos_slot_publish_plan(t, ino, opener, closer, &target);
    if (act == SLOT_PUBLISH_DO) {
        memos_slot_stat(t, ino, opener, now, &in);
        CHECK_EQ(memos_slot_published(t, ino, next_version++, in.draft_size, in.draft_size, now,
                                      &holder, &fx), SLOT_OK);
    }
    memos_slot_stat(t, ino, opener, now, &in);
    if (in.writers == 1 && memos_slot_publish_plan(t, ino, opener, 0, &target) == SLOT_PUBLISH_DO) {
        memos_slot_stat(t, ino, opener, now, &in);
        memos_slot_published(t, ino, next_version++, in.draft_size, in.draft_size, now, &holder, &fx);
    }
    CHECK_EQ(memos_slot_writer_gone(t, ino, opener, now, &fx), SLOT_OK);
    return act;
}

/* a whole slot written and closed by tgid: its inode */
static uint64_t save(slot_table *t, uint64_t name, uint32_t tgid, uint64_t n)
{
    uint64_t ino;
    unsigned fx;
    CHECK_EQ(memos_slot_create(t, name, tgid, tgid, 1, 0, now, &ino, &fx), SLOT_OK);
    write_n(t, ino, 0, n);
    CHECK_EQ(close_writer(t, ino, tgid, tgid), SLOT_PUBLISH_DO);
    return ino;
}

static memos_open_plan plan(slot_table *t, uint64_t ino, uint32_t tgid, int w, int tr,
                            int retry)
{
    memos_open_req rq = { tgid, tgid, w, tr, retry, 0, 0 };
    memos_open_plan p;
    CHECK_EQ(memos_slot_open_plan(t, ino, &rq, now, &p), SLOT_OK);
    return p;
}

static void test_a_create_is_found_by_its_writer_only_until_published(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t ino;
    unsigned fx;
    CHECK_EQ(memos_slot_create(t, NAME_K, A, A, 0, 0, now, &ino, &fx), SLOT_OK);
    write_n(t, ino, 0, 300);
    CHECK_EQ(stat_name(t, NAME_K, A), 300);
    CHECK_EQ(stat_name(t, NAME_K, B), -1);
    CHECK_EQ(memos_slot_create(t, NAME_K, B, B, 0, 1, now, &ino, &fx), SLOT_EEXIST);
    checked(t);
    CHECK_EQ(close_writer(t, ino, A, A), SLOT_PUBLISH_DO);
    CHECK_EQ(stat_name(t, NAME_K, B), 300);
    memos_slot_info in;
    memos_slot_stat(t, ino, B, now, &in);
    CHECK_EQ(in.state, SLOT_PUBLISHED);
    checked(t);
    memos_slot_table_free(t);
}

static void test_a_refused_create_leaves_no_name(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t ino, target;
    unsigned fx;
    memos_slot_create(t, NAME_K, A, A, 0, 0, now, &ino, &fx);
    write_n(t, ino, 0, 4096);
    CHECK_EQ(memos_slot_refused(t, ino, 0, UINT64_MAX, 27), SLOT_OK);      /* the next write: EFBIG */
    CHECK_EQ(memos_slot_publish_plan(t, ino, A, A, &target), SLOT_PUBLISH_REFUSED);
    CHECK_EQ(memos_slot_writer_gone(t, ino, A, now, &fx), SLOT_OK);
    CHECK(fx & SLOT_FX_FORGET_ENTRY);
    CHECK_EQ(stat_name(t, NAME_K, A), -1);
    CHECK_EQ(memos_slot_count(t), 0);                   /* no lookup: forgotten */
    checked(t);
    memos_slot_table_free(t);
}

static void test_a_refused_rewrite_leaves_the_version_before(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t ino = save(t, NAME_K, A, 100), target;
    uint64_t v = version_of(t, NAME_K);
    unsigned fx;
    memos_open_plan p = plan(t, ino, B, 1, 0, 0);
    CHECK_EQ(p.action, SLOT_OPEN_WRITE);
    CHECK(p.fx & SLOT_FX_NEED_BASE);
    memos_slot_attach_writer(t, ino, B, B, 0, now, &fx);
    write_n(t, ino, 100, 50);
    memos_slot_refused(t, ino, 0, UINT64_MAX, 27);
    CHECK_EQ(memos_slot_publish_plan(t, ino, B, B, &target), SLOT_PUBLISH_REFUSED);
    CHECK_EQ(memos_slot_publish_plan(t, ino, B, 0, &target), SLOT_PUBLISH_REFUSED);  /* fsync */
    memos_slot_writer_gone(t, ino, B, now, &fx);
    CHECK_EQ(version_of(t, NAME_K), v);
    CHECK_EQ(stat_name(t, NAME_K, C), 100);
    /* a writer that truncates to nothing starts a whole version again */
    memos_slot_attach_writer(t, ino, B, B, 0, now, &fx);
    memos_slot_refused(t, ino, 0, UINT64_MAX, 27);
    memos_slot_truncated(t, ino, 0, now);
    write_n(t, ino, 0, 7);
    CHECK_EQ(close_writer(t, ino, B, B), SLOT_PUBLISH_DO);
    CHECK_EQ(stat_name(t, NAME_K, C), 7);
    checked(t);
    memos_slot_table_free(t);
}

static void test_a_forked_child_closing_its_copy_publishes_nothing(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t ino = save(t, NAME_K, A, 10), target;
    unsigned fx;
    memos_slot_attach_writer(t, ino, A, A, 1, now, &fx);
    write_n(t, ino, 0, 20);
    CHECK_EQ(memos_slot_publish_plan(t, ino, A, B, &target), SLOT_PUBLISH_NOTHING);  /* child */
    CHECK_EQ(stat_name(t, NAME_K, C), 10);
    CHECK_EQ(stat_name(t, NAME_K, B), 10);      /* the child is no writer: it sees the version */
    CHECK_EQ(stat_name(t, NAME_K, A), 20);
    CHECK_EQ(close_writer(t, ino, A, A), SLOT_PUBLISH_DO);
    CHECK_EQ(stat_name(t, NAME_K, C), 20);
    checked(t);
    memos_slot_table_free(t);
}

static void test_a_reader_keeps_its_version_across_a_rewrite(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t ino = save(t, NAME_K, A, 100), v = version_of(t, NAME_K);
    unsigned fx;
    memos_open_plan p = plan(t, ino, B, 0, 0, 0);
    CHECK_EQ(p.action, SLOT_OPEN_READ);
    CHECK_EQ(p.version, v);
    memos_slot_attach_reader(t, ino, p.version, 0, now, &fx);
    CHECK(fx & SLOT_FX_KEEP_CACHE);
    /* a writer of the same inode: readers keep it, ESTALE to a fresh one */
    p = plan(t, ino, C, 1, 1, 0);
    CHECK_EQ(p.action, SLOT_OPEN_SEND_BACK);
    CHECK_EQ(memos_slot_send_back(t, p.target, C, 1, now, &fx), SLOT_OK);
    CHECK(fx & SLOT_FX_FORGET_ENTRY);
    uint64_t fresh;
    CHECK_EQ(memos_slot_lookup(t, NAME_K, C, &fresh), SLOT_OK);
    CHECK(fresh != ino);
    /* meanwhile a new reader of the fresh inode reads around its cache */
    memos_open_plan r = plan(t, fresh, B, 0, 0, 0);
    memos_slot_attach_reader(t, fresh, r.version, 0, now, &fx);
    CHECK(fx & SLOT_FX_DIRECT_IO);
    p = plan(t, fresh, C, 1, 1, 1);
    CHECK_EQ(p.action, SLOT_OPEN_WRITE);
    memos_slot_attach_writer(t, fresh, C, C, 1, now, &fx);
    write_n(t, fresh, 0, 5);
    CHECK_EQ(close_writer(t, fresh, C, C), SLOT_PUBLISH_DO);
    memos_slot_info in;
    memos_slot_stat(t, ino, B, now, &in);
    CHECK_EQ(in.state, SLOT_SUPERSEDED);
    CHECK_EQ(in.version, v);                    /* the reader's snapshot */
    CHECK_EQ(stat_name(t, NAME_K, B), 5);
    memos_slot_reader_gone(t, fresh, 1);
    memos_slot_reader_gone(t, ino, 0);
    checked(t);
    CHECK_EQ(memos_slot_count(t), 1);           /* the superseded inode went */
    memos_slot_table_free(t);
}

static void test_two_o_trunc_writers_each_make_a_whole_version(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t ino = save(t, NAME_K, A, 100);
    unsigned fx;
    memos_slot_attach_writer(t, ino, B, B, 1, now, &fx);
    write_n(t, ino, 0, 30);
    memos_open_plan p = plan(t, ino, C, 1, 1, 0);
    CHECK_EQ(p.action, SLOT_OPEN_SEND_BACK);
    memos_slot_send_back(t, p.target, C, 1, now, &fx);
    uint64_t fresh;
    CHECK_EQ(memos_slot_lookup(t, NAME_K, C, &fresh), SLOT_OK);
    p = plan(t, fresh, C, 1, 1, 1);
    CHECK_EQ(p.action, SLOT_OPEN_WRITE);
    memos_slot_attach_writer(t, fresh, C, C, 1, now, &fx);
    write_n(t, fresh, 0, 40);
    CHECK_EQ(stat_name(t, NAME_K, C), 40);
    memos_slot_info in;
    memos_slot_stat(t, ino, B, now, &in);       /* fstat of B's descriptor */
    CHECK_EQ(in.size, 30);
    CHECK_EQ(close_writer(t, fresh, C, C), SLOT_PUBLISH_DO);
    CHECK_EQ(close_writer(t, ino, B, B), SLOT_PUBLISH_DO);   /* the last publish wins */
    CHECK_EQ(stat_name(t, NAME_K, A), 30);
    checked(t);
    memos_slot_table_free(t);
}

static void test_a_retried_writer_beside_writers_gets_a_private_draft(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t ino = save(t, NAME_K, A, 100), priv;
    unsigned fx;
    memos_slot_attach_writer(t, ino, B, B, 1, now, &fx);
    /* a retried O_TRUNC open of an inode the name left, where B writes */
    memos_slot_rename(t, NAME_K, NAME_TMP, &fx);
    uint64_t other = save(t, NAME_K, A, 9);
    CHECK(other != ino);
    memos_slot_lookups(t, other, 1);                    /* the retried writer's lookup */
    memos_slot_rename(t, NAME_TMP, NAME_K, &fx);        /* B's slot back over it */
    memos_open_plan p = plan(t, other, C, 1, 1, 1);
    CHECK_EQ(p.action, SLOT_OPEN_WRITE);                     /* as if its open came first */
    p = plan(t, ino, C, 1, 1, 1);
    CHECK_EQ(p.action, SLOT_OPEN_PRIVATE);
    CHECK_EQ(memos_slot_private(t, ino, C, C, now, &priv, &fx), SLOT_OK);
    CHECK(fx & SLOT_FX_DIRECT_IO);
    write_n(t, priv, 0, 77);
    memos_slot_info in;
    memos_slot_stat(t, ino, C, now, &in);               /* its fstat reaches ino */
    CHECK_EQ(in.size, 77);
    checked(t);
    CHECK_EQ(close_writer(t, priv, C, C), SLOT_PUBLISH_DO);
    CHECK_EQ(stat_name(t, NAME_K, A), 77);
    CHECK_EQ(close_writer(t, ino, B, B), SLOT_PUBLISH_DO);
    CHECK_EQ(stat_name(t, NAME_K, A), 0);
    memos_slot_lookups(t, other, -1);
    checked(t);
    memos_slot_table_free(t);
}

static void test_an_open_of_the_replaced_inode_is_served_the_name_now(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t old = save(t, NAME_K, A, 300);
    uint64_t tmp = save(t, NAME_TMP, A, 600);
    unsigned fx;
    memos_slot_lookups(t, old, 1);              /* the reader's lookup, before the rename */
    CHECK_EQ(memos_slot_rename(t, NAME_TMP, NAME_K, &fx), SLOT_OK);
    memos_open_plan p = plan(t, old, B, 0, 0, 0);
    CHECK_EQ(p.action, SLOT_OPEN_READ);
    CHECK_EQ(p.target, tmp);
    CHECK_EQ(p.version, version_of(t, NAME_K));
    CHECK(p.fx & SLOT_FX_DIRECT_IO);
    /* renamed over again: still the name's current version */
    uint64_t newer = save(t, NAME_TMP, A, 5);
    memos_slot_rename(t, NAME_TMP, NAME_K, &fx);
    p = plan(t, old, B, 0, 0, 0);
    CHECK_EQ(p.action, SLOT_OPEN_READ);
    CHECK_EQ(p.target, newer);
    memos_slot_unlink(t, NAME_K, &fx);
    CHECK_EQ(plan(t, old, B, 0, 0, 0).action, SLOT_OPEN_ENOENT);
    memos_slot_lookups(t, old, -1);
    checked(t);
    CHECK_EQ(memos_slot_count(t), 0);
    memos_slot_table_free(t);
}

static void test_a_writer_sent_back_from_a_replaced_inode_never_brings_it_back(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t old = save(t, NAME_K, A, 300);
    unsigned fx;
    memos_slot_lookups(t, old, 1);
    memos_open_plan p = plan(t, old, B, 0, 0, 0);
    memos_slot_attach_reader(t, old, p.version, 0, now, &fx);        /* a page-cache reader */
    uint64_t renamed = save(t, NAME_TMP, A, 600);
    memos_slot_rename(t, NAME_TMP, NAME_K, &fx);
    p = plan(t, old, C, 1, 1, 0);
    CHECK_EQ(p.action, SLOT_OPEN_SEND_BACK);
    CHECK_EQ(p.target, renamed);
    memos_slot_send_back(t, p.target, C, 1, now, &fx);
    uint64_t ino;
    CHECK_EQ(memos_slot_lookup(t, NAME_K, C, &ino), SLOT_OK);
    CHECK_EQ(ino, renamed);                     /* no reader there: no supersede */
    CHECK_EQ(stat_name(t, NAME_K, B), 600);
    p = plan(t, ino, C, 1, 1, 1);
    CHECK_EQ(p.action, SLOT_OPEN_WRITE);
    memos_slot_attach_writer(t, ino, C, C, 1, now, &fx);
    write_n(t, ino, 0, 7);
    close_writer(t, ino, C, C);
    CHECK_EQ(stat_name(t, NAME_K, B), 7);
    memos_slot_reader_gone(t, old, 0);
    memos_slot_lookups(t, old, -1);
    checked(t);
    memos_slot_table_free(t);
}

static void test_a_writer_of_an_unlinked_name_publishes_nothing(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t ino = save(t, NAME_K, A, 10), target;
    unsigned fx;
    memos_slot_attach_writer(t, ino, A, A, 0, now, &fx);
    write_n(t, ino, 10, 10);
    memos_slot_unlink(t, NAME_K, &fx);
    CHECK(fx & SLOT_FX_REMOVE_KEY);
    CHECK_EQ(memos_slot_publish_plan(t, ino, A, A, &target), SLOT_PUBLISH_NOTHING);
    memos_slot_info in;
    memos_slot_stat(t, ino, A, now, &in);
    CHECK_EQ(in.size, 20);                      /* fstat: its draft all the same */
    memos_slot_writer_gone(t, ino, A, now, &fx);
    CHECK_EQ(stat_name(t, NAME_K, A), -1);
    checked(t);
    CHECK_EQ(memos_slot_count(t), 0);
    memos_slot_table_free(t);
}

static void test_a_publish_that_raced_an_eviction_puts_the_name_back(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t ino = save(t, NAME_K, A, 10);
    unsigned fx;
    memos_slot_attach_writer(t, ino, A, A, 1, now, &fx);
    write_n(t, ino, 0, 3);
    memos_slot_drop(t, NAME_K, &fx);
    CHECK_EQ(stat_name(t, NAME_K, B), -1);
    CHECK_EQ(close_writer(t, ino, A, A), SLOT_PUBLISH_DO);
    CHECK_EQ(stat_name(t, NAME_K, B), 3);
    checked(t);
    memos_slot_table_free(t);
}

static void test_append_lands_at_the_drafts_end(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t ino = save(t, NAME_K, A, 10), at;
    unsigned fx;
    memos_slot_attach_writer(t, ino, A, A, 0, now, &fx);
    memos_slot_attach_writer(t, ino, B, B, 0, now, &fx);
    CHECK_EQ(memos_slot_write_plan(t, ino, 10, 1, &at, &fx), SLOT_OK);
    CHECK_EQ(at, 10);
    CHECK(fx & SLOT_FX_MAKE_DRAFT);
    memos_slot_wrote(t, ino, at, 5, now);
    CHECK_EQ(memos_slot_write_plan(t, ino, 10, 1, &at, &fx), SLOT_OK);  /* B's stale end */
    CHECK_EQ(at, 15);
    CHECK(fx & SLOT_FX_DROP_PAGES);
    memos_slot_wrote(t, ino, at, 5, now);
    CHECK_EQ(stat_name(t, NAME_K, B), 20);
    close_writer(t, ino, B, B);
    close_writer(t, ino, A, A);
    CHECK_EQ(stat_name(t, NAME_K, C), 20);
    checked(t);
    memos_slot_table_free(t);
}

static void test_pages_stay_the_version_its_writers_wrote(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t ino = save(t, NAME_K, A, 10);
    memos_slot_info in;
    memos_slot_stat(t, ino, 0, now, &in);
    CHECK_EQ(in.cache_version, (int64_t)in.version);    /* written through its pages */
    unsigned fx;
    memos_slot_attach_reader(t, ino, in.version, 0, now, &fx);
    CHECK(fx & SLOT_FX_KEEP_CACHE);
    memos_slot_reader_gone(t, ino, 0);
    /* a refused write: the pages may hold it */
    memos_slot_attach_writer(t, ino, A, A, 0, now, &fx);
    write_n(t, ino, 0, 4);
    memos_slot_refused(t, ino, 0, UINT64_MAX, 27);
    memos_slot_truncated(t, ino, 0, now);
    write_n(t, ino, 0, 4);
    close_writer(t, ino, A, A);
    memos_slot_stat(t, ino, 0, now, &in);
    CHECK_EQ(in.cache_version, -2);
    memos_slot_attach_reader(t, ino, in.version, 0, now, &fx);
    CHECK(!(fx & SLOT_FX_KEEP_CACHE));
    /* a push claims the inode: a stale one drops first */
    CHECK_EQ(memos_slot_push_claim(t, ino, in.version), 0);
    memos_slot_reader_gone(t, ino, 0);
    CHECK_EQ(memos_slot_push_claim(t, ino, in.version + 1), 1);
    memos_slot_push_done(t, ino);
    memos_slot_push_done(t, ino);
    checked(t);
    memos_slot_table_free(t);
}

static void test_a_push_in_progress_makes_a_writer_wait_then_look_again(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t ino = save(t, NAME_K, A, 10);
    unsigned fx;
    CHECK_EQ(memos_slot_push_claim(t, ino, version_of(t, NAME_K)), 0);
    memos_open_plan p = plan(t, ino, B, 1, 1, 0);
    CHECK_EQ(p.action, SLOT_OPEN_WAIT);
    memos_open_req rq = { B, B, 1, 1, 0, 1, 0 };
    now += SLOT_RETRY_NS;
    memos_slot_open_plan(t, ino, &rq, now, &p);
    CHECK_EQ(p.action, SLOT_OPEN_SEND_BACK);
    memos_slot_send_back(t, p.target, B, 1, now, &fx);
    uint64_t fresh;
    memos_slot_lookup(t, NAME_K, B, &fresh);
    CHECK(fresh != ino);
    CHECK_EQ(plan(t, fresh, B, 1, 1, 1).action, SLOT_OPEN_WRITE);
    memos_slot_push_done(t, ino);
    checked(t);
    memos_slot_table_free(t);
}

static void test_many_slots_come_and_go_without_leaks(void)
{
    slot_table *t = memos_slot_table_new(10);
    unsigned fx;
    for (uint64_t i = 1; i <= 5000; i++)
        save(t, 1000 + i, A, i);
    CHECK_EQ(memos_slot_count(t), 5000);
    checked(t);
    for (uint64_t i = 1; i <= 5000; i += 2)
        memos_slot_unlink(t, 1000 + i, &fx);
    CHECK_EQ(memos_slot_count(t), 2500);
    for (uint64_t i = 2; i <= 5000; i += 2)
        CHECK_EQ(stat_name(t, 1000 + i, B), (long long)i);
    checked(t);
    memos_slot_table_free(t);
}

static void test_a_writer_of_an_unlinked_inode_writes_it_as_if_it_came_first(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t ino = save(t, NAME_K, A, 10), target;
    unsigned fx;
    memos_slot_lookups(t, ino, 1);              /* its dentry, before the unlink */
    memos_slot_unlink(t, NAME_K, &fx);
    memos_open_plan p = plan(t, ino, B, 1, 0, 0);
    CHECK_EQ(p.action, SLOT_OPEN_WRITE);
    CHECK(p.fx & SLOT_FX_TRUNC_DRAFT);          /* O_TRUNC or not: a whole version */
    memos_slot_attach_writer(t, ino, B, B, 1, now, &fx);
    write_n(t, ino, 0, 5);
    CHECK_EQ(memos_slot_publish_plan(t, ino, B, B, &target), SLOT_PUBLISH_NOTHING);
    CHECK_EQ(stat_name(t, NAME_K, B), -1);      /* its bytes went with the name */
    memos_slot_writer_gone(t, ino, B, now, &fx);
    /* with a page-cache reader there: sent back, and the lookup finds no name */
    memos_slot_lookups(t, ino, -1);
    uint64_t again = save(t, NAME_K, A, 10);
    memos_slot_lookups(t, again, 1);
    p = plan(t, again, B, 0, 0, 0);
    memos_slot_attach_reader(t, again, p.version, 0, now, &fx);
    memos_slot_unlink(t, NAME_K, &fx);
    p = plan(t, again, C, 1, 1, 0);
    CHECK_EQ(p.action, SLOT_OPEN_SEND_BACK);
    CHECK_EQ(p.target, again);
    CHECK_EQ(memos_slot_send_back(t, p.target, C, 1, now, &fx), SLOT_OK);
    CHECK_EQ(stat_name(t, NAME_K, C), -1);      /* O_CREAT would create it anew */
    memos_slot_reader_gone(t, again, 0);
    memos_slot_lookups(t, again, -1);
    checked(t);
    CHECK_EQ(memos_slot_count(t), 0);
    memos_slot_table_free(t);
}

static void test_a_retry_that_finds_writers_on_a_stale_inode_waits_then_goes_private(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t ino = save(t, NAME_K, A, 10), fresh, priv;
    unsigned fx;
    memos_slot_lookups(t, ino, 1);
    memos_slot_attach_writer(t, ino, B, B, 0, now, &fx);    /* B rewrites in place */
    memos_open_plan p = plan(t, ino, C, 1, 1, 0);           /* C replaces it whole */
    CHECK_EQ(p.action, SLOT_OPEN_SEND_BACK);
    memos_slot_send_back(t, p.target, C, 1, now, &fx);
    CHECK_EQ(memos_slot_lookup(t, NAME_K, C, &fresh), SLOT_OK);
    CHECK(fresh != ino);
    memos_slot_attach_writer(t, fresh, C, C, 1, now, &fx);
    /* D's O_TRUNC open through the old dentry, where B still writes: it
     * waits for B (bounded), then looks again, or, as the kernel's retry,
     * gets a draft of its own on the inode it holds */
    CHECK_EQ(plan(t, ino, 400, 1, 1, 0).action, SLOT_OPEN_WAIT);
    memos_open_req rq = { 400, 400, 1, 1, 0, 1, 0 };
    memos_slot_open_plan(t, ino, &rq, now, &p);
    CHECK_EQ(p.action, SLOT_OPEN_SEND_BACK);
    CHECK_EQ(p.target, fresh);
    rq.retry = 1;
    memos_slot_open_plan(t, ino, &rq, now, &p);
    CHECK_EQ(p.action, SLOT_OPEN_PRIVATE);
    CHECK_EQ(memos_slot_private(t, ino, 400, 400, now, &priv, &fx), SLOT_OK);
    write_n(t, priv, 0, 8);
    memos_slot_info in;
    memos_slot_stat(t, ino, 400, now, &in);                 /* its fstat */
    CHECK_EQ(in.size, 8);
    memos_slot_stat(t, ino, B, now, &in);
    CHECK_EQ(in.size, 10);                                  /* B's own draft */
    checked(t);
    CHECK_EQ(close_writer(t, priv, 400, 400), SLOT_PUBLISH_DO);
    CHECK_EQ(stat_name(t, NAME_K, A), 8);
    close_writer(t, fresh, C, C);
    close_writer(t, ino, B, B);                             /* unchanged: nothing */
    CHECK_EQ(stat_name(t, NAME_K, A), 0);                   /* C's empty version, last */
    memos_slot_lookups(t, ino, -1);
    checked(t);
    CHECK_EQ(memos_slot_count(t), 1);
    memos_slot_table_free(t);
}

static void test_an_o_trunc_writer_on_a_superseded_inode_publishes_under_the_name(void)
{
    slot_table *t = memos_slot_table_new(10);
    uint64_t ino = save(t, NAME_K, A, 10), target, holder;
    unsigned fx;
    memos_slot_lookups(t, ino, 1);
    memos_open_plan p = plan(t, ino, B, 0, 0, 0);
    memos_slot_attach_reader(t, ino, p.version, 0, now, &fx);
    save(t, NAME_K, A, 20);                    /* readers keep ino: a fresh inode */
    memos_slot_reader_gone(t, ino, 0);
    /* an O_TRUNC open through the old dentry, nobody on the old inode */
    p = plan(t, ino, C, 1, 1, 0);
    CHECK_EQ(p.action, SLOT_OPEN_WRITE);
    CHECK_EQ(p.inode, ino);
    memos_slot_attach_writer(t, ino, C, C, 1, now, &fx);
    write_n(t, ino, 0, 3);
    /* (its stat of the path shows the name's inode, where it is no writer) */
    CHECK_EQ(stat_name(t, NAME_K, C), 20);
    CHECK_EQ(memos_slot_publish_plan(t, ino, C, C, &target), SLOT_PUBLISH_DO);
    CHECK(target != ino);
    memos_slot_published(t, ino, next_version++, 3, 3, now, &holder, &fx);
    CHECK_EQ(holder, target);
    CHECK_EQ(stat_name(t, NAME_K, A), 3);
    memos_slot_writer_gone(t, ino, C, now, &fx);
    memos_slot_lookups(t, ino, -1);
    checked(t);
    CHECK_EQ(memos_slot_count(t), 1);
    memos_slot_table_free(t);
}

/* A run of every kind of call, each allowed to fail (results ignored), over
 * names and processes that make the table grow, supersede, rename over,
 * send back, go private and forget. */
static void busy_life(slot_table *t)
{
    uint64_t ino, at, priv, target, holder;
    unsigned fx;
    memos_open_plan p;
    for (uint32_t round = 0; round < 3; round++) {
        for (uint64_t name = 1; name <= 40; name++) {
            uint32_t w = 100 + (uint32_t)(name % 7);
            if (memos_slot_create(t, name, w, w, 1, 0, now, &ino, &fx) != SLOT_OK)
                continue;
            memos_slot_write_plan(t, ino, 0, 1, &at, &fx);
            memos_slot_wrote(t, ino, at, name, now);
            if (memos_slot_publish_plan(t, ino, w, w, &target) == SLOT_PUBLISH_DO)
                memos_slot_published(t, ino, next_version++, name, name, now, &holder, &fx);
            memos_slot_lookups(t, ino, 1);
            memos_open_req rd = { 7, 7, 0, 0, 0, 0, 0 };
            if (memos_slot_open_plan(t, ino, &rd, now, &p) == SLOT_OK && p.action == SLOT_OPEN_READ)
                memos_slot_attach_reader(t, p.inode, p.version, 0, now, &fx);
            for (uint32_t other = 200; other < 206; other++) {
                memos_open_req wr = { other, other, 1, 1, other & 1, 0, 0 };
                if (memos_slot_open_plan(t, ino, &wr, now, &p) != SLOT_OK)
                    break;
                if (p.action == SLOT_OPEN_SEND_BACK)
                    memos_slot_send_back(t, p.target, other, 1, now, &fx);
                else if (p.action == SLOT_OPEN_WRITE)
                    memos_slot_attach_writer(t, p.inode, other, other, 1, now, &fx);
                else if (p.action == SLOT_OPEN_PRIVATE)
                    memos_slot_private(t, p.inode, other, other, now, &priv, &fx);
            }
            if (name % 3 == 0)
                memos_slot_rename(t, name, name - 1, &fx);
            if (name % 5 == 0)
                memos_slot_drop(t, name, &fx);
        }
        /* everybody leaves */
        for (uint64_t i = 10; i < 10 + 2000; i++) {
            memos_slot_info in;
            if (memos_slot_stat(t, i, 0, now, &in) != SLOT_OK)
                continue;
            if (in.readers)
                memos_slot_reader_gone(t, i, 0);
            for (uint32_t who = 100; who < 206; who++)
                while (memos_slot_writer_gone(t, i, who, now, &fx) == SLOT_OK)
                    ;
            memos_slot_stat(t, i, 0, now, &in);
            if (in.state == SLOT_SUPERSEDED || in.state == SLOT_GONE)
                memos_slot_lookups(t, i, -1);
        }
        for (uint64_t name = 1; name <= 40; name += 2)
            memos_slot_unlink(t, name, &fx);
        now += SLOT_RETRY_NS;
    }
}

static void test_every_allocation_failure_leaves_a_consistent_table(void)
{
    int fired = 0;
    for (uint64_t n = 1;; n++) {
        slot_table *t = memos_slot_table_new(10);
        memos_slot_fail_after(t, n);
        busy_life(t);
        uint64_t left = memos_slot_fail_after(t, 0);
        checked(t);
        memos_slot_table_free(t);
        if (t_cur_failed) {
            fprintf(stderr, "after an injected failure at allocation %llu\n",
                    (unsigned long long)n);
            return;
        }
        if (left)
            break;                      /* the run made fewer than n allocations */
        fired++;
    }
    CHECK(fired > 100);
    printf("slot fail injection: %d countdowns, the table consistent after each\n", fired);
}

int main(void)
{
    now = 1000000000LL;
    RUN(test_a_create_is_found_by_its_writer_only_until_published);
    RUN(test_a_refused_create_leaves_no_name);
    RUN(test_a_refused_rewrite_leaves_the_version_before);
    RUN(test_a_forked_child_closing_its_copy_publishes_nothing);
    RUN(test_a_reader_keeps_its_version_across_a_rewrite);
    RUN(test_two_o_trunc_writers_each_make_a_whole_version);
    RUN(test_a_retried_writer_beside_writers_gets_a_private_draft);
    RUN(test_an_open_of_the_replaced_inode_is_served_the_name_now);
    RUN(test_a_writer_sent_back_from_a_replaced_inode_never_brings_it_back);
    RUN(test_a_writer_of_an_unlinked_name_publishes_nothing);
    RUN(test_a_publish_that_raced_an_eviction_puts_the_name_back);
    RUN(test_append_lands_at_the_drafts_end);
    RUN(test_pages_stay_the_version_its_writers_wrote);
    RUN(test_a_push_in_progress_makes_a_writer_wait_then_look_again);
    RUN(test_many_slots_come_and_go_without_leaks);
    RUN(test_a_writer_of_an_unlinked_inode_writes_it_as_if_it_came_first);
    RUN(test_a_retry_that_finds_writers_on_a_stale_inode_waits_then_goes_private);
    RUN(test_an_o_trunc_writer_on_a_superseded_inode_publishes_under_the_name);
    RUN(test_every_allocation_failure_leaves_a_consistent_table);
    return DONE("test_slot");
}
