/*
 * decoder.c: the decoder (include/decoder.h): one loader for the model file,
 * its tokenizer, the backend and the forward state, used by the engine thread
 * and by the commands alike; command-side sequences, steps, token text and
 * samplers. The sink probe on the decoder is in probe.c.
 */
#include "decoder_impl.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "options.h"
#include "sampler.h"

_Static_assert(DECODER_DEFAULT_SINKS == KV_DEFAULT_SINKS, "one default");
_Static_assert(DECODER_MAX_SINKS == KV_MAX_SINKS, "one bound");

int decoder__init(struct decoder *d, const struct decoder_config *cfg, char *err, size_t err_len)
{
    memset(d, 0, sizeof *d);
    d->kind = cfg->backend;
    if (!cfg->model_path || cfg->max_tokens <= 0 || cfg->n_slots <= 0 || cfg->n_threads <= 0 ||
        cfg->n_sinks < 0 || cfg->n_sinks > KV_MAX_SINKS) {
        snprintf(err, err_len, "decoder: invalid configuration");
        return -EINVAL;
    }
    int rc = model_open(&d->model, cfg->model_path, cfg->no_mmap ? MODEL_NO_MMAP : 0, err, err_len);
    if (rc < 0)
        return rc;
    char terr[384] = "";
    rc = tok_load(&d->tok, &d->model.gguf, terr, sizeof terr);
    if (rc < 0) {
        snprintf(err, err_len, "%s: %s", cfg->model_path, terr);
        return rc;
    }
    /* every id the tokenizer can give must have an embedding row and a
     * logit (a padded output may have more rows than tokens, not fewer) */
    if (tok_n_vocab(d->tok) > d->model.hp.n_vocab) {
        snprintf(err, err_len,
                 "%s: the tokenizer has %lld tokens but token_embd only %lld rows: an id past "
                 "them would have no embedding",
                 cfg->model_path, (long long)tok_n_vocab(d->tok), (long long)d->model.hp.n_vocab);
        return -EINVAL;
    }
    const struct model_hparams *hp = &d->model.hp;
    int64_t window = cfg->window;
    if (window <= 0 || window > hp->n_ctx_train)
        window = hp->n_ctx_train; /* no window beyond what the model was trained on */
    /* The activations and each slot's KV room grow with the tokens of a step,
     * so the step is no larger than can be used: one sequence takes at most
     * the model's context in a step (a prompt prefilled in chunks of any size
     * gives the same result, DESIGN.md invariant 2), and a step at most that
     * from every slot. A --chunk of 65536 asked for gigabytes nothing used. */
    int64_t chunk = cfg->chunk > 0 ? cfg->chunk : cfg->max_tokens;
    if (chunk > hp->n_ctx_train)
        chunk = hp->n_ctx_train;
    int64_t max_tokens = cfg->max_tokens;
    if (max_tokens > cfg->n_slots * chunk)
        max_tokens = cfg->n_slots * chunk;
    struct backend_config bc = {.kind = engine__backend_kind(cfg->backend),
                                .n_threads = cfg->n_threads,
                                .max_tokens = max_tokens};
    rc = backend_init(&d->backend, &d->model, &bc, err, err_len);
    if (rc < 0)
        return rc;
    d->have_backend = 1;
    struct kv_geometry g = {
        .n_layer = hp->n_layer,
        .n_kv_head = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .n_sinks = cfg->n_sinks,
        .window = window,
        .chunk = chunk,
        .n_slots = cfg->n_slots,
        .dtype = engine__kv_dtype(cfg->kv_dtype),
    };
    rc = fwd_init(&d->fwd, &d->model, &d->backend, &g, err, err_len);
    if (rc < 0)
        return rc;
    d->have_fwd = 1;
    d->seqs = calloc((size_t)cfg->n_slots, sizeof *d->seqs);
    d->seq_open = calloc((size_t)cfg->n_slots, sizeof *d->seq_open);
    d->inputs = calloc((size_t)cfg->n_slots, sizeof *d->inputs);
    if (!d->seqs || !d->seq_open || !d->inputs) {
        snprintf(err, err_len, "decoder: out of memory");
        return -ENOMEM;
    }
    return 0;
}

void decoder__free(struct decoder *d)
{
    free(d->seqs);
    free(d->seq_open);
    free(d->inputs);
    if (d->have_fwd)
        fwd_free(&d->fwd);
    if (d->have_backend)
        d->backend.ops->free(&d->backend);
    tok_free(d->tok);
    model_free(&d->model);
    memset(d, 0, sizeof *d);
}

int decoder_open(struct decoder **out, const struct decoder_config *cfg, char *err, size_t err_len)
{
    *out = NULL;
    struct decoder *d = malloc(sizeof *d);
    if (!d) {
        snprintf(err, err_len, "decoder: out of memory");
        return -ENOMEM;
    }
    int rc = decoder__init(d, cfg, err, err_len);
    if (rc < 0) {
        decoder__free(d);
        free(d);
        return rc;
    }
    *out = d;
    return 0;
}

void decoder_close(struct decoder *d)
{
    if (!d)
        return;
    decoder__free(d);
    free(d);
}

int engine_error_is_model(int rc)
{
    /* memory, threads, and the CUDA backend's device or library failures are
     * the machine's; everything else the loader reports is about the file */
    return !(rc == -ENOMEM || rc == -EAGAIN || rc == -ENODEV || rc == -ENOSYS || rc == -EIO);
}

void decoder_get_info(const struct decoder *d, struct decoder_info *out)
{
    const struct model_hparams *hp = &d->model.hp;
    const struct kv_geometry *g = &d->fwd.pool.geo;
    *out = (struct decoder_info){
        .name = hp->name,
        .arch = hp->arch,
        .normalizer = model_normalizer_name(hp->normalizer),
        .needs_sinks = hp->normalizer == MODEL_NORM_SOFTMAX,
        .n_layer = hp->n_layer,
        .n_head = hp->n_head,
        .n_head_kv = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .n_vocab = hp->n_vocab,
        .n_ctx_train = hp->n_ctx_train,
        .window = g->window,
        .n_sinks = g->n_sinks,
        .max_tokens = d->fwd.max_tokens,
        .kv_bytes_per_slot = 2 * kv_geometry_slot_bytes(g),
        .bos = tok_bos(d->tok),
        .eos = tok_eos(d->tok),
        .add_bos = tok_add_bos(d->tok),
    };
}

int64_t decoder_tokenize(const struct decoder *d, const char *text, size_t len, int add_bos,
                         int parse_special, int32_t *out, int64_t cap)
{
    return tok_encode(d->tok, text, len, add_bos, parse_special, out, cap);
}

int decoder_token_is_eog(const struct decoder *d, int32_t id)
{
    return tok_is_eog(d->tok, id);
}

int decoder_token_is_control(const struct decoder *d, int32_t id)
{
    return tok_is_control(d->tok, id);
}

int64_t decoder_text_push(const struct decoder *d, struct decoder_text *s, int32_t id, char *out,
                          size_t cap)
{
    _Static_assert(sizeof s->pend == sizeof((struct tok_stream *)0)->pend, "same tail");
    struct tok_stream ts;
    memcpy(ts.pend, s->pend, sizeof ts.pend);
    ts.n_pend = s->n_pend;
    int64_t w = tok_stream_push(d->tok, &ts, id, out, cap);
    memcpy(s->pend, ts.pend, sizeof s->pend);
    s->n_pend = ts.n_pend;
    return w;
}

int64_t decoder_text_flush(struct decoder_text *s, char *out, size_t cap)
{
    struct tok_stream ts;
    memcpy(ts.pend, s->pend, sizeof ts.pend);
    ts.n_pend = s->n_pend;
    int64_t w = tok_stream_flush(&ts, out, cap);
    memcpy(s->pend, ts.pend, sizeof s->pend);
    s->n_pend = ts.n_pend;
    return w;
}

int64_t decoder_seq_open(struct decoder *d, const struct engine_policy *p, int64_t window)
{
    const struct kv_geometry *g = &d->fwd.pool.geo;
    struct kv_policy pol =
        kv_policy_resolve(engine__kv_policy(*p), d->model.hp.normalizer == MODEL_NORM_SOFTMAX);
    if (pol.kind == KV_POLICY_RECOMPUTE)
        pol = (struct kv_policy){KV_POLICY_DENSE, 0};
    if (kv_policy_sinks(&pol) > g->n_sinks)
        return -EINVAL;
    int64_t slot;
    if (kv_pool_acquire(&d->fwd.pool, &slot) < 0)
        return -EBUSY;
    if (kv_seq_init(&d->seqs[slot], g, slot, pol, window > 0 ? window : g->window, 0) < 0) {
        kv_pool_release(&d->fwd.pool, slot);
        return -EINVAL;
    }
    d->seq_open[slot] = 1;
    return slot;
}

void decoder_seq_reset(struct decoder *d, int64_t seq)
{
    struct kv_seq *s = &d->seqs[seq];
    assert(d->seq_open[seq]);
    kv_seq_init(s, &d->fwd.pool.geo, seq, s->policy, s->window, 0);
}

void decoder_seq_close(struct decoder *d, int64_t seq)
{
    if (seq < 0 || !d->seq_open[seq])
        return;
    d->seq_open[seq] = 0;
    kv_pool_release(&d->fwd.pool, seq);
}

void decoder_seq_policy_name(const struct decoder *d, int64_t seq, char *buf, size_t cap)
{
    kv_policy_name(&d->seqs[seq].policy, buf, cap);
}

int64_t decoder_step(struct decoder *d, const struct decoder_input *in, int n_in)
{
    if (n_in > d->fwd.pool.geo.n_slots)
        return -EINVAL;
    for (int i = 0; i < n_in; i++) {
        if (in[i].seq < 0 || in[i].seq >= d->fwd.pool.geo.n_slots || !d->seq_open[in[i].seq])
            return -EINVAL;
        static const enum fwd_logits lg[] = {[DECODER_LOGITS_NONE] = FWD_LOGITS_NONE,
                                             [DECODER_LOGITS_LAST] = FWD_LOGITS_LAST,
                                             [DECODER_LOGITS_ALL] = FWD_LOGITS_ALL};
        d->inputs[i] =
            (struct fwd_input){&d->seqs[in[i].seq], in[i].tokens, in[i].n, lg[in[i].logits]};
    }
    return decoder__step(d, d->inputs, n_in);
}

int64_t decoder__step(struct decoder *d, const struct fwd_input *in, int n_in)
{
    return fwd_step(&d->fwd, in, n_in);
}

void decoder__run_parts(struct decoder *d, void (*fn)(void *arg, int i, int n), void *arg, int n)
{
    if (n > 1 && d->backend.ops->run_parts) {
        d->backend.ops->run_parts(&d->backend, fn, arg, n);
        return;
    }
    for (int i = 0; i < n; i++)
        fn(arg, i, n);
}

float *decoder_logits(struct decoder *d)
{
    return d->fwd.logits;
}

double decoder_nll(const struct decoder *d, const float *row, int32_t token)
{
    return sampler_logsumexp(row, d->model.hp.n_vocab) - (double)row[token];
}

int decoder_set_observer(struct decoder *d, const struct decoder_observer *obs)
{
    return fwd_set_observer(&d->fwd, obs, d->kind == ENGINE_BACKEND_CPU);
}

struct decoder_sampler {
    struct sampler s;
};

int decoder_sampler_new(struct decoder_sampler **out, const struct engine_sampling *p,
                        int64_t n_vocab)
{
    *out = NULL;
    struct decoder_sampler *s = malloc(sizeof *s);
    if (!s)
        return -ENOMEM;
    struct sampler_params sp = engine__sampler_params(p);
    int rc = sampler_init(&s->s, &sp, n_vocab);
    if (rc < 0) {
        free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void decoder_sampler_free(struct decoder_sampler *s)
{
    if (!s)
        return;
    sampler_free(&s->s);
    free(s);
}

void decoder_sampler_accept(struct decoder_sampler *s, int32_t token)
{
    sampler_accept(&s->s, token);
}

int32_t decoder_sampler_sample(struct decoder_sampler *s, float *logits)
{
    return sampler_sample(&s->s, logits, NULL);
}
