/*
 * store.c - the public store API, read side: create and open a store
 * directory (layout, permissions, name checks, writer lock, recovery),
 * lookups by coordinate, hash and prefix, views, usage batching, stat and
 * verify. Writes (put, flush, eviction, compaction, reindex) are in
 * store_write.c. docs/STORE.md explains the design.
 *
 * Lookups cost one LMDB read transaction per call (renewed from a pool, no
 * thread-local storage), one mdb_get per block, and a cached shard handle
 * per shard byte; the block's own entry (hash, lineage) is checked against
 * the query before a view is handed out, so the index only has to be a
 * hint: a stale or colliding index record can never serve wrong bytes.
 */
#include "common/os.h"
#include "store_internal.h"
#include "common/digest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define USE_PERSIST_CALLS 65536u /* a reader writes usage every this many calls */

void kvx_st_shard_name(char *buf, uint64_t gen) { snprintf(buf, 32, "%016" PRIx64 ".kvx", gen); }

uint64_t kvx_st_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static char *st_join(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    char *p = malloc(la + lb + 2);
    if (!p) return NULL;
    memcpy(p, a, la);
    p[la] = '/';
    memcpy(p + la + 1, b, lb + 1);
    return p;
}

/* ---------------------------------------------------------------- config */

static void st_config_encode(uint8_t *b, const kvx_geometry *g, uint64_t cap, uint64_t target)
{
    memset(b, 0, ST_CONFIG_BYTES);
    memcpy(b, "KVXSTORE", 8);
    kvx_store32(b + 8, 1);
    kvx_store32(b + 12, g->quant);
    kvx_store32(b + 16, g->num_layers);
    kvx_store32(b + 20, g->kv_heads);
    kvx_store32(b + 24, g->head_dim);
    kvx_store32(b + 28, g->block_tokens);
    kvx_store64(b + 32, g->model_signature);
    kvx_store64(b + 40, cap);
    kvx_store64(b + 48, target);
    kvx_store32(b + 60, kvx_crc32c(0, b, 60));
}

static int st_config_decode(const uint8_t *b, kvx_geometry *g, uint64_t *cap, uint64_t *target)
{
    if (memcmp(b, "KVXSTORE", 8) != 0) return kvx_fail(KVX_EMAGIC, "store: STORE file: bad magic");
    if (kvx_load32(b + 60) != kvx_crc32c(0, b, 60))
        return kvx_fail(KVX_ECORRUPT, "store: STORE file: checksum mismatch");
    if (kvx_load32(b + 8) != 1)
        return kvx_fail(KVX_EVERSION, "store: STORE file: version %u unknown", kvx_load32(b + 8));
    g->quant = kvx_load32(b + 12);
    g->num_layers = kvx_load32(b + 16);
    g->kv_heads = kvx_load32(b + 20);
    g->head_dim = kvx_load32(b + 24);
    g->block_tokens = kvx_load32(b + 28);
    g->model_signature = kvx_load64(b + 32);
    *cap = kvx_load64(b + 40);
    *target = kvx_load64(b + 48);
    return 0;
}

static int st_check_geometry(const kvx_geometry *g)
{
    if (g->num_layers == 0 || g->num_layers > 65535)
        return kvx_fail(KVX_EINVALID, "store: geometry.num_layers %u not in 1..65535", g->num_layers);
    if (g->kv_heads == 0 || g->kv_heads > 65535)
        return kvx_fail(KVX_EINVALID, "store: geometry.kv_heads %u not in 1..65535", g->kv_heads);
    if (g->head_dim == 0 || g->head_dim > 65535)
        return kvx_fail(KVX_EINVALID, "store: geometry.head_dim %u not in 1..65535", g->head_dim);
    if (g->block_tokens == 0 || g->block_tokens > 65535)
        return kvx_fail(KVX_EINVALID, "store: geometry.block_tokens %u not in 1..65535 (a store names blocks by chained hash)",
                        g->block_tokens);
    if (kvx_quant_elem_size(g->quant) == 0)
        return kvx_fail(KVX_EQUANT, "store: geometry.quant %u unknown", g->quant);
    uint64_t pb = kvx_page_bytes(g, g->block_tokens);
    if (pb == 0 || pb > UINT32_MAX)
        return kvx_fail(KVX_EOVERFLOW, "store: a block's page (2*L*Hkv*B*D*elem) exceeds 4 GiB");
    return 0;
}

/* Derived sizes: page, bytes one entry occupies in a shard, entries per shard. */
static void st_sizes(kvx_store *s)
{
    const kvx_geometry *g = &s->g;
    s->page_bytes = kvx_page_bytes(g, g->block_tokens);
    s->nscales = (uint32_t)kvx_scale_count(g);
    uint64_t tables = 24 + 8 + 8 + 4ull * g->block_tokens;
    if (g->quant != KVX_QUANT_FP16) tables += 4ull * s->nscales;
    s->entry_bytes = kvx_align_up(s->page_bytes, 4096) + tables;
    uint64_t n = s->target / s->entry_bytes;
    if (n < 1) n = 1;
    if (n > KVX_MAX_ENTRIES) n = KVX_MAX_ENTRIES;
    s->max_entries = (uint32_t)n;
}

/* --------------------------------------------------------------- handles */

static kvx_store *st_alloc(void)
{
    kvx_store *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->dirfd = s->shardsfd = s->stagingfd = s->lockfd = -1;
    pthread_rwlock_init(&s->cache_lock, NULL);
    pthread_mutex_init(&s->use_mu, NULL);
    pthread_mutex_init(&s->wmu, NULL);
    return s;
}

static void st_free(kvx_store *s)
{
    for (int i = 0; i < ST_SLOTS; i++) {
        kvx_shard_close(s->cache[i].sh);
        free(s->use[i].bits);
        free(s->rec[i].last);
    }
    if (s->ix) kvx_idx_close(s->ix);
    if (s->lockfd >= 0) kvx_os.close(s->lockfd); /* releases the flock */
    if (s->stagingfd >= 0) kvx_os.close(s->stagingfd);
    if (s->shardsfd >= 0) kvx_os.close(s->shardsfd);
    if (s->dirfd >= 0) kvx_os.close(s->dirfd);
    free(s->dir);
    free(s->shards_path);
    free(s->staging_path);
    free(s->index_path);
    free(s->sealed);
    free(s->pend);
    free(s->ptok);
    free(s->ptab);
    pthread_rwlock_destroy(&s->cache_lock);
    pthread_mutex_destroy(&s->use_mu);
    pthread_mutex_destroy(&s->wmu);
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
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT ? 0 : -errno;
    if (!S_ISREG(st.st_mode))
        return kvx_fail(KVX_EPATH, "store: %s/%s is a symlink or not a regular file", dir, name);
    return 0;
}

static int st_lock(kvx_store *s, uint32_t flags, int try_only)
{
    int fd = kvx_os.openat(s->dirfd, "LOCK", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP) return kvx_fail(KVX_EPATH, "store: %s/LOCK is a symlink", s->dir);
        return kvx_fail(-e, "store: open %s/LOCK: %s", s->dir, strerror(e));
    }
    int op = LOCK_EX | ((flags & KVX_STORE_NOWAIT) || try_only ? LOCK_NB : 0);
    while (flock(fd, op) != 0) {
        if (errno == EINTR) continue;
        int e = errno;
        kvx_os.close(fd);
        if (e == EWOULDBLOCK)
            return kvx_fail(KVX_EBUSY, "store: %s: another writer holds the store", s->dir);
        return kvx_fail(-e, "store: flock %s/LOCK: %s", s->dir, strerror(e));
    }
    /* the holder's pid, for a waiting writer to name (advisory text) */
    char pid[24];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) == 0 && pwrite(fd, pid, (size_t)len, 0) != len) { /* best effort */ }
    s->lockfd = fd;
    return 0;
}

static int st_read_config(kvx_store *s);

static int st_open_dirs(kvx_store *s, const char *dir)
{
    if (!(s->dir = strdup(dir)) || !(s->shards_path = st_join(dir, "shards")) ||
        !(s->staging_path = st_join(dir, "staging")) || !(s->index_path = st_join(dir, "index")))
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
    if (fstatat(s->dirfd, "index", &ist, AT_SYMLINK_NOFOLLOW) != 0 && errno == ENOENT) {
        s->index_missing = 1;
        return 0;
    }
    if ((rc = st_open_subdir(s, "index", &ifd))) return rc;
    rc = st_check_not_link(ifd, s->index_path, "data.mdb");
    if (!rc) rc = st_check_not_link(ifd, s->index_path, "lock.mdb");
    kvx_os.close(ifd);
    return rc;
}

static int st_read_config(kvx_store *s)
{
    int fd = kvx_os.openat(s->dirfd, "STORE", O_RDONLY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP) return kvx_fail(KVX_EPATH, "store: %s/STORE is a symlink", s->dir);
        return kvx_fail(e == ENOENT ? KVX_ENOTFOUND : -e, "store: %s is not a kvx store (STORE: %s)", s->dir,
                        strerror(e));
    }
    uint8_t b[ST_CONFIG_BYTES];
    int rc = kvx_os_pread_all(fd, b, sizeof b, 0, NULL);
    kvx_os.close(fd);
    if (rc) return kvx_fail(rc == -EIO ? KVX_ETRUNC : rc, "store: %s/STORE: cannot read 64 bytes", s->dir);
    if ((rc = st_config_decode(b, &s->g, &s->capacity, &s->target))) return rc;
    if ((rc = st_check_geometry(&s->g))) return rc;
    if (s->capacity == 0 || s->target == 0) return kvx_fail(KVX_ECORRUPT, "store: STORE: zero capacity");
    st_sizes(s);
    return 0;
}

/* --------------------------------------------------------------- recovery */

int kvx_st_each_file(kvx_store *s, int fd, st_dir_fn fn, void *ctx)
{
    int dfd = dup(fd);
    if (dfd < 0) return kvx_fail(-errno, "store: dup: %s", strerror(errno));
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return kvx_fail(-errno, "store: fdopendir: %s", strerror(errno));
    }
    rewinddir(d);
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if ((rc = fn(s, fd, e->d_name, ctx))) break;
    }
    closedir(d);
    return rc;
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

int kvx_st_registry_load(kvx_store *s)
{
    MDB_txn *txn;
    int rc = kvx_idx_read_begin(s->ix, &txn);
    if (rc) return rc;
    memset(s->reg_live, 0, sizeof s->reg_live);
    MDB_cursor *cur;
    rc = mdb_cursor_open(txn, s->ix->shards, &cur);
    if (rc == 0) {
        MDB_val k, v;
        int r = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
        while (r == 0) {
            uint32_t b;
            kvx_idx_shard rec;
            if ((r = kvx_idx_dec_shard(&k, &v, &b, &rec))) break; /* a damaged record: an error naming reindex */
            if (b < ST_SLOTS) {
                s->reg[b] = rec;
                s->reg_live[b] = 1;
            }
            r = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
        }
        mdb_cursor_close(cur);
        rc = r == MDB_NOTFOUND ? 0 : r;
    }
    uint64_t ng = 0;
    if (!rc) rc = kvx_idx_get_u64(txn, s->ix->meta, "next_gen", &ng);
    kvx_idx_read_end(s->ix, txn);
    if (rc) return kvx_idx_err(rc, "read registry");
    s->next_gen = ng;
    s->index_live = ng != 0; /* every index a store made names next_gen */
    for (int b = 0; b < ST_SLOTS; b++)
        if (s->reg_live[b] && s->reg[b].gen >= s->next_gen) s->next_gen = s->reg[b].gen + 1;
    if (s->next_gen == 0) s->next_gen = 1;
    return 0;
}

/* ---------------------------------------------------------------- create */

static int st_finish_open(kvx_store *s, int create)
{
    if (s->index_missing) {
        if (!s->writer)
            return kvx_fail(KVX_ECORRUPT, "store %s: index/ is missing: run 'kvx store reindex %s'", s->dir, s->dir);
        if (kvx_os.mkdir(s->index_path, 0700) != 0 && errno != EEXIST)
            return kvx_fail(-errno, "store %s: mkdir index/: %s", s->dir, strerror(errno));
        s->index_missing = 0;
    }
    /* a writer may meet an empty index/ (lost index): it creates the
     * databases and recovery rebuilds them from the shards */
    int rc = kvx_idx_open(&s->ix, s->index_path, create || s->writer, (s->flags & KVX_STORE_NOSYNC) != 0);
    if (rc) return rc;
    if (s->writer) return kvx_st_recover(s);
    /* readers never repair (DESIGN.md rule 3): a stale or damaged record
     * only makes a miss; recovery is a writer's job */
    if ((rc = kvx_st_registry_load(s))) return rc;
    if (!s->index_live)
        return kvx_fail(KVX_ECORRUPT, "store %s: the index is empty or lost: run 'kvx store reindex %s'", s->dir,
                        s->dir);
    kvx_clear_error();
    return 0;
}

static int st_create_body(MDB_txn *txn, void *ctx)
{
    kvx_store *s = ctx;
    kvx_idx_stats st = {0};
    int rc = kvx_idx_put_u64(txn, s->ix->meta, "next_gen", 1);
    if (!rc) rc = kvx_idx_put_stats(txn, s->ix, &st);
    return rc;
}

KVX_API int kvx_store_create(kvx_store **out, const char *dir, const kvx_store_options *opts)
{
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_store_create: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return kvx_fail(KVX_EINVALID, "kvx_store_create: dir is empty");
    if (!opts || opts->version != KVX_STORE_OPTIONS_VERSION)
        return kvx_fail(KVX_EVERSION, "kvx_store_create: options.version must be KVX_STORE_OPTIONS_VERSION");
    int rc = st_check_geometry(&opts->geometry);
    if (rc) return rc;
    if (opts->flags & ~(KVX_STORE_NOWAIT | KVX_STORE_VERIFY | KVX_STORE_NOSYNC))
        return kvx_fail(KVX_EINVALID, "kvx_store_create: flags 0x%x unknown or READONLY", opts->flags);
    kvx_store *s = st_alloc();
    if (!s) return kvx_fail(-ENOMEM, "store: out of memory");
    s->g = opts->geometry;
    s->flags = opts->flags;
    s->capacity = opts->capacity_bytes ? opts->capacity_bytes : ST_DEFAULT_CAPACITY;
    s->target = opts->shard_bytes;
    if (!s->target) {
        s->target = s->capacity / ST_TARGET_DIV;
        if (s->target < ((uint64_t)512 << 10)) s->target = (uint64_t)512 << 10;
        if (s->target > ((uint64_t)1 << 30)) s->target = (uint64_t)1 << 30;
    }
    st_sizes(s);
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
        char *sub = st_join(dir, subs[i]); /* through the OS seam, so power-cut tests see it */
        if (!sub || kvx_os.mkdir(sub, 0700) != 0) {
            rc = kvx_fail(sub ? -errno : -ENOMEM, "kvx_store_create: mkdir %s/%s: %s", dir, subs[i],
                          sub ? strerror(errno) : "out of memory");
            free(sub);
            goto fail;
        }
        free(sub);
    }
    uint8_t cfg[ST_CONFIG_BYTES];
    st_config_encode(cfg, &s->g, s->capacity, s->target);
    int fd = kvx_os.openat(s->dirfd, "STORE.tmp", O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = kvx_fail(-errno, "kvx_store_create: create STORE: %s", strerror(errno));
        goto fail;
    }
    rc = kvx_os_pwrite_all(fd, cfg, sizeof cfg, 0);
    if (!rc && kvx_os.fsync(fd) != 0) rc = -errno;
    kvx_os.close(fd);
    if (!rc && kvx_os.renameat(s->dirfd, "STORE.tmp", s->dirfd, "STORE") != 0) rc = -errno;
    if (!rc && kvx_os.fsync(s->dirfd) != 0) rc = -errno;
    if (rc) {
        kvx_fail(rc, "kvx_store_create: write %s/STORE: %s", dir, strerror(-rc));
        goto fail;
    }
    kvx_os.close(s->dirfd);
    s->dirfd = -1;
    if ((rc = st_open_dirs(s, dir))) goto fail;
    if ((rc = st_lock(s, s->flags, 0))) goto fail;
    s->writer = 1;
    if ((rc = kvx_idx_open(&s->ix, s->index_path, 1, (s->flags & KVX_STORE_NOSYNC) != 0))) goto fail;
    if ((rc = kvx_idx_write(s->ix, st_create_body, s))) goto fail;
    if ((rc = kvx_st_registry_load(s))) goto fail;
    *out = s;
    kvx_clear_error();
    return 0;
fail:
    st_free(s);
    return rc;
}

KVX_API int kvx_store_open(kvx_store **out, const char *dir, const kvx_geometry *expect, uint32_t flags)
{
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_store_open: out is NULL");
    *out = NULL;
    if (!dir || !*dir) return kvx_fail(KVX_EINVALID, "kvx_store_open: dir is empty");
    if (flags & ~(KVX_STORE_READONLY | KVX_STORE_NOWAIT | KVX_STORE_VERIFY | KVX_STORE_NOSYNC))
        return kvx_fail(KVX_EINVALID, "kvx_store_open: flags 0x%x has unknown bits", flags);
    kvx_store *s = st_alloc();
    if (!s) return kvx_fail(-ENOMEM, "store: out of memory");
    s->flags = flags;
    int rc = st_open_dirs(s, dir);
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
    }
    if (!rc) rc = st_finish_open(s, 0);
    if (rc) {
        st_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* Removes a moved-aside index directory (its two LMDB files). */
static void st_rm_index_dir(int dirfd, const char *name)
{
    int fd = kvx_os.openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0) return;
    kvx_os.unlinkat(fd, "data.mdb", 0);
    kvx_os.unlinkat(fd, "lock.mdb", 0);
    kvx_os.close(fd);
    kvx_os.unlinkat(dirfd, name, AT_REMOVEDIR);
}

KVX_API int kvx_store_reindex_dir(const char *dir, uint32_t flags)
{
    if (!dir || !*dir) return kvx_fail(KVX_EINVALID, "kvx_store_reindex_dir: dir is empty");
    if (flags & ~(KVX_STORE_NOWAIT | KVX_STORE_NOSYNC))
        return kvx_fail(KVX_EINVALID, "kvx_store_reindex_dir: flags 0x%x has unknown bits", flags);
    kvx_store *s = st_alloc();
    if (!s) return kvx_fail(-ENOMEM, "store: out of memory");
    s->flags = flags;
    int rc = st_open_dirs(s, dir);
    if (!rc) rc = st_lock(s, flags, 0);
    /* the old index is never read: moved aside, removed on success */
    int aside = 0;
    if (!rc && !s->index_missing) {
        st_rm_index_dir(s->dirfd, "index.old"); /* a previous attempt's */
        if (kvx_os.renameat(s->dirfd, "index", s->dirfd, "index.old") != 0)
            rc = kvx_fail(-errno, "store %s: move index/ aside: %s", dir, strerror(errno));
        else
            aside = 1;
        s->index_missing = 1;
    }
    if (!rc) {
        s->writer = 1;
        rc = st_finish_open(s, 1); /* an empty index: recovery rebuilds it from the shards */
    }
    int note = rc == 0 && kvx_last_error()[0];
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", kvx_last_error());
    if (s->ix) {
        kvx_idx_close(s->ix);
        s->ix = NULL;
    }
    if (aside) {
        if (rc == 0) {
            st_rm_index_dir(s->dirfd, "index.old");
        } else {
            /* put the old one back as it was */
            st_rm_index_dir(s->dirfd, "index");
            kvx_os.renameat(s->dirfd, "index.old", s->dirfd, "index");
        }
        kvx_os.fsync(s->dirfd);
    }
    st_free(s);
    if (rc) return kvx_fail(rc, "%s", msg);
    if (note) kvx_fail(KVX_ECORRUPT, "%s", msg); /* what reindex set aside, for the caller to show */
    else kvx_clear_error();
    return 0;
}

KVX_API void kvx_store_close(kvx_store *s)
{
    if (!s) return;
    if (s->writer) {
        pthread_mutex_lock(&s->wmu);
        kvx_st_discard_pending(s);
        pthread_mutex_unlock(&s->wmu);
    }
    kvx_st_usage_persist(s);
    st_free(s);
}

KVX_API int kvx_store_get_geometry(kvx_geometry *out, const kvx_store *s)
{
    if (!out || !s) return kvx_fail(KVX_EINVALID, "kvx_store_get_geometry: NULL argument");
    *out = s->g;
    return 0;
}

/* ---------------------------------------------------------------- shards */

kvx_shard *kvx_st_shard_get(kvx_store *s, uint32_t byte, uint64_t gen)
{
    pthread_rwlock_rdlock(&s->cache_lock);
    st_cache *c = &s->cache[byte];
    if (c->gen == gen && (c->sh || c->bad)) {
        kvx_shard *r = c->bad ? NULL : kvx_shard_ref(c->sh);
        pthread_rwlock_unlock(&s->cache_lock);
        return r;
    }
    pthread_rwlock_unlock(&s->cache_lock);

    char name[32];
    kvx_st_shard_name(name, gen);
    kvx_shard *sh = NULL;
    struct stat st;
    int bad = 1, transient = 0;
    int sr = fstatat(s->shardsfd, name, &st, AT_SYMLINK_NOFOLLOW);
    if (sr == 0 && S_ISREG(st.st_mode)) {
        char *path = st_join(s->shards_path, name);
        int rc = path ? kvx_shard_open(&sh, path, 0) : -ENOMEM;
        free(path);
        if (rc == 0) {
            const kvx_shard_info *in = kvx_shard_get_info(sh);
            const kvx_geometry *g = &in->geometry;
            if (in->shard_id == byte && g->num_layers == s->g.num_layers && g->kv_heads == s->g.kv_heads &&
                g->head_dim == s->g.head_dim && g->block_tokens == s->g.block_tokens && g->quant == s->g.quant &&
                g->model_signature == s->g.model_signature && (in->flags & KVX_FLAG_HASHES))
                bad = 0;
        } else if (st_open_transient(rc)) {
            /* EIO, EMFILE, ENOMEM, no mapping-guard slot...: a miss now,
             * not a verdict on the file */
            transient = 1;
        }
    } else if (sr != 0 && errno != ENOENT) {
        transient = 1; /* EACCES, EIO...: not a verdict; something not a
                          regular file where the shard belongs is one */
    }
    if (transient) return NULL;
    pthread_rwlock_wrlock(&s->cache_lock);
    c = &s->cache[byte];
    kvx_shard *old = NULL;
    if (c->gen != gen || (!c->sh && !c->bad)) {
        old = c->sh;
        c->gen = gen;
        c->sh = bad ? NULL : sh;
        c->bad = bad;
        sh = bad ? sh : NULL;
    }
    kvx_shard *r = c->bad || c->gen != gen ? NULL : kvx_shard_ref(c->sh);
    pthread_rwlock_unlock(&s->cache_lock);
    kvx_shard_close(old);
    kvx_shard_close(sh);
    return r;
}

void kvx_st_cache_drop(kvx_store *s, uint32_t byte)
{
    pthread_rwlock_wrlock(&s->cache_lock);
    kvx_shard *old = s->cache[byte].sh;
    s->cache[byte].sh = NULL;
    s->cache[byte].gen = 0;
    s->cache[byte].bad = 0;
    pthread_rwlock_unlock(&s->cache_lock);
    kvx_shard_close(old);
}

/* ---------------------------------------------------------------- lookups */

/* The last shard a prompt's lookup used, with its own reference: the next
 * block of a prompt usually lives in the same shard, and (byte, gen) names
 * one file for good, so a held handle skips the cache lock. */
typedef struct st_hc {
    kvx_shard *sh;
    uint32_t byte;
    uint64_t gen;
} st_hc;

static kvx_shard *st_hc_get(kvx_store *s, st_hc *hc, uint32_t byte, uint64_t gen)
{
    if (!hc) return kvx_st_shard_get(s, byte, gen);
    if (hc->sh && hc->byte == byte && hc->gen == gen) return kvx_shard_ref(hc->sh);
    kvx_shard *sh = kvx_st_shard_get(s, byte, gen);
    if (sh) {
        kvx_shard_close(hc->sh);
        hc->sh = kvx_shard_ref(sh);
        hc->byte = byte;
        hc->gen = gen;
    }
    return sh;
}

/* Is entry e a verified block (stored with its tokens and digest)? */
static int st_verified(const kvx_entry *e) { return e->tokens && e->digest; }

/* Does the block at loc answer q? 0 and a view; KVX_ENOTFOUND when it is
 * another block (or no longer there); KVX_EPAGECRC / KVX_ETRUNC when it is
 * the block but its page is damaged or missing. check_page 0: the entry
 * alone is matched and no view is made (counting). */
static int st_try_loc(kvx_store *s, const kvx_idx_loc *loc, const st_query *q, kvx_view *out, st_hc *hc,
                      uint8_t *out_digest, int check_page)
{
    uint32_t byte = KVX_COORD_SHARD(loc->coord);
    kvx_shard *sh = st_hc_get(s, hc, byte, loc->gen);
    if (!sh) return KVX_ENOTFOUND;
    uint32_t idx = KVX_COORD_BLOCK(loc->coord);
    kvx_entry e;
    int rc = kvx_shard_entry(&e, sh, idx);
    if (rc || e.coordinate != loc->coord || e.hash != q->hash || e.token_count != s->g.block_tokens) goto miss;
    if (q->toks) {
        /* rule 1: hash, parent, tokens and the prefix digest, all four */
        if (!st_verified(&e) || e.parent != q->parent || memcmp(e.tokens, q->toks, 4u * s->g.block_tokens) != 0 ||
            memcmp(e.digest, q->digest, KVX_DIGEST_BYTES) != 0)
            goto miss;
    }
    if (out_digest) { /* the block's digest; all zero when unverified */
        if (st_verified(&e)) memcpy(out_digest, e.digest, KVX_DIGEST_BYTES);
        else memset(out_digest, 0, KVX_DIGEST_BYTES);
    }
    if (!check_page) {
        kvx_shard_close(sh);
        return 0;
    }
    const void *page;
    rc = kvx_shard_page_checked(&page, sh, idx);
    if (rc) {
        kvx_shard_close(sh);
        if (rc == KVX_EPAGECRC || rc == KVX_ETRUNC)
            return kvx_fail(rc, "store: block %016llx (coordinate 0x%08x, shards/%016llx.kvx): %s",
                            (unsigned long long)q->hash, loc->coord, (unsigned long long)loc->gen,
                            rc == KVX_EPAGECRC ? "page CRC mismatch" : "page missing (file truncated)");
        return rc;
    }
    out->coordinate = e.coordinate;
    out->token_count = e.token_count;
    out->hash = e.hash;
    out->page = page;
    out->page_bytes = e.bytes;
    out->scales = e.scales;
    out->shard = sh;
    out->entry = idx;
    return 0;
miss:
    kvx_shard_close(sh);
    return KVX_ENOTFOUND;
}

/* Every index record under q->hash, in order, until one answers. A damaged
 * copy does not end the search (a good copy may follow: a put stores the
 * block again when its only copy is damaged); when none answers, the
 * damage is reported rather than "not found". */
static int st_lookup_hc(kvx_store *s, MDB_txn *txn, const st_query *q, kvx_view *out, st_hc *hc)
{
    uint64_t hash = q->hash;
    MDB_val k = {8, &hash}, v;
    int rc = mdb_get(txn, s->ix->hash, &k, &v);
    if (rc == MDB_NOTFOUND) return KVX_ENOTFOUND;
    if (rc) return kvx_idx_err(rc, "get hash");
    kvx_idx_loc loc;
    uint64_t key;
    if (kvx_idx_dec_loc(&k, &v, &key, &loc))
        return kvx_fail(KVX_ECORRUPT, "store %s: index: the record of hash %016llx is damaged (run kvx store reindex %s)",
                        s->dir, (unsigned long long)hash, s->dir);
    rc = st_try_loc(s, &loc, q, out, hc, NULL, 1);
    if (rc != KVX_ENOTFOUND && rc != KVX_EPAGECRC && rc != KVX_ETRUNC) return rc;
    int damage = rc == KVX_ENOTFOUND ? 0 : rc;
    /* other blocks under the same hash (collisions, unverified copies) */
    MDB_cursor *cur;
    if ((rc = mdb_cursor_open(txn, s->ix->hash, &cur)) != 0) return kvx_idx_err(rc, "open hash cursor");
    rc = mdb_cursor_get(cur, &k, &v, MDB_SET);
    int res = KVX_ENOTFOUND;
    if (rc == 0) rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT_DUP);
    while (rc == 0) {
        if (kvx_idx_dec_loc(&k, &v, &key, &loc)) {
            res = kvx_fail(KVX_ECORRUPT, "store %s: index: a record of hash %016llx is damaged (run kvx store reindex %s)",
                           s->dir, (unsigned long long)hash, s->dir);
            break;
        }
        res = st_try_loc(s, &loc, q, out, hc, NULL, 1);
        if (res == KVX_EPAGECRC || res == KVX_ETRUNC) {
            damage = res;
            res = KVX_ENOTFOUND;
        } else if (res != KVX_ENOTFOUND) {
            break;
        }
        rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT_DUP);
    }
    mdb_cursor_close(cur);
    if (res == KVX_ENOTFOUND && rc != MDB_NOTFOUND && rc != 0) res = kvx_idx_err(rc, "walk hash records");
    if (res == KVX_ENOTFOUND && damage) {
        /* the message of the damaged copy is the one left behind */
        return damage;
    }
    return res;
}

int kvx_st_lookup(kvx_store *s, MDB_txn *txn, const st_query *q, kvx_view *out)
{
    return st_lookup_hc(s, txn, q, out, NULL);
}

/* A get by hash alone (DESIGN.md rule 1): the one verified block holding
 * hash, KVX_EAMBIGUOUS when several do, KVX_EUNVERIFIED when only
 * unverified ones do. */
static int st_get_by_hash(kvx_store *s, MDB_txn *txn, uint64_t hash, kvx_view *out)
{
    st_query q = {hash, 0, NULL, NULL};
    MDB_val k = {8, &hash}, v;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, s->ix->hash, &cur);
    if (rc) return kvx_idx_err(rc, "open hash cursor");
    /* copies of one block (a carried or adopted duplicate) share its
     * digest: only distinct digests are distinct blocks */
    size_t verified = 0, unverified = 0, npick = 0;
    uint8_t first[KVX_DIGEST_BYTES], d[KVX_DIGEST_BYTES];
    kvx_idx_loc pick[8]; /* copies of the block, tried in order */
    rc = mdb_cursor_get(cur, &k, &v, MDB_SET);
    while (rc == 0) {
        kvx_idx_loc loc;
        uint64_t key;
        if (kvx_idx_dec_loc(&k, &v, &key, &loc)) {
            mdb_cursor_close(cur);
            return kvx_fail(KVX_ECORRUPT, "store %s: index: a record of hash %016llx is damaged (run kvx store reindex %s)",
                            s->dir, (unsigned long long)hash, s->dir);
        }
        if (st_try_loc(s, &loc, &q, NULL, NULL, d, 0) == 0) {
            int ver = !kvx_digest_is_zero(d);
            if (ver && verified == 0) {
                pick[npick++] = loc;
                memcpy(first, d, sizeof first);
                verified = 1;
            } else if (ver && memcmp(first, d, sizeof d) != 0) {
                verified++;
            } else if (ver && npick < sizeof pick / sizeof pick[0]) {
                pick[npick++] = loc; /* another copy of the same block */
            }
            unverified += !ver;
        }
        rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT_DUP);
    }
    mdb_cursor_close(cur);
    if (rc != MDB_NOTFOUND) return kvx_idx_err(rc, "walk hash records");
    if (verified > 1)
        return kvx_fail(KVX_EAMBIGUOUS, "store: %zu different verified blocks share hash %016llx (an FNV collision): give the tokens to pick one",
                        verified, (unsigned long long)hash);
    if (verified == 0 && unverified)
        return kvx_fail(KVX_EUNVERIFIED, "store: block %016llx is held only unverified (stored without its tokens)",
                        (unsigned long long)hash);
    if (verified == 0) return kvx_fail(KVX_ENOTFOUND, "store: no block with hash %016llx", (unsigned long long)hash);
    /* the first copy whose page passes its CRC; damage only if none does */
    int rc2 = KVX_ENOTFOUND;
    for (size_t i = 0; i < npick; i++) {
        rc2 = st_try_loc(s, &pick[i], &q, out, NULL, NULL, 1);
        if (rc2 != KVX_EPAGECRC && rc2 != KVX_ETRUNC && rc2 != KVX_ENOTFOUND) break;
    }
    return rc2 == KVX_ENOTFOUND
               ? kvx_fail(KVX_ENOTFOUND, "store: no block with hash %016llx", (unsigned long long)hash)
               : rc2;
}

/* Batched usage: referenced entries and last use per shard, hit/miss
 * counters; written to LMDB by the writer at flush/gc/close and by readers
 * every USE_PERSIST_CALLS calls and at close. */
uint64_t *kvx_st_rec_get(kvx_store *s, uint32_t byte, uint64_t gen, uint32_t n)
{
    st_rec *r = &s->rec[byte];
    if (r->gen == gen && r->last && r->n == n) return r->last;
    uint64_t *a = calloc((size_t)n + 1, sizeof *a);
    if (!a) return NULL;
    free(r->last);
    r->last = a;
    r->gen = gen;
    r->n = n;
    return a;
}

void kvx_st_note(kvx_store *s, const kvx_view *v, size_t n, uint64_t misses, int count)
{
    uint64_t now = n ? kvx_st_now_ns() : 0;
    int persist = 0;
    pthread_mutex_lock(&s->use_mu);
    uint64_t hits = 0;
    /* one read lock on the handle cache for the whole prompt */
    if (n) pthread_rwlock_rdlock(&s->cache_lock);
    for (size_t i = 0; i < n; i++) {
        if (!v[i].shard) continue;
        hits++;
        uint32_t b = KVX_COORD_SHARD(v[i].coordinate);
        uint64_t gen = s->cache[b].sh == v[i].shard ? s->cache[b].gen : 0;
        if (!gen) continue;
        st_use *u = &s->use[b];
        if (u->gen != gen || !u->bits) {
            uint32_t nb = kvx_shard_get_info(v[i].shard)->num_blocks;
            uint8_t *bits = calloc((nb + 7) / 8 + 1, 1);
            if (!bits) continue;
            free(u->bits);
            u->bits = bits;
            u->nbits = nb;
            u->gen = gen;
            u->hits = 0;
        }
        if (v[i].entry < u->nbits) u->bits[v[i].entry / 8] |= (uint8_t)(1u << (v[i].entry % 8));
        u->last_use = now;
        u->hits++;
        u->dirty = 1;
        if (s->writer) {
            uint64_t *last = kvx_st_rec_get(s, b, gen, u->nbits);
            if (last && v[i].entry < u->nbits) last[v[i].entry] = now;
        }
    }
    if (n) pthread_rwlock_unlock(&s->cache_lock);
    if (count) {
        s->hits += hits;
        s->misses += misses;
        if (++s->calls % USE_PERSIST_CALLS == 0 && !s->writer) persist = 1;
    }
    pthread_mutex_unlock(&s->use_mu);
    if (persist) kvx_st_usage_persist(s);
}

typedef struct st_usage_snap {
    kvx_store *s;
    st_use use[ST_SLOTS];
    uint64_t hits, misses;
} st_usage_snap;

static int st_usage_body(MDB_txn *txn, void *ctx)
{
    st_usage_snap *u = ctx;
    kvx_index *ix = u->s->ix;
    kvx_idx_stats st;
    int rc = kvx_idx_get_stats(txn, ix, &st);
    if (rc) return rc;
    st.hits += u->hits;
    st.misses += u->misses;
    if ((rc = kvx_idx_put_stats(txn, ix, &st))) return rc;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        st_use *x = &u->use[b];
        if (!x->dirty) continue;
        kvx_idx_shard rec;
        rc = kvx_idx_get_shard(txn, ix, b, &rec);
        if (rc == MDB_NOTFOUND) continue;
        if (rc) return rc;
        if (rec.gen != x->gen) continue; /* shard replaced since: drop */
        size_t nbytes = (x->nbits + 7) / 8, oldlen = 0;
        uint8_t *tmp = calloc(1, nbytes + 1), *oldbits = calloc(1, 65536 / 8 + 1);
        if (!tmp || !oldbits) {
            free(tmp);
            free(oldbits);
            return ENOMEM;
        }
        kvx_idx_usage old = {0};
        rc = kvx_idx_get_usage(txn, ix, b, &old, oldbits, 65536 / 8, &oldlen);
        if (rc == MDB_CORRUPTED || rc == MDB_NOTFOUND) {
            memset(&old, 0, sizeof old); /* usage is advisory: a damaged record starts over */
            rc = 0;
        }
        if (rc) {
            free(tmp);
            free(oldbits);
            return rc;
        }
        int same = old.gen == x->gen && old.n_bits == x->nbits && oldlen == nbytes;
        kvx_idx_usage nu = {x->gen, x->last_use > old.last_use_ns ? x->last_use : old.last_use_ns,
                            (old.gen == x->gen ? old.hits : 0) + x->hits, x->nbits, 0};
        for (size_t i = 0; i < nbytes; i++) tmp[i] = x->bits[i] | (same ? oldbits[i] : 0);
        rc = kvx_idx_put_usage(txn, ix, b, &nu, tmp, nbytes);
        free(tmp);
        free(oldbits);
        if (rc) return rc;
    }
    return 0;
}

int kvx_st_usage_persist(kvx_store *s)
{
    if (!s->ix || s->ix->rdonly_env) return 0;
    st_usage_snap *u = calloc(1, sizeof *u);
    if (!u) return -ENOMEM;
    u->s = s;
    int any = 0;
    pthread_mutex_lock(&s->use_mu);
    for (int b = 0; b < ST_SLOTS; b++) {
        st_use *x = &s->use[b];
        if (!x->dirty) continue;
        u->use[b] = *x;
        u->use[b].bits = malloc((x->nbits + 7) / 8 + 1);
        if (u->use[b].bits) memcpy(u->use[b].bits, x->bits, (x->nbits + 7) / 8);
        else u->use[b].dirty = 0;
        memset(x->bits, 0, (x->nbits + 7) / 8);
        x->dirty = 0;
        x->hits = 0;
        any = 1;
    }
    u->hits = s->hits;
    u->misses = s->misses;
    s->hits = s->misses = 0;
    pthread_mutex_unlock(&s->use_mu);
    int rc = 0;
    if (any || u->hits || u->misses) rc = kvx_idx_write(s->ix, st_usage_body, u);
    if (rc) {
        /* usage is advisory: give the counters back, drop the bits */
        pthread_mutex_lock(&s->use_mu);
        s->hits += u->hits;
        s->misses += u->misses;
        pthread_mutex_unlock(&s->use_mu);
    }
    for (int b = 0; b < ST_SLOTS; b++) free(u->use[b].bits);
    free(u);
    return rc;
}

static void st_view_clear(kvx_view *v) { memset(v, 0, sizeof *v); }

KVX_API void kvx_view_release(kvx_view *v)
{
    if (!v) return;
    kvx_shard_close(v->shard);
    st_view_clear(v);
}

KVX_API void kvx_views_release(kvx_view *views, size_t n)
{
    if (!views) return;
    for (size_t i = 0; i < n; i++) kvx_view_release(&views[i]);
}

KVX_API int kvx_store_get(kvx_view *out, kvx_store *s, uint32_t coordinate)
{
    if (!out || !s) return kvx_fail(KVX_EINVALID, "kvx_store_get: NULL argument");
    st_view_clear(out);
    MDB_txn *txn;
    int rc = kvx_idx_read_begin(s->ix, &txn);
    if (rc) return rc;
    kvx_idx_coord cv;
    rc = kvx_idx_get_coord(txn, s->ix, coordinate, &cv);
    if (rc == MDB_CORRUPTED) {
        rc = kvx_fail(KVX_ECORRUPT, "store %s: index: the record of coordinate 0x%08x is damaged (run kvx store reindex %s)",
                      s->dir, coordinate, s->dir);
    } else if (rc == 0) {
        kvx_idx_loc loc = {coordinate, 0, cv.gen};
        st_query q = {cv.hash, 0, NULL, NULL};
        rc = st_try_loc(s, &loc, &q, out, NULL, NULL, 1);
    } else if (rc == MDB_NOTFOUND || rc == 0) {
        rc = KVX_ENOTFOUND;
    } else {
        rc = kvx_idx_err(rc, "get coordinate");
    }
    kvx_idx_read_end(s->ix, txn);
    if (rc == KVX_ENOTFOUND) rc = kvx_fail(KVX_ENOTFOUND, "store: no block at coordinate 0x%08x", coordinate);
    if (rc == 0 || rc == KVX_ENOTFOUND) kvx_st_note(s, out, rc == 0, rc != 0, 1);
    return rc;
}

KVX_API int kvx_store_get_hash(kvx_view *out, kvx_store *s, uint64_t hash)
{
    if (!out || !s) return kvx_fail(KVX_EINVALID, "kvx_store_get_hash: NULL argument");
    st_view_clear(out);
    MDB_txn *txn;
    int rc = kvx_idx_read_begin(s->ix, &txn);
    if (rc) return rc;
    rc = st_get_by_hash(s, txn, hash, out);
    kvx_idx_read_end(s->ix, txn);
    if (rc == 0 || rc == KVX_ENOTFOUND) kvx_st_note(s, out, rc == 0, rc != 0, 1);
    return rc;
}

KVX_API int kvx_store_get_hashes(kvx_view *out_views, int *out_status, kvx_store *s, const uint64_t *hashes, size_t n)
{
    if (!s || (n && (!out_views || !out_status || !hashes)))
        return kvx_fail(KVX_EINVALID, "kvx_store_get_hashes: NULL argument");
    for (size_t i = 0; i < n; i++) st_view_clear(&out_views[i]);
    MDB_txn *txn;
    int rc = kvx_idx_read_begin(s->ix, &txn);
    if (rc) return rc;
    uint64_t misses = 0;
    for (size_t i = 0; i < n; i++) {
        out_status[i] = st_get_by_hash(s, txn, hashes[i], &out_views[i]);
        if (out_status[i]) misses++;
    }
    kvx_idx_read_end(s->ix, txn);
    kvx_st_note(s, out_views, n, misses, 1); /* views of misses are zeroed (shard NULL) */
    return 0;
}

KVX_API int kvx_store_prefix(kvx_view *out_views, size_t *out_n, kvx_store *s, const uint32_t *tokens, size_t n_tokens,
                             size_t max_views)
{
    if (!out_n || !s || (n_tokens && !tokens) || (max_views && !out_views))
        return kvx_fail(KVX_EINVALID, "kvx_store_prefix: NULL argument");
    *out_n = 0;
    uint32_t B = s->g.block_tokens;
    size_t nblocks = n_tokens / B;
    size_t want = nblocks < max_views ? nblocks : max_views;
    kvx_digest_ctx dc;
    int rc = want ? kvx_digest_ctx_init(&dc) : 0;
    if (rc) return rc;
    MDB_txn *txn;
    if ((rc = kvx_idx_read_begin(s->ix, &txn))) {
        if (want) kvx_digest_ctx_free(&dc);
        return rc;
    }
    uint8_t digest[2][KVX_DIGEST_BYTES];
    uint64_t parent = 0, h = want ? kvx_block_hash(0, tokens, B) : 0;
    if (want) kvx_digest_step(&dc, digest[0], NULL, tokens, B);
    size_t i = 0;
    st_hc hc = {NULL, 0, 0};
    for (; i < want; i++) {
        const uint32_t *t = tokens + i * B;
        uint8_t *d = digest[i & 1];
        /* the next block's hash and digest first: their arithmetic
         * (latency-bound chains) overlaps this block's index search
         * (load-bound) out of order */
        uint64_t next = 0;
        if (i + 1 < want) {
            next = kvx_block_hash(h, t + B, B);
            kvx_digest_step(&dc, digest[(i + 1) & 1], d, t + B, B);
        }
        st_query q = {h, parent, t, d};
        rc = st_lookup_hc(s, txn, &q, &out_views[i], &hc);
        if (rc) break;
        parent = h;
        h = next;
    }
    kvx_idx_read_end(s->ix, txn);
    kvx_shard_close(hc.sh);
    if (want) kvx_digest_ctx_free(&dc);
    if (rc && rc != KVX_ENOTFOUND && rc != KVX_EPAGECRC && rc != KVX_ETRUNC) {
        kvx_views_release(out_views, i);
        return rc;
    }
    *out_n = i;
    kvx_st_note(s, out_views, i, nblocks - i, 1);
    /* a plain miss leaves no message; damage keeps the block's (the
     * served prefix is still good: only the damaged block and what follows
     * are withheld) */
    if (rc != KVX_EPAGECRC && rc != KVX_ETRUNC) kvx_clear_error();
    return 0;
}

KVX_API int kvx_store_get_block(kvx_view *out, kvx_store *s, const uint32_t *tokens, size_t n_tokens)
{
    if (!out || !s || !tokens) return kvx_fail(KVX_EINVALID, "kvx_store_get_block: NULL argument");
    st_view_clear(out);
    uint32_t B = s->g.block_tokens;
    size_t n = n_tokens / B;
    if (n == 0) return kvx_fail(KVX_ETOKENS, "kvx_store_get_block: %zu tokens hold no full block of %u", n_tokens, B);
    uint64_t *h = malloc(n * sizeof *h);
    uint8_t(*d)[KVX_DIGEST_BYTES] = malloc(n * KVX_DIGEST_BYTES);
    if (!h || !d) {
        free(h);
        free(d);
        return kvx_fail(-ENOMEM, "store: out of memory");
    }
    kvx_block_hashes(h, tokens, n * B, B);
    kvx_prefix_digests(d, tokens, n * B, B);
    MDB_txn *txn;
    int rc = kvx_idx_read_begin(s->ix, &txn);
    if (!rc) {
        st_query q = {h[n - 1], n > 1 ? h[n - 2] : 0, tokens + (n - 1) * B, d[n - 1]};
        rc = kvx_st_lookup(s, txn, &q, out);
        kvx_idx_read_end(s->ix, txn);
        if (rc == KVX_ENOTFOUND)
            rc = kvx_fail(KVX_ENOTFOUND, "store: no verified block %016llx for these tokens (block %zu)",
                          (unsigned long long)h[n - 1], n - 1);
        if (rc == 0 || rc == KVX_ENOTFOUND) kvx_st_note(s, out, rc == 0, rc != 0, 1);
    }
    free(h);
    free(d);
    return rc;
}

KVX_API int kvx_views_export(void **out_buf, size_t *out_len, kvx_store *s, const kvx_view *views, size_t n,
                             uint16_t version)
{
    if (!out_buf || !out_len || !s || (n && !views)) return kvx_fail(KVX_EINVALID, "kvx_views_export: NULL argument");
    *out_buf = NULL;
    *out_len = 0;
    if (version != KVX_ENVELOPE_V1 && version != KVX_ENVELOPE_V2)
        return kvx_fail(KVX_EVERSION, "kvx_views_export: envelope version %u is not 1 or 2", version);
    if (n > UINT32_MAX) return kvx_fail(KVX_EINVALID, "kvx_views_export: %zu views exceed n_blocks (u32)", n);
    const kvx_geometry *g = &s->g;
    size_t P = kvx_envelope_payload_bytes(version, g), len;
    int rc = kvx_envelope_size(&len, version, g, (uint32_t)n);
    if (rc) return rc;
    /* always re-checked before an export, whatever was checked before */
    for (size_t i = 0; i < n; i++) {
        const void *page;
        if (!views[i].shard) return kvx_fail(KVX_EINVALID, "kvx_views_export: view %zu holds no block", i);
        const kvx_geometry *vg = &kvx_shard_get_info(views[i].shard)->geometry;
        if (vg->num_layers != g->num_layers || vg->kv_heads != g->kv_heads || vg->head_dim != g->head_dim ||
            vg->block_tokens != g->block_tokens || vg->quant != g->quant ||
            views[i].page_bytes != kvx_page_bytes(g, views[i].token_count))
            return kvx_fail(KVX_ESHAPE, "kvx_views_export: view %zu comes from a shard of another geometry", i);
        if (vg->model_signature != g->model_signature)
            return kvx_fail(KVX_EMODEL, "kvx_views_export: view %zu holds KV of model %016llx, this store's is %016llx", i,
                            (unsigned long long)vg->model_signature, (unsigned long long)g->model_signature);
        if ((rc = kvx_shard_page(&page, views[i].shard, views[i].entry, 1)))
            return kvx_fail(rc, "export: block %016llx (coordinate 0x%08x): %s", (unsigned long long)views[i].hash,
                            views[i].coordinate, rc == KVX_EPAGECRC ? "page CRC mismatch" : kvx_strerror(rc));
    }
    uint8_t *payloads = malloc(n * P + 1);
    kvx_envelope_block_in *bin = calloc(n + 1, sizeof *bin);
    void *buf = malloc(len);
    size_t ns = (size_t)kvx_scale_count(g);
    size_t elem_bytes = P - (version == KVX_ENVELOPE_V2 ? ns * 4 : 0);
    float *scales = malloc((n * ns + 1) * sizeof *scales);
    rc = payloads && bin && buf && scales ? 0 : kvx_fail(-ENOMEM, "export: out of memory (%zu blocks)", n);
    for (size_t i = 0; !rc && i < n; i++) {
        uint8_t *pl = payloads + i * P;
        rc = kvx_page_to_envelope_payload(pl, version, g, views[i].page, views[i].token_count, views[i].scales);
        bin[i].hash = views[i].hash;
        bin[i].n_tokens = views[i].token_count;
        bin[i].payload = pl;
        if (!rc && version == KVX_ENVELOPE_V2) {
            memcpy(scales + i * ns, pl + elem_bytes, ns * sizeof(float));
            bin[i].scales = scales + i * ns;
        }
    }
    if (!rc) rc = kvx_envelope_export(buf, len, version, g, bin, (uint32_t)n);
    free(payloads);
    free(bin);
    free(scales);
    if (rc) {
        free(buf);
        return rc;
    }
    *out_buf = buf;
    *out_len = len;
    return 0;
}

/* ------------------------------------------------------------- stat, etc */

KVX_API int kvx_store_stat(kvx_store_stats *out, kvx_store *s)
{
    if (!out || !s) return kvx_fail(KVX_EINVALID, "kvx_store_stat: NULL argument");
    memset(out, 0, sizeof *out);
    MDB_txn *txn;
    int rc = kvx_idx_read_begin(s->ix, &txn);
    if (rc) return rc;
    MDB_stat ms;
    kvx_idx_stats st;
    rc = mdb_stat(txn, s->ix->coord, &ms);
    if (!rc) rc = kvx_idx_get_stats(txn, s->ix, &st);
    MDB_cursor *cur = NULL;
    if (!rc) rc = mdb_cursor_open(txn, s->ix->shards, &cur);
    if (!rc) {
        MDB_val k, v;
        int r = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
        while (r == 0) {
            kvx_idx_shard rec;
            uint32_t b;
            if (kvx_idx_dec_shard(&k, &v, &b, &rec)) {
                rc = KVX_ECORRUPT;
                break;
            }
            out->shards++;
            out->bytes += rec.file_bytes;
            out->unverified += (rec.flags & KVX_FLAG_DIGEST) ? rec.n_unverified : rec.n_entries;
            r = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
        }
        mdb_cursor_close(cur);
    }
    kvx_idx_read_end(s->ix, txn);
    if (rc == KVX_ECORRUPT)
        return kvx_fail(rc, "store %s: index: a shard record is damaged (run kvx store reindex %s)", s->dir, s->dir);
    if (rc) return kvx_idx_err(rc, "stat");
    out->blocks = ms.ms_entries;
    out->capacity_bytes = s->capacity;
    pthread_mutex_lock(&s->use_mu);
    out->hits = st.hits + s->hits;
    out->misses = st.misses + s->misses;
    pthread_mutex_unlock(&s->use_mu);
    out->evictions = st.evictions;
    out->evicted_blocks = st.evicted_blocks;
    out->compactions = st.compactions;
    out->dropped_shards = st.dropped_shards;
    out->shard_bytes = s->target;
    out->quarantined = kvx_st_quarantine_count(s);
    pthread_mutex_lock(&s->wmu);
    out->pending_blocks = s->npend;
    pthread_mutex_unlock(&s->wmu);
    return 0;
}

/* Registered shards, read in one transaction. */
static int st_list_registered(kvx_store *s, kvx_idx_shard *reg, uint8_t *live)
{
    memset(live, 0, ST_SLOTS);
    MDB_txn *txn;
    int rc = kvx_idx_read_begin(s->ix, &txn);
    if (rc) return rc;
    MDB_cursor *cur;
    rc = mdb_cursor_open(txn, s->ix->shards, &cur);
    if (!rc) {
        MDB_val k, v;
        int r = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
        while (r == 0) {
            uint32_t b;
            kvx_idx_shard rec;
            if ((r = kvx_idx_dec_shard(&k, &v, &b, &rec))) break;
            if (b < ST_SLOTS) {
                reg[b] = rec;
                live[b] = 1;
            }
            r = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
        }
        mdb_cursor_close(cur);
        if (r != MDB_NOTFOUND) rc = r;
    }
    kvx_idx_read_end(s->ix, txn);
    if (rc == MDB_CORRUPTED)
        return kvx_fail(KVX_ECORRUPT, "store %s: index: a shard record is damaged (run kvx store reindex %s)", s->dir,
                        s->dir);
    return rc ? kvx_idx_err(rc, "list shards") : 0;
}

KVX_API int kvx_store_shards(kvx_shard ***out_shards, size_t *out_n, kvx_store *s)
{
    if (!out_shards || !out_n || !s) return kvx_fail(KVX_EINVALID, "kvx_store_shards: NULL argument");
    *out_shards = NULL;
    *out_n = 0;
    kvx_idx_shard reg[ST_SLOTS];
    uint8_t live[ST_SLOTS];
    int rc = st_list_registered(s, reg, live);
    if (rc) return rc;
    kvx_shard **arr = calloc(ST_SLOTS, sizeof *arr);
    if (!arr) return kvx_fail(-ENOMEM, "store: out of memory");
    size_t n = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!live[b]) continue;
        kvx_shard *sh = kvx_st_shard_get(s, b, reg[b].gen);
        if (sh) arr[n++] = sh;
    }
    *out_shards = arr;
    *out_n = n;
    return 0;
}

typedef struct st_verify_ctx {
    void (*report)(void *ctx, const char *what, int code);
    void *ctx;
    uint64_t bad;
    const char *shard;
} st_verify_ctx;

static void st_vreport(st_verify_ctx *v, int code, const char *fmt, ...) KVX_PRINTF(3, 4);
static void st_vreport(st_verify_ctx *v, int code, const char *fmt, ...)
{
    v->bad++;
    if (!v->report) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    v->report(v->ctx, buf, code);
}

static void st_page_report(void *ctx, uint32_t index, int code)
{
    st_verify_ctx *v = ctx;
    st_vreport(v, code, "shards/%s: entry %u: %s", v->shard, index, kvx_strerror(code));
}

typedef struct st_unreg_ctx {
    st_verify_ctx *v;
    const kvx_idx_shard *reg;
    const uint8_t *live;
} st_unreg_ctx;

static int st_verify_unregistered(kvx_store *s, int fd, const char *name, void *ctx)
{
    (void)s;
    st_unreg_ctx *c = ctx;
    uint64_t gen;
    if (!kvx_st_parse_name(name, &gen)) return 0;
    for (int b = 0; b < ST_SLOTS; b++)
        if (c->live[b] && c->reg[b].gen == gen) return 0;
    struct stat st;
    if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
    if (!S_ISREG(st.st_mode))
        st_vreport(c->v, KVX_EPATH, "shards/%s: a %s where a shard belongs (left alone)", name,
                   kvx_file_type_name(st.st_mode));
    else if (c->v->report) {
        /* a note, not damage: a crash before its publication, or a backup
         * put back; the next writer adopts it */
        char buf[400];
        snprintf(buf, sizeof buf,
                 "note: shards/%s is not in the index yet (the next writer adopts it: kvx store gc, or kvx store reindex)",
                 name);
        c->v->report(c->v->ctx, buf, 0);
    }
    return 0;
}

KVX_API int kvx_store_verify(kvx_store *s, uint64_t *out_bad, void (*report)(void *ctx, const char *what, int code),
                             void *ctx)
{
    if (!s) return kvx_fail(KVX_EINVALID, "kvx_store_verify: NULL argument");
    st_verify_ctx v = {report, ctx, 0, NULL};
    kvx_idx_shard reg[ST_SLOTS];
    uint8_t live[ST_SLOTS];
    int rc = st_list_registered(s, reg, live);
    if (rc) return rc;
    MDB_txn *txn;
    if ((rc = kvx_idx_read_begin(s->ix, &txn))) return rc;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!live[b]) continue;
        char name[32];
        kvx_st_shard_name(name, reg[b].gen);
        v.shard = name;
        /* never through a symlink (lookups refuse one too) */
        struct stat fst;
        if (fstatat(s->shardsfd, name, &fst, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(fst.st_mode)) {
            st_vreport(&v, KVX_EPATH, "shards/%s (shard %u): a symlink or not a regular file", name, b);
            continue;
        }
        char *path = st_join(s->shards_path, name);
        kvx_shard *sh = NULL;
        int r = path ? kvx_shard_open(&sh, path, 0) : -ENOMEM;
        free(path);
        if (r) {
            st_vreport(&v, r, "shards/%s (shard %u): %s", name, b, kvx_last_error());
            continue;
        }
        uint32_t nbad = 0;
        kvx_shard_verify(sh, &nbad, st_page_report, &v);
        const kvx_shard_info *in = kvx_shard_get_info(sh);
        if (in->num_blocks != reg[b].n_entries)
            st_vreport(&v, KVX_ECORRUPT, "shards/%s: %u entries, registry says %u", name, in->num_blocks, reg[b].n_entries);
        for (uint32_t i = 0; i < in->num_blocks; i++) {
            kvx_entry e;
            if (kvx_shard_entry(&e, sh, i) || !e.hash) continue;
            kvx_idx_coord cv;
            int g = kvx_idx_get_coord(txn, s->ix, e.coordinate, &cv);
            if (g == MDB_CORRUPTED)
                st_vreport(&v, KVX_ECORRUPT, "index: the record of coordinate 0x%08x is damaged (run kvx store reindex)",
                           e.coordinate);
            else if (g != 0 || cv.gen != reg[b].gen || cv.hash != e.hash)
                st_vreport(&v, KVX_ENOTFOUND, "shards/%s: entry %u (hash %016llx) is not indexed", name, i,
                           (unsigned long long)e.hash);
            if (kvx_idx_has_loc(txn, s->ix, e.hash, e.coordinate, reg[b].gen) != 1)
                st_vreport(&v, KVX_ENOTFOUND, "shards/%s: entry %u: hash %016llx has no index record", name, i,
                           (unsigned long long)e.hash);
        }
        kvx_shard_close(sh);
    }
    /* every shard file is registered: one the index does not name is not
     * served until a writer adopts it (or reindex) */
    st_unreg_ctx uc = {&v, reg, live};
    if (kvx_st_each_file(s, s->shardsfd, st_verify_unregistered, &uc)) kvx_clear_error();
    /* every index record names a registered shard */
    MDB_cursor *cur;
    if (mdb_cursor_open(txn, s->ix->coord, &cur) == 0) {
        MDB_val k, val;
        int r = mdb_cursor_get(cur, &k, &val, MDB_FIRST);
        while (r == 0) {
            uint32_t c;
            kvx_idx_coord cv;
            if (kvx_idx_dec_coord(&k, &val, &c, &cv)) {
                st_vreport(&v, KVX_ECORRUPT, "index: a coordinate record is damaged (run kvx store reindex)");
                r = mdb_cursor_get(cur, &k, &val, MDB_NEXT);
                continue;
            }
            uint32_t b = KVX_COORD_SHARD(c);
            if (!live[b] || reg[b].gen != cv.gen || KVX_COORD_BLOCK(c) >= reg[b].n_entries)
                st_vreport(&v, KVX_ECORRUPT, "index: coordinate 0x%08x names no registered shard entry", c);
            r = mdb_cursor_get(cur, &k, &val, MDB_NEXT);
        }
        mdb_cursor_close(cur);
    }
    kvx_idx_read_end(s->ix, txn);
    if (out_bad) *out_bad = v.bad;
    return v.bad ? kvx_fail(KVX_ECORRUPT, "store %s: verify found %llu problem(s)", s->dir, (unsigned long long)v.bad)
                 : 0;
}
