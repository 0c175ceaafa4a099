/*
 * tests/engine/keyed_copies.c - two copies of a key are "the same page" only when
 * their bytes are equal (engine/store_commit.c: st_same_bytes), never by
 * length and CRC-32, which four chosen bytes forge.
 *
 * Before: a key deleted and put again with a page of equal length and
 * equal CRC-32 answered its OLD page after reindex (the old copy was kept
 * as "a second copy of the newest", and a lookup serves the first sound
 * copy).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/store.h"

static int get_page(kvx_store *s, const kvx_key *k, uint8_t *out, size_t n)
{
    kvx_view v;
    int st = -1;
    assert_int_equal(kvx_store_keyed_get(&v, &st, s, k, 1), 0);
    if (st == 0) {
        assert_int_equal(v.page_bytes, n);
        memcpy(out, v.page, n);
    }
    kvx_views_release(&v, 1);
    return st;
}

/* PROMISE: KEYED-9 */
static void test_replaced_page_of_equal_crc_not_served(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/forged", su_root);
    su_rm_rf(dir);
    kvx_store *s = su_create(dir, (su_spec){.page_bytes = 8192, .capacity = 8 << 20});
    enum { N = 3000 };
    static uint8_t old_page[N], new_page[N], got[N];
    su_page(old_page, N, 1);
    su_page(new_page, N, 2);
    su_forge_crc(new_page, N, kvx_crc32(0, old_page, N)); /* equal length, equal CRC-32, other bytes */
    assert_true(memcmp(old_page, new_page, N) != 0);
    kvx_key k = {"the-key", 7};
    const void *pp[1] = {old_page};
    size_t len = N;
    assert_int_equal(kvx_store_keyed_put(s, NULL, &k, pp, &len, 1, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_keyed_delete(s, &k, 1, NULL), 0);
    pp[0] = new_page;
    assert_int_equal(kvx_store_keyed_put(s, NULL, &k, pp, &len, 1, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(get_page(s, &k, got, N), 0);
    assert_memory_equal(got, new_page, N);
    /* the shards alone: still the new page, never the replaced one */
    for (int round = 0; round < 2; round++) {
        assert_int_equal(kvx_store_reindex(s), 0);
        assert_int_equal(get_page(s, &k, got, N), 0);
        assert_memory_equal(got, new_page, N);
    }
    kvx_store_close(s);
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(get_page(s, &k, got, N), 0);
    assert_memory_equal(got, new_page, N);
    kvx_store_close(s);
    su_rm_rf(dir);
}

/* Two batches stored the same bytes under one key: the older copy is a
 * true second copy, still indexed, and serves when the newer rots. */
/* PROMISE: KEYED-9 */
static void test_true_second_copy_still_serves(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/second", su_root);
    su_rm_rf(dir);
    kvx_store *s = su_create(dir, (su_spec){.page_bytes = 8192, .capacity = 8 << 20});
    enum { N = 3000 };
    static uint8_t page[N], got[N];
    su_page(page, N, 3);
    kvx_key k = {"twice", 5};
    const void *pp[1] = {page};
    size_t len = N;
    kvx_store_batch *b1, *b2;
    assert_int_equal(kvx_store_batch_create(&b1, s), 0);
    assert_int_equal(kvx_store_batch_create(&b2, s), 0);
    assert_int_equal(kvx_store_keyed_put(s, b1, &k, pp, &len, 1, NULL), 0);
    assert_int_equal(kvx_store_keyed_put(s, b2, &k, pp, &len, 1, NULL), 0);
    assert_int_equal(kvx_store_batch_flush(b1), 0);
    assert_int_equal(kvx_store_batch_flush(b2), 0);
    kvx_store_batch_destroy(b1);
    kvx_store_batch_destroy(b2);
    assert_int_equal(kvx_store_reindex(s), 0);
    assert_int_equal(get_page(s, &k, got, N), 0);
    assert_memory_equal(got, page, N);
    kvx_store_close(s);
    /* the newer copy rots: the older, the very same bytes, serves */
    char names[8][64], path[600];
    size_t n = su_list_names(dir, "shards", names, 8);
    assert_int_equal(n, 2);
    snprintf(path, sizeof path, "%s/shards/%s", dir, names[1]); /* sorted: the newer generation */
    assert_int_equal(su_flip_page_byte(path, 0), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    assert_int_equal(kvx_store_reindex(s), 0);
    assert_int_equal(get_page(s, &k, got, N), 0);
    assert_memory_equal(got, page, N);
    kvx_store_close(s);
    su_rm_rf(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_replaced_page_of_equal_crc_not_served),
        cmocka_unit_test(test_true_second_copy_still_serves),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
