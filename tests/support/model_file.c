/* model_file.c: where the tests find the model files (model_file.h). */
#include "support/model_file.h"

#include "cmd.h"

#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>

static const char *cached_model(const char *env, const char *file, char *buf, size_t len)
{
    const char *p = getenv(env);
    if (p && *p)
        return p;
    const char *cache = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (cache && *cache)
        snprintf(buf, len, "%s/streamsink/%s", cache, file);
    else
        snprintf(buf, len, "%s/.cache/streamsink/%s", home ? home : "/tmp", file);
    return buf;
}

/* The program's own rule, so that tests and commands agree. */
const char *test_model_path(void)
{
    return cmd_default_model();
}

const char *test_gemma_model_path(void)
{
    static char buf[4096];
    return cached_model("STREAMSINK_GEMMA_MODEL", "gemma-3-270m-q4_k_m.gguf", buf, sizeof buf);
}
