/*
 * gpu_nocuda.c - io/gpu_nocuda.c: without CUDA every GPU call answers
 * KVX_ENOCUDA (or is a no-op), never crashes, never touches the pointer it
 * is given.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvx.h"
#include "lib/fault.h"
#include "lib/io.h"

/* PROMISE: IO-15 */
static void test_gpu_nocuda_answers(void **state)
{
    (void)state;
    int n = 5;
    int rc = kvx_gpu_count(&n);
    if (rc != KVX_ENOCUDA) skip(); /* a CUDA build */
    assert_int_equal(kvx_gpu_count(NULL), KVX_ENOCUDA);
    int node = 5;
    rc = kvx_gpu_numa_node(&node, 0);
    assert_true(rc == KVX_ENOCUDA || (rc == 0 && node == -1));
    kvx_gpu *g = (kvx_gpu *)0x1;
    kvx_gpu_options go = KVX_GPU_OPTIONS_INIT;
    assert_int_equal(kvx_gpu_create(&g, &go), KVX_ENOCUDA);
    assert_int_equal(kvx_gpu_create(&g, NULL), KVX_ENOCUDA);
    assert_int_equal(kvx_gpu_create(NULL, NULL), KVX_ENOCUDA);
    kvx_gpu_destroy(NULL);
    kvx_gpu_reset(NULL);
    uint64_t dev = 0;
    assert_int_equal(kvx_gpu_reserve(&dev, NULL, 4096), KVX_ENOCUDA);
    assert_int_equal(kvx_gpu_reserve(NULL, NULL, 0), KVX_ENOCUDA);
    assert_int_equal(kvx_gpu_upload(NULL, NULL, NULL, NULL, 3), KVX_ENOCUDA);
    assert_int_equal(kvx_gpu_sync(NULL), KVX_ENOCUDA);
    assert_int_equal(kvx_gpu_page_table(&dev, NULL, NULL, 9), KVX_ENOCUDA);
    char b[8];
    assert_int_equal(kvx_gpu_copy_back(b, NULL, 0, 8), KVX_ENOCUDA);
    assert_int_equal(kvx_gpu_copy_back(NULL, NULL, 0, 0), KVX_ENOCUDA);
    /* a GPU sink, with no kvx_gpu or a pointer that is not one: KVX_ENOCUDA, never touched */
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    kvx_warmup_options wo = KVX_WARMUP_OPTIONS_INIT;
    wo.sink = KVX_SINK_GPU;
    kvx_warmup_report rep;
    kvx_warmup *w = NULL;
    assert_int_equal(kvx_warmup_run(&rep, &s, 1, &wo), KVX_ENOCUDA);
    assert_int_equal(kvx_warmup_start(&w, &s, 1, &wo), KVX_ENOCUDA);
    wo.gpu = (kvx_gpu *)(uintptr_t)0xdead0000;
    assert_int_equal(kvx_warmup_run(&rep, &s, 1, &wo), KVX_ENOCUDA);
    assert_int_equal(kvx_warmup_start(&w, &s, 1, &wo), KVX_ENOCUDA);
    kvx_shard_close(s);
    /* a pool asking for a GPU still works without CUDA */
    kvx_pool_options po = KVX_POOL_OPTIONS_INIT;
    po.bytes = 1 << 20;
    po.gpu = 3;
    kvx_pool *p = NULL;
    assert_int_equal(kvx_pool_create(&p, &po), 0);
    kvx_pool_info info;
    assert_int_equal(kvx_pool_get_info(&info, p), 0);
    assert_int_equal(info.cuda_registered, 0);
    kvx_pool_destroy(p);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_gpu_nocuda_answers, os_reset),
    };
    return cmocka_run_group_tests_name("io/gpu_nocuda", tests, io_base_setup, io_base_teardown);
}
