/*
 * utf8_check.h: a UTF-8 validity check written for the tests, independent of
 * the project's own UTF-8 code (api/utf8.c, the tokenizer), so that tests and
 * fuzz targets can judge that code's output with it.
 */
#ifndef SS_TESTS_SUPPORT_UTF8_CHECK_H
#define SS_TESTS_SUPPORT_UTF8_CHECK_H

#include <stddef.h>

/* 1 if s[0..n) is valid UTF-8 (no overlongs, surrogates or values past 10FFFF). */
int test_valid_utf8(const unsigned char *s, size_t n);

#endif
