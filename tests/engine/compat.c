/*
 * compat.c - a store written by earlier code still opens and serves every
 * block it acknowledged: tests/lib/fixtures/store-v1 was written by kvx at
 * commit 6ea4b72 (tests/lib/fixtures/gen_store_v1.c says how), before the
 * catalog took over the index's records. The on-disk formats (shard files,
 * the LMDB records and their CRCs, STORE) must stay readable.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "lib/store.h"

static char fixture_copy[512];

/* A private copy of the fixture (a writer's recovery may touch it); git
 * keeps no empty directory, so staging/ is made here. */
static int copy_fixture(void **state)
{
    if (su_setup(state)) return -1;
    snprintf(fixture_copy, sizeof fixture_copy, "%s/store", su_root);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cp -r '%s/tests/lib/fixtures/store-v1' '%s' && mkdir -p '%s/staging' && chmod -R u+rwX,go-rwx '%s'",
             KVX_SOURCE_DIR, fixture_copy, fixture_copy, fixture_copy);
    return system(cmd) == 0 ? 0 : -1;
}

static void check_contents(kvx_store *s, uint64_t n_seqs)
{
    for (uint64_t seq = 0; seq < n_seqs; seq++) assert_int_equal(su_served_prefix(s, seq, 6), 6);
    assert_int_equal(su_served_prefix(s, 50, 6), 0);
    /* sequence 40's blocks were put without tokens: never served */
    uint32_t t[4 * SU_B];
    uint64_t h[4];
    su_tokens(t, 40, 4, 0);
    kvx_block_hashes(h, t, 4 * SU_B, SU_B);
    kvx_view v;
    size_t n = 9;
    assert_int_equal(kvx_store_prefix(&v, &n, s, t, 4 * SU_B, 1), 0);
    assert_int_equal(n, 0);
    assert_int_equal(kvx_store_get_hash(&v, s, h[2]), KVX_EUNVERIFIED);
    /* a block of sequence 3 by hash alone: exactly one verified holder */
    su_tokens(t, 3, 4, 0);
    kvx_block_hashes(h, t, 4 * SU_B, SU_B);
    assert_int_equal(kvx_store_get_hash(&v, s, h[3]), 0);
    uint8_t want[64];
    su_page(want, sizeof want, h[3]);
    assert_memory_equal(v.page, want, sizeof want);
    kvx_view_release(&v);
}

static void check_stats(kvx_store *s, uint64_t blocks, uint64_t shards)
{
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, blocks);
    assert_int_equal(st.shards, shards);
    assert_int_equal(st.unverified, 4);
    assert_int_equal(st.dropped_shards, 0);
    assert_int_equal(st.quarantined, 0);
    assert_true(st.hits >= 24); /* persisted by the writer of the fixture */
    assert_true(st.misses >= 6);
}

/* PROMISE: RECOVER-18 */
static void test_reader_serves_old_store(void **state)
{
    (void)state;
    kvx_store *s;
    assert_int_equal(kvx_store_open(&s, fixture_copy, NULL, KVX_STORE_READONLY), 0);
    check_stats(s, 76, 13);
    check_contents(s, 12);
    uint64_t bad = 99;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    assert_int_equal(bad, 0);
    kvx_store_close(s);
}

/* PROMISE: RECOVER-18 */
static void test_writer_keeps_and_extends_old_store(void **state)
{
    (void)state;
    kvx_store *s;
    kvx_geometry g = su_geometry();
    assert_int_equal(kvx_store_open(&s, fixture_copy, &g, 0), 0);
    check_stats(s, 76, 13); /* recovery dropped nothing */
    assert_int_equal(su_put_seq(s, 12, 6), 0);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, fixture_copy, &g, KVX_STORE_READONLY), 0);
    check_stats(s, 82, 14);
    check_contents(s, 13);
    kvx_store_close(s);
}

/* PROMISE: RECOVER-18 */
static void test_reindex_of_old_store(void **state)
{
    (void)state;
    assert_int_equal(kvx_store_reindex_dir(fixture_copy, 0), 0);
    kvx_store *s;
    assert_int_equal(kvx_store_open(&s, fixture_copy, NULL, KVX_STORE_READONLY), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.blocks, 82);
    assert_int_equal(st.quarantined, 0);
    check_contents(s, 13);
    kvx_store_close(s);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reader_serves_old_store),
        cmocka_unit_test(test_writer_keeps_and_extends_old_store),
        cmocka_unit_test(test_reindex_of_old_store),
    };
    return cmocka_run_group_tests_name("engine/compat", tests, copy_fixture, su_teardown);
}
