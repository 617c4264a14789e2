/* simde_avx512_end.h: closes simde_avx512_begin.h (see there). */
#ifdef SS_EMULATE_AVX512
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif
