/*
 * engine_load.c: the engine thread's start (engine_impl.h): open the model and
 * its tokenizer, start the backend and the forward pass, size the scheduler's
 * buffers, resolve the default KV policy, run the sink probe and fill
 * engine_model_info. Only engine_model_info, which reads what loading filled
 * in, is called after the thread starts serving.
 */
#include "engine_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "forward.h"
#include "model.h"
#include "options.h"
#include "probe.h"
#include "stop.h"
#include "tokenizer.h"

/* The load-time sink probe (every slot is free now). */
static void run_probe(struct engine *e)
{
    struct engine_model_info *in = &e->info;
    int32_t ids[1024];
    struct probe_result pr;
    in->probe_sink_rate = in->probe_first_mass = -1.0f;
    int64_t n = tok_encode(e->tok, probe_builtin_text, strlen(probe_builtin_text),
                           tok_add_bos(e->tok), 0, ids, 1024);
    if (n <= 0 || n > 1024 || probe_run(&e->fwd, ids, n, &pr) < 0)
        return;
    double mass = 0;
    for (int i = 0; i < pr.n_layer * pr.n_head; i++)
        mass += pr.mass1[i];
    in->probe_sink_rate = pr.sink_rate;
    in->probe_first_mass = (float)(mass / (pr.n_layer * pr.n_head));
    in->probe_warning =
        e->model.hp.normalizer != MODEL_NORM_SOFTMAX && pr.sink_rate > PROBE_WARN_RATE;
    probe_free(&pr);
}

int engine__load(struct engine *e)
{
    char *err = e->start_err;
    size_t el = sizeof e->start_err;
    int rc = model_open(&e->model, e->cfg.model_path, e->cfg.no_mmap ? MODEL_NO_MMAP : 0, err, el);
    if (rc < 0)
        return rc;
    rc = tok_load(&e->tok, &e->model.gguf, err, el);
    if (rc < 0)
        return rc;
    /* one token's text, streamed: its bytes, up to 3 per byte when they are
     * not UTF-8 (U+FFFD), and a held-back tail of up to 4 (tok_stream_push) */
    size_t max_piece = 0;
    for (int64_t id = 0; id < tok_n_vocab(e->tok); id++) {
        size_t len = 0;
        if (tok_piece(e->tok, (int32_t)id, &len) && len > max_piece)
            max_piece = len;
    }
    e->piece_cap = 3 * (max_piece + 4) + 16;
    e->piece = malloc(e->piece_cap);
    e->text_out = malloc(e->piece_cap + STOP_HOLD_MAX);
    if (!e->piece || !e->text_out) {
        snprintf(err, el, "engine: out of memory");
        return -ENOMEM;
    }
    const struct model_hparams *hp = &e->model.hp;
    if (e->cfg.window <= 0 || e->cfg.window > hp->n_ctx_train)
        e->cfg.window = hp->n_ctx_train;
    struct backend_config bc = {.kind = engine__backend_kind(e->cfg.backend),
                                .n_threads = e->cfg.n_threads,
                                .max_tokens = e->cfg.max_step_tokens};
    rc = backend_init(&e->backend, &e->model, &bc, err, el);
    if (rc < 0)
        return rc;
    e->have_backend = 1;
    struct kv_geometry g = {
        .n_layer = hp->n_layer,
        .n_kv_head = hp->n_head_kv,
        .head_dim = hp->head_dim,
        .n_sinks = e->cfg.max_sinks,
        .window = e->cfg.window,
        .chunk = e->cfg.chunk,
        .n_slots = e->cfg.max_seqs,
        .dtype = engine__kv_dtype(e->cfg.kv_dtype),
    };
    rc = fwd_init(&e->fwd, &e->model, &e->backend, &g, err, el);
    if (rc < 0)
        return rc;
    e->have_fwd = 1;
    e->seqs = calloc((size_t)e->cfg.max_seqs, sizeof *e->seqs);
    e->waiting = calloc((size_t)(e->cfg.max_seqs + e->cfg.max_queue), sizeof *e->waiting);
    e->inputs = calloc((size_t)e->cfg.max_seqs, sizeof *e->inputs);
    e->input_seq = calloc((size_t)e->cfg.max_seqs, sizeof *e->input_seq);
    e->evicted_before = calloc((size_t)e->cfg.max_seqs, sizeof *e->evicted_before);
    e->scratch = calloc((size_t)hp->n_vocab, sizeof(float));
    if (!e->seqs || !e->waiting || !e->inputs || !e->input_seq || !e->scratch ||
        !e->evicted_before) {
        snprintf(err, el, "engine: out of memory");
        return -ENOMEM;
    }

    struct engine_model_info *in = &e->info;
    snprintf(in->name, sizeof in->name, "%s", hp->name);
    snprintf(in->arch, sizeof in->arch, "%s", hp->arch);
    snprintf(in->normalizer, sizeof in->normalizer, "%s", model_normalizer_name(hp->normalizer));
    e->default_policy =
        kv_policy_resolve(engine__kv_policy(e->cfg.policy), hp->normalizer == MODEL_NORM_SOFTMAX);
    if (kv_policy_sinks(&e->default_policy) > e->cfg.max_sinks) {
        snprintf(err, el, "engine: policy needs %lld sinks, more than --max-sinks %lld",
                 (long long)kv_policy_sinks(&e->default_policy), (long long)e->cfg.max_sinks);
        return -EINVAL;
    }
    if (e->default_policy.kind == KV_POLICY_RECOMPUTE) {
        snprintf(err, el, "engine: recompute is an evaluation policy (streamsink perplexity)");
        return -EINVAL;
    }
    kv_policy_name(&e->default_policy, in->default_policy, sizeof in->default_policy);
    in->n_ctx_train = hp->n_ctx_train;
    in->n_vocab = hp->n_vocab;
    in->window = e->cfg.window;
    in->max_seqs = e->cfg.max_seqs;
    const struct gguf_kv *kv = gguf_find_kv(&e->model.gguf, "tokenizer.chat_template");
    if (kv && kv->type == GGUF_TYPE_STRING) {
        struct gguf_str str;
        if (gguf_get_str(&e->model.gguf, "tokenizer.chat_template", &str) == 0) {
            char *t = malloc(str.len + 1);
            if (t) {
                memcpy(t, str.ptr, str.len);
                t[str.len] = 0;
            }
            in->chat_template = t;
        }
    }
    in->bos = tok_bos(e->tok);
    in->add_bos = tok_add_bos(e->tok);
    in->eos = tok_eos(e->tok);
    run_probe(e);
    e->stats.healthy = 1;
    e->stats.kv_bytes = (int64_t)(2 * kv_geometry_slot_bytes(&g) * (size_t)g.n_slots);
    return 0;
}

const struct engine_model_info *engine_model_info(const struct engine *e)
{
    return &e->info;
}
