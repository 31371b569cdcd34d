/*
 * shim.h — what the files of memosfs._fuseshim share.  Private: it is built
 * with -fvisibility=hidden, and the .so exports only what interpose.c and
 * module.c mark (fuse_session_new, fuse_session_mount, PyInit__fuseshim).
 *
 * memosfs._fuseshim sits between pyfuse3 and libfuse 3.14 and adds what
 * neither has: the requests pyfuse3 does not pass on (fallocate, ioctl), the
 * notes its handlers drop (a flusher's pid, a writeback write, an interrupt,
 * KILL_SUIDGID), the fast path (requests answered on the spot by synchronous
 * callables, in bursts), INIT flags libfuse does not know, and the kernel's
 * FUSE passthrough.  One job a file:
 *
 *   interpose.c    libfuse interposing: fuse_session_new (pyfuse3's table of
 *                  operations becomes ours) and fuse_session_mount (the
 *                  session gets wire.c's I/O); active()
 *   wire.c         the kernel wire and INIT: the session's read and writev on
 *                  /dev/fuse, request counts, INIT flags libfuse 3.14 does not
 *                  know, passthrough's INIT part, the KILL_SUIDGID notes
 *   dispatch.c     the shim_* wrappers of pyfuse3's low-level operations and
 *                  the fast path: the fast_* answers, bursts
 *   upcalls.c      the table of Python callables (install, install_fast,
 *                  set_kill_suidgid), the operations answered by a callable
 *                  alone (fallocate with fallocate_reply, ioctl), the notes
 *   passthrough.c  backing files (backing_open/close), attach/detach, the
 *                  notes of OPEN and CREATE requests and their replies
 *   module.c       the Python module: its table of methods
 *
 *   kernel ─/dev/fuse─▶ wire.c ─▶ libfuse ─▶ dispatch.c ─┬▶ answered here
 *                        │  ▲                 │  ▲       │  (fast path)
 *           passthrough.c┘  └ replies         │  │       └▶ pyfuse3's handler
 *                                         upcalls.c (Python callables)
 *
 * Threads: requests are read and dispatched on pyfuse3's trio thread, one at
 * a time (pyfuse3 runs a request's handler right after
 * fuse_session_process_buf() returns, with no other request in between, so a
 * note taken for a request belongs to the handler that runs next); the
 * Python callables are called with the GIL.  passthrough.c's tables of
 * notes are guarded by a lock of their own (pt_lock).
 *
 * Sections: each component's shared state, then its functions, then the
 * Python methods it defines (listed in module.c).
 */
#ifndef MEMOSFS_FUSE_SHIM_H
#define MEMOSFS_FUSE_SHIM_H

#define FUSE_USE_VERSION 34
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <fuse_lowlevel.h>

/* ---- interpose.c: libfuse interposing ---- */

extern struct fuse_session *shim_se;           /* the session pyfuse3 made through
                                                * fuse_session_new (NULL: none);
                                                * set once, before the mount */

PyObject *shim_py_active(PyObject *self, PyObject *unused);

/* ---- wire.c: the kernel wire and INIT ---- */

extern int shim_wire_counting;                 /* 1: the session reads through wire.c
                                                * (set at the mount) */
extern uint64_t shim_wire_kill_suidgid_unique; /* the last request that asked to clear
                                                * suid/sgid (0: none); trio thread */

void shim_wire_attach(struct fuse_session *se);
int shim_wire_pt_offered(void);

PyObject *shim_py_set_init_flags(PyObject *self, PyObject *arg);
PyObject *shim_py_init_flags(PyObject *self, PyObject *unused);
PyObject *shim_py_op_counts(PyObject *self, PyObject *unused);

/* ---- dispatch.c: the wrappers of pyfuse3's operations, the fast path ---- */

extern long shim_dispatch_burst_poll_ns;       /* ns a burst waits for the next
                                                * request; GIL (install_fast) */
extern int shim_dispatch_burst_max;            /* requests in one burst at most (0:
                                                * no bursts); GIL (install_fast) */

void shim_dispatch_wrap(struct fuse_lowlevel_ops *ops);

PyObject *shim_py_fast_stats(PyObject *self, PyObject *unused);

/* ---- upcalls.c: the Python callables ---- */

/* Each callable is a strong reference, NULL when off; set and called with
 * the GIL (the fast path's checks for NULL read them without it). */
struct shim_upcalls {
    /* install(): the operations pyfuse3 lacks, and the notes */
    PyObject *fallocate;     /* (fh, mode, off, len, token) -> errno, or None: answered
                              * later by fallocate_reply(token); trio thread */
    PyObject *flush_note;    /* (fh, pid, lock_owner): before pyfuse3's flush */
    PyObject *interrupted;   /* (pid): the kernel interrupted an open or create */
    PyObject *write_note;    /* (fh, off, writepage): before pyfuse3's write */
    PyObject *ioctl;         /* (fh, cmd, pid) -> errno (0: done) */
    /* set_kill_suidgid() */
    PyObject *kill_suidgid;  /* (ino): clear suid/sgid before the handler runs */
    /* install_fast(): each answers its request or returns None (to pyfuse3) */
    PyObject *fast_write;    /* (fh, off, view, writepage) -> count | -errno */
    PyObject *fast_read;     /* (fh, off, size) -> bytes | [views] | -errno */
    PyObject *fast_getxattr; /* (ino, name) -> bytes | -errno */
    PyObject *fast_flush;    /* (fh, pid, lock_owner) -> 0 | -errno */
    PyObject *fast_release;  /* (fh) -> 0 | -errno */
    PyObject *fast_getattr;  /* (ino, uid, gid, pid) -> EntryAttributes | -errno */
    PyObject *fast_lookup;   /* (parent, name, uid, gid, pid) -> EntryAttributes |
                              * -errno */
    PyObject *fast_open;     /* (ino, flags, uid, gid, pid, umask) -> FileInfo | -errno */
    PyObject *fast_create;   /* (parent, name, mode, flags, uid, gid, pid, umask) ->
                              * (FileInfo, EntryAttributes) | -errno */
    PyObject *fast_truncate; /* (ino, size, fh or -1, uid, gid, pid) ->
                              * EntryAttributes | -errno */
};
extern struct shim_upcalls shim_up;

void shim_up_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset,
                       off_t length, struct fuse_file_info *fi);
void shim_up_ioctl(fuse_req_t req, fuse_ino_t ino, int cmd, void *arg,
                   struct fuse_file_info *fi, unsigned flags, const void *in_buf,
                   size_t in_bufsz, size_t out_bufsz);
void shim_up_note_write(struct fuse_file_info *fi, off_t off);
void shim_up_kill_suidgid(fuse_ino_t ino);
void shim_up_interrupted(fuse_req_t req, void *data);

PyObject *shim_py_install(PyObject *self, PyObject *args);
PyObject *shim_py_fallocate_reply(PyObject *self, PyObject *args);
PyObject *shim_py_install_fast(PyObject *self, PyObject *args);
PyObject *shim_py_set_kill_suidgid(PyObject *self, PyObject *cb);

/* ---- passthrough.c: backing files, the notes of opens ---- */

extern int shim_pt_wanted;                     /* set_passthrough(True); GIL */
extern int shim_pt_granted;                    /* the INIT reply carried it (atomic) */
extern uint64_t shim_pt_opens;                 /* replies turned into passthrough
                                                * opens (atomic) */

void shim_pt_note_request(uint64_t unique, uint32_t opcode);
int shim_pt_reply(struct iovec *iov, int count);

PyObject *shim_py_set_passthrough(PyObject *self, PyObject *arg);
PyObject *shim_py_passthrough_granted(PyObject *self, PyObject *unused);
PyObject *shim_py_backing_open(PyObject *self, PyObject *arg);
PyObject *shim_py_backing_close(PyObject *self, PyObject *arg);
PyObject *shim_py_attach(PyObject *self, PyObject *args);
PyObject *shim_py_detach(PyObject *self, PyObject *arg);
PyObject *shim_py_passthrough_opens(PyObject *self, PyObject *unused);
PyObject *shim_py_passthrough_stats(PyObject *self, PyObject *unused);

#endif
