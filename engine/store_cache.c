/*
 * store_cache.c - the shard cache (one mapped handle per shard byte,
 * opened lazily) and the store's view of the catalog's registry.
 *
 * Rule: a passing failure (EMFILE, EIO, no mapping-guard slot...) is never
 * a verdict on a file: only a file that is there and fails validation is
 * marked bad, and only a sound shard may ever be deleted.
 */
#include "store.h"
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int kvx_st_shard_ours(const kvx_store *s, const kvx_shard *sh, char *why, size_t cap)
{
    const kvx_shard_info *in = kvx_shard_get_info(sh);
    const kvx_geometry *g = &in->geometry;
    if (g->model_signature != s->g.model_signature) {
        snprintf(why, cap, "written for model %016llx, this store's is %016llx (not one of its shards)",
                 (unsigned long long)g->model_signature, (unsigned long long)s->g.model_signature);
        return KVX_EMODEL;
    }
    if (g->num_layers != s->g.num_layers || g->kv_heads != s->g.kv_heads || g->head_dim != s->g.head_dim ||
        g->block_tokens != s->g.block_tokens || g->quant != s->g.quant) {
        snprintf(why, cap, "geometry differs from this store's (not one of its shards)");
        return KVX_ESHAPE;
    }
    if (s->keyed ? !(in->flags & KVX_FLAG_KEYS) : !(in->flags & KVX_FLAG_HASHES)) {
        snprintf(why, cap, s->keyed ? "has no key table (not one of this keyed store's shards)"
                                    : "has no chained-hash table (not one of this store's shards)");
        return KVX_EFORMAT;
    }
    /* the store addresses entry i by coordinate (shard byte, i, 0): a file
     * laid out otherwise would make it copy or drop the wrong entries */
    for (uint32_t i = 0; i < in->num_blocks; i++) {
        kvx_entry e;
        int rc = kvx_shard_entry(&e, sh, i);
        if (rc) {
            snprintf(why, cap, "entry %u cannot be read: %s", i, kvx_strerror(rc));
            return rc;
        }
        if (e.coordinate != KVX_COORD(in->shard_id, i, 0)) {
            snprintf(why, cap, "entry %u has coordinate 0x%08x, not 0x%08x (shard %u's entry %u): not laid out as "
                     "this store writes shards", i, e.coordinate, KVX_COORD(in->shard_id, i, 0), in->shard_id, i);
            return KVX_ECORRUPT;
        }
    }
    return 0;
}

/* A handle the cache lets go of (under cache_lock, write): closed, or,
 * in a store that frees pages in place while views still hold it, kept in
 * the slot's retired list, so a punch sees those views (store_holes.c).
 * Returns the handle to close after the lock is released, or NULL. */
static kvx_shard *st_cache_let_go(kvx_store *s, st_cache *c, kvx_shard *old)
{
    if (!old || !s->holes || kvx_shard_refs(old) <= 1) return old;
    if (c->nretired == c->capretired) {
        size_t cap = c->capretired ? c->capretired * 2 : 4;
        kvx_shard **r = realloc(c->retired, cap * sizeof *r);
        if (!r) {
            /* no room to keep it: no punch in this store until it is gone */
            s->holes = 0;
            return old;
        }
        c->retired = r;
        c->capretired = cap;
    }
    c->retired[c->nretired++] = old;
    return NULL;
}

kvx_shard *kvx_st_shard_get(kvx_store *s, uint32_t byte, uint64_t gen)
{
    pthread_rwlock_rdlock(&s->cache_lock);
    st_cache *c = &s->cache[byte];
    if (c->gen == gen && (c->sh || c->bad)) {
        kvx_shard *r = c->bad ? NULL : kvx_shard_ref(c->sh);
        pthread_rwlock_unlock(&s->cache_lock);
        return r;
    }
    pthread_rwlock_unlock(&s->cache_lock);

    kvx_shard *sh = NULL;
    int bad = 1, transient = 0;
    char why[240] = "gone from shards/";
    /* its sealed name, or its active one (store_active.c) */
    int rc = kvx_st_open_gen(s, byte, gen, &sh, NULL, 0);
    if (rc == 0) {
        if (kvx_shard_get_info(sh)->shard_id != byte)
            snprintf(why, sizeof why, "holds shard byte %u, registered as byte %u", kvx_shard_get_info(sh)->shard_id,
                     byte);
        else if (kvx_st_shard_ours(s, sh, why, sizeof why) == 0)
            bad = 0;
    } else if (rc == -ENOENT) {
        kvx_clear_error(); /* gone: a verdict */
    } else if (!st_open_transient(rc)) {
        /* malformed, a bad checksum, a symlink or not a regular file where
         * the shard belongs */
        snprintf(why, sizeof why, "cannot be validated: %s (%s)", kvx_last_error(), kvx_err_name(rc));
    } else {
        /* EIO, EMFILE, EACCES, ENOMEM, no mapping-guard slot...: a miss
         * now, not a verdict on the file */
        transient = 1;
    }
    if (transient) return NULL;
    pthread_rwlock_wrlock(&s->cache_lock);
    c = &s->cache[byte];
    kvx_shard *old = NULL;
    if (c->gen != gen || (!c->sh && !c->bad)) {
        old = st_cache_let_go(s, c, c->sh);
        c->gen = gen;
        c->sh = bad ? NULL : sh;
        c->bad = bad;
        snprintf(c->why, sizeof c->why, "%s", bad ? why : "");
        sh = bad ? sh : NULL;
    }
    kvx_shard *r = c->bad || c->gen != gen ? NULL : kvx_shard_ref(c->sh);
    pthread_rwlock_unlock(&s->cache_lock);
    kvx_shard_close(old);
    kvx_shard_close(sh);
    return r;
}

kvx_shard *kvx_st_shard_get_n(kvx_store *s, uint32_t byte, uint64_t gen, uint32_t min_entries)
{
    kvx_shard *sh = kvx_st_shard_get(s, byte, gen);
    if (sh && kvx_shard_get_info(sh)->num_blocks < min_entries) {
        /* an active shard's handle older than its last append */
        kvx_st_cache_stale(s, byte, sh);
        kvx_shard_close(sh);
        sh = kvx_st_shard_get(s, byte, gen);
    }
    return sh;
}

void kvx_st_cache_stale(kvx_store *s, uint32_t byte, const kvx_shard *sh)
{
    pthread_rwlock_wrlock(&s->cache_lock);
    kvx_shard *old = s->cache[byte].sh == sh ? s->cache[byte].sh : NULL;
    if (old) {
        s->cache[byte].sh = NULL;
        s->cache[byte].gen = 0;
        s->cache[byte].bad = 0;
        old = st_cache_let_go(s, &s->cache[byte], old);
    }
    pthread_rwlock_unlock(&s->cache_lock);
    kvx_shard_close(old);
}

void kvx_st_cache_drop(kvx_store *s, uint32_t byte)
{
    pthread_rwlock_wrlock(&s->cache_lock);
    kvx_shard *old = st_cache_let_go(s, &s->cache[byte], s->cache[byte].sh);
    s->cache[byte].sh = NULL;
    s->cache[byte].gen = 0;
    s->cache[byte].bad = 0;
    pthread_rwlock_unlock(&s->cache_lock);
    kvx_shard_close(old);
}

uint32_t kvx_st_count_unverified(const kvx_shard *sh)
{
    uint32_t n = 0, cnt = kvx_shard_get_info(sh)->num_blocks;
    for (uint32_t i = 0; i < cnt; i++) {
        kvx_entry e;
        if (kvx_shard_entry(&e, sh, i) == 0 && e.hash && !e.digest) n++;
    }
    return n;
}

/* Is shard (b, gen) sound: it opens and every page passes its CRC? Only
 * sound blocks are ever deleted (DESIGN.md rule 2). 1 sound, 0 damaged
 * (why filled), -1 cannot tell now (a passing failure). */
int kvx_st_registry_load(kvx_store *s)
{
    int rc = kvx_cat_registry_load(s->cat);
    if (rc) return rc;
    s->next_gen = s->reg->next_gen;
    s->index_live = s->next_gen != 0; /* every index a store made names next_gen */
    /* never raised above a file's name: a generation is only a name, and
     * kvx_st_writer_begin skips one in use (a stray file named
     * ffffffffffffffff.kvx used the counter up and stopped every writer) */
    if (s->next_gen == 0) s->next_gen = 1;
    /* sequence numbers only grow (1 is what a copy of an entry written
     * before them takes) */
    if (s->reg->next_seq > s->next_seq) s->next_seq = s->reg->next_seq;
    if (s->next_seq < 2) s->next_seq = 2;
    return 0;
}

int kvx_st_refuse_predigest(const kvx_store *s, const char *name, uint32_t flags)
{
    if (!(flags & KVX_FLAG_LINEAGE) || (flags & KVX_FLAG_DIGEST)) return 0;
    return kvx_fail(KVX_EVERSION,
                    "store %s: shards/%s was written before prefix digests (kvx 0.x): recreate the store (it is a "
                    "cache)",
                    s->dir, name);
}

int kvx_st_registry_refuse_predigest(const kvx_store *s)
{
    for (int b = 0; b < ST_SLOTS; b++) {
        if (!s->reg->live[b]) continue;
        char name[32];
        kvx_st_shard_name(name, s->reg->rec[b].gen);
        int rc = kvx_st_refuse_predigest(s, name, s->reg->rec[b].flags);
        if (rc) return rc;
    }
    return 0;
}

int kvx_st_register(kvx_cat_edit *e, const st_sealed *x)
{
    kvx_cat_shard rec = {x->gen, x->bytes, kvx_st_now_ns(), x->n, x->flags, x->nunv, x->ino};
    return kvx_cat_edit_add_shard(e, x->byte, &rec, x->last_use);
}
