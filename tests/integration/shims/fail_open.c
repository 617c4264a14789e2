/*
 * fail_open.c: an LD_PRELOAD shim for the session tests. open and openat of
 * a path whose last component is $FAIL_OPEN_NAME fail with EMFILE (as when a
 * process runs out of file descriptors) while the file $FAIL_OPEN_FLAG
 * exists; everything else goes to the C library. Built by the test that
 * uses it (cc -shared -fPIC ... -ldl).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

static int should_fail(const char *path)
{
    const char *name = getenv("FAIL_OPEN_NAME"), *flag = getenv("FAIL_OPEN_FLAG");
    if (!name || !flag || !path)
        return 0;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    return strcmp(base, name) == 0 && access(flag, F_OK) == 0;
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
