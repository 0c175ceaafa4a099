/*
 * oplog.h - the file operations a store makes, logged in order, for tests
 * of crash ordering: hooks_on() wraps kvx_os's open, close, fsync,
 * unlinkat, linkat and mkdir so each appends "<op> <path or name>" to ev[]
 * (nev of them), and _exit(42)s (a kill -9 at that very point) when the
 * operation's name equals kill_at; hooks_off() (a cmocka teardown) puts
 * the real calls back. find_ev() finds an event in order.
 */
#ifndef KVX_TEST_OPLOG_H
#define KVX_TEST_OPLOG_H

#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/os.h"

static kvx_os_ops real_os;

static char kill_at[64];

        /* unlinkat of this name: _exit(42), a kill -9 there */
static char dirpath[1024][128];

 /* the path each open directory descriptor was opened with */
static char ev[1024][160];

static int nev;

static void log_ev(const char *what, const char *arg)
{
    if (nev < 1024) snprintf(ev[nev++], sizeof ev[0], "%s:%.140s", what, arg);
}

static int hk_open(const char *path, int flags, mode_t mode)
{
    int fd = real_os.open(path, flags, mode);
    if (fd >= 0 && fd < 1024) snprintf(dirpath[fd], sizeof dirpath[0], "%.127s", (flags & O_DIRECTORY) ? path : "");
    return fd;
}

static int hk_close(int fd)
{
    if (fd >= 0 && fd < 1024) dirpath[fd][0] = 0;
    return real_os.close(fd);
}

static int hk_fsync(int fd)
{
    if (fd >= 0 && fd < 1024 && dirpath[fd][0]) log_ev("fsync", dirpath[fd]);
    return real_os.fsync(fd);
}

static int hk_unlinkat(int dirfd, const char *path, int flags)
{
    if (kill_at[0] && strcmp(path, kill_at) == 0) _exit(42);
    log_ev("unlink", path);
    return real_os.unlinkat(dirfd, path, flags);
}

static int hk_linkat(int a, const char *from, int b, const char *to, int flags)
{
    log_ev("link", to);
    return real_os.linkat(a, from, b, to, flags);
}

static int hk_mkdir(const char *path, mode_t mode)
{
    log_ev("mkdir", path);
    return real_os.mkdir(path, mode);
}

static void hooks_on(void)
{
    real_os = kvx_os;
    nev = 0;
    memset(dirpath, 0, sizeof dirpath);
    kvx_os.open = hk_open;
    kvx_os.close = hk_close;
    kvx_os.fsync = hk_fsync;
    kvx_os.unlinkat = hk_unlinkat;
    kvx_os.linkat = hk_linkat;
    kvx_os.mkdir = hk_mkdir;
}

static int hooks_off(void **state)
{
    (void)state;
    kvx_os_reset();
    kill_at[0] = 0;
    return 0;
}

/* The first logged event equal to want at or after index from, or -1. */
static int find_ev(const char *want, int from)
{
    for (int i = from < 0 ? 0 : from; i < nev; i++)
        if (strcmp(ev[i], want) == 0) return i;
    return -1;
}

#endif
