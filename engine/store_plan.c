/*
 * store_plan.c - recovery's plan: what to do with every file of a store,
 * computed from the files, changing nothing (store_plan.h; docs/STORE.md
 * "Recovery at open", rules 1 to 10).
 *
 * Rule: the files are the truth and the catalog only names where bytes
 * live. Every entry of a shard carries the sequence number of the commit
 * that wrote it; a keyed delete is a tombstone entry with its own. For
 * each key the entry with the highest number decides; a damaged winner is
 * a miss, never a reason to serve an older copy. Nothing is decided by a
 * file's name, generation digits, size or mtime. The plan deletes only
 * what was never acknowledged (the files and marks of a commit whose mark
 * is still in staging/, writers' temporary files), the sound victims of a
 * drop the catalog committed, and what quarantine/'s retention lets go.
 */
#include "store_plan.h"
#include "common/os.h"
#include "format/format.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int st_unacked(const kvx_st_plan *p, uint64_t seq)
{
    for (size_t i = 0; i < p->nunacked; i++)
        if (p->unacked[i] == seq) return 1;
    return 0;
}

/* Is shards/<gen> already decided by a step (a committed drop's victim)? */
static const st_step *st_decided(const kvx_st_plan *p, uint64_t gen)
{
    for (size_t i = 0; p && i < p->n; i++)
        if (p->steps[i].where == ST_IN_SHARDS && p->steps[i].kind == ST_K_SHARD && p->steps[i].gen == gen)
            return &p->steps[i];
    return NULL;
}

/* ------------------------------------------------------------ staging/ */

/* ".<seq 16 hex>.pending" -> seq */
static int st_commit_mark_name(const char *name, uint64_t *seq)
{
    size_t len = strlen(name);
    if (len != 25 || name[0] != '.' || strcmp(name + 17, ".pending") != 0) return 0;
    char hex[17];
    memcpy(hex, name + 1, 16);
    hex[16] = '\0';
    char *end;
    unsigned long long v = strtoull(hex, &end, 16);
    if (*end || !v) return 0;
    *seq = v;
    return 1;
}

typedef struct st_marks {
    uint64_t *v;
    size_t n, cap;
} st_marks;

static int st_marks_add(st_marks *m, uint64_t seq)
{
    if (m->n == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 16;
        uint64_t *v = realloc(m->v, cap * sizeof *v);
        if (!v) return kvx_fail(-ENOMEM, "store: out of memory");
        m->v = v;
        m->cap = cap;
    }
    m->v[m->n++] = seq;
    return 0;
}

/* A commit mark is a regular file kvx made (O_CREAT|O_EXCL): a directory,
 * FIFO or link under its name is none (the writer's plan leaves it alone). */
static int st_is_mark(int fd, const char *name, uint64_t *seq)
{
    struct stat st;
    return st_commit_mark_name(name, seq) && kvx_os.fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
           S_ISREG(st.st_mode);
}

static int st_collect_mark(kvx_store *s, int fd, const char *name, void *ctx)
{
    uint64_t seq;
    if (!st_is_mark(fd, name, &seq) || kvx_st_mark_spent(s, seq)) return 0;
    return st_marks_add(ctx, seq);
}

int kvx_st_commit_marks(kvx_store *s, uint64_t **seq, size_t *n)
{
    st_marks m = {0};
    int rc = kvx_st_each_file(s, s->stagingfd, st_collect_mark, &m);
    if (rc) {
        free(m.v);
        m.v = NULL;
        m.n = 0;
    }
    *seq = m.v;
    *n = m.n;
    return rc;
}

/* Is shards/<name> sound: valid, and every page passes its CRC? 1 sound,
 * 0 damaged (why), <0 cannot tell now. */
static int st_file_sound(kvx_store *s, const char *name, char *why, size_t cap)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", s->shards_path, name);
    kvx_shard *sh = NULL;
    int rc = kvx_shard_open_at(&sh, s->shardsfd, name, path, 0);
    if (rc && st_open_transient(rc)) return rc;
    if (rc) {
        snprintf(why, cap, "cannot be validated: %s (%s)", kvx_last_error(), kvx_err_name(rc));
        return 0;
    }
    uint32_t bad = 0;
    uint64_t gen = 0;
    kvx_st_parse_name(name, &gen);
    int v = kvx_st_verify_pages(s, NULL, sh, gen, &bad, NULL, NULL, NULL); /* a freed page is no damage */
    kvx_shard_close(sh);
    if (v && st_open_transient(v) && !bad) return v;
    if (v || bad) {
        snprintf(why, cap, "%u damaged or missing page(s)", bad);
        return 0;
    }
    return 1;
}

/* A drop's mark: its victim's fate. The mark is a hard link to the victim
 * made before the drop's commit. A sound catalog that no longer names the
 * victim says the drop committed: the victim is finished as the drop
 * would have (deleted when sound, quarantined when damaged or when the
 * drop was of a damaged shard, ".dropq"). Without a sound catalog, or
 * with one that still names it, the mark is spent and the file is judged
 * like any other. */
static int st_plan_drop_mark(kvx_store *s, kvx_st_plan *p, int fd, const char *name, uint64_t gen, int damaged)
{
    st_step *m = st_add(p, ST_IN_STAGING, ST_ACT_DELETE, ST_K_DROP_MARK, name);
    if (!m) return -ENOMEM;
    m->gen = gen;
    snprintf(m->why, sizeof m->why, "the mark of a drop (eviction, compaction or gc), spent");
    if (!s->index_live || (p->mode & ST_PLAN_REBUILD)) return 0; /* rule 7: the reindex judges the file */
    for (int b = 0; b < ST_SLOTS; b++)
        if (s->reg->live[b] && s->reg->rec[b].gen == gen) return 0; /* the drop did not commit */
    struct stat a, b;
    char sname[32];
    kvx_st_shard_name(sname, gen);
    if (kvx_os.fstatat(fd, name, &a, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(a.st_mode)) return 0;
    if (kvx_os.fstatat(s->shardsfd, sname, &b, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(b.st_mode)) return 0;
    if (a.st_ino != b.st_ino || a.st_dev != b.st_dev) return 0; /* another file: judged as any other */
    char why[300] = "";
    int sound = damaged ? 0 : st_file_sound(s, sname, why, sizeof why);
    if (sound < 0) return sound;
    st_step *v = st_add(p, ST_IN_SHARDS, sound ? ST_ACT_DELETE : ST_ACT_QUARANTINE, ST_K_SHARD, sname);
    if (!v) return -ENOMEM;
    v->gen = gen;
    v->bytes = (uint64_t)b.st_size;
    if (sound)
        snprintf(v->why, sizeof v->why, "the sound victim of a committed eviction or compaction (its drop mark "
                                        "staging/%s was beside it): the drop deletes it",
                 name);
    else
        snprintf(v->why, sizeof v->why, "the victim of a committed drop (its mark staging/%s was beside it)%s%s", name,
                 why[0] ? ": " : ", dropped as damaged", why);
    return 0;
}

static int st_plan_staging_file(kvx_store *s, int fd, const char *name, void *ctx)
{
    kvx_st_plan *p = ctx;
    uint64_t seq, gen;
    struct stat st;
    if (kvx_os.fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return 0; /* gone meanwhile */
    if (!S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode)) {
        st_step *x = st_add(p, ST_IN_STAGING, ST_ACT_LEAVE, ST_K_OTHER, name);
        if (!x) return -ENOMEM;
        snprintf(x->why, sizeof x->why, "not a regular file: left alone");
        return 0;
    }
    if (st_is_mark(fd, name, &seq)) {
        st_step *x = st_add(p, ST_IN_STAGING, ST_ACT_DELETE, ST_K_COMMIT_MARK, name);
        if (!x) return -ENOMEM;
        x->seq = seq;
        if (kvx_st_mark_spent(s, seq)) { /* a stale mark: its commit landed (a torn backup, a mark put back) */
            x->kind = ST_K_TEMP;
            snprintf(x->why, sizeof x->why,
                     "the mark of commit %" PRIu64 ", which the sound catalog says landed (its next sequence number "
                     "is %" PRIu64 "): spent, its files stay",
                     seq, s->next_seq);
            return 0;
        }
        snprintf(x->why, sizeof x->why,
                 "the mark of commit %" PRIu64 ", which never answered: removed once its files are gone", seq);
        st_marks m = {p->unacked, p->nunacked, p->capunacked};
        int rc = st_marks_add(&m, seq);
        p->unacked = m.v;
        p->nunacked = m.n;
        p->capunacked = m.cap;
        return rc;
    }
    size_t len = strlen(name);
    if (name[0] == '.' && kvx_st_name_prefix_gen(name + 1, &gen)) {
        if (len > 5 && strcmp(name + len - 5, ".drop") == 0) return st_plan_drop_mark(s, p, fd, name, gen, 0);
        if (len > 6 && strcmp(name + len - 6, ".dropq") == 0) return st_plan_drop_mark(s, p, fd, name, gen, 1);
    }
    st_step *x = st_add(p, ST_IN_STAGING, ST_ACT_DELETE, ST_K_TEMP, name);
    if (!x) return -ENOMEM;
    x->bytes = (uint64_t)st.st_size;
    snprintf(x->why, sizeof x->why, "a writer's temporary file: never acknowledged");
    return 0;
}

/* ------------------------------------------------- the catalog as it is */

/* The largest sequence number of sh's entries (0 without a sequence
 * table): a file whose largest number is that of a commit that never
 * answered is a file of that commit (a commit writes its own number, and
 * the older number of a copy whose bytes equal one another batch
 * committed, never a newer one), and nothing of it was acknowledged. */
static uint64_t st_max_seq(const kvx_shard *sh)
{
    uint32_t n = kvx_shard_get_info(sh)->num_blocks;
    uint64_t max = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t seq = 0;
        int tomb = 0;
        kvx_shard_entry_commit(sh, i, &seq, &tomb);
        if (seq > max) max = seq;
    }
    return max;
}

/* Can unregistered file name hold no record a reader must know: it is not
 * a valid shard of this store, or every entry carries the number of a
 * commit that never answered? (Opened only when unregistered: rare.) */
static int st_holds_nothing(kvx_store *s, const char *name, const uint64_t *un, size_t nun)
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
    uint64_t max = st_max_seq(sh);
    kvx_shard_close(sh);
    int hit = 0; /* a file of a commit that never answered (st_max_seq) */
    for (size_t k = 0; k < nun && max; k++) hit |= un[k] == max;
    return hit;
}

typedef struct st_unreg {
    int extra, reader;
    const uint64_t *un;
    size_t nun;
    const kvx_st_plan *skip;
} st_unreg;

static int st_unregistered(kvx_store *s, int fd, const char *name, void *ctx)
{
    st_unreg *c = ctx;
    uint64_t gen;
    struct stat st;
    if (!kvx_st_parse_name(name, &gen)) return 0; /* not ours: left alone */
    for (int b = 0; b < ST_SLOTS; b++)
        if (s->reg->live[b] && s->reg->rec[b].gen == gen) return 0;
    if (st_decided(c->skip, gen)) return 0; /* a committed drop's victim: the plan finishes the drop */
    if (kvx_os.fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) return 0;
    if (c->reader && st_holds_nothing(s, name, c->un, c->nun)) return 0;
    c->extra++;
    return 0;
}

int kvx_st_catalog_current(kvx_store *s, int reader, const uint64_t *unacked, size_t nunacked,
                           const kvx_st_plan *skip)
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
            (uint64_t)st.st_ino != s->reg->rec[b].ino && !st_holds_nothing(s, name, unacked, nunacked))
            return 0;
    }
    for (int b = 0; b < ST_SLOTS && !reader; b++) {
        if (!s->reg->live[b]) continue;
        char name[32], why[512], path[4096];
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
        snprintf(path, sizeof path, "%s/%s", s->shards_path, name);
        kvx_shard *sh = NULL;
        int rc = kvx_shard_open_at(&sh, s->shardsfd, name, path, 0);
        if (rc && st_open_transient(rc)) {
            kvx_clear_error();
            continue;
        }
        int ok = rc == 0 && kvx_st_shard_ours(s, sh, why, sizeof why) == 0 &&
                 kvx_shard_get_info(sh)->shard_id == (uint32_t)b;
        kvx_shard_close(sh);
        if (!ok) return 0;
    }
    st_unreg c = {0, reader, unacked, nunacked, skip};
    int rc = kvx_st_each_file(s, s->shardsfd, st_unregistered, &c);
    if (rc) return rc;
    return c.extra == 0;
}

/* ------------------------------------------------------------ shards/ */

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

static int st_set_aside(kvx_st_plan *p, const char *name, uint64_t gen, uint64_t bytes, const char *why)
{
    st_step *x = st_add(p, ST_IN_SHARDS, ST_ACT_QUARANTINE, ST_K_SHARD, name);
    if (!x) return -ENOMEM;
    x->gen = gen;
    x->bytes = bytes;
    snprintf(x->why, sizeof x->why, "%s", why);
    return 0;
}

/* A keyed shard file whose meta checksum failed: its entries read as
 * they are (kvx_shard_salvage_keys), appended to p->suspects. Its tables are
 * unproven: they only ever make a key a miss (store_plan.c st_plan_hide),
 * never serve a page. 0, or <0 when it cannot even be read so. */
static int st_read_suspect(kvx_store *s, kvx_st_plan *p, const char *name)
{
    kvx_salvaged_key *v = NULL;
    size_t n = 0;
    int rc = kvx_shard_salvage_keys(s->shardsfd, name, &v, &n);
    if (rc) {
        kvx_clear_error();
        return rc;
    }
    for (size_t i = 0; !rc && i < n; i++) {
        if (p->nsuspects == p->capsuspects) {
            size_t cap = p->capsuspects ? p->capsuspects * 2 : 64;
            st_suspect *w = realloc(p->suspects, cap * sizeof *w);
            if (!w) {
                rc = kvx_fail(-ENOMEM, "store: out of memory");
                break;
            }
            p->suspects = w;
            p->capsuspects = cap;
        }
        uint8_t *k = malloc(v[i].len);
        if (!k) {
            rc = kvx_fail(-ENOMEM, "store: out of memory");
            break;
        }
        memcpy(k, v[i].key, v[i].len);
        p->suspects[p->nsuspects++] = (st_suspect){kvx_key_hash(k, v[i].len), v[i].seq, k, v[i].len, v[i].tomb};
    }
    free(v);
    return rc;
}

/* One entry of shards/ when the catalog is rebuilt: kept, quarantined
 * with the reason (invalid, foreign, a second file for a shard byte whose
 * records lose), deleted (every entry of a commit that never answered),
 * or left alone (not a regular file, not a shard name). */
static int st_plan_shard_file(kvx_store *s, int fd, const char *name, void *ctx)
{
    kvx_st_plan *p = ctx;
    uint64_t gen;
    struct stat st;
    if (!kvx_st_parse_name(name, &gen)) {
        st_step *x = st_add(p, ST_IN_SHARDS, ST_ACT_LEAVE, ST_K_OTHER, name);
        if (!x) return -ENOMEM;
        uint32_t byte;
        if (kvx_st_parse_active_name(name, &gen, &byte)) /* what happens to it is not this plan's */
            snprintf(x->why, sizeof x->why,
                     "an active shard: a writer's open or a reindex seals it in place first (its whole records' "
                     "entries, under its sealed name), before a plan like this one reads it; this plan leaves it");
        else
            snprintf(x->why, sizeof x->why, "not a shard file name: left alone");
        return 0;
    }
    if (st_decided(p, gen)) return 0;
    if (kvx_os.fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        int e = errno;
        if (e == ENOENT) return 0; /* gone meanwhile */
        return kvx_fail(-e, "store %s: reindex: stat shards/%s: %s", s->dir, name, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) { /* a directory or link where a shard belongs: never followed */
        st_step *x = st_add(p, ST_IN_SHARDS, ST_ACT_LEAVE, ST_K_OTHER, name);
        if (!x) return -ENOMEM;
        snprintf(x->why, sizeof x->why, "not a regular file (%s): never followed, left alone",
                 S_ISDIR(st.st_mode) ? "a directory" : S_ISLNK(st.st_mode) ? "a symlink" : "a FIFO, socket or device");
        return 0;
    }
    char path[4096], why[480], whose[400];
    snprintf(path, sizeof path, "%s/%s", s->shards_path, name);
    kvx_shard *sh = NULL;
    int rc = kvx_shard_open_at(&sh, s->shardsfd, name, path, 0);
    if (rc && st_open_transient(rc)) /* not a verdict on the file: stop, change nothing */
        return kvx_fail(rc, "store %s: reindex: cannot open shards/%s: %s", s->dir, name, kvx_strerror(rc));
    if (rc) {
        snprintf(why, sizeof why, "cannot be validated: %s (%s)", kvx_last_error(), kvx_err_name(rc));
        kvx_clear_error();
        size_t before = p->nsuspects;
        if (rc == KVX_EMETACRC && s->keyed && st_read_suspect(s, p, name) == 0 && p->nsuspects > before) {
            int r = st_set_aside(p, name, gen, (uint64_t)st.st_size, why);
            if (r) return r;
            st_step *x = &p->steps[p->n - 1];
            x->deferred = 1;
            size_t len = strlen(x->why);
            snprintf(x->why + len, sizeof x->why - len,
                     "; its tables read as they are name %zu key(s): each it may hold a newer record of is deleted "
                     "(a durable tombstone) before it goes, so no older copy comes back",
                     p->nsuspects - before);
            return 0;
        }
        return st_set_aside(p, name, gen, (uint64_t)st.st_size, why);
    }
    if (kvx_st_shard_ours(s, sh, whose, sizeof whose) != 0) {
        kvx_shard_close(sh);
        return st_set_aside(p, name, gen, (uint64_t)st.st_size, whose);
    }
    uint64_t useq = st_max_seq(sh);
    st_found cand = {gen, sh, (uint64_t)st.st_size, useq, (uint64_t)st.st_ino, ""};
    snprintf(cand.name, sizeof cand.name, "%s", name);
    if (useq && st_unacked(p, useq)) {
        kvx_shard_close(sh);
        st_step *x = st_add(p, ST_IN_SHARDS, ST_ACT_DELETE, ST_K_SHARD, name);
        if (!x) return -ENOMEM;
        x->gen = gen;
        x->seq = useq;
        x->bytes = (uint64_t)st.st_size;
        snprintf(x->why, sizeof x->why,
                 "a file of commit %" PRIu64 ", which never answered (its mark staging/.%016" PRIx64
                 ".pending is there): never acknowledged",
                 useq, useq);
        return 0;
    }
    st_found *f = &p->f[kvx_shard_get_info(sh)->shard_id];
    if (!f->sh) {
        *f = cand;
        return 0;
    }
    st_found keep = st_file_wins(&cand, f) ? cand : *f, lose = st_file_wins(&cand, f) ? *f : cand;
    snprintf(why, sizeof why,
             "shard byte %u is also claimed by shards/%s, whose entries are newer (or the same: a copy)",
             kvx_shard_get_info(sh)->shard_id, keep.name);
    kvx_shard_close(lose.sh);
    *f = keep;
    return st_set_aside(p, lose.name, lose.gen, lose.bytes, why);
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

static int st_same_key(const kvx_st_plan *p, const st_kpage *a, const st_kpage *b)
{
    kvx_entry x, y;
    if (kvx_shard_entry(&x, p->f[a->b].sh, a->idx) || kvx_shard_entry(&y, p->f[b->b].sh, b->idx)) return 0;
    return x.key && y.key && x.key_len == y.key_len && memcmp(x.key, y.key, x.key_len) == 0;
}

static int st_page_sound(const kvx_st_plan *p, const st_kpage *a)
{
    const void *page;
    return kvx_shard_page(&page, p->f[a->b].sh, a->idx, 1) == 0;
}

/* Does sound entry a name key (bytes, len)? */
static int st_entry_is_key(const kvx_st_plan *p, const st_kpage *a, const uint8_t *key, size_t len)
{
    kvx_entry x;
    if (kvx_shard_entry(&x, p->f[a->b].sh, a->idx)) return 0;
    return x.key && x.key_len == len && memcmp(x.key, key, len) == 0;
}

/* Each key a damaged file (p->suspects) names with a number above every
 * sound entry of that key: the damaged file may hold its newest record (a
 * delete, or a newer page), so no sound copy is indexed (a miss, never an
 * older copy) and the apply deletes it durably (p->tomb_keys) before the
 * file goes to quarantine/. A key with no sound entry needs nothing. all
 * is sorted by st_cmp_kpage. */
static int st_plan_hide(kvx_st_plan *p, const st_kpage *all, size_t k)
{
    if (!p->nsuspects) return 0;
    p->tomb_keys = calloc(p->nsuspects, sizeof *p->tomb_keys);
    if (!p->tomb_keys) return kvx_fail(-ENOMEM, "store: out of memory");
    for (size_t i = 0; i < p->nsuspects; i++) {
        const st_suspect *x = &p->suspects[i];
        /* the first entry of its name: newest first within a name */
        size_t lo = 0, hi = k;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (all[mid].hash < x->hash) lo = mid + 1;
            else hi = mid;
        }
        uint64_t newest = 0;
        for (size_t j = lo; j < k && all[j].hash == x->hash && !newest; j++)
            if (st_entry_is_key(p, &all[j], x->key, x->len)) newest = all[j].seq;
        if (!newest || x->seq <= newest) continue;
        int dup = 0;
        for (size_t t = 0; t < p->ntomb_keys && !dup; t++)
            dup = p->tomb_keys[t].len == x->len && memcmp(p->tomb_keys[t].bytes, x->key, x->len) == 0;
        if (dup) continue;
        p->tomb_keys[p->ntomb_keys++] = (kvx_key){x->key, x->len};
        size_t w = 0; /* its sound copy is not indexed */
        for (size_t r = 0; r < p->npicks; r++) {
            st_kpage a = {p->picks[r].hash, 0, p->picks[r].b, p->picks[r].idx, 0};
            if (p->picks[r].hash == x->hash && st_entry_is_key(p, &a, x->key, x->len)) continue;
            p->picks[w++] = p->picks[r];
        }
        p->npicks = w;
    }
    return 0;
}

/* A keyed store's live set: for each key, its entry with the highest
 * sequence number decides. A page is indexed (of several copies from one
 * commit, which hold the same bytes, a sound one); a tombstone hides the
 * key. An older copy is never indexed, even when the newest is damaged:
 * that is a miss (verify reports it), not the replaced page served. */
static int st_plan_keyed(kvx_st_plan *p)
{
    size_t n = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++)
        if (p->f[b].sh) n += kvx_shard_get_info(p->f[b].sh)->num_blocks;
    st_kpage *all = malloc((n ? n : 1) * sizeof *all);
    p->picks = malloc((n ? n : 1) * sizeof *p->picks);
    if (!all || !p->picks) {
        free(all);
        return kvx_fail(-ENOMEM, "store: out of memory");
    }
    size_t k = 0;
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!p->f[b].sh) continue;
        uint32_t cnt = kvx_shard_get_info(p->f[b].sh)->num_blocks;
        for (uint32_t i = 0; i < cnt; i++) {
            kvx_entry en;
            uint64_t seq = 0;
            int tomb = 0;
            if (kvx_shard_entry(&en, p->f[b].sh, i) || !en.hash || kvx_shard_entry_commit(p->f[b].sh, i, &seq, &tomb))
                continue;
            all[k++] = (st_kpage){en.hash, seq, b, i, (uint8_t)tomb};
        }
    }
    qsort(all, k, sizeof *all, st_cmp_kpage);
    for (size_t i = 0; i < k; i++) {
        /* decided already by a newer record of the same key? */
        int decided = 0;
        for (size_t j = i; j-- > 0 && all[j].hash == all[i].hash && !decided;) decided = st_same_key(p, &all[j], &all[i]);
        if (decided || all[i].tomb) continue;
        /* the newest is a page. Several copies of one commit (a file
         * copied, a compaction cut before it unlinked its victims) held
         * the same bytes when written: a sound one is indexed */
        size_t pick = i, j = i + 1;
        if (j < k && all[j].hash == all[i].hash && all[j].seq == all[i].seq && !st_page_sound(p, &all[i]))
            for (; j < k && all[j].hash == all[i].hash && all[j].seq == all[i].seq; j++)
                if (!all[j].tomb && st_same_key(p, &all[j], &all[i]) && st_page_sound(p, &all[j])) {
                    pick = j;
                    break;
                }
        p->picks[p->npicks++] = (st_pick){all[pick].hash, all[pick].b, all[pick].idx};
    }
    int rc = st_plan_hide(p, all, k);
    free(all);
    return rc;
}

/* A keyed store written before sequence numbers keeps its deletes only in
 * its catalog: its files cannot say which copy of a key is live. A shard
 * written before prefix digests is refused in any store. */
static int st_plan_refuse_old(kvx_store *s, const kvx_st_plan *p)
{
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!p->f[b].sh) continue;
        int rc = kvx_st_refuse_predigest(s, p->f[b].name, kvx_shard_get_info(p->f[b].sh)->flags);
        if (rc) return rc;
    }
    if (!s->keyed) return 0; /* blocks: no deletes, every sound copy is the block */
    for (uint32_t b = 0; b < ST_SLOTS; b++)
        if (p->f[b].sh && !(kvx_shard_get_info(p->f[b].sh)->flags & KVX_FLAG_SEQ))
            return kvx_fail(KVX_EVERSION,
                            "store %s: shards/%s was written before sequence numbers (a keyed store of kvx 0.x "
                            "STORE version 2): its deletes live only in its catalog, and reindex cannot rebuild that "
                            "from the files; open it with a sound index/ (the first writer migrates it), or recreate "
                            "it (it is a cache)",
                            s->dir, p->f[b].name);
    return 0;
}

/* The index the rebuild makes: its entries per kept file, the steps. */
static int st_plan_index(kvx_store *s, kvx_st_plan *p)
{
    uint64_t per[ST_SLOTS] = {0};
    if (s->keyed) {
        int rc = st_plan_keyed(p);
        if (rc) return rc;
        for (size_t i = 0; i < p->npicks; i++) per[p->picks[i].b]++;
    }
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        const st_found *f = &p->f[b];
        if (!f->sh) continue;
        if (!s->keyed) {
            uint32_t cnt = kvx_shard_get_info(f->sh)->num_blocks;
            for (uint32_t i = 0; i < cnt; i++) {
                kvx_entry en;
                per[b] += kvx_shard_entry(&en, f->sh, i) == 0 && en.hash;
            }
        }
        st_step *x = st_add(p, ST_IN_SHARDS, ST_ACT_KEEP, ST_K_SHARD, f->name);
        if (!x) return -ENOMEM;
        x->gen = f->gen;
        x->bytes = f->bytes;
        x->byte = (int)b;
        x->indexed = per[b];
        p->blocks += per[b];
        snprintf(x->why, sizeof x->why, "a valid shard of this store (byte %u, %u entries, newest commit %" PRIu64 ")",
                 b, kvx_shard_get_info(f->sh)->num_blocks, f->max_seq);
        if (f->max_seq >= p->next_seq) p->next_seq = f->max_seq + 1;
    }
    return 0;
}

/* The catalog stands: each registered file is kept as it is named. */
static int st_plan_keep_registered(kvx_store *s, kvx_st_plan *p)
{
    for (uint32_t b = 0; b < ST_SLOTS; b++) {
        if (!s->reg->live[b]) continue;
        char name[32];
        kvx_st_shard_name(name, s->reg->rec[b].gen);
        st_step *x = st_add(p, ST_IN_SHARDS, ST_ACT_KEEP, ST_K_SHARD, name);
        if (!x) return -ENOMEM;
        x->gen = s->reg->rec[b].gen;
        x->bytes = s->reg->rec[b].file_bytes;
        x->byte = (int)b;
        x->indexed = s->reg->rec[b].n_entries;
        p->blocks += x->indexed;
        snprintf(x->why, sizeof x->why, "named by the sound catalog, as it is (size and inode as recorded)");
    }
    return 0;
}

/* ---------------------------------------------------------------- plan */

int kvx_st_plan_make(kvx_store *s, unsigned mode, kvx_st_plan **out)
{
    *out = NULL;
    kvx_st_plan *p = calloc(1, sizeof *p);
    if (!p) return kvx_fail(-ENOMEM, "store: out of memory");
    p->mode = mode;
    p->next_seq = s->next_seq ? s->next_seq : 1;
    int rc = 0;
    if (mode & ST_PLAN_STAGING) rc = kvx_st_each_file(s, s->stagingfd, st_plan_staging_file, p);
    for (size_t i = 0; i < p->nunacked; i++)
        if (p->unacked[i] >= p->next_seq) p->next_seq = p->unacked[i] + 1;
    if (!rc && (mode & ST_PLAN_STAGING_ONLY)) {
        for (size_t i = 0; i < p->n; i++)
            if (p->steps[i].kind == ST_K_COMMIT_MARK) p->steps[i].act = ST_ACT_LEAVE; /* the evidence stays */
        p->rebuild = 0;
        *out = p;
        return 0;
    }
    /* the catalog stands when nothing changed behind its back */
    p->rebuild = 1;
    if (!rc && (mode & ST_PLAN_REBUILD))
        snprintf(p->rebuild_why, sizeof p->rebuild_why, "reindex: a fresh index from the files (index/ is not read)");
    else if (!rc && s->lag_found == 2)
        snprintf(p->rebuild_why, sizeof p->rebuild_why,
                 "index/ was set aside unread: its writer's commits were not synced when the machine went down");
    else if (!rc && !s->index_live)
        snprintf(p->rebuild_why, sizeof p->rebuild_why, "index/ is missing, empty or lost");
    else if (!rc && p->nunacked)
        snprintf(p->rebuild_why, sizeof p->rebuild_why, "%zu commit(s) never answered (marks in staging/)", p->nunacked);
    else if (!rc) {
        int cur = kvx_st_catalog_current(s, 0, NULL, 0, p);
        if (cur < 0) rc = cur;
        else if (cur) p->rebuild = 0;
        else
            snprintf(p->rebuild_why, sizeof p->rebuild_why,
                     "the catalog does not name exactly the files of shards/ (a file added, gone, cut, grown or "
                     "replaced)");
    }
    if (!rc && p->rebuild) {
        rc = kvx_st_each_file(s, s->shardsfd, st_plan_shard_file, p);
        if (!rc) rc = st_plan_refuse_old(s, p);
        if (!rc) rc = st_plan_index(s, p);
    } else if (!rc) {
        rc = st_plan_keep_registered(s, p);
    }
    if (!rc) rc = kvx_st_plan_retention(s, p);
    if (rc) {
        kvx_st_plan_free(p);
        return rc < 0 && rc == -ENOMEM ? kvx_fail(rc, "store: out of memory") : rc;
    }
    *out = p;
    return 0;
}

void kvx_st_plan_free(kvx_st_plan *p)
{
    if (!p) return;
    for (int b = 0; b < ST_SLOTS; b++) kvx_shard_close(p->f[b].sh);
    free(p->steps);
    free(p->picks);
    free(p->unacked);
    for (size_t i = 0; i < p->nsuspects; i++) free(p->suspects[i].key);
    free(p->suspects);
    free(p->tomb_keys);
    free(p);
}

void kvx_st_plan_report(const kvx_st_plan *p, kvx_recovery_report *r)
{
    memset(r, 0, sizeof *r);
    r->rebuilt = (uint64_t)p->rebuild;
    r->blocks_indexed = p->blocks;
    for (size_t i = 0; i < p->n; i++) {
        const st_step *x = &p->steps[i];
        if (x->failed) {
            r->failed++;
            continue;
        }
        if (x->act == ST_ACT_LEAVE) r->left_alone++;
        else if (x->where == ST_IN_QUARANTINE) r->expired++;
        else if (x->where == ST_IN_STAGING) r->temporaries++;
        else if (x->act == ST_ACT_KEEP) r->shards_kept++;
        else if (x->act == ST_ACT_QUARANTINE) r->quarantined++;
        else if (x->seq) r->deleted_unacked++;
        else r->deleted_dropped++;
    }
}

/* ------------------------------------------------ the public plan handle */

struct kvx_store_plan {
    kvx_st_plan *p;
};

int kvx_st_plan_wrap(kvx_store_plan **out, kvx_st_plan *p)
{
    kvx_store_plan *h = calloc(1, sizeof *h);
    if (!h) {
        kvx_st_plan_free(p);
        return kvx_fail(-ENOMEM, "store: out of memory");
    }
    /* the open files are not needed to describe the plan */
    for (int b = 0; b < ST_SLOTS; b++) {
        kvx_shard_close(p->f[b].sh);
        p->f[b].sh = NULL;
    }
    h->p = p;
    *out = h;
    return 0;
}

KVX_API size_t kvx_store_plan_steps(const kvx_store_plan *h) { return h ? h->p->n : 0; }

KVX_API int kvx_store_plan_step(const kvx_store_plan *h, size_t i, kvx_plan_step *out)
{
    if (!h || !out) return kvx_fail(KVX_EINVALID, "kvx_store_plan_step: NULL argument");
    if (i >= h->p->n)
        return kvx_fail(KVX_EINVALID, "kvx_store_plan_step: step %zu of a plan of %zu", i, h->p->n);
    static const char *const where[] = {"shards", "staging", "quarantine"};
    static const char *const act[] = {"keep", "quarantine", "delete", "leave"};
    const st_step *x = &h->p->steps[i];
    out->dir = where[x->where];
    out->name = x->name;
    out->action = act[x->act];
    out->reason = x->why;
    out->bytes = x->bytes;
    out->shard_byte = x->byte;
    out->indexed = x->indexed;
    return 0;
}

KVX_API void kvx_store_plan_summary(const kvx_store_plan *h, kvx_recovery_report *out)
{
    if (!out) return;
    if (!h) {
        memset(out, 0, sizeof *out);
        return;
    }
    kvx_st_plan_report(h->p, out);
}

KVX_API uint64_t kvx_store_plan_next_seq(const kvx_store_plan *h) { return h ? h->p->next_seq : 0; }

KVX_API void kvx_store_plan_free(kvx_store_plan *h)
{
    if (!h) return;
    kvx_st_plan_free(h->p);
    free(h);
}
