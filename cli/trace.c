/*
 * trace.c - the Mooncake trace line parser of `kvx demo --trace` (trace.h).
 * Shared by the CLI and fuzz/trace_fuzzer.c.
 */
#include "trace.h"

#include <stdlib.h>
#include <string.h>

/* Parses one Mooncake line (len bytes, NUL-terminated): a JSON object with
 * "input_length" (a non-negative integer) and "hash_ids" (an array of
 * non-negative integers); other members ("timestamp", "output_length")
 * are not needed. json-c does the parsing, strictly: trailing text after
 * the object is refused. Returns 0, or -1 with *why naming the problem. */
int cli_trace_parse_line(trace_req *r, json_tokener *tok, const char *line, size_t len,
                         const char **why)
{
    memset(r, 0, sizeof *r);
    if (len >= INT32_MAX) {
        *why = "the line is too long";
        return -1;
    }
    if (strlen(line) != len) { /* json-c would stop at the NUL */
        *why = "a NUL byte in the line";
        return -1;
    }
    json_tokener_reset(tok);
    json_object *o = json_tokener_parse_ex(tok, line, (int)len + 1); /* + the NUL: end of input */
    if (!o || json_tokener_get_error(tok) != json_tokener_success) {
        *why = "not JSON";
        json_object_put(o);
        return -1;
    }
    json_object *in, *ids;
    int ret = -1;
    if (!json_object_is_type(o, json_type_object)) {
        *why = "not a JSON object";
    } else if (!json_object_object_get_ex(o, "input_length", &in)) {
        *why = "\"input_length\" is missing";
    } else if (!json_object_is_type(in, json_type_int) || json_object_get_int64(in) < 0) {
        *why = "\"input_length\" is not a non-negative integer";
    } else if (!json_object_object_get_ex(o, "hash_ids", &ids)) {
        *why = "\"hash_ids\" is missing";
    } else if (!json_object_is_type(ids, json_type_array)) {
        *why = "\"hash_ids\" is not an array";
    } else {
        r->input_length = json_object_get_uint64(in);
        r->n_ids = json_object_array_length(ids);
        r->ids = malloc((r->n_ids ? r->n_ids : 1) * sizeof *r->ids);
        ret = r->ids ? 0 : -1;
        if (!r->ids) *why = "out of memory";
        for (size_t k = 0; k < r->n_ids && !ret; k++) {
            json_object *v = json_object_array_get_idx(ids, k);
            if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0) {
                *why = "a \"hash_ids\" entry is not a non-negative integer";
                ret = -1;
            } else {
                r->ids[k] = json_object_get_uint64(v);
            }
        }
        if (ret) {
            free(r->ids);
            r->ids = NULL;
        }
    }
    json_object_put(o);
    return ret;
}

/* 1 when the line holds nothing but JSON whitespace (skipped, like an
 * empty line). */
int cli_trace_blank_line(const char *line)
{
    while (*line == ' ' || *line == '\t' || *line == '\n' || *line == '\r') line++;
    return *line == '\0';
}
