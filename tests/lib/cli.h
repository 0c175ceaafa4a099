/*
 * cli.h - the CLI harness: drive the built `kvx` binary (KVX_CLI) the way
 * a user does, for tests/cli/: run it with arguments (fork/exec, no
 * shell), capture stdout, stderr and the exit code; parse --json output
 * (json-c, plus the RFC 8259 checks it lacks) so it is checked as JSON,
 * not as text; and the fixture steps several of those tests share (whole
 * files in and out, the offset of a page as `kvx inspect --json` reports
 * it, a flipped byte).
 */
#ifndef KVX_CLI_HARNESS_H
#define KVX_CLI_HARNESS_H

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <json-c/json.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct cli_run {
    int rc; /* exit code, or 128+signal */
    char *out;
    char *err;
} cli_run;

static char *harness_slurp(int fd)
{
    size_t cap = 4096, len = 0;
    char *b = malloc(cap);
    lseek(fd, 0, SEEK_SET);
    for (;;) {
        if (cap - len < 2) {
            cap *= 2;
            b = realloc(b, cap);
        }
        ssize_t r = read(fd, b + len, cap - len - 1);
        if (r <= 0) break;
        len += (size_t)r;
    }
    b[len] = '\0';
    return b;
}

/* Runs KVX_CLI with argv (NULL-terminated, without argv[0]) and optional
 * stdin text. */
__attribute__((unused)) static cli_run cli_runv(const char *stdin_text, const char *const *args)
{
    char tmpl_o[] = "/tmp/kvx-cli-out-XXXXXX", tmpl_e[] = "/tmp/kvx-cli-err-XXXXXX",
         tmpl_i[] = "/tmp/kvx-cli-in-XXXXXX";
    int fo = mkstemp(tmpl_o), fe = mkstemp(tmpl_e), fi = mkstemp(tmpl_i);
    unlink(tmpl_o);
    unlink(tmpl_e);
    unlink(tmpl_i);
    if (stdin_text) {
        size_t n = strlen(stdin_text);
        if (write(fi, stdin_text, n) != (ssize_t)n) abort();
        lseek(fi, 0, SEEK_SET);
    }
    const char *argv[64];
    int n = 0;
    argv[n++] = KVX_CLI;
    for (; args[n - 1] && n < 63; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fi, 0);
        dup2(fo, 1);
        dup2(fe, 2);
        execv(KVX_CLI, (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    cli_run r;
    r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    r.out = harness_slurp(fo);
    r.err = harness_slurp(fe);
    close(fo);
    close(fe);
    close(fi);
    return r;
}

/* cli_run r = CLI(NULL, "hash", "-b", "2", "1", "2"); */
#define CLI(stdin_text, ...) cli_runv((stdin_text), (const char *const[]){__VA_ARGS__, NULL})

__attribute__((unused)) static void cli_run_free(cli_run *r)
{
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

/* Prints what the command said when an expectation fails. */
#define EXPECT_RC(r, code)                                                                    \
    do {                                                                                      \
        if ((r).rc != (code))                                                                 \
            fprintf(stderr, "exit %d (want %d)\nstdout:\n%s\nstderr:\n%s\n", (r).rc, (code), \
                    (r).out, (r).err);                                                        \
        assert_int_equal((r).rc, (code));                                                     \
    } while (0)

static int harness_rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

__attribute__((unused)) static void rm_rf(const char *dir) { nftw(dir, harness_rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

__attribute__((unused)) static int file_exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

__attribute__((unused)) static void write_bytes(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* The whole file (malloc'd, the caller frees); its length in *n. */
__attribute__((unused)) static uint8_t *read_bytes(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n + 1);
    assert_int_equal(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

/* XORs the byte at off with mask, in place. */
__attribute__((unused)) static void flip_bits(const char *path, uint64_t off, uint8_t mask)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
    b ^= mask;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
    close(fd);
}

/* ----------------------------------------------------------------- JSON */

/* json-c parses; its tree is copied into jval, a plain tree the tests
 * read directly (->t, ->num, ->str, ->items[i], ->n). json-c 0.16 in
 * strict mode still accepts a few things RFC 8259 forbids, so jparse
 * refuses them itself: overlong, surrogate or out-of-range UTF-8 (its
 * UTF-8 check only looks at byte patterns), raw control characters inside
 * strings, and NaN / Infinity (refused as non-finite numbers). */
typedef enum { JNULL, JBOOL, JNUM, JSTR, JARR, JOBJ } jtype;
typedef struct jval {
    jtype t;
    double num;
    int b;
    char *str;           /* JSTR */
    struct jval **items; /* JARR / JOBJ values */
    char **keys;         /* JOBJ */
    size_t n;
} jval;

__attribute__((unused)) static void jfree(jval *v)
{
    if (!v) return;
    free(v->str);
    for (size_t i = 0; i < v->n; i++) {
        jfree(v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v);
}

static char *harness_strdup(const char *s, size_t n)
{
    char *d = malloc(n + 1);
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

/* The jval copy of json-c's o; NULL for a number that is not finite. */
static jval *jfrom(json_object *o)
{
    jval *v = calloc(1, sizeof *v);
    switch (json_object_get_type(o)) {
    case json_type_null: v->t = JNULL; return v;
    case json_type_boolean:
        v->t = JBOOL;
        v->b = json_object_get_boolean(o);
        return v;
    case json_type_int:
    case json_type_double:
        v->t = JNUM;
        v->num = json_object_get_double(o);
        if (isfinite(v->num)) return v;
        break;
    case json_type_string:
        v->t = JSTR;
        v->str = harness_strdup(json_object_get_string(o), (size_t)json_object_get_string_len(o));
        return v;
    case json_type_array: {
        v->t = JARR;
        size_t n = json_object_array_length(o);
        v->items = calloc(n ? n : 1, sizeof *v->items);
        for (; v->n < n; v->n++)
            if (!(v->items[v->n] = jfrom(json_object_array_get_idx(o, v->n)))) goto bad;
        return v;
    }
    case json_type_object: {
        v->t = JOBJ;
        size_t n = (size_t)json_object_object_length(o);
        v->items = calloc(n ? n : 1, sizeof *v->items);
        v->keys = calloc(n ? n : 1, sizeof *v->keys);
        json_object_object_foreach(o, key, val)
        {
            v->keys[v->n] = harness_strdup(key, strlen(key));
            if (!(v->items[v->n++] = jfrom(val))) goto bad;
        }
        return v;
    }
    }
bad:
    jfree(v);
    return NULL;
}

/* 1 when s is well-formed UTF-8 (RFC 3629: no overlong forms, no
 * surrogates, nothing above U+10FFFF), which RFC 8259 requires of JSON. */
static int harness_utf8_ok(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        unsigned c = *p, n, cp;
        if (c < 0x80) { p++; continue; }
        if (c >= 0xC2 && c <= 0xDF) { n = 1; cp = c & 0x1F; }
        else if (c >= 0xE0 && c <= 0xEF) { n = 2; cp = c & 0x0F; }
        else if (c >= 0xF0 && c <= 0xF4) { n = 3; cp = c & 0x07; }
        else return 0;
        for (unsigned i = 1; i <= n; i++) {
            if ((p[i] & 0xC0) != 0x80) return 0;
            cp = cp << 6 | (p[i] & 0x3F);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        p += n + 1;
    }
    return 1;
}

/* 1 when no string in the text holds a raw control character (json-c
 * takes them; RFC 8259 wants them escaped). */
static int harness_strings_ok(const char *s)
{
    int in = 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (!in) {
            in = c == '"';
        } else if (c == '\\') {
            if (!*++s) return 0;
        } else if (c == '"') {
            in = 0;
        } else if (c < 0x20) {
            return 0;
        }
    }
    return 1;
}

/* Parses a whole document (trailing whitespace allowed); NULL if invalid,
 * including text that is not UTF-8. */
__attribute__((unused)) static jval *jparse(const char *text)
{
    size_t len = strlen(text);
    if (len >= INT32_MAX || !harness_utf8_ok(text) || !harness_strings_ok(text)) return NULL;
    json_tokener *tok = json_tokener_new();
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *o = json_tokener_parse_ex(tok, text, (int)len + 1); /* + the NUL: end of input */
    jval *v = NULL;
    if (o && json_tokener_get_error(tok) == json_tokener_success) v = jfrom(o);
    json_object_put(o);
    json_tokener_free(tok);
    return v;
}

__attribute__((unused)) static jval *jget(const jval *o, const char *key)
{
    if (!o || o->t != JOBJ) return NULL;
    for (size_t i = 0; i < o->n; i++)
        if (!strcmp(o->keys[i], key)) return o->items[i];
    return NULL;
}

/* The parsed stdout of a --json run that must exit want_rc (the caller
 * frees it with jfree; r stays the caller's). */
__attribute__((unused)) static jval *run_json(const cli_run *r, int want_rc)
{
    EXPECT_RC(*r, want_rc);
    jval *v = jparse(r->out);
    if (!v) fprintf(stderr, "not JSON:\n%s\n", r->out);
    assert_non_null(v);
    return v;
}

/* `kvx inspect --json path`, parsed. */
__attribute__((unused)) static jval *inspect_json(const char *path)
{
    cli_run r = CLI(NULL, "inspect", "--json", path);
    jval *v = run_json(&r, 0);
    cli_run_free(&r);
    return v;
}

/* The absolute file offset of entry i's page, as inspect reports it. */
__attribute__((unused)) static uint64_t page_offset(const char *path, size_t i)
{
    jval *v = inspect_json(path);
    jval *ents = jget(v, "entries");
    assert_non_null(ents);
    assert_true(i < ents->n);
    uint64_t off = (uint64_t)jget(ents->items[i], "offset")->num;
    jfree(v);
    return off;
}

#endif
