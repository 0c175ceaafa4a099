/*
 * shim.c - see shim.h: one C call per Go call, the error message captured
 * on the failing thread, and C-side collectors instead of callbacks.
 */
#include "shim.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static gokvx_rc gokvx_done(int rc, uint64_t n)
{
    gokvx_rc r;
    r.rc = rc;
    r.n = n;
    r.msg = NULL;
    r.note = 0;
    if (rc) {
        const char *m = kvx_last_error();
        r.msg = strdup(m && *m ? m : kvx_strerror(rc));
    }
    return r;
}

gokvx_rc gokvx_store_create(kvx_store **out, const char *dir, const kvx_store_options *opts)
{
    return gokvx_done(kvx_store_create(out, dir, opts), 0);
}

gokvx_rc gokvx_store_open(kvx_store **out, const char *dir, const kvx_geometry *expect, uint32_t flags)
{
    return gokvx_done(kvx_store_open(out, dir, expect, flags), 0);
}

gokvx_rc gokvx_store_open_options(kvx_store **out, const char *dir, const kvx_store_options *opts)
{
    return gokvx_done(kvx_store_open_options(out, dir, opts), 0);
}

gokvx_rc gokvx_store_put(kvx_store *s, const uint32_t *tokens, size_t n_tokens, const void *pages,
                         size_t n_pages, const float *scales)
{
    size_t added = 0;
    int rc = kvx_store_put(s, tokens, n_tokens, pages, n_pages, scales, &added);
    return gokvx_done(rc, added);
}

gokvx_rc gokvx_store_flush(kvx_store *s) { return gokvx_done(kvx_store_flush(s), 0); }

gokvx_rc gokvx_batch_create(kvx_store_batch **out, kvx_store *s)
{
    return gokvx_done(kvx_store_batch_create(out, s), 0);
}

gokvx_rc gokvx_batch_put(kvx_store_batch *b, const uint32_t *tokens, size_t n_tokens, const void *pages,
                         size_t n_pages, const float *scales)
{
    size_t added = 0;
    int rc = kvx_store_batch_put(b, tokens, n_tokens, pages, n_pages, scales, &added);
    return gokvx_done(rc, added);
}

gokvx_rc gokvx_batch_put_envelope(kvx_store_batch *b, const void *env, size_t len, const uint32_t *tokens,
                                  size_t n_tokens)
{
    size_t added = 0;
    int rc = kvx_store_batch_put_envelope(b, env, len, tokens, n_tokens, &added);
    return gokvx_done(rc, added);
}

gokvx_rc gokvx_batch_flush(kvx_store_batch *b) { return gokvx_done(kvx_store_batch_flush(b), 0); }
gokvx_rc gokvx_store_gc(kvx_store *s) { return gokvx_done(kvx_store_gc(s), 0); }
gokvx_rc gokvx_store_reindex(kvx_store *s) { return gokvx_done(kvx_store_reindex(s), 0); }

gokvx_rc gokvx_store_get(kvx_view *out, kvx_store *s, uint32_t coordinate)
{
    return gokvx_done(kvx_store_get(out, s, coordinate), 0);
}

gokvx_rc gokvx_store_get_hash(kvx_view *out, kvx_store *s, uint64_t hash)
{
    return gokvx_done(kvx_store_get_hash(out, s, hash), 0);
}

gokvx_rc gokvx_store_get_hashes(kvx_view *out, int *status, kvx_store *s, const uint64_t *hashes,
                                size_t n)
{
    return gokvx_done(kvx_store_get_hashes(out, status, s, hashes, n), 0);
}

gokvx_rc gokvx_store_prefix(kvx_view *out, kvx_store *s, const uint32_t *tokens, size_t n_tokens,
                            size_t max_views)
{
    size_t n = 0;
    int rc = kvx_store_prefix(out, &n, s, tokens, n_tokens, max_views);
    gokvx_rc r = gokvx_done(rc, n);
    const char *m = rc ? NULL : kvx_last_error();
    if (m && *m) {
        /* The prefix ended at a damaged block (kvx_store_prefix returns 0
         * and leaves only the message, which names the block and says
         * which damage it is: store.c st_try_loc). */
        r.note = strstr(m, "page missing") ? KVX_ETRUNC : strstr(m, "page CRC") ? KVX_EPAGECRC : KVX_ECORRUPT;
        r.msg = strdup(m);
    }
    return r;
}

gokvx_rc gokvx_store_get_block(kvx_view *out, kvx_store *s, const uint32_t *tokens, size_t n_tokens)
{
    return gokvx_done(kvx_store_get_block(out, s, tokens, n_tokens), 0);
}

gokvx_rc gokvx_store_put_envelope(kvx_store *s, const void *env, size_t len, const uint32_t *tokens,
                                  size_t n_tokens)
{
    size_t added = 0;
    int rc = kvx_store_put_envelope(s, env, len, tokens, n_tokens, &added);
    return gokvx_done(rc, added);
}

/* The shape only: another model's KV of this shape is the library's
 * KVX_EMODEL (ErrModel), which names both signatures. */
static int same_geometry(const kvx_geometry *a, const kvx_geometry *b)
{
    return a->num_layers == b->num_layers && a->kv_heads == b->kv_heads && a->head_dim == b->head_dim &&
           a->block_tokens == b->block_tokens && a->quant == b->quant;
}

gokvx_rc gokvx_views_export(void *dst, size_t cap, kvx_store *s, const kvx_view *views, size_t n,
                            uint16_t version)
{
    kvx_geometry g;
    int rc = kvx_store_get_geometry(&g, s);
    if (rc) return gokvx_done(rc, 0);
    for (size_t i = 0; i < n; i++) {
        if (views[i].shard && !same_geometry(&kvx_shard_get_info(views[i].shard)->geometry, &g)) {
            char m[160];
            snprintf(m, sizeof m, "export: view %zu (coordinate 0x%08x) comes from a store of another geometry", i,
                     views[i].coordinate);
            gokvx_rc r = {KVX_ESHAPE, 0, strdup(m), 0};
            return r;
        }
    }
    void *buf = NULL;
    size_t len = 0;
    rc = kvx_views_export(&buf, &len, s, views, n, version);
    if (rc) return gokvx_done(rc, 0);
    if (len != cap) {
        kvx_free(buf);
        char m[160];
        snprintf(m, sizeof m, "export: the envelope is %zu bytes, the binding expected %zu", len, cap);
        gokvx_rc r = {KVX_ECAPACITY, 0, strdup(m), 0};
        return r;
    }
    memcpy(dst, buf, len);
    kvx_free(buf);
    return gokvx_done(0, len);
}

gokvx_rc gokvx_envelope_parse(gokvx_envelope_info *out, const void *buf, size_t len, const kvx_geometry *expect)
{
    kvx_envelope e;
    int rc = kvx_envelope_parse(&e, buf, len, expect);
    if (rc) return gokvx_done(rc, 0);
    out->version = e.version;
    out->dtype = e.dtype;
    out->n_blocks = e.n_blocks;
    out->geometry = e.geometry;
    out->payload_bytes = e.payload_bytes;
    return gokvx_done(0, 0);
}

gokvx_rc gokvx_store_stat(kvx_store_stats *out, kvx_store *s)
{
    return gokvx_done(kvx_store_stat(out, s), 0);
}

/* A growable array of problems, filled by the library's report callbacks. */
typedef struct bads {
    gokvx_bad *v;
    size_t n, cap;
    int oom;
} bads;

static void bads_push(bads *b, uint32_t index, int code, const char *what)
{
    if (b->oom) return;
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 16;
        gokvx_bad *v = realloc(b->v, cap * sizeof *v);
        if (!v) {
            b->oom = 1;
            return;
        }
        b->v = v;
        b->cap = cap;
    }
    gokvx_bad *x = &b->v[b->n++];
    x->index = index;
    x->code = code;
    x->what = what ? strdup(what) : NULL;
}

static void store_report(void *ctx, const char *what, int code) { bads_push(ctx, 0, code, what); }
static void shard_report(void *ctx, uint32_t index, int code) { bads_push(ctx, index, code, NULL); }

gokvx_rc gokvx_store_verify(kvx_store *s, gokvx_bad **out_bad)
{
    bads b = {0};
    uint64_t nbad = 0;
    int rc = kvx_store_verify(s, &nbad, store_report, &b);
    gokvx_rc r = gokvx_done(rc, b.n);
    *out_bad = b.v;
    (void)nbad;
    return r;
}

gokvx_rc gokvx_store_shards(kvx_shard ***out, kvx_store *s)
{
    size_t n = 0;
    int rc = kvx_store_shards(out, &n, s);
    return gokvx_done(rc, n);
}

gokvx_rc gokvx_shard_open(kvx_shard **out, const char *path, unsigned flags)
{
    return gokvx_done(kvx_shard_open(out, path, flags), 0);
}

gokvx_rc gokvx_shard_entries(kvx_entry *out, const kvx_shard *s, uint32_t first, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        int rc = kvx_shard_entry(&out[i], s, first + i);
        if (rc) return gokvx_done(rc, i);
    }
    return gokvx_done(0, n);
}

gokvx_rc gokvx_shard_find(const kvx_shard *s, uint32_t coordinate)
{
    uint32_t idx = 0;
    int rc = kvx_shard_find(&idx, s, coordinate);
    return gokvx_done(rc, idx);
}

gokvx_rc gokvx_shard_page(const void **out, const kvx_shard *s, uint32_t index, int verify)
{
    return gokvx_done(kvx_shard_page(out, s, index, verify), 0);
}

gokvx_rc gokvx_shard_verify(const kvx_shard *s, gokvx_bad **out_bad)
{
    bads b = {0};
    uint32_t nbad = 0;
    int rc = kvx_shard_verify(s, &nbad, shard_report, &b);
    gokvx_rc r = gokvx_done(rc, b.n);
    *out_bad = b.v;
    return r;
}

void gokvx_bads_free(gokvx_bad *b, size_t n)
{
    if (!b) return;
    for (size_t i = 0; i < n; i++) free(b[i].what);
    free(b);
}

void gokvx_shards_free(kvx_shard **a, size_t n)
{
    if (!a) return;
    for (size_t i = 0; i < n; i++) kvx_shard_close(a[i]);
    kvx_free(a);
}

gokvx_rc gokvx_pool_create(kvx_pool **out, const kvx_pool_options *opts)
{
    return gokvx_done(kvx_pool_create(out, opts), 0);
}

gokvx_rc gokvx_pool_info(kvx_pool_info *out, kvx_pool *p) { return gokvx_done(kvx_pool_get_info(out, p), 0); }

gokvx_rc gokvx_fetch_create(kvx_fetch **out, kvx_pool *p, const kvx_fetch_options *opts)
{
    return gokvx_done(kvx_fetch_create(out, p, opts), 0);
}

gokvx_rc gokvx_fetch_submit(kvx_fetch *f, const kvx_fetch_req *reqs, size_t n)
{
    return gokvx_done(kvx_fetch_submit(f, reqs, n), 0);
}

gokvx_rc gokvx_fetch_wait(kvx_fetch *f, kvx_fetch_result *out, size_t n, int timeout_ms)
{
    int rc = kvx_fetch_wait(f, out, n, timeout_ms);
    if (rc == -ETIMEDOUT) return (gokvx_rc){rc, 0, NULL, 0}; /* not a failure: poll again */
    return gokvx_done(rc, 0);
}

gokvx_rc gokvx_gpu_count(void)
{
    int n = 0;
    int rc = kvx_gpu_count(&n);
    return gokvx_done(rc, rc ? 0 : (uint64_t)n);
}

gokvx_rc gokvx_gpu_create(kvx_gpu **out, const kvx_gpu_options *opts)
{
    return gokvx_done(kvx_gpu_create(out, opts), 0);
}

gokvx_rc gokvx_gpu_copy_back(void *dst, kvx_gpu *g, uint64_t dev, uint64_t bytes)
{
    return gokvx_done(kvx_gpu_copy_back(dst, g, dev, bytes), 0);
}

gokvx_rc gokvx_warmup_sink_bytes(kvx_shard *const *shards, size_t n)
{
    uint64_t b = 0;
    int rc = kvx_warmup_sink_bytes(&b, shards, n);
    return gokvx_done(rc, b);
}

gokvx_rc gokvx_warmup_start(kvx_warmup **out, kvx_shard *const *shards, size_t n,
                            const kvx_warmup_options *opts)
{
    return gokvx_done(kvx_warmup_start(out, shards, n, opts), 0);
}

gokvx_rc gokvx_warmup_wait(kvx_warmup_report *out, kvx_warmup *w, int timeout_ms)
{
    int rc = kvx_warmup_wait(out, w, timeout_ms);
    if (rc == -ETIMEDOUT) return (gokvx_rc){rc, 0, NULL, 0};
    return gokvx_done(rc, 0);
}

gokvx_rc gokvx_warmup_collect(kvx_shard ***out, const char *const *paths, size_t n)
{
    size_t got = 0;
    int rc = kvx_warmup_collect(out, &got, paths, n);
    return gokvx_done(rc, got);
}

gokvx_rc gokvx_warmup_device_pages(const uint64_t **out, kvx_warmup *w)
{
    size_t n = 0;
    int rc = kvx_warmup_device_pages(out, &n, w);
    return gokvx_done(rc, n);
}

void *gokvx_alloc_aligned(uint64_t bytes)
{
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    if (posix_memalign(&p, 4096, (size_t)bytes)) return NULL;
    memset(p, 0, (size_t)bytes);
    return p;
}

double gokvx_bench_prefix_c(kvx_store *s, const uint32_t *tokens, size_t nseq, size_t ntok, size_t nblk, kvx_view *views)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (size_t q = 0; q < nseq; q++) {
        size_t n = 0;
        kvx_store_prefix(views, &n, s, tokens + q * ntok, ntok, nblk);
        kvx_views_release(views, n);
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
}

kvx_view *gokvx_views_alloc(size_t n) { return malloc((n ? n : 1) * sizeof(kvx_view)); }

void gokvx_views_free(kvx_view *v, size_t n)
{
    kvx_views_release(v, n);
    free(v);
}
