/*
 * cli_envelope_fuzzer.c - libFuzzer harness for the CLI's envelope reader
 * (cli/io.c cli_read_envelope_fd, compiled into the harness): `kvx
 * convert` and `kvx store put` read TLKV envelopes from files and pipes
 * with it, the 32-byte header first (magic, version, dtype, dimensions,
 * the declared length against the input cap), then exactly the declared
 * bytes, grown as they arrive.
 *
 * The input is read from a memfd as a regular file (its size known) and
 * as a stream: the reader returns CLI_OK with the input (from a stream,
 * its first `total` bytes) or CLI_FAIL with nothing; and every envelope
 * the library parses (kvx_envelope_parse), the CLI reads whole. Kept out
 * of envelope_fuzzer.c, whose executions are ~40x cheaper without the
 * file calls.
 *
 * Replayed over fuzz/corpus/cli_envelope/ as fuzz_replay_cli_envelope.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cli/cli.h"
#include "kvx.h"

#define CHECK(c) do { if (!(c)) __builtin_trap(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const cli_cmd cmd = {"convert", "", "Usage: kvx convert\n", NULL};
static int memfd = -1;

static void check_cli(const uint8_t *data, size_t size, int regular, int parsed)
{
    CHECK(ftruncate(memfd, 0) == 0 && lseek(memfd, 0, SEEK_SET) == 0);
    if (size) CHECK(write(memfd, data, size) == (ssize_t)size);
    CHECK(lseek(memfd, 0, SEEK_SET) == 0);
    void *out = NULL;
    size_t len = 0;
    int rc = cli_read_envelope_fd(&cmd, "fuzz", memfd, regular, size, NULL, 0, &out, &len);
    CHECK(rc == CLI_OK || rc == CLI_FAIL);
    if (rc == CLI_OK) {
        CHECK(len >= 32 && len <= size && (len == size || !regular));
        CHECK(memcmp(out, data, len) == 0);
    } else {
        CHECK(out == NULL && len == 0);
    }
    if (parsed) CHECK(rc == CLI_OK && len == size);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (memfd < 0) {
        memfd = memfd_create("kvx_cli_envelope_fuzz", 0);
        CHECK(memfd >= 0);
        FILE *null = fopen("/dev/null", "w"); /* the CLI's messages */
        if (null && !getenv("KVX_FUZZ_VERBOSE")) stderr = null;
    }
    if (size > (1u << 22)) return 0;
    kvx_envelope e;
    int parsed = kvx_envelope_parse(&e, data, size, NULL) == 0;
    check_cli(data, size, 1, parsed);
    check_cli(data, size, 0, parsed);
    return 0;
}
