/*
 * store_write.c - the store's write side: put (dedupe against the index and
 * the pending batch, pages into an open shard writer in staging/), flush
 * (seal, rename into shards/, fsync the directory, then ONE LMDB
 * transaction publishes every pending block: the commit is the
 * acknowledgement), eviction (whole shards, least recently used first, hot
 * blocks carried forward into a new shard), compaction (small or
 * mostly-orphaned shards merged into new ones) and reindex.
 *
 * Every mutation follows one rule: new files are complete and fsynced
 * before the transaction that names them commits; files the index stops
 * naming are unlinked only after that commit. A crash at any instant leaves
 * either the old or the new index, and recovery deletes files neither
 * names. All of this runs under the handle's writer mutex, in the one
 * process that holds the store's flock.
 */
#include "common/os.h"
#include "store_internal.h"
#include "common/digest.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

uint32_t kvx_st_count_unverified(const kvx_shard *sh)
{
    uint32_t n = 0, cnt = kvx_shard_get_info(sh)->num_blocks;
    for (uint32_t i = 0; i < cnt; i++) {
        kvx_entry e;
        if (kvx_shard_entry(&e, sh, i) == 0 && e.hash && !e.digest) n++;
    }
    return n;
}

/* A maintenance pass that could not see every shard and changed nothing. */
#define ST_PASS_SKIPPED 1

/* ------------------------------------------------------------ pending set */

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

static void st_pin(kvx_store *s, uint32_t b, uint64_t gen)
{
    s->pinned[b] = 1;
    s->pin_gen[b] = gen;
}

static void st_unlink_shard(kvx_store *s, uint64_t gen)
{
    char name[32];
    kvx_st_shard_name(name, gen);
    kvx_os.unlinkat(s->shardsfd, name, 0);
}

/* Drops every unflushed block: open writers are aborted, sealed but
 * unpublished files deleted. They were never acknowledged. */
void kvx_st_discard_pending(kvx_store *s)
{
    for (int k = 0; k < 2; k++) {
        if (s->cur[k].w) kvx_shard_writer_abort(s->cur[k].w);
        memset(&s->cur[k], 0, sizeof s->cur[k]);
    }
    for (size_t i = 0; i < s->nsealed; i++) st_unlink_shard(s, s->sealed[i].gen);
    s->nsealed = 0;
    s->npend = 0;
    s->nptok = 0;
    for (size_t i = 0; i < s->ptab_n; i++) s->ptab[i] = SIZE_MAX;
    st_pins_clear(s);
    s->batch_blocks = 0;
}

/* ----------------------------------------------------- shard ids, writers */

static int st_alloc_byte(kvx_store *s, const uint8_t *extra, uint8_t *out)
{
    uint8_t used[ST_SLOTS];
    memcpy(used, s->reg_live, sizeof used);
    for (int k = 0; k < 2; k++)
        if (s->cur[k].w) used[s->cur[k].byte] = 1;
    for (size_t i = 0; i < s->nsealed; i++) used[s->sealed[i].byte] = 1;
    for (int b = 0; b < ST_SLOTS; b++) {
        if (!used[b] && !(extra && extra[b])) {
            *out = (uint8_t)b;
            return 0;
        }
    }
    return kvx_fail(KVX_EFULL, "store %s: all 256 shard ids are in use (a coordinate's shard byte); "
                               "run gc or create the store with a larger shard_bytes", s->dir);
}

static uint32_t st_kind_flags(const kvx_store *s, int kind)
{
    uint32_t f = KVX_FLAG_HASHES;
    if (kind == ST_KIND_LINEAGE) f |= KVX_FLAG_LINEAGE | KVX_FLAG_DIGEST;
    if (s->g.quant != KVX_QUANT_FP16) f |= KVX_FLAG_SCALES;
    return f;
}

/* reserve: table entries to reserve. A shard's tables are sized when it is
 * created, so a writer reserves what it is about to receive (the put's
 * blocks, at least the batch so far), not the shard maximum: small flushes
 * then seal tight files instead of files padded with empty tables. */
static int st_writer_begin(kvx_store *s, uint32_t flags, const uint8_t *extra, st_open *o, uint32_t reserve)
{
    uint8_t b = 0;
    int rc = st_alloc_byte(s, extra, &b);
    if (rc) return rc;
    uint64_t gen = s->next_gen++;
    char name[32];
    kvx_st_shard_name(name, gen);
    /* the writer's temporary file lives in staging/ (emptied by recovery)
     * and the seal renames it into shards/: one rename and one fsync of
     * shards/ per shard (the staging/ side needs none: a leftover name
     * there is only removed at recovery) */
    size_t len = strlen(s->shards_path) + 1 + strlen(name) + 1;
    char *path = malloc(len);
    if (!path) return kvx_fail(-ENOMEM, "store: out of memory");
    snprintf(path, len, "%s/%s", s->shards_path, name);
    kvx_shard_writer_options opts = KVX_SHARD_WRITER_OPTIONS_INIT;
    opts.geometry = s->g;
    opts.shard_id = b;
    if (reserve < 8) reserve = 8;
    if (reserve > s->max_entries) reserve = s->max_entries;
    opts.max_entries = reserve;
    opts.flags = flags;
    opts.staging_dir = s->staging_path;
    rc = kvx_shard_writer_create(&o->w, path, &opts);
    free(path);
    if (rc) return rc;
    o->byte = b;
    o->gen = gen;
    o->flags = flags;
    o->cap = reserve;
    o->nunv = 0;
    return 0;
}

/* Seals o's shard (kvx_shard_writer_seal: fsync, rename into shards/,
 * fsync of shards/), so it is durable before any transaction names it. */
static int st_writer_seal(kvx_store *s, st_open *o, st_sealed *out)
{
    uint32_t n = kvx_shard_writer_count(o->w);
    int rc = kvx_shard_writer_seal(o->w);
    o->w = NULL;
    char name[32];
    kvx_st_shard_name(name, o->gen);
    if (rc) return rc; /* the writer left nothing behind */
    struct stat st;
    if (fstatat(s->shardsfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        rc = -errno;
        kvx_os.unlinkat(s->shardsfd, name, 0);
        return kvx_fail(rc, "store: stat shards/%s: %s", name, strerror(-rc));
    }
    out->byte = o->byte;
    out->gen = o->gen;
    out->flags = o->flags;
    out->n = n;
    out->bytes = (uint64_t)st.st_size;
    out->last_use = kvx_st_now_ns();
    out->nunv = o->nunv;
    return 0;
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
    int rc = st_writer_seal(s, o, &x);
    if (rc) return rc;
    return st_sealed_push(s, &x);
}

/* ------------------------------------------------------------------ put */

static int st_evict(kvx_store *s, uint64_t pending);

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
        if (s->reg_live[b]) live += s->reg[b].file_bytes;
    for (size_t i = 0; i < s->nsealed; i++) pend += s->sealed[i].bytes;
    if (live + pend <= s->capacity) return 0;
    if (pend > s->capacity - s->capacity / 64) return kvx_st_flush_locked(s);
    if (st_evict(s, pend) != 0) kvx_clear_error(); /* tidy-up, as after a flush */
    return 0;
}

static int st_put_one(kvx_store *s, int kind, const st_query *q, const void *page, const float *scales)
{
    st_open *o = &s->cur[kind];
    int rc;
    if (!o->w) {
        uint32_t hint = s->reserve_hint;
        if (s->npend > hint) hint = s->npend > UINT32_MAX / 2 ? UINT32_MAX : (uint32_t)s->npend;
        rc = st_writer_begin(s, st_kind_flags(s, kind), NULL, o, hint);
        if (rc == KVX_EFULL) {
            /* out of shard ids: publish what is pending and merge small shards */
            if ((rc = kvx_st_flush_locked(s))) return rc;
            kvx_st_compact(s, 1);
            rc = st_writer_begin(s, st_kind_flags(s, kind), NULL, o, hint);
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

/* A shard holding a block a pending put relies on (see pinned). */
static int st_is_pinned(const kvx_store *s, uint32_t b) { return s->pinned[b] && s->pin_gen[b] == s->reg[b].gen; }

/* Is q's block already published, sound? 1 yes, 0 no, <0 error. A
 * damaged copy is not "held": the put stores the block again. A held
 * block's shard is pinned until the flush that acknowledges the put. */
static int st_held(kvx_store *s, MDB_txn *txn, const st_query *q)
{
    kvx_view v;
    memset(&v, 0, sizeof v);
    int rc = kvx_st_lookup(s, txn, q, &v);
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

static int st_writer_check(kvx_store *s, const char *fn)
{
    if (!s) return kvx_fail(KVX_EINVALID, "%s: store is NULL", fn);
    if (!s->writer) return kvx_fail(KVX_EINVALID, "%s: store was opened KVX_STORE_READONLY", fn);
    return 0;
}

KVX_API int kvx_store_put(kvx_store *s, const uint32_t *tokens, size_t n_tokens, const void *pages, size_t n_pages,
                          const float *scales, size_t *out_new)
{
    if (out_new) *out_new = 0;
    int rc = st_writer_check(s, "kvx_store_put");
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
    MDB_txn *txn;
    rc = kvx_idx_read_begin(s->ix, &txn);
    if (!rc) {
        for (size_t i = 0; !rc && i < n_pages; i++) {
            st_query q = {h[i], i ? h[i - 1] : 0, tokens + i * B, d[i]};
            int r = st_held(s, txn, &q);
            if (r < 0) rc = r;
            else held[i] = (uint8_t)r;
        }
        kvx_idx_read_end(s->ix, txn);
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
    int rc = st_writer_check(s, "kvx_store_put_envelope");
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
        MDB_txn *txn;
        if ((rc = kvx_idx_read_begin(s->ix, &txn))) break;
        int held = st_held(s, txn, &q);
        kvx_idx_read_end(s->ix, txn);
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

/* ---------------------------------------------------------------- flush */

typedef struct st_publish {
    kvx_store *s;
    const st_sealed *sealed;
    size_t nsealed;
    const st_pblock *pend;
    size_t npend;
} st_publish;

int kvx_st_register(MDB_txn *txn, kvx_index *ix, const st_sealed *x)
{
    uint32_t b = x->byte;
    kvx_idx_shard rec = {x->gen, x->bytes, kvx_st_now_ns(), x->n, x->flags, 0, x->nunv};
    int rc = kvx_idx_put_shard(txn, ix, b, &rec);
    if (rc) return rc;
    size_t nbytes = (x->n + 7) / 8;
    uint8_t *bits = calloc(1, nbytes + 1);
    if (!bits) return ENOMEM;
    kvx_idx_usage u = {x->gen, x->last_use, 0, x->n, 0};
    rc = kvx_idx_put_usage(txn, ix, b, &u, bits, nbytes);
    free(bits);
    return rc;
}

static int st_publish_body(MDB_txn *txn, void *ctx)
{
    st_publish *p = ctx;
    kvx_index *ix = p->s->ix;
    int rc;
    for (size_t i = 0; i < p->nsealed; i++)
        if ((rc = kvx_st_register(txn, ix, &p->sealed[i]))) return rc;
    for (size_t i = 0; i < p->npend; i++)
        if ((rc = kvx_idx_add_block(txn, ix, p->pend[i].coord, p->pend[i].hash, p->pend[i].gen))) return rc;
    return kvx_idx_put_u64(txn, ix->meta, "next_gen", p->s->next_gen);
}

static void st_mirror_add(kvx_store *s, const st_sealed *x)
{
    kvx_idx_shard rec = {x->gen, x->bytes, kvx_st_now_ns(), x->n, x->flags, 0, x->nunv};
    s->reg[x->byte] = rec;
    s->reg_live[x->byte] = 1;
}

int kvx_st_flush_locked(kvx_store *s)
{
    int rc = 0;
    /* each seal fsyncs its file, renames it and fsyncs shards/ (inside
     * kvx_shard_writer_seal), so every sealed file is durable here */
    for (int k = 0; k < 2 && !rc; k++) rc = st_seal_cur(s, k);
    if (!rc && s->nsealed) {
        st_publish p = {s, s->sealed, s->nsealed, s->pend, s->npend};
        rc = kvx_idx_write(s->ix, st_publish_body, &p);
    }
    if (rc) {
        kvx_st_discard_pending(s);
        return rc;
    }
    for (size_t i = 0; i < s->nsealed; i++) {
        st_mirror_add(s, &s->sealed[i]);
        /* the flush's own tidy-up below must not take what it just
         * acknowledged either: the new shards stay pinned with the held */
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
    int live = 0, small = 0;
    for (int b = 0; b < ST_SLOTS; b++) {
        live += s->reg_live[b];
        small += s->reg_live[b] && s->reg[b].file_bytes < s->target / 2;
    }
    uint64_t small_max = s->capacity / 100 / ST_SHARD_OVERHEAD;
    if (small_max < 4) small_max = 4;
    if (small_max > ST_COMPACT_SMALL) small_max = ST_COMPACT_SMALL;
    if (live > ST_COMPACT_AT || (uint64_t)small >= small_max) kvx_st_compact(s, 0);
    /* pins stay until kvx_store_flush returns: a flush made inside a put
     * (shard ids running out, a batch near the capacity) publishes blocks
     * that only the caller's flush acknowledges */
    kvx_clear_error();
    return 0;
}

KVX_API int kvx_store_flush(kvx_store *s)
{
    int rc = st_writer_check(s, "kvx_store_flush");
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

/* ---------------------------------------------------- dropping shards */

typedef struct st_drop {
    kvx_store *s;
    const uint8_t *victims; /* shard bytes to unregister */
    const st_sealed *added;
    size_t nadded;
    const struct st_move *moves;
    size_t nmoves;
    int evict, compact, damaged;
} st_drop;

typedef struct st_move {
    uint8_t digest[KVX_DIGEST_BYTES]; /* all zero: unverified */
    uint32_t src_coord;
    uint64_t src_gen, hash, parent;
    uint64_t last_use;
    uint32_t new_coord; /* 0 with new_gen 0: dropped (bad page) */
    uint64_t new_gen;
} st_move;

static int st_drop_body(MDB_txn *txn, void *ctx)
{
    st_drop *d = ctx;
    kvx_index *ix = d->s->ix;
    kvx_idx_stats st;
    int rc = kvx_idx_get_stats(txn, ix, &st);
    if (rc) return rc;
    for (size_t i = 0; i < d->nadded; i++)
        if ((rc = kvx_st_register(txn, ix, &d->added[i]))) return rc;
    for (size_t i = 0; i < d->nmoves; i++) {
        const st_move *m = &d->moves[i];
        if (!m->new_gen) continue;
        if ((rc = kvx_idx_del_block(txn, ix, m->src_coord, m->hash, m->src_gen))) return rc;
        if ((rc = kvx_idx_add_block(txn, ix, m->new_coord, m->hash, m->new_gen))) return rc;
    }
    uint64_t removed = 0, nv = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!d->victims[b]) continue;
        uint64_t r = 0;
        if ((rc = kvx_idx_del_shard_blocks(txn, ix, b, &r))) return rc;
        removed += r;
        nv++;
        MDB_val k = {4, &b};
        rc = mdb_del(txn, ix->shards, &k, NULL);
        if (rc && rc != MDB_NOTFOUND) return rc;
        rc = mdb_del(txn, ix->usage, &k, NULL);
        if (rc && rc != MDB_NOTFOUND) return rc;
    }
    if (d->evict) st.evictions += nv;
    if (d->damaged) st.dropped_shards += nv;
    if (d->compact) st.compactions++;
    st.evicted_blocks += removed;
    if ((rc = kvx_idx_put_stats(txn, ix, &st))) return rc;
    return kvx_idx_put_u64(txn, ix->meta, "next_gen", d->s->next_gen);
}

/* Is shard (b, gen) sound: it opens and every page passes its CRC? Only
 * sound blocks are ever deleted (DESIGN.md rule 2). 1 sound, 0 damaged
 * (why filled), -1 cannot tell now (a passing failure). */
static int st_sound(kvx_store *s, uint32_t b, uint64_t gen, char *why, size_t cap)
{
    char name[32], path[4096];
    kvx_st_shard_name(name, gen);
    snprintf(path, sizeof path, "%s/%s", s->shards_path, name);
    kvx_shard *sh = NULL;
    int rc = kvx_shard_open(&sh, path, 0);
    if (rc == -ENOENT) return 1; /* nothing left to delete */
    if (rc && st_open_transient(rc)) return -1;
    if (rc) {
        snprintf(why, cap, "cannot be validated: %s (%s)", kvx_last_error(), kvx_err_name(rc));
        return 0;
    }
    uint32_t bad = 0;
    rc = kvx_shard_verify(sh, &bad, NULL, NULL);
    kvx_shard_close(sh);
    if (rc && bad) {
        snprintf(why, cap, "%u damaged or missing page(s) (shard %u); its good blocks were %s", bad, b,
                 "copied or evicted");
        return 0;
    }
    return rc && st_open_transient(rc) ? -1 : 1;
}

/* After a committed drop: mirror, caches, files. Evicted and compacted
 * shards are deleted only when sound; a damaged one (and every shard
 * dropped as damaged) moves to quarantine/ instead; one that cannot be
 * judged now stays in shards/, unregistered: the next writer's recovery
 * adopts or quarantines it. */
static void st_after_drop(kvx_store *s, const uint8_t *victims, const st_sealed *added, size_t nadded,
                          const char *damaged)
{
    for (int b = 0; b < ST_SLOTS; b++) {
        if (!victims[b]) continue;
        uint64_t gen = s->reg[b].gen;
        s->reg_live[b] = 0;
        kvx_st_cache_drop(s, (uint32_t)b);
        char name[32], why[600];
        snprintf(why, sizeof why, "%s", damaged ? damaged : "");
        kvx_st_shard_name(name, gen);
        int sound = damaged ? 0 : st_sound(s, (uint32_t)b, gen, why, sizeof why);
        if (sound == 1) st_unlink_shard(s, gen); /* views keep their mapping alive */
        else if (sound == 0 && kvx_st_quarantine(s, name, why) != 0) kvx_clear_error();
    }
    for (size_t i = 0; i < nadded; i++) st_mirror_add(s, &added[i]);
}

int kvx_st_drop_bad_shards(kvx_store *s)
{
    uint8_t victims[ST_SLOTS] = {0};
    int any = 0;
    pthread_rwlock_rdlock(&s->cache_lock);
    for (int b = 0; b < ST_SLOTS; b++) {
        if (s->reg_live[b] && s->cache[b].bad && s->cache[b].gen == s->reg[b].gen) {
            victims[b] = 1;
            any = 1;
        }
    }
    pthread_rwlock_unlock(&s->cache_lock);
    if (!any) return 0;
    st_drop d = {s, victims, NULL, 0, NULL, 0, 0, 0, 1};
    int rc = kvx_idx_write(s->ix, st_drop_body, &d);
    if (rc) return rc;
    int n = 0;
    for (int b = 0; b < ST_SLOTS; b++) n += victims[b];
    s->dropped += (uint64_t)n;
    st_after_drop(s, victims, NULL, 0, "could not be opened or validated when it was first used (see kvx store verify)");
    kvx_fail(KVX_ECORRUPT, "store %s: %d damaged shard(s) moved to quarantine/", s->dir, n);
    return 0;
}

/* ---------------------------------------------------------------- rewrite */

static void st_unlink_sealed(kvx_store *s, st_sealed *v, size_t n)
{
    for (size_t i = 0; i < n; i++) st_unlink_shard(s, v[i].gen);
}

/* Copies the moves' blocks into new sealed shards (in shards/, not yet
 * published) of the given flags. Pages are CRC-checked on the way: a bad
 * page is not carried (its move gets new_gen 0 and it leaves the index
 * with its shard). */
static int st_rewrite(kvx_store *s, st_move *mv, size_t n, uint32_t flags, uint8_t *busy, st_sealed **io_out,
                      size_t *io_n)
{
    st_open o = {0};
    int rc = 0;
    uint64_t last_use = 0;
    size_t first_out = *io_n;
    for (size_t i = 0; i < n && !rc; i++) {
        st_move *m = &mv[i];
        m->new_gen = 0;
        kvx_shard *sh = kvx_st_shard_get(s, KVX_COORD_SHARD(m->src_coord), m->src_gen);
        if (!sh) {
            rc = kvx_fail(-EIO, "store: shard %u cannot be opened to copy its blocks", KVX_COORD_SHARD(m->src_coord));
            break;
        }
        uint32_t idx = KVX_COORD_BLOCK(m->src_coord);
        kvx_entry e;
        const void *page;
        if ((rc = kvx_shard_entry(&e, sh, idx))) {
            kvx_shard_close(sh);
            break;
        }
        if (kvx_shard_page(&page, sh, idx, 1)) { /* a damaged page is not copied */
            kvx_shard_close(sh);
            continue;
        }
        if (!o.w && (rc = st_writer_begin(s, flags, busy, &o, n - i > UINT32_MAX ? UINT32_MAX : (uint32_t)(n - i)))) {
            kvx_shard_close(sh);
            break;
        }
        busy[o.byte] = 1;
        uint32_t ni = kvx_shard_writer_count(o.w);
        kvx_entry_in in;
        memset(&in, 0, sizeof in);
        in.radix_block = (uint16_t)ni;
        in.token_count = e.token_count;
        in.page = page;
        in.hash = e.hash;
        in.parent = e.parent;
        in.tokens = (flags & KVX_FLAG_LINEAGE) ? e.tokens : NULL;
        in.digest = (flags & KVX_FLAG_DIGEST) && !kvx_digest_is_zero(m->digest) ? m->digest : NULL;
        in.scales = (flags & KVX_FLAG_SCALES) ? e.scales : NULL;
        rc = kvx_shard_writer_add(o.w, &in);
        kvx_shard_close(sh);
        if (rc) break;
        if (!in.digest) o.nunv++;
        m->new_coord = KVX_COORD(o.byte, ni, 0);
        m->new_gen = o.gen;
        if (m->last_use > last_use) last_use = m->last_use;
        if (ni + 1 >= o.cap || kvx_shard_writer_bytes(o.w) >= s->target || i + 1 == n) {
            st_sealed x;
            st_sealed *arr = realloc(*io_out, (*io_n + 1) * sizeof *arr);
            if (!arr) {
                rc = kvx_fail(-ENOMEM, "store: out of memory");
                break;
            }
            *io_out = arr;
            if ((rc = st_writer_seal(s, &o, &x))) break;
            x.last_use = last_use ? last_use : x.last_use;
            arr[(*io_n)++] = x;
            last_use = 0;
        }
    }
    if (!rc && o.w) {
        st_sealed x;
        st_sealed *arr = realloc(*io_out, (*io_n + 1) * sizeof *arr);
        if (!arr) rc = kvx_fail(-ENOMEM, "store: out of memory");
        else {
            *io_out = arr;
            if (!(rc = st_writer_seal(s, &o, &x))) {
                x.last_use = last_use ? last_use : x.last_use;
                arr[(*io_n)++] = x;
            }
        }
    }
    if (rc) {
        if (o.w) kvx_shard_writer_abort(o.w);
        st_unlink_sealed(s, *io_out + first_out, *io_n - first_out);
        *io_n = first_out;
    }
    return rc;
}

/* Per-shard last use and referenced bits, as persisted. */
typedef struct st_usage_view {
    uint64_t last_use;
    uint8_t *bits;
    uint32_t nbits;
} st_usage_view;

static int st_usage_read(kvx_store *s, st_usage_view *uv)
{
    memset(uv, 0, ST_SLOTS * sizeof *uv);
    MDB_txn *txn;
    int rc = kvx_idx_read_begin(s->ix, &txn);
    if (rc) return rc;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!s->reg_live[b]) continue;
        uv[b].last_use = s->reg[b].created_ns;
        /* usage is advisory: a missing or damaged record only loses recency */
        kvx_idx_usage u;
        size_t nb = 0;
        uint8_t *bits = malloc(65536 / 8 + 1);
        if (!bits) continue;
        if (kvx_idx_get_usage(txn, s->ix, b, &u, bits, 65536 / 8, &nb) != 0 || u.gen != s->reg[b].gen) {
            free(bits);
            continue;
        }
        if (u.last_use_ns > uv[b].last_use) uv[b].last_use = u.last_use_ns;
        if (nb) {
            uv[b].bits = bits;
            uv[b].nbits = u.n_bits;
        } else {
            free(bits);
        }
    }
    kvx_idx_read_end(s->ix, txn);
    return 0;
}

static void st_usage_free(st_usage_view *uv)
{
    for (int b = 0; b < ST_SLOTS; b++) free(uv[b].bits);
}

static int st_cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Is parent present after the operation? In a kept shard, or moved. */
static int st_parent_kept(kvx_store *s, MDB_txn *txn, uint64_t parent, const uint8_t *victims, const uint64_t *moved,
                          size_t nmoved)
{
    if (parent == 0) return 1;
    if (moved && bsearch(&parent, moved, nmoved, sizeof *moved, st_cmp_u64)) return 1;
    MDB_val k = {8, &parent}, v;
    MDB_cursor *cur;
    if (mdb_cursor_open(txn, s->ix->hash, &cur) != 0) return 0;
    int kept = 0;
    int rc = mdb_cursor_get(cur, &k, &v, MDB_SET);
    while (rc == 0) {
        kvx_idx_loc loc;
        uint64_t key;
        if (kvx_idx_dec_loc(&k, &v, &key, &loc) == 0 && !victims[KVX_COORD_SHARD(loc.coord)]) {
            kept = 1;
            break;
        }
        rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT_DUP);
    }
    mdb_cursor_close(cur);
    return kept;
}

/* Drops moves whose parent will be gone (they would be orphans), until
 * nothing changes. */
static size_t st_filter_orphans(kvx_store *s, st_move *mv, size_t n, const uint8_t *victims)
{
    MDB_txn *txn;
    if (kvx_idx_read_begin(s->ix, &txn)) return 0;
    uint64_t *moved = malloc((n + 1) * sizeof *moved);
    for (int pass = 0; pass < 8 && moved; pass++) {
        for (size_t i = 0; i < n; i++) moved[i] = mv[i].hash;
        qsort(moved, n, sizeof *moved, st_cmp_u64);
        size_t w = 0;
        for (size_t i = 0; i < n; i++)
            if (st_parent_kept(s, txn, mv[i].parent, victims, moved, n)) mv[w++] = mv[i];
        int changed = w != n;
        n = w;
        if (!changed) break;
    }
    if (!moved) n = 0;
    free(moved);
    kvx_idx_read_end(s->ix, txn);
    return n;
}

/* Appends the entries of shard b as moves, each with its recency r[i];
 * with hot_after, only entries used after it (r[i] > hot_after). */
static int st_collect(kvx_store *s, uint32_t b, const uint64_t *r, int hot_only, uint64_t hot_after, st_move **mv,
                      size_t *n, size_t *cap, size_t limit)
{
    kvx_shard *sh = kvx_st_shard_get(s, b, s->reg[b].gen);
    if (!sh) return kvx_fail(-EIO, "store: shard %u cannot be opened to copy its blocks", b);
    uint32_t cnt = kvx_shard_get_info(sh)->num_blocks;
    for (uint32_t i = 0; i < cnt && *n < limit; i++) {
        uint64_t ri = r && i < s->reg[b].n_entries ? r[i] : s->reg[b].created_ns;
        if (hot_only && ri <= hot_after) continue;
        kvx_entry e;
        if (kvx_shard_entry(&e, sh, i) || !e.hash) continue;
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 256;
            st_move *p = realloc(*mv, nc * sizeof *p);
            if (!p) {
                kvx_shard_close(sh);
                return kvx_fail(-ENOMEM, "store: out of memory");
            }
            *mv = p;
            *cap = nc;
        }
        st_move *m = &(*mv)[(*n)++];
        memset(m, 0, sizeof *m);
        m->src_coord = e.coordinate;
        m->src_gen = s->reg[b].gen;
        m->hash = e.hash;
        m->parent = e.parent;
        if (e.digest) memcpy(m->digest, e.digest, KVX_DIGEST_BYTES);
        m->last_use = ri;
    }
    kvx_shard_close(sh);
    return 0;
}

/* Per-entry recency of every live shard (ns): the writer's per-entry last
 * use where it has one (its own lookups, carried and merged blocks), else
 * the shard's last use for an entry whose referenced bit is set (lookups
 * of other processes, or before a restart), else the shard's creation. */
static int st_recency_build(kvx_store *s, const st_usage_view *uv, uint64_t **r)
{
    int rc = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++) r[b] = NULL;
    pthread_mutex_lock(&s->use_mu);
    for (uint32_t b = 0; b < ST_SLOTS && !rc; b++) {
        if (!s->reg_live[b]) continue;
        uint32_t n = s->reg[b].n_entries;
        r[b] = malloc(((size_t)n + 1) * sizeof **r);
        if (!r[b]) {
            rc = kvx_fail(-ENOMEM, "store: out of memory");
            break;
        }
        const st_rec *rec = &s->rec[b];
        int have = rec->gen == s->reg[b].gen && rec->last && rec->n == n;
        for (uint32_t i = 0; i < n; i++) {
            uint64_t x = s->reg[b].created_ns;
            if (uv[b].bits && i < uv[b].nbits && (uv[b].bits[i / 8] & (1u << (i % 8))) && uv[b].last_use > x)
                x = uv[b].last_use;
            if (have && rec->last[i]) x = rec->last[i];
            r[b][i] = x;
        }
    }
    pthread_mutex_unlock(&s->use_mu);
    return rc;
}

static void st_recency_free(uint64_t **r)
{
    for (int b = 0; b < ST_SLOTS; b++) free(r[b]);
}

/* After a committed rewrite: the new shards' entries keep the recency
 * their blocks had. */
static void st_rec_from_moves(kvx_store *s, const st_move *mv, size_t n, const st_sealed *added, size_t nadded)
{
    pthread_mutex_lock(&s->use_mu);
    for (size_t j = 0; j < nadded; j++) {
        uint64_t *last = kvx_st_rec_get(s, added[j].byte, added[j].gen, added[j].n);
        if (!last) continue;
        for (size_t i = 0; i < n; i++)
            if (mv[i].new_gen == added[j].gen && KVX_COORD_BLOCK(mv[i].new_coord) < added[j].n)
                last[KVX_COORD_BLOCK(mv[i].new_coord)] = mv[i].last_use;
    }
    pthread_mutex_unlock(&s->use_mu);
}

/* ---------------------------------------------------------------- evict */

static int st_cmp_move_age(const void *a, const void *b)
{
    const st_move *x = a, *y = b;
    if (x->last_use != y->last_use) return x->last_use < y->last_use ? -1 : 1;
    return x->src_coord < y->src_coord ? -1 : x->src_coord > y->src_coord;
}

typedef struct st_victim {
    uint32_t b;
    double cold; /* fraction of entries an exact LRU would evict now */
    double mean; /* mean recency */
} st_victim;

static int st_cmp_victim(const void *a, const void *b)
{
    const st_victim *x = a, *y = b;
    if (x->cold != y->cold) return x->cold > y->cold ? -1 : 1;
    if (x->mean != y->mean) return x->mean < y->mean ? -1 : 1;
    return x->b < y->b ? -1 : x->b > y->b;
}

/* Newest first; equal recency in coordinate order (a parent before its
 * child), so truncating keeps whole prefixes. */
static int st_cmp_move_hot(const void *a, const void *b)
{
    const st_move *x = a, *y = b;
    if (x->last_use != y->last_use) return x->last_use > y->last_use ? -1 : 1;
    return x->src_coord < y->src_coord ? -1 : x->src_coord > y->src_coord;
}

/* When the live shard bytes exceed the capacity, evicts whole shards down
 * to 1/64 below it (the goal).
 *
 * An exact LRU holding the goal's worth of blocks would keep those used
 * most recently: their recency is above a cut. Victims are the shards with
 * the largest share of blocks below the cut (then the oldest mean
 * recency); their blocks above the cut are carried into new shards with
 * their recency (newest first, at most half of the bytes freed, so
 * eviction always frees room and copies at most as much as it frees),
 * unless their parent is gone. */
static int st_evict(kvx_store *s, uint64_t pending);

int kvx_st_enforce_capacity(kvx_store *s) { return st_evict(s, 0); }

/* pending: bytes of sealed files not yet published (a put in progress):
 * they count against the capacity and are all kept (the newest blocks). */
static int st_evict(kvx_store *s, uint64_t pending)
{
    uint64_t total = pending, nblocks = 0;
    for (int b = 0; b < ST_SLOTS; b++)
        if (s->reg_live[b]) {
            total += s->reg[b].file_bytes;
            nblocks += s->reg[b].n_entries;
        }
    if (total <= s->capacity || nblocks == 0) return 0;
    kvx_st_usage_persist(s);
    st_usage_view *uv = calloc(ST_SLOTS, sizeof *uv);
    uint64_t **r = calloc(ST_SLOTS, sizeof *r);
    uint64_t *all = malloc((nblocks + 1) * sizeof *all);
    int rc = uv && r && all ? 0 : kvx_fail(-ENOMEM, "store: out of memory");
    if (!rc) rc = st_usage_read(s, uv);
    if (!rc) rc = st_recency_build(s, uv, r);
    if (rc) {
        if (uv) st_usage_free(uv);
        if (r) st_recency_free(r);
        free(uv);
        free(r);
        free(all);
        return rc;
    }
    /* Evict down to 1/64 below the capacity (a default-sized shard): with
     * only a flush's worth of blocks below the cut, every victim would be
     * mostly hot blocks to copy. The cut: an exact LRU holding that many
     * bytes' worth of blocks. */
    uint64_t goal = s->capacity - s->capacity / 64;
    size_t na = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++)
        if (s->reg_live[b])
            for (uint32_t i = 0; i < s->reg[b].n_entries; i++) all[na++] = r[b][i];
    uint64_t live = total - pending;
    uint64_t keep = goal > pending ? (uint64_t)((double)(goal - pending) / ((double)live / (double)nblocks)) : 0;
    uint64_t cut = 0;
    if (keep < na) {
        qsort(all, na, sizeof *all, st_cmp_u64);
        cut = all[na - keep - 1];
    }
    free(all);
    st_victim order[ST_SLOTS];
    int no = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!s->reg_live[b]) continue;
        uint32_t n = s->reg[b].n_entries, cold = 0;
        double sum = 0;
        for (uint32_t i = 0; i < n; i++) {
            cold += r[b][i] <= cut;
            sum += (double)r[b][i];
        }
        order[no].b = b;
        order[no].cold = n ? (double)cold / n : 1.0;
        order[no].mean = n ? sum / n : 0;
        no++;
    }
    qsort(order, (size_t)no, sizeof *order, st_cmp_victim);
    uint8_t victims[ST_SLOTS] = {0};
    st_move *mv = NULL;
    size_t nmv = 0, capmv = 0;
    uint64_t freed = 0, room = 0;
    for (int i = 0; i < no && !rc; i++) {
        size_t carried = nmv < room ? nmv : (size_t)room;
        uint64_t carry = carried ? 4096 + (uint64_t)carried * s->entry_bytes : 0;
        if (total - freed + carry <= goal) break;
        uint32_t b = order[i].b;
        if (st_is_pinned(s, b)) continue; /* a pending put's held blocks: after its flush */
        victims[b] = 1;
        freed += s->reg[b].file_bytes;
        room = freed / 2 / s->entry_bytes;
        if ((s->reg[b].flags & KVX_FLAG_LINEAGE) && st_collect(s, b, r[b], 1, cut, &mv, &nmv, &capmv, SIZE_MAX) != 0)
            kvx_clear_error(); /* carrying is optional: the shard is evicted anyway */
    }
    st_usage_free(uv);
    free(uv);
    st_recency_free(r);
    free(r);
    if (nmv) qsort(mv, nmv, sizeof *mv, st_cmp_move_hot);
    if (nmv > room) nmv = (size_t)room;
    nmv = st_filter_orphans(s, mv, nmv, victims);
    if (nmv) qsort(mv, nmv, sizeof *mv, st_cmp_move_age);
    st_sealed *added = NULL;
    size_t nadded = 0;
    uint8_t busy[ST_SLOTS] = {0};
    if (nmv && st_rewrite(s, mv, nmv, st_kind_flags(s, ST_KIND_LINEAGE), busy, &added, &nadded) != 0) {
        nmv = 0; /* carrying is an optimisation: evict without it */
        nadded = 0;
    }
    /* the new shards' renames are durable (the seal fsyncs shards/) */
    st_drop d = {s, victims, added, nadded, mv, nmv, 1, 0, 0};
    rc = kvx_idx_write(s->ix, st_drop_body, &d);
    if (rc) {
        st_unlink_sealed(s, added, nadded);
    } else {
        st_after_drop(s, victims, added, nadded, NULL);
        st_rec_from_moves(s, mv, d.nmoves, added, nadded);
        for (size_t i = 0; i < d.nmoves; i++) s->carried += mv[i].new_gen != 0;
    }
    free(added);
    free(mv);
    return rc;
}

/* -------------------------------------------------------------- compact */

/* Merges small shards (< target/2) of one kind, by block recency, into
 * target-sized ones; with full, also shards whose blocks are mostly
 * orphans (their parent is gone, so no prefix lookup reaches them).
 * Orphans are not copied. */
int kvx_st_compact(kvx_store *s, int full)
{
    st_usage_view *uv = calloc(ST_SLOTS, sizeof *uv);
    if (!uv) return kvx_fail(-ENOMEM, "store: out of memory");
    uint64_t *r[ST_SLOTS];
    int rc = st_usage_read(s, uv);
    if (rc) {
        free(uv);
        return rc;
    }
    rc = st_recency_build(s, uv, r);
    st_usage_free(uv);
    free(uv);
    if (rc) {
        st_recency_free(r);
        return rc;
    }
    for (int kind = 0; kind < 2 && !rc; kind++) {
        uint32_t flags = st_kind_flags(s, kind);
        uint8_t victims[ST_SLOTS] = {0};
        int nvict = 0;
        for (uint32_t b = 0; b < ST_SLOTS; b++) {
            if (!s->reg_live[b] || s->reg[b].flags != flags || st_is_pinned(s, b)) continue;
            if (s->reg[b].file_bytes < s->target / 2) {
                victims[b] = 1;
                nvict++;
            }
        }
        if (full && kind == ST_KIND_LINEAGE) {
            /* mostly-orphaned shards */
            MDB_txn *txn;
            uint8_t none[ST_SLOTS] = {0};
            if (kvx_idx_read_begin(s->ix, &txn) == 0) {
                for (uint32_t b = 0; b < ST_SLOTS; b++) {
                    if (!s->reg_live[b] || s->reg[b].flags != flags || victims[b] || st_is_pinned(s, b)) continue;
                    kvx_shard *sh = kvx_st_shard_get(s, b, s->reg[b].gen);
                    if (!sh) continue;
                    uint32_t cnt = kvx_shard_get_info(sh)->num_blocks, orphans = 0;
                    for (uint32_t i = 0; i < cnt; i++) {
                        kvx_entry e;
                        if (kvx_shard_entry(&e, sh, i) == 0 && !st_parent_kept(s, txn, e.parent, none, NULL, 0))
                            orphans++;
                    }
                    kvx_shard_close(sh);
                    if (orphans * 2 > cnt) {
                        victims[b] = 1;
                        nvict += 2; /* rewrite even alone */
                    }
                }
                kvx_idx_read_end(s->ix, txn);
            }
        }
        if (nvict < 2) continue;
        st_move *mv = NULL;
        size_t nmv = 0, capmv = 0;
        for (uint32_t b = 0; b < ST_SLOTS && !rc; b++)
            if (victims[b]) rc = st_collect(s, b, r[b], 0, 0, &mv, &nmv, &capmv, SIZE_MAX);
        if (rc) {
            free(mv);
            break;
        }
        if (full && kind == ST_KIND_LINEAGE) nmv = st_filter_orphans(s, mv, nmv, victims);
        if (nmv) qsort(mv, nmv, sizeof *mv, st_cmp_move_age);
        st_sealed *added = NULL;
        size_t nadded = 0;
        uint8_t busy[ST_SLOTS] = {0};
        if (nmv) rc = st_rewrite(s, mv, nmv, flags, busy, &added, &nadded); /* sealed: durable */
        if (!rc) {
            st_drop d = {s, victims, added, nadded, mv, nmv, 0, 1, 0};
            rc = kvx_idx_write(s->ix, st_drop_body, &d);
            if (rc) st_unlink_sealed(s, added, nadded);
            else {
                st_after_drop(s, victims, added, nadded, NULL);
                st_rec_from_moves(s, mv, nmv, added, nadded);
            }
        }
        free(added);
        free(mv);
    }
    st_recency_free(r);
    return rc;
}

static int st_drop_headless(kvx_store *s);
static int st_salvage_damaged(kvx_store *s);

KVX_API int kvx_store_gc(kvx_store *s)
{
    int rc = st_writer_check(s, "kvx_store_gc");
    if (rc) return rc;
    pthread_mutex_lock(&s->wmu);
    kvx_st_usage_persist(s);
    rc = kvx_st_drop_bad_shards(s);
    if (!rc) rc = st_salvage_damaged(s);
    if (!rc) rc = kvx_st_enforce_capacity(s);
    if (!rc) rc = st_drop_headless(s);
    if (!rc) rc = kvx_st_compact(s, 1);
    pthread_mutex_unlock(&s->wmu);
    if (!rc) kvx_clear_error();
    return rc;
}

/* -------------------------------------------------------------- reindex */

typedef struct st_found {
    uint64_t gen;
    kvx_shard *sh;
    uint64_t bytes;
    char name[32];
} st_found;

typedef struct st_scan {
    st_found f[ST_SLOTS];
    uint64_t max_gen;
    uint64_t quarantined, skipped;
    int err;           /* the first failed move to quarantine/ */
    char errmsg[512];  /* ... and what it said */
} st_scan;

/* One file of shards/: kept (newest valid file per shard byte), or moved
 * to quarantine/ with the reason (invalid, foreign, or an older file
 * claiming a shard byte a newer one holds). Never deleted. */
static int st_scan_file(kvx_store *s, int fd, const char *name, void *ctx)
{
    st_scan *sc = ctx;
    uint64_t gen;
    if (!kvx_st_parse_name(name, &gen)) return 0;
    if (gen > sc->max_gen) sc->max_gen = gen;
    struct stat st;
    if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        int e = errno;
        if (e == ENOENT) return 0; /* gone meanwhile */
        return kvx_fail(-e, "store %s: reindex: stat shards/%s: %s", s->dir, name, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) { /* a directory or link where a shard belongs: never followed */
        sc->skipped++;
        return 0;
    }
    size_t len = strlen(s->shards_path) + 1 + strlen(name) + 1;
    char *path = malloc(len);
    if (!path) return kvx_fail(-ENOMEM, "store: out of memory");
    snprintf(path, len, "%s/%s", s->shards_path, name);
    kvx_shard *sh = NULL;
    int rc = kvx_shard_open(&sh, path, 0);
    free(path);
    if (rc && st_open_transient(rc)) {
        /* not a verdict on the file: stop, leave the index as it was */
        return kvx_fail(rc, "store %s: reindex: cannot open shards/%s: %s", s->dir, name, kvx_strerror(rc));
    }
    char why[600];
    if (rc) {
        snprintf(why, sizeof why, "reindex: cannot be validated: %s (%s)", kvx_last_error(), kvx_err_name(rc));
    } else {
        const kvx_shard_info *in = kvx_shard_get_info(sh);
        const kvx_geometry *g = &in->geometry;
        if (g->num_layers != s->g.num_layers || g->kv_heads != s->g.kv_heads || g->head_dim != s->g.head_dim ||
            g->block_tokens != s->g.block_tokens || g->quant != s->g.quant ||
            g->model_signature != s->g.model_signature || !(in->flags & KVX_FLAG_HASHES)) {
            snprintf(why, sizeof why, "reindex: geometry, model or tables differ from this store's");
            kvx_shard_close(sh);
            sh = NULL;
        } else {
            st_found *f = &sc->f[in->shard_id];
            if (!f->sh || f->gen < gen) {
                /* the newest file holds the byte; an older one goes aside */
                st_found old = *f;
                f->gen = gen;
                f->sh = sh;
                f->bytes = (uint64_t)st.st_size;
                snprintf(f->name, sizeof f->name, "%s", name);
                if (!old.sh) return 0;
                kvx_shard_close(old.sh);
                snprintf(why, sizeof why, "reindex: shard byte %u is also claimed by the newer shards/%s",
                         in->shard_id, f->name);
                if ((rc = kvx_st_quarantine(s, old.name, why)) && !sc->err) {
                    sc->err = rc;
                    snprintf(sc->errmsg, sizeof sc->errmsg, "%s", kvx_last_error());
                }
                else sc->quarantined++;
                return 0;
            }
            snprintf(why, sizeof why, "reindex: shard byte %u is also claimed by the newer shards/%s", in->shard_id,
                     f->name);
            kvx_shard_close(sh);
            sh = NULL;
        }
    }
    if ((rc = kvx_st_quarantine(s, name, why)) && !sc->err) {
        sc->err = rc;
        snprintf(sc->errmsg, sizeof sc->errmsg, "%s", kvx_last_error());
    }
    else sc->quarantined++;
    return 0;
}

typedef struct st_reindex {
    kvx_store *s;
    st_scan *sc;
} st_reindex;

static int st_reindex_body(MDB_txn *txn, void *ctx)
{
    st_reindex *r = ctx;
    kvx_index *ix = r->s->ix;
    int rc;
    /* a fresh index: nothing of the old one is read */
    if ((rc = mdb_drop(txn, ix->coord, 0)) || (rc = mdb_drop(txn, ix->hash, 0)) || (rc = mdb_drop(txn, ix->shards, 0)) ||
        (rc = mdb_drop(txn, ix->usage, 0)) || (rc = mdb_drop(txn, ix->meta, 0)))
        return rc;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        st_found *f = &r->sc->f[b];
        if (!f->sh) continue;
        const kvx_shard_info *in = kvx_shard_get_info(f->sh);
        st_sealed x = {(uint8_t)b, f->gen, in->flags, in->num_blocks, f->bytes, kvx_st_now_ns(), kvx_st_count_unverified(f->sh)};
        if ((rc = kvx_st_register(txn, ix, &x))) return rc;
        for (uint32_t i = 0; i < in->num_blocks; i++) {
            kvx_entry e;
            if (kvx_shard_entry(&e, f->sh, i) || !e.hash) continue;
            if ((rc = kvx_idx_add_block(txn, ix, e.coordinate, e.hash, f->gen))) return rc;
        }
    }
    kvx_idx_stats st = {0};
    if ((rc = kvx_idx_put_stats(txn, ix, &st))) return rc;
    uint64_t ng = r->s->next_gen > r->sc->max_gen + 1 ? r->s->next_gen : r->sc->max_gen + 1;
    r->s->next_gen = ng;
    return kvx_idx_put_u64(txn, ix->meta, "next_gen", ng);
}

/* ------------------------------------------- digests for older stores */

/* A lineage entry of the store, for deriving digests (DESIGN.md rule 4). */
typedef struct st_lin {
    uint64_t hash, parent;
    uint32_t b, idx;
    const uint32_t *toks;
    uint8_t digest[KVX_DIGEST_BYTES];
    int state; /* 0 unknown, 1 known, 2 ambiguous (stays unverified) */
    int stored; /* the shard holds the digest already */
} st_lin;

static int st_cmp_lin(const void *a, const void *b)
{
    const st_lin *x = a, *y = b;
    return x->hash < y->hash ? -1 : x->hash > y->hash;
}

/* Every lineage entry of every live shard (which it opens into sh[]), with
 * its stored digest when it has one; state is left 0 for the caller. 0,
 * ST_PASS_SKIPPED when a lineage shard cannot be opened now (it may hold
 * parents: judging reachability or digests without it would drop or leave
 * unverified blocks that are fine), or an error. */
static int st_lin_gather(kvx_store *s, kvx_shard **sh, st_lin **out, size_t *out_n)
{
    size_t n = 0, cap = 0;
    st_lin *all = NULL;
    int rc = 0;
    for (uint32_t b = 0; b < ST_SLOTS && !rc; b++) {
        if (!s->reg_live[b] || !(s->reg[b].flags & KVX_FLAG_LINEAGE)) continue;
        if (!(sh[b] = kvx_st_shard_get(s, b, s->reg[b].gen))) {
            rc = ST_PASS_SKIPPED;
            break;
        }
        uint32_t cnt = kvx_shard_get_info(sh[b])->num_blocks;
        for (uint32_t i = 0; i < cnt && !rc; i++) {
            kvx_entry e;
            if (kvx_shard_entry(&e, sh[b], i) || !e.hash || !e.tokens) continue;
            if (n == cap) {
                cap = cap ? cap * 2 : 1024;
                st_lin *p = realloc(all, cap * sizeof *p);
                if (!p) {
                    rc = kvx_fail(-ENOMEM, "store: out of memory");
                    break;
                }
                all = p;
            }
            st_lin *l = &all[n++];
            memset(l, 0, sizeof *l);
            l->hash = e.hash;
            l->parent = e.parent;
            l->b = b;
            l->idx = i;
            l->toks = e.tokens;
            if (e.digest) {
                memcpy(l->digest, e.digest, KVX_DIGEST_BYTES);
                l->stored = 1;
            }
        }
    }
    *out = all;
    *out_n = n;
    return rc;
}

/* The parent of e: 1 and its digest when every entry with hash ==
 * e->parent that has a digest agrees (one candidate block), 0 when none is
 * known yet, -1 when candidates disagree or some are undecidable. */
static int st_parent_digest(const st_lin *all, size_t n, uint64_t parent, const uint8_t **out)
{
    st_lin key = {.hash = parent};
    const st_lin *p = bsearch(&key, all, n, sizeof *all, st_cmp_lin);
    if (!p) return -1; /* no parent held: the chain has no block-0 root here */
    while (p > all && p[-1].hash == parent) p--;
    const uint8_t *d = NULL;
    int unknown = 0;
    for (; p < all + n && p->hash == parent; p++) {
        if (p->state == 2) return -1;
        if (p->state == 0) {
            unknown = 1;
            continue;
        }
        if (d && memcmp(d, p->digest, KVX_DIGEST_BYTES) != 0) return -1; /* two candidate parents */
        d = p->digest;
    }
    if (unknown) return 0;
    *out = d;
    return d ? 1 : -1;
}

/* Shards written before the digest existed have lineage but no digest
 * table: their blocks are unverified. Walk lineage from blocks whose
 * parent is 0, derive each block's digest where it has exactly one
 * candidate parent, and rewrite those shards into digest shards (a sound
 * shard only: a damaged one stays as it is, unverified). */
static int st_derive_digests(kvx_store *s)
{
    /* shards written before the digest, and digest shards holding blocks
     * without one (a rewrite by gc or eviction carries a block's missing
     * digest as it is) */
    int need = 0;
    for (int b = 0; b < ST_SLOTS; b++)
        need |= s->reg_live[b] && (s->reg[b].flags & KVX_FLAG_LINEAGE) &&
                (!(s->reg[b].flags & KVX_FLAG_DIGEST) || s->reg[b].n_unverified);
    if (!need) return 0;
    kvx_shard *sh[ST_SLOTS] = {0};
    size_t n = 0;
    st_lin *all = NULL;
    uint32_t B = s->g.block_tokens;
    int rc = st_lin_gather(s, sh, &all, &n);
    for (size_t i = 0; !rc && i < n; i++) {
        if (all[i].stored) all[i].state = 1;
        else if (all[i].parent == 0) {
            kvx_prefix_digest_next(all[i].digest, NULL, all[i].toks, B);
            all[i].state = 1;
        }
    }
    if (!rc && n) {
        qsort(all, n, sizeof *all, st_cmp_lin);
        for (int changed = 1; changed;) {
            changed = 0;
            for (size_t i = 0; i < n; i++) {
                if (all[i].state) continue;
                const uint8_t *pd = NULL;
                int r = st_parent_digest(all, n, all[i].parent, &pd);
                if (r == 0) continue;
                if (r < 0) all[i].state = 2;
                else {
                    kvx_prefix_digest_next(all[i].digest, pd, all[i].toks, B);
                    all[i].state = 1;
                }
                changed = 1;
            }
        }
    }
    if (rc == ST_PASS_SKIPPED) {
        for (int b = 0; b < ST_SLOTS; b++) kvx_shard_close(sh[b]);
        free(all);
        kvx_fail(KVX_ECORRUPT, "store %s: a shard could not be opened: digests not derived (run reindex again)", s->dir);
        return 0;
    }
    /* rewrite each sound shard that gains a digest */
    uint8_t gains[ST_SLOTS] = {0};
    for (size_t i = 0; i < n; i++) gains[all[i].b] |= all[i].state == 1 && !all[i].stored;
    for (uint32_t b = 0; b < ST_SLOTS && !rc; b++) {
        if (!sh[b] || !gains[b]) continue;
        char why[600];
        if (st_sound(s, b, s->reg[b].gen, why, sizeof why) != 1) continue;
        st_move *mv = NULL;
        size_t nmv = 0, capmv = 0;
        rc = st_collect(s, b, NULL, 0, 0, &mv, &nmv, &capmv, SIZE_MAX);
        for (size_t i = 0; !rc && i < nmv; i++) {
            st_lin key = {.hash = mv[i].hash};
            st_lin *p = bsearch(&key, all, n, sizeof *all, st_cmp_lin);
            while (p && p > all && p[-1].hash == mv[i].hash) p--;
            for (; p && p < all + n && p->hash == mv[i].hash; p++)
                if (p->b == b && p->idx == KVX_COORD_BLOCK(mv[i].src_coord) && p->state == 1)
                    memcpy(mv[i].digest, p->digest, KVX_DIGEST_BYTES);
        }
        st_sealed *added = NULL;
        size_t nadded = 0;
        uint8_t busy[ST_SLOTS] = {0}, victims[ST_SLOTS] = {0};
        victims[b] = 1;
        if (!rc && nmv) rc = st_rewrite(s, mv, nmv, st_kind_flags(s, ST_KIND_LINEAGE), busy, &added, &nadded);
        if (!rc) {
            st_drop d = {s, victims, added, nadded, mv, nmv, 0, 0, 0};
            rc = kvx_idx_write(s->ix, st_drop_body, &d);
            if (rc) st_unlink_sealed(s, added, nadded);
            else {
                kvx_shard_close(sh[b]);
                sh[b] = NULL;
                st_after_drop(s, victims, added, nadded, NULL);
            }
        }
        free(added);
        free(mv);
    }
    for (int b = 0; b < ST_SLOTS; b++) kvx_shard_close(sh[b]);
    free(all);
    return rc;
}

int kvx_st_reindex_locked(kvx_store *s)
{
    kvx_st_discard_pending(s);
    int rc = kvx_st_gen_floor(s);
    if (rc) return rc;
    st_scan *sc = calloc(1, sizeof *sc);
    if (!sc) return kvx_fail(-ENOMEM, "store: out of memory");
    rc = kvx_st_each_file(s, s->shardsfd, st_scan_file, sc);
    if (!rc) {
        st_reindex r = {s, sc};
        rc = kvx_idx_write(s->ix, st_reindex_body, &r);
    }
    for (int b = 0; b < ST_SLOTS; b++) kvx_shard_close(sc->f[b].sh);
    uint64_t quarantined = sc->quarantined, skipped = sc->skipped;
    int qerr = sc->err;
    char qmsg[512];
    snprintf(qmsg, sizeof qmsg, "%s", sc->errmsg);
    free(sc);
    for (uint32_t b = 0; b < ST_SLOTS; b++) kvx_st_cache_drop(s, b);
    if (!rc) rc = kvx_st_registry_load(s);
    if (!rc) rc = st_derive_digests(s);
    if (!rc && qerr)
        rc = kvx_fail(qerr, "store %s: the index is rebuilt, but a file reindex could not use stays in shards/ (not "
                            "indexed, nothing lost): %s",
                      s->dir, qmsg);
    if (!rc && (quarantined || skipped))
        kvx_fail(KVX_ECORRUPT,
                 "store %s: reindex moved %llu invalid or duplicate file(s) to quarantine/ and left %llu entr%s of "
                 "shards/ that are not regular files alone",
                 s->dir, (unsigned long long)quarantined, (unsigned long long)skipped, skipped == 1 ? "y" : "ies");
    return rc;
}

KVX_API int kvx_store_reindex(kvx_store *s)
{
    int rc = st_writer_check(s, "kvx_store_reindex");
    if (rc) return rc;
    pthread_mutex_lock(&s->wmu);
    /* puts not yet flushed are flushed first: a reindex must not drop what
     * the next flush would acknowledge. That next kvx_store_flush, not this
     * reindex, acknowledges them to the caller, so their pins (the shards of
     * blocks they found held, and the shards this flush publishes) must last
     * until it returns: the flush below and kvx_st_reindex_locked's discard both
     * clear pins, and the reindex gives every shard a fresh creation time, so
     * a block a put found held then looked the oldest in the store and the
     * next flush's eviction took it (a put of only held blocks pends nothing,
     * so it was not even flushed here). Found by test_powercut seed 651158135. */
    for (size_t i = 0; i < s->nsealed; i++) st_pin(s, s->sealed[i].byte, s->sealed[i].gen);
    for (int k = 0; k < 2; k++)
        if (s->cur[k].w) st_pin(s, s->cur[k].byte, s->cur[k].gen);
    uint8_t pinned[ST_SLOTS];
    uint64_t pin_gen[ST_SLOTS];
    memcpy(pinned, s->pinned, sizeof pinned);
    memcpy(pin_gen, s->pin_gen, sizeof pin_gen);
    if (s->npend || s->nsealed || s->cur[0].w || s->cur[1].w) rc = kvx_st_flush_locked(s);
    if (!rc) {
        rc = kvx_st_reindex_locked(s);
        /* reindex keeps each kept shard's generation, so these pins still
         * name the same files; a failed flush dropped the puts (no pins) */
        memcpy(s->pinned, pinned, sizeof pinned);
        memcpy(s->pin_gen, pin_gen, sizeof pin_gen);
    }
    pthread_mutex_unlock(&s->wmu);
    return rc;
}

/* ------------------------------------------------------- gc: chains, damage */

/* Rewrites shard b keeping only the entries keep[] marks (NULL: all whose
 * page is sound), then drops it: deleted when sound, else quarantined. */
static int st_rewrite_shard(kvx_store *s, uint32_t b, const uint8_t *keep, int damaged, const char *damaged_why)
{
    st_move *mv = NULL;
    size_t nmv = 0, capmv = 0;
    int rc = st_collect(s, b, NULL, 0, 0, &mv, &nmv, &capmv, SIZE_MAX);
    if (rc) {
        free(mv);
        return rc;
    }
    size_t w = 0;
    for (size_t i = 0; i < nmv; i++)
        if (!keep || keep[KVX_COORD_BLOCK(mv[i].src_coord)]) mv[w++] = mv[i];
    nmv = w;
    st_sealed *added = NULL;
    size_t nadded = 0;
    uint8_t busy[ST_SLOTS] = {0}, victims[ST_SLOTS] = {0};
    victims[b] = 1;
    uint32_t flags = s->reg[b].flags & (KVX_FLAG_HASHES | KVX_FLAG_LINEAGE | KVX_FLAG_SCALES);
    if (flags & KVX_FLAG_LINEAGE) flags |= KVX_FLAG_DIGEST;
    if (nmv) rc = st_rewrite(s, mv, nmv, flags, busy, &added, &nadded); /* bad pages are not copied */
    if (!rc) {
        st_drop d = {s, victims, added, nadded, mv, nmv, 0, 1, damaged};
        rc = kvx_idx_write(s->ix, st_drop_body, &d);
        if (rc) st_unlink_sealed(s, added, nadded);
        else st_after_drop(s, victims, added, nadded, damaged ? damaged_why : NULL);
    }
    free(added);
    free(mv);
    return rc;
}

/* gc copies the good blocks of a shard with damaged or missing pages into
 * a new shard and moves the damaged file to quarantine/ (DESIGN.md rule
 * 2). Every page of every shard is read: gc is the maintenance pass. */
static int st_salvage_damaged(kvx_store *s)
{
    int rc = 0;
    for (uint32_t b = 0; b < ST_SLOTS && !rc; b++) {
        if (!s->reg_live[b]) continue;
        kvx_shard *sh = kvx_st_shard_get(s, b, s->reg[b].gen);
        if (!sh) continue;
        uint32_t bad = 0;
        int v = kvx_shard_verify(sh, &bad, NULL, NULL);
        kvx_shard_close(sh);
        if (v && bad) {
            char why[200];
            snprintf(why, sizeof why, "%u damaged or missing page(s): gc copied its good blocks to a new shard", bad);
            rc = st_rewrite_shard(s, b, NULL, 1, why);
        }
        else kvx_clear_error();
    }
    return rc;
}

/* Lineage blocks with no path to a block-0 ancestor (their chain's head was
 * evicted or never stored) can never be served by a prefix: gc drops them.
 * A block is reachable when its parent is 0, or when a reachable block
 * holds its parent hash (and, both being verified, the parent's digest
 * chains to its own). */
static int st_drop_headless(kvx_store *s)
{
    kvx_shard *sh[ST_SLOTS] = {0};
    size_t n = 0;
    st_lin *all = NULL;
    uint32_t B = s->g.block_tokens;
    int rc = st_lin_gather(s, sh, &all, &n);
    for (size_t i = 0; !rc && i < n; i++) all[i].state = all[i].parent == 0; /* 1: reachable */
    if (!rc && n) {
        qsort(all, n, sizeof *all, st_cmp_lin);
        for (int changed = 1; changed;) {
            changed = 0;
            for (size_t i = 0; i < n; i++) {
                if (all[i].state) continue;
                st_lin key = {.hash = all[i].parent};
                st_lin *p = bsearch(&key, all, n, sizeof *all, st_cmp_lin);
                while (p && p > all && p[-1].hash == key.hash) p--;
                for (; p && p < all + n && p->hash == key.hash; p++) {
                    if (p->state != 1) continue;
                    int dz = kvx_digest_is_zero(all[i].digest), pz = kvx_digest_is_zero(p->digest);
                    if (!dz && !pz) {
                        uint8_t d[KVX_DIGEST_BYTES];
                        kvx_prefix_digest_next(d, p->digest, all[i].toks, B);
                        if (memcmp(d, all[i].digest, KVX_DIGEST_BYTES) != 0) continue;
                    }
                    all[i].state = 1;
                    changed = 1;
                    break;
                }
            }
        }
    }
    if (rc == ST_PASS_SKIPPED) {
        for (int b = 0; b < ST_SLOTS; b++) kvx_shard_close(sh[b]);
        free(all);
        return 0; /* nothing dropped: the next gc tries again */
    }
    uint8_t *keep[ST_SLOTS] = {0};
    uint8_t headless[ST_SLOTS] = {0};
    for (size_t i = 0; !rc && i < n; i++) {
        uint32_t b = all[i].b;
        if (!keep[b]) {
            keep[b] = calloc(kvx_shard_get_info(sh[b])->num_blocks + 1u, 1);
            if (!keep[b]) {
                rc = kvx_fail(-ENOMEM, "store: out of memory");
                break;
            }
        }
        keep[b][all[i].idx] = all[i].state == 1;
        headless[b] |= all[i].state != 1;
    }
    free(all);
    for (int b = 0; b < ST_SLOTS; b++) kvx_shard_close(sh[b]);
    for (uint32_t b = 0; b < ST_SLOTS && !rc; b++)
        if (headless[b] && !st_is_pinned(s, b)) rc = st_rewrite_shard(s, b, keep[b], 0, NULL);
    for (int b = 0; b < ST_SLOTS; b++) free(keep[b]);
    return rc;
}
