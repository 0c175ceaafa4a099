/*
 * store_holes.c - holes: evicted pages freed in place (docs/APPENDS.md
 * "Holes", docs/STORE.md "Holes"). The free log DIR/FREED
 * (format/free_log.c) says which pages of live shards are gone; this file
 * keeps its rows that free a live entry, commits new frees and punches
 * their extents.
 *
 * Rules kept:
 * - A page is freed by a durable record first (the log's append and its
 *   fdatasync), then leaves the catalog, then its extent is punched: a
 *   crash at any step leaves a page that is either whole and served, or
 *   named by the log (a miss, whatever its bytes read).
 * - A punch never lands under a view. In this process: free_seq is raised
 *   after the catalog commit and before any punch, and a lookup whose
 *   views were taken across a raise looks again (store_lookup.c); a shard
 *   whose handles are referenced (views, a copy in progress) is not punched
 *   now but at a later eviction, when none is. In other processes: their
 *   read-only handles hold a shared flock on DIR/READERS while open; the
 *   writer punches only while it holds that file's exclusive lock.
 * - A row frees an entry only where the generation, entry index and block
 *   hash agree and the entry was written before the record (its sequence
 *   number below the record's): an old row never frees a later file's entry.
 */
#include "store.h"
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_FREE_LOG "FREED"
#define ST_READERS "READERS"

static int st_row_cmp(const void *a, const void *b)
{
    const st_freed_row *x = a, *y = b;
    if (x->gen != y->gen) return x->gen < y->gen ? -1 : 1;
    return x->entry < y->entry ? -1 : x->entry > y->entry;
}

static const st_freed_row *st_row_find(const st_freed_row *rows, size_t n, uint64_t gen, uint32_t entry)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        const st_freed_row *r = &rows[mid];
        if (r->gen == gen && r->entry == entry) return r;
        if (r->gen < gen || (r->gen == gen && r->entry < entry))
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int kvx_st_freed(const kvx_store *s, uint64_t gen, uint32_t entry)
{
    return s->nfreed && st_row_find(s->freed, s->nfreed, gen, entry) != NULL;
}

uint64_t kvx_st_live_bytes(const kvx_store *s, uint32_t b)
{
    if (!s->reg->live[b]) return 0;
    uint64_t f = s->reg->rec[b].file_bytes, h = s->freed_bytes[b];
    return h < f ? f - h : 0;
}

/* The shard byte the registry names gen under, or -1. */
static int st_byte_of(const kvx_cat_registry *reg, uint64_t gen)
{
    for (int b = 0; b < ST_SLOTS; b++)
        if (reg->live[b] && reg->rec[b].gen == gen) return b;
    return -1;
}

/* The free log's rows that free an entry of a shard reg names (each
 * checked against the entry: generation, index, hash, and written before
 * the record), sorted, into *out (malloc'd); the log's state into
 * *out_log (nullable, rows not kept); rows freeing nothing counted in
 * *out_stale (nullable). -ENOENT when there is no log. */
static int st_freed_rows_read(kvx_store *s, const kvx_cat_registry *reg, st_freed_row **out, size_t *out_n,
                              kvx_free_log *out_log, uint64_t *out_stale)
{
    *out = NULL;
    *out_n = 0;
    if (out_stale) *out_stale = 0;
    kvx_free_log l;
    int rc = kvx_free_log_read(s->dirfd, ST_FREE_LOG, &l);
    if (rc == -ENOENT) {
        kvx_clear_error();
        if (out_log) memset(out_log, 0, sizeof *out_log);
        return -ENOENT;
    }
    if (rc) return rc;
    st_freed_row *rows = l.n ? malloc(l.n * sizeof *rows) : NULL;
    if (l.n && !rows) {
        kvx_free_log_free(&l);
        return kvx_fail(-ENOMEM, "store: out of memory for the free log's %zu rows", l.n);
    }
    size_t n = 0;
    uint64_t stale = 0;
    kvx_shard *sh = NULL;
    uint64_t sh_gen = 0;
    for (size_t i = 0; i < l.n; i++) {
        const kvx_freed *f = &l.rows[i];
        int b = st_byte_of(reg, f->gen);
        if (b < 0) {
            stale++; /* its file is gone */
            continue;
        }
        if (!sh || sh_gen != f->gen) {
            kvx_shard_close(sh);
            sh = kvx_st_shard_get(s, (uint32_t)b, f->gen);
            sh_gen = f->gen;
        }
        kvx_entry e;
        uint64_t seq = 0;
        int tomb = 0;
        if (!sh || f->entry >= kvx_shard_get_info(sh)->num_blocks || kvx_shard_entry(&e, sh, f->entry) != 0 ||
            kvx_shard_entry_commit(sh, f->entry, &seq, &tomb) != 0 || tomb || e.hash != f->hash ||
            (seq && seq >= f->seq)) {
            /* another entry than the one freed (or a file that cannot be
             * opened now: its pages stay as they are, never freed by
             * guess) */
            stale++;
            continue;
        }
        kvx_page_span sp;
        st_freed_row *r = &rows[n++];
        r->gen = f->gen;
        r->entry = f->entry;
        r->punched = 0;
        r->bytes = kvx_shard_page_span(&sp, sh, f->entry) == 0 ? kvx_align_up(sp.bytes, 4096) : 0;
    }
    kvx_shard_close(sh);
    kvx_clear_error();
    if (n > 1) qsort(rows, n, sizeof *rows, st_row_cmp);
    /* one row per entry (a row freed twice: the later record is stale) */
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (w && rows[w - 1].gen == rows[i].gen && rows[w - 1].entry == rows[i].entry) {
            stale++;
            continue;
        }
        rows[w++] = rows[i];
    }
    *out = rows;
    *out_n = w;
    if (out_stale) *out_stale = stale;
    if (out_log) {
        free(l.rows);
        l.rows = NULL;
        *out_log = l;
    } else {
        kvx_free_log_free(&l);
    }
    return 0;
}

int kvx_st_freed_bytes_read(kvx_store *s, const kvx_cat_registry *reg, uint64_t *out)
{
    *out = 0;
    st_freed_row *rows;
    size_t n;
    int rc = st_freed_rows_read(s, reg, &rows, &n, NULL, NULL);
    if (rc == -ENOENT) return 0;
    if (rc) return rc;
    for (size_t i = 0; i < n; i++) *out += rows[i].bytes;
    free(rows);
    return 0;
}

/* Drops the rows of shards no longer live (a drop, a rewrite) and counts
 * each live shard's freed bytes again. The rows are sorted by generation:
 * one registry look a run of them. */
static void st_recount(kvx_store *s)
{
    memset(s->freed_bytes, 0, sizeof s->freed_bytes);
    size_t w = 0;
    for (size_t i = 0; i < s->nfreed;) {
        size_t j = i;
        while (j < s->nfreed && s->freed[j].gen == s->freed[i].gen) j++;
        int b = st_byte_of(s->reg, s->freed[i].gen);
        for (size_t k = i; k < j && b >= 0; k++) {
            s->freed_bytes[b] += s->freed[k].bytes;
            s->freed[w++] = s->freed[k];
        }
        i = j;
    }
    s->nfreed = w;
}

/* Opens DIR/READERS into s->readers_fd (create: made when missing), a
 * regular file only; its flocks are the callers'. */
static int st_readers_open(kvx_store *s, int create)
{
    if (s->readers_fd >= 0) return 0;
    int fd = -1;
    unsigned mode = 0;
    int rc = kvx_os_openat_regular(s->dirfd, ST_READERS, O_RDONLY | (create ? O_CREAT : 0), 0600, &fd, &mode);
    if (rc == 1)
        return kvx_fail(KVX_EPATH, "store %s: %s is a %s, not a regular file", s->dir, ST_READERS,
                        kvx_file_type_name(mode));
    if (rc) return kvx_fail(rc, "store %s: open %s: %s", s->dir, ST_READERS, strerror(-rc));
    s->readers_fd = fd;
    return 0;
}

/*
 * shards/ itself is the readers' second lock: a read-only handle holds a
 * shared flock on it for its whole life too, so a DIR/READERS removed by
 * hand (the next writer makes a new one, which an old reader does not
 * hold) cannot hide an open reader from a later writer. A file system that
 * takes no flock on a directory (NFS) leaves READERS alone to tell; so
 * does an older release's reader, which holds READERS only.
 */
static void st_readers_dir_join(kvx_store *s)
{
    if (s->shardsfd < 0) return;
    while (kvx_os.flock(s->shardsfd, LOCK_SH) != 0 && errno == EINTR)
        ;
}

/* 1 while a reader holds shards/ (the writer's exclusive try fails); else
 * 0, with the writer then holding it exclusively when *held is set */
static int st_readers_dir_busy(kvx_store *s, int *held)
{
    *held = 0;
    if (s->shardsfd < 0) return 0;
    if (kvx_os.flock(s->shardsfd, LOCK_EX | LOCK_NB) == 0) {
        *held = 1;
        return 0;
    }
    return errno == EWOULDBLOCK || errno == EAGAIN || errno == EINTR;
}

int kvx_st_readers_join(kvx_store *s)
{
    st_readers_dir_join(s);
    /* a reader changes nothing (DESIGN.md rule 3): no DIR/READERS, no lock
     * to take; a writer that makes the file frees no page in place in that
     * session (kvx_st_holes_load), so every reader open meanwhile is safe */
    int rc = st_readers_open(s, 0);
    if (rc == -ENOENT) {
        kvx_clear_error();
        return 0;
    }
    if (rc) return rc;
    while (kvx_os.flock(s->readers_fd, LOCK_SH) != 0)
        if (errno != EINTR) return kvx_fail(-errno, "store %s: flock %s: %s", s->dir, ST_READERS, strerror(errno));
    return 0;
}

/* The generations that have a file in shards/ (a sealed or an active
 * name), sorted, into *out. */
typedef struct st_gens {
    uint64_t *g;
    size_t n, cap;
} st_gens;

static int st_gens_add(kvx_store *s, int dirfd, const char *name, void *ctx)
{
    (void)s;
    (void)dirfd;
    st_gens *x = ctx;
    uint64_t gen = 0;
    uint32_t byte = 0;
    if (!kvx_st_parse_name(name, &gen) && !kvx_st_parse_active_name(name, &gen, &byte)) return 0;
    if (x->n == x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 64;
        uint64_t *g = realloc(x->g, cap * sizeof *g);
        if (!g) return kvx_fail(-ENOMEM, "store: out of memory");
        x->g = g;
        x->cap = cap;
    }
    x->g[x->n++] = gen;
    return 0;
}

static int st_u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Rewrites the free log with the rows of generations that still have a
 * file in shards/, each row under its own sequence number (a row is
 * dropped only when its file is gone: a file that cannot be judged now
 * keeps its rows, so a punched page never loses its record). */
static int st_log_compact(kvx_store *s)
{
    kvx_free_log l;
    int rc = kvx_free_log_read(s->dirfd, ST_FREE_LOG, &l);
    if (rc) return rc == -ENOENT ? 0 : rc;
    st_gens gs = {NULL, 0, 0};
    rc = kvx_st_each_file(s, s->shardsfd, st_gens_add, &gs);
    if (rc) {
        free(gs.g);
        kvx_free_log_free(&l);
        return rc;
    }
    if (gs.n) qsort(gs.g, gs.n, sizeof *gs.g, st_u64_cmp);
    size_t w = 0;
    for (size_t i = 0; i < l.n; i++)
        if (gs.n && bsearch(&l.rows[i].gen, gs.g, gs.n, sizeof *gs.g, st_u64_cmp)) l.rows[w++] = l.rows[i];
    free(gs.g);
    kvx_free_log out;
    rc = kvx_free_log_write(s->dirfd, ST_FREE_LOG, l.rows, w, 0, &out);
    kvx_free_log_free(&l);
    if (rc) return rc;
    /* the next record's chain and number follow the rewritten log's */
    uint64_t max_seq = s->flog.max_seq;
    kvx_free_log_free(&s->flog);
    s->flog = out;
    if (max_seq > s->flog.max_seq) s->flog.max_seq = max_seq;
    if (s->free_fd >= 0) { /* the open descriptor is of the old file */
        kvx_os.close(s->free_fd);
        s->free_fd = -1;
    }
    return 0;
}

int kvx_st_holes_load(kvx_store *s, int count_cut)
{
    free(s->freed);
    s->freed = NULL;
    s->nfreed = s->capfreed = 0;
    memset(s->freed_bytes, 0, sizeof s->freed_bytes);
    kvx_free_log_free(&s->flog);
    if (s->holes && s->readers_fd < 0) {
        /* DIR/READERS: read-only handles hold a shared lock on it while
         * open. One opened before it existed holds none, so a writer that
         * makes it frees nothing in place this session (whole shards, as
         * without KVX_STORE_HOLES); the next writer's open does. */
        int rc = st_readers_open(s, 0);
        if (rc == -ENOENT) {
            kvx_clear_error();
            if ((rc = st_readers_open(s, 1)) == 0) s->holes = s->holes_new_store;
        }
        if (rc) return rc;
    }
    uint64_t stale = 0;
    int rc = st_freed_rows_read(s, s->reg, &s->freed, &s->nfreed, &s->flog, &stale);
    if (rc == -ENOENT) return 0; /* nothing was ever freed */
    if (rc) return rc;
    /* sequence numbers only grow: a record whose catalog commit a crash
     * lost is above every number the shards hold */
    if (s->flog.max_seq >= s->next_seq) s->next_seq = s->flog.max_seq + 1;
    s->capfreed = s->nfreed;
    st_recount(s);
    /* a free whose catalog commit a crash lost (the catalog lags the
     * files): its entries leave the catalog now */
    kvx_cat_snap *snap = NULL;
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    rc = kvx_cat_snap_begin(s->cat, &snap);
    size_t ndel = 0;
    for (size_t i = 0; i < s->nfreed && !rc; i++) {
        int b = st_byte_of(s->reg, s->freed[i].gen);
        uint32_t coord = KVX_COORD((uint32_t)b, s->freed[i].entry, 0);
        kvx_cat_coord cv;
        int g = kvx_cat_coord_get(snap, coord, &cv);
        if (g == KVX_ENOTFOUND) continue;
        if (g) {
            rc = g;
            break;
        }
        if (cv.gen != s->freed[i].gen) continue;
        rc = kvx_cat_edit_del_block(&e, coord, cv.hash, cv.gen);
        ndel++;
    }
    kvx_cat_snap_end(snap);
    if (!rc && ndel) {
        /* at a writer's open, counted as the eviction that freed them would
         * have (its commit was cut): kvx_store_stat's evicted_blocks */
        if (count_cut) {
            kvx_cat_stats delta = {0};
            delta.evicted_blocks = ndel;
            kvx_cat_edit_stats(&e, &delta, 0);
        }
        rc = kvx_cat_apply(s->cat, &e);
    }
    kvx_cat_edit_free(&e);
    if (rc) return rc;
    /* rows of files gone, a torn tail: the log is rewritten without them,
     * every other row kept with its own number */
    if (stale || s->flog.tail) rc = st_log_compact(s);
    if (rc) return rc;
    return 0;
}

void kvx_st_holes_close(kvx_store *s)
{
    if (s->free_fd >= 0) kvx_os.close(s->free_fd);
    if (s->readers_fd >= 0) kvx_os.close(s->readers_fd);
    s->free_fd = s->readers_fd = -1;
    kvx_free_log_free(&s->flog);
    free(s->freed);
    s->freed = NULL;
    s->nfreed = s->capfreed = 0;
}

/* May shard (b, gen) be punched now: no handle of it in this process is
 * referenced but by the cache? Its cached handle is dropped when so (the
 * next lookup opens a fresh one, with fresh page marks). */
static int st_unviewed(kvx_store *s, uint32_t b, uint64_t gen)
{
    pthread_rwlock_wrlock(&s->cache_lock);
    st_cache *c = &s->cache[b];
    int busy = 0;
    size_t w = 0;
    for (size_t i = 0; i < c->nretired; i++) {
        kvx_shard *r = c->retired[i];
        if (kvx_shard_refs(r) > 1) {
            busy |= 1; /* kept: a view of some generation still holds it */
            c->retired[w++] = r;
        } else {
            kvx_shard_close(r); /* ours alone: gone */
        }
    }
    c->nretired = w;
    kvx_shard *old = NULL;
    if (!busy && c->gen == gen && c->sh) {
        if (kvx_shard_refs(c->sh) > 1)
            busy = 1;
        else {
            old = c->sh;
            c->sh = NULL;
            c->gen = 0;
        }
    }
    pthread_rwlock_unlock(&s->cache_lock);
    kvx_shard_close(old);
    return !busy;
}

int kvx_st_holes_now(kvx_store *s)
{
    if (!s->holes || s->readers_fd < 0) return 0;
    if (kvx_os.flock(s->readers_fd, LOCK_EX | LOCK_NB) != 0) return 0;
    int held, busy = st_readers_dir_busy(s, &held);
    if (held) kvx_os.flock(s->shardsfd, LOCK_UN);
    kvx_os.flock(s->readers_fd, LOCK_UN);
    return !busy;
}

int kvx_st_punch_pending(kvx_store *s)
{
    int any = 0;
    for (size_t i = 0; i < s->nfreed && !any; i++) any = !s->freed[i].punched;
    if (!any || s->readers_fd < 0) return 0;
    /* readers of other processes: none may hold a view while a punch runs */
    if (kvx_os.flock(s->readers_fd, LOCK_EX | LOCK_NB) != 0) {
        s->punch_deferred++;
        return 0;
    }
    int dir_held;
    if (st_readers_dir_busy(s, &dir_held)) {
        kvx_os.flock(s->readers_fd, LOCK_UN);
        s->punch_deferred++;
        return 0;
    }
    int rc = 0;
    for (size_t i = 0; i < s->nfreed && !rc;) {
        uint64_t gen = s->freed[i].gen;
        size_t j = i;
        while (j < s->nfreed && s->freed[j].gen == gen) j++;
        int b = st_byte_of(s->reg, gen), todo = 0;
        for (size_t k = i; k < j; k++) todo |= !s->freed[k].punched;
        if (b < 0 || !todo) {
            i = j;
            continue;
        }
        if (!st_unviewed(s, (uint32_t)b, gen)) {
            s->punch_deferred++;
            i = j;
            continue;
        }
        kvx_shard *sh = NULL;
        char name[ST_ACTIVE_NAME_MAX];
        int orc = kvx_st_open_gen(s, (uint32_t)b, gen, &sh, name, sizeof name);
        int fd = -1;
        unsigned mode = 0;
        if (orc == 0 && kvx_os_openat_regular(s->shardsfd, name, O_RDWR, 0, &fd, &mode) != 0) fd = -1;
        for (size_t k = i; k < j && fd >= 0; k++) {
            st_freed_row *r = &s->freed[k];
            kvx_page_span sp;
            if (r->punched || kvx_shard_page_span(&sp, sh, r->entry) != 0 || !sp.bytes) continue;
            /* the page's extent: it starts 4096-aligned, and the next page no
             * sooner than its last 4096-byte block ends (FORMAT.md "KV pages") */
            if (sp.offset % 4096) continue;
            off_t len = (off_t)kvx_align_up(sp.bytes, 4096);
            if (kvx_os.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)sp.offset, len) != 0) {
                /* no holes on this file system (EOPNOTSUPP), or a failure: the
                 * page stays freed, its bytes on disk until gc rewrites or
                 * drops the shard */
                if (errno == EOPNOTSUPP) s->holes = 0;
                break;
            }
            r->punched = 1;
            s->punched++;
        }
        if (fd >= 0) kvx_os.close(fd);
        kvx_shard_close(sh);
        kvx_clear_error();
        st_unviewed(s, (uint32_t)b, gen); /* the handle a lookup opened meanwhile saw the old mtime */
        i = j;
    }
    if (dir_held) kvx_os.flock(s->shardsfd, LOCK_UN);
    kvx_os.flock(s->readers_fd, LOCK_UN);
    return rc;
}

int kvx_st_free_commit(kvx_store *s, const st_free_page *list, size_t n)
{
    if (!n) return 0;
    int rc = 0;
    if (s->free_fd < 0) {
        if (!s->flog.end) rc = kvx_free_log_write(s->dirfd, ST_FREE_LOG, NULL, 0, 0, &s->flog);
        unsigned mode = 0;
        if (!rc && (rc = kvx_os_openat_regular(s->dirfd, ST_FREE_LOG, O_RDWR, 0, &s->free_fd, &mode)) != 0) {
            s->free_fd = -1;
            rc = rc == 1 ? kvx_fail(KVX_EPATH, "store %s: %s is not a regular file", s->dir, ST_FREE_LOG)
                         : kvx_fail(rc, "store %s: open %s: %s", s->dir, ST_FREE_LOG, strerror(-rc));
        }
        if (rc) return rc;
    }
    kvx_freed *rows = malloc(n * sizeof *rows);
    st_freed_row *merged = malloc((s->nfreed + n) * sizeof *merged);
    if (!rows || !merged) {
        free(rows);
        free(merged);
        return kvx_fail(-ENOMEM, "store: out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        rows[i].gen = list[i].gen;
        rows[i].hash = list[i].hash;
        rows[i].entry = list[i].entry;
        rows[i].seq = 0;
    }
    /* the record takes a sequence number of its own: above every entry it
     * frees, and the catalog's next number follows it */
    uint64_t seq = s->next_seq++;
    rc = kvx_free_log_append(s->free_fd, &s->flog, rows, n, seq);
    free(rows);
    if (rc) {
        free(merged);
        return rc;
    }
    /* durable: the pages are gone whatever follows (a failed catalog
     * commit is mended by the next writer's open, kvx_st_holes_load) */
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    for (size_t i = 0; i < n && !rc; i++)
        rc = kvx_cat_edit_del_block(&e, KVX_COORD(list[i].byte, list[i].entry, 0), list[i].hash, list[i].gen);
    kvx_cat_edit_next_seq(&e, s->next_seq);
    kvx_cat_stats delta = {0};
    delta.evicted_blocks = n;
    kvx_cat_edit_stats(&e, &delta, 0);
    if (!rc) rc = kvx_cat_apply(s->cat, &e);
    kvx_cat_edit_free(&e);
    for (size_t i = 0; i < n; i++) {
        merged[s->nfreed + i].gen = list[i].gen;
        merged[s->nfreed + i].entry = list[i].entry;
        merged[s->nfreed + i].bytes = list[i].bytes;
        merged[s->nfreed + i].punched = 0;
        s->freed_bytes[list[i].byte] += list[i].bytes;
    }
    if (s->nfreed) memcpy(merged, s->freed, s->nfreed * sizeof *merged);
    free(s->freed);
    s->freed = merged;
    s->nfreed += n;
    s->capfreed = s->nfreed;
    qsort(s->freed, s->nfreed, sizeof *s->freed, st_row_cmp);
    /* handles of these shards now open (a warmup's) skip the pages */
    pthread_rwlock_rdlock(&s->cache_lock);
    for (size_t i = 0; i < n; i++) {
        st_cache *c = &s->cache[list[i].byte];
        if (c->sh && c->gen == list[i].gen) kvx_shard_mark_freed(c->sh, list[i].entry);
    }
    pthread_rwlock_unlock(&s->cache_lock);
    if (rc) {
        /* the catalog still names them: never punched while it does, so this
         * writer frees nothing more in place (whole shards); the next
         * writer's open takes them out of the catalog, then punches */
        s->holes = 0;
        return rc;
    }
    atomic_fetch_add(&s->free_seq, 1);
    atomic_thread_fence(memory_order_seq_cst);
    return kvx_st_punch_pending(s);
}

/* The rows of shards no longer live leave the set (a drop, a rewrite). */
void kvx_st_holes_forget(kvx_store *s) { st_recount(s); }

typedef struct st_vf {
    uint32_t *bad;
    int *code;
    size_t n, cap;
    int oom;
} st_vf;

static void st_vf_note(void *ctx, uint32_t index, int code)
{
    st_vf *v = ctx;
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        uint32_t *b = realloc(v->bad, cap * sizeof *b);
        int *c = b ? realloc(v->code, cap * sizeof *c) : NULL;
        if (b) v->bad = b;
        if (c) v->code = c;
        if (!b || !c) {
            v->oom = 1;
            return;
        }
        v->cap = cap;
    }
    v->bad[v->n] = index;
    v->code[v->n++] = code;
}

static int st_freed_cmp(const void *a, const void *b)
{
    const kvx_freed *x = a, *y = b;
    if (x->gen != y->gen) return x->gen < y->gen ? -1 : 1;
    if (x->entry != y->entry) return x->entry < y->entry ? -1 : 1;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

void kvx_st_log_sort(kvx_free_log *l)
{
    if (l->n > 1) qsort(l->rows, l->n, sizeof *l->rows, st_freed_cmp);
}

int kvx_st_log_frees(const kvx_free_log *l, const kvx_shard *sh, uint64_t gen, uint32_t index)
{
    size_t lo = 0, hi = l->n;
    while (lo < hi) { /* the first row at or after (gen, index) */
        size_t mid = lo + (hi - lo) / 2;
        const kvx_freed *f = &l->rows[mid];
        if (f->gen < gen || (f->gen == gen && f->entry < index))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo == l->n || l->rows[lo].gen != gen || l->rows[lo].entry != index) return 0;
    kvx_entry e;
    uint64_t seq = 0;
    int tomb = 0;
    if (kvx_shard_entry(&e, sh, index) || kvx_shard_entry_commit(sh, index, &seq, &tomb) || tomb) return 0;
    for (size_t i = lo; i < l->n && l->rows[i].gen == gen && l->rows[i].entry == index; i++)
        if (l->rows[i].hash == e.hash && (!seq || seq < l->rows[i].seq)) return 1;
    return 0;
}

int kvx_st_verify_pages(kvx_store *s, const kvx_free_log *given, const kvx_shard *sh, uint64_t gen, uint32_t *out_bad,
                        uint32_t *out_freed, void (*report)(void *ctx, uint32_t index, int code), void *ctx)
{
    st_vf v = {NULL, NULL, 0, 0, 0};
    uint32_t bad = 0, freed = 0;
    int rc = kvx_shard_verify(sh, &bad, st_vf_note, &v);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", kvx_last_error());
    kvx_free_log l;
    int have = 0;
    if (given) {
        l = *given;
        have = 1;
    } else if (v.n && !v.oom) {
        /* the pages that failed: any the free log names is a miss, not damage */
        int lr = kvx_free_log_read(s->dirfd, "FREED", &l);
        have = lr == 0;
        if (have) kvx_st_log_sort(&l);
        if (lr) kvx_clear_error(); /* no log, or none readable: every failure is damage */
    }
    uint32_t left = 0;
    for (size_t i = 0; i < v.n; i++) {
        if (have && kvx_st_log_frees(&l, sh, gen, v.bad[i])) {
            freed++;
            continue;
        }
        left++;
        if (report) report(ctx, v.bad[i], v.code[i]);
    }
    if (have && !given) kvx_free_log_free(&l);
    free(v.bad);
    free(v.code);
    if (v.oom) left = bad; /* cannot tell them apart: all damage */
    if (out_bad) *out_bad = left;
    if (out_freed) *out_freed = v.oom ? 0 : freed;
    if (rc && bad && !left) {
        kvx_clear_error(); /* every failure a freed page's: the shard is sound */
        return 0;
    }
    if (rc) kvx_fail(rc, "%s", msg);
    return rc;
}

int kvx_st_shard_sound(kvx_store *s, uint32_t b, uint64_t gen, char *why, size_t cap)
{
    kvx_shard *sh = NULL;
    int rc = kvx_st_open_gen(s, b, gen, &sh, NULL, 0);
    if (rc == -ENOENT) return 1; /* nothing left to delete */
    if (rc && st_open_transient(rc)) return -1;
    if (rc) {
        snprintf(why, cap, "cannot be validated: %s (%s)", kvx_last_error(), kvx_err_name(rc));
        return 0;
    }
    uint32_t bad = 0;
    rc = kvx_st_verify_pages(s, NULL, sh, gen, &bad, NULL, NULL, NULL); /* a freed page is no damage */
    kvx_shard_close(sh);
    if (rc && bad) {
        snprintf(why, cap, "%u damaged or missing page(s) (shard %u); its good blocks were %s", bad, b,
                 "copied or evicted");
        return 0;
    }
    return rc && st_open_transient(rc) ? -1 : 1;
}
