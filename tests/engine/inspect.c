/*
 * inspect.c - engine/store_inspect.c: verify judges a shard by its own
 * bytes and the store's model, not by its name: a shard of another model
 * copied over a registered file is a problem.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "lib/store.h"

#define NB 3

static void copy_file(const char *from, const char *to)
{
    char cmd[2000];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", from, to);
    assert_int_equal(system(cmd), 0);
}

/* A store of another model wrote the same prompt into a file of the same
 * name (both stores number their shards from the same generation): copied
 * over the registered file, every entry's coordinate and hash still match
 * the catalog and every page its CRC, but the file belongs to another
 * model, so no lookup serves it (store_cache.c checks geometry and model).
 * verify must say so instead of passing the store. */
static void test_verify_foreign_model_shard(void **state)
{
    (void)state;
    char a[300], b[300];
    su_new_dir(a, sizeof a);
    su_new_dir(b, sizeof b);
    kvx_store *sa = su_create(a, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10});
    kvx_store *sb =
        su_create(b, (su_spec){.capacity = 16 << 20, .shard_bytes = 256 << 10, .signature = 0x5555AAAA5555AAAAull});
    assert_int_equal(su_put_seq(sa, 7, NB), 0);
    assert_int_equal(su_put_seq(sb, 7, NB), 0);
    kvx_store_close(sa);
    kvx_store_close(sb);
    char na[4][64], nb[4][64];
    assert_int_equal(su_list_names(a, "shards", na, 4), 1);
    assert_int_equal(su_list_names(b, "shards", nb, 4), 1);
    assert_string_equal(na[0], nb[0]);
    char pa[700], pb[700];
    snprintf(pa, sizeof pa, "%s/shards/%s", a, na[0]);
    snprintf(pb, sizeof pb, "%s/shards/%s", b, nb[0]);
    struct stat sta, stb;
    assert_int_equal(stat(pa, &sta), 0);
    assert_int_equal(stat(pb, &stb), 0);
    assert_int_equal(sta.st_size, stb.st_size);
    copy_file(pb, pa);

    assert_int_equal(kvx_store_open(&sa, a, NULL, KVX_STORE_READONLY), 0);
    /* lookups refuse the foreign file */
    assert_int_equal(su_served_prefix(sa, 7, NB), 0);
    uint64_t bad = 0;
    int rc = kvx_store_verify(sa, &bad, NULL, NULL);
    kvx_store_close(sa);
    if (rc == 0 || bad == 0)
        fail_msg("verify passed a store whose only shard belongs to another model (rc %d, %llu problems) while "
                 "every lookup misses",
                 rc, (unsigned long long)bad);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_verify_foreign_model_shard),
    };
    return cmocka_run_group_tests_name("engine/inspect", tests, su_setup, su_teardown);
}
