/*
 * engine_load.c: the engine thread's start (engine_impl.h): open the decoder
 * (model, tokenizer, backend, forward pass; decoder.c), size the scheduler's
 * buffers, resolve the default KV policy, run the sink probe and fill
 * engine_model_info. Only engine_model_info, which reads what loading filled
 * in, is called after the thread starts serving.
 */
#include "engine_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "decoder_impl.h"
#include "model.h"
#include "options.h"
#include "prefix.h"
#include "stop.h"
#include "tokenizer.h"

int engine__load(struct engine *e)
{
    char *err = e->start_err;
    size_t el = sizeof e->start_err;
    struct decoder_config dc = {
        .model_path = e->cfg.model_path,
        .backend = e->cfg.backend,
        .n_threads = e->cfg.n_threads,
        .no_mmap = e->cfg.no_mmap,
        .max_tokens = e->cfg.max_step_tokens,
        .chunk = e->cfg.chunk,
        .n_sinks = e->cfg.max_sinks,
        .window = e->cfg.window,
        .n_slots = e->cfg.max_seqs,
        .kv_dtype = e->cfg.kv_dtype,
    };
    int rc = decoder__init(&e->dec, &dc, err, el);
    if (rc < 0)
        return rc;
    const struct model_hparams *hp = &e->dec.model.hp;
    const struct kv_geometry *g = &e->dec.fwd.pool.geo;
    e->cfg.window = g->window;
    /* the decoder keeps a step and a sequence's share of it within the
     * model's context (decoder.c); the scheduler fills no more than that */
    e->cfg.chunk = g->chunk;
    e->cfg.max_step_tokens = e->dec.fwd.max_tokens;
    /* one token's text, streamed: its bytes, up to 3 per byte when they are
     * not UTF-8 (U+FFFD), and a held-back tail of up to 4 (tok_stream_push) */
    size_t max_piece = 0;
    for (int64_t id = 0; id < tok_n_vocab(e->dec.tok); id++) {
        size_t len = 0;
        if (tok_piece(e->dec.tok, (int32_t)id, &len) && len > max_piece)
            max_piece = len;
        e->n_eog += tok_is_eog(e->dec.tok, (int32_t)id);
    }
    e->eog_ids = malloc((size_t)(e->n_eog > 0 ? e->n_eog : 1) * sizeof *e->eog_ids);
    if (!e->eog_ids) {
        snprintf(err, el, "engine: out of memory");
        return -ENOMEM;
    }
    for (int64_t id = 0, k = 0; id < tok_n_vocab(e->dec.tok); id++)
        if (tok_is_eog(e->dec.tok, (int32_t)id))
            e->eog_ids[k++] = (int32_t)id;
    const char *mask = getenv("STREAMSINK_JSON_MASK");
    e->json_read_all = mask && strcmp(mask, "read") == 0;
    /* one entry per logit: a model may have more output rows than its
     * tokenizer has tokens (padded), and those ids have no text */
    e->json_tok = calloc((size_t)hp->n_vocab, sizeof *e->json_tok);
    if (!e->json_tok) {
        snprintf(err, el, "engine: out of memory");
        return -ENOMEM;
    }
    for (int64_t id = 0; id < hp->n_vocab; id++) {
        struct json_tok *j = &e->json_tok[id];
        size_t len = 0;
        const char *p =
            id < tok_n_vocab(e->dec.tok) ? tok_piece(e->dec.tok, (int32_t)id, &len) : NULL;
        if (!p || len == 0 || tok_is_control(e->dec.tok, (int32_t)id) ||
            tok_is_eog(e->dec.tok, (int32_t)id)) {
            j->kind = JSON_TOK_NEVER;
            continue;
        }
        size_t lead = 0;
        while (lead < len && strchr(" \t\n\r", p[lead]) && p[lead])
            lead++;
        j->first = (uint8_t)p[0];
        j->lead = (uint8_t)(lead > 255 ? 255 : lead);
        j->after = lead < len ? (uint8_t)p[lead] : 0;
        j->kind = (uint8_t)((lead == len ? JSON_TOK_SPACE : 0) |
                            (json_gram_string_piece(p, len) ? JSON_TOK_TEXT : 0));
    }
    e->json_ids = malloc((size_t)hp->n_vocab * sizeof *e->json_ids);
    e->json_rest = malloc((size_t)hp->n_vocab * sizeof *e->json_rest);
    if (!e->json_ids || !e->json_rest) {
        snprintf(err, el, "engine: out of memory");
        return -ENOMEM;
    }
    int64_t count[257] = {0};
    for (int64_t id = 0; id < hp->n_vocab; id++) {
        const struct json_tok *j = &e->json_tok[id];
        count[j->kind == JSON_TOK_NEVER ? 256 : j->first]++;
        if (!(j->kind & JSON_TOK_TEXT))
            e->json_rest[e->n_json_rest++] = (int32_t)id;
    }
    e->json_first[0] = 0;
    for (int b = 0; b < 257; b++)
        e->json_first[b + 1] = e->json_first[b] + count[b];
    int64_t at[257];
    memcpy(at, e->json_first, sizeof at);
    for (int64_t id = 0; id < hp->n_vocab; id++) {
        const struct json_tok *j = &e->json_tok[id];
        e->json_ids[at[j->kind == JSON_TOK_NEVER ? 256 : j->first]++] = (int32_t)id;
    }
    e->piece_cap = 3 * (max_piece + 4) + 16;
    e->piece = malloc(e->piece_cap);
    e->text_out = malloc(e->piece_cap + STOP_HOLD_MAX);
    if (!e->piece || !e->text_out) {
        snprintf(err, el, "engine: out of memory");
        return -ENOMEM;
    }
    e->seqs = calloc((size_t)e->cfg.max_seqs, sizeof *e->seqs);
    e->waiting = calloc((size_t)(e->cfg.max_seqs + e->cfg.max_queue), sizeof *e->waiting);
    e->inputs = calloc((size_t)e->cfg.max_seqs, sizeof *e->inputs);
    e->input_seq = calloc((size_t)e->cfg.max_seqs, sizeof *e->input_seq);
    e->prefill_order = calloc((size_t)e->cfg.max_seqs, sizeof *e->prefill_order);
    e->evicted_before = calloc((size_t)e->cfg.max_seqs, sizeof *e->evicted_before);
    e->scratch = calloc((size_t)e->cfg.max_seqs * (size_t)hp->n_vocab, sizeof(float));
    e->pick_seq = calloc((size_t)e->cfg.max_seqs, sizeof *e->pick_seq);
    e->pick_logits = calloc((size_t)e->cfg.max_seqs, sizeof *e->pick_logits);
    e->picked = calloc((size_t)e->cfg.max_seqs, sizeof *e->picked);
    const size_t n_echo = (size_t)(e->cfg.max_step_tokens + e->cfg.max_seqs);
    e->echo = calloc(n_echo, sizeof *e->echo);
    e->echoed = calloc(n_echo, sizeof *e->echoed);
    if (!e->seqs || !e->waiting || !e->inputs || !e->input_seq || !e->prefill_order ||
        !e->scratch || !e->evicted_before || !e->pick_seq || !e->pick_logits || !e->picked ||
        !e->echo || !e->echoed || prefix_init(e) < 0) {
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
    const struct gguf_kv *kv = gguf_find_kv(&e->dec.model.gguf, "tokenizer.chat_template");
    if (kv && kv->type == GGUF_TYPE_STRING) {
        struct gguf_str str;
        if (gguf_get_str(&e->dec.model.gguf, "tokenizer.chat_template", &str) == 0) {
            char *t = malloc(str.len + 1);
            if (t) {
                memcpy(t, str.ptr, str.len);
                t[str.len] = 0;
            }
            in->chat_template = t;
        }
    }
    in->bos = tok_bos(e->dec.tok);
    in->add_bos = tok_add_bos(e->dec.tok);
    in->eos = tok_eos(e->dec.tok);
    struct decoder_sink_check sc; /* every slot is free now */
    decoder_sink_check(&e->dec, &sc);
    in->probe_sink_rate = sc.sink_rate;
    in->probe_first_mass = sc.first_mass;
    in->probe_warning = sc.warn;
    e->stats.healthy = 1;
    e->stats.kv_bytes = (int64_t)(2 * kv_geometry_slot_bytes(g) * (size_t)g->n_slots);
    return 0;
}

const struct engine_model_info *engine_model_info(const struct engine *e)
{
    return &e->info;
}
