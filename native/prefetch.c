/*
 * prefetch.c — the prefetcher (placeholder).
 *
 * A later issue fills this in: a stride detector over the sequence of slots
 * read (layer i, then i+1, ... of a KV-cache) and a small heat table of
 * recently missed slots, which together decide which slots to pull from the
 * SSD tier into the memory tier ahead of the reader.  For now it only has a
 * lifetime.
 */
#include <string.h>

#include "prefetch.h"

/* ---- API ---- */

int pf_init(pf_state *p)
{
    memset(p, 0, sizeof *p);
    return MEMOS_OK;
}

void pf_free(pf_state *p)
{
    memset(p, 0, sizeof *p);
}
