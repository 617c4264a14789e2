/*
 * test_json_gram.c: the JSON answer's automaton (engine/json_gram.h) against
 * an oracle written separately (tests/support/json_oracle.c): a
 * recursive-descent parser over the whole
 * text that says COMPLETE (one object, then at most the bound's whitespace),
 * INCOMPLETE (the text ran out inside it: a prefix) or BAD. It checks UTF-8
 * by decoding each character and asking whether some completion of a cut
 * one is a valid scalar value, where the automaton narrows byte ranges.
 *
 * The texts: random objects written by a generator (nesting past the depth
 * bound, numbers near their bound, whitespace runs near theirs, escapes,
 * characters of 1 to 4 bytes, bad bytes), every prefix of each, and
 * mutations (a byte replaced, inserted or deleted). The automaton reads
 * each text in random pieces, as tokens come. Along the way: every complete
 * text parses with cJSON as an object, every accepted prefix can be
 * completed (a walk that takes the first byte it accepts from a short list
 * reaches a whole answer), and hand-picked texts meet the RFC's corners.
 */
#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/json_gram.h"
#include "support/json_oracle.h"
#include "support/rng.h"
#include "test.h"

/* ---- the automaton, read in random pieces ---------------------------------- */

static uint64_t rng = 0x5DEECE66Dull;

static size_t below(size_t n)
{
    return (size_t)test_rng_below(&rng, n);
}

static enum json_verdict automaton(const char *s, size_t n)
{
    struct json_gram g;
    json_gram_init(&g);
    for (size_t i = 0; i < n;) {
        size_t k = 1 + below(8);
        if (k > n - i)
            k = n - i;
        if (!json_gram_feed(&g, s + i, k))
            return BAD;
        i += k;
    }
    return json_gram_done(&g) ? COMPLETE : INCOMPLETE;
}

/* ---- the generator --------------------------------------------------------- */

struct out {
    char b[1 << 16];
    size_t n;
};

static void put(struct out *o, const char *s, size_t n)
{
    if (o->n + n < sizeof o->b) {
        memcpy(o->b + o->n, s, n);
        o->n += n;
    }
}

static void puts_(struct out *o, const char *s)
{
    put(o, s, strlen(s));
}

static void gen_ws(struct out *o)
{
    size_t k = below(4) == 0 ? below(4) : 0;
    if (below(40) == 0)
        k = JSON_GRAM_WS_MAX - 2 + below(4); /* at the bound, or one past it */
    for (size_t j = 0; j < k; j++)
        put(o, &" \t\n\r"[below(4)], 1);
}

static void gen_string(struct out *o)
{
    static const char *const parts[] = {
        "a",
        "Z",
        " ",
        "\\n",
        "\\\"",
        "\\\\",
        "\\/",
        "\\u00e9",
        "\\uD83D\\uDE00",
        "é",
        "€",
        "😀",
        "\xed\x9f\xbf",
        "\xef\xbf\xbf",
        "\xf4\x8f\xbf\xbf",
        "'",
        "{",
        "]",
        ":",
        ",",
        /* not JSON: a raw control character, a bad escape, bad UTF-8 */
        "\x01",
        "\\x",
        "\\u12G4",
        "\xc0\xaf",
        "\xe0\x9f\xbf",
        "\xf0\x8f\xbf\xbf",
        "\xed\xa0\x80",
        "\xf4\x90\x80\x80",
        "\xff",
        "\x80",
    };
    const size_t n_good = 20;
    put(o, "\"", 1);
    size_t k = below(6);
    for (size_t j = 0; j < k; j++) {
        size_t pick =
            below(200) == 0 ? n_good + below(sizeof parts / sizeof *parts - n_good) : below(n_good);
        puts_(o, parts[pick]);
    }
    put(o, "\"", 1);
}

static void gen_number(struct out *o)
{
    char buf[128];
    size_t n = 0;
    if (below(2))
        buf[n++] = '-';
    size_t int_digits = below(3) == 0 ? 0 : 1 + below(below(10) == 0 ? 34 : 4);
    if (int_digits == 0) {
        buf[n++] = '0';
    } else {
        buf[n++] = (char)('1' + below(9));
        for (size_t j = 1; j < int_digits; j++)
            buf[n++] = (char)('0' + below(10));
    }
    if (below(3) == 0) {
        buf[n++] = '.';
        size_t k = 1 + below(4);
        for (size_t j = 0; j < k; j++)
            buf[n++] = (char)('0' + below(10));
    }
    if (below(4) == 0) {
        buf[n++] = below(2) ? 'e' : 'E';
        if (below(2))
            buf[n++] = below(2) ? '+' : '-';
        size_t k = 1 + below(3);
        for (size_t j = 0; j < k; j++)
            buf[n++] = (char)('0' + below(10));
    }
    put(o, buf, n);
}

static void gen_value(struct out *o, int depth, int deep);

static void gen_container(struct out *o, int array, int depth, int deep)
{
    put(o, array ? "[" : "{", 1);
    gen_ws(o);
    size_t k = deep ? 1 : below(4);
    for (size_t j = 0; j < k; j++) {
        if (j) {
            put(o, ",", 1);
            gen_ws(o);
        }
        if (!array) {
            gen_string(o);
            gen_ws(o);
            put(o, ":", 1);
            gen_ws(o);
        }
        gen_value(o, depth + 1, deep);
        gen_ws(o);
    }
    put(o, array ? "]" : "}", 1);
}

static void gen_value(struct out *o, int depth, int deep)
{
    if (deep && depth < JSON_GRAM_DEPTH_MAX + 2) {
        gen_container(o, (int)below(2), depth, deep);
        return;
    }
    size_t kind = depth > 5 ? 2 + below(4) : below(6);
    switch (kind) {
    case 0:
    case 1:
        gen_container(o, (int)kind, depth, 0);
        break;
    case 2:
        gen_string(o);
        break;
    case 3:
        gen_number(o);
        break;
    default:
        puts_(o, (const char *[]){"true", "false", "null"}[below(3)]);
        break;
    }
}

static void gen_doc(struct out *o)
{
    o->n = 0;
    gen_ws(o);
    if (below(50) == 0) /* not an object */
        gen_value(o, 1, 0);
    else
        gen_container(o, 0, 1, below(20) == 0);
    gen_ws(o);
}

/* ---- the tests -------------------------------------------------------------- */

static const char *verdict_name(enum json_verdict v)
{
    return v == COMPLETE ? "complete" : v == INCOMPLETE ? "incomplete" : "bad";
}

/* the automaton and the oracle agree on s[0..n); a complete text is an
 * object for cJSON too */
static int agree(const char *s, size_t n)
{
    enum json_verdict want = json_oracle(s, n), got = automaton(s, n);
    if (want != got) {
        fprintf(stderr, "  %zu bytes: oracle %s, automaton %s: [%.*s]\n", n, verdict_name(want),
                verdict_name(got), (int)(n > 300 ? 300 : n), s);
        return 0;
    }
    if (want == COMPLETE) {
        cJSON *j = cJSON_ParseWithLength(s, n);
        int ok = j && cJSON_IsObject(j);
        cJSON_Delete(j);
        if (!ok) {
            fprintf(stderr, "  cJSON does not read [%.*s] as an object\n", (int)n, s);
            return 0;
        }
    }
    return 1;
}

/* From an accepted state, taking the first accepted byte of a short list
 * reaches a whole answer: the grammar has no dead end short of one. */
static int completes(struct json_gram g)
{
    static const char order[] = "\"}]:0truefalsn{\\udc\x80\x90\xa0";
    for (int steps = 0; steps < 4096; steps++) {
        if (json_gram_done(&g))
            return 1;
        int moved = 0;
        for (size_t j = 0; j + 1 < sizeof order && !moved; j++) {
            struct json_gram t = g;
            if (json_gram_feed(&t, &order[j], 1)) {
                g = t;
                moved = 1;
            }
        }
        if (!moved)
            return 0;
    }
    return 0;
}

TEST(rfc_corners)
{
    static const struct {
        const char *text;
        enum json_verdict v;
    } cases[] = {
        {"{}", COMPLETE},
        {" \n{ } \t", COMPLETE},
        {"{\"a\":1}", COMPLETE},
        {"{\"a\":[1,-0,0.5,1e5,1E+5,-2.5e-3,true,false,null,\"\",{},[]]}", COMPLETE},
        {"{\"\\u00e9\\\"\\\\\\/\\b\\f\\n\\r\\t\":\"😀\"}", COMPLETE},
        {"{\"a\":01}", BAD},               /* a leading zero */
        {"{\"a\":1.}", BAD},               /* no digit after the point */
        {"{\"a\":.5}", BAD},               /* no digit before it */
        {"{\"a\":+1}", BAD},               /* no plus sign */
        {"{\"a\":1e}", BAD},               /* no exponent digits */
        {"{\"a\":NaN}", BAD},              /* not JSON */
        {"{\"a\":tru}", BAD},              /* a cut literal */
        {"{\"a\":1,}", BAD},               /* a trailing comma */
        {"{,}", BAD},                      /* no member */
        {"{\"a\" 1}", BAD},                /* no colon */
        {"{'a':1}", BAD},                  /* single quotes */
        {"{\"a\":\"\t\"}", BAD},           /* a raw tab in a string */
        {"{\"a\":\"\\x\"}", BAD},          /* a bad escape */
        {"{\"\xc0\xaf\":1}", BAD},         /* overlong UTF-8 */
        {"{\"\xe0\x9f\xbf\":1}", BAD},     /* overlong in three bytes */
        {"{\"\xf0\x8f\xbf\xbf\":1}", BAD}, /* overlong in four */
        {"{\"\xe0\xa0\x80\xf0\x90\x80\x80\xed\x9f\xbf\xf4\x8f\xbf\xbf\":1}", COMPLETE},
        {"{\"\xed\xa0\x80\":1}", BAD},     /* a surrogate */
        {"{\"\xf4\x90\x80\x80\":1}", BAD}, /* past U+10FFFF */
        {"[1]", BAD},                      /* not an object */
        {"\"a\"", BAD},
        {"{}{}", BAD}, /* two objects */
        {"{}x", BAD},
        {"{\"a\":[1,2", INCOMPLETE},
        {"{\"a\":-", INCOMPLETE},
        {"{\"a\":\"\xf0\x9f", INCOMPLETE}, /* a cut character */
        {"{\"a\":\"\\u00", INCOMPLETE},
        {"{\"\\uD83D\\uDE00\":1}", COMPLETE}, /* a surrogate pair */
        {"{\"\\uD83D\":1}", BAD},             /* a high surrogate alone */
        {"{\"\\uDE00\":1}", BAD},             /* a low one alone */
        {"{\"\\uD83D\\n\":1}", BAD},
        {"{\"\\uD83D\\uD83D\":1}", BAD},
        {"{\"\\uD83D\\", INCOMPLETE},
        {"{\"\\uDC", BAD}, /* no digits make a unit allowed here */
        {"", INCOMPLETE},
        {"   ", INCOMPLETE},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *t = cases[i].text;
        enum json_verdict o = json_oracle(t, strlen(t)), a = automaton(t, strlen(t));
        if (o != cases[i].v || a != cases[i].v)
            fprintf(stderr, "  [%s]: want %s, oracle %s, automaton %s\n", t,
                    verdict_name(cases[i].v), verdict_name(o), verdict_name(a));
        ASSERT_EQ(o, cases[i].v);
        ASSERT_EQ(a, cases[i].v);
    }
}

TEST(bounds)
{
    char buf[256];
    /* whitespace: the bound's run passes, one more does not */
    for (int extra = 0; extra < 2; extra++) {
        size_t n = 0;
        buf[n++] = '{';
        for (int j = 0; j < JSON_GRAM_WS_MAX + extra; j++)
            buf[n++] = '\n';
        buf[n++] = '}';
        ASSERT_EQ(automaton(buf, n), extra ? BAD : COMPLETE);
    }
    /* a number of the bound's length passes, one more byte does not, and a
     * number that would need a digit past the bound stops before it */
    for (int extra = 0; extra < 2; extra++) {
        size_t n = (size_t)snprintf(buf, sizeof buf, "{\"a\":");
        for (int j = 0; j < JSON_GRAM_NUM_MAX + extra; j++)
            buf[n++] = '7';
        buf[n++] = '}';
        ASSERT_EQ(automaton(buf, n), extra ? BAD : COMPLETE);
    }
    {
        struct json_gram g;
        json_gram_init(&g);
        ASSERT(json_gram_feed(&g, "{\"a\":", 5));
        for (int j = 0; j < JSON_GRAM_NUM_MAX - 2; j++)
            ASSERT(json_gram_feed(&g, "1", 1));
        struct json_gram t = g;
        ASSERT(json_gram_feed(&t, ".", 1)); /* 32nd byte: room for a digit */
        ASSERT(json_gram_feed(&t, "5", 1));
        ASSERT(json_gram_feed(&g, "1", 1)); /* 31 bytes */
        t = g;
        ASSERT(!json_gram_feed(&t, ".", 1)); /* no room for the digit it needs */
        ASSERT(completes(g));
    }
    /* depth: the bound's nesting passes, one more does not */
    for (int extra = 0; extra < 2; extra++) {
        size_t n = 0;
        buf[n++] = '{';
        buf[n++] = '"';
        buf[n++] = '"';
        buf[n++] = ':';
        for (int j = 1; j < JSON_GRAM_DEPTH_MAX + extra; j++)
            buf[n++] = '[';
        for (int j = 1; j < JSON_GRAM_DEPTH_MAX + extra; j++)
            buf[n++] = ']';
        buf[n++] = '}';
        ASSERT_EQ(json_oracle(buf, n), extra ? BAD : COMPLETE);
        ASSERT_EQ(automaton(buf, n), extra ? BAD : COMPLETE);
    }
}

TEST(random_texts_prefixes_and_mutations)
{
    static struct out o, m;
    int64_t checked = 0, complete = 0, bad = 0;
    for (int doc = 0; doc < 3000; doc++) {
        gen_doc(&o);
        for (size_t n = 0; n <= o.n; n++) { /* every prefix */
            if (!agree(o.b, n)) {
                ASSERT(0);
                return;
            }
            checked++;
        }
        enum json_verdict v = json_oracle(o.b, o.n);
        complete += v == COMPLETE;
        bad += v == BAD;
        for (int k = 0; k < 8; k++) { /* mutations */
            memcpy(m.b, o.b, o.n);
            m.n = o.n;
            static const char alpha[] = "{}[]:,\" \\0123456789.eE+-tfnu\x80\xbf\xc3\xe2\xf0\x01";
            size_t at = below(m.n + 1);
            char c = below(4) ? alpha[below(sizeof alpha - 1)] : (char)below(256);
            int kind = (int)below(3);
            if (kind == 0 && at < m.n) {
                m.b[at] = c;
            } else if (kind == 1 || at == m.n) {
                memmove(m.b + at + 1, m.b + at, m.n - at);
                m.b[at] = c;
                m.n++;
            } else {
                memmove(m.b + at, m.b + at + 1, m.n - at - 1);
                m.n--;
            }
            if (!agree(m.b, m.n)) {
                ASSERT(0);
                return;
            }
            checked++;
        }
    }
    fprintf(stderr, "  %lld texts checked; of the generated ones %lld complete, %lld bad\n",
            (long long)checked, (long long)complete, (long long)bad);
    /* the generator reaches both sides of the grammar */
    ASSERT(complete > 1000);
    ASSERT(bad > 100);
}

TEST(every_accepted_prefix_completes)
{
    static struct out o;
    int64_t walks = 0;
    for (int doc = 0; doc < 300; doc++) {
        gen_doc(&o);
        struct json_gram g;
        json_gram_init(&g);
        for (size_t i = 0; i < o.n; i++) {
            if (!json_gram_feed(&g, o.b + i, 1))
                break;
            if (!completes(g)) {
                fprintf(stderr, "  no way on after [%.*s]\n", (int)(i + 1), o.b);
                ASSERT(0);
                return;
            }
            walks++;
        }
    }
    ASSERT(walks > 10000);
}

TEST_MAIN()
