/*
 * store_commit.c - what a batch's commit decides before its files are
 * sealed: the list of its parked and sealed files, and, in a keyed store,
 * the copies another batch committed since this one's put (the later
 * commit wins: DESIGN.md "The files are the whole truth").
 *
 * Rule: a key's older copy leaves the catalog only with a tombstone of
 * the new commit's number in the new commit's files, unless its bytes are
 * the new page's (compared), when the new copy takes its number instead.
 */
#include "store.h"
#include "common/digest.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int kvx_st_sealed_push(kvx_store_batch *x, const st_sealed *v)
{
    if (x->nsealed == x->capsealed) {
        size_t n = x->capsealed ? x->capsealed * 2 : 8;
        st_sealed *p = realloc(x->sealed, n * sizeof *p);
        if (!p) return kvx_fail(-ENOMEM, "store: out of memory");
        x->sealed = p;
        x->capsealed = n;
    }
    x->sealed[x->nsealed++] = *v;
    return 0;
}

/* Does the catalog copy at loc hold the key whose SHA-256 is digest?
 * Then *out (the shard, one reference) and *en are its entry. */
static int st_loc_key(kvx_store *s, const kvx_cat_loc *loc, const uint8_t *digest, kvx_shard **out, kvx_entry *en)
{
    kvx_shard *sh = kvx_st_shard_get_n(s, KVX_COORD_SHARD(loc->coord), loc->gen, KVX_COORD_BLOCK(loc->coord) + 1);
    if (!sh) return 0;
    uint8_t d[KVX_DIGEST_BYTES];
    if (kvx_shard_entry(en, sh, KVX_COORD_BLOCK(loc->coord)) == 0 && en->coordinate == loc->coord && en->key) {
        kvx_sha256(d, en->key, en->key_len);
        if (memcmp(d, digest, KVX_DIGEST_BYTES) == 0) {
            *out = sh;
            return 1;
        }
    }
    kvx_shard_close(sh);
    return 0;
}

/* A tombstone for key into one of x's parked writers with room, or a new
 * one (parked too). */
static int st_add_tomb(kvx_store *s, kvx_store_batch *x, const uint8_t *key, uint32_t key_len, uint32_t left)
{
    for (size_t i = x->nsealed; i-- > 0;) {
        kvx_shard_writer *w = x->sealed[i].w;
        if (!w || kvx_shard_writer_count(w) >= kvx_shard_writer_max(w)) continue;
        uint32_t idx = kvx_shard_writer_count(w);
        int rc = kvx_shard_writer_add_tombstone(w, (uint16_t)idx, key, key_len);
        if (rc) return rc;
        x->sealed[i].n = kvx_shard_writer_count(w);
        x->sealed[i].bytes = kvx_shard_writer_bytes(w);
        return 0;
    }
    st_open o = {0};
    int rc = kvx_st_writer_begin(s, kvx_st_kind_flags(s, ST_KIND_PLAIN), NULL, &o, left);
    if (!rc) rc = kvx_shard_writer_add_tombstone(o.w, 0, key, key_len);
    if (!rc) {
        st_sealed v;
        if (!(rc = kvx_st_writer_park(s, &o, &v)) && (rc = kvx_st_sealed_push(x, &v))) kvx_shard_writer_abort(v.w);
    }
    if (rc && o.w) kvx_shard_writer_abort(o.w);
    return rc;
}

/* The parked writer holding pending entry p (NULL when none does). */
static kvx_shard_writer *st_parked_of(const kvx_store_batch *x, const st_pblock *p)
{
    for (size_t i = 0; i < x->nsealed; i++)
        if (x->sealed[i].w && x->sealed[i].gen == p->gen) return x->sealed[i].w;
    return NULL;
}

/* Is the committed copy (sh, en) sound and byte for byte pending page p?
 * Then *seq is its sequence number. */
static int st_same_bytes(const kvx_store_batch *x, const st_pblock *p, kvx_shard *sh, const kvx_entry *en,
                         uint8_t *buf, size_t cap, uint64_t *seq)
{
    kvx_shard_writer *w = st_parked_of(x, p);
    const void *old;
    uint32_t len = 0;
    int tomb = 0;
    uint32_t idx = KVX_COORD_BLOCK(en->coordinate);
    if (!w || kvx_shard_page(&old, sh, idx, 1) != 0 || kvx_shard_entry_commit(sh, idx, seq, &tomb) != 0) {
        kvx_clear_error();
        return 0;
    }
    if (kvx_shard_writer_page(w, KVX_COORD_BLOCK(p->coord), buf, cap, &len) != 0) {
        kvx_clear_error();
        return 0;
    }
    return len == en->bytes && memcmp(buf, old, len) == 0;
}

/* A keyed store: a pending page whose key the catalog names in a copy
 * another batch committed since this one's put (two batches put one key:
 * the later commit wins). When that copy is sound and holds the very same
 * bytes (compared), the new one is a second copy of it: it takes the old
 * one's sequence number and both stay indexed (a damaged one then never
 * hides the other). Otherwise the old copy leaves the catalog (edit e)
 * and a tombstone in this commit hides it, and every older copy, from a
 * recovery that reads the files: the new page has the same sequence
 * number and a page wins over a tombstone of its own number. */
int kvx_st_supersede(kvx_store *s, kvx_store_batch *x, kvx_cat_edit *e)
{
    kvx_cat_snap *snap;
    int rc = kvx_cat_snap_begin(s->cat, &snap);
    if (rc) return rc;
    uint8_t *buf = NULL;
    for (size_t i = 0; !rc && i < x->npend; i++) {
        const st_pblock *p = &x->pend[i];
        for (size_t j = 0; !rc; j++) {
            kvx_cat_loc loc;
            int r = kvx_cat_loc_at(snap, p->hash, j, &loc);
            if (r == KVX_ENOTFOUND) break;
            if (r) {
                rc = r;
                break;
            }
            kvx_shard *sh = NULL;
            kvx_entry en;
            if (!st_loc_key(s, &loc, p->digest, &sh, &en)) continue;
            uint64_t oseq = 0;
            if (!buf && !(buf = malloc(s->page_bytes))) {
                kvx_shard_close(sh);
                rc = kvx_fail(-ENOMEM, "store: out of memory");
                break;
            }
            if (st_same_bytes(x, p, sh, &en, buf, s->page_bytes, &oseq)) {
                kvx_shard_close(sh);
                rc = kvx_shard_writer_set_seq(st_parked_of(x, p), KVX_COORD_BLOCK(p->coord), oseq ? oseq : 1);
                continue;
            }
            uint32_t left = x->npend - i > UINT32_MAX ? UINT32_MAX : (uint32_t)(x->npend - i);
            rc = st_add_tomb(s, x, en.key, en.key_len, left);
            kvx_shard_close(sh);
            if (!rc) rc = kvx_cat_edit_del_block(e, loc.coord, p->hash, loc.gen);
        }
    }
    kvx_cat_snap_end(snap);
    free(buf);
    return rc;
}

