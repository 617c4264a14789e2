/*
 * session.c: sessions that keep their KV slot between requests (session.h),
 * and, with --session-dir, outlive it: a session leaving memory (idle
 * expiry, LRU reuse of its slot, engine stop, an explicit save) is written
 * to DIR/<id>.snap (snapshot.h) and read back when a request names it.
 *
 * Writes are atomic: a temp file in the same directory, fsync, rename over
 * the old snapshot, fsync of the directory; a reader sees the old file or
 * the new one, never a mix; replicas sharing the directory see whole files
 * only.
 *
 * The engine thread copies a leaving session's header and KV cells into a
 * buffer (struct session_saving) and frees its slot; one writer thread
 * checksums, writes and renames, in order, and hands the buffer back. At
 * most SESSION_SAVES_MAX buffers exist. A request for a session whose buffer
 * is not yet written restores from the buffer; a failed write keeps it for
 * another try (docs/serving.md#sessions).
 */
#include "session.h"
#include "prefix.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "snapshot.h"

#define SNAP_EXT ".snap"
/* A snapshot is written to DIR/.tmp-<id>-<pid>-<n> first. One that nobody
 * has written to for TMP_STALE_S seconds belongs to a write whose process
 * died (a live write finishes in seconds): the directory scans delete it, so
 * that crashes cannot fill the disk outside --session-disk-max. */
#define TMP_PREFIX ".tmp-"
#define TMP_STALE_S 600.0

/* What a scan of the directory found (disk_scan). */
struct disk_count {
    int err; /* the errno that broke the count (disk_count returned -1) */
    int64_t files, bytes, evicted;
    int64_t stale_tmp;                   /* temp files of dead writes deleted */
    char (*gone)[ENGINE_SESSION_ID_MAX]; /* the evicted snapshots' sessions (count_apply frees) */
    size_t n_gone;
};

/* A save handed to the writer thread. The engine thread fills it (header and
 * KV copied out of the backend) and owns it except between ptrq_put on
 * to_writer and ptrq_get on from_writer; the writer reads buf and writes only
 * its checksum, rc, why and scan. Meanwhile the engine thread may still set
 * prev_on_disk and prev_bytes (disk_state), which the writer never reads. */
struct session_saving {
    int kind;  /* 0 (a save): the first member of every job the writer thread takes */
    int state; /* SAVE_FREE, SAVE_QUEUED (with the writer), SAVE_HELD (failed, kept) */
    uint64_t order;
    struct snapshot_meta m;
    uint8_t *buf, *k, *v;
    size_t len;
    char name[ENGINE_SESSION_ID_MAX + 8], tmp[ENGINE_SESSION_ID_MAX + 64];
    uint64_t answer_id; /* an explicit save waiting for its answer, or 0 */
    double t0, retry_at;
    int rc;
    char why[320];
    struct disk_count scan; /* the directory after the write (the writer's disk_count) */
    int scan_ok;            /* 1 counted, -1 the count broke, 0 none made */
    /* the session's snapshot on disk until this save is written (an older
     * one, or none): what a description of the session says meanwhile */
    int prev_on_disk;
    int64_t prev_bytes;
};

enum { SAVE_FREE, SAVE_QUEUED, SAVE_HELD };
enum { JOB_LOAD = 1, JOB_LIST, JOB_FILE };
enum { FILE_DESCRIBE, FILE_DELETE, FILE_MOVE_ASIDE };

/* A snapshot file read and checked by the writer thread (the session IO
 * thread) for a request that waits for it, so that the engine thread only
 * copies the cells into a slot. The engine thread owns it except between
 * ptrq_put on to_writer and ptrq_get on from_writer. */
struct session_loading {
    int kind;  /* JOB_LOAD */
    int state; /* LOAD_FREE, LOAD_QUEUED (with the IO thread), LOAD_DONE (read, not yet used) */
    char id[ENGINE_SESSION_ID_MAX];
    char name[ENGINE_SESSION_ID_MAX + 8];
    size_t max;
    uint8_t *buf; /* the file */
    size_t len;
    uint64_t key;             /* the key of the request that asked for it */
    int hdr_ok;               /* its header alone was read (whatever came of the rest) */
    struct snapshot_meta hdr; /* ... and what it says (whose it is) */
    int skipped;              /* the header is another key's than key: the rest was not read */
    int rc;                   /* reading: 0, -ENOENT, -EFBIG or another -errno */
    int dec_rc;               /* snapshot_decode of buf (when rc is 0) */
    struct snapshot_meta m;   /* ... and what it found, with k and v inside buf */
    const uint8_t *k, *v;
    char why[200];
    int gone; /* read, then evicted from the directory (disk_state): restored, not on disk */
};

enum { LOAD_FREE, LOAD_QUEUED, LOAD_DONE };

/* A listing of the directory's sessions of one key, made by the session IO
 * thread for GET /v1/sessions: reading every file's header takes a while
 * in a directory of thousands, and on the engine thread it would stall
 * every stream. The engine thread owns it except between ptrq_put on
 * to_writer and ptrq_get on from_writer. */
struct session_listing {
    int kind;  /* JOB_LIST */
    int state; /* LOAD_FREE, LOAD_QUEUED (with the IO thread), LOAD_DONE (made, not yet sent) */
    uint64_t req_id, key;
    /* the key's sessions: [0, n_mem) in memory or in a save not yet on disk
     * when the listing was asked for, then the files not among them */
    struct engine_session_info *in;
    size_t n, n_mem, cap;
    int rc; /* 0, or -EIO (the directory could not be read), -ENOMEM */
};

/* A session API request's work on one session's file, made by the session
 * IO thread: its header read (GET, or a save of a session not in memory),
 * or that and its unlink, the directory's fsync and recount (DELETE). On a
 * slow disk, in a directory of thousands, or for a FIFO named like a
 * snapshot that takes a while, and on the engine thread it would stall
 * every stream. The engine thread owns it except between ptrq_put on
 * to_writer and ptrq_get on from_writer, and answers the request when it
 * comes back (engine__describe_answer, engine__delete_answer). */
struct session_fileop {
    int kind;  /* JOB_FILE */
    int state; /* LOAD_FREE, LOAD_QUEUED (with the IO thread) */
    int op;    /* FILE_DESCRIBE, FILE_DELETE, FILE_MOVE_ASIDE */
    int alone; /* FILE_MOVE_ASIDE: allocated for it (not one of e->fileops), freed when done */
    char id[ENGINE_SESSION_ID_MAX];
    uint64_t key, answer_id;
    int found; /* a DELETE: the engine thread found the session (in memory or in a save) */
    int rc;    /* the file: 0 key's (described, or deleted), -ENOENT none of key's, or -errno */
    struct engine_session_info in; /* FILE_DESCRIBE with rc 0 */
    struct disk_count scan;
    int scan_ok; /* 1 counted, -1 the count broke, 0 none made */
};

static int session_writer_start(struct engine *e);
static struct session_saving *pending(struct engine *e, const char *id);
static void count_saves(struct engine *e);

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A session as snapshot m has it (not in memory, not on disk: the caller
 * says where it is). */
static void describe_meta(const struct snapshot_meta *m, struct engine_session_info *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->id, sizeof out->id, "%s", m->id);
    out->tokens_seen = m->pos_next - m->pos_first + (m->has_next ? 1 : 0);
    out->position = m->pos_next;
    kv_policy_name(&m->policy, out->policy, sizeof out->policy);
}

/* ---- in memory ------------------------------------------------------------------------------ */

struct seq *session_find(struct engine *e, const char *sid)
{
    for (int64_t i = 0; i < e->cfg.max_seqs; i++)
        if (e->seqs[i].state != SEQ_FREE && engine_session_id_equal(e->seqs[i].session, sid))
            return &e->seqs[i];
    return NULL;
}

/* s (idle) leaves memory, written to the directory first: 0, -EAGAIN when
 * its save would wait for the writer (every place taken: s stays, and the
 * caller tries later, so that this thread never waits on the disk), or -1
 * when the save failed (s stays, tried again after another idle period). */
static int leave(struct engine *e, struct seq *s, double now)
{
    if (e->dir_fd >= 0 && s->session[0]) {
        if (!session_save_room(e))
            return -EAGAIN;
        if (session_save(e, s, 0, NULL, 0) < 0) {
            s->last_used = now; /* try again after another idle period */
            return -1;
        }
    }
    engine__seq_release(e, s);
    return 0;
}

struct seq *session_take_slot(struct engine *e)
{
    for (int64_t i = 0; i < e->cfg.max_seqs; i++) {
        struct seq *s = &e->seqs[i];
        if (s->state == SEQ_FREE) {
            int64_t slot;
            if (kv_pool_acquire(&e->dec.fwd.pool, &slot) < 0)
                return NULL;
            s->kv.slot = slot;
            return s;
        }
    }
    /* the least recently used idle session leaves; if its save fails, the next one */
    double now = mono_s();
    for (int64_t tries = 0; tries < e->cfg.max_seqs; tries++) {
        struct seq *lru = NULL;
        for (int64_t i = 0; i < e->cfg.max_seqs; i++) {
            struct seq *s = &e->seqs[i];
            if (s->state == SEQ_IDLE && s->last_used < now &&
                (!lru || s->last_used < lru->last_used))
                lru = s;
        }
        if (!lru)
            return NULL;
        int rc = leave(e, lru, now);
        if (rc == -EAGAIN)
            return NULL; /* the writer has every save place: wait for one */
        if (rc < 0)
            continue; /* its last_used is now: skipped next round */
        int64_t slot;
        if (kv_pool_acquire(&e->dec.fwd.pool, &slot) < 0)
            return NULL;
        lru->kv.slot = slot;
        return lru;
    }
    return NULL;
}

int session_idle_pinned(const struct engine *e)
{
    if (!e->saving)
        return 0;
    for (int i = 0; i < SESSION_SAVES_MAX; i++)
        if (e->saving[i].state != SAVE_HELD)
            return 0;
    return 1;
}

int session_slots_stuck(const struct engine *e, int64_t need)
{
    if (!session_idle_pinned(e))
        return 0;
    int64_t free_slots = 0;
    for (int64_t i = 0; i < e->cfg.max_seqs; i++) {
        if (e->seqs[i].state == SEQ_RUNNING)
            return 0;
        free_slots += e->seqs[i].state == SEQ_FREE;
    }
    return free_slots < need;
}

void session_park(struct seq *s, double now)
{
    s->state = SEQ_IDLE;
    s->last_used = now;
}

int64_t session_expire(struct engine *e, double now, double idle_s)
{
    int64_t failed = 0;
    for (int64_t i = 0; i < e->cfg.max_seqs; i++) {
        struct seq *s = &e->seqs[i];
        if (s->state == SEQ_IDLE && now - s->last_used > idle_s)
            failed += leave(e, s, now) == -1;
    }
    return failed;
}

void session_save_all(struct engine *e)
{
    if (e->dir_fd < 0)
        return;
    for (int64_t i = 0; i < e->cfg.max_seqs; i++) {
        struct seq *s = &e->seqs[i];
        char why[200];
        if (s->state == SEQ_IDLE && s->session[0] && session_save(e, s, 0, why, sizeof why) < 0)
            engine__log(e, ENGINE_LOG_ERROR, "session '%s' is lost: %s", s->session, why);
    }
    session_saves_drain(e);
}

/* ---- the directory ------------------------------------------------------------------------- */

static int file_name(char *buf, size_t cap, const char *id, const char *ext)
{
    if (!engine_session_id_valid(id))
        return -EINVAL;
    int n = snprintf(buf, cap, "%s%s", id, ext);
    return n > 0 && (size_t)n < cap ? 0 : -ENAMETOOLONG;
}

/* The header of snapshot file name in dir_fd, from its first bytes, and the
 * file's size (bytes may be NULL): 0 with *m filled; -ENOENT when there is
 * none or it is not a snapshot; -errno when it could not be opened or read
 * (EMFILE, EIO...), so that it is not taken for a missing one. Any thread. */
static int read_header(int dir_fd, const char *name, struct snapshot_meta *m, int64_t *bytes)
{
    int fd = openat(dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return errno == ENOENT || errno == ELOOP || errno == ENOTDIR ? -ENOENT : -errno;
    uint8_t hdr[SNAPSHOT_FIXED_HEADER + ENGINE_SESSION_ID_MAX];
    ssize_t n = pread(fd, hdr, sizeof hdr, 0);
    int rc = n < 0 ? (errno == ESPIPE || errno == EISDIR ? -ENOENT : -errno) : 0;
    struct stat st;
    if (rc == 0 && bytes && fstat(fd, &st) < 0)
        rc = -errno;
    close(fd);
    if (rc < 0)
        return rc;
    char why[160];
    if (n == 0 || snapshot_decode_header(hdr, (size_t)n, m, why, sizeof why) < 0)
        return -ENOENT;
    if (bytes)
        *bytes = (int64_t)st.st_size;
    return 0;
}

/* Whose a snapshot file is, from its header: its owner hash (0 on an open
 * server), or NOBODY (unreadable, or a version-1 file of a key), counted as
 * one more owner. */
#define NOBODY 2 /* never an owner: the server makes odd hashes, and 0 on an open server */
static uint64_t file_owner(int dir_fd, const char *name)
{
    struct snapshot_meta m;
    if (read_header(dir_fd, name, &m, NULL) < 0 || m.owner_unknown)
        return NOBODY;
    return m.owner;
}

/* Recounts the snapshots in the directory and, over max bytes (0: no
 * bound), deletes snapshots until it is not: always one of the owner (API
 * key) with the most bytes on disk, its least recently written one (of
 * owners with equal bytes, the least recently written snapshot), never
 * keep, the one just saved. So one key cannot push another key's snapshots
 * off the disk while it holds more than that key; with one owner (an open
 * server) it is least recently written first. Touches nothing of the
 * engine: the writer thread runs it after each write. Returns 0, or -1
 * (out->err) when the directory could not be read whole: a part of it is
 * not the directory, so nothing is evicted on it and its figures are not
 * taken. */
static int disk_count(int dir_fd, int64_t max, const char *keep, struct disk_count *out)
{
    struct ent {
        char name[ENGINE_SESSION_ID_MAX + 8];
        int64_t bytes;
        double mtime;
        uint64_t owner;
        int64_t *owner_bytes; /* the owner's total (into totals below) */
    } *ents = NULL;
    size_t n = 0, cap = 0;
    memset(out, 0, sizeof *out);
    int fd = dup(dir_fd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        out->err = errno;
        if (fd >= 0)
            close(fd);
        return -1;
    }
    rewinddir(d);
    int64_t total = 0;
    struct dirent *de;
    for (;;) {
        errno = 0;
        if (!(de = readdir(d))) {
            out->err = errno; /* 0: the end */
            break;
        }
        size_t l = strlen(de->d_name);
        struct stat st;
        if (strncmp(de->d_name, TMP_PREFIX, strlen(TMP_PREFIX)) == 0) {
            /* a write that died with its process (SIGKILL, a crash) left it */
            if (fstatat(dir_fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
                (double)time(NULL) - (double)st.st_mtim.tv_sec > TMP_STALE_S &&
                unlinkat(dir_fd, de->d_name, 0) == 0)
                out->stale_tmp++;
            continue;
        }
        if (l <= strlen(SNAP_EXT) || l >= sizeof ents->name ||
            strcmp(de->d_name + l - strlen(SNAP_EXT), SNAP_EXT) != 0)
            continue;
        if (fstatat(dir_fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
            continue;
        if (n == cap) {
            size_t nc = cap ? 2 * cap : 64;
            void *p = realloc(ents, nc * sizeof *ents);
            if (!p) {
                out->err = ENOMEM;
                break;
            }
            ents = p;
            cap = nc;
        }
        memcpy(ents[n].name, de->d_name, l + 1); /* l < sizeof name: checked above */
        ents[n].bytes = (int64_t)st.st_size;
        ents[n].mtime = (double)st.st_mtim.tv_sec + (double)st.st_mtim.tv_nsec * 1e-9;
        total += ents[n].bytes;
        n++;
    }
    closedir(d);
    if (out->err) {
        free(ents);
        return -1;
    }
    int64_t count = (int64_t)n;
    int over = max > 0 && total > max;
    int64_t one_owner = total; /* without memory for owners: least recently written first */
    int64_t *totals = over ? calloc(n, sizeof *totals) : NULL;
    uint64_t *owners = over ? malloc(n * sizeof *owners) : NULL;
    size_t n_owners = 0;
    for (size_t i = 0; over && i < n; i++) { /* whose is what: one header read per file */
        ents[i].owner_bytes = &one_owner;
        if (!totals || !owners)
            continue;
        ents[i].owner = file_owner(dir_fd, ents[i].name);
        size_t o = 0;
        while (o < n_owners && owners[o] != ents[i].owner)
            o++;
        if (o == n_owners)
            owners[n_owners++] = ents[i].owner;
        totals[o] += ents[i].bytes;
        ents[i].owner_bytes = &totals[o];
    }
    free(owners);
    while (over && total > max) {
        size_t old = n;
        for (size_t i = 0; i < n; i++) {
            if (ents[i].bytes < 0 || (keep && strcmp(ents[i].name, keep) == 0))
                continue;
            int64_t ob = *ents[i].owner_bytes, best = old < n ? *ents[old].owner_bytes : -1;
            if (ob > best || (ob == best && ents[i].mtime < ents[old].mtime))
                old = i;
        }
        if (old == n)
            break;
        if (unlinkat(dir_fd, ents[old].name, 0) == 0) {
            total -= ents[old].bytes;
            *ents[old].owner_bytes -= ents[old].bytes;
            count--;
            out->evicted++;
            size_t l = strlen(ents[old].name) - strlen(SNAP_EXT);
            void *p = l < ENGINE_SESSION_ID_MAX
                          ? realloc(out->gone, (out->n_gone + 1) * sizeof *out->gone)
                          : NULL; /* a name longer than any id is no session's */
            if (p) { /* without memory a session in a slot still says on_disk: a stale flag */
                out->gone = p;
                memcpy(out->gone[out->n_gone], ents[old].name, l);
                out->gone[out->n_gone++][l] = 0;
            }
        }
        ents[old].bytes = -1;
    }
    free(totals);
    free(ents);
    out->files = count;
    out->bytes = total;
    return 0;
}

static void disk_state(struct engine *e, const char *id, uint64_t owner, int64_t bytes);
static void disk_gone(struct engine *e, const char *id);

/* Applies a scan's figures and evictions; frees its list of evictions. */
static void count_apply(struct engine *e, struct disk_count *c)
{
    if (e->count_failing) {
        e->count_failing = 0;
        engine__log(e, ENGINE_LOG_INFO, "the session directory is counted again");
    }
    e->stats.sessions_on_disk = c->files;
    e->stats.snapshot_bytes = c->bytes;
    e->stats.disk_evictions_total += c->evicted;
    for (size_t i = 0; i < c->n_gone; i++)
        disk_gone(e, c->gone[i]);
    free(c->gone);
    c->gone = NULL;
    c->n_gone = 0;
    if (c->stale_tmp > 0)
        engine__log(e, ENGINE_LOG_INFO,
                    "deleted %lld temporary snapshot file(s) of writes that died with their "
                    "process",
                    (long long)c->stale_tmp);
}

/* A count that broke: the figures stay those of the last whole one, and
 * --session-disk-max waits for the next (logged once until then). */
static void count_failed(struct engine *e, const struct disk_count *c)
{
    if (!e->count_failing)
        engine__log(e, ENGINE_LOG_WARN,
                    "the session directory could not be counted (%s); its figures and "
                    "--session-disk-max wait for the next count",
                    strerror(c->err));
    e->count_failing = 1;
}

/* disk_count of the session directory under --session-disk-max, as a
 * job's scan_ok has it: 1 counted, -1 the count broke (0: none made). */
static int count_dir(struct engine *e, const char *keep, struct disk_count *out)
{
    return disk_count(e->dir_fd, e->cfg.session_disk_max, keep, out) == 0 ? 1 : -1;
}

/* What a count came to (scan: count_dir's, or 0 for none made). */
static void count_done(struct engine *e, int scan, struct disk_count *c)
{
    if (scan > 0)
        count_apply(e, c);
    else if (scan < 0)
        count_failed(e, c);
}

/* count_dir on the engine thread (at start). */
static void disk_scan(struct engine *e, const char *keep)
{
    struct disk_count c;
    count_done(e, count_dir(e, keep, &c), &c);
}

static int model_digest(struct engine *e)
{
    EVP_MD_CTX *c = EVP_MD_CTX_new();
    unsigned int n = 0;
    int ok = c && EVP_DigestInit_ex(c, EVP_sha256(), NULL) == 1 &&
             EVP_DigestUpdate(c, e->dec.model.map, e->dec.model.map_len) == 1 &&
             EVP_DigestFinal_ex(c, e->model_digest, &n) == 1 && n == 32;
    EVP_MD_CTX_free(c);
    return ok ? 0 : -EIO;
}

int engine_session_dir_open(const char *dir, char *err, size_t err_len)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        int rc = -errno;
        snprintf(err, err_len, "--session-dir %s: %s", dir, strerror(-rc));
        return rc;
    }
    if (faccessat(fd, ".", W_OK | X_OK, 0) < 0) {
        int rc = -errno;
        snprintf(err, err_len, "--session-dir %s: not writable: %s", dir, strerror(-rc));
        close(fd);
        return rc;
    }
    return fd;
}

int session_dir_open(struct engine *e, char *err, size_t err_len)
{
    e->dir_fd = -1;
    if (!e->cfg.session_dir || !e->cfg.session_dir[0])
        return 0;
    int fd = engine_session_dir_open(e->cfg.session_dir, err, err_len);
    if (fd < 0)
        return fd;
    e->dir_fd = fd;
    if (model_digest(e) < 0) {
        snprintf(err, err_len, "engine: SHA-256 of the model file failed");
        return -EIO;
    }
    disk_scan(e, NULL);
    if (session_writer_start(e) < 0) {
        snprintf(err, err_len, "engine: starting the session writer thread failed");
        return -EAGAIN;
    }
    return 0;
}

void session_dir_close(struct engine *e)
{
    if (e->writer_on) {
        ptrq_close(&e->to_writer);
        pthread_join(e->writer, NULL);
        e->writer_on = 0;
        void *job; /* done and never collected: only their memory is left */
        while ((job = ptrq_get(&e->from_writer, 0))) {
            const int kind = *(const int *)job;
            if (kind == JOB_FILE) {
                struct session_fileop *f = job;
                free(f->scan.gone);
                if (f->alone)
                    free(f);
            } else if (kind != JOB_LOAD && kind != JOB_LIST) {
                free(((struct session_saving *)job)->scan.gone);
            }
        }
        for (int i = 0; i < SESSION_SAVES_MAX; i++)
            free(e->saving[i].buf);
    }
    for (int i = 0; e->loading && i < SESSION_LOADS_MAX; i++)
        free(e->loading[i].buf);
    free(e->loading);
    e->loading = NULL;
    if (e->listing)
        free(e->listing->in);
    free(e->listing);
    e->listing = NULL;
    free(e->fileops);
    e->fileops = NULL;
    if (e->to_writer.impl)
        ptrq_free(&e->to_writer);
    if (e->from_writer.impl)
        ptrq_free(&e->from_writer);
    free(e->saving);
    e->saving = NULL;
    if (e->dir_fd >= 0)
        close(e->dir_fd);
    e->dir_fd = -1;
}

/* ---- save ---------------------------------------------------------------------------------- */

/* Copies one layer's run of positions p0 .. pos_next-1 of kv (in its ring
 * from cell kv->sink_base) to or from host cells off.. of K/V. */
static int copy_run(struct backend *b, const struct kv_seq *kv, int layer, int64_t p0,
                    int64_t pos_next, uint8_t *k, uint8_t *v, int64_t off, int64_t host_cells,
                    size_t cell_bytes, int import)
{
    const struct backend_ops *op = b->ops;
    int rc = 0;
    for (int64_t p = p0; rc == 0 && p < pos_next;) {
        int64_t cell = kv_seq_cell(kv, p);
        int64_t len = kv->ring - p % kv->ring; /* up to the end of the ring */
        if (len > pos_next - p)
            len = pos_next - p;
        uint8_t *hk = k + (size_t)off * cell_bytes, *hv = v + (size_t)off * cell_bytes;
        rc = import ? op->kv_import(b, kv->slot, layer, cell, len, hk, hv, host_cells)
                    : op->kv_export(b, kv->slot, layer, cell, len, hk, hv, host_cells);
        p += len;
        off += len;
    }
    return rc;
}

void session_cells_meta(const struct kv_geometry *g, const struct kv_seq *kv,
                        struct snapshot_meta *m)
{
    m->dtype = g->dtype;
    m->n_layer = g->n_layer;
    m->n_kv_head = g->n_kv_head;
    m->head_dim = g->head_dim;
    m->policy = kv->policy;
    m->n_sinks = kv->n_sinks;
    m->window = kv->window;
    m->pos_first = kv->pos_first;
    m->pos_next = kv->pos_next;
    m->swa_period = g->swa_period;
    m->swa_window = g->swa_period > 0 ? g->swa_window : 0;
    snapshot_meta_cells(m);
}

int session_copy_cells(struct backend *b, const struct kv_geometry *g, const struct kv_seq *kv,
                       const struct snapshot_meta *m, uint8_t *k, uint8_t *v, int import)
{
    const struct backend_ops *op = b->ops;
    size_t cell_bytes = kv_dtype_row_bytes(m->dtype, m->head_dim);
    struct kv_seq local = g->swa_period > 0 ? kv_seq_local(kv, g) : *kv;
    int rc = 0;
    for (int l = 0; rc == 0 && l < m->n_layer; l++) {
        size_t at = snapshot_layer_offset(m, l);
        uint8_t *lk = k + at, *lv = v + at;
        int64_t n = snapshot_layer_cells(m, l);
        if (snapshot_layer_is_local(m, l)) {
            rc = copy_run(b, &local, l, m->local_pos0, m->pos_next, lk, lv, 0, n, cell_bytes,
                          import);
            continue;
        }
        if (m->n_sink_cells > 0)
            rc = import ? op->kv_import(b, kv->slot, l, 0, m->n_sink_cells, lk, lv, n)
                        : op->kv_export(b, kv->slot, l, 0, m->n_sink_cells, lk, lv, n);
        if (rc == 0)
            rc = copy_run(b, kv, l, m->win_pos0, m->pos_next, lk, lv, m->n_sink_cells, n,
                          cell_bytes, import);
    }
    return rc;
}

static int write_all(int fd, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (w == 0)
            return -EIO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static void observe(double *sum, double *max, int64_t *hist, double dt)
{
    static const double bounds[ENGINE_SNAP_BUCKETS] = ENGINE_SNAP_BUCKET_BOUNDS;
    *sum += dt;
    if (dt > *max)
        *max = dt;
    for (int i = 0; i < ENGINE_SNAP_BUCKETS; i++)
        if (dt <= bounds[i])
            hist[i]++;
}

#define RETRY_S 5.0

static int read_file(struct engine *e, const char *name, size_t max, uint8_t **out, size_t *len);

/* The IO thread's read of a snapshot for a restore: the file and its
 * checks (checksum, layout), which are what takes time; the engine thread
 * then copies the cells in. */
static void load(struct engine *e, struct session_loading *l)
{
    /* the header on its own first: another key's file is not read further
     * for this request (a request costs no more than the header of a file it
     * may not see), and a file too large or damaged for a restore is still
     * another key's, and then not this request's to move aside
     * (session_load_foreign) */
    l->hdr_ok = read_header(e->dir_fd, l->name, &l->hdr, NULL) == 0;
    l->skipped = l->hdr_ok && engine_session_id_equal(l->hdr.id, l->id) && !l->hdr.owner_unknown &&
                 l->hdr.owner != l->key;
    l->rc = l->skipped ? -EACCES : read_file(e, l->name, l->max, &l->buf, &l->len);
    l->dec_rc = 0;
    l->why[0] = 0;
    if (l->rc == 0)
        l->dec_rc = snapshot_decode(l->buf, l->len, &l->m, &l->k, &l->v, l->why, sizeof l->why);
}

static int list_dir(struct engine *e, struct session_listing *l);
static void file_op(struct engine *e, struct session_fileop *f);

/* Hands job to the IO thread (to_writer is never full: it holds every job
 * at once), counting it for session_io_slow. */
static void to_io(struct engine *e, void *job)
{
    if (e->io_jobs++ == 0)
        e->io_progress = mono_s(); /* it was idle: its clock starts now */
    ptrq_put(&e->to_writer, job);
}

int session_io_slow(const struct engine *e)
{
    return e->io_jobs > 0 && mono_s() - e->io_progress > SESSION_IO_SLOW_S;
}

static void *writer_main(void *arg)
{
    struct engine *e = arg;
    void *job;
    while ((job = ptrq_get(&e->to_writer, -1))) {
        const int kind = *(const int *)job;
        if (kind == JOB_LOAD || kind == JOB_LIST || kind == JOB_FILE) {
            if (kind == JOB_LOAD)
                load(e, job);
            else if (kind == JOB_LIST)
                list_dir(e, job);
            else
                file_op(e, job);
            ptrq_put(&e->from_writer, job);
            queue_poke(&e->q);
            continue;
        }
        struct session_saving *w = job;
        snapshot_seal(w->buf, w->len);
        int rc = 0;
        int fd = openat(e->dir_fd, w->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) {
            rc = -errno;
            snprintf(w->why, sizeof w->why, "creating %s: %s", w->tmp, strerror(-rc));
        } else {
            rc = write_all(fd, w->buf, w->len);
            if (rc == 0 && fsync(fd) < 0)
                rc = -errno;
            if (close(fd) < 0 && rc == 0)
                rc = -errno;
            if (rc == 0 && renameat(e->dir_fd, w->tmp, e->dir_fd, w->name) < 0)
                rc = -errno;
            if (rc < 0) {
                unlinkat(e->dir_fd, w->tmp, 0);
                snprintf(w->why, sizeof w->why, "writing the snapshot: %s", strerror(-rc));
            } else {
                fsync(e->dir_fd); /* the rename itself survives a crash */
            }
        }
        w->rc = rc;
        /* the directory's count and the --session-disk-max rule, off the engine thread */
        w->scan_ok = rc < 0 ? 0 : count_dir(e, w->name, &w->scan);
        ptrq_put(&e->from_writer, w);
        queue_poke(&e->q);
    }
    return NULL;
}

static void count_saves(struct engine *e)
{
    int64_t q = 0, h = 0;
    for (int i = 0; e->saving && i < SESSION_SAVES_MAX; i++) {
        q += e->saving[i].state == SAVE_QUEUED;
        h += e->saving[i].state == SAVE_HELD;
    }
    e->stats.snapshot_saves_inflight = q;
    e->stats.snapshot_saves_held = h;
}

/* The writer is done with w: account for it, answer an explicit save, free
 * w or hold its bytes for another try. */
static void finish(struct engine *e, struct session_saving *w)
{
    uint64_t answer = w->answer_id;
    w->answer_id = 0;
    if (w->rc == 0) {
        disk_state(e, w->m.id, w->m.owner, (int64_t)w->len);
        count_done(e, w->scan_ok, &w->scan); /* after: it may have evicted an older file */
        e->stats.saves_total++;
        observe(&e->stats.save_seconds_total, &e->stats.save_seconds_max, e->stats.save_hist,
                mono_s() - w->t0);
    } else {
        e->stats.save_failures_total++;
    }
    if (answer) {
        struct engine_session_info written;
        describe_meta(&w->m, &written);
        written.on_disk = 1;
        written.bytes = (int64_t)w->len;
        engine__save_answer(e, answer, w->m.owner, w->m.id, w->rc, w->why, &written);
    }
    struct seq *s = session_find(e, w->m.id);
    struct session_saving *newest = pending(e, w->m.id);
    if (w->rc < 0 && e->saves_draining && s && newest == w)
        engine__log(e, ENGINE_LOG_ERROR,
                    "session '%s' is lost: its snapshot could not be written (%s)", w->m.id,
                    w->why);
    if (w->rc == 0 || (s && s->owner == w->m.owner) || newest != w) {
        /* written, or the session is in memory again or saved again (newer) */
        free(w->buf);
        w->buf = NULL;
        w->state = SAVE_FREE;
    } else {
        w->state = SAVE_HELD; /* the only copy: kept for another try */
        w->retry_at = mono_s() + RETRY_S;
        engine__log(e, ENGINE_LOG_WARN, "saving session '%s' failed (%s); kept in memory, retrying",
                    w->m.id, w->why);
    }
    count_saves(e);
}

/* The IO thread is done with f: the directory's new count, and the answer. */
static void file_done(struct engine *e, struct session_fileop *f)
{
    count_done(e, f->scan_ok, &f->scan);
    f->state = LOAD_FREE;
    if (f->op == FILE_MOVE_ASIDE) {
        if (f->alone)
            free(f);
        return;
    }
    if (f->op == FILE_DELETE)
        engine__delete_answer(e, f->answer_id, f->id, f->found, f->rc);
    else
        engine__describe_answer(e, f->answer_id, f->id, f->rc, &f->in);
}

/* Takes the writer's finished saves; waits up to wait_ms for one. Returns
 * how many. */
static int collect(struct engine *e, int wait_ms)
{
    if (!e->writer_on)
        return 0;
    int n = 0;
    void *job;
    while ((job = ptrq_get(&e->from_writer, n ? 0 : wait_ms))) {
        e->io_jobs--;
        e->io_progress = mono_s();
        if (*(const int *)job == JOB_LOAD)
            ((struct session_loading *)job)->state = LOAD_DONE; /* used by its request */
        else if (*(const int *)job == JOB_LIST)
            ((struct session_listing *)job)->state = LOAD_DONE; /* sent by its request */
        else if (*(const int *)job == JOB_FILE)
            file_done(e, job);
        else
            finish(e, job);
        n++;
    }
    return n;
}

/* ---- restores read by the IO thread --------------------------------------------------------- */

static size_t max_snapshot(const struct engine *e);

static struct session_loading *loading_of(struct engine *e, const char *id)
{
    for (int i = 0; e->loading && i < SESSION_LOADS_MAX; i++)
        if (e->loading[i].state != LOAD_FREE && engine_session_id_equal(e->loading[i].id, id))
            return &e->loading[i];
    return NULL;
}

static void loading_free(struct session_loading *l)
{
    free(l->buf);
    l->buf = NULL;
    l->state = LOAD_FREE;
}

int session_restore_wait(struct engine *e, const char *id, uint64_t key)
{
    if (!e->writer_on || !e->loading || pending(e, id))
        return 0; /* no IO thread, or restored from a save still in memory */
    struct session_loading *l = loading_of(e, id);
    if (l && l->state == LOAD_DONE && l->skipped && l->hdr.owner == key)
        loading_free(l); /* read for another key, and this one's: read it whole */
    else if (l)
        return l->state == LOAD_QUEUED;
    char name[ENGINE_SESSION_ID_MAX + 8];
    struct stat st;
    if (file_name(name, sizeof name, id, SNAP_EXT) < 0 ||
        fstatat(e->dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return 0; /* no file (a new session), or the restore says why */
    for (int i = 0; i < SESSION_LOADS_MAX; i++) {
        l = &e->loading[i];
        if (l->state != LOAD_FREE)
            continue;
        memset(l, 0, sizeof *l);
        l->kind = JOB_LOAD;
        l->state = LOAD_QUEUED;
        snprintf(l->id, sizeof l->id, "%s", id);
        memcpy(l->name, name, sizeof name);
        l->max = max_snapshot(e);
        l->key = key;
        to_io(e, l);
        return 1;
    }
    return 1; /* every read place is taken: wait for one */
}

int session_load_busy(struct engine *e, const char *id)
{
    for (int i = 0; e->loading && i < SESSION_LOADS_MAX; i++)
        if (e->loading[i].state == LOAD_QUEUED &&
            (!id[0] || engine_session_id_equal(e->loading[i].id, id)))
            return 1;
    return 0;
}

void session_loads_forget(struct engine *e, const char *id, uint64_t key)
{
    for (int i = 0; e->loading && i < SESSION_LOADS_MAX; i++) {
        struct session_loading *l = &e->loading[i];
        /* another key's file (by its header) is not this key's to drop */
        if (l->state == LOAD_DONE && engine_session_id_equal(l->id, id) &&
            !(l->hdr_ok && !l->hdr.owner_unknown && l->hdr.owner != key))
            loading_free(l);
    }
}

int session_loads_gc(struct engine *e)
{
    int freed = 0;
    for (int i = 0; e->loading && i < SESSION_LOADS_MAX; i++) {
        struct session_loading *l = &e->loading[i];
        if (l->state != LOAD_DONE)
            continue;
        int wanted = 0;
        for (int64_t j = 0; j < e->n_waiting && !wanted; j++)
            wanted = e->waiting[j].req.kind == ENGINE_REQ_GENERATE &&
                     engine_session_id_equal(e->waiting[j].req.session_id, l->id);
        if (!wanted) { /* its request was cancelled, or refused, while the file was read */
            loading_free(l);
            freed++;
        }
    }
    return freed;
}

/* Whether a save of id (NULL: of any session) of owner (NULL: of anyone) is
 * with the writer. */
static int queued(const struct engine *e, const char *id, const uint64_t *owner)
{
    for (int i = 0; e->saving && i < SESSION_SAVES_MAX; i++)
        if (e->saving[i].state == SAVE_QUEUED && (!owner || e->saving[i].m.owner == *owner) &&
            (!id || engine_session_id_equal(e->saving[i].m.id, id)))
            return 1;
    return 0;
}

int session_save_room(struct engine *e)
{
    if (!e->saving)
        return 1;
    collect(e, 0);
    for (int i = 0; i < SESSION_SAVES_MAX; i++)
        if (e->saving[i].state == SAVE_FREE)
            return 1;
    return !queued(e, NULL, NULL); /* every place held after failed writes: session_save says so */
}

static void hand_over(struct engine *e, struct session_saving *w)
{
    snprintf(w->tmp, sizeof w->tmp, TMP_PREFIX "%s-%ld-%llu", w->m.id, (long)getpid(),
             (unsigned long long)e->tmp_seq++);
    w->state = SAVE_QUEUED;
    w->rc = 0;
    w->why[0] = 0;
    count_saves(e);
    to_io(e, w);
}

void session_saves_poll(struct engine *e)
{
    collect(e, 0);
    double now = mono_s();
    for (int i = 0; e->saving && i < SESSION_SAVES_MAX; i++)
        if (e->saving[i].state == SAVE_HELD && now >= e->saving[i].retry_at)
            hand_over(e, &e->saving[i]);
}

/* Waits until no save of id (NULL: of any session) is with the writer. */
static void session_saves_settle(struct engine *e, const char *id)
{
    while (queued(e, id, NULL))
        collect(e, -1);
}

int session_saves_forget(struct engine *e, const char *id, uint64_t key)
{
    int n = 0;
    session_saves_settle(e, id);
    for (int i = 0; e->saving && i < SESSION_SAVES_MAX; i++) {
        struct session_saving *w = &e->saving[i];
        if (w->state == SAVE_HELD && w->m.owner == key && engine_session_id_equal(w->m.id, id)) {
            free(w->buf);
            w->buf = NULL;
            w->state = SAVE_FREE;
            n++;
        }
    }
    count_saves(e);
    return n;
}

/* The newest save of id not yet on disk, or NULL. */
static struct session_saving *pending(struct engine *e, const char *id)
{
    struct session_saving *best = NULL;
    for (int i = 0; e->saving && i < SESSION_SAVES_MAX; i++) {
        struct session_saving *w = &e->saving[i];
        if (w->state != SAVE_FREE && engine_session_id_equal(w->m.id, id) &&
            (!best || w->order > best->order))
            best = w;
    }
    return best;
}

/* The file of session id is now owner's snapshot of bytes bytes (written
 * by this server; owner 0 and bytes -1: evicted). The session in a slot,
 * and its saves not yet written (whose older file it was until then), are
 * described so from now on; a file read for a restore that is evicted
 * before the restore is restored as not on disk. (The IO thread does its
 * jobs in order: a read queued after the eviction finds no file.) */
static void disk_state(struct engine *e, const char *id, uint64_t owner, int64_t bytes)
{
    for (int i = 0; bytes < 0 && e->loading && i < SESSION_LOADS_MAX; i++)
        if (e->loading[i].state == LOAD_DONE && engine_session_id_equal(e->loading[i].id, id))
            e->loading[i].gone = 1;
    struct seq *s = session_find(e, id);
    if (s) {
        s->on_disk = bytes >= 0 && s->owner == owner;
        s->disk_bytes = s->on_disk ? bytes : 0;
    }
    for (int i = 0; e->saving && i < SESSION_SAVES_MAX; i++) {
        struct session_saving *w = &e->saving[i];
        if (w->state != SAVE_FREE && engine_session_id_equal(w->m.id, id)) {
            w->prev_on_disk = bytes >= 0 && w->m.owner == owner;
            w->prev_bytes = w->prev_on_disk ? bytes : 0;
        }
    }
}

static void disk_gone(struct engine *e, const char *id)
{
    disk_state(e, id, 0, -1);
}

int session_save(struct engine *e, struct seq *s, uint64_t answer_id, char *err, size_t err_len)
{
    char dummy[8];
    if (!err) {
        err = dummy;
        err_len = sizeof dummy;
    }
    if (e->dir_fd < 0 || !e->writer_on) {
        snprintf(err, err_len, "this server keeps sessions in memory only (no --session-dir)");
        return -ENOTSUP;
    }
    double t0 = mono_s();
    /* a free place; when every place is taken, wait for the writer */
    struct session_saving *w = NULL;
    for (;;) {
        collect(e, 0);
        for (int i = 0; !w && i < SESSION_SAVES_MAX; i++)
            if (e->saving[i].state == SAVE_FREE)
                w = &e->saving[i];
        if (w)
            break;
        if (!queued(e, NULL, NULL)) { /* nothing written, so no failed write to count */
            snprintf(err, err_len,
                     "%d earlier snapshots could not be written and are held in memory; "
                     "the session stays in memory",
                     SESSION_SAVES_MAX);
            return -ENOSPC;
        }
        collect(e, -1);
    }
    struct snapshot_meta *m = &w->m;
    memset(m, 0, sizeof *m);
    memcpy(m->model_digest, e->model_digest, 32);
    const struct kv_geometry *g = &e->dec.fwd.pool.geo;
    session_cells_meta(g, &s->kv, m);
    m->owner = s->owner;
    m->next_tok = s->has_next ? s->next_tok : 0;
    m->has_next = s->has_next;
    m->saved_at = (int64_t)time(NULL);
    snprintf(m->id, sizeof m->id, "%s", s->session);

    int rc = file_name(w->name, sizeof w->name, m->id, SNAP_EXT);
    if (rc < 0) {
        snprintf(err, err_len, "session id not usable as a file name");
        goto fail;
    }
    w->len = snapshot_size(m);
    w->buf = malloc(w->len);
    if (!w->buf) {
        rc = -ENOMEM;
        snprintf(err, err_len, "out of memory for a %zu-byte snapshot", w->len);
        goto fail;
    }
    snapshot_encode_header(m, w->buf, &w->k, &w->v);
    rc = session_copy_cells(&e->dec.backend, g, &s->kv, m, w->k, w->v, 0);
    if (rc < 0) {
        free(w->buf);
        w->buf = NULL;
        snprintf(err, err_len, "reading the KV cells from the backend failed");
        goto fail;
    }
    w->t0 = t0;
    w->order = ++e->save_order;
    w->answer_id = answer_id;
    w->prev_on_disk = s->on_disk;
    w->prev_bytes = s->disk_bytes;
    hand_over(e, w);
    double dt = mono_s() - t0;
    e->stats.save_engine_seconds_total += dt;
    if (dt > e->stats.save_engine_seconds_max)
        e->stats.save_engine_seconds_max = dt;
    return 0;
fail:
    e->stats.save_failures_total++;
    return rc;
}

static int session_writer_start(struct engine *e)
{
    e->saving = calloc(SESSION_SAVES_MAX, sizeof *e->saving);
    if (!e->saving)
        return -ENOMEM;
    e->loading = calloc(SESSION_LOADS_MAX, sizeof *e->loading);
    if (!e->loading)
        return -ENOMEM;
    e->listing = calloc(1, sizeof *e->listing);
    if (!e->listing)
        return -ENOMEM;
    e->fileops = calloc(SESSION_FILEOPS_MAX, sizeof *e->fileops);
    if (!e->fileops)
        return -ENOMEM;
    /* every save, load, listing and file operation at once */
    const size_t jobs = SESSION_SAVES_MAX + SESSION_LOADS_MAX + 1 + SESSION_FILEOPS_MAX;
    if (ptrq_init(&e->to_writer, jobs) < 0 || ptrq_init(&e->from_writer, jobs) < 0)
        return -ENOMEM;
    if (pthread_create(&e->writer, NULL, writer_main, e) != 0)
        return -EAGAIN;
    e->writer_on = 1;
    return 0;
}

void session_saves_drain(struct engine *e)
{
    if (!e->writer_on)
        return;
    e->saves_draining = 1;
    while (session_file_busy(e, "")) /* answered, and deleted files gone, before the stop */
        collect(e, -1);
    session_saves_settle(e, NULL);
    /* held saves get one more try each; what still fails is lost, and said so */
    for (int i = 0; i < SESSION_SAVES_MAX; i++)
        if (e->saving[i].state == SAVE_HELD)
            hand_over(e, &e->saving[i]);
    session_saves_settle(e, NULL);
    for (int i = 0; i < SESSION_SAVES_MAX; i++) {
        struct session_saving *w = &e->saving[i];
        if (w->state == SAVE_HELD) {
            engine__log(e, ENGINE_LOG_ERROR,
                        "session '%s' is lost: its snapshot could not be written (%s)", w->m.id,
                        w->why);
            free(w->buf);
            w->buf = NULL;
            w->state = SAVE_FREE;
        }
    }
    count_saves(e);
}

/* ---- restore ------------------------------------------------------------------------------- */

/* Reads the whole file name into *out (at most max bytes). 0, -ENOENT, -EFBIG
 * or another -errno. */
static int read_file(struct engine *e, const char *name, size_t max, uint8_t **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    int fd = openat(e->dir_fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0)
        return -errno;
    struct stat st;
    int rc = 0;
    if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
        rc = -EINVAL;
    else if ((uint64_t)st.st_size > max)
        rc = -EFBIG;
    size_t n = rc == 0 ? (size_t)st.st_size : 0;
    uint8_t *buf = rc == 0 ? malloc(n ? n : 1) : NULL;
    if (rc == 0 && !buf)
        rc = -ENOMEM;
    size_t got = 0;
    while (rc == 0 && got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = r < 0 ? -errno : -EIO;
            break;
        }
        got += (size_t)r;
    }
    close(fd);
    if (rc < 0) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = n;
    return 0;
}

/* The largest snapshot this server could have written. */
static size_t max_snapshot(const struct engine *e)
{
    const struct kv_geometry *g = &e->dec.fwd.pool.geo;
    struct snapshot_meta m;
    memset(&m, 0, sizeof m);
    m.dtype = KV_DTYPE_F32;
    m.n_layer = g->n_layer;
    m.n_kv_head = g->n_kv_head;
    m.head_dim = g->head_dim;
    m.n_cells = g->n_sinks + g->window;
    m.swa_period = g->swa_period;
    m.n_local_cells = g->swa_period > 0 ? g->swa_window : 0;
    return SNAPSHOT_FIXED_HEADER + ENGINE_SESSION_ID_MAX + 2 * snapshot_kv_bytes(&m) + 4;
}

/* Renames id's snapshot to <id>.bad: 0 or -errno. */
static int rename_aside(int dir_fd, const char *id)
{
    char name[ENGINE_SESSION_ID_MAX + 8], bad[ENGINE_SESSION_ID_MAX + 8];
    if (file_name(name, sizeof name, id, SNAP_EXT) < 0 ||
        file_name(bad, sizeof bad, id, ".bad") < 0)
        return -EINVAL;
    return renameat(dir_fd, name, dir_fd, bad) < 0 ? -errno : 0;
}

/* The file of a session that cannot be restored is moved aside to <id>.bad
 * and the directory recounted, by the IO thread: a recount stats every
 * snapshot, thousands in a large directory, once for every snapshot of
 * another model after a model change. It does its jobs in order, so every
 * file operation asked for later finds the file moved. */
static void move_aside(struct engine *e, const char *id)
{
    struct session_fileop here = {.kind = JOB_FILE, .op = FILE_MOVE_ASIDE};
    struct session_fileop *f = e->writer_on ? calloc(1, sizeof *f) : NULL;
    snprintf(here.id, sizeof here.id, "%s", id);
    if (!f) { /* no IO thread (or no memory for its job): here */
        file_op(e, &here);
        file_done(e, &here);
        return;
    }
    *f = here;
    f->state = LOAD_QUEUED;
    f->alone = 1;
    to_io(e, f);
}

int session_restore(struct engine *e, struct seq *s, const char *id, uint64_t key,
                    struct session_err *se)
{
    memset(se, 0, sizeof *se);
    s->on_disk = 0; /* a new session, unless a snapshot is restored */
    s->disk_bytes = 0;
    if (e->dir_fd < 0)
        return 0;
    char name[ENGINE_SESSION_ID_MAX + 8];
    if (file_name(name, sizeof name, id, SNAP_EXT) < 0)
        return 0;
    double t0 = mono_s();
    uint8_t *buf = NULL;
    size_t len = 0;
    struct snapshot_meta m;
    const uint8_t *k = NULL, *v = NULL;
    char why[200] = "";
    /* a save still with the writer, or held after a failed write, is newer
     * than any file: restored from memory (the writer only reads its cells) */
    struct session_saving *w = pending(e, id);
    struct session_loading *l = w ? NULL : loading_of(e, id);
    int rc = 0, dec_rc = 0, gone = 0;
    if (w) {
        m = w->m;
        k = w->k;
        v = w->v;
    } else if (l && l->state == LOAD_DONE) { /* read and checked by the IO thread */
        /* one skipped for another key never gets here: for this key's file
         * session_restore_wait read it again, else session_load_foreign
         * refused the request */
        assert(!l->skipped);
        rc = l->rc;
        buf = l->buf;
        len = l->len;
        gone = l->gone;
        l->buf = NULL;
        dec_rc = l->dec_rc;
        m = l->m;
        k = l->k;
        v = l->v;
        if (dec_rc < 0)
            snprintf(why, sizeof why, "%s", l->why);
        loading_free(l);
    } else { /* no IO thread: read here */
        rc = read_file(e, name, max_snapshot(e), &buf, &len);
        if (rc == 0)
            dec_rc = snapshot_decode(buf, len, &m, &k, &v, why, sizeof why);
    }
    if (rc == -ENOENT) {
        free(buf);
        return 0;
    }
    if (w)
        ; /* made by this process: valid */
    else if (rc == -EFBIG)
        snprintf(why, sizeof why, "the file is larger than any snapshot this server writes");
    else if (rc < 0)
        snprintf(why, sizeof why, "reading it failed: %s", strerror(-rc));
    else if (dec_rc < 0)
        ; /* why says it */
    else if (!engine_session_id_equal(m.id, id))
        snprintf(why, sizeof why, "the file holds another session");
    else if (memcmp(m.model_digest, e->model_digest, 32) != 0)
        snprintf(why, sizeof why, "it was made with another model file");
    else if (m.has_next && m.next_tok >= e->info.n_vocab)
        snprintf(why, sizeof why, "its pending token is outside the vocabulary");
    if (why[0]) {
        free(buf);
        if (rc == -EIO || rc == -ENOMEM || rc == -EMFILE || rc == -ENFILE) {
            se->status = 503; /* the file may be fine: leave it */
            snprintf(se->code, sizeof se->code, "session_restore_failed");
        } else {
            move_aside(e, id);
            se->status = 422;
            snprintf(se->code, sizeof se->code, "session_snapshot_invalid");
        }
        if (snprintf(se->message, sizeof se->message, "session '%s' cannot be restored: %s%s", id,
                     why, se->status == 422 ? " (the file was moved aside to <id>.bad)" : "") < 0)
            se->message[0] = 0; /* a long reason is cut to the message's size */
        e->stats.restore_failures_total++;
        return -1;
    }
    if (m.owner_unknown) { /* version 1: its owner was a place in a key list, now unknown */
        free(buf);
        se->status = 409;
        snprintf(se->code, sizeof se->code, "session_snapshot_incompatible");
        if (snprintf(se->message, sizeof se->message,
                     "session '%s' is a snapshot of format version 1 whose owner cannot be "
                     "known; it is kept, not restored",
                     id) < 0)
            se->message[0] = 0; /* a long id is cut to the message's size */
        e->stats.restore_failures_total++;
        return -1;
    }
    if (m.owner != key) { /* another key's session does not exist for this one */
        free(buf);
        se->status = 404;
        return -1;
    }
    const struct kv_geometry *g = &e->dec.fwd.pool.geo;
    if (m.dtype != g->dtype || m.n_layer != g->n_layer || m.n_kv_head != g->n_kv_head ||
        m.head_dim != g->head_dim || m.n_sinks > g->n_sinks || m.window > g->window) {
        free(buf);
        se->status = 409;
        snprintf(se->code, sizeof se->code, "session_snapshot_incompatible");
        snprintf(se->message, sizeof se->message,
                 "session '%s' was saved with a %s KV cache, window %lld and %lld sinks; this "
                 "server keeps %s, window at most %lld, at most %lld sinks",
                 id, kv_dtype_name(m.dtype), (long long)m.window, (long long)m.n_sinks,
                 kv_dtype_name(g->dtype), (long long)g->window, (long long)g->n_sinks);
        e->stats.restore_failures_total++;
        return -1;
    }
    int64_t g_swa_window = g->swa_period > 0 ? g->swa_window : 0;
    if (m.swa_period != g->swa_period || m.swa_window != g_swa_window) {
        free(buf);
        se->status = 409;
        snprintf(se->code, sizeof se->code, "session_snapshot_incompatible");
        snprintf(se->message, sizeof se->message,
                 "session '%s' was saved with local attention layers of period %d and window "
                 "%lld; this server's model has period %d and window %lld (0: none)",
                 id, m.swa_period, (long long)m.swa_window, g->swa_period, (long long)g_swa_window);
        e->stats.restore_failures_total++;
        return -1;
    }
    if (kv_seq_init(&s->kv, g, s->kv.slot, m.policy, m.window, m.pos_first) < 0) {
        free(buf);
        se->status = 500;
        snprintf(se->message, sizeof se->message, "session '%s': the KV sequence failed", id);
        e->stats.restore_failures_total++;
        return -1;
    }
    kv_seq_restored(&s->kv, m.pos_next); /* n_evicted as the file's (snapshot_parse checked) */
    prefix_forget(e, s->kv.slot);        /* its cells become the session's */
    rc = session_copy_cells(&e->dec.backend, g, &s->kv, &m, (uint8_t *)k, (uint8_t *)v, 1);
    free(buf);
    /* the file just read (unless evicted since), or one older than the save */
    s->on_disk = w ? w->prev_on_disk : !gone;
    s->disk_bytes = !s->on_disk ? 0 : w ? w->prev_bytes : (int64_t)len;
    if (rc == 0 && w && w->state == SAVE_HELD) { /* in memory again: its slot is the copy */
        free(w->buf);
        w->buf = NULL;
        w->state = SAVE_FREE;
        count_saves(e);
    }
    if (rc < 0) {
        se->status = 500;
        snprintf(se->message, sizeof se->message, "session '%s': writing its KV cells failed", id);
        e->stats.restore_failures_total++;
        return -1;
    }
    s->next_tok = m.next_tok;
    s->has_next = m.has_next;
    s->owner = m.owner;
    snprintf(s->session, sizeof s->session, "%s", id);
    e->stats.restores_total++;
    observe(&e->stats.restore_seconds_total, &e->stats.restore_seconds_max, e->stats.restore_hist,
            mono_s() - t0);
    return 1;
}

/* ---- description, listing, deletion -------------------------------------------------------- */

void session_describe(const struct engine *e, const struct seq *s, struct engine_session_info *out)
{
    memset(out, 0, sizeof *out);
    snprintf(out->id, sizeof out->id, "%s", s->session);
    out->tokens_seen = s->kv.pos_next - s->kv.pos_first + (s->has_next ? 1 : 0);
    out->position = s->kv.pos_next;
    kv_policy_name(&s->kv.policy, out->policy, sizeof out->policy);
    out->in_memory = 1;
    out->created = s->created;
    out->restored = s->restored;
    out->on_disk = e->dir_fd >= 0 && s->on_disk;
    out->bytes = out->on_disk ? s->disk_bytes : 0;
}

int session_load_foreign(struct engine *e, const char *id, uint64_t key)
{
    const struct session_loading *l = loading_of(e, id);
    /* a version-1 file of a key is nobody's: its restore says why it is refused */
    return l && l->state == LOAD_DONE && l->hdr_ok && engine_session_id_equal(l->hdr.id, id) &&
           !l->hdr.owner_unknown && l->hdr.owner != key;
}

/* The snapshot of id in dir_fd if key owns it: 0, -ENOENT (none of key's),
 * or -errno (it could not be opened or read). Any thread. */
static int describe_file(int dir_fd, const char *id, uint64_t key, struct engine_session_info *out)
{
    memset(out, 0, sizeof *out);
    char name[ENGINE_SESSION_ID_MAX + 8];
    if (dir_fd < 0 || file_name(name, sizeof name, id, SNAP_EXT) < 0)
        return -ENOENT;
    struct snapshot_meta m;
    int64_t bytes = 0;
    int rc = read_header(dir_fd, name, &m, &bytes);
    if (rc < 0)
        return rc;
    if (!engine_session_id_equal(m.id, id) || m.owner_unknown || m.owner != key)
        return -ENOENT;
    describe_meta(&m, out);
    out->on_disk = 1;
    out->bytes = bytes;
    return 0;
}

int session_describe_held(struct engine *e, const char *id, uint64_t key,
                          struct engine_session_info *out)
{
    memset(out, 0, sizeof *out);
    struct session_saving *w = pending(e, id);
    if (!w || session_find(e, id) || w->m.owner != key)
        return -ENOENT;
    describe_meta(&w->m, out);
    out->on_disk = w->prev_on_disk; /* an older snapshot */
    out->bytes = w->prev_on_disk ? w->prev_bytes : 0;
    return 0;
}

/* Appends in to l: 0, or -ENOMEM (l->rc too; l keeps what it has). */
static int listing_add(struct session_listing *l, const struct engine_session_info *in)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        void *p = realloc(l->in, cap * sizeof *l->in);
        if (!p)
            return l->rc = -ENOMEM;
        l->in = p;
        l->cap = cap;
    }
    l->in[l->n++] = *in;
    return 0;
}

/* The IO thread's part of a listing: every file of the directory that the
 * key owns and that the listing does not have from memory, described from
 * its header (describe_file reads only the directory). */
static void listing_add_each(struct engine *e, const struct engine_session_info *in, void *l)
{
    (void)e;
    listing_add(l, in);
}

void session_list_memory(struct engine *e, uint64_t key,
                         void (*each)(struct engine *e, const struct engine_session_info *in,
                                      void *arg),
                         void *arg)
{
    struct engine_session_info in;
    for (int64_t i = 0; i < e->cfg.max_seqs; i++) {
        const struct seq *q = &e->seqs[i];
        if (q->state != SEQ_FREE && q->session[0] && q->owner == key) {
            session_describe(e, q, &in);
            each(e, &in, arg);
        }
    }
}

static int list_dir(struct engine *e, struct session_listing *l)
{
    int fd = dup(e->dir_fd);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0)
            close(fd);
        return l->rc = -EIO;
    }
    rewinddir(d);
    struct dirent *de;
    for (;;) {
        errno = 0;
        if (!(de = readdir(d))) {
            if (errno) /* a directory read part way is not a listing */
                l->rc = -errno;
            break;
        }
        size_t len = strlen(de->d_name);
        if (len <= strlen(SNAP_EXT) || len - strlen(SNAP_EXT) >= ENGINE_SESSION_ID_MAX ||
            strcmp(de->d_name + len - strlen(SNAP_EXT), SNAP_EXT) != 0)
            continue;
        char id[ENGINE_SESSION_ID_MAX];
        memcpy(id, de->d_name, len - strlen(SNAP_EXT));
        id[len - strlen(SNAP_EXT)] = 0;
        int known = 0; /* listed from memory */
        for (size_t i = 0; i < l->n_mem && !known; i++)
            known = engine_session_id_equal(l->in[i].id, id);
        struct engine_session_info in;
        int rc = known ? -ENOENT : describe_file(e->dir_fd, id, l->key, &in);
        if (rc == -EMFILE || rc == -ENFILE || rc == -ENOMEM || rc == -EIO) {
            l->rc = rc; /* for now unreadable, and maybe this key's: not a listing */
            break;
        }
        if (rc < 0)
            continue; /* listed from memory, gone, damaged, another key's, or not a
                       * file this server can ever read (a socket, another user's) */
        if (listing_add(l, &in) < 0)
            break;
    }
    closedir(d);
    return l->rc;
}

int session_list_wait(struct engine *e, uint64_t req_id, uint64_t key)
{
    struct session_listing *l = e->listing;
    if (!e->writer_on || !l)
        return 0; /* no directory */
    if (l->state != LOAD_FREE)
        return l->req_id != req_id || l->state == LOAD_QUEUED;
    l->kind = JOB_LIST;
    l->state = LOAD_QUEUED;
    l->req_id = req_id;
    l->key = key;
    l->n = 0;
    l->rc = 0;
    /* what is in memory now: a session that leaves it while the directory
     * is read is then in neither place when the listing is sent */
    session_list_memory(e, key, listing_add_each, l);
    struct engine_session_info in;
    for (int i = 0; e->saving && i < SESSION_SAVES_MAX && l->rc == 0; i++) {
        struct session_saving *w = &e->saving[i]; /* each session once: its newest save */
        if (w->state != SAVE_FREE && pending(e, w->m.id) == w &&
            session_describe_held(e, w->m.id, key, &in) == 0)
            listing_add(l, &in);
    }
    l->n_mem = l->n;
    to_io(e, l);
    return 1;
}

void session_lists_gc(struct engine *e)
{
    struct session_listing *l = e->listing;
    if (!l || l->state != LOAD_DONE)
        return;
    for (int64_t j = 0; j < e->n_waiting; j++)
        if (e->waiting[j].req.id == l->req_id)
            return;
    l->state = LOAD_FREE; /* its request was cancelled while the files were read */
}

int session_list(struct engine *e, uint64_t req_id,
                 void (*each)(struct engine *e, const struct engine_session_info *in, void *arg),
                 void *arg)
{
    struct session_listing *l = e->listing;
    if (!l || l->state != LOAD_DONE || l->req_id != req_id)
        return 0; /* no directory */
    l->state = LOAD_FREE;
    if (l->rc < 0)
        return l->rc;
    for (size_t i = 0; i < l->n; i++)
        each(e, &l->in[i], arg);
    return 1;
}

/* ---- session API requests' files, read and deleted by the IO thread --------------------- */

/* The IO thread's part of a session API request: key's snapshot of f->id,
 * described; for a DELETE, if it is key's, unlinked, the directory synced
 * (the unlink survives a crash) and recounted. */
static void file_op(struct engine *e, struct session_fileop *f)
{
    char name[ENGINE_SESSION_ID_MAX + 8];
    f->scan_ok = 0;
    if (f->op == FILE_MOVE_ASIDE) {
        f->rc = rename_aside(e->dir_fd, f->id);
    } else {
        f->rc = describe_file(e->dir_fd, f->id, f->key, &f->in);
        if (f->op != FILE_DELETE || f->rc < 0 || file_name(name, sizeof name, f->id, SNAP_EXT) < 0)
            return;
        f->rc = unlinkat(e->dir_fd, name, 0) < 0 ? -errno : 0;
        if (f->rc == 0)
            fsync(e->dir_fd);
    }
    /* a file left the directory (or was to): its new count */
    f->scan_ok = count_dir(e, NULL, &f->scan);
}

int session_file_room(const struct engine *e)
{
    for (int i = 0; e->fileops && i < SESSION_FILEOPS_MAX; i++)
        if (e->fileops[i].state == LOAD_FREE)
            return 1;
    return !e->writer_on;
}

int session_file_busy(const struct engine *e, const char *id)
{
    for (int i = 0; e->fileops && i < SESSION_FILEOPS_MAX; i++)
        if (e->fileops[i].state == LOAD_QUEUED &&
            (!id[0] || engine_session_id_equal(e->fileops[i].id, id)))
            return 1;
    return 0;
}

/* Hands operation op on id's file to the IO thread: 1, or 0 without a
 * directory. */
static int file_start(struct engine *e, int op, const char *id, uint64_t key, uint64_t answer_id,
                      int found)
{
    if (!e->writer_on || e->dir_fd < 0 || !engine_session_id_valid(id))
        return 0;
    for (int i = 0; i < SESSION_FILEOPS_MAX; i++) {
        struct session_fileop *f = &e->fileops[i];
        if (f->state != LOAD_FREE)
            continue;
        memset(f, 0, sizeof *f);
        f->kind = JOB_FILE;
        f->state = LOAD_QUEUED;
        f->op = op;
        snprintf(f->id, sizeof f->id, "%s", id);
        f->key = key;
        f->answer_id = answer_id;
        f->found = found;
        to_io(e, f);
        return 1;
    }
    /* not reached (the caller checked session_file_room); if it were, the
     * answer would still be right: the work is done here */
    struct session_fileop f = {
        .kind = JOB_FILE, .op = op, .key = key, .answer_id = answer_id, .found = found};
    snprintf(f.id, sizeof f.id, "%s", id);
    file_op(e, &f);
    file_done(e, &f);
    return 1;
}

int session_describe_start(struct engine *e, const char *id, uint64_t key, uint64_t answer_id)
{
    return file_start(e, FILE_DESCRIBE, id, key, answer_id, 0);
}

int session_delete_start(struct engine *e, const char *id, uint64_t key, uint64_t answer_id,
                         int found)
{
    return file_start(e, FILE_DELETE, id, key, answer_id, found);
}

int session_save_busy(const struct engine *e, const char *id, uint64_t key)
{
    return queued(e, id, &key);
}
