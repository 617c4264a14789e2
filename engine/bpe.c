/*
 * bpe.c: steps 1 and 3 of encoding (tokenizer_impl.h) and what they need from
 * the GGUF file: tok_load builds the vocab index, the merge table, the added
 * tokens and the special ids; tok_encode cuts the text at added tokens, hands
 * each stretch to the pre-tokenizer (pretok.c) and merges each word.
 */
#include "tokenizer_impl.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

/* GGUF token_type values (llama.cpp's llama_token_type). */
enum tok_type {
    TOK_TYPE_NORMAL = 1,
    TOK_TYPE_UNKNOWN = 2,
    TOK_TYPE_CONTROL = 3,
    TOK_TYPE_USER_DEFINED = 4,
    TOK_TYPE_UNUSED = 5,
    TOK_TYPE_BYTE = 6,
};

static size_t utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | (cp >> 6 & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | (cp >> 12 & 0x3F));
    out[2] = (char)(0x80 | (cp >> 6 & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the
 * others to 256, 257, ... in byte order. */
static void byte_alphabet(uint32_t byte_cp[256])
{
    uint32_t next = 256;

    for (uint32_t b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        byte_cp[b] = printable ? b : next++;
    }
}

/* ---- hash tables ---- */

uint64_t tok__hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */

    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 0x100000001b3ull;
    }
    return h ^ h >> 29;
}

static uint64_t hash_pair(uint64_t key)
{
    key *= 0x9E3779B97F4A7C15ull;
    return key ^ key >> 31;
}

static size_t table_size(uint64_t n)
{
    size_t size = 16;

    while (size < 2 * n)
        size *= 2;
    return size;
}

/* The vocab as text -> id, used only while loading. */
struct vocab_index {
    const struct gguf_str *tokens;
    int32_t *slots; /* token id, -1 = empty */
    size_t mask;
};

static int vocab_index_init(struct vocab_index *v, const struct gguf_str *tokens, size_t n)
{
    v->tokens = tokens;
    v->mask = table_size(n) - 1;
    v->slots = malloc((v->mask + 1) * sizeof *v->slots);
    if (!v->slots)
        return -ENOMEM;
    memset(v->slots, 0xff, (v->mask + 1) * sizeof *v->slots);
    for (size_t i = 0; i < n; i++) {
        size_t h = tok__hash_bytes(tokens[i].ptr, tokens[i].len) & v->mask;

        /* A later duplicate replaces an earlier one, as in HF's vocab map. */
        while (v->slots[h] >= 0) {
            const struct gguf_str *o = &tokens[v->slots[h]];
            if (o->len == tokens[i].len && memcmp(o->ptr, tokens[i].ptr, o->len) == 0)
                break;
            h = (h + 1) & v->mask;
        }
        v->slots[h] = (int32_t)i;
    }
    return 0;
}

static int32_t vocab_index_find(const struct vocab_index *v, const char *s, size_t n)
{
    size_t h = tok__hash_bytes(s, n) & v->mask;

    while (v->slots[h] >= 0) {
        const struct gguf_str *o = &v->tokens[v->slots[h]];
        if (o->len == n && memcmp(o->ptr, s, n) == 0)
            return v->slots[h];
        h = (h + 1) & v->mask;
    }
    return -1;
}

static const struct merge_slot *merge_find(const struct tokenizer *t, int32_t a, int32_t b)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t h = hash_pair(key) & t->merge_mask;

    while (t->merges[h].id >= 0) {
        if (t->merges[h].key == key)
            return &t->merges[h];
        h = (h + 1) & t->merge_mask;
    }
    return NULL;
}

static void merge_insert(struct tokenizer *t, int32_t a, int32_t b, int32_t rank, int32_t id)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t h = hash_pair(key) & t->merge_mask;

    /* A later duplicate replaces an earlier one, as in HF's merge map. */
    while (t->merges[h].id >= 0 && t->merges[h].key != key)
        h = (h + 1) & t->merge_mask;
    t->merges[h] = (struct merge_slot){.key = key, .rank = rank, .id = id};
}

/* ---- loading ---- */

void tok_free(struct tokenizer *t)
{
    if (!t)
        return;
    free(t->pieces);
    free(t->piece_off);
    free(t->eog);
    free(t->merges);
    free(t->specials);
    free(t->special_text);
    free(t->trie);
    free(t->trie_any);
    free(t->trie_user);
    free(t->spm_scores);
    free(t->spm_raw);
    free(t->spm_raw_off);
    free(t->spm_slots);
    free(t);
}

/* Reads an optional token id key into *id (-1 when absent). */
static int load_id(struct tokenizer *t, const struct gguf_file *g, const char *key, int32_t *id,
                   char *err, size_t err_len)
{
    int64_t v;
    int rc = gguf_get_i64(g, key, &v);

    *id = -1;
    if (rc == -ENOENT)
        return 0;
    if (rc < 0) {
        snprintf(err, err_len, "%s: not an integer", key);
        return -EINVAL;
    }
    if (v < 0 || v >= (int64_t)t->n_vocab) {
        snprintf(err, err_len, "%s = %lld: out of range (vocab %lld)", key, (long long)v,
                 (long long)t->n_vocab);
        return -EINVAL;
    }
    *id = (int32_t)v;
    return 0;
}

/* The special token ids; -1 for absent keys. */
static int load_ids(struct tokenizer *t, const struct gguf_file *g, char *err, size_t err_len)
{
    const struct {
        const char *key;
        int32_t *id;
    } ids[] = {
        {"tokenizer.ggml.bos_token_id", &t->bos},     {"tokenizer.ggml.eos_token_id", &t->eos},
        {"tokenizer.ggml.eot_token_id", &t->eot},     {"tokenizer.ggml.eom_token_id", &t->eom},
        {"tokenizer.ggml.padding_token_id", &t->pad}, {"tokenizer.ggml.unknown_token_id", &t->unk},
    };

    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        int rc = load_id(t, g, ids[i].key, ids[i].id, err, err_len);
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int build_merges(struct tokenizer *t, const struct gguf_file *g,
                        const struct vocab_index *vocab, char *err, size_t err_len)
{
    struct gguf_str *merges = NULL;
    uint64_t n = 0;
    char *buf = NULL;
    size_t buf_cap = 0;
    int rc = gguf_get_arr_str(g, "tokenizer.ggml.merges", &merges, &n);

    if (rc < 0) {
        snprintf(err, err_len, "tokenizer.ggml.merges: %s",
                 rc == -ENOENT ? "missing (a gpt2 tokenizer needs merges)" : "not a string array");
        return rc == -ENOMEM ? rc : -EINVAL;
    }
    if (n > INT32_MAX) {
        snprintf(err, err_len, "tokenizer.ggml.merges: %llu merges", (unsigned long long)n);
        rc = -EINVAL;
        goto out;
    }
    t->merge_mask = table_size(n) - 1;
    t->merges = malloc((t->merge_mask + 1) * sizeof *t->merges);
    if (!t->merges) {
        rc = -ENOMEM;
        goto out;
    }
    for (size_t i = 0; i <= t->merge_mask; i++)
        t->merges[i].id = -1;
    for (uint64_t r = 0; r < n; r++) {
        struct gguf_str m = merges[r];
        size_t sp = 1;
        int32_t a, b, ab;

        /* "left right"; search from 1 so a left part " " would still split. */
        while (sp < m.len && m.ptr[sp] != ' ')
            sp++;
        if (sp >= m.len)
            continue;
        if (m.len > buf_cap) {
            char *nb = realloc(buf, m.len);
            if (!nb) {
                rc = -ENOMEM;
                goto out;
            }
            buf = nb;
            buf_cap = m.len;
        }
        memcpy(buf, m.ptr, sp);
        memcpy(buf + sp, m.ptr + sp + 1, m.len - sp - 1);
        a = vocab_index_find(vocab, m.ptr, sp);
        b = vocab_index_find(vocab, m.ptr + sp + 1, m.len - sp - 1);
        ab = vocab_index_find(vocab, buf, m.len - 1);
        if (a < 0 || b < 0 || ab < 0)
            continue; /* HF refuses these; skipping keeps the other ranks' order */
        merge_insert(t, a, b, (int32_t)r, ab);
    }
    rc = 0;
out:
    free(buf);
    free(merges);
    return rc;
}

static int32_t trie_child(const struct tokenizer *t, int32_t node, uint8_t b)
{
    uint64_t key;
    size_t h;

    if (node == 0)
        return t->trie_root[b];
    key = (uint64_t)node << 8 | b;
    h = hash_pair(key) & t->trie_mask;
    while (t->trie[h].child >= 0) {
        if (t->trie[h].key == key)
            return t->trie[h].child;
        h = (h + 1) & t->trie_mask;
    }
    return -1;
}

/* The node reached from node by byte b, made if missing; *n_nodes counts them. */
static int32_t trie_add(struct tokenizer *t, int32_t node, uint8_t b, int32_t *n_nodes)
{
    int32_t c = trie_child(t, node, b);
    uint64_t key = (uint64_t)node << 8 | b;
    size_t h;

    if (c >= 0)
        return c;
    c = (*n_nodes)++;
    if (node == 0) {
        t->trie_root[b] = c;
        return c;
    }
    h = hash_pair(key) & t->trie_mask;
    while (t->trie[h].child >= 0)
        h = (h + 1) & t->trie_mask;
    t->trie[h] = (struct trie_edge){.key = key, .child = c};
    return c;
}

/* Copies token text s into out, with every ' ' spelled '▁' when spm (added
 * tokens are matched in SentencePiece's normalized text); returns the bytes
 * written, or only counts them when out is NULL. */
static size_t special_spelling(struct gguf_str s, int spm, char *out)
{
    size_t n = 0;

    for (size_t i = 0; i < s.len; i++) {
        if (spm && s.ptr[i] == ' ') {
            if (out)
                memcpy(out + n, "\xE2\x96\x81", 3);
            n += 3;
        } else {
            if (out)
                out[n] = s.ptr[i];
            n++;
        }
    }
    return n;
}

static int build_specials(struct tokenizer *t, const struct gguf_str *tokens, const int32_t *types)
{
    int spm = t->kind == TOK_SPM;
    size_t total = 0;
    int32_t n = 0;
    int32_t n_nodes = 1;

    for (int b = 0; b < 256; b++)
        t->trie_root[b] = -1;
    if (!types)
        return 0;
    for (size_t i = 0; i < t->n_vocab; i++) {
        if ((types[i] == TOK_TYPE_CONTROL || types[i] == TOK_TYPE_USER_DEFINED) &&
            tokens[i].len > 0) {
            n++;
            total += special_spelling(tokens[i], spm, NULL);
        }
    }
    if (total > INT32_MAX / 2)
        return -ENOMEM;
    t->specials = malloc((size_t)(n ? n : 1) * sizeof *t->specials);
    t->special_text = malloc(total ? total : 1);
    t->trie_mask = table_size(total) - 1;
    t->trie = malloc((t->trie_mask + 1) * sizeof *t->trie);
    t->trie_any = malloc((total + 1) * sizeof *t->trie_any);
    t->trie_user = malloc((total + 1) * sizeof *t->trie_user);
    if (!t->specials || !t->special_text || !t->trie || !t->trie_any || !t->trie_user)
        return -ENOMEM;
    for (size_t i = 0; i <= t->trie_mask; i++)
        t->trie[i].child = -1;
    memset(t->trie_any, 0xff, (total + 1) * sizeof *t->trie_any);
    memset(t->trie_user, 0xff, (total + 1) * sizeof *t->trie_user);
    total = 0;
    for (size_t i = 0; i < t->n_vocab; i++) {
        if ((types[i] == TOK_TYPE_CONTROL || types[i] == TOK_TYPE_USER_DEFINED) &&
            tokens[i].len > 0) {
            int32_t k = t->n_special++;
            struct special *sp = &t->specials[k];
            int32_t node = 0;

            sp->off = total;
            sp->len = special_spelling(tokens[i], spm, t->special_text + total);
            sp->id = (int32_t)i;
            sp->control = types[i] == TOK_TYPE_CONTROL;
            total += sp->len;
            for (size_t j = 0; j < sp->len; j++)
                node = trie_add(t, node, (uint8_t)t->special_text[sp->off + j], &n_nodes);
            /* the same text twice: the lower id wins */
            if (t->trie_any[node] < 0)
                t->trie_any[node] = k;
            if (!sp->control && t->trie_user[node] < 0)
                t->trie_user[node] = k;
        }
    }
    return 0;
}

/* tokenizer.max_token_bytes and spm_keeps_all (tokenizer_impl.h). A word
 * token stands for the bytes of its piece (BPE: a merge's piece is its parts'
 * pieces; SPM: the normalized text it was merged from, at most spm_max_len, or
 * one character of at most 4 bytes that falls back to <unk> or to one token per
 * byte); an added token for its text as matched. */
static void set_max_token_bytes(struct tokenizer *t)
{
    size_t most = 1;

    if (t->kind == TOK_SPM) {
        int all_bytes = 1;
        for (int b = 0; b < 256; b++)
            all_bytes &= t->byte_tok[b] >= 0;
        t->spm_keeps_all = t->unk >= 0 || all_bytes;
        most = t->spm_max_len > 4 ? t->spm_max_len : 4;
    } else {
        for (size_t i = 0; i < t->n_vocab; i++)
            if (t->piece_off[i + 1] - t->piece_off[i] > most)
                most = t->piece_off[i + 1] - t->piece_off[i];
    }
    for (int32_t k = 0; k < t->n_special; k++)
        if (t->specials[k].len > most)
            most = t->specials[k].len;
    t->max_token_bytes = most;
}

static int build_eog(struct tokenizer *t, const struct gguf_str *tokens)
{
    static const char *const names[] = {"<|im_end|>",    "<|eot_id|>", "<|end_of_text|>",
                                        "<|endoftext|>", "</s>",       "<end_of_turn>"};

    t->eog = calloc(t->n_vocab, sizeof *t->eog);
    if (!t->eog)
        return -ENOMEM;
    for (size_t i = 0; i < t->n_vocab; i++) {
        for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
            if (gguf_str_eq(tokens[i], names[k]))
                t->eog[i] = 1;
        }
    }
    if (t->eos >= 0)
        t->eog[t->eos] = 1;
    if (t->eot >= 0)
        t->eog[t->eot] = 1;
    if (t->eom >= 0)
        t->eog[t->eom] = 1;
    return 0;
}

/* s as a short printable C string, for messages. */
static const char *printable(struct gguf_str s, char *buf, size_t cap)
{
    size_t n = 0;

    for (uint64_t i = 0; i < s.len && n + 4 < cap; i++) {
        char c = s.ptr[i];
        buf[n++] = c >= 0x20 && c < 0x7f ? c : '?';
    }
    if (s.len > n) {
        memcpy(buf + n, "...", 3);
        n += 3;
    }
    buf[n] = '\0';
    return buf;
}

static void load_pre(struct tokenizer *t, const struct gguf_file *g)
{
    struct gguf_str pre;
    char buf[48];
    int rc = gguf_get_str(g, "tokenizer.ggml.pre", &pre);

    if (rc == -ENOENT)
        return; /* GPT-2 */
    if (rc == 0 && gguf_str_eq(pre, "smollm")) {
        t->split_digits = 1;
        return;
    }
    if (rc == 0 &&
        (gguf_str_eq(pre, "gpt2") || gguf_str_eq(pre, "gpt-2") || gguf_str_eq(pre, "default")))
        return;
    snprintf(t->warning, sizeof t->warning,
             "tokenizer.ggml.pre '%s' is not supported: using GPT-2's pattern, so token ids "
             "may differ from the model's own tokenizer",
             rc == 0 ? printable(pre, buf, sizeof buf) : "(not a string)");
}

int tok_load(struct tokenizer **out, const struct gguf_file *g, char *err, size_t err_len)
{
    struct tokenizer *t;
    struct gguf_str *tokens = NULL;
    int32_t *types = NULL;
    uint64_t n_tokens = 0;
    uint64_t n_types = 0;
    struct vocab_index vocab = {0};
    uint32_t byte_cp[256];
    struct gguf_str model;
    char buf[48];
    int rc;

    *out = NULL;
    t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, err_len, "tokenizer: out of memory");
        return -ENOMEM;
    }

    rc = gguf_get_str(g, "tokenizer.ggml.model", &model);
    if (rc < 0) {
        snprintf(err, err_len, "tokenizer.ggml.model: %s",
                 rc == -ENOENT ? "missing" : "not a string");
        rc = -EINVAL;
        goto fail;
    }
    if (gguf_str_eq(model, "llama")) {
        t->kind = TOK_SPM;
    } else if (!gguf_str_eq(model, "gpt2")) {
        snprintf(err, err_len,
                 "tokenizer.ggml.model is '%s': only 'gpt2' (byte-level BPE) and 'llama' "
                 "(SentencePiece) are supported",
                 printable(model, buf, sizeof buf));
        rc = -EINVAL;
        goto fail;
    }

    rc = gguf_get_arr_str(g, "tokenizer.ggml.tokens", &tokens, &n_tokens);
    if (rc == -ENOMEM)
        goto oom;
    if (rc < 0) {
        snprintf(err, err_len, "tokenizer.ggml.tokens: %s",
                 rc == -ENOENT ? "missing" : "not a string array");
        rc = -EINVAL;
        goto fail;
    }
    if (n_tokens == 0 || n_tokens > INT32_MAX) {
        snprintf(err, err_len, "tokenizer.ggml.tokens: %llu tokens", (unsigned long long)n_tokens);
        rc = -EINVAL;
        goto fail;
    }
    t->n_vocab = (size_t)n_tokens;

    rc = gguf_get_arr_i32(g, "tokenizer.ggml.token_type", &types, &n_types);
    if (rc == -ENOMEM)
        goto oom;
    if (rc == -ENOENT) {
        types = NULL; /* all normal */
    } else if (rc < 0 || n_types != n_tokens) {
        snprintf(err, err_len, "tokenizer.ggml.token_type: %s",
                 rc < 0 ? "not an integer array" : "count differs from tokenizer.ggml.tokens");
        rc = -EINVAL;
        goto fail;
    }

    rc = load_ids(t, g, err, err_len);
    if (rc < 0)
        goto fail;
    rc = gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &t->add_bos);
    if (rc == -ENOENT) {
        t->add_bos = 0;
    } else if (rc < 0) {
        snprintf(err, err_len, "tokenizer.ggml.add_bos_token: not a bool");
        rc = -EINVAL;
        goto fail;
    }
    if (t->kind == TOK_SPM) {
        rc = tok__spm_load(t, g, tokens, types, err, err_len);
        if (rc == -ENOMEM)
            goto oom;
        if (rc < 0)
            goto fail;
    } else {
        load_pre(t, g);
        rc = vocab_index_init(&vocab, tokens, t->n_vocab);
        if (rc < 0)
            goto oom;
        byte_alphabet(byte_cp);
        for (int b = 0; b < 256; b++) {
            char s[4];
            t->byte_tok[b] = vocab_index_find(&vocab, s, utf8_put(byte_cp[b], s));
        }
        rc = build_merges(t, g, &vocab, err, err_len);
        if (rc == -ENOMEM)
            goto oom;
        if (rc < 0)
            goto fail;
        if ((rc = tok__build_pieces(t, tokens, byte_cp)) < 0)
            goto oom;
    }
    if ((rc = build_specials(t, tokens, types)) < 0 || (rc = build_eog(t, tokens)) < 0)
        goto oom;
    set_max_token_bytes(t);
    for (uint32_t c = 0; c < 128; c++)
        t->ascii_class[c] = (uint8_t)tok__classify(c);

    free(vocab.slots);
    free(types);
    free(tokens);
    *out = t;
    return 0;
oom:
    snprintf(err, err_len, "tokenizer: out of memory");
    rc = -ENOMEM;
fail:
    free(vocab.slots);
    free(types);
    free(tokens);
    tok_free(t);
    return rc;
}

/* ---- queries ---- */

int64_t tok_n_vocab(const struct tokenizer *t)
{
    return (int64_t)t->n_vocab;
}

int32_t tok_bos(const struct tokenizer *t)
{
    return t->bos;
}

int32_t tok_eos(const struct tokenizer *t)
{
    return t->eos;
}

int tok_add_bos(const struct tokenizer *t)
{
    return t->add_bos;
}

int tok_space_prefix(const struct tokenizer *t)
{
    return t->kind == TOK_SPM && t->add_space_prefix;
}

int tok_is_eog(const struct tokenizer *t, int32_t id)
{
    return id >= 0 && (size_t)id < t->n_vocab && t->eog[id];
}

int tok_is_control(const struct tokenizer *t, int32_t id)
{
    int32_t lo = 0, hi = t->n_special; /* specials are in id order */
    while (lo < hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (t->specials[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < t->n_special && t->specials[lo].id == id && t->specials[lo].control;
}

const char *tok_warning(const struct tokenizer *t)
{
    return t->warning[0] ? t->warning : NULL;
}

size_t tok_max_token_bytes(const struct tokenizer *t)
{
    return t->max_token_bytes;
}

/* ---- encoding ---- */

void tok__emit(struct encoder *e, int32_t id)
{
    if (e->n < e->cap)
        e->out[e->n] = id;
    if (++e->n > e->max)
        e->over = 1;
}

int tok__beyond(struct encoder *e, size_t bytes)
{
    size_t per = e->t->max_token_bytes;

    if (e->over || e->max == INT64_MAX)
        return e->over;
    /* at least ceil(bytes / per) more tokens; n <= max while not over */
    if ((uint64_t)(bytes / per + (bytes % per != 0)) > (uint64_t)(e->max - e->n))
        e->over = 1;
    return e->over;
}

static int merge_before(const struct tok_merge *a, const struct tok_merge *b)
{
    return a->key != b->key ? a->key < b->key : a->pos < b->pos;
}

void tok__merge_push(struct tok_merge *h, size_t *n, struct tok_merge it)
{
    size_t i = (*n)++;

    while (i > 0 && merge_before(&it, &h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = it;
}

struct tok_merge tok__merge_pop(struct tok_merge *h, size_t *n)
{
    struct tok_merge top = h[0];
    struct tok_merge last = h[--*n];
    size_t i = 0;

    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && merge_before(&h[c + 1], &h[c]))
            c++;
        if (!merge_before(&h[c], &last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

int tok__reserve(struct encoder *e, size_t n)
{
    size_t cap = e->scratch_cap ? e->scratch_cap : 64;
    void *p;

    if (n <= e->scratch_cap)
        return 0;
    if (n > INT32_MAX / 4)
        return -E2BIG; /* a word or stretch of over 500M bytes */
    while (cap < n)
        cap *= 2;
    if (!(p = realloc(e->sym, cap * sizeof *e->sym)))
        return -ENOMEM;
    e->sym = p;
    if (!(p = realloc(e->heap, 3 * cap * sizeof *e->heap)))
        return -ENOMEM;
    e->heap = p;
    e->scratch_cap = cap;
    return 0;
}

static void push_pair(struct encoder *e, size_t *nh, int32_t pos)
{
    const struct merge_slot *m = merge_find(e->t, e->sym[pos].id, e->sym[e->sym[pos].next].id);

    if (m)
        tok__merge_push(e->heap, nh, (struct tok_merge){.key = m->rank, .pos = pos, .aux = m->id});
}

/* BPE on one word (bytes w[0..n)), as HF's BPE::merge_word: lowest rank
 * first, leftmost on ties; an entry is stale when its left symbol is gone, has
 * no right neighbour, or the pair there no longer merges into entry.id. */
void tok__bpe_word(struct encoder *e, const uint8_t *w, size_t n)
{
    const struct tokenizer *t = e->t;
    int32_t ns = 0;
    size_t nh = 0;
    size_t kept = 0; /* the bytes with a token: the word's symbols */
    int rc;

    for (size_t i = 0; i < n; i++)
        kept += t->byte_tok[w[i]] >= 0;
    if (tok__beyond(e, kept))
        return; /* too many tokens: no merge scratch for a word that long */
    if ((rc = tok__reserve(e, kept)) < 0) {
        e->err = rc;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_tok[w[i]];
        if (id < 0)
            continue; /* no token for this byte: HF drops it (no unk token) */
        e->sym[ns] = (struct tok_sym){.id = id, .prev = ns - 1, .next = ns + 1};
        ns++;
    }
    if (ns == 0)
        return;
    e->sym[ns - 1].next = -1;
    for (int32_t i = 0; i + 1 < ns; i++)
        push_pair(e, &nh, i);
    while (nh > 0) {
        struct tok_merge top = tok__merge_pop(e->heap, &nh);
        struct tok_sym *a = &e->sym[top.pos];
        struct tok_sym *b;
        const struct merge_slot *m;

        if (a->id < 0 || a->next < 0)
            continue;
        b = &e->sym[a->next];
        m = merge_find(t, a->id, b->id);
        if (!m || m->id != top.aux)
            continue;
        a->id = top.aux;
        b->id = -1;
        a->next = b->next;
        if (b->next >= 0)
            e->sym[b->next].prev = top.pos;
        if (a->prev >= 0)
            push_pair(e, &nh, a->prev);
        if (a->next >= 0)
            push_pair(e, &nh, top.pos);
    }
    for (int32_t i = 0; i >= 0; i = e->sym[i].next)
        tok__emit(e, e->sym[i].id);
}

/* The leftmost added token in s[from..n) (the longest there); *at gets its
 * offset. NULL if none. */
static const struct special *find_special(const struct tokenizer *t, const uint8_t *s, size_t n,
                                          size_t from, int parse_special, size_t *at)
{
    const int32_t *match = parse_special ? t->trie_any : t->trie_user;

    for (size_t i = from; i < n; i++) {
        int32_t node = t->trie_root[s[i]];
        int32_t best = -1;

        for (size_t j = i + 1; node >= 0; j++) {
            if (match[node] >= 0)
                best = match[node];
            if (j == n)
                break;
            node = trie_child(t, node, s[j]);
        }
        if (best >= 0) {
            *at = i;
            return &t->specials[best];
        }
    }
    return NULL;
}

/* The bytes of s[0..n) that give at least one token per max_token_bytes of
 * them, wherever they end up (tokenizer_impl.h); SPM counts normalized bytes. */
static size_t certain_bytes(const struct tokenizer *t, const uint8_t *s, size_t n)
{
    size_t kept = 0;

    if (t->kind == TOK_SPM)
        return t->spm_keeps_all ? tok__spm_normalized_len(t, s, n) : 0;
    for (size_t i = 0; i < n; i++)
        kept += t->byte_tok[s[i]] >= 0;
    return kept;
}

int64_t tok_encode(const struct tokenizer *t, const char *text, size_t len, int add_bos,
                   int parse_special, int32_t *out, int64_t cap)
{
    return tok_encode_max(t, text, len, add_bos, parse_special, INT64_MAX, out, cap);
}

int64_t tok_encode_max(const struct tokenizer *t, const char *text, size_t len, int add_bos,
                       int parse_special, int64_t max_tokens, int32_t *out, int64_t cap)
{
    const uint8_t *s = (const uint8_t *)text;
    struct encoder e = {.t = t, .out = out, .cap = out ? cap : 0, .max = max_tokens};
    uint8_t *norm = NULL;
    size_t i = 0;

    if (!t || (!text && len > 0) || cap < 0 || max_tokens < 0)
        return -EINVAL;
    if (add_bos && t->bos >= 0)
        tok__emit(&e, t->bos);
    /* one linear pass: a text certainly over the limit goes no further */
    if (max_tokens < INT64_MAX && (e.over || tok__beyond(&e, certain_bytes(t, s, len))))
        return max_tokens + 1;
    if (t->kind == TOK_SPM) {
        /* added tokens are matched in the normalized text (spm.c) */
        int rc = tok__spm_normalize(t, s, len, &norm, &len);
        if (rc < 0)
            return rc;
        s = norm;
    }
    while (i < len && !e.err && !e.over) {
        size_t at = len;
        const struct special *sp =
            t->n_special ? find_special(t, s, len, i, parse_special, &at) : NULL;

        if (t->kind == TOK_SPM)
            tok__spm_stretch(&e, s + i, at - i);
        else
            tok__encode_stretch(&e, s + i, at - i);
        if (!sp)
            break;
        tok__emit(&e, sp->id);
        i = at + sp->len;
    }
    free(e.sym);
    free(e.heap);
    free(norm);
    return e.err ? e.err : e.over ? max_tokens + 1 : e.n;
}
