/*
 * directory.c — the coherence directory.
 *
 * For every slot that somebody holds open, a list of holders: one per agent
 * (an agent is a uid, or a pid, as the caller decides), with its read and
 * write handle counts and its state:
 *
 *     I ──read──► S ──write──► E ──publish──► M
 *     ▲           │  (others → I,  │             │
 *     │           │   queued msg)  │             │ another agent reads: → S
 *     └─invalidate┴────────────────┴─────────────┘
 *
 * and, under protocol 2, P: a writer that waits until every holder it
 * invalidated has acknowledged (an explicit ack, opening the slot again, or
 * closing its last handle — so a holder that dies without acknowledging
 * still counts once the kernel releases its files).  Protocol 1 lets the
 * writer into E at once; the invalidations still go out, in batches, and a
 * publish invalidates the readers that came meanwhile.  Protocol 0 is the
 * caller not calling in at all.
 *
 * Invalidation messages queue up until the caller takes them (in batches:
 * the caller decides when); every transition is also recorded as an event
 * for the trace, in a bounded ring.
 *
 * Locking: one mutex per table, taken by every entry point.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "directory.h"

#define EVENT_RING 4096

typedef struct holder {
    struct holder *next;
    uint64_t agent;
    uint32_t readers;        /* open read handles */
    uint32_t writers;        /* open write handles */
    uint8_t  state;          /* DIR_I .. DIR_P */
    uint8_t  unacked;        /* invalidated, not yet acknowledged */
} holder;

typedef struct dslot {
    struct dslot *next;      /* bucket chain */
    uint64_t hash;
    size_t   klen;
    holder  *holders;
    char     key[];
} dslot;

struct dir_table {
    pthread_mutex_t lock;
    dslot  **buckets;
    size_t   nbuckets;       /* a power of two */
    dir_stats st;
    dir_msg *msgs;           /* FIFO: msgs[mhead .. mhead+mcount) */
    size_t   mcap, mhead, mcount;
    dir_event ring[EVENT_RING];
    size_t   ehead, ecount;
};

/* ---- helpers ---- */

static uint64_t hash_key(const void *key, size_t n)
{
    const unsigned char *p = key;
    uint64_t h = 0xcbf29ce484222325ull;          /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

static char *dup_key(const dslot *s)
{
    char *k = malloc(s->klen ? s->klen : 1);
    if (k)
        memcpy(k, s->key, s->klen);
    return k;
}

static void event(dir_table *d, const dslot *s, uint64_t agent, int from, int to, int cause)
{
    if (d->ecount == EVENT_RING) {               /* drop the oldest */
        free(d->ring[d->ehead].key);
        d->ehead = (d->ehead + 1) % EVENT_RING;
        d->ecount--;
        d->st.events_dropped++;
    }
    dir_event *e = &d->ring[(d->ehead + d->ecount) % EVENT_RING];
    e->key = dup_key(s);
    if (!e->key) {
        d->st.events_dropped++;
        return;
    }
    e->klen = s->klen;
    e->agent = agent;
    e->from = (uint8_t)from;
    e->to = (uint8_t)to;
    e->cause = (uint8_t)cause;
    d->ecount++;
}

static void set_state(dir_table *d, dslot *s, holder *h, int to, int cause)
{
    int from = h->state;
    h->state = (uint8_t)to;
    event(d, s, h->agent, from, to, cause);
}

static void queue_msg(dir_table *d, const dslot *s, uint64_t agent, uint64_t writer)
{
    if (d->mhead + d->mcount == d->mcap) {
        if (d->mhead > 0) {                      /* slide down first */
            memmove(d->msgs, d->msgs + d->mhead, d->mcount * sizeof *d->msgs);
            d->mhead = 0;
        }
        if (d->mcount == d->mcap) {
            size_t cap = d->mcap ? d->mcap * 2 : 64;
            dir_msg *m = realloc(d->msgs, cap * sizeof *m);
            if (!m)
                return;                          /* the holder is still I + unacked */
            d->msgs = m;
            d->mcap = cap;
        }
    }
    dir_msg *m = &d->msgs[d->mhead + d->mcount];
    m->key = dup_key(s);
    if (!m->key)
        return;
    m->klen = s->klen;
    m->agent = agent;
    m->writer = writer;
    d->mcount++;
    d->st.msgs_queued++;
}

static dslot **bucket_of(dir_table *d, uint64_t h)
{
    return &d->buckets[h & (d->nbuckets - 1)];
}

static dslot *find(dir_table *d, const void *key, size_t klen, uint64_t h)
{
    for (dslot *s = *bucket_of(d, h); s; s = s->next)
        if (s->hash == h && s->klen == klen && memcmp(s->key, key, klen) == 0)
            return s;
    return NULL;
}

static void grow(dir_table *d)
{
    size_t n = d->nbuckets * 2;
    dslot **b = calloc(n, sizeof *b);
    if (!b)
        return;                                  /* longer chains, still correct */
    for (size_t i = 0; i < d->nbuckets; i++) {
        for (dslot *s = d->buckets[i], *next; s; s = next) {
            next = s->next;
            s->next = b[s->hash & (n - 1)];
            b[s->hash & (n - 1)] = s;
        }
    }
    free(d->buckets);
    d->buckets = b;
    d->nbuckets = n;
}

static dslot *find_or_add(dir_table *d, const void *key, size_t klen, uint64_t h)
{
    dslot *s = find(d, key, klen, h);
    if (s)
        return s;
    s = malloc(sizeof *s + (klen ? klen : 1));
    if (!s)
        return NULL;
    s->hash = h;
    s->klen = klen;
    s->holders = NULL;
    memcpy(s->key, key, klen);
    if (d->st.slots >= d->nbuckets)
        grow(d);
    dslot **b = bucket_of(d, h);
    s->next = *b;
    *b = s;
    d->st.slots++;
    return s;
}

static void drop_if_empty(dir_table *d, dslot *s)
{
    if (!s || s->holders)
        return;
    for (dslot **p = bucket_of(d, s->hash); *p; p = &(*p)->next) {
        if (*p == s) {
            *p = s->next;
            free(s);
            d->st.slots--;
            return;
        }
    }
}

static holder *holder_of(dslot *s, uint64_t agent)
{
    for (holder *h = s ? s->holders : NULL; h; h = h->next)
        if (h->agent == agent)
            return h;
    return NULL;
}

static holder *add_holder(dir_table *d, dslot *s, uint64_t agent)
{
    holder *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    h->agent = agent;
    h->state = DIR_I;
    h->next = s->holders;
    s->holders = h;
    d->st.holders++;
    return h;
}

static void remove_holder(dir_table *d, dslot *s, holder *h)
{
    for (holder **p = &s->holders; *p; p = &(*p)->next) {
        if (*p == h) {
            *p = h->next;
            free(h);
            d->st.holders--;
            return;
        }
    }
}

static void ack(dir_table *d, dslot *s, holder *h)
{
    if (!h->unacked)
        return;
    h->unacked = 0;
    d->st.acks++;
    event(d, s, h->agent, h->state, h->state, DIR_CAUSE_ACK);
}

/* A pending writer whose invalidations are all acknowledged enters E. */
static int grant_pending(dir_table *d, dslot *s)
{
    int grants = 0;
    for (holder *w = s->holders; w; w = w->next) {
        if (w->state != DIR_P)
            continue;
        int waiting = 0;
        for (holder *h = s->holders; h; h = h->next)
            if (h != w && (h->unacked || h->state == DIR_E ||
                           (h->state == DIR_M && h->writers > 0)))
                waiting = 1;             /* (E: a protocol-1 writer came meanwhile) */
        if (!waiting) {
            set_state(d, s, w, DIR_E, DIR_CAUSE_GRANT);
            d->st.writes++;
            grants++;
        }
    }
    return grants;
}

/* Every other holder with a valid copy goes to I and is told so. */
static void invalidate_others(dir_table *d, dslot *s, holder *w)
{
    for (holder *h = s->holders; h; h = h->next) {
        if (h == w || h->state == DIR_I || h->unacked)
            continue;
        if (h->state == DIR_P)                   /* a waiting writer loses */
            continue;
        set_state(d, s, h, DIR_I, DIR_CAUSE_INVALIDATE);
        h->unacked = 1;
        d->st.invalidations++;
        queue_msg(d, s, h->agent, w->agent);
    }
}

static int others_unacked(dslot *s, holder *w)
{
    int n = 0;
    for (holder *h = s->holders; h; h = h->next)
        if (h != w && h->unacked)
            n++;
    return n;
}

/* Another agent writes (or waits to): P, E, or M with a write handle open. */
static int other_writer(dslot *s, uint64_t agent, int count_m)
{
    for (holder *h = s->holders; h; h = h->next) {
        if (h->agent == agent)
            continue;
        if (h->state == DIR_P || h->state == DIR_E)
            return 1;
        if (count_m && h->state == DIR_M && h->writers > 0)
            return 1;
    }
    return 0;
}

/* The agent's holder of key, made if need be; opening again acknowledges
 * an invalidation.  NULL (nothing left behind) on ENOMEM. */
static holder *join(dir_table *d, dslot **sp, const void *key, size_t klen, uint64_t hv,
                    uint64_t agent)
{
    dslot *s = *sp ? *sp : find_or_add(d, key, klen, hv);
    holder *h = s ? holder_of(s, agent) : NULL;
    if (s && !h)
        h = add_holder(d, s, agent);
    if (!h) {
        drop_if_empty(d, s);
        return NULL;
    }
    if (h->unacked) {
        ack(d, s, h);
        grant_pending(d, s);
    }
    *sp = s;
    return h;
}

/* ---- API ---- */

dir_table *dir_new(void)
{
    dir_table *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->nbuckets = 64;
    d->buckets = calloc(d->nbuckets, sizeof *d->buckets);
    if (!d->buckets) {
        free(d);
        return NULL;
    }
    pthread_mutex_init(&d->lock, NULL);
    return d;
}

void dir_delete(dir_table *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->nbuckets; i++) {
        for (dslot *s = d->buckets[i], *next; s; s = next) {
            next = s->next;
            for (holder *h = s->holders, *hn; h; h = hn) {
                hn = h->next;
                free(h);
            }
            free(s);
        }
    }
    for (size_t i = 0; i < d->mcount; i++)
        free(d->msgs[d->mhead + i].key);
    for (size_t i = 0; i < d->ecount; i++)
        free(d->ring[(d->ehead + i) % EVENT_RING].key);
    free(d->msgs);
    free(d->buckets);
    pthread_mutex_destroy(&d->lock);
    free(d);
}

int dir_read(dir_table *d, const void *key, size_t klen, uint64_t agent, int protocol)
{
    uint64_t hv = hash_key(key, klen);
    pthread_mutex_lock(&d->lock);
    dslot *s = find(d, key, klen, hv);
    if (protocol >= 2 && s && other_writer(s, agent, 0)) {
        d->st.read_waits++;
        pthread_mutex_unlock(&d->lock);
        return DIR_WAIT;
    }
    holder *h = join(d, &s, key, klen, hv, agent);
    if (!h) {
        pthread_mutex_unlock(&d->lock);
        return MEMOS_ENOMEM;
    }
    h->readers++;
    for (holder *o = s->holders; o; o = o->next) {
        if (o != h && o->state == DIR_M) {       /* the owner shares its version */
            set_state(d, s, o, DIR_S, DIR_CAUSE_DOWNGRADE);
            d->st.downgrades++;
        }
    }
    if (h->state == DIR_I)
        set_state(d, s, h, DIR_S, DIR_CAUSE_READ);
    d->st.reads++;
    pthread_mutex_unlock(&d->lock);
    return DIR_GRANTED;
}

int dir_write(dir_table *d, const void *key, size_t klen, uint64_t agent, int protocol,
              int upgrade)
{
    uint64_t hv = hash_key(key, klen);
    pthread_mutex_lock(&d->lock);
    dslot *s = find(d, key, klen, hv);
    if (protocol >= 2 && s && other_writer(s, agent, 1)) {
        pthread_mutex_unlock(&d->lock);
        return DIR_WAIT;
    }
    holder *h = join(d, &s, key, klen, hv, agent);
    if (!h) {
        pthread_mutex_unlock(&d->lock);
        return MEMOS_ENOMEM;
    }
    if (!upgrade || h->writers == 0)
        h->writers++;
    int rc = DIR_GRANTED;
    if (h->state == DIR_P) {
        rc = DIR_PENDING;                        /* a second handle of a waiting writer */
    } else if (h->state != DIR_E && h->state != DIR_M) {
        invalidate_others(d, s, h);
        if (protocol >= 2 && others_unacked(s, h)) {
            set_state(d, s, h, DIR_P, DIR_CAUSE_WRITE);
            d->st.pending_waits++;
            rc = DIR_PENDING;
        } else {
            set_state(d, s, h, DIR_E, DIR_CAUSE_WRITE);
            d->st.writes++;
        }
    }
    pthread_mutex_unlock(&d->lock);
    return rc;
}

int dir_ack(dir_table *d, const void *key, size_t klen, uint64_t agent)
{
    uint64_t hv = hash_key(key, klen);
    int grants = 0;
    pthread_mutex_lock(&d->lock);
    dslot *s = find(d, key, klen, hv);
    holder *h = holder_of(s, agent);
    if (h && h->unacked) {
        ack(d, s, h);
        grants = grant_pending(d, s);
    }
    pthread_mutex_unlock(&d->lock);
    return grants;
}

/* The pending writer w stops waiting: the holders it invalidated and that
 * have not acknowledged get their copy back. */
static void undo_pending(dir_table *d, dslot *s, holder *w)
{
    for (holder *h = s->holders; h; h = h->next) {
        if (h != w && h->unacked) {
            h->unacked = 0;
            set_state(d, s, h, DIR_S, DIR_CAUSE_RESTORE);
        }
    }
}

int dir_release(dir_table *d, const void *key, size_t klen, uint64_t agent, int writer)
{
    uint64_t hv = hash_key(key, klen);
    int grants = 0;
    pthread_mutex_lock(&d->lock);
    dslot *s = find(d, key, klen, hv);
    holder *h = holder_of(s, agent);
    if (!h) {
        pthread_mutex_unlock(&d->lock);
        return 0;
    }
    if (writer && h->writers > 0)
        h->writers--;
    else if (!writer && h->readers > 0)
        h->readers--;
    if (h->writers == 0 && (h->state == DIR_P || h->state == DIR_E || h->state == DIR_M)) {
        if (h->state == DIR_P)
            undo_pending(d, s, h);
        set_state(d, s, h, h->readers > 0 ? DIR_S : DIR_I,
                  h->state == DIR_P ? DIR_CAUSE_CANCEL : DIR_CAUSE_RELEASE);
    }
    if (h->readers + h->writers == 0) {
        ack(d, s, h);                            /* a close acknowledges */
        if (h->state != DIR_I)
            set_state(d, s, h, DIR_I, DIR_CAUSE_RELEASE);
        remove_holder(d, s, h);
    }
    grants = grant_pending(d, s);
    drop_if_empty(d, s);
    pthread_mutex_unlock(&d->lock);
    return grants;
}

int dir_publish(dir_table *d, const void *key, size_t klen, uint64_t agent)
{
    uint64_t hv = hash_key(key, klen);
    pthread_mutex_lock(&d->lock);
    dslot *s = find(d, key, klen, hv);
    holder *h = join(d, &s, key, klen, hv, agent);
    if (!h) {
        pthread_mutex_unlock(&d->lock);
        return MEMOS_ENOMEM;
    }
    /* readers that came while the writer was in E (protocol 1), or a writer
     * that lost E to a later one (last publish wins) */
    invalidate_others(d, s, h);
    set_state(d, s, h, DIR_M, DIR_CAUSE_PUBLISH);
    d->st.publishes++;
    if (h->readers + h->writers == 0) {          /* published without a handle */
        set_state(d, s, h, DIR_I, DIR_CAUSE_RELEASE);
        remove_holder(d, s, h);
        drop_if_empty(d, s);
    }
    pthread_mutex_unlock(&d->lock);
    return MEMOS_OK;
}

int dir_cancel(dir_table *d, const void *key, size_t klen, uint64_t agent, int keep_handle)
{
    uint64_t hv = hash_key(key, klen);
    pthread_mutex_lock(&d->lock);
    dslot *s = find(d, key, klen, hv);
    holder *h = holder_of(s, agent);
    if (!h || h->state != DIR_P) {
        pthread_mutex_unlock(&d->lock);
        return MEMOS_ENOENT;
    }
    undo_pending(d, s, h);
    d->st.timeouts++;
    if (!keep_handle && h->writers > 0)
        h->writers--;
    set_state(d, s, h, keep_handle || h->readers > 0 ? DIR_S : DIR_I, DIR_CAUSE_CANCEL);
    if (h->readers + h->writers == 0)
        remove_holder(d, s, h);
    drop_if_empty(d, s);
    pthread_mutex_unlock(&d->lock);
    return MEMOS_OK;
}

int dir_unacked(dir_table *d, const void *key, size_t klen, uint64_t agent)
{
    uint64_t hv = hash_key(key, klen);
    pthread_mutex_lock(&d->lock);
    holder *h = holder_of(find(d, key, klen, hv), agent);
    int un = h ? h->unacked : 0;
    pthread_mutex_unlock(&d->lock);
    return un;
}

size_t dir_revoke(dir_table *d, const void *key, size_t klen, int valid,
                  uint64_t *agents, size_t max)
{
    uint64_t hv = hash_key(key, klen);
    size_t n = 0;
    pthread_mutex_lock(&d->lock);
    dslot *s = find(d, key, klen, hv);
    for (holder *h = s ? s->holders : NULL; h; h = h->next) {
        int take = h->unacked ||
                   (valid && h->writers == 0 && (h->state == DIR_S || h->state == DIR_M));
        if (!take)
            continue;
        h->unacked = 0;                          /* void, not acknowledged */
        set_state(d, s, h, DIR_I, DIR_CAUSE_REVOKE);
        d->st.revoked++;
        if (n < max)
            agents[n] = h->agent;
        n++;
    }
    if (n)
        grant_pending(d, s);
    pthread_mutex_unlock(&d->lock);
    return n;
}

size_t dir_break_exclusive(dir_table *d, const void *key, size_t klen, uint64_t agent,
                           uint64_t *agents, size_t max)
{
    uint64_t hv = hash_key(key, klen);
    size_t n = 0;
    pthread_mutex_lock(&d->lock);
    dslot *s = find(d, key, klen, hv);
    for (holder *h = s ? s->holders : NULL; h; h = h->next) {
        if (h->agent == agent)
            continue;
        if (h->state != DIR_E && !(h->state == DIR_M && h->writers > 0))
            continue;
        set_state(d, s, h, DIR_S, DIR_CAUSE_REVOKE);
        d->st.revoked++;
        if (n < max)
            agents[n] = h->agent;
        n++;
    }
    pthread_mutex_unlock(&d->lock);
    return n;
}

int dir_state(dir_table *d, const void *key, size_t klen, uint64_t agent)
{
    uint64_t hv = hash_key(key, klen);
    pthread_mutex_lock(&d->lock);
    holder *h = holder_of(find(d, key, klen, hv), agent);
    int st = h ? h->state : DIR_I;
    pthread_mutex_unlock(&d->lock);
    return st;
}

size_t dir_holders(dir_table *d, const void *key, size_t klen, uint64_t *agents,
                   uint8_t *states, size_t max)
{
    uint64_t hv = hash_key(key, klen);
    size_t n = 0;
    pthread_mutex_lock(&d->lock);
    dslot *s = find(d, key, klen, hv);
    for (holder *h = s ? s->holders : NULL; h; h = h->next) {
        if (n < max) {
            agents[n] = h->agent;
            states[n] = h->state;
        }
        n++;
    }
    pthread_mutex_unlock(&d->lock);
    return n;
}

size_t dir_forget(dir_table *d, const void *key, size_t klen)
{
    uint64_t hv = hash_key(key, klen);
    size_t n = 0;
    pthread_mutex_lock(&d->lock);
    dslot *s = find(d, key, klen, hv);
    if (s) {
        while (s->holders) {
            holder *h = s->holders;
            if (h->state != DIR_I)
                set_state(d, s, h, DIR_I, DIR_CAUSE_RELEASE);
            remove_holder(d, s, h);
            n++;
        }
        drop_if_empty(d, s);
    }
    pthread_mutex_unlock(&d->lock);
    return n;
}

size_t dir_take_msgs(dir_table *d, dir_msg *out, size_t max)
{
    pthread_mutex_lock(&d->lock);
    size_t n = d->mcount < max ? d->mcount : max;
    if (n)
        memcpy(out, d->msgs + d->mhead, n * sizeof *out);
    d->mhead += n;
    d->mcount -= n;
    if (d->mcount == 0)
        d->mhead = 0;
    pthread_mutex_unlock(&d->lock);
    return n;
}

size_t dir_msgs_queued(dir_table *d)
{
    pthread_mutex_lock(&d->lock);
    size_t n = d->mcount;
    pthread_mutex_unlock(&d->lock);
    return n;
}

size_t dir_take_events(dir_table *d, dir_event *out, size_t max)
{
    pthread_mutex_lock(&d->lock);
    size_t n = 0;
    while (n < max && d->ecount > 0) {
        out[n++] = d->ring[d->ehead];
        d->ehead = (d->ehead + 1) % EVENT_RING;
        d->ecount--;
    }
    pthread_mutex_unlock(&d->lock);
    return n;
}

void dir_get_stats(dir_table *d, dir_stats *out)
{
    pthread_mutex_lock(&d->lock);
    *out = d->st;
    pthread_mutex_unlock(&d->lock);
}

int dir_check(dir_table *d)
{
    int rc = MEMOS_OK;
    uint64_t slots = 0, holders = 0;
    pthread_mutex_lock(&d->lock);
    for (size_t i = 0; i < d->nbuckets; i++) {
        for (dslot *s = d->buckets[i]; s; s = s->next) {
            slots++;
            if ((s->hash & (d->nbuckets - 1)) != i || !s->holders)
                rc = MEMOS_EINVAL;
            int exclusive = 0, valid_others = 0, pending = 0;
            for (holder *h = s->holders; h; h = h->next) {
                holders++;
                if (h->state > DIR_P || h->readers + h->writers == 0)
                    rc = MEMOS_EINVAL;
                if ((h->state == DIR_E || h->state == DIR_M || h->state == DIR_P) &&
                    h->writers == 0)
                    rc = MEMOS_EINVAL;           /* a writer state needs a write handle */
                if (h->unacked && h->state != DIR_I)
                    rc = MEMOS_EINVAL;
                if (h->state == DIR_E)
                    exclusive++;
                else if (h->state == DIR_P)
                    pending++;
                if (h->state == DIR_S || h->state == DIR_M)
                    valid_others++;
            }
            if (exclusive > 1 || pending > 1)
                rc = MEMOS_EINVAL;
            (void)valid_others;
        }
    }
    if (slots != d->st.slots || holders != d->st.holders)
        rc = MEMOS_EINVAL;
    pthread_mutex_unlock(&d->lock);
    return rc;
}

const char *dir_state_name(int state)
{
    static const char *names[] = {"I", "S", "E", "M", "P"};
    return state >= 0 && state <= DIR_P ? names[state] : "?";
}

const char *dir_cause_name(int cause)
{
    static const char *names[] = {"read", "write", "invalidate", "ack", "release",
                                  "grant", "publish", "downgrade", "cancel", "restore",
                                  "revoke"};
    return cause >= 0 && cause <= DIR_CAUSE_REVOKE ? names[cause] : "?";
}
