/*
 * active.c - engine/store_active.c: a block store's flushes append to one
 * active shard (one journal record a flush, no new file), served at once
 * by the writer and by readers whose handles opened before; the shard is
 * sealed in place when full, at close, at reindex and by the next
 * writer's recovery after a kill; an unflushed batch's pages in it are
 * never adopted; a failed append loses nothing acknowledged; an active
 * file that cannot be read goes to quarantine/; a second batch writes its
 * own file meanwhile; eviction never takes the active shard.
 */
#include <dirent.h>
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/os.h"
#include "lib/commit_fault.h"
#include "lib/fault.h"
#include "lib/store.h"

/* How many names of dir/sub end in suffix (sealed ".kvx" or ".active"). */
static size_t count_suffix(const char *dir, const char *sub, const char *suffix)
{
    static char names[1024][64];
    size_t n = su_list_names(dir, sub, names, 1024), k = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(names[i]), sl = strlen(suffix);
        if (l >= sl && strcmp(names[i] + l - sl, suffix) == 0) k++;
    }
    return k;
}

/* The active file's name in dir/shards (the test fails unless exactly one). */
static void active_name(const char *dir, char *out, size_t cap)
{
    static char names[1024][64];
    size_t n = su_list_names(dir, "shards", names, 1024), k = 0;
    for (size_t i = 0; i < n; i++)
        if (strstr(names[i], ".active")) {
            snprintf(out, cap, "%.63s", names[i]);
            k++;
        }
    assert_int_equal(k, 1);
}

/* kvx_store_prefix_read of sequence seq's SU_NB blocks from s (flags):
 * how many, each page compared byte for byte with what was put. */
static size_t read_into(kvx_store *s, uint64_t seq, uint32_t flags)
{
    uint32_t t[SU_NB * SU_B];
    uint64_t h[SU_NB];
    su_tokens(t, seq, SU_NB, 0);
    uint8_t *want = su_pages(t, SU_NB, h, 64);
    kvx_geometry g = su_geometry();
    size_t pb = (size_t)kvx_page_bytes(&g, SU_B), stride = (pb + 4095) & ~(size_t)4095, n = 99;
    uint8_t *dst = aligned_alloc(4096, stride * SU_NB);
    assert_non_null(dst);
    int rc = kvx_store_prefix_read(&n, s, t, SU_NB * SU_B, dst, stride, SU_NB, NULL, flags);
    if (rc) fail_msg("prefix_read: %s (%s)", kvx_err_name(rc), kvx_last_error());
    for (size_t i = 0; i < n; i++) assert_memory_equal(dst + i * stride, want + i * pb, pb);
    free(dst);
    free(want);
    return n;
}

/* A store whose journal rows would take more than 1/16 of its entries'
 * bytes (4 KiB pages of 256-token blocks: 1 KiB of lineage tokens a row)
 * writes a file per flush: each sealed file would keep that copy of its
 * rows (docs/STORE.md "Appends"). */
/* PROMISE: STORE-20 */
static void test_tiny_pages_long_blocks_write_files(void **state)
{
    (void)state;
    enum { B = 256, NBLK = 2 };
    char dir[300];
    kvx_geometry g = {1, 1, 4, B, KVX_QUANT_FP16, 0x1122334455667788ull}; /* page 2*4*256*2 = 4 KiB */
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.geometry = &g, .capacity = 64 << 20});
    size_t pb = (size_t)kvx_page_bytes(&g, B);
    uint32_t t[3][NBLK * B + 1];
    uint8_t *pages = calloc(NBLK, pb);
    assert_non_null(pages);
    for (int q = 0; q < 3; q++) {
        for (size_t i = 0; i < NBLK * B + 1; i++) t[q][i] = (uint32_t)(q * 100000 + i + 1);
        memset(pages, 0x10 + q, NBLK * pb);
        size_t added = 0;
        int rc = kvx_store_put(s, t[q], NBLK * B + 1, pages, NBLK, NULL, &added);
        if (rc) fail_msg("put %d: %s (%s)", q, kvx_err_name(rc), kvx_last_error());
        assert_int_equal(added, NBLK);
        assert_int_equal(kvx_store_flush(s), 0);
        /* no active shard: a sealed file of its own per flush */
        assert_int_equal(count_suffix(dir, "shards", ".active"), 0);
        assert_int_equal(count_suffix(dir, "shards", ".kvx"), q + 1);
    }
    for (int q = 0; q < 3; q++) {
        kvx_view v[NBLK];
        size_t n = 0;
        assert_int_equal(kvx_store_prefix(v, &n, s, t[q], NBLK * B + 1, NBLK), 0);
        assert_int_equal(n, NBLK);
        for (size_t i = 0; i < n; i++) assert_int_equal(((const uint8_t *)v[i].page)[0], 0x10 + q);
        kvx_views_release(v, n);
    }
    free(pages);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* kvx_store_plan_reindex (`kvx store reindex --dry-run`) over a store
 * holding an active shard names it and says it is sealed before any plan
 * reads it, rather than "not a shard file name". */
/* PROMISE: STORE-20 */
static void test_plan_names_the_active_file(void **state)
{
    (void)state;
    char dir[300], name[64];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20, .flags = KVX_STORE_NOWAIT});
    su_put_flush(s, 1, SU_NB);
    active_name(dir, name, sizeof name);
    kvx_store_plan *plan = NULL;
    assert_int_equal(kvx_store_plan_reindex(&plan, dir), 0); /* beside the writer */
    int seen = 0;
    for (size_t i = 0; i < kvx_store_plan_steps(plan); i++) {
        kvx_plan_step x;
        assert_int_equal(kvx_store_plan_step(plan, i, &x), 0);
        if (strcmp(x.name, name) != 0) continue;
        seen = 1;
        assert_string_equal(x.action, "leave");
        assert_non_null(strstr(x.reason, "an active shard"));
        assert_non_null(strstr(x.reason, "seals it"));
    }
    assert_true(seen);
    kvx_store_plan_free(plan);
    kvx_store_close(s); /* sealed: the plan then keeps it under its sealed name */
    assert_int_equal(kvx_store_plan_reindex(&plan, dir), 0);
    kvx_recovery_report r;
    kvx_store_plan_summary(plan, &r);
    assert_int_equal(r.left_alone, 0);
    assert_int_equal(r.blocks_indexed, SU_NB);
    kvx_store_plan_free(plan);
}

/* PROMISE: STORE-20 */
static void test_flushes_append_to_one_file(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20, .flags = KVX_STORE_NOWAIT});
    kvx_store *early = su_reopen(dir, KVX_STORE_READONLY); /* its handles open before the appends */
    for (uint64_t q = 1; q <= 8; q++) {
        su_put_flush(s, q, SU_NB);
        assert_int_equal(su_prefix_nb(early, 1), SU_NB); /* a handle opened at flush 1 sees the later ones */
        assert_int_equal(su_prefix_nb(early, q), SU_NB);
    }
    /* one file for eight flushes, nothing staged */
    assert_int_equal(count_suffix(dir, "shards", ".active"), 1);
    assert_int_equal(count_suffix(dir, "shards", ".kvx"), 0);
    assert_int_equal(su_n_files(dir, "staging"), 0);
    for (uint64_t q = 1; q <= 8; q++) {
        assert_int_equal(su_prefix_nb(s, q), SU_NB);
        assert_int_equal(su_prefix_nb(early, q), SU_NB);
        /* read into the caller's memory too: through the cache, O_DIRECT */
        assert_int_equal(read_into(s, q, 0), SU_NB);
        assert_int_equal(read_into(early, q, KVX_PREFIX_READ_DIRECT), SU_NB);
    }
    kvx_store_stats st = su_stat(s);
    assert_int_equal(st.blocks, 8 * SU_NB);
    assert_int_equal(st.shards, 1);
    su_verify_clean(s);
    su_verify_clean(early);
    kvx_store *late = su_reopen(dir, KVX_STORE_READONLY);
    for (uint64_t q = 1; q <= 8; q++) assert_int_equal(su_prefix_nb(late, q), SU_NB);
    kvx_store_close(late);
    /* close seals it in place: the same inode under its sealed name */
    char name[64], path[600];
    active_name(dir, name, sizeof name);
    snprintf(path, sizeof path, "%s/shards/%s", dir, name);
    struct stat a;
    assert_int_equal(stat(path, &a), 0);
    kvx_store_close(s);
    assert_int_equal(count_suffix(dir, "shards", ".active"), 0);
    assert_int_equal(count_suffix(dir, "shards", ".kvx"), 1);
    snprintf(path, sizeof path, "%s/shards/%.16s.kvx", dir, name + 1);
    struct stat b;
    assert_int_equal(stat(path, &b), 0);
    assert_true(a.st_ino == b.st_ino);
    kvx_shard *sh;
    assert_int_equal(kvx_shard_open(&sh, path, KVX_OPEN_VERIFY_PAGES), 0); /* a standard KVX file */
    assert_int_equal(kvx_shard_get_info(sh)->num_blocks, 8 * SU_NB);
    kvx_shard_close(sh);
    for (uint64_t q = 1; q <= 8; q++) assert_int_equal(su_prefix_nb(early, q), SU_NB); /* across the seal */
    kvx_store_close(early);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    kvx_recovery_report rep;
    assert_int_equal(kvx_store_recovery(s, &rep), 0);
    assert_int_equal(rep.rebuilt, 0); /* the catalog names the sealed file as it is */
    for (uint64_t q = 1; q <= 8; q++) assert_int_equal(su_prefix_nb(s, q), SU_NB);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* PROMISE: STORE-20 */
static void test_full_active_shard_sealed_and_next_begun(void **state)
{
    (void)state;
    char dir[300];
    /* 256 KiB shards: a few prompts fill one */
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 256 << 10});
    for (uint64_t q = 1; q <= 40; q++) su_put_flush(s, q, SU_NB);
    assert_true(count_suffix(dir, "shards", ".active") <= 1); /* none when the last flush filled it */
    assert_true(count_suffix(dir, "shards", ".kvx") >= 2);
    for (uint64_t q = 1; q <= 40; q++) assert_int_equal(su_prefix_nb(s, q), SU_NB);
    kvx_store_stats st = su_stat(s);
    assert_int_equal(st.blocks, 40 * SU_NB);
    assert_int_equal(st.compactions, 0); /* nothing small to merge */
    su_verify_clean(s);
    kvx_store_close(s);
    s = su_reopen(dir, 0);
    for (uint64_t q = 1; q <= 40; q++) assert_int_equal(su_prefix_nb(s, q), SU_NB);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* A writer process: flushes seqs [first, first + n), then puts seq
 * first + n without a flush (its pages in the active file), then dies
 * (SIGKILL). */
static void killed_with_unflushed(const char *dir, uint64_t first, uint64_t n)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kvx_store *c = NULL;
        if (kvx_store_open(&c, dir, NULL, KVX_STORE_NOWAIT)) _exit(2);
        for (uint64_t q = first; q < first + n; q++)
            if (su_put_seq(c, q, SU_NB)) _exit(3);
        su_put_nb(c, first + n);
        raise(SIGKILL);
        _exit(4);
    }
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFSIGNALED(ws));
}

/* PROMISE: STORE-21 */
static void test_kill9_then_recovery_seals(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20});
    su_put_flush(s, 1, SU_NB);
    kvx_store_close(s);
    killed_with_unflushed(dir, 10, 5);
    assert_int_equal(count_suffix(dir, "shards", ".active"), 1);
    /* a reader before any writer: every acknowledged block, from the
     * active file as the killed writer left it; it changes nothing */
    kvx_store *r = su_reopen(dir, KVX_STORE_READONLY);
    for (uint64_t q = 10; q < 15; q++) assert_int_equal(su_prefix_nb(r, q), SU_NB);
    assert_int_equal(su_prefix_nb(r, 15), 0);
    kvx_store_close(r);
    assert_int_equal(count_suffix(dir, "shards", ".active"), 1);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(count_suffix(dir, "shards", ".active"), 0); /* sealed by recovery */
    assert_int_equal(su_prefix_nb(s, 1), SU_NB);
    for (uint64_t q = 10; q < 15; q++) assert_int_equal(su_prefix_nb(s, q), SU_NB);
    assert_int_equal(su_prefix_nb(s, 15), 0); /* put, never flushed: never adopted */
    assert_int_equal(su_stat(s).blocks, 6 * SU_NB);
    su_verify_clean(s);
    /* the same put, flushed now, is served */
    su_put_flush(s, 15, SU_NB);
    assert_int_equal(su_prefix_nb(s, 15), SU_NB);
    kvx_store_close(s);
    /* and once more from scratch: a reindex from the files alone */
    assert_int_equal(kvx_store_reindex_dir(dir, 0), 0);
    s = su_reopen(dir, 0);
    for (uint64_t q = 10; q < 16; q++) assert_int_equal(su_prefix_nb(s, q), SU_NB);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* PROMISE: STORE-21 */
static void test_unreadable_active_file_quarantined(void **state)
{
    (void)state;
    char dir[300], name[64], path[700];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20});
    kvx_store_close(s);
    killed_with_unflushed(dir, 20, 3);
    active_name(dir, name, sizeof name);
    snprintf(path, sizeof path, "%s/shards/%s", dir, name);
    /* its journal header, every byte of which its CRC covers, flipped */
    kvx_geometry g;
    s = su_reopen(dir, KVX_STORE_READONLY);
    assert_int_equal(kvx_store_get_geometry(&g, s), 0);
    kvx_store_close(s);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    long off = -1;
    char buf[8];
    for (long at = 64; at < 8 << 20 && off < 0; at += 64) {
        if (fseek(f, at, SEEK_SET) || fread(buf, 1, 8, f) != 8) break;
        if (memcmp(buf, "KVXJRNL1", 8) == 0) off = at;
    }
    assert_true(off > 0);
    assert_int_equal(fseek(f, off + 90, SEEK_SET), 0);
    int c = fgetc(f);
    assert_int_equal(fseek(f, off + 90, SEEK_SET), 0);
    fputc(c ^ 1, f);
    fclose(f);
    struct stat before;
    assert_int_equal(stat(path, &before), 0);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    /* never deleted: moved to quarantine/ whole, with its reason */
    assert_int_equal(count_suffix(dir, "shards", ".active"), 0);
    snprintf(path, sizeof path, "%s/quarantine/%s", dir, name);
    struct stat after;
    assert_int_equal(stat(path, &after), 0);
    assert_true(after.st_ino == before.st_ino && after.st_size == before.st_size);
    snprintf(path, sizeof path, "%s/quarantine/%s.why", dir, name);
    assert_int_equal(access(path, F_OK), 0);
    for (uint64_t q = 20; q < 23; q++) assert_int_equal(su_prefix_nb(s, q), 0); /* a miss, never wrong */
    kvx_recovery_report rep;
    assert_int_equal(kvx_store_recovery(s, &rep), 0);
    assert_int_equal(rep.quarantined, 1); /* and the caller hears of it */
    su_put_flush(s, 30, SU_NB);
    assert_int_equal(su_prefix_nb(s, 30), SU_NB);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* verify's report: the count of problems whose code is ctx's */
static void count_code(void *ctx, const char *what, int code)
{
    (void)what;
    int *want = ctx;
    if (code == want[0]) want[1]++;
}

/* One bit flipped in the last append record of an acknowledged flush
 * (found by an attack: recovery took it for a torn tail and cut the
 * flush's pages off, silently). The catalog names that record's entries,
 * and a torn record never reaches the catalog (its edit follows the
 * record's fdatasync): so it is damage, and the active file goes to
 * quarantine/ whole, reported, never cut. A reader before that serves
 * the flushes before it and the damaged one as a miss. */
/* PROMISE: STORE-21 */
static void test_damaged_last_record_quarantined(void **state)
{
    (void)state;
    char dir[300], name[64], path[700];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20});
    kvx_store_close(s);
    killed_with_unflushed(dir, 40, 6);
    active_name(dir, name, sizeof name);
    snprintf(path, sizeof path, "%s/shards/%s", dir, name);
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    struct stat before;
    assert_int_equal(fstat(fileno(f), &before), 0);
    uint8_t *img = malloc((size_t)before.st_size);
    assert_non_null(img);
    assert_int_equal(fread(img, 1, (size_t)before.st_size, f), (size_t)before.st_size);
    long last = -1;
    for (long at = 0; at + 8 <= (long)before.st_size; at += 8)
        if (memcmp(img + at, "KVXAPPND", 8) == 0) last = at;
    assert_true(last > 0);
    uint32_t count, row;
    memcpy(&count, img + last + 20, 4);
    memcpy(&row, img + last + 24, 4);
    assert_int_equal(count, SU_NB);
    long at = last + 32 + (long)row * (SU_NB / 2) + 3; /* a row of the record, not its header */
    assert_int_equal(fseek(f, at, SEEK_SET), 0);
    fputc(img[at] ^ 0x10, f);
    fclose(f);
    free(img);
    /* a reader before any writer: the earlier flushes, the damaged one a miss */
    kvx_store *r = su_reopen(dir, KVX_STORE_READONLY);
    for (uint64_t q = 40; q < 45; q++) assert_int_equal(su_prefix_nb(r, q), SU_NB);
    assert_int_equal(su_prefix_nb(r, 45), 0);
    int corrupt[2] = {KVX_ECORRUPT, 0};
    uint64_t bad = 0;
    int vrc = kvx_store_verify(r, &bad, count_code, corrupt);
    assert_true(vrc == 0 || vrc == KVX_ECORRUPT);
    assert_true(bad >= 1 && corrupt[1] >= 1); /* the file's entries short of the catalog's */
    kvx_store_close(r);
    s = su_reopen(dir, KVX_STORE_NOWAIT);
    assert_int_equal(count_suffix(dir, "shards", ".active"), 0);
    snprintf(path, sizeof path, "%s/quarantine/%s", dir, name);
    struct stat after;
    assert_int_equal(stat(path, &after), 0);
    assert_true(after.st_ino == before.st_ino && after.st_size == before.st_size); /* moved whole, nothing cut */
    snprintf(path, sizeof path, "%s/quarantine/%s.why", dir, name);
    char why[1024] = "";
    f = fopen(path, "r");
    assert_non_null(f);
    size_t got = fread(why, 1, sizeof why - 1, f);
    fclose(f);
    why[got] = '\0';
    assert_non_null(strstr(why, "acknowledged flush damaged"));
    kvx_recovery_report rep;
    assert_int_equal(kvx_store_recovery(s, &rep), 0);
    assert_int_equal(rep.quarantined, 1);
    for (uint64_t q = 40; q < 46; q++) assert_int_equal(su_prefix_nb(s, q), 0); /* misses, never wrong */
    su_put_flush(s, 50, SU_NB);
    assert_int_equal(su_prefix_nb(s, 50), SU_NB);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* A writer killed between creating its active file and writing the
 * journal header leaves it empty, or zero bytes to some length: it never
 * held a record, so recovery removes it (reported as deleted, never as
 * quarantined); one nonzero byte in it, in its journal region or among
 * its pages, and it goes to quarantine/ instead (found by
 * tests/system/model_blocks.c). */
/* PROMISE: STORE-21 */
static void test_blank_active_file_removed(void **state)
{
    (void)state;
    static const long sizes[] = {0, 512, 64 << 10, 8 << 20};
    for (int k = 0; k < 6; k++) {
        char dir[300], path[700];
        kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20});
        su_put_flush(s, 1, SU_NB);
        kvx_store_close(s); /* sealed: no active file */
        assert_int_equal(count_suffix(dir, "shards", ".active"), 0);
        const char *name = ".00000000000000f0.09.kvx.active";
        snprintf(path, sizeof path, "%s/shards/%s", dir, name);
        FILE *f = fopen(path, "wb");
        assert_non_null(f);
        long size = k < 4 ? sizes[k] : 64 << 10;
        if (size) assert_int_equal(ftruncate(fileno(f), size), 0);
        if (k == 4) { /* nonzero bytes over its journal region: not blank */
            static uint8_t junk[60 << 10];
            memset(junk, 0x5a, sizeof junk);
            assert_int_equal(fseek(f, 4 << 10, SEEK_SET), 0);
            assert_int_equal(fwrite(junk, 1, sizeof junk, f), sizeof junk);
        }
        if (k == 5) { /* a zero journal beside written pages: damage (the
                       * header is durable before any page), kept */
            size = 8 << 20;
            assert_int_equal(ftruncate(fileno(f), size), 0);
            static uint8_t page[4096];
            memset(page, 0xa5, sizeof page);
            assert_int_equal(fseek(f, (6 << 20) + 8192, SEEK_SET), 0);
            assert_int_equal(fwrite(page, 1, sizeof page, f), sizeof page);
        }
        fclose(f);
        s = su_reopen(dir, KVX_STORE_NOWAIT);
        kvx_recovery_report rep;
        assert_int_equal(kvx_store_recovery(s, &rep), 0);
        assert_int_equal(count_suffix(dir, "shards", ".active"), 0);
        snprintf(path, sizeof path, "%s/quarantine/%s", dir, name);
        if (k < 4) {
            assert_int_equal(access(path, F_OK), -1); /* removed, not set aside */
            assert_int_equal(rep.quarantined, 0);
            assert_int_equal(rep.deleted_unacked, 1);
        } else {
            assert_int_equal(access(path, F_OK), 0);
            assert_int_equal(rep.quarantined, 1);
        }
        assert_int_equal(su_prefix_nb(s, 1), SU_NB); /* the sealed file's blocks stay */
        su_put_flush(s, 2, SU_NB);
        assert_int_equal(su_prefix_nb(s, 2), SU_NB);
        su_verify_clean(s);
        kvx_store_close(s);
    }
}

/* PROMISE: STORE-22 */
static void test_failed_append_loses_nothing_acknowledged(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20, .flags = KVX_STORE_NOWAIT});
    su_put_flush(s, 1, SU_NB);
    su_put_flush(s, 2, SU_NB);
    /* the next flush's syncs fail, one after another: the append's
     * (pages, record) and anything after */
    for (long k = 1; k <= 2; k++) {
        su_put_nb(s, 40 + (uint64_t)k);
        fault_install();
        fault_only = FAULT_SYNC;
        fault_reset(k, EIO, FAULT_ERRNO);
        int rc = kvx_store_flush(s);
        fault_uninstall();
        assert_int_not_equal(rc, 0);
        /* the flush failed: its blocks are not served (a miss), the
         * acknowledged ones are */
        assert_int_equal(su_prefix_nb(s, 40 + (uint64_t)k), 0);
        assert_int_equal(su_prefix_nb(s, 1), SU_NB);
        assert_int_equal(su_prefix_nb(s, 2), SU_NB);
        /* the store goes on, in a new active shard */
        su_put_flush(s, 50 + (uint64_t)k, SU_NB);
        assert_int_equal(su_prefix_nb(s, 50 + (uint64_t)k), SU_NB);
    }
    su_verify_clean(s);
    kvx_store_close(s);
    s = su_reopen(dir, 0);
    for (uint64_t q = 1; q <= 2; q++) assert_int_equal(su_prefix_nb(s, q), SU_NB);
    for (uint64_t q = 51; q <= 52; q++) assert_int_equal(su_prefix_nb(s, q), SU_NB);
    /* a failed flush's blocks: all of a prompt or none of it (one record) */
    for (uint64_t q = 41; q <= 42; q++) {
        size_t n = su_prefix_nb(s, q);
        assert_true(n == 0 || n == SU_NB);
    }
    assert_int_equal(count_suffix(dir, "shards", ".active"), 0);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* PROMISE: STORE-20 */
static void test_second_batch_writes_its_own_file(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20});
    kvx_store_batch *b;
    assert_int_equal(kvx_store_batch_create(&b, s), 0);
    su_put_nb(s, 1);                                    /* the built-in batch owns the active shard */
    assert_int_equal(su_put_batch(s, b, 2, NULL), 0);   /* b: a file of its own, staged */
    assert_int_equal(su_n_files(dir, "staging"), 1);
    assert_int_equal(kvx_store_batch_flush(b), 0);
    assert_int_equal(su_prefix_nb(s, 2), SU_NB);
    assert_int_equal(su_prefix_nb(s, 1), 0);            /* not flushed yet */
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(su_prefix_nb(s, 1), SU_NB);
    /* destroyed unflushed, b's blocks go and the active shard is b's next */
    assert_int_equal(su_put_batch(s, b, 3, NULL), 0);
    kvx_store_batch_destroy(b);
    assert_int_equal(su_prefix_nb(s, 3), 0);
    su_put_flush(s, 4, SU_NB);
    assert_int_equal(su_prefix_nb(s, 4), SU_NB);
    su_verify_clean(s);
    kvx_store_close(s);
    s = su_reopen(dir, 0);
    for (uint64_t q = 1; q <= 4; q++) assert_int_equal(su_prefix_nb(s, q), q == 3 ? 0 : SU_NB);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* PROMISE: STORE-23 */
static void test_eviction_and_reindex_with_an_active_shard(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 2 << 20, .shard_bytes = 256 << 10, .flags = KVX_STORE_NOSYNC});
    uint64_t q = 1;
    for (; q <= 200; q++) su_put_flush(s, q, SU_NB);
    kvx_store_stats st = su_stat(s);
    assert_true(st.evictions > 0);
    assert_true(st.bytes <= st.capacity_bytes);
    /* the newest prompts are in the active shard, never evicted while
     * it is: the last ones are all served */
    for (uint64_t k = q - 3; k < q; k++) assert_int_equal(su_prefix_nb(s, k), SU_NB);
    su_verify_clean(s);
    /* reindex seals it first, then reads every file */
    assert_int_equal(kvx_store_reindex(s), 0);
    assert_int_equal(count_suffix(dir, "shards", ".active"), 0);
    for (uint64_t k = q - 3; k < q; k++) assert_int_equal(su_prefix_nb(s, k), SU_NB);
    su_put_flush(s, q, SU_NB);
    assert_int_equal(su_prefix_nb(s, q), SU_NB);
    su_verify_clean(s);
    /* gc seals it too, unless a batch's unflushed blocks are in it: then
     * it leaves it alone, and that batch's flush appends as before */
    su_put_flush(s, q + 1, SU_NB);
    assert_int_equal(kvx_store_gc(s), 0);
    assert_int_equal(count_suffix(dir, "shards", ".active"), 0);
    su_put_nb(s, q + 2);
    assert_int_equal(count_suffix(dir, "shards", ".active"), 1);
    assert_int_equal(kvx_store_gc(s), 0);
    assert_int_equal(count_suffix(dir, "shards", ".active"), 1);
    assert_int_equal(kvx_store_flush(s), 0);
    for (uint64_t k = q; k <= q + 2; k++) assert_int_equal(su_prefix_nb(s, k), SU_NB);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* The mixed commit's child: flushes seq 1; puts prompts 100.. into the
 * built-in batch until its blocks overflow the active shard into a file
 * of its own (staged; not mixed: two prompts, all in the active shard); fails call k of the kinds `only` of that flush
 * (sticky: every call from k on, so that undoing it fails too);
 * flushes seq 3; writes to fd how many prompts the batch held, whether
 * its flush and seq 3's answered 0; dies (SIGKILL). */
static void mixed_child(const char *dir, unsigned only, long k, int sticky, int mixed, int fd)
{
    kvx_store *c = NULL;
    if (kvx_store_open(&c, dir, NULL, KVX_STORE_NOWAIT)) _exit(2);
    if (su_put_seq(c, 1, SU_NB)) _exit(3);
    int np = 0;
    while ((mixed ? su_n_files(dir, "staging") == 0 : np < 2) && np < 4000) {
        if (su_put_batch(c, NULL, 100 + (uint64_t)np, NULL)) _exit(4);
        np++;
    }
    if ((su_n_files(dir, "staging") == 0) == mixed) _exit(5);
    if (write(fd, &np, sizeof np) != (ssize_t)sizeof np) _exit(6);
    fault_install();
    fault_only = only;
    fault_sticky = sticky == 1;
    fault_reset(k, EIO, sticky == 2 ? FAULT_KILL : FAULT_ERRNO);
    int rc = kvx_store_flush(c);
    long hits = fault_hits;
    fault_uninstall();
    int rc3 = su_put_seq(c, 3, SU_NB);
    int out[3] = {rc == 0, rc3 == 0, hits > 0};
    if (write(fd, out, sizeof out) != (ssize_t)sizeof out) _exit(6);
    raise(SIGKILL);
    _exit(7);
}

/* Every call of a mixed commit's flush failed in turn (sticky 1: that
 * call and every one after, the undo's too; 2: SIGKILL before it), then
 * kill -9: after reopen (and
 * after a reindex from the files alone) every acknowledged block is
 * served, the failed batch is all there or none of it, verify is clean. */
static void mixed_commit_faults(int sticky, int mixed)
{
    static const unsigned kinds[] = {FAULT_SYNC, FAULT_NAME, FAULT_RW, 0};
    int refused = 0;
    for (size_t ki = 0; ki < sizeof kinds / sizeof kinds[0] - (size_t)(sticky == 1); ki++) {
        for (long k = 1; k < 200; k++) {
            int hit = 0;
            for (int reindex = 0; reindex < 2; reindex++) {
                char dir[300];
                kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 256 << 10});
                kvx_store_close(s);
                int pfd[2];
                assert_int_equal(pipe(pfd), 0);
                fflush(NULL);
                pid_t pid = fork();
                assert_true(pid >= 0);
                if (pid == 0) {
                    close(pfd[0]);
                    mixed_child(dir, kinds[ki], k, sticky, mixed, pfd[1]);
                }
                close(pfd[1]);
                int got[4] = {0};
                size_t r = 0;
                for (ssize_t m = 1; m > 0 && r < sizeof got; r += (size_t)(m > 0 ? m : 0))
                    m = read(pfd[0], (char *)got + r, sizeof got - r);
                close(pfd[0]);
                int ws = 0;
                assert_int_equal(waitpid(pid, &ws, 0), pid);
                if (r != sizeof got && !(sticky == 2 && r == sizeof(int)))
                    fail_msg("child: status %d", WIFEXITED(ws) ? WEXITSTATUS(ws) : -1);
                if (r == sizeof(int)) got[3] = 1; /* killed inside the flush: nothing acknowledged */
                hit = got[3];
                refused += !got[2];
                if (reindex) assert_int_equal(kvx_store_reindex_dir(dir, KVX_STORE_NOWAIT), 0);
                s = su_reopen(dir, KVX_STORE_NOWAIT);
                assert_int_equal(su_prefix_nb(s, 1), SU_NB);
                /* acknowledged: served; not: all of the batch or none */
                if (got[2] && su_prefix_nb(s, 3) != SU_NB)
                    fail_msg("kind 0x%x call %ld%s: seq 3, acknowledged, lost", kinds[ki], k,
                             reindex ? " (reindex)" : "");
                int whole = 0, none = 0;
                for (int q = 0; q < got[0]; q++) {
                    size_t n = su_prefix_nb(s, 100 + (uint64_t)q);
                    whole += n == SU_NB;
                    none += n == 0;
                }
                if (got[1] ? whole != got[0] : !(whole == got[0] || none == got[0]))
                    fail_msg("kind 0x%x call %ld%s: the batch's flush %s: %d of %d prompts whole, %d none",
                             kinds[ki], k, reindex ? " (reindex)" : "", got[1] ? "answered 0" : "failed", whole,
                             got[0], none);
                su_verify_clean(s);
                kvx_store_close(s);
            }
            if (!hit) break;
        }
    }
    if (sticky == 1) assert_true(refused > 0); /* a cut that failed: the handle refused the next flush */
}

/* PROMISE: STORE-24 */
static void test_mixed_commit_fault_then_kill(void **state)
{
    (void)state;
    mixed_commit_faults(0, 1);
    mixed_commit_faults(0, 0); /* a flush that appends alone */
}

/* PROMISE: STORE-24 */
static void test_mixed_commit_undo_fails_then_kill(void **state)
{
    (void)state;
    mixed_commit_faults(1, 1);
    mixed_commit_faults(1, 0);
}

/* Each catalog commit of appending flushes that evict failed in turn
 * (tests/lib/commit_fault.h; each flush its own file:
 * tests/engine/faults.c). */
/* PROMISE: DUR-21 */
static void test_append_catalog_commit_faults(void **state)
{
    (void)state;
    char dir[512];
    su_new_dir(dir, sizeof dir);
    cf_flush_commit_faults(dir);
}

/* PROMISE: STORE-24 */
static void test_flush_killed_at_each_call(void **state)
{
    (void)state;
    mixed_commit_faults(2, 1);
    mixed_commit_faults(2, 0);
}

/* How many blocks kvx_store_shards' handles hold, all told. */
static size_t shards_blocks(kvx_store *s)
{
    kvx_shard **sh = NULL;
    size_t n = 0, blocks = 0;
    int rc = kvx_store_shards(&sh, &n, s);
    if (rc) fail_msg("shards: %s (%s)", kvx_err_name(rc), kvx_last_error());
    for (size_t i = 0; i < n; i++) {
        blocks += kvx_shard_get_info(sh[i])->num_blocks;
        kvx_shard_close(sh[i]);
    }
    kvx_free(sh);
    return blocks;
}

/* PROMISE: STORE-20 */
static void test_batches_interleave_with_the_active_shard(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20});
    kvx_store *r = su_reopen(dir, KVX_STORE_READONLY);
    kvx_store_batch *b, *c;
    assert_int_equal(kvx_store_batch_create(&b, s), 0);
    assert_int_equal(kvx_store_batch_create(&c, s), 0);
    assert_int_equal(su_put_batch(s, b, 1, NULL), 0); /* b owns the active shard */
    su_put_nb(s, 2);                                   /* the built-in batch: a file of its own */
    assert_int_equal(su_put_batch(s, c, 3, NULL), 0);
    /* a reindex while b owns it: refused (b's blocks are in it), nothing lost */
    int rc = kvx_store_reindex(s);
    assert_true(rc == KVX_EBUSY || rc == 0);
    assert_int_equal(kvx_store_batch_flush(c), 0);
    assert_int_equal(kvx_store_batch_flush(b), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    for (uint64_t q = 1; q <= 3; q++) {
        assert_int_equal(su_prefix_nb(s, q), SU_NB);
        assert_int_equal(su_prefix_nb(r, q), SU_NB);
    }
    /* b again owns it; c destroyed with blocks of its own; b's put after
     * c's flush; the built-in batch flushed between */
    assert_int_equal(su_put_batch(s, b, 4, NULL), 0);
    assert_int_equal(su_put_batch(s, c, 5, NULL), 0);
    kvx_store_batch_destroy(c);
    su_put_flush(s, 6, SU_NB);
    assert_int_equal(su_prefix_nb(s, 4), 0);
    assert_int_equal(su_prefix_nb(s, 5), 0);
    assert_int_equal(kvx_store_reindex(s), KVX_EBUSY);
    /* b destroyed while it owns the active shard: its blocks go, the
     * shard's acknowledged ones stay; the next put takes it */
    kvx_store_batch_destroy(b);
    assert_int_equal(su_prefix_nb(s, 4), 0);
    su_put_flush(s, 7, SU_NB);
    assert_int_equal(kvx_store_reindex(s), 0);
    for (uint64_t q = 1; q <= 7; q++) {
        size_t want = q == 4 || q == 5 ? 0 : SU_NB;
        assert_int_equal(su_prefix_nb(s, q), want);
        assert_int_equal(su_prefix_nb(r, q), want);
    }
    /* a batch left unflushed at close: its blocks never adopted */
    assert_int_equal(kvx_store_batch_create(&b, s), 0);
    assert_int_equal(su_put_batch(s, b, 8, NULL), 0);
    su_put_flush(s, 9, SU_NB);
    assert_int_equal(shards_blocks(r), 6 * SU_NB); /* 1, 2, 3, 6, 7, 9 */
    su_verify_clean(r);
    su_verify_clean(s);
    kvx_store_close(s);
    kvx_store_batch_destroy(b);
    assert_int_equal(count_suffix(dir, "shards", ".active"), 0);
    for (uint64_t q = 1; q <= 9; q++) assert_int_equal(su_prefix_nb(r, q), q == 4 || q == 5 || q == 8 ? 0 : SU_NB);
    kvx_store_close(r);
    s = su_reopen(dir, 0);
    for (uint64_t q = 1; q <= 9; q++) assert_int_equal(su_prefix_nb(s, q), q == 4 || q == 5 || q == 8 ? 0 : SU_NB);
    assert_int_equal(su_stat(s).blocks, 6 * SU_NB);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* PROMISE: STORE-21 */
static void test_strange_things_at_active_names(void **state)
{
    (void)state;
    for (int v = 0; v < 6; v++) {
        char dir[300], name[64], path[700], other[700], cmd[2200];
        kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20});
        su_put_flush(s, 1, SU_NB);
        kvx_store_close(s); /* sealed: 1 in a file of its own */
        killed_with_unflushed(dir, 20, 3);
        active_name(dir, name, sizeof name);
        snprintf(path, sizeof path, "%s/shards/%s", dir, name);
        uint64_t gen = strtoull(name + 1, NULL, 16);
        int acked_served = 1; /* after recovery: 20..22 served (else a miss) */
        switch (v) {
        case 0: /* a copy under another generation's active name, same byte */
            snprintf(other, sizeof other, "%s/shards/.%016llx.00.kvx.active", dir, (unsigned long long)gen + 0x100);
            snprintf(cmd, sizeof cmd, "cp %s %s", path, other);
            assert_int_equal(system(cmd), 0);
            break;
        case 1: /* its name's byte changed: its journal says another file */
            snprintf(other, sizeof other, "%s/shards/.%016llx.05.kvx.active", dir, (unsigned long long)gen);
            assert_int_equal(rename(path, other), 0);
            acked_served = 0;
            break;
        case 2: /* a directory at another active name */
            snprintf(other, sizeof other, "%s/shards/.%016llx.07.kvx.active", dir, (unsigned long long)gen + 7);
            assert_int_equal(mkdir(other, 0700), 0);
            break;
        case 3: /* a FIFO at another active name */
            snprintf(other, sizeof other, "%s/shards/.%016llx.08.kvx.active", dir, (unsigned long long)gen + 8);
            assert_int_equal(mkfifo(other, 0600), 0);
            break;
        case 4: /* the file moved out, a symlink to it in its place */
            snprintf(other, sizeof other, "%s/moved.active", dir);
            assert_int_equal(rename(path, other), 0);
            assert_int_equal(symlink(other, path), 0);
            acked_served = 0;
            break;
        case 5: { /* its last page cut off: the last record names it */
            struct stat st;
            assert_int_equal(stat(path, &st), 0);
            FILE *f = fopen(path, "r+b");
            assert_non_null(f);
            /* the unflushed put's pages are past the records: cut them and
             * into the last acknowledged page */
            assert_int_equal(ftruncate(fileno(f), st.st_size - 4096 * (SU_NB + 1)), 0);
            fclose(f);
            acked_served = -1; /* 22 in part at most, each block checked */
            break;
        }
        }
        s = su_reopen(dir, KVX_STORE_NOWAIT);
        assert_int_equal(su_prefix_nb(s, 1), SU_NB);
        for (uint64_t q = 20; q < 23; q++) {
            size_t n = su_prefix_nb(s, q); /* SIZE_MAX: a wrong block */
            if (acked_served == 1) assert_int_equal(n, SU_NB);
            else if (acked_served == 0) assert_int_equal(n, 0);
            else assert_true(n <= SU_NB);
        }
        assert_int_equal(su_prefix_nb(s, 23), 0);
        su_put_flush(s, 30, SU_NB);
        assert_int_equal(su_prefix_nb(s, 30), SU_NB);
        if (v == 4) assert_int_equal(access(other, F_OK), 0); /* never followed, never deleted */
        if (v <= 1) assert_int_equal(count_suffix(dir, "quarantine", ".active"), 1); /* set aside whole */
        if (v != 5) su_verify_clean(s);
        kvx_store_close(s);
        s = su_reopen(dir, KVX_STORE_READONLY);
        assert_int_equal(su_prefix_nb(s, 30), SU_NB);
        kvx_store_close(s);
    }
}

static void print_problem(void *ctx, const char *what, int code)
{
    (void)ctx;
    if (code) fprintf(stderr, "reader: verify: %s (%s)\n", what, kvx_err_name(code));
}

/* PROMISE: STORE-20 */
static void test_reader_process_during_appends_and_seals(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 256 << 20, .shard_bytes = 256 << 10});
    volatile uint64_t *ack = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(ack != MAP_FAILED);
    ack[0] = 0, ack[1] = 0;
    su_put_flush(s, 1, SU_NB);
    ack[0] = 1;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        kvx_store *r = NULL;
        if (kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY)) _exit(2);
        uint64_t looked = 0;
        for (uint64_t i = 0; !ack[1] || i < 50; i++) {
            uint64_t a = ack[0];
            uint64_t q = i % 3 == 0 ? a : 1 + (i * 7919) % a;
            size_t n = su_prefix_nb(r, q);
            if (n != SU_NB) {
                fprintf(stderr, "reader: prompt %llu of %llu acknowledged: %zu of %d blocks\n", (unsigned long long)q,
                        (unsigned long long)a, n, SU_NB);
                _exit(3);
            }
            if (i % 64 == 0) {
                uint64_t bad = 9;
                int vrc = kvx_store_verify(r, &bad, print_problem, NULL);
                if (vrc || bad) {
                    fprintf(stderr, "reader: verify %s, %llu bad: %s\n", kvx_err_name(vrc), (unsigned long long)bad,
                            kvx_last_error());
                    _exit(4);
                }
            }
            looked++;
        }
        kvx_store_close(r);
        _exit(looked > 50 ? 0 : 5);
    }
    for (uint64_t q = 2; q <= 400; q++) {
        su_put_flush(s, q, SU_NB);
        ack[0] = q;
    }
    ack[1] = 1;
    int ws = 0;
    assert_int_equal(waitpid(pid, &ws, 0), pid);
    assert_true(WIFEXITED(ws));
    assert_int_equal(WEXITSTATUS(ws), 0);
    assert_true(su_stat(s).shards > 2); /* sealed and begun again while it read */
    su_verify_clean(s);
    kvx_store_close(s);
    munmap((void *)ack, 4096);
}

/* PROMISE: STORE-23 */
static void test_eviction_reports_every_block_with_appends(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .shard_bytes = 128 << 10, .flags = KVX_STORE_NOSYNC});
    static kvx_evicted ev[4096];
    static uint64_t first[400];
    uint64_t reported = 0, dropped_all = 0;
    for (uint64_t q = 1; q <= 300; q++) {
        uint32_t t[SU_NB * SU_B];
        uint64_t h[SU_NB];
        su_tokens(t, q, SU_NB, 0);
        kvx_block_hashes(h, t, SU_NB * SU_B, SU_B);
        first[q] = h[0];
        su_put_flush(s, q, SU_NB);
        size_t n = 0;
        uint64_t dropped = 0;
        assert_int_equal(kvx_store_evicted(s, ev, 4096, &n, &dropped), 0);
        reported += n;
        dropped_all += dropped;
        for (size_t i = 0; i < n; i++)
            for (uint64_t k = 1; k <= q; k++)
                if (ev[i].hash == first[k]) assert_int_equal(su_prefix_nb(s, k), 0); /* gone means gone */
        /* every block put: live, or reported gone */
        assert_int_equal(su_stat(s).blocks + reported + dropped_all, q * SU_NB);
        assert_int_equal(su_prefix_nb(s, q), SU_NB);
    }
    assert_true(reported > 0);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* PROMISE: STORE-23 */
static void test_gc_and_compaction_with_an_active_shard(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 256 << 20, .shard_bytes = 128 << 10});
    kvx_store_batch *b;
    assert_int_equal(kvx_store_batch_create(&b, s), 0);
    for (uint64_t q = 1; q <= 240; q++) {
        /* every third prompt through a second batch: files of its own,
         * small ones for compaction to merge */
        if (q % 3 == 0) {
            assert_int_equal(su_put_batch(s, b, q, NULL), 0);
            assert_int_equal(kvx_store_batch_flush(b), 0);
        } else {
            su_put_nb(s, q);
            if (q % 7 == 0) assert_int_equal(kvx_store_gc(s), 0); /* while the built-in batch owns it */
            assert_int_equal(kvx_store_flush(s), 0);
        }
        if (q % 40 == 0) {
            assert_int_equal(kvx_store_gc(s), 0);
            for (uint64_t k = 1; k <= q; k++) assert_int_equal(su_prefix_nb(s, k), SU_NB);
        }
    }
    su_verify_clean(s);
    kvx_store_batch_destroy(b);
    kvx_store_close(s);
    s = su_reopen(dir, 0);
    for (uint64_t k = 1; k <= 240; k++) assert_int_equal(su_prefix_nb(s, k), SU_NB);
    assert_int_equal(su_stat(s).blocks, 240 * SU_NB);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* PROMISE: STORE-22 */
static void test_failed_put_into_the_active_shard(void **state)
{
    (void)state;
    int mode = FAULT_ERRNO;
    for (long k = 1; k < 100; k++) {
        char dir[300];
        kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20, .flags = KVX_STORE_NOWAIT});
        su_put_flush(s, 1, SU_NB);
        su_put_nb(s, 2); /* owns the active shard, unflushed */
        fault_install();
        if (mode == FAULT_SHORT) fault_only = FAULT_RW;
        fault_reset(k, EIO, mode);
        int prc = su_put_batch(s, NULL, 3, NULL);
        long hits = fault_hits;
        fault_uninstall();
        int frc = kvx_store_flush(s);
        /* never a wrong block; what the flush acknowledged is served */
        assert_int_equal(su_prefix_nb(s, 1), SU_NB);
        size_t n2 = su_prefix_nb(s, 2), n3 = su_prefix_nb(s, 3);
        assert_true(n2 <= SU_NB && n3 <= SU_NB);
        if (frc == 0) assert_int_equal(n2, SU_NB);
        if (frc == 0 && prc == 0) assert_int_equal(n3, SU_NB);
        su_put_flush(s, 4, SU_NB);
        su_verify_clean(s);
        kvx_store_close(s);
        s = su_reopen(dir, 0);
        assert_int_equal(su_prefix_nb(s, 1), SU_NB);
        assert_int_equal(su_prefix_nb(s, 4), SU_NB);
        if (frc == 0) assert_int_equal(su_prefix_nb(s, 2), SU_NB);
        assert_true(su_prefix_nb(s, 3) <= SU_NB);
        su_verify_clean(s);
        kvx_store_close(s);
        if (!hits && mode == FAULT_SHORT) break;
        if (!hits) mode = FAULT_SHORT, k = 0; /* again, each pwrite or pread short */
    }
}

/* PROMISE: STORE-23 */
static void test_failed_seal_then_reindex_keeps_every_block(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20, .shard_bytes = 128 << 10});
    /* every flush's ftruncate fails: a full active shard's seal among
     * them, so its file stays under its active name, the writer on a new
     * one */
    uint64_t q = 1;
    for (; q <= 40; q++) {
        su_put_nb(s, q);
        fault_install();
        fault_only = FAULT_TRUNC; /* the seal's: a full active shard is sealed after the flush */
        fault_sticky = 1;
        fault_reset(1, EIO, FAULT_ERRNO);
        int rc = kvx_store_flush(s);
        fault_uninstall();
        assert_int_equal(rc, 0);
    }
    assert_true(count_suffix(dir, "shards", ".active") >= 2); /* left by a failed seal, and the live one */
    for (uint64_t k = 1; k < q; k++) assert_int_equal(su_prefix_nb(s, k), SU_NB);
    /* a reindex in the same handle: every acknowledged block still served */
    assert_int_equal(kvx_store_reindex(s), 0);
    for (uint64_t k = 1; k < q; k++) assert_int_equal(su_prefix_nb(s, k), SU_NB);
    for (; q <= 80; q++) su_put_flush(s, q, SU_NB);
    su_verify_clean(s);
    kvx_store_close(s);
    s = su_reopen(dir, 0);
    for (uint64_t k = 1; k < q; k++) assert_int_equal(su_prefix_nb(s, k), SU_NB);
    assert_int_equal(su_n_files(dir, "quarantine"), 0);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* PROMISE: STORE-23 */
static void test_evicted_shard_left_active_by_a_failed_seal_goes(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.capacity = 1 << 20, .shard_bytes = 128 << 10, .flags = KVX_STORE_NOSYNC});
    /* every seal fails (its ftruncate): each full active file stays under
     * its active name; eviction then takes them, the oldest first */
    for (uint64_t q = 1; q <= 200; q++) {
        su_put_nb(s, q);
        fault_install();
        fault_only = FAULT_TRUNC;
        fault_sticky = 1;
        fault_reset(1, EIO, FAULT_ERRNO);
        int rc = kvx_store_flush(s);
        fault_uninstall();
        assert_int_equal(rc, 0);
    }
    kvx_store_stats st = su_stat(s);
    assert_true(st.evictions > 0);
    /* an evicted shard's file is gone whatever its name: only the live
     * shards' files are left */
    assert_true(count_suffix(dir, "shards", ".active") + count_suffix(dir, "shards", ".kvx") <= st.shards + 1);
    kvx_store_close(s);
    s = su_reopen(dir, KVX_STORE_NOSYNC);
    st = su_stat(s);
    assert_true(st.bytes <= st.capacity_bytes);
    su_verify_clean(s);
    kvx_store_close(s);
}

/* PROMISE: STORE-20 */
static void test_warmup_of_handles_opened_before_the_seal(void **state)
{
    (void)state;
    char dir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 64 << 20});
    for (uint64_t q = 1; q <= 5; q++) su_put_flush(s, q, SU_NB);
    su_put_nb(s, 6); /* pages past the last record, cut off by the seal */
    const char *paths[] = {dir};
    kvx_shard **sh = NULL;
    size_t n = 0;
    assert_int_equal(kvx_warmup_collect(&sh, &n, paths, 1), 0);
    assert_int_equal(n, 1);
    assert_int_equal(kvx_shard_get_info(sh[0])->num_blocks, 5 * SU_NB);
    kvx_store_close(s); /* sealed in place: header and tables written, the tail cut */
    assert_int_equal(count_suffix(dir, "shards", ".active"), 0);
    kvx_warmup_options o;
    kvx_warmup_options_init(&o);
    kvx_warmup_report rep;
    assert_int_equal(kvx_warmup_run(&rep, sh, n, &o), 0);
    assert_int_equal(rep.pages, 5 * SU_NB);
    assert_int_equal(rep.crc_failures, 0);
    assert_int_equal(rep.io_failures, 0);
    kvx_warmup_report_free(&rep);
    uint32_t bad = 9;
    assert_int_equal(kvx_shard_verify(sh[0], &bad, NULL, NULL), 0);
    assert_int_equal(bad, 0);
    for (size_t i = 0; i < n; i++) kvx_shard_close(sh[i]);
    kvx_free(sh);
}

int main(int argc, char **argv)
{
    unsetenv("KVX_NO_APPEND");
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flushes_append_to_one_file),
        cmocka_unit_test(test_append_catalog_commit_faults),
        cmocka_unit_test(test_tiny_pages_long_blocks_write_files),
        cmocka_unit_test(test_plan_names_the_active_file),
        cmocka_unit_test(test_full_active_shard_sealed_and_next_begun),
        cmocka_unit_test(test_kill9_then_recovery_seals),
        cmocka_unit_test(test_unreadable_active_file_quarantined),
        cmocka_unit_test(test_damaged_last_record_quarantined),
        cmocka_unit_test(test_blank_active_file_removed),
        cmocka_unit_test(test_failed_append_loses_nothing_acknowledged),
        cmocka_unit_test(test_second_batch_writes_its_own_file),
        cmocka_unit_test(test_eviction_and_reindex_with_an_active_shard),
        cmocka_unit_test(test_mixed_commit_fault_then_kill),
        cmocka_unit_test(test_mixed_commit_undo_fails_then_kill),
        cmocka_unit_test(test_flush_killed_at_each_call),
        cmocka_unit_test(test_batches_interleave_with_the_active_shard),
        cmocka_unit_test(test_strange_things_at_active_names),
        cmocka_unit_test(test_reader_process_during_appends_and_seals),
        cmocka_unit_test(test_eviction_reports_every_block_with_appends),
        cmocka_unit_test(test_gc_and_compaction_with_an_active_shard),
        cmocka_unit_test(test_failed_put_into_the_active_shard),
        cmocka_unit_test(test_failed_seal_then_reindex_keeps_every_block),
        cmocka_unit_test(test_evicted_shard_left_active_by_a_failed_seal_goes),
        cmocka_unit_test(test_warmup_of_handles_opened_before_the_seal),
    };
    return cmocka_run_group_tests_name("engine/active", tests, su_setup, su_teardown);
}
