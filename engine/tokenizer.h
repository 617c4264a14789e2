/*
 * tokenizer.h: the tokenizer of a GGUF file, from its tokenizer.ggml.* metadata.
 * tokenizer.ggml.model chooses the kind:
 *   "gpt2"  byte-level BPE (tokens, merges, token_type, bos/eos ids,
 *           add_bos_token, pre), exact against Hugging Face `tokenizers`;
 *   "llama" SentencePiece BPE (tokens, scores, token_type, add_space_prefix):
 *           merges by score, <0xXX> byte fallback, '▁' for space (Llama 2,
 *           Gemma), exact against `sentencepiece` (spm.c has the details).
 *
 * For "gpt2":
 * Pre-tokenizers (tokenizer.ggml.pre): "gpt2"/"default" use GPT-2's split
 * pattern; "smollm" first isolates every digit, then applies GPT-2's pattern.
 * Unicode categories come from utf8proc. Control tokens (token_type 3) are
 * matched as whole strings in the text when parse_special is set; user-defined
 * tokens (token_type 4) always, as Hugging Face matches non-special added
 * tokens. Token ids are those of Hugging Face `tokenizers` (tokenizer_impl.h lists
 * the deliberate differences).
 *
 * The rules for added tokens (CONTROL, USER_DEFINED) hold for both kinds.
 * Decoding maps each token back to its raw bytes. tok_stream holds back the
 * bytes of a UTF-8 character split across tokens, so a streamed piece is never
 * a broken sequence.
 */
#ifndef SS_TOKENIZER_H
#define SS_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct gguf_file;
struct tokenizer; /* opaque */

/* Builds a tokenizer from g. Returns 0 or -errno with a message in err; *out
 * is NULL on failure. The tokenizer copies what it needs: g may be freed after. */
int tok_load(struct tokenizer **out, const struct gguf_file *g, char *err, size_t err_len);
void tok_free(struct tokenizer *t);

int64_t tok_n_vocab(const struct tokenizer *t);
int32_t tok_bos(const struct tokenizer *t); /* -1 if none */
int32_t tok_eos(const struct tokenizer *t); /* -1 if none */
int tok_add_bos(const struct tokenizer *t); /* tokenizer.ggml.add_bos_token (default 0) */
/* 1 when encoding a text puts a space in front of it (SentencePiece's
 * add_space_prefix), which decoding its tokens gives back */
int tok_space_prefix(const struct tokenizer *t);
/* A note from loading, or NULL: an unknown tokenizer.ggml.pre, for which the
 * GPT-2 pattern is used, so ids may differ from the model's own tokenizer.
 * Returns a view valid until tok_free. */
const char *tok_warning(const struct tokenizer *t);
/* 1 if id ends generation: eos, eot (<|im_end|>, <|eot_id|>, <|end_of_text|>...). */
int tok_is_eog(const struct tokenizer *t, int32_t id);
/* 1 if id is a CONTROL token (tokenizer.ggml.token_type 3: <|im_start|>,
 * <bos>, <start_of_turn>...), whose text generated output leaves out unless
 * asked to show it, as llama.cpp and vLLM do. A token of no text is not one. */
int tok_is_control(const struct tokenizer *t, int32_t id);

/* Encodes text[0..len). Writes up to cap ids to out and returns the total
 * count needed (which may exceed cap: call again with a bigger buffer), or a
 * negative errno. add_bos prepends BOS when the model has one. parse_special
 * recognizes special/control token strings in text. */
int64_t tok_encode(const struct tokenizer *t, const char *text, size_t len, int add_bos,
                   int parse_special, int32_t *out, int64_t cap);

/* tok_encode for a text that may be refused as too long: stops as soon as the
 * count (BOS included) is known to exceed max_tokens (>= 0) and returns
 * max_tokens + 1, with out holding nothing useful. A count of at most
 * max_tokens is exact, with tok_encode's ids. The merge work and scratch
 * memory are bounded by max_tokens * tok_max_token_bytes(), whatever len is;
 * beyond that there are only linear scans (counting the text's bytes, and
 * skipping bytes that give no token). tokenizer_impl.h has the argument and
 * its one exception (a SentencePiece vocabulary with neither <unk> nor byte
 * fallback). tok_encode is this with max_tokens = INT64_MAX (no limit). */
int64_t tok_encode_max(const struct tokenizer *t, const char *text, size_t len, int add_bos,
                       int parse_special, int64_t max_tokens, int32_t *out, int64_t cap);

/* The most bytes of text one token stands for (SPM: of the text with each
 * ' ' spelled as the 3 bytes of '▁'): the longest piece or added token.
 * SmolLM2: 81 ("\n" and 80 spaces); Gemma 3: 93 (31 spaces, an added token). */
size_t tok_max_token_bytes(const struct tokenizer *t);

/* Raw bytes of token id (byte-level decoded). Returns a view valid until
 * tok_free; *len gets the length. Special tokens give their text. NULL for a
 * bad id. */
const char *tok_piece(const struct tokenizer *t, int32_t id, size_t *len);

/* Streaming detokenizer: holds back an incomplete UTF-8 tail. */
struct tok_stream {
    uint8_t pend[4];
    int n_pend;
    /* set by each tok_stream_push: how many bytes at the start of its output
     * end the text of earlier pieces, not this one's: 3 (a U+FFFD) when the
     * piece's first byte cannot continue the tail they left held, else 0.
     * A character the piece completes, or the U+FFFD of a sequence that took
     * some of its bytes, is not counted: it is text the piece shares with
     * the pieces it began in. */
    int n_earlier;
};
/* Appends the text of id to out (cap bytes) and returns the bytes written; only
 * complete UTF-8 sequences are written (invalid bytes become U+FFFD). out needs
 * room for the piece + 4 bytes (3 per byte if the piece is invalid UTF-8);
 * returns -ENOSPC, with s unchanged, if cap is too small, -EINVAL for a bad id.
 * Sets s->n_earlier on success. */
int64_t tok_stream_push(const struct tokenizer *t, struct tok_stream *s, int32_t id, char *out,
                        size_t cap);
/* Flushes a held-back tail at the end of a stream (as U+FFFD): all of its
 * output is the text of pieces already pushed. */
int64_t tok_stream_flush(struct tok_stream *s, char *out, size_t cap);

#endif
