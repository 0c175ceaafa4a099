/*
 * test_transfer.c - the tl.kv.v1 transfer core (transfer/xfer.c, kvx.h
 * "tl.kv.v1 transfer core"): a sender store exports one-block envelopes,
 * a receiver store takes them through kvx_xfer_stream_*, exactly as the
 * gRPC service does. Every rejected stream is checked to have published
 * nothing (prefix on the receiver, then again after a reopen).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <pthread.h>

#include "lib/store.h"
#include "lib/xfer.h"

static void test_grpc_codes(void **state)
{
    (void)state;
    assert_int_equal(kvx_xfer_grpc_code(0), KVX_GRPC_OK);
    assert_int_equal(kvx_xfer_grpc_code(KVX_EVERSION), KVX_GRPC_FAILED_PRECONDITION);
    assert_int_equal(kvx_xfer_grpc_code(KVX_EMODEL), KVX_GRPC_FAILED_PRECONDITION);
    assert_int_equal(kvx_xfer_grpc_code(KVX_ENOTHELD), KVX_GRPC_ABORTED);
    assert_int_equal(kvx_xfer_grpc_code(KVX_EINVALID), KVX_GRPC_INVALID_ARGUMENT);
    int data_loss[] = {KVX_EFORMAT, KVX_ESHAPE, KVX_ECORRUPT, KVX_EMAGIC, KVX_ETRUNC, KVX_EHASH, KVX_ETOKENS};
    for (size_t i = 0; i < sizeof data_loss / sizeof *data_loss; i++)
        assert_int_equal(kvx_xfer_grpc_code(data_loss[i]), KVX_GRPC_DATA_LOSS);
    assert_int_equal(kvx_xfer_grpc_code(KVX_ECAPACITY), KVX_GRPC_RESOURCE_EXHAUSTED);
    assert_int_equal(kvx_xfer_grpc_code(-ENOSPC), KVX_GRPC_RESOURCE_EXHAUSTED);
    assert_int_equal(kvx_xfer_grpc_code(-EIO), KVX_GRPC_INTERNAL);
    assert_string_equal(kvx_err_name(KVX_ENOTHELD), "KVX_ENOTHELD");
}

static void test_pick_format(void **state)
{
    (void)state;
    kvx_geometry g = {2, 8, 128, 16, KVX_QUANT_FP16, 0};
    uint16_t v = 0;
    assert_int_equal(kvx_xfer_pick_format(&v, &g, 0), 0);
    assert_int_equal(v, 1);
    g.quant = KVX_QUANT_E5M2; /* a subset of f16: v1 is lossless */
    assert_int_equal(kvx_xfer_pick_format(&v, &g, 0), 0);
    assert_int_equal(v, 1);
    g.quant = KVX_QUANT_E4M3;
    assert_int_equal(kvx_xfer_pick_format(&v, &g, 0), 0);
    assert_int_equal(v, 2);
    /* bf16, 2 MiB pages (issue 16's large size): v3 fits 4 MiB */
    kvx_geometry big = {32, 8, 128, 16, KVX_QUANT_BF16, 0};
    assert_int_equal(kvx_xfer_pick_format(&v, &big, 0), 0);
    assert_int_equal(v, 3);
    /* twice the layers: v3 is 4 MiB + header, over the limit: v2 */
    big.num_layers = 64;
    assert_int_equal(kvx_xfer_pick_format(&v, &big, 0), 0);
    assert_int_equal(v, 2);
    assert_int_equal(kvx_xfer_pick_format(&v, &big, 3), KVX_ECAPACITY);
    assert_non_null(strstr(kvx_last_error(), "chunk limit"));
    assert_int_equal(v, 0);
    assert_int_equal(kvx_xfer_pick_format(&v, &big, 1), KVX_ECAPACITY);
    assert_int_equal(kvx_xfer_pick_format(&v, &g, 4), KVX_EVERSION);
    g.quant = 9;
    assert_int_equal(kvx_xfer_pick_format(&v, &g, 0), KVX_EQUANT);
}

/* A whole prompt moves, then moves again as references only. */
static void test_push_then_dedup(void **state)
{
    (void)state;
    char da[256], db[256];
    kvx_store *a = su_store(da, sizeof da, (su_spec){0}), *b = su_store(db, sizeof db, (su_spec){0});
    const size_t nb = 5, tail = 3;
    uint32_t *t = prompt(a, 1, nb, nb);
    kvx_xfer_result r;
    assert_int_equal(xf_push(b, a, t, nb, tail, NULL, &r), 0);
    kvx_geometry g = su_geometry();
    size_t env1 = 0;
    assert_int_equal(kvx_envelope_size(&env1, 1, &g, 1), 0);
    assert_int_equal(r.blocks_stored, nb);
    assert_int_equal(r.blocks_referenced, 0);
    assert_int_equal(r.bytes_received, (nb + 1) * env1);
    assert_int_equal(r.tail_tokens, tail);
    assert_int_equal(r.durable, 1);
    assert_int_equal(served(b, t, nb), nb);
    /* the pages are the sender's, byte for byte */
    kvx_view va[8], vb[8];
    size_t na = 0, nbv = 0;
    assert_int_equal(kvx_store_prefix(va, &na, a, t, nb * SU_B, 8), 0);
    assert_int_equal(kvx_store_prefix(vb, &nbv, b, t, nb * SU_B, 8), 0);
    for (size_t i = 0; i < nb; i++) assert_memory_equal(va[i].page, vb[i].page, va[i].page_bytes);
    kvx_views_release(va, na);
    kvx_views_release(vb, nbv);

    /* HasBlocks with tokens: all held; the second push sends only the tail */
    uint64_t h[8];
    kvx_block_hashes(h, t, nb * SU_B, SU_B);
    uint8_t held[8];
    kvx_xfer_lease *lease = NULL;
    assert_int_equal(kvx_xfer_has_blocks(held, &lease, b, h, nb, t, nb * SU_B + tail, SU_B, g.model_signature), 0);
    for (size_t i = 0; i < nb; i++) assert_int_equal(held[i], 1);
    uint8_t empty[8] = {1, 1, 1, 1, 1};
    assert_int_equal(xf_push(b, a, t, nb, tail, empty, &r), 0);
    kvx_xfer_lease_destroy(lease);
    assert_int_equal(r.blocks_stored, 0);
    assert_int_equal(r.blocks_referenced, nb);
    assert_int_equal(r.bytes_received, env1); /* (0 missing + 1 tail) x envelope */

    /* a longer prompt sharing the prefix: only the new blocks move */
    uint32_t *t2 = calloc(9 * SU_B, sizeof *t2);
    memcpy(t2, t, nb * SU_B * sizeof *t2);
    for (size_t j = nb * SU_B; j < 9 * SU_B; j++) t2[j] = (uint32_t)(7000 + j);
    size_t added = 0;
    uint64_t h2[9];
    uint8_t *pages = su_pages(t2, 8, h2, kvx_page_bytes(&g, SU_B));
    assert_int_equal(kvx_store_put(a, t2, 8 * SU_B, pages, 8, NULL, &added), 0);
    assert_int_equal(kvx_store_flush(a), 0);
    free(pages);
    assert_int_equal(kvx_xfer_has_blocks(held, NULL, b, h2, 8, t2, 8 * SU_B, 0, 0), 0);
    for (size_t i = 0; i < 8; i++) assert_int_equal(held[i], i < nb);
    assert_int_equal(xf_push(b, a, t2, 8, 0, held, &r), 0);
    assert_int_equal(r.blocks_stored, 3);
    assert_int_equal(r.blocks_referenced, nb);
    assert_int_equal(r.bytes_received, 3 * env1);
    assert_int_equal(r.tail_tokens, 0);
    assert_int_equal(served(b, t2, 8), 8);
    free(t2);
    free(t);
    kvx_store_close(a);
    kvx_store_close(b);
}

/* One rejected chunk in the middle of a stream: the code, and nothing of
 * the stream published, even the good blocks before it. */
typedef void (*damage_fn)(chunk_buf *cb, kvx_store *sender, const uint32_t *t);

static void expect_rejected(damage_fn damage, int want_rc, int want_grpc, const char *want_msg)
{
    char da[256], db[256];
    kvx_store *a = su_store(da, sizeof da, (su_spec){0}), *b = su_store(db, sizeof db, (su_spec){0});
    const size_t nb = 4;
    uint32_t *t = prompt(a, 2, nb, nb);
    kvx_xfer_stream *st = NULL;
    assert_int_equal(kvx_xfer_stream_create(&st, b), 0);
    chunk_buf cb;
    for (size_t i = 0; i < 2; i++) {
        xf_chunk(&cb, a, t, nb, 2, i, 1, 0);
        assert_int_equal(kvx_xfer_stream_chunk(st, &cb.c, NULL), 0);
        kvx_free(cb.env);
    }
    xf_chunk(&cb, a, t, nb, 2, 2, 1, 0);
    damage(&cb, a, t);
    int rc = kvx_xfer_stream_chunk(st, &cb.c, NULL);
    assert_int_equal(rc, want_rc);
    assert_int_equal(kvx_xfer_grpc_code(rc), want_grpc);
    if (want_msg) assert_non_null(strstr(kvx_last_error(), want_msg));
    kvx_free(cb.env);
    /* the stream stays failed; finish publishes nothing */
    xf_chunk(&cb, a, t, nb, 2, 3, 1, 0);
    assert_int_equal(kvx_xfer_stream_chunk(st, &cb.c, NULL), want_rc);
    kvx_free(cb.env);
    kvx_xfer_result r;
    assert_int_equal(kvx_xfer_stream_finish(st, &r), want_rc);
    assert_int_equal(r.durable, 0);
    kvx_xfer_stream_destroy(st);
    assert_int_equal(served(b, t, nb), 0);
    kvx_store_stats stats;
    assert_int_equal(kvx_store_stat(&stats, b), 0);
    assert_int_equal(stats.blocks, 0);
    kvx_store_close(b);
    assert_int_equal(kvx_store_open(&b, db, NULL, 0), 0);
    assert_int_equal(served(b, t, nb), 0);
    assert_int_equal(kvx_store_stat(&stats, b), 0);
    assert_int_equal(stats.blocks, 0);
    kvx_store_close(b);
    kvx_store_close(a);
    free(t);
}

static void dmg_format0(chunk_buf *cb, kvx_store *a, const uint32_t *t)
{
    (void)a, (void)t;
    cb->c.kv_format = 0;
}
static void dmg_format9(chunk_buf *cb, kvx_store *a, const uint32_t *t)
{
    (void)a, (void)t;
    cb->c.kv_format = 9;
    cb->c.payload_len = 3; /* not even looked at */
}
static void dmg_model(chunk_buf *cb, kvx_store *a, const uint32_t *t)
{
    (void)a, (void)t;
    cb->c.model_signature = 0xdeadbeefull;
}
static void dmg_crc(chunk_buf *cb, kvx_store *a, const uint32_t *t)
{
    (void)a, (void)t;
    cb->c.crc32c ^= 1;
}
static void dmg_payload_bit(chunk_buf *cb, kvx_store *a, const uint32_t *t)
{
    (void)a, (void)t;
    ((uint8_t *)cb->env)[40] ^= 0x10; /* the envelope's own CRC catches it; chunk crc recomputed */
    cb->c.crc32c = kvx_crc32c(0, cb->env, cb->c.payload_len);
}
static void dmg_oversize(chunk_buf *cb, kvx_store *a, const uint32_t *t)
{
    (void)a, (void)t;
    size_t n = KVX_XFER_MAX_PAYLOAD + 1;
    void *big = calloc(1, n);
    memcpy(big, cb->env, cb->c.payload_len);
    kvx_free(cb->env);
    cb->env = big; /* freed with kvx_free below: same allocator (free) */
    cb->c.payload = big;
    cb->c.payload_len = n;
    cb->c.crc32c = kvx_crc32c(0, big, n);
}
static void dmg_two_blocks(chunk_buf *cb, kvx_store *a, const uint32_t *t)
{
    kvx_free(cb->env);
    kvx_view views[4];
    size_t n = 0, len = 0;
    assert_int_equal(kvx_store_prefix(views, &n, a, t, 4 * SU_B, 4), 0);
    assert_int_equal(kvx_views_export(&cb->env, &len, a, &views[2], 2, 1), 0);
    kvx_views_release(views, n);
    cb->c.payload = cb->env;
    cb->c.payload_len = len;
    cb->c.crc32c = kvx_crc32c(0, cb->env, len);
}
static void dmg_env_hash(chunk_buf *cb, kvx_store *a, const uint32_t *t)
{
    /* block 3's envelope sent as block 2: a valid envelope, the wrong block */
    kvx_free(cb->env);
    kvx_view views[4];
    size_t n = 0, len = 0;
    assert_int_equal(kvx_store_prefix(views, &n, a, t, 4 * SU_B, 4), 0);
    assert_int_equal(kvx_views_export(&cb->env, &len, a, &views[3], 1, 1), 0);
    kvx_views_release(views, n);
    cb->c.payload = cb->env;
    cb->c.payload_len = len;
    cb->c.crc32c = kvx_crc32c(0, cb->env, len);
}
static uint32_t bad_tokens[SU_B];
static void dmg_tokens(chunk_buf *cb, kvx_store *a, const uint32_t *t)
{
    (void)a, (void)t;
    memcpy(bad_tokens, cb->c.tokens, sizeof bad_tokens);
    bad_tokens[1] ^= 1;
    cb->c.tokens = bad_tokens;
}
static void dmg_no_tokens(chunk_buf *cb, kvx_store *a, const uint32_t *t)
{
    (void)a, (void)t;
    cb->c.n_tokens = 0;
}
static void dmg_version_differs(chunk_buf *cb, kvx_store *a, const uint32_t *t)
{
    (void)a, (void)t;
    cb->c.kv_format = 2; /* the payload is v1 */
}
static void dmg_empty_not_held(chunk_buf *cb, kvx_store *a, const uint32_t *t)
{
    (void)a, (void)t;
    cb->c.payload = NULL;
    cb->c.payload_len = 0;
}
static void dmg_shape(chunk_buf *cb, kvx_store *a, const uint32_t *t)
{
    (void)a;
    /* the same block from an engine with head_dim 8: valid, other shape */
    kvx_free(cb->env);
    kvx_geometry g = su_geometry();
    g.head_dim = 8;
    size_t len = 0, pb = kvx_envelope_payload_bytes(1, &g);
    uint8_t *payload = calloc(1, pb);
    kvx_envelope_block_in in = {cb->c.block_hash, SU_B, payload, NULL};
    assert_int_equal(kvx_envelope_size(&len, 1, &g, 1), 0);
    cb->env = malloc(len);
    assert_int_equal(kvx_envelope_export(cb->env, len, 1, &g, &in, 1), 0);
    free(payload);
    (void)t;
    cb->c.payload = cb->env;
    cb->c.payload_len = len;
    cb->c.crc32c = kvx_crc32c(0, cb->env, len);
}

static void test_rejects_format(void **s)
{
    (void)s;
    expect_rejected(dmg_format0, KVX_EVERSION, KVX_GRPC_FAILED_PRECONDITION, "kv_format 0");
    expect_rejected(dmg_format9, KVX_EVERSION, KVX_GRPC_FAILED_PRECONDITION, "kv_format 9");
    expect_rejected(dmg_model, KVX_EMODEL, KVX_GRPC_FAILED_PRECONDITION, "model_signature");
}

static void test_rejects_data_loss(void **s)
{
    (void)s;
    expect_rejected(dmg_crc, KVX_ECORRUPT, KVX_GRPC_DATA_LOSS, "crc32c");
    expect_rejected(dmg_payload_bit, KVX_EFORMAT, KVX_GRPC_DATA_LOSS, "chunk 2");
    expect_rejected(dmg_oversize, KVX_EFORMAT, KVX_GRPC_DATA_LOSS, "limit");
    expect_rejected(dmg_two_blocks, KVX_EFORMAT, KVX_GRPC_DATA_LOSS, "exactly 1");
    expect_rejected(dmg_env_hash, KVX_EHASH, KVX_GRPC_DATA_LOSS, "envelope block_hash");
    expect_rejected(dmg_tokens, KVX_EHASH, KVX_GRPC_DATA_LOSS, "hash of its tokens");
    expect_rejected(dmg_no_tokens, KVX_ETOKENS, KVX_GRPC_DATA_LOSS, "token ids");
    expect_rejected(dmg_version_differs, KVX_EFORMAT, KVX_GRPC_DATA_LOSS, "not kv_format 2");
    expect_rejected(dmg_shape, KVX_ESHAPE, KVX_GRPC_DATA_LOSS, "chunk 2");
}

static void test_rejects_not_held(void **s)
{
    (void)s;
    expect_rejected(dmg_empty_not_held, KVX_ENOTHELD, KVX_GRPC_ABORTED, "not held here");
}

/* The tail comes last, and is never stored or referenced. */
static void test_tail_rules(void **state)
{
    (void)state;
    char da[256], db[256];
    kvx_store *a = su_store(da, sizeof da, (su_spec){0}), *b = su_store(db, sizeof db, (su_spec){0});
    uint32_t *t = prompt(a, 3, 2, 2);
    kvx_xfer_stream *st = NULL;
    chunk_buf cb;
    /* a tail with a hash */
    assert_int_equal(kvx_xfer_stream_create(&st, b), 0);
    xf_chunk(&cb, a, t, 0, 1, 0, 1, 0); /* the tail as chunk 0 */
    cb.c.block_hash = 5;
    assert_int_equal(kvx_xfer_stream_chunk(st, &cb.c, NULL), KVX_EHASH);
    kvx_free(cb.env);
    kvx_xfer_stream_destroy(st);
    /* a chunk after the tail */
    assert_int_equal(kvx_xfer_stream_create(&st, b), 0);
    xf_chunk(&cb, a, t, 0, 1, 0, 1, 0);
    kvx_xfer_block blk;
    assert_int_equal(kvx_xfer_stream_chunk(st, &cb.c, &blk), 0);
    assert_int_equal(blk.tail, 1);
    assert_int_equal(blk.stored, 0);
    assert_int_equal(kvx_xfer_stream_chunk(st, &cb.c, NULL), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "follows the partial tail"));
    assert_int_equal(kvx_xfer_grpc_code(KVX_EINVALID), KVX_GRPC_INVALID_ARGUMENT);
    kvx_free(cb.env);
    kvx_xfer_stream_destroy(st);
    /* an empty tail: never held */
    assert_int_equal(kvx_xfer_stream_create(&st, b), 0);
    xf_chunk(&cb, a, t, 0, 1, 0, 1, 1);
    assert_int_equal(kvx_xfer_stream_chunk(st, &cb.c, NULL), KVX_ENOTHELD);
    kvx_xfer_stream_destroy(st);
    /* a stream that is only a tail: nothing stored, durable, tail_tokens */
    assert_int_equal(kvx_xfer_stream_create(&st, b), 0);
    xf_chunk(&cb, a, t, 0, 3, 0, 1, 0);
    assert_int_equal(kvx_xfer_stream_chunk(st, &cb.c, NULL), 0);
    kvx_free(cb.env);
    kvx_xfer_result r;
    assert_int_equal(kvx_xfer_stream_finish(st, &r), 0);
    assert_int_equal(r.tail_tokens, 3);
    assert_int_equal(r.blocks_stored, 0);
    assert_int_equal(r.durable, 1);
    assert_int_equal(kvx_xfer_stream_finish(st, &r), KVX_EINVALID);
    kvx_xfer_stream_destroy(st);
    kvx_store_stats stats;
    assert_int_equal(kvx_store_stat(&stats, b), 0);
    assert_int_equal(stats.blocks, 0);
    free(t);
    kvx_store_close(a);
    kvx_store_close(b);
}

static void test_has_blocks_args(void **state)
{
    (void)state;
    char da[256];
    kvx_store *a = su_store(da, sizeof da, (su_spec){0});
    uint32_t *t = prompt(a, 4, 3, 2);
    uint64_t h[3];
    kvx_block_hashes(h, t, 3 * SU_B, SU_B);
    uint8_t held[3] = {9, 9, 9};
    kvx_xfer_lease *l = (kvx_xfer_lease *)1;
    assert_int_equal(kvx_xfer_has_blocks(held, &l, a, h, 3, t, 3 * SU_B, SU_B, 0), 0);
    assert_int_equal(held[0], 1);
    assert_int_equal(held[1], 1);
    assert_int_equal(held[2], 0);
    kvx_xfer_lease_destroy(l);
    /* hashes not the chain of the tokens */
    h[1] ^= 1;
    l = (kvx_xfer_lease *)1;
    assert_int_equal(kvx_xfer_has_blocks(held, &l, a, h, 3, t, 3 * SU_B, SU_B, 0), KVX_EINVALID);
    assert_null(l);
    assert_non_null(strstr(kvx_last_error(), "block_hashes[1]"));
    h[1] ^= 1;
    assert_int_equal(kvx_xfer_has_blocks(held, NULL, a, h, 3, t, 3 * SU_B - 1, SU_B, 0), KVX_EINVALID);
    assert_int_equal(kvx_xfer_has_blocks(held, NULL, a, h, 3, t, 3 * SU_B, 8, 0), KVX_EINVALID);
    assert_int_equal(kvx_xfer_has_blocks(held, NULL, a, h, 3, t, 3 * SU_B, SU_B, 77), KVX_EMODEL);
    assert_int_equal(kvx_xfer_grpc_code(KVX_EMODEL), KVX_GRPC_FAILED_PRECONDITION);
    /* without tokens: held by hash, for verified blocks only */
    assert_int_equal(kvx_xfer_has_blocks(held, NULL, a, h, 3, NULL, 0, 0, 0), 0);
    assert_int_equal(held[0] + held[1] + held[2], 2);
    /* unverified (put without tokens) is never "held" */
    char dc[256];
    kvx_store *c = su_store(dc, sizeof dc, (su_spec){0});
    chunk_buf cb;
    xf_chunk(&cb, a, t, 2, 0, 0, 1, 0);
    assert_int_equal(kvx_store_put_envelope(c, cb.env, cb.c.payload_len, NULL, 0, NULL), 0);
    assert_int_equal(kvx_store_flush(c), 0);
    kvx_free(cb.env);
    assert_int_equal(kvx_xfer_has_blocks(held, NULL, c, h, 1, NULL, 0, 0, 0), 0);
    assert_int_equal(held[0], 0);
    /* a reader handle answers HasBlocks but takes no lease */
    kvx_store_close(a);
    assert_int_equal(kvx_store_open(&a, da, NULL, KVX_STORE_READONLY), 0);
    assert_int_equal(kvx_xfer_has_blocks(held, NULL, a, h, 3, t, 3 * SU_B, 0, 0), 0);
    assert_int_equal(held[0] + held[1] + held[2], 2);
    assert_int_equal(kvx_xfer_has_blocks(held, &l, a, h, 3, t, 3 * SU_B, 0, 0), KVX_EINVALID);
    free(t);
    kvx_store_close(a);
    kvx_store_close(c);
}

/* A crafted FNV collision: HasBlocks without tokens says "held" for the
 * hash, but the push's tokens are the other prompt's: the receiver must
 * not reference the block it holds (ABORTED), and with a payload it stores
 * the new block beside the old one, each served to its own prompt. */
static void test_collision_never_referenced(void **state)
{
    (void)state;
    char da[256], db[256];
    kvx_store *a = su_store(da, sizeof da, (su_spec){0}), *b = su_store(db, sizeof db, (su_spec){0});
    assert_int_equal(kvx_block_hash(0, COLL_A, SU_B), kvx_block_hash(0, COLL_B, SU_B));
    kvx_geometry g = su_geometry();
    size_t pb = kvx_page_bytes(&g, SU_B);
    uint64_t ha[1], hb[1];
    uint8_t *pa = su_pages(COLL_A, 1, ha, pb), *pbb = su_pages(COLL_B, 1, hb, pb);
    memset(pbb, 0x11, pb); /* B's page differs from A's */
    assert_int_equal(kvx_store_put(b, COLL_A, SU_B, pa, 1, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(b), 0);
    assert_int_equal(kvx_store_put(a, COLL_B, SU_B, pbb, 1, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(a), 0);
    uint8_t held = 0;
    kvx_xfer_lease *l = NULL;
    assert_int_equal(kvx_xfer_has_blocks(&held, &l, b, hb, 1, NULL, 0, 0, 0), 0);
    assert_int_equal(held, 1); /* by hash alone */
    kvx_xfer_stream *st;
    assert_int_equal(kvx_xfer_stream_create(&st, b), 0);
    chunk_buf cb;
    xf_chunk(&cb, a, COLL_B, 1, 0, 0, 1, 1);
    assert_int_equal(kvx_xfer_stream_chunk(st, &cb.c, NULL), KVX_ENOTHELD);
    kvx_xfer_stream_destroy(st);
    /* resent with its payload: stored beside A's, each prompt gets its own */
    uint8_t empty = 0;
    kvx_xfer_result r;
    assert_int_equal(xf_push(b, a, COLL_B, 1, 0, &empty, &r), 0);
    kvx_xfer_lease_destroy(l);
    assert_int_equal(r.blocks_stored, 1);
    kvx_view v;
    assert_int_equal(kvx_store_get_block(&v, b, COLL_B, SU_B), 0);
    assert_memory_equal(v.page, pbb, pb);
    kvx_view_release(&v);
    assert_int_equal(kvx_store_get_block(&v, b, COLL_A, SU_B), 0);
    assert_memory_equal(v.page, pa, pb);
    kvx_view_release(&v);
    free(pa);
    free(pbb);
    kvx_store_close(a);
    kvx_store_close(b);
}

/* A lease keeps what HasBlocks reported held through eviction; without it
 * eviction may take it, and the push then gets ABORTED, never a wrong or
 * missing block silently. */
static void test_lease_pins_through_eviction(void **state)
{
    (void)state;
    for (int with_lease = 1; with_lease >= 0; with_lease--) {
        char da[256], db[256];
        kvx_store *a = su_store(da, sizeof da, (su_spec){0});
        /* small capacity and shards: a few prompts later the first one's
         * shard is the LRU victim */
        kvx_store *b = su_store(db, sizeof db, (su_spec){.capacity = 1 << 20});
        kvx_store_stats st0;
        assert_int_equal(kvx_store_stat(&st0, b), 0);
        const size_t nb = 8;
        uint32_t *t = prompt(a, 5, nb, nb);
        kvx_xfer_result r;
        assert_int_equal(xf_push(b, a, t, nb, 0, NULL, &r), 0);
        uint64_t h[8];
        kvx_block_hashes(h, t, nb * SU_B, SU_B);
        uint8_t held[8];
        kvx_xfer_lease *l = NULL;
        assert_int_equal(kvx_xfer_has_blocks(held, with_lease ? &l : NULL, b, h, nb, t, nb * SU_B, 0, 0), 0);
        for (size_t i = 0; i < nb; i++) assert_int_equal(held[i], 1);
        /* other prompts fill the store several times over */
        for (uint64_t seq = 100; seq < 100 + 64; seq++) {
            uint32_t *o = prompt(b, seq, 8, 8);
            free(o);
        }
        assert_int_equal(kvx_store_gc(b), 0);
        kvx_store_stats st1;
        assert_int_equal(kvx_store_stat(&st1, b), 0);
        assert_true(st1.evictions > 0);
        uint8_t empty[8];
        memset(empty, 1, sizeof empty);
        int rc = xf_push(b, a, t, nb, 0, empty, &r);
        if (with_lease) {
            assert_int_equal(rc, 0);
            assert_int_equal(r.blocks_referenced, nb);
            assert_int_equal(served(b, t, nb), nb);
        } else {
            assert_int_equal(rc, KVX_ENOTHELD);
        }
        kvx_xfer_lease_destroy(l);
        free(t);
        kvx_store_close(a);
        kvx_store_close(b);
    }
}

/* Two streams at once: one fails, the other's blocks are published. */
static void test_streams_independent(void **state)
{
    (void)state;
    char da[256], db[256];
    kvx_store *a = su_store(da, sizeof da, (su_spec){0}), *b = su_store(db, sizeof db, (su_spec){0});
    uint32_t *t1 = prompt(a, 6, 4, 4), *t2 = prompt(a, 7, 4, 4);
    kvx_xfer_stream *s1, *s2;
    assert_int_equal(kvx_xfer_stream_create(&s1, b), 0);
    assert_int_equal(kvx_xfer_stream_create(&s2, b), 0);
    for (size_t i = 0; i < 4; i++) {
        chunk_buf c1, c2;
        xf_chunk(&c1, a, t1, 4, 0, i, 1, 0);
        xf_chunk(&c2, a, t2, 4, 0, i, 1, 0);
        if (i == 3) c2.c.crc32c ^= 0xff;
        assert_int_equal(kvx_xfer_stream_chunk(s1, &c1.c, NULL), 0);
        assert_int_equal(kvx_xfer_stream_chunk(s2, &c2.c, NULL), i == 3 ? KVX_ECORRUPT : 0);
        kvx_free(c1.env);
        kvx_free(c2.env);
    }
    kvx_xfer_result r;
    assert_int_equal(kvx_xfer_stream_finish(s1, &r), 0);
    assert_int_equal(r.blocks_stored, 4);
    kvx_xfer_stream_destroy(s1);
    kvx_xfer_stream_destroy(s2);
    assert_int_equal(served(b, t1, 4), 4);
    assert_int_equal(served(b, t2, 4), 0);
    /* an abandoned stream (no finish: a sender cut midway) publishes nothing */
    assert_int_equal(kvx_xfer_stream_create(&s2, b), 0);
    for (size_t i = 0; i < 3; i++) {
        chunk_buf c2;
        xf_chunk(&c2, a, t2, 4, 0, i, 1, 0);
        assert_int_equal(kvx_xfer_stream_chunk(s2, &c2.c, NULL), 0);
        kvx_free(c2.env);
    }
    kvx_xfer_stream_destroy(s2);
    assert_int_equal(served(b, t2, 4), 0);
    kvx_store_close(b);
    assert_int_equal(kvx_store_open(&b, db, NULL, 0), 0);
    assert_int_equal(served(b, t1, 4), 4);
    assert_int_equal(served(b, t2, 4), 0);
    free(t1);
    free(t2);
    kvx_store_close(a);
    kvx_store_close(b);
}

/* BF16: v3 carries it losslessly; v2 into a bf16 store is accepted (a
 * lossy sender's choice), v1 refused at the sender when a value is not
 * exact in f16. */
static void test_bf16_formats(void **state)
{
    (void)state;
    char da[256], db[256];
    kvx_store *a = su_store(da, sizeof da, (su_spec){.quant = KVX_QUANT_BF16});
    kvx_store *b = su_store(db, sizeof db, (su_spec){.quant = KVX_QUANT_BF16});
    kvx_geometry g;
    kvx_store_get_geometry(&g, a);
    uint16_t v = 0;
    assert_int_equal(kvx_xfer_pick_format(&v, &g, 0), 0);
    assert_int_equal(v, 3);
    uint32_t t[2 * SU_B];
    su_tokens(t, 8, 2, 0);
    size_t pb = kvx_page_bytes(&g, SU_B);
    uint16_t *pages = malloc(2 * pb);
    for (size_t i = 0; i < pb; i++) pages[i] = kvx_f32_to_bf16((float)(i + 1) * 1.0e6f); /* over f16's 65504 */
    assert_int_equal(kvx_store_put(a, t, 2 * SU_B, pages, 2, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(a), 0);
    kvx_view views[2];
    size_t n = 0;
    assert_int_equal(kvx_store_prefix(views, &n, a, t, 2 * SU_B, 2), 0);
    assert_int_equal(n, 2);
    void *env = NULL;
    size_t len = 0;
    assert_int_equal(kvx_views_export(&env, &len, a, &views[0], 1, 1), KVX_ELOSSY);
    kvx_xfer_stream *st;
    assert_int_equal(kvx_xfer_stream_create(&st, b), 0);
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(kvx_views_export(&env, &len, a, &views[i], 1, 3), 0);
        kvx_xfer_chunk c = {3, views[i].hash, env, len, kvx_crc32c(0, env, len), t + i * SU_B, SU_B, 0};
        assert_int_equal(kvx_xfer_stream_chunk(st, &c, NULL), 0);
        kvx_free(env);
    }
    kvx_xfer_result r;
    assert_int_equal(kvx_xfer_stream_finish(st, &r), 0);
    kvx_xfer_stream_destroy(st);
    kvx_view vb[2];
    size_t nbv = 0;
    assert_int_equal(kvx_store_prefix(vb, &nbv, b, t, 2 * SU_B, 2), 0);
    assert_int_equal(nbv, 2);
    for (size_t i = 0; i < 2; i++) assert_memory_equal(vb[i].page, views[i].page, pb);
    kvx_views_release(vb, nbv);
    kvx_views_release(views, n);
    free(pages);
    kvx_store_close(a);
    kvx_store_close(b);
}

/* 32 streams at once into one receiver, prompts sharing prefixes (four
 * families, as su_tokens makes them), several rounds: every push is
 * acknowledged and every prompt is then served whole. Shard ids are a
 * finite resource (256): many small flushes must not run them out. */
#define PUSHERS 32
#define ROUNDS 4
typedef struct pusher_arg {
    kvx_store *recv, *sender;
    uint64_t seq;
    int rc;
    uint32_t stored, referenced;
} pusher_arg;

static pthread_barrier_t pushers_start;

static void *pusher(void *p)
{
    pusher_arg *a = p;
    pthread_barrier_wait(&pushers_start); /* all at once: shared blocks race */
    uint32_t t[8 * SU_B];
    su_tokens(t, a->seq, 8, 4); /* blocks 0..3 shared within a family */
    uint64_t h[8];
    kvx_block_hashes(h, t, 8 * SU_B, SU_B);
    uint8_t held[8];
    kvx_xfer_lease *l = NULL;
    a->rc = kvx_xfer_has_blocks(held, &l, a->recv, h, 8, t, 8 * SU_B, 0, 0);
    kvx_xfer_stream *st = NULL;
    if (!a->rc) a->rc = kvx_xfer_stream_create(&st, a->recv);
    kvx_view views[8];
    size_t n = 0;
    if (!a->rc) a->rc = kvx_store_prefix(views, &n, a->sender, t, 8 * SU_B, 8);
    if (!a->rc && n != 8) a->rc = -1;
    for (size_t i = 0; !a->rc && i < 8; i++) {
        kvx_xfer_chunk c = {1, h[i], NULL, 0, 0, t + i * SU_B, SU_B, 0};
        void *env = NULL;
        size_t len = 0;
        if (!held[i]) {
            a->rc = kvx_views_export(&env, &len, a->sender, &views[i], 1, 1);
            c.payload = env;
            c.payload_len = len;
            c.crc32c = kvx_crc32c(0, env, len);
        }
        if (!a->rc) a->rc = kvx_xfer_stream_chunk(st, &c, NULL);
        kvx_free(env);
    }
    kvx_views_release(views, n);
    kvx_xfer_result r = {0};
    if (!a->rc) a->rc = kvx_xfer_stream_finish(st, &r);
    a->stored = r.blocks_stored;
    a->referenced = r.blocks_referenced;
    kvx_xfer_stream_destroy(st);
    kvx_xfer_lease_destroy(l);
    return NULL;
}

static void test_concurrent_pushers(void **state)
{
    (void)state;
    char da[256], db[256];
    kvx_store *a = su_store(da, sizeof da, (su_spec){0}), *b = su_store(db, sizeof db, (su_spec){0});
    for (uint64_t seq = 0; seq < PUSHERS * ROUNDS; seq++) {
        uint32_t t[8 * SU_B];
        su_tokens(t, seq, 8, 4);
        uint64_t h[8];
        kvx_geometry g = su_geometry();
        uint8_t *pages = su_pages(t, 8, h, kvx_page_bytes(&g, SU_B));
        assert_int_equal(kvx_store_put(a, t, 8 * SU_B, pages, 8, NULL, NULL), 0);
        free(pages);
    }
    assert_int_equal(kvx_store_flush(a), 0);
    uint64_t stored = 0;
    for (int round = 0; round < ROUNDS; round++) {
        pthread_t th[PUSHERS];
        pusher_arg args[PUSHERS];
        assert_int_equal(pthread_barrier_init(&pushers_start, NULL, PUSHERS), 0);
        for (int i = 0; i < PUSHERS; i++) {
            args[i] = (pusher_arg){b, a, (uint64_t)(round * PUSHERS + i), 0, 0, 0};
            assert_int_equal(pthread_create(&th[i], NULL, pusher, &args[i]), 0);
        }
        for (int i = 0; i < PUSHERS; i++) {
            pthread_join(th[i], NULL);
            if (args[i].rc) fprintf(stderr, "pusher %d: %s: %s\n", i, kvx_err_name(args[i].rc), kvx_last_error());
            assert_int_equal(args[i].rc, 0);
            /* its own 4 blocks are new; a shared one is referenced (held at
             * HasBlocks), stored, or neither (sent, but another stream
             * published it first: already held, not counted) */
            assert_true(args[i].stored >= 4);
            assert_true(args[i].stored + args[i].referenced <= 8);
            stored += args[i].stored;
        }
        pthread_barrier_destroy(&pushers_start);
    }
    /* every prompt's 4 own blocks, and each family's 4 shared blocks at
     * least once (streams racing on one block may each store a copy: a
     * block pending in another stream is not "held") */
    assert_true(stored >= 4 * 4 + (uint64_t)PUSHERS * ROUNDS * 4);
    assert_true(stored <= (uint64_t)PUSHERS * ROUNDS * 8);
    for (uint64_t seq = 0; seq < PUSHERS * ROUNDS; seq++) {
        uint32_t t[8 * SU_B];
        su_tokens(t, seq, 8, 4);
        assert_int_equal(served(b, t, 8), 8);
    }
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, b), 0);
    assert_int_equal(st.blocks, stored);
    kvx_store_close(a);
    kvx_store_close(b);
}

/* A bf16 sender's v3 into an fp16 receiver: a value f16 can hold only as
 * infinity is refused (KVX_ELOSSY -> FAILED_PRECONDITION, nothing
 * published), never stored as an infinity; values that fit go through. */
static void test_v3_into_fp16_store(void **state)
{
    (void)state;
    char da[256], db[256];
    kvx_store *a = su_store(da, sizeof da, (su_spec){.quant = KVX_QUANT_BF16}),
              *b = su_store(db, sizeof db, (su_spec){0});
    kvx_geometry g;
    kvx_store_get_geometry(&g, a);
    size_t pb = kvx_page_bytes(&g, SU_B), n = pb / 2;
    for (int big = 1; big >= 0; big--) {
        uint32_t t[SU_B];
        su_tokens(t, 40 + (uint64_t)big, 1, 0);
        uint16_t *page = malloc(pb);
        for (size_t i = 0; i < n; i++) page[i] = kvx_f32_to_bf16(big && i == 3 ? 1e20f : (float)i * 0.5f);
        assert_int_equal(kvx_store_put(a, t, SU_B, page, 1, NULL, NULL), 0);
        assert_int_equal(kvx_store_flush(a), 0);
        kvx_view v;
        assert_int_equal(kvx_store_get_block(&v, a, t, SU_B), 0);
        void *env = NULL;
        size_t len = 0;
        assert_int_equal(kvx_views_export(&env, &len, a, &v, 1, 3), 0);
        kvx_view_release(&v);
        kvx_xfer_chunk c = {3, kvx_block_hash(0, t, SU_B), env, len, kvx_crc32c(0, env, len), t, SU_B, 0};
        kvx_xfer_stream *st;
        assert_int_equal(kvx_xfer_stream_create(&st, b), 0);
        int rc = kvx_xfer_stream_chunk(st, &c, NULL);
        if (big) {
            assert_int_equal(rc, KVX_ELOSSY);
            assert_int_equal(kvx_xfer_grpc_code(rc), KVX_GRPC_FAILED_PRECONDITION);
            assert_non_null(strstr(kvx_last_error(), "token 0, dim 3"));
            assert_int_equal(served(b, t, 1), 0);
        } else {
            assert_int_equal(rc, 0);
            assert_int_equal(kvx_xfer_stream_finish(st, NULL), 0);
            kvx_view w;
            assert_int_equal(kvx_store_get_block(&w, b, t, SU_B), 0);
            const uint16_t *h16 = w.page;
            for (size_t i = 0; i < n; i++) assert_true(kvx_f16_to_f32(h16[i]) == kvx_bf16_to_f32(page[i]));
            kvx_view_release(&w);
        }
        kvx_xfer_stream_destroy(st);
        kvx_free(env);
        free(page);
    }
    kvx_store_close(a);
    kvx_store_close(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grpc_codes),
        cmocka_unit_test(test_pick_format),
        cmocka_unit_test(test_push_then_dedup),
        cmocka_unit_test(test_rejects_format),
        cmocka_unit_test(test_rejects_data_loss),
        cmocka_unit_test(test_rejects_not_held),
        cmocka_unit_test(test_tail_rules),
        cmocka_unit_test(test_has_blocks_args),
        cmocka_unit_test(test_collision_never_referenced),
        cmocka_unit_test(test_lease_pins_through_eviction),
        cmocka_unit_test(test_streams_independent),
        cmocka_unit_test(test_bf16_formats),
        cmocka_unit_test(test_concurrent_pushers),
        cmocka_unit_test(test_v3_into_fp16_store),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
