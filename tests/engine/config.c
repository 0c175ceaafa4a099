/*
 * config.c - the STORE file (engine/store_config.c; docs/FORMAT.md "STORE
 * file"): its format version and its kind are separate fields, a new
 * store writes version 3, and a version or kind this kvx does not know is
 * refused with KVX_EVERSION naming it.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lib/store.h"

static void rw_store(const char *dir, uint8_t *b, int write)
{
    char p[600];
    snprintf(p, sizeof p, "%s/STORE", dir);
    FILE *f = fopen(p, write ? "r+b" : "rb");
    assert_non_null(f);
    if (write) assert_int_equal(fwrite(b, 1, 64, f), 64);
    else assert_int_equal(fread(b, 1, 64, f), 64);
    fclose(f);
}

static unsigned u16(const uint8_t *p) { return (unsigned)p[0] | (unsigned)p[1] << 8; }

/* A block store's STORE: version 4, kind 0; a keyed one's: version 4,
 * kind 1, its page size at 56. Another version, or kind, with a valid
 * checksum: KVX_EVERSION naming it. A version 3 store (before active
 * shards) opens; a reader leaves it 3, a writer's open makes it 4. */
/* PROMISE: STORE-19 */
static void test_store_file_version_and_kind(void **state)
{
    (void)state;
    char dir[300], kdir[300];
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20});
    kvx_store_close(s);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.page_bytes = 4096;
    o.capacity_bytes = 16 << 20;
    su_new_dir(kdir, sizeof kdir);
    assert_int_equal(kvx_store_create(&s, kdir, &o), 0);
    kvx_store_close(s);
    uint8_t b[64], k[64];
    rw_store(dir, b, 0);
    rw_store(kdir, k, 0);
    assert_int_equal(u16(b + 8), 4);
    assert_int_equal(u16(b + 10), 0);
    assert_int_equal(u16(k + 8), 4);
    assert_int_equal(u16(k + 10), 1);
    assert_int_equal(u16(k + 56), 4096);
    const struct {
        int off;
        uint8_t v;
        const char *says;
    } bad[2] = {{8, 6, "version 6"}, {10, 2, "kind 2"}};
    for (int i = 0; i < 2; i++) {
        uint8_t x[64];
        memcpy(x, b, 64);
        x[bad[i].off] = bad[i].v;
        uint32_t crc = kvx_crc32c(0, x, 60);
        memcpy(x + 60, &crc, 4);
        rw_store(dir, x, 1);
        assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), KVX_EVERSION);
        assert_non_null(strstr(kvx_last_error(), bad[i].says));
    }
    rw_store(dir, b, 1);
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_store_close(s);
    uint8_t v3[64];
    memcpy(v3, b, 64);
    v3[8] = 3;
    uint32_t crc = kvx_crc32c(0, v3, 60);
    memcpy(v3 + 60, &crc, 4);
    rw_store(dir, v3, 1);
    assert_int_equal(kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY), 0);
    kvx_store_close(s);
    uint8_t now[64];
    rw_store(dir, now, 0);
    assert_int_equal(u16(now + 8), 3); /* a reader never repairs */
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    kvx_store_close(s);
    rw_store(dir, now, 0);
    assert_int_equal(u16(now + 8), 4);
    assert_memory_equal(now, b, 64);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_file_version_and_kind),
    };
    return cmocka_run_group_tests_name("engine/config", tests, su_setup, su_teardown);
}
