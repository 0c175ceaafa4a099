/*
 * catalog_edit.c - edits (catalog.h). The rule it keeps: every change to
 * the catalog is one edit applied in one write transaction, all of it or
 * nothing, and the writer's registry changes only after that transaction
 * committed. An edit is data (what to add, drop, move, count), never a
 * callback: what must be read and written in the same transaction for
 * correctness (every record of a dropped shard byte whatever its
 * generation, a usage merge, the stats counters) is an operation of the
 * edit, run here inside the transaction.
 */
#include "catalog.h"

#include "index.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------------- building */

void kvx_cat_edit_init(kvx_cat_edit *e) { memset(e, 0, sizeof *e); }

void kvx_cat_edit_free(kvx_cat_edit *e)
{
    if (!e) return;
    for (size_t i = 0; i < e->nusage; i++) free(e->usage[i].bits);
    free(e->usage);
    free(e->shards);
    free(e->del);
    free(e->add);
    memset(e, 0, sizeof *e);
}

static int ed_latch(kvx_cat_edit *e, int rc)
{
    if (!e->err) e->err = rc;
    return rc;
}

/* Room for one more element of an array of elem-byte elements. */
static int ed_room(kvx_cat_edit *e, void **arr, size_t n, size_t *cap, size_t elem)
{
    if (n < *cap) return 0;
    size_t nc = *cap ? *cap * 2 : 64;
    void *p = nc > SIZE_MAX / elem ? NULL : realloc(*arr, nc * elem);
    if (!p) return ed_latch(e, kvx_fail(-ENOMEM, "index: out of memory (building an edit)"));
    *arr = p;
    *cap = nc;
    return 0;
}

static int ed_byte_ok(kvx_cat_edit *e, uint32_t byte)
{
    if (byte < KVX_CAT_SLOTS) return 0;
    return ed_latch(e, kvx_fail(KVX_EINVALID, "index: an edit names shard byte %u (0..255)", byte));
}

void kvx_cat_edit_reset(kvx_cat_edit *e) { e->reset = 1; }

int kvx_cat_edit_put_shard(kvx_cat_edit *e, uint32_t byte, const kvx_cat_shard *rec)
{
    int rc = ed_byte_ok(e, byte);
    if (!rc) rc = ed_room(e, (void **)&e->shards, e->nshards, &e->capshards, sizeof *e->shards);
    if (rc) return rc;
    e->shards[e->nshards].byte = byte;
    e->shards[e->nshards++].rec = *rec;
    return 0;
}

void kvx_cat_edit_drop_shard(kvx_cat_edit *e, uint32_t byte)
{
    if (ed_byte_ok(e, byte)) return;
    e->drop[byte] = 1;
    e->any_drop = 1;
}

static int ed_usage(kvx_cat_edit *e, uint32_t byte, const kvx_cat_usage *hdr, const uint8_t *bits, int merge)
{
    int rc = ed_byte_ok(e, byte);
    if (!rc && hdr->n_bits > KVX_CAT_BITMAP_MAX * 8)
        rc = ed_latch(e, kvx_fail(KVX_EINVALID, "index: a usage record of %u bits (a shard holds at most 65536 entries)",
                                  hdr->n_bits));
    if (!rc) rc = ed_room(e, (void **)&e->usage, e->nusage, &e->capusage, sizeof *e->usage);
    if (rc) return rc;
    size_t nbytes = ((size_t)hdr->n_bits + 7) / 8;
    uint8_t *copy = NULL;
    if (bits || merge) {
        if (!(copy = calloc(1, nbytes + 1)))
            return ed_latch(e, kvx_fail(-ENOMEM, "index: out of memory (building an edit)"));
        if (bits) memcpy(copy, bits, nbytes);
    }
    kvx_cat_usage_put *u = &e->usage[e->nusage++];
    u->byte = byte;
    u->merge = merge;
    u->hdr = *hdr;
    u->bits = copy;
    return 0;
}

int kvx_cat_edit_put_usage(kvx_cat_edit *e, uint32_t byte, const kvx_cat_usage *hdr, const uint8_t *bits)
{
    return ed_usage(e, byte, hdr, bits, 0);
}

int kvx_cat_edit_merge_usage(kvx_cat_edit *e, uint32_t byte, const kvx_cat_usage *use, const uint8_t *bits)
{
    return ed_usage(e, byte, use, bits, 1);
}

int kvx_cat_edit_add_shard(kvx_cat_edit *e, uint32_t byte, const kvx_cat_shard *rec, uint64_t last_use_ns)
{
    kvx_cat_usage u = {rec->gen, last_use_ns, 0, rec->n_entries};
    int rc = kvx_cat_edit_put_shard(e, byte, rec);
    return rc ? rc : ed_usage(e, byte, &u, NULL, 0);
}

static int ed_block(kvx_cat_edit *e, kvx_cat_block **arr, size_t *n, size_t *cap, uint32_t coord, uint64_t hash,
                    uint64_t gen)
{
    int rc = ed_room(e, (void **)arr, *n, cap, sizeof **arr);
    if (rc) return rc;
    kvx_cat_block *b = &(*arr)[(*n)++];
    b->hash = hash;
    b->gen = gen;
    b->coord = coord;
    return 0;
}

int kvx_cat_edit_add_block(kvx_cat_edit *e, uint32_t coord, uint64_t hash, uint64_t gen)
{
    return ed_block(e, &e->add, &e->nadd, &e->capadd, coord, hash, gen);
}

int kvx_cat_edit_del_block(kvx_cat_edit *e, uint32_t coord, uint64_t hash, uint64_t gen)
{
    return ed_block(e, &e->del, &e->ndel, &e->capdel, coord, hash, gen);
}

int kvx_cat_edit_move_block(kvx_cat_edit *e, uint64_t hash, uint32_t from, uint64_t from_gen, uint32_t to,
                            uint64_t to_gen)
{
    int rc = kvx_cat_edit_del_block(e, from, hash, from_gen);
    return rc ? rc : kvx_cat_edit_add_block(e, to, hash, to_gen);
}

void kvx_cat_edit_stats(kvx_cat_edit *e, const kvx_cat_stats *delta, int count_drops)
{
    e->has_stats = 1;
    e->count_drops |= count_drops != 0;
    if (!delta) return;
    e->stats.hits += delta->hits;
    e->stats.misses += delta->misses;
    e->stats.evictions += delta->evictions;
    e->stats.evicted_blocks += delta->evicted_blocks;
    e->stats.compactions += delta->compactions;
    e->stats.dropped_shards += delta->dropped_shards;
}

void kvx_cat_edit_next_gen(kvx_cat_edit *e, uint64_t next_gen) { e->next_gen = next_gen; }
void kvx_cat_edit_next_seq(kvx_cat_edit *e, uint64_t next_seq) { e->next_seq = next_seq; }

/* --------------------------------------------------------------- applying */

typedef struct ed_run {
    kvx_index *ix;
    kvx_cat_edit *e;
    uint8_t *scratch; /* KVX_CAT_BITMAP_MAX bytes, for usage merges */
} ed_run;

/* An LMDB result inside the transaction: a full map goes back raw (the
 * write grows the map and runs the edit again); the rest becomes a kvx
 * code naming what the edit was doing. A damaged record shows here as
 * MDB_CORRUPTED (records.c), as damage LMDB itself finds does. */
static int ed_err(const kvx_index *ix, int rc, const char *what)
{
    if (rc == 0 || rc == MDB_MAP_FULL) return rc;
    if (rc == MDB_CORRUPTED)
        return kvx_idx_damaged(ix, "an edit (%s) met a damaged record (its size or CRC-32C) or page", what);
    return kvx_idx_errp(ix, rc, what);
}

static int ed_put_shard(MDB_txn *txn, kvx_index *ix, const kvx_cat_shard_put *p)
{
    kvx_idx_shard r = {p->rec.gen, p->rec.file_bytes, p->rec.created_ns, p->rec.n_entries, p->rec.flags, 0,
                       p->rec.n_unverified, p->rec.ino};
    return kvx_idx_put_shard(txn, ix, p->byte, &r);
}

/* Drops every record of shard byte b; *n gets the blocks removed. */
static int ed_drop(MDB_txn *txn, kvx_index *ix, uint32_t b, uint64_t *n)
{
    int rc = kvx_idx_del_shard_blocks(txn, ix, b, n);
    if (rc) return rc;
    MDB_val k = {4, &b};
    rc = mdb_del(txn, ix->shards, &k, NULL);
    if (rc && rc != MDB_NOTFOUND) return rc;
    rc = mdb_del(txn, ix->usage, &k, NULL);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

/* A usage merge (kvx_cat_edit_merge_usage): 0, skipped or written. */
static int ed_merge(MDB_txn *txn, kvx_index *ix, const kvx_cat_usage_put *u, uint8_t *scratch)
{
    uint32_t b = u->byte;
    kvx_idx_shard rec;
    int rc = kvx_idx_get_shard(txn, ix, b, &rec);
    if (rc == MDB_NOTFOUND) return 0;
    if (rc) return rc;
    if (rec.gen != u->hdr.gen) return 0; /* the shard was replaced since */
    MDB_val k = {4, &b}, v;
    kvx_idx_usage old;
    memset(&old, 0, sizeof old);
    const uint8_t *oldbits = NULL;
    rc = mdb_get(txn, ix->usage, &k, &v);
    if (rc && rc != MDB_NOTFOUND) return rc; /* LMDB failed: not a damaged record */
    uint32_t kb;
    if (rc == 0 && kvx_idx_dec_usage(&k, &v, &kb, &old) == 0)
        oldbits = (const uint8_t *)v.mv_data + sizeof old;
    else
        memset(&old, 0, sizeof old); /* absent, or damaged: usage is advisory, it starts over */
    size_t nbytes = ((size_t)u->hdr.n_bits + 7) / 8;
    int same = oldbits && old.gen == u->hdr.gen && old.n_bits == u->hdr.n_bits;
    kvx_idx_usage nu = {u->hdr.gen, u->hdr.last_use_ns > old.last_use_ns ? u->hdr.last_use_ns : old.last_use_ns,
                        (old.gen == u->hdr.gen ? old.hits : 0) + u->hdr.hits, u->hdr.n_bits, 0};
    for (size_t i = 0; i < nbytes; i++) scratch[i] = u->bits[i] | (same ? oldbits[i] : 0);
    return kvx_idx_put_usage(txn, ix, b, &nu, scratch, nbytes);
}

static int ed_reset(MDB_txn *txn, kvx_index *ix)
{
    MDB_dbi dbs[5] = {ix->coord, ix->hash, ix->shards, ix->usage, ix->meta};
    for (int i = 0; i < 5; i++) {
        int rc = mdb_drop(txn, dbs[i], 0);
        if (rc) return rc;
    }
    return 0;
}

static int ed_stats(MDB_txn *txn, kvx_index *ix, const kvx_cat_edit *e)
{
    kvx_idx_stats st;
    int rc = kvx_idx_get_stats(txn, ix, &st);
    if (rc) return rc;
    st.hits += e->stats.hits;
    st.misses += e->stats.misses;
    st.evictions += e->stats.evictions;
    st.evicted_blocks += e->stats.evicted_blocks + (e->count_drops ? e->out.dropped_blocks : 0);
    st.compactions += e->stats.compactions;
    st.dropped_shards += e->stats.dropped_shards;
    return kvx_idx_put_stats(txn, ix, &st);
}

/* The edit's transaction body, in the order catalog.h gives. It may run
 * more than once (a full map grows and runs it again): it starts over. */
static int ed_body(MDB_txn *txn, void *p)
{
    ed_run *r = p;
    kvx_index *ix = r->ix;
    kvx_cat_edit *e = r->e;
    int rc;
    e->out.dropped_blocks = 0;
    if (e->reset && (rc = ed_reset(txn, ix))) return ed_err(ix, rc, "empty the catalog");
    for (size_t i = 0; i < e->ndel; i++)
        if ((rc = kvx_idx_del_block(txn, ix, e->del[i].coord, e->del[i].hash, e->del[i].gen)))
            return ed_err(ix, rc, "remove a block");
    for (uint32_t b = 0; e->any_drop && b < KVX_CAT_SLOTS; b++) {
        uint64_t n = 0;
        if (e->drop[b] && (rc = ed_drop(txn, ix, b, &n))) return ed_err(ix, rc, "drop a shard");
        e->out.dropped_blocks += n;
    }
    for (size_t i = 0; i < e->nshards; i++)
        if ((rc = ed_put_shard(txn, ix, &e->shards[i]))) return ed_err(ix, rc, "put a shard record");
    for (int merge = 0; merge < 2; merge++) {
        for (size_t i = 0; i < e->nusage; i++) {
            const kvx_cat_usage_put *u = &e->usage[i];
            if (u->merge != merge) continue;
            if (merge) {
                rc = ed_merge(txn, ix, u, r->scratch);
            } else {
                kvx_idx_usage h = {u->hdr.gen, u->hdr.last_use_ns, u->hdr.hits, u->hdr.n_bits, 0};
                rc = kvx_idx_put_usage(txn, ix, u->byte, &h, u->bits, ((size_t)u->hdr.n_bits + 7) / 8);
            }
            if (rc) return ed_err(ix, rc, merge ? "merge a usage record" : "put a usage record");
        }
    }
    for (size_t i = 0; i < e->nadd; i++)
        if ((rc = kvx_idx_add_block(txn, ix, e->add[i].coord, e->add[i].hash, e->add[i].gen)))
            return ed_err(ix, rc, "add a block");
    if ((e->has_stats || e->count_drops) && (rc = ed_stats(txn, ix, e))) return ed_err(ix, rc, "count");
    if (e->next_gen && (rc = kvx_idx_put_u64(txn, ix->meta, "next_gen", e->next_gen)))
        return ed_err(ix, rc, "put next_gen");
    if (e->next_seq && (rc = kvx_idx_put_u64(txn, ix->meta, "next_seq", e->next_seq)))
        return ed_err(ix, rc, "put next_seq");
    return 0;
}

static int ed_empty(const kvx_cat_edit *e)
{
    return !e->reset && !e->any_drop && !e->ndel && !e->nadd && !e->nshards && !e->nusage && !e->has_stats &&
           !e->count_drops && !e->next_gen && !e->next_seq;
}

/* After the commit: the registry names what the catalog now names. */
static void ed_registry(kvx_cat_registry *reg, const kvx_cat_edit *e)
{
    if (e->reset) memset(reg, 0, sizeof *reg);
    for (uint32_t b = 0; e->any_drop && b < KVX_CAT_SLOTS; b++)
        if (e->drop[b]) reg->live[b] = 0;
    for (size_t i = 0; i < e->nshards; i++) {
        /* field by field over a zeroed record: the caller's padding bytes
         * never reach the registry, so it equals one read back byte for byte */
        const kvx_cat_shard *src = &e->shards[i].rec;
        kvx_cat_shard *dst = &reg->rec[e->shards[i].byte];
        memset(dst, 0, sizeof *dst);
        dst->gen = src->gen;
        dst->file_bytes = src->file_bytes;
        dst->created_ns = src->created_ns;
        dst->n_entries = src->n_entries;
        dst->flags = src->flags;
        dst->n_unverified = src->n_unverified;
        dst->ino = src->ino;
        reg->live[e->shards[i].byte] = 1;
    }
    if (e->next_gen) reg->next_gen = e->next_gen;
    if (e->next_seq) reg->next_seq = e->next_seq;
}

int kvx_cat_apply(kvx_catalog *cat, kvx_cat_edit *e)
{
    if (e->err) return e->err;
    e->out.dropped_blocks = 0;
    if (ed_empty(e)) return 0;
    ed_run r = {kvx_cat_index(cat), e, NULL};
    for (size_t i = 0; i < e->nusage && !r.scratch; i++)
        if (e->usage[i].merge && !(r.scratch = malloc(KVX_CAT_BITMAP_MAX)))
            return kvx_fail(-ENOMEM, "index: out of memory (applying an edit)");
    int rc = kvx_idx_write(r.ix, ed_body, &r);
    free(r.scratch);
    if (rc) {
        e->out.dropped_blocks = 0;
        return rc;
    }
    ed_registry(kvx_cat_registry_mut(cat), e);
    return 0;
}
