/*
 * value.c - the shared tier's key and value bytes (DESIGN.md, "Shared
 * tier"), and the check every value passes before it is used or copied.
 *
 * Rule: a value read from the tier is untrusted input. It is used for a
 * block of a prompt only when its CRC-32C, magic, version, namespace,
 * model signature, B, token ids (equal to the prompt's), envelope (every
 * reader rule, against the store's geometry) and block hash (H(parent,
 * tokens), equal to the prompt's) all hold; the key already carries the
 * prompt's prefix digest, so a value under another prompt's key has other
 * tokens or another parent and fails. Pure functions: no I/O, no state
 * (fuzz/tier_value_fuzzer.c feeds the check anything).
 *
 * Value: "KVXT" | u16 version 1 | u16 0 | u64 ns | u64 model_signature |
 * u32 B | B x u32 tokens | one-block envelope (v1 FP16/E5M2, v2 E4M3, v3
 * BF16: lossless for the store's quant) | u32 CRC-32C of all before it.
 * Little-endian throughout.
 */
#include "tier.h"
#include "format/format.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HEAD_BYTES 28 /* magic 4, version 2, zero 2, ns 8, model 8, B 4 */

static void put_u16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint16_t get_u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t get_u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get_u64(const uint8_t *p) { uint64_t v; memcpy(&v, p, 8); return v; }

uint64_t kvx_tier_ns(const kvx_geometry *g, const char *tenant)
{
    uint8_t buf[10 + 8 + 20 + KVX_TIER_TENANT_MAX];
    size_t n = 0;
    memcpy(buf, "kvx-tier-1", 10);
    n = 10;
    put_u64(buf + n, g->model_signature), n += 8;
    put_u32(buf + n, g->num_layers), n += 4;
    put_u32(buf + n, g->kv_heads), n += 4;
    put_u32(buf + n, g->head_dim), n += 4;
    put_u32(buf + n, g->block_tokens), n += 4;
    put_u32(buf + n, g->quant), n += 4;
    size_t tl = tenant ? strnlen(tenant, KVX_TIER_TENANT_MAX - 1) : 0;
    memcpy(buf + n, tenant ? tenant : "", tl), n += tl;
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (EVP_Digest(buf, n, md, &mdlen, EVP_sha256(), NULL) != 1) abort(); /* cannot fail on valid input */
    return get_u64(md);
}

void kvx_tier_sha1hex(char out[41], const void *data, size_t len)
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    if (EVP_Digest(data, len, md, &mdlen, EVP_sha1(), NULL) != 1) abort();
    for (int i = 0; i < 20; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

void kvx_tier_key(char out[KVX_TIER_KEY_BYTES], uint64_t ns, uint64_t hash, const uint8_t *digest)
{
    int n = snprintf(out, KVX_TIER_KEY_BYTES, "kvx:1:%016llx:%016llx:", (unsigned long long)ns,
                     (unsigned long long)hash);
    for (int i = 0; i < KVX_DIGEST_BYTES; i++) snprintf(out + n + 2 * i, 3, "%02x", digest[i]);
}

uint16_t kvx_tier_env_version(const kvx_geometry *g)
{
    switch (g->quant) {
    case KVX_QUANT_E4M3: return KVX_ENVELOPE_V2;
    case KVX_QUANT_BF16: return KVX_ENVELOPE_V3;
    default: return KVX_ENVELOPE_V1; /* FP16; E5M2 is a subset of f16 */
    }
}

size_t kvx_tier_value_bytes(const kvx_geometry *g)
{
    size_t env;
    if (kvx_envelope_size(&env, kvx_tier_env_version(g), g, 1)) return 0;
    size_t n = HEAD_BYTES + (size_t)g->block_tokens * 4u + env + 4u;
    return n < env ? 0 : n;
}

int kvx_tier_value_encode(uint8_t **out, size_t *out_len, uint64_t ns, const kvx_geometry *g, uint64_t hash,
                          const uint32_t *tokens, const void *page, const float *scales)
{
    *out = NULL;
    *out_len = 0;
    uint16_t ver = kvx_tier_env_version(g);
    size_t env_bytes, pay = kvx_envelope_payload_bytes(ver, g), total = kvx_tier_value_bytes(g);
    int rc = kvx_envelope_size(&env_bytes, ver, g, 1);
    if (rc) return rc;
    if (!total || !pay) return kvx_fail(KVX_EOVERFLOW, "tier: value size overflows");
    uint8_t *v = malloc(total), *p = malloc(pay);
    if (!v || !p) {
        free(v);
        free(p);
        return kvx_fail(-ENOMEM, "tier: out of memory");
    }
    uint32_t B = g->block_tokens;
    memcpy(v, KVX_TIER_MAGIC, 4);
    put_u16(v + 4, KVX_TIER_VALUE_VERSION);
    put_u16(v + 6, 0);
    put_u64(v + 8, ns);
    put_u64(v + 16, g->model_signature);
    put_u32(v + 24, B);
    memcpy(v + HEAD_BYTES, tokens, (size_t)B * 4u);
    size_t off = HEAD_BYTES + (size_t)B * 4u;
    rc = kvx_page_to_envelope_payload(p, ver, g, page, B, scales);
    if (!rc) {
        /* the v2 payload's scales are its tail (kvx_page_to_envelope_payload) */
        size_t ns_ = ver == KVX_ENVELOPE_V2 ? (size_t)kvx_scale_count(g) : 0;
        float *sc = NULL;
        if (ns_) {
            sc = malloc(ns_ * sizeof *sc);
            if (!sc) rc = kvx_fail(-ENOMEM, "tier: out of memory");
            else memcpy(sc, p + pay - ns_ * 4u, ns_ * 4u);
        }
        kvx_envelope_block_in bi = {hash, B, p, sc};
        if (!rc) rc = kvx_envelope_export(v + off, env_bytes, ver, g, &bi, 1);
        free(sc);
    }
    free(p);
    if (rc) {
        free(v);
        return rc;
    }
    off += env_bytes;
    put_u32(v + off, kvx_crc32c(0, v, off));
    *out = v;
    *out_len = total;
    return 0;
}

int kvx_tier_value_check(const uint8_t *v, size_t len, const kvx_tier_expect *x, void *out_page, float *out_scales)
{
    const kvx_geometry *g = x->g;
    uint32_t B = g->block_tokens;
    if (len < HEAD_BYTES + 4u) return kvx_fail(KVX_EFORMAT, "tier value: %zu bytes, shorter than a header", len);
    if (get_u32(v + len - 4) != kvx_crc32c(0, v, len - 4))
        return kvx_fail(KVX_ECORRUPT, "tier value: CRC-32C mismatch");
    if (memcmp(v, KVX_TIER_MAGIC, 4)) return kvx_fail(KVX_EFORMAT, "tier value: bad magic");
    if (get_u16(v + 4) != KVX_TIER_VALUE_VERSION || get_u16(v + 6))
        return kvx_fail(KVX_EVERSION, "tier value: version %u.%u (this reader reads 1.0)", get_u16(v + 4),
                        get_u16(v + 6));
    if (get_u64(v + 8) != x->ns) return kvx_fail(KVX_EMODEL, "tier value: another namespace");
    if (get_u64(v + 16) != g->model_signature) return kvx_fail(KVX_EMODEL, "tier value: another model signature");
    if (get_u32(v + 24) != B) return kvx_fail(KVX_ESHAPE, "tier value: B %u, not %u", get_u32(v + 24), B);
    size_t tok_end = HEAD_BYTES + (size_t)B * 4u;
    if (tok_end + 4u > len) return kvx_fail(KVX_EFORMAT, "tier value: ends inside its token ids");
    const uint8_t *tok = v + HEAD_BYTES;
    if (x->tokens && memcmp(tok, x->tokens, (size_t)B * 4u))
        return kvx_fail(KVX_ETOKENS, "tier value: its token ids are another block's");
    kvx_envelope env;
    kvx_geometry want = *g;
    /* the value's CRC-32C above covers every envelope byte: its own crc32c
     * would be a second pass over the same bytes */
    int rc = kvx_envelope_parse_nocrc(&env, v + tok_end, len - 4 - tok_end, &want);
    if (rc) return rc;
    if (env.version != kvx_tier_env_version(g))
        return kvx_fail(KVX_EFORMAT, "tier value: envelope v%u, not the store's v%u", env.version,
                        kvx_tier_env_version(g));
    if (env.n_blocks != 1) return kvx_fail(KVX_EFORMAT, "tier value: %u envelope blocks, not 1", env.n_blocks);
    kvx_envelope_block blk;
    if ((rc = kvx_envelope_block_at(&blk, &env, 0))) return rc;
    if (blk.n_tokens != B) return kvx_fail(KVX_ETOKENS, "tier value: a partial block (%u tokens)", blk.n_tokens);
    /* the token ids are unaligned in v: copy them for the hash */
    uint32_t *t = malloc((size_t)B * 4u);
    if (!t) return kvx_fail(-ENOMEM, "tier: out of memory");
    memcpy(t, tok, (size_t)B * 4u);
    uint64_t h = kvx_block_hash(x->parent, t, B);
    free(t);
    if (x->tokens && (h != x->hash || blk.hash != x->hash))
        return kvx_fail(KVX_EHASH, "tier value: block hash %016llx, not the prompt's %016llx",
                        (unsigned long long)blk.hash, (unsigned long long)x->hash);
    if (!x->tokens && blk.hash != h)
        return kvx_fail(KVX_EHASH, "tier value: envelope hash is not H(parent, tokens)");
    if (!out_page) return 0;
    return kvx_envelope_payload_to_page(out_page, kvx_quant_is_fp8(g->quant) ? out_scales : NULL, g, &env, &blk);
}
