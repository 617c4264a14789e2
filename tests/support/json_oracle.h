/*
 * json_oracle.h: the tests' reference for the JSON answer's grammar
 * (engine/json_gram.h): a recursive-descent parser over a whole text,
 * written apart from the automaton. It says whether the text is one whole
 * object (then at most the bound's whitespace), a prefix of one that the
 * text ran out in, or neither, under the grammar's bounds and its surrogate
 * rule. UTF-8 is checked by decoding each character, and a cut one by
 * whether some completion of it is a scalar value.
 */
#ifndef SS_TESTS_SUPPORT_JSON_ORACLE_H
#define SS_TESTS_SUPPORT_JSON_ORACLE_H

#include <stddef.h>

enum json_verdict { COMPLETE, INCOMPLETE, BAD };

enum json_verdict json_oracle(const char *s, size_t n);

#endif
