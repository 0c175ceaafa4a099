/*
 * writers.c - engine/store_writers.c: a batch's sealed files wait in
 * staging/ and reach shards/ only at its flush, as one catalog edit: a
 * flush failing at any OS call, a publication rename finding its name
 * taken, one batch of several failing, destroy and close with staged
 * files, capacity with staged files, a stream's finish failing mid
 * publication, a file system without hard links.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/fault.h"
#include "lib/store.h"

#define NB 6 /* blocks per sequence */

/* A file system without hard links (linkat: EPERM): a flush needs none
 * (its sealed files move into shards/; its commit's mark says whether it
 * answered), so it acknowledges and serves every block, also after
 * reopen, with staging/ left empty, and never asks for a link. */
static kvx_os_ops nolink_real;

static long nolink_calls;

static int nolink_linkat(int a, const char *b, int c, const char *d, int e)
{
    (void)a, (void)b, (void)c, (void)d, (void)e;
    nolink_calls++;
    errno = EPERM;
    return -1;
}

/* PROMISE: DUR-5 */
static void test_flush_without_hard_links(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT});
    kvx_os_reset();
    nolink_real = kvx_os;
    kvx_os.linkat = nolink_linkat;
    nolink_calls = 0;
    kvx_store_batch *b;
    assert_int_equal(kvx_store_batch_create(&b, s), 0);
    for (uint64_t q = 500; q < 503; q++) assert_int_equal(su_put_batch(s, b, q, NULL), 0);
    assert_int_equal(kvx_store_batch_flush(b), 0);
    kvx_store_batch_destroy(b);
    kvx_os = nolink_real;
    assert_int_equal(nolink_calls, 0); /* several files, none linked */
    for (uint64_t q = 500; q < 503; q++) assert_int_equal(su_prefix_nb(s, q), NB);
    assert_int_equal(su_n_files(dir, "staging"), 0);
    su_verify_clean(s);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT), 0);
    for (uint64_t q = 500; q < 503; q++) assert_int_equal(su_prefix_nb(s, q), NB);
    kvx_store_close(s);
}

/* Files in dir/staging with no other name (not a published shard's
 * leftover staging/ link). */
static size_t staged_only(const char *dir)
{
    char names[512][64];
    size_t n = su_list_names(dir, "staging", names, 512), only = 0;
    for (size_t i = 0; i < n; i++) {
        char p[700];
        struct stat st;
        snprintf(p, sizeof p, "%s/staging/%s", dir, names[i]);
        if (stat(p, &st) == 0 && st.st_nlink == 1) only++;
    }
    return only;
}

static int read_file(const char *path, char *buf, size_t cap, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    *len = fread(buf, 1, cap, f);
    fclose(f);
    return 0;
}

/* A batch of 3 sequences (several sealed files in staging/) whose flush
 * fails at its k-th OS call, for every k, with EIO then ENOSPC. A flush
 * answering 0 serves all; one answering an error serves nothing of the
 * batch and leaves shards/ exactly as before it (nothing a recovery would
 * adopt) and staging/ empty. Everything acknowledged is served byte for
 * byte throughout and after reopen; nothing of a failed flush after it. */
/* PROMISE: DUR-4 */
static void test_flush_fault_every_call(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT});
    static uint64_t acked[4096], lost[4096];
    size_t nacked = 0, nlost = 0;
    uint64_t seq = 1;
    assert_int_equal(su_put_batch(s, NULL, seq, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    acked[nacked++] = seq++;
    fault_install();
    kvx_store_batch *a;
    assert_int_equal(kvx_store_batch_create(&a, s), 0);
    for (int i = 0; i < 3; i++) assert_int_equal(su_put_batch(s, a, seq + (uint64_t)i, NULL), 0);
    assert_true(su_n_files(dir, "staging") >= 3);
    fault_reset(0, EIO, FAULT_ERRNO);
    assert_int_equal(kvx_store_batch_flush(a), 0);
    long ncalls = fault_calls;
    for (int i = 0; i < 3; i++) acked[nacked++] = seq++;
    kvx_store_batch_destroy(a);
    assert_true(ncalls >= 6);
    int failed = 0, renames_failed = 0, dirsync_failed = 0;
    static char before[16384], now[16384];
    for (int e = 0; e < 2; e++) {
        int err = e ? ENOSPC : EIO;
        for (long k = 1; k <= ncalls + 2; k++) {
            assert_int_equal(kvx_store_batch_create(&a, s), 0);
            uint64_t first = seq;
            for (int i = 0; i < 3; i++) assert_int_equal(su_put_batch(s, a, seq++, NULL), 0);
            su_names_of(dir, "shards", before, sizeof before);
            fault_reset(k, err, FAULT_ERRNO);
            int rc = kvx_store_batch_flush(a);
            const char *op = fault_hit_op;
            fault_reset(0, EIO, FAULT_ERRNO);
            if (rc == 0) {
                for (uint64_t q = first; q < seq; q++) {
                    assert_int_equal(su_prefix_nb(s, q), NB);
                    acked[nacked++] = q;
                }
            } else {
                failed++;
                if (op && !strcmp(op, "rename_noreplace")) renames_failed++;
                if (op && (!strcmp(op, "fsync") || !strcmp(op, "fdatasync"))) dirsync_failed++;
                for (uint64_t q = first; q < seq; q++) {
                    size_t n = su_prefix_nb(s, q);
                    if (n != 0)
                        fail_msg("flush failed at call %ld (%s: %s) yet seq %" PRIu64 " serves %zu block(s)", k,
                                 op ? op : "?", kvx_err_name(rc), q, n);
                    lost[nlost++] = q;
                }
                su_names_of(dir, "shards", now, sizeof now);
                if (strcmp(now, before))
                    fail_msg("flush failed at call %ld (%s): shards/ changed\nbefore: %s\nnow:    %s", k,
                             op ? op : "?", before, now);
                /* a staging/ name of a published file may stay (a fault
                 * in the unlink after an earlier flush's commit: recovery
                 * removes it); a file only in staging/ must not */
                if (staged_only(dir) != 0)
                    fail_msg("flush failed at call %ld (%s): %zu file(s) left only in staging/", k, op ? op : "?",
                             staged_only(dir));
            }
            kvx_store_batch_destroy(a);
            for (size_t i = 0; i < nacked; i++) assert_int_equal(su_prefix_nb(s, acked[i]), NB);
        }
    }
    fault_uninstall();
    assert_true(failed > 0);
    assert_true(renames_failed > 0); /* the publication itself was hit */
    assert_true(dirsync_failed > 0);
    /* the store works: one more batch */
    assert_int_equal(su_put_batch(s, NULL, seq, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    acked[nacked++] = seq++;
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    for (size_t i = 0; i < nacked; i++) assert_int_equal(su_prefix_nb(s, acked[i]), NB);
    for (size_t i = 0; i < nlost; i++) assert_int_equal(su_prefix_nb(s, lost[i]), 0);
    assert_int_equal(su_n_files(dir, "staging"), 0);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* The publication rename finds shards/<gen>.kvx taken (a file put there by
 * hand after the store opened, under a staged file's generation): the
 * flush fails (RENAME_NOREPLACE never replaces), the hand-placed file
 * keeps its bytes, the batch's files that were already moved are taken
 * back out of shards/, nothing of the batch is served, staging/ is empty,
 * and the store goes on. */
/* PROMISE: DUR-6 */
static void test_eexist_on_publish(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT});
    assert_int_equal(su_put_batch(s, NULL, 10, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    for (int pick = 0; pick < 2; pick++) { /* 0: the last staged gen, 1: the first */
        kvx_store_batch *a;
        assert_int_equal(kvx_store_batch_create(&a, s), 0);
        uint64_t first = 20 + (uint64_t)pick * 10;
        for (uint64_t q = first; q < first + 3; q++) assert_int_equal(su_put_batch(s, a, q, NULL), 0);
        uint64_t gens[64], maxg, ming = UINT64_MAX;
        size_t ng = su_staged_gens(dir, gens, 64, &maxg);
        assert_true(ng >= 3);
        for (size_t i = 0; i < ng; i++)
            if (gens[i] < ming) ming = gens[i];
        uint64_t g = pick ? ming : maxg;
        char hand[512];
        snprintf(hand, sizeof hand, "%s/shards/%016" PRIx64 ".kvx", dir, g);
        FILE *f = fopen(hand, "wb");
        assert_non_null(f);
        const char body[] = "hand-placed, not a shard";
        fwrite(body, 1, sizeof body, f);
        fclose(f);
        static char before[16384], now[16384];
        su_names_of(dir, "shards", before, sizeof before);
        int rc = kvx_store_batch_flush(a);
        assert_int_not_equal(rc, 0);
        char got[256];
        size_t len = 0;
        assert_int_equal(read_file(hand, got, sizeof got, &len), 0);
        assert_int_equal(len, sizeof body);
        assert_memory_equal(got, body, sizeof body);
        su_names_of(dir, "shards", now, sizeof now);
        assert_string_equal(now, before);
        assert_int_equal(su_n_files(dir, "staging"), 0);
        for (uint64_t q = first; q < first + 3; q++) assert_int_equal(su_prefix_nb(s, q), 0);
        /* the failed flush reported the loss itself: the batch starts afresh */
        assert_int_equal(kvx_store_batch_flush(a), 0);
        assert_int_equal(su_prefix_nb(s, 10), NB);
        /* the store and the batch go on: the same puts again, flushed */
        for (uint64_t q = first; q < first + 3; q++) assert_int_equal(su_put_batch(s, a, q, NULL), 0);
        assert_int_equal(kvx_store_batch_flush(a), 0);
        kvx_store_batch_destroy(a);
        assert_int_equal(su_n_files(dir, "staging"), 0);
        for (uint64_t q = first; q < first + 3; q++) assert_int_equal(su_prefix_nb(s, q), NB);
    }
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(su_prefix_nb(s, 10), NB);
    for (uint64_t q = 20; q < 23; q++) assert_int_equal(su_prefix_nb(s, q), NB);
    for (uint64_t q = 30; q < 33; q++) assert_int_equal(su_prefix_nb(s, q), NB);
    kvx_store_close(s);
}

/* Three batches, each with sealed files in staging/; the flush of one
 * fails at its second publication rename. The other two flush and serve
 * all; shards/ then holds only theirs (besides what was there). */
/* PROMISE: DUR-9 */
static void test_several_batches_one_fails(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT});
    kvx_store_batch *b[3];
    su_lagging(s); /* the first flush's mark (store_lag.c) is not what this counts */
    for (int i = 0; i < 3; i++) assert_int_equal(kvx_store_batch_create(&b[i], s), 0);
    for (int r = 0; r < 2; r++)
        for (int i = 0; i < 3; i++) assert_int_equal(su_put_batch(s, b[i], 100 + (uint64_t)(i * 10 + r), NULL), 0);
    assert_true(su_n_files(dir, "staging") >= 6);
    static char before[16384];
    su_names_of(dir, "shards", before, sizeof before);
    fault_install();
    fault_only = FAULT_NAME;
    fault_reset(2, EIO, FAULT_ERRNO);
    int rc = kvx_store_batch_flush(b[1]);
    const char *op = fault_hit_op;
    fault_uninstall();
    assert_int_not_equal(rc, 0);
    assert_non_null(op);
    assert_string_equal(op, "rename_noreplace"); /* a file's move into shards/ */
    static char now[16384];
    su_names_of(dir, "shards", now, sizeof now);
    assert_string_equal(now, before);
    for (int r = 0; r < 2; r++) assert_int_equal(su_prefix_nb(s, 110 + (uint64_t)r), 0);
    assert_int_equal(kvx_store_batch_flush(b[0]), 0);
    assert_int_equal(kvx_store_batch_flush(b[2]), 0);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(su_prefix_nb(s, 100 + (uint64_t)r), NB);
        assert_int_equal(su_prefix_nb(s, 120 + (uint64_t)r), NB);
        assert_int_equal(su_prefix_nb(s, 110 + (uint64_t)r), 0);
    }
    assert_int_equal(su_n_files(dir, "staging"), 0);
    for (int i = 0; i < 3; i++) kvx_store_batch_destroy(b[i]);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    for (int r = 0; r < 2; r++) {
        assert_int_equal(su_prefix_nb(s, 100 + (uint64_t)r), NB);
        assert_int_equal(su_prefix_nb(s, 120 + (uint64_t)r), NB);
        assert_int_equal(su_prefix_nb(s, 110 + (uint64_t)r), 0);
    }
    su_verify_clean(s);
    kvx_store_close(s);
}

/* destroy whose unlink of a staged file fails leaves that file in staging/
 * (never in shards/); the next open removes it and serves nothing of it.
 * close with two batches holding staged files leaves staging/ empty. */
/* PROMISE: DUR-13 */
static void test_destroy_close_with_staged(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s = su_create(dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT});
    assert_int_equal(su_put_batch(s, NULL, 200, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    static char before[16384], now[16384];
    su_names_of(dir, "shards", before, sizeof before);
    kvx_store_batch *a, *b, *c;
    assert_int_equal(kvx_store_batch_create(&a, s), 0);
    assert_int_equal(su_put_batch(s, a, 201, NULL), 0);
    assert_int_equal(su_put_batch(s, a, 202, NULL), 0);
    assert_true(su_n_files(dir, "staging") >= 2);
    fault_install();
    fault_only = FAULT_NAME;
    fault_reset(1, EIO, FAULT_ERRNO);
    kvx_store_batch_destroy(a);
    fault_uninstall();
    su_names_of(dir, "shards", now, sizeof now);
    assert_string_equal(now, before);
    assert_int_equal(su_prefix_nb(s, 201), 0);
    assert_int_equal(kvx_store_batch_create(&b, s), 0);
    assert_int_equal(kvx_store_batch_create(&c, s), 0);
    assert_int_equal(su_put_batch(s, b, 203, NULL), 0);
    assert_int_equal(su_put_batch(s, c, 204, NULL), 0);
    assert_int_equal(su_put_batch(s, b, 205, NULL), 0);
    kvx_store_close(s);
    kvx_store_batch_destroy(b);
    kvx_store_batch_destroy(c);
    su_names_of(dir, "shards", now, sizeof now);
    assert_string_equal(now, before);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(su_n_files(dir, "staging"), 0);
    su_names_of(dir, "shards", now, sizeof now);
    assert_string_equal(now, before);
    assert_int_equal(su_prefix_nb(s, 200), NB);
    for (uint64_t q = 201; q < 206; q++) assert_int_equal(su_prefix_nb(s, q), 0);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* A batch holding staged files while the built-in batch's puts push the
 * store over its capacity: eviction makes room from published shards only;
 * the batch's flush then acknowledges all of its blocks, and the store is
 * within its capacity after it. */
/* PROMISE: STORE-3 */
static void test_capacity_with_staged(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    const uint64_t cap = 256 << 10;
    kvx_store *s = su_create(dir, (su_spec){.capacity = cap, .shard_bytes = 16 << 10, .flags = KVX_STORE_NOWAIT});
    kvx_store_batch *a;
    assert_int_equal(kvx_store_batch_create(&a, s), 0);
    for (uint64_t q = 600; q < 603; q++) assert_int_equal(su_put_batch(s, a, q, NULL), 0);
    assert_true(su_n_files(dir, "staging") >= 3);
    for (uint64_t q = 700; q < 760; q++) {
        assert_int_equal(su_put_batch(s, NULL, q, NULL), 0);
        assert_int_equal(kvx_store_flush(s), 0);
        assert_int_equal(su_prefix_nb(s, q), NB); /* just acknowledged: the newest */
    }
    assert_int_equal(kvx_store_batch_flush(a), 0);
    for (uint64_t q = 600; q < 603; q++) assert_int_equal(su_prefix_nb(s, q), NB);
    kvx_store_batch_destroy(a);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    if (st.bytes > cap) fail_msg("%llu bytes in a %llu-byte store", (unsigned long long)st.bytes, (unsigned long long)cap);
    assert_int_equal(su_n_files(dir, "staging"), 0);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    for (uint64_t q = 600; q < 603; q++) assert_int_equal(su_prefix_nb(s, q), NB);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* The transfer path: a tl.kv.v1 stream of 20 blocks into a store whose
 * shards hold a few blocks (the stream's batch seals several files as it
 * goes), its finish failing at the second publication rename: the finish
 * reports the failure, nothing of the stream is served, shards/ is as
 * before and staging/ empty; the same stream again is acknowledged and
 * served, also after reopen. */
/* PROMISE: XFER-16 */
static void test_stream_finish_fails_midpublish(void **state)
{
    (void)state;
    char da[300], db[300];
    su_new_dir(da, sizeof da);
    su_new_dir(db, sizeof db);
    kvx_store *a = su_create(da, (su_spec){.capacity = 64 << 20, .flags = KVX_STORE_NOWAIT});
    kvx_store *b = su_create(db, (su_spec){.capacity = 64 << 20, .shard_bytes = 8 << 10, .flags = KVX_STORE_NOWAIT});
    enum { NBS = 20 };
    const uint64_t seq = 77;
    assert_int_equal(su_put_seq(a, seq, NBS), 0);
    uint32_t t[NBS * SU_B];
    uint64_t h[NBS];
    su_tokens(t, seq, NBS, 0);
    kvx_block_hashes(h, t, NBS * SU_B, SU_B);
    static kvx_view views[NBS];
    size_t nv = 0;
    assert_int_equal(kvx_store_prefix(views, &nv, a, t, NBS * SU_B, NBS), 0);
    assert_int_equal(nv, NBS);
    static kvx_xfer_chunk ch[NBS];
    void *env[NBS];
    for (size_t i = 0; i < NBS; i++) {
        size_t len = 0;
        assert_int_equal(kvx_views_export(&env[i], &len, a, &views[i], 1, KVX_ENVELOPE_V1), 0);
        memset(&ch[i], 0, sizeof ch[i]);
        ch[i].kv_format = 1;
        ch[i].block_hash = h[i];
        ch[i].tokens = t + i * SU_B;
        ch[i].n_tokens = SU_B;
        ch[i].payload = env[i];
        ch[i].payload_len = len;
        ch[i].crc32c = kvx_crc32c(0, env[i], len);
    }
    kvx_views_release(views, nv);
    su_lagging(b); /* the first flush's mark (store_lag.c) is not what this counts */
    static char before[16384], now[16384];
    su_names_of(db, "shards", before, sizeof before);
    kvx_xfer_stream *st = NULL;
    assert_int_equal(kvx_xfer_stream_create(&st, b), 0);
    for (size_t i = 0; i < NBS; i++) assert_int_equal(kvx_xfer_stream_chunk(st, &ch[i], NULL), 0);
    assert_true(su_n_files(db, "staging") >= 3);
    su_names_of(db, "shards", now, sizeof now);
    assert_string_equal(now, before);
    fault_install();
    fault_only = FAULT_NAME;
    fault_reset(2, EIO, FAULT_ERRNO);
    int rc = kvx_xfer_stream_finish(st, NULL);
    const char *op = fault_hit_op;
    fault_uninstall();
    assert_int_not_equal(rc, 0);
    assert_non_null(op);
    assert_string_equal(op, "rename_noreplace"); /* a file's move into shards/ */
    kvx_xfer_stream_destroy(st);
    assert_int_equal(su_served_prefix(b, seq, NBS), 0);
    su_names_of(db, "shards", now, sizeof now);
    assert_string_equal(now, before);
    assert_int_equal(su_n_files(db, "staging"), 0);
    kvx_store_stats sst;
    assert_int_equal(kvx_store_stat(&sst, b), 0);
    assert_int_equal(sst.blocks, 1); /* su_lagging's */
    /* again, no fault */
    assert_int_equal(kvx_xfer_stream_create(&st, b), 0);
    for (size_t i = 0; i < NBS; i++) assert_int_equal(kvx_xfer_stream_chunk(st, &ch[i], NULL), 0);
    kvx_xfer_result res;
    assert_int_equal(kvx_xfer_stream_finish(st, &res), 0);
    kvx_xfer_stream_destroy(st);
    assert_int_equal(su_served_prefix(b, seq, NBS), NBS);
    for (size_t i = 0; i < NBS; i++) kvx_free(env[i]);
    kvx_store_close(b);
    b = su_reopen(db, KVX_STORE_NOWAIT);
    assert_int_equal(su_served_prefix(b, seq, NBS), NBS);
    su_verify_clean(b);
    kvx_store_close(b);
    kvx_store_close(a);
}

int main(int argc, char **argv)
{
    /* these tests read the files one flush writes as its own shard
     * file (the path keyed stores, whole batches and a second batch
     * still take): the active shard has its own, tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flush_without_hard_links),
        cmocka_unit_test(test_stream_finish_fails_midpublish),
        cmocka_unit_test(test_flush_fault_every_call),
        cmocka_unit_test(test_eexist_on_publish),
        cmocka_unit_test(test_several_batches_one_fails),
        cmocka_unit_test(test_destroy_close_with_staged),
        cmocka_unit_test(test_capacity_with_staged),
    };
    return cmocka_run_group_tests_name("engine/writers", tests, su_setup, su_teardown);
}
