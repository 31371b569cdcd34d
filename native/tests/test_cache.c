/*
 * test_cache.c — unit tests of cache.c through the memos.h API: put/get,
 * pins, remove, rename, replace while pinned, drafts, eviction through the
 * callback (victim bytes intact, refusal), EFBIG/ENOMEM, capacity changes,
 * an allocation-failure injection loop, two threads.  Every test ends with
 * memos_check.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "memos.h"
#include "tcheck.h"

#define MiB (1024u * 1024u)
#define KiB 1024u

static char why[256];

static void check_ok(memos_cache *c)
{
    int rc = memos_check(c, why, sizeof why);
    if (rc != MEMOS_OK)
        fprintf(stderr, "memos_check: %s\n", why);
    CHECK_EQ(rc, MEMOS_OK);
}

/* Byte i of a slot keyed k: a function of the key and i. */
static unsigned seed_of(const void *k, size_t n)
{
    unsigned s = 17;
    for (size_t i = 0; i < n; i++)
        s = s * 31 + ((const unsigned char *)k)[i];
    return s;
}

static void pattern(unsigned char *buf, size_t n, unsigned seed, uint64_t from)
{
    for (size_t i = 0; i < n; i++)
        buf[i] = (unsigned char)((seed + (from + i) * 7 + ((from + i) >> 12)) & 0xff);
}

static int pattern_ok(const memos_entry *e, unsigned seed)
{
    size_t n = (size_t)memos_entry_size(e);
    unsigned char *got = malloc(n + 1), *want = malloc(n + 1);
    size_t r = memos_entry_read(e, 0, got, n);
    pattern(want, n, seed, 0);
    int ok = r == n && memcmp(got, want, n) == 0;
    free(got);
    free(want);
    return ok;
}

/* Publish n bytes of pattern(seed(key)) under key; *out gets the pinned
 * entry (or it is unpinned when out is NULL). */
static int put(memos_cache *c, const char *key, size_t n, memos_entry **out)
{
    memos_entry *d;
    int rc = memos_draft_new(c, NULL, &d);
    if (rc != MEMOS_OK)
        return rc;
    unsigned char *buf = malloc(n + 1);
    pattern(buf, n, seed_of(key, strlen(key)), 0);
    rc = memos_draft_write(c, d, 0, buf, n);
    free(buf);
    if (rc == MEMOS_OK)
        rc = memos_publish(c, d, key, strlen(key), 0, 1);
    if (rc != MEMOS_OK) {
        memos_draft_free(c, d);
        return rc;
    }
    if (out)
        *out = d;
    else
        memos_unpin(c, d);
    return MEMOS_OK;
}

static int get(memos_cache *c, const char *key, memos_entry **out)
{
    return memos_get(c, key, strlen(key), out);
}

static memos_stats stats(memos_cache *c)
{
    memos_stats s;
    memos_get_stats(c, &s);
    return s;
}

/* ---- eviction callback ---- */

typedef struct evctx {
    int calls;        /* callback invocations */
    int bad;          /* victims whose bytes were not intact */
    int refuse;       /* 0 none, 1 all, 2 keys ending in an even digit */
    char first[32];   /* key of the first victim */
} evctx;

static int on_evict(void *ctx, memos_entry *v)
{
    evctx *x = ctx;
    size_t klen;
    const char *k = memos_entry_key(v, &klen);
    if (x->calls++ == 0)
        snprintf(x->first, sizeof x->first, "%.*s", (int)klen, k);
    if (!memos_entry_live(v) || !pattern_ok(v, seed_of(k, klen)))
        x->bad++;
    if (x->refuse == 1)
        return MEMOS_EBUSY;
    if (x->refuse == 2 && (k[klen - 1] - '0') % 2 == 0)
        return MEMOS_EBUSY;
    return MEMOS_OK;
}

/* ---- tests ---- */

static void test_put_get(void)
{
    memos_cache *c = memos_cache_new(4 * MiB, 16, NULL, NULL);
    CHECK(c != NULL);
    memos_entry *e;
    CHECK_EQ(put(c, "a", 10000, NULL), MEMOS_OK);
    CHECK_EQ(get(c, "a", &e), MEMOS_OK);
    CHECK(pattern_ok(e, seed_of("a", 1)));
    CHECK_EQ(memos_entry_size(e), 10000);
    CHECK_EQ(memos_entry_stored(e), 3 * 4096);
    CHECK_EQ(memos_entry_version(e), 1);
    CHECK_EQ(memos_entry_hits(e), 1);
    CHECK(memos_entry_dirty(e) && memos_entry_live(e) && !memos_entry_sticky(e));
    size_t kl;
    CHECK(memcmp(memos_entry_key(e, &kl), "a", 1) == 0 && kl == 1);
    unsigned char buf[16];
    CHECK_EQ(memos_entry_read(e, 9995, buf, 16), 5);
    CHECK_EQ(memos_entry_read(e, 10000, buf, 16), 0);
    memos_stats s = stats(c);
    CHECK_EQ(s.pinned, 1);
    memos_unpin(c, e);
    CHECK_EQ(get(c, "b", &e), MEMOS_ENOENT);
    CHECK_EQ(memos_peek(c, "a", 1, &e), MEMOS_OK);
    memos_unpin(c, e);
    s = stats(c);
    CHECK_EQ(s.lookups, 2);
    CHECK_EQ(s.hits, 1);
    CHECK_EQ(s.misses, 1);
    CHECK_EQ(s.inserts, 1);
    CHECK_EQ(s.slots, 1);
    CHECK_EQ(s.bytes_used, 10000);
    CHECK_EQ(s.pages_used, 3);
    CHECK_EQ(s.capacity, 4 * MiB);
    CHECK_EQ(s.superblocks, 2);
    CHECK_EQ(s.pinned, 0);
    CHECK_EQ(s.index_entries, 1);
    CHECK(s.index_load_factor > 0);
    check_ok(c);
    memos_cache_free(c);
}

static void test_pin_remove(void)
{
    memos_cache *c = memos_cache_new(4 * MiB, 16, NULL, NULL);
    memos_entry *e;
    put(c, "k", 200 * KiB, NULL);
    CHECK_EQ(get(c, "k", &e), MEMOS_OK);
    CHECK_EQ(memos_remove(c, "k", 1), MEMOS_OK);
    CHECK_EQ(memos_remove(c, "k", 1), MEMOS_ENOENT);
    memos_entry *e2;
    CHECK_EQ(get(c, "k", &e2), MEMOS_ENOENT);
    CHECK_EQ(stats(c).dead_pinned, 1);
    CHECK_EQ(memos_entry_live(e), 0);
    CHECK(pattern_ok(e, seed_of("k", 1)));
    check_ok(c);
    memos_ref(c, e);
    memos_unpin(c, e);
    CHECK_EQ(stats(c).dead_pinned, 1);
    memos_unpin(c, e);
    memos_stats s = stats(c);
    CHECK_EQ(s.dead_pinned, 0);
    CHECK_EQ(s.pages_used, 0);
    CHECK_EQ(s.removes, 1);
    check_ok(c);
    memos_cache_free(c);
}

static void test_replace_while_pinned(void)
{
    memos_cache *c = memos_cache_new(4 * MiB, 16, NULL, NULL);
    memos_entry *old, *nw, *d;
    put(c, "k", 50000, NULL);
    CHECK_EQ(get(c, "k", &old), MEMOS_OK);
    /* A new version with different bytes. */
    memos_draft_new(c, NULL, &d);
    unsigned char buf[7000];
    memset(buf, 0xab, sizeof buf);
    memos_draft_write(c, d, 0, buf, sizeof buf);
    CHECK_EQ(memos_publish(c, d, "k", 1, 0, 0), MEMOS_OK);
    CHECK_EQ(memos_entry_version(d), 2);
    CHECK_EQ(memos_entry_dirty(d), 0);
    memos_unpin(c, d);
    CHECK_EQ(memos_entry_live(old), 0);
    CHECK(pattern_ok(old, seed_of("k", 1)));   /* old bytes intact */
    CHECK_EQ(get(c, "k", &nw), MEMOS_OK);
    CHECK_EQ(memos_entry_size(nw), 7000);
    CHECK_EQ(memos_entry_read(nw, 6999, buf, 1), 1);
    CHECK_EQ(buf[0], 0xab);
    memos_stats s = stats(c);
    CHECK_EQ(s.replaces, 1);
    CHECK_EQ(s.dead_pinned, 1);
    CHECK_EQ(s.pages_used, 13 + 2);
    check_ok(c);
    memos_unpin(c, old);
    CHECK_EQ(stats(c).pages_used, 2);
    memos_unpin(c, nw);
    /* An explicit version is used as is. */
    memos_draft_new(c, NULL, &d);
    CHECK_EQ(memos_publish(c, d, "k", 1, 10, 1), MEMOS_OK);
    CHECK_EQ(memos_entry_version(d), 10);
    CHECK_EQ(memos_entry_size(d), 0);
    memos_unpin(c, d);
    CHECK_EQ(memos_publish(c, d, "x", 1, 0, 1), MEMOS_EINVAL);   /* not a draft */
    /* A pin (sticky) belongs to the key: the next version keeps it. */
    CHECK_EQ(get(c, "k", &nw), MEMOS_OK);
    memos_set_sticky(c, nw, 1);
    memos_unpin(c, nw);
    memos_draft_new(c, NULL, &d);
    CHECK_EQ(memos_publish(c, d, "k", 1, 0, 1), MEMOS_OK);
    CHECK_EQ(memos_entry_sticky(d), 1);
    memos_unpin(c, d);
    check_ok(c);
    memos_cache_free(c);
}

static void test_rename(void)
{
    memos_cache *c = memos_cache_new(4 * MiB, 16, NULL, NULL);
    memos_entry *e;
    put(c, "a", 3000, NULL);
    put(c, "b", 5000, NULL);
    CHECK_EQ(memos_rename(c, "a", 1, "c", 1), MEMOS_OK);
    CHECK_EQ(get(c, "a", &e), MEMOS_ENOENT);
    CHECK_EQ(get(c, "c", &e), MEMOS_OK);
    CHECK(pattern_ok(e, seed_of("a", 1)));
    size_t kl;
    CHECK(memcmp(memos_entry_key(e, &kl), "c", 1) == 0);
    memos_unpin(c, e);
    CHECK_EQ(memos_rename(c, "c", 1, "b", 1), MEMOS_OK);   /* replaces b */
    CHECK_EQ(get(c, "b", &e), MEMOS_OK);
    CHECK_EQ(memos_entry_size(e), 3000);
    memos_unpin(c, e);
    CHECK_EQ(stats(c).slots, 1);
    CHECK_EQ(memos_rename(c, "zz", 2, "y", 1), MEMOS_ENOENT);
    CHECK_EQ(memos_rename(c, "b", 1, "", 0), MEMOS_EINVAL);
    CHECK_EQ(memos_rename(c, "b", 1, "b", 1), MEMOS_OK);
    char big[MEMOS_KEY_MAX + 1];
    memset(big, 'x', sizeof big);
    CHECK_EQ(memos_rename(c, "b", 1, big, sizeof big), MEMOS_EINVAL);
    CHECK_EQ(memos_rename(c, "b", 1, big, MEMOS_KEY_MAX), MEMOS_OK);
    CHECK_EQ(memos_get(c, big, MEMOS_KEY_MAX, &e), MEMOS_OK);
    memos_unpin(c, e);
    CHECK_EQ(stats(c).pages_used, 1);
    check_ok(c);
    memos_cache_free(c);
}

static void test_draft_ops(void)
{
    memos_cache *c = memos_cache_new(4 * MiB, 16, NULL, NULL);
    memos_entry *d, *d2, *d3;
    unsigned char buf[300 * KiB], want[300 * KiB];
    memos_draft_new(c, NULL, &d);
    /* Hole before a write reads as zeros. */
    CHECK_EQ(memos_draft_write(c, d, 5000, "xyz", 3), MEMOS_OK);
    CHECK_EQ(memos_entry_size(d), 5003);
    CHECK_EQ(memos_entry_read(d, 0, buf, sizeof buf), 5003);
    memset(want, 0, 5000);
    memcpy(want + 5000, "xyz", 3);
    CHECK(memcmp(buf, want, 5003) == 0);
    /* Stale bytes past a truncation come back as zeros. */
    memset(buf, 0xff, 4096);
    memos_draft_write(c, d, 0, buf, 4096);
    CHECK_EQ(memos_draft_truncate(c, d, 10), MEMOS_OK);
    CHECK_EQ(memos_entry_stored(d), 4096);
    CHECK_EQ(memos_draft_truncate(c, d, 9000), MEMOS_OK);
    CHECK_EQ(memos_entry_read(d, 0, buf, sizeof buf), 9000);
    memset(want, 0xff, 10);
    memset(want + 10, 0, 8990);
    CHECK(memcmp(buf, want, 9000) == 0);
    check_ok(c);
    /* A second draft takes the pages after d's tail: d's tail must move. */
    memos_draft_new(c, NULL, &d2);
    memos_draft_write(c, d2, 0, "q", 1);
    pattern(want, sizeof want, 99, 0);
    memcpy(want, buf, 9000);
    CHECK_EQ(memos_draft_write(c, d, 9000, want + 9000, 40000 - 9000), MEMOS_OK);
    CHECK_EQ(memos_entry_read(d, 0, buf, sizeof buf), 40000);
    CHECK(memcmp(buf, want, 40000) == 0);
    check_ok(c);
    /* Across block boundaries: tail grows into whole blocks. */
    CHECK_EQ(memos_draft_write(c, d, 40000, want + 40000, sizeof want - 40000), MEMOS_OK);
    CHECK_EQ(memos_entry_read(d, 0, buf, sizeof buf), sizeof buf);
    CHECK(memcmp(buf, want, sizeof buf) == 0);
    CHECK_EQ(memos_entry_stored(d), 75 * 4096);
    struct iovec iov[8];
    CHECK_EQ(memos_entry_iov(d, 0, sizeof buf, iov, 8), 3);
    CHECK_EQ(iov[0].iov_len, MEMOS_BLOCK_SIZE);
    CHECK_EQ(memos_entry_iov(d, MEMOS_BLOCK_SIZE - 1, 2, iov, 8), 2);
    CHECK_EQ(memos_entry_iov(d, 0, sizeof buf, iov, 2), 2);
    /* draft_new from a base copies it. */
    CHECK_EQ(memos_draft_new(c, d, &d3), MEMOS_OK);
    CHECK_EQ(memos_entry_size(d3), sizeof buf);
    memset(buf, 0, sizeof buf);
    memos_entry_read(d3, 0, buf, sizeof buf);
    CHECK(memcmp(buf, want, sizeof buf) == 0);
    CHECK_EQ(memos_draft_truncate(c, d3, 0), MEMOS_OK);
    CHECK_EQ(memos_entry_stored(d3), 0);
    memos_stats s = stats(c);
    CHECK_EQ(s.drafts, 3);
    CHECK_EQ(s.bytes_draft, sizeof buf + 1);
    check_ok(c);
    memos_draft_free(c, d);
    memos_draft_free(c, d2);
    memos_draft_free(c, d3);
    s = stats(c);
    CHECK_EQ(s.drafts, 0);
    CHECK_EQ(s.pages_used, 0);
    check_ok(c);
    memos_cache_free(c);
}

/* memos_entry_changes: the pages a lineage wrote since its last clean version. */
static void test_changes(void)
{
    memos_cache *c = memos_cache_new(8 * MiB, 16, NULL, NULL);
    memos_entry *d, *r, *r2;
    memos_changes ch;
    uint64_t runs[8];
    static unsigned char buf[MiB];
    pattern(buf, sizeof buf, 5, 0);
    memos_draft_new(c, NULL, &d);
    memos_draft_write(c, d, 0, buf, sizeof buf);
    CHECK_EQ(memos_entry_changes(c, d, &ch, runs, 4), -1);      /* a draft */
    CHECK_EQ(memos_publish(c, d, "k", 1, 0, 1), MEMOS_OK);
    r = d;
    CHECK_EQ(memos_entry_changes(c, r, &ch, runs, 4), -1);      /* no clean base */
    memos_set_dirty(c, r, 0);
    memos_draft_new(c, r, &d);
    memos_draft_write(c, d, 4095, "ab", 2);                    /* pages 0 and 1 */
    memos_draft_write(c, d, 20 * 4096, "c", 1);                /* page 20 */
    memos_draft_truncate(c, d, 30 * 4096 + 7);
    /* the draft's own, before its publish (and only for a draft) */
    CHECK_EQ(memos_entry_changes(c, d, &ch, runs, 4), -1);
    CHECK_EQ(memos_draft_changes(c, d, &ch, runs, 4), 0);
    CHECK_EQ(ch.base_version, 1);
    CHECK_EQ(ch.cut, 30 * 4096 + 7);
    CHECK_EQ(ch.runs, 2);
    CHECK_EQ(runs[2], 20 * 4096);
    CHECK_EQ(memos_publish(c, d, "k", 1, 0, 1), MEMOS_OK);
    r2 = d;
    CHECK_EQ(memos_draft_changes(c, r2, &ch, runs, 4), -1);     /* published */
    CHECK_EQ(memos_entry_changes(c, r2, &ch, runs, 1), 0);
    CHECK_EQ(ch.base_version, 1);
    CHECK_EQ(ch.base_size, MiB);
    CHECK_EQ(ch.cut, 30 * 4096 + 7);
    CHECK_EQ(ch.runs, 2);                                       /* more than max_runs */
    CHECK_EQ(ch.bytes, 3 * 4096);
    CHECK_EQ(runs[0], 0);
    CHECK_EQ(runs[1], 2 * 4096);
    CHECK_EQ(memos_entry_changes(c, r2, &ch, runs, 4), 0);
    CHECK_EQ(runs[2], 20 * 4096);
    CHECK_EQ(runs[3], 4096);
    /* a base that is still a draft: unknown */
    memos_draft_new(c, NULL, &d);
    memos_draft_write(c, d, 0, "x", 1);
    memos_entry *d2;
    memos_draft_new(c, d, &d2);
    memos_draft_write(c, d2, 0, "y", 1);
    CHECK_EQ(memos_publish(c, d2, "j", 1, 0, 1), MEMOS_OK);
    CHECK_EQ(memos_entry_changes(c, d2, &ch, runs, 4), -1);
    memos_draft_free(c, d);
    check_ok(c);
    memos_cache_free(c);
}

static void test_eviction_callback(void)
{
    evctx x = { 0 };
    memos_cache *c = memos_cache_new(2 * MiB, 4, on_evict, &x);
    char key[16];
    for (int i = 0; i < 30; i++) {
        snprintf(key, sizeof key, "e%02d", i);
        CHECK_EQ(put(c, key, 100 * KiB, NULL), MEMOS_OK);
    }
    memos_stats s = stats(c);
    CHECK(s.evictions > 0);
    CHECK_EQ(x.calls, (int)s.evictions);
    CHECK_EQ(x.bad, 0);
    CHECK(strcmp(x.first, "e00") == 0);         /* LRU first */
    CHECK(s.eviction_runs > 0 && s.alloc_failures > 0);
    CHECK_EQ(s.slots + s.evictions, 30);
    memos_entry *e;
    CHECK_EQ(get(c, "e29", &e), MEMOS_OK);
    CHECK(pattern_ok(e, seed_of("e29", 3)));
    memos_unpin(c, e);
    CHECK_EQ(get(c, "e00", &e), MEMOS_ENOENT);
    /* memos_evict_run evicts up to evict_batch. */
    uint64_t before = stats(c).slots;
    CHECK_EQ(memos_evict_run(c), 4);
    CHECK_EQ(stats(c).slots, before - 4);
    check_ok(c);
    memos_cache_free(c);
}

static void test_refusing_callback(void)
{
    evctx x = { 0 };
    memos_cache *c = memos_cache_new(2 * MiB, 16, on_evict, &x);
    char key[16];
    for (int i = 0; i < 16; i++) {       /* 16 whole blocks fill 2 MiB */
        snprintf(key, sizeof key, "r%02d", i);
        CHECK_EQ(put(c, key, 128 * KiB, NULL), MEMOS_OK);
    }
    x.refuse = 1;
    CHECK_EQ(put(c, "new", 100 * KiB, NULL), MEMOS_ENOMEM);
    memos_stats s = stats(c);
    CHECK_EQ(s.slots, 16);
    CHECK_EQ(s.evict_refused, 16);
    CHECK_EQ(s.evictions, 0);
    CHECK_EQ(memos_evict_run(c), 0);
    check_ok(c);
    x.refuse = 2;                         /* keep even keys */
    x.calls = 0;
    CHECK_EQ(put(c, "new1", 100 * KiB, NULL), MEMOS_OK);
    memos_entry *e;
    CHECK_EQ(get(c, "r00", &e), MEMOS_OK);
    memos_unpin(c, e);
    CHECK_EQ(get(c, "r01", &e), MEMOS_ENOENT);
    CHECK_EQ(x.bad, 0);
    check_ok(c);
    memos_cache_free(c);
}

static void test_toobig_nomem_sticky(void)
{
    memos_cache *c = memos_cache_new(2 * MiB, 16, NULL, NULL);
    memos_entry *d, *e[8];
    unsigned char *big = calloc(1, 2 * MiB + 1);
    memos_draft_new(c, NULL, &d);
    CHECK_EQ(memos_draft_write(c, d, 0, big, 2 * MiB + 1), MEMOS_ETOOBIG);
    CHECK_EQ(memos_draft_truncate(c, d, 3 * MiB), MEMOS_ETOOBIG);
    CHECK_EQ(memos_draft_write(c, d, 0, big, 2 * MiB), MEMOS_OK);
    CHECK_EQ(memos_draft_write(c, d, UINT64_MAX, big, 2), MEMOS_ETOOBIG);
    memos_draft_free(c, d);
    free(big);
    /* Everything pinned: ENOMEM. */
    char key[16];
    for (int i = 0; i < 8; i++) {
        snprintf(key, sizeof key, "p%d", i);
        CHECK_EQ(put(c, key, 256 * KiB, &e[i]), MEMOS_OK);
    }
    CHECK_EQ(put(c, "x", 4096, NULL), MEMOS_ENOMEM);
    CHECK_EQ(stats(c).pinned, 8);
    /* Sticky pins hold the same way without a reference. */
    for (int i = 0; i < 8; i++) {
        memos_set_sticky(c, e[i], 1);
        memos_unpin(c, e[i]);
    }
    CHECK_EQ(put(c, "x", 4096, NULL), MEMOS_ENOMEM);
    CHECK_EQ(stats(c).pinned, 8);
    CHECK_EQ(memos_peek(c, "p3", 2, &e[3]), MEMOS_OK);
    memos_set_sticky(c, e[3], 0);
    memos_set_dirty(c, e[3], 0);
    CHECK_EQ(memos_entry_dirty(e[3]), 0);
    memos_unpin(c, e[3]);
    CHECK_EQ(put(c, "x", 4096, NULL), MEMOS_OK);
    CHECK_EQ(memos_peek(c, "p3", 2, &e[3]), MEMOS_ENOENT);
    check_ok(c);
    memos_cache_free(c);
    /* Drafts count against capacity and are never victims. */
    c = memos_cache_new(2 * MiB, 16, NULL, NULL);
    memos_entry *d2;
    big = calloc(1, 1536 * KiB);
    memos_draft_new(c, NULL, &d);
    CHECK_EQ(memos_draft_write(c, d, 0, big, 1536 * KiB), MEMOS_OK);
    memos_draft_new(c, NULL, &d2);
    CHECK_EQ(memos_draft_write(c, d2, 0, big, 1024 * KiB), MEMOS_ENOMEM);
    CHECK_EQ(memos_entry_size(d2), 0);
    CHECK_EQ(stats(c).pages_used, 384);
    check_ok(c);
    memos_draft_free(c, d2);
    memos_draft_free(c, d);
    free(big);
    check_ok(c);
    memos_cache_free(c);
}

/* memos_set_draft_evicts(0): a draft's write is refused where it would
 * evict; memos_draft_reserve makes the room of a whole size, or evicts
 * nothing when even every victim would not make it. */
static void test_draft_reserve(void)
{
    evctx x = { 0 };
    memos_cache *c = memos_cache_new(2 * MiB, 16, on_evict, &x);
    memos_set_draft_evicts(c, 0);
    char key[16];
    for (int i = 0; i < 6; i++) {           /* 1.5 MiB of 2 */
        snprintf(key, sizeof key, "k%d", i);
        CHECK_EQ(put(c, key, 256 * KiB, NULL), MEMOS_OK);
    }
    memos_entry *d, *pinned;
    unsigned char *buf = calloc(1, 2 * MiB);
    CHECK_EQ(memos_draft_new(c, NULL, &d), MEMOS_OK);
    CHECK_EQ(memos_draft_write(c, d, 0, buf, 1 * MiB), MEMOS_ENOMEM);  /* would evict */
    CHECK_EQ(x.calls, 0);
    CHECK_EQ(memos_entry_size(d), 0);
    CHECK_EQ(memos_draft_write(c, d, 0, buf, 256 * KiB), MEMOS_OK);    /* free room */
    CHECK_EQ(memos_draft_reserve(c, d, 3 * MiB), MEMOS_ETOOBIG);
    CHECK_EQ(memos_draft_reserve(c, d, 100), MEMOS_EINVAL);             /* below its size */
    /* a reader pins 4 of the 6: the draft can grow to 1 MiB at most (its own
     * 256 KiB, 256 KiB free, 2 victims of 256 KiB) */
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "k%d", i);
        CHECK_EQ(get(c, key, &pinned), MEMOS_OK);
    }
    CHECK_EQ(memos_draft_reserve(c, d, 1 * MiB + 4096), MEMOS_ENOMEM);
    CHECK_EQ(x.calls, 0);                   /* nothing evicted for it */
    CHECK_EQ(stats(c).slots, 6);
    CHECK_EQ(memos_draft_reserve(c, d, 1 * MiB), MEMOS_OK);
    CHECK_EQ(x.calls, 2);
    CHECK_EQ(x.bad, 0);
    CHECK_EQ(memos_entry_size(d), 1 * MiB);
    check_ok(c);
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "k%d", i);
        CHECK_EQ(memos_peek(c, key, strlen(key), &pinned), MEMOS_OK);
        memos_unpin(c, pinned);             /* the peek's */
        memos_unpin(c, pinned);             /* the get's */
    }
    CHECK_EQ(memos_publish(c, d, "new", 3, 0, 1), MEMOS_OK);
    memos_unpin(c, d);
    memos_set_draft_evicts(c, 1);           /* evicting again: a write makes room */
    CHECK_EQ(put(c, "more", 1 * MiB, NULL), MEMOS_OK);
    free(buf);
    check_ok(c);
    memos_cache_free(c);
}

static void test_capacity_and_knobs(void)
{
    evctx x = { 0 };
    memos_cache *c = memos_cache_new(1, 16, on_evict, &x);
    CHECK_EQ(stats(c).capacity, 2 * MiB);
    CHECK_EQ(memos_set_capacity(c, 6 * MiB), MEMOS_OK);
    CHECK_EQ(stats(c).superblocks, 3);
    char key[16];
    for (int i = 0; i < 40; i++) {          /* 40 x 128 KiB = 5 MiB */
        snprintf(key, sizeof key, "c%02d", i);
        CHECK_EQ(put(c, key, 128 * KiB, NULL), MEMOS_OK);
    }
    CHECK_EQ(stats(c).evictions, 0);
    CHECK_EQ(memos_set_capacity(c, 2 * MiB), MEMOS_OK);
    memos_stats s = stats(c);
    CHECK(s.pages_used <= 512);
    CHECK_EQ(s.capacity, 2 * MiB);
    CHECK(s.evictions >= 24);
    CHECK_EQ(x.bad, 0);
    check_ok(c);
    /* Pinned data that does not fit: ENOMEM, capacity unchanged. */
    CHECK_EQ(memos_set_capacity(c, 4 * MiB), MEMOS_OK);
    memos_entry *e[24];
    for (int i = 0; i < 24; i++) {
        snprintf(key, sizeof key, "q%02d", i);
        CHECK_EQ(put(c, key, 128 * KiB, &e[i]), MEMOS_OK);
    }
    CHECK_EQ(memos_set_capacity(c, 2 * MiB), MEMOS_ENOMEM);
    CHECK_EQ(stats(c).capacity, 4 * MiB);
    for (int i = 0; i < 24; i++)
        memos_unpin(c, e[i]);
    CHECK_EQ(memos_set_capacity(c, 0), MEMOS_EINVAL);
    CHECK_EQ(memos_set_evict_batch(c, 0), MEMOS_EINVAL);
    CHECK_EQ(memos_set_evict_batch(c, 4097), MEMOS_EINVAL);
    CHECK_EQ(memos_set_evict_batch(c, 2), MEMOS_OK);
    CHECK_EQ(stats(c).evict_batch, 2);
    check_ok(c);
    memos_cache_free(c);
    CHECK(memos_cache_new(MiB, 0, NULL, NULL) == NULL);
}

static int nkeys;
static char order[8][8];
static void collect(void *ctx, memos_entry *e)
{
    size_t kl;
    const char *k = memos_entry_key(e, &kl);
    if (nkeys < 8)
        snprintf(order[nkeys++], 8, "%.*s", (int)kl, k);
}

static void test_foreach_order(void)
{
    memos_cache *c = memos_cache_new(2 * MiB, 16, NULL, NULL);
    memos_entry *e;
    put(c, "a", 1, NULL);
    put(c, "b", 1, NULL);
    put(c, "c", 1, NULL);
    get(c, "a", &e);
    memos_unpin(c, e);
    nkeys = 0;
    memos_foreach(c, collect, NULL);
    CHECK_EQ(nkeys, 3);
    CHECK(!strcmp(order[0], "a") && !strcmp(order[1], "c") && !strcmp(order[2], "b"));
    /* peek does not touch. */
    memos_peek(c, "b", 1, &e);
    memos_unpin(c, e);
    nkeys = 0;
    memos_foreach(c, collect, NULL);
    CHECK(!strcmp(order[0], "a"));
    check_ok(c);
    memos_cache_free(c);
}

/* A sequence of operations that allocates pages and metadata; returns the
 * number of failed operations. */
static int scenario(memos_cache *c)
{
    int errors = 0;
    char key[16];
    for (int i = 0; i < 14; i++) {
        snprintf(key, sizeof key, "s%d", i);
        errors += put(c, key, (size_t)((i * 37 * KiB + 1000) % (400 * KiB)) + 1, NULL) != MEMOS_OK;
    }
    memos_entry *e, *d;
    if (get(c, "s12", &e) == MEMOS_OK) {
        int rc = memos_draft_new(c, e, &d);
        if (rc == MEMOS_OK) {
            rc = memos_draft_write(c, d, memos_entry_size(e), "tail", 4);
            if (rc == MEMOS_OK)
                rc = memos_draft_truncate(c, d, 3 * MEMOS_BLOCK_SIZE + 5);
            if (rc == MEMOS_OK)
                rc = memos_publish(c, d, "s12", 3, 0, 1);
            if (rc != MEMOS_OK)
                memos_draft_free(c, d);
            else
                memos_unpin(c, d);
        }
        errors += rc != MEMOS_OK;
        memos_unpin(c, e);
    }
    int rc = memos_rename(c, "s13", 3, "renamed-s13", 11);
    errors += rc != MEMOS_OK && rc != MEMOS_ENOENT;
    rc = memos_rename(c, "s11", 3, "s12", 3);
    errors += rc != MEMOS_OK && rc != MEMOS_ENOENT;
    memos_remove(c, "s10", 3);
    memos_evict_run(c);
    for (int i = 0; i < 40; i++) {      /* small slots: index growth */
        snprintf(key, sizeof key, "t%d", i);
        errors += put(c, key, (size_t)(i * 1000), NULL) != MEMOS_OK;
    }
    return errors;
}

static int ok_cb(void *ctx, memos_entry *v) { (void)ctx; (void)v; return MEMOS_OK; }

static void drop_one(void *ctx, memos_entry *e)
{
    char (*keys)[2100] = ctx;
    size_t kl;
    const char *k = memos_entry_key(e, &kl);
    for (int i = 0; i < 64; i++)
        if (!keys[i][0]) {
            snprintf(keys[i], 2100, "%.*s", (int)kl, k);
            break;
        }
}

static void test_fail_injection_loop(void)
{
    int n, fired = 0;
    for (n = 1; n < 3000; n++) {
        memos_cache *c = memos_cache_new(2 * MiB, 8, ok_cb, NULL);
        memos_fail_after(c, n);
        int errors = scenario(c);
        memos_fail_after(c, 0);
        int rc = memos_check(c, why, sizeof why);
        if (rc != MEMOS_OK) {
            fprintf(stderr, "fail_after(%d): %s\n", n, why);
            CHECK_EQ(rc, MEMOS_OK);
        }
        /* Everything can be removed again and no page stays behind. */
        static char keys[64][2100];
        memset(keys, 0, sizeof keys);
        memos_foreach(c, drop_one, keys);
        for (int i = 0; i < 64 && keys[i][0]; i++)
            CHECK_EQ(memos_remove(c, keys[i], strlen(keys[i])), MEMOS_OK);
        memos_stats s = stats(c);
        CHECK_EQ(s.pages_used, 0);
        CHECK_EQ(s.slots, 0);
        CHECK_EQ(s.drafts, 0);
        check_ok(c);
        memos_cache_free(c);
        if (errors == 0)
            break;
        fired++;
    }
    printf("fail injection: %d countdowns, each failed one operation cleanly\n", fired);
    CHECK(fired > 50);
    CHECK(n < 3000);
}

/* ---- threads ---- */

typedef struct tctx {
    memos_cache *c;   /* shared cache */
    int id;           /* thread number */
    int bad;          /* slots read with wrong bytes */
} tctx;

static void *worker(void *arg)
{
    tctx *t = arg;
    char key[16];
    unsigned r = (unsigned)t->id * 7919u + 1;
    for (int i = 0; i < 4000; i++) {
        r = r * 1103515245u + 12345u;
        snprintf(key, sizeof key, "w%u", (r >> 8) % 48);
        memos_entry *e;
        switch ((r >> 20) % 4) {
        case 0:
        case 1:
            put(t->c, key, (r >> 4) % (90 * KiB) + 1, NULL);
            break;
        case 2:
            if (get(t->c, key, &e) == MEMOS_OK) {
                t->bad += !pattern_ok(e, seed_of(key, strlen(key)));
                memos_unpin(t->c, e);
            }
            break;
        default:
            memos_remove(t->c, key, strlen(key));
        }
    }
    return NULL;
}

static void test_threads(void)
{
    memos_cache *c = memos_cache_new(2 * MiB, 4, ok_cb, NULL);
    pthread_t th[3];
    tctx t[3];
    for (int i = 0; i < 3; i++) {
        t[i] = (tctx){ c, i, 0 };
        pthread_create(&th[i], NULL, worker, &t[i]);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(t[i].bad, 0);
    }
    CHECK(stats(c).evictions > 0);
    check_ok(c);
    memos_cache_free(c);
}

int main(void)
{
    RUN(test_put_get);
    RUN(test_pin_remove);
    RUN(test_replace_while_pinned);
    RUN(test_rename);
    RUN(test_changes);
    RUN(test_draft_ops);
    RUN(test_eviction_callback);
    RUN(test_refusing_callback);
    RUN(test_toobig_nomem_sticky);
    RUN(test_draft_reserve);
    RUN(test_capacity_and_knobs);
    RUN(test_foreach_order);
    RUN(test_fail_injection_loop);
    RUN(test_threads);
    return DONE("test_cache");
}
