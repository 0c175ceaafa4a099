/*
 * index.c - the store's LMDB layer: one shared environment per directory
 * and process, a pool of renewable read transactions (cheap lookups without
 * thread-local storage), write transactions that survive MDB_MAP_FULL by
 * growing the map, and the few record helpers the store needs.
 * See index.h for the databases and their records.
 */
#include "index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define IDX_INITIAL_MAP ((size_t)64 << 20)
#define IDX_MAX_DBS 8
#define IDX_MAX_READERS 510

static pthread_mutex_t registry_mu = PTHREAD_MUTEX_INITIALIZER;
static kvx_index *registry;
static pthread_once_t atfork_once = PTHREAD_ONCE_INIT;

/* A forked child must not reuse its parent's environments (LMDB forbids
 * it): forget them there (they leak in the child, by design). */
static void idx_atfork_child(void) { registry = NULL; pthread_mutex_init(&registry_mu, NULL); }
static void idx_atfork_setup(void) { pthread_atfork(NULL, NULL, idx_atfork_child); }

int kvx_idx_err(int rc, const char *what)
{
    if (rc == 0) return 0;
    if (rc > 0) return kvx_fail(-rc, "index: %s: %s", what, mdb_strerror(rc));
    switch (rc) {
    case MDB_NOTFOUND: return kvx_fail(KVX_ENOTFOUND, "index: %s: not found", what);
    case MDB_VERSION_MISMATCH:
    case MDB_INVALID: return kvx_fail(KVX_EVERSION, "index: %s: %s", what, mdb_strerror(rc));
    case MDB_MAP_FULL: return kvx_fail(KVX_ECAPACITY, "index: %s: %s", what, mdb_strerror(rc));
    case MDB_READERS_FULL: return kvx_fail(KVX_EBUSY, "index: %s: %s", what, mdb_strerror(rc));
    default: return kvx_fail(KVX_ECORRUPT, "index: %s: %s", what, mdb_strerror(rc));
    }
}

static int idx_open_dbs(kvx_index *ix, int create)
{
    MDB_txn *txn;
    int rc = mdb_txn_begin(ix->env, NULL, create ? 0 : MDB_RDONLY, &txn);
    if (rc) return kvx_idx_err(rc, "begin (open databases)");
    unsigned c = create ? MDB_CREATE : 0;
    if ((rc = mdb_dbi_open(txn, "meta", c, &ix->meta)) ||
        (rc = mdb_dbi_open(txn, "shards", c | MDB_INTEGERKEY, &ix->shards)) ||
        (rc = mdb_dbi_open(txn, "coord", c | MDB_INTEGERKEY, &ix->coord)) ||
        (rc = mdb_dbi_open(txn, "hash", c | MDB_INTEGERKEY | MDB_DUPSORT | MDB_DUPFIXED, &ix->hash)) ||
        (rc = mdb_dbi_open(txn, "usage", c | MDB_INTEGERKEY, &ix->usage))) {
        mdb_txn_abort(txn);
        return kvx_idx_err(rc, create ? "create databases" : "open databases (index/ lacks the kvx databases)");
    }
    rc = mdb_txn_commit(txn);
    return rc ? kvx_idx_err(rc, "commit (open databases)") : 0;
}

int kvx_idx_open(kvx_index **out, const char *path, int create, int nosync)
{
    *out = NULL;
    pthread_once(&atfork_once, idx_atfork_setup);
    struct stat st;
    if (stat(path, &st) != 0) return kvx_fail(-errno, "index: stat %s: %s", path, strerror(errno));
    pthread_mutex_lock(&registry_mu);
    for (kvx_index *p = registry; p; p = p->next) {
        if (p->dev == st.st_dev && p->ino == st.st_ino) {
            p->refs++;
            pthread_mutex_unlock(&registry_mu);
            *out = p;
            return 0;
        }
    }
    kvx_index *ix = calloc(1, sizeof *ix);
    if (!ix) {
        pthread_mutex_unlock(&registry_mu);
        return kvx_fail(-ENOMEM, "index: out of memory");
    }
    pthread_rwlock_init(&ix->resize, NULL);
    pthread_mutex_init(&ix->pool_mu, NULL);
    ix->dev = st.st_dev;
    ix->ino = st.st_ino;
    ix->refs = 1;
    int rc = mdb_env_create(&ix->env);
    if (rc) goto fail_mdb;
    mdb_env_set_maxdbs(ix->env, IDX_MAX_DBS);
    mdb_env_set_maxreaders(ix->env, IDX_MAX_READERS);
    size_t map = IDX_INITIAL_MAP;
    const char *env_map = getenv("KVX_INDEX_MAP_BYTES"); /* tests: start small to exercise growth */
    if (env_map && strtoull(env_map, NULL, 10) >= 65536) map = (size_t)strtoull(env_map, NULL, 10);
    mdb_env_set_mapsize(ix->env, map);
    unsigned flags = MDB_NOTLS | (nosync ? MDB_NOSYNC : 0);
    rc = mdb_env_open(ix->env, path, flags, 0600);
    if (rc == EACCES || rc == EROFS) {
        /* a reader without write permission: no usage records, still reads */
        if (create) goto fail_mdb;
        rc = mdb_env_open(ix->env, path, flags | MDB_RDONLY, 0600);
        ix->rdonly_env = 1;
    }
    if (rc) goto fail_mdb;
    int dead = 0;
    mdb_reader_check(ix->env, &dead); /* clear slots of dead processes */
    rc = idx_open_dbs(ix, create && !ix->rdonly_env);
    if (rc) {
        mdb_env_close(ix->env);
        free(ix);
        pthread_mutex_unlock(&registry_mu);
        return rc;
    }
    ix->next = registry;
    registry = ix;
    pthread_mutex_unlock(&registry_mu);
    *out = ix;
    return 0;
fail_mdb:;
    int r = kvx_idx_err(rc, "open environment");
    if (ix->env) mdb_env_close(ix->env);
    free(ix);
    pthread_mutex_unlock(&registry_mu);
    return r;
}

void kvx_idx_close(kvx_index *ix)
{
    if (!ix) return;
    pthread_mutex_lock(&registry_mu);
    if (--ix->refs > 0) {
        pthread_mutex_unlock(&registry_mu);
        return;
    }
    for (kvx_index **pp = &registry; *pp; pp = &(*pp)->next) {
        if (*pp == ix) {
            *pp = ix->next;
            break;
        }
    }
    pthread_mutex_unlock(&registry_mu);
    for (int i = 0; i < ix->npool; i++) mdb_txn_abort(ix->pool[i]);
    mdb_env_close(ix->env);
    pthread_rwlock_destroy(&ix->resize);
    pthread_mutex_destroy(&ix->pool_mu);
    free(ix);
}

/* Adopts a map grown by another process. Called without the read side. */
static void idx_adopt_size(kvx_index *ix)
{
    pthread_rwlock_wrlock(&ix->resize);
    pthread_mutex_lock(&ix->pool_mu);
    for (int i = 0; i < ix->npool; i++) mdb_txn_abort(ix->pool[i]);
    ix->npool = 0;
    pthread_mutex_unlock(&ix->pool_mu);
    mdb_env_set_mapsize(ix->env, 0);
    pthread_rwlock_unlock(&ix->resize);
}

int kvx_idx_read_begin(kvx_index *ix, MDB_txn **out)
{
    for (int attempt = 0; attempt < 4; attempt++) {
        pthread_rwlock_rdlock(&ix->resize);
        MDB_txn *txn = NULL;
        pthread_mutex_lock(&ix->pool_mu);
        if (ix->npool > 0) txn = ix->pool[--ix->npool];
        pthread_mutex_unlock(&ix->pool_mu);
        int rc;
        if (txn) {
            rc = mdb_txn_renew(txn);
            if (rc) {
                mdb_txn_abort(txn);
                txn = NULL;
            }
        } else {
            rc = mdb_txn_begin(ix->env, NULL, MDB_RDONLY, &txn);
        }
        if (rc == 0) {
            *out = txn;
            return 0;
        }
        pthread_rwlock_unlock(&ix->resize);
        if (rc == MDB_MAP_RESIZED) {
            idx_adopt_size(ix);
            continue;
        }
        if (rc == MDB_READERS_FULL) {
            int dead = 0;
            mdb_reader_check(ix->env, &dead);
            if (dead > 0) continue;
        }
        return kvx_idx_err(rc, "begin read transaction");
    }
    return kvx_fail(KVX_EBUSY, "index: begin read transaction: map keeps being resized");
}

void kvx_idx_read_end(kvx_index *ix, MDB_txn *txn)
{
    mdb_txn_reset(txn);
    pthread_mutex_lock(&ix->pool_mu);
    if (ix->npool < (int)(sizeof ix->pool / sizeof ix->pool[0])) {
        ix->pool[ix->npool++] = txn;
        txn = NULL;
    }
    pthread_mutex_unlock(&ix->pool_mu);
    if (txn) mdb_txn_abort(txn);
    pthread_rwlock_unlock(&ix->resize);
}

/* Doubles the map; needs no transaction of this process to be live, hence
 * the write side of the resize lock. */
static int idx_grow(kvx_index *ix)
{
    pthread_rwlock_wrlock(&ix->resize);
    pthread_mutex_lock(&ix->pool_mu);
    for (int i = 0; i < ix->npool; i++) mdb_txn_abort(ix->pool[i]);
    ix->npool = 0;
    pthread_mutex_unlock(&ix->pool_mu);
    MDB_envinfo info;
    mdb_env_info(ix->env, &info);
    size_t next = info.me_mapsize * 2;
    int rc = mdb_env_set_mapsize(ix->env, next);
    pthread_rwlock_unlock(&ix->resize);
    return rc ? kvx_idx_err(rc, "grow map") : 0;
}

int kvx_idx_write(kvx_index *ix, kvx_idx_body body, void *ctx)
{
    if (ix->rdonly_env) return kvx_fail(-EROFS, "index: opened read-only (no write permission)");
    for (int attempt = 0; attempt < 40; attempt++) {
        pthread_rwlock_rdlock(&ix->resize);
        MDB_txn *txn;
        int rc = mdb_txn_begin(ix->env, NULL, 0, &txn);
        if (rc == 0) {
            rc = body(txn, ctx);
            if (rc == 0) {
                int c = mdb_txn_commit(txn);
                pthread_rwlock_unlock(&ix->resize);
                if (c == 0) return 0;
                if (c == MDB_MAP_FULL) {
                    if ((rc = idx_grow(ix))) return rc;
                    continue;
                }
                return kvx_idx_err(c, "commit");
            }
            mdb_txn_abort(txn);
        }
        pthread_rwlock_unlock(&ix->resize);
        if (rc == MDB_MAP_FULL || rc == KVX_ECAPACITY) {
            int g = idx_grow(ix);
            if (g) return g;
            continue;
        }
        if (rc == MDB_MAP_RESIZED) {
            idx_adopt_size(ix);
            continue;
        }
        return rc > 0 || (rc >= MDB_KEYEXIST && rc <= MDB_LAST_ERRCODE) ? kvx_idx_err(rc, "write transaction") : rc;
    }
    return kvx_fail(KVX_ECAPACITY, "index: map could not be grown enough");
}

int kvx_idx_get_u64(MDB_txn *txn, MDB_dbi dbi, const char *key, uint64_t *out)
{
    MDB_val k = {strlen(key), (void *)key}, v;
    int rc = mdb_get(txn, dbi, &k, &v);
    *out = 0;
    if (rc == MDB_NOTFOUND) return 0;
    if (rc) return rc;
    if (v.mv_size != 8) return MDB_CORRUPTED;
    memcpy(out, v.mv_data, 8);
    return 0;
}

int kvx_idx_put_u64(MDB_txn *txn, MDB_dbi dbi, const char *key, uint64_t v)
{
    MDB_val k = {strlen(key), (void *)key}, d = {8, &v};
    return mdb_put(txn, dbi, &k, &d, 0);
}

int kvx_idx_get_stats(MDB_txn *txn, kvx_index *ix, kvx_idx_stats *out)
{
    MDB_val k = {5, "stats"}, v;
    memset(out, 0, sizeof *out);
    int rc = mdb_get(txn, ix->meta, &k, &v);
    if (rc == MDB_NOTFOUND) return 0;
    if (rc) return rc;
    memcpy(out, v.mv_data, v.mv_size < sizeof *out ? v.mv_size : sizeof *out);
    return 0;
}

int kvx_idx_put_stats(MDB_txn *txn, kvx_index *ix, const kvx_idx_stats *st)
{
    MDB_val k = {5, "stats"}, v = {sizeof *st, (void *)st};
    return mdb_put(txn, ix->meta, &k, &v, 0);
}

int kvx_idx_add_block(MDB_txn *txn, kvx_index *ix, uint32_t coord, uint64_t hash, uint64_t gen)
{
    kvx_idx_coord cv = {hash, gen};
    MDB_val k = {4, &coord}, v = {sizeof cv, &cv};
    int rc = mdb_put(txn, ix->coord, &k, &v, 0);
    if (rc) return rc;
    kvx_idx_loc loc = {coord, 0, gen};
    MDB_val hk = {8, &hash}, hv = {sizeof loc, &loc};
    rc = mdb_put(txn, ix->hash, &hk, &hv, MDB_NODUPDATA);
    return rc == MDB_KEYEXIST ? 0 : rc;
}

int kvx_idx_del_block(MDB_txn *txn, kvx_index *ix, uint32_t coord, uint64_t hash, uint64_t gen)
{
    MDB_val k = {4, &coord}, v;
    int rc = mdb_get(txn, ix->coord, &k, &v);
    if (rc == 0 && v.mv_size == sizeof(kvx_idx_coord)) {
        kvx_idx_coord cv;
        memcpy(&cv, v.mv_data, sizeof cv);
        if (cv.gen == gen) {
            rc = mdb_del(txn, ix->coord, &k, NULL);
            if (rc) return rc;
        }
    } else if (rc && rc != MDB_NOTFOUND) {
        return rc;
    }
    kvx_idx_loc loc = {coord, 0, gen};
    MDB_val hk = {8, &hash}, hv = {sizeof loc, &loc};
    rc = mdb_del(txn, ix->hash, &hk, &hv);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

int kvx_idx_del_shard_blocks(MDB_txn *txn, kvx_index *ix, uint32_t b, uint64_t *out_removed)
{
    MDB_cursor *cur;
    uint64_t n = 0;
    int rc = mdb_cursor_open(txn, ix->coord, &cur);
    if (rc) return rc;
    uint32_t first = b << 24;
    MDB_val k = {4, &first}, v;
    rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
    while (rc == 0) {
        uint32_t c;
        memcpy(&c, k.mv_data, 4);
        if ((c >> 24) != b) break;
        kvx_idx_coord cv;
        memcpy(&cv, v.mv_data, sizeof cv);
        kvx_idx_loc loc = {c, 0, cv.gen};
        MDB_val hk = {8, &cv.hash}, hv = {sizeof loc, &loc};
        int r = mdb_del(txn, ix->hash, &hk, &hv);
        if (r && r != MDB_NOTFOUND) {
            rc = r;
            break;
        }
        if ((r = mdb_cursor_del(cur, 0))) {
            rc = r;
            break;
        }
        n++;
        k.mv_size = 4; /* re-seek: simplest correct walk over a shrinking range */
        k.mv_data = &first;
        rc = mdb_cursor_get(cur, &k, &v, MDB_SET_RANGE);
    }
    mdb_cursor_close(cur);
    if (out_removed) *out_removed = n;
    return rc == MDB_NOTFOUND ? 0 : rc;
}
