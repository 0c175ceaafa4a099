/*
 * lookup_damage.c - engine/store_lookup.c: a lookup by hash, by tokens or
 * by coordinate whose block the index places in a shard file that cannot
 * be used answers the damage (the file and why), never KVX_ENOTFOUND; a
 * prefix lookup still treats it as a miss (0, the prefix ends there); and
 * a reader never repairs (the file stays where it is, the index unchanged).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvx.h"
#include "lib/store.h"

/* The path and the name of a store's only shard file. */
static const char *only_shard(char *out, size_t cap, const char *dir)
{
    char sd[600];
    snprintf(sd, sizeof sd, "%s/shards", dir);
    DIR *d = opendir(sd);
    assert_non_null(d);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(out, cap, "%s/%s", sd, de->d_name);
        n++;
    }
    closedir(d);
    assert_int_equal(n, 1);
    return strrchr(out, '/') + 1;
}

/* A store holding sequence 1's first 3 blocks (its tokens in t, hashes
 * in h), closed; its shard file's path in shard. */
static void make(char *dir, size_t cap, char *shard, size_t scap, uint32_t *t, uint64_t *h)
{
    kvx_store *s = su_store(dir, cap, (su_spec){0});
    su_put_flush(s, 1, 3);
    kvx_store_close(s);
    su_tokens(t, 1, 3, 0);
    kvx_block_hashes(h, t, 3 * SU_B, SU_B);
    only_shard(shard, scap, dir);
}

/* Every lookup of block 0 that names it answers code, the message naming
 * the shard file; the prefix is a miss (0 blocks, return 0). */
static void expect_unusable(const char *dir, const char *name, const uint32_t *t, const uint64_t *h, int code,
                            const char *why)
{
    kvx_store *s = su_reopen(dir, KVX_STORE_READONLY);
    kvx_view v;
    int rc = kvx_store_get_hash(&v, s, h[0]);
    assert_int_equal(rc, code);
    assert_non_null(strstr(kvx_last_error(), name));
    assert_non_null(strstr(kvx_last_error(), why));
    assert_null(v.shard);
    kvx_view vs[2];
    int st[2] = {7, 7};
    assert_int_equal(kvx_store_get_hashes(vs, st, s, h, 2), 0);
    assert_int_equal(st[0], code);
    assert_int_equal(st[1], code);
    rc = kvx_store_get_block(&v, s, t, SU_B);
    assert_int_equal(rc, code);
    assert_non_null(strstr(kvx_last_error(), name));
    rc = kvx_store_get(&v, s, KVX_COORD(0, 0, 0));
    assert_int_equal(rc, code);
    assert_non_null(strstr(kvx_last_error(), name));
    /* the hot path: a miss, never a failed lookup */
    kvx_view pv[3];
    size_t n = 99;
    assert_int_equal(kvx_store_prefix(pv, &n, s, t, 3 * SU_B, 3), 0);
    assert_int_equal(n, 0);
    /* a block that is not there at all is still not found */
    assert_int_equal(kvx_store_get_hash(&v, s, 0x1234), KVX_ENOTFOUND);
    kvx_store_close(s);
}

static void test_cut_shard_is_damage_not_a_miss(void **state)
{
    (void)state;
    char dir[512], shard[1024], q[1024];
    uint32_t t[3 * SU_B];
    uint64_t h[3];
    make(dir, sizeof dir, shard, sizeof shard, t, h);
    const char *name = strrchr(shard, '/') + 1;
    assert_int_equal(truncate(shard, 100), 0);
    expect_unusable(dir, name, t, h, KVX_ECORRUPT, "past the end of the file");
    /* the reader moved nothing */
    struct stat sb;
    assert_int_equal(stat(shard, &sb), 0);
    assert_int_equal(sb.st_size, 100);
    snprintf(q, sizeof q, "%s/quarantine/%s", dir, name);
    assert_true(stat(q, &sb) != 0);
}

static void test_meta_crc_shard_is_damage(void **state)
{
    (void)state;
    char dir[512], shard[1024];
    uint32_t t[3 * SU_B];
    uint64_t h[3];
    make(dir, sizeof dir, shard, sizeof shard, t, h);
    FILE *f = fopen(shard, "r+b");
    assert_non_null(f);
    fseek(f, 70, SEEK_SET);
    int c = fgetc(f);
    fseek(f, 70, SEEK_SET);
    fputc(c ^ 1, f);
    fclose(f);
    expect_unusable(dir, strrchr(shard, '/') + 1, t, h, KVX_ECORRUPT, "KVX_EMETACRC");
}

static void test_gone_and_not_regular(void **state)
{
    (void)state;
    char dir[512], shard[1024];
    uint32_t t[3 * SU_B];
    uint64_t h[3];
    make(dir, sizeof dir, shard, sizeof shard, t, h);
    assert_int_equal(unlink(shard), 0);
    expect_unusable(dir, strrchr(shard, '/') + 1, t, h, -ENOENT, "gone");
    assert_int_equal(mkdir(shard, 0700), 0);
    expect_unusable(dir, strrchr(shard, '/') + 1, t, h, KVX_EPATH, "directory");
}

/* A damaged copy beside a good one: the good one is served (TRUST-11). */
static void test_good_copy_still_served(void **state)
{
    (void)state;
    char dir[512], shard[1024];
    uint32_t t[3 * SU_B];
    uint64_t h[3];
    make(dir, sizeof dir, shard, sizeof shard, t, h);
    kvx_store *s = su_reopen(dir, 0);
    su_put_flush(s, 2, 3); /* another shard, other blocks */
    kvx_store_close(s);
    assert_int_equal(truncate(shard, 100), 0);
    s = su_reopen(dir, KVX_STORE_READONLY);
    uint32_t t2[3 * SU_B];
    uint64_t h2[3];
    su_tokens(t2, 2, 3, 0);
    kvx_block_hashes(h2, t2, 3 * SU_B, SU_B);
    kvx_view v;
    assert_int_equal(kvx_store_get_hash(&v, s, h2[1]), 0);
    kvx_view_release(&v);
    assert_int_equal(kvx_store_get_hash(&v, s, h[1]), KVX_ECORRUPT);
    kvx_store_close(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cut_shard_is_damage_not_a_miss),
        cmocka_unit_test(test_meta_crc_shard_is_damage),
        cmocka_unit_test(test_gone_and_not_regular),
        cmocka_unit_test(test_good_copy_still_served),
    };
    return cmocka_run_group_tests(tests, su_setup, su_teardown);
}
