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

#include <getopt.h>
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
extern const cli_cmd cli_cmd_store_tier; /* cmd_tier.c: `kvx store tier` */
/* cmd_store.c's writer and reader opening, for cmd_tier.c: --wait SECONDS
 * / --no-wait (ch 'W' / 'N'), and opens that print their own failure. */
int cli_store_parse_wait(const cli_cmd *self, int ch, const char *arg, double *wait);
int cli_store_open_writer(const cli_cmd *self, kvx_store **out, const char *dir, double wait);
/* The same for a store of geometry g (its mismatch fails as the open
 * does: KVX_ESHAPE, KVX_EMODEL), for cmd_demo.c. */
int cli_store_open_writer_g(const cli_cmd *self, kvx_store **out, const char *dir,
                            const kvx_geometry *g, double wait);
int cli_store_open_reader(const cli_cmd *self, kvx_store **out, const char *dir);
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
/* The same with the hint given (NULL: cli_hint(code); "": none). */
int cli_fail_code_hint(const cli_cmd *c, int code, const char *hint, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A hint for a kvx or errno code ("" when none). */
const char *cli_hint(int code);

/* getopt_long, the same way in every command: call cli_getopt_reset()
 * before the loop, use an optstring that starts with ':' (so a missing
 * value is reported as ':'), and hand '?' and ':' to cli_getopt_error()
 * with the loop's long options, which prints a usage error naming the
 * option as given ("--json=1": '--json' takes no value; "--t": ambiguous,
 * naming the candidates) and returns CLI_USAGE. */
void cli_getopt_reset(void);
int cli_getopt_error(const cli_cmd *c, int ch, char **argv, const struct option *opts);

/* Parses a non-negative integer (decimal or 0x hex) that fits max.
 * Returns 0 or -1. */
int cli_parse_u64(const char *s, uint64_t max, uint64_t *out);
/* Parses 1..16 hex digits, with or without 0x. Returns 0 or -1. */
int cli_parse_hex64(const char *s, uint64_t *out);
/* Parses a size in human units: 4096, 64K, 64KiB, 1.5GiB, 2GB, 10MB ...
 * (K/Ki/KiB = 1024; KB = 1000). Returns 0 or -1. */
int cli_parse_size(const char *s, uint64_t *out);
/* Parses a duration into milliseconds: 3600 (seconds), 250ms, 90s, 30m,
 * 12h, 7d: digits, then the unit (no blank, no sign). Returns 0, -1 (not
 * such a duration) or -2 (above CLI_DURATION_MAX_MS). */
#define CLI_DURATION_MAX_MS (1ull << 62)
int cli_parse_duration_ms(const char *s, uint64_t *out_ms);
/* --tier-ttl's value: CLI_OK, or CLI_USAGE after a message naming the
 * option (one message for what is no duration, one for what is too long). */
int cli_parse_tier_ttl(const cli_cmd *c, const char *arg, uint64_t *out_ms);
/* Formats bytes as "4.00 GiB" ("512 B" below 1 KiB). Returns buf. */
char *cli_fmt_size(char *buf, size_t cap, uint64_t bytes);
/* Formats a rate in decimal units: "1.20 GB/s", "850 MB/s". Returns buf. */
char *cli_fmt_rate(char *buf, size_t cap, double bytes_per_s);
/* Monotonic seconds. */
double cli_now(void);

/* ---------------------------------------------------------- inputs (io.c)
 * Bounded by the input (DESIGN.md rule 5). Each prints its own message
 * ("kvx NAME: ...") and returns CLI_OK or CLI_FAIL (or bad_rc). */

#define CLI_ENVELOPE_CAP (4ull << 30) /* an envelope read from anywhere */
#define CLI_TEXT_CAP (1ull << 30)     /* token text */
/* The caps; the hidden variables KVX_CLI_ENVELOPE_CAP and KVX_CLI_TEXT_CAP
 * (sizes) may lower them, never raise them (for tests). */
uint64_t cli_envelope_cap(void);
uint64_t cli_text_cap(void);
/* "a FIFO (named pipe)", "a character device", ... for a st_mode. */
const char *cli_file_type(unsigned mode);
/* Refuses, by type and before anything opens it, a path that is not a
 * regular file (after symlinks): what is "a shard", ... */
int cli_require_regular(const cli_cmd *c, const char *path, const char *what);
/* An envelope from path ("-": standard input; a file, FIFO, pipe or
 * character device): exactly the length its header declares, refused at
 * the first bad header field or above the cap. malloc'd into *out. */
int cli_read_envelope(const cli_cmd *c, const char *path, void **out, size_t *out_len);
/* Opens an input the way cli_read_envelope does and reads its first want
 * bytes into head (*got may be less at the end of input); the caller goes
 * on with cli_read_envelope_fd and then cli_close_input. */
int cli_read_input_head(const cli_cmd *c, const char *path, int *out_fd, int *out_regular,
                        uint64_t *out_size, uint8_t *head, size_t want, size_t *got);
/* The rest of an envelope whose first head_len bytes were read already. */
int cli_read_envelope_fd(const cli_cmd *c, const char *name, int fd, int regular, uint64_t size,
                         const uint8_t *head, size_t head_len, void **out, size_t *out_len);
void cli_close_input(int fd);
/* A note for an input that gave no bytes: path names a FIFO, which reads
 * as empty until a writer opens it (inputs never wait); else "". */
const char *cli_empty_why(const char *path);
/* Opens a text input read line by line (a trace): a regular file, a FIFO
 * (opened without blocking: one no process writes to reads as empty) or
 * "-" (standard input); anything else is refused by type before it is
 * opened. Close it with cli_close_input. */
int cli_open_input(const cli_cmd *c, const char *path, int *out_fd);
/* Token ids as text from path ("-": standard input) or fd, capped; stops
 * reading at the first byte token text cannot hold. Bad content (a NUL, a
 * word that is no token id) returns bad_rc (CLI_FAIL or CLI_USAGE). */
int cli_read_tokens(const cli_cmd *c, const char *path, uint32_t **out, size_t *out_n);
int cli_read_tokens_fd(const cli_cmd *c, const char *name, int fd, int bad_rc, uint32_t **out,
                       size_t *out_n);

/* --------------------------------------------------------- outputs (io.c)
 * The named output is replaced only when it is a regular file or absent
 * (O_TMPFILE in its directory, fsync, rename: a killed command leaves
 * nothing; the new file keeps the replaced one's permission bits); a FIFO
 * or character device is written into directly (a FIFO without a reader
 * is refused); a symlink, directory, block device or socket is refused
 * and left alone. "-" is standard output. */
typedef struct cli_out {
    const char *path;
    int fd;       /* where cli_out_write goes; -1 when the library writes */
    int dirfd;    /* the target's directory (or TMPDIR for a library file) */
    int direct;   /* writing into the target itself (FIFO, device, stdout) */
    int is_stdout;
    int named;     /* tmpname exists in dirfd */
    int keep_mode; /* replacing a regular file: the new one takes mode */
    unsigned mode; /* the replaced file's permission bits */
    char *dir, *base, *tmpname;
    char *lib_path; /* for_library: the path the library writes its file to */
} cli_out;
/* for_library: the bytes come from a library call that writes a file by
 * path (a shard): give it o->lib_path; commit puts that file in place. */
int cli_out_open(const cli_cmd *c, cli_out *o, const char *path, int for_library);
int cli_out_write(const cli_cmd *c, cli_out *o, const void *data, size_t len); /* aborts on failure */
int cli_out_commit(const cli_cmd *c, cli_out *o);
void cli_out_abort(cli_out *o);
/* open + write + commit of a whole buffer. */
int cli_write_output(const cli_cmd *c, const char *path, const void *data, size_t len);

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
