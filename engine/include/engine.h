/*
 * engine.h: the engine module's public header. Everything server/ and api/
 * may know about the model and the decoder is here; nothing here mentions
 * tensors, HTTP or JSON.
 *
 * The decoder the engine thread runs is public too (decoder.h): the
 * program's offline commands (cmd/) drive one on their own thread.
 */
#ifndef SS_ENGINE_H
#define SS_ENGINE_H

#include <stddef.h>
#include <stdint.h>

/* ---- The engine thread (used by the server) ---------------------------------
 *
 * One engine thread owns the model, the KV pool and the backend. It admits
 * requests, runs one batched step for all active sequences (continuous
 * batching; long prompts prefilled in chunks between decode steps), emits
 * events and retires finished sequences. The loop thread and the engine share
 * only two queues of plain structs (queue.c): requests, cancels, pauses in;
 * events out, by value. Connections are found by id.
 */

struct engine; /* opaque */

/* ---- what a caller chooses, in the engine's own terms ----------------------
 * (the engine maps these onto its backend, KV cache and sampler; callers never
 * see those modules) */

enum engine_backend { ENGINE_BACKEND_CPU = 0, ENGINE_BACKEND_CUDA };
/* "cpu" | "cuda". Returns 0 or -EINVAL. */
int engine_backend_parse(const char *s, enum engine_backend *out);
const char *engine_backend_name(enum engine_backend b);

enum engine_policy_kind {
    ENGINE_POLICY_AUTO = 0,  /* by the model's normalizer: softmax -> sinks:4, else window */
    ENGINE_POLICY_WINDOW,    /* pin nothing: pure sliding window */
    ENGINE_POLICY_SINKS,     /* pin the first n_sinks tokens, slide the rest */
    ENGINE_POLICY_DENSE,     /* no eviction: refuse past the window */
    ENGINE_POLICY_RECOMPUTE, /* evaluation only (streamsink perplexity); refused by the server */
};
#define ENGINE_MAX_SINKS 64 /* the most sinks "sinks:N" may pin */
struct engine_policy {
    enum engine_policy_kind kind;
    int64_t n_sinks; /* ENGINE_POLICY_SINKS */
};
/* "auto" | "window" | "sinks:N" | "dense" | "recompute". Returns 0 or -EINVAL. */
int engine_policy_parse(const char *s, struct engine_policy *out);
/* "sinks:4" etc. into buf. */
void engine_policy_name(const struct engine_policy *p, char *buf, size_t cap);

/* KV cache storage: f16 (default), f32, or q8_0 (32 values a block with an
 * f16 scale, about half f16's bytes; CPU backend only). */
enum engine_kv_dtype { ENGINE_KV_F16 = 0, ENGINE_KV_F32, ENGINE_KV_Q8_0 };
/* "f16" | "f32" | "q8_0". Returns 0 or -EINVAL. */
int engine_kv_dtype_parse(const char *s, enum engine_kv_dtype *out);
/* The name engine_kv_dtype_parse reads. */
const char *engine_kv_dtype_name(enum engine_kv_dtype d);

struct engine_sampling {
    float temperature;       /* 0: greedy */
    int64_t top_k;           /* 0: off */
    float top_p;             /* 1: off */
    float min_p;             /* 0: off */
    float repeat_penalty;    /* 1: off (divide positive logits, multiply negative) */
    float presence_penalty;  /* OpenAI: -= p if the token occurred */
    float frequency_penalty; /* OpenAI: -= f * count */
    int64_t penalty_last_n;  /* window the penalties look at (0: off) */
    uint64_t seed;
};
/* Temperature 1, top_p 1, the rest off, penalty_last_n 64, seed 0. */
struct engine_sampling engine_sampling_defaults(void);

enum engine_log_level { ENGINE_LOG_INFO, ENGINE_LOG_WARN, ENGINE_LOG_ERROR };

struct engine_config {
    const char *model_path;
    int n_threads; /* CPU backend threads */
    enum engine_backend backend;
    int64_t max_seqs;            /* KV slots: sequences (and sessions) resident at once */
    int64_t max_queue;           /* requests waiting for a slot before 429 (0: none wait) */
    int64_t window;              /* W: window tokens per sequence (0: model context) */
    int64_t max_sinks;           /* S_max: sink cells per slot (>= any sinks:N policy used) */
    struct engine_policy policy; /* default policy (auto resolves by normalizer) */
    int64_t chunk;               /* prompt tokens one sequence may prefill per step */
    int64_t max_step_tokens;     /* tokens in one batched step (decode + prefill) */
    enum engine_kv_dtype kv_dtype;
    int64_t max_prompt_tokens; /* longest prompt accepted (0: no limit besides dense's window) */
    int64_t session_idle_s;    /* an idle session frees its slot after this many seconds */
    /* A request of several choices waiting for slots that running requests
     * hold keeps later requests that need a slot waiting behind it, so that
     * slots freeing one at a time go to it; for at most this many seconds
     * (then they pass it, and it starts the first time its slots are free),
     * so that a slot held by a request with no end (an endless stream)
     * cannot stop every admission. */
    double choices_hold_s;
    /* NULL: sessions live in memory only. Else the directory a session is
     * written to when it leaves memory (idle, LRU, stop, save) and restored
     * from when a request names it (docs/serving.md#sessions). */
    const char *session_dir;
    int64_t session_disk_max; /* bytes of snapshots kept in session_dir (0: no bound) */
    int no_mmap; /* read the weights into memory instead of mapping the file (--no-mmap) */
    /* Where the engine's own messages go (a session lost, the session
     * directory's counts), from the engine's threads; NULL: stderr. */
    void (*log)(enum engine_log_level level, const char *msg, void *arg);
    void *log_arg;
};
/* Defaults for every field (threads 2, max_seqs 8, window 4096, chunk 256, ...). */
struct engine_config engine_default_config(void);

struct engine_model_info {
    char name[128];
    char arch[32];
    char normalizer[16];     /* softmax | softmax1 | sink | softpick */
    char default_policy[32]; /* resolved default policy, e.g. "sinks:4" */
    int64_t n_ctx_train;
    int64_t n_vocab;
    int64_t window;
    int64_t max_seqs;
    const char *chat_template; /* tokenizer.chat_template or NULL; valid until engine_stop */
    int32_t bos, eos;
    int add_bos; /* the tokenizer prepends BOS to a fresh sequence's text */
    /* sink probe at load, on a built-in text (decoder.h: decoder_sink_check): share of heads
     * whose mean first-position attention mass exceeds 0.3, and the mean
     * first-position mass over all heads; -1 if the probe could not run */
    float probe_sink_rate;
    float probe_first_mass;
    /* 1 when the model is declared softmax1/sink/softpick (auto evicts
     * freely) yet its sink rate is above 10%: window-only eviction may hurt */
    int probe_warning;
};

#define ENGINE_MAX_STOP 4
#define ENGINE_MAX_STOP_LEN 256 /* bytes in one stop string */
#define ENGINE_MAX_TOP_LOGPROBS 20
#define ENGINE_MAX_LOGIT_BIAS 1024 /* token ids one request may bias */
#define ENGINE_SESSION_ID_MAX 128

/* A session id reaches the file system (session_dir/<id>.snap), so it is 1 to
 * ENGINE_SESSION_ID_MAX - 1 characters of [A-Za-z0-9_-]: no separators, no
 * dots, nothing a path could use. Returns 1 if id is one. */
int engine_session_id_valid(const char *id);
/* Opens dir as a session directory: a directory this process may write and
 * search. Returns its descriptor (O_CLOEXEC; the caller closes it), or
 * -errno with "--session-dir DIR: why" in err. The engine opens
 * engine_config.session_dir with it; a front end may check the flag with it
 * before loading a model. */
int engine_session_dir_open(const char *dir, char *err, size_t err_len);
/* 1 if the session ids a and b are equal. A session id is a bearer secret
 * on an open server (POST /v1/sessions mints 128 random bits), so the time
 * taken does not depend on where, or whether, the two differ: every one of
 * ENGINE_SESSION_ID_MAX places is compared (only the lengths may show). a
 * and b are NUL-terminated (or ENGINE_SESSION_ID_MAX bytes long). */
int engine_session_id_equal(const char *a, const char *b);

/* One more prompt of a completion that sends several (engine_request.more),
 * as the request's own prompt fields are: text, or token ids when text is
 * NULL; ids_of_text as engine_request.ids_of_text. */
struct engine_prompt {
    char *text; /* malloc'd; owned by the request */
    size_t text_len;
    int32_t *ids; /* malloc'd; owned */
    int64_t n_ids;
    int ids_of_text;
};

/* What a request asks the engine to do. */
enum engine_request_kind {
    ENGINE_REQ_GENERATE = 0,   /* a completion (prompt -> tokens) */
    ENGINE_REQ_SESSION_SAVE,   /* write session_id to session_dir now (stays in memory) */
    ENGINE_REQ_SESSION_GET,    /* one ENGINE_EV_SESSION for session_id, then DONE */
    ENGINE_REQ_SESSION_LIST,   /* one ENGINE_EV_SESSION per session of owner, then DONE */
    ENGINE_REQ_SESSION_DELETE, /* drop session_id from memory and disk, then DONE */
};

struct engine_request {
    uint64_t id; /* chosen by the caller, unique among live requests */
    enum engine_request_kind kind;
    /* Who asks: an opaque 64-bit name of the API key the request carried
     * (the server's keyed hash of the key, never 0), or 0 on an open
     * server. A session belongs to the owner that created it: for any other
     * it does not exist (404 session_not_found). It is stored in snapshots,
     * so it must not depend on the key's place in the key list. */
    uint64_t owner;
    char *prompt; /* UTF-8 text (malloc'd; owned by the request), or NULL */
    size_t prompt_len;
    int32_t *prompt_ids; /* token ids (malloc'd; owned), used when prompt is NULL */
    int64_t n_prompt_ids;
    int ids_of_text; /* prompt_ids are a non-empty text's (engine_tokenize): for echo */
    int add_bos;     /* prepend BOS if the model wants one (text and ids alike; never to a
                        session's continuation) */
    /* A chat request on a session, whose prompt holds only its new turns:
     * open goes before them when the request starts the sequence (the
     * template's default system turn), close when it continues a session
     * (the end of the previous assistant turn: the template's end marker
     * and what follows it; an end-of-generation token the previous turn
     * left to feed is then not fed, as close holds the template's own).
     * Text with special tokens (malloc'd; owned), or NULL. */
    char *open, *close;
    int parse_special; /* recognize <|im_start|> etc. in the text */
    /* 1: generated CONTROL tokens (tok_is_control) keep their text in the
     * output; 0: their text is left out (the token still counts, has its
     * logprobs and stays in a session's KV) */
    int show_special;
    /* 1: an end-of-generation token does not end the request (max_tokens,
     * a stop string or the client does); the token is generated as any other */
    int ignore_eos;
    int64_t max_tokens; /* < 0: until EOS, a stop, or the client leaves; 0 (echo only):
                           the prompt alone */
    /* The first min_tokens tokens (0..max_tokens) are never end-of-generation
     * tokens (their logits are masked after the logprobs are taken), and stop
     * strings are matched in the text after them only (from the first whole
     * character after them). */
    int64_t min_tokens;
    struct engine_sampling sampling;
    char *stop[ENGINE_MAX_STOP]; /* stop strings of at most ENGINE_MAX_STOP_LEN bytes (malloc'd;
                                    owned), NULL-terminated list. Generation ends at the earliest
                                    occurrence of any; the text before it is emitted. */
    /* logit_bias: bias[i] (in [-100, 100]) is added to the logit of token
     * bias_id[i] before sampling, greedy included; the logprobs reported are
     * the model's own. n_bias <= ENGINE_MAX_LOGIT_BIAS distinct ids in
     * [0, n_vocab) (both malloc'd; owned), or 0 and NULL. */
    int32_t *bias_id;
    float *bias;
    int n_bias;
    int logprobs;     /* emit the chosen token's logprob */
    int top_logprobs; /* 0..ENGINE_MAX_TOP_LOGPROBS alternatives per token */
    /* Echo the prompt (no session only): its tokens come first as TOKEN
     * events of token -1, each with the text it completes and, when the
     * request asks for log-probs, lp_token, its log-prob given the tokens
     * before it and its alternatives (lp_null for the first token, which
     * has none; a BOS the engine prepends is not echoed). max_tokens 0 then
     * ends the request after the prompt. */
    int echo;
    /* response_format json_object: the answer is one JSON object. Before
     * each pick, every token whose text would take the answer out of the
     * grammar of engine/json_gram.h gets a logit of -inf (after the
     * logprobs are taken: they stay the model's), control and
     * end-of-generation tokens included, and the answer ends (finish STOP)
     * with the token that closes the object. */
    int json_object;
    /* Score each choice (best_of): its DONE carries lp_sum, the sum of the
     * log-probs (the model's own, as logprobs reports them) of the tokens
     * it generated. */
    int score;
    /* 1: prefill the whole prompt, even where a free KV slot holds its
     * first tokens (llama-server's cache_prompt false); 0: start after
     * them (prefix.h). */
    int no_prefix;
    /* Whose prompt prefixes the request may start from: only those that
     * requests of the same group left (the server's: the API key, or on an
     * open server the client's address), so that none can learn what
     * another's prompts began with. 0 is a group too. */
    uint64_t prefix_group;
    /* n: 1..max_seqs choices (0 reads as 1), no session only. Each is a
     * sequence of its own, admitted together when n slots are free; choice
     * i samples with seed + i, so a choice's tokens are those of a request
     * of one choice with that seed. Its events carry choice i; each choice
     * ends with its own DONE, and the request is over at the DONE with
     * choices_left 0. A cancel, pause or resume of the id acts on all. */
    int n_choices;
    /* A completion of several prompts (no session): n_prompts (0 reads as
     * 1), the first the prompt above and prompt p the more[p - 1] (n_prompts
     * - 1 of them, malloc'd; owned). Each prompt has n_choices choices:
     * choice p * n_choices + j answers prompt p with seed + j, as a request
     * of that prompt alone would. All n_prompts * n_choices sequences (at
     * most max_seqs) are admitted together, and each prompt is prefilled
     * once for its choices. */
    int n_prompts;
    struct engine_prompt *more;
    char session_id[ENGINE_SESSION_ID_MAX]; /* "" for none; else continue that session */
    /* A session_id the engine has neither in memory nor on disk: 0 starts it
     * (the DONE event says created), 1 answers 404 session_not_found. */
    int session_must_exist;
    int has_policy;
    struct engine_policy policy; /* per-request policy (a new session only) */
};
/* Frees what a request owns (not req itself). */
void engine_request_free(struct engine_request *req);

enum engine_event_kind {
    ENGINE_EV_TOKEN = 0, /* a token and the text it completes */
    ENGINE_EV_DONE,      /* a choice finished (the request, at choices_left 0): finish, usage */
    ENGINE_EV_ERROR,     /* the request failed: status, message, param and code */
    ENGINE_EV_SESSION,   /* one session's description (session requests) */
};

/* A session as the session requests and the DONE of a generation describe it. */
struct engine_session_info {
    char id[ENGINE_SESSION_ID_MAX];
    int64_t tokens_seen; /* tokens the session has stored or holds to feed next */
    int64_t position;    /* absolute position of its next token */
    char policy[32];
    int in_memory, on_disk;
    int64_t bytes; /* snapshot size on disk (0 if none) */
    int created;   /* DONE of a generation: this request started the session */
    int restored;  /* DONE of a generation: this request read it back from disk */
};

enum engine_finish {
    ENGINE_FINISH_NONE = 0,
    ENGINE_FINISH_STOP,   /* EOS or a stop string */
    ENGINE_FINISH_LENGTH, /* max_tokens, or a dense window full */
    ENGINE_FINISH_CANCELLED,
};

#define ENGINE_TEXT_MAX 256

struct engine_event { /* copied by value across the queue */
    uint64_t id;
    enum engine_event_kind kind;
    int32_t choice; /* TOKEN, DONE: which of the request's choices (0 for one) */
    /* DONE: the request's choices still running after this one's end; the
     * request is over (its last event) at the DONE where it is 0. An ERROR
     * is always a request's last event: its other choices end with it. */
    int32_t choices_left;
    int32_t token; /* TOKEN: the token generated (once a token: its first event), or -1 */
    char text[ENGINE_TEXT_MAX]; /* UTF-8, never a broken sequence; may be empty */
    uint32_t text_len;
    /* TOKEN with has_lp: the log-probs of token lp_token (the request asked
     * for them), sent with the first byte of its text: with stop strings a
     * token's text, and with it its log-probs, may come some events after
     * the token, and a stop string's tokens (text never sent) have none */
    int has_lp;
    int lp_null; /* has_lp for an echoed first prompt token: no context, no log-probs */
    int32_t lp_token;
    float logprob;
    int n_top;
    int32_t top_id[ENGINE_MAX_TOP_LOGPROBS];
    float top_logprob[ENGINE_MAX_TOP_LOGPROBS];
    enum engine_finish finish;
    int64_t prompt_tokens; /* usage, on DONE */
    int64_t completion_tokens;
    double lp_sum;         /* DONE of a request with score: its tokens' log-probs, summed */
    int64_t cached_tokens; /* DONE: of prompt_tokens, those a free slot held (not prefilled) */
    int status;            /* HTTP status for ERROR (400, 409, 429, 500, 503) */
    char message[256];     /* for ERROR (as long as api_error's: a session id fits whole) */
    char param[32]; /* for ERROR: the request field at fault ("prompt", "kv_policy", ...), "" */
    char code[32];  /* for ERROR: an OpenAI-style code ("context_length_exceeded", ...), "" */
    struct engine_session_info session; /* SESSION; DONE of a request with a session_id */
};

/* Loads the model and starts the engine thread. wake(arg) is called from the
 * engine thread when events are ready (the server passes a function that calls
 * uv_async_send). Returns 0, or a negative errno with a message in err
 * (engine_error_is_model(rc) says whether the model file is at fault). */
int engine_start(struct engine **out, const struct engine_config *cfg, void (*wake)(void *arg),
                 void *wake_arg, char *err, size_t err_len);
/* 1 when an engine_start (or decoder_open) failure means the model file is
 * missing, truncated, corrupt or unsupported; 0 for the machine's failures
 * (memory, threads, the CUDA device or its libraries). The one rule the
 * server and the commands both use. */
int engine_error_is_model(int rc);

/* Valid until engine_stop. Any thread. */
const struct engine_model_info *engine_model_info(const struct engine *e);

/* Any thread. Never blocks. Takes ownership of req on success only; on -EBUSY
 * (no slot and the wait queue is full) the caller still owns req (answer 429). */
int engine_submit(struct engine *e, struct engine_request *req);
/* Any thread; idempotent. A generation request not yet ended ends with one
 * DONE: finish CANCELLED, after its text held back for stop strings (a cancel
 * that meets a stop string there ends it STOP), also if it still waited for
 * a slot; one that ended first keeps its own end. A session request already
 * handed to the session IO thread is answered as usual. */
void engine_cancel(struct engine *e, uint64_t id);
void engine_pause(struct engine *e, uint64_t id); /* backpressure: skip in steps */
void engine_resume(struct engine *e, uint64_t id);

/* Any thread; for a server that starts to drain. From now on each session
 * leaves memory, written to session_dir, as soon as it is idle: those idle
 * now at once, one running a turn when the turn ends. Its next turn, which
 * the draining server refuses, then finds the snapshot on the replica it is
 * sent to instead, rather than a session that replica would start afresh.
 * Requests still go on as before. Without a session_dir it does nothing
 * (sessions stay in memory until engine_stop). */
void engine_retire_sessions(struct engine *e);

/* Loop thread. Copies up to max events out; call until it returns 0. */
size_t engine_drain(struct engine *e, struct engine_event *ev, size_t max);

/* Tokenizes text[0..len) as a text prompt would be, without BOS (the engine
 * prepends it at admission when the request asks and the model wants it, so
 * submitting these ids with add_bos gives exactly the text path's tokens).
 * parse_special: as engine_request.parse_special. Any thread, concurrently
 * with the engine thread and with other calls (the tokenizer is read-only),
 * between engine_start and engine_stop: the server calls it off the loop
 * thread, since a long prompt takes a while. Returns the token count (>= 0)
 * with a malloc'd array in *out (caller frees, even for 0 tokens), or a
 * negative errno (*out NULL). */
int64_t engine_tokenize(const struct engine *e, const char *text, size_t len, int parse_special,
                        int32_t **out);
/* engine_tokenize for a prompt of at most max_tokens (>= 0) tokens: stops as
 * soon as the text is known to have more, and returns max_tokens + 1 with *out
 * NULL, so a text of megabytes costs what max_tokens tokens' worth of text
 * costs, not what its length does. A count up to max_tokens is exact, with
 * engine_tokenize's ids. */
int64_t engine_tokenize_max(const struct engine *e, const char *text, size_t len, int parse_special,
                            int64_t max_tokens, int32_t **out);

/* Text of a token for logprobs (raw bytes, may be a partial UTF-8 sequence).
 * Any thread (the tokenizer is read-only). Returns bytes written (< cap). */
size_t engine_token_text(const struct engine *e, int32_t id, char *buf, size_t cap);
/* The raw bytes of token id (a view valid until engine_stop; *len set), or
 * NULL for an id outside the vocabulary. Any thread. */
const char *engine_token_piece(const struct engine *e, int32_t id, size_t *len);

/* Upper bounds (seconds) of the snapshot save/restore latency buckets. */
#define ENGINE_SNAP_BUCKETS 8
#define ENGINE_SNAP_BUCKET_BOUNDS                                                                  \
    {                                                                                              \
        0.001, 0.005, 0.025, 0.1, 0.25, 1.0, 5.0, 30.0                                             \
    }

/* Counters for /metrics and /health. Any thread. Once a request's last
 * event (ENGINE_EV_DONE) can be drained, the counters (the _total fields)
 * include that request's work; the gauges are as at the end of the last
 * step. */
struct engine_stats {
    int64_t active_seqs, paused_seqs, queued, sessions;
    /* the sequences of requests submitted and not finished, counted at the
     * submit and at the finish (not a step's snapshot): a session turn whose
     * client left while its prompt is fed is one until the prompt is in */
    int64_t requests_open;
    int64_t slots_total, slots_free;
    int64_t prompt_tokens_total, gen_tokens_total, steps_total;
    int64_t prompt_tokens_cached_total; /* prompt tokens a free slot held: not prefilled */
    int64_t evicted_tokens_total;
    /* ... by the policy of the sequence that evicted them: "window", "sinks:N" */
    int64_t evicted_window_total, evicted_sinks_total[ENGINE_MAX_SINKS + 1];
    int64_t kv_bytes;
    int healthy; /* 0 after a backend failure */
    /* snapshots (--session-dir) */
    int64_t sessions_on_disk, snapshot_bytes, disk_evictions_total;
    int64_t saves_total, save_failures_total, restores_total, restore_failures_total;
    double save_seconds_total, restore_seconds_total, save_seconds_max, restore_seconds_max;
    /* the engine thread's part of the saves (the KV copy); the rest is the writer's */
    double save_engine_seconds_total, save_engine_seconds_max;
    int64_t snapshot_saves_inflight; /* handed to the writer, not yet written */
    int64_t snapshot_saves_held;     /* write failed; kept in memory for another try */
    /* cumulative histograms: [i] counts durations <= ENGINE_SNAP_BUCKET_BOUNDS[i] */
    int64_t save_hist[ENGINE_SNAP_BUCKETS], restore_hist[ENGINE_SNAP_BUCKETS];
};
void engine_get_stats(const struct engine *e, struct engine_stats *out);

/* Stops accepting, finishes or cancels everything, joins the thread, frees all. */
void engine_stop(struct engine *e);

#endif
