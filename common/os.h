/*
 * os.h - the one seam between kvx and the operating system.
 *
 * Every file operation the engine makes (open, pread, pwrite, fsync,
 * rename, ...) goes through kvx_os, a table of function pointers that
 * normally holds the libc calls. Tests swap entries (see tests/fault.h) to
 * inject ENOSPC, EIO, failed fsyncs, short reads and writes, or a crash at
 * any step, the way SQLite's test_syscall.c does. Calls follow the libc
 * convention (-1 and errno); the kvx_os_* helpers below turn that into
 * kvx's "0 or -errno" and loop over short transfers and EINTR.
 */
#ifndef KVX_OS_H
#define KVX_OS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct kvx_os_ops {
    int (*open)(const char *path, int flags, mode_t mode);
    int (*openat)(int dirfd, const char *path, int flags, mode_t mode);
    int (*close)(int fd);
    ssize_t (*pread)(int fd, void *buf, size_t len, off_t off);
    ssize_t (*pwrite)(int fd, const void *buf, size_t len, off_t off);
    int (*fsync)(int fd);
    int (*fdatasync)(int fd);
    int (*ftruncate)(int fd, off_t len);
    int (*rename)(const char *from, const char *to);
    /* a rename that never replaces a file (EEXIST): store seals */
    int (*rename_noreplace)(const char *from, const char *to);
    int (*renameat)(int olddirfd, const char *from, int newdirfd, const char *to);
    int (*unlink)(const char *path);
    int (*unlinkat)(int dirfd, const char *path, int flags);
    int (*mkdir)(const char *path, mode_t mode);
    /* io_uring completion filter: io/ passes each completion's result
     * through it, so tests can turn a result into -EAGAIN, -EINTR or a
     * short read. Identity by default. */
    int (*uring_result)(int res, size_t requested);
} kvx_os_ops;

/* The table in use. Tests may replace entries; restore with kvx_os_reset. */
extern kvx_os_ops kvx_os;
void kvx_os_reset(void);

/* Whole-buffer transfers: loop over short counts and EINTR. Return 0 or
 * -errno; a read that hits end of file returns -EIO... unless out_got is
 * given, which then receives the bytes read. */
int kvx_os_pwrite_all(int fd, const void *buf, size_t len, uint64_t off);
int kvx_os_pread_all(int fd, void *buf, size_t len, uint64_t off, size_t *out_got);
/* fsync of a directory by path. */
int kvx_os_fsync_dir(const char *dir);
/* fsync of the directory containing path. */
int kvx_os_fsync_parent(const char *path);

#endif
