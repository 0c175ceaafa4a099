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
 * counters; written to LMDB by the writer at flush/gc/close and by readers
 * every USE_PERSIST_CALLS calls and at close. */
uint64_t *kvx_st_rec_get(kvx_store *s, uint32_t byte, uint64_t gen, uint32_t n)
{
    st_rec *r = &s->rec[byte];
    if (r->gen == gen && r->last && r->n == n) return r->last;
    uint64_t *a = calloc((size_t)n + 1, sizeof *a);
    if (!a) return NULL;
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
        if (u->gen != gen || !u->bits) {
            uint32_t nb = kvx_shard_get_info(v[i].shard)->num_blocks;
            uint8_t *bits = calloc((nb + 7) / 8 + 1, 1);
            if (!bits) continue;
            free(u->bits);
            u->bits = bits;
            u->nbits = nb;
            u->gen = gen;
            u->hits = 0;
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

typedef struct st_usage_snap {
    kvx_store *s;
    st_use use[ST_SLOTS];
    uint64_t hits, misses;
} st_usage_snap;

static int st_usage_body(MDB_txn *txn, void *ctx)
{
    st_usage_snap *u = ctx;
    kvx_index *ix = u->s->ix;
    kvx_idx_stats st;
    int rc = kvx_idx_get_stats(txn, ix, &st);
    if (rc) return rc;
    st.hits += u->hits;
    st.misses += u->misses;
    if ((rc = kvx_idx_put_stats(txn, ix, &st))) return rc;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        st_use *x = &u->use[b];
        if (!x->dirty) continue;
        kvx_idx_shard rec;
        rc = kvx_idx_get_shard(txn, ix, b, &rec);
        if (rc == MDB_NOTFOUND) continue;
        if (rc) return rc;
        if (rec.gen != x->gen) continue; /* shard replaced since: drop */
        size_t nbytes = (x->nbits + 7) / 8, oldlen = 0;
        uint8_t *tmp = calloc(1, nbytes + 1), *oldbits = calloc(1, 65536 / 8 + 1);
        if (!tmp || !oldbits) {
            free(tmp);
            free(oldbits);
            return ENOMEM;
        }
        kvx_idx_usage old = {0};
        rc = kvx_idx_get_usage(txn, ix, b, &old, oldbits, 65536 / 8, &oldlen);
        if (rc == MDB_CORRUPTED || rc == MDB_NOTFOUND) {
            memset(&old, 0, sizeof old); /* usage is advisory: a damaged record starts over */
            rc = 0;
        }
        if (rc) {
            free(tmp);
            free(oldbits);
            return rc;
        }
        int same = old.gen == x->gen && old.n_bits == x->nbits && oldlen == nbytes;
        kvx_idx_usage nu = {x->gen, x->last_use > old.last_use_ns ? x->last_use : old.last_use_ns,
                            (old.gen == x->gen ? old.hits : 0) + x->hits, x->nbits, 0};
        for (size_t i = 0; i < nbytes; i++) tmp[i] = x->bits[i] | (same ? oldbits[i] : 0);
        rc = kvx_idx_put_usage(txn, ix, b, &nu, tmp, nbytes);
        free(tmp);
        free(oldbits);
        if (rc) return rc;
    }
    return 0;
}

int kvx_st_usage_persist(kvx_store *s)
{
    if (!s->ix || s->ix->rdonly_env) return 0;
    st_usage_snap *u = calloc(1, sizeof *u);
    if (!u) return -ENOMEM;
    u->s = s;
    int any = 0;
    pthread_mutex_lock(&s->use_mu);
    for (int b = 0; b < ST_SLOTS; b++) {
        st_use *x = &s->use[b];
        if (!x->dirty) continue;
        u->use[b] = *x;
        u->use[b].bits = malloc((x->nbits + 7) / 8 + 1);
        if (u->use[b].bits) memcpy(u->use[b].bits, x->bits, (x->nbits + 7) / 8);
        else u->use[b].dirty = 0;
        memset(x->bits, 0, (x->nbits + 7) / 8);
        x->dirty = 0;
        x->hits = 0;
        any = 1;
    }
    u->hits = s->hits;
    u->misses = s->misses;
    s->hits = s->misses = 0;
    pthread_mutex_unlock(&s->use_mu);
    int rc = 0;
    if (any || u->hits || u->misses) rc = kvx_idx_write(s->ix, st_usage_body, u);
    if (rc) {
        /* usage is advisory: give the counters back, drop the bits */
        pthread_mutex_lock(&s->use_mu);
        s->hits += u->hits;
        s->misses += u->misses;
        pthread_mutex_unlock(&s->use_mu);
    }
    for (int b = 0; b < ST_SLOTS; b++) free(u->use[b].bits);
    free(u);
    return rc;
}

int kvx_st_usage_read(kvx_store *s, st_usage_view *uv)
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

void kvx_st_usage_free(st_usage_view *uv)
{
    for (int b = 0; b < ST_SLOTS; b++) free(uv[b].bits);
}

/* Per-entry recency of every live shard (ns): the writer's per-entry last
 * use where it has one (its own lookups, carried and merged blocks), else
 * the shard's last use for an entry whose referenced bit is set (lookups
 * of other processes, or before a restart), else the shard's creation. */
int kvx_st_recency_build(kvx_store *s, const st_usage_view *uv, uint64_t **r)
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

void kvx_st_recency_free(uint64_t **r)
{
    for (int b = 0; b < ST_SLOTS; b++) free(r[b]);
}
