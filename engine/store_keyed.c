/*
 * store_keyed.c - keyed pages (DESIGN.md "Keyed pages"): put, get, exists
 * and the owner's delete for a keyed store, whose pages engines name by
 * their own keys (LMCache, SGLang).
 *
 * Rule: the index names a page by the first 8 bytes of SHA-256(key) and
 * every hit compares the whole key stored in the shard's key table
 * (st_try_loc), so a 64-bit collision is a miss, never another key's page.
 * Everything else (batches and flush, capacity, eviction, recovery,
 * reindex, quarantine) is the blocks' machinery: a keyed page is an entry
 * of one "token" whose hash is its key's.
 */
#include "store.h"
#include "common/digest.h"
#include "format/format.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Every key and page checked before anything is done. */
static int sk_check_keys(const kvx_key *keys, size_t n, const char *fn)
{
    if (n && !keys) return kvx_fail(KVX_EINVALID, "%s: keys is NULL", fn);
    for (size_t i = 0; i < n; i++) {
        if (!keys[i].bytes || keys[i].len == 0)
            return kvx_fail(KVX_EINVALID, "%s: keys[%zu] is empty (a key is 1..%u bytes)", fn, i, KVX_KEY_MAX);
        if (keys[i].len > KVX_KEY_MAX)
            return kvx_fail(KVX_EINVALID, "%s: keys[%zu] is %zu bytes, over %u", fn, i, keys[i].len, KVX_KEY_MAX);
    }
    return 0;
}

static void sk_query(st_query *q, uint8_t digest[KVX_DIGEST_BYTES], const kvx_key *k)
{
    kvx_sha256(digest, k->bytes, k->len);
    memset(q, 0, sizeof *q);
    q->hash = kvx_key_name(digest, k->bytes, k->len);
    q->digest = digest;
    q->key = k->bytes;
    q->key_len = (uint32_t)k->len;
}

static void sk_view_clear(kvx_view *v) { memset(v, 0, sizeof *v); }

KVX_API int kvx_store_keyed_put(kvx_store *s, kvx_store_batch *b, const kvx_key *keys, const void *const *pages,
                                const size_t *page_lens, size_t n, size_t *out_new)
{
    static const char fn[] = "kvx_store_keyed_put";
    if (out_new) *out_new = 0;
    int rc = kvx_st_writer_check(s, fn);
    if (!rc) rc = kvx_st_kind_check(s, 1, fn);
    if (!rc) rc = sk_check_keys(keys, n, fn);
    if (rc) return rc;
    if (n && (!pages || !page_lens)) return kvx_fail(KVX_EINVALID, "%s: pages or page_lens is NULL", fn);
    for (size_t i = 0; i < n; i++) {
        if (!pages[i]) return kvx_fail(KVX_EINVALID, "%s: pages[%zu] is NULL", fn, i);
        if (page_lens[i] == 0 || page_lens[i] > s->page_bytes)
            return kvx_fail(KVX_EINVALID, "%s: page_lens[%zu] is %zu bytes, not 1..%llu (the store's page_bytes)", fn,
                            i, page_lens[i], (unsigned long long)s->page_bytes);
    }
    kvx_store_batch *x = kvx_st_batch_of(s, b, fn, &rc);
    if (!x) return rc;
    if (n == 0) return 0;
    return kvx_st_put_keyed(s, x, keys, pages, page_lens, n, out_new);
}

/* The bytes a read may write into buffer i: its capacity, no more than
 * the store's page size (a longer page is damage, never read). */
static size_t sk_span(const kvx_store *s, size_t cap) { return cap < s->page_bytes ? cap : (size_t)s->page_bytes; }

/* One snapshot for the whole batch; each key looked up whole; with dst,
 * key i's page is read into dst[i] (dst_cap[i] bytes) and checked there. */
static int sk_lookup_all(kvx_view *views, int *status, kvx_store *s, const kvx_key *keys, size_t n,
                         void *const *dst, const size_t *dst_cap, int no_page)
{
    kvx_cat_snap *snap;
    int rc = kvx_cat_snap_begin(s->cat, &snap);
    if (rc) return rc;
    uint64_t misses = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t digest[KVX_DIGEST_BYTES];
        st_query q;
        sk_query(&q, digest, &keys[i]);
        if (dst) {
            q.dst = dst[i];
            q.dst_cap = sk_span(s, dst_cap[i]); /* what sk_check_apart saw apart */
        }
        q.no_page = no_page;
        sk_view_clear(&views[i]);
        status[i] = kvx_st_lookup(s, snap, &q, &views[i]);
        if (status[i] && status[i] != KVX_ENOTFOUND && !kvx_st_damage(dst != NULL, status[i])) {
            /* a damaged catalog record or a failed read: an error, not a miss */
            rc = status[i];
            for (size_t j = 0; j <= i; j++) kvx_view_release(&views[j]);
            break;
        }
        if (status[i]) {
            sk_view_clear(&views[i]);
            misses++;
        }
    }
    kvx_cat_snap_end(snap);
    if (!rc) kvx_st_note(s, views, n, misses, 1);
    return rc;
}

KVX_API int kvx_store_keyed_get(kvx_view *out_views, int *out_status, kvx_store *s, const kvx_key *keys, size_t n)
{
    static const char fn[] = "kvx_store_keyed_get";
    if (!s || (n && (!out_views || !out_status))) return kvx_fail(KVX_EINVALID, "%s: NULL argument", fn);
    int rc = kvx_st_kind_check(s, 1, fn);
    if (!rc) rc = sk_check_keys(keys, n, fn);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) sk_view_clear(&out_views[i]);
    if (n == 0) return 0;
    rc = sk_lookup_all(out_views, out_status, s, keys, n, NULL, NULL, 0);
    if (!rc) kvx_clear_error();
    return rc;
}

typedef struct sk_range {
    uintptr_t from, to;
    size_t i;
} sk_range;

static int sk_range_cmp(const void *a, const void *b)
{
    const sk_range *x = a, *y = b;
    return x->from < y->from ? -1 : x->from > y->from;
}

/* Do two of the n buffers overlap? A page read and checked in one would
 * be overwritten by another key's read and still reported read. */
static int sk_check_apart(const kvx_store *s, void *const *dst, const size_t *dst_cap, size_t n, const char *fn)
{
    if (n < 2) return 0;
    sk_range *r = malloc(n * sizeof *r);
    if (!r) return kvx_fail(-ENOMEM, "%s: out of memory", fn);
    for (size_t i = 0; i < n; i++) {
        r[i].from = (uintptr_t)dst[i];
        r[i].to = r[i].from + sk_span(s, dst_cap[i]);
        r[i].i = i;
    }
    qsort(r, n, sizeof *r, sk_range_cmp);
    int rc = 0;
    for (size_t j = 1; j < n && !rc; j++)
        if (r[j].from < r[j - 1].to)
            rc = kvx_fail(KVX_EINVALID, "%s: dst[%zu] and dst[%zu] overlap (each page needs a buffer of its own)", fn,
                          r[j - 1].i < r[j].i ? r[j - 1].i : r[j].i, r[j - 1].i < r[j].i ? r[j].i : r[j - 1].i);
    free(r);
    return rc;
}

KVX_API int kvx_store_keyed_read(int *out_status, size_t *out_lens, kvx_store *s, const kvx_key *keys, size_t n,
                                 void *const *dst, const size_t *dst_cap)
{
    static const char fn[] = "kvx_store_keyed_read";
    if (!s || (n && (!out_status || !dst || !dst_cap))) return kvx_fail(KVX_EINVALID, "%s: NULL argument", fn);
    int rc = kvx_st_kind_check(s, 1, fn);
    if (!rc) rc = sk_check_keys(keys, n, fn);
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) {
        if (!dst[i]) return kvx_fail(KVX_EINVALID, "%s: dst[%zu] is NULL", fn, i);
        if (dst_cap[i] < s->page_bytes)
            return kvx_fail(KVX_EINVALID, "%s: dst_cap[%zu] is %zu bytes, under the store's page_bytes %llu", fn, i,
                            dst_cap[i], (unsigned long long)s->page_bytes);
    }
    if ((rc = sk_check_apart(s, dst, dst_cap, n, fn))) return rc;
    if (out_lens) memset(out_lens, 0, n * sizeof *out_lens);
    if (n == 0) return 0;
    kvx_view *v = malloc(n * sizeof *v);
    kvx_shard **sh = malloc(n * sizeof *sh);
    uint32_t *idx = malloc(n * sizeof *idx);
    void **d = malloc(n * sizeof *d);
    size_t *cap = malloc(n * sizeof *cap), *len = malloc(n * sizeof *len), *at = malloc(n * sizeof *at), m = 0;
    int *st = malloc(n * sizeof *st);
    if (!v || !sh || !idx || !d || !cap || !len || !at || !st) {
        rc = kvx_fail(-ENOMEM, "%s: out of memory", fn);
        goto out;
    }
    /* 1. every key's entry, no page read; 2. the held pages read at once
     * (their O_DIRECT reads in flight together) and checked where they
     * landed; 3. a page that failed: its key looked up and read again
     * alone, which tries its other copies and names the damage */
    rc = sk_lookup_all(v, out_status, s, keys, n, NULL, NULL, 1);
    if (rc) goto out;
    for (size_t i = 0; i < n; i++)
        if (out_status[i] == 0) {
            sh[m] = v[i].shard;
            idx[m] = v[i].entry;
            d[m] = dst[i];
            cap[m] = dst_cap[i];
            at[m++] = i;
        }
    kvx_shard_pages_read(sh, idx, m, d, cap, st, len);
    kvx_views_release(v, n);
    for (size_t k = 0; k < m && !rc; k++) {
        size_t i = at[k];
        if (out_lens) out_lens[i] = st[k] ? 0 : len[k];
        if (!st[k]) continue;
        rc = sk_lookup_all(&v[i], &out_status[i], s, &keys[i], 1, &dst[i], &dst_cap[i], 0);
        if (!rc && out_lens) out_lens[i] = out_status[i] ? 0 : v[i].page_bytes;
        if (!rc) kvx_view_release(&v[i]);
    }
    if (!rc) kvx_clear_error();
out:
    free(v);
    free(sh);
    free(idx);
    free(d);
    free(cap);
    free(len);
    free(at);
    free(st);
    return rc;
}

/* exists and contains: which keys are held, and how many leading ones. */
static int sk_held(uint8_t *out_held, size_t *out_leading, kvx_store *s, const kvx_key *keys, size_t n, int no_page,
                   const char *fn)
{
    if (out_leading) *out_leading = 0;
    if (!s) return kvx_fail(KVX_EINVALID, "%s: store is NULL", fn);
    int rc = kvx_st_kind_check(s, 1, fn);
    if (!rc) rc = sk_check_keys(keys, n, fn);
    if (rc) return rc;
    if (n == 0) return 0;
    kvx_view *v = malloc(n * sizeof *v);
    int *st = malloc(n * sizeof *st);
    if (!v || !st) {
        free(v);
        free(st);
        return kvx_fail(-ENOMEM, "%s: out of memory", fn);
    }
    rc = sk_lookup_all(v, st, s, keys, n, NULL, NULL, no_page);
    if (!rc) {
        size_t lead = 0;
        int leading = 1;
        for (size_t i = 0; i < n; i++) {
            int held = st[i] == 0;
            if (out_held) out_held[i] = (uint8_t)held;
            leading &= held;
            lead += (size_t)leading;
        }
        if (out_leading) *out_leading = lead;
        kvx_views_release(v, n);
        kvx_clear_error();
    }
    free(v);
    free(st);
    return rc;
}

KVX_API int kvx_store_keyed_exists(uint8_t *out_held, size_t *out_leading, kvx_store *s, const kvx_key *keys,
                                   size_t n)
{
    return sk_held(out_held, out_leading, s, keys, n, 0, "kvx_store_keyed_exists");
}

KVX_API int kvx_store_keyed_contains(uint8_t *out_held, size_t *out_leading, kvx_store *s, const kvx_key *keys,
                                     size_t n)
{
    return sk_held(out_held, out_leading, s, keys, n, 1, "kvx_store_keyed_contains");
}

/* Does the entry at loc hold exactly this key? */
static int sk_loc_has_key(kvx_store *s, const kvx_cat_loc *loc, const kvx_key *k)
{
    kvx_shard *sh = kvx_st_shard_get_n(s, KVX_COORD_SHARD(loc->coord), loc->gen, KVX_COORD_BLOCK(loc->coord) + 1);
    if (!sh) return 0;
    kvx_entry e;
    int yes = kvx_shard_entry(&e, sh, KVX_COORD_BLOCK(loc->coord)) == 0 && e.coordinate == loc->coord && e.key &&
              e.key_len == k->len && memcmp(e.key, k->bytes, k->len) == 0;
    kvx_shard_close(sh);
    return yes;
}

/* Keys in byte order (then length), so a key named twice sits beside
 * itself. */
static int sk_key_cmp(const void *a, const void *b)
{
    const kvx_key *x = *(const kvx_key *const *)a, *y = *(const kvx_key *const *)b;
    int c = memcmp(x->bytes, y->bytes, x->len < y->len ? x->len : y->len);
    return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* The delete's tombstones: one file, a shard of its own, of one entry per
 * key (tombs), sealed with the commit's sequence number and published as
 * a batch is (staging/ twin, link, the catalog edit e, the twin removed
 * durably). Under wmu. */
static int sk_tomb_writer(kvx_store *s, st_open *o, size_t n)
{
    uint32_t want = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
    int rc = kvx_st_writer_begin_tombs(s, o, want);
    if (rc == KVX_EFULL) { /* out of shard ids: merge small shards, as a put does */
        kvx_st_compact(s, 1);
        rc = kvx_st_writer_begin_tombs(s, o, want);
        if (rc == KVX_EFULL && kvx_st_evict_for_ids(s) > 0) rc = kvx_st_writer_begin_tombs(s, o, want);
    }
    return rc;
}

static int sk_write_tombs(kvx_store *s, st_open *po, const kvx_key *const *tombs, size_t n, kvx_cat_edit *e)
{
    st_open o = *po;
    int rc = 0;
    po->w = NULL;
    st_sealed v;
    memset(&v, 0, sizeof v);
    for (size_t i = 0; !rc && i < n; i++) {
        if (kvx_shard_writer_count(o.w) >= kvx_shard_writer_max(o.w)) {
            rc = kvx_fail(KVX_EFULL, "kvx_store_keyed_delete: %zu keys held is more than one delete writes (%u): "
                          "delete them in smaller calls", n, kvx_shard_writer_max(o.w));
            break;
        }
        rc = kvx_shard_writer_add_tombstone(o.w, (uint16_t)kvx_shard_writer_count(o.w), tombs[i]->bytes,
                                            (uint32_t)tombs[i]->len);
    }
    if (rc) {
        kvx_shard_writer_abort(o.w);
        return rc;
    }
    kvx_st_writer_park(s, &o, &v);
    uint64_t seq = s->next_seq++;
    rc = kvx_st_seal_parked(s, &v, 1, seq);
    int linked = 0, marked = 0;
    if (!rc && !(rc = kvx_st_link_files(s, &v, 1, seq, 0, &marked))) linked = 1;
    if (!rc) rc = kvx_st_unstage_files(s, seq, marked);
    if (!rc) {
        kvx_st_register(e, &v);
        kvx_cat_edit_next_gen(e, s->next_gen);
        kvx_cat_edit_next_seq(e, s->next_seq);
        rc = kvx_cat_apply(s->cat, e);
    }
    if (!rc) {
        kvx_st_published(&v, 1);
        return 0;
    }
    if (linked) kvx_st_unpublish(s, &v, 1, seq, marked);
    kvx_st_unlink_sealed(s, &v, 1);
    return rc;
}

int kvx_st_tombstone_keys(kvx_store *s, const kvx_key *keys, size_t n)
{
    int rc = 0;
    for (size_t at = 0; !rc && at < n;) {
        size_t k = n - at < 65535 ? n - at : 65535; /* one tombstone file holds at most 65,535 */
        const kvx_key **t = malloc(k * sizeof *t);
        if (!t) return kvx_fail(-ENOMEM, "store: out of memory");
        for (size_t i = 0; i < k; i++) t[i] = &keys[at + i];
        st_open o = {0};
        kvx_cat_edit e;
        kvx_cat_edit_init(&e);
        rc = sk_tomb_writer(s, &o, k);
        if (!rc) rc = sk_write_tombs(s, &o, t, k, &e);
        if (o.w) kvx_shard_writer_abort(o.w);
        kvx_cat_edit_free(&e);
        free(t);
        at += k;
    }
    return rc;
}

KVX_API int kvx_store_keyed_delete(kvx_store *s, const kvx_key *keys, size_t n, size_t *out_deleted)
{
    static const char fn[] = "kvx_store_keyed_delete";
    if (out_deleted) *out_deleted = 0;
    int rc = kvx_st_writer_check(s, fn);
    if (!rc) rc = kvx_st_kind_check(s, 1, fn);
    if (!rc) rc = sk_check_keys(keys, n, fn);
    if (rc || n == 0) return rc;
    /* sorted, so a key named twice is deleted once without comparing every
     * pair (n keys: n log n, not n^2 under the writer lock) */
    const kvx_key **ord = malloc(n * sizeof *ord);
    const kvx_key **tombs = malloc(n * sizeof *tombs);
    if (!ord || !tombs) {
        free(ord);
        free(tombs);
        return kvx_fail(-ENOMEM, "%s: out of memory", fn);
    }
    for (size_t i = 0; i < n; i++) ord[i] = &keys[i];
    qsort(ord, n, sizeof *ord, sk_key_cmp);
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    size_t deleted = 0, ntombs = 0;
    pthread_mutex_lock(&s->wmu);
    /* the tombstones' writer first: making room for it (a compaction, an
     * eviction) moves blocks, so the copies to delete are looked up after */
    st_open o = {0};
    kvx_cat_snap *snap;
    if (!(rc = sk_tomb_writer(s, &o, n)) && !(rc = kvx_cat_snap_begin(s->cat, &snap))) {
        for (size_t i = 0; !rc && i < n; i++) {
            if (i && sk_key_cmp(&ord[i - 1], &ord[i]) == 0) continue; /* a key named twice is deleted once */
            const kvx_key *key = ord[i];
            uint8_t digest[KVX_DIGEST_BYTES];
            st_query q;
            sk_query(&q, digest, key);
            /* every copy the index names under this key (two batches may
             * each have stored one), damaged ones too: the owner said so */
            size_t before = deleted;
            for (size_t j = 0; !rc; j++) {
                kvx_cat_loc loc;
                int r = kvx_cat_loc_at(snap, q.hash, j, &loc);
                if (r == KVX_ENOTFOUND) break;
                if (r) {
                    rc = r;
                    break;
                }
                if (!sk_loc_has_key(s, &loc, key)) continue;
                rc = kvx_cat_edit_del_block(&e, loc.coord, q.hash, loc.gen);
                deleted++;
            }
            /* a key the catalog names gets a tombstone; one it does not
             * name has no copy a tombstone must hide (every older copy of
             * a key already lies under one) */
            if (deleted > before) tombs[ntombs++] = key;
        }
        kvx_cat_snap_end(snap);
    }
    /* the tombstones are the delete: durable, with their sequence number,
     * before it is acknowledged (DESIGN.md trust rule 2) */
    if (!rc && ntombs) rc = sk_write_tombs(s, &o, tombs, ntombs, &e);
    if (o.w) kvx_shard_writer_abort(o.w);
    pthread_mutex_unlock(&s->wmu);
    kvx_cat_edit_free(&e);
    free(ord);
    free(tombs);
    if (rc) return rc;
    if (out_deleted) *out_deleted = deleted;
    return 0;
}
