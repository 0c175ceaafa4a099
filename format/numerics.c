/*
 * numerics.c - f16, OCP FP8 E4M3FN, E5M2 and bf16 <-> f32, round to nearest even.
 *
 * Conventions (also in kvx.h and docs/FORMAT.md):
 *  - Every encoder rounds to nearest, ties to even, subnormals included.
 *  - f16: overflow goes to inf; inf and NaN are kept. A NaN keeps its sign
 *    and the top payload bits and comes out quiet (as x86 F16C does), so the
 *    scalar and the F16C bulk paths agree bit for bit.
 *  - E4M3FN (bias 7, max 448, no inf): finite overflow and +-inf saturate
 *    to +-448 (0x7E / 0xFE); NaN becomes 0x7F, or 0xFF when negative.
 *  - E5M2 (bias 15, max 57344): overflow goes to inf (0x7C | sign) like
 *    f16; NaN becomes the quiet 0x7E | sign.
 *  - bf16 is the top half of an f32: rounding adds 0x7FFF plus the kept
 *    LSB to the f32 bits (overflow carries into inf, which is right); a NaN
 *    keeps its sign and top payload bits and comes out quiet (0x0040), and
 *    decoding quiets a signalling bf16 NaN the same way (0x00400000), as
 *    the f16 decoder does.
 *
 * One generic rounding routine serves the three encoders (they differ only
 * in bias and mantissa width), so the rounding logic is written once. The
 * f16 bulk paths use F16C (8 lanes per instruction), the 8-bit encoders and
 * decoders an AVX2 form of the scalar algorithm (decoders fall back to a
 * 256-entry table), each chosen at run time (CPUID), with
 * the scalar code as the portable fallback. bf16 needs only integer lane
 * operations (AVX2). The tests hold every bulk path
 * equal to the scalar one bit for bit.
 */
#include "common/internal.h"
#include "format/numerics.h"

#include <pthread.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define KVX_X86 1
#endif

static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/*
 * Magnitude code of a finite |x| (abs = its f32 bits without the sign) in
 * a format with mbits mantissa bits and the given bias, rounded to nearest
 * even. No overflow handling: callers test their own maximum first. A
 * result that rounds up out of the subnormals or into the next binade
 * carries into the exponent field, which is the right encoding.
 */
static inline uint32_t round_small(uint32_t abs, int mbits, int bias)
{
    uint32_t e = abs >> 23;
    uint32_t emin = (uint32_t)(127 + 1 - bias); /* f32 exponent of the format's min normal */
    if (e >= emin) {
        uint32_t t = abs - ((uint32_t)(127 - bias) << 23);
        int shift = 23 - mbits;
        uint32_t q = t >> shift, rem = t & ((1u << shift) - 1), half = 1u << (shift - 1);
        return q + (rem > half || (rem == half && (q & 1)));
    }
    /* Subnormal target: q = |x| / 2^(1 - bias - mbits), rounded. */
    uint32_t mant = (abs & 0x7FFFFFu) | (e ? 0x800000u : 0);
    if (e == 0) e = 1;
    uint32_t shift = (uint32_t)(151 - bias - mbits) - e;
    if (shift >= 25) return 0; /* below half the smallest subnormal */
    uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
    return q + (rem > half || (rem == half && (q & 1)));
}

/* ---- f16 ---------------------------------------------------------------- */

uint16_t kvx_f32_to_f16(float x)
{
    uint32_t u = f32_bits(x), sign = (u >> 16) & 0x8000u, abs = u & 0x7FFFFFFFu;
    if (abs > 0x7F800000u) return (uint16_t)(sign | 0x7E00u | ((abs >> 13) & 0x3FFu)); /* NaN */
    if (abs >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* >= 65520 rounds to inf */
    return (uint16_t)(sign | round_small(abs, 10, 15));
}

float kvx_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
    if (e == 0x1F) /* inf, or NaN made quiet with its payload kept */
        return bits_f32(sign | 0x7F800000u | (m ? 0x400000u | (m << 13) : 0));
    if (e == 0) { /* zero or subnormal: m * 2^-24, exact in f32 */
        float v = (float)m * 0x1p-24f;
        return bits_f32(f32_bits(v) | sign);
    }
    return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

/* ---- E4M3FN ------------------------------------------------------------- */

uint8_t kvx_f32_to_e4m3(float x)
{
    uint32_t u = f32_bits(x), sign = (u >> 24) & 0x80u, abs = u & 0x7FFFFFFFu;
    if (abs > 0x7F800000u) return (uint8_t)(sign | 0x7Fu);  /* NaN */
    if (abs >= 0x43E00000u) return (uint8_t)(sign | 0x7Eu); /* >= 448, inf: saturate */
    return (uint8_t)(sign | round_small(abs, 3, 7));
}

float kvx_e4m3_to_f32(uint8_t b)
{
    uint32_t sign = (uint32_t)(b & 0x80u) << 24, e = (b >> 3) & 0xFu, m = b & 7u;
    if (e == 0xF && m == 7) return bits_f32(sign | 0x7FC00000u);
    if (e == 0) return bits_f32(f32_bits((float)m * 0x1p-9f) | sign);
    return bits_f32(sign | ((e + 120) << 23) | (m << 20));
}

/* ---- E5M2 --------------------------------------------------------------- */

uint8_t kvx_f32_to_e5m2(float x)
{
    uint32_t u = f32_bits(x), sign = (u >> 24) & 0x80u, abs = u & 0x7FFFFFFFu;
    if (abs > 0x7F800000u) return (uint8_t)(sign | 0x7Eu);  /* NaN, quiet */
    if (abs >= 0x47700000u) return (uint8_t)(sign | 0x7Cu); /* >= 61440 rounds to inf */
    return (uint8_t)(sign | round_small(abs, 2, 15));
}

/* E5M2 is the top byte of an f16. */
float kvx_e5m2_to_f32(uint8_t b) { return kvx_f16_to_f32((uint16_t)(b << 8)); }

/* ---- bf16 --------------------------------------------------------------- */

uint16_t kvx_f32_to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40u); /* NaN, quiet */
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

float kvx_bf16_to_f32(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    if ((b & 0x7FFFu) > 0x7F80u) u |= 0x400000u; /* NaN, quiet */
    return bits_f32(u);
}

/* ---- bulk --------------------------------------------------------------- */

/* Decode tables for the 8-bit formats (the fallback of the AVX2 decoders),
 * built once under pthread_once so concurrent first callers never race. */
static float e4m3_table[256], e5m2_table[256];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void fill_tables(void)
{
    for (int i = 0; i < 256; i++) {
        e4m3_table[i] = kvx_e4m3_to_f32((uint8_t)i);
        e5m2_table[i] = kvx_e5m2_to_f32((uint8_t)i);
    }
}

static void build_tables(void) { pthread_once(&tables_once, fill_tables); }

#ifdef KVX_X86
/* CPU features read directly from CPUID (clang's __builtin_cpu_supports
 * does not know "f16c"): F16C and AVX from leaf 1, AVX2 from leaf 7, and
 * the OS saving YMM state (XGETBV), without which neither may be used. */
#define FEAT_F16C 1
#define FEAT_AVX2 2
static int detect_features(void)
{
    /* KVX_DISABLE_SIMD=1 forces the portable paths (tests run them this
     * way too, so the fallback is checked on machines that never need it). */
    const char *off = getenv("KVX_DISABLE_SIMD");
    if (off && *off && *off != '0') return 0;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const unsigned osxsave = 1u << 27, avx = 1u << 28, f16c = 1u << 29;
    if ((c & (osxsave | avx)) != (osxsave | avx)) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6u) != 6u) return 0; /* XMM and YMM state enabled */
    int f = (c & f16c) ? FEAT_F16C : 0;
    if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 5))) f |= FEAT_AVX2;
    return f;
}

static int cpu_features(void)
{
    static int cached = -1; /* accessed with __atomic builtins */
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        v = detect_features();
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}
static int have_f16c(void) { return cpu_features() & FEAT_F16C; }
static int have_avx2(void) { return cpu_features() & FEAT_AVX2; }

/*
 * FP8 encode, 8 lanes: the scalar algorithm without branches. Normal
 * range: round the f32 bits by adding half-minus-one plus the kept LSB.
 * Subnormal range: |x| + 2^k, where 2^k's ulp is the FP8 subnormal step,
 * lets the FPU round to nearest even; the low bits are the code (assumes
 * the default rounding mode; DAZ only turns f32 subnormals, which encode
 * to 0 anyway, into 0). Blends pick subnormal / saturate / NaN results.
 */
__attribute__((target("avx2"), always_inline)) static inline __m256i
fp8_encode8(__m256 v, int mbits, int bias, uint32_t max_bits, int max_code, int nan_code)
{
    const __m256i u = _mm256_castps_si256(v);
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
    const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
    const int shift = 23 - mbits;
    __m256i t = _mm256_sub_epi32(abs, _mm256_set1_epi32((127 - bias) << 23));
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(t, shift), _mm256_set1_epi32(1));
    t = _mm256_add_epi32(t, _mm256_add_epi32(_mm256_set1_epi32((1 << (shift - 1)) - 1), odd));
    __m256i q = _mm256_srli_epi32(t, shift);
    const int magic = (151 - bias - mbits) << 23;
    __m256 fs = _mm256_add_ps(_mm256_castsi256_ps(abs), _mm256_castsi256_ps(_mm256_set1_epi32(magic)));
    __m256i qs = _mm256_sub_epi32(_mm256_castps_si256(fs), _mm256_set1_epi32(magic));
    __m256i is_sub = _mm256_cmpgt_epi32(_mm256_set1_epi32((128 - bias) << 23), abs);
    __m256i r = _mm256_blendv_epi8(q, qs, is_sub);
    __m256i sat = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32((int)(max_bits - 1)));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(max_code), sat);
    __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7F800000));
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(nan_code), nan);
    return _mm256_or_si256(r, sign);
}

/* 32 floats -> 32 bytes per step; returns how many were done. Each input
 * is multiplied by s, or divided by it when divide is set (the v2 rule
 * x / scale: vdivps rounds once, as the scalar division does). */
__attribute__((target("avx2"), always_inline)) static inline size_t
fp8_encode_avx2(uint8_t *out, const float *in, size_t n, float s, int divide, int mbits, int bias,
                uint32_t max_bits, int max_code, int nan_code)
{
    const __m256 vs = _mm256_set1_ps(s);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i r[4];
        for (int k = 0; k < 4; k++) {
            __m256 x = _mm256_loadu_ps(in + i + 8 * k);
            r[k] = fp8_encode8(divide ? _mm256_div_ps(x, vs) : _mm256_mul_ps(x, vs), mbits, bias, max_bits,
                               max_code, nan_code);
        }
        /* Codes are 0..255 in 32-bit lanes: two unsigned-saturating packs
         * narrow them (lane-interleaved), one permute restores the order. */
        __m256i b = _mm256_packus_epi16(_mm256_packus_epi32(r[0], r[1]), _mm256_packus_epi32(r[2], r[3]));
        _mm256_storeu_si256((__m256i *)(void *)(out + i), _mm256_permutevar8x32_epi32(b, order));
    }
    return i;
}

/*
 * FP8 decode, 8 lanes, without the table: the code's exponent and
 * mantissa bits placed at the top of an f32 (code << (23 - mbits)) and
 * multiplied by 2^(127 - bias) give every normal value exactly; the
 * subnormals are m * 2^(1 - bias - mbits) from an integer convert (not from
 * an f32 subnormal operand, which DAZ would zero); inf and NaN are blended
 * in with the bits the scalar decoder gives. Then times scale, like the
 * table path, so the two agree bit for bit.
 */
__attribute__((target("avx2"), always_inline)) static inline size_t
fp8_decode_avx2(float *out, const uint8_t *in, size_t n, float scale, int mbits, int bias, int e5m2, int stream)
{
    const __m256 vs = _mm256_set1_ps(scale);
    const __m256 pow_norm = _mm256_castsi256_ps(_mm256_set1_epi32((127 + 127 - bias) << 23));
    const __m256 pow_sub = _mm256_castsi256_ps(_mm256_set1_epi32((127 + 1 - bias - mbits) << 23));
    const __m256i mmask = _mm256_set1_epi32((1 << mbits) - 1);
    const __m256i emin = _mm256_set1_epi32(1 << mbits); /* smallest normal code */
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i raw = _mm_loadl_epi64((const __m128i *)(const void *)(in + i));
        __m256i b = _mm256_cvtepu8_epi32(raw);
        __m256i sign = _mm256_slli_epi32(_mm256_and_si256(b, _mm256_set1_epi32(0x80)), 24);
        __m256i em = _mm256_and_si256(b, _mm256_set1_epi32(0x7F));
        __m256 normal = _mm256_mul_ps(_mm256_castsi256_ps(_mm256_slli_epi32(em, 23 - mbits)), pow_norm);
        __m256 sub = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_and_si256(em, mmask)), pow_sub);
        __m256i is_sub = _mm256_cmpgt_epi32(emin, em);
        __m256i v = _mm256_castps_si256(_mm256_blendv_ps(normal, sub, _mm256_castsi256_ps(is_sub)));
        if (e5m2) { /* codes 0x7C..0x7F: inf (m 0) or quiet NaN keeping m */
            __m256i special = _mm256_cmpgt_epi32(em, _mm256_set1_epi32(0x7B));
            __m256i m = _mm256_and_si256(em, mmask);
            __m256i quiet = _mm256_andnot_si256(_mm256_cmpeq_epi32(m, _mm256_setzero_si256()),
                                                _mm256_set1_epi32(0x400000));
            __m256i sp = _mm256_or_si256(_mm256_or_si256(_mm256_set1_epi32(0x7F800000), quiet),
                                         _mm256_slli_epi32(m, 21));
            v = _mm256_blendv_epi8(v, sp, special);
        } else { /* 0x7F: NaN */
            __m256i nan = _mm256_cmpeq_epi32(em, _mm256_set1_epi32(0x7F));
            v = _mm256_blendv_epi8(v, _mm256_set1_epi32(0x7FC00000), nan);
        }
        v = _mm256_or_si256(v, sign);
        __m256 r = _mm256_mul_ps(_mm256_castsi256_ps(v), vs);
        if (stream) _mm256_stream_ps(out + i, r); /* out is 32-byte aligned */
        else _mm256_storeu_ps(out + i, r);
    }
    return i;
}

__attribute__((target("avx2"))) static size_t e4m3_decode_avx2(float *out, const uint8_t *in, size_t n,
                                                              float scale)
{
    return fp8_decode_avx2(out, in, n, scale, 3, 7, 0, 0);
}

/* The same with streaming stores (out 32-byte aligned; no fence). */
__attribute__((target("avx2"))) static size_t e4m3_decode_avx2_nt(float *out, const uint8_t *in, size_t n,
                                                                 float scale)
{
    return fp8_decode_avx2(out, in, n, scale, 3, 7, 0, 1);
}

__attribute__((target("avx2"))) static size_t e5m2_decode_avx2(float *out, const uint8_t *in, size_t n,
                                                              float scale)
{
    return fp8_decode_avx2(out, in, n, scale, 2, 15, 1, 0);
}

__attribute__((target("avx2"))) static size_t e4m3_encode_avx2(uint8_t *out, const float *in, size_t n,
                                                              float inv_scale)
{
    return fp8_encode_avx2(out, in, n, inv_scale, 0, 3, 7, 0x43E00000u, 0x7E, 0x7F);
}

__attribute__((target("avx2"))) static size_t e5m2_encode_avx2(uint8_t *out, const float *in, size_t n,
                                                              float inv_scale)
{
    return fp8_encode_avx2(out, in, n, inv_scale, 0, 2, 15, 0x47700000u, 0x7C, 0x7E);
}

__attribute__((target("avx2"))) static size_t e4m3_div_encode_avx2(uint8_t *out, const float *in, size_t n,
                                                                  float scale)
{
    return fp8_encode_avx2(out, in, n, scale, 1, 3, 7, 0x43E00000u, 0x7E, 0x7F);
}

__attribute__((target("avx2"))) static size_t e5m2_div_encode_avx2(uint8_t *out, const float *in, size_t n,
                                                                  float scale)
{
    return fp8_encode_avx2(out, in, n, scale, 1, 2, 15, 0x47700000u, 0x7C, 0x7E);
}

/* max over |x| of the f32 bits, 32 lanes a step in four accumulators */
__attribute__((target("avx2"))) static size_t amax_bits_avx2(uint32_t *out, const float *x, size_t n)
{
    const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i m0 = _mm256_setzero_si256(), m1 = m0, m2 = m0, m3 = m0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const __m256i *p = (const __m256i *)(const void *)(x + i);
        m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_loadu_si256(p), absm));
        m1 = _mm256_max_epu32(m1, _mm256_and_si256(_mm256_loadu_si256(p + 1), absm));
        m2 = _mm256_max_epu32(m2, _mm256_and_si256(_mm256_loadu_si256(p + 2), absm));
        m3 = _mm256_max_epu32(m3, _mm256_and_si256(_mm256_loadu_si256(p + 3), absm));
    }
    __m256i m = _mm256_max_epu32(_mm256_max_epu32(m0, m1), _mm256_max_epu32(m2, m3));
    __m128i h = _mm_max_epu32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0x4E));
    h = _mm_max_epu32(h, _mm_shuffle_epi32(h, 0xB1));
    *out = (uint32_t)_mm_cvtsi128_si32(h);
    return i;
}

__attribute__((target("avx,f16c"))) static size_t f32_to_f16_f16c(uint16_t *out, const float *in,
                                                                  size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(in + i);
        _mm_storeu_si128((__m128i *)(void *)(out + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    return i;
}

/* Outputs of at least KVX_STREAM_BYTES (numerics.h) bypass the cache
 * (streaming stores): the f32 side is twice the input, and for a buffer
 * beyond the caches reading its lines in before overwriting them (RFO)
 * costs as much as the writes. */

/* stream: streaming stores (after a scalar run up to 32-byte alignment),
 * without the fence: the caller fences once after its last such call. */
__attribute__((target("avx,f16c"))) static size_t f16_to_f32_f16c(float *out, const uint16_t *in,
                                                                  size_t n, int stream)
{
    size_t i = 0;
    if (stream) {
        for (; ((uintptr_t)(out + i) & 31) != 0 && i < n; i++) out[i] = kvx_f16_to_f32(in[i]);
        for (; i + 8 <= n; i += 8) {
            __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(in + i));
            _mm256_stream_ps(out + i, _mm256_cvtph_ps(h));
        }
        return i;
    }
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(in + i));
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
    return i;
}

/* bf16 encode, 16 lanes per step: the scalar rule on the f32 bits (add
 * 0x7FFF plus the kept LSB, NaN -> top half | 0x40), then an unsigned pack
 * to 16 bits (lane-interleaved; one permute restores the order). */
__attribute__((target("avx2"))) static size_t f32_to_bf16_avx2(uint16_t *out, const float *in, size_t n)
{
    const __m256i bias = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1);
    const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
    const __m256i quiet = _mm256_set1_epi32(0x40);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i r[2];
        for (int k = 0; k < 2; k++) {
            __m256i u = _mm256_loadu_si256((const __m256i *)(const void *)(in + i + 8 * k));
            __m256i hi = _mm256_srli_epi32(u, 16);
            __m256i rn = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
            __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf);
            r[k] = _mm256_blendv_epi8(rn, _mm256_or_si256(hi, quiet), nan);
        }
        __m256i p = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xD8);
        _mm256_storeu_si256((__m256i *)(void *)(out + i), p);
    }
    return i;
}

/* bf16 decode, 8 lanes: widen, shift to the top half, quiet NaNs; streaming
 * stores for outputs beyond the caches, like the f16 decoder. */
__attribute__((target("avx2"))) static size_t bf16_to_f32_avx2(float *out, const uint16_t *in, size_t n,
                                                              int stream)
{
    const __m256i absm = _mm256_set1_epi32(0x7FFFFFFF), inf = _mm256_set1_epi32(0x7F800000);
    const __m256i quiet = _mm256_set1_epi32(0x400000);
    size_t i = 0;
    if (stream)
        for (; ((uintptr_t)(out + i) & 31) != 0 && i < n; i++) out[i] = kvx_bf16_to_f32(in[i]);
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(in + i));
        __m256i u = _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16);
        __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, absm), inf);
        u = _mm256_or_si256(u, _mm256_and_si256(nan, quiet));
        if (stream) _mm256_stream_si256((__m256i *)(void *)(out + i), u);
        else _mm256_storeu_si256((__m256i *)(void *)(out + i), u);
    }
    return i;
}
#endif

void kvx_f32_to_bf16_n(uint16_t *out, const float *in, size_t n)
{
    size_t i = 0;
#ifdef KVX_X86
    if (have_avx2()) i = f32_to_bf16_avx2(out, in, n);
#endif
    for (; i < n; i++) out[i] = kvx_f32_to_bf16(in[i]);
}

void kvx_bf16_to_f32_n(float *out, const uint16_t *in, size_t n)
{
    size_t i = 0;
#ifdef KVX_X86
    if (have_avx2()) {
        int stream = n * sizeof(float) >= KVX_STREAM_BYTES;
        i = bf16_to_f32_avx2(out, in, n, stream);
        if (stream) _mm_sfence();
    }
#endif
    for (; i < n; i++) out[i] = kvx_bf16_to_f32(in[i]);
}

void kvx_f32_to_f16_n(uint16_t *out, const float *in, size_t n)
{
    size_t i = 0;
#ifdef KVX_X86
    if (have_f16c()) i = f32_to_f16_f16c(out, in, n);
#endif
    for (; i < n; i++) out[i] = kvx_f32_to_f16(in[i]);
}

void kvx_f16_to_f32_n(float *out, const uint16_t *in, size_t n)
{
    size_t i = 0;
#ifdef KVX_X86
    if (have_f16c()) {
        int stream = n * sizeof(float) >= KVX_STREAM_BYTES;
        i = f16_to_f32_f16c(out, in, n, stream);
        if (stream) _mm_sfence();
    }
#endif
    for (; i < n; i++) out[i] = kvx_f16_to_f32(in[i]);
}

void kvx_f32_to_e4m3_n(uint8_t *out, const float *in, size_t n, float inv_scale)
{
    size_t i = 0;
#ifdef KVX_X86
    if (have_avx2()) i = e4m3_encode_avx2(out, in, n, inv_scale);
#endif
    for (; i < n; i++) out[i] = kvx_f32_to_e4m3(in[i] * inv_scale);
}

void kvx_e4m3_to_f32_n(float *out, const uint8_t *in, size_t n, float scale)
{
    size_t i = 0;
#ifdef KVX_X86
    if (have_avx2()) i = e4m3_decode_avx2(out, in, n, scale);
#endif
    if (i == n) return;
    build_tables();
    for (; i < n; i++) out[i] = e4m3_table[in[i]] * scale;
}

void kvx_f32_to_e5m2_n(uint8_t *out, const float *in, size_t n, float inv_scale)
{
    size_t i = 0;
#ifdef KVX_X86
    if (have_avx2()) i = e5m2_encode_avx2(out, in, n, inv_scale);
#endif
    for (; i < n; i++) out[i] = kvx_f32_to_e5m2(in[i] * inv_scale);
}

void kvx_e5m2_to_f32_n(float *out, const uint8_t *in, size_t n, float scale)
{
    size_t i = 0;
#ifdef KVX_X86
    if (have_avx2()) i = e5m2_decode_avx2(out, in, n, scale);
#endif
    if (i == n) return;
    build_tables();
    for (; i < n; i++) out[i] = e5m2_table[in[i]] * scale;
}

/* ---- streaming decoders (format/numerics.h) ------------------------------ */

void kvx_f16_to_f32_nt(float *out, const uint16_t *in, size_t n)
{
    size_t i = 0;
#ifdef KVX_X86
    if (have_f16c()) i = f16_to_f32_f16c(out, in, n, 1);
#endif
    for (; i < n; i++) out[i] = kvx_f16_to_f32(in[i]);
}

void kvx_bf16_to_f32_nt(float *out, const uint16_t *in, size_t n)
{
    size_t i = 0;
#ifdef KVX_X86
    if (have_avx2()) i = bf16_to_f32_avx2(out, in, n, 1);
#endif
    for (; i < n; i++) out[i] = kvx_bf16_to_f32(in[i]);
}

void kvx_e4m3_to_f32_nt(float *out, const uint8_t *in, size_t n, float scale)
{
    size_t i = 0;
    build_tables();
#ifdef KVX_X86
    if (have_avx2()) {
        /* the table's values up to 32-byte alignment (the same bits) */
        for (; ((uintptr_t)(out + i) & 31) != 0 && i < n; i++) out[i] = e4m3_table[in[i]] * scale;
        i += e4m3_decode_avx2_nt(out + i, in + i, n - i, scale);
    }
#endif
    for (; i < n; i++) out[i] = e4m3_table[in[i]] * scale;
}

void kvx_stream_fence(void)
{
#ifdef KVX_X86
    _mm_sfence();
#endif
}

/* ---- v2 quantize kernels (format/numerics.h) ---------------------------- */

uint32_t kvx_f32_amax_bits(const float *x, size_t n)
{
    uint32_t m = 0;
    size_t i = 0;
#ifdef KVX_X86
    if (have_avx2()) i = amax_bits_avx2(&m, x, n);
#endif
    for (; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        u &= 0x7FFFFFFFu;
        m = u > m ? u : m;
    }
    return m;
}

void kvx_f32_div_to_e4m3_n(uint8_t *out, const float *in, size_t n, float scale)
{
    size_t i = 0;
#ifdef KVX_X86
    if (have_avx2()) i = e4m3_div_encode_avx2(out, in, n, scale);
#endif
    for (; i < n; i++) out[i] = kvx_f32_to_e4m3(in[i] / scale);
}

void kvx_f32_div_to_e5m2_n(uint8_t *out, const float *in, size_t n, float scale)
{
    size_t i = 0;
#ifdef KVX_X86
    if (have_avx2()) i = e5m2_div_encode_avx2(out, in, n, scale);
#endif
    for (; i < n; i++) out[i] = kvx_f32_to_e5m2(in[i] / scale);
}
