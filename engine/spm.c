/*
 * spm.c: SentencePiece BPE vocabularies (tokenizer.ggml.model = "llama": Llama 2,
 * Gemma), loaded from tokenizer.ggml.tokens/scores/token_type, the
 * normalization of the text and the encoding of one stretch between added
 * tokens (bpe.c cuts the text at those, as for byte-level BPE).
 *
 * The text is normalized first, as SentencePiece's normalizer does: every ' '
 * becomes U+2581 '▁', and with add_space_prefix a '▁' goes in front
 * (add_dummy_prefix). Added tokens are matched in that normalized text, with
 * their spaces spelled '▁' too (so "    ▁  " is one run of seven, as
 * SentencePiece sees it). Each stretch between them is encoded as
 * SentencePiece's BPE model does (bpe_model.cc):
 *   2. one symbol per UTF-8 character (an invalid byte is a symbol of its own);
 *   3. repeatedly merge the adjacent pair whose concatenation is a NORMAL or
 *      USER_DEFINED token with the highest score, the leftmost on ties;
 *      a heap of candidate pairs makes this O(n log n); an entry is stale when
 *      either symbol has changed since it was pushed (lengths no longer add up),
 *      the test SentencePiece uses;
 *   4. each symbol that is a token is emitted; any other (a character not in
 *      the vocabulary) becomes the <0xXX> BYTE tokens of its UTF-8 bytes (byte
 *      fallback), or the unknown token when a byte has no such token.
 * CONTROL, BYTE and UNKNOWN tokens are never merge results (SentencePiece keeps
 * them out of its piece map); UNUSED tokens are left out too (SentencePiece
 * merges into them and then splits them back; no file we load has any).
 *
 * Where this differs from `sentencepiece`, on purpose: an invalid UTF-8 byte
 * is a symbol of its own and falls back to its byte token, so such text round
 * trips (sentencepiece takes only valid UTF-8). A literal '▁' in the text is a
 * space to SentencePiece, so it decodes as ' '. Hugging Face's GGUF loader
 * agrees with sentencepiece except on runs of more than 31 spaces
 * (tools/make_spm_tokenizer_fixture.py).
 *
 * Decoding: a BYTE token <0xXX> is the byte XX; every other token is its text
 * with '▁' turned back into ' ' (Hugging Face's Metaspace/Replace decoder plus
 * ByteFallback). With add_space_prefix the space the prefix added stays in the
 * piece; callers that want the text back strip one leading space.
 */
#include "tokenizer_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"

#define SPACE_MARK "\xE2\x96\x81" /* U+2581, SentencePiece's visible space */
#define SPACE_MARK_LEN 3

/* GGUF token_type values, which are SentencePiece's piece types. */
enum spm_type {
    SPM_NORMAL = 1,
    SPM_UNKNOWN = 2,
    SPM_CONTROL = 3,
    SPM_USER_DEFINED = 4,
    SPM_UNUSED = 5,
    SPM_BYTE = 6,
};

/* ---- the vocabulary: raw token text -> id of a mergeable token ---- */

static size_t slot_count(size_t n)
{
    size_t size = 16;

    while (size < 2 * n)
        size *= 2;
    return size;
}

static int32_t vocab_find(const struct tokenizer *t, const uint8_t *s, size_t n)
{
    size_t h;

    if (n > t->spm_max_len)
        return -1;
    h = tok__hash_bytes((const char *)s, n) & t->spm_mask;
    while (t->spm_slots[h] >= 0) {
        int32_t id = t->spm_slots[h];
        size_t off = t->spm_raw_off[id];
        if (t->spm_raw_off[id + 1] - off == n && memcmp(t->spm_raw + off, s, n) == 0)
            return id;
        h = (h + 1) & t->spm_mask;
    }
    return -1;
}

/* <0xXX> -> XX, or -1. */
static int byte_value(struct gguf_str s)
{
    int v = 0;

    if (s.len != 6 || memcmp(s.ptr, "<0x", 3) != 0 || s.ptr[5] != '>')
        return -1;
    for (int i = 3; i < 5; i++) {
        char c = s.ptr[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Decoded bytes of every token (see the top of this file). */
static int build_pieces(struct tokenizer *t, const struct gguf_str *tokens, const int32_t *types)
{
    size_t total = 0;

    for (size_t i = 0; i < t->n_vocab; i++)
        total += tokens[i].len;
    t->pieces = malloc(total ? total : 1);
    t->piece_off = malloc((t->n_vocab + 1) * sizeof *t->piece_off);
    if (!t->pieces || !t->piece_off)
        return -ENOMEM;
    t->piece_off[0] = 0;
    for (size_t i = 0; i < t->n_vocab; i++) {
        char *out = t->pieces + t->piece_off[i];
        struct gguf_str s = tokens[i];
        int b = types && types[i] == SPM_BYTE ? byte_value(s) : -1;
        size_t n = 0;

        if (b >= 0) {
            out[n++] = (char)b;
        } else {
            for (size_t k = 0; k < s.len;) {
                if (s.len - k >= SPACE_MARK_LEN && memcmp(s.ptr + k, SPACE_MARK, 3) == 0) {
                    out[n++] = ' ';
                    k += SPACE_MARK_LEN;
                } else {
                    out[n++] = s.ptr[k++];
                }
            }
        }
        t->piece_off[i + 1] = t->piece_off[i] + n;
    }
    return 0;
}

int tok__spm_load(struct tokenizer *t, const struct gguf_file *g, const struct gguf_str *tokens,
                  const int32_t *types, char *err, size_t err_len)
{
    float *scores = NULL;
    uint64_t n_scores = 0;
    size_t total = 0;
    int rc;

    t->kind = TOK_SPM;
    rc = gguf_get_arr_f32(g, "tokenizer.ggml.scores", &scores, &n_scores);
    if (rc == -ENOMEM)
        return rc;
    if (rc < 0 || n_scores != t->n_vocab) {
        free(scores);
        snprintf(err, err_len, "tokenizer.ggml.scores: %s",
                 rc == -ENOENT ? "missing (a llama/SentencePiece tokenizer needs scores)"
                 : rc < 0      ? "not a float array"
                               : "count differs from tokenizer.ggml.tokens");
        return -EINVAL;
    }
    t->spm_scores = scores;

    /* SentencePiece's add_dummy_prefix; llama.cpp's default when the key is absent */
    rc = gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix);
    if (rc == -ENOENT) {
        t->add_space_prefix = 1;
    } else if (rc < 0) {
        snprintf(err, err_len, "tokenizer.ggml.add_space_prefix: not a bool");
        return -EINVAL;
    }

    for (size_t i = 0; i < t->n_vocab; i++)
        total += tokens[i].len;
    t->spm_raw = malloc(total ? total : 1);
    t->spm_raw_off = malloc((t->n_vocab + 1) * sizeof *t->spm_raw_off);
    t->spm_mask = slot_count(t->n_vocab) - 1;
    t->spm_slots = malloc((t->spm_mask + 1) * sizeof *t->spm_slots);
    if (!t->spm_raw || !t->spm_raw_off || !t->spm_slots)
        return -ENOMEM;
    memset(t->spm_slots, 0xff, (t->spm_mask + 1) * sizeof *t->spm_slots);
    t->spm_raw_off[0] = 0;
    for (size_t i = 0; i < t->n_vocab; i++) {
        memcpy(t->spm_raw + t->spm_raw_off[i], tokens[i].ptr, tokens[i].len);
        t->spm_raw_off[i + 1] = t->spm_raw_off[i] + tokens[i].len;
    }
    for (int b = 0; b < 256; b++)
        t->byte_tok[b] = -1;
    for (size_t i = 0; i < t->n_vocab; i++) {
        int type = types ? types[i] : SPM_NORMAL;
        size_t h;

        if (type == SPM_BYTE) {
            int b = byte_value(tokens[i]);
            if (b >= 0 && t->byte_tok[b] < 0)
                t->byte_tok[b] = (int32_t)i;
            continue;
        }
        if ((type != SPM_NORMAL && type != SPM_USER_DEFINED) || tokens[i].len == 0)
            continue;
        if (tokens[i].len > t->spm_max_len)
            t->spm_max_len = tokens[i].len;
        /* A later duplicate replaces an earlier one. */
        h = tok__hash_bytes(tokens[i].ptr, tokens[i].len) & t->spm_mask;
        while (t->spm_slots[h] >= 0) {
            int32_t o = t->spm_slots[h];
            if (tokens[o].len == tokens[i].len &&
                memcmp(tokens[o].ptr, tokens[i].ptr, tokens[i].len) == 0)
                break;
            h = (h + 1) & t->spm_mask;
        }
        t->spm_slots[h] = (int32_t)i;
    }
    return build_pieces(t, tokens, types);
}

/* ---- encoding ---- */

size_t tok__spm_normalized_len(const struct tokenizer *t, const uint8_t *s, size_t n)
{
    size_t need = n > 0 && t->add_space_prefix ? SPACE_MARK_LEN : 0;

    for (size_t i = 0; i < n; i++)
        need += s[i] == ' ' ? SPACE_MARK_LEN : 1;
    return need;
}

int tok__spm_normalize(const struct tokenizer *t, const uint8_t *s, size_t n, uint8_t **out,
                       size_t *out_len)
{
    size_t need = tok__spm_normalized_len(t, s, n);
    size_t m = 0;
    uint8_t *buf;

    buf = malloc(need ? need : 1);
    if (!buf)
        return -ENOMEM;
    if (n > 0 && t->add_space_prefix) {
        memcpy(buf, SPACE_MARK, SPACE_MARK_LEN);
        m = SPACE_MARK_LEN;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(buf + m, SPACE_MARK, SPACE_MARK_LEN);
            m += SPACE_MARK_LEN;
        } else {
            buf[m++] = s[i];
        }
    }
    *out = buf;
    *out_len = m;
    return 0;
}

static void push_pair(struct encoder *e, size_t *nh, int32_t left)
{
    const struct tok_sym *a = &e->sym[left];
    const struct tok_sym *b = &e->sym[a->next];
    int32_t size = a->len + b->len;
    int32_t id = vocab_find(e->t, e->spm_text + a->off, (size_t)size);

    if (id >= 0) /* higher score first */
        tok__merge_push(
            e->heap, nh,
            (struct tok_merge){.key = -(double)e->t->spm_scores[id], .pos = left, .aux = size});
}

/* The tokens of one final symbol: itself, or its bytes. */
static void emit_symbol(struct encoder *e, const uint8_t *s, size_t n)
{
    const struct tokenizer *t = e->t;
    int32_t id = vocab_find(t, s, n);
    size_t k = 0;

    if (id >= 0) {
        tok__emit(e, id);
        return;
    }
    while (k < n && t->byte_tok[s[k]] >= 0)
        k++;
    if (k == n) {
        for (k = 0; k < n; k++)
            tok__emit(e, t->byte_tok[s[k]]);
    } else if (t->unk >= 0) {
        tok__emit(e, t->unk);
    }
}

void tok__spm_stretch(struct encoder *e, const uint8_t *s, size_t n)
{
    size_t nh = 0;
    int32_t ns = 0;
    int rc;

    if (n == 0)
        return;
    if (e->t->spm_keeps_all && tok__beyond(e, n))
        return; /* too many tokens: no merge scratch for a stretch that long */
    if ((rc = tok__reserve(e, n)) < 0) {
        e->err = rc;
        return;
    }
    e->spm_text = s;

    /* one symbol per character */
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t l = tok__utf8_next(s + i, n - i, &cp);
        e->sym[ns] =
            (struct tok_sym){.off = (int32_t)i, .len = (int32_t)l, .prev = ns - 1, .next = ns + 1};
        ns++;
        i += l;
    }
    e->sym[ns - 1].next = -1;

    /* merge by score */
    for (int32_t i = 0; i + 1 < ns; i++)
        push_pair(e, &nh, i);
    while (nh > 0) {
        struct tok_merge top = tok__merge_pop(e->heap, &nh);
        struct tok_sym *a = &e->sym[top.pos];
        struct tok_sym *b;

        if (a->len == 0 || a->next < 0)
            continue;
        b = &e->sym[a->next];
        if (b->len == 0 || a->len + b->len != top.aux)
            continue;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0)
            e->sym[b->next].prev = top.pos;
        if (a->prev >= 0)
            push_pair(e, &nh, a->prev);
        if (a->next >= 0)
            push_pair(e, &nh, top.pos);
    }

    /* emit, with byte fallback */
    for (int32_t i = 0; i >= 0; i = e->sym[i].next)
        emit_symbol(e, s + e->sym[i].off, (size_t)e->sym[i].len);
}
