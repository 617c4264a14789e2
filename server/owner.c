/*
 * owner.c: the owner hash and its secret (owner.h).
 *
 * The secret file holds 32 lowercase hex characters (16 random bytes) and a
 * newline. It is written to a temporary name opened with O_EXCL and mode
 * 0600, fsync'd, and linked into place with linkat, which fails if the name
 * exists: of replicas starting together on one directory exactly one
 * secret wins, and nobody reads a half-written file.
 */
#include "owner.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "siphash.h"

#define SECRET_HEX 32

static int random_bytes(unsigned char *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t r = getrandom(buf + got, n - got, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return r < 0 ? -errno : -EIO;
        got += (size_t)r;
    }
    return 0;
}

static int hex_val(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* Reads the secret from fd: 0, -EINVAL (not a secret file) or -errno. */
static int read_secret(int fd, unsigned char key[16])
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    if (!S_ISREG(st.st_mode))
        return -EINVAL;
    if (st.st_mode & 077)
        log_msg(LOG_WARN, "%s is readable by others than its owner; it should be mode 0600",
                OWNER_SECRET_FILE);
    char buf[SECRET_HEX + 2];
    size_t got = 0;
    while (got < sizeof buf) {
        ssize_t r = read(fd, buf + got, sizeof buf - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            break;
        got += (size_t)r;
    }
    if (got != SECRET_HEX + 1 || buf[SECRET_HEX] != '\n')
        return -EINVAL;
    for (int i = 0; i < 16; i++) {
        int hi = hex_val(buf[2 * i]), lo = hex_val(buf[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return -EINVAL;
        key[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

/* Makes dir/owner.secret unless it exists: 0 (made, or another process made
 * it first) or -errno. */
static int make_secret(int dfd)
{
    static const char hex[] = "0123456789abcdef";
    unsigned char key[16];
    char text[SECRET_HEX + 1], tmp[64];
    int rc = random_bytes(key, sizeof key);
    if (rc < 0)
        return rc;
    for (int i = 0; i < 16; i++) {
        text[2 * i] = hex[key[i] >> 4];
        text[2 * i + 1] = hex[key[i] & 15];
    }
    text[SECRET_HEX] = '\n';
    unsigned char r[8];
    if ((rc = random_bytes(r, sizeof r)) < 0)
        return rc;
    int n = snprintf(tmp, sizeof tmp, ".%s.tmp-%ld-%02x%02x%02x%02x", OWNER_SECRET_FILE,
                     (long)getpid(), r[0], r[1], r[2], r[3]);
    if (n < 0 || (size_t)n >= sizeof tmp)
        return -ENAMETOOLONG;
    int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0)
        return -errno;
    size_t off = 0;
    while (rc == 0 && off < sizeof text) {
        ssize_t w = write(fd, text + off, sizeof text - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            rc = w < 0 ? -errno : -EIO;
        else
            off += (size_t)w;
    }
    if (rc == 0 && fsync(fd) < 0)
        rc = -errno;
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && linkat(dfd, tmp, dfd, OWNER_SECRET_FILE, 0) < 0 && errno != EEXIST)
        rc = -errno;
    unlinkat(dfd, tmp, 0);
    if (rc == 0)
        fsync(dfd);
    return rc;
}

int owner_secret_load(const char *dir, unsigned char key[16], char *err, size_t err_len)
{
    if (!dir || !dir[0]) {
        int rc = random_bytes(key, 16);
        if (rc < 0)
            snprintf(err, err_len, "no random bytes for the owner hash: %s", strerror(-rc));
        return rc;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        int rc = -errno;
        snprintf(err, err_len, "--session-dir %s: %s", dir, strerror(-rc));
        return rc;
    }
    int rc = -ENOENT;
    for (int tries = 0; tries < 2 && rc == -ENOENT; tries++) {
        int fd = openat(dfd, OWNER_SECRET_FILE, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0) {
            rc = read_secret(fd, key);
            close(fd);
            break;
        }
        rc = -errno;
        if (rc == -ENOENT && tries == 0) {
            int mk = make_secret(dfd);
            if (mk < 0)
                rc = mk;
        }
    }
    close(dfd);
    if (rc == -EINVAL)
        snprintf(err, err_len,
                 "%s/%s is not an owner secret (32 hexadecimal characters and a newline); "
                 "the sessions in the directory belong to the owners it named",
                 dir, OWNER_SECRET_FILE);
    else if (rc < 0)
        snprintf(err, err_len, "%s/%s: %s", dir, OWNER_SECRET_FILE, strerror(-rc));
    return rc;
}

uint64_t owner_of_token(const unsigned char key[16], const char *token, size_t len)
{
    return siphash24(key, token, len) | 1;
}

uint64_t owner_group_of_address(const unsigned char key[16], const struct sockaddr *sa)
{
    if (sa->sa_family == AF_INET)
        return siphash24(key, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    if (sa->sa_family != AF_INET6)
        return 0;
    const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(a)) /* a dual-stack listener's IPv4 client */
        return siphash24(key, a->s6_addr + 12, 4);
    return siphash24(key, a->s6_addr, 8); /* the /64: one host may use all of it */
}
