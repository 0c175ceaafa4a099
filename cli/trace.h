/*
 * trace.h - the Mooncake trace line parser of `kvx demo --trace` (one JSON
 * object a line), in its own file so the fuzz harness
 * fuzz/trace_fuzzer.c compiles the same code as the CLI.
 */
#ifndef KVX_CLI_TRACE_H
#define KVX_CLI_TRACE_H

#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>

typedef struct trace_req {
    uint64_t *ids;
    size_t n_ids;
    uint64_t input_length;
} trace_req;

/* Parses one Mooncake line (len bytes, NUL-terminated): a JSON object with
 * "input_length" (a non-negative integer) and "hash_ids" (an array of
 * non-negative integers); other members are not needed. tok was made with
 * JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8. Returns 0 (r->ids
 * malloc'd, the caller frees it), or -1 with *why naming the problem. */
int cli_trace_parse_line(trace_req *r, json_tokener *tok, const char *line, size_t len,
                         const char **why);
/* 1 when the line holds nothing but JSON whitespace (skipped, like an
 * empty line). */
int cli_trace_blank_line(const char *line);

#endif
