/*
 * session.h: sessions on the engine thread (session.c). Internal to engine/.
 *
 * A session is a seq that outlives its request: when a request with a
 * session_id finishes, its slot is parked (SEQ_IDLE) with its KV, its
 * positions and the token sampled last, and the session's next request
 * continues the stream in the same slot. A parked session leaves memory when
 * it has been idle for --session-idle seconds, or when its slot is the least
 * recently used one and a new sequence needs a slot.
 */
#ifndef SS_SESSION_H
#define SS_SESSION_H

#include "engine_impl.h"

/* The seq (running or idle) of session sid, or NULL. */
struct seq *session_find(struct engine *e, const char *sid);
/* A slot for a new sequence: a free one, else the least recently used idle
 * session's (that session leaves memory). NULL when every slot runs. */
struct seq *session_take_slot(struct engine *e);
/* The request running in s is over and s is a session: keep its KV. */
void session_park(struct seq *s, double now);
/* Idle sessions older than --session-idle leave memory. */
void session_expire(struct engine *e, double now);

#endif
