/*
 * tests/io/gpu_crc.c - the GPU CRC kernel's math on the CPU: io/gpu_crc.h
 * is the one source of the kernel's table-driven CRC-32, its warp tree,
 * its placement of chunks and its finish; compiled here for the host, it
 * must give ISA-L's CRC-32 (what the CPU path and the shard writer use) on
 * the same inputs: every length around the lane and chunk boundaries,
 * unaligned starts, megabyte pages, and whole jobs of several pages as the
 * three kernels run them (any chunk order). Needs no GPU.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "io/gpu_dev.h"

static uint32_t tab[KVX_GCRC_TABLE_WORDS];
static kvx_gcrc_consts consts;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static uint8_t *random_bytes(size_t n)
{
    uint8_t *p = malloc(n ? n : 1);
    assert_non_null(p);
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)next_rand();
    return p;
}

/* The reference: CRC-32 one bit at a time, no table. */
static uint32_t crc_bitwise(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0xEDB88320u : c >> 1;
    }
    return ~c;
}

static int setup(void **state)
{
    (void)state;
    kvx_gcrc_tables_init(tab);
    kvx_gcrc_consts_init(&consts);
    return 0;
}

/* The tables, the products and the powers, against their definitions. */
/* PROMISE: IO-16 */
static void test_tables_and_powers(void **state)
{
    (void)state;
    /* table 0 is the classic byte table; table k is byte b then k zeros */
    for (unsigned b = 0; b < 256; b++) {
        uint8_t buf[8] = {(uint8_t)b};
        for (unsigned k = 0; k < 8; k++) {
            /* raw CRC (register 0, no inversion) of b followed by k zero bytes */
            uint32_t c = 0;
            for (unsigned i = 0; i <= k; i++) {
                c ^= buf[i];
                for (int s = 0; s < 8; s++) c = c & 1 ? (c >> 1) ^ 0xEDB88320u : c >> 1;
            }
            assert_int_equal(tab[k * 256 + b], c);
        }
    }
    /* x^0 is the unit; x^8 shifts a raw CRC past one zero byte */
    for (int i = 0; i < 1000; i++) {
        uint32_t a = (uint32_t)next_rand(), b = (uint32_t)next_rand();
        assert_int_equal(kvx_gcrc_mul(KVX_GCRC_ONE, a), a);
        assert_int_equal(kvx_gcrc_mul(a, b), kvx_gcrc_mul(b, a));
        uint8_t z = 0;
        assert_int_equal(kvx_gcrc_mul(consts.byte_pow[0], a), kvx_gcrc_raw(tab, a, &z, 1));
    }
    /* the tables of powers: square after square, and pow() by squaring */
    for (int k = 0; k + 1 < 64; k++)
        assert_int_equal(consts.byte_pow[k + 1], kvx_gcrc_mul(consts.byte_pow[k], consts.byte_pow[k]));
    assert_int_equal(consts.seg_pow[0], kvx_gcrc_pow(consts.byte_pow, 64, KVX_GCRC_SEG));
    assert_int_equal(consts.chunk_pow[0], kvx_gcrc_pow(consts.byte_pow, 64, KVX_GCRC_CHUNK));
    assert_int_equal(consts.chunk_pow[3], kvx_gcrc_pow(consts.byte_pow, 64, 8ull * KVX_GCRC_CHUNK));
    assert_int_equal(kvx_gcrc_pow(consts.byte_pow, 64, 0), KVX_GCRC_ONE);
}

/* Pages cut as the kernel cuts them give ISA-L's CRC-32: every length
 * around a lane segment and a chunk, starts at every alignment. */
/* PROMISE: IO-16 */
static void test_page_crc_matches_isal(void **state)
{
    (void)state;
    size_t cap = 3 * KVX_GCRC_CHUNK + 64;
    uint8_t *buf = random_bytes(cap);
    size_t lens[] = {0,
                     1,
                     2,
                     7,
                     8,
                     9,
                     63,
                     255,
                     256,
                     257,
                     511,
                     4095,
                     4096,
                     4097,
                     KVX_GCRC_CHUNK - 1,
                     KVX_GCRC_CHUNK,
                     KVX_GCRC_CHUNK + 1,
                     2 * KVX_GCRC_CHUNK - KVX_GCRC_SEG,
                     2 * KVX_GCRC_CHUNK + 3,
                     3 * KVX_GCRC_CHUNK};
    for (size_t i = 0; i < sizeof lens / sizeof *lens; i++)
        for (size_t off = 0; off < 16; off++) {
            uint32_t want = kvx_crc32(0, buf + off, lens[i]);
            uint32_t got = kvx_gcrc_page_host(tab, &consts, buf + off, lens[i]);
            if (got != want) fail_msg("len %zu at +%zu: kernel math %08x, ISA-L %08x", lens[i], off, got, want);
            if (lens[i] < 5000) assert_int_equal(crc_bitwise(buf + off, lens[i]), want);
        }
    /* random lengths up to three chunks */
    for (int t = 0; t < 300; t++) {
        size_t n = (size_t)(next_rand() % (3 * KVX_GCRC_CHUNK)), off = (size_t)(next_rand() % 64);
        assert_int_equal(kvx_gcrc_page_host(tab, &consts, buf + off, n), kvx_crc32(0, buf + off, n));
    }
    free(buf);
    /* KV pages: 2 MiB and 2 MiB + 3 (the last chunk's lanes partly empty) */
    size_t big = (2u << 20) + 3;
    buf = random_bytes(big);
    assert_int_equal(kvx_gcrc_page_host(tab, &consts, buf, big - 3), kvx_crc32(0, buf, big - 3));
    assert_int_equal(kvx_gcrc_page_host(tab, &consts, buf, big), kvx_crc32(0, buf, big));
    /* one flipped bit anywhere changes it */
    for (int t = 0; t < 20; t++) {
        size_t at = (size_t)(next_rand() % big);
        uint32_t before = kvx_gcrc_page_host(tab, &consts, buf, big);
        buf[at] ^= (uint8_t)(1u << (t % 8));
        assert_int_not_equal(kvx_gcrc_page_host(tab, &consts, buf, big), before);
        assert_int_equal(kvx_gcrc_page_host(tab, &consts, buf, big), kvx_crc32(0, buf, big));
    }
    free(buf);
}

/* A whole job (window of pages in a landing buffer) as the three kernels
 * run it: verdicts equal ISA-L's check, only good pages copied to their
 * destination, a bad page's destination untouched; NO_VERIFY trusts. */
/* PROMISE: IO-16 */
static void test_job_verdicts_match_isal(void **state)
{
    (void)state;
    enum { NP = 23 };
    kvx_gpu_page pages[NP];
    uint64_t sizes[NP], off = 4096 * 3, chunks = 0;
    for (int i = 0; i < NP; i++) {
        sizes[i] = i == 5 ? 0 : (next_rand() % (5 * KVX_GCRC_CHUNK)) + 1;
        if (i == 6) sizes[i] = KVX_GCRC_CHUNK;
        if (i == 7) sizes[i] = 1;
    }
    uint64_t win_off = off, land_bytes = 0;
    for (int i = 0; i < NP; i++) {
        pages[i].off = off;
        pages[i].bytes = sizes[i];
        pages[i].chunk0 = chunks;
        chunks += kvx_gcrc_nchunks(sizes[i]);
        off = (off + sizes[i] + 4095) & ~(uint64_t)4095;
    }
    land_bytes = off - win_off;
    uint8_t *landing = random_bytes(land_bytes);
    uint8_t *dst = malloc(land_bytes + 256 * NP);
    uint32_t acc[NP], status[NP];
    for (int i = 0; i < NP; i++) {
        pages[i].crc = kvx_crc32(0, landing + (pages[i].off - win_off), sizes[i]);
        pages[i].tag = (uint32_t)i;
        pages[i].dst = (uint64_t)(uintptr_t)(dst + (pages[i].off - win_off) + 256 * (uint64_t)i);
    }
    const int bad[3] = {2, 6, 22};
    for (int b = 0; b < 3; b++) pages[bad[b]].crc ^= 0x10u << b; /* the stored CRC says otherwise */
    for (int verify = 1; verify >= 0; verify--) {
        memset(dst, 0xEE, land_bytes + 256 * NP);
        memset(acc, 0, sizeof acc);
        memset(status, 0, sizeof status);
        kvx_gpu_crc_job job;
        memset(&job, 0, sizeof job);
        job.pages = (uint64_t)(uintptr_t)pages;
        job.acc = (uint64_t)(uintptr_t)acc;
        job.status = (uint64_t)(uintptr_t)status;
        job.landing = (uint64_t)(uintptr_t)landing;
        job.win_off = win_off;
        /* two jobs over the window: [0, 9) and [9, NP) */
        for (int half = 0; half < 2; half++) {
            job.p0 = half ? 9 : 0;
            job.p1 = half ? NP : 9;
            job.c0 = pages[job.p0].chunk0;
            job.nc = (job.p1 < NP ? pages[job.p1].chunk0 : chunks) - job.c0;
            job.verify = verify;
            job.consts = consts;
            kvx_gcrc_job_host(&job);
        }
        for (int i = 0; i < NP; i++) {
            int is_bad = verify && (i == bad[0] || i == bad[1] || i == bad[2]);
            assert_int_equal(status[i], is_bad ? KVX_GPU_PAGE_BAD : KVX_GPU_PAGE_GOOD);
            const uint8_t *d = (const uint8_t *)(uintptr_t)pages[i].dst;
            if (is_bad) {
                for (uint64_t k = 0; k < sizes[i]; k++) assert_int_equal(d[k], 0xEE);
            } else {
                assert_memory_equal(d, landing + (pages[i].off - win_off), sizes[i]);
            }
        }
    }
    free(landing);
    free(dst);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tables_and_powers),
        cmocka_unit_test(test_page_crc_matches_isal),
        cmocka_unit_test(test_job_verdicts_match_isal),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
