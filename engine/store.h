/*
 * engine/store.h - the kvx_store handle and the store's private interface,
 * not API. docs/STORE.md describes the design.
 *
 * The store is cut by job, one file each, and a file calls only the files
 * listed before it here (scripts/check-layers.sh checks that the calls
 * between them have no cycle):
 *   store_config.c   STORE file, geometry, derived sizes, writer check
 *   store_names.c    file names, directory walks, generations, quarantine
 *   store_cache.c    shard cache, the catalog's registry
 *   store_holes.c    the free log and the pages it frees (holes)
 *   store_usage.c    usage batching and persistence, recency
 *   store_tier.c     the shared tier: DIR/TIER, the client, write-behind,
 *                    counters (tier/ does the network and the bytes)
 *   store_lookup.c   lookups and views (kvx_store_get*, prefix)
 *   store_export.c   kvx_views_export
 *   store_inspect.c  stat, shards, verify
 *   store_writers.c  shard writers and seals
 *   store_rewrite.c  copying blocks into new shards
 *   store_policy.c   eviction and compaction decisions (pure functions)
 *   store_maint.c    eviction, compaction, dropping shards
 *   store_gc.c       gc: salvage, headless chains
 *   store_migrate.c  a store of the previous release (STORE version 1, 2)
 *                    rewritten into this release's at its first writer open
 *   store_commit.c   a commit's files, and a keyed commit's superseded copies
 *   store_batch.c    write batches: put and flush
 *   store_keyed.c    keyed pages: put, get, exists, the owner's delete
 *   store_prefix.c   kvx_store_prefix: local, then the shared tier
 *   store_plan.c     recovery's plan: every file's fate, computed, nothing changed
 *   store_apply.c    recovery and reindex: a plan carried out
 *   store_open.c     create, open, close, reindex_dir
 *   store_collect.c  kvx_warmup_collect (public API only)
 * Each file opens with the rule it keeps.
 */
#ifndef KVX_ENGINE_STORE_H
#define KVX_ENGINE_STORE_H

#include "common/internal.h"
#include "format/format.h"
#include "format/free_log.h"
#include "index/catalog.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#define ST_SLOTS 256
#define ST_KIND_LINEAGE 0 /* blocks put with their tokens */
#define ST_KIND_PLAIN 1   /* blocks put by hash only (envelope without tokens) */
#define ST_DEFAULT_CAPACITY ((uint64_t)64 << 30)
#define ST_CONFIG_BYTES 64
/* The STORE file's format version: 3 = sequence numbers and tombstones.
 * 1 and 2 (the previous release: one u32, 1 blocks or 2 keyed) are
 * migrated at the first writer open. */
#define ST_STORE_VERSION 4
/* The first version with sequence numbers: 3 needs no rewrite to become 4
 * (4 only marks a store that may hold an active shard, so that a release
 * before appends refuses it instead of misreading it), 1 and 2 do. */
#define ST_STORE_SEQ_VERSION 3
/* A store a writer with KVX_STORE_HOLES opened: it may hold a free log
 * (DIR/FREED) and punched pages, which a release before holes would take
 * for damage, so it refuses the store instead. Only such a writer's open
 * raises a store to it; no open lowers it. */
#define ST_STORE_HOLES_VERSION 5
#define ST_STORE_BLOCKS 0 /* the STORE file's kind field */
#define ST_STORE_KEYED 1
#define ST_COMPACT_AT 192 /* live shards before a flush merges small ones */
/* at most this many small shards (< target/2) before a flush merges them.
 * A merge writes every block a second time, so it waits until ids run low
 * or headers cost 1 % of the capacity: at 64 (the old cap) a store flushed
 * once a prompt rewrote each block soon after writing it (2x the bytes of
 * a durable put; bench_peers' put row), for no gain but fewer files. (The
 * Mooncake trace replay, a store at its capacity, is unchanged: 20.01 %
 * hits and 3.41 GB written against 20.00 % and 3.44 GB at 64.) */
#define ST_COMPACT_SMALL 192
#define ST_SHARD_OVERHEAD (8u << 10) /* about a shard's header and padding */
#define ST_TARGET_DIV 64 /* default shard size: capacity / this (at least 512 KiB) */

/* Why a shard file was written (kvx_store's wrote[]): a flush's new
 * blocks (and a keyed store's tombstones), eviction's carry, compaction's
 * merge, anything else (gc's salvage, a migration). */
enum { ST_WROTE_PUT, ST_WROTE_CARRY, ST_WROTE_MERGE, ST_WROTE_OTHER, ST_WROTE_N };

typedef struct st_cache {
    uint64_t gen;
    kvx_shard *sh; /* one reference, owned by the cache */
    int bad;       /* the file is missing or failed validation */
    char why[240]; /* bad: the verdict, for quarantine/'s note */
    /* handles the cache let go of while views still held them (a store
     * that frees pages in place keeps them, one reference each, so a punch
     * can see those views: store_holes.c); NULL otherwise */
    kvx_shard **retired;
    size_t nretired, capretired;
} st_cache;

/* The free log's rows that free a live entry (store_holes.c), sorted by
 * (gen, entry); under wmu. */
typedef struct st_freed_row {
    uint64_t gen;
    uint32_t entry;
    uint32_t punched; /* its extent is freed (this handle punched it) */
    uint64_t bytes;   /* the extent's bytes */
} st_freed_row;

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
    int active;    /* w is the store's active shard's (s->act.w), not the batch's own */
} st_open;

/* The store's active shard (store_active.c): one file of the lineage kind
 * that grows by appends, each flush's blocks one journal record, until it
 * is full or the writer closes, when it is sealed in place. One batch at a
 * time owns it (its unflushed blocks are in it); the others write their
 * own files meanwhile. Under wmu. */
typedef struct st_active {
    kvx_shard_writer *w;     /* NULL: none open */
    uint8_t byte;
    uint64_t gen, ino;
    uint64_t created_ns;     /* its catalog record's, from its first append */
    struct kvx_store_batch *owner; /* the batch whose unflushed blocks it holds, or NULL */
    uint32_t nunv;           /* appended entries without a digest */
    int registered;          /* the catalog names it (its first append committed) */
    int committed;           /* the owner's flush appended (until it is released) */
    uint32_t nunv_pending;   /* the owner's entries without a digest, not yet appended */
    uint32_t nunv_commit;    /* of that append, the entries without a digest */
} st_active;

typedef struct st_sealed {
    uint8_t byte;
    uint64_t gen;
    uint32_t flags, n;
    uint64_t bytes;
    uint64_t last_use; /* for the usage record (compaction keeps the max) */
    uint32_t nunv;     /* entries without a digest */
    /* a batch's sealed file waits in staging/ under this name until its
     * flush publishes it (kvx_st_link_files, the commit, then
     * kvx_st_unstage_files); "" = only in shards/ */
    char staged[96];
    int linked; /* staged, and also named shards/<gen>.kvx (a flush under way) */
    /* a batch's full writer, parked unsealed until the batch's flush gives
     * its entries their sequence number (kvx_st_seal_parked); NULL once
     * sealed. bytes and n are the writer's so far. */
    kvx_shard_writer *w;
    uint64_t ino; /* the sealed file's inode number (its catalog record keeps it) */
} st_sealed;

/* A write batch: the blocks put since its last flush, which that flush
 * acknowledges, and nothing else (kvx_store_batch in kvx.h). A writer
 * handle has a built-in one (kvx_store_put / kvx_store_flush) and any
 * number the callers made; all live ones are on the store's list, and
 * every rule about unflushed blocks (shard bytes taken, pins, capacity
 * while a put runs, reindex) looks at all of them. Under the store's wmu. */
struct kvx_store_batch {
    kvx_store *s; /* NULL once kvx_store_close detached it */
    kvx_store_batch *prev, *next;
    st_open cur[2]; /* open writers, by kind (ST_KIND_*) */
    st_sealed *sealed; /* sealed (durable, in staging/) but unpublished */
    size_t nsealed, capsealed;
    st_pblock *pend;
    size_t npend, cappend;
    uint32_t *ptok;
    size_t nptok, capptok;
    size_t *ptab; /* open hashing by hash: head index or SIZE_MAX */
    size_t ptab_n;
    uint32_t reserve_hint; /* entries the next writer reserves (the put's size) */
    /* shards holding blocks that puts since the last flush found already
     * held, and shards a flush inside a put published: the caller's flush
     * acknowledges those blocks too, so until it returns no eviction,
     * compaction or gc may drop them */
    uint8_t pinned[ST_SLOTS];
    uint64_t pin_gen[ST_SLOTS];
    size_t batch_blocks; /* blocks put since the last caller's flush (the
                            unit a flush acknowledges), internal flushes
                            included */
    size_t ok_pend;      /* of pend, the blocks earlier successful puts
                            added (a failure that drops them must say so) */
    uint64_t lost;       /* blocks of successful puts dropped since the last
                            caller's flush, which then answers KVX_EDROPPED */
    char lost_why[256];  /* the failure that dropped the first of them */
    int whole;           /* all or nothing (a tl.kv.v1 stream's batch): never
                            published before the caller's flush; a put that
                            would need an early flush fails instead */
    int no_tier;         /* blocks copied from the shared tier: not written back */
    /* a tl.kv.v1 lease (kvx_xfer_has_blocks, kvx_st_lease_begin): its pins
     * and every other lease's share a budget (kvx_st_lease_budget), so
     * leases renewed for ever cannot keep the store over its capacity */
    int lease;
};

struct st_tier; /* store_tier.c */

struct kvx_store {
    char *dir, *shards_path, *staging_path, *index_path;
    int dirfd, shardsfd, stagingfd, lockfd;
    uint32_t flags;
    int writer;
    kvx_geometry g;
    uint64_t capacity, target, page_bytes, entry_bytes;
    uint32_t version; /* the STORE file's format version (ST_STORE_VERSION
                         once migrated) */
    int keyed; /* a keyed store (STORE kind 1, geometry.block_tokens 0):
                  page_bytes is then the largest page, not every page's size */
    uint32_t nscales, max_entries;
    kvx_catalog *cat;
    /* what the catalog names (the catalog's registry: it follows every
     * edit this handle applies; reloaded by kvx_st_registry_load). Read by
     * the writer, under wmu. */
    const kvx_cat_registry *reg;

    pthread_rwlock_t cache_lock;
    st_cache cache[ST_SLOTS];

    pthread_mutex_t use_mu;
    st_use use[ST_SLOTS];
    st_rec rec[ST_SLOTS]; /* writer only; under use_mu */
    uint64_t hits, misses, calls;

    /* writer state, under wmu */
    pthread_mutex_t wmu;
    kvx_store_batch own;      /* the built-in batch of kvx_store_put/flush */
    kvx_store_batch *batches; /* every live batch, own first */
    uint64_t next_gen;
    st_active act;
    int act_stuck; /* a failed commit's record could not be cut (kvx_st_active_undo): flushes refused */
    /* the sequence number the next commit takes (DESIGN.md "The files are
     * the whole truth"): every entry a commit writes carries it in its
     * file's sequence table; a keyed delete is a tombstone entry with its
     * own. Above every number in the files (recovery raises it). */
    uint64_t next_seq;
    uint64_t dropped;
    int evict_cold_only; /* kvx_st_evict takes only shards whose every block
                            is below the cut, and carries nothing (set by
                            kvx_st_evict_for_ids for its first pass) */
    uint64_t carried;      /* blocks this handle carried forward (benchmarks) */
    /* bytes of the shard files this handle wrote, by why (benchmarks:
     * bench_peers --mode trace prints the split): pages, the pages' bytes
     * added; files, the sealed files' whole sizes (pages, tables, records,
     * header and padding). Under wmu. */
    struct {
        uint64_t pages, files;
    } wrote[ST_WROTE_N];
    /* what evictions removed, not yet taken (kvx_store_evicted): a ring
     * of ev_n from ev_head, growing up to KVX_EVICTED_MAX; under ev_mu */
    pthread_mutex_t ev_mu;
    kvx_evicted *evq;
    size_t ev_head, ev_n, ev_cap;
    size_t ev_max; /* KVX_EVICTED_MAX (white-box tests lower it) */
    uint64_t ev_dropped;
    int index_live;        /* the index names next_gen (not lost or empty) */
    int index_missing;     /* index/ was not there at open */
    /* active files the last kvx_st_active_recover set aside / removed
     * (blank: never held a record), added to `recovery` */
    uint64_t act_quarantined, act_deleted;
    /* kvx_store_reindex_dir's handle: its recovery does not evict (no
     * caller could ask kvx_store_evicted; the next writer's open does) */
    int no_open_evict;
    int lagging;           /* the writer's catalog commits skip LMDB's syncs:
                              its mark DIR/UNSYNCED is durable (store_lag.c) */
    int lag_found;         /* at open: 1 a mark of this boot, 2 one of an
                              earlier boot (index/ set aside), 0 none */
    uint64_t quarantined;  /* files this handle moved to quarantine/ */
    char qnote[1024];      /* " <name> (<reason>);" of each, since gc cleared it */
    kvx_recovery_report recovery; /* what this writer's open, or its last reindex, did */
    struct st_tier *tier;  /* the shared tier, NULL when none (store_tier.c) */
    /* holes (store_holes.c, docs/APPENDS.md "Holes"): whether this writer
     * frees evicted pages in place (KVX_STORE_HOLES); the free log DIR/FREED
     * (fd -1 when none is open) and what it frees; the bytes it frees in
     * each live shard; readers_fd, DIR/READERS (read-only handles of other
     * processes hold a shared flock on it while open). Under wmu. */
    int holes;
    int holes_new_store; /* kvx_store_create's handle: no reader can have opened before DIR/READERS */
    int free_fd, readers_fd;
    kvx_free_log flog;
    st_freed_row *freed;
    size_t nfreed, capfreed;
    uint64_t freed_bytes[ST_SLOTS];
    uint64_t punched, punch_deferred; /* pages this handle punched; punches put off (views held) */
    /* raised after every free's catalog commit, before its punch: a lookup
     * whose views were taken across a raise looks again (store_lookup.c) */
    _Atomic uint64_t free_seq;
    /* the readers' locks' keeper: every shard handle this store opens
     * holds it, so the locks outlive the store while a view does */
    struct st_view_locks *vlocks;
};

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

/* What a lookup asks for. With toks (and digest), only a verified block
 * whose hash, parent, B token ids and prefix digest all equal the query's
 * (DESIGN.md rule 1); without, any block holding the hash. */
typedef struct st_query {
    uint64_t hash, parent;
    const uint32_t *toks;
    const uint8_t *digest; /* a keyed page's: SHA-256 of its key */
    const uint8_t *key;    /* a keyed page: every hit compares the whole key */
    uint32_t key_len;
    uint32_t page_len;     /* a keyed put: the page's own length */
    void *dst;             /* a read into the caller's memory (kvx_store_keyed_read): */
    size_t dst_cap;        /* the view's page is dst, read and checked there */
    int no_page;           /* the entry alone (kvx_store_keyed_contains): a view of page NULL */
    int verify_page;       /* the page's CRC-32 now, not once per handle (a keyed put's held check) */
} st_query;

/* ------------------------------------------------------------------ */

/* store_config.c */
uint64_t kvx_st_now_ns(void);
/* The STORE file (docs/FORMAT.md "STORE file"): encode writes this
 * release's format version; decode reads it and the previous release's
 * (1 blocks, 2 keyed: migrated at the first writer open, store_migrate.c),
 * the version into *out_version (nullable). */
void kvx_st_config_encode(uint8_t *b, const kvx_geometry *g, uint64_t cap, uint64_t target, uint32_t version);
int kvx_st_config_decode(const uint8_t *b, kvx_geometry *g, uint64_t *cap, uint64_t *target, uint32_t *out_version);
/* KVX_EINVALID / KVX_EQUANT / KVX_EOVERFLOW naming the field. */
int kvx_st_check_geometry(const kvx_geometry *g);
/* Page, entry and per-shard sizes from s->g and s->target. */
void kvx_st_sizes(kvx_store *s);
/* KVX_EINVALID unless s is a writer handle (fn names the caller). */
/* A keyed call (keyed 1) on a block store, or a block call on a keyed
 * store: KVX_EINVALID naming the store. */
int kvx_st_kind_check(const kvx_store *s, int keyed, const char *fn);
/* A file of the store directory (STORE, LOCK, TIER and their temporary
 * names), opened at s->dirfd without following a symlink or blocking on a
 * FIFO, and only when it is a regular file (a FIFO planted as STORE hung
 * every open): 0 with *out_fd, KVX_EPATH naming the file and its type, or
 * -errno with a message (store_names.c). */
int kvx_st_open_file(kvx_store *s, const char *name, int flags, mode_t mode, int *out_fd);
int kvx_st_writer_check(kvx_store *s, const char *fn);
/* The header flags of a shard of kind (ST_KIND_*). */
uint32_t kvx_st_kind_flags(const kvx_store *s, int kind);

/* store_names.c */
/* "%016llx.kvx" of gen into buf (32 bytes). */
void kvx_st_shard_name(char *buf, uint64_t gen);
/* "a/b" in a new malloc'd string, NULL on ENOMEM. */
char *kvx_st_join(const char *a, const char *b);
/* 1 and the generation when name is a shard file name. */
int kvx_st_parse_name(const char *name, uint64_t *gen);
/* 1 and the generation when name starts "<16 hex>.kvx" (anything may follow). */
int kvx_st_name_prefix_gen(const char *name, uint64_t *gen);
/* Calls fn for every entry of directory fd but . and .. */
typedef int (*st_dir_fn)(kvx_store *s, int dirfd, const char *name, void *ctx);
int kvx_st_each_file(kvx_store *s, int fd, st_dir_fn fn, void *ctx);
/* The active shard (store_active.c, docs/STORE.md "Appends"): the name
 * ".<gen 16 hex>.<byte 2 hex>.kvx.active" in shards/ (ST_ACTIVE_NAME_MAX
 * bytes with its NUL), parsed back (1 and gen, byte; 0: not one); the
 * parameters its journal is laid out and named by (the lineage kind's
 * flags, the store's reserve, its name as identity). */
#define ST_ACTIVE_NAME_MAX 40
void kvx_st_active_name(char *buf, uint64_t gen, uint32_t byte);
int kvx_st_parse_active_name(const char *name, uint64_t *gen, uint32_t *byte);
void kvx_st_active_params(const kvx_store *s, uint32_t byte, uint64_t gen, kvx_active_params *p);
/* Opens shard (byte, gen): shards/<gen>.kvx, or else its active file, or
 * else (sealed between the two) the sealed name again. name (cap bytes,
 * nullable): the name last tried. kvx_shard_open_at's results. */
int kvx_st_open_gen(kvx_store *s, uint32_t byte, uint64_t gen, kvx_shard **out, char *name, size_t cap);
/* Unlinks shards/<gen>.kvx (a file the catalog does not name). */
void kvx_st_unlink_shard(kvx_store *s, uint64_t gen);
/* Moves shards/<name> to quarantine/<name> (a numeric suffix on a clash,
 * never replacing a file) with the reason in <name>.why. Writer only. */
int kvx_st_quarantine(kvx_store *s, const char *name, const char *why);
/* Is name one kvx gives a file in quarantine/ (<16 hex>.kvx, or with a
 * numeric suffix ".<k>" on a clash)? Anything else there is not kvx's:
 * never counted, never removed. */
int kvx_st_quarantine_name(const char *name);
/* kvx's files in quarantine/ (not counting .why notes), and their bytes
 * held on disk (store_quarantine.c). */
uint64_t kvx_st_quarantine_count(kvx_store *s, uint64_t *bytes);
/* quarantine/'s retention (docs/STORE.md "Quarantine"): at most a quarter
 * of the capacity in bytes and ST_QUARANTINE_FILES files; past either,
 * recovery, gc and every drop that quarantines remove the oldest first. */
#define ST_QUARANTINE_FILES 64
static inline uint64_t kvx_st_quarantine_max_bytes(const kvx_store *s) { return s->capacity / 4; }
/* Applies the retention now (store_plan.c): 0 or the first failure. */
int kvx_st_quarantine_retain(kvx_store *s);

/* store_cache.c */
/* Is sh one of this store's shards: its model and geometry, a chained-hash
 * table, and every entry i at coordinate (its shard byte, i, 0)? 0, or
 * KVX_EMODEL / KVX_ESHAPE / KVX_EFORMAT / KVX_ECORRUPT with the reason in
 * why (a verdict on the file). */
int kvx_st_shard_ours(const kvx_store *s, const kvx_shard *sh, char *why, size_t cap);
/* A new reference on the shard (byte, gen), opened lazily; NULL when it
 * cannot be opened (then marked bad, unless the failure was transient). */
kvx_shard *kvx_st_shard_get(kvx_store *s, uint32_t byte, uint64_t gen);
/* kvx_st_shard_get, and once more with a fresh handle when the cached one
 * holds fewer than min_entries (an active shard grown since it opened). */
kvx_shard *kvx_st_shard_get_n(kvx_store *s, uint32_t byte, uint64_t gen, uint32_t min_entries);
/* Forgets the cached handle of byte if it is still sh (an active shard's
 * handle that grew stale: its file has entries the handle has not). */
void kvx_st_cache_stale(kvx_store *s, uint32_t byte, const kvx_shard *sh);
/* Forgets the cached handle of byte (drops the cache's reference). */
void kvx_st_cache_drop(kvx_store *s, uint32_t byte);
/* Entries of sh with a hash but no prefix digest (unverified). */
uint32_t kvx_st_count_unverified(const kvx_shard *sh);
/* Reloads the catalog's registry, then next_gen (above every generation
 * the catalog names) and index_live. */
int kvx_st_registry_load(kvx_store *s);
/* A store's shard (shards/<name>, header flags) written before the prefix
 * digest (lineage without a digest table): KVX_EVERSION naming the file
 * and the fix (recreate the store), else 0. Such stores are refused, by
 * writers and readers alike; the format still reads the file. */
int kvx_st_refuse_predigest(const kvx_store *s, const char *name, uint32_t flags);
/* The same for every shard the registry names. */
int kvx_st_registry_refuse_predigest(const kvx_store *s);
/* Adds sealed shard x to edit e: its record and an empty usage record. */
int kvx_st_register(kvx_cat_edit *e, const st_sealed *x);

/* store_holes.c (docs/APPENDS.md "Holes") */
/* One page to free: its shard (byte, generation), entry, hash and its
 * extent's bytes. */
typedef struct st_free_page {
    uint64_t gen, hash, bytes;
    uint32_t entry;
    uint32_t byte;
} st_free_page;
/* Is entry of shard gen freed by the free log (a miss, never damage)?
 * Writer handles (the rows kvx_st_holes_load kept). */
int kvx_st_freed(const kvx_store *s, uint64_t gen, uint32_t entry);
/* A live shard's bytes on disk as the capacity counts them: its file's,
 * less its freed pages'. */
uint64_t kvx_st_live_bytes(const kvx_store *s, uint32_t b);
/* The bytes the free log frees (its rows checked as at open, each page
 * rounded up to 4096) in the shards reg names: 0 without a log. */
int kvx_st_freed_bytes_read(kvx_store *s, const kvx_cat_registry *reg, uint64_t *out);
/* Writer open, after the plan (and a reindex's rebuild): the free log's
 * rows; entries the catalog still names leave it (a free whose catalog
 * commit was lost: counted in the evicted blocks when count_cut); the log
 * rewritten when it holds rows of files gone or a torn tail; DIR/READERS
 * made when this writer frees pages. */
int kvx_st_holes_load(kvx_store *s, int count_cut);
void kvx_st_holes_close(kvx_store *s);
/* Is shard (b, gen) sound: it opens and every page passes its CRC (a page
 * the free log frees counts as sound)? Only sound blocks are ever deleted
 * (DESIGN.md rule 2). 1 sound, 0 damaged
 * (why filled), -1 cannot tell now (a passing failure). */
int kvx_st_shard_sound(kvx_store *s, uint32_t b, uint64_t gen, char *why, size_t cap);
/* A read-only handle: a shared lock on DIR/READERS for its life. */
int kvx_st_readers_join(kvx_store *s);
/* The locks that keep punches from under this store's views (a reader's
 * shared flocks on DIR/READERS and shards/) must last as long as any view
 * does, and a view may outlive kvx_store_close (kvx.h). So the store and
 * each shard handle it opens hold one keeper (kvx_st_vlocks_new at
 * allocation, kvx_st_vlocks_attach on each open); at close,
 * kvx_st_vlocks_keep hands it the store's two lock descriptors (a
 * writer's first taking those shared locks too, so a later writer cannot
 * punch under its views) and lets go of the store's hold: the descriptors
 * are closed, and the locks released, when the last handle goes. */
struct st_view_locks *kvx_st_vlocks_new(void);
void kvx_st_vlocks_attach(kvx_store *s, kvx_shard *sh);
void kvx_st_vlocks_keep(kvx_store *s);
/* Frees the n pages: one durable free log record, the catalog edit, then
 * the punches (kvx_st_punch_pending). Under wmu. */
int kvx_st_free_commit(kvx_store *s, const st_free_page *list, size_t n);
/* May this eviction free pages in place: the writer frees pages in place
 * and no read-only handle (of any process) is open now? While one is,
 * its punches would wait for it and the freed pages stay on disk, so
 * eviction takes whole shards instead (their files go, the space with
 * them once no view holds them). */
int kvx_st_holes_now(kvx_store *s);
/* Punches every freed extent not yet punched whose shard no view holds,
 * while no read-only handle of another process is open. */
int kvx_st_punch_pending(kvx_store *s);
/* After a drop or rewrite: rows of shards no longer live are forgotten. */
void kvx_st_holes_forget(kvx_store *s);
/* kvx_shard_verify of sh (generation gen): a failing page the free log
 * (log, or DIR/FREED read when NULL) frees is counted in *out_freed (nullable), not in *out_bad and not
 * reported; 0 when every failing page is a freed one. Any handle. */
int kvx_st_verify_pages(kvx_store *s, const kvx_free_log *log, const kvx_shard *sh, uint64_t gen, uint32_t *out_bad,
                        uint32_t *out_freed, void (*report)(void *ctx, uint32_t index, int code), void *ctx);
/* Sorts l's rows by (generation, entry, sequence number), as
 * kvx_st_log_frees needs them. */
void kvx_st_log_sort(kvx_free_log *l);
/* Does free log l (sorted) free entry index of sh (generation gen): a row
 * names them, with the entry's hash, written after the entry? */
int kvx_st_log_frees(const kvx_free_log *l, const kvx_shard *sh, uint64_t gen, uint32_t index);

/* store_usage.c */
/* Writer: the per-entry last-use array of shard (byte, gen) with n
 * entries, created (zeroed) or reset when gen changed; NULL on ENOMEM.
 * Call under use_mu. */
uint64_t *kvx_st_rec_get(kvx_store *s, uint32_t byte, uint64_t gen, uint32_t n);
/* Notes the n views' blocks as used now (referenced bit, last use); count:
 * also add them to the hit/miss counters (lookups; a put that finds its
 * block held only refreshes it). */
void kvx_st_note(kvx_store *s, const kvx_view *v, size_t n, uint64_t misses, int count);
/* Writes this handle's batched counters and referenced bits. */
int kvx_st_usage_persist(kvx_store *s);

/* store_lag.c: the writer's lagging catalog (docs/STORE.md "Durability") */
#define ST_LAG_MARK "UNSYNCED"
int kvx_st_lag_read(kvx_store *s);
void kvx_st_lag_start(kvx_store *s);
int kvx_st_lag_stop(kvx_store *s);
/* Per-shard last use and referenced bits, as persisted. */
typedef struct st_usage_view {
    uint64_t last_use;
    uint8_t *bits;
    uint32_t nbits;
} st_usage_view;
/* uv[ST_SLOTS] of every live shard; free with kvx_st_usage_free. */
int kvx_st_usage_read(kvx_store *s, st_usage_view *uv);
void kvx_st_usage_free(st_usage_view *uv);
/* r[ST_SLOTS]: per-entry recency of every live shard (ns); free with
 * kvx_st_recency_free. */
int kvx_st_recency_build(kvx_store *s, const st_usage_view *uv, uint64_t **r);
void kvx_st_recency_free(uint64_t **r);

/* store_tier.c */
/* Attaches the tier of opts (version 2, tier_url set) or else DIR/TIER
 * (use_file); never fails the open for the tier's sake (a bad TIER file is
 * one stderr line and no tier). create: writes opts' setting to DIR/TIER. */
int kvx_st_tier_attach(kvx_store *s, const kvx_store_options *opts, int use_file, int create);
/* KVX_EINVALID when opts (version 3) name a tier g's store cannot have: a
 * bad URL or tenant, or a keyed store. */
int kvx_st_tier_check(const kvx_store_options *opts, const kvx_geometry *g);
/* Drains the write-behind (at most drain_ms), stops it, frees the tier. */
void kvx_st_tier_detach(kvx_store *s, uint32_t drain_ms);
/* A flush published x's pending blocks: queue their write-behind. Under wmu. */
void kvx_st_tier_published(kvx_store *s, const kvx_store_batch *x);
/* The tier's counters into out. */
void kvx_st_tier_stats(kvx_store *s, kvx_store_stats *out);
/* Blocks [first, first + n) of a prompt from the tier, verified: fills
 * pages[j] (page_bytes each), scales (n * nscales, nullable) and returns how
 * many leading blocks were served (0..n). hashes and digests cover blocks
 * 0..first+n-1. Never an error. */
size_t kvx_st_tier_fetch(kvx_store *s, const uint32_t *tokens, size_t first, size_t n, const uint64_t *hashes,
                         const uint8_t (*digests)[KVX_DIGEST_BYTES], void **pages, float *scales);

/* store_lookup.c */
/* The local part of kvx_store_prefix (its contract, the store's blocks only). */
int kvx_st_prefix_local(kvx_view *out_views, size_t *out_n, kvx_store *s, const uint32_t *tokens, size_t n_tokens,
                        size_t max_views);
/* kvx_store_prefix_read's first step: the local prefix's entries matched
 * as kvx_st_prefix_local matches them (rule 1), views holding their shard
 * and entry with page NULL: no page read or checked, no use noted. A
 * damaged catalog record or a failed read is an error (no views held). */
int kvx_st_prefix_entries(kvx_view *out_views, size_t *out_n, kvx_store *s, const uint32_t *tokens, size_t n_tokens,
                          size_t max_views, const char *fn);
/* Looks a block up in snap: 0 and a view (its page CRC-checked), or
 * KVX_ENOTFOUND, KVX_EPAGECRC / KVX_ETRUNC (only damaged copies), or an
 * error (a damaged catalog record, an LMDB failure). Every block holding
 * the hash is tried. */
int kvx_st_lookup(kvx_store *s, kvx_cat_snap *snap, const st_query *q, kvx_view *out);
/* Is a lookup's rc one page's damage (the lookup tries the hash's other
 * copies; a batch calls it a miss), not the call's failure? For a read
 * into the caller's memory (read 1), a read the OS failed (-EIO: a bad
 * sector) or a page over the buffer is one page's damage too. */
static inline int kvx_st_damage(int read, int rc)
{
    return rc == KVX_EPAGECRC || rc == KVX_ETRUNC || (read && (rc == KVX_ECAPACITY || (rc < 0 && rc > -4096)));
}

/* store_writers.c */
/* A writer in staging/ for a new generation on a free shard byte (extra:
 * bytes also taken), reserving `reserve` entries. */
int kvx_st_writer_begin(kvx_store *s, uint32_t flags, const uint8_t *extra, st_open *o, uint32_t reserve);
/* A free shard byte (not live, not any batch's, not the active shard's,
 * not in extra) and a generation no file in shards/ has. */
int kvx_st_alloc_gen(kvx_store *s, const uint8_t *extra, uint8_t *out_byte, uint64_t *out_gen);
/* A keyed store's writer for n tombstones (a delete's file): not bounded
 * by the shard size, at most 65,535. */
int kvx_st_writer_begin_tombs(kvx_store *s, st_open *o, uint32_t n);
/* Seals o's shard (kvx_shard_writer_seal: fsync, rename into shards/,
 * fsync of shards/), so it is durable before any transaction names it.
 * With staged (a batch's shards), the sealed file stays in staging/
 * (out->staged) until the batch's flush publishes it (kvx_st_link_files):
 * a process killed before that flush leaves nothing recovery adopts. */
int kvx_st_writer_seal(kvx_store *s, st_open *o, st_sealed *out, int staged);
/* A commit's publication (a flush, a keyed delete), around its catalog
 * edit:
 *  kvx_st_link_files: the commit's mark staging/.<seq 16 hex>.pending is
 *   made durable (fsync of staging/; *marked: a commit of one file needs
 *   none, its one rename is atomic), then every sealed file of v moves
 *   into shards/<gen>.kvx (never over an existing file) and shards/ is
 *   fsynced. While the mark is there, recovery takes every file whose
 *   entries all carry seq as never acknowledged (and an active shard's
 *   record of seq: force makes a mark for one file, when the commit also
 *   appends to the active shard). On failure the files
 *   leave shards/ (durably), then the mark.
 *  kvx_st_unstage_files: the mark goes, durably: the commit, as the
 *   files tell it.
 *  then the catalog edit; if it fails, kvx_st_unlink_linked removes the
 *   shards/ names (durably); if it commits, kvx_st_published.
 * So a crash at any point publishes all of the commit or none of it. */
void kvx_st_pending_name(char *buf, size_t cap, uint64_t seq);
int kvx_st_link_files(kvx_store *s, st_sealed *v, size_t n, uint64_t seq, int force, int *marked);
void kvx_st_unlink_linked(kvx_store *s, st_sealed *v, size_t n);
int kvx_st_unstage_files(kvx_store *s, uint64_t seq, int marked);
/* A commit that failed after kvx_st_link_files: its files leave shards/
 * (durably), then its mark. */
void kvx_st_unpublish(kvx_store *s, st_sealed *v, size_t n, uint64_t seq, int marked);
/* After the catalog edit that names them committed: the files are the
 * catalog's now (a later failure no longer takes them back). */
void kvx_st_published(st_sealed *v, size_t n);
/* A batch's writer that filled up, parked unsealed in out (out->w) for
 * its flush: only the commit knows the sequence number its entries take. */
int kvx_st_writer_park(kvx_store *s, st_open *o, st_sealed *out);
/* At a batch's commit: every parked writer of v gets seq on each entry
 * without one and is sealed (fsync) into staging/ (v[i].staged). */
int kvx_st_seal_parked(kvx_store *s, st_sealed *v, size_t n, uint64_t seq);
/* Removes sealed, unpublished files: every name each has (staging/,
 * shards/). */
void kvx_st_unlink_sealed(kvx_store *s, st_sealed *v, size_t n);

/* store_active.c: the active shard (docs/STORE.md "Appends"), under wmu */
/* Gives batch x's blocks of kind the active shard (o set, o->active): 1;
 * 0 when it is not for them (another kind, a keyed store, a whole batch,
 * a store before version 4, another batch's blocks in it); <0 an error. */
int kvx_st_active_take(kvx_store *s, kvx_store_batch *x, int kind, st_open *o);
/* Does x have blocks in the active shard not yet appended? */
int kvx_st_active_pending(const kvx_store *s, const kvx_store_batch *x);
/* x's flush: its blocks in the active shard appended (record durable)
 * with seq, the shard's catalog record into e (x's blocks are added by the
 * flush with the rest of x's). 0 with nothing to append. */
int kvx_st_active_append(kvx_store *s, kvx_store_batch *x, uint64_t seq, kvx_cat_edit *e);
/* After x's flush (ok: its catalog edit committed) or its failure: x
 * no longer owns the active shard; a failure rolls back what x added
 * (or, after a durable record, leaves the file to recovery); a full
 * shard is sealed. */
void kvx_st_active_release(kvx_store *s, kvx_store_batch *x, int ok);
/* x's flush failed after it tried to append with seq: the record is cut
 * from the active file (sealed below it, store_active.c), then the
 * commit's mark (marked) goes; if the cut fails, the mark stays (made
 * again) and the handle refuses flushes (act_stuck), so no later commit
 * makes the mark look spent and recovery drops the record. */
void kvx_st_active_undo(kvx_store *s, kvx_store_batch *x, uint64_t seq, int marked);
/* The flush's refusal while act_stuck. */
int kvx_st_active_stuck(const kvx_store *s);
/* Seals the active shard in place (no batch owning it): 0, or the
 * failure (the file stays whole under one of its names). */
int kvx_st_active_seal(kvx_store *s);
/* A writer's open, before the plan: every active file in shards/ sealed
 * in place (its whole records), removed when it holds none, moved to
 * quarantine/ when it cannot be read. */
int kvx_st_active_recover(kvx_store *s);

/* store_rewrite.c */
/* A block to copy (eviction's carry, compaction, salvage). */
typedef struct st_move {
    uint8_t digest[KVX_DIGEST_BYTES]; /* all zero: unverified */
    uint32_t src_coord;
    uint64_t src_gen, hash, parent;
    uint64_t last_use;
    uint32_t new_coord; /* 0 with new_gen 0: dropped (bad page) */
    uint64_t new_gen;
    uint64_t seq; /* the entry's sequence number, kept by the copy */
    int tomb;     /* a tombstone (keyed stores): carried, never indexed */
} st_move;
/* Copies the moves' blocks into new sealed shards (in shards/, not yet
 * published) of the given flags; a bad page is not copied (new_gen 0).
 * why (ST_WROTE_*): what s->wrote counts the files under. */
int kvx_st_rewrite(kvx_store *s, st_move *mv, size_t n, uint32_t flags, uint8_t *busy, st_sealed **io_out,
                   size_t *io_n, int why);
/* Appends the entries of shard b as moves, each with its recency r[i];
 * with hot_only, only entries used after hot_after. */
int kvx_st_collect(kvx_store *s, uint32_t b, const uint64_t *r, int hot_only, uint64_t hot_after, st_move **mv,
                   size_t *n, size_t *cap, size_t limit);
/* After a committed rewrite: the new shards' entries keep the recency
 * their blocks had. */
void kvx_st_rec_from_moves(kvx_store *s, const st_move *mv, size_t n, const st_sealed *added, size_t nadded);

/* store_policy.c: pure functions (no files, no catalog, no locks) */
/* A shard as eviction and compaction see it. */
typedef struct st_pshard {
    int live, pinned;
    uint32_t flags, n;        /* header flags, entries */
    uint64_t file_bytes;
    const uint64_t *recency;  /* n per-entry last uses (ns); eviction only */
} st_pshard;
/* Eviction stops 1/64 below the capacity (a default-sized shard): with only
 * a flush's worth of blocks below the cut, every victim would be mostly hot
 * blocks to copy. */
uint64_t kvx_st_evict_goal(uint64_t capacity);
/* Blocks of the store's mean size the goal holds besides `pending` bytes. */
uint64_t kvx_st_evict_keep(uint64_t goal, uint64_t pending, uint64_t live_bytes, uint64_t nblocks);
/* The recency an exact LRU keeping `keep` of the n recencies in all would
 * cut at (entries above it stay): 0 when all are kept. Sorts all. */
uint64_t kvx_st_evict_cut(uint64_t *all, size_t n, uint64_t keep);
/* The carry cut: a victim's blocks above it are carried. Only the newest
 * ST_CARRY_HOT_PCT % of the `keep` an exact LRU keeps: a block between the
 * two cuts, carried, is near the cut again at the next eviction and is
 * carried again, and again (docs/STORE.md "Eviction"). sorted: ascending
 * (kvx_st_evict_cut sorted it); 0 when all of them would be carried. */
#define ST_CARRY_HOT_PCT 80
uint64_t kvx_st_carry_cut(const uint64_t *sorted, size_t n, uint64_t keep);
/* Live shards in eviction order: the largest share of entries at or below
 * cut first, then the oldest mean recency, then the shard byte. Returns
 * their number. */
int kvx_st_evict_order(uint32_t *order, const st_pshard *sh, uint64_t cut);
/* Blocks eviction may carry: half of the bytes it freed, so it always
 * frees room and copies at most as much as it frees. */
uint64_t kvx_st_carry_room(uint64_t freed, uint64_t entry_bytes);
/* Has eviction freed enough: total - freed, plus a shard of the carried
 * blocks (min(collected, room)), within the goal? */
int kvx_st_evict_enough(uint64_t total, uint64_t freed, size_t collected, uint64_t room, uint64_t entry_bytes,
                        uint64_t goal);
/* Compaction's merge group: unpinned live shards of exactly `flags` smaller
 * than target/2 (victims[] set). Returns their number. */
int kvx_st_compact_small(uint8_t *victims, const st_pshard *sh, uint32_t flags, uint64_t target);
/* Does a flush merge small shards now: when ids run low (over
 * ST_COMPACT_AT live), or when small shards' headers and padding (about
 * ST_SHARD_OVERHEAD each) would cost over 1 % of the capacity (at least 4,
 * at most ST_COMPACT_SMALL of them)? */
int kvx_st_compact_due(const st_pshard *sh, uint64_t capacity, uint64_t target);
int kvx_st_cmp_u64(const void *a, const void *b);
/* Moves oldest first (coordinate order on ties). */
int kvx_st_cmp_move_age(const void *a, const void *b);
/* Moves newest first; equal recency in coordinate order (a parent before
 * its child), so truncating keeps whole prefixes. */
int kvx_st_cmp_move_hot(const void *a, const void *b);

/* store_maint.c */
/* A maintenance pass that could not see every shard and changed nothing. */
#define ST_PASS_SKIPPED 1
/* One drop: shards unregistered, shards added, blocks moved, counters. */
typedef struct st_drop {
    kvx_store *s;
    const uint8_t *victims; /* shard bytes to unregister */
    const st_sealed *added;
    size_t nadded;
    const struct st_move *moves;
    size_t nmoves;
    int evict, compact, damaged;
} st_drop;
/* Commits d as one catalog edit (the registry follows). */
int kvx_st_drop_write(kvx_store *s, st_drop *d);
/* The shards of s as policy sees them (recency from r, nullable). */
void kvx_st_pshards(st_pshard *out, const kvx_store *s, uint64_t *const *r);
/* After a committed drop: caches, files (deleted when sound, else
 * quarantined with `damaged` or the verdict as the reason). */
void kvx_st_after_drop(kvx_store *s, const uint8_t *victims, const char *damaged);
/* After a committed drop (an eviction, gc's rewrite): queues for
 * kvx_store_evicted every block or key of the victims no live shard holds
 * now (a carried or kept one is held where it went). */
void kvx_st_note_evicted(kvx_store *s, const uint8_t *victims);
/* Keeps what bad shard b must not take with it (store_gc.c: a keyed
 * shard's deletes): 0, or the failure (b then stays). */
typedef int (*st_keep_fn)(kvx_store *s, uint32_t b);
/* keep NULL (a flush): a keyed store's bad shards wait for gc. */
int kvx_st_drop_bad_shards(kvx_store *s, st_keep_fn keep);
/* pending: bytes of sealed, unpublished files (a put in progress). */
int kvx_st_evict(kvx_store *s, uint64_t pending);
/* Shard ids ran out with the store under its capacity (many small
 * shards): evicts the coldest unpinned shards, as kvx_st_evict does for
 * the capacity (whole cold shards first, then, if too few, a carrying
 * pass), until about ST_COMPACT_AT - 16 shards are left. The number of
 * ids freed (0: none could be), or <0. */
int kvx_st_evict_for_ids(kvx_store *s);
int kvx_st_enforce_capacity(kvx_store *s);
int kvx_st_compact(kvx_store *s, int full);

/* store_migrate.c */
/* An unmigrated store (s->version below ST_STORE_VERSION) whose catalog
 * is sound: moves to quarantine/ the files of shards/ the catalog does not
 * name that have a sequence table (a migration's copies a crash cut before
 * their commit), so the caller's check that the catalog names exactly the
 * files of shards/ can pass again. */
int kvx_st_migrate_leftovers(kvx_store *s);
/* Migrates s (writer, its catalog sound and current): every live shard
 * without a sequence table rewritten (its catalog-named entries, sequence
 * number 1) and dropped, one catalog edit each; then STORE in
 * ST_STORE_VERSION, last. A crash anywhere leaves a store the next writer
 * open migrates on. */
int kvx_st_migrate(kvx_store *s);
/* STORE in this release's version (ST_STORE_VERSION): temp, fsync,
 * rename, fsync of DIR; s->version follows. */
int kvx_st_write_store_file(kvx_store *s);

/* store_commit.c */
/* Appends v to x's sealed (or parked) files. */
int kvx_st_sealed_push(kvx_store_batch *x, const st_sealed *v);
/* A keyed commit (its writers parked, its sequence number not yet set):
 * each pending page whose key the catalog names in another copy gets that
 * copy's number when the bytes are equal, else the copy leaves the
 * catalog (edit e) under a tombstone added to x's parked writers. */
int kvx_st_supersede(kvx_store *s, kvx_store_batch *x, kvx_cat_edit *e);

/* store_batch.c */
/* A shard holding a block a pending put of any batch relies on (see
 * pinned). Under wmu. */
static inline int st_is_pinned(const kvx_store *s, uint32_t b)
{
    if (s->act.w && s->act.byte == b) return 1; /* the active shard: sealed before anything may drop it */
    for (const kvx_store_batch *x = s->batches; x; x = x->next)
        if (x->pinned[b] && x->pin_gen[b] == s->reg->rec[b].gen) return 1;
    return 0;
}
/* Does batch x hold unflushed blocks (open writers, sealed files, or
 * pending entries)? */
static inline int st_batch_busy(const kvx_store_batch *x)
{
    return x->npend || x->nsealed || x->cur[0].w || x->cur[1].w;
}
/* Bytes of the sealed but unpublished files of every batch (they count
 * against the capacity while puts run). Under wmu. */
static inline uint64_t st_unpublished_bytes(const kvx_store *s)
{
    uint64_t n = 0;
    for (const kvx_store_batch *x = s->batches; x; x = x->next)
        for (size_t i = 0; i < x->nsealed; i++) n += x->sealed[i].bytes;
    return n;
}
/* Pins shard b (generation gen) in x; a lease pins it only within the
 * leases' budget (else nothing: a lease never guarantees a push). */
void kvx_st_pin(kvx_store_batch *x, uint32_t b, uint64_t gen);
/* Makes x a lease: its pins count against the leases' budget, with every
 * other lease's as they are at each pin (under wmu). */
void kvx_st_lease_begin(kvx_store_batch *x);
/* The bytes of shard files all leases together may pin: half the
 * capacity, at least two shards (so a small store's lease still pins a
 * prompt). */
static inline uint64_t kvx_st_lease_budget(const kvx_store *s)
{
    uint64_t half = s->capacity / 2, two = 2 * s->target;
    return half > two ? half : two;
}
/* Pins the shard v was served from (its current generation) in x. Under wmu. */
void kvx_st_pin_view(kvx_store_batch *x, const kvx_view *v);
/* The transfer core's block calls (they take wmu). kvx_st_ref_block: is
 * q's block held, verified and sound (1, its shard pinned in x until x's
 * flush), or not (0); <0 an error. kvx_st_put_block: one full block of a
 * checked lineage (q with B tokens and digest) into x: held elsewhere or
 * pending in x, *out_added 0 (held: pinned); else written, 1. A failed
 * write drops x's unflushed blocks, as a failed put does. */
int kvx_st_ref_block(kvx_store_batch *x, const st_query *q);
/* Keyed pages into x (arguments checked by the caller): held or pending
 * keys skipped, the rest written; a failed write drops x's unflushed
 * pages. Takes wmu. */
int kvx_st_put_keyed(kvx_store *s, kvx_store_batch *x, const kvx_key *keys, const void *const *pages,
                     const size_t *page_lens, size_t n, size_t *out_new);
/* b, or s's built-in batch when b is NULL; NULL and *rc set when b is
 * detached or belongs to another store. */
kvx_store_batch *kvx_st_batch_of(kvx_store *s, kvx_store_batch *b, const char *fn, int *rc);
int kvx_st_put_block(kvx_store_batch *x, const st_query *q, const void *page, const float *scales, int *out_added);
/* kvx_store_batch_put of blocks [first, first + n_pages) of tokens (pages
 * holds only those), under the same rules. */
int kvx_st_batch_put_from(kvx_store_batch *x, const uint32_t *tokens, size_t n_tokens, size_t first,
                          const void *pages, size_t n_pages, const float *scales, size_t *out_new);
/* Drops every unflushed block of x (never acknowledged); blocks earlier
 * successful puts added are counted in x->lost, for its next flush. */
void kvx_st_discard_pending(kvx_store_batch *x);
int kvx_st_flush_locked(kvx_store *s, kvx_store_batch *x);
/* Puts x (zeroed) on s's list of live batches. */
void kvx_st_batch_link(kvx_store *s, kvx_store_batch *x);
/* Frees x's buffers (not x). */
void kvx_st_batch_free_bufs(kvx_store_batch *x);
/* kvx_store_close: every batch's unflushed blocks dropped, the callers'
 * batches detached (they take only kvx_store_batch_destroy). Under wmu. */
void kvx_st_batches_close(kvx_store *s);

/* store_keyed.c: tombstones for keys, one commit per 65,535, without a
 * catalog lookup (recovery keeping the deletes a damaged file may have
 * held). Under wmu, or in a writer's open. */
int kvx_st_tombstone_keys(kvx_store *s, const kvx_key *keys, size_t n);

/* store_apply.c */
int kvx_st_reindex_locked(kvx_store *s);
/* Recovery (writer only): the plan of the files, applied (store_apply.c). */
int kvx_st_recover(kvx_store *s);
/* A keyed store's reader's open: 0 when the catalog knows every committed
 * file in shards/ (a writer's publication in progress is waited out,
 * about 2 s at most), else KVX_ESTALE naming the fix (a reader never
 * repairs). */
int kvx_st_reader_check(kvx_store *s);

#endif
