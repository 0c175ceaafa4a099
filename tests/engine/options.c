/*
 * options.c - engine/store_options.c: kvx_store_options_init fills every
 * field as KVX_STORE_OPTIONS_INIT does, and a store created with it gets
 * the defaults kvx.h documents (64 GiB, 1 GiB shards; a shard size derived
 * from a capacity).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvx.h"
#include "lib/io.h"

#define JUNK 0xA5

static void test_store_init_is_macro(void **state)
{
    (void)state;
    kvx_store_options m = KVX_STORE_OPTIONS_INIT, o;
    memset(&o, JUNK, sizeof o);
    kvx_store_options_init(&o);
    assert_int_equal(o.version, KVX_STORE_OPTIONS_VERSION);
    assert_int_equal(o.version, m.version);
    assert_int_equal(o.geometry.num_layers, 0);
    assert_int_equal(o.geometry.kv_heads, 0);
    assert_int_equal(o.geometry.head_dim, 0);
    assert_int_equal(o.geometry.block_tokens, 0);
    assert_int_equal(o.geometry.quant, 0);
    assert_int_equal(o.geometry.model_signature, 0);
    assert_int_equal(o.capacity_bytes, m.capacity_bytes);
    assert_int_equal(o.capacity_bytes, 0);
    assert_int_equal(o.flags, 0);
    assert_int_equal(o.shard_bytes, 0);
    kvx_store_options_init(NULL);
}

static const kvx_geometry geom = {1, 2, 8, 4, KVX_QUANT_FP16, 0x5eed};

static void test_store_create_with_init(void **state)
{
    (void)state;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/store", io_tmpdir);
    kvx_store_options o;
    kvx_store_options_init(&o);
    o.geometry = geom;
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.capacity_bytes, (uint64_t)64 << 30); /* capacity_bytes 0 = 64 GiB */
    assert_int_equal(st.shard_bytes, (uint64_t)1 << 30);     /* 64 GiB / 64, clamped to 1 GiB */

    /* the store works: a block put and flushed is served */
    uint32_t tokens[4] = {11, 12, 13, 14};
    size_t page_bytes = (size_t)kvx_page_bytes(&geom, 4);
    uint8_t *page = calloc(1, page_bytes);
    assert_non_null(page);
    for (size_t i = 0; i < page_bytes; i += 2) page[i] = (uint8_t)i; /* finite f16 values */
    size_t added = 0;
    assert_int_equal(kvx_store_put(s, tokens, 4, page, 1, NULL, &added), 0);
    assert_int_equal(added, 1);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_view v;
    assert_int_equal(kvx_store_get_block(&v, s, tokens, 4), 0);
    assert_int_equal(v.page_bytes, page_bytes);
    assert_memory_equal(v.page, page, page_bytes);
    kvx_view_release(&v);
    kvx_store_close(s);
    free(page);

    /* with only the capacity set, the shard size still derives from it */
    snprintf(dir, sizeof dir, "%s/store_small", io_tmpdir);
    kvx_store_options_init(&o);
    o.geometry = geom;
    o.capacity_bytes = (uint64_t)64 << 20;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.capacity_bytes, (uint64_t)64 << 20);
    assert_int_equal(st.shard_bytes, (uint64_t)1 << 20); /* 64 MiB / 64 */
    kvx_store_close(s);

    /* the init'd options without a geometry are refused, not defaulted */
    snprintf(dir, sizeof dir, "%s/store_nogeom", io_tmpdir);
    kvx_store_options_init(&o);
    assert_int_not_equal(kvx_store_create(&s, dir, &o), 0);
}

static int group_setup(void **state)
{
    (void)state;
    return io_mkdtemp("test_options");
}

static int group_teardown(void **state)
{
    (void)state;
    io_rm_rf(io_tmpdir);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_init_is_macro),
        cmocka_unit_test(test_store_create_with_init),
    };
    return cmocka_run_group_tests_name("engine/options", tests, group_setup, group_teardown);
}
