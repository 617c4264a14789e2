/*
 * rng.h: the tests' random numbers. One generator, splitmix64, on a state the
 * caller owns (a seed), so every run of a test sees the same data and two
 * streams never interfere. Not for anything but tests and fixtures.
 */
#ifndef SS_TESTS_SUPPORT_RNG_H
#define SS_TESTS_SUPPORT_RNG_H

#include <stdint.h>

/* The next 64 random bits of the stream *s (splitmix64). */
uint64_t test_rng_u64(uint64_t *s);
/* Uniform in (0, 1), 53 bits. */
double test_rng_unit(uint64_t *s);
/* Uniform in [-1, 1), 24 bits: the float grid kernel tests like. */
float test_rng_sym(uint64_t *s);
/* Standard normal (Box-Muller). */
double test_rng_normal(uint64_t *s);
/* Uniform in [0, n) (0 when n is 0). */
uint64_t test_rng_below(uint64_t *s, uint64_t n);

#endif
