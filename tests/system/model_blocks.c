/*
 * model_blocks.c - a model-based test of a block store's recovery with
 * appends (tests/system/model.c's method, for token-named blocks): a seeded
 * generator runs operations against a block store and keeps, in memory,
 * which blocks the store acknowledged; after every recovery every sequence
 * the model knows is looked up, block by block and by prefix, and checked.
 *
 * Block stores append (docs/STORE.md "Appends: the active shard"): a flush
 * writes its batch's pages and one journal record into the active shard,
 * one batch owns it at a time, a batch that overflows it goes on in a file
 * of its own and its flush commits both under one mark. The sequences here
 * share prefixes (chains branch), run up to MAXNB blocks (more than an
 * active shard holds: batches overflow) and go to the built-in batch and
 * two created ones, so every one of those paths runs.
 *
 * Operations (weights in op_weights; a write is a put of a sequence's
 * leading blocks, a flush, gc or a batch destroyed): puts, flushes (the
 * acknowledgement), eviction under a small capacity (kvx_store_evicted
 * taken after every call), gc, destroying a batch, and the recoveries:
 * close and reopen, kvx_store_reindex, kvx_store_reindex_dir on the closed
 * store, index/ deleted, an older copy of index/ put back, a byte rotted in
 * a page, a read-only open racing the writer's recovery, kill -9 of a child
 * running a segment of operations (it reports every call and its result
 * through a pipe; the parent counts only what it was told was
 * acknowledged), and a child that stops without closing (its active file
 * left as a crash leaves it), after which the active file is cut at a
 * random offset (a torn file), grows by one byte, or has a page rotted.
 *
 * The checks, after each recovery, for every sequence and every block of
 * it: a served block is byte-exact (page = its hash's bytes) and was
 * acknowledged (never a block only put, nor one of a flush cut by a kill
 * that did not land); every acknowledged block is served unless it was
 * reported evicted or the test damaged its file (then a miss,
 * KVX_EPAGECRC, KVX_ETRUNC or KVX_ECORRUPT, never other bytes); the prefix
 * lookup serves exactly the leading blocks kvx_store_get_block serves; a
 * flush cut by the kill lands whole or not at all; kvx_store_verify finds
 * no problem outside the files the test damaged; no file the test left
 * intact (an active file included) is moved to quarantine/. A put's count
 * of new blocks (out_new) is checked against the model where it knows
 * which blocks are held.
 *
 *   KVX_MODELB_SEED=S      the seed (printed as "model_blocks: seed S")
 *   KVX_MODELB_SEQ=I       run only sequence I of that seed (a replay)
 *   KVX_MODELB_RUNS=N      at most N sequences
 *   KVX_MODELB_SECONDS=T   time budget (default 45, 120 under ASan)
 *   KVX_MODELB_OPS=N       operations per sequence (default 150)
 *   KVX_MODELB_DIR=D       scratch directory (default /dev/shm, else /tmp)
 *   KVX_MODELB_KEEP=1      keep a failing sequence's store
 *   KVX_MODELB_VERBOSE=1   print every operation
 *   KVX_MODELB_TRACE_LINES=N  print the last N lines of a failing sequence's
 *                          trace (default 80; verbose output changes a
 *                          kill's timing, this does not)
 *   KVX_MODELB_WEIGHTS=... the operation weights, in op_names' order
 *   KVX_MODELB_BATCHES=N   puts go to the first N batches (1..3)
 *
 * A sequence with a kill -9 does not replay exactly (the kill lands at a
 * time, not at a call); one whose crashes are all quiet ones does.
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

#define NQ 24    /* sequences per run */
#define NFAM 4   /* families: a sequence shares leading blocks with its family */
#define MAXNB 24 /* blocks a sequence has at most (about 96 KiB of file: over a shard) */
#define NBLK (NQ * MAXNB)
#define NB 3        /* batches: 0 the built-in one, 1 and 2 created */
#define WB 4u       /* tokens per block */
#define PAGE 1024u  /* page bytes: 2 * L2 * Hkv1 * D32 * B4 * 2 (crosses 512-byte sectors) */
#define PEND_MAX 60 /* blocks a batch holds before the model flushes it (far below the capacity) */
#define MAXSH 512

static kvx_geometry mb_geometry(void)
{
    kvx_geometry g = {2, 1, 32, WB, KVX_QUANT_FP16, 0x4d42c0ffee000001ull};
    return g;
}

/* ---- what can go wrong ---- */

enum {
    C_BYTES,      /* (w) */
    C_UNACKED,    /* (i) */
    C_LOST,       /* (e) */
    C_PREFIX,     /* (p) */
    C_PARTIAL,    /* (h) */
    C_SKIP,       /* (g) */
    C_VERIFY,     /* (v) */
    C_QUARANTINE, /* (d) */
    C_BLANKQ,     /* (d0) */
    C_CALL,       /* (x) */
    NCLS
};
static const char *const cls_name[NCLS] = {
    "(w) wrong bytes served",
    "(i) a never-acknowledged block served",
    "(e) an acknowledged block lost",
    "(p) the prefix lookup disagrees with kvx_store_get_block",
    "(h) a flush cut by kill -9 landed partly",
    "(g) a put's out_new disagrees with the model",
    "(v) kvx_store_verify reports a problem the test did not make",
    "(d) an intact file moved to quarantine/",
    "(d0) a crash's active file with nothing written yet (all zero or empty) moved to quarantine/, not removed",
    "(x) a store call failed",
};

static struct {
    long count;
    uint64_t seed;
    long seq;
    char what[240];
} found[NCLS];

/* Regression cases, run first: (seed, sequence) pairs whose sequence once
 * found a defect (tests/RUNS.md). */
static const mu_case regressions[] = {
    /* (e): a flush leaves the store over its capacity (520 KiB of 512),
     * then kvx_store_reindex_dir on the closed store evicts a shard of 14
     * acknowledged blocks that no report names (tests/RUNS.md) */
    {1021452746, 52},
    /* (g), the model's: a put into a batch that had skipped a block as
     * held, after that block's eviction, writes it (it fails about one run
     * in two: the kill's timing decides) */
    {756496731, 130},
};

/* ---- the model ---- */

enum { H_NO, H_YES, H_MAYBE }; /* is an acknowledged block held? */

typedef struct mseq {
    uint32_t fam, shared, nb, used;
    uint32_t tok[MAXNB * WB];
    uint64_t hash[MAXNB];
    int blk[MAXNB]; /* index in model.bl */
} mseq;

typedef struct mblk {
    uint64_t hash;
    int q, b;    /* the first sequence holding it, and where (its page says so) */
    int acked;   /* a flush of it was acknowledged (it may be served) */
    int held;    /* H_YES: must be served; H_MAYBE: may miss; H_NO: never acknowledged */
    int alt;     /* in a flush cut by a kill: acknowledged iff that flush landed */
    int damaged; /* a copy of it is in a file the test damaged: 1 + its index in run.dmg_gen */
} mblk;

typedef struct mbatch {
    int blk[NBLK];
    uint8_t nw[NBLK]; /* 1: written by the put; 2: written or skipped as held (unknown) */
    int n;
} mbatch;

typedef struct model {
    mseq q[NQ];
    mblk bl[NBLK];
    int nbl;
    mbatch b[NB];
} model;

enum { K_REOPEN, K_REINDEX, K_REINDEX_DIR, K_INDEX_GONE, K_OLD_INDEX, K_ROT, K_KILL, K_RO, K_FINAL };
static const char *const kind_name[] = {
    "reopen",      "reindex", "reindex_dir",    "index/ deleted", "old index/ put back",
    "page rotted", "crash",   "read-only race", "final reopen"};

/* Damage done to the files of a crashed writer before the next open. */
enum { D_NONE, D_TRUNC, D_APPEND, D_ROT };
static const char *const dmg_name[] = {"", ", active file cut", ", a byte appended to the active file",
                                       ", a page rotted"};

enum { M_PUT = 1, M_FLUSH_I, M_FLUSH_D, M_GC_I, M_GC_D, M_EV, M_EVALL, M_STAT, M_DROP, M_RO };
typedef struct msg {
    uint8_t type, batch;
    int16_t q;
    int32_t rc;
    uint64_t a; /* M_PUT: blocks put; M_EV: hash; M_RO: block index */
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
    uint32_t wflags; /* the writer's open flags: KVX_STORE_HOLES in every other sequence */
    int failed;
    int soft; /* a failure after which the sequence goes on (C_BLANKQ) */
    int new_class;
    int inf_type, inf_batch; /* the flush or gc in flight (a child's) */
    uint64_t last_evicted_blocks;
    char dmg_gen[64][17]; /* the generations of files the test damaged */
    int n_dmg;
    mu_trace trace;
} run;

static int verbose;
static int trace_lines = 80; /* of a failing sequence's trace, printed */
static long n_checks, n_must, n_served, n_kills, n_cut, n_cut_landed, n_trunc, n_append, n_rot, n_overflow;
static int n_batches = NB;

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
        fprintf(stderr, "model_blocks: child of seed %" PRIu64 " sequence %ld: %s\n", r->seed, r->seq, what);
        _exit(2);
    }
    if (cls == C_BLANKQ)
        r->soft = 1;
    else
        r->failed = 1;
    if (found[cls].count++ == 0) {
        found[cls].seed = r->seed;
        found[cls].seq = r->seq;
        snprintf(found[cls].what, sizeof found[cls].what, "%s", what);
        r->new_class = 1;
    }
    tr(r, "FAIL %s: %s", cls_name[cls], what);
    static long printed;
    if (r->new_class != 1 && printed >= 20) return;
    if (r->new_class == 1) r->new_class = 2;
    printed++;
    fprintf(stderr, "model_blocks: FAIL seed %" PRIu64 " sequence %ld op %ld: %s: %s\n", r->seed, r->seq, r->op,
            cls_name[cls], what);
}

/* ---- sequences and pages ---- */

/* The sequences of a run: family fam's tokens for blocks before shared,
 * the sequence's own after, so sequences of a family share a prefix of
 * the shorter shared length and branch there. */
static void make_sequences(run *r)
{
    model *m = &r->m;
    m->nbl = 0;
    for (int i = 0; i < NQ; i++) {
        mseq *q = &m->q[i];
        q->fam = (uint32_t)i % NFAM;
        q->nb = 1 + below(r, MAXNB);
        if (below(r, 3) == 0) q->nb = MAXNB - below(r, 4); /* long: over an active shard's room */
        q->shared = below(r, 4) ? below(r, q->nb + 1) : 0;
        if (q->shared > 10) q->shared = 10;
        q->used = 0;
        for (uint32_t b = 0; b < q->nb; b++)
            for (uint32_t j = 0; j < WB; j++) {
                uint64_t base = b < q->shared ? q->fam : 1000u + (uint64_t)i;
                q->tok[b * WB + j] = (uint32_t)su_mix((r->seed << 20) ^ (base * 131 + b * 7 + j));
            }
        kvx_block_hashes(q->hash, q->tok, (size_t)q->nb * WB, WB);
        for (uint32_t b = 0; b < q->nb; b++) {
            int k = -1;
            for (int x = 0; x < m->nbl && k < 0; x++)
                if (m->bl[x].hash == q->hash[b]) k = x;
            if (k < 0) {
                k = m->nbl++;
                memset(&m->bl[k], 0, sizeof m->bl[k]);
                m->bl[k].hash = q->hash[b];
                m->bl[k].q = i;
                m->bl[k].b = (int)b;
            }
            q->blk[b] = k;
        }
    }
}

static int blk_of_hash(const model *m, uint64_t h)
{
    for (int x = 0; x < m->nbl; x++)
        if (m->bl[x].hash == h) return x;
    return -1;
}

/* The page of a block: its hash, the sequence and index that first hold
 * it, then bytes of the hash: a function of the hash alone, as a block
 * store's dedup requires (two batches may write the same block). */
static void page_fill(uint8_t *p, const mblk *k)
{
    uint32_t q = (uint32_t)k->q, b = (uint32_t)k->b;
    memcpy(p, &k->hash, 8);
    memcpy(p + 8, &q, 4);
    memcpy(p + 12, &b, 4);
    su_page(p + 16, PAGE - 16, k->hash ^ 0x4d4f44454c42ull);
}

/* A served view is block k, byte for byte. */
static int view_ok(const model *m, const kvx_view *v, int k)
{
    static uint8_t want[PAGE];
    if (v->hash != m->bl[k].hash || v->page_bytes != PAGE || v->token_count != WB) return 0;
    page_fill(want, &m->bl[k]);
    return memcmp(v->page, want, PAGE) == 0;
}

/* ---- the model's rules ---- */

/* Where block k is pending in batch b (its index there), or -1. */
static int pending_at(const mbatch *b, int k)
{
    for (int i = 0; i < b->n; i++)
        if (b->blk[i] == k) return i;
    return -1;
}

static void m_drop(model *m, int b) { m->b[b].n = 0; }

static void m_flush(model *m, int b)
{
    mbatch *mb = &m->b[b];
    for (int i = 0; i < mb->n; i++) {
        mblk *k = &m->bl[mb->blk[i]];
        k->acked = 1; /* a damaged copy stays: it may still answer (damaged stays) */
        k->held = mb->nw[i] == 1 ? H_YES : (k->held == H_YES ? H_YES : H_MAYBE);
    }
    mb->n = 0;
}

static void tr_msg(run *r, const msg *x)
{
    switch (x->type) {
    case M_PUT:
        tr(r, "#%ld put b%d q%d[0..%" PRIu64 ") rc %d new %" PRIu64, r->op, x->batch, x->q, x->a, x->rc, x->extra);
        break;
    case M_FLUSH_D: tr(r, "#%ld flush b%d rc %d (%d blocks)", r->op, x->batch, x->rc, (int)x->extra); break;
    case M_GC_D: tr(r, "#%ld gc rc %d", r->op, x->rc); break;
    case M_EV: tr(r, "#%ld   evicted %016" PRIx64, r->op, x->a); break;
    case M_EVALL: tr(r, "#%ld   evicted report dropped %" PRIu64, r->op, x->extra); break;
    case M_DROP: tr(r, "#%ld destroy b%d", r->op, x->batch); break;
    default: break;
    }
}

static void apply(run *r, const msg *x)
{
    model *m = &r->m;
    int judge = r->child_fd < 0;
    tr_msg(r, x);
    switch (x->type) {
    case M_PUT: {
        if (x->rc) break;
        mseq *q = &m->q[x->q];
        mbatch *b = &m->b[x->batch];
        q->used = 1;
        int first = b->n, lo = 0, maybe = 0;
        int again[MAXNB], n_again = 0; /* earlier entries of this batch the put may write again */
        for (uint32_t i = 0; i < (uint32_t)x->a; i++) {
            int k = q->blk[i];
            int at = pending_at(b, k);
            if (at >= 0 && b->nw[at] == 1) continue; /* written into the same batch: skipped */
            if (at >= 0) {
                /* an earlier put of this batch wrote it or skipped it as
                 * held; if it skipped it and the held copy has since been
                 * evicted, this put writes it (seed 756496731, sequence
                 * 130: "wrote 2 blocks, the model says 0..0") */
                if (n_again < MAXNB) again[n_again++] = at;
                maybe++;
                continue;
            }
            mblk *bk = &m->bl[k];
            /* held: skipped. A block with a damaged copy may be "held" by
             * that copy alone (an eviction of its sound copy is not
             * reported while the damaged one lives), and a damaged copy is
             * not held: the put may write it */
            if (bk->acked && bk->held == H_YES && !bk->damaged) continue;
            b->blk[b->n] = k;
            b->nw[b->n++] = bk->acked ? 2 : 1; /* H_MAYBE: held or not */
            if (bk->acked)
                maybe++;
            else
                lo++;
        }
        uint64_t got = x->extra;
        if (judge && (got < (uint64_t)lo || got > (uint64_t)(lo + maybe))) {
            bad(r, C_SKIP, "put of q%d[0..%" PRIu64 ") into b%d wrote %" PRIu64 " blocks, the model says %d..%d", x->q,
                x->a, x->batch, got, lo, lo + maybe);
            for (uint32_t i = 0; i < (uint32_t)x->a; i++) {
                const mblk *bk = &m->bl[q->blk[i]];
                tr(r, "#%ld   q%d[%u] %016" PRIx64 " acked %d held %d damaged %d", r->op, x->q, i, bk->hash, bk->acked,
                   bk->held, bk->damaged);
            }
        }
        if (maybe && got == (uint64_t)(lo + maybe))
            for (int i = 0; i < n_again; i++) b->nw[again[i]] = 1; /* each was written now */
        if (maybe && got == (uint64_t)lo) { /* every new maybe was held (sound: the put pinned it) */
            int w = first;
            for (int i = first; i < b->n; i++) {
                if (b->nw[i] == 2) {
                    m->bl[b->blk[i]].held = H_YES;
                    continue;
                }
                b->blk[w] = b->blk[i];
                b->nw[w++] = b->nw[i];
            }
            b->n = w;
        } else if (maybe && got == (uint64_t)(lo + maybe)) {
            for (int i = first; i < b->n; i++) b->nw[i] = 1;
        }
        break;
    }
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
    case M_GC_I: r->inf_type = M_GC_I; break;
    case M_GC_D: r->inf_type = 0; break;
    case M_EV: {
        int k = blk_of_hash(m, x->a);
        if (k >= 0 && m->bl[k].acked) m->bl[k].held = H_MAYBE;
        break;
    }
    case M_EVALL:
        for (int k = 0; k < m->nbl; k++)
            if (m->bl[k].acked) m->bl[k].held = H_MAYBE;
        break;
    case M_STAT: r->last_evicted_blocks = x->extra; break;
    case M_DROP: m_drop(m, x->batch); break;
    default: break;
    }
}

static void emit(run *r, int type, int batch, int q, int rc, uint64_t a, uint64_t extra)
{
    msg x;
    memset(&x, 0, sizeof x);
    x.type = (uint8_t)type;
    x.batch = (uint8_t)batch;
    x.q = (int16_t)q;
    x.rc = rc;
    x.a = a;
    x.extra = extra;
    if (r->child_fd >= 0 && write(r->child_fd, &x, sizeof x) != (ssize_t)sizeof x) _exit(3);
    apply(r, &x);
}

/* ---- the store calls ---- */

static void take_evicted(run *r)
{
    static kvx_evicted ev[64];
    for (;;) {
        size_t n = 0;
        uint64_t dropped = 0;
        int rc = kvx_store_evicted(r->s, ev, 64, &n, &dropped);
        if (rc) {
            bad(r, C_CALL, "kvx_store_evicted: %s (%s)", kvx_err_name(rc), kvx_last_error());
            return;
        }
        if (dropped) emit(r, M_EVALL, 0, 0, 0, 0, dropped);
        for (size_t i = 0; i < n; i++) emit(r, M_EV, 0, 0, 0, ev[i].hash, 0);
        if (n < 64) break;
    }
    kvx_store_stats st;
    if (kvx_store_stat(&st, r->s) == 0) emit(r, M_STAT, 0, 0, 0, 0, st.evicted_blocks);
}

static int batch_create(run *r, int b)
{
    r->m.b[b].n = 0;
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
    int rc = kvx_store_open(&r->s, r->dir, NULL, r->wflags);
    if (rc) {
        r->s = NULL;
        bad(r, C_CALL, "open: %s (%s)", kvx_err_name(rc), kvx_last_error());
        return rc;
    }
    kvx_recovery_report rep;
    if (r->child_fd < 0 && kvx_store_recovery(r->s, &rep) == 0 &&
        (rep.rebuilt || rep.quarantined || rep.deleted_unacked || rep.deleted_dropped))
        tr(r,
           "#%ld   open: rebuilt %" PRIu64 ", kept %" PRIu64 " files, %" PRIu64 " blocks; quarantined %" PRIu64
           ", deleted %" PRIu64 " unacknowledged, %" PRIu64 " dropped",
           r->op, rep.rebuilt, rep.shards_kept, rep.blocks_indexed, rep.quarantined, rep.deleted_unacked,
           rep.deleted_dropped);
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

static void x_flush(run *r, int b)
{
    int n = r->m.b[b].n;
    emit(r, M_FLUSH_I, b, 0, 0, 0, 0);
    int rc = b ? kvx_store_batch_flush(r->bh[b]) : kvx_store_flush(r->s);
    if (rc) bad(r, C_CALL, "flush b%d: %s (%s)", b, kvx_err_name(rc), kvx_last_error());
    emit(r, M_FLUSH_D, b, 0, rc, 0, (uint64_t)n);
    take_evicted(r);
}

static void x_put(run *r, int b, int qi, uint32_t nb)
{
    static uint8_t pages[MAXNB * PAGE];
    mseq *q = &r->m.q[qi];
    if (r->m.b[b].n + (int)nb > PEND_MAX) x_flush(r, b); /* the capacity holds what a flush acknowledges */
    for (uint32_t i = 0; i < nb; i++) page_fill(pages + (size_t)i * PAGE, &r->m.bl[q->blk[i]]);
    size_t out_new = 999;
    int rc = b ? kvx_store_batch_put(r->bh[b], q->tok, (size_t)nb * WB, pages, nb, NULL, &out_new)
               : kvx_store_put(r->s, q->tok, (size_t)nb * WB, pages, nb, NULL, &out_new);
    if (rc && rc != KVX_ECAPACITY)
        bad(r, C_CALL, "put q%d[0..%u) b%d: %s (%s)", qi, nb, b, kvx_err_name(rc), kvx_last_error());
    /* the put's own evictions first (a sealed file over the capacity evicts
     * published shards mid-put, and a held block of this very sequence in
     * one is then written again): the model must know them before it
     * judges out_new (seed 321225054, sequence 6: "wrote 14, the model
     * says 0..0", its evictions reported after) */
    take_evicted(r);
    emit(r, M_PUT, b, qi, rc, nb, rc ? 0 : out_new);
    if (rc == 0 && out_new > 16) n_overflow++;
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

/* One writer operation (in the parent, or in a child to be killed). */
static void x_write_op(run *r)
{
    uint32_t w = below(r, 100);
    if (w < 58) {
        int qi = (int)below(r, NQ);
        uint32_t nb = r->m.q[qi].nb;
        if (below(r, 3) == 0) nb = 1 + below(r, nb); /* a shorter prefix of it */
        x_put(r, (int)below(r, (uint32_t)n_batches), qi, nb);
    } else if (w < 88) {
        x_flush(r, (int)below(r, (uint32_t)n_batches));
    } else if (w < 95) {
        x_gc(r);
    } else if (n_batches > 1) {
        x_drop_batch(r, 1 + (int)below(r, (uint32_t)n_batches - 1));
    }
}

/* ---- files ---- */

/* The signatures of the shard files in dir/sub (active ones included;
 * quarantine/'s notes left out). */
static size_t sigs_of(run *r, const char *sub, uint64_t *out, char (*gens)[17], int *blank, size_t max)
{
    static char names[MAXSH][64];
    size_t n = su_list_names(r->dir, sub, names, MAXSH), k = 0;
    for (size_t i = 0; i < n && k < max; i++) {
        if (strstr(names[i], ".why") || !strstr(names[i], ".kvx")) continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s/%.63s", r->dir, sub, names[i]);
        snprintf(gens[k], 17, "%.16s", names[i] + (names[i][0] == '.'));
        blank[k] = 0;
        out[k] = su_file_sig(p, strstr(names[i], ".active") ? &blank[k] : NULL);
        k++;
    }
    return k;
}

typedef struct filesnap {
    uint64_t sh[MAXSH], q[MAXSH];
    char shgen[MAXSH][17], qgen[MAXSH][17];
    int shblank[MAXSH], qblank[MAXSH]; /* an active file with nothing written yet */
    size_t nsh, nq;
} filesnap;

static void snap(run *r, filesnap *f)
{
    f->nsh = sigs_of(r, "shards", f->sh, f->shgen, f->shblank, MAXSH);
    f->nq = sigs_of(r, "quarantine", f->q, f->qgen, f->qblank, MAXSH);
}

/* (d): a file whose bytes were in shards/ before the recovery, untouched
 * by the test since, is now in quarantine/ (and not in shards/). A file
 * the test damaged has other bytes than its signature before. */
static void check_quarantine(run *r, const filesnap *before, const char *after_what)
{
    static filesnap after;
    snap(r, &after);
    for (size_t i = 0; i < before->nsh; i++) {
        uint64_t x = before->sh[i];
        if (mu_has_sig(after.sh, after.nsh, x)) continue;
        int damaged = 0;
        for (int d = 0; d < r->n_dmg; d++) damaged |= !strcmp(r->dmg_gen[d], before->shgen[i]);
        if (damaged) continue; /* the test damaged it (maybe before this recovery) */
        if (mu_has_sig(after.q, after.nq, x) && !mu_has_sig(before->q, before->nq, x) && before->shblank[i])
            bad(r, C_BLANKQ,
                "after %s the active file of generation %s, all zero or empty (nothing acknowledged in it), "
                "is in quarantine/",
                after_what, before->shgen[i]);
        else if (mu_has_sig(after.q, after.nq, x) && !mu_has_sig(before->q, before->nq, x))
            bad(r, C_QUARANTINE,
                "after %s a file the test left intact (%s, signature %016" PRIx64 ") is in quarantine/", after_what,
                before->shgen[i], x);
    }
}

static void save_index(run *r)
{
    if (mu_save_index(r->dir, r->saved) == 0) r->have_saved = 1;
}

static void put_old_index(run *r) { mu_put_old_index(r->dir, r->saved); }

/* The generation of the file at path joins the damaged ones: its index. */
static int note_damaged(run *r, const char *path)
{
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (*name == '.') name++;
    char gen[17];
    snprintf(gen, sizeof gen, "%.16s", name);
    for (int i = 0; i < r->n_dmg; i++)
        if (!strcmp(r->dmg_gen[i], gen)) return i;
    if (r->n_dmg == 64) return 63; /* a bound never reached in 150 operations */
    memcpy(r->dmg_gen[r->n_dmg], gen, 17);
    return r->n_dmg++;
}

/* Is a file of generation gen (16 hex) in dir/sub, sealed or active? */
static int gen_in(run *r, const char *sub, const char *gen)
{
    static char names[MAXSH][64];
    size_t n = su_list_names(r->dir, sub, names, MAXSH);
    for (size_t i = 0; i < n; i++)
        if (strstr(names[i], gen) && !strstr(names[i], ".why")) return 1;
    return 0;
}

/* The pages of a shard file (sealed or active) found by their bytes: a
 * page lies at a 4096-aligned offset and begins with its block's hash and
 * place (page_fill), so this needs neither the file's tables nor the
 * catalog (a crash's active file may hold records the catalog does not
 * name yet, and pages past its last record). Up to max of them: the
 * block in blk, the offset in off. */
static int file_pages(run *r, const char *path, int *blk, uint64_t *off, int max)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    uint8_t head[16];
    int n = 0;
    for (uint64_t at = 0; n < max && pread(fd, head, 16, (off_t)at) == 16; at += 4096) {
        uint64_t h;
        uint32_t q, b;
        memcpy(&h, head, 8);
        memcpy(&q, head + 8, 4);
        memcpy(&b, head + 12, 4);
        int k = blk_of_hash(&r->m, h);
        if (k < 0 || r->m.bl[k].q != (int)q || r->m.bl[k].b != (int)b) continue;
        blk[n] = k;
        off[n++] = at;
    }
    close(fd);
    return n;
}

/* A shard file of shards/ (an active one when active_only): its path in
 * out; 0 when there is none. */
static int choose_file(run *r, char *out, size_t cap, int active_only)
{
    static char names[MAXSH][64];
    size_t n = su_list_names(r->dir, "shards", names, MAXSH), k = 0;
    for (size_t i = 0; i < n; i++) {
        int act = strstr(names[i], ".kvx.active") != NULL;
        int std = strlen(names[i]) == 20 && !strcmp(names[i] + 16, ".kvx");
        if (act || (std && !active_only)) memmove(names[k++], names[i], 64);
    }
    if (!k) return 0;
    snprintf(out, cap, "%s/shards/%.63s", r->dir, names[below(r, (uint32_t)k)]);
    return 1;
}

/* Every block with a page in the file may miss from now on. */
static void mark_file(run *r, const char *path, int idx)
{
    static int blk[4096];
    static uint64_t off[4096];
    int n = file_pages(r, path, blk, off, 4096);
    for (int i = 0; i < n; i++) {
        mblk *k = &r->m.bl[blk[i]];
        k->damaged = 1 + idx;
        if (k->acked) k->held = H_MAYBE;
    }
}

/* Flips a bit of one page (of an active file too): that block may now
 * miss or be KVX_EPAGECRC, never other bytes. */
static void rot_page(run *r, int active_only)
{
    static int blk[4096];
    static uint64_t off[4096];
    char p[1024];
    int n = choose_file(r, p, sizeof p, active_only) ? file_pages(r, p, blk, off, 4096) : 0;
    if (!n) {
        tr(r, "#%ld   no page to rot", r->op);
        return;
    }
    int i = (int)below(r, (uint32_t)n);
    uint64_t at = off[i] + below(r, PAGE);
    int fd = open(p, O_RDWR);
    uint8_t c;
    if (fd >= 0 && pread(fd, &c, 1, (off_t)at) == 1) {
        c ^= (uint8_t)(1u << below(r, 8));
        if (pwrite(fd, &c, 1, (off_t)at) == 1) {
            mblk *k = &r->m.bl[blk[i]];
            k->damaged = 1 + note_damaged(r, p);
            if (k->acked) k->held = H_MAYBE;
            n_rot++;
            tr(r, "#%ld   rot %s block %016" PRIx64 " at %" PRIu64, r->op, strrchr(p, '/') + 1, k->hash, at);
        }
    }
    if (fd >= 0) close(fd);
}

/* The active file a crash left: cut at a random offset (often within the
 * last pages: a torn tail), or grown by one byte. A cut may take records
 * that were acknowledged: every block of the file may then miss (damage),
 * never be served with other bytes. One byte appended takes nothing. */
static void damage_active(run *r, int how)
{
    char p[1024];
    if (!choose_file(r, p, sizeof p, 1)) {
        tr(r, "#%ld   no active file to damage", r->op);
        return;
    }
    struct stat st;
    if (stat(p, &st)) return;
    uint64_t size = (uint64_t)st.st_size, at;
    if (how == D_TRUNC) {
        if (size == 0) return;
        at = below(r, 2) ? size - 1 - below(r, (uint32_t)(size < 16384 ? size : 16384)) : below(r, (uint32_t)size);
        mark_file(r, p, note_damaged(r, p));
        if (truncate(p, (off_t)at)) return;
        n_trunc++;
        tr(r, "#%ld   cut %s from %" PRIu64 " to %" PRIu64 " bytes", r->op, strrchr(p, '/') + 1, size, at);
    } else {
        /* nothing acknowledged is touched: its blocks stay as they were */
        int fd = open(p, O_WRONLY | O_APPEND);
        uint8_t c = (uint8_t)below(r, 256);
        int ok = fd >= 0 && write(fd, &c, 1) == 1;
        if (fd >= 0) close(fd);
        n_append += ok;
        tr(r, "#%ld   one byte appended to %s (%" PRIu64 " bytes): %d", r->op, strrchr(p, '/') + 1, size, ok);
    }
}

/* ---- the check ---- */

typedef struct verify_ctx {
    run *r;
    const char *after;
    int n;
} verify_ctx;

static void verify_report(void *ctx, const char *what, int code)
{
    verify_ctx *v = ctx;
    run *r = v->r;
    if (code == 0) return; /* a note, not a problem */
    for (int i = 0; i < r->n_dmg; i++)
        if (strstr(what, r->dmg_gen[i])) {
            tr(r, "#%ld   verify: %s (%s): a file the test damaged", r->op, what, kvx_err_name(code));
            return;
        }
    if (v->n++ < 4) bad(r, C_VERIFY, "after %s verify: %s (%s)", v->after, what, kvx_err_name(code));
}

static int ok_miss(int rc)
{
    return rc == KVX_ENOTFOUND || rc == KVX_EPAGECRC || rc == KVX_ETRUNC || rc == KVX_ECORRUPT;
}

/* Every sequence looked up, every block judged. budget: acknowledged
 * blocks the store may have evicted without a report reaching the model
 * (an eviction cut by a kill). */
static void check_all(run *r, const char *after, uint64_t budget)
{
    model *m = &r->m;
    static uint8_t served[NBLK], asked[NBLK];
    static int rcs[NBLK];
    memset(served, 0, sizeof served);
    memset(asked, 0, sizeof asked);
    n_checks++;
    for (int qi = 0; qi < NQ; qi++) {
        mseq *q = &m->q[qi];
        if (!q->used) continue;
        uint32_t lead = 0, stop = 0;
        for (uint32_t b = 0; b < q->nb; b++) {
            int k = q->blk[b];
            mblk *bk = &m->bl[k];
            kvx_view v;
            memset(&v, 0, sizeof v);
            int rc = kvx_store_get_block(&v, r->s, q->tok, (size_t)(b + 1) * WB);
            if (rc == 0) {
                if (!view_ok(m, &v, k))
                    bad(r, C_BYTES, "after %s block %u of q%d (%016" PRIx64 ") served with other bytes%s", after, b, qi,
                        bk->hash, bk->damaged ? " (its file was damaged)" : "");
                else if (!bk->acked && !bk->alt)
                    bad(r, C_UNACKED, "after %s block %u of q%d (%016" PRIx64 ") served, never acknowledged", after, b,
                        qi, bk->hash);
                kvx_view_release(&v);
                served[k] = 1;
                if (!stop) lead++;
            } else {
                stop = 1;
                if (!ok_miss(rc) && rc != -ENOENT)
                    bad(r, C_CALL, "after %s get_block %u of q%d: %s (%s)", after, b, qi, kvx_err_name(rc),
                        kvx_last_error());
            }
            asked[k] = 1;
            rcs[k] = rc;
            n_must += bk->acked && bk->held == H_YES && !bk->damaged; /* asked, must be served */
            n_served += rc == 0;
        }
        kvx_view vs[MAXNB];
        size_t n = 0;
        int rc = kvx_store_prefix(vs, &n, r->s, q->tok, (size_t)q->nb * WB, q->nb);
        if (rc) {
            bad(r, C_CALL, "after %s prefix of q%d: %s (%s)", after, qi, kvx_err_name(rc), kvx_last_error());
            continue;
        }
        for (size_t i = 0; i < n; i++)
            if (!view_ok(m, &vs[i], q->blk[i]))
                bad(r, C_BYTES, "after %s the prefix of q%d serves block %zu with other bytes", after, qi, i);
        kvx_views_release(vs, n);
        if (n != lead)
            bad(r, C_PREFIX, "after %s the prefix of q%d serves %zu blocks, get_block the first %u of %u", after, qi, n,
                lead, q->nb);
    }
    /* a flush cut by the kill: whole or not at all (its blocks the model
     * saw as new: acknowledged only if it landed) */
    int n_new = 0, n_not = 0;
    for (int k = 0; k < m->nbl; k++) {
        mblk *bk = &m->bl[k];
        if (!bk->alt || bk->acked || !asked[k]) continue;
        if (served[k])
            n_new++; /* landed (damage takes blocks away, never adds) */
        else if (!bk->damaged)
            n_not++;
    }
    int alt_any = 0;
    for (int k = 0; k < m->nbl; k++) alt_any |= m->bl[k].alt;
    if (alt_any) {
        n_cut++;
        n_cut_landed += n_new > 0;
        if (n_new && (uint64_t)n_not > budget)
            bad(r, C_PARTIAL, "after %s the cut flush shows %d of its new blocks, not %d (eviction budget %" PRIu64 ")",
                after, n_new, n_not, budget);
        tr(r, "#%ld   the cut flush %s (%d new blocks served, %d not)", r->op, n_new ? "landed" : "did not land", n_new,
           n_not);
    }
    for (int k = 0; k < m->nbl; k++) {
        mblk *bk = &m->bl[k];
        if (!bk->alt) continue;
        if (n_new) {
            if (!bk->acked || bk->held != H_YES) bk->held = served[k] ? H_YES : H_MAYBE;
            bk->acked = 1;
        }
        bk->alt = 0;
    }
    /* every acknowledged block held is served */
    int lost[NBLK], nl = 0;
    for (int k = 0; k < m->nbl; k++) {
        mblk *bk = &m->bl[k];
        if (!asked[k] || !bk->acked) continue;
        if (served[k]) {
            if (bk->held == H_MAYBE && !bk->damaged) bk->held = H_YES; /* held now: must stay */
            continue;
        }
        if (bk->held == H_YES && bk->damaged && ok_miss(rcs[k])) {
            /* re-put and acknowledged after the test damaged a copy: an
             * eviction of the sound copy is not reported while the damaged
             * one lives (kvx_store_evicted: "no live shard holds it") */
            tr(r, "#%ld   %016" PRIx64 " is %s: a copy in %s, which the test damaged", r->op, bk->hash,
               kvx_err_name(rcs[k]), r->dmg_gen[bk->damaged - 1]);
            bk->held = H_MAYBE;
        } else if (bk->held == H_YES)
            lost[nl++] = k;
        else if (bk->held == H_MAYBE && !ok_miss(rcs[k]) && rcs[k] != -ENOENT)
            bad(r, C_CALL, "after %s block %016" PRIx64 " (may miss): %s", after, bk->hash, kvx_err_name(rcs[k]));
    }
    if ((uint64_t)nl <= budget) {
        for (int i = 0; i < nl; i++) m->bl[lost[i]].held = H_MAYBE;
        if (nl)
            tr(r, "#%ld   %d blocks missing within an interrupted eviction (budget %" PRIu64 ")", r->op, nl, budget);
    } else {
        for (int i = 0; i < nl && i < 8; i++) {
            mblk *bk = &m->bl[lost[i]];
            bad(r, C_LOST,
                "after %s block %d of q%d (%016" PRIx64 ", acknowledged) is %s (%d lost, budget %" PRIu64 ")", after,
                bk->b, bk->q, bk->hash, kvx_err_name(rcs[lost[i]]), nl, budget);
        }
        for (int i = 0; i < nl; i++) m->bl[lost[i]].held = H_MAYBE; /* report each once */
    }
    /* a damaged copy gone from shards/ answers no more */
    for (int k = 0; k < m->nbl; k++)
        if (m->bl[k].damaged && !gen_in(r, "shards", r->dmg_gen[m->bl[k].damaged - 1])) m->bl[k].damaged = 0;
    verify_ctx v = {r, after, 0};
    uint64_t nbad = 0;
    int rc = kvx_store_verify(r->s, &nbad, verify_report, &v);
    if (rc && !nbad) bad(r, C_CALL, "after %s verify: %s (%s)", after, kvx_err_name(rc), kvx_last_error());
}

/* ---- recoveries ---- */

/* Closed store: the damage of kind (or none), then a writer's open. */
static int damage(run *r, int kind)
{
    char idx[1024];
    switch (kind) {
    case K_REINDEX_DIR: {
        kvx_recovery_report rep;
        memset(&rep, 0, sizeof rep);
        int rc = kvx_store_reindex_dir_report(r->dir, 0, &rep);
        tr(r,
           "#%ld   reindex_dir: %s (kept %" PRIu64 " files, %" PRIu64 " blocks; quarantined %" PRIu64
           ", deleted %" PRIu64 " unacknowledged, %" PRIu64 " dropped)",
           r->op, kvx_err_name(rc), rep.shards_kept, rep.blocks_indexed, rep.quarantined, rep.deleted_unacked,
           rep.deleted_dropped);
        if (rc) bad(r, C_CALL, "reindex_dir: %s (%s)", kvx_err_name(rc), kvx_last_error());
        return rc;
    }
    case K_INDEX_GONE:
        snprintf(idx, sizeof idx, "%s/index", r->dir);
        su_rm_rf(idx);
        return 0;
    case K_OLD_INDEX: put_old_index(r); return 0;
    case K_ROT: rot_page(r, 0); return 0;
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
        if (!r->failed) check_all(r, kind_name[kind], 0);
        return;
    }
    r_close(r);
    if (kind != K_OLD_INDEX && (below(r, 3) == 0 || !r->have_saved)) save_index(r);
    if (kind == K_OLD_INDEX && !r->have_saved) kind = K_REOPEN;
    static filesnap before;
    snap(r, &before);
    if (damage(r, kind) || r_open(r)) return;
    check_quarantine(r, &before, kind_name[kind]);
    check_all(r, kind_name[kind], 0);
}

/* A read-only open, in a child, racing the writer's recovery: a block it
 * serves must be acknowledged and byte-exact (it may miss). */
static void op_ro_race(run *r)
{
    int kinds[] = {K_REOPEN, K_INDEX_GONE, K_OLD_INDEX, K_REINDEX_DIR};
    int kind = kinds[below(r, 4)];
    tr(r, "#%ld read-only race after %s", r->op, kind_name[kind]);
    r_close(r);
    if (kind == K_OLD_INDEX && !r->have_saved) kind = K_REOPEN;
    static filesnap before;
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
            if (read(stop[0], &c, 1) >= 0) break;
            kvx_store *s = NULL;
            if (kvx_store_open(&s, r->dir, NULL, KVX_STORE_READONLY) != 0) continue;
            for (int qi = 0; qi < NQ && sent < 16; qi++) {
                mseq *q = &r->m.q[qi];
                if (!q->used) continue;
                kvx_view vs[MAXNB];
                size_t n = 0;
                if (kvx_store_prefix(vs, &n, s, q->tok, (size_t)q->nb * WB, q->nb)) continue;
                for (size_t i = 0; i < n && sent < 16; i++) {
                    int k = q->blk[i], ok = view_ok(&r->m, &vs[i], k);
                    if (!ok || !r->m.bl[k].acked) {
                        msg x = {M_RO, (uint8_t)ok, (int16_t)qi, 0, i, (uint64_t)round};
                        if (write(res[1], &x, sizeof x) != (ssize_t)sizeof x) _exit(3);
                        sent++;
                    }
                }
                kvx_views_release(vs, n);
            }
            kvx_store_close(s);
        }
        _exit(0);
    }
    close(res[1]);
    close(stop[0]);
    if (kind == K_REINDEX_DIR) damage(r, kind);
    int opened = r_open(r) == 0;
    if (opened) check_quarantine(r, &before, kind_name[kind]);
    if (opened) check_all(r, kind_name[kind], 0);
    if (write(stop[1], "x", 1) != 1) { /* the reader is gone already */
    }
    close(stop[1]);
    int status;
    waitpid(pid, &status, 0);
    msg x;
    while (read(res[0], &x, sizeof x) == (ssize_t)sizeof x) {
        if (!x.batch)
            bad(r, C_BYTES, "a reader racing %s served block %" PRIu64 " of q%d with other bytes", kind_name[kind], x.a,
                x.q);
        else
            bad(r, C_UNACKED,
                "a reader racing %s (round %" PRIu64 ") served block %" PRIu64 " of q%d, never acknowledged",
                kind_name[kind], x.extra, x.a, x.q);
    }
    close(res[0]);
}

/* A child runs a segment of writer operations: kill -9 at a random time
 * (kill), or it stops without closing after its last (a crash at a quiet
 * point). Then the files a crash left may be damaged (dmg), and a writer
 * opens. */
static void op_crash(run *r, int kill_it, int dmg)
{
    tr(r, "#%ld %s segment%s", r->op, kill_it ? "kill -9" : "crash", dmg_name[dmg]);
    r_close(r);
    int fds[2];
    if (pipe(fds)) {
        bad(r, C_CALL, "pipe: %s", strerror(errno));
        return;
    }
    uint64_t child_seed = rnd(r);
    int nops = 10 + (int)below(r, 50);
    uint32_t delay_us = below(r, 15000);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        r->child_fd = fds[1];
        r->rng = child_seed | 1;
        if (r_open(r)) _exit(2);
        for (int i = 0; i < (kill_it ? 200 : nops); i++) x_write_op(r);
        if (kill_it) r_close(r);
        _exit(0); /* without a close: the active file stays as a crash leaves it */
    }
    close(fds[1]);
    r->inf_type = 0;
    double end = mu_now_s() + delay_us * 1e-6;
    int killed = !kill_it;
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
        if (n <= 0) break;
        if (n == (ssize_t)sizeof x) apply(r, &x);
    }
    int status;
    waitpid(pid, &status, 0);
    close(fds[0]);
    n_kills += WIFSIGNALED(status);
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        bad(r, C_CALL, "the child exited %d (a store call failed there)", WEXITSTATUS(status));
    tr(r, "#%ld   %s, in flight: %s b%d (%d blocks)", r->op, WIFSIGNALED(status) ? "killed" : "finished",
       r->inf_type == M_FLUSH_I ? "flush"
       : r->inf_type == M_GC_I  ? "gc"
                                : "nothing",
       r->inf_batch, r->inf_type == M_FLUSH_I ? r->m.b[r->inf_batch].n : 0);
    if (r->inf_type == M_FLUSH_I) { /* it landed whole or not at all */
        mbatch *b = &r->m.b[r->inf_batch];
        for (int i = 0; i < b->n; i++) r->m.bl[b->blk[i]].alt = 1;
    }
    for (int b = 0; b < NB; b++) m_drop(&r->m, b);
    uint64_t told = r->last_evicted_blocks;
    static filesnap before;
    snap(r, &before);
    if (dmg == D_TRUNC || dmg == D_APPEND) damage_active(r, dmg);
    if (dmg == D_ROT) rot_page(r, below(r, 2));
    if (r_open(r)) return;
    check_quarantine(r, &before, "a crash");
    kvx_store_stats st;
    uint64_t budget = 0;
    if (kvx_store_stat(&st, r->s) == 0)
        budget = st.evicted_blocks < told ? st.evicted_blocks : st.evicted_blocks - told;
    /* a cut or a kill during a flush's eviction: a rebuilt index counts
     * from 0, so the budget is at most what the store counted */
    check_all(r, kill_it ? "kill -9" : "crash", budget);
    r->inf_type = 0;
}

/* ---- one sequence ---- */

enum {
    O_WRITE,
    O_REOPEN,
    O_REINDEX,
    O_REINDEX_DIR,
    O_INDEX_GONE,
    O_OLD_INDEX,
    O_ROT,
    O_RO,
    O_KILL,
    O_CUT,
    O_GROW,
    O_CRASH_ROT,
    O_SAVE,
    NOPS
};
static int op_weights[NOPS] = {80, 3, 3, 2, 2, 3, 2, 1, 3, 3, 2, 1, 2};
static const char *const op_names[NOPS] = {"write",       "reopen",    "reindex",   "reindex_dir", "index_gone",
                                           "old_index",   "rot",       "ro_race",   "kill",        "cut_active",
                                           "grow_active", "crash_rot", "save_index"};

static int run_sequence(uint64_t seed, long seq, const char *root, long nops)
{
    run *r = calloc(1, sizeof *r);
    r->seed = seed;
    r->seq = seq;
    r->rng = su_mix(seed * 0x9E3779B97F4A7C15ull + (uint64_t)seq) | 1;
    r->child_fd = -1;
    mu_trace_init(&r->trace);
    snprintf(r->dir, sizeof r->dir, "%s/s%ld", root, seq);
    snprintf(r->saved, sizeof r->saved, "%s/s%ld.index", root, seq);
    su_rm_rf(r->dir);
    su_rm_rf(r->saved);
    make_sequences(r);
    kvx_geometry g = mb_geometry();
    kvx_store_options o;
    /* eviction in place (docs/STORE.md "Holes") in every other sequence, or
     * as KVX_MODELB_HOLES says (0 never, 1 always) */
    const char *hv = getenv("KVX_MODELB_HOLES");
    int holes = hv ? atoi(hv) != 0 : (int)(su_mix(seed ^ (uint64_t)seq) & 1);
    r->wflags = holes ? KVX_STORE_HOLES : 0;
    su_options(&o, (su_spec){.geometry = &g, .capacity = 512u << 10, .shard_bytes = 64u << 10, .flags = r->wflags});
    int rc = kvx_store_create(&r->s, r->dir, &o);
    if (rc) fail_msg("create %s: %s (%s)", r->dir, kvx_err_name(rc), kvx_last_error());
    tr(r, "#0   created, eviction %s", holes ? "in place (KVX_STORE_HOLES)" : "by whole shards");
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
            if (below(r, 2))
                for (int b = 1; b < NB; b++) x_flush(r, b);
            op_recover(r, K_REINDEX);
            break;
        case O_REINDEX_DIR: op_recover(r, K_REINDEX_DIR); break;
        case O_INDEX_GONE: op_recover(r, K_INDEX_GONE); break;
        case O_OLD_INDEX: op_recover(r, K_OLD_INDEX); break;
        case O_ROT: op_recover(r, K_ROT); break;
        case O_RO: op_ro_race(r); break;
        case O_KILL: op_crash(r, 1, below(r, 3) ? D_NONE : D_TRUNC); break;
        case O_CUT: op_crash(r, 0, D_TRUNC); break;
        case O_GROW: op_crash(r, below(r, 2), D_APPEND); break;
        case O_CRASH_ROT: op_crash(r, 0, D_ROT); break;
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
    int failed = r->failed || r->soft;
    r_close(r);
    static int traces;
    if (failed && (r->new_class || traces < 6)) { /* a class not seen before, or one of the first failures */
        traces++;
        mu_trace_print_tail(&r->trace, "model_blocks", seed, seq, trace_lines);
    }
    if (failed)
        fprintf(stderr,
                "model_blocks: replay with KVX_MODELB_SEED=%" PRIu64
                " KVX_MODELB_SEQ=%ld build/tests/system/model_blocks\n",
                seed, seq);
    if (!failed || !getenv("KVX_MODELB_KEEP")) {
        su_rm_rf(r->dir);
        su_rm_rf(r->saved);
    } else {
        fprintf(stderr, "model_blocks: the store is kept in %s\n", r->dir);
    }
    mu_trace_free(&r->trace);
    free(r);
    return failed;
}

/* The block store keeps its promises through a seeded mix of puts of
 * branching sequences (some longer than the active shard holds) into three
 * batches, flushes, eviction, gc, batches destroyed and every recovery
 * (reopen, reindex, reindex_dir, index/ lost or put back old, a page
 * rotted, a reader racing the writer's recovery, kill -9 of a writer, a
 * crash's active file cut or grown by a byte): every block served is
 * acknowledged and byte-exact, every acknowledged block is served unless
 * reported evicted or damaged by the test, a cut flush lands whole or not
 * at all, verify finds only the test's damage, and no intact file is set
 * aside. */
/* PROMISE: STORE-25 */
static void test_model_blocks(void **state)
{
    (void)state;
    verbose = getenv("KVX_MODELB_VERBOSE") != NULL;
    if (getenv("KVX_MODELB_TRACE_LINES")) trace_lines = atoi(getenv("KVX_MODELB_TRACE_LINES"));
    mu_campaign camp = {
        .name = "model_blocks",
        .env = "KVX_MODELB",
        .seconds = 45,
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
    fprintf(
        stderr,
        "model_blocks: %ld sequences of %ld operations, %ld failed, %.0f s; %ld checks of every block (%ld lookups of "
        "blocks that must be served, %ld blocks served and checked byte for byte), %ld kills, "
        "%ld cut a flush (%ld of those landed), %ld active files cut, %ld grown by a byte, %ld pages rotted, %ld "
        "puts of over 16 new blocks\n",
        done, nops, failed, elapsed, n_checks, n_must, n_served, n_kills, n_cut, n_cut_landed, n_trunc, n_append, n_rot,
        n_overflow);
    for (int c = 0; c < NCLS; c++)
        if (found[c].count)
            fprintf(stderr, "model_blocks: %s: %ld times; first seed %" PRIu64 " sequence %ld: %s\n", cls_name[c],
                    found[c].count, found[c].seed, found[c].seq, found[c].what);
    assert_int_equal(failed, 0);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model_blocks),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
