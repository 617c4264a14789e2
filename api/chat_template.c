/*
 * chat_template.c: chat messages -> prompt text, in the model's format.
 *
 * We do not run Jinja. The three formats that cover the llama-architecture
 * models we load are recognized by their markers in tokenizer.chat_template:
 *   <|im_start|>          ChatML   (SmolLM2, Qwen, ...)
 *   <|start_header_id|>   Llama-3
 *   [INST]                Llama-2  (and Mistral's [INST] variant)
 * Anything else, or no template, falls back to ChatML; the caller logs a
 * warning at startup. A ChatML template that injects a default system prompt
 * when the conversation has none (SmolLM2's does) has that text extracted, so
 * the rendered prompt is what the model was tuned on.
 *
 * The operator may name the format instead (serve --chat-template), or give a
 * template file recognized the same way (--chat-template-file), for a model
 * whose file carries no template or one we do not recognize.
 *
 * BOS is not rendered: the engine prepends it when the model asks for one.
 * The output always ends with the assistant's generation prompt.
 */
#include "api.h"
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *api_chat_format_name(enum api_chat_format f)
{
    switch (f) {
    case API_CHAT_LLAMA3:
        return "llama3";
    case API_CHAT_LLAMA2:
        return "llama2";
    case API_CHAT_GEMMA:
        return "gemma";
    case API_CHAT_CHATML:
    default:
        return "chatml";
    }
}

int api_chat_format_parse(const char *name, enum api_chat_format *f)
{
    static const enum api_chat_format all[] = {API_CHAT_CHATML, API_CHAT_LLAMA3, API_CHAT_LLAMA2,
                                               API_CHAT_GEMMA};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(name, api_chat_format_name(all[i])) == 0) {
            *f = all[i];
            return 0;
        }
    return -1;
}

void api_chat_template_named(struct api_chat_template *t, enum api_chat_format f)
{
    memset(t, 0, sizeof *t);
    t->format = f;
    t->recognized = 1;
}

/* Copies the Jinja string literal text starting at s up to the marker end,
 * turning the escapes \n, \t, \', \" and \\ into their characters, when
 * it fits dst[0..cap) with its NUL. Returns its length; dst is "" when it
 * does not fit. */
static size_t copy_unescaped(char *dst, size_t cap, const char *s, const char *end)
{
    size_t o = 0;
    while (s < end) {
        char c = *s++;
        if (c == '\\' && s < end) {
            char n = *s++;
            c = n == 'n' ? '\n' : n == 't' ? '\t' : n;
        }
        if (o + 1 < cap)
            dst[o] = c;
        o++;
    }
    dst[o < cap ? o : 0] = 0;
    return o;
}

/* The end of the Jinja string literal whose text starts at p (quoted with
 * q): its closing quote, escapes skipped; or the end of the template. */
static const char *literal_end(const char *p, char q)
{
    while (*p && *p != q)
        p += p[0] == '\\' && p[1] ? 2 : 1;
    return p;
}

/* SmolLM2: {% if loop.first and messages[0]['role'] != 'system' %}
 *          {{ '<|im_start|>system\nYou are ...<|im_end|>\n' }}{% endif %}
 * The default is the first literal (in the template, whatever its quotes)
 * that opens a system turn and holds its <|im_end|>: a template may open
 * the turn elsewhere with a literal that stops before its text (Qwen2.5:
 * '<|im_start|>system\n' + a variable, in its tools branch, before the
 * default). */
static void find_default_system(struct api_chat_template *t, const char *tmpl)
{
    static const char *const starts[] = {"'<|im_start|>system\n", "'<|im_start|>system\\n",
                                         "\"<|im_start|>system\n", "\"<|im_start|>system\\n"};
    /* the first in the template, of any quoting: its text and its end */
    const char *best = NULL, *best_text = NULL, *best_end = NULL;
    for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++) {
        for (const char *p = strstr(tmpl, starts[i]); p && (!best || p < best);
             p = strstr(p + 1, starts[i])) {
            const char *text = p + strlen(starts[i]);
            const char *close = literal_end(text, starts[i][0]);
            const char *end = memmem(text, (size_t)(close - text), "<|im_end|>", 10);
            if (!end)
                continue; /* not one literal: the system text comes from a variable */
            best = p;
            best_text = text;
            best_end = end;
            break;
        }
    }
    if (!best)
        return;
    size_t n = copy_unescaped(t->default_system, sizeof t->default_system, best_text, best_end);
    if (n + 1 > sizeof t->default_system)
        t->default_system_dropped = n;
}

void api_chat_template_init(struct api_chat_template *t, const char *tmpl)
{
    memset(t, 0, sizeof *t);
    t->format = API_CHAT_CHATML;
    if (!tmpl)
        return;
    if (strstr(tmpl, "<|start_header_id|>")) {
        t->format = API_CHAT_LLAMA3;
        t->recognized = 1;
    } else if (strstr(tmpl, "<|im_start|>")) {
        t->format = API_CHAT_CHATML;
        t->recognized = 1;
        find_default_system(t, tmpl);
    } else if (strstr(tmpl, "<start_of_turn>")) {
        t->format = API_CHAT_GEMMA;
        t->recognized = 1;
    } else if (strstr(tmpl, "[INST]")) {
        t->format = API_CHAT_LLAMA2;
        t->recognized = 1;
    }
}

/* developer is OpenAI's newer name for system. */
static const char *norm_role(const char *role)
{
    return strcmp(role, "developer") == 0 ? "system" : role;
}

/* 1 if the code point is whitespace to Python's str.isspace(): what Jinja's
 * trim and str.strip() take off a content's ends. */
static int py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* The code point whose bytes are s[0..n) (one valid UTF-8 character). */
static uint32_t code_point(const unsigned char *s, size_t n)
{
    uint32_t c = n == 1 ? s[0] : s[0] & (0x7F >> n);
    for (size_t i = 1; i < n; i++)
        c = c << 6 | (s[i] & 0x3F);
    return c;
}

/* 1 if s[0..n) is one whitespace character. Bytes that are not UTF-8 are
 * no character (a request's strings are UTF-8; the renderer takes any). */
static int space_at(const unsigned char *s, size_t n)
{
    size_t want = s[0] < 0x80 ? 1 : s[0] < 0xE0 ? 2 : s[0] < 0xF0 ? 3 : 4;
    return want == n && api__utf8_valid_prefix((const char *)s, n) == n &&
           py_space(code_point(s, n));
}

/* s[0..*len) with the whitespace at its start (left) and at its end (right)
 * taken off, as Python's lstrip and rstrip: returns the start, and *len the
 * rest. */
static const char *strip(const char *s, size_t *len, int left, int right)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, b = *len;
    while (left && a < b) {
        size_t n = 1;
        while (n <= 4 && !(n <= b - a && space_at(u + a, n)))
            n++;
        if (n > 4)
            break;
        a += n;
    }
    while (right && b > a) {
        size_t n = 1;
        while (n <= 4 && !(n <= b - a && space_at(u + b - n, n)))
            n++;
        if (n > 4)
            break;
        b -= n;
    }
    *len = b - a;
    return s + a;
}

/* A message's content with Jinja's trim. */
static void put_trimmed(struct api_buf *b, const char *s, size_t len, int left, int right)
{
    const char *t = strip(s, &len, left, right);
    api__buf_put(b, t, len);
}

/* The default system turn, where messages (m, n) start a conversation and
 * do not open with a system message of their own. */
static int wants_default_system(const struct api_chat_message *m, size_t n, const char *def_sys)
{
    return def_sys && def_sys[0] && (n == 0 || strcmp(norm_role(m[0].role), "system") != 0);
}

static void put_default_system(struct api_buf *b, const char *def_sys)
{
    api__buf_puts(b, "<|im_start|>system\n");
    api__buf_puts(b, def_sys);
    api__buf_puts(b, "<|im_end|>\n");
}

static void render_chatml(struct api_buf *b, const struct api_chat_message *m, size_t n,
                          const char *def_sys)
{
    if (wants_default_system(m, n, def_sys))
        put_default_system(b, def_sys);
    for (size_t i = 0; i < n; i++) {
        api__buf_puts(b, "<|im_start|>");
        api__buf_puts(b, norm_role(m[i].role));
        api__buf_puts(b, "\n");
        api__buf_put(b, m[i].content, m[i].content_len);
        api__buf_puts(b, "<|im_end|>\n");
    }
    api__buf_puts(b, "<|im_start|>assistant\n");
}

/* Llama-3: contents trimmed, as the template does. */
static void render_llama3(struct api_buf *b, const struct api_chat_message *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *role = norm_role(m[i].role);
        api__buf_puts(b, "<|start_header_id|>");
        api__buf_puts(b, strcmp(role, "tool") == 0 ? "ipython" : role);
        api__buf_puts(b, "<|end_header_id|>\n\n");
        put_trimmed(b, m[i].content, m[i].content_len, 1, 1);
        api__buf_puts(b, "<|eot_id|>");
    }
    api__buf_puts(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Gemma: two roles, user and model; a leading system message opens the next
 * turn, whoever's it is, followed by a blank line (as Gemma 3's own template
 * prefixes it to the first of the remaining messages), so every message keeps
 * its order. Contents are trimmed, as the template does (the system prompt
 * is not). */
static void render_gemma(struct api_buf *b, const struct api_chat_message *m, size_t n)
{
    size_t i = 0;
    const char *sys = NULL;
    size_t sys_len = 0;
    if (n > 0 && strcmp(norm_role(m[0].role), "system") == 0) {
        sys = m[0].content;
        sys_len = m[0].content_len;
        i = 1;
    }
    for (; i < n; i++) {
        int model = strcmp(m[i].role, "assistant") == 0;
        api__buf_puts(b, model ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
        if (sys) {
            api__buf_put(b, sys, sys_len);
            api__buf_puts(b, "\n\n");
            sys = NULL;
        }
        put_trimmed(b, m[i].content, m[i].content_len, 1, 1);
        api__buf_puts(b, "<end_of_turn>\n");
    }
    if (sys) { /* only a system message: it is the user's turn */
        api__buf_puts(b, "<start_of_turn>user\n");
        api__buf_put(b, sys, sys_len);
        api__buf_puts(b, "<end_of_turn>\n");
    }
    api__buf_puts(b, "<start_of_turn>model\n");
}

/* The first [INST]'s text with a system prompt: the template strips the
 * system block and the user's content as one text, so the content keeps its
 * leading whitespace, and a blank content takes the block's blank lines. */
static void put_llama2_sys(struct api_buf *b, const char *sys, size_t sys_len, const char *content,
                           size_t len)
{
    strip(content, &len, 0, 1);
    api__buf_puts(b, "<<SYS>>\n");
    api__buf_put(b, sys, sys_len);
    api__buf_puts(b, "\n<</SYS>>");
    if (len > 0) {
        api__buf_puts(b, "\n\n");
        api__buf_put(b, content, len);
    }
}

/* Llama-2: the system prompt goes inside the first [INST]; each assistant
 * answer closes its turn with </s> and the next user turn opens with <s>.
 * Contents are stripped, as the template does. */
static void render_llama2(struct api_buf *b, const struct api_chat_message *m, size_t n)
{
    size_t i = 0;
    const char *sys = NULL;
    size_t sys_len = 0;
    int first = 1;
    if (n > 0 && strcmp(norm_role(m[0].role), "system") == 0) {
        sys = m[0].content;
        sys_len = m[0].content_len;
        i = 1;
    }
    for (; i < n; i++) {
        if (strcmp(m[i].role, "assistant") == 0) {
            api__buf_puts(b, " ");
            put_trimmed(b, m[i].content, m[i].content_len, 1, 1);
            api__buf_puts(b, " </s>");
            first = 0; /* the next turn opens with <s>, whoever's turn came before */
            continue;
        }
        if (!first)
            api__buf_puts(b, "<s>");
        api__buf_puts(b, "[INST] ");
        if (sys)
            put_llama2_sys(b, sys, sys_len, m[i].content, m[i].content_len);
        else
            put_trimmed(b, m[i].content, m[i].content_len, 1, 1);
        sys = NULL;
        api__buf_puts(b, " [/INST]");
        first = 0;
    }
    if (sys) { /* only a system message: still open a turn for it, of no content */
        api__buf_puts(b, "[INST] ");
        put_llama2_sys(b, sys, sys_len, "", 0);
        api__buf_puts(b, " [/INST]");
    }
}

int api_chat_session_texts(const struct api_chat_template *t, const struct api_chat_message *msgs,
                           size_t n, char **open, char **close)
{
    *open = *close = NULL;
    const char *end;
    switch (t->format) {
    case API_CHAT_LLAMA3:
        end = "<|eot_id|>";
        break;
    case API_CHAT_LLAMA2:
        end = " </s><s>"; /* the answer's end, and the next turn's start */
        break;
    case API_CHAT_GEMMA:
        end = "<end_of_turn>\n";
        break;
    case API_CHAT_CHATML:
    default:
        end = "<|im_end|>\n";
        break;
    }
    *close = strdup(end);
    if (!*close)
        return -ENOMEM;
    if (t->format == API_CHAT_CHATML && wants_default_system(msgs, n, t->default_system)) {
        struct api_buf b = {0};
        put_default_system(&b, t->default_system);
        *open = api__buf_finish(&b);
        if (!*open) {
            free(*close);
            *close = NULL;
            return -ENOMEM;
        }
    }
    return 0;
}

int api_chat_render(const struct api_chat_template *t, const struct api_chat_message *msgs,
                    size_t n, int with_default_system, char **out, size_t *out_len)
{
    struct api_buf b = {0};
    const char *def = with_default_system && t->default_system[0] ? t->default_system : NULL;
    api__buf_put(&b, "", 0);
    switch (t->format) {
    case API_CHAT_LLAMA3:
        render_llama3(&b, msgs, n);
        break;
    case API_CHAT_LLAMA2:
        render_llama2(&b, msgs, n);
        break;
    case API_CHAT_GEMMA:
        render_gemma(&b, msgs, n);
        break;
    case API_CHAT_CHATML:
    default:
        render_chatml(&b, msgs, n, def);
        break;
    }
    char *text = api__buf_finish(&b);
    if (!text) {
        *out = NULL;
        *out_len = 0;
        return -ENOMEM;
    }
    *out = text;
    *out_len = b.len;
    return 0;
}
