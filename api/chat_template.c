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
 * BOS is not rendered: the engine prepends it when the model asks for one.
 * The output always ends with the assistant's generation prompt.
 */
#include "api.h"

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

/* Copies the Jinja string literal text starting at s up to the marker end,
 * turning the escapes \n, \t, \', \" and \\ into their characters. */
static void copy_unescaped(char *dst, size_t cap, const char *s, const char *end)
{
    size_t o = 0;
    while (s < end && o + 1 < cap) {
        char c = *s++;
        if (c == '\\' && s < end) {
            char n = *s++;
            c = n == 'n' ? '\n' : n == 't' ? '\t' : n;
        }
        dst[o++] = c;
    }
    dst[o] = 0;
}

/* SmolLM2: {% if loop.first and messages[0]['role'] != 'system' %}
 *          {{ '<|im_start|>system\nYou are ...<|im_end|>\n' }}{% endif %} */
static void find_default_system(struct api_chat_template *t, const char *tmpl)
{
    static const char *const starts[] = {"'<|im_start|>system\n", "'<|im_start|>system\\n",
                                         "\"<|im_start|>system\n", "\"<|im_start|>system\\n"};
    for (size_t i = 0; i < sizeof starts / sizeof starts[0]; i++) {
        const char *p = strstr(tmpl, starts[i]);
        if (!p)
            continue;
        p += strlen(starts[i]);
        const char *end = strstr(p, "<|im_end|>");
        const char *quote = strchr(p, starts[i][0]);
        if (!end || (quote && quote < end))
            continue; /* not one literal: the system text comes from a variable */
        copy_unescaped(t->default_system, sizeof t->default_system, p, end);
        return;
    }
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

/* A bounded string builder that fails once, cleanly. */
struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
};

static void put(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void puts_(struct sbuf *b, const char *s)
{
    put(b, s, strlen(s));
}

/* developer is OpenAI's newer name for system. */
static const char *norm_role(const char *role)
{
    return strcmp(role, "developer") == 0 ? "system" : role;
}

static void render_chatml(struct sbuf *b, const struct api_chat_message *m, size_t n,
                          const char *def_sys)
{
    if (def_sys && (n == 0 || strcmp(norm_role(m[0].role), "system") != 0)) {
        puts_(b, "<|im_start|>system\n");
        puts_(b, def_sys);
        puts_(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        puts_(b, "<|im_start|>");
        puts_(b, norm_role(m[i].role));
        puts_(b, "\n");
        put(b, m[i].content, m[i].content_len);
        puts_(b, "<|im_end|>\n");
    }
    puts_(b, "<|im_start|>assistant\n");
}

static void render_llama3(struct sbuf *b, const struct api_chat_message *m, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const char *role = norm_role(m[i].role);
        puts_(b, "<|start_header_id|>");
        puts_(b, strcmp(role, "tool") == 0 ? "ipython" : role);
        puts_(b, "<|end_header_id|>\n\n");
        put(b, m[i].content, m[i].content_len);
        puts_(b, "<|eot_id|>");
    }
    puts_(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

/* Gemma: two roles, user and model; a leading system message opens the next
 * turn, whoever's it is, followed by a blank line (as Gemma 3's own template
 * prefixes it to the first of the remaining messages), so every message keeps
 * its order. */
static void render_gemma(struct sbuf *b, const struct api_chat_message *m, size_t n)
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
        puts_(b, model ? "<start_of_turn>model\n" : "<start_of_turn>user\n");
        if (sys) {
            put(b, sys, sys_len);
            puts_(b, "\n\n");
            sys = NULL;
        }
        put(b, m[i].content, m[i].content_len);
        puts_(b, "<end_of_turn>\n");
    }
    if (sys) { /* only a system message: it is the user's turn */
        puts_(b, "<start_of_turn>user\n");
        put(b, sys, sys_len);
        puts_(b, "<end_of_turn>\n");
    }
    puts_(b, "<start_of_turn>model\n");
}

/* Llama-2: the system prompt goes inside the first [INST]; each assistant
 * answer closes its turn with </s> and the next user turn opens with <s>. */
static void render_llama2(struct sbuf *b, const struct api_chat_message *m, size_t n)
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
            puts_(b, " ");
            put(b, m[i].content, m[i].content_len);
            puts_(b, " </s>");
            continue;
        }
        if (!first)
            puts_(b, "<s>");
        puts_(b, "[INST] ");
        if (sys) {
            puts_(b, "<<SYS>>\n");
            put(b, sys, sys_len);
            puts_(b, "\n<</SYS>>\n\n");
            sys = NULL;
        }
        put(b, m[i].content, m[i].content_len);
        puts_(b, " [/INST]");
        first = 0;
    }
    if (sys) { /* only a system message: still open a turn for it */
        puts_(b, "[INST] <<SYS>>\n");
        put(b, sys, sys_len);
        puts_(b, "\n<</SYS>>\n\n [/INST]");
    }
}

int api_chat_render(const struct api_chat_template *t, const struct api_chat_message *msgs,
                    size_t n, int with_default_system, char **out, size_t *out_len)
{
    struct sbuf b = {0};
    const char *def = with_default_system && t->default_system[0] ? t->default_system : NULL;
    put(&b, "", 0);
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
    if (b.oom) {
        free(b.p);
        *out = NULL;
        *out_len = 0;
        return -ENOMEM;
    }
    *out = b.p;
    *out_len = b.len;
    return 0;
}
