/*
 * engine.c: the engine thread, the scheduler (engine.h).
 *
 * Each turn of the loop: take commands from the inbox (submits, cancels,
 * pauses), admit waiting requests into free KV slots (requests come with
 * token ids, tokenized off the loop thread by engine_tokenize; a text prompt
 * is still tokenized here), run ONE batched forward step for
 * every runnable sequence (continuous batching: decode tokens first, then
 * prefill chunks in the remaining token budget, earliest admitted first, so
 * a new long prompt never stalls running streams), then sample, emit events and retire finished
 * requests. Sequences are found by request id; nothing here knows HTTP.
 *
 * Sessions (session.c): a request with a session_id continues that
 * session's stream in the same KV slot: its prompt is appended after
 * everything the session has seen (including the last generated token).
 *
 * struct engine and struct seq are in engine_impl.h; loading the model and
 * filling engine_model_info is in engine_load.c.
 */
#include "engine.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend.h"
#include "engine_impl.h"
#include "forward.h"
#include "model.h"
#include "options.h"
#include "prefix.h"
#include "queue.h"
#include "session.h"
#include "snapshot.h"
#include "stop.h"
#include "tokenizer.h"

#define CMD_BATCH 64

struct engine_config engine_default_config(void)
{
    return (struct engine_config){
        .model_path = NULL,
        .n_threads = 2,
        .max_seqs = 8,
        .max_queue = 16,
        .window = 4096,
        .max_sinks = 16,
        .policy = {ENGINE_POLICY_AUTO, 0},
        .chunk = 256,
        .max_step_tokens = 512,
        .kv_dtype = ENGINE_KV_F16,
        .max_prompt_tokens = 0,
        .session_idle_s = 3600,
        .choices_hold_s = 10,
    };
}

void engine_request_free(struct engine_request *req)
{
    free(req->prompt);
    free(req->prompt_ids);
    free(req->open);
    free(req->close);
    free(req->bias_id);
    free(req->bias);
    for (int i = 0; i < ENGINE_MAX_STOP; i++)
        free(req->stop[i]);
    for (int p = 0; req->more && p < req->n_prompts - 1; p++) {
        free(req->more[p].text);
        free(req->more[p].ids);
    }
    free(req->more);
    memset(req, 0, sizeof *req);
}

/* A deep copy of src into dst (dst's old contents are not freed) that asks
 * src's prompt p (0: its own, else more[p - 1]) and owns no more prompts.
 * Returns 0, or -ENOMEM with dst empty. */
static int request_copy(struct engine_request *dst, const struct engine_request *src, int p)
{
    const char *text = p > 0 ? src->more[p - 1].text : src->prompt;
    const size_t text_len = p > 0 ? src->more[p - 1].text_len : src->prompt_len;
    const int32_t *ids = p > 0 ? src->more[p - 1].ids : src->prompt_ids;
    const int64_t n_ids = p > 0 ? src->more[p - 1].n_ids : src->n_prompt_ids;
    *dst = *src;
    dst->prompt = NULL;
    dst->prompt_len = text_len;
    dst->prompt_ids = NULL;
    dst->n_prompt_ids = n_ids;
    dst->ids_of_text = p > 0 ? src->more[p - 1].ids_of_text : src->ids_of_text;
    dst->more = NULL; /* (n_prompts stays: the request's places are counted by it) */
    dst->open = dst->close = NULL;
    dst->bias_id = NULL;
    dst->bias = NULL;
    memset(dst->stop, 0, sizeof dst->stop);
    int bad = 0;
    if (text) {
        dst->prompt = malloc(text_len + 1);
        bad |= !dst->prompt;
        if (dst->prompt) {
            memcpy(dst->prompt, text, text_len);
            dst->prompt[text_len] = 0;
        }
    }
    if (ids && n_ids > 0) {
        size_t bytes = (size_t)n_ids * sizeof(int32_t);
        dst->prompt_ids = malloc(bytes);
        bad |= !dst->prompt_ids;
        if (dst->prompt_ids)
            memcpy(dst->prompt_ids, ids, bytes);
    }
    bad |= src->open && !(dst->open = strdup(src->open));
    bad |= src->close && !(dst->close = strdup(src->close));
    for (int i = 0; i < ENGINE_MAX_STOP; i++)
        bad |= src->stop[i] && !(dst->stop[i] = strdup(src->stop[i]));
    if (src->n_bias > 0) {
        dst->bias_id = malloc((size_t)src->n_bias * sizeof *dst->bias_id);
        dst->bias = malloc((size_t)src->n_bias * sizeof *dst->bias);
        bad |= !dst->bias_id || !dst->bias;
        if (dst->bias_id && dst->bias) {
            memcpy(dst->bias_id, src->bias_id, (size_t)src->n_bias * sizeof *dst->bias_id);
            memcpy(dst->bias, src->bias, (size_t)src->n_bias * sizeof *dst->bias);
        }
    }
    if (bad) {
        engine_request_free(dst);
        return -ENOMEM;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- events ------------------------------------------------------------- */

static void emit(struct engine *e, const struct engine_event *ev)
{
    e->pushed = 1;
    while (queue_push_event(&e->q, ev) < 0) {
        if (queue_closed(&e->q))
            return;
        e->wake(e->wake_arg); /* the loop drains on wake, making room */
        queue_wait_room(&e->q, 1);
    }
}

/* param: the request field at fault, code: an OpenAI-style error code (both
 * may be NULL). */
static void emit_error(struct engine *e, uint64_t id, int status, const char *param,
                       const char *code, const char *msg)
{
    struct engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.id = id;
    ev.kind = ENGINE_EV_ERROR;
    ev.status = status;
    snprintf(ev.message, sizeof ev.message, "%s", msg);
    snprintf(ev.param, sizeof ev.param, "%s", param ? param : "");
    snprintf(ev.code, sizeof ev.code, "%s", code ? code : "");
    emit(e, &ev);
}

/* Emits text as TOKEN events of at most ENGINE_TEXT_MAX - 1 bytes, cut at
 * UTF-8 boundaries. The first event carries the token and its logprobs. */
static void emit_text(struct engine *e, const struct engine_event *proto, const char *text,
                      size_t len)
{
    struct engine_event ev = *proto;
    int first = 1;
    do {
        size_t n = len < ENGINE_TEXT_MAX - 1 ? len : ENGINE_TEXT_MAX - 1;
        while (n < len && n > 0 && ((unsigned char)text[n] & 0xC0) == 0x80)
            n--; /* do not split a character */
        memcpy(ev.text, text, n);
        ev.text[n] = 0;
        ev.text_len = (uint32_t)n;
        if (!first) {
            ev.token = -1;
            ev.has_lp = 0;
            ev.n_top = 0;
        }
        emit(e, &ev);
        first = 0;
        text += n;
        len -= n;
    } while (len > 0);
}

/* Emits the event of a token (ev: its token and log-probs) with the text
 * text[0..len) it let out, whose first `earlier` bytes end the text of
 * tokens before it (tok_stream's n_earlier: the U+FFFD for a tail they left
 * held, which this token's first byte shows will never be a character).
 * Those go first, in an event that counts the token but has no log-probs,
 * so that the token's log-probs travel with the first byte of its own text
 * and its text_offset is where that starts, not at an earlier token's
 * U+FFFD. */
static void emit_token_text(struct engine *e, const struct engine_event *ev, const char *text,
                            size_t len, size_t earlier)
{
    if (earlier == 0 || earlier > len || !ev->has_lp) {
        emit_text(e, ev, text, len);
        return;
    }
    struct engine_event before = *ev;
    before.has_lp = 0;
    before.n_top = 0;
    emit_text(e, &before, text, earlier);
    struct engine_event own = *ev;
    own.token = -1; /* counted once, above */
    emit_text(e, &own, text + earlier, len - earlier);
}

/* ---- log-probs of held text ---------------------------------------------- */

/* A request with stop strings and log-probs: each token's log-probs go out
 * with the first byte of its text, so that while the stop filter holds text
 * back it holds back its tokens' log-probs too, and the tokens of a stop
 * string, whose text is never sent, send none (a token whose text was partly
 * sent before the stop string keeps its log-probs). Text the filter holds
 * is at most STOP_HOLD_MAX bytes, so are the tokens that start in it, but
 * for tokens of no text: past LP_HELD_MAX the oldest goes out ahead of its
 * text. Without stop strings each token's log-probs go out with its event,
 * as its text does. */
#define LP_HELD_MAX (STOP_HOLD_MAX + 8)

struct lp_held {
    int64_t start; /* where the token's text starts in the text fed to the filter */
    int hidden;    /* a control token whose text is left out: it has none to wait for */
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_id[ENGINE_MAX_TOP_LOGPROBS];
    float top_logprob[ENGINE_MAX_TOP_LOGPROBS];
};

enum held_out {
    HELD_STARTED, /* the tokens whose text has started to go out */
    HELD_ALL,     /* every token: the text has ended, the filter holds none */
    HELD_CUT,     /* a stop string matched: the tokens whose text started before it, no others */
};

static void held_to_event(const struct lp_held *h, struct engine_event *ev)
{
    ev->has_lp = 1;
    ev->lp_token = h->token;
    ev->logprob = h->logprob;
    ev->n_top = h->n_top;
    memcpy(ev->top_id, h->top_id, sizeof h->top_id);
    memcpy(ev->top_logprob, h->top_logprob, sizeof h->top_logprob);
}

/* Sends text[0..len), which the stop filter let through (bytes [s->passed -
 * len, s->passed) of the text fed to it), in events that each start where a
 * held token's text starts and carry that token's log-probs, the tokens that
 * `which` lets out; then forgets them (HELD_CUT: all). proto is the event's
 * frame: its token (the one generated, or -1) goes on the first event, and
 * one event goes out even when there is nothing to send (it counts that
 * token). */
/* 1 if a token whose text starts at byte start of the text fed to the stop
 * filter has gone out once passed bytes have: a token goes out once its text
 * has started to; a hidden one, which has none, once the text before it has
 * (a stop string right after it is not its text). */
static int token_out(int64_t start, int hidden, int64_t passed)
{
    return start < passed || (hidden && start == passed);
}

static void held_send(struct engine *e, struct seq *s, const struct engine_event *proto,
                      const char *text, size_t len, enum held_out which)
{
    const int64_t at = s->passed - (int64_t)len;
    int k = 0;
    while (k < s->n_held &&
           (which == HELD_ALL || token_out(s->held[k].start, s->held[k].hidden, s->passed)))
        k++;
    struct engine_event ev = *proto;
    ev.has_lp = 0;
    ev.n_top = 0;
    int sent = 0;
    for (int i = -1; i < k; i++) { /* i = -1: text of tokens already sent */
        const int64_t from = i < 0 ? at : s->held[i].start;
        const int64_t to = i + 1 < k ? s->held[i + 1].start : s->passed;
        if (i < 0 && to == from)
            continue;
        if (i >= 0)
            held_to_event(&s->held[i], &ev);
        emit_text(e, &ev, text + (from - at), (size_t)(to - from));
        ev.token = -1; /* counted once */
        sent = 1;
    }
    if (!sent)
        emit_text(e, &ev, "", 0);
    s->n_held = which == HELD_CUT ? 0 : s->n_held - k;
    memmove(s->held, s->held + k, (size_t)s->n_held * sizeof *s->held);
}

/* Holds the log-probs of ev's token, whose text starts at byte start of the
 * text fed to the stop filter. */
static void held_add(struct engine *e, struct seq *s, const struct engine_event *ev, int64_t start,
                     int hidden)
{
    if (s->n_held == LP_HELD_MAX) { /* the oldest goes out now, its text later */
        struct engine_event out = *ev;
        out.token = -1;
        held_to_event(&s->held[0], &out);
        emit_text(e, &out, "", 0);
        memmove(s->held, s->held + 1, (size_t)--s->n_held * sizeof *s->held);
    }
    struct lp_held *h = &s->held[s->n_held++];
    h->start = start;
    h->hidden = hidden;
    h->token = ev->lp_token;
    h->logprob = ev->logprob;
    h->n_top = ev->n_top;
    memcpy(h->top_id, ev->top_id, sizeof h->top_id);
    memcpy(h->top_logprob, ev->top_logprob, sizeof h->top_logprob);
}

/* ---- sequence lifecycle ------------------------------------------------- */

static void seq_clear_request(struct seq *s)
{
    engine_request_free(&s->req);
    free(s->prompt);
    s->prompt = NULL;
    s->n_prompt = s->n_fed = 0;
    if (s->has_smp)
        sampler_free(&s->smp);
    s->has_smp = 0;
    stop_filter_init(&s->stop, NULL, 0);
    free(s->held);
    s->held = NULL;
    s->n_held = 0;
    s->paused = 0;
    s->cancel_after_prompt = 0;
    s->drop_session = 0;
    s->id = 0;
}

void engine__seq_release(struct engine *e, struct seq *s)
{
    seq_clear_request(s);
    kv_pool_release(&e->dec.fwd.pool, s->kv.slot);
    s->state = SEQ_FREE;
    s->session[0] = 0;
    s->has_next = 0;
}

/* Notes where the text of s's newest token (tok, n_gen-th) starts. */
static void gen_mark(struct seq *s, int32_t tok, int64_t start, int hidden)
{
    s->marks[(s->n_gen - 1) % GEN_MARKS] = (struct gen_mark){start, tok, hidden};
}

/* A session keeps what its client was sent. When a stop string ended the
 * turn, the tokens whose text starts at or after it (the stop string's,
 * those after it) leave the session's KV as if never fed, and the newest
 * token kept is the one to feed next. A hidden control token right before
 * the stop string stays: it went out with the text before it, as its
 * log-probs do. A token whose text starts before the stop string and runs
 * into it stays too, with its whole text. When the tokens to give back go
 * past the marks kept or past the ring's slack (kv_seq_retract), the
 * session keeps them all. */
static void session_give_back_stop_string(struct seq *s)
{
    const int64_t cut = s->passed; /* the stop string's first byte */
    const int64_t known = s->n_gen < GEN_MARKS ? s->n_gen : GEN_MARKS;
    int64_t j = 0; /* the newest j tokens go */
    while (j < known) {
        const struct gen_mark *m = &s->marks[(s->n_gen - 1 - j) % GEN_MARKS];
        if (token_out(m->start, m->hidden, cut))
            break;
        j++;
    }
    if (j == 0 || (j == known && known < s->n_gen))
        return;
    /* The KV holds the prompt and the generated tokens but the newest:
     * going back j tokens leaves out the last token kept too, which is the
     * next to feed (the prompt's last one when every generated token goes,
     * so that a session always has one to feed and an empty prompt may
     * continue it, as after any other turn). */
    if (kv_seq_retract(&s->kv, j) < 0)
        return;
    s->next_tok =
        j < s->n_gen ? s->marks[(s->n_gen - 1 - j) % GEN_MARKS].token : s->prompt[s->n_prompt - 1];
}

/* The sequences running request id's choices. */
static int64_t running_choices(const struct engine *e, uint64_t id)
{
    int64_t n = 0;
    for (int64_t i = 0; i < e->cfg.max_seqs; i++)
        n += e->seqs[i].state == SEQ_RUNNING && e->seqs[i].id == id;
    return n;
}

static void publish_stats(struct engine *e);

/* Ends the request running in s: flushes held text (the end of the text may
 * settle a stop string that was waiting: the finish reason is then STOP),
 * emits DONE, and either keeps the slot as an idle session or frees it. */
static void seq_finish(struct engine *e, struct seq *s, enum engine_finish why, int flush)
{
    struct engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.id = s->id;
    ev.choice = s->choice;
    ev.token = -1;
    if (flush) {
        char tail[16], out[STOP_HOLD_MAX + sizeof tail];
        size_t n = 0, m = 0;
        int64_t w = tok_stream_flush(&s->ts, tail, sizeof tail);
        int stopped = w > 0 ? stop_filter_push(&s->stop, tail, (size_t)w, out, sizeof out, &n) : 0;
        if (stopped == 0) {
            stopped = stop_filter_flush(&s->stop, out + n, sizeof out - n, &m);
            n += m;
        }
        if (stopped == 1)
            why = ENGINE_FINISH_STOP;
        ev.kind = ENGINE_EV_TOKEN;
        s->fed += w > 0 ? w : 0;
        s->passed += (int64_t)n;
        if (s->held && (n > 0 || s->n_held > 0)) {
            held_send(e, s, &ev, out, n, stopped == 1 ? HELD_CUT : HELD_ALL);
        } else if (n > 0) {
            emit_text(e, &ev, out, n);
        }
    }
    if (s->session[0] && s->stop.done)
        session_give_back_stop_string(s);
    ev.kind = ENGINE_EV_DONE;
    ev.finish = why;
    ev.prompt_tokens = s->usage_prompt;
    ev.completion_tokens = s->n_gen;
    ev.cached_tokens = s->usage_cached;
    ev.lp_sum = s->lp_sum;
    ev.text_len = 0;
    ev.text[0] = 0;
    if (s->session[0])
        session_describe(e, s, &ev.session);
    ev.choices_left = (int32_t)(running_choices(e, s->id) - 1);
    /* the counters out before the last event, so that a client that has it
     * (or /metrics read after its answer) counts this request's work; the
     * gauges are set again after the step */
    publish_stats(e);
    emit(e, &ev);
    if (ev.choices_left == 0)
        queue_request_done(&e->q, queue_places(&s->req));
    if (s->session[0] && !s->drop_session) {
        seq_clear_request(s);
        session_park(s, now_s());
    } else {
        engine__seq_release(e, s);
    }
}

static struct seq *find_running(struct engine *e, uint64_t id)
{
    for (int64_t i = 0; i < e->cfg.max_seqs; i++)
        if (e->seqs[i].state == SEQ_RUNNING && e->seqs[i].id == id)
            return &e->seqs[i];
    return NULL;
}

/* Encodes text with the model's tokenizer, BOS first if bos, stopping once
 * the count (BOS included) is known to pass max (< 0: no limit). Returns the
 * count with a malloc'd array in *out; max + 1 (more than max) with *out
 * NULL; or a negative errno. Time and memory follow min(len, max), not len. */
static int64_t encode(const struct tokenizer *t, const char *text, size_t len, int bos,
                      int parse_special, int64_t max, int32_t **out)
{
    *out = NULL;
    if (!text && len > 0)
        return -EINVAL;
    if (len > (size_t)INT64_MAX / sizeof(int32_t) - 2)
        return -E2BIG;
    if (max < 0)
        max = INT64_MAX;
    /* every token but BOS covers at least one byte: one pass suffices */
    int64_t cap = (int64_t)len + 1 + (bos ? 1 : 0);
    if (max < INT64_MAX && cap > max + 1)
        cap = max + 1;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids)
        return -ENOMEM;
    int64_t n = tok_encode_max(t, text, len, bos, parse_special, max, ids, cap);
    if (n > max) { /* only with a limit: more tokens than it */
        free(ids);
        return n;
    }
    if (n > cap) { /* not expected; the contract allows it */
        int32_t *p = realloc(ids, (size_t)n * sizeof *ids);
        n = p ? tok_encode_max(t, text, len, bos, parse_special, max, p, n) : -ENOMEM;
        ids = p ? p : ids;
    }
    if (n < 0) {
        free(ids);
        return n;
    }
    *out = ids;
    return n;
}

/* A request's prompt as token ids, BOS first when bos. Returns the count or
 * -1 after emitting an error. */
static int64_t prompt_tokens(struct engine *e, struct engine_request *r, int bos, int32_t **out)
{
    for (int i = 0; i < r->n_bias; i++) { /* the API checks them; the engine does not trust it */
        if (r->bias_id[i] < 0 || r->bias_id[i] >= e->info.n_vocab) {
            char msg[128];
            snprintf(msg, sizeof msg, "logit_bias token %d is outside the vocabulary [0, %lld)",
                     r->bias_id[i], (long long)e->info.n_vocab);
            emit_error(e, r->id, 400, "logit_bias", "invalid_value", msg);
            return -1;
        }
    }
    if (r->prompt) {
        /* past the limit the count is max + 1 ("more"), and admit_into refuses it */
        int64_t max = e->cfg.max_prompt_tokens > 0 ? e->cfg.max_prompt_tokens : -1;
        int64_t n = encode(e->dec.tok, r->prompt, r->prompt_len, bos, r->parse_special, max, out);
        if (n < 0)
            emit_error(e, r->id, 500, NULL, NULL, "tokenizing the prompt failed");
        return n < 0 ? -1 : n;
    }
    for (int64_t i = 0; i < r->n_prompt_ids; i++) {
        if (r->prompt_ids[i] < 0 || r->prompt_ids[i] >= e->info.n_vocab) {
            char msg[128];
            snprintf(msg, sizeof msg, "prompt token %lld is %d, outside the vocabulary [0, %lld)",
                     (long long)i, r->prompt_ids[i], (long long)e->info.n_vocab);
            emit_error(e, r->id, 400, "prompt", "invalid_value", msg);
            return -1;
        }
    }
    if (!bos) {
        *out = r->prompt_ids;
        r->prompt_ids = NULL;
        return r->n_prompt_ids;
    }
    int32_t *ids = malloc((size_t)(r->n_prompt_ids + 1) * sizeof *ids);
    if (!ids) {
        emit_error(e, r->id, 500, NULL, NULL, "out of memory");
        return -1;
    }
    ids[0] = tok_bos(e->dec.tok);
    if (r->n_prompt_ids > 0)
        memcpy(ids + 1, r->prompt_ids, (size_t)r->n_prompt_ids * sizeof *ids);
    *out = ids;
    return r->n_prompt_ids + 1;
}

/* The sampling field that makes sampler_init refuse p (API names), or NULL. */
static const char *bad_sampling_param(const struct sampler_params *p)
{
    if (!(p->temperature >= 0))
        return "temperature";
    if (p->top_k < 0)
        return "top_k";
    if (!(p->top_p > 0) || !(p->top_p <= 1))
        return "top_p";
    if (!(p->min_p >= 0) || !(p->min_p <= 1))
        return "min_p";
    if (!(p->repeat_penalty > 0))
        return "repeat_penalty";
    if (!isfinite(p->presence_penalty))
        return "presence_penalty";
    if (!isfinite(p->frequency_penalty))
        return "frequency_penalty";
    if (p->penalty_last_n < 0 || p->penalty_last_n > (1 << 20))
        return "penalty_last_n";
    return NULL;
}

/* A chat request on a session (r->open, r->close: engine.h): the prompt's
 * n tokens in *ids (BOS first when bos) with the template's text for what
 * the session turned out to be put before its turns. Returns the new count,
 * or -1 after emitting an error (*ids then freed). */
static int64_t around_turns(struct engine *e, const struct engine_request *r, int fresh, int bos,
                            int32_t **ids, int64_t n)
{
    const char *text = fresh ? r->open : r->close;
    if (!text || !text[0])
        return n;
    int32_t *pre = NULL, *all = NULL;
    int64_t k = encode(e->dec.tok, text, strlen(text), 0, 1, -1, &pre);
    if (k >= 0)
        all = malloc((size_t)(n + k) * sizeof *all);
    if (!all) {
        free(pre);
        free(*ids);
        *ids = NULL;
        emit_error(e, r->id, 500, NULL, NULL,
                   k < 0 ? "tokenizing the chat template failed" : "out of memory");
        return -1;
    }
    const int64_t b = bos ? 1 : 0; /* BOS stays first */
    memcpy(all, *ids, (size_t)b * sizeof *all);
    memcpy(all + b, pre, (size_t)k * sizeof *all);
    memcpy(all + b + k, *ids + b, (size_t)(n - b) * sizeof *all);
    free(pre);
    free(*ids);
    *ids = all;
    return n + k;
}

/* Admits a request into seq s (a fresh slot, or its idle session). Returns 0,
 * or -1 after emitting an error (s is then unchanged / released). */
static int admit_into(struct engine *e, struct seq *s, struct engine_request *r, int fresh)
{
    int32_t *ids = NULL;
    /* BOS starts a fresh sequence only: a session's prompt continues its
     * stream. The same rule for text and ids, so ids from engine_tokenize
     * give the text path's tokens. */
    int bos = fresh && r->add_bos && tok_add_bos(e->dec.tok) && tok_bos(e->dec.tok) >= 0;
    if (stop_filter_init(&s->stop, (const char *const *)r->stop, ENGINE_MAX_STOP) < 0) {
        char msg[160];
        snprintf(msg, sizeof msg, "a stop string is longer than %d bytes", ENGINE_MAX_STOP_LEN);
        emit_error(e, r->id, 400, "stop", "invalid_value", msg);
        return -1;
    }
    if (r->echo && r->session_id[0]) { /* the API refuses it first */
        emit_error(e, r->id, 400, "echo", "invalid_value", "echo cannot be used on a session");
        return -1;
    }
    int64_t n = prompt_tokens(e, r, bos, &ids);
    if (n < 0)
        return -1;
    n = around_turns(e, r, fresh, bos, &ids, n);
    if (n < 0)
        return -1;
    if (e->cfg.max_prompt_tokens > 0 && n > e->cfg.max_prompt_tokens) {
        char msg[160];
        if (r->prompt) /* tokenizing stopped at the limit: n is a lower bound */
            snprintf(msg, sizeof msg,
                     "the prompt has more than %lld tokens; this server accepts at most %lld",
                     (long long)e->cfg.max_prompt_tokens, (long long)e->cfg.max_prompt_tokens);
        else
            snprintf(msg, sizeof msg,
                     "the prompt has %lld tokens; this server accepts at most %lld", (long long)n,
                     (long long)e->cfg.max_prompt_tokens);
        free(ids);
        emit_error(e, r->id, 400, "prompt", "context_length_exceeded", msg);
        return -1;
    }
    if (fresh) {
        struct kv_policy pol =
            kv_policy_resolve(r->has_policy ? engine__kv_policy(r->policy) : e->default_policy,
                              e->dec.model.hp.normalizer == MODEL_NORM_SOFTMAX);
        const struct kv_geometry *g = &e->dec.fwd.pool.geo;
        char msg[160] = "";
        if (pol.kind == KV_POLICY_RECOMPUTE)
            snprintf(msg, sizeof msg,
                     "kv_policy recompute is for evaluation only "
                     "(streamsink perplexity), not for serving");
        else if (kv_policy_sinks(&pol) > g->n_sinks)
            snprintf(msg, sizeof msg,
                     "kv_policy asks for %lld sinks; this server keeps at most %lld",
                     (long long)kv_policy_sinks(&pol), (long long)g->n_sinks);
        else if (kv_seq_init(&s->kv, g, s->kv.slot, pol, g->window, 0) < 0)
            snprintf(msg, sizeof msg, "kv_policy is not usable on this server");
        if (msg[0]) {
            free(ids);
            emit_error(e, r->id, 400, "kv_policy", "invalid_value", msg);
            return -1;
        }
        s->has_next = 0;
        s->owner = r->owner;
    } else if (r->has_policy) {
        /* a session's cache was built under its policy, which it keeps: a
         * request that names another one is refused, not quietly overruled */
        struct kv_policy want = kv_policy_resolve(engine__kv_policy(r->policy),
                                                  e->dec.model.hp.normalizer == MODEL_NORM_SOFTMAX);
        if (want.kind != s->kv.policy.kind ||
            kv_policy_sinks(&want) != kv_policy_sinks(&s->kv.policy)) {
            char have[32], asked[32], msg[256];
            kv_policy_name(&s->kv.policy, have, sizeof have);
            kv_policy_name(&want, asked, sizeof asked);
            snprintf(msg, sizeof msg,
                     "session '%.127s' keeps kv_policy %.15s; a request cannot change it to %.15s",
                     r->session_id, have, asked);
            free(ids);
            emit_error(e, r->id, 400, "kv_policy", "invalid_value", msg);
            return -1;
        }
    }
    /* a chat continuation's close holds the template's end of the turn: an
     * end-of-generation token the turn left to feed is not fed twice */
    int64_t pending = s->has_next && !(!fresh && r->close && tok_is_eog(e->dec.tok, s->next_tok));
    if (n + pending == 0) {
        free(ids);
        emit_error(e, r->id, 400, "prompt", "invalid_value", "the prompt is empty");
        return -1;
    }
    /* a dense context keeps a cell for the answer's first token, unless
     * there is none to generate (echo with max_tokens 0) */
    const int64_t answer = !(r->echo && r->max_tokens == 0);
    if (s->kv.policy.kind == KV_POLICY_DENSE &&
        s->kv.pos_next - s->kv.pos_first + n + pending + answer > s->kv.window) {
        char msg[160];
        snprintf(msg, sizeof msg,
                 "the prompt (%lld tokens) does not fit the dense context of %lld tokens",
                 (long long)(n + pending + s->kv.pos_next - s->kv.pos_first),
                 (long long)s->kv.window);
        free(ids);
        emit_error(e, r->id, 400, "prompt", "context_length_exceeded", msg);
        return -1;
    }
    struct sampler_params sp = engine__sampler_params(&r->sampling);
    int rc = sampler_init(&s->smp, &sp, e->info.n_vocab);
    if (rc < 0) {
        const char *param = bad_sampling_param(&sp);
        char msg[160];
        free(ids);
        if (rc == -ENOMEM) {
            emit_error(e, r->id, 500, NULL, NULL, "out of memory");
            return -1;
        }
        snprintf(msg, sizeof msg, "invalid sampling parameter%s%s", param ? " " : "s",
                 param ? param : "");
        emit_error(e, r->id, 400, param, "invalid_value", msg);
        return -1;
    }
    s->has_smp = 1;
    s->prompt = malloc((size_t)(n + pending) * sizeof(int32_t));
    const int hold_lp = s->stop.n_stop > 0 && (r->logprobs || r->top_logprobs > 0);
    s->held = hold_lp ? malloc(LP_HELD_MAX * sizeof *s->held) : NULL;
    if (!s->prompt || (hold_lp && !s->held)) {
        free(s->prompt);
        s->prompt = NULL;
        free(s->held);
        s->held = NULL;
        free(ids);
        sampler_free(&s->smp);
        s->has_smp = 0;
        emit_error(e, r->id, 500, NULL, NULL, "out of memory");
        return -1;
    }
    if (pending)
        s->prompt[0] = s->next_tok;
    memcpy(s->prompt + pending, ids, (size_t)n * sizeof(int32_t));
    free(ids);
    s->n_prompt = n + pending;
    s->n_fed = 0;
    s->turn_had_next = s->has_next;
    s->turn_next_tok = s->next_tok;
    s->has_next = 0;
    for (int64_t i = 0; i < s->n_prompt; i++)
        sampler_accept(&s->smp, s->prompt[i]);
    s->id = r->id;
    s->choice = 0;
    s->lead = -1;
    s->req = *r;
    memset(r, 0, sizeof *r);
    if (s->req.min_tokens > 0) /* stop strings wait for the text after them */
        stop_filter_init(&s->stop, NULL, 0);
    s->state = SEQ_RUNNING;
    s->admitted = ++e->admit_clock;
    s->n_gen = 0;
    s->lp_sum = 0;
    s->n_held = 0;
    s->fed = s->passed = 0;
    s->usage_prompt = n;
    s->paused = 0;
    memset(&s->ts, 0, sizeof s->ts);
    json_gram_init(&s->json);
    s->echo_from = s->req.echo ? bos : -1;
    s->echo_strip = s->req.echo && tok_space_prefix(e->dec.tok) &&
                    ((s->req.prompt && s->req.prompt_len > 0) || s->req.ids_of_text);
    snprintf(s->session, sizeof s->session, "%s", s->req.session_id);
    s->last_used = now_s();
    /* a free slot may hold the prompt's first tokens (prefix.h) */
    s->usage_cached = fresh ? prefix_take(e, s) : 0;
    e->stats.prompt_tokens_cached_total += s->usage_cached;
    return 0;
}

static void request_over(struct engine *e, struct engine_request *r)
{
    queue_request_done(&e->q, queue_places(r));
    engine_request_free(r);
}

static void no_such_session(struct engine *e, uint64_t id, const char *sid)
{
    char msg[160 + ENGINE_SESSION_ID_MAX];
    snprintf(msg, sizeof msg,
             "session '%s' does not exist: it never did, it expired, it was deleted, or it "
             "belongs to another API key",
             sid);
    emit_error(e, id, 404, "session_id", "session_not_found", msg);
}

static void session_not_found(struct engine *e, const struct engine_request *r)
{
    no_such_session(e, r->id, r->session_id);
}

static void emit_session(struct engine *e, uint64_t id, const struct engine_session_info *in)
{
    struct engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.id = id;
    ev.kind = ENGINE_EV_SESSION;
    ev.token = -1;
    ev.session = *in;
    emit(e, &ev);
}

/* The DONE of a request that generated nothing: a session command's
 * (finish NONE), or one cancelled before it ran (CANCELLED). */
static void emit_done(struct engine *e, uint64_t id, enum engine_finish finish)
{
    struct engine_event ev;
    memset(&ev, 0, sizeof ev);
    ev.id = id;
    ev.kind = ENGINE_EV_DONE;
    ev.token = -1;
    ev.finish = finish;
    emit(e, &ev);
}

static void list_one(struct engine *e, const struct engine_session_info *in, void *arg)
{
    emit_session(e, *(const uint64_t *)arg, in);
}

/* A snapshot of session sid that exists but could not be done (read,
 * deleted) to, for rc, as error status/code of request id. */
static void snapshot_failed(struct engine *e, uint64_t id, int status, const char *code,
                            const char *sid, const char *done, int rc)
{
    char msg[160 + ENGINE_SESSION_ID_MAX];
    snprintf(msg, sizeof msg, "the snapshot of session '%s' could not be %s: %s", sid, done,
             strerror(-rc));
    emit_error(e, id, status, NULL, code, msg);
}

void engine__delete_answer(struct engine *e, uint64_t id, const char *sid, int found, int rc)
{
    if (rc < 0 && rc != -ENOENT) {
        snapshot_failed(e, id, 500, "session_delete_failed", sid, "deleted", rc);
    } else if (found || rc == 0) {
        emit_done(e, id, ENGINE_FINISH_NONE);
    } else {
        no_such_session(e, id, sid);
    }
}

void engine__describe_answer(struct engine *e, uint64_t id, const char *sid, int rc,
                             const struct engine_session_info *in)
{
    if (rc == -ENOENT) {
        no_such_session(e, id, sid);
    } else if (rc < 0) {
        snapshot_failed(e, id, 503, "session_read_failed", sid, "read", rc);
    } else {
        emit_session(e, id, in);
        emit_done(e, id, ENGINE_FINISH_NONE);
    }
}

void engine__save_answer(struct engine *e, uint64_t id, uint64_t key, const char *sid, int rc,
                         const char *why, const struct engine_session_info *written)
{
    struct engine_session_info in;
    if (rc < 0) {
        emit_error(e, id, rc == -ENOTSUP ? 400 : 500, NULL,
                   rc == -ENOTSUP ? "sessions_not_persistent" : "session_save_failed", why);
        return;
    }
    struct seq *s = session_find(e, sid);
    if (s && s->owner == key)
        session_describe(e, s, &in);
    else
        in = *written; /* the session left memory while it was written */
    emit_session(e, id, &in);
    emit_done(e, id, ENGINE_FINISH_NONE);
}

/* The caller's session named by r in a KV slot, or NULL (another key's
 * session does not exist for this one). */
static struct seq *own_session(struct engine *e, const struct engine_request *r)
{
    struct seq *s = r->session_id[0] ? session_find(e, r->session_id) : NULL;
    return s && s->owner == r->owner ? s : NULL;
}

/* The session requests: save, get, list, delete (key-bound). Returns 1 when
 * done with r (answered, or to be answered when the session IO thread is
 * done with its file), 0 when it must wait for a place with that thread
 * (nothing done yet). */
static int session_command(struct engine *e, struct engine_request *r)
{
    struct engine_session_info in;
    struct seq *s = own_session(e, r);
    switch (r->kind) {
    case ENGINE_REQ_SESSION_SAVE: {
        char why[200];
        if (!s && session_describe_held(e, r->session_id, r->owner, &in) == 0) {
            emit_error(e, r->id, 500, NULL, "session_save_failed",
                       "this session's last snapshot could not be written; it is held in "
                       "memory and the write is tried again every few seconds");
            return 1;
        }
        if (!s) { /* not in memory: its snapshot, if there is one, is current */
            if (!session_file_room(e))
                return 0;
            if (!session_describe_start(e, r->session_id, r->owner, r->id))
                session_not_found(e, r);
            return 1;
        }
        if (s->state == SEQ_RUNNING) {
            emit_error(e, r->id, 409, "session_id", "session_busy",
                       "this session is busy with a request; save it when the request is over");
            return 1;
        }
        if (!session_save_room(e))
            return 0; /* the writer has every save place: wait for one */
        int rc = session_save(e, s, r->id, why, sizeof why);
        if (rc < 0)
            engine__save_answer(e, r->id, r->owner, r->session_id, rc, why, NULL);
        return 1; /* answered when the writer is done */
    }
    case ENGINE_REQ_SESSION_GET:
        if (s)
            session_describe(e, s, &in);
        if (s || session_describe_held(e, r->session_id, r->owner, &in) == 0) {
            emit_session(e, r->id, &in);
            emit_done(e, r->id, ENGINE_FINISH_NONE);
            return 1;
        }
        if (!session_file_room(e))
            return 0;
        if (!session_describe_start(e, r->session_id, r->owner, r->id))
            session_not_found(e, r); /* no directory */
        return 1;
    case ENGINE_REQ_SESSION_LIST: {
        /* made with the directory's files off the thread (try_admit) */
        int rc = session_list(e, r->id, list_one, &r->id);
        if (rc < 0) {
            char msg[160];
            snprintf(msg, sizeof msg, "the session directory could not be read: %s", strerror(-rc));
            emit_error(e, r->id, 503, NULL, "session_read_failed", msg);
            return 1;
        }
        if (rc == 0)
            session_list_memory(e, r->owner, list_one, &r->id); /* no directory: memory only */
        emit_done(e, r->id, ENGINE_FINISH_NONE);
        return 1;
    }
    case ENGINE_REQ_SESSION_DELETE: {
        if (s && s->state == SEQ_RUNNING) {
            emit_error(e, r->id, 409, "session_id", "session_busy",
                       "this session is busy with a request");
            return 1;
        }
        if (!session_file_room(e))
            return 0;
        int found = s != NULL;
        if (s)
            engine__seq_release(e, s);
        session_loads_forget(e, r->session_id, r->owner); /* read, not restored: gone too */
        found |= session_saves_forget(e, r->session_id, r->owner) > 0; /* nothing written after */
        /* the file, off the engine thread: answered when it is gone */
        if (!session_delete_start(e, r->session_id, r->owner, r->id, found))
            engine__delete_answer(e, r->id, r->session_id, found, -ENOENT); /* no directory */
        return 1;
    }
    case ENGINE_REQ_GENERATE:
        break;
    }
    return 1;
}

/* Gives back the slot s that session_take_slot gave a request that does not
 * keep it (no request was put in it). */
static void untake_slot(struct engine *e, struct seq *s)
{
    kv_pool_release(&e->dec.fwd.pool, s->kv.slot);
    s->state = SEQ_FREE;
    s->session[0] = 0;
}

/* Frees the slots of request id's choices admitted so far, with no event. */
static void unadmit_choices(struct engine *e, uint64_t id)
{
    for (int64_t i = 0; i < e->cfg.max_seqs; i++) {
        struct seq *s = &e->seqs[i];
        if (s->state == SEQ_RUNNING && s->id == id) {
            e->stats.prompt_tokens_cached_total -= s->usage_cached; /* never served */
            engine__seq_release(e, s);
        }
    }
}

/* Slots a request may be given now or once idle sessions leave memory:
 * the free ones, and those of idle sessions unless none can leave (every
 * save place holds a failed write). */
static int64_t admit_places(const struct engine *e)
{
    const int pinned = session_idle_pinned(e);
    int64_t places = 0;
    for (int64_t i = 0; i < e->cfg.max_seqs; i++)
        places += e->seqs[i].state == SEQ_FREE || (!pinned && e->seqs[i].state == SEQ_IDLE);
    return places;
}

/* Places a request of several sequences (no session): n > 1 choices, or
 * more than one prompt, or both. It takes all its slots at once, each a
 * fresh sequence whose request is a copy of r for prompt p with seed + j
 * (choice p * n + j); or, while that many slots are not free, it waits. A
 * prompt's first choice prefills it and the others wait for it
 * (share_with_choices), unless the prompt is echoed: each choice then
 * scores it itself. Returns as try_admit. */
static int admit_choices(struct engine *e, struct engine_request *r)
{
    const int64_t n = (int64_t)queue_places(r); /* sequences: prompts x choices */
    const int64_t per = r->n_choices > 1 ? r->n_choices : 1;
    const int several = r->n_prompts > 1;
    const uint64_t id = r->id, seed = r->sampling.seed;
    if (r->session_id[0] || n > e->cfg.max_seqs) { /* the API refuses both first */
        const char *param = several ? "prompt" : "n";
        emit_error(e, id, 400, param, "invalid_value",
                   r->session_id[0] ? "several choices or prompts cannot be used on a session"
                                    : "the request's choices (n for each prompt) are more than "
                                      "this server's KV slots (--max-seqs)");
        request_over(e, r);
        return 1;
    }
    /* the slots first, all of them, then the choices: a pass that cannot
     * have them all (the session writer busy) gives them back untouched */
    struct seq **taken = admit_places(e) >= n ? malloc((size_t)n * sizeof *taken) : NULL;
    int64_t got = 0;
    while (taken && got < n) {
        struct seq *s = session_take_slot(e);
        if (!s)
            break;
        s->state = SEQ_TAKEN; /* not to be taken again */
        taken[got++] = s;
    }
    if (!taken || got < n) {
        const int oom = !taken && admit_places(e) >= n;
        for (int64_t j = 0; j < got; j++)
            untake_slot(e, taken[j]);
        free(taken);
        if (!oom && !session_slots_stuck(e, n))
            return 0;
        if (oom)
            emit_error(e, id, 500, NULL, NULL, "out of memory");
        else
            emit_error(e, id, 503, NULL, "session_save_failed",
                       "the KV slots this request needs hold sessions that cannot leave memory: "
                       "writes to the session directory are failing; retry later");
        request_over(e, r);
        return 1;
    }
    const int share = !r->echo;
    for (int64_t i = 0; i < n; i++) {
        struct seq *s = taken[i];
        const int64_t p = i / per, j = i % per;
        struct engine_request one;
        int rc = 0;
        if (i < n - 1 || several) {
            rc = request_copy(&one, r, (int)p);
            if (rc < 0)
                emit_error(e, id, 500, NULL, NULL, "out of memory");
        } else { /* the last choice of a lone prompt takes r itself */
            one = *r;
            memset(r, 0, sizeof *r);
            r->n_choices = (int)per; /* for request_over's count */
        }
        if (rc == 0) {
            one.sampling.seed = seed + (uint64_t)j;
            one.no_prefix |= j > 0 && share; /* it takes the first's cells */
            rc = admit_into(e, s, &one, 1);  /* on failure it says why: one ERROR */
            if (rc < 0)
                engine_request_free(&one);
        }
        if (rc < 0) {
            for (int64_t k = i; k < n; k++)
                untake_slot(e, taken[k]);
            unadmit_choices(e, id);
            free(taken);
            request_over(e, r);
            return 1;
        }
        s->choice = (int32_t)i;
        s->created = s->restored = 0;
        if (j > 0 && share)
            s->lead = taken[i - j] - e->seqs;
    }
    free(taken);
    if (several)
        engine_request_free(r); /* each choice has its copy; the places go with the last DONE */
    return 1;
}

/* Tries to place a request. Returns 1 if done with it (admitted or failed),
 * 0 if it must wait for a slot. */
static int try_admit(struct engine *e, struct engine_request *r)
{
    if (r->session_id[0] && session_file_busy(e, r->session_id))
        return 0; /* after the IO thread's read or delete of its file */
    if (r->kind != ENGINE_REQ_GENERATE) {
        if (session_load_busy(e, r->session_id))
            return 0; /* after the restore whose file is being read */
        /* a session not in memory (or being deleted) whose file is being
         * written: after the write (never waited for on this thread) */
        if (r->session_id[0] && (r->kind == ENGINE_REQ_SESSION_DELETE || !own_session(e, r)) &&
            session_save_busy(e, r->session_id, r->owner))
            return 0;
        if (r->kind == ENGINE_REQ_SESSION_LIST && session_list_wait(e, r->id, r->owner))
            return 0; /* the directory is being read for it */
        if (!session_command(e, r))
            return 0; /* for a place with the IO thread */
        request_over(e, r);
        return 1;
    }
    if (queue_places(r) > 1)
        return admit_choices(e, r);
    if (r->session_id[0]) {
        struct seq *s = session_find(e, r->session_id);
        if (s && s->owner != r->owner) {
            session_not_found(e, r);
            request_over(e, r);
            return 1;
        }
        if (s && s->state == SEQ_RUNNING) {
            emit_error(e, r->id, 409, "session_id", "session_busy",
                       "this session is busy with another request");
            request_over(e, r);
            return 1;
        }
        if (s) {
            s->created = s->restored = 0;
            if (admit_into(e, s, r, 0) < 0)
                request_over(e, r);
            return 1;
        }
    }
    if (r->session_id[0] && session_restore_wait(e, r->session_id, r->owner))
        return 0; /* its snapshot is being read off the engine thread */
    if (r->session_id[0] && session_load_foreign(e, r->session_id, r->owner)) {
        session_not_found(e, r); /* before any slot is taken */
        request_over(e, r);
        return 1;
    }
    struct seq *s = session_take_slot(e);
    if (!s && session_slots_stuck(e, 1)) {
        /* waiting would be for the disk to come back, with no answer */
        emit_error(e, r->id, 503, NULL, "session_save_failed",
                   "every KV slot holds a session that cannot leave memory: writes to the "
                   "session directory are failing; retry later");
        request_over(e, r);
        return 1;
    }
    if (!s)
        return 0;
    /* taking the slot may have waited for the writer (a save with every
     * place taken), which ends a save of this session: its file is then to
     * be read off this thread too */
    if (r->session_id[0] && session_restore_wait(e, r->session_id, r->owner)) {
        untake_slot(e, s);
        return 0;
    }
    if (r->session_id[0]) { /* not in memory: on disk, or gone, or new */
        struct session_err se;
        int rc = session_restore(e, s, r->session_id, r->owner, &se);
        if (rc == 1) {
            s->state = SEQ_IDLE;
            s->last_used = now_s();
            s->created = 0;
            s->restored = 1;
            if (admit_into(e, s, r, 0) < 0)
                request_over(e, r); /* the session stays, idle */
            return 1;
        }
        if (rc < 0 || r->session_must_exist) {
            untake_slot(e, s);
            if (rc < 0 && se.status != 404)
                emit_error(e, r->id, se.status, "session_id", se.code[0] ? se.code : NULL,
                           se.message);
            else
                session_not_found(e, r);
            request_over(e, r);
            return 1;
        }
    }
    if (admit_into(e, s, r, 1) < 0) {
        untake_slot(e, s);
        request_over(e, r);
        return 1;
    }
    s->created = s->session[0] != 0;
    s->restored = 0;
    return 1;
}

static void handle_commands(struct engine *e, int wait_ms)
{
    struct queue_cmd cmds[CMD_BATCH];
    size_t n;
    int first = 1;
    while ((n = queue_take(&e->q, cmds, CMD_BATCH, first ? wait_ms : 0)) > 0) {
        first = 0;
        for (size_t i = 0; i < n; i++) {
            struct queue_cmd *c = &cmds[i];
            switch (c->kind) {
            case QUEUE_CMD_SUBMIT:
                if (e->n_waiting < e->cfg.max_seqs + e->cfg.max_queue) {
                    e->waiting[e->n_waiting++] = (struct waiting_req){.req = c->req};
                } else { /* cannot happen: queue_submit bounds requests in flight */
                    emit_error(e, c->id, 429, NULL, "rate_limit_exceeded",
                               "the server is at capacity");
                    request_over(e, &c->req);
                }
                break;
            case QUEUE_CMD_CANCEL: {
                if (find_running(e, c->id)) {
                    /* flushed: text held back (a possible stop string's
                     * start, part of a character) goes out with its
                     * logprobs, since a session keeps its tokens; every
                     * choice ends, the last DONE ending the request. A
                     * session never holds part of a prompt: a turn with
                     * none of it fed leaves the session as it was (one it
                     * would have started does not exist), and one part-way
                     * through ends once the prompt is in */
                    for (int64_t j = 0; j < e->cfg.max_seqs; j++) {
                        struct seq *s = &e->seqs[j];
                        if (s->state != SEQ_RUNNING || s->id != c->id)
                            continue;
                        if (s->session[0] && s->n_fed == 0 && s->n_prompt > 0) {
                            s->has_next = s->turn_had_next;
                            s->next_tok = s->turn_next_tok;
                            s->drop_session = s->created;
                            seq_finish(e, s, ENGINE_FINISH_CANCELLED, 1);
                        } else if (s->session[0] && s->n_fed < s->n_prompt) {
                            s->cancel_after_prompt = 1;
                            s->paused = 0;
                        } else {
                            seq_finish(e, s, ENGINE_FINISH_CANCELLED, 1);
                        }
                    }
                    break;
                }
                for (int64_t j = 0; j < e->n_waiting; j++) {
                    if (e->waiting[j].req.id == c->id) {
                        e->n_lists_waiting -= e->waiting[j].list_waits;
                        e->n_sess_waiting -= e->waiting[j].sess_waits;
                        struct engine_request gone = e->waiting[j].req;
                        memmove(&e->waiting[j], &e->waiting[j + 1],
                                (size_t)(e->n_waiting - j - 1) * sizeof *e->waiting);
                        e->n_waiting--;
                        emit_done(e, c->id, ENGINE_FINISH_CANCELLED);
                        request_over(e, &gone);
                        break;
                    }
                }
                break;
            }
            case QUEUE_CMD_PAUSE:
            case QUEUE_CMD_RESUME: {
                int found = 0;
                for (int64_t j = 0; j < e->cfg.max_seqs; j++) {
                    struct seq *s = &e->seqs[j];
                    if (s->state == SEQ_RUNNING && s->id == c->id) {
                        s->paused = c->kind == QUEUE_CMD_PAUSE && !s->cancel_after_prompt;
                        found = 1;
                    }
                }
                if (found)
                    break;
                /* still waiting for a slot: remembered for its admission */
                for (int64_t j = 0; j < e->n_waiting; j++)
                    if (e->waiting[j].req.id == c->id)
                        e->waiting[j].paused = c->kind == QUEUE_CMD_PAUSE;
                break;
            }
            case QUEUE_CMD_RETIRE:
                e->retiring = e->dir_fd >= 0;
                break;
            }
        }
    }
}

/* Session API requests that may wait at once on the session IO thread:
 * each holds a place of the requests in flight, so a directory that is slow
 * to read (or a file that will not open) takes at most this many of them
 * from the completions; more get 429. GET /v1/sessions (session_list_wait)
 * has its own count, always bounded. The requests naming a session (GET,
 * save, DELETE: waiting for a read, a write or a delete of its file, or for
 * a place with that thread) have theirs, bounded while the IO thread is
 * slow (session_io_slow): they wait for a moment when several clients work
 * on one session, and that must not be refused. */
#define LISTS_WAITING_MAX 4
#define SESSION_REQS_WAITING_MAX 4

/* Waiting requests naming a session that hold back later ones naming it,
 * per pass of admit_waiting (past that many, later requests are not held). */
#define AHEAD_MAX 32

static int is_session_request(const struct engine_request *r)
{
    return r->kind == ENGINE_REQ_SESSION_GET || r->kind == ENGINE_REQ_SESSION_SAVE ||
           r->kind == ENGINE_REQ_SESSION_DELETE;
}

/* Counts w among the waiting requests of its kind on the IO thread: 1, or
 * 0 when their places are taken (w is answered 429 and over). */
static int count_io_wait(struct engine *e, struct waiting_req *w)
{
    int64_t *n = NULL, max = 0;
    int *flag = NULL;
    const char *what = NULL;
    if (w->req.kind == ENGINE_REQ_SESSION_LIST) {
        n = &e->n_lists_waiting, max = LISTS_WAITING_MAX, flag = &w->list_waits;
        what = "too many session listings are waiting; retry shortly";
    } else if (is_session_request(&w->req)) {
        n = &e->n_sess_waiting, max = SESSION_REQS_WAITING_MAX, flag = &w->sess_waits;
        what = "too many session requests are waiting for the session directory; retry shortly";
    }
    if (!n || *flag)
        return 1;
    if (*n >= max && (flag == &w->list_waits || session_io_slow(e))) {
        emit_error(e, w->req.id, 429, NULL, "rate_limit_exceeded", what);
        request_over(e, &w->req);
        return 0;
    }
    *flag = 1;
    (*n)++;
    return 1;
}

/* Whether waiting request l, which came after waiting request a, must
 * wait behind it: both name the same session of the same key, and a is a
 * session request (GET, save, DELETE), or a completion and l a save or a
 * DELETE (which must not overtake a completion sent before them). */
static int held_behind(const struct engine_request *l, const struct engine_request *a)
{
    if (!l->session_id[0] || a->owner != l->owner)
        return 0;
    if (a->kind == ENGINE_REQ_GENERATE && l->kind != ENGINE_REQ_SESSION_SAVE &&
        l->kind != ENGINE_REQ_SESSION_DELETE)
        return 0;
    return engine_session_id_equal(a->session_id, l->session_id);
}

static void admit_waiting(struct engine *e)
{
    /* waiting requests naming a session, so far in this pass: later ones
     * naming the same session wait behind them (held_behind), so that a
     * DELETE is not overtaken by a GET or a completion sent after it, nor
     * overtakes a completion sent before it (a small table: past AHEAD_MAX
     * such requests, later ones are not held) */
    const struct engine_request *ahead[AHEAD_MAX];
    int n_ahead = 0;
    /* a request of several choices waiting for its slots: later completions
     * that need a fresh slot wait behind it, so that one slot at a time
     * going to them cannot keep it waiting for ever; for choices_hold_s from
     * the first pass in which one waited, until none does (a stream of such
     * requests gets one hold, not one each) */
    int choices_wait = 0, choices_blocked = 0;
    const double now = now_s();
    int64_t j = 0;
    for (int64_t i = 0; i < e->n_waiting; i++) {
        struct waiting_req *w = &e->waiting[i];
        uint64_t id = w->req.id;
        int paused = w->paused;
        /* a completion that would take a slot: one without a session, or
         * whose session is not in memory (to start or to restore) */
        const int fresh_gen = w->req.kind == ENGINE_REQ_GENERATE &&
                              (!w->req.session_id[0] || !session_find(e, w->req.session_id));
        const int64_t places = (int64_t)queue_places(&w->req);
        const int choices = fresh_gen && places > 1;
        int behind = choices_wait && fresh_gen;
        for (int k = 0; k < n_ahead && !behind; k++)
            behind = held_behind(&w->req, ahead[k]);
        if (behind || !try_admit(e, &w->req)) {
            /* (one waiting for the session writer, with the slots there,
             * holds nobody) */
            if (choices && admit_places(e) < places) {
                if (!choices_blocked && e->choices_hold_from == 0)
                    e->choices_hold_from = now;
                choices_blocked = 1;
                choices_wait |= now - e->choices_hold_from < e->cfg.choices_hold_s;
            }
            if (!count_io_wait(e, w))
                continue;
            e->waiting[j++] = *w; /* keep FIFO order */
            if (w->req.session_id[0] && n_ahead < AHEAD_MAX)
                ahead[n_ahead++] = &e->waiting[j - 1].req;
            continue;
        }
        e->n_lists_waiting -= w->list_waits;
        e->n_sess_waiting -= w->sess_waits;
        for (int64_t k = 0; paused && k < e->cfg.max_seqs; k++)
            if (e->seqs[k].state == SEQ_RUNNING && e->seqs[k].id == id)
                e->seqs[k].paused = 1; /* paused while it waited */
    }
    e->n_waiting = j;
    if (!choices_blocked)
        e->choices_hold_from = 0;
    if (session_loads_gc(e))
        queue_poke(&e->q); /* a place for a read is free: another pass, not a sleep */
    session_lists_gc(e);
}

/* ---- one step ----------------------------------------------------------- */

static void top_logprobs(const float *lg, int64_t V, int n, float lse, struct engine_event *ev)
{
    ev->n_top = 0;
    for (int64_t v = 0; v < V; v++) {
        float lp = lg[v] - lse;
        int k = ev->n_top;
        if (k == n && lp <= ev->top_logprob[n - 1])
            continue;
        if (k < n)
            ev->n_top++;
        else
            k = n - 1;
        while (k > 0 && ev->top_logprob[k - 1] < lp) {
            ev->top_logprob[k] = ev->top_logprob[k - 1];
            ev->top_id[k] = ev->top_id[k - 1];
            k--;
        }
        ev->top_logprob[k] = lp;
        ev->top_id[k] = (int32_t)v;
    }
}

/* The bytes that may come next in state g: ok[b] for each. */
static void json_next_bytes(const struct json_gram *g, uint8_t ok[256])
{
    for (int b = 0; b < 256; b++) {
        struct json_gram t = *g;
        char c = (char)b;
        ok[b] = (uint8_t)json_gram_feed(&t, &c, 1);
    }
}

/* 1 if token v may come next in state g: its text read on a copy. */
static int json_reads(const struct engine *e, const struct json_gram *g, int32_t v)
{
    size_t len = 0;
    const char *p = tok_piece(e->dec.tok, v, &len);
    struct json_gram t = *g;
    return p && json_gram_feed(&t, p, len);
}

/* json_object: every token whose text would take s's answer out of the JSON
 * grammar gets -inf in lg (control and end-of-generation tokens too: the
 * answer ends at the object's close). What is known of each token before
 * reading it (e->json_tok) rules out most of the vocabulary, so that only a
 * few thousand tokens are visited one by one:
 *   - inside a string, a token of plain string text is taken as it is, and
 *     only the others (e->json_rest) are looked at;
 *   - elsewhere, the tokens whose first byte cannot come next are ruled out
 *     together (e->json_ids, by first byte), and between tokens of JSON
 *     (where every whitespace byte does the same) a token that starts with
 *     whitespace by the length of it and the byte after it.
 * A token left is read on a copy of the state. With STREAMSINK_JSON_MASK=
 * read every token is read (the tests' reference for these shortcuts).
 * Should nothing be left (a vocabulary without the bytes JSON needs), an
 * end-of-generation token is (or, with none, token 0, which after_pick then
 * refuses): the answer ends rather than breaking the grammar. */
static void json_mask(const struct engine *e, const struct seq *s, float *lg)
{
    const struct json_gram *g = &s->json;
    int64_t allowed = 0;
    if (e->json_read_all) {
        for (int64_t v = 0; v < e->info.n_vocab; v++) {
            if (e->json_tok[v].kind != JSON_TOK_NEVER && json_reads(e, g, (int32_t)v))
                allowed++;
            else
                lg[v] = -INFINITY;
        }
    } else if (json_gram_in_string(g)) {
        allowed = e->info.n_vocab - e->n_json_rest;
        for (int64_t k = 0; k < e->n_json_rest; k++) {
            const int32_t v = e->json_rest[k];
            if (e->json_tok[v].kind != JSON_TOK_NEVER && json_reads(e, g, v))
                allowed++;
            else
                lg[v] = -INFINITY;
        }
    } else {
        uint8_t next[256], next_ws[256];
        json_next_bytes(g, next);
        const int between = json_gram_between(g);
        int room = 0; /* whitespace bytes that may come in a row */
        if (between) {
            struct json_gram t = *g;
            while (room < 256 && json_gram_feed(&t, " ", 1))
                room++;
            t = *g;
            if (room > 0 && json_gram_feed(&t, " ", 1))
                json_next_bytes(&t, next_ws);
        }
        for (int b = 0; b < 257; b++) {
            const int32_t *ids = e->json_ids + e->json_first[b];
            const int64_t n = e->json_first[b + 1] - e->json_first[b];
            if (b == 256 || !next[b]) { /* JSON_TOK_NEVER, or a first byte that cannot come */
                for (int64_t k = 0; k < n; k++)
                    lg[ids[k]] = -INFINITY;
                continue;
            }
            for (int64_t k = 0; k < n; k++) {
                const struct json_tok *j = &e->json_tok[ids[k]];
                int ok = !(between && j->lead > 0) ||
                         (j->lead <= room && ((j->kind & JSON_TOK_SPACE) || next_ws[j->after]));
                if (ok && json_reads(e, g, ids[k]))
                    allowed++;
                else
                    lg[ids[k]] = -INFINITY;
            }
        }
    }
    if (allowed == 0) {
        for (int64_t i = 0; i < e->n_eog; i++)
            lg[e->eog_ids[i]] = 0;
        if (e->n_eog == 0)
            lg[0] = 0;
    }
}

/* Picks the next token of s from its logits row into ev: the log-probs the
 * request asked for (of the row as the model gave it: scratch keeps a copy,
 * V floats, before the penalties change the row), then the sampler. Runs on
 * any of the backend's threads: it touches only s's sampler, its row, ev and
 * scratch. */
static void pick_token(const struct engine *e, struct seq *s, float *lg, float *scratch,
                       struct engine_event *ev)
{
    const int64_t V = e->info.n_vocab;
    const int lp = s->req.logprobs || s->req.top_logprobs > 0;
    memset(ev, 0, sizeof *ev);
    ev->id = s->id;
    ev->choice = s->choice;
    ev->kind = ENGINE_EV_TOKEN;
    float lse = 0;
    if (lp || s->req.score) {
        lse = (float)sampler_logsumexp(lg, V);
        memcpy(scratch, lg, (size_t)V * sizeof(float));
        if (s->req.top_logprobs > 0)
            top_logprobs(lg, V, s->req.top_logprobs, lse, ev);
    }
    for (int i = 0; i < s->req.n_bias; i++) /* after the logprobs: they are the model's */
        lg[s->req.bias_id[i]] += s->req.bias[i];
    if (s->n_gen < s->req.min_tokens) /* the answer may not end yet */
        for (int64_t i = 0; i < e->n_eog; i++)
            lg[e->eog_ids[i]] = -INFINITY;
    if (s->req.json_object)
        json_mask(e, s, lg);
    ev->token = sampler_sample(&s->smp, lg, NULL);
    sampler_accept(&s->smp, ev->token);
    ev->has_lp = lp;
    ev->lp_token = ev->token;
    if (lp)
        ev->logprob = scratch[ev->token] - lse;
    if (s->req.score)
        s->lp_sum += (double)(scratch[ev->token] - lse);
}

/* Part i of n of a step's picks: rows i, i + n, ..., each with its
 * sequence's scratch row. */
static void pick_task(void *arg, int i, int n)
{
    struct engine *e = arg;
    for (int k = i; k < e->n_pick; k += n) {
        struct seq *s = e->pick_seq[k];
        float *scratch = e->scratch + (size_t)(s - e->seqs) * (size_t)e->info.n_vocab;
        pick_token(e, s, e->pick_logits[k], scratch, &e->picked[k]);
    }
}

/* ---- echo: the prompt's tokens, with their log-probs -------------------- */

/* A request that echoes its prompt with log-probs needs every prompt row,
 * and each row's log-sum-exp and alternatives over the vocabulary: about
 * 0.5 ms a row on one CPU thread for SmolLM2's 49,152 tokens, on the engine
 * thread alone where the backend has no CPU threads (CUDA). So that the
 * other streams' steps are not held up by more than about 16 ms of it, such
 * a sequence prefills at most ECHO_LP_CHUNK tokens a step. */
#define ECHO_LP_CHUNK 32
static int echo_lp(const struct seq *s)
{
    return s->echo_from >= 0 && (s->req.logprobs || s->req.top_logprobs > 0);
}

/* Plans the echo of what a prefill chunk at prompt[from, from + n) tells:
 * row j (rows: n logits rows, or NULL without log-probs) is the model's
 * guess at the token after from + j, so tokens from + 1 .. from + n of the
 * prompt are echoed now, and the first token (no row tells it) before
 * them; the chunk's first token was echoed with the chunk before. */
static void echo_plan(struct engine *e, struct seq *s, int64_t from, int64_t n, const float *rows)
{
    const int64_t V = e->info.n_vocab;
    for (int64_t at = from == 0 ? 0 : from + 1; at <= from + n && at < s->n_prompt; at++) {
        if (at < s->echo_from)
            continue;
        const float *row = rows && at > 0 ? rows + (at - 1 - from) * V : NULL;
        e->echo[e->n_echo++] = (struct echo_job){s, at, row};
    }
}

/* Part i of n of a step's echoed tokens: their events, with log-probs. */
static void echo_task(void *arg, int i, int n)
{
    struct engine *e = arg;
    const int64_t V = e->info.n_vocab;
    for (int64_t k = i; k < e->n_echo; k += n) {
        const struct echo_job *j = &e->echo[k];
        struct engine_event *ev = &e->echoed[k];
        memset(ev, 0, sizeof *ev);
        ev->id = j->s->id;
        ev->choice = j->s->choice;
        ev->kind = ENGINE_EV_TOKEN;
        ev->token = -1; /* not a generated token */
        ev->lp_token = j->s->prompt[j->at];
        ev->has_lp = echo_lp(j->s);
        if (!ev->has_lp)
            continue;
        if (!j->row) {
            ev->lp_null = 1;
            continue;
        }
        float lse = (float)sampler_logsumexp(j->row, V);
        ev->logprob = j->row[ev->lp_token] - lse;
        if (j->s->req.top_logprobs > 0)
            top_logprobs(j->row, V, j->s->req.top_logprobs, lse, ev);
    }
}

/* The echoed tokens' events, in order, each with the text it completes,
 * through the answer's own decoder: a character the prompt's last tokens
 * leave partial is the answer's to complete (or any end's to flush), so
 * the echoed prompt and the answer read as the decoding of all their
 * tokens together, less the space a SentencePiece tokenizer put in front
 * of a text prompt. */
static void echo_emit(struct engine *e)
{
    for (int64_t k = 0; k < e->n_echo; k++) {
        struct seq *s = e->echo[k].s;
        struct engine_event *ev = &e->echoed[k];
        int64_t w = tok_stream_push(e->dec.tok, &s->ts, ev->lp_token, e->piece, e->piece_cap);
        const char *text = e->piece;
        /* read before the space prefix comes off: a text that starts with
         * an earlier token's U+FFFD has none */
        const size_t earlier = w > 0 ? (size_t)s->ts.n_earlier : 0;
        if (w > 0 && s->echo_strip) { /* the text's first byte: the space prefix */
            s->echo_strip = 0;
            text += text[0] == ' ';
            w -= text != e->piece;
        }
        emit_token_text(e, ev, text, w > 0 ? (size_t)w : 0, earlier);
    }
}

/* Emits the token picked for s (ev) and finishes the request when it is
 * done. */
static void after_pick(struct engine *e, struct seq *s, struct engine_event *ev)
{
    const int32_t tok = ev->token;
    s->n_gen++;
    s->next_tok = tok;
    s->has_next = 1; /* fed next step, or kept for the session */
    e->stats.gen_tokens_total++;

    if (!s->req.ignore_eos && tok_is_eog(e->dec.tok, tok)) {
        gen_mark(s, tok, s->fed, 0);
        seq_finish(e, s, ENGINE_FINISH_STOP, 1);
        return;
    }
    /* a hidden control token is a token of no text */
    const int hidden = !s->req.show_special && tok_is_control(e->dec.tok, tok);
    int64_t w = hidden ? 0 : tok_stream_push(e->dec.tok, &s->ts, tok, e->piece, e->piece_cap);
    size_t out_len = 0;
    int stopped = 0;
    if (w > 0)
        stopped = stop_filter_push(&s->stop, e->piece, (size_t)w, e->text_out,
                                   e->piece_cap + STOP_HOLD_MAX, &out_len);
    /* the token's own text starts after the U+FFFD, if any, that ends the
     * text of the tokens before it */
    const int64_t earlier = w > 0 ? s->ts.n_earlier : 0;
    const int64_t start = s->fed + earlier;
    s->fed += w > 0 ? w : 0;
    s->passed += (int64_t)out_len;
    gen_mark(s, tok, start, hidden);
    if (s->held) {
        held_add(e, s, ev, start, hidden);
        /* a token of no text yet (a part of a character) waits for its
         * text: a stop string may start with it */
        held_send(e, s, ev, e->text_out, out_len, stopped == 1 ? HELD_CUT : HELD_STARTED);
    } else {
        /* always one event per token (two after an earlier token's U+FFFD),
         * maybe of empty text; the filter passes the text as it came only
         * when it has no stop strings */
        emit_token_text(e, ev, e->text_out, out_len, s->stop.n_stop == 0 ? (size_t)earlier : 0);
    }
    if (stopped == 1) {
        seq_finish(e, s, ENGINE_FINISH_STOP, 0);
        return;
    }
    if (s->req.json_object) {
        /* the answer's object closed with this token (or the grammar had
         * no token to go on with, and json_mask let one it refuses through:
         * a token it never allows, or one whose text it does not take) */
        size_t len = 0;
        const char *p = tok_piece(e->dec.tok, tok, &len);
        if (!p || e->json_tok[tok].kind == JSON_TOK_NEVER || !json_gram_feed(&s->json, p, len) ||
            json_gram_done(&s->json)) {
            seq_finish(e, s, ENGINE_FINISH_STOP, 1);
            return;
        }
    }
    /* past min_tokens, stop strings count from the next whole character */
    if (s->req.min_tokens > 0 && s->n_gen >= s->req.min_tokens && s->stop.n_stop == 0 &&
        s->req.stop[0] && s->ts.n_pend == 0)
        stop_filter_init(&s->stop, (const char *const *)s->req.stop, ENGINE_MAX_STOP);
    if (s->req.max_tokens >= 0 && s->n_gen >= s->req.max_tokens) {
        seq_finish(e, s, ENGINE_FINISH_LENGTH, 1);
        return;
    }
    if (kv_seq_can_append(&s->kv, &e->dec.fwd.pool.geo, 1) < 0) { /* dense window full */
        seq_finish(e, s, ENGINE_FINISH_LENGTH, 1);
        return;
    }
}

/* Ends every running request with an ERROR, once for all of its choices. */
static void fail_all_running(struct engine *e, const char *msg)
{
    for (int64_t i = 0; i < e->cfg.max_seqs; i++) {
        struct seq *s = &e->seqs[i];
        if (s->state == SEQ_RUNNING) {
            const uint64_t id = s->id;
            emit_error(e, id, 500, NULL, NULL, msg);
            queue_request_done(&e->q, queue_places(&s->req));
            for (int64_t j = i; j < e->cfg.max_seqs; j++) {
                struct seq *o = &e->seqs[j];
                if (o->state == SEQ_RUNNING && o->id == id) {
                    o->session[0] = 0;
                    engine__seq_release(e, o);
                }
            }
        }
    }
}

/* ---- a request's choices share its prompt ------------------------------ */

/* 1 while s, a later choice, waits for the first choice of its prompt to
 * prefill it; once that choice is gone or past its prompt without having
 * shared it (which the scheduler does not do), s prefills it itself. */
static int waits_for_lead(struct seq *s, struct seq *seqs)
{
    if (s->lead < 0)
        return 0;
    const struct seq *l = &seqs[s->lead];
    const int32_t first = s->choice - s->choice % (s->req.n_choices > 1 ? s->req.n_choices : 1);
    if (l->state == SEQ_RUNNING && l->id == s->id && l->choice == first && l->n_fed < l->n_prompt)
        return 1;
    s->lead = -1;
    return 0;
}

/* The KV cells of a prompt one choice prefilled, in host memory as a
 * snapshot holds them (bit for bit: every cell the next query can see),
 * for the request's other choices. */
struct shared_prompt {
    struct snapshot_meta m;
    uint8_t *k, *v;
};

/* Copies lead's cells out into sp. 0, or -1 (nothing to free). */
static int share_export(struct engine *e, const struct seq *lead, struct shared_prompt *sp)
{
    const struct kv_geometry *g = &e->dec.fwd.pool.geo;
    struct snapshot_meta *m = &sp->m;
    memset(sp, 0, sizeof *sp);
    session_cells_meta(g, &lead->kv, m);
    const size_t bytes = snapshot_kv_bytes(m);
    sp->k = malloc(bytes ? bytes : 1);
    sp->v = malloc(bytes ? bytes : 1);
    if (sp->k && sp->v &&
        session_copy_cells(&e->dec.backend, g, &lead->kv, m, sp->k, sp->v, 0) == 0)
        return 0;
    free(sp->k);
    free(sp->v);
    return -1;
}

/* Gives sib the prompt lead prefilled (sp: its cells) and lead's place in
 * the stream; both were admitted with the same prompt and policy. 0, or -1
 * (sib then prefills the prompt itself, writing its cells again). */
static int share_import(struct engine *e, const struct seq *lead, struct seq *sib,
                        const struct shared_prompt *sp)
{
    struct kv_seq kv = lead->kv;
    kv.slot = sib->kv.slot;
    if (session_copy_cells(&e->dec.backend, &e->dec.fwd.pool.geo, &kv, &sp->m, sp->k, sp->v, 1) < 0)
        return -1;
    sib->kv = kv;
    sib->n_fed = sib->n_prompt;
    prefix_share(e, lead, sib);
    return 0;
}

/* lead, the first choice of a prompt, has just prefilled it, whose
 * last logits row is row: each later choice waiting for it takes the
 * prompt (its cells exported once, imported into each) and a copy of the
 * row, and is picked in this step after lead. */
static void share_with_choices(struct engine *e, struct seq *lead, const float *row)
{
    const int64_t V = e->info.n_vocab;
    struct shared_prompt sp;
    int have = 0; /* 1: sp holds the cells; -1: they could not be had */
    for (int64_t i = 0; i < e->cfg.max_seqs; i++) {
        struct seq *o = &e->seqs[i];
        if (o->state != SEQ_RUNNING || o->lead != lead - e->seqs || o->id != lead->id)
            continue;
        o->lead = -1; /* from here on a sequence of its own, or it prefills */
        if (!e->share_rows)
            e->share_rows = malloc((size_t)e->cfg.max_seqs * (size_t)V * sizeof(float));
        if (have == 0)
            have = share_export(e, lead, &sp) == 0 ? 1 : -1;
        if (!e->share_rows || have < 0 || share_import(e, lead, o, &sp) < 0)
            continue;
        float *mine = e->share_rows + (size_t)i * (size_t)V;
        memcpy(mine, row, (size_t)V * sizeof(float));
        e->pick_seq[e->n_pick] = o;
        e->pick_logits[e->n_pick++] = mine;
    }
    if (have > 0) {
        free(sp.k);
        free(sp.v);
    }
}

/* Runs one batched step. Returns 1 if it ran, 0 if nothing was runnable. */
static int step(struct engine *e)
{
    int n_in = 0;
    int64_t budget = e->cfg.max_step_tokens;
    /* decode tokens first: running streams never wait behind a prefill */
    for (int64_t i = 0; i < e->cfg.max_seqs && budget > 0; i++) {
        struct seq *s = &e->seqs[i];
        if (s->state != SEQ_RUNNING || s->paused || !s->has_next || s->n_fed < s->n_prompt)
            continue; /* (a choice waiting for its prompt is not past it) */
        e->inputs[n_in] = (struct fwd_input){&s->kv, &s->next_tok, 1, FWD_LOGITS_LAST};
        e->evicted_before[n_in] = s->kv.n_evicted_max;
        e->input_seq[n_in++] = (int)i;
        budget--;
    }
    /* then prompts, the earliest admitted first: slots are reused lowest
     * first, so in slot order a prompt admitted later could take the budget
     * of every step from one admitted before it, for as long as a client
     * kept sending long ones */
    int n_pre = 0;
    for (int64_t i = 0; i < e->cfg.max_seqs; i++) {
        struct seq *s = &e->seqs[i];
        if (s->state != SEQ_RUNNING || s->paused || s->n_fed >= s->n_prompt ||
            waits_for_lead(s, e->seqs))
            continue;
        int k = n_pre++;
        for (; k > 0 && e->seqs[e->prefill_order[k - 1]].admitted > s->admitted; k--)
            e->prefill_order[k] = e->prefill_order[k - 1];
        e->prefill_order[k] = (int)i;
    }
    for (int p = 0; p < n_pre && budget > 0; p++) {
        const int64_t i = e->prefill_order[p];
        struct seq *s = &e->seqs[i];
        int64_t n = s->n_prompt - s->n_fed;
        if (n > e->cfg.chunk)
            n = e->cfg.chunk;
        if (n > budget)
            n = budget;
        if (echo_lp(s) && n > ECHO_LP_CHUNK)
            n = ECHO_LP_CHUNK;
        int last = s->n_fed + n == s->n_prompt;
        enum fwd_logits lg = last && s->req.max_tokens != 0 && !s->cancel_after_prompt
                                 ? FWD_LOGITS_LAST
                                 : FWD_LOGITS_NONE;
        if (echo_lp(s)) /* each row gives the next prompt token's log-probs */
            lg = FWD_LOGITS_ALL;
        e->inputs[n_in] = (struct fwd_input){&s->kv, s->prompt + s->n_fed, n, lg};
        e->evicted_before[n_in] = s->kv.n_evicted_max;
        e->input_seq[n_in++] = (int)i;
        budget -= n;
    }
    if (n_in == 0)
        return 0;
    int64_t rows = decoder__step(&e->dec, e->inputs, n_in);
    if (rows < 0) {
        for (int k = 0; k < n_in; k++) /* what its cells hold is not known */
            prefix_forget(e, e->inputs[k].seq->slot);
        e->stats.healthy = rows != -EIO;
        fail_all_running(e, "the model step failed");
        return 1;
    }
    e->stats.steps_total++;
    int64_t row = 0;
    e->n_pick = 0;
    e->n_echo = 0;
    for (int k = 0; k < n_in; k++) {
        struct seq *s = &e->seqs[e->input_seq[k]];
        struct fwd_input *in = &e->inputs[k];
        const int prefill = in->tokens != &s->next_tok;
        const int64_t from = s->n_fed;
        /* a position that left the window, came back (a give-back) and left
         * again is counted once */
        const int64_t evicted = s->kv.n_evicted_max - e->evicted_before[k];
        e->stats.evicted_tokens_total += evicted;
        if (s->kv.policy.kind == KV_POLICY_SINKS)
            e->stats.evicted_sinks_total[s->kv.policy.n_sinks] += evicted;
        else
            e->stats.evicted_window_total += evicted; /* (dense evicts none) */
        if (prefill) {
            s->n_fed += in->n;
            e->stats.prompt_tokens_total += in->n;
        } else {
            s->has_next = 0;
        }
        prefix_record(e, s, in->tokens, in->n);
        const int64_t n_rows = in->logits == FWD_LOGITS_ALL    ? in->n
                               : in->logits == FWD_LOGITS_LAST ? 1
                                                               : 0;
        const float *first_row = e->dec.fwd.logits + row * e->info.n_vocab;
        row += n_rows;
        if (s->state != SEQ_RUNNING)
            continue;
        if (prefill && s->echo_from >= 0)
            echo_plan(e, s, from, in->n, in->logits == FWD_LOGITS_ALL ? first_row : NULL);
        /* a decode row, or a prompt's last row unless max_tokens is 0 (a
         * cancelled turn's prompt asked for none: cancel_after_prompt) */
        if (n_rows > 0 && (!prefill || s->n_fed == s->n_prompt) && s->req.max_tokens != 0) {
            float *last = e->dec.fwd.logits + (row - 1) * e->info.n_vocab; /* its last row */
            e->pick_seq[e->n_pick] = s;
            e->pick_logits[e->n_pick++] = last;
            if (prefill && s->req.n_choices > 1 && s->choice % s->req.n_choices == 0)
                share_with_choices(e, s, last);
        }
    }
    /* the echoed prompt tokens' log-probs, then their events: before the
     * answer's first token */
    decoder__run_parts(&e->dec, echo_task, e, (int)e->n_echo);
    echo_emit(e);
    for (int k = 0; k < n_in; k++) { /* max_tokens 0, or a cancel: the prompt alone */
        struct seq *s = &e->seqs[e->input_seq[k]];
        if (s->state == SEQ_RUNNING && e->inputs[k].tokens != &s->next_tok &&
            s->n_fed == s->n_prompt && (s->req.max_tokens == 0 || s->cancel_after_prompt))
            seq_finish(e, s,
                       s->cancel_after_prompt ? ENGINE_FINISH_CANCELLED : ENGINE_FINISH_LENGTH, 1);
    }
    /* sampling is per sequence: the streams' picks run on the backend's
     * threads, one part each (claimed, so uneven picks balance), then their
     * events go out in order on this one */
    decoder__run_parts(&e->dec, pick_task, e, e->n_pick);
    for (int k = 0; k < e->n_pick; k++)
        after_pick(e, e->pick_seq[k], &e->picked[k]);
    return 1;
}

void engine__log(const struct engine *e, enum engine_log_level level, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (e->cfg.log)
        e->cfg.log(level, msg, e->cfg.log_arg);
    else
        fprintf(stderr, "streamsink: %s\n", msg);
}

_Static_assert(ENGINE_MAX_SINKS == KV_MAX_SINKS, "the facade's bound on sinks is the cache's");

static void publish_stats(struct engine *e)
{
    struct engine_stats *st = &e->stats;
    st->active_seqs = st->paused_seqs = st->sessions = 0;
    for (int64_t i = 0; i < e->cfg.max_seqs; i++) {
        struct seq *s = &e->seqs[i];
        if (s->state == SEQ_RUNNING) {
            st->active_seqs++;
            st->paused_seqs += s->paused;
        }
        if (s->state != SEQ_FREE && s->session[0])
            st->sessions++;
    }
    st->queued = e->n_waiting;
    st->slots_total = e->cfg.max_seqs;
    st->slots_free = e->dec.fwd.pool.n_free;
    queue_set_stats(&e->q, st);
}

/* ---- thread and lifecycle ----------------------------------------------- */

/* Wakes the loop thread if events were queued since it was last woken. */
static void wake_loop(struct engine *e)
{
    if (e->pushed) {
        e->pushed = 0;
        e->wake(e->wake_arg);
    }
}

static void *engine_main(void *arg)
{
    struct engine *e = arg;
    int rc = engine__load(e);
    if (rc == 0)
        rc = session_dir_open(e, e->start_err, sizeof e->start_err);
    if (rc == 0)
        publish_stats(e); /* before the server may answer /health and /metrics */
    pthread_mutex_lock(&e->start_mu);
    e->started = 1;
    e->start_rc = rc;
    pthread_cond_signal(&e->start_cv);
    pthread_mutex_unlock(&e->start_mu);
    if (rc < 0)
        return NULL;

    double last_expire = now_s();
    while (!queue_closed(&e->q)) {
        int busy = 0;
        for (int64_t i = 0; i < e->cfg.max_seqs; i++)
            busy |= e->seqs[i].state == SEQ_RUNNING && !e->seqs[i].paused;
        handle_commands(e, busy ? 0 : 1000);
        session_saves_poll(e);
        admit_waiting(e);
        /* room for a step's events; what is queued must reach the loop
         * first, or it waits for a wake that only this thread would send
         * (admissions alone can queue enough: a listing is an event per
         * session) */
        wake_loop(e);
        queue_wait_room(&e->q, (size_t)(3 * e->cfg.max_seqs + 4));
        step(e);
        publish_stats(e);
        if (now_s() - last_expire > 1.0) { /* under load too */
            session_expire(e, now_s(), (double)e->cfg.session_idle_s);
            last_expire = now_s();
        }
        if (e->retiring && now_s() >= e->retire_after && session_expire(e, now_s(), 0) > 0)
            e->retire_after = now_s() + 1.0; /* a save failed: not again at once */
        wake_loop(e);                        /* before the next wait for commands */
    }
    /* closing: everything still running or waiting is cancelled */
    for (int64_t i = 0; i < e->cfg.max_seqs; i++) {
        if (e->seqs[i].state == SEQ_RUNNING)
            seq_finish(e, &e->seqs[i], ENGINE_FINISH_CANCELLED, 0);
    }
    for (int64_t i = 0; i < e->n_waiting; i++)
        engine_request_free(&e->waiting[i].req);
    e->n_waiting = 0;
    session_save_all(e); /* sessions outlive the process when there is a directory */
    e->wake(e->wake_arg);
    return NULL;
}

static void engine_free(struct engine *e)
{
    if (e->seqs) {
        for (int64_t i = 0; i < e->cfg.max_seqs; i++)
            seq_clear_request(&e->seqs[i]);
    }
    session_dir_close(e);
    free(e->seqs);
    free(e->waiting);
    free(e->inputs);
    free(e->input_seq);
    free(e->prefill_order);
    free(e->evicted_before);
    free(e->scratch);
    free(e->share_rows);
    prefix_free(e);
    free(e->eog_ids);
    free(e->json_tok);
    free(e->json_ids);
    free(e->json_rest);
    free(e->picked);
    free(e->echo);
    free(e->echoed);
    free(e->pick_seq);
    free(e->pick_logits);
    free(e->piece);
    free(e->text_out);
    free((void *)e->info.chat_template);
    decoder__free(&e->dec);
    if (e->q.impl)
        queue_free(&e->q);
    pthread_mutex_destroy(&e->start_mu);
    pthread_cond_destroy(&e->start_cv);
    free(e);
}

int engine_start(struct engine **out, const struct engine_config *cfg, void (*wake)(void *arg),
                 void *wake_arg, char *err, size_t err_len)
{
    *out = NULL;
    if (!cfg->model_path || cfg->max_seqs <= 0 || cfg->max_queue < 0 || cfg->chunk <= 0 ||
        cfg->max_step_tokens < cfg->max_seqs || cfg->n_threads <= 0 || cfg->max_sinks < 0 ||
        cfg->max_sinks > KV_MAX_SINKS) {
        snprintf(err, err_len, "engine: invalid configuration");
        return -EINVAL;
    }
    struct engine *e = calloc(1, sizeof *e);
    if (!e) {
        snprintf(err, err_len, "engine: out of memory");
        return -ENOMEM;
    }
    e->cfg = *cfg;
    e->dir_fd = -1;
    if (e->cfg.chunk > e->cfg.max_step_tokens)
        e->cfg.chunk = e->cfg.max_step_tokens;
    e->wake = wake;
    e->wake_arg = wake_arg;
    pthread_mutex_init(&e->start_mu, NULL);
    pthread_cond_init(&e->start_cv, NULL);
    size_t inflight = (size_t)(cfg->max_seqs + cfg->max_queue);
    int rc = queue_init(&e->q, inflight, 8 * inflight + 4096, 4 * (size_t)cfg->max_seqs + 64);
    if (rc < 0) {
        snprintf(err, err_len, "engine: out of memory");
        engine_free(e);
        return rc;
    }
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        snprintf(err, err_len, "engine: cannot start its thread");
        engine_free(e);
        return -EAGAIN;
    }
    pthread_mutex_lock(&e->start_mu);
    while (!e->started)
        pthread_cond_wait(&e->start_cv, &e->start_mu);
    pthread_mutex_unlock(&e->start_mu);
    if (e->start_rc < 0) {
        rc = e->start_rc;
        snprintf(err, err_len, "%s", e->start_err);
        pthread_join(e->thread, NULL);
        engine_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

int engine_submit(struct engine *e, struct engine_request *req)
{
    return queue_submit(&e->q, req);
}

void engine_cancel(struct engine *e, uint64_t id)
{
    queue_control(&e->q, QUEUE_CMD_CANCEL, id);
}

void engine_retire_sessions(struct engine *e)
{
    queue_control(&e->q, QUEUE_CMD_RETIRE, 0);
}

void engine_pause(struct engine *e, uint64_t id)
{
    queue_control(&e->q, QUEUE_CMD_PAUSE, id);
}

void engine_resume(struct engine *e, uint64_t id)
{
    queue_control(&e->q, QUEUE_CMD_RESUME, id);
}

size_t engine_drain(struct engine *e, struct engine_event *ev, size_t max)
{
    return queue_drain(&e->q, ev, max);
}

int64_t engine_tokenize(const struct engine *e, const char *text, size_t len, int parse_special,
                        int32_t **out)
{
    *out = NULL;
    if (!e || !e->dec.tok)
        return -EINVAL;
    return encode(e->dec.tok, text, len, 0, parse_special, -1, out); /* *out has room for >= 1 */
}

int64_t engine_tokenize_max(const struct engine *e, const char *text, size_t len, int parse_special,
                            int64_t max_tokens, int32_t **out)
{
    *out = NULL;
    if (!e || !e->dec.tok || max_tokens < 0)
        return -EINVAL;
    return encode(e->dec.tok, text, len, 0, parse_special, max_tokens, out);
}

size_t engine_token_text(const struct engine *e, int32_t id, char *buf, size_t cap)
{
    size_t len = 0;
    const char *p = tok_piece(e->dec.tok, id, &len);
    if (!p || cap == 0)
        return 0;
    if (len > cap - 1)
        len = cap - 1;
    memcpy(buf, p, len);
    buf[len] = 0;
    return len;
}

const char *engine_token_piece(const struct engine *e, int32_t id, size_t *len)
{
    *len = 0;
    return tok_piece(e->dec.tok, id, len);
}

void engine_get_stats(const struct engine *e, struct engine_stats *out)
{
    queue_get_stats((struct queue *)&e->q, out);
}

void engine_stop(struct engine *e)
{
    if (!e)
        return;
    queue_close(&e->q);
    pthread_join(e->thread, NULL);
    engine_free(e);
}
