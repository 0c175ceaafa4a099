/*
 * xfer_util.h - helpers shared by the tl.kv.v1 transfer tests
 * (test_transfer.c, test_attack6.c): stores of store_util.h's tiny
 * geometry, prompts stored in a sender, the one-chunk buffer, and how many
 * leading blocks a receiver serves. Header-only; include after cmocka.h
 * and store_util.h.
 */
#ifndef KVX_TEST_XFER_UTIL_H
#define KVX_TEST_XFER_UTIL_H

static int xf_dir_counter;

/* A new store under su_root with store_util.h's geometry in quant. */
static inline kvx_store *new_store(char *dir, size_t cap, uint64_t capacity, uint64_t shard_bytes, uint32_t quant)
{
    snprintf(dir, cap, "%.200s/xf%d", su_root, xf_dir_counter++);
    kvx_store_options o;
    kvx_store_options_init(&o);
    o.geometry = su_geometry();
    o.geometry.quant = quant;
    o.capacity_bytes = capacity;
    o.shard_bytes = shard_bytes;
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    return s;
}

static inline kvx_store *fp16_store(char *dir, size_t cap) { return new_store(dir, cap, 0, 0, KVX_QUANT_FP16); }

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

#endif
