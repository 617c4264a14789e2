/* engine_rig.c: a running engine for the engine tests (engine_rig.h). */
#include "support/engine_rig.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "support/model_file.h"

static void rig_wake(void *arg)
{
    struct rig *r = arg;
    pthread_mutex_lock(&r->mu);
    r->woken = 1;
    pthread_cond_signal(&r->cv);
    pthread_mutex_unlock(&r->mu);
}

struct engine_config rig_config(const char *path)
{
    struct engine_config c = engine_default_config();
    c.model_path = path;
    c.n_threads = 2;
    c.max_seqs = 12; /* requests of a test run side by side */
    c.max_queue = 4;
    c.window = 512;
    c.chunk = 128;
    c.max_step_tokens = 256;
    return c;
}

int rig_open(struct rig *r, const struct engine_config *c)
{
    char err[256];
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->next_id = 1;
    if (engine_start(&r->e, c, rig_wake, r, err, sizeof err) < 0) {
        fprintf(stderr, "  engine_start(%s): %s\n", c->model_path, err);
        return -1;
    }
    return 0;
}

void rig_close(struct rig *r)
{
    engine_stop(r->e);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
}

/* Adds event v to out. Returns 1 when it ends out's request (or choice). */
static int record(struct rig_result *out, const struct engine_event *v)
{
    if (v->kind == ENGINE_EV_TOKEN) {
        if (v->token >= 0 && out->n_tok < RIG_MAX_GEN)
            out->toks[out->n_tok++] = v->token;
        if (v->has_lp && out->n_lp < RIG_MAX_GEN) {
            out->lp_tok[out->n_lp] = v->lp_token;
            out->lp_at[out->n_lp] = out->n_text;
            out->logprob[out->n_lp] = v->lp_null ? NAN : v->logprob;
            out->top_id[out->n_lp++] = v->n_top > 0 ? v->top_id[0] : -1;
        }
        if (out->n_text + v->text_len < RIG_TEXT_CAP) {
            memcpy(out->text + out->n_text, v->text, v->text_len);
            out->n_text += v->text_len;
        }
        return 0;
    }
    if (v->kind == ENGINE_EV_DONE) {
        out->finish = v->finish;
        out->prompt_tokens = v->prompt_tokens;
        out->completion_tokens = v->completion_tokens;
        out->lp_sum = v->lp_sum;
        out->cached_tokens = v->cached_tokens;
        out->tokens_seen = v->session.tokens_seen;
        out->ended++;
        return 1;
    }
    if (v->kind == ENGINE_EV_ERROR) {
        out->error = 1;
        out->status = v->status;
        memcpy(out->param, v->param, sizeof out->param);
        memcpy(out->code, v->code, sizeof out->code);
        memcpy(out->message, v->message, sizeof out->message);
        out->ended++;
        return 1;
    }
    return 0;
}

/* Sleeps until the engine wakes the rig, or 10 ms. */
static void nap(struct rig *r)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 10 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000;
    }
    pthread_mutex_lock(&r->mu);
    if (!r->woken)
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    r->woken = 0;
    pthread_mutex_unlock(&r->mu);
}

int rig_wait_all(struct rig *r, const uint64_t *ids, struct rig_result **outs, int n_req)
{
    struct engine_event ev[32];
    int left = n_req;
    for (int k = 0; k < n_req; k++)
        memset(outs[k], 0, sizeof *outs[k]);
    for (int spins = 0; spins < 60000 && left > 0;) {
        size_t n = engine_drain(r->e, ev, 32);
        for (size_t i = 0; i < n; i++) {
            const struct engine_event *v = &ev[i];
            int k = 0;
            while (k < n_req && ids[k] != v->id)
                k++;
            if (k < n_req && record(outs[k], v))
                left--;
        }
        if (n > 0)
            continue;
        nap(r);
        spins++;
    }
    if (left == 0)
        return 0;
    fprintf(stderr, "  %d requests did not end in time\n", left);
    return -1;
}

int rig_wait_choices(struct rig *r, uint64_t id, struct rig_result **outs, int n_choices)
{
    struct engine_event ev[32];
    int over = 0, bad = 0;
    int32_t left_before = n_choices; /* choices running before the next DONE, at most */
    for (int k = 0; k < n_choices; k++)
        memset(outs[k], 0, sizeof *outs[k]);
    for (int spins = 0; spins < 60000 && !over;) {
        size_t n = engine_drain(r->e, ev, 32);
        for (size_t i = 0; i < n; i++) {
            const struct engine_event *v = &ev[i];
            if (v->id != id || v->kind == ENGINE_EV_SESSION)
                continue;
            if (over || v->choice < 0 || v->choice >= n_choices) {
                fprintf(stderr, "  an event after the request's end, or of choice %d\n",
                        (int)v->choice);
                bad = 1;
                continue;
            }
            if (v->kind == ENGINE_EV_ERROR) {
                record(outs[0], v);
                over = 1;
                continue;
            }
            if (outs[v->choice]->ended) {
                fprintf(stderr, "  an event of choice %d after its DONE\n", (int)v->choice);
                bad = 1;
            }
            if (!record(outs[v->choice], v))
                continue;
            if (v->choices_left < 0 || v->choices_left >= left_before) {
                fprintf(stderr, "  a DONE with choices_left %d after %d\n", (int)v->choices_left,
                        (int)left_before);
                bad = 1;
            }
            left_before = v->choices_left;
            over = v->choices_left == 0;
        }
        if (n > 0)
            continue;
        nap(r);
        spins++;
    }
    if (!over)
        fprintf(stderr, "  the request did not end in time\n");
    return over && !bad ? 0 : -1;
}

int rig_wait(struct rig *r, uint64_t id, struct rig_result *out)
{
    return rig_wait_all(r, &id, &out, 1);
}

struct engine_request rig_greedy(struct rig *r, int64_t max_tokens)
{
    struct engine_request q;
    memset(&q, 0, sizeof q);
    q.id = r->next_id++;
    q.max_tokens = max_tokens;
    q.sampling = engine_sampling_defaults();
    q.sampling.temperature = 0;
    return q;
}

void rig_set_text(struct engine_request *q, const char *text, int add_bos, int parse_special)
{
    q->prompt_len = strlen(text);
    q->prompt = malloc(q->prompt_len + 1);
    memcpy(q->prompt, text, q->prompt_len + 1);
    q->add_bos = add_bos;
    q->parse_special = parse_special;
}

void rig_set_ids(struct engine_request *q, const int32_t *ids, int64_t n, int add_bos)
{
    q->prompt_ids = malloc((size_t)(n > 0 ? n : 1) * sizeof *ids);
    if (n > 0)
        memcpy(q->prompt_ids, ids, (size_t)n * sizeof *ids);
    q->n_prompt_ids = n;
    q->add_bos = add_bos;
}

int rig_run(struct rig *r, struct engine_request *q, struct rig_result *out)
{
    uint64_t id = q->id;
    int rc = engine_submit(r->e, q);
    if (rc < 0) {
        engine_request_free(q);
        fprintf(stderr, "  engine_submit: %d\n", rc);
        return -1;
    }
    return rig_wait(r, id, out);
}

struct rig *rig_smol(void)
{
    static struct rig rig;
    static int state; /* 0: not tried, 1: running, -1: failed */
    if (state == 0) {
        if (access(test_model_path(), R_OK) != 0) {
            printf("SKIP: no SmolLM2 file at STREAMSINK_MODEL (scripts/fetch-model.sh)\n");
            exit(77); /* test.h's SKIP: the whole binary skips */
        }
        struct engine_config c = rig_config(test_model_path());
        state = rig_open(&rig, &c) == 0 ? 1 : -1;
    }
    return state == 1 ? &rig : NULL;
}

int rig_same_as_text(struct rig *rig, const char *const *texts, const int *special, int n,
                     int add_bos, int64_t max_tokens, const char *session)
{
    enum { MAX_PAIRS = 8 };
    struct rig_result *res[2 * MAX_PAIRS];
    uint64_t ids_of[2 * MAX_PAIRS];
    int ok = n <= MAX_PAIRS && (n == 1 || !session), made = 0;
    for (int i = 0; i < n && ok; i++) {
        int32_t *ids = NULL;
        int64_t m = engine_tokenize(rig->e, texts[i], strlen(texts[i]), special[i], &ids);
        if (m < 0) {
            fprintf(stderr, "  engine_tokenize: %lld\n", (long long)m);
            ok = 0;
            break;
        }
        for (int path = 0; path < 2; path++) {
            struct engine_request q = rig_greedy(rig, max_tokens);
            if (path == 0)
                rig_set_text(&q, texts[i], add_bos, special[i]);
            else
                rig_set_ids(&q, ids, m, add_bos);
            q.parse_special = special[i];
            if (session)
                snprintf(q.session_id, sizeof q.session_id, "%s-%s", session,
                         path ? "ids" : "text");
            res[made] = malloc(sizeof *res[made]);
            ids_of[made] = q.id;
            if (!res[made] || engine_submit(rig->e, &q) < 0) {
                engine_request_free(&q);
                free(res[made]);
                ok = 0;
                break;
            }
            made++;
        }
        free(ids);
    }
    if (made == 0 || rig_wait_all(rig, ids_of, res, made) < 0)
        ok = 0;
    for (int k = 0; ok && k + 1 < made; k += 2) {
        const struct rig_result *a = res[k], *b = res[k + 1];
        int same = !a->error && !b->error && a->prompt_tokens == b->prompt_tokens &&
                   a->n_tok == b->n_tok && a->n_tok > 0 &&
                   memcmp(a->toks, b->toks, (size_t)a->n_tok * sizeof(int32_t)) == 0;
        if (!same)
            fprintf(stderr,
                    "  \"%.40s\" (special %d): text path error %d, %lld prompt tokens, %d "
                    "generated; ids path error %d, %lld prompt tokens, %d generated\n",
                    texts[k / 2], special[k / 2], a->error, (long long)a->prompt_tokens, a->n_tok,
                    b->error, (long long)b->prompt_tokens, b->n_tok);
        ok = ok && same;
    }
    for (int k = 0; k < made; k++)
        free(res[k]);
    return ok;
}
