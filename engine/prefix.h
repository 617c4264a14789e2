/*
 * prefix.h: the prompt prefixes free KV slots still hold. Internal to
 * engine/.
 *
 * A slot's cells outlive the request that wrote them: until another request
 * writes over them, a free slot holds the KV of every token its last
 * request stored. A new request whose prompt begins with those tokens takes
 * that slot and starts its prefill after them, as llama-server's
 * cache_prompt and vLLM's prefix caching do for a client that sends a whole
 * conversation each turn.
 *
 * It is exact: a token's K and V depend only on the tokens before it and
 * their positions (chunked prefill equals token by token, bit for bit, and a
 * step's other sequences change nothing), so the cells of positions [0, m)
 * are those a prefill of the same m tokens writes, provided no later
 * position has written over any of them: while the sequence never wrapped
 * a ring (at most its sinks plus its ring's cells, and a local layer's ring
 * where the model has them) any prefix may be taken; once it wrapped, only
 * a start at most C (the chunk) tokens before its end, as far as
 * kv_seq_retract may go back. A record is kept from position 0, up to the
 * longest prompt, by a sequence that is no session (a session's slot is
 * its own), under the same policy and window as the request that would
 * take it.
 * A record is its owner's (the API key's): a request of another key never
 * starts from it, so that no key can learn what another's prompts began
 * with, neither from the usage's cached tokens nor from a prefill's time.
 */
#ifndef SS_PREFIX_H
#define SS_PREFIX_H

#include <stdint.h>

#include "engine_impl.h"

/* Allocates a record for each KV slot. 0 or -ENOMEM. */
int prefix_init(struct engine *e);
void prefix_free(struct engine *e);
/* Slot's cells no longer hold a record (a restore, a failed step). */
void prefix_forget(struct engine *e, int64_t slot);
/* s, a fresh sequence just set up in its slot with its prompt (n_fed 0),
 * takes the free slot whose record shares the longest prefix with the
 * prompt (its own, if none is longer) and starts after that prefix, at
 * most all of the prompt but its last token (whose logits the first pick
 * needs). Returns the prompt tokens it need not prefill (s->n_fed and its
 * KV are set to them), 0 if none. */
int64_t prefix_take(struct engine *e, struct seq *s);
/* s stored toks[0..n) at its positions pos_next - n .. pos_next - 1 in this
 * step: its slot's record grows, or ends when it can no longer be exact. */
void prefix_record(struct engine *e, const struct seq *s, const int32_t *toks, int64_t n);
/* sib took lead's prompt cells as a snapshot holds them: its record is
 * lead's first n_prompt tokens, when lead's record holds them and the copy
 * held every one of their cells (a prompt no longer than the sinks and the
 * window, and a local layer's window). */
void prefix_share(struct engine *e, const struct seq *lead, const struct seq *sib);

#endif
