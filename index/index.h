/*
 * index.h - the LMDB layer under the catalog: private to index/ (and to
 * white-box tests and benches, which may reach LMDB itself). The rest of
 * the library speaks to the catalog through index/catalog.h only.
 *
 * One LMDB environment per store directory (index/), opened once per
 * process and shared by every catalog handle of that directory: LMDB
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
 * The files of index/, each opening with the rule it keeps, in the order
 * they call each other (a file calls only files above it):
 *   errors.c       MDB codes stop here: every one becomes a kvx code
 *   records.c      record bytes: sizes, CRC-32C, encoders and decoders
 *   check.c        the damage checks before LMDB trusts data.mdb: meta
 *                  pages, the tree walk (LMDB's file layout lives here)
 *   env.c          the environment: registry, open/close, read pools and
 *                  snapshots, write transactions that grow the map, the
 *                  guard, the stale check
 *   catalog.c      the catalog handle, its registry, snapshot reads
 *   catalog_edit.c edits and their one write transaction
 *
 * Writers are serialized by LMDB's write lock (and, above it, by the
 * store's flock). MDB_MAP_FULL grows the map (doubling) and re-runs the
 * transaction body; MDB_MAP_RESIZED (another process grew it) adopts the
 * new size. Stale reader slots are cleared at open and when the reader
 * table is full.
 *
 * Read-only directories (DESIGN.md rule 3: a reader without write
 * permission, or on a read-only mount, works): a reader (create 0) whose
 * open fails with EACCES/EROFS gets a fresh environment opened MDB_RDONLY
 * (LMDB forbids a second mdb_env_open on an environment whose open
 * failed); when even that fails because lock.mdb cannot be opened or
 * created, a third one opened MDB_RDONLY | MDB_NOLOCK. Such a reader takes
 * no reader slot, so a writer running at the same time (possible only
 * where someone else may write the directory) may recycle pages it is
 * reading: it can see a damaged tree, which the guards turn into errors,
 * or stale records. Readers that can open lock.mdb always use it.
 *
 * A damaged index (DESIGN.md rule 4). LMDB trusts its file: no page
 * checksums, page numbers, flags, node offsets and sizes used as found.
 * So, for every environment a process opens (kvx_idx_open):
 *   1. before mdb_env_open, both meta pages of data.mdb are checked
 *      against the file (check.c, "meta pages");
 *   2. missing or empty data.mdb: only a writer (create) may start a new
 *      one; a reader gets KVX_ECORRUPT (and creates nothing);
 *   3. after mdb_env_open, inside a read transaction, the whole tree is
 *      walked once (check.c, "tree walk"): about 0.15 s for a 160 MB index
 *      of 2 million blocks;
 *   4. every record's (and key's) size and CRC-32C is checked before it is
 *      used (records.c);
 *   5. the LMDB map is registered with the mapping guard (sigbus.h) as a
 *      catalog range, and LMDB's assertion callback abandons a guarded
 *      body: every write transaction (body and commit) and kvx_idx_read /
 *      kvx_idx_guard bodies run under it, so a fault in the map or an LMDB
 *      assertion is KVX_ECORRUPT naming reindex instead of a dead process.
 *      Snapshot reads (catalog.c) run unguarded, as lookups always did: a
 *      fault there falls back to a zero page and poisons the map, and
 *      every later transaction of that environment is refused
 *      (KVX_ECORRUPT) until it is closed.
 * What stays outside: content the CRCs do not cover (a branch key out of
 * order makes a lookup miss), and damage made after open (the file
 * truncated or rewritten under a running process) meets only the guard;
 * a write transaction on a damaged but well-formed tree may propagate the
 * damage. Reindex is the cure.
 */
#ifndef KVX_INDEX_H
#define KVX_INDEX_H

#include "common/internal.h"

#include <lmdb.h>
#include <pthread.h>
#include <sys/types.h>

/* Record checksums (DESIGN.md rule 4: catalog records carry their own
 * CRC-32C, so a damaged record is a reported error, never a delete or a
 * wrong answer). Each crc field is the CRC-32C of the record (its key
 * included where the record alone does not name it) computed with the
 * field as 0, a result of 0 stored as 1. A record of another size or with
 * a crc that does not match (0 included: records written before the
 * checksums had it) is damaged. The encoders (kvx_idx_add_block, kvx_idx_put_shard, kvx_idx_put_usage,
 * kvx_idx_put_stats, kvx_idx_put_u64) fill it; the decoders and getters
 * check it and answer MDB_CORRUPTED on a mismatch. */
typedef struct kvx_idx_loc {
    uint32_t coord;
    uint32_t crc; /* of (hash key, coord, gen); dups compare as bytes */
    uint64_t gen;
} kvx_idx_loc;

typedef struct kvx_idx_coord {
    uint64_t hash;
    uint64_t gen;
    uint32_t crc; /* of (coordinate key, hash, gen) */
    uint32_t zero;
} kvx_idx_coord;

typedef struct kvx_idx_shard {
    uint64_t gen;        /* file name: shards/<gen as 16 hex>.kvx */
    uint64_t file_bytes; /* size of the sealed file */
    uint64_t created_ns; /* CLOCK_REALTIME at publication */
    uint32_t n_entries;
    uint32_t flags; /* the shard's KVX header flags */
    uint32_t crc;   /* of (byte key, record: 40 bytes, without ino, in the previous release's) */
    uint32_t n_unverified; /* entries without a prefix digest (with flags
                              lacking KVX_FLAG_DIGEST: every entry) */
    uint64_t ino; /* the file's inode number when it was registered (0: not
                     recorded, a record of an older release) */
} kvx_idx_shard;

typedef struct kvx_idx_usage {
    uint64_t gen;
    uint64_t last_use_ns;
    uint64_t hits;
    uint32_t n_bits; /* bitmap bytes follow: (n_bits + 7) / 8 */
    uint32_t crc;    /* of (byte key, header, bitmap) */
} kvx_idx_usage;

typedef struct kvx_idx_stats {
    uint64_t hits, misses, evictions, evicted_blocks, compactions, dropped_shards;
} kvx_idx_stats;

typedef struct kvx_index {
    MDB_env *env;
    MDB_dbi meta, shards, coord, hash, usage;
    int rdonly_env; /* opened MDB_RDONLY (directory not writable) */
    int nolock;     /* ... and MDB_NOLOCK (lock.mdb cannot be opened) */
    int nosync;     /* MDB_NOSYNC now: every handle of it asked for it */
    int lag;        /* MDB_NOSYNC now for the store's writer (kvx_idx_lag) */
    int guard_slot; /* the LMDB map's catalog slot (sigbus.h), -1: none */
    char *path;     /* the index directory */
    char *store;    /* the store directory (its parent), for messages */
    /* Read side held during every transaction; resizing the map takes the
     * write side (mdb_env_set_mapsize needs no live transaction). */
    pthread_rwlock_t resize;
    pthread_mutex_t pool_mu;
    MDB_txn *pool[64]; /* reset read transactions, renewed on demand */
    int npool;
    struct kvx_cat_snap *snaps[64]; /* idle snapshots, under pool_mu */
    int nsnaps;
    /* the data.mdb this environment reads: a reindex_dir replaces it, and
     * a handle opened before keeps reading the old file; read
     * transactions notice (within 100 ms) and answer KVX_ESTALE */
    dev_t db_dev;
    ino_t db_ino;
    int64_t next_check_ns; /* CLOCK_MONOTONIC_COARSE; racy reads are fine */
    /* benchmarks (bench_peers --mode trace): with count_io set, wrote adds
     * the bytes each kvx_idx_write's thread dirtied in the page cache
     * (/proc/thread-self/io write_bytes around it): the catalog's writes */
    int count_io;
    uint64_t wrote;
    /* process-wide registry */
    dev_t dev;
    ino_t ino;
    int refs;
    struct kvx_index *next;
} kvx_index;

/* LMDB result -> kvx result (0, -errno or KVX_E*), with a message. A
 * damage code (MDB_CORRUPTED, MDB_PAGE_NOTFOUND, ...) becomes KVX_ECORRUPT
 * whose message says to run `kvx store reindex`. kvx_idx_errp names the
 * index file and the store directory too. A kvx code passes through. */
int kvx_idx_err(int rc, const char *what);
int kvx_idx_errp(const kvx_index *ix, int rc, const char *what);
/* KVX_ECORRUPT: "index DIR/index/data.mdb: <what>: run 'kvx store
 * reindex DIR'" (DIR: the index directory's parent). */
int kvx_idx_damaged(const kvx_index *ix, const char *fmt, ...) KVX_PRINTF(2, 3);

/* Checks the two LMDB meta pages of path/data.mdb (see 1. and 2. above)
 * without opening the environment: 0, KVX_ECORRUPT naming the field, or
 * -errno. A missing or empty file is 0 when create, else KVX_ECORRUPT.
 * store_dir (nullable) is named in the message. */
int kvx_idx_check_file(const char *path, const char *store_dir, int create);

/* Opens (or joins) the environment in directory path; create makes the
 * databases. nosync: MDB_NOSYNC (benchmarks only); one environment is
 * shared by the process's handles of a store, and syncs from the moment
 * one handle did not ask for nosync (its commits are durable when it
 * acknowledges them), for as long as it lives. A new environment of
 * this process is checked first (1. to 3. above): KVX_ECORRUPT naming
 * reindex when damaged, KVX_EBUSY when a writer kept committing through
 * the walk. */
int kvx_idx_open(kvx_index **out, const char *path, int create, int nosync);
void kvx_idx_close(kvx_index *ix);
/* on: the environment's commits skip LMDB's syncs (MDB_NOSYNC) until
 * called with off, which turns syncing back on (unless every handle asked
 * for nosync) and then syncs the file (mdb_env_sync, forced): 0 once
 * every commit made before is durable. A power cut between the two may
 * leave data.mdb torn (LMDB keeps its integrity only with its syncs): the
 * store's writer marks the time durably first (engine/store_lag.c). */
int kvx_idx_lag(kvx_index *ix, int on);

/* A read transaction (from the pool); end it with kvx_idx_read_end, in the
 * same thread. Refused (KVX_ECORRUPT) once the map is poisoned (see 5.
 * above), KVX_ESTALE once data.mdb was replaced. Reads inside it are not
 * guarded unless run through kvx_idx_guard. */
int kvx_idx_read_begin(kvx_index *ix, MDB_txn **out);
void kvx_idx_read_end(kvx_index *ix, MDB_txn *txn);

/* Body of a guarded catalog read or of a write transaction: returns 0 or an
 * error (an LMDB code or a kvx code). A read body is abandoned where a
 * read faults: it must take no lock and keep no allocation it cannot
 * lose (cursors it opened leak then; that is all). */
typedef int (*kvx_idx_body)(MDB_txn *txn, void *ctx);
/* Runs body in a read transaction of its own under the guard: body's
 * result (LMDB codes turned into kvx codes by kvx_idx_errp), or
 * KVX_ECORRUPT naming reindex when a read faulted in the map. */
int kvx_idx_read(kvx_index *ix, kvx_idx_body body, void *ctx);
/* The same inside a transaction the caller holds (read or write). */
int kvx_idx_guard(kvx_index *ix, MDB_txn *txn, kvx_idx_body body, void *ctx);

/* Runs body inside one write transaction and commits; re-runs it after
 * growing the map on MDB_MAP_FULL. body returns 0 or an error (abort).
 * Body and commit run under the guard: a fault in the map aborts the
 * transaction and returns KVX_ECORRUPT naming reindex. */
int kvx_idx_write(kvx_index *ix, kvx_idx_body body, void *ctx);
/* The commit's seam, for tests only (as common/os.h's is for the OS
 * calls): when set, called before each write transaction's commit; a
 * non-zero errno from it aborts the transaction instead, and the write
 * fails as a commit LMDB could not make durable (EIO from its fdatasync)
 * does. LMDB's own I/O is outside the OS seam, so this is how a test
 * fails a catalog commit at a chosen step. NULL (always, in use). */
extern int (*kvx_idx_commit_fault)(void);

/* Small typed helpers used inside transactions (records.c). The getters
 * return 0, an LMDB code (MDB_CORRUPTED for a record of the wrong size or
 * CRC: kvx_idx_err makes it KVX_ECORRUPT naming reindex) or, for the ones
 * that say so, a kvx code with its message. */
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

/* Typed record access: each checks the key's and the record's size before
 * reading a byte of it, and copies the record out (never hands out a
 * pointer into the map). Returns 0, MDB_NOTFOUND (absent), or
 * MDB_CORRUPTED (a key or record of the wrong size, or a CRC mismatch). */
/* shards: u32 shard byte -> kvx_idx_shard */
int kvx_idx_get_shard(MDB_txn *txn, const kvx_index *ix, uint32_t byte, kvx_idx_shard *out);
/* Writes shard record byte (its crc filled in). */
int kvx_idx_put_shard(MDB_txn *txn, kvx_index *ix, uint32_t byte, const kvx_idx_shard *rec);
/* Writes usage record byte: hdr (crc filled in) then nbytes of bitmap
 * (bits NULL: nbytes zero bytes). */
int kvx_idx_put_usage(MDB_txn *txn, kvx_index *ix, uint32_t byte, const kvx_idx_usage *hdr, const uint8_t *bits,
                      size_t nbytes);
/* 1 when the hash database holds (hash -> coord, gen), 0 when not, or an
 * LMDB error. cur (nullable): a cursor on the hash database to use. */
int kvx_idx_has_loc(MDB_txn *txn, kvx_index *ix, uint64_t hash, uint32_t coord, uint64_t gen);
int kvx_idx_has_loc_cur(MDB_cursor *cur, uint64_t hash, uint32_t coord, uint64_t gen);
/* coord: u32 coordinate -> kvx_idx_coord */
int kvx_idx_get_coord(MDB_txn *txn, const kvx_index *ix, uint32_t coord, kvx_idx_coord *out);
/* usage: u32 shard byte -> kvx_idx_usage + bitmap. The bitmap's bytes
 * ((n_bits + 7) / 8, exactly what follows the header) are copied into
 * bits when bits_cap is large enough (bits may be NULL to skip them);
 * *out_bits_len (nullable) gets their number. */
int kvx_idx_get_usage(MDB_txn *txn, const kvx_index *ix, uint32_t byte, kvx_idx_usage *out, uint8_t *bits,
                      size_t bits_cap, size_t *out_bits_len);
/* Decoders for records a cursor returned (k and v as mdb_cursor_get gave
 * them); the same size checks. */
int kvx_idx_dec_shard(const MDB_val *k, const MDB_val *v, uint32_t *out_byte, kvx_idx_shard *out);
int kvx_idx_dec_coord(const MDB_val *k, const MDB_val *v, uint32_t *out_coord, kvx_idx_coord *out);
int kvx_idx_dec_loc(const MDB_val *k, const MDB_val *v, uint64_t *out_hash, kvx_idx_loc *out);
int kvx_idx_dec_usage(const MDB_val *k, const MDB_val *v, uint32_t *out_byte, kvx_idx_usage *out);

/* ------------------------------------------- between the files of index/ */

/* A read snapshot (catalog.h): a read transaction and a cursor on the hash
 * database, kept (reset) in the environment's pool between uses. */
struct kvx_cat_snap {
    kvx_index *ix;
    MDB_txn *txn;     /* live while in use; reset while idle; NULL after a pool flush */
    MDB_cursor *hcur; /* on the hash database, renewed per use */
    int hcur_ready;   /* bound to txn */
    int pos_ok;       /* hcur rests on location pos_i of pos_hash */
    uint64_t pos_hash;
    size_t pos_i;
};
typedef struct kvx_cat_snap kvx_cat_snap;

/* check.c: walks the tree of the snapshot txn reads (3. above): 0,
 * KVX_ECORRUPT naming the page, another error; *again set (and 0) when
 * commits rewrote the snapshot's meta page meanwhile (walk a newer one). */
int kvx_idx_walk(kvx_index *ix, MDB_txn *txn, int *again);
/* check.c: where LMDB mapped data.mdb (found from a key the main tree
 * hands out): 0, or -1 when it cannot be told (the map stays unguarded). */
int kvx_idx_map_base(kvx_index *ix, const uint8_t **out);
/* env.c: a snapshot from the pool (its transaction renewed), refused like
 * kvx_idx_read_begin; kvx_idx_snap_end in the same thread. */
int kvx_idx_snap_begin(kvx_index *ix, kvx_cat_snap **out);
void kvx_idx_snap_end(kvx_cat_snap *snap);
/* catalog.c: the environment under a catalog handle (white-box tests and
 * benches reach LMDB through it), and its registry for catalog_edit.c. */
struct kvx_catalog;
struct kvx_cat_registry;
kvx_index *kvx_cat_index(const struct kvx_catalog *cat);
struct kvx_cat_registry *kvx_cat_registry_mut(struct kvx_catalog *cat);

#endif
