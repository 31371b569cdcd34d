/*
 * index.h — key → entry map: a bucketized cuckoo hash (see index.c).
 *
 * The index stores pointers to index_node, which the owner embeds in its
 * entry; the node carries the key bytes and their hash.  Not thread-safe:
 * the cache lock guards every call.
 */
#ifndef MEMOS_INDEX_H
#define MEMOS_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "memos.h"

#define INDEX_SLOTS 4   /* slots per bucket */

typedef struct index_node {
    uint64_t             hash;   /* index_hash(key, klen) (owner's lock) */
    const unsigned char *key;    /* key bytes, owned by the embedding entry */
    uint32_t             klen;   /* bytes of key */
} index_node;

typedef struct index_bucket {
    uint16_t    tag[INDEX_SLOTS];   /* 16-bit tag of slot i, 0 = empty */
    index_node *slot[INDEX_SLOTS];  /* node of slot i, NULL = empty */
} __attribute__((aligned(64))) index_bucket;

typedef struct index_table {
    index_bucket *b;          /* nbuckets buckets, 64-byte aligned (cache lock) */
    uint64_t      mask;       /* nbuckets - 1; nbuckets is a power of two */
    uint64_t      count;      /* nodes stored */
    uint64_t      grows;      /* times the table doubled */
    uint64_t      max_load_seen; /* count*1e6/slots just before the last growth */
    int         (*fail_hook)(void *ctx); /* returns 1 to fail a growth (testing) */
    void         *fail_ctx;   /* argument of fail_hook */
} index_table;

uint64_t    index_hash(const void *key, size_t len);

int         index_init(index_table *t, uint64_t nbuckets);   /* MEMOS_OK, MEMOS_ENOMEM */
void        index_destroy(index_table *t);
index_node *index_find(const index_table *t, const void *key, size_t klen, uint64_t hash);
int         index_insert(index_table *t, index_node *n);     /* MEMOS_OK, MEMOS_ENOMEM */
int         index_remove(index_table *t, index_node *n);     /* MEMOS_OK, MEMOS_ENOENT */
int         index_replace(index_table *t, index_node *old, index_node *nw); /* same key */
void        index_foreach(const index_table *t, void (*fn)(void *ctx, index_node *n), void *ctx);

uint64_t    index_buckets(const index_table *t);
uint64_t    index_entries(const index_table *t);
double      index_load(const index_table *t);

int         index_check(const index_table *t, char *why, size_t whylen); /* MEMOS_OK, MEMOS_EINVAL */
/* The tag compare of a bucket pair: bit s = slot s of b1 holds tag, bit 4 + s
 * = slot s of b2.  index_tag_match uses SIMD where built with it; the
 * portable one is the SWAR fallback (both exported for the tests). */
unsigned    index_tag_match(const index_bucket *b1, const index_bucket *b2, uint16_t tag);
unsigned    index_tag_match_portable(const index_bucket *b1, const index_bucket *b2, uint16_t tag);

#endif /* MEMOS_INDEX_H */
