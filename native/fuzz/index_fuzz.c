/*
 * index_fuzz.c — libFuzzer target of the cuckoo index (index.c), checked
 * against a reference (a flag per key).
 *
 *   make -C native fuzz [FUZZ_SECONDS=20]      (clang, ASan + UBSan)
 *
 * Input: byte 0 picks the hash mode (real hashes, or planted hashes that
 * pile keys onto few buckets and tags, which forces long displacement
 * searches, growth and bounded-growth failures); then 2 bytes per operation:
 * the op (insert, remove, find, replace, fail the next growth) and a key id.
 * After every operation the index must answer like the reference; every 32
 * operations and at the end index_check must pass.
 */
#include <assert.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"

#define NKEYS 256

typedef struct item {
    index_node node;    /* first: the index points here */
    char key[16];       /* key bytes */
} item;

static int fail_next;

static int fail_hook(void *ctx)
{
    (void)ctx;
    int f = fail_next;
    fail_next = 0;
    return f;
}

static uint64_t planted(unsigned id, unsigned mode)
{
    switch (mode) {
    case 1:  return (uint64_t)(id % 7) | ((uint64_t)(id % 3 + 1) << 48);   /* few buckets, few tags */
    case 2:  return (uint64_t)id * 0x9e3779b97f4a7c15ull & 0xffff00000000000full; /* tiny low bits */
    default: return 0;
    }
}

static void die(const char *what, unsigned id)
{
    fprintf(stderr, "index_fuzz: %s (key %u)\n", what, id);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    unsigned mode = data[0] % 3;
    static item it[NKEYS], alt[NKEYS];
    uint8_t in[NKEYS] = { 0 };        /* reference: 1 = it[i] present, 2 = alt[i] */
    for (unsigned i = 0; i < NKEYS; i++) {
        int len = snprintf(it[i].key, sizeof it[i].key, "key-%u", i);
        uint64_t h = mode ? planted(i, mode) : index_hash(it[i].key, (size_t)len);
        it[i].node = (index_node){ h, (const unsigned char *)it[i].key, (uint32_t)len };
        alt[i] = it[i];
        alt[i].node.key = (const unsigned char *)alt[i].key;
    }
    index_table t;
    if (index_init(&t, 1) != MEMOS_OK)
        return 0;
    t.fail_hook = fail_hook;
    fail_next = 0;
    char why[200];
    size_t nops = 0;
    for (size_t p = 1; p + 1 < size; p += 2, nops++) {
        unsigned op = data[p] % 5, id = data[p + 1];
        item *cur = in[id] == 2 ? &alt[id] : &it[id];
        index_node *f = index_find(&t, it[id].key, it[id].node.klen, it[id].node.hash);
        if ((f != NULL) != (in[id] != 0) || (f && f != &cur->node))
            die("find disagrees with the reference", id);
        switch (op) {
        case 0:   /* insert */
            if (!in[id]) {
                uint64_t before = index_entries(&t);
                if (index_insert(&t, &it[id].node) == MEMOS_OK)
                    in[id] = 1;
                else if (index_entries(&t) != before)
                    die("failed insert changed the count", id);
            }
            break;
        case 1:   /* remove */
            if (index_remove(&t, &cur->node) != (in[id] ? MEMOS_OK : MEMOS_ENOENT))
                die("remove disagrees with the reference", id);
            in[id] = 0;
            break;
        case 2:   /* find of an absent key with the same hash */
            if (index_find(&t, "absent", 6, it[id].node.hash))
                die("found an absent key", id);
            break;
        case 3:   /* replace by the other node of the same key */
            if (in[id]) {
                item *nw = in[id] == 2 ? &it[id] : &alt[id];
                if (index_replace(&t, &cur->node, &nw->node) != MEMOS_OK)
                    die("replace failed", id);
                in[id] = in[id] == 2 ? 1 : 2;
            }
            break;
        default:  /* make the next growth fail */
            fail_next = 1;
            break;
        }
        if (nops % 32 == 0 && index_check(&t, why, sizeof why) != MEMOS_OK)
            die(why, id);
    }
    uint64_t n = 0;
    for (unsigned i = 0; i < NKEYS; i++)
        n += in[i] != 0;
    if (n != index_entries(&t))
        die("count disagrees with the reference", 0);
    if (index_check(&t, why, sizeof why) != MEMOS_OK)
        die(why, 0);
    index_destroy(&t);
    return 0;
}
