/*
 * store_inspect.c - stat, the live shard list, and verify.
 *
 * Rule: verify reports every problem it finds (a file, a page, a record)
 * and changes nothing; a note that is not a problem (a valid shard the
 * index does not name yet) comes with code 0.
 */
#include "store.h"
#include "common/os.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>

/* The registry as the catalog holds it now (not this handle's view: a
 * reader has none, and a writer's is the same), in one snapshot. */
static int st_registry_now(kvx_store *s, kvx_cat_registry *out)
{
    kvx_cat_snap *snap;
    int rc = kvx_cat_snap_begin(s->cat, &snap);
    if (rc) return rc;
    rc = kvx_cat_registry_read(snap, out);
    kvx_cat_snap_end(snap);
    return rc;
}

KVX_API int kvx_store_stat(kvx_store_stats *out, kvx_store *s)
{
    if (!out || !s) return kvx_fail(KVX_EINVALID, "kvx_store_stat: NULL argument");
    memset(out, 0, sizeof *out);
    kvx_cat_snap *snap;
    int rc = kvx_cat_snap_begin(s->cat, &snap);
    if (rc) return rc;
    kvx_cat_counts cn;
    kvx_cat_stats st;
    kvx_cat_registry *reg = malloc(sizeof *reg);
    rc = reg ? kvx_cat_counts_get(snap, &cn) : kvx_fail(-ENOMEM, "store: out of memory");
    if (!rc) rc = kvx_cat_stats_get(snap, &st);
    if (!rc) rc = kvx_cat_registry_read(snap, reg); /* a damaged shard record: KVX_ECORRUPT naming reindex */
    kvx_cat_snap_end(snap);
    for (uint32_t b = 0; !rc && b < ST_SLOTS; b++) {
        if (!reg->live[b]) continue;
        const kvx_cat_shard *r = &reg->rec[b];
        out->shards++;
        out->bytes += r->file_bytes;
        if (!(r->flags & KVX_FLAG_KEYS)) /* keyed pages are no blocks: never "unverified" */
            out->unverified += (r->flags & KVX_FLAG_DIGEST) ? r->n_unverified : r->n_entries;
    }
    if (!rc && !s->keyed && kvx_st_freed_bytes_read(s, reg, &out->freed_bytes)) {
        /* a damaged or strange DIR/FREED: the counters still count (verify
         * reports the log, a writer's open refuses it), freed_bytes says 0 */
        out->freed_bytes = 0;
        kvx_clear_error();
    }
    free(reg);
    if (rc) return rc;
    out->blocks = cn.blocks;
    out->capacity_bytes = s->capacity;
    pthread_mutex_lock(&s->use_mu);
    out->hits = st.hits + s->hits;
    out->misses = st.misses + s->misses;
    pthread_mutex_unlock(&s->use_mu);
    out->evictions = st.evictions;
    out->evicted_blocks = st.evicted_blocks;
    out->compactions = st.compactions;
    out->dropped_shards = st.dropped_shards;
    out->shard_bytes = s->target;
    out->page_bytes = s->keyed ? s->page_bytes : 0;
    out->quarantined = kvx_st_quarantine_count(s, &out->quarantine_bytes);
    kvx_st_tier_stats(s, out);
    pthread_mutex_lock(&s->wmu);
    out->pending_blocks = 0;
    for (const kvx_store_batch *x = s->batches; x; x = x->next) out->pending_blocks += x->npend;
    pthread_mutex_unlock(&s->wmu);
    return 0;
}

KVX_API int kvx_store_shards(kvx_shard ***out_shards, size_t *out_n, kvx_store *s)
{
    if (!out_shards || !out_n || !s) return kvx_fail(KVX_EINVALID, "kvx_store_shards: NULL argument");
    *out_shards = NULL;
    *out_n = 0;
    kvx_cat_registry *reg = malloc(sizeof *reg);
    if (!reg) return kvx_fail(-ENOMEM, "store: out of memory");
    int rc = st_registry_now(s, reg);
    kvx_shard **arr = rc ? NULL : calloc(ST_SLOTS, sizeof *arr);
    if (!rc && !arr) rc = kvx_fail(-ENOMEM, "store: out of memory");
    size_t n = 0;
    /* pages the free log frees: marked on the handles, so warmup and
     * fetches skip them (docs/STORE.md "Holes") */
    kvx_free_log flog;
    int lr = rc ? -ENOENT : kvx_free_log_read(s->dirfd, "FREED", &flog);
    if (lr == 0)
        kvx_st_log_sort(&flog);
    else
        kvx_clear_error(); /* none, or unreadable: every freed page reads as damage there */
    for (uint32_t b = 0; !rc && b < ST_SLOTS; b++) {
        if (!reg->live[b]) continue;
        kvx_shard *sh = kvx_st_shard_get_n(s, b, reg->rec[b].gen, reg->rec[b].n_entries);
        if (!sh) continue;
        for (uint32_t i = 0; lr == 0 && flog.n && i < kvx_shard_get_info(sh)->num_blocks; i++)
            if (kvx_st_log_frees(&flog, sh, reg->rec[b].gen, i)) kvx_shard_mark_freed(sh, i);
        arr[n++] = sh;
    }
    if (lr == 0) kvx_free_log_free(&flog);
    free(reg);
    if (rc) return rc;
    *out_shards = arr;
    *out_n = n;
    return 0;
}

typedef struct st_verify_ctx {
    void (*report)(void *ctx, const char *what, int code);
    void *ctx;
    uint64_t bad;
    const char *shard;
} st_verify_ctx;

static void st_vreport(st_verify_ctx *v, int code, const char *fmt, ...) KVX_PRINTF(3, 4);

static void st_vreport(st_verify_ctx *v, int code, const char *fmt, ...)
{
    if (code) v->bad++; /* code 0: a note (not a problem) */
    if (!v->report) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    v->report(v->ctx, buf, code);
}

static void st_page_report(void *ctx, uint32_t index, int code)
{
    st_verify_ctx *v = ctx;
    st_vreport(v, code, "shards/%s: entry %u: %s", v->shard, index, kvx_strerror(code));
}

typedef struct st_unreg_ctx {
    st_verify_ctx *v;
    const kvx_cat_registry *reg;
} st_unreg_ctx;

static int st_verify_unregistered(kvx_store *s, int fd, const char *name, void *ctx)
{
    (void)s;
    st_unreg_ctx *c = ctx;
    uint64_t gen;
    if (!kvx_st_parse_name(name, &gen)) return 0;
    for (int b = 0; b < ST_SLOTS; b++)
        if (c->reg->live[b] && c->reg->rec[b].gen == gen) return 0;
    struct stat st;
    if (kvx_os.fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
    if (!S_ISREG(st.st_mode))
        st_vreport(c->v, KVX_EPATH, "shards/%s: a %s where a shard belongs (left alone)", name,
                   kvx_file_type_name(st.st_mode));
    else if (c->v->report) {
        /* a note, not damage: a crash before its publication, or a backup
         * put back; the next writer adopts it */
        char buf[400];
        snprintf(buf, sizeof buf,
                 "note: shards/%s is not in the index yet (the next writer adopts it: kvx store gc, or kvx store reindex)",
                 name);
        c->v->report(c->v->ctx, buf, 0);
    }
    return 0;
}

/* Every coordinate record names an entry of a registered shard. */
typedef struct st_coord_ctx {
    st_verify_ctx *v;
    const kvx_cat_registry *reg;
} st_coord_ctx;

static int st_verify_coord(void *ctx, uint32_t c, const kvx_cat_coord *rec, int damaged)
{
    st_coord_ctx *x = ctx;
    if (damaged) {
        st_vreport(x->v, damaged, "%s", kvx_last_error());
        return 0;
    }
    uint32_t b = KVX_COORD_SHARD(c);
    if (!x->reg->live[b] || x->reg->rec[b].gen != rec->gen || KVX_COORD_BLOCK(c) >= x->reg->rec[b].n_entries)
        st_vreport(x->v, KVX_ECORRUPT, "index: coordinate 0x%08x names no registered shard entry", c);
    return 0;
}

/* Entry i of shard file `name` (shard b) against the catalog: its
 * coordinate record and its hash location. A record that cannot be read is
 * reported with the catalog's error, never counted as fine. */
static void st_verify_entry(st_verify_ctx *v, kvx_cat_snap *snap, const kvx_cat_shard *r, const char *name,
                            uint32_t i, const kvx_entry *e)
{
    kvx_cat_coord cv;
    int g = kvx_cat_coord_get(snap, e->coordinate, &cv);
    if (g && g != KVX_ENOTFOUND)
        st_vreport(v, g, "shards/%s: entry %u: %s", name, i, kvx_last_error());
    else if ((g || cv.gen != r->gen || cv.hash != e->hash) && e->key) {
        /* the owner deleted this keyed page (one edit drops its records);
         * gc reclaims its bytes: a note, not a problem */
        st_vreport(v, 0, "shards/%s: entry %u (a keyed page) is deleted: gc reclaims it", name, i);
        return;
    } else if (g || cv.gen != r->gen || cv.hash != e->hash)
        st_vreport(v, KVX_ENOTFOUND, "shards/%s: entry %u (hash %016llx) is not indexed", name, i,
                   (unsigned long long)e->hash);
    int h = kvx_cat_has_loc(snap, e->hash, e->coordinate, r->gen);
    if (h < 0)
        st_vreport(v, h, "shards/%s: entry %u: %s", name, i, kvx_last_error());
    else if (h == 0)
        st_vreport(v, KVX_ENOTFOUND, "shards/%s: entry %u: hash %016llx has no index record", name, i,
                   (unsigned long long)e->hash);
}

/* Are sh's entries from `from` on all of commits at or after next_seq
 * (appended after the snapshot that said next_seq)? */
static int st_appended_since(const kvx_shard *sh, uint32_t from, uint64_t next_seq)
{
    for (uint32_t i = from; i < kvx_shard_get_info(sh)->num_blocks; i++) {
        uint64_t seq = 0;
        int tomb = 0;
        if (kvx_shard_entry_commit(sh, i, &seq, &tomb) != 0 || seq < next_seq) return 0;
    }
    return 1;
}

KVX_API int kvx_store_verify(kvx_store *s, uint64_t *out_bad, void (*report)(void *ctx, const char *what, int code),
                             void *ctx)
{
    if (!s) return kvx_fail(KVX_EINVALID, "kvx_store_verify: NULL argument");
    st_verify_ctx v = {report, ctx, 0, NULL};
    kvx_cat_registry *reg = malloc(sizeof *reg);
    if (!reg) return kvx_fail(-ENOMEM, "store: out of memory");
    kvx_cat_snap *snap;
    int rc = kvx_cat_snap_begin(s->cat, &snap);
    if (rc) {
        free(reg);
        return rc;
    }
    /* the shard list and every record checked below: one snapshot */
    if ((rc = kvx_cat_registry_read(snap, reg))) {
        kvx_cat_snap_end(snap);
        free(reg);
        return rc;
    }
    /* the free log: its pages are misses, counted apart from damage (read
     * after the snapshot, so it holds every free the snapshot reflects) */
    kvx_free_log flog;
    int lr = kvx_free_log_read(s->dirfd, "FREED", &flog);
    if (lr == 0)
        kvx_st_log_sort(&flog);
    else if (lr == -ENOENT)
        memset(&flog, 0, sizeof flog);
    else if (lr) {
        st_vreport(&v, lr, "FREED: %s (the pages it freed read as damage below)", kvx_last_error());
        memset(&flog, 0, sizeof flog);
    }

    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!reg->live[b]) continue;
        const kvx_cat_shard *r = &reg->rec[b];
        char name[ST_ACTIVE_NAME_MAX];
        kvx_st_shard_name(name, r->gen);
        v.shard = name;
        /* never through a symlink (lookups refuse one too) */
        struct stat fst;
        if (kvx_os.fstatat(s->shardsfd, name, &fst, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(fst.st_mode)) {
            st_vreport(&v, KVX_EPATH, "shards/%s (shard %u): a symlink or not a regular file", name, b);
            continue;
        }
        kvx_shard *sh = NULL;
        int e = kvx_st_open_gen(s, b, r->gen, &sh, name, sizeof name); /* sealed, or active */
        if (e) {
            st_vreport(&v, e, "shards/%s (shard %u): %s", name, b, kvx_last_error());
            continue;
        }
        char whose[400];
        int own = kvx_st_shard_ours(s, sh, whose, sizeof whose);
        if (!own && kvx_shard_get_info(sh)->shard_id != b) {
            snprintf(whose, sizeof whose, "its entries name shard %u, the index registered it as %u",
                     kvx_shard_get_info(sh)->shard_id, b);
            own = KVX_ECORRUPT;
        }
        if (own) { /* lookups refuse it: every block it is indexed for is missing */
            st_vreport(&v, own, "shards/%s (shard %u): %s", name, b, whose);
            kvx_shard_close(sh);
            continue;
        }
        uint32_t nbad = 0, nfreed = 0;
        kvx_st_verify_pages(s, &flog, sh, r->gen, &nbad, &nfreed, st_page_report, &v);
        if (nfreed) {
            char note[300];
            snprintf(note, sizeof note,
                     "shards/%s (shard %u): %u page(s) freed in place (the free log names them): misses, not damage",
                     name, b, nfreed);
            if (report) report(ctx, note, 0);
        }
        const kvx_shard_info *in = kvx_shard_get_info(sh);
        /* an active file (store_active.c) may hold appends newer than
         * this snapshot, and so may its sealed file when the writer sealed
         * it since: its first n_entries are what it names */
        int active = name[0] == '.';
        uint32_t n = in->num_blocks > r->n_entries && (active || st_appended_since(sh, r->n_entries, reg->next_seq))
                         ? r->n_entries
                         : in->num_blocks;
        if (n != r->n_entries)
            st_vreport(&v, KVX_ECORRUPT, "shards/%s: %u entries, registry says %u", name, in->num_blocks, r->n_entries);
        for (uint32_t i = 0; i < n; i++) {
            kvx_entry en;
            uint64_t seq;
            int tomb = 0;
            if (kvx_shard_entry(&en, sh, i) || !en.hash) continue;
            if (kvx_shard_entry_commit(sh, i, &seq, &tomb) == 0 && tomb) continue; /* a delete: in no index */
            if (flog.n && kvx_st_log_frees(&flog, sh, r->gen, i)) continue;        /* freed: in no index */
            st_verify_entry(&v, snap, r, name, i, &en);
        }
        kvx_shard_close(sh);
    }
    /* every shard file is registered: one the index does not name is not
     * served until a writer adopts it (or reindex) */
    st_unreg_ctx uc = {&v, reg};
    if ((rc = kvx_st_each_file(s, s->shardsfd, st_verify_unregistered, &uc)))
        st_vreport(&v, rc, "shards/: cannot list it: %s", kvx_last_error());
    /* every index record names a registered shard */
    st_coord_ctx cc = {&v, reg};
    if ((rc = kvx_cat_blocks_each(snap, KVX_CAT_ALL, st_verify_coord, &cc)))
        st_vreport(&v, rc, "index: the coordinate records cannot be walked: %s", kvx_last_error());
    kvx_cat_snap_end(snap);
    kvx_free_log_free(&flog);
    free(reg);
    if (out_bad) *out_bad = v.bad;
    return v.bad ? kvx_fail(KVX_ECORRUPT, "store %s: verify found %llu problem(s)", s->dir, (unsigned long long)v.bad)
                 : 0;
}
