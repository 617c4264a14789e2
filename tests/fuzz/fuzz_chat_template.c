/*
 * fuzz_chat_template.c: libFuzzer target for api/chat_template.c: template
 * recognition (api_chat_template_init, including the default system prompt
 * pulled out of a ChatML template's string literal) and rendering.
 *
 * The input is cut at 0xFE bytes (never part of UTF-8). The first segment is
 * a template text for api_chat_template_init; each later segment is a message:
 * its first byte picks the role, the rest is the content, NULs included (the
 * renderer takes lengths). The messages are rendered with every format, with
 * and without the default system prompt, and with the fuzzed template.
 * Checked: the output is NUL-terminated at out_len and no longer than the
 * contents plus a fixed overhead per message; every content appears whole
 * (in the formats that trim contents, all that a trim leaves of it), in order (so an embedded NUL
 * does not cut it; Llama-2's leading system message goes into the first user turn, so only its
 * presence); ChatML and Llama-3 outputs end with the assistant's generation prompt; the template's
 * default system prompt is NUL-terminated inside its array.
 *
 * Build and run (clang only): as fuzz_http_conn.c says, with
 *   build-fuzz/tests/fuzz/fuzz_chat_template <corpus dir> -max_total_time=60
 */
#include "api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define SEP 0xFE
#define MAX_MSGS 64
#define PER_MSG_OVERHEAD 96 /* markers around one message, role included */
#define FIXED_OVERHEAD 128  /* generation prompt, Llama-2's lone system turn */

static const char *const roles[] = {"system", "developer", "user", "assistant", "tool", "function"};

static const char smollm2[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

static void fail(const char *what, const struct api_chat_template *t)
{
    fprintf(stderr, "fuzz_chat_template: %s (format %s)\n", what, api_chat_format_name(t->format));
    abort();
}

static int ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);
    return n >= k && memcmp(s + n - k, suffix, k) == 0;
}

/* A byte a whitespace character may hold (ASCII whitespace, or >= 0x80). */
static int trimmable(unsigned char c)
{
    return c >= 0x80 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
}

/* What any trim leaves of s[0..*len): Gemma's, Llama-3's and Llama-2's
 * templates strip whitespace characters off a content's ends, each ASCII
 * whitespace or made of bytes >= 0x80, so the bytes between the first and
 * the last that are neither are always written. */
static const char *core(const char *s, size_t *len)
{
    size_t a = 0, b = *len;
    while (a < b && trimmable((unsigned char)s[a]))
        a++;
    while (b > a && trimmable((unsigned char)s[b - 1]))
        b--;
    *len = b - a;
    return s + a;
}

static void render_and_check(const struct api_chat_template *t, const struct api_chat_message *m,
                             size_t n, int with_default_system)
{
    char *out = NULL;
    size_t out_len = 0;
    size_t bound = FIXED_OVERHEAD + strlen(t->default_system);

    for (size_t i = 0; i < n; i++)
        bound += m[i].content_len + PER_MSG_OVERHEAD;
    if (api_chat_render(t, m, n, with_default_system, &out, &out_len) != 0)
        return; /* out of memory */
    if (!out || out[out_len] != 0)
        fail("output not NUL-terminated at its length", t);
    if (out_len > bound)
        fail("output longer than its parts", t);
    /* every content whole and in order; Llama-2 puts a leading system
     * message inside the first user turn, wherever that is */
    const char *p = out;
    size_t left = out_len;
    size_t first = 0;
    if (t->format == API_CHAT_LLAMA2 && n > 0 &&
        (strcmp(m[0].role, "system") == 0 || strcmp(m[0].role, "developer") == 0)) {
        if (m[0].content_len > 0 && !memmem(out, out_len, m[0].content, m[0].content_len))
            fail("the system message is missing", t);
        first = 1;
    }
    for (size_t i = first; i < n; i++) {
        const char *c = m[i].content;
        size_t len = m[i].content_len;
        if (t->format != API_CHAT_CHATML)
            c = core(c, &len);
        if (len == 0)
            continue;
        const char *hit = memmem(p, left, c, len);
        if (!hit)
            fail("a message's content is missing or out of order", t);
        left -= (size_t)(hit - p) + len;
        p = hit + len;
    }
    if (t->format == API_CHAT_CHATML && !ends_with(out, out_len, "<|im_start|>assistant\n"))
        fail("ChatML output does not end with the generation prompt", t);
    if (t->format == API_CHAT_LLAMA3 &&
        !ends_with(out, out_len, "<|start_header_id|>assistant<|end_header_id|>\n\n"))
        fail("Llama-3 output does not end with the generation prompt", t);
    free(out);
    /* a session's texts: the default system turn is the one the whole
     * render puts first, or none */
    char *open = NULL, *close = NULL;
    if (api_chat_session_texts(t, m, n, &open, &close) != 0)
        return; /* out of memory */
    if (!close || !close[0])
        fail("no text to end an assistant turn with", t);
    if (open && t->format != API_CHAT_CHATML)
        fail("a default system turn for a template without one", t);
    char *whole = NULL;
    size_t whole_len;
    if (open && api_chat_render(t, m, n, 1, &whole, &whole_len) == 0 && whole &&
        strncmp(whole, open, strlen(open)) != 0)
        fail("a session's opening is not how the conversation opens", t);
    free(whole);
    free(open);
    free(close);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct api_chat_template fixed[4];
    static int ready;
    struct api_chat_message msgs[MAX_MSGS];
    struct api_chat_template fuzzed;
    size_t n = 0;

    if (!ready) {
        api_chat_template_init(&fixed[0], smollm2);
        api_chat_template_init(&fixed[1], "<|start_header_id|>");
        api_chat_template_init(&fixed[2], "[INST]");
        api_chat_template_init(&fixed[3], NULL);
        ready = 1;
    }
    /* a private copy: contents point into it; exact size so ASan sees overreads */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    memcpy(copy, data, size);

    const uint8_t *end = copy + size;
    const uint8_t *seg = memchr(copy, SEP, size);
    size_t tmpl_len = seg ? (size_t)(seg - copy) : size;
    char *tmpl = malloc(tmpl_len + 1);
    if (!tmpl) {
        free(copy);
        return 0;
    }
    memcpy(tmpl, copy, tmpl_len);
    tmpl[tmpl_len] = 0;
    api_chat_template_init(&fuzzed, tmpl);
    if (!memchr(fuzzed.default_system, 0, sizeof fuzzed.default_system))
        fail("default system prompt not NUL-terminated", &fuzzed);
    if (fuzzed.default_system[0] && fuzzed.format != API_CHAT_CHATML)
        fail("a default system prompt outside ChatML", &fuzzed);
    if (!fuzzed.recognized && (fuzzed.format != API_CHAT_CHATML || fuzzed.default_system[0]))
        fail("an unrecognized template must fall back to plain ChatML", &fuzzed);
    free(tmpl);

    while (seg && n < MAX_MSGS) {
        const uint8_t *start = seg + 1;
        const uint8_t *next = memchr(start, SEP, (size_t)(end - start));
        const uint8_t *stop = next ? next : end;
        if (stop > start) {
            msgs[n].role = roles[start[0] % (sizeof roles / sizeof roles[0])];
            msgs[n].content = (const char *)start + 1;
            msgs[n].content_len = (size_t)(stop - start) - 1;
            n++;
        }
        seg = next;
    }

    for (int i = 0; i < 4; i++) {
        render_and_check(&fixed[i], msgs, n, 1);
        render_and_check(&fixed[i], msgs, n, 0);
    }
    render_and_check(&fuzzed, msgs, n, 1);
    free(copy);
    return 0;
}
