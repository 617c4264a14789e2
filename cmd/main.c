/*
 * main.c: the streamsink program. One binary, one file per command:
 *   run         one prompt, streamed to stdout                  (run.c)
 *   serve       the OpenAI-compatible HTTP server               (serve.c)
 *   perplexity  StreamingLLM's perplexity-under-eviction eval  (perplexity.c)
 *   probe       attention-sink probe per layer and head        (probe.c)
 *   calibrate   per-head sink logits from measured attention    (calibrate.c)
 * Exit codes (cmd.h): 0 ok, 1 runtime failure, 2 usage, 3 bad model file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cmd.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: streamsink <command> [options]\n"
               "\n"
               "commands:\n"
               "  run         run one prompt and stream the text to stdout\n"
               "  serve       serve the OpenAI API over HTTP (streaming, sessions, metrics)\n"
               "  perplexity  score a long text under a KV eviction policy\n"
               "  probe       measure attention sinks per layer and head\n"
               "  calibrate   closed-form per-head sink logits for a learned-sink retrofit\n"
               "\n"
               "`streamsink <command> --help` describes each command's options.\n"
               "exit codes: 0 ok, 1 runtime failure, 2 bad usage, 3 bad or missing model file\n");
}

static int dispatch(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CMD_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "run") == 0)
        return cmd_run(argc - 1, argv + 1);
    if (strcmp(cmd, "serve") == 0)
        return cmd_serve(argc - 1, argv + 1);
    if (strcmp(cmd, "perplexity") == 0)
        return cmd_perplexity(argc - 1, argv + 1);
    if (strcmp(cmd, "probe") == 0)
        return cmd_probe(argc - 1, argv + 1);
    if (strcmp(cmd, "calibrate") == 0)
        return cmd_calibrate(argc - 1, argv + 1);
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
        usage(stdout);
        return CMD_EXIT_OK;
    }
    fprintf(stderr, "error: unknown command '%s'\n", cmd);
    usage(stderr);
    return CMD_EXIT_USAGE;
}

/* Standard input, output and error that the caller closed (>&-, a
 * supervisor) are opened on /dev/null: else the next file or socket the
 * process opens takes their number, and libuv asserts that no handle of
 * its own is one of them (an abort at the server's exit), or a message
 * meant for stderr lands in a snapshot. */
static void keep_standard_fds(void)
{
    for (int fd = 0; fd <= 2; fd++) {
        if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
            continue;
        int nul = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
        if (nul >= 0 && nul != fd) { /* (open takes the lowest free number: fd) */
            dup2(nul, fd);
            close(nul);
        }
    }
}

int main(int argc, char **argv)
{
    keep_standard_fds();
    int rc = dispatch(argc, argv);
    /* what a command printed is its result: output that never arrived (a
     * full disk, a closed pipe's reader gone with SIGPIPE ignored) is a
     * failure, not exit 0; flushed, not closed */
    int lost = ferror(stdout);
    if (fflush(stdout) != 0)
        fprintf(stderr, "error: writing standard output: %s\n", strerror(errno));
    else if (lost)
        fprintf(stderr, "error: writing standard output failed\n");
    if ((lost || ferror(stdout)) && rc == CMD_EXIT_OK)
        rc = CMD_EXIT_RUNTIME;
    return rc;
}
