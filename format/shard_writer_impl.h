/*
 * format/shard_writer_impl.h - the shard writer's state, shared by the
 * writer of sealed files (shard_writer.c) and of active files
 * (shard_append.c, which calls into shard_writer.c, never the reverse).
 * Not API.
 */
#ifndef KVX_SHARD_WRITER_IMPL_H
#define KVX_SHARD_WRITER_IMPL_H

#include "shard_format.h"
#include "format.h"

#define WRITER_SEEN_BYTES ((size_t)1 << 21) /* the seen bitmap: 2^24 bits */

struct kvx_shard_writer {
    kvx_geometry g;
    uint8_t shard_id;
    uint32_t max_entries, flags;
    char *path, *tmp_path;
    int fd;
    uint32_t n, cap;        /* entries added, entries allocated in the tables */
    uint8_t *coords;        /* cap * 24 */
    uint64_t *hashes;       /* cap */
    uint8_t *lineage;       /* cap * (8 + 4B) */
    uint8_t *digests;       /* cap * 32 */
    float *scales;          /* cap * L*2*Hkv */
    uint8_t *keys;          /* cap * KVX_KEY_RECORD */
    uint64_t *seqs;         /* cap: sequence numbers (KVX_FLAG_SEQ), 0 = not yet set */
    uint32_t seq_from;      /* every entry below it has its sequence number */
    uint8_t *tombs;         /* cap: KVX_TOMB_PAGE / KVX_TOMB_DELETE (KVX_FLAG_TOMB) */
    uint64_t scale_count;   /* L*2*Hkv */
    uint64_t lineage_rec;
    uint8_t *spectral;      /* encoded bundle, or NULL */
    uint64_t spectral_len;
    uint64_t spectral_offset, kv_data_offset;
    uint64_t kv_end;        /* end of the last page, relative to kv_data_offset */
    uint64_t wb_from;       /* absolute: the pages before it were handed to writeback */
    uint8_t *seen;          /* bitmap of the 2^24 in-shard coordinates (WRITER_SEEN_BYTES, mmap) */
    int no_replace;         /* seal with RENAME_NOREPLACE (store writers) */
    int unnamed;            /* fd is an O_TMPFILE: linked under a name at seal */
    /* an active file (kvx_shard_writer_create_active): path is the file
     * itself, never removed by the writer; entries below appended are in
     * its journal's records */
    int active, broken;
    kvx_active_params ap;
    uint32_t appended;
    uint64_t jpos, jend; /* absolute: the next record, the journal's end */
    uint32_t chain;      /* the last record's CRC */
    uint64_t last_seq;
};

/* A writer of opts for path, its file not yet opened. */
int kvx_sw_new(kvx_shard_writer **out, const char *path, const kvx_shard_writer_options *opts);
void kvx_sw_free(kvx_shard_writer *w);
/* Closes and removes the temporary file (an active file stays), then frees w. */
void kvx_sw_discard(kvx_shard_writer *w);
/* Grows the in-memory tables to hold at least need entries. */
int kvx_sw_grow(kvx_shard_writer *w, uint32_t need);
/* Header and the tables for the n entries added, contiguous from offset
 * 0, with the meta CRC filled in (malloc'd). */
int kvx_sw_build_head(kvx_shard_writer *w, uint8_t **out, size_t *out_len);

#endif
