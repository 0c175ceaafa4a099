/*
 * store_recover.c - what a writer does when it opens a store (recovery) and
 * reindex (DESIGN.md "Trust rules" 2 to 4).
 *
 * Rule: the shards are the truth and the catalog only names where bytes
 * live. Recovery judges a shard by its own structure and meta CRC, never by
 * the catalog's record of it, and deletes nothing on the word of a check:
 *  - staging/ holds shard writers' temporary files, never acknowledged:
 *    removed (anything else there is left alone); one that is the same
 *    file as a shards/ name the catalog does not name (a flush cut before
 *    its commit, a drop cut after its commit) first sends that shards/
 *    name to quarantine/;
 *  - a registered shard that is gone loses its records; one whose size
 *    differs from its record is opened: valid, its record is corrected and
 *    it is served; invalid, it moves to quarantine/;
 *  - a valid shard in shards/ that the catalog does not name (a crash
 *    before its publication, a backup put back, a stale index) is adopted;
 *    one whose shard byte another shard holds, or that is invalid or
 *    foreign, moves to quarantine/;
 *  - reindex builds a fresh catalog from the shards alone.
 * Readers run none of this (rule 3): a reader with a stale index misses.
 */
#include "store.h"
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* st_unpublished_twin's tally (below): twins whose shards/ name could not
 * be moved aside stay, both names, and that generation is not adopted. */
typedef struct st_twins {
    uint64_t moved;
    size_t nkept;
    uint64_t kept[ST_SLOTS];
} st_twins;

static int st_twin_kept(const st_twins *t, uint64_t gen)
{
    for (size_t i = 0; t && i < t->nkept; i++)
        if (t->kept[i] == gen) return 1;
    return 0;
}

static int st_rm_staging(kvx_store *s, int fd, const char *name, void *ctx)
{
    uint64_t gen;
    if (name[0] == '.' && strstr(name, ".kvx.tmp.") && kvx_st_name_prefix_gen(name + 1, &gen) && st_twin_kept(ctx, gen))
        return 0; /* its shards/ twin could not be moved aside: both stay for the next recovery */
    struct stat st;
    if (kvx_os.fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return 0;
    /* a writer's temporary file was never acknowledged; a directory or
     * anything else someone put here is left alone */
    if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) return 0;
    if (kvx_os.unlinkat(fd, name, 0) != 0 && errno != ENOENT)
        return kvx_fail(-errno, "store %s: recovery: unlink staging/%s: %s", s->dir, name, strerror(errno));
    return 0;
}

typedef struct st_fix {
    uint8_t drop[ST_SLOTS];   /* records to remove (file gone or invalid) */
    uint8_t resize[ST_SLOTS]; /* records whose file_bytes is corrected */
    uint64_t size[ST_SLOTS];
    uint8_t adopt[ST_SLOTS];  /* unregistered valid files to register */
    uint8_t replaced[ST_SLOTS]; /* drop[b] 2 because adopt[b] claims the byte */
    st_sealed adopted[ST_SLOTS];
    kvx_shard *adopt_sh[ST_SLOTS];
    uint64_t ndrop;
} st_fix;

/* Adds shard sh (its record x and every entry with a hash, but those
 * skip marks; skip may be NULL) to e. */
static int st_edit_add_file(kvx_cat_edit *e, const st_sealed *x, const kvx_shard *sh, const uint8_t *skip)
{
    int rc = kvx_st_register(e, x);
    const kvx_shard_info *in = kvx_shard_get_info(sh);
    for (uint32_t i = 0; !rc && i < in->num_blocks; i++) {
        kvx_entry en;
        if (kvx_shard_entry(&en, sh, i) || !en.hash || (skip && skip[i])) continue;
        rc = kvx_cat_edit_add_block(e, en.coordinate, en.hash, x->gen);
    }
    return rc;
}

/* Does the catalog hold a sound copy of key en (a keyed page) in a shard
 * this recovery keeps (drop[byte] 0)? 1 yes (its page passes its CRC), 0
 * no, -EAGAIN when a kept shard under the key's name cannot be opened now,
 * <0 a catalog error. */
static int st_key_indexed(kvx_store *s, kvx_cat_snap *snap, const kvx_entry *en, const uint8_t *drop)
{
    kvx_cat_loc loc;
    int rc, unknown = 0;
    for (size_t i = 0; (rc = kvx_cat_loc_at(snap, en->hash, i, &loc)) == 0; i++) {
        uint32_t b = KVX_COORD_SHARD(loc.coord);
        if (drop[b] || !s->reg->live[b] || s->reg->rec[b].gen != loc.gen) continue;
        kvx_shard *sh = kvx_st_shard_get(s, b, loc.gen);
        if (!sh) { /* judged bad (no sound copy there), or a passing failure */
            pthread_rwlock_rdlock(&s->cache_lock);
            unknown |= !(s->cache[b].gen == loc.gen && s->cache[b].bad);
            pthread_rwlock_unlock(&s->cache_lock);
            continue;
        }
        uint32_t idx = KVX_COORD_BLOCK(loc.coord);
        kvx_entry o;
        const void *page;
        int sound = kvx_shard_entry(&o, sh, idx) == 0 && o.coordinate == loc.coord && o.key &&
                    o.key_len == en->key_len && memcmp(o.key, en->key, en->key_len) == 0 &&
                    kvx_shard_page(&page, sh, idx, 1) == 0;
        kvx_shard_close(sh);
        if (sound) return 1;
    }
    if (rc != KVX_ENOTFOUND) return rc;
    return unknown ? -EAGAIN : 0;
}

/* An adopted keyed shard (a backup put back, a drop whose unlink a crash
 * undid): a key of which the catalog already holds a sound copy is not
 * indexed again from it (skip[i] = 1). The catalog's copy is the
 * acknowledged one; the adoptee's is the same page or one its owner
 * deleted and put again since, which would then be served (or carried by
 * a rewrite into a new shard). A key the catalog does not name, or names
 * only in damaged copies, comes back, as everything in an adopted shard
 * does (DESIGN.md rule 2). -EAGAIN: cannot tell now. */
static int st_keyed_skips(kvx_store *s, kvx_cat_snap *snap, const uint8_t *drop, const kvx_shard *sh, uint8_t *skip)
{
    const kvx_shard_info *in = kvx_shard_get_info(sh);
    for (uint32_t i = 0; i < in->num_blocks; i++) {
        kvx_entry en;
        skip[i] = 0;
        if (kvx_shard_entry(&en, sh, i) || !en.hash || !en.key) continue;
        int held = st_key_indexed(s, snap, &en, drop);
        if (held < 0) return held;
        skip[i] = (uint8_t)held;
    }
    return 0;
}

/* Recovery's one edit: records of gone or invalid shards dropped, wrong
 * sizes corrected, unregistered valid files adopted (for one byte in that
 * order: a drop, then the adoptee's record wins), the drops counted. A
 * keyed adoptee that cannot be judged now (st_keyed_skips -EAGAIN) is left
 * where it is, unregistered, for the next writer's recovery, and so is
 * the holder it would have replaced. */
static int st_fix_write(kvx_store *s, st_fix *f)
{
    kvx_cat_snap *snap = NULL;
    uint8_t *skip[ST_SLOTS] = {0};
    int rc = 0;
    /* a deferral keeps a holder registered, which changes what the others
     * see: judged again until no new deferral (at most one per byte) */
    for (int again = 1; again && !rc;) {
        again = 0;
        for (uint32_t b = 0; b < ST_SLOTS && !rc; b++) {
            if (!f->adopt[b] || !(f->adopted[b].flags & KVX_FLAG_KEYS)) continue;
            if (!snap && (rc = kvx_cat_snap_begin(s->cat, &snap))) break;
            uint32_t n = kvx_shard_get_info(f->adopt_sh[b])->num_blocks;
            if (!skip[b] && !(skip[b] = malloc(n ? n : 1))) {
                rc = kvx_fail(-ENOMEM, "store: out of memory");
                break;
            }
            rc = st_keyed_skips(s, snap, f->drop, f->adopt_sh[b], skip[b]);
            if (rc != -EAGAIN) continue;
            kvx_clear_error();
            rc = 0;
            again = 1;
            kvx_shard_close(f->adopt_sh[b]);
            f->adopt_sh[b] = NULL;
            f->adopt[b] = 0;
            s->adopt_wait[b] = 1;
            if (f->replaced[b]) { /* the holder it would have replaced stays, for now */
                f->drop[b] = 0;
                f->replaced[b] = 0;
                f->ndrop--;
            }
        }
    }
    if (snap) kvx_cat_snap_end(snap);
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    for (uint32_t b = 0; b < ST_SLOTS && !rc; b++) {
        if (f->drop[b]) kvx_cat_edit_drop_shard(&e, b);
        if (f->resize[b]) {
            kvx_cat_shard rec = s->reg->rec[b];
            rec.file_bytes = f->size[b];
            kvx_cat_edit_put_shard(&e, b, &rec);
        }
        if (f->adopt[b]) /* builder failures come back at apply */
            st_edit_add_file(&e, &f->adopted[b], f->adopt_sh[b], skip[b]);
    }
    for (uint32_t b = 0; b < ST_SLOTS; b++) free(skip[b]);
    if (rc) {
        kvx_cat_edit_free(&e);
        return rc;
    }
    if (f->ndrop) {
        kvx_cat_stats d = {0};
        d.dropped_shards = f->ndrop;
        kvx_cat_edit_stats(&e, &d, 0);
    }
    kvx_cat_edit_next_gen(&e, s->next_gen);
    rc = kvx_cat_apply(s->cat, &e); /* builder failures come back here */
    kvx_cat_edit_free(&e);
    return rc;
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
    int rc = kvx_shard_open_at(&sh, s->shardsfd, name, path, 0);
    if (rc && st_open_transient(rc)) return rc;
    if (rc) {
        snprintf(why, cap, "cannot be validated: %s (%s)", kvx_last_error(), kvx_err_name(rc));
        return 1;
    }
    if (kvx_st_shard_ours(s, sh, why, cap) != 0) {
        kvx_shard_close(sh);
        return 1;
    }
    *out = sh;
    return 0;
}

static int st_check_registered(kvx_store *s, st_fix *f, char (*why)[512])
{
    for (int b = 0; b < ST_SLOTS; b++) {
        if (!s->reg->live[b]) continue;
        char name[32];
        kvx_st_shard_name(name, s->reg->rec[b].gen);
        struct stat st;
        if (kvx_os.fstatat(s->shardsfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno != ENOENT) continue; /* EACCES, EIO...: not a verdict */
            f->drop[b] = 1; /* gone: only its records go */
            continue;
        }
        if (!S_ISREG(st.st_mode)) {
            f->drop[b] = 1; /* never followed, never touched */
            continue;
        }
        int verify = (s->flags & KVX_STORE_VERIFY) != 0;
        if ((uint64_t)st.st_size == s->reg->rec[b].file_bytes && !verify) continue; /* opened at first use */
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
        } else if ((uint64_t)st.st_size != s->reg->rec[b].file_bytes) {
            /* valid: the record was wrong, the file is kept and served */
            f->resize[b] = 1;
            f->size[b] = (uint64_t)st.st_size;
        }
    }
    return 0;
}

/* A move to quarantine/ that fails (quarantine/ unusable, EIO) leaves the
 * file where it is, unregistered: nothing is lost, and the next writer's
 * recovery judges it again. */
typedef struct st_adopt_ctx {
    st_fix *f;
    char (*why)[512];
    const st_twins *tw; /* twins left in place: never adopted */
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
        if (kvx_os.fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode)) kvx_os.unlinkat(fd, name, 0);
        return 0;
    }
    if (!kvx_st_parse_name(name, &gen) || st_twin_kept(c->tw, gen)) return 0; /* not ours, or kept: left alone */
    for (int b = 0; b < ST_SLOTS; b++)
        if (s->reg->live[b] && s->reg->rec[b].gen == gen) return 0;
    struct stat st;
    if (kvx_os.fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) return 0;
    kvx_shard *sh = NULL;
    char why[512];
    int rc = st_judge(s, name, &sh, why, sizeof why);
    if (rc < 0) {
        kvx_clear_error();
        return 0; /* a passing failure: next time */
    }
    if (rc == 0) {
        uint32_t b = kvx_shard_get_info(sh)->shard_id;
        int held = (s->reg->live[b] && !f->drop[b]) || f->adopt[b];
        uint64_t holder = f->adopt[b] ? f->adopted[b].gen : s->reg->rec[b].gen;
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
                    f->replaced[b] = 1;
                    snprintf(c->why[b], sizeof c->why[b], "%s", owhy);
                }
            }
            const kvx_shard_info *in = kvx_shard_get_info(sh);
            st_sealed x = {(uint8_t)b, gen, in->flags, in->num_blocks, (uint64_t)st.st_size, kvx_st_now_ns(),
                           kvx_st_count_unverified(sh), "", 0};
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

typedef struct st_found {
    uint64_t gen;
    kvx_shard *sh;
    uint64_t bytes;
    char name[32];
} st_found;

typedef struct st_scan {
    st_found f[ST_SLOTS];
    uint64_t max_gen;
    uint64_t quarantined, skipped;
    int err;           /* the first failed move to quarantine/ */
    char errmsg[512];  /* ... and what it said */
} st_scan;

/* One file of shards/: kept (newest valid file per shard byte), or moved
 * to quarantine/ with the reason (invalid, foreign, or an older file
 * claiming a shard byte a newer one holds). Never deleted. */
static int st_scan_file(kvx_store *s, int fd, const char *name, void *ctx)
{
    st_scan *sc = ctx;
    uint64_t gen;
    if (!kvx_st_parse_name(name, &gen)) return 0;
    if (gen > sc->max_gen) sc->max_gen = gen;
    struct stat st;
    if (kvx_os.fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        int e = errno;
        if (e == ENOENT) return 0; /* gone meanwhile */
        return kvx_fail(-e, "store %s: reindex: stat shards/%s: %s", s->dir, name, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) { /* a directory or link where a shard belongs: never followed */
        sc->skipped++;
        return 0;
    }
    size_t len = strlen(s->shards_path) + 1 + strlen(name) + 1;
    char *path = malloc(len);
    if (!path) return kvx_fail(-ENOMEM, "store: out of memory");
    snprintf(path, len, "%s/%s", s->shards_path, name);
    kvx_shard *sh = NULL;
    int rc = kvx_shard_open_at(&sh, s->shardsfd, name, path, 0);
    free(path);
    if (rc && st_open_transient(rc)) {
        /* not a verdict on the file: stop, leave the index as it was */
        return kvx_fail(rc, "store %s: reindex: cannot open shards/%s: %s", s->dir, name, kvx_strerror(rc));
    }
    char why[600];
    if (rc) {
        snprintf(why, sizeof why, "reindex: cannot be validated: %s (%s)", kvx_last_error(), kvx_err_name(rc));
    } else {
        const kvx_shard_info *in = kvx_shard_get_info(sh);
        char whose[400];
        if (kvx_st_shard_ours(s, sh, whose, sizeof whose) != 0) {
            snprintf(why, sizeof why, "reindex: %s", whose);
            kvx_shard_close(sh);
            sh = NULL;
        } else {
            st_found *f = &sc->f[in->shard_id];
            if (!f->sh || f->gen < gen) {
                /* the newest file holds the byte; an older one goes aside */
                st_found old = *f;
                f->gen = gen;
                f->sh = sh;
                f->bytes = (uint64_t)st.st_size;
                snprintf(f->name, sizeof f->name, "%s", name);
                if (!old.sh) return 0;
                kvx_shard_close(old.sh);
                snprintf(why, sizeof why, "reindex: shard byte %u is also claimed by the newer shards/%s",
                         in->shard_id, f->name);
                if ((rc = kvx_st_quarantine(s, old.name, why)) && !sc->err) {
                    sc->err = rc;
                    snprintf(sc->errmsg, sizeof sc->errmsg, "%s", kvx_last_error());
                }
                else sc->quarantined++;
                return 0;
            }
            snprintf(why, sizeof why, "reindex: shard byte %u is also claimed by the newer shards/%s", in->shard_id,
                     f->name);
            kvx_shard_close(sh);
            sh = NULL;
        }
    }
    if ((rc = kvx_st_quarantine(s, name, why)) && !sc->err) {
        sc->err = rc;
        snprintf(sc->errmsg, sizeof sc->errmsg, "%s", kvx_last_error());
    }
    else sc->quarantined++;
    return 0;
}

/* A keyed page found in the shards: its key's name, where it lives. */
typedef struct st_kpage {
    uint64_t hash, gen;
    uint32_t b, idx;
    uint8_t sound; /* its page's CRC: 0 not checked yet, 1 passes, 2 fails */
} st_kpage;

/* Newest first within one name: a higher generation, then a later entry. */
static int st_cmp_kpage(const void *pa, const void *pb)
{
    const st_kpage *a = pa, *b = pb;
    if (a->hash != b->hash) return a->hash < b->hash ? -1 : 1;
    if (a->gen != b->gen) return a->gen > b->gen ? -1 : 1;
    return a->idx > b->idx ? -1 : a->idx < b->idx;
}

static int st_same_key(const st_scan *sc, const st_kpage *a, const st_kpage *b)
{
    kvx_entry x, y;
    if (kvx_shard_entry(&x, sc->f[a->b].sh, a->idx) || kvx_shard_entry(&y, sc->f[b->b].sh, b->idx)) return 0;
    return x.key && y.key && x.key_len == y.key_len && memcmp(x.key, y.key, x.key_len) == 0;
}

/* Do two copies hold the same page, byte for byte? Then an older one is
 * not stale: it is a second copy of the newest (two batches stored one
 * each), good to serve when the newest is damaged. Decided by content:
 * length and CRC-32 alone are forged by four chosen bytes, and a replaced
 * page of equal length and CRC came back after reindex. */
static int st_same_page(const st_scan *sc, const st_kpage *a, const st_kpage *b)
{
    kvx_entry x, y;
    const void *px, *py;
    if (kvx_shard_entry(&x, sc->f[a->b].sh, a->idx) || kvx_shard_entry(&y, sc->f[b->b].sh, b->idx)) return 0;
    if (x.bytes != y.bytes) return 0;
    if (kvx_shard_page(&px, sc->f[a->b].sh, a->idx, 0) || kvx_shard_page(&py, sc->f[b->b].sh, b->idx, 0)) return 0;
    return memcmp(px, py, x.bytes) == 0; /* a file cut after open reads as zeros (the SIGBUS guard) */
}

/* Does copy a's page pass its CRC? (checked once) */
static int st_page_sound(const st_scan *sc, st_kpage *a)
{
    const void *page;
    if (!a->sound) a->sound = kvx_shard_page(&page, sc->f[a->b].sh, a->idx, 1) == 0 ? 1 : 2;
    return a->sound == 1;
}

/* A keyed store's pages: one copy per key, the newest, and older copies
 * of the very same page (so a damaged newest copy does not hide a sound
 * one). The shards may hold older copies of a key its owner deleted and
 * put again (the bytes stay until gc rewrites their shard): indexing
 * those would serve the old page for the key. But a generation is taken
 * when a batch starts writing, not when it flushes, so an acknowledged
 * later put can sit below a damaged copy (a damaged copy is not "held",
 * the put writes the key again): an older copy of another page is
 * indexed too when no newer copy of the key is sound (the shards cannot
 * tell it from a replaced page; losing the acknowledged one is worse). */
static int st_edit_add_keyed(kvx_cat_edit *e, const st_scan *sc)
{
    size_t n = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++)
        if (sc->f[b].sh) n += kvx_shard_get_info(sc->f[b].sh)->num_blocks;
    st_kpage *all = malloc((n ? n : 1) * sizeof *all);
    if (!all) return kvx_fail(-ENOMEM, "store: out of memory");
    size_t k = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!sc->f[b].sh) continue;
        uint32_t cnt = kvx_shard_get_info(sc->f[b].sh)->num_blocks;
        for (uint32_t i = 0; i < cnt; i++) {
            kvx_entry en;
            if (kvx_shard_entry(&en, sc->f[b].sh, i) || !en.hash) continue;
            all[k++] = (st_kpage){en.hash, sc->f[b].gen, b, i, 0};
        }
    }
    qsort(all, k, sizeof *all, st_cmp_kpage);
    int rc = 0;
    for (size_t i = 0; !rc && i < k; i++) {
        size_t newest = i; /* the newest copy of this key came first */
        int sound_newer = 0;
        for (size_t j = i; j-- > 0 && all[j].hash == all[i].hash;)
            if (st_same_key(sc, &all[j], &all[i])) {
                newest = j;
                sound_newer = sound_newer || st_page_sound(sc, &all[j]);
            }
        if (newest != i && !st_same_page(sc, &all[newest], &all[i]) && sound_newer)
            continue; /* stale: deleted, put again */
        rc = kvx_cat_edit_add_block(e, KVX_COORD(all[i].b, all[i].idx, 0), all[i].hash, all[i].gen);
    }
    free(all);
    return rc;
}

/* Reindex's one edit: the catalog emptied (nothing of it is read), then
 * every kept file registered with its blocks (a keyed store's: the newest
 * copy of each key), zero counters, next_gen. */
static int st_reindex_write(kvx_store *s, const st_scan *sc, uint64_t next_gen)
{
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    kvx_cat_edit_reset(&e);
    int rc = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        const st_found *f = &sc->f[b];
        if (!f->sh) continue;
        const kvx_shard_info *in = kvx_shard_get_info(f->sh);
        st_sealed x = {(uint8_t)b, f->gen, in->flags, in->num_blocks, f->bytes, kvx_st_now_ns(), kvx_st_count_unverified(f->sh),
                       "", 0};
        if (s->keyed) rc = rc ? rc : kvx_st_register(&e, &x);
        else st_edit_add_file(&e, &x, f->sh, NULL);
    }
    if (s->keyed && !rc) rc = st_edit_add_keyed(&e, sc);
    if (rc) {
        kvx_cat_edit_free(&e);
        return rc;
    }
    kvx_cat_edit_stats(&e, NULL, 0);
    kvx_cat_edit_next_gen(&e, next_gen);
    rc = kvx_cat_apply(s->cat, &e); /* builder failures come back here */
    kvx_cat_edit_free(&e);
    return rc;
}

int kvx_st_reindex_locked(kvx_store *s)
{
    kvx_st_discard_pending(&s->own);
    int rc = kvx_st_gen_floor(s);
    if (rc) return rc;
    st_scan *sc = calloc(1, sizeof *sc);
    if (!sc) return kvx_fail(-ENOMEM, "store: out of memory");
    rc = kvx_st_each_file(s, s->shardsfd, st_scan_file, sc);
    if (!rc) {
        uint64_t ng = s->next_gen > sc->max_gen + 1 ? s->next_gen : sc->max_gen + 1;
        if ((rc = st_reindex_write(s, sc, ng)) == 0) s->next_gen = ng;
    }
    for (int b = 0; b < ST_SLOTS; b++) kvx_shard_close(sc->f[b].sh);
    uint64_t quarantined = sc->quarantined, skipped = sc->skipped;
    int qerr = sc->err;
    char qmsg[512];
    snprintf(qmsg, sizeof qmsg, "%s", sc->errmsg);
    free(sc);
    for (uint32_t b = 0; b < ST_SLOTS; b++) kvx_st_cache_drop(s, b);
    if (!rc) rc = kvx_st_registry_load(s);
    if (!rc) rc = kvx_st_derive_digests(s);
    if (!rc && qerr)
        rc = kvx_fail(qerr, "store %s: the index is rebuilt, but a file reindex could not use stays in shards/ (not "
                            "indexed, nothing lost): %s",
                      s->dir, qmsg);
    if (!rc && (quarantined || skipped))
        kvx_fail(KVX_ECORRUPT,
                 "store %s: reindex moved %llu invalid or duplicate file(s) to quarantine/ and left %llu entr%s of "
                 "shards/ that are not regular files alone",
                 s->dir, (unsigned long long)quarantined, (unsigned long long)skipped, skipped == 1 ? "y" : "ies");
    return rc;
}

/* How many batches besides the built-in one hold unflushed blocks, and
 * how many blocks. Under wmu. */
static size_t st_other_busy(kvx_store *s, size_t *blocks)
{
    size_t n = 0;
    *blocks = 0;
    for (const kvx_store_batch *x = s->batches; x; x = x->next)
        if (x != &s->own && st_batch_busy(x)) {
            n++;
            *blocks += x->npend;
        }
    return n;
}

KVX_API int kvx_store_reindex(kvx_store *s)
{
    int rc = kvx_st_writer_check(s, "kvx_store_reindex");
    if (rc) return rc;
    pthread_mutex_lock(&s->wmu);
    /* another batch's sealed files wait in staging/, unpublished, and its
     * open writers hold shard bytes and generations: a reindex that
     * emptied staging/ would lose what that batch's flush will
     * acknowledge. Refused until that batch flushes or is destroyed. (Batches holding only pins are fine: reindex keeps every
     * kept shard's generation, so their pins still name the same files.) */
    size_t nblocks, nbusy = st_other_busy(s, &nblocks);
    if (nbusy) {
        pthread_mutex_unlock(&s->wmu);
        return kvx_fail(KVX_EBUSY,
                        "kvx_store_reindex: %zu other batch(es) hold %zu unflushed block(s) in unpublished shard "
                        "files: flush or destroy them (kvx_store_batch_flush / kvx_store_batch_destroy) first",
                        nbusy, nblocks);
    }
    /* puts not yet flushed are flushed first: a reindex must not drop what
     * the next flush would acknowledge. That next kvx_store_flush, not this
     * reindex, acknowledges them to the caller, so their pins (the shards of
     * blocks they found held, and the shards this flush publishes) must last
     * until it returns (saved here and put back after the reindex): the
     * reindex gives every shard a fresh creation time, so a block a put
     * found held then looked the oldest in the store and the next flush's
     * eviction took it (a put of only held blocks pends nothing, so it was
     * not even flushed here). Found by tests/system/powercut.c seed 651158135. */
    kvx_store_batch *x = &s->own;
    for (size_t i = 0; i < x->nsealed; i++) kvx_st_pin(x, x->sealed[i].byte, x->sealed[i].gen);
    for (int k = 0; k < 2; k++)
        if (x->cur[k].w) kvx_st_pin(x, x->cur[k].byte, x->cur[k].gen);
    uint8_t pinned[ST_SLOTS];
    uint64_t pin_gen[ST_SLOTS];
    memcpy(pinned, x->pinned, sizeof pinned);
    memcpy(pin_gen, x->pin_gen, sizeof pin_gen);
    if (st_batch_busy(x)) rc = kvx_st_flush_locked(s, x);
    if (!rc) {
        rc = kvx_st_reindex_locked(s);
        /* reindex keeps each kept shard's generation, so these pins still
         * name the same files; a failed flush dropped the puts (its blocks
         * of successful puts are counted for the next kvx_store_flush) */
        for (int b = 0; b < ST_SLOTS; b++) {
            if (!pinned[b] || x->pinned[b]) continue; /* a pin digest derivation carried to a new shard stays */
            x->pinned[b] = 1;
            x->pin_gen[b] = pin_gen[b];
        }
    }
    pthread_mutex_unlock(&s->wmu);
    return rc;
}

/* A staging/ file whose generation also names a file in shards/, the same
 * inode, is either a batch's shard linked by a flush (kvx_st_link_files)
 * cut before or after its commit, or a shard's drop mark
 * (".<gen>.kvx.tmp.drop", store_maint.c) left by an eviction, compaction
 * or gc cut before or after its commit. When the catalog names that
 * generation the edit did not happen or the flush did (the staging/ name
 * only goes). Else the flush did not commit, or the drop did, or the index
 * is older than the shards: the shards/ name moves to quarantine/ (never
 * unlinked on this inference, never adopted: no part of an unpublished
 * batch and nothing a committed edit dropped is served). A move that
 * fails keeps both names (kept: the staging/ name stays, the file is not
 * adopted) for the next writer's recovery. */
static int st_unpublished_twin(kvx_store *s, int fd, const char *name, void *vctx)
{
    st_twins *t = vctx;
    uint64_t gen;
    if (name[0] != '.' || !strstr(name, ".kvx.tmp.") || !kvx_st_name_prefix_gen(name + 1, &gen)) return 0;
    for (int b = 0; b < ST_SLOTS; b++)
        if (s->reg->live[b] && s->reg->rec[b].gen == gen) return 0; /* published */
    struct stat a, b;
    char sname[32];
    kvx_st_shard_name(sname, gen);
    if (kvx_os.fstatat(fd, name, &a, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(a.st_mode)) return 0;
    if (kvx_os.fstatat(s->shardsfd, sname, &b, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(b.st_mode)) return 0;
    if (a.st_ino != b.st_ino || a.st_dev != b.st_dev) return 0; /* another file: judged as any other */
    size_t len = strlen(name);
    int drop = len > 5 && strcmp(name + len - 5, ".drop") == 0;
    const char *why = drop ? "dropped by a committed eviction, compaction or gc whose unlink a crash cut (its drop "
                             "mark staging/.<name>.tmp.drop was beside it): not served again"
                           : "a flush cut before its commit (its staging/ twin was the same file), or an index older "
                             "than the shards: not served (put back in shards/, the next writer adopts it)";
    if (kvx_st_quarantine(s, sname, why) == 0) {
        t->moved++;
        return 0;
    }
    if (kvx_os.fstatat(s->shardsfd, sname, &b, AT_SYMLINK_NOFOLLOW) != 0) { /* moved; only an fsync failed */
        kvx_clear_error();
        return 0;
    }
    if (t->nkept == ST_SLOTS) return -EIO; /* the failure's message stands */
    kvx_clear_error();
    t->kept[t->nkept++] = gen;
    return 0;
}

int kvx_st_recover(kvx_store *s)
{
    int rc = kvx_st_registry_load(s);
    if (rc) return rc;
    /* generations first: a staging/ name counts too, even though the file
     * is about to go; a raised floor is committed before any such name
     * goes, so no generation is given out twice across crashes */
    uint64_t persisted = s->next_gen;
    if ((rc = kvx_st_gen_floor(s))) return rc;
    if (s->index_live && s->next_gen > persisted) {
        kvx_cat_edit e;
        kvx_cat_edit_init(&e);
        kvx_cat_edit_next_gen(&e, s->next_gen);
        rc = kvx_cat_apply(s->cat, &e);
        kvx_cat_edit_free(&e);
        if (rc) return rc;
    }
    st_twins *tw = calloc(1, sizeof *tw);
    if (!tw) return kvx_fail(-ENOMEM, "store: out of memory");
    /* a flush cut before its commit, a drop cut after its commit: the
     * shards/ names go to quarantine/ first (durably), then the staging/
     * names below. With the index lost, the catalog cannot say which
     * commits happened: reindex adopts them (rule 2: nothing acknowledged
     * is deleted on a guess). */
    if (s->index_live) rc = kvx_st_each_file(s, s->stagingfd, st_unpublished_twin, tw);
    if (!rc) rc = kvx_st_each_file(s, s->stagingfd, st_rm_staging, tw);
    if (rc || !s->index_live) {
        free(tw);
        return rc ? rc : kvx_st_reindex_locked(s); /* index lost: rebuild it from the shards */
    }
    st_fix *f = calloc(1, sizeof *f);
    char(*why)[512] = calloc(ST_SLOTS, sizeof *why);
    if (!f || !why) {
        free(f);
        free(why);
        free(tw);
        return kvx_fail(-ENOMEM, "store: out of memory");
    }
    st_check_registered(s, f, why);
    st_adopt_ctx ac = {f, why, tw};
    rc = kvx_st_each_file(s, s->shardsfd, st_adopt_file, &ac);
    int any = 0;
    for (int b = 0; b < ST_SLOTS; b++) {
        any |= f->drop[b] | f->resize[b] | f->adopt[b];
        f->ndrop += f->drop[b] != 0;
    }
    /* the generations dropped (the registry names an adoptee after the
     * commit where one takes the byte) */
    uint64_t dropped_gen[ST_SLOTS];
    for (int b = 0; b < ST_SLOTS; b++) dropped_gen[b] = s->reg->rec[b].gen;
    if (!rc && any) rc = st_fix_write(s, f);
    if (!rc) {
        /* after the commit: invalid registered files to quarantine/ */
        for (int b = 0; b < ST_SLOTS && !rc; b++) {
            if (f->drop[b] != 2) continue;
            char name[32];
            kvx_st_shard_name(name, dropped_gen[b]);
            kvx_st_cache_drop(s, (uint32_t)b);
            rc = kvx_st_quarantine(s, name, why[b]);
        }
        s->dropped += f->ndrop;
    }
    for (int b = 0; b < ST_SLOTS; b++) kvx_shard_close(f->adopt_sh[b]);
    free(f);
    free(why);
    free(tw);
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
