/*
 * engine_impl.h: what the engine thread's files share: struct engine (one per
 * engine_start, owned by its thread after start) and struct seq (one per KV
 * slot). Internal to engine/:
 *   engine.c       the scheduler: admit, step, emit, retire; the thread
 *   engine_load.c  the decoder (decoder_impl.h), the buffers; engine_model_info
 *   session.c      sessions: parked slots, LRU, idle expiry (session.h)
 */
#ifndef SS_ENGINE_IMPL_H
#define SS_ENGINE_IMPL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "backend.h"
#include "decoder_impl.h"
#include "engine.h"
#include "forward.h"
#include "json_gram.h"
#include "kvcache.h"
#include "model.h"
#include "queue.h"
#include "sampler.h"
#include "stop.h"
#include "tokenizer.h"

enum seq_state {
    SEQ_FREE = 0, /* slot unused */
    SEQ_RUNNING,  /* serving a request: prefilling or decoding */
    SEQ_IDLE,     /* a session between requests: keeps its KV */
    SEQ_TAKEN,    /* its slot is taken for a choice being admitted (admit_choices only) */
};

/* Where a generated token's text starts in the text fed to the stop filter. */
struct gen_mark {
    int64_t start;
    int32_t token;
    int hidden; /* a control token whose text is left out: it has none */
};
#define GEN_MARKS (STOP_HOLD_MAX + 8)

/* engine.json_tok: what json_mask knows of a token before reading it */
enum { JSON_TOK_NEVER = 1, JSON_TOK_TEXT = 2, JSON_TOK_SPACE = 4 };
struct json_tok {
    uint8_t kind;  /* JSON_TOK_NEVER (alone): a control, end-of-generation or empty token, or
                      an id past the tokenizer; else JSON_TOK_TEXT if it is plain string
                      text (json_gram_string_piece), JSON_TOK_SPACE if whitespace only */
    uint8_t first; /* its first byte */
    uint8_t lead;  /* its leading whitespace bytes (at most 255) */
    uint8_t after; /* the first byte after them */
};

struct echo_job {
    struct seq *s;
    int64_t at; /* index in s->prompt */
    const float *row;
};

struct seq {
    enum seq_state state;
    uint64_t id;    /* request id while RUNNING */
    int32_t choice; /* which of its choices (engine_request.n_choices) */
    /* a later choice waiting for the prompt: the index of the request's
     * first choice, which prefills it for all (share_prompt); else -1 */
    int64_t lead;
    struct engine_request req;
    struct kv_seq kv;
    int32_t *prompt; /* tokens still to feed: [pending session token] + prompt */
    int64_t n_prompt, n_fed;
    int32_t next_tok; /* sampled, emitted, not yet fed */
    int has_next;
    struct sampler smp;
    int has_smp;
    struct tok_stream ts;
    /* echo: the first prompt index to echo (past a BOS the engine added),
     * or -1 (the echoed prompt's text goes through ts, as the answer's) */
    int64_t echo_from;
    int echo_strip;          /* the space a tokenizer put before the text is not echoed */
    struct stop_filter stop; /* holds text that may start a stop string */
    struct json_gram json;   /* json_object: the answer's grammar state so far */
    /* a request with stop strings and log-probs: the log-probs of the
     * tokens whose text the stop filter holds ([LP_HELD_MAX], else NULL) */
    struct lp_held *held;
    int n_held;
    int64_t fed, passed; /* bytes of text into the stop filter and out of it */
    /* the newest generated tokens, a ring of GEN_MARKS (n_gen in all): a
     * session gives back those of a stop string */
    struct gen_mark marks[GEN_MARKS];
    int64_t n_gen, usage_prompt;
    double lp_sum;        /* engine_request.score: the log-probs of the tokens generated, summed */
    int64_t usage_cached; /* prompt tokens a free slot held (prefix.h): not prefilled */
    int paused;
    /* a session's turn cancelled while its prompt was being fed: the rest
     * is fed, then the turn ends (CANCELLED) with no answer, so that the
     * session never holds part of a prompt */
    int cancel_after_prompt;
    /* a session's token to feed next before this turn took it into its
     * prompt: restored when the turn is cancelled before any of it is fed */
    int turn_had_next;
    int32_t turn_next_tok;
    int drop_session; /* the turn that started the session ended with nothing in it */
    char session[ENGINE_SESSION_ID_MAX];
    uint64_t owner;        /* who created the session (engine_request.owner) */
    int created, restored; /* this request started the session / read it from disk */
    /* its snapshot in --session-dir as this server last read, wrote or
     * evicted it (session_restore; session.c's disk_state after a write or
     * an eviction): a description needs no stat on the engine thread */
    int on_disk;
    int64_t disk_bytes;
    double last_used;
    uint64_t admitted; /* e->admit_clock at admission: prefill goes in this order */
};

/* A request waiting for a slot, and the last pause or resume sent for it
 * (a sequence admitted later starts paused if its client asked so). */
struct waiting_req {
    struct engine_request req;
    int paused;
    int list_waits; /* a listing counted in n_lists_waiting */
    int sess_waits; /* a GET, save or DELETE of a session counted in n_sess_waiting */
};

struct engine {
    struct engine_config cfg;
    struct engine_model_info info;
    struct decoder dec; /* model, tokenizer, backend, forward state and KV pool */
    struct kv_policy default_policy;
    struct queue q;
    void (*wake)(void *);
    void *wake_arg;
    pthread_t thread;
    /* start handshake */
    pthread_mutex_t start_mu;
    pthread_cond_t start_cv;
    int started, start_rc;
    char start_err[256];
    /* engine-thread state */
    struct seq *seqs;            /* [max_seqs], index == KV slot */
    struct waiting_req *waiting; /* FIFO of admitted-but-slotless requests */
    int64_t n_waiting;
    int64_t n_lists_waiting; /* listings among them that wait for the directory */
    int64_t n_sess_waiting;  /* GETs, saves and DELETEs of sessions among them that wait */
    struct fwd_input *inputs;
    int *input_seq;
    float *scratch;    /* [max_seqs][V] a sequence's logits as the model gave them (logprobs) */
    float *share_rows; /* [max_seqs][V] a later choice's copy of its prompt's last row, or NULL
                          until a request of several choices first needs it */
    int32_t *eog_ids;  /* [n_eog] the end-of-generation tokens (min_tokens masks them) */
    struct json_tok *json_tok; /* [the model's n_vocab] for json_mask */
    /* ... and the ids by first byte: json_ids[json_first[b] .. json_first[b + 1]) start
     * with byte b, those from json_first[256] are JSON_TOK_NEVER; json_rest holds the
     * n_json_rest ids that are not plain string text (JSON_TOK_TEXT) */
    int32_t *json_ids, *json_rest;
    int64_t json_first[258], n_json_rest;
    int json_read_all; /* STREAMSINK_JSON_MASK=read: json_mask reads every token (its reference) */
    int64_t n_eog;
    /* a step's rows to sample (step, pick_task), and their token events */
    struct seq **pick_seq;       /* [max_seqs] */
    float **pick_logits;         /* [max_seqs] */
    struct engine_event *picked; /* [max_seqs] */
    int n_pick;
    /* a step's echoed prompt tokens (echo_plan, echo_task): each one's
     * sequence, prompt index and logits row (NULL: no log-probs, or none
     * for a first token), and its event */
    struct echo_job *echo;       /* [max_step_tokens + max_seqs] */
    struct engine_event *echoed; /* [max_step_tokens + max_seqs] */
    int64_t n_echo;
    char *piece;    /* [piece_cap] one token's text */
    char *text_out; /* [piece_cap + STOP_HOLD_MAX] text released by the stop filter */
    size_t piece_cap;
    int64_t *evicted_before;    /* [max_seqs] per step input */
    struct prefix_slot *prefix; /* [n_slots] what each KV slot's cells hold (prefix.c) */
    int64_t prefix_cap;         /* tokens a record holds at most */
    uint64_t prefix_clock;      /* counts the records' uses (least recently used leaves) */
    struct engine_stats stats;
    int pushed; /* events pushed since the last wake */
    /* sessions on disk (--session-dir; session.c) */
    int dir_fd;               /* -1: none */
    uint8_t model_digest[32]; /* SHA-256 of the model file */
    uint64_t tmp_seq;         /* temp file names */
    /* the session writer thread (session.c): saves handed over and back */
    struct session_saving *saving;   /* [SESSION_SAVES_MAX] */
    struct session_loading *loading; /* [SESSION_LOADS_MAX]: restores read off the thread */
    struct session_listing *listing; /* [1]: GET /v1/sessions read off the thread */
    struct session_fileop *fileops;  /* [SESSION_FILEOPS_MAX]: session API files, off the thread */
    struct ptrq to_writer, from_writer;
    pthread_t writer;
    int writer_on, saves_draining;
    int64_t io_jobs;    /* jobs handed to the writer thread, not yet taken back */
    double io_progress; /* when it last gave one back, or was handed one while idle */
    uint64_t save_order;
    int count_failing; /* the directory's last count broke (logged once) */
    /* engine_retire_sessions was called: each idle session leaves memory
     * (written to the directory) at once; retire_after: not before then
     * (a second after a save that failed) */
    int retiring;
    double retire_after;
    /* when requests of several choices began to hold later ones back
     * (engine_config.choices_hold_s); 0 while none waits for its slots */
    double choices_hold_from;
    uint64_t admit_clock; /* counts admissions (seq.admitted) */
    int *prefill_order;   /* [max_seqs]: step's scratch */
};

/* Runs on the engine thread before it serves: opens the model and builds
 * everything the scheduler uses, filling e->info. Returns 0 or -errno with a
 * message in e->start_err; engine_free cleans up either way. */
int engine__load(struct engine *e);
/* One message to cfg.log (else stderr, "streamsink: " first). */
void engine__log(const struct engine *e, enum engine_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Frees what s holds (request, KV slot, session name): s becomes SEQ_FREE. */
void engine__seq_release(struct engine *e, struct seq *s);
/* Answers DELETE request id of session sid once the IO thread is done with
 * its file (rc: 0 deleted, -ENOENT none of the key's, else why the key's
 * file could not be deleted): 500 session_delete_failed for the last, else
 * done (204) when the file was deleted or found is set (the session was in
 * memory or in a save), else 404 session_not_found. */
void engine__delete_answer(struct engine *e, uint64_t id, const char *sid, int found, int rc);
/* Answers GET (or save) request id of session sid once the IO thread has
 * read its file's header (rc 0: the session in; -ENOENT: none of the key's,
 * 404; else 503 session_read_failed: the file could not be read). */
void engine__describe_answer(struct engine *e, uint64_t id, const char *sid, int rc,
                             const struct engine_session_info *in);
/* Answers an explicit save (request id) once the writer is done with it:
 * rc 0 (the session id described: from memory, or as written when it left
 * memory meanwhile), or -errno with why (written unused). */
void engine__save_answer(struct engine *e, uint64_t id, uint64_t key, const char *sid, int rc,
                         const char *why, const struct engine_session_info *written);

#endif
