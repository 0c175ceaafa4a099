/*
 * shim.h - the C side of the Go binding (compiled by cgo from shim.c).
 *
 * Why a shim: kvx_last_error() is thread-local, and a goroutine may move to
 * another OS thread between two cgo calls, so the message must be captured
 * in the same C call that failed. Every shim returns a gokvx_rc by value
 * (no Go pointer needed for the outputs, so nothing escapes to the heap on
 * the hot path) with the code, one integer result, and on failure a
 * malloc'd copy of the message that Go frees. The collectors (verify
 * reports, entry tables) gather in C what the library reports through C
 * callbacks, so there is never a C -> Go callback.
 */
#ifndef GOKVX_SHIM_H
#define GOKVX_SHIM_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>

#include "kvx.h"

typedef struct gokvx_rc {
    int rc;
    uint64_t n;  /* the call's count output, when it has one */
    char *msg;   /* malloc'd on failure (free with free); NULL on success,
                    except a note (below) */
    int note;    /* a call that succeeded but left a note (prefix: the code of
                    the damage that ended it, msg its message); 0 otherwise */
} gokvx_rc;

/* The pointer-free header of a parsed envelope (gokvx_envelope_parse). */
typedef struct gokvx_envelope_info {
    uint16_t version, dtype;
    uint32_t n_blocks;
    kvx_geometry geometry;
    uint64_t payload_bytes;
} gokvx_envelope_info;

typedef struct gokvx_bad {
    uint32_t index; /* shard verify: entry index */
    int code;
    char *what;     /* store verify: malloc'd description; NULL for shards */
} gokvx_bad;

gokvx_rc gokvx_store_create(kvx_store **out, const char *dir, const kvx_store_options *opts);
gokvx_rc gokvx_store_open(kvx_store **out, const char *dir, const kvx_geometry *expect, uint32_t flags);
gokvx_rc gokvx_store_open_options(kvx_store **out, const char *dir, const kvx_store_options *opts);
gokvx_rc gokvx_store_put(kvx_store *s, const uint32_t *tokens, size_t n_tokens, const void *pages,
                         size_t n_pages, const float *scales);
gokvx_rc gokvx_store_flush(kvx_store *s);
gokvx_rc gokvx_batch_create(kvx_store_batch **out, kvx_store *s);
gokvx_rc gokvx_batch_put(kvx_store_batch *b, const uint32_t *tokens, size_t n_tokens, const void *pages,
                         size_t n_pages, const float *scales);
gokvx_rc gokvx_batch_put_envelope(kvx_store_batch *b, const void *env, size_t len, const uint32_t *tokens,
                                  size_t n_tokens);
gokvx_rc gokvx_batch_flush(kvx_store_batch *b);
gokvx_rc gokvx_store_gc(kvx_store *s);
gokvx_rc gokvx_store_reindex(kvx_store *s);
gokvx_rc gokvx_store_get(kvx_view *out, kvx_store *s, uint32_t coordinate);
gokvx_rc gokvx_store_get_hash(kvx_view *out, kvx_store *s, uint64_t hash);
gokvx_rc gokvx_store_get_hashes(kvx_view *out, int *status, kvx_store *s, const uint64_t *hashes,
                                size_t n);
/* n: the blocks served. rc is 0 whatever n; when damage ended the prefix,
 * note is its code (KVX_EPAGECRC, KVX_ETRUNC) and msg the library's note
 * naming the block. */
gokvx_rc gokvx_store_prefix(kvx_view *out, kvx_store *s, const uint32_t *tokens, size_t n_tokens,
                            size_t max_views);
gokvx_rc gokvx_store_get_block(kvx_view *out, kvx_store *s, const uint32_t *tokens, size_t n_tokens);
gokvx_rc gokvx_store_put_envelope(kvx_store *s, const void *env, size_t len, const uint32_t *tokens,
                                  size_t n_tokens);
/* kvx_views_export into dst (cap bytes, the envelope's exact size, computed
 * by the caller), the library's buffer freed in the same call; n: the
 * bytes written. Every view must come from a store of s's geometry
 * (KVX_ESHAPE otherwise: its pages would be read at the wrong size). */
gokvx_rc gokvx_views_export(void *dst, size_t cap, kvx_store *s, const kvx_view *views, size_t n,
                            uint16_t version);
gokvx_rc gokvx_envelope_parse(gokvx_envelope_info *out, const void *buf, size_t len, const kvx_geometry *expect);
gokvx_rc gokvx_store_stat(kvx_store_stats *out, kvx_store *s);
/* *out_bad: malloc'd array of n (the rc's n) problems; free with gokvx_bads_free. */
gokvx_rc gokvx_store_verify(kvx_store *s, gokvx_bad **out_bad);
gokvx_rc gokvx_store_shards(kvx_shard ***out, kvx_store *s);

gokvx_rc gokvx_shard_open(kvx_shard **out, const char *path, unsigned flags);
/* Entries first..first+n into out (one crossing for a whole table). */
gokvx_rc gokvx_shard_entries(kvx_entry *out, const kvx_shard *s, uint32_t first, uint32_t n);
gokvx_rc gokvx_shard_find(const kvx_shard *s, uint32_t coordinate);
gokvx_rc gokvx_shard_page(const void **out, const kvx_shard *s, uint32_t index, int verify);
gokvx_rc gokvx_shard_verify(const kvx_shard *s, gokvx_bad **out_bad);
void gokvx_bads_free(gokvx_bad *b, size_t n);
/* Drops each reference and frees the array (kvx_store_shards, collect). */
void gokvx_shards_free(kvx_shard **a, size_t n);

gokvx_rc gokvx_pool_create(kvx_pool **out, const kvx_pool_options *opts);
gokvx_rc gokvx_pool_info(kvx_pool_info *out, kvx_pool *p);
gokvx_rc gokvx_fetch_create(kvx_fetch **out, kvx_pool *p, const kvx_fetch_options *opts);
gokvx_rc gokvx_fetch_submit(kvx_fetch *f, const kvx_fetch_req *reqs, size_t n);
gokvx_rc gokvx_fetch_wait(kvx_fetch *f, kvx_fetch_result *out, size_t n, int timeout_ms);

gokvx_rc gokvx_gpu_count(void);
gokvx_rc gokvx_gpu_create(kvx_gpu **out, const kvx_gpu_options *opts);
gokvx_rc gokvx_gpu_copy_back(void *dst, kvx_gpu *g, uint64_t dev, uint64_t bytes);

gokvx_rc gokvx_warmup_sink_bytes(kvx_shard *const *shards, size_t n);
gokvx_rc gokvx_warmup_start(kvx_warmup **out, kvx_shard *const *shards, size_t n,
                            const kvx_warmup_options *opts);
gokvx_rc gokvx_warmup_wait(kvx_warmup_report *out, kvx_warmup *w, int timeout_ms);
gokvx_rc gokvx_warmup_collect(kvx_shard ***out, const char *const *paths, size_t n);
gokvx_rc gokvx_warmup_device_pages(const uint64_t **out, kvx_warmup *w);

/* C memory for n views (uninitialised), so that cgo's pointer check does
 * not scan them at each call (they hold C pointers); gokvx_views_free
 * releases n views and frees the array in one crossing. */
kvx_view *gokvx_views_alloc(size_t n);
void gokvx_views_free(kvx_view *v, size_t n);

/* 4096-aligned, zeroed C memory for host sinks (free with free). */
void *gokvx_alloc_aligned(uint64_t bytes);

/* The C reference of the Go benchmark (bench_c.go): nseq prefix lookups
 * of ntok tokens (up to nblk blocks) with their releases, all in C; the
 * seconds taken. views has room for nblk. */
double gokvx_bench_prefix_c(kvx_store *s, const uint32_t *tokens, size_t nseq, size_t ntok, size_t nblk,
                            kvx_view *views);

#endif
