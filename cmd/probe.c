/*
 * probe.c: `streamsink probe`: where does attention go? Per layer and
 * head, the mean attention mass on the first 1, 4 and 16 positions for
 * queries at position >= 64, and the sink rate (share of heads whose mean
 * first-position mass exceeds 0.3).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd.h"
#include "decoder.h"
#include "engine.h"

int cmd_probe(int argc, char **argv)
{
    const char *model = cmd_default_model(), *text_path = NULL, *json = NULL;
    int64_t max_tok, threads;
    char about[512];
    snprintf(about, sizeof about,
             "Measures attention sinks: per layer and head, the mean attention mass that\n"
             "queries at position >= %d put on the first 1, 4 and 16 tokens, and the sink\n"
             "rate: the share of heads whose first-token mass exceeds %.1f.",
             DECODER_PROBE_MIN_CTX, (double)DECODER_PROBE_SINK_MASS);
    const struct cmd_flag flags[] = {
        {"-m", "--model", CMD_STR, &model, 0, 0, NULL, "FILE", CMD_MODEL_HELP, NULL},
        {NULL, "--text", CMD_STR, &text_path, 0, 0, NULL, "FILE",
         "text to run (default: a built-in paragraph)", NULL},
        {NULL, "--tokens", CMD_I64, &max_tok, DECODER_PROBE_MIN_CTX + 1, 1 << 20, "1024", "N",
         "use the first N tokens of the text", NULL},
        {NULL, "--json", CMD_STR, &json, 0, 0, NULL, "FILE", "also write the table as JSON", NULL},
        {"-t", "--threads", CMD_I64, &threads, 1, 256, "2", "N", "CPU threads", NULL},
    };
    const struct cmd_spec spec = {"probe",
                                  "[-m FILE] [--text FILE] [--tokens N] [--json FILE]",
                                  about,
                                  flags,
                                  (int)(sizeof flags / sizeof flags[0]),
                                  NULL};
    int prc = cmd_parse(&spec, argc, argv);
    if (prc >= 0)
        return prc;
    char *text = NULL;
    size_t len;
    if (text_path) {
        text = cmd_read_file(text_path, &len);
        if (!text) {
            fprintf(stderr, "error: cannot read %s: %s\n", text_path, strerror(errno));
            return CMD_EXIT_USAGE;
        }
    } else {
        len = strlen(decoder_probe_text);
        text = malloc(len + 1);
        if (!text)
            return CMD_EXIT_RUNTIME;
        memcpy(text, decoder_probe_text, len + 1);
    }
    struct decoder *d;
    struct decoder_config cfg = {.model_path = model,
                                 .n_threads = (int)threads,
                                 .max_tokens = 256,
                                 .n_sinks = 0,
                                 .window = max_tok,
                                 .n_slots = 1,
                                 .kv_dtype = ENGINE_KV_F16};
    int rc = cmd_open_decoder(&d, &cfg);
    if (rc != CMD_EXIT_OK) {
        free(text);
        return rc;
    }
    struct decoder_info info;
    decoder_get_info(d, &info);
    int exit_code = CMD_EXIT_OK;
    int32_t *ids = NULL;
    int64_t n = cmd_tokenize_text(d, text, len, info.add_bos, &ids);
    if (n < 0) {
        exit_code = CMD_EXIT_RUNTIME;
        goto out;
    }
    if (n > info.window)
        n = info.window;
    if (n <= DECODER_PROBE_MIN_CTX) {
        fprintf(stderr, "error: the probe needs more than %d tokens of text (got %lld)\n",
                DECODER_PROBE_MIN_CTX, (long long)n);
        exit_code = CMD_EXIT_USAGE;
        goto out;
    }
    struct decoder_probe pr;
    int run = decoder_probe_run(d, ids, n, &pr);
    if (run < 0) {
        fprintf(stderr, "error: the probe failed: %s\n", strerror(-run));
        exit_code = CMD_EXIT_RUNTIME;
        goto out;
    }
    printf("model %s, normalizer %s, %lld tokens, %lld queries per head\n", info.name,
           info.normalizer, (long long)n, (long long)pr.n_queries);
    printf("layer  head  first1  first4  first16\n");
    for (int l = 0; l < pr.n_layer; l++)
        for (int h = 0; h < pr.n_head; h++) {
            int i = l * pr.n_head + h;
            printf("%5d  %4d  %6.3f  %6.3f  %7.3f%s\n", l, h, (double)pr.mass1[i],
                   (double)pr.mass4[i], (double)pr.mass16[i],
                   pr.mass1[i] > DECODER_PROBE_SINK_MASS ? "  sink" : "");
        }
    printf("layer means:\n");
    for (int l = 0; l < pr.n_layer; l++) {
        double a = 0, b = 0, c = 0;
        for (int h = 0; h < pr.n_head; h++) {
            a += pr.mass1[l * pr.n_head + h];
            b += pr.mass4[l * pr.n_head + h];
            c += pr.mass16[l * pr.n_head + h];
        }
        printf("%5d        %6.3f  %6.3f  %7.3f\n", l, a / pr.n_head, b / pr.n_head, c / pr.n_head);
    }
    printf("sink rate %.3f (%d of %d heads put more than %.1f on the first token)\n",
           (double)pr.sink_rate, (int)(pr.sink_rate * (float)(pr.n_layer * pr.n_head) + 0.5f),
           pr.n_layer * pr.n_head, (double)DECODER_PROBE_SINK_MASS);
    if (json) {
        FILE *jf = fopen(json, "w");
        if (jf) {
            fprintf(jf, "{\"tokens\": %lld, \"sink_rate\": %.5f, \"heads\": [", (long long)n,
                    (double)pr.sink_rate);
            for (int i = 0; i < pr.n_layer * pr.n_head; i++)
                fprintf(jf,
                        "%s{\"layer\": %d, \"head\": %d, \"first1\": %.5f, \"first4\": %.5f, "
                        "\"first16\": %.5f}",
                        i ? "," : "", i / pr.n_head, i % pr.n_head, (double)pr.mass1[i],
                        (double)pr.mass4[i], (double)pr.mass16[i]);
            fprintf(jf, "]}\n");
            if (cmd_close_output(jf, json) != CMD_EXIT_OK)
                exit_code = CMD_EXIT_RUNTIME;
        } else {
            fprintf(stderr, "error: cannot write %s\n", json);
            exit_code = CMD_EXIT_RUNTIME;
        }
    }
    decoder_probe_free(&pr);
out:
    free(ids);
    free(text);
    decoder_close(d);
    return exit_code;
}
