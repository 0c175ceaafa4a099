/*
 * store_migrate.c - a store written by the previous release (STORE
 * version 1 blocks, 2 keyed; shards without sequence numbers) becomes a
 * store of this one at its first writer open (DESIGN.md trust rule 4).
 *
 * Rule: the previous release kept a keyed store's deletes only in its
 * catalog, so its sound catalog is the truth a migration starts from: the
 * catalog's live set becomes the initial state. Each live shard without a
 * sequence table is rewritten, one catalog edit per shard (the rewrite and
 * drop machinery compaction uses), into shards whose entries carry
 * sequence number 1: only the entries the catalog names are copied, so a
 * deleted keyed page is not copied and never comes back. The old shard is
 * then dropped (deleted when sound, else quarantined). STORE is rewritten
 * to this release's version LAST (temp, fsync, rename, fsync), so a crash
 * anywhere leaves a store of the old version whose catalog is sound: the
 * next writer open goes on where it stopped. The caller (kvx_st_recover)
 * checks the catalog first and refuses a store it cannot migrate.
 */
#include "store.h"
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A file of shards/ the catalog does not name that has a sequence table:
 * in a store of the previous release (which never wrote one) only a
 * migration's copy whose commit a crash cut. Never acknowledged: it goes
 * to quarantine/ (never unlinked, DESIGN.md rule 2), so the catalog again
 * names exactly the files of shards/. */
static int st_migrate_leftover(kvx_store *s, int fd, const char *name, void *ctx)
{
    (void)ctx;
    uint64_t gen;
    if (!kvx_st_parse_name(name, &gen)) return 0;
    for (int b = 0; b < ST_SLOTS; b++)
        if (s->reg->live[b] && s->reg->rec[b].gen == gen) return 0;
    struct stat st;
    if (kvx_os.fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) return 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", s->shards_path, name);
    kvx_shard *sh = NULL;
    int rc = kvx_shard_open_at(&sh, s->shardsfd, name, path, 0);
    if (rc) {
        if (st_open_transient(rc)) return rc;
        kvx_clear_error();
        return 0; /* not a migration's copy: the catalog check judges it */
    }
    int copy = (kvx_shard_get_info(sh)->flags & KVX_FLAG_SEQ) != 0;
    kvx_shard_close(sh);
    if (!copy) return 0;
    rc = kvx_st_quarantine(s, name,
                           "a migration's copy (sequence numbers) that a crash cut before its commit: its blocks "
                           "stay in the shard it copied, which the catalog names");
    return rc;
}

int kvx_st_migrate_leftovers(kvx_store *s) { return kvx_st_each_file(s, s->shardsfd, st_migrate_leftover, NULL); }

/* Rewrites live shard b (no sequence table) into shards of this release,
 * its catalog-named entries with sequence number 1, then drops it. */
static int st_migrate_shard(kvx_store *s, uint32_t b)
{
    uint64_t gen = s->reg->rec[b].gen;
    uint8_t busy[ST_SLOTS] = {0}, victims[ST_SLOTS] = {0};
    victims[b] = 1;
    kvx_shard *sh = kvx_st_shard_get(s, b, gen);
    if (!sh) {
        char why[600];
        int sound = kvx_st_shard_sound(s, b, gen, why, sizeof why);
        if (sound < 0) return kvx_fail(-EIO, "store %s: migration: shard %u cannot be opened now: %s", s->dir, b, why);
        /* no block of it can be served: dropped, the file quarantined */
        st_drop d = {s, victims, NULL, 0, NULL, 0, 0, 0, 1};
        int rc = kvx_st_drop_write(s, &d);
        if (!rc) kvx_st_after_drop(s, victims, why);
        return rc;
    }
    kvx_shard_close(sh);
    st_move *mv = NULL;
    size_t nmv = 0, capmv = 0;
    int rc = kvx_st_collect(s, b, NULL, 0, 0, &mv, &nmv, &capmv, SIZE_MAX);
    for (size_t i = 0; i < nmv; i++) mv[i].seq = 1; /* the initial state */
    uint32_t flags = kvx_st_kind_flags(s, (s->reg->rec[b].flags & KVX_FLAG_LINEAGE) ? ST_KIND_LINEAGE : ST_KIND_PLAIN);
    st_sealed *added = NULL;
    size_t nadded = 0;
    /* bad pages are not copied */
    if (!rc && nmv) rc = kvx_st_rewrite(s, mv, nmv, flags, busy, &added, &nadded, ST_WROTE_OTHER);
    if (!rc) {
        st_drop d = {s, victims, added, nadded, mv, nmv, 0, 0, 0};
        rc = kvx_st_drop_write(s, &d);
        if (rc) kvx_st_unlink_sealed(s, added, nadded);
        else {
            kvx_st_rec_from_moves(s, mv, nmv, added, nadded);
            kvx_st_after_drop(s, victims, NULL);
        }
    }
    free(added);
    free(mv);
    return rc;
}

int kvx_st_write_store_file(kvx_store *s)
{
    uint8_t cfg[ST_CONFIG_BYTES];
    uint32_t version = s->version > ST_STORE_VERSION ? s->version : ST_STORE_VERSION; /* never lowered */
    kvx_st_config_encode(cfg, &s->g, s->capacity, s->target, version);
    int fd;
    int rc = kvx_st_open_file(s, "STORE.tmp", O_WRONLY | O_CREAT | O_TRUNC, 0600, &fd);
    if (rc) return rc;
    rc = kvx_os_pwrite_all(fd, cfg, sizeof cfg, 0);
    if (!rc && kvx_os.fsync(fd) != 0) rc = -errno;
    kvx_os.close(fd);
    if (!rc && kvx_os.renameat(s->dirfd, "STORE.tmp", s->dirfd, "STORE") != 0) rc = -errno;
    if (!rc && kvx_os.fsync(s->dirfd) != 0) rc = -errno;
    if (rc) return kvx_fail(rc, "store %s: migration: write STORE: %s", s->dir, strerror(-rc));
    s->version = version;
    return 0;
}

int kvx_st_migrate(kvx_store *s)
{
    int rc = 0;
    for (uint32_t b = 0; b < ST_SLOTS && !rc; b++)
        if (s->reg->live[b] && !(s->reg->rec[b].flags & KVX_FLAG_SEQ)) rc = st_migrate_shard(s, b);
    if (!rc) rc = kvx_st_write_store_file(s);
    if (rc) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kvx_last_error());
        return kvx_fail(rc, "store %s: migration from STORE version %u stopped (the next writer open goes on): %s",
                        s->dir, s->version, msg);
    }
    s->version = ST_STORE_VERSION;
    return 0;
}
