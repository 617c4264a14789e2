/* log.c: see log.h. Lines are written with one fprintf so threads do not interleave. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

static enum log_level min_level = LOG_INFO;

void log_set_level(enum log_level lv)
{
    min_level = lv;
}

void log_msg(enum log_level lv, const char *fmt, ...)
{
    static const char *const names[] = {"debug", "info", "warn", "error"};
    if (lv < min_level)
        return;
    char raw[1024], msg[4 * sizeof raw];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    /* one line, whatever a message quotes (a file's name is anybody's
     * bytes): control characters as \xNN, so none can forge a line. Other
     * bytes pass, UTF-8 or not: an operator reading the log sees the name's
     * bytes as they are. (Names the server sends to clients, in JSON or a
     * metrics label, are cleaned by api_text_clean instead, which must give
     * valid UTF-8 and so writes U+FFFD, losing the byte.) */
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)raw; *p; p++) {
        if (*p < 0x20 || *p == 0x7f)
            o += (size_t)snprintf(msg + o, sizeof msg - o, "\\x%02x", *p);
        else
            msg[o++] = (char)*p;
    }
    msg[o] = 0;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s %s\n", tm.tm_year + 1900,
            tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
            names[lv], msg);
}
