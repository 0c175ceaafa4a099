/*
 * test_attack4.c - shard files that are valid KVX but not laid out as
 * this store writes them (found by a hostile review of the catalog change):
 *  - a registered file that another model's store wrote (same name,
 *    coordinates, hashes and size): lookups refuse it, so verify must
 *    report it (it passed it: verify never checked geometry, model or the
 *    shard byte);
 *  - a file whose entry's coordinate is not (shard byte, index, 0):
 *    recovery adopted it and gc then read past an array sized by the
 *    entry count (ASan). Now every path that judges a file
 *    (engine/store_cache.c kvx_st_shard_ours: lookups, verify, recovery,
 *    reindex) refuses it, and recovery moves it to quarantine/.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lib/store.h"

#define NB 3

static void copy_file(const char *from, const char *to)
{
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    assert_int_equal(system(cmd), 0);
}

/* ------------------------------------------- verify and a foreign shard */

/* A store of another model wrote the same prompt into a file of the same
 * name (both stores number their shards from the same generation): copied
 * over the registered file, every entry's coordinate and hash still match
 * the catalog and every page its CRC, but the file belongs to another
 * model, so no lookup serves it (store_cache.c checks geometry and model).
 * verify must say so instead of passing the store. */
static void test_verify_foreign_model_shard(void **state)
{
    (void)state;
    char a[300], b[300];
    su_new_dir(a, sizeof a);
    su_new_dir(b, sizeof b);
    kvx_store *sa = su_create(a, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    kvx_store *sb =
        su_create(b, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10, .signature = 0x5555AAAA5555AAAAull});
    assert_int_equal(su_put_seq(sa, 7, NB), 0);
    assert_int_equal(su_put_seq(sb, 7, NB), 0);
    kvx_store_close(sa);
    kvx_store_close(sb);
    char na[4][64], nb[4][64];
    assert_int_equal(su_list_names(a, "shards", na, 4), 1);
    assert_int_equal(su_list_names(b, "shards", nb, 4), 1);
    assert_string_equal(na[0], nb[0]);
    char pa[700], pb[700];
    snprintf(pa, sizeof pa, "%s/shards/%s", a, na[0]);
    snprintf(pb, sizeof pb, "%s/shards/%s", b, nb[0]);
    struct stat sta, stb;
    assert_int_equal(stat(pa, &sta), 0);
    assert_int_equal(stat(pb, &stb), 0);
    assert_int_equal(sta.st_size, stb.st_size);
    copy_file(pb, pa);

    assert_int_equal(kvx_store_open(&sa, a, NULL, KVX_STORE_READONLY), 0);
    /* lookups refuse the foreign file */
    assert_int_equal(su_served_prefix(sa, 7, NB), 0);
    uint64_t bad = 0;
    int rc = kvx_store_verify(sa, &bad, NULL, NULL);
    kvx_store_close(sa);
    if (rc == 0 || bad == 0)
        fail_msg("verify passed a store whose only shard belongs to another model (rc %d, %llu problems) while "
                 "every lookup misses",
                 rc, (unsigned long long)bad);
}

/* ------------------------------------ an adopted shard, sparse coordinates */

/* A valid shard made with the public shard writer (this store's geometry
 * and model) whose one entry has coordinate block 1000 (radix_block is the
 * caller's), and a parent the store does not hold. Recovery used to adopt
 * it, and gc's headless pass then indexed keep[] (store_gc.c
 * st_rewrite_shard) by the coordinate's block, 1000, in an array of
 * num_blocks + 1 = 2 bytes: a heap read out of bounds (ASan). A file in
 * shards/ is input (DESIGN.md rule 5): now it is quarantined, and gc runs. */
static void test_gc_sparse_coordinates(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    assert_int_equal(su_put_seq(s, 1, NB), 0);
    kvx_store_close(s);
    char path[700], staging[700];
    snprintf(path, sizeof path, "%s/shards/00000000000000f0.kvx", dir);
    snprintf(staging, sizeof staging, "%s/staging", dir);
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.shard_id = 7;
    o.max_entries = 8;
    o.flags = KVX_FLAG_HASHES | KVX_FLAG_LINEAGE;
    o.staging_dir = staging;
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    uint32_t t[SU_B] = {11, 22, 33, 44};
    uint64_t parent = 0x1234567890ABCDEFull;
    uint8_t page[64];
    kvx_entry_in e;
    memset(&e, 0, sizeof e);
    e.radix_block = 1000;
    e.token_count = SU_B;
    e.hash = kvx_block_hash(parent, t, SU_B);
    su_page(page, 64, e.hash);
    e.page = page;
    e.parent = parent;
    e.tokens = t;
    assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    assert_int_equal(kvx_shard_writer_seal(w), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    /* not adopted: it goes to quarantine/ with the reason, never deleted */
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.shards, 1);
    assert_int_equal(st.quarantined, 1);
    char why[800], text[600] = {0};
    snprintf(why, sizeof why, "%s/quarantine/00000000000000f0.kvx.why", dir);
    FILE *f = fopen(why, "r");
    assert_non_null(f);
    size_t got = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    assert_true(got > 0);
    assert_non_null(strstr(text, "coordinate"));
    int rc = kvx_store_gc(s); /* was: ASan heap-buffer-overflow in st_rewrite_shard */
    if (rc) fail_msg("gc: %s (%s)", kvx_err_name(rc), kvx_last_error());
    assert_int_equal(su_served_prefix(s, 1, NB), NB);
    kvx_store_close(s);
}

/* ------------------------------------------- a pin through gc's salvage */

/* Batch A puts a prompt the store already holds: its shard is pinned until
 * A's flush, which will acknowledge those blocks. gc then salvages that
 * shard (another block's page is damaged), copying the held blocks into a
 * new shard; then other puts turn the store over. A's pin must follow its
 * blocks into the new shard, or eviction takes them and A's flush
 * acknowledges blocks that are gone. */
static void test_pin_follows_salvage(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 2u << 20, .shard_bytes = 512u << 10});
    /* sequence 1, 12 blocks, in one shard */
    uint32_t t[12 * SU_B];
    uint64_t h[12];
    su_tokens(t, 1, 12, 0);
    uint8_t *p = su_pages(t, 12, h, 64);
    assert_int_equal(kvx_store_put(s, t, 12 * SU_B, p, 12, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    char names[4][64];
    assert_int_equal(su_list_names(dir, "shards", names, 4), 1);
    kvx_store_batch *a;
    assert_int_equal(kvx_store_batch_create(&a, s), 0);
    size_t added = 9;
    assert_int_equal(kvx_store_batch_put(a, t, 6 * SU_B, p, 6, NULL, &added), 0);
    assert_int_equal(added, 0); /* all held: the shard is pinned */
    /* damage block 9: gc salvages the shard, copying the good blocks */
    char path[800];
    snprintf(path, sizeof path, "%s/shards/%s", dir, names[0]);
    assert_int_equal(su_flip_page_byte(path, 9), 0);
    assert_int_equal(kvx_store_gc(s), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.quarantined, 1);
    /* turn the store over many times with other prompts */
    for (uint64_t q = 100; q < 100 + 200; q++) assert_int_equal(su_put_seq(s, q, 6), 0);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.evictions > 0);
    assert_int_equal(kvx_store_batch_flush(a), 0); /* acknowledges sequence 1's first 6 blocks */
    assert_int_equal(su_served_prefix(s, 1, 6), 6);
    kvx_store_batch_destroy(a);
    kvx_store_close(s);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_foreign_model_shard),
        cmocka_unit_test(test_gc_sparse_coordinates),
        cmocka_unit_test(test_pin_follows_salvage),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
