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
 *
 * Passthrough (kernel 6.9+; libfuse 3.14 has no API for it): the session's
 * own read and writev (see "the connection's own I/O" below) also carry the
 * kernel's FUSE passthrough.  set_passthrough(True) before the mount adds
 * FUSE_PASSTHROUGH to the INIT reply when the kernel offers it and libfuse
 * does not ask for the writeback cache (passthrough_granted() says whether
 * it did); backing_open(fd) -> id and backing_close(id) are the /dev/fuse
 * ioctls that register a backing file; attach(fh, id) marks the OPEN or
 * CREATE reply that will carry fh: the shim sets FOPEN_PASSTHROUGH and the
 * backing id in it (and clears the open flags the kernel refuses beside it,
 * direct_io and keep_cache included), and the kernel then reads, writes and
 * maps the backing file itself: no READ or WRITE reaches the daemon for
 * that open file.  The caller closes its backing ids; an open file keeps its
 * own reference.  Details at "passthrough" below.
 */
#define FUSE_USE_VERSION 34
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <poll.h>
#include <time.h>
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
#include <fuse_lowlevel.h>
#include <linux/fuse.h>
#include <unistd.h>

typedef struct fuse_session *(*session_new_fn)(struct fuse_args *,
                                               const struct fuse_lowlevel_ops *,
                                               size_t, void *);

static struct fuse_lowlevel_ops shim_ops;      /* pyfuse3's table plus ours */
static void (*pyfuse3_flush)(fuse_req_t, fuse_ino_t, struct fuse_file_info *);
static PyObject *fallocate_cb;                 /* owned; GIL */
static PyObject *flush_note_cb;                /* owned; GIL */
static int intercepted;                        /* fuse_session_new came here */

static void take_kill_suidgid(fuse_ino_t ino);

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

/* fallocate's requests the callback answers later (it returned None: it
 * waits for room in the memory tier on the request loop), each answered once
 * by fallocate_reply(token).  GIL. */
#define DEFERRED_MAX 64
static fuse_req_t deferred[DEFERRED_MAX];

static void shim_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset,
                           off_t length, struct fuse_file_info *fi)
{
    int err = EOPNOTSUPP;
    PyGILState_STATE g = PyGILState_Ensure();
    if (fallocate_cb) {
        int slot = -1;
        for (int i = 0; i < DEFERRED_MAX && slot < 0; i++)
            if (!deferred[i])
                slot = i;
        /* token 0: no room to defer it, the callback answers now */
        PyObject *r = PyObject_CallFunction(fallocate_cb, "KiLLi",
                                            (unsigned long long)fi->fh, mode,
                                            (long long)offset, (long long)length,
                                            slot + 1);
        if (r == Py_None && slot >= 0) {
            Py_DECREF(r);
            deferred[slot] = req;
            PyGILState_Release(g);
            return;
        }
        if (r == Py_None) {
            Py_DECREF(r);
            r = PyLong_FromLong(EIO);
        }
        err = errno_of(fallocate_cb, r);
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

static PyObject *fast_flush_cb;                /* owned; GIL (the fast path, below) */
static PyObject *fast_release_cb;              /* owned; GIL */
static void (*pyfuse3_release)(fuse_req_t, fuse_ino_t, struct fuse_file_info *);
static int fast_int(PyObject *cb, PyObject *r, fuse_req_t req);
static void burst(void);
static int answered;

/* After a shim handler's fast attempt: note whether the request was answered
 * here and, if so, take the client's next requests (burst).  Returns done. */
static int finish(int done)
{
    answered = done;
    if (done)
        burst();
    return done;
}

static void shim_flush(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    const struct fuse_ctx *ctx = fuse_req_ctx(req);
    int done = 0;
    PyGILState_STATE g = PyGILState_Ensure();
    if (fast_flush_cb) {
        PyObject *r = PyObject_CallFunction(fast_flush_cb, "KiK", (unsigned long long)fi->fh,
                                            (int)ctx->pid,
                                            (unsigned long long)fi->lock_owner);
        done = fast_int(fast_flush_cb, r, req);
    }
    if (!done && flush_note_cb) {
        PyObject *r = PyObject_CallFunction(flush_note_cb, "KiK",
                                            (unsigned long long)fi->fh, (int)ctx->pid,
                                            (unsigned long long)fi->lock_owner);
        if (r)
            Py_DECREF(r);
        else
            PyErr_WriteUnraisable(flush_note_cb);
    }
    PyGILState_Release(g);
    if (finish(done))
        return;
    pyfuse3_flush(req, ino, fi);
}

static void shim_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    int done = 0;
    if (fast_release_cb) {
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *r = PyObject_CallFunction(fast_release_cb, "K", (unsigned long long)fi->fh);
        done = fast_int(fast_release_cb, r, req);
        PyGILState_Release(g);
    }
    if (finish(done))
        return;
    pyfuse3_release(req, ino, fi);
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

/* ---- the fast path: reads and writes answered on the spot ----
 *
 * pyfuse3 turns every request into a trio task: a coroutine, a scheduler
 * round and an epoll registration per request, ~100 µs on this kind of
 * machine.  A write of 4 KiB or a read of a pinned version needs none of
 * that.  When the daemon registers `fast_write`/`fast_read`, a read or write
 * first goes to that synchronous callable; it answers the request (a byte
 * count, bytes, or -errno) or returns None, and then the request takes
 * pyfuse3's path as before.  The callables run on the trio thread, like every
 * handler, so they see the same state.
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
 */
static PyObject *fast_write_cb;                /* owned; GIL */
static PyObject *fast_read_cb;                 /* owned; GIL */
static PyObject *fast_getxattr_cb;             /* owned; GIL */
static PyObject *fast_getattr_cb;              /* owned; GIL */
static PyObject *fast_lookup_cb;               /* owned; GIL */
static void (*pyfuse3_getattr)(fuse_req_t, fuse_ino_t, struct fuse_file_info *);
static void (*pyfuse3_lookup)(fuse_req_t, fuse_ino_t, const char *);
static void (*pyfuse3_getxattr)(fuse_req_t, fuse_ino_t, const char *, size_t);
static void (*pyfuse3_read)(fuse_req_t, fuse_ino_t, size_t, off_t, struct fuse_file_info *);
static struct fuse_session *shim_se;
static unsigned long long n_fast_other;
static long burst_poll_ns = 30000;
static int burst_max = 64;
static int burst_depth;                        /* > 0 inside burst() */
/* answered (declared above): the last request was answered here */
static struct fuse_buf burst_buf;
static unsigned long long n_fast_writes, n_fast_reads, n_fast_xattrs, n_burst, n_declined;

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

static int fast_write(fuse_req_t req, const char *buf, size_t size, off_t off,
                      struct fuse_file_info *fi)
{
    if (!fast_write_cb)
        return 0;
    PyObject *mv = PyMemoryView_FromMemory((char *)buf, (Py_ssize_t)size, PyBUF_READ);
    if (!mv) {
        PyErr_WriteUnraisable(fast_write_cb);
        return 0;
    }
    PyObject *r = PyObject_CallFunction(fast_write_cb, "KLOi", (unsigned long long)fi->fh,
                                        (long long)off, mv, (int)fi->writepage);
    /* the request's buffer goes away after this: nothing may keep a view */
    PyObject *rel = PyObject_CallMethod(mv, "release", NULL);
    if (rel)
        Py_DECREF(rel);
    else
        PyErr_WriteUnraisable(fast_write_cb);
    Py_DECREF(mv);
    int done = fast_answer(fast_write_cb, r, req, 0);
    n_fast_writes += done;
    return done;
}

static void shim_write(fuse_req_t req, fuse_ino_t ino, const char *buf, size_t size,
                       off_t off, struct fuse_file_info *fi)
{
    take_kill_suidgid(ino);
    PyGILState_STATE g = PyGILState_Ensure();
    int done = fast_write(req, buf, size, off, fi);
    PyGILState_Release(g);
    if (finish(done))
        return;
    note_write(fi, off);
    pyfuse3_write(req, ino, buf, size, off, fi);
}

static void shim_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *bufv,
                           off_t off, struct fuse_file_info *fi)
{
    int done = 0;
    take_kill_suidgid(ino);
    if (bufv->count == 1 && !(bufv->buf[0].flags & FUSE_BUF_IS_FD) && bufv->idx == 0) {
        const struct fuse_buf *b = &bufv->buf[0];
        PyGILState_STATE g = PyGILState_Ensure();
        done = fast_write(req, (const char *)b->mem + bufv->off, b->size - bufv->off, off, fi);
        PyGILState_Release(g);
    }
    if (finish(done))
        return;
    note_write(fi, off);
    pyfuse3_write_buf(req, ino, bufv, off, fi);
}

static void shim_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off,
                      struct fuse_file_info *fi)
{
    int done = 0;
    if (fast_read_cb) {
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *r = PyObject_CallFunction(fast_read_cb, "KLn", (unsigned long long)fi->fh,
                                            (long long)off, (Py_ssize_t)size);
        done = fast_answer(fast_read_cb, r, req, 1);
        n_fast_reads += done;
        PyGILState_Release(g);
    }
    if (finish(done))
        return;
    pyfuse3_read(req, ino, size, off, fi);
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

static void shim_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    int done = 0;
    if (fast_getattr_cb) {
        const struct fuse_ctx *ctx = fuse_req_ctx(req);
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *r = PyObject_CallFunction(fast_getattr_cb, "KIIi", (unsigned long long)ino,
                                            (unsigned)ctx->uid, (unsigned)ctx->gid,
                                            (int)ctx->pid);
        done = fast_entry(fast_getattr_cb, r, req, 0);
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
    if (fast_lookup_cb) {
        const struct fuse_ctx *ctx = fuse_req_ctx(req);
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *r = PyObject_CallFunction(fast_lookup_cb, "KyIIi", (unsigned long long)parent,
                                            name, (unsigned)ctx->uid, (unsigned)ctx->gid,
                                            (int)ctx->pid);
        done = fast_entry(fast_lookup_cb, r, req, 1);
        PyGILState_Release(g);
    }
    if (finish(done))
        return;
    pyfuse3_lookup(req, parent, name);
}

/* setattr of the size alone (ftruncate, truncate(2); safetensors sets a
 * file's length before writing it): answered on the spot when the callable
 * says nothing can wait.  Any other setattr goes to pyfuse3. */
static PyObject *fast_truncate_cb;             /* owned; GIL */
static void (*pyfuse3_setattr)(fuse_req_t, fuse_ino_t, struct stat *, int,
                               struct fuse_file_info *);

static void shim_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int to_set,
                         struct fuse_file_info *fi)
{
    int done = 0;
    take_kill_suidgid(ino);
    if (fast_truncate_cb && to_set == FUSE_SET_ATTR_SIZE) {
        const struct fuse_ctx *ctx = fuse_req_ctx(req);
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *r = PyObject_CallFunction(fast_truncate_cb, "KLLIIi", (unsigned long long)ino,
                                            (long long)attr->st_size,
                                            fi ? (long long)fi->fh : -1LL,
                                            (unsigned)ctx->uid, (unsigned)ctx->gid,
                                            (int)ctx->pid);
        done = fast_entry(fast_truncate_cb, r, req, 0);
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
    if (fast_getxattr_cb) {
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *r = PyObject_CallFunction(fast_getxattr_cb, "Ky", (unsigned long long)ino,
                                            name);
        if (!r) {
            PyErr_WriteUnraisable(fast_getxattr_cb);
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

/* After a request answered here: take the next ones while they come within
 * burst_poll_ns and are answered here too (see above). */
static void burst(void)
{
    if (burst_depth || !shim_se || burst_max <= 0)
        return;
    burst_depth++;
    int fd = fuse_session_fd(shim_se);
    for (int i = 0; i < burst_max; i++) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        struct timespec ts = { .tv_sec = 0, .tv_nsec = burst_poll_ns };
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

/* open and create answered on the spot when nothing in them can wait (the
 * callables say: a reader of a version in memory, a new slot, coherence
 * protocol 0 or 1); otherwise pyfuse3's handler, interruptible (protocol 2
 * may wait). */
static PyObject *fast_open_cb;                 /* owned; GIL */
static PyObject *fast_create_cb;               /* owned; GIL */

static void shim_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
    int done = 0;
    take_kill_suidgid(ino);
    if (fast_open_cb) {
        const struct fuse_ctx *ctx = fuse_req_ctx(req);
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *r = PyObject_CallFunction(fast_open_cb, "KiIIiI", (unsigned long long)ino,
                                            fi->flags, (unsigned)ctx->uid, (unsigned)ctx->gid,
                                            (int)ctx->pid, (unsigned)ctx->umask);
        if (!r) {
            PyErr_WriteUnraisable(fast_open_cb);
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
            PyErr_WriteUnraisable(fast_open_cb);
            fuse_reply_err(req, EIO);
            done = 1;
        }
        Py_XDECREF(r);
        n_fast_other += done;
        PyGILState_Release(g);
    }
    if (finish(done))
        return;
    fuse_req_interrupt_func(req, shim_interrupted,
                            (void *)(intptr_t)fuse_req_ctx(req)->pid);
    pyfuse3_open(req, ino, fi);
}

static void shim_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode,
                        struct fuse_file_info *fi)
{
    int done = 0;
    if (fast_create_cb) {
        const struct fuse_ctx *ctx = fuse_req_ctx(req);
        PyGILState_STATE g = PyGILState_Ensure();
        PyObject *r = PyObject_CallFunction(fast_create_cb, "KyIiIIiI",
                                            (unsigned long long)parent, name, (unsigned)mode,
                                            fi->flags, (unsigned)ctx->uid, (unsigned)ctx->gid,
                                            (int)ctx->pid, (unsigned)ctx->umask);
        struct fuse_entry_param e;
        if (!r) {
            PyErr_WriteUnraisable(fast_create_cb);
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
                PyErr_WriteUnraisable(fast_create_cb);
            fuse_reply_err(req, EIO);
            done = 1;
        }
        Py_XDECREF(r);
        n_fast_other += done;
        PyGILState_Release(g);
    }
    if (finish(done))
        return;
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

/* ---- the connection's own I/O: INIT flags libfuse 3.14 does not know ----
 *
 * libfuse 3.14 builds the INIT reply from the capabilities it knows;
 * FUSE_HANDLE_KILLPRIV_V2 (kernel 5.11) is not among them.  With it the
 * kernel sets SB_NOSEC on the superblock and stops asking for
 * security.capability (GETXATTR) before every write(2); the server clears
 * suid/sgid itself when a write, truncate or O_TRUNC open says so (the
 * KILL_SUIDGID flags, noted below for the handlers).  fuse_session_mount is
 * interposed: once libfuse has mounted, the session's fd gets this library's
 * read and writev (fuse_session_custom_io), which note the INIT request and
 * add `extra_init_flags` (set_init_flags(), what the kernel offered only) to
 * its reply.  Every other request and reply passes through untouched, but
 * for the KILL_SUIDGID bits of WRITE, SETATTR and OPEN requests, noted per
 * request in `kill_suidgid_unique` (read by kill_suidgid()). */
static uint32_t extra_init_flags;              /* FUSE_* INIT flags to add (GIL) */
static uint32_t granted_init_flags;            /* of those, what the kernel got */
static uint64_t init_unique;                   /* the INIT request's id, until answered */
static uint32_t kernel_init_flags;             /* what the kernel offered */
static uint64_t kill_suidgid_unique;           /* the last request that asked to
                                                * clear suid/sgid (0: none) */
typedef int (*session_mount_fn)(struct fuse_session *, const char *);

/* Every request the kernel sent, by opcode (bench clients --profile, stats
 * `requests`): counted as it is read, whichever way it is then answered. */
#define OP_SLOTS 64
static uint64_t op_count[OP_SLOTS];            /* [0]: opcodes >= OP_SLOTS */

/* ---- passthrough: the kernel reads and writes a backing file itself ----
 *
 * Kernel 6.9+ (CONFIG_FUSE_PASSTHROUGH) lets a server answer OPEN or CREATE
 * with FOPEN_PASSTHROUGH and a backing id: the kernel then sends no READ or
 * WRITE for that open file and does the I/O (mmap included) on the backing
 * file.  libfuse 3.14 knows none of it, and Debian's <linux/fuse.h> (7.38)
 * lacks the fields, so they are spelled out here from the kernel's
 * include/uapi/linux/fuse.h:
 *
 *   INIT: FUSE_PASSTHROUGH is bit 37 of the 64 flags, i.e. bit 5 of flags2
 *     (fuse_init_in: flags2 at offset 16, present when flags has
 *     FUSE_INIT_EXT); the reply carries it in flags2 (fuse_init_out offset
 *     32) with FUSE_INIT_EXT in flags and max_stack_depth (offset 36) = 1:
 *     backing files may not themselves be on a stacked filesystem (ELOOP).
 *     The kernel ignores the flag when the reply also has
 *     FUSE_WRITEBACK_CACHE, so then it is not added.
 *   OPEN/CREATE reply: fuse_open_out {fh u64, open_flags u32, backing_id
 *     i32}; CREATE's is the last 16 bytes after fuse_entry_out (libfuse
 *     3.14 sends both in one iovec).
 *   /dev/fuse ioctls: FUSE_DEV_IOC_BACKING_OPEN(struct fuse_backing_map)
 *     -> id (CAP_SYS_ADMIN), FUSE_DEV_IOC_BACKING_CLOSE(u32 id).
 */
#define PT_INIT_EXT          (1u << 30)        /* FUSE_INIT_EXT */
#define PT_FLAGS2_BIT        (1u << 5)         /* FUSE_PASSTHROUGH (1ULL << 37) >> 32 */
#define PT_FOPEN_PASSTHROUGH (1u << 7)         /* FOPEN_PASSTHROUGH */
#define PT_INIT_IN_FLAGS2    16                /* offsetof(fuse_init_in, flags2) */
#define PT_INIT_OUT_FLAGS2   32                /* offsetof(fuse_init_out, flags2) */
#define PT_INIT_OUT_STACK    36                /* offsetof(fuse_init_out, max_stack_depth) */
#define PT_OPEN_OUT_SIZE     16                /* sizeof(struct fuse_open_out) */

struct pt_backing_map {                        /* struct fuse_backing_map */
    int32_t fd;
    uint32_t flags;
    uint64_t padding;
};
#define PT_DEV_IOC_BACKING_OPEN  _IOW(229, 1, struct pt_backing_map)
#define PT_DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)

_Static_assert(sizeof(struct fuse_init_in) == 64 &&
               offsetof(struct fuse_init_in, flags2) == PT_INIT_IN_FLAGS2,
               "fuse_init_in layout");
_Static_assert(sizeof(struct fuse_init_out) == 64 &&
               offsetof(struct fuse_init_out, flags2) == PT_INIT_OUT_FLAGS2,
               "fuse_init_out layout");
_Static_assert(sizeof(struct fuse_open_out) == PT_OPEN_OUT_SIZE &&
               offsetof(struct fuse_open_out, open_flags) == 8,
               "fuse_open_out layout");
_Static_assert(sizeof(struct pt_backing_map) == 16, "fuse_backing_map layout");

/* The open flags the kernel accepts beside FOPEN_PASSTHROUGH
 * (FOPEN_PASSTHROUGH_MASK in fs/fuse/iomode.c less FOPEN_DIRECT_IO, which
 * would send reads and writes to the server again, and
 * FOPEN_PARALLEL_DIRECT_WRITES, which needs it); any other (keep_cache,
 * nonseekable, ...) makes the open fail with EIO. */
#define PT_KEEP_FLAGS FOPEN_NOFLUSH

static int pt_wanted;                          /* set_passthrough(True) (GIL) */
static int pt_granted;                         /* the INIT reply carried it */
static uint32_t kernel_init_flags2;            /* what the kernel offered, flags2 */
static pthread_mutex_t pt_lock = PTHREAD_MUTEX_INITIALIZER;

/* OPEN and CREATE requests not answered yet (only while granted): unique
 * 0 is a free slot (the kernel never uses it for a request). */
#define PT_REQS 256
static struct { uint64_t unique; uint64_t seq; uint32_t opcode; } pt_req[PT_REQS];
static int pt_req_count;                       /* held; changed under pt_lock */

/* attach(fh, id): the next OPEN/CREATE reply with that fh passes through. */
#define PT_NOTES 256
static struct { uint64_t fh; uint64_t seq; int32_t id; int used; } pt_note[PT_NOTES];
static int pt_note_count;
static uint64_t pt_seq;                        /* the age of notes of both tables */

static uint64_t n_pt_opens;                    /* replies turned into passthrough opens */
static uint64_t n_pt_notes_dropped;            /* attach notes pushed out unused */
static uint64_t n_pt_reqs_dropped;             /* requests pushed out unanswered */

/* io_read: an OPEN or CREATE request to watch for. */
static void pt_note_request(uint64_t unique, uint32_t opcode)
{
    pthread_mutex_lock(&pt_lock);
    int slot = -1, oldest = 0;
    for (int i = 0; i < PT_REQS && slot < 0; i++) {
        if (!pt_req[i].unique)
            slot = i;
        else if (pt_req[i].seq < pt_req[oldest].seq)
            oldest = i;
    }
    if (slot < 0) {                            /* full: the oldest note goes */
        slot = oldest;
        n_pt_reqs_dropped++;
    } else {
        __atomic_fetch_add(&pt_req_count, 1, __ATOMIC_RELAXED);
    }
    pt_req[slot].unique = unique;
    pt_req[slot].opcode = opcode;
    pt_req[slot].seq = ++pt_seq;
    pthread_mutex_unlock(&pt_lock);
}

/* The opcode of a watched request `unique`, forgetting it; 0 if not watched.
 * pt_lock held. */
static uint32_t pt_take_request(uint64_t unique)
{
    for (int i = 0; i < PT_REQS; i++)
        if (pt_req[i].unique == unique) {
            pt_req[i].unique = 0;
            __atomic_fetch_sub(&pt_req_count, 1, __ATOMIC_RELAXED);
            return pt_req[i].opcode;
        }
    return 0;
}

/* The attach note of fh, forgetting it: its backing id, or 0.  pt_lock held. */
static int32_t pt_take_note(uint64_t fh)
{
    for (int i = 0; i < PT_NOTES; i++)
        if (pt_note[i].used && pt_note[i].fh == fh) {
            pt_note[i].used = 0;
            pt_note_count--;
            return pt_note[i].id;
        }
    return 0;
}

/* A pointer to bytes [off, off + n) of a reply's payload (iov[1..]) when
 * they lie in one iovec, else NULL. */
static void *pt_payload_at(struct iovec *iov, int count, size_t off, size_t n)
{
    for (int i = 1; i < count; i++) {
        if (off < iov[i].iov_len)
            return off + n <= iov[i].iov_len ? (char *)iov[i].iov_base + off : NULL;
        off -= iov[i].iov_len;
    }
    return NULL;
}

/* io_writev: a reply to a watched OPEN or CREATE.  Success and an attached
 * fh: the reply becomes a passthrough open (returns 1). */
static int pt_reply(struct iovec *iov, int count)
{
    struct fuse_out_header *oh = iov[0].iov_base;
    int done = 0;
    if (oh->unique == 0 || !__atomic_load_n(&pt_req_count, __ATOMIC_RELAXED))
        return 0;                              /* (0: a notification) */
    size_t plen = 0;
    for (int i = 1; i < count; i++)
        plen += iov[i].iov_len;
    /* only an error, an open_out, or an entry_out (120 or 128) + open_out */
    if (oh->error == 0 && plen != PT_OPEN_OUT_SIZE &&
        plen != sizeof(struct fuse_entry_out) + PT_OPEN_OUT_SIZE &&
        plen != FUSE_COMPAT_ENTRY_OUT_SIZE + PT_OPEN_OUT_SIZE)
        return 0;
    pthread_mutex_lock(&pt_lock);
    uint32_t op = pt_take_request(oh->unique);
    if (op && oh->error == 0 &&
        ((op == FUSE_OPEN && plen == PT_OPEN_OUT_SIZE) ||
         (op == FUSE_CREATE && plen > PT_OPEN_OUT_SIZE))) {
        struct fuse_open_out *o = pt_payload_at(iov, count, plen - PT_OPEN_OUT_SIZE,
                                                PT_OPEN_OUT_SIZE);
        int32_t id = o ? pt_take_note(o->fh) : 0;
        if (id > 0) {
            o->open_flags = (o->open_flags & PT_KEEP_FLAGS) | PT_FOPEN_PASSTHROUGH;
            memcpy(&o->padding, &id, sizeof id);    /* backing_id */
            done = 1;
        }
    }
    pthread_mutex_unlock(&pt_lock);
    return done;
}

/* The INIT reply o (len bytes): add passthrough when wanted, offered and
 * compatible with what libfuse asks for.  Returns whether it was added. */
static int pt_init_reply(unsigned char *o, size_t len)
{
    uint32_t flags, flags2;
    if (!pt_wanted || !(kernel_init_flags & PT_INIT_EXT) ||
        !(kernel_init_flags2 & PT_FLAGS2_BIT) || len < PT_INIT_OUT_STACK + 4)
        return 0;
    memcpy(&flags, o + offsetof(struct fuse_init_out, flags), 4);
    if (flags & FUSE_WRITEBACK_CACHE)
        return 0;                              /* the kernel would ignore it */
    memcpy(&flags2, o + PT_INIT_OUT_FLAGS2, 4);
    flags |= PT_INIT_EXT;
    flags2 |= PT_FLAGS2_BIT;
    uint32_t depth = 1;
    memcpy(o + offsetof(struct fuse_init_out, flags), &flags, 4);
    memcpy(o + PT_INIT_OUT_FLAGS2, &flags2, 4);
    memcpy(o + PT_INIT_OUT_STACK, &depth, 4);
    return 1;
}

static ssize_t io_read(int fd, void *buf, size_t len, void *userdata)
{
    ssize_t n = read(fd, buf, len);
    if (n < (ssize_t)sizeof(struct fuse_in_header))
        return n;
    const struct fuse_in_header *h = buf;
    __atomic_fetch_add(&op_count[h->opcode < OP_SLOTS ? h->opcode : 0], 1, __ATOMIC_RELAXED);
    const char *arg = (const char *)buf + sizeof *h;
    size_t alen = (size_t)n - sizeof *h;
    switch (h->opcode) {
    case FUSE_INIT:
        if (alen >= 4 * sizeof(uint32_t)) {
            init_unique = h->unique;
            kernel_init_flags = ((const struct fuse_init_in *)arg)->flags;
            /* flags2 follows flags when the kernel says FUSE_INIT_EXT */
            kernel_init_flags2 = 0;
            if ((kernel_init_flags & PT_INIT_EXT) && alen >= PT_INIT_IN_FLAGS2 + 4)
                memcpy(&kernel_init_flags2, arg + PT_INIT_IN_FLAGS2, 4);
        }
        break;
    case FUSE_WRITE:
        if (alen >= sizeof(struct fuse_write_in) &&
            (((const struct fuse_write_in *)arg)->write_flags & FUSE_WRITE_KILL_SUIDGID))
            kill_suidgid_unique = h->unique;
        break;
    case FUSE_SETATTR:
        if (alen >= sizeof(struct fuse_setattr_in) &&
            (((const struct fuse_setattr_in *)arg)->valid & FATTR_KILL_SUIDGID))
            kill_suidgid_unique = h->unique;
        break;
    case FUSE_OPEN:
        if (alen >= sizeof(struct fuse_open_in) &&
            (((const struct fuse_open_in *)arg)->open_flags & FUSE_OPEN_KILL_SUIDGID))
            kill_suidgid_unique = h->unique;
        if (__atomic_load_n(&pt_granted, __ATOMIC_RELAXED))
            pt_note_request(h->unique, FUSE_OPEN);
        break;
    case FUSE_CREATE:
        if (__atomic_load_n(&pt_granted, __ATOMIC_RELAXED))
            pt_note_request(h->unique, FUSE_CREATE);
        break;
    default:
        break;
    }
    return n;
}

static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata)
{
    if (init_unique && count >= 2 && iov[0].iov_len >= sizeof(struct fuse_out_header)) {
        struct fuse_out_header *oh = iov[0].iov_base;
        if (oh->unique == init_unique) {
            if (oh->error == 0 && iov[1].iov_len >= 4 * sizeof(uint32_t)) {
                struct fuse_init_out *o = iov[1].iov_base;
                granted_init_flags = extra_init_flags & kernel_init_flags;
                o->flags |= granted_init_flags;
                if (pt_init_reply(iov[1].iov_base, iov[1].iov_len))
                    __atomic_store_n(&pt_granted, 1, __ATOMIC_RELAXED);
            }
            init_unique = 0;
        }
    }
    int pt = 0;
    if (count >= 1 && iov[0].iov_len >= sizeof(struct fuse_out_header) &&
        __atomic_load_n(&pt_granted, __ATOMIC_RELAXED))
        pt = pt_reply(iov, count);
    ssize_t n = writev(fd, iov, count);
    if (pt && n >= 0)
        __atomic_fetch_add(&n_pt_opens, 1, __ATOMIC_RELAXED);
    return n;
}

static const struct fuse_custom_io shim_io = { io_writev, io_read, NULL, NULL };
static int counting;                           /* the session reads through io_read */

static const struct { int op; const char *name; } op_names[] = {
    {FUSE_LOOKUP, "lookup"}, {FUSE_FORGET, "forget"}, {FUSE_GETATTR, "getattr"},
    {FUSE_SETATTR, "setattr"}, {FUSE_READLINK, "readlink"}, {FUSE_SYMLINK, "symlink"},
    {FUSE_MKNOD, "mknod"}, {FUSE_MKDIR, "mkdir"}, {FUSE_UNLINK, "unlink"},
    {FUSE_RMDIR, "rmdir"}, {FUSE_RENAME, "rename"}, {FUSE_LINK, "link"},
    {FUSE_OPEN, "open"}, {FUSE_READ, "read"}, {FUSE_WRITE, "write"},
    {FUSE_STATFS, "statfs"}, {FUSE_RELEASE, "release"}, {FUSE_FSYNC, "fsync"},
    {FUSE_SETXATTR, "setxattr"}, {FUSE_GETXATTR, "getxattr"},
    {FUSE_LISTXATTR, "listxattr"}, {FUSE_REMOVEXATTR, "removexattr"},
    {FUSE_FLUSH, "flush"}, {FUSE_INIT, "init"}, {FUSE_OPENDIR, "opendir"},
    {FUSE_READDIR, "readdir"}, {FUSE_RELEASEDIR, "releasedir"},
    {FUSE_FSYNCDIR, "fsyncdir"}, {FUSE_GETLK, "getlk"}, {FUSE_SETLK, "setlk"},
    {FUSE_SETLKW, "setlkw"}, {FUSE_ACCESS, "access"}, {FUSE_CREATE, "create"},
    {FUSE_INTERRUPT, "interrupt"}, {FUSE_BMAP, "bmap"}, {FUSE_DESTROY, "destroy"},
    {FUSE_IOCTL, "ioctl"}, {FUSE_POLL, "poll"}, {FUSE_NOTIFY_REPLY, "notify_reply"},
    {FUSE_BATCH_FORGET, "batch_forget"}, {FUSE_FALLOCATE, "fallocate"},
    {FUSE_READDIRPLUS, "readdirplus"}, {FUSE_RENAME2, "rename2"}, {FUSE_LSEEK, "lseek"},
    {FUSE_COPY_FILE_RANGE, "copy_file_range"},
};

static PyObject *kill_suidgid_cb;              /* owned; GIL: kill_suidgid(ino) */

/* At the top of the WRITE, SETATTR and OPEN wrappers: libfuse dispatches the
 * request it has just read, so a KILL_SUIDGID note is this request's.  The
 * callable clears the inode's suid/sgid bits before its handler runs. */
static void take_kill_suidgid(fuse_ino_t ino)
{
    if (!kill_suidgid_unique)
        return;
    kill_suidgid_unique = 0;
    if (!kill_suidgid_cb)
        return;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction(kill_suidgid_cb, "K", (unsigned long long)ino);
    if (!r)
        PyErr_WriteUnraisable(kill_suidgid_cb);
    Py_XDECREF(r);
    PyGILState_Release(g);
}

__attribute__((visibility("default")))
int fuse_session_mount(struct fuse_session *se, const char *mountpoint)
{
    session_mount_fn real = (session_mount_fn)dlvsym(RTLD_NEXT, "fuse_session_mount",
                                                     "FUSE_3.0");
    if (!real)
        real = (session_mount_fn)dlsym(RTLD_NEXT, "fuse_session_mount");
    if (!real)
        return -1;
    int rc = real(se, mountpoint);
    /* the session reads and writes /dev/fuse through io_read/io_writev: plain
     * read(2) and writev(2) as libfuse's own, plus the request counts and the
     * INIT flags set_init_flags() adds */
    if (rc == 0 && se == shim_se &&
        fuse_session_custom_io(se, &shim_io, fuse_session_fd(se)) != 0) {
        extra_init_flags = 0;                  /* (init_flags() says nothing was added) */
        counting = 0;
    } else if (rc == 0 && se == shim_se)
        counting = 1;
    return rc;
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
    if (shim_ops.release) {
        pyfuse3_release = shim_ops.release;
        shim_ops.release = shim_release;
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
    if (shim_ops.setattr) {
        pyfuse3_setattr = shim_ops.setattr;
        shim_ops.setattr = shim_setattr;
    }
    if (shim_ops.getattr) {
        pyfuse3_getattr = shim_ops.getattr;
        shim_ops.getattr = shim_getattr;
    }
    if (shim_ops.lookup) {
        pyfuse3_lookup = shim_ops.lookup;
        shim_ops.lookup = shim_lookup;
    }
    if (shim_ops.getxattr) {
        pyfuse3_getxattr = shim_ops.getxattr;
        shim_ops.getxattr = shim_getxattr;
    }
    if (shim_ops.read) {
        pyfuse3_read = shim_ops.read;
        shim_ops.read = shim_read;
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
    shim_se = real(args, &shim_ops, sizeof shim_ops, userdata);
    return shim_se;
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

static PyObject *py_fallocate_reply(PyObject *self, PyObject *args)
{
    int token, err;
    if (!PyArg_ParseTuple(args, "ii:fallocate_reply", &token, &err))
        return NULL;
    if (token < 1 || token > DEFERRED_MAX || !deferred[token - 1]) {
        PyErr_SetString(PyExc_ValueError, "fallocate_reply: no such deferred request");
        return NULL;
    }
    fuse_req_t req = deferred[token - 1];
    deferred[token - 1] = NULL;
    fuse_reply_err(req, err < 0 ? -err : err);
    Py_RETURN_NONE;
}

static PyObject *py_install_fast(PyObject *self, PyObject *args)
{
    PyObject *w, *r, *x = Py_None, *fl = Py_None, *re = Py_None, *ga = Py_None,
             *lk = Py_None, *op = Py_None, *cr = Py_None, *tr = Py_None;
    long poll_ns = burst_poll_ns;
    int bmax = burst_max;
    if (!PyArg_ParseTuple(args, "OO|OOOOOOOOli", &w, &r, &x, &fl, &re, &ga, &lk, &op, &cr,
                          &tr, &poll_ns, &bmax))
        return NULL;
    if (poll_ns < 0 || poll_ns > 999999999L || bmax < 0) {
        PyErr_SetString(PyExc_ValueError, "poll_ns in [0, 1e9), burst_max >= 0");
        return NULL;
    }
    Py_XSETREF(fast_write_cb, w == Py_None ? NULL : Py_NewRef(w));
    Py_XSETREF(fast_read_cb, r == Py_None ? NULL : Py_NewRef(r));
    Py_XSETREF(fast_getxattr_cb, x == Py_None ? NULL : Py_NewRef(x));
    Py_XSETREF(fast_flush_cb, fl == Py_None ? NULL : Py_NewRef(fl));
    Py_XSETREF(fast_release_cb, re == Py_None ? NULL : Py_NewRef(re));
    Py_XSETREF(fast_getattr_cb, ga == Py_None ? NULL : Py_NewRef(ga));
    Py_XSETREF(fast_lookup_cb, lk == Py_None ? NULL : Py_NewRef(lk));
    Py_XSETREF(fast_open_cb, op == Py_None ? NULL : Py_NewRef(op));
    Py_XSETREF(fast_create_cb, cr == Py_None ? NULL : Py_NewRef(cr));
    Py_XSETREF(fast_truncate_cb, tr == Py_None ? NULL : Py_NewRef(tr));
    burst_poll_ns = poll_ns;
    burst_max = bmax;
    Py_RETURN_NONE;
}

static PyObject *py_fast_stats(PyObject *self, PyObject *unused)
{
    return Py_BuildValue("{s:K,s:K,s:K,s:K,s:K,s:K}", "fast_writes", n_fast_writes,
                         "fast_reads", n_fast_reads, "fast_xattrs", n_fast_xattrs,
                         "fast_other", n_fast_other,
                         "burst_requests", n_burst,
                         "fast_declined", n_declined);
}

static PyObject *py_active(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(intercepted);
}

static PyObject *py_set_init_flags(PyObject *self, PyObject *arg)
{
    unsigned long v = PyLong_AsUnsignedLong(arg);
    if (v == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    extra_init_flags = (uint32_t)v;
    Py_RETURN_NONE;
}

static PyObject *py_init_flags(PyObject *self, PyObject *unused)
{
    return Py_BuildValue("(kk)", (unsigned long)kernel_init_flags,
                         (unsigned long)granted_init_flags);
}

/* d[name] = c when c is not 0; -1 with an exception set on failure. */
static int put_count(PyObject *d, const char *name, uint64_t c)
{
    if (!c)
        return 0;
    PyObject *v = PyLong_FromUnsignedLongLong(c);
    int rc = v ? PyDict_SetItemString(d, name, v) : -1;
    Py_XDECREF(v);
    return rc;
}

static PyObject *py_op_counts(PyObject *self, PyObject *unused)
{
    if (!counting)
        Py_RETURN_NONE;
    PyObject *d = PyDict_New();
    if (!d)
        return NULL;
    int named[OP_SLOTS] = {0};
    uint64_t other = __atomic_load_n(&op_count[0], __ATOMIC_RELAXED);
    for (size_t i = 0; i < sizeof op_names / sizeof op_names[0]; i++) {
        int op = op_names[i].op;
        if (op <= 0 || op >= OP_SLOTS)
            continue;
        named[op] = 1;
        if (put_count(d, op_names[i].name,
                      __atomic_load_n(&op_count[op], __ATOMIC_RELAXED)) < 0)
            goto fail;
    }
    for (int op = 1; op < OP_SLOTS; op++)
        if (!named[op])
            other += __atomic_load_n(&op_count[op], __ATOMIC_RELAXED);
    if (put_count(d, "other", other) < 0)
        goto fail;
    return d;
fail:
    Py_DECREF(d);
    return NULL;
}

static PyObject *py_set_kill_suidgid(PyObject *self, PyObject *cb)
{
    Py_XSETREF(kill_suidgid_cb, cb == Py_None ? NULL : Py_NewRef(cb));
    Py_RETURN_NONE;
}

/* ---- passthrough, the Python side (see "passthrough" above) ---- */

static PyObject *py_set_passthrough(PyObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    pt_wanted = on;
    Py_RETURN_NONE;
}

static PyObject *py_passthrough_granted(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(__atomic_load_n(&pt_granted, __ATOMIC_RELAXED));
}

/* The mounted session's /dev/fuse descriptor, or -1 with ENODEV set. */
static int pt_session_fd(void)
{
    int fd = shim_se && counting ? fuse_session_fd(shim_se) : -1;
    if (fd < 0) {
        errno = ENODEV;
        PyErr_SetFromErrno(PyExc_OSError);
    }
    return fd;
}

static PyObject *py_backing_open(PyObject *self, PyObject *arg)
{
    int bfd = PyObject_AsFileDescriptor(arg);
    if (bfd < 0)
        return NULL;
    int sfd = pt_session_fd();
    if (sfd < 0)
        return NULL;
    struct pt_backing_map map = { .fd = bfd, .flags = 0, .padding = 0 };
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ioctl(sfd, PT_DEV_IOC_BACKING_OPEN, &map);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLong(rc);
}

static PyObject *py_backing_close(PyObject *self, PyObject *arg)
{
    long id = PyLong_AsLong(arg);
    if (id == -1 && PyErr_Occurred())
        return NULL;
    if (id <= 0 || id > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "backing_close: a backing id is 1 or more");
        return NULL;
    }
    int sfd = pt_session_fd();
    if (sfd < 0)
        return NULL;
    uint32_t v = (uint32_t)id;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = ioctl(sfd, PT_DEV_IOC_BACKING_CLOSE, &v);
    Py_END_ALLOW_THREADS
    if (rc < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *py_attach(PyObject *self, PyObject *args)
{
    unsigned long long fh;
    long id;
    if (!PyArg_ParseTuple(args, "Kl:attach", &fh, &id))
        return NULL;
    if (id <= 0 || id > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "attach: a backing id is 1 or more");
        return NULL;
    }
    if (!__atomic_load_n(&pt_granted, __ATOMIC_RELAXED)) {
        errno = EOPNOTSUPP;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    pthread_mutex_lock(&pt_lock);
    int slot = -1, oldest = 0;
    for (int i = 0; i < PT_NOTES; i++) {
        if (pt_note[i].used && pt_note[i].fh == fh) {
            slot = i;                          /* a new note for the same fh */
            pt_note_count--;
            break;
        }
        if (!pt_note[i].used && slot < 0)
            slot = i;
        if (pt_note[i].used && pt_note[i].seq < pt_note[oldest].seq)
            oldest = i;
    }
    if (slot < 0) {                            /* full: the oldest note goes */
        slot = oldest;
        pt_note_count--;
        n_pt_notes_dropped++;
    }
    pt_note[slot].fh = fh;
    pt_note[slot].id = (int32_t)id;
    pt_note[slot].seq = ++pt_seq;
    pt_note[slot].used = 1;
    pt_note_count++;
    pthread_mutex_unlock(&pt_lock);
    Py_RETURN_NONE;
}

static PyObject *py_detach(PyObject *self, PyObject *arg)
{
    unsigned long long fh = PyLong_AsUnsignedLongLong(arg);
    if (fh == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    pthread_mutex_lock(&pt_lock);
    int32_t id = pt_take_note(fh);
    pthread_mutex_unlock(&pt_lock);
    return PyBool_FromLong(id > 0);
}

static PyObject *py_passthrough_opens(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&n_pt_opens, __ATOMIC_RELAXED));
}

static PyObject *py_passthrough_stats(PyObject *self, PyObject *unused)
{
    pthread_mutex_lock(&pt_lock);
    unsigned long long notes = (unsigned long long)pt_note_count,
                       pending = (unsigned long long)pt_req_count,
                       nd = n_pt_notes_dropped, rd = n_pt_reqs_dropped;
    pthread_mutex_unlock(&pt_lock);
    int offered = (kernel_init_flags & PT_INIT_EXT) && (kernel_init_flags2 & PT_FLAGS2_BIT);
    return Py_BuildValue("{s:O,s:O,s:O,s:K,s:K,s:K,s:K,s:K}",
                         "wanted", pt_wanted ? Py_True : Py_False,
                         "offered", offered ? Py_True : Py_False,
                         "granted", __atomic_load_n(&pt_granted, __ATOMIC_RELAXED) ?
                             Py_True : Py_False,
                         "opens", (unsigned long long)__atomic_load_n(&n_pt_opens,
                                                                      __ATOMIC_RELAXED),
                         "notes", notes, "requests", pending,
                         "notes_dropped", nd, "requests_dropped", rd);
}

static PyMethodDef methods[] = {
    {"install", py_install, METH_VARARGS,
     "install(fallocate, flush_note[, interrupted[, write_note[, ioctl]]]): the callables the "
     "added requests "
     "call (None: off)."},
    {"fallocate_reply", py_fallocate_reply, METH_VARARGS,
     "fallocate_reply(token, errno): answer a fallocate whose callback returned None "
     "(it was called with that token, 1 or more; 0 means it must answer at once)."},
    {"install_fast", py_install_fast, METH_VARARGS,
     "install_fast(write, read[, getxattr[, flush[, release[, getattr[, lookup[, open[, "
     "create[, truncate[, poll_ns[, burst_max]]]]]]]]]]): "
     "the synchronous callables that answer these requests on the spot (None: off), and the burst settings."},
    {"fast_stats", py_fast_stats, METH_NOARGS,
     "Counts of requests answered on the spot, in bursts, and declined."},
    {"active", py_active, METH_NOARGS,
     "Whether the mounted session went through this library."},
    {"set_init_flags", py_set_init_flags, METH_O,
     "set_init_flags(mask): FUSE_* INIT flags to add to libfuse's reply (before the mount; "
     "only those the kernel offers are added)."},
    {"init_flags", py_init_flags, METH_NOARGS,
     "(offered by the kernel, added by set_init_flags and granted)."},
    {"op_counts", py_op_counts, METH_NOARGS,
     "The requests the kernel sent, by kind ({name: count}, nonzero only); None when the "
     "session does not read through the shim."},
    {"set_kill_suidgid", py_set_kill_suidgid, METH_O,
     "set_kill_suidgid(fn): fn(ino) is called (before the handler) for a WRITE, SETATTR "
     "or OPEN that asks the server to clear the inode's suid/sgid bits "
     "(FUSE_HANDLE_KILLPRIV_V2); None: off."},
    {"set_passthrough", py_set_passthrough, METH_O,
     "set_passthrough(on): before the mount, ask the kernel for FUSE passthrough in the "
     "INIT reply (only if it offers it and libfuse does not ask for the writeback cache)."},
    {"passthrough_granted", py_passthrough_granted, METH_NOARGS,
     "Whether the INIT reply carried FUSE_PASSTHROUGH (the kernel offered it)."},
    {"backing_open", py_backing_open, METH_O,
     "backing_open(fd) -> backing id: register an open file (an int or an object with "
     "fileno()) with the kernel (FUSE_DEV_IOC_BACKING_OPEN; OSError with the errno: "
     "EPERM without CAP_SYS_ADMIN or passthrough, ELOOP for a stacked filesystem)."},
    {"backing_close", py_backing_close, METH_O,
     "backing_close(id): drop the registration (FUSE_DEV_IOC_BACKING_CLOSE); open files "
     "that pass through to it keep their own reference."},
    {"attach", py_attach, METH_VARARGS,
     "attach(fh, id): the next OPEN or CREATE reply that carries fh becomes a passthrough "
     "open on backing id (open flags: FOPEN_PASSTHROUGH, noflush kept, the rest "
     "cleared); OSError(EOPNOTSUPP) unless passthrough_granted()."},
    {"detach", py_detach, METH_O,
     "detach(fh) -> bool: forget an attach note whose reply will not come (an open "
     "answered with an error after attach)."},
    {"passthrough_opens", py_passthrough_opens, METH_NOARGS,
     "How many OPEN/CREATE replies were sent as passthrough opens."},
    {"passthrough_stats", py_passthrough_stats, METH_NOARGS,
     "{wanted, offered, granted, opens, notes, requests, notes_dropped, requests_dropped}: "
     "offered: the kernel's INIT offered it; notes "
     "and requests held now, and those pushed out of their bounded tables."},
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
