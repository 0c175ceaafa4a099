/*
 * bench_shard.c - KVX shard writer and reader speed, each as a ratio to a
 * physical reference measured in the same run.
 *
 *   write:  kvx_shard_writer_add of every page + seal (fsync, rename), vs a
 *           bare pwrite of the same bytes + fsync into a plain file (disk).
 *   verify: kvx_shard_page(verify=1) over every page of an open shard in the
 *           page cache (CRC-32 over the mapping), vs memcpy of the same bytes.
 *   open:   kvx_shard_open of a shard with many small entries and every
 *           table (validation, lineage hashes, sort), vs a bare pread of the
 *           same table bytes.
 *
 * Usage: bench_shard [DIR] [BLOCKS]   (defaults /tmp and 64 blocks of
 * 1 MiB: L=32, Hkv=8, D=128, B=16, E4M3).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_common.h"
#include "kvx.h"

static void die(const char *what, int rc)
{
    fprintf(stderr, "%s: %s (%s)\n", what, kvx_err_name(rc), kvx_last_error());
    exit(1);
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "/tmp";
    int blocks = argc > 2 ? atoi(argv[2]) : 64;
    char path[512], raw[512], small[512];
    snprintf(path, sizeof path, "%s/bench_shard.%d.kvx", dir, (int)getpid());
    snprintf(raw, sizeof raw, "%s/bench_shard.%d.raw", dir, (int)getpid());
    snprintf(small, sizeof small, "%s/bench_shard.%d.small.kvx", dir, (int)getpid());

    kvx_geometry g = {32, 8, 128, 16, KVX_QUANT_E4M3, 1};
    size_t page_bytes = (size_t)kvx_page_bytes(&g, g.block_tokens);
    size_t total = page_bytes * (size_t)blocks;
    uint8_t *page = malloc(page_bytes);
    for (size_t i = 0; i < page_bytes; i++) page[i] = (uint8_t)(i * 131 + 7);
    float *scales = malloc(sizeof(float) * kvx_scale_count(&g));
    for (uint64_t i = 0; i < kvx_scale_count(&g); i++) scales[i] = 0.5f;

    /* write */
    double best_w = 1e300, best_raw = 1e300;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = kvx_bench_now();
        kvx_shard_writer *w;
        kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
        o.geometry = g;
        o.max_entries = (uint32_t)blocks;
        o.flags = KVX_FLAG_HASHES | KVX_FLAG_SCALES;
        int rc = kvx_shard_writer_create(&w, path, &o);
        if (rc) die("create", rc);
        for (int i = 0; i < blocks; i++) {
            page[0] = (uint8_t)i;
            kvx_entry_in e = {0};
            e.radix_block = (uint16_t)i;
            e.token_count = g.block_tokens;
            e.page = page;
            e.scales = scales;
            if ((rc = kvx_shard_writer_add(w, &e))) die("add", rc);
        }
        if ((rc = kvx_shard_writer_seal(w))) die("seal", rc);
        double t = kvx_bench_now() - t0;
        if (t < best_w) best_w = t;

        t0 = kvx_bench_now();
        int fd = open(raw, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        for (int i = 0; i < blocks; i++)
            if (pwrite(fd, page, page_bytes, (off_t)i * (off_t)page_bytes) != (ssize_t)page_bytes) die("pwrite", -1);
        fsync(fd);
        close(fd);
        t = kvx_bench_now() - t0;
        if (t < best_raw) best_raw = t;
        unlink(raw);
    }
    double w_gbps = kvx_bench_gbps((double)total, best_w), raw_gbps = kvx_bench_gbps((double)total, best_raw);
    printf("write  %d x %zu B: %.3f GB/s, bare pwrite+fsync %.3f GB/s: %.2fx\n", blocks, page_bytes,
           w_gbps, raw_gbps, w_gbps / raw_gbps);

    /* verify (warm) */
    kvx_shard *s;
    int rc = kvx_shard_open(&s, path, KVX_OPEN_VERIFY_PAGES); /* also warms the cache */
    if (rc) die("open", rc);
    double best_v = 1e300;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = kvx_bench_now();
        for (int i = 0; i < blocks; i++) {
            const void *p;
            if ((rc = kvx_shard_page(&p, s, (uint32_t)i, 1))) die("page", rc);
        }
        double t = kvx_bench_now() - t0;
        if (t < best_v) best_v = t;
    }
    double v_gbps = kvx_bench_gbps((double)total, best_v);
    double mc = kvx_bench_memcpy_gbps(total, 5);
    printf("verify %zu MiB: %.2f GB/s, memcpy %.2f GB/s: %.2fx\n", total >> 20, v_gbps, mc, v_gbps / mc);
    kvx_shard_close(s);
    unlink(path);

    /* open of many entries with every table */
    enum { N = 16384, B = 16 };
    kvx_geometry gs = {1, 1, 8, B, KVX_QUANT_E4M3, 1};
    kvx_shard_writer *w;
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = gs;
    o.max_entries = N;
    o.flags = KVX_FLAG_HASHES | KVX_FLAG_LINEAGE | KVX_FLAG_SCALES;
    if ((rc = kvx_shard_writer_create(&w, small, &o))) die("create small", rc);
    uint8_t sp[2 * 8 * B];
    memset(sp, 0x11, sizeof sp);
    uint32_t toks[B];
    uint64_t parent = 0;
    for (int i = 0; i < N; i++) {
        for (int t = 0; t < B; t++) toks[t] = (uint32_t)(i * B + t);
        kvx_entry_in e = {0};
        e.radix_block = (uint16_t)i;
        e.token_count = B;
        e.page = sp;
        e.parent = parent;
        e.tokens = toks;
        e.hash = kvx_block_hash(parent, toks, B);
        parent = e.hash;
        if ((rc = kvx_shard_writer_add(w, &e))) die("add small", rc);
    }
    if ((rc = kvx_shard_writer_seal(w))) die("seal small", rc);
    double best_o = 1e300;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = kvx_bench_now();
        if ((rc = kvx_shard_open(&s, small, 0))) die("open small", rc);
        double t = kvx_bench_now() - t0;
        kvx_shard_close(s);
        if (t < best_o) best_o = t;
    }
    size_t tables = (size_t)N * (24 + 8 + 8 + 4 * B + 4 * 2);
    uint8_t *tb = malloc(tables);
    double best_p = 1e300;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = kvx_bench_now();
        int fd = open(small, O_RDONLY);
        if (pread(fd, tb, tables, 64) != (ssize_t)tables) die("pread", -1);
        close(fd);
        double t = kvx_bench_now() - t0;
        if (t < best_p) best_p = t;
    }
    printf("open   %d entries (%zu KiB of tables): %.2f ms, bare pread of the tables %.3f ms: %.1fx, %.1f M entries/s\n",
           N, tables >> 10, best_o * 1e3, best_p * 1e3, best_o / best_p, N / best_o / 1e6);
    unlink(small);
    free(tb);
    free(page);
    free(scales);
    return 0;
}
