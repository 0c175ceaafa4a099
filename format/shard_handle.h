/*
 * format/shard_handle.h - an open shard's handle (struct kvx_shard), for
 * the files of format/ that read through it: shard_reader.c (open, the
 * tables, the checked pages) and shard_read.c (reads into the caller's
 * memory). Not API: everything else sees kvx_shard as opaque.
 */
#ifndef KVX_SHARD_HANDLE_H
#define KVX_SHARD_HANDLE_H

#include "common/internal.h"
#include "format/shard_format.h"

#include <stdatomic.h>
#include <time.h>

typedef struct shard_rec {
    uint32_t coordinate, token_count;
    uint64_t offset; /* absolute */
    uint32_t bytes, crc32;
    int missing; /* the page lies (partly) past the end of the file */
} shard_rec;

struct kvx_shard {
    atomic_int refs;
    kvx_shard_info info;
    char *path;
    int fd;
    const uint8_t *map;
    size_t map_len;
    int guard_slot;
    uint32_t n;
    shard_rec *recs;
    uint64_t *hashes;  /* n, or NULL */
    uint64_t *parents; /* n, or NULL */
    uint32_t *tokens;  /* n * B, or NULL */
    float *scales;     /* n * L*2*Hkv, or NULL */
    uint8_t *digests;  /* n * 32, or NULL */
    uint8_t *keys;     /* n * KVX_KEY_RECORD (u8 len, key, zeros), or NULL */
    uint64_t *seqs;    /* n sequence numbers (each != 0), or NULL */
    uint8_t *tombs;    /* n tombstone bytes (0 page, 1 tombstone), or NULL */
    uint64_t min_seq;  /* the smallest of seqs; 0 without them */
    uint64_t scale_count;
    /* one bit per page: its CRC passed since this handle was opened
     * (DESIGN.md rule 1: a view is checked before it is first handed out) */
    _Atomic uint64_t *checked;
    /* kvx_shard_prefetch: where the last first check's page ended, and the end
     * of the file range last asked for */
    _Atomic uint64_t last_end, ra_end;
    /* shard_whole: when the file's size and mtime were last looked at
     * (ms), and whether it was found shorter than at open or modified
     * since (or a read of the mapping faulted): from then on every page is
     * checked again before it is handed out */
    _Atomic uint64_t size_seen_ms;
    atomic_int cut;
    struct timespec mtime; /* st_mtim at open */
    uint32_t n_missing;
    uint64_t *by_coord; /* (coordinate << 32 | index), sorted */
    /* kvx_shard_page_span: an O_DIRECT descriptor of the same file, opened
     * on first need (-1: not yet; -2: none to be had) */
    atomic_int direct_fd;
    int has_spectral;
    kvx_spectral spectral;
    uint32_t *spectral_ids;
    float *spectral_psi;
    /* entries whose page the store freed in place (kvx_shard_mark_freed):
     * one bit each, made on first need; NULL: none */
    _Atomic(_Atomic uint64_t *) freed;
    int active;    /* kvx_shard_open_active: its writer appends, so a moved
                      mtime is no sign of damage (a shorter file still is) */
    int mem;       /* kvx_shard_mem: pages on the heap, no file */
    void **pages;  /* kvx_shard_mem: n pages, each malloc'd */
    /* kvx_shard_on_free: called once the last reference is gone */
    void (*on_free)(void *ctx);
    void *on_free_ctx;
};

/* shard_reader.c: before a page is read through the mapping, a reader
 * going through the file in order has the next KVX_SHARD_RA bytes asked
 * for (posix_fadvise WILLNEED); last_end notes where r ended. */
void kvx_shard_prefetch(kvx_shard *s, const shard_rec *r);

static inline int is_tomb(const kvx_shard *s, uint32_t index)
{
    return s->tombs && s->tombs[index] == KVX_TOMB_DELETE;
}

/* The page of entry index (a file's mapping, or kvx_shard_mem's heap). */
static inline const uint8_t *page_at(const kvx_shard *s, uint32_t index)
{
    return s->mem ? (const uint8_t *)s->pages[index] : s->map + s->recs[index].offset;
}

#endif
