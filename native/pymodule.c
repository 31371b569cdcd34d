/*
 * pymodule.c — memosfs._native, the CPython binding of the C core: the
 * module itself.
 *
 * Owns.  The module definition and PyInit__native; the module functions
 * crc32c, tune_malloc and policy_simulate; the constants PAGE_SIZE,
 * BLOCK_SIZE, SUPERBLOCK_SIZE, KEY_MAX; and what every type of the binding
 * shares: memos_error (the one place a MEMOS_* code becomes an exception)
 * and the entry copies used by both Ref and Draft (entry_read_bytes,
 * entry_crc32c).  The types live in their own files (pymodule.h lists them):
 *
 *     Cache        pymodule_cache.c      Ref, _View  pymodule_ref.c
 *     Draft        pymodule_draft.c      Directory   pymodule_directory.c
 *     Prefetcher   pymodule_prefetch.c   Policy      pymodule_policy.c
 *     SlotMachine  pymodule_slot.c       (its SLOT_* codes become exceptions there)
 *
 * Errors.  memos_error() maps:
 *     MEMOS_ENOMEM  → OSError(ENOSPC, "memory tier full: ...")
 *     MEMOS_ETOOBIG → OSError(EFBIG, ...)
 *     MEMOS_ENOENT  → KeyError(key)
 *     MEMOS_EINVAL  → ValueError(msg)
 *     MEMOS_ESYS    → OSError(errno, ...)
 *     MEMOS_EBUSY   → OSError(EBUSY, ...)
 *     MEMOS_EAGAIN  → BlockingIOError (OSError EAGAIN, "memory tier busy: ...")
 *     ERR_CHECK     → AssertionError(reason)   (memos_check failed)
 *
 * The GIL.  Copies and checksums (crc32c, policy_simulate) over GIL_COPY_MIN
 * bytes run between Py_BEGIN/END_ALLOW_THREADS; the entry copies here
 * expect the caller to hold the entry (a pin or a draft) and to keep it
 * busy meanwhile, so a concurrent release is deferred (pymodule_ref.c).
 * Nothing here takes the cache mutex: reading a held entry needs no lock.
 *
 * May call.  memos_entry_read/iov/size and memos_crc32c (memos.h),
 * policy_simulate (policy.h), and the pym_*_register function of each
 * type file, in the order the module's names were always added.
 */
#include "pymodule.h"

#include <errno.h>
#include <malloc.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "policy.h"

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

PyObject *memos_error(int rc, const char *what, PyObject *key)
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
    case MEMOS_EAGAIN:
        return raise_os(EAGAIN, "memory tier busy: ", what);
    case ERR_CHECK:
        PyErr_SetString(PyExc_AssertionError, what);
        return NULL;
    default:
        PyErr_Format(PyExc_SystemError, "memos: unknown code %d (%s)", rc, what);
        return NULL;
    }
}

/* ---- entry copies (Ref and Draft) ---- */

/* n bytes at off as a new bytes object, copied straight into it. */
PyObject *entry_read_bytes(const memos_entry *e, long long off, long long n, int *busy)
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
PyObject *entry_crc32c(const memos_entry *e, long long off, long long n)
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

/* crc32c_file(fd, off, n, crc=0): memos_crc32c of the file's bytes [off,
 * off+n) without the GIL: data read 1 MiB at a time, holes (SEEK_DATA and
 * SEEK_HOLE, where the file system tells them) extended arithmetically.
 * OSError(EIO) if the file ends before off+n. */
static int crc_file(int fd, uint64_t off, uint64_t n, uint32_t *crc, char *buf, size_t cap)
{
    uint64_t end = off + n, pos = off;
    struct stat st;
    if (fstat(fd, &st) != 0)
        return errno;
    if ((uint64_t)st.st_size < end)
        return EIO;
    int holes = 1;
    while (pos < end) {
        uint64_t data_end = end;
        if (holes) {
            off_t d = lseek(fd, (off_t)pos, SEEK_DATA);
            if (d < 0 && errno == ENXIO) {
                *crc = memos_crc32c_zeros(*crc, end - pos);     /* a hole to the end */
                return 0;
            }
            if (d < 0) {
                holes = 0;                  /* not told: read everything */
            } else {
                if ((uint64_t)d > pos) {
                    uint64_t z = ((uint64_t)d < end ? (uint64_t)d : end) - pos;
                    *crc = memos_crc32c_zeros(*crc, z);
                    pos += z;
                    continue;
                }
                off_t h = lseek(fd, (off_t)pos, SEEK_HOLE);
                if (h > (off_t)pos && (uint64_t)h < end)
                    data_end = (uint64_t)h;
            }
        }
        while (pos < data_end) {
            size_t want = data_end - pos < cap ? (size_t)(data_end - pos) : cap;
            ssize_t got = pread(fd, buf, want, (off_t)pos);
            if (got < 0 && errno == EINTR)
                continue;
            if (got < 0)
                return errno;
            if (got == 0)
                return EIO;
            *crc = memos_crc32c(*crc, buf, (size_t)got);
            pos += (uint64_t)got;
        }
    }
    return 0;
}

static PyObject *mod_crc32c_file(PyObject *m, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "fd", "off", "n", "crc", NULL };
    int fd;
    unsigned long long off, n;
    unsigned long crc = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iKK|k:crc32c_file", kwlist, &fd, &off, &n,
                                     &crc))
        return NULL;
    if (crc > 0xFFFFFFFFul || off > (unsigned long long)INT64_MAX - n) {
        PyErr_SetString(PyExc_ValueError, "crc32c_file: crc or range out of bounds");
        return NULL;
    }
    size_t cap = 1 << 20;
    char *buf = PyMem_RawMalloc(cap);
    if (!buf)
        return PyErr_NoMemory();
    uint32_t c = (uint32_t)crc;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = crc_file(fd, off, n, &c, buf, cap);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(buf);
    if (rc) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromUnsignedLong(c);
}

/* crc32c_zeros(n, crc=0): memos_crc32c of n zero bytes, continuing from crc
 * (arithmetic: no bytes are made). */
static PyObject *mod_crc32c_zeros(PyObject *m, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "n", "crc", NULL };
    unsigned long long n;
    unsigned long crc = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "K|k:crc32c_zeros", kwlist, &n, &crc))
        return NULL;
    if (crc > 0xFFFFFFFFul) {
        PyErr_SetString(PyExc_ValueError, "crc32c_zeros: crc must be in 0..2**32-1");
        return NULL;
    }
    return PyLong_FromUnsignedLong(memos_crc32c_zeros((uint32_t)crc, (uint64_t)n));
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
        return memos_error(MEMOS_EINVAL, "unknown policy (lru_lfu, lru_lfu@0..5, lru, lfu, "
                                         "ref:NAME) or no memory", NULL);
    return Py_BuildValue("{sLsnsKsKsKsdsIsKsKsKss}", "hits", hits, "lookups", n,
                         "ghost_hits_recency", (unsigned long long)st.ghost_hits_recency,
                         "ghost_hits_frequency", (unsigned long long)st.ghost_hits_frequency,
                         "ghost_entries", (unsigned long long)st.ghost_entries,
                         "policy_recency", st.recency, "policy_expert", (unsigned)st.expert,
                         "expert_switches", (unsigned long long)st.expert_switches,
                         "ghost_bytes", (unsigned long long)st.ghost_bytes,
                         "sim_bytes", (unsigned long long)st.sim_bytes, "decided", st.decided);
}

static PyObject *mod_set_nowait(PyObject *mod, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    return PyBool_FromLong(memos_set_nowait(on));
}

static PyMethodDef module_methods[] = {
    { "policy_simulate", (PyCFunction)(void (*)(void))mod_policy_simulate,
      METH_VARARGS | METH_KEYWORDS,
      "policy_simulate(policy, keys, capacity, evict_batch=1) -> dict: replay uint64 "
      "block ids (a buffer) through the C policy over `capacity` unit-size blocks" },
    { "crc32c", (PyCFunction)(void (*)(void))mod_crc32c, METH_VARARGS | METH_KEYWORDS,
      "crc32c(data, crc=0) -> int: CRC-32C (Castagnoli) of a contiguous buffer, "
      "continuing from crc" },
    { "crc32c_file", (PyCFunction)(void (*)(void))mod_crc32c_file,
      METH_VARARGS | METH_KEYWORDS,
      "crc32c_file(fd, off, n, crc=0) -> int: CRC-32C of a file's bytes [off, off+n) "
      "without the GIL, its holes not read; OSError(EIO) if the file is shorter" },
    { "crc32c_zeros", (PyCFunction)(void (*)(void))mod_crc32c_zeros,
      METH_VARARGS | METH_KEYWORDS,
      "crc32c_zeros(n, crc=0) -> int: CRC-32C of n zero bytes, continuing from crc" },
    { "set_nowait", mod_set_nowait, METH_O,
      "set_nowait(on) -> bool: whether the calling thread's allocations raise "
      "BlockingIOError where they would wait for room (previous setting)" },
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

PyMODINIT_FUNC PyInit__native(void)
{
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (PyModule_AddIntConstant(m, "PAGE_SIZE", MEMOS_PAGE_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "BLOCK_SIZE", MEMOS_BLOCK_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "SUPERBLOCK_SIZE", MEMOS_SUPERBLOCK_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "KEY_MAX", MEMOS_KEY_MAX) < 0 ||
        pym_cache_register(m) < 0 || pym_ref_register(m) < 0 || pym_draft_register(m) < 0 ||
        pym_directory_register(m) < 0 || pym_prefetch_register(m) < 0 ||
        pym_policy_register(m) < 0 || pym_slot_register(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
