/*
 * pymodule_slot.c — memosfs._native.SlotMachine, the slot state machine
 * (slot.c) for Python.  Inodes, names, processes and versions are ints;
 * times are CLOCK_REALTIME nanoseconds (drafts' mtimes come from them); effects are SLOT_FX_* bitmasks.
 *
 * Owns.  The SlotMachine type: one slot_table per object, and the methods
 * that map each memos_slot_* call and its results to Python values; the
 * one place a SLOT_* code becomes an exception (slot_error): SLOT_ENOENT
 * KeyError (an unknown inode or name), SLOT_EEXIST FileExistsError,
 * SLOT_EINVAL ValueError (a call that does not fit the state),
 * SLOT_ENOMEM MemoryError.
 *
 * The GIL and the lock.  Every method runs with the GIL held and is short;
 * the table has no lock of its own: the GIL serializes the calls.
 *
 * May call.  The memos_slot_* API (slot.h) only.
 */
#include "pymodule.h"

#include <time.h>

#include "slot.h"

typedef struct {
    PyObject_HEAD
    slot_table *t;          /* NULL before init (GIL) */
} SlotMachineObject;

static PyObject *slot_error(int rc, const char *what)
{
    switch (rc) {
    case SLOT_ENOENT: PyErr_SetString(PyExc_KeyError, what); break;
    case SLOT_EEXIST: PyErr_SetString(PyExc_FileExistsError, what); break;
    case SLOT_ENOMEM: PyErr_NoMemory(); break;
    default:          PyErr_Format(PyExc_ValueError, "%s: not in this state", what); break;
    }
    return NULL;
}

#define RC(call, what) do { int _rc = (call); if (_rc < 0) return slot_error(_rc, what); } while (0)

static int sm_init(SlotMachineObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"first_ino", NULL};
    unsigned long long first = 2;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|K", kwlist, &first))
        return -1;
    if (!self->t)
        self->t = memos_slot_table_new(first);
    if (!self->t) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void sm_dealloc(SlotMachineObject *self)
{
    memos_slot_table_free(self->t);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *sm_create(SlotMachineObject *self, PyObject *args)
{
    unsigned long long name;
    unsigned tgid, pid;
    int trunc, excl;
    long long now;
    uint64_t ino;
    unsigned fx;
    if (!PyArg_ParseTuple(args, "KIIppL", &name, &tgid, &pid, &trunc, &excl, &now))
        return NULL;
    RC(memos_slot_create(self->t, name, tgid, pid, trunc, excl, now, &ino, &fx), "create");
    return Py_BuildValue("KI", (unsigned long long)ino, fx);
}

static PyObject *sm_restore(SlotMachineObject *self, PyObject *args)
{
    unsigned long long name, version, size, stored;
    long long now;
    uint64_t ino;
    if (!PyArg_ParseTuple(args, "KKKKL", &name, &version, &size, &stored, &now))
        return NULL;
    RC(memos_slot_restore(self->t, name, version, size, stored, now, &ino), "restore");
    return PyLong_FromUnsignedLongLong(ino);
}

static PyObject *sm_lookups(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    long long n;
    if (!PyArg_ParseTuple(args, "KL", &ino, &n))
        return NULL;
    RC(memos_slot_lookups(self->t, ino, n), "lookups");
    Py_RETURN_NONE;
}

static PyObject *sm_lookup(SlotMachineObject *self, PyObject *args)
{
    unsigned long long name;
    unsigned tgid;
    uint64_t ino;
    if (!PyArg_ParseTuple(args, "KI", &name, &tgid))
        return NULL;
    if (memos_slot_lookup(self->t, name, tgid, &ino) != SLOT_OK)
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong(ino);
}

static PyObject *sm_open_plan(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    memos_open_req rq = { 0 };
    long long now;
    memos_open_plan p;
    if (!PyArg_ParseTuple(args, "KIIppppL|p", &ino, &rq.tgid, &rq.pid, &rq.write, &rq.trunc,
                          &rq.retry, &rq.waited, &now, &rq.locked))
        return NULL;
    RC(memos_slot_open_plan(self->t, ino, &rq, now, &p), "open_plan");
    return Py_BuildValue("iKKKI", (int)p.action, (unsigned long long)p.inode,
                         (unsigned long long)p.target, (unsigned long long)p.version, p.fx);
}

static PyObject *sm_attach_reader(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino, version;
    int around;
    long long now;
    unsigned fx;
    if (!PyArg_ParseTuple(args, "KKiL", &ino, &version, &around, &now))
        return NULL;
    RC(memos_slot_attach_reader(self->t, ino, version, around, now, &fx), "attach_reader");
    return PyLong_FromUnsignedLong(fx);
}

static PyObject *sm_attach_writer(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    unsigned tgid, pid, fx;
    int trunc;
    long long now;
    if (!PyArg_ParseTuple(args, "KIIpL", &ino, &tgid, &pid, &trunc, &now))
        return NULL;
    RC(memos_slot_attach_writer(self->t, ino, tgid, pid, trunc, now, &fx), "attach_writer");
    return PyLong_FromUnsignedLong(fx);
}

static PyObject *sm_private(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    unsigned tgid, pid, fx;
    long long now;
    uint64_t priv;
    if (!PyArg_ParseTuple(args, "KIIL", &ino, &tgid, &pid, &now))
        return NULL;
    RC(memos_slot_private(self->t, ino, tgid, pid, now, &priv, &fx), "private");
    return Py_BuildValue("KI", (unsigned long long)priv, fx);
}

static PyObject *sm_send_back(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    unsigned pid, fx;
    int trunc;
    long long now;
    if (!PyArg_ParseTuple(args, "KIpL", &ino, &pid, &trunc, &now))
        return NULL;
    RC(memos_slot_send_back(self->t, ino, pid, trunc, now, &fx), "send_back");
    return PyLong_FromUnsignedLong(fx);
}

static PyObject *sm_wait_mark(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    unsigned pid;
    long long now;
    if (!PyArg_ParseTuple(args, "KIL", &ino, &pid, &now))
        return NULL;
    RC(memos_slot_wait_mark(self->t, ino, pid, now), "wait_mark");
    Py_RETURN_NONE;
}

static PyObject *sm_write_plan(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino, off;
    int append;
    uint64_t at;
    unsigned fx;
    if (!PyArg_ParseTuple(args, "KKp", &ino, &off, &append))
        return NULL;
    RC(memos_slot_write_plan(self->t, ino, off, append, &at, &fx), "write_plan");
    return Py_BuildValue("KI", (unsigned long long)at, fx);
}

static PyObject *sm_wrote(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino, at, n;
    long long now;
    if (!PyArg_ParseTuple(args, "KKKL", &ino, &at, &n, &now))
        return NULL;
    RC(memos_slot_wrote(self->t, ino, at, n, now), "wrote");
    Py_RETURN_NONE;
}

static PyObject *sm_truncated(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino, size;
    long long now;
    if (!PyArg_ParseTuple(args, "KKL", &ino, &size, &now))
        return NULL;
    RC(memos_slot_truncated(self->t, ino, size, now), "truncated");
    Py_RETURN_NONE;
}

/* the methods that take one inode and return nothing */
#define INO_METHOD(pyname, fn) \
    static PyObject *pyname(SlotMachineObject *self, PyObject *arg) \
    { \
        unsigned long long ino = PyLong_AsUnsignedLongLong(arg); \
        if (PyErr_Occurred()) \
            return NULL; \
        RC(fn(self->t, ino), #fn); \
        Py_RETURN_NONE; \
    }

INO_METHOD(sm_refusal_told, memos_slot_refusal_told)
INO_METHOD(sm_push_done, memos_slot_push_done)
INO_METHOD(sm_pages_dropped, memos_slot_pages_dropped)
INO_METHOD(sm_pages_stale, memos_slot_pages_stale)
INO_METHOD(sm_discarded, memos_slot_discarded)

static PyObject *sm_refused(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino, start = 0, end = UINT64_MAX;
    int code = 5;                       /* EIO: no cause given */
    if (!PyArg_ParseTuple(args, "K|KKi", &ino, &start, &end, &code))
        return NULL;
    RC(memos_slot_refused(self->t, ino, start, end, code), "refused");
    Py_RETURN_NONE;
}

static PyObject *sm_draft_made(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino, size;
    int kind;
    if (!PyArg_ParseTuple(args, "KiK", &ino, &kind, &size))
        return NULL;
    RC(memos_slot_draft_made(self->t, ino, (enum memos_draft_kind)kind, size), "draft_made");
    Py_RETURN_NONE;
}

static PyObject *sm_changed(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino, size;
    long long mtime;
    if (!PyArg_ParseTuple(args, "KKL", &ino, &size, &mtime))
        return NULL;
    RC(memos_slot_changed(self->t, ino, size, mtime), "changed");
    Py_RETURN_NONE;
}

static PyObject *sm_draft_mtime(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    long long mtime;
    if (!PyArg_ParseTuple(args, "KL", &ino, &mtime))
        return NULL;
    RC(memos_slot_draft_mtime(self->t, ino, mtime), "draft_mtime");
    Py_RETURN_NONE;
}

static PyObject *sm_pending_pop(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    unsigned pid;
    if (!PyArg_ParseTuple(args, "KI", &ino, &pid))
        return NULL;
    RC(memos_slot_pending_pop(self->t, ino, pid), "pending_pop");
    Py_RETURN_NONE;
}

static PyObject *sm_is_pending(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    unsigned pid;
    if (!PyArg_ParseTuple(args, "KI", &ino, &pid))
        return NULL;
    int rc = memos_slot_is_pending(self->t, ino, pid);
    RC(rc, "is_pending");
    return PyBool_FromLong(rc);
}

static PyObject *sm_is_writer(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    unsigned tgid;
    if (!PyArg_ParseTuple(args, "KI", &ino, &tgid))
        return NULL;
    int rc = memos_slot_is_writer(self->t, ino, tgid);
    if (rc < 0)
        Py_RETURN_FALSE;                /* (no such inode: no writer of it) */
    return PyBool_FromLong(rc);
}

static PyObject *sm_private_of_tgid(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    unsigned tgid;
    if (!PyArg_ParseTuple(args, "KI", &ino, &tgid))
        return NULL;
    return PyLong_FromUnsignedLongLong(memos_slot_private_of_tgid(self->t, ino, tgid));
}

static PyObject *sm_view(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    long long now;
    uint64_t view;
    if (!PyArg_ParseTuple(args, "KL", &ino, &now))
        return NULL;
    RC(memos_slot_view(self->t, ino, now, &view), "view");
    return PyLong_FromUnsignedLongLong(view);
}

static PyObject *sm_backing_attach(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    int backing;
    if (!PyArg_ParseTuple(args, "Ki", &ino, &backing))
        return NULL;
    RC(memos_slot_backing_attach(self->t, ino, backing), "backing_attach");
    Py_RETURN_NONE;
}

static PyObject *sm_backing_detach(SlotMachineObject *self, PyObject *arg)
{
    unsigned long long ino = PyLong_AsUnsignedLongLong(arg);
    int32_t backing;
    int last;
    if (PyErr_Occurred())
        return NULL;
    RC(memos_slot_backing_detach(self->t, ino, &backing, &last), "backing_detach");
    return Py_BuildValue("iO", (int)backing, last ? Py_True : Py_False);
}

static PyObject *sm_new_ino(SlotMachineObject *self, PyObject *noarg)
{
    return PyLong_FromUnsignedLongLong(memos_slot_new_ino(self->t));
}

static PyObject *sm_take_freed(SlotMachineObject *self, PyObject *noarg)
{
    uint64_t buf[256];
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    size_t n;
    while ((n = memos_slot_take_freed(self->t, buf, 256)) > 0) {
        for (size_t i = 0; i < n; i++) {
            PyObject *v = PyLong_FromUnsignedLongLong(buf[i]);
            if (!v || PyList_Append(out, v) < 0) {
                Py_XDECREF(v);
                Py_DECREF(out);
                return NULL;
            }
            Py_DECREF(v);
        }
    }
    return out;
}

static PyObject *sm_set_writeback(SlotMachineObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    memos_slot_set_writeback(self->t, on);
    Py_RETURN_NONE;
}

/* field(ino, f) -> int: one number of the inode (SLOT_F_*); KeyError when
 * there is no such inode.  METH_FASTCALL: the handlers' every read. */
static PyObject *sm_field(SlotMachineObject *self, PyObject *const *args, Py_ssize_t n)
{
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "field(ino, f)");
        return NULL;
    }
    unsigned long long ino = PyLong_AsUnsignedLongLong(args[0]);
    long f = PyLong_AsLong(args[1]);
    if (PyErr_Occurred())
        return NULL;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    int found;
    int64_t v = memos_slot_field(self->t, ino, (enum memos_slot_field)f,
                                 (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec, &found);
    if (!found) {
        PyErr_Format(PyExc_KeyError, "inode %llu", ino);
        return NULL;
    }
    return PyLong_FromLongLong(v);
}

static PyObject *sm_holder(SlotMachineObject *self, PyObject *arg)
{
    unsigned long long name = PyLong_AsUnsignedLongLong(arg);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromUnsignedLongLong(memos_slot_holder(self->t, name));
}

static PyObject *sm_publish_plan(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    unsigned opener, closer;
    uint64_t target;
    if (!PyArg_ParseTuple(args, "KII", &ino, &opener, &closer))
        return NULL;
    int act = memos_slot_publish_plan(self->t, ino, opener, closer, &target);
    RC(act, "publish_plan");
    return Py_BuildValue("iK", act, (unsigned long long)target);
}

static PyObject *sm_published(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino, version, size, stored;
    long long now;
    uint64_t holder;
    unsigned fx;
    if (!PyArg_ParseTuple(args, "KKKKL", &ino, &version, &size, &stored, &now))
        return NULL;
    RC(memos_slot_published(self->t, ino, version, size, stored, now, &holder, &fx),
       "published");
    return Py_BuildValue("KI", (unsigned long long)holder, fx);
}

static PyObject *sm_set_version(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino, version, size, stored;
    long long now;
    uint64_t holder;
    unsigned fx;
    if (!PyArg_ParseTuple(args, "KKKKL", &ino, &version, &size, &stored, &now))
        return NULL;
    RC(memos_slot_set_version(self->t, ino, version, size, stored, now, &holder, &fx),
       "set_version");
    return Py_BuildValue("KI", (unsigned long long)holder, fx);
}

static PyObject *sm_reader_gone(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    int dio;
    if (!PyArg_ParseTuple(args, "Kp", &ino, &dio))
        return NULL;
    RC(memos_slot_reader_gone(self->t, ino, dio), "reader_gone");
    Py_RETURN_NONE;
}

static PyObject *sm_writer_gone(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    unsigned tgid, fx;
    long long now;
    if (!PyArg_ParseTuple(args, "KIL", &ino, &tgid, &now))
        return NULL;
    RC(memos_slot_writer_gone(self->t, ino, tgid, now, &fx), "writer_gone");
    return PyLong_FromUnsignedLong(fx);
}

/* the methods that take one name and return the effects */
#define NAME_METHOD(pyname, fn) \
    static PyObject *pyname(SlotMachineObject *self, PyObject *arg) \
    { \
        unsigned long long name = PyLong_AsUnsignedLongLong(arg); \
        unsigned fx; \
        if (PyErr_Occurred()) \
            return NULL; \
        RC(fn(self->t, name, &fx), #fn); \
        return PyLong_FromUnsignedLong(fx); \
    }

NAME_METHOD(sm_unlink, memos_slot_unlink)
NAME_METHOD(sm_drop, memos_slot_drop)

static PyObject *sm_remove(SlotMachineObject *self, PyObject *args)
{
    unsigned long long name;
    int why;
    unsigned fx;
    if (!PyArg_ParseTuple(args, "Ki", &name, &why))
        return NULL;
    RC(memos_slot_remove(self->t, name, (enum memos_slot_gone)why, &fx), "remove");
    return PyLong_FromUnsignedLong(fx);
}

static PyObject *sm_rename(SlotMachineObject *self, PyObject *args)
{
    unsigned long long from, to;
    unsigned fx;
    if (!PyArg_ParseTuple(args, "KK", &from, &to))
        return NULL;
    RC(memos_slot_rename(self->t, from, to, &fx), "rename");
    return PyLong_FromUnsignedLong(fx);
}

static PyObject *sm_push_claim(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino, version;
    if (!PyArg_ParseTuple(args, "KK", &ino, &version))
        return NULL;
    int rc = memos_slot_push_claim(self->t, ino, version);
    RC(rc, "push_claim");
    return PyBool_FromLong(rc);
}

static PyObject *sm_own_cache(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino, version;
    if (!PyArg_ParseTuple(args, "KK", &ino, &version))
        return NULL;
    RC(memos_slot_own_cache(self->t, ino, version), "own_cache");
    Py_RETURN_NONE;
}

static PyObject *sm_stat(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino;
    unsigned tgid;
    long long now;
    memos_slot_info in;
    if (!PyArg_ParseTuple(args, "KIL", &ino, &tgid, &now))
        return NULL;
    RC(memos_slot_stat(self->t, ino, tgid, now, &in), "stat");
    PyObject *d = Py_BuildValue(
        "{sssssKsKsKsKsKsLsOsOsIsIsOsOsLsK}",
        "state", memos_slot_state_name(in.state), "gone", memos_slot_gone_name(in.gone),
        "version", (unsigned long long)in.version, "size", (unsigned long long)in.size,
        "pub_size", (unsigned long long)in.pub_size,
        "draft_size", (unsigned long long)in.draft_size, "stored", (unsigned long long)in.stored,
        "mtime_ns", (long long)in.mtime_ns, "writer_view", in.writer_view ? Py_True : Py_False,
        "found", in.found ? Py_True : Py_False, "writers", in.writers, "readers", in.readers,
        "changed", in.changed ? Py_True : Py_False,
        "write_failed", in.write_failed ? Py_True : Py_False,
        "cache_version", (long long)in.cache_version,
        "successor", (unsigned long long)in.successor);
    if (!d)
        return NULL;
    PyObject *more = Py_BuildValue(
        "{sssOsOsisOsOsisOsKsOsKsKsKsKsKsLsLsisI}",
        "kind", memos_slot_kind_name(in.kind), "has_base", in.has_base ? Py_True : Py_False,
        "trunc_only", in.trunc_only ? Py_True : Py_False, "refused_code", in.refused_code,
        "refused_told", in.refused_told ? Py_True : Py_False,
        "pending", in.pending ? Py_True : Py_False, "pushing", (int)in.pushing,
        "trusted", in.trusted ? Py_True : Py_False,
        "pages_version", (unsigned long long)in.pages_version,
        "privates", in.privates ? Py_True : Py_False,
        "private_of", (unsigned long long)in.private_of,
        "view_of", (unsigned long long)in.view_of,
        "replaced_by", (unsigned long long)in.replaced_by,
        "name", (unsigned long long)in.name, "pubs", (unsigned long long)in.pubs,
        "lookups", (long long)in.lookups, "handles", (long long)in.handles,
        "backing", (int)in.backing, "backing_opens", in.backing_opens);
    if (!more || PyDict_Update(d, more) < 0) {
        Py_XDECREF(more);
        Py_DECREF(d);
        return NULL;
    }
    Py_DECREF(more);
    return d;
}

static PyObject *sm_check(SlotMachineObject *self, PyObject *args)
{
    unsigned long long ino = 0;
    char why[512];
    if (!PyArg_ParseTuple(args, "|K", &ino))
        return NULL;
    if (memos_slot_check(self->t, ino, why, sizeof why) != SLOT_OK) {
        PyErr_SetString(PyExc_AssertionError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

static Py_ssize_t sm_len(SlotMachineObject *self)
{
    return (Py_ssize_t)memos_slot_count(self->t);
}

static PyMethodDef sm_methods[] = {
    {"create", (PyCFunction)sm_create, METH_VARARGS,
     "create(name, tgid, pid, trunc, excl, now) -> (ino, fx): create(2) of a name"},
    {"restore", (PyCFunction)sm_restore, METH_VARARGS,
     "restore(name, version, size, stored, now) -> ino: a published slot"},
    {"lookups", (PyCFunction)sm_lookups, METH_VARARGS,
     "lookups(ino, n): the kernel learned (n > 0) or forgot (n < 0) the inode"},
    {"lookup", (PyCFunction)sm_lookup, METH_VARARGS,
     "lookup(name, tgid) -> ino or None: the name's inode as tgid finds it"},
    {"open_plan", (PyCFunction)sm_open_plan, METH_VARARGS,
     "open_plan(ino, tgid, pid, write, trunc, retry, waited, now) -> "
     "(action, inode, target, version, fx): what an open should do (pure)"},
    {"attach_reader", (PyCFunction)sm_attach_reader, METH_VARARGS,
     "attach_reader(ino, version, around, now) -> fx"},
    {"attach_writer", (PyCFunction)sm_attach_writer, METH_VARARGS,
     "attach_writer(ino, tgid, pid, trunc, now) -> fx"},
    {"private", (PyCFunction)sm_private, METH_VARARGS,
     "private(ino, tgid, pid, now) -> (private_ino, fx): a retried writer's own draft"},
    {"send_back", (PyCFunction)sm_send_back, METH_VARARGS,
     "send_back(ino, pid, trunc, now) -> fx: before an ESTALE to a writer"},
    {"wait_mark", (PyCFunction)sm_wait_mark, METH_VARARGS,
     "wait_mark(ino, pid, now): a writer waits on the inode"},
    {"write_plan", (PyCFunction)sm_write_plan, METH_VARARGS,
     "write_plan(ino, off, append) -> (at, fx): where a write lands (pure)"},
    {"wrote", (PyCFunction)sm_wrote, METH_VARARGS, "wrote(ino, at, n, now)"},
    {"truncated", (PyCFunction)sm_truncated, METH_VARARGS, "truncated(ino, size, now)"},
    {"refused", (PyCFunction)sm_refused, METH_VARARGS,
     "refused(ino, start=0, end=2**64-1, code=EIO): a write of [start, end) was refused"},
    {"refusal_told", (PyCFunction)sm_refusal_told, METH_O,
     "refusal_told(ino): the refused publish was logged"},
    {"draft_made", (PyCFunction)sm_draft_made, METH_VARARGS,
     "draft_made(ino, kind, size): the draft's bytes are held by a SLOT_DRAFT_* kind now"},
    {"changed", (PyCFunction)sm_changed, METH_VARARGS,
     "changed(ino, size, mtime): the draft changed without a write request"},
    {"draft_mtime", (PyCFunction)sm_draft_mtime, METH_VARARGS,
     "draft_mtime(ino, mtime): the mtime the draft's publish will carry"},
    {"pending_pop", (PyCFunction)sm_pending_pop, METH_VARARGS,
     "pending_pop(ino, pid): a writer marked on its way gave up"},
    {"is_pending", (PyCFunction)sm_is_pending, METH_VARARGS,
     "is_pending(ino, pid) -> bool"},
    {"is_writer", (PyCFunction)sm_is_writer, METH_VARARGS,
     "is_writer(ino, tgid) -> bool: tgid has a write handle on the inode"},
    {"private_of_tgid", (PyCFunction)sm_private_of_tgid, METH_VARARGS,
     "private_of_tgid(ino, tgid) -> ino or 0: tgid's own draft of the inode"},
    {"view", (PyCFunction)sm_view, METH_VARARGS,
     "view(ino, now) -> view_ino: a readers' view of the slot ino holds the name for"},
    {"backing_attach", (PyCFunction)sm_backing_attach, METH_VARARGS,
     "backing_attach(ino, backing_id): a passthrough handle on the inode"},
    {"backing_detach", (PyCFunction)sm_backing_detach, METH_O,
     "backing_detach(ino) -> (backing_id, last)"},
    {"new_ino", (PyCFunction)sm_new_ino, METH_NOARGS,
     "new_ino() -> ino: a number for a node that is no slot"},
    {"take_freed", (PyCFunction)sm_take_freed, METH_NOARGS,
     "take_freed() -> [ino]: the inodes forgotten since the last call"},
    {"set_writeback", (PyCFunction)sm_set_writeback, METH_O,
     "set_writeback(on): the kernel's writeback cache is on"},
    {"field", (PyCFunction)(void (*)(void))sm_field, METH_FASTCALL,
     "field(ino, f) -> int: one SLOT_F_* number of the inode (KeyError: none)"},
    {"holder", (PyCFunction)sm_holder, METH_O,
     "holder(name) -> ino or 0: the inode that holds the name"},
    {"publish_plan", (PyCFunction)sm_publish_plan, METH_VARARGS,
     "publish_plan(ino, opener, closer) -> (action, target); closer 0: fsync or last release"},
    {"published", (PyCFunction)sm_published, METH_VARARGS,
     "published(ino, version, size, stored, now) -> (holder, fx)"},
    {"set_version", (PyCFunction)sm_set_version, METH_VARARGS,
     "set_version(ino, version, size, stored, now) -> (holder, fx): truncate(2) by a "
     "non-writer"},
    {"reader_gone", (PyCFunction)sm_reader_gone, METH_VARARGS, "reader_gone(ino, dio)"},
    {"writer_gone", (PyCFunction)sm_writer_gone, METH_VARARGS,
     "writer_gone(ino, tgid, now) -> fx"},
    {"unlink", (PyCFunction)sm_unlink, METH_O, "unlink(name) -> fx"},
    {"rename", (PyCFunction)sm_rename, METH_VARARGS, "rename(from, to) -> fx"},
    {"remove", (PyCFunction)sm_remove, METH_VARARGS,
     "remove(name, why) -> fx: unlink for a reason (SLOT_GONE_UNLINK, SLOT_GONE_RMDIR)"},
    {"drop", (PyCFunction)sm_drop, METH_O, "drop(name) -> fx: no tier holds it now"},
    {"push_claim", (PyCFunction)sm_push_claim, METH_VARARGS,
     "push_claim(ino, version) -> bool: whether the pages must be dropped first"},
    {"own_cache", (PyCFunction)sm_own_cache, METH_VARARGS, "own_cache(ino, version)"},
    {"push_done", (PyCFunction)sm_push_done, METH_O, "push_done(ino)"},
    {"pages_dropped", (PyCFunction)sm_pages_dropped, METH_O, "pages_dropped(ino)"},
    {"discarded", (PyCFunction)sm_discarded, METH_O,
     "discarded(ino): the writers' changes went with a name that is gone"},
    {"pages_stale", (PyCFunction)sm_pages_stale, METH_O,
     "pages_stale(ino): the kernel's pages hold no version's bytes"},
    {"stat", (PyCFunction)sm_stat, METH_VARARGS,
     "stat(ino, tgid, now) -> dict: what tgid sees of the inode"},
    {"check", (PyCFunction)sm_check, METH_VARARGS,
     "check(ino=0): raise AssertionError naming the first broken invariant"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods sm_as_sequence = {
    .sq_length = (lenfunc)sm_len,
};

static PyTypeObject SlotMachineType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "memosfs._native.SlotMachine",
    .tp_basicsize = sizeof(SlotMachineObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The slot state machine (native/slot.h): inodes, names, versions, drafts, "
              "handles and the page-cache sub-state; decisions return SLOT_FX_* effects.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sm_init,
    .tp_dealloc = (destructor)sm_dealloc,
    .tp_methods = sm_methods,
    .tp_as_sequence = &sm_as_sequence,
};

int pym_slot_register(PyObject *m)
{
    static const struct { const char *name; long v; } consts[] = {
        {"SLOT_FX_FORGET_ATTRS", SLOT_FX_FORGET_ATTRS},
        {"SLOT_FX_FORGET_ENTRY", SLOT_FX_FORGET_ENTRY},
        {"SLOT_FX_DROP_PAGES", SLOT_FX_DROP_PAGES}, {"SLOT_FX_KEEP_CACHE", SLOT_FX_KEEP_CACHE},
        {"SLOT_FX_DIRECT_IO", SLOT_FX_DIRECT_IO}, {"SLOT_FX_PUSH", SLOT_FX_PUSH},
        {"SLOT_FX_FREE_DRAFT", SLOT_FX_FREE_DRAFT}, {"SLOT_FX_MAKE_DRAFT", SLOT_FX_MAKE_DRAFT},
        {"SLOT_FX_TRUNC_DRAFT", SLOT_FX_TRUNC_DRAFT}, {"SLOT_FX_NEED_BASE", SLOT_FX_NEED_BASE},
        {"SLOT_FX_REMOVE_KEY", SLOT_FX_REMOVE_KEY},
        {"SLOT_OPEN_ENOENT", SLOT_OPEN_ENOENT}, {"SLOT_OPEN_READ", SLOT_OPEN_READ},
        {"SLOT_OPEN_WRITE", SLOT_OPEN_WRITE}, {"SLOT_OPEN_PRIVATE", SLOT_OPEN_PRIVATE},
        {"SLOT_OPEN_SEND_BACK", SLOT_OPEN_SEND_BACK}, {"SLOT_OPEN_WAIT", SLOT_OPEN_WAIT},
        {"SLOT_PUBLISH_NOTHING", SLOT_PUBLISH_NOTHING},
        {"SLOT_PUBLISH_REFUSED", SLOT_PUBLISH_REFUSED}, {"SLOT_PUBLISH_DO", SLOT_PUBLISH_DO},
        {"SLOT_RETRY_NS", (long)SLOT_RETRY_NS},
        {"SLOT_DRAFT_NONE", SLOT_DRAFT_NONE}, {"SLOT_DRAFT_ARENA", SLOT_DRAFT_ARENA},
        {"SLOT_DRAFT_SPILL", SLOT_DRAFT_SPILL}, {"SLOT_DRAFT_OVERLAY", SLOT_DRAFT_OVERLAY},
        {"SLOT_DRAFT_FILE", SLOT_DRAFT_FILE},
        {"SLOT_CREATED", SLOT_CREATED}, {"SLOT_PUBLISHED", SLOT_PUBLISHED},
        {"SLOT_WRITING", SLOT_WRITING}, {"SLOT_SUPERSEDED", SLOT_SUPERSEDED},
        {"SLOT_PRIVATE", SLOT_PRIVATE}, {"SLOT_GONE", SLOT_GONE}, {"SLOT_VIEW", SLOT_VIEW},
        {"SLOT_GONE_NOT", SLOT_GONE_NOT}, {"SLOT_GONE_UNPUBLISHED", SLOT_GONE_UNPUBLISHED},
        {"SLOT_GONE_UNLINK", SLOT_GONE_UNLINK}, {"SLOT_GONE_REPLACED", SLOT_GONE_REPLACED},
        {"SLOT_GONE_EVICTED", SLOT_GONE_EVICTED}, {"SLOT_GONE_RMDIR", SLOT_GONE_RMDIR},
#define F(x) {"SLOT_F_" #x, SLOT_F_##x}
        F(STATE), F(GONE), F(VERSION), F(PUB_SIZE), F(STORED), F(READERS), F(WRITERS),
        F(PUSHING), F(CHANGED), F(KIND), F(HAS_BASE), F(TRUNC_ONLY), F(REFUSED),
        F(REFUSED_CODE), F(REFUSED_TOLD), F(CACHE_VERSION), F(TRUSTED), F(PAGES_VERSION),
        F(SUCCESSOR), F(REPLACED_BY), F(PRIVATE_OF), F(VIEW_OF), F(PRIVATES), F(LOOKUPS),
        F(HANDLES), F(PUBS), F(BACKING), F(BACKING_OPENS), F(DRAFT_SIZE), F(DRAFT_MTIME),
        F(NAME), F(PENDING), F(LATEST), F(HOLDS_NAME), F(NAME_HOLDER),
#undef F
    };
    if (PyType_Ready(&SlotMachineType) < 0)
        return -1;
    if (PyModule_AddObjectRef(m, "SlotMachine", (PyObject *)&SlotMachineType) < 0)
        return -1;
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++)
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].v) < 0)
            return -1;
    return 0;
}
