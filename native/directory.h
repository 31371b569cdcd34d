/*
 * directory.h — the coherence directory (placeholder; see directory.c).
 */
#ifndef MEMOS_DIRECTORY_H
#define MEMOS_DIRECTORY_H

#include <stdint.h>

#include "memos.h"

typedef struct dir_table {
    uint64_t entries;   /* slots tracked (cache lock) */
    uint64_t epoch;     /* bumped on every ownership change (cache lock) */
} dir_table;

int  dir_init(dir_table *d);   /* MEMOS_OK */
void dir_free(dir_table *d);

#endif /* MEMOS_DIRECTORY_H */
