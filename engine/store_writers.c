/*
 * store_writers.c - shard writers: a free shard byte, a new generation, a
 * writer in staging/, and the seal that makes its file durable in shards/.
 *
 * Rule: a sealed file is complete and fsynced (and its rename into shards/
 * too) before any catalog edit names it.
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
    /* the writer's temporary file lives in staging/ (emptied by recovery)
     * and the seal renames it into shards/: one rename and one fsync of
     * shards/ per shard (the staging/ side needs none: a leftover name
     * there is only removed at recovery) */
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
 * fsync of shards/), so it is durable before any transaction names it. */
int kvx_st_writer_seal(kvx_store *s, st_open *o, st_sealed *out)
{
    uint32_t n = kvx_shard_writer_count(o->w);
    int rc = kvx_shard_writer_seal(o->w);
    o->w = NULL;
    char name[32];
    kvx_st_shard_name(name, o->gen);
    if (rc) return rc; /* the writer left nothing behind */
    struct stat st;
    if (kvx_os.fstatat(s->shardsfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        rc = -errno;
        kvx_os.unlinkat(s->shardsfd, name, 0);
        return kvx_fail(rc, "store: stat shards/%s: %s", name, strerror(-rc));
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
    for (size_t i = 0; i < n; i++) kvx_st_unlink_shard(s, v[i].gen);
}
