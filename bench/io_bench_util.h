/*
 * io_bench_util.h - the file side shared by the data-path benchmarks
 * (bench_io, bench_gpu): page cache dropped or filled before a timed pass,
 * and shard files of pseudo-random pages (xorshift64, so the bytes do not
 * compress and no two pages are alike) written with the real shard writer.
 */
#ifndef KVX_IO_BENCH_UTIL_H
#define KVX_IO_BENCH_UTIL_H

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "kvx.h"

/* Cold reads: the page cache dropped (all of it when root, else this
 * file's pages through posix_fadvise). */
static inline void kvx_bench_drop_cache(const char *path)
{
    sync();
    int fd = open("/proc/sys/vm/drop_caches", O_WRONLY);
    if (fd >= 0) {
        if (write(fd, "3", 1) != 1) perror("drop_caches");
        close(fd);
    }
    fd = open(path, O_RDONLY);
    if (fd >= 0) {
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        close(fd);
    }
}

/* Warm reads: the whole file read once into the page cache. */
static inline void kvx_bench_warm_cache(const char *path)
{
    int fd = open(path, O_RDONLY);
    static char buf[1 << 20];
    while (read(fd, buf, sizeof buf) > 0) {
    }
    close(fd);
}

/* The next xorshift64 (13, 7, 17) value of *state. */
static inline uint64_t kvx_bench_xorshift(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

/* A shard of n entries at path: entry i holds tok(i) tokens of random
 * bytes drawn from *rng. Returns the writer's result. */
static inline int kvx_bench_write_shard(const char *path, kvx_geometry g, uint8_t shard_id, uint32_t n,
                                        uint32_t (*tok)(uint32_t), uint64_t *rng)
{
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = g;
    o.shard_id = shard_id;
    o.max_entries = n;
    kvx_shard_writer *w;
    int rc = kvx_shard_writer_create(&w, path, &o);
    if (rc) return rc;
    uint64_t maxb = 0;
    for (uint32_t i = 0; i < n; i++)
        if (kvx_page_bytes(&g, tok(i)) > maxb) maxb = kvx_page_bytes(&g, tok(i));
    uint64_t *page = malloc(maxb);
    for (uint32_t i = 0; i < n && !rc; i++) {
        uint64_t b = kvx_page_bytes(&g, tok(i));
        for (uint64_t k = 0; k < b / 8; k++) page[k] = kvx_bench_xorshift(rng);
        kvx_entry_in e = {0};
        e.radix_block = (uint16_t)i;
        e.token_count = tok(i);
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

#endif
