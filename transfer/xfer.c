/*
 * xfer.c - the tl.kv.v1 transfer core: a receiving engine's rules for
 * HasBlocks and PushKv, independent of the RPC stack (kvx.h, section
 * "tl.kv.v1 transfer core"; docs/TRANSFER.md).
 *
 * Rule (DESIGN.md rule 1, "tl.kv.v1"): the receiver never trusts a hash it
 * was sent. A stream recomputes the FNV chain and the prefix digest chain
 * from each chunk's token ids; an empty payload is accepted only for a
 * block held under that hash, parent, tokens and digest (a crafted FNV
 * collision therefore references nothing), and a payload is checked
 * against every envelope reader rule before a byte of it is written.
 *
 * Durability: a stream writes into its own kvx_store_batch, so its blocks
 * are invisible until kvx_xfer_stream_finish flushes them in one catalog
 * edit; a failed or abandoned stream drops exactly its own blocks.
 */
#include "engine/store.h"
#include "common/digest.h"
#include "format/format.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct kvx_xfer_lease {
    kvx_store_batch *pins; /* never flushed: its pins are the lease */
};

struct kvx_xfer_stream {
    kvx_store *s;
    kvx_store_batch *batch; /* NULL once the stream failed or finished */
    uint32_t B;
    uint64_t parent;                /* hash of the previous full block */
    uint8_t digest[KVX_DIGEST_BYTES]; /* prefix digest of the previous one */
    kvx_digest_ctx dc;
    uint32_t next_index;
    int tail_seen, finished;
    int failed; /* the first failure's code, repeated after it */
    char why[256];
    kvx_xfer_result res;
    void *page;    /* scratch: one KVX page */
    float *scales; /* scratch: L*2*Hkv */
};

KVX_API int kvx_xfer_grpc_code(int rc)
{
    switch (rc) {
    case 0: return KVX_GRPC_OK;
    case KVX_EINVALID: return KVX_GRPC_INVALID_ARGUMENT;
    case KVX_EVERSION:
    case KVX_EMODEL:
    case KVX_ELOSSY: return KVX_GRPC_FAILED_PRECONDITION;
    case KVX_ENOTHELD: return KVX_GRPC_ABORTED;
    case KVX_EFORMAT:
    case KVX_ESHAPE:
    case KVX_ECORRUPT:
    case KVX_EMAGIC:
    case KVX_ETRUNC:
    case KVX_EOVERFLOW:
    case KVX_EQUANT:
    case KVX_ETOKENS:
    case KVX_EHASH:
    case KVX_ELINEAGE: return KVX_GRPC_DATA_LOSS;
    case KVX_ECAPACITY:
    case KVX_EFULL:
    case KVX_EBUSY:
    case -ENOMEM:
    case -ENOSPC:
    case -EDQUOT: return KVX_GRPC_RESOURCE_EXHAUSTED;
    case KVX_ECANCELED: return KVX_GRPC_CANCELLED;
    default: return KVX_GRPC_INTERNAL;
    }
}

/* ------------------------------------------------------------------ */
/* HasBlocks */

/* Is block i of a token-checked prompt held? 1/0; with a lease, pinned. */
static int xf_held_by_tokens(kvx_store *s, kvx_store_batch *pins, kvx_cat_snap *snap, const st_query *q)
{
    if (pins) return kvx_st_ref_block(pins, q);
    kvx_view v;
    memset(&v, 0, sizeof v);
    int rc = kvx_st_lookup(s, snap, q, &v);
    if (rc == 0) {
        kvx_view_release(&v);
        return 1;
    }
    return rc == KVX_ENOTFOUND || rc == KVX_EPAGECRC || rc == KVX_ETRUNC ? 0 : rc;
}

/* Without tokens: held when at least one verified block holds the hash
 * (exactly one: pinned; several: the push re-verifies by digest). */
static int xf_held_by_hash(kvx_store *s, kvx_store_batch *pins, uint64_t hash)
{
    kvx_view v;
    memset(&v, 0, sizeof v);
    int rc = kvx_store_get_hash(&v, s, hash);
    if (rc == 0) {
        if (pins) {
            pthread_mutex_lock(&s->wmu);
            kvx_st_pin_view(pins, &v);
            pthread_mutex_unlock(&s->wmu);
        }
        kvx_view_release(&v);
        return 1;
    }
    /* a miss, an unverified or unreadable copy: "not held" costs the
     * sender one payload, never a wrong block */
    kvx_clear_error();
    return rc == KVX_EAMBIGUOUS;
}

static int xf_has_check(kvx_store *s, const uint64_t *hashes, size_t n, const uint32_t *tokens, size_t n_tokens,
                        uint32_t block_tokens, uint64_t sig, const uint8_t *out_held)
{
    if (!s) return kvx_fail(KVX_EINVALID, "kvx_xfer_has_blocks: store is NULL");
    int krc = kvx_st_kind_check(s, 0, "kvx_xfer_has_blocks");
    if (krc) return krc;
    if (n && (!hashes || !out_held)) return kvx_fail(KVX_EINVALID, "kvx_xfer_has_blocks: hashes or out_held is NULL");
    if (n_tokens && !tokens) return kvx_fail(KVX_EINVALID, "kvx_xfer_has_blocks: tokens is NULL");
    uint32_t B = s->g.block_tokens;
    if (block_tokens && block_tokens != B)
        return kvx_fail(KVX_EINVALID, "HasBlocks: block_tokens %u is not the store's %u", block_tokens, B);
    if (sig && sig != s->g.model_signature)
        return kvx_fail(KVX_EMODEL, "HasBlocks: model_signature %016llx is not the store's %016llx",
                        (unsigned long long)sig, (unsigned long long)s->g.model_signature);
    if (n_tokens && n_tokens / B < n)
        return kvx_fail(KVX_EINVALID, "HasBlocks: %zu tokens hold %zu full blocks of %u, fewer than the %zu hashes",
                        n_tokens, n_tokens / B, B, n);
    return 0;
}

KVX_API int kvx_xfer_has_blocks(uint8_t *out_held, kvx_xfer_lease **out_lease, kvx_store *s, const uint64_t *hashes,
                                size_t n, const uint32_t *tokens, size_t n_tokens, uint32_t block_tokens,
                                uint64_t model_signature)
{
    if (out_lease) *out_lease = NULL;
    int rc = xf_has_check(s, hashes, n, tokens, n_tokens, block_tokens, model_signature, out_held);
    if (rc) return rc;
    if (n) memset(out_held, 0, n);
    uint32_t B = s->g.block_tokens;
    uint64_t *h = NULL;
    uint8_t(*d)[KVX_DIGEST_BYTES] = NULL;
    if (n_tokens && n) {
        h = malloc(n * sizeof *h);
        d = malloc(n * KVX_DIGEST_BYTES);
        if (!h || !d) {
            free(h);
            free(d);
            return kvx_fail(-ENOMEM, "HasBlocks: out of memory");
        }
        kvx_block_hashes(h, tokens, n * B, B);
        for (size_t i = 0; i < n; i++)
            if (h[i] != hashes[i]) {
                rc = kvx_fail(KVX_EINVALID,
                              "HasBlocks: block_hashes[%zu] %016llx is not the FNV chain of the tokens (%016llx)", i,
                              (unsigned long long)hashes[i], (unsigned long long)h[i]);
                free(h);
                free(d);
                return rc;
            }
        kvx_prefix_digests(d, tokens, n * B, B);
    }
    kvx_xfer_lease *lease = NULL;
    if (out_lease) {
        lease = calloc(1, sizeof *lease);
        if (!lease) rc = kvx_fail(-ENOMEM, "HasBlocks: out of memory");
        else if ((rc = kvx_store_batch_create(&lease->pins, s))) {
            free(lease);
            lease = NULL;
        } else {
            pthread_mutex_lock(&s->wmu);
            kvx_st_lease_begin(lease->pins);
            pthread_mutex_unlock(&s->wmu);
        }
    }
    kvx_cat_snap *snap = NULL;
    if (!rc && h && !lease) rc = kvx_cat_snap_begin(s->cat, &snap);
    for (size_t i = 0; !rc && i < n; i++) {
        int held;
        if (h) {
            st_query q = {.hash = h[i], .parent = i ? h[i - 1] : 0, .toks = tokens + i * B, .digest = d[i]};
            held = xf_held_by_tokens(s, lease ? lease->pins : NULL, snap, &q);
        } else {
            held = xf_held_by_hash(s, lease ? lease->pins : NULL, hashes[i]);
        }
        if (held < 0) rc = held;
        else out_held[i] = (uint8_t)held;
    }
    if (snap) kvx_cat_snap_end(snap);
    free(h);
    free(d);
    if (rc) {
        if (n) memset(out_held, 0, n);
        kvx_xfer_lease_destroy(lease);
        return rc;
    }
    if (out_lease) *out_lease = lease;
    return 0;
}

KVX_API void kvx_xfer_lease_destroy(kvx_xfer_lease *l)
{
    if (!l) return;
    kvx_store_batch_destroy(l->pins);
    free(l);
}

/* ------------------------------------------------------------------ */
/* PushKv */

KVX_API int kvx_xfer_stream_create(kvx_xfer_stream **out, kvx_store *s)
{
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_xfer_stream_create: out is NULL");
    *out = NULL;
    if (!s) return kvx_fail(KVX_EINVALID, "kvx_xfer_stream_create: store is NULL");
    int krc = kvx_st_kind_check(s, 0, "kvx_xfer_stream_create");
    if (krc) return krc;
    kvx_xfer_stream *st = calloc(1, sizeof *st);
    if (!st) return kvx_fail(-ENOMEM, "PushKv: out of memory");
    st->s = s;
    st->B = s->g.block_tokens;
    st->page = malloc(s->page_bytes ? s->page_bytes : 1);
    st->scales = malloc((size_t)s->nscales * sizeof *st->scales + sizeof(float));
    int rc = st->page && st->scales ? kvx_digest_ctx_init(&st->dc) : kvx_fail(-ENOMEM, "PushKv: out of memory");
    if (!rc && (rc = kvx_store_batch_create(&st->batch, s))) kvx_digest_ctx_free(&st->dc);
    if (!rc) st->batch->whole = 1; /* a failed stream publishes nothing, even near the capacity */
    if (rc) {
        free(st->page);
        free(st->scales);
        free(st);
        return rc;
    }
    *out = st;
    return 0;
}

/* The stream's first failure: its blocks go, the code sticks. */
static int xf_fail(kvx_xfer_stream *st, int rc)
{
    st->failed = rc;
    snprintf(st->why, sizeof st->why, "%s", kvx_last_error());
    kvx_store_batch_destroy(st->batch); /* never acknowledged: nothing published */
    st->batch = NULL;
    return kvx_fail(rc, "%s", st->why);
}

/* Everything about a chunk that needs no payload: its place in the
 * stream, its tokens and the hash they give. */
static int xf_check_head(kvx_xfer_stream *st, const kvx_xfer_chunk *c, uint32_t idx, uint64_t *out_hash)
{
    const kvx_store *s = st->s;
    if (c->kv_format < 1 || c->kv_format > 3)
        return kvx_fail(KVX_EVERSION, "PushKv: chunk %u: kv_format %u is not an envelope version this receiver reads "
                        "(1, 2 or 3)", idx, c->kv_format);
    if (c->model_signature && c->model_signature != s->g.model_signature)
        return kvx_fail(KVX_EMODEL, "PushKv: chunk %u: model_signature %016llx is not the store's %016llx", idx,
                        (unsigned long long)c->model_signature, (unsigned long long)s->g.model_signature);
    if (st->tail_seen)
        return kvx_fail(KVX_EINVALID, "PushKv: chunk %u follows the partial tail, which must come last", idx);
    if (c->n_tokens == 0 || c->n_tokens > st->B || !c->tokens)
        return kvx_fail(KVX_ETOKENS, "PushKv: chunk %u: %zu token ids, want 1..%u", idx, c->n_tokens, st->B);
    if (c->n_tokens < st->B) {
        if (c->block_hash)
            return kvx_fail(KVX_EHASH, "PushKv: chunk %u: a partial tail of %zu tokens has no hash, not %016llx", idx,
                            c->n_tokens, (unsigned long long)c->block_hash);
        *out_hash = 0;
        return 0;
    }
    uint64_t h = kvx_block_hash(st->parent, c->tokens, st->B);
    if (h != c->block_hash)
        return kvx_fail(KVX_EHASH, "PushKv: chunk %u: block_hash %016llx is not the hash of its tokens after the "
                        "previous blocks (%016llx)", idx, (unsigned long long)c->block_hash, (unsigned long long)h);
    *out_hash = h;
    return 0;
}

/* A payload: checked whole, then (a full block) written into the batch. */
static int xf_payload(kvx_xfer_stream *st, const kvx_xfer_chunk *c, uint32_t idx, const st_query *q, int *out_added)
{
    kvx_store *s = st->s;
    *out_added = 0;
    if (c->payload_len > KVX_XFER_MAX_PAYLOAD)
        return kvx_fail(KVX_EFORMAT, "PushKv: chunk %u: payload of %zu bytes is over the %u-byte limit", idx,
                        c->payload_len, KVX_XFER_MAX_PAYLOAD);
    /* one pass over the bytes: the envelope's own CRC-32C covers all but
     * its last 4 bytes, the chunk's all of them, and CRC-32C continues */
    const uint8_t *p = c->payload;
    size_t body_len = c->payload_len >= 4 ? c->payload_len - 4 : 0;
    uint32_t body = kvx_crc32c(0, p, body_len);
    uint32_t crc = kvx_crc32c(body, p + body_len, c->payload_len - body_len);
    if (crc != c->crc32c)
        return kvx_fail(KVX_ECORRUPT, "PushKv: chunk %u: crc32c %08x does not match the payload's %08x", idx,
                        c->crc32c, crc);
    kvx_geometry expect = s->g;
    kvx_envelope e;
    int rc = kvx_envelope_parse_nocrc(&e, c->payload, c->payload_len, &expect);
    if (rc) return kvx_fail_prefix(rc, "PushKv: chunk %u", idx);
    if (kvx_load32(p + body_len) != body) /* parse_nocrc checked len >= 32 */
        return kvx_fail(KVX_EFORMAT, "PushKv: chunk %u: envelope crc32c %08x, its bytes give %08x", idx,
                        kvx_load32(p + body_len), body);
    if (e.version != c->kv_format)
        return kvx_fail(KVX_EFORMAT, "PushKv: chunk %u: envelope version %u is not kv_format %u", idx, e.version,
                        c->kv_format);
    if (e.n_blocks != 1)
        return kvx_fail(KVX_EFORMAT, "PushKv: chunk %u: envelope holds %u blocks, a chunk carries exactly 1", idx,
                        e.n_blocks);
    kvx_envelope_block blk;
    if ((rc = kvx_envelope_block_at(&blk, &e, 0))) return rc;
    if (blk.hash != c->block_hash)
        return kvx_fail(KVX_EHASH, "PushKv: chunk %u: envelope block_hash %016llx is not the chunk's %016llx", idx,
                        (unsigned long long)blk.hash, (unsigned long long)c->block_hash);
    if (blk.n_tokens != c->n_tokens)
        return kvx_fail(KVX_ETOKENS, "PushKv: chunk %u: envelope n_tokens %u, but the chunk carries %zu token ids",
                        idx, blk.n_tokens, c->n_tokens);
    if (!q) return 0; /* the tail: checked, never stored */
    if ((rc = kvx_envelope_payload_to_page(st->page, st->scales, &s->g, &e, &blk))) return rc;
    return kvx_st_put_block(st->batch, q, st->page, kvx_quant_is_fp8(s->g.quant) ? st->scales : NULL, out_added);
}

KVX_API int kvx_xfer_stream_chunk(kvx_xfer_stream *st, const kvx_xfer_chunk *c, kvx_xfer_block *out_block)
{
    if (out_block) memset(out_block, 0, sizeof *out_block);
    if (!st || !c) return kvx_fail(KVX_EINVALID, "kvx_xfer_stream_chunk: NULL argument");
    if (st->failed) return kvx_fail(st->failed, "%s", st->why);
    if (st->finished) return kvx_fail(KVX_EINVALID, "PushKv: the stream was finished");
    /* kvx_store_close detached the batch: the store is gone, read nothing of it */
    if (!st->batch->s) return xf_fail(st, kvx_fail(KVX_EINVALID, "PushKv: the stream's store was closed"));
    if (c->payload_len && !c->payload) return kvx_fail(KVX_EINVALID, "kvx_xfer_stream_chunk: payload is NULL");
    uint32_t idx = st->next_index;
    st->res.bytes_received += c->payload_len;
    uint64_t h = 0;
    int rc = xf_check_head(st, c, idx, &h);
    if (rc) return xf_fail(st, rc);
    int tail = c->n_tokens < st->B, added = 0, referenced = 0;
    uint8_t digest[KVX_DIGEST_BYTES];
    st_query q = {.hash = h, .parent = st->parent, .toks = c->tokens, .digest = digest};
    if (!tail) kvx_digest_step(&st->dc, digest, idx ? st->digest : NULL, c->tokens, st->B);
    if (c->payload_len == 0) {
        rc = tail ? 0 : kvx_st_ref_block(st->batch, &q);
        if (rc == 0)
            rc = kvx_fail(KVX_ENOTHELD,
                          tail ? "PushKv: chunk %u: the partial tail is never held here: send its payload"
                               : "PushKv: chunk %u: block %016llx is not held here (never stored, evicted, or its "
                                 "lease expired): send it with its payload",
                          idx, (unsigned long long)h);
        else if (rc == 1) rc = 0, referenced = 1;
    } else {
        rc = xf_payload(st, c, idx, tail ? NULL : &q, &added);
    }
    if (rc) return xf_fail(st, rc);
    if (tail) {
        st->tail_seen = 1;
        st->res.tail_tokens = (uint32_t)c->n_tokens;
    } else {
        st->parent = h;
        memcpy(st->digest, digest, sizeof digest);
        st->res.blocks_stored += (uint32_t)added;
        st->res.blocks_referenced += (uint32_t)referenced;
    }
    st->next_index++;
    if (out_block) {
        out_block->index = idx;
        out_block->n_tokens = (uint32_t)c->n_tokens;
        out_block->hash = h;
        out_block->stored = (uint8_t)added;
        out_block->referenced = (uint8_t)referenced;
        out_block->tail = (uint8_t)tail;
    }
    return 0;
}

KVX_API int kvx_xfer_stream_finish(kvx_xfer_stream *st, kvx_xfer_result *out)
{
    if (out) memset(out, 0, sizeof *out);
    if (!st) return kvx_fail(KVX_EINVALID, "kvx_xfer_stream_finish: stream is NULL");
    if (st->failed) return kvx_fail(st->failed, "%s", st->why);
    if (st->finished) return kvx_fail(KVX_EINVALID, "PushKv: the stream was finished already");
    int rc = kvx_store_batch_flush(st->batch);
    if (rc) return xf_fail(st, rc);
    st->finished = 1;
    st->res.durable = 1;
    kvx_store_batch_destroy(st->batch); /* its pins end with the push */
    st->batch = NULL;
    if (out) *out = st->res;
    return 0;
}

KVX_API void kvx_xfer_stream_progress(kvx_xfer_result *out, const kvx_xfer_stream *st)
{
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (st) *out = st->res;
}

KVX_API void kvx_xfer_stream_destroy(kvx_xfer_stream *st)
{
    if (!st) return;
    kvx_store_batch_destroy(st->batch);
    kvx_digest_ctx_free(&st->dc);
    free(st->page);
    free(st->scales);
    free(st);
}

/* ------------------------------------------------------------------ */
/* Sender */

KVX_API int kvx_xfer_pick_format(uint16_t *out_version, const kvx_geometry *g, uint16_t requested)
{
    if (!out_version || !g) return kvx_fail(KVX_EINVALID, "kvx_xfer_pick_format: NULL argument");
    *out_version = 0;
    if (!kvx_quant_name(g->quant)) return kvx_fail(KVX_EQUANT, "kvx_xfer_pick_format: quant %u is unknown", g->quant);
    if (requested > 3) return kvx_fail(KVX_EVERSION, "tl.kv.v1: format v%u is not 1, 2 or 3", requested);
    uint16_t v = requested;
    size_t bytes = 0;
    if (!v) {
        v = g->quant == KVX_QUANT_E4M3 ? 2 : g->quant == KVX_QUANT_BF16 ? 3 : 1;
        if (v == 3 && (kvx_envelope_size(&bytes, 3, g, 1) || bytes > KVX_XFER_MAX_PAYLOAD)) v = 2;
    }
    int rc = kvx_envelope_size(&bytes, v, g, 1);
    if (rc) return rc;
    if (bytes > KVX_XFER_MAX_PAYLOAD)
        return kvx_fail(KVX_ECAPACITY, "tl.kv.v1: a one-block v%u envelope is %zu bytes, over the %u-byte chunk limit",
                        v, bytes, KVX_XFER_MAX_PAYLOAD);
    *out_version = v;
    return 0;
}
