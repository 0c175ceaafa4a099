/*
 * store_batch.c - write batches: put (dedupe against the catalog and the
 * batch's pending set, pages into the batch's open shard writers in
 * staging/) and flush (seal, link the sealed files into shards/, then
 * ONE catalog transaction publishes every
 * pending block of the batch: the commit is the acknowledgement). A writer
 * handle has a built-in batch (kvx_store_put / kvx_store_flush) and any
 * number of caller batches (kvx_store_batch_*), all on the store's list.
 *
 * Rule: nothing is visible or durable before the batch's flush returns 0,
 * and that flush acknowledges exactly the blocks put into the batch since
 * its last flush; what it acknowledges must fit the store at once, and the
 * shards holding blocks the batch relies on stay pinned until the caller's
 * flush returns. A failed put or flush drops that batch's unflushed blocks
 * (never another batch's); when blocks of earlier successful puts were
 * among them, the batch's next flush says so (KVX_EDROPPED), never 0.
 */
#include "store.h"
#include "common/digest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int st_batch_check(const kvx_store_batch *x, const char *fn);

static size_t st_hslot(uint64_t h, size_t n) { return (size_t)((h * 0x9E3779B97F4A7C15ull) >> 20) & (n - 1); }

static int st_ptab_grow(kvx_store_batch *x)
{
    size_t n = x->ptab_n ? x->ptab_n * 2 : 1024;
    size_t *t = malloc(n * sizeof *t);
    if (!t) return kvx_fail(-ENOMEM, "store: out of memory");
    for (size_t i = 0; i < n; i++) t[i] = SIZE_MAX;
    for (size_t i = 0; i < x->npend; i++) {
        size_t h = st_hslot(x->pend[i].hash, n);
        x->pend[i].next = t[h];
        t[h] = i;
    }
    free(x->ptab);
    x->ptab = t;
    x->ptab_n = n;
    return 0;
}

/* A pending block of batch x that makes q's put redundant: for a verified
 * put, the same hash, parent, tokens and digest (an unverified block never
 * counts as held for it); for a put without tokens, any block with the
 * hash. Another batch's pending blocks never count: its flush may fail. */
static const st_pblock *st_pending_find(const kvx_store *s, const kvx_store_batch *x, const st_query *q)
{
    if (!x->ptab_n) return NULL;
    for (size_t i = x->ptab[st_hslot(q->hash, x->ptab_n)]; i != SIZE_MAX; i = x->pend[i].next) {
        const st_pblock *p = &x->pend[i];
        if (p->hash != q->hash) continue;
        if (q->key) { /* keyed: SHA-256 of the key, all 32 bytes */
            if (!memcmp(p->digest, q->digest, KVX_DIGEST_BYTES)) return p;
            continue;
        }
        if (!q->toks) return p;
        if (p->tok != SIZE_MAX && p->parent == q->parent && !memcmp(x->ptok + p->tok, q->toks, 4u * s->g.block_tokens) &&
            !memcmp(p->digest, q->digest, KVX_DIGEST_BYTES))
            return p;
    }
    return NULL;
}

static int st_pending_add(const kvx_store *s, kvx_store_batch *x, const st_query *q, uint32_t coord, uint32_t kind,
                          uint64_t gen)
{
    if (x->npend == x->cappend) {
        size_t n = x->cappend ? x->cappend * 2 : 256;
        st_pblock *p = realloc(x->pend, n * sizeof *p);
        if (!p) return kvx_fail(-ENOMEM, "store: out of memory");
        x->pend = p;
        x->cappend = n;
    }
    if ((x->npend + 1) * 2 > x->ptab_n) {
        int rc = st_ptab_grow(x);
        if (rc) return rc;
    }
    size_t tok = SIZE_MAX;
    if (q->toks) {
        uint32_t B = s->g.block_tokens;
        if (x->nptok + B > x->capptok) {
            size_t n = x->capptok ? x->capptok * 2 : 4096;
            while (n < x->nptok + B) n *= 2;
            uint32_t *t = realloc(x->ptok, n * sizeof *t);
            if (!t) return kvx_fail(-ENOMEM, "store: out of memory");
            x->ptok = t;
            x->capptok = n;
        }
        memcpy(x->ptok + x->nptok, q->toks, 4u * B);
        tok = x->nptok;
        x->nptok += B;
    }
    st_pblock *p = &x->pend[x->npend];
    if (q->digest) memcpy(p->digest, q->digest, KVX_DIGEST_BYTES);
    else memset(p->digest, 0, KVX_DIGEST_BYTES);
    p->hash = q->hash;
    p->parent = q->parent;
    p->coord = coord;
    p->kind = kind;
    p->gen = gen;
    p->tok = tok;
    size_t h = st_hslot(q->hash, x->ptab_n);
    p->next = x->ptab[h];
    x->ptab[h] = x->npend++;
    return 0;
}

static void st_pins_clear(kvx_store_batch *x) { memset(x->pinned, 0, sizeof x->pinned); }

/* Is there room in the leases' budget for lease x to pin shard b? The
 * union of every lease's pins is taken now, under wmu, not as it was when
 * x began: HasBlocks calls running at once each saw the budget empty and
 * together pinned up to their number of times it, and a renewing lease
 * re-pinned that overshoot for free before the old ones lapsed, for ever
 * (tests/transfer/lease.c test_concurrent_leases_share_budget). A shard some lease
 * pins costs nothing more; the union never passes the budget. */
static int st_lease_room(kvx_store_batch *x, uint32_t b)
{
    kvx_store *s = x->s;
    if (!s) return 0;
    /* pinned[] holds 0 or 1 per slot: OR them a word at a time (4096
     * leases: 128 Ki words, tens of microseconds, once per shard a lease
     * adds) */
    uint64_t in[ST_SLOTS / 8] = {0};
    for (const kvx_store_batch *y = s->batches; y; y = y->next) {
        if (!y->lease) continue;
        for (size_t w = 0; w < ST_SLOTS / 8; w++) {
            uint64_t v;
            memcpy(&v, y->pinned + 8 * w, 8);
            in[w] |= v;
        }
    }
    uint8_t any[ST_SLOTS];
    memcpy(any, in, sizeof any);
    if (any[b]) return 1;
    uint64_t used = 0;
    for (uint32_t c = 0; c < ST_SLOTS; c++)
        if (any[c] && s->reg->live[c]) used += kvx_st_live_bytes(s, c);
    uint64_t bytes = kvx_st_live_bytes(s, b);
    return used + bytes <= kvx_st_lease_budget(s);
}

void kvx_st_pin(kvx_store_batch *x, uint32_t b, uint64_t gen)
{
    if (x->lease && !x->pinned[b] && !st_lease_room(x, b)) return;
    x->pinned[b] = 1;
    x->pin_gen[b] = gen;
}

void kvx_st_lease_begin(kvx_store_batch *x) { x->lease = 1; }

/* The pending set emptied (its blocks were published or dropped). */
static void st_pending_reset(kvx_store_batch *x)
{
    x->nsealed = 0;
    x->npend = 0;
    x->nptok = 0;
    x->ok_pend = 0;
    for (size_t i = 0; i < x->ptab_n; i++) x->ptab[i] = SIZE_MAX;
}

/* Drops every unflushed block of x: open writers are aborted, sealed but
 * unpublished files deleted. They were never acknowledged; those earlier
 * successful puts added are counted in lost, so the batch's next flush
 * does not answer 0 as if they were stored. Pins stay until that flush:
 * blocks a put found held, or a flush inside a put published, are still
 * what it acknowledges. */
void kvx_st_discard_pending(kvx_store_batch *x)
{
    if (x->ok_pend) {
        if (!x->lost) {
            const char *why = kvx_last_error();
            snprintf(x->lost_why, sizeof x->lost_why, "%s", why[0] ? why : "a failed put or flush");
        }
        x->lost += x->ok_pend;
        x->batch_blocks -= x->ok_pend < x->batch_blocks ? x->ok_pend : x->batch_blocks;
    }
    /* the active shard's entries of x are rolled back, the shard kept */
    kvx_st_active_release(x->s, x, 0);
    for (int k = 0; k < 2; k++) {
        if (x->cur[k].w) kvx_shard_writer_abort(x->cur[k].w);
        memset(&x->cur[k], 0, sizeof x->cur[k]);
    }
    if (x->s) kvx_st_unlink_sealed(x->s, x->sealed, x->nsealed);
    st_pending_reset(x);
}


static int st_seal_cur(kvx_store *s, kvx_store_batch *x, int kind)
{
    st_open *o = &x->cur[kind];
    if (!o->w || o->active) return 0; /* the active shard's: appended by the flush */
    if (kvx_shard_writer_count(o->w) == 0) {
        kvx_shard_writer_abort(o->w);
        o->w = NULL;
        return 0;
    }
    /* reserve the slot first so a failure cannot lose track of the file */
    if (x->nsealed == x->capsealed) {
        st_sealed dummy = {0};
        int rc = kvx_st_sealed_push(x, &dummy);
        if (rc) return rc;
        x->nsealed--;
    }
    /* parked, unsealed, until the flush: only the commit knows the
     * sequence number its entries take (DESIGN.md "order fixed at commit") */
    st_sealed v;
    int rc = kvx_st_writer_park(s, o, &v);
    if (rc) return rc;
    return kvx_st_sealed_push(x, &v);
}

/* The capacity holds while a put runs, not only after its flush: once the
 * sealed but unpublished files (of every batch) would take the shard bytes
 * over the capacity, published shards are evicted to make room (the
 * pending blocks are the newest, an LRU keeps them). A batch larger than
 * the store itself cannot wait for its flush: it is published as it goes
 * (its files are sealed and durable, like the flush a put makes when shard
 * ids run out) and the flush's eviction trims it. */
static int st_room_for_pending(kvx_store *s, kvx_store_batch *x)
{
    uint64_t live = 0, own = 0;
    for (int b = 0; b < ST_SLOTS; b++)
        if (s->reg->live[b]) live += kvx_st_live_bytes(s, (uint32_t)b);
    for (size_t i = 0; i < x->nsealed; i++) own += x->sealed[i].bytes;
    uint64_t pend = st_unpublished_bytes(s);
    if (live + pend <= s->capacity) return 0;
    if (own > s->capacity - s->capacity / 64) {
        if (x->whole)
            return kvx_fail(KVX_ECAPACITY, "store: the batch's %llu sealed bytes reach the store's capacity of %llu "
                            "bytes, and it is published whole or not at all",
                            (unsigned long long)own, (unsigned long long)s->capacity);
        return kvx_st_flush_locked(s, x);
    }
    if (kvx_st_evict(s, pend) != 0) kvx_clear_error(); /* tidy-up, as after a flush */
    return 0;
}

static int st_put_one(kvx_store *s, kvx_store_batch *x, int kind, const st_query *q, const void *page,
                      const float *scales)
{
    st_open *o = &x->cur[kind];
    int rc;
    if (!o->w && (rc = kvx_st_active_take(s, x, kind, o)) < 0) {
        if (rc != KVX_EFULL) return rc;
        kvx_clear_error(); /* out of shard ids: a writer of its own, below, frees some */
    }
    if (!o->w) {
        uint32_t hint = x->reserve_hint;
        if (x->npend > hint) hint = x->npend > UINT32_MAX / 2 ? UINT32_MAX : (uint32_t)x->npend;
        rc = kvx_st_writer_begin(s, kvx_st_kind_flags(s, kind), NULL, o, hint);
        if (rc == KVX_EFULL) {
            /* out of shard ids: publish what is pending (a whole batch
             * waits for its caller's flush) and merge small shards */
            if (!x->whole && (rc = kvx_st_flush_locked(s, x))) return rc;
            kvx_st_compact(s, 1);
            rc = kvx_st_writer_begin(s, kvx_st_kind_flags(s, kind), NULL, o, hint);
            /* still none, with the store under its capacity (small
             * shards): a cache keeps the newest blocks, so the coldest
             * shards go, as they would at the capacity */
            if (rc == KVX_EFULL && kvx_st_evict_for_ids(s) > 0)
                rc = kvx_st_writer_begin(s, kvx_st_kind_flags(s, kind), NULL, o, hint);
        }
        if (rc) return rc;
    }
    uint32_t idx = kvx_shard_writer_count(o->w);
    kvx_entry_in e;
    memset(&e, 0, sizeof e);
    e.radix_block = (uint16_t)idx;
    e.token_count = s->keyed ? 1 : s->g.block_tokens;
    e.page = page;
    e.hash = s->keyed ? 0 : q->hash; /* a keyed page's hash is its key's */
    e.key = q->key;
    e.key_len = q->key_len;
    e.page_len = s->keyed ? q->page_len : 0;
    e.parent = kind == ST_KIND_LINEAGE ? q->parent : 0;
    e.tokens = kind == ST_KIND_LINEAGE ? q->toks : NULL;
    e.digest = kind == ST_KIND_LINEAGE ? q->digest : NULL;
    e.scales = kvx_quant_is_fp8(s->g.quant) && !s->keyed ? scales : NULL;
    if ((rc = kvx_shard_writer_add(o->w, &e))) return rc;
    s->wrote[ST_WROTE_PUT].pages += s->keyed ? q->page_len : s->page_bytes;
    if (!e.digest && !s->keyed) o->nunv++; /* keyed pages are not "unverified" blocks */
    st_query pq = *q;
    /* a plain block keeps no tokens or digest; a keyed page keeps its
     * key's SHA-256, which st_pending_find compares */
    if (kind != ST_KIND_LINEAGE) pq.toks = NULL, pq.digest = q->key ? q->digest : NULL;
    if ((rc = st_pending_add(s, x, &pq, KVX_COORD(o->byte, idx, 0), kind, o->gen))) return rc;
    if (x->reserve_hint > 0) x->reserve_hint--;
    if (o->active) {
        /* the active shard full: x's next blocks go to a file of its own;
         * its flush appends these and publishes that in one commit */
        if (idx + 1 >= o->cap || kvx_shard_writer_bytes(o->w) + s->page_bytes > s->target) {
            s->act.nunv_pending += o->nunv;
            memset(o, 0, sizeof *o);
        }
    } else if (idx + 1 >= o->cap || kvx_shard_writer_bytes(o->w) >= s->target) {
        rc = st_seal_cur(s, x, kind);
        if (!rc) rc = st_room_for_pending(s, x);
    }
    return rc;
}

/* Is q's block already published, sound? 1 yes, 0 no, <0 error. A
 * damaged copy is not "held": the put stores the block again. A held
 * block's shard is pinned (in x) until the flush that acknowledges the
 * put. */
void kvx_st_pin_view(kvx_store_batch *x, const kvx_view *v)
{
    uint64_t gen;
    const char *path = kvx_shard_path(v->shard), *slash = path ? strrchr(path, '/') : NULL;
    if (slash && kvx_st_parse_name(slash + 1, &gen)) kvx_st_pin(x, KVX_COORD_SHARD(v->coordinate), gen);
}

static int st_held(kvx_store *s, kvx_store_batch *x, kvx_cat_snap *snap, const st_query *q)
{
    kvx_view v;
    memset(&v, 0, sizeof v);
    int rc = kvx_st_lookup(s, snap, q, &v);
    if (rc == 0) {
        kvx_st_pin_view(x, &v);
        /* putting a held block is a use of it: an exact LRU would move
         * it to the front too (it may sit behind a block that was gone) */
        kvx_st_note(s, &v, 1, 0, 0);
        kvx_view_release(&v);
        return 1;
    }
    return rc == KVX_ENOTFOUND || rc == KVX_EPAGECRC || rc == KVX_ETRUNC ? 0 : rc;
}

/* A flush acknowledges every block put into its batch since the previous
 * one, so what a flush would acknowledge must fit the store at once: a put
 * that takes the batch over the capacity would keep only its tail (which
 * no prefix reaches) and the flush would acknowledge blocks already
 * evicted. Refused before anything is written. Call under wmu. */
static int st_fits(kvx_store *s, const kvx_store_batch *x, size_t n_blocks, const char *fn)
{
    uint64_t need;
    size_t total = n_blocks + x->batch_blocks;
    if (total < n_blocks || !kvx_mul64(&need, total, s->entry_bytes) || need > s->capacity) {
        if (x->batch_blocks)
            return kvx_fail(KVX_ECAPACITY,
                            "%s: %zu blocks, with the %zu put since the last flush, need %llu bytes, more than the "
                            "store's capacity of %llu bytes: flush first",
                            fn, n_blocks, x->batch_blocks, (unsigned long long)(total * s->entry_bytes),
                            (unsigned long long)s->capacity);
        return kvx_fail(KVX_ECAPACITY, "%s: %zu blocks need %llu bytes, more than the store's capacity of %llu bytes",
                        fn, n_blocks, (unsigned long long)(n_blocks * s->entry_bytes),
                        (unsigned long long)s->capacity);
    }
    return 0;
}

/* After a put into x: a failure in writing (dropped) discarded the batch's
 * unflushed blocks (kvx_st_discard_pending counted them); otherwise what
 * it added joins the batch, and every pending block is now one a
 * successful put added (a put that failed before writing added none). */
static void st_put_done(kvx_store_batch *x, size_t added, int dropped)
{
    if (dropped) return;
    x->batch_blocks += added;
    x->ok_pend = x->npend;
}

static int st_put(kvx_store *s, kvx_store_batch *x, const char *fn, const uint32_t *tokens, size_t n_tokens,
                  size_t first, const void *pages, size_t n_pages, const float *scales, size_t *out_new)
{
    if (out_new) *out_new = 0;
    uint32_t B = s->g.block_tokens;
    if (n_pages > n_tokens / B || first > n_tokens / B - n_pages)
        return kvx_fail(KVX_ETOKENS, "%s: n_pages %zu exceeds the %zu full blocks of n_tokens %zu", fn, n_pages,
                        n_tokens / B, n_tokens);
    if (n_pages && (!tokens || !pages)) return kvx_fail(KVX_EINVALID, "%s: tokens or pages is NULL", fn);
    if (n_pages == 0) return 0;
    pthread_mutex_lock(&s->wmu);
    int rc = st_fits(s, x, n_pages, fn);
    pthread_mutex_unlock(&s->wmu);
    if (rc) return rc;
    size_t nb = first + n_pages; /* blocks hashed: the chain starts at block 0 */
    uint64_t *h = malloc(nb * sizeof *h);
    uint8_t *held = calloc(n_pages, 1);
    uint8_t(*d)[KVX_DIGEST_BYTES] = malloc(nb * KVX_DIGEST_BYTES);
    if (!h || !held || !d) {
        free(h);
        free(held);
        free(d);
        return kvx_fail(-ENOMEM, "store: out of memory");
    }
    kvx_block_hashes(h, tokens, nb * B, B);
    kvx_prefix_digests(d, tokens, nb * B, B);
    pthread_mutex_lock(&s->wmu);
    kvx_cat_snap *snap;
    rc = kvx_cat_snap_begin(s->cat, &snap);
    if (!rc) {
        for (size_t k = 0; !rc && k < n_pages; k++) {
            size_t i = first + k;
            st_query q = {.hash = h[i], .parent = i ? h[i - 1] : 0, .toks = tokens + i * B, .digest = d[i]};
            int r = st_held(s, x, snap, &q);
            if (r < 0) rc = r;
            else held[k] = (uint8_t)r;
        }
        kvx_cat_snap_end(snap);
    }
    size_t added = 0, todo = 0;
    int dropped = 0;
    for (size_t k = 0; k < n_pages; k++) todo += !held[k];
    x->reserve_hint = todo > UINT32_MAX ? UINT32_MAX : (uint32_t)todo;
    for (size_t k = 0; !rc && k < n_pages; k++) {
        size_t i = first + k;
        st_query q = {.hash = h[i], .parent = i ? h[i - 1] : 0, .toks = tokens + i * B, .digest = d[i]};
        if (held[k] || st_pending_find(s, x, &q)) continue;
        rc = st_put_one(s, x, ST_KIND_LINEAGE, &q, (const uint8_t *)pages + k * s->page_bytes,
                        scales ? scales + k * s->nscales : NULL);
        if (rc) {
            kvx_st_discard_pending(x); /* a failed put drops its batch's unflushed blocks */
            dropped = 1;
        } else {
            added++;
        }
    }
    st_put_done(x, added, dropped);
    pthread_mutex_unlock(&s->wmu);
    free(h);
    free(held);
    free(d);
    if (out_new) *out_new = added;
    return rc;
}

int kvx_st_batch_put_from(kvx_store_batch *x, const uint32_t *tokens, size_t n_tokens, size_t first,
                          const void *pages, size_t n_pages, const float *scales, size_t *out_new)
{
    return st_put(x->s, x, "kvx_store_prefix (copy from the shared tier)", tokens, n_tokens, first, pages, n_pages,
                  scales, out_new);
}

static int st_put_env(kvx_store *s, kvx_store_batch *x, const char *fn, const void *env, size_t len,
                      const uint32_t *tokens, size_t n_tokens, size_t *out_new)
{
    if (out_new) *out_new = 0;
    if (!env) return kvx_fail(KVX_EINVALID, "%s: env is NULL", fn);
    if (n_tokens && !tokens) return kvx_fail(KVX_EINVALID, "%s: tokens is NULL", fn);
    kvx_geometry expect = s->g;
    kvx_envelope e;
    int rc;
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
            rc = kvx_fail(KVX_EHASH, "%s: block %u hash %016llx is not the hash of the tokens' block %u", fn, i,
                          (unsigned long long)blk.hash, i);
    }
    size_t nput = 0;
    for (uint32_t i = 0; !rc && i < e.n_blocks; i++) {
        kvx_envelope_block blk;
        if (kvx_envelope_block_at(&blk, &e, i) == 0 && blk.n_tokens == B && blk.hash) nput++;
    }
    if (!rc) {
        pthread_mutex_lock(&s->wmu);
        rc = st_fits(s, x, nput, fn);
        pthread_mutex_unlock(&s->wmu);
    }
    size_t added = 0;
    int dropped = 0;
    pthread_mutex_lock(&s->wmu);
    x->reserve_hint = e.n_blocks;
    for (uint32_t i = 0; !rc && i < e.n_blocks; i++) {
        kvx_envelope_block blk;
        if ((rc = kvx_envelope_block_at(&blk, &e, i))) break;
        if (blk.n_tokens != B || blk.hash == 0) continue;
        st_query q = {.hash = blk.hash, .parent = tokens && i ? h[i - 1] : 0, .toks = tokens ? tokens + (size_t)i * B : NULL, .digest = tokens ? d[i] : NULL};
        kvx_cat_snap *snap;
        if ((rc = kvx_cat_snap_begin(s->cat, &snap))) break;
        int held = st_held(s, x, snap, &q);
        kvx_cat_snap_end(snap);
        if (held < 0) {
            rc = held;
            break;
        }
        if (held || st_pending_find(s, x, &q)) continue;
        if ((rc = kvx_envelope_payload_to_page(page, sc, &s->g, &e, &blk))) break;
        rc = st_put_one(s, x, tokens ? ST_KIND_LINEAGE : ST_KIND_PLAIN, &q, page,
                        kvx_quant_is_fp8(s->g.quant) ? sc : NULL);
        if (rc) {
            kvx_st_discard_pending(x);
            dropped = 1;
        } else {
            added++;
        }
    }
    if (rc && !dropped && added) {
        /* a failure after this call wrote blocks (a held check, a payload
         * conversion): the put failed, so nothing of it may be acknowledged
         * by the next flush; as for any failed put, the batch goes */
        kvx_st_discard_pending(x);
        dropped = 1;
    }
    st_put_done(x, added, dropped);
    pthread_mutex_unlock(&s->wmu);
    free(h);
    free(d);
    free(page);
    free(sc);
    if (out_new) *out_new = added;
    return rc;
}

/* ------------------------------------------------------------------ */
/* Blocks one at a time, for the transfer core (transfer/) */

int kvx_st_ref_block(kvx_store_batch *x, const st_query *q)
{
    kvx_store *s = x->s;
    if (!s) return kvx_fail(KVX_EINVALID, "transfer: the stream's store was closed");
    pthread_mutex_lock(&s->wmu);
    kvx_cat_snap *snap;
    int rc = kvx_cat_snap_begin(s->cat, &snap);
    if (!rc) {
        rc = st_held(s, x, snap, q);
        kvx_cat_snap_end(snap);
    }
    pthread_mutex_unlock(&s->wmu);
    return rc;
}

int kvx_st_put_block(kvx_store_batch *x, const st_query *q, const void *page, const float *scales, int *out_added)
{
    kvx_store *s = x->s;
    *out_added = 0;
    if (!s) return kvx_fail(KVX_EINVALID, "transfer: the stream's store was closed");
    pthread_mutex_lock(&s->wmu);
    int rc = st_fits(s, x, 1, "kvx_xfer_stream_chunk");
    kvx_cat_snap *snap = NULL;
    int held = 0, dropped = 0;
    if (!rc && !(rc = kvx_cat_snap_begin(s->cat, &snap))) {
        held = st_held(s, x, snap, q);
        kvx_cat_snap_end(snap);
        if (held < 0) rc = held;
    }
    if (!rc && !held && !st_pending_find(s, x, q)) {
        /* blocks come one at a time: size a new shard's table for the
         * target shard size, not for this one block */
        if (!x->cur[ST_KIND_LINEAGE].w) {
            uint64_t want = s->target / (s->page_bytes ? s->page_bytes : 1) + 1;
            x->reserve_hint = want > UINT32_MAX ? UINT32_MAX : (uint32_t)want;
        }
        rc = st_put_one(s, x, ST_KIND_LINEAGE, q, page, scales);
        if (rc) {
            kvx_st_discard_pending(x);
            dropped = 1;
        } else {
            *out_added = 1;
        }
    }
    st_put_done(x, (size_t)*out_added, dropped);
    pthread_mutex_unlock(&s->wmu);
    return rc;
}

/* Keyed pages (store_keyed.c checked the arguments): as st_put, by key. A
 * key counts as held only when its page's CRC-32 holds now: a page damaged
 * since its shard's handle first checked it (kvx_store_keyed_read finds it
 * so, every time) is written again, never skipped for good. */
int kvx_st_put_keyed(kvx_store *s, kvx_store_batch *x, const kvx_key *keys, const void *const *pages,
                     const size_t *page_lens, size_t n, size_t *out_new)
{
    uint8_t(*d)[KVX_DIGEST_BYTES] = malloc((n ? n : 1) * KVX_DIGEST_BYTES);
    uint8_t *held = calloc(n ? n : 1, 1);
    if (!d || !held) {
        free(d);
        free(held);
        return kvx_fail(-ENOMEM, "store: out of memory");
    }
    for (size_t i = 0; i < n; i++) kvx_sha256(d[i], keys[i].bytes, keys[i].len);
#define ST_KEYED_Q(i)                                                                                          \
    {.hash = kvx_key_name(d[i], keys[i].bytes, keys[i].len), .digest = d[i], .key = keys[i].bytes,             \
     .key_len = (uint32_t)keys[i].len, .page_len = (uint32_t)page_lens[i], .verify_page = 1}
    pthread_mutex_lock(&s->wmu);
    int rc = st_fits(s, x, n, "kvx_store_keyed_put");
    kvx_cat_snap *snap;
    if (!rc && !(rc = kvx_cat_snap_begin(s->cat, &snap))) {
        for (size_t i = 0; !rc && i < n; i++) {
            st_query q = ST_KEYED_Q(i);
            int r = st_held(s, x, snap, &q);
            if (r < 0) rc = r;
            else held[i] = (uint8_t)r;
        }
        kvx_cat_snap_end(snap);
    }
    size_t added = 0, todo = 0;
    int dropped = 0;
    for (size_t i = 0; i < n; i++) todo += !held[i];
    x->reserve_hint = todo > UINT32_MAX ? UINT32_MAX : (uint32_t)todo;
    for (size_t i = 0; !rc && i < n; i++) {
        st_query q = ST_KEYED_Q(i);
        if (held[i] || st_pending_find(s, x, &q)) continue;
        rc = st_put_one(s, x, ST_KIND_PLAIN, &q, pages[i], NULL);
        if (rc) {
            kvx_st_discard_pending(x);
            dropped = 1;
        } else {
            added++;
        }
    }
#undef ST_KEYED_Q
    st_put_done(x, added, dropped);
    pthread_mutex_unlock(&s->wmu);
    free(d);
    free(held);
    if (out_new) *out_new = added;
    return rc;
}

kvx_store_batch *kvx_st_batch_of(kvx_store *s, kvx_store_batch *b, const char *fn, int *rc)
{
    *rc = b ? st_batch_check(b, fn) : 0;
    if (!*rc && b && b->s != s) *rc = kvx_fail(KVX_EINVALID, "%s: the batch belongs to another store", fn);
    return *rc ? NULL : b ? b : &s->own;
}

/* The flush's one edit: every sealed shard of x registered, every pending
 * block of x added (e holds what st_supersede removed), next_gen and
 * next_seq. Its commit is the catalog's part of the acknowledgement. */
static int st_publish(kvx_store *s, const kvx_store_batch *x, kvx_cat_edit *e)
{
    for (size_t i = 0; i < x->nsealed; i++) kvx_st_register(e, &x->sealed[i]);
    for (size_t i = 0; i < x->npend; i++) kvx_cat_edit_add_block(e, x->pend[i].coord, x->pend[i].hash, x->pend[i].gen);
    kvx_cat_edit_next_gen(e, s->next_gen);
    kvx_cat_edit_next_seq(e, s->next_seq);
    return kvx_cat_apply(s->cat, e); /* builder failures come back here */
}

int kvx_st_flush_locked(kvx_store *s, kvx_store_batch *x)
{
    int rc = s->act_stuck ? kvx_st_active_stuck(s) : 0;
    /* The commit, in order (DESIGN.md "The files are the whole truth"):
     *  1. the batch's writers are parked (unsealed) until now; the commit
     *     takes the next sequence number and every entry gets it, then
     *     each file is sealed (fsync) in staging/;
     *  2. the commit's mark staging/.<seq>.pending, durable (a commit of
     *     one file needs none), then the files move into shards/ (fsync):
     *     while the mark is there a crash leaves files recovery sets
     *     aside, never adopts;
     *  3. the mark goes, durably: from here the files alone say the batch
     *     committed (a recovery without the catalog adopts all of it);
     *  4. the catalog edit, then the answer. If the edit fails, the
     *     shards/ names go again (durably) and the flush fails. */
    for (int k = 0; k < 2 && !rc; k++) rc = st_seal_cur(s, x, k);
    /*  5. blocks in the active shard (store_active.c): after the files'
     *     commit, one journal record (its pages durable first) with the
     *     next number: the record is their acknowledgement, then the same
     *     catalog edit names them. */
    int act = kvx_st_active_pending(s, x);
    /* the catalog's commits lag the files from the first flush on: the
     * files are the acknowledgement (store_lag.c) */
    if (!rc && (x->nsealed || act) && !s->lagging) kvx_st_lag_start(s);
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    if (!rc && (x->nsealed || act)) {
        uint64_t seq = s->next_seq++;
        int linked = 0, marked = 0, tried = 0;
        if (x->nsealed) {
            if (s->keyed) rc = kvx_st_supersede(s, x, &e);
            if (!rc) rc = kvx_st_seal_parked(s, x->sealed, x->nsealed, seq);
            /* with an append too, a mark even for one file: recovery then
             * takes the files and the record as never acknowledged */
            if (!rc && !(rc = kvx_st_link_files(s, x->sealed, x->nsealed, seq, act, &marked))) linked = 1;
        }
        if (!rc && act) tried = 1, rc = kvx_st_active_append(s, x, seq, &e);
        if (!rc && x->nsealed) rc = kvx_st_unstage_files(s, seq, marked);
        if (!rc) rc = st_publish(s, x, &e);
        if (!rc) kvx_st_published(x->sealed, x->nsealed);
        /* an append tried, then the commit failed: the files go, the
         * mark stays until the record is cut from the active file */
        else if (linked) kvx_st_unpublish(s, x->sealed, x->nsealed, seq, marked && !tried);
        if (rc && tried) kvx_st_active_undo(s, x, seq, marked);
    }
    kvx_cat_edit_free(&e);
    int act_byte = act ? s->act.byte : -1;
    uint64_t act_gen = s->act.gen;
    kvx_st_active_release(s, x, rc == 0);
    if (rc) {
        kvx_st_discard_pending(x);
        return rc;
    }
    for (size_t i = 0; i < x->nsealed; i++) {
        /* (the registry names them now) the flush's own tidy-up below must
         * not take what it just acknowledged either: the new shards stay
         * pinned with the held */
        kvx_st_pin(x, x->sealed[i].byte, x->sealed[i].gen);
    }
    if (act_byte >= 0) kvx_st_pin(x, (uint32_t)act_byte, act_gen); /* sealed just now, maybe */
    if (s->tier && !x->no_tier) kvx_st_tier_published(s, x); /* write-behind (queued, not waited for) */
    st_pending_reset(x);
    /* acknowledged from here on: what follows only tidies up */
    kvx_st_usage_persist(s);
    kvx_st_drop_bad_shards(s, NULL);
    kvx_st_enforce_capacity(s);
    /* merge small shards when ids run low, or when their headers and
     * padding (about ST_SHARD_OVERHEAD each) would cost over 1 % of the
     * capacity (at least 4, at most ST_COMPACT_SMALL of them) */
    st_pshard sh[ST_SLOTS];
    kvx_st_pshards(sh, s, NULL);
    if (kvx_st_compact_due(sh, s->capacity, s->target)) kvx_st_compact(s, 0);
    /* pins stay until the caller's flush returns: a flush made inside a
     * put (shard ids running out, a batch near the capacity) publishes
     * blocks that only the caller's flush acknowledges */
    kvx_clear_error();
    return 0;
}

/* The caller's flush of x: 0 acknowledges every block put into x since
 * its last one. A failure since then that dropped blocks of successful
 * puts makes it KVX_EDROPPED (what was put after it is published all the
 * same); either way the batch starts afresh. */
static int st_flush(kvx_store *s, kvx_store_batch *x, const char *fn)
{
    pthread_mutex_lock(&s->wmu);
    int rc = kvx_st_flush_locked(s, x);
    if (!rc && x->lost)
        rc = kvx_fail(KVX_EDROPPED,
                      "%s: %llu block(s) put since the last flush were dropped, never stored, when a later call "
                      "on this batch failed (%s): put them again",
                      fn, (unsigned long long)x->lost, x->lost_why);
    x->lost = 0;
    x->lost_why[0] = '\0';
    x->batch_blocks = 0; /* acknowledged, or reported lost */
    st_pins_clear(x);
    pthread_mutex_unlock(&s->wmu);
    return rc;
}

KVX_API int kvx_store_put(kvx_store *s, const uint32_t *tokens, size_t n_tokens, const void *pages, size_t n_pages,
                          const float *scales, size_t *out_new)
{
    if (out_new) *out_new = 0;
    int rc = kvx_st_writer_check(s, "kvx_store_put");
    if (!rc) rc = kvx_st_kind_check(s, 0, "kvx_store_put");
    if (rc) return rc;
    return st_put(s, &s->own, "kvx_store_put", tokens, n_tokens, 0, pages, n_pages, scales, out_new);
}

KVX_API int kvx_store_put_envelope(kvx_store *s, const void *env, size_t len, const uint32_t *tokens, size_t n_tokens,
                                   size_t *out_new)
{
    if (out_new) *out_new = 0;
    int rc = kvx_st_writer_check(s, "kvx_store_put_envelope");
    if (!rc) rc = kvx_st_kind_check(s, 0, "kvx_store_put_envelope");
    if (rc) return rc;
    return st_put_env(s, &s->own, "kvx_store_put_envelope", env, len, tokens, n_tokens, out_new);
}

KVX_API int kvx_store_flush(kvx_store *s)
{
    int rc = kvx_st_writer_check(s, "kvx_store_flush");
    if (rc) return rc;
    return st_flush(s, &s->own, "kvx_store_flush");
}

/* ------------------------------------------------------------------ */
/* Caller batches */

static int st_batch_check(const kvx_store_batch *x, const char *fn)
{
    if (!x) return kvx_fail(KVX_EINVALID, "%s: batch is NULL", fn);
    if (!x->s)
        return kvx_fail(KVX_EINVALID, "%s: the batch's store was closed (only kvx_store_batch_destroy is allowed)",
                        fn);
    return 0;
}

void kvx_st_batch_link(kvx_store *s, kvx_store_batch *x)
{
    x->s = s;
    x->prev = NULL;
    x->next = s->batches;
    if (s->batches) s->batches->prev = x;
    s->batches = x;
}

static void st_batch_unlink(kvx_store *s, kvx_store_batch *x)
{
    if (x->prev) x->prev->next = x->next;
    else s->batches = x->next;
    if (x->next) x->next->prev = x->prev;
    x->prev = x->next = NULL;
}

void kvx_st_batch_free_bufs(kvx_store_batch *x)
{
    for (int k = 0; k < 2; k++)
        if (x->cur[k].w) kvx_shard_writer_abort(x->cur[k].w);
    free(x->sealed);
    free(x->pend);
    free(x->ptok);
    free(x->ptab);
}

/* Close: every batch's unflushed blocks dropped (never acknowledged), the
 * caller's batches detached (they then take only destroy). Under wmu. */
void kvx_st_batches_close(kvx_store *s)
{
    while (s->batches) {
        kvx_store_batch *x = s->batches;
        kvx_st_discard_pending(x);
        st_batch_unlink(s, x);
        if (x != &s->own) x->s = NULL;
    }
}

KVX_API int kvx_store_batch_create(kvx_store_batch **out, kvx_store *s)
{
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_store_batch_create: out is NULL");
    *out = NULL;
    int rc = kvx_st_writer_check(s, "kvx_store_batch_create");
    if (rc) return rc;
    kvx_store_batch *x = calloc(1, sizeof *x);
    if (!x) return kvx_fail(-ENOMEM, "store: out of memory");
    pthread_mutex_lock(&s->wmu);
    kvx_st_batch_link(s, x);
    pthread_mutex_unlock(&s->wmu);
    *out = x;
    return 0;
}

KVX_API int kvx_store_batch_put(kvx_store_batch *b, const uint32_t *tokens, size_t n_tokens, const void *pages,
                                size_t n_pages, const float *scales, size_t *out_new)
{
    if (out_new) *out_new = 0;
    int rc = st_batch_check(b, "kvx_store_batch_put");
    if (!rc) rc = kvx_st_kind_check(b->s, 0, "kvx_store_batch_put");
    if (rc) return rc;
    return st_put(b->s, b, "kvx_store_batch_put", tokens, n_tokens, 0, pages, n_pages, scales, out_new);
}

KVX_API int kvx_store_batch_put_envelope(kvx_store_batch *b, const void *env, size_t len, const uint32_t *tokens,
                                         size_t n_tokens, size_t *out_new)
{
    if (out_new) *out_new = 0;
    int rc = st_batch_check(b, "kvx_store_batch_put_envelope");
    if (!rc) rc = kvx_st_kind_check(b->s, 0, "kvx_store_batch_put_envelope");
    if (rc) return rc;
    return st_put_env(b->s, b, "kvx_store_batch_put_envelope", env, len, tokens, n_tokens, out_new);
}

KVX_API int kvx_store_batch_flush(kvx_store_batch *b)
{
    int rc = st_batch_check(b, "kvx_store_batch_flush");
    if (rc) return rc;
    return st_flush(b->s, b, "kvx_store_batch_flush");
}

KVX_API void kvx_store_batch_destroy(kvx_store_batch *b)
{
    if (!b) return;
    kvx_store *s = b->s;
    if (s) {
        pthread_mutex_lock(&s->wmu);
        kvx_st_discard_pending(b); /* never acknowledged: the files go */
        st_batch_unlink(s, b);
        pthread_mutex_unlock(&s->wmu);
    }
    kvx_st_batch_free_bufs(b);
    free(b);
}
