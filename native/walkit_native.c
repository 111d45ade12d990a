/*
 * walkit_native.c - see walkit_native.h for the contract (>= 0 or -errno).
 */
#define _GNU_SOURCE
#include "walkit_native.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

int wk_open(const char *path, int flags, unsigned int mode)
{
    int oflags = O_CLOEXEC;
    int fd;

    oflags |= (flags & WK_OPEN_READONLY) ? O_RDONLY : O_RDWR;
    if (flags & WK_OPEN_CREATE)
        oflags |= O_CREAT;
    if (flags & WK_OPEN_DIRECT)
        oflags |= O_DIRECT;
    do
        fd = open(path, oflags, (mode_t)mode);
    while (fd < 0 && errno == EINTR);
    return fd < 0 ? -errno : fd;
}

int wk_aligned_alloc(void **out, size_t size, size_t align)
{
    int rc = posix_memalign(out, align, size ? size : 1);

    if (rc != 0)
        return -rc;
    memset(*out, 0, size);
    return 0;
}

void wk_free(void *ptr)
{
    free(ptr);
}

int64_t wk_pwrite(int fd, const void *buf, size_t len, int64_t off)
{
    const char *p = buf;
    size_t done = 0;

    while (done < len) {
        ssize_t n = pwrite(fd, p + done, len - done, (off_t)(off + (int64_t)done));
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (n == 0)
            return -EIO; /* no progress: never spin */
        done += (size_t)n;
    }
    return (int64_t)done;
}

/* Skip buffers already written (or empty) at the cursor (*i, *skip). */
static void iov_settle(const size_t *lens, int count, int *i, size_t *skip)
{
    while (*i < count && lens[*i] == *skip) {
        (*i)++;
        *skip = 0;
    }
}

/* Move the cursor (*i, *skip) forward by n bytes. */
static void iov_advance(const size_t *lens, int count, int *i, size_t *skip, size_t n)
{
    while (n > 0 && *i < count) {
        size_t rest = lens[*i] - *skip;
        if (n < rest) {
            *skip += n;
            return;
        }
        n -= rest;
        (*i)++;
        *skip = 0;
    }
}

/* Fill iov from the cursor; returns how many entries were used. */
static int iov_fill(struct iovec *iov, void *const *bufs, const size_t *lens, int count,
                    int i, size_t skip)
{
    int n = 0;

    for (; i < count && n < IOV_MAX; i++, n++) {
        iov[n].iov_base = (char *)bufs[i] + skip;
        iov[n].iov_len = lens[i] - skip;
        skip = 0;
    }
    return n;
}

int64_t wk_pwritev(int fd, void *const *bufs, const size_t *lens, int count, int64_t off)
{
    struct iovec iov[IOV_MAX];
    int64_t total = 0;
    size_t skip = 0;
    int i = 0;

    for (iov_settle(lens, count, &i, &skip); i < count; iov_settle(lens, count, &i, &skip)) {
        int n = iov_fill(iov, bufs, lens, count, i, skip);
        ssize_t w = pwritev(fd, iov, n, (off_t)(off + total));
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (w == 0)
            return -EIO; /* no progress: never spin */
        total += w;
        iov_advance(lens, count, &i, &skip, (size_t)w);
    }
    return total;
}

int64_t wk_pread(int fd, void *buf, size_t len, int64_t off)
{
    ssize_t n;

    do
        n = pread(fd, buf, len, (off_t)off);
    while (n < 0 && errno == EINTR);
    return n < 0 ? -errno : (int64_t)n;
}

int wk_fdatasync(int fd)
{
    int rc;

    do
        rc = fdatasync(fd);
    while (rc < 0 && errno == EINTR);
    return rc < 0 ? -errno : 0;
}

int64_t wk_pwritev_sync(int fd, void *const *bufs, const size_t *lens, int count, int64_t off,
                        int flags, int *failed_sync)
{
    int64_t total = wk_pwritev(fd, bufs, lens, count, off);
    int rc;

    *failed_sync = 0;
    if (total < 0)
        return total;
    do
        rc = (flags & WK_SYNC_DATA) ? fdatasync(fd) : fsync(fd);
    while (rc < 0 && errno == EINTR);
    if (rc < 0) {
        *failed_sync = 1;
        return -errno;
    }
    return total;
}

int wk_fallocate(int fd, int64_t off, int64_t len)
{
    int rc;

    do
        rc = fallocate(fd, 0, (off_t)off, (off_t)len);
    while (rc < 0 && errno == EINTR);
    if (rc == 0)
        return 0;
    if (errno != EOPNOTSUPP)
        return -errno;
    do /* posix_fallocate returns the error number instead of setting errno */
        rc = posix_fallocate(fd, (off_t)off, (off_t)len);
    while (rc == EINTR);
    return -rc;
}

int wk_ftruncate(int fd, int64_t size)
{
    int rc;

    do
        rc = ftruncate(fd, (off_t)size);
    while (rc < 0 && errno == EINTR);
    return rc < 0 ? -errno : 0;
}

int wk_close(int fd)
{
    if (close(fd) < 0 && errno != EINTR)
        return -errno;
    return 0; /* EINTR: Linux has released the fd already; retrying could close another */
}

int wk_fsync_dir(const char *path)
{
    int fd, rc, err;

    do
        fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    while (fd < 0 && errno == EINTR);
    if (fd < 0)
        return -errno;
    do
        rc = fsync(fd);
    while (rc < 0 && errno == EINTR);
    err = rc < 0 ? errno : 0;
    close(fd);
    return -err;
}

int wk_syncfs(int fd)
{
    int rc;

    do
        rc = syncfs(fd);
    while (rc < 0 && errno == EINTR);
    return rc < 0 ? -errno : 0;
}
