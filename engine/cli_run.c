/*
 * cli_run.c: `streamsink run`: prompt in, streamed text out, one sequence on
 * the calling thread. Prompt and decode speeds go to stderr.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "decoder.h"
#include "engine.h"

static void usage(FILE *f)
{
    fprintf(
        f, "usage: streamsink run [-m FILE] -p PROMPT [-n N] [options]\n"
           "\n"
           "Runs one prompt through the model (CPU, or CUDA with --backend cuda) and streams\n"
           "the text to stdout.\n"
           "Prompt and decode speeds are printed to stderr.\n"
           "\n"
           "  -m, --model FILE          GGUF model (default: $STREAMSINK_MODEL or the model\n"
           "                            fetched by scripts/fetch-model.sh)\n"
           "  -p, --prompt TEXT         prompt text (special tokens like <|im_start|> are parsed)\n"
           "  -f, --file FILE           read the prompt from FILE instead\n"
           "  -n, --n-predict N         tokens to generate (default 128; stops early at EOS\n"
           "                            unless --ignore-eos)\n"
           "  -t, --threads N           CPU threads (default 2)\n"
           "      --backend B           cpu or cuda (default cpu)\n"
           "      --temp X              temperature; 0 is greedy (default 0)\n"
           "      --top-k N             keep the N most likely tokens (default 0: off)\n"
           "      --top-p X             nucleus sampling mass (default 1: off)\n"
           "      --min-p X             drop tokens below X times the top probability (default 0)\n"
           "      --repeat-penalty X    repetition penalty (default 1: off)\n"
           "      --presence-penalty X  OpenAI presence penalty (default 0)\n"
           "      --frequency-penalty X OpenAI frequency penalty (default 0)\n"
           "      --penalty-last-n N    tokens the penalties look back over (default 64)\n"
           "      --seed N              random seed (default 0)\n"
           "      --chunk N             prompt tokens per forward step (default 256)\n"
           "      --ctx N               KV window in tokens (default: prompt + n, at most the\n"
           "                            model's context length)\n"
           "      --kv-f32              keep the KV cache in f32 (default f16)\n"
           "      --ignore-eos          keep generating past end-of-sequence tokens\n"
           "      --no-bos              do not prepend BOS even if the model asks for it\n"
           "  -h, --help                this text\n");
}

int engine_cmd_run(int argc, char **argv)
{
    const char *model = cli_default_model(), *prompt = NULL, *file = NULL;
    int64_t n_predict = 128, threads = 2, chunk = 256, ctx = 0, keep = 0;
    struct engine_policy policy = {ENGINE_POLICY_DENSE, 0};
    int ignore_eos = 0, no_bos = 0, kv_f32 = 0;
    enum engine_backend backend = ENGINE_BACKEND_CPU;
    struct engine_sampling sp = engine_sampling_defaults();
    sp.temperature = 0.0f;

    const char *policy_s = NULL;
    int64_t seed = 0;
    const struct cli_opt opts[] = {
        {"-m", "--model", CLI_STR, &model, 0, 0, NULL},
        {"-p", "--prompt", CLI_STR, &prompt, 0, 0, NULL},
        {"-f", "--file", CLI_STR, &file, 0, 0, NULL},
        {"-n", "--n-predict", CLI_I64, &n_predict, 0, (double)((int64_t)1 << 40), NULL},
        {"-t", "--threads", CLI_I64, &threads, 1, 256, NULL},
        {NULL, "--backend", CLI_BACKEND, &backend, 0, 0, NULL},
        {NULL, "--temp", CLI_F32, &sp.temperature, 0, 100, NULL},
        {NULL, "--top-k", CLI_I64, &sp.top_k, 0, 1 << 30, NULL},
        {NULL, "--top-p", CLI_F32, &sp.top_p, 1e-6, 1, NULL},
        {NULL, "--min-p", CLI_F32, &sp.min_p, 0, 1, NULL},
        {NULL, "--repeat-penalty", CLI_F32, &sp.repeat_penalty, 1e-3, 100, NULL},
        {NULL, "--presence-penalty", CLI_F32, &sp.presence_penalty, -2, 2, NULL},
        {NULL, "--frequency-penalty", CLI_F32, &sp.frequency_penalty, -2, 2, NULL},
        {NULL, "--penalty-last-n", CLI_I64, &sp.penalty_last_n, 0, 1 << 20, NULL},
        {NULL, "--seed", CLI_I64, &seed, 0, (double)INT64_MAX, NULL},
        {NULL, "--chunk", CLI_I64, &chunk, 1, 1 << 16, NULL},
        {NULL, "--prompt-tokens", CLI_I64, &keep, 1, (double)((int64_t)1 << 40), NULL},
        {NULL, "--kv-policy", CLI_STR, &policy_s, 0, 0, NULL},
        {NULL, "--ctx", CLI_I64, &ctx, 1, (double)((int64_t)1 << 32), NULL},
        {NULL, "--kv-f32", CLI_BOOL, &kv_f32, 0, 0, NULL},
        {NULL, "--ignore-eos", CLI_BOOL, &ignore_eos, 0, 0, NULL},
        {NULL, "--no-bos", CLI_BOOL, &no_bos, 0, 0, NULL},
    };
    int prc = cli_parse(argc, argv, opts, (int)(sizeof opts / sizeof opts[0]), "run", usage);
    if (prc >= 0)
        return prc;
    sp.seed = (uint64_t)seed;
    if (policy_s &&
        (engine_policy_parse(policy_s, &policy) < 0 || policy.kind == ENGINE_POLICY_RECOMPUTE)) {
        fprintf(stderr, "error: --kv-policy '%s' (dense, window, sinks:N or auto)\n", policy_s);
        return ENGINE_EXIT_USAGE;
    }
    char *file_text = NULL;
    size_t plen = 0;
    if (file) {
        file_text = cli_read_file(file, &plen);
        if (!file_text) {
            fprintf(stderr, "error: cannot read %s: %s\n", file, strerror(errno));
            return ENGINE_EXIT_USAGE;
        }
        prompt = file_text;
    } else if (!prompt) {
        fprintf(stderr, "error: a prompt is required (-p TEXT or -f FILE)\n");
        return ENGINE_EXIT_USAGE;
    } else {
        plen = strlen(prompt);
    }

    /* The window is sized before tokenizing from the byte length (a prompt has
     * at most one token per byte, plus BOS); the decoder caps it at the
     * model's context length. */
    struct decoder *d;
    int64_t window =
        ctx > 0 ? ctx : (keep > 0 && keep < (int64_t)plen ? keep : (int64_t)plen) + 2 + n_predict;
    struct decoder_config cfg = {
        .model_path = model,
        .n_threads = (int)threads,
        .backend = backend,
        .max_tokens = chunk,
        .n_sinks = policy.kind == ENGINE_POLICY_SINKS && policy.n_sinks > DECODER_DEFAULT_SINKS
                       ? policy.n_sinks
                       : DECODER_DEFAULT_SINKS,
        .window = window,
        .n_slots = 1,
        .kv_dtype = kv_f32 ? ENGINE_KV_F32 : ENGINE_KV_F16,
    };
    int rc = cli_open(&d, &cfg);
    if (rc != ENGINE_EXIT_OK) {
        free(file_text);
        return rc;
    }
    struct decoder_info info;
    decoder_get_info(d, &info);
    int exit_code = ENGINE_EXIT_OK;
    int32_t *ids = NULL;
    struct decoder_sampler *smp = NULL;
    int64_t seq = -1;
    int64_t cap = (int64_t)plen + 2;
    ids = malloc((size_t)cap * sizeof *ids);
    int64_t n_prompt =
        ids ? decoder_tokenize(d, prompt, plen, !no_bos && info.add_bos, 1, ids, cap) : -ENOMEM;
    if (n_prompt < 0 || n_prompt > cap) {
        fprintf(stderr, "error: tokenizing the prompt failed (%lld)\n", (long long)n_prompt);
        exit_code = ENGINE_EXIT_RUNTIME;
        goto out;
    }
    if (keep > 0 && n_prompt > keep)
        n_prompt = keep;
    if (n_prompt == 0) {
        fprintf(stderr, "error: the prompt is empty and the model has no BOS token\n");
        exit_code = ENGINE_EXIT_USAGE;
        goto out;
    }
    if (ctx > 0 && policy.kind == ENGINE_POLICY_DENSE && n_prompt + n_predict > ctx) {
        fprintf(stderr, "error: prompt (%lld tokens) + n (%lld) exceeds --ctx %lld\n",
                (long long)n_prompt, (long long)n_predict, (long long)ctx);
        exit_code = ENGINE_EXIT_USAGE;
        goto out;
    }
    if (decoder_sampler_new(&smp, &sp, info.n_vocab) < 0) {
        fprintf(stderr, "error: bad sampling parameters\n");
        exit_code = ENGINE_EXIT_USAGE;
        goto out;
    }

    window = info.window;
    seq = decoder_seq_open(d, &policy, window);
    if (seq < 0) {
        fprintf(stderr, "error: cannot open a sequence (%lld)\n", (long long)seq);
        exit_code = ENGINE_EXIT_RUNTIME;
        goto out;
    }
    if (policy.kind == ENGINE_POLICY_DENSE && n_prompt > window) {
        fprintf(stderr, "error: the prompt (%lld tokens) exceeds the context (%lld)\n",
                (long long)n_prompt, (long long)window);
        exit_code = ENGINE_EXIT_USAGE;
        goto out;
    }

    double t0 = cli_now();
    for (int64_t i = 0; i < n_prompt; i += chunk) {
        int64_t n = n_prompt - i < chunk ? n_prompt - i : chunk;
        struct decoder_input in = {seq, ids + i, n,
                                   i + n == n_prompt ? DECODER_LOGITS_LAST : DECODER_LOGITS_NONE};
        int64_t r = decoder_step(d, &in, 1);
        if (r < 0) {
            fprintf(stderr, "error: forward step failed (%lld)\n", (long long)r);
            exit_code = ENGINE_EXIT_RUNTIME;
            goto out;
        }
    }
    for (int64_t i = 0; i < n_prompt; i++)
        decoder_sampler_accept(smp, ids[i]);
    double t1 = cli_now();

    struct decoder_text ts = {{0}, 0};
    char piece[1024];
    int64_t n_gen = 0;
    for (; n_gen < n_predict; n_gen++) {
        int32_t next = decoder_sampler_sample(smp, decoder_logits(d));
        decoder_sampler_accept(smp, next);
        if (!ignore_eos && decoder_token_is_eog(d, next)) {
            n_gen++;
            break;
        }
        int64_t w = decoder_text_push(d, &ts, next, piece, sizeof piece);
        if (w > 0) {
            fwrite(piece, 1, (size_t)w, stdout);
            fflush(stdout);
        }
        if (n_gen + 1 == n_predict)
            break;
        struct decoder_input in = {seq, &next, 1, DECODER_LOGITS_LAST};
        int64_t r = decoder_step(d, &in, 1);
        if (r == -ENOSPC) {
            fprintf(stderr, "\n[context full: %lld tokens]\n", (long long)window);
            n_gen++;
            break;
        }
        if (r < 0) {
            fprintf(stderr, "\nerror: forward step failed (%lld)\n", (long long)r);
            exit_code = ENGINE_EXIT_RUNTIME;
            goto out;
        }
    }
    int64_t w = decoder_text_flush(&ts, piece, sizeof piece);
    if (w > 0)
        fwrite(piece, 1, (size_t)w, stdout);
    printf("\n");
    double t2 = cli_now();
    /* n_gen tokens sampled, n_gen - 1 decode steps after the prompt */
    int64_t steps = n_gen > 0 ? n_gen - 1 : 0;
    fprintf(stderr, "prompt: %lld tokens in %.3f s (%.1f tokens/s)\n", (long long)n_prompt, t1 - t0,
            (double)n_prompt / (t1 - t0));
    fprintf(stderr, "decode: %lld tokens in %.3f s (%.1f tokens/s)\n", (long long)steps, t2 - t1,
            steps > 0 ? (double)steps / (t2 - t1) : 0.0);
out:
    decoder_sampler_free(smp);
    decoder_seq_close(d, seq);
    free(ids);
    free(file_text);
    decoder_close(d);
    return exit_code;
}
