/*
 * module.c — the Python module memosfs._fuseshim: its table of methods and
 * nothing else.  Each method is defined beside the state it reads or sets
 * (shim.h lists them by file): install, install_fast, fallocate_reply and
 * set_kill_suidgid in upcalls.c; fast_stats in dispatch.c; set_init_flags,
 * init_flags and op_counts in wire.c; active in interpose.c; the
 * passthrough methods in passthrough.c.  shim.h says what the module is for
 * and which file does what.
 */
#include "shim.h"

/* ---- the table ---- */

static PyMethodDef methods[] = {
    {"install", shim_py_install, METH_VARARGS,
     "install(fallocate, flush_note[, interrupted[, write_note[, ioctl]]]): the callables the "
     "added requests "
     "call (None: off)."},
    {"fallocate_reply", shim_py_fallocate_reply, METH_VARARGS,
     "fallocate_reply(token, errno): answer a fallocate whose callback returned None "
     "(it was called with that token, 1 or more; 0 means it must answer at once)."},
    {"install_fast", shim_py_install_fast, METH_VARARGS,
     "install_fast(write, read[, getxattr[, flush[, release[, getattr[, lookup[, open[, "
     "create[, truncate[, poll_ns[, burst_max]]]]]]]]]]): "
     "the synchronous callables that answer these requests on the spot (None: off), and the burst settings."},
    {"fast_stats", shim_py_fast_stats, METH_NOARGS,
     "Counts of requests answered on the spot, in bursts, and declined."},
    {"active", shim_py_active, METH_NOARGS,
     "Whether the mounted session went through this library."},
    {"set_init_flags", shim_py_set_init_flags, METH_O,
     "set_init_flags(mask): FUSE_* INIT flags to add to libfuse's reply (before the mount; "
     "only those the kernel offers are added)."},
    {"init_flags", shim_py_init_flags, METH_NOARGS,
     "(offered by the kernel, added by set_init_flags and granted)."},
    {"op_counts", shim_py_op_counts, METH_NOARGS,
     "The requests the kernel sent, by kind ({name: count}, nonzero only); None when the "
     "session does not read through the shim."},
    {"set_kill_suidgid", shim_py_set_kill_suidgid, METH_O,
     "set_kill_suidgid(fn): fn(ino) is called (before the handler) for a WRITE, SETATTR "
     "or OPEN that asks the server to clear the inode's suid/sgid bits "
     "(FUSE_HANDLE_KILLPRIV_V2); None: off."},
    {"set_passthrough", shim_py_set_passthrough, METH_O,
     "set_passthrough(on): before the mount, ask the kernel for FUSE passthrough in the "
     "INIT reply (only if it offers it and libfuse does not ask for the writeback cache)."},
    {"passthrough_granted", shim_py_passthrough_granted, METH_NOARGS,
     "Whether the INIT reply carried FUSE_PASSTHROUGH (the kernel offered it)."},
    {"backing_open", shim_py_backing_open, METH_O,
     "backing_open(fd) -> backing id: register an open file (an int or an object with "
     "fileno()) with the kernel (FUSE_DEV_IOC_BACKING_OPEN; OSError with the errno: "
     "EPERM without CAP_SYS_ADMIN or passthrough, ELOOP for a stacked filesystem)."},
    {"backing_close", shim_py_backing_close, METH_O,
     "backing_close(id): drop the registration (FUSE_DEV_IOC_BACKING_CLOSE); open files "
     "that pass through to it keep their own reference."},
    {"attach", shim_py_attach, METH_VARARGS,
     "attach(fh, id): the next OPEN or CREATE reply that carries fh becomes a passthrough "
     "open on backing id (open flags: FOPEN_PASSTHROUGH, noflush kept, the rest "
     "cleared); OSError(EOPNOTSUPP) unless passthrough_granted()."},
    {"detach", shim_py_detach, METH_O,
     "detach(fh) -> bool: forget an attach note whose reply will not come (an open "
     "answered with an error after attach)."},
    {"passthrough_opens", shim_py_passthrough_opens, METH_NOARGS,
     "How many OPEN/CREATE replies were sent as passthrough opens."},
    {"passthrough_stats", shim_py_passthrough_stats, METH_NOARGS,
     "{wanted, offered, granted, opens, notes, requests, notes_dropped, requests_dropped}: "
     "offered: the kernel's INIT offered it; notes "
     "and requests held now, and those pushed out of their bounded tables."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "memosfs._fuseshim",
    "fallocate and the flusher's pid for pyfuse3 (see native/fuse/shim.h).", -1, methods,
    NULL, NULL, NULL, NULL,
};

/* ---- API ---- */

PyMODINIT_FUNC PyInit__fuseshim(void)
{
    return PyModule_Create(&module);
}
