/*
 * error.c: struct api_error -> OpenAI's error object and the HTTP status line
 * text. Every error a client can cause leaves through here, so the shape is
 * the same everywhere: {"error":{"message","type","param","code"}}, param and
 * code a string or null.
 */
#include "api.h"
#include "internal.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *type_for(int status)
{
    if (status >= 500)
        return "server_error";
    if (status == 429)
        return "requests";
    return "invalid_request_error";
}

void api_error_set(struct api_error *e, int status, const char *param, const char *code,
                   const char *fmt, ...)
{
    va_list ap;
    memset(e, 0, sizeof *e);
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type_for(status));
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

/* A message or param may quote the client (a model name, a key) and may have
 * been cut mid-character by its fixed buffer: JSON strings must be UTF-8. */
static cJSON *utf8_string(const char *s)
{
    char buf[3 * sizeof(((struct api_error *)0)->message)]; /* a bad byte becomes 3 */
    api__utf8_sanitize(buf, sizeof buf, s, strlen(s));
    return cJSON_CreateString(buf);
}

static cJSON *string_or_null(const char *s)
{
    return s && s[0] ? utf8_string(s) : cJSON_CreateNull();
}

char *api_error_json(const struct api_error *e)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    char *out = NULL;
    if (err) {
        cJSON_AddItemToObject(err, "message", utf8_string(e->message));
        cJSON_AddStringToObject(err, "type", e->type[0] ? e->type : type_for(e->status));
        cJSON_AddItemToObject(err, "param", string_or_null(e->param));
        cJSON_AddItemToObject(err, "code", string_or_null(e->code));
        out = cJSON_PrintUnformatted(root);
    }
    cJSON_Delete(root);
    return out;
}
