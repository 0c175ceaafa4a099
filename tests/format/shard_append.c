/*
 * shard_append.c - format/shard_append.c and format/shard_journal.c: an
 * active shard grows by appends, each commit's entries read back by any
 * reader of the file once its record is durable, and is sealed in place
 * into a standard KVX file (pages unmoved). A torn last record is the
 * unsealed tail (never damage, cleared by the next writer); a damaged
 * record with records after it, a journal header of another file and a
 * record copied from another file are refused or ignored; a failure at
 * each OS step of an append leaves the records before it.
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
#include "format/format.h"
#include "format/shard_journal.h"
#include "lib/fault.h"
#include "lib/shard.h"

#define AFLAGS (KVX_FLAG_HASHES | KVX_FLAG_LINEAGE | KVX_FLAG_SCALES | KVX_FLAG_SEQ)

static kvx_active_params params_of(const fixture *f, uint8_t tag)
{
    kvx_active_params p;
    memset(&p, 0, sizeof p);
    p.geometry = f->g;
    p.shard_id = SHARD;
    p.max_entries = 8;
    p.flags = AFLAGS;
    memset(p.ident, tag, sizeof p.ident);
    return p;
}

static void add(kvx_shard_writer *w, const fixture *f, int i)
{
    kvx_entry_in e = entry_in(f, i);
    e.scales = f->scales[i];
    assert_int_equal(kvx_shard_writer_add(w, &e), 0);
}

/* Opens path as an active file and checks it holds entries [0, n) of f,
 * entry i with sequence number seq[i]. */
static void check_active(const char *path, const kvx_active_params *p, const fixture *f, uint32_t n, const uint64_t *seq)
{
    kvx_shard *s;
    assert_int_equal(kvx_shard_open_active(&s, AT_FDCWD, path, path, p), 0);
    assert_int_equal(kvx_shard_get_info(s)->num_blocks, n);
    for (uint32_t i = 0; i < n; i++) {
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, s, i), 0);
        assert_int_equal(e.coordinate, KVX_COORD(SHARD, f->radix[i], f->spec[i]));
        assert_true(e.hash == f->hash[i]);
        assert_true(e.parent == f->parent[i]);
        assert_memory_equal(e.scales, f->scales[i], sizeof f->scales[i]);
        const void *pg;
        assert_int_equal(kvx_shard_page(&pg, s, i, 1), 0);
        assert_memory_equal(pg, f->page[i], e.bytes);
        uint64_t q = 0;
        int tomb = 1;
        assert_int_equal(kvx_shard_entry_commit(s, i, &q, &tomb), 0);
        assert_true(q == seq[i]);
        assert_int_equal(tomb, 0);
    }
    uint32_t bad = 9;
    assert_int_equal(kvx_shard_verify(s, &bad, NULL, NULL), 0);
    assert_int_equal(bad, 0);
    kvx_shard_close(s);
}

/* Where record k (0-based) of an active file of p starts, each record
 * holding counts[k] entries. */
static uint64_t record_at(const kvx_active_params *p, const uint32_t *counts, int k)
{
    kvx_journal_geom jg;
    assert_int_equal(kvx_journal_geom_for(&jg, p), 0);
    uint64_t at = jg.journal_off + KVX_JOURNAL_HEADER_BYTES;
    for (int r = 0; r < k; r++) at = (at + KVX_RECORD_HEADER_BYTES + counts[r] * jg.row_bytes + 7) & ~7ull;
    return at;
}

static void flip(const char *path, uint64_t off)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
    b ^= 0x10;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
    close(fd);
}

/* An active file with entries 0, 1 appended at 5 and 2, 3 at 7. */
static void two_appends(const fixture *f, const kvx_active_params *p, const char *path)
{
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_create_active(&w, path, p), 0);
    add(w, f, 0);
    add(w, f, 1);
    assert_int_equal(kvx_shard_writer_append(w, 5), 0);
    add(w, f, 2);
    add(w, f, 3);
    assert_int_equal(kvx_shard_writer_append(w, 7), 0);
    kvx_shard_writer_abort(w); /* closes it: an active file stays */
}

/* PROMISE: FORMAT-30 */
static void test_appends_read_back_then_seal_in_place(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 0);
    kvx_active_params p = params_of(&f, 1);
    char path[512], sealed[512];
    snprintf(path, sizeof path, "%s", path_of(".0000000000000001.kvx.active"));
    snprintf(sealed, sizeof sealed, "%s", path_of("0000000000000001.kvx"));
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_create_active(&w, path, &p), 0);
    check_active(path, &p, &f, 0, NULL); /* created: durable, empty */
    add(w, &f, 0);
    add(w, &f, 1);
    check_active(path, &p, &f, 0, NULL); /* added, not appended: not there */
    assert_int_equal(kvx_shard_writer_append(w, 5), 0);
    assert_int_equal(kvx_shard_writer_appended(w), 2);
    uint64_t seq[NENT] = {5, 5, 7, 7};
    check_active(path, &p, &f, 2, seq);
    add(w, &f, 2);
    add(w, &f, 3);
    assert_int_equal(kvx_shard_writer_append(w, 5), KVX_EINVALID); /* not above the last record's */
    assert_int_equal(kvx_shard_writer_append(w, 7), 0);
    check_active(path, &p, &f, NENT, seq);
    assert_int_equal(kvx_shard_writer_append(w, 9), 0); /* nothing added: nothing written */
    kvx_shard *a;
    assert_int_equal(kvx_shard_open_active(&a, AT_FDCWD, path, path, &p), 0);
    kvx_entry before[NENT];
    for (uint32_t i = 0; i < NENT; i++) assert_int_equal(kvx_shard_entry(&before[i], a, i), 0);

    /* a sealed file's own writer call refuses an active writer */
    assert_int_equal(kvx_shard_writer_seal_active(w, sealed), 0);
    assert_int_equal(access(path, F_OK), -1);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, sealed, KVX_OPEN_VERIFY_PAGES), 0);
    const kvx_shard_info *info = kvx_shard_get_info(s);
    assert_int_equal(info->num_blocks, NENT);
    assert_int_equal(info->flags, AFLAGS | KVX_FLAG_META_CRC);
    for (uint32_t i = 0; i < NENT; i++) {
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, s, i), 0);
        assert_true(e.offset == before[i].offset); /* the pages did not move */
        assert_int_equal(e.crc32, before[i].crc32);
        uint64_t q;
        int tomb;
        assert_int_equal(kvx_shard_entry_commit(s, i, &q, &tomb), 0);
        assert_true(q == seq[i]);
    }
    kvx_shard_close(s);
    kvx_shard_close(a); /* a handle open across the seal still reads */
}

/* PROMISE: FORMAT-31 */
static void test_rollback_forgets_unappended(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 0);
    kvx_active_params p = params_of(&f, 1);
    char path[512];
    snprintf(path, sizeof path, "%s", path_of(".a.active"));
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_create_active(&w, path, &p), 0);
    add(w, &f, 0);
    assert_int_equal(kvx_shard_writer_append(w, 3), 0);
    add(w, &f, 1);
    assert_int_equal(kvx_shard_writer_seal_active(NULL, path), KVX_EINVALID);
    kvx_shard_writer_rollback(w);
    assert_int_equal(kvx_shard_writer_count(w), 1);
    add(w, &f, 1); /* its coordinate is free again */
    assert_int_equal(kvx_shard_writer_append(w, 4), 0);
    uint64_t seq[] = {3, 4};
    check_active(path, &p, &f, 2, seq);
    add(w, &f, 2);
    /* a seal with entries not appended is refused; the file stays */
    assert_int_equal(kvx_shard_writer_seal_active(w, path_of("x.kvx")), KVX_EINVALID);
    assert_int_equal(access(path_of("x.kvx"), F_OK), -1);
    check_active(path, &p, &f, 2, seq);
}

/* PROMISE: FORMAT-32 */
static void test_torn_last_record_is_unsealed_tail(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 0);
    kvx_active_params p = params_of(&f, 1);
    char path[512];
    snprintf(path, sizeof path, "%s", path_of(".t.active"));
    two_appends(&f, &p, path);
    uint32_t counts[] = {2, 2};
    uint64_t second = record_at(&p, counts, 1);
    /* torn anywhere (its header, a row, its CRC), the record is not there */
    uint64_t where[] = {second + 3, second + KVX_RECORD_HEADER_BYTES + 40, second + KVX_R_CRC};
    uint64_t seq[NENT] = {5, 5, 9, 9};
    for (size_t k = 0; k < sizeof where / sizeof where[0]; k++) {
        flip(path, where[k]);
        check_active(path, &p, &f, 2, seq);
        flip(path, where[k]);
    }
    /* the next writer continues after the whole records: the torn bytes
     * are cleared, a new record takes their place */
    flip(path, second + KVX_RECORD_HEADER_BYTES + 40);
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_resume(&w, path, &p), 0);
    assert_int_equal(kvx_shard_writer_appended(w), 2);
    assert_int_equal(kvx_shard_writer_append(w, 5), KVX_EINVALID); /* not above the last whole record's */
    add(w, &f, 2);
    assert_int_equal(kvx_shard_writer_append(w, 9), 0);
    kvx_shard_writer_abort(w);
    check_active(path, &p, &f, 3, seq);
    assert_int_equal(kvx_shard_writer_resume(&w, path, &p), 0);
    add(w, &f, 3);
    assert_int_equal(kvx_shard_writer_append(w, 11), 0);
    seq[3] = 11;
    check_active(path, &p, &f, NENT, seq);
    assert_int_equal(kvx_shard_writer_seal_active(w, path_of("t.kvx")), 0);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path_of("t.kvx"), KVX_OPEN_VERIFY_PAGES), 0);
    assert_int_equal(kvx_shard_get_info(s)->num_blocks, NENT);
    kvx_shard_close(s);
}

/* PROMISE: FORMAT-33 */
static void test_damaged_record_with_records_after_is_damage(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 0);
    kvx_active_params p = params_of(&f, 1);
    char path[512];
    snprintf(path, sizeof path, "%s", path_of(".d.active"));
    two_appends(&f, &p, path);
    uint32_t counts[] = {2, 2};
    uint64_t first = record_at(&p, counts, 0);
    uint64_t where[] = {first + 1, first + KVX_R_COUNT, first + KVX_RECORD_HEADER_BYTES + 7, first + KVX_R_CRC + 2};
    for (size_t k = 0; k < sizeof where / sizeof where[0]; k++) {
        flip(path, where[k]);
        kvx_shard *s = (kvx_shard *)1;
        assert_int_equal(kvx_shard_open_active(&s, AT_FDCWD, path, path, &p), KVX_ECORRUPT);
        assert_null(s);
        kvx_shard_writer *w = (kvx_shard_writer *)1;
        assert_int_equal(kvx_shard_writer_resume(&w, path, &p), KVX_ECORRUPT);
        assert_null(w);
        flip(path, where[k]);
    }
    uint64_t seq[NENT] = {5, 5, 7, 7};
    check_active(path, &p, &f, NENT, seq);
    /* a flipped page under a whole record is a bad page, as in any shard */
    kvx_shard *s;
    assert_int_equal(kvx_shard_open_active(&s, AT_FDCWD, path, path, &p), 0);
    kvx_entry e;
    assert_int_equal(kvx_shard_entry(&e, s, 1), 0);
    kvx_shard_close(s);
    flip(path, e.offset + 5);
    assert_int_equal(kvx_shard_open_active(&s, AT_FDCWD, path, path, &p), 0);
    const void *pg;
    assert_int_equal(kvx_shard_page(&pg, s, 1, 1), KVX_EPAGECRC);
    assert_int_equal(kvx_shard_page(&pg, s, 0, 1), 0);
    kvx_shard_close(s);
}

/* PROMISE: FORMAT-34 */
static void test_another_files_journal_and_records_refused(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 0);
    kvx_active_params p = params_of(&f, 1), q = params_of(&f, 2);
    char a[512], b[512];
    snprintf(a, sizeof a, "%s", path_of(".a.active"));
    snprintf(b, sizeof b, "%s", path_of(".b.active"));
    two_appends(&f, &p, a);
    kvx_shard *s = NULL;
    /* parameters other than the file's: another identity, reserve, flags */
    assert_int_equal(kvx_shard_open_active(&s, AT_FDCWD, a, a, &q), KVX_EFORMAT);
    kvx_active_params r = p;
    r.max_entries = 16;
    assert_int_equal(kvx_shard_open_active(&s, AT_FDCWD, a, a, &r), KVX_EMAGIC); /* the journal lies elsewhere */
    r = p;
    r.flags |= KVX_FLAG_DIGEST;
    assert_int_not_equal(kvx_shard_open_active(&s, AT_FDCWD, a, a, &r), 0);
    r = p;
    r.flags &= ~KVX_FLAG_SEQ;
    assert_int_equal(kvx_shard_open_active(&s, AT_FDCWD, a, a, &r), KVX_EINVALID);
    /* a sealed file is no active file */
    assert_int_equal(write_fixture(&f, path_of("s.kvx")), 0);
    assert_int_equal(kvx_shard_open_active(&s, AT_FDCWD, path_of("s.kvx"), path_of("s.kvx"), &p), KVX_EMAGIC);
    /* a flipped journal header */
    kvx_journal_geom jg;
    assert_int_equal(kvx_journal_geom_for(&jg, &p), 0);
    flip(a, jg.journal_off + 70);
    assert_int_equal(kvx_shard_open_active(&s, AT_FDCWD, a, a, &p), KVX_ECORRUPT);
    flip(a, jg.journal_off + 70);

    /* b: the same entries under another identity; its second record
     * copied into a after a's first does not chain there */
    two_appends(&f, &q, b);
    uint32_t counts[] = {2, 2};
    uint64_t at = record_at(&p, counts, 1), len = KVX_RECORD_HEADER_BYTES + 2 * jg.row_bytes;
    uint8_t *buf = malloc(len);
    int fb = open(b, O_RDONLY), fa = open(a, O_RDWR);
    assert_int_equal(pread(fb, buf, len, (off_t)at), (ssize_t)len);
    assert_int_equal(pwrite(fa, buf, len, (off_t)at), (ssize_t)len);
    close(fa);
    close(fb);
    free(buf);
    uint64_t seq[NENT] = {5, 5, 7, 7};
    check_active(a, &p, &f, 2, seq);
    check_active(b, &q, &f, NENT, seq);
}

/* PROMISE: FORMAT-35 */
static void test_append_fault_at_each_step(void **state)
{
    (void)state;
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS, 0);
    kvx_active_params p = params_of(&f, 1);
    char path[512];
    snprintf(path, sizeof path, "%s", path_of(".f.active"));
    uint64_t seq[NENT] = {5, 5, 7, 7};
    /* an append's calls: fdatasync, pwrite, fdatasync (and the zeros) */
    for (long k = 1; k <= 3; k++) {
        unlink(path);
        kvx_shard_writer *w;
        assert_int_equal(kvx_shard_writer_create_active(&w, path, &p), 0);
        add(w, &f, 0);
        add(w, &f, 1);
        assert_int_equal(kvx_shard_writer_append(w, 5), 0);
        add(w, &f, 2);
        fault_install();
        fault_only = FAULT_SYNC | FAULT_RW;
        fault_reset(k, EIO, FAULT_ERRNO);
        assert_int_equal(kvx_shard_writer_append(w, 7), -EIO);
        fault_uninstall();
        /* broken: nothing more goes in, and the file has the first record */
        kvx_entry_in e = entry_in(&f, 3);
        assert_int_equal(kvx_shard_writer_add(w, &e), KVX_EINVALID);
        assert_int_equal(kvx_shard_writer_append(w, 8), KVX_EINVALID);
        assert_int_equal(kvx_shard_writer_seal_active(w, path_of("f.kvx")), KVX_EINVALID);
        check_active(path, &p, &f, 2, seq);
        assert_int_equal(access(path_of("f.kvx"), F_OK), -1);
    }
    /* the create: a failure leaves no file */
    unlink(path);
    for (long k = 1; k <= 3; k++) {
        fault_install();
        fault_only = FAULT_SYNC | FAULT_RW;
        fault_reset(k, ENOSPC, FAULT_ERRNO);
        kvx_shard_writer *w = (kvx_shard_writer *)1;
        assert_int_equal(kvx_shard_writer_create_active(&w, path, &p), -ENOSPC);
        fault_uninstall();
        assert_null(w);
        assert_int_equal(access(path, F_OK), -1);
    }
    /* the create never replaces a file */
    two_appends(&f, &p, path);
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_create_active(&w, path, &p), -EEXIST);
    check_active(path, &p, &f, NENT, seq);
}

int main(void)
{
    if (fx_mkdtemp("kvx-append")) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_appends_read_back_then_seal_in_place, fx_clean),
        cmocka_unit_test_setup(test_rollback_forgets_unappended, fx_clean),
        cmocka_unit_test_setup(test_torn_last_record_is_unsealed_tail, fx_clean),
        cmocka_unit_test_setup(test_damaged_record_with_records_after_is_damage, fx_clean),
        cmocka_unit_test_setup(test_another_files_journal_and_records_refused, fx_clean),
        cmocka_unit_test_setup(test_append_fault_at_each_step, fx_clean),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
