/*
 * envelope.c - the TLKV export envelope (spec/kv-block-hash-and-envelope.txt).
 *
 *   0   "TLKV" | u16 version | u16 dtype | u32 n | u32 B | u32 L | u32 Hkv | u32 D
 *   28  n records: u64 block_hash | u32 n_tokens | P payload bytes
 *   end u32 crc32c of every byte before it
 *
 * v1 payload: f16 [L][2][Hkv][B][D]; v2: e4m3 [L][2][Hkv][B][D] then f32
 * scales [L][2][Hkv]; v3 (kvx extension, DESIGN.md): the v1 layout in
 * bfloat16, dtype 2. Positions at or past n_tokens are zero bytes.
 *
 * The parser is a zero-copy validator: it never allocates, reads only
 * inside [buf, buf+len), and computes every size with overflow checks, so
 * a header claiming 2^32 blocks of 2^32-wide layers cannot wrap the length
 * formula into a match. Reader rules are checked in this order (the spec's
 * order, adjusted where a rule needs an earlier one's result):
 *   1. length >= 32                                   KVX_EFORMAT
 *   2. magic "TLKV"                                   KVX_EFORMAT
 *   3. version 1, 2 or 3 (an intact envelope of another KVX_EVERSION
 *      version; a damaged one fails its CRC first:    KVX_EFORMAT)
 *   4. dtype is the version's (1 v1, 3 v2, 2 v3)      KVX_EFORMAT
 *   5. no dimension is 0, sizes do not overflow, and
 *      length == 28 + n*(12+P) + 4                    KVX_EFORMAT
 *   6. crc32c                                         KVX_EFORMAT
 *   7. B, L, Hkv, D equal expect's                    KVX_ESHAPE
 *   8. every n_tokens in 1..B; hash != 0 => n == B    KVX_EFORMAT
 *   9. (v2) every scale finite and > 0                KVX_EFORMAT
 * The length rule needs P, which needs a known version, hence 3 before 5.
 * Rule 9 is kvx's (DESIGN.md "Envelope and hash"): the writer rule never
 * makes such a scale, and a NaN, inf, 0 or negative one would make its
 * whole slab NaN, inf, zero or sign-flipped in whatever reads it next (a
 * store of any quant, conversion, a transfer), so every path is closed
 * here.
 */
#include "common/internal.h"
#include "format/numerics.h"

#include <math.h>

#define ENV_MAGIC "TLKV"
#define DTYPE_F16 1 /* tl_dtype TL_F16 */
#define DTYPE_E4M3 3 /* tl_dtype TL_F8_E4M3 */
#define DTYPE_BF16 2 /* tl_dtype TL_BF16: envelope v3, a kvx extension */

/* The dtype and element quant of each known version; 0 / quant of v1 for
 * an unknown one (callers check the version first). */
static uint16_t version_dtype(uint16_t v)
{
    return v == KVX_ENVELOPE_V1 ? DTYPE_F16 : v == KVX_ENVELOPE_V2 ? DTYPE_E4M3 : v == KVX_ENVELOPE_V3 ? DTYPE_BF16 : 0;
}
static uint32_t version_quant(uint16_t v)
{
    return v == KVX_ENVELOPE_V2 ? KVX_QUANT_E4M3 : v == KVX_ENVELOPE_V3 ? KVX_QUANT_BF16 : KVX_QUANT_FP16;
}
static int version_known(uint16_t v) { return version_dtype(v) != 0; }
#define ENV_RECORD_HEADER 12
#define ENV_CRC_BYTES 4
#define ENV_MIN_BYTES (KVX_ENVELOPE_HEADER_BYTES + ENV_CRC_BYTES)

/* Elements of one payload (L*2*Hkv*B*D) and its scale count (L*2*Hkv);
 * 0 when a dimension is 0 or the product overflows. */
static uint64_t slab_count(uint32_t L, uint32_t hkv)
{
    uint64_t v = 2;
    if (!kvx_mul64(&v, v, L) || !kvx_mul64(&v, v, hkv)) return 0;
    return v;
}

static uint64_t payload_bytes(uint16_t version, uint32_t B, uint32_t L, uint32_t hkv, uint32_t D)
{
    uint64_t slabs = slab_count(L, hkv), per = 0, p = 0;
    if (!slabs || !B || !D || !kvx_mul64(&per, B, D)) return 0;
    if (version == KVX_ENVELOPE_V1 || version == KVX_ENVELOPE_V3) {
        if (!kvx_mul64(&p, slabs, per) || !kvx_mul64(&p, p, 2)) return 0;
    } else if (version == KVX_ENVELOPE_V2) {
        if (!kvx_add64(&per, per, 4) || !kvx_mul64(&p, slabs, per)) return 0;
    } else {
        return 0;
    }
    return p > SIZE_MAX ? 0 : p;
}

/* 28 + n*(12+P) + 4, or 0 on overflow. */
static uint64_t envelope_bytes(uint64_t p, uint32_t n)
{
    uint64_t rec, total;
    if (!kvx_add64(&rec, p, ENV_RECORD_HEADER) || !kvx_mul64(&total, rec, n) ||
        !kvx_add64(&total, total, ENV_MIN_BYTES) || total > SIZE_MAX)
        return 0;
    return total;
}

size_t kvx_envelope_payload_bytes(uint16_t version, const kvx_geometry *g)
{
    if (!g) return 0;
    return (size_t)payload_bytes(version, g->block_tokens, g->num_layers, g->kv_heads, g->head_dim);
}

int kvx_envelope_size(size_t *out_bytes, uint16_t version, const kvx_geometry *g, uint32_t n_blocks)
{
    if (!out_bytes || !g) return kvx_fail(KVX_EINVALID, "envelope size: out_bytes and g must not be NULL");
    if (!version_known(version))
        return kvx_fail(KVX_EVERSION, "envelope size: version %u is not 1, 2 or 3", version);
    if (!g->block_tokens || !g->num_layers || !g->kv_heads || !g->head_dim)
        return kvx_fail(KVX_EINVALID, "envelope size: geometry has a zero dimension (B %u, L %u, Hkv %u, D %u)",
                        g->block_tokens, g->num_layers, g->kv_heads, g->head_dim);
    uint64_t p = payload_bytes(version, g->block_tokens, g->num_layers, g->kv_heads, g->head_dim);
    uint64_t total = p ? envelope_bytes(p, n_blocks) : 0;
    if (!total) return kvx_fail(KVX_EOVERFLOW, "envelope size: 28 + n_blocks %u * (12 + P) + 4 overflows", n_blocks);
    *out_bytes = (size_t)total;
    return 0;
}

static int parse(kvx_envelope *out, const void *buf, size_t len, const kvx_geometry *expect, int check_crc);

int kvx_envelope_parse(kvx_envelope *out, const void *buf, size_t len, const kvx_geometry *expect)
{
    return parse(out, buf, len, expect, 1);
}

int kvx_envelope_parse_nocrc(kvx_envelope *out, const void *buf, size_t len, const kvx_geometry *expect)
{
    return parse(out, buf, len, expect, 0);
}

static int parse(kvx_envelope *out, const void *buf, size_t len, const kvx_geometry *expect, int check_crc)
{
    if (!out || (!buf && len)) return kvx_fail(KVX_EINVALID, "envelope parse: out and buf must not be NULL");
    const uint8_t *b = (const uint8_t *)buf;
    if (len < ENV_MIN_BYTES)
        return kvx_fail(KVX_EFORMAT, "envelope length %zu is below the 32-byte minimum", len);
    if (memcmp(b, ENV_MAGIC, 4) != 0)
        return kvx_fail(KVX_EFORMAT, "envelope magic is %02x %02x %02x %02x, not \"TLKV\"", b[0], b[1], b[2], b[3]);

    uint16_t version = kvx_load16(b + 4), dtype = kvx_load16(b + 6);
    uint32_t n = kvx_load32(b + 8), B = kvx_load32(b + 12), L = kvx_load32(b + 16);
    uint32_t hkv = kvx_load32(b + 20), D = kvx_load32(b + 24);
    uint32_t crc_stored = kvx_load32(b + len - 4);

    if (!version_known(version)) {
        /* An unknown version's length formula is unknown; its CRC is not. */
        if (kvx_crc32c(0, b, len - 4) != crc_stored)
            return kvx_fail(KVX_EFORMAT, "envelope crc32c mismatch (and version %u is unknown)", version);
        return kvx_fail(KVX_EVERSION, "envelope version %u is not supported (this reader reads 1, 2 and 3)", version);
    }
    uint16_t want_dtype = version_dtype(version);
    if (dtype != want_dtype)
        return kvx_fail(KVX_EFORMAT, "envelope dtype %u does not match version %u (expected %u)", dtype, version,
                        want_dtype);
    if (!B || !L || !hkv || !D)
        return kvx_fail(KVX_EFORMAT, "envelope has a zero dimension: block_tokens %u, n_layers %u, n_kv_heads %u, head_dim %u",
                        B, L, hkv, D);
    uint64_t p = payload_bytes(version, B, L, hkv, D);
    uint64_t want_len = p ? envelope_bytes(p, n) : 0;
    if (!want_len)
        return kvx_fail(KVX_EFORMAT, "envelope size overflows: n_blocks %u, block_tokens %u, n_layers %u, n_kv_heads %u, head_dim %u",
                        n, B, L, hkv, D);
    if (want_len != len)
        return kvx_fail(KVX_EFORMAT, "envelope length %zu differs from 28 + n_blocks*(12+P) + 4 = %llu", len,
                        (unsigned long long)want_len);
    uint32_t crc = check_crc ? kvx_crc32c(0, b, len - 4) : crc_stored;
    if (crc != crc_stored)
        return kvx_fail(KVX_EFORMAT, "envelope crc32c mismatch: stored 0x%08x, computed 0x%08x", crc_stored, crc);

    if (expect) {
        if (expect->block_tokens && B != expect->block_tokens)
            return kvx_fail(KVX_ESHAPE, "envelope block_tokens %u differs from the expected %u", B, expect->block_tokens);
        if (L != expect->num_layers)
            return kvx_fail(KVX_ESHAPE, "envelope n_layers %u differs from the expected %u", L, expect->num_layers);
        if (hkv != expect->kv_heads)
            return kvx_fail(KVX_ESHAPE, "envelope n_kv_heads %u differs from the expected %u", hkv, expect->kv_heads);
        if (D != expect->head_dim)
            return kvx_fail(KVX_ESHAPE, "envelope head_dim %u differs from the expected %u", D, expect->head_dim);
    }

    const uint8_t *rec = b + KVX_ENVELOPE_HEADER_BYTES;
    for (uint32_t i = 0; i < n; i++, rec += ENV_RECORD_HEADER + p) {
        uint64_t hash = kvx_load64(rec);
        uint32_t nt = kvx_load32(rec + 8);
        if (nt < 1 || nt > B)
            return kvx_fail(KVX_EFORMAT, "envelope block %u: n_tokens %u is not in 1..%u", i, nt, B);
        if (hash != 0 && nt != B)
            return kvx_fail(KVX_EFORMAT, "envelope block %u: block_hash is set but n_tokens %u != block_tokens %u",
                            i, nt, B);
        if (version == KVX_ENVELOPE_V2) {
            /* p = slabs * (B*D + 4): the scales are its last slabs * 4 bytes. */
            const uint64_t slabs = slab_count(L, hkv);
            const uint8_t *sc = rec + ENV_RECORD_HEADER + (size_t)(p - slabs * 4);
            for (uint64_t k = 0; k < slabs; k++) {
                uint32_t u = kvx_load32(sc + 4 * k);
                float v;
                memcpy(&v, &u, 4);
                if (!isfinite(v) || !(v > 0.0f))
                    return kvx_fail(KVX_EFORMAT,
                                    "envelope block %u: scale %llu is %g (v2 scales must be finite and > 0)",
                                    i, (unsigned long long)k, (double)v);
            }
        }
    }

    memset(out, 0, sizeof *out);
    out->version = version;
    out->dtype = dtype;
    out->n_blocks = n;
    out->geometry.block_tokens = B;
    out->geometry.num_layers = L;
    out->geometry.kv_heads = hkv;
    out->geometry.head_dim = D;
    out->geometry.quant = version_quant(version);
    out->data = b;
    out->size = len;
    out->payload_bytes = (size_t)p;
    return 0;
}

int kvx_envelope_block_at(kvx_envelope_block *out, const kvx_envelope *env, uint32_t index)
{
    if (!out || !env || !env->data) return kvx_fail(KVX_EINVALID, "envelope block: out and env must not be NULL");
    if (index >= env->n_blocks)
        return kvx_fail(KVX_EINVALID, "envelope block index %u is past n_blocks %u", index, env->n_blocks);
    /* env came from kvx_envelope_parse: these products were checked there. */
    const uint8_t *rec = env->data + KVX_ENVELOPE_HEADER_BYTES + (size_t)index * (ENV_RECORD_HEADER + env->payload_bytes);
    const kvx_geometry *g = &env->geometry;
    out->hash = kvx_load64(rec);
    out->n_tokens = kvx_load32(rec + 8);
    out->payload = rec + ENV_RECORD_HEADER;
    out->scales = NULL;
    if (env->version == KVX_ENVELOPE_V2)
        out->scales = out->payload + (size_t)g->num_layers * 2 * g->kv_heads * g->block_tokens * g->head_dim;
    return 0;
}

/*
 * Import to f32 in one pass. kvx_envelope_parse reads the whole envelope
 * for its CRC, and a decode after it reads it again: twice the envelope's
 * traffic, the second time from memory once the envelope is beyond the
 * caches. Here the structure is checked first (kvx_envelope_parse_nocrc:
 * the header, the length, each block's record and v2 scales, a few bytes
 * a block), then each stretch of ~16 KiB is CRC'd and decoded while it is
 * still in the cache, and the CRC of the whole is compared at the end. An
 * envelope the structural checks refuse is handed to kvx_envelope_parse,
 * so the code and message are the ones it gives (its CRC first). Outputs
 * beyond the caches are written with streaming stores (numerics.h).
 */
#define DECODE_STRETCH ((size_t)16 << 10) /* envelope bytes CRC'd then decoded */

int kvx_envelope_decode_f32(float *out, size_t out_elems, kvx_envelope *out_env, const void *buf, size_t len,
                            const kvx_geometry *expect)
{
    kvx_envelope env;
    if (kvx_envelope_parse_nocrc(&env, buf, len, expect)) return kvx_envelope_parse(&env, buf, len, expect);
    const kvx_geometry *g = &env.geometry;
    size_t per = (size_t)g->block_tokens * g->head_dim;  /* a slab's elements */
    size_t slabs = (size_t)2 * g->num_layers * g->kv_heads; /* checked by the parse */
    size_t elems = slabs * per;
    if (elems && env.n_blocks > SIZE_MAX / 4 / elems)
        return kvx_fail(KVX_EOVERFLOW, "envelope decode: %u blocks of %zu elements overflow", env.n_blocks, elems);
    size_t need = (size_t)env.n_blocks * elems;
    if (need && !out) return kvx_fail(KVX_EINVALID, "envelope decode: out must not be NULL");
    if (out_elems < need)
        return kvx_fail(KVX_ECAPACITY, "envelope decode: %zu floats of room, the envelope's %u blocks need %zu",
                        out_elems, env.n_blocks, need);
    int stream = need * sizeof(float) >= KVX_STREAM_BYTES;
    const uint8_t *b = env.data;
    uint32_t crc = kvx_crc32c(0, b, KVX_ENVELOPE_HEADER_BYTES);
    const uint8_t *rec = b + KVX_ENVELOPE_HEADER_BYTES;
    float *o = out;
    for (uint32_t i = 0; i < env.n_blocks; i++, rec += ENV_RECORD_HEADER + env.payload_bytes, o += elems) {
        const uint8_t *pl = rec + ENV_RECORD_HEADER;
        crc = kvx_crc32c(crc, rec, ENV_RECORD_HEADER);
        if (env.version == KVX_ENVELOPE_V2) {
            const uint8_t *sc = pl + slabs * per;
            size_t group = per < DECODE_STRETCH ? DECODE_STRETCH / per : 1; /* slabs a stretch */
            for (size_t k = 0; k < slabs; k += group) {
                size_t m = slabs - k < group ? slabs - k : group;
                crc = kvx_crc32c(crc, pl + k * per, m * per);
                for (size_t j = k; j < k + m; j++) {
                    uint32_t u = kvx_load32(sc + 4 * j);
                    float scale;
                    memcpy(&scale, &u, 4); /* as the parse read it: finite, > 0 */
                    if (stream) kvx_e4m3_to_f32_nt(o + j * per, pl + j * per, per, scale);
                    else kvx_e4m3_to_f32_n(o + j * per, pl + j * per, per, scale);
                }
            }
            crc = kvx_crc32c(crc, sc, slabs * 4);
        } else { /* v1 f16, v3 bf16: 2-byte elements */
            const size_t step = DECODE_STRETCH / 2;
            for (size_t k = 0; k < elems; k += step) {
                size_t m = elems - k < step ? elems - k : step;
                const uint16_t *in = (const uint16_t *)(const void *)(pl + 2 * k);
                crc = kvx_crc32c(crc, in, 2 * m);
                if (env.version == KVX_ENVELOPE_V1) {
                    if (stream) kvx_f16_to_f32_nt(o + k, in, m);
                    else kvx_f16_to_f32_n(o + k, in, m);
                } else {
                    if (stream) kvx_bf16_to_f32_nt(o + k, in, m);
                    else kvx_bf16_to_f32_n(o + k, in, m);
                }
            }
        }
    }
    if (stream) kvx_stream_fence();
    uint32_t stored = kvx_load32(b + len - ENV_CRC_BYTES);
    if (crc != stored)
        return kvx_fail(KVX_EFORMAT, "envelope crc32c mismatch: stored 0x%08x, computed 0x%08x (the decoded output is not valid)",
                        stored, crc);
    if (out_env) *out_env = env;
    return 0;
}

int kvx_envelope_export(void *buf, size_t cap, uint16_t version, const kvx_geometry *g,
                        const kvx_envelope_block_in *blocks, uint32_t n_blocks)
{
    size_t total;
    int rc = kvx_envelope_size(&total, version, g, n_blocks);
    if (rc) return rc;
    if (!buf) return kvx_fail(KVX_EINVALID, "envelope export: buf must not be NULL");
    if (n_blocks && !blocks) return kvx_fail(KVX_EINVALID, "envelope export: blocks must not be NULL");
    if (cap < total)
        return kvx_fail(KVX_ECAPACITY, "envelope export: cap %zu is below the envelope size %zu", cap, total);

    const uint32_t B = g->block_tokens, D = g->head_dim;
    const size_t esize = version == KVX_ENVELOPE_V2 ? 1 : 2;
    const size_t slabs = (size_t)slab_count(g->num_layers, g->kv_heads);
    const size_t slab_bytes = (size_t)B * D * esize; /* fits: P did */
    const size_t p = kvx_envelope_payload_bytes(version, g);

    /* Validate every block before writing a byte. */
    for (uint32_t i = 0; i < n_blocks; i++) {
        const kvx_envelope_block_in *in = &blocks[i];
        if (in->n_tokens < 1 || in->n_tokens > B)
            return kvx_fail(KVX_ETOKENS, "envelope export: blocks[%u].n_tokens %u is not in 1..%u", i, in->n_tokens, B);
        if (in->hash != 0 && in->n_tokens != B)
            return kvx_fail(KVX_EHASH, "envelope export: blocks[%u].hash is set but n_tokens %u != block_tokens %u",
                            i, in->n_tokens, B);
        if (!in->payload) return kvx_fail(KVX_EINVALID, "envelope export: blocks[%u].payload is NULL", i);
        if (version == KVX_ENVELOPE_V2 && !in->scales)
            return kvx_fail(KVX_EINVALID, "envelope export: blocks[%u].scales is NULL (v2 needs them)", i);
    }

    uint8_t *o = (uint8_t *)buf;
    memcpy(o, ENV_MAGIC, 4);
    kvx_store16(o + 4, version);
    kvx_store16(o + 6, version_dtype(version));
    kvx_store32(o + 8, n_blocks);
    kvx_store32(o + 12, B);
    kvx_store32(o + 16, g->num_layers);
    kvx_store32(o + 20, g->kv_heads);
    kvx_store32(o + 24, D);
    uint8_t *rec = o + KVX_ENVELOPE_HEADER_BYTES;
    for (uint32_t i = 0; i < n_blocks; i++, rec += ENV_RECORD_HEADER + p) {
        const kvx_envelope_block_in *in = &blocks[i];
        kvx_store64(rec, in->hash);
        kvx_store32(rec + 8, in->n_tokens);
        const uint8_t *src = (const uint8_t *)in->payload;
        uint8_t *dst = rec + ENV_RECORD_HEADER;
        const size_t fill = (size_t)in->n_tokens * D * esize;
        if (fill == slab_bytes) {
            memcpy(dst, src, slabs * slab_bytes); /* full block: one copy */
        } else {
            for (size_t s = 0; s < slabs; s++) {
                memcpy(dst + s * slab_bytes, src + s * slab_bytes, fill);
                memset(dst + s * slab_bytes + fill, 0, slab_bytes - fill);
            }
        }
        if (version == KVX_ENVELOPE_V2) {
            uint8_t *sc = dst + slabs * slab_bytes;
            for (size_t s = 0; s < slabs; s++) {
                uint32_t u;
                memcpy(&u, &in->scales[s], 4);
                kvx_store32(sc + 4 * s, u);
            }
        }
    }
    kvx_store32(o + total - 4, kvx_crc32c(0, o, total - 4));
    return 0;
}

int kvx_envelope_quantize_v2(uint8_t *out_e4m3, float *out_scales, const float *kv, const kvx_geometry *g,
                             uint32_t n_tokens)
{
    if (!out_e4m3 || !out_scales || !kv || !g)
        return kvx_fail(KVX_EINVALID, "envelope quantize: out_e4m3, out_scales, kv and g must not be NULL");
    const uint32_t B = g->block_tokens, D = g->head_dim;
    if (!B || !D || !g->num_layers || !g->kv_heads)
        return kvx_fail(KVX_EINVALID, "envelope quantize: geometry has a zero dimension (B %u, L %u, Hkv %u, D %u)",
                        B, g->num_layers, g->kv_heads, D);
    if (n_tokens < 1 || n_tokens > B)
        return kvx_fail(KVX_ETOKENS, "envelope quantize: n_tokens %u is not in 1..%u", n_tokens, B);
    if (!payload_bytes(KVX_ENVELOPE_V2, B, g->num_layers, g->kv_heads, D))
        return kvx_fail(KVX_EOVERFLOW, "envelope quantize: payload size overflows");
    const size_t slabs = (size_t)slab_count(g->num_layers, g->kv_heads);
    const size_t slab = (size_t)B * D, fill = (size_t)n_tokens * D;

    for (size_t s = 0; s < slabs; s++) {
        const float *x = kv + s * slab;
        /* amax on the bits: for |x| the f32 bit patterns order like the
         * values, and any bits >= 0x7F800000 are inf or NaN. An integer
         * max reduction has no early exit, so it vectorizes. */
        uint32_t mbits = kvx_f32_amax_bits(x, fill);
        if (mbits >= 0x7F800000u) {
            size_t i = 0;
            while (i < fill && (kvx_load32(&x[i]) & 0x7FFFFFFFu) < 0x7F800000u) i++;
            return kvx_fail(KVX_EINVALID, "envelope quantize: kv slab %zu element %zu is not finite", s, i);
        }
        float amax;
        memcpy(&amax, &mbits, 4);
        /* The spec's rule; an amax so small that amax/448 underflows to 0
         * is treated like 0 (its values encode as zero either way). */
        float scale = amax / 448.0f;
        if (scale == 0.0f) scale = 1.0f;
        out_scales[s] = scale;
        uint8_t *q = out_e4m3 + s * slab;
        /* x / scale, not x * (1/scale): one rounding before the RNE
         * (format/numerics.h: vdivps where the CPU has AVX2). */
        kvx_f32_div_to_e4m3_n(q, x, fill, scale);
        memset(q + fill, 0, slab - fill);
    }
    return 0;
}
