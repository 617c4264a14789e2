/*
 * model_file.h: where the tests find the default model, SmolLM2-135M-Instruct
 * Q4_1 (scripts/fetch-model.sh). Tests that need it skip when it is absent
 * and fail when it is present but does not load (TEST_NEED_MODEL and
 * TEST_LOAD_MODEL in test.h).
 */
#ifndef SS_TESTS_SUPPORT_MODEL_FILE_H
#define SS_TESTS_SUPPORT_MODEL_FILE_H

/* $STREAMSINK_MODEL, else the cache path of scripts/fetch-model.sh
 * ($XDG_CACHE_HOME or ~/.cache, then streamsink/). The string is static. */
const char *test_model_path(void);

/* $STREAMSINK_GEMMA_MODEL, else the cache path of `scripts/fetch-model.sh
 * gemma3-270m`. The string is static. */
const char *test_gemma_model_path(void);

#endif
