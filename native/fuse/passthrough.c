/*
 * passthrough.c — the kernel reads and writes a backing file itself.
 *
 * Kernel 6.9+ (CONFIG_FUSE_PASSTHROUGH) lets a server answer OPEN or CREATE
 * with FOPEN_PASSTHROUGH and a backing id: the kernel then sends no READ or
 * WRITE for that open file and does the I/O (mmap included) on the backing
 * file.  libfuse 3.14 knows none of it, and Debian's <linux/fuse.h> (7.38)
 * lacks the fields, so they are spelled out here from the kernel's
 * include/uapi/linux/fuse.h (the INIT flag and its reply are wire.c's):
 *
 *   OPEN/CREATE reply: fuse_open_out {fh u64, open_flags u32, backing_id
 *     i32}; CREATE's is the last 16 bytes after fuse_entry_out (libfuse
 *     3.14 sends both in one iovec).
 *   /dev/fuse ioctls: FUSE_DEV_IOC_BACKING_OPEN(struct fuse_backing_map)
 *     -> id (CAP_SYS_ADMIN), FUSE_DEV_IOC_BACKING_CLOSE(u32 id).
 *
 * The Python side: set_passthrough(True) before the mount asks wire.c to add
 * FUSE_PASSTHROUGH to the INIT reply (passthrough_granted() says whether it
 * did); backing_open(fd) -> id and backing_close(id) are the ioctls that
 * register a backing file; attach(fh, id) marks the OPEN or CREATE reply that
 * will carry fh.  The caller closes its backing ids; an open file keeps its
 * own reference.
 *
 * How a reply becomes a passthrough open: two bounded tables, under pt_lock.
 *
 *   pt_req   OPEN and CREATE requests not answered yet, noted by wire.c's
 *            io_read (shim_pt_note_request) while passthrough is granted
 *   pt_note  attach(fh, id) notes, until a reply carries fh (or detach(fh))
 *
 * wire.c's io_writev hands every reply to shim_pt_reply: a successful reply
 * to a noted request whose fh has a note gets FOPEN_PASSTHROUGH and the
 * backing id (and loses the open flags the kernel refuses beside it,
 * direct_io and keep_cache included).  When a table is full its oldest note
 * goes (counted: notes_dropped, requests_dropped).
 */
#include "shim.h"

#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <string.h>
#include <sys/ioctl.h>
#include <linux/fuse.h>

/* ---- types and constants ---- */

#define PT_FOPEN_PASSTHROUGH (1u << 7)         /* FOPEN_PASSTHROUGH */
#define PT_OPEN_OUT_SIZE     16                /* sizeof(struct fuse_open_out) */

struct pt_backing_map {                        /* struct fuse_backing_map */
    int32_t fd;                                /* the backing file's descriptor */
    uint32_t flags;                            /* 0 */
    uint64_t padding;                          /* 0 */
};
#define PT_DEV_IOC_BACKING_OPEN  _IOW(229, 1, struct pt_backing_map)
#define PT_DEV_IOC_BACKING_CLOSE _IOW(229, 2, uint32_t)

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

/* OPEN and CREATE requests not answered yet (only while granted): unique
 * 0 is a free slot (the kernel never uses it for a request). */
#define PT_REQS 256
/* attach(fh, id): the next OPEN/CREATE reply with that fh passes through. */
#define PT_NOTES 256

/* ---- state ---- */

int shim_pt_wanted;                            /* set_passthrough(True) (GIL) */
int shim_pt_granted;                           /* the INIT reply carried it (atomic) */
uint64_t shim_pt_opens;                        /* replies turned into passthrough
                                                * opens (atomic) */

static pthread_mutex_t pt_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    uint64_t unique;                           /* the request's id (0: free); pt_lock */
    uint64_t seq;                              /* its age, of pt_seq; pt_lock */
    uint32_t opcode;                           /* FUSE_OPEN or FUSE_CREATE; pt_lock */
} pt_req[PT_REQS];
static int pt_req_count;                       /* held; changed under pt_lock */
static struct {
    uint64_t fh;                               /* the open's handle; pt_lock */
    uint64_t seq;                              /* its age, of pt_seq; pt_lock */
    int32_t id;                                /* the backing id (> 0); pt_lock */
    int used;                                  /* 1: a note; pt_lock */
} pt_note[PT_NOTES];
static int pt_note_count;                      /* used notes; pt_lock */
static uint64_t pt_seq;                        /* the age of notes of both tables */

static uint64_t n_pt_notes_dropped;            /* attach notes pushed out unused */
static uint64_t n_pt_reqs_dropped;             /* requests pushed out unanswered */

/* ---- private prototypes ---- */

static uint32_t pt_take_request(uint64_t unique);
static int32_t pt_take_note(uint64_t fh);
static void *pt_payload_at(struct iovec *iov, int count, size_t off, size_t n);
static int pt_session_fd(void);

/* ---- API ---- */

/* io_read: an OPEN or CREATE request to watch for. */
void shim_pt_note_request(uint64_t unique, uint32_t opcode)
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

/* io_writev: a reply to a watched OPEN or CREATE.  Success and an attached
 * fh: the reply becomes a passthrough open (returns 1). */
int shim_pt_reply(struct iovec *iov, int count)
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

PyObject *shim_py_set_passthrough(PyObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    shim_pt_wanted = on;
    Py_RETURN_NONE;
}

PyObject *shim_py_passthrough_granted(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(__atomic_load_n(&shim_pt_granted, __ATOMIC_RELAXED));
}

PyObject *shim_py_backing_open(PyObject *self, PyObject *arg)
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

PyObject *shim_py_backing_close(PyObject *self, PyObject *arg)
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

PyObject *shim_py_attach(PyObject *self, PyObject *args)
{
    unsigned long long fh;
    long id;
    if (!PyArg_ParseTuple(args, "Kl:attach", &fh, &id))
        return NULL;
    if (id <= 0 || id > INT32_MAX) {
        PyErr_SetString(PyExc_ValueError, "attach: a backing id is 1 or more");
        return NULL;
    }
    if (!__atomic_load_n(&shim_pt_granted, __ATOMIC_RELAXED)) {
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

PyObject *shim_py_detach(PyObject *self, PyObject *arg)
{
    unsigned long long fh = PyLong_AsUnsignedLongLong(arg);
    if (fh == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    pthread_mutex_lock(&pt_lock);
    int32_t id = pt_take_note(fh);
    pthread_mutex_unlock(&pt_lock);
    return PyBool_FromLong(id > 0);
}

PyObject *shim_py_passthrough_opens(PyObject *self, PyObject *unused)
{
    return PyLong_FromUnsignedLongLong(__atomic_load_n(&shim_pt_opens, __ATOMIC_RELAXED));
}

PyObject *shim_py_passthrough_stats(PyObject *self, PyObject *unused)
{
    pthread_mutex_lock(&pt_lock);
    unsigned long long notes = (unsigned long long)pt_note_count,
                       pending = (unsigned long long)pt_req_count,
                       nd = n_pt_notes_dropped, rd = n_pt_reqs_dropped;
    pthread_mutex_unlock(&pt_lock);
    int offered = shim_wire_pt_offered();
    return Py_BuildValue("{s:O,s:O,s:O,s:K,s:K,s:K,s:K,s:K}",
                         "wanted", shim_pt_wanted ? Py_True : Py_False,
                         "offered", offered ? Py_True : Py_False,
                         "granted", __atomic_load_n(&shim_pt_granted, __ATOMIC_RELAXED) ?
                             Py_True : Py_False,
                         "opens", (unsigned long long)__atomic_load_n(&shim_pt_opens,
                                                                      __ATOMIC_RELAXED),
                         "notes", notes, "requests", pending,
                         "notes_dropped", nd, "requests_dropped", rd);
}

/* ---- private helpers ---- */

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

/* The mounted session's /dev/fuse descriptor, or -1 with ENODEV set. */
static int pt_session_fd(void)
{
    int fd = shim_se && shim_wire_counting ? fuse_session_fd(shim_se) : -1;
    if (fd < 0) {
        errno = ENODEV;
        PyErr_SetFromErrno(PyExc_OSError);
    }
    return fd;
}
