/*
 * value.c - tier/value.c, a block's value bytes in the tier (docs/TIER.md
 * "Value bytes"): encoded, then checked against the prompt; every field
 * that differs is refused with its own code; crafted fields with a correct
 * CRC-32C are refused without a read outside the value.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/fake_redis.h"

/* TIER.md "Value bytes": encode, then check against the prompt; every
 * field that differs is refused with its own code. */
/* PROMISE: TIER-4 */
static void test_value_roundtrip_and_refusals(void **state)
{
    (void)state;
    kvx_geometry g = su_geometry();
    uint64_t ns = kvx_tier_ns(&g, NULL);
    uint32_t t[4 * SU_B];
    uint64_t h[4];
    su_tokens(t, 7, 4, 0);
    uint8_t *p = su_pages(t, 4, h, 64);
    uint8_t *v;
    size_t len;
    assert_int_equal(kvx_tier_value_encode(&v, &len, ns, &g, h[2], t + 2 * SU_B, p + 2 * 64, NULL), 0);
    assert_int_equal(len, kvx_tier_value_bytes(&g));
    assert_memory_equal(v, "KVXT", 4);
    uint8_t page[64];
    kvx_tier_expect x = {ns, &g, h[2], h[1], t + 2 * SU_B};
    assert_int_equal(kvx_tier_value_check(v, len, &x, page, NULL), 0);
    assert_memory_equal(page, p + 2 * 64, 64);
    /* another block's tokens (a value under the wrong key) */
    kvx_tier_expect other = {ns, &g, h[1], h[0], t + 1 * SU_B};
    assert_int_equal(kvx_tier_value_check(v, len, &other, page, NULL), KVX_ETOKENS);
    /* right tokens, another parent: the hash differs */
    kvx_tier_expect par = {ns, &g, h[2], h[0], t + 2 * SU_B};
    assert_int_equal(kvx_tier_value_check(v, len, &par, page, NULL), KVX_EHASH);
    /* another namespace (tenant) */
    kvx_tier_expect ten = {kvx_tier_ns(&g, "other"), &g, h[2], h[1], t + 2 * SU_B};
    assert_int_equal(kvx_tier_value_check(v, len, &ten, page, NULL), KVX_EMODEL);
    /* a flipped byte anywhere: the CRC */
    for (size_t i = 0; i < len; i += 7) {
        v[i] ^= 0x10;
        assert_int_not_equal(kvx_tier_value_check(v, len, &x, page, NULL), 0);
        v[i] ^= 0x10;
    }
    /* truncated */
    for (size_t n = 0; n < len; n += 13) assert_int_not_equal(kvx_tier_value_check(v, n, &x, page, NULL), 0);
    free(v);
    /* E4M3 and BF16 stores round-trip exactly (v2, v3) */
    uint32_t quants[] = {KVX_QUANT_E4M3, KVX_QUANT_BF16, KVX_QUANT_E5M2};
    for (int q = 0; q < 3; q++) {
        kvx_geometry g2 = g;
        g2.quant = quants[q];
        uint64_t pb = kvx_page_bytes(&g2, SU_B);
        uint8_t pg[64], back[64];
        float sc[2] = {0.5f, 2.0f}, sc2[2];
        for (size_t i = 0; i < pb; i++) pg[i] = (uint8_t)(i * 3 + 1) & 0x3F; /* finite in every format */
        uint64_t ns2 = kvx_tier_ns(&g2, NULL);
        assert_int_equal(kvx_tier_value_encode(&v, &len, ns2, &g2, h[0], t, pg, g2.quant == KVX_QUANT_E4M3 ? sc : NULL), 0);
        kvx_tier_expect x2 = {ns2, &g2, h[0], 0, t};
        assert_int_equal(kvx_tier_value_check(v, len, &x2, back, sc2), 0);
        assert_memory_equal(back, pg, pb);
        if (g2.quant == KVX_QUANT_E4M3) assert_memory_equal(sc2, sc, sizeof sc);
        free(v);
    }
    free(p);
}

/* hiredis's calloc of a 2^62-element array must fail as glibc's does (NULL),
 * not stop an ASan build */
const char *__asan_default_options(void);

const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

static uint8_t *craft(size_t *len, const kvx_geometry *g, uint64_t ns, uint32_t bfield, const uint32_t *tokens,
                      size_t ntok, const void *env, size_t envlen)
{
    size_t n = 28 + ntok * 4 + envlen + 4;
    uint8_t *v = malloc(n);
    uint16_t ver = 1, zero = 0;
    memcpy(v, "KVXT", 4);
    memcpy(v + 4, &ver, 2);
    memcpy(v + 6, &zero, 2);
    memcpy(v + 8, &ns, 8);
    memcpy(v + 16, &g->model_signature, 8);
    memcpy(v + 24, &bfield, 4);
    memcpy(v + 28, tokens, ntok * 4);
    memcpy(v + 28 + ntok * 4, env, envlen);
    uint32_t crc = kvx_crc32c(0, v, n - 4);
    memcpy(v + n - 4, &crc, 4);
    *len = n;
    return v;
}

static uint8_t *envelope_of(size_t *len, uint16_t ver, const kvx_geometry *g, uint64_t hash, uint32_t ntok,
                            uint32_t nblocks)
{
    size_t pay = kvx_envelope_payload_bytes(ver, g), sz;
    assert_int_equal(kvx_envelope_size(&sz, ver, g, nblocks), 0);
    uint8_t *p = calloc(1, pay);
    for (size_t i = 0; i < pay; i++) p[i] = (uint8_t)(i * 7) & 0x3b;
    float sc[4096];
    for (size_t i = 0; i < 4096; i++) sc[i] = 1.0f;
    kvx_envelope_block_in bi[2] = {{hash, ntok, p, sc}, {hash, ntok, p, sc}};
    uint8_t *e = malloc(sz);
    int rc = kvx_envelope_export(e, sz, ver, g, bi, nblocks);
    free(p);
    if (rc) {
        free(e);
        return NULL;
    }
    *len = sz;
    return e;
}

/* Correct CRC-32C, crafted fields: each refused, no read outside the
 * value (ASan build: the value is malloc'd to its exact length). */
/* PROMISE: TIER-4 */
static void test_values_crafted(void **state)
{
    (void)state;
    kvx_geometry g = su_geometry();
    uint64_t ns = kvx_tier_ns(&g, NULL);
    uint32_t t[2 * SU_B];
    uint64_t h[2];
    su_tokens(t, 9, 2, 0);
    kvx_block_hashes(h, t, 2 * SU_B, SU_B);
    kvx_tier_expect x = {ns, &g, h[1], h[0], t + SU_B};
    uint8_t *page = malloc(64);
    size_t elen, vlen;
    /* the honest one verifies */
    uint8_t *env = envelope_of(&elen, KVX_ENVELOPE_V1, &g, h[1], SU_B, 1);
    assert_non_null(env);
    uint8_t *v = craft(&vlen, &g, ns, SU_B, t + SU_B, SU_B, env, elen);
    assert_int_equal(kvx_tier_value_check(v, vlen, &x, page, NULL), 0);
    /* truncated anywhere, CRC recomputed */
    for (size_t n = 0; n < vlen - 4; n++) {
        uint8_t *c = malloc(n + 4);
        memcpy(c, v, n);
        uint32_t crc = kvx_crc32c(0, c, n);
        memcpy(c + n, &crc, 4);
        assert_int_not_equal(kvx_tier_value_check(c, n + 4, &x, page, NULL), 0);
        free(c);
    }
    /* junk between the envelope and the CRC */
    {
        uint8_t *c = malloc(vlen + 8);
        memcpy(c, v, vlen - 4);
        memset(c + vlen - 4, 0xAB, 8);
        uint32_t crc = kvx_crc32c(0, c, vlen + 4);
        memcpy(c + vlen + 4, &crc, 4);
        assert_int_not_equal(kvx_tier_value_check(c, vlen + 8, &x, page, NULL), 0);
        free(c);
    }
    free(v);
    /* B of 2^32-1 (and of B+1, B-1) in the header */
    uint32_t bs[] = {0xFFFFFFFFu, SU_B + 1, SU_B - 1, 0};
    for (size_t k = 0; k < 4; k++) {
        v = craft(&vlen, &g, ns, bs[k], t + SU_B, SU_B, env, elen);
        assert_int_equal(kvx_tier_value_check(v, vlen, &x, page, NULL), KVX_ESHAPE);
        free(v);
    }
    /* fewer token ids than B, the envelope right after */
    v = craft(&vlen, &g, ns, SU_B, t + SU_B, SU_B - 1, env, elen);
    assert_int_not_equal(kvx_tier_value_check(v, vlen, &x, page, NULL), 0);
    free(v);
    free(env);
    /* a partial block (n_tokens B-1) */
    env = envelope_of(&elen, KVX_ENVELOPE_V1, &g, 0, SU_B - 1, 1);
    assert_non_null(env);
    v = craft(&vlen, &g, ns, SU_B, t + SU_B, SU_B, env, elen);
    assert_int_not_equal(kvx_tier_value_check(v, vlen, &x, page, NULL), 0);
    free(v), free(env);
    /* two blocks */
    env = envelope_of(&elen, KVX_ENVELOPE_V1, &g, h[1], SU_B, 2);
    if (env) {
        v = craft(&vlen, &g, ns, SU_B, t + SU_B, SU_B, env, elen);
        assert_int_not_equal(kvx_tier_value_check(v, vlen, &x, page, NULL), 0);
        free(v), free(env);
    }
    /* the envelope of another geometry (each dimension doubled, B too),
     * of another version (v2, v3) */
    kvx_geometry gs[5];
    for (int k = 0; k < 4; k++) gs[k] = g;
    gs[0].num_layers = 2, gs[1].kv_heads = 2, gs[2].head_dim = 8, gs[3].block_tokens = 2 * SU_B;
    for (int k = 0; k < 4; k++) {
        env = envelope_of(&elen, KVX_ENVELOPE_V1, &gs[k], k == 3 ? 0 : h[1], k == 3 ? SU_B : SU_B, 1);
        if (!env) continue;
        v = craft(&vlen, &g, ns, SU_B, t + SU_B, SU_B, env, elen);
        assert_int_not_equal(kvx_tier_value_check(v, vlen, &x, page, NULL), 0);
        free(v), free(env);
    }
    uint16_t vers[] = {KVX_ENVELOPE_V2, KVX_ENVELOPE_V3};
    for (int k = 0; k < 2; k++) {
        env = envelope_of(&elen, vers[k], &g, h[1], SU_B, 1);
        if (!env) continue;
        v = craft(&vlen, &g, ns, SU_B, t + SU_B, SU_B, env, elen);
        assert_int_not_equal(kvx_tier_value_check(v, vlen, &x, page, NULL), 0);
        free(v), free(env);
    }
    free(page);
    /* an E4M3 store's value (v2): a scale NaN, inf, 0 or negative, the
     * value's CRC right (the envelope's own CRC is not read: the value's
     * covers it) */
    kvx_geometry g8 = g;
    g8.quant = KVX_QUANT_E4M3;
    uint64_t ns8 = kvx_tier_ns(&g8, NULL);
    uint8_t pg[64] = {0};
    for (size_t i = 0; i < sizeof pg; i++) pg[i] = (uint8_t)(i * 3 + 1) & 0x3F;
    float sc[2] = {0.5f, 2.0f}, sc_out[2];
    uint8_t *v8;
    size_t v8len;
    assert_int_equal(kvx_tier_value_encode(&v8, &v8len, ns8, &g8, h[1], t + SU_B, pg, sc), 0);
    kvx_tier_expect x8 = {ns8, &g8, h[1], h[0], t + SU_B};
    uint8_t back[64];
    assert_int_equal(kvx_tier_value_check(v8, v8len, &x8, back, sc_out), 0);
    size_t nsc = 2; /* L * 2 * Hkv */
    size_t at = v8len - 8 - nsc * 4;
    float c0;
    memcpy(&c0, v8 + at, 4);
    assert_true(c0 == sc[0]); /* found the scales */
    float badsc[] = {NAN, INFINITY, 0.0f, -1.0f, -0.0f, 1e-45f * 0.0f};
    for (size_t k = 0; k < sizeof badsc / sizeof badsc[0]; k++) {
        uint8_t *c = malloc(v8len);
        memcpy(c, v8, v8len);
        memcpy(c + at, &badsc[k], 4);
        uint32_t crc = kvx_crc32c(0, c, v8len - 4);
        memcpy(c + v8len - 4, &crc, 4);
        if (!kvx_tier_value_check(c, v8len, &x8, back, sc_out)) fail_msg("scale %g was served", (double)badsc[k]);
        free(c);
    }
    free(v8);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_value_roundtrip_and_refusals),
        cmocka_unit_test(test_values_crafted),
    };
    return cmocka_run_group_tests_name("tier/value", tests, su_setup, su_teardown);
}
