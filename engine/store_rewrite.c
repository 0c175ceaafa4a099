/*
 * store_rewrite.c - copying blocks into new shards (eviction's carries,
 * compaction, gc's salvage, migration).
 *
 * Rule: only blocks whose page passes its CRC are copied; the new shards
 * are sealed (durable) but unpublished, and a failed rewrite unlinks them.
 */
#include "store.h"
#include "common/digest.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Copies the moves' blocks into new sealed shards (in shards/, not yet
 * published) of the given flags. Pages are CRC-checked on the way: a bad
 * page is not carried (its move gets new_gen 0 and it leaves the index
 * with its shard). */
int kvx_st_rewrite(kvx_store *s, st_move *mv, size_t n, uint32_t flags, uint8_t *busy, st_sealed **io_out,
                      size_t *io_n, int why)
{
    st_open o = {0};
    int rc = 0;
    uint64_t last_use = 0;
    size_t first_out = *io_n;
    for (size_t i = 0; i < n && !rc; i++) {
        st_move *m = &mv[i];
        m->new_gen = 0;
        kvx_shard *sh = kvx_st_shard_get_n(s, KVX_COORD_SHARD(m->src_coord), m->src_gen, KVX_COORD_BLOCK(m->src_coord) + 1);
        if (!sh) {
            rc = kvx_fail(-EIO, "store: shard %u cannot be opened to copy its blocks", KVX_COORD_SHARD(m->src_coord));
            break;
        }
        uint32_t idx = KVX_COORD_BLOCK(m->src_coord);
        kvx_entry e;
        const void *page = NULL;
        uint64_t seq = 0;
        int tomb = 0;
        if ((rc = kvx_shard_entry(&e, sh, idx)) || (rc = kvx_shard_entry_commit(sh, idx, &seq, &tomb))) {
            kvx_shard_close(sh);
            break;
        }
        if (tomb && !(flags & KVX_FLAG_TOMB)) {
            kvx_shard_close(sh);
            rc = kvx_fail(KVX_EINVALID, "store: a tombstone cannot be copied into a shard without a tombstone table");
            break;
        }
        if (!tomb && kvx_shard_page(&page, sh, idx, 1)) { /* a damaged page is not copied */
            kvx_shard_close(sh);
            continue;
        }
        if (!o.w && (rc = kvx_st_writer_begin(s, flags, busy, &o, n - i > UINT32_MAX ? UINT32_MAX : (uint32_t)(n - i)))) {
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
        if (flags & KVX_FLAG_KEYS) {
            in.hash = 0;
            in.key = e.key;
            in.key_len = e.key_len;
            in.page_len = e.bytes;
        }
        rc = tomb ? kvx_shard_writer_add_tombstone(o.w, (uint16_t)ni, e.key, e.key_len) : kvx_shard_writer_add(o.w, &in);
        kvx_shard_close(sh);
        /* a copy keeps its entry's sequence number (the order of the
         * commit that wrote it); an entry of a file written before
         * sequence numbers takes 1, older than every commit since */
        if (!rc && (flags & KVX_FLAG_SEQ)) rc = kvx_shard_writer_set_seq(o.w, ni, seq ? seq : 1);
        if (rc) break;
        if (!tomb) s->wrote[why].pages += e.bytes;
        m->seq = seq;
        m->tomb = tomb;
        if (!in.digest && !tomb && !(flags & KVX_FLAG_KEYS)) o.nunv++;
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
            if ((rc = kvx_st_writer_seal(s, &o, &x, 0))) break;
            s->wrote[why].files += x.bytes;
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
            if (!(rc = kvx_st_writer_seal(s, &o, &x, 0))) {
                s->wrote[why].files += x.bytes;
                x.last_use = last_use ? last_use : x.last_use;
                arr[(*io_n)++] = x;
            }
        }
    }
    if (rc) {
        if (o.w) kvx_shard_writer_abort(o.w);
        kvx_st_unlink_sealed(s, *io_out + first_out, *io_n - first_out);
        *io_n = first_out;
    }
    return rc;
}

/* A tombstone of shard b found by name (hash) and sequence number. */
typedef struct st_tomb {
    uint64_t hash, seq;
    uint32_t idx;
} st_tomb;

static int st_cmp_tomb(const void *pa, const void *pb)
{
    const st_tomb *a = pa, *b = pb;
    return (a->hash > b->hash) - (a->hash < b->hash);
}

/* Which tombstones of live shard b must a rewrite that drops b carry?
 * needed[i] = 1 for tombstone i while another live shard holds an entry
 * of its key's name older than it (the drop's other victims count: until
 * their unlink is durable they may come back). A shard that cannot be
 * opened now keeps every one. *out NULL: b holds none. One pass over the
 * live shards' entries, only those whose oldest entry is older than b's
 * newest tombstone. */
static int st_tombs_needed(kvx_store *s, uint32_t b, const kvx_shard *sh, uint8_t **out)
{
    *out = NULL;
    uint32_t n = kvx_shard_get_info(sh)->num_blocks;
    st_tomb *t = malloc((n ? n : 1) * sizeof *t);
    if (!t) return kvx_fail(-ENOMEM, "store: out of memory");
    size_t nt = 0;
    uint64_t newest = 0;
    for (uint32_t i = 0; i < n; i++) {
        kvx_entry e;
        uint64_t seq = 0;
        int tomb = 0;
        if (kvx_shard_entry_commit(sh, i, &seq, &tomb) || !tomb || kvx_shard_entry(&e, sh, i)) continue;
        t[nt++] = (st_tomb){e.hash, seq, i};
        if (seq > newest) newest = seq;
    }
    if (!nt) {
        free(t);
        return 0;
    }
    uint8_t *needed = calloc(n, 1);
    if (!needed) {
        free(t);
        return kvx_fail(-ENOMEM, "store: out of memory");
    }
    qsort(t, nt, sizeof *t, st_cmp_tomb);
    for (uint32_t f = 0; f < ST_SLOTS; f++) {
        if (f == b || !s->reg->live[f]) continue;
        kvx_shard *o = kvx_st_shard_get_n(s, f, s->reg->rec[f].gen, s->reg->rec[f].n_entries);
        if (!o) { /* cannot tell now: every tombstone stays */
            for (size_t k = 0; k < nt; k++) needed[t[k].idx] = 1;
            continue;
        }
        uint64_t min = kvx_shard_min_seq(o);
        uint32_t m = kvx_shard_get_info(o)->num_blocks;
        for (uint32_t j = 0; j < m && (min == 0 || min < newest); j++) {
            kvx_entry e;
            uint64_t seq = 0;
            int tomb = 0;
            if (kvx_shard_entry(&e, o, j) || !e.hash || kvx_shard_entry_commit(o, j, &seq, &tomb)) continue;
            st_tomb key = {e.hash, 0, 0};
            st_tomb *hit = bsearch(&key, t, nt, sizeof *t, st_cmp_tomb);
            if (!hit) continue;
            while (hit > t && hit[-1].hash == e.hash) hit--;
            for (; hit < t + nt && hit->hash == e.hash; hit++)
                if (seq < hit->seq) needed[hit->idx] = 1; /* an older copy (or an older tombstone) of the name */
        }
        kvx_shard_close(o);
    }
    free(t);
    *out = needed;
    return 0;
}

/* Appends the entries of shard b as moves, each with its recency r[i];
 * with hot_after, only entries used after it (r[i] > hot_after). */
int kvx_st_collect(kvx_store *s, uint32_t b, const uint64_t *r, int hot_only, uint64_t hot_after, st_move **mv,
                      size_t *n, size_t *cap, size_t limit)
{
    kvx_shard *sh = kvx_st_shard_get_n(s, b, s->reg->rec[b].gen, s->reg->rec[b].n_entries);
    if (!sh) return kvx_fail(-EIO, "store: shard %u cannot be opened to copy its blocks", b);
    uint32_t cnt = kvx_shard_get_info(sh)->num_blocks;
    /* a keyed page its owner deleted is no longer indexed: never copied
     * (a copy would bring it back) */
    kvx_cat_snap *snap = NULL;
    int rc = (kvx_shard_get_info(sh)->flags & KVX_FLAG_KEYS) ? kvx_cat_snap_begin(s->cat, &snap) : 0;
    if (rc) {
        kvx_shard_close(sh);
        return rc;
    }
    uint8_t *needed = NULL;
    if (!rc && (kvx_shard_get_info(sh)->flags & KVX_FLAG_TOMB)) rc = st_tombs_needed(s, b, sh, &needed);
    if (rc) {
        if (snap) kvx_cat_snap_end(snap);
        kvx_shard_close(sh);
        return rc;
    }
    for (uint32_t i = 0; i < cnt && *n < limit; i++) {
        uint64_t ri = r && i < s->reg->rec[b].n_entries ? r[i] : s->reg->rec[b].created_ns;
        kvx_entry e;
        uint64_t seq = 0;
        int tomb = 0;
        if (kvx_shard_entry(&e, sh, i) || kvx_shard_entry_commit(sh, i, &seq, &tomb)) continue;
        if (kvx_st_freed(s, s->reg->rec[b].gen, i)) continue; /* evicted in place: gone */
        if (tomb) {
            /* a tombstone outlives every older copy of its key: carried
             * whatever its recency while another shard holds one */
            if (!needed || !needed[i]) continue;
        } else if (hot_only && ri <= hot_after) {
            continue;
        }
        if (!e.hash) continue;
        if (snap && !tomb) {
            int has = kvx_cat_has_loc(snap, e.hash, e.coordinate, s->reg->rec[b].gen);
            if (has < 0) {
                kvx_cat_snap_end(snap);
                kvx_shard_close(sh);
                free(needed);
                return has;
            }
            if (!has) continue;
        }
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 256;
            st_move *p = realloc(*mv, nc * sizeof *p);
            if (!p) {
                if (snap) kvx_cat_snap_end(snap);
                kvx_shard_close(sh);
                free(needed);
                return kvx_fail(-ENOMEM, "store: out of memory");
            }
            *mv = p;
            *cap = nc;
        }
        st_move *m = &(*mv)[(*n)++];
        memset(m, 0, sizeof *m);
        m->src_coord = e.coordinate;
        m->src_gen = s->reg->rec[b].gen;
        m->hash = e.hash;
        m->parent = e.parent;
        if (e.digest) memcpy(m->digest, e.digest, KVX_DIGEST_BYTES);
        m->last_use = ri;
        m->seq = seq;
        m->tomb = tomb;
    }
    if (snap) kvx_cat_snap_end(snap);
    kvx_shard_close(sh);
    free(needed);
    return 0;
}

/* After a committed rewrite: the new shards' entries keep the recency
 * their blocks had. */
void kvx_st_rec_from_moves(kvx_store *s, const st_move *mv, size_t n, const st_sealed *added, size_t nadded)
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
