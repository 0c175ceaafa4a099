/*
 * store_gc.c - gc, the maintenance pass: damaged shards salvaged, lineage
 * without a head dropped, keyed shards of mostly deleted pages compacted.
 *
 * Rule: a pass that cannot see every shard changes nothing
 * (ST_PASS_SKIPPED); a damaged shard's good blocks are copied before the
 * file goes to quarantine/.
 */
#include "store.h"
#include "format/format.h"
#include "common/digest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A lineage entry of the store, for finding chains without a head. */
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
        if (!s->reg->live[b] || !(s->reg->rec[b].flags & KVX_FLAG_LINEAGE)) continue;
        if (!(sh[b] = kvx_st_shard_get_n(s, b, s->reg->rec[b].gen, s->reg->rec[b].n_entries))) {
            rc = ST_PASS_SKIPPED;
            break;
        }
        uint32_t cnt = kvx_shard_get_info(sh[b])->num_blocks;
        for (uint32_t i = 0; i < cnt && !rc; i++) {
            kvx_entry e;
            if (kvx_shard_entry(&e, sh[b], i) || !e.hash || !e.tokens) continue;
            if (kvx_st_freed(s, s->reg->rec[b].gen, i)) continue; /* evicted in place */
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
    /* bad pages are not copied */
    if (nmv) rc = kvx_st_rewrite(s, mv, nmv, flags, busy, &added, &nadded, ST_WROTE_OTHER);
    if (!rc) {
        st_drop d = {s, victims, added, nadded, mv, nmv, 0, 1, damaged};
        rc = kvx_st_drop_write(s, &d);
        if (rc) {
            kvx_st_unlink_sealed(s, added, nadded);
        } else {
            /* what it did not keep (a headless chain, a bad page) is gone:
             * reported as an eviction's drops are (STORE-18) */
            kvx_st_note_evicted(s, victims);
            kvx_st_after_drop(s, victims, damaged ? damaged_why : NULL);
        }
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
    /* the free log, once for the pass: its pages fail their CRC, and are no damage */
    kvx_free_log flog;
    int lr = kvx_free_log_read(s->dirfd, "FREED", &flog);
    if (lr == 0)
        kvx_st_log_sort(&flog);
    else
        kvx_clear_error(); /* none (or none readable: verify_pages reads it again and reports) */
    for (uint32_t b = 0; b < ST_SLOTS && !rc; b++) {
        /* an active shard a batch still appends to: judged once sealed */
        if (!s->reg->live[b] || (s->act.w && s->act.byte == b)) continue;
        kvx_shard *sh = kvx_st_shard_get_n(s, b, s->reg->rec[b].gen, s->reg->rec[b].n_entries);
        if (!sh) continue;
        uint32_t bad = 0;
        int v = kvx_st_verify_pages(s, lr == 0 ? &flog : NULL, sh, s->reg->rec[b].gen, &bad, NULL, NULL, NULL);
        kvx_shard_close(sh);
        if (v && bad) {
            char why[200];
            snprintf(why, sizeof why, "%u damaged or missing page(s): gc copied its good blocks to a new shard", bad);
            rc = st_rewrite_shard(s, b, NULL, 0, 1, why);
        }
        else kvx_clear_error();
    }
    if (lr == 0) kvx_free_log_free(&flog);
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
        kvx_shard *sh = kvx_st_shard_get_n(s, b, s->reg->rec[b].gen, s->reg->rec[b].n_entries);
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

/* A keyed shard dropped as bad may hold the newest record of keys (a
 * delete, a newer page) that the sound catalog names nowhere else: their
 * deletes are made durable (tombstones, one commit) before the file goes,
 * so that no older copy comes back at a later reindex (docs/STORE.md
 * rule 3). Its tables are read as they are (kvx_shard_salvage_keys): a
 * key read wrong only becomes a miss. 0, or the failure (the shard then
 * stays registered and bad, for the next pass). */
static int st_keep_deletes(kvx_store *s, uint32_t b)
{
    char name[32];
    uint64_t gen = s->reg->rec[b].gen;
    kvx_st_shard_name(name, gen);
    kvx_salvaged_key *v = NULL;
    size_t n = 0;
    if (kvx_shard_salvage_keys(s->shardsfd, name, &v, &n) != 0) { /* nothing readable: nothing to keep */
        kvx_clear_error();
        return 0;
    }
    kvx_key *keys = malloc((n ? n : 1) * sizeof *keys);
    kvx_cat_snap *snap = NULL;
    int rc = keys ? kvx_cat_snap_begin(s->cat, &snap) : kvx_fail(-ENOMEM, "store: out of memory");
    size_t nk = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        uint64_t h = kvx_key_hash(v[i].key, v[i].len);
        int elsewhere = 0;
        for (size_t j = 0; !rc && !elsewhere; j++) {
            kvx_cat_loc loc;
            int r = kvx_cat_loc_at(snap, h, j, &loc);
            if (r == KVX_ENOTFOUND) break;
            if (r) rc = r;
            else elsewhere = loc.gen != gen;
        }
        if (!rc && !elsewhere) keys[nk++] = (kvx_key){v[i].key, v[i].len};
    }
    if (snap) kvx_cat_snap_end(snap);
    if (!rc && nk) rc = kvx_st_tombstone_keys(s, keys, nk);
    free(keys);
    free(v);
    return rc;
}

/* Opens every live shard once: a verdict (a file that cannot be validated
 * or is not this store's) marks it bad, for kvx_st_drop_bad_shards to set
 * aside before anything copies from it. A passing failure marks nothing. */
static void st_judge_all(kvx_store *s)
{
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!s->reg->live[b]) continue;
        kvx_shard_close(kvx_st_shard_get_n(s, b, s->reg->rec[b].gen, s->reg->rec[b].n_entries));
    }
    kvx_clear_error();
}

KVX_API int kvx_store_gc(kvx_store *s)
{
    int rc = kvx_st_writer_check(s, "kvx_store_gc");
    if (rc) return rc;
    pthread_mutex_lock(&s->wmu);
    kvx_st_usage_persist(s);
    s->qnote[0] = '\0';
    uint64_t q0 = s->quarantined;
    /* one damaged shard never stops the pass for the others: every shard
     * is judged first, and a bad one set aside (with its reason) before
     * salvage, eviction or compaction copies from any */
    /* the active shard sealed first (unless a batch's unflushed blocks are
     * in it), so that gc judges and copies sealed files only */
    if (kvx_st_active_seal(s) != 0) kvx_clear_error(); /* whole either way */
    st_judge_all(s);
    rc = kvx_st_drop_bad_shards(s, st_keep_deletes);
    if (!rc) rc = st_salvage_damaged(s);
    if (!rc) rc = kvx_st_enforce_capacity(s);
    if (!rc) rc = s->keyed ? st_compact_deleted(s) : st_drop_headless(s);
    if (!rc) rc = kvx_st_compact(s, 1);
    if (!rc) rc = kvx_st_quarantine_retain(s);
    uint64_t nq = s->quarantined - q0;
    memset(&s->recovery, 0, sizeof s->recovery);
    s->recovery.quarantined = nq; /* kvx_store_recovery: what this gc set aside */
    pthread_mutex_unlock(&s->wmu);
    if (!rc && nq) /* a note, not a failure: what was set aside */
        kvx_fail(0, "store %s: gc set aside %llu shard file(s) in quarantine/ (kept, not served; reasons in "
                    "quarantine/<name>.why):%s",
                 s->dir, (unsigned long long)nq, s->qnote);
    else if (!rc)
        kvx_clear_error();
    return rc;
}
