/*
 * json_gram.h: the grammar of a JSON answer (response_format json_object),
 * as a byte automaton the sampler asks before every token. Internal to
 * engine/.
 *
 * The language is one JSON object (RFC 8259: strings of valid UTF-8 with no
 * raw control characters, escapes as the RFC lists them, numbers in its
 * grammar, true/false/null), with whitespace around the tokens, plus a rule
 * the RFC leaves to parsers (a \u escape of a UTF-16 surrogate comes in a
 * high-low pair, so that strict parsers read the answer too) and three
 * bounds that keep a sampled answer from running on inside the grammar:
 *
 *   - at most JSON_GRAM_WS_MAX whitespace bytes in a row (a model that loops
 *     on newlines must write a token after that many);
 *   - at most JSON_GRAM_NUM_MAX bytes in a number (a double needs 24);
 *   - at most JSON_GRAM_DEPTH_MAX nested objects and arrays.
 *
 * Its contract, for any byte string S fed in any number of pieces:
 * json_gram_feed accepts every piece iff S is a prefix of a string of that
 * language (every byte has a continuation that stays in it: there is no dead
 * end short of a complete answer), and json_gram_done says whether S holds
 * the whole object (only whitespace may follow it, within the bound). The
 * test (tests/unit/test_json_gram.c) checks it against a recursive-descent
 * parser written separately.
 *
 * The state is a small plain struct: the sampler copies it to try a token.
 */
#ifndef SS_JSON_GRAM_H
#define SS_JSON_GRAM_H

#include <stddef.h>
#include <stdint.h>

#define JSON_GRAM_WS_MAX 64
#define JSON_GRAM_NUM_MAX 32
#define JSON_GRAM_DEPTH_MAX 64

struct json_gram {
    uint64_t arrays; /* bit d: the container at depth d (0 = outermost) is an array */
    uint8_t depth;   /* containers open */
    uint8_t expect;  /* enum in json_gram.c: what the structure takes next */
    uint8_t lex;     /* enum in json_gram.c: inside a string, number or literal */
    uint8_t key;     /* the string being read is an object's key */
    uint8_t left;    /* hex digits of a \u escape */
    uint8_t low;     /* a high surrogate's escape came: its low one must follow */
    uint16_t unit;   /* the \u escape's digits so far */
    uint8_t lead;    /* a character's lead byte ... */
    uint8_t have;    /* ... and its bytes read so far */
    uint8_t num;     /* the number's state */
    uint8_t lit;     /* which of true, false, null */
    uint8_t at;      /* ... and the letters of it read */
    uint16_t len;    /* bytes of the number, or of the whitespace run */
};

/* The state before the answer's first byte. */
void json_gram_init(struct json_gram *g);
/* Feeds p[0..n). Returns 1 if every byte keeps the text a prefix of the
 * language (g then holds the new state), 0 if one does not (g is then left
 * in an undefined state: try a copy). */
int json_gram_feed(struct json_gram *g, const char *p, size_t n);
/* 1 if the text fed so far is a whole answer. */
int json_gram_done(const struct json_gram *g);
/* 1 if whitespace here is whitespace between tokens (outside strings and
 * literals): every whitespace byte then does the same. */
int json_gram_between(const struct json_gram *g);
/* 1 if the text is inside a string, not in an escape or a character. */
int json_gram_in_string(const struct json_gram *g);
/* 1 if p[0..n) (n > 0) read in such a state leaves it in such a state,
 * whatever the string (a key or a value, at any depth): no quote, whole
 * characters and escapes. The sampler takes such a token there without
 * reading it. */
int json_gram_string_piece(const char *p, size_t n);

#endif
