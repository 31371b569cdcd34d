/*
 * pymodule_draft.c — memosfs._native.Draft, an unpublished entry of a Cache
 * (from Cache.draft, consumed by Cache.publish).
 *
 * Owns.  The Draft type: write, read, crc32c, truncate, free and size of the
 * draft entry it owns, and the hold it keeps on its Cache.
 *
 *     Draft ──strong──► Cache          (holds + 1 while the draft lives)
 *       └──owns──► memos_entry (draft)  (memos_draft_free at free/dealloc)
 *
 * Cache.publish moves the draft's entry and hold into a new Ref and leaves
 * `d` NULL; free() or dealloc of an unpublished draft frees the entry
 * (draft_drop), then lets a closed cache free itself (cache_maybe_free).
 * A published or freed draft, or one of a closed cache, raises ValueError.
 *
 * The GIL and the lock.  `d` and `busy` are touched with the GIL held.
 * Writes, truncates that grow by more than GIL_COPY_MIN bytes and long
 * copies run between Py_BEGIN/END_ALLOW_THREADS with `busy` raised; while a
 * draft is busy every other method on it (all but the size attribute)
 * raises ValueError ("draft is in use by another thread"): one draft has
 * one writer.  The memos_draft_*
 * calls take the cache mutex inside; a write that must evict reaches
 * on_evict through the trampoline (pymodule_cache.c), which takes the GIL.
 *
 * May call.  The memos_draft_* and memos_entry_size of memos.h;
 * memos_error, entry_read_bytes and entry_crc32c (pymodule.c);
 * cache_maybe_free (pymodule_cache.c).
 */
#include "pymodule.h"

/* ---- Draft ---- */

int draft_usable(DraftObject *self)
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
    cache_maybe_free(self->cache);
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

static PyObject *Draft_reserve(DraftObject *self, PyObject *arg)
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
    int rc;
    self->busy++;
    Py_BEGIN_ALLOW_THREADS
    rc = memos_draft_reserve(c, d, (uint64_t)size);
    Py_END_ALLOW_THREADS
    self->busy--;
    if (rc != MEMOS_OK)
        return memos_error(rc, "draft reserve", NULL);
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

/* changes() -> None | (base_version, base_size, cut, runs): what this draft
 * changed since the clean version its lineage started from (the pages
 * written, the smallest size since); None when unknown. */
static PyObject *Draft_changes(DraftObject *self, PyObject *noarg)
{
    if (draft_usable(self) < 0)
        return NULL;
    return changes_object(self->cache->c, self->d, 1);
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
    { "reserve", (PyCFunction)Draft_reserve, METH_O,
      "reserve(size): grow to size (zeros), evicting what it must, all or nothing: "
      "OSError(ENOSPC), nothing evicted, when the room cannot be made" },
    { "changes", (PyCFunction)Draft_changes, METH_NOARGS,
      "changes() -> None | (base_version, base_size, cut, runs): this draft is version "
      "base_version's bytes [0, cut), zeros to its size, then its own bytes at each run "
      "(offset, length); None when not known" },
    { NULL }
};

static PyGetSetDef Draft_getset[] = {
    { "size", (getter)draft_size, NULL, "logical bytes", NULL },
    { NULL }
};

PyTypeObject DraftType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "memosfs._native.Draft",
    .tp_basicsize = sizeof(DraftObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An unpublished entry (from Cache.draft)",
    .tp_dealloc = (destructor)Draft_dealloc,
    .tp_methods = Draft_methods,
    .tp_getset = Draft_getset,
};

/* ---- registration ---- */

int pym_draft_register(PyObject *m)
{
    if (PyType_Ready(&DraftType) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "Draft", (PyObject *)&DraftType);
}
