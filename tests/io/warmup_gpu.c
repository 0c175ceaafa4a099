/*
 * tests/io/warmup_gpu.c - the GPU path on a real GPU (bench/gpu_check.sh runs
 * it): every warmup path (STAGING, STAGING_GPU_CRC, MAPPED; io_uring and
 * pread) delivers pages equal to the file with a page table of exactly
 * their addresses, on KV-sized pages (2 MiB, 256 CRC chunks each) and
 * small odd ones; a rotten page is never delivered on any path (slot 0,
 * its arena range as it was); the spectral kernel equals
 * kvx_spectral_apply on the CPU within max|diff| / max|h| <= 1e-5 (f32)
 * and 1e-2 (bf16, f16), strides and the caller's stream respected.
 * Exits 77 (skipped) when kvx is built without CUDA or no GPU is visible;
 * io/gpu checks the same logic without a GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/io.h"
#include "kvx.h"

#ifdef KVX_WITH_CUDA
#include <cuda_runtime_api.h>

#define NS 40 /* small pages, 1..16 KiB */
#define NB 12 /* 2 MiB pages */
#define BIG_ID 9

static char small_path[512], big_path[512];
static kvx_shard *small_sh, *big_sh;

/* A shard of n pages of 2 MiB (FP16, L 32, Hkv 8, D 128, 16 tokens),
 * bytes io_byte(shard_id, entry, k). */
static int make_big(char *out, size_t cap, uint32_t n)
{
    snprintf(out, cap, "%s/big.kvx", io_tmpdir);
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    kvx_geometry g = {32, 8, 128, 16, KVX_QUANT_FP16, 0x77};
    o.geometry = g;
    o.shard_id = BIG_ID;
    o.max_entries = n;
    kvx_shard_writer *w = NULL;
    int rc = kvx_shard_writer_create(&w, out, &o);
    if (rc) return rc;
    uint64_t bytes = kvx_page_bytes(&g, 16);
    uint8_t *page = malloc(bytes);
    for (uint32_t i = 0; i < n && !rc; i++) {
        kvx_entry_in e = {0};
        e.radix_block = (uint16_t)i;
        e.token_count = 16;
        io_fill(page, BIG_ID, i, bytes);
        e.page = page;
        rc = kvx_shard_writer_add(w, &e);
    }
    free(page);
    if (rc) {
        kvx_shard_writer_abort(w);
        return rc;
    }
    return kvx_shard_writer_seal(w);
}

static int group_setup(void **state)
{
    (void)state;
    if (io_mkdtemp("io_warmup_gpu")) return -1;
    if (io_make_shard(small_path, sizeof small_path, io_tmpdir, "s.kvx", 4, NS, 0)) return -1;
    if (make_big(big_path, sizeof big_path, NB)) return -1;
    if (kvx_shard_open(&small_sh, small_path, 0)) return -1;
    return kvx_shard_open(&big_sh, big_path, 0);
}

static int group_teardown(void **state)
{
    (void)state;
    kvx_shard_close(small_sh);
    kvx_shard_close(big_sh);
    io_rm_rf(io_tmpdir);
    return 0;
}

static const int paths[3] = {KVX_GPU_PATH_STAGING, KVX_GPU_PATH_STAGING_GPU_CRC, KVX_GPU_PATH_MAPPED};
static const int modes[2] = {KVX_IO_URING, KVX_IO_PREAD};

/* Warms s up to a fresh arena filled with 0xA5 by gpu_path, then checks:
 * each page but `bad` equal to the file at its place, `bad` not delivered
 * and its range still 0xA5, the page table equal to the device pages. */
static void warm_and_check(kvx_shard *s, uint32_t shard_id, int gpu_path, int io_mode, int bad)
{
    uint32_t n = kvx_shard_get_info(s)->num_blocks;
    uint64_t need;
    assert_int_equal(kvx_warmup_sink_bytes(&need, &s, 1), 0);
    kvx_gpu_options go = KVX_GPU_OPTIONS_INIT;
    go.arena_bytes = need + 8ull * n + 4096;
    kvx_gpu *g = NULL;
    assert_int_equal(kvx_gpu_create(&g, &go), 0);
    uint64_t base;
    assert_int_equal(kvx_gpu_reserve(&base, g, go.arena_bytes), 0);
    assert_int_equal(cudaMemset((void *)(uintptr_t)base, 0xA5, go.arena_bytes), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess); /* before the warmup's streams (non-blocking) copy */
    kvx_gpu_reset(g);
    kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
    o.sink = KVX_SINK_GPU;
    o.gpu = g;
    o.io_mode = io_mode;
    o.gpu_path = gpu_path;
    o.queue_depth = 4;
    kvx_warmup *w = NULL;
    assert_int_equal(kvx_warmup_start(&w, &s, 1, &o), 0);
    kvx_warmup_report rep;
    int rc = kvx_warmup_wait(&rep, w, -1);
    if (rc) fail_msg("path %s mode %d: %s", kvx_gpu_path_name(gpu_path), io_mode, kvx_last_error());
    kvx_warmup_stages st;
    st.version = KVX_WARMUP_STAGES_VERSION;
    assert_int_equal(kvx_warmup_get_stages(&st, w), 0);
    assert_int_equal(st.gpu_path, gpu_path);
    if (st.fallback) /* this driver would not register the mapping: staging did the work */
        fprintf(stderr, "note: %s fell back to staging: %s\n", kvx_gpu_path_name(gpu_path), st.fallback_why);
    assert_int_equal(rep.pages, bad >= 0 ? n - 1 : n);
    assert_int_equal(rep.crc_failures, bad >= 0 ? 1 : 0);
    const uint64_t *dp;
    size_t dn;
    assert_int_equal(kvx_warmup_device_pages(&dp, &dn, w), 0);
    uint64_t *table = malloc(8 * dn);
    assert_int_equal(kvx_gpu_copy_back(table, g, rep.gpu_page_table, 8 * dn), 0);
    assert_memory_equal(table, dp, 8 * dn);
    uint64_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, s, i), 0);
        off = (off + 255) & ~(uint64_t)255;
        uint8_t *back = malloc(e.bytes);
        assert_int_equal(kvx_gpu_copy_back(back, g, base + off, e.bytes), 0);
        if ((int)i == bad) {
            assert_int_equal(dp[i], 0);
            for (uint64_t k = 0; k < e.bytes; k++)
                if (back[k] != 0xA5)
                    fail_msg("%s: the bad page's bytes reached the arena", kvx_gpu_path_name(gpu_path));
        } else {
            assert_int_equal(dp[i], base + off);
            if (!io_page_ok(back, shard_id, i, e.bytes))
                fail_msg("%s mode %d: entry %u differs from the file", kvx_gpu_path_name(gpu_path), io_mode, i);
        }
        free(back);
        off += e.bytes;
    }
    free(table);
    kvx_warmup_report_free(&rep);
    kvx_warmup_destroy(w);
    kvx_gpu_destroy(g);
}

/* PROMISE: IO-17 */
static void test_every_path_on_gpu(void **state)
{
    (void)state;
    for (int p = 0; p < 3; p++)
        for (int m = 0; m < 2; m++) {
            warm_and_check(small_sh, 4, paths[p], modes[m], -1);
            warm_and_check(big_sh, BIG_ID, paths[p], modes[m], -1);
        }
}

/* PROMISE: IO-11, IO-18 */
static void test_rotten_page_on_gpu(void **state)
{
    (void)state;
    char p2[512];
    kvx_shard *s = NULL;
    assert_int_equal(io_open_copy(&s, p2, sizeof p2, big_path, "rot.kvx"), 0);
    kvx_entry e;
    assert_int_equal(kvx_shard_entry(&e, s, 5), 0);
    assert_int_equal(io_flip_byte(p2, e.offset + e.bytes - 3, 0x08), 0);
    for (int p = 0; p < 3; p++)
        for (int m = 0; m < 2; m++) warm_and_check(s, BIG_ID, paths[p], modes[m], 5);
    kvx_shard_close(s);
    unlink(p2);
}

/* --- spectral steering --- */

typedef struct sp_case {
    uint32_t n, d, r, stride;
} sp_case;

static float to_f(const void *h, uint64_t i, int dtype)
{
    if (dtype == KVX_GPU_F32) return ((const float *)h)[i];
    uint16_t v = ((const uint16_t *)h)[i];
    return dtype == KVX_GPU_BF16 ? kvx_bf16_to_f32(v) : kvx_f16_to_f32(v);
}

static void from_f(void *h, uint64_t i, int dtype, float x)
{
    if (dtype == KVX_GPU_F32)
        ((float *)h)[i] = x;
    else
        ((uint16_t *)h)[i] = dtype == KVX_GPU_BF16 ? kvx_f32_to_bf16(x) : kvx_f32_to_f16(x);
}

/* PROMISE: IO-22 */
static void test_spectral_kernel_vs_cpu(void **state)
{
    (void)state;
    const sp_case cases[] = {{77, 128, 1, 128}, {300, 4096, 64, 4096}, {65, 8192, 16, 8200}, {33, 1000, 7, 1003}};
    const int dtypes[3] = {KVX_GPU_F32, KVX_GPU_BF16, KVX_GPU_F16};
    const double tol[3] = {1e-5, 1e-2, 1e-2};
    cudaStream_t stream;
    assert_int_equal(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        sp_case k = cases[c];
        /* two cartridges of three layers; the psi of a unit-ish basis */
        uint64_t per = (uint64_t)k.d * k.r;
        float *psi = malloc(sizeof(float) * per * 3 * 2);
        for (uint64_t i = 0; i < per * 3 * 2; i++)
            psi[i] = (float)sin((double)(i % 9973) * 1.7 + (double)c) / sqrtf((float)k.d);
        uint32_t ids[2] = {2, 7};
        kvx_spectral b = {2, 20, 3, k.d, k.r, ids, psi};
        kvx_gpu_spectral *sp = NULL;
        assert_int_equal(kvx_gpu_spectral_create(&sp, 0, &b, 7), 0);
        for (int t = 0; t < 3; t++) {
            size_t es = dtypes[t] == KVX_GPU_F32 ? 4 : 2;
            uint64_t elems = (uint64_t)k.n * k.stride;
            uint8_t *h = malloc(es * elems), *back = malloc(es * elems);
            for (uint64_t i = 0; i < elems; i++) from_f(h, i, dtypes[t], (float)cos((double)i * 0.013) * 3.0f);
            void *dh = NULL;
            assert_int_equal(cudaMalloc(&dh, es * elems), cudaSuccess);
            assert_int_equal(cudaMemcpy(dh, h, es * elems, cudaMemcpyHostToDevice), cudaSuccess);
            assert_int_equal(
                kvx_gpu_spectral_apply(sp, 21, (uint64_t)(uintptr_t)dh, k.n, k.stride, dtypes[t], 0.6f, stream), 0);
            assert_int_equal(cudaStreamSynchronize(stream), cudaSuccess);
            assert_int_equal(cudaMemcpy(back, dh, es * elems, cudaMemcpyDeviceToHost), cudaSuccess);
            double maxd = 0, maxh = 0;
            float *x = malloc(sizeof(float) * k.d);
            for (uint32_t i = 0; i < k.n; i++) {
                for (uint32_t j = 0; j < k.d; j++) x[j] = to_f(h, (uint64_t)i * k.stride + j, dtypes[t]);
                kvx_spectral_apply(x, psi + per * 3 + per * 1, k.d, k.r, 0.6f); /* cartridge 7, layer 21 */
                for (uint32_t j = 0; j < k.d; j++) {
                    maxd = fmax(maxd, fabs((double)to_f(back, (uint64_t)i * k.stride + j, dtypes[t]) - x[j]));
                    maxh = fmax(maxh, fabs((double)x[j]));
                }
                /* the bytes between rows are not touched */
                assert_memory_equal(back + es * ((uint64_t)i * k.stride + k.d), h + es * ((uint64_t)i * k.stride + k.d),
                                    es * (k.stride - k.d));
            }
            if (maxd / maxh > tol[t])
                fail_msg("n %u d %u r %u dtype %d: max|diff|/max|h| = %g > %g", k.n, k.d, k.r, dtypes[t], maxd / maxh,
                         tol[t]);
            printf("spectral n %u d %u r %u dtype %d: max|diff|/max|h| %.3g\n", k.n, k.d, k.r, dtypes[t], maxd / maxh);
            free(x);
            cudaFree(dh);
            free(h);
            free(back);
        }
        kvx_gpu_spectral_destroy(sp);
        free(psi);
    }
    cudaStreamDestroy(stream);
}
#endif

int main(void)
{
    int n = 0;
    int rc = kvx_gpu_count(&n);
    if (rc == KVX_ENOCUDA) {
        fprintf(stderr, "io/warmup_gpu: skipped: %s\n", kvx_last_error());
        return 77;
    }
    if (n == 0) {
        fprintf(stderr, "io/warmup_gpu: skipped: no GPU visible\n");
        return 77;
    }
#ifdef KVX_WITH_CUDA
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_path_on_gpu),
        cmocka_unit_test(test_rotten_page_on_gpu),
        cmocka_unit_test(test_spectral_kernel_vs_cpu),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
#else
    return 77;
#endif
}
