/*
 * catalog.c - the catalog handle, its registry, and read snapshots
 * (catalog.h). The rule it keeps: a read answers what the catalog holds or
 * says why it cannot. A record is checked (size, CRC-32C) before any of it
 * is used, a damaged one is KVX_ECORRUPT naming reindex, an LMDB failure
 * is its kvx error; only a record that is not there is KVX_ENOTFOUND.
 *
 * Snapshots come from a pool of the environment (env.c): each keeps its
 * reset read transaction and a cursor on the hash database between uses,
 * so a prompt's lookup allocates nothing once the pool is warm, and
 * location 0 of a hash is one mdb_get, as a bare LMDB loop would do.
 * Snapshot reads run unguarded, like every lookup before them: a fault in
 * the map falls back to a zero page and poisons it (index.h, 5.).
 */
#include "catalog.h"

#include "index.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvx_catalog {
    kvx_index *ix;
    kvx_cat_registry reg;
};

/* ---------------------------------------------------------------- handle */

int kvx_cat_open(kvx_catalog **out, const char *path, int create, int nosync)
{
    *out = NULL;
    kvx_catalog *cat = calloc(1, sizeof *cat);
    if (!cat) return kvx_fail(-ENOMEM, "index: out of memory");
    int rc = kvx_idx_open(&cat->ix, path, create, nosync);
    if (rc) {
        free(cat);
        return rc;
    }
    *out = cat;
    return 0;
}

void kvx_cat_close(kvx_catalog *cat)
{
    if (!cat) return;
    kvx_idx_close(cat->ix);
    free(cat);
}

int kvx_cat_readonly(const kvx_catalog *cat) { return cat->ix->rdonly_env; }

int kvx_cat_lag(kvx_catalog *cat, int on) { return kvx_idx_lag(cat->ix, on); }

int kvx_cat_check_file(const char *path, const char *store_dir, int create)
{
    return kvx_idx_check_file(path, store_dir, create);
}

kvx_index *kvx_cat_index(const kvx_catalog *cat) { return cat->ix; }

const kvx_cat_registry *kvx_cat_registry_get(const kvx_catalog *cat) { return &cat->reg; }

kvx_cat_registry *kvx_cat_registry_mut(kvx_catalog *cat) { return &cat->reg; }

int kvx_cat_registry_load(kvx_catalog *cat)
{
    kvx_cat_snap *snap;
    int rc = kvx_cat_snap_begin(cat, &snap);
    if (rc) return rc;
    kvx_cat_registry *reg = malloc(sizeof *reg);
    rc = reg ? kvx_cat_registry_read(snap, reg) : kvx_fail(-ENOMEM, "index: out of memory");
    kvx_cat_snap_end(snap);
    if (!rc) cat->reg = *reg;
    free(reg);
    return rc;
}

/* ------------------------------------------------------------- messages */

static int cat_damaged(const kvx_index *ix, const char *fmt, ...) KVX_PRINTF(2, 3);
static int cat_damaged(const kvx_index *ix, const char *fmt, ...)
{
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kvx_idx_damaged(ix, "the record of %s is damaged (its size or CRC-32C)", what);
}

static int cat_lmdb(const kvx_index *ix, int rc, const char *fmt, ...) KVX_PRINTF(3, 4);
static int cat_lmdb(const kvx_index *ix, int rc, const char *fmt, ...)
{
    char what[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return kvx_idx_errp(ix, rc, what);
}

/* ------------------------------------------------------------- snapshots */

int kvx_cat_snap_begin(kvx_catalog *cat, kvx_cat_snap **out) { return kvx_idx_snap_begin(cat->ix, out); }

void kvx_cat_snap_end(kvx_cat_snap *snap)
{
    if (snap) kvx_idx_snap_end(snap);
}

/* The snapshot's hash cursor, bound to its transaction. */
static int cat_hcur(kvx_cat_snap *snap, MDB_cursor **out)
{
    if (!snap->hcur_ready) {
        int rc = snap->hcur ? mdb_cursor_renew(snap->txn, snap->hcur) : EINVAL;
        if (rc) {
            if (snap->hcur) mdb_cursor_close(snap->hcur);
            snap->hcur = NULL;
            if ((rc = mdb_cursor_open(snap->txn, snap->ix->hash, &snap->hcur)))
                return cat_lmdb(snap->ix, rc, "open a hash cursor");
        }
        snap->hcur_ready = 1;
        snap->pos_ok = 0;
    }
    *out = snap->hcur;
    return 0;
}

/* ------------------------------------------------------------------ reads */

static void cat_shard_from(kvx_cat_shard *out, const kvx_idx_shard *r)
{
    out->gen = r->gen;
    out->file_bytes = r->file_bytes;
    out->created_ns = r->created_ns;
    out->n_entries = r->n_entries;
    out->flags = r->flags;
    out->n_unverified = r->n_unverified;
    out->ino = r->ino;
}

int kvx_cat_shard_get(kvx_cat_snap *snap, uint32_t byte, kvx_cat_shard *out)
{
    kvx_idx_shard r;
    int rc = kvx_idx_get_shard(snap->txn, snap->ix, byte, &r);
    if (rc == MDB_NOTFOUND) return KVX_ENOTFOUND;
    if (rc == MDB_CORRUPTED) return cat_damaged(snap->ix, "shard %u", byte);
    if (rc) return cat_lmdb(snap->ix, rc, "get the record of shard %u", byte);
    cat_shard_from(out, &r);
    return 0;
}

int kvx_cat_coord_get(kvx_cat_snap *snap, uint32_t coord, kvx_cat_coord *out)
{
    kvx_idx_coord r;
    int rc = kvx_idx_get_coord(snap->txn, snap->ix, coord, &r);
    if (rc == MDB_NOTFOUND) return KVX_ENOTFOUND;
    if (rc == MDB_CORRUPTED) return cat_damaged(snap->ix, "coordinate 0x%08x", coord);
    if (rc) return cat_lmdb(snap->ix, rc, "get the record of coordinate 0x%08x", coord);
    out->hash = r.hash;
    out->gen = r.gen;
    return 0;
}

static int cat_loc_out(kvx_cat_snap *snap, uint64_t hash, const MDB_val *k, const MDB_val *v, kvx_cat_loc *out)
{
    kvx_idx_loc loc;
    uint64_t key;
    if (kvx_idx_dec_loc(k, v, &key, &loc) || key != hash)
        return cat_damaged(snap->ix, "hash %016llx", (unsigned long long)hash);
    out->coord = loc.coord;
    out->gen = loc.gen;
    return 0;
}

int kvx_cat_loc_at(kvx_cat_snap *snap, uint64_t hash, size_t i, kvx_cat_loc *out)
{
    MDB_val k = {8, &hash}, v;
    int rc;
    if (i == 0) { /* the hot path: one search, no cursor */
        rc = mdb_get(snap->txn, snap->ix->hash, &k, &v);
        if (rc == MDB_NOTFOUND) return KVX_ENOTFOUND;
        if (rc) return cat_lmdb(snap->ix, rc, "get hash %016llx", (unsigned long long)hash);
        return cat_loc_out(snap, hash, &k, &v, out);
    }
    MDB_cursor *cur = NULL;
    if ((rc = cat_hcur(snap, &cur))) return rc;
    if (snap->pos_ok && snap->pos_hash == hash && snap->pos_i + 1 == i) {
        rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT_DUP);
    } else {
        rc = mdb_cursor_get(cur, &k, &v, MDB_SET_KEY);
        for (size_t j = 0; rc == 0 && j < i; j++) rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT_DUP);
    }
    snap->pos_ok = rc == 0;
    snap->pos_hash = hash;
    snap->pos_i = i;
    if (rc == MDB_NOTFOUND) return KVX_ENOTFOUND;
    if (rc) return cat_lmdb(snap->ix, rc, "walk the locations of hash %016llx", (unsigned long long)hash);
    return cat_loc_out(snap, hash, &k, &v, out);
}

int kvx_cat_has_loc(kvx_cat_snap *snap, uint64_t hash, uint32_t coord, uint64_t gen)
{
    MDB_cursor *cur = NULL;
    int rc = cat_hcur(snap, &cur);
    if (rc) return rc;
    snap->pos_ok = 0;
    rc = kvx_idx_has_loc_cur(cur, hash, coord, gen);
    if (rc < 0 || rc > 1) return cat_lmdb(snap->ix, rc, "find a location of hash %016llx", (unsigned long long)hash);
    if (rc == 1) return 1;
    /* not there as asked: unless a location of the hash is damaged (it
     * could be this one), which is not "absent" */
    MDB_val k = {8, &hash}, v;
    kvx_cat_loc l;
    rc = mdb_cursor_get(cur, &k, &v, MDB_SET_KEY);
    while (rc == 0) {
        int bad = cat_loc_out(snap, hash, &k, &v, &l);
        if (bad) return bad;
        rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT_DUP);
    }
    if (rc != MDB_NOTFOUND) return cat_lmdb(snap->ix, rc, "walk the locations of hash %016llx", (unsigned long long)hash);
    return 0;
}

int kvx_cat_usage_get(kvx_cat_snap *snap, uint32_t byte, kvx_cat_usage *out, uint8_t *bits, size_t bits_cap,
                      size_t *out_bits_len)
{
    kvx_idx_usage u;
    size_t n = 0;
    int rc = kvx_idx_get_usage(snap->txn, snap->ix, byte, &u, bits, bits_cap, &n);
    if (rc == MDB_NOTFOUND) return KVX_ENOTFOUND;
    if (rc == MDB_CORRUPTED) return cat_damaged(snap->ix, "the usage of shard %u", byte);
    if (rc) return cat_lmdb(snap->ix, rc, "get the usage of shard %u", byte);
    out->gen = u.gen;
    out->last_use_ns = u.last_use_ns;
    out->hits = u.hits;
    out->n_bits = u.n_bits;
    if (out_bits_len) *out_bits_len = n;
    return 0;
}

int kvx_cat_stats_get(kvx_cat_snap *snap, kvx_cat_stats *out)
{
    kvx_idx_stats st;
    int rc = kvx_idx_get_stats(snap->txn, snap->ix, &st);
    if (rc == MDB_CORRUPTED) return cat_damaged(snap->ix, "stats");
    if (rc) return cat_lmdb(snap->ix, rc, "get the stats");
    memcpy(out, &st, sizeof *out);
    return 0;
}

int kvx_cat_next_gen(kvx_cat_snap *snap, uint64_t *out)
{
    int rc = kvx_idx_get_u64(snap->txn, snap->ix->meta, "next_gen", out);
    if (rc == MDB_CORRUPTED) return cat_damaged(snap->ix, "next_gen");
    if (rc) return cat_lmdb(snap->ix, rc, "get next_gen");
    return 0;
}

int kvx_cat_registry_read(kvx_cat_snap *snap, kvx_cat_registry *out)
{
    memset(out, 0, sizeof *out);
    MDB_cursor *cur;
    int rc = mdb_cursor_open(snap->txn, snap->ix->shards, &cur);
    if (rc) return cat_lmdb(snap->ix, rc, "open a shard cursor");
    MDB_val k, v;
    rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
    while (rc == 0) {
        uint32_t b = UINT32_MAX;
        kvx_idx_shard r;
        if (kvx_idx_dec_shard(&k, &v, &b, &r) || b >= KVX_CAT_SLOTS) {
            if (k.mv_size == 4) memcpy(&b, k.mv_data, 4);
            mdb_cursor_close(cur);
            if (b < KVX_CAT_SLOTS) return cat_damaged(snap->ix, "shard %u", b);
            return cat_damaged(snap->ix, "a shard (a %zu-byte key, not a shard byte)", k.mv_size);
        }
        cat_shard_from(&out->rec[b], &r);
        out->live[b] = 1;
        rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
    }
    mdb_cursor_close(cur);
    if (rc != MDB_NOTFOUND) return cat_lmdb(snap->ix, rc, "walk the shard records");
    rc = kvx_cat_next_gen(snap, &out->next_gen);
    if (rc) return rc;
    rc = kvx_idx_get_u64(snap->txn, snap->ix->meta, "next_seq", &out->next_seq);
    if (rc == MDB_CORRUPTED) return cat_damaged(snap->ix, "next_seq");
    if (rc) return cat_lmdb(snap->ix, rc, "get next_seq");
    return 0;
}

int kvx_cat_counts_get(kvx_cat_snap *snap, kvx_cat_counts *out)
{
    MDB_stat c, h, s;
    int rc = mdb_stat(snap->txn, snap->ix->coord, &c);
    if (!rc) rc = mdb_stat(snap->txn, snap->ix->hash, &h);
    if (!rc) rc = mdb_stat(snap->txn, snap->ix->shards, &s);
    if (rc) return cat_lmdb(snap->ix, rc, "count records");
    out->blocks = c.ms_entries;
    out->locations = h.ms_entries;
    out->shards = s.ms_entries;
    return 0;
}

int kvx_cat_blocks_each(kvx_cat_snap *snap, uint32_t byte, kvx_cat_block_fn fn, void *ctx)
{
    MDB_cursor *cur;
    int rc = mdb_cursor_open(snap->txn, snap->ix->coord, &cur);
    if (rc) return cat_lmdb(snap->ix, rc, "open a coordinate cursor");
    uint32_t first = byte == KVX_CAT_ALL ? 0 : byte << 24;
    MDB_val k = {4, &first}, v;
    rc = mdb_cursor_get(cur, &k, &v, byte == KVX_CAT_ALL ? MDB_FIRST : MDB_SET_RANGE);
    int res = 0;
    while (rc == 0) {
        uint32_t c = 0;
        kvx_idx_coord r;
        kvx_cat_coord rec;
        int bad = kvx_idx_dec_coord(&k, &v, &c, &r);
        if (bad && k.mv_size == 4) memcpy(&c, k.mv_data, 4);
        if (byte != KVX_CAT_ALL && (c >> 24) != byte) break;
        if (bad) {
            res = cat_damaged(snap->ix, "coordinate 0x%08x", c);
            res = fn(ctx, c, NULL, res);
        } else {
            rec.hash = r.hash;
            rec.gen = r.gen;
            res = fn(ctx, c, &rec, 0);
        }
        if (res) break;
        rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
    }
    mdb_cursor_close(cur);
    if (res) return res;
    if (rc != 0 && rc != MDB_NOTFOUND) return cat_lmdb(snap->ix, rc, "walk the coordinate records");
    return 0;
}
