/*
 * free_log.h - the free log: the durable records that say a page of a
 * sealed shard is gone (docs/FORMAT.md "Free log", docs/APPENDS.md "Holes").
 *
 * A block store that evicts a page in place (a hole punched where the
 * page was) first appends one record naming it here and makes it durable;
 * only then is the extent freed. A reader that finds a page failing its
 * CRC asks this log before it calls the page damage: named here, it is
 * a miss; not named, it is damage.
 */
#ifndef KVX_FORMAT_FREE_LOG_H
#define KVX_FORMAT_FREE_LOG_H

#include "common/internal.h"

#include <stddef.h>
#include <stdint.h>

#define KVX_FREE_LOG_MAGIC "KVXFREE1"
#define KVX_FREE_REC_MAGIC "KVXFREED"
#define KVX_FREE_LOG_VERSION 1
#define KVX_FREE_HEADER_BYTES 64
#define KVX_FREE_REC_HEADER_BYTES 24
#define KVX_FREE_ROW_BYTES 24
/* rows in one record: an eviction frees at most a store's entries, which
 * fit 256 shards of KVX_MAX_ENTRIES; more is not a record a writer wrote */
#define KVX_FREE_MAX_ROWS (256u * 65536u)

/* One freed page: the shard's generation, its entry index and the
 * entry's block hash (a row frees the entry only where all three agree,
 * and only an entry written before the record: its sequence number below
 * the record's). */
typedef struct kvx_freed {
    uint64_t gen, hash;
    uint32_t entry;
    uint64_t seq; /* the record's sequence number (filled by the reader) */
} kvx_freed;

/* What a read found. */
typedef struct kvx_free_log {
    kvx_freed *rows; /* every whole record's rows, in file order (malloc'd) */
    size_t n;
    uint32_t records;
    uint64_t max_seq;  /* the last whole record's sequence number (0: none) */
    uint64_t end;      /* the byte after the last whole record */
    uint32_t last_crc; /* its CRC (the header's when none): the next record's chain */
    uint64_t tail;     /* bytes after end: a torn record, never acknowledged */
} kvx_free_log;

/* Reads the free log `name` under dirfd (a regular file, never through a
 * symlink or blocking on a FIFO). 0 and *out, or: -ENOENT none there;
 * KVX_EPATH not a regular file; KVX_ETRUNC shorter than its header;
 * KVX_EMAGIC, KVX_EVERSION, KVX_ECORRUPT a header that is not one; a
 * whole record whose sequence number is not above the previous one's:
 * KVX_ECORRUPT naming it. A record that does not read whole and chained
 * ends the log: it and what follows are the tail (out->tail bytes). */
int kvx_free_log_read(int dirfd, const char *name, kvx_free_log *out);
void kvx_free_log_free(kvx_free_log *l);

/* Writes a new free log holding rows as `name` under dirfd: all in one
 * record at seq (none when n is 0), or, seq 0, one record per run of rows
 * sharing their own .seq (runs in increasing order), so a rewrite keeps
 * every row's number. A temporary file, fsync, rename over name, the
 * directory's fsync. On success *out describes it (rows not copied:
 * out->rows NULL, out->n n). Nothing changes on failure. */
int kvx_free_log_write(int dirfd, const char *name, const kvx_freed *rows, size_t n, uint64_t seq, kvx_free_log *out);

/* Appends one record of rows at seq (above l->max_seq) to the open log fd
 * at l->end, then fdatasync; on success l->end, last_crc, max_seq,
 * records advance. On failure l is unchanged (a record that may have
 * reached the disk is overwritten by the next append). */
int kvx_free_log_append(int fd, kvx_free_log *l, const kvx_freed *rows, size_t n, uint64_t seq);

#endif
