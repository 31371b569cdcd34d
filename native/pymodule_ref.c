/*
 * pymodule_ref.c — memosfs._native.Ref, one pinned entry of a Cache, and
 * memosfs._native._View, the read-only buffer Ref.view() exports.
 *
 * Owns.  The Ref type (from Cache.get/peek/publish and the eviction
 * trampoline): the pin on its memos_entry, the copies out of it (read,
 * readinto, write_to_fd, crc32c, view) and its attributes (key, size,
 * stored, version, hits, dirty, live, sticky); the _View type.
 *
 *     Ref ──strong──► Cache        (holds + 1 while the pin is held)
 *      └──pin──► memos_entry       (memos_unpin at release)
 *     _View ──strong──► Ref        (busy + 1 while a buffer is exported)
 *
 * Release.  release() (or __exit__, or dealloc) drops the pin and the hold
 * (ref_drop), then lets the cache free itself if it was closed
 * (cache_maybe_free).  While another thread copies out of the same Ref, or
 * a memoryview of it is alive (`busy` > 0), release() only marks it
 * `released`; the last ref_unbusy drops the pin.  A released Ref, or one of
 * a closed cache, raises ValueError on every method.
 *
 * The GIL and the lock.  `busy`, `released` and `e` are touched with the
 * GIL held.  Copies over GIL_COPY_MIN bytes (and every write_to_fd) run
 * between Py_BEGIN/END_ALLOW_THREADS with `busy` raised; reading a pinned
 * entry takes no cache lock at all (cache.c), and ref_drop calls
 * memos_unpin, which takes it briefly.  Nothing here runs Python code with
 * the cache mutex held.
 *
 * May call.  The memos_entry_* readers, memos_ref/memos_unpin and the flag
 * setters of memos.h; memos_error, entry_read_bytes and entry_crc32c
 * (pymodule.c); cache_maybe_free (pymodule_cache.c).
 */
#include "pymodule.h"

#include <errno.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

/* ---- private prototypes ---- */

static void ref_unbusy(RefObject *self);

/* ---- Ref ---- */

/* A Ref on e; add_ref takes a new pin, else the caller's pin moves in.
 * e may be NULL (filled in by the caller, which then owns the hold). */
RefObject *ref_wrap(CacheObject *cache, memos_entry *e, int add_ref)
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
void ref_drop(RefObject *self)
{
    memos_entry *e = self->e;
    self->e = NULL;
    self->released = 0;
    if (e && self->cache->c)
        memos_unpin(self->cache->c, e);
    self->cache->holds--;
    cache_maybe_free(self->cache);
}

int ref_usable(RefObject *self)
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

/* changes() -> None | (base_version, base_size, cut, [(off, len), ...]):
 * memos_entry_changes, the runs as a list of pairs. */
static PyObject *Ref_changes(RefObject *self, PyObject *noargs)
{
    if (ref_usable(self) < 0)
        return NULL;
    return changes_object(self->cache->c, self->e, 0);
}

PyObject *changes_object(memos_cache *c, const memos_entry *e, int draft)
{
    memos_changes ch;
    uint64_t small[2 * 16];
    uint64_t *runs = small;
    size_t max = 16;
    for (;;) {
        if ((draft ? memos_draft_changes(c, e, &ch, runs, max)
                   : memos_entry_changes(c, e, &ch, runs, max)) != 0) {
            if (runs != small)
                PyMem_Free(runs);
            Py_RETURN_NONE;
        }
        if (ch.runs <= max)
            break;
        if (runs != small)
            PyMem_Free(runs);
        max = (size_t)ch.runs + 16;     /* it may have grown meanwhile: room to spare */
        runs = PyMem_Malloc(2 * max * sizeof *runs);
        if (!runs)
            return PyErr_NoMemory();
    }
    PyObject *list = PyList_New((Py_ssize_t)ch.runs);
    for (uint64_t i = 0; list && i < ch.runs; i++) {
        PyObject *pair = Py_BuildValue("(KK)", (unsigned long long)runs[2 * i],
                                       (unsigned long long)runs[2 * i + 1]);
        if (!pair) {
            Py_CLEAR(list);
            break;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, pair);
    }
    if (runs != small)
        PyMem_Free(runs);
    if (!list)
        return NULL;
    return Py_BuildValue("(KKKN)", (unsigned long long)ch.base_version,
                         (unsigned long long)ch.base_size, (unsigned long long)ch.cut, list);
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
    { "changes", (PyCFunction)Ref_changes, METH_NOARGS,
      "changes() -> None | (base_version, base_size, cut, runs): this version is version "
      "base_version's bytes [0, cut), zeros to its size, then its own bytes at each "
      "(offset, length) of runs; None: unknown (write it whole)" },
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

PyTypeObject RefType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "memosfs._native.Ref",
    .tp_basicsize = sizeof(RefObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A pinned entry of a Cache (from get/peek/publish)",
    .tp_dealloc = (destructor)Ref_dealloc,
    .tp_methods = Ref_methods,
    .tp_getset = Ref_getset,
};

/* ---- registration ---- */

int pym_ref_register(PyObject *m)
{
    if (PyType_Ready(&RefType) < 0 || PyType_Ready(&ViewType) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "Ref", (PyObject *)&RefType);
}
