/*
 * upcalls.c — the calls into Python: the table of callables the daemon
 * registers, and what is answered by a callable alone.
 *
 * The daemon fills one table, shim_up (shim.h lists each callable with its
 * arguments and answer), through three methods:
 *
 *   install(fallocate, flush_note[, interrupted[, write_note[, ioctl]]])
 *       fallocate(fh, mode, offset, length, token) -> errno (0: done)
 *                          (trio thread); None: it waits (for room in the
 *                          memory tier, on the request loop) and answers later
 *                          with fallocate_reply(token, errno)
 *       flush_note(fh, pid, lock_owner)   just before pyfuse3's flush
 *                          handler runs: only the process that opened a slot
 *                          for writing may publish it on close (a forked
 *                          child's close of an inherited descriptor sends
 *                          FLUSH too)
 *       interrupted(pid)   the kernel interrupted an open or create of that
 *                          thread (a signal, SIGKILL included)   (trio thread)
 *       write_note(fh, off, writepage)   just before pyfuse3's write handler:
 *                          whether the kernel writes back cached pages
 *       ioctl(fh, cmd, pid) -> errno (0: done)   a restricted ioctl(2) without
 *                          data on an open file (trio thread): memosfs's
 *                          MEMOS_IOC_ACK = _IO('M', 1) (memosfs/shared.py),
 *                          how a holder that may not set xattrs (a read-only
 *                          reader) acknowledges an invalidation
 *   install_fast(write, read, ...)   the fast path's callables (dispatch.c
 *                          calls them and reads their answers) and the burst
 *                          settings
 *   set_kill_suidgid(fn)   fn(ino) before the handler of a WRITE, SETATTR or
 *                          OPEN that asks the server to clear suid/sgid
 *                          (FUSE_HANDLE_KILLPRIV_V2, see wire.c)
 *
 * pyfuse3 3.5 hands libfuse a table of low-level operations without `ioctl`
 * and `fallocate`: dispatch.c adds this file's shim_up_fallocate and
 * shim_up_ioctl to it, answered by their callables alone (EOPNOTSUPP and
 * ENOTTY while none is installed).  fallocate(2) mode 0 is how fsx and many
 * writers preallocate.  A fallocate the callable defers is held in
 * `deferred` (at most DEFERRED_MAX at once; beyond that the callable is
 * called with token 0 and must answer at once).
 *
 * The notes (shim_up_note_write, shim_up_kill_suidgid, shim_up_interrupted,
 * and flush_note in dispatch.c's shim_flush) report an exception raised by
 * their callable as unraisable and go on.
 */
#include "shim.h"

#include <errno.h>
#include <stdint.h>

/* ---- types and constants ---- */

#define DEFERRED_MAX 64

/* ---- state ---- */

struct shim_upcalls shim_up;                   /* the callables (GIL) */

/* fallocate's requests the callback answers later (it returned None), each
 * answered once by fallocate_reply(token): token i + 1 is deferred[i]. */
static fuse_req_t deferred[DEFERRED_MAX];      /* NULL: free; GIL */

/* ---- private prototypes ---- */

static int errno_of(PyObject *cb, PyObject *r);

/* ---- API ---- */

void shim_up_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset,
                       off_t length, struct fuse_file_info *fi)
{
    int err = EOPNOTSUPP;
    PyGILState_STATE g = PyGILState_Ensure();
    if (shim_up.fallocate) {
        int slot = -1;
        for (int i = 0; i < DEFERRED_MAX && slot < 0; i++)
            if (!deferred[i])
                slot = i;
        /* token 0: no room to defer it, the callback answers now */
        PyObject *r = PyObject_CallFunction(shim_up.fallocate, "KiLLi",
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
        err = errno_of(shim_up.fallocate, r);
    }
    PyGILState_Release(g);
    fuse_reply_err(req, err);
}

/* ioctl(2) on an open file.  Only restricted ioctls without data reach the
 * callback (memosfs defines no other); anything else is ENOTTY, as for a
 * filesystem without ioctls. */
void shim_up_ioctl(fuse_req_t req, fuse_ino_t ino, int cmd, void *arg,
                   struct fuse_file_info *fi, unsigned flags, const void *in_buf,
                   size_t in_bufsz, size_t out_bufsz)
{
    int err = ENOTTY;
    if (!(flags & (FUSE_IOCTL_UNRESTRICTED | FUSE_IOCTL_DIR)) && in_bufsz == 0 &&
        out_bufsz == 0) {
        const struct fuse_ctx *ctx = fuse_req_ctx(req);
        PyGILState_STATE g = PyGILState_Ensure();
        if (shim_up.ioctl) {
            err = errno_of(shim_up.ioctl,
                           PyObject_CallFunction(shim_up.ioctl, "KIi",
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

/* A write the kernel sends from its page cache (writeback of a shared mmap)
 * carries FUSE_WRITE_CACHE (fi->writepage): its offset is the page's, even on
 * an O_APPEND descriptor.  Tell the daemon before pyfuse3's handler runs. */
void shim_up_note_write(struct fuse_file_info *fi, off_t off)
{
    PyGILState_STATE g = PyGILState_Ensure();
    if (shim_up.write_note) {
        PyObject *r = PyObject_CallFunction(shim_up.write_note, "KLi",
                                            (unsigned long long)fi->fh, (long long)off,
                                            (int)fi->writepage);
        if (r)
            Py_DECREF(r);
        else
            PyErr_WriteUnraisable(shim_up.write_note);
    }
    PyGILState_Release(g);
}

/* At the top of the WRITE, SETATTR and OPEN wrappers: libfuse dispatches the
 * request it has just read, so a KILL_SUIDGID note is this request's.  The
 * callable clears the inode's suid/sgid bits before its handler runs. */
void shim_up_kill_suidgid(fuse_ino_t ino)
{
    if (!shim_wire_kill_suidgid_unique)
        return;
    shim_wire_kill_suidgid_unique = 0;
    if (!shim_up.kill_suidgid)
        return;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallFunction(shim_up.kill_suidgid, "K", (unsigned long long)ino);
    if (!r)
        PyErr_WriteUnraisable(shim_up.kill_suidgid);
    Py_XDECREF(r);
    PyGILState_Release(g);
}

/* libfuse calls this when the kernel interrupts a request (a signal reached
 * the caller, SIGKILL included): memosfs ends that caller's waits with EINTR.
 * `data` is the caller's thread id. */
void shim_up_interrupted(fuse_req_t req, void *data)
{
    PyGILState_STATE g = PyGILState_Ensure();
    if (shim_up.interrupted) {
        PyObject *r = PyObject_CallFunction(shim_up.interrupted, "i", (int)(intptr_t)data);
        if (r)
            Py_DECREF(r);
        else
            PyErr_WriteUnraisable(shim_up.interrupted);
    }
    PyGILState_Release(g);
}

PyObject *shim_py_install(PyObject *self, PyObject *args)
{
    PyObject *fa, *fl, *in = Py_None, *wn = Py_None, *io = Py_None;
    if (!PyArg_ParseTuple(args, "OO|OOO", &fa, &fl, &in, &wn, &io))
        return NULL;
    Py_XSETREF(shim_up.ioctl, io == Py_None ? NULL : Py_NewRef(io));
    Py_XSETREF(shim_up.write_note, wn == Py_None ? NULL : Py_NewRef(wn));
    Py_XSETREF(shim_up.fallocate, fa == Py_None ? NULL : Py_NewRef(fa));
    Py_XSETREF(shim_up.flush_note, fl == Py_None ? NULL : Py_NewRef(fl));
    Py_XSETREF(shim_up.interrupted, in == Py_None ? NULL : Py_NewRef(in));
    Py_RETURN_NONE;
}

PyObject *shim_py_fallocate_reply(PyObject *self, PyObject *args)
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

PyObject *shim_py_install_fast(PyObject *self, PyObject *args)
{
    PyObject *w, *r, *x = Py_None, *fl = Py_None, *re = Py_None, *ga = Py_None,
             *lk = Py_None, *op = Py_None, *cr = Py_None, *tr = Py_None;
    long poll_ns = shim_dispatch_burst_poll_ns;
    int bmax = shim_dispatch_burst_max;
    if (!PyArg_ParseTuple(args, "OO|OOOOOOOOli", &w, &r, &x, &fl, &re, &ga, &lk, &op, &cr,
                          &tr, &poll_ns, &bmax))
        return NULL;
    if (poll_ns < 0 || poll_ns > 999999999L || bmax < 0) {
        PyErr_SetString(PyExc_ValueError, "poll_ns in [0, 1e9), burst_max >= 0");
        return NULL;
    }
    Py_XSETREF(shim_up.fast_write, w == Py_None ? NULL : Py_NewRef(w));
    Py_XSETREF(shim_up.fast_read, r == Py_None ? NULL : Py_NewRef(r));
    Py_XSETREF(shim_up.fast_getxattr, x == Py_None ? NULL : Py_NewRef(x));
    Py_XSETREF(shim_up.fast_flush, fl == Py_None ? NULL : Py_NewRef(fl));
    Py_XSETREF(shim_up.fast_release, re == Py_None ? NULL : Py_NewRef(re));
    Py_XSETREF(shim_up.fast_getattr, ga == Py_None ? NULL : Py_NewRef(ga));
    Py_XSETREF(shim_up.fast_lookup, lk == Py_None ? NULL : Py_NewRef(lk));
    Py_XSETREF(shim_up.fast_open, op == Py_None ? NULL : Py_NewRef(op));
    Py_XSETREF(shim_up.fast_create, cr == Py_None ? NULL : Py_NewRef(cr));
    Py_XSETREF(shim_up.fast_truncate, tr == Py_None ? NULL : Py_NewRef(tr));
    shim_dispatch_burst_poll_ns = poll_ns;
    shim_dispatch_burst_max = bmax;
    Py_RETURN_NONE;
}

PyObject *shim_py_set_kill_suidgid(PyObject *self, PyObject *cb)
{
    Py_XSETREF(shim_up.kill_suidgid, cb == Py_None ? NULL : Py_NewRef(cb));
    Py_RETURN_NONE;
}

/* ---- private helpers ---- */

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
