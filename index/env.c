/*
 * env.c - the LMDB environment under the catalog. The rule it keeps: one
 * environment per directory and process, and no transaction of it outlives
 * a resize of its map. Every write transaction (body and commit) runs
 * under the mapping guard; every environment is checked (check.c) before
 * anything reads it.
 *
 * A registry keyed by the directory and its data.mdb shares environments
 * between handles; pools of renewable read transactions and of idle
 * snapshots (a reset transaction and a cursor each) make reads cheap
 * without thread-local storage; write transactions survive MDB_MAP_FULL
 * by growing the map; the stale check tells a handle its data.mdb was
 * replaced by reindex. Its own file calls (stat, fstat) go through the OS
 * seam; LMDB's I/O does not (common/os.h says why). See index.h.
 */
#include "index.h"

#include "common/os.h"
#include "common/sigbus.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

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

/* ----------------------------------------------------------------- guard */

/* Registers the LMDB map with the mapping guard, or follows it to where
 * mdb_env_set_mapsize moved it. Best effort: without a slot (all taken)
 * or a base, the index works unguarded. */
static void idx_guard_map(kvx_index *ix)
{
    MDB_envinfo info;
    const uint8_t *base = NULL;
    if (mdb_env_info(ix->env, &info) != 0 || kvx_idx_map_base(ix, &base) != 0) {
        kvx_sigbus_unregister(ix->guard_slot);
        ix->guard_slot = -1;
        return;
    }
    if (ix->guard_slot >= 0) {
        kvx_sigbus_move(ix->guard_slot, base, info.me_mapsize);
        return;
    }
    if (kvx_sigbus_register_catalog(&ix->guard_slot, base, info.me_mapsize) != 0) {
        ix->guard_slot = -1;
        kvx_clear_error();
    }
}

/* LMDB's assertion callback: it aborts after it returns, so a guarded
 * body that meets one (a damaged page) is abandoned instead. */
static void idx_assert(MDB_env *env, const char *msg)
{
    (void)env;
    (void)msg;
    kvx_sigbus_bail();
}

typedef struct idx_guarded {
    MDB_txn *txn;
    kvx_idx_body body;
    void *ctx;
} idx_guarded;

static int idx_guarded_run(void *p)
{
    idx_guarded *g = p;
    return g->body(g->txn, g->ctx);
}

int kvx_idx_guard(kvx_index *ix, MDB_txn *txn, kvx_idx_body body, void *ctx)
{
    idx_guarded g = {txn, body, ctx};
    int faulted = 0;
    int rc = kvx_sigbus_run(idx_guarded_run, &g, &faulted);
    if (faulted)
        return kvx_idx_damaged(ix, "a read faulted inside the LMDB map (the file is damaged or was truncated)");
    return rc;
}

/* ------------------------------------------------------------------ open */

typedef struct idx_dbs_ctx {
    kvx_index *ix;
    unsigned create;
} idx_dbs_ctx;

static int idx_open_dbs_body(MDB_txn *txn, void *p)
{
    idx_dbs_ctx *c = p;
    kvx_index *ix = c->ix;
    int rc;
    if ((rc = mdb_dbi_open(txn, "meta", c->create, &ix->meta)) ||
        (rc = mdb_dbi_open(txn, "shards", c->create | MDB_INTEGERKEY, &ix->shards)) ||
        (rc = mdb_dbi_open(txn, "coord", c->create | MDB_INTEGERKEY, &ix->coord)) ||
        (rc = mdb_dbi_open(txn, "hash", c->create | MDB_INTEGERKEY | MDB_DUPSORT | MDB_DUPFIXED, &ix->hash)) ||
        (rc = mdb_dbi_open(txn, "usage", c->create | MDB_INTEGERKEY, &ix->usage)))
        return rc;
    return 0;
}

static int idx_open_dbs(kvx_index *ix, int create)
{
    MDB_txn *txn;
    int rc = mdb_txn_begin(ix->env, NULL, create ? 0 : MDB_RDONLY, &txn);
    if (rc) return kvx_idx_errp(ix, rc, "begin (open databases)");
    idx_dbs_ctx c = {ix, create ? MDB_CREATE : 0};
    rc = kvx_idx_guard(ix, txn, idx_open_dbs_body, &c);
    if (rc) {
        mdb_txn_abort(txn);
        if (rc == MDB_NOTFOUND)
            return kvx_idx_damaged(ix, "the kvx databases are missing");
        return kvx_idx_errp(ix, rc, create ? "create databases" : "open databases");
    }
    rc = mdb_txn_commit(txn);
    return rc ? kvx_idx_errp(ix, rc, "commit (open databases)") : 0;
}

/* The store directory named in messages: path's parent. */
static char *idx_parent(const char *path)
{
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--;
    size_t cut = n;
    while (cut > 0 && path[cut - 1] != '/') cut--;
    if (cut == 0) return strdup(".");
    while (cut > 1 && path[cut - 1] == '/') cut--;
    char *d = malloc(cut + 1);
    if (!d) return NULL;
    memcpy(d, path, cut);
    d[cut] = '\0';
    return d;
}

/* One environment opened with flags: 0 or an LMDB code / errno (the
 * environment is closed again on failure, as LMDB requires: a failed
 * mdb_env_open leaves it unusable for another open). */
static int idx_env_open(kvx_index *ix, const char *path, unsigned flags)
{
    int rc = mdb_env_create(&ix->env);
    if (rc) {
        ix->env = NULL;
        return rc;
    }
    mdb_env_set_assert(ix->env, idx_assert);
    mdb_env_set_maxdbs(ix->env, IDX_MAX_DBS);
    mdb_env_set_maxreaders(ix->env, IDX_MAX_READERS);
    size_t map = IDX_INITIAL_MAP;
    const char *env_map = getenv("KVX_INDEX_MAP_BYTES"); /* tests: start small to exercise growth */
    if (env_map && strtoull(env_map, NULL, 10) >= 65536) map = (size_t)strtoull(env_map, NULL, 10);
    mdb_env_set_mapsize(ix->env, map);
    rc = mdb_env_open(ix->env, path, flags, 0600);
    if (rc) {
        mdb_env_close(ix->env);
        ix->env = NULL;
    }
    return rc;
}

static void idx_snap_drop_txn(kvx_cat_snap *snap);
static void idx_snap_destroy(kvx_cat_snap *snap);

/* The walk of the tree (check.c) in a snapshot of its own, again when
 * commits rewrote the snapshot's meta page meanwhile. */
static int idx_check_tree(kvx_index *ix)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        MDB_txn *txn;
        int again = 0;
        int rc = kvx_idx_read_begin(ix, &txn);
        if (rc) return rc;
        rc = kvx_idx_walk(ix, txn, &again);
        kvx_idx_read_end(ix, txn);
        if (!again) return rc;
    }
    return kvx_fail(KVX_EBUSY, "index %s/data.mdb: a writer kept committing while it was checked", ix->path);
}

/* Idle read transactions and snapshots let go of their transactions (the
 * map is about to be resized, or the environment closed). Under pool_mu. */
static void idx_pool_flush(kvx_index *ix)
{
    for (int i = 0; i < ix->npool; i++) mdb_txn_abort(ix->pool[i]);
    ix->npool = 0;
    for (int i = 0; i < ix->nsnaps; i++) idx_snap_drop_txn(ix->snaps[i]);
}

static void idx_free(kvx_index *ix)
{
    if (!ix) return;
    idx_pool_flush(ix);
    for (int i = 0; i < ix->nsnaps; i++) idx_snap_destroy(ix->snaps[i]);
    ix->nsnaps = 0;
    kvx_sigbus_unregister(ix->guard_slot);
    if (ix->env) mdb_env_close(ix->env);
    pthread_rwlock_destroy(&ix->resize);
    pthread_mutex_destroy(&ix->pool_mu);
    free(ix->path);
    free(ix->store);
    free(ix);
}

/* The environment of directory path and its data.mdb this process holds
 * already (a reference more), or NULL. Under registry_mu. */
static kvx_index *idx_registered(const struct stat *dir, const struct stat *db)
{
    for (kvx_index *p = registry; p; p = p->next) {
        /* the same directory and the same data.mdb: a replaced index (or a
         * directory inode reused after one was removed) gets its own env */
        if (p->dev == dir->st_dev && p->ino == dir->st_ino && db && p->db_dev == db->st_dev &&
            p->db_ino == db->st_ino) {
            p->refs++;
            return p;
        }
    }
    return NULL;
}

/* A new environment for path (registry_mu held): checked, opened (with
 * the read-only fallbacks), walked, its databases opened, guarded. */
static int idx_open_new(kvx_index *ix, const char *path, int create, int nosync)
{
    int rc;
    if (!ix->path || !ix->store) return kvx_fail(-ENOMEM, "index: out of memory");
    /* DESIGN.md rule 4: the meta pages are checked before LMDB trusts them */
    if ((rc = kvx_idx_check_file(path, ix->store, create))) return rc;
    unsigned flags = MDB_NOTLS | (nosync ? MDB_NOSYNC : 0);
    ix->nosync = nosync != 0;
    rc = idx_env_open(ix, path, flags);
    if ((rc == EACCES || rc == EROFS || rc == EPERM) && !create) {
        /* a reader without write permission (or on a read-only mount):
         * no usage records, still reads (rule 3). A fresh environment,
         * first with the lock file (still writable?), then without. */
        ix->rdonly_env = 1;
        rc = idx_env_open(ix, path, flags | MDB_RDONLY);
        if (rc == EACCES || rc == EROFS || rc == EPERM) {
            ix->nolock = 1;
            rc = idx_env_open(ix, path, flags | MDB_RDONLY | MDB_NOLOCK);
        }
    }
    if (rc) return kvx_idx_errp(ix, rc, "open environment");
    if (!ix->nolock) {
        int dead = 0;
        mdb_reader_check(ix->env, &dead); /* clear slots of dead processes */
    }
    int envfd = -1;
    struct stat est;
    if (mdb_env_get_fd(ix->env, &envfd) == 0 && envfd >= 0 && kvx_os.fstat(envfd, &est) == 0) {
        ix->db_dev = est.st_dev;
        ix->db_ino = est.st_ino;
    }
    if ((rc = idx_check_tree(ix))) return rc;
    if ((rc = idx_open_dbs(ix, create && !ix->rdonly_env))) return rc;
    idx_guard_map(ix);
    return 0;
}

/* MDB_NOSYNC on or off for the shared environment, changed while
 * holding LMDB's writer lock (a write transaction, aborted), so no commit
 * of another thread reads the flag half way (LMDB reads it at the data
 * sync and again at the meta write). registry_mu held. */
static void idx_adopt_size(kvx_index *ix);

static int idx_set_nosync(kvx_index *ix, int on, const char *what)
{
    int e = 0;
    for (int attempt = 0; !ix->rdonly_env && attempt < 8; attempt++) {
        pthread_rwlock_rdlock(&ix->resize);
        MDB_txn *txn = NULL;
        e = mdb_txn_begin(ix->env, NULL, 0, &txn);
        if (!e) {
            e = mdb_env_set_flags(ix->env, MDB_NOSYNC, on ? 1 : 0);
            mdb_txn_abort(txn);
        }
        pthread_rwlock_unlock(&ix->resize);
        if (e != MDB_MAP_RESIZED) break;
        idx_adopt_size(ix); /* another process grew the map */
    }
    return e ? kvx_idx_errp(ix, e, what) : 0;
}

int kvx_idx_lag(kvx_index *ix, int on)
{
    pthread_mutex_lock(&registry_mu);
    int rc = 0;
    if (ix->rdonly_env) {
        rc = kvx_fail(-EROFS, "index %s: read-only", ix->path);
    } else if (on && !ix->lag) {
        rc = ix->nosync ? 0 : idx_set_nosync(ix, 1, "stop syncing each commit");
        if (!rc) ix->lag = 1;
    } else if (!on && ix->lag) {
        /* syncing again first, so no commit after this sync is unsynced */
        rc = ix->nosync ? 0 : idx_set_nosync(ix, 0, "turn syncing back on");
        if (!rc) ix->lag = 0;
    }
    if (!rc && !on) {
        pthread_rwlock_rdlock(&ix->resize);
        int e = mdb_env_sync(ix->env, 1);
        pthread_rwlock_unlock(&ix->resize);
        if (e) rc = kvx_idx_errp(ix, e, "sync");
    }
    pthread_mutex_unlock(&registry_mu);
    return rc;
}

int kvx_idx_open(kvx_index **out, const char *path, int create, int nosync)
{
    *out = NULL;
    pthread_once(&atfork_once, idx_atfork_setup);
    struct stat st, dbst;
    if (kvx_os.fstatat(AT_FDCWD, path, &st, 0) != 0)
        return kvx_fail(-errno, "index: stat %s: %s", path, strerror(errno));
    char dbpath[4200];
    snprintf(dbpath, sizeof dbpath, "%s/data.mdb", path);
    int have_db = kvx_os.fstatat(AT_FDCWD, dbpath, &dbst, 0) == 0;
    pthread_mutex_lock(&registry_mu);
    kvx_index *ix = idx_registered(&st, have_db ? &dbst : NULL);
    if (ix && !nosync && ix->nosync && !ix->lag) {
        /* an earlier handle asked for NOSYNC, this one did not: the shared
         * environment syncs from now on, or this handle would acknowledge
         * commits a power cut takes back */
        int rc = idx_set_nosync(ix, 0, "turn syncing back on");
        if (rc) {
            ix->refs--; /* the message names the index before our reference goes */
            pthread_mutex_unlock(&registry_mu);
            return rc;
        }
        ix->nosync = 0;
    }
    if (ix) {
        pthread_mutex_unlock(&registry_mu);
        *out = ix;
        return 0;
    }
    if (!(ix = calloc(1, sizeof *ix))) {
        pthread_mutex_unlock(&registry_mu);
        return kvx_fail(-ENOMEM, "index: out of memory");
    }
    pthread_rwlock_init(&ix->resize, NULL);
    pthread_mutex_init(&ix->pool_mu, NULL);
    ix->dev = st.st_dev;
    ix->ino = st.st_ino;
    ix->refs = 1;
    ix->guard_slot = -1;
    ix->path = strdup(path);
    ix->store = idx_parent(path);
    int rc = idx_open_new(ix, path, create, nosync);
    if (rc) {
        idx_free(ix);
        pthread_mutex_unlock(&registry_mu);
        return rc;
    }
    ix->next = registry;
    registry = ix;
    pthread_mutex_unlock(&registry_mu);
    *out = ix;
    return 0;
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
    idx_free(ix);
}

/* ------------------------------------------------------------------ reads */

/* Adopts a map grown by another process. Called without the read side. */
static void idx_adopt_size(kvx_index *ix)
{
    pthread_rwlock_wrlock(&ix->resize);
    pthread_mutex_lock(&ix->pool_mu);
    idx_pool_flush(ix);
    pthread_mutex_unlock(&ix->pool_mu);
    mdb_env_set_mapsize(ix->env, 0);
    idx_guard_map(ix);
    pthread_rwlock_unlock(&ix->resize);
}

static int idx_poisoned(kvx_index *ix)
{
    if (!kvx_sigbus_poisoned(ix->guard_slot)) return 0;
    return kvx_idx_damaged(ix, "an unguarded read faulted inside the LMDB map earlier (the file is damaged or was "
                               "truncated); this process no longer trusts it");
}

/* Has index/data.mdb been replaced (kvx_store_reindex_dir) since this
 * environment opened it? Checked at most every 100 ms (one stat). A stat
 * that fails for another reason than a missing file is that error, and
 * the next call checks again. */
static int idx_stale(kvx_index *ix)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    int64_t now = (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
    if (now < ix->next_check_ns || !ix->db_ino) return 0;
    ix->next_check_ns = now + 100000000;
    char dbpath[4200];
    struct stat st;
    snprintf(dbpath, sizeof dbpath, "%s/data.mdb", ix->path);
    int gone = kvx_os.fstatat(AT_FDCWD, dbpath, &st, 0) != 0;
    if (gone && errno != ENOENT) {
        int e = errno;
        ix->next_check_ns = 0;
        return kvx_fail(-e, "index %s: stat: %s", dbpath, strerror(e));
    }
    if (gone || st.st_dev != ix->db_dev || st.st_ino != ix->db_ino) {
        ix->next_check_ns = 0; /* stays stale: every later call says so */
        return kvx_fail(KVX_ESTALE, "store %s: the index was rebuilt (kvx store reindex) since this handle opened it: "
                                    "close the store and open it again",
                        ix->store);
    }
    return 0;
}

static int idx_usable(kvx_index *ix)
{
    int rc = idx_poisoned(ix);
    return rc ? rc : idx_stale(ix);
}

/* Begins a read transaction with the resize lock's read side held on
 * success (released by idx_txn_release). slot, called under that read
 * side (so no resize can pass between), names where the transaction lives:
 * a reset one it holds is renewed, else a new one begun there; NULL means
 * out of memory. The slot may be called again on a retry. */
typedef MDB_txn **(*idx_slot_fn)(kvx_index *ix, void *ctx);

static int idx_txn_acquire(kvx_index *ix, idx_slot_fn slot, void *ctx)
{
    for (int attempt = 0; attempt < 4; attempt++) {
        pthread_rwlock_rdlock(&ix->resize);
        /* taken from a pool under the read side: a resize (write side)
         * aborts every pooled transaction, so none outlives one */
        MDB_txn **io_txn = slot(ix, ctx);
        if (!io_txn) {
            pthread_rwlock_unlock(&ix->resize);
            return kvx_fail(-ENOMEM, "index: out of memory");
        }
        MDB_txn *txn = *io_txn;
        int rc;
        if (txn) {
            rc = mdb_txn_renew(txn);
            if (rc) {
                mdb_txn_abort(txn);
                *io_txn = NULL;
            }
        } else {
            rc = mdb_txn_begin(ix->env, NULL, MDB_RDONLY, &txn);
            if (rc == 0) *io_txn = txn;
        }
        if (rc == 0) return 0;
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
        return kvx_idx_errp(ix, rc, "begin read transaction");
    }
    return kvx_fail(KVX_EBUSY, "index: begin read transaction: map keeps being resized");
}

/* The slot of kvx_idx_read_begin: a pooled transaction, or none. */
static MDB_txn **idx_pool_slot(kvx_index *ix, void *ctx)
{
    MDB_txn **t = ctx;
    if (*t) return t; /* a retry: the one in hand */
    pthread_mutex_lock(&ix->pool_mu);
    if (ix->npool > 0) *t = ix->pool[--ix->npool];
    pthread_mutex_unlock(&ix->pool_mu);
    return t;
}

int kvx_idx_read_begin(kvx_index *ix, MDB_txn **out)
{
    int rc = idx_usable(ix);
    if (rc) return rc;
    MDB_txn *txn = NULL;
    if ((rc = idx_txn_acquire(ix, idx_pool_slot, &txn))) return rc;
    *out = txn;
    return 0;
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

int kvx_idx_read(kvx_index *ix, kvx_idx_body body, void *ctx)
{
    MDB_txn *txn;
    int rc = kvx_idx_read_begin(ix, &txn);
    if (rc) return rc;
    rc = kvx_idx_guard(ix, txn, body, ctx);
    kvx_idx_read_end(ix, txn);
    return rc ? kvx_idx_errp(ix, rc, "read") : 0;
}

/* -------------------------------------------------------------- snapshots */

static void idx_snap_drop_txn(kvx_cat_snap *snap)
{
    if (snap->txn) mdb_txn_abort(snap->txn);
    snap->txn = NULL;
    snap->hcur_ready = 0;
}

static void idx_snap_destroy(kvx_cat_snap *snap)
{
    if (!snap) return;
    /* a read-only cursor outlives its transaction; it is closed on its own */
    if (snap->hcur) mdb_cursor_close(snap->hcur);
    if (snap->txn) mdb_txn_abort(snap->txn);
    free(snap);
}

typedef struct idx_snap_ctx {
    kvx_cat_snap *snap;
} idx_snap_ctx;

/* Under the resize lock's read side: an idle snapshot (or a new one). */
static MDB_txn **idx_snap_slot(kvx_index *ix, void *p)
{
    idx_snap_ctx *c = p;
    if (!c->snap) {
        pthread_mutex_lock(&ix->pool_mu);
        if (ix->nsnaps > 0) c->snap = ix->snaps[--ix->nsnaps];
        pthread_mutex_unlock(&ix->pool_mu);
    }
    if (!c->snap && (c->snap = calloc(1, sizeof *c->snap))) c->snap->ix = ix;
    return c->snap ? &c->snap->txn : NULL;
}

/* Back to the pool (its transaction reset, or gone), or freed. */
static void idx_snap_idle(kvx_index *ix, kvx_cat_snap *snap)
{
    if (!snap) return;
    pthread_mutex_lock(&ix->pool_mu);
    if (ix->nsnaps < (int)(sizeof ix->snaps / sizeof ix->snaps[0])) {
        ix->snaps[ix->nsnaps++] = snap;
        snap = NULL;
    }
    pthread_mutex_unlock(&ix->pool_mu);
    idx_snap_destroy(snap);
}

int kvx_idx_snap_begin(kvx_index *ix, kvx_cat_snap **out)
{
    *out = NULL;
    int rc = idx_usable(ix);
    if (rc) return rc;
    idx_snap_ctx c = {NULL};
    if ((rc = idx_txn_acquire(ix, idx_snap_slot, &c))) {
        idx_snap_idle(ix, c.snap);
        return rc;
    }
    c.snap->hcur_ready = 0;
    c.snap->pos_ok = 0;
    *out = c.snap;
    return 0;
}

void kvx_idx_snap_end(kvx_cat_snap *snap)
{
    kvx_index *ix = snap->ix;
    mdb_txn_reset(snap->txn);
    snap->hcur_ready = 0;
    idx_snap_idle(ix, snap);
    pthread_rwlock_unlock(&ix->resize);
}

/* ----------------------------------------------------------------- writes */

/* Doubles the map; needs no transaction of this process to be live, hence
 * the write side of the resize lock. */
static int idx_grow(kvx_index *ix)
{
    pthread_rwlock_wrlock(&ix->resize);
    pthread_mutex_lock(&ix->pool_mu);
    idx_pool_flush(ix);
    pthread_mutex_unlock(&ix->pool_mu);
    MDB_envinfo info;
    mdb_env_info(ix->env, &info);
    size_t next = info.me_mapsize * 2;
    int rc = mdb_env_set_mapsize(ix->env, next);
    idx_guard_map(ix);
    pthread_rwlock_unlock(&ix->resize);
    return rc ? kvx_idx_errp(ix, rc, "grow map") : 0;
}

typedef struct idx_wctx {
    kvx_idx_body body;
    void *ctx;
    int commit_rc;
} idx_wctx;

int (*kvx_idx_commit_fault)(void);

static int idx_write_run(MDB_txn *txn, void *p)
{
    idx_wctx *w = p;
    int rc = w->body(txn, w->ctx);
    if (rc) return rc;
    int fault = kvx_idx_commit_fault ? kvx_idx_commit_fault() : 0;
    if (fault) {
        mdb_txn_abort(txn); /* what a failed mdb_txn_commit leaves: nothing of it */
        w->commit_rc = fault;
        return 0;
    }
    w->commit_rc = mdb_txn_commit(txn);
    return 0;
}

static int idx_write(kvx_index *ix, kvx_idx_body body, void *ctx);

/* LMDB answers a page write that comes up short with EIO (mdb_page_flush),
 * which is what a full file system gives it: with under IDX_FULL_BYTES
 * free where the index lives, a commit's EIO is reported as ENOSPC, the
 * code a full disk gets everywhere else (the CLI's hint, kvxd's
 * RESOURCE_EXHAUSTED), its message saying both. */
#define IDX_FULL_BYTES ((uint64_t)4 << 20)
static int idx_commit_err(const kvx_index *ix, int c)
{
    struct statvfs vs;
    if (c == EIO && ix->path && kvx_os.statvfs(ix->path, &vs) == 0) {
        uint64_t avail = (uint64_t)vs.f_bavail * vs.f_frsize;
        if (avail < IDX_FULL_BYTES)
            return kvx_fail(-ENOSPC,
                            "index %s/data.mdb: commit: No space left on device (LMDB's write came up short, "
                            "EIO, with %llu KiB free on its file system)",
                            ix->path, (unsigned long long)(avail >> 10));
    }
    return kvx_idx_errp(ix, c, "commit");
}

/* write_bytes of /proc/thread-self/io (0 when it cannot be read). */
static uint64_t idx_thread_write_bytes(void)
{
    char buf[512];
    int fd = open("/proc/thread-self/io", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    const char *p = strstr(buf, "\nwrite_bytes: ");
    return p ? strtoull(p + 14, NULL, 10) : 0;
}

int kvx_idx_write(kvx_index *ix, kvx_idx_body body, void *ctx)
{
    if (!ix->count_io) return idx_write(ix, body, ctx);
    uint64_t before = idx_thread_write_bytes();
    int rc = idx_write(ix, body, ctx);
    ix->wrote += idx_thread_write_bytes() - before;
    return rc;
}

static int idx_write(kvx_index *ix, kvx_idx_body body, void *ctx)
{
    if (ix->rdonly_env) return kvx_fail(-EROFS, "index: opened read-only (no write permission)");
    int rc = idx_poisoned(ix);
    if (rc) return rc;
    for (int attempt = 0; attempt < 40; attempt++) {
        pthread_rwlock_rdlock(&ix->resize);
        MDB_txn *txn;
        rc = mdb_txn_begin(ix->env, NULL, 0, &txn);
        if (rc == 0) {
            idx_wctx w = {body, ctx, 0};
            idx_guarded g = {txn, idx_write_run, &w};
            int faulted = 0;
            rc = kvx_sigbus_run(idx_guarded_run, &g, &faulted);
            if (faulted) {
                /* abandoned inside LMDB (body or commit): the txn is still
                 * whole (a fault comes from reading the map, before commit
                 * frees anything), so abort releases it and the writer lock */
                mdb_txn_abort(txn);
                pthread_rwlock_unlock(&ix->resize);
                return kvx_idx_damaged(ix, "a write transaction faulted inside the LMDB map (the file is damaged or "
                                           "was truncated)");
            }
            if (rc == 0) {
                int c = w.commit_rc;
                pthread_rwlock_unlock(&ix->resize);
                if (c == 0) return 0;
                if (c == MDB_MAP_FULL) {
                    if ((rc = idx_grow(ix))) return rc;
                    continue;
                }
                return idx_commit_err(ix, c);
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
        return rc > 0 || (rc >= MDB_KEYEXIST && rc <= MDB_LAST_ERRCODE) ? kvx_idx_errp(ix, rc, "write transaction")
                                                                        : rc;
    }
    return kvx_fail(KVX_ECAPACITY, "index: map could not be grown enough");
}
