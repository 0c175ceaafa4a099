/*
 * store_active.c - the store's active shard (docs/STORE.md "Appends"):
 * one file of the lineage kind that grows by appends, a flush's blocks
 * one journal record (format/shard_append.c), so small flushes stop
 * making small files that compaction must merge (each merged page written
 * again; issue 41 "one write per byte put").
 *
 * Rule kept: an active shard's blocks are acknowledged by its record (its
 * pages durable first, then the record), and the catalog names them only
 * after; nothing removes or shortens an active file but its own seal (in
 * place, pages unmoved), recovery's seal or a failed commit's cut
 * (sealed below its record); an active file that cannot be
 * read goes to quarantine/, never away. One batch at a time owns it: its
 * unflushed blocks are in it, so an append never carries another batch's
 * blocks; the other batches write their own files meanwhile.
 */
#include "store_plan.h"
#include "common/os.h"
#include "format/shard_journal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Is the active writer full (no room for one more block)? */
static int st_active_full(const kvx_store *s, kvx_shard_writer *w)
{
    return kvx_shard_writer_count(w) >= s->max_entries || kvx_shard_writer_bytes(w) + s->page_bytes > s->target;
}

/* A new active shard on a free byte and a new generation. */
static int st_active_create(kvx_store *s)
{
    uint8_t b;
    uint64_t gen;
    int rc = kvx_st_alloc_gen(s, NULL, &b, &gen);
    if (rc) return rc;
    char name[ST_ACTIVE_NAME_MAX];
    kvx_st_active_name(name, gen, b);
    char *path = kvx_st_join(s->shards_path, name);
    if (!path) return kvx_fail(-ENOMEM, "store: out of memory");
    kvx_active_params p;
    kvx_st_active_params(s, b, gen, &p);
    kvx_shard_writer *w;
    rc = kvx_shard_writer_create_active(&w, path, &p);
    free(path);
    if (rc) return rc;
    struct stat st;
    if (kvx_os.fstatat(s->shardsfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        rc = -errno;
        kvx_shard_writer_abort(w);
        kvx_os.unlinkat(s->shardsfd, name, 0); /* nothing acknowledged in it yet */
        return kvx_fail(rc, "store %s: stat shards/%s: %s", s->dir, name, strerror(-rc));
    }
    memset(&s->act, 0, sizeof s->act);
    s->act.w = w;
    s->act.byte = b;
    s->act.gen = gen;
    s->act.ino = (uint64_t)st.st_ino;
    return 0;
}

/* Closes the active writer without a seal: the file stays as its records
 * left it (a live shard read by its active name, sealed by the next
 * writer's recovery), or goes when it never held a record. */
static void st_active_drop(kvx_store *s)
{
    if (!s->act.w) return;
    int empty = kvx_shard_writer_appended(s->act.w) == 0 && !s->act.registered;
    kvx_shard_writer_abort(s->act.w);
    if (empty) {
        char name[ST_ACTIVE_NAME_MAX];
        kvx_st_active_name(name, s->act.gen, s->act.byte);
        kvx_os.unlinkat(s->shardsfd, name, 0);
    }
    memset(&s->act, 0, sizeof s->act);
}

int kvx_st_active_seal(kvx_store *s)
{
    if (!s->act.w || s->act.owner) return 0;
    if (kvx_shard_writer_appended(s->act.w) == 0 && !s->act.registered) {
        st_active_drop(s);
        return 0;
    }
    char name[32];
    kvx_st_shard_name(name, s->act.gen);
    char *path = kvx_st_join(s->shards_path, name);
    if (!path) return kvx_fail(-ENOMEM, "store: out of memory");
    /* the header and tables the seal writes: about the journal's rows */
    uint64_t tables = kvx_shard_writer_journal_used(s->act.w);
    int rc = kvx_shard_writer_seal_active(s->act.w, path); /* frees the writer */
    free(path);
    if (!rc) s->wrote[ST_WROTE_PUT].files += tables;
    /* on a failure the file is whole under one of its names: readers find
     * either, the next writer's recovery seals it */
    uint8_t byte = s->act.byte;
    memset(&s->act, 0, sizeof s->act);
    /* the cache's handle names the active file: the next use opens the
     * sealed one (views and handles given out keep theirs: same inode) */
    if (!rc) kvx_st_cache_drop(s, byte);
    return rc;
}

#define ST_JOURNAL_SHARE_DIV 16 /* a journal at most 1/16 of its entries' bytes (~6 % space) */

/* KVX_NO_APPEND=1 in the environment: every flush writes its own file,
 * as before active shards (docs/STORE.md "Appends"; the tests of that
 * path set it). Read once. */
static int st_no_append(void)
{
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("KVX_NO_APPEND");
        v = e && e[0] == '1';
    }
    return v;
}

int kvx_st_active_take(kvx_store *s, kvx_store_batch *x, int kind, st_open *o)
{
    if (kind != ST_KIND_LINEAGE || s->keyed || x->whole || s->version < ST_STORE_VERSION || st_no_append()) return 0;
    if (s->act.owner && s->act.owner != x) return 0; /* another batch's blocks are in it */
    if (s->act.owner == x && s->act.w && st_active_full(s, s->act.w)) return 0; /* x's, full: a file of its own */
    if (!s->act.w) {
        /* a shard size too small for the reserve and journal beside one
         * page (a store of a few KiB shards): files of their own */
        kvx_active_params p;
        kvx_st_active_params(s, 0, 0, &p);
        uint64_t kv = kvx_active_kv_offset(&p);
        if (!kv || kv + 2 * s->page_bytes > s->target) return 0;
        /* the journal's rows stay in the sealed file (unused space between
         * its tables and its pages): where they would take more than
         * 1/ST_JOURNAL_SHARE_DIV of the entries (tiny pages, long blocks'
         * lineage tokens), files of their own, or the store holds fewer
         * blocks in its capacity */
        kvx_journal_geom jg;
        if (kvx_journal_geom_for(&jg, &p) ||
            jg.journal_bytes * ST_JOURNAL_SHARE_DIV > (uint64_t)s->max_entries * s->entry_bytes)
            return 0;
    }
    if (s->act.w && st_active_full(s, s->act.w)) {
        int rc = kvx_st_active_seal(s);
        if (rc) kvx_clear_error(); /* tidy-up: the file is whole; a new one takes the blocks */
    }
    if (!s->act.w) {
        int rc = st_active_create(s);
        if (rc) return rc;
    }
    memset(o, 0, sizeof *o);
    o->w = s->act.w;
    o->byte = s->act.byte;
    o->gen = s->act.gen;
    o->flags = kvx_st_kind_flags(s, ST_KIND_LINEAGE);
    o->cap = s->max_entries;
    o->active = 1;
    s->act.owner = x;
    return 1;
}

int kvx_st_active_pending(const kvx_store *s, const kvx_store_batch *x)
{
    return s->act.w && s->act.owner == x &&
           kvx_shard_writer_count(s->act.w) > kvx_shard_writer_appended(s->act.w);
}

int kvx_st_active_append(kvx_store *s, kvx_store_batch *x, uint64_t seq, kvx_cat_edit *e)
{
    if (!kvx_st_active_pending(s, x)) return 0;
    kvx_shard_writer *w = s->act.w;
    uint64_t journal = kvx_shard_writer_journal_used(w), before = kvx_shard_writer_appended(w);
    int rc = kvx_shard_writer_append(w, seq);
    if (rc) return rc; /* the flush undoes it (kvx_st_active_undo) */
    uint32_t nunv = s->act.nunv_pending;
    for (int k = 0; k < 2; k++)
        if (x->cur[k].active) nunv += x->cur[k].nunv;
    uint64_t now = kvx_st_now_ns();
    kvx_cat_shard rec = {s->act.gen,
                         kvx_shard_writer_bytes(w),
                         s->act.registered ? s->act.created_ns : now,
                         kvx_shard_writer_appended(w),
                         kvx_st_kind_flags(s, ST_KIND_LINEAGE) | KVX_FLAG_META_CRC,
                         s->act.nunv + nunv,
                         s->act.ino};
    rc = s->act.registered ? kvx_cat_edit_put_shard(e, s->act.byte, &rec)
                           : kvx_cat_edit_add_shard(e, s->act.byte, &rec, now);
    if (rc) return rc; /* appended, and the catalog cannot say so: the flush undoes it */
    s->act.created_ns = rec.created_ns;
    s->act.nunv_commit = nunv;
    s->act.committed = 1;
    /* what the file gained, for the benchmarks' split: its pages (each
     * also counted as put) and this record */
    s->wrote[ST_WROTE_PUT].files +=
        (kvx_shard_writer_appended(w) - before) * s->page_bytes + kvx_shard_writer_journal_used(w) - journal;
    return 0;
}

void kvx_st_active_release(kvx_store *s, kvx_store_batch *x, int ok)
{
    for (int k = 0; k < 2; k++)
        if (x->cur[k].active) memset(&x->cur[k], 0, sizeof x->cur[k]);
    if (!s || s->act.owner != x) return;
    s->act.owner = NULL;
    s->act.nunv_pending = 0;
    if (!s->act.w) return;
    /* a flush that appended and then failed gave the shard up already
     * (kvx_st_active_undo: its owner is none), so a failure here only
     * rolls back what x added */
    int appended = s->act.committed;
    s->act.committed = 0;
    if (!ok) {
        kvx_shard_writer_rollback(s->act.w);
    } else if (appended) {
        s->act.registered = 1;
        s->act.nunv += s->act.nunv_commit;
    }
    s->act.nunv_commit = 0;
    if (kvx_shard_writer_appended(s->act.w) == 0 && !s->act.registered) {
        st_active_drop(s);
        return;
    }
    if (st_active_full(s, s->act.w) && kvx_st_active_seal(s)) kvx_clear_error(); /* whole either way */
}

/* Did shards/<name> never hold anything? Every byte of it is zero (or it
 * is empty): a writer killed between the file's creation and its journal
 * header's write leaves it so. The header is made durable at creation,
 * before any page, so a zero journal beside nonzero pages is damage, not
 * a crash: that file is not blank (quarantine keeps it). A file that
 * cannot be read is not blank either. Holes are skipped (SEEK_DATA). */
static int st_active_blank(kvx_store *s, const char *name)
{
    /* O_NONBLOCK: a FIFO at the name must not hang recovery (fstat then says not a file) */
    int fd = kvx_os.openat(s->shardsfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0);
    if (fd < 0) return 0;
    struct stat st;
    int blank = kvx_os.fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
    uint64_t end = blank ? (uint64_t)st.st_size : 0;
    uint8_t buf[65536];
    for (uint64_t off = 0; blank && off < end;) {
        off_t data = lseek(fd, (off_t)off, SEEK_DATA);
        if (data < 0) {
            if (errno == ENXIO) break; /* a hole to the end */
            data = (off_t)off;         /* no SEEK_DATA here: read it all */
        }
        off = (uint64_t)data;
        if (off >= end) break;
        size_t want = end - off < sizeof buf ? (size_t)(end - off) : sizeof buf;
        ssize_t got = kvx_os.pread(fd, buf, want, (off_t)off);
        if (got <= 0) {
            blank = 0;
            break;
        }
        for (ssize_t i = 0; i < got && blank; i++) blank = buf[i] == 0;
        off += (uint64_t)got;
    }
    kvx_os.close(fd);
    return blank;
}

/* Active file shards/<name> (gen, byte) settled: sealed in place with
 * its whole records below sequence number below, or removed when it
 * holds none or is blank (st_active_blank), or set aside to quarantine/ when it cannot be read. */
static int st_active_settle(kvx_store *s, const char *name, uint64_t gen, uint32_t byte, uint64_t below)
{
    char *path = kvx_st_join(s->shards_path, name), sealed[32];
    kvx_st_shard_name(sealed, gen);
    char *spath = kvx_st_join(s->shards_path, sealed);
    if (!path || !spath) {
        free(path);
        free(spath);
        return kvx_fail(-ENOMEM, "store: out of memory");
    }
    kvx_active_params p;
    kvx_st_active_params(s, byte, gen, &p);
    kvx_shard_writer *w;
    int rc = kvx_shard_writer_resume_below(&w, path, &p, below);
    int blank = rc && !st_open_transient(rc) && st_active_blank(s, name);
    if (rc && !st_open_transient(rc) && !blank) {
        char why[480];
        snprintf(why, sizeof why, "an active shard that cannot be read: %s (%s)", kvx_last_error(), kvx_err_name(rc));
        kvx_clear_error();
        rc = kvx_st_quarantine(s, name, why);
        if (!rc) s->act_quarantined++;
    } else if (blank || (!rc && kvx_shard_writer_appended(w) == 0)) {
        if (!blank) kvx_shard_writer_abort(w); /* no record: nothing in it was acknowledged */
        kvx_clear_error();
        rc = kvx_os.unlinkat(s->shardsfd, name, 0) ? -errno : 0;
        if (!rc) rc = kvx_os.fsync(s->shardsfd) ? -errno : 0;
        if (rc) rc = kvx_fail(rc, "store %s: removing the empty active file shards/%s: %s", s->dir, name, strerror(-rc));
        else
            s->act_deleted++;
    } else if (!rc) {
        rc = kvx_shard_writer_seal_active(w, spath);
        if (rc == -EEXIST) { /* a sealed file of its generation: no writer makes both */
            char why[480];
            snprintf(why, sizeof why, "an active shard whose sealed name shards/%s is taken", sealed);
            kvx_clear_error();
            rc = kvx_st_quarantine(s, name, why);
        }
    }
    free(path);
    free(spath);
    return rc;
}

/* How many entries the records of shards/<name> below sequence number
 * below hold, read only (a writer's resume would cut the rest);
 * UINT32_MAX when it cannot be read (settling says why). *out_tail
 * (nullable): whether the journal holds bytes past those records. */
static uint32_t st_active_count(kvx_store *s, const char *name, uint64_t gen, uint32_t byte, uint64_t below,
                                int *out_tail)
{
    kvx_active_params p;
    kvx_st_active_params(s, byte, gen, &p);
    /* O_NONBLOCK: a FIFO put at the name since it was looked at must not hang recovery */
    int fd = kvx_os.openat(s->shardsfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0);
    struct stat st;
    kvx_journal_state js;
    uint32_t n = UINT32_MAX;
    if (out_tail) *out_tail = 0;
    if (fd >= 0 && kvx_os.fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
        kvx_journal_read_below(fd, (uint64_t)st.st_size, &p, below, &js) == 0) {
        n = js.n;
        if (out_tail) *out_tail = js.tail_end > js.next_pos;
        free(js.tables);
    }
    if (fd >= 0) kvx_os.close(fd);
    kvx_clear_error();
    return n;
}

/* Is the first entry past shards/<name>'s whole records (gen, byte; n of
 * them) one the catalog names, while the journal holds bytes past those
 * records? Then its record was whole once: the catalog edit follows the
 * record's fdatasync, and a record torn by a crash or a power cut never
 * reached the catalog. It is an acknowledged flush damaged since (a bit
 * flipped), not a torn tail, and cutting it would delete what was
 * acknowledged on the word of a CRC (DESIGN.md rule 2). A catalog that
 * cannot be read says nothing (0). */
static int st_active_tail_acknowledged(kvx_store *s, const char *name, uint64_t gen, uint32_t byte, uint32_t *out_n)
{
    int tail = 0;
    uint32_t n = st_active_count(s, name, gen, byte, UINT64_MAX, &tail);
    *out_n = n;
    if (!tail || n > 0xFFFFu || !s->cat) return 0; /* nothing past them, or no coordinate names it */
    kvx_cat_snap *snap;
    if (kvx_cat_snap_begin(s->cat, &snap) != 0) {
        kvx_clear_error();
        return 0;
    }
    kvx_cat_coord cv;
    int named = kvx_cat_coord_get(snap, KVX_COORD(byte, n, 0), &cv) == 0 && cv.gen == gen;
    kvx_cat_snap_end(snap);
    kvx_clear_error();
    return named;
}

typedef struct st_marks_ctx {
    uint64_t *v; /* the marks of commits that never answered, ascending */
    size_t n;
} st_marks_ctx;

/* One active file of recovery: a record of a commit whose mark is in
 * staging/ (its number exactly: a mark left by a failure says nothing of
 * the commits after it) and what follows it are the tail. */
static int st_active_recover_one(kvx_store *s, int dirfd, const char *name, void *ctx)
{
    (void)dirfd;
    const st_marks_ctx *m = ctx;
    uint64_t gen, below = UINT64_MAX;
    uint32_t byte;
    if (!kvx_st_parse_active_name(name, &gen, &byte)) return 0;
    struct stat st;
    if (kvx_os.fstatat(s->shardsfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT ? 0 : -errno;
    if (!S_ISREG(st.st_mode)) return 0; /* never followed: the plan leaves it alone */
    uint32_t all = m->n ? st_active_count(s, name, gen, byte, UINT64_MAX, NULL) : 0;
    for (size_t i = 0; i < m->n && all != UINT32_MAX && below == UINT64_MAX; i++) {
        uint32_t lo = st_active_count(s, name, gen, byte, m->v[i], NULL);
        if (lo != UINT32_MAX && lo < all && st_active_count(s, name, gen, byte, m->v[i] + 1, NULL) > lo)
            below = m->v[i];
    }
    uint32_t whole = 0;
    if (below == UINT64_MAX && st_active_tail_acknowledged(s, name, gen, byte, &whole)) {
        char why[480];
        snprintf(why, sizeof why,
                 "an active shard whose record after its %u whole entries does not read whole, yet the catalog "
                 "names entry %u: an acknowledged flush damaged since, not a torn one (KVX_ECORRUPT)",
                 whole, whole);
        int rc = kvx_st_quarantine(s, name, why);
        if (!rc) s->act_quarantined++;
        return rc;
    }
    return st_active_settle(s, name, gen, byte, below);
}

static int st_u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int kvx_st_active_recover(kvx_store *s)
{
    s->act_quarantined = s->act_deleted = 0;
    /* a commit whose mark is still in staging/ never answered: its record
     * (the last of its file: a failed commit ends its file's appends) is
     * the tail */
    st_marks_ctx m = {NULL, 0};
    int rc = kvx_st_commit_marks(s, &m.v, &m.n);
    if (!rc && m.n) qsort(m.v, m.n, sizeof *m.v, st_u64_cmp);
    if (!rc) rc = kvx_st_each_file(s, s->shardsfd, st_active_recover_one, &m);
    free(m.v);
    return rc;
}

/* staging/.<seq>.pending made again, durable (best effort: the handle
 * refuses flushes meanwhile). */
static void st_mark_again(kvx_store *s, uint64_t seq)
{
    char mark[40];
    kvx_st_pending_name(mark, sizeof mark, seq);
    int fd = kvx_os.openat(s->stagingfd, mark, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd >= 0) kvx_os.close(fd);
    kvx_os_fsync_dir(s->staging_path);
}

void kvx_st_active_undo(kvx_store *s, kvx_store_batch *x, uint64_t seq, int marked)
{
    if (s->act.owner != x || !s->act.w) return;
    char name[ST_ACTIVE_NAME_MAX], msg[1024];
    snprintf(msg, sizeof msg, "%s", kvx_last_error()); /* the flush's failure, kept */
    uint64_t gen = s->act.gen;
    uint32_t byte = s->act.byte;
    kvx_st_active_name(name, gen, byte);
    kvx_shard_writer_abort(s->act.w); /* its lock too: the settle takes one */
    memset(&s->act, 0, sizeof s->act);
    /* the record, written or not, durable or not, and what follows it go:
     * the file sealed below seq (its catalog record names no more) */
    int rc = st_active_settle(s, name, gen, byte, seq);
    if (rc) {
        s->act_stuck = 1;
        if (marked) st_mark_again(s, seq);
    } else if (marked) {
        char mark[40];
        kvx_st_pending_name(mark, sizeof mark, seq);
        if (kvx_os.unlinkat(s->stagingfd, mark, 0) == 0) kvx_os_fsync_dir(s->staging_path);
    }
    kvx_fail(-EIO, "%s", msg);
}

int kvx_st_active_stuck(const kvx_store *s)
{
    return kvx_fail(-EIO,
                    "store %s: a failed flush's record could not be cut from the active shard: no flush is taken "
                    "until the store is opened again (its recovery drops that record)",
                    s->dir);
}
