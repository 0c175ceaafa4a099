/*
 * maint.c - engine/store_maint.c and store_policy.c in the store: capacity
 * holds (after every flush, and while a put runs), eviction keeps the hot
 * blocks (per block recency, carries), small flushes are compacted, all
 * 256 shard ids taken is KVX_EFULL or an id eviction that respects pins,
 * leases, streams and batches; a damaged victim moves to quarantine/.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "engine/store.h"
#include "lib/fault.h"
#include "lib/store.h"

/* PROMISE: STORE-3, STORE-5 */
static void test_capacity_eviction_and_views(void **state)
{
    (void)state;
    char dir[300];
    /* shards of ~16 blocks, room for ~6 of them */
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 450 << 10, .shard_bytes = 70 << 10, .flags = KVX_STORE_NOWAIT});
    kvx_store_stats st;
    uint64_t h[16];
    su_put_shared(s, 0, 16, 0, h);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_view held;
    assert_int_equal(kvx_store_get_hash(&held, s, h[3]), 0);
    for (uint64_t q = 1; q < 40; q++) {
        su_put_shared(s, q, 16, 0, h);
        assert_int_equal(kvx_store_flush(s), 0);
        assert_int_equal(kvx_store_stat(&st, s), 0);
        assert_true(st.bytes <= st.capacity_bytes);
    }
    assert_true(st.evictions > 0);
    assert_true(st.evicted_blocks > 0);
    /* the oldest sequence is gone, the newest is whole */
    assert_int_equal(su_prefix_shared(s, 0, 16, 0, 1), 0);
    assert_int_equal(su_prefix_shared(s, 39, 16, 0, 1), 16);
    /* the view taken before eviction still reads the right bytes */
    uint32_t t[16 * SU_B];
    uint64_t h0[16];
    su_tokens(t, 0, 16, 0);
    kvx_block_hashes(h0, t, 16 * SU_B, SU_B);
    su_check_view(&held, h0[3]);
    kvx_view_release(&held);
    /* every prefix served is whole: no block without its predecessors */
    for (uint64_t q = 0; q < 40; q++) {
        size_t n = su_prefix_shared(s, q, 16, 0, 1);
        assert_true(n == 0 || n <= 16);
    }
    kvx_store_close(s);
}

/* PROMISE: STORE-6 */
static void test_hot_blocks_carried(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 450 << 10, .shard_bytes = 70 << 10, .flags = KVX_STORE_NOWAIT});
    uint64_t h[16];
    su_put_shared(s, 0, 16, 0, h);
    assert_int_equal(kvx_store_flush(s), 0);
    for (uint64_t q = 1; q < 60; q++) {
        assert_int_equal(su_prefix_shared(s, 0, 16, 0, 1), 16); /* seq 0 stays hot */
        su_put_shared(s, q, 16, 0, h);
        assert_int_equal(kvx_store_flush(s), 0);
    }
    assert_int_equal(su_prefix_shared(s, 0, 16, 0, 1), 16);
    assert_int_equal(su_prefix_shared(s, 1, 16, 0, 1), 0); /* cold: gone */
    kvx_store_close(s);
}

/* Recency is per block: a shard's cold blocks go while its hot ones are
 * carried, and putting a held block again counts as a use of it. */
/* PROMISE: STORE-6 */
static void test_recency_per_block(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 450 << 10, .shard_bytes = 70 << 10, .flags = KVX_STORE_NOWAIT});
    uint64_t h[16];
    su_put_shared(s, 0, 8, 0, h); /* A: looked up from now on */
    su_put_shared(s, 1, 8, 0, h); /* B: in the same shard, never used again */
    su_put_shared(s, 2, 8, 0, h); /* C: only ever put again */
    assert_int_equal(kvx_store_flush(s), 0);
    for (uint64_t q = 3; q < 60; q++) {
        assert_int_equal(su_prefix_shared(s, 0, 8, 0, 1), 8);
        assert_int_equal(su_put_shared(s, 2, 8, 0, h), 0); /* held: nothing new */
        su_put_shared(s, q, 16, 0, h);
        assert_int_equal(kvx_store_flush(s), 0);
    }
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.evictions > 0);
    assert_int_equal(su_prefix_shared(s, 0, 8, 0, 1), 8);
    assert_int_equal(su_prefix_shared(s, 2, 8, 0, 1), 8);
    assert_int_equal(su_prefix_shared(s, 1, 8, 0, 1), 0);
    kvx_store_close(s);
}

/* The same in a block store of small flushes: a prefix read after every
 * flush outlives blocks of the same age never read, though the small
 * flushes are merged many times before the first eviction. */
/* PROMISE: STORE-6 */
static void test_recency_kept_through_merges(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 2 << 20, .shard_bytes = 256 << 10, .flags = KVX_STORE_NOWAIT});
    uint64_t h[16];
    for (uint64_t q = 0; q < 400; q++) {
        su_put_shared(s, q, 8, 0, h);
        assert_int_equal(kvx_store_flush(s), 0);
        if (q && su_prefix_shared(s, 0, 8, 0, 1) != 8)
            fail_msg("seq 0 read after every flush, lost at %llu", (unsigned long long)q);
    }
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.compactions > 0);
    assert_true(st.evictions > 0);
    assert_int_equal(su_prefix_shared(s, 0, 8, 0, 1), 8);
    assert_int_equal(su_prefix_shared(s, 1, 8, 0, 1), 0); /* as old, never read: gone */
    assert_int_equal(su_prefix_shared(s, 399, 8, 0, 1), 8);
    kvx_store_close(s);
}

/* PROMISE: STORE-8 */
static void test_small_flushes_compacted(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20, .flags = KVX_STORE_NOWAIT});
    uint64_t h[4];
    /* 300 one-block flushes: would need 300 shard ids without compaction */
    for (uint64_t q = 0; q < 300; q++) {
        su_put_shared(s, q, 1, 0, h);
        int rc = kvx_store_flush(s);
        if (rc) fprintf(stderr, "flush %llu: %s\n", (unsigned long long)q, kvx_last_error());
        assert_int_equal(rc, 0);
    }
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.shards <= ST_COMPACT_AT + 1);
    assert_true(st.compactions > 0);
    assert_int_equal(st.blocks, 300);
    assert_int_equal(kvx_store_gc(s), 0);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    /* after gc at most one shard is below half the target size */
    assert_true(st.shards >= 1);
    assert_true(st.shards <= st.bytes / (st.shard_bytes / 2) + 1);
    assert_int_equal(st.blocks, 300);
    for (uint64_t q = 0; q < 300; q++) assert_int_equal(su_prefix_shared(s, q, 1, 0, 1), 1);
    uint64_t bad = 9;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    assert_int_equal(bad, 0);
    kvx_store_close(s);
}

/* test_capacity_limits: a capacity below the shard size is refused. */
/* PROMISE: STORE-4 */
static void test_capacity_limits(void **state)
{
    (void)state;
    char dir[300];
    snprintf(dir, sizeof dir, "%s/cap", su_root);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 100 << 10; /* below the default 512 KiB shard */
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "shard size"));
    assert_int_equal(access(dir, F_OK), -1); /* nothing made */
    o.shard_bytes = 32 << 10;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    kvx_store_close(s);
}

/* Bytes of the shard files the disk holds for the store at dir: every
 * .kvx in shards/ and every file in staging/ (the open writers' files and
 * the sealed ones waiting for their flush), each inode once (a flush
 * links a sealed file into shards/ before it drops the staging/ name).
 * Plain libc, never the OS seam, so it can run inside a seam call.
 * UINT64_MAX when a directory cannot be read. */
static uint64_t store_file_bytes(const char *dir)
{
    static const char *subs[] = {"shards", "staging"};
    ino_t seen[1024];
    size_t nseen = 0;
    uint64_t total = 0;
    for (int k = 0; k < 2; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dir, subs[k]);
        DIR *d = opendir(path);
        if (!d) return UINT64_MAX;
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            size_t len = strlen(e->d_name);
            if (k == 0 && (len < 4 || strcmp(e->d_name + len - 4, ".kvx") != 0)) continue;
            struct stat st;
            if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
            int again = 0;
            for (size_t i = 0; i < nseen && !again; i++) again = seen[i] == st.st_ino;
            if (again) continue;
            if (nseen == sizeof seen / sizeof seen[0]) {
                closedir(d);
                return UINT64_MAX;
            }
            seen[nseen++] = st.st_ino;
            total += (uint64_t)st.st_size;
        }
        closedir(d);
    }
    return total;
}

/* Sampling the disk at every seal while a put runs: the store stats each
 * file it seals for a batch under its staging/ name (".<16 hex>.kvx.tmp.
 * <pid>.<random>", engine/store_writers.c) through the OS seam; right
 * after that stat, before any eviction the seal calls for, is when the
 * files are at their most. The largest total seen and the count of
 * samples are kept (asserted after the call: a cmocka failure inside the
 * library would jump out of it holding its locks). */
static kvx_os_ops real_os;

static const char *sample_dir;

 /* NULL: not sampling */
static uint64_t sample_max;

static int sample_count;

/* samples after every page a writer writes (a batch's writers are
 * sealed only at its flush: their files grow in staging/ meanwhile) */
static ssize_t sampling_pwrite(int fd, const void *buf, size_t len, off_t off)
{
    ssize_t rc = real_os.pwrite(fd, buf, len, off);
    if (rc > 0 && sample_dir) {
        uint64_t b = store_file_bytes(sample_dir);
        if (b > sample_max) sample_max = b;
        sample_count++;
    }
    return rc;
}

static void sampling_start(const char *dir)
{
    real_os = kvx_os;
    kvx_os.pwrite = sampling_pwrite;
    sample_dir = dir;
    sample_max = 0;
    sample_count = 0;
}

static void sampling_stop(void)
{
    sample_dir = NULL;
    kvx_os_reset();
}

/* All 256 shard ids taken by shards that compaction cannot merge (one block
 * each, not small): the put that needs a 257th says KVX_EFULL, nothing
 * already flushed is lost, the store stays consistent and usable. */
/* PROMISE: STORE-9 */
static void test_shard_ids_exhausted(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = (uint64_t)1 << 30;
    o.shard_bytes = 4096; /* below one entry: one block per shard */
    o.flags = KVX_STORE_NOWAIT;
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    enum { NBIG = 260 };
    uint32_t *t = malloc(NBIG * SU_B * sizeof *t);
    uint64_t *h = malloc(NBIG * sizeof *h);
    su_tokens(t, 7, NBIG, 0);
    uint8_t *p = su_pages(t, NBIG, h, 64);
    size_t added = 0;
    int rc = kvx_store_put(s, t, NBIG * SU_B, p, NBIG, NULL, &added);
    assert_int_equal(rc, KVX_EFULL);
    assert_non_null(strstr(kvx_last_error(), "256 shard ids"));
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.shards <= 256);
    uint64_t bad = 9;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    /* whatever is served is whole and right */
    kvx_view *v = malloc(NBIG * sizeof *v);
    size_t n = 0;
    assert_int_equal(kvx_store_prefix(v, &n, s, t, NBIG * SU_B, NBIG), 0);
    assert_int_equal(n, st.blocks);
    uint8_t want[64];
    for (size_t i = 0; i < n; i++) {
        su_page(want, 64, h[i]);
        assert_memory_equal(v[i].page, want, 64);
    }
    kvx_views_release(v, n);
    kvx_store_close(s);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT | KVX_STORE_VERIFY), 0);
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.dropped_shards, 0);
    assert_int_equal(st.blocks, n);
    kvx_store_close(s);
    free(v);
    free(p);
    free(h);
    free(t);
}

/* A store far under its capacity whose 256 shard ids are all taken by
 * small published shards (one block each, every put flushed): the next
 * put evicts the coldest shards, as the capacity would, instead of
 * answering KVX_EFULL. Every put is acknowledged, the newest blocks are
 * all served byte for byte, the oldest went first, and the store never
 * holds more than 256 shards. (It once answered KVX_EFULL for good:
 * the kill -9 loop of tests/system/crash.c found it.) */
/* PROMISE: STORE-9 */
static void test_shard_ids_freed_by_eviction(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = (uint64_t)1 << 30;
    o.shard_bytes = 4096; /* below one entry: one block per shard */
    o.flags = KVX_STORE_NOWAIT;
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    enum { NSEQ = 400 };
    uint8_t want[64];
    for (uint64_t q = 0; q < NSEQ; q++) {
        uint32_t t[SU_B];
        uint64_t h;
        su_tokens(t, 9000 + q, 1, 0);
        uint8_t *p = su_pages(t, 1, &h, 64);
        assert_int_equal(kvx_store_put(s, t, SU_B, p, 1, NULL, NULL), 0);
        assert_int_equal(kvx_store_flush(s), 0);
        free(p);
    }
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_true(st.shards <= 256);
    assert_true(st.evictions > 0);
    assert_true(st.blocks >= 100 && st.blocks < NSEQ);
    /* the newest 100 are all there and right; the first went */
    for (uint64_t q = NSEQ - 100; q < NSEQ; q++) {
        uint32_t t[SU_B];
        su_tokens(t, 9000 + q, 1, 0);
        kvx_view v;
        size_t n = 0;
        assert_int_equal(kvx_store_prefix(&v, &n, s, t, SU_B, 1), 0);
        assert_int_equal(n, 1);
        uint64_t h;
        kvx_block_hashes(&h, t, SU_B, SU_B);
        su_page(want, 64, h);
        assert_memory_equal(v.page, want, 64);
        kvx_views_release(&v, n);
    }
    uint32_t t0[SU_B];
    su_tokens(t0, 9000, 1, 0);
    kvx_view v0;
    size_t n0 = 9;
    assert_int_equal(kvx_store_prefix(&v0, &n0, s, t0, SU_B, 1), 0);
    assert_int_equal(n0, 0);
    uint64_t bad = 9;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    assert_int_equal(bad, 0);
    kvx_store_close(s);
}

/* A flush acknowledges every block put since the previous flush, so the
 * unflushed batch must fit the store: several puts without a flush that
 * add up to more than the capacity were accepted, a flush inside one of
 * them published the first ones, a later one evicted them, and the
 * caller's flush acknowledged blocks already gone (a tests/system/powercut.c seed
 * 519173185). Now the put that would take the batch over is refused,
 * naming "flush first", and everything acknowledged is served whole. */
/* PROMISE: DUR-7 */
static void test_unflushed_batch_fits(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 120 << 10;
    o.shard_bytes = 32 << 10;
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    uint64_t seq = 700;
    size_t batch = 0;
    int refused = 0;
    for (int i = 0; i < 12 && !refused; i++, seq++) {
        uint32_t t[6 * SU_B];
        uint64_t h[6];
        su_tokens(t, seq, 6, 0);
        uint8_t *p = su_pages(t, 6, h, 64);
        int rc = kvx_store_put(s, t, 6 * SU_B, p, 6, NULL, NULL);
        free(p);
        if (rc == KVX_ECAPACITY) {
            assert_non_null(strstr(kvx_last_error(), "flush first"));
            refused = 1;
        } else {
            assert_int_equal(rc, 0);
            batch++;
        }
    }
    assert_true(refused && batch >= 2);
    assert_int_equal(kvx_store_flush(s), 0);
    for (size_t i = 0; i < batch; i++) assert_int_equal(su_served_prefix(s, 700 + i, 6), 6);
    /* after the flush the next batch starts empty */
    assert_int_equal(su_put_seq(s, seq, 6), 0);
    assert_int_equal(su_served_prefix(s, seq, 6), 6);
    kvx_store_close(s);
}

/* Capacity holds while a put runs, not only after the flush: a put of many
 * shards' worth into a full store may leave at most one shard over the
 * capacity on disk before its flush (issue 3, point 5; STORE.md
 * "Eviction": sealed but unpublished files count). The files are counted
 * where they are, shards/ and staging/ (a batch's sealed files wait in
 * staging/ until its flush), and sampled at every seal during the put and
 * its flush, not only once after it. */
/* PROMISE: DUR-7, STORE-3 */
static void test_capacity_during_put(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 300 << 10;
    o.shard_bytes = 40 << 10; /* ~9 blocks a shard */
    o.flags = KVX_STORE_NOWAIT;
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    for (uint64_t q = 0; q < 12; q++) {
        su_put_nb(s, q);
        assert_int_equal(kvx_store_flush(s), 0);
    }
    assert_true(store_file_bytes(dir) <= o.capacity_bytes);
    enum { NBIG = 64 }; /* ~7 shards */
    uint32_t t[NBIG * SU_B];
    uint64_t h[NBIG];
    su_tokens(t, 500, NBIG, 0);
    uint8_t *p = su_pages(t, NBIG, h, 64);
    uint64_t bound = o.capacity_bytes + o.shard_bytes;
    sampling_start(dir);
    int rc = kvx_store_put(s, t, NBIG * SU_B, p, NBIG, NULL, NULL);
    uint64_t put_max = sample_max;
    int put_samples = sample_count;
    uint64_t disk = store_file_bytes(dir); /* the open writer's file too */
    sample_max = 0;
    sample_count = 0;
    int frc = kvx_store_flush(s);
    uint64_t flush_max = sample_max;
    int flush_samples = sample_count;
    sampling_stop();
    assert_int_equal(rc, 0);
    assert_int_equal(frc, 0);
    if (put_max > bound || disk > bound || flush_max > bound)
        fprintf(stderr,
                "shards/ and staging/ held %llu bytes at a seal in the put, %llu after it, %llu at the flush's "
                "seal; capacity %llu, shard %llu; samples %d %d\n",
                (unsigned long long)put_max, (unsigned long long)disk, (unsigned long long)flush_max,
                (unsigned long long)o.capacity_bytes, (unsigned long long)o.shard_bytes, put_samples, flush_samples);
    assert_true(put_samples >= 5); /* every page: sampled during the put */
    assert_true(put_max <= bound);
    assert_true(disk <= bound);
    assert_true(flush_samples >= 1); /* the flush sealed the last shard */
    assert_true(flush_max <= bound);
    assert_true(store_file_bytes(dir) <= o.capacity_bytes);
    /* the newest sequence is whole */
    kvx_view v[NBIG];
    size_t n = 0;
    assert_int_equal(kvx_store_prefix(v, &n, s, t, NBIG * SU_B, NBIG), 0);
    assert_int_equal(n, NBIG);
    kvx_views_release(v, n);
    free(p);
    kvx_store_close(s);
    /* a batch larger than the whole store would keep only its tail, which
     * no prefix reaches: refused before anything is written, naming both
     * sizes (issue "Trust II" finding 5) */
    su_new_dir(dir, sizeof dir);
    o.capacity_bytes = 120 << 10;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    su_tokens(t, 501, NBIG, 0);
    p = su_pages(t, NBIG, h, 64);
    assert_int_equal(kvx_store_put(s, t, NBIG * SU_B, p, NBIG, NULL, NULL), KVX_ECAPACITY);
    assert_non_null(strstr(kvx_last_error(), "capacity of 122880 bytes"));
    assert_int_equal(store_file_bytes(dir), 0);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    assert_int_equal(st.pending_blocks, 0);
    assert_int_equal(st.blocks, 0);
    /* a put that fits still works */
    assert_int_equal(kvx_store_put(s, t, 8 * SU_B, p, 8, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_view last;
    assert_int_equal(kvx_store_get_hash(&last, s, h[7]), 0);
    uint8_t want[64];
    su_page(want, 64, h[7]);
    assert_memory_equal(last.page, want, 64);
    kvx_view_release(&last);
    uint64_t bad = 9;
    assert_int_equal(kvx_store_verify(s, &bad, NULL, NULL), 0);
    free(p);
    kvx_store_close(s);
}

#define CAP ((uint64_t)1 << 30)

#define A9_MASK (getenv("A9_M") ? (unsigned)atoi(getenv("A9_M")) : (unsigned)(FAULT_NAME | FAULT_SYNC | FAULT_TRUNC))

/* One block of seq into batch b (NULL: built-in); out_new nullable. */
static int put1(kvx_store *s, kvx_store_batch *b, uint64_t seq, size_t *out_new)
{
    uint32_t t[SU_B];
    uint64_t h;
    su_tokens(t, seq, 1, 0);
    uint8_t *p = su_pages(t, 1, &h, 64);
    int rc = b ? kvx_store_batch_put(b, t, SU_B, p, 1, NULL, out_new) : kvx_store_put(s, t, SU_B, p, 1, NULL, out_new);
    free(p);
    return rc;
}

static int put1_flush(kvx_store *s, uint64_t seq)
{
    int rc = put1(s, NULL, seq, NULL);
    return rc ? rc : kvx_store_flush(s);
}

/* 1 served right, 0 absent, SIZE_MAX wrong bytes */
static size_t served(kvx_store *s, uint64_t seq) { return su_served_prefix(s, seq, 1); }

/* Another batch's held put pins the oldest ten shards; 300 one-block
 * flushes afterwards run the ids out again and again (more than the ~176
 * an id eviction keeps, so their recency cannot save them): the pinned
 * ones stay, the batch's flush serves them, the unpinned old ones went. */
/* PROMISE: STORE-9 */
static void test_pins_survive_id_eviction(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s =
        su_create(dir, (su_spec){.capacity = CAP, .shard_bytes = 4096, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    for (uint64_t q = 0; q < 200; q++) assert_int_equal(put1_flush(s, q), 0);
    kvx_store_batch *a;
    assert_int_equal(kvx_store_batch_create(&a, s), 0);
    for (uint64_t q = 0; q < 10; q++) {
        size_t added = 9;
        assert_int_equal(put1(s, a, q, &added), 0);
        assert_int_equal(added, 0); /* held: pinned, not written */
    }
    for (uint64_t q = 200; q < 500; q++) {
        int rc = put1_flush(s, q);
        if (rc) fail_msg("put %" PRIu64 ": %s (%s)", q, kvx_err_name(rc), kvx_last_error());
    }
    kvx_store_stats st = su_stat(s);
    assert_true(st.evictions > 0);
    assert_true(st.shards <= 256);
    assert_int_equal(st.capacity_bytes, CAP);
    for (uint64_t q = 0; q < 10; q++) assert_int_equal(served(s, q), 1);
    assert_int_equal(kvx_store_batch_flush(a), 0);
    for (uint64_t q = 0; q < 10; q++) assert_int_equal(served(s, q), 1);
    kvx_store_batch_destroy(a);
    for (uint64_t q = 10; q < 20; q++) assert_int_equal(served(s, q), 0); /* unpinned and cold: gone */
    for (uint64_t q = 400; q < 500; q++) assert_int_equal(served(s, q), 1);
    su_verify_clean(s);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT | KVX_STORE_NOSYNC);
    for (uint64_t q = 0; q < 10; q++) assert_int_equal(served(s, q), 1);
    for (uint64_t q = 400; q < 500; q++) assert_int_equal(served(s, q), 1);
    for (uint64_t q = 0; q < 500; q++) assert_int_not_equal(served(s, q), SIZE_MAX);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* A tl.kv.v1 HasBlocks lease pins the ten oldest blocks; 300 one-block
 * flushes run the ids out again and again: the leased blocks stay (their
 * recency alone would not keep them), byte for byte; once the lease is
 * gone the next id evictions may take them. */
/* PROMISE: XFER-18 */
static void test_lease_pins_survive(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s =
        su_create(dir, (su_spec){.capacity = CAP, .shard_bytes = 4096, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    for (uint64_t q = 0; q < 200; q++) assert_int_equal(put1_flush(s, q), 0);
    uint64_t h[10];
    for (uint64_t q = 0; q < 10; q++) {
        uint32_t t[SU_B];
        su_tokens(t, q, 1, 0);
        kvx_block_hashes(&h[q], t, SU_B, SU_B);
    }
    uint8_t held[10];
    kvx_xfer_lease *l = NULL;
    assert_int_equal(kvx_xfer_has_blocks(held, &l, s, h, 10, NULL, 0, 0, 0), 0);
    for (int i = 0; i < 10; i++) assert_int_equal(held[i], 1);
    for (uint64_t q = 200; q < 500; q++) {
        int rc = put1_flush(s, q);
        if (rc) fail_msg("put %" PRIu64 ": %s (%s)", q, kvx_err_name(rc), kvx_last_error());
    }
    assert_true(su_stat(s).evictions > 0);
    assert_true(su_stat(s).shards <= 256);
    for (uint64_t q = 0; q < 10; q++) assert_int_equal(served(s, q), 1);
    for (uint64_t q = 10; q < 20; q++) assert_int_equal(served(s, q), 0);
    kvx_xfer_lease_destroy(l);
    for (uint64_t q = 500; q < 800; q++) assert_int_equal(put1_flush(s, q), 0);
    for (uint64_t q = 0; q < 800; q++) assert_int_not_equal(served(s, q), SIZE_MAX);
    for (uint64_t q = 700; q < 800; q++) assert_int_equal(served(s, q), 1);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* A tl.kv.v1 stream (a whole batch: nothing published before its finish)
 * of 40 one-block shards into a store already holding 230 one-block
 * shards: the ids run out mid-stream. The id eviction frees published
 * shards (the stream's sealed files are kept), nothing of the stream is
 * served before its finish, the finish acknowledges all 40 and they are
 * served byte for byte, also after reopen. */
/* PROMISE: XFER-9 */
static void test_stream_runs_out_midstream(void **state)
{
    (void)state;
    char da[300], db[300];
    su_new_dir(da, sizeof da);
    su_new_dir(db, sizeof db);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = 64 << 20;
    o.flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC;
    kvx_store *a = NULL;
    assert_int_equal(kvx_store_create(&a, da, &o), 0);
    kvx_store *b =
        su_create(db, (su_spec){.capacity = CAP, .shard_bytes = 4096, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    enum { NBS = 40 };
    const uint64_t seq = 777;
    assert_int_equal(su_put_seq(a, seq, NBS), 0);
    for (uint64_t q = 0; q < 230; q++) assert_int_equal(put1_flush(b, q), 0);
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
    kvx_xfer_stream *st = NULL;
    assert_int_equal(kvx_xfer_stream_create(&st, b), 0);
    for (size_t i = 0; i < NBS; i++) {
        int rc = kvx_xfer_stream_chunk(st, &ch[i], NULL);
        if (rc) fail_msg("chunk %zu: %s (%s)", i, kvx_err_name(rc), kvx_last_error());
    }
    assert_int_equal(su_served_prefix(b, seq, NBS), 0); /* not before its finish */
    assert_true(su_stat(b).evictions > 0);              /* the ids ran out mid-stream */
    assert_int_equal(su_stat(b).capacity_bytes, CAP);
    kvx_xfer_result res;
    assert_int_equal(kvx_xfer_stream_finish(st, &res), 0);
    assert_int_equal(res.blocks_stored, NBS);
    kvx_xfer_stream_destroy(st);
    assert_int_equal(su_served_prefix(b, seq, NBS), NBS);
    for (uint64_t q = 0; q < 230; q++) assert_int_not_equal(served(b, q), SIZE_MAX);
    for (uint64_t q = 200; q < 230; q++) assert_int_equal(served(b, q), 1);
    assert_true(su_stat(b).shards <= 256);
    su_verify_clean(b);
    kvx_store_close(b);
    b = su_reopen(db, KVX_STORE_NOWAIT | KVX_STORE_NOSYNC);
    assert_int_equal(su_served_prefix(b, seq, NBS), NBS);
    for (uint64_t q = 200; q < 230; q++) assert_int_equal(served(b, q), 1);
    su_verify_clean(b);
    kvx_store_close(b);
    for (size_t i = 0; i < NBS; i++) kvx_free(env[i]);
    kvx_store_close(a);
}

/* Two caller batches accumulate sealed, unflushed files (one per block)
 * while the built-in batch's flushes run the ids out: no put fails, and
 * each batch's flush acknowledges and serves every one of its blocks. */
/* PROMISE: DUR-11 */
static void test_batches_interleaved(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s =
        su_create(dir, (su_spec){.capacity = CAP, .shard_bytes = 4096, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    kvx_store_batch *b, *c;
    assert_int_equal(kvx_store_batch_create(&b, s), 0);
    assert_int_equal(kvx_store_batch_create(&c, s), 0);
    uint64_t nb = 0, nc = 0;
    for (uint64_t q = 0; q < 360; q++) {
        int rc = put1_flush(s, q);
        if (rc) fail_msg("put %" PRIu64 ": %s (%s)", q, kvx_err_name(rc), kvx_last_error());
        if (q % 8 == 0) {
            rc = put1(s, b, 10000 + nb++, NULL);
            if (rc) fail_msg("b put: %s (%s)", kvx_err_name(rc), kvx_last_error());
        }
        if (q % 12 == 0) {
            rc = put1(s, c, 20000 + nc++, NULL);
            if (rc) fail_msg("c put: %s (%s)", kvx_err_name(rc), kvx_last_error());
        }
    }
    assert_int_equal(su_stat(s).capacity_bytes, CAP);
    assert_true(su_stat(s).evictions > 0);
    assert_int_equal(kvx_store_batch_flush(b), 0);
    assert_int_equal(kvx_store_batch_flush(c), 0);
    for (uint64_t i = 0; i < nb; i++) assert_int_equal(served(s, 10000 + i), 1);
    for (uint64_t i = 0; i < nc; i++) assert_int_equal(served(s, 20000 + i), 1);
    for (uint64_t q = 330; q < 360; q++) assert_int_equal(served(s, q), 1);
    kvx_store_batch_destroy(b);
    kvx_store_batch_destroy(c);
    su_verify_clean(s);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT | KVX_STORE_NOSYNC);
    for (uint64_t i = 0; i < nb; i++) assert_int_equal(served(s, 10000 + i), 1);
    for (uint64_t i = 0; i < nc; i++) assert_int_equal(served(s, 20000 + i), 1);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* The oldest block, read just before the ids run out, survives the id
 * eviction; the next oldest (never read) goes. */
/* PROMISE: STORE-9 */
static void test_recency_read_survives(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s =
        su_create(dir, (su_spec){.capacity = CAP, .shard_bytes = 4096, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    for (uint64_t q = 0; q < 256; q++) assert_int_equal(put1_flush(s, q), 0);
    assert_int_equal(su_stat(s).evictions, 0);
    assert_int_equal(served(s, 0), 1); /* read: now the hottest */
    for (uint64_t q = 256; q < 266; q++) assert_int_equal(put1_flush(s, q), 0);
    kvx_store_stats st = su_stat(s);
    assert_true(st.evictions >= 60 && st.evictions <= 120);
    assert_int_equal(st.evictions, st.evicted_blocks);
    assert_int_equal(served(s, 0), 1);
    assert_int_equal(served(s, 1), 0);
    assert_int_equal(served(s, 2), 0);
    for (uint64_t q = 200; q < 266; q++) assert_int_equal(served(s, q), 1);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* Shards of six blocks (32 KiB target, each a flush's): the first block
 * of the oldest sequence is read just before the ids run out. Its shard
 * is the coldest (five of six blocks cold), so the id eviction takes it
 * and should carry the hot block into a new shard, as the capacity
 * eviction does; the carry needs a shard id, and all 256 are taken. */
/* PROMISE: STORE-9 */
static void test_carry_hot_block(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.capacity_bytes = CAP;
    o.shard_bytes = 32768; /* six ~4 KiB entries: above target/2, not merged */
    o.flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC;
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    for (uint64_t q = 0; q < 256; q++) assert_int_equal(su_put_seq(s, q, 6), 0);
    kvx_store_stats st = su_stat(s);
    assert_int_equal(st.shards, 256);
    assert_int_equal(st.evictions, 0);
    assert_int_equal(su_served_prefix(s, 0, 1), 1); /* read: the hottest block */
    int rc = su_put_seq(s, 256, 6);
    if (rc) fail_msg("put: %s (%s)", kvx_err_name(rc), kvx_last_error());
    st = su_stat(s);
    assert_true(st.evictions > 0);
    assert_int_equal(st.capacity_bytes, CAP);
    assert_int_equal(su_served_prefix(s, 256, 6), 6);
    assert_int_equal(su_served_prefix(s, 1, 6), 0); /* cold: gone */
    for (uint64_t q = 0; q < 257; q++) assert_int_not_equal(su_served_prefix(s, q, 6), SIZE_MAX);
    su_verify_clean(s);
    size_t hot = su_served_prefix(s, 0, 1);
    if (getenv("A9_DEBUG")) fprintf(stderr, "carry: hot block served %zu, shards %llu\n", hot, (unsigned long long)st.shards);
    assert_int_not_equal(hot, SIZE_MAX);
    /* the block just read survives (it once went with its shard: the
     * carry found no free id) */
    assert_int_equal(hot, 1);
    kvx_store_close(s);
}

/* The control for test_carry_hot_block: the same store and reads, but a
 * capacity of ~200 of those shards, so the capacity eviction (ids free)
 * runs first: it carries the hot block, which is served afterwards. */
/* PROMISE: STORE-9 */
static void test_carry_hot_block_at_capacity(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.shard_bytes = 32768;
    o.flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC;
    kvx_store *s = NULL;
    o.capacity_bytes = 200ull * 28672;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    for (uint64_t q = 0; q < 195; q++) assert_int_equal(su_put_seq(s, q, 6), 0);
    assert_int_equal(su_stat(s).evictions, 0);
    assert_int_equal(su_served_prefix(s, 0, 1), 1);
    for (uint64_t q = 195; q < 215; q++) assert_int_equal(su_put_seq(s, q, 6), 0);
    kvx_store_stats st = su_stat(s);
    assert_true(st.evictions > 0);
    assert_int_equal(su_served_prefix(s, 1, 6), 0);
    if (getenv("A9_DEBUG")) fprintf(stderr, "control: hot %zu ev %llu shards %llu\n", su_served_prefix(s, 0, 1), (unsigned long long)st.evictions, (unsigned long long)st.shards);
    assert_int_equal(su_served_prefix(s, 0, 6), 1); /* its shard went, the read block was carried */
    su_verify_clean(s);
    kvx_store_close(s);
}

/* After an id eviction the capacity is the real one: stat says so, and
 * the next 60 flushes (ids free, far under 1 GiB) evict nothing, which
 * they would against a capacity left at ~176 shards' bytes. After
 * reopen too. */
/* PROMISE: STORE-3 */
static void test_capacity_restored(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    kvx_store *s =
        su_create(dir, (su_spec){.capacity = CAP, .shard_bytes = 4096, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    for (uint64_t q = 0; q < 257; q++) assert_int_equal(put1_flush(s, q), 0);
    kvx_store_stats st = su_stat(s);
    assert_int_equal(st.capacity_bytes, CAP);
    assert_true(st.evictions > 0);
    uint64_t ev = st.evictions, shards = st.shards;
    assert_true(shards <= 190);
    for (uint64_t q = 257; q < 257 + 60; q++) assert_int_equal(put1_flush(s, q), 0);
    assert_int_equal(kvx_store_gc(s), 0);
    st = su_stat(s);
    assert_int_equal(st.evictions, ev);
    assert_int_equal(st.shards, shards + 60);
    assert_int_equal(st.capacity_bytes, CAP);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT | KVX_STORE_NOSYNC);
    assert_int_equal(su_stat(s).capacity_bytes, CAP);
    assert_int_equal(su_stat(s).shards, shards + 60);
    for (uint64_t q = 257; q < 317; q++) assert_int_equal(served(s, q), 1);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* Every OS call of the put (and flush) that runs the ids out failed in
 * turn, on a copy of a store holding 256 one-block shards: the error
 * surfaces or the put succeeds; either way no block is served wrong,
 * verify is clean, the capacity is the real one, at least the newest
 * ~150 acknowledged blocks are there, and the store takes and serves a
 * new put, also after reopen. */
/* PROMISE: STORE-9 */
static void test_fault_in_id_eviction(void **state)
{
    (void)state;
    char base[300];
    su_new_dir(base, sizeof base);
    kvx_store *s =
        su_create(base, (su_spec){.capacity = CAP, .shard_bytes = 4096, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    for (uint64_t q = 0; q < 256; q++) assert_int_equal(put1_flush(s, q), 0);
    kvx_store_close(s);
    char dir[300], cmd[800];
    su_new_dir(dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "cp -a '%s' '%s'", base, dir);
    assert_int_equal(system(cmd), 0);
    s = su_reopen(dir, KVX_STORE_NOWAIT | KVX_STORE_NOSYNC);
    fault_install();
    fault_only = A9_MASK;
    fault_reset(0, EIO, FAULT_ERRNO);
    assert_int_equal(put1_flush(s, 256), 0);
    long ncalls = fault_calls;
    fault_uninstall();
    assert_true(su_stat(s).evictions > 0); /* the counted put ran the id eviction */
    kvx_store_close(s);
    su_rm_rf(dir);
    /* a stride over the eviction's unlinks, then every call of the new
     * shard's seal and publication (the last few) */
    long step = getenv("A9_STEP") ? atol(getenv("A9_STEP")) : ncalls / 12 + 1;
    int nfail = 0;
    for (long k = 1; k <= ncalls; k = k + step < ncalls - 6 || k >= ncalls - 6 ? k + (k >= ncalls - 6 ? 1 : step) : ncalls - 6) {
        su_new_dir(dir, sizeof dir);
        snprintf(cmd, sizeof cmd, "cp -a '%s' '%s'", base, dir);
        assert_int_equal(system(cmd), 0);
        s = su_reopen(dir, KVX_STORE_NOWAIT | KVX_STORE_NOSYNC);
        fault_install();
        fault_only = A9_MASK;
        fault_reset(k, k % 2 ? EIO : ENOSPC, FAULT_ERRNO);
        int rc = put1_flush(s, 256);
        fault_uninstall();
        if (getenv("A9_DEBUG")) fprintf(stderr, "k=%ld/%ld rc=%d hits=%ld op=%s err=%s\n", k, ncalls, rc, fault_hits, fault_hit_op ? fault_hit_op : "-", rc ? kvx_last_error() : "");
        if (rc) nfail++;
        assert_int_equal(su_stat(s).capacity_bytes, CAP);
        size_t n = 0;
        for (uint64_t q = 0; q < 256; q++) {
            size_t v = served(s, q);
            assert_int_not_equal(v, SIZE_MAX);
            n += v;
        }
        assert_true(n >= 150);
        for (uint64_t q = 200; q < 256; q++) assert_int_equal(served(s, q), 1);
        if (!rc) assert_int_equal(served(s, 256), 1);
        su_verify_clean(s);
        assert_int_equal(put1_flush(s, 300), 0);
        assert_int_equal(served(s, 300), 1);
        kvx_store_close(s);
        s = su_reopen(dir, KVX_STORE_NOWAIT | KVX_STORE_NOSYNC);
        assert_int_equal(su_stat(s).capacity_bytes, CAP);
        assert_int_equal(served(s, 300), 1);
        if (!rc) assert_int_equal(served(s, 256), 1);
        for (uint64_t q = 200; q < 256; q++) assert_int_equal(served(s, q), 1);
        su_verify_clean(s);
        kvx_store_close(s);
        su_rm_rf(dir);
    }
    assert_true(nfail > 0);
    su_rm_rf(base);
}

/* The whole file (its size in *n), or NULL when it cannot be read. */
static uint8_t *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint8_t *b = NULL;
    size_t cap = 0, len = 0, got = 0;
    do {
        if (len == cap) {
            uint8_t *nb = realloc(b, cap = cap ? cap * 2 : 1 << 16);
            if (!nb) break;
            b = nb;
        }
        got = fread(b + len, 1, cap - len, f);
        len += got;
    } while (got);
    fclose(f);
    *n = len;
    return b;
}

/* The one name in shards/ (the store holds exactly one shard). */
static void only_shard(const char *dir, char name[64])
{
    char names[8][64];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    memcpy(name, names[0], 64);
}

static int in_dir(const char *dir, const char *sub, const char *name)
{
    char p[600];
    struct stat st;
    snprintf(p, sizeof p, "%.300s/%.20s/%.63s", dir, sub, name);
    return lstat(p, &st) == 0;
}

/* The damaged shard `name` sits in quarantine/ with the bytes it had
 * (held: len bytes) and a note naming its damage; no longer in shards/. */
static void check_quarantined(const char *dir, const char *name, const uint8_t *held, size_t len)
{
    char p[600];
    assert_false(in_dir(dir, "shards", name));
    snprintf(p, sizeof p, "%.300s/quarantine/%.63s", dir, name);
    size_t n = 0;
    uint8_t *now = slurp(p, &n);
    if (!now) fail_msg("shards/%s was deleted, not moved to quarantine/", name);
    assert_int_equal(n, len);
    assert_memory_equal(now, held, len);
    free(now);
    snprintf(p, sizeof p, "%.300s/quarantine/%.63s.why", dir, name);
    char *why = (char *)slurp(p, &n);
    if (!why) fail_msg("quarantine/%s has no .why note", name);
    why = realloc(why, n + 1);
    why[n] = 0;
    assert_non_null(strstr(why, name));
    assert_non_null(strstr(why, "damaged"));
    free(why);
}

/* Shards of 16 blocks (68 KiB: a 4 KiB head, each page in its own 4
 * KiB), six of them in the store. */
#define EV_CAP (450u << 10)

#define EV_SHARD (70u << 10)

/* "Only eviction, compaction and gc delete a shard file ... and only when it
 * is sound; a damaged one moves to quarantine/ instead": gc's salvage had
 * tests (tests/engine/lookup.c test_rotten_page, tests/engine/delete.c
 * test_delete_damaged),
 * eviction and compaction none. test_evict_damaged_quarantined: the oldest
 * shard, one cold page rotten from the start and one hot page rotten after a
 * lookup checked it, is evicted: the file moves to quarantine/ byte for byte
 * with its .why, stat counts it, its hot good blocks were carried and serve
 * their own bytes, the page that rotted after its check is not laundered into
 * the carried shard. test_compact_damaged_quarantined: four small shards
 * merged by a flush, one with a rotten page: the same, every good block of it
 * copied. */
/* PROMISE: STORE-10 */
static void test_evict_damaged_quarantined(void **state)
{
    (void)state;
    char dir[300], name[64], path[600];
    kvx_store *s =
        su_store(dir, sizeof dir,
                 (su_spec){.capacity = EV_CAP, .shard_bytes = EV_SHARD, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    const uint64_t A = 100;
    su_put_flush(s, A, 16);
    only_shard(dir, name);
    snprintf(path, sizeof path, "%s/shards/%s", dir, name);
    assert_int_equal(su_flip_page_byte(path, 12), 0); /* a cold page, rotten from the start */
    /* newer shards of 16 blocks while one more fits */
    uint64_t seq = 200;
    for (kvx_store_stats st = su_stat(s); st.bytes + st.bytes / st.shards <= EV_CAP; st = su_stat(s))
        su_put_flush(s, seq++, 16);
    assert_int_equal(su_stat(s).evictions, 0);
    /* A's first 8 blocks read now: hot, so eviction carries them; then
     * the page of block 6, checked by this lookup, rots */
    assert_int_equal(su_served_prefix(s, A, 8), 8);
    assert_int_equal(su_flip_page_byte(path, 6), 0);
    size_t len = 0;
    uint8_t *held = slurp(path, &len);
    assert_non_null(held);
    kvx_store_stats before = su_stat(s);
    assert_int_equal(before.quarantined, 0);
    /* small puts until the capacity is passed: a small overflow, so the
     * LRU cut falls among A's cold blocks (the oldest) and A, half cold,
     * is the victim */
    while (su_stat(s).evictions == 0 && seq < 260) su_put_flush(s, seq++, 4);
    kvx_store_stats after = su_stat(s);
    assert_true(after.evictions > 0);
    assert_true(after.bytes <= after.capacity_bytes);
    check_quarantined(dir, name, held, len);
    assert_int_equal(after.quarantined, before.quarantined + 1);
    /* blocks 0-5 were carried and serve their own bytes; the rotten 6
     * was not copied (its bytes would have got a fresh CRC) */
    assert_int_equal(su_served_prefix(s, A, 16), 6);
    su_verify_clean(s);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(su_served_prefix(s, A, 16), 6);
    assert_int_equal(su_stat(s).quarantined, 1);
    check_quarantined(dir, name, held, len);
    su_verify_clean(s);
    kvx_store_close(s);
    free(held);
}

/* "Only eviction, compaction and gc delete a shard file ... and only when it
 * is sound; a damaged one moves to quarantine/ instead": gc's salvage had
 * tests (tests/engine/lookup.c test_rotten_page, tests/engine/delete.c
 * test_delete_damaged),
 * eviction and compaction none. test_evict_damaged_quarantined: the oldest
 * shard, one cold page rotten from the start and one hot page rotten after a
 * lookup checked it, is evicted: the file moves to quarantine/ byte for byte
 * with its .why, stat counts it, its hot good blocks were carried and serve
 * their own bytes, the page that rotted after its check is not laundered into
 * the carried shard. test_compact_damaged_quarantined: four small shards
 * merged by a flush, one with a rotten page: the same, every good block of it
 * copied. */
/* PROMISE: STORE-10 */
static void test_compact_damaged_quarantined(void **state)
{
    (void)state;
    char dir[300], name[64], path[600];
    /* 2 MiB: target shards of 512 KiB, and 4 small shards (< 256 KiB)
     * are due for a merge (their overhead passes 1 % of the capacity) */
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 2u << 20, .flags = KVX_STORE_NOWAIT | KVX_STORE_NOSYNC});
    const uint64_t D = 400;
    su_put_flush(s, D, 4);
    only_shard(dir, name);
    snprintf(path, sizeof path, "%s/shards/%s", dir, name);
    assert_int_equal(su_flip_page_byte(path, 2), 0);
    su_put_flush(s, D + 1, 4);
    su_put_flush(s, D + 2, 4);
    kvx_store_stats before = su_stat(s);
    assert_int_equal(before.compactions, 0);
    assert_int_equal(before.shards, 3);
    assert_true(in_dir(dir, "shards", name));
    size_t len = 0;
    uint8_t *held = slurp(path, &len);
    assert_non_null(held);
    su_put_flush(s, D + 3, 4); /* the fourth small shard: the flush merges */
    kvx_store_stats after = su_stat(s);
    assert_true(after.compactions > before.compactions);
    assert_int_equal(after.evictions, 0);
    assert_true(after.shards < 4);
    check_quarantined(dir, name, held, len);
    assert_int_equal(after.quarantined, before.quarantined + 1);
    /* D's good blocks were copied: 0 and 1 serve (the prefix ends at the
     * damaged 2, not laundered); 3 was copied too (an orphan, reached by
     * hash) */
    assert_int_equal(su_served_prefix(s, D, 4), 2);
    uint32_t t[4 * SU_B];
    uint64_t h[4];
    su_tokens(t, D, 4, 0);
    kvx_block_hashes(h, t, 4 * SU_B, SU_B);
    kvx_view v;
    assert_int_equal(kvx_store_get_hash(&v, s, h[3]), 0);
    uint8_t want[64];
    su_page(want, sizeof want, h[3]);
    assert_memory_equal(v.page, want, sizeof want);
    kvx_view_release(&v);
    assert_int_equal(kvx_store_get_hash(&v, s, h[2]), KVX_ENOTFOUND);
    for (uint64_t q = D + 1; q <= D + 3; q++) assert_int_equal(su_served_prefix(s, q, 4), 4);
    su_verify_clean(s);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(su_served_prefix(s, D, 4), 2);
    for (uint64_t q = D + 1; q <= D + 3; q++) assert_int_equal(su_served_prefix(s, q, 4), 4);
    check_quarantined(dir, name, held, len);
    su_verify_clean(s);
    kvx_store_close(s);
    free(held);
}

int main(int argc, char **argv)
{
    /* these tests read the files one flush writes as its own shard
     * file (the path keyed stores, whole batches and a second batch
     * still take): the active shard has its own, tests/engine/active.c */
    setenv("KVX_NO_APPEND", "1", 1);
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capacity_eviction_and_views),
        cmocka_unit_test(test_hot_blocks_carried),
        cmocka_unit_test(test_recency_per_block),
        cmocka_unit_test(test_recency_kept_through_merges),
        cmocka_unit_test(test_small_flushes_compacted),
        cmocka_unit_test(test_capacity_limits),
        cmocka_unit_test(test_shard_ids_exhausted),
        cmocka_unit_test(test_shard_ids_freed_by_eviction),
        cmocka_unit_test(test_capacity_during_put),
        cmocka_unit_test(test_unflushed_batch_fits),
        cmocka_unit_test(test_pins_survive_id_eviction),
        cmocka_unit_test(test_lease_pins_survive),
        cmocka_unit_test(test_stream_runs_out_midstream),
        cmocka_unit_test(test_batches_interleaved),
        cmocka_unit_test(test_recency_read_survives),
        cmocka_unit_test(test_carry_hot_block),
        cmocka_unit_test(test_carry_hot_block_at_capacity),
        cmocka_unit_test(test_capacity_restored),
        cmocka_unit_test(test_fault_in_id_eviction),
        cmocka_unit_test(test_evict_damaged_quarantined),
        cmocka_unit_test(test_compact_damaged_quarantined),
    };
    return cmocka_run_group_tests_name("engine/maint", tests, su_setup, su_teardown);
}
