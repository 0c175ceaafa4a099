/*
 * os.c - the OS seam (see os.h): the default table (libc, plus the few
 * calls that need a shim: a no-replace rename, a close-on-exec dup, the
 * directory walk) and the helpers that turn short transfers and EINTR
 * into whole-buffer calls.
 */
#include "os.h"
#include "internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

static int os_open(const char *path, int flags, mode_t mode) { return open(path, flags, mode); }
static int os_openat(int dirfd, const char *path, int flags, mode_t mode) { return openat(dirfd, path, flags, mode); }
static int os_dup(int fd) { return fcntl(fd, F_DUPFD_CLOEXEC, 0); }
static int os_fstat(int fd, struct stat *st) { return fstat(fd, st); }
static int os_fstatat(int dirfd, const char *path, struct stat *st, int flags)
{
    return fstatat(dirfd, path, st, flags);
}
static int os_uring_result(int res, size_t requested) { (void)requested; return res; }
static int os_uring_wait(int rc) { return rc; }
static int os_boot_id(char *buf, size_t cap)
{
    int rc = kvx_os_read_text("/proc/sys/kernel/random/boot_id", buf, cap);
    if (rc) {
        errno = -rc;
        return -1;
    }
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' ')) buf[--n] = '\0';
    if (n < 8) { /* not a boot id */
        errno = ENODATA;
        return -1;
    }
    return 0;
}

/* The directory walk: a kvx_os_dir is the DIR itself. Opening by name
 * (not by fdopendir on the caller's descriptor) gives the walk its own
 * open file, so its offset starts at the first entry and is nobody
 * else's. */
static kvx_os_dir *os_dir_open(int dirfd, const char *path, int flags)
{
    int fd = openat(dirfd, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC | flags);
    if (fd < 0) return NULL;
    DIR *d = fdopendir(fd);
    if (!d) {
        int e = errno;
        close(fd);
        errno = e;
        return NULL;
    }
    return (kvx_os_dir *)d;
}

static int os_dir_next(kvx_os_dir *dir, const char **out_name)
{
    for (;;) {
        errno = 0;
        struct dirent *e = readdir((DIR *)dir);
        if (!e) return errno ? -1 : 0;
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            *out_name = e->d_name;
            return 1;
        }
    }
}

static int os_dir_close(kvx_os_dir *dir) { return dir ? closedir((DIR *)dir) : 0; }

/* A rename that never replaces a file (DESIGN.md rule 2: a seal never takes
 * an existing file's name): renameat2(RENAME_NOREPLACE), or, on a file
 * system that does not support it, link + unlink (link fails with EEXIST
 * just the same). */
static int os_rename_noreplace(const char *from, const char *to)
{
    if (renameat2(AT_FDCWD, from, AT_FDCWD, to, RENAME_NOREPLACE) == 0) return 0;
    if (errno != EINVAL && errno != ENOSYS) return -1;
    if (link(from, to) != 0) return -1;
    return unlink(from);
}

/* The libc table; a macro so both the live table and its pristine copy are
 * constant initializers. */
#define KVX_OS_DEFAULTS                                                                                             \
    {                                                                                                               \
        .open = os_open, .openat = os_openat, .dup = os_dup, .close = close, .pread = pread, .pwrite = pwrite,      \
        .fsync = fsync, .fdatasync = fdatasync, .ftruncate = ftruncate, .fstat = os_fstat, .fstatat = os_fstatat,   \
        .statx = statx, .flock = flock, .fallocate = fallocate, .mmap = mmap, .munmap = munmap, .rename = rename,   \
        .rename_noreplace = os_rename_noreplace, .renameat = renameat, .linkat = linkat, .unlink = unlink,          \
        .unlinkat = unlinkat, .mkdir = mkdir, .mkdirat = mkdirat, .dir_open = os_dir_open, .dir_next = os_dir_next, \
        .dir_close = os_dir_close, .uring_result = os_uring_result, .uring_wait = os_uring_wait,                    \
        .boot_id = os_boot_id, .statvfs = statvfs                                                                   \
    }

const char *kvx_file_type_name(unsigned int mode)
{
    switch (mode & S_IFMT) {
    case S_IFREG: return "regular file";
    case S_IFDIR: return "directory";
    case S_IFIFO: return "FIFO";
    case S_IFCHR: return "character device";
    case S_IFBLK: return "block device";
    case S_IFSOCK: return "socket";
    case S_IFLNK: return "symlink";
    default: return "file of unknown type";
    }
}

static const kvx_os_ops default_ops = KVX_OS_DEFAULTS;

kvx_os_ops kvx_os = KVX_OS_DEFAULTS;

void kvx_os_reset(void) { kvx_os = default_ops; }

int kvx_os_seam_is_default(void) { return memcmp(&kvx_os, &default_ops, sizeof kvx_os) == 0; }

int kvx_os_pwrite_all(int fd, const void *buf, size_t len, uint64_t off)
{
    const char *p = buf;
    while (len > 0) {
        size_t chunk = len > (size_t)1 << 30 ? (size_t)1 << 30 : len;
        ssize_t n = kvx_os.pwrite(fd, p, chunk, (off_t)off);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (n == 0) return -EIO;
        p += n;
        off += (uint64_t)n;
        len -= (size_t)n;
    }
    return 0;
}

void kvx_os_writeback_start(int fd, uint64_t off, uint64_t len)
{
    (void)sync_file_range(fd, (off_t)off, (off_t)len, SYNC_FILE_RANGE_WRITE);
}

int kvx_os_pread_all(int fd, void *buf, size_t len, uint64_t off, size_t *out_got)
{
    char *p = buf;
    size_t got = 0;
    while (got < len) {
        size_t chunk = len - got > (size_t)1 << 30 ? (size_t)1 << 30 : len - got;
        ssize_t n = kvx_os.pread(fd, p + got, chunk, (off_t)(off + got));
        if (n < 0) {
            if (errno == EINTR) continue;
            return -errno;
        }
        if (n == 0) break; /* end of file */
        got += (size_t)n;
    }
    if (out_got) {
        *out_got = got;
        return 0;
    }
    return got == len ? 0 : -EIO;
}

int kvx_os_fsync_dir(const char *dir)
{
    int fd = kvx_os.open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (fd < 0) return -errno;
    int rc = kvx_os.fsync(fd) < 0 ? -errno : 0;
    kvx_os.close(fd);
    return rc;
}

int kvx_os_fsync_parent(const char *path)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash) return kvx_os_fsync_dir(".");
    size_t n = (size_t)(slash - path);
    if (n == 0) return kvx_os_fsync_dir("/");
    if (n >= sizeof dir) return -ENAMETOOLONG;
    memcpy(dir, path, n);
    dir[n] = '\0';
    return kvx_os_fsync_dir(dir);
}

int kvx_os_read_text(const char *path, char *buf, size_t cap)
{
    if (cap == 0) return -EINVAL;
    int fd = kvx_os.open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY, 0);
    if (fd < 0) return -errno;
    size_t got = 0;
    int rc = kvx_os_pread_all(fd, buf, cap - 1, 0, &got);
    kvx_os.close(fd);
    buf[rc ? 0 : got] = '\0';
    return rc;
}

int kvx_os_openat_regular(int dirfd, const char *name, int flags, mode_t mode, int *out_fd, unsigned *out_mode)
{
    *out_fd = -1;
    *out_mode = 0;
    int fd = kvx_os.openat(dirfd, name, flags | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, mode);
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP) {
            *out_mode = S_IFLNK;
            return 1;
        }
        if (e == EISDIR) {
            *out_mode = S_IFDIR;
            return 1;
        }
        if (e == ENXIO) return 1; /* a FIFO no process reads, opened for writing */
        return -e;
    }
    struct stat st;
    if (kvx_os.fstat(fd, &st) != 0) {
        int e = errno;
        kvx_os.close(fd);
        return -e;
    }
    if (!S_ISREG(st.st_mode)) {
        kvx_os.close(fd);
        *out_mode = (unsigned)st.st_mode;
        return 1;
    }
    *out_fd = fd;
    return 0;
}

int kvx_os_each_name(int dirfd, const char *path, int flags, int (*fn)(void *ctx, const char *name), void *ctx,
                     int *out_walk_failed)
{
    if (out_walk_failed) *out_walk_failed = 1;
    kvx_os_dir *d = kvx_os.dir_open(dirfd, path, flags);
    if (!d) return -errno;
    const char *name;
    int r, rc = 0;
    while ((r = kvx_os.dir_next(d, &name)) > 0)
        if ((rc = fn(ctx, name))) break;
    if (r < 0) rc = errno ? -errno : -EIO;
    kvx_os.dir_close(d);
    if (out_walk_failed) *out_walk_failed = r < 0;
    return rc;
}
