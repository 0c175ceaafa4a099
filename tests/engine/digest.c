/*
 * digest.c - stores written before the prefix digest existed (shards with
 * lineage but no digest table) are refused, by writers and readers, with
 * KVX_EVERSION naming the file and the fix (recreate: a store is a
 * cache); the file itself stays, untouched, and the format still reads it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <inttypes.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cmocka.h>

#include "lib/io.h"
#include "lib/store.h"

typedef struct old_ent {
    const uint32_t *toks;
    const uint8_t *page;
    uint64_t parent;
} old_ent;

/* shards/<gen>.kvx for shard byte `byte`: hashes and lineage, no digest
 * table (what a store wrote before the digest existed). */
static void write_old_entries(const char *dir, uint64_t gen, uint8_t byte, const old_ent *ents, size_t n)
{
    char path[600];
    snprintf(path, sizeof path, "%s/shards/%016" PRIx64 ".kvx", dir, gen);
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.shard_id = byte;
    o.max_entries = 64;
    o.flags = KVX_FLAG_HASHES | KVX_FLAG_LINEAGE;
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    for (size_t i = 0; i < n; i++) {
        kvx_entry_in e;
        memset(&e, 0, sizeof e);
        e.radix_block = (uint16_t)i;
        e.token_count = SU_B;
        e.page = ents[i].page;
        e.tokens = ents[i].toks;
        e.parent = ents[i].parent;
        e.hash = kvx_block_hash(e.parent, e.tokens, SU_B);
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    }
    assert_int_equal(kvx_shard_writer_seal(w), 0);
}

/* Entries for nb blocks of tokens t (a chain from parent 0). */
static size_t old_chain(old_ent *out, const uint32_t *t, const uint8_t *pages, size_t nb)
{
    uint64_t h[64];
    kvx_block_hashes(h, t, nb * SU_B, SU_B);
    for (size_t i = 0; i < nb; i++) out[i] = (old_ent){t + i * SU_B, pages + i * 64, i ? h[i - 1] : 0};
    return nb;
}

/* shards/<gen>.kvx's size and a checksum of its bytes. */
static uint64_t file_sum(const char *dir, uint64_t gen)
{
    char p[600];
    snprintf(p, sizeof p, "%s/shards/%016" PRIx64 ".kvx", dir, gen);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    uint64_t sum = 0;
    int c;
    while ((c = fgetc(f)) != EOF) sum = sum * 131 + (uint64_t)c;
    fclose(f);
    return sum;
}

static void expect_refused(const char *name)
{
    assert_non_null(strstr(kvx_last_error(), name));
    assert_non_null(strstr(kvx_last_error(), "written before prefix digests (kvx 0.x): recreate the store (it is a cache)"));
}

/* A pre-digest shard (flags HASHES|LINEAGE, written with the public shard
 * writer) found in shards/: the writer's open and reindex_dir refuse the
 * store, naming the file; nothing is moved or changed, index/ stays; the
 * shard itself still opens as a KVX file (kvx inspect reads it). */
/* PROMISE: TRUST-9 */
static void test_predigest_shard_found_refused(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    su_put_flush(s, 1, 4);
    kvx_store_close(s);
    enum { NB = 4 };
    uint32_t t[NB * SU_B];
    su_tokens(t, 300, NB, 0);
    uint8_t *pt = malloc(NB * 64);
    for (size_t i = 0; i < NB; i++) su_page(pt + i * 64, 64, su_mix(300 * 977 + i));
    old_ent e[NB];
    old_chain(e, t, pt, NB);
    write_old_entries(dir, 0x70, 3, e, NB);
    uint64_t sum = file_sum(dir, 0x70);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), KVX_EVERSION);
    expect_refused("shards/0000000000000070.kvx");
    assert_int_equal(kvx_store_reindex_dir(dir, 0), KVX_EVERSION);
    expect_refused("shards/0000000000000070.kvx");
    assert_true(file_sum(dir, 0x70) == sum);
    assert_int_equal(su_n_files(dir, "quarantine"), 0);
    char p[600];
    snprintf(p, sizeof p, "%s/shards/%016" PRIx64 ".kvx", dir, (uint64_t)0x70);
    kvx_shard *sh;
    assert_int_equal(kvx_shard_open(&sh, p, 0), 0);
    assert_int_equal(kvx_shard_get_info(sh)->num_blocks, NB);
    assert_int_equal(kvx_shard_get_info(sh)->flags & KVX_FLAG_DIGEST, 0);
    kvx_shard_close(sh);
    /* the store without it opens again, its index as it was */
    assert_int_equal(unlink(p), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(su_served_prefix(s, 1, 4), 4);
    kvx_store_close(s);
    free(pt);
}

/* A catalog that registers a shard without its digest table (the flags of
 * its record, as a pre-digest store's catalog has them): readers and
 * writers refuse the store, naming the file. */
/* PROMISE: TRUST-9 */
static void test_predigest_shard_registered_refused(void **state)
{
    (void)state;
    char dir[300], idx[400];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    su_put_flush(s, 1, 4);
    kvx_store_close(s);
    snprintf(idx, sizeof idx, "%s/index", dir);
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi dbi;
    MDB_cursor *cur;
    MDB_val k, v;
    assert_int_equal(mdb_env_create(&env), 0);
    assert_int_equal(mdb_env_set_maxdbs(env, 16), 0);
    assert_int_equal(mdb_env_open(env, idx, 0, 0600), 0);
    assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, "shards", MDB_INTEGERKEY, &dbi), 0);
    assert_int_equal(mdb_cursor_open(txn, dbi, &cur), 0);
    assert_int_equal(mdb_cursor_get(cur, &k, &v, MDB_FIRST), 0);
    /* {gen, file_bytes, created_ns, n_entries, flags @28, crc @32, ...} */
    assert_int_equal(v.mv_size, 48);
    uint8_t rec[48], key[4];
    memcpy(rec, v.mv_data, 48);
    memcpy(key, k.mv_data, 4);
    uint64_t gen;
    memcpy(&gen, rec, 8);
    uint32_t flags;
    memcpy(&flags, rec + 28, 4);
    flags &= ~(uint32_t)KVX_FLAG_DIGEST;
    memcpy(rec + 28, &flags, 4);
    memset(rec + 32, 0, 4);
    uint32_t crc = kvx_crc32c(kvx_crc32c(0, key, 4), rec, 48);
    if (!crc) crc = 1;
    memcpy(rec + 32, &crc, 4);
    MDB_val nv = {48, rec};
    assert_int_equal(mdb_cursor_put(cur, &k, &nv, MDB_CURRENT), 0);
    mdb_cursor_close(cur);
    assert_int_equal(mdb_txn_commit(txn), 0);
    mdb_env_close(env);
    char name[64];
    snprintf(name, sizeof name, "shards/%016" PRIx64 ".kvx", gen);
    for (int writer = 0; writer < 2; writer++) {
        assert_int_equal(kvx_store_open(&s, dir, NULL, writer ? 0 : KVX_STORE_READONLY), KVX_EVERSION);
        expect_refused(name);
    }
}

/* The group's setup and teardown: each fixture's, in order. */
static int setup_all(void **state)
{
    if (su_setup(state)) return -1;
    if (io_setup(state)) return -1;
    return 0;
}

static int teardown_all(void **state)
{
    su_teardown(state);
    io_teardown(state);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_predigest_shard_found_refused),
        cmocka_unit_test(test_predigest_shard_registered_refused),
    };
    return cmocka_run_group_tests_name("engine/digest", tests, setup_all, teardown_all);
}
