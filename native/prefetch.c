/*
 * prefetch.c — the prefetcher's tables: per-session stride detector and
 * heat table (see prefetch.h for what they mean).
 *
 * Layout.  Both tables keep their entries in a dense array (0..count-1, so a
 * full scan — the coldest heat entry, the least recently seen session, the
 * hottest k — walks contiguous memory) and find them through an open-addressing
 * map from the 64-bit id to the dense position: linear probing over a power
 * of two at most half full, backward-shift deletion (no tombstones).
 * Removing from the dense array moves its last entry into the hole and
 * updates that entry's map slot.
 *
 * Decay.  A heat h that halves every H touches is stored as h * g^t, where t
 * is the table's touch clock and g = 2^(1/H): a touch adds weight * g^t (one
 * multiply of the running scale), comparisons need no decay at all, and the
 * heat now is stored / scale.  When the scale passes 2^400 every stored
 * value is divided by it and the scale starts again from 1.
 */
#include <errno.h>
#include <math.h>   /* isfinite only: the core links no libm */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "prefetch.h"

#define PF_EMPTY      UINT32_MAX
#define PF_RESCALE_AT 0x1p400

/* ---- the id -> dense position map ---- */

typedef struct pf_map {
    uint32_t *pos;       /* dense position, PF_EMPTY = free slot */
    uint32_t  mask;      /* slots - 1 */
} pf_map;

static uint64_t mix64(uint64_t x)   /* splitmix64's finalizer */
{
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static int map_init(pf_map *m, uint32_t capacity)
{
    uint64_t slots = 16;
    while (slots < 2ull * capacity)
        slots <<= 1;
    m->pos = malloc(slots * sizeof *m->pos);
    if (!m->pos)
        return -1;
    memset(m->pos, 0xff, slots * sizeof *m->pos);
    m->mask = (uint32_t)(slots - 1);
    return 0;
}

/* The map slot holding id (ids[] gives the id at a dense position), or the
 * free slot where it would go. */
static uint32_t map_slot(const pf_map *m, const uint64_t *ids, size_t stride, uint64_t id)
{
    uint32_t i = (uint32_t)mix64(id) & m->mask;
    while (m->pos[i] != PF_EMPTY) {
        if (*(const uint64_t *)((const char *)ids + (size_t)m->pos[i] * stride) == id)
            return i;
        i = (i + 1) & m->mask;
    }
    return i;
}

/* Free slot i, shifting later members of its probe run back. */
static void map_delete(pf_map *m, const uint64_t *ids, size_t stride, uint32_t i)
{
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (m->pos[j] == PF_EMPTY)
            break;
        uint64_t id = *(const uint64_t *)((const char *)ids + (size_t)m->pos[j] * stride);
        uint32_t home = (uint32_t)mix64(id) & m->mask;
        /* j's entry may move to i if its home is not in (i, j] cyclically */
        if (((j - home) & m->mask) >= ((j - i) & m->mask)) {
            m->pos[i] = m->pos[j];
            i = j;
        }
    }
    m->pos[i] = PF_EMPTY;
}

/* ---- the tables ---- */

typedef struct pf_session {
    uint64_t id;             /* first: the map reads ids through it */
    uint64_t last_seen;      /* observation clock at the last observe */
    pf_stride_info st;
} pf_session;

typedef struct pf_heat {
    uint64_t id;             /* first */
    double   stored;         /* heat * scale */
} pf_heat;

struct pf_table {
    pthread_mutex_t lock;
    pf_config  cfg;
    /* stride detector */
    pf_map      smap;
    pf_session *sess;        /* dense, nsess used */
    uint32_t    nsess;
    /* heat table */
    pf_map      hmap;
    pf_heat    *heat;        /* dense, nheat used */
    uint32_t    nheat;
    double      scale;       /* g^t since the last rescale */
    double      growth;      /* g = 2^(1/halflife) */
    pf_stats    stats;
};

/* 2^x without libm (the core links none): 2^n by doubling, 2^f for the
 * fraction f in [0, 1) by its Taylor series in f ln 2. */
static double pow2(double x)
{
    if (x > 1000.0)
        x = 1000.0;
    if (x < -1000.0)
        x = -1000.0;
    long n = (long)x;
    if ((double)n > x)
        n--;
    double t = (x - (double)n) * 0.69314718055994530942, term = 1.0, sum = 1.0;
    for (int k = 1; k < 30; k++) {
        term *= t / k;
        sum += term;
    }
    for (; n > 0; n--)
        sum *= 2.0;
    for (; n < 0; n++)
        sum *= 0.5;
    return sum;
}

void pf_config_default(pf_config *cfg)
{
    cfg->sessions = 4096;
    cfg->heat_capacity = 4096;
    cfg->confirm = 2;
    cfg->halflife = 1024.0;
}

pf_table *pf_new(const pf_config *cfg)
{
    pf_config c;
    if (cfg)
        c = *cfg;
    else
        pf_config_default(&c);
    if (c.sessions < 1 || c.sessions > (1u << 24) || c.heat_capacity < 1 ||
        c.heat_capacity > (1u << 24) || c.confirm < 1 || c.confirm > 64 ||
        !(c.halflife > 0.0) || !isfinite(c.halflife)) {
        errno = EINVAL;
        return NULL;
    }
    pf_table *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->cfg = c;
    p->sess = malloc((size_t)c.sessions * sizeof *p->sess);
    p->heat = malloc((size_t)c.heat_capacity * sizeof *p->heat);
    if (!p->sess || !p->heat || map_init(&p->smap, c.sessions) < 0 ||
        map_init(&p->hmap, c.heat_capacity) < 0 || pthread_mutex_init(&p->lock, NULL) != 0) {
        free(p->smap.pos);
        free(p->hmap.pos);
        free(p->sess);
        free(p->heat);
        free(p);
        errno = ENOMEM;
        return NULL;
    }
    p->scale = 1.0;
    p->growth = pow2(1.0 / c.halflife);
    return p;
}

void pf_free(pf_table *p)
{
    if (!p)
        return;
    pthread_mutex_destroy(&p->lock);
    free(p->smap.pos);
    free(p->hmap.pos);
    free(p->sess);
    free(p->heat);
    free(p);
}

/* ---- stride detector ---- */

static void sess_remove_at(pf_table *p, uint32_t d)
{
    uint32_t slot = map_slot(&p->smap, &p->sess[0].id, sizeof *p->sess, p->sess[d].id);
    map_delete(&p->smap, &p->sess[0].id, sizeof *p->sess, slot);
    uint32_t last = --p->nsess;
    if (d != last) {
        p->sess[d] = p->sess[last];
        uint32_t s = map_slot(&p->smap, &p->sess[0].id, sizeof *p->sess, p->sess[d].id);
        p->smap.pos[s] = d;
    }
}

int64_t pf_stride_observe(pf_table *p, uint64_t session, int64_t index, pf_stride_info *info)
{
    pthread_mutex_lock(&p->lock);
    uint64_t now = ++p->stats.observations;
    uint32_t slot = map_slot(&p->smap, &p->sess[0].id, sizeof *p->sess, session);
    pf_session *s;
    if (p->smap.pos[slot] == PF_EMPTY) {
        if (p->nsess == p->cfg.sessions) {      /* forget the least recently seen */
            uint32_t old = 0;
            for (uint32_t i = 1; i < p->nsess; i++)
                if (p->sess[i].last_seen < p->sess[old].last_seen)
                    old = i;
            sess_remove_at(p, old);
            p->stats.sessions_evicted++;
            slot = map_slot(&p->smap, &p->sess[0].id, sizeof *p->sess, session);
        }
        uint32_t d = p->nsess++;
        s = &p->sess[d];
        memset(s, 0, sizeof *s);
        s->id = session;
        s->st.last_index = index;
        s->st.observations = 1;
        s->last_seen = now;
        p->smap.pos[slot] = d;
    } else {
        s = &p->sess[p->smap.pos[slot]];
        s->last_seen = now;
        s->st.observations++;
        /* wrap-around arithmetic: indices far apart give some delta, never UB */
        int64_t delta = (int64_t)((uint64_t)index - (uint64_t)s->st.last_index);
        s->st.last_index = index;
        if (delta != 0) {
            if (delta == s->st.candidate) {
                if (s->st.run < UINT32_MAX)
                    s->st.run++;
            } else {
                s->st.candidate = delta;
                s->st.run = 1;
            }
            if (s->st.run >= p->cfg.confirm) {
                if (s->st.stride != delta)
                    p->stats.confirmations++;
                s->st.stride = delta;
                s->st.misses = 0;
            } else if (s->st.stride != 0 && delta != s->st.stride) {
                if (++s->st.misses >= 2 * p->cfg.confirm) {
                    s->st.stride = 0;
                    s->st.misses = 0;
                }
            } else if (delta == s->st.stride) {
                s->st.misses = 0;
            }
        }
    }
    int64_t stride = s->st.stride;
    if (info)
        *info = s->st;
    pthread_mutex_unlock(&p->lock);
    return stride;
}

int pf_stride_get(pf_table *p, uint64_t session, pf_stride_info *info)
{
    pthread_mutex_lock(&p->lock);
    uint32_t slot = map_slot(&p->smap, &p->sess[0].id, sizeof *p->sess, session);
    int rc = MEMOS_ENOENT;
    if (p->smap.pos[slot] != PF_EMPTY) {
        if (info)
            *info = p->sess[p->smap.pos[slot]].st;
        rc = MEMOS_OK;
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

int pf_stride_forget(pf_table *p, uint64_t session)
{
    pthread_mutex_lock(&p->lock);
    uint32_t slot = map_slot(&p->smap, &p->sess[0].id, sizeof *p->sess, session);
    int rc = MEMOS_ENOENT;
    if (p->smap.pos[slot] != PF_EMPTY) {
        sess_remove_at(p, p->smap.pos[slot]);
        rc = MEMOS_OK;
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

/* ---- heat table ---- */

static void heat_remove_at(pf_table *p, uint32_t d)
{
    uint32_t slot = map_slot(&p->hmap, &p->heat[0].id, sizeof *p->heat, p->heat[d].id);
    map_delete(&p->hmap, &p->heat[0].id, sizeof *p->heat, slot);
    uint32_t last = --p->nheat;
    if (d != last) {
        p->heat[d] = p->heat[last];
        uint32_t s = map_slot(&p->hmap, &p->heat[0].id, sizeof *p->heat, p->heat[d].id);
        p->hmap.pos[s] = d;
    }
}

int pf_heat_touch(pf_table *p, uint64_t id, double weight, uint64_t *evicted)
{
    if (!(weight > 0.0) || !isfinite(weight) || weight > 0x1p100)
        return MEMOS_EINVAL;
    int out = 0;
    pthread_mutex_lock(&p->lock);
    p->stats.heat_touches++;
    p->scale *= p->growth;
    if (p->scale > PF_RESCALE_AT) {
        for (uint32_t i = 0; i < p->nheat; i++)
            p->heat[i].stored /= p->scale;
        p->scale = 1.0;
    }
    uint32_t slot = map_slot(&p->hmap, &p->heat[0].id, sizeof *p->heat, id);
    if (p->hmap.pos[slot] != PF_EMPTY) {
        p->heat[p->hmap.pos[slot]].stored += weight * p->scale;
    } else {
        if (p->nheat == p->cfg.heat_capacity) {  /* evict the coldest */
            uint32_t cold = 0;
            for (uint32_t i = 1; i < p->nheat; i++)
                if (p->heat[i].stored < p->heat[cold].stored)
                    cold = i;
            if (evicted)
                *evicted = p->heat[cold].id;
            heat_remove_at(p, cold);
            p->stats.heat_evicted++;
            out = 1;
            slot = map_slot(&p->hmap, &p->heat[0].id, sizeof *p->heat, id);
        }
        uint32_t d = p->nheat++;
        p->heat[d].id = id;
        p->heat[d].stored = weight * p->scale;
        p->hmap.pos[slot] = d;
    }
    pthread_mutex_unlock(&p->lock);
    return out;
}

double pf_heat_get(pf_table *p, uint64_t id)
{
    pthread_mutex_lock(&p->lock);
    uint32_t slot = map_slot(&p->hmap, &p->heat[0].id, sizeof *p->heat, id);
    double h = 0.0;
    if (p->hmap.pos[slot] != PF_EMPTY)
        h = p->heat[p->hmap.pos[slot]].stored / p->scale;
    pthread_mutex_unlock(&p->lock);
    return h;
}

int pf_heat_remove(pf_table *p, uint64_t id)
{
    pthread_mutex_lock(&p->lock);
    uint32_t slot = map_slot(&p->hmap, &p->heat[0].id, sizeof *p->heat, id);
    int rc = MEMOS_ENOENT;
    if (p->hmap.pos[slot] != PF_EMPTY) {
        heat_remove_at(p, p->hmap.pos[slot]);
        rc = MEMOS_OK;
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

/* a hotter than b: more heat, ties by smaller id */
static int hotter(const pf_heat *a, const pf_heat *b)
{
    return a->stored > b->stored || (a->stored == b->stored && a->id < b->id);
}

/* The k hottest into top[] (heat order, hottest first), under the lock:
 * insertion into a sorted array of k, O(n k) but k is small. */
static size_t heat_top_locked(pf_table *p, pf_heat *top, size_t k)
{
    size_t n = 0;
    for (uint32_t i = 0; i < p->nheat; i++) {
        const pf_heat *e = &p->heat[i];
        if (n == k && !hotter(e, &top[n - 1]))
            continue;
        size_t j = n < k ? n++ : k - 1;
        while (j > 0 && hotter(e, &top[j - 1])) {
            top[j] = top[j - 1];
            j--;
        }
        top[j] = *e;
    }
    return n;
}

size_t pf_heat_top(pf_table *p, pf_heat_item *out, size_t k)
{
    if (k == 0)
        return 0;
    pthread_mutex_lock(&p->lock);
    if (k > p->nheat)
        k = p->nheat;
    pf_heat *top = malloc((k ? k : 1) * sizeof *top);
    size_t n = 0;
    if (top) {
        n = heat_top_locked(p, top, k);
        for (size_t i = 0; i < n; i++) {
            out[i].id = top[i].id;
            out[i].heat = top[i].stored / p->scale;
        }
    }
    pthread_mutex_unlock(&p->lock);
    free(top);
    return n;
}

static uint64_t xorshift64s(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

size_t pf_heat_sample(pf_table *p, uint64_t *out, size_t k, size_t pool, uint64_t *rng)
{
    if (k == 0 || pool == 0)
        return 0;
    if (*rng == 0)
        *rng = 0x9e3779b97f4a7c15ull;
    pthread_mutex_lock(&p->lock);
    if (pool > p->nheat)
        pool = p->nheat;
    pf_heat *top = malloc((pool ? pool : 1) * sizeof *top);
    size_t n = 0;
    if (top) {
        size_t m = heat_top_locked(p, top, pool);
        double total = 0.0;
        for (size_t i = 0; i < m; i++)
            total += top[i].stored;
        while (n < k && m > 0) {
            /* uniform in [0, total): 53 random bits */
            double u = (double)(xorshift64s(rng) >> 11) * 0x1p-53 * total;
            size_t pick = m - 1;
            double acc = 0.0;
            for (size_t i = 0; i < m; i++) {
                acc += top[i].stored;
                if (u < acc) {
                    pick = i;
                    break;
                }
            }
            out[n++] = top[pick].id;
            total -= top[pick].stored;
            top[pick] = top[--m];           /* drawn without replacement */
            if (!(total > 0.0)) {           /* rounding left nothing: recount */
                total = 0.0;
                for (size_t i = 0; i < m; i++)
                    total += top[i].stored;
            }
        }
    }
    pthread_mutex_unlock(&p->lock);
    free(top);
    return n;
}

void pf_get_stats(pf_table *p, pf_stats *out)
{
    pthread_mutex_lock(&p->lock);
    *out = p->stats;
    out->sessions = p->nsess;
    out->heat_entries = p->nheat;
    pthread_mutex_unlock(&p->lock);
}

/* ---- invariants ---- */

static int check_map(const pf_map *m, const uint64_t *ids, size_t stride, uint32_t n,
                     const char *what, char *why, size_t whylen)
{
    uint32_t found = 0;
    for (uint32_t i = 0; i <= m->mask; i++) {
        if (m->pos[i] == PF_EMPTY)
            continue;
        found++;
        if (m->pos[i] >= n) {
            snprintf(why, whylen, "%s map slot %u points past the dense array", what, i);
            return MEMOS_EINVAL;
        }
        uint64_t id = *(const uint64_t *)((const char *)ids + (size_t)m->pos[i] * stride);
        if (map_slot(m, ids, stride, id) != i) {
            snprintf(why, whylen, "%s id %llu is not found at its map slot %u", what,
                     (unsigned long long)id, i);
            return MEMOS_EINVAL;
        }
    }
    if (found != n) {
        snprintf(why, whylen, "%s map holds %u ids, dense array %u", what, found, n);
        return MEMOS_EINVAL;
    }
    return MEMOS_OK;
}

int pf_check(pf_table *p, char *why, size_t whylen)
{
    pthread_mutex_lock(&p->lock);
    int rc = check_map(&p->smap, &p->sess[0].id, sizeof *p->sess, p->nsess, "session",
                       why, whylen);
    if (rc == MEMOS_OK)
        rc = check_map(&p->hmap, &p->heat[0].id, sizeof *p->heat, p->nheat, "heat",
                       why, whylen);
    if (rc == MEMOS_OK && (p->nsess > p->cfg.sessions || p->nheat > p->cfg.heat_capacity)) {
        snprintf(why, whylen, "over capacity");
        rc = MEMOS_EINVAL;
    }
    for (uint32_t i = 0; rc == MEMOS_OK && i < p->nheat; i++)
        if (!(p->heat[i].stored >= 0.0) || !isfinite(p->heat[i].stored)) {
            snprintf(why, whylen, "heat of id %llu is %g", (unsigned long long)p->heat[i].id,
                     p->heat[i].stored);
            rc = MEMOS_EINVAL;
        }
    pthread_mutex_unlock(&p->lock);
    return rc;
}
