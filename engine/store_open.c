/*
 * store_open.c - create, open and close a store directory, and
 * reindex_dir: layout and permissions, name checks (never through a
 * symlink), the writer lock, then recovery.
 *
 * Rule: one writer per store (a flock on LOCK); readers never repair
 * (DESIGN.md rule 3). Open comes last in the store's files because it runs
 * recovery, which uses everything before it.
 */
#include "store_plan.h"
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

/* What a handle names before its catalog is open: nothing. */
static const kvx_cat_registry st_no_registry;

static kvx_store *st_alloc(void)
{
    kvx_store *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    if (!(s->vlocks = kvx_st_vlocks_new())) {
        free(s);
        return NULL;
    }
    s->dirfd = s->shardsfd = s->stagingfd = s->lockfd = -1;
    s->free_fd = s->readers_fd = -1;
    s->reg = &st_no_registry;
    pthread_rwlock_init(&s->cache_lock, NULL);
    pthread_mutex_init(&s->use_mu, NULL);
    pthread_mutex_init(&s->wmu, NULL);
    pthread_mutex_init(&s->ev_mu, NULL);
    s->ev_max = KVX_EVICTED_MAX;
    kvx_st_batch_link(s, &s->own);
    return s;
}

static void st_free(kvx_store *s)
{
    kvx_st_tier_detach(s, 0);
    if (s->lagging && kvx_st_lag_stop(s) != 0) kvx_clear_error(); /* the mark stays: the next open knows */
    kvx_st_vlocks_keep(s); /* before LOCK goes: a view that outlives the handle keeps the readers' locks */
    kvx_st_holes_close(s);
    for (int i = 0; i < ST_SLOTS; i++) {
        kvx_shard_close(s->cache[i].sh);
        for (size_t k = 0; k < s->cache[i].nretired; k++) kvx_shard_close(s->cache[i].retired[k]);
        free(s->cache[i].retired);
        free(s->use[i].bits);
        free(s->rec[i].last);
    }
    kvx_cat_close(s->cat);
    if (s->lockfd >= 0) kvx_os.close(s->lockfd); /* releases the flock */
    if (s->stagingfd >= 0) kvx_os.close(s->stagingfd);
    if (s->shardsfd >= 0) kvx_os.close(s->shardsfd);
    if (s->dirfd >= 0) kvx_os.close(s->dirfd);
    free(s->dir);
    free(s->shards_path);
    free(s->staging_path);
    free(s->index_path);
    kvx_st_batch_free_bufs(&s->own);
    pthread_rwlock_destroy(&s->cache_lock);
    pthread_mutex_destroy(&s->use_mu);
    pthread_mutex_destroy(&s->wmu);
    pthread_mutex_destroy(&s->ev_mu);
    free(s->evq);
    free(s);
}

/* Opens a subdirectory of the store without following a symlink. */
static int st_open_subdir(kvx_store *s, const char *name, int *out)
{
    int fd = kvx_os.openat(s->dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP || e == ENOTDIR)
            return kvx_fail(KVX_EPATH, "store: %s/%s is a symlink or not a directory", s->dir, name);
        return kvx_fail(-e, "store: open %s/%s: %s", s->dir, name, strerror(e));
    }
    *out = fd;
    return 0;
}

static int st_check_not_link(int dirfd, const char *dir, const char *name)
{
    struct stat st;
    if (kvx_os.fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT ? 0 : -errno;
    if (!S_ISREG(st.st_mode))
        return kvx_fail(KVX_EPATH, "store: %s/%s is a symlink or not a regular file", dir, name);
    return 0;
}

/* One flock (op) on fd, EINTR retried: 0, or the store's error. */
static int st_flock(kvx_store *s, int fd, int op, const char *what)
{
    while (kvx_os.flock(fd, op) != 0) {
        if (errno == EINTR) continue;
        int e = errno;
        if (e == EWOULDBLOCK) return kvx_fail(KVX_EBUSY, "store: %s: another writer holds the store", s->dir);
        return kvx_fail(-e, "store: flock %s%s: %s", s->dir, what, strerror(e));
    }
    return 0;
}

/* The writer lock: flock(LOCK_EX) on DIR/LOCK, and only on the file that
 * is DIR/LOCK once the lock is held (a LOCK removed or replaced meanwhile,
 * by a "stale lock" cleanup, is opened again: at most 8 tries). LOCK alone
 * cannot see a writer that holds a LOCK someone removed since (the next
 * opener creates a new one), so the writer also flocks DIR itself; a file
 * system that takes no flock on a directory (NFS: EBADF) relies on LOCK
 * alone. */
static int st_lock(kvx_store *s, uint32_t flags, int try_only)
{
    int op = LOCK_EX | ((flags & KVX_STORE_NOWAIT) || try_only ? LOCK_NB : 0);
    int fd = -1, rc = 0;
    for (int tries = 0;; tries++) {
        if ((rc = kvx_st_open_file(s, "LOCK", O_RDWR | O_CREAT, 0600, &fd))) return rc;
        if ((rc = st_flock(s, fd, op, "/LOCK"))) {
            kvx_os.close(fd);
            return rc;
        }
        struct stat a, b;
        if (kvx_os.fstat(fd, &a) != 0) {
            rc = kvx_fail(-errno, "store: fstat %s/LOCK: %s", s->dir, strerror(errno));
            kvx_os.close(fd);
            return rc;
        }
        if (kvx_os.fstatat(s->dirfd, "LOCK", &b, AT_SYMLINK_NOFOLLOW) == 0 && a.st_dev == b.st_dev &&
            a.st_ino == b.st_ino)
            break;
        kvx_os.close(fd); /* a lock on a file that is no longer DIR/LOCK locks nothing */
        if (tries == 7)
            return kvx_fail(KVX_EBUSY, "store: %s: LOCK keeps being replaced: another process is at the store", s->dir);
    }
    /* DIR itself: held until s->dirfd closes (st_free) */
    if (s->dirfd >= 0 && kvx_os.flock(s->dirfd, op) != 0) {
        int e = errno;
        if (e == EINTR || e == EWOULDBLOCK) rc = st_flock(s, s->dirfd, op, "");
        if (rc) {
            kvx_os.close(fd);
            return rc;
        }
    }
    /* the holder's pid, for a waiting writer to name (advisory text) */
    char pid[24];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (kvx_os.ftruncate(fd, 0) == 0 && kvx_os.pwrite(fd, pid, (size_t)len, 0) != len) { /* best effort */ }
    s->lockfd = fd;
    return 0;
}

static int st_read_config(kvx_store *s)
{
    int fd;
    int rc = kvx_st_open_file(s, "STORE", O_RDONLY, 0, &fd);
    if (rc == -ENOENT)
        return kvx_fail(KVX_ENOTFOUND, "store: %s is not a kvx store (STORE: %s)", s->dir, strerror(ENOENT));
    if (rc) return rc;
    uint8_t b[ST_CONFIG_BYTES];
    rc = kvx_os_pread_all(fd, b, sizeof b, 0, NULL);
    kvx_os.close(fd);
    if (rc) return kvx_fail(rc == -EIO ? KVX_ETRUNC : rc, "store: %s/STORE: cannot read 64 bytes", s->dir);
    if ((rc = kvx_st_config_decode(b, &s->g, &s->capacity, &s->target, &s->version))) return rc;
    if (s->g.block_tokens && (rc = kvx_st_check_geometry(&s->g))) return rc; /* a keyed one was checked whole */
    if (s->capacity == 0 || s->target == 0) return kvx_fail(KVX_ECORRUPT, "store: STORE: zero capacity");
    kvx_st_sizes(s);
    return 0;
}

/* index_unread: reindex, which moves index/ aside unread whatever it is
 * (a directory, a file, a FIFO, a symlink, damaged inside): only whether
 * it exists is asked. */
static int st_open_dirs(kvx_store *s, const char *dir, int index_unread)
{
    if (!(s->dir = strdup(dir)) || !(s->shards_path = kvx_st_join(dir, "shards")) ||
        !(s->staging_path = kvx_st_join(dir, "staging")) || !(s->index_path = kvx_st_join(dir, "index")))
        return kvx_fail(-ENOMEM, "store: out of memory");
    s->dirfd = kvx_os.open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0);
    if (s->dirfd < 0) {
        int e = errno;
        return kvx_fail(e == ENOENT ? KVX_ENOTFOUND : -e, "store: open %s: %s", dir, strerror(e));
    }
    int rc, ifd = -1;
    if ((rc = st_read_config(s))) return rc; /* "not a store" before anything else */
    if ((rc = st_open_subdir(s, "shards", &s->shardsfd)) || (rc = st_open_subdir(s, "staging", &s->stagingfd)))
        return rc;
    /* a lost index/ is a reindex away (DESIGN.md rule 4): a writer makes
     * it again, a reader says so */
    struct stat ist;
    if (kvx_os.fstatat(s->dirfd, "index", &ist, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT) {
        s->index_missing = 1;
        return 0;
    }
    if (index_unread) return 0;
    if ((rc = st_open_subdir(s, "index", &ifd))) return rc;
    rc = st_check_not_link(ifd, s->index_path, "data.mdb");
    if (!rc) rc = st_check_not_link(ifd, s->index_path, "lock.mdb");
    kvx_os.close(ifd);
    return rc;
}

/* Opens the catalog of index/ (create: a writer may start an empty one);
 * the handle's registry is then the catalog's. */
static int st_cat_open(kvx_store *s, int create)
{
    int rc = kvx_cat_open(&s->cat, s->index_path, create, (s->flags & KVX_STORE_NOSYNC) != 0);
    if (rc) return rc;
    s->reg = kvx_cat_registry_get(s->cat);
    return 0;
}

static void st_cat_close(kvx_store *s)
{
    kvx_cat_close(s->cat);
    s->cat = NULL;
    s->reg = &st_no_registry;
}

static void st_rm_index_dir(int dirfd, const char *name);

/* A mark DIR/UNSYNCED (store_lag.c) before the catalog opens: of an
 * earlier boot, index/ may be torn by the power cut: a writer removes it
 * unread (recovery then rebuilds it from the files), a reader refuses. */
static int st_lag_open(kvx_store *s)
{
    int lag = kvx_st_lag_read(s);
    if (lag < 0) return lag;
    s->lag_found = lag;
    if (lag != 2) return 0;
    if (!s->writer)
        return kvx_fail(KVX_ESTALE,
                        "store %s: its writer ran with an unsynced index (%s) when the machine last went down, so "
                        "index/ may be torn: a reader never repairs; open the store once as the writer (its recovery "
                        "rebuilds the index from the files) or run 'kvx store reindex %s'",
                        s->dir, ST_LAG_MARK, s->dir);
    if (!s->index_missing) {
        st_rm_index_dir(s->dirfd, "index");
        if (kvx_os.fsync(s->dirfd) != 0)
            return kvx_fail(-errno, "store %s: fsync after removing an unsynced index/: %s", s->dir, strerror(errno));
        s->index_missing = 1;
    }
    return 0;
}

static int st_finish_open(kvx_store *s, int create)
{
    int rc = st_lag_open(s);
    if (rc) return rc;
    if (s->index_missing) {
        if (!s->writer)
            return kvx_fail(KVX_ECORRUPT, "store %s: index/ is missing: run 'kvx store reindex %s'", s->dir, s->dir);
        if (kvx_os.mkdir(s->index_path, 0700) != 0 && errno != EEXIST)
            return kvx_fail(-errno, "store %s: mkdir index/: %s", s->dir, strerror(errno));
        s->index_missing = 0;
    }
    /* a writer may meet an empty index/ (lost index): it creates the
     * databases and recovery rebuilds them from the shards */
    rc = st_cat_open(s, create || s->writer);
    if (rc) return rc;
    if (s->writer) return kvx_st_recover(s);
    /* readers never repair (DESIGN.md rule 3): a stale or damaged record
     * only makes a miss; recovery is a writer's job */
    if ((rc = kvx_st_registry_load(s)) || (rc = kvx_st_registry_refuse_predigest(s))) return rc;
    if (!s->index_live)
        return kvx_fail(KVX_ECORRUPT, "store %s: the index is empty or lost: run 'kvx store reindex %s'", s->dir,
                        s->dir);
    if ((rc = kvx_st_reader_check(s))) return rc;
    /* a writer that frees pages in place punches none while this handle is open */
    if ((rc = kvx_st_readers_join(s))) return rc;
    kvx_clear_error();
    return 0;
}

/* A new store's catalog: zero counters and next_gen 1 (every catalog a
 * store made names next_gen: one without it is empty or lost). */
static int st_create_catalog(kvx_store *s)
{
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    kvx_cat_edit_stats(&e, NULL, 0);
    kvx_cat_edit_next_gen(&e, 1);
    int rc = kvx_cat_apply(s->cat, &e);
    kvx_cat_edit_free(&e);
    return rc;
}

/* fsync of the directory that holds dir (trailing slashes ignored). */
static int st_fsync_parent(const char *dir)
{
    char p[4096];
    size_t n = strlen(dir);
    if (n >= sizeof p) return -ENAMETOOLONG;
    memcpy(p, dir, n + 1);
    while (n > 1 && p[n - 1] == '/') p[--n] = '\0';
    return kvx_os_fsync_parent(p);
}

KVX_API int kvx_store_create(kvx_store **out, const char *dir, const kvx_store_options *opts)
{
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_store_create: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return kvx_fail(KVX_EINVALID, "kvx_store_create: dir is empty");
    if (!opts || opts->version < 1 || opts->version > KVX_STORE_OPTIONS_VERSION)
        return kvx_fail(KVX_EVERSION, "kvx_store_create: options.version must be KVX_STORE_OPTIONS_VERSION");
    uint64_t page_bytes = opts->version >= 2 ? opts->page_bytes : 0;
    kvx_geometry g = opts->geometry;
    int rc;
    if (page_bytes) {
        /* a keyed store: the page size replaces the geometry */
        /* field by field: the struct's padding after quant is whatever
         * the caller's copy left there (a struct returned by value) */
        if (g.num_layers || g.kv_heads || g.head_dim || g.block_tokens || g.quant || g.model_signature)
            return kvx_fail(KVX_EINVALID, "kvx_store_create: a keyed store (page_bytes %llu) takes no geometry: "
                            "leave options.geometry zero", (unsigned long long)page_bytes);
        if ((rc = kvx_keyed_geometry(&g, page_bytes))) return rc;
    } else if ((rc = kvx_st_check_geometry(&g))) {
        return rc;
    }
    if (opts->flags & ~(KVX_STORE_NOWAIT | KVX_STORE_VERIFY | KVX_STORE_NOSYNC | KVX_STORE_HOLES))
        return kvx_fail(KVX_EINVALID, "kvx_store_create: flags 0x%x unknown or READONLY", opts->flags);
    if ((rc = kvx_st_tier_check(opts, &g))) return rc; /* before anything is made */
    kvx_store *s = st_alloc();
    if (!s) return kvx_fail(-ENOMEM, "store: out of memory");
    s->g = g;
    s->flags = opts->flags;
    s->capacity = opts->capacity_bytes ? opts->capacity_bytes : ST_DEFAULT_CAPACITY;
    s->target = opts->shard_bytes;
    if (!s->target) {
        s->target = s->capacity / ST_TARGET_DIV;
        if (s->target < ((uint64_t)512 << 10)) s->target = (uint64_t)512 << 10;
        if (s->target > ((uint64_t)1 << 30)) s->target = (uint64_t)1 << 30;
    }
    kvx_st_sizes(s);
    if (s->capacity < s->target) {
        uint64_t t = s->target;
        st_free(s);
        return kvx_fail(KVX_EINVALID,
                        "kvx_store_create: capacity_bytes %llu is below the shard size %llu (the smallest a store can "
                        "hold: give a larger capacity, or a smaller shard_bytes)",
                        (unsigned long long)opts->capacity_bytes, (unsigned long long)t);
    }
    if (s->capacity < s->entry_bytes + 4096) {
        uint64_t eb = s->entry_bytes;
        st_free(s);
        return kvx_fail(KVX_EINVALID, "kvx_store_create: capacity_bytes %llu holds not even one block (%llu bytes)",
                        (unsigned long long)opts->capacity_bytes, (unsigned long long)eb);
    }
    if (kvx_os.mkdir(dir, 0700) != 0) {
        int e = errno;
        st_free(s);
        return kvx_fail(-e, "kvx_store_create: mkdir %s: %s", dir, strerror(e));
    }
    s->dirfd = kvx_os.open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (s->dirfd < 0) {
        rc = kvx_fail(-errno, "kvx_store_create: open %s: %s", dir, strerror(errno));
        goto fail;
    }
    static const char *subs[] = {"index", "shards", "staging"};
    for (int i = 0; i < 3; i++) {
        char *sub = kvx_st_join(dir, subs[i]); /* through the OS seam, so power-cut tests see it */
        if (!sub || kvx_os.mkdir(sub, 0700) != 0) {
            rc = kvx_fail(sub ? -errno : -ENOMEM, "kvx_store_create: mkdir %s/%s: %s", dir, subs[i],
                          sub ? strerror(errno) : "out of memory");
            free(sub);
            goto fail;
        }
        free(sub);
    }
    uint8_t cfg[ST_CONFIG_BYTES];
    /* a block store created for a writer that frees pages in place is one
     * that may hold them from the start */
    kvx_st_config_encode(cfg, &s->g, s->capacity, s->target,
                         (s->flags & KVX_STORE_HOLES) && s->g.block_tokens ? ST_STORE_HOLES_VERSION : ST_STORE_VERSION);
    int fd;
    if ((rc = kvx_st_open_file(s, "STORE.tmp", O_WRONLY | O_CREAT | O_TRUNC, 0600, &fd))) goto fail;
    rc = kvx_os_pwrite_all(fd, cfg, sizeof cfg, 0);
    if (!rc && kvx_os.fsync(fd) != 0) rc = -errno;
    kvx_os.close(fd);
    if (!rc && kvx_os.renameat(s->dirfd, "STORE.tmp", s->dirfd, "STORE") != 0) rc = -errno;
    if (!rc && kvx_os.fsync(s->dirfd) != 0) rc = -errno;
    if (rc) {
        kvx_fail(rc, "kvx_store_create: write %s/STORE: %s", dir, strerror(-rc));
        goto fail;
    }
    /* DIR's own entry in its parent: without this fsync a power cut may
     * lose the whole directory, and every block acknowledged in it */
    if ((rc = st_fsync_parent(dir))) {
        kvx_fail(rc, "kvx_store_create: fsync the directory holding %s: %s", dir, strerror(-rc));
        goto fail;
    }
    kvx_os.close(s->dirfd);
    s->dirfd = -1;
    if ((rc = st_open_dirs(s, dir, 0))) goto fail;
    if ((rc = st_lock(s, s->flags, 0))) goto fail;
    s->writer = 1;
    if ((rc = st_cat_open(s, 1))) goto fail;
    if ((rc = st_create_catalog(s))) goto fail;
    if ((rc = kvx_st_registry_load(s))) goto fail;
    s->holes = s->holes_new_store = (s->flags & KVX_STORE_HOLES) && !s->keyed;
    if (s->holes && (rc = kvx_st_holes_load(s, 0))) goto fail; /* DIR/READERS */
    if ((rc = kvx_st_tier_attach(s, opts, 0, 1))) goto fail; /* writes DIR/TIER; reaches no server */
    *out = s;
    kvx_clear_error();
    return 0;
fail:
    st_free(s);
    return rc;
}

static int st_open_dir(kvx_store **out, const char *dir, const kvx_geometry *expect, uint32_t flags,
                   const kvx_store_options *opts)
{
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_store_open: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return kvx_fail(KVX_EINVALID, "kvx_store_open: dir is empty");
    if (flags & ~(KVX_STORE_READONLY | KVX_STORE_NOWAIT | KVX_STORE_VERIFY | KVX_STORE_NOSYNC | KVX_STORE_HOLES))
        return kvx_fail(KVX_EINVALID, "kvx_store_open: flags 0x%x has unknown bits", flags);
    if ((flags & KVX_STORE_HOLES) && (flags & KVX_STORE_READONLY))
        return kvx_fail(KVX_EINVALID, "kvx_store_open: KVX_STORE_HOLES is a writer's (flags 0x%x are read-only)",
                        flags);
    kvx_store *s = st_alloc();
    if (!s) return kvx_fail(-ENOMEM, "store: out of memory");
    s->flags = flags;
    int rc = st_open_dirs(s, dir, 0);
    if (!rc && expect) {
        const kvx_geometry *g = &s->g;
#define ST_EXPECT(field)                                                                                  \
    if (expect->field && expect->field != g->field) {                                                     \
        rc = kvx_fail(KVX_ESHAPE, "store %s: " #field " is %u, expected %u", dir, (unsigned)g->field,      \
                      (unsigned)expect->field);                                                            \
    }
        ST_EXPECT(num_layers)
        else ST_EXPECT(kv_heads) else ST_EXPECT(head_dim) else ST_EXPECT(block_tokens);
#undef ST_EXPECT
        if (!rc && expect->num_layers && expect->quant != g->quant)
            rc = kvx_fail(KVX_ESHAPE, "store %s: quant is %s, expected %s", dir, kvx_quant_name(g->quant),
                          kvx_quant_name(expect->quant) ? kvx_quant_name(expect->quant) : "unknown");
        if (!rc && expect->model_signature && expect->model_signature != g->model_signature)
            rc = kvx_fail(KVX_EMODEL, "store %s: model_signature is %016llx, expected %016llx", dir,
                          (unsigned long long)g->model_signature, (unsigned long long)expect->model_signature);
    }
    if (!rc && !(flags & KVX_STORE_READONLY)) {
        rc = st_lock(s, flags, 0);
        s->writer = rc == 0;
        s->holes = s->writer && (flags & KVX_STORE_HOLES) && !s->keyed;
    }
    if (!rc) rc = st_finish_open(s, 0);
    if (!rc) rc = kvx_st_tier_attach(s, opts, 1, 0); /* reaches no server */
    if (rc) {
        st_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

KVX_API int kvx_store_open(kvx_store **out, const char *dir, const kvx_geometry *expect, uint32_t flags)
{
    return st_open_dir(out, dir, expect, flags, NULL);
}

KVX_API int kvx_store_open_options(kvx_store **out, const char *dir, const kvx_store_options *opts)
{
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_store_open_options: out is NULL");
    *out = NULL;
    if (!opts || opts->version < 1 || opts->version > KVX_STORE_OPTIONS_VERSION)
        return kvx_fail(KVX_EVERSION, "kvx_store_open_options: options.version must be KVX_STORE_OPTIONS_VERSION");
    return st_open_dir(out, dir, opts->geometry.num_layers ? &opts->geometry : NULL, opts->flags, opts);
}

/* Removes a moved-aside index directory (its two LMDB files), or the
 * file, FIFO or symlink that stood where the directory belongs (the link
 * itself, never what it points to). */
static void st_rm_index_dir(int dirfd, const char *name)
{
    int fd = kvx_os.openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0);
    if (fd < 0) {
        if (errno == ENOTDIR || errno == ELOOP) kvx_os.unlinkat(dirfd, name, 0);
        return;
    }
    kvx_os.unlinkat(fd, "data.mdb", 0);
    kvx_os.unlinkat(fd, "lock.mdb", 0);
    kvx_os.close(fd);
    kvx_os.unlinkat(dirfd, name, AT_REMOVEDIR);
}

KVX_API int kvx_store_reindex_dir(const char *dir, uint32_t flags) { return kvx_store_reindex_dir_report(dir, flags, NULL); }

KVX_API int kvx_store_reindex_dir_report(const char *dir, uint32_t flags, kvx_recovery_report *out)
{
    if (out) memset(out, 0, sizeof *out);
    if (!dir || !*dir) return kvx_fail(KVX_EINVALID, "kvx_store_reindex_dir: dir is empty");
    if (flags & ~(KVX_STORE_NOWAIT | KVX_STORE_NOSYNC))
        return kvx_fail(KVX_EINVALID, "kvx_store_reindex_dir: flags 0x%x has unknown bits", flags);
    kvx_store *s = st_alloc();
    if (!s) return kvx_fail(-ENOMEM, "store: out of memory");
    s->flags = flags;
    int rc = st_open_dirs(s, dir, 1);
    if (!rc) rc = st_lock(s, flags, 0);
    /* the old index is never read: moved aside, removed on success */
    int aside = 0;
    char aside_name[48] = ".index.aside"; /* a name kvx keeps for itself: a user's index.old/ is never touched */
    if (!rc && !s->index_missing) {
        st_rm_index_dir(s->dirfd, aside_name); /* a previous attempt's */
        int moved = kvx_os.renameat(s->dirfd, "index", s->dirfd, aside_name) == 0;
        if (!moved && (errno == ENOTEMPTY || errno == EEXIST || errno == ENOTDIR || errno == EISDIR)) {
            /* .index.aside holds files not ours: leave it, use another name of our own */
            snprintf(aside_name, sizeof aside_name, ".index.aside-%ld", (long)getpid());
            st_rm_index_dir(s->dirfd, aside_name);
            moved = kvx_os.renameat(s->dirfd, "index", s->dirfd, aside_name) == 0;
        }
        if (!moved)
            rc = kvx_fail(-errno, "store %s: move index/ aside: %s", dir, strerror(errno));
        else
            aside = 1;
        s->index_missing = 1;
    }
    if (!rc) {
        s->writer = 1;
        s->no_open_evict = 1;      /* no caller could hear of it: the next writer's open evicts */
        rc = st_finish_open(s, 1); /* an empty index: recovery rebuilds it from the shards */
    }
    int note = rc == 0 && kvx_last_error()[0];
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", kvx_last_error());
    if (out && rc == 0) *out = s->recovery;
    st_cat_close(s);
    if (aside) {
        if (rc == 0) {
            st_rm_index_dir(s->dirfd, aside_name);
        } else {
            /* put the old one back as it was */
            st_rm_index_dir(s->dirfd, "index");
            kvx_os.renameat(s->dirfd, aside_name, s->dirfd, "index");
        }
        kvx_os.fsync(s->dirfd);
    }
    st_free(s);
    if (rc) return kvx_fail(rc, "%s", msg);
    if (note) kvx_fail(0, "%s", msg); /* what reindex set aside, for the caller to show */
    else kvx_clear_error();
    return 0;
}

/* The plan of kvx_store_reindex_dir, made without the writer lock and
 * without reading index/: only the store's files are opened, read-only. */
KVX_API int kvx_store_plan_reindex(kvx_store_plan **out, const char *dir)
{
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_store_plan_reindex: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return kvx_fail(KVX_EINVALID, "kvx_store_plan_reindex: dir is empty");
    kvx_store *s = st_alloc();
    if (!s) return kvx_fail(-ENOMEM, "store: out of memory");
    s->flags = KVX_STORE_READONLY;
    int rc = st_open_dirs(s, dir, 1);
    kvx_st_plan *p = NULL;
    /* the reindex it describes sets index/ aside, so a previous release's
     * store (migrated only from its sound catalog) is refused as it is */
    if (!rc && s->version < ST_STORE_SEQ_VERSION) rc = kvx_st_refuse_unmigrated(s);
    if (!rc) rc = kvx_st_plan_make(s, ST_PLAN_STAGING | ST_PLAN_REBUILD, &p);
    if (!rc) rc = kvx_st_plan_wrap(out, p);
    else kvx_st_plan_free(p);
    st_free(s);
    if (!rc) kvx_clear_error();
    return rc;
}

KVX_API void kvx_store_close(kvx_store *s)
{
    if (!s) return;
    /* unflushed blocks of every batch are dropped (never acknowledged);
     * batches the caller did not destroy are detached, not freed */
    pthread_mutex_lock(&s->wmu);
    kvx_st_batches_close(s);
    /* the active shard sealed in place; a failure leaves it whole, for the
     * next writer's recovery to seal */
    if (kvx_st_active_seal(s) != 0) kvx_clear_error();
    pthread_mutex_unlock(&s->wmu);
    kvx_st_usage_persist(s);
    kvx_st_tier_detach(s, 2000); /* the write-behind: sent, or dropped after 2 s */
    st_free(s);
}

KVX_API int kvx_store_get_geometry(kvx_geometry *out, const kvx_store *s)
{
    if (!out || !s) return kvx_fail(KVX_EINVALID, "kvx_store_get_geometry: NULL argument");
    *out = s->g;
    return 0;
}
