/*
 * digest.c - common/digest.c: the prefix digest, a SHA-256 chain, against
 * vectors computed with Python's hashlib (independent of OpenSSL and of
 * kvx).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "lib/store.h"

/* test_digest_golden: the SHA-256 chain against vectors computed with
 * Python's hashlib (independent of OpenSSL and of kvx). */
/* PROMISE: TRUST-2 */
static void test_digest_golden(void **state)
{
    (void)state;
    /* python3: d0 = sha256(struct.pack('<2I', 1, 2)); d1 = sha256(d0 + struct.pack('<2I', 3, 4)) */
    static const char *want0 = "34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f";
    static const char *want1 = "c57b445f90651b9a650e516ab2238c965b21af35608a31c303e6d9e407f2915c";
    uint32_t t[5] = {1, 2, 3, 4, 5};
    uint8_t d[2][KVX_DIGEST_BYTES];
    assert_int_equal(kvx_prefix_digests(d, t, 5, 2), 2); /* the partial tail has none */
    char hex[65];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", d[k][i]);
        assert_string_equal(hex, k ? want1 : want0);
    }
    uint8_t one[KVX_DIGEST_BYTES];
    kvx_prefix_digest_next(one, d[0], t + 2, 2);
    assert_memory_equal(one, d[1], KVX_DIGEST_BYTES);
    assert_int_equal(kvx_prefix_digests(d, t, 5, 0), 0);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_digest_golden),
    };
    return cmocka_run_group_tests_name("common/digest", tests, su_setup, su_teardown);
}
