/*
 * tests/lib/model_util.h - what the two model-based tests share
 * (tests/system/model.c, keyed; tests/system/model_blocks.c, blocks): the
 * seeded generator, the operation trace a failing sequence prints, the
 * index/ copies they put back as an "old index", and small file helpers.
 * Header only; every function static, used by both.
 */
#ifndef KVX_TESTS_MODEL_UTIL_H
#define KVX_TESTS_MODEL_UTIL_H

#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "store.h"

/* The time budget's default doubles under AddressSanitizer (each
 * sequence runs slower there). */
#if defined(__SANITIZE_ADDRESS__)
#define MODEL_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MODEL_ASAN 1
#endif
#endif
#ifndef MODEL_ASAN
#define MODEL_ASAN 0
#endif

/* A (seed, sequence) pair: a sequence that once found a defect. */
typedef struct mu_case {
    uint64_t seed;
    long seq;
} mu_case;

/* xorshift64*: the sequence's operations from its seed (never 0). */
static inline uint64_t mu_rnd(uint64_t *state)
{
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    return *state * 0x2545F4914F6CDD1Dull;
}

static inline uint32_t mu_below(uint64_t *state, uint32_t n) { return n ? (uint32_t)(mu_rnd(state) % n) : 0; }

static inline double mu_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline long mu_env_long(const char *name, long dflt)
{
    const char *e = getenv(name);
    return e && *e ? strtol(e, NULL, 10) : dflt;
}

/* getenv of env_prefix + "_" + name ("KVX_MODEL" + "SEED"). */
static inline const char *mu_getenv(const char *env_prefix, const char *name)
{
    char var[128];
    snprintf(var, sizeof var, "%s_%s", env_prefix, name);
    return getenv(var);
}

static inline long mu_env_long_of(const char *env_prefix, const char *name, long dflt)
{
    char var[128];
    snprintf(var, sizeof var, "%s_%s", env_prefix, name);
    return mu_env_long(var, dflt);
}

/* What a model test's campaign needs of it. The environment, under
 * env's prefix: _SEED (else from the clock), _SEQ (one sequence: a
 * replay), _RUNS, _SECONDS, _OPS, _BATCHES, _WEIGHTS (in op_names'
 * order), _DIR (default /dev/shm, else /tmp), _KEEP (a failing run's
 * directory is kept). */
typedef struct mu_campaign {
    const char *name; /* the messages' prefix, "model" */
    const char *env;  /* the variables' prefix, "KVX_MODEL" */
    long seconds;     /* the default time budget (doubled under ASan) */
    int n_kinds;      /* operation kinds: op_names[n_kinds], op_weights[n_kinds] */
    const char *const *op_names;
    int *op_weights;
    int *n_batches; /* batches puts go to, 1..max_batches */
    int max_batches;
    const mu_case *regressions; /* run first, with the default mix only */
    size_t n_regressions;
    int (*run_sequence)(uint64_t seed, long seq, const char *root, long nops); /* 1: it failed */
} mu_campaign;

/* Runs the regression cases, then sequences 0, 1, ... of the seed until
 * the time budget or the run count is spent (or the one sequence _SEQ
 * names). Returns the sequences that failed; *done, *nops, *elapsed_s:
 * how many ran, of how many operations each, in how long. */
static inline long mu_campaign_run(const mu_campaign *c, long *done, long *nops, double *elapsed_s)
{
    const char *base = mu_getenv(c->env, "DIR");
    if (!base || !*base) base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    char root[300];
    snprintf(root, sizeof root, "%s/kvx-%s-XXXXXX", base, c->name);
    assert_non_null(mkdtemp(root));
    uint64_t seed = (uint64_t)mu_env_long_of(c->env, "SEED", 0);
    if (!mu_getenv(c->env, "SEED")) seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16);
    seed &= 0xFFFFFFFFull;
    long only = mu_env_long_of(c->env, "SEQ", -1);
    long runs = mu_env_long_of(c->env, "RUNS", 0);
    double seconds = (double)mu_env_long_of(c->env, "SECONDS", MODEL_ASAN ? 120 : c->seconds);
    *nops = mu_env_long_of(c->env, "OPS", 150);
    *c->n_batches = (int)mu_env_long_of(c->env, "BATCHES", c->max_batches);
    if (*c->n_batches < 1 || *c->n_batches > c->max_batches) *c->n_batches = c->max_batches;
    const char *w = mu_getenv(c->env, "WEIGHTS");
    for (int i = 0; w && *w && i < c->n_kinds; i++) {
        c->op_weights[i] = (int)strtol(w, (char **)&w, 10);
        if (*w == ',') w++;
    }
    if (w) {
        fprintf(stderr, "%s: weights", c->name);
        for (int i = 0; i < c->n_kinds; i++) fprintf(stderr, " %s %d", c->op_names[i], c->op_weights[i]);
        fprintf(stderr, "\n");
    }
    fprintf(stderr, "%s: seed %" PRIu64 "\n", c->name, seed);
    double t0 = mu_now_s();
    long failed = 0;
    *done = 0;
    if (only >= 0) {
        failed += c->run_sequence(seed, only, root, *nops);
        ++*done;
    } else {
        int dflt = !mu_getenv(c->env, "WEIGHTS") && !mu_getenv(c->env, "BATCHES") && !mu_getenv(c->env, "OPS");
        for (size_t i = 0; dflt && i < c->n_regressions; i++) {
            fprintf(stderr, "%s: regression case seed %" PRIu64 " sequence %ld\n", c->name, c->regressions[i].seed,
                    c->regressions[i].seq);
            failed += c->run_sequence(c->regressions[i].seed, c->regressions[i].seq, root, *nops);
            ++*done;
        }
        for (long q = 0; (!runs || q < runs) && mu_now_s() - t0 < seconds; q++) {
            failed += c->run_sequence(seed, q, root, *nops);
            ++*done;
        }
    }
    if (!failed || !mu_getenv(c->env, "KEEP")) su_rm_rf(root);
    *elapsed_s = mu_now_s() - t0;
    return failed;
}

/* A sequence's trace: one line an operation or finding, kept whole so a
 * failure can print its end. */
typedef struct mu_trace {
    char *buf;
    size_t len, cap;
} mu_trace;

static inline void mu_trace_init(mu_trace *t)
{
    t->cap = 1 << 16;
    t->len = 0;
    t->buf = malloc(t->cap);
    if (t->buf) t->buf[0] = '\0';
}

/* Adds a line (at most 299 bytes); echo: also to stderr (verbose). */
static inline void mu_trace_vadd(mu_trace *t, int echo, const char *fmt, va_list ap)
{
    char line[300];
    int n = vsnprintf(line, sizeof line, fmt, ap);
    if (n < 0 || !t->buf) return;
    if ((size_t)n >= sizeof line) n = sizeof line - 1;
    if (echo) fprintf(stderr, "  %s\n", line);
    if (t->len + (size_t)n + 2 > t->cap) {
        size_t cap = (t->cap + (size_t)n + 2) * 2;
        char *grown = realloc(t->buf, cap);
        if (!grown) return;
        t->buf = grown;
        t->cap = cap;
    }
    memcpy(t->buf + t->len, line, (size_t)n);
    t->len += (size_t)n;
    t->buf[t->len++] = '\n';
    t->buf[t->len] = '\0';
}

/* Prints the trace's last `lines` lines under a heading naming the seed
 * and the sequence. */
static inline void mu_trace_print_tail(const mu_trace *t, const char *test, uint64_t seed, long seq, int lines)
{
    if (!t->buf) return;
    const char *from = t->buf;
    int seen = 0;
    for (const char *p = t->buf + t->len; p > t->buf; p--)
        if (*p == '\n' && ++seen > lines) {
            from = p + 1;
            break;
        }
    fprintf(stderr, "%s: trace of seed %llu sequence %ld (last %d lines):\n%s", test, (unsigned long long)seed, seq,
            seen > lines ? lines : seen, from);
}

static inline void mu_trace_free(mu_trace *t)
{
    free(t->buf);
    t->buf = NULL;
}

/* Copies a file to a new one (0600); -1 on any failure. */
static inline int mu_copy_file(const char *from, const char *to)
{
    FILE *a = fopen(from, "rb");
    if (!a) return -1;
    FILE *b = fopen(to, "wbx");
    if (!b) {
        fclose(a);
        return -1;
    }
    char buf[65536];
    size_t n;
    int rc = 0;
    while ((n = fread(buf, 1, sizeof buf, a)) > 0)
        if (fwrite(buf, 1, n, b) != n) rc = -1;
    fclose(a);
    if (fclose(b)) rc = -1;
    chmod(to, 0600);
    return rc;
}

static inline int mu_has_sig(const uint64_t *s, size_t n, uint64_t x)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] == x) return 1;
    return 0;
}

/* A copy of dir/index/ (data.mdb, lock.mdb) in saved (replaced); 0 once
 * made. */
static inline int mu_save_index(const char *dir, const char *saved)
{
    char from[1024], to[1024];
    su_rm_rf(saved);
    if (mkdir(saved, 0700)) return -1;
    const char *f[2] = {"data.mdb", "lock.mdb"};
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof from, "%s/index/%s", dir, f[i]);
        snprintf(to, sizeof to, "%s/%s", saved, f[i]);
        mu_copy_file(from, to);
    }
    return 0;
}

/* dir/index/ replaced by the copy in saved (an older index/ put back). */
static inline void mu_put_old_index(const char *dir, const char *saved)
{
    char idx[1024], from[1024], to[1024];
    snprintf(idx, sizeof idx, "%s/index", dir);
    su_rm_rf(idx);
    mkdir(idx, 0700);
    const char *f[2] = {"data.mdb", "lock.mdb"};
    for (int i = 0; i < 2; i++) {
        snprintf(from, sizeof from, "%s/%s", saved, f[i]);
        snprintf(to, sizeof to, "%.900s/%s", idx, f[i]);
        mu_copy_file(from, to);
    }
}

#endif
