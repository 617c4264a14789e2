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
#include "snapshot.h"

/* The seq (running or idle) of session sid, or NULL. */
struct seq *session_find(struct engine *e, const char *sid);
/* A slot for a new sequence: a free one, else the least recently used idle
 * session's (that session leaves memory). NULL when every slot runs, or
 * when the session to leave would have to wait for a save place. */
struct seq *session_take_slot(struct engine *e);
/* 1 when no idle session can leave memory: every save place holds a
 * snapshot whose write failed (until a retried write succeeds). */
int session_idle_pinned(const struct engine *e);
/* 1 when need slots will not come free by itself: fewer are free, every
 * other slot holds an idle session, and every save place holds a snapshot
 * whose write failed, so none of them can leave memory (until a retried
 * write succeeds) and nothing runs. */
int session_slots_stuck(const struct engine *e, int64_t need);
/* The request running in s is over and s is a session: keep its KV. */
void session_park(struct seq *s, double now);
/* Idle sessions unused for more than idle_s seconds (--session-idle) leave
 * memory, written to the directory first; one whose save fails stays and is
 * tried again later. Returns how many saves failed. */
int64_t session_expire(struct engine *e, double now, double idle_s);
/* Engine stop: every idle session is written to the directory. */
void session_save_all(struct engine *e);

/* --session-dir: opens the directory and hashes the model file (SHA-256).
 * 0 when there is no directory. -errno with a message in err. */
int session_dir_open(struct engine *e, char *err, size_t err_len);
void session_dir_close(struct engine *e);

/* Fills m's layout from geometry g and the positions and policy of kv (the
 * fields session_copy_cells reads), derived cells included; the rest of m
 * is left as it is. */
void session_cells_meta(const struct kv_geometry *g, const struct kv_seq *kv,
                        struct snapshot_meta *m);
/* Copies the cells a snapshot holds (snapshot.h: per layer, a global
 * layer's sinks then window positions, a local layer's last positions, each
 * in position order) between slot kv->slot of backend b (geometry g) and K/V
 * laid out as m says: import 0 reads the backend into k/v, 1 writes k/v
 * into it. 0 or the backend's error. */
int session_copy_cells(struct backend *b, const struct kv_geometry *g, const struct kv_seq *kv,
                       const struct snapshot_meta *m, uint8_t *k, uint8_t *v, int import);

/* At most this many snapshots are in memory between the engine thread and
 * the disk (copied out of the KV cache, not yet written, or held after a
 * failed write); a save beyond it waits for the writer. */
#define SESSION_SAVES_MAX 2

/* Copies s (a session, idle) out of its KV slot and hands the copy to the
 * writer thread, which writes DIR/<id>.snap atomically; s may leave memory
 * at once. answer_id: an explicit save, answered (engine__save_answer) when
 * the file is written or the write failed; 0 for none. 0, or -errno with a
 * reason in err (which may be NULL): then nothing was handed over. */
int session_save(struct engine *e, struct seq *s, uint64_t answer_id, char *err, size_t err_len);
/* 1 when session_save would not wait for the writer now (a place is free, or
 * none can be freed by it), 0 when it would: then the engine thread does
 * not save (a session that must leave its slot stays, a request that needs
 * the slot or asks for the save waits), so that it never waits on the
 * disk. */
int session_save_room(struct engine *e);
/* Engine thread, every turn: takes the writer's results, retries held saves. */
void session_saves_poll(struct engine *e);
/* A deleted session: waits for its saves and drops the held ones. Returns
 * how many held saves of key's session id it dropped. */
int session_saves_forget(struct engine *e, const char *id, uint64_t key);
/* Engine stop: waits for every save, retries held ones once, reports losses. */
void session_saves_drain(struct engine *e);

/* Why a restore failed: an HTTP status (404: no such session for this key),
 * an error code and a message for the client. */
struct session_err {
    int status;
    char code[32];
    char message[160];
};
/* At most this many snapshot files are being read for restores (or read
 * and waiting for a KV slot) at once. */
#define SESSION_LOADS_MAX 2

/* Before a request of key restores session id from the directory: 1 when
 * it must wait, because the session IO thread is reading and checking its
 * file (the engine thread is woken when it is done), 0 when session_restore
 * may run now (the file is read, there is none, or the session is in a save
 * still in memory). So the engine thread only copies the cells in. The IO
 * thread reads the header first, and no further when the file is another
 * key's than the one that asked (session_load_foreign then refuses). */
int session_restore_wait(struct engine *e, const char *id, uint64_t key);
/* 1 while the file of id (any session when id is "") is being read: session
 * requests naming it wait, so that they keep their order with the restore. */
int session_load_busy(struct engine *e, const char *id);
/* A DELETE of id by key: drops the files read for id that no restore used
 * yet, but those whose header says they are another key's. */
void session_loads_forget(struct engine *e, const char *id, uint64_t key);
/* Drops the files read for requests that are gone (cancelled, or refused
 * as another key's, meanwhile). Returns how many. */
int session_loads_gc(struct engine *e);

/* Reads session id from the directory into s, which holds a fresh KV slot:
 * 1 restored (s is the session, idle, owned by key), 0 no snapshot, -1
 * failed with se filled (a corrupt, truncated, foreign-model or
 * other-version file is moved aside to <id>.bad). */
int session_restore(struct engine *e, struct seq *s, const char *id, uint64_t key,
                    struct session_err *se);

/* After session_restore_wait: 1 if id's snapshot, read for a restore,
 * belongs to another key by its header alone (then the request gets 404
 * before a slot is taken, and such a file is never moved aside for another
 * key's request, even when it could not be restored here); else 0. */
int session_load_foreign(struct engine *e, const char *id, uint64_t key);

/* Descriptions for the session API. */
void session_describe(const struct engine *e, const struct seq *s, struct engine_session_info *out);
/* A session of key that is in no KV slot and exists only as a save not yet
 * on disk (with the writer, or held after a failed write): 0 with out
 * filled from its newest save (on_disk says whether an older file exists),
 * or -ENOENT. */
int session_describe_held(struct engine *e, const char *id, uint64_t key,
                          struct engine_session_info *out);
/* Calls each for every session of key in a KV slot. */
void session_list_memory(struct engine *e, uint64_t key,
                         void (*each)(struct engine *e, const struct engine_session_info *in,
                                      void *arg),
                         void *arg);
/* Before answering listing request req_id (GET /v1/sessions of key): 1
 * when it must wait, because the session IO thread is reading the
 * directory's headers for it, or for another listing (the engine thread is
 * woken when it is done), 0 when session_list may run now (its listing is
 * made, or there is no directory). When it starts a listing it records the
 * key's sessions in memory and in saves not yet on disk, as they are then;
 * the IO thread adds the files of the others. One listing is made at a
 * time, so however often clients list, the engine thread never reads the
 * directory for them. */
int session_list_wait(struct engine *e, uint64_t req_id, uint64_t key);
/* Calls each for every session of request req_id's listing and frees it:
 * 1, or 0 when there is none (no directory: the caller lists memory). A
 * listing the IO thread could not make whole (the directory or a header
 * that may be key's could not be read) is freed unlisted: -errno. */
int session_list(struct engine *e, uint64_t req_id,
                 void (*each)(struct engine *e, const struct engine_session_info *in, void *arg),
                 void *arg);
/* Frees a listing whose request is gone (cancelled while it was made). */
void session_lists_gc(struct engine *e);
/* 1 while the session IO thread has had work for SESSION_IO_SLOW_S without
 * finishing any (a slow or stuck file system): session requests that wait
 * on it are then bounded (engine.c). */
#define SESSION_IO_SLOW_S 10.0
int session_io_slow(const struct engine *e);

/* Session API requests' work on a session's file is done by the session IO
 * thread, at most this many at once (more requests wait for a place,
 * session_file_room): reading its header (GET, or a save of a session not
 * in memory: session_describe_start) and deleting it (session_delete_start).
 * The engine thread answers the request when the IO thread is done. */
#define SESSION_FILEOPS_MAX 4
/* 1 when a session_*_start below may be called now (always without a
 * directory), 0 when the request must wait for a place. */
int session_file_room(const struct engine *e);
/* 1 while the IO thread works on the file of id (of any session when id is
 * ""): requests naming id wait, so that they keep their order with it. */
int session_file_busy(const struct engine *e, const char *id);
/* 1 while a save of key's session id is with the writer: a session API
 * request of key naming a session that is not in memory, and a DELETE, wait
 * for it (its file is being written). */
int session_save_busy(const struct engine *e, const char *id, uint64_t key);
/* GET (or a save) answer_id of session id of key, which is in no KV slot and
 * no save: the IO thread reads its snapshot's header, and the engine thread
 * answers (engine__describe_answer: the session, or 404 when there is no
 * snapshot of key's). Returns 1, or 0 without a directory (the caller
 * answers 404 now). Call only when session_file_room says so. */
int session_describe_start(struct engine *e, const char *id, uint64_t key, uint64_t answer_id);
/* The file part of DELETE request answer_id, after the engine thread has
 * dropped session id of key from memory (found: whether it was there, or in
 * a save): the IO thread deletes key's snapshot of id, if there is one,
 * syncs and recounts the directory, and the engine thread answers the
 * request when it is done (engine__delete_answer: 204 when either found
 * it). Returns 1, or 0 without a directory (the caller answers now). Call
 * only when session_file_room says so. */
int session_delete_start(struct engine *e, const char *id, uint64_t key, uint64_t answer_id,
                         int found);

#endif
