/*
 * shard_journal.c - format/shard_journal.c: how an active shard's journal
 * is judged when it is read back. Keyed active files (keys, sequence
 * numbers, tombstones), whose key bytes are user data and may spell a
 * record magic: a record torn by a power cut in any way (any prefix, any
 * suffix of its bytes reaching the disk, the rest zeros or garbage) is the
 * unsealed tail, and the next writer continues after it; a flip of any bit
 * of a whole record with records after it is damage, never acknowledged
 * entries silently dropped; a reader opening the file while a writer
 * appends sees a prefix of the records; crafted records that chain are
 * checked as a sealed file's tables are; a failure at each OS step of the
 * seal and of resume leaves every acknowledged entry readable.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
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
#include "lib/commit.h"
#include "lib/fault.h"
#include "lib/shard.h"

#define JFLAGS (KVX_FLAG_KEYS | KVX_FLAG_SEQ | KVX_FLAG_TOMB)
#define JMAX 64u

static kvx_active_params jparams(void)
{
    kvx_active_params p;
    memset(&p, 0, sizeof p);
    assert_int_equal(kvx_keyed_geometry(&p.geometry, CM_PB), 0);
    p.shard_id = CM_SHARD;
    p.max_entries = JMAX;
    p.flags = JFLAGS;
    memset(p.ident, 0x5a, sizeof p.ident);
    return p;
}

/* Entry i's key: a record magic at an 8-aligned offset of the journal
 * (a row is 24 + 256 + 8 + 1 bytes; the key starts at the row's byte 25,
 * so its byte 7 is 8-aligned in a row that is), then i. */
static void key_of(char *k, uint32_t i) { snprintf(k, 64, "0123456KVXAPPND%u", i); }

static void jpage(uint8_t *pg, uint32_t i)
{
    for (uint32_t b = 0; b < 64; b++) pg[b] = (uint8_t)(i * 13u + b * 3u + 1u);
}

static void jadd(kvx_shard_writer *w, uint32_t i)
{
    char k[64];
    key_of(k, i);
    uint8_t pg[64];
    jpage(pg, i);
    kvx_entry_in e;
    memset(&e, 0, sizeof e);
    e.radix_block = (uint16_t)(100 + i);
    e.token_count = 1;
    e.page = pg;
    e.key = k;
    e.key_len = (uint32_t)strlen(k);
    e.page_len = 64;
    assert_int_equal(kvx_shard_writer_add(w, &e), 0);
}

/* Checks the shard holds entries [0, n), entry i with its key and page. */
static void jcheck_shard(kvx_shard *s, uint32_t n)
{
    assert_int_equal(kvx_shard_get_info(s)->num_blocks, n);
    for (uint32_t i = 0; i < n; i++) {
        kvx_entry e;
        assert_int_equal(kvx_shard_entry(&e, s, i), 0);
        assert_int_equal(e.coordinate, KVX_COORD(CM_SHARD, 100 + i, 0));
        char k[64];
        key_of(k, i);
        assert_int_equal(e.key_len, strlen(k));
        assert_memory_equal(e.key, k, e.key_len);
        const void *pg;
        assert_int_equal(kvx_shard_page(&pg, s, i, 1), 0);
        uint8_t want[64];
        jpage(want, i);
        assert_int_equal(e.bytes, 64);
        assert_memory_equal(pg, want, 64);
    }
}

static void jcheck(const char *path, const kvx_active_params *p, uint32_t n)
{
    kvx_shard *s = NULL;
    int rc = kvx_shard_open_active(&s, AT_FDCWD, path, path, p);
    if (rc) fprintf(stderr, "open_active: %d: %s\n", rc, kvx_last_error());
    assert_int_equal(rc, 0);
    jcheck_shard(s, n);
    kvx_shard_close(s);
}

/* An active file of p with records of counts[k] entries (sequence
 * numbers 10, 20, ...). */
static void jbuild(const char *path, const kvx_active_params *p, const uint32_t *counts, int records)
{
    unlink(path);
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_create_active(&w, path, p), 0);
    uint32_t i = 0;
    for (int r = 0; r < records; r++) {
        for (uint32_t c = 0; c < counts[r]; c++) jadd(w, i++);
        assert_int_equal(kvx_shard_writer_append(w, 10u * (uint64_t)(r + 1)), 0);
    }
    kvx_shard_writer_abort(w);
}

static uint64_t jrecord_at(const kvx_active_params *p, const uint32_t *counts, int k)
{
    kvx_journal_geom jg;
    assert_int_equal(kvx_journal_geom_for(&jg, p), 0);
    uint64_t at = jg.journal_off + KVX_JOURNAL_HEADER_BYTES;
    for (int r = 0; r < k; r++) at = (at + KVX_RECORD_HEADER_BYTES + counts[r] * jg.row_bytes + 7) & ~7ull;
    return at;
}

static uint64_t jrow_bytes(const kvx_active_params *p)
{
    kvx_journal_geom jg;
    assert_int_equal(kvx_journal_geom_for(&jg, p), 0);
    return jg.row_bytes;
}

static void put(const char *path, const void *b, size_t len, uint64_t off)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, b, len, (off_t)off), (ssize_t)len);
    close(fd);
}

static void get(const char *path, void *b, size_t len, uint64_t off)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, b, len, (off_t)off), (ssize_t)len);
    close(fd);
}

/* The last record torn by a power cut: any prefix or any suffix of its
 * bytes on the disk, the rest zeros or garbage. Its rows hold keys that
 * spell a record magic at 8-aligned offsets: still the unsealed tail
 * (never damage: the file opens with the records before it), and the
 * next writer clears it and appends. */
/* PROMISE: FORMAT-36 */
static void test_torn_record_any_part_is_unsealed_tail(void **state)
{
    (void)state;
    kvx_active_params p = jparams();
    char path[512];
    snprintf(path, sizeof path, "%s", path_of(".j.active"));
    uint32_t counts[] = {1, 2};
    jbuild(path, &p, counts, 2);
    jcheck(path, &p, 3);
    uint64_t at = jrecord_at(&p, counts, 1), len = KVX_RECORD_HEADER_BYTES + 2 * jrow_bytes(&p);
    uint8_t *rec = malloc(len), *torn = malloc(len);
    get(path, rec, len, at);
    /* the keys' magic is there, 8-aligned, in the record's rows */
    int magics = 0;
    for (uint64_t o = (8 - at % 8) % 8; o + 8 <= len; o += 8)
        magics += o >= KVX_RECORD_HEADER_BYTES && memcmp(rec + o, KVX_RECORD_MAGIC, 8) == 0;
    assert_true(magics >= 1);
    for (int mode = 0; mode < 4; mode++) {
        for (uint64_t k = 0; k < len; k++) {
            /* 0, 1: bytes [0, k) reached the disk, the rest zeros / garbage;
             * 2, 3: bytes [k, len) did, the rest zeros / garbage */
            for (uint64_t b = 0; b < len; b++) {
                int kept = mode < 2 ? b < k : b >= k;
                torn[b] = kept ? rec[b] : (mode & 1) ? (uint8_t)(rnd() | 1) : 0;
            }
            put(path, torn, len, at);
            kvx_shard *s = NULL;
            int rc = kvx_shard_open_active(&s, AT_FDCWD, path, path, &p);
            if (rc) fprintf(stderr, "mode %d, k %llu: %d: %s\n", mode, (unsigned long long)k, rc, kvx_last_error());
            assert_int_equal(rc, 0);
            /* the bytes lost may have been zeros: then it is whole */
            jcheck_shard(s, memcmp(torn, rec, len) == 0 ? 3 : 1);
            kvx_shard_close(s);
        }
    }
    /* the next writer after a torn header: its rows (and their magic)
     * cleared, a shorter record in their place */
    memset(torn, 0, len);
    memcpy(torn + 40, rec + 40, (size_t)(len - 40));
    put(path, torn, len, at);
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_resume(&w, path, &p), 0);
    assert_int_equal(kvx_shard_writer_appended(w), 1);
    jadd(w, 1);
    assert_int_equal(kvx_shard_writer_append(w, 30), 0);
    kvx_shard_writer_abort(w);
    jcheck(path, &p, 2);
    assert_int_equal(kvx_shard_writer_resume(&w, path, &p), 0);
    jadd(w, 2);
    assert_int_equal(kvx_shard_writer_append(w, 40), 0);
    assert_int_equal(kvx_shard_writer_seal_active(w, path_of("j.kvx")), 0);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path_of("j.kvx"), KVX_OPEN_VERIFY_PAGES), 0);
    jcheck_shard(s, 3);
    kvx_shard_close(s);
    free(rec);
    free(torn);
}

/* Each bit of a whole record with records after it flipped (its header,
 * its rows, its CRC): damage (KVX_ECORRUPT), for the reader and for the
 * next writer, never a file that opens with the acknowledged entries of
 * the records after it silently gone. Its padding is no record's: a flip
 * there changes nothing. */
/* PROMISE: FORMAT-37 */
static void test_flip_in_middle_record_is_damage(void **state)
{
    (void)state;
    kvx_active_params p = jparams();
    char path[512];
    snprintf(path, sizeof path, "%s", path_of(".m.active"));
    uint32_t counts[] = {1, 2, 1, 1};
    jbuild(path, &p, counts, 4);
    jcheck(path, &p, 5);
    for (int r = 0; r < 3; r++) {
        uint64_t at = jrecord_at(&p, counts, r), next = jrecord_at(&p, counts, r + 1);
        uint64_t len = KVX_RECORD_HEADER_BYTES + counts[r] * jrow_bytes(&p);
        for (uint64_t b = 0; b < next - at; b++) {
            uint8_t orig;
            get(path, &orig, 1, at + b);
            for (int bit = 0; bit < 8; bit++) {
                uint8_t x = (uint8_t)(orig ^ (1u << bit));
                put(path, &x, 1, at + b);
                kvx_shard *s = NULL;
                int rc = kvx_shard_open_active(&s, AT_FDCWD, path, path, &p);
                if (b >= len) { /* padding */
                    assert_int_equal(rc, 0);
                    jcheck_shard(s, 5);
                    kvx_shard_close(s);
                } else {
                    if (rc != KVX_ECORRUPT)
                        fprintf(stderr, "record %d byte %llu bit %d: %d (%u entries)\n", r, (unsigned long long)b, bit,
                                rc, rc ? 0 : kvx_shard_get_info(s)->num_blocks);
                    assert_int_equal(rc, KVX_ECORRUPT);
                    assert_null(s);
                    assert_non_null(strstr(kvx_last_error(), "record"));
                }
            }
            put(path, &orig, 1, at + b);
        }
    }
    /* the next writer refuses it too (a count grown past the records
     * after it) */
    uint32_t c = 3;
    uint8_t c4[4] = {(uint8_t)c, 0, 0, 0};
    put(path, c4, 4, jrecord_at(&p, counts, 1) + KVX_R_COUNT);
    kvx_shard_writer *w = (kvx_shard_writer *)1;
    assert_int_equal(kvx_shard_writer_resume(&w, path, &p), KVX_ECORRUPT);
    assert_null(w);
}

int main(void)
{
    if (fx_mkdtemp("kvx-journal")) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_torn_record_any_part_is_unsealed_tail, fx_clean),
        cmocka_unit_test_setup(test_flip_in_middle_record_is_damage, fx_clean),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
