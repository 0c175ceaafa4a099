/*
 * shard_read.c - format/shard_read.c: kvx_shard_pages_read and
 * kvx_shard_pages_copy, pages read into the caller's memory and checked
 * there. Out of the page cache,
 * neighbouring pages of one file read into neighbouring buffer space are
 * one O_DIRECT read: each page still lands whole where it belongs and is
 * checked alone (a damaged page among them fails by itself).
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
#include <unistd.h>

#include <cmocka.h>

#include "format/format.h"
#include "lib/store.h"

static const kvx_geometry SR_G = {1, 1, 4096, SU_B, KVX_QUANT_FP16, 0x1122334455667788ull};
#define PB ((size_t)2 * 4096 * SU_B * 2)
enum { N = 40 }; /* 2.5 MiB: over one coalesced read's 1 MiB */

static void sr_drop(const char *path)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
}

/* test_pages_read_runs: a shard's pages in file order into one buffer
 * (one read a run of neighbours), backwards (a read a page), at a stride
 * with gaps (a read a page), out of the cache and from it: every page 0
 * with its bytes; the first page flipped fails alone (KVX_EPAGECRC) and
 * the rest of its run is whole. */
/* PROMISE: TRUST-13 */
static void test_pages_read_runs(void **state)
{
    (void)state;
    char dir[300], names[4][64], path[1200];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.geometry = &SR_G, .capacity = 64ull << 20, .shard_bytes = 8ull << 20});
    uint32_t t[N * SU_B];
    uint64_t h[N];
    su_tokens(t, 5, N, 0);
    uint8_t *p = su_pages(t, N, h, PB);
    assert_int_equal(kvx_store_put(s, t, N * SU_B, p, N, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    assert_int_equal(su_list_names(dir, "shards", names, 4), 1);
    snprintf(path, sizeof path, "%s/shards/%s", dir, names[0]);
    uint8_t *buf = aligned_alloc(4096, N * (PB + 4096));
    for (int damaged = 0; damaged < 2; damaged++) {
        if (damaged) assert_int_equal(su_flip_page_byte(path, 0), 0);
        kvx_shard *sh;
        assert_int_equal(kvx_shard_open(&sh, path, 0), 0);
        kvx_shard *shs[N];
        uint32_t idx[N], bad = 0; /* the entry flipped */
        void *dst[N];
        size_t cap[N], len[N], want[N]; /* want[i]: the block at idx[i] */
        int st[N];
        for (uint32_t e = 0; e < N; e++) {
            kvx_entry en;
            assert_int_equal(kvx_shard_entry(&en, sh, e), 0);
            for (size_t b = 0; b < N; b++)
                if (h[b] == en.hash) want[e] = b;
        }
        for (int order = 0; order < 3; order++)
            for (int cold = 1; cold >= 0; cold--) {
                size_t stride = order == 2 ? PB + 4096 : PB;
                for (uint32_t k = 0; k < N; k++) {
                    shs[k] = sh;
                    idx[k] = order == 1 ? N - 1 - k : k;
                    dst[k] = buf + (order == 1 ? N - 1 - k : k) * stride;
                    cap[k] = PB;
                }
                memset(buf, 0, N * stride);
                if (cold) sr_drop(path);
                kvx_shard_pages_read(shs, idx, N, dst, cap, st, len);
                for (uint32_t k = 0; k < N; k++) {
                    if (damaged && idx[k] == bad) {
                        assert_int_equal(st[k], KVX_EPAGECRC);
                        assert_int_equal(len[k], 0);
                        continue;
                    }
                    assert_int_equal(st[k], 0);
                    assert_int_equal(len[k], PB);
                    assert_memory_equal(dst[k], p + want[idx[k]] * PB, PB);
                }
            }
        kvx_shard_close(sh);
    }
    free(buf);
    free(p);
}

/* test_pages_read_middle_damaged: a run of neighbours read as one read
 * (kvx_shard_pages_read), or copied through the cache
 * (kvx_shard_pages_copy), with a damaged page in its middle: that page
 * alone fails, cold and warm. */
/* PROMISE: TRUST-13 */
static void test_pages_read_middle_damaged(void **state)
{
    (void)state;
    char dir[300], names[4][64], path[1200];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.geometry = &SR_G, .capacity = 64ull << 20});
    enum { M = 8 };
    uint32_t t[M * SU_B];
    uint64_t h[M];
    su_tokens(t, 6, M, 0);
    uint8_t *p = su_pages(t, M, h, PB);
    assert_int_equal(kvx_store_put(s, t, M * SU_B, p, M, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    assert_int_equal(su_list_names(dir, "shards", names, 4), 1);
    snprintf(path, sizeof path, "%s/shards/%s", dir, names[0]);
    assert_int_equal(su_flip_page_byte(path, 3), 0);
    kvx_shard *sh;
    assert_int_equal(kvx_shard_open(&sh, path, 0), 0);
    uint8_t *buf = aligned_alloc(4096, M * PB);
    kvx_shard *shs[M];
    uint32_t idx[M];
    void *dst[M];
    size_t cap[M], len[M];
    int st[M];
    for (uint32_t k = 0; k < M; k++) shs[k] = sh, idx[k] = k, dst[k] = buf + k * PB, cap[k] = PB;
    for (int r = 0; r < 4; r++) { /* pages_read, then pages_copy; each cold, then warm */
        int cold = !(r & 1);
        if (cold) sr_drop(path);
        memset(buf, 0, M * PB);
        if (r < 2)
            kvx_shard_pages_read(shs, idx, M, dst, cap, st, len);
        else
            kvx_shard_pages_copy(shs, idx, M, dst, cap, st, len);
        for (uint32_t k = 0; k < M; k++) {
            kvx_entry e;
            assert_int_equal(kvx_shard_entry(&e, sh, k), 0);
            if (k == 3) {
                assert_int_equal(st[k], KVX_EPAGECRC);
                continue;
            }
            assert_int_equal(st[k], 0);
            size_t b = 0;
            while (h[b] != e.hash) b++;
            assert_memory_equal(dst[k], p + b * PB, PB);
        }
    }
    kvx_shard_close(sh);
    free(buf);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pages_read_runs),
        cmocka_unit_test(test_pages_read_middle_damaged),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
