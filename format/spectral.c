/*
 * spectral.c - the spectral steering bundle of a KVX shard: its size,
 * encoding (writer), validation and decoding (reader), and the steering
 * update h' = h + gamma * psi (psi^T h).
 *
 * Layout (DESIGN.md "Spectral bundle"): a 32-byte sub-header (n_cartridges,
 * first_layer, n_layers, dim, rank, crc32c, 8 reserved zero bytes), then one
 * record per cartridge: u32 id (1..32, increasing), u32 0, f32
 * psi[n_layers][dim][rank]. The bundle is small (KiB), so the reader copies
 * it to the heap at open and never touches the mapping for it again.
 *
 * The crc32c covers the whole bundle, sub-header and records, computed with
 * its own 4 bytes as zero, so a flipped first_layer or n_layers cannot move
 * steering to other layers unnoticed. The wave-1 rule (records only) is not
 * accepted: a bundle that matches only it is refused with a message naming
 * the rule change (no fallback: a fallback would leave the sub-header
 * unprotected in every file that still carries it). Every psi value must be
 * finite (writer input and reader alike); any finite size is accepted.
 */
#include "shard_format.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

/* The bundle CRC: crc32c of all len bytes with the CRC field read as 0. */
static uint32_t bundle_crc(const uint8_t *bundle, uint64_t len)
{
    static const uint8_t zero[4];
    uint32_t crc = kvx_crc32c(0, bundle, KVX_S_CRC);
    crc = kvx_crc32c(crc, zero, sizeof zero);
    return kvx_crc32c(crc, bundle + KVX_S_CRC + 4, (size_t)(len - KVX_S_CRC - 4));
}

/* A non-finite psi value is refused with where it is: cartridge (index and
 * id), the model layer and the element [row][column] of that layer's psi. */
static int psi_not_finite(float v, uint32_t k, uint32_t id, uint32_t layer, uint64_t elem,
                          uint32_t rank)
{
    return kvx_fail(KVX_ESPECTRAL,
                    "spectral bundle: cartridge %u (id %u), layer %u, psi element %llu "
                    "([%llu][%llu]) is %s; psi values must be finite",
                    k, id, layer, (unsigned long long)elem,
                    (unsigned long long)(elem / rank), (unsigned long long)(elem % rank),
                    isnan(v) ? "NaN" : v > 0 ? "+inf" : "-inf");
}

/* Checks that every psi value is finite: n cartridges, stride bytes apart
 * from psi, each layers x per_layer f32 values (read with memcpy, so psi
 * may be unaligned file bytes). The cartridge ids come from ids[k] or, for
 * stored records, from the u32 at raw_ids + k * stride. */
static int check_psi(const uint8_t *psi, size_t stride, uint32_t n, uint32_t first,
                     uint32_t layers, uint64_t per_layer, const uint32_t *ids,
                     const uint8_t *raw_ids, uint32_t rank)
{
    for (uint32_t k = 0; k < n; k++) {
        const uint8_t *p = psi + (size_t)k * stride;
        for (uint32_t l = 0; l < layers; l++)
            for (uint64_t e = 0; e < per_layer; e++) {
                float v;
                memcpy(&v, p + ((size_t)l * per_layer + e) * 4, 4);
                if (!isfinite(v))
                    return psi_not_finite(v, k, raw_ids ? kvx_load32(raw_ids + (size_t)k * stride) : ids[k],
                                          first + l, e, rank);
            }
    }
    return 0;
}

uint64_t kvx_spectral_bundle_bytes(uint32_t n_cartridges, uint32_t n_layers, uint32_t dim,
                                   uint32_t rank)
{
    uint64_t rec, total;
    if (!kvx_mul64(&rec, n_layers, dim) || !kvx_mul64(&rec, rec, rank) ||
        !kvx_mul64(&rec, rec, 4) || !kvx_add64(&rec, rec, 8) ||
        !kvx_mul64(&total, rec, n_cartridges) ||
        !kvx_add64(&total, total, KVX_SPECTRAL_HEADER_BYTES))
        return 0;
    return total;
}

/* The rules shared by the writer's input and a stored sub-header. */
static int check_counts(uint32_t n, uint32_t first, uint32_t layers, uint32_t dim, uint32_t rank,
                        uint32_t num_layers)
{
    if (n < 1 || n > KVX_SPECTRAL_MAX_CARTRIDGES)
        return kvx_fail(KVX_ESPECTRAL, "spectral bundle: n_cartridges %u is not in 1..32", n);
    if (layers == 0)
        return kvx_fail(KVX_ESPECTRAL, "spectral bundle: n_layers is 0");
    if ((uint64_t)first + layers > num_layers)
        return kvx_fail(KVX_ESPECTRAL,
                        "spectral bundle: first_layer %u + n_layers %u exceeds num_layers %u",
                        first, layers, num_layers);
    if (dim == 0)
        return kvx_fail(KVX_ESPECTRAL, "spectral bundle: dim is 0");
    if (rank < 1 || rank > dim)
        return kvx_fail(KVX_ESPECTRAL, "spectral bundle: rank %u is not in 1..dim (%u)", rank, dim);
    if (!kvx_spectral_bundle_bytes(n, layers, dim, rank))
        return kvx_fail(KVX_EOVERFLOW, "spectral bundle: size overflows");
    return 0;
}

static int check_ids(const uint32_t *ids, uint32_t n, size_t stride, const uint8_t *raw)
{
    uint32_t prev = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t id = raw ? kvx_load32(raw + (size_t)i * stride) : ids[i];
        if (id < 1 || id > KVX_SPECTRAL_MAX_CARTRIDGES)
            return kvx_fail(KVX_ESPECTRAL, "spectral bundle: cartridge %u has id %u (not 1..32)", i,
                            id);
        if (id <= prev)
            return kvx_fail(KVX_ESPECTRAL,
                            "spectral bundle: cartridge ids not increasing (%u after %u)", id, prev);
        prev = id;
    }
    return 0;
}

int kvx_spectral_check_in(const kvx_spectral_in *in, uint32_t num_layers)
{
    int rc = check_counts(in->n_cartridges, in->first_layer, in->n_layers, in->dim, in->rank,
                          num_layers);
    if (rc) return rc;
    if (!in->ids || !in->psi)
        return kvx_fail(KVX_EINVALID, "spectral bundle: ids and psi must not be NULL");
    rc = check_ids(in->ids, in->n_cartridges, 0, NULL);
    if (rc) return rc;
    uint64_t per_layer = (uint64_t)in->dim * in->rank; /* fits: check_counts sized the bundle */
    return check_psi((const uint8_t *)in->psi, (size_t)(per_layer * in->n_layers * 4), in->n_cartridges,
                     in->first_layer, in->n_layers, per_layer, in->ids, NULL, in->rank);
}

void kvx_spectral_encode(uint8_t *out, const kvx_spectral_in *in)
{
    uint64_t per = (uint64_t)in->n_layers * in->dim * in->rank; /* floats per cartridge */
    uint64_t total = kvx_spectral_bundle_bytes(in->n_cartridges, in->n_layers, in->dim, in->rank);
    memset(out, 0, KVX_SPECTRAL_HEADER_BYTES);
    kvx_store32(out + KVX_S_COUNT, in->n_cartridges);
    kvx_store32(out + KVX_S_FIRST_LAYER, in->first_layer);
    kvx_store32(out + KVX_S_LAYERS, in->n_layers);
    kvx_store32(out + KVX_S_DIM, in->dim);
    kvx_store32(out + KVX_S_RANK, in->rank);
    uint8_t *p = out + KVX_SPECTRAL_HEADER_BYTES;
    for (uint32_t k = 0; k < in->n_cartridges; k++) {
        kvx_store32(p, in->ids[k]);
        kvx_store32(p + 4, 0);
        memcpy(p + 8, in->psi + k * per, per * 4); /* f32 LE on LE hosts */
        p += 8 + per * 4;
    }
    kvx_store32(out + KVX_S_CRC, bundle_crc(out, total)); /* the field is 0 here */
}

int kvx_spectral_header_check(uint64_t *out_len, const uint8_t hdr[KVX_SPECTRAL_HEADER_BYTES],
                              uint32_t spectral_dim, uint32_t num_layers)
{
    uint32_t n = kvx_load32(hdr + KVX_S_COUNT), first = kvx_load32(hdr + KVX_S_FIRST_LAYER);
    uint32_t layers = kvx_load32(hdr + KVX_S_LAYERS), dim = kvx_load32(hdr + KVX_S_DIM);
    uint32_t rank = kvx_load32(hdr + KVX_S_RANK);
    int rc = check_counts(n, first, layers, dim, rank, num_layers);
    if (rc) return rc;
    if (dim != spectral_dim)
        return kvx_fail(KVX_ESPECTRAL, "spectral bundle: dim %u differs from header spectral_dim %u",
                        dim, spectral_dim);
    if (kvx_load64(hdr + KVX_S_RESERVED) != 0)
        return kvx_fail(KVX_ESPECTRAL, "spectral bundle: reserved bytes are not zero");
    *out_len = kvx_spectral_bundle_bytes(n, layers, dim, rank);
    return 0;
}

int kvx_spectral_decode(kvx_spectral *out, uint32_t **out_ids, float **out_psi,
                        const uint8_t *bundle, uint64_t len, uint32_t spectral_dim,
                        uint32_t num_layers)
{
    uint64_t want = 0;
    int rc = kvx_spectral_header_check(&want, bundle, spectral_dim, num_layers);
    if (rc) return rc;
    if (want != len)
        return kvx_fail(KVX_ESPECTRAL, "spectral bundle: %llu bytes, sub-header implies %llu",
                        (unsigned long long)len, (unsigned long long)want);
    uint32_t stored = kvx_load32(bundle + KVX_S_CRC), crc = bundle_crc(bundle, len);
    if (crc != stored) {
        if (kvx_crc32c(0, bundle + KVX_SPECTRAL_HEADER_BYTES, (size_t)(len - KVX_SPECTRAL_HEADER_BYTES)) ==
            stored)
            return kvx_fail(KVX_ESPECTRAL,
                            "spectral bundle: CRC matches the wave-1 rule (records only), which this "
                            "version no longer accepts (the CRC now covers the sub-header too): "
                            "rewrite the shard");
        return kvx_fail(KVX_ESPECTRAL,
                        "spectral bundle: crc32c of the whole bundle (sub-header and records) is "
                        "0x%08x, stored 0x%08x",
                        crc, stored);
    }
    kvx_spectral s;
    s.n_cartridges = kvx_load32(bundle + KVX_S_COUNT);
    s.first_layer = kvx_load32(bundle + KVX_S_FIRST_LAYER);
    s.n_layers = kvx_load32(bundle + KVX_S_LAYERS);
    s.dim = kvx_load32(bundle + KVX_S_DIM);
    s.rank = kvx_load32(bundle + KVX_S_RANK);
    uint64_t per = (uint64_t)s.n_layers * s.dim * s.rank;
    size_t rec = 8 + (size_t)per * 4;
    const uint8_t *recs = bundle + KVX_SPECTRAL_HEADER_BYTES;
    rc = check_ids(NULL, s.n_cartridges, rec, recs);
    if (rc) return rc;
    for (uint32_t k = 0; k < s.n_cartridges; k++)
        if (kvx_load32(recs + k * rec + 4) != 0)
            return kvx_fail(KVX_ESPECTRAL, "spectral bundle: cartridge %u: reserved word not 0", k);
    rc = check_psi(recs + 8, rec, s.n_cartridges, s.first_layer, s.n_layers, (uint64_t)s.dim * s.rank,
                   NULL, recs, s.rank);
    if (rc) return rc;
    uint32_t *ids = malloc(sizeof *ids * s.n_cartridges);
    float *psi = malloc((size_t)per * s.n_cartridges * sizeof(float));
    if (!ids || !psi) {
        free(ids);
        free(psi);
        return kvx_fail(-ENOMEM, "spectral bundle: out of memory");
    }
    for (uint32_t k = 0; k < s.n_cartridges; k++) {
        ids[k] = kvx_load32(recs + k * rec);
        memcpy(psi + k * per, recs + k * rec + 8, (size_t)per * 4);
    }
    s.ids = ids;
    s.psi = psi;
    *out = s;
    *out_ids = ids;
    *out_psi = psi;
    return 0;
}

void kvx_spectral_apply(float *h, const float *psi_layer, uint32_t dim, uint32_t rank, float gamma)
{
    /* t = psi^T h (rank values, accumulated in double), then h += gamma psi t.
     * t must come from the unmodified h, hence the two passes. */
    double stack_t[64];
    double *t = rank <= 64 ? stack_t : malloc(sizeof(double) * rank);
    if (!h || !psi_layer || !t) {
        if (t != stack_t) free(t);
        return; /* nothing sane to do without memory; h is left unchanged */
    }
    for (uint32_t r = 0; r < rank; r++) t[r] = 0.0;
    for (uint32_t i = 0; i < dim; i++) {
        const float *row = psi_layer + (size_t)i * rank;
        for (uint32_t r = 0; r < rank; r++) t[r] += (double)row[r] * h[i];
    }
    for (uint32_t i = 0; i < dim; i++) {
        const float *row = psi_layer + (size_t)i * rank;
        double acc = 0.0;
        for (uint32_t r = 0; r < rank; r++) acc += (double)row[r] * t[r];
        h[i] = (float)(h[i] + gamma * acc);
    }
    if (t != stack_t) free(t);
}
