/* seq.c: one sequence's sinks + ring: cells, views and eviction (kvcache.h). */
#include "kvcache.h"

#include <assert.h>
#include <errno.h>

int kv_seq_init(struct kv_seq *seq, const struct kv_geometry *g, int64_t slot,
                struct kv_policy policy, int64_t window, int64_t pos_first)
{
    if (policy.kind == KV_POLICY_AUTO || slot < 0 || slot >= g->n_slots || window <= 0 ||
        window > g->window || pos_first < 0)
        return -EINVAL;
    int64_t s = kv_policy_sinks(&policy);
    if (s > g->n_sinks)
        return -EINVAL;
    seq->slot = slot;
    seq->policy = policy;
    seq->n_sinks = s;
    seq->window = window;
    seq->ring = g->window + g->chunk;
    seq->sink_base = g->n_sinks;
    seq->pos_first = pos_first;
    seq->pos_next = pos_first;
    seq->n_evicted = seq->n_evicted_max = 0;
    seq->chunk = g->chunk;
    seq->retract_min = pos_first;
    return 0;
}

int kv_seq_can_append(const struct kv_seq *seq, const struct kv_geometry *g, int64_t n)
{
    if (n < 0 || n > g->chunk)
        return -ENOSPC;
    if (seq->policy.kind == KV_POLICY_DENSE && seq->pos_next - seq->pos_first + n > seq->window)
        return -ENOSPC;
    return 0;
}

int64_t kv_seq_cell(const struct kv_seq *seq, int64_t pos)
{
    int64_t rel = pos - seq->pos_first;
    assert(rel >= 0);
    if (rel < seq->n_sinks)
        return rel;
    return seq->sink_base + pos % seq->ring;
}

struct kv_view kv_seq_view(const struct kv_seq *seq, int64_t pos)
{
    struct kv_view v;
    int64_t rel = pos - seq->pos_first;
    assert(rel >= 0);
    int64_t first_win = seq->pos_first + seq->n_sinks; /* sinks never enter the window */
    v.win_start = pos - seq->window + 1;
    if (v.win_start < first_win)
        v.win_start = first_win;
    v.n_sinks = rel + 1 < seq->n_sinks ? rel + 1 : seq->n_sinks;
    v.win_len = pos >= v.win_start ? pos - v.win_start + 1 : 0;
    v.pos_cache = seq->pos_first + v.n_sinks + v.win_len - 1;
    return v;
}

void kv_view_runs(const struct kv_seq *seq, const struct kv_view *v,
                  struct kv_run run[KV_VIEW_RUNS])
{
    assert(v->n_sinks >= 0 && v->n_sinks <= seq->sink_base);
    assert(v->win_len >= 0 && v->win_len <= seq->ring);
    assert(v->win_len == 0 || v->win_start >= 0);
    int64_t c0 = v->win_len > 0 ? v->win_start % seq->ring : 0;
    int64_t len1 = v->win_len < seq->ring - c0 ? v->win_len : seq->ring - c0;
    run[0] = (struct kv_run){0, v->n_sinks};
    run[1] = (struct kv_run){seq->sink_base + c0, len1};
    run[2] = (struct kv_run){seq->sink_base, v->win_len - len1};
}

struct kv_seq kv_seq_local(const struct kv_seq *seq, const struct kv_geometry *g)
{
    assert(g->swa_period > 0 && g->swa_window > 0);
    struct kv_seq l = *seq;
    l.policy = (struct kv_policy){KV_POLICY_WINDOW, 0};
    l.n_sinks = 0;
    l.window = g->swa_window;
    l.ring = g->swa_window + g->chunk;
    l.sink_base = 0;
    int64_t stored = seq->pos_next - seq->pos_first;
    l.n_evicted = stored > l.window ? stored - l.window : 0;
    return l;
}

static void set_pos_next(struct kv_seq *seq, int64_t pos_next)
{
    seq->pos_next = pos_next;
    /* tokens outside sinks and outside the window of the newest token */
    int64_t stored = seq->pos_next - seq->pos_first;
    int64_t kept = seq->n_sinks + seq->window;
    seq->n_evicted = stored > kept ? stored - kept : 0;
    if (seq->n_evicted > seq->n_evicted_max)
        seq->n_evicted_max = seq->n_evicted;
}

void kv_seq_advance(struct kv_seq *seq, int64_t n)
{
    set_pos_next(seq, seq->pos_next + n);
    /* the cells of the C positions before the newest stored stay intact */
    if (seq->pos_next - seq->chunk > seq->retract_min)
        seq->retract_min = seq->pos_next - seq->chunk;
}

int kv_seq_retract(struct kv_seq *seq, int64_t n)
{
    if (n < 0 || seq->pos_next - n < seq->retract_min)
        return -ERANGE;
    set_pos_next(seq, seq->pos_next - n);
    return 0;
}

void kv_seq_restored(struct kv_seq *seq, int64_t pos_next)
{
    set_pos_next(seq, pos_next);
    seq->retract_min = pos_next;
}
