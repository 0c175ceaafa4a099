/*
 * geometry.c - sizes derived from a shard's geometry (L, Hkv, D, quant).
 *
 * Every size here is computed with overflow-checked 64-bit arithmetic and
 * returns 0 when it does not fit, so callers can treat 0 as "refuse": no
 * valid geometry has a zero-byte page or zero scales.
 */
#include "common/internal.h"

size_t kvx_quant_elem_size(uint32_t quant)
{
    switch (quant) {
    case KVX_QUANT_FP16: return 2;
    case KVX_QUANT_E4M3: return 1;
    case KVX_QUANT_E5M2: return 1;
    case KVX_QUANT_BF16: return 2;
    default: return 0;
    }
}

const char *kvx_quant_name(uint32_t quant)
{
    switch (quant) {
    case KVX_QUANT_FP16: return "fp16";
    case KVX_QUANT_E4M3: return "e4m3";
    case KVX_QUANT_E5M2: return "e5m2";
    case KVX_QUANT_BF16: return "bf16";
    default: return NULL;
    }
}

/* 2 * L * Hkv * n * D * elem, or 0 on overflow / unknown quant. */
uint64_t kvx_page_bytes(const kvx_geometry *g, uint32_t n_tokens)
{
    if (!g) return 0;
    uint64_t elem = kvx_quant_elem_size(g->quant), v = 2;
    if (!elem) return 0;
    if (!kvx_mul64(&v, v, g->num_layers) || !kvx_mul64(&v, v, g->kv_heads) ||
        !kvx_mul64(&v, v, n_tokens) || !kvx_mul64(&v, v, g->head_dim) ||
        !kvx_mul64(&v, v, elem))
        return 0;
    return v;
}

/* L * 2 * Hkv: one f32 scale per (layer, K|V, head) slab. Cannot overflow
 * for 32-bit L and Hkv (< 2^65 would need both near 2^32; checked anyway). */
uint64_t kvx_scale_count(const kvx_geometry *g)
{
    if (!g) return 0;
    uint64_t v = 2;
    if (!kvx_mul64(&v, v, g->num_layers) || !kvx_mul64(&v, v, g->kv_heads)) return 0;
    return v;
}

/* Largest divisor of n that is at most 65535 (1 when none is larger). */
static uint64_t geo_divisor(uint64_t n)
{
    for (uint64_t d = n < 65535 ? n : 65535; d > 1; d--)
        if (n % d == 0) return d;
    return 1;
}

int kvx_keyed_geometry(kvx_geometry *out, uint64_t page_bytes)
{
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_keyed_geometry: out is NULL");
    memset(out, 0, sizeof *out);
    if (page_bytes < 2 || page_bytes % 2 || page_bytes > UINT32_MAX)
        return kvx_fail(KVX_EINVALID, "page_bytes %llu: a keyed store's page size is an even number of bytes, 2..%u",
                        (unsigned long long)page_bytes, UINT32_MAX - 1);
    /* E4M3 (one byte an element) and one token: 2*L*Hkv*D = page_bytes */
    uint64_t n = page_bytes / 2, d = geo_divisor(n), h = geo_divisor(n / d), l = n / d / h;
    if (l > 65535)
        return kvx_fail(KVX_EINVALID, "page_bytes %llu: half of it does not factor into three numbers of at most "
                        "65535 (a shard's L, Hkv, D): pick a size with small factors, such as a multiple of 4096",
                        (unsigned long long)page_bytes);
    out->num_layers = (uint32_t)l;
    out->kv_heads = (uint32_t)h;
    out->head_dim = (uint32_t)d;
    out->block_tokens = 0;
    out->quant = KVX_QUANT_E4M3;
    out->model_signature = 0;
    return 0;
}
