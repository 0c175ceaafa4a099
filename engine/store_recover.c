/*
 * store_recover.c - what a writer does when it opens a store (recovery) and
 * reindex (DESIGN.md "The files are the whole truth", trust rules 2 to 4).
 *
 * Rule: the files are the truth and the catalog only names where bytes
 * live. Every entry of a shard carries the sequence number of the commit
 * that wrote it; a keyed delete is a tombstone entry with its own. What a
 * store holds is a plan computed from the files alone: for each key the
 * entry with the highest sequence number decides (a page wins over a
 * tombstone of its own number); a damaged winner is a miss, never a
 * reason to serve an older copy. Nothing is decided by a file's name, its
 * generation digits, its size or its mtime:
 *  - staging/ holds shard writers' temporary files, never acknowledged:
 *    removed (anything else there is left alone); one that is the same
 *    file as a shards/ name (a flush cut before its acknowledgement)
 *    first sends that shards/ name to quarantine/, and with it every file
 *    of the same commit (same sequence number) whose twin already went;
 *  - a sound catalog is used as it is when it names exactly the files in
 *    shards/ (each with its size) and staging/ held nothing of a flush
 *    the catalog does not name: nothing changed behind its back, so open
 *    time does not grow with the number of shards;
 *  - anything else (index/ missing, damaged or older than the files, a
 *    file gone, grown, added, copied or renamed) is a reindex: a fresh
 *    catalog from the shards alone, by the rule above; two valid files
 *    claiming one shard byte are judged by their records (the newer
 *    sequence numbers keep it; equal ones are the same file twice) and
 *    the other goes to quarantine/, never unlinked.
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
#include <time.h>
#include <unistd.h>

/* st_twin's tally (below): twins whose shards/ name could not
 * be moved aside stay, both names, and that generation is not adopted. */
typedef struct st_twins {
    uint64_t moved;
    size_t nkept;
    uint64_t kept[ST_SLOTS];
} st_twins;

/* What recovery found in staging/: the commits that never answered (their
 * marks' sequence numbers) and the drop marks' files it could not move. */
typedef struct st_unacked {
    uint64_t seq[ST_SLOTS];
    size_t n;
    st_twins *tw;
} st_unacked;

static int st_twin_kept(const st_twins *t, uint64_t gen)
{
    for (size_t i = 0; t && i < t->nkept; i++)
        if (t->kept[i] == gen) return 1;
    return 0;
}

static int st_rm_staging(kvx_store *s, int fd, const char *name, void *ctx)
{
    uint64_t gen;
    if (name[0] == '.' && strstr(name, ".kvx.tmp.") && kvx_st_name_prefix_gen(name + 1, &gen) &&
        st_twin_kept(((st_unacked *)ctx)->tw, gen))
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

/* The catalog is used as it is only when nothing changed behind its back:
 * it names exactly the kvx-named regular files of shards/, each with its
 * recorded size and inode (with KVX_STORE_VERIFY, each also opens valid
 * as the shard it is registered as). 1 current, 0 not (a reindex). Files
 * are stat'ed, not read: open time stays flat in the number of shards.
 * A reader (which removes nothing) also passes files of a commit that
 * never answered (all their entries carry a pending mark's number). */
typedef struct st_unreg {
    int extra, reader;
    const st_unacked *u;
} st_unreg;

/* Can unregistered file name hold no record a reader must know: it is not
 * a valid shard of this store, or every entry carries the number of a
 * commit that never answered? (Opened only when unregistered: rare.) */
static int st_holds_nothing(kvx_store *s, const char *name, const st_unacked *u)
{
    char path[4096], why[512];
    snprintf(path, sizeof path, "%s/%s", s->shards_path, name);
    kvx_shard *sh = NULL;
    int rc = kvx_shard_open_at(&sh, s->shardsfd, name, path, 0);
    if (rc) {
        kvx_clear_error();
        return !st_open_transient(rc); /* invalid: no records; a passing failure: cannot tell */
    }
    if (kvx_st_shard_ours(s, sh, why, sizeof why) != 0) {
        kvx_shard_close(sh);
        return 1; /* foreign */
    }
    if (!u || !u->n) {
        kvx_shard_close(sh);
        return 0;
    }
    uint32_t n = kvx_shard_get_info(sh)->num_blocks;
    int all = n > 0;
    for (uint32_t i = 0; i < n && all; i++) {
        uint64_t seq = 0;
        int tomb = 0, hit = 0;
        kvx_shard_entry_commit(sh, i, &seq, &tomb);
        for (size_t k = 0; k < u->n; k++) hit |= u->seq[k] == seq;
        all = hit;
    }
    kvx_shard_close(sh);
    return all;
}

static int st_unregistered(kvx_store *s, int fd, const char *name, void *ctx)
{
    st_unreg *c = ctx;
    uint64_t gen;
    struct stat st;
    if (name[0] == '.' && strstr(name, ".kvx.tmp.")) {
        /* a temporary file of a shard writer of an older release (they now
         * live in staging/): never acknowledged */
        if (!c->reader && kvx_os.fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            kvx_os.unlinkat(fd, name, 0);
        return 0;
    }
    if (!kvx_st_parse_name(name, &gen)) return 0; /* not ours: left alone */
    for (int b = 0; b < ST_SLOTS; b++)
        if (s->reg->live[b] && s->reg->rec[b].gen == gen) return 0;
    if (kvx_os.fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) return 0;
    if (c->reader && st_holds_nothing(s, name, c->u)) return 0;
    c->extra++;
    return 0;
}

static int st_catalog_current(kvx_store *s, int reader, const st_unacked *u)
{
    /* a reader only asks whether a file the catalog does not know may
     * hold newer records: one under an unregistered name, or another file
     * under a registered one (its inode differs: names are given out
     * again after an index is lost). A registered file gone or cut makes
     * misses, which lookups find entry by entry. */
    for (int b = 0; b < ST_SLOTS && reader; b++) {
        if (!s->reg->live[b] || !s->reg->rec[b].ino) continue;
        char name[32];
        kvx_st_shard_name(name, s->reg->rec[b].gen);
        struct stat st;
        if (kvx_os.fstatat(s->shardsfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode) &&
            (uint64_t)st.st_ino != s->reg->rec[b].ino && !st_holds_nothing(s, name, u))
            return 0;
    }
    for (int b = 0; b < ST_SLOTS && !reader; b++) {
        if (!s->reg->live[b]) continue;
        char name[32], why[512];
        kvx_st_shard_name(name, s->reg->rec[b].gen);
        struct stat st;
        if (kvx_os.fstatat(s->shardsfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
            if (errno == ENOENT) return 0;
            continue; /* EACCES, EIO...: not a verdict */
        }
        if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != s->reg->rec[b].file_bytes) return 0;
        /* another file under the name (two names swapped, a copy put
         * back): its size alone could not tell */
        if (s->reg->rec[b].ino && (uint64_t)st.st_ino != s->reg->rec[b].ino) return 0;
        if (!(s->flags & KVX_STORE_VERIFY)) continue; /* opened at first use */
        kvx_shard *sh = NULL;
        int rc = st_judge(s, name, &sh, why, sizeof why);
        if (rc < 0) {
            kvx_clear_error();
            continue;
        }
        int ok = rc == 0 && kvx_shard_get_info(sh)->shard_id == (uint32_t)b;
        kvx_shard_close(sh);
        if (!ok) return 0;
    }
    st_unreg c = {0, reader, u};
    int rc = kvx_st_each_file(s, s->shardsfd, st_unregistered, &c);
    if (rc) return rc;
    return c.extra == 0;
}

typedef struct st_found {
    uint64_t gen;
    kvx_shard *sh;
    uint64_t bytes;
    uint64_t max_seq, ino;
    char name[32];
} st_found;

typedef struct st_scan {
    st_found f[ST_SLOTS];
    uint64_t max_seq; /* over every file kept */
    uint64_t quarantined, skipped;
    const uint64_t *useq; /* sequence numbers of flushes never acknowledged */
    size_t nuseq;
    const st_twins *tw;   /* files whose staging/ twin could not be moved aside */
    int err;           /* the first failed move to quarantine/ */
    char errmsg[512];  /* ... and what it said */
} st_scan;

static int st_seq_unacked(const st_scan *sc, uint64_t seq)
{
    for (size_t i = 0; i < sc->nuseq; i++)
        if (sc->useq[i] == seq) return 1;
    return 0;
}

/* The largest sequence number of sh (0 without a sequence table), and
 * whether every entry carries one of the unacknowledged flushes'. */
static uint64_t st_file_seqs(const st_scan *sc, const kvx_shard *sh, int *all_unacked)
{
    uint32_t n = kvx_shard_get_info(sh)->num_blocks;
    uint64_t max = 0;
    *all_unacked = n > 0 && sc->nuseq > 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t seq = 0;
        int tomb = 0;
        kvx_shard_entry_commit(sh, i, &seq, &tomb);
        if (seq > max) max = seq;
        if (*all_unacked && !st_seq_unacked(sc, seq)) *all_unacked = 0;
    }
    return max;
}

static void st_scan_aside(kvx_store *s, st_scan *sc, const char *name, const char *why)
{
    int rc = kvx_st_quarantine(s, name, why);
    if (rc && !sc->err) {
        sc->err = rc;
        snprintf(sc->errmsg, sizeof sc->errmsg, "%s", kvx_last_error());
    } else if (!rc) {
        sc->quarantined++;
    }
}

/* Does file a hold a shard byte against file b? By their records: the
 * newer sequence numbers, then more entries; equal in both, they are the
 * same file twice and the one with the lower inode number stays (any
 * rule would do: neither holds anything the other does not). */
static int st_file_wins(const st_found *a, const st_found *b)
{
    if (a->max_seq != b->max_seq) return a->max_seq > b->max_seq;
    uint32_t na = kvx_shard_get_info(a->sh)->num_blocks, nb = kvx_shard_get_info(b->sh)->num_blocks;
    if (na != nb) return na > nb;
    return a->ino < b->ino;
}

/* One file of shards/: kept, or moved to quarantine/ with the reason
 * (invalid, foreign, a flush never acknowledged, or a second file for a
 * shard byte whose records lose). Never deleted. */
static int st_scan_file(kvx_store *s, int fd, const char *name, void *ctx)
{
    st_scan *sc = ctx;
    uint64_t gen;
    if (!kvx_st_parse_name(name, &gen)) return 0;
    if (st_twin_kept(sc->tw, gen)) return 0; /* never published: left for the next recovery */
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
        st_scan_aside(s, sc, name, why);
        return 0;
    }
    char whose[400];
    if (kvx_st_shard_ours(s, sh, whose, sizeof whose) != 0) {
        snprintf(why, sizeof why, "reindex: %s", whose);
        kvx_shard_close(sh);
        st_scan_aside(s, sc, name, why);
        return 0;
    }
    int unacked = 0;
    st_found cand = {gen, sh, (uint64_t)st.st_size, st_file_seqs(sc, sh, &unacked), (uint64_t)st.st_ino, ""};
    snprintf(cand.name, sizeof cand.name, "%s", name);
    if (unacked) {
        /* a file of a flush whose staging/ twin another of its files still
         * had: that flush never answered, so none of it is served */
        kvx_shard_close(sh);
        st_scan_aside(s, sc, name, "reindex: a file of a flush that was never acknowledged (another file of the same "
                                   "commit still had its staging/ name)");
        return 0;
    }
    st_found *f = &sc->f[kvx_shard_get_info(sh)->shard_id];
    if (!f->sh) {
        *f = cand;
        return 0;
    }
    const st_found *keep = st_file_wins(&cand, f) ? &cand : f, *lose = keep == f ? &cand : f;
    snprintf(why, sizeof why,
             "reindex: shard byte %u is also claimed by shards/%s, whose entries are newer (or the same: a copy)",
             kvx_shard_get_info(sh)->shard_id, keep->name);
    char lname[32];
    snprintf(lname, sizeof lname, "%s", lose->name);
    kvx_shard_close(lose->sh);
    if (keep == &cand) *f = cand;
    st_scan_aside(s, sc, lname, why);
    return 0;
}

/* A keyed entry found in the shards: its key's name, its sequence
 * number, where it lives. */
typedef struct st_kpage {
    uint64_t hash, seq;
    uint32_t b, idx;
    uint8_t tomb;
} st_kpage;

/* By name, then newest first (a page before a tombstone of its own
 * number: a commit that superseded a copy wrote both), then by place. */
static int st_cmp_kpage(const void *pa, const void *pb)
{
    const st_kpage *a = pa, *b = pb;
    if (a->hash != b->hash) return a->hash < b->hash ? -1 : 1;
    if (a->seq != b->seq) return a->seq > b->seq ? -1 : 1;
    if (a->tomb != b->tomb) return a->tomb < b->tomb ? -1 : 1;
    if (a->b != b->b) return a->b < b->b ? -1 : 1;
    return (a->idx > b->idx) - (a->idx < b->idx);
}

static int st_same_key(const st_scan *sc, const st_kpage *a, const st_kpage *b)
{
    kvx_entry x, y;
    if (kvx_shard_entry(&x, sc->f[a->b].sh, a->idx) || kvx_shard_entry(&y, sc->f[b->b].sh, b->idx)) return 0;
    return x.key && y.key && x.key_len == y.key_len && memcmp(x.key, y.key, x.key_len) == 0;
}

static int st_page_sound(const st_scan *sc, const st_kpage *a)
{
    const void *page;
    return kvx_shard_page(&page, sc->f[a->b].sh, a->idx, 1) == 0;
}

/* A keyed store's live set: for each key, its entry with the highest
 * sequence number decides. A page is indexed (of several copies from one
 * commit, which hold the same bytes, a sound one); a tombstone hides the
 * key. An older copy is never indexed, even when the newest is damaged:
 * that is a miss (verify reports it), not the replaced page served. */
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
            uint64_t seq = 0;
            int tomb = 0;
            if (kvx_shard_entry(&en, sc->f[b].sh, i) || !en.hash || kvx_shard_entry_commit(sc->f[b].sh, i, &seq, &tomb))
                continue;
            all[k++] = (st_kpage){en.hash, seq, b, i, (uint8_t)tomb};
        }
    }
    qsort(all, k, sizeof *all, st_cmp_kpage);
    int rc = 0;
    for (size_t i = 0; !rc && i < k; i++) {
        /* decided already by a newer record of the same key? */
        int decided = 0;
        for (size_t j = i; j-- > 0 && all[j].hash == all[i].hash && !decided;) decided = st_same_key(sc, &all[j], &all[i]);
        if (decided || all[i].tomb) continue;
        /* the newest is a page. Several copies of one commit (a file
         * copied, a compaction cut before it unlinked its victims) held
         * the same bytes when written: a sound one is indexed */
        size_t pick = i, j = i + 1;
        if (j < k && all[j].hash == all[i].hash && all[j].seq == all[i].seq && !st_page_sound(sc, &all[i]))
            for (; j < k && all[j].hash == all[i].hash && all[j].seq == all[i].seq; j++)
                if (!all[j].tomb && st_same_key(sc, &all[j], &all[i]) && st_page_sound(sc, &all[j])) {
                    pick = j;
                    break;
                }
        rc = kvx_cat_edit_add_block(e, KVX_COORD(all[pick].b, all[pick].idx, 0), all[pick].hash, sc->f[all[pick].b].gen);
    }
    free(all);
    return rc;
}

/* Reindex's one edit: the catalog emptied (nothing of it is read), then
 * every kept file registered with its blocks (a keyed store's: its live
 * set), zero counters, next_gen, next_seq. */
static int st_reindex_write(kvx_store *s, const st_scan *sc, const kvx_cat_stats *carry)
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
                       "", 0, NULL, f->ino};
        if (s->keyed) rc = rc ? rc : kvx_st_register(&e, &x);
        else st_edit_add_file(&e, &x, f->sh, NULL);
    }
    if (s->keyed && !rc) rc = st_edit_add_keyed(&e, sc);
    if (rc) {
        kvx_cat_edit_free(&e);
        return rc;
    }
    /* a writer's recovery keeps the sound catalog's counters, and counts
     * the shards it named that the plan does not keep (gone, invalid) */
    kvx_cat_stats delta = {0};
    if (carry) {
        delta = *carry;
        for (uint32_t b = 0; b < ST_SLOTS; b++) {
            if (!s->reg->live[b]) continue;
            int kept = 0;
            for (uint32_t c = 0; c < ST_SLOTS && !kept; c++) kept = sc->f[c].sh && sc->f[c].gen == s->reg->rec[b].gen;
            delta.dropped_shards += !kept;
        }
    }
    kvx_cat_edit_stats(&e, carry ? &delta : NULL, 0);
    kvx_cat_edit_next_gen(&e, s->next_gen);
    kvx_cat_edit_next_seq(&e, s->next_seq);
    rc = kvx_cat_apply(s->cat, &e); /* builder failures come back here */
    kvx_cat_edit_free(&e);
    return rc;
}

/* A keyed store written before sequence numbers keeps its deletes only in
 * its catalog: its files cannot say which copy of a key is live. A shard
 * written before prefix digests is refused in any store. */
static int st_scan_pre_seq(kvx_store *s, const st_scan *sc)
{
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!sc->f[b].sh) continue;
        int rc = kvx_st_refuse_predigest(s, sc->f[b].name, kvx_shard_get_info(sc->f[b].sh)->flags);
        if (rc) return rc;
    }
    if (!s->keyed) return 0; /* blocks: no deletes, every sound copy is the block */
    for (uint32_t b = 0; b < ST_SLOTS; b++)
        if (sc->f[b].sh && !(kvx_shard_get_info(sc->f[b].sh)->flags & KVX_FLAG_SEQ))
            return kvx_fail(KVX_EVERSION,
                            "store %s: shards/%s was written before sequence numbers (a keyed store of kvx 0.x "
                            "STORE version 2): its deletes live only in its catalog, and reindex cannot rebuild that "
                            "from the files; open it with a sound index/ (the first writer migrates it), or recreate "
                            "it (it is a cache)",
                            s->dir, sc->f[b].name);
    return 0;
}

static int st_reindex_plan(kvx_store *s, const uint64_t *useq, size_t nuseq, const st_twins *tw,
                           const kvx_cat_stats *carry)
{
    kvx_st_discard_pending(&s->own);
    st_scan *sc = calloc(1, sizeof *sc);
    if (!sc) return kvx_fail(-ENOMEM, "store: out of memory");
    sc->useq = useq;
    sc->nuseq = nuseq;
    sc->tw = tw;
    int rc = kvx_st_each_file(s, s->shardsfd, st_scan_file, sc);
    for (int b = 0; !rc && b < ST_SLOTS; b++)
        if (sc->f[b].sh && sc->f[b].max_seq > sc->max_seq) sc->max_seq = sc->f[b].max_seq;
    if (!rc) rc = st_scan_pre_seq(s, sc);
    if (!rc) {
        /* strictly above every number the files hold (whatever index/ said) */
        if (sc->max_seq >= s->next_seq) s->next_seq = sc->max_seq + 1;
        rc = st_reindex_write(s, sc, carry);
    }
    for (int b = 0; b < ST_SLOTS; b++) kvx_shard_close(sc->f[b].sh);
    uint64_t quarantined = sc->quarantined, skipped = sc->skipped;
    int qerr = sc->err;
    char qmsg[512];
    snprintf(qmsg, sizeof qmsg, "%s", sc->errmsg);
    free(sc);
    for (uint32_t b = 0; b < ST_SLOTS; b++) kvx_st_cache_drop(s, b);
    if (!rc) rc = kvx_st_registry_load(s);
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

int kvx_st_reindex_locked(kvx_store *s) { return st_reindex_plan(s, NULL, 0, NULL, NULL); }

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
            if (!pinned[b] || x->pinned[b]) continue; /* a pin set since (a shard a flush published) stays */
            x->pinned[b] = 1;
            x->pin_gen[b] = pin_gen[b];
        }
    }
    pthread_mutex_unlock(&s->wmu);
    return rc;
}

/* staging/ after a crash:
 *  - a commit's mark ".<seq 16 hex>.pending" (store_writers.c): that
 *    flush or delete never answered. Its sequence number is noted: every
 *    file whose entries all carry it is set aside by the reindex
 *    (st_scan_file), so a commit lands whole or not at all;
 *  - a drop's mark (".<gen>.kvx.tmp.drop", store_maint.c), left by an
 *    eviction, compaction or gc cut before or after its commit. A sound
 *    catalog that no longer names the file says the drop committed: the
 *    file goes to quarantine/. Without one (index/ lost) it is left for
 *    the reindex: the file holds nothing a newer record does not
 *    supersede, so adopting it again serves nothing wrong.
 *  - anything else is a writer's temporary file, never acknowledged (or
 *    the old name of a file a power cut left in both directories):
 *    st_rm_staging removes the name.
 * A move that fails keeps both names (kept: the staging/ name stays, the
 * file is not adopted) for the next writer's recovery. */
static int st_pending_mark(kvx_store *s, int fd, const char *name, void *vctx)
{
    (void)s;
    (void)fd;
    st_unacked *u = vctx;
    size_t len = strlen(name);
    if (len != 25 || name[0] != '.' || strcmp(name + 17, ".pending") != 0) return 0;
    char hex[17];
    memcpy(hex, name + 1, 16);
    hex[16] = '\0';
    char *end;
    unsigned long long seq = strtoull(hex, &end, 16);
    if (*end || !seq) return 0;
    if (u->n == ST_SLOTS) return kvx_fail(-EIO, "store %s: more than %d commit marks in staging/", s->dir, ST_SLOTS);
    u->seq[u->n++] = seq;
    return 0;
}

static int st_twin(kvx_store *s, int fd, const char *name, void *vctx)
{
    st_unacked *u = vctx;
    st_twins *t = u->tw;
    uint64_t gen;
    size_t len = strlen(name);
    if (name[0] != '.' || len < 5 || strcmp(name + len - 5, ".drop") != 0 || !kvx_st_name_prefix_gen(name + 1, &gen))
        return 0;
    if (!s->index_live) return 0; /* see above */
    for (int b = 0; b < ST_SLOTS; b++)
        if (s->reg->live[b] && s->reg->rec[b].gen == gen) return 0; /* the drop did not commit */
    struct stat a, b;
    char sname[32];
    kvx_st_shard_name(sname, gen);
    if (kvx_os.fstatat(fd, name, &a, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(a.st_mode)) return 0;
    if (kvx_os.fstatat(s->shardsfd, sname, &b, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(b.st_mode)) return 0;
    if (a.st_ino != b.st_ino || a.st_dev != b.st_dev) return 0; /* another file: judged as any other */
    const char *why = "dropped by a committed eviction, compaction or gc whose unlink a crash cut (its drop mark "
                      "staging/.<name>.tmp.drop was beside it): not served again";
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

/* A store of STORE version 1 or 2 (the previous release) at a writer's
 * open: migrated when its catalog is sound (it loaded, names next_gen and
 * names exactly the files of shards/ once a cut migration's copies are set
 * aside), else KVX_EVERSION naming the version and the fix. */
static int st_migrate_or_refuse(kvx_store *s, size_t nmarks)
{
    int current = 0;
    if (s->index_live && nmarks == 0) {
        int rc = kvx_st_migrate_leftovers(s);
        if (rc) return rc;
        current = st_catalog_current(s, 0, NULL);
        if (current < 0) return current;
    }
    if (!current)
        return kvx_fail(KVX_EVERSION,
                        "store %s: STORE version %u (kvx 0.x, before sequence numbers) and its index/ is missing, "
                        "damaged or does not name the files in shards/: only its catalog knows its deletes, so it "
                        "cannot be migrated: open it once as the writer with its index/ intact, or recreate it: it is "
                        "a cache",
                        s->dir, s->version);
    return kvx_st_migrate(s);
}

int kvx_st_recover(kvx_store *s)
{
    int rc = kvx_st_registry_load(s);
    if (!rc) rc = kvx_st_registry_refuse_predigest(s);
    if (rc) return rc;
    st_twins *tw = calloc(1, sizeof *tw);
    st_unacked *u = calloc(1, sizeof *u);
    if (!tw || !u) {
        free(tw);
        free(u);
        return kvx_fail(-ENOMEM, "store: out of memory");
    }
    u->tw = tw;
    /* a flush cut before its acknowledgement, a drop cut after its
     * commit: the shards/ names go to quarantine/ first (durably), then
     * the staging/ names below */
    rc = kvx_st_each_file(s, s->stagingfd, st_pending_mark, u);
    if (!rc) rc = kvx_st_each_file(s, s->stagingfd, st_twin, u);
    if (!rc) rc = kvx_st_each_file(s, s->stagingfd, st_rm_staging, u);
    /* a store of the previous release: migrated from its sound catalog,
     * the only record of its keyed deletes (store_migrate.c), or refused */
    if (!rc && s->version < ST_STORE_VERSION) rc = st_migrate_or_refuse(s, u->n);
    int current = 0;
    if (!rc && s->index_live && u->n == 0) {
        current = st_catalog_current(s, 0, NULL);
        if (current < 0) rc = current;
    }
    /* anything changed behind the catalog's back: a fresh one from the
     * files (the same plan whatever index/ holds) */
    if (!rc && !current) {
        kvx_cat_stats old, *carry = NULL;
        kvx_cat_snap *snap;
        if (s->index_live && kvx_cat_snap_begin(s->cat, &snap) == 0) {
            if (kvx_cat_stats_get(snap, &old) == 0) carry = &old;
            kvx_cat_snap_end(snap);
        }
        kvx_clear_error();
        rc = st_reindex_plan(s, u->seq, u->n, tw, carry);
    }
    free(tw);
    free(u);
    if (rc) return rc;
    char note[1024]; /* what a reindex set aside, for the caller to show */
    snprintf(note, sizeof note, "%s", current ? "" : kvx_last_error());
    /* shards found bad at first use are quarantined at the next flush or
     * gc (kvx_st_drop_bad_shards); a crash between a flush's publication and
     * its eviction leaves the store one shard over: evict now, so repeated
     * crashes cannot add up */
    if (kvx_st_enforce_capacity(s) != 0) kvx_clear_error();
    if (note[0]) kvx_fail(KVX_ECORRUPT, "%s", note);
    else kvx_clear_error();
    return 0;
}

int kvx_st_reader_check(kvx_store *s)
{
    /* a keyed store's reader serves what the catalog names only when no
     * file in shards/ is unknown to it: an index/ from elsewhere (an old
     * copy put back) would name a page that a tombstone, or a newer copy,
     * in a file it does not know has replaced. A writer publishing right
     * now is a passing mismatch: asked again. (A block store has neither:
     * every copy of a block is the block, checked by its digest.) */
    if (!s->keyed) return 0;
    st_unacked *u = calloc(1, sizeof *u);
    if (!u) return kvx_fail(-ENOMEM, "store: out of memory");
    int rc = 0;
    for (int attempt = 0; attempt < 200; attempt++) {
        if (attempt) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
            if ((rc = kvx_st_registry_load(s))) break;
        }
        u->n = 0;
        if ((rc = kvx_st_each_file(s, s->stagingfd, st_pending_mark, u))) break;
        rc = st_catalog_current(s, 1, u);
        if (rc < 0) break;
        if (rc == 1) {
            rc = 0;
            free(u);
            return 0;
        }
        rc = 0;
    }
    free(u);
    if (rc) return rc;
    return kvx_fail(KVX_ESTALE,
                    "store %s: index/ does not name the files in shards/ (an index/ from elsewhere or an older copy, "
                    "files added, removed or swapped, or a writer cut before it updated the index): a reader never "
                    "repairs; open the store once as the writer (its recovery rebuilds the index from the files) or "
                    "run 'kvx store reindex %s'",
                    s->dir, s->dir);
}
