/*
 * lru_lfu.c — the default policy: the two-segment hybrid (hybrid.c) at one
 * setting at a time, the setting chosen by shadows of the policies the
 * settings are, judged on every access from the live cache's own state.
 *
 * The live path is the hybrid's: O(1) an access, the 56-byte policy_node
 * every policy has, and the ghosts (hybrid.c: 36 bytes per entry).  No
 * published policy wins on every stream: LRU where recency is all
 * (sessions that come back, popularity that shifts), LIRS where a loop or
 * a shared prefix is longer than the cache or popularity is skewed, ARC
 * where recency and frequency mix and move (the Mooncake trace's middle
 * sizes).  So three settings take turns:
 *
 *   @0  LRU: victims in recency order;
 *   @7  LIRS with the hybrid's aging clock;
 *   @8  ARC.
 *
 * What each would hit is judged on every access, at every size, by its
 * shadow (shadow.c): LRU exactly (to a bucket of stamps), LIRS as @7 runs
 * it less the clock, ARC as @8 runs it — all from the stamps and class bits
 * the live cache keeps in its nodes and ghosts (a few bytes an entry, no
 * table of their own).  The rule, once a step (an eighth of the size in
 * accesses, at least STEP_MIN):
 *
 *   value     each setting's shadow's hits this step, plus its gain: what
 *             the setting earned beyond its shadow when last in force and
 *             settled (SETTLE steps after a switch), never below 0 — the
 *             clock's gain over plain LIRS;
 *   lead      each other setting's value less the one in force's — for LRU
 *             less the live cache's own hits (LRU's shadow is exact, so a
 *             setting that does worse live than LRU would is left as soon
 *             as it shows) — summed with a decay of DECAY a step;
 *   switch    to the setting of the largest lead past MARGIN of the
 *             horizon's accesses, after MIN_DWELL steps in force; from LRU
 *             to LIRS before ARC when both pass (LIRS's shadow is the one
 *             the live cache under LRU can judge least: its ghosts forget
 *             long loops).  A lead of ten margins (a loop longer than the
 *             cache, of which LRU keeps nothing) passes within a step: the
 *             fast switch into the loop-resistant setting.
 *   LRU owed  the live cache's hits less LRU's shadow's since the start
 *             (the bank): while it is below 0, leaving LRU needs a lead of
 *             OWED x what is owed more (at most OWED_MAX of the horizon's
 *             accesses), so an excursion that lost is not repeated on a
 *             lead that does not pay it back: never below LRU.
 *
 * A switch is a change of the live hybrid's setting: segments and ghosts
 * stay, O(1).  The start is LRU, so a cell where LRU leads loses nothing to
 * the start.  Before the cache was ever full the shadows judge an unlimited
 * size (they all hit alike).
 *
 * Memory fixed: the shadows (16 KB) and the rule, allocated at start.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hybrid.h"
#include "lists.h"
#include "shadow.h"

/* ---- types and constants ---- */

#define STEP_MIN   64u         /* a step: the size / 8 in accesses, at least this many */
#define DECAY      0.95        /* a lead keeps this share of itself a step */
#define MARGIN     0.01        /* a switch: a lead of this share of a horizon's accesses */
#define MIN_DWELL  2u          /* steps in force before another switch */
#define SETTLE     8u          /* steps in force before a setting's gain is learnt */
#define GAIN_KEEP  0.9         /* a gain keeps this share of itself a step */
#define BACK       0.5         /* back to LRU: a lead of this share of the margin (LRU is the safe one) */
#define OWED       5.0         /* leaving LRU: the lead needed grows by this many times what is owed */
#define OWED_MAX   0.1         /* ... by at most this share of a horizon's accesses */
#define HIR_SHARE  0.01        /* LIRS: resident HIR blocks, share of the size */

enum { C_LRU = 0, C_LIRS = 1, C_ARC = 2 };
static const unsigned CANDIDATES[POLICY_SIM_N] = { 0, 7, 8 };  /* HYBRIDS index of shadow i's setting */
static const char *const SHADOW_NAMES[POLICY_SIM_N] = { "LRU", "LIRS", "ARC" };

typedef struct policy_chooser {
    shadow   sh;                        /* the shadows */
    double   mark[POLICY_SIM_N];        /* each shadow's hits when the step began */
    double   lead[POLICY_SIM_N];        /* each one's decayed lead over the setting in force */
    double   gain[POLICY_SIM_N];        /* each setting's hits beyond its shadow, an access (>= 0) */
    double   bank;                      /* the live cache's hits less LRU's shadow's, all steps */
    uint64_t live;                      /* the live cache's hits this step */
    uint64_t seen, step;                /* accesses this step, a step's accesses */
    uint64_t dwell;                     /* steps since the last switch */
    uint64_t decisions, accesses;       /* steps decided, accesses judged */
    uint64_t live_hits;                 /* the live cache's hits, all steps */
    uint64_t time[POLICY_SIM_N];        /* accesses served under each setting */
    int      judged;                    /* a step was decided */
} policy_chooser;

/* ---- private prototypes ---- */

static int  candidate_of(unsigned expert);
static void decide(policy *p, policy_chooser *c);
static void judge(policy *p, policy_chooser *c, int known, uint32_t stamp, uint8_t *cls, int hit);

/* ---- the table ---- */

static int ll_start(policy *p)
{
    hybrid_setting(p, CANDIDATES[C_LRU]);
    if (!p->sim && (p->sim = calloc(1, sizeof *p->sim)) != NULL) {     /* no memory: LRU alone */
        shadow_init(&p->sim->sh, p->tick);
        p->sim->step = STEP_MIN;
    }
    return hybrid_start(p);
}

static void ll_stop(policy *p)
{
    free(p->sim);
    p->sim = NULL;
    hybrid_stop(p);
}

static void ll_access(policy *p, policy_node *n, int hit)
{
    policy_chooser *c = p->sim;
    if (!hit)
        hybrid_prefetch(p, n->hash);
    if (hit) {
        if (c)
            judge(p, c, 1, n->stamp, &n->mcls, 1);
        hybrid_touch(p, n);
    } else {
        hyb_ghost g;
        hybrid_lookup(p, n->hash, &g);
        uint8_t cls = g.slot >= 0 ? (uint8_t)g.cls : 0;
        if (c)
            judge(p, c, g.slot >= 0, g.stamp, &cls, 0);
        n->mcls = cls;
        hybrid_admit(p, n, &g);
    }
    n->stamp = p->tick++;
}

static void ll_remove(policy *p, policy_node *n, int evicted)
{
    if (!evicted && p->sim)             /* deleted: the shadows forget it too */
        shadow_forget(&p->sim->sh, n->stamp, n->mcls);
    else if (p->sim && (n->mcls & SHADOW_LIR) && !shadow_in_lir(&p->sim->sh, n->stamp))
        n->mcls &= (uint8_t)~SHADOW_LIR;    /* left the LIR set: its ghost is an ordinary one */
    hybrid_remove(p, n, evicted);
}

/* The cache's size when full: the ghosts' and the shadows'. */
static void ll_resize(policy *p, uint64_t full)
{
    hybrid_resize(p, full);
    policy_chooser *c = p->sim;
    if (!c || (double)full == c->sh.cap)
        return;
    double hir = (double)(uint64_t)(HIR_SHARE * (double)full + 0.5);
    hir = hir < 1 ? 1 : hir;
    shadow_resize(&c->sh, (double)full, hir);
    c->step = full / 8 > STEP_MIN ? full / 8 : STEP_MIN;
}

static int ll_check(const policy *p, char *why, size_t whylen)
{
    int rc = hybrid_check(p, why, whylen);
    if (rc == MEMOS_OK && p->sim)
        rc = shadow_check(&p->sim->sh, why, whylen);
    if (rc == MEMOS_OK && p->sim && candidate_of(p->expert) < 0 && p->sim->judged)
        PFAIL("policy: lru_lfu's rule left setting %u in force", p->expert);
    return rc;
}

/* A restored setting: the rule goes on from it (one not of its own is
 * replaced at the first step). */
static int ll_setting(policy *p, unsigned i)
{
    return hybrid_setting(p, i);
}

static void ll_stats(const policy *p, policy_stats *out)
{
    const policy_chooser *c = p->sim;
    if (!c)
        return;
    out->sim_cap = (uint32_t)c->sh.cap;
    out->sim_decisions = c->decisions;
    out->sim_accesses = c->accesses;
    out->sim_bytes = sizeof *c;
    out->live_hits = c->live_hits;
    for (unsigned i = 0; i < POLICY_SIM_N; i++) {
        out->sim_settings[i] = CANDIDATES[i];
        out->sim_hits[i] = c->sh.hits[i];
        out->sim_time[i] = c->time[i] + (candidate_of(p->expert) == (int)i ? c->seen : 0);
    }
}

static const char *ll_decided(const policy *p, char *buf, size_t len)
{
    const policy_chooser *c = p->sim;
    int i = candidate_of(p->expert);
    if (!c)
        snprintf(buf, len, "lru_lfu@%u (start: no memory for the shadows)", p->expert);
    else if (!c->judged || i < 0)
        snprintf(buf, len, "lru_lfu@%u (start)", p->expert);
    else if (!p->switches)
        snprintf(buf, len, "lru_lfu@%u (shadows: %s, no lead passed)", p->expert, SHADOW_NAMES[i]);
    else
        snprintf(buf, len, "lru_lfu@%u (shadows: %s led, %llu switches)", p->expert,
                 SHADOW_NAMES[i], (unsigned long long)p->switches);
    return buf;
}

const policy_ops policy_lru_lfu_ops = {
    .name = "lru_lfu", .lists = 2, .rings = 2, .format = POLICY_STATE_VERSION,
    .start = ll_start, .stop = ll_stop, .access = ll_access, .evict = hybrid_evict,
    .remove = ll_remove, .resize = ll_resize, .check = ll_check, .list = hybrid_list,
    .place = hybrid_place, .setting = ll_setting, .stats = ll_stats, .decided = ll_decided,
};

/* ---- private helpers ---- */

static int candidate_of(unsigned expert)
{
    for (int i = 0; i < (int)POLICY_SIM_N; i++)
        if (CANDIDATES[i] == expert)
            return i;
    return -1;
}

/* One access judged by the shadows (before the live cache serves it). */
static void judge(policy *p, policy_chooser *c, int known, uint32_t stamp, uint8_t *cls, int hit)
{
    shadow_access(&c->sh, p->tick, known, stamp, cls);
    c->live += (uint64_t)hit;
    c->live_hits += (uint64_t)hit;
    c->accesses++;
    if (++c->seen >= c->step)
        decide(p, c);
}

/* The end of a step: gains, the bank, the leads, and the setting in force
 * (see the top). */
static void decide(policy *p, policy_chooser *c)
{
    int live = candidate_of(p->expert);
    double seen = (double)c->seen, horizon = seen / (1.0 - DECAY);
    double est[POLICY_SIM_N], value[POLICY_SIM_N];
    for (unsigned i = 0; i < POLICY_SIM_N; i++) {
        est[i] = c->sh.hits[i] - c->mark[i];
        c->mark[i] = c->sh.hits[i];
    }
    if (live >= 0)
        c->time[live] += c->seen;
    c->dwell++;
    c->decisions++;
    c->judged = 1;
    c->bank += (double)c->live - est[C_LRU];
    double owed = c->bank < 0 ? -c->bank * OWED : 0;
    owed = owed < OWED_MAX * horizon ? owed : OWED_MAX * horizon;
    if (live > 0 && c->dwell > SETTLE) {
        double g = ((double)c->live - est[live]) / seen;
        c->gain[live] = c->gain[live] * GAIN_KEEP + (g > 0 ? g : 0) * (1.0 - GAIN_KEEP);
    }
    for (unsigned i = 0; i < POLICY_SIM_N; i++)
        value[i] = est[i] + c->gain[i] * seen;
    double thresh = MARGIN * horizon;
    int best = -1;
    for (int i = 0; i < (int)POLICY_SIM_N; i++) {
        if (i == live) {
            c->lead[i] = 0;
            continue;
        }
        double against = live < 0 ? 0 : i == C_LRU ? (double)c->live : value[live];
        c->lead[i] = c->lead[i] * DECAY + (value[i] - against);
        double need = i != C_LRU ? thresh + owed : c->bank < 0 ? BACK * thresh : thresh;
        if (c->lead[i] > need && (best < 0 || c->lead[i] > c->lead[best]))
            best = i;
    }
    if (live == C_LRU && best == C_ARC && c->lead[C_LIRS] > thresh + owed)
        best = C_LIRS;
    if (live < 0)                       /* (a restored setting not of its own: the best shadow's) */
        for (int i = best = 0; i < (int)POLICY_SIM_N; i++)
            best = est[i] > est[best] ? i : best;
    if (best >= 0 && (live < 0 || c->dwell >= MIN_DWELL)) {
        hybrid_setting(p, CANDIDATES[best]);
        p->switches++;
        c->dwell = 0;
        for (unsigned i = 0; i < POLICY_SIM_N; i++)
            c->lead[i] = 0;
    }
    c->live = 0;
    c->seen = 0;
}
