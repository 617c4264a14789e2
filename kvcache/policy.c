/* policy.c: parsing, naming and resolving eviction policies (kvcache.h). */
#include "kvcache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int kv_policy_parse(const char *s, struct kv_policy *out)
{
    struct kv_policy p = {KV_POLICY_AUTO, 0};
    if (!s)
        return -EINVAL;
    if (strcmp(s, "auto") == 0) {
        p.kind = KV_POLICY_AUTO;
    } else if (strcmp(s, "window") == 0) {
        p.kind = KV_POLICY_WINDOW;
    } else if (strcmp(s, "dense") == 0) {
        p.kind = KV_POLICY_DENSE;
    } else if (strcmp(s, "recompute") == 0) {
        p.kind = KV_POLICY_RECOMPUTE;
    } else if (strncmp(s, "sinks:", 6) == 0) {
        char *end = NULL;
        errno = 0;
        long long n = strtoll(s + 6, &end, 10);
        if (errno || end == s + 6 || *end || n < 0 || n > KV_MAX_SINKS)
            return -EINVAL;
        p.kind = n == 0 ? KV_POLICY_WINDOW : KV_POLICY_SINKS;
        p.n_sinks = n;
    } else {
        return -EINVAL;
    }
    *out = p;
    return 0;
}

void kv_policy_name(const struct kv_policy *p, char *buf, size_t cap)
{
    switch (p->kind) {
    case KV_POLICY_AUTO:
        snprintf(buf, cap, "auto");
        break;
    case KV_POLICY_WINDOW:
        snprintf(buf, cap, "window");
        break;
    case KV_POLICY_SINKS:
        snprintf(buf, cap, "sinks:%lld", (long long)p->n_sinks);
        break;
    case KV_POLICY_DENSE:
        snprintf(buf, cap, "dense");
        break;
    case KV_POLICY_RECOMPUTE:
        snprintf(buf, cap, "recompute");
        break;
    }
}

struct kv_policy kv_policy_resolve(struct kv_policy p, int needs_sinks)
{
    if (p.kind != KV_POLICY_AUTO)
        return p;
    if (needs_sinks)
        return (struct kv_policy){KV_POLICY_SINKS, KV_DEFAULT_SINKS};
    return (struct kv_policy){KV_POLICY_WINDOW, 0};
}

int64_t kv_policy_sinks(const struct kv_policy *p)
{
    return p->kind == KV_POLICY_SINKS ? p->n_sinks : 0;
}
