/*
 * spectral.c - format/spectral.c: the spectral bundle of a shard (psi,
 * per-layer steering): applied as written, its sub-header CRC, the wave-1
 * rule refused by name, non-finite values refused by writer and reader.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "format/shard_format.h"
#include "kvx.h"
#include "lib/shard.h"

static void test_spectral_apply(void **state)
{
    (void)state;
    /* psi = unit vector e0 (dim 3, rank 1): h' = h + gamma * h0 * e0 */
    float psi[3] = {1, 0, 0};
    float h[3] = {2, 3, 4};
    kvx_spectral_apply(h, psi, 3, 1, 0.5f);
    assert_true(h[0] == 3.0f && h[1] == 3.0f && h[2] == 4.0f);
    /* rank 2, psi columns u=(1,1,0), v=(0,0,2): psi psi^T h = u(u.h) + v(v.h) */
    float psi2[6] = {1, 0, 1, 0, 0, 2};
    float g[3] = {1, 2, 3};
    kvx_spectral_apply(g, psi2, 3, 2, 1.0f);
    /* u.h = 3, v.h = 6: delta = (3, 3, 12) */
    assert_true(g[0] == 4.0f && g[1] == 5.0f && g[2] == 15.0f);
    /* gamma 0 leaves h alone */
    kvx_spectral_apply(g, psi2, 3, 2, 0.0f);
    assert_true(g[0] == 4.0f && g[1] == 5.0f && g[2] == 15.0f);
}

/* The bundle inside a shard file image, and its length per its sub-header. */
static uint8_t *bundle_in(uint8_t *b, size_t *blen)
{
    uint8_t *sh = b + kvx_load64(b + 40);
    *blen = (size_t)kvx_spectral_bundle_bytes(kvx_load32(sh + KVX_S_COUNT), kvx_load32(sh + KVX_S_LAYERS),
                                              kvx_load32(sh + KVX_S_DIM), kvx_load32(sh + KVX_S_RANK));
    assert_true(*blen > 32);
    return sh;
}

static uint32_t crc_whole_bundle(const uint8_t *sh, size_t blen)
{
    uint8_t *copy = malloc(blen);
    memcpy(copy, sh, blen);
    memset(copy + 20, 0, 4);
    uint32_t crc = kvx_crc32c(0, copy, blen);
    free(copy);
    return crc;
}

static uint32_t crc_wave1(const uint8_t *sh, size_t blen) { return kvx_crc32c(0, sh + 32, blen - 32); }

/* Opens the bytes; expects KVX_ESPECTRAL with want (and not unwanted) in the message. */
static void expect_spectral_refusal(const uint8_t *b, size_t len, const char *want, const char *unwanted,
                                    const char *what)
{
    int rc = open_bytes(b, len);
    if (rc != KVX_ESPECTRAL)
        fail_msg("%s: got %s (%s), expected KVX_ESPECTRAL", what, kvx_err_name(rc), kvx_last_error());
    if (!strstr(kvx_last_error(), want))
        fail_msg("%s: message \"%s\" does not say \"%s\"", what, kvx_last_error(), want);
    if (unwanted && strstr(kvx_last_error(), unwanted))
        fail_msg("%s: message \"%s\" says \"%s\"", what, kvx_last_error(), unwanted);
}

/* A flipped bit of first_layer, or n_layers and rank exchanged (the same
 * size, so the records and their wave-1 CRC are untouched), moved steering
 * to other layers while open and verify said OK. Now each is a CRC error. */
/* PROMISE: FORMAT-12 */
static void test_spectral_subheader_crc(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
    f.sp.n_layers = 1; /* layer 0 of L = 2: first_layer 1 is in range too */
    const char *path = path_of("sub.kvx");
    assert_int_equal(write_fixture(&f, path), 0);
    size_t len, blen;
    uint8_t *base = read_file(path, &len);
    uint8_t *sh = bundle_in(base, &blen);
    assert_int_equal(kvx_load32(sh + KVX_S_CRC), crc_whole_bundle(sh, blen)); /* the writer's rule */
    assert_int_equal(open_bytes(base, len), 0);

    static const struct { const char *what; uint32_t first, layers, rank; } cases[] = {
        {"first_layer bit 0 flipped (0 -> 1)", 1, 1, 2},
        {"n_layers 1 -> 2 and rank 2 -> 1 (same bundle size)", 0, 2, 1},
        {"n_layers bit 0 flipped (1 -> 0)", 0, 0, 2},
        {"rank bit 0 flipped (2 -> 3)", 0, 1, 3},
    };
    uint8_t *b = malloc(len);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        memcpy(b, base, len);
        uint8_t *h = b + (sh - base);
        kvx_store32(h + KVX_S_FIRST_LAYER, cases[k].first);
        kvx_store32(h + KVX_S_LAYERS, cases[k].layers);
        kvx_store32(h + KVX_S_RANK, cases[k].rank);
        assert_int_not_equal(open_bytes(b, len), 0);
        assert_true(kvx_last_error()[0] != '\0');
    }
    /* the first two keep every other rule: only the CRC refuses them */
    for (size_t k = 0; k < 2; k++) {
        memcpy(b, base, len);
        uint8_t *h = b + (sh - base);
        kvx_store32(h + KVX_S_FIRST_LAYER, cases[k].first);
        kvx_store32(h + KVX_S_LAYERS, cases[k].layers);
        kvx_store32(h + KVX_S_RANK, cases[k].rank);
        expect_spectral_refusal(b, len, "crc32c", "wave-1", cases[k].what);
        /* and with the CRC recomputed by the new rule the edit is a valid
         * bundle again: proof that the CRC alone refused it */
        size_t bl;
        bundle_in(b, &bl);
        kvx_store32(h + KVX_S_CRC, crc_whole_bundle(h, bl));
        assert_int_equal(open_bytes(b, len), 0);
    }
    /* a flipped bit of the CRC field itself */
    memcpy(b, base, len);
    b[(sh - base) + KVX_S_CRC + 2] ^= 0x10;
    expect_spectral_refusal(b, len, "crc32c", "wave-1", "crc field bit");
    free(b);
    free(base);
}

/* A bundle sealed with the wave-1 rule is refused, naming the rule change;
 * no fallback. */
/* PROMISE: FORMAT-12 */
static void test_spectral_wave1_refused(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_FP16, KVX_FLAG_HASHES | KVX_FLAG_LINEAGE, 1);
    const char *path = path_of("w1.kvx");
    assert_int_equal(write_fixture(&f, path), 0);
    size_t len, blen;
    uint8_t *b = read_file(path, &len);
    uint8_t *sh = bundle_in(b, &blen);
    assert_int_equal(kvx_load32(sh + KVX_S_CRC), crc_whole_bundle(sh, blen));
    assert_int_not_equal(crc_wave1(sh, blen), crc_whole_bundle(sh, blen));
    kvx_store32(sh + KVX_S_CRC, crc_wave1(sh, blen));
    expect_spectral_refusal(b, len, "wave-1 rule (records only)", NULL, "wave-1 CRC");
    assert_non_null(strstr(kvx_last_error(), "rewrite the shard"));
    /* the same through the decoder itself, with nothing allocated (ASan) */
    kvx_spectral sp;
    uint32_t *ids = NULL;
    float *psi = NULL;
    assert_int_equal(kvx_spectral_decode(&sp, &ids, &psi, sh, blen, D, L), KVX_ESPECTRAL);
    assert_null(ids);
    assert_null(psi);
    /* a wave-1 file whose sub-header was edited since is still refused
     * (its records still match the wave-1 CRC) */
    kvx_store32(sh + KVX_S_FIRST_LAYER, 1);
    kvx_store32(sh + KVX_S_LAYERS, 1);
    kvx_store32(sh + KVX_S_RANK, 4); /* same size: 1 * 4 * 4 = 2 * 4 * 2 */
    expect_spectral_refusal(b, len, "wave-1 rule", NULL, "wave-1 CRC, sub-header edited");
    /* a record byte changed after the wave-1 CRC matches neither rule: the
     * normal CRC error */
    sh[32 + 8 + 3] ^= 0x04;
    expect_spectral_refusal(b, len, "crc32c", "wave-1", "neither rule");
    free(b);
}

/* psi NaN or +-inf: refused by the writer (cartridge, layer and element
 * named) and by the reader; finite values of any size are accepted. */
/* PROMISE: FORMAT-12 */
static void test_spectral_nonfinite(void **state)
{
    (void)state;
    fixture f;
    const size_t per = (size_t)L * D * 2, per_layer = (size_t)D * 2;
    const size_t at = 1 * per + 1 * per_layer + 5; /* cartridge 1 (id 7), layer 1, element 5 = [2][1] */
    static const uint32_t bad_bits[] = {0x7FC00000u, 0xFFC00001u, 0x7F800001u, 0x7F800000u, 0xFF800000u};
    for (size_t k = 0; k < sizeof bad_bits / sizeof bad_bits[0]; k++) {
        fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
        memcpy(&f.psi[at], &bad_bits[k], 4);
        kvx_shard_writer *w = (kvx_shard_writer *)&f;
        kvx_shard_writer_options o = options(&f);
        int rc = kvx_shard_writer_create(&w, path_of("nf.kvx"), &o);
        if (rc != KVX_ESPECTRAL)
            fail_msg("psi bits 0x%08x: writer gave %s (%s)", bad_bits[k], kvx_err_name(rc), kvx_last_error());
        assert_null(w);
        const char *msg = kvx_last_error();
        if (!strstr(msg, "cartridge 1 (id 7)") || !strstr(msg, "layer 1") || !strstr(msg, "element 5") ||
            !strstr(msg, "finite"))
            fail_msg("psi bits 0x%08x: message \"%s\" does not name cartridge, layer and element", bad_bits[k],
                     msg);
        assert_int_equal(dir_entries(), 0);
    }

    /* finite extremes go through unchanged */
    const float finite[] = {FLT_MAX, -FLT_MAX, FLT_TRUE_MIN, -FLT_TRUE_MIN, -0.0f, 1e30f};
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
    for (size_t k = 0; k < sizeof finite / sizeof finite[0]; k++) f.psi[at - k] = finite[k];
    const char *path = path_of("fin.kvx");
    assert_int_equal(write_fixture(&f, path), 0);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, KVX_OPEN_VERIFY_PAGES), 0);
    check_fixture(&f, s); /* psi compared bit for bit */
    kvx_shard_close(s);

    /* the reader: a bundle encoded without the writer's check ... */
    uint64_t blen64 = kvx_spectral_bundle_bytes(2, L, D, 2);
    uint8_t *enc = malloc((size_t)blen64);
    for (size_t k = 0; k < sizeof bad_bits / sizeof bad_bits[0]; k++) {
        fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
        memcpy(&f.psi[at], &bad_bits[k], 4);
        kvx_spectral_encode(enc, &f.sp);
        kvx_spectral sp;
        uint32_t *ids = NULL;
        float *psi = NULL;
        int rc = kvx_spectral_decode(&sp, &ids, &psi, enc, blen64, D, L);
        if (rc != KVX_ESPECTRAL)
            fail_msg("psi bits 0x%08x: decode gave %s (%s)", bad_bits[k], kvx_err_name(rc), kvx_last_error());
        assert_null(ids);
        assert_null(psi);
        assert_non_null(strstr(kvx_last_error(), "cartridge 1 (id 7), layer 1, psi element 5 ([2][1])"));
    }
    free(enc);
    /* ... and in a sealed file, with the bundle's CRC made right again */
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 1);
    path = path_of("nf_file.kvx");
    assert_int_equal(write_fixture(&f, path), 0);
    size_t len, blen;
    uint8_t *b = read_file(path, &len);
    uint8_t *sh = bundle_in(b, &blen);
    uint8_t *val = sh + 32 + 1 * (8 + per * 4) + 8 + (1 * per_layer + 5) * 4;
    kvx_store32(val, 0x7F800000u);
    kvx_store32(sh + KVX_S_CRC, crc_whole_bundle(sh, blen));
    expect_spectral_refusal(b, len, "is +inf; psi values must be finite", NULL, "psi +inf in a file");
    kvx_store32(val, 0x7FC00000u);
    kvx_store32(sh + KVX_S_CRC, crc_whole_bundle(sh, blen));
    expect_spectral_refusal(b, len, "is NaN; psi values must be finite", NULL, "psi NaN in a file");
    kvx_store32(val, 0x7F7FFFFFu); /* FLT_MAX: accepted */
    kvx_store32(sh + KVX_S_CRC, crc_whole_bundle(sh, blen));
    assert_int_equal(open_bytes(b, len), 0);
    free(b);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spectral_apply),
        cmocka_unit_test_setup(test_spectral_subheader_crc, fx_clean),
        cmocka_unit_test_setup(test_spectral_wave1_refused, fx_clean),
        cmocka_unit_test_setup(test_spectral_nonfinite, fx_clean),
    };
    return cmocka_run_group_tests_name("format/spectral", tests, fx_setup, fx_teardown);
}
