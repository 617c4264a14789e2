/* rng.c: splitmix64 and the distributions the tests draw from (rng.h). */
#include "support/rng.h"

#include <math.h>

uint64_t test_rng_u64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

double test_rng_unit(uint64_t *s)
{
    return ((double)(test_rng_u64(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

float test_rng_sym(uint64_t *s)
{
    return (float)(test_rng_u64(s) >> 40) * 0x1p-23f - 1.0f;
}

double test_rng_normal(uint64_t *s)
{
    double u1 = test_rng_unit(s), u2 = test_rng_unit(s);
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

uint64_t test_rng_below(uint64_t *s, uint64_t n)
{
    return n ? test_rng_u64(s) % n : 0;
}
