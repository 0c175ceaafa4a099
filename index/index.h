/*
 * index.h - the store's LMDB index (private to the store, not API).
 *
 * One LMDB environment per store directory (index/), opened once per
 * process and shared by every kvx_store handle of that directory: LMDB
 * forbids opening the same environment twice in one process (closing the
 * second one would drop the first one's locks). The environment is opened
 * with MDB_NOTLS so read transactions are not tied to OS threads (cgo).
 *
 * Databases and their records (native endianness; the index never leaves
 * the machine, and reindex rebuilds it from the shards' own tables):
 *   meta   "next_gen" -> u64; "stats" -> kvx_idx_stats
 *   shards u32 shard byte (MDB_INTEGERKEY) -> kvx_idx_shard
 *   coord  u32 coordinate (MDB_INTEGERKEY) -> kvx_idx_coord
 *   hash   u64 chained hash (MDB_INTEGERKEY, MDB_DUPSORT|MDB_DUPFIXED)
 *          -> kvx_idx_loc, one per stored block with that hash (several
 *          only on a hash collision with a different lineage)
 *   usage  u32 shard byte -> kvx_idx_usage + a bitmap of referenced entries
 *
 * Writers are serialized by LMDB's write lock (and, above it, by the
 * store's flock). MDB_MAP_FULL grows the map (doubling) and re-runs the
 * transaction body; MDB_MAP_RESIZED (another process grew it) adopts the
 * new size. Stale reader slots are cleared at open and when the reader
 * table is full.
 */
#ifndef KVX_INDEX_H
#define KVX_INDEX_H

#include "internal.h"

#include <lmdb.h>
#include <pthread.h>
#include <sys/types.h>

typedef struct kvx_idx_loc {
    uint32_t coord;
    uint32_t zero; /* always 0: dups compare as bytes */
    uint64_t gen;
} kvx_idx_loc;

typedef struct kvx_idx_coord {
    uint64_t hash;
    uint64_t gen;
} kvx_idx_coord;

typedef struct kvx_idx_shard {
    uint64_t gen;        /* file name: shards/<gen as 16 hex>.kvx */
    uint64_t file_bytes; /* size of the sealed file */
    uint64_t created_ns; /* CLOCK_REALTIME at publication */
    uint32_t n_entries;
    uint32_t flags; /* the shard's KVX header flags */
} kvx_idx_shard;

typedef struct kvx_idx_usage {
    uint64_t gen;
    uint64_t last_use_ns;
    uint64_t hits;
    uint32_t n_bits; /* bitmap bytes follow: (n_bits + 7) / 8 */
    uint32_t zero;
} kvx_idx_usage;

typedef struct kvx_idx_stats {
    uint64_t hits, misses, evictions, evicted_blocks, compactions, dropped_shards;
} kvx_idx_stats;

typedef struct kvx_index {
    MDB_env *env;
    MDB_dbi meta, shards, coord, hash, usage;
    int rdonly_env; /* opened MDB_RDONLY (directory not writable) */
    /* Read side held during every transaction; resizing the map takes the
     * write side (mdb_env_set_mapsize needs no live transaction). */
    pthread_rwlock_t resize;
    pthread_mutex_t pool_mu;
    MDB_txn *pool[64]; /* reset read transactions, renewed on demand */
    int npool;
    /* process-wide registry */
    dev_t dev;
    ino_t ino;
    int refs;
    struct kvx_index *next;
} kvx_index;

/* LMDB result -> kvx result (0, -errno or KVX_E*), with a message. */
int kvx_idx_err(int rc, const char *what);

/* Opens (or joins) the environment in directory path; create makes the
 * databases. nosync: MDB_NOSYNC (benchmarks only). */
int kvx_idx_open(kvx_index **out, const char *path, int create, int nosync);
void kvx_idx_close(kvx_index *ix);

/* A read transaction (from the pool); end it with kvx_idx_read_end. */
int kvx_idx_read_begin(kvx_index *ix, MDB_txn **out);
void kvx_idx_read_end(kvx_index *ix, MDB_txn *txn);

/* Runs body inside one write transaction and commits; re-runs it after
 * growing the map on MDB_MAP_FULL. body returns 0 or an error (abort). */
typedef int (*kvx_idx_body)(MDB_txn *txn, void *ctx);
int kvx_idx_write(kvx_index *ix, kvx_idx_body body, void *ctx);

/* Small typed helpers used inside transactions. */
int kvx_idx_get_u64(MDB_txn *txn, MDB_dbi dbi, const char *key, uint64_t *out); /* ENOTFOUND -> 0 value, rc 0 */
int kvx_idx_put_u64(MDB_txn *txn, MDB_dbi dbi, const char *key, uint64_t v);
int kvx_idx_get_stats(MDB_txn *txn, kvx_index *ix, kvx_idx_stats *out);
int kvx_idx_put_stats(MDB_txn *txn, kvx_index *ix, const kvx_idx_stats *st);
/* Adds a block: coord -> {hash, gen} and hash -> loc. */
int kvx_idx_add_block(MDB_txn *txn, kvx_index *ix, uint32_t coord, uint64_t hash, uint64_t gen);
/* Removes a block (both records); missing records are not an error. */
int kvx_idx_del_block(MDB_txn *txn, kvx_index *ix, uint32_t coord, uint64_t hash, uint64_t gen);
/* Removes every coord/hash record of shard byte b (whatever its gen). */
int kvx_idx_del_shard_blocks(MDB_txn *txn, kvx_index *ix, uint32_t b, uint64_t *out_removed);

#endif
