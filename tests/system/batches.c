/*
 * batches.c - write batches under load: random faults over interleaved
 * batches, gc, reindex and reopen; writer threads beside lookups and
 * maintenance, with and without capacity pressure; kill -9 of a child with
 * three batches; a reader process looking up throughout. Every
 * acknowledged block is served byte for byte; nothing wrong is ever
 * served.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/fault.h"
#include "lib/store.h"

#define NB 6 /* blocks per sequence */

static uint64_t rnd_state;

static uint64_t rnd(void)
{
    rnd_state = rnd_state * 6364136223846793005ull + 1442695040888963407ull;
    return su_mix(rnd_state);
}

enum { NBAT = 4, MAXSEQ = 4096 };

typedef struct model_batch {
    kvx_store_batch *b; /* NULL: the built-in batch */
    uint64_t ok[256];   /* seqs whose put returned 0 since the last flush */
    size_t nok;
    size_t after_fail; /* ok[after_fail..] were put after the last failure */
    int failed;        /* a put failed (not before writing) since the last flush */
} model_batch;

static uint64_t acked[MAXSEQ];

static size_t nacked;

static void check_acked(kvx_store *s, const char *when, unsigned seed)
{
    for (size_t i = 0; i < nacked; i++) {
        size_t n = su_prefix_nb(s, acked[i]);
        if (n != NB)
            fail_msg("seed %u, %s: acknowledged seq %llu serves %zu of %d blocks (last error: %s)", seed, when,
                     (unsigned long long)acked[i], n == SIZE_MAX ? (size_t)999 : n, NB, kvx_last_error());
    }
}

static void flush_model(kvx_store *s, model_batch *m, int rc, unsigned seed, long step)
{
    if (rc == 0) {
        for (size_t i = 0; i < m->nok; i++) acked[nacked++] = m->ok[i];
        for (size_t i = 0; i < m->nok; i++)
            if (su_prefix_nb(s, m->ok[i]) != NB)
                fail_msg("seed %u step %ld: flush returned 0 but seq %llu is not served (failed put before: %d)",
                         seed, step, (unsigned long long)m->ok[i], m->failed);
    } else if (rc == KVX_EDROPPED) {
        if (!m->failed) fail_msg("seed %u step %ld: KVX_EDROPPED without a failed put", seed, step);
        /* what was put after the failure is published all the same */
        for (size_t i = m->after_fail; i < m->nok; i++) {
            if (su_prefix_nb(s, m->ok[i]) != NB)
                fail_msg("seed %u step %ld: KVX_EDROPPED flush did not publish seq %llu put after the failure",
                         seed, step, (unsigned long long)m->ok[i]);
            acked[nacked++] = m->ok[i];
        }
    }
    m->nok = 0;
    m->after_fail = 0;
    m->failed = 0;
}

static void run_random(unsigned seed, uint64_t capacity, uint64_t shard_bytes, long steps)
{
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s =
        su_create(dir, (su_spec){.capacity = capacity, .shard_bytes = shard_bytes, .flags = KVX_STORE_NOWAIT});
    rnd_state = seed;
    nacked = 0;
    uint64_t next_seq = (uint64_t)seed * 100000u;
    model_batch mb[NBAT + 1];
    memset(mb, 0, sizeof mb);
    for (int i = 0; i < NBAT; i++) assert_int_equal(kvx_store_batch_create(&mb[i].b, s), 0);
    fault_install();
    for (long step = 0; step < steps; step++) {
        int bi = (int)(rnd() % (NBAT + 1));
        model_batch *m = &mb[bi];
        unsigned op = (unsigned)(rnd() % 100);
        int inject = rnd() % 4 == 0;
        if (inject) {
            int mode = rnd() % 3 == 0 ? FAULT_SHORT : FAULT_ERRNO;
            fault_reset((long)(rnd() % 30) + 1, rnd() % 2 ? EIO : ENOSPC, mode);
        } else {
            fault_reset(0, EIO, FAULT_ERRNO);
        }
        if (op < 55) {
            if (m->nok >= 250 || nacked + 600 > MAXSEQ) {
                fault_reset(0, EIO, FAULT_ERRNO);
                continue;
            }
            uint64_t q = next_seq++;
            size_t added = 0;
            int rc = su_put_batch(s, m->b ? m->b : NULL, q, &added);
            if (rc == 0) {
                m->ok[m->nok++] = q;
            } else if (rc != KVX_ECAPACITY) {
                if (m->nok > m->after_fail || m->failed) m->failed = 1;
                m->after_fail = m->nok;
            }
        } else if (op < 80) {
            int rc = m->b ? kvx_store_batch_flush(m->b) : kvx_store_flush(s);
            fault_reset(0, EIO, FAULT_ERRNO);
            flush_model(s, m, rc, seed, step);
        } else if (op < 85) {
            if (m->b) {
                kvx_store_batch_destroy(m->b);
                assert_int_equal(kvx_store_batch_create(&m->b, s), 0);
                m->nok = m->after_fail = 0;
                m->failed = 0;
            }
        } else if (op < 91) {
            (void)kvx_store_gc(s);
        } else if (op < 96) {
            int rc = kvx_store_reindex(s);
            /* reindex flushed the built-in batch; its next flush
             * acknowledges them (the model waits for it). A failure there
             * dropped them: the next flush says so */
            if (rc != 0 && rc != KVX_EBUSY && mb[NBAT].nok > mb[NBAT].after_fail) {
                mb[NBAT].failed = 1;
                mb[NBAT].after_fail = mb[NBAT].nok;
            }
        } else {
            fault_reset(0, EIO, FAULT_ERRNO);
            kvx_store_close(s);
            for (int i = 0; i < NBAT; i++) {
                kvx_store_batch_destroy(mb[i].b);
                mb[i].b = NULL;
            }
            memset(mb, 0, sizeof mb);
            assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT), 0);
            for (int i = 0; i < NBAT; i++) assert_int_equal(kvx_store_batch_create(&mb[i].b, s), 0);
            check_acked(s, "after reopen", seed);
        }
        fault_reset(0, EIO, FAULT_ERRNO);
        if (step % 16 == 15) check_acked(s, "during", seed);
    }
    fault_uninstall();
    for (int i = 0; i <= NBAT; i++) {
        int rc = mb[i].b ? kvx_store_batch_flush(mb[i].b) : kvx_store_flush(s);
        flush_model(s, &mb[i], rc, seed, -1);
    }
    check_acked(s, "end", seed);
    su_verify_clean(s);
    for (int i = 0; i < NBAT; i++) kvx_store_batch_destroy(mb[i].b);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT), 0);
    check_acked(s, "final reopen", seed);
    su_verify_clean(s);
    assert_int_equal(su_n_files(dir, "staging"), 0);
    kvx_store_close(s);
    su_rm_rf(dir);
}

static long env_long(const char *name, long dflt)
{
    const char *e = getenv(name);
    return e && atol(e) > 0 ? atol(e) : dflt;
}

/* test_batches_random_faults: several batches (and the built-in one)
 * interleave puts, flushes, destroys, gc, reindex and close/reopen in a
 * seeded random order while single OS calls fail (EIO, ENOSPC, short
 * transfers) at random points: every flush that returned 0 acknowledged every
 * block its batch's successful puts added, byte-exact, now and after reopen;
 * a KVX_EDROPPED flush still publishes what was put after the failure; verify
 * stays clean. */
/* PROMISE: DUR-6 */
static void test_batches_random_faults(void **state)
{
    (void)state;
    if (getenv("KVX_ATTACK5_SKIP_RANDOM")) return;
    long seeds = env_long("KVX_ATTACK5_SEEDS", 6);
    unsigned base = (unsigned)env_long("KVX_ATTACK5_SEED", 1);
    for (long i = 0; i < seeds; i++) {
        /* roomy: nothing is ever evicted, so every acknowledged block stays;
         * small shards: many shards, compactions in flush tidy-ups */
        run_random(base + (unsigned)i, 256 << 20, i % 2 ? 16 << 10 : 0, 300);
    }
}

enum { NWRITERS = 4, PER_WRITER = 45 };

typedef struct th_shared {
    kvx_store *s;
    pthread_mutex_t mu;
    uint64_t acked[NWRITERS * PER_WRITER];
    size_t nacked;
    atomic_int done;
    atomic_int wrong;   /* a served block with the wrong bytes */
    atomic_int missing; /* an acknowledged block not served (no pressure) */
    atomic_int other;   /* an unexpected error code */
    int pressure;
    char why[256];
} th_shared;

typedef struct th_w {
    th_shared *sh;
    int id;
    int rc;
} th_w;

static void th_note(th_shared *sh, atomic_int *ctr, const char *fmt, uint64_t a, long b)
{
    if (atomic_fetch_add(ctr, 1) == 0) {
        pthread_mutex_lock(&sh->mu);
        snprintf(sh->why, sizeof sh->why, fmt, (unsigned long long)a, b);
        pthread_mutex_unlock(&sh->mu);
    }
}

static void *th_writer(void *p)
{
    th_w *w = p;
    th_shared *sh = w->sh;
    kvx_store_batch *b = NULL;
    w->rc = kvx_store_batch_create(&b, sh->s);
    uint64_t mine[8];
    size_t nmine = 0;
    for (int j = 0; !w->rc && j < PER_WRITER; j++) {
        uint64_t q = 700000 + (uint64_t)w->id * 1000 + (uint64_t)j;
        w->rc = su_put_batch(sh->s, b, q, NULL);
        if (w->rc) break;
        mine[nmine++] = q;
        if (nmine == 3 || j == PER_WRITER - 1) {
            w->rc = kvx_store_batch_flush(b);
            if (w->rc) break;
            pthread_mutex_lock(&sh->mu);
            for (size_t i = 0; i < nmine; i++) sh->acked[sh->nacked++] = mine[i];
            pthread_mutex_unlock(&sh->mu);
            nmine = 0;
        }
    }
    kvx_store_batch_destroy(b);
    return NULL;
}

static void *th_lookups(void *p)
{
    th_shared *sh = p;
    uint64_t r = 12345;
    while (!atomic_load(&sh->done)) {
        pthread_mutex_lock(&sh->mu);
        size_t n = sh->nacked;
        uint64_t q = n ? sh->acked[(r = su_mix(r)) % n] : 0;
        pthread_mutex_unlock(&sh->mu);
        if (!n) continue;
        size_t got = su_prefix_nb(sh->s, q);
        if (got == SIZE_MAX) th_note(sh, &sh->wrong, "seq %llu served a wrong block (%ld)", q, 0);
        else if (!sh->pressure && got != NB) {
            /* a lookup whose snapshot names a shard that a concurrent
             * compaction has just replaced and unlinked misses (known, see
             * the review report): only a miss that lasts is a loss */
            size_t again = got;
            for (int k = 0; k < 3 && again != NB; k++) {
                usleep(2000);
                again = su_prefix_nb(sh->s, q);
            }
            if (again != NB) th_note(sh, &sh->missing, "acknowledged seq %llu serves %ld blocks", q, (long)again);
        }
        /* by hash alone: the last block of q, byte-exact or a clean miss */
        uint32_t t[NB * SU_B];
        uint64_t h[NB];
        su_tokens(t, q, NB, 0);
        kvx_block_hashes(h, t, NB * SU_B, SU_B);
        kvx_view v;
        int rc = kvx_store_get_hash(&v, sh->s, h[NB - 1]);
        if (rc == 0) {
            uint8_t want[64];
            su_page(want, sizeof want, h[NB - 1]);
            if (v.hash != h[NB - 1] || v.page_bytes != 64 || memcmp(v.page, want, 64))
                th_note(sh, &sh->wrong, "get_hash of seq %llu: wrong bytes (%ld)", q, 0);
            kvx_view_release(&v);
        } else if (rc == KVX_ENOTFOUND) {
            usleep(2000); /* the same transient miss as above: it must not last */
            if (!sh->pressure && kvx_store_get_hash(&v, sh->s, h[NB - 1]) == 0) kvx_view_release(&v);
            else if (!sh->pressure) th_note(sh, &sh->missing, "get_hash of acknowledged seq %llu: not found (%ld)", q, 0);
        } else if (rc != -EAGAIN) {
            th_note(sh, &sh->other, "get_hash of seq %llu: error %ld", q, rc);
        }
        /* a seq never put is never served */
        if (su_prefix_nb(sh->s, 990000 + (r % 1000)) != 0)
            th_note(sh, &sh->wrong, "seq %llu never put is served (%ld)", 990000 + (r % 1000), 0);
    }
    return NULL;
}

static void *th_maint(void *p)
{
    th_shared *sh = p;
    long i = 0;
    while (!atomic_load(&sh->done)) {
        int rc = i % 3 == 2 ? kvx_store_reindex(sh->s) : kvx_store_gc(sh->s);
        if (rc != 0 && rc != KVX_EBUSY) th_note(sh, &sh->other, "maintenance %llu failed: %ld", (uint64_t)i, rc);
        i++;
    }
    return NULL;
}

static void run_threads(uint64_t capacity, uint64_t shard_bytes, int pressure)
{
    char dir[300];
    su_new_dir(dir, sizeof dir);
    th_shared *sh = calloc(1, sizeof *sh);
    sh->s = su_create(dir, (su_spec){.capacity = capacity, .shard_bytes = shard_bytes, .flags = KVX_STORE_NOWAIT});
    sh->pressure = pressure;
    pthread_mutex_init(&sh->mu, NULL);
    pthread_t tw[NWRITERS], tl, tm;
    th_w w[NWRITERS];
    for (int i = 0; i < NWRITERS; i++) {
        w[i] = (th_w){sh, i, -1};
        assert_int_equal(pthread_create(&tw[i], NULL, th_writer, &w[i]), 0);
    }
    assert_int_equal(pthread_create(&tl, NULL, th_lookups, sh), 0);
    assert_int_equal(pthread_create(&tm, NULL, th_maint, sh), 0);
    for (int i = 0; i < NWRITERS; i++) pthread_join(tw[i], NULL);
    atomic_store(&sh->done, 1);
    pthread_join(tl, NULL);
    pthread_join(tm, NULL);
    if (sh->wrong || sh->missing || sh->other)
        fail_msg("wrong %d missing %d other %d: %s", sh->wrong, sh->missing, sh->other, sh->why);
    for (int i = 0; i < NWRITERS; i++) {
        if (w[i].rc) fail_msg("writer %d: %s (%s)", i, kvx_err_name(w[i].rc), kvx_last_error());
    }
    for (size_t i = 0; i < sh->nacked; i++) {
        size_t n = su_prefix_nb(sh->s, sh->acked[i]);
        assert_true(n != SIZE_MAX);
        if (!pressure) assert_int_equal(n, NB);
    }
    su_verify_clean(sh->s);
    kvx_store_close(sh->s);
    assert_int_equal(su_n_files(dir, "staging"), 0);
    assert_int_equal(kvx_store_open(&sh->s, dir, NULL, KVX_STORE_NOWAIT), 0);
    for (size_t i = 0; i < sh->nacked; i++) {
        size_t n = su_prefix_nb(sh->s, sh->acked[i]);
        assert_true(n != SIZE_MAX);
        if (!pressure) assert_int_equal(n, NB);
    }
    if (pressure) {
        kvx_store_stats st;
        assert_int_equal(kvx_store_stat(&st, sh->s), 0);
        /* (stat's eviction counters start again at each reindex) */
        assert_true(st.bytes <= st.capacity_bytes + st.shard_bytes);
    }
    su_verify_clean(sh->s);
    kvx_store_close(sh->s);
    pthread_mutex_destroy(&sh->mu);
    free(sh);
    su_rm_rf(dir);
}

/* test_threads_batches_gc_lookups: writer threads, each with its own batch,
 * beside a thread of lookups (prefix and get by hash) and a thread of gc and
 * reindex: no wrong byte is ever served, every acknowledged block is served
 * (the capacity is never reached). */
/* PROMISE: STORE-16 */
static void test_threads_batches_gc_lookups(void **state)
{
    (void)state;
    for (long i = env_long("KVX_ATTACK5_THREAD_RUNS", 1); i > 0; i--)
    run_threads(256 << 20, 64 << 10, 0);
}

/* test_pressure_threads: the same under capacity pressure (evictions and
 * compactions): no wrong byte, verify clean, nothing left in staging/. */
/* PROMISE: STORE-16 */
static void test_pressure_threads(void **state)
{
    (void)state;
    run_threads(100 << 10, 16 << 10, 1);
}

/* The child: three batches, puts and flushes in a loop; after each flush
 * that returned 0 it writes the seqs it acknowledged to fd. Never returns. */
static void crash_child(const char *dir, uint64_t base, int fd)
{
    kvx_store *s = NULL;
    if (kvx_store_open(&s, dir, NULL, 0) != 0) _exit(3);
    kvx_store_batch *b[3];
    uint64_t pend[3][8];
    size_t np[3] = {0, 0, 0};
    for (int i = 0; i < 3; i++)
        if (kvx_store_batch_create(&b[i], s) != 0) _exit(4);
    uint64_t r = base;
    for (uint64_t q = base;; q++) {
        int i = (int)((r = su_mix(r)) % 3);
        int rc = su_put_batch(s, b[i], q, NULL);
        if (rc != 0) {
            fprintf(stderr, "child: put: %s (%s)\n", kvx_err_name(rc), kvx_last_error());
            _exit(5);
        }
        pend[i][np[i]++] = q;
        if (np[i] == 3 || r % 5 == 0) {
            if ((rc = kvx_store_batch_flush(b[i])) != 0) {
                fprintf(stderr, "child: flush: %s (%s)\n", kvx_err_name(rc), kvx_last_error());
                _exit(6);
            }
            if (write(fd, pend[i], np[i] * sizeof(uint64_t)) != (ssize_t)(np[i] * sizeof(uint64_t))) _exit(7);
            np[i] = 0;
        }
        if (r % 97 == 0 && kvx_store_gc(s) != 0) _exit(8);
    }
}

/* test_kill9_batch_flush: a child with three batches puts and flushes in a
 * loop and is SIGKILLed at a random instant: after reopen every block it
 * acknowledged is there, byte-exact. */
/* PROMISE: DUR-3 */
static void test_kill9_batch_flush(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    /* default shard size (capacity / 64): with small shards the store runs
     * out of shard ids long before its capacity (see the review report) */
    kvx_store *s = su_create(dir, (su_spec){.capacity = 256 << 20, .flags = KVX_STORE_NOWAIT});
    kvx_store_close(s);
    static uint64_t ack[200000];
    size_t nack = 0;
    long kills = env_long("KVX_ATTACK5_KILLS", 12);
    uint64_t r = 77;
    for (long k = 0; k < kills; k++) {
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            crash_child(dir, 1000000 + (uint64_t)k * 100000, fds[1]);
        }
        close(fds[1]);
        usleep((useconds_t)(20000 + (r = su_mix(r)) % 150000));
        kill(pid, SIGKILL);
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (!WIFSIGNALED(status)) fail_msg("child exited %d before the kill", WEXITSTATUS(status));
        ssize_t n;
        uint64_t buf[512];
        size_t carry = 0; /* bytes of a torn record left */
        while ((n = read(fds[0], (char *)buf + carry, sizeof buf - carry)) > 0) {
            size_t tot = carry + (size_t)n, whole = tot / sizeof(uint64_t);
            for (size_t i = 0; i < whole && nack < sizeof ack / sizeof ack[0]; i++) ack[nack++] = buf[i];
            carry = tot % sizeof(uint64_t);
            memmove(buf, (char *)buf + whole * sizeof(uint64_t), carry);
        }
        close(fds[0]);
        assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT), 0);
        for (size_t i = 0; i < nack; i++) {
            size_t got = su_prefix_nb(s, ack[i]);
            if (got != NB)
                fail_msg("kill %ld: acknowledged seq %llu serves %zu of %d blocks", k, (unsigned long long)ack[i],
                         got == SIZE_MAX ? (size_t)999 : got, NB);
        }
        su_verify_clean(s);
        kvx_store_close(s);
    }
    assert_true(nack > 0);
    su_rm_rf(dir);
}

static int reader_child(const char *dir, int stopfd)
{
    kvx_store *s = NULL;
    for (int i = 0; i < 500 && kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY) != 0; i++) usleep(10000);
    if (!s) return 20;
    uint64_t r = 5;
    long checks = 0, hits = 0;
    for (;;) {
        char c;
        if (read(stopfd, &c, 1) == 0) break; /* the parent closed it */
        for (int j = 0; j < 50; j++) {
            uint64_t q = 800000 + (r = su_mix(r)) % 400;
            size_t got = su_prefix_nb(s, q);
            if (got == SIZE_MAX) {
                if (kvx_last_error()[0] && strstr(kvx_last_error(), "reindex")) {
                    /* KVX_ESTALE after a reindex_dir: open again */
                    kvx_store_close(s);
                    s = NULL;
                    for (int i = 0; i < 500 && kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY) != 0; i++)
                        usleep(10000);
                    if (!s) return 21;
                    continue;
                }
                /* an error, or wrong bytes: tell which */
                uint32_t t[NB * SU_B];
                kvx_view v[NB];
                size_t n = 0;
                su_tokens(t, q, NB, 0);
                int rc = kvx_store_prefix(v, &n, s, t, NB * SU_B, NB);
                if (rc == 0) {
                    kvx_views_release(v, n);
                    fprintf(stderr, "reader: seq %llu served a wrong block\n", (unsigned long long)q);
                    return 22;
                }
                if (rc == KVX_ESTALE) continue;
                fprintf(stderr, "reader: seq %llu: %s (%s)\n", (unsigned long long)q, kvx_err_name(rc),
                        kvx_last_error());
                continue; /* an error is not a wrong block */
            }
            checks++;
            hits += got == NB;
        }
    }
    kvx_store_close(s);
    fprintf(stderr, "reader: %ld checks, %ld full hits\n", checks, hits);
    return 0;
}

/* test_reader_process_vs_batches: a reader in another process looks up in a
 * loop while the writer's batches put, flush, evict, compact, gc and reindex:
 * the reader never serves a wrong byte. */
/* PROMISE: STORE-15 */
static void test_reader_process_vs_batches(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 120 << 10, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT});
    assert_int_equal(su_put_batch(s, NULL, 800000, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(fds[1]);
        /* non-blocking reads of the stop pipe */
        int flags = fcntl(fds[0], F_GETFL);
        fcntl(fds[0], F_SETFL, flags | O_NONBLOCK);
        _exit(reader_child(dir, fds[0]));
    }
    close(fds[0]);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT), 0);
    kvx_store_batch *b[3];
    for (int i = 0; i < 3; i++) assert_int_equal(kvx_store_batch_create(&b[i], s), 0);
    uint64_t r = 9;
    for (int round = 0; round < 4; round++) {
        for (uint64_t q = 800000; q < 800400; q++) {
            int i = (int)((r = su_mix(r)) % 3);
            int prc = su_put_batch(s, b[i], q, NULL);
            if (prc == KVX_ECAPACITY) { /* "flush first" */
                assert_int_equal(kvx_store_batch_flush(b[i]), 0);
                prc = su_put_batch(s, b[i], q, NULL);
            }
            assert_int_equal(prc, 0);
            if (r % 3 == 0) assert_int_equal(kvx_store_batch_flush(b[i]), 0);
            if (r % 61 == 0) assert_int_equal(kvx_store_gc(s), 0);
            if (r % 89 == 0) {
                for (int j = 0; j < 3; j++) assert_int_equal(kvx_store_batch_flush(b[j]), 0);
                assert_int_equal(kvx_store_reindex(s), 0);
            }
        }
        for (int i = 0; i < 3; i++) {
            assert_int_equal(kvx_store_batch_flush(b[i]), 0);
            kvx_store_batch_destroy(b[i]);
        }
        kvx_store_close(s);
        int rc = kvx_store_reindex_dir(dir, 0);
        assert_true(rc == 0 || rc == KVX_ECORRUPT);
        assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT), 0);
        for (int i = 0; i < 3; i++) assert_int_equal(kvx_store_batch_create(&b[i], s), 0);
    }
    for (int i = 0; i < 3; i++) kvx_store_batch_destroy(b[i]);
    su_verify_clean(s);
    kvx_store_close(s);
    close(fds[1]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    su_rm_rf(dir);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_batches_random_faults),
        cmocka_unit_test(test_threads_batches_gc_lookups),
        cmocka_unit_test(test_pressure_threads),
        cmocka_unit_test(test_kill9_batch_flush),
        cmocka_unit_test(test_reader_process_vs_batches),
    };
    return cmocka_run_group_tests_name("system/batches", tests, su_setup, su_teardown);
}
