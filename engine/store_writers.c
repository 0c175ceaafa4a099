/*
 * store_writers.c - shard writers: a free shard byte, a new generation, a
 * writer in staging/, the seal that makes its file durable, and the
 * publication of a batch's sealed files into shards/ at its flush.
 *
 * Rule: a sealed file is complete and fsynced (and its name in shards/
 * too) before any catalog edit names it; a batch's files reach shards/
 * only in its flush, and keep their staging/ name until its commit, so a
 * crash before the commit leaves nothing recovery adopts.
 */
#include "store.h"
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int st_alloc_byte(kvx_store *s, const uint8_t *extra, uint8_t *out)
{
    uint8_t used[ST_SLOTS];
    memcpy(used, s->reg->live, sizeof used);
    /* every batch's open writers and sealed, unpublished files */
    for (const kvx_store_batch *x = s->batches; x; x = x->next) {
        for (int k = 0; k < 2; k++)
            if (x->cur[k].w) used[x->cur[k].byte] = 1;
        for (size_t i = 0; i < x->nsealed; i++) used[x->sealed[i].byte] = 1;
    }
    if (s->act.w) used[s->act.byte] = 1;
    for (int b = 0; b < ST_SLOTS; b++) {
        if (!used[b] && !(extra && extra[b])) {
            *out = (uint8_t)b;
            return 0;
        }
    }
    return kvx_fail(KVX_EFULL,
                    "store %s: all 256 shard ids are in use (a coordinate's shard byte) by live shards and the open "
                    "writers of every batch: flush or destroy batches; gc helps only when small shards can merge; "
                    "a store whose capacity_bytes / shard_bytes (%llu / %llu) is above about 192 cannot hold its "
                    "capacity: create it with shard_bytes of at least capacity_bytes / 192",
                    s->dir, (unsigned long long)s->capacity, (unsigned long long)s->target);
}

/* reserve: table entries to reserve. A shard's tables are sized when it is
 * created, so a writer reserves what it is about to receive (the put's
 * blocks, at least the batch so far), not the shard maximum: small flushes
 * then seal tight files instead of files padded with empty tables. */
int kvx_st_alloc_gen(kvx_store *s, const uint8_t *extra, uint8_t *out_byte, uint64_t *out_gen)
{
    uint8_t b = 0;
    int rc = st_alloc_byte(s, extra, &b);
    if (rc) return rc;
    /* a generation is a file name and nothing more: one some file already
     * has (a stray file, a name an old index gave out again) is skipped,
     * never raised above, so no name can use the counter up */
    uint64_t gen = 0;
    char name[32];
    for (int tries = 0; tries < 4096 && !gen; tries++) {
        if (s->next_gen == 0 || s->next_gen == UINT64_MAX) s->next_gen = 1;
        gen = s->next_gen++;
        kvx_st_shard_name(name, gen);
        struct stat st;
        if (kvx_os.fstatat(s->shardsfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT) gen = 0;
    }
    if (!gen)
        return kvx_fail(KVX_EFULL, "store %s: 4096 generations in a row name files already in shards/", s->dir);
    *out_byte = b;
    *out_gen = gen;
    return 0;
}

static int st_begin(kvx_store *s, uint32_t flags, const uint8_t *extra, st_open *o, uint32_t reserve, uint32_t max)
{
    uint8_t b = 0;
    uint64_t gen = 0;
    char name[32];
    int rc = kvx_st_alloc_gen(s, extra, &b, &gen);
    if (rc) return rc;
    kvx_st_shard_name(name, gen);
    /* the writer's temporary file lives in staging/ (emptied by recovery);
     * a rewrite's seal renames it into shards/ and fsyncs shards/, a
     * commit's waits there, parked, for its flush (kvx_st_link_files). */
    size_t len = strlen(s->shards_path) + 1 + strlen(name) + 1;
    char *path = malloc(len);
    if (!path) return kvx_fail(-ENOMEM, "store: out of memory");
    snprintf(path, len, "%s/%s", s->shards_path, name);
    kvx_shard_writer_options opts = KVX_SHARD_WRITER_OPTIONS_INIT;
    opts.geometry = s->g;
    opts.shard_id = b;
    if (reserve < 8) reserve = 8;
    if (reserve > max) reserve = max;
    opts.max_entries = reserve;
    opts.flags = flags;
    opts.staging_dir = s->staging_path;
    rc = kvx_shard_writer_create(&o->w, path, &opts);
    free(path);
    if (rc) return rc;
    o->byte = b;
    o->gen = gen;
    o->flags = flags;
    o->cap = reserve;
    o->nunv = 0;
    return 0;
}

int kvx_st_writer_begin(kvx_store *s, uint32_t flags, const uint8_t *extra, st_open *o, uint32_t reserve)
{
    return st_begin(s, flags, extra, o, reserve, s->max_entries);
}

int kvx_st_writer_begin_tombs(kvx_store *s, st_open *o, uint32_t n)
{
    /* a tombstone has no page: a file of them is bounded by its tables,
     * not by the shard size (65,535 entries, about 19 MiB at most) */
    return st_begin(s, kvx_st_kind_flags(s, ST_KIND_PLAIN), NULL, o, n, 65535);
}

/* Seals o's shard (kvx_shard_writer_seal: fsync, rename into shards/,
 * fsync of shards/), so it is durable before any transaction names it; or,
 * staged, only the fsync: the file waits in staging/ for its batch's flush
 * (kvx_st_link_files). */
int kvx_st_writer_seal(kvx_store *s, st_open *o, st_sealed *out, int staged)
{
    uint32_t n = kvx_shard_writer_count(o->w);
    memset(out, 0, sizeof *out);
    int rc = staged ? kvx_shard_writer_seal_staged(o->w, out->staged, sizeof out->staged) : kvx_shard_writer_seal(o->w);
    o->w = NULL;
    char name[32];
    kvx_st_shard_name(name, o->gen);
    if (rc) return rc; /* the writer left nothing behind */
    int dirfd = staged ? s->stagingfd : s->shardsfd;
    const char *file = staged ? out->staged : name;
    struct stat st;
    if (kvx_os.fstatat(dirfd, file, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        rc = -errno;
        kvx_os.unlinkat(dirfd, file, 0);
        return kvx_fail(rc, "store: stat %s/%s: %s", staged ? "staging" : "shards", file, strerror(-rc));
    }
    out->byte = o->byte;
    out->gen = o->gen;
    out->flags = o->flags;
    out->n = n;
    out->bytes = (uint64_t)st.st_size;
    out->ino = (uint64_t)st.st_ino;
    out->last_use = kvx_st_now_ns();
    out->nunv = o->nunv;
    return 0;
}

int kvx_st_writer_park(kvx_store *s, st_open *o, st_sealed *out)
{
    (void)s;
    memset(out, 0, sizeof *out);
    out->byte = o->byte;
    out->gen = o->gen;
    out->flags = o->flags;
    out->n = kvx_shard_writer_count(o->w);
    out->bytes = kvx_shard_writer_bytes(o->w);
    out->last_use = kvx_st_now_ns();
    out->nunv = o->nunv;
    out->w = o->w;
    o->w = NULL;
    return 0;
}

int kvx_st_seal_parked(kvx_store *s, st_sealed *v, size_t n, uint64_t seq)
{
    for (size_t i = 0; i < n; i++) {
        if (!v[i].w) continue;
        kvx_shard_writer *w = v[i].w;
        v[i].w = NULL; /* the seal frees it, whatever the result */
        kvx_shard_writer_seq_unset(w, seq);
        int rc = kvx_shard_writer_seal_staged(w, v[i].staged, sizeof v[i].staged);
        if (rc) return rc; /* the writer left nothing behind */
        struct stat st;
        if (kvx_os.fstatat(s->stagingfd, v[i].staged, &st, AT_SYMLINK_NOFOLLOW) != 0)
            return kvx_fail(-errno, "store %s: stat staging/%s: %s", s->dir, v[i].staged, strerror(errno));
        v[i].bytes = (uint64_t)st.st_size;
        v[i].ino = (uint64_t)st.st_ino; /* a rename keeps it */
        s->wrote[ST_WROTE_PUT].files += v[i].bytes;
    }
    return 0;
}

void kvx_st_unlink_sealed(kvx_store *s, st_sealed *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (v[i].w) { /* parked, never sealed: its temporary file goes with it */
            kvx_shard_writer_abort(v[i].w);
            v[i].w = NULL;
            continue;
        }
        if (v[i].staged[0]) kvx_os.unlinkat(s->stagingfd, v[i].staged, 0);
        if (!v[i].staged[0] || v[i].linked) kvx_st_unlink_shard(s, v[i].gen);
        v[i].staged[0] = '\0';
        v[i].linked = 0;
    }
}

/* staging/<v->staged> renamed to shards/<name>; v then has only that name
 * (linked: removed from shards/ if the flush fails). */
static int st_move_into_shards(kvx_store *s, st_sealed *v, const char *name)
{
    size_t cap = strlen(s->staging_path) + strlen(s->shards_path) + sizeof v->staged + 64;
    char *from = malloc(cap), *to = malloc(cap);
    int rc = 0;
    if (!from || !to) {
        rc = kvx_fail(-ENOMEM, "store: out of memory");
    } else {
        snprintf(from, cap, "%s/%s", s->staging_path, v->staged);
        snprintf(to, cap, "%s/%s", s->shards_path, name);
        if (kvx_os.rename_noreplace(from, to) != 0)
            rc = kvx_fail(-errno, "store %s: move staging/%s to shards/%s: %s", s->dir, v->staged, name,
                          strerror(errno));
        else
            v->staged[0] = '\0', v->linked = 1;
    }
    free(from);
    free(to);
    return rc;
}

void kvx_st_pending_name(char *buf, size_t cap, uint64_t seq)
{
    snprintf(buf, cap, ".%016llx.pending", (unsigned long long)seq);
}

int kvx_st_link_files(kvx_store *s, st_sealed *v, size_t n, uint64_t seq, int force, int *marked)
{
    char mark[40];
    kvx_st_pending_name(mark, sizeof mark, seq);
    int fd = -1, rc = 0;
    size_t files = 0;
    for (size_t i = 0; i < n; i++) files += v[i].staged[0] != 0;
    /* the commit's mark first, durable: while it is in staging/, no file
     * of this commit is acknowledged, wherever it lies (recovery reads it
     * by the files' sequence numbers). One file needs none: its one
     * rename is all of the commit or none of it (found in shards/ without
     * its catalog edit, a recovery adopts it whole). */
    *marked = files > 1 || (files && force);
    if (!*marked) goto move;
    if (kvx_os.unlinkat(s->stagingfd, mark, 0) != 0 && errno != ENOENT)
        return kvx_fail(-errno, "store %s: remove a stale staging/%s: %s", s->dir, mark, strerror(errno));
    fd = kvx_os.openat(s->stagingfd, mark, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) return kvx_fail(-errno, "store %s: create staging/%s: %s", s->dir, mark, strerror(errno));
    kvx_os.close(fd);
    if ((rc = kvx_os_fsync_dir(s->staging_path))) {
        kvx_os.unlinkat(s->stagingfd, mark, 0);
        return kvx_fail(rc, "store %s: fsync of staging/: %s", s->dir, strerror(-rc));
    }
move:;
    size_t moved = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        if (!v[i].staged[0]) continue;
        char name[32];
        kvx_st_shard_name(name, v[i].gen);
        /* never over an existing file (DESIGN.md rule 2) */
        if (!(rc = st_move_into_shards(s, &v[i], name))) moved++;
    }
    /* durable where the catalog edit will name them */
    if (!rc && moved && (rc = kvx_os_fsync_dir(s->shards_path)))
        rc = kvx_fail(rc, "store %s: fsync of shards/ after moving %zu file(s) in: %s", s->dir, moved, strerror(-rc));
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kvx_last_error());
        kvx_st_unlink_linked(s, v, n); /* durably gone before the mark goes */
        if (*marked) kvx_os.unlinkat(s->stagingfd, mark, 0);
        kvx_fail(rc, "%s", msg);
    }
    return rc;
}

void kvx_st_unlink_linked(kvx_store *s, st_sealed *v, size_t n)
{
    size_t gone = 0;
    for (size_t i = 0; i < n; i++) {
        if (!v[i].linked) continue;
        kvx_st_unlink_shard(s, v[i].gen);
        v[i].linked = 0;
        gone++;
    }
    /* durably gone: without its commit's mark a file would be adopted */
    if (gone) kvx_os_fsync_dir(s->shards_path);
}

void kvx_st_unpublish(kvx_store *s, st_sealed *v, size_t n, uint64_t seq, int marked)
{
    kvx_st_unlink_linked(s, v, n); /* durably gone first */
    if (!marked) return;
    char mark[40];
    kvx_st_pending_name(mark, sizeof mark, seq);
    kvx_os.unlinkat(s->stagingfd, mark, 0); /* left by a failure: the next recovery removes it */
}

int kvx_st_unstage_files(kvx_store *s, uint64_t seq, int marked)
{
    if (!marked) return 0;
    /* the commit: the mark goes, durably. From here the files alone say
     * the batch committed (a recovery without the catalog adopts all of
     * it); linked stays set until the catalog edit commits: if it fails,
     * kvx_st_unlink_linked takes the files back. */
    char mark[40];
    kvx_st_pending_name(mark, sizeof mark, seq);
    if (kvx_os.unlinkat(s->stagingfd, mark, 0) != 0 && errno != ENOENT)
        return kvx_fail(-errno, "store %s: unlink staging/%s: %s", s->dir, mark, strerror(errno));
    int rc = kvx_os_fsync_dir(s->staging_path);
    if (rc) return kvx_fail(rc, "store %s: fsync of staging/ after the commit's mark went: %s", s->dir, strerror(-rc));
    return 0;
}

void kvx_st_published(st_sealed *v, size_t n)
{
    for (size_t i = 0; i < n; i++) v[i].linked = 0;
}
