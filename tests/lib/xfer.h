/*
 * xfer.h - helpers of the tl.kv.v1 transfer tests (tests/transfer/):
 * prompts stored in a sender (stores of tests/lib/store.h), the one-chunk
 * buffer, and how many leading blocks a receiver serves.
 */
#ifndef KVX_TEST_XFER_UTIL_H
#define KVX_TEST_XFER_UTIL_H

#include "store.h"

/* A prompt of nb full blocks (+1 block of room for a tail), its first
 * nb_put blocks stored in s (pages su_page of their hashes) and flushed. */
static inline uint32_t *prompt(kvx_store *s, uint64_t seq, size_t nb, size_t nb_put)
{
    uint32_t *t = calloc((nb + 1) * SU_B, sizeof *t);
    su_tokens(t, seq, nb + 1, 0);
    if (nb_put) {
        uint64_t *h = calloc(nb_put, sizeof *h);
        kvx_geometry g;
        kvx_store_get_geometry(&g, s);
        uint8_t *pages = su_pages(t, nb_put, h, kvx_page_bytes(&g, SU_B));
        assert_int_equal(kvx_store_put(s, t, nb_put * SU_B, pages, nb_put, NULL, NULL), 0);
        assert_int_equal(kvx_store_flush(s), 0);
        free(pages);
        free(h);
    }
    return t;
}

typedef struct chunk_buf {
    kvx_xfer_chunk c;
    void *env; /* kvx_free */
} chunk_buf;

/* Leading blocks of t (nb of them asked) that s serves by prefix. */
static inline size_t served(kvx_store *s, const uint32_t *t, size_t nb)
{
    kvx_view *views = calloc(nb + 1, sizeof *views);
    size_t n = 0;
    assert_int_equal(kvx_store_prefix(views, &n, s, t, nb * SU_B, nb), 0);
    kvx_views_release(views, n);
    free(views);
    return n;
}

/* Chunk i of the prompt t (nb full blocks + tail tokens) as the sender
 * makes it: a one-block envelope of version v exported from sender's view
 * (full blocks), or built from zero pages for the tail; empty when
 * `empty`. */
static inline void xf_chunk(chunk_buf *cb, kvx_store *sender, const uint32_t *t, size_t nb, size_t tail, size_t i,
                            uint16_t v, int empty)
{
    memset(cb, 0, sizeof *cb);
    kvx_geometry g;
    kvx_store_get_geometry(&g, sender);
    uint64_t h[64];
    kvx_block_hashes(h, t, nb * SU_B, SU_B);
    int is_tail = i == nb;
    cb->c.kv_format = v;
    cb->c.block_hash = is_tail ? 0 : h[i];
    cb->c.tokens = t + i * SU_B;
    cb->c.n_tokens = is_tail ? tail : SU_B;
    if (empty) return;
    size_t len = 0;
    if (!is_tail) {
        kvx_view views[64];
        size_t n = 0;
        assert_int_equal(kvx_store_prefix(views, &n, sender, t, (i + 1) * SU_B, 64), 0);
        assert_int_equal(n, i + 1);
        assert_int_equal(kvx_views_export(&cb->env, &len, sender, &views[i], 1, v), 0);
        kvx_views_release(views, n);
    } else {
        size_t pbytes = kvx_envelope_payload_bytes(v, &g);
        uint8_t *payload = calloc(1, pbytes);
        float scales[2] = {1.0f, 1.0f};
        kvx_envelope_block_in in = {0, (uint32_t)tail, payload, scales};
        assert_int_equal(kvx_envelope_size(&len, v, &g, 1), 0);
        cb->env = malloc(len);
        assert_int_equal(kvx_envelope_export(cb->env, len, v, &g, &in, 1), 0);
        free(payload);
    }
    cb->c.payload = cb->env;
    cb->c.payload_len = len;
    cb->c.crc32c = kvx_crc32c(0, cb->env, len);
}

/* Sends chunks 0..nb (tail when tail > 0); empty[i] marks "you hold it". */
static inline int xf_push(kvx_store *recv, kvx_store *sender, const uint32_t *t, size_t nb, size_t tail,
                          const uint8_t *empty, kvx_xfer_result *res)
{
    kvx_xfer_stream *st = NULL;
    assert_int_equal(kvx_xfer_stream_create(&st, recv), 0);
    int rc = 0;
    for (size_t i = 0; !rc && i < nb + (tail ? 1 : 0); i++) {
        chunk_buf cb;
        xf_chunk(&cb, sender, t, nb, tail, i, 1, empty && i < nb && empty[i]);
        kvx_xfer_block blk;
        rc = kvx_xfer_stream_chunk(st, &cb.c, &blk);
        if (!rc) {
            assert_int_equal(blk.index, i);
            assert_int_equal(blk.tail, i == nb);
        }
        kvx_free(cb.env);
    }
    if (!rc) rc = kvx_xfer_stream_finish(st, res);
    kvx_xfer_stream_destroy(st);
    return rc;
}

/* Chunk i (a full block, i < 512) of prompt t exported from sender as
 * version v; empty: "you hold it". */
static inline void xf_block_chunk(chunk_buf *cb, kvx_store *sender, const uint32_t *t, size_t i, uint16_t v, int empty)
{
    memset(cb, 0, sizeof *cb);
    uint64_t h[512];
    assert_true(i < 512);
    kvx_block_hashes(h, t, (i + 1) * SU_B, SU_B);
    cb->c.kv_format = v;
    cb->c.block_hash = h[i];
    cb->c.tokens = t + i * SU_B;
    cb->c.n_tokens = SU_B;
    if (empty) return;
    size_t len = 0;
    static kvx_view views[512];
    size_t n = 0;
    assert_int_equal(kvx_store_prefix(views, &n, sender, t, (i + 1) * SU_B, 512), 0);
    assert_int_equal(n, i + 1);
    assert_int_equal(kvx_views_export(&cb->env, &len, sender, &views[i], 1, v), 0);
    kvx_views_release(views, n);
    cb->c.payload = cb->env;
    cb->c.payload_len = len;
    cb->c.crc32c = kvx_crc32c(0, cb->env, len);
}

/* The blocks s holds (kvx_store_stat). */
static inline uint64_t xf_blocks_of(kvx_store *s)
{
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    return st.blocks;
}

/* Sends xf_block_chunk i (version 1) on st: the chunk call's code. */
static inline int xf_send_chunk(kvx_xfer_stream *st, kvx_store *sender, const uint32_t *t, size_t i, int empty)
{
    chunk_buf cb;
    xf_block_chunk(&cb, sender, t, i, 1, empty);
    int rc = kvx_xfer_stream_chunk(st, &cb.c, NULL);
    kvx_free(cb.env);
    return rc;
}

#endif
