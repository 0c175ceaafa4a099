/*
 * store_usage.c - usage: referenced bits and last use per shard, hit and
 * miss counters, batched in memory and written to the catalog by the writer
 * at flush, gc and close, and by readers every USE_PERSIST_CALLS calls; and
 * the per-entry recency eviction reads.
 *
 * Rule: usage is advisory. A lost or damaged usage record only costs
 * recency; it never makes a block served, dropped or kept.
 */
#include "store.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define USE_PERSIST_CALLS 65536u /* a reader writes usage every this many calls */

/* Batched usage: referenced entries and last use per shard, hit/miss
 * counters; written to the catalog (one edit) by the writer at
 * flush/gc/close and by readers every USE_PERSIST_CALLS calls and at
 * close. */
uint64_t *kvx_st_rec_get(kvx_store *s, uint32_t byte, uint64_t gen, uint32_t n)
{
    st_rec *r = &s->rec[byte];
    if (r->gen == gen && r->last && r->n >= n) return r->last;
    uint64_t *a = calloc((size_t)n + 1, sizeof *a);
    if (!a) return NULL;
    /* the same shard grown (an active shard's appends, a handle opened
     * after them): its entries' times so far are kept */
    if (r->gen == gen && r->last) memcpy(a, r->last, (size_t)r->n * sizeof *a);
    free(r->last);
    r->last = a;
    r->gen = gen;
    r->n = n;
    return a;
}

void kvx_st_note(kvx_store *s, const kvx_view *v, size_t n, uint64_t misses, int count)
{
    uint64_t now = n ? kvx_st_now_ns() : 0;
    int persist = 0;
    pthread_mutex_lock(&s->use_mu);
    uint64_t hits = 0;
    /* one read lock on the handle cache for the whole prompt */
    if (n) pthread_rwlock_rdlock(&s->cache_lock);
    for (size_t i = 0; i < n; i++) {
        if (!v[i].shard) continue;
        hits++;
        uint32_t b = KVX_COORD_SHARD(v[i].coordinate);
        uint64_t gen = s->cache[b].sh == v[i].shard ? s->cache[b].gen : 0;
        if (!gen) continue;
        st_use *u = &s->use[b];
        uint32_t nb = kvx_shard_get_info(v[i].shard)->num_blocks;
        if (u->gen != gen || !u->bits || nb > u->nbits) {
            uint8_t *bits = calloc((nb + 7) / 8 + 1, 1);
            if (!bits) continue;
            /* a shard that grew since (an active shard's appends): its
             * marks so far are kept; before, its later entries were never
             * marked, so eviction saw them as unused since their put */
            int grown = u->gen == gen && u->bits;
            if (grown) memcpy(bits, u->bits, (u->nbits + 7) / 8);
            free(u->bits);
            u->bits = bits;
            u->nbits = nb;
            if (!grown) {
                u->gen = gen;
                u->hits = 0;
            }
        }
        if (v[i].entry < u->nbits) u->bits[v[i].entry / 8] |= (uint8_t)(1u << (v[i].entry % 8));
        u->last_use = now;
        u->hits++;
        u->dirty = 1;
        if (s->writer) {
            uint64_t *last = kvx_st_rec_get(s, b, gen, u->nbits);
            if (last && v[i].entry < u->nbits) last[v[i].entry] = now;
        }
    }
    if (n) pthread_rwlock_unlock(&s->cache_lock);
    if (count) {
        s->hits += hits;
        s->misses += misses;
        if (++s->calls % USE_PERSIST_CALLS == 0 && !s->writer) persist = 1;
    }
    pthread_mutex_unlock(&s->use_mu);
    if (persist) kvx_st_usage_persist(s);
}

int kvx_st_usage_persist(kvx_store *s)
{
    if (!s->cat || kvx_cat_readonly(s->cat)) return 0;
    /* one edit: each dirty shard's bits merged into its usage record (only
     * while the catalog still names that generation), the counters added */
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    kvx_cat_stats d = {0};
    int any = 0;
    pthread_mutex_lock(&s->use_mu);
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        st_use *x = &s->use[b];
        if (!x->dirty) continue;
        kvx_cat_usage u = {x->gen, x->last_use, x->hits, x->nbits};
        kvx_cat_edit_merge_usage(&e, b, &u, x->bits); /* copied; a failure is kept in e */
        memset(x->bits, 0, (x->nbits + 7) / 8);
        x->dirty = 0;
        x->hits = 0;
        any = 1;
    }
    d.hits = s->hits;
    d.misses = s->misses;
    s->hits = s->misses = 0;
    pthread_mutex_unlock(&s->use_mu);
    int rc = 0;
    if (any || d.hits || d.misses) {
        kvx_cat_edit_stats(&e, &d, 0);
        rc = kvx_cat_apply(s->cat, &e);
    }
    kvx_cat_edit_free(&e);
    if (rc) {
        /* usage is advisory: give the counters back, drop the bits */
        pthread_mutex_lock(&s->use_mu);
        s->hits += d.hits;
        s->misses += d.misses;
        pthread_mutex_unlock(&s->use_mu);
    }
    return rc;
}

int kvx_st_usage_read(kvx_store *s, st_usage_view *uv)
{
    memset(uv, 0, ST_SLOTS * sizeof *uv);
    kvx_cat_snap *snap;
    int rc = kvx_cat_snap_begin(s->cat, &snap);
    if (rc) return rc;
    uint8_t *bits = NULL;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!s->reg->live[b]) continue;
        uv[b].last_use = s->reg->rec[b].created_ns;
        if (!bits && !(bits = malloc(KVX_CAT_BITMAP_MAX))) {
            rc = kvx_fail(-ENOMEM, "store: out of memory");
            break;
        }
        kvx_cat_usage u;
        size_t nb = 0;
        int r = kvx_cat_usage_get(snap, b, &u, bits, KVX_CAT_BITMAP_MAX, &nb);
        /* usage is advisory: a missing or damaged record, or one of an
         * older generation, only loses recency; a failed read is an error */
        if (r == KVX_ENOTFOUND || r == KVX_ECORRUPT || (r == 0 && u.gen != s->reg->rec[b].gen)) continue;
        if (r) {
            rc = r;
            break;
        }
        if (u.last_use_ns > uv[b].last_use) uv[b].last_use = u.last_use_ns;
        if (nb) {
            uv[b].bits = bits;
            uv[b].nbits = u.n_bits;
            bits = NULL;
        }
    }
    kvx_cat_snap_end(snap);
    free(bits);
    if (rc) {
        kvx_st_usage_free(uv);
        memset(uv, 0, ST_SLOTS * sizeof *uv);
    }
    return rc;
}

void kvx_st_usage_free(st_usage_view *uv)
{
    for (int b = 0; b < ST_SLOTS; b++) free(uv[b].bits);
}

/* Per-entry recency of every live shard (ns): the writer's per-entry last
 * use where it has one (its own lookups, carried and merged blocks), else
 * the shard's last use for an entry whose referenced bit is set (lookups
 * of other processes, or before a restart), else the shard's creation. A
 * shard's last use newer than every per-entry time the writer holds for it
 * is another process's, and wins for the entries whose bit is set. */
int kvx_st_recency_build(kvx_store *s, const st_usage_view *uv, uint64_t **r)
{
    int rc = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++) r[b] = NULL;
    pthread_mutex_lock(&s->use_mu);
    for (uint32_t b = 0; b < ST_SLOTS && !rc; b++) {
        if (!s->reg->live[b]) continue;
        uint32_t n = s->reg->rec[b].n_entries;
        r[b] = malloc(((size_t)n + 1) * sizeof **r);
        if (!r[b]) {
            rc = kvx_fail(-ENOMEM, "store: out of memory");
            break;
        }
        const st_rec *rec = &s->rec[b];
        int have = rec->gen == s->reg->rec[b].gen && rec->last && rec->n >= n;
        /* the writer's own latest use of the shard: a later last use in the
         * usage record is another process's (a reader's lookups), which the
         * writer's older per-block times must not hide */
        uint64_t own = 0;
        for (uint32_t i = 0; have && i < n; i++)
            if (rec->last[i] > own) own = rec->last[i];
        int foreign = uv[b].bits && uv[b].last_use > own;
        for (uint32_t i = 0; i < n; i++) {
            uint64_t x = s->reg->rec[b].created_ns;
            int used = uv[b].bits && i < uv[b].nbits && (uv[b].bits[i / 8] & (1u << (i % 8)));
            if (used && uv[b].last_use > x) x = uv[b].last_use;
            if (have && rec->last[i] && !(used && foreign)) x = rec->last[i];
            r[b][i] = x;
        }
    }
    pthread_mutex_unlock(&s->use_mu);
    return rc;
}

void kvx_st_recency_free(uint64_t **r)
{
    for (int b = 0; b < ST_SLOTS; b++) free(r[b]);
}
