/*
 * store_internal.h - the kvx_store handle and the helpers shared by
 * store.c (open, recovery, lookups, stat, verify) and store_write.c (put,
 * flush, eviction, compaction, reindex). Not API. docs/STORE.md describes
 * the design these files implement.
 */
#ifndef KVX_STORE_INTERNAL_H
#define KVX_STORE_INTERNAL_H

#include "index/index.h"
#include "common/internal.h"
#include "format/format.h"

#include <errno.h>
#include <pthread.h>

#define ST_SLOTS 256
#define ST_KIND_LINEAGE 0 /* blocks put with their tokens */
#define ST_KIND_PLAIN 1   /* blocks put by hash only (envelope without tokens) */
#define ST_DEFAULT_CAPACITY ((uint64_t)64 << 30)
#define ST_CONFIG_BYTES 64
#define ST_COMPACT_AT 192 /* live shards before a flush merges small ones */
#define ST_COMPACT_SMALL 64 /* at most this many small shards (< target/2) before a flush merges them */
#define ST_SHARD_OVERHEAD (8u << 10) /* about a shard's header and padding */
#define ST_TARGET_DIV 64 /* default shard size: capacity / this (at least 512 KiB) */

typedef struct st_cache {
    uint64_t gen;
    kvx_shard *sh; /* one reference, owned by the cache */
    int bad;       /* the file is missing or failed validation */
} st_cache;

typedef struct st_use {
    uint64_t gen;
    uint64_t last_use;
    uint64_t hits;
    uint8_t *bits; /* referenced entries since the last persist */
    uint32_t nbits;
    int dirty;
} st_use;

/* Writer: per-entry last use (ns) of a shard's blocks: the writer's own
 * lookups, and the recency that carried or merged blocks bring along. The
 * persisted usage record only has a per-shard referenced bitmap and last
 * use; eviction prefers this finer view where it exists. */
typedef struct st_rec {
    uint64_t gen;
    uint64_t *last; /* 0: not known here */
    uint32_t n;
} st_rec;

typedef struct st_pblock {
    uint8_t digest[KVX_DIGEST_BYTES]; /* lineage blocks; zero for plain */
    uint64_t hash, parent;
    uint32_t coord;
    uint32_t kind;
    uint64_t gen;
    size_t tok; /* offset into ptok (B ids), SIZE_MAX when none */
    size_t next; /* chain in the pending hash table, SIZE_MAX ends */
} st_pblock;

typedef struct st_open {
    kvx_shard_writer *w;
    uint8_t byte;
    uint64_t gen;
    uint32_t flags;
    uint32_t cap;  /* entries reserved in its tables */
    uint32_t nunv; /* entries added without a digest (unverified) */
} st_open;

typedef struct st_sealed {
    uint8_t byte;
    uint64_t gen;
    uint32_t flags, n;
    uint64_t bytes;
    uint64_t last_use; /* for the usage record (compaction keeps the max) */
    uint32_t nunv;     /* entries without a digest */
} st_sealed;

struct kvx_store {
    char *dir, *shards_path, *staging_path, *index_path;
    int dirfd, shardsfd, stagingfd, lockfd;
    uint32_t flags;
    int writer;
    kvx_geometry g;
    uint64_t capacity, target, page_bytes, entry_bytes;
    uint32_t nscales, max_entries;
    kvx_index *ix;

    pthread_rwlock_t cache_lock;
    st_cache cache[ST_SLOTS];

    pthread_mutex_t use_mu;
    st_use use[ST_SLOTS];
    st_rec rec[ST_SLOTS]; /* writer only; under use_mu */
    uint64_t hits, misses, calls;

    /* writer state, under wmu */
    pthread_mutex_t wmu;
    kvx_idx_shard reg[ST_SLOTS];
    uint8_t reg_live[ST_SLOTS];
    st_open cur[2];
    st_sealed *sealed;
    size_t nsealed, capsealed;
    st_pblock *pend;
    size_t npend, cappend;
    uint32_t *ptok;
    size_t nptok, capptok;
    size_t *ptab; /* open hashing by hash: head index or SIZE_MAX */
    size_t ptab_n;
    uint64_t next_gen;
    uint64_t dropped;
    uint32_t reserve_hint; /* entries the next writer reserves (the put's size) */
    uint64_t carried;      /* blocks this handle carried forward (benchmarks) */
    /* shards holding blocks that puts since the last flush found already
     * held: the flush acknowledges those blocks too, so until it returns
     * no eviction, compaction or gc may drop them (writer, under wmu) */
    uint8_t pinned[ST_SLOTS];
    uint64_t pin_gen[ST_SLOTS];
    size_t batch_blocks;   /* blocks put since the last kvx_store_flush (the
                              unit a flush acknowledges), internal flushes
                              included */
    int index_live;        /* the index names next_gen (not lost or empty) */
    int index_missing;     /* index/ was not there at open */
    uint64_t quarantined;  /* files this handle moved to quarantine/ */
};

/* "%016llx.kvx" of gen into buf (32 bytes). */
void kvx_st_shard_name(char *buf, uint64_t gen);
uint64_t kvx_st_now_ns(void);
/* 1 and the generation when name is a shard file name. */
int kvx_st_parse_name(const char *name, uint64_t *gen);
/* 1 and the generation when name starts "<16 hex>.kvx" (anything may follow). */
int kvx_st_name_prefix_gen(const char *name, uint64_t *gen);
/* Calls fn for every entry of directory fd but . and .. */
typedef int (*st_dir_fn)(kvx_store *s, int dirfd, const char *name, void *ctx);
int kvx_st_each_file(kvx_store *s, int fd, st_dir_fn fn, void *ctx);

/* Is rc, from opening a shard file, a passing failure of this process
 * (EMFILE, EIO, ENOMEM, no free mapping-guard slot, ...) rather than a
 * verdict on the file (missing, malformed, wrong checksum)? A passing
 * failure must never get a shard dropped or deleted. */
static inline int st_open_transient(int rc)
{
    if (rc == 0 || rc == -ENOENT) return 0;
    if (rc > -30000) return 1; /* -errno */
    return rc == KVX_ECAPACITY || rc == KVX_EBUSY || rc == KVX_EMEMLOCK || rc == KVX_ECANCELED;
}

/* A new reference on the shard (byte, gen), opened lazily; NULL when it
 * cannot be opened (then marked bad, unless the failure was transient). */
kvx_shard *kvx_st_shard_get(kvx_store *s, uint32_t byte, uint64_t gen);
/* Forgets the cached handle of byte (drops the cache's reference). */
void kvx_st_cache_drop(kvx_store *s, uint32_t byte);

/* What a lookup asks for. With toks (and digest), only a verified block
 * whose hash, parent, B token ids and prefix digest all equal the query's
 * (DESIGN.md rule 1); without, any block holding the hash. */
typedef struct st_query {
    uint64_t hash, parent;
    const uint32_t *toks;
    const uint8_t *digest;
} st_query;

/* Looks a block up in txn: 0 and a view (its page CRC-checked), or
 * KVX_ENOTFOUND, KVX_EPAGECRC / KVX_ETRUNC (only damaged copies), or an
 * error. Every block holding the hash is tried. */
int kvx_st_lookup(kvx_store *s, MDB_txn *txn, const st_query *q, kvx_view *out);

/* Writer: the per-entry last-use array of shard (byte, gen) with n
 * entries, created (zeroed) or reset when gen changed; NULL on ENOMEM.
 * Call under use_mu. */
uint64_t *kvx_st_rec_get(kvx_store *s, uint32_t byte, uint64_t gen, uint32_t n);

/* Notes the n views' blocks as used now (referenced bit, last use); count:
 * also add them to the hit/miss counters (lookups; a put that finds its
 * block held only refreshes it). */
void kvx_st_note(kvx_store *s, const kvx_view *v, size_t n, uint64_t misses, int count);

/* Usage: writes this handle's batched counters and referenced bits. */
int kvx_st_usage_persist(kvx_store *s);
/* Reloads the registry mirror (writer). */
int kvx_st_registry_load(kvx_store *s);

/* store_recover.c: recovery (writer only), quarantine, adoption */
int kvx_st_recover(kvx_store *s);
/* Moves shards/<name> to quarantine/<name> (a numeric suffix on a clash,
 * never replacing a file) with the reason in <name>.why. Writer only. */
int kvx_st_quarantine(kvx_store *s, const char *name, const char *why);
/* Raises next_gen above every generation named in shards/, staging/ and
 * quarantine/ (a new shard never takes an existing file's name). */
int kvx_st_gen_floor(kvx_store *s);
/* Files in quarantine/ (not counting .why notes). */
uint64_t kvx_st_quarantine_count(kvx_store *s);
/* Entries of sh with a hash but no prefix digest (unverified). */
uint32_t kvx_st_count_unverified(const kvx_shard *sh);
/* kvx_st_register: a shard record and its empty usage record (in txn). */
int kvx_st_register(MDB_txn *txn, kvx_index *ix, const st_sealed *x);

/* store_write.c */
void kvx_st_discard_pending(kvx_store *s);
int kvx_st_flush_locked(kvx_store *s);
int kvx_st_enforce_capacity(kvx_store *s);
int kvx_st_compact(kvx_store *s, int full);
int kvx_st_reindex_locked(kvx_store *s);
int kvx_st_drop_bad_shards(kvx_store *s);

#endif
