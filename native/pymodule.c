/*
 * pymodule.c — memosfs._native, the CPython binding of the C core.
 *
 * Three types:
 *
 *     Cache  owns a memos_cache; the on_evict callable; `holds`, the number
 *            of pins held by Python objects plus calls in flight
 *     Ref    one pinned entry (a reference); keeps its Cache alive
 *     Draft  one draft; keeps its Cache alive
 *
 *     Cache ◄──strong── Ref ──pin──► memos_entry
 *       ▲
 *       └───strong── Draft ──owns──► memos_entry (draft)
 *
 * Closing.  Cache.close() only marks the cache closed; the memos_cache is
 * freed when `holds` drops to zero (maybe_free), so an outstanding Ref or
 * Draft, a copy running without the GIL, or an on_evict that closes the
 * cache mid-run never touches freed memory.  Once closed, every Ref/Draft
 * method raises ValueError; release()/free() and dealloc still drop pins.
 *
 * Ref.release() while another thread copies out of the same Ref (`busy`)
 * is deferred to the end of the copy.
 *
 * The GIL.  Copies and checksums (crc32c) over GIL_COPY_MIN bytes run
 * between Py_BEGIN/END_ALLOW_THREADS.  The eviction callback may thus be reached from a thread without
 * the GIL: the trampoline takes it with PyGILState_Ensure.  Nothing here
 * holds the cache mutex while running Python code or allocating Python
 * objects (a dealloc could re-enter the cache), so lock order is always
 * GIL → mutex, never the reverse.
 *
 * Errors.  memos_error() is the one place a MEMOS_* code becomes a Python
 * exception:
 *     MEMOS_ENOMEM  → OSError(ENOSPC, "memory tier full: ...")
 *     MEMOS_ETOOBIG → OSError(EFBIG, ...)
 *     MEMOS_ENOENT  → KeyError(key)
 *     MEMOS_EINVAL  → ValueError(msg)
 *     MEMOS_ESYS    → OSError(errno, ...)
 *     MEMOS_EBUSY   → OSError(EBUSY, ...)
 *     ERR_CHECK     → AssertionError(reason)   (memos_check failed)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "memos.h"
#include "policy.h"

/* ---- types and constants ---- */

#define GIL_COPY_MIN  (64 * 1024)   /* copies above this release the GIL */
#define ERR_CHECK     (-100)        /* pseudo-code: memos_check failed */
#define IOV_BATCH     256           /* iovecs per pwritev */

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

static PyTypeObject CacheType, RefType, DraftType;

/* ---- private prototypes ---- */

static PyObject *memos_error(int rc, const char *what, PyObject *key);
static int  cache_enter(CacheObject *self);
static void cache_leave(CacheObject *self);
static void maybe_free(CacheObject *self);
static RefObject *ref_wrap(CacheObject *cache, memos_entry *e, int add_ref);
static void ref_drop(RefObject *self);
static int  ref_usable(RefObject *self);
static int  draft_usable(DraftObject *self);
static int  evict_trampoline(void *ctx, memos_entry *victim);
static PyObject *entry_read_bytes(const memos_entry *e, long long off, long long n, int *busy);
static PyObject *entry_crc32c(const memos_entry *e, long long off, long long n);

/* ---- errors: the one place ---- */

static PyObject *raise_os(int err, const char *prefix, const char *what)
{
    PyObject *args = Py_BuildValue("(is)", err, "");
    if (!args)
        return NULL;
    PyObject *msg = PyUnicode_FromFormat("%s%s", prefix, what);
    if (!msg) {
        Py_DECREF(args);
        return NULL;
    }
    PyTuple_SetItem(args, 1, msg);   /* steals msg */
    PyErr_SetObject(PyExc_OSError, args);
    Py_DECREF(args);
    return NULL;
}

static PyObject *memos_error(int rc, const char *what, PyObject *key)
{
    int err = errno;
    switch (rc) {
    case MEMOS_ENOMEM:
        return raise_os(ENOSPC, "memory tier full: ", what);
    case MEMOS_ETOOBIG:
        return raise_os(EFBIG, "larger than the memory tier: ", what);
    case MEMOS_ENOENT:
        if (key) {
            PyObject *t = PyTuple_Pack(1, key);
            if (t) {
                PyErr_SetObject(PyExc_KeyError, t);
                Py_DECREF(t);
            }
        } else {
            PyErr_SetString(PyExc_KeyError, what);
        }
        return NULL;
    case MEMOS_EINVAL:
        PyErr_SetString(PyExc_ValueError, what);
        return NULL;
    case MEMOS_ESYS:
        return raise_os(err ? err : EIO, "", what);
    case MEMOS_EBUSY:
        return raise_os(EBUSY, "busy: ", what);
    case ERR_CHECK:
        PyErr_SetString(PyExc_AssertionError, what);
        return NULL;
    default:
        PyErr_Format(PyExc_SystemError, "memos: unknown code %d (%s)", rc, what);
        return NULL;
    }
}

/* ---- Cache: lifetime ---- */

static int cache_enter(CacheObject *self)
{
    if (!self->c || self->closed) {
        memos_error(MEMOS_EINVAL, "cache is closed", NULL);
        return -1;
    }
    self->holds++;
    return 0;
}

static void cache_leave(CacheObject *self)
{
    self->holds--;
    maybe_free(self);
}

static void maybe_free(CacheObject *self)
{
    if (self->closed && self->holds == 0 && self->c) {
        memos_cache *c = self->c;
        self->c = NULL;
        memos_cache_free(c);
    }
}

static int Cache_init(CacheObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "capacity", "evict_batch", "on_evict", NULL };
    long long capacity;
    int batch = 16;
    PyObject *cb = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "L|iO:Cache", kwlist, &capacity, &batch, &cb))
        return -1;
    if (self->c) {
        memos_error(MEMOS_EINVAL, "Cache is already initialized", NULL);
        return -1;
    }
    if (capacity <= 0) {
        memos_error(MEMOS_EINVAL, "capacity must be positive", NULL);
        return -1;
    }
    if (batch <= 0 || batch > 4096) {
        memos_error(MEMOS_EINVAL, "evict_batch must be in 1..4096", NULL);
        return -1;
    }
    if (cb != Py_None && !PyCallable_Check(cb)) {
        PyErr_SetString(PyExc_TypeError, "on_evict must be callable or None");
        return -1;
    }
    memos_cache *c = memos_cache_new((uint64_t)capacity, (unsigned)batch,
                                     cb == Py_None ? NULL : evict_trampoline, self);
    if (!c) {
        memos_error(errno == ENOMEM ? MEMOS_ENOMEM : MEMOS_ESYS, "cannot create the cache", NULL);
        return -1;
    }
    if (cb != Py_None) {
        Py_INCREF(cb);
        self->on_evict = cb;
    }
    self->c = c;
    self->closed = 0;
    self->holds = 0;
    return 0;
}

static int Cache_traverse(CacheObject *self, visitproc visit, void *arg)
{
    Py_VISIT(self->on_evict);
    return 0;
}

static int Cache_clear(CacheObject *self)
{
    Py_CLEAR(self->on_evict);
    return 0;
}

static void Cache_dealloc(CacheObject *self)
{
    PyObject_GC_UnTrack(self);
    /* Refs and Drafts hold strong references: none is left. */
    if (self->c) {
        memos_cache_free(self->c);
        self->c = NULL;
    }
    Cache_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *Cache_close(CacheObject *self, PyObject *noarg)
{
    self->closed = 1;
    maybe_free(self);
    Py_RETURN_NONE;
}

/* ---- Cache: eviction trampoline ---- */

/* Runs without the cache lock, maybe without the GIL.  The victim is pinned
 * by the evictor; the Ref handed to Python takes its own pin and is
 * released right after the call, so a Ref kept by on_evict is inert. */
static int evict_trampoline(void *ctx, memos_entry *victim)
{
    CacheObject *self = ctx;
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = MEMOS_OK;
    PyObject *cb = self->on_evict;
    if (cb && self->c) {
        Py_INCREF(cb);
        PyObject *et, *ev, *etb;
        PyErr_Fetch(&et, &ev, &etb);   /* keep a caller's error aside */
        RefObject *ref = ref_wrap(self, victim, 1);
        if (!ref) {
            PyErr_WriteUnraisable(cb);
            rc = MEMOS_EBUSY;
        } else {
            PyObject *res = PyObject_CallOneArg(cb, (PyObject *)ref);
            if (!res) {
                PyErr_WriteUnraisable(cb);
                rc = MEMOS_EBUSY;
            } else {
                if (res == Py_False)
                    rc = MEMOS_EBUSY;
                Py_DECREF(res);
            }
            if (ref->e)
                ref_drop(ref);
            Py_DECREF(ref);
        }
        PyErr_Restore(et, ev, etb);
        Py_DECREF(cb);
    }
    PyGILState_Release(g);
    return rc;
}

/* ---- Cache: methods ---- */

static int key_arg(PyObject *key)
{
    if (!PyBytes_Check(key)) {
        PyErr_SetString(PyExc_TypeError, "keys are bytes");
        return -1;
    }
    return 0;
}

static PyObject *cache_lookup(CacheObject *self, PyObject *key, int peek)
{
    if (key_arg(key) < 0 || cache_enter(self) < 0)
        return NULL;
    memos_entry *e;
    const char *k = PyBytes_AS_STRING(key);
    size_t kl = (size_t)PyBytes_GET_SIZE(key);
    int rc = peek ? memos_peek(self->c, k, kl, &e) : memos_get(self->c, k, kl, &e);
    PyObject *out;
    if (rc == MEMOS_ENOENT) {
        out = Py_NewRef(Py_None);
    } else {
        out = (PyObject *)ref_wrap(self, e, 0);
        if (!out)
            memos_unpin(self->c, e);
    }
    cache_leave(self);
    return out;
}

static PyObject *Cache_get(CacheObject *self, PyObject *key) { return cache_lookup(self, key, 0); }
static PyObject *Cache_peek(CacheObject *self, PyObject *key) { return cache_lookup(self, key, 1); }

static PyObject *Cache_draft(CacheObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "base", NULL };
    PyObject *base = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:draft", kwlist, &base))
        return NULL;
    RefObject *b = NULL;
    if (base != Py_None) {
        if (!PyObject_TypeCheck(base, &RefType)) {
            PyErr_SetString(PyExc_TypeError, "base must be a Ref or None");
            return NULL;
        }
        b = (RefObject *)base;
        if (ref_usable(b) < 0)
            return NULL;
        if (b->cache != self)
            return memos_error(MEMOS_EINVAL, "base belongs to another cache", NULL);
    }
    if (cache_enter(self) < 0)
        return NULL;
    DraftObject *dr = PyObject_New(DraftObject, &DraftType);
    if (!dr) {
        cache_leave(self);
        return NULL;
    }
    dr->cache = (CacheObject *)Py_NewRef(self);
    dr->d = NULL;
    dr->busy = 0;
    memos_entry *d = NULL;
    int rc;
    if (b && memos_entry_size(b->e) > GIL_COPY_MIN) {
        memos_entry *be = b->e;
        memos_cache *c = self->c;
        b->busy++;
        Py_BEGIN_ALLOW_THREADS
        rc = memos_draft_new(c, be, &d);
        Py_END_ALLOW_THREADS
        b->busy--;
        if (b->released && !b->busy)
            ref_drop(b);
    } else {
        rc = memos_draft_new(self->c, b ? b->e : NULL, &d);
    }
    if (rc != MEMOS_OK) {
        Py_DECREF(dr);
        cache_leave(self);
        return memos_error(rc, "new draft", NULL);
    }
    dr->d = d;
    self->holds++;            /* the draft's own hold */
    cache_leave(self);
    return (PyObject *)dr;
}

static PyObject *Cache_publish(CacheObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "draft", "key", "dirty", "version", NULL };
    PyObject *dobj, *key;
    int dirty = 1;
    unsigned long long version = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!O|$pK:publish", kwlist,
                                     &DraftType, &dobj, &key, &dirty, &version))
        return NULL;
    DraftObject *dr = (DraftObject *)dobj;
    if (key_arg(key) < 0 || draft_usable(dr) < 0)
        return NULL;
    if (dr->cache != self)
        return memos_error(MEMOS_EINVAL, "draft belongs to another cache", NULL);
    if (PyBytes_GET_SIZE(key) == 0 || (size_t)PyBytes_GET_SIZE(key) > MEMOS_KEY_MAX)
        return memos_error(MEMOS_EINVAL, "key must be 1..KEY_MAX bytes", NULL);
    if (cache_enter(self) < 0)
        return NULL;
    RefObject *ref = ref_wrap(self, NULL, 0);
    if (!ref) {
        cache_leave(self);
        return NULL;
    }
    int rc = memos_publish(self->c, dr->d, PyBytes_AS_STRING(key),
                           (size_t)PyBytes_GET_SIZE(key), version, dirty);
    if (rc != MEMOS_OK) {
        Py_DECREF(ref);
        cache_leave(self);
        return memos_error(rc, "publish", key);
    }
    ref->e = dr->d;          /* the draft's pin (and hold) move to the Ref */
    dr->d = NULL;
    cache_leave(self);
    return (PyObject *)ref;
}

static PyObject *Cache_remove(CacheObject *self, PyObject *key)
{
    if (key_arg(key) < 0 || cache_enter(self) < 0)
        return NULL;
    int rc = memos_remove(self->c, PyBytes_AS_STRING(key), (size_t)PyBytes_GET_SIZE(key));
    cache_leave(self);
    return PyBool_FromLong(rc == MEMOS_OK);
}

static PyObject *Cache_rename(CacheObject *self, PyObject *args)
{
    PyObject *from, *to;
    if (!PyArg_ParseTuple(args, "OO:rename", &from, &to) || key_arg(from) < 0 || key_arg(to) < 0)
        return NULL;
    if (cache_enter(self) < 0)
        return NULL;
    int rc = memos_rename(self->c, PyBytes_AS_STRING(from), (size_t)PyBytes_GET_SIZE(from),
                          PyBytes_AS_STRING(to), (size_t)PyBytes_GET_SIZE(to));
    cache_leave(self);
    if (rc == MEMOS_ENOENT)
        Py_RETURN_FALSE;
    if (rc != MEMOS_OK)
        return memos_error(rc, "rename", from);
    Py_RETURN_TRUE;
}

static PyObject *Cache_evict_run(CacheObject *self, PyObject *noarg)
{
    if (cache_enter(self) < 0)
        return NULL;
    int n = memos_evict_run(self->c);
    cache_leave(self);
    return PyLong_FromLong(n);
}

static PyObject *Cache_set_capacity(CacheObject *self, PyObject *arg)
{
    long long n = PyLong_AsLongLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n <= 0)
        return memos_error(MEMOS_EINVAL, "capacity must be positive", NULL);
    if (cache_enter(self) < 0)
        return NULL;
    int rc = memos_set_capacity(self->c, (uint64_t)n);
    cache_leave(self);
    if (rc != MEMOS_OK)
        return memos_error(rc, "pinned data does not fit the new capacity", NULL);
    Py_RETURN_NONE;
}

static PyObject *Cache_set_quota(CacheObject *self, PyObject *args)
{
    const char *name;
    Py_ssize_t len;
    unsigned long long quota;
    if (!PyArg_ParseTuple(args, "y#K", &name, &len, &quota))
        return NULL;
    if (cache_enter(self) < 0)
        return NULL;
    int rc = memos_tenant_set(self->c, name, (size_t)len, (uint64_t)quota);
    cache_leave(self);
    if (rc == MEMOS_ENOMEM)
        return memos_error(rc, "too many agents have a quota", NULL);
    if (rc != MEMOS_OK)
        return memos_error(rc, "not an agent name", NULL);
    Py_RETURN_NONE;
}

static PyObject *Cache_tenant(CacheObject *self, PyObject *arg)
{
    char *name;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(arg, &name, &len) < 0)
        return NULL;
    if (cache_enter(self) < 0)
        return NULL;
    uint64_t quota = 0, bytes = 0, slots = 0;
    int rc = memos_tenant_get(self->c, name, (size_t)len, &quota, &bytes, &slots);
    cache_leave(self);
    if (rc != MEMOS_OK)
        Py_RETURN_NONE;
    return Py_BuildValue("(KKK)", (unsigned long long)quota, (unsigned long long)bytes,
                         (unsigned long long)slots);
}

static PyObject *Cache_set_evict_batch(CacheObject *self, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n <= 0 || n > 4096)
        return memos_error(MEMOS_EINVAL, "evict_batch must be in 1..4096", NULL);
    if (cache_enter(self) < 0)
        return NULL;
    int rc = memos_set_evict_batch(self->c, (unsigned)n);
    cache_leave(self);
    if (rc != MEMOS_OK)
        return memos_error(rc, "evict_batch must be in 1..4096", NULL);
    Py_RETURN_NONE;
}

static PyObject *Cache_set_reclaim(CacheObject *self, PyObject *args)
{
    double ratio;
    long limit;
    if (!PyArg_ParseTuple(args, "dl:set_reclaim", &ratio, &limit))
        return NULL;
    if (!(ratio >= 0.0 && ratio <= 1.0) || limit < 0 || limit > 1000000)
        return memos_error(MEMOS_EINVAL,
                           "reclaim_free_ratio must be in 0..1, reclaim_fail_limit in 0..1000000",
                           NULL);
    if (cache_enter(self) < 0)
        return NULL;
    int rc = memos_set_reclaim(self->c, ratio, (unsigned)limit);
    cache_leave(self);
    if (rc != MEMOS_OK)
        return memos_error(rc, "reclaim_free_ratio must be in 0..1", NULL);
    Py_RETURN_NONE;
}

static PyObject *Cache_sweep(CacheObject *self, PyObject *noarg)
{
    if (cache_enter(self) < 0)
        return NULL;
    long n = memos_sweep(self->c);
    cache_leave(self);
    return PyLong_FromLong(n);
}

static int get_stats(CacheObject *self, memos_stats *s)
{
    if (cache_enter(self) < 0)
        return -1;
    memos_get_stats(self->c, s);
    cache_leave(self);
    return 0;
}

static PyObject *cache_stats_core(CacheObject *self, PyObject *noarg)
{
    memos_stats s;
    if (get_stats(self, &s) < 0)
        return NULL;
#define U(f) #f, (unsigned long long)s.f
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsKsdsKsdsKsKsKsdsK}",
        U(lookups), U(hits), U(misses), U(inserts), U(replaces), U(removes),
        U(evictions), U(eviction_runs), U(evict_refused), U(alloc_failures), U(alloc_waits),
        U(slots), U(drafts), U(dead_pinned), U(pinned), U(bytes_used),
        U(bytes_draft), U(pages_used), U(free_pages), U(capacity),
        U(superblocks), U(huge_pages), U(evict_batch), U(index_buckets),
        U(index_entries), "index_load_factor", s.index_load_factor,
        U(reclaim_runs), "fragmentation", s.fragmentation, U(pages_pending),
        U(sweep_ns), U(sweep_ns_max), "reclaim_free_ratio", s.reclaim_free_ratio,
        U(reclaim_fail_limit));
#undef U
}

/* stats() = the core counters plus the policy's (policy.c). */
static PyObject *Cache_stats(CacheObject *self, PyObject *noarg)
{
    PyObject *d = cache_stats_core(self, noarg);
    memos_stats s;
    if (!d || get_stats(self, &s) < 0) {
        Py_XDECREF(d);
        return NULL;
    }
    PyObject *pol = PyUnicode_FromString(memos_policy_name(self->c));
    PyObject *more = Py_BuildValue("{sKsKsKsKsKsdsN}",
        "ghost_hits_recency", (unsigned long long)s.ghost_hits_recency,
        "ghost_hits_frequency", (unsigned long long)s.ghost_hits_frequency,
        "ghost_entries", (unsigned long long)s.ghost_entries,
        "policy_probation", (unsigned long long)s.policy_probation,
        "policy_protected", (unsigned long long)s.policy_protected,
        "policy_recency", s.policy_recency, "evict_policy", pol);
    if (!more || PyDict_Update(d, more) < 0) {
        Py_XDECREF(more);
        Py_DECREF(d);
        return NULL;
    }
    Py_DECREF(more);
    return d;
}

static PyObject *Cache_set_policy(CacheObject *self, PyObject *arg)
{
    const char *name = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    if (!name) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "policy name must be a str");
        return NULL;
    }
    if (cache_enter(self) < 0)
        return NULL;
    int rc = memos_set_policy(self->c, name);
    cache_leave(self);
    if (rc != MEMOS_OK) {
        PyErr_Format(PyExc_ValueError, "unknown eviction policy %R (lru_lfu, lru, lfu)", arg);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Cache_get_policy(CacheObject *self, void *closure)
{
    if (cache_enter(self) < 0)
        return NULL;
    PyObject *out = PyUnicode_FromString(memos_policy_name(self->c));
    cache_leave(self);
    return out;
}

static PyObject *Cache_get_capacity(CacheObject *self, void *closure)
{
    memos_stats s;
    return get_stats(self, &s) < 0 ? NULL : PyLong_FromUnsignedLongLong(s.capacity);
}

static PyObject *Cache_get_evict_batch(CacheObject *self, void *closure)
{
    memos_stats s;
    return get_stats(self, &s) < 0 ? NULL : PyLong_FromUnsignedLongLong(s.evict_batch);
}

typedef struct key_list {
    struct { char *k; size_t n; } *v;   /* key copies (malloc) */
    size_t n, cap;                      /* used / allocated */
    int oom;                            /* an allocation failed */
} key_list;

/* Under the cache lock: plain C only, no Python objects. */
static void collect_key(void *ctx, memos_entry *e)
{
    key_list *l = ctx;
    if (l->oom)
        return;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        void *nv = realloc(l->v, cap * sizeof *l->v);
        if (!nv) {
            l->oom = 1;
            return;
        }
        l->v = nv;
        l->cap = cap;
    }
    size_t kl;
    const void *k = memos_entry_key(e, &kl);
    char *copy = malloc(kl ? kl : 1);
    if (!copy) {
        l->oom = 1;
        return;
    }
    memcpy(copy, k, kl);
    l->v[l->n].k = copy;
    l->v[l->n].n = kl;
    l->n++;
}

static PyObject *Cache_keys(CacheObject *self, PyObject *noarg)
{
    if (cache_enter(self) < 0)
        return NULL;
    key_list l = { 0 };
    memos_foreach(self->c, collect_key, &l);
    cache_leave(self);
    PyObject *out = l.oom ? PyErr_NoMemory() : PyList_New((Py_ssize_t)l.n);
    for (size_t i = 0; i < l.n; i++) {
        if (out) {
            PyObject *b = PyBytes_FromStringAndSize(l.v[i].k, (Py_ssize_t)l.v[i].n);
            if (!b)
                Py_CLEAR(out);
            else
                PyList_SET_ITEM(out, (Py_ssize_t)i, b);
        }
        free(l.v[i].k);
    }
    free(l.v);
    return out;
}

static PyObject *Cache_fail_after(CacheObject *self, PyObject *arg)
{
    long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (cache_enter(self) < 0)
        return NULL;
    memos_fail_after(self->c, n);
    cache_leave(self);
    Py_RETURN_NONE;
}

static PyObject *Cache_check(CacheObject *self, PyObject *noarg)
{
    char why[512];
    if (cache_enter(self) < 0)
        return NULL;
    int rc = memos_check(self->c, why, sizeof why);
    cache_leave(self);
    if (rc != MEMOS_OK)
        return memos_error(ERR_CHECK, why, NULL);
    Py_RETURN_NONE;
}

static PyObject *Cache_get_closed(CacheObject *self, void *closure)
{
    return PyBool_FromLong(self->closed || !self->c);
}

static PyMethodDef Cache_methods[] = {
    { "get", (PyCFunction)Cache_get, METH_O, "get(key) -> Ref | None: pin, count, touch" },
    { "peek", (PyCFunction)Cache_peek, METH_O, "peek(key) -> Ref | None: pin only" },
    { "draft", (PyCFunction)(void (*)(void))Cache_draft, METH_VARARGS | METH_KEYWORDS,
      "draft(base=None) -> Draft" },
    { "publish", (PyCFunction)(void (*)(void))Cache_publish, METH_VARARGS | METH_KEYWORDS,
      "publish(draft, key, *, dirty=True, version=0) -> Ref" },
    { "remove", (PyCFunction)Cache_remove, METH_O, "remove(key) -> bool" },
    { "rename", (PyCFunction)Cache_rename, METH_VARARGS, "rename(old, new) -> bool" },
    { "evict_run", (PyCFunction)Cache_evict_run, METH_NOARGS, "evict_run() -> int" },
    { "set_capacity", (PyCFunction)Cache_set_capacity, METH_O, "set_capacity(n)" },
    { "set_evict_batch", (PyCFunction)Cache_set_evict_batch, METH_O, "set_evict_batch(n)" },
    { "set_quota", (PyCFunction)Cache_set_quota, METH_VARARGS,
      "set_quota(agent, bytes): protect the agent's slots up to bytes (0 = none)" },
    { "tenant", (PyCFunction)Cache_tenant, METH_O,
      "tenant(agent) -> (quota, bytes, slots) | None" },
    { "set_policy", (PyCFunction)Cache_set_policy, METH_O,
      "set_policy(name): lru_lfu | lru | lfu, live (ValueError otherwise)" },
    { "stats", (PyCFunction)Cache_stats, METH_NOARGS, "stats() -> dict" },
    { "set_reclaim", (PyCFunction)Cache_set_reclaim, METH_VARARGS,
      "set_reclaim(free_ratio, fail_limit): lazy reclaim triggers of the arena" },
    { "sweep", (PyCFunction)Cache_sweep, METH_NOARGS,
      "sweep() -> int: reclaim every freed page now (flush); pages reclaimed" },
    { "keys", (PyCFunction)Cache_keys, METH_NOARGS, "keys() -> list[bytes], MRU first" },
    { "fail_after", (PyCFunction)Cache_fail_after, METH_O, "fail_after(n): test hook" },
    { "check", (PyCFunction)Cache_check, METH_NOARGS, "check(): AssertionError on damage" },
    { "close", (PyCFunction)Cache_close, METH_NOARGS, "close(): free once nothing holds it" },
    { NULL }
};

static PyGetSetDef Cache_getset[] = {
    { "capacity", (getter)Cache_get_capacity, NULL, "bytes", NULL },
    { "evict_batch", (getter)Cache_get_evict_batch, NULL, "victims per run", NULL },
    { "policy", (getter)Cache_get_policy, NULL, "eviction policy name", NULL },
    { "closed", (getter)Cache_get_closed, NULL, "close() was called", NULL },
    { NULL }
};

static PyTypeObject CacheType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "memosfs._native.Cache",
    .tp_basicsize = sizeof(CacheObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Cache(capacity, evict_batch=16, on_evict=None): the memory tier",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Cache_init,
    .tp_dealloc = (destructor)Cache_dealloc,
    .tp_traverse = (traverseproc)Cache_traverse,
    .tp_clear = (inquiry)Cache_clear,
    .tp_methods = Cache_methods,
    .tp_getset = Cache_getset,
};

/* ---- Ref ---- */

/* A Ref on e; add_ref takes a new pin, else the caller's pin moves in.
 * e may be NULL (filled in by the caller, which then owns the hold). */
static RefObject *ref_wrap(CacheObject *cache, memos_entry *e, int add_ref)
{
    RefObject *r = PyObject_New(RefObject, &RefType);
    if (!r)
        return NULL;
    r->cache = (CacheObject *)Py_NewRef(cache);
    r->e = e;
    r->busy = 0;
    r->released = 0;
    if (e) {
        if (add_ref)
            memos_ref(cache->c, e);
        cache->holds++;
    }
    return r;
}

/* Drop the pin now (busy == 0). */
static void ref_drop(RefObject *self)
{
    memos_entry *e = self->e;
    self->e = NULL;
    self->released = 0;
    if (e && self->cache->c)
        memos_unpin(self->cache->c, e);
    self->cache->holds--;
    maybe_free(self->cache);
}

static int ref_usable(RefObject *self)
{
    if (!self->e || self->released) {
        memos_error(MEMOS_EINVAL, "reference was released", NULL);
        return -1;
    }
    if (self->cache->closed) {
        memos_error(MEMOS_EINVAL, "cache is closed", NULL);
        return -1;
    }
    return 0;
}

static void ref_unbusy(RefObject *self)
{
    self->busy--;
    if (self->released && self->busy == 0)
        ref_drop(self);
}

static void Ref_dealloc(RefObject *self)
{
    if (self->e)
        ref_drop(self);
    Py_DECREF(self->cache);
    PyObject_Free(self);
}

static PyObject *Ref_release(RefObject *self, PyObject *noarg)
{
    if (self->e && !self->released) {
        if (self->busy)
            self->released = 1;
        else
            ref_drop(self);
    }
    Py_RETURN_NONE;
}

static PyObject *Ref_enter(RefObject *self, PyObject *noarg)
{
    if (ref_usable(self) < 0)
        return NULL;
    return Py_NewRef(self);
}

static PyObject *Ref_exit(RefObject *self, PyObject *args)
{
    return Ref_release(self, NULL);
}

/* ---- Ref views ----
 *
 * Ref.view(off, max) exports the slot's bytes at off without a copy: the
 * longest run of extents that lie next to each other in memory, at most max
 * bytes.  The exporter keeps its Ref busy while any buffer is held, so the
 * pin (and the pages) outlive every memoryview of them.
 */

typedef struct ViewObject {
    PyObject_HEAD
    RefObject  *ref;        /* strong reference (GIL) */
    char       *buf;        /* first byte (pinned pages) */
    Py_ssize_t  len;        /* bytes */
} ViewObject;

static PyTypeObject ViewType;

static int View_getbuffer(ViewObject *self, Py_buffer *view, int flags)
{
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->buf, self->len, 1, flags) < 0)
        return -1;
    self->ref->busy++;
    return 0;
}

static void View_releasebuffer(ViewObject *self, Py_buffer *view)
{
    ref_unbusy(self->ref);
}

static void View_dealloc(ViewObject *self)
{
    Py_DECREF(self->ref);
    PyObject_Free(self);
}

static PyBufferProcs View_as_buffer = {
    .bf_getbuffer = (getbufferproc)View_getbuffer,
    .bf_releasebuffer = (releasebufferproc)View_releasebuffer,
};

static PyTypeObject ViewType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "memosfs._native._View",
    .tp_basicsize = sizeof(ViewObject),
    .tp_dealloc = (destructor)View_dealloc,
    .tp_as_buffer = &View_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "pinned slot bytes, exported read-only",
};

static PyObject *Ref_view(RefObject *self, PyObject *args)
{
    long long off, max;
    if (!PyArg_ParseTuple(args, "LL:view", &off, &max))
        return NULL;
    if (ref_usable(self) < 0)
        return NULL;
    if (off < 0 || max < 0)
        return memos_error(MEMOS_EINVAL, "negative offset or length", NULL);
    struct iovec iov[64];
    int cnt = memos_entry_iov(self->e, (uint64_t)off, (size_t)max, iov, 64);
    size_t len = cnt ? iov[0].iov_len : 0;
    for (int i = 1; i < cnt; i++) {
        if ((char *)iov[i - 1].iov_base + iov[i - 1].iov_len != (char *)iov[i].iov_base)
            break;
        len += iov[i].iov_len;
    }
    ViewObject *v = PyObject_New(ViewObject, &ViewType);
    if (!v)
        return NULL;
    v->ref = (RefObject *)Py_NewRef(self);
    v->buf = cnt ? iov[0].iov_base : NULL;
    v->len = (Py_ssize_t)len;
    PyObject *mv = PyMemoryView_FromObject((PyObject *)v);
    Py_DECREF(v);
    return mv;
}

/* n bytes at off as a new bytes object, copied straight into it. */
static PyObject *entry_read_bytes(const memos_entry *e, long long off, long long n, int *busy)
{
    if (off < 0 || n < 0)
        return memos_error(MEMOS_EINVAL, "offset and length must be >= 0", NULL);
    uint64_t size = memos_entry_size(e);
    uint64_t avail = (uint64_t)off >= size ? 0 : size - (uint64_t)off;
    size_t len = (uint64_t)n < avail ? (size_t)n : (size_t)avail;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len);
    if (!out || len == 0)
        return out;
    char *dst = PyBytes_AS_STRING(out);
    if (len > GIL_COPY_MIN) {
        (*busy)++;
        Py_BEGIN_ALLOW_THREADS
        memos_entry_read(e, (uint64_t)off, dst, len);
        Py_END_ALLOW_THREADS
        (*busy)--;
    } else {
        memos_entry_read(e, (uint64_t)off, dst, len);
    }
    return out;
}

/* CRC-32C of entry bytes [off, off+n) (n < 0: to the end), extent by
 * extent.  The caller holds the entry (pin or draft) and has raised its
 * busy count; the GIL is released for more than GIL_COPY_MIN bytes. */
static PyObject *entry_crc32c(const memos_entry *e, long long off, long long n)
{
    if (off < 0)
        return memos_error(MEMOS_EINVAL, "offset must be >= 0", NULL);
    uint64_t size = memos_entry_size(e);
    uint64_t avail = (uint64_t)off >= size ? 0 : size - (uint64_t)off;
    uint64_t want = (n < 0 || (uint64_t)n > avail) ? avail : (uint64_t)n;
    uint32_t crc = 0;
    PyThreadState *ts = want > GIL_COPY_MIN ? PyEval_SaveThread() : NULL;
    struct iovec iov[IOV_BATCH];
    uint64_t done = 0;
    while (done < want) {
        int cnt = memos_entry_iov(e, (uint64_t)off + done, (size_t)(want - done), iov, IOV_BATCH);
        if (cnt <= 0)
            break;
        for (int i = 0; i < cnt; i++) {
            crc = memos_crc32c(crc, iov[i].iov_base, iov[i].iov_len);
            done += iov[i].iov_len;
        }
    }
    if (ts)
        PyEval_RestoreThread(ts);
    return PyLong_FromUnsignedLong(crc);
}

static PyObject *Ref_read(RefObject *self, PyObject *args)
{
    long long off, n;
    if (!PyArg_ParseTuple(args, "LL:read", &off, &n) || ref_usable(self) < 0)
        return NULL;
    self->busy++;
    PyObject *out = entry_read_bytes(self->e, off, n, &self->busy);
    ref_unbusy(self);
    return out;
}

static PyObject *Ref_readinto(RefObject *self, PyObject *args)
{
    long long off;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "Lw*:readinto", &off, &view))
        return NULL;
    if (ref_usable(self) < 0 || off < 0) {
        PyBuffer_Release(&view);
        return off < 0 ? memos_error(MEMOS_EINVAL, "offset must be >= 0", NULL) : NULL;
    }
    size_t got;
    memos_entry *e = self->e;
    self->busy++;
    if (view.len > GIL_COPY_MIN) {
        Py_BEGIN_ALLOW_THREADS
        got = memos_entry_read(e, (uint64_t)off, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        got = memos_entry_read(e, (uint64_t)off, view.buf, (size_t)view.len);
    }
    ref_unbusy(self);
    PyBuffer_Release(&view);
    return PyLong_FromSize_t(got);
}

/* Entry bytes [off, off+n) to the fd at file offset off (a slot image). */
#define SPARSE_PIECE (64 * 1024)    /* write_to_fd(sparse=True) skips zero pieces this big */

static PyObject *Ref_write_to_fd(RefObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "fd", "off", "n", "sparse", NULL };
    int fd, sparse = 0;
    long long off = 0, n = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "i|LLp:write_to_fd", kwlist, &fd, &off, &n,
                                     &sparse) ||
        ref_usable(self) < 0)
        return NULL;
    if (off < 0)
        return memos_error(MEMOS_EINVAL, "offset must be >= 0", NULL);
    memos_entry *e = self->e;
    uint64_t size = memos_entry_size(e);
    uint64_t avail = (uint64_t)off >= size ? 0 : size - (uint64_t)off;
    uint64_t want = (n < 0 || (uint64_t)n > avail) ? avail : (uint64_t)n;
    uint64_t done = 0;
    int err = 0;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    struct iovec iov[IOV_BATCH];
    while (done < want) {
        uint64_t at = (uint64_t)off + done;
        int cnt = memos_entry_iov(e, at, (size_t)(want - done), iov, IOV_BATCH);
        if (sparse) {
            /* Holes stay holes: a piece of zeros is skipped (the file is
             * extended past it by what follows), anything else written. */
            size_t len = iov[0].iov_len < SPARSE_PIECE ? iov[0].iov_len : SPARSE_PIECE;
            const char *p = iov[0].iov_base;
            if (p[0] == 0 && memcmp(p, p + 1, len - 1) == 0) {
                done += len;
                continue;
            }
            iov[0].iov_len = len;
            cnt = 1;
        }
        ssize_t w = pwritev(fd, iov, cnt, (off_t)at);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            err = errno;
            break;
        }
        if (w == 0) {
            err = EIO;
            break;
        }
        done += (uint64_t)w;
    }
    Py_END_ALLOW_THREADS
    ref_unbusy(self);
    if (err) {
        errno = err;
        return memos_error(MEMOS_ESYS, "write_to_fd", NULL);
    }
    return PyLong_FromUnsignedLongLong(done);
}

static PyObject *Ref_crc32c(RefObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "off", "n", NULL };
    long long off = 0, n = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|LL:crc32c", kwlist, &off, &n) ||
        ref_usable(self) < 0)
        return NULL;
    self->busy++;
    PyObject *out = entry_crc32c(self->e, off, n);
    ref_unbusy(self);
    return out;
}

static PyObject *ref_key(RefObject *self, void *c)
{
    if (ref_usable(self) < 0)
        return NULL;
    size_t kl;
    const void *k = memos_entry_key(self->e, &kl);
    return PyBytes_FromStringAndSize(k ? k : "", (Py_ssize_t)kl);
}

#define REF_U64(name, fn)                                                  \
    static PyObject *ref_##name(RefObject *self, void *c)                  \
    {                                                                      \
        return ref_usable(self) < 0 ? NULL                                 \
                                    : PyLong_FromUnsignedLongLong(fn(self->e)); \
    }
REF_U64(size, memos_entry_size)
REF_U64(stored, memos_entry_stored)
REF_U64(version, memos_entry_version)
REF_U64(hits, memos_entry_hits)

#define REF_BOOL(name, fn)                                                 \
    static PyObject *ref_##name(RefObject *self, void *c)                  \
    {                                                                      \
        return ref_usable(self) < 0 ? NULL : PyBool_FromLong(fn(self->e)); \
    }
REF_BOOL(dirty, memos_entry_dirty)
REF_BOOL(live, memos_entry_live)
REF_BOOL(sticky, memos_entry_sticky)

static int ref_set_flag(RefObject *self, PyObject *v, void (*set)(memos_cache *, memos_entry *, int))
{
    if (!v) {
        PyErr_SetString(PyExc_TypeError, "cannot delete this attribute");
        return -1;
    }
    int on = PyObject_IsTrue(v);
    if (on < 0 || ref_usable(self) < 0)
        return -1;
    set(self->cache->c, self->e, on);
    return 0;
}

static int ref_set_dirty(RefObject *self, PyObject *v, void *c) { return ref_set_flag(self, v, memos_set_dirty); }
static int ref_set_sticky(RefObject *self, PyObject *v, void *c) { return ref_set_flag(self, v, memos_set_sticky); }

static PyMethodDef Ref_methods[] = {
    { "read", (PyCFunction)Ref_read, METH_VARARGS, "read(off, n) -> bytes (short at EOF)" },
    { "readinto", (PyCFunction)Ref_readinto, METH_VARARGS, "readinto(off, buffer) -> int" },
    { "write_to_fd", (PyCFunction)(void (*)(void))Ref_write_to_fd, METH_VARARGS | METH_KEYWORDS,
      "write_to_fd(fd, off=0, n=-1, sparse=False) -> int: pwritev bytes [off, off+n) at "
      "file offset off; sparse: 64 KiB pieces of zeros are left as holes" },
    { "crc32c", (PyCFunction)(void (*)(void))Ref_crc32c, METH_VARARGS | METH_KEYWORDS,
      "crc32c(off=0, n=-1) -> int: CRC-32C of bytes [off, off+n) (n < 0: to the end)" },
    { "view", (PyCFunction)Ref_view, METH_VARARGS,
      "view(off, max) -> memoryview: the contiguous bytes at off (at most max), no copy; "
      "the pin lasts while the view does" },
    { "release", (PyCFunction)Ref_release, METH_NOARGS, "release(): drop the pin" },
    { "__enter__", (PyCFunction)Ref_enter, METH_NOARGS, NULL },
    { "__exit__", (PyCFunction)Ref_exit, METH_VARARGS, NULL },
    { NULL }
};

static PyGetSetDef Ref_getset[] = {
    { "key", (getter)ref_key, NULL, "key (bytes)", NULL },
    { "size", (getter)ref_size, NULL, "logical bytes", NULL },
    { "stored", (getter)ref_stored, NULL, "bytes of pages held", NULL },
    { "version", (getter)ref_version, NULL, "version number", NULL },
    { "hits", (getter)ref_hits, NULL, "get() hits", NULL },
    { "dirty", (getter)ref_dirty, (setter)ref_set_dirty, "not yet persisted", NULL },
    { "live", (getter)ref_live, NULL, "still the entry of its key", NULL },
    { "sticky", (getter)ref_sticky, (setter)ref_set_sticky, "kept out of eviction", NULL },
    { NULL }
};

static PyTypeObject RefType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "memosfs._native.Ref",
    .tp_basicsize = sizeof(RefObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A pinned entry of a Cache (from get/peek/publish)",
    .tp_dealloc = (destructor)Ref_dealloc,
    .tp_methods = Ref_methods,
    .tp_getset = Ref_getset,
};

/* ---- Draft ---- */

static int draft_usable(DraftObject *self)
{
    if (!self->d) {
        memos_error(MEMOS_EINVAL, "draft was published or freed", NULL);
        return -1;
    }
    if (self->cache->closed) {
        memos_error(MEMOS_EINVAL, "cache is closed", NULL);
        return -1;
    }
    if (self->busy) {
        memos_error(MEMOS_EINVAL, "draft is in use by another thread", NULL);
        return -1;
    }
    return 0;
}

static void draft_drop(DraftObject *self)
{
    memos_entry *d = self->d;
    self->d = NULL;
    if (d && self->cache->c)
        memos_draft_free(self->cache->c, d);
    self->cache->holds--;
    maybe_free(self->cache);
}

static void Draft_dealloc(DraftObject *self)
{
    if (self->d)
        draft_drop(self);
    Py_DECREF(self->cache);
    PyObject_Free(self);
}

static PyObject *Draft_write(DraftObject *self, PyObject *args)
{
    long long off;
    Py_buffer view;
    if (!PyArg_ParseTuple(args, "Ly*:write", &off, &view))
        return NULL;
    if (draft_usable(self) < 0 || off < 0) {
        PyBuffer_Release(&view);
        return off < 0 ? memos_error(MEMOS_EINVAL, "offset must be >= 0", NULL) : NULL;
    }
    memos_cache *c = self->cache->c;
    memos_entry *d = self->d;
    int rc;
    self->busy++;
    if (view.len > GIL_COPY_MIN) {
        Py_BEGIN_ALLOW_THREADS
        rc = memos_draft_write(c, d, (uint64_t)off, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        rc = memos_draft_write(c, d, (uint64_t)off, view.buf, (size_t)view.len);
    }
    self->busy--;
    Py_ssize_t len = view.len;
    PyBuffer_Release(&view);
    if (rc != MEMOS_OK)
        return memos_error(rc, "draft write", NULL);
    return PyLong_FromSsize_t(len);
}

static PyObject *Draft_read(DraftObject *self, PyObject *args)
{
    long long off, n;
    if (!PyArg_ParseTuple(args, "LL:read", &off, &n) || draft_usable(self) < 0)
        return NULL;
    return entry_read_bytes(self->d, off, n, &self->busy);
}

static PyObject *Draft_crc32c(DraftObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "off", "n", NULL };
    long long off = 0, n = -1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|LL:crc32c", kwlist, &off, &n) ||
        draft_usable(self) < 0)
        return NULL;
    self->busy++;
    PyObject *out = entry_crc32c(self->d, off, n);
    self->busy--;
    return out;
}

static PyObject *Draft_truncate(DraftObject *self, PyObject *arg)
{
    long long size = PyLong_AsLongLong(arg);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (draft_usable(self) < 0)
        return NULL;
    if (size < 0)
        return memos_error(MEMOS_EINVAL, "size must be >= 0", NULL);
    memos_cache *c = self->cache->c;
    memos_entry *d = self->d;
    uint64_t cur = memos_entry_size(d);
    int rc;
    self->busy++;
    if ((uint64_t)size > cur + GIL_COPY_MIN) {
        Py_BEGIN_ALLOW_THREADS
        rc = memos_draft_truncate(c, d, (uint64_t)size);
        Py_END_ALLOW_THREADS
    } else {
        rc = memos_draft_truncate(c, d, (uint64_t)size);
    }
    self->busy--;
    if (rc != MEMOS_OK)
        return memos_error(rc, "draft truncate", NULL);
    Py_RETURN_NONE;
}

static PyObject *Draft_free(DraftObject *self, PyObject *noarg)
{
    if (self->busy)
        return memos_error(MEMOS_EINVAL, "draft is in use by another thread", NULL);
    if (self->d)
        draft_drop(self);
    Py_RETURN_NONE;
}

static PyObject *draft_size(DraftObject *self, void *c)
{
    if (!self->d || self->cache->closed)
        return memos_error(MEMOS_EINVAL, self->d ? "cache is closed"
                                                 : "draft was published or freed", NULL);
    return PyLong_FromUnsignedLongLong(memos_entry_size(self->d));
}

static PyMethodDef Draft_methods[] = {
    { "write", (PyCFunction)Draft_write, METH_VARARGS, "write(off, data) -> int" },
    { "read", (PyCFunction)Draft_read, METH_VARARGS, "read(off, n) -> bytes" },
    { "crc32c", (PyCFunction)(void (*)(void))Draft_crc32c, METH_VARARGS | METH_KEYWORDS,
      "crc32c(off=0, n=-1) -> int: CRC-32C of bytes [off, off+n) (n < 0: to the end)" },
    { "truncate", (PyCFunction)Draft_truncate, METH_O, "truncate(size)" },
    { "free", (PyCFunction)Draft_free, METH_NOARGS, "free(): abort the draft" },
    { NULL }
};

static PyGetSetDef Draft_getset[] = {
    { "size", (getter)draft_size, NULL, "logical bytes", NULL },
    { NULL }
};

static PyTypeObject DraftType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "memosfs._native.Draft",
    .tp_basicsize = sizeof(DraftObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An unpublished entry (from Cache.draft)",
    .tp_dealloc = (destructor)Draft_dealloc,
    .tp_methods = Draft_methods,
    .tp_getset = Draft_getset,
};

/* ---- module ---- */

static PyObject *mod_tune_malloc(PyObject *m, PyObject *noarg)
{
    mallopt(M_MMAP_THRESHOLD, 512 * 1024 * 1024);
    mallopt(M_TRIM_THRESHOLD, 512 * 1024 * 1024);
    mallopt(M_TOP_PAD, 64 * 1024 * 1024);
    Py_RETURN_NONE;
}

static PyObject *mod_crc32c(PyObject *m, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "data", "crc", NULL };
    Py_buffer view;
    PyObject *seed = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*|O!:crc32c", kwlist, &view,
                                     &PyLong_Type, &seed))
        return NULL;
    unsigned long crc = 0;
    if (seed) {
        crc = PyLong_AsUnsignedLong(seed);
        if ((crc == (unsigned long)-1 && PyErr_Occurred()) || crc > 0xFFFFFFFFul) {
            PyBuffer_Release(&view);
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "crc must be in 0..2**32-1");
            return NULL;
        }
    }
    uint32_t out;
    if (view.len > GIL_COPY_MIN) {
        Py_BEGIN_ALLOW_THREADS
        out = memos_crc32c((uint32_t)crc, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    } else {
        out = memos_crc32c((uint32_t)crc, view.buf, (size_t)view.len);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(out);
}

/* policy_simulate(name, keys, capacity, evict_batch=1): replay a buffer of
 * uint64 block ids through the C policy over unit-size blocks (policy.c). */
static PyObject *mod_policy_simulate(PyObject *m, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "policy", "keys", "capacity", "evict_batch", NULL };
    const char *name;
    Py_buffer view;
    long long capacity;
    int batch = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "sy*L|i:policy_simulate", kwlist, &name,
                                     &view, &capacity, &batch))
        return NULL;
    if (view.len % 8 || capacity <= 0 || capacity > (1LL << 29) || batch <= 0 || batch > 4096) {
        PyBuffer_Release(&view);
        return memos_error(MEMOS_EINVAL, "keys must be uint64s, capacity in 1..2**29, "
                                         "evict_batch in 1..4096", NULL);
    }
    policy_stats st;
    long long hits;
    Py_BEGIN_ALLOW_THREADS
    hits = policy_simulate(name, view.buf, (size_t)view.len / 8, (size_t)capacity,
                           (unsigned)batch, &st);
    Py_END_ALLOW_THREADS
    Py_ssize_t n = view.len / 8;
    PyBuffer_Release(&view);
    if (hits < 0)
        return memos_error(MEMOS_EINVAL, "unknown policy (lru_lfu, lru, lfu) or no memory", NULL);
    return Py_BuildValue("{sLsnsKsKsKsd}", "hits", hits, "lookups", n,
                         "ghost_hits_recency", (unsigned long long)st.ghost_hits_recency,
                         "ghost_hits_frequency", (unsigned long long)st.ghost_hits_frequency,
                         "ghost_entries", (unsigned long long)st.ghost_entries,
                         "policy_recency", st.recency);
}

static PyMethodDef module_methods[] = {
    { "policy_simulate", (PyCFunction)(void (*)(void))mod_policy_simulate,
      METH_VARARGS | METH_KEYWORDS,
      "policy_simulate(policy, keys, capacity, evict_batch=1) -> dict: replay uint64 "
      "block ids (a buffer) through the C policy over `capacity` unit-size blocks" },
    { "crc32c", (PyCFunction)(void (*)(void))mod_crc32c, METH_VARARGS | METH_KEYWORDS,
      "crc32c(data, crc=0) -> int: CRC-32C (Castagnoli) of a contiguous buffer, "
      "continuing from crc" },
    { "tune_malloc", mod_tune_malloc, METH_NOARGS,
      "tune_malloc(): large bytes objects come from the heap, not one mmap each" },
    { NULL }
};

static struct PyModuleDef module_def = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "memosfs._native",
    .m_doc = "The C core of memosfs.",
    .m_size = -1,
    .m_methods = module_methods,
};

/* Types defined in their own files (pymodule_directory.c, pymodule_prefetch.c). */
int memos_directory_register(PyObject *m);
int memos_prefetch_register(PyObject *m);

PyMODINIT_FUNC PyInit__native(void)
{
    if (PyType_Ready(&CacheType) < 0 || PyType_Ready(&RefType) < 0 ||
        PyType_Ready(&DraftType) < 0 || PyType_Ready(&ViewType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (PyModule_AddIntConstant(m, "PAGE_SIZE", MEMOS_PAGE_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "BLOCK_SIZE", MEMOS_BLOCK_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "SUPERBLOCK_SIZE", MEMOS_SUPERBLOCK_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "KEY_MAX", MEMOS_KEY_MAX) < 0 ||
        PyModule_AddObjectRef(m, "Cache", (PyObject *)&CacheType) < 0 ||
        PyModule_AddObjectRef(m, "Ref", (PyObject *)&RefType) < 0 ||
        PyModule_AddObjectRef(m, "Draft", (PyObject *)&DraftType) < 0 ||
        memos_directory_register(m) < 0 || memos_prefetch_register(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
