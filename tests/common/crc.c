/*
 * crc.c - common/crc.c: kvx_crc32c and kvx_crc32 against the standard
 * check values, the spec's envelope CRC, and a slow bitwise reference on
 * random buffers of every small length and alignment (ISA-L switches code
 * paths by length and alignment, so those are where a convention slip
 * would show).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvx.h"

/* Reflected CRC-32, one bit at a time: init and final XOR 0xFFFFFFFF. */
static uint32_t ref_crc(uint32_t poly, uint32_t crc, const uint8_t *p, size_t len)
{
    crc = ~crc;
    for (size_t i = 0; i < len; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = (crc >> 1) ^ (poly & (0u - (crc & 1u)));
    }
    return ~crc;
}

#define POLY_C 0x82F63B78u

#define POLY_IEEE 0xEDB88320u

/* PROMISE: FORMAT-2 */
static void test_check_values(void **state)
{
    (void)state;
    assert_int_equal(kvx_crc32c(0, "123456789", 9), 0xE3069283u);
    assert_int_equal(kvx_crc32(0, "123456789", 9), 0xCBF43926u);
    assert_int_equal(ref_crc(POLY_C, 0, (const uint8_t *)"123456789", 9), 0xE3069283u);
    assert_int_equal(ref_crc(POLY_IEEE, 0, (const uint8_t *)"123456789", 9), 0xCBF43926u);
    /* Empty input leaves the running value unchanged. */
    assert_int_equal(kvx_crc32c(0, "", 0), 0);
    assert_int_equal(kvx_crc32(0, "", 0), 0);
    assert_int_equal(kvx_crc32c(0x12345678u, "", 0), 0x12345678u);
    assert_int_equal(kvx_crc32(0x12345678u, "", 0), 0x12345678u);
}

/* PROMISE: FORMAT-2 */
static void test_spec_envelope_crc(void **state)
{
    (void)state;
    /* The first 56 bytes of the spec's v1 worked example. */
    static const uint8_t env[56] = {
        0x54, 0x4c, 0x4b, 0x56, 0x01, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00,
        0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00,
        0x66, 0x93, 0x7b, 0x02, 0xc1, 0xb0, 0x1a, 0xa9, 0x02, 0x00, 0x00, 0x00, 0x00, 0x3c,
        0x00, 0x40, 0x00, 0x42, 0x00, 0x44, 0x00, 0x38, 0x00, 0xbc, 0x00, 0x00, 0x00, 0x34};
    assert_int_equal(kvx_crc32c(0, env, sizeof env), 0x4F0B541Cu);
}

/* PROMISE: FORMAT-2 */
static void test_random_vs_reference(void **state)
{
    (void)state;
    enum { MAX = 4096 + 64 };
    uint8_t *buf = malloc(MAX + 64);
    assert_non_null(buf);
    srand(777);
    for (size_t i = 0; i < MAX + 64; i++) buf[i] = (uint8_t)rand();
    /* Every length 0..300 at every alignment 0..15, then larger sizes. */
    for (size_t len = 0; len <= 300; len++)
        for (size_t off = 0; off < 16; off++) {
            assert_int_equal(kvx_crc32c(0, buf + off, len), ref_crc(POLY_C, 0, buf + off, len));
            assert_int_equal(kvx_crc32(0, buf + off, len), ref_crc(POLY_IEEE, 0, buf + off, len));
        }
    const size_t big[] = {511, 512, 513, 1024, 1500, 4095, 4096, 4097, MAX};
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
        size_t off = i % 7;
        assert_int_equal(kvx_crc32c(0, buf + off, big[i]), ref_crc(POLY_C, 0, buf + off, big[i]));
        assert_int_equal(kvx_crc32(0, buf + off, big[i]),
                         ref_crc(POLY_IEEE, 0, buf + off, big[i]));
    }
    free(buf);
}

/* PROMISE: FORMAT-2 */
static void test_incremental(void **state)
{
    (void)state;
    enum { N = 5000 };
    uint8_t *buf = malloc(N);
    assert_non_null(buf);
    srand(4242);
    for (size_t i = 0; i < N; i++) buf[i] = (uint8_t)rand();
    uint32_t whole_c = kvx_crc32c(0, buf, N), whole = kvx_crc32(0, buf, N);
    assert_int_equal(whole_c, ref_crc(POLY_C, 0, buf, N));
    assert_int_equal(whole, ref_crc(POLY_IEEE, 0, buf, N));
    const size_t cuts[] = {0, 1, 3, 8, 63, 64, 65, 255, 1000, 4096, N - 1, N};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        size_t a = cuts[i];
        assert_int_equal(kvx_crc32c(kvx_crc32c(0, buf, a), buf + a, N - a), whole_c);
        assert_int_equal(kvx_crc32(kvx_crc32(0, buf, a), buf + a, N - a), whole);
    }
    /* Many small steps compose too. */
    uint32_t c = 0, z = 0;
    for (size_t a = 0; a < N; a += 37) {
        size_t n = N - a < 37 ? N - a : 37;
        c = kvx_crc32c(c, buf + a, n);
        z = kvx_crc32(z, buf + a, n);
    }
    assert_int_equal(c, whole_c);
    assert_int_equal(z, whole);
    free(buf);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check_values),
        cmocka_unit_test(test_spec_envelope_crc),
        cmocka_unit_test(test_random_vs_reference),
        cmocka_unit_test(test_incremental),
    };
    return cmocka_run_group_tests_name("common/crc", tests, NULL, NULL);
}
