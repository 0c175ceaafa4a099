/*
 * options.c - io/options.c: kvx_pool_options_init, kvx_fetch_options_init,
 * kvx_gpu_options_init and kvx_warmup_options_init fill every field as
 * their *_INIT macros do, and the create functions given them work with
 * the documented defaults.
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

static void test_pool_init_is_macro(void **state)
{
    (void)state;
    kvx_pool_options m = KVX_POOL_OPTIONS_INIT, o;
    memset(&o, JUNK, sizeof o);
    kvx_pool_options_init(&o);
    assert_int_equal(o.version, KVX_POOL_OPTIONS_VERSION);
    assert_int_equal(o.version, m.version);
    assert_int_equal(o.bytes, 0);
    assert_int_equal(o.numa_node, KVX_POOL_NODE_AUTO);
    assert_int_equal(o.gpu, m.gpu);
    assert_int_equal(o.gpu, 0);
    assert_int_equal(o.flags, 0);
    kvx_pool_options_init(NULL);
}

static void test_fetch_init_is_macro(void **state)
{
    (void)state;
    kvx_fetch_options o;
    memset(&o, JUNK, sizeof o);
    kvx_fetch_options_init(&o);
    assert_int_equal(o.version, KVX_FETCH_OPTIONS_VERSION);
    assert_int_equal(o.io_mode, KVX_IO_AUTO);
    assert_int_equal(o.queue_depth, 0);
    assert_int_equal(o.threads, 0);
    assert_int_equal(o.max_read_bytes, 0);
    assert_int_equal(o.flags, 0);
    kvx_fetch_options_init(NULL);
}

static void test_gpu_init_is_macro(void **state)
{
    (void)state;
    kvx_gpu_options o;
    memset(&o, JUNK, sizeof o);
    kvx_gpu_options_init(&o);
    assert_int_equal(o.version, KVX_GPU_OPTIONS_VERSION);
    assert_int_equal(o.device, 0);
    assert_int_equal(o.arena_bytes, 0);
    assert_int_equal(o.streams, 0);
    kvx_gpu_options_init(NULL);
}

static void test_warmup_init_is_macro(void **state)
{
    (void)state;
    kvx_warmup_options o;
    memset(&o, JUNK, sizeof o);
    kvx_warmup_options_init(&o);
    assert_int_equal(o.version, KVX_WARMUP_OPTIONS_VERSION);
    assert_int_equal(o.io_mode, KVX_IO_AUTO);
    assert_int_equal(o.flags, 0);
    assert_int_equal(o.queue_depth, 0);
    assert_int_equal(o.chunk_bytes, 0);
    assert_int_equal(o.numa_node, KVX_POOL_NODE_AUTO);
    assert_int_equal(o.sink, KVX_SINK_DISCARD);
    assert_null(o.host_buf);
    assert_int_equal(o.host_buf_bytes, 0);
    assert_null(o.gpu);
    assert_null(o.progress);
    assert_null(o.progress_ctx);
    kvx_warmup_options_init(NULL);
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

static void test_pool_fetch_create_with_init(void **state)
{
    (void)state;
    kvx_pool_options po;
    kvx_pool_options_init(&po);
    kvx_pool *p = NULL;
    int rc = kvx_pool_create(&p, &po);
    if (rc == KVX_EMEMLOCK) {
        /* RLIMIT_MEMLOCK below the default 64 MiB: the defaults are still
         * what is checked, only unlocked */
        po.flags |= KVX_POOL_NO_MLOCK | KVX_POOL_NO_REGISTER;
        rc = kvx_pool_create(&p, &po);
    }
    assert_int_equal(rc, 0);
    kvx_pool_info info;
    assert_int_equal(kvx_pool_get_info(&info, p), 0);
    assert_int_equal(info.bytes, (uint64_t)64 << 20); /* bytes 0 = 64 MiB */
    assert_int_equal(info.free_bytes, info.bytes);

    char path[512];
    snprintf(path, sizeof path, "%s/f.kvx", io_tmpdir);
    write_shard(path, 2);
    kvx_shard *sh = NULL;
    assert_int_equal(kvx_shard_open(&sh, path, 0), 0);

    kvx_fetch_options fo;
    kvx_fetch_options_init(&fo);
    kvx_fetch *f = NULL;
    assert_int_equal(kvx_fetch_create(&f, p, &fo), 0);
    int mode = kvx_fetch_mode(f);
    assert_true(mode == KVX_IO_URING || mode == KVX_IO_PREAD); /* AUTO resolved to one */
    kvx_fetch_req reqs[2] = {{sh, 0}, {sh, 1}};
    kvx_fetch_result res[2];
    assert_int_equal(kvx_fetch_submit(f, reqs, 2), 0);
    assert_int_equal(kvx_fetch_wait(f, res, 2, -1), 0);
    for (int i = 0; i < 2; i++) {
        assert_int_equal(res[i].status, 0);
        assert_int_equal(((const uint8_t *)res[i].page)[0], i + 1);
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, sh, (uint32_t)i), 0);
        assert_int_equal(res[i].crc32, e.crc32); /* verified by default (NO_VERIFY reports 0) */
    }
    kvx_fetch_release(f);
    kvx_fetch_destroy(f);
    kvx_shard_close(sh);
    kvx_pool_destroy(p);
}

static void test_warmup_run_with_init(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/u.kvx", io_tmpdir);
    write_shard(path, 5);
    kvx_shard *sh = NULL;
    assert_int_equal(kvx_shard_open(&sh, path, 0), 0);
    kvx_warmup_options o;
    kvx_warmup_options_init(&o);
    kvx_warmup_report r;
    assert_int_equal(kvx_warmup_run(&r, &sh, 1, &o), 0);
    assert_int_equal(r.pages, 5);
    assert_int_equal(r.bytes, 5 * kvx_page_bytes(&geom, 4));
    assert_int_equal(r.crc_failures, 0);
    assert_int_equal(r.n_failures, 0);
    assert_int_not_equal(r.checksum, 0); /* KVX_SINK_DISCARD reports the sum of CRCs */
    kvx_warmup_report_free(&r);
    kvx_shard_close(sh);
}

static void test_gpu_create_with_init(void **state)
{
    (void)state;
    kvx_gpu_options o;
    kvx_gpu_options_init(&o);
    kvx_gpu *g = NULL;
    int rc = kvx_gpu_create(&g, &o);
    if (rc == KVX_ENOCUDA || rc == KVX_ENOGPU) {
        assert_null(g);
        skip(); /* no CUDA build or no GPU here: the defaults are checked where there is one */
    }
    assert_int_equal(rc, 0);
    uint64_t dev = 0;
    /* arena_bytes 0 = 256 MiB: all of it can be reserved, one byte more cannot */
    assert_int_equal(kvx_gpu_reserve(&dev, g, (uint64_t)256 << 20), 0);
    assert_int_equal(kvx_gpu_reserve(&dev, g, 256), KVX_ECAPACITY);
    kvx_gpu_destroy(g);
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
        cmocka_unit_test(test_pool_init_is_macro),
        cmocka_unit_test(test_fetch_init_is_macro),
        cmocka_unit_test(test_gpu_init_is_macro),
        cmocka_unit_test(test_warmup_init_is_macro),
        cmocka_unit_test(test_pool_fetch_create_with_init),
        cmocka_unit_test(test_warmup_run_with_init),
        cmocka_unit_test(test_gpu_create_with_init),
    };
    return cmocka_run_group_tests_name("io/options", tests, group_setup, group_teardown);
}
