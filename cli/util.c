/*
 * util.c - the plumbing every `kvx` subcommand shares: error messages that
 * say what is wrong and what to do, number and size parsing in human
 * units, a progress bar that only draws on a terminal, and a small JSON
 * emitter (inputs and outputs: io.c).
 *
 * JSON output needs no library: the emitter tracks commas and nesting and
 * escapes strings per RFC 8259, which is all a report needs.
 */
#include "cli.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------------ help */

void cli_print_help(const cli_cmd *c) { fputs(c->help, stdout); }

static void vmsg(const cli_cmd *c, const char *fmt, va_list ap)
{
    fprintf(stderr, "kvx%s%s: ", c ? " " : "", c ? c->name : "");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
}

int cli_usage(const cli_cmd *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg(c, fmt, ap);
    va_end(ap);
    fprintf(stderr, "Try 'kvx%s%s --help' for usage.\n", c ? " " : "", c ? c->name : "");
    return CLI_USAGE;
}

int cli_fail(const cli_cmd *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vmsg(c, fmt, ap);
    va_end(ap);
    return CLI_FAIL;
}

const char *cli_hint(int code)
{
    switch (code) {
    case -ENOENT: return "check the path";
    case -EACCES:
    case -EPERM: return "check the file's permissions";
    case -ENOSPC: return "free some disk space or lower the store's capacity";
    case -EEXIST: return "choose another path or remove the existing one";
    case KVX_EMAGIC: return "the file is not of the expected kind (a KVX shard or a TLKV envelope)";
    case KVX_EVERSION: return "written by another release of kvx: the message says which, and what to do";
    case KVX_ESHAPE: return "the geometry differs: check L, Hkv, D and B";
    case KVX_EMODEL: return "the store was made for another model";
    case KVX_EMETACRC:
    case KVX_EPAGECRC:
    case KVX_ECORRUPT:
    case KVX_ETRUNC: return "the file is damaged: restore it from a good copy";
    case KVX_EBUSY: return "another process is writing this store; wait for it to finish";
    case KVX_EFULL:
    case KVX_ECAPACITY: return "raise the capacity or run 'kvx store gc'";
    case KVX_ENOGPU: return "use the host sink (--sink host) on a machine without a GPU";
    case KVX_ENOCUDA: return "rebuild kvx with the CUDA toolkit, or use the host sink";
    case KVX_EMEMLOCK: return "raise the locked-memory limit (ulimit -l)";
    case KVX_EAMBIGUOUS: return "give the prompt's tokens (--tokens FILE) to pick the block by digest";
    case KVX_EUNVERIFIED: return "put the envelope again with --tokens FILE so the block is verified";
    case KVX_ELOSSY: return "write --format v3 (bf16, lossless) or v2 instead of v1";
    case KVX_ENOTFOUND: return "";
    default: return "";
    }
}

static void vfail_code(const cli_cmd *c, int code, const char *hint, const char *fmt, va_list ap)
{
    fprintf(stderr, "kvx%s%s: ", c ? " " : "", c ? c->name : "");
    vfprintf(stderr, fmt, ap);
    const char *detail = kvx_last_error();
    if (detail && *detail)
        fprintf(stderr, ": %s (%s)\n", detail, kvx_err_name(code));
    else
        fprintf(stderr, ": %s (%s)\n", kvx_strerror(code), kvx_err_name(code));
    if (!hint) hint = cli_hint(code);
    /* capacity and shard ids are the store's: elsewhere the code means an
     * input declares more than a buffer or a file holds */
    if ((code == KVX_ECAPACITY || code == KVX_EFULL) && c && strncmp(c->name, "store", 5) != 0) hint = "";
    if (*hint) fprintf(stderr, "  hint: %s\n", hint);
}

int cli_fail_code(const cli_cmd *c, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail_code(c, code, NULL, fmt, ap);
    va_end(ap);
    return CLI_FAIL;
}

int cli_fail_code_hint(const cli_cmd *c, int code, const char *hint, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail_code(c, code, hint, fmt, ap);
    va_end(ap);
    return CLI_FAIL;
}

void cli_getopt_reset(void)
{
    optind = 0; /* glibc: 0 re-initialises getopt completely */
    opterr = 0; /* we print our own messages */
}

/* The long option "--name[=value]" names in opts: the exact name, else the
 * only option it abbreviates (glibc takes several prefix matches for one
 * when they mean the same: same has_arg, flag and val). *ambiguous is set
 * when it abbreviates options that differ. */
static const struct option *long_match(const struct option *opts, const char *name, size_t len,
                                       int *ambiguous)
{
    const struct option *hit = NULL;
    *ambiguous = 0;
    for (const struct option *o = opts; o && o->name; o++) {
        if (strncmp(o->name, name, len) != 0) continue;
        if (strlen(o->name) == len) {
            *ambiguous = 0;
            return o;
        }
        if (!hit) hit = o;
        else if (hit->has_arg != o->has_arg || hit->flag != o->flag || hit->val != o->val)
            *ambiguous = 1;
    }
    return hit;
}

int cli_getopt_error(const cli_cmd *c, int ch, char **argv, const struct option *opts)
{
    const char *arg = optind > 0 ? argv[optind - 1] : "?";
    if (ch == ':') return cli_usage(c, "option '%s' needs a value", arg);
    /* glibc puts in optopt the letter of a short option it does not know,
     * the val of a long option given a value it takes none of ("--json=1"
     * is no '-j'), and 0 for a long option unknown or ambiguous; argv's
     * last element read is the long option itself. */
    if (!strncmp(arg, "--", 2) && arg[2]) {
        const char *name = arg + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        int ambiguous = 0;
        const struct option *o = long_match(opts, name, len, &ambiguous);
        if (optopt && o && !ambiguous && eq && o->has_arg == no_argument && o->val == optopt)
            return cli_usage(c, "option '--%s' takes no value (given '%s')", o->name, arg);
        if (!optopt && o && ambiguous) {
            char list[512];
            size_t at = 0;
            list[0] = '\0';
            for (const struct option *p = opts; p->name && at < sizeof list; p++)
                if (!strncmp(p->name, name, len))
                    at += (size_t)snprintf(list + at, sizeof list - at, "%s--%s", at ? ", " : "", p->name);
            return cli_usage(c, "option '%.*s' is ambiguous: it may be %s", (int)(len + 2), arg, list);
        }
        if (!optopt) return cli_usage(c, "unknown option '%.*s'", (int)(len + 2), arg);
    }
    if (optopt) return cli_usage(c, "unknown option '-%c'", optopt);
    return cli_usage(c, "unknown option '%s'", arg);
}

/* --------------------------------------------------------------- numbers */

int cli_parse_u64(const char *s, uint64_t max, uint64_t *out)
{
    if (!s) return -1;
    /* Decimal, or hex after 0x; never octal (base 0 would read "010" as 8,
     * and zero-padded token ids are decimal). strtoull itself would accept
     * leading blanks and a sign: only digits may follow. */
    int base = 10;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        base = 16;
        s += 2;
    }
    if (!isxdigit((unsigned char)*s) || (base == 10 && !isdigit((unsigned char)*s))) return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, base);
    if (errno || *end || v > max) return -1;
    *out = v;
    return 0;
}

int cli_parse_hex64(const char *s, uint64_t *out)
{
    if (!s) return -1;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) s += 2;
    size_t n = strlen(s);
    if (n == 0 || n > 16) return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | (uint64_t)d;
    }
    *out = v;
    return 0;
}

int cli_parse_duration_ms(const char *s, uint64_t *out_ms)
{
    /* Digits first: strtoull alone would take leading blanks and a sign
     * (" -1ms" was 2^64 - 1 ms). */
    if (!s || !isdigit((unsigned char)*s)) return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s) return -1;
    uint64_t mul;
    if (!*end || !strcmp(end, "s")) mul = 1000;
    else if (!strcmp(end, "ms")) mul = 1;
    else if (!strcmp(end, "m")) mul = 60000;
    else if (!strcmp(end, "h")) mul = 3600000;
    else if (!strcmp(end, "d")) mul = 86400000;
    else return -1;
    if (errno == ERANGE || v > CLI_DURATION_MAX_MS / mul) return -2;
    *out_ms = (uint64_t)v * mul;
    return 0;
}

int cli_parse_tier_ttl(const cli_cmd *c, const char *arg, uint64_t *out_ms)
{
    int rc = cli_parse_duration_ms(arg, out_ms);
    if (rc == -2)
        return cli_usage(c, "--tier-ttl '%s' is longer than the longest TTL kvx sets (2^62 ms, "
                            "about 146 million years)", arg);
    if (rc != 0)
        return cli_usage(c, "--tier-ttl must be digits and a unit, such as 3600, 250ms, 90s, 30m, "
                            "12h or 7d, not '%s'", arg);
    return CLI_OK;
}

int cli_parse_size(const char *s, uint64_t *out)
{
    if (!s || !*s || *s == '-' || *s == '+') return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0) || isinf(v)) return -1;
    while (*end == ' ') end++;
    static const struct {
        const char *suffix;
        double mul;
    } units[] = {
        {"", 1},
        {"B", 1},
        {"K", 1024.0},
        {"KiB", 1024.0},
        {"Ki", 1024.0},
        {"KB", 1e3},
        {"k", 1024.0},
        {"kB", 1e3},
        {"M", 1048576.0},
        {"MiB", 1048576.0},
        {"Mi", 1048576.0},
        {"MB", 1e6},
        {"G", 1073741824.0},
        {"GiB", 1073741824.0},
        {"Gi", 1073741824.0},
        {"GB", 1e9},
        {"T", 1099511627776.0},
        {"TiB", 1099511627776.0},
        {"Ti", 1099511627776.0},
        {"TB", 1e12},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].suffix) == 0) {
            double b = v * units[i].mul;
            if (b >= 18446744073709551615.0) return -1;
            double r = floor(b + 0.5);
            *out = (uint64_t)r;
            return 0;
        }
    }
    return -1;
}

char *cli_fmt_size(char *buf, size_t cap, uint64_t bytes)
{
    static const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    if (bytes < 1024) {
        snprintf(buf, cap, "%" PRIu64 " B", bytes);
        return buf;
    }
    double v = (double)bytes;
    int i = 0;
    while (v >= 1024.0 && i < 6) {
        v /= 1024.0;
        i++;
    }
    snprintf(buf, cap, v >= 100 ? "%.0f %s" : v >= 10 ? "%.1f %s" : "%.2f %s", v, u[i]);
    return buf;
}

char *cli_fmt_rate(char *buf, size_t cap, double bps)
{
    static const char *u[] = {"B/s", "kB/s", "MB/s", "GB/s", "TB/s"};
    if (!(bps >= 0) || isinf(bps)) {
        snprintf(buf, cap, "n/a");
        return buf;
    }
    double v = bps;
    int i = 0;
    while (v >= 1000.0 && i < 4) {
        v /= 1000.0;
        i++;
    }
    snprintf(buf, cap, v >= 100 ? "%.0f %s" : v >= 10 ? "%.1f %s" : "%.2f %s", v, u[i]);
    return buf;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ----------------------------------------------------------------- tokens */

int cli_parse_tokens(uint32_t **out, size_t *out_n, const char *text, const char **out_bad)
{
    size_t cap = 64, n = 0;
    uint32_t *v = malloc(cap * sizeof *v);
    if (!v) return -1;
    const char *p = text;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == ',') p++;
        if (!*p) break;
        const char *w = p;
        while (*p && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r' && *p != ',') p++;
        char word[32];
        size_t wl = (size_t)(p - w);
        uint64_t x;
        if (wl >= sizeof word) goto bad;
        memcpy(word, w, wl);
        word[wl] = '\0';
        if (cli_parse_u64(word, UINT32_MAX, &x) != 0) goto bad;
        if (n == cap) {
            cap *= 2;
            uint32_t *nv = realloc(v, cap * sizeof *v);
            if (!nv) goto oom;
            v = nv;
        }
        v[n++] = (uint32_t)x;
        continue;
    bad:
        if (out_bad) *out_bad = w;
    oom:
        free(v);
        return -1;
    }
    *out = v;
    *out_n = n;
    return 0;
}

/* --------------------------------------------------------------- progress */

static void progress_draw(cli_progress *p, uint64_t done, int final)
{
    double now = cli_now();
    double el = now - p->start;
    char a[32], b[32], r[32];
    int width = 30;
    double frac = p->total ? (double)done / (double)p->total : 0.0;
    if (frac > 1) frac = 1;
    int fill = (int)(frac * width);
    char bar[64];
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '-';
    bar[width] = '\0';
    if (p->bytes) {
        cli_fmt_size(a, sizeof a, done);
        cli_fmt_size(b, sizeof b, p->total);
        cli_fmt_rate(r, sizeof r, el > 0 ? (double)done / el : 0);
        fprintf(stderr, "\r%-10s [%s] %3.0f%%  %s / %s  %s\033[K", p->label, bar, frac * 100, a, b,
                r);
    } else {
        fprintf(stderr, "\r%-10s [%s] %3.0f%%  %" PRIu64 " / %" PRIu64 "\033[K", p->label, bar,
                frac * 100, done, p->total);
    }
    if (final) fputc('\n', stderr);
    fflush(stderr);
    p->last = now;
}

void cli_progress_begin(cli_progress *p, const char *label, uint64_t total, int bytes, int want)
{
    memset(p, 0, sizeof *p);
    p->enabled = want && isatty(STDERR_FILENO);
    p->label = label;
    p->total = total;
    p->bytes = bytes;
    p->start = p->last = cli_now();
    if (p->enabled) progress_draw(p, 0, 0);
}

void cli_progress_update(cli_progress *p, uint64_t done)
{
    if (!p->enabled) return;
    if (cli_now() - p->last < 0.1) return;
    progress_draw(p, done, 0);
}

void cli_progress_end(cli_progress *p)
{
    if (!p->enabled) return;
    progress_draw(p, p->total, 1);
    p->enabled = 0;
}

/* ------------------------------------------------------------------- json */

void cli_json_init(cli_json *j, FILE *f)
{
    memset(j, 0, sizeof *j);
    j->f = f;
    j->first[0] = 1;
}

static void json_sep(cli_json *j)
{
    if (j->after_key) {
        j->after_key = 0;
        return;
    }
    if (!j->first[j->depth]) fputc(',', j->f);
    j->first[j->depth] = 0;
}

static void json_open(cli_json *j, int ch)
{
    json_sep(j);
    fputc(ch, j->f);
    if (j->depth < 31) j->depth++;
    j->first[j->depth] = 1;
}

static void json_close(cli_json *j, int ch)
{
    if (j->depth > 0) j->depth--;
    fputc(ch, j->f);
}

void cli_json_obj_begin(cli_json *j) { json_open(j, '{'); }
void cli_json_obj_end(cli_json *j) { json_close(j, '}'); }
void cli_json_arr_begin(cli_json *j) { json_open(j, '['); }
void cli_json_arr_end(cli_json *j) { json_close(j, ']'); }

/* Length of the well-formed UTF-8 sequence (RFC 3629: shortest form, no
 * surrogates, at most U+10FFFF) of 2..4 bytes starting at p, or 0. */
static size_t utf8_seq_len(const unsigned char *p)
{
    unsigned c = p[0], n, cp;
    if (c >= 0xC2 && c <= 0xDF) n = 1, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) n = 2, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) n = 3, cp = c & 0x07;
    else return 0;
    for (unsigned i = 1; i <= n; i++) { /* stops at the NUL: it is no continuation */
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3Fu);
    }
    if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return n + 1;
}

static void json_raw_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        case '\b': fputs("\\b", f); break;
        case '\f': fputs("\\f", f); break;
        default:
            if (*p < 0x20) {
                fprintf(f, "\\u%04x", *p);
            } else if (*p < 0x80) {
                fputc(*p, f);
            } else {
                /* JSON is UTF-8, a file name is any bytes: a well-formed
                 * sequence goes through, any other byte becomes U+FFFD. */
                size_t n = utf8_seq_len(p);
                if (n) {
                    fwrite(p, 1, n, f);
                    p += n - 1;
                } else {
                    fputs("\\ufffd", f);
                }
            }
        }
    }
    fputc('"', f);
}

void cli_json_key(cli_json *j, const char *k)
{
    json_sep(j);
    json_raw_str(j->f, k);
    fputc(':', j->f);
    j->after_key = 1;
}

void cli_json_str(cli_json *j, const char *s)
{
    json_sep(j);
    json_raw_str(j->f, s);
}

void cli_json_u64(cli_json *j, uint64_t v)
{
    json_sep(j);
    fprintf(j->f, "%" PRIu64, v);
}

void cli_json_i64(cli_json *j, int64_t v)
{
    json_sep(j);
    fprintf(j->f, "%" PRId64, v);
}

void cli_json_double(cli_json *j, double v)
{
    json_sep(j);
    if (isnan(v) || isinf(v))
        fputs("null", j->f);
    else
        fprintf(j->f, "%.6g", v);
}

void cli_json_bool(cli_json *j, int v)
{
    json_sep(j);
    fputs(v ? "true" : "false", j->f);
}

void cli_json_null(cli_json *j)
{
    json_sep(j);
    fputs("null", j->f);
}

void cli_json_hex(cli_json *j, uint64_t v, int digits)
{
    json_sep(j);
    fprintf(j->f, "\"0x%0*" PRIx64 "\"", digits, v);
}

void cli_json_finish(cli_json *j)
{
    fputc('\n', j->f);
    fflush(j->f);
}
