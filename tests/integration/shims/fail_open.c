/*
 * fail_open.c: an LD_PRELOAD shim for the session tests. While the file
 * $FAIL_OPEN_FLAG exists, open and openat of a path whose last component is
 * $FAIL_OPEN_NAME fail with EMFILE (as when a process runs out of file
 * descriptors); while $FAIL_READDIR_FLAG exists, a readdir that would
 * return the entry $FAIL_READDIR_NAME fails with EIO instead (a directory
 * read that breaks part way); while $STALL_FLAG exists, an fstatat of a
 * path whose last component is $STALL_NAME first sleeps $STALL_S seconds (a
 * file system that is slow to answer). Each NAME is a pattern of fnmatch
 * ("*.snap": the first snapshot a directory read meets). Everything else
 * goes to the C library. Built by the test that uses it
 * (cc -shared -fPIC ... -ldl).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

static int named_and_flagged(const char *path, const char *name_var, const char *flag_var)
{
    const char *name = getenv(name_var), *flag = getenv(flag_var);
    if (!name || !flag || !path)
        return 0;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return fnmatch(name, base, 0) == 0 && access(flag, F_OK) == 0;
}

static int should_fail(const char *path)
{
    return named_and_flagged(path, "FAIL_OPEN_NAME", "FAIL_OPEN_FLAG");
}

static mode_t mode_of(int flags, va_list ap)
{
    return flags & (O_CREAT | O_TMPFILE) ? (mode_t)va_arg(ap, int) : 0;
}

#define SHIM_OPENAT(fname)                                                                         \
    int fname(int dirfd, const char *path, int flags, ...)                                         \
    {                                                                                              \
        static int (*real)(int, const char *, int, ...);                                           \
        va_list ap;                                                                                \
        va_start(ap, flags);                                                                       \
        mode_t mode = mode_of(flags, ap);                                                          \
        va_end(ap);                                                                                \
        if (should_fail(path)) {                                                                   \
            errno = EMFILE;                                                                        \
            return -1;                                                                             \
        }                                                                                          \
        if (!real)                                                                                 \
            real = (int (*)(int, const char *, int, ...))dlsym(RTLD_NEXT, #fname);                 \
        return real(dirfd, path, flags, mode);                                                     \
    }

SHIM_OPENAT(openat)
SHIM_OPENAT(openat64)

/* open is openat from the working directory */
#define SHIM_OPEN(fname, at)                                                                       \
    int fname(const char *path, int flags, ...)                                                    \
    {                                                                                              \
        va_list ap;                                                                                \
        va_start(ap, flags);                                                                       \
        mode_t mode = mode_of(flags, ap);                                                          \
        va_end(ap);                                                                                \
        return at(AT_FDCWD, path, flags, mode);                                                    \
    }

SHIM_OPEN(open, openat)
SHIM_OPEN(open64, openat64)

#define SHIM_READDIR(fname, ent)                                                                   \
    struct ent *fname(DIR *d)                                                                      \
    {                                                                                              \
        static struct ent *(*real)(DIR *);                                                         \
        if (!real)                                                                                 \
            real = (struct ent * (*)(DIR *)) dlsym(RTLD_NEXT, #fname);                             \
        struct ent *de = real(d);                                                                  \
        if (de && named_and_flagged(de->d_name, "FAIL_READDIR_NAME", "FAIL_READDIR_FLAG")) {       \
            errno = EIO;                                                                           \
            return NULL;                                                                           \
        }                                                                                          \
        return de;                                                                                 \
    }

SHIM_READDIR(readdir, dirent)
SHIM_READDIR(readdir64, dirent64)

#define SHIM_FSTATAT(fname, st_type)                                                               \
    int fname(int dirfd, const char *path, struct st_type *buf, int flags)                         \
    {                                                                                              \
        static int (*real)(int, const char *, struct st_type *, int);                              \
        if (!real)                                                                                 \
            real = (int (*)(int, const char *, struct st_type *, int))dlsym(RTLD_NEXT, #fname);    \
        const char *secs = getenv("STALL_S");                                                      \
        if (secs && named_and_flagged(path, "STALL_NAME", "STALL_FLAG"))                           \
            usleep((useconds_t)(atof(secs) * 1e6));                                                \
        return real(dirfd, path, buf, flags);                                                      \
    }

SHIM_FSTATAT(fstatat, stat)
SHIM_FSTATAT(fstatat64, stat64)
