/*
 * gpu_cuda.c - io/gpu_cuda.c, the CUDA upload path, on a machine with a GPU:
 * the pool is cudaHostRegister'ed, fetched pages uploaded with
 * kvx_gpu_upload come back (kvx_gpu_copy_back) equal to the file, the
 * device page table holds exactly the device pointers, and a GPU warmup
 * delivers every page to the arena. Exits 77 (skipped) when kvx is built
 * without CUDA or no GPU is visible.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvx.h"
#include "lib/io.h"

#define N 29

static char path[512];

static kvx_shard *sh;

static int group_setup(void **state)
{
    (void)state;
    if (io_mkdtemp("test_gpu")) return -1;
    if (io_make_shard(path, sizeof path, io_tmpdir, "g.kvx", 4, N, 0)) return -1;
    return kvx_shard_open(&sh, path, 0);
}

static int group_teardown(void **state)
{
    (void)state;
    kvx_shard_close(sh);
    io_rm_rf(io_tmpdir);
    return 0;
}

static void test_upload(void **state)
{
    (void)state;
    kvx_pool_options po = KVX_POOL_OPTIONS_INIT;
    po.bytes = 4 << 20;
    po.gpu = 0;
    kvx_pool *p = NULL;
    assert_int_equal(kvx_pool_create(&p, &po), 0);
    kvx_pool_info info;
    assert_int_equal(kvx_pool_get_info(&info, p), 0);
    assert_int_equal(info.cuda_registered, 1);
    int node = -2;
    assert_int_equal(kvx_gpu_numa_node(&node, 0), 0);
    if (node >= 0) assert_int_equal(info.numa_node, node); /* AUTO picked the GPU's node */

    kvx_fetch *f = NULL;
    assert_int_equal(kvx_fetch_create(&f, p, NULL), 0);
    kvx_fetch_req r[N];
    kvx_fetch_result res[N];
    for (uint32_t i = 0; i < N; i++) r[i] = (kvx_fetch_req){sh, i};
    assert_int_equal(kvx_fetch_submit(f, r, N), 0);
    assert_int_equal(kvx_fetch_wait(f, res, N, -1), 0);

    kvx_gpu_options go = KVX_GPU_OPTIONS_INIT;
    go.arena_bytes = 8 << 20;
    go.streams = 3;
    kvx_gpu *g = NULL;
    assert_int_equal(kvx_gpu_create(&g, &go), 0);
    uint64_t dev[N], bytes[N];
    const void *src[N];
    for (uint32_t i = 0; i < N; i++) {
        assert_int_equal(res[i].status, 0);
        assert_int_equal(kvx_gpu_reserve(&dev[i], g, res[i].bytes), 0);
        assert_int_equal(dev[i] % 256, 0);
        src[i] = res[i].page;
        bytes[i] = res[i].bytes;
    }
    assert_int_equal(kvx_gpu_upload(g, dev, src, bytes, N), 0);
    assert_int_equal(kvx_gpu_sync(g), 0);
    uint64_t table;
    assert_int_equal(kvx_gpu_page_table(&table, g, dev, N), 0);
    uint64_t back_table[N];
    assert_int_equal(kvx_gpu_copy_back(back_table, g, table, sizeof back_table), 0);
    assert_memory_equal(back_table, dev, sizeof back_table);
    for (uint32_t i = 0; i < N; i++) {
        uint8_t *back = malloc(bytes[i]);
        assert_int_equal(kvx_gpu_copy_back(back, g, dev[i], bytes[i]), 0);
        assert_true(io_page_ok(back, 4, i, bytes[i]));
        free(back);
    }
    /* a range outside the arena is refused, not copied */
    assert_int_equal(kvx_gpu_copy_back(back_table, g, dev[0] - 4096, 8), KVX_EINVALID);
    uint64_t big;
    assert_int_equal(kvx_gpu_reserve(&big, g, 1ull << 40), KVX_ECAPACITY);
    /* near 2^64 the rounding to KVX_GPU_ALIGN wrapped to 0: "reserved" */
    assert_int_equal(kvx_gpu_reserve(&big, g, UINT64_MAX - 100), KVX_ECAPACITY);
    kvx_gpu_destroy(g);
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);
}

static void test_warmup_gpu(void **state)
{
    (void)state;
    uint64_t need;
    assert_int_equal(kvx_warmup_sink_bytes(&need, &sh, 1), 0);
    kvx_gpu_options go = KVX_GPU_OPTIONS_INIT;
    go.arena_bytes = need + 8 * N + 4096;
    kvx_gpu *g = NULL;
    assert_int_equal(kvx_gpu_create(&g, &go), 0);
    kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
    o.sink = KVX_SINK_GPU;
    o.gpu = g;
    o.chunk_bytes = 32768;
    o.queue_depth = 3;
    kvx_warmup *w = NULL;
    assert_int_equal(kvx_warmup_start(&w, &sh, 1, &o), 0);
    kvx_warmup_report rep;
    assert_int_equal(kvx_warmup_wait(&rep, w, -1), 0);
    assert_int_equal(rep.pages, N);
    assert_int_equal(rep.crc_failures, 0);
    assert_int_not_equal(rep.gpu_page_table, 0);
    const uint64_t *dp;
    size_t dn;
    assert_int_equal(kvx_warmup_device_pages(&dp, &dn, w), 0);
    assert_int_equal(dn, N);
    uint64_t table[N];
    assert_int_equal(kvx_gpu_copy_back(table, g, rep.gpu_page_table, sizeof table), 0);
    assert_memory_equal(table, dp, sizeof table);
    for (uint32_t i = 0; i < N; i++) {
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, sh, i), 0);
        uint8_t *back = malloc(e.bytes);
        assert_int_equal(kvx_gpu_copy_back(back, g, table[i], e.bytes), 0);
        assert_true(io_page_ok(back, 4, i, e.bytes));
        free(back);
    }
    kvx_warmup_report_free(&rep);
    kvx_warmup_destroy(w);
    kvx_gpu_destroy(g);
}

int main(int argc, char **argv)
{
    int n = 0;
    int rc = kvx_gpu_count(&n);
    if (rc == KVX_ENOCUDA) {
        fprintf(stderr, "io/gpu_cuda: skipped: %s\n", kvx_last_error());
        return 77;
    }
    if (n == 0) {
        fprintf(stderr, "io/gpu_cuda: skipped: no GPU visible\n");
        return 77;
    }
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_upload),
        cmocka_unit_test(test_warmup_gpu),
    };
    return cmocka_run_group_tests_name("io/gpu_cuda", tests, group_setup, group_teardown);
}
