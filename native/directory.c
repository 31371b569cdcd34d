/*
 * directory.c — the coherence directory (placeholder).
 *
 * A later issue fills this in: for every slot, which tier holds the newest
 * version (memory, SSD, both) and who may write it, as a small state machine
 *
 *     INVALID ──load──► SHARED ──write──► MODIFIED ──flush──► SHARED
 *        ▲                 │                  │
 *        └─────evict───────┴──────evict(dirty: writeback first)
 *
 * so that the memory tier, the SSD tier and concurrent readers agree on which
 * version a path names.  For now it only has a lifetime.
 *
 * Locking: the cache lock, like the index and the policy.
 */
#include <string.h>

#include "directory.h"

/* ---- API ---- */

int dir_init(dir_table *d)
{
    memset(d, 0, sizeof *d);
    return MEMOS_OK;
}

void dir_free(dir_table *d)
{
    memset(d, 0, sizeof *d);
}
