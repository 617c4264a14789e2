/*
 * run.c: `streamsink run`: prompt in, streamed text out, one sequence on
 * the calling thread. Prompt and decode speeds go to stderr.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "decoder.h"
#include "engine.h"

int cmd_run(int argc, char **argv)
{
    const char *model = cmd_default_model(), *prompt = NULL, *file = NULL, *policy_s = NULL;
    int64_t n_predict, threads, chunk, ctx = 0, keep = 0, seed;
    struct engine_policy policy = {ENGINE_POLICY_DENSE, 0};
    int ignore_eos = 0, no_bos = 0, kv_f32 = 0, special = 0;
    const char *kv_dtype_s = NULL;
    enum engine_kv_dtype kv_dtype;
    enum engine_backend backend;
    struct engine_sampling sp = engine_sampling_defaults();
    const struct cmd_flag flags[] = {
        {"-m", "--model", CMD_STR, &model, 0, 0, NULL, "FILE", CMD_MODEL_HELP, NULL},
        {"-p", "--prompt", CMD_STR, &prompt, 0, 0, NULL, "TEXT",
         "prompt text (special tokens like <|im_start|> are parsed)", NULL},
        {"-f", "--file", CMD_STR, &file, 0, 0, NULL, "FILE", "read the prompt from FILE instead",
         NULL},
        {"-n", "--n-predict", CMD_I64, &n_predict, 0, (double)((int64_t)1 << 40), "128", "N",
         "tokens to generate (stops early at EOS unless --ignore-eos)", NULL},
        {"-t", "--threads", CMD_I64, &threads, 1, 256, "2", "N", "CPU threads", NULL},
        {NULL, "--backend", CMD_BACKEND, &backend, 0, 0, "cpu", "B", "cpu or cuda", NULL},
        {NULL, "--temp", CMD_F32, &sp.temperature, 0, 100, "0", "X", "temperature; 0 is greedy",
         NULL},
        {NULL, "--top-k", CMD_I64, &sp.top_k, 0, 1 << 30, "0", "N",
         "keep the N most likely tokens (0: all)", NULL},
        {NULL, "--top-p", CMD_F32, &sp.top_p, 1e-6, 1, "1", "X", "nucleus sampling mass (1: all)",
         NULL},
        {NULL, "--min-p", CMD_F32, &sp.min_p, 0, 1, "0", "X",
         "drop tokens below X times the top probability", NULL},
        {NULL, "--repeat-penalty", CMD_F32, &sp.repeat_penalty, 1e-3, 100, "1", "X",
         "repetition penalty (1: none)", NULL},
        {NULL, "--presence-penalty", CMD_F32, &sp.presence_penalty, -2, 2, "0", "X",
         "OpenAI presence penalty", NULL},
        {NULL, "--frequency-penalty", CMD_F32, &sp.frequency_penalty, -2, 2, "0", "X",
         "OpenAI frequency penalty", NULL},
        {NULL, "--penalty-last-n", CMD_I64, &sp.penalty_last_n, 0, 1 << 20, "64", "N",
         "tokens the penalties look back over", NULL},
        {NULL, "--seed", CMD_I64, &seed, 0, (double)INT64_MAX, "0", "N", "random seed", NULL},
        {NULL, "--chunk", CMD_I64, &chunk, 1, 1 << 16, "256", "N", "prompt tokens per forward step",
         NULL},
        {NULL, "--prompt-tokens", CMD_I64, &keep, 1, (double)((int64_t)1 << 40), NULL, "N",
         "use only the prompt's first N tokens (benchmarks)", NULL},
        {NULL, "--kv-policy", CMD_STR, &policy_s, 0, 0, "dense", "P",
         "KV policy: dense, window, sinks:N or auto", NULL},
        {NULL, "--ctx", CMD_I64, &ctx, 1, (double)((int64_t)1 << 32), NULL, "N",
         "KV window in tokens (default: prompt + n, at most the model's context length)", NULL},
        {NULL, "--kv-dtype", CMD_STR, &kv_dtype_s, 0, 0, NULL, "T",
         "KV cache storage: f16 (default) | f32 | q8_0", NULL},
        {NULL, "--kv-f32", CMD_BOOL, &kv_f32, 0, 0, NULL, "", "the same as --kv-dtype f32", NULL},
        {NULL, "--ignore-eos", CMD_BOOL, &ignore_eos, 0, 0, NULL, "",
         "keep generating past end-of-sequence tokens", NULL},
        {NULL, "--no-bos", CMD_BOOL, &no_bos, 0, 0, NULL, "",
         "do not prepend BOS even if the model asks for it", NULL},
        {NULL, "--special", CMD_BOOL, &special, 0, 0, NULL, "",
         "print the text of generated control tokens (<|im_start|>, <bos>...), which is left "
         "out by default",
         NULL},
    };
    const struct cmd_spec spec = {
        "run",
        "[-m FILE] -p PROMPT [-n N] [options]",
        "Runs one prompt through the model (CPU, or CUDA with --backend cuda) and streams\n"
        "the text to stdout. Prompt and decode speeds are printed to stderr.",
        flags,
        (int)(sizeof flags / sizeof flags[0]),
        NULL};
    int prc = cmd_parse(&spec, argc, argv);
    if (prc >= 0)
        return prc;
    sp.seed = (uint64_t)seed;
    if (cmd_kv_dtype(kv_dtype_s, kv_f32, &kv_dtype) != CMD_EXIT_OK)
        return CMD_EXIT_USAGE;
    if (engine_policy_parse(policy_s, &policy) < 0 || policy.kind == ENGINE_POLICY_RECOMPUTE) {
        fprintf(stderr, "error: --kv-policy '%s' (dense, window, sinks:N or auto)\n", policy_s);
        return CMD_EXIT_USAGE;
    }
    char *file_text = NULL;
    size_t plen = 0;
    if (file && prompt) {
        fprintf(stderr, "error: -p and -f both give the prompt; give one\n");
        return CMD_EXIT_USAGE;
    }
    if (file) {
        file_text = cmd_read_file(file, &plen);
        if (!file_text) {
            fprintf(stderr, "error: cannot read %s: %s\n", file, strerror(errno));
            return CMD_EXIT_USAGE;
        }
        prompt = file_text;
    } else if (!prompt) {
        fprintf(stderr, "error: a prompt is required (-p TEXT or -f FILE)\n");
        return CMD_EXIT_USAGE;
    } else {
        plen = strlen(prompt);
    }

    /* The window is sized before tokenizing from the byte length (a prompt has
     * at most one token per byte, plus BOS); the decoder caps it at the
     * model's context length. So is the step: no chunk longer than the prompt
     * can be (nor, dense, than the window), and the decoder keeps it within
     * the context; what it allocates grows with the step. */
    struct decoder *d;
    int64_t most = (keep > 0 && keep < (int64_t)plen ? keep : (int64_t)plen) + 2;
    int64_t window = ctx > 0 ? ctx : most + n_predict;
    if (chunk > most)
        chunk = most;
    if (policy.kind == ENGINE_POLICY_DENSE && chunk > window)
        chunk = window;
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
        .kv_dtype = kv_dtype,
    };
    int rc = cmd_open_decoder(&d, &cfg);
    if (rc != CMD_EXIT_OK) {
        free(file_text);
        return rc;
    }
    struct decoder_info info;
    decoder_get_info(d, &info);
    chunk = info.max_tokens;
    int exit_code = CMD_EXIT_OK;
    int32_t *ids = NULL;
    struct decoder_sampler *smp = NULL;
    int64_t seq = -1;
    int64_t cap = (int64_t)plen + 2;
    ids = malloc((size_t)cap * sizeof *ids);
    int64_t n_prompt =
        ids ? decoder_tokenize(d, prompt, plen, !no_bos && info.add_bos, 1, ids, cap) : -ENOMEM;
    if (n_prompt < 0 || n_prompt > cap) {
        fprintf(stderr, "error: tokenizing the prompt failed (%lld)\n", (long long)n_prompt);
        exit_code = CMD_EXIT_RUNTIME;
        goto out;
    }
    if (keep > 0 && n_prompt > keep)
        n_prompt = keep;
    if (n_prompt == 0) {
        fprintf(stderr, "error: the prompt is empty and %s\n",
                no_bos ? "--no-bos leaves no token to start from" : "the model has no BOS token");
        exit_code = CMD_EXIT_USAGE;
        goto out;
    }
    if (ctx > 0 && policy.kind == ENGINE_POLICY_DENSE && n_prompt + n_predict > ctx) {
        fprintf(stderr, "error: prompt (%lld tokens) + n (%lld) exceeds --ctx %lld\n",
                (long long)n_prompt, (long long)n_predict, (long long)ctx);
        exit_code = CMD_EXIT_USAGE;
        goto out;
    }
    if (decoder_sampler_new(&smp, &sp, info.n_vocab) < 0) {
        fprintf(stderr, "error: bad sampling parameters\n");
        exit_code = CMD_EXIT_USAGE;
        goto out;
    }

    window = info.window;
    seq = decoder_seq_open(d, &policy, window);
    if (seq < 0) {
        fprintf(stderr, "error: cannot open a sequence (%lld)\n", (long long)seq);
        exit_code = CMD_EXIT_RUNTIME;
        goto out;
    }
    if (policy.kind == ENGINE_POLICY_DENSE && n_prompt > window) {
        fprintf(stderr, "error: the prompt (%lld tokens) exceeds the context (%lld)\n",
                (long long)n_prompt, (long long)window);
        exit_code = CMD_EXIT_USAGE;
        goto out;
    }

    double t0 = cmd_now(), t_last = t0; /* t_last: when the prompt's last chunk began */
    int64_t last_at = 0;                /* and the tokens before it */
    for (int64_t i = 0; i < n_prompt; i += chunk) {
        int64_t n = n_prompt - i < chunk ? n_prompt - i : chunk;
        t_last = cmd_now();
        last_at = i;
        struct decoder_input in = {seq, ids + i, n,
                                   i + n == n_prompt ? DECODER_LOGITS_LAST : DECODER_LOGITS_NONE};
        int64_t r = decoder_step(d, &in, 1);
        if (r < 0) {
            fprintf(stderr, "error: forward step failed (%lld)\n", (long long)r);
            exit_code = CMD_EXIT_RUNTIME;
            goto out;
        }
    }
    for (int64_t i = 0; i < n_prompt; i++)
        decoder_sampler_accept(smp, ids[i]);
    double t1 = cmd_now();

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
        int64_t w = !special && decoder_token_is_control(d, next)
                        ? 0
                        : decoder_text_push(d, &ts, next, piece, sizeof piece);
        if (w > 0) {
            fwrite(piece, 1, (size_t)w, stdout);
            fflush(stdout);
        }
        if (n_gen + 1 == n_predict) { /* the last token needs no step after it */
            n_gen++;
            break;
        }
        struct decoder_input in = {seq, &next, 1, DECODER_LOGITS_LAST};
        int64_t r = decoder_step(d, &in, 1);
        if (r == -ENOSPC) {
            fprintf(stderr, "\n[context full: %lld tokens]\n", (long long)window);
            n_gen++;
            break;
        }
        if (r < 0) {
            fprintf(stderr, "\nerror: forward step failed (%lld)\n", (long long)r);
            exit_code = CMD_EXIT_RUNTIME;
            goto out;
        }
    }
    int64_t w = decoder_text_flush(&ts, piece, sizeof piece);
    if (w > 0)
        fwrite(piece, 1, (size_t)w, stdout);
    printf("\n");
    double t2 = cmd_now();
    /* n_gen tokens sampled, n_gen - 1 decode steps after the prompt */
    int64_t steps = n_gen > 0 ? n_gen - 1 : 0;
    fprintf(stderr, "prompt: %lld tokens in %.3f s (%.1f tokens/s)\n", (long long)n_prompt, t1 - t0,
            (double)n_prompt / (t1 - t0));
    if (last_at > 0) /* a prompt at depth: the last chunk after the context the others made */
        fprintf(stderr, "prompt's last chunk: %lld tokens after %lld in %.3f s (%.1f tokens/s)\n",
                (long long)(n_prompt - last_at), (long long)last_at, t1 - t_last,
                (double)(n_prompt - last_at) / (t1 - t_last));
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
