/*
 * store_recover.c - what a writer does when it opens a store, and the
 * quarantine (DESIGN.md "Trust rules" 2 to 4).
 *
 * The index only names where bytes live; the shards are the truth. So
 * recovery judges a shard by its own structure and meta CRC, never by the
 * index's record of it, and deletes nothing on the word of a check:
 *  - staging/ holds shard writers' temporary files, never acknowledged:
 *    removed (anything else there is left alone);
 *  - a registered shard that is gone loses its records; one whose size
 *    differs from its record is opened: valid, its record is corrected and
 *    it is served; invalid, it moves to quarantine/;
 *  - a valid shard in shards/ that the index does not name (a crash before
 *    its publication, a backup put back, a stale index) is adopted; one
 *    whose shard byte another shard holds, or that is invalid or foreign,
 *    moves to quarantine/;
 *  - the next generation exceeds every generation named in shards/,
 *    staging/ and quarantine/, so a new shard never takes a file's name.
 * Readers run none of this (rule 3): a reader with a stale index misses.
 */
#include "common/os.h"
#include "store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_QUARANTINE "quarantine"

/* ------------------------------------------------------------ quarantine */

static int st_qdir_path(kvx_store *s, char *buf, size_t cap)
{
    return snprintf(buf, cap, "%s/" ST_QUARANTINE, s->dir) < (int)cap ? 0 : -ENAMETOOLONG;
}

static int st_open_qdir(kvx_store *s, int *out)
{
    char qdir[4096];
    if (st_qdir_path(s, qdir, sizeof qdir)) return kvx_fail(-ENAMETOOLONG, "store %s: path too long", s->dir);
    if (kvx_os.mkdir(qdir, 0700) == 0) {
        int rc = kvx_os_fsync_dir(s->dir); /* the new directory's entry */
        if (rc) return kvx_fail(rc, "store %s: fsync after mkdir quarantine/: %s", s->dir, strerror(-rc));
    } else if (errno != EEXIST) {
        return kvx_fail(-errno, "store %s: mkdir quarantine/: %s", s->dir, strerror(errno));
    }
    int fd = kvx_os.openat(s->dirfd, ST_QUARANTINE, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        if (e == ELOOP || e == ENOTDIR)
            return kvx_fail(KVX_EPATH, "store %s: quarantine/ is a symlink or not a directory", s->dir);
        return kvx_fail(-e, "store %s: open quarantine/: %s", s->dir, strerror(e));
    }
    *out = fd;
    return 0;
}

int kvx_st_quarantine(kvx_store *s, const char *name, const char *why)
{
    int qfd = -1, rc = st_open_qdir(s, &qfd);
    if (rc) return rc;
    char qdir[4096], from[4096], to[4096], target[300];
    if ((rc = st_qdir_path(s, qdir, sizeof qdir)) ||
        snprintf(from, sizeof from, "%s/%s", s->shards_path, name) >= (int)sizeof from) {
        kvx_os.close(qfd);
        return kvx_fail(-ENAMETOOLONG, "store %s: path too long", s->dir);
    }
    /* same name, never replacing a file already there: a numeric suffix */
    rc = -EEXIST;
    for (int k = 0; k < 10000 && rc == -EEXIST; k++) {
        if (k) snprintf(target, sizeof target, "%s.%d", name, k);
        else snprintf(target, sizeof target, "%s", name);
        if (snprintf(to, sizeof to, "%s/%s", qdir, target) >= (int)sizeof to) {
            rc = -ENAMETOOLONG;
            break;
        }
        /* a name whose note is taken too is taken: the first reason stays */
        char wn[340];
        struct stat wst;
        snprintf(wn, sizeof wn, "%s.why", target);
        if (fstatat(qfd, wn, &wst, AT_SYMLINK_NOFOLLOW) == 0) {
            rc = -EEXIST;
            continue;
        }
        rc = kvx_os.rename_noreplace(from, to) == 0 ? 0 : -errno;
    }
    if (rc) {
        kvx_os.close(qfd);
        return kvx_fail(rc, "store %s: cannot move shards/%s to quarantine/: %s", s->dir, name, strerror(-rc));
    }
    /* the reason, beside it (advisory: the move itself is what matters) */
    char note[340];
    snprintf(note, sizeof note, "%s.why", target);
    /* never replacing or blocking on what is there (a FIFO, someone's file) */
    int fd = kvx_os.openat(qfd, note, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
    if (fd >= 0) {
        char text[1200];
        int len = snprintf(text, sizeof text, "shards/%s: %s\n", name, why);
        if (len > (int)sizeof text - 1) len = (int)sizeof text - 1;
        if (kvx_os_pwrite_all(fd, text, (size_t)len, 0) == 0) kvx_os.fsync(fd);
        kvx_os.close(fd);
    }
    kvx_os.close(qfd);
    /* both directory entries durable: the file is in exactly one place */
    rc = kvx_os_fsync_dir(qdir);
    if (!rc) rc = kvx_os_fsync_dir(s->shards_path);
    s->quarantined++;
    return rc ? kvx_fail(rc, "store %s: fsync after quarantining %s: %s", s->dir, name, strerror(-rc)) : 0;
}

static int st_count_q(kvx_store *s, int fd, const char *name, void *ctx)
{
    (void)s;
    (void)fd;
    size_t len = strlen(name);
    if (len < 4 || strcmp(name + len - 4, ".why") != 0) ++*(uint64_t *)ctx;
    return 0;
}

uint64_t kvx_st_quarantine_count(kvx_store *s)
{
    int qfd = kvx_os.openat(s->dirfd, ST_QUARANTINE, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (qfd < 0) return 0;
    uint64_t n = 0;
    if (kvx_st_each_file(s, qfd, st_count_q, &n) != 0) kvx_clear_error();
    kvx_os.close(qfd);
    return n;
}

/* ------------------------------------------------------------ generations */

/* The generation a name carries: "<16 hex>.kvx..." in shards/ and
 * quarantine/, ".<16 hex>.kvx.tmp...." in staging/. */
static int st_name_gen(const char *name, uint64_t *gen)
{
    return kvx_st_name_prefix_gen(name[0] == '.' ? name + 1 : name, gen);
}

static int st_gen_max(kvx_store *s, int fd, const char *name, void *ctx)
{
    (void)s;
    (void)fd;
    uint64_t g, *max = ctx;
    if (st_name_gen(name, &g) && g > *max) *max = g;
    return 0;
}

int kvx_st_gen_floor(kvx_store *s)
{
    uint64_t max = 0;
    int rc = kvx_st_each_file(s, s->shardsfd, st_gen_max, &max);
    if (!rc) rc = kvx_st_each_file(s, s->stagingfd, st_gen_max, &max);
    int qfd = kvx_os.openat(s->dirfd, ST_QUARANTINE, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (!rc && qfd >= 0) rc = kvx_st_each_file(s, qfd, st_gen_max, &max);
    if (qfd >= 0) kvx_os.close(qfd);
    if (rc) return rc;
    if (max == UINT64_MAX) return kvx_fail(KVX_EFULL, "store %s: shard generations are exhausted", s->dir);
    if (max + 1 > s->next_gen) s->next_gen = max + 1;
    return 0;
}

/* --------------------------------------------------------------- staging */

static int st_rm_staging(kvx_store *s, int fd, const char *name, void *ctx)
{
    (void)ctx;
    struct stat st;
    if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
    /* a writer's temporary file was never acknowledged; a directory or
     * anything else someone put here is left alone */
    if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) return 0;
    if (kvx_os.unlinkat(fd, name, 0) != 0 && errno != ENOENT)
        return kvx_fail(-errno, "store %s: recovery: unlink staging/%s: %s", s->dir, name, strerror(errno));
    return 0;
}

/* ------------------------------------------------------ registered shards */

typedef struct st_fix {
    uint8_t drop[ST_SLOTS];   /* records to remove (file gone or invalid) */
    uint8_t resize[ST_SLOTS]; /* records whose file_bytes is corrected */
    uint64_t size[ST_SLOTS];
    uint8_t adopt[ST_SLOTS];  /* unregistered valid files to register */
    st_sealed adopted[ST_SLOTS];
    kvx_shard *adopt_sh[ST_SLOTS];
    uint64_t ndrop;
} st_fix;

static int st_fix_body(MDB_txn *txn, void *ctx)
{
    kvx_store *s = ((void **)ctx)[0];
    st_fix *f = ((void **)ctx)[1];
    kvx_index *ix = s->ix;
    int rc;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        MDB_val k = {4, &b};
        if (f->drop[b]) {
            if ((rc = kvx_idx_del_shard_blocks(txn, ix, b, NULL))) return rc;
            if ((rc = mdb_del(txn, ix->shards, &k, NULL)) && rc != MDB_NOTFOUND) return rc;
            if ((rc = mdb_del(txn, ix->usage, &k, NULL)) && rc != MDB_NOTFOUND) return rc;
        }
        if (f->resize[b]) {
            kvx_idx_shard rec = s->reg[b];
            rec.file_bytes = f->size[b];
            if ((rc = kvx_idx_put_shard(txn, ix, b, &rec))) return rc;
        }
        if (f->adopt[b]) {
            if ((rc = kvx_st_register(txn, ix, &f->adopted[b]))) return rc;
            const kvx_shard_info *in = kvx_shard_get_info(f->adopt_sh[b]);
            for (uint32_t i = 0; i < in->num_blocks; i++) {
                kvx_entry e;
                if (kvx_shard_entry(&e, f->adopt_sh[b], i) || !e.hash) continue;
                if ((rc = kvx_idx_add_block(txn, ix, e.coordinate, e.hash, f->adopted[b].gen))) return rc;
            }
        }
    }
    if (f->ndrop) {
        kvx_idx_stats st;
        if ((rc = kvx_idx_get_stats(txn, ix, &st))) return rc;
        st.dropped_shards += f->ndrop;
        if ((rc = kvx_idx_put_stats(txn, ix, &st))) return rc;
    }
    return kvx_idx_put_u64(txn, ix->meta, "next_gen", s->next_gen);
}

/* Opens shards/<name> and checks it belongs to this store. 0 and the
 * handle; 1 with a reason in why (a verdict on the file); <0 transient. */
static int st_judge(kvx_store *s, const char *name, kvx_shard **out, char *why, size_t cap)
{
    char path[4096];
    *out = NULL;
    if (snprintf(path, sizeof path, "%s/%s", s->shards_path, name) >= (int)sizeof path)
        return kvx_fail(-ENAMETOOLONG, "store: path too long");
    kvx_shard *sh = NULL;
    int rc = kvx_shard_open(&sh, path, 0);
    if (rc && st_open_transient(rc)) return rc;
    if (rc) {
        snprintf(why, cap, "cannot be validated: %s (%s)", kvx_last_error(), kvx_err_name(rc));
        return 1;
    }
    const kvx_shard_info *in = kvx_shard_get_info(sh);
    const kvx_geometry *g = &in->geometry;
    if (g->num_layers != s->g.num_layers || g->kv_heads != s->g.kv_heads || g->head_dim != s->g.head_dim ||
        g->block_tokens != s->g.block_tokens || g->quant != s->g.quant || g->model_signature != s->g.model_signature ||
        !(in->flags & KVX_FLAG_HASHES)) {
        snprintf(why, cap, "geometry, model or tables differ from this store's (not one of its shards)");
        kvx_shard_close(sh);
        return 1;
    }
    *out = sh;
    return 0;
}

static int st_check_registered(kvx_store *s, st_fix *f, char (*why)[512])
{
    for (int b = 0; b < ST_SLOTS; b++) {
        if (!s->reg_live[b]) continue;
        char name[32];
        kvx_st_shard_name(name, s->reg[b].gen);
        struct stat st;
        if (fstatat(s->shardsfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno != ENOENT) continue; /* EACCES, EIO...: not a verdict */
            f->drop[b] = 1; /* gone: only its records go */
            continue;
        }
        if (!S_ISREG(st.st_mode)) {
            f->drop[b] = 1; /* never followed, never touched */
            continue;
        }
        int verify = (s->flags & KVX_STORE_VERIFY) != 0;
        if ((uint64_t)st.st_size == s->reg[b].file_bytes && !verify) continue; /* opened at first use */
        kvx_shard *sh = NULL;
        int rc = st_judge(s, name, &sh, why[b], sizeof why[b]);
        if (rc < 0) {
            kvx_clear_error();
            continue;
        }
        if (rc == 0 && kvx_shard_get_info(sh)->shard_id != b) {
            snprintf(why[b], sizeof why[b], "its coordinates name shard %u, the index registered it as %d",
                     kvx_shard_get_info(sh)->shard_id, b);
            rc = 1;
        }
        kvx_shard_close(sh);
        if (rc == 1) {
            f->drop[b] = 2; /* then quarantined */
        } else if ((uint64_t)st.st_size != s->reg[b].file_bytes) {
            /* valid: the record was wrong, the file is kept and served */
            f->resize[b] = 1;
            f->size[b] = (uint64_t)st.st_size;
        }
    }
    return 0;
}

/* ------------------------------------------------------------- adoption */

/* A move to quarantine/ that fails (quarantine/ unusable, EIO) leaves the
 * file where it is, unregistered: nothing is lost, and the next writer's
 * recovery judges it again. */
typedef struct st_adopt_ctx {
    st_fix *f;
    char (*why)[512];
} st_adopt_ctx;

static int st_adopt_file(kvx_store *s, int fd, const char *name, void *vctx)
{
    st_adopt_ctx *c = vctx;
    st_fix *f = c->f;
    uint64_t gen;
    if (name[0] == '.' && strstr(name, ".kvx.tmp.")) {
        /* a temporary file of a shard writer of an older release (they now
         * live in staging/): never acknowledged */
        struct stat st;
        if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) kvx_os.unlinkat(fd, name, 0);
        return 0;
    }
    if (!kvx_st_parse_name(name, &gen)) return 0; /* not ours: left alone */
    for (int b = 0; b < ST_SLOTS; b++)
        if (s->reg_live[b] && s->reg[b].gen == gen) return 0;
    struct stat st;
    if (fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) return 0;
    kvx_shard *sh = NULL;
    char why[512];
    int rc = st_judge(s, name, &sh, why, sizeof why);
    if (rc < 0) {
        kvx_clear_error();
        return 0; /* a passing failure: next time */
    }
    if (rc == 0) {
        uint32_t b = kvx_shard_get_info(sh)->shard_id;
        int held = (s->reg_live[b] && !f->drop[b]) || f->adopt[b];
        uint64_t holder = f->adopt[b] ? f->adopted[b].gen : s->reg[b].gen;
        if (held && holder > gen) {
            /* two valid files claim one shard byte: the newer generation
             * holds it (as reindex decides); the older goes aside */
            snprintf(why, sizeof why, "valid, but shard byte %u is held by the newer shards/%016" PRIx64 ".kvx", b,
                     holder);
            kvx_shard_close(sh);
            rc = 1;
        } else {
            char older[32], owhy[512];
            if (held) {
                snprintf(owhy, sizeof owhy, "valid, but shard byte %u is claimed by the newer shards/%s", b, name);
                if (f->adopt[b]) { /* an older unregistered claimant: aside now */
                    kvx_st_shard_name(older, f->adopted[b].gen);
                    kvx_shard_close(f->adopt_sh[b]);
                    f->adopt_sh[b] = NULL;
                    f->adopt[b] = 0;
                    if (kvx_st_quarantine(s, older, owhy) != 0) kvx_clear_error();
                } else { /* the registered holder: its records go, its file aside after the commit */
                    f->drop[b] = 2;
                    snprintf(c->why[b], sizeof c->why[b], "%s", owhy);
                }
            }
            const kvx_shard_info *in = kvx_shard_get_info(sh);
            st_sealed x = {(uint8_t)b, gen, in->flags, in->num_blocks, (uint64_t)st.st_size, kvx_st_now_ns(),
                           kvx_st_count_unverified(sh)};
            f->adopt[b] = 1;
            f->adopted[b] = x;
            f->adopt_sh[b] = sh;
            return 0;
        }
    }
    /* a verdict: the file goes to quarantine/, never unlinked */
    if (kvx_st_quarantine(s, name, why) != 0) kvx_clear_error();
    return 0;
}

/* ------------------------------------------------------------- recovery */

int kvx_st_recover(kvx_store *s)
{
    int rc = kvx_st_registry_load(s);
    if (rc) return rc;
    /* generations first: a staging/ name counts too, even though the file
     * is about to go */
    if ((rc = kvx_st_gen_floor(s))) return rc;
    if ((rc = kvx_st_each_file(s, s->stagingfd, st_rm_staging, NULL))) return rc;
    if (!s->index_live) return kvx_st_reindex_locked(s); /* index lost: rebuild it from the shards */
    st_fix *f = calloc(1, sizeof *f);
    char(*why)[512] = calloc(ST_SLOTS, sizeof *why);
    if (!f || !why) {
        free(f);
        free(why);
        return kvx_fail(-ENOMEM, "store: out of memory");
    }
    st_check_registered(s, f, why);
    st_adopt_ctx ac = {f, why};
    rc = kvx_st_each_file(s, s->shardsfd, st_adopt_file, &ac);
    int any = 0;
    for (int b = 0; b < ST_SLOTS; b++) {
        any |= f->drop[b] | f->resize[b] | f->adopt[b];
        f->ndrop += f->drop[b] != 0;
    }
    if (!rc && any) {
        void *ctx[2] = {s, f};
        rc = kvx_idx_write(s->ix, st_fix_body, ctx);
    }
    if (!rc) {
        /* after the commit: invalid registered files to quarantine/ */
        for (int b = 0; b < ST_SLOTS && !rc; b++) {
            if (f->drop[b] != 2) continue;
            char name[32];
            kvx_st_shard_name(name, s->reg[b].gen);
            kvx_st_cache_drop(s, (uint32_t)b);
            rc = kvx_st_quarantine(s, name, why[b]);
        }
        s->dropped += f->ndrop;
    }
    for (int b = 0; b < ST_SLOTS; b++) kvx_shard_close(f->adopt_sh[b]);
    free(f);
    free(why);
    if (!rc && any) rc = kvx_st_registry_load(s);
    if (rc) return rc;
    /* shards found bad at first use are quarantined at the next flush or
     * gc (kvx_st_drop_bad_shards); a crash between a flush's publication and
     * its eviction leaves the store one shard over: evict now, so repeated
     * crashes cannot add up */
    if (kvx_st_enforce_capacity(s) != 0) kvx_clear_error();
    kvx_clear_error();
    return 0;
}
