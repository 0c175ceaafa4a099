/*
 * batch.c - write batches (engine/store_batch.c, kvx_store_batch): a
 * batch's flush acknowledges exactly the blocks put into it since its last
 * flush, and a failure in one batch never drops another's: interleaved
 * batches under faults, capacity refusals, destroy, kill -9 before a
 * flush, the built-in batch, threads, pins and shard ids across batches.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/store.h"
#include "lib/fault.h"
#include "lib/store.h"

#define NB 6 /* blocks per sequence */

/* The names in dir/shards, joined (for comparing two listings). */
static void shard_names(const char *dir, char *out, size_t cap)
{
    char names[512][64];
    size_t n = su_list_names(dir, "shards", names, 512);
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        strncat(out, names[i], cap - strlen(out) - 1);
        strncat(out, " ", cap - strlen(out) - 1);
    }
}

/* Two batches interleaved; a put of batch A fails at its k-th OS call, for
 * every k (EIO, then short writes). Batch B goes on putting after the
 * failure and its flush acknowledges and serves every block it holds. A's
 * flush: KVX_EDROPPED (naming the count) when the failure dropped A's
 * earlier put, then its blocks are not served; 0 when the failure came
 * before anything was written (nothing dropped) or did not hit. */
/* PROMISE: DUR-9, DUR-10 */
static void test_failed_batch_spares_other(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .flags = KVX_STORE_NOWAIT});
    static uint64_t acked[4096];
    size_t nacked = 0;
    uint64_t seq = 1;
    kvx_store_batch *a, *b;
    fault_install();
    /* count the calls of A's second put */
    assert_int_equal(kvx_store_batch_create(&a, s), 0);
    assert_int_equal(su_put_batch(s, a, seq++, NULL), 0);
    fault_reset(0, EIO, FAULT_ERRNO);
    assert_int_equal(su_put_batch(s, a, seq++, NULL), 0);
    long ncalls = fault_calls;
    assert_true(ncalls >= 1);
    assert_int_equal(kvx_store_batch_flush(a), 0);
    acked[nacked++] = seq - 2;
    acked[nacked++] = seq - 1;
    kvx_store_batch_destroy(a);
    int dropped = 0, failed = 0;
    for (int mode = 0; mode < 2; mode++) {
        for (long k = 1; k <= ncalls; k++) {
            assert_int_equal(kvx_store_batch_create(&a, s), 0);
            assert_int_equal(kvx_store_batch_create(&b, s), 0);
            uint64_t a1 = seq++, b1 = seq++, a2 = seq++, b2 = seq++;
            assert_int_equal(su_put_batch(s, a, a1, NULL), 0);
            assert_int_equal(su_put_batch(s, b, b1, NULL), 0);
            fault_reset(k, EIO, mode ? FAULT_SHORT : FAULT_ERRNO);
            int rc = su_put_batch(s, a, a2, NULL);
            fault_reset(0, EIO, FAULT_ERRNO);
            assert_int_equal(su_put_batch(s, b, b2, NULL), 0);
            assert_int_equal(kvx_store_batch_flush(b), 0);
            assert_int_equal(su_prefix_nb(s, b1), NB);
            assert_int_equal(su_prefix_nb(s, b2), NB);
            acked[nacked++] = b1;
            acked[nacked++] = b2;
            int rca = kvx_store_batch_flush(a);
            if (rc == 0) {
                assert_int_equal(rca, 0);
                acked[nacked++] = a1;
                acked[nacked++] = a2;
            } else if (rca == KVX_EDROPPED) {
                failed++;
                dropped++;
                assert_non_null(strstr(kvx_last_error(), "6 block(s)"));
                assert_int_equal(su_prefix_nb(s, a1), 0);
                assert_int_equal(kvx_store_batch_flush(a), 0); /* reported once */
            } else {
                failed++;
                assert_int_equal(rca, 0); /* failed before writing: nothing dropped */
                acked[nacked++] = a1;
            }
            /* everything acknowledged so far is still served */
            for (size_t i = 0; i < nacked; i++) assert_int_equal(su_prefix_nb(s, acked[i]), NB);
            kvx_store_batch_destroy(a);
            kvx_store_batch_destroy(b);
        }
    }
    fault_uninstall();
    assert_true(failed > 0 && dropped > 0);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT), 0);
    for (size_t i = 0; i < nacked; i++) assert_int_equal(su_prefix_nb(s, acked[i]), NB);
    su_verify_clean(s);
    assert_int_equal(su_n_files(dir, "staging"), 0);
    kvx_store_close(s);
}

/* A put refused for the capacity writes nothing and drops nothing: the
 * batch's earlier puts are still acknowledged by its flush, and another
 * batch is untouched. */
/* PROMISE: DUR-10 */
static void test_capacity_refusal_drops_nothing(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 120 << 10, .shard_bytes = 32 << 10, .flags = KVX_STORE_NOWAIT});
    kvx_store_batch *a, *b;
    assert_int_equal(kvx_store_batch_create(&a, s), 0);
    assert_int_equal(kvx_store_batch_create(&b, s), 0);
    assert_int_equal(su_put_batch(s, a, 10, NULL), 0);
    assert_int_equal(su_put_batch(s, b, 11, NULL), 0);
    enum { NBIG = 64 };
    uint32_t t[NBIG * SU_B];
    uint64_t h[NBIG];
    su_tokens(t, 12, NBIG, 0);
    uint8_t *p = su_pages(t, NBIG, h, 64);
    assert_int_equal(kvx_store_batch_put(a, t, NBIG * SU_B, p, NBIG, NULL, NULL), KVX_ECAPACITY);
    free(p);
    assert_int_equal(kvx_store_batch_flush(a), 0);
    assert_int_equal(kvx_store_batch_flush(b), 0);
    assert_int_equal(su_prefix_nb(s, 10), NB);
    assert_int_equal(su_prefix_nb(s, 11), NB);
    kvx_store_batch_destroy(a);
    kvx_store_batch_destroy(b);
    kvx_store_close(s);
}

/* A batch's flush publishes its own blocks only: another batch's (and the
 * built-in batch's) stay invisible, to the writer and to a reader, until
 * their own flush. */
/* PROMISE: DUR-8 */
static void test_flush_publishes_only_its_batch(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .flags = KVX_STORE_NOWAIT});
    kvx_store *r = NULL;
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
    kvx_store_batch *a, *b;
    assert_int_equal(kvx_store_batch_create(&a, s), 0);
    assert_int_equal(kvx_store_batch_create(&b, s), 0);
    assert_int_equal(su_put_batch(s, a, 100, NULL), 0);
    assert_int_equal(su_put_batch(s, b, 101, NULL), 0);
    assert_int_equal(su_put_batch(s, NULL, 102, NULL), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.pending_blocks, 3 * NB);
    for (uint64_t q = 100; q < 103; q++) {
        assert_int_equal(su_prefix_nb(s, q), 0);
        assert_int_equal(su_prefix_nb(r, q), 0);
    }
    assert_int_equal(kvx_store_batch_flush(a), 0);
    assert_int_equal(su_prefix_nb(s, 100), NB);
    assert_int_equal(su_prefix_nb(r, 100), NB);
    assert_int_equal(su_prefix_nb(s, 101), 0);
    assert_int_equal(su_prefix_nb(r, 101), 0);
    assert_int_equal(su_prefix_nb(r, 102), 0);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.pending_blocks, 2 * NB);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(su_prefix_nb(r, 102), NB);
    assert_int_equal(su_prefix_nb(r, 101), 0);
    assert_int_equal(kvx_store_batch_flush(b), 0);
    assert_int_equal(su_prefix_nb(r, 101), NB);
    /* a block pending in another batch is not "held": each writes its own */
    size_t added = 0;
    assert_int_equal(su_put_batch(s, a, 103, &added), 0);
    assert_int_equal(added, NB);
    assert_int_equal(su_put_batch(s, b, 103, &added), 0);
    assert_int_equal(added, NB);
    assert_int_equal(kvx_store_batch_flush(b), 0);
    assert_int_equal(su_prefix_nb(r, 103), NB);
    kvx_store_batch_destroy(b);
    /* ... and what one published is held for the next put of another */
    assert_int_equal(su_put_batch(s, NULL, 103, &added), 0);
    assert_int_equal(added, 0);
    assert_int_equal(kvx_store_batch_flush(a), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_view v;
    uint64_t h[NB];
    uint32_t t[NB * SU_B];
    su_tokens(t, 103, NB, 0);
    kvx_block_hashes(h, t, NB * SU_B, SU_B);
    assert_int_equal(kvx_store_get_hash(&v, s, h[NB - 1]), 0); /* copies of one block: not ambiguous */
    kvx_view_release(&v);
    kvx_store_batch_destroy(a);
    kvx_store_close(r);
    kvx_store_close(s);
}

/* kvx_store_batch_put_envelope: the blocks of an exported envelope, put
 * into a batch of another store, are acknowledged by that batch's flush. */
static void test_batch_put_envelope(void **state)
{
    (void)state;
    char d1[300], d2[300];
    su_new_dir(d1, sizeof d1);
    su_new_dir(d2, sizeof d2);
    kvx_store *s1 = su_create(d1, (su_spec){.capacity = 64 << 20, .flags = KVX_STORE_NOWAIT}),
              *s2 = su_create(d2, (su_spec){.capacity = 64 << 20, .flags = KVX_STORE_NOWAIT});
    assert_int_equal(su_put_batch(s1, NULL, 200, NULL), 0);
    assert_int_equal(kvx_store_flush(s1), 0);
    uint32_t t[NB * SU_B];
    su_tokens(t, 200, NB, 0);
    kvx_view v[NB];
    size_t n = 0;
    assert_int_equal(kvx_store_prefix(v, &n, s1, t, NB * SU_B, NB), 0);
    assert_int_equal(n, NB);
    void *env = NULL;
    size_t len = 0;
    assert_int_equal(kvx_views_export(&env, &len, s1, v, n, KVX_ENVELOPE_V1), 0);
    kvx_views_release(v, n);
    kvx_store_batch *b;
    assert_int_equal(kvx_store_batch_create(&b, s2), 0);
    size_t added = 0;
    assert_int_equal(kvx_store_batch_put_envelope(b, env, len, t, NB * SU_B, &added), 0);
    assert_int_equal(added, NB);
    assert_int_equal(su_prefix_nb(s2, 200), 0);
    assert_int_equal(kvx_store_batch_flush(b), 0);
    assert_int_equal(su_prefix_nb(s2, 200), NB);
    kvx_free(env);
    kvx_store_batch_destroy(b);
    kvx_store_close(s1);
    kvx_store_close(s2);
}

/* destroy drops the batch's unflushed blocks: its open writers and its
 * sealed, unpublished files (both in staging/: shards/ holds only what a
 * flush published) go; after the next open the
 * store holds exactly the files it held before. kvx_store_close with a
 * batch alive drops its blocks the same way and detaches it: every call
 * but destroy is then KVX_EINVALID, and destroy frees it. */
/* PROMISE: DUR-13 */
static void test_destroy_drops_unflushed(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(
        dir,
        (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT}); /* ~3 blocks a shard */
    assert_int_equal(su_put_batch(s, NULL, 300, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    char before[8192], now[8192];
    shard_names(dir, before, sizeof before);
    kvx_store_batch *a;
    assert_int_equal(kvx_store_batch_create(&a, s), 0);
    assert_int_equal(su_put_batch(s, a, 301, NULL), 0);
    assert_int_equal(su_put_batch(s, a, 302, NULL), 0);
    shard_names(dir, now, sizeof now);
    assert_string_equal(now, before);             /* nothing in shards/ before the flush */
    assert_true(su_n_files(dir, "staging") >= 2);    /* sealed, unpublished files wait there */
    kvx_store_batch_destroy(a);
    kvx_store_batch_destroy(NULL);
    shard_names(dir, now, sizeof now);
    assert_string_equal(now, before);
    assert_int_equal(su_n_files(dir, "staging"), 0);
    assert_int_equal(su_prefix_nb(s, 301), 0);
    /* close with a batch alive */
    kvx_store_batch *c;
    assert_int_equal(kvx_store_batch_create(&c, s), 0);
    assert_int_equal(su_put_batch(s, c, 303, NULL), 0);
    assert_int_equal(su_put_batch(s, c, 304, NULL), 0);
    kvx_store_close(s);
    assert_int_equal(su_put_batch(NULL, c, 305, NULL), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "closed"));
    assert_int_equal(kvx_store_batch_flush(c), KVX_EINVALID);
    kvx_store_batch_destroy(c);
    shard_names(dir, now, sizeof now);
    assert_string_equal(now, before);
    assert_int_equal(su_n_files(dir, "staging"), 0);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT), 0);
    shard_names(dir, now, sizeof now);
    assert_string_equal(now, before);
    assert_int_equal(su_n_files(dir, "staging"), 0);
    assert_int_equal(su_prefix_nb(s, 300), NB);
    for (uint64_t q = 301; q < 306; q++) assert_int_equal(su_prefix_nb(s, q), 0);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* A process killed -9 after puts that sealed shards (the target is ~3
 * blocks, so every put seals two) but before their flush: the sealed
 * files were in staging/, recovery removes them, and the reopened store
 * holds exactly what the last flush acknowledged, with nothing of the
 * unflushed puts served, in the built-in batch or a caller's. (Before
 * sealed files waited in staging/, they sat in shards/ and recovery
 * adopted them: a batch nobody flushed became visible after a crash.) */
/* PROMISE: DUR-4 */
static void test_kill9_unflushed_never_adopted(void **state)
{
    (void)state;
    for (int own = 0; own < 2; own++) {
        char dir[300];
        su_new_dir(dir, sizeof dir);
        kvx_store *s =
            su_create(dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT});
        assert_int_equal(su_put_batch(s, NULL, 400, NULL), 0);
        assert_int_equal(kvx_store_flush(s), 0);
        char before[8192], now[8192];
        shard_names(dir, before, sizeof before);
        kvx_store_close(s);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            kvx_store *c = NULL;
            kvx_store_batch *b = NULL;
            if (kvx_store_open(&c, dir, NULL, KVX_STORE_NOWAIT)) _exit(3);
            if (!own && kvx_store_batch_create(&b, c)) _exit(4);
            for (uint64_t q = 401; q < 405; q++)
                if (su_put_batch(c, b, q, NULL)) _exit(5);
            if (su_n_files(dir, "staging") < 4) _exit(6); /* sealed files, waiting */
            raise(SIGKILL);
            _exit(7);
        }
        int ws = 0;
        assert_int_equal(waitpid(pid, &ws, 0), pid);
        if (!WIFSIGNALED(ws)) fail_msg("child exited with %d before the kill", WEXITSTATUS(ws));
        assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT), 0);
        shard_names(dir, now, sizeof now);
        assert_string_equal(now, before);
        assert_int_equal(su_n_files(dir, "staging"), 0);
        assert_int_equal(su_prefix_nb(s, 400), NB);
        for (uint64_t q = 401; q < 405; q++) assert_int_equal(su_prefix_nb(s, q), 0);
        kvx_store_stats st;
        assert_int_equal(kvx_store_stat(&st, s), 0);
        assert_int_equal(st.blocks, NB);
        su_verify_clean(s);
        /* the same puts, flushed this time, are all served */
        for (uint64_t q = 401; q < 405; q++) assert_int_equal(su_put_batch(s, NULL, q, NULL), 0);
        assert_int_equal(kvx_store_flush(s), 0);
        for (uint64_t q = 401; q < 405; q++) assert_int_equal(su_prefix_nb(s, q), NB);
        kvx_store_close(s);
    }
}

/* The built-in batch is shared by every caller of kvx_store_put: a failed
 * put drops the blocks earlier successful puts added, and the next
 * kvx_store_flush says so (KVX_EDROPPED, how many, why), once, instead of
 * answering 0 as if they were stored. A put that fails with nothing of an
 * earlier put dropped leaves the next flush at 0. */
/* PROMISE: DUR-10 */
static void test_builtin_silent_loss(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .flags = KVX_STORE_NOWAIT});
    assert_int_equal(su_put_batch(s, NULL, 400, NULL), 0); /* "thread B" */
    fault_install();
    fault_only = FAULT_RW;
    fault_reset(1, EIO, FAULT_ERRNO); /* "thread A": its first write fails */
    int rc = su_put_batch(s, NULL, 401, NULL);
    assert_int_equal(fault_hits, 1);
    fault_uninstall();
    assert_int_not_equal(rc, 0);
    rc = kvx_store_flush(s);
    assert_int_equal(rc, KVX_EDROPPED);
    assert_string_equal(kvx_err_name(rc), "KVX_EDROPPED");
    assert_non_null(strstr(kvx_last_error(), "6 block(s)"));
    assert_non_null(strstr(kvx_last_error(), "dropped"));
    assert_int_equal(su_prefix_nb(s, 400), 0);
    assert_int_equal(kvx_store_flush(s), 0); /* once */
    /* put again, they are stored */
    assert_int_equal(su_put_batch(s, NULL, 400, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(su_prefix_nb(s, 400), NB);
    /* a failed put with nothing before it in the batch: the flush is 0 */
    fault_install();
    fault_only = FAULT_RW;
    fault_reset(1, EIO, FAULT_ERRNO);
    assert_int_not_equal(su_put_batch(s, NULL, 402, NULL), 0);
    fault_uninstall();
    assert_int_equal(kvx_store_flush(s), 0);
    /* a failed flush reports itself, and the next one starts afresh */
    assert_int_equal(su_put_batch(s, NULL, 403, NULL), 0);
    fault_install();
    fault_only = FAULT_SYNC;
    fault_reset(1, EIO, FAULT_ERRNO);
    assert_int_not_equal(kvx_store_flush(s), 0);
    fault_uninstall();
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(su_prefix_nb(s, 400), NB);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT), 0);
    assert_int_equal(su_prefix_nb(s, 400), NB);
    su_verify_clean(s);
    kvx_store_close(s);
}

enum { NTHREADS = 8, PER_THREAD = 30 };

typedef struct th_arg {
    kvx_store *s;
    int id;
    int rc;
} th_arg;

static void *th_main(void *p)
{
    th_arg *a = p;
    kvx_store_batch *b = NULL;
    a->rc = kvx_store_batch_create(&b, a->s);
    for (int j = 0; !a->rc && j < PER_THREAD; j++) {
        a->rc = su_put_batch(a->s, b, 10000 + (uint64_t)a->id * 1000 + (uint64_t)j, NULL);
        if (!a->rc && j % 5 == 4) a->rc = kvx_store_batch_flush(b);
    }
    if (!a->rc) a->rc = kvx_store_batch_flush(b);
    kvx_store_batch_destroy(b);
    return NULL;
}

/* N threads, each with its own batch, put distinct prompts at once and
 * flush every few: every flush is 0 and every block is served, also after
 * reopen. */
/* PROMISE: DUR-8 */
static void test_threads_own_batches(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 256 << 20, .shard_bytes = 64 << 10, .flags = KVX_STORE_NOWAIT});
    pthread_t th[NTHREADS];
    th_arg arg[NTHREADS];
    for (int i = 0; i < NTHREADS; i++) {
        arg[i] = (th_arg){s, i, -1};
        assert_int_equal(pthread_create(&th[i], NULL, th_main, &arg[i]), 0);
    }
    for (int i = 0; i < NTHREADS; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < NTHREADS; i++) assert_int_equal(arg[i].rc, 0);
    for (int i = 0; i < NTHREADS; i++)
        for (int j = 0; j < PER_THREAD; j++)
            assert_int_equal(su_prefix_nb(s, 10000 + (uint64_t)i * 1000 + (uint64_t)j), NB);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT), 0);
    for (int i = 0; i < NTHREADS; i++)
        for (int j = 0; j < PER_THREAD; j++)
            assert_int_equal(su_prefix_nb(s, 10000 + (uint64_t)i * 1000 + (uint64_t)j), NB);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* The paths of the shards that serve seq's blocks now. */
static size_t seq_shards(kvx_store *s, uint64_t seq, char (*paths)[512], size_t max)
{
    uint32_t t[NB * SU_B];
    su_tokens(t, seq, NB, 0);
    kvx_view v[NB];
    size_t n = 0, np = 0;
    assert_int_equal(kvx_store_prefix(v, &n, s, t, NB * SU_B, NB), 0);
    for (size_t i = 0; i < n; i++) {
        const char *p = kvx_shard_path(v[i].shard);
        int seen = 0;
        for (size_t j = 0; j < np; j++) seen |= !strcmp(paths[j], p);
        if (!seen && np < max) snprintf(paths[np++], 512, "%s", p);
    }
    kvx_views_release(v, n);
    return np;
}

static int shard_live(kvx_store *s, const char *path)
{
    kvx_shard **sh = NULL;
    size_t n = 0;
    assert_int_equal(kvx_store_shards(&sh, &n, s), 0);
    int live = 0;
    for (size_t i = 0; i < n; i++) {
        live |= !strcmp(kvx_shard_path(sh[i]), path);
        kvx_shard_close(sh[i]);
    }
    kvx_free(sh);
    return live;
}

/* Batch A puts a prompt the store holds (nothing written: its shards are
 * pinned until A's flush). Batch B then turns the whole store over several
 * times, flush after flush: the shards A relies on are never evicted, and
 * A's flush acknowledges blocks that are all there. Once A has flushed
 * (pins released), B's turnover evicts them like any old shard. */
/* PROMISE: DUR-11 */
static void test_pins_across_batches(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 300 << 10, .shard_bytes = 40 << 10, .flags = KVX_STORE_NOWAIT});
    for (uint64_t q = 0; q < 12; q++) { /* the store at its capacity */
        assert_int_equal(su_put_batch(s, NULL, q, NULL), 0);
        assert_int_equal(kvx_store_flush(s), 0);
    }
    assert_int_equal(su_prefix_nb(s, 11), NB);
    char paths[4][512];
    size_t np = seq_shards(s, 11, paths, 4);
    assert_true(np >= 1);
    kvx_store_batch *a, *b;
    assert_int_equal(kvx_store_batch_create(&a, s), 0);
    assert_int_equal(kvx_store_batch_create(&b, s), 0);
    size_t added = 9;
    assert_int_equal(su_put_batch(s, a, 11, &added), 0);
    assert_int_equal(added, 0); /* all held: A relies on those shards */
    for (uint64_t q = 100; q < 140; q++) {
        assert_int_equal(su_put_batch(s, b, q, NULL), 0);
        assert_int_equal(kvx_store_batch_flush(b), 0);
    }
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.evictions > 0);
    for (size_t i = 0; i < np; i++) assert_true(shard_live(s, paths[i]));
    assert_int_equal(kvx_store_batch_flush(a), 0);
    assert_int_equal(su_prefix_nb(s, 11), NB);
    /* A's pins are gone with its flush: the turnover takes them now */
    for (uint64_t q = 200; q < 240; q++) {
        assert_int_equal(su_put_batch(s, b, q, NULL), 0);
        assert_int_equal(kvx_store_batch_flush(b), 0);
    }
    int any_gone = 0;
    for (size_t i = 0; i < np; i++) any_gone |= !shard_live(s, paths[i]);
    assert_true(any_gone);
    for (uint64_t q = 237; q < 240; q++) assert_int_equal(su_prefix_nb(s, q), NB);
    kvx_store_batch_destroy(a);
    kvx_store_batch_destroy(b);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* Many batches, each with an open writer: no two take one shard byte (a
 * shared byte would make one flush's shard replace another's); when all
 * 256 are taken the next put says KVX_EFULL, drops nothing of any other
 * batch, and every other batch's flush serves all its blocks. */
/* PROMISE: DUR-11 */
static void test_shard_ids_many_batches(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 1 << 30, .flags = KVX_STORE_NOWAIT});
    enum { NBAT = 260 };
    kvx_store_batch **bs = calloc(NBAT, sizeof *bs);
    int *ok = calloc(NBAT, sizeof *ok);
    uint8_t used[ST_SLOTS] = {0};
    int nok = 0;
    for (int i = 0; i < NBAT; i++) {
        assert_int_equal(kvx_store_batch_create(&bs[i], s), 0);
        int rc = su_put_batch(s, bs[i], 5000 + (uint64_t)i, NULL);
        if (rc == 0) {
            ok[i] = 1;
            nok++;
            assert_non_null(bs[i]->cur[ST_KIND_LINEAGE].w);
            uint8_t byte = bs[i]->cur[ST_KIND_LINEAGE].byte;
            assert_int_equal(used[byte], 0);
            used[byte] = 1;
        } else {
            assert_int_equal(rc, KVX_EFULL);
            assert_non_null(strstr(kvx_last_error(), "256 shard ids"));
        }
    }
    assert_int_equal(nok, ST_SLOTS);
    for (int i = NBAT - 1; i >= 0; i--) {
        assert_int_equal(kvx_store_batch_flush(bs[i]), 0);
        kvx_store_batch_destroy(bs[i]);
    }
    for (int i = 0; i < NBAT; i++) assert_int_equal(su_prefix_nb(s, 5000 + (uint64_t)i), ok[i] ? NB : 0);
    su_verify_clean(s);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT), 0);
    for (int i = 0; i < NBAT; i++) assert_int_equal(su_prefix_nb(s, 5000 + (uint64_t)i), ok[i] ? NB : 0);
    kvx_store_close(s);
    free(bs);
    free(ok);
}

/* Arguments: a reader's batch, NULL handles. */
static void test_batch_arguments(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .flags = KVX_STORE_NOWAIT});
    kvx_store *r = NULL;
    assert_int_equal(kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY), 0);
    kvx_store_batch *b = (kvx_store_batch *)1;
    assert_int_equal(kvx_store_batch_create(&b, r), KVX_EINVALID);
    assert_null(b);
    assert_int_equal(kvx_store_batch_create(NULL, s), KVX_EINVALID);
    assert_int_equal(kvx_store_batch_create(&b, NULL), KVX_EINVALID);
    assert_int_equal(kvx_store_batch_flush(NULL), KVX_EINVALID);
    size_t added = 9;
    assert_int_equal(kvx_store_batch_put(NULL, NULL, 0, NULL, 0, NULL, &added), KVX_EINVALID);
    assert_int_equal(added, 0);
    assert_int_equal(kvx_store_batch_put_envelope(NULL, "", 0, NULL, 0, NULL), KVX_EINVALID);
    assert_int_equal(kvx_store_batch_create(&b, s), 0);
    assert_int_equal(kvx_store_batch_put(b, NULL, 0, NULL, 0, NULL, NULL), 0); /* nothing to put */
    assert_int_equal(kvx_store_batch_flush(b), 0); /* nothing to flush */
    kvx_store_batch_destroy(b);
    kvx_store_close(r);
    kvx_store_close(s);
}

int main(int argc, char **argv)
{
    /* these tests read the files one flush writes as its own shard
     * file (the path keyed stores, whole batches and a second batch
     * still take): the active shard has its own, tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failed_batch_spares_other),
        cmocka_unit_test(test_capacity_refusal_drops_nothing),
        cmocka_unit_test(test_flush_publishes_only_its_batch),
        cmocka_unit_test(test_batch_put_envelope),
        cmocka_unit_test(test_destroy_drops_unflushed),
        cmocka_unit_test(test_kill9_unflushed_never_adopted),
        cmocka_unit_test(test_builtin_silent_loss),
        cmocka_unit_test(test_threads_own_batches),
        cmocka_unit_test(test_pins_across_batches),
        cmocka_unit_test(test_shard_ids_many_batches),
        cmocka_unit_test(test_batch_arguments),
    };
    return cmocka_run_group_tests_name("engine/batch", tests, su_setup, su_teardown);
}
