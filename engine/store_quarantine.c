/*
 * store_quarantine.c - quarantine/'s retention (docs/STORE.md
 * "Quarantine"): at most a quarter of the capacity and ST_QUARANTINE_FILES
 * files of kvx's names, the oldest removed first; as plan steps for
 * recovery (store_plan.c), or now (gc, a drop).
 */
#include "store_plan.h"
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct st_qfile {
    char name[256];
    uint64_t bytes;
    int64_t when; /* quarantined at: its .why note's mtime (INT64_MIN without one) */
} st_qfile;

typedef struct st_qlist {
    st_qfile *v;
    size_t n, cap;
    int ages; /* also read each file's note for its age (retention) */
} st_qlist;

static int st_list_q(kvx_store *s, int fd, const char *name, void *ctx)
{
    (void)s;
    st_qlist *l = ctx;
    struct stat st, w;
    if (!kvx_st_quarantine_name(name)) return 0; /* a note, or a file kvx never put there: not kvx's */
    if (kvx_os.fstatat(fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) return 0;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        st_qfile *v = realloc(l->v, cap * sizeof *v);
        if (!v) return kvx_fail(-ENOMEM, "store: out of memory");
        l->v = v;
        l->cap = cap;
    }
    st_qfile *q = &l->v[l->n++];
    snprintf(q->name, sizeof q->name, "%s", name);
    uint64_t alloc = (uint64_t)st.st_blocks * 512;
    q->bytes = alloc < (uint64_t)st.st_size ? alloc : (uint64_t)st.st_size;
    if (!l->ages) return 0;
    char wn[300];
    snprintf(wn, sizeof wn, "%s.why", name);
    /* without its note: a removal cut between the two unlinks (the note
     * goes first), or a note that could not be written: the oldest */
    q->when = kvx_os.fstatat(fd, wn, &w, AT_SYMLINK_NOFOLLOW) == 0 ? (int64_t)w.st_mtime : INT64_MIN;
    return 0;
}

/* kvx's regular files in quarantine/ (none when it is missing). */
static int st_qlist_read(kvx_store *s, st_qlist *l)
{
    int qfd = kvx_os.openat(s->dirfd, "quarantine", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (qfd < 0) return 0;
    int rc = kvx_st_each_file(s, qfd, st_list_q, l);
    kvx_os.close(qfd);
    return rc;
}

uint64_t kvx_st_quarantine_count(kvx_store *s, uint64_t *bytes)
{
    st_qlist l = {0};
    if (st_qlist_read(s, &l) != 0) kvx_clear_error(); /* a count, not a verdict */
    uint64_t b = 0;
    for (size_t i = 0; i < l.n; i++) b += l.v[i].bytes;
    free(l.v);
    if (bytes) *bytes = b;
    return l.n;
}

static int st_cmp_qfile(const void *a, const void *b)
{
    const st_qfile *x = a, *y = b;
    if (x->when != y->when) return x->when < y->when ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* quarantine/'s retention rule (docs/STORE.md "Quarantine"): it keeps at
 * most a quarter of the capacity in bytes and ST_QUARANTINE_FILES files,
 * the files it receives now included; past either, the oldest go first
 * (never one this plan moves there). */
int kvx_st_plan_retention(kvx_store *s, kvx_st_plan *p)
{
    uint64_t in_bytes = 0, in_files = 0;
    for (size_t i = 0; i < p->n; i++)
        if (p->steps[i].where == ST_IN_SHARDS && p->steps[i].act == ST_ACT_QUARANTINE) {
            in_bytes += p->steps[i].bytes;
            in_files++;
        }
    st_qlist l = {.ages = 1};
    int rc = st_qlist_read(s, &l);
    uint64_t bytes = in_bytes, files = in_files;
    for (size_t i = 0; i < l.n; i++) bytes += l.v[i].bytes;
    files += l.n;
    if (!rc && l.n) qsort(l.v, l.n, sizeof *l.v, st_cmp_qfile);
    uint64_t max_bytes = kvx_st_quarantine_max_bytes(s);
    for (size_t i = 0; !rc && i < l.n && (bytes > max_bytes || files > ST_QUARANTINE_FILES); i++) {
        st_step *x = st_add(p, ST_IN_QUARANTINE, ST_ACT_DELETE, ST_K_SHARD, l.v[i].name);
        if (!x) {
            rc = -ENOMEM;
            break;
        }
        x->bytes = l.v[i].bytes;
        snprintf(x->why, sizeof x->why,
                 "retention: quarantine/ would hold %" PRIu64 " bytes in %" PRIu64 " files, over its limit of %" PRIu64
                 " bytes (a quarter of the capacity) or %d files: the oldest goes first",
                 bytes, files, max_bytes, ST_QUARANTINE_FILES);
        bytes -= l.v[i].bytes;
        files--;
    }
    free(l.v);
    p->qbytes = bytes;
    p->qfiles = files;
    return rc;
}

int kvx_st_quarantine_expire(kvx_store *s, const char *name)
{
    int qfd = kvx_os.openat(s->dirfd, "quarantine", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC, 0);
    if (qfd < 0) return -errno;
    /* the note first: a crash between the two leaves the file, which the
     * next pass takes first (st_list_q), never a note alone */
    char wn[300];
    snprintf(wn, sizeof wn, "%s.why", name);
    kvx_os.unlinkat(qfd, wn, 0);
    int rc = kvx_os.unlinkat(qfd, name, 0) == 0 || errno == ENOENT ? 0 : -errno;
    kvx_os.close(qfd);
    return rc;
}

int kvx_st_quarantine_retain(kvx_store *s)
{
    kvx_st_plan *p = calloc(1, sizeof *p);
    if (!p) return kvx_fail(-ENOMEM, "store: out of memory");
    int rc = kvx_st_plan_retention(s, p);
    for (size_t i = 0; !rc && i < p->n; i++) {
        int e = kvx_st_quarantine_expire(s, p->steps[i].name);
        if (e) rc = kvx_fail(e, "store %s: remove quarantine/%s: %s", s->dir, p->steps[i].name, strerror(-e));
    }
    free(p->steps); /* a plan of retention steps alone */
    free(p);
    return rc;
}

