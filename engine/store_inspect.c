/*
 * store_inspect.c - stat, the live shard list, and verify.
 *
 * Rule: verify reports every problem it finds (a file, a page, a record)
 * and changes nothing; a note that is not a problem (a valid shard the
 * index does not name yet) comes with code 0.
 */
#include "store.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>

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
        char *path = kvx_st_join(s->shards_path, name);
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
