/*
 * index.c — the key → entry map: a bucketized cuckoo hash table.
 *
 * Bucket layout (one 64-byte cache line):
 *
 *     +--------+--------+--------+--------+--------+--------+--------+--------+
 *     | tag0 tag1 tag2 tag3 (4 x 16 bit)  | slot0  | slot1  | slot2  | slot3  | pad
 *     +-----------------------------------+--------+--------+--------+--------+
 *        8 bytes                             4 x 8-byte index_node pointers
 *
 * A lookup reads the tags and the slot pointers of a bucket in one miss, and
 * dereferences a node (to compare the full key) only when its tag matches,
 * which for a miss happens with probability ~8/65535.  Both candidate
 * buckets are known from the hash, so the second is prefetched while the
 * first is read, and the 8 tags of the pair are compared at once with SSE2
 * (one 16-bit lane compare over a 128-bit register; AVX2 would add nothing
 * for 8 x 16 bits), or with a portable SWAR compare elsewhere.
 *
 * Hashing.  h = index_hash(key) (a wyhash-style multiply-fold hash, 64 bit).
 * tag = h >> 48 (0 is reserved for empty slots and remapped to 1).  Every key
 * has two candidate buckets:
 *
 *     i1 = h & mask
 *     i2 = alt(i1, tag) = (i1 ^ (tag * 0x5bd1e995)) & mask
 *
 * alt() is an involution (alt(alt(i, t), t) == i), so a node in either bucket
 * can be moved to the other one from its tag alone, without the key.
 *
 * Insert puts the node in a free slot of i1 or i2.  When both are full it
 * searches breadth first (at most INDEX_BFS_NODES buckets, INDEX_BFS_DEPTH
 * moves) for a chain of displacements ending at a free slot, then applies
 * the chain from its free end backwards, so every node stays findable at
 * every step.  Only when no chain exists does the table double and rehash
 * (hashes are stored in the nodes; no key is rehashed).  With four slots per
 * bucket the table fills to ~95 % before it grows.
 *
 * Invariants (index_check): every node sits in one of its two candidate
 * buckets under its own tag; an empty slot has tag 0; count equals the
 * occupied slots; no node is shadowed by an equal key.  (That the stored
 * hash is the hash of the key is the owner's check: tests plant hashes.)
 *
 * Growth is bounded: when more than 8 keys share both buckets (equal hashes)
 * no table size helps, so growth stops at 16x the buckets the load needs and
 * the insert fails with MEMOS_ENOMEM.
 *
 * Locking: none here; the cache lock guards every call.
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "index.h"

/* ---- types and constants ---- */

#define INDEX_BFS_DEPTH  5      /* displacements in one insert, at most */
#define INDEX_BFS_NODES  1024   /* buckets visited by one search, at most */
#define INDEX_MIN_BUCKETS 4

typedef struct bfs_node {
    uint64_t bucket;   /* bucket visited */
    int32_t  parent;   /* queue index of the bucket we came from, -1 = root */
    int8_t   slot;     /* slot of the parent whose node moves here */
    uint8_t  depth;    /* displacements from a root */
} bfs_node;

/* ---- private prototypes ---- */

static inline uint16_t tag_of(uint64_t hash);
static inline uint64_t alt_bucket(const index_table *t, uint64_t i, uint16_t tag);
static inline unsigned tag_match2(const index_bucket *b1, const index_bucket *b2, uint16_t tag);
static int  try_place(index_table *t, uint64_t i, index_node *n, uint16_t tag);
static int  cuckoo_insert(index_table *t, index_node *n);
static int  bfs_path(index_table *t, uint64_t i1, uint64_t i2);
static int  grow(index_table *t);
static int  alloc_buckets(index_bucket **out, uint64_t n);

/* ---- API ---- */

static inline uint64_t mum(uint64_t a, uint64_t b)
{
    __uint128_t r = (__uint128_t)a * b;
    return (uint64_t)r ^ (uint64_t)(r >> 64);
}

static inline uint64_t rd64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static inline uint64_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* wyhash-style: 16 bytes per round folded through 64x64→128 multiplies,
 * three lanes for long keys, a final double fold. */
uint64_t index_hash(const void *key, size_t len)
{
    static const uint64_t P0 = 0xa0761d6478bd642fULL, P1 = 0xe7037ed1a0b428dbULL,
                          P2 = 0x8ebc6af09c88c6e3ULL, P3 = 0x589965cc75374cc3ULL;
    const uint8_t *p = key;
    uint64_t seed = 0x2d358dccaa6c78a5ULL ^ mum(0x9e3779b97f4a7c15ULL ^ P0, P1);
    uint64_t a, b;
    if (len <= 16) {
        if (len >= 4) {
            size_t q = (len >> 3) << 2;
            a = (rd32(p) << 32) | rd32(p + q);
            b = (rd32(p + len - 4) << 32) | rd32(p + len - 4 - q);
        } else if (len > 0) {
            a = ((uint64_t)p[0] << 16) | ((uint64_t)p[len >> 1] << 8) | p[len - 1];
            b = 0;
        } else {
            a = b = 0;
        }
    } else {
        size_t i = len;
        if (i > 48) {
            uint64_t s1 = seed, s2 = seed;
            do {
                seed = mum(rd64(p) ^ P1, rd64(p + 8) ^ seed);
                s1 = mum(rd64(p + 16) ^ P2, rd64(p + 24) ^ s1);
                s2 = mum(rd64(p + 32) ^ P3, rd64(p + 40) ^ s2);
                p += 48;
                i -= 48;
            } while (i > 48);
            seed ^= s1 ^ s2;
        }
        while (i > 16) {
            seed = mum(rd64(p) ^ P1, rd64(p + 8) ^ seed);
            i -= 16;
            p += 16;
        }
        a = rd64(p + i - 16);
        b = rd64(p + i - 8);
    }
    a ^= P1;
    b ^= seed;
    __uint128_t r = (__uint128_t)a * b;
    a = (uint64_t)r;
    b = (uint64_t)(r >> 64);
    return mum(a ^ P0 ^ len, b ^ P1);
}

int index_init(index_table *t, uint64_t nbuckets)
{
    uint64_t n = INDEX_MIN_BUCKETS;
    while (n < nbuckets)
        n <<= 1;
    memset(t, 0, sizeof *t);
    if (alloc_buckets(&t->b, n) != MEMOS_OK)
        return MEMOS_ENOMEM;
    t->mask = n - 1;
    return MEMOS_OK;
}

void index_destroy(index_table *t)
{
    free(t->b);
    t->b = NULL;
    t->count = 0;
}

/* Both candidate buckets are known from the hash alone, so the second one is
 * prefetched before the first is read (two misses overlap instead of
 * queueing), and the 8 tags of the pair are compared in one instruction. */
index_node *index_find(const index_table *t, const void *key, size_t klen, uint64_t hash)
{
    uint16_t tag = tag_of(hash);
    uint64_t i1 = hash & t->mask, i2 = alt_bucket(t, i1, tag);
    const index_bucket *b1 = &t->b[i1], *b2 = &t->b[i2];
    __builtin_prefetch(b2);
    unsigned m = tag_match2(b1, b2, tag);
    if (i2 == i1)
        m &= 0x0fu;
    while (m) {
        unsigned bit = (unsigned)__builtin_ctz(m);
        m &= m - 1;
        const index_bucket *b = bit < INDEX_SLOTS ? b1 : b2;
        index_node *n = b->slot[bit % INDEX_SLOTS];
        if (n->hash == hash && n->klen == klen && memcmp(n->key, key, klen) == 0)
            return n;
    }
    return NULL;
}

/* The caller guarantees the key is not present (checked in debug builds). */
int index_insert(index_table *t, index_node *n)
{
    assert(!index_find(t, n->key, n->klen, n->hash));
    while (cuckoo_insert(t, n) != MEMOS_OK) {
        if (grow(t) != MEMOS_OK)
            return MEMOS_ENOMEM;
    }
    return MEMOS_OK;
}

int index_remove(index_table *t, index_node *n)
{
    uint16_t tag = tag_of(n->hash);
    uint64_t i = n->hash & t->mask;
    for (int pass = 0; pass < 2; pass++) {
        index_bucket *b = &t->b[i];
        for (unsigned s = 0; s < INDEX_SLOTS; s++)
            if (b->slot[s] == n) {
                b->slot[s] = NULL;
                b->tag[s] = 0;
                t->count--;
                return MEMOS_OK;
            }
        i = alt_bucket(t, i, tag);
    }
    return MEMOS_ENOENT;
}

/* Put nw in old's slot: same key, hence same hash, tag and buckets. */
int index_replace(index_table *t, index_node *old, index_node *nw)
{
    assert(old->hash == nw->hash && old->klen == nw->klen);
    uint16_t tag = tag_of(old->hash);
    uint64_t i = old->hash & t->mask;
    for (int pass = 0; pass < 2; pass++) {
        index_bucket *b = &t->b[i];
        for (unsigned s = 0; s < INDEX_SLOTS; s++)
            if (b->slot[s] == old) {
                b->slot[s] = nw;
                return MEMOS_OK;
            }
        i = alt_bucket(t, i, tag);
    }
    return MEMOS_ENOENT;
}

void index_foreach(const index_table *t, void (*fn)(void *ctx, index_node *n), void *ctx)
{
    for (uint64_t i = 0; i <= t->mask; i++)
        for (unsigned s = 0; s < INDEX_SLOTS; s++)
            if (t->b[i].slot[s])
                fn(ctx, t->b[i].slot[s]);
}

unsigned index_tag_match(const index_bucket *b1, const index_bucket *b2, uint16_t tag)
{
    return tag_match2(b1, b2, tag);
}

uint64_t index_buckets(const index_table *t) { return t->mask + 1; }
uint64_t index_entries(const index_table *t) { return t->count; }

double index_load(const index_table *t)
{
    return (double)t->count / (double)((t->mask + 1) * INDEX_SLOTS);
}

/* ---- private helpers ---- */

static inline uint16_t tag_of(uint64_t hash)
{
    uint16_t tag = (uint16_t)(hash >> 48);
    return tag ? tag : 1;
}

static inline uint64_t alt_bucket(const index_table *t, uint64_t i, uint16_t tag)
{
    return (i ^ ((uint64_t)tag * 0x5bd1e995u)) & t->mask;
}

/* Bit s (0..3) set when slot s of b1 holds `tag`, bit 4 + s for b2.
 *
 * SSE2 (every x86-64; VEX-encoded when built with -mavx2): the two 64-bit
 * tag words go into one 128-bit register, one 16-bit compare checks all 8
 * tags, a saturating pack squeezes the lanes to bytes, and movemask yields
 * the 8-bit answer.  Elsewhere: SWAR on each 64-bit tag word, exact per
 * lane (no borrow crosses lanes).  tag_match_portable is also what the
 * unit tests compare the SIMD path against. */
static inline unsigned tag_word_match(uint64_t w, uint16_t tag)
{
    const uint64_t lo7 = 0x7fff7fff7fff7fffull;
    uint64_t x = w ^ (0x0001000100010001ull * tag);      /* 0 lanes = match */
    uint64_t z = ~(((x & lo7) + lo7) | x | lo7);         /* lane MSB set iff lane == 0 */
    return (unsigned)(((z >> 15) & 1) | ((z >> 30) & 2) | ((z >> 45) & 4) | ((z >> 60) & 8));
}

unsigned index_tag_match_portable(const index_bucket *b1, const index_bucket *b2, uint16_t tag)
{
    uint64_t w1, w2;
    memcpy(&w1, b1->tag, 8);
    memcpy(&w2, b2->tag, 8);
    return tag_word_match(w1, tag) | tag_word_match(w2, tag) << 4;
}

static inline unsigned tag_match2(const index_bucket *b1, const index_bucket *b2, uint16_t tag)
{
#ifdef __SSE2__
    __m128i lo = _mm_loadl_epi64((const __m128i *)(const void *)b1->tag);
    __m128i hi = _mm_loadl_epi64((const __m128i *)(const void *)b2->tag);
    __m128i eq = _mm_cmpeq_epi16(_mm_unpacklo_epi64(lo, hi), _mm_set1_epi16((short)tag));
    return (unsigned)_mm_movemask_epi8(_mm_packs_epi16(eq, _mm_setzero_si128()));
#else
    return index_tag_match_portable(b1, b2, tag);
#endif
}

static int try_place(index_table *t, uint64_t i, index_node *n, uint16_t tag)
{
    index_bucket *b = &t->b[i];
    for (unsigned s = 0; s < INDEX_SLOTS; s++)
        if (!b->slot[s]) {
            b->slot[s] = n;
            b->tag[s] = tag;
            t->count++;
            return 1;
        }
    return 0;
}

/* One attempt at the current size; MEMOS_ENOMEM when no path exists. */
static int cuckoo_insert(index_table *t, index_node *n)
{
    uint16_t tag = tag_of(n->hash);
    uint64_t i1 = n->hash & t->mask, i2 = alt_bucket(t, i1, tag);
    if (try_place(t, i1, n, tag) || try_place(t, i2, n, tag))
        return MEMOS_OK;
    if (bfs_path(t, i1, i2) != MEMOS_OK)
        return MEMOS_ENOMEM;
    /* bfs_path freed a slot in i1 or i2. */
    if (try_place(t, i1, n, tag) || try_place(t, i2, n, tag))
        return MEMOS_OK;
    assert(!"bfs_path freed no slot");
    return MEMOS_ENOMEM;
}

/* Breadth-first search from i1 and i2 for a bucket with a free slot, then
 * move nodes along the path from its end, freeing a slot in a root bucket. */
static int bfs_path(index_table *t, uint64_t i1, uint64_t i2)
{
    bfs_node q[INDEX_BFS_NODES];
    int head = 0, tail = 0;
    q[tail++] = (bfs_node){ i1, -1, -1, 0 };
    if (i2 != i1)
        q[tail++] = (bfs_node){ i2, -1, -1, 0 };
    while (head < tail) {
        int cur = head++;
        index_bucket *b = &t->b[q[cur].bucket];
        int free_slot = -1;
        for (unsigned s = 0; s < INDEX_SLOTS; s++)
            if (!b->slot[s]) {
                free_slot = (int)s;
                break;
            }
        if (free_slot >= 0) {
            /* Apply the chain backwards: each move fills the free slot from
             * the parent bucket and frees the parent's slot. */
            while (q[cur].parent >= 0) {
                int par = q[cur].parent, ps = q[cur].slot;
                index_bucket *from = &t->b[q[par].bucket], *to = &t->b[q[cur].bucket];
                assert(from->slot[ps] && !to->slot[free_slot]);
                assert(alt_bucket(t, q[par].bucket, from->tag[ps]) == q[cur].bucket);
                to->slot[free_slot] = from->slot[ps];
                to->tag[free_slot] = from->tag[ps];
                from->slot[ps] = NULL;
                from->tag[ps] = 0;
                free_slot = ps;
                cur = par;
            }
            return MEMOS_OK;
        }
        if (q[cur].depth >= INDEX_BFS_DEPTH)
            continue;
        for (unsigned s = 0; s < INDEX_SLOTS && tail < INDEX_BFS_NODES; s++) {
            uint64_t alt = alt_bucket(t, q[cur].bucket, b->tag[s]);
            if (alt == q[cur].bucket)
                continue;
            q[tail++] = (bfs_node){ alt, cur, (int8_t)s, (uint8_t)(q[cur].depth + 1) };
        }
    }
    return MEMOS_ENOMEM;
}

static int alloc_buckets(index_bucket **out, uint64_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, n * sizeof(index_bucket)) != 0)
        return MEMOS_ENOMEM;
    memset(p, 0, n * sizeof(index_bucket));
    *out = p;
    return MEMOS_OK;
}

/* Double the table and reinsert every node from its stored hash.  A node
 * that finds no path in the new table doubles it again. */
static int grow(index_table *t)
{
    if (t->fail_hook && t->fail_hook(t->fail_ctx))
        return MEMOS_ENOMEM;
    uint64_t slots = (t->mask + 1) * INDEX_SLOTS;
    t->max_load_seen = t->count * 1000000u / slots;
    uint64_t n = (t->mask + 1) * 2;
    for (;;) {
        /* Keys whose hashes collide wholesale cannot be helped by growing:
         * stop at 16x the buckets the load needs. */
        if (n > 16 * (t->count / INDEX_SLOTS + 64))
            return MEMOS_ENOMEM;
        index_table nt = *t;
        if (alloc_buckets(&nt.b, n) != MEMOS_OK)
            return MEMOS_ENOMEM;
        nt.mask = n - 1;
        nt.count = 0;
        int ok = 1;
        for (uint64_t i = 0; i <= t->mask && ok; i++)
            for (unsigned s = 0; s < INDEX_SLOTS && ok; s++)
                if (t->b[i].slot[s])
                    ok = cuckoo_insert(&nt, t->b[i].slot[s]) == MEMOS_OK;
        if (ok) {
            free(t->b);
            t->b = nt.b;
            t->mask = nt.mask;
            t->grows++;
            assert(nt.count == t->count);
            return MEMOS_OK;
        }
        free(nt.b);
        n *= 2;
    }
}

/* ---- debugging ---- */

int index_check(const index_table *t, char *why, size_t whylen)
{
    uint64_t count = 0;
    for (uint64_t i = 0; i <= t->mask; i++) {
        const index_bucket *b = &t->b[i];
        for (unsigned s = 0; s < INDEX_SLOTS; s++) {
            const index_node *n = b->slot[s];
            if (!n) {
                if (b->tag[s]) {
                    snprintf(why, whylen, "index: empty slot %llu/%u has a tag",
                             (unsigned long long)i, s);
                    return MEMOS_EINVAL;
                }
                continue;
            }
            count++;
            uint16_t tag = tag_of(n->hash);
            uint64_t i1 = n->hash & t->mask;
            if (b->tag[s] != tag || (i != i1 && i != alt_bucket(t, i1, tag))) {
                snprintf(why, whylen, "index: node in bucket %llu is misplaced",
                         (unsigned long long)i);
                return MEMOS_EINVAL;
            }
            if (index_find(t, n->key, n->klen, n->hash) != n) {
                snprintf(why, whylen, "index: node in bucket %llu is shadowed or duplicated",
                         (unsigned long long)i);
                return MEMOS_EINVAL;
            }
        }
    }
    if (count != t->count) {
        snprintf(why, whylen, "index: %llu nodes, counter says %llu",
                 (unsigned long long)count, (unsigned long long)t->count);
        return MEMOS_EINVAL;
    }
    return MEMOS_OK;
}
