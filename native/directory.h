/*
 * directory.h — the coherence directory: per slot, which agents hold it and
 * in which state, MESI-style, plus Pending for a writer that waits for
 * acknowledgements.  See directory.c for the protocol.
 *
 * Thread safety: every function takes the table's own mutex; the table is
 * independent of the cache (a slot is named by its key bytes).
 */
#ifndef MEMOS_DIRECTORY_H
#define MEMOS_DIRECTORY_H

#include <stddef.h>
#include <stdint.h>

#include "memos.h"

/* A holder's state. */
enum {
    DIR_I = 0,      /* invalid: holds no valid copy (or holds nothing) */
    DIR_S = 1,      /* shared: reads a valid version, others may too */
    DIR_E = 2,      /* exclusive: the only valid holder, may write */
    DIR_M = 3,      /* modified: exclusive, and has published a new version */
    DIR_P = 4,      /* pending: a writer waiting for acknowledgements */
};

/* Results of dir_read / dir_write. */
enum {
    DIR_GRANTED = 0,    /* the holder is in S (read) or E/M (write) */
    DIR_WAIT = 1,       /* protocol 2: try again after the directory changes */
    DIR_PENDING = 2,    /* protocol 2 writer: registered in P, waits for acks */
};

/* Why a transition happened (events). */
enum {
    DIR_CAUSE_READ = 0, DIR_CAUSE_WRITE, DIR_CAUSE_INVALIDATE, DIR_CAUSE_ACK,
    DIR_CAUSE_RELEASE, DIR_CAUSE_GRANT, DIR_CAUSE_PUBLISH, DIR_CAUSE_DOWNGRADE,
    DIR_CAUSE_CANCEL, DIR_CAUSE_RESTORE, DIR_CAUSE_REVOKE,
};

typedef struct dir_table dir_table;

typedef struct dir_stats {
    uint64_t slots;          /* slots with at least one holder */
    uint64_t holders;        /* (slot, agent) pairs */
    uint64_t reads;          /* read grants */
    uint64_t writes;         /* write grants (E reached) */
    uint64_t invalidations;  /* holders moved to I by a writer */
    uint64_t acks;           /* invalidations acknowledged (explicitly or by release) */
    uint64_t pending_waits;  /* writers that entered P */
    uint64_t read_waits;     /* protocol 2 reads told to wait for a writer */
    uint64_t timeouts;       /* pending writers cancelled */
    uint64_t downgrades;     /* M holders moved to S by a reader */
    uint64_t publishes;
    uint64_t msgs_queued;    /* invalidation messages queued for delivery */
    uint64_t events_dropped; /* events lost to a full event ring */
    uint64_t revoked;        /* holders whose copy was revoked (lease break, root) */
} dir_stats;

/* An invalidation to deliver: `agent` must learn that its copy of `key` is stale. */
typedef struct dir_msg {
    char    *key;            /* malloc'd, owned by the receiver (free()) */
    size_t   klen;
    uint64_t agent;
    uint64_t writer;         /* the agent whose write caused it */
} dir_msg;

/* A state transition, for the trace. */
typedef struct dir_event {
    char    *key;            /* malloc'd, owned by the receiver (free()) */
    size_t   klen;
    uint64_t agent;
    uint8_t  from, to, cause;
} dir_event;

dir_table *dir_new(void);                 /* NULL on ENOMEM */
void dir_delete(dir_table *d);

/* Open a read handle.  Under protocol 2 a read waits (DIR_WAIT, nothing
 * registered) while another agent is in P or E; an M holder is downgraded
 * to S.  Opening again after an invalidation acknowledges it. */
int dir_read(dir_table *d, const void *key, size_t klen, uint64_t agent, int protocol);

/* Open a write handle (or upgrade one: a write after the holder lost E/M).
 * Every other valid holder goes to I and gets an invalidation message.
 * Protocol 1: the writer is in E at once (DIR_GRANTED).  Protocol 2: if
 * another agent is a writer (P/E/M with a write handle) DIR_WAIT and nothing
 * is registered; otherwise P (DIR_PENDING) until every invalidated holder
 * has acknowledged, or E (DIR_GRANTED) if none had to.  `upgrade`: the
 * handle is already counted (a write on an open handle). */
int dir_write(dir_table *d, const void *key, size_t klen, uint64_t agent, int protocol,
              int upgrade);

/* The agent acknowledges its invalidation; a pending writer whose last
 * ack this was moves to E.  Returns the number of grants it caused. */
int dir_ack(dir_table *d, const void *key, size_t klen, uint64_t agent);

/* A handle closes (writer: it was a write handle).  The last handle of an
 * agent removes it, and counts as its ack; a pending writer that closes
 * cancels its wait.  Returns the number of grants it caused. */
int dir_release(dir_table *d, const void *key, size_t klen, uint64_t agent, int writer);

/* The writer published a version: E → M (from I or S under protocol 1, the
 * write is acquired first: last publish wins). */
int dir_publish(dir_table *d, const void *key, size_t klen, uint64_t agent);

/* A pending writer gives up (timeout): it drops its write handle (unless
 * keep_handle: an upgrade of a handle that stays open, which goes back to S),
 * and the holders that had not acknowledged are restored to S, as if nothing
 * had happened.  Returns MEMOS_OK, or MEMOS_ENOENT if it was not pending. */
int dir_cancel(dir_table *d, const void *key, size_t klen, uint64_t agent,
               int keep_handle);

/* Whether the agent holds key and was invalidated without acknowledging. */
int dir_unacked(dir_table *d, const void *key, size_t klen, uint64_t agent);

/* Revoke holders of key (a lease break): every holder that was invalidated
 * and has not acknowledged is taken as acknowledged (it stays in I, its
 * handles' copies are void: the caller fails their reads).  With `valid`,
 * also every holder with a valid copy and no write handle (S, or M after a
 * publish) goes to I.  Holders with a write handle in E, M or P are never
 * revoked.  A pending writer whose last wait this was enters E.  Writes the
 * revoked agents to agents[0..max) and returns their number. */
size_t dir_revoke(dir_table *d, const void *key, size_t klen, int valid,
                  uint64_t *agents, size_t max);

/* A writer's lease break: every other agent that holds key exclusively
 * with a write handle (E, or M with a write handle open) and has kept others
 * waiting past the lease goes to S (cause revoke), so that readers and
 * writers waiting on it go on.  Its write handles stay open: its next write
 * or publish acquires E again (dir_write with upgrade), which invalidates
 * the others first.  A pending writer (P) is left alone: its own wait ends
 * by lease break or cancel.  Writes the agents to agents[0..max) and returns
 * their number. */
size_t dir_break_exclusive(dir_table *d, const void *key, size_t klen, uint64_t agent,
                           uint64_t *agents, size_t max);

/* The agent's state for key (DIR_I when it holds nothing). */
int dir_state(dir_table *d, const void *key, size_t klen, uint64_t agent);

/* Holders of key: up to max (agent, state) pairs; returns their number. */
size_t dir_holders(dir_table *d, const void *key, size_t klen, uint64_t *agents,
                   uint8_t *states, size_t max);

/* Forget a slot (removed): its holders stay only as handle counts in the
 * caller; returns the number of holders dropped. */
size_t dir_forget(dir_table *d, const void *key, size_t klen);

/* Take up to max queued invalidation messages / events (oldest first). */
size_t dir_take_msgs(dir_table *d, dir_msg *out, size_t max);
size_t dir_take_events(dir_table *d, dir_event *out, size_t max);
size_t dir_msgs_queued(dir_table *d);

void dir_get_stats(dir_table *d, dir_stats *out);

/* Internal consistency (tests): MEMOS_OK or MEMOS_EINVAL. */
int dir_check(dir_table *d);

const char *dir_state_name(int state);    /* "I", "S", "E", "M", "P" */
const char *dir_cause_name(int cause);

#endif /* MEMOS_DIRECTORY_H */
