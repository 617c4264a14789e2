/*
 * json_oracle.c: the JSON answer's grammar as a recursive-descent parser
 * (json_oracle.h). Each function parses one production at p->i and returns
 * 0 (parsed), INCOMPLETE (the text ran out inside it) or BAD.
 */
#include "support/json_oracle.h"

#include <stdint.h>
#include <string.h>

#include "engine/json_gram.h" /* the bounds */

struct p {
    const unsigned char *s;
    size_t n, i;
};

/* 0: parsed; INCOMPLETE: ran out; BAD */
static int ws(struct p *p)
{
    size_t run = 0;
    while (p->i < p->n && strchr(" \t\n\r", p->s[p->i]) && p->s[p->i]) {
        if (++run > JSON_GRAM_WS_MAX)
            return BAD;
        p->i++;
    }
    return p->i == p->n ? INCOMPLETE : 0;
}

/* A character of k bytes that starts at p->i (lead byte checked by the
 * caller); k - have continuation bytes are missing when the text ends. */
static int utf8_char(struct p *p, int k, uint32_t lead_bits)
{
    uint32_t cp = lead_bits;
    int have = 1;
    p->i++;
    while (have < k && p->i < p->n) {
        unsigned char c = p->s[p->i];
        if ((c & 0xC0) != 0x80)
            return BAD;
        cp = cp << 6 | (c & 0x3F);
        have++;
        p->i++;
    }
    /* the code points this prefix can still become: [lo, hi] */
    uint32_t lo = cp, hi = cp;
    for (int j = have; j < k; j++) {
        lo = lo << 6;
        hi = hi << 6 | 0x3F;
    }
    const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
    const uint32_t max[5] = {0, 0x7F, 0x7FF, 0xFFFF, 0x10FFFF};
    if (lo < min[k])
        lo = min[k];
    if (hi > max[k])
        hi = max[k];
    int ok = lo <= hi && !(lo >= 0xD800 && hi <= 0xDFFF);
    if (!ok)
        return BAD;
    if (have < k)
        return INCOMPLETE;
    return (cp >= 0xD800 && cp <= 0xDFFF) ? BAD : 0;
}

/* Four hex digits of a \u escape at p->i: 0 with the UTF-16 unit in *u;
 * cut short, INCOMPLETE if some digits would make a unit that ok() takes */
static int hex4(struct p *p, uint32_t *u, int (*ok)(uint32_t))
{
    *u = 0;
    for (int j = 0; j < 4; j++, p->i++) {
        if (p->i == p->n) {
            for (uint32_t v = *u << 4 * (4 - j); v < (*u + 1) << 4 * (4 - j); v++)
                if (ok(v))
                    return INCOMPLETE;
            return BAD;
        }
        const char *digits = "0123456789abcdef0123456789ABCDEF";
        const char *d = p->s[p->i] ? strchr(digits, p->s[p->i]) : NULL;
        if (!d)
            return BAD;
        *u = *u << 4 | (uint32_t)((d - digits) % 16);
    }
    return ok(*u) ? 0 : BAD;
}

static int not_low(uint32_t u)
{
    return u < 0xDC00 || u > 0xDFFF;
}

static int is_low(uint32_t u)
{
    return !not_low(u);
}

static int string(struct p *p)
{
    p->i++; /* the quote */
    for (;;) {
        if (p->i == p->n)
            return INCOMPLETE;
        unsigned char c = p->s[p->i];
        if (c == '\\' && p->i + 1 < p->n && p->s[p->i + 1] == 'u') {
            uint32_t u;
            int rc;
            p->i += 2;
            if ((rc = hex4(p, &u, not_low)))
                return rc;
            if (u >= 0xD800 && u <= 0xDBFF) { /* a high surrogate: "\\u" and a low one */
                for (const char *w = "\\u"; *w; w++, p->i++) {
                    if (p->i == p->n)
                        return INCOMPLETE;
                    if (p->s[p->i] != (unsigned char)*w)
                        return BAD;
                }
                if ((rc = hex4(p, &u, is_low)))
                    return rc;
            }
            continue;
        }
        if (c == '"') {
            p->i++;
            return 0;
        }
        if (c == '\\') {
            p->i++;
            if (p->i == p->n)
                return INCOMPLETE;
            c = p->s[p->i++];
            if (!strchr("\"\\/bfnrt", c) || !c) {
                return BAD;
            }
            continue;
        }
        if (c < 0x20)
            return BAD;
        if (c < 0x80) {
            p->i++;
            continue;
        }
        int rc;
        if ((c & 0xE0) == 0xC0)
            rc = utf8_char(p, 2, c & 0x1F);
        else if ((c & 0xF0) == 0xE0)
            rc = utf8_char(p, 3, c & 0x0F);
        else if ((c & 0xF8) == 0xF0)
            rc = utf8_char(p, 4, c & 0x07);
        else
            return BAD;
        if (rc)
            return rc;
    }
}

/* The digits at p->i. With at_least_one, none is BAD, or a cut (-1) where
 * the text ends. 0, or -1 when the text ends after them (a cut). */
static int digits(struct p *p, int at_least_one)
{
    size_t from = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
        p->i++;
    if (at_least_one && p->i == from)
        return p->i == p->n ? -1 : BAD;
    return p->i == p->n ? -1 : 0;
}

/* -? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)?, at most the bound's
 * bytes; cut short, a prefix if one more digit (when one is needed) fits */
static int number(struct p *p)
{
    const size_t start = p->i;
    int rc;
    size_t need = 0; /* the text ran out where a digit must come */
    if (p->s[p->i] == '-')
        p->i++;
    if (p->i < p->n && p->s[p->i] == '0')
        rc = ++p->i == p->n ? -1 : 0;
    else if (p->i < p->n && (p->s[p->i] < '1' || p->s[p->i] > '9'))
        return BAD;
    else {
        const size_t from = p->i;
        rc = digits(p, 1);
        need = rc == -1 && p->i == from; /* "-" alone */
    }
    for (int part = 0; rc == 0 && part < 2; part++) {
        if (part == 0 ? p->s[p->i] != '.' : (p->s[p->i] != 'e' && p->s[p->i] != 'E'))
            continue;
        p->i++;
        if (part == 1 && p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-'))
            p->i++;
        size_t from = p->i;
        rc = digits(p, 1);
        need = rc == -1 && p->i == from;
    }
    if (rc == BAD)
        return BAD;
    if (rc == -1) /* cut */
        return p->i - start + need > JSON_GRAM_NUM_MAX ? BAD : INCOMPLETE;
    return p->i - start > JSON_GRAM_NUM_MAX ? BAD : 0;
}

static int value(struct p *p, int depth);

/* an object or array whose opener is at p->i; depth counts it */
static int container(struct p *p, int depth)
{
    const int array = p->s[p->i] == '[';
    const unsigned char close = array ? ']' : '}';
    int rc;
    p->i++;
    if ((rc = ws(p)))
        return rc;
    if (p->s[p->i] == close) {
        p->i++;
        return 0;
    }
    for (;;) {
        if (!array) {
            if (p->s[p->i] != '"')
                return BAD;
            if ((rc = string(p)) || (rc = ws(p)))
                return rc;
            if (p->s[p->i] != ':')
                return BAD;
            p->i++;
            if ((rc = ws(p)))
                return rc;
        }
        if ((rc = value(p, depth)) || (rc = ws(p)))
            return rc;
        if (p->s[p->i] == close) {
            p->i++;
            return 0;
        }
        if (p->s[p->i] != ',')
            return BAD;
        p->i++;
        if ((rc = ws(p)))
            return rc;
    }
}

static int literal(struct p *p, const char *w)
{
    for (size_t j = 0; w[j]; j++, p->i++) {
        if (p->i == p->n)
            return INCOMPLETE;
        if (p->s[p->i] != (unsigned char)w[j])
            return BAD;
    }
    return 0;
}

/* a value at p->i, inside depth open containers */
static int value(struct p *p, int depth)
{
    unsigned char c = p->s[p->i];
    if (c == '{' || c == '[')
        return depth >= JSON_GRAM_DEPTH_MAX ? BAD : container(p, depth + 1);
    if (c == '"')
        return string(p);
    if (c == '-' || (c >= '0' && c <= '9'))
        return number(p);
    if (c == 't')
        return literal(p, "true");
    if (c == 'f')
        return literal(p, "false");
    if (c == 'n')
        return literal(p, "null");
    return BAD;
}

enum json_verdict json_oracle(const char *s, size_t n)
{
    struct p p = {(const unsigned char *)s, n, 0};
    int rc = ws(&p);
    if (rc)
        return rc;
    if (p.s[p.i] != '{')
        return BAD;
    if ((rc = container(&p, 1)))
        return rc;
    size_t run = 0;
    for (; p.i < n; p.i++)
        if (!strchr(" \t\n\r", p.s[p.i]) || !p.s[p.i] || ++run > JSON_GRAM_WS_MAX)
            return BAD;
    return COMPLETE;
}
