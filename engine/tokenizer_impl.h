/*
 * tokenizer_impl.h: GPT-2 byte-level BPE from a GGUF file's tokenizer.ggml.*
 * metadata, exact against Hugging Face `tokenizers` (tests/unit/test_tokenizer.c
 * checks every case of tests/fixtures/tokenizer_ids.txt, which
 * tools/make_tokenizer_fixture.py makes with HF). SentencePiece vocabularies
 * (kind TOK_SPM) share step 1 and the decoding; spm.c describes the rest
 * (tests/unit/test_tokenizer_spm.c, tools/make_spm_tokenizer_fixture.py).
 *
 * Encoding does what HF does, in three steps:
 *   1. added tokens: the text is cut at the strings of CONTROL tokens (only
 *      with parse_special) and USER_DEFINED tokens (always, as HF matches
 *      non-special added tokens always); leftmost match first, the longest at
 *      that place (a byte trie: each place costs at most the longest added
 *      token's length);
 *   2. pre-tokenizer, on each stretch between those: "smollm" first isolates
 *      every \p{N} code point (HF Digits(individual_digits=true)), then GPT-2's
 *      pattern cuts each remaining stretch into words:
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      split_gpt2() is a hand-written matcher equivalent to that regex, with
 *      Unicode categories from utf8proc;
 *   3. BPE on each word: one symbol per byte (its byte-level token), then the
 *      adjacent pair with the lowest merge rank merges, leftmost on ties, until
 *      no pair has a rank. A heap of candidate pairs makes a word O(n log n);
 *      stale entries are skipped with the same test HF uses, so even merges
 *      that give the same token from different pairs agree with HF.
 *
 * Decoding maps each character of a token back to its byte (GPT-2's
 * bytes_to_unicode); a token with a character outside that alphabet gives its
 * raw text, as HF's ByteLevel decoder does. That includes special tokens.
 *
 * Where this differs from HF, on purpose:
 *   - HF only takes valid UTF-8. Here an invalid byte is one "other" character
 *     for the pattern and becomes its byte's token, so such text round trips.
 *   - tokenizer.ggml.pre values other than "smollm", "gpt2", "gpt-2" and
 *     "default" use GPT-2's pattern and set tok_warning().
 * And not on purpose: categories follow utf8proc's Unicode version (15.0 for
 * Debian's 2.8), HF's regex and Digits a newer one (16.0), so a code point
 * first assigned after 15.0 (CJK Extension I, U+2EBF0.., from 15.1;
 * Egyptian Hieroglyphs Ext-A, U+13460.., from 16.0) is "other" here and a
 * letter there: 5,004 code points in all, 93 more split as digits there
 * (docs/testing.md). Every code point assigned by 15.0 agrees.
 * Like HF, a byte with no single-byte token (SmolLM2 lacks 21, e.g. 0x04) is
 * dropped, and a merge whose parts or result are not in the vocab is ignored
 * (HF refuses to load those).
 *
 * After tok_load nothing is written: one tokenizer may encode on several
 * threads at once. Each tok_encode allocates its own scratch.
 *
 * A limit on the count (tok_encode_max) bounds the work by the limit, not by
 * the text: no token stands for more than max_token_bytes bytes of the text
 * (normalized, for SPM), so a text, a word or a stretch of B bytes that can
 * give tokens has at least ceil(B / max_token_bytes) of them. That lower bound
 * refuses a text before anything else is done, and a word or stretch before
 * its merge scratch is allocated; once the count passes the limit, encoding
 * stops. The bytes counted are those that always give a token: for BPE the
 * bytes with a byte token (the others are dropped, as HF does); for SPM every
 * byte when the vocabulary has an unknown token or all 256 byte tokens (no
 * character can then vanish), else none (no bound but the count: no model we
 * load lacks both). Counts within the limit, and their ids, are tok_encode's.
 *
 * The files, one noun each, share the structs and the tok__ functions below
 * (internal to engine/; tokenizer.h is the public side):
 *   pretok.c  UTF-8 and Unicode classes (utf8proc); step 2, the pre-tokenizers
 *   bpe.c     vocab and merges from GGUF (tok_load); steps 1 and 3; tok_encode
 *   detok.c   token pieces (bytes_to_unicode reversed); the tok_stream decoder
 *   spm.c     SentencePiece vocabularies (tokenizer.ggml.model "llama"): loading,
 *             the encoding of a stretch between added tokens, pieces
 */
#ifndef SS_TOKENIZER_IMPL_H
#define SS_TOKENIZER_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

struct gguf_str;

/* Character classes of the GPT-2 pattern. */
enum char_class {
    CC_OTHER,  /* [^\s\p{L}\p{N}], and invalid UTF-8 bytes */
    CC_LETTER, /* \p{L} */
    CC_NUMBER, /* \p{N} */
    CC_SPACE,  /* \s as Oniguruma has it: White_Space */
};

#define CP_INVALID 0xFFFFFFFFu
#define BYTE_ALPHABET_END 324 /* bytes_to_unicode maps into [0, 324) */

struct merge_slot { /* open addressing; id < 0 marks an empty slot */
    uint64_t key;   /* left id << 32 | right id */
    int32_t rank;   /* index in tokenizer.ggml.merges */
    int32_t id;     /* the merged token */
};

struct special { /* a CONTROL or USER_DEFINED token, matched as a whole string */
    size_t off;  /* its text in tokenizer.special_text */
    size_t len;
    int32_t id;
    int control; /* matched only with parse_special */
};

struct trie_edge { /* open addressing; child < 0 marks an empty slot */
    uint64_t key;  /* parent node << 8 | byte */
    int32_t child;
};

enum tok_kind {
    TOK_BPE, /* tokenizer.ggml.model "gpt2": byte-level BPE (bpe.c) */
    TOK_SPM, /* "llama": SentencePiece BPE by score, byte fallback (spm.c) */
};

struct tokenizer {
    enum tok_kind kind;
    size_t n_vocab;    /* 1 .. INT32_MAX */
    char *pieces;      /* decoded bytes of every token, back to back */
    size_t *piece_off; /* [n_vocab + 1]: token i is pieces[piece_off[i] .. piece_off[i+1]) */
    uint8_t *eog;      /* [n_vocab]: 1 if the token ends generation */

    struct merge_slot *merges; /* [merge_mask + 1] */
    size_t merge_mask;
    int32_t byte_tok[256]; /* token of each single byte (SPM: <0xXX>), -1 if none */

    /* SPM only (spm.c) */
    float *spm_scores;    /* [n_vocab] tokenizer.ggml.scores: higher merges first */
    char *spm_raw;        /* token texts as stored ('▁' for space), back to back */
    size_t *spm_raw_off;  /* [n_vocab + 1] */
    int32_t *spm_slots;   /* [spm_mask + 1] open addressing over NORMAL and USER_DEFINED */
    size_t spm_mask;      /* tokens by raw text; -1 marks an empty slot */
    size_t spm_max_len;   /* longest of those, in bytes */
    int add_space_prefix; /* tokenizer.ggml.add_space_prefix (default 1) */

    struct special *specials; /* sorted by id */
    int32_t n_special;
    char *special_text;
    /* A byte trie of the specials' texts, so matching at a place costs at most
     * the longest special's length, however many specials share a prefix
     * (Gemma has 6,000 starting with '<'). Node 0 is the root. */
    int32_t trie_root[256]; /* child of the root for each byte, -1 if none */
    struct trie_edge *trie; /* [trie_mask + 1] the other edges */
    size_t trie_mask;
    int32_t *trie_any;  /* [n_nodes] the special (index) spelled by the node, -1 if none */
    int32_t *trie_user; /* [n_nodes] the same, USER_DEFINED only (matched without parse_special) */

    uint8_t ascii_class[128]; /* enum char_class of each ASCII code point */
    int split_digits;         /* pre = smollm */

    /* The most bytes of text (normalized, for SPM) one token stands for: the
     * longest piece or special; for SPM also 4, the longest character that
     * falls back to <unk>. At least 1. */
    size_t max_token_bytes;
    int spm_keeps_all; /* SPM: an unknown token or all 256 byte tokens */

    int32_t bos, eos, eot, eom, pad, unk; /* -1 if absent */
    int add_bos;
    char warning[200];
};

/* One symbol of the word (BPE) or stretch (SPM) being merged, in a linked
 * list of live symbols (-1 at the ends). */
struct tok_sym {
    int32_t id;  /* BPE: its token; -1 once merged into its left neighbour */
    int32_t off; /* SPM: bytes [off, off + len) of the text; len 0 once merged */
    int32_t len;
    int32_t prev;
    int32_t next;
};

/* A candidate merge of symbol pos with its right neighbour. The heap pops the
 * lowest key first, the leftmost on ties: BPE keys by merge rank (aux = the
 * merged token), SPM by minus the merged piece's score (aux = the pair's bytes
 * when pushed). A double holds both exactly. */
struct tok_merge {
    double key;
    int32_t pos;
    int32_t aux;
};

struct encoder { /* one tok_encode call */
    const struct tokenizer *t;
    int32_t *out;
    int64_t cap;
    int64_t n;
    int64_t max; /* stop once n is known to pass it; INT64_MAX: never */
    int over;    /* n passed max: encoding stopped (not an error) */
    /* merge scratch, grown to the longest word or stretch (tok__reserve) */
    struct tok_sym *sym;
    struct tok_merge *heap;  /* at most n - 1 initial pairs plus two per merge */
    size_t scratch_cap;      /* symbols */
    const uint8_t *spm_text; /* the stretch being merged (spm.c) */
    int err;
};

struct gguf_file;

/* bpe.c: output, the limit, the merge scratch and its heap, shared by both
 * vocabularies */
void tok__emit(struct encoder *e, int32_t id);
/* 1 (and e->over set) if bytes more bytes that always give tokens take the
 * count past e->max; else 0. */
int tok__beyond(struct encoder *e, size_t bytes);
int tok__reserve(struct encoder *e, size_t n_sym);
void tok__merge_push(struct tok_merge *h, size_t *n, struct tok_merge it);
struct tok_merge tok__merge_pop(struct tok_merge *h, size_t *n);

/* pretok.c */
size_t tok__utf8_next(const uint8_t *s, size_t n, uint32_t *cp);
enum char_class tok__classify(uint32_t cp);
void tok__encode_stretch(struct encoder *e, const uint8_t *s, size_t n);

/* bpe.c */
void tok__bpe_word(struct encoder *e, const uint8_t *w, size_t n);
uint64_t tok__hash_bytes(const char *s, size_t n);

/* spm.c */
int tok__spm_load(struct tokenizer *t, const struct gguf_file *g, const struct gguf_str *tokens,
                  const int32_t *types, char *err, size_t err_len);
/* The length of s[0..n) normalized (below), without normalizing it. */
size_t tok__spm_normalized_len(const struct tokenizer *t, const uint8_t *s, size_t n);
/* The text as SentencePiece's normalizer leaves it: ' ' -> '▁', and a leading
 * '▁' with add_space_prefix. *out is malloc'd (caller frees). */
int tok__spm_normalize(const struct tokenizer *t, const uint8_t *s, size_t n, uint8_t **out,
                       size_t *out_len);
/* Encodes s[0..n), a stretch of normalized text between added tokens. */
void tok__spm_stretch(struct encoder *e, const uint8_t *s, size_t n);

/* detok.c */
int tok__build_pieces(struct tokenizer *t, const struct gguf_str *tokens,
                      const uint32_t byte_cp[256]);

#endif
