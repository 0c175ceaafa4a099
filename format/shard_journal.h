/*
 * format/shard_journal.h - the active shard's journal (docs/FORMAT.md
 * "Active shards and their journal"), shared by the writer that appends
 * to it (shard_writer.c) and the reader that opens an active file
 * (shard_reader.c). Not API.
 *
 * An active shard is a shard file still growing: its tables are reserved
 * for max_entries as a sealed file's writer reserves them, its pages lie
 * at their final offsets, and instead of a header and tables it holds a
 * journal between the reserved tables and the KV section: a journal
 * header, then one append record per commit, each naming the entries the
 * commit added (one row an entry: that entry's slice of every table, in
 * table order). The records are chained by CRC-32C from the journal
 * header, so a record read whole, in its place, is this file's.
 */
#ifndef KVX_SHARD_JOURNAL_H
#define KVX_SHARD_JOURNAL_H

#include "shard_format.h"
#include "format.h"

#define KVX_JOURNAL_MAGIC "KVXJRNL1"
#define KVX_RECORD_MAGIC "KVXAPPND"
#define KVX_JOURNAL_HEADER_BYTES 128u
#define KVX_RECORD_HEADER_BYTES 32u

/* Record header field offsets. */
enum {
    KVX_R_MAGIC = 0,
    KVX_R_SEQ = 8,
    KVX_R_FIRST = 16,
    KVX_R_COUNT = 20,
    KVX_R_ROW_BYTES = 24,
    KVX_R_CRC = 28,
};

/* Where an active file's parts lie, from its parameters alone. */
typedef struct kvx_journal_geom {
    kvx_shard_layout max;    /* the tables of max_entries (the reserve) */
    kvx_shard_layout one;    /* the tables of one entry: each table's row width */
    uint64_t row_bytes;      /* one entry's row: one.tables_end - the header */
    uint64_t journal_off;    /* the journal header (64-aligned, after the reserve) */
    uint64_t journal_bytes;  /* the journal header and room for max_entries rows
                                in as many records */
    uint64_t kv_data_offset; /* the KV section, after the journal */
} kvx_journal_geom;

/* Checks p (as the writer's options are checked: kvx_shard_writer_create)
 * and computes its geometry: 0, or the error naming the field. */
int kvx_journal_geom_for(kvx_journal_geom *out, const kvx_active_params *p);

/* The journal header of p (KVX_JOURNAL_HEADER_BYTES), its CRC-32C last;
 * *out_crc = that CRC, the first record's chain input. */
void kvx_journal_header_encode(uint8_t *out, const kvx_active_params *p, const kvx_journal_geom *jg,
                               uint32_t *out_crc);

/* What the records of an active file say, read whole and chained. */
typedef struct kvx_journal_state {
    kvx_shard_header h;  /* as a sealed file of these entries would have it
                            (num_blocks n, flags without KVX_FLAG_META_CRC) */
    uint8_t *tables;     /* the tables of n entries as a sealed file lays them
                            out (kvx_shard_layout_for(n)), from the end of the
                            header: malloc'd, the caller frees */
    uint32_t n, records;
    uint64_t next_pos;   /* absolute: where the next record goes */
    uint64_t tail_end;   /* absolute: the end of the journal's last non-zero
                            byte after next_pos (next_pos when none) */
    uint32_t chain;      /* the last record's CRC (the header's, none) */
    uint64_t last_seq;   /* the last record's sequence number (0, none) */
    uint64_t kv_end;     /* relative to kv_data_offset: the end of the
                            furthest page a record names */
} kvx_journal_state;

/* Reads fd's journal (file_size bytes, laid out for p): every record that
 * reads whole and chained is one commit; the bytes after the last such
 * record are unsealed (never acknowledged: a commit returns only once its
 * record is durable) unless another record's magic lies where a record
 * after it would begin (for any count it could have held) or past the
 * furthest it could reach, which is damage: KVX_ECORRUPT naming the
 * record. A
 * journal header that is missing or differs from p's: KVX_EMAGIC /
 * KVX_EFORMAT (not this store's active file); a whole record that breaks
 * a rule (its first entry, its row width, a sequence number not above its
 * predecessor's): KVX_EFORMAT naming it. The tables are then checked as a
 * sealed file's are (by the caller). */
/* Memory: the rows of the records read and a window of 1 MiB, never the
 * journal's reserve. */
int kvx_journal_read(int fd, uint64_t file_size, const kvx_active_params *p, kvx_journal_state *out);
/* The same, the records from the first whole one whose sequence number is
 * at least below read as the tail (a commit that never answered). */
int kvx_journal_read_below(int fd, uint64_t file_size, const kvx_active_params *p, uint64_t below,
                           kvx_journal_state *out);

#endif
