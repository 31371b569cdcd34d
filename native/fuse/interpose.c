/*
 * interpose.c — libfuse interposing: how memosfs._fuseshim gets between
 * pyfuse3 and libfuse.
 *
 * pyfuse3 3.5 hands libfuse a table of low-level operations without `ioctl`
 * and `fallocate`, and its `flush` handler drops the caller's pid; libfuse
 * 3.14 builds the INIT reply from the capabilities it knows and has no API
 * for passthrough.  Rather than patch either, this library defines two of
 * libfuse's entry points:
 *
 *   fuse_session_new    copies pyfuse3's table, lets dispatch.c wrap its
 *                       operations and add fallocate and ioctl
 *                       (shim_dispatch_wrap), and calls the real
 *                       fuse_session_new with that table; the session it
 *                       returns is shim_se
 *   fuse_session_mount  calls the real one and, for shim_se, gives the
 *                       session's /dev/fuse descriptor wire.c's read and
 *                       writev (shim_wire_attach)
 *
 * It is loaded with RTLD_GLOBAL before pyfuse3 (memosfs/__init__.py), so the
 * dynamic linker binds pyfuse3's calls to these definitions; each finds the
 * real one with dlvsym(RTLD_NEXT, ..., "FUSE_3.0") (plain dlsym where the
 * version is missing).  These two symbols and PyInit__fuseshim are all the
 * .so exports (it is built with -fvisibility=hidden).
 *
 * If pyfuse3 was loaded before this library, nothing is intercepted:
 * `active()` says so, fallocate stays EOPNOTSUPP and flush publishes as
 * before (the log says why).
 */
#include "shim.h"

#include <dlfcn.h>
#include <errno.h>
#include <string.h>

/* ---- types ---- */

typedef struct fuse_session *(*session_new_fn)(struct fuse_args *,
                                               const struct fuse_lowlevel_ops *,
                                               size_t, void *);
typedef int (*session_mount_fn)(struct fuse_session *, const char *);

/* ---- state ---- */

struct fuse_session *shim_se;                  /* the session made here (NULL: none) */

static struct fuse_lowlevel_ops shim_ops;      /* pyfuse3's table plus ours */
static int intercepted;                        /* fuse_session_new came here */

/* ---- API ---- */

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
    shim_dispatch_wrap(&shim_ops);
    intercepted = 1;
    shim_se = real(args, &shim_ops, sizeof shim_ops, userdata);
    return shim_se;
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
    if (rc == 0 && se == shim_se)
        shim_wire_attach(se);
    return rc;
}

PyObject *shim_py_active(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(intercepted);
}
