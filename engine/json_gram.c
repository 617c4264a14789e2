/*
 * json_gram.c: the JSON answer's grammar, one byte at a time (json_gram.h).
 *
 * Two layers, as a JSON parser has them. The lexical one (lex) reads the
 * inside of a string (with its escapes and multi-byte characters), a number
 * or a literal. The structural one (expect, with a stack of open containers
 * as bits) says which token may come next. A number has no closing byte: the
 * byte after it ends it, and then goes to the structural layer.
 */
#include "json_gram.h"

#include <string.h>

#include "utf8_seq.h"

enum expect {
    EXPECT_START,     /* the answer's first token: '{' */
    EXPECT_OBJ_FIRST, /* after '{': a key or '}' */
    EXPECT_OBJ_KEY,   /* after ',' in an object: a key */
    EXPECT_COLON,     /* after a key */
    EXPECT_VALUE,     /* after ':', or ',' in an array */
    EXPECT_ARR_FIRST, /* after '[': a value or ']' */
    EXPECT_AFTER,     /* after a value in a container: ',' or its closer */
    EXPECT_DONE,      /* the object is closed: whitespace only */
};

enum lex {
    LEX_NONE,
    LEX_STRING,
    LEX_ESCAPE, /* after a backslash */
    LEX_HEX,    /* in \uXXXX: left digits to go */
    LEX_UTF8,   /* in a character: lead and have bytes of it read */
    LEX_NUMBER,
    LEX_LITERAL,
};

/* A number's grammar: -? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)? */
enum num {
    NUM_MINUS, /* '-': a digit must follow */
    NUM_ZERO,  /* a leading 0: no digit may follow */
    NUM_INT,
    NUM_DOT, /* '.': a digit must follow */
    NUM_FRAC,
    NUM_E,      /* 'e' or 'E': a sign or a digit must follow */
    NUM_E_SIGN, /* a digit must follow */
    NUM_EXP,
};

static const char *const literals[3] = {"true", "false", "null"};

static int is_ws(unsigned char b)
{
    return b == ' ' || b == '\t' || b == '\n' || b == '\r';
}

static int is_digit(unsigned char b)
{
    return b >= '0' && b <= '9';
}

static int is_hex(unsigned char b)
{
    return is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F');
}

static int num_complete(enum num n)
{
    return n == NUM_ZERO || n == NUM_INT || n == NUM_FRAC || n == NUM_EXP;
}

/* The number's state after b, or -1 when b does not continue it. */
static int num_next(enum num n, unsigned char b)
{
    const int d = is_digit(b);
    switch (n) {
    case NUM_MINUS:
        return b == '0' ? NUM_ZERO : d ? NUM_INT : -1;
    case NUM_ZERO:
        return b == '.' ? NUM_DOT : (b == 'e' || b == 'E') ? NUM_E : -1;
    case NUM_INT:
        return d ? NUM_INT : b == '.' ? NUM_DOT : (b == 'e' || b == 'E') ? NUM_E : -1;
    case NUM_DOT:
        return d ? NUM_FRAC : -1;
    case NUM_FRAC:
        return d ? NUM_FRAC : (b == 'e' || b == 'E') ? NUM_E : -1;
    case NUM_E:
        return (b == '+' || b == '-') ? NUM_E_SIGN : d ? NUM_EXP : -1;
    case NUM_E_SIGN:
    case NUM_EXP:
        return d ? NUM_EXP : -1;
    }
    return -1;
}

/* A value ended: the container's ',' or closer comes next. */
static void value_done(struct json_gram *g)
{
    g->lex = LEX_NONE;
    g->expect = g->depth == 0 ? EXPECT_DONE : EXPECT_AFTER;
}

static int top_is_array(const struct json_gram *g)
{
    return (int)((g->arrays >> (g->depth - 1)) & 1);
}

static int open_container(struct json_gram *g, int array)
{
    if (g->depth >= JSON_GRAM_DEPTH_MAX)
        return 0;
    g->arrays = (g->arrays & ~((uint64_t)1 << g->depth)) | ((uint64_t)array << g->depth);
    g->depth++;
    g->expect = array ? EXPECT_ARR_FIRST : EXPECT_OBJ_FIRST;
    return 1;
}

static int close_container(struct json_gram *g)
{
    g->depth--;
    value_done(g);
    return 1;
}

/* The first byte of a value. */
static int value_start(struct json_gram *g, unsigned char b)
{
    if (b == '{' || b == '[')
        return open_container(g, b == '[');
    if (b == '"') {
        g->lex = LEX_STRING;
        g->key = 0;
        return 1;
    }
    if (b == '-' || is_digit(b)) {
        g->lex = LEX_NUMBER;
        g->num = b == '-' ? NUM_MINUS : b == '0' ? NUM_ZERO : NUM_INT;
        g->len = 1;
        return 1;
    }
    for (int i = 0; i < 3; i++)
        if (b == (unsigned char)literals[i][0]) {
            g->lex = LEX_LITERAL;
            g->lit = (uint8_t)i;
            g->at = 1;
            return 1;
        }
    return 0;
}

/* A byte outside strings, numbers and literals. */
static int structural(struct json_gram *g, unsigned char b)
{
    if (is_ws(b)) {
        if (g->len >= JSON_GRAM_WS_MAX)
            return 0;
        g->len++;
        return 1;
    }
    g->len = 0;
    switch ((enum expect)g->expect) {
    case EXPECT_START:
        return b == '{' && open_container(g, 0);
    case EXPECT_OBJ_FIRST:
        if (b == '}')
            return close_container(g);
        /* fall through */
    case EXPECT_OBJ_KEY:
        if (b != '"')
            return 0;
        g->lex = LEX_STRING;
        g->key = 1;
        return 1;
    case EXPECT_COLON:
        if (b != ':')
            return 0;
        g->expect = EXPECT_VALUE;
        return 1;
    case EXPECT_ARR_FIRST:
        if (b == ']')
            return close_container(g);
        /* fall through */
    case EXPECT_VALUE:
        return value_start(g, b);
    case EXPECT_AFTER:
        if (b == ',') {
            g->expect = top_is_array(g) ? EXPECT_VALUE : EXPECT_OBJ_KEY;
            return 1;
        }
        if (b == (top_is_array(g) ? ']' : '}'))
            return close_container(g);
        return 0;
    case EXPECT_DONE:
        return 0;
    }
    return 0;
}

/* A byte inside a string (after its opening quote). */
static int in_string(struct json_gram *g, unsigned char b)
{
    if (g->low && b != '\\')
        return 0; /* a high surrogate's escape: its low one's must follow */
    if (b == '"') {
        if (g->key) {
            g->lex = LEX_NONE;
            g->expect = EXPECT_COLON;
        } else {
            value_done(g);
        }
        return 1;
    }
    if (b == '\\') {
        g->lex = LEX_ESCAPE;
        return 1;
    }
    if (b < 0x20)
        return 0; /* a raw control character */
    if (b < 0x80)
        return 1;
    if (utf8_seq_len(b) < 2)
        return 0; /* not a character's lead byte (utf8_seq.h) */
    g->lead = b;
    g->have = 1;
    g->lex = LEX_UTF8;
    return 1;
}

static int feed_byte(struct json_gram *g, unsigned char b)
{
    switch ((enum lex)g->lex) {
    case LEX_STRING:
        return in_string(g, b);
    case LEX_UTF8:
        if (!utf8_continues(g->lead, g->have, b))
            return 0;
        if (++g->have == utf8_seq_len(g->lead))
            g->lex = LEX_STRING;
        return 1;
    case LEX_ESCAPE:
        if (b == 'u') {
            g->lex = LEX_HEX;
            g->left = 4;
            g->unit = 0;
            return 1;
        }
        if (g->low)
            return 0;
        if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' ||
            b == 't') {
            g->lex = LEX_STRING;
            return 1;
        }
        return 0;
    case LEX_HEX: {
        if (!is_hex(b))
            return 0;
        int d = is_digit(b) ? b - '0' : (b | 0x20) - 'a' + 10;
        uint16_t unit = (uint16_t)(g->unit << 4 | d);
        /* the units the digits so far can still make: [lo, hi] */
        int rest = 4 * (g->left - 1);
        uint32_t lo = (uint32_t)unit << rest, hi = lo | ((1u << rest) - 1);
        if (g->low ? (hi < 0xDC00 || lo > 0xDFFF) : (lo >= 0xDC00 && hi <= 0xDFFF))
            return 0; /* a low surrogate must follow a high one, and only one */
        g->unit = unit;
        if (--g->left == 0) {
            g->lex = LEX_STRING;
            g->low = unit >= 0xD800 && unit <= 0xDBFF;
        }
        return 1;
    }
    case LEX_LITERAL: {
        const char *w = literals[g->lit];
        if (b != (unsigned char)w[g->at])
            return 0;
        if (w[++g->at] == 0)
            value_done(g);
        return 1;
    }
    case LEX_NUMBER: {
        int next = num_next((enum num)g->num, b);
        if (next >= 0) {
            /* within the bound, with room for the digit an unfinished
             * number still needs */
            if (g->len + 1 + !num_complete((enum num)next) > JSON_GRAM_NUM_MAX)
                return 0;
            g->num = (uint8_t)next;
            g->len++;
            return 1;
        }
        if (!num_complete((enum num)g->num))
            return 0;
        value_done(g); /* b ends the number and is read as what follows it */
        g->len = 0;
        return structural(g, b);
    }
    case LEX_NONE:
        return structural(g, b);
    }
    return 0;
}

void json_gram_init(struct json_gram *g)
{
    *g = (struct json_gram){.expect = EXPECT_START, .lex = LEX_NONE};
}

int json_gram_feed(struct json_gram *g, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!feed_byte(g, (unsigned char)p[i]))
            return 0;
    return 1;
}

int json_gram_done(const struct json_gram *g)
{
    return g->expect == EXPECT_DONE && g->lex == LEX_NONE;
}

int json_gram_between(const struct json_gram *g)
{
    return g->lex == LEX_NONE || g->lex == LEX_NUMBER;
}

int json_gram_in_string(const struct json_gram *g)
{
    return g->lex == LEX_STRING && !g->low;
}

int json_gram_string_piece(const char *p, size_t n)
{
    if (n == 0 || memchr(p, '"', n))
        return 0; /* a quote would end the string: what follows depends on which */
    struct json_gram g;
    json_gram_init(&g);
    if (!json_gram_feed(&g, "{\"", 2))
        return 0;
    return json_gram_feed(&g, p, n) && json_gram_in_string(&g);
}
