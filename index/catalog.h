/*
 * catalog.h - the store's catalog: where every block and shard lives, kept
 * in index/data.mdb (private to the library, not API).
 *
 * The catalog owns every LMDB byte; nothing of LMDB crosses this header,
 * and every function answers in kvx codes only (0, -errno, KVX_E*), each
 * with its message, except a plain miss (KVX_ENOTFOUND from a get, which
 * leaves the message to the caller: a prompt's lookups miss often). A
 * failure of LMDB or a damaged record is an error, never "not found" and
 * never skipped. It knows no shard or envelope struct: the store turns
 * entries into the records below.
 *
 * Records. A shard byte (0..255, the coordinate's top byte) names a live
 * shard file by generation; a coordinate record names the block a
 * coordinate holds (its hash and shard generation); a hash names one or
 * more locations (a coordinate and generation each: several on a hash
 * collision, or verified beside unverified copies); a usage record holds a
 * shard's recency, hits and a bitmap of referenced entries; stats and the
 * next generation are catalog-wide. Every record carries its CRC-32C on
 * disk (DESIGN.md rule 4): a damaged one is KVX_ECORRUPT naming `kvx store
 * reindex` from every read.
 *
 * Reads go through a read snapshot (kvx_cat_snap): one consistent view,
 * from a pool of renewable read transactions, cheap enough to take per
 * prompt; reads inside allocate nothing. Mutations are edits
 * (kvx_cat_edit): a typed list of changes, built first and then applied in
 * one write transaction by kvx_cat_apply, the way LevelDB's VersionEdit and
 * LogAndApply work. An edit is all or nothing; after its commit the
 * catalog updates the writer's registry (every shard record and its live
 * flag) that it hands the store.
 *
 * Lifetimes and threads: a catalog handle is used by one store handle;
 * several catalog handles of one directory in one process share one LMDB
 * environment (LMDB allows one per process). A snapshot is begun and ended
 * in one thread (it holds a lock of the environment); records are copied
 * out, so nothing a read returns points into the map. Edits that put or
 * drop shard records, reset or set the next generation update the
 * handle's registry: apply those from one thread at a time (the store's
 * writer mutex); usage and stats edits may come from any thread (LMDB
 * serializes the transactions).
 */
#ifndef KVX_CATALOG_H
#define KVX_CATALOG_H

#include "common/internal.h"

#include <stddef.h>
#include <stdint.h>

#define KVX_CAT_SLOTS 256             /* shard bytes */
#define KVX_CAT_BITMAP_MAX (65536 / 8) /* usage bitmap bytes of a full shard */

typedef struct kvx_catalog kvx_catalog;
typedef struct kvx_cat_snap kvx_cat_snap;

/* A live shard (shards/<gen as 16 hex>.kvx). */
typedef struct kvx_cat_shard {
    uint64_t gen;
    uint64_t file_bytes; /* size of the sealed file */
    uint64_t created_ns; /* CLOCK_REALTIME at publication */
    uint32_t n_entries;
    uint32_t flags;        /* the shard's KVX header flags */
    uint32_t n_unverified; /* entries without a prefix digest (records of
                              shards without KVX_FLAG_DIGEST may say 0:
                              every entry is then unverified) */
    uint64_t ino;          /* the file's inode number at registration (0:
                              not recorded): a writer's open sees a file
                              swapped or copied under the name */
} kvx_cat_shard;

/* The block a coordinate holds. */
typedef struct kvx_cat_coord {
    uint64_t hash;
    uint64_t gen; /* of the shard holding it */
} kvx_cat_coord;

/* One location of a hash. */
typedef struct kvx_cat_loc {
    uint32_t coord;
    uint64_t gen;
} kvx_cat_loc;

/* A shard's usage record header; the bitmap has (n_bits + 7) / 8 bytes,
 * bit i set when entry i was referenced. */
typedef struct kvx_cat_usage {
    uint64_t gen; /* the shard generation it describes */
    uint64_t last_use_ns;
    uint64_t hits;
    uint32_t n_bits;
} kvx_cat_usage;

typedef struct kvx_cat_stats {
    uint64_t hits, misses, evictions, evicted_blocks, compactions, dropped_shards;
} kvx_cat_stats;

/* What the catalog names: every shard byte's record (live[b] 1 when the
 * catalog holds one; a slot a drop emptied keeps its last record with
 * live 0) and the recorded next generation (0: the catalog names none:
 * empty or lost, reindex it). */
typedef struct kvx_cat_registry {
    kvx_cat_shard rec[KVX_CAT_SLOTS];
    uint8_t live[KVX_CAT_SLOTS];
    uint64_t next_gen;
    /* the next sequence number a commit takes (0: none recorded, a catalog
     * of an older release or an empty one); DESIGN.md "The files are the
     * whole truth": the files carry every number given out, this is only
     * where the writer starts without reading them */
    uint64_t next_seq;
} kvx_cat_registry;

/* Block counts (records, not files). */
typedef struct kvx_cat_counts {
    uint64_t blocks;    /* coordinate records */
    uint64_t locations; /* hash locations */
    uint64_t shards;    /* shard records */
} kvx_cat_counts;

/* ------------------------------------------------------------- the handle */

/* Opens the catalog in directory path (DIR/index): checks data.mdb before
 * LMDB trusts it (meta pages, then a walk of the whole tree), joins or
 * opens the process's environment for it. create: a writer may start an
 * empty catalog (a missing or empty data.mdb); a reader gets KVX_ECORRUPT
 * naming reindex. A reader without write permission gets a read-only
 * catalog (kvx_cat_readonly). nosync: commits skip fsync (benchmarks).
 * The registry is empty until kvx_cat_registry_load. */
int kvx_cat_open(kvx_catalog **out, const char *path, int create, int nosync);
/* Closes the handle (NULL is fine); the environment goes with its last. */
void kvx_cat_close(kvx_catalog *cat);
/* 1 when the catalog was opened read-only (no write permission): edits
 * are refused with -EROFS. */
int kvx_cat_readonly(const kvx_catalog *cat);
/* on: commits skip LMDB's syncs from now on (the store's writer, once its
 * mark says so durably: engine/store_lag.c); off: syncing again, then the
 * file synced: 0 once every earlier commit is durable. */
int kvx_cat_lag(kvx_catalog *cat, int on);
/* Checks DIR/index/data.mdb's meta pages without opening it (what open
 * checks first): 0, KVX_ECORRUPT naming the field, or -errno. */
int kvx_cat_check_file(const char *path, const char *store_dir, int create);

/* The registry as of the last load or edit applied through this handle;
 * lives as long as the handle, changes only in kvx_cat_registry_load and
 * kvx_cat_apply. */
const kvx_cat_registry *kvx_cat_registry_get(const kvx_catalog *cat);
/* Reloads the registry from a fresh snapshot: 0 or an error (a damaged
 * shard record is KVX_ECORRUPT; the registry is then left as it was). */
int kvx_cat_registry_load(kvx_catalog *cat);

/* -------------------------------------------------------------- snapshots */

/* Begins a read snapshot: 0, KVX_ECORRUPT (an earlier read faulted in the
 * map: this process no longer trusts it), KVX_ESTALE (data.mdb was
 * replaced by reindex since the catalog opened it: reopen), KVX_EBUSY, or
 * -errno. End it with kvx_cat_snap_end in the same thread. */
int kvx_cat_snap_begin(kvx_catalog *cat, kvx_cat_snap **out);
void kvx_cat_snap_end(kvx_cat_snap *snap); /* NULL is fine */

/* Reads. Each returns 0, KVX_ENOTFOUND (no such record, no message),
 * KVX_ECORRUPT (a damaged record or tree, naming reindex) or another
 * error with its message. */
int kvx_cat_shard_get(kvx_cat_snap *snap, uint32_t byte, kvx_cat_shard *out);
int kvx_cat_coord_get(kvx_cat_snap *snap, uint32_t coord, kvx_cat_coord *out);
/* Location i (0, 1, ...) of hash, in the catalog's order: KVX_ENOTFOUND
 * past the last one. Walking i = 0, 1, ... costs one search, then one step
 * each (location 0 alone is one lookup, the prefix hot path); a damaged
 * location is KVX_ECORRUPT, and the walk may go on past it with i + 1. */
int kvx_cat_loc_at(kvx_cat_snap *snap, uint64_t hash, size_t i, kvx_cat_loc *out);
/* 1 when hash has location (coord, gen), 0 when not, or an error. */
int kvx_cat_has_loc(kvx_cat_snap *snap, uint64_t hash, uint32_t coord, uint64_t gen);
/* The usage record of byte: its header, and its bitmap copied into bits
 * when bits_cap holds it (bits may be NULL); *out_bits_len (nullable)
 * gets the bitmap's length either way. */
int kvx_cat_usage_get(kvx_cat_snap *snap, uint32_t byte, kvx_cat_usage *out, uint8_t *bits, size_t bits_cap,
                      size_t *out_bits_len);
/* The counters (all zero when the catalog has none yet). */
int kvx_cat_stats_get(kvx_cat_snap *snap, kvx_cat_stats *out);
/* The recorded next generation (0 when the catalog has none). */
int kvx_cat_next_gen(kvx_cat_snap *snap, uint64_t *out);
/* Every shard record and the next generation, as one registry. */
int kvx_cat_registry_read(kvx_cat_snap *snap, kvx_cat_registry *out);
int kvx_cat_counts_get(kvx_cat_snap *snap, kvx_cat_counts *out);

/* Coordinate records in coordinate order: of shard byte `byte` only, or
 * of the whole catalog with byte KVX_CAT_ALL. fn gets each record, or
 * rec NULL and damaged KVX_ECORRUPT for one whose bytes are damaged (its
 * coordinate from the key); fn returns 0 to go on, anything else stops
 * the walk and is returned. An LMDB failure ends the walk with its error. */
#define KVX_CAT_ALL UINT32_MAX
typedef int (*kvx_cat_block_fn)(void *ctx, uint32_t coord, const kvx_cat_coord *rec, int damaged);
int kvx_cat_blocks_each(kvx_cat_snap *snap, uint32_t byte, kvx_cat_block_fn fn, void *ctx);

/* ------------------------------------------------------------------ edits */

typedef struct kvx_cat_block {
    uint64_t hash;
    uint64_t gen;
    uint32_t coord;
} kvx_cat_block;

typedef struct kvx_cat_shard_put {
    uint32_t byte;
    kvx_cat_shard rec;
} kvx_cat_shard_put;

typedef struct kvx_cat_usage_put {
    uint32_t byte;
    int merge; /* see kvx_cat_edit_merge_usage */
    kvx_cat_usage hdr;
    uint8_t *bits; /* owned by the edit; NULL: all clear */
} kvx_cat_usage_put;

/* One edit: build it with the functions below, apply it once. Applied in
 * this order, in one write transaction:
 *   1. reset: every database emptied (reindex: nothing of the old catalog
 *      is read);
 *   2. blocks removed (their coordinate record, when it still names that
 *      generation, and their hash location);
 *   3. shards dropped: the shard record, its usage record and every
 *      coordinate and hash record of that byte, whatever their generation
 *      (out.dropped_blocks counts those blocks);
 *   4. shard records put (added, or replaced);
 *   5. usage records put, then usage merges;
 *   6. blocks added;
 *   7. stats: read, the delta added (and, with count_drops, the blocks
 *      step 3 removed added to evicted_blocks), written;
 *   8. the next generation, when set.
 * Fields are the builders' business; read only `out` after an apply. */
typedef struct kvx_cat_edit {
    int reset;
    uint8_t drop[KVX_CAT_SLOTS];
    int any_drop;
    kvx_cat_block *del, *add;
    size_t ndel, capdel, nadd, capadd;
    kvx_cat_shard_put *shards;
    size_t nshards, capshards;
    kvx_cat_usage_put *usage;
    size_t nusage, capusage;
    int has_stats, count_drops;
    kvx_cat_stats stats;
    uint64_t next_gen; /* 0: unchanged */
    uint64_t next_seq; /* 0: unchanged */
    int err;           /* the first builder failure, returned by apply */
    struct {
        uint64_t dropped_blocks; /* blocks step 3 removed */
    } out;
} kvx_cat_edit;

void kvx_cat_edit_init(kvx_cat_edit *e);
/* Frees what the builders allocated (the edit may be initialized again). */
void kvx_cat_edit_free(kvx_cat_edit *e);

/* Builders. Each returns 0 or -ENOMEM (kept in the edit too: kvx_cat_apply
 * then refuses it, so a loop of builders may check once, at the apply). */
/* Empties the whole catalog first (reindex). */
void kvx_cat_edit_reset(kvx_cat_edit *e);
/* A new shard: its record and a fresh usage record (generation rec->gen,
 * last use last_use_ns, no hits, rec->n_entries clear bits). */
int kvx_cat_edit_add_shard(kvx_cat_edit *e, uint32_t byte, const kvx_cat_shard *rec, uint64_t last_use_ns);
/* A shard record alone, written as given (a corrected file size). */
int kvx_cat_edit_put_shard(kvx_cat_edit *e, uint32_t byte, const kvx_cat_shard *rec);
/* Drops shard byte and every record of it (step 3). */
void kvx_cat_edit_drop_shard(kvx_cat_edit *e, uint32_t byte);
/* A usage record, replaced whole: hdr, then bits (copied; NULL: clear). */
int kvx_cat_edit_put_usage(kvx_cat_edit *e, uint32_t byte, const kvx_cat_usage *hdr, const uint8_t *bits);
/* Usage this handle gathered for shard generation use->gen, merged into
 * the record inside the transaction: nothing when byte's shard record is
 * absent or of another generation (the shard was replaced since); else
 * the stored record (of the same generation and size: its bits are
 * or-ed in, its hits added; the later last use wins) is rewritten. A
 * stored usage record whose own bytes are damaged starts over (usage is
 * advisory); a damaged shard record fails the edit. bits: (n_bits + 7) / 8
 * bytes, copied. */
int kvx_cat_edit_merge_usage(kvx_cat_edit *e, uint32_t byte, const kvx_cat_usage *use, const uint8_t *bits);
int kvx_cat_edit_add_block(kvx_cat_edit *e, uint32_t coord, uint64_t hash, uint64_t gen);
int kvx_cat_edit_del_block(kvx_cat_edit *e, uint32_t coord, uint64_t hash, uint64_t gen);
/* A block copied into another shard: removed at (from, from_gen), added at
 * (to, to_gen). */
int kvx_cat_edit_move_block(kvx_cat_edit *e, uint64_t hash, uint32_t from, uint64_t from_gen, uint32_t to,
                            uint64_t to_gen);
/* Adds delta to the stats (step 7); count_drops: the blocks dropped with
 * their shards count as evicted. Also writes zero stats where there are
 * none (a new catalog). */
void kvx_cat_edit_stats(kvx_cat_edit *e, const kvx_cat_stats *delta, int count_drops);
void kvx_cat_edit_next_gen(kvx_cat_edit *e, uint64_t next_gen);
void kvx_cat_edit_next_seq(kvx_cat_edit *e, uint64_t next_seq);

/* Applies e in one write transaction: all of it or nothing (a failure
 * leaves the catalog as it was). The map grows and the transaction runs
 * again on a full map. After the commit the registry follows (reset: all
 * of it cleared; drops: dead, the record kept; shard records put: live
 * with the record; the next generation) and e->out says what the drops
 * removed. 0, -EROFS (a
 * read-only catalog), KVX_ECORRUPT (a damaged record the edit had to read,
 * or a fault in the map), or another error. An empty edit commits
 * nothing. */
int kvx_cat_apply(kvx_catalog *cat, kvx_cat_edit *e);

#endif
