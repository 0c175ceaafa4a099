/*
 * shard_reader.c - opens a sealed KVX shard: validates every rule of
 * DESIGN.md with a distinct code, then serves entries, lookups by
 * coordinate and zero-copy pages.
 *
 * Shape: the header, every table and the spectral bundle are read with
 * pread (through the kvx_os seam, as are the open, the fstat and the
 * mapping, so tests can fail each of them) and copied to the heap at
 * open, so after open only page reads touch the mapping. The
 * file is mapped read-only and MAP_SHARED; the mapping is registered with
 * the SIGBUS guard (sigbus.c), so a file truncated after open reads as zero
 * pages that fail their CRC instead of killing the process. The handle is
 * immutable after open except for its atomic reference count, the checked
 * bits, the read-ahead marks and the cut mark (all atomic), so any number
 * of threads may read through it.
 *
 * A page is CRC-checked once per handle; later lookups hand it out
 * unchecked (kvx_shard_page_checked) only while the file is whole: its
 * size and modification time are looked at again at most every
 * KVX_SHARD_SIZE_CHECK_MS, and a read of the mapping that faulted marks it
 * at once. A file cut under an open handle (its tail read as zeros: inside
 * the last page without any fault), or written at all since the open (a
 * write, a truncate, a hole punch all move st_mtim; kvx never writes a
 * sealed shard, and the links and renames that publish one do not move
 * it), then has every page checked again, and the bad ones refused.
 */
#include "shard_format.h"
#include "shard_handle.h"
#include "shard_journal.h"
#include "format.h"
#include "common/os.h"
#include "common/sigbus.h"
#include "common/digest.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void shard_free(kvx_shard *s)
{
    if (!s) return;
    if (s->mem) {
        for (uint32_t i = 0; s->pages && i < s->n; i++) free(s->pages[i]);
        free(s->pages);
    } else if (s->map) {
        kvx_sigbus_unregister(s->guard_slot);
        kvx_os.munmap((void *)s->map, s->map_len);
    }
    if (s->fd >= 0) kvx_os.close(s->fd);
    if (atomic_load(&s->direct_fd) >= 0) kvx_os.close(atomic_load(&s->direct_fd));
    free(s->path);
    free(s->recs);
    free(s->hashes);
    free(s->parents);
    free(s->tokens);
    free(s->scales);
    free(s->digests);
    free(s->keys);
    free(s->seqs);
    free(s->tombs);
    free((void *)s->checked), free((void *)atomic_load(&s->freed));
    free(s->by_coord), free(s->spectral_ids), free(s->spectral_psi);
    if (s->on_free) s->on_free(s->on_free_ctx); /* unmapped: the layer above lets go of what kept it safe */
    free(s);
}

/* pread of exactly len bytes; a short read means the file shrank under us. */
static int read_exact(int fd, void *buf, size_t len, uint64_t off, const char *what)
{
    size_t got = 0;
    int rc = kvx_os_pread_all(fd, buf, len, off, &got);
    if (rc) return kvx_fail(rc, "%s: read at offset %llu failed", what, (unsigned long long)off);
    if (got != len)
        return kvx_fail(KVX_ETRUNC, "%s: file ends %zu bytes into its %zu bytes at offset %llu",
                        what, got, len, (unsigned long long)off);
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Header fields alone: magic, version, quant, dimensions, flags. */
int kvx_shard_header_check(const kvx_shard_header *h)
{
    if (h->format_version != KVX_FORMAT_VERSION)
        return kvx_fail(KVX_EVERSION, "header: format_version 0x%04x (this reader reads 0x%04x)",
                        h->format_version, KVX_FORMAT_VERSION);
    if (!kvx_quant_elem_size(h->quant))
        return kvx_fail(KVX_EQUANT, "header: quant_format %u is not 0 (fp16), 1 (e4m3), 2 (e5m2) or 3 (bf16)",
                        h->quant);
    if (!h->num_layers || !h->kv_heads || !h->head_dim)
        return kvx_fail(KVX_EFORMAT, "header: a dimension is 0 (num_layers %u, kv_heads %u, head_dim %u)",
                        h->num_layers, h->kv_heads, h->head_dim);
    if (h->num_blocks > KVX_MAX_ENTRIES)
        return kvx_fail(KVX_EFORMAT, "header: num_blocks %u exceeds %u", h->num_blocks, KVX_MAX_ENTRIES);
    /* B sizes the lineage table (8 + 4*B bytes an entry): an absurd B is
     * refused here, before any size is computed from it (BOUND-7) */
    if (h->block_tokens > KVX_MAX_BLOCK_TOKENS)
        return kvx_fail(KVX_EFORMAT, "header: block_tokens %u exceeds %u", h->block_tokens, KVX_MAX_BLOCK_TOKENS);
    if (h->flags & ~KVX_FLAGS_KNOWN)
        return kvx_fail(KVX_EFORMAT, "header: unknown flags bits 0x%x", h->flags & ~KVX_FLAGS_KNOWN);
    if ((h->flags & KVX_FLAG_LINEAGE) && !(h->flags & KVX_FLAG_HASHES))
        return kvx_fail(KVX_EFORMAT, "header: flags have a lineage table without a hash table");
    if ((h->flags & KVX_FLAG_DIGEST) && !(h->flags & KVX_FLAG_LINEAGE))
        return kvx_fail(KVX_EFORMAT, "header: flags have a digest table without a lineage table");
    if ((h->flags & KVX_FLAG_HASHES) && !h->block_tokens)
        return kvx_fail(KVX_EFORMAT, "header: flags have a hash table but block_tokens is 0");
    if ((h->flags & KVX_FLAG_SCALES) && !kvx_quant_is_fp8(h->quant))
        return kvx_fail(KVX_EFORMAT, "header: an %s file has a scale table (only FP8 files have one)",
                        h->quant == KVX_QUANT_FP16 ? "FP16" : "BF16");
    if ((h->flags & KVX_FLAG_KEYS) &&
        (h->flags & ~(KVX_FLAG_KEYS | KVX_FLAG_META_CRC | KVX_FLAG_SEQ | KVX_FLAG_TOMB)))
        return kvx_fail(KVX_EFORMAT,
                        "header: a key table mixes with no other table but sequence numbers and tombstones (flags 0x%x)",
                        h->flags);
    if ((h->flags & KVX_FLAG_TOMB) && (h->flags & (KVX_FLAG_KEYS | KVX_FLAG_SEQ)) != (KVX_FLAG_KEYS | KVX_FLAG_SEQ))
        return kvx_fail(KVX_EFORMAT, "header: flags 0x%x have a tombstone table (bit7) without %s", h->flags,
                        !(h->flags & KVX_FLAG_KEYS) && !(h->flags & KVX_FLAG_SEQ) ? "a key table (bit5) and a sequence table (bit6)"
                        : !(h->flags & KVX_FLAG_KEYS)                             ? "a key table (bit5)"
                                                                                  : "a sequence table (bit6)");
    if ((h->flags & KVX_FLAG_KEYS) && h->spectral_offset)
        return kvx_fail(KVX_EFORMAT, "header: a keyed shard has no spectral bundle");
    /* a keyed page is any length up to the one-token page, not a block of
     * B tokens: with B != 0 a reader of blocks (export) would take it for
     * one (found by fuzz/shard_fuzzer.c: regress_keyed_block_tokens) */
    if ((h->flags & KVX_FLAG_KEYS) && h->block_tokens)
        return kvx_fail(KVX_EFORMAT, "header: a keyed shard has block_tokens 0, this one %u", h->block_tokens);
    if ((h->spectral_offset == 0) != (h->spectral_dim == 0))
        return kvx_fail(KVX_ESPECTRAL, "header: spectral_offset %llu and spectral_dim %u disagree",
                        (unsigned long long)h->spectral_offset, h->spectral_dim);
    if (h->kv_data_offset % KVX_PAGE_ALIGN)
        return kvx_fail(KVX_EALIGN, "header: kv_data_offset %llu is not a multiple of 4096",
                        (unsigned long long)h->kv_data_offset);
    if (h->spectral_offset % KVX_SECTION_ALIGN)
        return kvx_fail(KVX_EALIGN, "header: spectral_offset %llu is not 64-aligned",
                        (unsigned long long)h->spectral_offset);
    return 0;
}

/* Decodes and checks the entries against the header; fills s's tables. */
static int load_entries(kvx_shard *s, const kvx_shard_header *h, const kvx_shard_layout *lay,
                        const uint8_t *tables, uint64_t file_size)
{
    const kvx_geometry *g = &s->info.geometry;
    uint32_t n = h->num_blocks, B = h->block_tokens;
    int hashes = (h->flags & KVX_FLAG_HASHES) != 0, lineage = (h->flags & KVX_FLAG_LINEAGE) != 0;
    int scales = (h->flags & KVX_FLAG_SCALES) != 0, digests = (h->flags & KVX_FLAG_DIGEST) != 0;
    int keys = (h->flags & KVX_FLAG_KEYS) != 0, seqs = (h->flags & KVX_FLAG_SEQ) != 0;
    int tombs = (h->flags & KVX_FLAG_TOMB) != 0;
    uint64_t kv_len = file_size - h->kv_data_offset;
    s->recs = calloc(n ? n : 1, sizeof *s->recs);
    s->by_coord = malloc(sizeof(uint64_t) * (n ? n : 1));
    if (hashes || keys) s->hashes = malloc(sizeof(uint64_t) * (n ? n : 1));
    if (keys) s->keys = malloc(lay->key_bytes ? (size_t)lay->key_bytes : 1);
    if (lineage) {
        s->parents = malloc(sizeof(uint64_t) * (n ? n : 1));
        s->tokens = malloc(lay->lineage_bytes ? (size_t)(lay->lineage_bytes - 8ull * n) : 1);
    }
    if (digests) s->digests = malloc(lay->digest_bytes ? (size_t)lay->digest_bytes : 1);
    if (seqs) s->seqs = malloc(sizeof(uint64_t) * (n ? n : 1));
    if (tombs) s->tombs = malloc(n ? n : 1);
    s->checked = calloc((size_t)n / 64 + 1, sizeof(uint64_t));
    if (scales) {
        s->scale_count = lay->scale_rec / 4;
        s->scales = malloc(lay->scale_bytes ? (size_t)lay->scale_bytes : 1);
    }
    if (!s->recs || !s->by_coord || ((hashes || keys) && !s->hashes) || (keys && !s->keys) ||
        (lineage && (!s->parents || !s->tokens)) || (scales && !s->scales) || (digests && !s->digests) ||
        (seqs && !s->seqs) || (tombs && !s->tombs) || !s->checked)
        return kvx_fail(-ENOMEM, "out of memory for the tables of %u entries", n);

    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *e = tables + (lay->coord_off - KVX_HEADER_BYTES) + (size_t)i * KVX_ENTRY_BYTES;
        shard_rec *r = &s->recs[i];
        r->coordinate = kvx_load32(e + KVX_E_COORD);
        r->token_count = kvx_load32(e + KVX_E_TOKENS);
        uint64_t rel = kvx_load64(e + KVX_E_OFFSET);
        r->bytes = kvx_load32(e + KVX_E_BYTES);
        r->crc32 = kvx_load32(e + KVX_E_CRC);
        if (i > 0 && KVX_COORD_SHARD(r->coordinate) != KVX_COORD_SHARD(s->recs[0].coordinate))
            return kvx_fail(KVX_ESHARDID, "entry %u: coordinate 0x%08x has shard %u, entry 0 has %u",
                            i, r->coordinate, KVX_COORD_SHARD(r->coordinate),
                            KVX_COORD_SHARD(s->recs[0].coordinate));
        if (r->token_count == 0)
            return kvx_fail(KVX_ETOKENS, "entry %u: token_count is 0", i);
        if (hashes && r->token_count > B)
            return kvx_fail(KVX_ETOKENS, "entry %u: token_count %u exceeds block_tokens %u", i,
                            r->token_count, B);
        uint64_t want = kvx_page_bytes(g, r->token_count);
        if (!want)
            return kvx_fail(KVX_EOVERFLOW, "entry %u: page size for %u tokens overflows", i,
                            r->token_count);
        if (seqs) {
            s->seqs[i] = kvx_load64(tables + (lay->seq_off - KVX_HEADER_BYTES) + (size_t)i * 8);
            if (s->seqs[i] == 0)
                return kvx_fail(KVX_EFORMAT, "entry %u: sequence number 0 (every committed entry has one >= 1)", i);
            if (i == 0 || s->seqs[i] < s->min_seq) s->min_seq = s->seqs[i];
        }
        int tomb = 0;
        if (tombs) {
            uint8_t t = tables[(lay->tomb_off - KVX_HEADER_BYTES) + i];
            if (t != KVX_TOMB_PAGE && t != KVX_TOMB_DELETE)
                return kvx_fail(KVX_EFORMAT, "entry %u: tombstone byte %u (0 = a page, 1 = a tombstone)", i, t);
            s->tombs[i] = t;
            tomb = t == KVX_TOMB_DELETE;
        }
        if (keys) {
            /* a keyed page: one "token", any length up to the geometry's
             * page; a tombstone: one "token", no page at all */
            if (r->token_count != 1)
                return kvx_fail(KVX_ETOKENS, "entry %u: a keyed %s has token_count %u, not 1", i,
                                tomb ? "tombstone" : "page", r->token_count);
            if (tomb && (rel || r->bytes || r->crc32))
                return kvx_fail(KVX_EPAGE,
                                "entry %u: a tombstone has offset 0, bytes 0 and crc 0, not %llu, %u and 0x%08x", i,
                                (unsigned long long)rel, r->bytes, r->crc32);
            if (!tomb && (r->bytes == 0 || r->bytes > want))
                return kvx_fail(KVX_EPAGE, "entry %u: keyed page of %u bytes, not 1..%llu", i, r->bytes,
                                (unsigned long long)want);
            const uint8_t *kr = tables + (lay->key_off - KVX_HEADER_BYTES) + (size_t)i * KVX_KEY_RECORD;
            if (kr[0] == 0)
                return kvx_fail(KVX_EFORMAT, "entry %u: key length 0 (a key is 1..%u bytes)", i, KVX_KEY_MAX);
            for (uint32_t k = 1u + kr[0]; k < KVX_KEY_RECORD; k++)
                if (kr[k])
                    return kvx_fail(KVX_EFORMAT, "entry %u: key record byte %u past the key's %u bytes is not 0", i, k,
                                    kr[0]);
            memcpy(s->keys + (size_t)i * KVX_KEY_RECORD, kr, KVX_KEY_RECORD);
            s->hashes[i] = kvx_key_hash(kr + 1, kr[0]);
        } else if (want != r->bytes) {
            return kvx_fail(KVX_EPAGE, "entry %u: kv_page_bytes %u, the geometry needs %llu for %u tokens",
                            i, r->bytes, (unsigned long long)want, r->token_count);
        }
        if (rel % KVX_PAGE_ALIGN)
            return kvx_fail(KVX_EALIGN, "entry %u: kv_page_offset %llu is not a multiple of 4096", i,
                            (unsigned long long)rel);
        /* a page (partly) past the end of the file is missing (DESIGN.md,
         * Validation): never served, named by verify; the rest of the file
         * stays usable */
        if (rel > UINT64_MAX - h->kv_data_offset - r->bytes)
            return kvx_fail(KVX_EPAGE, "entry %u: page offset %llu overflows", i, (unsigned long long)rel);
        if (tomb) {
            r->offset = 0; /* no page: never missing, never read */
        } else {
            if (rel > kv_len || r->bytes > kv_len - rel) {
                r->missing = 1;
                s->n_missing++;
            }
            r->offset = h->kv_data_offset + rel;
        }
        s->by_coord[i] = (uint64_t)r->coordinate << 32 | i;

        uint64_t hash = 0;
        if (hashes) {
            hash = kvx_load64(tables + (lay->hash_off - KVX_HEADER_BYTES) + (size_t)i * 8);
            s->hashes[i] = hash;
            if (hash && r->token_count != B)
                return kvx_fail(KVX_EHASH, "entry %u: non-zero hash with token_count %u != block_tokens %u",
                                i, r->token_count, B);
        }
        if (lineage) {
            const uint8_t *lr = tables + (lay->lineage_off - KVX_HEADER_BYTES) + (size_t)i * lay->lineage_rec;
            uint32_t *tok = s->tokens + (size_t)i * B;
            s->parents[i] = kvx_load64(lr);
            for (uint32_t t = 0; t < B; t++) {
                tok[t] = kvx_load32(lr + 8 + (size_t)t * 4);
                if (t >= r->token_count && tok[t] != 0)
                    return kvx_fail(KVX_ELINEAGE, "entry %u: lineage token %u past token_count %u is not 0",
                                    i, t, r->token_count);
            }
            if (hash && kvx_block_hash(s->parents[i], tok, B) != hash)
                return kvx_fail(KVX_ELINEAGE,
                                "entry %u: hash 0x%016llx is not H(parent 0x%016llx, tokens) = 0x%016llx",
                                i, (unsigned long long)hash, (unsigned long long)s->parents[i],
                                (unsigned long long)kvx_block_hash(s->parents[i], tok, B));
        }
        if (digests) {
            uint8_t *d = s->digests + (size_t)i * KVX_DIGEST_BYTES;
            memcpy(d, tables + (lay->digest_off - KVX_HEADER_BYTES) + (size_t)i * KVX_DIGEST_BYTES,
                   KVX_DIGEST_BYTES);
            if (!kvx_digest_is_zero(d)) {
                if (!hash)
                    return kvx_fail(KVX_ELINEAGE, "entry %u: a digest on an entry that is not a full block", i);
                /* block 0's digest is a function of its own tokens */
                uint8_t d0[KVX_DIGEST_BYTES];
                if (s->parents[i] == 0) {
                    kvx_prefix_digest_next(d0, NULL, s->tokens + (size_t)i * B, B);
                    if (memcmp(d0, d, KVX_DIGEST_BYTES) != 0)
                        return kvx_fail(KVX_ELINEAGE, "entry %u: digest of a block with parent 0 is not SHA-256 of its tokens",
                                        i);
                }
            }
        }
    }
    if (scales) {
        memcpy(s->scales, tables + (lay->scale_off - KVX_HEADER_BYTES), (size_t)lay->scale_bytes);
        /* the writer's rule, on every path (DESIGN.md: v2 scales finite and
         * > 0): a file carrying another would export an envelope every
         * reader refuses, or decode to NaN */
        for (uint64_t k = 0; k < (uint64_t)n * s->scale_count; k++)
            if (!isfinite(s->scales[k]) || !(s->scales[k] > 0.0f))
                return kvx_fail(KVX_EFORMAT, "entry %llu: scale %llu is %g (must be finite and > 0)",
                                (unsigned long long)(k / s->scale_count), (unsigned long long)(k % s->scale_count),
                                (double)s->scales[k]);
    }

    qsort(s->by_coord, n, sizeof(uint64_t), cmp_u64);
    for (uint32_t i = 1; i < n; i++)
        if (s->by_coord[i] >> 32 == s->by_coord[i - 1] >> 32)
            return kvx_fail(KVX_EDUPLICATE, "entries %u and %u share coordinate 0x%08x",
                            (uint32_t)s->by_coord[i - 1], (uint32_t)s->by_coord[i],
                            (uint32_t)(s->by_coord[i] >> 32));

    /* Two pages that overlap are no writer's output: refuse them too
     * (tombstones have no page). */
    if (n > 1) {
        uint64_t *by_off = malloc(sizeof(uint64_t) * n);
        if (!by_off) return kvx_fail(-ENOMEM, "out of memory");
        /* offsets are multiples of 4096 below 2^64: offset/4096 fits in 52
         * bits, leaving room for the 17-bit index (n <= 65536) */
        uint32_t np = 0;
        for (uint32_t i = 0; i < n; i++)
            if (!s->tombs || !s->tombs[i]) by_off[np++] = (s->recs[i].offset / KVX_PAGE_ALIGN) << 17 | i;
        qsort(by_off, np, sizeof(uint64_t), cmp_u64);
        for (uint32_t k = 1; k < np; k++) {
            const shard_rec *a = &s->recs[by_off[k - 1] & 0x1FFFF], *b = &s->recs[by_off[k] & 0x1FFFF];
            if (a->offset + a->bytes > b->offset) {
                uint32_t ia = (uint32_t)(by_off[k - 1] & 0x1FFFF), ib = (uint32_t)(by_off[k] & 0x1FFFF);
                free(by_off);
                return kvx_fail(KVX_EOVERLAP, "entries %u and %u: pages overlap", ia, ib);
            }
        }
        free(by_off);
    }
    s->info.shard_id = n ? (uint8_t)KVX_COORD_SHARD(s->recs[0].coordinate) : 0;
    return 0;
}

static int load_spectral(kvx_shard *s, const kvx_shard_header *h, const kvx_shard_layout *lay, const struct stat *st)
{
    uint64_t file_size = (uint64_t)st->st_size;
    uint8_t sub[KVX_SPECTRAL_HEADER_BYTES];
    if (h->spectral_offset + KVX_SPECTRAL_HEADER_BYTES > file_size)
        return kvx_fail(KVX_ETRUNC, "spectral bundle at %llu lies past the end of the file",
                        (unsigned long long)h->spectral_offset);
    int rc = read_exact(s->fd, sub, sizeof sub, h->spectral_offset, "spectral bundle");
    if (rc) return rc;
    uint64_t len, end;
    rc = kvx_spectral_header_check(&len, sub, h->spectral_dim, h->num_layers);
    if (rc) return rc;
    if (!kvx_add64(&end, h->spectral_offset, len))
        return kvx_fail(KVX_EOVERFLOW, "spectral bundle: end offset overflows");
    if (end > h->kv_data_offset)
        return kvx_fail(KVX_EOVERLAP, "spectral bundle [%llu, %llu) overlaps the KV section at %llu",
                        (unsigned long long)h->spectral_offset, (unsigned long long)end,
                        (unsigned long long)h->kv_data_offset);
    if ((rc = kvx_shard_check_tables(s->fd, st, h, lay, len))) return rc;
    uint8_t *buf = malloc((size_t)len);
    if (!buf) return kvx_fail(-ENOMEM, "out of memory for the spectral bundle");
    rc = read_exact(s->fd, buf, (size_t)len, h->spectral_offset, "spectral bundle");
    if (!rc)
        rc = kvx_spectral_decode(&s->spectral, &s->spectral_ids, &s->spectral_psi, buf, len,
                                 h->spectral_dim, h->num_layers);
    free(buf);
    if (!rc) s->has_spectral = 1;
    return rc;
}

static int open_validated(kvx_shard *s, const struct stat *st)
{
    uint64_t file_size = (uint64_t)st->st_size;
    uint8_t hdr[KVX_HEADER_BYTES];
    if (file_size < 8)
        return kvx_fail(KVX_ETRUNC, "file is %llu bytes, shorter than the magic",
                        (unsigned long long)file_size);
    int rc = read_exact(s->fd, hdr, file_size < KVX_HEADER_BYTES ? 8 : KVX_HEADER_BYTES, 0, "header");
    if (rc) return rc;
    if (memcmp(hdr, KVX_MAGIC, 8) != 0) return kvx_fail(KVX_EMAGIC, "magic is not RADX-KVX");
    if (file_size < KVX_HEADER_BYTES)
        return kvx_fail(KVX_ETRUNC, "file is %llu bytes, shorter than the 64-byte header",
                        (unsigned long long)file_size);
    kvx_shard_header h;
    kvx_header_decode(&h, hdr);
    if ((rc = kvx_shard_header_check(&h))) return rc;

    kvx_shard_layout lay;
    if (kvx_shard_layout_for(&lay, h.num_blocks, h.flags, h.block_tokens, h.num_layers, h.kv_heads))
        return kvx_fail(KVX_EOVERFLOW, "table sizes for %u entries overflow", h.num_blocks);
    if (h.spectral_offset && h.spectral_offset < lay.tables_end)
        return kvx_fail(KVX_EOVERLAP, "spectral_offset %llu lies inside the tables (end %llu)",
                        (unsigned long long)h.spectral_offset, (unsigned long long)lay.tables_end);
    if (h.kv_data_offset < lay.tables_end)
        return kvx_fail(KVX_EOVERLAP, "kv_data_offset %llu lies inside the tables (end %llu)",
                        (unsigned long long)h.kv_data_offset, (unsigned long long)lay.tables_end);
    if (h.spectral_offset && h.spectral_offset >= h.kv_data_offset)
        return kvx_fail(KVX_EOVERLAP, "spectral_offset %llu lies inside the KV section at %llu",
                        (unsigned long long)h.spectral_offset, (unsigned long long)h.kv_data_offset);
    /* each table within the file, all of them within what it holds */
    if ((rc = kvx_shard_check_tables(s->fd, st, &h, &lay, 0))) return rc;
    if (h.kv_data_offset > file_size)
        return kvx_fail(KVX_ETRUNC, "kv_data_offset %llu lies past the end of the file (%llu)",
                        (unsigned long long)h.kv_data_offset, (unsigned long long)file_size);

    kvx_geometry *g = &s->info.geometry;
    g->num_layers = h.num_layers;
    g->kv_heads = h.kv_heads;
    g->head_dim = h.head_dim;
    g->block_tokens = h.block_tokens;
    g->quant = h.quant;
    g->model_signature = h.model_signature;
    s->info.format_version = h.format_version;
    s->info.num_blocks = h.num_blocks;
    s->info.spectral_dim = h.spectral_dim;
    s->info.spectral_offset = h.spectral_offset;
    s->info.kv_data_offset = h.kv_data_offset;
    s->info.flags = h.flags;
    s->info.meta_crc32c = h.meta_crc32c;
    s->info.file_size = file_size;
    s->n = h.num_blocks;

    size_t tlen = (size_t)(lay.tables_end - KVX_HEADER_BYTES);
    uint8_t *tables = malloc(tlen ? tlen : 1);
    if (!tables) return kvx_fail(-ENOMEM, "out of memory for %zu bytes of tables", tlen);
    rc = read_exact(s->fd, tables, tlen, KVX_HEADER_BYTES, "tables");
    if (!rc && (h.flags & KVX_FLAG_META_CRC)) {
        uint32_t crc = kvx_crc32c(kvx_crc32c(0, hdr, KVX_H_META_CRC), tables, tlen);
        if (crc != h.meta_crc32c)
            rc = kvx_fail(KVX_EMETACRC, "meta_crc32c 0x%08x, header and tables give 0x%08x",
                          h.meta_crc32c, crc);
    }
    if (!rc) rc = load_entries(s, &h, &lay, tables, file_size);
    free(tables);
    if (rc) return rc;
    if (h.spectral_offset && (rc = load_spectral(s, &h, &lay, st))) return rc;
    return 0;
}

/* An active file: its whole records' entries, checked as a sealed
 * file's tables are (shard_journal.c reads them into that layout). */
static int open_journal(kvx_shard *s, struct stat *st, const kvx_active_params *p)
{
    kvx_journal_state js;
    int rc = kvx_journal_read(s->fd, (uint64_t)st->st_size, p, &js);
    if (rc) return rc;
    /* the file's size now: a record is written only after its pages, so
     * every page a record read names lies within it (the size before the
     * read may be older than the records read, with a writer appending) */
    if (kvx_os.fstat(s->fd, st) != 0) {
        int e = errno;
        free(js.tables);
        return kvx_fail(-e, "%s: fstat: %s", s->path, strerror(e));
    }
    kvx_shard_layout lay;
    if (kvx_shard_layout_for(&lay, js.n, js.h.flags, js.h.block_tokens, js.h.num_layers, js.h.kv_heads)) {
        free(js.tables);
        return kvx_fail(KVX_EOVERFLOW, "active shard: table sizes overflow"); /* cannot: n <= max_entries */
    }
    s->info.geometry = p->geometry;
    s->info.format_version = js.h.format_version;
    s->info.num_blocks = s->n = js.n;
    s->info.kv_data_offset = js.h.kv_data_offset;
    s->info.flags = js.h.flags;
    s->info.file_size = (uint64_t)st->st_size;
    /* a file not yet grown to its KV section holds no page at all */
    uint64_t size = (uint64_t)st->st_size < js.h.kv_data_offset ? js.h.kv_data_offset : (uint64_t)st->st_size;
    rc = load_entries(s, &js.h, &lay, js.tables, size);
    free(js.tables);
    s->info.shard_id = p->shard_id; /* every entry's (kvx_journal_read checked) */
    s->active = 1;
    return rc;
}

static int shard_open(kvx_shard **out, int dirfd, const char *name, const char *path, unsigned flags,
                      const kvx_active_params *active);

int kvx_shard_open(kvx_shard **out, const char *path, unsigned flags)
{
    return shard_open(out, AT_FDCWD, path, path, flags, NULL);
}

int kvx_shard_open_at(kvx_shard **out, int dirfd, const char *name, const char *path, unsigned flags)
{
    return shard_open(out, dirfd, name, path, flags, NULL);
}

int kvx_shard_open_active(kvx_shard **out, int dirfd, const char *name, const char *path, const kvx_active_params *p)
{
    if (!p) return kvx_fail(KVX_EINVALID, "kvx_shard_open_active: NULL parameters");
    return shard_open(out, dirfd, name, path, 0, p);
}

static int shard_open(kvx_shard **out, int dirfd, const char *name, const char *path, unsigned flags,
                      const kvx_active_params *active)
{
    if (!out || !path || !name) return kvx_fail(KVX_EINVALID, "kvx_shard_open: out and path must not be NULL");
    *out = NULL;
    if (flags & ~KVX_OPEN_VERIFY_PAGES)
        return kvx_fail(KVX_EINVALID, "kvx_shard_open: unknown flags 0x%x", flags);
    kvx_shard *s = calloc(1, sizeof *s);
    if (!s || !(s->path = strdup(path))) {
        free(s);
        return kvx_fail(-ENOMEM, "out of memory");
    }
    s->guard_slot = -1;
    atomic_init(&s->refs, 1);
    atomic_init(&s->direct_fd, -1);
    /* O_NONBLOCK: a FIFO given as a shard must not block the open. Under a
     * directory, never through a symlink: what was checked to be a file
     * may have been replaced since */
    int oflags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
    s->fd = dirfd == AT_FDCWD ? kvx_os.open(path, oflags, 0) : kvx_os.openat(dirfd, name, oflags | O_NOFOLLOW, 0);
    if (s->fd < 0) {
        int e = -errno;
        shard_free(s);
        if (e == -ELOOP && dirfd != AT_FDCWD) return kvx_fail(KVX_EPATH, "%s: a symlink, not a shard file", path);
        return kvx_fail(e, "%s: cannot open: %s", path, strerror(-e));
    }
    struct stat st;
    int rc = 0;
    if (kvx_os.fstat(s->fd, &st) != 0) {
        int e = errno;
        rc = kvx_fail(-e, "%s: fstat: %s", path, strerror(e));
    } else if (!S_ISREG(st.st_mode)) {
        rc = kvx_fail(KVX_EINVALID, "%s: not a regular file but a %s", path, kvx_file_type_name(st.st_mode));
    }
    if (!rc) rc = active ? open_journal(s, &st, active) : open_validated(s, &st);
    if (!rc) {
        s->map_len = (size_t)st.st_size;
        s->mtime = st.st_mtim;
        void *m = kvx_os.mmap(NULL, s->map_len, PROT_READ, MAP_SHARED, s->fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            rc = kvx_fail(-e, "%s: mmap of %zu bytes: %s", path, s->map_len, strerror(e));
        } else {
            s->map = m;
            rc = kvx_sigbus_register(&s->guard_slot, m, s->map_len);
        }
    }
    if (!rc && (flags & KVX_OPEN_VERIFY_PAGES)) {
        uint32_t bad = 0;
        rc = kvx_shard_verify(s, &bad, NULL, NULL);
    }
    if (rc) {
        /* keep the validation message, prefixed by nothing: it names the field */
        shard_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

kvx_shard *kvx_shard_ref(kvx_shard *s)
{
    if (s) atomic_fetch_add_explicit(&s->refs, 1, memory_order_relaxed);
    return s;
}

void kvx_shard_close(kvx_shard *s)
{
    if (!s) return;
    if (atomic_fetch_sub_explicit(&s->refs, 1, memory_order_acq_rel) == 1) shard_free(s);
}

const kvx_shard_info *kvx_shard_get_info(const kvx_shard *s) { return s ? &s->info : NULL; }
const char *kvx_shard_path(const kvx_shard *s) { return s ? s->path : NULL; }
int kvx_shard_fd(const kvx_shard *s) { return s ? s->fd : -1; }

int kvx_shard_entry(kvx_entry *out, const kvx_shard *s, uint32_t index)
{
    if (!out || !s) return kvx_fail(KVX_EINVALID, "kvx_shard_entry: NULL argument");
    if (index >= s->n)
        return kvx_fail(KVX_EINVALID, "kvx_shard_entry: index %u, the shard has %u entries", index, s->n);
    const shard_rec *r = &s->recs[index];
    out->coordinate = r->coordinate;
    out->token_count = r->token_count;
    out->offset = r->offset;
    out->bytes = r->bytes;
    out->crc32 = r->crc32;
    out->hash = s->hashes ? s->hashes[index] : 0;
    out->parent = s->parents ? s->parents[index] : 0;
    out->tokens = s->tokens ? s->tokens + (size_t)index * s->info.geometry.block_tokens : NULL;
    out->scales = s->scales ? s->scales + (size_t)index * s->scale_count : NULL;
    out->digest = s->digests && !kvx_digest_is_zero(s->digests + (size_t)index * KVX_DIGEST_BYTES)
                      ? s->digests + (size_t)index * KVX_DIGEST_BYTES
                      : NULL;
    out->key = s->keys ? s->keys + (size_t)index * KVX_KEY_RECORD + 1 : NULL;
    out->key_len = s->keys ? s->keys[(size_t)index * KVX_KEY_RECORD] : 0;
    return 0;
}

int kvx_shard_entry_commit(const kvx_shard *s, uint32_t index, uint64_t *out_seq, int *out_tombstone)
{
    if (!s) return kvx_fail(KVX_EINVALID, "kvx_shard_entry_commit: NULL shard");
    if (index >= s->n)
        return kvx_fail(KVX_EINVALID, "kvx_shard_entry_commit: index %u, the shard has %u entries", index, s->n);
    if (out_seq) *out_seq = s->seqs ? s->seqs[index] : 0;
    if (out_tombstone) *out_tombstone = s->tombs ? s->tombs[index] == KVX_TOMB_DELETE : 0;
    return 0;
}

uint64_t kvx_shard_min_seq(const kvx_shard *s) { return s ? s->min_seq : 0; }

/* Is entry index a tombstone (no page)? */

int kvx_shard_find(uint32_t *out_index, const kvx_shard *s, uint32_t coordinate)
{
    if (!out_index || !s) return kvx_fail(KVX_EINVALID, "kvx_shard_find: NULL argument");
    size_t lo = 0, hi = s->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uint32_t c = (uint32_t)(s->by_coord[mid] >> 32);
        if (c < coordinate) lo = mid + 1;
        else if (c > coordinate) hi = mid;
        else {
            *out_index = (uint32_t)s->by_coord[mid];
            return 0;
        }
    }
    return kvx_fail(KVX_ENOTFOUND, "coordinate 0x%08x is not in %s", coordinate, s->path);
}


static int page_crc(const kvx_shard *s, uint32_t index)
{
    const shard_rec *r = &s->recs[index];
    uint32_t crc = kvx_crc32(0, page_at(s, index), r->bytes);
    if (crc != r->crc32)
        return kvx_fail(KVX_EPAGECRC, "entry %u (coordinate 0x%08x): page CRC-32 0x%08x, stored 0x%08x",
                        index, r->coordinate, crc, r->crc32);
    return 0;
}

/*
 * Read-ahead for a run of first checks. A prefix lookup checks its pages
 * in file order (the writer lays a prompt's pages back to back), and each
 * first check is a CRC pass that faults the page in; left to the mmap
 * fault path, the disk gets one read-around window at a time and the pass
 * waits on each. So a first check whose page starts where the previous
 * one ended (within the 4096 alignment) asks the kernel for the next
 * KVX_SHARD_RA bytes of the file, in steps of half that (posix_fadvise
 * WILLNEED: the reads are queued and nothing waits; nothing is written).
 * A check that continues nothing (a random get) asks for nothing beyond
 * the kernel's own read-around. It changes only when bytes arrive: every
 * page is still CRC-checked before it is first handed out.
 *
 * The window is small on purpose. Measured on the 2-core VM of
 * bench/RESULTS.md ("Cold read, now": 1 GiB store, 64-block prompts, cache
 * dropped, the store's layout held fixed): a first read of shards a merge
 * has just written (the disk's slow path) 0.75-0.77 GB/s against
 * 0.41-0.46 without; a re-read 0.63-0.81 against 0.52-0.88; 4 MiB windows
 * were slower than 1 MiB on both (the WILLNEED reads take small folios
 * where the fault path's read-around takes large ones).
 */
#define KVX_SHARD_RA ((uint64_t)1 << 20)
void kvx_shard_prefetch(kvx_shard *s, const shard_rec *r)
{
    uint64_t end = r->offset + r->bytes;
    uint64_t prev = atomic_exchange_explicit(&s->last_end, end, memory_order_relaxed);
    if (r->offset < prev || r->offset - prev >= 4096 || end >= s->map_len) return;
    uint64_t have = atomic_load_explicit(&s->ra_end, memory_order_relaxed);
    if (have >= end + KVX_SHARD_RA / 2) return;
    uint64_t from = have > end ? have : end, to = end + KVX_SHARD_RA;
    if (to > s->map_len) to = s->map_len;
    if (!atomic_compare_exchange_strong_explicit(&s->ra_end, &have, to, memory_order_relaxed, memory_order_relaxed))
        return; /* another thread asked just now */
    (void)posix_fadvise(s->fd, (off_t)from, (off_t)(to - from), POSIX_FADV_WILLNEED);
}

int kvx_shard_at_start(const kvx_shard *s, uint32_t index)
{
    return s && !s->mem && index < s->n && s->recs[index].offset < s->recs[0].offset + KVX_SHARD_RA;
}
/* A run's pages at once: one WILLNEED per contiguous range, in steps (a
 * call reads at most the device's read-ahead size), leaving out pages this
 * handle checked (a warm prompt makes no system call). skip_first leaves a
 * first range at the file's start to the fault that checks it (its
 * read-around takes large folios, a hint single pages). */
#define KVX_SHARD_HINT_STEP ((uint64_t)1 << 20)
static void shard_hint(kvx_shard *s, uint64_t from, uint64_t to)
{
    if (to > s->map_len) to = s->map_len;
    if (from >= to) return;
    for (uint64_t at = from; at < to; at += KVX_SHARD_HINT_STEP)
        (void)posix_fadvise(s->fd, (off_t)at, (off_t)(to - at > KVX_SHARD_HINT_STEP ? KVX_SHARD_HINT_STEP : to - at),
                            POSIX_FADV_WILLNEED);
    uint64_t have = atomic_load_explicit(&s->ra_end, memory_order_relaxed);
    while (have < to && !atomic_compare_exchange_weak_explicit(&s->ra_end, &have, to, memory_order_relaxed,
                                                                memory_order_relaxed))
        ;
}

void kvx_shard_willneed(kvx_shard *s, const uint32_t *index, size_t n, int skip_first)
{
    if (!s || s->mem || !index) return;
    uint64_t from = 0, to = 0;
    uint32_t k0 = 0, first = 1;
    for (size_t i = 0; i <= n; i++) {
        uint32_t k = i < n ? index[i] : UINT32_MAX;
        if (i < n && (k >= s->n || s->recs[k].missing || is_tomb(s, k) ||
                      (atomic_load_explicit(&s->checked[k / 64], memory_order_relaxed) >> (k % 64) & 1)))
            continue;
        if (i < n && to > from && s->recs[k].offset >= from && s->recs[k].offset <= to + 4096) {
            if (s->recs[k].offset + s->recs[k].bytes > to) to = s->recs[k].offset + s->recs[k].bytes; /* continues it */
            continue;
        }
        if (to > from) {
            /* a run continuing the last one checked (a sequential reader):
             * as much again past its end */
            uint64_t last = atomic_load_explicit(&s->last_end, memory_order_relaxed);
            uint64_t ahead = from >= last && from - last < 4096 ? to - from : 0;
            if (!(first && skip_first && kvx_shard_at_start(s, k0))) shard_hint(s, from, to + ahead);
            else if (ahead) shard_hint(s, to, to + ahead);
            first = 0;
        }
        if (i < n) from = s->recs[k].offset, to = from + s->recs[k].bytes, k0 = k;
    }
}


int kvx_shard_page(const void **out_page, const kvx_shard *s, uint32_t index, int verify)
{
    if (!out_page || !s) return kvx_fail(KVX_EINVALID, "kvx_shard_page: NULL argument");
    if (index >= s->n)
        return kvx_fail(KVX_EINVALID, "kvx_shard_page: index %u, the shard has %u entries", index, s->n);
    if (is_tomb(s, index)) {
        *out_page = NULL;
        return kvx_fail(KVX_ENOTFOUND, "entry %u (coordinate 0x%08x) of %s is a tombstone (a keyed delete): it has no page",
                        index, s->recs[index].coordinate, s->path);
    }
    if (s->recs[index].missing) {
        *out_page = NULL;
        return kvx_fail(KVX_ETRUNC, "entry %u (coordinate 0x%08x): page lies past the end of %s (missing)", index,
                        s->recs[index].coordinate, s->path);
    }
    *out_page = page_at(s, index);
    if (!verify) return 0;
    if (!s->mem) kvx_shard_prefetch((kvx_shard *)s, &s->recs[index]); /* the handle's own, mutable memory */
    int rc = page_crc(s, index);
    if (rc == 0) atomic_fetch_or_explicit(&s->checked[index / 64], 1ull << (index % 64), memory_order_relaxed);
    return rc;
}

/* How often a lookup looks at the file's size and mtime again (a coarse
 * clock read per lookup, an fstat per shard at most this often: an fstat
 * costs about as much as a whole cached lookup). */
#define KVX_SHARD_SIZE_CHECK_MS 20

static uint64_t coarse_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Is the file still as long as it was at open, and unmodified since (as
 * far as anyone can tell within KVX_SHARD_SIZE_CHECK_MS)? Once not, never
 * again for this handle. What this cannot see: bytes that change with
 * neither (a disk or a server returning other bytes, a write that sets the
 * old mtime back); KVX_STORE_VERIFY checks every served page for those. */
static int shard_whole(kvx_shard *s)
{
    if (s->mem) return 1;
    if (atomic_load_explicit(&s->cut, memory_order_relaxed)) return 0;
    if (kvx_sigbus_poisoned(s->guard_slot)) { /* a read of the mapping faulted: the file is shorter */
        atomic_store_explicit(&s->cut, 1, memory_order_relaxed);
        return 0;
    }
    uint64_t now = coarse_ms(), seen = atomic_load_explicit(&s->size_seen_ms, memory_order_relaxed);
    if (now - seen < KVX_SHARD_SIZE_CHECK_MS ||
        !atomic_compare_exchange_strong_explicit(&s->size_seen_ms, &seen, now, memory_order_relaxed,
                                                 memory_order_relaxed))
        return 1; /* looked at just now (by this thread or another) */
    struct stat st;
    if (kvx_os.fstat(s->fd, &st) == 0 && (uint64_t)st.st_size >= s->map_len &&
        (s->active || (st.st_mtim.tv_sec == s->mtime.tv_sec && st.st_mtim.tv_nsec == s->mtime.tv_nsec)))
        return 1;
    atomic_store_explicit(&s->cut, 1, memory_order_relaxed);
    return 0;
}

int kvx_shard_page_checked(const void **out_page, const kvx_shard *s, uint32_t index)
{
    if (index < s->n && !s->recs[index].missing &&
        (atomic_load_explicit(&s->checked[index / 64], memory_order_relaxed) >> (index % 64) & 1) &&
        shard_whole((kvx_shard *)s)) { /* the handle's own, mutable marks */
        *out_page = page_at(s, index);
        return 0;
    }
    return kvx_shard_page(out_page, s, index, 1);
}

uint32_t kvx_shard_missing(const kvx_shard *s) { return s ? s->n_missing : 0; }

int kvx_shard_mem(kvx_shard **out, const kvx_geometry *g, uint32_t n, void **pages, const uint64_t *hashes,
                  const uint64_t *parents, const uint32_t *tokens, const uint8_t *digests, const float *scales)
{
    *out = NULL;
    uint64_t pb = kvx_page_bytes(g, g->block_tokens), ns = kvx_scale_count(g);
    uint32_t B = g->block_tokens;
    kvx_shard *s = calloc(1, sizeof *s);
    if (!s || !n || n > KVX_MAX_ENTRIES || !pb || !B) {
        free(s);
        for (uint32_t i = 0; i < n; i++) free(pages[i]);
        free(pages);
        return s ? kvx_fail(KVX_EINVALID, "kvx_shard_mem: %u blocks of %llu bytes", n, (unsigned long long)pb)
                 : kvx_fail(-ENOMEM, "shard: out of memory");
    }
    atomic_init(&s->refs, 1);
    atomic_init(&s->direct_fd, -2);
    s->fd = -1;
    s->mem = 1;
    s->pages = pages;
    s->n = n;
    s->info.geometry = *g;
    s->info.format_version = KVX_FORMAT_VERSION;
    s->info.num_blocks = n;
    s->info.flags = KVX_FLAG_HASHES | KVX_FLAG_LINEAGE | KVX_FLAG_DIGEST | (scales ? KVX_FLAG_SCALES : 0);
    s->info.file_size = pb * n;
    s->scale_count = scales ? ns : 0;
    s->recs = calloc(n, sizeof *s->recs);
    s->hashes = malloc(n * sizeof *s->hashes);
    s->parents = malloc(n * sizeof *s->parents);
    s->tokens = malloc((size_t)n * B * 4u);
    s->digests = malloc((size_t)n * KVX_DIGEST_BYTES);
    s->scales = scales ? malloc((size_t)(n * ns) * sizeof(float)) : NULL;
    s->checked = calloc((n + 63) / 64, sizeof *s->checked);
    s->by_coord = malloc(n * sizeof *s->by_coord);
    s->path = strdup("(shared tier)");
    if (!s->path || !s->recs || !s->hashes || !s->parents || !s->tokens || !s->digests || (scales && !s->scales) ||
        !s->checked || !s->by_coord) {
        shard_free(s);
        return kvx_fail(-ENOMEM, "shard: out of memory");
    }
    memcpy(s->hashes, hashes, n * sizeof *s->hashes);
    memcpy(s->parents, parents, n * sizeof *s->parents);
    memcpy(s->tokens, tokens, (size_t)n * B * 4u);
    memcpy(s->digests, digests, (size_t)n * KVX_DIGEST_BYTES);
    if (scales) memcpy(s->scales, scales, (size_t)(n * ns) * sizeof(float));
    for (uint32_t i = 0; i < n; i++) {
        shard_rec *r = &s->recs[i];
        r->coordinate = KVX_COORD(0, i, 0);
        r->token_count = B;
        r->offset = pb * i; /* notional: the page is pages[i] */
        r->bytes = (uint32_t)pb;
        r->crc32 = kvx_crc32(0, s->pages[i], r->bytes);
        s->by_coord[i] = (uint64_t)r->coordinate << 32 | i;
        atomic_fetch_or_explicit(&s->checked[i / 64], 1ull << (i % 64), memory_order_relaxed);
    }
    *out = s;
    return 0;
}

int kvx_shard_verify(const kvx_shard *s, uint32_t *out_bad,
                     void (*report)(void *ctx, uint32_t index, int code), void *ctx)
{
    if (!s) return kvx_fail(KVX_EINVALID, "kvx_shard_verify: NULL shard");
    /* One fstat up front: pages now past the end of the file are reported
     * as truncated without touching them. */
    struct stat st;
    uint64_t size = s->info.file_size;
    if (kvx_os.fstat(s->fd, &st) == 0 && (uint64_t)st.st_size < size) size = (uint64_t)st.st_size;
    uint32_t bad = 0;
    int first = 0;
    for (uint32_t i = 0; i < s->n; i++) {
        const shard_rec *r = &s->recs[i];
        if (is_tomb(s, i)) continue; /* no page: never missing, never damaged */
        int rc = r->offset + r->bytes > size
                     ? kvx_fail(KVX_ETRUNC, "entry %u: page lies past the end of the file (now %llu bytes)",
                                i, (unsigned long long)size)
                     : page_crc(s, i);
        if (rc) {
            bad++;
            if (!first) first = rc;
            if (report) report(ctx, i, rc);
        }
    }
    if (out_bad) *out_bad = bad;
    if (first) return kvx_fail(first, "%u of %u pages are bad", bad, s->n);
    return 0;
}

int kvx_shard_spectral(kvx_spectral *out, const kvx_shard *s)
{
    if (!out || !s) return kvx_fail(KVX_EINVALID, "kvx_shard_spectral: NULL argument");
    if (!s->has_spectral) return kvx_fail(KVX_ENOTFOUND, "%s has no spectral bundle", s->path);
    *out = s->spectral;
    return 0;
}

