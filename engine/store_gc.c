/*
 * store_gc.c - gc, the maintenance pass: damaged shards salvaged, lineage
 * without a head dropped, digests derived for blocks written before them.
 *
 * Rule: a pass that cannot see every shard changes nothing
 * (ST_PASS_SKIPPED); a damaged shard's good blocks are copied before the
 * file goes to quarantine/.
 */
#include "store.h"
#include "common/digest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A lineage entry of the store, for deriving digests (DESIGN.md rule 4). */
typedef struct st_lin {
    uint64_t hash, parent;
    uint32_t b, idx;
    const uint32_t *toks;
    uint8_t digest[KVX_DIGEST_BYTES];
    int state; /* 0 unknown, 1 known, 2 ambiguous (stays unverified) */
    int stored; /* the shard holds the digest already */
    int legacy; /* its shard was written without a digest table (pre-digest kvx) */
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
        if (!s->reg->live[b] || !(s->reg->rec[b].flags & KVX_FLAG_LINEAGE)) continue;
        if (!(sh[b] = kvx_st_shard_get(s, b, s->reg->rec[b].gen))) {
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
            l->legacy = !(s->reg->rec[b].flags & KVX_FLAG_DIGEST);
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

/* The parent digest of child c: 1 and the digest when c's shard was
 * written by pre-digest kvx, every entry with hash == c->parent that has
 * a digest agrees and one of them sits in c's own shard before it (pre-
 * digest kvx wrote a put's blocks in order into its shard: the parent is
 * known, not inferred from a 64-bit hash, which a crafted FNV collision
 * matches when the true parent is gone and another prompt's block is
 * held); 0 when a candidate is not known yet; -1 otherwise (c stays
 * unverified: a miss, never a wrong block). A child without a digest in
 * a digest shard was carried there by a rewrite (eviction, compaction),
 * which puts blocks of different shards side by side: never derived. */
static int st_parent_digest(const st_lin *all, size_t n, const st_lin *c, const uint8_t **out)
{
    if (!c->legacy) return -1;
    st_lin key = {.hash = c->parent};
    const st_lin *p = bsearch(&key, all, n, sizeof *all, st_cmp_lin);
    if (!p) return -1; /* no parent held: the chain has no block-0 root here */
    while (p > all && p[-1].hash == c->parent) p--;
    const uint8_t *d = NULL;
    int unknown = 0, same_put = 0;
    for (; p < all + n && p->hash == c->parent; p++) {
        if (p->state == 2) return -1;
        same_put |= p->b == c->b && p->idx < c->idx;
        if (p->state == 0) {
            unknown = 1;
            continue;
        }
        if (d && memcmp(d, p->digest, KVX_DIGEST_BYTES) != 0) return -1; /* two candidate parents */
        d = p->digest;
    }
    if (!same_put) return -1;
    if (unknown) return 0;
    *out = d;
    return d ? 1 : -1;
}

/* Shards written before the digest existed have lineage but no digest
 * table: their blocks are unverified. Walk lineage from blocks whose
 * parent is 0, derive each block's digest where it has exactly one
 * candidate parent and that parent is in its own pre-digest shard before
 * it (st_parent_digest), and rewrite those shards into digest shards (a
 * sound shard only: a damaged one stays as it is, unverified). */
int kvx_st_derive_digests(kvx_store *s)
{
    /* shards written before the digest, and digest shards holding blocks
     * without one (a rewrite by gc or eviction carries a block's missing
     * digest as it is) */
    int need = 0;
    for (int b = 0; b < ST_SLOTS; b++)
        need |= s->reg->live[b] && (s->reg->rec[b].flags & KVX_FLAG_LINEAGE) &&
                (!(s->reg->rec[b].flags & KVX_FLAG_DIGEST) || s->reg->rec[b].n_unverified);
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
                int r = st_parent_digest(all, n, &all[i], &pd);
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
        if (kvx_st_shard_sound(s, b, s->reg->rec[b].gen, why, sizeof why) != 1) continue;
        st_move *mv = NULL;
        size_t nmv = 0, capmv = 0;
        rc = kvx_st_collect(s, b, NULL, 0, 0, &mv, &nmv, &capmv, SIZE_MAX);
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
        if (!rc && nmv) rc = kvx_st_rewrite(s, mv, nmv, kvx_st_kind_flags(s, ST_KIND_LINEAGE), busy, &added, &nadded);
        if (!rc) {
            st_drop d = {s, victims, added, nadded, mv, nmv, 0, 0, 0};
            rc = kvx_st_drop_write(s, &d);
            if (rc) kvx_st_unlink_sealed(s, added, nadded);
            else {
                kvx_shard_close(sh[b]);
                sh[b] = NULL;
                kvx_st_after_drop(s, victims, NULL);
            }
        }
        free(added);
        free(mv);
    }
    for (int b = 0; b < ST_SLOTS; b++) kvx_shard_close(sh[b]);
    free(all);
    return rc;
}

/* A block of a shard: its hash and index (st_drops_a_parent). */
typedef struct st_hidx {
    uint64_t hash;
    uint32_t idx;
} st_hidx;

static int st_cmp_hidx(const void *a, const void *b)
{
    const st_hidx *x = a, *y = b;
    if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* The first of sorted a[0..n) with that hash (the lowest index), or NULL. */
static const st_hidx *st_hidx_first(const st_hidx *a, size_t n, uint64_t hash)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid].hash < hash) lo = mid + 1;
        else hi = mid;
    }
    return lo < n && a[lo].hash == hash ? &a[lo] : NULL;
}

/* Would copying moves mv (the blocks of pre-digest shard b a rewrite
 * keeps, less those whose page fails its CRC: kvx_st_rewrite leaves them
 * out) leave a block C whose parent hash names a block left out and also a
 * block kept before C (a collision)? Reindex would then derive C from the
 * kept one (st_parent_digest). 1 yes, 0 no, <0 an error. */
static int st_drops_a_parent(kvx_store *s, uint32_t b, const st_move *mv, size_t nmv)
{
    kvx_shard *sh = kvx_st_shard_get(s, b, s->reg->rec[b].gen);
    if (!sh) return kvx_fail(-EIO, "store: shard %u cannot be opened to copy its blocks", b);
    uint32_t n = kvx_shard_get_info(sh)->num_blocks;
    uint8_t *copied = calloc(n ? n : 1, 1);
    st_hidx *kept = malloc((n ? n : 1) * sizeof *kept), *gone = malloc((n ? n : 1) * sizeof *gone);
    if (!copied || !kept || !gone) {
        free(copied);
        free(kept);
        free(gone);
        kvx_shard_close(sh);
        return kvx_fail(-ENOMEM, "store: out of memory");
    }
    for (size_t i = 0; i < nmv; i++) {
        uint32_t idx = KVX_COORD_BLOCK(mv[i].src_coord);
        const void *page;
        if (idx < n && kvx_shard_page(&page, sh, idx, 1) == 0) copied[idx] = 1;
    }
    size_t nk = 0, ng = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvx_entry e;
        if (kvx_shard_entry(&e, sh, i) || !e.hash) continue;
        if (copied[i]) kept[nk++] = (st_hidx){e.hash, i};
        else gone[ng++] = (st_hidx){e.hash, i};
    }
    int hit = 0;
    if (ng && nk) {
        qsort(kept, nk, sizeof *kept, st_cmp_hidx);
        qsort(gone, ng, sizeof *gone, st_cmp_hidx);
        for (size_t k = 0; k < nk && !hit; k++) {
            kvx_entry c;
            if (kvx_shard_entry(&c, sh, kept[k].idx) || !c.parent || !st_hidx_first(gone, ng, c.parent)) continue;
            const st_hidx *f = st_hidx_first(kept, nk, c.parent);
            hit = f && f->idx < kept[k].idx;
        }
    }
    free(copied);
    free(kept);
    free(gone);
    kvx_shard_close(sh);
    return hit;
}

/* Rewrites shard b keeping only the entries keep[0..nkeep) marks (NULL: all
 * whose page is sound), then drops it: deleted when sound, else
 * quarantined. */
static int st_rewrite_shard(kvx_store *s, uint32_t b, const uint8_t *keep, size_t nkeep, int damaged,
                            const char *damaged_why)
{
    st_move *mv = NULL;
    size_t nmv = 0, capmv = 0;
    int rc = kvx_st_collect(s, b, NULL, 0, 0, &mv, &nmv, &capmv, SIZE_MAX);
    if (rc) {
        free(mv);
        return rc;
    }
    size_t w = 0;
    for (size_t i = 0; i < nmv; i++)
        if (!keep || (KVX_COORD_BLOCK(mv[i].src_coord) < nkeep && keep[KVX_COORD_BLOCK(mv[i].src_coord)]))
            mv[w++] = mv[i];
    nmv = w;
    st_sealed *added = NULL;
    size_t nadded = 0;
    uint8_t busy[ST_SLOTS] = {0}, victims[ST_SLOTS] = {0};
    victims[b] = 1;
    uint32_t src = s->reg->rec[b].flags;
    uint32_t flags = src & (KVX_FLAG_HASHES | KVX_FLAG_LINEAGE | KVX_FLAG_SCALES | KVX_FLAG_KEYS | KVX_FLAG_DIGEST |
                            KVX_FLAG_SEQ | KVX_FLAG_TOMB);
    /* a pre-digest shard stays one (its blocks in their order): reindex
     * derives a digest only from a parent before the block in such a
     * shard (st_parent_digest), never in a digest shard. Unless a block it
     * leaves out is the parent of one it keeps: an earlier block of that
     * hash (a collision) would then pass for the parent */
    if ((flags & KVX_FLAG_LINEAGE) && !(flags & KVX_FLAG_DIGEST)) {
        int r = st_drops_a_parent(s, b, mv, nmv);
        if (r < 0) {
            free(mv);
            return r;
        }
        if (r) flags |= KVX_FLAG_DIGEST;
    }
    if (nmv) rc = kvx_st_rewrite(s, mv, nmv, flags, busy, &added, &nadded); /* bad pages are not copied */
    if (!rc) {
        st_drop d = {s, victims, added, nadded, mv, nmv, 0, 1, damaged};
        rc = kvx_st_drop_write(s, &d);
        if (rc) kvx_st_unlink_sealed(s, added, nadded);
        else kvx_st_after_drop(s, victims, damaged ? damaged_why : NULL);
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
        if (!s->reg->live[b]) continue;
        kvx_shard *sh = kvx_st_shard_get(s, b, s->reg->rec[b].gen);
        if (!sh) continue;
        uint32_t bad = 0;
        int v = kvx_shard_verify(sh, &bad, NULL, NULL);
        kvx_shard_close(sh);
        if (v && bad) {
            char why[200];
            snprintf(why, sizeof why, "%u damaged or missing page(s): gc copied its good blocks to a new shard", bad);
            rc = st_rewrite_shard(s, b, NULL, 0, 1, why);
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
    size_t nkeep[ST_SLOTS] = {0};
    uint8_t headless[ST_SLOTS] = {0};
    for (size_t i = 0; !rc && i < n; i++) {
        uint32_t b = all[i].b;
        if (!keep[b]) {
            nkeep[b] = kvx_shard_get_info(sh[b])->num_blocks;
            keep[b] = calloc(nkeep[b] + 1u, 1);
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
        if (headless[b] && !st_is_pinned(s, b)) rc = st_rewrite_shard(s, b, keep[b], nkeep[b], 0, NULL);
    for (int b = 0; b < ST_SLOTS; b++) free(keep[b]);
    return rc;
}

/* Keyed shards of which at least half the pages were deleted by their
 * owner are rewritten with the rest (kvx_st_collect copies only indexed
 * pages); one with none left is dropped. A pinned shard waits. */
static int st_compact_deleted(kvx_store *s)
{
    int rc = 0;
    for (uint32_t b = 0; b < ST_SLOTS && !rc; b++) {
        if (!s->reg->live[b] || !(s->reg->rec[b].flags & KVX_FLAG_KEYS) || st_is_pinned(s, b)) continue;
        kvx_shard *sh = kvx_st_shard_get(s, b, s->reg->rec[b].gen);
        if (!sh) continue; /* not judged now: drop_bad_shards' business */
        uint32_t n = kvx_shard_get_info(sh)->num_blocks, live = 0;
        kvx_cat_snap *snap;
        if ((rc = kvx_cat_snap_begin(s->cat, &snap))) {
            kvx_shard_close(sh);
            break;
        }
        for (uint32_t i = 0; i < n && !rc; i++) {
            kvx_entry e;
            if (kvx_shard_entry(&e, sh, i)) continue;
            int has = kvx_cat_has_loc(snap, e.hash, e.coordinate, s->reg->rec[b].gen);
            if (has < 0) rc = has;
            else live += (uint32_t)has;
        }
        kvx_cat_snap_end(snap);
        kvx_shard_close(sh);
        if (!rc && live * 2 <= n) rc = st_rewrite_shard(s, b, NULL, 0, 0, NULL);
    }
    return rc;
}

KVX_API int kvx_store_gc(kvx_store *s)
{
    int rc = kvx_st_writer_check(s, "kvx_store_gc");
    if (rc) return rc;
    pthread_mutex_lock(&s->wmu);
    kvx_st_usage_persist(s);
    rc = kvx_st_drop_bad_shards(s);
    if (!rc) rc = st_salvage_damaged(s);
    if (!rc) rc = kvx_st_enforce_capacity(s);
    if (!rc) rc = s->keyed ? st_compact_deleted(s) : st_drop_headless(s);
    if (!rc) rc = kvx_st_compact(s, 1);
    pthread_mutex_unlock(&s->wmu);
    if (!rc) kvx_clear_error();
    return rc;
}
