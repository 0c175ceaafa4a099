/*
 * store_batch.c - the write batch: put (dedupe against the catalog and the
 * pending set, pages into open shard writers in staging/) and flush (seal,
 * then ONE catalog transaction publishes every pending block: the commit is
 * the acknowledgement).
 *
 * Rule: nothing is visible or durable before the flush returns 0; what a
 * flush acknowledges must fit the store at once, and the shards holding
 * blocks the batch relies on stay pinned until the caller's flush returns.
 * A failed put or flush drops the whole unflushed batch: it was never
 * acknowledged.
 */
#include "store.h"
#include "common/digest.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static size_t st_hslot(uint64_t h, size_t n) { return (size_t)((h * 0x9E3779B97F4A7C15ull) >> 20) & (n - 1); }

static int st_ptab_grow(kvx_store *s)
{
    size_t n = s->ptab_n ? s->ptab_n * 2 : 1024;
    size_t *t = malloc(n * sizeof *t);
    if (!t) return kvx_fail(-ENOMEM, "store: out of memory");
    for (size_t i = 0; i < n; i++) t[i] = SIZE_MAX;
    for (size_t i = 0; i < s->npend; i++) {
        size_t h = st_hslot(s->pend[i].hash, n);
        s->pend[i].next = t[h];
        t[h] = i;
    }
    free(s->ptab);
    s->ptab = t;
    s->ptab_n = n;
    return 0;
}

/* A pending block that makes q's put redundant: for a verified put, the
 * same hash, parent, tokens and digest (an unverified block never counts
 * as held for it); for a put without tokens, any block with the hash. */
static const st_pblock *st_pending_find(kvx_store *s, const st_query *q)
{
    if (!s->ptab_n) return NULL;
    for (size_t i = s->ptab[st_hslot(q->hash, s->ptab_n)]; i != SIZE_MAX; i = s->pend[i].next) {
        const st_pblock *p = &s->pend[i];
        if (p->hash != q->hash) continue;
        if (!q->toks) return p;
        if (p->tok != SIZE_MAX && p->parent == q->parent && !memcmp(s->ptok + p->tok, q->toks, 4u * s->g.block_tokens) &&
            !memcmp(p->digest, q->digest, KVX_DIGEST_BYTES))
            return p;
    }
    return NULL;
}

static int st_pending_add(kvx_store *s, const st_query *q, uint32_t coord, uint32_t kind, uint64_t gen)
{
    uint64_t hash = q->hash, parent = q->parent;
    const uint32_t *toks = q->toks;
    if (s->npend == s->cappend) {
        size_t n = s->cappend ? s->cappend * 2 : 256;
        st_pblock *p = realloc(s->pend, n * sizeof *p);
        if (!p) return kvx_fail(-ENOMEM, "store: out of memory");
        s->pend = p;
        s->cappend = n;
    }
    if ((s->npend + 1) * 2 > s->ptab_n) {
        int rc = st_ptab_grow(s);
        if (rc) return rc;
    }
    size_t tok = SIZE_MAX;
    if (toks) {
        uint32_t B = s->g.block_tokens;
        if (s->nptok + B > s->capptok) {
            size_t n = s->capptok ? s->capptok * 2 : 4096;
            while (n < s->nptok + B) n *= 2;
            uint32_t *t = realloc(s->ptok, n * sizeof *t);
            if (!t) return kvx_fail(-ENOMEM, "store: out of memory");
            s->ptok = t;
            s->capptok = n;
        }
        memcpy(s->ptok + s->nptok, toks, 4u * B);
        tok = s->nptok;
        s->nptok += B;
    }
    st_pblock *p = &s->pend[s->npend];
    if (q->digest) memcpy(p->digest, q->digest, KVX_DIGEST_BYTES);
    else memset(p->digest, 0, KVX_DIGEST_BYTES);
    p->hash = hash;
    p->parent = parent;
    p->coord = coord;
    p->kind = kind;
    p->gen = gen;
    p->tok = tok;
    size_t h = st_hslot(hash, s->ptab_n);
    p->next = s->ptab[h];
    s->ptab[h] = s->npend++;
    return 0;
}

static void st_pins_clear(kvx_store *s) { memset(s->pinned, 0, sizeof s->pinned); }

void kvx_st_pin(kvx_store *s, uint32_t b, uint64_t gen)
{
    s->pinned[b] = 1;
    s->pin_gen[b] = gen;
}

/* Drops every unflushed block: open writers are aborted, sealed but
 * unpublished files deleted. They were never acknowledged. */
void kvx_st_discard_pending(kvx_store *s)
{
    for (int k = 0; k < 2; k++) {
        if (s->cur[k].w) kvx_shard_writer_abort(s->cur[k].w);
        memset(&s->cur[k], 0, sizeof s->cur[k]);
    }
    for (size_t i = 0; i < s->nsealed; i++) kvx_st_unlink_shard(s, s->sealed[i].gen);
    s->nsealed = 0;
    s->npend = 0;
    s->nptok = 0;
    for (size_t i = 0; i < s->ptab_n; i++) s->ptab[i] = SIZE_MAX;
    st_pins_clear(s);
    s->batch_blocks = 0;
}

static int st_sealed_push(kvx_store *s, const st_sealed *x)
{
    if (s->nsealed == s->capsealed) {
        size_t n = s->capsealed ? s->capsealed * 2 : 8;
        st_sealed *p = realloc(s->sealed, n * sizeof *p);
        if (!p) return kvx_fail(-ENOMEM, "store: out of memory");
        s->sealed = p;
        s->capsealed = n;
    }
    s->sealed[s->nsealed++] = *x;
    return 0;
}

static int st_seal_cur(kvx_store *s, int kind)
{
    st_open *o = &s->cur[kind];
    if (!o->w) return 0;
    if (kvx_shard_writer_count(o->w) == 0) {
        kvx_shard_writer_abort(o->w);
        o->w = NULL;
        return 0;
    }
    /* reserve the slot first so a failure cannot lose track of the file */
    if (s->nsealed == s->capsealed) {
        st_sealed dummy = {0};
        int rc = st_sealed_push(s, &dummy);
        if (rc) return rc;
        s->nsealed--;
    }
    st_sealed x;
    int rc = kvx_st_writer_seal(s, o, &x);
    if (rc) return rc;
    return st_sealed_push(s, &x);
}

/* The capacity holds while a put runs, not only after its flush: once the
 * sealed but unpublished files would take the shard bytes over the
 * capacity, published shards are evicted to make room (the pending blocks
 * are the newest, an LRU keeps them). A batch larger than the store itself
 * cannot wait for its flush: it is published as it goes (its files are
 * sealed and durable, like the flush a put makes when shard ids run out)
 * and the flush's eviction trims it. */
static int st_room_for_pending(kvx_store *s)
{
    uint64_t live = 0, pend = 0;
    for (int b = 0; b < ST_SLOTS; b++)
        if (s->reg->live[b]) live += s->reg->rec[b].file_bytes;
    for (size_t i = 0; i < s->nsealed; i++) pend += s->sealed[i].bytes;
    if (live + pend <= s->capacity) return 0;
    if (pend > s->capacity - s->capacity / 64) return kvx_st_flush_locked(s);
    if (kvx_st_evict(s, pend) != 0) kvx_clear_error(); /* tidy-up, as after a flush */
    return 0;
}

static int st_put_one(kvx_store *s, int kind, const st_query *q, const void *page, const float *scales)
{
    st_open *o = &s->cur[kind];
    int rc;
    if (!o->w) {
        uint32_t hint = s->reserve_hint;
        if (s->npend > hint) hint = s->npend > UINT32_MAX / 2 ? UINT32_MAX : (uint32_t)s->npend;
        rc = kvx_st_writer_begin(s, kvx_st_kind_flags(s, kind), NULL, o, hint);
        if (rc == KVX_EFULL) {
            /* out of shard ids: publish what is pending and merge small shards */
            if ((rc = kvx_st_flush_locked(s))) return rc;
            kvx_st_compact(s, 1);
            rc = kvx_st_writer_begin(s, kvx_st_kind_flags(s, kind), NULL, o, hint);
        }
        if (rc) return rc;
    }
    uint32_t idx = kvx_shard_writer_count(o->w);
    kvx_entry_in e;
    memset(&e, 0, sizeof e);
    e.radix_block = (uint16_t)idx;
    e.token_count = s->g.block_tokens;
    e.page = page;
    e.hash = q->hash;
    e.parent = kind == ST_KIND_LINEAGE ? q->parent : 0;
    e.tokens = kind == ST_KIND_LINEAGE ? q->toks : NULL;
    e.digest = kind == ST_KIND_LINEAGE ? q->digest : NULL;
    e.scales = s->g.quant != KVX_QUANT_FP16 ? scales : NULL;
    if ((rc = kvx_shard_writer_add(o->w, &e))) return rc;
    if (!e.digest) o->nunv++;
    st_query pq = *q;
    if (kind != ST_KIND_LINEAGE) pq.toks = NULL, pq.digest = NULL;
    if ((rc = st_pending_add(s, &pq, KVX_COORD(o->byte, idx, 0), kind, o->gen))) return rc;
    if (s->reserve_hint > 0) s->reserve_hint--;
    if (idx + 1 >= o->cap || kvx_shard_writer_bytes(o->w) >= s->target) {
        rc = st_seal_cur(s, kind);
        if (!rc) rc = st_room_for_pending(s);
    }
    return rc;
}

/* Is q's block already published, sound? 1 yes, 0 no, <0 error. A
 * damaged copy is not "held": the put stores the block again. A held
 * block's shard is pinned until the flush that acknowledges the put. */
static int st_held(kvx_store *s, kvx_cat_snap *snap, const st_query *q)
{
    kvx_view v;
    memset(&v, 0, sizeof v);
    int rc = kvx_st_lookup(s, snap, q, &v);
    if (rc == 0) {
        uint64_t gen;
        const char *path = kvx_shard_path(v.shard), *slash = path ? strrchr(path, '/') : NULL;
        uint32_t b = KVX_COORD_SHARD(v.coordinate);
        if (slash && kvx_st_parse_name(slash + 1, &gen)) {
            s->pinned[b] = 1;
            s->pin_gen[b] = gen;
        }
        /* putting a held block is a use of it: an exact LRU would move
         * it to the front too (it may sit behind a block that was gone) */
        kvx_st_note(s, &v, 1, 0, 0);
        kvx_view_release(&v);
        return 1;
    }
    return rc == KVX_ENOTFOUND || rc == KVX_EPAGECRC || rc == KVX_ETRUNC ? 0 : rc;
}

/* A flush acknowledges every block put since the previous one, so what a
 * flush would acknowledge must fit the store at once: a put that takes the
 * unflushed batch over the capacity would keep only its tail (which no
 * prefix reaches) and the flush would acknowledge blocks already evicted.
 * Refused before anything is written. Call under wmu. */
static int st_fits(kvx_store *s, size_t n_blocks, const char *fn)
{
    uint64_t need;
    size_t total = n_blocks + s->batch_blocks;
    if (total < n_blocks || !kvx_mul64(&need, total, s->entry_bytes) || need > s->capacity) {
        if (s->batch_blocks)
            return kvx_fail(KVX_ECAPACITY,
                            "%s: %zu blocks, with the %zu put since the last flush, need %llu bytes, more than the "
                            "store's capacity of %llu bytes: flush first",
                            fn, n_blocks, s->batch_blocks, (unsigned long long)(total * s->entry_bytes),
                            (unsigned long long)s->capacity);
        return kvx_fail(KVX_ECAPACITY, "%s: %zu blocks need %llu bytes, more than the store's capacity of %llu bytes",
                        fn, n_blocks, (unsigned long long)(n_blocks * s->entry_bytes),
                        (unsigned long long)s->capacity);
    }
    return 0;
}

KVX_API int kvx_store_put(kvx_store *s, const uint32_t *tokens, size_t n_tokens, const void *pages, size_t n_pages,
                          const float *scales, size_t *out_new)
{
    if (out_new) *out_new = 0;
    int rc = kvx_st_writer_check(s, "kvx_store_put");
    if (rc) return rc;
    uint32_t B = s->g.block_tokens;
    if (n_pages > n_tokens / B)
        return kvx_fail(KVX_ETOKENS, "kvx_store_put: n_pages %zu exceeds the %zu full blocks of n_tokens %zu", n_pages,
                        n_tokens / B, n_tokens);
    if (n_pages && (!tokens || !pages)) return kvx_fail(KVX_EINVALID, "kvx_store_put: tokens or pages is NULL");
    if (n_pages == 0) return 0;
    pthread_mutex_lock(&s->wmu);
    rc = st_fits(s, n_pages, "kvx_store_put");
    pthread_mutex_unlock(&s->wmu);
    if (rc) return rc;
    uint64_t *h = malloc(n_pages * sizeof *h);
    uint8_t *held = calloc(n_pages, 1);
    uint8_t(*d)[KVX_DIGEST_BYTES] = malloc(n_pages * KVX_DIGEST_BYTES);
    if (!h || !held || !d) {
        free(h);
        free(held);
        free(d);
        return kvx_fail(-ENOMEM, "store: out of memory");
    }
    kvx_block_hashes(h, tokens, n_pages * B, B);
    kvx_prefix_digests(d, tokens, n_pages * B, B);
    pthread_mutex_lock(&s->wmu);
    kvx_cat_snap *snap;
    rc = kvx_cat_snap_begin(s->cat, &snap);
    if (!rc) {
        for (size_t i = 0; !rc && i < n_pages; i++) {
            st_query q = {h[i], i ? h[i - 1] : 0, tokens + i * B, d[i]};
            int r = st_held(s, snap, &q);
            if (r < 0) rc = r;
            else held[i] = (uint8_t)r;
        }
        kvx_cat_snap_end(snap);
    }
    size_t added = 0, todo = 0;
    for (size_t i = 0; i < n_pages; i++) todo += !held[i];
    s->reserve_hint = todo > UINT32_MAX ? UINT32_MAX : (uint32_t)todo;
    for (size_t i = 0; !rc && i < n_pages; i++) {
        st_query q = {h[i], i ? h[i - 1] : 0, tokens + i * B, d[i]};
        if (held[i] || st_pending_find(s, &q)) continue;
        rc = st_put_one(s, ST_KIND_LINEAGE, &q, (const uint8_t *)pages + i * s->page_bytes,
                        scales ? scales + i * s->nscales : NULL);
        if (rc) kvx_st_discard_pending(s); /* a failed put drops the whole unflushed batch */
        else added++;
    }
    s->batch_blocks = rc ? 0 : s->batch_blocks + added; /* a failed put dropped the batch */
    pthread_mutex_unlock(&s->wmu);
    free(h);
    free(held);
    free(d);
    if (out_new) *out_new = added;
    return rc;
}

KVX_API int kvx_store_put_envelope(kvx_store *s, const void *env, size_t len, const uint32_t *tokens, size_t n_tokens,
                                   size_t *out_new)
{
    if (out_new) *out_new = 0;
    int rc = kvx_st_writer_check(s, "kvx_store_put_envelope");
    if (rc) return rc;
    if (!env) return kvx_fail(KVX_EINVALID, "kvx_store_put_envelope: env is NULL");
    if (n_tokens && !tokens) return kvx_fail(KVX_EINVALID, "kvx_store_put_envelope: tokens is NULL");
    kvx_geometry expect = s->g;
    kvx_envelope e;
    if ((rc = kvx_envelope_parse(&e, env, len, &expect))) return rc;
    uint32_t B = s->g.block_tokens;
    size_t nfull = tokens ? n_tokens / B : 0;
    uint64_t *h = NULL;
    uint8_t(*d)[KVX_DIGEST_BYTES] = NULL;
    if (tokens) {
        h = malloc((nfull + 1) * sizeof *h);
        d = malloc((nfull + 1) * KVX_DIGEST_BYTES);
        if (!h || !d) {
            free(h);
            free(d);
            return kvx_fail(-ENOMEM, "store: out of memory");
        }
        kvx_block_hashes(h, tokens, nfull * B, B);
        kvx_prefix_digests(d, tokens, nfull * B, B);
    }
    void *page = malloc(s->page_bytes);
    float *sc = malloc((size_t)s->nscales * sizeof *sc + 1);
    if (!page || !sc) {
        free(h);
        free(d);
        free(page);
        free(sc);
        return kvx_fail(-ENOMEM, "store: out of memory");
    }
    /* check everything before writing anything */
    for (uint32_t i = 0; !rc && i < e.n_blocks; i++) {
        kvx_envelope_block blk;
        if ((rc = kvx_envelope_block_at(&blk, &e, i))) break;
        if (blk.n_tokens != B || blk.hash == 0) continue;
        if (tokens && (i >= nfull || h[i] != blk.hash))
            rc = kvx_fail(KVX_EHASH, "kvx_store_put_envelope: block %u hash %016llx is not the hash of the tokens' block %u",
                          i, (unsigned long long)blk.hash, i);
    }
    size_t nput = 0;
    for (uint32_t i = 0; !rc && i < e.n_blocks; i++) {
        kvx_envelope_block blk;
        if (kvx_envelope_block_at(&blk, &e, i) == 0 && blk.n_tokens == B && blk.hash) nput++;
    }
    if (!rc) {
        pthread_mutex_lock(&s->wmu);
        rc = st_fits(s, nput, "kvx_store_put_envelope");
        pthread_mutex_unlock(&s->wmu);
    }
    size_t added = 0;
    pthread_mutex_lock(&s->wmu);
    s->reserve_hint = e.n_blocks;
    for (uint32_t i = 0; !rc && i < e.n_blocks; i++) {
        kvx_envelope_block blk;
        if ((rc = kvx_envelope_block_at(&blk, &e, i))) break;
        if (blk.n_tokens != B || blk.hash == 0) continue;
        st_query q = {blk.hash, tokens && i ? h[i - 1] : 0, tokens ? tokens + (size_t)i * B : NULL,
                      tokens ? d[i] : NULL};
        kvx_cat_snap *snap;
        if ((rc = kvx_cat_snap_begin(s->cat, &snap))) break;
        int held = st_held(s, snap, &q);
        kvx_cat_snap_end(snap);
        if (held < 0) {
            rc = held;
            break;
        }
        if (held || st_pending_find(s, &q)) continue;
        if ((rc = kvx_envelope_payload_to_page(page, sc, &s->g, &e, &blk))) break;
        rc = st_put_one(s, tokens ? ST_KIND_LINEAGE : ST_KIND_PLAIN, &q, page, s->g.quant != KVX_QUANT_FP16 ? sc : NULL);
        if (rc) kvx_st_discard_pending(s);
        else added++;
    }
    s->batch_blocks = rc ? 0 : s->batch_blocks + added; /* a failed put dropped the batch */
    pthread_mutex_unlock(&s->wmu);
    free(h);
    free(d);
    free(page);
    free(sc);
    if (out_new) *out_new = added;
    return rc;
}

/* The flush's one edit: every sealed shard registered, every pending
 * block added, next_gen. Its commit is the acknowledgement. */
static int st_publish(kvx_store *s)
{
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    for (size_t i = 0; i < s->nsealed; i++) kvx_st_register(&e, &s->sealed[i]);
    for (size_t i = 0; i < s->npend; i++) kvx_cat_edit_add_block(&e, s->pend[i].coord, s->pend[i].hash, s->pend[i].gen);
    kvx_cat_edit_next_gen(&e, s->next_gen);
    int rc = kvx_cat_apply(s->cat, &e); /* builder failures come back here */
    kvx_cat_edit_free(&e);
    return rc;
}

int kvx_st_flush_locked(kvx_store *s)
{
    int rc = 0;
    /* each seal fsyncs its file, renames it and fsyncs shards/ (inside
     * kvx_shard_writer_seal), so every sealed file is durable here */
    for (int k = 0; k < 2 && !rc; k++) rc = st_seal_cur(s, k);
    if (!rc && s->nsealed) rc = st_publish(s);
    if (rc) {
        kvx_st_discard_pending(s);
        return rc;
    }
    for (size_t i = 0; i < s->nsealed; i++) {
        /* (the registry names them now) the flush's own tidy-up below must
         * not take what it just acknowledged either: the new shards stay
         * pinned with the held */
        s->pinned[s->sealed[i].byte] = 1;
        s->pin_gen[s->sealed[i].byte] = s->sealed[i].gen;
    }
    s->nsealed = 0;
    s->npend = 0;
    s->nptok = 0;
    for (size_t i = 0; i < s->ptab_n; i++) s->ptab[i] = SIZE_MAX;
    /* acknowledged from here on: what follows only tidies up */
    kvx_st_usage_persist(s);
    kvx_st_drop_bad_shards(s);
    kvx_st_enforce_capacity(s);
    /* merge small shards when ids run low, or when their headers and
     * padding (about ST_SHARD_OVERHEAD each) would cost over 1 % of the
     * capacity (at least 4, at most ST_COMPACT_SMALL of them) */
    st_pshard sh[ST_SLOTS];
    kvx_st_pshards(sh, s, NULL);
    if (kvx_st_compact_due(sh, s->capacity, s->target)) kvx_st_compact(s, 0);
    /* pins stay until kvx_store_flush returns: a flush made inside a put
     * (shard ids running out, a batch near the capacity) publishes blocks
     * that only the caller's flush acknowledges */
    kvx_clear_error();
    return 0;
}

KVX_API int kvx_store_flush(kvx_store *s)
{
    int rc = kvx_st_writer_check(s, "kvx_store_flush");
    if (rc) return rc;
    pthread_mutex_lock(&s->wmu);
    rc = kvx_st_flush_locked(s);
    if (!rc) {
        s->batch_blocks = 0; /* acknowledged */
        st_pins_clear(s);
    }
    pthread_mutex_unlock(&s->wmu);
    return rc;
}
