/*
 * slot.h — the life of a slot: one state machine per inode (slot.c).
 *
 * A table of slots, each an inode with an explicit state (CREATED,
 * PUBLISHED, WRITING, SUPERSEDED, PRIVATE, GONE), its published version's
 * numbers, its writers' draft (as sizes and flags: the bytes stay in the
 * cache's drafts, memos.h) and the page-cache sub-state the kernel's caching
 * per inode needs.  Every function decides; none performs: what the caller
 * must do to the kernel or the cache comes back as an effects bitmask
 * (SLOT_FX_*).  Time is an argument (now_ns, CLOCK_REALTIME nanoseconds:
 * a draft's mtime is taken from it).
 *
 * Names are opaque uint64 ids chosen by the caller (the tree of directories
 * and strings stays with the caller); the table knows which inode holds
 * each name.  Process ids: `tgid` is a process (thread group), `pid` the
 * thread that sent a request (the kernel retries an ESTALE open from it).
 *
 * Not thread-safe: the caller serializes every call on one table (one
 * lock, the cache's, once the shim calls in).
 */
#ifndef MEMOS_SLOT_H
#define MEMOS_SLOT_H

#include <stddef.h>
#include <stdint.h>

/* ---- return codes ---- */

#define SLOT_OK        0
#define SLOT_ENOENT  (-1)   /* no such inode or name (or not found by this caller) */
#define SLOT_EEXIST  (-2)   /* O_EXCL create of a name that exists */
#define SLOT_EINVAL  (-3)   /* a call that does not fit the slot's state */
#define SLOT_ENOMEM  (-4)   /* no memory for the table */

/* ---- effects: what the caller carries out (a bitmask) ---- */

#define SLOT_FX_FORGET_ATTRS   0x001u  /* notify the kernel: this inode's attributes changed */
#define SLOT_FX_FORGET_ENTRY   0x002u  /* notify the kernel: the name's dentry changed */
#define SLOT_FX_DROP_PAGES     0x004u  /* invalidate the inode's cached pages */
#define SLOT_FX_KEEP_CACHE     0x008u  /* open: keep the pages the kernel has */
#define SLOT_FX_DIRECT_IO      0x010u  /* open: read or write around the page cache */
#define SLOT_FX_PUSH           0x020u  /* a page-cache push of the version may start */
#define SLOT_FX_FREE_DRAFT     0x040u  /* the writers' draft and base go */
#define SLOT_FX_MAKE_DRAFT     0x080u  /* copy the base into a draft before this change */
#define SLOT_FX_TRUNC_DRAFT    0x100u  /* empty the draft (or make an empty one) */
#define SLOT_FX_NEED_BASE      0x200u  /* pin the published version as the writers' base */
#define SLOT_FX_REMOVE_KEY     0x400u  /* drop the name's key from the store */

/* ---- states ---- */

enum memos_slot_state {
    SLOT_CREATED = 0,   /* holds its name, never published, writers >= 1 */
    SLOT_PUBLISHED,     /* holds its name, version >= 1, no writer */
    SLOT_WRITING,       /* holds its name, version >= 1, writers >= 1 */
    SLOT_SUPERSEDED,    /* a fresh inode took its name; serves its handles */
    SLOT_PRIVATE,       /* a retried O_TRUNC writer's own draft, never named */
    SLOT_GONE,          /* out of the tree (why: enum memos_slot_gone) */
    SLOT_VIEW,          /* a readers' view of the name's slot while a writers' file
                           backs its inode (passthrough): never named */
    SLOT_NSTATES
};

/* What holds a draft's bytes (the caller's; the table names the kind). */
enum memos_draft_kind {
    SLOT_DRAFT_NONE = 0,    /* no draft: the writers start from the base, if any */
    SLOT_DRAFT_ARENA,       /* pages of the memory tier (memos.h drafts) */
    SLOT_DRAFT_SPILL,       /* a spill file (the SSD directory's, or a memory file) */
    SLOT_DRAFT_OVERLAY,     /* a spill file over the SSD tier's version (only what changed) */
    SLOT_DRAFT_FILE,        /* a writers' file the kernel writes itself (passthrough) */
    SLOT_DRAFT_NKINDS
};

enum memos_slot_gone {
    SLOT_GONE_NOT = 0,      /* (not gone) */
    SLOT_GONE_UNPUBLISHED,  /* created, its last writer left, nothing published */
    SLOT_GONE_UNLINK,       /* unlink(2) */
    SLOT_GONE_REPLACED,     /* a rename put another slot on its name */
    SLOT_GONE_EVICTED,      /* no tier holds it (eviction, ring, reset, ...) */
    SLOT_GONE_RMDIR         /* its directory was removed while it was being created */
};

/* At most this many refused byte ranges are kept per draft; beyond, they
 * merge into one span (stricter, never looser). */
#define SLOT_REFUSALS_MAX 8

/* ---- open: a pure plan ---- */

enum memos_open_action {
    SLOT_OPEN_ENOENT = 0,    /* refuse: ENOENT */
    SLOT_OPEN_READ,          /* a reader of `version` on `inode` (fx: KEEP_CACHE | DIRECT_IO) */
    SLOT_OPEN_WRITE,         /* a writer on `inode` (fx: NEED_BASE | TRUNC_DRAFT) */
    SLOT_OPEN_PRIVATE,       /* a writer's draft of its own (memos_slot_private) */
    SLOT_OPEN_SEND_BACK,     /* refuse: ESTALE, after memos_slot_send_back(target) */
    SLOT_OPEN_WAIT           /* wait (bounded, PUSH_WAIT) and plan again with waited = 1 */
};

typedef struct memos_open_req {
    uint32_t tgid;      /* the process that opens */
    uint32_t pid;       /* the thread that sent the request */
    int      write;     /* 1: O_WRONLY or O_RDWR */
    int      trunc;     /* 1: O_TRUNC */
    int      retry;     /* 1: the kernel's retry of an open answered ESTALE */
    int      waited;    /* 1: this open waited already (plan again after SLOT_OPEN_WAIT) */
    int      locked;    /* 1: the kernel holds the inode's lock until this open is
                           answered (an O_TRUNC open under the writeback cache): it
                           may wait for pushes only, never for other openers */
} memos_open_req;

typedef struct memos_open_plan {
    enum memos_open_action action;
    uint64_t inode;     /* the inode the handle goes on (the kernel's) */
    uint64_t target;    /* SEND_BACK: the inode to make ready; READ: the version's holder */
    uint64_t version;   /* READ: the version the reader reads (0: none yet) */
    unsigned fx;        /* SLOT_FX_* for the open */
} memos_open_plan;

/* ---- publish: a pure plan ---- */

enum memos_publish_action {
    SLOT_PUBLISH_NOTHING = 0,  /* nothing changed, or not the opener, or the name is gone */
    SLOT_PUBLISH_REFUSED,      /* a write was refused since the last publish: EIO */
    SLOT_PUBLISH_DO            /* publish the draft under the name (memos_slot_published) */
};

/* ---- what a caller sees of a slot ---- */

typedef struct memos_slot_info {
    enum memos_slot_state state;
    enum memos_slot_gone  gone;
    uint64_t version;       /* published version, 0 if never */
    uint64_t size;          /* bytes this caller sees (a writer: its draft's) */
    uint64_t pub_size;      /* bytes of the published version */
    uint64_t draft_size;    /* bytes of this inode's own draft (or base; else pub_size),
                               whoever asks: what its publish would make */
    uint64_t stored;        /* bytes of the published version's pages */
    int64_t  mtime_ns;      /* the draft's mtime for a writer that changed it; else 0 */
    int      writer_view;   /* 1: size is a draft's (attr_timeout 0 once published:
                               others see another size; a never-published slot
                               reaches only its writers) */
    int      found;         /* 1: a lookup by this caller finds it (and its readdir
                               lists it: the same rule) */
    uint32_t writers;       /* write handles */
    uint32_t readers;       /* page-cache read handles */
    int      changed;       /* the draft holds unpublished changes */
    int      write_failed;  /* a write was refused since the last publish */
    int64_t  cache_version; /* -1 none known, -2 stale, else the pages' version */
    uint64_t successor;     /* SUPERSEDED, PRIVATE, VIEW: the inode that holds the name */
    enum memos_draft_kind kind; /* what holds this inode's draft */
    int      has_base;      /* the writers' base (the published version) is pinned */
    int      trunc_only;    /* the draft is as an O_TRUNC open left it: nothing
                               written, truncated or refused since */
    int      refused_code;  /* errno of the first refusal left (0: none) */
    int      refused_told;  /* that refusal's publish was refused and logged once */
    int      pending;       /* writers sent here (ESTALE) or waiting are on their way */
    int32_t  pushing;       /* page-cache pushes copying a version into its pages */
    int      trusted;       /* the writers' pages are the draft (since the first writer) */
    uint64_t pages_version; /* the version its writers published into it last */
    int      privates;      /* retried writers' drafts of their own follow this inode */
    uint64_t private_of;    /* PRIVATE: the inode the kernel opened */
    uint64_t view_of;       /* VIEW: the inode whose writers' file keeps readers off it */
    uint64_t replaced_by;   /* GONE(replaced): the slot renamed over it */
    uint64_t name;          /* the caller's id of its name */
    uint64_t pubs;          /* publishes on this inode (a mirror's generation) */
    int64_t  lookups;       /* the kernel's lookup count */
    int64_t  handles;       /* open handles of any kind */
    int32_t  backing;       /* passthrough: the backing id its open files use (0: none) */
    uint32_t backing_opens; /* passthrough handles on that backing file */
} memos_slot_info;

typedef struct slot_table slot_table;

/* ---- the table ---- */

slot_table *memos_slot_table_new(uint64_t first_ino);   /* NULL: no memory */
void memos_slot_table_free(slot_table *t);
size_t memos_slot_count(const slot_table *t);           /* inodes held */

/* Testing: the n-th allocation from now fails (once; 0 disarms).  Returns
 * the countdown left of the previous setting (0: it fired, or none). */
uint64_t memos_slot_fail_after(slot_table *t, uint64_t n);

/* An inode number for a node of the caller's that is no slot (a directory,
 * a link): one numbering for every inode of the mount. */
uint64_t memos_slot_new_ino(slot_table *t);

/* The inodes the table forgot since the last call (no lookup, handle, push
 * or link kept them), up to max into out: the caller drops what it keeps
 * beside them.  Returns how many. */
size_t memos_slot_take_freed(slot_table *t, uint64_t *out, size_t max);

/* ---- lifecycle ---- */

/* create(2) of `name` by tgid/pid (trunc: O_TRUNC; excl: O_EXCL).  A new
 * name: a CREATED inode with this writer.  An existing one: EEXIST with
 * excl; else an open for writing (a join keeps the content, O_TRUNC makes a
 * whole new version, on a fresh inode if readers or other writers keep the
 * old).  *ino: the inode opened.  SLOT_OK, SLOT_EEXIST, SLOT_EINVAL (the
 * holder is not a slot state that can be opened), SLOT_ENOMEM. */
int memos_slot_create(slot_table *t, uint64_t name, uint32_t tgid, uint32_t pid,
                      int trunc, int excl, int64_t now_ns, uint64_t *ino, unsigned *fx);

/* A published slot under `name` (restore at mount, a remote name, creat(2)
 * for reading once the caller published an empty version).  SLOT_OK,
 * SLOT_EEXIST (the name is held), SLOT_ENOMEM. */
int memos_slot_restore(slot_table *t, uint64_t name, uint64_t version, uint64_t size,
                       uint64_t stored, int64_t now_ns, uint64_t *ino);

/* The kernel learned (n > 0) or forgot (n < 0) the inode n times; an inode
 * that left the tree goes once no lookup and no handle keep it.  SLOT_OK,
 * SLOT_ENOENT. */
int memos_slot_lookups(slot_table *t, uint64_t ino, int64_t n);

/* ---- finding ---- */

/* The inode that holds `name` for tgid: SLOT_ENOENT when none, or when it
 * was created and never published and tgid is not one of its writers. */
int memos_slot_lookup(const slot_table *t, uint64_t name, uint32_t tgid, uint64_t *ino);

/* ---- opening ---- */

/* What an open of `inode` should do (pure).  SLOT_OK, SLOT_ENOENT (no such
 * inode). */
int memos_slot_open_plan(const slot_table *t, uint64_t inode, const memos_open_req *rq,
                         int64_t now_ns, memos_open_plan *out);

/* A reader handle on `inode` reading `version` (around 1: it reads around
 * the page cache, as every reader does while writers are open or on their
 * way; 2: the kernel reads a backing file, passthrough: a reader that holds
 * no pages).  *fx: KEEP_CACHE or DIRECT_IO.  SLOT_OK, SLOT_ENOENT. */
int memos_slot_attach_reader(slot_table *t, uint64_t inode, uint64_t version, int around,
                             int64_t now_ns, unsigned *fx);

/* A writer handle on `inode` for tgid/pid.  trunc: the draft starts empty;
 * else from the published version (*fx NEED_BASE when none is held yet).
 * SLOT_OK, SLOT_ENOENT, SLOT_ENOMEM. */
int memos_slot_attach_writer(slot_table *t, uint64_t inode, uint32_t tgid, uint32_t pid,
                             int trunc, int64_t now_ns, unsigned *fx);

/* A draft of its own for a retried O_TRUNC writer of `inode`: a PRIVATE
 * inode, never named, whose publishes follow `inode`'s name.  *priv: its
 * inode (the handle goes there; fstat of `inode` by tgid answers its size).
 * *fx: DIRECT_IO.  SLOT_OK, SLOT_ENOENT, SLOT_ENOMEM. */
int memos_slot_private(slot_table *t, uint64_t inode, uint32_t tgid, uint32_t pid,
                       int64_t now_ns, uint64_t *priv, unsigned *fx);

/* Before an ESTALE to a writer sent to `inode`: make what the kernel's
 * retry will find free of page-cache readers (a fresh inode for the name
 * when they, or writers a trunc writer must not share, keep it) and mark
 * the writer pending there until now_ns + SLOT_RETRY_NS.  SLOT_OK,
 * SLOT_ENOENT, SLOT_ENOMEM. */
int memos_slot_send_back(slot_table *t, uint64_t inode, uint32_t pid, int trunc,
                         int64_t now_ns, unsigned *fx);

/* A writer waiting on `inode` (SLOT_OPEN_WAIT) is pending there meanwhile. */
int memos_slot_wait_mark(slot_table *t, uint64_t inode, uint32_t pid, int64_t now_ns);

/* ---- writing (the bytes go to the caller's draft) ---- */

/* Where a write of a write handle on `ino` lands: off, or the draft's end
 * for O_APPEND (*fx DROP_PAGES when the kernel had placed it elsewhere),
 * and MAKE_DRAFT when the base must be copied into a draft first.  Pure. */
int memos_slot_write_plan(const slot_table *t, uint64_t ino, uint64_t off, int append,
                          uint64_t *at, unsigned *fx);

/* The caller wrote n bytes at `at` into the draft: its size grows to cover
 * them.  SLOT_OK, SLOT_ENOENT, SLOT_EINVAL (no writer). */
int memos_slot_wrote(slot_table *t, uint64_t ino, uint64_t at, uint64_t n, int64_t now_ns);

/* The caller truncated the draft to size (ftruncate, fallocate mode 0 with
 * size the new end; truncate to 0 forgets a refused write).  SLOT_OK,
 * SLOT_ENOENT, SLOT_EINVAL (no writer). */
int memos_slot_truncated(slot_table *t, uint64_t ino, uint64_t size, int64_t now_ns);

/* A write of the draft's bytes [start, end) (or a copy into it, or a
 * truncate that was to cut it) was refused with errno `code` (EFBIG,
 * ENOSPC, EDQUOT): the draft is as it was, and it is not published while a
 * refused range is left -- a later write covering it, or a truncate below
 * it, takes it away.  A refused fallocate or extending truncate loses no
 * byte and is not a refusal here: the caller is told, nothing else changes.
 * SLOT_OK, SLOT_ENOENT, SLOT_EINVAL (no writer). */
int memos_slot_refused(slot_table *t, uint64_t ino, uint64_t start, uint64_t end, int code);

/* The refused publish of ino's draft was logged: later ones are quieter. */
int memos_slot_refusal_told(slot_table *t, uint64_t ino);

/* The caller made the draft the writers' changes need (MAKE_DRAFT), moved
 * it (a spill), or opened a writers' file for it: `kind` holds its bytes
 * now, of `size` bytes.  SLOT_OK, SLOT_ENOENT, SLOT_EINVAL (no writer). */
int memos_slot_draft_made(slot_table *t, uint64_t ino, enum memos_draft_kind kind,
                          uint64_t size);

/* The writers' draft changed without a write request (the kernel wrote the
 * writers' file, passthrough): its size now, its mtime.  SLOT_OK,
 * SLOT_ENOENT, SLOT_EINVAL (no writer). */
int memos_slot_changed(slot_table *t, uint64_t ino, uint64_t size, int64_t mtime_ns);

/* setattr of the mtime through a writer's descriptor: the writers' draft
 * carries it to its publish.  SLOT_OK, SLOT_ENOENT. */
int memos_slot_draft_mtime(slot_table *t, uint64_t ino, int64_t mtime_ns);

/* A writer marked pending on `inode` (memos_slot_wait_mark) gave up on its
 * way (its open failed).  SLOT_OK, SLOT_ENOENT. */
int memos_slot_pending_pop(slot_table *t, uint64_t inode, uint32_t pid);

/* Whether `pid` is marked on its way to `inode` (1/0), SLOT_ENOENT. */
int memos_slot_is_pending(const slot_table *t, uint64_t inode, uint32_t pid);

/* Whether tgid has a write handle on `ino` (1/0), SLOT_ENOENT. */
int memos_slot_is_writer(const slot_table *t, uint64_t ino, uint32_t tgid);

/* The inode of tgid's own draft on `ino` (memos_slot_private), 0 if none. */
uint64_t memos_slot_private_of_tgid(const slot_table *t, uint64_t ino, uint32_t tgid);

/* A readers' view of the slot `ino` holds its name for (passthrough: its
 * inode is backed by a writers' file whose bytes are not published, or a
 * mirror of another version): a VIEW inode, never named, reading the
 * name's version around its page cache.  SLOT_OK, SLOT_ENOENT, SLOT_ENOMEM. */
int memos_slot_view(slot_table *t, uint64_t ino, int64_t now_ns, uint64_t *view);

/* Passthrough: an open file of `ino` reads or writes the backing file
 * `backing` (the first registers it; the same id for the others).
 * SLOT_OK, SLOT_ENOENT, SLOT_EINVAL (another backing id is in use). */
int memos_slot_backing_attach(slot_table *t, uint64_t ino, int32_t backing);
/* One passthrough handle of `ino` is gone: the backing id to close when it
 * was the last (then *last = 1).  SLOT_OK, SLOT_ENOENT, SLOT_EINVAL. */
int memos_slot_backing_detach(slot_table *t, uint64_t ino, int32_t *backing, int *last);

/* ---- publishing ---- */

/* close(2) (flush) by closer_tgid of a write handle on `ino` opened by
 * opener_tgid, fsync (closer_tgid 0: anyone), or the release of the last
 * writer (closer_tgid 0).  *target: the inode the version goes to.  Pure.
 * Returns a memos_publish_action, or SLOT_ENOENT. */
int memos_slot_publish_plan(const slot_table *t, uint64_t ino, uint32_t opener_tgid,
                            uint32_t closer_tgid, uint64_t *target);

/* The caller published the draft of the writers of `ino` as `version`
 * (size logical bytes, stored bytes of pages).  The name points at it: in
 * place, or on a fresh inode when page-cache readers or a push keep the
 * holder (*holder: the inode that holds the name now).  A publish that
 * raced an eviction of the name puts it back.  SLOT_OK, SLOT_ENOENT,
 * SLOT_EINVAL (no publish is due), SLOT_ENOMEM. */
int memos_slot_published(slot_table *t, uint64_t ino, uint64_t version, uint64_t size,
                         uint64_t stored, int64_t now_ns, uint64_t *holder, unsigned *fx);

/* truncate(2) by a process that does not write the slot: the caller made
 * `version` of `size` from the published one; the name points at it as
 * memos_slot_published does.  SLOT_OK, SLOT_ENOENT, SLOT_ENOMEM. */
int memos_slot_set_version(slot_table *t, uint64_t ino, uint64_t version, uint64_t size,
                           uint64_t stored, int64_t now_ns, uint64_t *holder, unsigned *fx);

/* The writers' changes went with a name that is gone (unlink, a rename
 * over it, its directory): nothing to publish, changed is 0 again.
 * SLOT_OK, SLOT_ENOENT. */
int memos_slot_discarded(slot_table *t, uint64_t ino);

/* ---- closing ---- */

/* A reader handle on `ino` is released (dio: it read around the cache). */
int memos_slot_reader_gone(slot_table *t, uint64_t ino, int dio);

/* A write handle on `ino` opened by tgid is released (after the publish
 * that memos_slot_publish_plan with closer 0 asked for, if any).  The last
 * writer: the draft goes (FREE_DRAFT), the pages stay the version's when
 * its writers wrote it through them, a never-published create loses its
 * name (FORGET_ENTRY), and a push may follow (PUSH).  SLOT_OK, SLOT_ENOENT,
 * SLOT_EINVAL (no such writer). */
int memos_slot_writer_gone(slot_table *t, uint64_t ino, uint32_t tgid, int64_t now_ns,
                           unsigned *fx);

/* ---- the namespace ---- */

/* unlink(2) of `name`: its holder goes (SLOT_GONE_UNLINK).  *fx:
 * REMOVE_KEY.  SLOT_OK, SLOT_ENOENT. */
int memos_slot_unlink(slot_table *t, uint64_t name, unsigned *fx);

/* The same, for another reason: SLOT_GONE_RMDIR (its directory went while
 * it was being created: its writers' publishes go nowhere).  SLOT_OK,
 * SLOT_ENOENT, SLOT_EINVAL (a reason that is no removal). */
int memos_slot_remove(slot_table *t, uint64_t name, enum memos_slot_gone why, unsigned *fx);

/* rename(2) of `from` over `to` (if held): the target goes (REPLACED; an
 * open of it is served the renamed slot when that was published), the
 * renamed slot takes `to`.  SLOT_OK, SLOT_ENOENT. */
int memos_slot_rename(slot_table *t, uint64_t from, uint64_t to, unsigned *fx);

/* No tier holds `name`'s slot now (eviction with no SSD, ring, reset,
 * corruption, the remote tier): the name goes.  SLOT_OK, SLOT_ENOENT. */
int memos_slot_drop(slot_table *t, uint64_t name, unsigned *fx);

/* ---- the page-cache pusher ---- */

/* A push of `version` into `ino` starts: 1 when the kernel may hold another
 * version's pages (drop them first, then memos_slot_own_cache), 0 when
 * not, SLOT_ENOENT. */
int memos_slot_push_claim(slot_table *t, uint64_t ino, uint64_t version);
int memos_slot_own_cache(slot_table *t, uint64_t ino, uint64_t version);
int memos_slot_push_done(slot_table *t, uint64_t ino);

/* The kernel's pages of `ino` were invalidated (a coherence invalidation):
 * the writers' pages are not the draft's any more. */
int memos_slot_pages_dropped(slot_table *t, uint64_t ino);
/* The kernel's pages of `ino` hold no version's bytes (its writers wrote
 * bytes the version was made from, not the version: quantized storage). */
int memos_slot_pages_stale(slot_table *t, uint64_t ino);

/* ---- reading it ---- */

/* What tgid sees of inode `ino` (fstat; stat of a name: its holder).
 * SLOT_OK, SLOT_ENOENT. */
int memos_slot_stat(const slot_table *t, uint64_t ino, uint32_t tgid, int64_t now_ns,
                    memos_slot_info *out);

/* One number of what the table holds of `ino` (the fields of
 * memos_slot_info, by SLOT_F_*: a cheap read for the caller's every
 * decision); *found 0 when there is no such inode. */
enum memos_slot_field {
    SLOT_F_STATE = 0, SLOT_F_GONE, SLOT_F_VERSION, SLOT_F_PUB_SIZE, SLOT_F_STORED,
    SLOT_F_READERS, SLOT_F_WRITERS, SLOT_F_PUSHING, SLOT_F_CHANGED, SLOT_F_KIND,
    SLOT_F_HAS_BASE, SLOT_F_TRUNC_ONLY, SLOT_F_REFUSED, SLOT_F_REFUSED_CODE,
    SLOT_F_REFUSED_TOLD, SLOT_F_CACHE_VERSION, SLOT_F_TRUSTED, SLOT_F_PAGES_VERSION,
    SLOT_F_SUCCESSOR, SLOT_F_REPLACED_BY, SLOT_F_PRIVATE_OF, SLOT_F_VIEW_OF,
    SLOT_F_PRIVATES, SLOT_F_LOOKUPS, SLOT_F_HANDLES, SLOT_F_PUBS, SLOT_F_BACKING,
    SLOT_F_BACKING_OPENS, SLOT_F_DRAFT_SIZE, SLOT_F_DRAFT_MTIME, SLOT_F_NAME,
    SLOT_F_PENDING, SLOT_F_LATEST, SLOT_F_HOLDS_NAME, SLOT_F_NAME_HOLDER, SLOT_NFIELDS
};
int64_t memos_slot_field(const slot_table *t, uint64_t ino, enum memos_slot_field f,
                         int64_t now_ns, int *found);

/* The inode that holds `name` now, whoever asks (0: none). */
uint64_t memos_slot_holder(const slot_table *t, uint64_t name);

/* The invariants of one inode (ino) or of the whole table (ino 0): SLOT_OK,
 * or SLOT_EINVAL with the first broken one in why. */
int memos_slot_check(const slot_table *t, uint64_t ino, char *why, size_t whylen);

/* How long an ESTALE'd writer is waited for, and a busy writer waits. */
#define SLOT_RETRY_NS  (5000000000LL)

const char *memos_slot_state_name(enum memos_slot_state st);
const char *memos_slot_gone_name(enum memos_slot_gone g);
const char *memos_slot_kind_name(enum memos_draft_kind k);

/* The kernel's writeback cache is on (0/1): it keeps the size of an inode
 * it knows, so a version written elsewhere gets a fresh inode, and a
 * retried O_TRUNC writer shares the inode (the kernel truncates its pages). */
void memos_slot_set_writeback(slot_table *t, int on);

#endif /* MEMOS_SLOT_H */
