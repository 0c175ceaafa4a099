/*
 * tier_conf_fuzzer.c - libFuzzer harness for the DIR/TIER file parser
 * (tier/url.c: kvx_tier_conf_parse) and the redis:// URL parser it calls
 * (kvx_tier_url_parse): text a store's open reads from its directory
 * (engine/store_tier.c st_tier_read_file), input like any other
 * (DESIGN.md rule 5).
 *
 * The input is copied into a buffer of size + 1 and NUL-terminated, as
 * st_tier_read_file does (both parsers read C strings; an embedded NUL
 * ends the text, which the open refuses before parsing). Then:
 *   - kvx_tier_conf_parse returns 0 or KVX_EFORMAT with a message, never
 *     reads outside the text (ASan watches). A file it accepts has a
 *     NUL-terminated url the URL parser accepts, a tenant that is empty
 *     or passes kvx_tier_tenant_check; round trip: kvx_tier_conf_format
 *     writes it (it always fits the 2048 bytes the store's reader and
 *     writer use), that text parses to the same url, tenant and ttl_ms,
 *     and formats to the same text, byte for byte;
 *   - the whole input as a URL: kvx_tier_url_parse returns 0 or
 *     KVX_EINVALID; an accepted URL has 1..KVX_TIER_MAX_SEEDS hosts, each
 *     non-empty and NUL-terminated in its field, ports 1..65535, user and
 *     password NUL-terminated in theirs;
 *   - kvx_tier_url_redact of the input into a small and a large buffer
 *     stays inside and NUL-terminates; kvx_tier_tenant_check returns 0 or
 *     KVX_EINVALID.
 *
 * Replayed over fuzz/corpus/tier_conf/ as the ctest
 * fuzz_replay_tier_conf; built as a real fuzzer with
 * -DKVX_BUILD_FUZZERS=ON and clang.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvx.h"
#include "tier/tier.h"

#define CHECK(c) do { if (!(c)) __builtin_trap(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* the store reads and writes TIER through a 2048-byte buffer */
#define TIER_TEXT_MAX 2048

static void check_conf(const char *text)
{
    kvx_tier_conf c, back;
    memset(&c, 0xa5, sizeof c);
    int rc = kvx_tier_conf_parse(&c, text);
    CHECK(rc == 0 || rc == KVX_EFORMAT);
    CHECK(kvx_last_error() != NULL);
    if (rc) return;
    CHECK(memchr(c.url, '\0', sizeof c.url) != NULL);
    CHECK(memchr(c.tenant, '\0', sizeof c.tenant) != NULL);
    kvx_tier_url u;
    CHECK(kvx_tier_url_parse(&u, c.url) == 0);
    CHECK(c.tenant[0] == '\0' || kvx_tier_tenant_check(c.tenant) == 0);
    /* round trip: format, parse again, same fields and same text */
    char t1[TIER_TEXT_MAX], t2[TIER_TEXT_MAX];
    size_t n1 = kvx_tier_conf_format(t1, sizeof t1, &c);
    CHECK(n1 > 0 && n1 < sizeof t1 && strlen(t1) == n1);
    memset(&back, 0x5a, sizeof back);
    CHECK(kvx_tier_conf_parse(&back, t1) == 0);
    CHECK(strcmp(back.url, c.url) == 0);
    CHECK(strcmp(back.tenant, c.tenant) == 0);
    CHECK(back.ttl_ms == c.ttl_ms);
    size_t n2 = kvx_tier_conf_format(t2, sizeof t2, &back);
    CHECK(n2 == n1 && memcmp(t1, t2, n1) == 0);
    /* a buffer one byte short of the text does not fit: 0, no overflow */
    char *small = malloc(n1);
    CHECK(small);
    CHECK(kvx_tier_conf_format(small, n1, &c) == 0);
    free(small);
}

static void check_url(const char *text)
{
    kvx_tier_url u;
    memset(&u, 0xa5, sizeof u);
    int rc = kvx_tier_url_parse(&u, text);
    CHECK(rc == 0 || rc == KVX_EINVALID);
    CHECK(kvx_last_error() != NULL);
    if (rc == 0) {
        CHECK(u.n >= 1 && u.n <= KVX_TIER_MAX_SEEDS);
        CHECK(strncmp(text, "redis://", 8) == 0);
        for (int i = 0; i < u.n; i++) {
            CHECK(memchr(u.host[i], '\0', sizeof u.host[i]) != NULL);
            CHECK(u.host[i][0] != '\0');
            CHECK(u.port[i] >= 1 && u.port[i] <= 65535);
        }
        CHECK(memchr(u.user, '\0', sizeof u.user) != NULL);
        CHECK(memchr(u.pass, '\0', sizeof u.pass) != NULL);
    }
    char red_small[16], red_big[TIER_TEXT_MAX];
    kvx_tier_url_redact(red_small, sizeof red_small, text);
    CHECK(memchr(red_small, '\0', sizeof red_small) != NULL);
    kvx_tier_url_redact(red_big, sizeof red_big, text);
    CHECK(memchr(red_big, '\0', sizeof red_big) != NULL);
    rc = kvx_tier_tenant_check(text);
    CHECK(rc == 0 || rc == KVX_EINVALID);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    if (size) memcpy(text, data, size);
    text[size] = '\0';
    check_conf(text);
    check_url(text);
    free(text);
    return 0;
}
