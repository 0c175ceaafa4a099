/*
 * fault.h - fault injection over the OS seam (engine/os.h), for tests.
 *
 * fault_install() swaps kvx_os for wrappers that count every call (but
 * close) and, when fault_at == the call's number, fail it the way
 * fault_mode says: an errno (ENOSPC, EIO, ...) on any call, or a short
 * transfer (half the bytes) on pwrite/pread. The usual pattern, as in
 * SQLite's test_syscall.c: run an operation once to count its calls, then
 * re-run it failing call k for every k, and check that the error surfaces,
 * that nothing acknowledged is lost and that the store works afterwards.
 */
#ifndef KVX_TEST_FAULT_H
#define KVX_TEST_FAULT_H

#include <errno.h>
#include <string.h>

#include "common/os.h"

enum fault_mode { FAULT_ERRNO = 0, FAULT_SHORT = 1 };

static long fault_calls;  /* calls counted since fault_reset */
static long fault_at = 0; /* 1-based call to fail; 0 = none */
static int fault_errno = EIO;
static int fault_mode = FAULT_ERRNO;
static int fault_fsync_only = 0; /* fail only the k-th fsync/fdatasync */
static long fault_hits;          /* faults injected */
static kvx_os_ops fault_real;

static int fault_now(int is_sync)
{
    if (fault_fsync_only && !is_sync) return 0;
    long n = ++fault_calls;
    if (fault_at && n == fault_at) {
        fault_hits++;
        return 1;
    }
    return 0;
}

#define FAULT_FAIL_RET(ret)                                                  \
    do {                                                                     \
        errno = fault_errno;                                                 \
        return ret;                                                          \
    } while (0)

static int f_open(const char *p, int fl, mode_t m) { if (fault_now(0)) FAULT_FAIL_RET(-1); return fault_real.open(p, fl, m); }
static int f_openat(int d, const char *p, int fl, mode_t m) { if (fault_now(0)) FAULT_FAIL_RET(-1); return fault_real.openat(d, p, fl, m); }
static ssize_t f_pwrite(int fd, const void *b, size_t n, off_t o)
{
    if (fault_now(0)) {
        if (fault_mode == FAULT_SHORT && n > 1) return fault_real.pwrite(fd, b, n / 2, o);
        FAULT_FAIL_RET(-1);
    }
    return fault_real.pwrite(fd, b, n, o);
}
static ssize_t f_pread(int fd, void *b, size_t n, off_t o)
{
    if (fault_now(0)) {
        if (fault_mode == FAULT_SHORT && n > 1) return fault_real.pread(fd, b, n / 2, o);
        FAULT_FAIL_RET(-1);
    }
    return fault_real.pread(fd, b, n, o);
}
static int f_fsync(int fd) { if (fault_now(1)) FAULT_FAIL_RET(-1); return fault_real.fsync(fd); }
static int f_fdatasync(int fd) { if (fault_now(1)) FAULT_FAIL_RET(-1); return fault_real.fdatasync(fd); }
static int f_ftruncate(int fd, off_t l) { if (fault_now(0)) FAULT_FAIL_RET(-1); return fault_real.ftruncate(fd, l); }
static int f_rename(const char *a, const char *b) { if (fault_now(0)) FAULT_FAIL_RET(-1); return fault_real.rename(a, b); }
static int f_rename_noreplace(const char *a, const char *b) { if (fault_now(0)) FAULT_FAIL_RET(-1); return fault_real.rename_noreplace(a, b); }
static int f_renameat(int da, const char *a, int db, const char *b) { if (fault_now(0)) FAULT_FAIL_RET(-1); return fault_real.renameat(da, a, db, b); }
static int f_unlink(const char *p) { if (fault_now(0)) FAULT_FAIL_RET(-1); return fault_real.unlink(p); }
static int f_unlinkat(int d, const char *p, int fl) { if (fault_now(0)) FAULT_FAIL_RET(-1); return fault_real.unlinkat(d, p, fl); }
static int f_mkdir(const char *p, mode_t m) { if (fault_now(0)) FAULT_FAIL_RET(-1); return fault_real.mkdir(p, m); }

static inline void fault_reset(long at, int err, int mode)
{
    fault_calls = 0;
    fault_hits = 0;
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
    kvx_os.pwrite = f_pwrite;
    kvx_os.pread = f_pread;
    kvx_os.fsync = f_fsync;
    kvx_os.fdatasync = f_fdatasync;
    kvx_os.ftruncate = f_ftruncate;
    kvx_os.rename = f_rename;
    kvx_os.rename_noreplace = f_rename_noreplace;
    kvx_os.renameat = f_renameat;
    kvx_os.unlink = f_unlink;
    kvx_os.unlinkat = f_unlinkat;
    kvx_os.mkdir = f_mkdir;
    fault_reset(0, EIO, FAULT_ERRNO);
}

static inline void fault_uninstall(void) { kvx_os_reset(); }

#endif
