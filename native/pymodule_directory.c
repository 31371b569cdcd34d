/*
 * pymodule_directory.c — memosfs._native.Directory, the coherence directory
 * (directory.c) for Python.  Keys are bytes, agents are ints (a uid or a
 * pid).
 *
 * Owns.  The Directory type: one dir_table per object, and the methods
 * that map each dir_* call (read, write, ack, release, publish, cancel,
 * state, unacked, revoke, holders, forget, take_msgs, take_events, stats,
 * check) and its DIR_* results to Python values.
 *
 * The GIL and the lock.  Every method runs with the GIL held and is short:
 * the dir_* call takes the directory's own mutex inside and returns before
 * any Python object is built, so the lock order is GIL → directory mutex
 * and an object may be used from several threads.
 *
 * May call.  The dir_* API (directory.h) only; nothing of the cache or the
 * other types.  MEMOS_ENOMEM becomes MemoryError here (nomem_or_long).
 */
#include "pymodule.h"

#include "directory.h"

typedef struct {
    PyObject_HEAD
    dir_table *d;
} DirectoryObject;

static int dir_obj_init(DirectoryObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "", kwlist))
        return -1;
    if (!self->d)
        self->d = dir_new();
    if (!self->d) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

static void dir_obj_dealloc(DirectoryObject *self)
{
    dir_delete(self->d);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *nomem_or_long(int rc)
{
    if (rc == MEMOS_ENOMEM)
        return PyErr_NoMemory();
    return PyLong_FromLong(rc);
}

static PyObject *py_read(DirectoryObject *self, PyObject *args)
{
    Py_buffer k;
    unsigned long long agent;
    int protocol;
    if (!PyArg_ParseTuple(args, "y*Ki", &k, &agent, &protocol))
        return NULL;
    int rc = dir_read(self->d, k.buf, (size_t)k.len, agent, protocol);
    PyBuffer_Release(&k);
    return nomem_or_long(rc);
}

static PyObject *py_write(DirectoryObject *self, PyObject *args)
{
    Py_buffer k;
    unsigned long long agent;
    int protocol, upgrade = 0;
    if (!PyArg_ParseTuple(args, "y*Ki|p", &k, &agent, &protocol, &upgrade))
        return NULL;
    int rc = dir_write(self->d, k.buf, (size_t)k.len, agent, protocol, upgrade);
    PyBuffer_Release(&k);
    return nomem_or_long(rc);
}

static PyObject *py_ack(DirectoryObject *self, PyObject *args)
{
    Py_buffer k;
    unsigned long long agent;
    if (!PyArg_ParseTuple(args, "y*K", &k, &agent))
        return NULL;
    int rc = dir_ack(self->d, k.buf, (size_t)k.len, agent);
    PyBuffer_Release(&k);
    return PyLong_FromLong(rc);
}

static PyObject *py_release(DirectoryObject *self, PyObject *args)
{
    Py_buffer k;
    unsigned long long agent;
    int writer;
    if (!PyArg_ParseTuple(args, "y*Kp", &k, &agent, &writer))
        return NULL;
    int rc = dir_release(self->d, k.buf, (size_t)k.len, agent, writer);
    PyBuffer_Release(&k);
    return PyLong_FromLong(rc);
}

static PyObject *py_publish(DirectoryObject *self, PyObject *args)
{
    Py_buffer k;
    unsigned long long agent;
    if (!PyArg_ParseTuple(args, "y*K", &k, &agent))
        return NULL;
    int rc = dir_publish(self->d, k.buf, (size_t)k.len, agent);
    PyBuffer_Release(&k);
    if (rc == MEMOS_ENOMEM)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *py_cancel(DirectoryObject *self, PyObject *args)
{
    Py_buffer k;
    unsigned long long agent;
    int keep = 0;
    if (!PyArg_ParseTuple(args, "y*K|p", &k, &agent, &keep))
        return NULL;
    int rc = dir_cancel(self->d, k.buf, (size_t)k.len, agent, keep);
    PyBuffer_Release(&k);
    return PyBool_FromLong(rc == MEMOS_OK);
}

static PyObject *py_state(DirectoryObject *self, PyObject *args)
{
    Py_buffer k;
    unsigned long long agent;
    if (!PyArg_ParseTuple(args, "y*K", &k, &agent))
        return NULL;
    int st = dir_state(self->d, k.buf, (size_t)k.len, agent);
    PyBuffer_Release(&k);
    return PyUnicode_FromString(dir_state_name(st));
}

static PyObject *py_unacked(DirectoryObject *self, PyObject *args)
{
    Py_buffer k;
    unsigned long long agent;
    if (!PyArg_ParseTuple(args, "y*K", &k, &agent))
        return NULL;
    int un = dir_unacked(self->d, k.buf, (size_t)k.len, agent);
    PyBuffer_Release(&k);
    return PyBool_FromLong(un);
}

static PyObject *agent_list(const uint64_t *agents, size_t n);

static PyObject *py_revoke(DirectoryObject *self, PyObject *args)
{
    Py_buffer k;
    int valid = 0;
    if (!PyArg_ParseTuple(args, "y*|p", &k, &valid))
        return NULL;
    uint64_t agents[256];
    size_t n = dir_revoke(self->d, k.buf, (size_t)k.len, valid, agents, 256);
    PyBuffer_Release(&k);
    return agent_list(agents, n);
}

static PyObject *py_break_exclusive(DirectoryObject *self, PyObject *args)
{
    Py_buffer k;
    unsigned long long agent;
    if (!PyArg_ParseTuple(args, "y*K", &k, &agent))
        return NULL;
    uint64_t agents[256];
    size_t n = dir_break_exclusive(self->d, k.buf, (size_t)k.len, agent, agents, 256);
    PyBuffer_Release(&k);
    return agent_list(agents, n);
}

static PyObject *agent_list(const uint64_t *agents, size_t n)
{
    if (n > 256)
        n = 256;
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong((unsigned long long)agents[i]);
        if (!v) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, v);
    }
    return out;
}

static PyObject *py_holders(DirectoryObject *self, PyObject *args)
{
    Py_buffer k;
    if (!PyArg_ParseTuple(args, "y*", &k))
        return NULL;
    uint64_t agents[256];
    uint8_t states[256];
    size_t n = dir_holders(self->d, k.buf, (size_t)k.len, agents, states, 256);
    PyBuffer_Release(&k);
    if (n > 256)
        n = 256;
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *t = Py_BuildValue("(Ks)", (unsigned long long)agents[i],
                                    dir_state_name(states[i]));
        if (!t) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    return out;
}

static PyObject *py_forget(DirectoryObject *self, PyObject *args)
{
    Py_buffer k;
    if (!PyArg_ParseTuple(args, "y*", &k))
        return NULL;
    size_t n = dir_forget(self->d, k.buf, (size_t)k.len);
    PyBuffer_Release(&k);
    return PyLong_FromSize_t(n);
}

static PyObject *py_take_msgs(DirectoryObject *self, PyObject *args)
{
    Py_ssize_t max = 1024;
    if (!PyArg_ParseTuple(args, "|n", &max))
        return NULL;
    if (max <= 0)
        return PyList_New(0);
    dir_msg *m = PyMem_Malloc((size_t)max * sizeof *m);
    if (!m)
        return PyErr_NoMemory();
    size_t n = dir_take_msgs(self->d, m, (size_t)max);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; i < n; i++) {
        PyObject *t = out ? Py_BuildValue("(y#KK)", m[i].key, (Py_ssize_t)m[i].klen,
                                          (unsigned long long)m[i].agent,
                                          (unsigned long long)m[i].writer) : NULL;
        free(m[i].key);
        if (out && !t)
            Py_CLEAR(out);
        if (out)
            PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    PyMem_Free(m);
    return out;
}

static PyObject *py_take_events(DirectoryObject *self, PyObject *args)
{
    Py_ssize_t max = 4096;
    if (!PyArg_ParseTuple(args, "|n", &max))
        return NULL;
    if (max <= 0)
        return PyList_New(0);
    dir_event *e = PyMem_Malloc((size_t)max * sizeof *e);
    if (!e)
        return PyErr_NoMemory();
    size_t n = dir_take_events(self->d, e, (size_t)max);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; i < n; i++) {
        PyObject *t = out ? Py_BuildValue("(y#Ksss)", e[i].key, (Py_ssize_t)e[i].klen,
                                          (unsigned long long)e[i].agent,
                                          dir_state_name(e[i].from),
                                          dir_state_name(e[i].to),
                                          dir_cause_name(e[i].cause)) : NULL;
        free(e[i].key);
        if (out && !t)
            Py_CLEAR(out);
        if (out)
            PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    PyMem_Free(e);
    return out;
}

static PyObject *py_msgs_queued(DirectoryObject *self, PyObject *unused)
{
    return PyLong_FromSize_t(dir_msgs_queued(self->d));
}

static PyObject *py_stats(DirectoryObject *self, PyObject *unused)
{
    dir_stats st;
    dir_get_stats(self->d, &st);
    return Py_BuildValue(
        "{sKsKsKsKsKsKsKsKsKsKsKsKsKsK}",
        "coherence_slots", (unsigned long long)st.slots,
        "coherence_holders", (unsigned long long)st.holders,
        "coherence_reads", (unsigned long long)st.reads,
        "coherence_writes", (unsigned long long)st.writes,
        "coherence_invalidations", (unsigned long long)st.invalidations,
        "coherence_acks", (unsigned long long)st.acks,
        "coherence_pending_waits", (unsigned long long)st.pending_waits,
        "coherence_read_waits", (unsigned long long)st.read_waits,
        "coherence_timeouts", (unsigned long long)st.timeouts,
        "coherence_downgrades", (unsigned long long)st.downgrades,
        "coherence_publishes", (unsigned long long)st.publishes,
        "coherence_msgs_queued", (unsigned long long)st.msgs_queued,
        "coherence_events_dropped", (unsigned long long)st.events_dropped,
        "coherence_revoked", (unsigned long long)st.revoked);
}

static PyObject *py_check(DirectoryObject *self, PyObject *unused)
{
    if (dir_check(self->d) != MEMOS_OK) {
        PyErr_SetString(PyExc_AssertionError, "coherence directory is inconsistent");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef dir_methods[] = {
    {"read", (PyCFunction)py_read, METH_VARARGS,
     "read(key, agent, protocol) -> GRANTED | WAIT: open a read handle"},
    {"write", (PyCFunction)py_write, METH_VARARGS,
     "write(key, agent, protocol, upgrade=False) -> GRANTED | WAIT | PENDING"},
    {"ack", (PyCFunction)py_ack, METH_VARARGS,
     "ack(key, agent) -> grants: acknowledge an invalidation"},
    {"release", (PyCFunction)py_release, METH_VARARGS,
     "release(key, agent, writer) -> grants: a handle closed"},
    {"publish", (PyCFunction)py_publish, METH_VARARGS, "publish(key, agent): E -> M"},
    {"cancel", (PyCFunction)py_cancel, METH_VARARGS,
     "cancel(key, agent, keep_handle=False) -> bool: a pending writer gives up; others restored"},
    {"state", (PyCFunction)py_state, METH_VARARGS, "state(key, agent) -> 'I'|'S'|'E'|'M'|'P'"},
    {"unacked", (PyCFunction)py_unacked, METH_VARARGS,
     "unacked(key, agent) -> bool: invalidated and not yet acknowledged"},
    {"revoke", (PyCFunction)py_revoke, METH_VARARGS,
     "revoke(key, valid=False) -> [agent]: void the unacknowledged holders' copies "
     "(valid: also S/M holders without a write handle); a pending writer may enter E"},
    {"break_exclusive", (PyCFunction)py_break_exclusive, METH_VARARGS,
     "break_exclusive(key, agent) -> [agent]: other agents holding key exclusively with a "
     "write handle (E, or M with one open) go to S; they acquire E again at their next write"},
    {"holders", (PyCFunction)py_holders, METH_VARARGS, "holders(key) -> [(agent, state)]"},
    {"forget", (PyCFunction)py_forget, METH_VARARGS, "forget(key) -> holders dropped"},
    {"take_msgs", (PyCFunction)py_take_msgs, METH_VARARGS,
     "take_msgs(max=1024) -> [(key, agent, writer)]: queued invalidations, oldest first"},
    {"take_events", (PyCFunction)py_take_events, METH_VARARGS,
     "take_events(max=4096) -> [(key, agent, from, to, cause)]"},
    {"msgs_queued", (PyCFunction)py_msgs_queued, METH_NOARGS, "invalidations waiting"},
    {"stats", (PyCFunction)py_stats, METH_NOARGS, "counters as a dict"},
    {"check", (PyCFunction)py_check, METH_NOARGS, "raise AssertionError if inconsistent"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject DirectoryType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "memosfs._native.Directory",
    .tp_basicsize = sizeof(DirectoryObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The coherence directory: per slot, each agent's MESI state (+ Pending).",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)dir_obj_init,
    .tp_dealloc = (destructor)dir_obj_dealloc,
    .tp_methods = dir_methods,
};

int pym_directory_register(PyObject *m)
{
    if (PyType_Ready(&DirectoryType) < 0)
        return -1;
    if (PyModule_AddObjectRef(m, "Directory", (PyObject *)&DirectoryType) < 0 ||
        PyModule_AddIntConstant(m, "DIR_GRANTED", DIR_GRANTED) < 0 ||
        PyModule_AddIntConstant(m, "DIR_WAIT", DIR_WAIT) < 0 ||
        PyModule_AddIntConstant(m, "DIR_PENDING", DIR_PENDING) < 0)
        return -1;
    return 0;
}
