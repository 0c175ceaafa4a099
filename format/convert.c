/*
 * convert.c - KVX shard pages to TLKV envelope blocks and back.
 *
 * The two layouts differ (DESIGN.md): a KVX page of N tokens is
 * [K|V][L][Hkv][N][D]; an envelope payload is [L][K|V][Hkv][B][D], zero
 * past n_tokens, then (v2) the f32 scales [L][2][Hkv]. Both are sequences
 * of (layer, K|V, head) slabs of N*D elements, so conversion walks slab by
 * slab: slab (l, kv, h) is at ((kv*L + l)*Hkv + h)*N*D in a page and at
 * ((l*2 + kv)*Hkv + h)*B*D in a payload, and its scale is scale index
 * (l*2 + kv)*Hkv + h in both the envelope and the shard's scale table.
 *
 * Lossless where the element types agree: FP16 <-> v1, BF16 <-> v3 and E4M3
 * (with its scale table) <-> v2 copy bytes and scales. Otherwise values go through
 * f32: into v2 (or into an E4M3 page with out_scales) by the envelope's
 * writer rule, computed by kvx_envelope_quantize_v2 itself one (layer,
 * head) pair at a time, so the bytes are exactly what an envelope writer
 * would produce; into f16, E5M2 and bf16 by round to nearest even at
 * scale 1. A BF16 page goes to v1 only when every value is exact in f16:
 * the first one that is not is named (KVX_ELOSSY) and nothing is written.
 */
#include "shard_format.h"
#include "format.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct conv_dims {
    size_t L, H, D, B;
} conv_dims;

static size_t page_slab(const conv_dims *d, size_t kv, size_t l, size_t h)
{
    return (kv * d->L + l) * d->H + h;
}
static size_t payload_slab(const conv_dims *d, size_t kv, size_t l, size_t h)
{
    return (l * 2 + kv) * d->H + h;
}

/* n elements of quant q (unaligned bytes) times scale into f32. */
static void decode_n(float *out, const uint8_t *in, size_t n, uint32_t q, float scale)
{
    switch (q) {
    case KVX_QUANT_FP16:
        for (size_t i = 0; i < n; i++) out[i] = kvx_f16_to_f32(kvx_load16(in + 2 * i));
        break;
    case KVX_QUANT_BF16:
        for (size_t i = 0; i < n; i++) out[i] = kvx_bf16_to_f32(kvx_load16(in + 2 * i));
        break;
    case KVX_QUANT_E4M3: kvx_e4m3_to_f32_n(out, in, n, scale); break;
    default: kvx_e5m2_to_f32_n(out, in, n, scale); break;
    }
}

static float load_f32(const uint8_t *p)
{
    float f;
    memcpy(&f, p, 4);
    return f;
}

static void store_f32(uint8_t *p, float f) { memcpy(p, &f, 4); }

/* Scratch of the converting (not copying) path, one (layer, head) pair at a
 * time: the K and V slabs in f32, their v2 quantization, one slab in f16. */
typedef struct conv_scratch {
    float *tmp;    /* [2][B][D] */
    uint8_t *q;    /* [2][B][D] */
    uint16_t *h16; /* [fill] */
} conv_scratch;

static void scratch_free(conv_scratch *s)
{
    free(s->tmp);
    free(s->q);
    free(s->h16);
}

/* All NULL when !need; on failure frees what it got and fails -ENOMEM. */
static int scratch_alloc(conv_scratch *s, int need, size_t slab, size_t fill, const char *who)
{
    *s = (conv_scratch){NULL, NULL, NULL};
    if (!need) return 0;
    s->tmp = calloc(2 * slab, sizeof(float));
    s->q = malloc(2 * slab);
    s->h16 = malloc(sizeof(uint16_t) * fill);
    if (s->tmp && s->q && s->h16) return 0;
    scratch_free(s);
    return kvx_fail(-ENOMEM, "%s: out of memory", who);
}

/* A BF16 page of n tokens goes to f16 (v1) only when every value survives
 * exactly (NaN stays NaN, inf inf). Checked in payload order
 * [L][K|V][Hkv][N][D] before anything is written; the first value that does
 * not fit is named by its position and value. */
static int check_bf16_fits_f16(const conv_dims *d, const uint8_t *page, size_t N, const char *who)
{
    const size_t fill = N * d->D;
    for (size_t l = 0; l < d->L; l++)
        for (size_t kv = 0; kv < 2; kv++)
            for (size_t h = 0; h < d->H; h++) {
                const uint8_t *p = page + page_slab(d, kv, l, h) * fill * 2;
                for (size_t i = 0; i < fill; i++) {
                    uint16_t b = kvx_load16(p + 2 * i);
                    float x = kvx_bf16_to_f32(b);
                    if (x != x) continue; /* NaN: f16 has NaN too */
                    float y = kvx_f16_to_f32(kvx_f32_to_f16(x));
                    uint32_t ux, uy;
                    memcpy(&ux, &x, 4);
                    memcpy(&uy, &y, 4);
                    if (ux != uy)
                        return kvx_fail(KVX_ELOSSY,
                                        "%s: bf16 element (layer %zu, %s, head %zu, token %zu, dim %zu) is %.9g (0x%04x), "
                                        "not exactly representable in f16 (v1); export v2 or v3 instead",
                                        who, l, kv ? "V" : "K", h, i / d->D, i % d->D, (double)x, b);
                }
            }
    return 0;
}

static int check_geometry(const kvx_geometry *g, const char *who)
{
    if (!kvx_quant_elem_size(g->quant)) return kvx_fail(KVX_EQUANT, "%s: quant %u is unknown", who, g->quant);
    if (!g->block_tokens || !g->num_layers || !g->kv_heads || !g->head_dim)
        return kvx_fail(KVX_EINVALID, "%s: geometry has a zero dimension (B %u, L %u, Hkv %u, D %u)", who,
                        g->block_tokens, g->num_layers, g->kv_heads, g->head_dim);
    return 0;
}

int kvx_page_to_envelope_payload(void *out_payload, uint16_t version, const kvx_geometry *g,
                                 const void *page, uint32_t n_tokens, const float *scales)
{
    static const char who[] = "page to envelope payload";
    if (!out_payload || !g || !page) return kvx_fail(KVX_EINVALID, "%s: NULL argument", who);
    if (version != KVX_ENVELOPE_V1 && version != KVX_ENVELOPE_V2 && version != KVX_ENVELOPE_V3)
        return kvx_fail(KVX_EVERSION, "%s: version %u is not 1, 2 or 3", who, version);
    int rc = check_geometry(g, who);
    if (rc) return rc;
    if (n_tokens < 1 || n_tokens > g->block_tokens)
        return kvx_fail(KVX_ETOKENS, "%s: n_tokens %u is not in 1..%u", who, n_tokens, g->block_tokens);
    size_t P = kvx_envelope_payload_bytes(version, g);
    if (!P || !kvx_page_bytes(g, n_tokens)) return kvx_fail(KVX_EOVERFLOW, "%s: sizes overflow", who);

    const conv_dims d = {g->num_layers, g->kv_heads, g->head_dim, g->block_tokens};
    const size_t es = kvx_quant_elem_size(g->quant), N = n_tokens;
    const size_t fill = N * d.D, slab = d.B * d.D; /* elements */
    const uint8_t *src = page;
    uint8_t *out = out_payload;
    uint8_t *out_scales = out + d.L * 2 * d.H * slab; /* v2 only */
    if (version == KVX_ENVELOPE_V1 && g->quant == KVX_QUANT_BF16 && (rc = check_bf16_fits_f16(&d, src, N, who)))
        return rc;
    memset(out, 0, version != KVX_ENVELOPE_V2 ? P : d.L * 2 * d.H * slab);

    int direct = (version == KVX_ENVELOPE_V1 && g->quant == KVX_QUANT_FP16) ||
                 (version == KVX_ENVELOPE_V2 && g->quant == KVX_QUANT_E4M3) ||
                 (version == KVX_ENVELOPE_V3 && g->quant == KVX_QUANT_BF16);
    conv_scratch s;
    rc = scratch_alloc(&s, !direct, slab, fill, who);
    if (rc) return rc;
    kvx_geometry pair = {1, 1, g->head_dim, g->block_tokens, KVX_QUANT_E4M3, 0};
    for (size_t l = 0; l < d.L && !rc; l++)
        for (size_t h = 0; h < d.H && !rc; h++) {
            if (direct) {
                for (size_t kv = 0; kv < 2; kv++) {
                    size_t ps = page_slab(&d, kv, l, h), es_ = payload_slab(&d, kv, l, h);
                    memcpy(out + es_ * slab * es, src + ps * fill * es, fill * es);
                    if (version == KVX_ENVELOPE_V2)
                        store_f32(out_scales + 4 * es_, scales ? scales[es_] : 1.0f);
                }
                continue;
            }
            /* Decode the K and V slabs of (l, h) into [2][B][D] f32. */
            for (size_t kv = 0; kv < 2; kv++) {
                size_t ps = page_slab(&d, kv, l, h), es_ = payload_slab(&d, kv, l, h);
                float sc = scales && kvx_quant_is_fp8(g->quant) ? scales[es_] : 1.0f;
                decode_n(s.tmp + kv * slab, src + ps * fill * es, fill, g->quant, sc);
            }
            for (size_t kv = 0; kv < 2; kv++) {
                size_t es_ = payload_slab(&d, kv, l, h);
                if (version == KVX_ENVELOPE_V1) {
                    kvx_f32_to_f16_n(s.h16, s.tmp + kv * slab, fill);
                    memcpy(out + es_ * slab * 2, s.h16, fill * 2); /* LE host */
                } else if (version == KVX_ENVELOPE_V3) {
                    kvx_f32_to_bf16_n(s.h16, s.tmp + kv * slab, fill);
                    memcpy(out + es_ * slab * 2, s.h16, fill * 2);
                }
            }
            if (version == KVX_ENVELOPE_V2) {
                float sc2[2];
                rc = kvx_envelope_quantize_v2(s.q, sc2, s.tmp, &pair, n_tokens);
                for (size_t kv = 0; kv < 2 && !rc; kv++) {
                    size_t es_ = payload_slab(&d, kv, l, h);
                    memcpy(out + es_ * slab, s.q + kv * slab, fill);
                    store_f32(out_scales + 4 * es_, sc2[kv]);
                }
            }
        }
    scratch_free(&s);
    return rc;
}

/* A finite value the target type can only hold as infinity (f16 past
 * 65504, E5M2 past 57344, both after rounding): KVX_ELOSSY naming it. A
 * store that kept it would hand out an infinity the sender never had. */
static int check_finite_fits(const float *x, size_t fill, uint32_t quant, size_t l, size_t kv, size_t h, size_t D,
                             const char *who)
{
    const float limit = quant == KVX_QUANT_FP16 ? 65520.0f : quant == KVX_QUANT_E5M2 ? 61440.0f : 0.0f;
    if (limit == 0.0f) return 0;
    for (size_t i = 0; i < fill; i++)
        if (isfinite(x[i]) && fabsf(x[i]) >= limit)
            return kvx_fail(KVX_ELOSSY,
                            "%s: element (layer %zu, %s, head %zu, token %zu, dim %zu) is %.9g, beyond the store's %s "
                            "range (it would become infinity)",
                            who, l, kv ? "V" : "K", h, i / D, i % D, (double)x[i], kvx_quant_name(quant));
    return 0;
}

int kvx_envelope_payload_to_page(void *out_page, float *out_scales, const kvx_geometry *g,
                                 const kvx_envelope *env, const kvx_envelope_block *blk)
{
    static const char who[] = "envelope payload to page";
    if (!out_page || !g || !env || !blk || !blk->payload)
        return kvx_fail(KVX_EINVALID, "%s: NULL argument", who);
    if (env->version != KVX_ENVELOPE_V1 && env->version != KVX_ENVELOPE_V2 && env->version != KVX_ENVELOPE_V3)
        return kvx_fail(KVX_EVERSION, "%s: envelope version %u is not 1, 2 or 3", who, env->version);
    int rc = check_geometry(g, who);
    if (rc) return rc;
    const kvx_geometry *eg = &env->geometry;
    if (g->block_tokens != eg->block_tokens || g->num_layers != eg->num_layers ||
        g->kv_heads != eg->kv_heads || g->head_dim != eg->head_dim)
        return kvx_fail(KVX_ESHAPE, "%s: target B %u L %u Hkv %u D %u, envelope B %u L %u Hkv %u D %u", who,
                        g->block_tokens, g->num_layers, g->kv_heads, g->head_dim, eg->block_tokens,
                        eg->num_layers, eg->kv_heads, eg->head_dim);
    uint32_t n = blk->n_tokens;
    if (n < 1 || n > g->block_tokens)
        return kvx_fail(KVX_ETOKENS, "%s: n_tokens %u is not in 1..%u", who, n, g->block_tokens);
    if (env->version == KVX_ENVELOPE_V2 && !blk->scales)
        return kvx_fail(KVX_EINVALID, "%s: a v2 block without scales", who);

    const conv_dims d = {g->num_layers, g->kv_heads, g->head_dim, g->block_tokens};
    const size_t N = n, fill = N * d.D, slab = d.B * d.D;
    const size_t es = kvx_quant_elem_size(g->quant);
    const uint32_t src_q = env->version == KVX_ENVELOPE_V1   ? KVX_QUANT_FP16
                           : env->version == KVX_ENVELOPE_V2 ? KVX_QUANT_E4M3
                                                             : KVX_QUANT_BF16;
    const size_t src_es = kvx_quant_elem_size(src_q);
    uint8_t *dst = out_page;
    const uint8_t *pl = blk->payload;

    /* Same element type: bytes (and v2 scales) are copied as they are. */
    int direct = g->quant == src_q && (src_q != KVX_QUANT_E4M3 || out_scales);
    /* v1 or v3 into E4M3 with room for scales: the writer rule. */
    int rule = src_q != KVX_QUANT_E4M3 && g->quant == KVX_QUANT_E4M3 && out_scales;
    conv_scratch s;
    rc = scratch_alloc(&s, !direct, slab, fill, who);
    if (rc) return rc;
    kvx_geometry pair = {1, 1, g->head_dim, g->block_tokens, KVX_QUANT_E4M3, 0};
    for (size_t l = 0; l < d.L && !rc; l++)
        for (size_t h = 0; h < d.H && !rc; h++) {
            for (size_t kv = 0; kv < 2; kv++) {
                size_t ps = page_slab(&d, kv, l, h), sx = payload_slab(&d, kv, l, h);
                float sc = src_q == KVX_QUANT_E4M3 ? load_f32(blk->scales + 4 * sx) : 1.0f;
                if (direct) {
                    memcpy(dst + ps * fill * es, pl + sx * slab * src_es, fill * es);
                    if (out_scales) out_scales[sx] = sc;
                } else {
                    decode_n(s.tmp + kv * slab, pl + sx * slab * src_es, fill, src_q, sc);
                }
            }
            if (direct) continue;
            float sc2[2] = {1.0f, 1.0f};
            if (rule) rc = kvx_envelope_quantize_v2(s.q, sc2, s.tmp, &pair, n);
            for (size_t kv = 0; kv < 2 && !rc; kv++) {
                size_t ps = page_slab(&d, kv, l, h), sx = payload_slab(&d, kv, l, h);
                uint8_t *o = dst + ps * fill * es;
                const float *x = s.tmp + kv * slab;
                if (!rule && (rc = check_finite_fits(x, fill, g->quant, l, kv, h, d.D, who))) break;
                if (rule) memcpy(o, s.q + kv * slab, fill);
                else if (g->quant == KVX_QUANT_FP16) {
                    kvx_f32_to_f16_n(s.h16, x, fill);
                    memcpy(o, s.h16, fill * 2);
                } else if (g->quant == KVX_QUANT_BF16) {
                    kvx_f32_to_bf16_n(s.h16, x, fill);
                    memcpy(o, s.h16, fill * 2);
                } else if (g->quant == KVX_QUANT_E4M3) kvx_f32_to_e4m3_n(o, x, fill, 1.0f);
                else kvx_f32_to_e5m2_n(o, x, fill, 1.0f);
                if (out_scales) out_scales[sx] = sc2[kv];
            }
        }
    scratch_free(&s);
    return rc;
}

int kvx_shard_from_envelope(const char *path, const void *env, size_t len, uint8_t shard_id,
                            uint64_t model_signature)
{
    if (!path || !env) return kvx_fail(KVX_EINVALID, "shard from envelope: NULL argument");
    kvx_envelope e;
    int rc = kvx_envelope_parse(&e, env, len, NULL);
    if (rc) return rc;
    if (e.n_blocks > KVX_MAX_ENTRIES)
        return kvx_fail(KVX_ECAPACITY, "shard from envelope: %u blocks, a shard holds at most %u",
                        e.n_blocks, KVX_MAX_ENTRIES);
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = e.geometry;
    o.geometry.quant = e.geometry.quant; /* FP16, E4M3 or BF16 (v1, v2, v3) */
    o.geometry.model_signature = model_signature;
    o.shard_id = shard_id;
    o.max_entries = e.n_blocks ? e.n_blocks : 1;
    o.flags = KVX_FLAG_HASHES | (e.version == KVX_ENVELOPE_V2 ? KVX_FLAG_SCALES : 0);
    uint64_t page_bytes = kvx_page_bytes(&o.geometry, o.geometry.block_tokens);
    if (!page_bytes || page_bytes > SIZE_MAX)
        return kvx_fail(KVX_EOVERFLOW, "shard from envelope: page size overflows");
    /* an envelope of no blocks needs no page: its header alone may
     * declare dimensions of gigabytes (kvx_envelope_parse checked the length) */
    uint8_t *page = malloc(e.n_blocks ? (size_t)page_bytes : 1);
    float *scales = malloc(e.n_blocks ? sizeof(float) * (size_t)kvx_scale_count(&o.geometry) : 1);
    kvx_shard_writer *w = NULL;
    if (!page || !scales) rc = kvx_fail(-ENOMEM, "shard from envelope: out of memory");
    if (!rc) rc = kvx_shard_writer_create(&w, path, &o);
    for (uint32_t i = 0; i < e.n_blocks && !rc; i++) {
        kvx_envelope_block b;
        rc = kvx_envelope_block_at(&b, &e, i);
        if (!rc) rc = kvx_envelope_payload_to_page(page, scales, &o.geometry, &e, &b);
        if (!rc) {
            kvx_entry_in in = {0};
            in.radix_block = (uint16_t)i;
            in.token_count = b.n_tokens;
            in.page = page;
            in.hash = b.hash;
            in.scales = e.version == KVX_ENVELOPE_V2 ? scales : NULL;
            rc = kvx_shard_writer_add(w, &in);
            if (rc) {
                char why[256];
                snprintf(why, sizeof why, "%s", kvx_last_error());
                rc = kvx_fail(rc, "shard from envelope: block %u: %s", i, why);
            }
        }
    }
    free(page);
    free(scales);
    if (rc) {
        kvx_shard_writer_abort(w);
        return rc;
    }
    return kvx_shard_writer_seal(w);
}

int kvx_shard_to_envelope(void **out_buf, size_t *out_len, const kvx_shard *s, uint16_t version)
{
    if (!out_buf || !out_len || !s) return kvx_fail(KVX_EINVALID, "shard to envelope: NULL argument");
    *out_buf = NULL;
    *out_len = 0;
    const kvx_shard_info *info = kvx_shard_get_info(s);
    const kvx_geometry *g = &info->geometry;
    if (version != KVX_ENVELOPE_V1 && version != KVX_ENVELOPE_V2 && version != KVX_ENVELOPE_V3)
        return kvx_fail(KVX_EVERSION, "shard to envelope: version %u is not 1, 2 or 3", version);
    if (!g->block_tokens)
        return kvx_fail(KVX_EINVALID, "shard to envelope: %s has no block_tokens", kvx_shard_path(s));
    if (info->flags & KVX_FLAG_KEYS)
        return kvx_fail(KVX_EINVALID, "shard to envelope: %s holds keyed pages, not KV blocks", kvx_shard_path(s));
    if (kvx_shard_missing(s))
        return kvx_fail(KVX_ETRUNC, "shard to envelope: %s: %u of its %u pages lie past the end of the file (missing)",
                        kvx_shard_path(s), kvx_shard_missing(s), info->num_blocks);
    uint32_t n = info->num_blocks;
    for (uint32_t i = 0; i < n; i++) {
        kvx_entry e;
        kvx_shard_entry(&e, s, i);
        if (e.token_count > g->block_tokens)
            return kvx_fail(KVX_ETOKENS, "shard to envelope: entry %u has %u tokens, more than block_tokens %u",
                            i, e.token_count, g->block_tokens);
        /* the copy below reads the formula's bytes from the page */
        if (e.bytes != kvx_page_bytes(g, e.token_count))
            return kvx_fail(KVX_EFORMAT, "shard to envelope: entry %u has %llu page bytes, %llu for %u tokens", i,
                            (unsigned long long)e.bytes, (unsigned long long)kvx_page_bytes(g, e.token_count),
                            e.token_count);
    }
    size_t total;
    int rc = kvx_envelope_size(&total, version, g, n);
    if (rc) return rc;
    size_t P = kvx_envelope_payload_bytes(version, g);
    /* bounded by the input (DESIGN.md rule 5): an envelope pads each block
     * to B tokens and widens FP8 to f16, so it may outgrow its shard, but
     * not by more than that; a header declaring a huge B in a small file
     * does not get gigabytes. The shard's size is what holds data: header
     * and tables of n entries, the spectral bundle, each page padded to
     * 4096, as the writer lays them back to back. Not the file's size: a
     * sparse tail, or holes between tables and pages, are not input (a
     * small file truncated up to 1 TiB got a 64 TiB cap). */
    uint64_t page_sum = 0, held = 0;
    kvx_shard_layout lay;
    if (kvx_shard_layout_for(&lay, n, info->flags, g->block_tokens, g->num_layers, g->kv_heads) == 0)
        held = lay.tables_end;
    kvx_spectral sp;
    if (info->spectral_offset && kvx_shard_spectral(&sp, s) == 0)
        held += kvx_spectral_bundle_bytes(sp.n_cartridges, sp.n_layers, sp.dim, sp.rank);
    for (uint32_t i = 0; i < n; i++) {
        kvx_entry e;
        kvx_shard_entry(&e, s, i);
        page_sum += e.bytes;
        held += kvx_align_up(e.bytes, 4096);
    }
    if (held > info->file_size) held = info->file_size; /* never more than today's cap */
    uint64_t cap = 64 * (page_sum > held ? page_sum : held) + ((uint64_t)1 << 20);
    if ((uint64_t)total > cap)
        return kvx_fail(KVX_ECAPACITY,
                        "shard to envelope: %s would make a %zu-byte envelope from %llu bytes of pages (block_tokens %u)",
                        kvx_shard_path(s), total, (unsigned long long)page_sum, g->block_tokens);
    uint8_t *buf = malloc(total);
    if (!buf) return kvx_fail(-ENOMEM, "shard to envelope: out of memory for %zu bytes", total);
    memcpy(buf, "TLKV", 4);
    kvx_store16(buf + 4, version);
    /* tl_dtype F16 / F8_E4M3 / BF16 (v3, kvx's) */
    kvx_store16(buf + 6, version == KVX_ENVELOPE_V1 ? 1 : version == KVX_ENVELOPE_V2 ? 3 : 2);
    kvx_store32(buf + 8, n);
    kvx_store32(buf + 12, g->block_tokens);
    kvx_store32(buf + 16, g->num_layers);
    kvx_store32(buf + 20, g->kv_heads);
    kvx_store32(buf + 24, g->head_dim);
    uint8_t *rec = buf + KVX_ENVELOPE_HEADER_BYTES;
    for (uint32_t i = 0; i < n && !rc; i++, rec += 12 + P) {
        kvx_entry e;
        const void *page;
        kvx_shard_entry(&e, s, i);
        rc = kvx_shard_page(&page, s, i, 1); /* a damaged page is not exported */
        if (!rc) {
            kvx_store64(rec, e.hash);
            kvx_store32(rec + 8, e.token_count);
            rc = kvx_page_to_envelope_payload(rec + 12, version, g, page, e.token_count, e.scales);
        }
    }
    if (rc) {
        free(buf);
        return rc;
    }
    kvx_store32(buf + total - 4, kvx_crc32c(0, buf, total - 4));
    *out_buf = buf;
    *out_len = total;
    return 0;
}

void kvx_free(void *p) { free(p); }
