/* session.c: sessions that keep their KV slot between requests (session.h). */
#include "session.h"

#include <string.h>

struct seq *session_find(struct engine *e, const char *sid)
{
    for (int64_t i = 0; i < e->cfg.max_seqs; i++)
        if (e->seqs[i].state != SEQ_FREE && strcmp(e->seqs[i].session, sid) == 0)
            return &e->seqs[i];
    return NULL;
}

struct seq *session_take_slot(struct engine *e)
{
    struct seq *lru = NULL;
    for (int64_t i = 0; i < e->cfg.max_seqs; i++) {
        struct seq *s = &e->seqs[i];
        if (s->state == SEQ_FREE) {
            int64_t slot;
            if (kv_pool_acquire(&e->dec.fwd.pool, &slot) < 0)
                return NULL;
            s->kv.slot = slot;
            return s;
        }
        if (s->state == SEQ_IDLE && (!lru || s->last_used < lru->last_used))
            lru = s;
    }
    if (lru) {
        engine__seq_release(e, lru);
        int64_t slot;
        if (kv_pool_acquire(&e->dec.fwd.pool, &slot) < 0)
            return NULL;
        lru->kv.slot = slot;
        return lru;
    }
    return NULL;
}

void session_park(struct seq *s, double now)
{
    s->state = SEQ_IDLE;
    s->last_used = now;
}

void session_expire(struct engine *e, double now)
{
    for (int64_t i = 0; i < e->cfg.max_seqs; i++) {
        struct seq *s = &e->seqs[i];
        if (s->state == SEQ_IDLE && now - s->last_used > (double)e->cfg.session_idle_s)
            engine__seq_release(e, s);
    }
}
