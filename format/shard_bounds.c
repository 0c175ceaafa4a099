/*
 * shard_bounds.c - how much a shard's header may make its reader read and
 * allocate (DESIGN.md rule 5, "Bounded by the input"; docs/FORMAT.md
 * "Bounded by the file", BOUND-7).
 *
 * kvx_shard_open reads every table and the spectral bundle and copies them
 * to the heap, and the header's fields size them: a lineage record is
 * 8 + 4*block_tokens bytes, a scale record 8*L*Hkv, a bundle
 * n*n_layers*d*r floats. The file's size alone does not bound them: a file
 * of 8 KiB truncated up to 16 GiB (a sparse tail reads as zeros, and zeros
 * are valid tokens, parents and digests) made `kvx verify` allocate
 * 2 x 16 GiB for block_tokens 2^32-1. So, before anything is read for them:
 *
 *   1. block_tokens is at most KVX_MAX_BLOCK_TOKENS (the reader's
 *      kvx_shard_header_check, with the other header fields);
 *   2. each table ends within the file, its extent computed with overflow
 *      checks (kvx_shard_layout_for); else KVX_ETRUNC naming the table;
 *   3. the tables and the bundle together are at most KVX_HELD_FACTOR times
 *      the bytes of data the file holds, plus KVX_HELD_SLACK; holes do not
 *      count. Else KVX_ETRUNC naming the largest of them.
 *
 * "Data the file holds" is its allocated blocks (st_blocks), and where
 * those fall short its data extents (SEEK_DATA / SEEK_HOLE): st_blocks may
 * lag what was just written (ZFS counts blocks when its transaction group
 * commits) or count compressed blocks. The extents are walked only until
 * enough data is found, so the walk costs at most one step per extent of
 * real data. A file system that cannot tell (lseek fails) is believed.
 * lseek is a query that changes nothing but the descriptor's offset, which
 * the reader never uses (pread and mmap take their own), so it is called
 * directly, not through the kvx_os seam.
 */
#include "shard_format.h"

#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct table_ref {
    const char *name;
    uint64_t off, bytes, rec;
    char why[96]; /* what sizes a record: "8 + 4 x block_tokens 4096" */
} table_ref;

/* The tables present in lay (the coordinate table always), in file order. */
static int tables_of(table_ref *t, const kvx_shard_header *h, const kvx_shard_layout *lay)
{
    int k = 0;
    t[k] = (table_ref){"coordinate table", lay->coord_off, lay->coord_bytes, KVX_ENTRY_BYTES, ""};
    snprintf(t[k++].why, sizeof t->why, "%u", KVX_ENTRY_BYTES);
    if (h->flags & KVX_FLAG_HASHES) {
        t[k] = (table_ref){"hash table", lay->hash_off, lay->hash_bytes, 8, ""};
        snprintf(t[k++].why, sizeof t->why, "8");
    }
    if (h->flags & KVX_FLAG_LINEAGE) {
        t[k] = (table_ref){"lineage table", lay->lineage_off, lay->lineage_bytes, lay->lineage_rec, ""};
        snprintf(t[k++].why, sizeof t->why, "8 + 4 x block_tokens %u", h->block_tokens);
    }
    if (h->flags & KVX_FLAG_DIGEST) {
        t[k] = (table_ref){"digest table", lay->digest_off, lay->digest_bytes, KVX_DIGEST_BYTES, ""};
        snprintf(t[k++].why, sizeof t->why, "%u", KVX_DIGEST_BYTES);
    }
    if (h->flags & KVX_FLAG_SCALES) {
        t[k] = (table_ref){"scale table", lay->scale_off, lay->scale_bytes, lay->scale_rec, ""};
        snprintf(t[k++].why, sizeof t->why, "4 x 2 x num_layers %u x kv_heads %u", h->num_layers, h->kv_heads);
    }
    if (h->flags & KVX_FLAG_KEYS) {
        t[k] = (table_ref){"key table", lay->key_off, lay->key_bytes, KVX_KEY_RECORD, ""};
        snprintf(t[k++].why, sizeof t->why, "%u", KVX_KEY_RECORD);
    }
    if (h->flags & KVX_FLAG_SEQ) {
        t[k] = (table_ref){"sequence table", lay->seq_off, lay->seq_bytes, 8, ""};
        snprintf(t[k++].why, sizeof t->why, "8");
    }
    if (h->flags & KVX_FLAG_TOMB) {
        t[k] = (table_ref){"tombstone table", lay->tomb_off, lay->tomb_bytes, 1, ""};
        snprintf(t[k++].why, sizeof t->why, "1");
    }
    return k;
}

/* Bytes of data fd holds, counted until need is reached (UINT64_MAX: the
 * file system cannot tell, so the size is believed). */
static uint64_t held_bytes(int fd, const struct stat *st, uint64_t need)
{
    uint64_t alloc = st->st_blocks > 0 ? (uint64_t)st->st_blocks * 512u : 0;
    if (alloc >= need) return alloc;
    uint64_t held = 0, off = 0, size = st->st_size > 0 ? (uint64_t)st->st_size : 0;
    while (off < size && held < need) {
        off_t d = lseek(fd, (off_t)off, SEEK_DATA);
        if (d < 0) {
            if (errno == ENXIO) break; /* no data from off to the end */
            return UINT64_MAX;
        }
        off_t e = lseek(fd, d, SEEK_HOLE);
        if (e <= d) return UINT64_MAX;
        held += (uint64_t)(e - d);
        off = (uint64_t)e;
    }
    return held > alloc ? held : alloc;
}

int kvx_shard_check_tables(int fd, const struct stat *st, const kvx_shard_header *h, const kvx_shard_layout *lay,
                           uint64_t bundle_bytes)
{
    uint64_t size = st->st_size > 0 ? (uint64_t)st->st_size : 0;
    table_ref t[8];
    int k = tables_of(t, h, lay), big = 0;
    for (int i = 0; i < k; i++) {
        uint64_t end;
        if (!kvx_add64(&end, t[i].off, t[i].bytes))
            return kvx_fail(KVX_EOVERFLOW, "%s: its end overflows", t[i].name);
        if (end > size)
            return kvx_fail(KVX_ETRUNC,
                            "%s [%llu, %llu) (num_blocks %u x %llu bytes: %s) ends past the end of the file (%llu bytes)",
                            t[i].name, (unsigned long long)t[i].off, (unsigned long long)end, h->num_blocks,
                            (unsigned long long)t[i].rec, t[i].why, (unsigned long long)size);
        if (t[i].bytes > t[big].bytes) big = i;
    }
    uint64_t total;
    if (!kvx_add64(&total, lay->tables_end - KVX_HEADER_BYTES, bundle_bytes))
        return kvx_fail(KVX_EOVERFLOW, "tables and spectral bundle: their size overflows");
    if (total <= KVX_HELD_SLACK) return 0;
    uint64_t need = (total - KVX_HELD_SLACK + KVX_HELD_FACTOR - 1) / KVX_HELD_FACTOR;
    uint64_t held = held_bytes(fd, st, need);
    if (held >= need) return 0;
    if (bundle_bytes > t[big].bytes)
        return kvx_fail(KVX_ETRUNC,
                        "spectral bundle of %llu bytes (spectral_dim %u): with the tables, %llu bytes to read at open, "
                        "but the file holds %llu bytes of data (its size %llu counts holes): at most %u x its data + 1 MiB "
                        "are read",
                        (unsigned long long)bundle_bytes, h->spectral_dim, (unsigned long long)total,
                        (unsigned long long)held, (unsigned long long)size, KVX_HELD_FACTOR);
    return kvx_fail(KVX_ETRUNC,
                    "%s (num_blocks %u x %llu bytes: %s): with the rest, %llu bytes to read at open, but the file "
                    "holds %llu bytes of data (its size %llu counts holes): at most %u x its data + 1 MiB are read",
                    t[big].name, h->num_blocks, (unsigned long long)t[big].rec, t[big].why, (unsigned long long)total,
                    (unsigned long long)held, (unsigned long long)size, KVX_HELD_FACTOR);
}
