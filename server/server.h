/*
 * server.h: the server module's public header, for main.c: `streamsink
 * serve`. Everything else in server/ is internal (router.h holds what
 * server.c and router.c share).
 */
#ifndef SS_SERVER_H
#define SS_SERVER_H

/* `streamsink serve [flags]`: runs until SIGTERM/SIGINT and returns the
 * process exit code: 0 ok (drained), 1 runtime failure, 2 bad usage, 3 bad or
 * missing model file (engine.h's ENGINE_EXIT_*). */
int server_cmd_serve(int argc, char **argv);

#endif
