/*
 * store_plan.h - recovery as a plan, then an apply (docs/STORE.md
 * "Recovery at open"; DESIGN.md "The files are the whole truth").
 *
 * kvx_st_plan_make (store_plan.c) reads the store's files: shards/,
 * staging/ (commit marks, drop marks, temporary files), quarantine/ and
 * the catalog when it is loaded and sound, and returns what recovery will
 * do with every file: keep, quarantine (with the reason), delete (only
 * what was never acknowledged, a committed drop's sound victim, or what
 * quarantine/'s retention rule lets go), or leave alone; and, when the
 * catalog cannot be used as it is, the exact index to build. It changes
 * nothing and takes no lock. kvx_st_plan_apply (store_apply.c) carries a
 * plan out under the writer lock, in an order that makes it idempotent:
 * a crash anywhere, then another recovery, gives the same store.
 */
#ifndef KVX_ENGINE_STORE_PLAN_H
#define KVX_ENGINE_STORE_PLAN_H

#include "store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum st_act { ST_ACT_KEEP, ST_ACT_QUARANTINE, ST_ACT_DELETE, ST_ACT_LEAVE } st_act;
typedef enum st_where { ST_IN_SHARDS, ST_IN_STAGING, ST_IN_QUARANTINE } st_where;

/* What a staging/ name is (the order the apply removes them in). */
typedef enum st_kind {
    ST_K_SHARD,       /* a shard file (shards/, quarantine/) */
    ST_K_OTHER,       /* anything else: a name kvx did not write, a directory */
    ST_K_TEMP,        /* a shard writer's temporary file: never acknowledged */
    ST_K_DROP_MARK,   /* .<gen>.kvx.tmp.drop[q]: a drop's mark */
    ST_K_COMMIT_MARK, /* .<seq 16 hex>.pending: a commit that never answered */
} st_kind;

typedef struct st_step {
    st_where where;
    st_act act;
    st_kind kind;
    char name[256];
    char why[480];
    uint64_t bytes;   /* the file's size (quarantine/: its allocated bytes) */
    uint64_t seq;     /* a commit mark's number; a deleted shard's commit */
    uint64_t gen;     /* a shard's or a drop mark's generation */
    int byte;         /* the shard byte a kept file holds; -1 none */
    uint64_t indexed; /* a kept file: entries the index holds from it */
    int failed;       /* set by the apply: this step could not be done */
    int deferred;     /* quarantined only after the deletes it may hold are kept (tomb_keys) */
} st_step;

/* An entry of a keyed shard file whose checksum failed, read as it is:
 * its key (copied), sequence number and kind are unproven. */
typedef struct st_suspect {
    uint64_t hash, seq;
    uint8_t *key;
    size_t len;
    int tomb;
} st_suspect;

/* A file of shards/ the plan keeps, open when the catalog is rebuilt. */
typedef struct st_found {
    uint64_t gen;
    kvx_shard *sh;
    uint64_t bytes;
    uint64_t max_seq, ino;
    char name[32];
} st_found;

/* A keyed entry the fresh index names: shard byte, entry, key hash. */
typedef struct st_pick {
    uint64_t hash;
    uint32_t b, idx;
} st_pick;

enum {
    ST_PLAN_STAGING = 1, /* read staging/ (a writer's open; not an open writer's reindex) */
    ST_PLAN_REBUILD = 2, /* always a fresh catalog (reindex), never the catalog as it is */
    ST_PLAN_STAGING_ONLY = 4, /* staging/ and a committed drop's victims only, the catalog left as it
                               * is (before a previous release's store is migrated); commit marks stay */
};

typedef struct kvx_st_plan {
    unsigned mode;
    int rebuild;              /* a fresh catalog from the kept files; 0: the catalog stands */
    char rebuild_why[200];    /* why the catalog is not used as it is */
    st_step *steps;
    size_t n, cap;
    st_found f[ST_SLOTS];     /* rebuild: the kept files, open */
    st_pick *picks;           /* rebuild of a keyed store: its live set */
    size_t npicks;
    uint64_t blocks;          /* entries the index holds once applied */
    uint64_t next_seq;        /* above every number in the files and marks */
    uint64_t *unacked;        /* the numbers of commits that never answered (their marks) */
    size_t nunacked, capunacked;
    uint64_t qbytes, qfiles;  /* quarantine/ once applied */
    st_suspect *suspects;     /* rebuild of a keyed store: what damaged files may say */
    size_t nsuspects, capsuspects;
    kvx_key *tomb_keys;       /* keys a damaged file may hold newer records of: deleted durably */
    size_t ntomb_keys;
} kvx_st_plan;

/* A new step of p (zeroed but for these), NULL on ENOMEM (kvx_fail said). */
static inline st_step *st_add(kvx_st_plan *p, st_where where, st_act act, st_kind kind, const char *name)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        st_step *v = realloc(p->steps, cap * sizeof *v);
        if (!v) {
            kvx_fail(-ENOMEM, "store: out of memory");
            return NULL;
        }
        p->steps = v;
        p->cap = cap;
    }
    st_step *x = &p->steps[p->n++];
    memset(x, 0, sizeof *x);
    x->where = where;
    x->act = act;
    x->kind = kind;
    x->byte = -1;
    snprintf(x->name, sizeof x->name, "%s", name);
    return x;
}

/* The plan for s (a loaded registry when the catalog may stand). 0 and
 * *out (kvx_st_plan_free), or an error: a passing failure opening a file,
 * a store that must be refused (pre-digest, a keyed store of before
 * sequence numbers without its catalog). */
int kvx_st_plan_make(kvx_store *s, unsigned mode, kvx_st_plan **out);
void kvx_st_plan_free(kvx_st_plan *p);
/* Counts of a plan's steps (kvx_recovery_report's fields). */
void kvx_st_plan_report(const kvx_st_plan *p, kvx_recovery_report *out);

/* Does the catalog name exactly the files of shards/ (writer: size and
 * inode of each; reader: no file it does not know could hold a newer
 * record, unacked: commit marks' numbers)? 1 yes, 0 no, <0 error. */
int kvx_st_catalog_current(kvx_store *s, int reader, const uint64_t *unacked, size_t nunacked,
                           const kvx_st_plan *skip);
/* The numbers of the commits that never answered: the marks in staging/
 * (regular files named .<seq 16 hex>.pending) that a sound catalog does
 * not say landed (its next_seq is above a landed commit's number). *seq
 * is malloc'd (free it), NULL when there are none. */
int kvx_st_commit_marks(kvx_store *s, uint64_t **seq, size_t *n);
/* Did mark seq's commit land, by the sound catalog (a spent mark)? */
static inline int kvx_st_mark_spent(const kvx_store *s, uint64_t seq) { return s->index_live && seq < s->next_seq; }

/* Adds quarantine/'s retention steps to p (the files p moves there
 * counted); p->qbytes, p->qfiles: quarantine/ once applied. */
int kvx_st_plan_retention(kvx_store *s, kvx_st_plan *p);
/* Removes quarantine/<name> and its note: 0 or -errno. */
int kvx_st_quarantine_expire(kvx_store *s, const char *name);

/* The public plan (kvx_store_plan) taking p (freed with it, or now on
 * failure): 0 or ENOMEM. */
int kvx_st_plan_wrap(kvx_store_plan **out, kvx_st_plan *p);

/* store_apply.c: carries p out (writer lock held). */
int kvx_st_plan_apply(kvx_store *s, kvx_st_plan *p);
/* KVX_EVERSION for a previous release's store that cannot be migrated
 * (no sound catalog: reindex sets index/ aside), naming the fix. */
int kvx_st_refuse_unmigrated(const kvx_store *s);

#endif
