/*
 * store_names.c - names in the store directory: shard file names
 * (<16 hex generation>.kvx), directory walks and the quarantine (DESIGN.md
 * "Trust rules" 2).
 *
 * Rule: a name is an identifier only (a new file never takes an existing
 * name, and no name decides what is newer or valid), and nothing the
 * store judged is ever deleted on that judgement: it moves to
 * quarantine/, with the reason beside it, never replacing a file there.
 */
#include "store.h"
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_QUARANTINE "quarantine"

void kvx_st_shard_name(char *buf, uint64_t gen) { snprintf(buf, 32, "%016" PRIx64 ".kvx", gen); }

void kvx_st_active_name(char *buf, uint64_t gen, uint32_t byte)
{
    snprintf(buf, ST_ACTIVE_NAME_MAX, ".%016" PRIx64 ".%02x.kvx.active", gen, byte & 0xFFu);
}

int kvx_st_parse_active_name(const char *name, uint64_t *gen, uint32_t *byte)
{
    char back[ST_ACTIVE_NAME_MAX];
    unsigned long long g;
    unsigned b;
    int used = 0;
    if (strlen(name) != 31 || sscanf(name, ".%16llx.%2x.kvx.active%n", &g, &b, &used) != 2 || used != 31) return 0;
    kvx_st_active_name(back, g, b); /* one spelling only: lower-case hex, every digit */
    if (strcmp(back, name) != 0) return 0;
    *gen = g;
    *byte = b;
    return 1;
}

void kvx_st_active_params(const kvx_store *s, uint32_t byte, uint64_t gen, kvx_active_params *p)
{
    memset(p, 0, sizeof *p);
    p->geometry = s->g;
    p->shard_id = (uint8_t)byte;
    p->max_entries = s->max_entries;
    p->flags = kvx_st_kind_flags(s, ST_KIND_LINEAGE);
    /* the file's name, as the journal header's identity: a journal copied
     * under another name, or another store's, is not this file's */
    memcpy(p->ident, "kvx active shard", 16);
    kvx_store64(p->ident + 16, gen);
    p->ident[24] = (uint8_t)byte;
}

int kvx_st_open_gen(kvx_store *s, uint32_t byte, uint64_t gen, kvx_shard **out, char *name, size_t cap)
{
    char sealed[32], active[ST_ACTIVE_NAME_MAX];
    kvx_st_shard_name(sealed, gen);
    kvx_st_active_name(active, gen, byte);
    kvx_active_params p;
    kvx_st_active_params(s, byte, gen, &p);
    /* sealed, else active, else sealed again: a seal renames the active
     * file to its sealed name between two of these opens */
    int rc = -ENOENT;
    for (int k = 0; k < 3 && rc == -ENOENT; k++) {
        const char *n = k == 1 ? active : sealed;
        if (name) snprintf(name, cap, "%s", n);
        /* a regular file, never through a symlink (the open refuses one
         * too, with O_NOFOLLOW) */
        struct stat st;
        if (kvx_os.fstatat(s->shardsfd, n, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            rc = -errno;
            if (rc != -ENOENT) return kvx_fail(rc, "store %s: stat shards/%s: %s", s->dir, n, strerror(-rc));
            continue;
        }
        if (!S_ISREG(st.st_mode))
            return kvx_fail(KVX_EPATH, "store %s: shards/%s is a %s, not a regular file", s->dir, n,
                            kvx_file_type_name(st.st_mode));
        char *path = kvx_st_join(s->shards_path, n);
        if (!path) return kvx_fail(-ENOMEM, "store: out of memory");
        rc = k == 1 ? kvx_shard_open_active(out, s->shardsfd, n, path, &p) : kvx_shard_open_at(out, s->shardsfd, n, path, 0);
        free(path);
    }
    if (rc == -ENOENT) {
        if (name) kvx_st_shard_name(name, gen);
        return kvx_fail(-ENOENT, "store %s: shards/%s is gone", s->dir, sealed);
    }
    if (rc == 0) kvx_st_vlocks_attach(s, *out); /* its views keep the readers' locks past the store's close */
    return rc;
}

char *kvx_st_join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *p = malloc(la + lb + 2);
    if (!p) return NULL;
    memcpy(p, a, la);
    p[la] = '/';
    memcpy(p + la + 1, b, lb + 1);
    return p;
}

int kvx_st_name_prefix_gen(const char *name, uint64_t *gen)
{
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = name[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return 0;
        v = v << 4 | (uint64_t)d;
    }
    if (strncmp(name + 16, ".kvx", 4) != 0) return 0;
    *gen = v;
    return 1;
}

int kvx_st_parse_name(const char *name, uint64_t *gen)
{
    return strlen(name) == 20 && kvx_st_name_prefix_gen(name, gen);
}

int kvx_st_each_file(kvx_store *s, int fd, st_dir_fn fn, void *ctx)
{
    /* a fresh open of the directory: fd's own offset is never touched */
    kvx_os_dir *d = kvx_os.dir_open(fd, ".", O_NOFOLLOW);
    if (!d) {
        int e = errno;
        return kvx_fail(-e, "store %s: open a directory to list it: %s", s->dir, strerror(e));
    }
    const char *name;
    int r, rc = 0;
    while ((r = kvx_os.dir_next(d, &name)) > 0)
        if ((rc = fn(s, fd, name, ctx))) break;
    if (r < 0 && !rc) { /* a walk that stopped early never passes for a complete one */
        int e = errno;
        rc = kvx_fail(-e, "store %s: list a directory: %s", s->dir, strerror(e));
    }
    kvx_os.dir_close(d);
    return rc;
}

/* Failure paths only (a rewrite's or a flush's files that no commit
 * named): the unlink is made durable at once, so a power cut cannot bring
 * back a file for the next writer's recovery to adopt after later commits
 * (a keyed page deleted since, say). */
void kvx_st_unlink_shard(kvx_store *s, uint64_t gen)
{
    char name[32];
    kvx_st_shard_name(name, gen);
    if (kvx_os.unlinkat(s->shardsfd, name, 0) == 0) kvx_os_fsync_dir(s->shards_path);
}

static int st_qdir_path(kvx_store *s, char *buf, size_t cap)
{
    return snprintf(buf, cap, "%s/" ST_QUARANTINE, s->dir) < (int)cap ? 0 : -ENAMETOOLONG;
}

static int st_open_qdir(kvx_store *s, int *out)
{
    char qdir[4096];
    if (st_qdir_path(s, qdir, sizeof qdir)) return kvx_fail(-ENAMETOOLONG, "store %s: path too long", s->dir);
    if (kvx_os.mkdir(qdir, 0700) == 0) {
        int rc = kvx_os_fsync_dir(s->dir); /* the new directory's entry */
        if (rc) return kvx_fail(rc, "store %s: fsync after mkdir quarantine/: %s", s->dir, strerror(-rc));
    } else if (errno != EEXIST) {
        return kvx_fail(-errno, "store %s: mkdir quarantine/: %s", s->dir, strerror(errno));
    }
    int fd = kvx_os.openat(s->dirfd, ST_QUARANTINE, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP || e == ENOTDIR)
            return kvx_fail(KVX_EPATH, "store %s: quarantine/ is a symlink or not a directory", s->dir);
        return kvx_fail(-e, "store %s: open quarantine/: %s", s->dir, strerror(e));
    }
    *out = fd;
    return 0;
}

int kvx_st_quarantine(kvx_store *s, const char *name, const char *why)
{
    int qfd = -1, rc = st_open_qdir(s, &qfd);
    if (rc) return rc;
    char qdir[4096], from[4096], to[4096], target[300];
    if ((rc = st_qdir_path(s, qdir, sizeof qdir)) ||
        snprintf(from, sizeof from, "%s/%s", s->shards_path, name) >= (int)sizeof from) {
        kvx_os.close(qfd);
        return kvx_fail(-ENAMETOOLONG, "store %s: path too long", s->dir);
    }
    /* same name, never replacing a file already there: a numeric suffix */
    rc = -EEXIST;
    for (int k = 0; k < 10000 && rc == -EEXIST; k++) {
        if (k) snprintf(target, sizeof target, "%s.%d", name, k);
        else snprintf(target, sizeof target, "%s", name);
        if (snprintf(to, sizeof to, "%s/%s", qdir, target) >= (int)sizeof to) {
            rc = -ENAMETOOLONG;
            break;
        }
        /* a name whose note is taken too is taken: the first reason stays */
        char wn[340];
        struct stat wst;
        snprintf(wn, sizeof wn, "%s.why", target);
        if (kvx_os.fstatat(qfd, wn, &wst, AT_SYMLINK_NOFOLLOW) == 0) {
            rc = -EEXIST;
            continue;
        }
        rc = kvx_os.rename_noreplace(from, to) == 0 ? 0 : -errno;
    }
    if (rc) {
        kvx_os.close(qfd);
        return kvx_fail(rc, "store %s: cannot move shards/%s to quarantine/: %s", s->dir, name, strerror(-rc));
    }
    /* the reason, beside it (advisory: the move itself is what matters) */
    char note[340];
    snprintf(note, sizeof note, "%s.why", target);
    /* never replacing or blocking on what is there (a FIFO, someone's file) */
    int fd = kvx_os.openat(qfd, note, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd >= 0) {
        char text[1200];
        int len = snprintf(text, sizeof text, "shards/%s: %s\n", name, why);
        if (len > (int)sizeof text - 1) len = (int)sizeof text - 1;
        if (kvx_os_pwrite_all(fd, text, (size_t)len, 0) == 0) kvx_os.fsync(fd);
        kvx_os.close(fd);
    }
    kvx_os.close(qfd);
    /* both directory entries durable: the file is in exactly one place */
    rc = kvx_os_fsync_dir(qdir);
    if (!rc) rc = kvx_os_fsync_dir(s->shards_path);
    s->quarantined++;
    size_t used = strnlen(s->qnote, sizeof s->qnote);
    if (used < sizeof s->qnote - 1)
        snprintf(s->qnote + used, sizeof s->qnote - used, " %s (%.160s);", target, why);
    return rc ? kvx_fail(rc, "store %s: fsync after quarantining %s: %s", s->dir, name, strerror(-rc)) : 0;
}

int kvx_st_quarantine_name(const char *name)
{
    uint64_t gen;
    if (strlen(name) < 20 || !kvx_st_name_prefix_gen(name, &gen)) return 0;
    const char *rest = name + 20; /* "<16 hex>.kvx" */
    if (!*rest) return 1;
    if (*rest++ != '.' || !*rest) return 0;
    for (; *rest; rest++)
        if (*rest < '0' || *rest > '9') return 0;
    return 1;
}

/* A file of the store directory, only when it is a regular file (store.h). */
int kvx_st_open_file(kvx_store *s, const char *name, int flags, mode_t mode, int *out_fd)
{
    unsigned type;
    int rc = kvx_os_openat_regular(s->dirfd, name, flags, mode, out_fd, &type);
    if (rc == 1)
        return kvx_fail(KVX_EPATH, "store: %s/%s is a %s, not a regular file", s->dir, name,
                        type ? kvx_file_type_name(type) : "FIFO, socket or device");
    if (rc) return kvx_fail(rc, "store: open %s/%s: %s", s->dir, name, strerror(-rc));
    return 0;
}
