/*
 * catalog.c - the catalog (index/catalog.c, catalog_edit.c, records.c) on
 * its own, below the store: reads and locations; an edit is all or
 * nothing; a drop removes every record of its shard byte; reset, usage
 * merges, a damaged record of each kind is KVX_ECORRUPT naming reindex; a
 * read-only catalog refuses edits; the map grows; the store-v1 fixture's
 * records read through it; the snapshot pool.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <grp.h>
#include <lmdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "index/catalog.h"
#include "lib/store.h"

/* A fresh, empty catalog directory. */
static void new_dir(char *out, size_t n)
{
    snprintf(out, n, "%s/cat%d", su_root, su_dir_counter++);
    assert_int_equal(mkdir(out, 0700), 0);
}

static kvx_catalog *open_cat(const char *dir, int create)
{
    kvx_catalog *cat = NULL;
    int rc = kvx_cat_open(&cat, dir, create, 1);
    if (rc) fail_msg("kvx_cat_open %s: %d %s", dir, rc, kvx_last_error());
    return cat;
}

static kvx_cat_shard shard_rec(uint64_t gen, uint32_t n)
{
    kvx_cat_shard r = {gen, 4096u * (n + 1), 1000 + gen, n, 0x13, 0, 0};
    return r;
}

static void apply_ok(kvx_catalog *cat, kvx_cat_edit *e)
{
    int rc = kvx_cat_apply(cat, e);
    if (rc) fail_msg("kvx_cat_apply: %d %s", rc, kvx_last_error());
    kvx_cat_edit_free(e);
}

/* Adds shard byte b of generation gen with n blocks (coordinate b.i, hash
 * hash_of(b, i)), and next_gen. */
static uint64_t hash_of(uint32_t b, uint32_t i) { return su_mix(((uint64_t)b << 32) | i) | 1; }

static void add_shard(kvx_catalog *cat, uint32_t b, uint64_t gen, uint32_t n)
{
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    kvx_cat_shard r = shard_rec(gen, n);
    assert_int_equal(kvx_cat_edit_add_shard(&e, b, &r, 7777), 0);
    for (uint32_t i = 0; i < n; i++) assert_int_equal(kvx_cat_edit_add_block(&e, (b << 24) | (i << 8), hash_of(b, i), gen), 0);
    kvx_cat_edit_next_gen(&e, gen + 1);
    apply_ok(cat, &e);
}

/* Everything a reader can see, as one comparable summary. */
typedef struct view {
    kvx_cat_registry reg;
    kvx_cat_counts counts;
    kvx_cat_stats stats;
    uint64_t coord_sum; /* of every coordinate record: coord, hash, gen */
    uint64_t nblocks;
} view;

static int sum_block(void *ctx, uint32_t coord, const kvx_cat_coord *rec, int damaged)
{
    view *v = ctx;
    if (damaged) return damaged;
    v->coord_sum += su_mix(coord ^ su_mix(rec->hash ^ su_mix(rec->gen)));
    v->nblocks++;
    return 0;
}

static void read_view(kvx_catalog *cat, view *out)
{
    memset(out, 0, sizeof *out);
    kvx_cat_snap *snap;
    assert_int_equal(kvx_cat_snap_begin(cat, &snap), 0);
    assert_int_equal(kvx_cat_registry_read(snap, &out->reg), 0);
    assert_int_equal(kvx_cat_counts_get(snap, &out->counts), 0);
    assert_int_equal(kvx_cat_stats_get(snap, &out->stats), 0);
    assert_int_equal(kvx_cat_blocks_each(snap, KVX_CAT_ALL, sum_block, out), 0);
    kvx_cat_snap_end(snap);
}

static void assert_view_equal(const view *a, const view *b)
{
    assert_memory_equal(&a->reg, &b->reg, sizeof a->reg);
    assert_memory_equal(&a->counts, &b->counts, sizeof a->counts);
    assert_memory_equal(&a->stats, &b->stats, sizeof a->stats);
    assert_true(a->coord_sum == b->coord_sum);
    assert_true(a->nblocks == b->nblocks);
}

/* The first record (or the one under key) of database dbname, one byte of
 * its value flipped at offset off, through LMDB itself: damage only the
 * record's own CRC-32C notices. The catalog must be closed. */
static void corrupt_record(const char *dir, const char *dbname, unsigned flags, const void *key, size_t klen,
                           size_t off)
{
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    MDB_cursor *cur;
    MDB_val k = {klen, (void *)key}, v;
    assert_int_equal(mdb_env_create(&env), 0);
    assert_int_equal(mdb_env_set_maxdbs(env, 16), 0);
    assert_int_equal(mdb_env_open(env, dir, 0, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, dbname, flags, &dbi), 0);
    assert_int_equal(mdb_cursor_open(txn, dbi, &cur), 0);
    assert_int_equal(mdb_cursor_get(cur, &k, &v, key ? MDB_SET_KEY : MDB_FIRST), 0);
    uint8_t rec[256];
    assert_true(v.mv_size > off && v.mv_size <= sizeof rec);
    memcpy(rec, v.mv_data, v.mv_size);
    rec[off] ^= 0x10;
    MDB_val nv = {v.mv_size, rec};
    if (flags & MDB_DUPSORT) { /* a dup's bytes are its identity: replace it */
        assert_int_equal(mdb_cursor_del(cur, 0), 0);
        assert_int_equal(mdb_put(txn, dbi, &k, &nv, 0), 0);
    } else {
        assert_int_equal(mdb_cursor_put(cur, &k, &nv, MDB_CURRENT), 0);
    }
    mdb_cursor_close(cur);
    assert_int_equal(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
}

#define DB_INT MDB_INTEGERKEY

#define DB_HASH (MDB_INTEGERKEY | MDB_DUPSORT | MDB_DUPFIXED)

static void assert_corrupt(int rc)
{
    if (rc != KVX_ECORRUPT) fail_msg("expected KVX_ECORRUPT, got %d (%s)", rc, kvx_last_error());
    assert_non_null(strstr(kvx_last_error(), "reindex"));
}

static void test_reads_and_locations(void **state)
{
    (void)state;
    char dir[300];
    new_dir(dir, sizeof dir);
    kvx_catalog *cat = open_cat(dir, 1);
    add_shard(cat, 1, 10, 5);
    /* one hash in three places: a collision and a carried copy */
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    kvx_cat_shard r = shard_rec(11, 2);
    assert_int_equal(kvx_cat_edit_add_shard(&e, 2, &r, 1), 0);
    assert_int_equal(kvx_cat_edit_add_block(&e, 0x02000000, hash_of(1, 3), 11), 0);
    assert_int_equal(kvx_cat_edit_add_block(&e, 0x02000100, hash_of(1, 3), 11), 0);
    kvx_cat_edit_next_gen(&e, 12);
    apply_ok(cat, &e);

    const kvx_cat_registry *reg = kvx_cat_registry_get(cat);
    assert_int_equal(reg->live[1], 1);
    assert_int_equal(reg->live[2], 1);
    assert_int_equal(reg->live[3], 0);
    assert_true(reg->rec[2].gen == 11 && reg->next_gen == 12);

    kvx_cat_snap *snap;
    assert_int_equal(kvx_cat_snap_begin(cat, &snap), 0);
    kvx_cat_shard sr;
    assert_int_equal(kvx_cat_shard_get(snap, 1, &sr), 0);
    kvx_cat_shard want = shard_rec(10, 5);
    assert_memory_equal(&sr, &want, sizeof sr);
    assert_int_equal(kvx_cat_shard_get(snap, 7, &sr), KVX_ENOTFOUND);
    kvx_cat_coord c;
    assert_int_equal(kvx_cat_coord_get(snap, 0x01000200, &c), 0);
    assert_true(c.hash == hash_of(1, 2) && c.gen == 10);
    assert_int_equal(kvx_cat_coord_get(snap, 0x01000900, &c), KVX_ENOTFOUND);
    /* every location of the shared hash, walked and picked out of order */
    kvx_cat_loc l[4];
    size_t n = 0;
    while (n < 4 && kvx_cat_loc_at(snap, hash_of(1, 3), n, &l[n]) == 0) n++;
    assert_int_equal(n, 3);
    assert_int_equal(kvx_cat_loc_at(snap, hash_of(1, 3), 3, &l[3]), KVX_ENOTFOUND);
    kvx_cat_loc x;
    assert_int_equal(kvx_cat_loc_at(snap, hash_of(1, 3), 2, &x), 0);
    assert_true(x.coord == l[2].coord && x.gen == l[2].gen);
    assert_int_equal(kvx_cat_loc_at(snap, hash_of(1, 3), 1, &x), 0);
    assert_true(x.coord == l[1].coord && x.gen == l[1].gen);
    assert_int_equal(kvx_cat_loc_at(snap, 12345, 0, &x), KVX_ENOTFOUND);
    assert_int_equal(kvx_cat_has_loc(snap, hash_of(1, 3), 0x02000100, 11), 1);
    assert_int_equal(kvx_cat_has_loc(snap, hash_of(1, 3), 0x02000100, 10), 0);
    kvx_cat_usage u;
    uint8_t bits[KVX_CAT_BITMAP_MAX];
    size_t nb = 99;
    assert_int_equal(kvx_cat_usage_get(snap, 1, &u, bits, sizeof bits, &nb), 0);
    assert_true(u.gen == 10 && u.last_use_ns == 7777 && u.hits == 0 && u.n_bits == 5 && nb == 1 && bits[0] == 0);
    kvx_cat_counts cn;
    assert_int_equal(kvx_cat_counts_get(snap, &cn), 0);
    assert_true(cn.blocks == 7 && cn.shards == 2 && cn.locations == 7);
    uint64_t ng;
    assert_int_equal(kvx_cat_next_gen(snap, &ng), 0);
    assert_true(ng == 12);
    view v = {0};
    assert_int_equal(kvx_cat_blocks_each(snap, 2, sum_block, &v), 0);
    assert_true(v.nblocks == 2);
    kvx_cat_snap_end(snap);
    kvx_cat_close(cat);
}

/* PROMISE: STORE-17 */
static void test_edit_all_or_nothing(void **state)
{
    (void)state;
    char dir[300];
    new_dir(dir, sizeof dir);
    kvx_catalog *cat = open_cat(dir, 1);
    add_shard(cat, 1, 10, 4);
    add_shard(cat, 2, 11, 3);
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    kvx_cat_stats d = {5, 6, 0, 0, 0, 0};
    kvx_cat_edit_stats(&e, &d, 0);
    apply_ok(cat, &e);
    view before, after;
    read_view(cat, &before);

    /* a bad shard byte: refused before anything runs */
    kvx_cat_edit_init(&e);
    kvx_cat_edit_drop_shard(&e, 1);
    kvx_cat_shard r = shard_rec(20, 1);
    assert_int_equal(kvx_cat_edit_add_shard(&e, 300, &r, 0), KVX_EINVALID);
    assert_int_equal(kvx_cat_edit_add_block(&e, 0x05000000, 99, 20), 0);
    assert_int_equal(kvx_cat_apply(cat, &e), KVX_EINVALID);
    kvx_cat_edit_free(&e);
    read_view(cat, &after);
    assert_view_equal(&before, &after);
    kvx_cat_close(cat);

    /* a damaged record the edit reads half way through (the shard record
     * a usage merge checks): everything before it in the transaction,
     * drops, adds, stats, is rolled back */
    uint32_t key = 2;
    corrupt_record(dir, "shards", DB_INT, &key, 4, 8);
    cat = open_cat(dir, 1);
    kvx_cat_edit_init(&e);
    kvx_cat_edit_drop_shard(&e, 1);
    assert_int_equal(kvx_cat_edit_add_shard(&e, 5, &r, 0), 0);
    assert_int_equal(kvx_cat_edit_add_block(&e, 0x05000000, 99, 20), 0);
    assert_int_equal(kvx_cat_edit_del_block(&e, 0x01000100, hash_of(1, 1), 10), 0);
    kvx_cat_usage use = {11, 5, 1, 3};
    uint8_t bits[1] = {0x5};
    assert_int_equal(kvx_cat_edit_merge_usage(&e, 2, &use, bits), 0);
    kvx_cat_edit_stats(&e, &d, 1);
    kvx_cat_edit_next_gen(&e, 21);
    assert_corrupt(kvx_cat_apply(cat, &e));
    kvx_cat_edit_free(&e);
    /* nothing changed: read around the damaged record */
    kvx_cat_snap *snap;
    assert_int_equal(kvx_cat_snap_begin(cat, &snap), 0);
    kvx_cat_shard s1;
    assert_int_equal(kvx_cat_shard_get(snap, 1, &s1), 0);
    assert_true(s1.gen == 10);
    assert_int_equal(kvx_cat_shard_get(snap, 5, &s1), KVX_ENOTFOUND);
    kvx_cat_coord c;
    assert_int_equal(kvx_cat_coord_get(snap, 0x01000100, &c), 0);
    assert_int_equal(kvx_cat_coord_get(snap, 0x05000000, &c), KVX_ENOTFOUND);
    kvx_cat_stats st;
    assert_int_equal(kvx_cat_stats_get(snap, &st), 0);
    assert_memory_equal(&st, &before.stats, sizeof st);
    uint64_t ng;
    assert_int_equal(kvx_cat_next_gen(snap, &ng), 0);
    assert_true(ng == 12);
    view v = {0};
    assert_int_equal(kvx_cat_blocks_each(snap, KVX_CAT_ALL, sum_block, &v), 0);
    assert_true(v.coord_sum == before.coord_sum && v.nblocks == before.nblocks);
    kvx_cat_snap_end(snap);
    /* the registry of this handle: not loaded, not changed by the failure */
    assert_int_equal(kvx_cat_registry_get(cat)->live[1], 0);
    assert_corrupt(kvx_cat_registry_load(cat));
    kvx_cat_close(cat);

    /* a handle's registry stays as it was when an edit fails */
    char dir2[300];
    new_dir(dir2, sizeof dir2);
    cat = open_cat(dir2, 1);
    add_shard(cat, 3, 30, 2);
    kvx_cat_edit_init(&e);
    kvx_cat_edit_stats(&e, &d, 0);
    apply_ok(cat, &e);
    kvx_cat_close(cat);
    corrupt_record(dir2, "meta", 0, "stats", 5, 3); /* a drop's count cannot be added */
    cat = open_cat(dir2, 1);
    assert_int_equal(kvx_cat_registry_load(cat), 0);
    kvx_cat_registry reg = *kvx_cat_registry_get(cat);
    assert_int_equal(reg.live[3], 1);
    kvx_cat_edit_init(&e);
    kvx_cat_edit_drop_shard(&e, 3);
    kvx_cat_edit_next_gen(&e, 40);
    kvx_cat_edit_stats(&e, NULL, 1);
    assert_corrupt(kvx_cat_apply(cat, &e));
    assert_true(e.out.dropped_blocks == 0);
    kvx_cat_edit_free(&e);
    assert_memory_equal(kvx_cat_registry_get(cat), &reg, sizeof reg);
    assert_int_equal(kvx_cat_registry_load(cat), 0);
    assert_memory_equal(kvx_cat_registry_get(cat), &reg, sizeof reg);
    kvx_cat_close(cat);
}

static int count_block(void *ctx, uint32_t coord, const kvx_cat_coord *rec, int damaged)
{
    (void)coord;
    (void)rec;
    if (damaged) return damaged;
    ++*(uint64_t *)ctx;
    return 0;
}

/* PROMISE: STORE-17 */
static void test_drop_removes_every_record(void **state)
{
    (void)state;
    char dir[300];
    new_dir(dir, sizeof dir);
    kvx_catalog *cat = open_cat(dir, 1);
    add_shard(cat, 4, 40, 6);
    add_shard(cat, 5, 41, 3);
    /* records of byte 4 under other generations (left by a crash or an
     * older catalog), and a hash byte 5 shares */
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    assert_int_equal(kvx_cat_edit_add_block(&e, 0x04002000, 0xABCD, 17), 0);
    assert_int_equal(kvx_cat_edit_add_block(&e, 0x04003000, hash_of(5, 0), 18), 0);
    kvx_cat_usage uu = {40, 9, 3, 6};
    uint8_t bits[1] = {0x21};
    assert_int_equal(kvx_cat_edit_put_usage(&e, 4, &uu, bits), 0);
    apply_ok(cat, &e);

    kvx_cat_edit_init(&e);
    kvx_cat_edit_drop_shard(&e, 4);
    kvx_cat_stats d = {0, 0, 1, 0, 0, 0};
    kvx_cat_edit_stats(&e, &d, 1);
    assert_int_equal(kvx_cat_apply(cat, &e), 0);
    assert_true(e.out.dropped_blocks == 8);
    kvx_cat_edit_free(&e);
    assert_int_equal(kvx_cat_registry_get(cat)->live[4], 0);
    assert_int_equal(kvx_cat_registry_get(cat)->live[5], 1);
    assert_true(kvx_cat_registry_get(cat)->rec[4].gen == 40); /* the last record stays, dead */

    kvx_cat_snap *snap;
    assert_int_equal(kvx_cat_snap_begin(cat, &snap), 0);
    uint64_t n = 0;
    assert_int_equal(kvx_cat_blocks_each(snap, 4, count_block, &n), 0);
    assert_true(n == 0);
    assert_int_equal(kvx_cat_blocks_each(snap, 5, count_block, &n), 0);
    assert_true(n == 3);
    kvx_cat_shard sr;
    assert_int_equal(kvx_cat_shard_get(snap, 4, &sr), KVX_ENOTFOUND);
    kvx_cat_usage u;
    assert_int_equal(kvx_cat_usage_get(snap, 4, &u, NULL, 0, NULL), KVX_ENOTFOUND);
    kvx_cat_loc l;
    for (uint32_t i = 0; i < 6; i++) assert_int_equal(kvx_cat_loc_at(snap, hash_of(4, i), 0, &l), KVX_ENOTFOUND);
    assert_int_equal(kvx_cat_loc_at(snap, 0xABCD, 0, &l), KVX_ENOTFOUND);
    /* byte 5's block of the shared hash keeps its location, alone */
    assert_int_equal(kvx_cat_loc_at(snap, hash_of(5, 0), 0, &l), 0);
    assert_true(l.coord == 0x05000000 && l.gen == 41);
    assert_int_equal(kvx_cat_loc_at(snap, hash_of(5, 0), 1, &l), KVX_ENOTFOUND);
    kvx_cat_stats st;
    assert_int_equal(kvx_cat_stats_get(snap, &st), 0);
    assert_true(st.evictions == 1 && st.evicted_blocks == 8);
    kvx_cat_counts cn;
    assert_int_equal(kvx_cat_counts_get(snap, &cn), 0);
    assert_true(cn.blocks == 3 && cn.locations == 3 && cn.shards == 1);
    kvx_cat_snap_end(snap);

    /* blocks moved out before their shard is dropped do not count */
    add_shard(cat, 6, 50, 4);
    kvx_cat_edit_init(&e);
    kvx_cat_shard r = shard_rec(51, 2);
    assert_int_equal(kvx_cat_edit_add_shard(&e, 7, &r, 0), 0);
    assert_int_equal(kvx_cat_edit_move_block(&e, hash_of(6, 1), 0x06000100, 50, 0x07000000, 51), 0);
    assert_int_equal(kvx_cat_edit_move_block(&e, hash_of(6, 2), 0x06000200, 50, 0x07000100, 51), 0);
    kvx_cat_edit_drop_shard(&e, 6);
    kvx_cat_edit_stats(&e, NULL, 1);
    assert_int_equal(kvx_cat_apply(cat, &e), 0);
    assert_true(e.out.dropped_blocks == 2);
    kvx_cat_edit_free(&e);
    assert_int_equal(kvx_cat_snap_begin(cat, &snap), 0);
    assert_int_equal(kvx_cat_loc_at(snap, hash_of(6, 2), 0, &l), 0);
    assert_true(l.coord == 0x07000100 && l.gen == 51);
    assert_int_equal(kvx_cat_loc_at(snap, hash_of(6, 2), 1, &l), KVX_ENOTFOUND);
    assert_int_equal(kvx_cat_loc_at(snap, hash_of(6, 0), 0, &l), KVX_ENOTFOUND);
    assert_int_equal(kvx_cat_stats_get(snap, &st), 0);
    assert_true(st.evicted_blocks == 10);
    kvx_cat_snap_end(snap);
    kvx_cat_close(cat);
}

static void test_reset_empties(void **state)
{
    (void)state;
    char dir[300];
    new_dir(dir, sizeof dir);
    kvx_catalog *cat = open_cat(dir, 1);
    for (uint32_t b = 0; b < 5; b++) add_shard(cat, b, 100 + b, 4);
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    kvx_cat_stats d = {9, 9, 9, 9, 9, 9};
    kvx_cat_edit_stats(&e, &d, 0);
    apply_ok(cat, &e);
    kvx_cat_edit_init(&e);
    kvx_cat_edit_reset(&e);
    kvx_cat_shard r = shard_rec(3, 2);
    assert_int_equal(kvx_cat_edit_add_shard(&e, 9, &r, 0), 0);
    assert_int_equal(kvx_cat_edit_add_block(&e, 0x09000000, 77, 3), 0);
    kvx_cat_edit_stats(&e, NULL, 0);
    kvx_cat_edit_next_gen(&e, 200);
    apply_ok(cat, &e);
    const kvx_cat_registry *reg = kvx_cat_registry_get(cat);
    for (uint32_t b = 0; b < KVX_CAT_SLOTS; b++) assert_int_equal(reg->live[b], b == 9);
    assert_true(reg->next_gen == 200);
    view v;
    read_view(cat, &v);
    assert_memory_equal(&v.reg, reg, sizeof *reg);
    assert_true(v.counts.blocks == 1 && v.counts.locations == 1 && v.counts.shards == 1);
    kvx_cat_stats zero = {0};
    assert_memory_equal(&v.stats, &zero, sizeof zero);
    kvx_cat_snap *snap;
    assert_int_equal(kvx_cat_snap_begin(cat, &snap), 0);
    kvx_cat_usage u;
    for (uint32_t b = 0; b < 5; b++) assert_int_equal(kvx_cat_usage_get(snap, b, &u, NULL, 0, NULL), KVX_ENOTFOUND);
    assert_int_equal(kvx_cat_usage_get(snap, 9, &u, NULL, 0, NULL), 0);
    kvx_cat_snap_end(snap);

    /* a reset alone: nothing left, not even next_gen */
    kvx_cat_edit_init(&e);
    kvx_cat_edit_reset(&e);
    apply_ok(cat, &e);
    read_view(cat, &v);
    assert_true(v.counts.blocks == 0 && v.counts.shards == 0 && v.reg.next_gen == 0);
    assert_true(kvx_cat_registry_get(cat)->next_gen == 0 && !kvx_cat_registry_get(cat)->live[9]);
    kvx_cat_close(cat);
}

static void test_usage_merge(void **state)
{
    (void)state;
    char dir[300];
    new_dir(dir, sizeof dir);
    kvx_catalog *cat = open_cat(dir, 1);
    add_shard(cat, 1, 10, 12); /* usage: gen 10, last 7777, 12 clear bits */
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    kvx_cat_usage a = {10, 9000, 2, 12};
    uint8_t ab[2] = {0x01, 0x08};
    kvx_cat_usage old = {9, 99999, 50, 12}; /* another generation: skipped */
    uint8_t ob[2] = {0xFF, 0xFF};
    kvx_cat_usage none = {10, 99999, 50, 12}; /* byte 2 holds no shard: skipped */
    kvx_cat_stats d = {3, 4, 0, 0, 0, 0};
    assert_int_equal(kvx_cat_edit_merge_usage(&e, 1, &a, ab), 0);
    assert_int_equal(kvx_cat_edit_merge_usage(&e, 1, &old, ob), 0);
    assert_int_equal(kvx_cat_edit_merge_usage(&e, 2, &none, ob), 0);
    kvx_cat_edit_stats(&e, &d, 0);
    apply_ok(cat, &e);
    kvx_cat_edit_init(&e);
    kvx_cat_usage b = {10, 8000, 5, 12};
    uint8_t bb[2] = {0x02, 0x00};
    assert_int_equal(kvx_cat_edit_merge_usage(&e, 1, &b, bb), 0);
    kvx_cat_edit_stats(&e, &d, 0);
    apply_ok(cat, &e);
    kvx_cat_snap *snap;
    assert_int_equal(kvx_cat_snap_begin(cat, &snap), 0);
    kvx_cat_usage u;
    uint8_t bits[8];
    size_t nb = 0;
    assert_int_equal(kvx_cat_usage_get(snap, 1, &u, bits, sizeof bits, &nb), 0);
    assert_true(u.gen == 10 && u.last_use_ns == 9000 && u.hits == 7 && u.n_bits == 12 && nb == 2);
    assert_int_equal(bits[0], 0x03);
    assert_int_equal(bits[1], 0x08);
    assert_int_equal(kvx_cat_usage_get(snap, 2, &u, NULL, 0, NULL), KVX_ENOTFOUND);
    kvx_cat_stats st;
    assert_int_equal(kvx_cat_stats_get(snap, &st), 0);
    assert_true(st.hits == 6 && st.misses == 8);
    kvx_cat_snap_end(snap);
    kvx_cat_close(cat);
}

typedef struct damaged_walk {
    uint64_t good, damaged;
    uint32_t coord;
} damaged_walk;

static int note_damage(void *ctx, uint32_t coord, const kvx_cat_coord *rec, int damaged)
{
    damaged_walk *w = ctx;
    if (damaged) {
        assert_int_equal(damaged, KVX_ECORRUPT);
        assert_null(rec);
        w->damaged++;
        w->coord = coord;
    } else {
        w->good++;
    }
    return 0;
}

/* One flipped byte in one record of each kind: each read that reaches it
 * says KVX_ECORRUPT (naming reindex), never "not found". */
/* PROMISE: RECOVER-9 */
static void test_damaged_record_is_corrupt(void **state)
{
    (void)state;
    char dir[300];
    new_dir(dir, sizeof dir);
    kvx_catalog *cat = open_cat(dir, 1);
    add_shard(cat, 1, 10, 4);
    add_shard(cat, 2, 11, 4);
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    kvx_cat_stats d = {1, 2, 3, 4, 5, 6};
    kvx_cat_edit_stats(&e, &d, 0);
    assert_int_equal(kvx_cat_edit_add_block(&e, 0x02000400, hash_of(1, 2), 11), 0); /* a second location */
    apply_ok(cat, &e);
    kvx_cat_close(cat);

    uint32_t shard2 = 2, coord = 0x01000100;
    uint64_t hash = hash_of(1, 2);
    corrupt_record(dir, "shards", DB_INT, &shard2, 4, 0);   /* its generation */
    corrupt_record(dir, "coord", DB_INT, &coord, 4, 0);     /* its hash */
    corrupt_record(dir, "hash", DB_HASH, &hash, 8, 8);      /* the first location's generation */
    corrupt_record(dir, "usage", DB_INT, &shard2, 4, 8);    /* its last use */
    corrupt_record(dir, "meta", 0, "next_gen", 8, 0);
    corrupt_record(dir, "meta", 0, "stats", 5, 0);

    for (int create = 0; create < 2; create++) {
        cat = open_cat(dir, create);
        assert_corrupt(kvx_cat_registry_load(cat));
        kvx_cat_snap *snap;
        assert_int_equal(kvx_cat_snap_begin(cat, &snap), 0);
        kvx_cat_shard sr;
        assert_corrupt(kvx_cat_shard_get(snap, 2, &sr));
        assert_int_equal(kvx_cat_shard_get(snap, 1, &sr), 0);
        kvx_cat_coord c;
        assert_corrupt(kvx_cat_coord_get(snap, coord, &c));
        assert_int_equal(kvx_cat_coord_get(snap, 0x01000000, &c), 0);
        /* the damaged location, wherever the walk meets it; the other is read */
        kvx_cat_loc l;
        int seen_bad = 0, seen_good = 0;
        for (size_t i = 0; i < 3; i++) {
            int rc = kvx_cat_loc_at(snap, hash, i, &l);
            if (rc == KVX_ENOTFOUND) break;
            if (rc == 0) seen_good++;
            else assert_corrupt(rc), seen_bad++;
        }
        assert_int_equal(seen_bad, 1);
        assert_int_equal(seen_good, 1);
        /* asked for the damaged location itself: not "absent" */
        assert_corrupt(kvx_cat_has_loc(snap, hash, 0x01000200, 10));
        assert_int_equal(kvx_cat_has_loc(snap, hash, 0x02000400, 11), 1);
        kvx_cat_usage u;
        assert_corrupt(kvx_cat_usage_get(snap, 2, &u, NULL, 0, NULL));
        assert_int_equal(kvx_cat_usage_get(snap, 1, &u, NULL, 0, NULL), 0);
        uint64_t ng;
        assert_corrupt(kvx_cat_next_gen(snap, &ng));
        kvx_cat_stats st;
        assert_corrupt(kvx_cat_stats_get(snap, &st));
        kvx_cat_registry reg;
        assert_corrupt(kvx_cat_registry_read(snap, &reg));
        damaged_walk w = {0, 0, 0};
        assert_int_equal(kvx_cat_blocks_each(snap, KVX_CAT_ALL, note_damage, &w), 0);
        assert_true(w.damaged == 1 && w.coord == coord && w.good == 8);
        view v;
        memset(&v, 0, sizeof v);
        assert_corrupt(kvx_cat_blocks_each(snap, 1, sum_block, &v)); /* a walker that stops there */
        kvx_cat_snap_end(snap);
        if (create) {
            /* edits that must read a damaged record refuse, whole */
            kvx_cat_edit_init(&e);
            kvx_cat_edit_drop_shard(&e, 1); /* its coordinate record is damaged */
            assert_corrupt(kvx_cat_apply(cat, &e));
            kvx_cat_edit_free(&e);
            kvx_cat_edit_init(&e);
            kvx_cat_edit_stats(&e, &d, 0);
            assert_corrupt(kvx_cat_apply(cat, &e));
            kvx_cat_edit_free(&e);
            /* an edit that reads none of them works; reset cures all */
            kvx_cat_edit_init(&e);
            kvx_cat_edit_reset(&e);
            kvx_cat_edit_next_gen(&e, 5);
            apply_ok(cat, &e);
            assert_int_equal(kvx_cat_registry_load(cat), 0);
            assert_true(kvx_cat_registry_get(cat)->next_gen == 5);
        }
        kvx_cat_close(cat);
    }
}

/* The reader of test_readonly_refuses_edits, in a child: an exit code. */
static int readonly_child(const char *dir)
{
    if (geteuid() == 0 && (setgroups(0, NULL) != 0 || setresgid(65534, 65534, 65534) != 0 ||
                           setresuid(65534, 65534, 65534) != 0))
        return 30;
    kvx_catalog *cat = NULL;
    if (kvx_cat_open(&cat, dir, 0, 1) != 0) return 10;
    if (!kvx_cat_readonly(cat)) return 11;
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    kvx_cat_edit_drop_shard(&e, 1);
    if (kvx_cat_apply(cat, &e) != -EROFS) return 12;
    kvx_cat_edit_free(&e);
    if (kvx_cat_registry_load(cat) != 0 || !kvx_cat_registry_get(cat)->live[1]) return 13;
    kvx_cat_snap *snap;
    kvx_cat_loc l;
    if (kvx_cat_snap_begin(cat, &snap) != 0) return 14;
    if (kvx_cat_loc_at(snap, hash_of(1, 1), 0, &l) != 0 || l.coord != 0x01000100) return 15;
    kvx_cat_snap_end(snap);
    kvx_cat_close(cat);
    return 0;
}

/* A catalog its reader may not write (DESIGN.md rule 3): reads work,
 * edits are refused. As root, the reader runs as nobody. */
static void test_readonly_refuses_edits(void **state)
{
    (void)state;
    char dir[300];
    new_dir(dir, sizeof dir);
    kvx_catalog *cat = open_cat(dir, 1);
    add_shard(cat, 1, 10, 2);
    kvx_cat_close(cat);
    char cmd[1000];
    snprintf(cmd, sizeof cmd, "chmod 0711 '%s' && chmod -R a-w,a+rX '%s'", su_root, dir);
    assert_int_equal(system(cmd), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(readonly_child(dir));
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    snprintf(cmd, sizeof cmd, "chmod 0700 '%s' && chmod -R u+w '%s'", su_root, dir);
    assert_int_equal(system(cmd), 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) fail_msg("read-only reader: status 0x%x", st);
}

/* A map far too small for the edit: it grows, and the edit runs again from
 * the start (its counts are not doubled). */
/* PROMISE: STORE-17 */
static void test_map_grows(void **state)
{
    (void)state;
    char dir[300];
    new_dir(dir, sizeof dir);
    setenv("KVX_INDEX_MAP_BYTES", "65536", 1);
    kvx_catalog *cat = open_cat(dir, 1);
    unsetenv("KVX_INDEX_MAP_BYTES");
    add_shard(cat, 1, 10, 3000);
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    kvx_cat_shard r = shard_rec(11, 60000);
    assert_int_equal(kvx_cat_edit_add_shard(&e, 2, &r, 0), 0);
    for (uint32_t i = 0; i < 60000; i++)
        assert_int_equal(kvx_cat_edit_add_block(&e, (2u << 24) | (i << 8), hash_of(2, i), 11), 0);
    kvx_cat_edit_drop_shard(&e, 1);
    kvx_cat_edit_stats(&e, NULL, 1);
    assert_int_equal(kvx_cat_apply(cat, &e), 0);
    assert_true(e.out.dropped_blocks == 3000);
    kvx_cat_edit_free(&e);
    view v;
    read_view(cat, &v);
    assert_true(v.counts.blocks == 60000 && v.counts.locations == 60000 && v.stats.evicted_blocks == 3000);
    kvx_cat_close(cat);
}

typedef struct fixture_walk {
    kvx_cat_snap *snap;
    const kvx_cat_registry *reg;
    uint64_t blocks;
} fixture_walk;

static int check_fixture_block(void *ctx, uint32_t coord, const kvx_cat_coord *rec, int damaged)
{
    fixture_walk *w = ctx;
    assert_int_equal(damaged, 0);
    uint32_t b = coord >> 24;
    assert_int_equal(w->reg->live[b], 1);
    assert_true(w->reg->rec[b].gen == rec->gen);
    assert_true(((coord >> 8) & 0xFFFF) < w->reg->rec[b].n_entries);
    assert_int_equal(kvx_cat_has_loc(w->snap, rec->hash, coord, rec->gen), 1);
    int found = 0;
    kvx_cat_loc l;
    for (size_t i = 0; kvx_cat_loc_at(w->snap, rec->hash, i, &l) == 0; i++) found |= l.coord == coord && l.gen == rec->gen;
    assert_true(found);
    w->blocks++;
    return 0;
}

/* The store-v1 fixture, written before the catalog, read through it. */
static void test_fixture_records(void **state)
{
    (void)state;
    char dir[300], cmd[1200];
    snprintf(dir, sizeof dir, "%s/fixture-index", su_root);
    snprintf(cmd, sizeof cmd, "cp -r '%s/tests/lib/fixtures/store-v1/index' '%s' && chmod -R u+rwX '%s'", KVX_SOURCE_DIR,
             dir, dir);
    assert_int_equal(system(cmd), 0);
    kvx_catalog *cat = open_cat(dir, 0);
    assert_int_equal(kvx_cat_registry_load(cat), 0);
    const kvx_cat_registry *reg = kvx_cat_registry_get(cat);
    int live = 0;
    uint64_t max_gen = 0, entries = 0, unverified = 0;
    for (int b = 0; b < KVX_CAT_SLOTS; b++) {
        if (!reg->live[b]) continue;
        live++;
        entries += reg->rec[b].n_entries;
        unverified += (reg->rec[b].flags & KVX_FLAG_DIGEST) ? reg->rec[b].n_unverified : reg->rec[b].n_entries;
        if (reg->rec[b].gen > max_gen) max_gen = reg->rec[b].gen;
        assert_true(reg->rec[b].file_bytes > 0 && reg->rec[b].created_ns > 0);
    }
    assert_int_equal(live, 13);
    assert_true(max_gen == 13 && reg->next_gen > max_gen);
    assert_true(unverified == 4);
    kvx_cat_snap *snap;
    assert_int_equal(kvx_cat_snap_begin(cat, &snap), 0);
    kvx_cat_counts cn;
    assert_int_equal(kvx_cat_counts_get(snap, &cn), 0);
    assert_true(cn.blocks == 76 && cn.shards == 13 && cn.locations >= 76);
    fixture_walk w = {snap, reg, 0};
    assert_int_equal(kvx_cat_blocks_each(snap, KVX_CAT_ALL, check_fixture_block, &w), 0);
    assert_true(w.blocks == 76 && entries >= 76);
    kvx_cat_stats st;
    assert_int_equal(kvx_cat_stats_get(snap, &st), 0);
    assert_true(st.hits >= 24 && st.misses >= 6);
    for (int b = 0; b < KVX_CAT_SLOTS; b++) {
        if (!reg->live[b]) continue;
        kvx_cat_usage u;
        uint8_t bits[KVX_CAT_BITMAP_MAX];
        size_t nb = 0;
        int rc = kvx_cat_usage_get(snap, (uint32_t)b, &u, bits, sizeof bits, &nb);
        assert_true(rc == 0 || rc == KVX_ENOTFOUND);
        if (rc == 0) assert_true(nb == (u.n_bits + 7) / 8);
    }
    kvx_cat_snap_end(snap);
    kvx_cat_close(cat);

    /* a writer's edit on it: old records are rewritten, the rest still reads */
    cat = open_cat(dir, 1);
    assert_int_equal(kvx_cat_registry_load(cat), 0);
    kvx_cat_registry before = *kvx_cat_registry_get(cat);
    int first = 0;
    while (!before.live[first]) first++;
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    kvx_cat_edit_drop_shard(&e, (uint32_t)first);
    kvx_cat_edit_next_gen(&e, before.next_gen + 1);
    kvx_cat_edit_stats(&e, NULL, 1);
    assert_int_equal(kvx_cat_apply(cat, &e), 0);
    assert_true(e.out.dropped_blocks > 0 && e.out.dropped_blocks <= before.rec[first].n_entries);
    uint64_t dropped = e.out.dropped_blocks;
    kvx_cat_edit_free(&e);
    assert_int_equal(kvx_cat_snap_begin(cat, &snap), 0);
    assert_int_equal(kvx_cat_counts_get(snap, &cn), 0);
    assert_true(cn.blocks == 76 - dropped && cn.shards == 12);
    w.snap = snap;
    w.reg = kvx_cat_registry_get(cat);
    w.blocks = 0;
    assert_int_equal(kvx_cat_blocks_each(snap, KVX_CAT_ALL, check_fixture_block, &w), 0);
    assert_true(w.blocks == 76 - dropped);
    kvx_cat_snap_end(snap);
    kvx_cat_close(cat);
}

/* Many snapshots at once and reused: the pool hands each its own. */
static void test_snapshot_pool(void **state)
{
    (void)state;
    char dir[300];
    new_dir(dir, sizeof dir);
    kvx_catalog *cat = open_cat(dir, 1), *cat2 = open_cat(dir, 0);
    add_shard(cat, 1, 10, 3);
    kvx_cat_snap *s[80];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 80; i++) assert_int_equal(kvx_cat_snap_begin(i & 1 ? cat2 : cat, &s[i]), 0);
        for (int i = 0; i < 80; i++) {
            kvx_cat_loc l;
            assert_int_equal(kvx_cat_loc_at(s[i], hash_of(1, (uint32_t)i % 3), 0, &l), 0);
            assert_int_equal(kvx_cat_loc_at(s[i], hash_of(1, (uint32_t)i % 3), 1, &l), KVX_ENOTFOUND);
        }
        for (int i = 0; i < 80; i++) kvx_cat_snap_end(s[i]);
        add_shard(cat, 2 + (uint32_t)round, 20 + (uint64_t)round, 1); /* a commit between rounds */
    }
    kvx_cat_snap_end(NULL);
    assert_int_equal(kvx_cat_registry_load(cat2), 0);
    assert_int_equal(kvx_cat_registry_get(cat2)->live[4], 1);
    kvx_cat_close(cat2);
    kvx_cat_close(cat);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_and_locations),
        cmocka_unit_test(test_edit_all_or_nothing),
        cmocka_unit_test(test_drop_removes_every_record),
        cmocka_unit_test(test_reset_empties),
        cmocka_unit_test(test_usage_merge),
        cmocka_unit_test(test_damaged_record_is_corrupt),
        cmocka_unit_test(test_readonly_refuses_edits),
        cmocka_unit_test(test_map_grows),
        cmocka_unit_test(test_fixture_records),
        cmocka_unit_test(test_snapshot_pool),
    };
    return cmocka_run_group_tests_name("index/catalog", tests, su_setup, su_teardown);
}
