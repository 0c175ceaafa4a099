/*
 * numerics.c - f16, OCP FP8 E4M3FN and E5M2 <-> f32, round to nearest even.
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
 *
 * One generic rounding routine serves the three encoders (they differ only
 * in bias and mantissa width), so the rounding logic is written once. The
 * bulk decoders of the 8-bit formats are a 256-entry table lookup; the f16
 * bulk paths use F16C (8 lanes per instruction) when the CPU has it, chosen
 * at run time (CPUID), with the scalar code as the portable fallback.
 */
#include "internal.h"

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

/* ---- bulk --------------------------------------------------------------- */

/* Decode tables for the 8-bit formats, built once. Building is idempotent
 * and writes the same values, so a race between first callers is benign;
 * the flag is atomic so the tables are seen complete once it is set. */
static float e4m3_table[256], e5m2_table[256];
static int tables_ready; /* accessed with __atomic builtins */

static void build_tables(void)
{
    if (__atomic_load_n(&tables_ready, __ATOMIC_ACQUIRE)) return;
    for (int i = 0; i < 256; i++) {
        e4m3_table[i] = kvx_e4m3_to_f32((uint8_t)i);
        e5m2_table[i] = kvx_e5m2_to_f32((uint8_t)i);
    }
    __atomic_store_n(&tables_ready, 1, __ATOMIC_RELEASE);
}

#ifdef KVX_X86
/* F16C and AVX from CPUID leaf 1, and the OS saving YMM state (XGETBV),
 * read directly: clang's __builtin_cpu_supports does not know "f16c". */
static int detect_f16c(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const unsigned osxsave = 1u << 27, avx = 1u << 28, f16c = 1u << 29;
    if ((c & (osxsave | avx | f16c)) != (osxsave | avx | f16c)) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6u) == 6u; /* XMM and YMM state enabled */
}

static int have_f16c(void)
{
    static int cached = -1; /* accessed with __atomic builtins */
    int v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v < 0) {
        v = detect_f16c();
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
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

__attribute__((target("avx,f16c"))) static size_t f16_to_f32_f16c(float *out, const uint16_t *in,
                                                                  size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(in + i));
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
    }
    return i;
}
#endif

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
    if (have_f16c()) i = f16_to_f32_f16c(out, in, n);
#endif
    for (; i < n; i++) out[i] = kvx_f16_to_f32(in[i]);
}

void kvx_f32_to_e4m3_n(uint8_t *out, const float *in, size_t n, float inv_scale)
{
    for (size_t i = 0; i < n; i++) out[i] = kvx_f32_to_e4m3(in[i] * inv_scale);
}

void kvx_e4m3_to_f32_n(float *out, const uint8_t *in, size_t n, float scale)
{
    build_tables();
    for (size_t i = 0; i < n; i++) out[i] = e4m3_table[in[i]] * scale;
}

void kvx_f32_to_e5m2_n(uint8_t *out, const float *in, size_t n, float inv_scale)
{
    for (size_t i = 0; i < n; i++) out[i] = kvx_f32_to_e5m2(in[i] * inv_scale);
}

void kvx_e5m2_to_f32_n(float *out, const uint8_t *in, size_t n, float scale)
{
    build_tables();
    for (size_t i = 0; i < n; i++) out[i] = e5m2_table[in[i]] * scale;
}
