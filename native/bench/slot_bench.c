/*
 * slot_bench.c — the slot state machine's cost per request cycle: what the
 * shim will pay in slot.c for a file written and closed, and for one
 * opened, stat'ed and closed, over a table of `names` published slots.
 *
 *   build/bench/slot_bench [--ops N] [--names N]
 *
 * Write cycle: lookup (or create), open plan and attach of an O_TRUNC
 * writer, a write's plan and record, the close's publish plan and publish,
 * the writer's release.  Read cycle: lookup, open plan and attach of a
 * reader, stat, release.  Prints one JSON object (ns per cycle).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "slot.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int write_cycle(slot_table *t, uint64_t name, uint32_t p, uint64_t *version)
{
    uint64_t ino, at, target, holder;
    unsigned fx;
    if (memos_slot_lookup(t, name, p, &ino) == SLOT_OK) {
        memos_open_req rq = { p, p, 1, 1, 0, 0, 0 };
        memos_open_plan pl;
        memos_slot_open_plan(t, ino, &rq, 0, &pl);
        if (pl.action != SLOT_OPEN_WRITE)
            return -1;
        memos_slot_attach_writer(t, pl.inode, p, p, 1, 0, &fx);
        ino = pl.inode;
    } else if (memos_slot_create(t, name, p, p, 1, 0, 0, &ino, &fx) != SLOT_OK) {
        return -1;
    }
    memos_slot_write_plan(t, ino, 0, 0, &at, &fx);
    memos_slot_wrote(t, ino, at, 4096, 0);
    if (memos_slot_publish_plan(t, ino, p, p, &target) == SLOT_PUBLISH_DO)
        memos_slot_published(t, ino, (*version)++, 4096, 4096, 0, &holder, &fx);
    return memos_slot_writer_gone(t, ino, p, 0, &fx);
}

static int read_cycle(slot_table *t, uint64_t name, uint32_t p)
{
    uint64_t ino;
    unsigned fx;
    memos_open_req rq = { p, p, 0, 0, 0, 0, 0 };
    memos_open_plan pl;
    memos_slot_info in;
    if (memos_slot_lookup(t, name, p, &ino) != SLOT_OK)
        return -1;
    memos_slot_open_plan(t, ino, &rq, 0, &pl);
    memos_slot_attach_reader(t, pl.inode, pl.version, 0, 0, &fx);
    memos_slot_stat(t, pl.inode, p, 0, &in);
    return memos_slot_reader_gone(t, pl.inode, 0);
}

int main(int argc, char **argv)
{
    long ops = 1000000, names = 10000;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--ops"))
            ops = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--names"))
            names = atol(argv[i + 1]);
    }
    if (ops <= 0 || names <= 0) {
        fprintf(stderr, "usage: slot_bench [--ops N] [--names N]\n");
        return 2;
    }
    slot_table *t = memos_slot_table_new(10);
    uint64_t version = 1;
    double a = now_s();
    for (long i = 0; i < ops; i++)
        if (write_cycle(t, 1 + (uint64_t)(i % names), 100 + (uint32_t)(i % 8), &version) < 0)
            return 1;
    double b = now_s();
    for (long i = 0; i < ops; i++)
        if (read_cycle(t, 1 + (uint64_t)(i % names), 7) < 0)
            return 1;
    double c = now_s();
    printf("{\"ops\": %ld, \"names\": %ld, \"write_cycle_ns\": %.1f, \"read_cycle_ns\": %.1f, "
           "\"inodes\": %zu}\n", ops, names, (b - a) / (double)ops * 1e9,
           (c - b) / (double)ops * 1e9, memos_slot_count(t));
    memos_slot_table_free(t);
    return 0;
}
