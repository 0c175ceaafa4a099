/*
 * os.h - the one seam between kvx and the operating system's files.
 *
 * Every call the library makes on a file, a directory or a name goes
 * through kvx_os, a table of function pointers that normally holds the
 * libc calls, the way SQLite's VFS (sqlite3_vfs, test_syscall.c) and
 * LevelDB's Env do it. It is there for two reasons:
 *
 * - Fault injection. Tests swap entries (tests/fault.h, tests/powercut.h)
 *   to fail any call with ENOSPC, EIO, EMFILE, ENOMEM..., to shorten a
 *   transfer, or to cut the power just before it, so every error path of
 *   the store, the shard writer and reader and the read path is run, not
 *   hoped for.
 * - One place for platform differences: RENAME_NOREPLACE or link +
 *   unlink, a directory walk over fdopendir, statx for O_DIRECT alignment.
 *
 * The calls: files (open, openat, dup, close, pread, pwrite, fsync,
 * fdatasync, ftruncate, fstat, fstatat, statx, flock, fallocate, mmap, munmap), names
 * (rename, rename_noreplace, renameat, linkat, unlink, unlinkat, mkdir,
 * mkdirat), a directory walk (dir_open, dir_next, dir_close), the
 * io_uring completion and wait filters and the boot id. Members follow the libc convention (-1 or
 * NULL or MAP_FAILED, and errno); the kvx_os_* helpers below turn that
 * into kvx's "0 or -errno" and loop over short transfers and EINTR.
 *
 * This is the only place in the library that calls libc file I/O: common/,
 * format/, index/, engine/ and io/ all go through it (the fault suite,
 * tests/engine/faults.c, fails if the store's seal stat, lock or
 * directory walks stop reaching it). What does not go through it, on
 * purpose: LMDB's own I/O
 * inside index/ (its commit is atomic; tests/powercut.h copies index/ as it
 * is), the io_uring ring itself (set up, submitted and waited on in io/;
 * its results pass through uring_result, a reap's waits through
 * uring_wait), the eventfd that wakes ring
 * waiters, and anonymous memory (the pinned pool's mmap, the SIGBUS
 * guard's replacement page, mapped inside a signal handler where a test's
 * wrapper must not run).
 *
 * Per-call cost: one indirect call beside a system call. The data path
 * makes its page reads with io_uring (no seam call per page) or with
 * pread workers (one seam call per run, as before); opening a file for it
 * (open, fstat, dup, statx) is once per file.
 */
#ifndef KVX_OS_H
#define KVX_OS_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct stat;
struct statx;
struct statvfs;

/* An open directory being walked (a DIR underneath). */
typedef struct kvx_os_dir kvx_os_dir;

typedef struct kvx_os_ops {
    /* ---- files */
    int (*open)(const char *path, int flags, mode_t mode);
    int (*openat)(int dirfd, const char *path, int flags, mode_t mode);
    /* a second descriptor for fd's open file, close-on-exec (F_DUPFD_CLOEXEC) */
    int (*dup)(int fd);
    int (*close)(int fd);
    ssize_t (*pread)(int fd, void *buf, size_t len, off_t off);
    ssize_t (*pwrite)(int fd, const void *buf, size_t len, off_t off);
    int (*fsync)(int fd);
    int (*fdatasync)(int fd);
    int (*ftruncate)(int fd, off_t len);
    int (*fstat)(int fd, struct stat *st);
    /* stat(path) is fstatat(AT_FDCWD, path, st, 0) */
    int (*fstatat)(int dirfd, const char *path, struct stat *st, int flags);
    int (*statx)(int dirfd, const char *path, int flags, unsigned int mask, struct statx *stx);
    int (*flock)(int fd, int op);
    /* fallocate(2): the store frees an evicted page's extent with
     * FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE (docs/APPENDS.md "Holes") */
    int (*fallocate)(int fd, int mode, off_t off, off_t len);
    void *(*mmap)(void *addr, size_t len, int prot, int flags, int fd, off_t off);
    int (*munmap)(void *addr, size_t len);
    /* ---- names */
    int (*rename)(const char *from, const char *to);
    /* a rename that never replaces a file (EEXIST): store seals */
    int (*rename_noreplace)(const char *from, const char *to);
    int (*renameat)(int olddirfd, const char *from, int newdirfd, const char *to);
    int (*linkat)(int olddirfd, const char *from, int newdirfd, const char *to, int flags);
    int (*unlink)(const char *path);
    int (*unlinkat)(int dirfd, const char *path, int flags);
    int (*mkdir)(const char *path, mode_t mode);
    int (*mkdirat)(int dirfd, const char *path, mode_t mode);
    /* ---- directory walk, in three calls so a test can fail the open or
     * any step:
     *   kvx_os_dir *d = kvx_os.dir_open(dirfd, ".", O_NOFOLLOW);
     *   const char *name;
     *   int r;
     *   while ((r = kvx_os.dir_next(d, &name)) > 0) ...use name...;
     *   (r < 0: errno says why the walk stopped)
     *   kvx_os.dir_close(d);
     * dir_open opens path relative to dirfd (O_RDONLY | O_DIRECTORY |
     * O_CLOEXEC | flags), as a new open file: "." walks dirfd's directory
     * from its first entry without touching dirfd's own offset. NULL and
     * errno on failure. dir_next: 1 and the next name ("." and ".." left
     * out; valid until the next call on d), 0 at the end, -1 and errno. */
    kvx_os_dir *(*dir_open)(int dirfd, const char *path, int flags);
    int (*dir_next)(kvx_os_dir *d, const char **out_name);
    int (*dir_close)(kvx_os_dir *d);
    /* ---- io_uring completion filter: io/ passes each completion's result
     * through it, so tests can turn a result into -EAGAIN, -EINTR or a
     * short read. Identity by default. */
    int (*uring_result)(int res, size_t requested);
    /* the result of each io_uring wait of a reap (0 or -errno), so tests
     * can fail a wait for good (-EBUSY): identity by default */
    int (*uring_wait)(int rc);
    /* ---- the running kernel's boot id (/proc/sys/kernel/random/boot_id,
     * a new random value every boot), NUL-terminated in buf: 0 or -1 and
     * errno. The store's lagging index (docs/STORE.md "Durability") tells
     * by it whether the machine went down since a writer's unsynced
     * catalog commits, so tests swap it to model a reboot. */
    int (*boot_id)(char *buf, size_t cap);
    /* ---- statvfs(2): the index tells a full file system from an I/O
     * error when LMDB's commit answers a short page write with EIO */
    int (*statvfs)(const char *path, struct statvfs *st);
} kvx_os_ops;

/* The table in use. Tests may replace entries; restore with kvx_os_reset. */
extern kvx_os_ops kvx_os;
void kvx_os_reset(void);
/* 1 while no test has replaced a call of the seam: paths that bypass it
 * (io_uring reads) are taken only then, so a fault test sees every read. */
int kvx_os_seam_is_default(void);

/* Whole-buffer transfers: loop over short counts and EINTR. Return 0 or
 * -errno; a read that hits end of file returns -EIO... unless out_got is
 * given, which then receives the bytes read. */
int kvx_os_pwrite_all(int fd, const void *buf, size_t len, uint64_t off);
/* Starts writeback of [off, off + len) of fd and returns at once
 * (sync_file_range SYNC_FILE_RANGE_WRITE): advisory, durability is still
 * the fsync's; errors are ignored. */
void kvx_os_writeback_start(int fd, uint64_t off, uint64_t len);
/* A shard writer hands its pages to writeback in steps of
 * KVX_WRITEBACK_STEP once it holds KVX_WRITEBACK_AFTER bytes of them: a
 * small flush is left to the seal's fsync (measured: a step per page made
 * 4 MiB flushes of 64 KiB pages slower), a large one overlaps its copies
 * with the disk (a 256 MiB group of 2 MiB pages: 0.45x -> ~1x of
 * vLLM's file tier) */
#define KVX_WRITEBACK_AFTER ((uint64_t)8 << 20)
#define KVX_WRITEBACK_STEP ((uint64_t)1 << 20)
int kvx_os_pread_all(int fd, void *buf, size_t len, uint64_t off, size_t *out_got);
/* fsync of a directory by path. */
int kvx_os_fsync_dir(const char *dir);
/* fsync of the directory containing path. */
int kvx_os_fsync_parent(const char *path);
/* The first cap - 1 bytes of a small file (/proc, /sys), NUL-terminated in
 * buf. 0 or -errno. */
int kvx_os_read_text(const char *path, char *buf, size_t cap);
/* openat(dirfd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)
 * that never blocks on a FIFO and never keeps a descriptor of anything
 * but a regular file: 0 with *out_fd set, 1 when name is a symlink, FIFO,
 * device, socket or directory (*out_mode its type where known, else 0),
 * or -errno. O_NONBLOCK means nothing to a regular file's reads and
 * writes, so the descriptor is used as it is. */
int kvx_os_openat_regular(int dirfd, const char *name, int flags, mode_t mode, int *out_fd, unsigned *out_mode);
/* Calls fn(ctx, name) for each name of the directory at (dirfd, path)
 * (dir_open's rules), in the file system's order, and stops at fn's first
 * non-zero result. Returns 0 after the last name, fn's result, or -errno
 * when the walk itself failed: *out_walk_failed (nullable) tells the last
 * two apart. */
int kvx_os_each_name(int dirfd, const char *path, int flags, int (*fn)(void *ctx, const char *name), void *ctx,
                     int *out_walk_failed);

#endif
