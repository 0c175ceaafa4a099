/*
 * shard_format.h - the on-disk layout of a KVX shard file, private to the
 * shard writer, reader and conversion code (not API).
 *
 * The layout is DESIGN.md "Format decisions": a 64-byte header, the
 * coordinate table at 0x40 and the optional hash, lineage, digest, scale, key,
 * sequence and tombstone tables right after it (each sized by num_blocks), the spectral bundle at a
 * 64-aligned offset, and the KV pages from kv_data_offset (a multiple of
 * 4096) on, each page at a multiple of 4096. Writer and reader compute the
 * table positions with the same function (kvx_shard_layout_for), so the two
 * can never disagree about where a table lies.
 */
#ifndef KVX_SHARD_FORMAT_H
#define KVX_SHARD_FORMAT_H

#include "common/internal.h"

#include <stdint.h>

#define KVX_MAGIC "RADX-KVX"
#define KVX_HEADER_BYTES 64u
#define KVX_ENTRY_BYTES 24u
#define KVX_PAGE_ALIGN 4096u
/* kv_data_offset of a writer whose full-block page is >= KVX_LARGE_PAGE. */
#define KVX_LARGE_PAGE (256u << 10)
#define KVX_LARGE_ALIGN (1u << 20)
#define KVX_SECTION_ALIGN 64u
#define KVX_FLAGS_KNOWN                                                                               \
    (KVX_FLAG_HASHES | KVX_FLAG_LINEAGE | KVX_FLAG_SCALES | KVX_FLAG_META_CRC | KVX_FLAG_DIGEST | KVX_FLAG_KEYS | \
     KVX_FLAG_SEQ | KVX_FLAG_TOMB)
/* The largest block_tokens a shard may declare (writer and reader): a
 * lineage record is 8 + 4*B bytes, so B sizes a table; 2^20 is 16 times
 * the store's own limit (65535) and far above any model's block size. */
#define KVX_MAX_BLOCK_TOKENS (1u << 20)
/* What a header may make its reader read and copy at open (the tables and
 * the spectral bundle): at most KVX_HELD_FACTOR times the bytes of data
 * the file holds, plus KVX_HELD_SLACK (BOUND-7; the envelope's bound,
 * BOUND-6, has the same shape). */
#define KVX_HELD_FACTOR 64u
#define KVX_HELD_SLACK ((uint64_t)1 << 20)
/* Tombstone table values. */
#define KVX_TOMB_PAGE 0u
#define KVX_TOMB_DELETE 1u

/* Header field offsets. */
enum {
    KVX_H_MAGIC = 0,
    KVX_H_VERSION = 8,
    KVX_H_LAYERS = 10,
    KVX_H_HEADS = 12,
    KVX_H_HEAD_DIM = 14,
    KVX_H_NUM_BLOCKS = 16,
    KVX_H_BLOCK_TOKENS = 20,
    KVX_H_MODEL_SIG = 24,
    KVX_H_QUANT = 32,
    KVX_H_SPECTRAL_DIM = 36,
    KVX_H_SPECTRAL_OFF = 40,
    KVX_H_KV_OFF = 48,
    KVX_H_FLAGS = 56,
    KVX_H_META_CRC = 60,
};

/* Coordinate entry field offsets (the spec's KVXCoordinateEntry). */
enum {
    KVX_E_COORD = 0,
    KVX_E_TOKENS = 4,
    KVX_E_OFFSET = 8,
    KVX_E_BYTES = 16,
    KVX_E_CRC = 20,
};

/* Spectral bundle sub-header. */
#define KVX_SPECTRAL_HEADER_BYTES 32u
#define KVX_SPECTRAL_MAX_CARTRIDGES 32u
enum {
    KVX_S_COUNT = 0,
    KVX_S_FIRST_LAYER = 4,
    KVX_S_LAYERS = 8,
    KVX_S_DIM = 12,
    KVX_S_RANK = 16,
    KVX_S_CRC = 20,
    KVX_S_RESERVED = 24,
};

typedef struct kvx_shard_header {
    uint16_t format_version;
    uint16_t num_layers, kv_heads, head_dim;
    uint32_t num_blocks;
    uint32_t block_tokens;
    uint64_t model_signature;
    uint32_t quant;
    uint32_t spectral_dim;
    uint64_t spectral_offset;
    uint64_t kv_data_offset;
    uint32_t flags;
    uint32_t meta_crc32c;
} kvx_shard_header;

static inline void kvx_header_encode(uint8_t out[KVX_HEADER_BYTES], const kvx_shard_header *h)
{
    memset(out, 0, KVX_HEADER_BYTES);
    memcpy(out + KVX_H_MAGIC, KVX_MAGIC, 8);
    kvx_store16(out + KVX_H_VERSION, h->format_version);
    kvx_store16(out + KVX_H_LAYERS, h->num_layers);
    kvx_store16(out + KVX_H_HEADS, h->kv_heads);
    kvx_store16(out + KVX_H_HEAD_DIM, h->head_dim);
    kvx_store32(out + KVX_H_NUM_BLOCKS, h->num_blocks);
    kvx_store32(out + KVX_H_BLOCK_TOKENS, h->block_tokens);
    kvx_store64(out + KVX_H_MODEL_SIG, h->model_signature);
    kvx_store32(out + KVX_H_QUANT, h->quant);
    kvx_store32(out + KVX_H_SPECTRAL_DIM, h->spectral_dim);
    kvx_store64(out + KVX_H_SPECTRAL_OFF, h->spectral_offset);
    kvx_store64(out + KVX_H_KV_OFF, h->kv_data_offset);
    kvx_store32(out + KVX_H_FLAGS, h->flags);
    kvx_store32(out + KVX_H_META_CRC, h->meta_crc32c);
}

/* Decodes every field but the magic (the caller checks it). */
static inline void kvx_header_decode(kvx_shard_header *h, const uint8_t in[KVX_HEADER_BYTES])
{
    h->format_version = kvx_load16(in + KVX_H_VERSION);
    h->num_layers = kvx_load16(in + KVX_H_LAYERS);
    h->kv_heads = kvx_load16(in + KVX_H_HEADS);
    h->head_dim = kvx_load16(in + KVX_H_HEAD_DIM);
    h->num_blocks = kvx_load32(in + KVX_H_NUM_BLOCKS);
    h->block_tokens = kvx_load32(in + KVX_H_BLOCK_TOKENS);
    h->model_signature = kvx_load64(in + KVX_H_MODEL_SIG);
    h->quant = kvx_load32(in + KVX_H_QUANT);
    h->spectral_dim = kvx_load32(in + KVX_H_SPECTRAL_DIM);
    h->spectral_offset = kvx_load64(in + KVX_H_SPECTRAL_OFF);
    h->kv_data_offset = kvx_load64(in + KVX_H_KV_OFF);
    h->flags = kvx_load32(in + KVX_H_FLAGS);
    h->meta_crc32c = kvx_load32(in + KVX_H_META_CRC);
}

/* Where the tables of a file with n entries lie. Offsets are absolute;
 * a table that is absent has size 0 and starts where the previous ends. */
typedef struct kvx_shard_layout {
    uint64_t coord_off, coord_bytes;
    uint64_t hash_off, hash_bytes;
    uint64_t lineage_off, lineage_bytes, lineage_rec; /* rec = 8 + 4B */
    uint64_t digest_off, digest_bytes;                /* rec = 32 */
    uint64_t scale_off, scale_bytes, scale_rec;       /* rec = 4 * L*2*Hkv */
    uint64_t key_off, key_bytes;                      /* rec = KVX_KEY_RECORD */
    uint64_t seq_off, seq_bytes;                      /* rec = 8 (u64 LE) */
    uint64_t tomb_off, tomb_bytes;                    /* rec = 1 */
    uint64_t tables_end;
} kvx_shard_layout;

/* Computes the layout for n entries; 0, or KVX_EOVERFLOW when a size does
 * not fit in 64 bits. */
static inline int kvx_shard_layout_for(kvx_shard_layout *out, uint64_t n, uint32_t flags,
                                       uint32_t block_tokens, uint32_t layers, uint32_t heads)
{
    kvx_shard_layout l;
    memset(&l, 0, sizeof l);
    int ok = 1;
    l.coord_off = KVX_HEADER_BYTES;
    ok &= kvx_mul64(&l.coord_bytes, n, KVX_ENTRY_BYTES);
    ok &= kvx_add64(&l.hash_off, l.coord_off, l.coord_bytes);
    if (flags & KVX_FLAG_HASHES) ok &= kvx_mul64(&l.hash_bytes, n, 8);
    ok &= kvx_add64(&l.lineage_off, l.hash_off, l.hash_bytes);
    if (flags & KVX_FLAG_LINEAGE) {
        ok &= kvx_mul64(&l.lineage_rec, block_tokens, 4);
        ok &= kvx_add64(&l.lineage_rec, l.lineage_rec, 8);
        ok &= kvx_mul64(&l.lineage_bytes, n, l.lineage_rec);
    }
    ok &= kvx_add64(&l.digest_off, l.lineage_off, l.lineage_bytes);
    if (flags & KVX_FLAG_DIGEST) ok &= kvx_mul64(&l.digest_bytes, n, KVX_DIGEST_BYTES);
    ok &= kvx_add64(&l.scale_off, l.digest_off, l.digest_bytes);
    if (flags & KVX_FLAG_SCALES) {
        ok &= kvx_mul64(&l.scale_rec, (uint64_t)layers * 2u, heads);
        ok &= kvx_mul64(&l.scale_rec, l.scale_rec, 4);
        ok &= kvx_mul64(&l.scale_bytes, n, l.scale_rec);
    }
    ok &= kvx_add64(&l.key_off, l.scale_off, l.scale_bytes);
    if (flags & KVX_FLAG_KEYS) ok &= kvx_mul64(&l.key_bytes, n, KVX_KEY_RECORD);
    ok &= kvx_add64(&l.seq_off, l.key_off, l.key_bytes);
    if (flags & KVX_FLAG_SEQ) ok &= kvx_mul64(&l.seq_bytes, n, 8);
    ok &= kvx_add64(&l.tomb_off, l.seq_off, l.seq_bytes);
    if (flags & KVX_FLAG_TOMB) l.tomb_bytes = n;
    ok &= kvx_add64(&l.tables_end, l.tomb_off, l.tomb_bytes);
    if (!ok) return KVX_EOVERFLOW;
    *out = l;
    return 0;
}

/* Bounds of what open reads for a header (shard_bounds.c, DESIGN.md rule
 * 5): every table of lay ends within the file (else KVX_ETRUNC naming the
 * table), and the tables plus bundle_bytes of spectral bundle are at most
 * KVX_HELD_FACTOR x the bytes of data fd holds + KVX_HELD_SLACK (else
 * KVX_ETRUNC naming the largest). st is fd's fstat. */
struct stat;
/* The header's own checks (magic aside): versions, geometry, limits. 0
 * or the error naming the field. */
int kvx_shard_header_check(const kvx_shard_header *h);
int kvx_shard_check_tables(int fd, const struct stat *st, const kvx_shard_header *h, const kvx_shard_layout *lay,
                           uint64_t bundle_bytes);

/* Spectral bundle bytes (sub-header + records) for the given counts, or 0
 * on overflow. */
uint64_t kvx_spectral_bundle_bytes(uint32_t n_cartridges, uint32_t n_layers, uint32_t dim,
                                   uint32_t rank);
/* Checks a caller's bundle against a geometry of num_layers layers:
 * 0 or KVX_ESPECTRAL / KVX_EOVERFLOW with a message. */
int kvx_spectral_check_in(const kvx_spectral_in *in, uint32_t num_layers);
/* Encodes a checked bundle into out (kvx_spectral_bundle_bytes bytes),
 * CRC included. */
void kvx_spectral_encode(uint8_t *out, const kvx_spectral_in *in);
/* Validates a stored bundle of len bytes (len already equals the size its
 * sub-header implies) against the file's spectral_dim and num_layers, and
 * decodes it into malloc'd ids and psi arrays the caller frees. */
int kvx_spectral_decode(kvx_spectral *out, uint32_t **out_ids, float **out_psi,
                        const uint8_t *bundle, uint64_t len, uint32_t spectral_dim,
                        uint32_t num_layers);
/* Validates the 32-byte sub-header alone and returns the bundle's full
 * size in *out_len. */
int kvx_spectral_header_check(uint64_t *out_len, const uint8_t hdr[KVX_SPECTRAL_HEADER_BYTES],
                              uint32_t spectral_dim, uint32_t num_layers);

#endif
