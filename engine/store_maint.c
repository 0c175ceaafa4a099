/*
 * store_maint.c - eviction, compaction and dropping shards: policy picks,
 * rewrite copies, then ONE catalog transaction drops and adds.
 *
 * Rule (DESIGN.md rule 2): files the catalog stops naming are unlinked only
 * after its commit, and only when sound; a damaged one moves to
 * quarantine/. Shards pinned by an unflushed put of any batch are never
 * taken. Before the commit each victim gets a durable second name in
 * staging/ (its drop mark): a crash that keeps the victim in shards/ after
 * the commit leaves the mark beside it, and recovery then moves the file to
 * quarantine/ instead of adopting it again (which would bring back a keyed
 * page its owner deleted or replaced). The mark goes once the victim left
 * shards/ durably.
 */
#include "store.h"
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void kvx_st_pshards(st_pshard *out, const kvx_store *s, uint64_t *const *r)
{
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        st_pshard *p = &out[b];
        p->live = s->reg->live[b];
        p->pinned = p->live && st_is_pinned(s, b);
        p->flags = s->reg->rec[b].flags;
        p->n = s->reg->rec[b].n_entries;
        p->file_bytes = kvx_st_live_bytes(s, b);
        p->recency = r && p->live ? r[b] : NULL;
    }
}

/* A victim's drop mark: staging/.<gen>.kvx.tmp.drop, or ".dropq" when the
 * drop is of a damaged shard (recovery then quarantines the victim of a
 * committed drop instead of deleting it; store_plan.c). */
static void st_mark_name(char *buf, size_t cap, uint64_t gen, int damaged)
{
    char name[32];
    kvx_st_shard_name(name, gen);
    snprintf(buf, cap, ".%s.tmp.drop%s", name, damaged ? "q" : "");
}

static void st_unmark_victims(kvx_store *s, const uint8_t *victims, int damaged)
{
    for (int b = 0; b < ST_SLOTS; b++) {
        if (!victims[b]) continue;
        char mark[64];
        st_mark_name(mark, sizeof mark, s->reg->rec[b].gen, damaged);
        kvx_os.unlinkat(s->stagingfd, mark, 0);
    }
}

/* Before a drop's commit: each victim that is a regular file in shards/
 * gets its mark (a hard link in staging/), then one fsync of staging/ (its
 * failure fails the drop, before anything is committed). A link that
 * fails (a file system without hard links, a full disk) leaves that
 * victim unmarked: a drop cut after its commit then adopts it again, as
 * before the marks (STORE.md). */
static int st_mark_victims(kvx_store *s, const uint8_t *victims, int damaged)
{
    int rc = 0, n = 0;
    for (int b = 0; b < ST_SLOTS && !rc; b++) {
        if (!victims[b]) continue;
        char name[32], mark[64];
        uint64_t gen = s->reg->rec[b].gen;
        kvx_st_shard_name(name, gen);
        st_mark_name(mark, sizeof mark, gen, damaged);
        struct stat st;
        if (kvx_os.fstatat(s->shardsfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
        int r = kvx_os.linkat(s->shardsfd, name, s->stagingfd, mark, 0);
        if (r != 0 && errno == EEXIST && kvx_os.unlinkat(s->stagingfd, mark, 0) == 0) /* a stale mark */
            r = kvx_os.linkat(s->shardsfd, name, s->stagingfd, mark, 0);
        n += r == 0; /* else (a full disk, no hard links) unmarked: an eviction must not wait for room */
    }
    if (!rc && n && (rc = kvx_os_fsync_dir(s->staging_path)))
        rc = kvx_fail(rc, "store %s: fsync of staging/ after marking %d shard(s): %s", s->dir, n, strerror(-rc));
    if (rc) st_unmark_victims(s, victims, damaged); /* nothing committed: nothing to mark */
    return rc;
}

/* One edit: the added shards registered, each carried block moved (a
 * block whose page was bad, new_gen 0, is not), the victims dropped with
 * every record of their byte (the blocks not carried count as evicted),
 * the counters, next_gen. */
int kvx_st_drop_write(kvx_store *s, st_drop *d)
{
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    for (size_t i = 0; i < d->nadded; i++) kvx_st_register(&e, &d->added[i]);
    for (size_t i = 0; i < d->nmoves; i++) {
        const st_move *m = &d->moves[i];
        /* a tombstone is in no index: its copy only keeps it in the files */
        if (m->new_gen && !m->tomb)
            kvx_cat_edit_move_block(&e, m->hash, m->src_coord, m->src_gen, m->new_coord, m->new_gen);
    }
    uint64_t nv = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!d->victims[b]) continue;
        kvx_cat_edit_drop_shard(&e, b);
        nv++;
    }
    kvx_cat_stats delta = {0};
    if (d->evict) delta.evictions = nv;
    if (d->damaged) delta.dropped_shards = nv;
    if (d->compact) delta.compactions = 1;
    kvx_cat_edit_stats(&e, &delta, 1);
    kvx_cat_edit_next_gen(&e, s->next_gen);
    /* a batch's pin on a victim follows its blocks into the new shards
     * (salvage and compaction copy pinned blocks): what
     * the batch's flush will acknowledge stays out of eviction's reach */
    uint8_t carry_pins[64] = {0};
    size_t nb = 0;
    for (kvx_store_batch *x = s->batches; x; x = x->next, nb++)
        for (uint32_t b = 0; nb < sizeof carry_pins && b < ST_SLOTS; b++)
            if (d->victims[b] && x->pinned[b] && x->pin_gen[b] == s->reg->rec[b].gen) carry_pins[nb] = 1;
    /* the victims' marks durable before the commit; a failed commit keeps
     * them (it may have happened after all: a mark beside a file the
     * catalog still names only goes at the next recovery) */
    int rc = st_mark_victims(s, d->victims, d->damaged);
    if (!rc) rc = kvx_cat_apply(s->cat, &e); /* builder failures come back here */
    kvx_cat_edit_free(&e);
    nb = 0;
    for (kvx_store_batch *x = s->batches; !rc && x; x = x->next, nb++) {
        if (nb < sizeof carry_pins && !carry_pins[nb]) continue;
        for (size_t i = 0; i < d->nadded; i++) {
            x->pinned[d->added[i].byte] = 1;
            x->pin_gen[d->added[i].byte] = d->added[i].gen;
        }
    }
    return rc;
}

/* After a committed drop (the registry already follows it; a dropped
 * slot keeps its last record): caches, files. Evicted and compacted
 * shards are deleted only when sound; a damaged one (and every shard
 * dropped as damaged) moves to quarantine/ instead; one that cannot be
 * judged now stays in shards/, unregistered, beside its mark: the next
 * writer's recovery moves it to quarantine/. Anything but a regular file
 * at a victim's name (a FIFO, a directory planted there) is left alone.
 * The unlinks are made durable (one fsync of shards/) before the marks
 * go, so a power cut cannot bring back a victim without its mark. */
void kvx_st_after_drop(kvx_store *s, const uint8_t *victims, const char *damaged)
{
    uint8_t gone[ST_SLOTS] = {0}; /* out of shards/: its mark may go */
    uint64_t q0 = s->quarantined;
    int unlinked = 0;
    for (int b = 0; b < ST_SLOTS; b++) {
        if (!victims[b]) continue;
        uint64_t gen = s->reg->rec[b].gen;
        kvx_st_cache_drop(s, (uint32_t)b);
        char name[ST_ACTIVE_NAME_MAX], why[600];
        snprintf(why, sizeof why, "%s", damaged ? damaged : "");
        kvx_st_shard_name(name, gen);
        struct stat st;
        int sr = kvx_os.fstatat(s->shardsfd, name, &st, AT_SYMLINK_NOFOLLOW);
        if (sr != 0 && errno == ENOENT) { /* a failed seal left it under its active name */
            kvx_st_active_name(name, gen, (uint32_t)b);
            sr = kvx_os.fstatat(s->shardsfd, name, &st, AT_SYMLINK_NOFOLLOW);
        }
        if (sr != 0) {
            gone[b] = errno == ENOENT;
            continue;
        }
        if (!S_ISREG(st.st_mode)) continue; /* never followed, never moved (DESIGN.md rule 5) */
        int sound = damaged ? 0 : kvx_st_shard_sound(s, (uint32_t)b, gen, why, sizeof why);
        if (sound == 1 && kvx_os.unlinkat(s->shardsfd, name, 0) == 0) { /* views keep their mapping alive */
            gone[b] = 1;
            unlinked++;
        } else if (sound == 0) {
            int q = kvx_st_quarantine(s, name, why); /* it fsyncs shards/ */
            gone[b] = q == 0;
            if (q) kvx_clear_error();
        }
    }
    int left = unlinked && kvx_os_fsync_dir(s->shards_path) != 0; /* the marks stay: recovery sorts it out */
    for (int b = 0; b < ST_SLOTS; b++) {
        if (!victims[b]) continue;
        if (!gone[b] || left) {
            left = 1;
            continue;
        }
        char mark[64];
        st_mark_name(mark, sizeof mark, s->reg->rec[b].gen, damaged != NULL);
        kvx_os.unlinkat(s->stagingfd, mark, 0); /* no fsync: recovery removes a mark whose file is gone */
    }
    /* A victim left beside its mark is finished by recovery only on the
     * word of a sound catalog that no longer names it; a lagging catalog
     * is set aside after a power cut, and the victim would come back (with
     * keys its owner deleted since: not held, so no tombstone). So the
     * catalog is synced now and lags no more while a drop mark remains
     * (kvx_st_lag_start looks). */
    if (left && s->lagging && kvx_st_lag_stop(s) != 0) kvx_clear_error();
    /* quarantine/'s retention, when this drop added to it */
    if (s->quarantined != q0 && kvx_st_quarantine_retain(s) != 0) kvx_clear_error();
    kvx_st_holes_forget(s); /* the victims' freed pages went with them */
}

int kvx_st_drop_bad_shards(kvx_store *s, st_keep_fn keep)
{
    uint8_t victims[ST_SLOTS] = {0};
    int any = 0;
    pthread_rwlock_rdlock(&s->cache_lock);
    for (int b = 0; b < ST_SLOTS; b++) {
        /* the active shard is judged when it is sealed, never dropped while
         * its writer appends to it */
        if (s->reg->live[b] && s->cache[b].bad && s->cache[b].gen == s->reg->rec[b].gen &&
            !(s->act.w && s->act.byte == b)) {
            victims[b] = 1;
            any = 1;
        }
    }
    pthread_rwlock_unlock(&s->cache_lock);
    /* a keyed shard may hold deletes that must outlive it: set aside only
     * by a caller that keeps them first (gc); else it waits, unserved */
    for (uint32_t b = 0; b < ST_SLOTS && any; b++)
        if (victims[b] && s->keyed && (!keep || keep(s, b) != 0)) {
            kvx_clear_error();
            victims[b] = 0; /* its deletes could not be kept now: it stays, unserved, for the next pass */
        }
    any = 0;
    for (int b = 0; b < ST_SLOTS; b++) any |= victims[b];
    if (!any) return 0;
    st_drop d = {s, victims, NULL, 0, NULL, 0, 0, 0, 1};
    int rc = kvx_st_drop_write(s, &d);
    if (rc) return rc;
    int n = 0;
    for (int b = 0; b < ST_SLOTS; b++) {
        if (!victims[b]) continue;
        n++;
        uint8_t one[ST_SLOTS] = {0};
        one[b] = 1;
        char why[320];
        pthread_rwlock_rdlock(&s->cache_lock);
        snprintf(why, sizeof why, "could not be used when first opened: %s", s->cache[b].why);
        pthread_rwlock_unlock(&s->cache_lock);
        kvx_st_after_drop(s, one, why);
    }
    s->dropped += (uint64_t)n;
    kvx_fail(KVX_ECORRUPT, "store %s: %d damaged shard(s) moved to quarantine/", s->dir, n);
    return 0;
}

/* Is parent present after the operation? In a kept shard, or moved. 1
 * yes, 0 no, or the catalog's error (a damaged location, a failed read:
 * never taken for "gone", which would drop its children). */
static int st_parent_kept(kvx_cat_snap *snap, uint64_t parent, const uint8_t *victims, const uint64_t *moved,
                          size_t nmoved)
{
    if (parent == 0) return 1;
    if (moved && bsearch(&parent, moved, nmoved, sizeof *moved, kvx_st_cmp_u64)) return 1;
    kvx_cat_loc loc;
    int rc;
    for (size_t i = 0; (rc = kvx_cat_loc_at(snap, parent, i, &loc)) == 0; i++)
        if (!victims[KVX_COORD_SHARD(loc.coord)]) return 1;
    return rc == KVX_ENOTFOUND ? 0 : rc;
}

/* Drops moves whose parent will be gone (they would be orphans), until
 * nothing changes: 0 and *io_n the moves kept, or an error (then nothing
 * is known: the caller keeps every block). */
static int st_filter_orphans(kvx_store *s, st_move *mv, size_t *io_n, const uint8_t *victims)
{
    size_t n = *io_n;
    if (!n) return 0;
    uint64_t *moved = malloc((n + 1) * sizeof *moved);
    if (!moved) return kvx_fail(-ENOMEM, "store: out of memory");
    kvx_cat_snap *snap = NULL;
    int rc = kvx_cat_snap_begin(s->cat, &snap);
    for (int pass = 0; pass < 8 && !rc; pass++) {
        for (size_t i = 0; i < n; i++) moved[i] = mv[i].hash;
        qsort(moved, n, sizeof *moved, kvx_st_cmp_u64);
        size_t w = 0;
        for (size_t i = 0; i < n && !rc; i++) {
            int k = st_parent_kept(snap, mv[i].parent, victims, moved, n);
            if (k < 0) rc = k;
            else if (k) mv[w++] = mv[i];
        }
        if (rc) break;
        int changed = w != n;
        n = w;
        if (!changed) break;
    }
    if (snap) kvx_cat_snap_end(snap);
    free(moved);
    if (!rc) *io_n = n;
    return rc;
}

/* Queues one removed block or key for kvx_store_evicted; past
 * KVX_EVICTED_MAX waiting, the oldest goes and is counted. */
static void st_ev_push(kvx_store *s, const kvx_entry *e)
{
    pthread_mutex_lock(&s->ev_mu);
    if (s->ev_n == s->ev_cap && s->ev_cap < s->ev_max) {
        size_t cap = s->ev_cap ? s->ev_cap * 2 : 64;
        if (cap > s->ev_max) cap = s->ev_max;
        kvx_evicted *q = malloc(cap * sizeof *q);
        if (q) { /* unrolled into the new ring, oldest first */
            for (size_t i = 0; i < s->ev_n; i++) q[i] = s->evq[(s->ev_head + i) % s->ev_cap];
            free(s->evq);
            s->evq = q;
            s->ev_cap = cap;
            s->ev_head = 0;
        }
    }
    if (s->ev_cap == 0) { /* no memory for even one: counted */
        s->ev_dropped++;
        pthread_mutex_unlock(&s->ev_mu);
        return;
    }
    if (s->ev_n == s->ev_cap) { /* full: the oldest goes */
        s->ev_head = (s->ev_head + 1) % s->ev_cap;
        s->ev_n--;
        s->ev_dropped++;
    }
    kvx_evicted *x = &s->evq[(s->ev_head + s->ev_n) % s->ev_cap];
    memset(x, 0, sizeof *x);
    x->hash = e->hash;
    if (e->key) {
        x->key_len = e->key_len;
        memcpy(x->key, e->key, e->key_len);
    }
    s->ev_n++;
    pthread_mutex_unlock(&s->ev_mu);
}

/* Does the catalog (after the drop's commit) still hold e: a block of its
 * hash, or, in a keyed store, a page under this very key? */
static int st_still_held(kvx_store *s, kvx_cat_snap *snap, const kvx_entry *e)
{
    kvx_cat_loc loc;
    for (size_t i = 0;; i++) {
        int rc = kvx_cat_loc_at(snap, e->hash, i, &loc);
        if (rc == KVX_ENOTFOUND) return 0;
        if (rc) return 1; /* cannot tell: not reported (a report means gone) */
        if (!e->key) return 1;
        kvx_shard *sh = kvx_st_shard_get_n(s, KVX_COORD_SHARD(loc.coord), loc.gen, KVX_COORD_BLOCK(loc.coord) + 1);
        if (!sh) return 1;
        kvx_entry o;
        int same = kvx_shard_entry(&o, sh, KVX_COORD_BLOCK(loc.coord)) == 0 && o.key && o.key_len == e->key_len &&
                   memcmp(o.key, e->key, e->key_len) == 0;
        kvx_shard_close(sh);
        if (same) return 1;
    }
}

/* After an eviction's commit (the registry keeps each victim's last
 * record): queues every block or key of the victims that no live shard
 * holds now (a carried block is held where it was carried to). */
void kvx_st_note_evicted(kvx_store *s, const uint8_t *victims)
{
    char saved[512]; /* the caller's message (an eviction for a put's KVX_EFULL says why) */
    snprintf(saved, sizeof saved, "%s", kvx_last_error());
    kvx_cat_snap *snap = NULL;
    if (kvx_cat_snap_begin(s->cat, &snap) != 0) snap = NULL;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!victims[b]) continue;
        const kvx_cat_shard *rec = &s->reg->rec[b];
        kvx_shard *sh = snap ? kvx_st_shard_get_n(s, b, rec->gen, rec->n_entries) : NULL;
        if (!sh) { /* its entries cannot be named: counted */
            pthread_mutex_lock(&s->ev_mu);
            s->ev_dropped += rec->n_entries;
            pthread_mutex_unlock(&s->ev_mu);
            continue;
        }
        uint32_t n = kvx_shard_get_info(sh)->num_blocks;
        for (uint32_t i = 0; i < n; i++) {
            kvx_entry e;
            uint64_t seq;
            int tomb = 0;
            if (kvx_shard_entry(&e, sh, i) != 0 || (!e.hash && !e.key)) continue; /* a partial tail: no name */
            if (kvx_st_freed(s, rec->gen, i)) continue;                           /* reported when it was freed */
            if (kvx_shard_entry_commit(sh, i, &seq, &tomb) != 0 || tomb) continue; /* a delete, not a page */
            if (!st_still_held(s, snap, &e)) st_ev_push(s, &e); /* a carried block is held at its new place */
        }
        kvx_shard_close(sh);
    }
    kvx_cat_snap_end(snap);
    if (saved[0]) kvx_fail(0, "%s", saved);
    else kvx_clear_error();
}

KVX_API int kvx_store_evicted(kvx_store *s, kvx_evicted *out, size_t max, size_t *out_n, uint64_t *out_dropped)
{
    if (out_n) *out_n = 0;
    if (out_dropped) *out_dropped = 0;
    if (!s) return kvx_fail(KVX_EINVALID, "kvx_store_evicted: s is NULL");
    if (!out_n) return kvx_fail(KVX_EINVALID, "kvx_store_evicted: out_n is NULL");
    if (max && !out) return kvx_fail(KVX_EINVALID, "kvx_store_evicted: out is NULL with max %zu", max);
    pthread_mutex_lock(&s->ev_mu);
    size_t n = s->ev_n < max ? s->ev_n : max;
    for (size_t i = 0; i < n; i++) out[i] = s->evq[(s->ev_head + i) % s->ev_cap];
    if (n) {
        s->ev_head = (s->ev_head + n) % s->ev_cap;
        s->ev_n -= n;
    }
    if (out_dropped) {
        *out_dropped = s->ev_dropped;
        s->ev_dropped = 0;
    }
    pthread_mutex_unlock(&s->ev_mu);
    *out_n = n;
    return 0;
}

/* Keeps the moves that are no tombstones (in order): how many. */
static size_t st_drop_tombs(st_move *mv, size_t n)
{
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (!mv[i].tomb) mv[w++] = mv[i];
    return w;
}

/* Puts the moves out of lineage shards first: how many. */
static size_t st_lineage_first(const kvx_store *s, st_move *mv, size_t n)
{
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(s->reg->rec[KVX_COORD_SHARD(mv[i].src_coord)].flags & KVX_FLAG_LINEAGE)) continue;
        st_move t = mv[w];
        mv[w++] = mv[i];
        mv[i] = t;
    }
    return w;
}

/* When the live shard bytes exceed the capacity, evicts whole shards down
 * to 1/64 below it (the goal).
 *
 * An exact LRU holding the goal's worth of blocks would keep those used
 * most recently: their recency is above a cut. Victims are the shards with
 * the largest share of blocks below the cut (then the oldest mean
 * recency); their blocks above the carry cut (the newest 80 % of what
 * the LRU keeps: kvx_st_carry_cut) are carried into new shards with
 * their recency (newest first, at most half of the bytes freed, so
 * eviction always frees room and copies at most as much as it frees),
 * unless their parent is gone. */
/* pending: bytes of sealed files not yet published (a put in progress):
 * they count against the capacity and are all kept (the newest blocks). */
typedef struct st_cold {
    uint64_t r;
    uint32_t b, i;
} st_cold;

static int st_cmp_cold(const void *a, const void *b)
{
    const st_cold *x = a, *y = b;
    if (x->r != y->r) return x->r < y->r ? -1 : 1;
    if (x->b != y->b) return x->b < y->b ? -1 : 1;
    return x->i < y->i ? -1 : x->i > y->i;
}

/* Eviction in place (KVX_STORE_HOLES, docs/STORE.md "Holes"): the coldest
 * blocks, one at a time, down to the goal, as an exact LRU would: a shard
 * left with none goes whole, the others keep their live blocks and lose
 * the cold ones' pages (a free log record, then a punch); nothing is
 * carried. Pinned shards (a pending put's held blocks, the active shard)
 * are left alone. */
static int st_evict_holes(kvx_store *s, uint64_t total, uint64_t goal, uint64_t *const *r)
{
    size_t n = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++)
        if (s->reg->live[b]) n += s->reg->rec[b].n_entries;
    st_cold *c = malloc((n + 1) * sizeof *c);
    if (!c) return kvx_fail(-ENOMEM, "store: out of memory");
    uint32_t live[ST_SLOTS] = {0}, take[ST_SLOTS] = {0};
    uint8_t victims[ST_SLOTS] = {0};
    int nvict = 0;
    uint64_t freed = 0;
    n = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!s->reg->live[b]) continue;
        int pinned = st_is_pinned(s, b);
        for (uint32_t i = 0; i < s->reg->rec[b].n_entries; i++) {
            if (kvx_st_freed(s, s->reg->rec[b].gen, i)) continue;
            live[b]++;
            if (!pinned) c[n++] = (st_cold){r[b][i], b, i};
        }
        /* every page freed (by this eviction's predecessors): the file's
         * tables and header go with it now */
        if (!live[b] && !pinned) {
            victims[b] = 1;
            nvict++;
            freed += kvx_st_live_bytes(s, b);
        }
    }
    qsort(c, n, sizeof *c, st_cmp_cold);
    /* a page frees its extent (every page starts 4096-aligned and the next
     * one no sooner than the end of its last 4096-byte block: FORMAT.md
     * "KV pages"); the last live page of a shard frees the whole file */
    uint64_t extent = kvx_align_up(s->page_bytes, 4096);
    size_t k = 0;
    for (; k < n && total - freed > goal; k++) {
        uint32_t b = c[k].b;
        freed += extent;
        if (++take[b] == live[b]) {
            uint64_t lb = kvx_st_live_bytes(s, b), pages = (uint64_t)live[b] * extent;
            freed += lb > pages ? lb - pages : 0;
        }
    }
    size_t nfree = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++)
        if (take[b] && take[b] == live[b]) {
            victims[b] = 1;
            nvict++;
        } else {
            nfree += take[b];
        }
    int rc = 0;
    st_free_page *fl = nfree ? malloc(nfree * sizeof *fl) : NULL;
    if (nfree && !fl) rc = kvx_fail(-ENOMEM, "store: out of memory");
    size_t m = 0;
    for (size_t j = 0; j < k && !rc; j++) {
        uint32_t b = c[j].b;
        if (victims[b]) continue;
        kvx_shard *sh = kvx_st_shard_get_n(s, b, s->reg->rec[b].gen, s->reg->rec[b].n_entries);
        kvx_entry e;
        if (!sh || kvx_shard_entry(&e, sh, c[j].i) != 0) {
            kvx_shard_close(sh);
            kvx_clear_error();
            continue; /* cannot be named now: stays */
        }
        fl[m++] = (st_free_page){s->reg->rec[b].gen, e.hash, kvx_align_up(e.bytes, 4096), c[j].i, b};
        kvx_shard_close(sh);
    }
    free(c);
    /* whole shards first (their own commit), then the pages */
    if (!rc && nvict) {
        st_drop d = {s, victims, NULL, 0, NULL, 0, 1, 0, 0};
        rc = kvx_st_drop_write(s, &d);
        if (!rc) {
            kvx_st_note_evicted(s, victims);
            kvx_st_after_drop(s, victims, NULL);
        }
    }
    if (!rc && m) {
        rc = kvx_st_free_commit(s, fl, m);
        if (rc == 0) {
            kvx_cat_snap *snap = NULL;
            if (kvx_cat_snap_begin(s->cat, &snap) != 0) snap = NULL;
            char saved[512];
            snprintf(saved, sizeof saved, "%s", kvx_last_error());
            for (size_t j = 0; j < m && snap; j++) {
                kvx_entry e;
                memset(&e, 0, sizeof e);
                e.hash = fl[j].hash;
                e.coordinate = KVX_COORD(fl[j].byte, fl[j].entry, 0);
                if (!st_still_held(s, snap, &e)) st_ev_push(s, &e);
            }
            kvx_cat_snap_end(snap);
            if (saved[0])
                kvx_fail(0, "%s", saved);
            else
                kvx_clear_error();
        }
    }
    free(fl);
    return rc;
}

int kvx_st_evict(kvx_store *s, uint64_t pending)
{
    uint64_t total = pending, nblocks = 0;
    for (int b = 0; b < ST_SLOTS; b++)
        if (s->reg->live[b]) {
            total += kvx_st_live_bytes(s, (uint32_t)b);
            nblocks += s->reg->rec[b].n_entries;
        }
    if (total <= s->capacity || nblocks == 0) return 0;
    kvx_st_usage_persist(s);
    st_usage_view *uv = calloc(ST_SLOTS, sizeof *uv);
    uint64_t **r = calloc(ST_SLOTS, sizeof *r);
    uint64_t *all = malloc((nblocks + 1) * sizeof *all);
    int rc = uv && r && all ? 0 : kvx_fail(-ENOMEM, "store: out of memory");
    if (!rc) rc = kvx_st_usage_read(s, uv);
    if (!rc) rc = kvx_st_recency_build(s, uv, r);
    if (rc) {
        if (uv) kvx_st_usage_free(uv);
        if (r) kvx_st_recency_free(r);
        free(uv);
        free(r);
        free(all);
        return rc;
    }
    /* the cut: an exact LRU holding the goal's worth of blocks */
    uint64_t goal = kvx_st_evict_goal(s->capacity);
    if (!s->evict_cold_only && kvx_st_holes_now(s)) {
        free(all);
        rc = st_evict_holes(s, total, goal, r);
        kvx_st_usage_free(uv);
        free(uv);
        kvx_st_recency_free(r);
        free(r);
        return rc;
    }
    size_t na = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++)
        if (s->reg->live[b])
            for (uint32_t i = 0; i < s->reg->rec[b].n_entries; i++) all[na++] = r[b][i];
    uint64_t keep = kvx_st_evict_keep(goal, pending, total - pending, nblocks);
    uint64_t cut = kvx_st_evict_cut(all, na, keep);
    uint64_t carry_cut = kvx_st_carry_cut(all, na, keep);
    free(all);
    st_pshard sh[ST_SLOTS];
    kvx_st_pshards(sh, s, r);
    uint32_t order[ST_SLOTS];
    int no = kvx_st_evict_order(order, sh, cut);
    uint8_t victims[ST_SLOTS] = {0};
    st_move *mv = NULL, *tmv = NULL; /* carried blocks; tombstones kept */
    size_t nmv = 0, capmv = 0, ntmv = 0, captmv = 0;
    uint64_t freed = 0, room = 0;
    for (int i = 0; i < no && !rc; i++) {
        if (kvx_st_evict_enough(total, freed, nmv, room, s->entry_bytes, goal)) break;
        uint32_t b = order[i];
        if (sh[b].pinned) continue; /* a pending put's held blocks: after its flush */
        if (s->evict_cold_only) { /* a shard with a block above the cut stays */
            uint32_t k = 0;
            while (k < s->reg->rec[b].n_entries && r[b][k] <= cut) k++;
            if (k < s->reg->rec[b].n_entries) continue;
        }
        victims[b] = 1;
        freed += s->reg->rec[b].file_bytes;
        room = kvx_st_carry_room(freed, s->entry_bytes);
        /* its blocks above the carry cut, of either kind (a keyed store's pages
         * are plain): carrying is optional, the shard is evicted anyway */
        size_t from = nmv;
        if (!s->evict_cold_only && kvx_st_collect(s, b, r[b], 1, carry_cut, &mv, &nmv, &capmv, SIZE_MAX) != 0) {
            kvx_clear_error();
            nmv = from;
        }
        /* those go with the tombstones below (nothing collected yet: mv may be NULL) */
        if (nmv > from) nmv = from + st_drop_tombs(mv + from, nmv - from);
        /* a keyed shard's tombstones are not optional: each still hiding
         * an older copy is carried (kvx_st_collect takes only those: with
         * a cut above every recency, no page) */
        if ((s->reg->rec[b].flags & KVX_FLAG_TOMB) &&
            (rc = kvx_st_collect(s, b, NULL, 1, UINT64_MAX, &tmv, &ntmv, &captmv, SIZE_MAX)))
            break;
    }
    kvx_st_usage_free(uv);
    free(uv);
    kvx_st_recency_free(r);
    free(r);
    if (nmv) qsort(mv, nmv, sizeof *mv, kvx_st_cmp_move_hot);
    if (nmv > room) nmv = (size_t)room;
    if (st_filter_orphans(s, mv, &nmv, victims) != 0) {
        /* the catalog cannot say which parents stay: evict (the policy's
         * choice) without carrying, rather than carry orphans */
        kvx_clear_error();
        nmv = 0;
    }
    /* each kind into shards of its own, oldest first */
    size_t nlin = st_lineage_first(s, mv, nmv);
    if (nlin) qsort(mv, nlin, sizeof *mv, kvx_st_cmp_move_age);
    if (nmv > nlin) qsort(mv + nlin, nmv - nlin, sizeof *mv, kvx_st_cmp_move_age);
    st_sealed *added = NULL;
    size_t nadded = 0;
    uint8_t busy[ST_SLOTS] = {0};
    int crc = 0;
    if (!rc && nlin)
        crc = kvx_st_rewrite(s, mv, nlin, kvx_st_kind_flags(s, ST_KIND_LINEAGE), busy, &added, &nadded, ST_WROTE_CARRY);
    if (!rc && !crc && nmv > nlin)
        crc = kvx_st_rewrite(s, mv + nlin, nmv - nlin, kvx_st_kind_flags(s, ST_KIND_PLAIN), busy, &added, &nadded,
                             ST_WROTE_CARRY);
    if (crc) {
        kvx_st_unlink_sealed(s, added, nadded); /* the other kind's, when it was written */
        nmv = 0; /* carrying is an optimisation: evict without it */
        nadded = 0;
        kvx_clear_error();
    }
    /* the tombstones are not: without their copy nothing is evicted */
    if (!rc && ntmv) {
        st_move *all_mv = realloc(mv, (nmv + ntmv) * sizeof *all_mv);
        if (!all_mv) rc = kvx_fail(-ENOMEM, "store: out of memory");
        else {
            mv = all_mv;
            size_t before = nadded;
            rc = kvx_st_rewrite(s, tmv, ntmv, kvx_st_kind_flags(s, ST_KIND_PLAIN), busy, &added, &nadded,
                                ST_WROTE_CARRY);
            if (rc) {
                kvx_st_unlink_sealed(s, added, before);
                nadded = 0;
            } else {
                memcpy(mv + nmv, tmv, ntmv * sizeof *tmv);
                nmv += ntmv;
            }
        }
    }
    free(tmv);
    if (rc) {
        free(added);
        free(mv);
        return rc;
    }
    /* the new shards' renames are durable (the seal fsyncs shards/) */
    st_drop d = {s, victims, added, nadded, mv, nmv, 1, 0, 0};
    rc = kvx_st_drop_write(s, &d);
    if (rc) {
        kvx_st_unlink_sealed(s, added, nadded);
    } else {
        kvx_st_note_evicted(s, victims);
        kvx_st_after_drop(s, victims, NULL);
        kvx_st_rec_from_moves(s, mv, d.nmoves, added, nadded);
        for (size_t i = 0; i < d.nmoves; i++) s->carried += mv[i].new_gen != 0;
    }
    free(added);
    free(mv);
    return rc;
}

/* Every batch's sealed but unpublished files count, and are kept. */
/* quarantine/ counts toward the capacity up to its retention's share (a
 * quarter): the live shards make room for that much as for unpublished
 * bytes; more is retention's to remove, never a reason to evict (one file
 * put there must not empty the store). */
int kvx_st_enforce_capacity(kvx_store *s)
{
    uint64_t qbytes = 0, qmax = kvx_st_quarantine_max_bytes(s);
    kvx_st_quarantine_count(s, &qbytes);
    return kvx_st_evict(s, st_unpublished_bytes(s) + (qbytes < qmax ? qbytes : qmax));
}

static int st_live_shards(const kvx_store *s)
{
    int n = 0;
    for (int b = 0; b < ST_SLOTS; b++) n += s->reg->live[b] != 0;
    return n;
}

int kvx_st_evict_for_ids(kvx_store *s)
{
    int live = st_live_shards(s);
    uint64_t bytes = 0;
    for (int b = 0; b < ST_SLOTS; b++)
        if (s->reg->live[b]) bytes += kvx_st_live_bytes(s, (uint32_t)b);
    if (live <= ST_COMPACT_AT || !bytes) return 0; /* ids are held by writers and sealed files, not shards */
    /* the capacity's LRU eviction, against the bytes of about
     * ST_COMPACT_AT - 16 shards of today's mean size (so ~80 ids come
     * free); pinned shards never go. First pass: only shards whose every
     * block is below the cut, whole, carrying nothing (no id is free for a
     * carry's new shard yet). If that frees too few (every cold shard holds
     * some hot block), a second, carrying pass runs with the ids the first
     * freed for its new shards (none freed: it evicts without carrying). */
    uint64_t cap = s->capacity, want = bytes / (uint64_t)live * (ST_COMPACT_AT - 16);
    s->capacity = want < cap ? want : cap;
    s->evict_cold_only = 1;
    int rc = kvx_st_evict(s, st_unpublished_bytes(s));
    s->evict_cold_only = 0;
    if (!rc && st_live_shards(s) > ST_COMPACT_AT) rc = kvx_st_evict(s, st_unpublished_bytes(s));
    s->capacity = cap;
    return rc ? rc : live - st_live_shards(s);
}

/* Marks (victims, *nvict + 2 each) unpinned live shards of `flags` whose
 * blocks are mostly orphans: their parent is held nowhere, so no prefix
 * lookup reaches them. 0 or the catalog's error. */
static int st_orphaned_shards(kvx_store *s, uint32_t flags, uint8_t *victims, int *nvict)
{
    kvx_cat_snap *snap = NULL;
    uint8_t none[ST_SLOTS] = {0};
    int rc = kvx_cat_snap_begin(s->cat, &snap);
    for (uint32_t b = 0; b < ST_SLOTS && !rc; b++) {
        if (!s->reg->live[b] || s->reg->rec[b].flags != flags || victims[b] || st_is_pinned(s, b)) continue;
        kvx_shard *sh = kvx_st_shard_get_n(s, b, s->reg->rec[b].gen, s->reg->rec[b].n_entries);
        if (!sh) continue;
        uint32_t cnt = kvx_shard_get_info(sh)->num_blocks, orphans = 0;
        for (uint32_t i = 0; i < cnt && !rc; i++) {
            kvx_entry e;
            if (kvx_shard_entry(&e, sh, i) || kvx_st_freed(s, s->reg->rec[b].gen, i)) continue;
            int k = st_parent_kept(snap, e.parent, none, NULL, 0);
            if (k < 0) rc = k;
            else orphans += !k;
        }
        kvx_shard_close(sh);
        if (!rc && orphans * 2 > cnt) {
            victims[b] = 1;
            *nvict += 2; /* rewrite even alone */
        }
    }
    if (snap) kvx_cat_snap_end(snap);
    return rc;
}

/* Merges small shards (< target/2) of one kind, by block recency, into
 * target-sized ones; with full, also shards whose blocks are mostly
 * orphans (their parent is gone, so no prefix lookup reaches them).
 * Orphans are not copied. */
int kvx_st_compact(kvx_store *s, int full)
{
    st_usage_view *uv = calloc(ST_SLOTS, sizeof *uv);
    if (!uv) return kvx_fail(-ENOMEM, "store: out of memory");
    uint64_t *r[ST_SLOTS];
    int rc = kvx_st_usage_read(s, uv);
    if (rc) {
        free(uv);
        return rc;
    }
    rc = kvx_st_recency_build(s, uv, r);
    kvx_st_usage_free(uv);
    free(uv);
    if (rc) {
        kvx_st_recency_free(r);
        return rc;
    }
    for (int kind = 0; kind < 2 && !rc; kind++) {
        uint32_t flags = kvx_st_kind_flags(s, kind);
        uint8_t victims[ST_SLOTS] = {0};
        st_pshard sh[ST_SLOTS];
        kvx_st_pshards(sh, s, NULL);
        int nvict = kvx_st_compact_small(victims, sh, flags, s->target);
        if (full && kind == ST_KIND_LINEAGE && (rc = st_orphaned_shards(s, flags, victims, &nvict))) break;
        if (nvict < 2) continue;
        st_move *mv = NULL;
        size_t nmv = 0, capmv = 0;
        for (uint32_t b = 0; b < ST_SLOTS && !rc; b++)
            if (victims[b]) rc = kvx_st_collect(s, b, r[b], 0, 0, &mv, &nmv, &capmv, SIZE_MAX);
        if (rc) {
            free(mv);
            break;
        }
        if (full && kind == ST_KIND_LINEAGE && (rc = st_filter_orphans(s, mv, &nmv, victims))) {
            free(mv); /* which blocks are orphans is not known: nothing is dropped */
            break;
        }
        if (nmv) qsort(mv, nmv, sizeof *mv, kvx_st_cmp_move_age);
        st_sealed *added = NULL;
        size_t nadded = 0;
        uint8_t busy[ST_SLOTS] = {0};
        if (nmv) rc = kvx_st_rewrite(s, mv, nmv, flags, busy, &added, &nadded, ST_WROTE_MERGE); /* sealed: durable */
        if (!rc) {
            st_drop d = {s, victims, added, nadded, mv, nmv, 0, 1, 0};
            rc = kvx_st_drop_write(s, &d);
            if (rc) kvx_st_unlink_sealed(s, added, nadded);
            else {
                kvx_st_after_drop(s, victims, NULL);
                kvx_st_rec_from_moves(s, mv, nmv, added, nadded);
            }
        }
        free(added);
        free(mv);
    }
    kvx_st_recency_free(r);
    return rc;
}
