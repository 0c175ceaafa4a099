/*
 * prefix_read.c - engine/store_prefix_read.c: kvx_store_prefix_read serves
 * exactly the blocks kvx_store_prefix serves (DESIGN.md rule 1), their
 * pages read into the caller's buffer and CRC-checked there at every call:
 * out of the page cache (O_DIRECT, the run's reads in flight at once,
 * neighbours as one read) and from it, through the OS's reads (the fault
 * seam: pread), with damaged pages, failed and short reads, and bad
 * arguments.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/store.h"
#include "lib/fault.h"
#include "lib/store.h"

/* 64 KiB pages (as bench_peers'), so that O_DIRECT reads them. */
static const kvx_geometry PR_G = {1, 1, 4096, SU_B, KVX_QUANT_FP16, 0x1122334455667788ull};
#define PB ((size_t)2 * 4096 * SU_B * 2)

static void pr_drop_cache(const char *dir)
{
    char names[16][64], path[1200];
    size_t n = su_list_names(dir, "shards", names, 16);
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/shards/%s", dir, names[i]);
        int fd = open(path, O_RDONLY);
        assert_true(fd >= 0);
        assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
        close(fd);
    }
}

/* How many 4 KiB pages of dir's shard files the page cache holds. */
static size_t pr_resident(const char *dir)
{
    char names[16][64], path[1200];
    size_t n = su_list_names(dir, "shards", names, 16), held = 0;
    for (size_t i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/shards/%s", dir, names[i]);
        int fd = open(path, O_RDONLY);
        assert_true(fd >= 0);
        struct stat st;
        assert_int_equal(fstat(fd, &st), 0);
        void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
        assert_true(m != MAP_FAILED);
        size_t np = ((size_t)st.st_size + 4095) / 4096;
        unsigned char *vec = malloc(np);
        assert_int_equal(mincore(m, (size_t)st.st_size, vec), 0);
        for (size_t j = 0; j < np; j++) held += vec[j] & 1;
        free(vec);
        munmap(m, (size_t)st.st_size);
        close(fd);
    }
    return held;
}

/* Does the file system take O_DIRECT reads of dir's shards? */
static int pr_has_direct(const char *dir)
{
    char names[16][64], path[1200];
    if (su_list_names(dir, "shards", names, 16) == 0) return 0;
    snprintf(path, sizeof path, "%s/shards/%s", dir, names[0]);
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0) return 0;
    close(fd);
    return 1;
}

/* kvx_store_prefix_read of t (nb blocks) at stride into buf, checked
 * against kvx_store_prefix on the same handle: the same count, the same
 * bytes and scales. Returns the count. */
static size_t pr_same(kvx_store *s, const uint32_t *t, size_t n_tokens, size_t max, uint8_t *buf, size_t stride,
                      uint32_t flags)
{
    kvx_view v[32];
    size_t nv = 0, nr = 99;
    assert_true(max <= 32);
    float sc[32 * 2];
    memset(buf, 0xA5, max * stride);
    assert_int_equal(kvx_store_prefix_read(&nr, s, t, n_tokens, buf, stride, max, sc, flags), 0);
    assert_int_equal(kvx_store_prefix(v, &nv, s, t, n_tokens, max), 0);
    assert_int_equal(nr, nv);
    for (size_t i = 0; i < nv; i++) {
        assert_int_equal(v[i].page_bytes, PB);
        assert_memory_equal(buf + i * stride, v[i].page, PB);
        for (size_t j = 0; j < 2; j++) assert_true(sc[i * 2 + j] == (v[i].scales ? v[i].scales[j] : 1.0f));
    }
    kvx_views_release(v, nv);
    return nr;
}

/* A store of prompt A (12 blocks: 5 in one flush, then all 12: two
 * shards) and prompt B (A's first 3 blocks, then 3 of its own). */
enum { NA = 12 };
static kvx_store *pr_store(char *dir, size_t cap, uint32_t *ta, uint32_t *tb, uint8_t **pa)
{
    kvx_store *s = su_store(dir, cap, (su_spec){.geometry = &PR_G, .capacity = 64ull << 20});
    uint64_t h[NA];
    su_tokens(ta, 41, NA, 0);
    su_tokens(tb, 42, NA, 0);
    memcpy(tb, ta, 3 * SU_B * sizeof *tb);
    *pa = su_pages(ta, NA, h, PB);
    uint8_t *pb = su_pages(tb, 6, h, PB);
    assert_int_equal(kvx_store_put(s, ta, 5 * SU_B, *pa, 5, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_put(s, ta, NA * SU_B, *pa, NA, NULL, NULL), 0);
    assert_int_equal(kvx_store_put(s, tb, 6 * SU_B, pb, 6, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    free(pb);
    return s;
}

/* test_prefix_read_matches_prefix: hits, misses, a prompt that diverges,
 * a partial last block, max_blocks under the prompt: the same blocks and
 * bytes as kvx_store_prefix, out of the page cache and from it, through
 * the cache (flags 0) and with KVX_PREFIX_READ_DIRECT, into an aligned
 * buffer at the page size (one read a run of neighbours), at a wider
 * aligned stride (a read a page) and an unaligned one (through the cache).
 * Out of the cache, flags 0 leaves the pages in it for the next reader;
 * KVX_PREFIX_READ_DIRECT into an aligned buffer reads them with O_DIRECT
 * and leaves the cache as it was. */
/* PROMISE: TRUST-13 */
static void test_prefix_read_matches_prefix(void **state)
{
    (void)state;
    char dir[300];
    uint32_t ta[NA * SU_B + 3], tb[NA * SU_B], tc[NA * SU_B], td[NA * SU_B];
    uint8_t *pa;
    kvx_store *s = pr_store(dir, sizeof dir, ta, tb, &pa);
    kvx_store_close(s);
    ta[NA * SU_B] = 1, ta[NA * SU_B + 1] = 2, ta[NA * SU_B + 2] = 3; /* a partial block after A */
    su_tokens(tc, 43, NA, 0);                                        /* nothing held */
    memcpy(td, ta, sizeof td);
    td[2 * SU_B + 1] ^= 1; /* A with block 2 changed */
    size_t strides[3] = {PB, PB + 4096, PB + 1};
    uint8_t *raw = aligned_alloc(4096, 32 * (PB + 4096) + 4096);
    int direct = pr_has_direct(dir);
    for (int d = 0; d < 2; d++)
        for (int cold = 1; cold >= 0; cold--)
            for (int k = 0; k < 3; k++) {
                uint32_t fl = d ? KVX_PREFIX_READ_DIRECT : 0;
                uint8_t *buf = strides[k] == PB + 1 ? raw + 1 : raw;
                s = su_reopen(dir, KVX_STORE_READONLY);
                if (cold) pr_drop_cache(dir);
                size_t n = 0;
                assert_int_equal(kvx_store_prefix_read(&n, s, ta, NA * SU_B + 3, buf, strides[k], 32, NULL, fl), 0);
                assert_int_equal(n, NA);
                for (size_t i = 0; i < NA; i++) assert_memory_equal(buf + i * strides[k], pa + i * PB, PB);
                /* O_DIRECT: the pages (16 4 KiB pages each) did not enter
                 * the cache (the tables did, when the handles opened);
                 * through the cache: they are all there */
                if (cold && d && direct && strides[k] != PB + 1) assert_true(pr_resident(dir) < 64);
                if (cold && !d) assert_true(pr_resident(dir) >= NA * 16);
                assert_int_equal(pr_same(s, ta, NA * SU_B + 3, 32, buf, strides[k], fl), NA);
                assert_int_equal(pr_same(s, ta, NA * SU_B, 7, buf, strides[k], fl), 7);
                assert_int_equal(pr_same(s, tb, NA * SU_B, 32, buf, strides[k], fl), 6);
                assert_int_equal(pr_same(s, tc, NA * SU_B, 32, buf, strides[k], fl), 0);
                assert_int_equal(pr_same(s, td, NA * SU_B, 32, buf, strides[k], fl), 2);
                assert_int_equal(pr_same(s, ta, SU_B - 1, 32, buf, strides[k], fl), 0);
                kvx_store_close(s);
            }
    /* out of the cache, read alone (no views): O_DIRECT leaves it out;
     * the hits are counted as a prefix counts them */
    for (int d = 0; d < 2; d++) {
        s = su_reopen(dir, KVX_STORE_READONLY);
        size_t n = 0;
        uint32_t fl = d ? KVX_PREFIX_READ_DIRECT : 0;
        assert_int_equal(kvx_store_prefix_read(&n, s, ta, NA * SU_B, raw, PB, 2, NULL, fl), 0); /* the handles */
        kvx_store_stats st0 = su_stat(s);
        pr_drop_cache(dir);
        memset(raw, 0, NA * PB);
        assert_int_equal(kvx_store_prefix_read(&n, s, ta, NA * SU_B, raw, PB, NA, NULL, fl), 0);
        assert_int_equal(n, NA);
        assert_memory_equal(raw, pa, NA * PB);
        if (d && direct) assert_true(pr_resident(dir) < 64); /* the pages (16 each) stayed out */
        if (!d) assert_true(pr_resident(dir) >= NA * 16);
        kvx_store_stats st = su_stat(s);
        assert_int_equal(st.hits - st0.hits, NA);
        kvx_store_close(s);
    }
    free(raw);
    free(pa);
}

/* test_prefix_read_damage: a flipped byte in a stored page ends the
 * prefix before that block (its message names it) and the bytes served
 * are the ones put, out of the cache and from it, on a fresh handle and
 * again; a page damaged after an earlier good read on the same handle is
 * caught too (checked where it lands, every call); once the block is
 * stored again its sound copy is served. */
/* PROMISE: TRUST-13 */
static void test_prefix_read_damage(void **state)
{
    (void)state;
    char dir[300];
    uint32_t ta[NA * SU_B + 3], tb[NA * SU_B];
    uint8_t *pa;
    kvx_store *s = pr_store(dir, sizeof dir, ta, tb, &pa);
    kvx_store_close(s);
    uint64_t h[NA];
    kvx_block_hashes(h, ta, NA * SU_B, SU_B);
    char names[8][64], path[1200];
    size_t nsh = su_list_names(dir, "shards", names, 8);
    assert_true(nsh >= 2);
    uint32_t idx = UINT32_MAX;
    for (size_t k = 0; k < nsh && idx == UINT32_MAX; k++) {
        snprintf(path, sizeof path, "%s/shards/%s", dir, names[k]);
        kvx_shard *sh;
        assert_int_equal(kvx_shard_open(&sh, path, 0), 0);
        for (uint32_t i = 0; i < kvx_shard_get_info(sh)->num_blocks; i++) {
            kvx_entry e;
            if (kvx_shard_entry(&e, sh, i) == 0 && e.hash == h[8]) idx = i;
        }
        kvx_shard_close(sh);
    }
    assert_true(idx != UINT32_MAX);
    uint8_t *buf = aligned_alloc(4096, NA * PB);
    size_t n = 0;
    for (int d = 0; d < 2; d++) {
        uint32_t fl = d ? KVX_PREFIX_READ_DIRECT : 0;
        s = su_reopen(dir, KVX_STORE_READONLY);
        if (!d) { /* good first, on one handle: then the page rots under it */
            assert_int_equal(kvx_store_prefix_read(&n, s, ta, NA * SU_B, buf, PB, NA, NULL, fl), 0);
            assert_int_equal(n, NA);
            assert_int_equal(su_flip_page_byte(path, idx), 0);
        }
        for (int pass = 0; pass < 3; pass++) {
            if (pass) s = su_reopen(dir, KVX_STORE_READONLY);
            if (pass == 1) pr_drop_cache(dir);
            for (int again = 0; again < 2; again++) {
                memset(buf, 0, NA * PB);
                assert_int_equal(kvx_store_prefix_read(&n, s, ta, NA * SU_B, buf, PB, NA, NULL, fl), 0);
                assert_int_equal(n, 8);
                assert_non_null(strstr(kvx_last_error(), "page CRC mismatch"));
                assert_memory_equal(buf, pa, 8 * PB);
                assert_int_equal(pr_same(s, ta, NA * SU_B, NA, buf, PB, fl), 8);
            }
            kvx_store_close(s);
        }
    }
    /* the damaged block stored again: the sound copy is read in its place */
    s = su_reopen(dir, 0);
    size_t added = 0;
    assert_int_equal(kvx_store_put(s, ta, NA * SU_B, pa, NA, NULL, &added), 0);
    assert_int_equal(added, 1);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    for (int cold = 0; cold < 4; cold++) {
        s = su_reopen(dir, KVX_STORE_READONLY);
        if (cold & 1) pr_drop_cache(dir);
        memset(buf, 0, NA * PB);
        assert_int_equal(
            kvx_store_prefix_read(&n, s, ta, NA * SU_B, buf, PB, NA, NULL, cold & 2 ? KVX_PREFIX_READ_DIRECT : 0), 0);
        assert_int_equal(n, NA);
        assert_string_equal(kvx_last_error(), "");
        assert_memory_equal(buf, pa, NA * PB);
        kvx_store_close(s);
    }
    free(buf);
    free(pa);
}

/* test_prefix_read_cut_under_handle: a shard file cut short under an
 * open handle (its pages mapped and read before): the prefix ends before
 * the first page the cut reaches, with both modes, the bytes served are
 * the ones put, and nothing is read outside the file (the process lives:
 * the mapping's pages past the end read as zeros and fail their CRC). */
/* PROMISE: TRUST-13 */
static void test_prefix_read_cut_under_handle(void **state)
{
    (void)state;
    char dir[300];
    uint32_t ta[NA * SU_B + 3], tb[NA * SU_B];
    uint8_t *pa;
    kvx_store *s = pr_store(dir, sizeof dir, ta, tb, &pa);
    kvx_store_close(s);
    uint64_t h[NA];
    kvx_block_hashes(h, ta, NA * SU_B, SU_B);
    char names[8][64], path[1200];
    size_t nsh = su_list_names(dir, "shards", names, 8);
    uint64_t off = UINT64_MAX;
    for (size_t k = 0; k < nsh && off == UINT64_MAX; k++) {
        snprintf(path, sizeof path, "%s/shards/%s", dir, names[k]);
        kvx_shard *sh;
        assert_int_equal(kvx_shard_open(&sh, path, 0), 0);
        for (uint32_t i = 0; i < kvx_shard_get_info(sh)->num_blocks; i++) {
            kvx_entry e;
            if (kvx_shard_entry(&e, sh, i) == 0 && e.hash == h[9]) off = e.offset;
        }
        kvx_shard_close(sh);
    }
    assert_true(off != UINT64_MAX);
    uint8_t *buf = aligned_alloc(4096, NA * PB);
    s = su_reopen(dir, KVX_STORE_READONLY);
    size_t n = 0;
    assert_int_equal(kvx_store_prefix_read(&n, s, ta, NA * SU_B, buf, PB, NA, NULL, 0), 0);
    assert_int_equal(n, NA);
    assert_int_equal(truncate(path, (off_t)(off + 100)), 0); /* block 9's page cut 100 bytes in */
    for (int d = 0; d < 2; d++)
        for (int cold = 0; cold < 2; cold++) {
            if (cold) pr_drop_cache(dir);
            memset(buf, 0, NA * PB);
            assert_int_equal(
                kvx_store_prefix_read(&n, s, ta, NA * SU_B, buf, PB, NA, NULL, d ? KVX_PREFIX_READ_DIRECT : 0), 0);
            assert_int_equal(n, 9); /* blocks 0-8 whole, in this file or the other */
            assert_memory_equal(buf, pa, n * PB);
        }
    kvx_store_close(s);
    free(buf);
    free(pa);
}

/* test_prefix_read_faults: a failed read (EIO, a short read) at each of
 * the OS calls in turn (the reads go through pread under the seam), the
 * O_DIRECT descriptor's open among them: the call returns 0 with a
 * prefix (a page whose read failed is read again alone) or an error,
 * every block it serves holds the bytes put, and the store reads the
 * whole prefix afterwards. */
/* PROMISE: TRUST-13 */
static void test_prefix_read_faults(void **state)
{
    (void)state;
    char dir[300];
    uint32_t ta[NA * SU_B + 3], tb[NA * SU_B];
    uint8_t *pa;
    kvx_store *s = pr_store(dir, sizeof dir, ta, tb, &pa);
    kvx_store_close(s);
    uint8_t *buf = aligned_alloc(4096, NA * PB);
    int modes[2] = {FAULT_ERRNO, FAULT_SHORT};
    unsigned kinds[2] = {FAULT_RW, FAULT_OPEN};
    for (int m = 0; m < 2; m++)
        for (int kd = 0; kd < 2; kd++) {
            long total = 0;
            for (long at = 1; at < 80; at++) {
                s = su_reopen(dir, KVX_STORE_READONLY);
                pr_drop_cache(dir);
                fault_install();
                fault_only = kinds[kd];
                fault_reset(at, EIO, modes[m]);
                memset(buf, 0, NA * PB);
                size_t n = 0;
                int rc = kvx_store_prefix_read(&n, s, ta, NA * SU_B, buf, PB, NA, NULL, 0);
                long hits = fault_hits;
                fault_uninstall();
                if (rc == 0) {
                    assert_true(n <= NA);
                    assert_memory_equal(buf, pa, n * PB);
                } else {
                    assert_int_equal(n, 0);
                }
                assert_int_equal(kvx_store_prefix_read(&n, s, ta, NA * SU_B, buf, PB, NA, NULL, 0), 0);
                assert_int_equal(n, NA);
                assert_memory_equal(buf, pa, NA * PB);
                kvx_store_close(s);
                total += hits;
                if (!hits) break;
            }
            assert_true(total > 0);
        }
    free(buf);
    free(pa);
}

/* test_prefix_read_bad_arguments: each refused with KVX_EINVALID (or
 * KVX_EOVERFLOW) naming the field, before anything is read; n_tokens 0
 * and max_blocks 0 serve nothing; a keyed store is refused. */
/* PROMISE: TRUST-13 */
static void test_prefix_read_bad_arguments(void **state)
{
    (void)state;
    char dir[300];
    uint32_t ta[NA * SU_B + 3], tb[NA * SU_B];
    uint8_t *pa;
    kvx_store *s = pr_store(dir, sizeof dir, ta, tb, &pa);
    uint8_t *buf = aligned_alloc(4096, NA * PB);
    float sc[NA * 2];
    size_t n = 7;
    assert_int_equal(kvx_store_prefix_read(NULL, s, ta, NA * SU_B, buf, PB, NA, NULL, 0), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "out_n"));
    assert_int_equal(kvx_store_prefix_read(&n, NULL, ta, NA * SU_B, buf, PB, NA, NULL, 0), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "store"));
    assert_int_equal(n, 0);
    assert_int_equal(kvx_store_prefix_read(&n, s, NULL, NA * SU_B, buf, PB, NA, NULL, 0), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "tokens"));
    assert_int_equal(kvx_store_prefix_read(&n, s, ta, NA * SU_B, NULL, PB, NA, NULL, 0), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "dst"));
    assert_int_equal(kvx_store_prefix_read(&n, s, ta, NA * SU_B, buf, PB - 1, NA, NULL, 0), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "dst_stride"));
    assert_int_equal(kvx_store_prefix_read(&n, s, ta, NA * SU_B, buf, SIZE_MAX / 2, NA, NULL, 0), KVX_EOVERFLOW);
    assert_non_null(strstr(kvx_last_error(), "max_blocks"));
    assert_int_equal(kvx_store_prefix_read(&n, s, ta, NA * SU_B, buf, PB, NA, (float *)(buf + PB), 0), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "out_scales overlaps dst"));
    assert_int_equal(kvx_store_prefix_read(&n, s, ta, NA * SU_B, buf, PB, NA, NULL, 0x80), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "flags 0x80"));
    /* nothing asked: nothing served, no buffer needed */
    assert_int_equal(kvx_store_prefix_read(&n, s, NULL, 0, NULL, 0, 0, NULL, 0), 0);
    assert_int_equal(n, 0);
    assert_int_equal(kvx_store_prefix_read(&n, s, ta, NA * SU_B, NULL, 0, 0, NULL, 0), 0);
    assert_int_equal(n, 0);
    assert_int_equal(kvx_store_prefix_read(&n, s, ta, NA * SU_B, buf, PB, NA, sc, 0), 0);
    assert_int_equal(n, NA);
    for (size_t i = 0; i < NA * 2; i++) assert_true(sc[i] == 1.0f); /* FP16: no scale table */
    kvx_store_close(s);
    /* a keyed store holds no token prefixes */
    s = su_store(dir, sizeof dir, (su_spec){.page_bytes = PB, .capacity = 16ull << 20});
    assert_int_equal(kvx_store_prefix_read(&n, s, ta, NA * SU_B, buf, PB, NA, NULL, 0), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "keyed store"));
    kvx_store_close(s);
    free(buf);
    free(pa);
}

/* test_prefix_read_fp8_scales: an E4M3 store's per-block scales come
 * with the pages, as the views carry them. */
/* PROMISE: TRUST-13 */
static void test_prefix_read_fp8_scales(void **state)
{
    (void)state;
    char dir[300];
    kvx_geometry g = PR_G;
    g.quant = KVX_QUANT_E4M3;
    g.head_dim = 8192; /* 64 KiB pages of one-byte elements */
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.geometry = &g, .capacity = 64ull << 20});
    enum { N = 5 };
    uint32_t t[N * SU_B];
    uint64_t h[N];
    su_tokens(t, 77, N, 0);
    uint8_t *p = su_pages(t, N, h, PB);
    for (size_t i = 0; i < N * PB; i++) p[i] &= 0x3f; /* finite e4m3 values */
    float scales[N * 2];
    for (int i = 0; i < N * 2; i++) scales[i] = 0.5f + (float)i;
    assert_int_equal(kvx_store_put(s, t, N * SU_B, p, N, scales, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    uint8_t *buf = aligned_alloc(4096, N * PB);
    for (int cold = 0; cold < 2; cold++) {
        if (cold) pr_drop_cache(dir);
        assert_int_equal(pr_same(s, t, N * SU_B, N, buf, PB, 0), N);
        float got[N * 2];
        size_t n = 0;
        assert_int_equal(kvx_store_prefix_read(&n, s, t, N * SU_B, buf, PB, N, got, 0), 0);
        assert_int_equal(n, N);
        assert_memory_equal(got, scales, sizeof scales);
        assert_memory_equal(buf, p, N * PB);
    }
    kvx_store_close(s);
    free(buf);
    free(p);
}

int main(void)
{
    /* these tests damage one of several shard files, one a flush: the
     * active shard's reads are in tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefix_read_matches_prefix),   cmocka_unit_test(test_prefix_read_damage),
        cmocka_unit_test(test_prefix_read_cut_under_handle), cmocka_unit_test(test_prefix_read_faults),
        cmocka_unit_test(test_prefix_read_bad_arguments),    cmocka_unit_test(test_prefix_read_fp8_scales),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
