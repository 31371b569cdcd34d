/*
 * pymodule_cache.c — memosfs._native.Cache, the memory tier for Python: one
 * CacheObject owns one memos_cache (cache.c) and the on_evict callable.
 *
 * Owns.  The Cache type: its lifetime (`holds`, close, free), the eviction
 * trampoline, and every method that calls into the memos_* API (get, peek,
 * draft, publish, remove, rename, the knobs, stats, keys, check).
 *
 * Lifetime.  `holds` counts the pins held by Ref and Draft objects plus the
 * calls in flight (cache_enter ... cache_leave).  Cache.close() only marks
 * the cache closed; cache_maybe_free frees the memos_cache once `holds` is
 * zero, so an outstanding Ref or Draft, a copy running without the GIL, or
 * an on_evict that closes the cache mid-run never touches freed memory.
 * Once closed, every method raises ValueError ("cache is closed").
 *
 *     cache_enter ──holds++──► memos_*(self->c, ...) ──► cache_leave ──holds--──► maybe free
 *
 * The GIL and the lock.  Every field is touched with the GIL held.  The
 * cache mutex is taken inside each memos_* call, never across Python code:
 * collect_key (under the mutex, from memos_foreach) copies keys into plain
 * malloc'd memory and builds no Python object.  The eviction callback may
 * be reached from a thread without the GIL (a draft write that evicts runs
 * between Py_BEGIN/END_ALLOW_THREADS): evict_trampoline takes the GIL with
 * PyGILState_Ensure.  The lock order is always GIL → mutex.
 *
 * May call.  The memos_* API (memos.h); memos_error (pymodule.c) for every
 * error; ref_wrap / ref_drop / ref_usable (pymodule_ref.c) to hand out Refs;
 * draft_usable and DraftType (pymodule_draft.c) to create and publish
 * Drafts.  Refs and Drafts call back cache_maybe_free when they drop a hold.
 */
#include "pymodule.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ---- private prototypes ---- */

static int evict_trampoline(void *ctx, memos_entry *victim);

/* ---- Cache: lifetime ---- */

int cache_enter(CacheObject *self)
{
    if (!self->c || self->closed) {
        memos_error(MEMOS_EINVAL, "cache is closed", NULL);
        return -1;
    }
    self->holds++;
    return 0;
}

void cache_leave(CacheObject *self)
{
    self->holds--;
    cache_maybe_free(self);
}

void cache_maybe_free(CacheObject *self)
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
    cache_maybe_free(self);
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

static PyObject *Cache_wait_room(CacheObject *self, PyObject *arg)
{
    long ms = PyLong_AsLong(arg);
    if (ms == -1 && PyErr_Occurred())
        return NULL;
    if (ms < 0 || ms > 60000)
        return memos_error(MEMOS_EINVAL, "wait_room: 0..60000 ms", NULL);
    if (cache_enter(self) < 0)
        return NULL;
    int why;
    memos_cache *c = self->c;
    Py_BEGIN_ALLOW_THREADS
    why = memos_wait_room(c, (unsigned)ms);
    Py_END_ALLOW_THREADS
    cache_leave(self);
    return PyLong_FromLong(why);
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

static PyObject *Cache_set_draft_evicts(CacheObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    if (cache_enter(self) < 0)
        return NULL;
    memos_set_draft_evicts(self->c, on);
    cache_leave(self);
    Py_RETURN_NONE;
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
    PyObject *more = Py_BuildValue("{sKsKsKsKsKsKsKsKsdsN}",
        "prefetch_guarded", (unsigned long long)s.prefetch_guarded,
        "prefetch_aged", (unsigned long long)s.prefetch_aged,
        "prefetch_opened", (unsigned long long)s.prefetch_opened,
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

/* mark_prefetched(ref) -> bool: guard a prefetched version until it is read
 * (memos_mark_prefetched). */
static PyObject *Cache_mark_prefetched(CacheObject *self, PyObject *arg)
{
    if (!PyObject_TypeCheck(arg, &RefType)) {
        PyErr_SetString(PyExc_TypeError, "mark_prefetched takes a Ref");
        return NULL;
    }
    RefObject *r = (RefObject *)arg;
    if (ref_usable(r) < 0)
        return NULL;
    if (r->cache != self)
        return memos_error(MEMOS_EINVAL, "the Ref belongs to another cache", NULL);
    return PyBool_FromLong(memos_mark_prefetched(self->c, r->e));
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

static PyObject *Cache_prefault(CacheObject *self, PyObject *arg)
{
    long ahead = PyLong_AsLong(arg);
    if (ahead == -1 && PyErr_Occurred())
        return NULL;
    if (ahead < 0 || ahead > 1L << 30) {
        PyErr_SetString(PyExc_ValueError, "ahead: superblocks in [0, 2**30]");
        return NULL;
    }
    if (cache_enter(self) < 0)
        return NULL;
    int r;
    Py_BEGIN_ALLOW_THREADS
    r = memos_prefault(self->c, (unsigned)ahead);
    Py_END_ALLOW_THREADS
    cache_leave(self);
    return PyLong_FromLong(r);
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
    { "wait_room", (PyCFunction)Cache_wait_room, METH_O,
      "wait_room(ms) -> int: wait (GIL released) for the room an allocation that "
      "raised BlockingIOError was told to wait for: 1 write-backs, 2 pinned replaced "
      "versions, 3 other drafts or readers' pins, 0 none of them (try again now)" },
    { "set_capacity", (PyCFunction)Cache_set_capacity, METH_O, "set_capacity(n)" },
    { "set_evict_batch", (PyCFunction)Cache_set_evict_batch, METH_O, "set_evict_batch(n)" },
    { "set_draft_evicts", (PyCFunction)Cache_set_draft_evicts, METH_O,
      "set_draft_evicts(on): whether drafts' writes may evict (off: they are refused "
      "where they would, and Draft.reserve makes the room of a whole version)" },
    { "set_quota", (PyCFunction)Cache_set_quota, METH_VARARGS,
      "set_quota(agent, bytes): protect the agent's slots up to bytes (0 = none)" },
    { "tenant", (PyCFunction)Cache_tenant, METH_O,
      "tenant(agent) -> (quota, bytes, slots) | None" },
    { "set_policy", (PyCFunction)Cache_set_policy, METH_O,
      "set_policy(name): lru_lfu | lru | lfu, live (ValueError otherwise)" },
    { "stats", (PyCFunction)Cache_stats, METH_NOARGS, "stats() -> dict" },
    { "mark_prefetched", (PyCFunction)Cache_mark_prefetched, METH_O,
      "mark_prefetched(ref) -> bool: keep a prefetched version from eviction until read" },
    { "set_reclaim", (PyCFunction)Cache_set_reclaim, METH_VARARGS,
      "set_reclaim(free_ratio, fail_limit): lazy reclaim triggers of the arena" },
    { "sweep", (PyCFunction)Cache_sweep, METH_NOARGS,
      "sweep() -> int: reclaim every freed page now (flush); pages reclaimed" },
    { "keys", (PyCFunction)Cache_keys, METH_NOARGS, "keys() -> list[bytes], MRU first" },
    { "prefault", (PyCFunction)Cache_prefault, METH_O,
      "prefault(ahead) -> int: fault in one more superblock, at most `ahead` superblocks "
      "beyond the allocated pages (GIL released): 1 done, 0 none now, -1 the kernel cannot" },
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

PyTypeObject CacheType = {
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

/* ---- registration ---- */

int pym_cache_register(PyObject *m)
{
    if (PyType_Ready(&CacheType) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "Cache", (PyObject *)&CacheType);
}
