/*
 * trace_fuzzer.c - libFuzzer harness for the Mooncake trace lines that
 * `kvx demo --trace` reads (cli/trace.c, compiled into the harness from
 * cli/, with json-c as the CLI uses it: strict, UTF-8 validated).
 *
 * The input is a trace file: it is split into lines as getline does
 * (each line with its '\n'), blank lines skipped as run_trace skips them,
 * and every line parsed. A refusal must name why; an accepted line holds
 * non-negative "input_length" and "hash_ids". Round trip: an accepted
 * request printed back as a trace line parses to the same request.
 *
 * Replayed over fuzz/corpus/trace/ as fuzz_replay_trace.
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/trace.h"

#define CHECK(c) do { if (!(c)) __builtin_trap(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static json_tokener *tok;

static void round_trip(const trace_req *r)
{
    size_t cap = 128 + r->n_ids * 22; /* the fixed text, two u64s, "]}\n" */
    char *line = malloc(cap), *p = line;
    CHECK(line);
    p += sprintf(p, "{\"timestamp\": 0, \"input_length\": %" PRIu64 ", \"hash_ids\": [", r->input_length);
    for (size_t i = 0; i < r->n_ids; i++) p += sprintf(p, i ? ", %" PRIu64 : "%" PRIu64, r->ids[i]);
    p += sprintf(p, "]}\n");
    trace_req b;
    const char *why = NULL;
    CHECK(cli_trace_parse_line(&b, tok, line, (size_t)(p - line), &why) == 0);
    CHECK(b.input_length == r->input_length && b.n_ids == r->n_ids);
    CHECK(r->n_ids == 0 || memcmp(b.ids, r->ids, r->n_ids * sizeof *r->ids) == 0);
    free(b.ids);
    free(line);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!tok) {
        tok = json_tokener_new();
        CHECK(tok);
        json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    }
    if (size > (1u << 20)) return 0;
    size_t off = 0;
    while (off < size) {
        const uint8_t *nl = memchr(data + off, '\n', size - off);
        size_t len = nl ? (size_t)(nl - (data + off)) + 1 : size - off;
        char *line = malloc(len + 1);
        CHECK(line);
        memcpy(line, data + off, len);
        line[len] = '\0';
        off += len;
        if (cli_trace_blank_line(line)) { /* as run_trace: up to a NUL */
            free(line);
            continue;
        }
        trace_req r;
        const char *why = NULL;
        int rc = cli_trace_parse_line(&r, tok, line, len, &why);
        CHECK(rc == 0 || rc == -1);
        if (rc) {
            CHECK(why && *why && r.ids == NULL);
        } else {
            CHECK(r.ids != NULL);
            round_trip(&r);
            free(r.ids);
        }
        free(line);
    }
    return 0;
}
