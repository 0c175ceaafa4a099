/*
 * store_lag.c - the writer's lagging catalog: a flush is acknowledged once
 * its shard files are durable in shards/ (they carry every sequence
 * number); the catalog's LMDB commit that names them is made without
 * LMDB's syncs. Within one boot the page cache holds every commit whole
 * (LMDB is safe against a killed process without them); across a power
 * cut data.mdb may be torn. So before the first unsynced commit the writer
 * makes DIR/UNSYNCED durable, naming the boot (the kernel's boot id); at
 * close it syncs the catalog, then removes the mark durably.
 *
 * Rule: a mark of an earlier boot (or one that cannot be read) means the
 * catalog may be torn: a writer's open sets index/ aside unread and
 * recovery rebuilds it from the files alone (as after a lost index/); a
 * reader refuses (it never repairs). A mark of this boot means the last
 * writer stopped without its close (kill -9): the catalog is whole in the
 * page cache; the next writer's open syncs it and removes the mark.
 */
#include "store.h"
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define ST_LAG_TMP ST_LAG_MARK ".tmp"

/* "kvx unsynced catalog since boot <id>\n" for this boot; 0 or -errno. */
static int st_lag_text(char *buf, size_t cap)
{
    char id[128];
    if (kvx_os.boot_id(id, sizeof id) != 0) return errno ? -errno : -EIO;
    int n = snprintf(buf, cap, "kvx unsynced catalog since boot %s\n", id);
    return n > 0 && (size_t)n < cap ? 0 : -ENAMETOOLONG;
}

int kvx_st_lag_read(kvx_store *s)
{
    int fd = -1;
    unsigned type = 0;
    int rc = kvx_os_openat_regular(s->dirfd, ST_LAG_MARK, O_RDONLY, 0, &fd, &type);
    if (rc == -ENOENT) return 0;
    if (rc == 1) return 2; /* not a file kvx wrote: the catalog is not trusted */
    if (rc) return kvx_fail(rc, "store %s: open %s: %s", s->dir, ST_LAG_MARK, strerror(-rc));
    char have[256] = "", want[256];
    size_t got = 0;
    rc = kvx_os_pread_all(fd, have, sizeof have - 1, 0, &got);
    kvx_os.close(fd);
    if (rc) return kvx_fail(rc, "store %s: read %s: %s", s->dir, ST_LAG_MARK, strerror(-rc));
    have[got] = '\0';
    /* a torn, poisoned or foreign mark, or no boot id to compare: an
     * earlier boot's, as far as anyone can tell */
    if (st_lag_text(want, sizeof want) != 0) return 2;
    /* exactly: every byte read (a NUL within, zeros after the text) */
    return got == strlen(want) && memcmp(have, want, got) == 0 ? 1 : 2;
}

/* DIR/UNSYNCED holds text, durably (written beside, fsynced, renamed
 * over, DIR fsynced). 0 or -errno. */
static int st_lag_write(kvx_store *s, const char *text)
{
    int fd = -1;
    int rc = kvx_st_open_file(s, ST_LAG_TMP, O_WRONLY | O_CREAT | O_TRUNC, 0600, &fd);
    if (rc) return rc;
    rc = kvx_os_pwrite_all(fd, text, strlen(text), 0);
    if (!rc && kvx_os.fsync(fd) != 0) rc = -errno;
    kvx_os.close(fd);
    if (!rc && kvx_os.renameat(s->dirfd, ST_LAG_TMP, s->dirfd, ST_LAG_MARK) != 0) rc = -errno;
    if (!rc && kvx_os.fsync(s->dirfd) != 0) rc = -errno;
    if (rc) {
        kvx_os.unlinkat(s->dirfd, ST_LAG_TMP, 0);
        return kvx_fail(rc, "store %s: write %s: %s", s->dir, ST_LAG_MARK, strerror(-rc));
    }
    return 0;
}

/* A drop's mark in staging/ (".drop", ".dropq")? */
static int st_lag_drop_mark(kvx_store *s, int fd, const char *name, void *ctx)
{
    (void)s;
    (void)fd;
    size_t len = strlen(name);
    if ((len > 5 && strcmp(name + len - 5, ".drop") == 0) || (len > 6 && strcmp(name + len - 6, ".dropq") == 0))
        *(int *)ctx = 1;
    return 0;
}

void kvx_st_lag_start(kvx_store *s)
{
    if (s->lagging || !s->writer || !s->cat || kvx_cat_readonly(s->cat) || (s->flags & KVX_STORE_NOSYNC)) return;
    /* a drop's victim still beside its mark: only a sound, synced catalog
     * lets recovery finish that drop (kvx_st_after_drop) */
    int marks = 0;
    if (kvx_st_each_file(s, s->stagingfd, st_lag_drop_mark, &marks) != 0 || marks) {
        kvx_clear_error();
        return;
    }
    char text[256];
    /* no boot id (no /proc), or the mark cannot be made durable: the
     * catalog's commits stay synced, as before */
    if (st_lag_text(text, sizeof text) != 0 || st_lag_write(s, text) != 0 || kvx_cat_lag(s->cat, 1) != 0) {
        kvx_clear_error();
        return;
    }
    s->lagging = 1;
}

int kvx_st_lag_stop(kvx_store *s)
{
    if (!s->cat || kvx_cat_readonly(s->cat)) return 0;
    int rc = kvx_cat_lag(s->cat, 0); /* syncing again, then every earlier commit durable */
    if (rc) {
        /* data.mdb may not hold what the page cache held (a failed
         * writeback): the next open, of any boot, must not trust it */
        if (st_lag_write(s, "kvx unsynced catalog: its sync failed\n") != 0) kvx_clear_error();
        return rc;
    }
    s->lagging = 0;
    if (kvx_os.unlinkat(s->dirfd, ST_LAG_MARK, 0) != 0 && errno != ENOENT)
        return kvx_fail(-errno, "store %s: unlink %s: %s", s->dir, ST_LAG_MARK, strerror(errno));
    if (kvx_os.fsync(s->dirfd) != 0)
        return kvx_fail(-errno, "store %s: fsync after removing %s: %s", s->dir, ST_LAG_MARK, strerror(errno));
    return 0;
}
