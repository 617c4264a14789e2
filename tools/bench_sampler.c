/*
 * bench_sampler.c: the time the sampler takes per token, on real logits.
 * The engine thread samples every stream of a step in turn after the
 * forward pass, so at S streams a step spends S times this on one thread.
 *
 *   bench_sampler --model FILE [--reps R]
 *
 * Runs one forward step over a fixed English prompt with logits for every
 * position (rows of the model's own vocabulary-wide logits), then times
 * decoder_sampler_sample on each row, for four settings: greedy; the
 * OpenAI defaults a request gets when it sets nothing (temperature 1,
 * top_p 1); temperature 0.8 with top_p 0.95; and llama.cpp's defaults
 * (temperature 0.8, top_k 40, top_p 0.95, min_p 0.05). Prints, per
 * setting, the median over R passes of the mean microseconds per call.
 * Copying a row back before each call is not timed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "decoder.h"

#define MAX_REPS 101

static const char PROMPT[] =
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a "
    "small brass lamp and a notebook in which he wrote down the colour of the sea, the "
    "direction of the wind and the names of the ships that passed. Over forty years the "
    "notebooks filled a whole shelf, and when the light was finally automated, a young "
    "historian from the city came to read them. She found storms that no newspaper had "
    "reported, a whale that followed a fishing boat for three days, and a short entry, "
    "repeated every year on the same date, that simply said: she did not come back.";

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
    const char *model_path = getenv("STREAMSINK_MODEL");
    int reps = 15;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0)
            model_path = argv[i + 1];
        else if (strcmp(argv[i], "--reps") == 0)
            reps = atoi(argv[i + 1]);
    }
    if (!model_path || reps < 1 || reps > MAX_REPS) {
        fprintf(stderr, "usage: bench_sampler --model FILE [--reps R (1..%d)]\n", MAX_REPS);
        return 2;
    }
    struct decoder_config cfg = {
        .model_path = model_path,
        .backend = ENGINE_BACKEND_CPU,
        .n_threads = 2,
        .max_tokens = 256,
        .chunk = 256,
        .n_sinks = DECODER_DEFAULT_SINKS,
        .window = 512,
        .n_slots = 1,
    };
    char err[256];
    struct decoder *d = NULL;
    if (decoder_open(&d, &cfg, err, sizeof err) < 0) {
        fprintf(stderr, "bench_sampler: %s\n", err);
        return 1;
    }
    struct decoder_info info;
    decoder_get_info(d, &info);
    const int64_t V = info.n_vocab;
    int32_t toks[256];
    int64_t n = decoder_tokenize(d, PROMPT, strlen(PROMPT), info.add_bos, 0, toks, 256);
    const struct engine_policy pol = {0};
    int64_t seq = decoder_seq_open(d, &pol, 0);
    if (n <= 0 || seq < 0) {
        fprintf(stderr, "bench_sampler: cannot tokenize the prompt or open a sequence\n");
        decoder_close(d);
        return 1;
    }
    struct decoder_input in = {seq, toks, n, DECODER_LOGITS_ALL};
    int64_t rows = decoder_step(d, &in, 1);
    float *lg = malloc((size_t)(rows > 0 ? rows : 1) * (size_t)V * sizeof(float));
    float *row = malloc((size_t)V * sizeof(float));
    if (rows <= 0 || !lg || !row) {
        fprintf(stderr, "bench_sampler: the forward step failed\n");
        free(lg);
        free(row);
        decoder_close(d);
        return 1;
    }
    memcpy(lg, decoder_logits(d), (size_t)rows * (size_t)V * sizeof(float));

    struct {
        const char *name;
        float temperature, top_p, min_p;
        int64_t top_k;
    } cases[] = {
        {"greedy (temperature 0)", 0.0f, 1.0f, 0.0f, 0},
        {"temperature 1, top_p 1 (OpenAI defaults)", 1.0f, 1.0f, 0.0f, 0},
        {"temperature 0.8, top_p 0.95", 0.8f, 0.95f, 0.0f, 0},
        {"temperature 0.8, top_k 40, top_p 0.95, min_p 0.05", 0.8f, 0.95f, 0.05f, 40},
    };
    printf("sampler, %lld rows of real logits (vocabulary %lld), median of %d passes\n",
           (long long)rows, (long long)V, reps);
    printf("| setting | us per token |\n|---|---|\n");
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct engine_sampling sp = engine_sampling_defaults();
        sp.temperature = cases[c].temperature;
        sp.top_p = cases[c].top_p;
        sp.top_k = cases[c].top_k;
        sp.min_p = cases[c].min_p;
        sp.seed = 1;
        struct decoder_sampler *s = NULL;
        if (decoder_sampler_new(&s, &sp, V) < 0) {
            fprintf(stderr, "bench_sampler: cannot make a sampler\n");
            break;
        }
        double per[MAX_REPS];
        volatile int64_t sink = 0;
        for (int r = 0; r < reps; r++) {
            double t = 0;
            for (int64_t i = 0; i < rows; i++) {
                memcpy(row, lg + i * V, (size_t)V * sizeof(float));
                double t0 = now();
                sink += decoder_sampler_sample(s, row);
                t += now() - t0;
            }
            per[r] = t / (double)rows * 1e6;
        }
        qsort(per, (size_t)reps, sizeof per[0], cmp_double);
        printf("| %s | %.1f |\n", cases[c].name, per[reps / 2]);
        decoder_sampler_free(s);
    }
    free(lg);
    free(row);
    decoder_close(d);
    return 0;
}
