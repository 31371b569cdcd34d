/*
 * lru_lfu.c — the default policy: the two-segment hybrid (hybrid.c) at one
 * setting at a time, the setting chosen by a miniature simulation.
 *
 * The live path is the hybrid's: O(1) an access, the 48-byte policy_node
 * every policy has, and the ghosts (hybrid.c: 31 to 62 bytes per entry).
 * No published policy and no setting wins on every stream (LRU where
 * recency is all, a tiny probation on loops larger than the cache, a small
 * one on skewed popularity), so a few settings (SIM_SETTINGS) are replayed
 * in miniature beside the cache, after SHARDS (Waldspurger et al., FAST
 * 2015) and miniature simulations (Waldspurger et al., USENIX ATC 2017):
 *
 *   sample    a key is in the sample iff a hash of its key hash falls
 *             below a threshold: a spatial sample, the same keys always;
 *             the rate is at most SIM_RATE_MAX (1%) and falls with the
 *             cache's size so that each simulated cache holds at most
 *             SIM_CAP_MAX entries (fixed-size sampling: memory fixed).
 *   simulate  each setting runs as a member (m_hybrid.c: the hybrid's own
 *             code over nodes of its own) of capacity size × rate, seeing
 *             only the sampled keys' accesses (and deletions).
 *   decide    once per window (the simulated capacity in sampled
 *             accesses, at least SIM_WINDOW), each setting's hits in the
 *             window join a score that keeps SIM_DECAY of itself each
 *             window; the best score takes over if it leads the setting in
 *             force by SIM_MARGIN of a window.  Switching is a
 *             change of the live hybrid's setting (the split, the ghost
 *             rule): the segments and ghosts stay, O(1).
 *
 * A cache too small for its sample to fill SIM_CAP_MIN entries (below
 * SIM_CAP_MIN / SIM_RATE_MAX = 3,200 entries) runs SIM_START and simulates
 * nothing.  The simulation runs only when the cache was full (its size
 * known: the count when victims were last asked for); a size that moves by
 * more than an eighth rescales it (members evict down to the new capacity;
 * keys sampled at a higher rate age out).
 *
 * Cost: one multiply and compare per access; a sampled access (≤ 1%) is one
 * access of each of POLICY_SIM_N members.  Memory fixed: POLICY_SIM_N
 * members of at most SIM_CAP_MAX entries, their nodes, tables and ghosts:
 * under 1 MiB (policy_stats sim_bytes), allocated when the cache first
 * fills, whatever the entry count.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hybrid.h"
#include "lists.h"
#include "member.h"

/* ---- types and constants ---- */

#define SIM_RATE_MAX 0.01      /* at most this share of the keys is sampled */
#define SIM_CAP_MAX  512u      /* each simulated cache: at most this many entries */
#define SIM_CAP_MIN  32u       /* ... and at least this many, or no simulation */
#define SIM_WINDOW   128u      /* a window: the simulated capacity in sampled accesses, at least this many */
#define SIM_DECAY    0.75      /* a score keeps this share of itself each window */
#define SIM_MARGIN   0.01      /* a lead must pass this share of a window's accesses */
#define SIM_START    2u        /* the setting before any decision (HYBRIDS index) */

static const unsigned SIM_SETTINGS[POLICY_SIM_N] = { 0, 1, 2, 5 };

typedef struct policy_minisim {
    member   m[POLICY_SIM_N];       /* the settings, simulated (SIM_SETTINGS order) */
    uint64_t win[POLICY_SIM_N];     /* hits this window */
    uint64_t total[POLICY_SIM_N];   /* hits since the simulation started */
    double   score[POLICY_SIM_N];   /* window hits, decayed by SIM_DECAY a window */
    uint64_t seen;                  /* sampled accesses this window */
    uint64_t sampled, decisions;    /* sampled accesses, windows decided, so far */
    uint64_t thresh;                /* a key is sampled iff its sample hash < thresh (of 2^32) */
    double   rate;                  /* thresh / 2^32 */
    size_t   cap;                   /* simulated capacity (0: not running) */
    uint64_t full;                  /* the live size the rate was set for */
    int      ready;                 /* the members are made */
    int      decided;               /* a window decided the setting in force */
} policy_minisim;

/* ---- private prototypes ---- */

static int  sampled(const policy_minisim *s, uint64_t hash);
static void decide(policy *p, policy_minisim *s);

/* ---- the table ---- */

static int ll_start(policy *p)
{
    hybrid_setting(p, SIM_START);
    if (!p->sim)
        p->sim = calloc(1, sizeof *p->sim);     /* no memory: the start setting alone */
    return hybrid_start(p);
}

static void ll_stop(policy *p)
{
    if (p->sim) {
        for (unsigned i = 0; i < POLICY_SIM_N; i++)
            if (p->sim->ready)
                member_free(&p->sim->m[i]);
        free(p->sim);
        p->sim = NULL;
    }
    hybrid_stop(p);
}

static void ll_access(policy *p, policy_node *n, int hit)
{
    hybrid_access(p, n, hit);
    policy_minisim *s = p->sim;
    if (!s || !s->cap || !sampled(s, n->hash))
        return;
    for (unsigned i = 0; i < POLICY_SIM_N; i++) {
        int h = member_access(&s->m[i], n->hash);
        s->win[i] += (uint64_t)h;
        s->total[i] += (uint64_t)h;
    }
    s->sampled++;
    if (++s->seen >= (s->cap > SIM_WINDOW ? s->cap : SIM_WINDOW))
        decide(p, s);
}

static void ll_remove(policy *p, policy_node *n, int evicted)
{
    hybrid_remove(p, n, evicted);
    policy_minisim *s = p->sim;
    if (!evicted && s && s->cap && sampled(s, n->hash))   /* deleted: the sample forgets it too */
        for (unsigned i = 0; i < POLICY_SIM_N; i++)
            member_remove(&s->m[i], n->hash);
}

/* The cache's size when full: the rate and the simulated capacity follow
 * (when it moves by more than an eighth). */
static void ll_resize(policy *p, uint64_t full)
{
    policy_minisim *s = p->sim;
    if (!s || (s->full && full + s->full / 8 >= s->full && full <= s->full + s->full / 8))
        return;
    s->full = full;
    double rate = (double)SIM_CAP_MAX / (double)full;
    rate = rate < SIM_RATE_MAX ? rate : SIM_RATE_MAX;
    size_t cap = (size_t)((double)full * rate + 0.5);
    if (cap < SIM_CAP_MIN) {
        s->cap = 0;
        return;
    }
    for (unsigned i = 0; i < POLICY_SIM_N && !s->ready; i++)
        if (member_init_hybrid(&s->m[i], SIM_SETTINGS[i], cap) != MEMOS_OK) {
            while (i-- > 0)
                member_free(&s->m[i]);
            s->cap = 0;         /* no memory: the setting in force stays */
            return;
        }
    s->ready = 1;
    for (unsigned i = 0; i < POLICY_SIM_N; i++)
        member_resize(&s->m[i], cap);
    s->cap = cap;
    s->rate = rate;
    s->thresh = (uint64_t)(rate * 4294967296.0);
}

static int ll_check(const policy *p, char *why, size_t whylen)
{
    int rc = hybrid_check(p, why, whylen);
    const policy_minisim *s = p->sim;
    for (unsigned i = 0; rc == MEMOS_OK && s && s->ready && i < POLICY_SIM_N; i++)
        rc = member_check(&s->m[i], why, whylen);
    if (rc == MEMOS_OK && s && s->cap > SIM_CAP_MAX)
        PFAIL("policy: simulated capacity %zu over %u", s->cap, SIM_CAP_MAX);
    return rc;
}

/* A restored setting: the simulation starts anew, from it. */
static int ll_setting(policy *p, unsigned i)
{
    return hybrid_setting(p, i);
}

static void ll_stats(const policy *p, policy_stats *out)
{
    const policy_minisim *s = p->sim;
    if (!s)
        return;
    out->sim_cap = (uint32_t)s->cap;
    out->sim_rate = s->cap ? s->rate : 0.0;
    out->sim_sampled = s->sampled;
    out->sim_decisions = s->decisions;
    out->sim_bytes = sizeof *s;
    for (unsigned i = 0; i < POLICY_SIM_N; i++) {
        out->sim_settings[i] = SIM_SETTINGS[i];
        out->sim_hits[i] = s->total[i];
        if (s->ready)
            out->sim_bytes += member_bytes(&s->m[i]);
    }
}

static const char *ll_decided(const policy *p, char *buf, size_t len)
{
    const policy_minisim *s = p->sim;
    snprintf(buf, len, "lru_lfu@%u (%s)", p->expert,
             !s ? "start: no memory to simulate" : s->decided ? "simulated" :
             s->cap ? "start, simulating" : s->full ? "start: too small to sample" : "start");
    return buf;
}

const policy_ops policy_lru_lfu_ops = {
    .name = "lru_lfu", .lists = 2, .rings = 2, .format = POLICY_STATE_VERSION,
    .start = ll_start, .stop = ll_stop, .access = ll_access, .evict = hybrid_evict,
    .remove = ll_remove, .resize = ll_resize, .check = ll_check, .list = hybrid_list,
    .place = hybrid_place, .setting = ll_setting, .stats = ll_stats, .decided = ll_decided,
};

/* ---- private helpers ---- */

static int sampled(const policy_minisim *s, uint64_t hash)
{
    return ((hash * 0x9e3779b97f4a7c15ull) >> 32) < s->thresh;
}

/* The end of a window: scores, and the setting in force. */
static void decide(policy *p, policy_minisim *s)
{
    unsigned cur = POLICY_SIM_N, best = 0;
    for (unsigned i = 0; i < POLICY_SIM_N; i++) {
        s->score[i] = s->score[i] * SIM_DECAY + (double)s->win[i];
        s->win[i] = 0;
        if (SIM_SETTINGS[i] == p->expert)
            cur = i;
        if (s->score[i] > s->score[best])
            best = i;
    }
    double margin = SIM_MARGIN * (double)s->seen;
    s->seen = 0;
    s->decisions++;
    if (cur < POLICY_SIM_N && s->score[best] <= s->score[cur] + margin) {
        s->decided = 1;
        return;
    }
    hybrid_setting(p, SIM_SETTINGS[best]);
    p->switches++;
    s->decided = 1;
}
