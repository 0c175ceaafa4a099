/*
 * tests/common/error.c - a reason that gets a prefix comes out once, whole
 * (common/error.c: kvx_fail, kvx_fail_prefix).
 *
 * transfer/xfer.c and tier/url.c passed kvx_last_error() as an argument to
 * kvx_fail, which formatted into that same buffer: overlapping vsnprintf,
 * undefined. Clients saw "PushKv: chunk 1: PushKv: chunk 1: 156 differs
 * from ..." and "TIER: url: TIER: url: ort in ...": the prefix twice and
 * the start of the reason lost. These tests compare the whole text, byte
 * for byte, against the reason the callee gives on its own.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lib/store.h"

#include "common/internal.h"
#include "tier/tier.h"

/* PROMISE: XFER-30, TIER-24 */
static void test_fail_with_own_message_as_argument(void **state)
{
    (void)state;
    kvx_fail(KVX_EFORMAT, "the reason: %s", "field x is 156 bytes, over 128");
    char want[600];
    snprintf(want, sizeof want, "outer: %s", kvx_last_error());
    assert_int_equal(kvx_fail(KVX_EINVALID, "outer: %s", kvx_last_error()), KVX_EINVALID);
    assert_string_equal(kvx_last_error(), want);
    assert_int_equal(kvx_fail_prefix(-EIO, "step %d", 2), -EIO);
    assert_string_equal(kvx_last_error(), "step 2: outer: the reason: field x is 156 bytes, over 128");
    kvx_clear_error(); /* a callee that recorded nothing: the prefix alone */
    kvx_fail_prefix(-EIO, "step %d", 3);
    assert_string_equal(kvx_last_error(), "step 3");
}

/* A long reason is cut at the buffer's end, never written past it. */
/* PROMISE: XFER-30, TIER-24 */
static void test_prefix_of_long_reason_is_cut(void **state)
{
    (void)state;
    char big[700];
    memset(big, 'r', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    kvx_fail(KVX_EFORMAT, "%s", big);
    kvx_fail_prefix(KVX_EFORMAT, "p");
    const char *m = kvx_last_error();
    assert_true(strncmp(m, "p: rrrr", 7) == 0);
    assert_int_equal(strlen(m), 511);
}

/* PROMISE: TIER-24 */
static void test_tier_url_error_prefixed_once(void **state)
{
    (void)state;
    static const char *const urls[] = {"redis://h:99999", "redis://h:1/3", "http://h:1", "redis://:1"};
    for (size_t i = 0; i < sizeof urls / sizeof urls[0]; i++) {
        kvx_tier_url u;
        assert_int_not_equal(kvx_tier_url_parse(&u, urls[i]), 0);
        char want[600];
        snprintf(want, sizeof want, "TIER: url: %s", kvx_last_error());
        char conf[256];
        snprintf(conf, sizeof conf, "kvx-tier 1\nurl %s\n", urls[i]);
        kvx_tier_conf c;
        assert_int_equal(kvx_tier_conf_parse(&c, conf), KVX_EFORMAT);
        assert_string_equal(kvx_last_error(), want);
    }
}

/* A chunk whose envelope is of another shape (head_dim 8): the stream's
 * DATA_LOSS text is "PushKv: chunk <i>: " and the envelope parser's own
 * reason, once. */
/* PROMISE: XFER-30 */
static void test_push_chunk_error_prefixed_once(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){0});
    uint32_t t[SU_B];
    su_tokens(t, 7, 1, 0);
    kvx_geometry g = su_geometry();
    g.head_dim = 8;
    size_t len = 0, pb = kvx_envelope_payload_bytes(1, &g);
    uint8_t *payload = calloc(1, pb);
    assert_non_null(payload);
    kvx_envelope_block_in in = {kvx_block_hash(0, t, SU_B), SU_B, payload, NULL};
    assert_int_equal(kvx_envelope_size(&len, 1, &g, 1), 0);
    uint8_t *env = malloc(len);
    assert_non_null(env);
    assert_int_equal(kvx_envelope_export(env, len, 1, &g, &in, 1), 0);

    /* the parser's own reason for this payload, against the store's shape */
    kvx_geometry expect = su_geometry();
    kvx_envelope e;
    int prc = kvx_envelope_parse(&e, env, len, &expect);
    assert_int_not_equal(prc, 0);
    char want[600];
    snprintf(want, sizeof want, "PushKv: chunk 0: %s", kvx_last_error());

    kvx_xfer_stream *st;
    assert_int_equal(kvx_xfer_stream_create(&st, s), 0);
    kvx_xfer_chunk c = {0};
    c.kv_format = 1;
    c.block_hash = in.hash;
    c.payload = env;
    c.payload_len = len;
    c.crc32c = kvx_crc32c(0, env, len);
    c.tokens = t;
    c.n_tokens = SU_B;
    c.model_signature = expect.model_signature;
    kvx_xfer_block b;
    int rc = kvx_xfer_stream_chunk(st, &c, &b);
    assert_int_equal(rc, prc);
    assert_int_equal(kvx_xfer_grpc_code(rc), KVX_GRPC_DATA_LOSS);
    assert_string_equal(kvx_last_error(), want);
    kvx_xfer_stream_destroy(st);
    free(env);
    free(payload);
    kvx_store_close(s);
    su_rm_rf(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fail_with_own_message_as_argument),
        cmocka_unit_test(test_prefix_of_long_reason_is_cut),
        cmocka_unit_test(test_tier_url_error_prefixed_once),
        cmocka_unit_test(test_push_chunk_error_prefixed_once),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
