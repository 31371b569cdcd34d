/*
 * slot.c — the life of a slot, one state machine per inode.
 *
 * A slot's bytes change only by publish: writers write a draft, and the
 * opener's close or fsync makes it the next version.  The kernel, though,
 * caches pages and attributes per inode, and readers read a snapshot through
 * those pages; so one name may be served by a chain of inodes, each in one
 * of six states:
 *
 *   create(2) ─► CREATED ───── publish ─────► PUBLISHED ◄──── restore (mount,
 *              version 0; only its               │  ▲          remote, creat
 *              writers find the name             │  │          for reading)
 *                 │                   open for   │  │ last writer leaves
 *                 │ last writer leaves, writing  ▼  │ (a publish on the way
 *                 │ nothing published          WRITING   when its opener closed)
 *                 ▼                           writers share one draft
 *   GONE(unpublished)
 *
 *   from any state that holds the name:
 *     publish or open while page-cache readers or a push hold it
 *         ──► SUPERSEDED: `successor` is a fresh inode holding the name;
 *             it keeps serving its handles, publishes follow the chain
 *     unlink ──► GONE(unlink)      rename over it ──► GONE(replaced), `replaced_by`
 *     no tier holds it ──► GONE(evicted)  (a publish of its writers puts it back)
 *   a retried O_TRUNC writer that cannot share the inode it found
 *         ──► PRIVATE: a nameless inode with its own draft, `private_of`
 *             the inode the kernel opened; its publishes follow that name
 *   GONE, SUPERSEDED, PRIVATE with no lookup, handle or link ──► freed
 *
 * The page-cache sub-state (`struct slot_pages`), orthogonal to the above:
 *
 *   cache_version  -1 ─reader open─► v (keep_cache when it was -1 or v)
 *                  ─writer open─► -2;  publish with writers open ─► -2
 *                  last writer leaves ─► v when the writers wrote the
 *                  published version through these pages (`trusted`), else -2
 *                  a push ─► v
 *   readers        page-cache read handles (readers around the cache are not
 *                  counted: they never hold the pages' version)
 *   pending        pid ─► deadline of a writer sent here by ESTALE (or
 *                  waiting): readers meanwhile read around the cache
 *
 * Invariants (memos_slot_check): the name map points at exactly the inodes
 * in CREATED, PUBLISHED or WRITING; CREATED has version 0, the others that
 * hold a name a version; a writer never shares an inode with page-cache
 * readers; a draft and a base are never both held; the writers' per-process
 * counts add up; a chain of successors ends at an inode that holds its name
 * or is gone; cache_version is -1, -2 or at most the version.
 *
 * What the table does not own: bytes (the cache's drafts and pinned
 * entries), directories and the strings of names (the caller's tree: a name
 * here is an id), the tiers (the caller says what a tier holds), the
 * coherence directory, the kernel.  Every decision returns SLOT_FX_* bits
 * for the caller to carry out; nothing here blocks or calls out.
 *
 * Locking: none inside; the caller holds one lock around every call.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "slot.h"

/* ---- types ---- */

typedef struct slot_pending {
    uint32_t pid;           /* the thread of a writer on its way */
    int64_t  until_ns;      /* when it is not waited for any more (CLOCK_MONOTONIC ns) */
} slot_pending;

typedef struct slot_tgid {
    uint32_t tgid;          /* a process with write handles */
    uint32_t n;             /* its write handles on this inode */
} slot_tgid;

/* The kernel's page cache of this inode (table lock). */
struct slot_pages {
    uint32_t readers;       /* page-cache read handles (count) */
    int32_t  pushing;       /* pushes copying a version into the pages (count) */
    int64_t  cache_version; /* -1 unknown, -2 stale, else the version the pages hold */
    int      trusted;       /* since the first writer's open every write went through
                               the pages into the draft (0/1) */
    uint64_t pages_version; /* the version the writers of this inode published last */
    slot_pending *pending;  /* writers on their way (array) */
    uint32_t npending;      /* used entries of pending */
    uint32_t cap_pending;   /* allocated entries of pending */
};

/* A byte range of a draft whose write was refused: [start, end). */
typedef struct slot_span {
    uint64_t start;         /* first byte (offset) */
    uint64_t end;           /* one past the last byte (offset) */
} slot_span;

/* The writers' shared draft (table lock); the bytes are the caller's. */
struct slot_draft {
    uint32_t   writers;     /* write handles (count) */
    slot_tgid *tgids;       /* the processes that opened them (array) */
    uint32_t   ntgids;      /* used entries of tgids */
    uint32_t   cap_tgids;   /* allocated entries of tgids */
    enum memos_draft_kind kind; /* what holds the draft's bytes (NONE: no draft) */
    int        has_base;    /* the version the draft will start from is pinned (0/1) */
    uint64_t   size;        /* bytes of the draft, or of the base (when either is held) */
    int        changed;     /* unpublished changes (0/1) */
    int        trunc_only;  /* as an O_TRUNC open left it: nothing written since (0/1) */
    int64_t    mtime_ns;    /* the mtime the writers see (ns since the epoch) */
    slot_span  refused[SLOT_REFUSALS_MAX]; /* refused ranges, sorted, disjoint */
    uint32_t   nrefused;    /* used entries of refused (0: the draft may publish) */
    int        refused_code;/* errno of the first refusal left (0: none) */
    int        refused_told;/* its refused publish was logged (0/1) */
};

typedef struct memos_slot {
    uint64_t ino;                   /* the inode number (constant) */
    uint64_t name;                  /* the caller's id of its name (rename moves it) */
    enum memos_slot_state state;    /* see the essay */
    enum memos_slot_gone gone;      /* GONE: why; else SLOT_GONE_NOT */
    uint64_t version;               /* published version, 0 if never */
    uint64_t pub_size;              /* its logical bytes */
    uint64_t stored;                /* bytes of its pages */
    int64_t  mtime_ns;              /* its mtime (ns since the epoch) */
    int64_t  lookups;               /* the kernel's lookup count */
    int64_t  handles;               /* open handles of any kind */
    uint32_t links;                 /* other inodes' successor/replaced_by/private_of here */
    struct memos_slot *successor;   /* SUPERSEDED, PRIVATE: where publishes go */
    struct memos_slot *replaced_by; /* GONE(replaced): the slot renamed over it */
    struct memos_slot *private_of;  /* PRIVATE: the inode the kernel opened */
    struct memos_slot *privates;    /* PRIVATE inodes for this inode (list head) */
    struct memos_slot *next_private;/* PRIVATE: next in its owner's list */
    uint32_t private_tgid;          /* PRIVATE: the process whose draft it is */
    struct memos_slot *view_of;     /* VIEW: the inode whose writers' file keeps readers off */
    uint64_t pubs;                  /* publishes on this inode (count) */
    int32_t  backing;               /* passthrough backing id its open files use (0: none) */
    uint32_t backing_opens;         /* passthrough handles on it (count) */
    struct slot_draft d;            /* the writers' draft */
    struct slot_pages p;            /* the kernel's page cache */
} memos_slot;

/* u64 -> slot, open addressing, linear probing, backward-shift deletion */
typedef struct slot_map {
    uint64_t   *keys;       /* 0: empty */
    memos_slot **vals;      /* the slot of each key */
    size_t      cap;        /* entries, a power of two */
    size_t      n;          /* used entries */
    struct slot_table *t;   /* its table (the allocation countdown) */
} slot_map;

struct slot_table {
    slot_map inos;          /* ino -> slot, every inode held */
    slot_map names;         /* name -> the inode that holds it */
    uint64_t next_ino;      /* the next inode number handed out */
    uint64_t fail_after;    /* allocations until an injected failure (0: none) */
    uint64_t *freed;        /* inodes forgotten since memos_slot_take_freed (array) */
    size_t   nfreed;        /* used entries of freed */
    size_t   cap_freed;     /* allocated entries of freed */
    int      wb;            /* the kernel's writeback cache is on (memos_slot_set_writeback) */
};

/* ---- private prototypes ---- */

static void *slot_realloc(slot_table *t, void *p, size_t n);
static memos_slot *map_get(const slot_map *m, uint64_t k);
static int  map_reserve(slot_map *m, size_t more);
static int  map_put(slot_map *m, uint64_t k, memos_slot *v);
static void map_del(slot_map *m, uint64_t k);
static memos_slot *slot_alloc(slot_table *t, uint64_t name);
static void slot_release(slot_table *t, memos_slot *s);
static void slot_maybe_forget(slot_table *t, memos_slot *s);
static void slot_settle(memos_slot *s);
static int  slot_holds_name(const slot_table *t, const memos_slot *s);
static memos_slot *slot_latest(memos_slot *s);
static memos_slot *slot_name_holder(const slot_table *t, memos_slot *s);
static memos_slot *slot_supersede(slot_table *t, memos_slot *s, unsigned *fx);
static void slot_go(slot_table *t, memos_slot *s, enum memos_slot_gone why);
static int  slot_has_tgid(const memos_slot *s, uint32_t tgid);
static int  slot_add_tgid(slot_table *t, memos_slot *s, uint32_t tgid);
static int  slot_del_tgid(memos_slot *s, uint32_t tgid);
static int  pending_has(const memos_slot *s, uint32_t pid);
static int  pending_live(const memos_slot *s, int64_t now_ns);
static void pending_prune(memos_slot *s, int64_t now_ns);
static int  pending_set(slot_table *t, memos_slot *s, uint32_t pid, int64_t until_ns);
static void pending_pop(memos_slot *s, uint32_t pid);
static int  pending_merge(slot_table *t, memos_slot *to, const memos_slot *from);
static uint64_t draft_size(const memos_slot *s);
static int  do_published(slot_table *t, memos_slot *node, uint64_t version, uint64_t size,
                         uint64_t stored, int64_t mtime_ns, int64_t now_ns, int fresh,
                         memos_slot **holder, unsigned *fx);
static void refusals_clear(memos_slot *s);
static void refusals_note(memos_slot *s, uint64_t start, uint64_t end, int code);
static void refusals_written(memos_slot *s, uint64_t start, uint64_t end);
static void refusals_cut(memos_slot *s, uint64_t size);
static void link_to(memos_slot **field, memos_slot *to);
static void unlink_from(slot_table *t, memos_slot **field);

/* ---- API: the table ---- */

slot_table *memos_slot_table_new(uint64_t first_ino)
{
    slot_table *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->next_ino = first_ino ? first_ino : 1;
    t->inos.t = t->names.t = t;
    return t;
}

void memos_slot_table_free(slot_table *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->inos.cap; i++)
        if (t->inos.keys[i])
            slot_release(t, t->inos.vals[i]);
    free(t->inos.keys);
    free(t->inos.vals);
    free(t->names.keys);
    free(t->names.vals);
    free(t->freed);
    free(t);
}

size_t memos_slot_count(const slot_table *t)
{
    return t->inos.n;
}

uint64_t memos_slot_fail_after(slot_table *t, uint64_t n)
{
    uint64_t left = t->fail_after;
    t->fail_after = n;
    return left;
}

uint64_t memos_slot_new_ino(slot_table *t)
{
    return t->next_ino++;
}

size_t memos_slot_take_freed(slot_table *t, uint64_t *out, size_t max)
{
    size_t n = t->nfreed < max ? t->nfreed : max;
    memcpy(out, t->freed + (t->nfreed - n), n * sizeof *out);
    t->nfreed -= n;
    return n;
}

void memos_slot_set_writeback(slot_table *t, int on)
{
    t->wb = on != 0;
}

/* ---- API: lifecycle ---- */

int memos_slot_create(slot_table *t, uint64_t name, uint32_t tgid, uint32_t pid,
                      int trunc, int excl, int64_t now_ns, uint64_t *ino, unsigned *fx)
{
    memos_slot *node = map_get(&t->names, name);
    *fx = 0;
    if (node && excl)
        return SLOT_EEXIST;
    if (!node) {
        node = slot_alloc(t, name);
        if (!node)
            return SLOT_ENOMEM;
        node->state = SLOT_CREATED;
        if (map_put(&t->names, name, node) < 0) {
            map_del(&t->inos, node->ino);
            slot_release(t, node);
            return SLOT_ENOMEM;
        }
        trunc = 1;                      /* a new slot starts empty */
        *fx |= SLOT_FX_FORGET_ENTRY;    /* (the parent's listing changed) */
    } else if (!trunc) {
        /* O_CREAT of a name that exists: a join that keeps the content */
        if (node->p.readers || node->p.pushing)
            node = slot_supersede(t, node, fx);
    } else if (node->p.readers || node->p.pushing || node->d.writers) {
        /* readers or other writers keep that inode: a whole new version on a
         * fresh one, the last publish wins */
        node = slot_supersede(t, node, fx);
    }
    if (!node)
        return SLOT_ENOMEM;
    unsigned afx = 0;
    int rc = memos_slot_attach_writer(t, node->ino, tgid, pid, trunc, now_ns, &afx);
    *fx |= afx;
    *ino = node->ino;
    return rc;
}

int memos_slot_restore(slot_table *t, uint64_t name, uint64_t version, uint64_t size,
                       uint64_t stored, int64_t now_ns, uint64_t *ino)
{
    if (map_get(&t->names, name))
        return SLOT_EEXIST;
    if (!version)
        return SLOT_EINVAL;
    memos_slot *s = slot_alloc(t, name);
    if (!s)
        return SLOT_ENOMEM;
    if (map_put(&t->names, name, s) < 0) {
        map_del(&t->inos, s->ino);
        slot_release(t, s);
        return SLOT_ENOMEM;
    }
    s->version = version;
    s->pub_size = size;
    s->stored = stored;
    s->mtime_ns = now_ns;
    slot_settle(s);
    *ino = s->ino;
    return SLOT_OK;
}

int memos_slot_lookups(slot_table *t, uint64_t ino, int64_t n)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    s->lookups += n;
    slot_maybe_forget(t, s);
    return SLOT_OK;
}

/* ---- API: finding ---- */

int memos_slot_lookup(const slot_table *t, uint64_t name, uint32_t tgid, uint64_t *ino)
{
    memos_slot *s = map_get(&t->names, name);
    if (!s || (!s->version && !slot_has_tgid(s, tgid)))
        return SLOT_ENOENT;     /* created, never published: not a hit */
    *ino = s->ino;
    return SLOT_OK;
}

/* ---- API: opening ---- */

#define PLAN(act, ino_, fx_) do { out->action = (act); out->inode = (ino_); \
                                  out->fx = (fx_); return SLOT_OK; } while (0)

int memos_slot_open_plan(const slot_table *t, uint64_t inode, const memos_open_req *rq,
                         int64_t now_ns, memos_open_plan *out)
{
    memos_slot *in = map_get(&t->inos, inode);
    memset(out, 0, sizeof *out);
    if (!in || in->state == SLOT_PRIVATE)
        return SLOT_ENOENT;
    int w = rq->write, tr = rq->trunc;
    /* a draft of its own is no option under the writeback cache (the
     * kernel truncates the inode's pages for an O_TRUNC open) nor beside a
     * writers' file (the one backing file the inode may have): such a
     * writer shares the inode's draft and truncates it */
    int own = !t->wb && in->d.kind != SLOT_DRAFT_FILE;
#define PRIVATE_OR_SHARE() do { if (own) PLAN(SLOT_OPEN_PRIVATE, in->ino, SLOT_FX_DIRECT_IO); \
                                PLAN(SLOT_OPEN_WRITE, in->ino, SLOT_FX_TRUNC_DRAFT); } while (0)
    if (rq->retry && !rq->waited && !rq->locked && (in->p.readers || in->p.pushing)) {
        /* the kernel's one retry found an inode that page-cache readers hold
         * (the name moved on again): a second ESTALE would reach the
         * application, so wait for them, pending here meanwhile */
        out->target = in->ino;
        PLAN(SLOT_OPEN_WAIT, in->ino, 0);
    }
    memos_slot *node = slot_latest(in);
    if (node->state == SLOT_GONE) {
        if (!w && node->gone == SLOT_GONE_REPLACED) {
            /* rename(2) is atomic: served the slot that holds the name now,
             * around this inode's page cache */
            memos_slot *h = slot_name_holder(t, node);
            if (h && h->version) {
                out->target = h->ino;
                out->version = h->version;
                PLAN(SLOT_OPEN_READ, in->ino, SLOT_FX_DIRECT_IO);
            }
        }
        if (!w || (node->gone != SLOT_GONE_UNLINK && node->gone != SLOT_GONE_REPLACED))
            PLAN(SLOT_OPEN_ENOENT, in->ino, 0);
        if (node->p.readers || node->p.pushing || in->p.readers || in->p.pushing) {
            if (rq->retry && !in->p.readers)
                PRIVATE_OR_SHARE();
            memos_slot *h = node->gone == SLOT_GONE_REPLACED ? slot_name_holder(t, node) : NULL;
            out->target = (h ? h : node)->ino;
            PLAN(SLOT_OPEN_SEND_BACK, in->ino, 0);
        }
        /* as if the open came first: its bytes go with the inode it found;
         * a second whole-slot writer there gets a draft of its own */
        if (in->d.writers && tr && !slot_has_tgid(in, rq->tgid))
            PRIVATE_OR_SHARE();
        PLAN(SLOT_OPEN_WRITE, in->ino, SLOT_FX_TRUNC_DRAFT);
    }
    if (!node->version && !slot_has_tgid(node, rq->tgid) && (!w || !node->d.writers))
        PLAN(SLOT_OPEN_ENOENT, in->ino, 0);                  /* not published yet */
    int busy = node->p.pushing || in->p.pushing
        || (!rq->locked && tr && pending_has(node, rq->pid) && node->d.writers)
        || (!rq->locked && tr && node != in && (in->d.writers || in->p.readers));
    if (w && !rq->waited && busy)
        PLAN(SLOT_OPEN_WAIT, in->ino, 0);
    if (node != in) {
        /* a stale dentry: readers read the name's version around this
         * inode's cache; writers make a whole version here, or look again */
        if (w) {
            if (tr && !(in->p.readers || in->p.pushing || in->d.writers))
                PLAN(SLOT_OPEN_WRITE, in->ino, SLOT_FX_TRUNC_DRAFT);
            if (rq->retry && !in->p.readers)
                PRIVATE_OR_SHARE();
            out->target = node->ino;
            PLAN(SLOT_OPEN_SEND_BACK, in->ino, 0);
        }
        out->target = node->ino;
        out->version = node->version;
        PLAN(SLOT_OPEN_READ, in->ino, SLOT_FX_DIRECT_IO);
    }
    if (w && (node->p.pushing || (tr && node->d.writers)
              || (!pending_has(node, rq->pid)
                  && (node->p.readers || (tr && pending_live(node, now_ns)))))) {
        /* page-cache readers keep this inode, or another whole-slot writer
         * is in: the writer goes to a fresh inode (ESTALE, the kernel retries) */
        if (rq->retry && !in->p.readers)
            PRIVATE_OR_SHARE();
        out->target = node->ino;
        PLAN(SLOT_OPEN_SEND_BACK, in->ino, 0);
    }
    if (w) {
        unsigned fx = tr ? SLOT_FX_TRUNC_DRAFT
            : (node->version && !node->d.kind && !node->d.has_base) ? SLOT_FX_NEED_BASE : 0;
        PLAN(SLOT_OPEN_WRITE, node->ino, fx);
    }
    out->target = node->ino;
    out->version = node->version;
    PLAN(SLOT_OPEN_READ, node->ino, 0);
}

#undef PRIVATE_OR_SHARE
#undef PLAN

int memos_slot_attach_reader(slot_table *t, uint64_t inode, uint64_t version, int around,
                             int64_t now_ns, unsigned *fx)
{
    memos_slot *s = map_get(&t->inos, inode);
    *fx = 0;
    if (!s)
        return SLOT_ENOENT;
    s->handles++;
    pending_prune(s, now_ns);
    if (around == 2) {                  /* passthrough: its own backing file */
        s->p.readers++;
        return SLOT_OK;
    }
    if (s->d.writers || s->p.npending || around) {
        *fx = SLOT_FX_DIRECT_IO;        /* the writers' draft lives in these pages */
        return SLOT_OK;
    }
    if (s->p.cache_version == (int64_t)version || s->p.cache_version == -1)
        *fx = SLOT_FX_KEEP_CACHE;
    s->p.cache_version = (int64_t)version;
    s->p.readers++;
    return SLOT_OK;
}

int memos_slot_attach_writer(slot_table *t, uint64_t inode, uint32_t tgid, uint32_t pid,
                             int trunc, int64_t now_ns, unsigned *fx)
{
    memos_slot *s = map_get(&t->inos, inode);
    *fx = 0;
    if (!s)
        return SLOT_ENOENT;
    if (slot_add_tgid(t, s, tgid) < 0)
        return SLOT_ENOMEM;
    if (trunc) {
        if (s->d.has_base)
            *fx |= SLOT_FX_FREE_DRAFT;
        s->d.has_base = 0;
        if (!s->d.kind)
            s->d.kind = SLOT_DRAFT_ARENA;
        s->d.size = 0;
        refusals_clear(s);              /* a whole new version */
        s->d.changed = 1;
        s->d.trunc_only = 1;            /* (until a write: the shell's `>`) */
        s->d.mtime_ns = now_ns;
        *fx |= SLOT_FX_TRUNC_DRAFT;
    } else if (s->version && !s->d.kind && !s->d.has_base) {
        s->d.has_base = 1;              /* the caller pins the published version */
        s->d.size = s->pub_size;
        *fx |= SLOT_FX_NEED_BASE;
    }
    s->p.cache_version = -2;            /* the open drops the pages: they are the writers' */
    if (!s->d.writers) {
        s->p.trusted = 1;
        s->p.pages_version = 0;
    }
    s->d.writers++;
    s->handles++;
    pending_pop(s, pid);                /* the writer sent here is in */
    slot_settle(s);
    return SLOT_OK;
}

int memos_slot_private(slot_table *t, uint64_t inode, uint32_t tgid, uint32_t pid,
                       int64_t now_ns, uint64_t *priv, unsigned *fx)
{
    memos_slot *in = map_get(&t->inos, inode);
    *fx = 0;
    if (!in)
        return SLOT_ENOENT;
    memos_slot *sh = slot_alloc(t, in->name);
    if (!sh)
        return SLOT_ENOMEM;
    sh->state = SLOT_PRIVATE;
    link_to(&sh->successor, in);        /* publishes follow the name */
    link_to(&sh->private_of, in);
    sh->private_tgid = tgid;
    unsigned afx;
    int rc = memos_slot_attach_writer(t, sh->ino, tgid, pid, 1, now_ns, &afx);
    if (rc != SLOT_OK) {
        slot_maybe_forget(t, sh);       /* (no handle: it goes, its links with it) */
        return rc;
    }
    sh->next_private = in->privates;
    in->privates = sh;
    in->p.trusted = 0;                  /* its bytes go around these pages */
    *fx = afx | SLOT_FX_DIRECT_IO;
    *priv = sh->ino;
    return SLOT_OK;
}

int memos_slot_send_back(slot_table *t, uint64_t inode, uint32_t pid, int trunc,
                         int64_t now_ns, unsigned *fx)
{
    memos_slot *s = map_get(&t->inos, inode);
    *fx = 0;
    if (!s)
        return SLOT_ENOENT;
    int move = slot_holds_name(t, s) && (s->p.readers || s->p.pushing
                                         || (trunc && (s->d.writers || pending_live(s, now_ns))));
    /* marked first: a supersede moves the writers on their way to the
     * fresh inode, which then never holds the name with nobody coming */
    pending_prune(s, now_ns);
    if (pending_set(t, s, pid, now_ns + SLOT_RETRY_NS) < 0)
        return SLOT_ENOMEM;
    if (move && !slot_supersede(t, s, fx))
        return SLOT_ENOMEM;
    return SLOT_OK;
}

int memos_slot_wait_mark(slot_table *t, uint64_t inode, uint32_t pid, int64_t now_ns)
{
    memos_slot *s = map_get(&t->inos, inode);
    if (!s)
        return SLOT_ENOENT;
    return pending_set(t, s, pid, now_ns + SLOT_RETRY_NS) < 0 ? SLOT_ENOMEM : SLOT_OK;
}

int memos_slot_pending_pop(slot_table *t, uint64_t inode, uint32_t pid)
{
    memos_slot *s = map_get(&t->inos, inode);
    if (!s)
        return SLOT_ENOENT;
    pending_pop(s, pid);
    return SLOT_OK;
}

int memos_slot_is_pending(const slot_table *t, uint64_t inode, uint32_t pid)
{
    memos_slot *s = map_get(&t->inos, inode);
    if (!s)
        return SLOT_ENOENT;
    return pending_has(s, pid);
}

int memos_slot_is_writer(const slot_table *t, uint64_t ino, uint32_t tgid)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    return slot_has_tgid(s, tgid);
}

uint64_t memos_slot_private_of_tgid(const slot_table *t, uint64_t ino, uint32_t tgid)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return 0;
    for (memos_slot *p = s->privates; p; p = p->next_private)
        if (p->private_tgid == tgid && p->d.writers)
            return p->ino;
    return 0;
}

int memos_slot_view(slot_table *t, uint64_t ino, int64_t now_ns, uint64_t *view)
{
    memos_slot *s = map_get(&t->inos, ino);
    (void)now_ns;
    if (!s)
        return SLOT_ENOENT;
    memos_slot *v = slot_alloc(t, s->name);
    if (!v)
        return SLOT_ENOMEM;
    v->state = SLOT_VIEW;
    v->version = s->version;
    v->pub_size = s->pub_size;
    v->stored = s->stored;
    v->mtime_ns = s->mtime_ns;
    link_to(&v->successor, s);          /* it reads the name's version */
    link_to(&v->view_of, s);
    *view = v->ino;
    return SLOT_OK;
}

int memos_slot_backing_attach(slot_table *t, uint64_t ino, int32_t backing)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    if (backing <= 0 || (s->backing && s->backing != backing))
        return SLOT_EINVAL;             /* one backing file per inode (the kernel's rule) */
    s->backing = backing;
    s->backing_opens++;
    return SLOT_OK;
}

int memos_slot_backing_detach(slot_table *t, uint64_t ino, int32_t *backing, int *last)
{
    memos_slot *s = map_get(&t->inos, ino);
    *last = 0;
    *backing = 0;
    if (!s)
        return SLOT_ENOENT;
    if (!s->backing_opens)
        return SLOT_EINVAL;
    *backing = s->backing;
    if (--s->backing_opens == 0) {
        s->backing = 0;
        *last = 1;
    }
    return SLOT_OK;
}

/* ---- API: writing ---- */

int memos_slot_write_plan(const slot_table *t, uint64_t ino, uint64_t off, int append,
                          uint64_t *at, unsigned *fx)
{
    memos_slot *s = map_get(&t->inos, ino);
    *fx = 0;
    if (!s)
        return SLOT_ENOENT;
    if (!s->d.writers)
        return SLOT_EINVAL;
    if (!s->d.kind)
        *fx |= SLOT_FX_MAKE_DRAFT;
    uint64_t end = draft_size(s);
    *at = off;
    if (append && off != end) {
        /* placed by a size another process's stat gave the kernel: the
         * record goes to the end all the same, the kernel's pages drop */
        *at = end;
        *fx |= SLOT_FX_DROP_PAGES;
    }
    return SLOT_OK;
}

int memos_slot_wrote(slot_table *t, uint64_t ino, uint64_t at, uint64_t n, int64_t now_ns)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    if (!s->d.writers)
        return SLOT_EINVAL;
    uint64_t size = draft_size(s);
    if (!s->d.kind)
        s->d.kind = SLOT_DRAFT_ARENA;
    s->d.has_base = 0;
    s->d.size = at + n > size ? at + n : size;
    s->d.changed = 1;
    s->d.trunc_only = 0;
    s->d.mtime_ns = now_ns;
    refusals_written(s, at, at + n);    /* what was refused there is written now */
    return SLOT_OK;
}

int memos_slot_truncated(slot_table *t, uint64_t ino, uint64_t size, int64_t now_ns)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    if (!s->d.writers)
        return SLOT_EINVAL;
    if (!s->d.kind)
        s->d.kind = SLOT_DRAFT_ARENA;
    s->d.has_base = 0;
    s->d.size = size;
    s->d.changed = 1;
    s->d.trunc_only = 0;
    s->d.mtime_ns = now_ns;
    refusals_cut(s, size);              /* what was refused beyond size is not wanted */
    return SLOT_OK;
}

int memos_slot_refused(slot_table *t, uint64_t ino, uint64_t start, uint64_t end, int code)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    if (!s->d.writers)
        return SLOT_EINVAL;
    refusals_note(s, start, end, code);
    s->d.trunc_only = 0;
    s->p.trusted = 0;                   /* the kernel's pages may hold what was refused */
    return SLOT_OK;
}

int memos_slot_refusal_told(slot_table *t, uint64_t ino)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    if (s->d.nrefused)
        s->d.refused_told = 1;
    return SLOT_OK;
}

int memos_slot_draft_made(slot_table *t, uint64_t ino, enum memos_draft_kind kind,
                          uint64_t size)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    if (!s->d.writers || kind <= SLOT_DRAFT_NONE || kind >= SLOT_DRAFT_NKINDS)
        return SLOT_EINVAL;
    s->d.kind = kind;
    s->d.has_base = 0;
    s->d.size = size;
    return SLOT_OK;
}

int memos_slot_changed(slot_table *t, uint64_t ino, uint64_t size, int64_t mtime_ns)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    if (!s->d.writers)
        return SLOT_EINVAL;
    if (!s->d.kind)
        s->d.kind = SLOT_DRAFT_ARENA;
    s->d.has_base = 0;
    s->d.size = size;
    s->d.changed = 1;
    s->d.trunc_only = 0;
    s->d.mtime_ns = mtime_ns;
    return SLOT_OK;
}

int memos_slot_draft_mtime(slot_table *t, uint64_t ino, int64_t mtime_ns)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    s->d.mtime_ns = mtime_ns;
    return SLOT_OK;
}

/* ---- API: publishing ---- */

int memos_slot_publish_plan(const slot_table *t, uint64_t ino, uint32_t opener_tgid,
                            uint32_t closer_tgid, uint64_t *target)
{
    memos_slot *src = map_get(&t->inos, ino);
    if (!src)
        return SLOT_ENOENT;
    *target = 0;
    if (!src->d.writers || !src->d.changed)
        return SLOT_PUBLISH_NOTHING;
    if (closer_tgid && closer_tgid != opener_tgid)
        return SLOT_PUBLISH_NOTHING;         /* a child closing an inherited copy */
    memos_slot *node = slot_latest(src);
    if (node->state == SLOT_GONE && node->gone != SLOT_GONE_EVICTED)
        return SLOT_PUBLISH_NOTHING;         /* written to a name that is gone (POSIX) */
    if (src->d.nrefused)
        return SLOT_PUBLISH_REFUSED;         /* never a version with a refused write */
    memos_slot *cur = map_get(&t->names, node->name);
    *target = (node->state == SLOT_GONE && cur ? cur : node)->ino;
    return SLOT_PUBLISH_DO;
}

int memos_slot_published(slot_table *t, uint64_t ino, uint64_t version, uint64_t size,
                         uint64_t stored, int64_t now_ns, uint64_t *holder, unsigned *fx)
{
    memos_slot *src = map_get(&t->inos, ino);
    *fx = 0;
    if (!src)
        return SLOT_ENOENT;
    if (!src->d.writers || !src->d.changed || src->d.nrefused)
        return SLOT_EINVAL;
    memos_slot *node = slot_latest(src);
    if (node->state == SLOT_GONE && node->gone != SLOT_GONE_EVICTED)
        return SLOT_EINVAL;
    memos_slot *target = node;
    if (node->state == SLOT_GONE) {    /* dropped by the cache meanwhile */
        memos_slot *cur = map_get(&t->names, node->name);
        if (!cur) {
            if (map_put(&t->names, node->name, node) < 0)
                return SLOT_ENOMEM;
            node->gone = SLOT_GONE_NOT;
            node->state = SLOT_PUBLISHED;
            slot_settle(node);
            *fx |= SLOT_FX_FORGET_ENTRY;
        } else {
            target = cur;
        }
    }
    int64_t mtime = src->d.mtime_ns ? src->d.mtime_ns : now_ns;
    memos_slot *h = NULL;
    /* with the writeback cache the kernel keeps the size of an inode it
     * knows: a version written elsewhere (an older inode's writers, a draft
     * of its own) goes to a fresh inode */
    int fresh = t->wb && target != src && (target->lookups > 0 || target->handles > 0);
    int rc = do_published(t, target, version, size, stored, mtime, now_ns, fresh, &h, fx);
    if (rc != SLOT_OK)
        return rc;
    /* the writers go on from what is published now: a (lazily copied) base,
     * or the writers' file the kernel writes, which stays theirs */
    if (src->d.kind != SLOT_DRAFT_FILE) {
        src->d.kind = SLOT_DRAFT_NONE;
        src->d.has_base = 1;
    }
    src->d.size = size;
    src->d.changed = 0;
    refusals_clear(src);
    if (target == src && src->version == version)
        src->p.pages_version = version; /* its writers' pages hold this version */
    else
        target->p.trusted = 0;          /* another inode's bytes under this one */
    *holder = h->ino;
    return SLOT_OK;
}

int memos_slot_set_version(slot_table *t, uint64_t ino, uint64_t version, uint64_t size,
                           uint64_t stored, int64_t now_ns, uint64_t *holder, unsigned *fx)
{
    memos_slot *s = map_get(&t->inos, ino);
    *fx = 0;
    if (!s)
        return SLOT_ENOENT;
    s = slot_latest(s);
    if (!slot_holds_name(t, s))
        return SLOT_ENOENT;
    memos_slot *h = NULL;
    int rc = do_published(t, s, version, size, stored, now_ns, now_ns, 0, &h, fx);
    if (rc == SLOT_OK)
        *holder = h->ino;
    return rc;
}

int memos_slot_discarded(slot_table *t, uint64_t ino)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    s->d.changed = 0;
    s->d.trunc_only = 0;
    return SLOT_OK;
}

/* ---- API: closing ---- */

int memos_slot_reader_gone(slot_table *t, uint64_t ino, int dio)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    if (s->handles <= 0 || (!dio && !s->p.readers))
        return SLOT_EINVAL;
    s->handles--;
    if (!dio)
        s->p.readers--;
    slot_maybe_forget(t, s);
    return SLOT_OK;
}

int memos_slot_writer_gone(slot_table *t, uint64_t ino, uint32_t tgid, int64_t now_ns,
                           unsigned *fx)
{
    memos_slot *s = map_get(&t->inos, ino);
    *fx = 0;
    if (!s)
        return SLOT_ENOENT;
    if (slot_del_tgid(s, tgid) < 0)
        return SLOT_EINVAL;
    s->d.writers--;
    s->handles--;
    if (s->d.writers) {
        slot_settle(s);
        return SLOT_OK;
    }
    if (s->private_of) {                /* a private draft's last writer: its view goes */
        memos_slot **pp = &s->private_of->privates;
        while (*pp) {
            if (*pp == s)
                *pp = s->next_private;
            else
                pp = &(*pp)->next_private;
        }
        s->next_private = NULL;
    }
    if (t->wb && s->d.nrefused && s->version && slot_holds_name(t, s)) {
        /* writes were refused and nothing was published: the kernel keeps
         * this inode's size as the writers left it, not the version's; the
         * name goes to a fresh inode that holds the version (and its size) */
        if (!slot_supersede(t, s, fx))
            return SLOT_ENOMEM;
    }
    int clean = !s->d.changed;
    if (s->d.kind || s->d.has_base)
        *fx |= SLOT_FX_FREE_DRAFT;
    s->d.kind = SLOT_DRAFT_NONE;
    s->d.has_base = 0;
    s->d.size = 0;
    s->d.changed = s->d.trunc_only = 0;
    refusals_clear(s);
    /* the writers' pages are the published version's when every write since
     * the first writer's open went through them into the draft they
     * published here last, and nothing else changed the version since */
    if (clean && s->version && s->p.trusted && s->p.pages_version == s->version
        && !s->successor && s->state != SLOT_GONE)
        s->p.cache_version = (int64_t)s->version;
    else if (!(clean && s->version && s->p.cache_version == (int64_t)s->version))
        s->p.cache_version = -2;
    *fx |= SLOT_FX_FORGET_ATTRS;
    if (s->state == SLOT_CREATED) {     /* a create that published nothing: the name goes */
        slot_go(t, s, SLOT_GONE_UNPUBLISHED);
        *fx |= SLOT_FX_FORGET_ENTRY;
    } else {
        slot_settle(s);
    }
    memos_slot *l = slot_latest(s);     /* a push of the version may follow */
    pending_prune(l, now_ns);
    if (l->state != SLOT_GONE && l->version && !l->d.writers && !l->p.npending
        && !l->p.readers && !l->p.pushing && l->p.cache_version != (int64_t)l->version)
        *fx |= SLOT_FX_PUSH;
    slot_maybe_forget(t, s);
    return SLOT_OK;
}

/* ---- API: the namespace ---- */

int memos_slot_unlink(slot_table *t, uint64_t name, unsigned *fx)
{
    memos_slot *s = map_get(&t->names, name);
    *fx = 0;
    if (!s)
        return SLOT_ENOENT;
    slot_go(t, s, SLOT_GONE_UNLINK);
    *fx = SLOT_FX_REMOVE_KEY | SLOT_FX_FORGET_ENTRY;
    slot_maybe_forget(t, s);
    return SLOT_OK;
}

int memos_slot_remove(slot_table *t, uint64_t name, enum memos_slot_gone why, unsigned *fx)
{
    memos_slot *s = map_get(&t->names, name);
    *fx = 0;
    if (!s)
        return SLOT_ENOENT;
    if (why != SLOT_GONE_UNLINK && why != SLOT_GONE_RMDIR)
        return SLOT_EINVAL;
    slot_go(t, s, why);
    *fx = SLOT_FX_REMOVE_KEY | SLOT_FX_FORGET_ENTRY;
    slot_maybe_forget(t, s);
    return SLOT_OK;
}

int memos_slot_rename(slot_table *t, uint64_t from, uint64_t to, unsigned *fx)
{
    memos_slot *s = map_get(&t->names, from);
    *fx = 0;
    if (!s)
        return SLOT_ENOENT;
    if (from == to)
        return SLOT_OK;
    memos_slot *target = map_get(&t->names, to);
    if (map_reserve(&t->names, 1) < 0 || (target && s->version && pending_merge(t, s, target) < 0))
        return SLOT_ENOMEM;             /* (extra writers on their way change nothing) */
    if (target) {
        if (s->version) {
            /* no process finds the new path missing: an open of the
             * replaced inode is served this slot; writers sent back to the
             * name will find this one */
            link_to(&target->replaced_by, s);
        } else {
            *fx |= SLOT_FX_REMOVE_KEY;  /* (a published slot replaces the key itself) */
        }
        slot_go(t, target, SLOT_GONE_REPLACED);
    }
    map_del(&t->names, from);
    s->name = to;
    map_put(&t->names, to, s);          /* (reserved) */
    *fx |= SLOT_FX_FORGET_ENTRY;
    if (target)
        slot_maybe_forget(t, target);
    return SLOT_OK;
}

int memos_slot_drop(slot_table *t, uint64_t name, unsigned *fx)
{
    memos_slot *s = map_get(&t->names, name);
    *fx = 0;
    if (!s)
        return SLOT_ENOENT;
    slot_go(t, s, SLOT_GONE_EVICTED);
    *fx = SLOT_FX_FORGET_ENTRY;
    slot_maybe_forget(t, s);
    return SLOT_OK;
}

/* ---- API: the page-cache pusher ---- */

int memos_slot_push_claim(slot_table *t, uint64_t ino, uint64_t version)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    int stale = s->p.cache_version != -1 && s->p.cache_version != (int64_t)version;
    if (!stale)
        s->p.cache_version = (int64_t)version;
    s->p.pushing++;
    return stale;
}

int memos_slot_own_cache(slot_table *t, uint64_t ino, uint64_t version)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    s->p.cache_version = (int64_t)version;
    return SLOT_OK;
}

int memos_slot_push_done(slot_table *t, uint64_t ino)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    if (s->p.pushing <= 0)
        return SLOT_EINVAL;
    s->p.pushing--;
    slot_maybe_forget(t, s);
    return SLOT_OK;
}

int memos_slot_pages_dropped(slot_table *t, uint64_t ino)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    s->p.trusted = 0;
    return SLOT_OK;
}

int memos_slot_pages_stale(slot_table *t, uint64_t ino)
{
    memos_slot *s = map_get(&t->inos, ino);
    if (!s)
        return SLOT_ENOENT;
    s->p.trusted = 0;
    if (s->p.cache_version >= 0 && !s->p.pushing)
        s->p.cache_version = -2;
    return SLOT_OK;
}

/* ---- API: reading it ---- */

int memos_slot_stat(const slot_table *t, uint64_t ino, uint32_t tgid, int64_t now_ns,
                    memos_slot_info *out)
{
    memos_slot *s = map_get(&t->inos, ino);
    memset(out, 0, sizeof *out);
    if (!s)
        return SLOT_ENOENT;
    out->state = s->state;
    out->gone = s->gone;
    out->version = s->version;
    out->pub_size = s->pub_size;
    out->draft_size = draft_size(s);
    out->size = s->pub_size;
    out->stored = s->stored;
    out->writers = s->d.writers;
    out->readers = s->p.readers;
    out->changed = s->d.changed;
    out->write_failed = s->d.nrefused > 0;
    out->kind = s->d.kind;
    out->has_base = s->d.has_base;
    out->trunc_only = s->d.trunc_only;
    out->refused_code = s->d.nrefused ? s->d.refused_code : 0;
    out->refused_told = s->d.refused_told;
    out->pending = pending_live(s, now_ns);
    out->pushing = s->p.pushing;
    out->trusted = s->p.trusted;
    out->pages_version = s->p.pages_version;
    out->privates = s->privates != NULL;
    out->private_of = s->private_of ? s->private_of->ino : 0;
    out->view_of = s->view_of ? s->view_of->ino : 0;
    out->replaced_by = s->replaced_by ? s->replaced_by->ino : 0;
    out->name = s->name;
    out->pubs = s->pubs;
    out->lookups = s->lookups;
    out->handles = s->handles;
    out->backing = s->backing;
    out->backing_opens = s->backing_opens;
    out->cache_version = s->p.cache_version;
    out->successor = s->successor ? s->successor->ino : 0;
    out->found = s->version || slot_has_tgid(s, tgid);
    if ((s->d.writers || s->d.kind) && slot_has_tgid(s, tgid)) {
        out->size = draft_size(s);
        out->writer_view = 1;
        if (s->d.changed)
            out->mtime_ns = s->d.mtime_ns;
    }
    for (memos_slot *p = s->privates; p; p = p->next_private) {
        if (p->private_tgid == tgid && p->d.writers) {
            out->size = draft_size(p);  /* a retried writer's own draft */
            out->writer_view = 1;
            out->mtime_ns = p->d.changed ? p->d.mtime_ns : 0;
            break;
        }
    }
    return SLOT_OK;
}

int64_t memos_slot_field(const slot_table *t, uint64_t ino, enum memos_slot_field f,
                         int64_t now_ns, int *found)
{
    memos_slot *s = map_get(&t->inos, ino);
    *found = s != NULL;
    if (!s)
        return 0;
    switch (f) {
    case SLOT_F_STATE:          return s->state;
    case SLOT_F_GONE:           return s->gone;
    case SLOT_F_VERSION:        return (int64_t)s->version;
    case SLOT_F_PUB_SIZE:       return (int64_t)s->pub_size;
    case SLOT_F_STORED:         return (int64_t)s->stored;
    case SLOT_F_READERS:        return s->p.readers;
    case SLOT_F_WRITERS:        return s->d.writers;
    case SLOT_F_PUSHING:        return s->p.pushing;
    case SLOT_F_CHANGED:        return s->d.changed;
    case SLOT_F_KIND:           return s->d.kind;
    case SLOT_F_HAS_BASE:       return s->d.has_base;
    case SLOT_F_TRUNC_ONLY:     return s->d.trunc_only;
    case SLOT_F_REFUSED:        return s->d.nrefused;
    case SLOT_F_REFUSED_CODE:   return s->d.nrefused ? s->d.refused_code : 0;
    case SLOT_F_REFUSED_TOLD:   return s->d.refused_told;
    case SLOT_F_CACHE_VERSION:  return s->p.cache_version;
    case SLOT_F_TRUSTED:        return s->p.trusted;
    case SLOT_F_PAGES_VERSION:  return (int64_t)s->p.pages_version;
    case SLOT_F_SUCCESSOR:      return s->successor ? (int64_t)s->successor->ino : 0;
    case SLOT_F_REPLACED_BY:    return s->replaced_by ? (int64_t)s->replaced_by->ino : 0;
    case SLOT_F_PRIVATE_OF:     return s->private_of ? (int64_t)s->private_of->ino : 0;
    case SLOT_F_VIEW_OF:        return s->view_of ? (int64_t)s->view_of->ino : 0;
    case SLOT_F_PRIVATES:       return s->privates != NULL;
    case SLOT_F_LOOKUPS:        return s->lookups;
    case SLOT_F_HANDLES:        return s->handles;
    case SLOT_F_PUBS:           return (int64_t)s->pubs;
    case SLOT_F_BACKING:        return s->backing;
    case SLOT_F_BACKING_OPENS:  return s->backing_opens;
    case SLOT_F_DRAFT_SIZE:     return (int64_t)draft_size(s);
    case SLOT_F_DRAFT_MTIME:    return s->d.mtime_ns;
    case SLOT_F_NAME:           return (int64_t)s->name;
    case SLOT_F_PENDING:        return pending_live(s, now_ns);
    case SLOT_F_LATEST:         return (int64_t)slot_latest(s)->ino;
    case SLOT_F_HOLDS_NAME:     return slot_holds_name(t, s);
    case SLOT_F_NAME_HOLDER: {
        memos_slot *h = slot_name_holder(t, s);
        return h ? (int64_t)h->ino : 0;
    }
    default:                    *found = 0; return 0;
    }
}

uint64_t memos_slot_holder(const slot_table *t, uint64_t name)
{
    memos_slot *s = map_get(&t->names, name);
    return s ? s->ino : 0;
}

const char *memos_slot_state_name(enum memos_slot_state st)
{
    static const char *names[] = { "CREATED", "PUBLISHED", "WRITING", "SUPERSEDED",
                                   "PRIVATE", "GONE", "VIEW" };
    return st < SLOT_NSTATES ? names[st] : "?";
}

const char *memos_slot_gone_name(enum memos_slot_gone g)
{
    static const char *names[] = { "", "unpublished", "unlink", "replaced", "evicted",
                                   "rmdir" };
    return g <= SLOT_GONE_RMDIR ? names[g] : "?";
}

const char *memos_slot_kind_name(enum memos_draft_kind k)
{
    static const char *names[] = { "none", "arena", "spill", "overlay", "file" };
    return k < SLOT_DRAFT_NKINDS ? names[k] : "?";
}

/* ---- private helpers: the map ---- */

static size_t map_slot(const slot_map *m, uint64_t k)
{
    uint64_t h = k * 0x9e3779b97f4a7c15ull;
    return (size_t)(h ^ (h >> 31)) & (m->cap - 1);
}

static memos_slot *map_get(const slot_map *m, uint64_t k)
{
    if (!m->cap || !k)
        return NULL;
    for (size_t i = map_slot(m, k);; i = (i + 1) & (m->cap - 1)) {
        if (!m->keys[i])
            return NULL;
        if (m->keys[i] == k)
            return m->vals[i];
    }
}

static int map_grow(slot_map *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    slot_map n = { slot_realloc(m->t, NULL, cap * sizeof *n.keys),
                   slot_realloc(m->t, NULL, cap * sizeof *n.vals), cap, 0, m->t };
    if (n.keys)
        memset(n.keys, 0, cap * sizeof *n.keys);
    if (!n.keys || !n.vals) {
        free(n.keys);
        free(n.vals);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i])
            map_put(&n, m->keys[i], m->vals[i]);
    free(m->keys);
    free(m->vals);
    *m = n;
    return 0;
}

/* room for `more` new keys without an allocation: 0, or -1 */
static int map_reserve(slot_map *m, size_t more)
{
    while ((m->n + more) * 2 > m->cap)
        if (map_grow(m) < 0)
            return -1;
    return 0;
}

static int map_put(slot_map *m, uint64_t k, memos_slot *v)
{
    if (!map_get(m, k) && map_reserve(m, 1) < 0)
        return -1;
    size_t i = map_slot(m, k);
    while (m->keys[i] && m->keys[i] != k)
        i = (i + 1) & (m->cap - 1);
    if (!m->keys[i])
        m->n++;
    m->keys[i] = k;
    m->vals[i] = v;
    return 0;
}

static void map_del(slot_map *m, uint64_t k)
{
    if (!m->cap || !k)
        return;
    size_t i = map_slot(m, k);
    while (m->keys[i] != k) {
        if (!m->keys[i])
            return;
        i = (i + 1) & (m->cap - 1);
    }
    m->keys[i] = 0;
    m->n--;
    /* backward shift: later members of the run move into the hole */
    for (size_t j = (i + 1) & (m->cap - 1); m->keys[j]; j = (j + 1) & (m->cap - 1)) {
        size_t home = map_slot(m, m->keys[j]);
        if (((j - home) & (m->cap - 1)) >= ((j - i) & (m->cap - 1))) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            m->keys[j] = 0;
            i = j;
        }
    }
}

/* ---- private helpers: slots ---- */

/* realloc(p, n) through the table's allocation countdown */
static void *slot_realloc(slot_table *t, void *p, size_t n)
{
    if (t->fail_after && --t->fail_after == 0)
        return NULL;                    /* injected (memos_slot_fail_after) */
    return realloc(p, n);
}

/* A new inode, in the inode map; room for its first writers is made here,
 * so that attaching them to a fresh inode cannot fail. */
static memos_slot *slot_alloc(slot_table *t, uint64_t name)
{
    memos_slot *s = slot_realloc(t, NULL, sizeof *s);
    if (!s)
        return NULL;
    memset(s, 0, sizeof *s);
    s->d.tgids = slot_realloc(t, NULL, 4 * sizeof *s->d.tgids);
    if (!s->d.tgids) {
        free(s);
        return NULL;
    }
    s->d.cap_tgids = 4;
    s->ino = t->next_ino++;
    s->name = name;
    s->p.cache_version = -1;
    if (map_put(&t->inos, s->ino, s) < 0) {
        slot_release(t, s);
        return NULL;
    }
    return s;
}

/* free s's memory (already out of both maps) */
static void slot_release(slot_table *t, memos_slot *s)
{
    free(s->p.pending);
    free(s->d.tgids);
    free(s);
}

static void link_to(memos_slot **field, memos_slot *to)
{
    *field = to;
    to->links++;
}

static void unlink_from(slot_table *t, memos_slot **field)
{
    memos_slot *to = *field;
    *field = NULL;
    if (to) {
        to->links--;
        slot_maybe_forget(t, to);
    }
}

/* An inode that left the tree goes once nothing keeps it: no lookup, no
 * handle, no push, no other inode's link. */
static void slot_maybe_forget(slot_table *t, memos_slot *s)
{
    if (s->state != SLOT_GONE && s->state != SLOT_SUPERSEDED && s->state != SLOT_PRIVATE
        && s->state != SLOT_VIEW)
        return;
    if (s->lookups > 0 || s->handles > 0 || s->p.pushing > 0 || s->links || s->privates)
        return;
    map_del(&t->inos, s->ino);
    if (t->nfreed == t->cap_freed) {
        size_t cap = t->cap_freed ? t->cap_freed * 2 : 64;
        uint64_t *a = realloc(t->freed, cap * sizeof *a);  /* (never injected: the
                                                               caller's view of it) */
        if (a) {
            t->freed = a;
            t->cap_freed = cap;
        }
    }
    if (t->nfreed < t->cap_freed)
        t->freed[t->nfreed++] = s->ino;
    unlink_from(t, &s->successor);
    unlink_from(t, &s->replaced_by);
    unlink_from(t, &s->private_of);
    unlink_from(t, &s->view_of);
    slot_release(t, s);
}

/* The state of an inode that holds its name, from its version and writers. */
static void slot_settle(memos_slot *s)
{
    if (s->state != SLOT_CREATED && s->state != SLOT_PUBLISHED && s->state != SLOT_WRITING)
        return;
    s->state = !s->version ? SLOT_CREATED : s->d.writers ? SLOT_WRITING : SLOT_PUBLISHED;
}

static int slot_holds_name(const slot_table *t, const memos_slot *s)
{
    return map_get(&t->names, s->name) == s;
}

static memos_slot *slot_latest(memos_slot *s)
{
    while (s->successor)
        s = s->successor;
    return s;
}

/* For an inode that a rename replaced: the slot that holds its name now
 * (following later supersedes and renames over), or NULL when the name is
 * gone or has moved elsewhere since. */
static memos_slot *slot_name_holder(const slot_table *t, memos_slot *s)
{
    memos_slot *node = slot_latest(s);
    uint64_t name = node->name;
    for (int seen = 0; node->state == SLOT_GONE && node->gone == SLOT_GONE_REPLACED
         && node->replaced_by && seen < 64; seen++)
        node = slot_latest(node->replaced_by);
    if (node->state == SLOT_GONE || node->name != name || !slot_holds_name(t, node))
        return NULL;
    return node;
}

/* Give s's name a fresh inode holding the same version; s keeps serving
 * its handles.  s holds its name.  NULL: no memory (nothing changed). */
static memos_slot *slot_supersede(slot_table *t, memos_slot *s, unsigned *fx)
{
    memos_slot *n = slot_alloc(t, s->name);
    if (!n)
        return NULL;
    n->version = s->version;
    n->pub_size = s->pub_size;
    n->stored = s->stored;
    n->mtime_ns = s->mtime_ns;
    /* writers sent back to this name will find the new inode */
    n->p.pending = s->p.pending;
    n->p.npending = s->p.npending;
    n->p.cap_pending = s->p.cap_pending;
    s->p.pending = NULL;
    s->p.npending = s->p.cap_pending = 0;
    map_put(&t->names, s->name, n);     /* (replaces: no growth) */
    n->state = SLOT_CREATED;
    slot_settle(n);
    link_to(&s->successor, n);
    s->state = SLOT_SUPERSEDED;
    *fx |= SLOT_FX_FORGET_ENTRY;
    return n;
}

static void slot_go(slot_table *t, memos_slot *s, enum memos_slot_gone why)
{
    if (slot_holds_name(t, s))
        map_del(&t->names, s->name);
    s->state = SLOT_GONE;
    s->gone = why;
}

static int do_published(slot_table *t, memos_slot *node, uint64_t version, uint64_t size,
                        uint64_t stored, int64_t mtime_ns, int64_t now_ns, int fresh,
                        memos_slot **holder, unsigned *fx)
{
    if (node->p.readers || node->p.pushing || fresh) {
        node = slot_supersede(t, node, fx);     /* readers keep their snapshot */
        if (!node)
            return SLOT_ENOMEM;
    }
    if (node->d.writers)
        node->p.cache_version = -2;
    node->version = version;
    node->pub_size = size;
    node->stored = stored;
    node->mtime_ns = mtime_ns;
    node->pubs++;                       /* (a mirror of the version before is stale) */
    slot_settle(node);
    *fx |= SLOT_FX_FORGET_ATTRS;
    pending_prune(node, now_ns);
    if (!node->d.writers && !node->p.npending)
        *fx |= SLOT_FX_PUSH;            /* (with writers open the pages are theirs) */
    *holder = node;
    return SLOT_OK;
}

static uint64_t draft_size(const memos_slot *s)
{
    return s->d.kind || s->d.has_base ? s->d.size : s->pub_size;
}

static int slot_has_tgid(const memos_slot *s, uint32_t tgid)
{
    for (uint32_t i = 0; i < s->d.ntgids; i++)
        if (s->d.tgids[i].tgid == tgid)
            return 1;
    return 0;
}

static int slot_add_tgid(slot_table *t, memos_slot *s, uint32_t tgid)
{
    for (uint32_t i = 0; i < s->d.ntgids; i++)
        if (s->d.tgids[i].tgid == tgid) {
            s->d.tgids[i].n++;
            return 0;
        }
    if (s->d.ntgids == s->d.cap_tgids) {
        uint32_t cap = s->d.cap_tgids ? s->d.cap_tgids * 2 : 4;
        slot_tgid *a = slot_realloc(t, s->d.tgids, cap * sizeof *a);
        if (!a)
            return -1;
        s->d.tgids = a;
        s->d.cap_tgids = cap;
    }
    s->d.tgids[s->d.ntgids++] = (slot_tgid){ tgid, 1 };
    return 0;
}

static int slot_del_tgid(memos_slot *s, uint32_t tgid)
{
    for (uint32_t i = 0; i < s->d.ntgids; i++)
        if (s->d.tgids[i].tgid == tgid) {
            if (--s->d.tgids[i].n == 0)
                s->d.tgids[i] = s->d.tgids[--s->d.ntgids];
            return 0;
        }
    return -1;
}

static int pending_has(const memos_slot *s, uint32_t pid)
{
    for (uint32_t i = 0; i < s->p.npending; i++)
        if (s->p.pending[i].pid == pid)
            return 1;
    return 0;
}

static int pending_live(const memos_slot *s, int64_t now_ns)
{
    for (uint32_t i = 0; i < s->p.npending; i++)
        if (s->p.pending[i].until_ns > now_ns)
            return 1;
    return 0;
}

static void pending_prune(memos_slot *s, int64_t now_ns)
{
    for (uint32_t i = 0; i < s->p.npending;)
        if (s->p.pending[i].until_ns <= now_ns)
            s->p.pending[i] = s->p.pending[--s->p.npending];
        else
            i++;
}

static int pending_set(slot_table *t, memos_slot *s, uint32_t pid, int64_t until_ns)
{
    for (uint32_t i = 0; i < s->p.npending; i++)
        if (s->p.pending[i].pid == pid) {
            s->p.pending[i].until_ns = until_ns;
            return 0;
        }
    if (s->p.npending == s->p.cap_pending) {
        uint32_t cap = s->p.cap_pending ? s->p.cap_pending * 2 : 4;
        slot_pending *a = slot_realloc(t, s->p.pending, cap * sizeof *a);
        if (!a)
            return -1;
        s->p.pending = a;
        s->p.cap_pending = cap;
    }
    s->p.pending[s->p.npending++] = (slot_pending){ pid, until_ns };
    return 0;
}

static void pending_pop(memos_slot *s, uint32_t pid)
{
    for (uint32_t i = 0; i < s->p.npending; i++)
        if (s->p.pending[i].pid == pid) {
            s->p.pending[i] = s->p.pending[--s->p.npending];
            return;
        }
}

static int pending_merge(slot_table *t, memos_slot *to, const memos_slot *from)
{
    for (uint32_t i = 0; i < from->p.npending; i++)
        if (pending_set(t, to, from->p.pending[i].pid, from->p.pending[i].until_ns) < 0)
            return -1;
    return 0;
}

/* ---- private helpers: refused ranges ---- */

static void refusals_clear(memos_slot *s)
{
    s->d.nrefused = 0;
    s->d.refused_code = 0;
    s->d.refused_told = 0;
}

/* [start, end) was refused with errno code: merged into the sorted,
 * disjoint ranges; beyond SLOT_REFUSALS_MAX they become one span. */
static void refusals_note(memos_slot *s, uint64_t start, uint64_t end, int code)
{
    if (end <= start)
        end = start + 1;                /* (a refused truncate to `start`: one byte) */
    if (!s->d.nrefused) {
        s->d.refused_code = code;
        s->d.refused_told = 0;
    }
    slot_span out[SLOT_REFUSALS_MAX + 1];
    uint32_t n = 0, placed = 0;
    for (uint32_t i = 0; i < s->d.nrefused; i++) {
        slot_span r = s->d.refused[i];
        if (r.end < start || r.start > end) {
            if (!placed && r.start > end) {
                out[n++] = (slot_span){ start, end };
                placed = 1;
            }
            out[n++] = r;
        } else {                        /* overlaps or touches: merged */
            if (r.start < start)
                start = r.start;
            if (r.end > end)
                end = r.end;
        }
    }
    if (!placed)
        out[n++] = (slot_span){ start, end };
    if (n > SLOT_REFUSALS_MAX) {        /* stricter, never looser */
        uint64_t hi = out[0].end;
        for (uint32_t i = 1; i < n; i++)
            if (out[i].end > hi)
                hi = out[i].end;
        out[0].end = hi;
        n = 1;
    }
    memcpy(s->d.refused, out, n * sizeof *out);
    s->d.nrefused = n;
}

/* [start, end) was written: what of the refused ranges it covers is there. */
static void refusals_written(memos_slot *s, uint64_t start, uint64_t end)
{
    if (!s->d.nrefused || end <= start)
        return;
    slot_span out[SLOT_REFUSALS_MAX + 1];
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->d.nrefused; i++) {
        slot_span r = s->d.refused[i];
        if (r.end <= start || r.start >= end) {
            out[n++] = r;
            continue;
        }
        if (r.start < start)
            out[n++] = (slot_span){ r.start, start };
        if (r.end > end)
            out[n++] = (slot_span){ end, r.end };
    }
    if (n > SLOT_REFUSALS_MAX) {        /* (a write inside one range splits it) */
        out[0].end = out[n - 1].end;
        n = 1;
    }
    memcpy(s->d.refused, out, n * sizeof *out);
    s->d.nrefused = n;
    if (!n)
        s->d.refused_code = 0;
}

/* The draft was cut (or grown) to size: ranges beyond it are not the draft's. */
static void refusals_cut(memos_slot *s, uint64_t size)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->d.nrefused; i++) {
        slot_span r = s->d.refused[i];
        if (r.start >= size)
            continue;
        if (r.end > size)
            r.end = size;
        s->d.refused[n++] = r;
    }
    s->d.nrefused = n;
    if (!n)
        s->d.refused_code = 0;
}

/* ---- debugging: the invariants ---- */

#define BROKEN(...) do { snprintf(why, whylen, "inode %llu (%s): ", \
                                  (unsigned long long)s->ino, memos_slot_state_name(s->state)); \
                         size_t _l = strlen(why); \
                         snprintf(why + _l, whylen > _l ? whylen - _l : 0, __VA_ARGS__); \
                         return SLOT_EINVAL; } while (0)

static int check_one(const slot_table *t, const memos_slot *s, char *why, size_t whylen)
{
    int named = slot_holds_name(t, s);
    int holds_state = s->state == SLOT_CREATED || s->state == SLOT_PUBLISHED
        || s->state == SLOT_WRITING;
    if (named != holds_state)
        BROKEN("holds its name %d, but its state says %d", named, holds_state);
    if ((s->state == SLOT_GONE) != (s->gone != SLOT_GONE_NOT))
        BROKEN("gone '%s' in this state", memos_slot_gone_name(s->gone));
    if (s->state == SLOT_CREATED && s->version)
        BROKEN("created with version %llu", (unsigned long long)s->version);
    if (s->state == SLOT_CREATED && !s->d.writers && !s->p.npending)
        BROKEN("created with no writer and none on its way");
    if ((s->state == SLOT_PUBLISHED || s->state == SLOT_WRITING) && !s->version)
        BROKEN("holds a name with no version");
    if (s->state == SLOT_PUBLISHED && s->d.writers)
        BROKEN("%u writers", s->d.writers);
    if (s->state == SLOT_WRITING && !s->d.writers)
        BROKEN("no writer");
    if ((s->state == SLOT_SUPERSEDED || s->state == SLOT_PRIVATE || s->state == SLOT_VIEW)
        != (s->successor != NULL))
        BROKEN("successor %s", s->successor ? "set" : "missing");
    if ((s->state == SLOT_PRIVATE) != (s->private_of != NULL))
        BROKEN("private_of %s", s->private_of ? "set" : "missing");
    if (s->replaced_by && s->gone != SLOT_GONE_REPLACED)
        BROKEN("replaced_by set but not replaced");
    if (s->state == SLOT_PRIVATE && s->p.readers)
        BROKEN("page-cache readers on a private draft");
    if (s->p.readers && s->d.writers)
        BROKEN("%u page-cache readers beside %u writers", s->p.readers, s->d.writers);
    if (s->d.kind && s->d.has_base)
        BROKEN("a draft and a base both held");
    if (!s->d.writers && (s->d.kind || s->d.has_base || s->d.changed
                          || s->d.nrefused || s->d.ntgids || s->d.trunc_only))
        BROKEN("draft state with no writer");
    if (s->d.trunc_only && (s->d.size || s->d.nrefused))
        BROKEN("as an O_TRUNC left it, but %llu bytes and %u refused ranges",
               (unsigned long long)s->d.size, s->d.nrefused);
    for (uint32_t i = 0; i < s->d.nrefused; i++)
        if (s->d.refused[i].start >= s->d.refused[i].end
            || (i && s->d.refused[i - 1].end >= s->d.refused[i].start))
            BROKEN("refused ranges not sorted and disjoint at %u", i);
    if ((s->state == SLOT_VIEW) != (s->view_of != NULL))
        BROKEN("view_of %s", s->view_of ? "set" : "missing");
    if (s->state == SLOT_VIEW && (s->d.writers || s->p.readers))
        BROKEN("a view with %u writers, %u page-cache readers", s->d.writers, s->p.readers);
    if ((s->backing != 0) != (s->backing_opens != 0))
        BROKEN("backing id %d with %u opens", s->backing, s->backing_opens);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < s->d.ntgids; i++)
        sum += s->d.tgids[i].n;
    if (sum != s->d.writers)
        BROKEN("writers %u, per process %llu", s->d.writers, (unsigned long long)sum);
    if (s->handles < (int64_t)s->p.readers + s->d.writers)
        BROKEN("%lld handles, %u readers, %u writers", (long long)s->handles,
               s->p.readers, s->d.writers);
    if (s->p.pushing < 0)
        BROKEN("pushing %d", s->p.pushing);
    if (s->p.cache_version < -2 || (s->p.cache_version > 0
                                    && (uint64_t)s->p.cache_version > s->version
                                    && s->state != SLOT_PRIVATE))
        BROKEN("cache_version %lld, version %llu", (long long)s->p.cache_version,
               (unsigned long long)s->version);
    const memos_slot *l = s;
    for (int n = 0; l->successor; n++, l = l->successor)
        if (n > 1 << 20)
            BROKEN("a loop of successors");
    if (l->state == SLOT_SUPERSEDED || l->state == SLOT_PRIVATE || l->state == SLOT_VIEW)
        BROKEN("its chain ends at inode %llu in %s", (unsigned long long)l->ino,
               memos_slot_state_name(l->state));
    if (map_get(&t->inos, l->ino) != l)
        BROKEN("its chain ends at a forgotten inode");
    for (const memos_slot *p = s->privates; p; p = p->next_private)
        if (p->private_of != s || p->state != SLOT_PRIVATE)
            BROKEN("private list holds inode %llu", (unsigned long long)p->ino);
    return SLOT_OK;
}

int memos_slot_check(const slot_table *t, uint64_t ino, char *why, size_t whylen)
{
    if (whylen)
        why[0] = 0;
    if (ino) {
        memos_slot *s = map_get(&t->inos, ino);
        if (!s) {
            snprintf(why, whylen, "inode %llu: unknown", (unsigned long long)ino);
            return SLOT_ENOENT;
        }
        return check_one(t, s, why, whylen);
    }
    for (size_t i = 0; i < t->inos.cap; i++) {
        if (!t->inos.keys[i])
            continue;
        int rc = check_one(t, t->inos.vals[i], why, whylen);
        if (rc != SLOT_OK)
            return rc;
    }
    for (size_t i = 0; i < t->names.cap; i++) {
        if (!t->names.keys[i])
            continue;
        const memos_slot *s = t->names.vals[i];
        if (map_get(&t->inos, s->ino) != s || s->name != t->names.keys[i]) {
            snprintf(why, whylen, "name %llu points at inode %llu, which is not its holder",
                     (unsigned long long)t->names.keys[i], (unsigned long long)s->ino);
            return SLOT_EINVAL;
        }
    }
    return SLOT_OK;
}
