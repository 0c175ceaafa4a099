/*
 * free_log.c - format/free_log.c: the free log that says a page of a
 * sealed shard is gone (docs/FORMAT.md "Free log"). A record counts only
 * whole and chained: a log cut at any byte, or grown by garbage, reads as
 * the records wholly before the cut (the rest is the tail, never an
 * error); a flipped bit in a record ends the log there; a header that is
 * not one is refused with its own code; a failed append or rewrite at
 * each OS step leaves the records before it as they were.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvx.h"
#include "format/free_log.h"
#include "lib/fault.h"
#include "lib/tmpdir.h"

#define LOG "FREED"

static int dirfd_of(void)
{
    int fd = open(tmpdir, O_RDONLY | O_DIRECTORY);
    assert_true(fd >= 0);
    return fd;
}

static void rows_make(kvx_freed *r, size_t n, uint64_t base)
{
    for (size_t i = 0; i < n; i++) {
        r[i].gen = base + i / 3;
        r[i].hash = 0x9e3779b97f4a7c15ull * (base + i + 1);
        r[i].entry = (uint32_t)(i * 7 + base);
        r[i].seq = 0;
    }
}

/* A log of a header, a record of 5 rows at seq 10 and one of 2 at seq 12. */
static void log_make(int dfd, kvx_free_log *l)
{
    kvx_freed a[5], b[2];
    rows_make(a, 5, 100);
    rows_make(b, 2, 200);
    assert_int_equal(kvx_free_log_write(dfd, LOG, a, 5, 10, l), 0);
    int fd = openat(dfd, LOG, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(kvx_free_log_append(fd, l, b, 2, 12), 0);
    close(fd);
}

static const uint64_t END1 = KVX_FREE_HEADER_BYTES + KVX_FREE_REC_HEADER_BYTES + 5 * KVX_FREE_ROW_BYTES;
static const uint64_t END2 = END1 + KVX_FREE_REC_HEADER_BYTES + 2 * KVX_FREE_ROW_BYTES;

static void test_round_trip(void **state)
{
    (void)state;
    fx_empty_dir();
    int dfd = dirfd_of();
    kvx_free_log w, r;
    log_make(dfd, &w);
    assert_int_equal(w.end, END2);
    assert_int_equal(w.records, 2);
    assert_int_equal(kvx_free_log_read(dfd, LOG, &r), 0);
    assert_int_equal(r.n, 7);
    assert_int_equal(r.records, 2);
    assert_int_equal(r.max_seq, 12);
    assert_int_equal(r.end, END2);
    assert_int_equal(r.tail, 0);
    assert_int_equal(r.last_crc, w.last_crc);
    kvx_freed a[5], b[2];
    rows_make(a, 5, 100);
    rows_make(b, 2, 200);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(r.rows[i].gen, a[i].gen);
        assert_int_equal(r.rows[i].hash, a[i].hash);
        assert_int_equal(r.rows[i].entry, a[i].entry);
        assert_int_equal(r.rows[i].seq, 10);
    }
    assert_int_equal(r.rows[6].hash, b[1].hash);
    assert_int_equal(r.rows[6].seq, 12);
    kvx_free_log_free(&r);
    /* an empty log: a header, no record */
    assert_int_equal(kvx_free_log_write(dfd, LOG, NULL, 0, 0, &w), 0);
    assert_int_equal(kvx_free_log_read(dfd, LOG, &r), 0);
    assert_int_equal(r.n, 0);
    assert_int_equal(r.end, KVX_FREE_HEADER_BYTES);
    kvx_free_log_free(&r);
    /* a rewrite that keeps each row's own number: one record a run */
    kvx_freed k[5];
    rows_make(k, 5, 400);
    uint64_t seqs[5] = {5, 5, 7, 9, 9};
    for (int i = 0; i < 5; i++) k[i].seq = seqs[i];
    assert_int_equal(kvx_free_log_write(dfd, LOG, k, 5, 0, &w), 0);
    assert_int_equal(w.records, 3);
    assert_int_equal(w.max_seq, 9);
    assert_int_equal(kvx_free_log_read(dfd, LOG, &r), 0);
    assert_int_equal(r.records, 3);
    assert_int_equal(r.last_crc, w.last_crc);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(r.rows[i].seq, seqs[i]);
        assert_int_equal(r.rows[i].hash, k[i].hash);
    }
    kvx_free_log_free(&r);
    k[3].seq = 6; /* out of order: refused, the log as it was */
    assert_int_equal(kvx_free_log_write(dfd, LOG, k, 5, 0, &w), KVX_EINVALID);
    assert_int_equal(kvx_free_log_read(dfd, LOG, &r), 0);
    assert_int_equal(r.records, 3);
    kvx_free_log_free(&r);
    /* the rewrite left no temporary file */
    assert_int_equal(dir_entries(), 1);
    close(dfd);
}

/* Bytes of the log as written. */
static uint8_t *slurp(int dfd, size_t *len)
{
    int fd = openat(dfd, LOG, O_RDONLY);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    uint8_t *b = malloc((size_t)st.st_size + 64);
    assert_int_equal(pread(fd, b, (size_t)st.st_size, 0), st.st_size);
    close(fd);
    *len = (size_t)st.st_size;
    return b;
}

static void put_bytes(int dfd, const uint8_t *b, size_t len)
{
    int fd = openat(dfd, LOG, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, b, len), (ssize_t)len);
    close(fd);
}

/* PROMISE: FORMAT-44 */
static void test_cut_at_every_byte(void **state)
{
    (void)state;
    fx_empty_dir();
    int dfd = dirfd_of();
    kvx_free_log w, r;
    log_make(dfd, &w);
    size_t len;
    uint8_t *b = slurp(dfd, &len);
    for (size_t cut = KVX_FREE_HEADER_BYTES; cut <= len; cut++) {
        put_bytes(dfd, b, cut);
        assert_int_equal(kvx_free_log_read(dfd, LOG, &r), 0);
        size_t want = cut >= END2 ? 7 : cut >= END1 ? 5 : 0;
        assert_int_equal(r.n, want);
        uint64_t end = cut >= END2 ? END2 : cut >= END1 ? END1 : KVX_FREE_HEADER_BYTES;
        assert_int_equal(r.end, end);
        assert_int_equal(r.tail, cut - end);
        kvx_free_log_free(&r);
    }
    /* one byte appended, zeros appended, garbage appended: the tail */
    uint8_t *g = malloc(len + 4096);
    memcpy(g, b, len);
    for (size_t extra = 1; extra <= 4096; extra *= 4) {
        for (size_t k = 0; k < extra; k++) g[len + k] = (uint8_t)(k * 131 + 7);
        put_bytes(dfd, g, len + extra);
        assert_int_equal(kvx_free_log_read(dfd, LOG, &r), 0);
        assert_int_equal(r.n, 7);
        assert_int_equal(r.tail, extra);
        kvx_free_log_free(&r);
    }
    /* a header shorter than 64 bytes: its own code */
    put_bytes(dfd, b, KVX_FREE_HEADER_BYTES - 1);
    assert_int_equal(kvx_free_log_read(dfd, LOG, &r), KVX_ETRUNC);
    free(g);
    free(b);
    close(dfd);
}

/* PROMISE: FORMAT-44 */
static void test_flip_each_bit(void **state)
{
    (void)state;
    fx_empty_dir();
    int dfd = dirfd_of();
    kvx_free_log w, r;
    log_make(dfd, &w);
    size_t len;
    uint8_t *b = slurp(dfd, &len);
    for (size_t at = 0; at < len; at++) {
        for (int bit = 0; bit < 8; bit++) {
            b[at] ^= (uint8_t)(1u << bit);
            put_bytes(dfd, b, len);
            int rc = kvx_free_log_read(dfd, LOG, &r);
            if (at < KVX_FREE_HEADER_BYTES) {
                /* the header: refused, never read as an empty log */
                assert_true(rc == KVX_EMAGIC || rc == KVX_ECORRUPT);
            } else {
                assert_int_equal(rc, 0);
                /* the damaged record and every one after it are not read */
                size_t want = at < END1 ? 0 : 5;
                assert_int_equal(r.n, want);
                assert_int_equal(r.end, at < END1 ? KVX_FREE_HEADER_BYTES : END1);
                assert_true(r.tail > 0);
                kvx_free_log_free(&r);
            }
            b[at] ^= (uint8_t)(1u << bit);
        }
    }
    free(b);
    close(dfd);
}

/* A whole, chained record crafted with a sequence number not above the one
 * before it is no writer's: damage, named. A record copied from another
 * log does not chain: the tail. */
/* PROMISE: FORMAT-44 */
static void test_crafted_records(void **state)
{
    (void)state;
    fx_empty_dir();
    int dfd = dirfd_of();
    kvx_free_log w, r;
    log_make(dfd, &w);
    kvx_freed c[1];
    rows_make(c, 1, 300);
    int fd = openat(dfd, LOG, O_RDWR);
    /* the writer refuses such a number itself */
    assert_int_equal(kvx_free_log_append(fd, &w, c, 1, 12), KVX_EINVALID);
    w.max_seq = 11; /* a crafted record: chained, seq 12 again */
    assert_int_equal(kvx_free_log_append(fd, &w, c, 1, 12), 0);
    close(fd);
    assert_int_equal(kvx_free_log_read(dfd, LOG, &r), KVX_ECORRUPT);
    assert_non_null(strstr(kvx_last_error(), "sequence number 12"));
    /* another log's second record, put after this log's first */
    kvx_free_log w2;
    size_t len;
    assert_int_equal(mkdirat(dfd, "other", 0700), 0);
    int odfd = openat(dfd, "other", O_RDONLY | O_DIRECTORY);
    kvx_freed a[3];
    rows_make(a, 3, 500);
    assert_int_equal(kvx_free_log_write(odfd, LOG, a, 3, 5, &w2), 0);
    int ofd = openat(odfd, LOG, O_RDWR);
    assert_int_equal(kvx_free_log_append(ofd, &w2, c, 1, 20), 0);
    close(ofd);
    uint8_t ob[4096];
    ofd = openat(odfd, LOG, O_RDONLY);
    ssize_t on = pread(ofd, ob, sizeof ob, 0);
    close(ofd);
    uint64_t o1 = KVX_FREE_HEADER_BYTES + KVX_FREE_REC_HEADER_BYTES + 3 * KVX_FREE_ROW_BYTES;
    log_make(dfd, &w);
    uint8_t *b = slurp(dfd, &len);
    memcpy(b + END1, ob + o1, (size_t)on - o1); /* in place of this log's second */
    put_bytes(dfd, b, END1 + (size_t)on - o1);
    assert_int_equal(kvx_free_log_read(dfd, LOG, &r), 0);
    assert_int_equal(r.n, 5);
    assert_int_equal(r.tail, (size_t)on - o1);
    kvx_free_log_free(&r);
    free(b);
    unlinkat(odfd, LOG, 0);
    close(odfd);
    unlinkat(dfd, "other", AT_REMOVEDIR);
    close(dfd);
}

/* A header claiming more rows than the file holds: not whole, and no
 * memory taken for the claim. */
/* PROMISE: FORMAT-44 */
static void test_claim_past_the_end(void **state)
{
    (void)state;
    fx_empty_dir();
    int dfd = dirfd_of();
    kvx_free_log w, r;
    log_make(dfd, &w);
    size_t len;
    uint8_t *b = slurp(dfd, &len);
    kvx_store32(b + END1 + 16, KVX_FREE_MAX_ROWS); /* the second record's count */
    put_bytes(dfd, b, len);
    assert_int_equal(kvx_free_log_read(dfd, LOG, &r), 0);
    assert_int_equal(r.n, 5);
    kvx_free_log_free(&r);
    kvx_store32(b + END1 + 16, 0); /* no row: no writer's */
    put_bytes(dfd, b, len);
    assert_int_equal(kvx_free_log_read(dfd, LOG, &r), 0);
    assert_int_equal(r.n, 5);
    kvx_free_log_free(&r);
    free(b);
    close(dfd);
}

/* Not a log: each its own code, naming the file. */
/* PROMISE: FORMAT-44 */
static void test_not_a_log(void **state)
{
    (void)state;
    fx_empty_dir();
    int dfd = dirfd_of();
    kvx_free_log r;
    assert_int_equal(kvx_free_log_read(dfd, LOG, &r), -ENOENT);
    assert_int_equal(mkfifoat(dfd, LOG, 0600), 0);
    assert_int_equal(kvx_free_log_read(dfd, LOG, &r), KVX_EPATH); /* never blocks on a FIFO */
    assert_non_null(strstr(kvx_last_error(), "FREED"));
    unlinkat(dfd, LOG, 0);
    assert_int_equal(mkdirat(dfd, LOG, 0700), 0);
    assert_int_equal(kvx_free_log_read(dfd, LOG, &r), KVX_EPATH);
    unlinkat(dfd, LOG, AT_REMOVEDIR);
    assert_int_equal(symlinkat("/dev/zero", dfd, LOG), 0);
    assert_int_equal(kvx_free_log_read(dfd, LOG, &r), KVX_EPATH);
    unlinkat(dfd, LOG, 0);
    uint8_t z[KVX_FREE_HEADER_BYTES] = {0};
    int fd = openat(dfd, LOG, O_WRONLY | O_CREAT, 0600);
    assert_int_equal(write(fd, z, sizeof z), (ssize_t)sizeof z);
    close(fd);
    assert_int_equal(kvx_free_log_read(dfd, LOG, &r), KVX_EMAGIC);
    /* a later version, its CRC right */
    kvx_free_log w;
    assert_int_equal(kvx_free_log_write(dfd, LOG, NULL, 0, 0, &w), 0);
    size_t len;
    uint8_t *b = slurp(dfd, &len);
    kvx_store32(b + 8, 2);
    kvx_store32(b + 60, kvx_crc32c(0, b, 60));
    put_bytes(dfd, b, len);
    assert_int_equal(kvx_free_log_read(dfd, LOG, &r), KVX_EVERSION);
    free(b);
    close(dfd);
}

/* PROMISE: FORMAT-45 */
static void test_append_fault_at_each_step(void **state)
{
    (void)state;
    int errs[] = {EIO, ENOSPC};
    for (int e = 0; e < 2; e++)
        for (int mode = FAULT_ERRNO; mode <= FAULT_SHORT; mode++)
            for (long at = 1;; at++) {
                fx_empty_dir();
                int dfd = dirfd_of();
                kvx_free_log w, r;
                log_make(dfd, &w);
                kvx_free_log before = w;
                kvx_freed c[4];
                rows_make(c, 4, 700);
                int fd = openat(dfd, LOG, O_RDWR);
                fault_install();
                fault_reset(at, errs[e], mode);
                int rc = kvx_free_log_append(fd, &w, c, 4, 30);
                long calls = fault_calls;
                fault_uninstall();
                if (rc == 0) { /* a fault the step survives (a short write, retried) */
                    close(fd);
                    close(dfd);
                    if (at > calls) break; /* every step was failed once */
                    continue;
                }
                /* the writer's view did not move; the next append lands */
                assert_memory_equal(&w, &before, sizeof w);
                assert_int_equal(kvx_free_log_append(fd, &w, c, 2, 31), 0);
                close(fd);
                assert_int_equal(kvx_free_log_read(dfd, LOG, &r), 0);
                assert_int_equal(r.n, 9);
                assert_int_equal(r.max_seq, 31);
                kvx_free_log_free(&r);
                close(dfd);
            }
}

/* PROMISE: FORMAT-45 */
static void test_rewrite_fault_at_each_step(void **state)
{
    (void)state;
    for (int mode = FAULT_ERRNO; mode <= FAULT_SHORT; mode++)
        for (long at = 1;; at++) {
            fx_empty_dir();
            int dfd = dirfd_of();
            kvx_free_log w, r;
            log_make(dfd, &w);
            kvx_freed c[3];
            rows_make(c, 3, 900);
            fault_install();
            fault_reset(at, EIO, mode);
            int rc = kvx_free_log_write(dfd, LOG, c, 3, 40, &w);
            long calls = fault_calls;
            fault_uninstall();
            assert_int_equal(kvx_free_log_read(dfd, LOG, &r), 0);
            if (rc == 0) {
                assert_int_equal(r.n, 3);
                assert_int_equal(r.max_seq, 40);
            } else {
                /* the old log whole, or the new one whole (the rename
                 * landed, its directory's fsync failed): never a mix */
                assert_true(r.n == 7 || (r.n == 3 && r.max_seq == 40));
            }
            kvx_free_log_free(&r);
            assert_int_equal(dir_entries(), 1); /* no temporary file left */
            close(dfd);
            if (rc == 0 && at > calls) break;
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_cut_at_every_byte),
        cmocka_unit_test(test_flip_each_bit),
        cmocka_unit_test(test_crafted_records),
        cmocka_unit_test(test_claim_past_the_end),
        cmocka_unit_test(test_not_a_log),
        cmocka_unit_test(test_append_fault_at_each_step),
        cmocka_unit_test(test_rewrite_fault_at_each_step),
    };
    return cmocka_run_group_tests(tests, fx_setup, fx_teardown);
}
