/*
 * options.c - format/options.c: kvx_shard_writer_options_init fills every
 * field as KVX_SHARD_WRITER_OPTIONS_INIT does (the destination is filled
 * with junk first, so a field it forgot shows), and a writer created with
 * the init'd options works with the documented defaults.
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

static void test_shard_writer_init_is_macro(void **state)
{
    (void)state;
    kvx_shard_writer_options m = KVX_SHARD_WRITER_OPTIONS_INIT, o;
    memset(&o, JUNK, sizeof o);
    kvx_shard_writer_options_init(&o);
    assert_int_equal(o.version, KVX_SHARD_WRITER_OPTIONS_VERSION);
    assert_int_equal(o.version, m.version);
    assert_int_equal(o.geometry.num_layers, 0);
    assert_int_equal(o.geometry.kv_heads, 0);
    assert_int_equal(o.geometry.head_dim, 0);
    assert_int_equal(o.geometry.block_tokens, 0);
    assert_int_equal(o.geometry.quant, 0);
    assert_int_equal(o.geometry.model_signature, 0);
    assert_int_equal(o.shard_id, m.shard_id);
    assert_int_equal(o.max_entries, m.max_entries);
    assert_int_equal(o.flags, m.flags);
    assert_null(o.spectral);
    assert_null(o.staging_dir);
    kvx_shard_writer_options_init(NULL);
}

static const kvx_geometry geom = {1, 2, 8, 4, KVX_QUANT_FP16, 0x5eed};

/* A shard of n full blocks written from init'd writer options. */
static void write_shard(const char *path, uint32_t n)
{
    kvx_shard_writer_options o;
    kvx_shard_writer_options_init(&o);
    o.geometry = geom;
    o.shard_id = 7;
    o.max_entries = n;
    o.flags = KVX_FLAG_HASHES;
    kvx_shard_writer *w = NULL;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    size_t page_bytes = (size_t)kvx_page_bytes(&geom, 4);
    uint8_t *page = calloc(1, page_bytes);
    assert_non_null(page);
    for (uint32_t i = 0; i < n; i++) {
        memset(page, (int)i + 1, page_bytes);
        uint32_t tokens[4] = {i, i + 1, i + 2, i + 3};
        kvx_entry_in e = {(uint16_t)i, 0, 4, page, kvx_block_hash(0, tokens, 4), 0, NULL, NULL, NULL, NULL, 0, 0};
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    }
    free(page);
    assert_int_equal(kvx_shard_writer_seal(w), 0);
}

static void test_shard_writer_create_with_init(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/w.kvx", io_tmpdir);
    write_shard(path, 3);
    kvx_shard *sh = NULL;
    assert_int_equal(kvx_shard_open(&sh, path, KVX_OPEN_VERIFY_PAGES), 0);
    const kvx_shard_info *in = kvx_shard_get_info(sh);
    assert_int_equal(in->num_blocks, 3);
    assert_int_equal(in->shard_id, 7);
    assert_int_equal(in->geometry.model_signature, geom.model_signature);
    assert_int_equal(in->spectral_dim, 0); /* spectral NULL: no bundle */
    assert_string_equal(kvx_shard_path(sh), path);
    kvx_shard_close(sh);
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
        cmocka_unit_test(test_shard_writer_init_is_macro),
        cmocka_unit_test(test_shard_writer_create_with_init),
    };
    return cmocka_run_group_tests_name("format/options", tests, group_setup, group_teardown);
}
