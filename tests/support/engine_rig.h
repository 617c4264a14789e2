/*
 * engine_rig.h: a running engine for the test_engine_*.c tests: start
 * it on a model file, submit requests, collect each request's events (token
 * ids, text, finish, usage or error with its param and code) until it ends.
 * Several requests may run side by side (rig_wait_all). Also same_as_text:
 * the text path against engine_tokenize + the ids path. The engine's wake-up
 * is a condition variable here, where the server has its libuv async.
 */
#ifndef SS_TESTS_SUPPORT_ENGINE_RIG_H
#define SS_TESTS_SUPPORT_ENGINE_RIG_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"

/* the small softmax fixture model (SS_FIXTURES_DIR is the test targets' own) */
#define RIG_FIXTURE SS_FIXTURES_DIR "/norm_softmax.gguf"
#define RIG_MAX_GEN 512
#define RIG_TEXT_CAP 16384

/* ---- a running engine ------------------------------------------------------ */

struct rig {
    struct engine *e;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int woken;
    uint64_t next_id;
};

struct engine_config rig_config(const char *path);

/* Returns 0, or -1 with the reason printed. */
int rig_open(struct rig *r, const struct engine_config *c);

void rig_close(struct rig *r);

struct rig_result {
    int error, status;
    char param[32], code[32], message[160];
    int32_t toks[RIG_MAX_GEN]; /* the tokens generated */
    int n_tok;
    /* the log-probs sent, where the request asked: their tokens (as toks,
     * less a stop string's), where in text each one's text starts, its
     * log-prob (NaN for an echoed first token's null) and its first
     * alternative (top_logprobs >= 1) */
    int32_t lp_tok[RIG_MAX_GEN];
    size_t lp_at[RIG_MAX_GEN];
    float logprob[RIG_MAX_GEN];
    int32_t top_id[RIG_MAX_GEN];
    int n_lp;
    char text[RIG_TEXT_CAP];
    size_t n_text;
    enum engine_finish finish;
    int64_t prompt_tokens, completion_tokens;
    double lp_sum;         /* the DONE's (a request with score) */
    int64_t cached_tokens; /* the DONE's: prompt tokens a free slot held */
    int64_t tokens_seen;   /* the session's, after the request (0: none) */
    int ended;             /* DONE or ERROR events it had */
};

/* Waits (at most ~10 minutes) for the events of requests ids[0..n) until
 * they all end; other requests' events are dropped. */
int rig_wait_all(struct rig *r, const uint64_t *ids, struct rig_result **outs, int n_req);

int rig_wait(struct rig *r, uint64_t id, struct rig_result *out);

/* Waits for the events of request id, of n_choices choices: choice i's in
 * outs[i] (an ERROR in outs[0]), until the DONE with choices_left 0 or an
 * ERROR. Returns -1 (saying why) if it does not end in time, or if its
 * events break the contract: no choice has an event after its DONE,
 * choices_left goes down at each DONE, nothing comes after the end. */
int rig_wait_choices(struct rig *r, uint64_t id, struct rig_result **outs, int n_choices);

/* A greedy request with nothing in it yet. */
struct engine_request rig_greedy(struct rig *r, int64_t max_tokens);

void rig_set_text(struct engine_request *q, const char *text, int add_bos, int parse_special);

void rig_set_ids(struct engine_request *q, const int32_t *ids, int64_t n, int add_bos);

/* Submits q (ownership moves) and collects its result. */
int rig_run(struct rig *r, struct engine_request *q, struct rig_result *out);

/* The engine on the real SmolLM2 file, started once per test binary (its
 * start runs the sink probe, slow under sanitizers); the binary's last test
 * closes it. Exits 77 (skip) when the file is absent; NULL if it does not
 * start. */
struct rig *rig_smol(void);

/* Runs each of texts[0..n) (parse_special special[i]) through the text
 * path and through engine_tokenize + the ids path, all side by side; each
 * pair must give the same prompt token count and generated tokens. With a
 * session (n == 1), the pair runs in sessions "<session>-text" and
 * "<session>-ids". */
int rig_same_as_text(struct rig *rig, const char *const *texts, const int *special, int n,
                     int add_bos, int64_t max_tokens, const char *session);

#endif
