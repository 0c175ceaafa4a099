/*
 * store_tier.c - the store's side of the shared tier (docs/TIER.md): the
 * DIR/TIER setting, the two clients (lookups; the write-behind thread),
 * the write-behind queue, the verified fetch and the counters. tier/ does
 * the network and the bytes.
 *
 * Rule (DESIGN.md, "Shared tier"): the tier is best effort and never
 * trusted. Nothing here can fail a store call: a tier that is down, slow,
 * or holding garbage gives misses (counted), bounded in time (tier/'s
 * limits and circuit breaker). Values are written only after the flush
 * that made their blocks durable (SET NX, optional TTL), from the flushed
 * shard's CRC-checked page; a value is used only after
 * kvx_tier_value_check. A writer that saw a bad value under a key and then
 * holds the verified block replaces it with a compare-and-set (the bad
 * value's SHA-1 must still be there). Readers never write the tier: the
 * write-behind thread exists only in writers.
 *
 * Threads: the lookup client has its own mutex (one tier call at a time
 * per handle); the write-behind thread has its own client and takes
 * pages through the shard cache (kvx_st_shard_get), like a lookup.
 * kvx_store_close drains the queue for at most 2 s before the handle
 * goes, then drops what is left.
 */
#include "store.h"
#include "tier/tier.h"
#include "common/os.h"

#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ST_TIER_BAD 64      /* bad keys a writer remembers for a replace */
#define ST_TIER_WB_TOTAL_MS 1500 /* one write-behind batch: its SET NX and every compare-and-set */
#define ST_TIER_QMAX 65536  /* queued blocks; beyond, new ones are dropped */
#define ST_TIER_BATCH 64    /* blocks per write-behind round trip */

typedef struct st_job {
    uint64_t hash;
    uint8_t digest[KVX_DIGEST_BYTES];
    uint32_t coord;
    uint64_t gen;
    uint32_t *toks; /* B ids, malloc'd */
} st_job;

typedef struct st_bad {
    char key[KVX_TIER_KEY_BYTES];
    char sha[41];
} st_bad;

struct st_tier {
    kvx_tier_conf conf;
    int from_file;
    uint64_t ns;
    kvx_tier *rd, *wr;
    pthread_mutex_t mu;
    pthread_cond_t cv, idle;
    pthread_t th;
    int started, stop, busy;
    struct timespec close_by; /* set by detach: the write-behind's last moment */
    int closing;
    st_job *q;
    size_t nq, capq;
    st_bad bad[ST_TIER_BAD];
    size_t nbad, badnext;
    atomic_int asked;
    _Atomic uint64_t hits, misses, errors, badv, replaced, writes, up, down;
};

/* ---- DIR/TIER ----------------------------------------------------------- */

static int st_tier_read_file(kvx_store *s, kvx_tier_conf *c)
{
    int fd;
    int rc = kvx_st_open_file(s, "TIER", O_RDONLY, 0, &fd);
    if (rc == -ENOENT) {
        kvx_clear_error();
        return KVX_ENOTFOUND;
    }
    if (rc) return rc;
    char buf[2048];
    size_t got = 0;
    rc = kvx_os_pread_all(fd, buf, sizeof buf - 1, 0, &got);
    kvx_os.close(fd);
    if (rc) return kvx_fail(rc, "store: %s/TIER: cannot read it", s->dir);
    buf[got] = '\0';
    if (got == sizeof buf - 1 || strlen(buf) != got) return kvx_fail(KVX_EFORMAT, "TIER: too long or not text");
    return kvx_tier_conf_parse(c, buf);
}

/* Atomically: TIER.tmp, fsync, rename, fsync of the directory. c NULL
 * removes TIER. */
static int st_tier_write_file(kvx_store *s, const kvx_tier_conf *c)
{
    int rc = 0;
    if (!c) {
        if (kvx_os.unlinkat(s->dirfd, "TIER", 0) != 0 && errno != ENOENT) rc = -errno;
    } else {
        char buf[2048];
        size_t n = kvx_tier_conf_format(buf, sizeof buf, c);
        if (!n) return kvx_fail(KVX_EINVALID, "store: the tier setting is too long");
        int fd;
        if ((rc = kvx_st_open_file(s, "TIER.tmp", O_WRONLY | O_CREAT | O_TRUNC, 0600, &fd))) return rc;
        rc = kvx_os_pwrite_all(fd, buf, n, 0);
        if (!rc && kvx_os.fsync(fd) != 0) rc = -errno;
        kvx_os.close(fd);
        if (!rc && kvx_os.renameat(s->dirfd, "TIER.tmp", s->dirfd, "TIER") != 0) rc = -errno;
        if (rc) kvx_os.unlinkat(s->dirfd, "TIER.tmp", 0);
    }
    if (!rc && kvx_os.fsync(s->dirfd) != 0) rc = -errno;
    return rc ? kvx_fail(rc, "store: write %s/TIER: %s", s->dir, strerror(-rc)) : 0;
}

/* ---- life cycle ----------------------------------------------------------- */

static void *st_tier_worker(void *arg);

static int st_tier_start(kvx_store *s, const kvx_tier_conf *c, int from_file)
{
    struct st_tier *t = calloc(1, sizeof *t);
    if (!t) return kvx_fail(-ENOMEM, "store: out of memory");
    t->conf = *c;
    t->from_file = from_file;
    t->ns = kvx_tier_ns(&s->g, c->tenant);
    /* one reply holds at most one value (a page, its tokens and scales,
     * under 2 pages + 1 MiB) or a slot map (16 MiB is 16384 nodes with
     * room): a server streaming more is cut there, not buffered */
    uint64_t reply = 2 * s->page_bytes + 4ull * s->g.block_tokens + (1u << 20);
    if (reply < (16u << 20)) reply = 16u << 20;
    kvx_tier_limits rl = {250, 1000, 5000, reply};
    /* the write-behind's calls are bounded tighter: close waits for them */
    kvx_tier_limits wl = {250, 1000, ST_TIER_WB_TOTAL_MS, reply};
    int rc = kvx_tier_open(&t->rd, c->url, &rl);
    if (!rc && s->writer) rc = kvx_tier_open(&t->wr, c->url, &wl);
    if (rc) {
        kvx_tier_close(t->rd);
        free(t);
        return rc;
    }
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    pthread_cond_init(&t->idle, NULL);
    s->tier = t;
    return 0;
}

int kvx_st_tier_check(const kvx_store_options *opts, const kvx_geometry *g)
{
    if (!opts || opts->version < 3 || !opts->tier_url || !strcmp(opts->tier_url, "off") || !opts->tier_url[0])
        return 0;
    if (!g->block_tokens)
        return kvx_fail(KVX_EINVALID, "store: a keyed store has no shared tier (its pages have no prefix)");
    kvx_tier_url u;
    int rc = kvx_tier_url_parse(&u, opts->tier_url);
    if (!rc && strlen(opts->tier_url) >= KVX_TIER_URL_MAX) rc = kvx_fail(KVX_EINVALID, "store: tier URL too long");
    if (!rc && opts->tier_tenant) rc = kvx_tier_tenant_check(opts->tier_tenant);
    return rc;
}

int kvx_st_tier_attach(kvx_store *s, const kvx_store_options *opts, int use_file, int create)
{
    kvx_tier_conf c;
    memset(&c, 0, sizeof c);
    int from_file = 0, rc;
    if (opts && opts->version >= 3 && opts->tier_url) {
        if (!strcmp(opts->tier_url, "off") || !opts->tier_url[0]) return 0;
        if (!s->g.block_tokens)
            return kvx_fail(KVX_EINVALID, "store: a keyed store has no shared tier (its pages have no prefix)");
        kvx_tier_url u;
        if ((rc = kvx_tier_url_parse(&u, opts->tier_url))) return rc;
        if (strlen(opts->tier_url) >= sizeof c.url) return kvx_fail(KVX_EINVALID, "store: tier URL too long");
        snprintf(c.url, sizeof c.url, "%s", opts->tier_url);
        if (opts->tier_tenant) {
            if ((rc = kvx_tier_tenant_check(opts->tier_tenant))) return rc;
            snprintf(c.tenant, sizeof c.tenant, "%s", opts->tier_tenant);
        }
        c.ttl_ms = opts->tier_ttl_ms;
        if (create) {
            if ((rc = st_tier_write_file(s, &c))) return rc;
            from_file = 1;
        }
    } else if (use_file && s->g.block_tokens) {
        rc = st_tier_read_file(s, &c);
        if (rc == KVX_ENOTFOUND) return 0;
        if (rc) {
            /* never fails the open: the store works without its tier */
            fprintf(stderr, "kvx: %s/TIER: %s: the shared tier is off for this handle\n", s->dir, kvx_last_error());
            return 0;
        }
        from_file = 1;
    } else {
        return 0;
    }
    return st_tier_start(s, &c, from_file);
}

void kvx_st_tier_detach(kvx_store *s, uint32_t drain_ms)
{
    struct st_tier *t = s->tier;
    if (!t) return;
    pthread_mutex_lock(&t->mu);
    if (t->started) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += drain_ms / 1000;
        dl.tv_nsec += (long)(drain_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) dl.tv_sec++, dl.tv_nsec -= 1000000000L;
        t->close_by = dl;
        t->closing = 1;
        while ((t->nq || t->busy) && pthread_cond_timedwait(&t->idle, &t->mu, &dl) == 0) {}
    }
    for (size_t i = 0; i < t->nq; i++) free(t->q[i].toks); /* not sent in time: dropped */
    t->nq = 0;
    t->stop = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (t->started) pthread_join(t->th, NULL);
    free(t->q);
    kvx_tier_close(t->rd);
    kvx_tier_close(t->wr);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    pthread_cond_destroy(&t->idle);
    free(t);
    s->tier = NULL;
}

/* ---- write-behind ----------------------------------------------------------- */

void kvx_st_tier_published(kvx_store *s, const kvx_store_batch *x)
{
    struct st_tier *t = s->tier;
    if (!t || !t->wr) return;
    uint32_t B = s->g.block_tokens;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < x->npend; i++) {
        const st_pblock *p = &x->pend[i];
        if (p->kind != ST_KIND_LINEAGE || p->tok == SIZE_MAX || t->nq >= ST_TIER_QMAX) continue;
        if (t->nq == t->capq) {
            size_t n = t->capq ? t->capq * 2 : 256;
            st_job *q = realloc(t->q, n * sizeof *q);
            if (!q) break;
            t->q = q;
            t->capq = n;
        }
        st_job *j = &t->q[t->nq];
        j->toks = malloc((size_t)B * 4u);
        if (!j->toks) break;
        memcpy(j->toks, x->ptok + p->tok, (size_t)B * 4u);
        j->hash = p->hash;
        memcpy(j->digest, p->digest, KVX_DIGEST_BYTES);
        j->coord = p->coord;
        j->gen = p->gen;
        t->nq++;
    }
    if (t->nq && !t->started && !t->stop) {
        if (pthread_create(&t->th, NULL, st_tier_worker, s) == 0) t->started = 1;
        else {
            for (size_t i = 0; i < t->nq; i++) free(t->q[i].toks);
            t->nq = 0;
        }
    }
    pthread_cond_signal(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

/* The bad value a lookup saw under key, if any (removed when found). */
static int st_bad_take(struct st_tier *t, const char *key, char sha[41])
{
    int found = 0;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->nbad && !found; i++)
        if (!strcmp(t->bad[i].key, key)) {
            memcpy(sha, t->bad[i].sha, 41);
            t->bad[i] = t->bad[--t->nbad];
            found = 1;
        }
    pthread_mutex_unlock(&t->mu);
    return found;
}

static void st_bad_note(struct st_tier *t, const char *key, const uint8_t *v, size_t len)
{
    pthread_mutex_lock(&t->mu);
    st_bad *b = t->nbad < ST_TIER_BAD ? &t->bad[t->nbad++] : &t->bad[t->badnext++ % ST_TIER_BAD];
    snprintf(b->key, sizeof b->key, "%s", key);
    kvx_tier_sha1hex(b->sha, v, len);
    pthread_mutex_unlock(&t->mu);
}

static uint64_t st_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* One batch of the write-behind within budget_ms in all: its SET NX, then
 * a compare-and-set per key noted bad, each given only what is left (a
 * server answering each in 0.8 s held a closing store 12.8 s for 16 keys:
 * tests/engine/tier.c test_cas_close_bounded); those left when it runs out are
 * not replaced (best effort). */
static void st_tier_write(kvx_store *s, struct st_tier *t, st_job *jobs, size_t n, uint32_t budget_ms)
{
    uint64_t deadline = st_mono_ms() + budget_ms;
    kvx_tier_set_total_ms(t->wr, budget_ms);
    char(*keys)[KVX_TIER_KEY_BYTES] = calloc(n, sizeof *keys);
    const char **kp = calloc(n, sizeof *kp);
    uint8_t **vals = calloc(n, sizeof *vals);
    size_t *lens = calloc(n, sizeof *lens);
    uint8_t *st = calloc(n, 1);
    size_t m = 0;
    for (size_t i = 0; keys && kp && vals && lens && st && i < n; i++) {
        st_job *j = &jobs[i];
        kvx_shard *sh = kvx_st_shard_get_n(s, KVX_COORD_SHARD(j->coord), j->gen, KVX_COORD_BLOCK(j->coord) + 1);
        if (!sh) continue; /* evicted or compacted away since: nothing to send */
        uint32_t idx = KVX_COORD_BLOCK(j->coord);
        kvx_entry e;
        const void *page;
        if (!kvx_shard_entry(&e, sh, idx) && e.coordinate == j->coord && e.hash == j->hash &&
            !kvx_shard_page(&page, sh, idx, 1) && /* CRC again before a copy to another tier (DESIGN rule 1) */
            !kvx_tier_value_encode(&vals[m], &lens[m], t->ns, &s->g, j->hash, j->toks, page, e.scales)) {
            kvx_tier_key(keys[m], t->ns, j->hash, j->digest);
            kp[m] = keys[m];
            m++;
        }
        kvx_shard_close(sh);
    }
    if (m) {
        kvx_tier_io io = {0, 0, 0, 0};
        kvx_tier_set_nx(t->wr, kp, (const uint8_t *const *)vals, lens, m, t->conf.ttl_ms, st, &io);
        for (size_t i = 0; i < m; i++) {
            if (st[i] == KVX_TIER_OK) atomic_fetch_add(&t->writes, 1);
            else if (st[i] != KVX_TIER_NONE) atomic_fetch_add(&t->errors, 1);
            char sha[41];
            uint64_t now = st_mono_ms();
            if (st[i] != KVX_TIER_NONE || now >= deadline || !st_bad_take(t, kp[i], sha)) continue;
            kvx_tier_set_total_ms(t->wr, (uint32_t)(deadline - now));
            if (kvx_tier_cas(t->wr, kp[i], sha, vals[i], lens[i], t->conf.ttl_ms, &io) == 0)
                atomic_fetch_add(&t->replaced, 1);
        }
        atomic_fetch_add(&t->up, io.bytes_up);
    }
    for (size_t i = 0; vals && i < m; i++) free(vals[i]);
    free(keys), free(kp), free(vals), free(lens), free(st);
    kvx_clear_error();
}

static void *st_tier_worker(void *arg)
{
    kvx_store *s = arg;
    struct st_tier *t = s->tier;
    pthread_mutex_lock(&t->mu);
    for (;;) {
        while (!t->nq && !t->stop) pthread_cond_wait(&t->cv, &t->mu);
        if (!t->nq) break;
        size_t n = t->nq < ST_TIER_BATCH ? t->nq : ST_TIER_BATCH;
        st_job jobs[ST_TIER_BATCH];
        memcpy(jobs, t->q, n * sizeof *jobs);
        memmove(t->q, t->q + n, (t->nq - n) * sizeof *t->q);
        t->nq -= n;
        t->busy = 1;
        uint32_t budget = ST_TIER_WB_TOTAL_MS;
        if (t->closing) {
            /* the store is closing: this batch may take only what is left
             * of the close's wait */
            struct timespec now;
            clock_gettime(CLOCK_REALTIME, &now);
            int64_t left = (int64_t)(t->close_by.tv_sec - now.tv_sec) * 1000 +
                           (t->close_by.tv_nsec - now.tv_nsec) / 1000000;
            if (left < budget) budget = left > 1 ? (uint32_t)left : 1;
        }
        pthread_mutex_unlock(&t->mu);
        st_tier_write(s, t, jobs, n, budget);
        for (size_t i = 0; i < n; i++) free(jobs[i].toks);
        pthread_mutex_lock(&t->mu);
        t->busy = 0;
        if (!t->nq) pthread_cond_broadcast(&t->idle);
    }
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

/* ---- fetch ---------------------------------------------------------------- */

/* A lookup's batch, checked value by value as the answers arrive. */
typedef struct st_fetch {
    kvx_store *s;
    struct st_tier *t;
    const uint32_t *tokens;
    size_t first;
    const uint64_t *hashes;
    char (*keys)[KVX_TIER_KEY_BYTES];
    void **pages;
    float *scales;
    uint8_t *res; /* 0 verified, 1 no value, 2 not answered, 3 bad value */
} st_fetch;

static void st_fetch_one(void *ctx, size_t j, uint8_t st, uint8_t *val, size_t len)
{
    st_fetch *f = ctx;
    kvx_store *s = f->s;
    if (st != KVX_TIER_OK) {
        f->res[j] = st == KVX_TIER_NONE ? 1 : 2;
        free(val);
        return;
    }
    size_t i = f->first + j;
    kvx_tier_expect x = {f->t->ns, &s->g, f->hashes[i], i ? f->hashes[i - 1] : 0, f->tokens + i * s->g.block_tokens};
    if (kvx_tier_value_check(val, len, &x, f->pages[j], f->scales ? f->scales + j * s->nscales : NULL)) {
        f->res[j] = 3;
        if (s->writer) st_bad_note(f->t, f->keys[j], val, len);
    } else {
        f->res[j] = 0;
    }
    free(val);
}

size_t kvx_st_tier_fetch(kvx_store *s, const uint32_t *tokens, size_t first, size_t n, const uint64_t *hashes,
                         const uint8_t (*digests)[KVX_DIGEST_BYTES], void **pages, float *scales)
{
    struct st_tier *t = s->tier;
    if (!t || !n) return 0;
    char(*keys)[KVX_TIER_KEY_BYTES] = malloc(n * sizeof *keys);
    const char **kp = malloc(n * sizeof *kp);
    uint8_t *res = malloc(n);
    size_t k = 0;
    if (keys && kp && res) {
        for (size_t j = 0; j < n; j++) {
            kvx_tier_key(keys[j], t->ns, hashes[first + j], digests[first + j]);
            kp[j] = keys[j];
            res[j] = 2;
        }
        atomic_store(&t->asked, 1);
        kvx_tier_io io = {0, 0, 0, 0};
        st_fetch f = {s, t, tokens, first, hashes, keys, pages, scales, res};
        kvx_tier_get_each(t->rd, kp, n, st_fetch_one, &f, &io);
        atomic_fetch_add(&t->down, io.bytes_down);
        /* the leading verified run is served; the block that ends it is
         * counted by why */
        while (k < n && res[k] == 0) k++;
        if (k < n && res[k] == 2) atomic_fetch_add(&t->errors, 1);
        if (k < n && res[k] == 3) atomic_fetch_add(&t->badv, 1);
        atomic_fetch_add(&t->hits, k);
        atomic_fetch_add(&t->misses, n - k);
    }
    free(keys), free(kp), free(res);
    kvx_clear_error();
    return k;
}

/* ---- counters and the public calls -------------------------------------------- */

void kvx_st_tier_stats(kvx_store *s, kvx_store_stats *out)
{
    struct st_tier *t = s->tier;
    if (!t) return;
    out->tier_hits = atomic_load(&t->hits);
    out->tier_misses = atomic_load(&t->misses);
    out->tier_errors = atomic_load(&t->errors);
    out->tier_bad = atomic_load(&t->badv);
    out->tier_replaced = atomic_load(&t->replaced);
    out->tier_writes = atomic_load(&t->writes);
    out->tier_bytes_up = atomic_load(&t->up);
    out->tier_bytes_down = atomic_load(&t->down);
    int up = kvx_tier_up(t->rd) || (t->wr && kvx_tier_up(t->wr));
    if (!up && !atomic_load(&t->asked)) up = kvx_tier_ping(t->rd) == 0; /* not asked yet: ask now */
    out->tier_up = (uint64_t)up;
    kvx_clear_error();
}

KVX_API int kvx_store_tier_get(kvx_store_tier *out, kvx_store *s)
{
    if (!out || !s) return kvx_fail(KVX_EINVALID, "kvx_store_tier_get: NULL argument");
    memset(out, 0, sizeof *out);
    out->cluster = -1;
    struct st_tier *t = s->tier;
    if (!t) return 0;
    kvx_tier_url_redact(out->url, sizeof out->url, t->conf.url);
    snprintf(out->tenant, sizeof out->tenant, "%s", t->conf.tenant);
    out->ttl_ms = t->conf.ttl_ms;
    out->ns = t->ns;
    out->from_file = t->from_file;
    out->cluster = kvx_tier_is_cluster(t->rd);
    return 0;
}

KVX_API int kvx_store_tier_set(kvx_store *s, const char *url, const char *tenant, uint64_t ttl_ms)
{
    int rc = kvx_st_writer_check(s, "kvx_store_tier_set");
    if (rc) return rc;
    if (!s->g.block_tokens)
        return kvx_fail(KVX_EINVALID, "kvx_store_tier_set: a keyed store has no shared tier (its pages have no prefix)");
    int off = !url || !strcmp(url, "off");
    kvx_tier_conf c;
    memset(&c, 0, sizeof c);
    if (!off) {
        kvx_tier_url u;
        if ((rc = kvx_tier_url_parse(&u, url))) return rc;
        if (strlen(url) >= sizeof c.url) return kvx_fail(KVX_EINVALID, "kvx_store_tier_set: URL too long");
        if (tenant && (rc = kvx_tier_tenant_check(tenant))) return rc;
        snprintf(c.url, sizeof c.url, "%s", url);
        snprintf(c.tenant, sizeof c.tenant, "%s", tenant ? tenant : "");
        c.ttl_ms = ttl_ms;
    }
    if ((rc = st_tier_write_file(s, off ? NULL : &c))) return rc;
    kvx_st_tier_detach(s, 2000);
    if (!off && (rc = st_tier_start(s, &c, 1))) return rc;
    kvx_clear_error();
    return 0;
}

KVX_API int kvx_store_tier_ping(kvx_store *s)
{
    if (!s) return kvx_fail(KVX_EINVALID, "kvx_store_tier_ping: NULL argument");
    if (!s->tier) return kvx_fail(KVX_ENOTFOUND, "store %s has no shared tier", s->dir);
    return kvx_tier_ping(s->tier->rd);
}
