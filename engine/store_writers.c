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
    for (int b = 0; b < ST_SLOTS; b++) used[b] |= s->adopt_wait[b];
    /* every batch's open writers and sealed, unpublished files */
    for (const kvx_store_batch *x = s->batches; x; x = x->next) {
        for (int k = 0; k < 2; k++)
            if (x->cur[k].w) used[x->cur[k].byte] = 1;
        for (size_t i = 0; i < x->nsealed; i++) used[x->sealed[i].byte] = 1;
    }
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

uint32_t kvx_st_kind_flags(const kvx_store *s, int kind)
{
    if (s->keyed) return KVX_FLAG_KEYS; /* a keyed store's only kind of shard */
    uint32_t f = KVX_FLAG_HASHES;
    if (kind == ST_KIND_LINEAGE) f |= KVX_FLAG_LINEAGE | KVX_FLAG_DIGEST;
    if (kvx_quant_is_fp8(s->g.quant)) f |= KVX_FLAG_SCALES;
    return f;
}

/* reserve: table entries to reserve. A shard's tables are sized when it is
 * created, so a writer reserves what it is about to receive (the put's
 * blocks, at least the batch so far), not the shard maximum: small flushes
 * then seal tight files instead of files padded with empty tables. */
int kvx_st_writer_begin(kvx_store *s, uint32_t flags, const uint8_t *extra, st_open *o, uint32_t reserve)
{
    uint8_t b = 0;
    int rc = st_alloc_byte(s, extra, &b);
    if (rc) return rc;
    uint64_t gen = s->next_gen++;
    char name[32];
    kvx_st_shard_name(name, gen);
    /* the writer's temporary file lives in staging/ (emptied by recovery);
     * a rewrite's seal renames it into shards/ and fsyncs shards/, a
     * batch's waits there for its flush (kvx_st_link_files: a second name
     * in shards/ for every sealed file, fsync of staging/ and shards/, then
     * the commit and the staging/ names removed). */
    size_t len = strlen(s->shards_path) + 1 + strlen(name) + 1;
    char *path = malloc(len);
    if (!path) return kvx_fail(-ENOMEM, "store: out of memory");
    snprintf(path, len, "%s/%s", s->shards_path, name);
    kvx_shard_writer_options opts = KVX_SHARD_WRITER_OPTIONS_INIT;
    opts.geometry = s->g;
    opts.shard_id = b;
    if (reserve < 8) reserve = 8;
    if (reserve > s->max_entries) reserve = s->max_entries;
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
    out->last_use = kvx_st_now_ns();
    out->nunv = o->nunv;
    return 0;
}

void kvx_st_unlink_sealed(kvx_store *s, st_sealed *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
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

int kvx_st_link_files(kvx_store *s, st_sealed *v, size_t n)
{
    size_t linked = 0, staged = 0;
    int rc = 0;
    for (size_t i = 0; i < n; i++) staged += v[i].staged[0] != 0;
    /* the staging/ names durable first: a shards/ name that survives a
     * crash then always has its staging/ twin beside it, which tells
     * recovery the file was never published (no file system promises to
     * keep changes to two directories in order without this fsync) */
    if (staged && (rc = kvx_os_fsync_dir(s->staging_path)))
        return kvx_fail(rc, "store %s: fsync of staging/: %s", s->dir, strerror(-rc));
    for (size_t i = 0; i < n && !rc; i++) {
        if (!v[i].staged[0]) continue;
        char name[32];
        kvx_st_shard_name(name, v[i].gen);
        /* a second name, never over an existing file (DESIGN.md rule 2) */
        if (kvx_os.linkat(s->stagingfd, v[i].staged, s->shardsfd, name, 0) == 0) {
            v[i].linked = 1, linked++;
        } else if (errno == EPERM || errno == EOPNOTSUPP || errno == EMLINK) {
            /* a file system without hard links: the file moves instead
             * (still never over a file). It works, but a crash between two
             * of a batch's moves can leave part of it adopted; STORE.md */
            rc = st_move_into_shards(s, &v[i], name);
            if (!rc) linked++;
        } else {
            rc = kvx_fail(-errno, "store %s: link staging/%s as shards/%s: %s", s->dir, v[i].staged, name,
                          strerror(errno));
        }
    }
    /* durable where the catalog edit will name them */
    if (!rc && linked && (rc = kvx_os_fsync_dir(s->shards_path)))
        rc = kvx_fail(rc, "store %s: fsync of shards/ after linking %zu file(s): %s", s->dir, linked, strerror(-rc));
    if (rc) kvx_st_unlink_linked(s, v, n);
    return rc;
}

void kvx_st_unlink_linked(kvx_store *s, st_sealed *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!v[i].linked) continue;
        kvx_st_unlink_shard(s, v[i].gen);
        v[i].linked = 0;
    }
}

void kvx_st_unstage_files(kvx_store *s, st_sealed *v, size_t n)
{
    /* published: the shards/ name is the file's only name from here on
     * (no fsync: a staging/ name left by a crash is removed by recovery,
     * which finds the catalog naming the file) */
    for (size_t i = 0; i < n; i++) {
        if (v[i].staged[0]) kvx_os.unlinkat(s->stagingfd, v[i].staged, 0);
        v[i].staged[0] = '\0';
        v[i].linked = 0;
    }
}
