/*
 * fuseshim.c — the FUSE requests pyfuse3 does not pass on, built as
 * memosfs._fuseshim.
 *
 * pyfuse3 3.5 hands libfuse a table of low-level operations without `ioctl` and
 * `fallocate`, and its `flush` handler drops the caller's pid.  memosfs needs
 * them: ioctl(2) is how a read-only holder acknowledges an invalidation
 * (MEMOS_IOC_ACK, memosfs/shared.py), fallocate(2) mode 0 is how fsx and many writers preallocate, and only
 * the process that opened a slot for writing may publish it on close (a
 * forked child's close of an inherited descriptor sends FLUSH too).
 *
 * How: this library defines `fuse_session_new`.  It is loaded with
 * RTLD_GLOBAL before pyfuse3 (memosfs/__init__.py), so the dynamic linker
 * binds pyfuse3's call to this definition; it copies pyfuse3's table, adds
 * `fallocate` and `ioctl`, wraps `flush` to note the caller's pid and lock owner, wraps
 * `init` to turn off the kernel's automatic page invalidation on mtime
 * changes (see shim_init), and calls the real `fuse_session_new` in libfuse.  The Python side registers
 * two callables with `install()`:
 *
 *   fallocate(fh, mode, offset, length) -> errno (0: done)   (trio thread)
 *   flush_note(fh, pid, lock_owner)                          (just before
 *                                        pyfuse3's flush handler runs)
 *   interrupted(pid)       the kernel interrupted an open or create of that
 *                          thread (a signal, SIGKILL included)   (trio thread)
 *   write_note(fh, off, writepage)   just before pyfuse3's write handler:
 *                          whether the kernel writes back cached pages
 *   ioctl(fh, cmd, pid) -> errno (0: done)   a restricted ioctl(2) without
 *                          data on an open file (trio thread): memosfs's
 *                          MEMOS_IOC_ACK = _IO('M', 1), how a holder that may
 *                          not set xattrs (a read-only reader) acknowledges
 *
 * pyfuse3 runs a request's handler right after fuse_session_process_buf()
 * returns, with no other request in between, so the note read at the top of
 * the Python flush handler belongs to that request.
 *
 * If pyfuse3 was loaded before this library, nothing is intercepted:
 * `active()` says so, fallocate stays EOPNOTSUPP and flush publishes as
 * before (the log says why).
 */
#define FUSE_USE_VERSION 34
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <fuse_lowlevel.h>

typedef struct fuse_session *(*session_new_fn)(struct fuse_args *,
                                               const struct fuse_lowlevel_ops *,
                                               size_t, void *);

static struct fuse_lowlevel_ops shim_ops;      /* pyfuse3's table plus ours */
static void (*pyfuse3_flush)(fuse_req_t, fuse_ino_t, struct fuse_file_info *);
static PyObject *fallocate_cb;                 /* owned; GIL */
static PyObject *flush_note_cb;                /* owned; GIL */
static int intercepted;                        /* fuse_session_new came here */

/* ---- the added operations ---- */

/* The errno a callback answered (an int), from its result r (a new
 * reference, or NULL if it raised): EIO for anything else, the exception
 * reported as unraisable.  GIL held. */
static int errno_of(PyObject *cb, PyObject *r)
{
    int err = EIO;
    if (r) {
        long v = PyLong_AsLong(r);
        if (!(v == -1 && PyErr_Occurred()))
            err = (int)v;
        Py_DECREF(r);
    }
    if (PyErr_Occurred()) {
        PyErr_WriteUnraisable(cb);
        err = EIO;
    }
    return err;
}

static void shim_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset,
                           off_t length, struct fuse_file_info *fi)
{
    int err = EOPNOTSUPP;
    PyGILState_STATE g = PyGILState_Ensure();
    if (fallocate_cb) {
        err = errno_of(fallocate_cb,
                       PyObject_CallFunction(fallocate_cb, "KiLL",
                                             (unsigned long long)fi->fh, mode,
                                             (long long)offset, (long long)length));
    }
    PyGILState_Release(g);
    fuse_reply_err(req, err);
}

/* ioctl(2) on an open file.  Only restricted ioctls without data reach the
 * callback (memosfs defines no other); anything else is ENOTTY, as for a
 * filesystem without ioctls. */
static PyObject *ioctl_cb;                     /* owned; GIL */

static void shim_ioctl(fuse_req_t req, fuse_ino_t ino, int cmd, void *arg,
                       struct fuse_file_info *fi, unsigned flags, const void *in_buf,
                       size_t in_bufsz, size_t out_bufsz)
{
    int err = ENOTTY;
    if (!(flags & (FUSE_IOCTL_UNRESTRICTED | FUSE_IOCTL_DIR)) && in_bufsz == 0 &&
        out_bufsz == 0) {
        const struct fuse_ctx *ctx = fuse_req_ctx(req);
        PyGILState_STATE g = PyGILState_Ensure();
        if (ioctl_cb) {
            err = errno_of(ioctl_cb,
                           PyObject_CallFunction(ioctl_cb, "KIi",
                                                 (unsigned long long)fi->fh,
                                                 (unsigned int)cmd, (int)ctx->pid));
        }
        PyGILState_Release(g);
    }
    if (err)
        fuse_reply_err(req, err);
    else
        fuse_reply_ioctl(req, 0, NULL, 0);
}

static void shim_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    const struct fuse_ctx *ctx = fuse_req_ctx(req);
    PyGILState_STATE g = PyGILState_Ensure();
    if (flush_note_cb) {
        PyObject *r = PyObject_CallFunction(flush_note_cb, "KiK",
                                            (unsigned long long)fi->fh, (int)ctx->pid,
                                            (unsigned long long)fi->lock_owner);
        if (r)
            Py_DECREF(r);
        else
            PyErr_WriteUnraisable(flush_note_cb);
    }
    PyGILState_Release(g);
    pyfuse3_flush(req, ino, fi);
}

static void (*pyfuse3_init)(void *, struct fuse_conn_info *);
static void (*pyfuse3_open)(fuse_req_t, fuse_ino_t, struct fuse_file_info *);
static void (*pyfuse3_create)(fuse_req_t, fuse_ino_t, const char *, mode_t,
                              struct fuse_file_info *);
static PyObject *interrupt_cb;                 /* owned; GIL */
static void (*pyfuse3_write)(fuse_req_t, fuse_ino_t, const char *, size_t, off_t,
                             struct fuse_file_info *);
static void (*pyfuse3_write_buf)(fuse_req_t, fuse_ino_t, struct fuse_bufvec *, off_t,
                                 struct fuse_file_info *);
static PyObject *write_note_cb;                /* owned; GIL */

/* A write the kernel sends from its page cache (writeback of a shared mmap)
 * carries FUSE_WRITE_CACHE (fi->writepage): its offset is the page's, even on
 * an O_APPEND descriptor.  Tell the daemon before pyfuse3's handler runs. */
static void note_write(struct fuse_file_info *fi, off_t off)
{
    PyGILState_STATE g = PyGILState_Ensure();
    if (write_note_cb) {
        PyObject *r = PyObject_CallFunction(write_note_cb, "KLi",
                                            (unsigned long long)fi->fh, (long long)off,
                                            (int)fi->writepage);
        if (r)
            Py_DECREF(r);
        else
            PyErr_WriteUnraisable(write_note_cb);
    }
    PyGILState_Release(g);
}

static void shim_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size,
                       off_t off, struct fuse_file_info *fi)
{
    note_write(fi, off);
    pyfuse3_write(req, ino, buf, size, off, fi);
}

static void shim_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv,
                           off_t off, struct fuse_file_info *fi)
{
    note_write(fi, off);
    pyfuse3_write_buf(req, ino, bufv, off, fi);
}

/* libfuse calls this when the kernel interrupts a request (a signal reached
 * the caller, SIGKILL included): memosfs ends that caller's waits with EINTR.
 * `data` is the caller's thread id. */
static void shim_interrupted(fuse_req_t req, void *data)
{
    PyGILState_STATE g = PyGILState_Ensure();
    if (interrupt_cb) {
        PyObject *r = PyObject_CallFunction(interrupt_cb, "i", (int)(intptr_t)data);
        if (r)
            Py_DECREF(r);
        else
            PyErr_WriteUnraisable(interrupt_cb);
    }
    PyGILState_Release(g);
}

/* open and create may wait (coherence protocol 2): make them interruptible. */
static void shim_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    fuse_req_interrupt_func(req, shim_interrupted,
                            (void *)(intptr_t)fuse_req_ctx(req)->pid);
    pyfuse3_open(req, ino, fi);
}

static void shim_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                        struct fuse_file_info *fi)
{
    fuse_req_interrupt_func(req, shim_interrupted,
                            (void *)(intptr_t)fuse_req_ctx(req)->pid);
    pyfuse3_create(req, parent, name, mode, fi);
}

/* pyfuse3's init, then: no automatic invalidation of a file's pages when its
 * mtime changes.  memosfs says when pages are stale (keep_cache at open,
 * invalidations on publish and coherence); a writer's pages must survive the
 * mtime the daemon reports for its draft, which is never the kernel's own. */
static void shim_init(void *userdata, struct fuse_conn_info *conn)
{
    if (pyfuse3_init)
        pyfuse3_init(userdata, conn);
    conn->want &= ~FUSE_CAP_AUTO_INVAL_DATA;
}

/* ---- the interposed libfuse entry point ---- */

__attribute__((visibility("default")))
struct fuse_session *fuse_session_new(struct fuse_args *args,
                                      const struct fuse_lowlevel_ops *op,
                                      size_t op_size, void *userdata)
{
    session_new_fn real = (session_new_fn)dlvsym(RTLD_NEXT, "fuse_session_new", "FUSE_3.0");
    if (!real)
        real = (session_new_fn)dlsym(RTLD_NEXT, "fuse_session_new");
    if (!real) {
        errno = ENOSYS;
        return NULL;
    }
    memset(&shim_ops, 0, sizeof shim_ops);
    memcpy(&shim_ops, op, op_size < sizeof shim_ops ? op_size : sizeof shim_ops);
    if (shim_ops.flush) {
        pyfuse3_flush = shim_ops.flush;
        shim_ops.flush = shim_flush;
    }
    pyfuse3_init = shim_ops.init;
    shim_ops.init = shim_init;
    if (shim_ops.write) {
        pyfuse3_write = shim_ops.write;
        shim_ops.write = shim_write;
    }
    if (shim_ops.write_buf) {
        pyfuse3_write_buf = shim_ops.write_buf;
        shim_ops.write_buf = shim_write_buf;
    }
    if (shim_ops.open) {
        pyfuse3_open = shim_ops.open;
        shim_ops.open = shim_open;
    }
    if (shim_ops.create) {
        pyfuse3_create = shim_ops.create;
        shim_ops.create = shim_create;
    }
    if (!shim_ops.fallocate)
        shim_ops.fallocate = shim_fallocate;
    if (!shim_ops.ioctl)
        shim_ops.ioctl = shim_ioctl;
    intercepted = 1;
    return real(args, &shim_ops, sizeof shim_ops, userdata);
}

/* ---- the Python module ---- */

static PyObject *py_install(PyObject *self, PyObject *args)
{
    PyObject *fa, *fl, *in = Py_None, *wn = Py_None, *io = Py_None;
    if (!PyArg_ParseTuple(args, "OO|OOO", &fa, &fl, &in, &wn, &io))
        return NULL;
    Py_XSETREF(ioctl_cb, io == Py_None ? NULL : Py_NewRef(io));
    Py_XSETREF(write_note_cb, wn == Py_None ? NULL : Py_NewRef(wn));
    Py_XSETREF(fallocate_cb, fa == Py_None ? NULL : Py_NewRef(fa));
    Py_XSETREF(flush_note_cb, fl == Py_None ? NULL : Py_NewRef(fl));
    Py_XSETREF(interrupt_cb, in == Py_None ? NULL : Py_NewRef(in));
    Py_RETURN_NONE;
}

static PyObject *py_active(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(intercepted);
}

static PyMethodDef methods[] = {
    {"install", py_install, METH_VARARGS,
     "install(fallocate, flush_note[, interrupted[, write_note[, ioctl]]]): the callables the "
     "added requests "
     "call (None: off)."},
    {"active", py_active, METH_NOARGS,
     "Whether the mounted session went through this library."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "memosfs._fuseshim",
    "fallocate and the flusher's pid for pyfuse3 (see native/fuse/fuseshim.c).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__fuseshim(void)
{
    return PyModule_Create(&module);
}
