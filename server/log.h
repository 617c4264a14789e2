/* log.h: one log function with levels, to stderr, with a timestamp. */
#ifndef SS_LOG_H
#define SS_LOG_H

enum log_level { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR };

void log_set_level(enum log_level lv);
void log_msg(enum log_level lv, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
