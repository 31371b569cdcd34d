/*
 * pymodule.h — private header of memosfs._native, the CPython binding of the
 * C core.  Shared by the pymodule*.c files only; nothing outside the binding
 * includes it.
 *
 * The binding is one file per Python type:
 *
 *     pymodule.c            the module: errors (memos_error), entry copies
 *                           shared by Ref and Draft, module functions
 *                           (crc32c, tune_malloc, policy_simulate), init
 *     pymodule_cache.c      Cache: lifetime (holds, close), eviction
 *                           trampoline, the memos_* calls
 *     pymodule_ref.c        Ref (a pinned entry) and _View (zero-copy export)
 *     pymodule_draft.c      Draft (an unpublished entry)
 *     pymodule_directory.c  Directory (directory.c)
 *     pymodule_prefetch.c   Prefetcher (prefetch.c)
 *     pymodule_policy.c     Policy (policy.c, standalone: the SSD tier's)
 *     pymodule_slot.c       SlotMachine (slot.c, standalone: not on the request path yet)
 *
 *     Cache ◄──strong── Ref ──pin──► memos_entry
 *       ▲
 *       └───strong── Draft ──owns──► memos_entry (draft)
 *
 * Every object field below is read and written with the GIL held; no file of
 * the binding holds the cache mutex while running Python code (the core
 * takes and drops it inside each memos_* call), so the lock order is always
 * GIL → mutex.  Each file declares its own helpers static; what one type
 * needs of another is declared here and nowhere else.
 */
#ifndef MEMOS_PYMODULE_H
#define MEMOS_PYMODULE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "memos.h"

/* ---- constants ---- */

#define GIL_COPY_MIN  (64 * 1024)   /* copies above this release the GIL */
#define ERR_CHECK     (-100)        /* pseudo-code: memos_check failed */
#define IOV_BATCH     256           /* iovecs per pwritev / crc pass */

/* ---- object structs ---- */

typedef struct CacheObject {
    PyObject_HEAD
    memos_cache *c;         /* NULL before init and once freed (GIL) */
    PyObject    *on_evict;  /* callable or NULL (GIL) */
    int          closed;    /* close() was called (GIL) */
    Py_ssize_t   holds;     /* pins held by Refs/Drafts + calls in flight (GIL) */
} CacheObject;

typedef struct RefObject {
    PyObject_HEAD
    CacheObject *cache;     /* strong reference (GIL) */
    memos_entry *e;         /* pinned entry, NULL once released (GIL) */
    int          busy;      /* copies in flight without the GIL (GIL) */
    int          released;  /* release() deferred until busy == 0 (GIL) */
} RefObject;

typedef struct DraftObject {
    PyObject_HEAD
    CacheObject *cache;     /* strong reference (GIL) */
    memos_entry *d;         /* the draft, NULL once published or freed (GIL) */
    int          busy;      /* a write/copy in flight without the GIL (GIL) */
} DraftObject;

/* ---- type objects ---- */

extern PyTypeObject CacheType;   /* pymodule_cache.c */
extern PyTypeObject RefType;     /* pymodule_ref.c */
extern PyTypeObject DraftType;   /* pymodule_draft.c */

/* ---- pymodule.c: errors and entry copies ---- */

/* The one place a MEMOS_* code (or ERR_CHECK) becomes a Python exception;
 * always returns NULL.  key, when given, is the KeyError's argument. */
PyObject *memos_error(int rc, const char *what, PyObject *key);

/* n bytes at off as a new bytes object; *busy is raised around a copy that
 * runs without the GIL.  The caller holds the entry (pin or draft). */
PyObject *entry_read_bytes(const memos_entry *e, long long off, long long n, int *busy);

/* CRC-32C of bytes [off, off+n) (n < 0: to the end) as an int.  The caller
 * holds the entry and has raised its busy count. */
PyObject *entry_crc32c(const memos_entry *e, long long off, long long n);
/* None | (base_version, base_size, cut, [(off, len), ...]) of a version
 * (draft 0: memos_entry_changes) or a draft (1: memos_draft_changes). */
PyObject *changes_object(memos_cache *c, const memos_entry *e, int draft);

/* ---- pymodule_cache.c ---- */

int  cache_enter(CacheObject *self);        /* -1 + ValueError if closed; else holds++ */
void cache_leave(CacheObject *self);        /* holds--, then cache_maybe_free */
void cache_maybe_free(CacheObject *self);   /* free the memos_cache: closed and no holds */

/* ---- pymodule_ref.c ---- */

/* A Ref on e; add_ref takes a new pin, else the caller's pin moves in.  e may
 * be NULL (the caller fills it in and then owns the hold). */
RefObject *ref_wrap(CacheObject *cache, memos_entry *e, int add_ref);
void ref_drop(RefObject *self);             /* drop the pin now (busy == 0) */
int  ref_usable(RefObject *self);           /* 0, or -1 + ValueError */

/* ---- pymodule_draft.c ---- */

int  draft_usable(DraftObject *self);       /* 0, or -1 + ValueError */

/* ---- registration: PyType_Ready, then add to the module (0 or -1) ---- */

int pym_cache_register(PyObject *m);
int pym_ref_register(PyObject *m);
int pym_draft_register(PyObject *m);
int pym_directory_register(PyObject *m);
int pym_prefetch_register(PyObject *m);
int pym_policy_register(PyObject *m);      /* pymodule_policy.c */
int pym_slot_register(PyObject *m);        /* pymodule_slot.c */

#endif
