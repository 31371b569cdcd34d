/*
 * wire.c — the connection's own I/O: what the session reads from and writes
 * to /dev/fuse, and the INIT flags libfuse 3.14 does not know.
 *
 * Once libfuse has mounted (interpose.c's fuse_session_mount), the session's
 * descriptor gets this file's read and writev (fuse_session_custom_io, in
 * shim_wire_attach).  They are plain read(2) and writev(2), as libfuse's
 * own, and on the way:
 *
 *   io_read    counts every request by opcode as it is read, whichever way
 *              it is then answered (op_counts(): bench clients --profile,
 *              stats `requests`); notes the INIT request and what the kernel
 *              offers; notes the KILL_SUIDGID bits of WRITE, SETATTR and OPEN
 *              requests, per request, in shim_wire_kill_suidgid_unique (read
 *              and cleared by upcalls.c's shim_up_kill_suidgid, at the top of
 *              the handler libfuse then dispatches); and, once passthrough is
 *              granted, hands OPEN and CREATE requests to passthrough.c.
 *   io_writev  adds the flags below to the INIT reply, and hands every reply
 *              to passthrough.c once passthrough is granted.
 *
 * Every other request and reply passes through untouched.
 *
 * INIT flags libfuse 3.14 does not know.  libfuse builds the INIT reply from
 * the capabilities it knows; FUSE_HANDLE_KILLPRIV_V2 (kernel 5.11) is not
 * among them.  With it the kernel sets SB_NOSEC on the superblock and stops
 * asking for security.capability (GETXATTR) before every write(2); the server
 * clears suid/sgid itself when a write, truncate or O_TRUNC open says so (the
 * KILL_SUIDGID notes above).  set_init_flags() names the flags to add to the
 * reply (`extra_init_flags`); only those the kernel offered are added, and
 * init_flags() says what was offered and what was granted.
 *
 * Passthrough's INIT part (the rest is passthrough.c).  libfuse 3.14 knows
 * nothing of it, and Debian's <linux/fuse.h> (7.38) lacks the fields, so they
 * are spelled out here from the kernel's include/uapi/linux/fuse.h:
 * FUSE_PASSTHROUGH is bit 37 of the 64 flags, i.e. bit 5 of flags2
 * (fuse_init_in: flags2 at offset 16, present when flags has FUSE_INIT_EXT);
 * the reply carries it in flags2 (fuse_init_out offset 32) with FUSE_INIT_EXT
 * in flags and max_stack_depth (offset 36) = 1: backing files may not
 * themselves be on a stacked filesystem (ELOOP).  The kernel ignores the flag
 * when the reply also has FUSE_WRITEBACK_CACHE, so then it is not added.  It
 * is added when set_passthrough(True) asked (shim_pt_wanted) and the kernel
 * offered it; shim_pt_granted then tells io_read, io_writev and passthrough.c.
 *
 * Threads: io_read and io_writev run on the thread that reads requests
 * (pyfuse3's trio thread, or a burst of dispatch.c on the same thread).
 */
#include "shim.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>
#include <unistd.h>
#include <linux/fuse.h>

/* ---- types and constants ---- */

#define PT_INIT_EXT          (1u << 30)        /* FUSE_INIT_EXT */
#define PT_FLAGS2_BIT        (1u << 5)         /* FUSE_PASSTHROUGH (1ULL << 37) >> 32 */
#define PT_INIT_IN_FLAGS2    16                /* offsetof(fuse_init_in, flags2) */
#define PT_INIT_OUT_FLAGS2   32                /* offsetof(fuse_init_out, flags2) */
#define PT_INIT_OUT_STACK    36                /* offsetof(fuse_init_out, max_stack_depth) */

_Static_assert(sizeof(struct fuse_init_in) == 64 &&
               offsetof(struct fuse_init_in, flags2) == PT_INIT_IN_FLAGS2,
               "fuse_init_in layout");
_Static_assert(sizeof(struct fuse_init_out) == 64 &&
               offsetof(struct fuse_init_out, flags2) == PT_INIT_OUT_FLAGS2,
               "fuse_init_out layout");

/* Every request the kernel sent, by opcode: counted as it is read. */
#define OP_SLOTS 64

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

/* ---- state ---- */

int shim_wire_counting;                        /* the session reads through io_read */
uint64_t shim_wire_kill_suidgid_unique;        /* the last request that asked to
                                                * clear suid/sgid (0: none) */

static uint32_t extra_init_flags;              /* FUSE_* INIT flags to add (GIL) */
static uint32_t granted_init_flags;            /* of those, what the kernel got */
static uint64_t init_unique;                   /* the INIT request's id, until answered */
static uint32_t kernel_init_flags;             /* what the kernel offered */
static uint32_t kernel_init_flags2;            /* what the kernel offered, flags2 */
static uint64_t op_count[OP_SLOTS];            /* requests by opcode (atomic); [0]:
                                                * opcodes >= OP_SLOTS */

/* ---- private prototypes ---- */

static ssize_t io_read(int fd, void *buf, size_t len, void *userdata);
static ssize_t io_writev(int fd, struct iovec *iov, int count, void *userdata);
static int pt_init_reply(unsigned char *o, size_t len);
static int put_count(PyObject *d, const char *name, uint64_t c);

static const struct fuse_custom_io shim_io = { io_writev, io_read, NULL, NULL };

/* ---- API ---- */

/* The mounted session se reads and writes /dev/fuse through io_read and
 * io_writev: plain read(2) and writev(2) as libfuse's own, plus the request
 * counts and the INIT flags set_init_flags() adds.  If libfuse refuses,
 * nothing is counted and no flag is added. */
void shim_wire_attach(struct fuse_session *se)
{
    if (fuse_session_custom_io(se, &shim_io, fuse_session_fd(se)) != 0) {
        extra_init_flags = 0;                  /* (init_flags() says nothing was added) */
        shim_wire_counting = 0;
    } else
        shim_wire_counting = 1;
}

/* Whether the kernel's INIT offered FUSE_PASSTHROUGH. */
int shim_wire_pt_offered(void)
{
    return (kernel_init_flags & PT_INIT_EXT) && (kernel_init_flags2 & PT_FLAGS2_BIT);
}

PyObject *shim_py_set_init_flags(PyObject *self, PyObject *arg)
{
    unsigned long v = PyLong_AsUnsignedLong(arg);
    if (v == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    extra_init_flags = (uint32_t)v;
    Py_RETURN_NONE;
}

PyObject *shim_py_init_flags(PyObject *self, PyObject *unused)
{
    return Py_BuildValue("(kk)", (unsigned long)kernel_init_flags,
                         (unsigned long)granted_init_flags);
}

PyObject *shim_py_op_counts(PyObject *self, PyObject *unused)
{
    if (!shim_wire_counting)
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

/* ---- private helpers ---- */

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
            shim_wire_kill_suidgid_unique = h->unique;
        break;
    case FUSE_SETATTR:
        if (alen >= sizeof(struct fuse_setattr_in) &&
            (((const struct fuse_setattr_in *)arg)->valid & FATTR_KILL_SUIDGID))
            shim_wire_kill_suidgid_unique = h->unique;
        break;
    case FUSE_OPEN:
        if (alen >= sizeof(struct fuse_open_in) &&
            (((const struct fuse_open_in *)arg)->open_flags & FUSE_OPEN_KILL_SUIDGID))
            shim_wire_kill_suidgid_unique = h->unique;
        if (__atomic_load_n(&shim_pt_granted, __ATOMIC_RELAXED))
            shim_pt_note_request(h->unique, FUSE_OPEN);
        break;
    case FUSE_CREATE:
        if (__atomic_load_n(&shim_pt_granted, __ATOMIC_RELAXED))
            shim_pt_note_request(h->unique, FUSE_CREATE);
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
                    __atomic_store_n(&shim_pt_granted, 1, __ATOMIC_RELAXED);
            }
            init_unique = 0;
        }
    }
    int pt = 0;
    if (count >= 1 && iov[0].iov_len >= sizeof(struct fuse_out_header) &&
        __atomic_load_n(&shim_pt_granted, __ATOMIC_RELAXED))
        pt = shim_pt_reply(iov, count);
    ssize_t n = writev(fd, iov, count);
    if (pt && n >= 0)
        __atomic_fetch_add(&shim_pt_opens, 1, __ATOMIC_RELAXED);
    return n;
}

/* The INIT reply o (len bytes): add passthrough when wanted, offered and
 * compatible with what libfuse asks for.  Returns whether it was added. */
static int pt_init_reply(unsigned char *o, size_t len)
{
    uint32_t flags, flags2;
    if (!shim_pt_wanted || !(kernel_init_flags & PT_INIT_EXT) ||
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
