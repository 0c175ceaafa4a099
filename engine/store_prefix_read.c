/*
 * store_prefix_read.c - kvx_store_prefix_read: the longest verified prefix
 * the store holds, its pages read straight into the caller's memory.
 *
 * Rule (DESIGN.md rule 1): the blocks served are exactly those
 * kvx_store_prefix's local part serves (hash, parent, tokens and prefix
 * digest all equal the prompt's), and the bytes checked are the bytes
 * handed over: every page's CRC-32 runs over the caller's buffer after the
 * read, at every call (format/shard_read.c).
 *
 * Cost: the run's entries are matched first (store_lookup.c, tables in
 * memory, no page touched), so every page the run needs is known before
 * the first is read; then all of them are asked for at once and each is
 * checked as it lands: through the page cache (kvx_shard_pages_copy: the
 * run hinted, each page copied from the mapping as it arrives), or with
 * KVX_PREFIX_READ_DIRECT by O_DIRECT (kvx_shard_pages_read: every read
 * in flight together, neighbours in one file and in the buffer as one
 * read; pages the cache holds copied from it). A
 * page that fails is looked up again alone (every copy of the block tried,
 * read into the same place and checked there); when none is sound the
 * prefix ends before it. The shared tier is not consulted.
 */
#include "store.h"
#include "format/format.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The scales of the block of view v into out (nscales floats): its own,
 * or 1.0 where it has no scale table. */
static void spr_scales(float *out, const kvx_view *v, size_t nscales)
{
    if (v->scales) {
        memcpy(out, v->scales, nscales * sizeof *out);
        return;
    }
    for (size_t j = 0; j < nscales; j++) out[j] = 1.0f;
}

/* Block i of the run (i < n) once more, alone: every location of its
 * hash, its page read into d and checked there. 0, a miss or damage
 * (KVX_ENOTFOUND, KVX_EPAGECRC, KVX_ETRUNC, a read's -errno: the prefix
 * ends), or the call's failure (a damaged catalog record). */
static int spr_again(kvx_store *s, const uint32_t *tokens, size_t i, const kvx_view *prev, uint64_t hash, void *d,
                     size_t cap, float *sc)
{
    uint32_t B = s->g.block_tokens;
    uint8_t(*dg)[KVX_DIGEST_BYTES] = malloc((i + 1) * KVX_DIGEST_BYTES);
    if (!dg) return kvx_fail(-ENOMEM, "kvx_store_prefix_read: out of memory");
    kvx_prefix_digests(dg, tokens, (i + 1) * B, B);
    st_query q = {.hash = hash, .parent = i ? prev->hash : 0, .toks = tokens + i * B, .digest = dg[i]};
    q.dst = d;
    q.dst_cap = cap;
    kvx_cat_snap *snap;
    int rc = kvx_cat_snap_begin(s->cat, &snap);
    if (!rc) {
        kvx_view v;
        memset(&v, 0, sizeof v);
        rc = kvx_st_lookup(s, snap, &q, &v);
        if (rc == 0 && sc) spr_scales(sc, &v, s->nscales); /* the copy served */
        if (rc == 0) kvx_view_release(&v);
        kvx_cat_snap_end(snap);
    }
    free(dg);
    return rc;
}

KVX_API int kvx_store_prefix_read(size_t *out_n, kvx_store *s, const uint32_t *tokens, size_t n_tokens, void *dst,
                                  size_t dst_stride, size_t max_blocks, float *out_scales, uint32_t flags)
{
    static const char fn[] = "kvx_store_prefix_read";
    if (out_n) *out_n = 0;
    if (!out_n) return kvx_fail(KVX_EINVALID, "%s: out_n is NULL", fn);
    if (!s) return kvx_fail(KVX_EINVALID, "%s: store is NULL", fn);
    if (n_tokens && !tokens) return kvx_fail(KVX_EINVALID, "%s: tokens is NULL with n_tokens %zu", fn, n_tokens);
    if (max_blocks && !dst) return kvx_fail(KVX_EINVALID, "%s: dst is NULL with max_blocks %zu", fn, max_blocks);
    if (flags & ~(uint32_t)KVX_PREFIX_READ_DIRECT)
        return kvx_fail(KVX_EINVALID, "%s: flags 0x%x: unknown bits 0x%x", fn, flags,
                        flags & ~(uint32_t)KVX_PREFIX_READ_DIRECT);
    int rc = kvx_st_kind_check(s, 0, fn);
    if (rc) return rc;
    size_t pb = (size_t)s->page_bytes;
    if (max_blocks && dst_stride < pb)
        return kvx_fail(KVX_EINVALID, "%s: dst_stride is %zu bytes, under the store's page_bytes %zu", fn, dst_stride,
                        pb);
    if (max_blocks > 1 && dst_stride > (SIZE_MAX - pb) / (max_blocks - 1))
        return kvx_fail(KVX_EOVERFLOW, "%s: max_blocks %zu at dst_stride %zu bytes overflows the address space", fn,
                        max_blocks, dst_stride);
    if (out_scales && max_blocks && s->nscales) {
        uintptr_t d0 = (uintptr_t)dst, d1 = d0 + (max_blocks - 1) * dst_stride + pb, s0 = (uintptr_t)out_scales;
        uintptr_t s1 = s0 + max_blocks * s->nscales * sizeof(float);
        if (s0 < d1 && d0 < s1) return kvx_fail(KVX_EINVALID, "%s: out_scales overlaps dst", fn);
    }
    size_t want = n_tokens / s->g.block_tokens < max_blocks ? n_tokens / s->g.block_tokens : max_blocks;
    if (want == 0) {
        kvx_st_note(s, NULL, 0, n_tokens / s->g.block_tokens, 1);
        kvx_clear_error();
        return 0;
    }
    kvx_view *v = calloc(want, sizeof *v);
    kvx_shard **sh = malloc(want * sizeof *sh);
    uint32_t *idx = malloc(want * sizeof *idx);
    void **d = malloc(want * sizeof *d);
    size_t *cap = malloc(want * sizeof *cap), *len = malloc(want * sizeof *len), n = 0;
    int *st = malloc(want * sizeof *st);
    if (!v || !sh || !idx || !d || !cap || !len || !st) {
        rc = kvx_fail(-ENOMEM, "%s: out of memory", fn);
        goto out;
    }
    /* 1. the run's entries, no page read */
    if ((rc = kvx_st_prefix_entries(v, &n, s, tokens, n_tokens, want, fn))) goto out;
    /* 2. every page of the run at once, each checked where it landed */
    for (size_t i = 0; i < n; i++) {
        sh[i] = v[i].shard;
        idx[i] = v[i].entry;
        d[i] = (uint8_t *)dst + i * dst_stride;
        cap[i] = pb;
    }
    if (flags & KVX_PREFIX_READ_DIRECT)
        kvx_shard_pages_read(sh, idx, n, d, cap, st, len);
    else
        kvx_shard_pages_copy(sh, idx, n, d, cap, st, len);
    /* 3. in order: a page that failed is looked up again alone (another
     * copy may be sound); the prefix ends at the first that stays unserved */
    int damage = 0;
    size_t served = 0;
    for (; served < n; served++) {
        size_t i = served;
        float *sc = out_scales ? out_scales + i * s->nscales : NULL;
        if (st[i] == 0 && len[i] == pb) {
            if (sc) spr_scales(sc, &v[i], s->nscales);
            continue;
        }
        int r = spr_again(s, tokens, i, i ? &v[i - 1] : NULL, v[i].hash, d[i], pb, sc);
        if (r == 0) continue;
        if (!kvx_st_damage(1, r) && r != KVX_ENOTFOUND) {
            rc = r; /* the call failed (a damaged catalog record, no memory) */
            goto out;
        }
        damage = r != KVX_ENOTFOUND;
        break;
    }
    *out_n = served;
    kvx_st_note(s, v, served, n_tokens / s->g.block_tokens - served, 1);
    /* a plain miss leaves no message; damage keeps the block's */
    if (!damage) kvx_clear_error();
out:
    if (v) kvx_views_release(v, n);
    free(v);
    free(sh);
    free(idx);
    free(d);
    free(cap);
    free(len);
    free(st);
    return rc;
}
