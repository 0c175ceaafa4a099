/*
 * format/format.h - what the byte formats offer the layers above them
 * beyond kvx.h (the store's served-page check). Not API.
 */
#ifndef KVX_FORMAT_H
#define KVX_FORMAT_H

#include "common/internal.h"

/* The page of entry index, CRC-checked unless this handle already checked
 * it (a per-page bit, set on the first pass): what every view of the store
 * goes through. KVX_EPAGECRC, or KVX_ETRUNC for a missing page, or
 * KVX_ENOTFOUND for a tombstone (no page). */
int kvx_shard_page_checked(const void **out_page, const kvx_shard *s, uint32_t index);
/* Marks entry index of s as freed in place by its store (docs/STORE.md
 * "Holes"): warmup and fetches take it as absent, as a tombstone. */
void kvx_shard_mark_freed(kvx_shard *s, uint32_t index);
/* Has entry index no page to read: a tombstone, or a page its store freed
 * in place (kvx_shard_mark_freed)? */
int kvx_shard_absent(const kvx_shard *s, uint32_t index);
/* The references s has now (the store's holes: a handle referenced by
 * anything but the store's cache is in use). */
uint32_t kvx_shard_refs(const kvx_shard *s);
/* fn(ctx) is called once, after s's last reference is gone and its
 * mapping unmapped (the store's readers' locks outlive a closed store's
 * views: engine/store_viewlocks.c). Set once, right after the open, before s
 * is shared. */
void kvx_shard_on_free(kvx_shard *s, void (*fn)(void *ctx), void *ctx);
/* Where entry index's page lies in s's file, for a read into the
 * caller's memory (kvx_shard_page_read). KVX_ENOTFOUND for a tombstone,
 * KVX_ETRUNC for a page past the end of the file, KVX_EINVALID for a
 * shard in memory. */
typedef struct kvx_page_span {
    int fd;        /* the handle's descriptor */
    int direct_fd; /* an O_DIRECT one of the same file, or < 0 */
    uint64_t offset;
    uint32_t bytes, crc32, coordinate;
    const uint8_t *map; /* the file's mapping (under the SIGBUS guard): residency, and a cached page's copy */
} kvx_page_span;
int kvx_shard_page_span(kvx_page_span *out, kvx_shard *s, uint32_t index);
/* Reads entry index's page into dst (cap bytes, at least the page's) and
 * checks its CRC-32 there, every time: *out_len = its length on 0.
 * Pages the page cache holds are copied from it; the others are read
 * with O_DIRECT straight into dst when dst and the page are 4096-aligned
 * (no second copy, nothing left in the cache), else through the cache.
 * KVX_EPAGECRC (dst holds the bad bytes), KVX_ETRUNC (the file ends
 * before the page does), KVX_ECAPACITY (cap too small: nothing read),
 * a read's -errno; on any failure dst's contents are unspecified. */
int kvx_shard_page_read(kvx_shard *s, uint32_t index, void *dst, size_t cap, size_t *out_len);
/* kvx_shard_page_read of n pages (s[i]'s entry index[i] into dst[i], cap[i]
 * bytes; out_rc[i], out_len[i]), their reads in flight together (io_uring,
 * up to 64 at once) rather than one after another: a load's pages stream
 * from the disk while the first are checked, each as its read completes.
 * Pages out of the page cache are read with O_DIRECT where
 * kvx_shard_page_read would (nothing left in the cache); neighbouring
 * pages of one file bound for neighbouring memory are one read (up to
 * 1 MiB). Pages the cache holds are copied from the handle's mapping. */
void kvx_shard_pages_read(kvx_shard *const *s, const uint32_t *index, size_t n, void *const *dst, const size_t *cap,
                          int *out_rc, size_t *out_len);
/* As kvx_shard_pages_read, through the page cache (pages left there for
 * the next reader): the run asked for at once (kvx_shard_willneed, and
 * read-ahead past a run that continues the last), then each page copied
 * from the handle's mapping as it arrives and CRC-checked where it
 * landed, in steps the core's cache holds. A page that passes is marked
 * checked in the handle, as a view's first check marks it. Under a test's
 * OS seam: kvx_shard_pages_read (every read a pread the seam sees). */
void kvx_shard_pages_copy(kvx_shard *const *s, const uint32_t *index, size_t n, void *const *dst, const size_t *cap,
                          int *out_rc, size_t *out_len);
/* Asks the kernel, at once, for the pages of entries index[0..n) that
 * this handle has not CRC-checked yet (one hint per contiguous file
 * range); nothing waits, nothing is checked or handed out. A prefix
 * lookup calls it with its whole run before it checks the first page. */
void kvx_shard_willneed(kvx_shard *s, const uint32_t *index, size_t n, int skip_first);
/* Does page index start within the first read-ahead window of the file's
 * pages (where a fault reads ahead from the start, in large folios)? */
int kvx_shard_at_start(const kvx_shard *s, uint32_t index);
/* kvx_shard_open of name under directory dirfd, never through a symlink
 * (KVX_EPATH: a symlink put where the store checked a file); path is the
 * name messages and kvx_shard_path give. dirfd AT_FDCWD: path, as
 * kvx_shard_open. */
int kvx_shard_open_at(kvx_shard **out, int dirfd, const char *name, const char *path, unsigned flags);
/* What a keyed shard file whose checksum failed may still say: each
 * entry's key, sequence number (0 without a sequence table) and whether
 * it is a tombstone, read from its tables as they are (the header
 * checked, every table within the file before it is read). Unproven: for
 * keeping the deletes a damaged file may hold (recovery makes those keys
 * misses), never for serving a page. *out: free(). */
typedef struct kvx_salvaged_key {
    uint8_t key[KVX_KEY_MAX];
    size_t len;
    uint64_t seq;
    int tomb;
} kvx_salvaged_key;
int kvx_shard_salvage_keys(int dirfd, const char *name, kvx_salvaged_key **out, size_t *n);
/* Entries whose page lies (partly) past the end of the file (never a
 * tombstone). */
uint32_t kvx_shard_missing(const kvx_shard *s);

/* kvx_shard_writer_seal up to the fsync of the complete file, which then
 * stays under its temporary name in the writer's staging_dir (the last
 * path component is copied to name, cap bytes): the store publishes it
 * later, by renaming it into shards/ at its batch's flush, so a process
 * killed before that flush leaves only a staging/ file, which recovery
 * removes. Frees w whatever the result; on failure no file is left. A
 * writer without staging_dir (an unnamed file) is KVX_EINVALID. */
int kvx_shard_writer_seal_staged(kvx_shard_writer *w, char *name, size_t cap);

/* Commit records (KVX_FLAG_SEQ, KVX_FLAG_TOMB; docs/FORMAT.md "Sequence
 * numbers and tombstones"), what the store's writers use: */
/* Adds a tombstone for key (1..KVX_KEY_MAX bytes) at coordinate
 * (shard, radix_block, 0): no page is written. KVX_EINVALID without
 * KVX_FLAG_TOMB or for a bad key; KVX_EFULL, KVX_EDUPLICATE as
 * kvx_shard_writer_add. Its sequence number starts 0. */
int kvx_shard_writer_add_tombstone(kvx_shard_writer *w, uint16_t radix_block, const void *key, uint32_t key_len);
/* Sets entry index's sequence number: KVX_EINVALID without KVX_FLAG_SEQ,
 * for index >= count or for seq 0. */
int kvx_shard_writer_set_seq(kvx_shard_writer *w, uint32_t index, uint64_t seq);
/* Sets seq on every entry whose sequence number is still 0 (a batch's
 * commit); nothing without KVX_FLAG_SEQ, or for seq 0. */
void kvx_shard_writer_seq_unset(kvx_shard_writer *w, uint64_t seq);
/* Reads back page index of an unsealed writer (a page, not a tombstone)
 * into buf (cap bytes): 0 and *out_len, KVX_EINVALID for a bad index, a
 * tombstone or a page larger than cap, or -errno. */
int kvx_shard_writer_page(const kvx_shard_writer *w, uint32_t index, void *buf, size_t cap, uint32_t *out_len);
/* The max_entries the writer was created with (0 for NULL). */
uint32_t kvx_shard_writer_max(const kvx_shard_writer *w);
/* The smallest sequence number of any entry; 0 without a sequence table or
 * without entries. O(1) (computed at open). */
uint64_t kvx_shard_min_seq(const kvx_shard *s);

/* Active shards (docs/FORMAT.md "Active shards and their journal"): a
 * shard file that grows by appends, each commit's entries made durable by
 * one journal record, and is sealed in place into a standard KVX file.
 * The file is found and judged only by these parameters (the caller's: a
 * store knows its geometry, flags and reserve); its journal header must
 * match them, ident included (32 bytes naming the file: a record copied
 * from another file does not chain). */
typedef struct kvx_active_params {
    kvx_geometry geometry;
    uint8_t shard_id;
    uint32_t max_entries; /* the tables' reserve, 1..KVX_MAX_ENTRIES */
    uint32_t flags;       /* the tables (KVX_FLAG_SEQ required; not META_CRC) */
    uint8_t ident[32];
} kvx_active_params;
/* Creates the active file at path (O_EXCL: never over an existing file)
 * with its journal header, durable (the file, then its directory) before
 * it returns. Pages go in with kvx_shard_writer_add as for any writer. */
int kvx_shard_writer_create_active(kvx_shard_writer **out, const char *path, const kvx_active_params *p);
/* Continues the active file at path after a crash or a close: its whole
 * records are its entries; an unsealed tail is zeroed (durably) before
 * the next append goes there. KVX_EMAGIC / KVX_EFORMAT / KVX_ECORRUPT as
 * kvx_journal_read, and the tables' own checks (a sealed file's). */
int kvx_shard_writer_resume(kvx_shard_writer **out, const char *path, const kvx_active_params *p);
/* The same, records from the first whose sequence number is at least
 * below (a commit that never answered: its mark is still there) taken as
 * the unsealed tail and cleared with it. */
int kvx_shard_writer_resume_below(kvx_shard_writer **out, const char *path, const kvx_active_params *p, uint64_t below);
/* The commit of the entries added since the last append: every one gets
 * seq (those without a number), the pages are made durable (fdatasync),
 * then one record naming them, durable too. seq must be above the last
 * record's (KVX_EINVALID). 0 with nothing to append. On a failure after
 * the first write the writer is broken: every later call but abort fails
 * (KVX_EINVALID), and the file is what a crash there leaves. */
int kvx_shard_writer_append(kvx_shard_writer *w, uint64_t seq);
/* Forgets the entries added since the last append (their pages stay as
 * unused bytes). */
void kvx_shard_writer_rollback(kvx_shard_writer *w);
/* Entries the active file's records hold (0 for another writer). */
uint32_t kvx_shard_writer_appended(const kvx_shard_writer *w);
/* Where an active file of p's pages begin (its tables' reserve and its
 * journal before them); 0 for parameters no writer takes. */
uint64_t kvx_active_kv_offset(const kvx_active_params *p);
/* Bytes of the journal written so far: its header and records (0 for
 * another writer). */
uint64_t kvx_shard_writer_journal_used(const kvx_shard_writer *w);
/* Seals an active file in place: the header and tables of its appended
 * entries written at offset 0 (the journal stays, unused, between the
 * tables and the pages), fsync, then renamed to sealed_path (never over a
 * file: -EEXIST) and its directory fsynced. Entries added since the last
 * append: KVX_EINVALID (append or roll back first). Frees w whatever the
 * result; on failure the active file stays as it was, under its name. */
int kvx_shard_writer_seal_active(kvx_shard_writer *w, const char *sealed_path);
/* Opens an active file as a shard: its entries are its whole records'
 * (kvx_journal_read), checked as a sealed file's tables are; everything
 * else (pages, checks, handles) as kvx_shard_open_at. */
int kvx_shard_open_active(kvx_shard **out, int dirfd, const char *name, const char *path, const kvx_active_params *p);

/* kvx_envelope_parse without its crc32c check, for an envelope inside a
 * container whose own checksum covering every byte of it just passed (a
 * shared tier value, tier/value.c): every other rule is checked. */
int kvx_envelope_parse_nocrc(kvx_envelope *out, const void *buf, size_t len, const kvx_geometry *expect);

/* A shard held in memory only (blocks the shared tier served: nothing is
 * written anywhere). Takes pages (an array of n malloc'd pages of g's
 * full-block size, itself malloc'd; all freed with the shard, even on
 * failure); copies the tables (n hashes, parents, n*B tokens, n*32 digest
 * bytes, n*L*2*Hkv scales or NULL). Entry i has coordinate (0, i, 0); path
 * "(shared tier)", fd -1. */
int kvx_shard_mem(kvx_shard **out, const kvx_geometry *g, uint32_t n, void **pages, const uint64_t *hashes,
                  const uint64_t *parents, const uint32_t *tokens, const uint8_t *digests, const float *scales);

#endif
