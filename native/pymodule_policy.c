/*
 * pymodule_policy.c — memosfs._native.Policy: a standalone eviction policy
 * (policy.c) over entries named by integer ids, for a tier that keeps its
 * entries itself (the SSD tier, memosfs/store/ssd.py) but must pick victims
 * in the memory tier's order.
 *
 *     p = Policy("lru_lfu")          # or "lru", "lfu"
 *     p.admit(id, hash)              # a new entry (hash: the key's, for the ghosts)
 *     p.touch(id)                    # a use; False if id is not admitted
 *     p.victims(n, skip=set())       # up to n ids, best victim first (not removed)
 *     p.remove(id, evicted=False)    # evicted=True: remembered in a ghost
 *     p.rekey(id, hash)              # the entry was renamed
 *     p.select(name); p.name; len(p); id in p; p.ids(); p.stats(); p.check()
 *     state = p.dump()               # plain lists, ints and floats (JSON-able)
 *     q = Policy(state["policy"]); q.restore(state)   # same victims as p
 *
 * Owns.  The Policy type: one `policy` per object and a node per admitted id
 * (malloc'd, its policy_node first), found through a dict id -> address.
 *
 * The GIL.  Every method runs with the GIL held and does not release it, so
 * one object may be used from several threads: each call is atomic.  The
 * victims filter (skip) runs Python's `in` on the container it was given.
 *
 * May call.  The policy_* API (policy.h) only.
 */
#include "pymodule.h"

#include "policy.h"

typedef struct pnode {
    policy_node pn;          /* first: the policy links */
    uint64_t    id;          /* the caller's id */
} pnode;

typedef struct {
    PyObject_HEAD
    policy    p;
    int       ready;         /* policy_init done */
    PyObject *nodes;         /* dict: int id -> int address of its pnode */
    PyObject *skip;          /* victims(): ids not to pick (borrowed, during the call) */
    int       skip_error;    /* the skip test raised */
} PolicyObject;

/* ---- helpers ---- */

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

static int ready(PolicyObject *self)
{
    if (self->ready && self->nodes)
        return 1;
    PyErr_SetString(PyExc_RuntimeError, "Policy is not initialized");
    return 0;
}

/* The node of id, or NULL (no exception) when id is not admitted; NULL with
 * an exception on error (*err set). */
static pnode *find(PolicyObject *self, uint64_t id, int *err)
{
    *err = 0;
    PyObject *k = PyLong_FromUnsignedLongLong(id);
    if (!k) {
        *err = 1;
        return NULL;
    }
    PyObject *v = PyDict_GetItemWithError(self->nodes, k);
    Py_DECREF(k);
    if (!v) {
        *err = PyErr_Occurred() != NULL;
        return NULL;
    }
    return (pnode *)PyLong_AsVoidPtr(v);
}

static int forget(PolicyObject *self, pnode *n)
{
    PyObject *k = PyLong_FromUnsignedLongLong(n->id);
    if (!k)
        return -1;
    int rc = PyDict_DelItem(self->nodes, k);
    Py_DECREF(k);
    free(n);
    return rc;
}

static int skip_filter(const policy_node *n, void *ctx)
{
    PolicyObject *self = ctx;
    if (!self->skip || self->skip_error)
        return !self->skip_error;
    PyObject *k = PyLong_FromUnsignedLongLong(((const pnode *)n)->id);
    if (!k) {
        self->skip_error = 1;
        return 0;
    }
    int in = PySequence_Contains(self->skip, k);
    Py_DECREF(k);
    if (in < 0) {
        self->skip_error = 1;
        return 0;
    }
    return !in;
}

/* Free every node and the ghosts; the policy is empty and uninitialised. */
static void clear_all(PolicyObject *self)
{
    if (self->ready) {
        policy_node *x = self->p.head.next;
        while (x != &self->p.head) {
            policy_node *next = x->next;
            free(x);
            x = next;
        }
        policy_destroy(&self->p);
        self->ready = 0;
    }
    if (self->nodes)
        PyDict_Clear(self->nodes);
}

/* ---- lifetime ---- */

static int po_init(PolicyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "name", NULL };
    const char *name = "lru_lfu";
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|s:Policy", kwlist, &name))
        return -1;
    clear_all(self);
    if (!self->nodes && !(self->nodes = PyDict_New()))
        return -1;
    if (policy_init(&self->p, name, skip_filter, self) != MEMOS_OK) {
        policy_destroy(&self->p);
        PyErr_Format(PyExc_ValueError, "unknown policy %.40s (lru_lfu, lru, lfu)", name);
        return -1;
    }
    self->ready = 1;
    return 0;
}

static void po_dealloc(PolicyObject *self)
{
    clear_all(self);
    Py_CLEAR(self->nodes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ---- the policy calls ---- */

static PyObject *po_admit(PolicyObject *self, PyObject *args)
{
    PyObject *ido;
    unsigned long long hash = 0;
    if (!ready(self) || !PyArg_ParseTuple(args, "OK:admit", &ido, &hash))
        return NULL;
    uint64_t id;
    int err;
    if (!as_id(ido, &id))
        return NULL;
    if (find(self, id, &err) || err) {
        if (!err)
            PyErr_Format(PyExc_KeyError, "id %llu is admitted already", (unsigned long long)id);
        return NULL;
    }
    pnode *n = calloc(1, sizeof *n);
    if (!n)
        return PyErr_NoMemory();
    n->id = id;
    PyObject *k = PyLong_FromUnsignedLongLong(id), *v = PyLong_FromVoidPtr(n);
    if (!k || !v || PyDict_SetItem(self->nodes, k, v) < 0) {
        Py_XDECREF(k);
        Py_XDECREF(v);
        free(n);
        return NULL;
    }
    Py_DECREF(k);
    Py_DECREF(v);
    policy_admit(&self->p, &n->pn, hash);
    Py_RETURN_NONE;
}

static PyObject *po_touch(PolicyObject *self, PyObject *ido)
{
    uint64_t id;
    int err;
    if (!ready(self) || !as_id(ido, &id))
        return NULL;
    pnode *n = find(self, id, &err);
    if (err)
        return NULL;
    if (!n)
        Py_RETURN_FALSE;
    policy_touch(&self->p, &n->pn);
    Py_RETURN_TRUE;
}

static PyObject *po_remove(PolicyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "id", "evicted", NULL };
    PyObject *ido;
    int evicted = 0;
    if (!ready(self) || !PyArg_ParseTupleAndKeywords(args, kw, "O|p:remove", kwlist, &ido,
                                                     &evicted))
        return NULL;
    uint64_t id;
    int err;
    if (!as_id(ido, &id))
        return NULL;
    pnode *n = find(self, id, &err);
    if (err)
        return NULL;
    if (!n)
        Py_RETURN_FALSE;
    if (evicted)
        policy_note_evict(&self->p, &n->pn);
    policy_remove(&self->p, &n->pn);
    if (forget(self, n) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyObject *po_rekey(PolicyObject *self, PyObject *args)
{
    PyObject *ido;
    unsigned long long hash = 0;
    if (!ready(self) || !PyArg_ParseTuple(args, "OK:rekey", &ido, &hash))
        return NULL;
    uint64_t id;
    int err;
    if (!as_id(ido, &id))
        return NULL;
    pnode *n = find(self, id, &err);
    if (err)
        return NULL;
    if (!n)
        Py_RETURN_FALSE;
    policy_rekey(&self->p, &n->pn, hash);
    Py_RETURN_TRUE;
}

static PyObject *po_victims(PolicyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "n", "skip", NULL };
    Py_ssize_t want;
    PyObject *skip = Py_None;
    if (!ready(self) || !PyArg_ParseTupleAndKeywords(args, kw, "n|O:victims", kwlist, &want,
                                                     &skip))
        return NULL;
    if (want <= 0)
        return PyList_New(0);
    if ((uint64_t)want > policy_count(&self->p))
        want = (Py_ssize_t)policy_count(&self->p);
    policy_node **v = malloc((size_t)(want ? want : 1) * sizeof *v);
    if (!v)
        return PyErr_NoMemory();
    self->skip = skip == Py_None ? NULL : skip;
    self->skip_error = 0;
    size_t got = policy_victims(&self->p, v, (size_t)want);
    self->skip = NULL;
    if (self->skip_error) {
        free(v);
        return NULL;
    }
    PyObject *out = PyList_New((Py_ssize_t)got);
    for (size_t i = 0; out && i < got; i++) {
        PyObject *k = PyLong_FromUnsignedLongLong(((pnode *)v[i])->id);
        if (!k) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, k);
    }
    free(v);
    return out;
}

static PyObject *po_select(PolicyObject *self, PyObject *arg)
{
    if (!ready(self))
        return NULL;
    const char *name = PyUnicode_Check(arg) ? PyUnicode_AsUTF8(arg) : NULL;
    if (!name) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "a policy name must be a str");
        return NULL;
    }
    if (policy_select(&self->p, name) != MEMOS_OK) {
        PyErr_Format(PyExc_ValueError, "unknown policy %.40s (lru_lfu, lru, lfu)", name);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *id_list(PolicyObject *self, int list)
{
    size_t n = policy_dump_list(&self->p, list, NULL, 0);
    policy_node **v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return PyErr_NoMemory();
    policy_dump_list(&self->p, list, v, n);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *k = PyLong_FromUnsignedLongLong(((pnode *)v[i])->id);
        if (!k) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, k);
    }
    free(v);
    return out;
}

static PyObject *po_ids(PolicyObject *self, PyObject *noarg)
{
    return ready(self) ? id_list(self, -1) : NULL;
}

static PyObject *po_stats(PolicyObject *self, PyObject *noarg)
{
    if (!ready(self))
        return NULL;
    policy_stats st;
    policy_get_stats(&self->p, &st);
    return Py_BuildValue("{sKsKsKsKsKsdsKsssKsKsKsIsI}", "ghost_hits_recency",
                         (unsigned long long)st.ghost_hits_recency, "ghost_hits_frequency",
                         (unsigned long long)st.ghost_hits_frequency, "ghost_entries",
                         (unsigned long long)st.ghost_entries, "probation",
                         (unsigned long long)st.probation, "protected",
                         (unsigned long long)st.protected_, "recency", st.recency, "count",
                         (unsigned long long)policy_count(&self->p), "decided", st.decided,
                         "switches", (unsigned long long)st.expert_switches, "ghost_bytes",
                         (unsigned long long)st.ghost_bytes, "sim_bytes",
                         (unsigned long long)st.sim_bytes, "setting", st.expert,
                         "sim_capacity", st.sim_cap);
}

static PyObject *po_check(PolicyObject *self, PyObject *noarg)
{
    if (!ready(self))
        return NULL;
    char why[256];
    if (policy_check(&self->p, why, sizeof why) != MEMOS_OK) {
        PyErr_SetString(PyExc_AssertionError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ---- dump and restore ---- */

static PyObject *u64_list(const policy_ghost *g, size_t n, int what)
{
    PyObject *l = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; l && i < n; i++) {
        unsigned long long v = what == 0 ? g[i].fp : what == 1 ? g[i].stamp : what == 2 ? g[i].age : g[i].cls;
        PyObject *k = PyLong_FromUnsignedLongLong(v);
        if (!k) {
            Py_CLEAR(l);
            break;
        }
        PyList_SET_ITEM(l, (Py_ssize_t)i, k);
    }
    return l;
}

/* The ghosts of ring r: {"hash": fingerprints, "stamp", "age", "cls": lists
 * of the same length, "epoch": the ring's epoch}. */
static PyObject *ring_dump(PolicyObject *self, unsigned r)
{
    uint64_t epoch;
    size_t len = policy_dump_ghosts(&self->p, r, NULL, 0, &epoch);
    policy_ghost *g = malloc((len ? len : 1) * sizeof *g);
    if (!g)
        return PyErr_NoMemory();
    policy_dump_ghosts(&self->p, r, g, len, &epoch);
    PyObject *h = u64_list(g, len, 0), *st = u64_list(g, len, 1), *ag = u64_list(g, len, 2),
             *cl = u64_list(g, len, 3);
    free(g);
    PyObject *out = h && st && ag && cl ? Py_BuildValue("{sOsOsOsOsK}", "hash", h, "stamp", st, "age",
                                                        ag, "cls", cl, "epoch",
                                                        (unsigned long long)epoch) : NULL;
    Py_XDECREF(h);
    Py_XDECREF(st);
    Py_XDECREF(ag);
    Py_XDECREF(cl);
    return out;
}

static PyObject *po_dump(PolicyObject *self, PyObject *noarg)
{
    if (!ready(self))
        return NULL;
    PyObject *out = NULL, *nodes = NULL, *lists = NULL, *ghosts = NULL;
    size_t n = policy_dump_list(&self->p, -1, NULL, 0);
    policy_node **v = malloc((n ? n : 1) * sizeof *v);
    if (!v)
        return PyErr_NoMemory();
    policy_dump_list(&self->p, -1, v, n);
    if (!(nodes = PyList_New((Py_ssize_t)n)))
        goto out;
    for (size_t i = 0; i < n; i++) {
        const pnode *x = (const pnode *)v[i];
        PyObject *t = Py_BuildValue("[KKIIII]", (unsigned long long)x->id,
                                    (unsigned long long)x->pn.hash, (unsigned)x->pn.freq,
                                    (unsigned)x->pn.ref, (unsigned)x->pn.stamp, (unsigned)x->pn.mcls);
        if (!t)
            goto out;
        PyList_SET_ITEM(nodes, (Py_ssize_t)i, t);
    }
    unsigned nl = policy_dump_lists(&self->p);
    if (!(lists = PyList_New(nl)))
        goto out;
    for (unsigned l = 0; l < nl; l++) {
        PyObject *ids = id_list(self, (int)l);
        if (!ids)
            goto out;
        PyList_SET_ITEM(lists, l, ids);
    }
    if (!(ghosts = PyList_New(0)))
        goto out;
    for (unsigned r = 0; r < policy_dump_rings(&self->p); r++) {
        PyObject *g = ring_dump(self, r);
        if (!g || PyList_Append(ghosts, g) < 0) {
            Py_XDECREF(g);
            goto out;
        }
        Py_DECREF(g);
    }
    uint64_t hits[2];
    double pfrac = policy_dump_balance(&self->p, hits);
    out = Py_BuildValue("{sssdsIsIsKsKsIsKsOsOsO}", "policy", self->p.name, "pfrac", pfrac,
                        "format", policy_dump_format(&self->p),
                        "expert", policy_dump_expert(&self->p),
                        "ghost_hits_recency", (unsigned long long)hits[0],
                        "ghost_hits_frequency", (unsigned long long)hits[1],
                        "tick", (unsigned)policy_dump_tick(&self->p),
                        "ghost_size", (unsigned long long)policy_dump_ghost_size(&self->p),
                        "nodes", nodes, "lists", lists, "ghosts", ghosts);
out:
    free(v);
    Py_XDECREF(nodes);
    Py_XDECREF(lists);
    Py_XDECREF(ghosts);
    return out;
}

static PyObject *bad(const char *what)
{
    PyErr_Format(PyExc_ValueError, "policy state: %s", what);
    return NULL;
}

static int get_u64(PyObject *o, unsigned long long *out)
{
    if (!PyLong_Check(o))
        return 0;
    *out = PyLong_AsUnsignedLongLong(o);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

static PyObject *restore_body(PolicyObject *self, PyObject *state)
{
    PyObject *nodes = PyDict_GetItemString(state, "nodes");
    PyObject *lists = PyDict_GetItemString(state, "lists");
    PyObject *ghosts = PyDict_GetItemString(state, "ghosts");
    PyObject *pf = PyDict_GetItemString(state, "pfrac");
    PyObject *g0 = PyDict_GetItemString(state, "ghost_hits_recency");
    PyObject *g1 = PyDict_GetItemString(state, "ghost_hits_frequency");
    if (!nodes || !PyList_Check(nodes) || !lists || !PyList_Check(lists) || !ghosts ||
        !PyList_Check(ghosts) || !pf || !PyFloat_Check(pf) || !g0 || !g1)
        return bad("missing or mistyped fields");
    /* lru_lfu's state format (POLICY_STATE_VERSION: segments, ghost
     * fingerprints, the setting in force); an older one (the bank's, "bank":
     * 2, or the 64-bit ghost hashes before it) is not this policy's state */
    PyObject *fm = PyDict_GetItemString(state, "format");   /* (borrowed; older files lack it) */
    unsigned long long format = 0;
    if (fm && !get_u64(fm, &format))
        return bad("the state format is not a number");
    if (format != policy_dump_format(&self->p))
        return bad(policy_dump_format(&self->p)
                       ? (PyDict_GetItemString(state, "bank")
                              ? "an lru_lfu state of an older format (the bank's)"
                              : format == 3 ? "an lru_lfu state of an older format (ghost rings)"
                              : "an lru_lfu state of an older format (64-bit ghosts)")
                       : "a state of another format");
    PyObject *tk = PyDict_GetItemString(state, "tick");     /* (borrowed; lru and lfu: any) */
    unsigned long long tick = 0;
    if (tk && (!get_u64(tk, &tick) || tick > UINT32_MAX))
        return bad("the clock is not a 32-bit count");
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(nodes); i++) {
        PyObject *t = PyList_GET_ITEM(nodes, i);
        unsigned long long id, hash, freq, ref, stamp = 0, cls = 0;
        if (!PyList_Check(t) || PyList_GET_SIZE(t) != 6 ||
            !get_u64(PyList_GET_ITEM(t, 0), &id) || !get_u64(PyList_GET_ITEM(t, 1), &hash) ||
            !get_u64(PyList_GET_ITEM(t, 2), &freq) || !get_u64(PyList_GET_ITEM(t, 3), &ref) ||
            !get_u64(PyList_GET_ITEM(t, 4), &stamp) || !get_u64(PyList_GET_ITEM(t, 5), &cls) ||
            stamp > UINT32_MAX || cls > 255)
            return bad("a node is not [id, hash, freq, ref, stamp, cls]");
        int err;
        if (find(self, id, &err) || err)
            return err ? NULL : bad("an id twice");
        pnode *n = calloc(1, sizeof *n);
        if (!n)
            return PyErr_NoMemory();
        n->id = id;
        PyObject *k = PyLong_FromUnsignedLongLong(id), *v = PyLong_FromVoidPtr(n);
        int rc = k && v ? PyDict_SetItem(self->nodes, k, v) : -1;
        Py_XDECREF(k);
        Py_XDECREF(v);
        if (rc < 0) {
            free(n);
            return NULL;
        }
        policy_restore_node(&self->p, &n->pn, hash, freq > UINT32_MAX ? UINT32_MAX : (uint32_t)freq,
                            (uint8_t)(ref > 255 ? 255 : ref));
        policy_restore_stamp(&self->p, &n->pn, (uint32_t)stamp, (uint8_t)cls, (uint32_t)tick);
    }
    self->p.tick = (uint32_t)tick;          /* (the ghosts' stamps count by it too) */
    if ((unsigned)PyList_GET_SIZE(lists) != policy_dump_lists(&self->p))
        return bad("wrong number of lists for the policy");
    for (Py_ssize_t l = 0; l < PyList_GET_SIZE(lists); l++) {
        PyObject *ids = PyList_GET_ITEM(lists, l);
        if (!PyList_Check(ids))
            return bad("a list is not a list");
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ids); i++) {
            unsigned long long id;
            int err;
            if (!get_u64(PyList_GET_ITEM(ids, i), &id))
                return bad("a list holds a non-id");
            pnode *n = find(self, id, &err);
            if (err)
                return NULL;
            if (!n || policy_restore_place(&self->p, &n->pn, (unsigned)l) != MEMOS_OK)
                return bad("a list names an unknown id, one twice, or one on the wrong list");
        }
    }
    if ((unsigned)PyList_GET_SIZE(ghosts) != policy_dump_rings(&self->p))
        return bad("wrong number of ghost rings");
    PyObject *gz = PyDict_GetItemString(state, "ghost_size");   /* (borrowed; lru and lfu: none) */
    unsigned long long gsize = 0;
    if (gz && !get_u64(gz, &gsize))
        return bad("the ghosts' size is not a count");
    if (policy_dump_rings(&self->p)) {
        int rc = policy_restore_ghost_size(&self->p, gsize);
        if (rc == MEMOS_ENOMEM)
            return PyErr_NoMemory();
        if (rc != MEMOS_OK)
            return bad("the ghosts' size is out of range");
    }
    for (Py_ssize_t r = 0; r < PyList_GET_SIZE(ghosts); r++) {
        PyObject *g = PyList_GET_ITEM(ghosts, r);
        static const char *const F[4] = { "hash", "stamp", "age", "cls" };
        PyObject *f[4];
        for (int j = 0; j < 4; j++)
            f[j] = PyDict_Check(g) ? PyDict_GetItemString(g, F[j]) : NULL;
        PyObject *ep = PyDict_Check(g) ? PyDict_GetItemString(g, "epoch") : NULL;
        unsigned long long epoch;
        int ok = ep && get_u64(ep, &epoch);
        for (int j = 0; ok && j < 4; j++)
            ok = f[j] && PyList_Check(f[j]) && PyList_GET_SIZE(f[j]) == PyList_GET_SIZE(f[0]);
        if (!ok)
            return bad("a ghost ring is not {hash, stamp, age, cls, epoch}");
        size_t len = (size_t)PyList_GET_SIZE(f[0]);
        policy_ghost *gs = malloc((len ? len : 1) * sizeof *gs);
        if (!gs)
            return PyErr_NoMemory();
        for (size_t i = 0; ok && i < len; i++) {
            unsigned long long x[4];
            for (int j = 0; ok && j < 4; j++)
                ok = get_u64(PyList_GET_ITEM(f[j], (Py_ssize_t)i), &x[j]);
            if (ok && (x[1] > UINT32_MAX || x[2] > 0xffff || x[3] > 255))
                ok = 0;
            if (ok) {
                gs[i].fp = x[0];
                gs[i].stamp = (uint32_t)x[1];
                gs[i].age = (uint16_t)x[2];
                gs[i].cls = (uint8_t)x[3];
            }
        }
        int rc = ok ? policy_restore_ghosts(&self->p, (unsigned)r, gs, len, epoch) : MEMOS_EINVAL;
        free(gs);
        if (rc == MEMOS_ENOMEM)
            return PyErr_NoMemory();
        if (rc != MEMOS_OK)
            return bad("a ghost ring does not check out");
    }
    unsigned long long h0, h1;
    if (!get_u64(g0, &h0) || !get_u64(g1, &h1))
        return bad("ghost hits are not counts");
    uint64_t hits[2] = { h0, h1 };
    PyObject *ex = PyDict_GetItemString(state, "expert");    /* (borrowed; older files lack it) */
    if (ex) {
        unsigned long long e;
        if (!get_u64(ex, &e) || e > 1000 || policy_restore_expert(&self->p, (unsigned)e) != MEMOS_OK)
            return bad("the setting in force is not one of the policy's");
    }
    char why[256];
    if (policy_restore_finish(&self->p, PyFloat_AS_DOUBLE(pf), hits, why, sizeof why) != MEMOS_OK)
        return bad(why);
    Py_RETURN_NONE;
}

/* Rebuild the dumped state in this (empty) policy; on ValueError the policy
 * is left empty, of the dumped kind. */
static PyObject *po_restore(PolicyObject *self, PyObject *state)
{
    if (!ready(self))
        return NULL;
    if (!PyDict_Check(state))
        return bad("not a dict");
    if (policy_count(&self->p) || PyDict_Size(self->nodes))
        return bad("restore needs an empty policy");
    PyObject *name = PyDict_GetItemString(state, "policy");
    const char *nm = name && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : NULL;
    if (!nm) {
        PyErr_Clear();
        return bad("no policy name");
    }
    clear_all(self);
    if (policy_init(&self->p, nm, skip_filter, self) != MEMOS_OK) {
        policy_destroy(&self->p);
        policy_init(&self->p, "lru_lfu", skip_filter, self);
        self->ready = 1;
        return bad("unknown policy name");
    }
    self->ready = 1;
    PyObject *r = restore_body(self, state);
    if (!r) {
        char name_copy[16];
        snprintf(name_copy, sizeof name_copy, "%s", self->p.name);
        PyObject *et, *ev, *tb;
        PyErr_Fetch(&et, &ev, &tb);
        clear_all(self);
        policy_init(&self->p, name_copy, skip_filter, self);
        self->ready = 1;
        PyErr_Restore(et, ev, tb);
    }
    return r;
}

/* ---- protocol and attributes ---- */

static Py_ssize_t po_len(PolicyObject *self)
{
    return ready(self) ? (Py_ssize_t)policy_count(&self->p) : -1;
}

static int po_contains(PolicyObject *self, PyObject *ido)
{
    uint64_t id;
    int err;
    if (!ready(self) || !as_id(ido, &id))
        return -1;
    pnode *n = find(self, id, &err);
    return err ? -1 : n != NULL;
}

static PyObject *po_name(PolicyObject *self, void *closure)
{
    return ready(self) ? PyUnicode_FromString(self->p.name) : NULL;
}

static PyMethodDef po_methods[] = {
    { "admit", (PyCFunction)po_admit, METH_VARARGS, "admit(id, hash): a new entry" },
    { "touch", (PyCFunction)po_touch, METH_O, "touch(id) -> bool: a use of the entry" },
    { "remove", (PyCFunction)(void (*)(void))po_remove, METH_VARARGS | METH_KEYWORDS,
      "remove(id, evicted=False) -> bool; evicted: remember it in a ghost" },
    { "rekey", (PyCFunction)po_rekey, METH_VARARGS, "rekey(id, hash) -> bool: renamed" },
    { "victims", (PyCFunction)(void (*)(void))po_victims, METH_VARARGS | METH_KEYWORDS,
      "victims(n, skip=None) -> up to n ids, best victim first (not removed)" },
    { "select", (PyCFunction)po_select, METH_O, "select(name): switch the victim order" },
    { "ids", (PyCFunction)po_ids, METH_NOARGS, "ids() -> every id, most recently used first" },
    { "stats", (PyCFunction)po_stats, METH_NOARGS, "stats() -> dict of the policy's figures" },
    { "check", (PyCFunction)po_check, METH_NOARGS, "check(): AssertionError if inconsistent" },
    { "dump", (PyCFunction)po_dump, METH_NOARGS, "dump() -> the state, JSON-able" },
    { "restore", (PyCFunction)po_restore, METH_O,
      "restore(state): rebuild a dump in this empty policy (ValueError: left empty)" },
    { NULL, NULL, 0, NULL },
};

static PyGetSetDef po_getset[] = {
    { "name", (getter)po_name, NULL, "the policy's name", NULL },
    { NULL, NULL, NULL, NULL, NULL },
};

static PySequenceMethods po_seq = {
    .sq_length = (lenfunc)po_len,
    .sq_contains = (objobjproc)po_contains,
};

static PyTypeObject PolicyType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "memosfs._native.Policy",
    .tp_basicsize = sizeof(PolicyObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An eviction policy (lru_lfu, lru, lfu) over entries named by integer ids.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)po_init,
    .tp_dealloc = (destructor)po_dealloc,
    .tp_methods = po_methods,
    .tp_getset = po_getset,
    .tp_as_sequence = &po_seq,
};

/* policy_explain(keys, capacity, evict_batch=1): lru_lfu's replay of a
 * buffer of uint64 block ids (as policy_simulate) with what decided its
 * victims: each shadow's estimated hits (the setting it stands for), the
 * accesses served under each setting, the windows decided, what decided at
 * the end, the switches and the memory (ghosts, shadows). */
static PyObject *mod_policy_explain(PyObject *m, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = { "keys", "capacity", "evict_batch", NULL };
    Py_buffer view;
    long long capacity;
    int batch = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "y*L|i:policy_explain", kwlist, &view, &capacity,
                                     &batch))
        return NULL;
    if (view.len % 8 || capacity <= 0 || capacity > (1LL << 29) || batch <= 0 || batch > 4096) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "keys must be uint64s, capacity in 1..2**29, "
                                          "evict_batch in 1..4096");
        return NULL;
    }
    policy_stats st;
    long long hits;
    Py_BEGIN_ALLOW_THREADS
    hits = policy_simulate("lru_lfu", view.buf, (size_t)view.len / 8, (size_t)capacity,
                           (unsigned)batch, &st);
    Py_END_ALLOW_THREADS
    Py_ssize_t n = view.len / 8;
    PyBuffer_Release(&view);
    if (hits < 0)
        return PyErr_NoMemory();
    PyObject *est = PyDict_New(), *time = PyDict_New();
    for (unsigned e = 0; est && time && e < POLICY_SIM_N; e++) {
        char name[16];
        snprintf(name, sizeof name, "lru_lfu@%u", st.sim_settings[e]);
        PyObject *v = PyFloat_FromDouble(st.sim_hits[e]);
        PyObject *t = PyLong_FromUnsignedLongLong(st.sim_time[e]);
        int bad_ = !v || !t || PyDict_SetItemString(est, name, v) < 0 ||
                   PyDict_SetItemString(time, name, t) < 0;
        Py_XDECREF(v);
        Py_XDECREF(t);
        if (bad_) {
            Py_CLEAR(est);
            break;
        }
    }
    if (!est || !time) {
        Py_XDECREF(est);
        Py_XDECREF(time);
        return NULL;
    }
    return Py_BuildValue("{sLsnsNsNsKsssIsKsIsKsKsKsK}", "hits", hits, "lookups", n,
                         "estimated_hits", est, "accesses_by_setting", time,
                         "live_hits", (unsigned long long)st.live_hits,
                         "decided", st.decided, "setting", st.expert,
                         "switches", (unsigned long long)st.expert_switches,
                         "capacity_judged", st.sim_cap,
                         "judged", (unsigned long long)st.sim_accesses,
                         "decisions", (unsigned long long)st.sim_decisions,
                         "sim_bytes", (unsigned long long)st.sim_bytes,
                         "ghost_bytes", (unsigned long long)st.ghost_bytes);
}

static PyMethodDef policy_functions[] = {
    { "policy_explain", (PyCFunction)(void (*)(void))mod_policy_explain,
      METH_VARARGS | METH_KEYWORDS,
      "policy_explain(keys, capacity, evict_batch=1) -> dict: lru_lfu's replay with what "
      "decided its victims (each shadow's estimated hits, the accesses under each setting, "
      "what decided, switches, the memory of ghosts and shadows)" },
    { NULL, NULL, 0, NULL },
};

int pym_policy_register(PyObject *m)
{
    if (PyModule_AddFunctions(m, policy_functions) < 0)
        return -1;
    if (PyType_Ready(&PolicyType) < 0)
        return -1;
    Py_INCREF(&PolicyType);
    if (PyModule_AddObject(m, "Policy", (PyObject *)&PolicyType) < 0) {
        Py_DECREF(&PolicyType);
        return -1;
    }
    return 0;
}
