/*
 * dispatch.c — the requests on their way to pyfuse3: the wrappers of its
 * low-level operations, and the fast path that answers some of them here.
 *
 * interpose.c hands shim_dispatch_wrap() pyfuse3's table of low-level
 * operations; each operation below is replaced by a shim_* wrapper that
 * keeps pyfuse3's handler (pyfuse3_*) and, unless the request is answered on
 * the spot, calls it:
 *
 *   init              pyfuse3's, then no automatic invalidation of a file's
 *                     pages when its mtime changes (shim_init)
 *   flush             fast_flush, else flush_note(fh, pid, lock_owner) (pyfuse3's
 *                     flush drops the caller's pid), then pyfuse3's
 *   release           fast_release
 *   write, write_buf  KILL_SUIDGID, fast_write, else write_note, then pyfuse3's
 *   read              fast_read
 *   getattr, lookup   fast_getattr, fast_lookup
 *   setattr           KILL_SUIDGID; of the size alone: fast_truncate
 *   getxattr          fast_getxattr
 *   open, create      (open: KILL_SUIDGID) fast_open, fast_create, else
 *                     pyfuse3's, interruptible (coherence protocol 2 may wait)
 *   fallocate, ioctl  added when pyfuse3 has none: upcalls.c answers them
 *
 * The fast path: reads and writes answered on the spot.  pyfuse3 turns every
 * request into a trio task: a coroutine, a scheduler round and an epoll
 * registration per request, ~100 µs on this kind of machine.  A write of
 * 4 KiB or a read of a pinned version needs none of that.  When the daemon
 * registers `fast_write`/`fast_read` (install_fast, upcalls.c), a read or
 * write first goes to that synchronous callable; it answers the request (a
 * byte count, bytes, or -errno) or returns None, and then the request takes
 * pyfuse3's path as before.  The callables run on the trio thread, like every
 * handler, so they see the same state.  The other fast_* callables work the
 * same way for their requests.
 *
 * Bursts.  A client streaming small writes sends its next request a few
 * microseconds after our reply.  After a request answered here, the shim
 * waits up to `burst_poll_ns` (GIL released) for the next one and, if it
 * comes, processes it on the spot; up to `burst_max` in a row, and only
 * while each is answered here: the first request that goes to pyfuse3 (any
 * other kind, or a read or write the callable declines) ends the burst, and
 * pyfuse3's loop awaits its task as if it had read that request itself
 * (pyfuse3 runs exactly one task per fuse_session_process_buf).  Other trio
 * tasks wait at most burst_max requests.
 *
 * fast_stats() counts the requests answered here, in bursts, and declined.
 */
#include "shim.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* ---- state ---- */

long shim_dispatch_burst_poll_ns = 30000;      /* ns a burst waits (GIL) */
int shim_dispatch_burst_max = 64;              /* requests a burst (GIL) */

/* pyfuse3's handlers, from its table (set once, by shim_dispatch_wrap) */
static void (*pyfuse3_init)(void *, struct fuse_conn_info *);
static void (*pyfuse3_flush)(fuse_req_t, fuse_ino_t, struct fuse_file_info *);
static void (*pyfuse3_release)(fuse_req_t, fuse_ino_t, struct fuse_file_info *);
static void (*pyfuse3_write)(fuse_req_t, fuse_ino_t, const char *, size_t, off_t,
                             struct fuse_file_info *);
static void (*pyfuse3_write_buf)(fuse_req_t, fuse_ino_t, struct fuse_bufvec *, off_t,
                                 struct fuse_file_info *);
static void (*pyfuse3_read)(fuse_req_t, fuse_ino_t, size_t, off_t, struct fuse_file_info *);
static void (*pyfuse3_getattr)(fuse_req_t, fuse_ino_t, struct fuse_file_info *);
static void (*pyfuse3_lookup)(fuse_req_t, fuse_ino_t, const char *);
static void (*pyfuse3_setattr)(fuse_req_t, fuse_ino_t, struct stat *, int,
                               struct fuse_file_info *);
static void (*pyfuse3_getxattr)(fuse_req_t, fuse_ino_t, const char *, size_t);
static void (*pyfuse3_open)(fuse_req_t, fuse_ino_t, struct fuse_file_info *);
static void (*pyfuse3_create)(fuse_req_t, fuse_ino_t, const char *, mode_t,
                              struct fuse_file_info *);

static int answered;                           /* the last request was answered here
                                                * (trio thread) */
static int burst_depth;                        /* > 0 inside burst() (trio thread) */
static struct fuse_buf burst_buf;              /* a burst's request (trio thread) */
/* fast_stats(), counted on the trio thread: */
static unsigned long long n_fast_writes;       /* writes answered here */
static unsigned long long n_fast_reads;        /* reads answered here */
static unsigned long long n_fast_xattrs;       /* getxattrs answered here */
static unsigned long long n_fast_other;        /* other requests answered here */
static unsigned long long n_burst;             /* requests taken by a burst */
static unsigned long long n_declined;          /* requests a callable sent to pyfuse3 */

/* ---- private prototypes ---- */

static void shim_init(void *userdata, struct fuse_conn_info *conn);
static void shim_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
static void shim_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
static void shim_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size,
                       off_t off, struct fuse_file_info *fi);
static void shim_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv,
                           off_t off, struct fuse_file_info *fi);
static void shim_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                      struct fuse_file_info *fi);
static void shim_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
static void shim_lookup(fuse_req_t req, fuse_ino_t parent, const char *name);
static void shim_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                         struct fuse_file_info *fi);
static void shim_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size);
static void shim_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi);
static void shim_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                        struct fuse_file_info *fi);

static int answer_kind(PyObject *cb, PyObject *r, fuse_req_t req, long *v);
static int fast_answer(PyObject *cb, PyObject *r, fuse_req_t req, int is_read);
static int fast_int(PyObject *cb, PyObject *r, fuse_req_t req);
static int fast_entry(PyObject *cb, PyObject *r, fuse_req_t req, int lookup);
static int fast_write(fuse_req_t req, const char *buf, size_t size, off_t off,
                      struct fuse_file_info *fi);
static int get_u64(PyObject *o, const char *name, unsigned long long *out);
static int get_f(PyObject *o, const char *name, double *out);
static int entry_from(PyObject *a, struct fuse_entry_param *e);
static int fileinfo_into(PyObject *o, struct fuse_file_info *fi);

static int finish(int done);
static void burst(void);

/* ---- API ---- */

/* pyfuse3's table ops becomes ours: each operation named above is wrapped
 * (pyfuse3's handler kept), fallocate and ioctl are added where missing. */
void shim_dispatch_wrap(struct fuse_lowlevel_ops *ops)
{
    if (ops->flush) {
        pyfuse3_flush = ops->flush;
        ops->flush = shim_flush;
    }
    if (ops->release) {
        pyfuse3_release = ops->release;
        ops->release = shim_release;
    }
    pyfuse3_init = ops->init;
    ops->init = shim_init;
    if (ops->write) {
        pyfuse3_write = ops->write;
        ops->write = shim_write;
    }
    if (ops->write_buf) {
        pyfuse3_write_buf = ops->write_buf;
        ops->write_buf = shim_write_buf;
    }
    if (ops->setattr) {
        pyfuse3_setattr = ops->setattr;
        ops->setattr = shim_setattr;
    }
    if (ops->getattr) {
        pyfuse3_getattr = ops->getattr;
        ops->getattr = shim_getattr;
    }
    if (ops->lookup) {
        pyfuse3_lookup = ops->lookup;
        ops->lookup = shim_lookup;
    }
    if (ops->getxattr) {
        pyfuse3_getxattr = ops->getxattr;
        ops->getxattr = shim_getxattr;
    }
    if (ops->read) {
        pyfuse3_read = ops->read;
        ops->read = shim_read;
    }
    if (ops->open) {
        pyfuse3_open = ops->open;
        ops->open = shim_open;
    }
    if (ops->create) {
        pyfuse3_create = ops->create;
        ops->create = shim_create;
    }
    if (!ops->fallocate)
        ops->fallocate = shim_up_fallocate;
    if (!ops->ioctl)
        ops->ioctl = shim_up_ioctl;
}

PyObject *shim_py_fast_stats(PyObject *self, PyObject *unused)
{
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K}", "fast_writes", n_fast_writes,
                         "fast_reads", n_fast_reads, "fast_xattrs", n_fast_xattrs,
                         "fast_other", n_fast_other,
                         "burst_requests", n_burst,
                         "fast_declined", n_declined);
}

/* ---- private: the wrappers ---- */

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

static void shim_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    const struct fuse_ctx *ctx = fuse_req_ctx(req);
    int done = 0;
    PyGILState_STATE g = PyGILState_Ensure();
    if (shim_up.fast_flush) {
        PyObject *r = PyObject_CallFunction(shim_up.fast_flush, "KiK",
                                            (unsigned long long)fi->fh, (int)ctx->pid,
                                            (unsigned long long)fi->lock_owner);
        done = fast_int(shim_up.fast_flush, r, req);
    }
    if (!done && shim_up.flush_note) {
        PyObject *r = PyObject_CallFunction(shim_up.flush_note, "KiK",
                                            (unsigned long long)fi->fh, (int)ctx->pid,
                                            (unsigned long long)fi->lock_owner);
        if (r)
            Py_DECREF(r);
        else
            PyErr_WriteUnraisable(shim_up.flush_note);
    }
    PyGILState_Release(g);
    if (finish(done))
        return;
    pyfuse3_flush(req, ino, fi);
}

static void shim_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    int done = 0;
    if (shim_up.fast_release) {
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *r = PyObject_CallFunction(shim_up.fast_release, "K",
                                            (unsigned long long)fi->fh);
        done = fast_int(shim_up.fast_release, r, req);
        PyGILState_Release(g);
    }
    if (finish(done))
        return;
    pyfuse3_release(req, ino, fi);
}

static void shim_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size,
                       off_t off, struct fuse_file_info *fi)
{
    shim_up_kill_suidgid(ino);
    PyGILState_STATE g = PyGILState_Ensure();
    int done = fast_write(req, buf, size, off, fi);
    PyGILState_Release(g);
    if (finish(done))
        return;
    shim_up_note_write(fi, off);
    pyfuse3_write(req, ino, buf, size, off, fi);
}

static void shim_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv,
                           off_t off, struct fuse_file_info *fi)
{
    int done = 0;
    shim_up_kill_suidgid(ino);
    if (bufv->count == 1 && !(bufv->buf[0].flags & FUSE_BUF_IS_FD) && bufv->idx == 0) {
        const struct fuse_buf *b = &bufv->buf[0];
        PyGILState_STATE g = PyGILState_Ensure();
        done = fast_write(req, (const char *)b->mem + bufv->off, b->size - bufv->off, off, fi);
        PyGILState_Release(g);
    }
    if (finish(done))
        return;
    shim_up_note_write(fi, off);
    pyfuse3_write_buf(req, ino, bufv, off, fi);
}

static void shim_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                      struct fuse_file_info *fi)
{
    int done = 0;
    if (shim_up.fast_read) {
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *r = PyObject_CallFunction(shim_up.fast_read, "KLn",
                                            (unsigned long long)fi->fh, (long long)off,
                                            (Py_ssize_t)size);
        done = fast_answer(shim_up.fast_read, r, req, 1);
        n_fast_reads += done;
        PyGILState_Release(g);
    }
    if (finish(done))
        return;
    pyfuse3_read(req, ino, size, off, fi);
}

static void shim_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    int done = 0;
    if (shim_up.fast_getattr) {
        const struct fuse_ctx *ctx = fuse_req_ctx(req);
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *r = PyObject_CallFunction(shim_up.fast_getattr, "KIIi",
                                            (unsigned long long)ino, (unsigned)ctx->uid,
                                            (unsigned)ctx->gid, (int)ctx->pid);
        done = fast_entry(shim_up.fast_getattr, r, req, 0);
        PyGILState_Release(g);
    }
    if (finish(done))
        return;
    pyfuse3_getattr(req, ino, fi);
}

/* lookup: +1 on the inode's lookup count when answered with an entry, as
 * the handler counts it. */
static void shim_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
    int done = 0;
    if (shim_up.fast_lookup) {
        const struct fuse_ctx *ctx = fuse_req_ctx(req);
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *r = PyObject_CallFunction(shim_up.fast_lookup, "KyIIi",
                                            (unsigned long long)parent, name,
                                            (unsigned)ctx->uid, (unsigned)ctx->gid,
                                            (int)ctx->pid);
        done = fast_entry(shim_up.fast_lookup, r, req, 1);
        PyGILState_Release(g);
    }
    if (finish(done))
        return;
    pyfuse3_lookup(req, parent, name);
}

/* setattr of the size alone (ftruncate, truncate(2); safetensors sets a
 * file's length before writing it): answered on the spot when the callable
 * says nothing can wait.  Any other setattr goes to pyfuse3. */
static void shim_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                         struct fuse_file_info *fi)
{
    int done = 0;
    shim_up_kill_suidgid(ino);
    if (shim_up.fast_truncate && to_set == FUSE_SET_ATTR_SIZE) {
        const struct fuse_ctx *ctx = fuse_req_ctx(req);
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *r = PyObject_CallFunction(shim_up.fast_truncate, "KLLIIi",
                                            (unsigned long long)ino,
                                            (long long)attr->st_size,
                                            fi ? (long long)fi->fh : -1LL,
                                            (unsigned)ctx->uid, (unsigned)ctx->gid,
                                            (int)ctx->pid);
        done = fast_entry(shim_up.fast_truncate, r, req, 0);
        PyGILState_Release(g);
    }
    if (finish(done))
        return;
    pyfuse3_setattr(req, ino, attr, to_set, fi);
}

/* getxattr: the kernel asks for security.capability before every write(2)
 * (file_remove_privs), so a writer's stream of small writes is a stream of
 * pairs; answered here, both halves stay off pyfuse3's path. */
static void shim_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
    int done = 0;
    if (shim_up.fast_getxattr) {
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *r = PyObject_CallFunction(shim_up.fast_getxattr, "Ky",
                                            (unsigned long long)ino, name);
        if (!r) {
            PyErr_WriteUnraisable(shim_up.fast_getxattr);
            fuse_reply_err(req, EIO);
            done = 1;
        } else if (r == Py_None) {
            n_declined++;
        } else if (PyLong_Check(r)) {
            long v = PyLong_AsLong(r);
            fuse_reply_err(req, v < 0 ? (int)-v : EIO);
            done = 1;
        } else if (PyBytes_Check(r)) {
            size_t len = (size_t)PyBytes_GET_SIZE(r);
            if (size == 0)
                fuse_reply_xattr(req, len);
            else if (len > size)
                fuse_reply_err(req, ERANGE);
            else
                fuse_reply_buf(req, PyBytes_AS_STRING(r), len);
            done = 1;
        } else {
            fuse_reply_err(req, EIO);
            done = 1;
        }
        Py_XDECREF(r);
        PyGILState_Release(g);
    }
    n_fast_xattrs += done;
    if (finish(done))
        return;
    pyfuse3_getxattr(req, ino, name, size);
}

/* open and create answered on the spot when nothing in them can wait (the
 * callables say: a reader of a version in memory, a new slot, coherence
 * protocol 0 or 1); otherwise pyfuse3's handler, interruptible (protocol 2
 * may wait). */
static void shim_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    int done = 0;
    shim_up_kill_suidgid(ino);
    if (shim_up.fast_open) {
        const struct fuse_ctx *ctx = fuse_req_ctx(req);
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *r = PyObject_CallFunction(shim_up.fast_open, "KiIIiI",
                                            (unsigned long long)ino, fi->flags,
                                            (unsigned)ctx->uid, (unsigned)ctx->gid,
                                            (int)ctx->pid, (unsigned)ctx->umask);
        if (!r) {
            PyErr_WriteUnraisable(shim_up.fast_open);
            fuse_reply_err(req, EIO);
            done = 1;
        } else if (r == Py_None) {
            n_declined++;
        } else if (PyLong_Check(r)) {
            long v = PyLong_AsLong(r);
            fuse_reply_err(req, v < 0 ? (int)-v : EIO);
            done = 1;
        } else if (fileinfo_into(r, fi) == 0) {
            /* a reader's close has nothing to publish: no FLUSH round trip
             * (FOPEN_NOFLUSH; its RELEASE still comes) */
            if ((fi->flags & O_ACCMODE) == O_RDONLY)
                fi->noflush = 1;
            fuse_reply_open(req, fi);
            done = 1;
        } else {
            PyErr_WriteUnraisable(shim_up.fast_open);
            fuse_reply_err(req, EIO);
            done = 1;
        }
        Py_XDECREF(r);
        n_fast_other += done;
        PyGILState_Release(g);
    }
    if (finish(done))
        return;
    fuse_req_interrupt_func(req, shim_up_interrupted,
                            (void *)(intptr_t)fuse_req_ctx(req)->pid);
    pyfuse3_open(req, ino, fi);
}

static void shim_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                        struct fuse_file_info *fi)
{
    int done = 0;
    if (shim_up.fast_create) {
        const struct fuse_ctx *ctx = fuse_req_ctx(req);
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *r = PyObject_CallFunction(shim_up.fast_create, "KyIiIIiI",
                                            (unsigned long long)parent, name, (unsigned)mode,
                                            fi->flags, (unsigned)ctx->uid, (unsigned)ctx->gid,
                                            (int)ctx->pid, (unsigned)ctx->umask);
        struct fuse_entry_param e;
        if (!r) {
            PyErr_WriteUnraisable(shim_up.fast_create);
            fuse_reply_err(req, EIO);
            done = 1;
        } else if (r == Py_None) {
            n_declined++;
        } else if (PyLong_Check(r)) {
            long v = PyLong_AsLong(r);
            fuse_reply_err(req, v < 0 ? (int)-v : EIO);
            done = 1;
        } else if (PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2 &&
                   fileinfo_into(PyTuple_GET_ITEM(r, 0), fi) == 0 &&
                   entry_from(PyTuple_GET_ITEM(r, 1), &e) == 0) {
            fuse_reply_create(req, &e, fi);
            done = 1;
        } else {
            if (PyErr_Occurred())
                PyErr_WriteUnraisable(shim_up.fast_create);
            fuse_reply_err(req, EIO);
            done = 1;
        }
        Py_XDECREF(r);
        n_fast_other += done;
        PyGILState_Release(g);
    }
    if (finish(done))
        return;
    fuse_req_interrupt_func(req, shim_up_interrupted,
                            (void *)(intptr_t)fuse_req_ctx(req)->pid);
    pyfuse3_create(req, parent, name, mode, fi);
}

/* ---- private: the fast answers ---- */

/* The first reading of a callable's answer r (a new reference, or NULL if
 * it raised), common to every kind of request: NULL -> EIO; None -> the
 * request goes to pyfuse3; an int -> *v (r released).  Returns 1 answered
 * (EIO), 0 declined, 2 an int in *v, -1 something else (r still held). */
static int answer_kind(PyObject *cb, PyObject *r, fuse_req_t req, long *v)
{
    if (!r) {
        PyErr_WriteUnraisable(cb);
        fuse_reply_err(req, EIO);
        return 1;
    }
    if (r == Py_None) {
        Py_DECREF(r);
        n_declined++;
        return 0;
    }
    if (!PyLong_Check(r))
        return -1;
    *v = PyLong_AsLong(r);
    Py_DECREF(r);
    if (PyErr_Occurred()) {
        PyErr_WriteUnraisable(cb);
        *v = -EIO;
    }
    return 2;
}

/* The callable's answer r (a new reference or NULL): 1 if the request was
 * answered, 0 if it goes to pyfuse3. */
static int fast_answer(PyObject *cb, PyObject *r, fuse_req_t req, int is_read)
{
    long v;
    int k = answer_kind(cb, r, req, &v);
    if (k == 2) {
        if (v < 0)
            fuse_reply_err(req, (int)-v);
        else if (is_read)
            fuse_reply_err(req, EIO);          /* (a read answers bytes) */
        else
            fuse_reply_write(req, (size_t)v);
        return 1;
    }
    if (k >= 0)
        return k;
    if (is_read && PyList_Check(r)) {
        /* views of a pinned version's pages: one writev from them (no copy
         * in the daemon) */
        Py_ssize_t n = PyList_GET_SIZE(r);
        Py_buffer views[64];
        struct iovec iov[64] = { { 0 } };
        Py_ssize_t got = 0;
        int bad = n > 64;
        for (; !bad && got < n; got++) {
            if (PyObject_GetBuffer(PyList_GET_ITEM(r, got), &views[got], PyBUF_SIMPLE) < 0) {
                bad = 1;
                break;
            }
            iov[got].iov_base = views[got].buf;
            iov[got].iov_len = (size_t)views[got].len;
        }
        if (bad) {
            if (PyErr_Occurred())
                PyErr_WriteUnraisable(cb);
            fuse_reply_err(req, EIO);
        } else {
            fuse_reply_iov(req, iov, (int)got);
        }
        for (Py_ssize_t i = 0; i < got; i++)
            PyBuffer_Release(&views[i]);
        Py_DECREF(r);
        return 1;
    }
    Py_buffer view;
    if (!is_read || PyObject_GetBuffer(r, &view, PyBUF_SIMPLE) < 0) {
        if (PyErr_Occurred())
            PyErr_WriteUnraisable(cb);
        Py_DECREF(r);
        fuse_reply_err(req, EIO);
        return 1;
    }
    fuse_reply_buf(req, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    Py_DECREF(r);
    return 1;
}

/* An answer that is an errno only (flush, release): r is 0 or -errno, or
 * None to go to pyfuse3.  1 if answered. */
static int fast_int(PyObject *cb, PyObject *r, fuse_req_t req)
{
    long v = 1;
    int k = answer_kind(cb, r, req, &v);
    if (k == 0 || k == 1)
        return k;
    if (k < 0)
        Py_DECREF(r);                          /* (not an int: EIO) */
    fuse_reply_err(req, v <= 0 ? (int)-v : EIO);
    n_fast_other++;
    return 1;
}

/* The answer of fast_getattr / fast_lookup: EntryAttributes, -errno, or
 * None.  1 if the request was answered. */
static int fast_entry(PyObject *cb, PyObject *r, fuse_req_t req, int lookup)
{
    long v;
    int k = answer_kind(cb, r, req, &v);
    if (k == 2) {
        fuse_reply_err(req, v < 0 ? (int)-v : EIO);
        n_fast_other++;
        return 1;
    }
    if (k >= 0)
        return k;
    struct fuse_entry_param e;
    int rc = entry_from(r, &e);
    Py_DECREF(r);
    if (rc < 0) {
        PyErr_WriteUnraisable(cb);
        fuse_reply_err(req, EIO);
        return 1;
    }
    if (lookup)
        fuse_reply_entry(req, &e);
    else
        fuse_reply_attr(req, &e.attr, e.attr_timeout);
    n_fast_other++;
    return 1;
}

/* fast_write's call: the request's bytes as a memoryview, released before
 * the answer is read.  GIL held.  1 if the request was answered. */
static int fast_write(fuse_req_t req, const char *buf, size_t size, off_t off,
                      struct fuse_file_info *fi)
{
    if (!shim_up.fast_write)
        return 0;
    PyObject *mv = PyMemoryView_FromMemory((char *)buf, (Py_ssize_t)size, PyBUF_READ);
    if (!mv) {
        PyErr_WriteUnraisable(shim_up.fast_write);
        return 0;
    }
    PyObject *r = PyObject_CallFunction(shim_up.fast_write, "KLOi", (unsigned long long)fi->fh,
                                        (long long)off, mv, (int)fi->writepage);
    /* the request's buffer goes away after this: nothing may keep a view */
    PyObject *rel = PyObject_CallMethod(mv, "release", NULL);
    if (rel)
        Py_DECREF(rel);
    else
        PyErr_WriteUnraisable(shim_up.fast_write);
    Py_DECREF(mv);
    int done = fast_answer(shim_up.fast_write, r, req, 0);
    n_fast_writes += done;
    return done;
}

/* A pyfuse3.EntryAttributes, read through its properties, into an entry.
 * 0, or -1 with a Python error set. */
static int get_u64(PyObject *o, const char *name, unsigned long long *out)
{
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v)
        return -1;
    *out = PyLong_AsUnsignedLongLong(v);
    Py_DECREF(v);
    return PyErr_Occurred() ? -1 : 0;
}

static int get_f(PyObject *o, const char *name, double *out)
{
    PyObject *v = PyObject_GetAttrString(o, name);
    if (!v)
        return -1;
    *out = PyFloat_AsDouble(v);
    Py_DECREF(v);
    return PyErr_Occurred() ? -1 : 0;
}

static int entry_from(PyObject *a, struct fuse_entry_param *e)
{
    unsigned long long ino, gen, mode, nlink, uid, gid, rdev, size, blksize, blocks;
    unsigned long long at, mt, ct;
    double attr_to, entry_to;
    if (get_u64(a, "st_ino", &ino) || get_u64(a, "generation", &gen) ||
        get_u64(a, "st_mode", &mode) || get_u64(a, "st_nlink", &nlink) ||
        get_u64(a, "st_uid", &uid) || get_u64(a, "st_gid", &gid) ||
        get_u64(a, "st_rdev", &rdev) || get_u64(a, "st_size", &size) ||
        get_u64(a, "st_blksize", &blksize) || get_u64(a, "st_blocks", &blocks) ||
        get_u64(a, "st_atime_ns", &at) || get_u64(a, "st_mtime_ns", &mt) ||
        get_u64(a, "st_ctime_ns", &ct) || get_f(a, "attr_timeout", &attr_to) ||
        get_f(a, "entry_timeout", &entry_to))
        return -1;
    memset(e, 0, sizeof *e);
    e->ino = ino;
    e->generation = gen;
    e->attr_timeout = attr_to;
    e->entry_timeout = entry_to;
    struct stat *st = &e->attr;
    st->st_ino = ino;
    st->st_mode = (mode_t)mode;
    st->st_nlink = (nlink_t)nlink;
    st->st_uid = (uid_t)uid;
    st->st_gid = (gid_t)gid;
    st->st_rdev = (dev_t)rdev;
    st->st_size = (off_t)size;
    st->st_blksize = (blksize_t)blksize;
    st->st_blocks = (blkcnt_t)blocks;
    st->st_atim.tv_sec = (time_t)(at / 1000000000ULL);
    st->st_atim.tv_nsec = (long)(at % 1000000000ULL);
    st->st_mtim.tv_sec = (time_t)(mt / 1000000000ULL);
    st->st_mtim.tv_nsec = (long)(mt % 1000000000ULL);
    st->st_ctim.tv_sec = (time_t)(ct / 1000000000ULL);
    st->st_ctim.tv_nsec = (long)(ct % 1000000000ULL);
    return 0;
}

/* A pyfuse3.FileInfo's fields into fi.  0, or -1 with a Python error set. */
static int fileinfo_into(PyObject *o, struct fuse_file_info *fi)
{
    unsigned long long fh, dio, keep, nonseek;
    if (get_u64(o, "fh", &fh) || get_u64(o, "direct_io", &dio) ||
        get_u64(o, "keep_cache", &keep) || get_u64(o, "nonseekable", &nonseek))
        return -1;
    fi->fh = fh;
    fi->direct_io = dio ? 1 : 0;
    fi->keep_cache = keep ? 1 : 0;
    fi->nonseekable = nonseek ? 1 : 0;
    return 0;
}

/* ---- private: bursts ---- */

/* After a shim handler's fast attempt: note whether the request was answered
 * here and, if so, take the client's next requests (burst).  Returns done. */
static int finish(int done)
{
    answered = done;
    if (done)
        burst();
    return done;
}

/* After a request answered here: take the next ones while they come within
 * burst_poll_ns and are answered here too (see above). */
static void burst(void)
{
    if (burst_depth || !shim_se || shim_dispatch_burst_max <= 0)
        return;
    burst_depth++;
    int fd = fuse_session_fd(shim_se);
    for (int i = 0; i < shim_dispatch_burst_max; i++) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        struct timespec ts = { .tv_sec = 0, .tv_nsec = shim_dispatch_burst_poll_ns };
        int n;
        PyGILState_STATE g = PyGILState_Ensure();
        Py_BEGIN_ALLOW_THREADS
        n = ppoll(&p, 1, &ts, NULL);
        Py_END_ALLOW_THREADS
        PyGILState_Release(g);
        if (n <= 0 || !(p.revents & POLLIN) || fuse_session_exited(shim_se))
            break;
        int res = fuse_session_receive_buf(shim_se, &burst_buf);
        if (res == -EINTR || res == -EAGAIN)
            continue;
        if (res <= 0)
            break;              /* pyfuse3's loop sees the same end at its next read */
        answered = 0;
        fuse_session_process_buf(shim_se, &burst_buf);
        if (!answered)
            break;              /* pyfuse3 has its task: it awaits it when we return */
        n_burst++;
    }
    burst_depth--;
}
