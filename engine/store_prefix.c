/*
 * store_prefix.c - kvx_store_prefix: the longest prefix the store holds,
 * continued into the shared tier where the store misses.
 *
 * Rule: the local part is store_lookup.c's, unchanged. Where it ends short
 * of the prompt and the handle has a tier, the remaining blocks' keys are
 * asked in one batch (one round trip per node), each value verified
 * (kvx_st_tier_fetch), and the leading verified ones served from memory
 * (an in-memory shard, kvx_shard_mem: the views stay valid until
 * released, as any view). A writer handle then copies them into the store
 * as an ordinary put into a private batch, flushed at once (never written
 * back to the tier); a reader never writes anything (DESIGN.md rule 3).
 * Nothing the tier does can make this call fail: a tier failure is a
 * shorter prefix.
 */
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Copies the tier's blocks [first, first + n) into the store (writer):
 * an ordinary put, one block a call (the pages are apart), into a private
 * batch flushed at once. Best effort: a failure leaves the store as it was. */
static void st_copy_in(kvx_store *s, const uint32_t *tokens, size_t first, size_t n, void *const *pages,
                       const float *scales)
{
    kvx_store_batch *b;
    if (kvx_store_batch_create(&b, s)) return;
    b->no_tier = 1;
    uint32_t B = s->g.block_tokens;
    int rc = 0;
    for (size_t j = 0; !rc && j < n; j++)
        rc = kvx_st_batch_put_from(b, tokens, (first + j + 1) * B, first + j, pages[j], 1,
                                   scales ? scales + j * s->nscales : NULL, NULL);
    if (!rc) kvx_store_batch_flush(b);
    kvx_store_batch_destroy(b);
}

KVX_API int kvx_store_prefix(kvx_view *out_views, size_t *out_n, kvx_store *s, const uint32_t *tokens, size_t n_tokens,
                             size_t max_views)
{
    int rc = kvx_st_prefix_local(out_views, out_n, s, tokens, n_tokens, max_views);
    if (rc || !s->tier) return rc;
    uint32_t B = s->g.block_tokens;
    size_t want = n_tokens / B < max_views ? n_tokens / B : max_views, have = *out_n;
    if (have >= want) return 0;
    char msg[512];
    snprintf(msg, sizeof msg, "%s", kvx_last_error()); /* the local part's note, kept */
    size_t m = want - have, pb = (size_t)s->page_bytes, ns = s->nscales;
    int fp8 = kvx_quant_is_fp8(s->g.quant);
    uint64_t *h = malloc(want * sizeof *h);
    uint8_t(*d)[KVX_DIGEST_BYTES] = malloc(want * KVX_DIGEST_BYTES);
    void **pages = calloc(m, sizeof *pages);
    float *scales = fp8 ? malloc(m * ns * sizeof *scales) : NULL;
    uint64_t *parents = malloc(m * sizeof *parents);
    size_t k = 0;
    int ok = h && d && pages && parents && (!fp8 || scales);
    for (size_t j = 0; ok && j < m; j++) ok = (pages[j] = malloc(pb)) != NULL;
    if (ok) {
        kvx_block_hashes(h, tokens, want * B, B);
        kvx_prefix_digests(d, tokens, want * B, B);
        k = kvx_st_tier_fetch(s, tokens, have, m, h, (const uint8_t(*)[KVX_DIGEST_BYTES])d, pages, scales);
    }
    kvx_shard *sh = NULL;
    if (k) {
        for (size_t j = 0; j < k; j++) parents[j] = have + j ? h[have + j - 1] : 0;
        if (s->writer) st_copy_in(s, tokens, have, k, pages, scales);
        /* the shard takes the first k pages and the array (freed with it) */
        for (size_t j = k; j < m; j++) free(pages[j]), pages[j] = NULL;
        if (kvx_shard_mem(&sh, &s->g, (uint32_t)k, pages, h + have, parents, tokens + have * B, d[have], scales))
            sh = NULL, k = 0;
        pages = NULL;
    }
    for (size_t j = 0; j < k; j++) {
        kvx_view *v = &out_views[have + j];
        kvx_entry e;
        const void *page;
        kvx_shard_entry(&e, sh, (uint32_t)j);
        kvx_shard_page(&page, sh, (uint32_t)j, 0);
        memset(v, 0, sizeof *v);
        v->coordinate = KVX_COORD_TIER;
        v->token_count = B;
        v->hash = e.hash;
        v->page = page;
        v->page_bytes = pb;
        v->scales = e.scales;
        v->shard = kvx_shard_ref(sh);
        v->entry = (uint32_t)j;
    }
    kvx_shard_close(sh);
    *out_n = have + k;
    for (size_t j = 0; pages && j < m; j++) free(pages[j]);
    free(h), free(d), free(pages), free(scales), free(parents);
    if (msg[0] && !k) kvx_fail(KVX_EPAGECRC, "%s", msg);
    else kvx_clear_error();
    return 0;
}
