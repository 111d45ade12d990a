/*
 * walkit_native.h - the syscall-shaped C shim under bookie.native (Linux).
 *
 * Every function returns >= 0 on success or -errno on failure, retries on EINTR
 * (except wk_close, see below) and, for writes, loops on short writes so that a
 * successful return means every byte was handed to the kernel. Nothing here holds
 * state; policy (fallback to buffered I/O, error mapping) lives in bookie/native.py.
 *
 * native/build.py feeds the text between the cdef markers to cffi's cdef(), so that
 * part must stay plain declarations that pycparser understands (no preprocessor).
 */
#ifndef WALKIT_NATIVE_H
#define WALKIT_NATIVE_H

#include <stddef.h>
#include <stdint.h>

/* cdef-begin */

/* Bits of wk_open's flags argument. */
enum {
    WK_OPEN_CREATE = 1,   /* O_CREAT (never O_EXCL, never O_TRUNC) */
    WK_OPEN_DIRECT = 2,   /* O_DIRECT: -EINVAL when the file system refuses it */
    WK_OPEN_READONLY = 4  /* O_RDONLY instead of O_RDWR */
};

/* open(2) with O_CLOEXEC; returns the fd. */
int wk_open(const char *path, int flags, unsigned int mode);

/* posix_memalign + zero fill; *out is released with wk_free. */
int wk_aligned_alloc(void **out, size_t size, size_t align);
void wk_free(void *ptr);

/* pwrite(2) of all len bytes; returns len. */
int64_t wk_pwrite(int fd, const void *buf, size_t len, int64_t off);

/* pwritev(2) of count buffers (any count: batched by IOV_MAX); returns the total. */
int64_t wk_pwritev(int fd, void *const *bufs, const size_t *lens, int count, int64_t off);

/* One pread(2); short only at end of file. */
int64_t wk_pread(int fd, void *buf, size_t len, int64_t off);

int wk_fdatasync(int fd);

/* Bits of wk_pwritev_sync's flags argument. */
enum {
    WK_SYNC_DATA = 1  /* fdatasync(2) after the write; without it fsync(2) */
};

/* wk_pwritev, then fdatasync(2) (WK_SYNC_DATA) or fsync(2), in one call: one GIL
 * release for the whole group commit. Returns the total written, or -errno of the
 * step that failed; *failed_sync is set to 1 when that step was the sync, else 0.
 * Nothing is synced when the write fails. */
int64_t wk_pwritev_sync(int fd, void *const *bufs, const size_t *lens, int count, int64_t off,
                        int flags, int *failed_sync);

/* fallocate(2) mode 0 (the size grows); posix_fallocate if that is EOPNOTSUPP. */
int wk_fallocate(int fd, int64_t off, int64_t len);

int wk_ftruncate(int fd, int64_t size);

/* close(2); EINTR counts as success (Linux has released the fd), never retried. */
int wk_close(int fd);

/* open the directory, fsync(2) it, close it: makes its entries durable. */
int wk_fsync_dir(const char *path);

/* syncfs(2) of the file system holding fd: every file's data, size and names durable in
 * one call. Since Linux 5.8 it reports a writeback error of that file system once per fd,
 * for errors since the fd was opened (so the caller keeps the fd open across writes). */
int wk_syncfs(int fd);

/* cdef-end */

#endif /* WALKIT_NATIVE_H */
