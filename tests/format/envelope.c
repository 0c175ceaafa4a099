/*
 * envelope.c - format/envelope.c: the TLKV export envelope and the
 * geometry sizes. The spec's v1 worked example is the golden vector: built
 * from its K/V values and compared with the 60 bytes typed from the spec,
 * and parsed back field by field. Each reader rule is then broken on its
 * own by mutating the golden bytes (the CRC recomputed, so only that rule
 * fails); v2's quantization and scale rules; the fuzz corpus seeds.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvx.h"

/* spec/kv-block-hash-and-envelope.txt, "Worked example (v1)". */
static const uint8_t golden[60] = {
    0x54, 0x4c, 0x4b, 0x56, 0x01, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00,
    0x66, 0x93, 0x7b, 0x02, 0xc1, 0xb0, 0x1a, 0xa9, 0x02, 0x00, 0x00, 0x00,
    0x00, 0x3c, 0x00, 0x40, 0x00, 0x42, 0x00, 0x44,
    0x00, 0x38, 0x00, 0xbc, 0x00, 0x00, 0x00, 0x34,
    0x1c, 0x54, 0x0b, 0x4f};

static void put16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }

static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }

static uint32_t get32(const uint8_t *p) { return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24; }

static void fix_crc(uint8_t *b, size_t len) { put32(b + len - 4, kvx_crc32c(0, b, len - 4)); }

static kvx_geometry geom(uint32_t B, uint32_t L, uint32_t H, uint32_t D, uint32_t q)
{
    kvx_geometry g = {L, H, D, B, q, 0};
    return g;
}

/* PROMISE: FORMAT-3 */
static void test_golden_export(void **state)
{
    (void)state;
    const float K[2][2] = {{1, 2}, {3, 4}}, V[2][2] = {{0.5f, -1}, {0, 0.25f}};
    uint16_t payload[8]; /* [L=1][K|V][Hkv=1][B=2][D=2] */
    for (int t = 0; t < 2; t++)
        for (int d = 0; d < 2; d++) {
            payload[t * 2 + d] = kvx_f32_to_f16(K[t][d]);
            payload[4 + t * 2 + d] = kvx_f32_to_f16(V[t][d]);
        }
    const uint32_t toks[2] = {1, 2};
    kvx_envelope_block_in in = {kvx_block_hash(0, toks, 2), 2, payload, NULL};
    kvx_geometry g = geom(2, 1, 1, 2, KVX_QUANT_FP16);
    size_t size = 0;
    assert_int_equal(kvx_envelope_size(&size, KVX_ENVELOPE_V1, &g, 1), 0);
    assert_int_equal(size, 60);
    assert_int_equal(kvx_envelope_payload_bytes(KVX_ENVELOPE_V1, &g), 16);
    uint8_t out[64];
    memset(out, 0xAA, sizeof out);
    assert_int_equal(kvx_envelope_export(out, sizeof out, KVX_ENVELOPE_V1, &g, &in, 1), 0);
    assert_memory_equal(out, golden, 60);
    assert_int_equal(out[60], 0xAA); /* nothing written past the envelope */
}

/* PROMISE: FORMAT-4 */
static void test_golden_parse(void **state)
{
    (void)state;
    kvx_envelope env;
    kvx_geometry expect = geom(2, 1, 1, 2, KVX_QUANT_FP16);
    assert_int_equal(kvx_envelope_parse(&env, golden, 60, &expect), 0);
    assert_int_equal(kvx_envelope_parse(&env, golden, 60, NULL), 0);
    assert_int_equal(env.version, 1);
    assert_int_equal(env.dtype, 1);
    assert_int_equal(env.n_blocks, 1);
    assert_int_equal(env.geometry.block_tokens, 2);
    assert_int_equal(env.geometry.num_layers, 1);
    assert_int_equal(env.geometry.kv_heads, 1);
    assert_int_equal(env.geometry.head_dim, 2);
    assert_int_equal(env.geometry.quant, KVX_QUANT_FP16);
    assert_int_equal(env.payload_bytes, 16);
    assert_ptr_equal(env.data, golden);
    assert_int_equal(env.size, 60);
    kvx_envelope_block blk;
    assert_int_equal(kvx_envelope_block_at(&blk, &env, 0), 0);
    assert_true(blk.hash == 0xA91AB0C1027B9366ULL);
    assert_int_equal(blk.n_tokens, 2);
    assert_ptr_equal(blk.payload, golden + 40);
    assert_null(blk.scales);
    const float want[8] = {1, 2, 3, 4, 0.5f, -1, 0, 0.25f};
    for (int i = 0; i < 8; i++)
        assert_true(kvx_f16_to_f32((uint16_t)(blk.payload[2 * i] | blk.payload[2 * i + 1] << 8)) == want[i]);
    assert_int_equal(kvx_envelope_block_at(&blk, &env, 1), KVX_EINVALID);
}

/* Parse a mutated copy of the golden bytes; check code and message. */
static void expect_reject(const uint8_t *b, size_t len, const kvx_geometry *expect, int code, const char *word)
{
    kvx_envelope env;
    memset(&env, 0x5A, sizeof env);
    int rc = kvx_envelope_parse(&env, b, len, expect);
    if (rc != code) fail_msg("expected %s, got %s (%s)", kvx_err_name(code), kvx_err_name(rc), kvx_last_error());
    if (!strstr(kvx_last_error(), word)) fail_msg("message \"%s\" does not name \"%s\"", kvx_last_error(), word);
    assert_int_equal(env.version, 0x5A5A); /* out untouched on failure */
    /* the one-pass import refuses it alike: the same code and message word */
    static float room[1 << 12];
    rc = kvx_envelope_decode_f32(room, sizeof room / sizeof room[0], &env, b, len, expect);
    if (rc != code)
        fail_msg("decode_f32: expected %s, got %s (%s)", kvx_err_name(code), kvx_err_name(rc), kvx_last_error());
    if (!strstr(kvx_last_error(), word))
        fail_msg("decode_f32: message \"%s\" does not name \"%s\"", kvx_last_error(), word);
    assert_int_equal(env.version, 0x5A5A);
}

/* PROMISE: FORMAT-4 */
static void test_reader_rules(void **state)
{
    (void)state;
    uint8_t b[128];
    kvx_geometry expect = geom(2, 1, 1, 2, KVX_QUANT_FP16);

    /* 1. length >= 32 */
    expect_reject(golden, 31, NULL, KVX_EFORMAT, "32-byte minimum");
    expect_reject(golden, 0, NULL, KVX_EFORMAT, "32-byte minimum");
    /* 2. magic */
    memcpy(b, golden, 60); b[3] = 'W'; fix_crc(b, 60);
    expect_reject(b, 60, NULL, KVX_EFORMAT, "magic");
    /* 3. version: an intact envelope of version 4 or 0 is EVERSION ... */
    memcpy(b, golden, 60); put16(b + 4, 4); fix_crc(b, 60);
    expect_reject(b, 60, NULL, KVX_EVERSION, "version 4");
    memcpy(b, golden, 60); put16(b + 4, 0); fix_crc(b, 60);
    expect_reject(b, 60, NULL, KVX_EVERSION, "version 0");
    /* ... a damaged one (CRC not matching) is a format error. */
    memcpy(b, golden, 60); put16(b + 4, 4);
    expect_reject(b, 60, NULL, KVX_EFORMAT, "crc32c");
    /* ... version 3 (kvx's bf16) is known: the v1 golden's dtype 1 is not its dtype 2 */
    memcpy(b, golden, 60); put16(b + 4, 3); fix_crc(b, 60);
    expect_reject(b, 60, NULL, KVX_EFORMAT, "expected 2");
    /* 4. dtype must be the version's */
    memcpy(b, golden, 60); put16(b + 6, 3); fix_crc(b, 60);
    expect_reject(b, 60, NULL, KVX_EFORMAT, "dtype");
    memcpy(b, golden, 60); put16(b + 6, 0); fix_crc(b, 60);
    expect_reject(b, 60, NULL, KVX_EFORMAT, "dtype");
    memcpy(b, golden, 60); put16(b + 4, 2); fix_crc(b, 60); /* v2 with dtype 1 */
    expect_reject(b, 60, NULL, KVX_EFORMAT, "dtype");
    /* 5. zero dimensions, overflow, length == 28 + n(12+P) + 4 */
    memcpy(b, golden, 60); put32(b + 24, 0); fix_crc(b, 60);
    expect_reject(b, 60, NULL, KVX_EFORMAT, "zero dimension");
    memcpy(b, golden, 60); put32(b + 12, 0); fix_crc(b, 60);
    expect_reject(b, 60, NULL, KVX_EFORMAT, "zero dimension");
    memcpy(b, golden, 60); put32(b + 8, 2); fix_crc(b, 60); /* n = 2 needs 116 bytes */
    expect_reject(b, 60, NULL, KVX_EFORMAT, "length 60");
    memcpy(b, golden, 60); put32(b + 8, 0xFFFFFFFFu); fix_crc(b, 60);
    expect_reject(b, 60, NULL, KVX_EFORMAT, "length 60");
    memcpy(b, golden, 60); put32(b + 8, 0); fix_crc(b, 60); /* n = 0 is 32 bytes */
    expect_reject(b, 60, NULL, KVX_EFORMAT, "length 60");
    memcpy(b, golden, 60); b[60] = 0; fix_crc(b, 61); /* one byte too many */
    expect_reject(b, 61, NULL, KVX_EFORMAT, "length 61");
    memcpy(b, golden, 56); fix_crc(b, 56); /* truncated */
    expect_reject(b, 56, NULL, KVX_EFORMAT, "length 56");
    /* Dimensions whose true size is ~2^66 but whose size formula wraps
     * mod 2^64 to exactly 60: only overflow checks catch this. 34724 *
     * 27905 * 49477 * 384773 = 4 * 2^62 + 4, so P = 4*that = 16 mod 2^64. */
    memcpy(b, golden, 60);
    put32(b + 12, 34724); put32(b + 16, 27905); put32(b + 20, 49477); put32(b + 24, 384773);
    fix_crc(b, 60);
    expect_reject(b, 60, NULL, KVX_EFORMAT, "overflows");
    memcpy(b, golden, 60);
    put32(b + 8, 0xFFFFFFFFu); put32(b + 12, 0xFFFFFFFFu); put32(b + 16, 0xFFFFFFFFu);
    put32(b + 20, 0xFFFFFFFFu); put32(b + 24, 0xFFFFFFFFu); fix_crc(b, 60);
    expect_reject(b, 60, NULL, KVX_EFORMAT, "overflows");
    /* 6. CRC */
    memcpy(b, golden, 60); b[45] ^= 0x01;
    expect_reject(b, 60, NULL, KVX_EFORMAT, "crc32c");
    memcpy(b, golden, 60); b[59] ^= 0x80;
    expect_reject(b, 60, NULL, KVX_EFORMAT, "crc32c");
    /* 7. dimensions against the receiving pool's */
    kvx_geometry e;
    e = expect; e.block_tokens = 16; expect_reject(golden, 60, &e, KVX_ESHAPE, "block_tokens");
    e = expect; e.num_layers = 2; expect_reject(golden, 60, &e, KVX_ESHAPE, "n_layers");
    e = expect; e.kv_heads = 8; expect_reject(golden, 60, &e, KVX_ESHAPE, "n_kv_heads");
    e = expect; e.head_dim = 128; expect_reject(golden, 60, &e, KVX_ESHAPE, "head_dim");
    /* 8. n_tokens in 1..B, and a hashed block is full */
    memcpy(b, golden, 60); put32(b + 36, 0); fix_crc(b, 60);
    expect_reject(b, 60, NULL, KVX_EFORMAT, "n_tokens 0");
    memcpy(b, golden, 60); put32(b + 36, 3); fix_crc(b, 60);
    expect_reject(b, 60, NULL, KVX_EFORMAT, "n_tokens 3");
    memcpy(b, golden, 60); put32(b + 36, 1); fix_crc(b, 60);
    expect_reject(b, 60, NULL, KVX_EFORMAT, "block_hash");
    /* ... while an unhashed partial block is fine. */
    memcpy(b, golden, 60); put32(b + 36, 1); put64(b + 28, 0); fix_crc(b, 60);
    kvx_envelope env;
    assert_int_equal(kvx_envelope_parse(&env, b, 60, &expect), 0);
    /* And an n = 0 envelope is the 32-byte minimum. */
    memcpy(b, golden, 28); put32(b + 8, 0); fix_crc(b, 32);
    assert_int_equal(kvx_envelope_parse(&env, b, 32, &expect), 0);
    assert_int_equal(env.n_blocks, 0);
    /* expect with B = 0 ("not given") accepts any B. */
    e = expect; e.block_tokens = 0;
    assert_int_equal(kvx_envelope_parse(&env, golden, 60, &e), 0);
}

/* v1 partial block: positions >= n_tokens are written as zero bytes. */
/* PROMISE: FORMAT-3 */
static void test_v1_zero_fill(void **state)
{
    (void)state;
    kvx_geometry g = geom(4, 2, 3, 5, KVX_QUANT_FP16); /* B=4 L=2 Hkv=3 D=5 */
    const size_t elems = 2 * 2 * 3 * 4 * 5;
    uint16_t *pay = malloc(elems * 2);
    assert_non_null(pay);
    for (size_t i = 0; i < elems; i++) pay[i] = (uint16_t)(0x3C00 + i);
    kvx_envelope_block_in in[2] = {{0x1234, 4, pay, NULL}, {0, 3, pay, NULL}};
    size_t size;
    assert_int_equal(kvx_envelope_size(&size, KVX_ENVELOPE_V1, &g, 2), 0);
    assert_int_equal(size, 28 + 2 * (12 + elems * 2) + 4);
    uint8_t *buf = malloc(size);
    assert_int_equal(kvx_envelope_export(buf, size, KVX_ENVELOPE_V1, &g, in, 2), 0);
    kvx_envelope env;
    assert_int_equal(kvx_envelope_parse(&env, buf, size, &g), 0);
    kvx_envelope_block blk;
    assert_int_equal(kvx_envelope_block_at(&blk, &env, 0), 0);
    assert_memory_equal(blk.payload, pay, elems * 2);
    assert_true(blk.hash == 0x1234);
    assert_int_equal(kvx_envelope_block_at(&blk, &env, 1), 0);
    assert_int_equal(blk.n_tokens, 3);
    assert_true(blk.hash == 0);
    for (size_t s = 0; s < 12; s++) /* 12 slabs of B*D = 20 elements */
        for (size_t t = 0; t < 4; t++)
            for (size_t d = 0; d < 5; d++) {
                size_t i = s * 20 + t * 5 + d;
                uint16_t v = (uint16_t)(blk.payload[2 * i] | blk.payload[2 * i + 1] << 8);
                assert_int_equal(v, t < 3 ? pay[i] : 0);
            }
    free(buf);
    free(pay);
}

static void test_export_errors(void **state)
{
    (void)state;
    kvx_geometry g = geom(2, 1, 1, 2, KVX_QUANT_FP16);
    uint16_t pay[8] = {0};
    float sc[2] = {1, 1};
    uint8_t buf[128];
    memset(buf, 0xEE, sizeof buf);
    kvx_envelope_block_in in = {0, 2, pay, sc};
    assert_int_equal(kvx_envelope_export(buf, 59, KVX_ENVELOPE_V1, &g, &in, 1), KVX_ECAPACITY);
    assert_int_equal(kvx_envelope_export(buf, 60, 4, &g, &in, 1), KVX_EVERSION);
    in.n_tokens = 0;
    assert_int_equal(kvx_envelope_export(buf, 60, KVX_ENVELOPE_V1, &g, &in, 1), KVX_ETOKENS);
    in.n_tokens = 3;
    assert_int_equal(kvx_envelope_export(buf, 60, KVX_ENVELOPE_V1, &g, &in, 1), KVX_ETOKENS);
    in.n_tokens = 1; in.hash = 5;
    assert_int_equal(kvx_envelope_export(buf, 60, KVX_ENVELOPE_V1, &g, &in, 1), KVX_EHASH);
    assert_non_null(strstr(kvx_last_error(), "hash"));
    in.hash = 0; in.payload = NULL;
    assert_int_equal(kvx_envelope_export(buf, 60, KVX_ENVELOPE_V1, &g, &in, 1), KVX_EINVALID);
    in.payload = pay; in.scales = NULL;
    assert_int_equal(kvx_envelope_export(buf, 128, KVX_ENVELOPE_V2, &g, &in, 1), KVX_EINVALID);
    for (size_t i = 0; i < sizeof buf; i++) assert_int_equal(buf[i], 0xEE); /* nothing written */
    kvx_geometry z = geom(0, 1, 1, 2, KVX_QUANT_FP16);
    size_t size;
    assert_int_equal(kvx_envelope_size(&size, KVX_ENVELOPE_V1, &z, 1), KVX_EINVALID);
    kvx_geometry huge = geom(0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, KVX_QUANT_FP16);
    assert_int_equal(kvx_envelope_size(&size, KVX_ENVELOPE_V1, &huge, 1), KVX_EOVERFLOW);
    assert_int_equal(kvx_envelope_payload_bytes(KVX_ENVELOPE_V2, &huge), 0);
    kvx_geometry big = geom(16, 32, 16, 128, KVX_QUANT_FP16);
    assert_int_equal(kvx_envelope_size(&size, KVX_ENVELOPE_V1, &big, 0xFFFFFFFFu), 0);
    assert_true(size == 32 + (uint64_t)0xFFFFFFFFu * (12 + 4194304));
    assert_int_equal(kvx_envelope_payload_bytes(KVX_ENVELOPE_V2, &big), 32 * 2 * 16 * (16 * 128 + 4));
    assert_int_equal(kvx_envelope_payload_bytes(KVX_ENVELOPE_V3, &big), kvx_envelope_payload_bytes(KVX_ENVELOPE_V1, &big));
    assert_int_equal(kvx_envelope_payload_bytes(4, &big), 0);
}

static uint32_t rs = 99;

static float frand(void) /* roughly N(0, 1)-ish, deterministic */
{
    float s = 0;
    for (int i = 0; i < 4; i++) { rs = rs * 1103515245u + 12345u; s += (float)(rs >> 8) / 16777216.0f - 0.5f; }
    return s * 1.7f;
}

/* PROMISE: FORMAT-5 */
static void test_v2_quantize_rule(void **state)
{
    (void)state;
    kvx_geometry g = geom(4, 2, 3, 8, KVX_QUANT_E4M3);
    const size_t slabs = 12, slab = 32, elems = slabs * slab;
    float *kv = malloc(elems * sizeof *kv);
    uint8_t *q = malloc(elems);
    float sc[12];
    assert_true(kv && q);
    for (size_t i = 0; i < elems; i++) kv[i] = frand() * (float)(1 + i % 7) * 10.0f;
    /* slab 5 all zero in the filled part; unfilled positions hold huge
     * values that must not affect any scale and must come out as 0. */
    const uint32_t nt = 3;
    for (size_t i = 0; i < nt * 8; i++) kv[5 * slab + i] = 0.0f;
    for (size_t s = 0; s < slabs; s++)
        for (size_t i = nt * 8; i < slab; i++) kv[s * slab + i] = 1e30f;
    memset(q, 0xCC, elems);
    assert_int_equal(kvx_envelope_quantize_v2(q, sc, kv, &g, nt), 0);
    for (size_t s = 0; s < slabs; s++) {
        float amax = 0;
        for (size_t i = 0; i < nt * 8; i++) amax = fmaxf(amax, fabsf(kv[s * slab + i]));
        float want = amax == 0 ? 1.0f : amax / 448.0f;
        assert_true(sc[s] == want); /* exactly amax / 448 */
        int hit_max = 0;
        for (size_t i = 0; i < slab; i++) {
            uint8_t b = q[s * slab + i];
            if (i >= nt * 8) { assert_int_equal(b, 0); continue; }
            float x = kv[s * slab + i];
            /* Nothing saturates: x/scale stays within 448 up to the
             * rounding of amax/448 and of the division (2 ulp), far below
             * 464, where E4M3's RNE would leave the finite range. */
            assert_true(fabsf(x / sc[s]) <= 448.0f * (1.0f + 0x1p-22f));
            assert_int_equal(b, kvx_f32_to_e4m3(x / sc[s])); /* RNE of x/scale */
            assert_true((b & 0x7F) != 0x7F);
            if ((b & 0x7F) == 0x7E) hit_max = 1;
            /* Decoded error within half an e4m3 step. */
            float dec = kvx_e4m3_to_f32(b) * sc[s];
            assert_true(fabsf(dec - x) <= fmaxf(fabsf(x) * 0x1p-4f, sc[s] * 0x1p-10f) * 1.0001f);
        }
        if (amax > 0) assert_true(hit_max); /* amax maps to +-448 */
    }
    assert_true(sc[5] == 1.0f);
    for (size_t i = 0; i < slab; i++) assert_int_equal(q[5 * slab + i], 0);

    /* Errors. */
    assert_int_equal(kvx_envelope_quantize_v2(q, sc, kv, &g, 0), KVX_ETOKENS);
    assert_int_equal(kvx_envelope_quantize_v2(q, sc, kv, &g, 5), KVX_ETOKENS);
    kv[7] = NAN;
    assert_int_equal(kvx_envelope_quantize_v2(q, sc, kv, &g, nt), KVX_EINVALID);
    kv[7] = INFINITY;
    assert_int_equal(kvx_envelope_quantize_v2(q, sc, kv, &g, nt), KVX_EINVALID);
    free(kv);
    free(q);
}

/* PROMISE: FORMAT-5 */
static void test_v2_roundtrip(void **state)
{
    (void)state;
    kvx_geometry g = geom(4, 2, 2, 8, KVX_QUANT_E4M3);
    const size_t slabs = 8, elems = slabs * 32;
    float *kv = malloc(2 * elems * sizeof *kv);
    uint8_t *q = malloc(2 * elems);
    float sc[2][8];
    for (size_t i = 0; i < 2 * elems; i++) kv[i] = frand();
    assert_int_equal(kvx_envelope_quantize_v2(q, sc[0], kv, &g, 4), 0);
    assert_int_equal(kvx_envelope_quantize_v2(q + elems, sc[1], kv + elems, &g, 2), 0);
    kvx_envelope_block_in in[2] = {{0xFEEDu, 4, q, sc[0]}, {0, 2, q + elems, sc[1]}};
    size_t size;
    assert_int_equal(kvx_envelope_size(&size, KVX_ENVELOPE_V2, &g, 2), 0);
    assert_int_equal(size, 28 + 2 * (12 + elems + 4 * slabs) + 4);
    uint8_t *buf = malloc(size);
    assert_int_equal(kvx_envelope_export(buf, size, KVX_ENVELOPE_V2, &g, in, 2), 0);
    assert_int_equal(get32(buf + size - 4), kvx_crc32c(0, buf, size - 4));
    kvx_envelope env;
    assert_int_equal(kvx_envelope_parse(&env, buf, size, &g), 0);
    assert_int_equal(env.version, 2);
    assert_int_equal(env.dtype, 3);
    assert_int_equal(env.geometry.quant, KVX_QUANT_E4M3);
    assert_int_equal(env.payload_bytes, elems + 4 * slabs);
    for (uint32_t k = 0; k < 2; k++) {
        kvx_envelope_block blk;
        assert_int_equal(kvx_envelope_block_at(&blk, &env, k), 0);
        assert_int_equal(blk.n_tokens, in[k].n_tokens);
        assert_true(blk.hash == in[k].hash);
        assert_memory_equal(blk.payload, q + k * elems, elems);
        assert_ptr_equal(blk.scales, blk.payload + elems);
        float dec[32];
        for (size_t s = 0; s < slabs; s++) {
            uint32_t u = get32(blk.scales + 4 * s);
            float f;
            memcpy(&f, &u, 4);
            assert_true(f == sc[k][s]);
            kvx_e4m3_to_f32_n(dec, blk.payload + s * 32, 32, f);
            for (size_t i = 0; i < 32; i++) {
                float x = kv[k * elems + s * 32 + i];
                if (i >= in[k].n_tokens * 8u) { assert_true(dec[i] == 0.0f); continue; }
                assert_true(fabsf(dec[i] - x) <= fmaxf(fabsf(x) * 0x1p-4f, f * 0x1p-10f) * 1.0001f);
            }
        }
    }
    /* A v2 envelope's version byte set to 1 is a dtype error, and a
     * v1-shaped expect with other dimensions is a shape error. */
    buf[4] = 1; fix_crc(buf, size);
    assert_int_equal(kvx_envelope_parse(&env, buf, size, NULL), KVX_EFORMAT);
    free(buf); free(q); free(kv);
}

/* DESIGN.md "Envelope and hash": a reader refuses a v2 scale that is not
 * finite and > 0 (KVX_EFORMAT naming block, scale and value), whatever the
 * CRC says. Hand-built: a valid two-block v2 envelope with one scale
 * replaced and the CRC recomputed. */
/* PROMISE: FORMAT-6 */
static void test_v2_scale_rule(void **state)
{
    (void)state;
    kvx_geometry g = geom(4, 2, 1, 4, KVX_QUANT_E4M3); /* 4 slabs of 16 */
    const size_t slabs = 4, elems = slabs * 16;
    float kv[2][64], sc[2][4];
    uint8_t q[2][64];
    for (size_t i = 0; i < 2 * elems; i++) kv[i / elems][i % elems] = frand();
    assert_int_equal(kvx_envelope_quantize_v2(q[0], sc[0], kv[0], &g, 4), 0);
    assert_int_equal(kvx_envelope_quantize_v2(q[1], sc[1], kv[1], &g, 2), 0);
    kvx_envelope_block_in in[2] = {{0, 4, q[0], sc[0]}, {0, 2, q[1], sc[1]}};
    size_t size;
    assert_int_equal(kvx_envelope_size(&size, KVX_ENVELOPE_V2, &g, 2), 0);
    uint8_t good[512], b[512];
    assert_true(size <= sizeof good);
    assert_int_equal(kvx_envelope_export(good, size, KVX_ENVELOPE_V2, &g, in, 2), 0);
    kvx_envelope env;
    assert_int_equal(kvx_envelope_parse(&env, good, size, &g), 0);
    /* block 1, scale 3: after its header (12) and elems bytes, 4 bytes each */
    const size_t rec = 12 + elems + 4 * slabs;
    const size_t at = 28 + rec + 12 + elems + 4 * 3;
    static const struct { uint32_t bits; const char *printed; } bad[] = {
        {0x7FC00000u, "nan"},  /* NaN */
        {0xFFC00000u, "nan"},  /* -NaN ("-nan") */
        {0x7F800001u, "nan"},  /* signalling NaN */
        {0x7F800000u, "inf"},  /* +inf */
        {0xFF800000u, "-inf"}, /* -inf */
        {0x00000000u, "is 0"}, /* +0 */
        {0x80000000u, "-0"},   /* -0: not > 0 */
        {0xBF800000u, "-1"},   /* -1 */
        {0x80000001u, "-1.4"}, /* the negative subnormal -2^-149 */
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        memcpy(b, good, size);
        put32(b + at, bad[k].bits);
        fix_crc(b, size);
        expect_reject(b, size, NULL, KVX_EFORMAT, "envelope block 1: scale 3");
        if (!strstr(kvx_last_error(), bad[k].printed) || !strstr(kvx_last_error(), "finite and > 0"))
            fail_msg("bits 0x%08x: message \"%s\" does not give the value \"%s\"", bad[k].bits,
                     kvx_last_error(), bad[k].printed);
        expect_reject(b, size, &g, KVX_EFORMAT, "scale 3"); /* with expect too */
    }
    /* block 0, scale 0: the first scale of the envelope */
    memcpy(b, good, size);
    put32(b + 28 + 12 + elems, 0xFF800000u);
    fix_crc(b, size);
    expect_reject(b, size, NULL, KVX_EFORMAT, "envelope block 0: scale 0");
    /* finite and > 0 of any size is accepted: the smallest subnormal, the
     * smallest normal, 1, FLT_MAX */
    static const uint32_t fine[] = {0x00000001u, 0x00800000u, 0x3F800000u, 0x7F7FFFFFu};
    for (size_t k = 0; k < sizeof fine / sizeof fine[0]; k++) {
        memcpy(b, good, size);
        put32(b + at, fine[k]);
        fix_crc(b, size);
        if (kvx_envelope_parse(&env, b, size, &g) != 0)
            fail_msg("bits 0x%08x refused: %s", fine[k], kvx_last_error());
        kvx_envelope_block blk;
        assert_int_equal(kvx_envelope_block_at(&blk, &env, 1), 0);
        assert_int_equal(get32(blk.scales + 12), fine[k]);
    }
    /* v1 has no scales: the same bytes there are payload, any value */
    kvx_geometry g1 = geom(4, 2, 1, 4, KVX_QUANT_FP16);
    uint16_t pay[64];
    for (int i = 0; i < 64; i++) pay[i] = 0x7E00; /* f16 NaN */
    kvx_envelope_block_in in1 = {0, 4, pay, NULL};
    assert_int_equal(kvx_envelope_size(&size, KVX_ENVELOPE_V1, &g1, 1), 0);
    assert_int_equal(kvx_envelope_export(b, sizeof b, KVX_ENVELOPE_V1, &g1, &in1, 1), 0);
    assert_int_equal(kvx_envelope_parse(&env, b, size, &g1), 0);
}

static void test_geometry(void **state)
{
    (void)state;
    assert_int_equal(kvx_quant_elem_size(KVX_QUANT_FP16), 2);
    assert_int_equal(kvx_quant_elem_size(KVX_QUANT_E4M3), 1);
    assert_int_equal(kvx_quant_elem_size(KVX_QUANT_E5M2), 1);
    assert_int_equal(kvx_quant_elem_size(KVX_QUANT_BF16), 2);
    assert_int_equal(kvx_quant_elem_size(4), 0);
    assert_string_equal(kvx_quant_name(KVX_QUANT_FP16), "fp16");
    assert_string_equal(kvx_quant_name(KVX_QUANT_E4M3), "e4m3");
    assert_string_equal(kvx_quant_name(KVX_QUANT_E5M2), "e5m2");
    assert_string_equal(kvx_quant_name(KVX_QUANT_BF16), "bf16");
    assert_null(kvx_quant_name(4));
    assert_null(kvx_quant_name(99));
    /* DESIGN: seed model, FP8 = 128 KiB per token, 2 MiB per 16-token block. */
    kvx_geometry g = geom(16, 32, 16, 128, KVX_QUANT_E4M3);
    assert_true(kvx_page_bytes(&g, 1) == 128 * 1024);
    assert_true(kvx_page_bytes(&g, 16) == 2 * 1024 * 1024);
    g.quant = KVX_QUANT_FP16;
    assert_true(kvx_page_bytes(&g, 16) == 4 * 1024 * 1024);
    g.quant = KVX_QUANT_BF16;
    assert_true(kvx_page_bytes(&g, 16) == 4 * 1024 * 1024);
    assert_true(kvx_scale_count(&g) == 32 * 2 * 16);
    g.quant = 7;
    assert_true(kvx_page_bytes(&g, 16) == 0);
    kvx_geometry h = geom(0, 0xFFFFFFFFu, 0xFFFFFFFFu, 0xFFFFFFFFu, KVX_QUANT_FP16);
    assert_true(kvx_page_bytes(&h, 0xFFFFFFFFu) == 0); /* overflow */
    assert_true(kvx_page_bytes(NULL, 1) == 0);
}

static void write_file(const char *dir, const char *name, const void *b, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b, 1, len, f), len);
    fclose(f);
}

static void test_write_corpus(void **state)
{
    (void)state;
    const char *dir = getenv("KVX_WRITE_CORPUS");
    if (!dir) skip();
    uint8_t b[4096];
    write_file(dir, "v1_spec_example", golden, 60);
    memcpy(b, golden, 28); put32(b + 8, 0); fix_crc(b, 32);
    write_file(dir, "v1_empty", b, 32);
    /* v1: two blocks, the second a partial tail. */
    kvx_geometry g = geom(4, 2, 1, 4, KVX_QUANT_FP16);
    uint16_t pay[64];
    for (int i = 0; i < 64; i++) pay[i] = kvx_f32_to_f16((float)i - 20.5f);
    uint32_t toks[4] = {7, 8, 9, 10};
    kvx_envelope_block_in in1[2] = {{kvx_block_hash(0, toks, 4), 4, pay, NULL}, {0, 1, pay, NULL}};
    size_t size;
    assert_int_equal(kvx_envelope_size(&size, KVX_ENVELOPE_V1, &g, 2), 0);
    assert_int_equal(kvx_envelope_export(b, sizeof b, KVX_ENVELOPE_V1, &g, in1, 2), 0);
    write_file(dir, "v1_two_blocks", b, size);
    /* v2: the same blocks quantized. */
    float kv[64], sc[2][4];
    uint8_t q[2][64];
    for (int i = 0; i < 64; i++) kv[i] = ((float)i - 20.5f) / 3.0f;
    assert_int_equal(kvx_envelope_quantize_v2(q[0], sc[0], kv, &g, 4), 0);
    assert_int_equal(kvx_envelope_quantize_v2(q[1], sc[1], kv, &g, 1), 0);
    kvx_envelope_block_in in2[2] = {{in1[0].hash, 4, q[0], sc[0]}, {0, 1, q[1], sc[1]}};
    assert_int_equal(kvx_envelope_size(&size, KVX_ENVELOPE_V2, &g, 2), 0);
    assert_int_equal(kvx_envelope_export(b, sizeof b, KVX_ENVELOPE_V2, &g, in2, 2), 0);
    write_file(dir, "v2_two_blocks", b, size);
    assert_int_equal(kvx_envelope_export(b, sizeof b, KVX_ENVELOPE_V2, &g, in2 + 1, 1), 0);
    assert_int_equal(kvx_envelope_size(&size, KVX_ENVELOPE_V2, &g, 1), 0);
    write_file(dir, "v2_partial", b, size);
    /* Damaged ones. */
    memcpy(b, golden, 60); b[45] ^= 1;
    write_file(dir, "bad_crc", b, 60);
    write_file(dir, "bad_truncated", golden, 50);
    memcpy(b, golden, 60); put16(b + 4, 3); fix_crc(b, 60);
    write_file(dir, "bad_version3", b, 60);
    memcpy(b, golden, 60);
    put32(b + 12, 34724); put32(b + 16, 27905); put32(b + 20, 49477); put32(b + 24, 384773);
    fix_crc(b, 60);
    write_file(dir, "bad_size_wraps", b, 60);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_export),
        cmocka_unit_test(test_golden_parse),
        cmocka_unit_test(test_reader_rules),
        cmocka_unit_test(test_v1_zero_fill),
        cmocka_unit_test(test_export_errors),
        cmocka_unit_test(test_v2_quantize_rule),
        cmocka_unit_test(test_v2_roundtrip),
        cmocka_unit_test(test_v2_scale_rule),
        cmocka_unit_test(test_geometry),
        cmocka_unit_test(test_write_corpus),
    };
    return cmocka_run_group_tests_name("format/envelope", tests, NULL, NULL);
}
