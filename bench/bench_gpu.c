/*
 * bench_gpu.c - the GPU upload check that bench/gpu_check.sh runs on a
 * GPU machine: writes a shard of 2 MiB pages, warms it into a device
 * arena (kvx_warmup_run, KVX_SINK_GPU) from the page cache and cold
 * (O_DIRECT), copies every page back and compares it with the file, checks
 * the device page table, and times the same bytes with a plain cudaMemcpy
 * from pinned memory (the physical reference for host-to-device).
 *
 * usage: bench_gpu [DIR=/tmp] [MiB=1024]
 * Without CUDA in the build it says so and exits 77; without a GPU, 77 too.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_common.h"
#include "io_bench_util.h"
#include "kvx.h"

#ifdef KVX_WITH_CUDA
#include <cuda_runtime_api.h>

static uint32_t tok16(uint32_t i)
{
    (void)i;
    return 16; /* 2 MiB per page at L32 Hkv8 D128 FP16 */
}
#endif

int main(int argc, char **argv)
{
    int ngpu = 0;
    int rc = kvx_gpu_count(&ngpu);
    if (rc == KVX_ENOCUDA) {
        printf("bench_gpu: %s\n", kvx_last_error());
        return 77;
    }
    if (ngpu == 0) {
        printf("bench_gpu: no GPU visible\n");
        return 77;
    }
#ifdef KVX_WITH_CUDA
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    uint64_t mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 1024;
    uint32_t n = (uint32_t)(mib / 2);
    char path[600];
    snprintf(path, sizeof path, "%s/bench_gpu.kvx", dir);
    kvx_geometry geo = {32, 8, 128, 16, KVX_QUANT_FP16, 1};
    uint64_t rng = 0x243F6A8885A308D3ull;
    if ((rc = kvx_bench_write_shard(path, geo, 7, n, tok16, &rng))) {
        fprintf(stderr, "write: %s\n", kvx_last_error());
        return 1;
    }
    kvx_shard *s;
    if ((rc = kvx_shard_open(&s, path, 0))) {
        fprintf(stderr, "open: %s\n", kvx_last_error());
        return 1;
    }
    uint64_t need;
    kvx_warmup_sink_bytes(&need, &s, 1);
    kvx_gpu_options go = KVX_GPU_OPTIONS_INIT;
    go.arena_bytes = need + 8ull * n + (1 << 20);
    kvx_gpu *g;
    if ((rc = kvx_gpu_create(&g, &go))) {
        fprintf(stderr, "gpu: %s\n", kvx_last_error());
        return 1;
    }
    int node = -1;
    kvx_gpu_numa_node(&node, 0);

    double gbps[2] = {0, 0};
    uint64_t bad = 0, table_bad = 0, good_pages = 0;
    for (int pass = 0; pass < 2; pass++) { /* 0: warm page cache, 1: cold O_DIRECT */
        if (pass == 1) kvx_bench_drop_cache(path);
        else kvx_bench_warm_cache(path);
        kvx_gpu_reset(g);
        kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
        o.sink = KVX_SINK_GPU;
        o.gpu = g;
        o.queue_depth = 16;
        o.flags = pass == 0 ? KVX_WARMUP_BUFFERED : 0;
        kvx_warmup *w;
        if ((rc = kvx_warmup_start(&w, &s, 1, &o))) {
            fprintf(stderr, "warmup: %s\n", kvx_last_error());
            return 1;
        }
        kvx_warmup_report rep;
        if ((rc = kvx_warmup_wait(&rep, w, -1))) {
            fprintf(stderr, "warmup: %s\n", kvx_last_error());
            return 1;
        }
        gbps[pass] = rep.gbps;
        good_pages = rep.pages;
        if (pass == 1) {
            /* verify: every page copied back equals the file; the table matches */
            const uint64_t *dp;
            size_t dn;
            kvx_warmup_device_pages(&dp, &dn, w);
            uint64_t *table = malloc(8 * dn);
            kvx_gpu_copy_back(table, g, rep.gpu_page_table, 8 * dn);
            int fd = open(path, O_RDONLY);
            uint8_t *a = malloc(2 << 20), *b = malloc(2 << 20);
            for (uint32_t i = 0; i < dn; i++) {
                if (table[i] != dp[i] || table[i] == 0) table_bad++;
                kvx_entry e;
                kvx_shard_entry(&e, s, i);
                if (pread(fd, a, e.bytes, (off_t)e.offset) != (ssize_t)e.bytes ||
                    kvx_gpu_copy_back(b, g, dp[i], e.bytes) || memcmp(a, b, e.bytes))
                    bad++;
            }
            close(fd);
            free(a);
            free(b);
            free(table);
        }
        kvx_warmup_report_free(&rep);
        kvx_warmup_destroy(w);
    }

    /* reference: one cudaMemcpy of the same bytes from pinned host memory */
    uint64_t bytes = (uint64_t)n * (2u << 20);
    void *h = NULL, *d = NULL;
    double ref = 0;
    if (cudaMallocHost(&h, bytes) == cudaSuccess && cudaMalloc(&d, bytes) == cudaSuccess) {
        memset(h, 1, bytes);
        cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice); /* warm up */
        for (int rep = 0; rep < 3; rep++) {
            double t = kvx_bench_now();
            cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice);
            double bw = (double)bytes / (kvx_bench_now() - t);
            if (bw > ref) ref = bw;
        }
    }
    cudaFree(d);
    cudaFreeHost(h);

    printf("\nGPU 0 (NUMA node %d), %u pages x 2 MiB = %" PRIu64 " MiB\n", node, n, bytes >> 20);
    printf("%-42s %10s\n", "case", "GB/s");
    printf("%-42s %10.2f\n", "warmup page cache -> GPU (CRC on)", gbps[0]);
    printf("%-42s %10.2f\n", "warmup disk O_DIRECT -> GPU (CRC on)", gbps[1]);
    printf("%-42s %10.2f\n", "cudaMemcpy pinned -> GPU (reference)", ref / 1e9);
    printf("%-42s %10.2f\n", "warm warmup / cudaMemcpy", ref > 0 ? gbps[0] * 1e9 / ref : 0);
    printf("verify: %" PRIu64 "/%u pages delivered, %" PRIu64 " differ from the file, %" PRIu64
           " page-table entries wrong\n", good_pages, n, bad, table_bad);
    kvx_gpu_destroy(g);
    kvx_shard_close(s);
    unlink(path);
    return bad || table_bad || good_pages != n ? 1 : 0;
#else
    (void)argc, (void)argv;
    return 77;
#endif
}
