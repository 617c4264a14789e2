/*
 * prefix.c: the prompt prefixes free KV slots still hold (prefix.h).
 */
#include "prefix.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "kvcache.h"

/* a record holds at most this many slots' positions (sinks, window and chunk) */
#define PREFIX_RINGS 16

/* What the cells of one KV slot hold, from position 0: toks[0..n), stored
 * by a sequence of policy and window; n 0 when they hold nothing reusable. */
struct prefix_slot {
    int32_t *toks; /* [cap] */
    int64_t n;
    /* the most positions from 0 its cells were written for since the record
     * began: a request that took the record and stored fewer than its
     * first writer left the later positions' writes in the ring */
    int64_t top;
    struct kv_policy policy;
    int64_t n_sinks, window;
    uint64_t used;  /* when a request last took or wrote it (e->prefix_clock) */
    uint64_t group; /* whose request wrote it (engine_request.prefix_group) */
};

int prefix_init(struct engine *e)
{
    const struct kv_geometry *g = &e->dec.fwd.pool.geo;
    /* a record longer than the longest prompt (BOS included) never helps;
     * and it holds at most PREFIX_RINGS slots' worth of positions, so that
     * its memory is bounded by the KV's, whatever --max-prompt says */
    const int64_t span = g->n_sinks + g->window + g->chunk;
    const int64_t prompt =
        e->cfg.max_prompt_tokens > 0 ? e->cfg.max_prompt_tokens : e->dec.model.hp.n_ctx_train;
    e->prefix_cap = prompt < PREFIX_RINGS * span ? prompt + 1 : PREFIX_RINGS * span;
    if (e->prefix_cap < span)
        e->prefix_cap = span;
    e->prefix = calloc((size_t)g->n_slots, sizeof *e->prefix);
    if (!e->prefix)
        return -ENOMEM;
    for (int64_t i = 0; i < g->n_slots; i++) {
        e->prefix[i].toks = malloc((size_t)e->prefix_cap * sizeof(int32_t));
        if (!e->prefix[i].toks)
            return -ENOMEM;
    }
    return 0;
}

void prefix_free(struct engine *e)
{
    for (int64_t i = 0; e->prefix && i < e->dec.fwd.pool.geo.n_slots; i++)
        free(e->prefix[i].toks);
    free(e->prefix);
    e->prefix = NULL;
}

void prefix_forget(struct engine *e, int64_t slot)
{
    if (e->prefix && slot >= 0 && slot < e->dec.fwd.pool.geo.n_slots)
        e->prefix[slot].n = 0;
}

/* The most positions s may store from 0 with none of their cells written
 * over: its sinks and its ring, and a local layer's ring. */
static int64_t exact_span(const struct engine *e, const struct seq *s)
{
    const struct kv_geometry *g = &e->dec.fwd.pool.geo;
    int64_t span = s->kv.n_sinks + s->kv.ring;
    if (g->swa_period > 0) {
        struct kv_seq local = kv_seq_local(&s->kv, g);
        if (local.ring < span)
            span = local.ring;
    }
    return span;
}

/* The fewest tokens of a record whose cells were written for up to n
 * positions (its top) a sequence laid out as s must take for the cells it
 * needs to be intact. A ring that never wrapped holds them all: any
 * prefix. One that wrapped holds, besides the sinks, the positions of the
 * last ring's length; a sequence that starts after m tokens reads positions
 * from m - window on, which are intact while m is at least n - C (the
 * ring's slack beyond the window; a local layer's ring has the same), as
 * far as a session may give tokens back (kv_seq_retract). */
static int64_t fewest(const struct engine *e, const struct seq *s, int64_t n)
{
    return n <= exact_span(e, s) ? 1 : n - s->kv.chunk;
}

/* 1 if s may keep a record of what it stores. */
static int records(const struct seq *s)
{
    return !s->session[0] && s->kv.pos_first == 0;
}

/* 1 if s may start from p's cells: the same cell layout, and the same
 * group (one API key, or client, cannot learn from cached_tokens or from
 * the time a prefill takes what another's prompts began with). */
static int may_take(const struct prefix_slot *p, const struct seq *s)
{
    return p->policy.kind == s->kv.policy.kind && p->n_sinks == s->kv.n_sinks &&
           p->window == s->kv.window && p->group == s->req.prefix_group;
}

/* The sequence that holds slot i for the admission under way (a later
 * choice or prompt of s's request, which has written nothing), or NULL. */
static struct seq *taken_by(struct engine *e, int64_t i)
{
    for (int64_t k = 0; k < e->cfg.max_seqs; k++)
        if (e->seqs[k].state == SEQ_TAKEN && e->seqs[k].kv.slot == i)
            return &e->seqs[k];
    return NULL;
}

/* Trades s's slot for slot at: a free one, or one its own request's
 * admission holds (the two swap). */
static void trade(struct engine *e, struct seq *s, int64_t at)
{
    struct kv_pool *pool = &e->dec.fwd.pool;
    if (at == s->kv.slot)
        return;
    struct seq *holder = taken_by(e, at);
    if (holder) {
        holder->kv.slot = s->kv.slot;
        s->kv.slot = at;
        return;
    }
    kv_pool_release(pool, s->kv.slot);
    if (kv_pool_acquire_at(pool, at) < 0) { /* cannot happen: at is free */
        kv_pool_acquire_at(pool, s->kv.slot);
        return;
    }
    s->kv.slot = at;
}

/* The free slot (or s's own) whose record is worth least: one with none,
 * else the least recently used. */
static int64_t victim(const struct engine *e, const struct seq *s)
{
    const struct kv_pool *pool = &e->dec.fwd.pool;
    int64_t v = s->kv.slot;
    for (int64_t i = 0; i < pool->geo.n_slots; i++) {
        const struct prefix_slot *p = &e->prefix[i], *w = &e->prefix[v];
        if ((i == s->kv.slot || !pool->in_use[i]) && w->n > 0 && (p->n == 0 || p->used < w->used))
            v = i;
    }
    return v;
}

int64_t prefix_take(struct engine *e, struct seq *s)
{
    if (!e->prefix)
        return 0;
    const struct kv_pool *pool = &e->dec.fwd.pool;
    const int64_t mine = s->kv.slot;
    int64_t best = -1, best_len = 0;
    const int reuse = records(s) && !s->req.echo && !s->req.no_prefix && s->n_prompt > 1;
    const int64_t most = s->n_prompt - 1; /* the last prompt token's logits are needed */
    for (int64_t i = 0; reuse && i < pool->geo.n_slots; i++) {
        const struct prefix_slot *p = &e->prefix[i];
        if (i != mine && pool->in_use[i] && !taken_by(e, i))
            continue; /* a running sequence's or an idle session's */
        if (p->n <= best_len || !may_take(p, s))
            continue;
        int64_t m = 0;
        const int64_t lim = p->n < most ? p->n : most;
        while (m < lim && p->toks[m] == s->prompt[m])
            m++;
        if (m > best_len && m >= fewest(e, s, p->top > p->n ? p->top : p->n)) {
            best = i;
            best_len = m;
        }
    }
    /* none: s writes over the record worth least */
    trade(e, s, best >= 0 ? best : victim(e, s));
    struct prefix_slot *p = &e->prefix[s->kv.slot];
    p->n = best >= 0 && s->kv.slot == best ? best_len : 0; /* later cells are written over */
    p->used = ++e->prefix_clock;
    if (p->n == 0)
        return 0;
    kv_seq_restored(&s->kv, p->n);
    s->n_fed = p->n;
    return p->n;
}

void prefix_record(struct engine *e, const struct seq *s, const int32_t *toks, int64_t n)
{
    if (!e->prefix)
        return;
    struct prefix_slot *p = &e->prefix[s->kv.slot];
    const int64_t pos = s->kv.pos_next - n;
    if (!records(s) || pos != p->n || s->kv.pos_next > e->prefix_cap) {
        p->n = 0;
        return;
    }
    if (pos == 0) {
        p->top = 0;
        p->policy = s->kv.policy;
        p->n_sinks = s->kv.n_sinks;
        p->window = s->kv.window;
        p->group = s->req.prefix_group;
    }
    memcpy(p->toks + pos, toks, (size_t)n * sizeof *toks);
    p->n = s->kv.pos_next;
    if (p->top < p->n)
        p->top = p->n;
    p->used = ++e->prefix_clock;
}

/* The most positions from 0 whose cells a copy of s's KV as a snapshot
 * holds takes them all: the copy holds only what its next query sees (the
 * sinks and the window, and a local layer's window). */
static int64_t copied_span(const struct engine *e, const struct seq *s)
{
    const struct kv_geometry *g = &e->dec.fwd.pool.geo;
    int64_t span = s->kv.n_sinks + s->kv.window;
    if (g->swa_period > 0 && g->swa_window < span)
        span = g->swa_window;
    return span;
}

void prefix_share(struct engine *e, const struct seq *lead, const struct seq *sib)
{
    if (!e->prefix)
        return;
    const struct prefix_slot *l = &e->prefix[lead->kv.slot];
    struct prefix_slot *p = &e->prefix[sib->kv.slot];
    p->n = 0;
    if (!records(sib) || l->n < sib->kv.pos_next || sib->kv.pos_next > exact_span(e, sib) ||
        sib->kv.pos_next > copied_span(e, sib))
        return; /* (cells before the copied ones are another request's) */
    *p = (struct prefix_slot){.toks = p->toks,
                              .n = sib->kv.pos_next,
                              .top = sib->kv.pos_next,
                              .policy = l->policy,
                              .n_sinks = l->n_sinks,
                              .window = l->window,
                              .used = ++e->prefix_clock,
                              .group = l->group};
    memcpy(p->toks, l->toks, (size_t)p->n * sizeof *p->toks);
}
