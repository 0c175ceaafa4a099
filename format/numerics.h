/*
 * numerics.h - the v2 envelope's quantize kernels (library internal; the
 * element conversions themselves are in kvx.h).
 *
 * The v2 rule per slab: scale = amax / 448 (FP8 E4M3's max), each element
 * encoded as RNE(x / scale), one division rounded once, not x * (1 /
 * scale). These run that rule over a slab with AVX2 where the CPU has it
 * (KVX_DISABLE_SIMD=1: the portable loop) and agree with the scalar
 * kvx_f32_to_e4m3(x / scale) bit for bit.
 */
#ifndef KVX_FORMAT_NUMERICS_H
#define KVX_FORMAT_NUMERICS_H

#include <stddef.h>
#include <stdint.h>

/* The largest |x[i]| as f32 bits (sign cleared): for finite values the
 * bits order like the values; any result >= 0x7F800000 means an inf or
 * NaN is among them. 0 for n = 0. */
uint32_t kvx_f32_amax_bits(const float *x, size_t n);
/* out[i] = kvx_f32_to_e4m3(in[i] / scale), for i < n. */
void kvx_f32_div_to_e4m3_n(uint8_t *out, const float *in, size_t n, float scale);
/* out[i] = kvx_f32_to_e5m2(in[i] / scale), for i < n. */
void kvx_f32_div_to_e5m2_n(uint8_t *out, const float *in, size_t n, float scale);

/* Decoders for outputs beyond the caches (an envelope decoded to f32):
 * the values of kvx_f16_to_f32_n, kvx_bf16_to_f32_n and kvx_e4m3_to_f32_n
 * bit for bit, written with streaming (non-temporal) stores where the CPU
 * has them (after a scalar run up to 32-byte alignment), so the output's
 * lines are not read in first.
 * They do not fence: call kvx_stream_fence() after the last of a run,
 * before the output is read or handed over. */
void kvx_f16_to_f32_nt(float *out, const uint16_t *in, size_t n);
void kvx_bf16_to_f32_nt(float *out, const uint16_t *in, size_t n);
void kvx_e4m3_to_f32_nt(float *out, const uint8_t *in, size_t n, float scale);
void kvx_stream_fence(void);
/* The output size (bytes) from which the decoders stream. */
#define KVX_STREAM_BYTES ((size_t)8 << 20)

#endif
