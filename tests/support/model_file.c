/* model_file.c: the default model's path for the tests (model_file.h). */
#include "support/model_file.h"

#include <stdio.h>
#include <stdlib.h>

const char *test_model_path(void)
{
    const char *p = getenv("STREAMSINK_MODEL");
    if (p && *p)
        return p;
    static char buf[4096];
    const char *cache = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (cache && *cache)
        snprintf(buf, sizeof buf, "%s/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf", cache);
    else
        snprintf(buf, sizeof buf, "%s/.cache/streamsink/SmolLM2-135M-Instruct.Q4_1.gguf",
                 home ? home : "/tmp");
    return buf;
}
