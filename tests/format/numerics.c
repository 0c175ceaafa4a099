/*
 * numerics.c - format/numerics.c: f16 / E4M3FN / E5M2 / bf16 conversions.
 *
 * Decoders are checked exhaustively against the formats' defining formulas
 * (computed with ldexp, not with our code); encoders against a brute-force
 * nearest-value reference over the format's full value list (ties to the
 * even code), so rounding, subnormals, saturation and overflow are tested
 * on every input. The bulk (SIMD) forms must equal the scalar ones bit for
 * bit; the program runs itself again with KVX_DISABLE_SIMD=1 so the
 * portable fallbacks are tested too.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "format/numerics.h"
#include "kvx.h"

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static uint32_t rng_state = 0x12345678u;

static uint32_t rnd(void) /* xorshift32: deterministic and fast */
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}

static double def_f16(uint16_t h) /* NaN/inf handled by callers */
{
    int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? INFINITY : ldexp(1024 + m, e - 25);
    return s ? -v : v;
}

static double def_e4m3(uint8_t b)
{
    int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
    double v = e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
    return s ? -v : v;
}

static double def_e5m2(uint8_t b)
{
    int s = b >> 7, e = (b >> 2) & 31, m = b & 3;
    double v = e == 0 ? ldexp(m, -16) : e == 31 ? INFINITY : ldexp(4 + m, e - 17);
    return s ? -v : v;
}

/* Nearest code by brute force over the ascending list of non-negative
 * finite codes vals[0..n) (code i has value vals[i]); ties to the even
 * code. Returns -1 when |x| lies past max + half an ulp (overflow). */
static int nearest(const double *vals, int n, double ax, double overflow_at)
{
    if (ax >= overflow_at) return -1;
    int lo = 0, hi = n - 1;
    while (hi - lo > 1) { /* vals[lo] <= ax < vals[hi] after the search */
        int mid = (lo + hi) / 2;
        if (vals[mid] <= ax) lo = mid; else hi = mid;
    }
    if (ax >= vals[n - 1]) return n - 1;
    double dl = ax - vals[lo], dh = vals[hi] - ax;
    if (dl < dh) return lo;
    if (dh < dl) return hi;
    return (lo & 1) ? hi : lo;
}

/* PROMISE: FORMAT-8 */
static void test_f16_decode_exhaustive(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = kvx_f16_to_f32((uint16_t)h);
        int e = (h >> 10) & 31, m = h & 1023;
        if (e == 31 && m) {
            assert_true(isnan(f));
            assert_int_equal(fbits(f) >> 31, h >> 15);
            /* quiet, payload kept */
            assert_int_equal(fbits(f) & 0x7FFFFF, 0x400000u | ((uint32_t)m << 13));
        } else {
            assert_true((double)f == def_f16((uint16_t)h));
            assert_int_equal(fbits(f) >> 31, h >> 15); /* -0 stays -0 */
        }
    }
}

/* PROMISE: FORMAT-8 */
static void test_f16_roundtrip_exhaustive(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t back = kvx_f32_to_f16(kvx_f16_to_f32((uint16_t)h));
        int nan = ((h >> 10) & 31) == 31 && (h & 1023);
        /* Every non-NaN is exact; a NaN comes back quiet (bit 9 set). */
        assert_int_equal(back, nan ? (h | 0x200u) : h);
    }
}

/* PROMISE: FORMAT-8 */
static void test_f16_encode_vs_reference(void **state)
{
    (void)state;
    static double vals[31744]; /* codes 0x0000..0x7BFF */
    for (int i = 0; i < 31744; i++) vals[i] = def_f16((uint16_t)i);
    double overflow = 65504.0 + 16.0; /* max + half an ulp (ulp 32) */
    for (int k = 0; k < 400000; k++) {
        uint32_t u = rnd();
        /* Half the samples near the f16 range so every binade is hit. */
        if (k & 1) u = (u & 0x80FFFFFFu) | ((uint32_t)(100 + (rnd() % 45)) << 23);
        float x = bitsf(u);
        if (isnan(x)) continue;
        uint16_t h = kvx_f32_to_f16(x);
        int want = nearest(vals, 31744, fabs((double)x), overflow);
        uint16_t exp = (uint16_t)((u >> 16 & 0x8000u) | (want < 0 ? 0x7C00u : (unsigned)want));
        if (h != exp) fail_msg("f32 %08x -> f16 %04x, expected %04x", u, h, exp);
    }
}

/* PROMISE: FORMAT-8 */
static void test_f16_known(void **state)
{
    (void)state;
    assert_int_equal(kvx_f32_to_f16(1.0f), 0x3C00);
    assert_int_equal(kvx_f32_to_f16(-2.0f), 0xC000);
    assert_int_equal(kvx_f32_to_f16(0.5f), 0x3800);
    assert_int_equal(kvx_f32_to_f16(0.25f), 0x3400);
    assert_int_equal(kvx_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(kvx_f32_to_f16(65504.0f), 0x7BFF);
    assert_int_equal(kvx_f32_to_f16(65519.0f), 0x7BFF);
    assert_int_equal(kvx_f32_to_f16(65520.0f), 0x7C00); /* tie to even -> inf */
    assert_int_equal(kvx_f32_to_f16(1e10f), 0x7C00);
    assert_int_equal(kvx_f32_to_f16(-INFINITY), 0xFC00);
    assert_int_equal(kvx_f32_to_f16(0x1p-24f), 0x0001);   /* min subnormal */
    assert_int_equal(kvx_f32_to_f16(0x1p-25f), 0x0000);   /* tie -> even 0 */
    assert_int_equal(kvx_f32_to_f16(0x1.8p-25f), 0x0001); /* above the tie */
    assert_int_equal(kvx_f32_to_f16(0x3p-24f), 0x0003);
    assert_int_equal(kvx_f32_to_f16(0x1.8p-23f), 0x0003); /* 3*2^-24 exactly */
    assert_int_equal(kvx_f32_to_f16(0x1.4p-23f), 0x0002); /* 2.5*2^-24: tie -> 2 */
    assert_int_equal(kvx_f32_to_f16(0x1.cp-23f), 0x0004); /* 3.5*2^-24: tie -> 4 */
    assert_int_equal(kvx_f32_to_f16(0x1p-14f), 0x0400);   /* min normal */
    assert_int_equal(kvx_f32_to_f16(0x1.ff8p-15f), 0x03FF); /* max subnormal 1023*2^-24 */
    assert_int_equal(kvx_f32_to_f16(0x1.ffcp-15f), 0x0400); /* max subnormal + half ulp: tie up */
    assert_int_equal(kvx_f32_to_f16(2049.0f), 0x6800); /* tie between 2048 and 2050 */
    assert_int_equal(kvx_f32_to_f16(2051.0f), 0x6802); /* tie between 2050 and 2052 */
    assert_int_equal(kvx_f32_to_f16(1e-30f), 0x0000);
    assert_int_equal(kvx_f32_to_f16(bitsf(0x00000001u)), 0x0000); /* f32 subnormal */
    assert_int_equal(kvx_f32_to_f16(NAN) & 0x7E00, 0x7E00);
    assert_int_equal(kvx_f32_to_f16(bitsf(0xFF800001u)), 0xFE00); /* sNaN -> quiet, sign kept */
    assert_true(kvx_f16_to_f32(0x3C00) == 1.0f);
    assert_true(kvx_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(isinf(kvx_f16_to_f32(0x7C00)) && kvx_f16_to_f32(0xFC00) < 0);
}

/* PROMISE: FORMAT-8 */
static void test_e4m3_exhaustive(void **state)
{
    (void)state;
    double vals[127]; /* 0x00..0x7E */
    for (int b = 0; b < 256; b++) {
        float f = kvx_e4m3_to_f32((uint8_t)b);
        if ((b & 0x7F) == 0x7F) {
            assert_true(isnan(f));
            assert_int_equal(fbits(f) >> 31, b >> 7);
            assert_int_equal(kvx_f32_to_e4m3(f), b); /* NaN keeps its sign */
            continue;
        }
        assert_true((double)f == def_e4m3((uint8_t)b));
        assert_int_equal(fbits(f) >> 31, b >> 7);
        assert_int_equal(kvx_f32_to_e4m3(f), b); /* exact round trip */
        if (b < 127) vals[b] = def_e4m3((uint8_t)b);
    }
    assert_true(vals[126] == 448.0);
    /* Encoder vs brute force over random f32 around the format's range.
     * Past 448 it saturates, so the "overflow" point is never reached. */
    for (int k = 0; k < 200000; k++) {
        uint32_t u = (rnd() & 0x80FFFFFFu) | ((uint32_t)(110 + (rnd() % 30)) << 23);
        float x = bitsf(u);
        uint8_t b = kvx_f32_to_e4m3(x);
        int want = nearest(vals, 127, fabs((double)x), INFINITY);
        uint8_t exp = (uint8_t)((u >> 24 & 0x80u) | (unsigned)want);
        if (b != exp) fail_msg("f32 %08x -> e4m3 %02x, expected %02x", u, b, exp);
    }
}

/* PROMISE: FORMAT-8 */
static void test_e4m3_known(void **state)
{
    (void)state;
    assert_int_equal(kvx_f32_to_e4m3(1.0f), 0x38);
    assert_int_equal(kvx_f32_to_e4m3(-1.0f), 0xB8);
    assert_int_equal(kvx_f32_to_e4m3(448.0f), 0x7E);
    assert_int_equal(kvx_f32_to_e4m3(-448.0f), 0xFE);
    assert_int_equal(kvx_f32_to_e4m3(416.0f), 0x7D);
    assert_int_equal(kvx_f32_to_e4m3(464.0f), 0x7E); /* saturates */
    assert_int_equal(kvx_f32_to_e4m3(1e30f), 0x7E);
    assert_int_equal(kvx_f32_to_e4m3(INFINITY), 0x7E);
    assert_int_equal(kvx_f32_to_e4m3(-INFINITY), 0xFE);
    assert_int_equal(kvx_f32_to_e4m3(NAN), 0x7F);
    assert_int_equal(kvx_f32_to_e4m3(-NAN), 0xFF);
    assert_int_equal(kvx_f32_to_e4m3(-0.0f), 0x80);
    assert_int_equal(kvx_f32_to_e4m3(0x1p-9f), 0x01);   /* min subnormal */
    assert_int_equal(kvx_f32_to_e4m3(0x1p-10f), 0x00);  /* tie -> even 0 */
    assert_int_equal(kvx_f32_to_e4m3(0x1.8p-10f), 0x01);
    assert_int_equal(kvx_f32_to_e4m3(0x1.4p-8f), 0x02); /* 2.5 units: tie -> 2 */
    assert_int_equal(kvx_f32_to_e4m3(0x1.cp-8f), 0x04); /* 3.5 units: tie -> 4 */
    assert_int_equal(kvx_f32_to_e4m3(0x1.cp-7f), 0x07); /* max subnormal 7*2^-9 */
    assert_int_equal(kvx_f32_to_e4m3(0x1p-6f), 0x08);   /* min normal */
    assert_int_equal(kvx_f32_to_e4m3(1.0625f), 0x38);   /* tie between 1 and 1.125 */
    assert_int_equal(kvx_f32_to_e4m3(1.1875f), 0x3A);   /* tie between 1.125 and 1.25 */
    assert_true(kvx_e4m3_to_f32(0x7E) == 448.0f);
    assert_true(kvx_e4m3_to_f32(0x01) == 0x1p-9f);
    assert_true(isnan(kvx_e4m3_to_f32(0x7F)) && isnan(kvx_e4m3_to_f32(0xFF)));
    assert_true(kvx_e4m3_to_f32(0x78) == 256.0f); /* 0x78 is a number in E4M3FN, not inf */
}

/* PROMISE: FORMAT-8 */
static void test_e5m2_exhaustive(void **state)
{
    (void)state;
    double vals[124]; /* 0x00..0x7B */
    for (int b = 0; b < 256; b++) {
        float f = kvx_e5m2_to_f32((uint8_t)b);
        int e = (b >> 2) & 31, m = b & 3;
        if (e == 31 && m) {
            assert_true(isnan(f));
            assert_int_equal(kvx_f32_to_e5m2(f), (b & 0x80) | 0x7E); /* canonical quiet NaN */
            continue;
        }
        assert_true((double)f == def_e5m2((uint8_t)b));
        assert_int_equal(fbits(f) >> 31, b >> 7);
        assert_int_equal(kvx_f32_to_e5m2(f), b);
        if (b < 124) vals[b] = def_e5m2((uint8_t)b);
    }
    double overflow = 57344.0 + 4096.0; /* max + half an ulp (ulp 8192) */
    for (int k = 0; k < 200000; k++) {
        uint32_t u = (rnd() & 0x80FFFFFFu) | ((uint32_t)(105 + (rnd() % 40)) << 23);
        float x = bitsf(u);
        uint8_t b = kvx_f32_to_e5m2(x);
        int want = nearest(vals, 124, fabs((double)x), overflow);
        uint8_t exp = (uint8_t)((u >> 24 & 0x80u) | (want < 0 ? 0x7Cu : (unsigned)want));
        if (b != exp) fail_msg("f32 %08x -> e5m2 %02x, expected %02x", u, b, exp);
    }
}

/* PROMISE: FORMAT-8 */
static void test_e5m2_known(void **state)
{
    (void)state;
    assert_int_equal(kvx_f32_to_e5m2(1.0f), 0x3C);
    assert_int_equal(kvx_f32_to_e5m2(57344.0f), 0x7B);
    assert_int_equal(kvx_f32_to_e5m2(61439.0f), 0x7B);
    assert_int_equal(kvx_f32_to_e5m2(61440.0f), 0x7C); /* tie to even -> inf */
    assert_int_equal(kvx_f32_to_e5m2(INFINITY), 0x7C);
    assert_int_equal(kvx_f32_to_e5m2(-INFINITY), 0xFC);
    assert_int_equal(kvx_f32_to_e5m2(NAN), 0x7E);
    assert_int_equal(kvx_f32_to_e5m2(-NAN), 0xFE);
    assert_int_equal(kvx_f32_to_e5m2(0x1p-16f), 0x01);
    assert_int_equal(kvx_f32_to_e5m2(0x1p-17f), 0x00);
    assert_int_equal(kvx_f32_to_e5m2(1.125f), 0x3C); /* tie between 1 and 1.25 */
    assert_int_equal(kvx_f32_to_e5m2(1.375f), 0x3E); /* tie between 1.25 and 1.5 */
}

/* PROMISE: FORMAT-8 */
static void test_bulk_equals_scalar(void **state)
{
    (void)state;
    enum { N = 4099 }; /* not a multiple of the vector width */
    float *f = malloc(N * sizeof *f), *g = malloc(N * sizeof *g);
    uint16_t *h = malloc(N * sizeof *h);
    uint8_t *b = malloc(N);
    assert_true(f && g && h && b);
    for (int round = 0; round < 4; round++) {
        for (int i = 0; i < N; i++) {
            uint32_t u = rnd();
            if (round == 1) u = (u & 0x80FFFFFFu) | ((uint32_t)(100 + (rnd() % 45)) << 23);
            if (round == 2 && (i % 5) == 0) u = (u & 0x807FFFFFu) | 0x7F800000u; /* inf/NaN */
            if (round == 3) u &= 0x807FFFFFu; /* f32 subnormals and zeros */
            f[i] = bitsf(u);
            h[i] = (uint16_t)rnd();
            b[i] = (uint8_t)rnd();
        }
        kvx_f32_to_f16_n(h, f, N);
        for (int i = 0; i < N; i++)
            if (h[i] != kvx_f32_to_f16(f[i]))
                fail_msg("f32_to_f16_n[%d] %08x: %04x vs %04x", i, fbits(f[i]), h[i],
                         kvx_f32_to_f16(f[i]));
        for (int i = 0; i < N; i++) h[i] = (uint16_t)rnd();
        kvx_f16_to_f32_n(g, h, N);
        for (int i = 0; i < N; i++)
            if (fbits(g[i]) != fbits(kvx_f16_to_f32(h[i])))
                fail_msg("f16_to_f32_n[%d] %04x", i, h[i]);

        const float scales[] = {1.0f, 0.5f, 3.0f / 448.0f};
        for (int s = 0; s < 3; s++) {
            float sc = scales[s], inv = 1.0f / sc;
            kvx_f32_to_e4m3_n(b, f, N, inv);
            for (int i = 0; i < N; i++) assert_int_equal(b[i], kvx_f32_to_e4m3(f[i] * inv));
            kvx_f32_to_e5m2_n(b, f, N, inv);
            for (int i = 0; i < N; i++) assert_int_equal(b[i], kvx_f32_to_e5m2(f[i] * inv));
            for (int i = 0; i < N; i++) b[i] = (uint8_t)rnd();
            kvx_e4m3_to_f32_n(g, b, N, sc);
            for (int i = 0; i < N; i++)
                assert_int_equal(fbits(g[i]), fbits(kvx_e4m3_to_f32(b[i]) * sc));
            kvx_e5m2_to_f32_n(g, b, N, sc);
            for (int i = 0; i < N; i++)
                assert_int_equal(fbits(g[i]), fbits(kvx_e5m2_to_f32(b[i]) * sc));
        }
    }
    /* Short and empty inputs take only the tail loop. */
    kvx_f32_to_f16_n(h, f, 0);
    kvx_f32_to_f16_n(h, f, 3);
    for (int i = 0; i < 3; i++) assert_int_equal(h[i], kvx_f32_to_f16(f[i]));
    free(f); free(g); free(h); free(b);
}

/* Every code and every midpoint between neighbouring codes (the ties),
 * both signs, through the bulk encoders: equal to the scalar encoder and
 * to the brute-force reference. Random data almost never hits a tie. */
/* PROMISE: FORMAT-8 */
static void test_bulk_ties(void **state)
{
    (void)state;
    double v4[127], v5[124], v16[31744];
    for (int i = 0; i < 127; i++) v4[i] = def_e4m3((uint8_t)i);
    for (int i = 0; i < 124; i++) v5[i] = def_e5m2((uint8_t)i);
    for (int i = 0; i < 31744; i++) v16[i] = def_f16((uint16_t)i);
    const struct { const double *v; int n; double overflow; int kind; } fm[3] = {
        {v4, 127, INFINITY, 4}, {v5, 124, 61440.0, 5}, {v16, 31744, 65520.0, 16}};
    for (int k = 0; k < 3; k++) {
        int n = fm[k].n, m = 4 * n + 8;
        float *f = malloc((size_t)m * sizeof *f);
        uint8_t *b = malloc((size_t)m);
        uint16_t *h = malloc((size_t)m * 2);
        assert_true(f && b && h);
        int c = 0;
        for (int i = 0; i < n; i++) {
            double mid = i + 1 < n ? (fm[k].v[i] + fm[k].v[i + 1]) / 2 : fm[k].v[i] * 1.0625;
            f[c++] = (float)fm[k].v[i]; f[c++] = -(float)fm[k].v[i];
            f[c++] = (float)mid; f[c++] = -(float)mid; /* exact: one more bit */
        }
        while (c < m) f[c++] = (float)fm[k].overflow;
        for (int i = 0; i < m; i++) {
            int want = nearest(fm[k].v, n, fabs((double)f[i]), fm[k].overflow);
            unsigned sign = fbits(f[i]) >> 31;
            if (fm[k].kind == 16) {
                unsigned e = (sign << 15) | (want < 0 ? 0x7C00u : (unsigned)want);
                assert_int_equal(kvx_f32_to_f16(f[i]), e);
            } else {
                unsigned ovf = fm[k].kind == 4 ? 0x7Eu : 0x7Cu;
                unsigned e = (sign << 7) | (want < 0 ? ovf : (unsigned)want);
                assert_int_equal(fm[k].kind == 4 ? kvx_f32_to_e4m3(f[i]) : kvx_f32_to_e5m2(f[i]), e);
            }
        }
        if (fm[k].kind == 16) {
            kvx_f32_to_f16_n(h, f, (size_t)m);
            for (int i = 0; i < m; i++) assert_int_equal(h[i], kvx_f32_to_f16(f[i]));
        } else if (fm[k].kind == 4) {
            kvx_f32_to_e4m3_n(b, f, (size_t)m, 1.0f);
            for (int i = 0; i < m; i++) assert_int_equal(b[i], kvx_f32_to_e4m3(f[i]));
        } else {
            kvx_f32_to_e5m2_n(b, f, (size_t)m, 1.0f);
            for (int i = 0; i < m; i++) assert_int_equal(b[i], kvx_f32_to_e5m2(f[i]));
        }
        free(f); free(b); free(h);
    }
}

/* Large f16 -> f32 conversions take the streaming-store path (outputs of
 * 8 MiB and more): every code, at an aligned and a misaligned output. */
static void test_bulk_f16_large(void **state)
{
    (void)state;
    const size_t n = (size_t)65536 * 40 + 5; /* > 2^21 floats = 8 MiB */
    uint16_t *h = malloc(n * sizeof *h);
    float *f = malloc((n + 8) * sizeof *f);
    assert_true(h && f);
    for (size_t i = 0; i < n; i++) h[i] = (uint16_t)(i * 40503u); /* odd step: every code */
    for (int off = 0; off < 2; off++) {
        memset(f, 0xFF, (n + 8) * sizeof *f);
        kvx_f16_to_f32_n(f + off, h, n);
        for (size_t i = 0; i < n; i++)
            if (fbits(f[off + i]) != fbits(kvx_f16_to_f32(h[i]))) fail_msg("f16 %04x at %zu", h[i], i);
        assert_int_equal(fbits(f[off + n]), 0xFFFFFFFFu); /* nothing past the end */
    }
    free(h);
    free(f);
}

/* Every FP8 code through the bulk decoders (vector body and scalar tail),
 * with scale 1 and a scale that makes products subnormal and inexact. */
/* PROMISE: FORMAT-8 */
static void test_bulk_decode_all_codes(void **state)
{
    (void)state;
    uint8_t b[259];
    float f[259];
    for (int i = 0; i < 259; i++) b[i] = (uint8_t)(i * 7); /* 7 is odd: all codes */
    const float scales[] = {1.0f, 2.5f, 0x1.3p-130f, -3.0f};
    for (int s = 0; s < 4; s++) {
        kvx_e4m3_to_f32_n(f, b, 259, scales[s]);
        for (int i = 0; i < 259; i++)
            if (fbits(f[i]) != fbits(kvx_e4m3_to_f32(b[i]) * scales[s])) fail_msg("e4m3 %02x scale %d", b[i], s);
        kvx_e5m2_to_f32_n(f, b, 259, scales[s]);
        for (int i = 0; i < 259; i++)
            if (fbits(f[i]) != fbits(kvx_e5m2_to_f32(b[i]) * scales[s])) fail_msg("e5m2 %02x scale %d", b[i], s);
    }
}

static double def_bf16(uint16_t b) /* finite codes: s, e (8 bits, bias 127), m (7 bits) */
{
    int s = b >> 15, e = (b >> 7) & 255, m = b & 127;
    double v = e == 0 ? ldexp(m, -133) : ldexp(128 + m, e - 134);
    return s ? -v : v;
}

/* Golden bit patterns, worked by hand from the bf16 definition (the top 16
 * bits of an f32; round to nearest, ties to even; NaN quiet). */
/* PROMISE: FORMAT-8 */
static void test_bf16_known(void **state)
{
    (void)state;
    static const struct { uint32_t f; uint16_t b; } enc[] = {
        {0x3F800000u, 0x3F80}, /* 1.0 */
        {0xC0200000u, 0xC020}, /* -2.5 */
        {0x00000000u, 0x0000}, {0x80000000u, 0x8000}, /* +-0 */
        {0x00010000u, 0x0001}, /* 2^-133, the smallest subnormal */
        {0x80010000u, 0x8001},
        {0x00008000u, 0x0000}, /* half of it: tie to the even 0 */
        {0x00008001u, 0x0001}, /* just above half */
        {0x00018000u, 0x0002}, /* 1.5 ulp: tie, 0x0001 is odd, up */
        {0x007F8000u, 0x0080}, /* largest subnormal + half: carries into the min normal */
        {0x7F7F0000u, 0x7F7F}, /* max finite, 3.3895314e38 */
        {0x7F7F7FFFu, 0x7F7F}, /* just below the midpoint above max */
        {0x7F7F8000u, 0x7F80}, /* the midpoint: tie, 0x7F7F is odd, up to inf */
        {0x7F7FFFFFu, 0x7F80}, /* FLT_MAX overflows to inf */
        {0xFF7FFFFFu, 0xFF80},
        {0x3F808000u, 0x3F80}, /* 1 + 2^-8: tie, 0x3F80 is even, down */
        {0x3F808001u, 0x3F81}, /* just above the tie */
        {0x3F818000u, 0x3F82}, /* 1 + 3*2^-8: tie, 0x3F81 is odd, up */
        {0x3F80FFFFu, 0x3F81},
        {0x7F800000u, 0x7F80}, {0xFF800000u, 0xFF80}, /* +-inf kept */
        {0x7FC00000u, 0x7FC0}, /* quiet NaN */
        {0x7F800001u, 0x7FC0}, /* signalling NaN, payload in the low half only: quiet, not inf */
        {0x7FA00000u, 0x7FE0}, /* signalling NaN: top payload kept, quiet bit set */
        {0xFF812345u, 0xFFC1}, /* negative NaN keeps its sign */
        {0x7FFFFFFFu, 0x7FFF}, /* quiet NaN with every payload bit: no carry */
    };
    for (size_t i = 0; i < sizeof enc / sizeof enc[0]; i++) {
        uint16_t got = kvx_f32_to_bf16(bitsf(enc[i].f));
        if (got != enc[i].b) fail_msg("f32 %08x -> bf16 %04x, expected %04x", enc[i].f, got, enc[i].b);
    }
    static const struct { uint16_t b; uint32_t f; } dec[] = {
        {0x3F80, 0x3F800000u}, {0xC020, 0xC0200000u}, {0x0001, 0x00010000u}, {0x8000, 0x80000000u},
        {0x7F7F, 0x7F7F0000u}, {0x7F80, 0x7F800000u}, {0xFF80, 0xFF800000u},
        {0x7FC0, 0x7FC00000u}, /* quiet NaN unchanged */
        {0x7F81, 0x7FC10000u}, /* signalling NaN comes out quiet, payload kept */
        {0xFFA0, 0xFFE00000u},
    };
    for (size_t i = 0; i < sizeof dec / sizeof dec[0]; i++) {
        uint32_t got = fbits(kvx_bf16_to_f32(dec[i].b));
        if (got != dec[i].f) fail_msg("bf16 %04x -> f32 %08x, expected %08x", dec[i].b, got, dec[i].f);
    }
    assert_true(kvx_bf16_to_f32(0x0001) == (float)ldexp(1, -133));
    assert_true(kvx_bf16_to_f32(0x7F7F) == (float)ldexp(255, 120));
    assert_true(kvx_f32_to_bf16(-2.5f) == 0xC020 && kvx_f32_to_bf16(1.0f) == 0x3F80);
}

/* Every code against the defining formula; every non-NaN code round-trips;
 * every NaN code decodes to a quiet NaN of the same sign and re-encodes to
 * itself with the quiet bit set. */
/* PROMISE: FORMAT-8 */
static void test_bf16_exhaustive(void **state)
{
    (void)state;
    for (uint32_t c = 0; c < 65536; c++) {
        uint16_t b = (uint16_t)c;
        float f = kvx_bf16_to_f32(b);
        int e = (b >> 7) & 255, m = b & 127;
        if (e == 255 && m) {
            if (!isnan(f) || !(fbits(f) & 0x400000u) || (fbits(f) >> 31) != (c >> 15u))
                fail_msg("bf16 %04x: not a quiet NaN of its sign (%08x)", b, fbits(f));
            if (kvx_f32_to_bf16(f) != (b | 0x40)) fail_msg("bf16 NaN %04x re-encodes to %04x", b, kvx_f32_to_bf16(f));
            continue;
        }
        double want = e == 255 ? ((b >> 15) ? -INFINITY : INFINITY) : def_bf16(b);
        if ((double)f != want || !signbit(f) != !signbit(want)) fail_msg("bf16 %04x decodes to %a", b, (double)f);
        if (kvx_f32_to_bf16(f) != b) fail_msg("bf16 %04x does not round-trip (%04x)", b, kvx_f32_to_bf16(f));
    }
}

/* Random f32 against a nearest-value reference in double: the two bf16
 * neighbours of x (truncation and the next code) and the even one on a tie. */
/* PROMISE: FORMAT-8 */
static void test_bf16_encode_vs_reference(void **state)
{
    (void)state;
    for (int i = 0; i < 2000000; i++) {
        uint32_t u = rnd();
        if (i < 1000) u = (u & 0x8000FFFFu) | (i < 500 ? 0x7F7F0000u : 0x00000000u); /* edges */
        float x = bitsf(u);
        if (isnan(x)) continue;
        uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1), want;
        if ((u & 0xFFFFu) == 0) want = lo;
        else {
            double ax = fabs((double)x), dl = fabs(def_bf16(lo & 0x7FFF)), dh;
            dh = ((hi & 0x7FFF) == 0x7F80) ? ldexp(1, 128) : fabs(def_bf16(hi & 0x7FFF)); /* 2^128: inf's place */
            double el = ax - dl, eh = dh - ax;
            want = el < eh ? lo : eh < el ? hi : ((lo & 1) ? hi : lo);
        }
        uint16_t got = kvx_f32_to_bf16(x);
        if (got != want) fail_msg("f32 %08x: got %04x, want %04x", u, got, want);
    }
}

/* Bulk forms equal the scalar ones bit for bit: random bits (NaNs,
 * subnormals, ties), every length mod 16 and unaligned pointers, and a
 * buffer past the streaming threshold; nothing is written past the end. */
/* PROMISE: FORMAT-8 */
static void test_bf16_bulk(void **state)
{
    (void)state;
    enum { N = 1000 };
    float f[N + 9], g[N + 9];
    uint16_t b[N + 9], c[N + 9];
    for (int i = 0; i < N + 9; i++) {
        uint32_t u = rnd();
        if (i % 5 == 1) u = (u & 0xFFFF0000u) | 0x8000u;               /* ties */
        if (i % 7 == 2) u = (u & 0x807FFFFFu) | 0x7F800000u;           /* NaN / inf */
        if (i % 11 == 3) u &= 0x807FFFFFu;                             /* subnormal */
        f[i] = bitsf(u);
        b[i] = (uint16_t)rnd();
        if (i % 13 == 4) b[i] = (uint16_t)((b[i] & 0x807F) | 0x7F80); /* NaN / inf */
    }
    for (int off = 0; off < 3; off++)
        for (size_t n = 0; n < 40; n++) {
            memset(c, 0xAB, sizeof c);
            kvx_f32_to_bf16_n(c + off, f + off, n);
            for (size_t i = 0; i < n; i++)
                if (c[off + i] != kvx_f32_to_bf16(f[off + i])) fail_msg("bulk enc n %zu at %zu", n, i);
            assert_int_equal(c[off + n], 0xABAB);
            memset(g, 0xAB, sizeof g);
            kvx_bf16_to_f32_n(g + off, b + off, n);
            for (size_t i = 0; i < n; i++)
                if (fbits(g[off + i]) != fbits(kvx_bf16_to_f32(b[off + i]))) fail_msg("bulk dec n %zu at %zu", n, i);
            assert_int_equal(fbits(g[off + n]), 0xABABABABu);
        }
    kvx_f32_to_bf16_n(c, f, N);
    kvx_bf16_to_f32_n(g, b, N);
    for (int i = 0; i < N; i++) {
        if (c[i] != kvx_f32_to_bf16(f[i])) fail_msg("bulk enc at %d", i);
        if (fbits(g[i]) != fbits(kvx_bf16_to_f32(b[i]))) fail_msg("bulk dec at %d", i);
    }
    const size_t n = (size_t)65536 * 40 + 5; /* > 8 MiB of f32: the streaming path */
    uint16_t *h = malloc(n * sizeof *h);
    float *o = malloc((n + 8) * sizeof *o);
    uint16_t *back = malloc((n + 8) * sizeof *back);
    assert_true(h && o && back);
    for (size_t i = 0; i < n; i++) h[i] = (uint16_t)(i * 40503u);
    for (int off = 0; off < 2; off++) {
        memset(o, 0xFF, (n + 8) * sizeof *o);
        kvx_bf16_to_f32_n(o + off, h, n);
        for (size_t i = 0; i < n; i++)
            if (fbits(o[off + i]) != fbits(kvx_bf16_to_f32(h[i]))) fail_msg("bf16 %04x at %zu", h[i], i);
        assert_int_equal(fbits(o[off + n]), 0xFFFFFFFFu);
        memset(back, 0xFF, (n + 8) * sizeof *back);
        kvx_f32_to_bf16_n(back + off, o + off, n);
        for (size_t i = 0; i < n; i++) {
            uint16_t want = ((h[i] & 0x7F80) == 0x7F80 && (h[i] & 0x7F)) ? (uint16_t)(h[i] | 0x40) : h[i];
            if (back[off + i] != want) fail_msg("bf16 %04x came back %04x", h[i], back[off + i]);
        }
        assert_int_equal(back[off + n], 0xFFFF);
    }
    free(h);
    free(o);
    free(back);
}

/* Pinned outputs (from the scalar kvx_f32_to_e4m3/e5m2(x / scale) before
 * the kernels existed): 40 elements, so the 32-lane body and the tail
 * both run. */
static void test_div_encode_golden(void **state)
{
    (void)state;
    static const uint8_t want[4][40] = {
        {0xFE,0xFE,0xFE,0xFE,0xFE,0xFE,0xFD,0xFC,0xFB,0xFA,0xF9,0xF8,0xF7,0xF5,0xF3,0xF1,0xEF,0xEB,0xE7,0xDF,
         0x00,0x5F,0x67,0x6B,0x6F,0x71,0x73,0x75,0x77,0x78,0x79,0x7A,0x7B,0x7C,0x7D,0x7E,0x7E,0x7E,0x7E,0x7E},
        {0xE1,0xE0,0xE0,0xE0,0xE0,0xDF,0xDF,0xDE,0xDE,0xDD,0xDD,0xDC,0xDC,0xDB,0xDA,0xD9,0xD8,0xD6,0xD4,0xD0,
         0x00,0x50,0x54,0x56,0x58,0x59,0x5A,0x5B,0x5C,0x5C,0x5D,0x5D,0x5E,0x5E,0x5F,0x5F,0x60,0x60,0x60,0x60},
        {0xFE,0xFE,0xFE,0xFE,0xFE,0xFE,0xFE,0xFE,0xFE,0xFE,0xFE,0xFE,0xFE,0xFC,0xFA,0xF9,0xF6,0xF2,0xEE,0xE6,
         0x00,0x66,0x6E,0x72,0x76,0x79,0x7A,0x7C,0x7E,0x7E,0x7E,0x7E,0x7E,0x7E,0x7E,0x7E,0x7E,0x7E,0x7E,0x7E},
        {0xE4,0xE4,0xE4,0xE3,0xE3,0xE2,0xE2,0xE2,0xE1,0xE1,0xE0,0xE0,0xDF,0xDE,0xDD,0xDC,0xDB,0xD9,0xD7,0xD3,
         0x00,0x53,0x57,0x59,0x5B,0x5C,0x5D,0x5E,0x5F,0x60,0x60,0x61,0x61,0x62,0x62,0x62,0x63,0x63,0x64,0x64},
    };
    float x[40];
    uint8_t b[40];
    for (int i = 0; i < 40; i++) x[i] = (float)(i - 20) * 0.37f + (i % 3 ? 0.0f : 1e-3f);
    const float sc[2] = {0.0123f, 3.0f / 448.0f};
    for (int s = 0; s < 2; s++) {
        kvx_f32_div_to_e4m3_n(b, x, 40, sc[s]);
        assert_memory_equal(b, want[2 * s], 40);
        kvx_f32_div_to_e5m2_n(b, x, 40, sc[s]);
        assert_memory_equal(b, want[2 * s + 1], 40);
    }
    assert_int_equal(kvx_f32_amax_bits(x, 40), 0x40ECC49Cu); /* |x[0]| = 7.399 */
    assert_int_equal(kvx_f32_amax_bits(x, 0), 0);
}

/* Random slabs (normal, wide-range, inf/NaN, subnormal inputs), scales
 * from tiny (subnormal) to huge, odd lengths and offsets: the kernels equal
 * the scalar rule element by element, and amax the scalar max. */
/* PROMISE: FORMAT-8 */
static void test_div_encode_vs_scalar(void **state)
{
    (void)state;
    enum { N = 4096 + 37 };
    float *f = malloc(N * sizeof *f);
    uint8_t *b = malloc(N + 8);
    assert_true(f && b);
    const float scales[] = {1.0f, 0.5f, 3.0f / 448.0f, 0.0123f, 1e-30f, 1e30f, 0x1p-140f, 448.0f / 1.5f, 7.0f};
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < N; i++) {
            uint32_t u = rnd();
            if (round == 1) u = (u & 0x80FFFFFFu) | ((uint32_t)(100 + (rnd() % 45)) << 23);
            if (round == 2 && (i % 5) == 0) u = (u & 0x807FFFFFu) | 0x7F800000u; /* inf/NaN */
            if (round == 3) u &= 0x807FFFFFu;                                     /* subnormals, zeros */
            if (round == 4) u = (u & 0x807FFFFFu) | ((uint32_t)(118 + (rnd() % 16)) << 23); /* KV-like */
            f[i] = bitsf(u);
        }
        for (size_t s = 0; s < sizeof scales / sizeof *scales; s++) {
            for (int off = 0; off < 3; off++) {
                size_t n = (size_t)N - (size_t)off * 13;
                const float *in = f + off;
                memset(b, 0xA5, N + 8);
                kvx_f32_div_to_e4m3_n(b, in, n, scales[s]);
                for (size_t i = 0; i < n; i++)
                    if (b[i] != kvx_f32_to_e4m3(in[i] / scales[s]))
                        fail_msg("e4m3 %08x / %g: %02x vs %02x", fbits(in[i]), (double)scales[s], b[i],
                                 kvx_f32_to_e4m3(in[i] / scales[s]));
                assert_int_equal(b[n], 0xA5);
                kvx_f32_div_to_e5m2_n(b, in, n, scales[s]);
                for (size_t i = 0; i < n; i++)
                    if (b[i] != kvx_f32_to_e5m2(in[i] / scales[s]))
                        fail_msg("e5m2 %08x / %g: %02x", fbits(in[i]), (double)scales[s], b[i]);
            }
        }
        for (size_t n = 0; n < 300; n += 1 + n / 3) {
            uint32_t m = 0;
            for (size_t i = 0; i < n; i++) {
                uint32_t u = fbits(f[i + 5]) & 0x7FFFFFFFu;
                m = u > m ? u : m;
            }
            assert_int_equal(kvx_f32_amax_bits(f + 5, n), m);
        }
        uint32_t m = 0;
        for (int i = 0; i < N; i++) m = (fbits(f[i]) & 0x7FFFFFFFu) > m ? fbits(f[i]) & 0x7FFFFFFFu : m;
        assert_int_equal(kvx_f32_amax_bits(f, N), m);
    }
    free(f);
    free(b);
}

/* Import to f32 in one pass (kvx_envelope_decode_f32: CRC and decode per
 * stretch, streaming stores for large outputs) gives the bits of the two
 * passes it replaces: kvx_envelope_parse, then every block's payload
 * through kvx_f16_to_f32_n / kvx_bf16_to_f32_n / kvx_e4m3_to_f32_n (each
 * v2 slab with its scale). Payloads are random bits (every e4m3 code, f16
 * and bf16 NaNs, infs and subnormals); sizes below and above the streaming
 * threshold, outputs aligned and not. Then a flipped payload byte is the
 * CRC's KVX_EFORMAT, a short output KVX_ECAPACITY with out untouched. */
static uint8_t *random_envelope(size_t *out_len, uint16_t version, const kvx_geometry *g, uint32_t n)
{
    size_t p = kvx_envelope_payload_bytes(version, g), slabs = (size_t)2 * g->num_layers * g->kv_heads;
    size_t per = (size_t)g->block_tokens * g->head_dim, len;
    assert_int_equal(kvx_envelope_size(&len, version, g, n), 0);
    uint8_t *buf = malloc(len), *pay = malloc(p * (n ? n : 1));
    float *sc = malloc(slabs * sizeof *sc * (n ? n : 1));
    kvx_envelope_block_in *in = calloc(n ? n : 1, sizeof *in);
    assert_non_null(buf); assert_non_null(pay); assert_non_null(sc); assert_non_null(in);
    for (size_t i = 0; i < p * n; i++) pay[i] = (uint8_t)rnd();
    for (size_t i = 0; i < slabs * n; i++) sc[i] = ldexpf(1.0f + (float)(rnd() % 1000) / 1000.0f, (int)(rnd() % 40) - 20);
    for (uint32_t k = 0; k < n; k++)
        in[k] = (kvx_envelope_block_in){0x1000u + k, g->block_tokens, pay + (size_t)k * p,
                                        version == KVX_ENVELOPE_V2 ? sc + (size_t)k * slabs : NULL};
    (void)per;
    assert_int_equal(kvx_envelope_export(buf, len, version, g, in, n), 0);
    free(pay), free(sc), free(in);
    *out_len = len;
    return buf;
}

static void two_pass_f32(float *out, const uint8_t *buf, size_t len, const kvx_geometry *g)
{
    kvx_envelope env;
    assert_int_equal(kvx_envelope_parse(&env, buf, len, g), 0);
    size_t slabs = (size_t)2 * g->num_layers * g->kv_heads, per = (size_t)g->block_tokens * g->head_dim;
    for (uint32_t k = 0; k < env.n_blocks; k++) {
        kvx_envelope_block b;
        assert_int_equal(kvx_envelope_block_at(&b, &env, k), 0);
        float *o = out + (size_t)k * slabs * per;
        if (env.version == KVX_ENVELOPE_V1) kvx_f16_to_f32_n(o, (const uint16_t *)(const void *)b.payload, slabs * per);
        else if (env.version == KVX_ENVELOPE_V3) kvx_bf16_to_f32_n(o, (const uint16_t *)(const void *)b.payload, slabs * per);
        else
            for (size_t j = 0; j < slabs; j++) {
                float f;
                memcpy(&f, b.scales + 4 * j, 4);
                kvx_e4m3_to_f32_n(o + j * per, b.payload + j * per, per, f);
            }
    }
}

/* PROMISE: FORMAT-7 */
static void test_envelope_decode_f32(void **state)
{
    (void)state;
    static const uint16_t versions[3] = {KVX_ENVELOPE_V1, KVX_ENVELOPE_V2, KVX_ENVELOPE_V3};
    /* small (one stretch, slabs of 24 elements: not 32-byte multiples),
     * mid (many stretches), large (above KVX_STREAM_BYTES of f32) */
    const struct { uint32_t B, L, H, D, n; } sizes[3] = {{3, 1, 1, 8, 2}, {16, 2, 2, 128, 3}, {16, 4, 4, 128, 34}};
    for (int v = 0; v < 3; v++) {
        for (int z = 0; z < 3; z++) {
            kvx_geometry g = {0};
            g.block_tokens = sizes[z].B, g.num_layers = sizes[z].L, g.kv_heads = sizes[z].H, g.head_dim = sizes[z].D;
            g.quant = versions[v] == KVX_ENVELOPE_V2 ? KVX_QUANT_E4M3 : versions[v] == KVX_ENVELOPE_V3 ? KVX_QUANT_BF16 : KVX_QUANT_FP16;
            size_t len, need = (size_t)sizes[z].n * 2 * g.num_layers * g.kv_heads * g.block_tokens * g.head_dim;
            uint8_t *buf = random_envelope(&len, versions[v], &g, sizes[z].n);
            float *want = malloc(need * sizeof *want);
            float *room = aligned_alloc(64, (need + 16) * sizeof *room);
            assert_non_null(want); assert_non_null(room);
            two_pass_f32(want, buf, len, &g);
            if (z == 2) assert_true(need * sizeof(float) >= KVX_STREAM_BYTES);
            for (size_t shift = 0; shift < 2; shift++) { /* 32-byte aligned, then one float off */
                float *out = room + shift;
                memset(room, 0xA5, (need + 16) * sizeof *room);
                kvx_envelope env;
                memset(&env, 0, sizeof env);
                assert_int_equal(kvx_envelope_decode_f32(out, need, &env, buf, len, &g), 0);
                assert_int_equal(env.n_blocks, sizes[z].n);
                assert_int_equal(env.version, versions[v]);
                assert_ptr_equal(env.data, buf);
                assert_memory_equal(out, want, need * sizeof *out); /* bit for bit, NaN payloads too */
                assert_true(fbits(out[need]) == 0xA5A5A5A5u);       /* nothing past the end */
            }
            /* a short output: KVX_ECAPACITY, nothing written */
            memset(room, 0xA5, (need + 16) * sizeof *room);
            assert_int_equal(kvx_envelope_decode_f32(room, need - 1, NULL, buf, len, &g), KVX_ECAPACITY);
            assert_true(fbits(room[0]) == 0xA5A5A5A5u && fbits(room[need - 1]) == 0xA5A5A5A5u);
            /* one payload byte flipped in the last block: the CRC's KVX_EFORMAT, out_env untouched */
            size_t tail = versions[v] == KVX_ENVELOPE_V2 ? (size_t)8 * g.num_layers * g.kv_heads : 0; /* scales */
            buf[len - 4 - tail - 5] ^= 0x04;
            kvx_envelope env;
            memset(&env, 0x5A, sizeof env);
            assert_int_equal(kvx_envelope_decode_f32(room, need, &env, buf, len, &g), KVX_EFORMAT);
            assert_non_null(strstr(kvx_last_error(), "crc32c mismatch"));
            assert_int_equal(env.version, 0x5A5A);
            assert_int_equal(kvx_envelope_parse(&env, buf, len, &g), KVX_EFORMAT);
            free(buf), free(want), free(room);
        }
    }
    /* n_blocks = 0: valid, nothing to write (out may be NULL) */
    kvx_geometry g = {0};
    g.block_tokens = 4, g.num_layers = 1, g.kv_heads = 1, g.head_dim = 8, g.quant = KVX_QUANT_E4M3;
    size_t len;
    uint8_t *buf = random_envelope(&len, KVX_ENVELOPE_V2, &g, 0);
    kvx_envelope env;
    assert_int_equal(kvx_envelope_decode_f32(NULL, 0, &env, buf, len, &g), 0);
    assert_int_equal(env.n_blocks, 0);
    free(buf);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_f16_decode_exhaustive),
        cmocka_unit_test(test_f16_roundtrip_exhaustive),
        cmocka_unit_test(test_f16_encode_vs_reference),
        cmocka_unit_test(test_f16_known),
        cmocka_unit_test(test_e4m3_exhaustive),
        cmocka_unit_test(test_e4m3_known),
        cmocka_unit_test(test_e5m2_exhaustive),
        cmocka_unit_test(test_e5m2_known),
        cmocka_unit_test(test_bulk_equals_scalar),
        cmocka_unit_test(test_bulk_ties),
        cmocka_unit_test(test_bulk_f16_large),
        cmocka_unit_test(test_bulk_decode_all_codes),
        cmocka_unit_test(test_bf16_known),
        cmocka_unit_test(test_bf16_exhaustive),
        cmocka_unit_test(test_bf16_encode_vs_reference),
        cmocka_unit_test(test_bf16_bulk),
        cmocka_unit_test(test_div_encode_golden),
        cmocka_unit_test(test_div_encode_vs_scalar),
        cmocka_unit_test(test_envelope_decode_f32),
    };
    int failed = cmocka_run_group_tests_name("format/numerics", tests, NULL, NULL);
    /* Then once more with the SIMD paths off (a fresh process: the CPU
     * features are read once), so the portable fallbacks are tested here
     * too, where the CPU would never use them. */
    const char *off = getenv("KVX_DISABLE_SIMD");
    if (!off || !*off || *off == '0') {
        fflush(stdout);
        pid_t pid = fork();
        if (pid == 0) {
            setenv("KVX_DISABLE_SIMD", "1", 1);
            execl("/proc/self/exe", "numerics", argc > 1 ? argv[1] : (char *)NULL, (char *)NULL);
            _exit(127);
        }
        int st = 0;
        if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) failed++;
    }
    return failed;
}
