/*
 * model.c - a model-based test of a keyed store's recovery (as RocksDB's
 * db_stress with expected state): a seeded generator runs operations
 * against a store and keeps, in memory, what the store acknowledged; after
 * every recovery every key of the model is asked and checked.
 *
 * Operations (weights in op_weights): keyed puts into three live batches
 * (the built-in one and two of kvx_store_batch_create; pages of random
 * length whose bytes encode key and version), keyed deletes of live and of
 * absent keys, re-puts of deleted keys (also from a batch created before
 * the delete), flushes (the acknowledgement), eviction under a small
 * capacity (kvx_store_evicted taken after every call), gc, destroying a
 * batch, and the recoveries: close and reopen, kvx_store_reindex,
 * kvx_store_reindex_dir on the closed store, index/ deleted, an older copy
 * of index/ put back, a shard file copied in under a name not in use, two
 * shard file names swapped, a byte rotted in a page, a read-only open
 * racing the writer's recovery, and kill -9 of a child running a segment
 * of operations (it reports every call and its result through a pipe; the
 * parent counts only what it was told was acknowledged).
 *
 * The checks, after each recovery, for every key: served bytes are the
 * newest acknowledged version (a later flush wins over an earlier one of
 * another batch, a delete removes the key); a miss only for a key the
 * store reported evicted or the test damaged (a rotted page may also be
 * KVX_EPAGECRC, never other bytes); nothing deleted and nothing never
 * acknowledged is served; an operation cut by the kill lands whole or not
 * at all; once version v was served no older one is; a recovery after a
 * shard was copied in or two names swapped moves no intact file to
 * quarantine/ without a copy left in shards/. A put's skip (out_new) is
 * checked against the model where the model knows whether the key is held.
 *
 *   KVX_MODEL_SEED=S      the seed (printed as "model: seed S")
 *   KVX_MODEL_SEQ=I       run only sequence I of that seed (a replay)
 *   KVX_MODEL_RUNS=N      at most N sequences (after the regression cases)
 *   KVX_MODEL_SECONDS=T   time budget (default 60, 120 under ASan)
 *   KVX_MODEL_OPS=N       operations per sequence (default 150)
 *   KVX_MODEL_DIR=D       scratch directory (default /dev/shm, else /tmp)
 *   KVX_MODEL_KEEP=1      keep a failing sequence's store
 *   KVX_MODEL_VERBOSE=1   print every operation
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/model_util.h"
#include "lib/store.h"

#define NK 40       /* keys per sequence: "m-000".."m-039" */
#define NB 3        /* batches: 0 the built-in one, 1 and 2 created */
#define PB 4096u    /* page size of the store */
#define KEYLEN 5
#define MAXSH 512   /* shard files looked at */
#define NH 64       /* acknowledged versions remembered per key */

/* ---- what can go wrong: the classes a check reports ---- */

enum {
    C_DELETED,   /* (a) */
    C_OLDER,     /* (b) */
    C_EARLIER,   /* (b') */
    C_OLDINDEX,  /* (c) */
    C_QUARANTINE, /* (d) */
    C_LOST,      /* (e) */
    C_MONOTONE,  /* (f) */
    C_SKIP,      /* (g) */
    C_PARTIAL,   /* (h) */
    C_UNACKED,   /* (i) */
    C_BYTES,     /* (w) */
    C_CALL,      /* (x) */
    NCLS
};
static const char *const cls_name[NCLS] = {
    "(a) a deleted key served",
    "(b) an older version served after a delete and a re-put",
    "(b') an earlier flush's version served over a later flush's (two batches put the key)",
    "(c) stale bytes served after an old index/ was put back",
    "(d) an intact shard moved to quarantine/ after a copy or swap",
    "(e) an acknowledged key lost",
    "(f) a non-monotone answer (older than one served before)",
    "(g) a put's skip (out_new) disagrees with the model",
    "(h) an operation cut by kill -9 landed partly",
    "(i) a never-acknowledged version served",
    "(w) wrong bytes served",
    "(x) a store call failed",
};

static struct {
    long count;
    uint64_t seed;
    long seq;
    char what[240];
} found[NCLS];

/* Regression cases, run first: (seed, sequence) pairs whose sequence once
 * found a defect (tests/RUNS.md, "Model test against the previous
 * release"). */
static const mu_case regressions[] = {
    {1, 0},     /* (d), (e): two shard names swapped, one file quarantined, its keys lost */
    {1001, 2},  /* (a): a deleted key served after reindex_dir */
    {1001, 12}, /* (c): a deleted key served after an old index/ was put back */
    {2001, 25}, /* (b): delete, re-put, reindex serves the version before the delete */
    {2002, 11}, /* (b'), (f): the earlier of two batches' flushes served after reindex_dir */
};

/* ---- the model ---- */

typedef struct mkey {
    uint64_t ver;        /* newest acknowledged version (0: none) */
    int live;            /* ver acknowledged and not deleted since */
    int may_miss;        /* reported evicted, or a copy damaged by the test */
    uint64_t max_ack;    /* the acknowledgement of the newest version served */
    uint64_t hv[NH], ha[NH]; /* versions acknowledged and when (m.acks), oldest first */
    uint64_t last_del;       /* m.acks when a delete of it was last acknowledged */
    int nh;
    int alt_set;         /* an operation cut by a kill may have landed: */
    int alt_live;        /*   then the key is (alt_live, alt_ver) */
    uint64_t alt_ver;
} mkey;

typedef struct mbatch {
    int key[NK];
    uint64_t ver[NK];
    int n;
    long born; /* the operation that made it */
} mbatch;

typedef struct model {
    mkey k[NK];
    mbatch b[NB];
    uint64_t next_ver;
    uint64_t acks; /* acknowledgements so far: their order decides "newest" */
} model;

/* The recovery a check follows. */
enum { K_REOPEN, K_REINDEX, K_REINDEX_DIR, K_INDEX_GONE, K_OLD_INDEX, K_COPY, K_SWAP, K_ROT, K_KILL, K_RO, K_FINAL };
static const char *const kind_name[] = {"reopen",   "reindex", "reindex_dir", "index/ deleted", "old index/ put back",
                                        "shard copied in", "names swapped", "page rotted", "kill -9", "read-only race",
                                        "final reopen"};

/* The messages of a child (kill -9 segments) and of the in-process run. */
enum { M_PUT = 1, M_FLUSH_I, M_FLUSH_D, M_DEL_I, M_DEL_D, M_GC_I, M_GC_D, M_EV, M_STAT, M_DROP, M_RO };
typedef struct msg {
    uint8_t type, batch;
    int16_t key;
    int32_t rc;
    uint64_t ver;
    uint64_t extra;
} msg;

typedef struct run {
    uint64_t seed;
    long seq;
    uint64_t rng;
    char dir[400], saved[400];
    int have_saved;
    kvx_store *s;
    kvx_store_batch *bh[NB];
    model m;
    long op;
    int child_fd; /* >= 0: this is a child; messages go there */
    int failed;
    int new_class; /* a class not seen before: print the trace */
    /* the operation in flight (the child's intent without its result) */
    int inf_type, inf_batch, inf_nkeys, inf_keys[NK];
    uint64_t last_evicted_blocks; /* the store's count, as last told */
    uint64_t rot_sig[64];
    int n_rot;
    mu_trace trace;
} run;

static int verbose;
static long n_checks, n_kills, n_cut, n_cut_landed; /* what ran, for the summary */
static int n_batches = NB; /* KVX_MODEL_BATCHES: the batches puts go to (1..NB) */

static uint64_t rnd(run *r) { return mu_rnd(&r->rng); }
static uint32_t below(run *r, uint32_t n) { return mu_below(&r->rng, n); }

static void tr(run *r, const char *fmt, ...)
{
    if (r->child_fd >= 0) return;
    va_list ap;
    va_start(ap, fmt);
    mu_trace_vadd(&r->trace, verbose, fmt, ap);
    va_end(ap);
}

static void bad(run *r, int cls, const char *fmt, ...)
{
    char what[240];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (r->child_fd >= 0) {
        fprintf(stderr, "model: child of seed %" PRIu64 " sequence %ld: %s\n", r->seed, r->seq, what);
        _exit(2); /* the parent sees the exit status */
    }
    r->failed = 1;
    if (found[cls].count++ == 0) {
        found[cls].seed = r->seed;
        found[cls].seq = r->seq;
        snprintf(found[cls].what, sizeof found[cls].what, "%s", what);
        r->new_class = 1;
    }
    tr(r, "FAIL %s: %s", cls_name[cls], what);
    static long printed;
    if (r->new_class != 1 && printed >= 20) return; /* the summary counts the rest */
    if (r->new_class == 1) r->new_class = 2;
    printed++;
    fprintf(stderr, "model: FAIL seed %" PRIu64 " sequence %ld op %ld: %s: %s\n", r->seed, r->seq, r->op, cls_name[cls],
            what);
}

/* ---- keys and pages ---- */

static void key_name(char out[8], int k) { snprintf(out, 8, "m-%03d", k); }

static int key_index(const uint8_t *key, size_t len)
{
    if (len != KEYLEN || key[0] != 'm' || key[1] != '-') return -1;
    int k = 0;
    for (int i = 2; i < KEYLEN; i++) {
        if (key[i] < '0' || key[i] > '9') return -1;
        k = k * 10 + (key[i] - '0');
    }
    return k < NK ? k : -1;
}

static uint64_t page_mix(int k, uint64_t ver) { return su_mix(((uint64_t)k << 40) ^ (ver * 0x9E3779B97F4A7C15ull)); }
static size_t page_len(int k, uint64_t ver) { return 16 + (size_t)(page_mix(k, ver) % (PB - 16 + 1)); }

/* The page of key k at version ver: "KVXM", u32 k, u64 ver, then bytes of
 * (k, ver); its length is a function of both too. */
static size_t page_fill(uint8_t *p, int k, uint64_t ver)
{
    size_t n = page_len(k, ver);
    uint32_t k32 = (uint32_t)k;
    memcpy(p, "KVXM", 4);
    memcpy(p + 4, &k32, 4);
    memcpy(p + 8, &ver, 8);
    su_page(p + 16, n - 16, page_mix(k, ver) ^ 0x5555);
    return n;
}

/* The version a served page of key k is, or 0 when its bytes are no
 * version's page of k. */
static uint64_t page_version(const void *page, uint64_t len, int k)
{
    static uint8_t want[PB];
    if (len < 16 || len > PB || memcmp(page, "KVXM", 4)) return 0;
    uint32_t k32;
    uint64_t ver;
    memcpy(&k32, (const uint8_t *)page + 4, 4);
    memcpy(&ver, (const uint8_t *)page + 8, 8);
    if (k32 != (uint32_t)k || ver == 0) return 0;
    if (page_fill(want, k, ver) != len || memcmp(want, page, len)) return 0;
    return ver;
}

/* ---- the model's rules, applied to each message ---- */

static int pending_in(const mbatch *b, int k)
{
    for (int i = 0; i < b->n; i++)
        if (b->key[i] == k) return 1;
    return 0;
}

static void m_drop(model *m, int b) { m->b[b].n = 0; }

/* Version ver of key k acknowledged now: the newest, whatever its number
 * (a later flush wins). */
static void m_ack(model *m, int key, uint64_t ver)
{
    mkey *k = &m->k[key];
    if (k->nh == NH) {
        memmove(k->hv, k->hv + 1, (NH - 1) * sizeof k->hv[0]);
        memmove(k->ha, k->ha + 1, (NH - 1) * sizeof k->ha[0]);
        k->nh--;
    }
    k->hv[k->nh] = ver;
    k->ha[k->nh++] = ++m->acks;
    k->ver = ver;
    k->live = 1;
    k->may_miss = 0;
}

/* When version ver of k was acknowledged (0: never, or too long ago). */
static uint64_t ack_of(const mkey *k, uint64_t ver)
{
    for (int i = 0; i < k->nh; i++)
        if (k->hv[i] == ver) return k->ha[i];
    return 0;
}

static void m_flush(model *m, int b)
{
    mbatch *mb = &m->b[b];
    /* later flush wins: this batch's versions become the newest */
    for (int i = 0; i < mb->n; i++) m_ack(m, mb->key[i], mb->ver[i]);
    mb->n = 0;
}

static void tr_msg(run *r, const msg *x)
{
    switch (x->type) {
    case M_PUT:
        tr(r, "#%ld put b%d m-%03d v%" PRIu64 " rc %d new %" PRIu64, r->op, x->batch, x->key, x->ver, x->rc, x->extra);
        break;
    case M_FLUSH_D: tr(r, "#%ld flush b%d rc %d (%d keys)", r->op, x->batch, x->rc, (int)x->extra); break;
    case M_DEL_D: tr(r, "#%ld delete rc %d deleted %" PRIu64, r->op, x->rc, x->extra); break;
    case M_DEL_I: tr(r, "#%ld   delete m-%03d", r->op, x->key); break;
    case M_GC_D: tr(r, "#%ld gc rc %d", r->op, x->rc); break;
    case M_EV: tr(r, "#%ld   evicted m-%03d", r->op, x->key); break;
    case M_DROP: tr(r, "#%ld drop b%d", r->op, x->batch); break;
    default: break;
    }
}

/* Applies one message to r's model; judges only in the parent. */
static void apply(run *r, const msg *x)
{
    model *m = &r->m;
    int judge = r->child_fd < 0;
    tr_msg(r, x);
    switch (x->type) {
    case M_PUT:
        if (x->ver >= m->next_ver) m->next_ver = x->ver + 1;
        if (x->rc) break;
        {
            mkey *k = &m->k[x->key];
            mbatch *b = &m->b[x->batch];
            int pend = pending_in(b, x->key);
            /* kvx_store_keyed_put: a key already held, or pending in the
             * same batch, is skipped. Held is known unless the key was
             * evicted or damaged (or a cut operation may have landed). */
            int certain = !k->may_miss && !k->alt_set;
            int want_new = !pend && !k->live;
            if (judge && (pend || certain) && (int)x->extra != want_new)
                bad(r, C_SKIP, "put of m-%03d into b%d wrote %d, the model says %d (live %d v%" PRIu64 ", pending %d)",
                    x->key, x->batch, (int)x->extra, want_new, k->live, k->ver, pend);
            if (x->extra == 1 && !pend && b->n < NK) {
                b->key[b->n] = x->key;
                b->ver[b->n++] = x->ver;
            }
        }
        break;
    case M_FLUSH_I:
        r->inf_type = M_FLUSH_I;
        r->inf_batch = x->batch;
        break;
    case M_FLUSH_D:
        if (x->rc == 0)
            m_flush(m, x->batch);
        else
            m_drop(m, x->batch);
        r->inf_type = 0;
        break;
    case M_DEL_I:
        if (r->inf_type != M_DEL_I) r->inf_nkeys = 0;
        r->inf_type = M_DEL_I;
        r->inf_keys[r->inf_nkeys++] = x->key;
        break;
    case M_DEL_D:
        if (x->rc == 0)
            for (int i = 0; i < r->inf_nkeys; i++) {
                mkey *k = &m->k[r->inf_keys[i]];
                if (k->live) k->last_del = ++m->acks;
                k->live = 0;
                k->may_miss = 0;
            }
        r->inf_type = 0;
        r->inf_nkeys = 0;
        break;
    case M_GC_I: r->inf_type = M_GC_I; break;
    case M_GC_D: r->inf_type = 0; break;
    case M_EV:
        m->k[x->key].may_miss = 1; /* no live shard holds it any more */
        break;
    case M_STAT: r->last_evicted_blocks = x->extra; break;
    case M_DROP: m_drop(m, x->batch); break;
    default: break;
    }
}

/* Sends a message: a child writes it to the parent (atomic: < PIPE_BUF)
 * and keeps its own model; the parent applies it. */
static void emit(run *r, int type, int batch, int key, int rc, uint64_t ver, uint64_t extra)
{
    msg x = {(uint8_t)type, (uint8_t)batch, (int16_t)key, rc, ver, extra};
    if (r->child_fd >= 0) {
        if (write(r->child_fd, &x, sizeof x) != (ssize_t)sizeof x) _exit(3);
    }
    apply(r, &x);
}

/* ---- the store calls ---- */

static void take_evicted(run *r)
{
    kvx_evicted ev[32];
    for (;;) {
        size_t n = 0;
        uint64_t dropped = 0;
        int rc = kvx_store_evicted(r->s, ev, 32, &n, &dropped);
        if (rc) {
            bad(r, C_CALL, "kvx_store_evicted: %s (%s)", kvx_err_name(rc), kvx_last_error());
            return;
        }
        if (dropped) /* the report lost some: any key may be gone */
            for (int k = 0; k < NK; k++) emit(r, M_EV, 0, k, 0, 0, 0);
        for (size_t i = 0; i < n; i++) {
            int k = key_index(ev[i].key, ev[i].key_len);
            if (k >= 0) emit(r, M_EV, 0, k, 0, 0, 0);
        }
        if (n < 32) break;
    }
    kvx_store_stats st;
    if (kvx_store_stat(&st, r->s) == 0) emit(r, M_STAT, 0, 0, 0, 0, st.evicted_blocks);
}

static int batch_create(run *r, int b)
{
    r->m.b[b].n = 0;
    r->m.b[b].born = r->op;
    if (b == 0) {
        r->bh[0] = NULL;
        return 0;
    }
    int rc = kvx_store_batch_create(&r->bh[b], r->s);
    if (rc) bad(r, C_CALL, "batch_create: %s (%s)", kvx_err_name(rc), kvx_last_error());
    return rc;
}

static int r_open(run *r)
{
    int rc = kvx_store_open(&r->s, r->dir, NULL, 0);
    if (rc) {
        r->s = NULL;
        bad(r, C_CALL, "open: %s (%s)", kvx_err_name(rc), kvx_last_error());
        return rc;
    }
    for (int b = 0; b < NB; b++)
        if (batch_create(r, b)) return -1;
    take_evicted(r);
    return 0;
}

static void r_close(run *r)
{
    if (!r->s) return;
    for (int b = 1; b < NB; b++) {
        kvx_store_batch_destroy(r->bh[b]);
        r->bh[b] = NULL;
    }
    for (int b = 0; b < NB; b++) m_drop(&r->m, b); /* close drops unflushed puts */
    take_evicted(r);
    kvx_store_close(r->s);
    r->s = NULL;
}

static void x_put(run *r, int b, int k)
{
    static uint8_t page[PB];
    uint64_t ver = r->m.next_ver++;
    char name[8];
    key_name(name, k);
    kvx_key key = {name, KEYLEN};
    size_t len = page_fill(page, k, ver);
    const void *pages[1] = {page};
    size_t out_new = 99;
    int rc = kvx_store_keyed_put(r->s, r->bh[b], &key, pages, &len, 1, &out_new);
    if (rc && rc != KVX_ECAPACITY) bad(r, C_CALL, "put m-%03d: %s (%s)", k, kvx_err_name(rc), kvx_last_error());
    emit(r, M_PUT, b, k, rc, ver, rc ? 0 : out_new);
    take_evicted(r);
}

static void x_flush(run *r, int b)
{
    int n = r->m.b[b].n;
    emit(r, M_FLUSH_I, b, 0, 0, 0, 0);
    int rc = b ? kvx_store_batch_flush(r->bh[b]) : kvx_store_flush(r->s);
    if (rc) bad(r, C_CALL, "flush b%d: %s (%s)", b, kvx_err_name(rc), kvx_last_error());
    emit(r, M_FLUSH_D, b, 0, rc, 0, (uint64_t)n);
    take_evicted(r);
}

static void x_delete(run *r, const int *ks, int n)
{
    char names[NK][8];
    kvx_key keys[NK];
    for (int i = 0; i < n; i++) {
        key_name(names[i], ks[i]);
        keys[i].bytes = names[i];
        keys[i].len = KEYLEN;
        emit(r, M_DEL_I, 0, ks[i], 0, 0, 0);
    }
    size_t deleted = 0;
    int rc = kvx_store_keyed_delete(r->s, keys, (size_t)n, &deleted);
    if (rc) bad(r, C_CALL, "delete: %s (%s)", kvx_err_name(rc), kvx_last_error());
    emit(r, M_DEL_D, 0, 0, rc, 0, deleted);
    take_evicted(r);
}

static void x_gc(run *r)
{
    emit(r, M_GC_I, 0, 0, 0, 0, 0);
    int rc = kvx_store_gc(r->s);
    if (rc) bad(r, C_CALL, "gc: %s (%s)", kvx_err_name(rc), kvx_last_error());
    emit(r, M_GC_D, 0, 0, rc, 0, 0);
    take_evicted(r);
}

static void x_drop_batch(run *r, int b)
{
    if (b == 0) return;
    kvx_store_batch_destroy(r->bh[b]);
    r->bh[b] = NULL;
    emit(r, M_DROP, b, 0, 0, 0, 0);
    batch_create(r, b);
    take_evicted(r);
}

/* The batch to put into: any, or (half the time for a re-put) the one
 * made longest ago, so it may predate the key's delete. */
static int pick_batch(run *r, int oldest)
{
    if (!oldest) return (int)below(r, (uint32_t)n_batches);
    int best = 0;
    for (int b = 1; b < n_batches; b++)
        if (r->m.b[b].born < r->m.b[best].born) best = b;
    return best;
}

static int pick_key(run *r, int want) /* want: 1 live, 0 not live, -1 any */
{
    int c[NK], n = 0;
    for (int k = 0; k < NK; k++)
        if (want < 0 || r->m.k[k].live == want) c[n++] = k;
    return n ? c[below(r, (uint32_t)n)] : -1;
}

/* One of the operations a writer handle runs (in the parent or in a
 * killed child): put, re-put of a deleted key, delete, flush, gc, drop. */
static void x_write_op(run *r)
{
    uint32_t w = below(r, 100);
    if (w < 38) {
        x_put(r, pick_batch(r, 0), (int)below(r, NK));
    } else if (w < 48) {
        int k = -1;
        for (int t = 0; t < 8 && k < 0; t++) {
            int c = pick_key(r, 0);
            if (c >= 0 && r->m.k[c].ver) k = c; /* deleted: acknowledged once */
        }
        if (k < 0) k = (int)below(r, NK);
        x_put(r, pick_batch(r, below(r, 2)), k);
    } else if (w < 60) {
        int ks[3], n = 0, want = 1 + (int)below(r, 3);
        for (int i = 0; i < want; i++) {
            int k = below(r, 4) ? pick_key(r, 1) : pick_key(r, 0); /* live, or absent */
            if (k < 0) k = (int)below(r, NK);
            int dup = 0;
            for (int j = 0; j < n; j++) dup |= ks[j] == k;
            if (!dup) ks[n++] = k;
        }
        x_delete(r, ks, n);
    } else if (w < 88) {
        x_flush(r, (int)below(r, (uint32_t)n_batches));
    } else if (w < 94) {
        x_gc(r);
    } else {
        if (n_batches > 1) x_drop_batch(r, 1 + (int)below(r, (uint32_t)n_batches - 1));
    }
}

/* ---- files ---- */

/* The shard files of shards/ ("<16 hex>.kvx"), sorted. */
static size_t shard_names(run *r, char (*out)[64], size_t max)
{
    static char names[MAXSH][64];
    size_t n = su_list_names(r->dir, "shards", names, MAXSH), k = 0;
    for (size_t i = 0; i < n && k < max; i++)
        if (strlen(names[i]) == 20 && !strcmp(names[i] + 16, ".kvx")) memcpy(out[k++], names[i], 64);
    return k;
}

/* The signatures of the files in dir/sub (quarantine/: not the ".why"). */
static size_t sigs_of(run *r, const char *sub, uint64_t *out, size_t max)
{
    static char names[MAXSH][64];
    size_t n = su_list_names(r->dir, sub, names, MAXSH), k = 0;
    for (size_t i = 0; i < n && k < max; i++) {
        if (strstr(names[i], ".why")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s/%.63s", r->dir, sub, names[i]);
        out[k++] = su_file_sig(p, NULL);
    }
    return k;
}

static void save_index(run *r)
{
    if (mu_save_index(r->dir, r->saved) == 0) r->have_saved = 1;
}

static void put_old_index(run *r) { mu_put_old_index(r->dir, r->saved); }

/* A shard file copied in under a generation no file has: above every
 * one, or below (a name that looks older). */
static void copy_shard(run *r)
{
    static char names[MAXSH][64];
    size_t n = shard_names(r, names, MAXSH);
    if (!n) return;
    const char *src = names[below(r, (uint32_t)n)];
    uint64_t lo = strtoull(names[0], NULL, 16), hi = strtoull(names[n - 1], NULL, 16), g;
    g = (below(r, 2) || lo < 2) ? hi + 1 + below(r, 4) : lo - 1;
    char from[1024], to[1024];
    snprintf(from, sizeof from, "%s/shards/%.63s", r->dir, src);
    snprintf(to, sizeof to, "%s/shards/%016" PRIx64 ".kvx", r->dir, g);
    tr(r, "#%ld   copy %s to %016" PRIx64 ".kvx: %d", r->op, src, g, mu_copy_file(from, to));
}

static void swap_shards(run *r)
{
    static char names[MAXSH][64];
    size_t n = shard_names(r, names, MAXSH);
    if (n < 2) return;
    uint32_t i = below(r, (uint32_t)n), j = below(r, (uint32_t)n - 1);
    if (j >= i) j++;
    char a[1024], b[1024], t[1024];
    snprintf(a, sizeof a, "%s/shards/%.63s", r->dir, names[i]);
    snprintf(b, sizeof b, "%s/shards/%.63s", r->dir, names[j]);
    snprintf(t, sizeof t, "%s/swap.tmp", r->dir);
    int rc = rename(a, t) || rename(b, a) || rename(t, b);
    tr(r, "#%ld   swap %s and %s: %d", r->op, names[i], names[j], rc);
}

/* Flips a byte of one page of one shard; that key may now miss or be
 * KVX_EPAGECRC, never other bytes. */
static void rot_page(run *r)
{
    static char names[MAXSH][64];
    size_t n = shard_names(r, names, MAXSH);
    if (!n) return;
    char p[1024];
    snprintf(p, sizeof p, "%s/shards/%.63s", r->dir, names[below(r, (uint32_t)n)]);
    kvx_shard *sh = NULL;
    if (kvx_shard_open(&sh, p, 0)) return;
    const kvx_shard_info *inf = kvx_shard_get_info(sh);
    kvx_entry e;
    int k = -1;
    uint64_t off = 0;
    /* a page, never a tombstone (it has none: offset 0 is the header) */
    if (inf->num_blocks && kvx_shard_entry(&e, sh, below(r, inf->num_blocks)) == 0 && e.key && e.bytes) {
        k = key_index(e.key, e.key_len);
        off = e.offset + below(r, e.bytes);
    }
    kvx_shard_close(sh);
    if (k < 0) return;
    int fd = open(p, O_RDWR);
    uint8_t c;
    if (fd >= 0 && pread(fd, &c, 1, (off_t)off) == 1) {
        c ^= (uint8_t)(1u << below(r, 8));
        if (pwrite(fd, &c, 1, (off_t)off) == 1) {
            r->m.k[k].may_miss = 1;
            tr(r, "#%ld   rot %s m-%03d at %" PRIu64, r->op, p + strlen(r->dir) + 1, k, off);
        }
    }
    if (fd >= 0) close(fd);
    if (r->n_rot < 64) r->rot_sig[r->n_rot++] = su_file_sig(p, NULL);
}

/* ---- the check ---- */

typedef struct obs {
    int st;       /* 0 served, else the status */
    uint64_t sv;  /* served version; 0: bytes of no version */
} obs;

static void observe(kvx_store *s, obs *o)
{
    for (int k = 0; k < NK; k++) {
        char name[8];
        key_name(name, k);
        kvx_key key = {name, KEYLEN};
        kvx_view v;
        int st = 0;
        memset(&v, 0, sizeof v);
        int rc = kvx_store_keyed_get(&v, &st, s, &key, 1);
        o[k].st = rc ? rc : st;
        o[k].sv = 0;
        if (!rc && !st) o[k].sv = page_version(v.page, v.page_bytes, k);
        kvx_views_release(&v, 1);
    }
}

/* A served answer that neither outcome explains: which class. */
static void judge_served(run *r, int k, uint64_t sv, int kind)
{
    mkey *m = &r->m.k[k];
    const char *after = kind_name[kind];
    if (!ack_of(m, sv))
        bad(r, C_UNACKED, "after %s m-%03d served v%" PRIu64 ", newest acknowledged v%" PRIu64 " (live %d)", after, k, sv,
            m->ver, m->live);
    else if (kind == K_OLD_INDEX)
        bad(r, C_OLDINDEX, "after %s m-%03d served v%" PRIu64 ", the model: %s v%" PRIu64, after, k, sv,
            m->live ? "live" : "deleted", m->ver);
    else if (!m->live)
        bad(r, C_DELETED, "after %s m-%03d served v%" PRIu64 ", deleted at v%" PRIu64, after, k, sv, m->ver);
    else if (m->last_del < ack_of(m, sv))
        bad(r, C_EARLIER, "after %s m-%03d served v%" PRIu64 ", acknowledged before the newest, v%" PRIu64, after, k, sv,
            m->ver);
    else
        bad(r, C_OLDER, "after %s m-%03d served v%" PRIu64 ", acknowledged before the newest, v%" PRIu64, after, k, sv,
            m->ver);
}

static int prim_ok(const mkey *m, const obs *o)
{
    return o->st == 0 ? (m->live && o->sv == m->ver) : (!m->live || m->may_miss);
}
static int alt_ok(const mkey *m, const obs *o)
{
    if (!m->alt_set) return 0;
    return o->st == 0 ? (m->alt_live && o->sv == m->alt_ver) : (!m->alt_live || m->may_miss);
}

/* Every key asked of the open store and judged. budget: misses the store
 * may have made unreported (an eviction cut by a kill). */
static void check_all(run *r, int kind, uint64_t budget)
{
    obs o[NK];
    observe(r->s, o);
    n_checks++;
    int unexplained[NK], nu = 0, n_new = 0, n_old = 0;
    for (int k = 0; k < NK; k++) {
        mkey *m = &r->m.k[k];
        if (o[k].st && o[k].st != KVX_ENOTFOUND && o[k].st != KVX_EPAGECRC) {
            bad(r, C_CALL, "after %s get m-%03d: %s (%s)", kind_name[kind], k, kvx_err_name(o[k].st), kvx_last_error());
            continue;
        }
        if (o[k].st == 0 && o[k].sv == 0) {
            bad(r, C_BYTES, "after %s m-%03d served bytes of no version", kind_name[kind], k);
            continue;
        }
        int p = prim_ok(m, &o[k]), a = alt_ok(m, &o[k]);
        if (m->alt_set) {
            if (a && !p) n_new++;
            if (p && !a) n_old++;
        }
        if (!p && !a) {
            if (o[k].st == 0)
                judge_served(r, k, o[k].sv, kind);
            else
                unexplained[nu++] = k;
        }
        if (o[k].st == 0 && o[k].sv) {
            uint64_t a = ack_of(m, o[k].sv);
            if (a && a < m->max_ack)
                bad(r, C_MONOTONE, "after %s m-%03d served v%" PRIu64 ", acknowledged before a version served earlier",
                    kind_name[kind], k, o[k].sv);
            if (a > m->max_ack) m->max_ack = a;
        }
    }
    if (kind == K_KILL && (r->inf_type == M_FLUSH_I || r->inf_type == M_DEL_I)) {
        n_cut++;
        n_cut_landed += n_new > 0;
    }
    if (n_new && n_old) bad(r, C_PARTIAL, "after %s the cut operation shows on %d keys, not on %d", kind_name[kind], n_new, n_old);
    /* the cut operation landed when any of its keys shows it */
    for (int k = 0; k < NK; k++) {
        mkey *m = &r->m.k[k];
        if (!m->alt_set) continue;
        if (n_new) {
            if (m->alt_live)
                m_ack(&r->m, k, m->alt_ver);
            else if (m->live) {
                m->live = 0;
                m->last_del = ++r->m.acks;
            }
        }
        m->alt_set = 0;
    }
    if ((uint64_t)nu <= budget) {
        for (int i = 0; i < nu; i++) r->m.k[unexplained[i]].may_miss = 1;
        if (nu) tr(r, "#%ld   %d keys missing within an interrupted eviction (budget %" PRIu64 ")", r->op, nu, budget);
    } else {
        for (int i = 0; i < nu; i++) {
            int k = unexplained[i];
            bad(r, C_LOST, "after %s m-%03d (v%" PRIu64 " acknowledged) is %s", kind_name[kind], k, r->m.k[k].ver,
                kvx_err_name(o[k].st));
        }
    }
}

/* ---- recoveries ---- */

/* (d): after a copy or swap, a file whose bytes were in shards/ and now
 * are only in quarantine/. */
typedef struct filesnap {
    uint64_t sh[MAXSH], q[MAXSH];
    size_t nsh, nq;
} filesnap;

static void snap(run *r, filesnap *f)
{
    f->nsh = sigs_of(r, "shards", f->sh, MAXSH);
    f->nq = sigs_of(r, "quarantine", f->q, MAXSH);
}

static void check_quarantine(run *r, const filesnap *before, int kind)
{
    filesnap after;
    snap(r, &after);
    for (size_t i = 0; i < before->nsh; i++) {
        uint64_t x = before->sh[i];
        if (mu_has_sig(r->rot_sig, (size_t)r->n_rot, x)) continue;
        if (mu_has_sig(after.sh, after.nsh, x)) continue;
        if (mu_has_sig(after.q, after.nq, x) && !mu_has_sig(before->q, before->nq, x))
            bad(r, C_QUARANTINE, "after %s an intact shard file (signature %016" PRIx64 ") is in quarantine/, no copy in shards/",
                kind_name[kind], x);
    }
}

/* Closed store: the damage of kind (or none), then a writer's open. */
static int damage(run *r, int kind)
{
    char idx[1024];
    switch (kind) {
    case K_REINDEX_DIR: {
        int rc = kvx_store_reindex_dir(r->dir, 0);
        tr(r, "#%ld   reindex_dir: %s", r->op, kvx_err_name(rc));
        if (rc) bad(r, C_CALL, "reindex_dir: %s (%s)", kvx_err_name(rc), kvx_last_error());
        return rc;
    }
    case K_INDEX_GONE:
        snprintf(idx, sizeof idx, "%s/index", r->dir);
        su_rm_rf(idx);
        return 0;
    case K_OLD_INDEX: put_old_index(r); return 0;
    case K_COPY: copy_shard(r); return 0;
    case K_SWAP: swap_shards(r); return 0;
    case K_ROT: rot_page(r); return 0;
    default: return 0;
    }
}

static void op_recover(run *r, int kind)
{
    tr(r, "#%ld %s", r->op, kind_name[kind]);
    if (kind == K_REINDEX) {
        int rc = kvx_store_reindex(r->s);
        tr(r, "#%ld   reindex: %s", r->op, kvx_err_name(rc));
        if (rc == 0)
            m_flush(&r->m, 0); /* the built-in batch is flushed first */
        else if (rc != KVX_EBUSY)
            bad(r, C_CALL, "reindex: %s (%s)", kvx_err_name(rc), kvx_last_error());
        take_evicted(r);
        if (!r->failed) check_all(r, kind, 0);
        return;
    }
    r_close(r);
    /* an index/ saved now becomes an old one later */
    if (kind != K_OLD_INDEX && (below(r, 3) == 0 || !r->have_saved)) save_index(r);
    if (kind == K_OLD_INDEX && !r->have_saved) kind = K_REOPEN;
    filesnap before;
    snap(r, &before);
    if (damage(r, kind) || r_open(r)) return;
    if (kind == K_COPY || kind == K_SWAP) check_quarantine(r, &before, kind);
    check_all(r, kind, 0);
}

/* A read-only open, in a child, racing the writer's recovery after
 * damage: what the reader serves must be the newest acknowledged version
 * (it may miss). Its violations come back through a pipe. */
static void op_ro_race(run *r)
{
    int kinds[] = {K_REOPEN, K_INDEX_GONE, K_OLD_INDEX, K_COPY, K_SWAP, K_REINDEX_DIR};
    int kind = kinds[below(r, 6)];
    tr(r, "#%ld read-only race after %s", r->op, kind_name[kind]);
    r_close(r);
    if (kind == K_OLD_INDEX && !r->have_saved) kind = K_REOPEN;
    filesnap before;
    snap(r, &before);
    if (kind != K_REINDEX_DIR && damage(r, kind)) return;
    int res[2], stop[2];
    if (pipe(res) || pipe(stop)) {
        bad(r, C_CALL, "pipe: %s", strerror(errno));
        return;
    }
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(res[0]);
        close(stop[1]);
        fcntl(stop[0], F_SETFL, O_NONBLOCK);
        int sent = 0;
        for (int round = 0; round < 200 && sent < 16; round++) {
            char c;
            if (read(stop[0], &c, 1) >= 0) break; /* the writer is done (or gone: EOF) */
            kvx_store *s = NULL;
            if (kvx_store_open(&s, r->dir, NULL, KVX_STORE_READONLY) == 0) {
                obs o[NK];
                observe(s, o);
                kvx_store_close(s);
                for (int k = 0; k < NK && sent < 16; k++) {
                    const mkey *m = &r->m.k[k];
                    if (o[k].st == 0 && !(m->live && o[k].sv == m->ver)) {
                        msg x = {M_RO, 0, (int16_t)k, 0, o[k].sv, (uint64_t)round};
                        if (write(res[1], &x, sizeof x) != (ssize_t)sizeof x) _exit(3);
                        sent++;
                    }
                }
            }
        }
        _exit(0);
    }
    close(res[1]);
    close(stop[0]);
    if (kind == K_REINDEX_DIR) damage(r, kind);
    int opened = r_open(r) == 0;
    if (opened && (kind == K_COPY || kind == K_SWAP)) check_quarantine(r, &before, kind);
    if (opened) check_all(r, kind, 0);
    if (write(stop[1], "x", 1) != 1) { /* the reader is gone already */
    }
    close(stop[1]);
    int status;
    waitpid(pid, &status, 0);
    msg x;
    while (read(res[0], &x, sizeof x) == (ssize_t)sizeof x) {
        if (x.ver == 0)
            bad(r, C_BYTES, "a reader racing %s served m-%03d bytes of no version", kind_name[kind], x.key);
        else {
            tr(r, "#%ld   reader round %" PRIu64 " served m-%03d v%" PRIu64, r->op, x.extra, x.key, x.ver);
            judge_served(r, x.key, x.ver, kind == K_OLD_INDEX ? K_OLD_INDEX : K_RO);
        }
    }
    close(res[0]);
}

/* kill -9 of a child running a segment of writer operations. */
static void op_kill(run *r)
{
    tr(r, "#%ld kill -9 segment", r->op);
    r_close(r);
    int fds[2];
    if (pipe(fds)) {
        bad(r, C_CALL, "pipe: %s", strerror(errno));
        return;
    }
    uint64_t child_seed = rnd(r);
    uint32_t delay_us = below(r, 12000); /* the child runs 60 operations in ~5-20 ms */
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        r->child_fd = fds[1];
        r->rng = child_seed | 1;
        if (r_open(r)) _exit(2);
        for (int i = 0; i < 60; i++) x_write_op(r);
        r_close(r);
        _exit(0);
    }
    close(fds[1]);
    r->inf_type = 0;
    r->inf_nkeys = 0;
    double end = mu_now_s() + delay_us * 1e-6;
    int killed = 0, eof = 0;
    for (;;) {
        double left = end - mu_now_s();
        if (left <= 0 && !killed) {
            kill(pid, SIGKILL);
            killed = 1;
        }
        struct pollfd p = {fds[0], POLLIN, 0};
        int pr = poll(&p, 1, killed ? 1000 : (int)(left * 1000) + 1);
        if (pr <= 0) continue;
        msg x;
        ssize_t n = read(fds[0], &x, sizeof x);
        if (n <= 0) {
            eof = 1;
            break;
        }
        if (n == (ssize_t)sizeof x) apply(r, &x);
    }
    (void)eof;
    int status;
    waitpid(pid, &status, 0);
    close(fds[0]);
    n_kills += WIFSIGNALED(status);
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        bad(r, C_CALL, "the child exited %d (a store call failed there)", WEXITSTATUS(status));
    tr(r, "#%ld   %s, in flight: %d", r->op, WIFSIGNALED(status) ? "killed" : "finished", r->inf_type);
    /* the operation in flight may have landed whole or not at all */
    if (r->inf_type == M_FLUSH_I) {
        mbatch *b = &r->m.b[r->inf_batch];
        for (int i = 0; i < b->n; i++) {
            mkey *m = &r->m.k[b->key[i]];
            m->alt_set = 1;
            m->alt_live = 1;
            m->alt_ver = b->ver[i];
        }
    } else if (r->inf_type == M_DEL_I) {
        for (int i = 0; i < r->inf_nkeys; i++) {
            mkey *m = &r->m.k[r->inf_keys[i]];
            m->alt_set = 1;
            m->alt_live = 0;
            m->alt_ver = m->ver;
        }
    }
    for (int b = 0; b < NB; b++) m_drop(&r->m, b);
    r->m.next_ver += 1000; /* past whatever the child put */
    uint64_t told = r->last_evicted_blocks;
    if (r_open(r)) return;
    /* the open's own evictions were reported; what the store counted
     * beyond what the child told may be unreported misses */
    kvx_store_stats st;
    uint64_t budget = 0;
    if (kvx_store_stat(&st, r->s) == 0 && st.evicted_blocks > told) budget = st.evicted_blocks - told;
    check_all(r, K_KILL, budget);
    r->inf_type = 0;
}

/* ---- one sequence ---- */

enum { O_WRITE, O_REOPEN, O_REINDEX, O_REINDEX_DIR, O_INDEX_GONE, O_OLD_INDEX, O_COPY, O_SWAP, O_ROT, O_RO, O_KILL, O_SAVE, NOPS };
/* Weights (per 100 operations, about): writes dominate. KVX_MODEL_WEIGHTS
 * replaces them, in this order, e.g. "80,5,0,0,0,0,0,0,0,0,5,0" for writes,
 * reopens and kills only. */
static int op_weights[NOPS] = {80, 3, 3, 2, 2, 3, 2, 2, 2, 1, 2, 2};
static const char *const op_names[NOPS] = {"write", "reopen", "reindex", "reindex_dir", "index_gone", "old_index",
                                           "copy", "swap", "rot", "ro_race", "kill", "save_index"};

static int run_sequence(uint64_t seed, long seq, const char *root, long nops)
{
    run *r = calloc(1, sizeof *r);
    r->seed = seed;
    r->seq = seq;
    r->rng = su_mix(seed * 0x9E3779B97F4A7C15ull + (uint64_t)seq) | 1;
    r->child_fd = -1;
    r->m.next_ver = 1;
    mu_trace_init(&r->trace);
    snprintf(r->dir, sizeof r->dir, "%s/s%ld", root, seq);
    snprintf(r->saved, sizeof r->saved, "%s/s%ld.index", root, seq);
    su_rm_rf(r->dir);
    su_rm_rf(r->saved);
    kvx_store_options o;
    su_options(&o, (su_spec){.page_bytes = PB, .capacity = 192u << 10, .shard_bytes = 64u << 10});
    int rc = kvx_store_create(&r->s, r->dir, &o);
    if (rc) fail_msg("create %s: %s (%s)", r->dir, kvx_err_name(rc), kvx_last_error());
    for (int b = 0; b < NB; b++) batch_create(r, b);
    int total = 0;
    for (int i = 0; i < NOPS; i++) total += op_weights[i];
    for (r->op = 0; r->op < nops && !r->failed && r->s; r->op++) {
        int w = (int)below(r, (uint32_t)total), op = 0;
        while (w >= op_weights[op]) w -= op_weights[op++];
        switch (op) {
        case O_WRITE: x_write_op(r); break;
        case O_REOPEN: op_recover(r, K_REOPEN); break;
        case O_REINDEX:
            if (below(r, 2)) /* else EBUSY while another batch has pending puts */
                for (int b = 1; b < NB; b++) x_flush(r, b);
            op_recover(r, K_REINDEX);
            break;
        case O_REINDEX_DIR: op_recover(r, K_REINDEX_DIR); break;
        case O_INDEX_GONE: op_recover(r, K_INDEX_GONE); break;
        case O_OLD_INDEX: op_recover(r, K_OLD_INDEX); break;
        case O_COPY: op_recover(r, K_COPY); break;
        case O_SWAP: op_recover(r, K_SWAP); break;
        case O_ROT: op_recover(r, K_ROT); break;
        case O_RO: op_ro_race(r); break;
        case O_KILL: op_kill(r); break;
        case O_SAVE:
            tr(r, "#%ld save index/", r->op);
            r_close(r);
            save_index(r);
            r_open(r);
            break;
        }
    }
    if (!r->failed && r->s) {
        for (int b = 0; b < NB; b++) x_flush(r, b);
        op_recover(r, K_FINAL);
    }
    int failed = r->failed;
    r_close(r);
    if (failed && r->new_class) /* a class not seen before */
        mu_trace_print_tail(&r->trace, "model", seed, seq, 80);
    if (failed)
        fprintf(stderr, "model: replay with KVX_MODEL_SEED=%" PRIu64 " KVX_MODEL_SEQ=%ld build/tests/system/model\n", seed, seq);
    if (!failed || !getenv("KVX_MODEL_KEEP")) {
        su_rm_rf(r->dir);
        su_rm_rf(r->saved);
    }
    mu_trace_free(&r->trace);
    free(r);
    return failed;
}

/* The store keeps its promises through a seeded mix of keyed puts,
 * deletes, re-puts from batches older than the delete, flushes, eviction,
 * gc and every recovery (reopen, reindex, reindex_dir, index/ lost or put
 * back old, shards copied in, renamed, rotted, a reader racing the
 * writer's recovery, kill -9 of a writer): after each, every key answers
 * its newest acknowledged version or, evicted or damaged, a miss; nothing
 * deleted or never acknowledged, nothing older than an answer before, a
 * cut operation whole or not at all. */
/* PROMISE: RECOVER-30 */
static void test_model_keyed(void **state)
{
    /* PROMISE: RECOVER-30 */
    (void)state;
    verbose = getenv("KVX_MODEL_VERBOSE") != NULL;
    mu_campaign camp = {
        .name = "model",
        .env = "KVX_MODEL",
        .seconds = 60,
        .n_kinds = NOPS,
        .op_names = op_names,
        .op_weights = op_weights,
        .n_batches = &n_batches,
        .max_batches = NB,
        .regressions = regressions,
        .n_regressions = sizeof regressions / sizeof regressions[0],
        .run_sequence = run_sequence,
    };
    long done, nops;
    double elapsed;
    long failed = mu_campaign_run(&camp, &done, &nops, &elapsed);
    fprintf(stderr,
            "model: %ld sequences of %ld operations, %ld failed, %.0f s; %ld checks of every key, %ld kills, %ld "
            "cut a flush or delete (%ld of those landed)\n",
            done, nops, failed, elapsed, n_checks, n_kills, n_cut, n_cut_landed);
    for (int c = 0; c < NCLS; c++)
        if (found[c].count)
            fprintf(stderr, "model: %s: %ld times; first seed %" PRIu64 " sequence %ld: %s\n", cls_name[c], found[c].count,
                    found[c].seed, found[c].seq, found[c].what);
    assert_int_equal(failed, 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_keyed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
