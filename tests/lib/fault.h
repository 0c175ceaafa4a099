/*
 * fault.h - fault injection over the OS seam (common/os.h), for tests.
 *
 * fault_install() swaps kvx_os for wrappers that count every call (but the
 * closes: close, munmap, dir_close) and, when fault_at == the call's
 * number, fail it the way fault_mode says: an errno (ENOSPC, EIO, ENOMEM,
 * ...) on any call, or a short transfer (half the bytes) on pwrite/pread.
 * fault_only narrows the count to some kinds of call (FAULT_SYNC: the
 * fsyncs; FAULT_MAP: the mmaps...); fault_hit_op names the call failed.
 * The usual pattern, as in SQLite's test_syscall.c: run an operation once
 * to count its calls, then re-run it failing call k for every k, and check
 * that the error surfaces, that nothing acknowledged is lost and that the
 * store works afterwards.
 */
#ifndef KVX_TEST_FAULT_H
#define KVX_TEST_FAULT_H

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "common/os.h"

enum fault_mode { FAULT_ERRNO = 0, FAULT_SHORT = 1, FAULT_KILL = 2 /* SIGKILL before the call */ };

/* The kinds of call, for fault_only: a mask of the kinds counted (and so
 * failed); 0 counts every call but the closes (close, munmap, dir_close). */
enum fault_kind {
    FAULT_OPEN = 1 << 0,    /* open, openat, dup */
    FAULT_RW = 1 << 1,      /* pread, pwrite */
    FAULT_SYNC = 1 << 2,    /* fsync, fdatasync */
    FAULT_TRUNC = 1 << 3,   /* ftruncate, fallocate */
    FAULT_FSTAT = 1 << 4,   /* fstat */
    FAULT_FSTATAT = 1 << 5, /* fstatat (stat by name) */
    FAULT_STATX = 1 << 6,   /* statx */
    FAULT_LOCK = 1 << 7,    /* flock */
    FAULT_MAP = 1 << 8,     /* mmap */
    FAULT_DIR = 1 << 9,     /* dir_open, dir_next: a directory walk */
    FAULT_NAME = 1 << 10,   /* rename, rename_noreplace, renameat, linkat, unlink, unlinkat, mkdir, mkdirat */
};

static long fault_calls;  /* calls counted since fault_reset */
static long fault_at = 0; /* 1-based call to fail; 0 = none */
static int fault_errno = EIO;
static int fault_mode = FAULT_ERRNO;
static unsigned fault_only;     /* enum fault_kind mask; 0 = every kind */
static int fault_sticky;        /* 1: every counted call from fault_at on fails, not that one alone */
static long fault_hits;         /* faults injected */
static const char *fault_hit_op; /* the call the last fault failed ("mmap", ...) */
static kvx_os_ops fault_real;

static int fault_now(unsigned kind, const char *op)
{
    if (fault_only && !(fault_only & kind)) return 0;
    long n = ++fault_calls;
    if (fault_at && (n == fault_at || (fault_sticky && n > fault_at))) {
        fault_hits++;
        fault_hit_op = op;
        if (fault_mode == FAULT_KILL) raise(SIGKILL);
        return 1;
    }
    return 0;
}

#define FAULT_FAIL_RET(ret)                                                  \
    do {                                                                     \
        errno = fault_errno;                                                 \
        return ret;                                                          \
    } while (0)
#define FAULT_CHECK(kind, op, ret)                                           \
    do {                                                                     \
        if (fault_now(kind, op)) FAULT_FAIL_RET(ret);                        \
    } while (0)

static int f_open(const char *p, int fl, mode_t m) { FAULT_CHECK(FAULT_OPEN, "open", -1); return fault_real.open(p, fl, m); }
static int f_openat(int d, const char *p, int fl, mode_t m) { FAULT_CHECK(FAULT_OPEN, "openat", -1); return fault_real.openat(d, p, fl, m); }
static int f_dup(int fd) { FAULT_CHECK(FAULT_OPEN, "dup", -1); return fault_real.dup(fd); }
static ssize_t f_pwrite(int fd, const void *b, size_t n, off_t o)
{
    if (fault_now(FAULT_RW, "pwrite")) {
        if (fault_mode == FAULT_SHORT && n > 1) return fault_real.pwrite(fd, b, n / 2, o);
        FAULT_FAIL_RET(-1);
    }
    return fault_real.pwrite(fd, b, n, o);
}
static ssize_t f_pread(int fd, void *b, size_t n, off_t o)
{
    if (fault_now(FAULT_RW, "pread")) {
        if (fault_mode == FAULT_SHORT && n > 1) return fault_real.pread(fd, b, n / 2, o);
        FAULT_FAIL_RET(-1);
    }
    return fault_real.pread(fd, b, n, o);
}
static int f_fsync(int fd) { FAULT_CHECK(FAULT_SYNC, "fsync", -1); return fault_real.fsync(fd); }
static int f_fdatasync(int fd) { FAULT_CHECK(FAULT_SYNC, "fdatasync", -1); return fault_real.fdatasync(fd); }
static int f_ftruncate(int fd, off_t l) { FAULT_CHECK(FAULT_TRUNC, "ftruncate", -1); return fault_real.ftruncate(fd, l); }
static int f_fstat(int fd, struct stat *st) { FAULT_CHECK(FAULT_FSTAT, "fstat", -1); return fault_real.fstat(fd, st); }
static int f_fstatat(int d, const char *p, struct stat *st, int fl) { FAULT_CHECK(FAULT_FSTATAT, "fstatat", -1); return fault_real.fstatat(d, p, st, fl); }
static int f_statx(int d, const char *p, int fl, unsigned mask, struct statx *sx) { FAULT_CHECK(FAULT_STATX, "statx", -1); return fault_real.statx(d, p, fl, mask, sx); }
static int f_flock(int fd, int op) { FAULT_CHECK(FAULT_LOCK, "flock", -1); return fault_real.flock(fd, op); }
static int f_fallocate(int fd, int mode, off_t o, off_t n)
{
    FAULT_CHECK(FAULT_TRUNC, "fallocate", -1);
    return fault_real.fallocate(fd, mode, o, n);
}
static void *f_mmap(void *a, size_t n, int prot, int fl, int fd, off_t o) { FAULT_CHECK(FAULT_MAP, "mmap", MAP_FAILED); return fault_real.mmap(a, n, prot, fl, fd, o); }
static int f_rename(const char *a, const char *b) { FAULT_CHECK(FAULT_NAME, "rename", -1); return fault_real.rename(a, b); }
static int f_rename_noreplace(const char *a, const char *b) { FAULT_CHECK(FAULT_NAME, "rename_noreplace", -1); return fault_real.rename_noreplace(a, b); }
static int f_renameat(int da, const char *a, int db, const char *b) { FAULT_CHECK(FAULT_NAME, "renameat", -1); return fault_real.renameat(da, a, db, b); }
static int f_linkat(int da, const char *a, int db, const char *b, int fl) { FAULT_CHECK(FAULT_NAME, "linkat", -1); return fault_real.linkat(da, a, db, b, fl); }
static int f_unlink(const char *p) { FAULT_CHECK(FAULT_NAME, "unlink", -1); return fault_real.unlink(p); }
static int f_unlinkat(int d, const char *p, int fl) { FAULT_CHECK(FAULT_NAME, "unlinkat", -1); return fault_real.unlinkat(d, p, fl); }
static int f_mkdir(const char *p, mode_t m) { FAULT_CHECK(FAULT_NAME, "mkdir", -1); return fault_real.mkdir(p, m); }
static int f_mkdirat(int d, const char *p, mode_t m) { FAULT_CHECK(FAULT_NAME, "mkdirat", -1); return fault_real.mkdirat(d, p, m); }
static kvx_os_dir *f_dir_open(int d, const char *p, int fl) { FAULT_CHECK(FAULT_DIR, "dir_open", NULL); return fault_real.dir_open(d, p, fl); }
static int f_dir_next(kvx_os_dir *d, const char **name) { FAULT_CHECK(FAULT_DIR, "dir_next", -1); return fault_real.dir_next(d, name); }

static inline void fault_reset(long at, int err, int mode)
{
    fault_calls = 0;
    fault_hits = 0;
    fault_hit_op = NULL;
    fault_at = at;
    fault_errno = err;
    fault_mode = mode;
}

static inline void fault_install(void)
{
    kvx_os_reset();
    fault_real = kvx_os;
    kvx_os.open = f_open;
    kvx_os.openat = f_openat;
    kvx_os.dup = f_dup;
    kvx_os.pwrite = f_pwrite;
    kvx_os.pread = f_pread;
    kvx_os.fsync = f_fsync;
    kvx_os.fdatasync = f_fdatasync;
    kvx_os.ftruncate = f_ftruncate;
    kvx_os.fstat = f_fstat;
    kvx_os.fstatat = f_fstatat;
    kvx_os.statx = f_statx;
    kvx_os.flock = f_flock;
    kvx_os.fallocate = f_fallocate;
    kvx_os.mmap = f_mmap;
    kvx_os.rename = f_rename;
    kvx_os.rename_noreplace = f_rename_noreplace;
    kvx_os.renameat = f_renameat;
    kvx_os.linkat = f_linkat;
    kvx_os.unlink = f_unlink;
    kvx_os.unlinkat = f_unlinkat;
    kvx_os.mkdir = f_mkdir;
    kvx_os.mkdirat = f_mkdirat;
    kvx_os.dir_open = f_dir_open;
    kvx_os.dir_next = f_dir_next;
    fault_only = 0;
    fault_sticky = 0;
    fault_reset(0, EIO, FAULT_ERRNO);
}

static inline void fault_uninstall(void) { kvx_os_reset(); }

/* A per-test setup: the OS seam as it was, io_uring allowed again
 * (KVX_IO_FORCE_NO_URING unset), no alarm pending. */
static inline int os_reset(void **state)
{
    (void)state;
    kvx_os_reset();
    unsetenv("KVX_IO_FORCE_NO_URING");
    alarm(0);
    return 0;
}

#endif
