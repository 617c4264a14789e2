/*
 * model.c: maps a GGUF file (or reads it into memory: MODEL_NO_MMAP), reads
 * the Llama or Gemma 3 hyperparameters and binds every weight as a view into the map,
 * checking type and shape. The normalizer follows the README's convention:
 * <arch>.attention.normalizer if present, else "sink" when blk.N.attn_sinks
 * tensors exist, else "softmax". Also the SIGBUS guard for mapped files
 * (model.h).
 */
#include "model.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "quant.h"

const char *model_normalizer_name(enum model_normalizer n)
{
    switch (n) {
    case MODEL_NORM_SOFTMAX:
        return "softmax";
    case MODEL_NORM_SOFTMAX1:
        return "softmax1";
    case MODEL_NORM_SINK:
        return "sink";
    case MODEL_NORM_SOFTPICK:
        return "softpick";
    }
    return "?";
}

/* ---- the SIGBUS guard ---------------------------------------------------
 *
 * A signal handler reaches only global state, so this is a process-wide
 * table of the mapped model files (address range and path). Writers take
 * guard_mu; the handler reads without a lock: a slot's fields are written
 * before its `used` flag is published (release), and read after it
 * (acquire). The handler calls only async-signal-safe functions (write,
 * _exit, sigaction, raise).
 */
#define GUARD_SLOTS 16
#define GUARD_PATH_MAX 512

struct guard_slot {
    int used;
    uintptr_t lo, hi; /* [lo, hi): the mapping */
    char path[GUARD_PATH_MAX];
    size_t path_len;
};

static struct guard_slot guard_slots[GUARD_SLOTS];
static pthread_mutex_t guard_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t guard_once = PTHREAD_ONCE_INIT;
static struct sigaction guard_prev; /* the disposition before ours */

static void guard_write(const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, s, n);
        if (w <= 0)
            return;
        s += w;
        n -= (size_t)w;
    }
}

static void guard_handler(int sig, siginfo_t *si, void *uctx)
{
    static const char pre[] = "fatal: the model file ";
    static const char post[] = " changed or was truncated while mapped; replace model files by "
                               "rename, or run with --no-mmap\n";
    uintptr_t a = (uintptr_t)si->si_addr;
    (void)uctx;
    for (int i = 0; i < GUARD_SLOTS; i++) {
        struct guard_slot *g = &guard_slots[i];
        if (__atomic_load_n(&g->used, __ATOMIC_ACQUIRE) && a >= g->lo && a < g->hi) {
            guard_write(pre, sizeof pre - 1);
            guard_write(g->path, g->path_len);
            guard_write(post, sizeof post - 1);
            _exit(MODEL_EXIT_CHANGED);
        }
    }
    /* not a model file: the previous disposition gets the fault, which
     * happens again when the faulting instruction runs again on return */
    sigaction(SIGBUS, &guard_prev, NULL);
    if (si->si_code <= 0) /* sent by kill/raise: nothing re-executes */
        raise(sig);
}

static void guard_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = guard_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, &guard_prev);
}

/* Registers a mapping of path (best effort: with the table full, that file is
 * not guarded). */
static void guard_add(const void *map, size_t len, const char *path)
{
    pthread_once(&guard_once, guard_install);
    pthread_mutex_lock(&guard_mu);
    for (int i = 0; i < GUARD_SLOTS; i++) {
        struct guard_slot *g = &guard_slots[i];
        if (g->used)
            continue;
        g->lo = (uintptr_t)map;
        g->hi = (uintptr_t)map + len;
        g->path_len = strlen(path);
        if (g->path_len > sizeof g->path)
            g->path_len = sizeof g->path;
        memcpy(g->path, path, g->path_len);
        __atomic_store_n(&g->used, 1, __ATOMIC_RELEASE);
        break;
    }
    pthread_mutex_unlock(&guard_mu);
}

/* Unregisters the mapping at map (before it is unmapped). */
static void guard_remove(const void *map)
{
    pthread_mutex_lock(&guard_mu);
    for (int i = 0; i < GUARD_SLOTS; i++) {
        struct guard_slot *g = &guard_slots[i];
        if (g->used && g->lo == (uintptr_t)map) {
            __atomic_store_n(&g->used, 0, __ATOMIC_RELEASE);
            break;
        }
    }
    pthread_mutex_unlock(&guard_mu);
}

/* ---- reading the file ---------------------------------------------------- */

/* Copies the file into anonymous memory (read-only afterwards), so nothing
 * that happens to the file later can reach the weights. */
static int read_file(struct model *m, const char *path, char *err, size_t err_len)
{
    void *p = mmap(NULL, m->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        snprintf(err, err_len, "%s: cannot allocate %zu bytes for the model", path, m->map_len);
        return -ENOMEM;
    }
    m->map = p;
    size_t off = 0;
    while (off < m->map_len) {
        ssize_t r = pread(m->fd, (char *)p + off, m->map_len - off, (off_t)off);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            snprintf(err, err_len, "%s: %s", path,
                     r < 0 ? strerror(e) : "the file shrank while it was read");
            return -e;
        }
        off += (size_t)r;
    }
    mprotect(p, m->map_len, PROT_READ);
    close(m->fd);
    m->fd = -1;
    return 0;
}

static int map_file(struct model *m, const char *path, unsigned flags, char *err, size_t err_len)
{
    struct stat st;
    /* O_NONBLOCK: opening a FIFO for reading waits for a writer, forever
     * before the check below could refuse it; cleared once it is a file */
    m->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (m->fd < 0) {
        int e = errno;
        snprintf(err, err_len, "%s: %s", path, strerror(e));
        return -e;
    }
    if (fstat(m->fd, &st) < 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, err_len, "%s: not a regular file", path);
        return -EINVAL;
    }
    int fl = fcntl(m->fd, F_GETFL);
    if (fl < 0 || fcntl(m->fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        int e = errno;
        snprintf(err, err_len, "%s: fcntl: %s", path, strerror(e));
        return -e;
    }
    if (st.st_size == 0) {
        snprintf(err, err_len, "%s: empty file", path);
        return -EINVAL;
    }
    m->map_len = (size_t)st.st_size;
    if (flags & MODEL_NO_MMAP)
        return read_file(m, path, err, err_len);
    void *p = mmap(NULL, m->map_len, PROT_READ, MAP_PRIVATE, m->fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        snprintf(err, err_len, "%s: mmap: %s", path, strerror(e));
        return -e;
    }
    m->map = p;
    m->mapped = 1;
    guard_add(p, m->map_len, path);
    return 0;
}

/* Reads an integer hyperparameter "<arch>.<key>" within [lo, hi]. */
static int get_hp(const struct model *m, const char *key, int64_t lo, int64_t hi, int64_t dflt,
                  int required, int64_t *out, char *err, size_t err_len)
{
    char full[160];
    snprintf(full, sizeof full, "%s.%s", m->hp.arch, key);
    int rc = gguf_get_i64(&m->gguf, full, out);
    if (rc == -ENOENT && !required) {
        *out = dflt;
        return 0;
    }
    if (rc < 0) {
        snprintf(err, err_len, "model: %s %s", full, rc == -ENOENT ? "missing" : "has a bad type");
        return -EINVAL;
    }
    if (*out < lo || *out > hi) {
        snprintf(err, err_len, "model: %s = %lld out of range [%lld, %lld]", full, (long long)*out,
                 (long long)lo, (long long)hi);
        return -EINVAL;
    }
    return 0;
}

/* Binds a 2-D (or 1-D when ne1 == 1) tensor with the expected shape. */
static int bind(const struct model *m, struct tensor *t, const char *name, int64_t ne0, int64_t ne1,
                int float_only, char *err, size_t err_len)
{
    const struct gguf_tensor *g = gguf_find_tensor(&m->gguf, name);
    if (!g) {
        snprintf(err, err_len, "model: tensor '%s' missing", name);
        return -EINVAL;
    }
    if (g->ne[0] != ne0 || g->ne[1] * g->ne[2] * g->ne[3] != ne1) {
        snprintf(err, err_len, "model: tensor '%s' has shape [%lld, %lld], expected [%lld, %lld]",
                 name, (long long)g->ne[0], (long long)g->ne[1], (long long)ne0, (long long)ne1);
        return -EINVAL;
    }
    if (!qtype_supported(g->type) || (float_only && g->type != QTYPE_F32)) {
        snprintf(err, err_len, "model: tensor '%s' has type %s, which is not supported here", name,
                 qtype_name(g->type));
        return -EINVAL;
    }
    t->data = g->data;
    t->type = g->type;
    t->ne0 = ne0;
    t->ne1 = ne1;
    t->row_bytes = qtype_row_bytes(g->type, ne0);
    if (t->row_bytes == 0) {
        snprintf(err, err_len, "model: tensor '%s' row of %lld values is not whole %s blocks", name,
                 (long long)ne0, qtype_name(g->type));
        return -EINVAL;
    }
    return 0;
}

/* Reads an optional float hyperparameter "<arch>.<key>" (dflt when absent);
 * it must be finite and within [lo, hi]. */
static int get_hp_f(const struct model *m, const char *key, double lo, double hi, double dflt,
                    double *out, char *err, size_t err_len)
{
    char full[160];
    snprintf(full, sizeof full, "%s.%s", m->hp.arch, key);
    int rc = gguf_get_f64(&m->gguf, full, out);
    if (rc == -ENOENT) {
        *out = dflt;
        return 0;
    }
    if (rc < 0) {
        snprintf(err, err_len, "model: %s has a bad type", full);
        return -EINVAL;
    }
    if (!(*out >= lo && *out <= hi)) {
        snprintf(err, err_len, "model: %s = %g out of range [%g, %g]", full, *out, lo, hi);
        return -EINVAL;
    }
    return 0;
}

/* Gemma 3's own hyperparameters. What the file does not say follows
 * llama.cpp's loader and Hugging Face's Gemma3TextConfig defaults: every 6th
 * layer global, the rest local; local RoPE base 10,000; query scale
 * 1/sqrt(query_pre_attn_scalar) with query_pre_attn_scalar = Dh (true for
 * every size but 27B, whose file must carry attention.scale); no soft-capping. */
static int read_gemma3(struct model *m, char *err, size_t err_len)
{
    struct model_hparams *hp = &m->hp;
    int64_t v;
    double d;
    int rc;

    if ((rc = get_hp(m, "attention.value_length", 2, MODEL_MAX_HEAD_DIM, hp->head_dim, 0, &v, err,
                     err_len)) < 0)
        return rc;
    if (v != hp->head_dim) {
        snprintf(err, err_len, "model: %s.attention.value_length %lld != key_length %d", hp->arch,
                 (long long)v, hp->head_dim);
        return -EINVAL;
    }
    if (hp->rope_dim != hp->head_dim) {
        snprintf(err, err_len, "model: partial RoPE (%d of %d dims) is not supported for %s",
                 hp->rope_dim, hp->head_dim, hp->arch);
        return -ENOTSUP;
    }
    hp->rope_neox = 1;
    if ((rc = get_hp(m, "attention.sliding_window", 1, (int64_t)1 << 30, 0, 1, &v, err, err_len)) <
        0)
        return rc;
    hp->n_swa = (int)v;
    if ((rc = get_hp(m, "attention.sliding_window_pattern", 1, 1024, 6, 0, &v, err, err_len)) < 0)
        return rc;
    hp->swa_period = (int)v;
    if ((rc = get_hp_f(m, "rope.freq_base_swa", 1.0001, 1e12, 10000.0, &d, err, err_len)) < 0)
        return rc;
    hp->rope_base_local = d;
    if ((rc = get_hp_f(m, "attention.scale", 1e-6, 1e6, hp->attn_scale, &d, err, err_len)) < 0)
        return rc;
    hp->attn_scale = (float)d;
    if ((rc = get_hp_f(m, "final_logit_softcapping", 0, 1e6, 0, &d, err, err_len)) < 0)
        return rc;
    hp->final_softcap = (float)d;
    if ((rc = get_hp_f(m, "attn_logit_softcapping", 0, 1e6, 0, &d, err, err_len)) < 0)
        return rc;
    if (d != 0) {
        snprintf(err, err_len, "model: %s.attn_logit_softcapping (%g) is not supported", hp->arch,
                 d);
        return -ENOTSUP;
    }
    return 0;
}

static int read_hparams(struct model *m, char *err, size_t err_len)
{
    struct model_hparams *hp = &m->hp;
    int64_t v;
    int rc;
    if (gguf_get_cstr(&m->gguf, "general.architecture", hp->arch, sizeof hp->arch) < 0) {
        snprintf(err, err_len, "model: general.architecture missing");
        return -EINVAL;
    }
    if (strcmp(hp->arch, "llama") == 0) {
        hp->arch_kind = MODEL_ARCH_LLAMA;
    } else if (strcmp(hp->arch, "gemma3") == 0) {
        hp->arch_kind = MODEL_ARCH_GEMMA3;
    } else {
        snprintf(err, err_len, "model: architecture '%s' is not supported (llama, gemma3)",
                 hp->arch);
        return -ENOTSUP;
    }
    if (gguf_get_cstr(&m->gguf, "general.name", hp->name, sizeof hp->name) < 0)
        snprintf(hp->name, sizeof hp->name, "%s", "model");
    if ((rc = get_hp(m, "block_count", 1, 1024, 0, 1, &v, err, err_len)) < 0)
        return rc;
    hp->n_layer = (int)v;
    if ((rc = get_hp(m, "embedding_length", 1, 65536, 0, 1, &v, err, err_len)) < 0)
        return rc;
    hp->n_embd = (int)v;
    if ((rc = get_hp(m, "feed_forward_length", 1, 1 << 20, 0, 1, &v, err, err_len)) < 0)
        return rc;
    hp->n_ff = (int)v;
    if ((rc = get_hp(m, "attention.head_count", 1, 1024, 0, 1, &v, err, err_len)) < 0)
        return rc;
    hp->n_head = (int)v;
    if ((rc = get_hp(m, "attention.head_count_kv", 1, hp->n_head, hp->n_head, 0, &v, err,
                     err_len)) < 0)
        return rc;
    hp->n_head_kv = (int)v;
    if (hp->n_head % hp->n_head_kv != 0 ||
        (hp->arch_kind == MODEL_ARCH_LLAMA && hp->n_embd % hp->n_head != 0)) {
        snprintf(err, err_len, "model: %d heads, %d kv heads, dim %d do not divide", hp->n_head,
                 hp->n_head_kv, hp->n_embd);
        return -EINVAL;
    }
    /* Gemma's heads are not D / H wide (Gemma 3 270M: 4 x 256 for D = 640): the
     * file must say */
    if ((rc = get_hp(m, "attention.key_length", 2, MODEL_MAX_HEAD_DIM, hp->n_embd / hp->n_head,
                     hp->arch_kind == MODEL_ARCH_GEMMA3, &v, err, err_len)) < 0)
        return rc;
    hp->head_dim = (int)v;
    if (hp->head_dim > MODEL_MAX_HEAD_DIM) { /* no key_length: D / H */
        snprintf(err, err_len,
                 "model: head dim %d (no attention.key_length) is over the %d the "
                 "attention kernels take",
                 hp->head_dim, MODEL_MAX_HEAD_DIM);
        return -EINVAL;
    }
    if (hp->head_dim % 2 != 0 ||
        (hp->arch_kind == MODEL_ARCH_LLAMA && hp->head_dim * hp->n_head != hp->n_embd)) {
        snprintf(err, err_len, "model: head dim %d x %d heads != embedding %d", hp->head_dim,
                 hp->n_head, hp->n_embd);
        return -EINVAL;
    }
    if ((rc = get_hp(m, "rope.dimension_count", 2, hp->head_dim, hp->head_dim, 0, &v, err,
                     err_len)) < 0)
        return rc;
    hp->rope_dim = (int)v;
    if ((rc = get_hp(m, "context_length", 1, (int64_t)1 << 40, 2048, 0, &v, err, err_len)) < 0)
        return rc;
    hp->n_ctx_train = v;

    double d;
    char key[160];
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", hp->arch);
    hp->norm_eps = gguf_get_f64(&m->gguf, key, &d) == 0 ? (float)d : 1e-5f;
    snprintf(key, sizeof key, "%s.rope.freq_base", hp->arch);
    hp->rope_base = gguf_get_f64(&m->gguf, key, &d) == 0 ? d : 10000.0;
    if (!(hp->norm_eps > 0) || !(hp->rope_base > 1)) {
        snprintf(err, err_len, "model: bad rms epsilon or rope base");
        return -EINVAL;
    }
    snprintf(key, sizeof key, "%s.rope.scaling.type", hp->arch);
    char scaling[32] = "";
    gguf_get_cstr(&m->gguf, key, scaling, sizeof scaling);
    if ((scaling[0] && strcmp(scaling, "none") != 0) ||
        gguf_find_tensor(&m->gguf, "rope_freqs.weight")) {
        snprintf(err, err_len, "model: RoPE scaling (%s) is not supported yet",
                 scaling[0] ? scaling : "rope_freqs");
        return -ENOTSUP;
    }
    if (gguf_get_i64(&m->gguf, "general.file_type", &v) == 0)
        hp->file_type = (int)v;
    hp->attn_scale = (float)(1.0 / sqrt((double)hp->head_dim));
    if (hp->arch_kind == MODEL_ARCH_GEMMA3 && (rc = read_gemma3(m, err, err_len)) < 0)
        return rc;

    const struct gguf_tensor *emb = gguf_find_tensor(&m->gguf, "token_embd.weight");
    if (!emb) {
        snprintf(err, err_len, "model: tensor 'token_embd.weight' missing");
        return -EINVAL;
    }
    hp->n_vocab = emb->ne[1];
    if (hp->n_vocab < 2 || hp->n_vocab > ((int64_t)1 << 31) - 1) {
        snprintf(err, err_len, "model: vocabulary of %lld tokens", (long long)hp->n_vocab);
        return -EINVAL;
    }

    /* Normalizer: our convention (README "GGUF normalizer convention"). */
    char norm[32] = "";
    snprintf(key, sizeof key, "%s.attention.normalizer", hp->arch);
    int has_norm_key = gguf_get_cstr(&m->gguf, key, norm, sizeof norm) == 0;
    int has_sinks = gguf_find_tensor(&m->gguf, "blk.0.attn_sinks") != NULL ||
                    gguf_find_tensor(&m->gguf, "blk.0.attn_sinks.weight") != NULL;
    if (!has_norm_key)
        hp->normalizer = has_sinks ? MODEL_NORM_SINK : MODEL_NORM_SOFTMAX;
    else if (strcmp(norm, "softmax") == 0)
        hp->normalizer = MODEL_NORM_SOFTMAX;
    else if (strcmp(norm, "softmax1") == 0)
        hp->normalizer = MODEL_NORM_SOFTMAX1;
    else if (strcmp(norm, "sink") == 0)
        hp->normalizer = MODEL_NORM_SINK;
    else if (strcmp(norm, "softpick") == 0)
        hp->normalizer = MODEL_NORM_SOFTPICK;
    else {
        snprintf(err, err_len, "model: %s = '%s' (expected softmax, softmax1, sink or softpick)",
                 key, norm);
        return -EINVAL;
    }
    if (hp->normalizer == MODEL_NORM_SINK && !has_sinks) {
        snprintf(err, err_len, "model: normalizer 'sink' needs blk.N.attn_sinks tensors");
        return -EINVAL;
    }
    if (has_sinks && hp->normalizer != MODEL_NORM_SINK) {
        snprintf(err, err_len, "model: attn_sinks tensors present but normalizer is '%s'", norm);
        return -EINVAL;
    }
    static const char *const sink_vectors[] = {"attn_sinks_v", "attn_sinks_k"};
    for (size_t i = 0; i < sizeof sink_vectors / sizeof sink_vectors[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "blk.0.%s", sink_vectors[i]);
        if (gguf_find_tensor(&m->gguf, name) && hp->normalizer != MODEL_NORM_SINK) {
            snprintf(err, err_len, "model: %s tensors present but normalizer is '%s'",
                     sink_vectors[i], model_normalizer_name(hp->normalizer));
            return -EINVAL;
        }
    }
    return 0;
}

/* Per-head sink vectors (gguf-normalizer.md), F32 [Dh, n], copied into mem
 * (n_layer * n * Dh floats, allocated on first use) and bound to *dst:
 * blk.N.attn_sinks_v, the value of each query head's virtual key (n = H), and
 * blk.N.attn_sinks_k, the key of each kv head's virtual key (n = Hkv).
 * Optional, but in every layer or in none (blk.0 decides); finite. */
static int bind_sink_vectors(struct model *m, int l, const char *suffix, int n_heads, float **mem,
                             struct tensor *dst, char *err, size_t err_len)
{
    const struct model_hparams *hp = &m->hp;
    const int64_t n = (int64_t)n_heads * hp->head_dim;
    char name[96], first[96];
    int rc;
    memset(dst, 0, sizeof *dst);
    snprintf(name, sizeof name, "blk.%d.%s", l, suffix);
    snprintf(first, sizeof first, "blk.0.%s", suffix);
    if (!gguf_find_tensor(&m->gguf, first)) {
        if (gguf_find_tensor(&m->gguf, name)) {
            snprintf(err, err_len, "model: %s present but %s missing", name, first);
            return -EINVAL;
        }
        return 0;
    }
    if (!*mem) {
        *mem = calloc((size_t)hp->n_layer * (size_t)n, sizeof(float));
        if (!*mem) {
            snprintf(err, err_len, "model: out of memory");
            return -ENOMEM;
        }
    }
    struct tensor t;
    if ((rc = bind(m, &t, name, hp->head_dim, n_heads, 1, err, err_len)) < 0)
        return rc;
    float *d = *mem + (size_t)l * (size_t)n;
    memcpy(d, t.data, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        if (!(d[i] > -1e30f && d[i] < 1e30f)) {
            snprintf(err, err_len, "model: %s[%lld] is not a finite number", name, (long long)i);
            return -EINVAL;
        }
    }
    t.data = d;
    *dst = t;
    return 0;
}

static int bind_weights(struct model *m, char *err, size_t err_len)
{
    const struct model_hparams *hp = &m->hp;
    struct model_weights *w = &m->w;
    int64_t D = hp->n_embd, F = hp->n_ff, V = hp->n_vocab;
    int64_t Dq = (int64_t)hp->n_head * hp->head_dim, Dkv = (int64_t)hp->n_head_kv * hp->head_dim;
    int rc;
    char name[96];

    if ((rc = bind(m, &w->tok_embd, "token_embd.weight", D, V, 0, err, err_len)) < 0)
        return rc;
    if ((rc = bind(m, &w->output_norm, "output_norm.weight", D, 1, 1, err, err_len)) < 0)
        return rc;
    if (gguf_find_tensor(&m->gguf, "output.weight")) {
        if ((rc = bind(m, &w->output, "output.weight", D, V, 0, err, err_len)) < 0)
            return rc;
    } else {
        w->output = w->tok_embd; /* tied embeddings */
    }
    w->layers = calloc((size_t)hp->n_layer, sizeof *w->layers);
    m->sinks_mem = calloc((size_t)hp->n_layer * (size_t)hp->n_head, sizeof(float));
    if (!w->layers || !m->sinks_mem) {
        snprintf(err, err_len, "model: out of memory");
        return -ENOMEM;
    }
    for (int l = 0; l < hp->n_layer; l++) {
        struct model_layer *ly = &w->layers[l];
        struct {
            struct tensor *t;
            const char *suffix;
            int64_t ne0, ne1;
            int f32;
        } tab[] = {
            {&ly->attn_norm, "attn_norm", D, 1, 1}, {&ly->wq, "attn_q", D, Dq, 0},
            {&ly->wk, "attn_k", D, Dkv, 0},         {&ly->wv, "attn_v", D, Dkv, 0},
            {&ly->wo, "attn_output", Dq, D, 0},     {&ly->ffn_norm, "ffn_norm", D, 1, 1},
            {&ly->w_gate, "ffn_gate", D, F, 0},     {&ly->w_up, "ffn_up", D, F, 0},
            {&ly->w_down, "ffn_down", F, D, 0},
        };
        for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, tab[i].suffix);
            if ((rc = bind(m, tab[i].t, name, tab[i].ne0, tab[i].ne1, tab[i].f32, err, err_len)) <
                0)
                return rc;
        }
        if (hp->arch_kind == MODEL_ARCH_GEMMA3) {
            struct {
                struct tensor *t;
                const char *suffix;
                int64_t ne0;
            } g3[] = {
                {&ly->attn_q_norm, "attn_q_norm", hp->head_dim},
                {&ly->attn_k_norm, "attn_k_norm", hp->head_dim},
                {&ly->post_attn_norm, "post_attention_norm", D},
                {&ly->post_ffw_norm, "post_ffw_norm", D},
            };
            for (size_t i = 0; i < sizeof g3 / sizeof g3[0]; i++) {
                snprintf(name, sizeof name, "blk.%d.%s.weight", l, g3[i].suffix);
                if ((rc = bind(m, g3[i].t, name, g3[i].ne0, 1, 1, err, err_len)) < 0)
                    return rc;
            }
        }
        float *sinks = m->sinks_mem + (size_t)l * (size_t)hp->n_head;
        ly->attn_sinks = sinks; /* zeros: softmax1 is sink with s_h = 0 */
        if (hp->normalizer == MODEL_NORM_SINK) {
            struct tensor t;
            snprintf(name, sizeof name, "blk.%d.attn_sinks", l);
            if (!gguf_find_tensor(&m->gguf, name))
                snprintf(name, sizeof name, "blk.%d.attn_sinks.weight", l);
            if ((rc = bind(m, &t, name, hp->n_head, 1, 1, err, err_len)) < 0)
                return rc;
            memcpy(sinks, t.data, (size_t)hp->n_head * sizeof(float));
            for (int h = 0; h < hp->n_head; h++) {
                if (!(sinks[h] > -1e30f && sinks[h] < 1e30f)) {
                    snprintf(err, err_len, "model: %s[%d] is not a finite number", name, h);
                    return -EINVAL;
                }
            }
            if ((rc = bind_sink_vectors(m, l, "attn_sinks_v", hp->n_head, &m->sinks_v_mem,
                                        &ly->attn_sinks_v, err, err_len)) < 0)
                return rc;
            if ((rc = bind_sink_vectors(m, l, "attn_sinks_k", hp->n_head_kv, &m->sinks_k_mem,
                                        &ly->attn_sinks_k, err, err_len)) < 0)
                return rc;
        }
    }
    return 0;
}

int model_load(struct model *m, const char *path, char *err, size_t err_len)
{
    return model_open(m, path, 0, err, err_len);
}

int model_open(struct model *m, const char *path, unsigned flags, char *err, size_t err_len)
{
    int rc;
    memset(m, 0, sizeof *m);
    m->fd = -1;
    rc = map_file(m, path, flags, err, err_len);
    if (rc < 0)
        goto fail;
    rc = gguf_parse(&m->gguf, m->map, m->map_len, err, err_len);
    if (rc < 0)
        goto fail;
    rc = read_hparams(m, err, err_len);
    if (rc < 0)
        goto fail;
    rc = bind_weights(m, err, err_len);
    if (rc < 0)
        goto fail;
    return 0;
fail:
    model_free(m);
    return rc;
}

void model_free(struct model *m)
{
    gguf_free(&m->gguf);
    free(m->w.layers);
    free(m->sinks_mem);
    free(m->sinks_v_mem);
    free(m->sinks_k_mem);
    if (m->map && m->mapped)
        guard_remove(m->map);
    if (m->map)
        munmap(m->map, m->map_len);
    if (m->fd >= 0)
        close(m->fd);
    memset(m, 0, sizeof *m);
    m->fd = -1;
}
