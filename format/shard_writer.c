/*
 * shard_writer.c - writes a KVX shard that appears at its final path only
 * once it is complete and durable.
 *
 * Shape: kvx_shard_writer_create reserves room for max_entries in every
 * table (and the spectral bundle after them), so kv_data_offset is known
 * from the start and each page can be written at its final place as soon
 * as it is added (kvx_os_pwrite_all into a temporary file ".<name>.tmp.
 * <pid>.<random>" beside the path). Only the tables stay in memory. Seal
 * writes header + tables + bundle, ftruncates (the gaps between 4096-
 * aligned pages are holes that read as zeros), fsyncs, renames into place
 * and fsyncs the directory. Any failure removes the temporary file, so a
 * crash or an error never leaves a partial file under the final name.
 * The commit records (sequence numbers, tombstones) are tables like the
 * others: the store sets each entry's sequence number when its batch
 * commits (kvx_shard_writer_set_seq / _seq_unset), and a seal with one
 * still 0 is refused.
 * Every OS call goes through kvx_os so tests can make each one fail.
 */
#include "shard_writer_impl.h"
#include "common/os.h"
#include "common/digest.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

void kvx_sw_free(kvx_shard_writer *w)
{
    if (!w) return;
    free(w->path);
    free(w->tmp_path);
    free(w->coords);
    free(w->hashes);
    free(w->lineage);
    free(w->digests);
    free(w->scales);
    free(w->keys);
    free(w->seqs);
    free(w->tombs);
    free(w->spectral);
    if (w->seen) munmap(w->seen, WRITER_SEEN_BYTES);
    free(w);
}

/* Closes and removes the temporary file (an active file stays: its
 * records were acknowledged), then frees w. */
void kvx_sw_discard(kvx_shard_writer *w)
{
    if (!w) return;
    if (w->fd >= 0) kvx_os.close(w->fd);
    if (w->tmp_path && !w->unnamed && !w->active) kvx_os.unlink(w->tmp_path);
    kvx_sw_free(w);
}

static int check_options(const kvx_shard_writer_options *o)
{
    if (o->version != KVX_SHARD_WRITER_OPTIONS_VERSION)
        return kvx_fail(KVX_EVERSION, "writer options: version %u, expected %u", o->version,
                        KVX_SHARD_WRITER_OPTIONS_VERSION);
    const kvx_geometry *g = &o->geometry;
    if (!kvx_quant_elem_size(g->quant))
        return kvx_fail(KVX_EQUANT, "writer options: quant %u is unknown", g->quant);
    if (g->num_layers < 1 || g->num_layers > 65535 || g->kv_heads < 1 || g->kv_heads > 65535 ||
        g->head_dim < 1 || g->head_dim > 65535)
        return kvx_fail(KVX_EINVALID,
                        "writer options: num_layers %u, kv_heads %u, head_dim %u must be in 1..65535",
                        g->num_layers, g->kv_heads, g->head_dim);
    if (o->max_entries < 1 || o->max_entries > KVX_MAX_ENTRIES)
        return kvx_fail(KVX_EINVALID, "writer options: max_entries %u is not in 1..%u", o->max_entries,
                        KVX_MAX_ENTRIES);
    uint32_t f = o->flags & ~KVX_FLAG_META_CRC; /* the writer always sets META_CRC */
    if (f & ~(KVX_FLAG_HASHES | KVX_FLAG_LINEAGE | KVX_FLAG_SCALES | KVX_FLAG_DIGEST | KVX_FLAG_KEYS |
              KVX_FLAG_SEQ | KVX_FLAG_TOMB))
        return kvx_fail(KVX_EINVALID, "writer options: unknown flags 0x%x", f);
    if ((f & KVX_FLAG_KEYS) && ((f & ~(KVX_FLAG_KEYS | KVX_FLAG_SEQ | KVX_FLAG_TOMB)) || o->spectral))
        return kvx_fail(KVX_EINVALID,
                        "writer options: a key table mixes with no other table or bundle (but sequence numbers and tombstones)");
    if ((f & KVX_FLAG_TOMB) && (f & (KVX_FLAG_KEYS | KVX_FLAG_SEQ)) != (KVX_FLAG_KEYS | KVX_FLAG_SEQ))
        return kvx_fail(KVX_EINVALID, "writer options: a tombstone table needs KVX_FLAG_KEYS and KVX_FLAG_SEQ");
    if ((f & KVX_FLAG_LINEAGE) && !(f & KVX_FLAG_HASHES))
        return kvx_fail(KVX_EINVALID, "writer options: a lineage table needs KVX_FLAG_HASHES");
    if ((f & KVX_FLAG_DIGEST) && !(f & KVX_FLAG_LINEAGE))
        return kvx_fail(KVX_EINVALID, "writer options: a digest table needs KVX_FLAG_LINEAGE");
    if ((f & KVX_FLAG_HASHES) && !g->block_tokens)
        return kvx_fail(KVX_EINVALID, "writer options: a hash table needs geometry.block_tokens");
    if (g->block_tokens > KVX_MAX_BLOCK_TOKENS) /* the reader refuses more (BOUND-7) */
        return kvx_fail(KVX_EINVALID, "writer options: geometry.block_tokens %u exceeds %u", g->block_tokens,
                        KVX_MAX_BLOCK_TOKENS);
    if ((f & KVX_FLAG_SCALES) && !kvx_quant_is_fp8(g->quant))
        return kvx_fail(KVX_EINVALID, "writer options: a scale table is only for FP8 shards");
    if (o->spectral) {
        int rc = kvx_spectral_check_in(o->spectral, g->num_layers);
        if (rc) return rc;
    }
    return 0;
}

/* ".<name>.tmp.<pid>.<random>" in staging_dir, or else in path's directory. */
static int open_temp(kvx_shard_writer *w, const char *staging_dir)
{
    const char *slash = strrchr(w->path, '/');
    size_t dir_len = slash ? (size_t)(slash - w->path) + 1 : 0;
    const char *base = w->path + dir_len;
    if (!*base) return kvx_fail(KVX_EINVALID, "shard path \"%s\" names a directory", w->path);
    const char *dir = w->path;
    if (staging_dir) {
        dir = staging_dir;
        dir_len = strlen(staging_dir);
        if (dir_len == 0) return kvx_fail(KVX_EINVALID, "staging_dir is empty");
    }
    int sep = staging_dir && staging_dir[dir_len - 1] != '/';
    if (!staging_dir) {
        /* beside path, an unnamed file (O_TMPFILE): a process killed before
         * the seal leaves nothing behind. A store's writers use staging/
         * instead, which its recovery empties. */
        char d[4096];
        if (dir_len >= sizeof d) return kvx_fail(-ENAMETOOLONG, "%s: path too long", w->path);
        if (dir_len) memcpy(d, w->path, dir_len);
        else d[dir_len++] = '.';
        d[dir_len] = 0;
        w->fd = kvx_os.open(d, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (w->fd >= 0) {
            w->unnamed = 1;
            w->tmp_path = strdup(w->path); /* for messages; nothing to unlink */
            if (w->tmp_path) return 0;
            kvx_os.close(w->fd);
            w->fd = -1;
            return kvx_fail(-ENOMEM, "out of memory");
        }
        if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
            return kvx_fail(-errno, "%s: cannot create its temporary file: %s", w->path, strerror(errno));
        if (!dir_len || (dir_len == 1 && d[0] == '.')) dir_len = 0; /* file systems without O_TMPFILE: a name */
    }
    size_t cap = dir_len + strlen(base) + 64;
    w->tmp_path = malloc(cap);
    if (!w->tmp_path) return kvx_fail(-ENOMEM, "out of memory");
    for (int attempt = 0; attempt < 16; attempt++) {
        uint64_t r;
        if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            r = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec ^ (uint64_t)attempt;
        }
        snprintf(w->tmp_path, cap, "%.*s%s.%s.tmp.%ld.%016llx", (int)dir_len, dir, sep ? "/" : "",
                 base, (long)getpid(), (unsigned long long)r);
        w->fd = kvx_os.open(w->tmp_path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (w->fd >= 0) return 0;
        if (errno != EEXIST) {
            int e = -errno;
            kvx_fail(e, "%s: cannot create its temporary file %s: %s", w->path, w->tmp_path,
                     strerror(-e));
            free(w->tmp_path);
            w->tmp_path = NULL; /* nothing was created */
            return e;
        }
    }
    free(w->tmp_path);
    w->tmp_path = NULL;
    return kvx_fail(-EEXIST, "%s: no free temporary name", w->path);
}

/* A writer of opts for path, its file not yet opened. */
int kvx_sw_new(kvx_shard_writer **out, const char *path, const kvx_shard_writer_options *opts)
{
    int rc = check_options(opts);
    if (rc) return rc;
    kvx_shard_writer *w = calloc(1, sizeof *w);
    if (!w) return kvx_fail(-ENOMEM, "out of memory");
    w->fd = -1;
    w->g = opts->geometry;
    w->shard_id = opts->shard_id;
    w->max_entries = opts->max_entries;
    w->flags = (opts->flags & ~KVX_FLAG_META_CRC);
    w->no_replace = opts->staging_dir != NULL;
    w->scale_count = kvx_scale_count(&w->g);

    /* Reserve the tables for max_entries; the bundle and the KV section
     * follow at fixed places. */
    kvx_shard_layout lay;
    if (kvx_shard_layout_for(&lay, w->max_entries, w->flags, w->g.block_tokens, w->g.num_layers,
                             w->g.kv_heads)) {
        uint32_t max = w->max_entries;
        kvx_sw_free(w);
        return kvx_fail(KVX_EOVERFLOW, "table sizes for %u entries overflow", max);
    }
    w->lineage_rec = lay.lineage_rec;
    uint64_t end = lay.tables_end;
    if (opts->spectral) {
        const kvx_spectral_in *sp = opts->spectral;
        w->spectral_len = kvx_spectral_bundle_bytes(sp->n_cartridges, sp->n_layers, sp->dim, sp->rank);
        w->spectral_offset = kvx_align_up(end, KVX_SECTION_ALIGN);
        if (w->spectral_len > SIZE_MAX / 2 || !kvx_add64(&end, w->spectral_offset, w->spectral_len)) {
            kvx_sw_free(w);
            return kvx_fail(KVX_EOVERFLOW, "spectral bundle size overflows");
        }
        w->spectral = malloc((size_t)w->spectral_len);
        if (!w->spectral) {
            kvx_sw_free(w);
            return kvx_fail(-ENOMEM, "out of memory for the spectral bundle");
        }
        kvx_spectral_encode(w->spectral, sp);
    }
    if (end > UINT64_MAX - KVX_PAGE_ALIGN) {
        kvx_sw_free(w);
        return kvx_fail(KVX_EOVERFLOW, "section sizes overflow");
    }
    /* Large pages start on a 1 MiB boundary: writes of whole pages then line
     * up with the file system's extents (measured: about 10 % of write
     * throughput at 256 KiB pages). The gap is a hole, and it is at most
     * 1/4 of one page. Small pages keep 4096 (the gap would outweigh them). */
    uint64_t full_page = kvx_page_bytes(&w->g, w->g.block_tokens ? w->g.block_tokens : 1);
    w->kv_data_offset = kvx_align_up(end, full_page >= KVX_LARGE_PAGE ? KVX_LARGE_ALIGN : KVX_PAGE_ALIGN);
    w->wb_from = w->kv_data_offset;
    /* 2^24 bits, zero pages mapped on first use: a calloc of this size
     * comes from the heap once glibc's mmap threshold has grown past it
     * (after the first writer's free), and then zeroes all 2 MiB, each
     * time a writer is made (anonymous memory, not file I/O: no seam) */
    w->seen = mmap(NULL, WRITER_SEEN_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (w->seen == MAP_FAILED) w->seen = NULL;
    w->path = strdup(path);
    if (!w->seen || !w->path) {
        kvx_sw_free(w);
        return kvx_fail(-ENOMEM, "out of memory");
    }
    *out = w;
    return 0;
}

int kvx_shard_writer_create(kvx_shard_writer **out, const char *path,
                            const kvx_shard_writer_options *opts)
{
    if (!out || !path || !opts)
        return kvx_fail(KVX_EINVALID, "kvx_shard_writer_create: NULL argument");
    *out = NULL;
    kvx_shard_writer *w;
    int rc = kvx_sw_new(&w, path, opts);
    if (rc) return rc;
    if ((rc = open_temp(w, opts->staging_dir))) {
        kvx_sw_free(w);
        return rc;
    }
    *out = w;
    return 0;
}

/* A key's length: 1..KVX_KEY_MAX bytes. */
static int check_key(const void *key, uint32_t key_len)
{
    if (!key || key_len == 0 || key_len > KVX_KEY_MAX)
        return kvx_fail(KVX_EINVALID, "entry: key of %u bytes (a key is 1..%u bytes)", key_len, KVX_KEY_MAX);
    return 0;
}

/* Entry w->n's key record: u8 length, the key, zeros. */
static void put_key(kvx_shard_writer *w, const void *key, uint32_t key_len)
{
    uint8_t *k = w->keys + (size_t)w->n * KVX_KEY_RECORD;
    memset(k, 0, KVX_KEY_RECORD);
    k[0] = (uint8_t)key_len;
    memcpy(k + 1, key, key_len);
}

/* Entry w->n's commit record: no sequence number yet, and its tomb byte. */
static void put_commit(kvx_shard_writer *w, uint8_t tomb)
{
    if (w->flags & KVX_FLAG_SEQ) w->seqs[w->n] = 0;
    if (w->flags & KVX_FLAG_TOMB) w->tombs[w->n] = tomb;
}

/* Grows the in-memory tables to hold at least need entries. */
int kvx_sw_grow(kvx_shard_writer *w, uint32_t need)
{
    if (need <= w->cap) return 0;
    uint32_t cap = w->cap ? w->cap : 16;
    while (cap < need) cap = cap > w->max_entries / 2 ? w->max_entries : cap * 2;
    uint8_t *c = realloc(w->coords, (size_t)cap * KVX_ENTRY_BYTES);
    if (!c) return kvx_fail(-ENOMEM, "out of memory");
    w->coords = c;
    if (w->flags & KVX_FLAG_HASHES) {
        uint64_t *h = realloc(w->hashes, (size_t)cap * 8);
        if (!h) return kvx_fail(-ENOMEM, "out of memory");
        w->hashes = h;
    }
    if (w->flags & KVX_FLAG_LINEAGE) {
        uint8_t *l = realloc(w->lineage, (size_t)cap * w->lineage_rec);
        if (!l) return kvx_fail(-ENOMEM, "out of memory");
        w->lineage = l;
    }
    if (w->flags & KVX_FLAG_DIGEST) {
        uint8_t *d = realloc(w->digests, (size_t)cap * KVX_DIGEST_BYTES);
        if (!d) return kvx_fail(-ENOMEM, "out of memory");
        w->digests = d;
    }
    if (w->flags & KVX_FLAG_SCALES) {
        float *s = realloc(w->scales, (size_t)cap * w->scale_count * sizeof(float));
        if (!s) return kvx_fail(-ENOMEM, "out of memory");
        w->scales = s;
    }
    if (w->flags & KVX_FLAG_KEYS) {
        uint8_t *k = realloc(w->keys, (size_t)cap * KVX_KEY_RECORD);
        if (!k) return kvx_fail(-ENOMEM, "out of memory");
        w->keys = k;
    }
    if (w->flags & KVX_FLAG_SEQ) {
        uint64_t *q = realloc(w->seqs, (size_t)cap * sizeof *q);
        if (!q) return kvx_fail(-ENOMEM, "out of memory");
        w->seqs = q;
    }
    if (w->flags & KVX_FLAG_TOMB) {
        uint8_t *t = realloc(w->tombs, cap);
        if (!t) return kvx_fail(-ENOMEM, "out of memory");
        w->tombs = t;
    }
    w->cap = cap;
    return 0;
}

int kvx_shard_writer_add(kvx_shard_writer *w, const kvx_entry_in *e)
{
    if (!w || !e) return kvx_fail(KVX_EINVALID, "kvx_shard_writer_add: NULL argument");
    if (w->broken) return kvx_fail(KVX_EINVALID, "kvx_shard_writer_add: %s: an append failed: the writer is broken", w->path);
    if (w->n >= w->max_entries)
        return kvx_fail(KVX_EFULL, "shard is full: max_entries %u reached", w->max_entries);
    uint32_t B = w->g.block_tokens;
    int hashes = (w->flags & KVX_FLAG_HASHES) != 0, lineage = (w->flags & KVX_FLAG_LINEAGE) != 0;
    int scales = (w->flags & KVX_FLAG_SCALES) != 0;
    if (!e->page) return kvx_fail(KVX_EINVALID, "entry: page is NULL");
    if (e->token_count == 0) return kvx_fail(KVX_ETOKENS, "entry: token_count is 0");
    if (hashes && e->token_count > B)
        return kvx_fail(KVX_ETOKENS, "entry: token_count %u exceeds block_tokens %u", e->token_count, B);
    uint64_t bytes = kvx_page_bytes(&w->g, e->token_count);
    if (!bytes || bytes > UINT32_MAX)
        return kvx_fail(KVX_EOVERFLOW, "entry: page of %u tokens does not fit kv_page_bytes (u32)",
                        e->token_count);
    int keyed = (w->flags & KVX_FLAG_KEYS) != 0;
    if (!keyed && (e->key || e->key_len || e->page_len))
        return kvx_fail(KVX_EINVALID, "entry: a key or page_len given but the shard has no key table");
    if (keyed) {
        if (e->token_count != 1) return kvx_fail(KVX_ETOKENS, "entry: a keyed page has token_count 1, not %u", e->token_count);
        int rc = check_key(e->key, e->key_len);
        if (rc) return rc;
        if (e->page_len == 0 || e->page_len > bytes)
            return kvx_fail(KVX_EINVALID, "entry: page_len %u is not 1..%llu (the shard's page size)", e->page_len,
                            (unsigned long long)bytes);
        bytes = e->page_len;
    }
    if (hashes && e->hash && e->token_count != B)
        return kvx_fail(KVX_EHASH, "entry: non-zero hash with token_count %u != block_tokens %u",
                        e->token_count, B);
    if (lineage && !e->tokens) return kvx_fail(KVX_EINVALID, "entry: lineage needs tokens");
    if (lineage && e->hash && kvx_block_hash(e->parent, e->tokens, B) != e->hash)
        return kvx_fail(KVX_ELINEAGE, "entry: hash 0x%016llx is not H(parent 0x%016llx, tokens)",
                        (unsigned long long)e->hash, (unsigned long long)e->parent);
    if (e->scales && !scales)
        return kvx_fail(KVX_EINVALID, "entry: scales given but the shard has no scale table");
    if (e->digest && !(w->flags & KVX_FLAG_DIGEST))
        return kvx_fail(KVX_EINVALID, "entry: digest given but the shard has no digest table");
    if (e->digest && (!e->hash || kvx_digest_is_zero(e->digest)))
        return kvx_fail(KVX_EINVALID, "entry: a digest needs a full block with a hash, and may not be all zero");
    if (e->digest && e->parent == 0) {
        /* block 0's digest is a function of its own tokens: check it */
        uint8_t d0[KVX_DIGEST_BYTES];
        kvx_prefix_digest_next(d0, NULL, e->tokens, B);
        if (memcmp(d0, e->digest, KVX_DIGEST_BYTES) != 0)
            return kvx_fail(KVX_ELINEAGE, "entry: digest of block 0x%016llx (parent 0) is not SHA-256 of its tokens",
                            (unsigned long long)e->hash);
    }
    if (e->scales)
        for (uint64_t k = 0; k < w->scale_count; k++)
            if (!isfinite(e->scales[k]) || !(e->scales[k] > 0.0f))
                return kvx_fail(KVX_EFORMAT, "entry: scale %llu is %g (must be finite and > 0)",
                                (unsigned long long)k, (double)e->scales[k]);
    uint32_t coord = KVX_COORD(w->shard_id, e->radix_block, e->spectral);
    uint32_t key = coord & 0xFFFFFFu;
    if (w->seen[key >> 3] & (1u << (key & 7)))
        return kvx_fail(KVX_EDUPLICATE, "entry: coordinate 0x%08x was already added", coord);
    int rc = kvx_sw_grow(w, w->n + 1);
    if (rc) return rc;

    uint64_t rel = kvx_align_up(w->kv_end, KVX_PAGE_ALIGN), abs;
    if (!kvx_add64(&abs, w->kv_data_offset, rel) || abs > (uint64_t)INT64_MAX - bytes)
        return kvx_fail(KVX_EOVERFLOW, "entry: file offset overflows");
    rc = kvx_os_pwrite_all(w->fd, e->page, (size_t)bytes, abs);
    if (rc) return kvx_fail(rc, "%s: writing page %u failed: %s", w->tmp_path, w->n, strerror(-rc));
    /* each step of pages goes to the disk while the next is copied, so the
     * seal's fsync waits for the last one only, not for every byte: from
     * the first byte in an active shard (its flush syncs every page it
     * holds), past the first 8 MiB elsewhere (a small temporary may be
     * deleted before any sync) */
    if ((w->active || abs + bytes >= w->kv_data_offset + KVX_WRITEBACK_AFTER) &&
        abs + bytes >= w->wb_from + KVX_WRITEBACK_STEP) {
        kvx_os_writeback_start(w->fd, w->wb_from, abs + bytes - w->wb_from);
        w->wb_from = abs + bytes;
    }

    uint8_t *c = w->coords + (size_t)w->n * KVX_ENTRY_BYTES;
    kvx_store32(c + KVX_E_COORD, coord);
    kvx_store32(c + KVX_E_TOKENS, e->token_count);
    kvx_store64(c + KVX_E_OFFSET, rel);
    kvx_store32(c + KVX_E_BYTES, (uint32_t)bytes);
    kvx_store32(c + KVX_E_CRC, kvx_crc32(0, e->page, (size_t)bytes));
    if (hashes) w->hashes[w->n] = e->hash;
    if (lineage) {
        uint8_t *l = w->lineage + (size_t)w->n * w->lineage_rec;
        memset(l, 0, (size_t)w->lineage_rec);
        kvx_store64(l, e->parent);
        for (uint32_t t = 0; t < e->token_count; t++) kvx_store32(l + 8 + (size_t)t * 4, e->tokens[t]);
    }
    if (w->flags & KVX_FLAG_DIGEST) {
        uint8_t *d = w->digests + (size_t)w->n * KVX_DIGEST_BYTES;
        if (e->digest) memcpy(d, e->digest, KVX_DIGEST_BYTES);
        else memset(d, 0, KVX_DIGEST_BYTES);
    }
    if (scales) {
        float *s = w->scales + (size_t)w->n * w->scale_count;
        for (uint64_t k = 0; k < w->scale_count; k++) s[k] = e->scales ? e->scales[k] : 1.0f;
    }
    if (keyed) put_key(w, e->key, e->key_len);
    put_commit(w, KVX_TOMB_PAGE);
    w->seen[key >> 3] |= (uint8_t)(1u << (key & 7));
    w->kv_end = rel + bytes;
    w->n++;
    return 0;
}

int kvx_shard_writer_add_tombstone(kvx_shard_writer *w, uint16_t radix_block, const void *key, uint32_t key_len)
{
    if (!w) return kvx_fail(KVX_EINVALID, "kvx_shard_writer_add_tombstone: NULL writer");
    if (!(w->flags & KVX_FLAG_TOMB))
        return kvx_fail(KVX_EINVALID, "tombstone: the shard has no tombstone table (KVX_FLAG_TOMB)");
    if (w->broken) return kvx_fail(KVX_EINVALID, "tombstone: %s: an append failed: the writer is broken", w->path);
    if (w->n >= w->max_entries)
        return kvx_fail(KVX_EFULL, "shard is full: max_entries %u reached", w->max_entries);
    int rc = check_key(key, key_len);
    if (rc) return rc;
    uint32_t coord = KVX_COORD(w->shard_id, radix_block, 0);
    uint32_t ck = coord & 0xFFFFFFu;
    if (w->seen[ck >> 3] & (1u << (ck & 7)))
        return kvx_fail(KVX_EDUPLICATE, "tombstone: coordinate 0x%08x was already added", coord);
    if ((rc = kvx_sw_grow(w, w->n + 1))) return rc;
    /* token_count 1, offset 0, bytes 0, crc 0: no page, no KV bytes */
    uint8_t *c = w->coords + (size_t)w->n * KVX_ENTRY_BYTES;
    memset(c, 0, KVX_ENTRY_BYTES);
    kvx_store32(c + KVX_E_COORD, coord);
    kvx_store32(c + KVX_E_TOKENS, 1);
    put_key(w, key, key_len);
    put_commit(w, KVX_TOMB_DELETE);
    w->seen[ck >> 3] |= (uint8_t)(1u << (ck & 7));
    w->n++;
    return 0;
}

int kvx_shard_writer_set_seq(kvx_shard_writer *w, uint32_t index, uint64_t seq)
{
    if (!w) return kvx_fail(KVX_EINVALID, "kvx_shard_writer_set_seq: NULL writer");
    if (!(w->flags & KVX_FLAG_SEQ))
        return kvx_fail(KVX_EINVALID, "set_seq: the shard has no sequence table (KVX_FLAG_SEQ)");
    if (index >= w->n)
        return kvx_fail(KVX_EINVALID, "set_seq: index %u, the shard has %u entries", index, w->n);
    if (seq == 0) return kvx_fail(KVX_EINVALID, "set_seq: entry %u: sequence number 0 (they start at 1)", index);
    w->seqs[index] = seq;
    return 0;
}

void kvx_shard_writer_seq_unset(kvx_shard_writer *w, uint64_t seq)
{
    if (!w || !(w->flags & KVX_FLAG_SEQ) || seq == 0) return;
    /* from the first entry that may still be 0: a commit per batch costs
     * the batch's entries, not the whole shard's */
    for (uint32_t i = w->seq_from; i < w->n; i++)
        if (w->seqs[i] == 0) w->seqs[i] = seq;
    w->seq_from = w->n;
}

uint32_t kvx_shard_writer_max(const kvx_shard_writer *w) { return w ? w->max_entries : 0; }

uint32_t kvx_shard_writer_count(const kvx_shard_writer *w) { return w ? w->n : 0; }

uint64_t kvx_shard_writer_bytes(const kvx_shard_writer *w)
{
    /* The sealed file ends on a 4096 boundary, so O_DIRECT reads of the
     * last page never run into end of file. */
    return w ? w->kv_data_offset + kvx_align_up(w->kv_end, KVX_PAGE_ALIGN) : 0;
}

/* Header and the tables for the n entries actually added, contiguous from
 * offset 0, with the meta CRC filled in. */
int kvx_sw_build_head(kvx_shard_writer *w, uint8_t **out, size_t *out_len)
{
    kvx_shard_layout lay;
    uint32_t flags = w->flags | KVX_FLAG_META_CRC;
    if (kvx_shard_layout_for(&lay, w->n, flags, w->g.block_tokens, w->g.num_layers, w->g.kv_heads))
        return kvx_fail(KVX_EOVERFLOW, "table sizes overflow"); /* cannot: fits max_entries */
    uint8_t *buf = malloc((size_t)lay.tables_end);
    if (!buf) return kvx_fail(-ENOMEM, "out of memory for the tables");
    if (w->n) memcpy(buf + lay.coord_off, w->coords, (size_t)lay.coord_bytes);
    for (uint32_t i = 0; i < w->n && (flags & KVX_FLAG_HASHES); i++)
        kvx_store64(buf + lay.hash_off + (size_t)i * 8, w->hashes[i]);
    if (lay.lineage_bytes) memcpy(buf + lay.lineage_off, w->lineage, (size_t)lay.lineage_bytes);
    if (lay.digest_bytes) memcpy(buf + lay.digest_off, w->digests, (size_t)lay.digest_bytes);
    if (lay.scale_bytes) memcpy(buf + lay.scale_off, w->scales, (size_t)lay.scale_bytes); /* LE host */
    if (lay.key_bytes) memcpy(buf + lay.key_off, w->keys, (size_t)lay.key_bytes);
    for (uint32_t i = 0; i < w->n && (flags & KVX_FLAG_SEQ); i++)
        kvx_store64(buf + lay.seq_off + (size_t)i * 8, w->seqs[i]);
    if (lay.tomb_bytes) memcpy(buf + lay.tomb_off, w->tombs, (size_t)lay.tomb_bytes);
    kvx_shard_header h = {
        .format_version = KVX_FORMAT_VERSION,
        .num_layers = (uint16_t)w->g.num_layers,
        .kv_heads = (uint16_t)w->g.kv_heads,
        .head_dim = (uint16_t)w->g.head_dim,
        .num_blocks = w->n,
        .block_tokens = w->g.block_tokens,
        .model_signature = w->g.model_signature,
        .quant = w->g.quant,
        .spectral_dim = w->spectral ? kvx_load32(w->spectral + KVX_S_DIM) : 0,
        .spectral_offset = w->spectral ? w->spectral_offset : 0,
        .kv_data_offset = w->kv_data_offset,
        .flags = flags,
        .meta_crc32c = 0,
    };
    kvx_header_encode(buf, &h);
    uint32_t crc = kvx_crc32c(0, buf, KVX_H_META_CRC);
    crc = kvx_crc32c(crc, buf + KVX_HEADER_BYTES, (size_t)(lay.tables_end - KVX_HEADER_BYTES));
    kvx_store32(buf + KVX_H_META_CRC, crc);
    *out = buf;
    *out_len = (size_t)lay.tables_end;
    return 0;
}

/* Links the O_TMPFILE at ".<name>.tmp.<pid>.<random>" beside path. */
static int link_unnamed(kvx_shard_writer *w)
{
    const char *slash = strrchr(w->path, '/');
    size_t dir_len = slash ? (size_t)(slash - w->path) + 1 : 0;
    size_t cap = strlen(w->path) + 64;
    char *name = malloc(cap), proc[64];
    if (!name) return -ENOMEM;
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", w->fd);
    int rc = -EEXIST;
    for (int attempt = 0; attempt < 16 && rc == -EEXIST; attempt++) {
        uint64_t r;
        if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) r = (uint64_t)attempt * 0x9E3779B97F4A7C15ull;
        snprintf(name, cap, "%.*s.%s.tmp.%ld.%016llx", (int)dir_len, w->path, w->path + dir_len, (long)getpid(),
                 (unsigned long long)r);
        rc = kvx_os.linkat(AT_FDCWD, proc, AT_FDCWD, name, AT_SYMLINK_FOLLOW) == 0 ? 0 : -errno;
    }
    if (rc) {
        free(name);
        return rc;
    }
    free(w->tmp_path);
    w->tmp_path = name;
    w->unnamed = 0; /* from here on it has a name to remove on failure */
    return 0;
}

/* The seal's work; with keep_name (a named temporary file only), it stops
 * after the file is complete, fsynced and closed: the file stays under its
 * temporary name, whose last path component goes to keep_name. */
static int writer_seal(kvx_shard_writer *w, char *keep_name, size_t keep_cap)
{
    if (!w) return kvx_fail(KVX_EINVALID, "kvx_shard_writer_seal: NULL writer");
    if (w->active) {
        kvx_sw_discard(w); /* closes it; the active file stays */
        return kvx_fail(KVX_EINVALID, "kvx_shard_writer_seal: an active file is sealed by kvx_shard_writer_seal_active");
    }
    if (keep_name && (w->unnamed || !w->tmp_path || strlen(w->tmp_path) >= PATH_MAX)) {
        kvx_sw_discard(w);
        return kvx_fail(KVX_EINVALID, "shard writer: a staged seal needs a named temporary file (staging_dir)");
    }
    /* every entry of a sequence table carries its commit's number: a 0
     * would be refused by every reader */
    for (uint32_t i = 0; i < w->n && (w->flags & KVX_FLAG_SEQ); i++)
        if (w->seqs[i] == 0) {
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s", w->path);
            kvx_sw_discard(w);
            return kvx_fail(KVX_EINVALID, "%s: seal refused: entry %u has no sequence number (0)", path, i);
        }
    uint8_t *head = NULL;
    size_t head_len = 0;
    int rc = kvx_sw_build_head(w, &head, &head_len);
    const char *step = "building the header";
    if (!rc) {
        step = "writing the header and tables";
        rc = kvx_os_pwrite_all(w->fd, head, head_len, 0);
    }
    free(head);
    if (!rc && w->spectral) {
        step = "writing the spectral bundle";
        rc = kvx_os_pwrite_all(w->fd, w->spectral, (size_t)w->spectral_len, w->spectral_offset);
    }
    if (!rc) {
        step = "setting the file size";
        rc = kvx_os.ftruncate(w->fd, (off_t)kvx_shard_writer_bytes(w)) ? -errno : 0;
    }
    if (!rc) {
        step = "fsync of the file";
        rc = kvx_os.fsync(w->fd) ? -errno : 0;
    }
    if (!rc && w->unnamed) {
        /* give the unnamed file a temporary name, then the rename below
         * puts it in place as for a named one */
        step = "naming the file";
        rc = link_unnamed(w);
    }
    if (!rc) {
        step = "closing the file";
        int fd = w->fd;
        w->fd = -1;
        rc = kvx_os.close(fd) ? -errno : 0;
    }
    if (!rc && keep_name) {
        const char *slash = strrchr(w->tmp_path, '/'), *base = slash ? slash + 1 : w->tmp_path;
        if (strlen(base) >= keep_cap) {
            step = "keeping the staged name";
            rc = -ENAMETOOLONG;
        } else {
            memcpy(keep_name, base, strlen(base) + 1);
            free(w->tmp_path);
            w->tmp_path = NULL; /* kept: writer_free must not unlink it */
            kvx_sw_free(w);
            return 0;
        }
    }
    if (!rc) {
        step = "renaming into place";
        /* a writer with a staging directory (the store's) never takes an
         * existing file's name (DESIGN.md rule 2) */
        rc = (w->no_replace ? kvx_os.rename_noreplace : kvx_os.rename)(w->tmp_path, w->path) ? -errno : 0;
    }
    if (!rc) {
        step = "fsync of the directory";
        rc = kvx_os_fsync_parent(w->path);
        /* The rename is not durable: take the file back out, so a failed
         * seal never leaves a file the caller was told is not there. */
        if (rc) kvx_os.unlink(w->path);
    }
    if (rc) {
        if (rc > 0) rc = -EIO; /* paranoia: an errno of 0 is still a failure */
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s", w->path);
        kvx_sw_discard(w);
        return kvx_fail(rc, "%s: seal failed while %s: %s", path, step, kvx_strerror(rc));
    }
    free(w->tmp_path);
    w->tmp_path = NULL;
    kvx_sw_free(w);
    return 0;
}

int kvx_shard_writer_seal(kvx_shard_writer *w) { return writer_seal(w, NULL, 0); }

int kvx_shard_writer_seal_staged(kvx_shard_writer *w, char *name, size_t cap)
{
    if (!name || !cap) {
        kvx_sw_discard(w);
        return kvx_fail(KVX_EINVALID, "kvx_shard_writer_seal_staged: no room for the name");
    }
    return writer_seal(w, name, cap);
}

void kvx_shard_writer_abort(kvx_shard_writer *w) { kvx_sw_discard(w); }

int kvx_shard_writer_page(const kvx_shard_writer *w, uint32_t index, void *buf, size_t cap, uint32_t *out_len)
{
    if (!w || index >= w->n || w->fd < 0) return kvx_fail(KVX_EINVALID, "kvx_shard_writer_page: no page %u", index);
    if ((w->flags & KVX_FLAG_TOMB) && w->tombs[index] != KVX_TOMB_PAGE)
        return kvx_fail(KVX_EINVALID, "kvx_shard_writer_page: entry %u is a tombstone", index);
    const uint8_t *c = w->coords + (size_t)index * KVX_ENTRY_BYTES;
    uint32_t bytes = kvx_load32(c + KVX_E_BYTES);
    uint64_t off = w->kv_data_offset + kvx_load64(c + KVX_E_OFFSET);
    if (bytes > cap) return kvx_fail(KVX_EINVALID, "kvx_shard_writer_page: page %u has %u bytes, room for %zu", index, bytes, cap);
    size_t got = 0;
    int rc = kvx_os_pread_all(w->fd, buf, bytes, off, &got);
    if (rc) return kvx_fail(rc, "%s: reading back page %u: %s", w->tmp_path ? w->tmp_path : w->path, index, strerror(-rc));
    if (got != bytes) return kvx_fail(-EIO, "%s: page %u read back short", w->tmp_path ? w->tmp_path : w->path, index);
    *out_len = bytes;
    return 0;
}
