/*
 * tokens_fuzzer.c - libFuzzer harness for the token text the CLI reads
 * (`kvx hash`, `store put --tokens`, `store prefix`: cli/io.c
 * cli_read_tokens_fd and cli/util.c cli_parse_tokens, compiled into the
 * harness from cli/).
 *
 * The input is read through cli_read_tokens_fd from a memfd, as from a
 * file: it must return CLI_OK or the caller's refusal code and, when it
 * accepts, give ids every one of which the text named. Round trip: the
 * ids printed back as decimal (and as hex, comma-separated) parse to the
 * same ids. cli_parse_tokens is also run on the text directly.
 *
 * Replayed over fuzz/corpus/tokens/ as fuzz_replay_tokens.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cli/cli.h"

#define CHECK(c) do { if (!(c)) __builtin_trap(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const cli_cmd cmd = {"hash", "", "Usage: kvx hash\n", NULL};
static int fd = -1;

static void same_ids(const uint32_t *ids, size_t n, int hex)
{
    char *text = malloc(n * 12 + 1), *p = text;
    CHECK(text);
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, hex ? "0x%" PRIx32 "," : "%" PRIu32 "\n", ids[i]);
    *p = '\0';
    uint32_t *back = NULL;
    size_t m = 0;
    const char *bad = NULL;
    CHECK(cli_parse_tokens(&back, &m, text, &bad) == 0);
    CHECK(m == n && (n == 0 || memcmp(back, ids, n * sizeof *ids) == 0));
    free(back);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 20)) return 0;
    if (fd < 0) {
        fd = memfd_create("kvx_tokens_fuzz", 0);
        CHECK(fd >= 0);
        /* the CLI's messages for refused text go to stdio's stderr: keep
         * them out of the fuzzer's log (sanitizer reports write fd 2) */
        FILE *null = fopen("/dev/null", "w");
        if (null && !getenv("KVX_FUZZ_VERBOSE")) stderr = null;
    }
    CHECK(ftruncate(fd, 0) == 0 && lseek(fd, 0, SEEK_SET) == 0);
    if (size) CHECK(write(fd, data, size) == (ssize_t)size);
    CHECK(lseek(fd, 0, SEEK_SET) == 0);
    uint32_t *ids = (uint32_t *)1;
    size_t n = 7;
    int rc = cli_read_tokens_fd(&cmd, "fuzz", fd, CLI_USAGE, &ids, &n);
    CHECK(rc == CLI_OK || rc == CLI_USAGE || rc == CLI_FAIL);
    if (rc == CLI_OK) {
        /* at most one id per two bytes of text ("1 2 3") */
        CHECK(n <= size / 2 + 1 && (ids || n == 0));
        same_ids(ids, n, 0);
        same_ids(ids, n, 1);
    } else {
        CHECK(ids == NULL && n == 0);
    }
    free(ids);

    /* the parser alone, on the text up to its first NUL */
    char *text = malloc(size + 1);
    CHECK(text);
    memcpy(text, data, size);
    text[size] = '\0';
    uint32_t *v = NULL;
    size_t m = 0;
    const char *bad = NULL;
    int r2 = cli_parse_tokens(&v, &m, text, &bad);
    if (r2 == 0) {
        same_ids(v, m, 0);
        free(v);
    } else {
        CHECK(bad >= text && bad < text + size);
    }
    /* what the reader accepted, the parser accepts alike */
    if (rc == CLI_OK) CHECK(r2 == 0);
    free(text);
    return 0;
}
