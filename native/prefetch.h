/*
 * prefetch.h — the prefetcher's stride detector and heat table
 * (placeholder; see prefetch.c).
 */
#ifndef MEMOS_PREFETCH_H
#define MEMOS_PREFETCH_H

#include <stdint.h>

#include "memos.h"

typedef struct pf_state {
    uint64_t last_key_hash;   /* hash of the last slot read (caller's lock) */
    int64_t  stride;          /* detected stride in slots, 0 = none (caller's lock) */
    uint64_t hits;            /* prefetched slots later read (caller's lock) */
} pf_state;

int  pf_init(pf_state *p);   /* MEMOS_OK */
void pf_free(pf_state *p);

#endif /* MEMOS_PREFETCH_H */
