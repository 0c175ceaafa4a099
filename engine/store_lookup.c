/*
 * store_lookup.c - lookups by coordinate, hash, tokens and prefix, and the
 * views they hand out.
 *
 * Rule (DESIGN.md rule 1): a block is served for a prompt only when its own
 * entry's hash, parent, tokens and prefix digest equal the prompt's and its
 * page passed its CRC; by hash alone only when exactly one verified block
 * holds the hash. The index is a hint: a stale or colliding record can
 * never serve wrong bytes.
 *
 * Cost: one catalog snapshot per call (from a pool), one get per block
 * (kvx_cat_loc_at, location 0), a cached shard handle per shard byte. A
 * damaged catalog record or a failed catalog read is an error, never a
 * miss.
 */
#include "store.h"
#include "common/digest.h"
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The last shard a prompt's lookup used, with its own reference: the next
 * block of a prompt usually lives in the same shard, and (byte, gen) names
 * one file for good, so a held handle skips the cache lock. */
typedef struct st_hc {
    kvx_shard *sh;
    uint32_t byte;
    uint64_t gen;
    int gone; /* a location's shard could not be had (moved since the snapshot?) */
    kvx_cat_loc gone_loc; /* the first such location */
} st_hc;

static kvx_shard *st_hc_get(kvx_store *s, st_hc *hc, uint32_t byte, uint64_t gen)
{
    if (!hc) return kvx_st_shard_get(s, byte, gen);
    if (hc->sh && hc->byte == byte && hc->gen == gen) return kvx_shard_ref(hc->sh);
    kvx_shard *sh = kvx_st_shard_get(s, byte, gen);
    if (sh) {
        kvx_shard_close(hc->sh);
        hc->sh = kvx_shard_ref(sh);
        hc->byte = byte;
        hc->gen = gen;
    }
    return sh;
}

/* Is entry e a verified block (stored with its tokens and digest)? */
static int st_verified(const kvx_entry *e) { return e->tokens && e->digest; }

/* A writer that frees pages in place raises free_seq after each free's
 * catalog commit and before its punch (store_holes.c). A lookup that
 * resolved a block before that commit and took its view after the raise
 * may hold a page being punched: a call whose views were taken across a
 * raise releases them and looks again (at most ST_FREE_TRIES times, then
 * it is a miss). */
#define ST_FREE_TRIES 4
static uint64_t st_free_seq(kvx_store *s) { return atomic_load(&s->free_seq); }
static int st_freed_since(kvx_store *s, uint64_t seen)
{
    atomic_thread_fence(memory_order_seq_cst); /* the views' references before the second look */
    return atomic_load(&s->free_seq) != seen;
}

/* check_page ST_ENTRY_ONLY: the entry alone is matched and a view made
 * whose page is not yet set (NULL): the caller checks it (st_run_pages). */
#define ST_ENTRY_ONLY 2

/* Does the block at loc answer q? 0 and a view; KVX_ENOTFOUND when it is
 * another block (or no longer there); KVX_EPAGECRC / KVX_ETRUNC when it is
 * the block but its page is damaged or missing. check_page 0: the entry
 * alone is matched and no view is made (counting). */
static int st_try_loc(kvx_store *s, const kvx_cat_loc *loc, const st_query *q, kvx_view *out, st_hc *hc,
                      uint8_t *out_digest, int check_page)
{
    uint32_t byte = KVX_COORD_SHARD(loc->coord);
    kvx_shard *sh = st_hc_get(s, hc, byte, loc->gen);
    if (!sh) {
        if (hc && !hc->gone) hc->gone_loc = *loc;
        if (hc) hc->gone = 1;
        return KVX_ENOTFOUND;
    }
    uint32_t idx = KVX_COORD_BLOCK(loc->coord);
    if (idx >= kvx_shard_get_info(sh)->num_blocks) {
        /* an active shard grown since this handle opened (store_active.c):
         * once, a fresh handle */
        if (hc && hc->sh == sh) {
            kvx_shard_close(hc->sh);
            hc->sh = NULL;
        }
        kvx_st_cache_stale(s, byte, sh);
        kvx_shard_close(sh);
        if (!(sh = st_hc_get(s, hc, byte, loc->gen))) return KVX_ENOTFOUND;
    }
    kvx_entry e;
    int rc = kvx_shard_entry(&e, sh, idx);
    if (rc || e.coordinate != loc->coord || e.hash != q->hash || e.token_count != (s->keyed ? 1 : s->g.block_tokens))
        goto miss;
    if (s->keyed || q->key) {
        /* a keyed page: the whole key, never its hash alone */
        if (!q->key || !e.key || e.key_len != q->key_len || memcmp(e.key, q->key, q->key_len) != 0) goto miss;
    } else if (q->toks) {
        /* rule 1: hash, parent, tokens and the prefix digest, all four */
        if (!st_verified(&e) || e.parent != q->parent || memcmp(e.tokens, q->toks, 4u * s->g.block_tokens) != 0 ||
            memcmp(e.digest, q->digest, KVX_DIGEST_BYTES) != 0)
            goto miss;
    }
    if (out_digest) { /* the block's digest; all zero when unverified */
        if (st_verified(&e)) memcpy(out_digest, e.digest, KVX_DIGEST_BYTES);
        else memset(out_digest, 0, KVX_DIGEST_BYTES);
    }
    if (!check_page) {
        kvx_shard_close(sh);
        return 0;
    }
    const void *page = q->dst;
    size_t page_len = e.bytes;
    if (check_page == ST_ENTRY_ONLY || q->no_page) goto view; /* checked later (a prefix's run), or never read */
    if (q->dst) /* read into the caller's memory and checked there, every time */
        rc = kvx_shard_page_read(sh, idx, q->dst, q->dst_cap, &page_len);
    else /* KVX_STORE_VERIFY (kvx.h): every served page's CRC, not once per handle */
        rc = s->flags & KVX_STORE_VERIFY || q->verify_page ? kvx_shard_page(&page, sh, idx, 1)
                                                           : kvx_shard_page_checked(&page, sh, idx);
    if (rc) {
        kvx_shard_close(sh);
        if (kvx_st_damage(q->dst != NULL, rc))
            return kvx_fail(rc, "store: block %016llx (coordinate 0x%08x, shards/%016llx.kvx): %s",
                            (unsigned long long)q->hash, loc->coord, (unsigned long long)loc->gen,
                            rc == KVX_EPAGECRC ? "page CRC mismatch"
                            : rc == KVX_ETRUNC ? "page missing (file truncated)"
                                               : strerror(-rc));
        return rc;
    }
view:
    out->coordinate = e.coordinate;
    out->token_count = e.token_count;
    out->hash = e.hash;
    out->page = page;
    out->page_bytes = page_len;
    out->scales = e.scales;
    out->shard = sh;
    out->entry = idx;
    return 0;
miss:
    kvx_shard_close(sh);
    return KVX_ENOTFOUND;
}

/* Why the shard of loc could not be had, for a lookup by hash, tokens or
 * coordinate that found nothing else (never for a prefix: there a damaged
 * block is a miss). The file is looked at again, read-only: a reader never
 * repairs. KVX_ECORRUPT when the file is there but cannot be used
 * (malformed, a bad checksum, cut short, not this store's), KVX_EPATH when
 * it is not a regular file, -ENOENT when it is gone, -EAGAIN when it opens now (a passing
 * failure, or a file a rewrite moved since the snapshot); the message
 * names the block, the file and the reason. */
static int st_shard_unusable(kvx_store *s, const kvx_cat_loc *loc, uint64_t hash)
{
    char name[ST_ACTIVE_NAME_MAX], why[512];
    kvx_st_shard_name(name, loc->gen);
    struct stat st;
    int code = KVX_ECORRUPT;
    int sr = kvx_os.fstatat(s->shardsfd, name, &st, AT_SYMLINK_NOFOLLOW);
    if (sr != 0 && errno == ENOENT) { /* an active shard's (store_active.c) */
        kvx_st_active_name(name, loc->gen, KVX_COORD_SHARD(loc->coord));
        sr = kvx_os.fstatat(s->shardsfd, name, &st, AT_SYMLINK_NOFOLLOW);
        if (sr != 0 && errno == ENOENT) kvx_st_shard_name(name, loc->gen);
    }
    if (sr != 0) {
        int e = errno;
        code = e == ENOENT ? -ENOENT : -EAGAIN;
        snprintf(why, sizeof why, "%s", e == ENOENT ? "the file is gone" : strerror(e));
    } else if (!S_ISREG(st.st_mode)) {
        code = KVX_EPATH; /* as verify names it: kvx leaves such a thing alone */
        snprintf(why, sizeof why, "it is a %s, not a regular file", kvx_file_type_name(st.st_mode));
    } else {
        kvx_shard *sh = NULL;
        int rc = kvx_st_open_gen(s, KVX_COORD_SHARD(loc->coord), loc->gen, &sh, NULL, 0);
        if (rc == 0) {
            char ours[300] = "";
            int orc = kvx_shard_get_info(sh)->shard_id != KVX_COORD_SHARD(loc->coord)
                          ? KVX_ESHARDID
                          : kvx_st_shard_ours(s, sh, ours, sizeof ours);
            kvx_shard_close(sh);
            if (orc == 0) {
                code = -EAGAIN;
                snprintf(why, sizeof why, "it could not be opened a moment ago, and opens now");
            } else if (orc == KVX_ESHARDID) {
                snprintf(why, sizeof why, "it holds another shard byte than %u (KVX_ESHARDID)",
                         KVX_COORD_SHARD(loc->coord));
            } else {
                snprintf(why, sizeof why, "%s (%s)", ours, kvx_err_name(orc));
            }
        } else {
            if (st_open_transient(rc)) code = -EAGAIN;
            snprintf(why, sizeof why, "%s (%s)", *kvx_last_error() ? kvx_last_error() : kvx_strerror(rc),
                     kvx_err_name(rc));
        }
    }
    return kvx_fail(code, "store: block %016llx is indexed in shards/%s (coordinate 0x%08x), which cannot be read: %s",
                    (unsigned long long)hash, name, loc->coord, why);
}

/* Every location of q->hash, in order, until one answers. A damaged
 * copy does not end the search (a good copy may follow: a put stores the
 * block again when its only copy is damaged); when none answers, the
 * damage is reported rather than "not found". A damaged catalog record or
 * a failed read ends it with that error. */
static int st_lookup_hc(kvx_store *s, kvx_cat_snap *snap, const st_query *q, kvx_view *out, st_hc *hc,
                        int check_page)
{
    kvx_cat_loc loc;
    int rc = kvx_cat_loc_at(snap, q->hash, 0, &loc);
    if (rc) return rc; /* KVX_ENOTFOUND (no message) or the catalog's error */
    rc = st_try_loc(s, &loc, q, out, hc, NULL, check_page);
    if (rc != KVX_ENOTFOUND && !kvx_st_damage(q->dst != NULL, rc)) return rc;
    int damage = rc == KVX_ENOTFOUND ? 0 : rc;
    /* other blocks under the same hash (collisions, unverified copies) */
    int res = KVX_ENOTFOUND;
    for (size_t i = 1;; i++) {
        if ((rc = kvx_cat_loc_at(snap, q->hash, i, &loc))) {
            if (rc != KVX_ENOTFOUND) res = rc;
            break;
        }
        res = st_try_loc(s, &loc, q, out, hc, NULL, check_page);
        if (kvx_st_damage(q->dst != NULL, res)) {
            damage = res;
            res = KVX_ENOTFOUND;
        } else if (res != KVX_ENOTFOUND) {
            break;
        }
    }
    if (res == KVX_ENOTFOUND && damage) {
        /* the message of the damaged copy is the one left behind */
        return damage;
    }
    return res;
}

int kvx_st_lookup(kvx_store *s, kvx_cat_snap *snap, const st_query *q, kvx_view *out)
{
    return st_lookup_hc(s, snap, q, out, NULL, 1);
}

/* What st_get_by_hash answers when no verified block answered and some
 * location of the hash lies in a shard that could not be had (hc->gone):
 * the caller looks again in a fresh snapshot, then names the shard. */
#define ST_UNUSABLE 1

/* A get by hash alone (DESIGN.md rule 1): the one verified block holding
 * hash, KVX_EAMBIGUOUS when several do, KVX_EUNVERIFIED when only
 * unverified ones do; ST_UNUSABLE when none does but a location's shard
 * could not be had (hc->gone_loc): it may hold the block. */
static int st_get_by_hash(kvx_store *s, kvx_cat_snap *snap, uint64_t hash, kvx_view *out, st_hc *hc)
{
    st_query q = {.hash = hash, .parent = 0, .toks = NULL, .digest = NULL};
    /* copies of one block (a carried or adopted duplicate) share its
     * digest: only distinct digests are distinct blocks */
    size_t verified = 0, unverified = 0, npick = 0;
    uint8_t first[KVX_DIGEST_BYTES], d[KVX_DIGEST_BYTES];
    kvx_cat_loc pick[8]; /* copies of the block, tried in order */
    int rc;
    kvx_cat_loc loc;
    size_t unknown = 0; /* locations in a shard that cannot be opened now */
    for (size_t i = 0; (rc = kvx_cat_loc_at(snap, hash, i, &loc)) == 0; i++) {
        int r = st_try_loc(s, &loc, &q, NULL, hc, d, 0);
        if (r == KVX_ENOTFOUND) {
            /* a miss, or a passing failure to open the shard (the cache then
             * holds no verdict on that generation): another block may hold
             * the hash there, so the hash cannot be called unique */
            pthread_rwlock_rdlock(&s->cache_lock);
            const st_cache *c = &s->cache[KVX_COORD_SHARD(loc.coord)];
            unknown += !(c->gen == loc.gen && (c->sh || c->bad));
            pthread_rwlock_unlock(&s->cache_lock);
        }
        if (r == 0) {
            int ver = !kvx_digest_is_zero(d);
            if (ver && verified == 0) {
                pick[npick++] = loc;
                memcpy(first, d, sizeof first);
                verified = 1;
            } else if (ver && memcmp(first, d, sizeof d) != 0) {
                verified++;
            } else if (ver && npick < sizeof pick / sizeof pick[0]) {
                pick[npick++] = loc; /* another copy of the same block */
            }
            unverified += !ver;
        }
    }
    if (rc != KVX_ENOTFOUND) return rc; /* a damaged record or a failed read */
    if (verified > 1)
        return kvx_fail(KVX_EAMBIGUOUS, "store: %zu different verified blocks share hash %016llx (an FNV collision): give the tokens to pick one",
                        verified, (unsigned long long)hash);
    if (verified == 1 && unknown)
        return kvx_fail(-EAGAIN, "store: hash %016llx: %zu of its locations sit in a shard that cannot be opened "
                                 "now, so it cannot be called unique: try again, or give the tokens",
                        (unsigned long long)hash, unknown);
    if (verified == 0 && hc->gone) return ST_UNUSABLE;
    if (verified == 0 && unverified)
        return kvx_fail(KVX_EUNVERIFIED, "store: block %016llx is held only unverified (stored without its tokens)",
                        (unsigned long long)hash);
    if (verified == 0) return kvx_fail(KVX_ENOTFOUND, "store: no block with hash %016llx", (unsigned long long)hash);
    /* the first copy whose page passes its CRC; damage only if none does */
    int rc2 = KVX_ENOTFOUND;
    for (size_t i = 0; i < npick; i++) {
        rc2 = st_try_loc(s, &pick[i], &q, out, NULL, NULL, 1);
        if (rc2 != KVX_EPAGECRC && rc2 != KVX_ETRUNC && rc2 != KVX_ENOTFOUND) break;
    }
    return rc2 == KVX_ENOTFOUND
               ? kvx_fail(KVX_ENOTFOUND, "store: no block with hash %016llx", (unsigned long long)hash)
               : rc2;
}

/* st_get_by_hash, looking once more in a fresh snapshot (*snap replaced;
 * NULL when that failed) when a location's shard could not be had: a
 * rewrite (compaction, eviction's carry, gc) may have moved the block since
 * the snapshot began, and files go only after their commit. When the shard
 * still cannot be had, its damage is the answer, not "not found": a reader
 * never repairs, and the block may be in it. */
static int st_get_by_hash_once(kvx_store *s, kvx_cat_snap **snap, uint64_t hash, kvx_view *out)
{
    st_hc hc = {NULL, 0, 0, 0, {0, 0}};
    int rc = st_get_by_hash(s, *snap, hash, out, &hc);
    if (rc == ST_UNUSABLE) {
        kvx_cat_snap_end(*snap);
        *snap = NULL;
        hc.gone = 0;
        if ((rc = kvx_cat_snap_begin(s->cat, snap))) {
            *snap = NULL;
        } else {
            rc = st_get_by_hash(s, *snap, hash, out, &hc);
            if (rc == ST_UNUSABLE) rc = st_shard_unusable(s, &hc.gone_loc, hash);
        }
    }
    kvx_shard_close(hc.sh);
    return rc;
}

static void st_view_clear(kvx_view *v) { memset(v, 0, sizeof *v); }

KVX_API void kvx_view_release(kvx_view *v)
{
    if (!v) return;
    kvx_shard_close(v->shard);
    st_view_clear(v);
}

KVX_API void kvx_views_release(kvx_view *views, size_t n)
{
    if (!views) return;
    for (size_t i = 0; i < n; i++) kvx_view_release(&views[i]);
}

static int st_get_once(kvx_view *out, kvx_store *s, uint32_t coordinate)
{
    if (!out || !s) return kvx_fail(KVX_EINVALID, "kvx_store_get: NULL argument");
    st_view_clear(out);
    kvx_cat_snap *snap;
    int rc = kvx_cat_snap_begin(s->cat, &snap);
    if (rc) return rc;
    kvx_cat_coord cv;
    rc = kvx_cat_coord_get(snap, coordinate, &cv); /* a damaged record: KVX_ECORRUPT naming reindex */
    if (rc == 0) {
        kvx_cat_loc loc = {coordinate, cv.gen};
        st_query q = {.hash = cv.hash, .parent = 0, .toks = NULL, .digest = NULL};
        st_hc hc = {NULL, 0, 0, 0, {0, 0}};
        rc = st_try_loc(s, &loc, &q, out, &hc, NULL, 1);
        kvx_shard_close(hc.sh);
        /* the shard the index names for it could not be had: say so (the
         * coordinate's shard byte may have been rewritten since the
         * snapshot: a fresh look decides) */
        if (rc == KVX_ENOTFOUND && hc.gone) {
            kvx_cat_snap_end(snap);
            if ((rc = kvx_cat_snap_begin(s->cat, &snap))) return rc;
            if ((rc = kvx_cat_coord_get(snap, coordinate, &cv)) == 0) {
                loc.gen = cv.gen;
                q.hash = cv.hash;
                hc = (st_hc){NULL, 0, 0, 0, {0, 0}};
                rc = st_try_loc(s, &loc, &q, out, &hc, NULL, 1);
                kvx_shard_close(hc.sh);
                if (rc == KVX_ENOTFOUND && hc.gone) rc = st_shard_unusable(s, &loc, q.hash);
            }
        }
    }
    kvx_cat_snap_end(snap);
    if (rc == KVX_ENOTFOUND) rc = kvx_fail(KVX_ENOTFOUND, "store: no block at coordinate 0x%08x", coordinate);
    if (rc == 0 || rc == KVX_ENOTFOUND) kvx_st_note(s, out, rc == 0, rc != 0, 1);
    return rc;
}

static int st_get_hash_once(kvx_view *out, kvx_store *s, uint64_t hash)
{
    if (!out || !s) return kvx_fail(KVX_EINVALID, "kvx_store_get_hash: NULL argument");
    int krc = kvx_st_kind_check(s, 0, "kvx_store_get_hash");
    if (krc) return krc;
    st_view_clear(out);
    kvx_cat_snap *snap;
    int rc = kvx_cat_snap_begin(s->cat, &snap);
    if (rc) return rc;
    rc = st_get_by_hash_once(s, &snap, hash, out);
    if (snap) kvx_cat_snap_end(snap);
    if (rc == 0 || rc == KVX_ENOTFOUND) kvx_st_note(s, out, rc == 0, rc != 0, 1);
    return rc;
}

static int st_get_hashes_once(kvx_view *out_views, int *out_status, kvx_store *s, const uint64_t *hashes, size_t n)
{
    if (!s || (n && (!out_views || !out_status || !hashes)))
        return kvx_fail(KVX_EINVALID, "kvx_store_get_hashes: NULL argument");
    int krc = kvx_st_kind_check(s, 0, "kvx_store_get_hashes");
    if (krc) return krc;
    for (size_t i = 0; i < n; i++) st_view_clear(&out_views[i]);
    kvx_cat_snap *snap;
    int rc = kvx_cat_snap_begin(s->cat, &snap);
    if (rc) return rc;
    uint64_t misses = 0;
    for (size_t i = 0; i < n; i++) {
        if (!snap) { /* a failed fresh snapshot ends the batch: the rest are not looked up */
            out_status[i] = rc;
            misses++;
            continue;
        }
        out_status[i] = st_get_by_hash_once(s, &snap, hashes[i], &out_views[i]);
        if (!snap) rc = out_status[i];
        if (out_status[i]) misses++;
    }
    if (snap) kvx_cat_snap_end(snap);
    kvx_st_note(s, out_views, n, misses, 1); /* views of misses are zeroed (shard NULL) */
    return 0;
}

/* The pages of a prefix's run, views[from..n) (entries matched, pages not
 * yet set; views before from are served): every page not yet checked is
 * asked of the kernel at once (kvx_shard_willneed, one call per shard a
 * run of views shares), then each is checked in order as it lands,
 * exactly as st_try_loc checks it.
 * A page that fails is looked up again in full (every location of its
 * hash, pages checked: a good copy may follow, and the message left is
 * the one a lookup leaves). Returns how many views are served; the views
 * from the first that is not are released, and *out_rc is that block's
 * error. */
static size_t st_run_pages(kvx_store *s, kvx_cat_snap *snap, st_hc *hc, kvx_view *views, size_t from, size_t n,
                           const uint32_t *tokens, int *out_rc)
{
    uint32_t idx[64];
    for (size_t a = from; a < n;) {
        size_t b = a, k = 0;
        for (; b < n && views[b].shard == views[a].shard && k < sizeof idx / sizeof idx[0]; b++)
            idx[k++] = views[b].entry;
        /* the run's first range, at a file's start, is left to the fault
         * that checks it first (format/shard_reader.c) */
        kvx_shard_willneed(views[a].shard, idx, k, a == from);
        a = b;
    }
    uint32_t B = s->g.block_tokens;
    for (size_t i = from; i < n; i++) {
        kvx_view *v = &views[i];
        const void *page;
        int rc = s->flags & KVX_STORE_VERIFY ? kvx_shard_page(&page, v->shard, v->entry, 1)
                                              : kvx_shard_page_checked(&page, v->shard, v->entry);
        if (rc == 0) {
            v->page = page;
            continue;
        }
        /* the rare path: the block once more, as a lookup of it alone */
        uint64_t hash = v->hash;
        kvx_view_release(v);
        uint8_t(*d)[KVX_DIGEST_BYTES] = malloc((i + 1) * KVX_DIGEST_BYTES);
        if (!d) {
            rc = kvx_fail(-ENOMEM, "store: out of memory");
        } else {
            kvx_prefix_digests(d, tokens, (i + 1) * B, B);
            st_query q = {.hash = hash, .parent = i ? views[i - 1].hash : 0, .toks = tokens + i * B, .digest = d[i]};
            rc = st_lookup_hc(s, snap, &q, v, hc, 1);
            free(d);
        }
        if (rc == 0) continue;
        kvx_views_release(views + i + 1, n - i - 1);
        *out_rc = rc;
        return i;
    }
    return n;
}

/* kvx_store_prefix's local part (entries_only 0), or the entries alone
 * of kvx_store_prefix_read's run (entries_only 1: views whose page is
 * NULL, nothing read, nothing noted; fn names the caller). */
static int st_prefix_once(kvx_view *out_views, size_t *out_n, kvx_store *s, const uint32_t *tokens, size_t n_tokens,
                          size_t max_views, int entries_only, const char *fn)
{
    if (!out_n || !s || (n_tokens && !tokens) || (max_views && !out_views))
        return kvx_fail(KVX_EINVALID, "%s: NULL argument", fn);
    *out_n = 0;
    int krc = kvx_st_kind_check(s, 0, fn); /* keyed pages are never served by prefix */
    if (krc) return krc;
    uint32_t B = s->g.block_tokens;
    size_t nblocks = n_tokens / B;
    size_t want = nblocks < max_views ? nblocks : max_views;
    kvx_digest_ctx dc;
    int rc = want ? kvx_digest_ctx_init(&dc) : 0;
    if (rc) return rc;
    kvx_cat_snap *snap;
    if ((rc = kvx_cat_snap_begin(s->cat, &snap))) {
        if (want) kvx_digest_ctx_free(&dc);
        return rc;
    }
    uint8_t digest[2][KVX_DIGEST_BYTES];
    uint64_t parent = 0, h = want ? kvx_block_hash(0, tokens, B) : 0;
    if (want) kvx_digest_step(&dc, digest[0], NULL, tokens, B);
    size_t i = 0;
    st_hc hc = {NULL, 0, 0, 0, {0, 0}};
    int retried = 0;
    size_t done = 0; /* views whose pages are checked */
    for (; i < want; i++) {
        const uint32_t *t = tokens + i * B;
        uint8_t *d = digest[i & 1];
        /* the next block's hash and digest first: their arithmetic
         * (latency-bound chains) overlaps this block's index search
         * (load-bound) out of order */
        uint64_t next = 0;
        if (i + 1 < want) {
            next = kvx_block_hash(h, t + B, B);
            kvx_digest_step(&dc, digest[(i + 1) & 1], d, t + B, B);
        }
        st_query q = {.hash = h, .parent = parent, .toks = t, .digest = d};
        hc.gone = 0;
        rc = st_lookup_hc(s, snap, &q, &out_views[i], &hc, ST_ENTRY_ONLY);
        if (rc == KVX_ENOTFOUND && hc.gone && !retried) {
            /* the file the snapshot named is gone: a rewrite (compaction,
             * eviction's carry, gc) that moved its blocks committed after
             * the snapshot began, and files go only after their commit.
             * Look again, once, in a fresh snapshot. */
            retried = 1;
            kvx_cat_snap_end(snap);
            if ((rc = kvx_cat_snap_begin(s->cat, &snap))) {
                snap = NULL;
                break;
            }
            rc = st_lookup_hc(s, snap, &q, &out_views[i], &hc, ST_ENTRY_ONLY);
        }
        if (rc) break;
        if (i == 0 && !entries_only && kvx_shard_at_start(out_views[0].shard, out_views[0].entry)) {
            /* a run from a file's start: its first page now, so the
             * fault's read-ahead (large folios) is in flight while the
             * other entries are matched */
            int prc = 0;
            if (st_run_pages(s, snap, &hc, out_views, 0, 1, tokens, &prc) == 0) {
                rc = prc;
                break;
            }
            done = 1;
        }
        parent = h;
        h = next;
    }
    if (i > done && snap && !entries_only) { /* the run's pages: asked for at once, then checked in order */
        int prc = 0;
        size_t m = st_run_pages(s, snap, &hc, out_views, done, i, tokens, &prc);
        if (m < i) {
            i = m;
            rc = prc;
        }
    }
    if (snap) kvx_cat_snap_end(snap);
    kvx_shard_close(hc.sh);
    if (want) kvx_digest_ctx_free(&dc);
    if (rc && rc != KVX_ENOTFOUND && rc != KVX_EPAGECRC && rc != KVX_ETRUNC) {
        kvx_views_release(out_views, i);
        return rc;
    }
    *out_n = i;
    if (entries_only) {
        kvx_clear_error();
        return 0;
    }
    kvx_st_note(s, out_views, i, nblocks - i, 1);
    /* a plain miss leaves no message; damage keeps the block's (the
     * served prefix is still good: only the damaged block and what follows
     * are withheld) */
    if (rc != KVX_EPAGECRC && rc != KVX_ETRUNC) kvx_clear_error();
    return 0;
}

static int st_prefix(kvx_view *out_views, size_t *out_n, kvx_store *s, const uint32_t *tokens, size_t n_tokens,
                     size_t max_views, int entries_only, const char *fn)
{
    for (int k = 1;; k++) {
        uint64_t seen = st_free_seq(s);
        int rc = st_prefix_once(out_views, out_n, s, tokens, n_tokens, max_views, entries_only, fn);
        if (rc || !*out_n || !st_freed_since(s, seen)) return rc;
        kvx_views_release(out_views, *out_n);
        *out_n = 0;
        if (k == ST_FREE_TRIES) return 0;
    }
}

int kvx_st_prefix_local(kvx_view *out_views, size_t *out_n, kvx_store *s, const uint32_t *tokens, size_t n_tokens,
                        size_t max_views)
{
    return st_prefix(out_views, out_n, s, tokens, n_tokens, max_views, 0, "kvx_store_prefix");
}

int kvx_st_prefix_entries(kvx_view *out_views, size_t *out_n, kvx_store *s, const uint32_t *tokens, size_t n_tokens,
                          size_t max_views, const char *fn)
{
    return st_prefix(out_views, out_n, s, tokens, n_tokens, max_views, 1, fn);
}

static int st_get_block_once(kvx_view *out, kvx_store *s, const uint32_t *tokens, size_t n_tokens)
{
    if (!out || !s || !tokens) return kvx_fail(KVX_EINVALID, "kvx_store_get_block: NULL argument");
    st_view_clear(out);
    int krc = kvx_st_kind_check(s, 0, "kvx_store_get_block");
    if (krc) return krc;
    uint32_t B = s->g.block_tokens;
    size_t n = n_tokens / B;
    if (n == 0) return kvx_fail(KVX_ETOKENS, "kvx_store_get_block: %zu tokens hold no full block of %u", n_tokens, B);
    uint64_t *h = malloc(n * sizeof *h);
    uint8_t(*d)[KVX_DIGEST_BYTES] = malloc(n * KVX_DIGEST_BYTES);
    if (!h || !d) {
        free(h);
        free(d);
        return kvx_fail(-ENOMEM, "store: out of memory");
    }
    kvx_block_hashes(h, tokens, n * B, B);
    kvx_prefix_digests(d, tokens, n * B, B);
    kvx_cat_snap *snap;
    int rc = kvx_cat_snap_begin(s->cat, &snap);
    if (!rc) {
        st_query q = {.hash = h[n - 1], .parent = n > 1 ? h[n - 2] : 0, .toks = tokens + (n - 1) * B, .digest = d[n - 1]};
        st_hc hc = {NULL, 0, 0, 0, {0, 0}};
        rc = st_lookup_hc(s, snap, &q, out, &hc, 1);
        if (rc == KVX_ENOTFOUND && hc.gone) {
            /* as for a get by hash: once more in a fresh snapshot, then the
             * shard that could not be had is named (it may hold the block) */
            kvx_cat_snap_end(snap);
            snap = NULL;
            hc.gone = 0;
            if ((rc = kvx_cat_snap_begin(s->cat, &snap)) == 0) {
                rc = st_lookup_hc(s, snap, &q, out, &hc, 1);
                if (rc == KVX_ENOTFOUND && hc.gone) rc = st_shard_unusable(s, &hc.gone_loc, q.hash);
            } else {
                snap = NULL;
            }
        }
        kvx_shard_close(hc.sh);
        if (snap) kvx_cat_snap_end(snap);
        if (rc == KVX_ENOTFOUND)
            rc = kvx_fail(KVX_ENOTFOUND, "store: no verified block %016llx for these tokens (block %zu)",
                          (unsigned long long)h[n - 1], n - 1);
        if (rc == 0 || rc == KVX_ENOTFOUND) kvx_st_note(s, out, rc == 0, rc != 0, 1);
    }
    free(h);
    free(d);
    return rc;
}

KVX_API int kvx_store_get(kvx_view *out, kvx_store *s, uint32_t coordinate)
{
    for (int k = 1;; k++) {
        uint64_t seen = s ? st_free_seq(s) : 0;
        int rc = st_get_once(out, s, coordinate);
        if (rc || !st_freed_since(s, seen)) return rc;
        kvx_view_release(out);
        if (k == ST_FREE_TRIES) return kvx_fail(KVX_ENOTFOUND, "store: no block at coordinate 0x%08x", coordinate);
    }
}

KVX_API int kvx_store_get_hash(kvx_view *out, kvx_store *s, uint64_t hash)
{
    for (int k = 1;; k++) {
        uint64_t seen = s ? st_free_seq(s) : 0;
        int rc = st_get_hash_once(out, s, hash);
        if (rc || !st_freed_since(s, seen)) return rc;
        kvx_view_release(out);
        if (k == ST_FREE_TRIES)
            return kvx_fail(KVX_ENOTFOUND, "store: block %016llx was evicted", (unsigned long long)hash);
    }
}

KVX_API int kvx_store_get_hashes(kvx_view *out_views, int *out_status, kvx_store *s, const uint64_t *hashes, size_t n)
{
    for (int k = 1;; k++) {
        uint64_t seen = s ? st_free_seq(s) : 0;
        int rc = st_get_hashes_once(out_views, out_status, s, hashes, n);
        if (rc || !st_freed_since(s, seen)) return rc;
        kvx_views_release(out_views, n);
        if (k == ST_FREE_TRIES) {
            for (size_t i = 0; i < n; i++) out_status[i] = KVX_ENOTFOUND;
            return 0;
        }
    }
}

KVX_API int kvx_store_get_block(kvx_view *out, kvx_store *s, const uint32_t *tokens, size_t n_tokens)
{
    for (int k = 1;; k++) {
        uint64_t seen = s ? st_free_seq(s) : 0;
        int rc = st_get_block_once(out, s, tokens, n_tokens);
        if (rc || !st_freed_since(s, seen)) return rc;
        kvx_view_release(out);
        if (k == ST_FREE_TRIES) return kvx_fail(KVX_ENOTFOUND, "store: the block was evicted while it was looked up");
    }
}
