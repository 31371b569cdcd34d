/*
 * pymodule_prefetch.c — memosfs._native.Prefetcher: the stride detector and
 * heat table of prefetch.c for Python (memosfs/store/prefetch.py drives
 * them).
 *
 * Owns.  The Prefetcher type: one pf_table per object, the generator state
 * of heat_sample, and the methods mapping each pf_* call to Python values.
 * Sessions and slots are 64-bit ids (Prefetcher.key_id(bytes) hashes a key
 * or a session path with the index's hash); slot indices are signed 64-bit.
 *
 * The GIL and the lock.  Every method runs with the GIL held and is short:
 * the pf_* call holds the table's own mutex (prefetch.c) and returns before
 * any Python object is built, so an object may be used from several
 * threads and the lock order is GIL → table mutex.
 *
 * May call.  The pf_* API (prefetch.h) and index_hash (index.h) only;
 * nothing of the cache or the other types.
 */
#include "pymodule.h"

#include "index.h"
#include "prefetch.h"

typedef struct {
    PyObject_HEAD
    pf_table *p;
    uint64_t  rng;           /* heat_sample's generator state */
} PrefetcherObject;

static int pfo_init(PrefetcherObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "sessions", "heat_capacity", "confirm", "halflife", "seed", NULL };
    pf_config c;
    pf_config_default(&c);
    long long sessions = c.sessions, heat = c.heat_capacity, confirm = c.confirm;
    double halflife = c.halflife;
    unsigned long long seed = 0x853c49e6748fea9bull;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|LLLdK:Prefetcher", kwlist, &sessions, &heat,
                                     &confirm, &halflife, &seed))
        return -1;
    if (sessions < 1 || sessions > (1 << 24) || heat < 1 || heat > (1 << 24) ||
        confirm < 1 || confirm > 64 || !(halflife > 0.0) || halflife > 1e300) {
        PyErr_SetString(PyExc_ValueError, "sessions and heat_capacity must be in 1..2**24, "
                        "confirm in 1..64, halflife > 0");
        return -1;
    }
    c.sessions = (uint32_t)sessions;
    c.heat_capacity = (uint32_t)heat;
    c.confirm = (uint32_t)confirm;
    c.halflife = halflife;
    pf_table *p = pf_new(&c);
    if (!p) {
        PyErr_NoMemory();
        return -1;
    }
    pf_free(self->p);                       /* __init__ called again */
    self->p = p;
    self->rng = seed ? seed : 1;
    return 0;
}

static void pfo_dealloc(PrefetcherObject *self)
{
    pf_free(self->p);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int ready(PrefetcherObject *self)
{
    if (self->p)
        return 1;
    PyErr_SetString(PyExc_RuntimeError, "Prefetcher is not initialized");
    return 0;
}

/* A Python int as a uint64 id: any int is taken modulo 2**64 (negative ones too). */
static int as_id(PyObject *o, uint64_t *out)
{
    if (!PyLong_Check(o)) {
        PyErr_Format(PyExc_TypeError, "an id must be an int, not %.80s", Py_TYPE(o)->tp_name);
        return 0;
    }
    unsigned long long v = PyLong_AsUnsignedLongLongMask(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return 0;
    *out = v;
    return 1;
}

static PyObject *info_dict(const pf_stride_info *st)
{
    return Py_BuildValue("{sLsLsIsIsLsK}", "last_index", (long long)st->last_index,
                         "candidate", (long long)st->candidate, "run", st->run,
                         "misses", st->misses, "stride", (long long)st->stride,
                         "observations", (unsigned long long)st->observations);
}

static PyObject *pfo_stride_observe(PrefetcherObject *self, PyObject *args)
{
    PyObject *sess;
    long long index;
    if (!ready(self) || !PyArg_ParseTuple(args, "OL:stride_observe", &sess, &index))
        return NULL;
    uint64_t s;
    if (!as_id(sess, &s))
        return NULL;
    return PyLong_FromLongLong(pf_stride_observe(self->p, s, index, NULL));
}

static PyObject *pfo_stride_info(PrefetcherObject *self, PyObject *sess)
{
    uint64_t s;
    if (!ready(self) || !as_id(sess, &s))
        return NULL;
    pf_stride_info st;
    if (pf_stride_get(self->p, s, &st) != MEMOS_OK)
        Py_RETURN_NONE;
    return info_dict(&st);
}

static PyObject *pfo_stride_forget(PrefetcherObject *self, PyObject *sess)
{
    uint64_t s;
    if (!ready(self) || !as_id(sess, &s))
        return NULL;
    return PyBool_FromLong(pf_stride_forget(self->p, s) == MEMOS_OK);
}

static PyObject *pfo_heat_touch(PrefetcherObject *self, PyObject *args)
{
    PyObject *ido;
    double weight = 1.0;
    if (!ready(self) || !PyArg_ParseTuple(args, "O|d:heat_touch", &ido, &weight))
        return NULL;
    uint64_t id, ev = 0;
    if (!as_id(ido, &id))
        return NULL;
    int rc = pf_heat_touch(self->p, id, weight, &ev);
    if (rc < 0) {
        PyErr_SetString(PyExc_ValueError, "weight must be finite, > 0 and <= 2**100");
        return NULL;
    }
    if (rc == 1)
        return PyLong_FromUnsignedLongLong(ev);
    Py_RETURN_NONE;
}

static PyObject *pfo_heat(PrefetcherObject *self, PyObject *ido)
{
    uint64_t id;
    if (!ready(self) || !as_id(ido, &id))
        return NULL;
    return PyFloat_FromDouble(pf_heat_get(self->p, id));
}

static PyObject *pfo_heat_remove(PrefetcherObject *self, PyObject *ido)
{
    uint64_t id;
    if (!ready(self) || !as_id(ido, &id))
        return NULL;
    return PyBool_FromLong(pf_heat_remove(self->p, id) == MEMOS_OK);
}

#define PF_K_MAX 65536

static PyObject *pfo_heat_top(PrefetcherObject *self, PyObject *args)
{
    Py_ssize_t k;
    if (!ready(self) || !PyArg_ParseTuple(args, "n:heat_top", &k))
        return NULL;
    if (k < 0 || k > PF_K_MAX) {
        PyErr_SetString(PyExc_ValueError, "k must be in 0..65536");
        return NULL;
    }
    pf_heat_item *items = PyMem_Malloc(((size_t)k + 1) * sizeof *items);
    if (!items)
        return PyErr_NoMemory();
    size_t n = pf_heat_top(self->p, items, (size_t)k);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *t = Py_BuildValue("(Kd)", (unsigned long long)items[i].id, items[i].heat);
        if (!t) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    PyMem_Free(items);
    return out;
}

static PyObject *pfo_heat_sample(PrefetcherObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "k", "pool", NULL };
    Py_ssize_t k, pool = 64;
    if (!ready(self) || !PyArg_ParseTupleAndKeywords(args, kw, "n|n:heat_sample", kwlist, &k,
                                                     &pool))
        return NULL;
    if (k < 0 || k > PF_K_MAX || pool < 0 || pool > PF_K_MAX) {
        PyErr_SetString(PyExc_ValueError, "k and pool must be in 0..65536");
        return NULL;
    }
    uint64_t *ids = PyMem_Malloc(((size_t)k + 1) * sizeof *ids);
    if (!ids)
        return PyErr_NoMemory();
    size_t n = pf_heat_sample(self->p, ids, (size_t)k, (size_t)pool, &self->rng);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(ids[i]);
        if (!v) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, v);
    }
    PyMem_Free(ids);
    return out;
}

static PyObject *pfo_stats(PrefetcherObject *self, PyObject *unused)
{
    if (!ready(self))
        return NULL;
    pf_stats s;
    pf_get_stats(self->p, &s);
    return Py_BuildValue("{sKsKsKsKsKsKsK}",
                         "sessions", (unsigned long long)s.sessions,
                         "sessions_evicted", (unsigned long long)s.sessions_evicted,
                         "observations", (unsigned long long)s.observations,
                         "confirmations", (unsigned long long)s.confirmations,
                         "heat_entries", (unsigned long long)s.heat_entries,
                         "heat_evicted", (unsigned long long)s.heat_evicted,
                         "heat_touches", (unsigned long long)s.heat_touches);
}

static PyObject *pfo_check(PrefetcherObject *self, PyObject *unused)
{
    if (!ready(self))
        return NULL;
    char why[256];
    if (pf_check(self->p, why, sizeof why) != MEMOS_OK) {
        PyErr_SetString(PyExc_AssertionError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *pfo_key_id(PyObject *cls, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint64_t h = index_hash(view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef pfo_methods[] = {
    { "stride_observe", (PyCFunction)pfo_stride_observe, METH_VARARGS,
      "stride_observe(session, index) -> int: observe a read of slot `index` in `session`; "
      "the session's confirmed stride after it (0 = none)" },
    { "stride_info", (PyCFunction)pfo_stride_info, METH_O,
      "stride_info(session) -> dict | None: last_index, candidate, run, misses, stride, "
      "observations" },
    { "stride_forget", (PyCFunction)pfo_stride_forget, METH_O,
      "stride_forget(session) -> bool: drop a session's detector state" },
    { "heat_touch", (PyCFunction)pfo_heat_touch, METH_VARARGS,
      "heat_touch(id, weight=1.0) -> int | None: add weight to id's heat; the id evicted "
      "to make room, if any" },
    { "heat", (PyCFunction)pfo_heat, METH_O, "heat(id) -> float: the decayed heat now (0 if absent)" },
    { "heat_remove", (PyCFunction)pfo_heat_remove, METH_O, "heat_remove(id) -> bool" },
    { "heat_top", (PyCFunction)pfo_heat_top, METH_VARARGS,
      "heat_top(k) -> [(id, heat)]: the k hottest, hottest first" },
    { "heat_sample", (PyCFunction)(void (*)(void))pfo_heat_sample, METH_VARARGS | METH_KEYWORDS,
      "heat_sample(k, pool=64) -> [id]: k distinct ids drawn by heat among the pool hottest" },
    { "stats", (PyCFunction)pfo_stats, METH_NOARGS, "stats() -> dict of the tables' counters" },
    { "check", (PyCFunction)pfo_check, METH_NOARGS,
      "check(): raise AssertionError if an internal invariant is broken" },
    { "key_id", (PyCFunction)pfo_key_id, METH_O | METH_STATIC,
      "key_id(bytes) -> int: the 64-bit id of a key or session path (the index's hash)" },
    { NULL }
};

static PyTypeObject PrefetcherType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "memosfs._native.Prefetcher",
    .tp_basicsize = sizeof(PrefetcherObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Prefetcher(sessions=4096, heat_capacity=4096, confirm=2, halflife=1024.0, "
              "seed=...): a per-session stride detector and a heat table (native/prefetch.c)",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pfo_init,
    .tp_dealloc = (destructor)pfo_dealloc,
    .tp_methods = pfo_methods,
};

int pym_prefetch_register(PyObject *m)
{
    if (PyType_Ready(&PrefetcherType) < 0)
        return -1;
    return PyModule_AddObjectRef(m, "Prefetcher", (PyObject *)&PrefetcherType);
}
