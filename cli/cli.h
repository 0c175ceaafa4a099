/*
 * cli.h - shared pieces of the `kvx` command: the subcommand table, exit
 * codes, error reporting, human units, the progress bar and a tiny JSON
 * emitter.
 *
 * The command is built only on the public API in include/kvx.h, like any
 * other program using kvx. Each command group lives in its own file
 * (cmd_shard.c, cmd_store.c, cmd_warmup.c, cmd_demo.c) and exports one
 * struct cli_cmd per subcommand; main.c holds the table. The help text of
 * each command is data (cli_cmd.help), so `kvx --help`, `kvx SUB --help`
 * and docs/kvx.md (scripts/gen-cli-doc.sh) all come from the same words.
 */
#ifndef KVX_CLI_H
#define KVX_CLI_H

#include "kvx.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>

/* Exit codes, as every kvx subcommand uses them. */
#define CLI_OK 0    /* success */
#define CLI_FAIL 1  /* failure or bad data */
#define CLI_USAGE 2 /* bad command line */

typedef struct cli_cmd {
    const char *name;    /* "hash", "store create", ... */
    const char *summary; /* one line for `kvx --help` */
    const char *help;    /* full text for `kvx SUB --help` (starts with Usage:) */
    int (*run)(const struct cli_cmd *self, int argc, char **argv); /* argv[0] = name */
} cli_cmd;

/* The subcommands, defined in the cmd_*.c files. */
extern const cli_cmd cli_cmd_hash, cli_cmd_inspect, cli_cmd_verify, cli_cmd_convert;
extern const cli_cmd cli_cmd_store;
extern const cli_cmd cli_cmd_warmup;
extern const cli_cmd cli_cmd_demo;

/* Prints help to stdout. */
void cli_print_help(const cli_cmd *c);

/* Usage error: "kvx NAME: message" and a hint on stderr; returns CLI_USAGE. */
int cli_usage(const cli_cmd *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Failure: "kvx NAME: message" on stderr; returns CLI_FAIL. */
int cli_fail(const cli_cmd *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Library failure: "kvx NAME: what: <last error> (<code name>)" plus a
 * hint saying what to do for the common codes; returns CLI_FAIL. */
int cli_fail_code(const cli_cmd *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* A hint for a kvx or errno code ("" when none). */
const char *cli_hint(int code);

/* getopt_long, the same way in every command: call cli_getopt_reset()
 * before the loop, use an optstring that starts with ':' (so a missing
 * value is reported as ':'), and hand '?' and ':' to cli_getopt_error(),
 * which prints a usage error naming the option and returns CLI_USAGE. */
void cli_getopt_reset(void);
int cli_getopt_error(const cli_cmd *c, int ch, char **argv);

/* Parses a non-negative integer (decimal or 0x hex) that fits max.
 * Returns 0 or -1. */
int cli_parse_u64(const char *s, uint64_t max, uint64_t *out);
/* Parses 1..16 hex digits, with or without 0x. Returns 0 or -1. */
int cli_parse_hex64(const char *s, uint64_t *out);
/* Parses a size in human units: 4096, 64K, 64KiB, 1.5GiB, 2GB, 10MB ...
 * (K/Ki/KiB = 1024; KB = 1000). Returns 0 or -1. */
int cli_parse_size(const char *s, uint64_t *out);
/* Formats bytes as "4.00 GiB" ("512 B" below 1 KiB). Returns buf. */
char *cli_fmt_size(char *buf, size_t cap, uint64_t bytes);
/* Formats a rate in decimal units: "1.20 GB/s", "850 MB/s". Returns buf. */
char *cli_fmt_rate(char *buf, size_t cap, double bytes_per_s);
/* Monotonic seconds. */
double cli_now(void);

/* Reads a whole file into malloc'd memory. Returns 0 or -errno. */
int cli_read_file(void **out, size_t *out_len, const char *path);
/* Writes a whole file atomically: a temp file beside path, fsync, rename.
 * Nothing appears at path on failure. Returns 0 or -errno. */
int cli_write_file_atomic(const char *path, const void *data, size_t len);
/* Parses whitespace-separated u32 token ids from text. Returns 0 or -1
 * (with *out_bad pointing at the bad word). */
int cli_parse_tokens(uint32_t **out, size_t *out_n, const char *text, const char **out_bad);

/* Progress bar on stderr: drawn only when enabled (a terminal, not --json),
 * redrawn at most ~10 times a second. */
typedef struct cli_progress {
    int enabled;
    const char *label;
    uint64_t total; /* bytes or items; 0 = unknown */
    int bytes;      /* units are bytes (else items) */
    double start, last;
} cli_progress;
/* enabled = want && isatty(2). */
void cli_progress_begin(cli_progress *p, const char *label, uint64_t total, int bytes, int want);
void cli_progress_update(cli_progress *p, uint64_t done);
void cli_progress_end(cli_progress *p);

/* JSON emitter: writes valid JSON to f; commas and nesting are tracked. */
typedef struct cli_json {
    FILE *f;
    int depth;
    int first[32]; /* nothing written yet at this depth */
    int after_key;
} cli_json;
void cli_json_init(cli_json *j, FILE *f);
void cli_json_obj_begin(cli_json *j);
void cli_json_obj_end(cli_json *j);
void cli_json_arr_begin(cli_json *j);
void cli_json_arr_end(cli_json *j);
void cli_json_key(cli_json *j, const char *k);
void cli_json_str(cli_json *j, const char *s);
void cli_json_u64(cli_json *j, uint64_t v);
void cli_json_i64(cli_json *j, int64_t v);
void cli_json_double(cli_json *j, double v); /* null for NaN or inf */
void cli_json_bool(cli_json *j, int v);
void cli_json_null(cli_json *j);
void cli_json_hex(cli_json *j, uint64_t v, int digits); /* "0x..." string */
/* Ends the document with a newline. */
void cli_json_finish(cli_json *j);

#endif /* KVX_CLI_H */
