/*
 * trust.c - the `kvx` command keeps the trust rules of DESIGN.md (never
 * wrong KV, bounded by the input, the named output only) when driven as a
 * hostile or unlucky user drives it (cli/io.c, cmd_store.c, cmd_demo.c):
 * get and prefix export only sound blocks and name the others; outputs
 * never replace special files or the store's own files, keep their mode,
 * leave no temporary behind (kill -9 included); inputs are bounded; a
 * writer waits or not as asked; hints fit the problem.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvx.h"
#include "lib/cli.h"
#include "lib/store.h"

static char tmpdir[256];

static char base[300], envp[300], tokp[300];

/* L=2, Hkv=1, D=8, B=4, fp16; tokens: three full blocks and a tail. */
static const kvx_geometry G = {2, 1, 8, 4, KVX_QUANT_FP16, 0};

#define NT 14

#define NBLOCKS 3

static uint32_t toks[NT];

static uint64_t hashes[NBLOCKS];

static uint8_t *env;

static size_t env_len;

/* A chained FNV-1a collision at block 0 for B = 2 (found once with
 * tests/lib/collide.h): H(0, A) == H(0, B) == 0xc314a8c6084d4b91, so every
 * block appended identically to both prompts collides as well. */
static const uint32_t COLL2_A[2] = {3911133820u, 200437748u};

static const uint32_t COLL2_B[2] = {1649453268u, 807956602u};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void path_in(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", tmpdir, name);
}

static void hexs(char *out, size_t cap, uint64_t h)
{
    snprintf(out, cap, "0x%016llx", (unsigned long long)h);
}

/* A v1 envelope of nb full blocks; seed varies the payloads. */
static size_t make_env(uint8_t **outp, const kvx_geometry *g, const uint64_t *h, uint32_t nb,
                       unsigned seed)
{
    size_t P = kvx_envelope_payload_bytes(1, g);
    uint16_t *pl = malloc(P * (nb ? nb : 1));
    kvx_envelope_block_in *in = calloc(nb ? nb : 1, sizeof *in);
    for (uint32_t b = 0; b < nb; b++) {
        for (size_t i = 0; i < P / 2; i++)
            pl[b * P / 2 + i] =
                kvx_f32_to_f16((float)((int)((i * 5 + b * 3 + seed * 7) % 17) - 8) / 4.0f);
        in[b] = (kvx_envelope_block_in){h[b], g->block_tokens, pl + b * P / 2, NULL};
    }
    size_t len;
    assert_int_equal(kvx_envelope_size(&len, 1, g, nb), 0);
    *outp = malloc(len);
    assert_int_equal(kvx_envelope_export(*outp, len, 1, g, in, nb), 0);
    free(in);
    free(pl);
    return len;
}

static void write_tokens(const char *path, const uint32_t *t, size_t n)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (size_t i = 0; i < n; i++) fprintf(f, "%u%s", t[i], i % 5 == 4 ? "\n" : " ");
    fclose(f);
}

static cli_run create_store_g(const char *dir, const kvx_geometry *g)
{
    char L[16], H[16], D[16], B[16];
    snprintf(L, sizeof L, "%u", g->num_layers);
    snprintf(H, sizeof H, "%u", g->kv_heads);
    snprintf(D, sizeof D, "%u", g->head_dim);
    snprintf(B, sizeof B, "%u", g->block_tokens);
    return CLI(NULL, "store", "create", dir, "-L", L, "-H", H, "-D", D, "-B", B, "--quant", "fp16",
               "--capacity", "64MiB");
}

static void cli_create_and_put(const char *dir, int with_tokens)
{
    cli_run r = create_store_g(dir, &G);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    if (with_tokens) r = CLI(NULL, "store", "put", dir, envp, "--tokens", tokp);
    else r = CLI(NULL, "store", "put", dir, envp);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvx-test-cli-trust-XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    path_in(base, sizeof base, "base");
    path_in(envp, sizeof envp, "seq.env");
    path_in(tokp, sizeof tokp, "seq.tokens");
    for (uint32_t i = 0; i < NT; i++) toks[i] = 1000 + i * 3;
    kvx_block_hashes(hashes, toks, NT, G.block_tokens);
    env_len = make_env(&env, &G, hashes, NBLOCKS, 0);
    write_bytes(envp, env, env_len);
    write_tokens(tokp, toks, NT);
    cli_create_and_put(base, 1);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rm_rf(tmpdir);
    free(env);
    return 0;
}

#define TIMED_OUT 999

/* The child's address-space limit in run_t (0: none; run_limited). */
static rlim_t child_as_limit;

/* Runs KVX_CLI (or prog when given) with stdin from in_fd (-1: /dev/null),
 * stdout into out_path (NULL: captured), for at most secs seconds: then it
 * is killed and rc is TIMED_OUT. */
static cli_run run_t(const char *prog, int in_fd, const char *out_path, double secs,
                     const char *const *args)
{
    char tmpl_o[] = "/tmp/kvx-trust-out-XXXXXX", tmpl_e[] = "/tmp/kvx-trust-err-XXXXXX";
    int fo = out_path ? open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644) : mkstemp(tmpl_o);
    int fe = mkstemp(tmpl_e);
    if (!out_path) unlink(tmpl_o);
    unlink(tmpl_e);
    assert_true(fo >= 0 && fe >= 0);
    const char *argv[64];
    int n = 0;
    argv[n++] = prog ? prog : KVX_CLI;
    for (; args[n - 1] && n < 63; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fi = in_fd >= 0 ? in_fd : open("/dev/null", O_RDONLY);
        dup2(fi, 0);
        dup2(fo, 1);
        dup2(fe, 2);
        signal(SIGPIPE, SIG_DFL);
        if (child_as_limit) {
            struct rlimit rl = {child_as_limit, child_as_limit};
            setrlimit(RLIMIT_AS, &rl);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st = 0, done = 0;
    struct timespec ts = {0, 5 * 1000 * 1000};
    for (double t0 = now_s(); now_s() - t0 < secs;) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
            done = 1;
            break;
        }
        nanosleep(&ts, NULL);
    }
    cli_run r;
    if (!done) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        r.rc = TIMED_OUT;
    } else {
        r.rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    }
    r.out = out_path ? calloc(1, 1) : harness_slurp(fo);
    r.err = harness_slurp(fe);
    close(fo);
    close(fe);
    if (r.rc == TIMED_OUT) fprintf(stderr, "timed out after %.1f s; stderr:\n%s\n", secs, r.err);
    return r;
}

#define RUN_T(in_fd, secs, ...) \
    run_t(NULL, (in_fd), NULL, (secs), (const char *const[]){__VA_ARGS__, NULL})

#define RUN_TO(out_path, ...) \
    run_t(NULL, -1, (out_path), 60, (const char *const[]){__VA_ARGS__, NULL})

/* A child that writes head, then repeats fill (or random bytes when fill
 * is NULL) into fd until the reader goes away. Returns its pid. */
static pid_t feeder(int fd, const void *head, size_t head_len, const char *fill, int other_end)
{
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(other_end); /* the reader's going away must end the writes */
        signal(SIGPIPE, SIG_DFL);
        const uint8_t *p = head;
        size_t done = 0;
        while (done < head_len) {
            ssize_t w = write(fd, p + done, head_len - done);
            if (w <= 0) _exit(0);
            done += (size_t)w;
        }
        static uint8_t buf[65536];
        uint64_t x = 0x9e3779b97f4a7c15ull;
        if (fill) {
            size_t fl = strlen(fill);
            for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)fill[i % fl];
        }
        for (;;) {
            if (!fill)
                for (size_t i = 0; i < sizeof buf; i++) {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    buf[i] = (uint8_t)(x >> 24);
                }
            if (write(fd, buf, sizeof buf) <= 0) _exit(0);
        }
    }
    return pid;
}

static void reap(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Runs the command with stdin fed as feeder() does. */
static cli_run run_fed(const void *head, size_t head_len, const char *fill, double secs,
                       const char *const *args)
{
    int p[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    pid_t f = feeder(p[1], head, head_len, fill, p[0]);
    close(p[1]);
    cli_run r = run_t(NULL, p[0], NULL, secs, args);
    close(p[0]);
    reap(f);
    return r;
}

#define RUN_FED(head, len, fill, ...) \
    run_fed((head), (len), (fill), 20, (const char *const[]){__VA_ARGS__, NULL})

/* A pid that no process has (a child that already exited). */
static pid_t dead_pid(void)
{
    pid_t p = fork();
    if (p == 0) _exit(0);
    waitpid(p, NULL, 0);
    return p;
}

/* Sets path's access and modification times secs into the past. */
static void age_file(const char *path, long secs)
{
    struct timespec t[2];
    assert_int_equal(clock_gettime(CLOCK_REALTIME, &t[0]), 0);
    t[0].tv_sec -= secs;
    t[1] = t[0];
    assert_int_equal(utimensat(AT_FDCWD, path, t, 0), 0);
}

static size_t count_substr(const char *s, const char *needle)
{
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

/* Names in dir containing needle. */
static int names_with(const char *dir, const char *needle)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strstr(de->d_name, needle)) n++;
    closedir(d);
    return n;
}

/* The sealed shard of dir/shards holding the block hash (its path in
 * out) and that block's entry index; -1 when none. */
static int shard_with(char *out, size_t cap, const char *dir, uint64_t hash)
{
    char sd[512], want[24];
    snprintf(sd, sizeof sd, "%s/shards", dir);
    hexs(want, sizeof want, hash);
    DIR *d = opendir(sd);
    assert_non_null(d);
    struct dirent *de;
    int found = -1;
    while (found < 0 && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(out, cap, "%s/%s", sd, de->d_name);
        cli_run r = CLI(NULL, "inspect", "--json", out);
        jval *v = r.rc == 0 ? jparse(r.out) : NULL;
        cli_run_free(&r);
        jval *ents = jget(v, "entries");
        for (size_t i = 0; ents && i < ents->n && found < 0; i++) {
            jval *h = jget(ents->items[i], "hash");
            if (h && h->t == JSTR && !strcmp(h->str, want)) found = (int)i;
        }
        jfree(v);
    }
    closedir(d);
    return found;
}

static int shard_files(const char *dir)
{
    char sd[512];
    snprintf(sd, sizeof sd, "%s/shards", dir);
    DIR *d = opendir(sd);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static int is_type(const char *path, mode_t type)
{
    struct stat st;
    return lstat(path, &st) == 0 && (st.st_mode & S_IFMT) == type;
}

static uint8_t *slurp_file(const char *path, size_t *n)
{
    return read_bytes(path, n);
}

/* PROMISE: TRUST-5, CLI-7 */
static void test_get_checks_every_page(void **state)
{
    (void)state;
    char st[320], out[320], shard[1024], h0[24], h1[24], h2[24];
    path_in(st, sizeof st, "damaged");
    path_in(out, sizeof out, "damaged.env");
    cli_create_and_put(st, 1);
    hexs(h0, sizeof h0, hashes[0]);
    hexs(h1, sizeof h1, hashes[1]);
    hexs(h2, sizeof h2, hashes[2]);
    cli_run r = CLI(NULL, "store", "get", st, "-o", out, "--format", "v1", h0, h1, h2);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    size_t n;
    uint8_t *b = slurp_file(out, &n);
    assert_int_equal(n, env_len);
    assert_memory_equal(b, env, env_len);
    free(b);
    unlink(out);

    /* Rot one byte of block 1's page: it is damaged, not missing, and
     * nothing is exported. */
    int e = shard_with(shard, sizeof shard, st, hashes[1]);
    assert_true(e >= 0);
    flip_bits(shard, page_offset(shard, (size_t)e) + 5, 0x20);
    r = CLI(NULL, "store", "get", st, "-o", out, "--format", "v1", h0, h1);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, h1));
    assert_non_null(strstr(r.err, "damaged"));
    assert_null(strstr(r.err, "not in the store"));
    assert_non_null(strstr(r.err, "kvx store verify"));
    assert_false(file_exists(out));
    cli_run_free(&r);
    /* v2 as well. */
    r = CLI(NULL, "store", "get", st, "-o", out, "--format", "v2", h1);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, h1));
    assert_false(file_exists(out));
    cli_run_free(&r);
    /* The good block is still served. */
    r = CLI(NULL, "store", "get", st, "-o", out, "--format", "v1", h0);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    b = slurp_file(out, &n);
    uint8_t *one;
    size_t one_len = make_env(&one, &G, hashes, 1, 0);
    assert_int_equal(n, one_len);
    assert_memory_equal(b, one, one_len);
    free(b);

    /* prefix: 1 block served, the damage named, exit 0; -o holds exactly
     * that block. */
    char tk[NT][16];
    const char *args[NT + 10] = {"store", "prefix", st, "-o", out, "--format", "v1"};
    for (int i = 0; i < NT; i++) {
        snprintf(tk[i], sizeof tk[i], "%u", toks[i]);
        args[7 + i] = tk[i];
    }
    args[7 + NT] = NULL;
    unlink(out);
    r = cli_runv(NULL, args);
    EXPECT_RC(r, 0);
    assert_true(!strncmp(r.out, "1 of 3 ", 7));
    assert_non_null(strstr(r.err, "damaged"));
    assert_non_null(strstr(r.err, "kvx store verify"));
    cli_run_free(&r);
    b = slurp_file(out, &n);
    assert_int_equal(n, one_len);
    assert_memory_equal(b, one, one_len);
    free(b);
    free(one);

    /* verify fails, and its hint does not promise that reindex mends a page. */
    r = CLI(NULL, "store", "verify", st);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "cannot be mended"));
    cli_run_free(&r);
}

/* PROMISE: TRUST-3 */
static void test_get_unverified_missing_ambiguous(void **state)
{
    (void)state;
    char st[320], out[320], h0[24], h2[24];
    path_in(st, sizeof st, "unverified");
    path_in(out, sizeof out, "unverified.env");
    cli_create_and_put(st, 0);
    hexs(h0, sizeof h0, hashes[0]);
    hexs(h2, sizeof h2, hashes[2]);
    /* Put without tokens: held, but never served by hash alone. Each
     * block not served is named with why; nothing written. */
    cli_run r = CLI(NULL, "store", "get", st, "-o", out, "--format", "v1", h0, "0x1234");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, h0));
    assert_non_null(strstr(r.err, "unverified"));
    assert_non_null(strstr(r.err, "0x0000000000001234 is not in the store"));
    assert_false(file_exists(out));
    cli_run_free(&r);
    /* ... nor by prefix: 0 served, exit 0, and -o a valid empty envelope. */
    char tk[NT][16];
    const char *args[NT + 10] = {"store", "prefix", st, "-o", out, "--format", "v2"};
    for (int i = 0; i < NT; i++) {
        snprintf(tk[i], sizeof tk[i], "%u", toks[i]);
        args[7 + i] = tk[i];
    }
    args[7 + NT] = NULL;
    r = cli_runv(NULL, args);
    EXPECT_RC(r, 0);
    assert_true(!strncmp(r.out, "0 of 3 ", 7));
    cli_run_free(&r);
    size_t n;
    uint8_t *b = slurp_file(out, &n);
    kvx_envelope pe;
    assert_int_equal(kvx_envelope_parse(&pe, b, n, NULL), 0);
    assert_int_equal(pe.n_blocks, 0);
    assert_int_equal(pe.version, 2);
    free(b);
    unlink(out);

    /* A put with the tokens makes them served. */
    r = CLI(NULL, "store", "put", st, envp, "--tokens", tokp);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    r = CLI(NULL, "store", "get", st, "-o", out, "--format", "v1", h0);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    /* --tokens: blocks picked from the prompt, in the order given. */
    r = CLI(NULL, "store", "get", st, "-o", out, "--format", "v1", "--tokens", tokp, h2, h0);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    b = slurp_file(out, &n);
    kvx_envelope_block blk;
    assert_int_equal(kvx_envelope_parse(&pe, b, n, NULL), 0);
    assert_int_equal(pe.n_blocks, 2);
    assert_int_equal(kvx_envelope_block_at(&blk, &pe, 0), 0);
    assert_true(blk.hash == hashes[2]);
    kvx_envelope whole;
    kvx_envelope_block wb;
    assert_int_equal(kvx_envelope_parse(&whole, env, env_len, NULL), 0);
    assert_int_equal(kvx_envelope_block_at(&wb, &whole, 2), 0);
    assert_memory_equal(blk.payload, wb.payload, pe.payload_bytes);
    free(b);
    /* A hash that is not one of the prompt's blocks. */
    unlink(out);
    r = CLI(NULL, "store", "get", st, "-o", out, "--format", "v1", "--tokens", tokp, "0x1234");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "0x0000000000001234"));
    assert_false(file_exists(out));
    cli_run_free(&r);

    /* Two prompts whose FNV chains collide: both stored, a get by hash is
     * ambiguous, --tokens gives each prompt its own bytes. */
    const kvx_geometry g2 = {1, 1, 4, 2, KVX_QUANT_FP16, 0};
    uint32_t ta[4] = {COLL2_A[0], COLL2_A[1], 7, 8}, tb[4] = {COLL2_B[0], COLL2_B[1], 7, 8};
    uint64_t ha[2], hb[2];
    kvx_block_hashes(ha, ta, 4, 2);
    kvx_block_hashes(hb, tb, 4, 2);
    assert_true(ha[0] == hb[0] && ha[1] == hb[1]);
    char cs[320], ea[320], eb[320], ka[320], kb[320], hh[24];
    path_in(cs, sizeof cs, "collide");
    path_in(ea, sizeof ea, "a.env");
    path_in(eb, sizeof eb, "b.env");
    path_in(ka, sizeof ka, "a.tokens");
    path_in(kb, sizeof kb, "b.tokens");
    uint8_t *enva, *envb;
    size_t la = make_env(&enva, &g2, ha, 2, 1), lb = make_env(&envb, &g2, hb, 2, 2);
    assert_int_equal(la, lb);
    assert_memory_not_equal(enva, envb, la);
    write_bytes(ea, enva, la);
    write_bytes(eb, envb, lb);
    write_tokens(ka, ta, 4);
    write_tokens(kb, tb, 4);
    r = create_store_g(cs, &g2);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    r = CLI(NULL, "store", "put", cs, ea, "--tokens", ka);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    r = CLI(NULL, "store", "put", cs, eb, "--tokens", kb);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    hexs(hh, sizeof hh, ha[1]);
    r = CLI(NULL, "store", "get", cs, "-o", out, "--format", "v1", hh);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, hh));
    assert_non_null(strstr(r.err, "ambiguous"));
    assert_non_null(strstr(r.err, "--tokens"));
    assert_false(file_exists(out));
    cli_run_free(&r);
    char h0a[24];
    hexs(h0a, sizeof h0a, ha[0]);
    const char *const who[2] = {ka, kb};
    const uint8_t *const want[2] = {enva, envb};
    for (int k = 0; k < 2; k++) {
        r = CLI(NULL, "store", "get", cs, "-o", out, "--format", "v1", "--tokens", who[k], h0a, hh);
        EXPECT_RC(r, 0);
        cli_run_free(&r);
        b = slurp_file(out, &n);
        assert_int_equal(n, la);
        assert_memory_equal(b, want[k], la);
        free(b);
    }
    free(enva);
    free(envb);
}

/* PROMISE: TRUST-6 */
static void test_prefix_output(void **state)
{
    (void)state;
    char out[320];
    path_in(out, sizeof out, "prefix.env");
    char tk[NT][16];
    const char *args[NT + 10] = {"store", "prefix", base, "-o", out, "--format", "v1"};
    for (int i = 0; i < NT; i++) {
        snprintf(tk[i], sizeof tk[i], "%u", toks[i]);
        args[7 + i] = tk[i];
    }
    args[7 + NT] = NULL;
    cli_run r = cli_runv(NULL, args);
    EXPECT_RC(r, 0);
    assert_true(!strncmp(r.out, "3 of 3 ", 7));
    assert_string_equal(r.err, "");
    cli_run_free(&r);
    size_t n;
    uint8_t *b = slurp_file(out, &n);
    assert_int_equal(n, env_len);
    assert_memory_equal(b, env, env_len);
    free(b);

    /* -o -: standard output is the envelope alone (the count printed
     * after it made a file of `> file` one that put refuses); the count
     * goes to standard error */
    char sh[4000], so[320], se[320];
    path_in(so, sizeof so, "prefix.stdout");
    path_in(se, sizeof se, "prefix.stderr");
    int at = snprintf(sh, sizeof sh, "'%s' store prefix '%s' -o - --format v1", KVX_CLI, base);
    for (int i = 0; i < NT; i++) at += snprintf(sh + at, sizeof sh - (size_t)at, " %u", toks[i]);
    snprintf(sh + at, sizeof sh - (size_t)at, " >'%s' 2>'%s'", so, se);
    assert_int_equal(system(sh), 0);
    b = slurp_file(so, &n);
    assert_int_equal(n, env_len);
    assert_memory_equal(b, env, env_len);
    free(b);
    b = slurp_file(se, &n);
    assert_true(n > 7 && !strncmp((char *)b, "3 of 3 ", 7));
    free(b);
    unlink(so);
    unlink(se);

    /* Nothing served (a different first token; fewer tokens than B). */
    r = CLI(NULL, "store", "prefix", base, "-o", out, "--format", "v1", "7", "7", "7", "7");
    EXPECT_RC(r, 0);
    assert_true(!strncmp(r.out, "0 of 1 ", 7));
    cli_run_free(&r);
    b = slurp_file(out, &n);
    kvx_envelope pe;
    assert_int_equal(kvx_envelope_parse(&pe, b, n, NULL), 0);
    assert_int_equal(pe.n_blocks, 0);
    free(b);
    r = CLI(NULL, "store", "prefix", base, "--format", "v2", "-o", out, "5");
    EXPECT_RC(r, 0);
    assert_true(!strncmp(r.out, "0 of 0 ", 7));
    cli_run_free(&r);
    b = slurp_file(out, &n);
    assert_int_equal(kvx_envelope_parse(&pe, b, n, NULL), 0);
    assert_int_equal(pe.n_blocks, 0);
    assert_int_equal(pe.version, 2);
    free(b);

    /* Usage: -o without --format, --format without -o, a bad format. */
    const char *const bad[][9] = {
        {"store", "prefix", base, "-o", out, "1", NULL},
        {"store", "prefix", base, "--format", "v1", "1", NULL},
        {"store", "prefix", base, "-o", out, "--format", "v4", "1", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = cli_runv(NULL, bad[i]);
        EXPECT_RC(r, 2);
        cli_run_free(&r);
    }
}

/* A child that reads the FIFO (opened here first, so a writer finds a
 * reader) into the file dst until the writer is done. */
static pid_t fifo_reader(const char *fifo, const char *dst)
{
    int rfd = open(fifo, O_RDONLY | O_NONBLOCK);
    assert_true(rfd >= 0);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int fl = fcntl(rfd, F_GETFL);
        fcntl(rfd, F_SETFL, fl & ~O_NONBLOCK);
        int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        char buf[65536];
        size_t total = 0;
        for (int idle = 0; idle < 3000;) {
            ssize_t r = read(rfd, buf, sizeof buf);
            if (r > 0) {
                if (write(out, buf, (size_t)r) != r) _exit(3);
                total += (size_t)r;
                continue;
            }
            if (r == 0 && total > 0) break; /* the writer closed it */
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL); /* no writer yet */
            idle++;
        }
        close(out);
        _exit(0);
    }
    close(rfd);
    return pid;
}

/* PROMISE: BOUND-1 */
static void test_outputs_never_replace_special_files(void **state)
{
    (void)state;
    char fifo[320], got[320], link[320], target[320], dang[320], adir[320], out[320], dev[320],
        h0[24], h1[24], h2[24], ref[320];
    path_in(fifo, sizeof fifo, "out.fifo");
    path_in(got, sizeof got, "fifo.got");
    path_in(link, sizeof link, "out.link");
    path_in(target, sizeof target, "link.target");
    path_in(dang, sizeof dang, "dangling.link");
    path_in(adir, sizeof adir, "a.dir");
    path_in(out, sizeof out, "regular.env");
    path_in(dev, sizeof dev, "null.dev");
    path_in(ref, sizeof ref, "ref.kvx");
    hexs(h0, sizeof h0, hashes[0]);
    hexs(h1, sizeof h1, hashes[1]);
    hexs(h2, sizeof h2, hashes[2]);
    assert_int_equal(mkfifo(fifo, 0600), 0);

    /* A FIFO nobody reads: refused at once, still a FIFO. */
    cli_run r = RUN_T(-1, 20, "store", "get", base, "-o", fifo, "--format", "v1", h0, h1, h2);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "no process is reading"));
    assert_true(is_type(fifo, S_IFIFO));
    cli_run_free(&r);
    r = RUN_T(-1, 20, "convert", envp, "-o", fifo);
    EXPECT_RC(r, 1);
    assert_true(is_type(fifo, S_IFIFO));
    cli_run_free(&r);

    /* A FIFO with a reader gets the bytes; it stays a FIFO. */
    pid_t rd = fifo_reader(fifo, got);
    r = RUN_T(-1, 20, "store", "get", base, "-o", fifo, "--format", "v1", h0, h1, h2);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    waitpid(rd, NULL, 0);
    size_t n;
    uint8_t *b = slurp_file(got, &n);
    assert_int_equal(n, env_len);
    assert_memory_equal(b, env, env_len);
    free(b);
    assert_true(is_type(fifo, S_IFIFO));
    /* A shard into a FIFO: the same bytes as into a file. */
    r = CLI(NULL, "convert", envp, "-o", ref);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    rd = fifo_reader(fifo, got);
    r = RUN_T(-1, 20, "convert", envp, "-o", fifo);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    waitpid(rd, NULL, 0);
    size_t rn;
    uint8_t *rb = slurp_file(ref, &rn);
    b = slurp_file(got, &n);
    assert_int_equal(n, rn);
    assert_memory_equal(b, rb, rn);
    free(b);
    free(rb);
    assert_true(is_type(fifo, S_IFIFO));

    /* A character device is written into and stays one: /dev/null itself,
     * and one made here when this process may (root). */
    const char *devs[2] = {"/dev/null", dev};
    int ndev = mknod(dev, S_IFCHR | 0666, makedev(1, 3)) == 0 ? 2 : 1;
    for (int i = 0; i < ndev; i++) {
        struct stat before, after;
        assert_int_equal(stat(devs[i], &before), 0);
        r = RUN_T(-1, 20, "store", "get", base, "-o", devs[i], "--format", "v2", h0);
        EXPECT_RC(r, 0);
        cli_run_free(&r);
        r = RUN_T(-1, 20, "convert", envp, "-o", devs[i]);
        EXPECT_RC(r, 0);
        cli_run_free(&r);
        r = RUN_T(-1, 20, "convert", ref, "-o", devs[i], "--format", "v1");
        EXPECT_RC(r, 0);
        cli_run_free(&r);
        assert_true(is_type(devs[i], S_IFCHR));
        assert_int_equal(lstat(devs[i], &after), 0);
        assert_true(after.st_rdev == before.st_rdev && after.st_ino == before.st_ino);
    }

    /* A symlink is neither followed nor replaced, a dangling one included. */
    write_bytes(target, "keep", 4);
    assert_int_equal(symlink(target, link), 0);
    path_in(got, sizeof got, "never-created");
    assert_int_equal(symlink(got, dang), 0);
    const char *links[2] = {link, dang};
    for (int i = 0; i < 2; i++) {
        r = CLI(NULL, "store", "get", base, "-o", links[i], "--format", "v1", h0);
        EXPECT_RC(r, 1);
        assert_non_null(strstr(r.err, "symbolic link"));
        cli_run_free(&r);
        r = CLI(NULL, "convert", envp, "-o", links[i]);
        EXPECT_RC(r, 1);
        cli_run_free(&r);
        r = CLI(NULL, "convert", ref, "-o", links[i], "--format", "v2");
        EXPECT_RC(r, 1);
        cli_run_free(&r);
        assert_true(is_type(links[i], S_IFLNK));
    }
    b = slurp_file(target, &n);
    assert_int_equal(n, 4);
    assert_memory_equal(b, "keep", 4);
    free(b);
    assert_false(file_exists(got));
    r = CLI(NULL, "store", "get", base, "-o", "/dev/stdout", "--format", "v1", h0);
    EXPECT_RC(r, 1); /* a symlink too: '-o -' is the way */
    assert_non_null(strstr(r.err, "-o -"));
    cli_run_free(&r);

    /* A directory is refused by name. */
    assert_int_equal(mkdir(adir, 0700), 0);
    r = CLI(NULL, "store", "get", base, "-o", adir, "--format", "v1", h0);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "a.dir"));
    assert_non_null(strstr(r.err, "directory"));
    cli_run_free(&r);
    assert_true(is_type(adir, S_IFDIR));

    /* A regular file is replaced, leaving no temporary file behind. */
    write_bytes(out, "old", 3);
    r = CLI(NULL, "store", "get", base, "-o", out, "--format", "v1", h0, h1, h2);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    b = slurp_file(out, &n);
    assert_int_equal(n, env_len);
    assert_memory_equal(b, env, env_len);
    free(b);
    assert_int_equal(names_with(tmpdir, "kvx-tmp"), 0);
    assert_int_equal(names_with(tmpdir, ".tmp."), 0);

    /* "-o -" is standard output. */
    path_in(got, sizeof got, "stdout.env");
    r = RUN_TO(got, "store", "get", base, "-o", "-", "--format", "v1", h0, h1, h2);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    b = slurp_file(got, &n);
    assert_int_equal(n, env_len);
    assert_memory_equal(b, env, env_len);
    free(b);
}

/* A big envelope (96 MiB: 48 blocks of 2 MiB) for the kill -9 tests. */
static const kvx_geometry GBIG = {32, 8, 128, 16, KVX_QUANT_FP16, 0};

#define NBIG 48

static void write_big_env(const char *path)
{
    uint64_t h[NBIG];
    for (int i = 0; i < NBIG; i++) h[i] = 0x5000 + (uint64_t)i;
    size_t P = kvx_envelope_payload_bytes(1, &GBIG);
    uint8_t *pl = malloc(P);
    for (size_t i = 0; i < P; i++) pl[i] = (uint8_t)(i % 61 < 60 ? i % 61 : 0); /* finite f16 */
    kvx_envelope_block_in in[NBIG];
    for (int i = 0; i < NBIG; i++) in[i] = (kvx_envelope_block_in){h[i], 16, pl, NULL};
    size_t len;
    assert_int_equal(kvx_envelope_size(&len, 1, &GBIG, NBIG), 0);
    uint8_t *e = malloc(len);
    assert_int_equal(kvx_envelope_export(e, len, 1, &GBIG, in, NBIG), 0);
    write_bytes(path, e, len);
    free(e);
    free(pl);
}

static pid_t spawn(const char *const *args)
{
    const char *argv[32];
    int n = 0;
    argv[n++] = KVX_CLI;
    for (; args[n - 1] && n < 31; n++) argv[n] = args[n - 1];
    argv[n] = NULL;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        int dn = open("/dev/null", O_RDWR);
        dup2(dn, 0);
        dup2(dn, 1);
        dup2(dn, 2);
        execv(KVX_CLI, (char *const *)argv);
        _exit(127);
    }
    return pid;
}

/* 1 when pid has an open descriptor on an unnamed (O_TMPFILE) or named
 * temporary file in dir. */
static int writing_tmp(pid_t pid, const char *dir)
{
    char fdd[64];
    snprintf(fdd, sizeof fdd, "/proc/%ld/fd", (long)pid);
    DIR *d = opendir(fdd);
    if (!d) return 0;
    struct dirent *de;
    int yes = 0;
    while (!yes && (de = readdir(d))) {
        char lp[384], tgt[1024];
        snprintf(lp, sizeof lp, "%s/%s", fdd, de->d_name);
        ssize_t k = readlink(lp, tgt, sizeof tgt - 1);
        if (k <= 0) continue;
        tgt[k] = '\0';
        yes = !strncmp(tgt, dir, strlen(dir)) && (strstr(tgt, "(deleted)") || strstr(tgt, "kvx-tmp"));
    }
    closedir(d);
    return yes;
}

static int run_and_kill(const char *const *args, const char *dir)
{
    pid_t pid = spawn(args);
    int caught = 0;
    struct timespec ts = {0, 200 * 1000};
    for (int i = 0; i < 200000 && !caught; i++) {
        if (writing_tmp(pid, dir) || names_with(dir, "kvx-tmp") > 0) {
            kill(pid, SIGKILL);
            caught = 1;
            break;
        }
        if (waitpid(pid, NULL, WNOHANG) == pid) return 0;
        nanosleep(&ts, NULL);
    }
    if (!caught) kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return caught;
}

/* Runs KVX_CLI with args as PID 1 of a new PID namespace (what a kvx in a
 * sibling container looks like); its exit status, or -1 where no
 * namespace can be made (not root). */
static int run_as_pid1(const char *const *args)
{
    pid_t p = fork();
    assert_true(p >= 0);
    if (p == 0) {
        if (unshare(CLONE_NEWPID) != 0) _exit(200);
        pid_t g = fork();
        if (g < 0) _exit(201);
        if (g == 0) {
            const char *argv[16] = {KVX_CLI};
            size_t n = 1;
            for (; args[n - 1] && n < 15; n++) argv[n] = args[n - 1];
            argv[n] = NULL;
            int nul = open("/dev/null", O_RDWR);
            dup2(nul, 1);
            dup2(nul, 2);
            execv(KVX_CLI, (char *const *)argv);
            _exit(202);
        }
        int st;
        if (waitpid(g, &st, 0) != g || !WIFEXITED(st)) _exit(203);
        _exit(WEXITSTATUS(st));
    }
    int st;
    assert_int_equal(waitpid(p, &st, 0), p);
    assert_true(WIFEXITED(st));
    return WEXITSTATUS(st) == 200 ? -1 : WEXITSTATUS(st);
}

/* A kvx that is PID 1 of its namespace (a container's entrypoint) sees a
 * sibling container's temporary of "pid 1" as its own leftover: it was
 * removed at once while the sibling wrote it. The 10-minute rule now
 * holds for our own pid too. */
/* PROMISE: BOUND-1 */
static void test_stale_tmp_of_own_pid_kept_while_young(void **state)
{
    (void)state;
    char kd[320], small[400], young[400], old[400];
    path_in(kd, sizeof kd, "pid1");
    assert_int_equal(mkdir(kd, 0700), 0);
    snprintf(small, sizeof small, "%s/small.kvx", kd);
    snprintf(young, sizeof young, "%s/.kvx-tmp.1.00000000c0ffee01", kd);
    snprintf(old, sizeof old, "%s/.kvx-tmp.1.00000000c0ffee02", kd);
    write_bytes(young, "x", 1);
    write_bytes(old, "x", 1);
    age_file(old, 3600);
    int rc = run_as_pid1((const char *const[]){"convert", envp, "-o", small, NULL});
    if (rc == -1) {
        fprintf(stderr, "note: no PID namespace here (not root): skipped\n");
        skip();
    }
    assert_int_equal(rc, 0);
    assert_true(file_exists(small));
    if (!file_exists(young)) fail_msg("DEFECT: a kvx of pid 1 removed a fresh temporary of another pid 1");
    assert_false(file_exists(old)); /* an hour old: a leftover */
    unlink(young);
}

/* PROMISE: BOUND-1 */
static void test_kill9_leaves_no_temporary(void **state)
{
    (void)state;
    char kd[320], big[400], bigk[400], big2[400], small[400], stale[4][400];
    path_in(kd, sizeof kd, "kill");
    assert_int_equal(mkdir(kd, 0700), 0);
    snprintf(big, sizeof big, "%s/big.env", tmpdir); /* outside kd */
    snprintf(bigk, sizeof bigk, "%s/big.kvx", kd);
    snprintf(big2, sizeof big2, "%s/big2.env", kd);
    snprintf(small, sizeof small, "%s/small.kvx", kd);
    write_big_env(big);

    /* shard -> envelope: written into an O_TMPFILE, so a kill at any time
     * leaves no file at all. */
    cli_run r = CLI(NULL, "convert", big, "-o", bigk);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    int caught = 0;
    for (int i = 0; i < 5; i++) {
        caught += run_and_kill((const char *const[]){"convert", bigk, "-o", big2, "--format", "v1",
                                                     NULL}, kd);
        assert_int_equal(names_with(kd, "kvx-tmp"), 0);
        assert_int_equal(names_with(kd, ".tmp."), 0);
        assert_false(file_exists(big2));
    }
    if (!caught) fprintf(stderr, "note: no kill landed during the envelope write\n");

    /* envelope -> shard: the shard writer's temporary file may survive the
     * kill; the next command writing there removes it. */
    unlink(bigk);
    caught = run_and_kill((const char *const[]){"convert", big, "-o", bigk, NULL}, kd);
    if (!caught) fprintf(stderr, "note: no kill landed during the shard write\n");
    assert_false(file_exists(bigk));
    /* Planted leftovers: two of a dead process, an hour old; one of a live
     * one; one of a dead pid written a moment ago (a kvx in another PID
     * namespace or on another host sharing the directory looks dead here
     * while it writes). */
    pid_t dead = dead_pid();
    snprintf(stale[0], sizeof stale[0], "%s/.x.kvx.kvx-tmp.%ld", kd, (long)dead);
    snprintf(stale[1], sizeof stale[1], "%s/..x.kvx.kvx-tmp.%ld.tmp.%ld.00000000deadbeef", kd,
             (long)dead, (long)dead);
    snprintf(stale[2], sizeof stale[2], "%s/.y.env.kvx-tmp.%ld", kd, (long)getpid());
    snprintf(stale[3], sizeof stale[3], "%s/.kvx-tmp.%ld.00000000c0ffee00", kd, (long)dead);
    for (int i = 0; i < 4; i++) write_bytes(stale[i], "x", 1);
    for (int i = 0; i < 2; i++) age_file(stale[i], 3600);
    r = CLI(NULL, "convert", envp, "-o", small);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    assert_false(file_exists(stale[0]));
    assert_false(file_exists(stale[1]));
    assert_true(file_exists(stale[2])); /* its process still runs */
    assert_true(file_exists(stale[3])); /* written 10 minutes ago or less */
    age_file(stale[3], 11 * 60);
    r = CLI(NULL, "convert", envp, "-o", small);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    assert_false(file_exists(stale[3]));
    unlink(stale[2]);
    assert_int_equal(names_with(kd, "kvx-tmp"), 0);
    assert_int_equal(names_with(kd, ".tmp."), 0);
    unlink(big);
}

static void put_le32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

/* A v1 header of G's geometry declaring n blocks. */
static void header(uint8_t h[28], uint32_t n)
{
    memcpy(h, "TLKV", 4);
    h[4] = 1, h[5] = 0, h[6] = 1, h[7] = 0;
    put_le32(h + 8, n);
    put_le32(h + 12, G.block_tokens);
    put_le32(h + 16, G.num_layers);
    put_le32(h + 20, G.kv_heads);
    put_le32(h + 24, G.head_dim);
}

/* PROMISE: BOUND-1 */
static void test_inputs_are_bounded(void **state)
{
    (void)state;
    char out[320], fifo[320], sock[320];
    path_in(out, sizeof out, "bounded.kvx");
    path_in(fifo, sizeof fifo, "in.fifo");
    path_in(sock, sizeof sock, "in.sock");

    /* Endless devices and streams end promptly. */
    cli_run r = RUN_T(-1, 20, "convert", "/dev/zero", "-o", out);
    EXPECT_RC(r, 1);
    cli_run_free(&r);
    r = RUN_T(-1, 20, "convert", "/dev/urandom", "-o", out);
    EXPECT_RC(r, 1);
    cli_run_free(&r);
    r = RUN_T(-1, 20, "store", "put", base, "/dev/zero");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "/dev/zero"));
    cli_run_free(&r);
    r = RUN_FED(NULL, 0, NULL, "convert", "-", "-o", out); /* head -c 10G /dev/urandom | */
    EXPECT_RC(r, 1);
    cli_run_free(&r);
    assert_false(file_exists(out));

    /* A header declaring more than the cap (4 GiB), or than a lowered cap. */
    uint8_t h[28];
    header(h, 20u * 1000 * 1000); /* 20e6 * (12 + 256) + 32 bytes = 5.4 GB */
    r = RUN_FED(h, sizeof h, NULL, "convert", "-", "-o", out);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "limit"));
    cli_run_free(&r);
    r = RUN_FED(h, sizeof h, NULL, "store", "put", base, "-");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "limit"));
    cli_run_free(&r);
    setenv("KVX_CLI_ENVELOPE_CAP", "64KiB", 1);
    header(h, 1000); /* 268 KB */
    r = RUN_FED(h, sizeof h, "\1", "convert", "-", "-o", out);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "limit"));
    cli_run_free(&r);
    unsetenv("KVX_CLI_ENVELOPE_CAP");
    /* The first bad field is named: a dtype that is not v1's. */
    header(h, 1);
    h[6] = 3;
    r = RUN_FED(h, sizeof h, NULL, "convert", "-", "-o", out);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "dtype"));
    cli_run_free(&r);
    assert_false(file_exists(out));

    /* A valid envelope followed by endless bytes: read to its declared end
     * and no further. */
    r = RUN_FED(env, env_len, NULL, "convert", "-", "-o", out);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    jval *v = inspect_json(out);
    assert_int_equal(jget(v, "entries")->n, NBLOCKS);
    jfree(v);
    r = RUN_FED(env, env_len, "garbage", "store", "put", base, "-", "--tokens", tokp);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "0 new block"));
    cli_run_free(&r);

    /* Token text: a device, an endless stream past a lowered cap. */
    r = RUN_T(-1, 20, "store", "put", base, envp, "--tokens", "/dev/zero");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "NUL"));
    cli_run_free(&r);
    r = RUN_T(-1, 20, "store", "put", base, envp, "--tokens", "/dev/urandom");
    EXPECT_RC(r, 1);
    cli_run_free(&r);
    r = RUN_T(-1, 20, "store", "get", base, "-o", out, "--format", "v1", "--tokens", "/dev/zero", "1");
    EXPECT_RC(r, 1);
    cli_run_free(&r);
    setenv("KVX_CLI_TEXT_CAP", "4KiB", 1);
    r = RUN_FED(NULL, 0, "1 2 3 4 ", "hash", "-b", "2");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "more than 4.00 KiB"));
    cli_run_free(&r);
    unsetenv("KVX_CLI_TEXT_CAP");
    r = RUN_FED(NULL, 0, NULL, "hash", "-b", "2"); /* binary: stops at once, usage */
    EXPECT_RC(r, 2);
    cli_run_free(&r);

    /* Where a shard belongs, anything but a regular file is refused by
     * type, without blocking (this FIFO never gets a writer). */
    assert_int_equal(mkfifo(fifo, 0600), 0);
    int sfd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    size_t sl = strlen(sock);
    assert_true(sl < sizeof sa.sun_path);
    memcpy(sa.sun_path, sock, sl + 1);
    assert_int_equal(bind(sfd, (struct sockaddr *)&sa, sizeof sa), 0);
    const struct {
        const char *path, *type;
    } odd[] = {{fifo, "FIFO"}, {"/dev/zero", "character device"}, {tmpdir, "directory"},
               {sock, "socket"}};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
        r = RUN_T(-1, 20, "inspect", odd[i].path);
        EXPECT_RC(r, 1);
        assert_non_null(strstr(r.err, odd[i].path));
        assert_non_null(strstr(r.err, odd[i].type));
        cli_run_free(&r);
        r = RUN_T(-1, 20, "verify", odd[i].path);
        EXPECT_RC(r, 1);
        assert_non_null(strstr(r.out, odd[i].path));
        assert_non_null(strstr(r.out, odd[i].type));
        cli_run_free(&r);
        if (strcmp(odd[i].type, "directory") != 0) { /* a directory is a store to warmup */
            r = RUN_T(-1, 20, "warmup", "--sink", "discard", odd[i].path);
            EXPECT_RC(r, 1);
            assert_non_null(strstr(r.err, odd[i].path));
            assert_non_null(strstr(r.err, odd[i].type));
            cli_run_free(&r);
        }
        r = RUN_T(-1, 20, "convert", odd[i].path, "-o", out, "--format", "v1");
        EXPECT_RC(r, 1);
        assert_non_null(strstr(r.err, odd[i].path));
        cli_run_free(&r);
    }
    close(sfd);
}

/* A writer holding dir (prog_hold_writer) until release is closed. */
typedef struct held_writer {
    pid_t pid;
    int release, ready; /* the holder's stdin (close: it closes the store and exits); its stdout */
    char want[48];      /* "pid N": how a refused writer names the holder */
} held_writer;

/* Starts the holder and waits until it says it holds dir. */
static held_writer hold_writer(const char *dir)
{
    char prog[512];
    snprintf(prog, sizeof prog, "%s/prog_hold_writer", KVX_TEST_BINARY_DIR);
    int to_child[2], from_child[2];
    /* Close-on-exec: no other child may keep the holder's stdin open. */
    assert_int_equal(pipe2(to_child, O_CLOEXEC), 0);
    assert_int_equal(pipe2(from_child, O_CLOEXEC), 0);
    fflush(stdout);
    fflush(stderr);
    held_writer h;
    h.pid = fork();
    if (h.pid == 0) {
        dup2(to_child[0], 0);
        dup2(from_child[1], 1);
        execl(prog, prog, dir, (char *)NULL);
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    h.release = to_child[1];
    h.ready = from_child[0];
    char line[64] = {0};
    ssize_t k = read(h.ready, line, sizeof line - 1);
    assert_true(k > 6 && !strncmp(line, "ready ", 6));
    snprintf(h.want, sizeof h.want, "pid %ld", (long)h.pid);
    return h;
}

/* PROMISE: CLI-4 */
static void test_writers_wait_or_not(void **state)
{
    (void)state;
    char ws[320];
    path_in(ws, sizeof ws, "held");
    cli_create_and_put(ws, 0);
    held_writer h = hold_writer(ws);

    /* --no-wait: at once, naming the holder. */
    double t0 = now_s();
    cli_run r = RUN_T(-1, 20, "store", "put", "--no-wait", ws, envp, "--tokens", tokp);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, h.want));
    assert_true(now_s() - t0 < 5);
    cli_run_free(&r);
    r = RUN_T(-1, 20, "store", "reindex", ws, "--no-wait");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, h.want));
    cli_run_free(&r);
    /* --wait N: gives up after N seconds. */
    t0 = now_s();
    r = RUN_T(-1, 20, "store", "gc", ws, "--wait", "0.6");
    EXPECT_RC(r, 1);
    double took = now_s() - t0;
    assert_true(took >= 0.55 && took < 10);
    assert_non_null(strstr(r.err, h.want));
    assert_non_null(strstr(r.err, "gave up"));
    cli_run_free(&r);

    /* The default waits, saying once who holds the store, and goes on when
     * the holder is done. */
    char errp[320];
    path_in(errp, sizeof errp, "wait.err");
    fflush(stdout);
    fflush(stderr);
    pid_t put = fork();
    if (put == 0) {
        int fe = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        int dn = open("/dev/null", O_RDWR);
        dup2(dn, 0);
        dup2(dn, 1);
        dup2(fe, 2);
        execl(KVX_CLI, KVX_CLI, "store", "put", ws, envp, "--tokens", tokp, (char *)NULL);
        _exit(127);
    }
    struct timespec ts = {0, 800 * 1000 * 1000};
    nanosleep(&ts, NULL);
    assert_int_equal(waitpid(put, NULL, WNOHANG), 0); /* still waiting */
    size_t n;
    char *msg = (char *)read_bytes(errp, &n);
    msg[n] = '\0';
    assert_int_equal(count_substr(msg, "waiting for"), 1);
    assert_non_null(strstr(msg, h.want));
    free(msg);
    close(h.release); /* the holder closes the store and exits */
    int st = 0;
    assert_int_equal(waitpid(h.pid, &st, 0), h.pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    for (int i = 0; i < 2000 && waitpid(put, &st, WNOHANG) == 0; i++) {
        struct timespec t = {0, 10 * 1000 * 1000};
        nanosleep(&t, NULL);
    }
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    msg = (char *)read_bytes(errp, &n);
    msg[n] = '\0';
    assert_int_equal(count_substr(msg, "waiting for"), 1);
    free(msg);
    close(h.ready);

    /* Usage. */
    const char *const bad[][7] = {
        {"store", "put", ws, envp, "--wait", "soon", NULL},
        {"store", "gc", ws, "--wait", "-1", NULL},
        {"store", "reindex", ws, "--wait", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = cli_runv(NULL, bad[i]);
        EXPECT_RC(r, 2);
        cli_run_free(&r);
    }
}

/* PROMISE: RECOVER-7 */
static void test_hints_fit_the_problem(void **state)
{
    (void)state;
    char lost[320], idx[400], empty[320], warm[320], e2[320], t2[320], shard[1024], sa[320],
        sb[320];
    path_in(lost, sizeof lost, "lost");
    cli_create_and_put(lost, 1);
    /* A lost index is a reindex away, not a new store. */
    snprintf(idx, sizeof idx, "%s/index", lost);
    rm_rf(idx);
    cli_run r = CLI(NULL, "store", "stat", lost);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "kvx store reindex"));
    assert_null(strstr(r.err, "store create"));
    cli_run_free(&r);
    /* ... and the hint works. */
    r = CLI(NULL, "store", "reindex", lost);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    char t0[16], t1[16], t2s[16], t3[16];
    snprintf(t0, sizeof t0, "%u", toks[0]);
    snprintf(t1, sizeof t1, "%u", toks[1]);
    snprintf(t2s, sizeof t2s, "%u", toks[2]);
    snprintf(t3, sizeof t3, "%u", toks[3]);
    r = CLI(NULL, "store", "prefix", lost, t0, t1, t2s, t3);
    EXPECT_RC(r, 0);
    assert_true(!strncmp(r.out, "1 of 1 ", 7));
    cli_run_free(&r);
    /* Not a store at all: create is the hint. */
    path_in(empty, sizeof empty, "empty.dir");
    assert_int_equal(mkdir(empty, 0700), 0);
    r = CLI(NULL, "store", "stat", empty);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "kvx store create"));
    cli_run_free(&r);

    /* Geometry or capacity no store can have: usage errors. */
    const char *const bad[][16] = {
        {"store", "create", "x", "-L", "1", "-H", "1", "-D", "1", "-B", "70000", "-q", "fp16", NULL},
        {"store", "create", "x", "-L", "70000", "-H", "1", "-D", "1", "-B", "4", "-q", "fp16", NULL},
        {"store", "create", "x", "-L", "65535", "-H", "65535", "-D", "65535", "-B", "65535", "-q",
         "fp16", NULL},
        {"store", "create", "x", "-L", "2", "-H", "1", "-D", "8", "-B", "4", "-q", "fp16",
         "--capacity", "1", NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        r = cli_runv(NULL, bad[i]);
        EXPECT_RC(r, 2);
        cli_run_free(&r);
        assert_false(file_exists("x"));
    }

    /* warmup names every shard it cannot open, warms up the rest, exit 1. */
    path_in(warm, sizeof warm, "warm");
    cli_create_and_put(warm, 1);
    uint32_t t[8];
    uint64_t h[2];
    for (int i = 0; i < 8; i++) t[i] = 5000 + (uint32_t)i;
    kvx_block_hashes(h, t, 8, 4);
    uint8_t *e;
    size_t el = make_env(&e, &G, h, 2, 3);
    path_in(e2, sizeof e2, "second.env");
    path_in(t2, sizeof t2, "second.tokens");
    write_bytes(e2, e, el);
    free(e);
    write_tokens(t2, t, 8);
    r = CLI(NULL, "store", "put", warm, e2, "--tokens", t2);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    assert_int_equal(shard_files(warm), 2);
    assert_true(shard_with(shard, sizeof shard, warm, h[0]) >= 0);
    flip_bits(shard, 20, 0x01); /* a header field: the meta CRC fails */
    const char *name = strrchr(shard, '/') + 1;
    r = CLI(NULL, "warmup", "--sink", "discard", warm);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, name));
    assert_non_null(strstr(r.out, "warmed up 3 page(s)"));
    cli_run_free(&r);
    /* Files: each bad one named. */
    path_in(sa, sizeof sa, "not-a-shard.kvx");
    path_in(sb, sizeof sb, "missing.kvx");
    write_bytes(sa, "hello", 5);
    char good[1024];
    assert_true(shard_with(good, sizeof good, warm, hashes[0]) >= 0);
    r = CLI(NULL, "warmup", "--json", "--sink", "discard", good, sa, sb, shard);
    jval *v = run_json(&r, 1);
    assert_non_null(strstr(r.err, "not-a-shard.kvx"));
    assert_non_null(strstr(r.err, "missing.kvx"));
    assert_non_null(strstr(r.err, name));
    assert_int_equal(jget(v, "unopened")->n, 3);
    assert_int_equal((int)jget(v, "pages")->num, 3);
    jfree(v);
    cli_run_free(&r);
}

/* run_t with the child's address space limited to 2 GiB (not under
 * AddressSanitizer, whose shadow needs terabytes of it). */
static cli_run run_limited(int in_fd, double secs, const char *const *args)
{
#if !defined(__SANITIZE_ADDRESS__)
    child_as_limit = (rlim_t)2 << 30;
#endif
    cli_run r = run_t(NULL, in_fd, NULL, secs, args);
    child_as_limit = 0;
    return r;
}

#define RUN_LIMITED(in_fd, ...) run_limited((in_fd), 30, (const char *const[]){__VA_ARGS__, NULL})

/* A trace line of n hash ids 0..n-1, whole blocks. */
static void write_trace_line(FILE *f, size_t n)
{
    fprintf(f, "{\"timestamp\": 0, \"input_length\": %zu, \"hash_ids\": [", n * 512);
    for (size_t i = 0; i < n; i++) fprintf(f, "%s%zu", i ? ", " : "", i);
    fputs("]}\n", f);
}

/* PROMISE: BOUND-2 */
static void test_demo_trace_bounded(void **state)
{
    (void)state;
    char fifo[320], huge[320], capd[320], capt[320];
    path_in(fifo, sizeof fifo, "trace.fifo");
    path_in(huge, sizeof huge, "huge.jsonl");
    path_in(capd, sizeof capd, "small-store");
    path_in(capt, sizeof capt, "cap.jsonl");

    /* A device is refused by type (getline grew one line of /dev/zero
     * until memory ran out, then said the trace held no requests). */
    cli_run r = RUN_LIMITED(-1, "demo", "--trace", "/dev/zero");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "/dev/zero"));
    assert_non_null(strstr(r.err, "character device"));
    cli_run_free(&r);

    /* A FIFO no process writes to reads as empty (fopen waited forever). */
    assert_int_equal(mkfifo(fifo, 0600), 0);
    r = RUN_LIMITED(-1, "demo", "--trace", fifo);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "no requests"));
    cli_run_free(&r);

    /* An endless line from a pipe ends at the line cap, naming the line. */
    int p[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    pid_t f = feeder(p[1], NULL, 0, "0", p[0]);
    close(p[1]);
    r = RUN_LIMITED(p[0], "demo", "--trace", "-");
    close(p[0]);
    reap(f);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "standard input:1"));
    assert_non_null(strstr(r.err, "longer than"));
    cli_run_free(&r);

    /* One line of 600,000 hash ids (4.7 GiB of pages): refused by its
     * length before it is parsed. */
    FILE *t = fopen(huge, "w");
    assert_non_null(t);
    write_trace_line(t, 2);
    write_trace_line(t, 600000);
    fclose(t);
    r = RUN_LIMITED(-1, "demo", "--trace", huge);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "huge.jsonl:2"));
    assert_non_null(strstr(r.err, "longer than"));
    cli_run_free(&r);

    /* A request larger than the store (600 blocks of 8 KiB, 4 MiB): refused
     * at its line, before its pages are made or anything is put. */
    r = CLI(NULL, "store", "create", capd, "-L", "1", "-H", "1", "-D", "4", "-B", "512", "-q",
            "fp16", "--capacity", "4MiB", "--model-signature", "6b76782d74726163");
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    t = fopen(capt, "w");
    assert_non_null(t);
    write_trace_line(t, 3);
    write_trace_line(t, 600);
    fclose(t);
    r = RUN_LIMITED(-1, "demo", "--dir", capd, "--trace", capt);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "cap.jsonl:2"));
    assert_non_null(strstr(r.err, "capacity"));
    cli_run_free(&r);
    r = CLI(NULL, "store", "stat", "--json", capd);
    jval *v = run_json(&r, 0);
    assert_int_equal((int)jget(v, "blocks")->num, 0); /* nothing was put */
    jfree(v);
    cli_run_free(&r);
}

static mode_t mode_of(const char *path)
{
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    return st.st_mode & 07777;
}

/* The replaced file's mode is kept: 0600 stays 0600 (the temporary was
 * 0644, the shard writer's 0600, whatever the target's). */
/* PROMISE: BOUND-3 */
static void test_outputs_keep_mode(void **state)
{
    (void)state;
    char envo[320], shardo[320], envback[320], h0[24];
    path_in(envo, sizeof envo, "mode.env");
    path_in(shardo, sizeof shardo, "mode.kvx");
    path_in(envback, sizeof envback, "mode-back.env");
    hexs(h0, sizeof h0, hashes[0]);
    const mode_t modes[] = {0600, 0640};
    for (size_t i = 0; i < 2; i++) {
        mode_t m = modes[i];
        write_bytes(envo, "old", 3);
        write_bytes(shardo, "old", 3);
        write_bytes(envback, "old", 3);
        assert_int_equal(chmod(envo, m), 0);
        assert_int_equal(chmod(shardo, m), 0);
        assert_int_equal(chmod(envback, m), 0);
        cli_run r = CLI(NULL, "store", "get", base, "-o", envo, "--format", "v1", h0);
        EXPECT_RC(r, 0);
        cli_run_free(&r);
        assert_int_equal(mode_of(envo), m);
        r = CLI(NULL, "convert", envp, "-o", shardo); /* the library writes the shard */
        EXPECT_RC(r, 0);
        cli_run_free(&r);
        assert_int_equal(mode_of(shardo), m);
        r = CLI(NULL, "convert", shardo, "-o", envback, "--format", "v1");
        EXPECT_RC(r, 0);
        cli_run_free(&r);
        assert_int_equal(mode_of(envback), m);
        size_t n;
        uint8_t *b = slurp_file(envback, &n);
        assert_int_equal(n, env_len);
        assert_memory_equal(b, env, env_len);
        free(b);
    }
    assert_int_equal(names_with(tmpdir, "kvx-tmp"), 0);
}

/* A name of 250 bytes (the file system takes 255) is written: the
 * temporary's name no longer grows with the target's. A stale temporary
 * of the fixed-length form is still removed. */
/* PROMISE: BOUND-4 */
static void test_output_name_250_bytes(void **state)
{
    (void)state;
    char ld[320], envo[640], shardo[640], stale[2][512], h0[24];
    path_in(ld, sizeof ld, "long");
    assert_int_equal(mkdir(ld, 0700), 0);
    char name[251];
    memset(name, 'n', 246);
    memcpy(name + 246, ".kvx", 5); /* 250 bytes and the NUL */
    snprintf(shardo, sizeof shardo, "%s/%s", ld, name);
    name[0] = 'e';
    snprintf(envo, sizeof envo, "%s/%s", ld, name);
    hexs(h0, sizeof h0, hashes[0]);
    cli_run r = CLI(NULL, "store", "get", base, "-o", envo, "--format", "v1", h0);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    assert_true(is_type(envo, S_IFREG));
    r = CLI(NULL, "convert", envp, "-o", shardo);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    jval *v = inspect_json(shardo);
    assert_int_equal(jget(v, "entries")->n, NBLOCKS);
    jfree(v);
    /* Replaced, both ways. */
    r = CLI(NULL, "convert", shardo, "-o", envo, "--format", "v1");
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    size_t n;
    uint8_t *b = slurp_file(envo, &n);
    assert_int_equal(n, env_len);
    assert_memory_equal(b, env, env_len);
    free(b);
    r = CLI(NULL, "convert", envp, "-o", shardo);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    /* Leftovers of a dead process, in the fixed-length form. */
    pid_t dead = dead_pid();
    snprintf(stale[0], sizeof stale[0], "%s/.kvx-tmp.%ld.0123456789abcdef", ld, (long)dead);
    snprintf(stale[1], sizeof stale[1], "%s/..kvx-tmp.%ld.0123456789abcdef.tmp.%ld.00000000deadbeef",
             ld, (long)dead, (long)dead);
    for (int i = 0; i < 2; i++) {
        write_bytes(stale[i], "x", 1);
        age_file(stale[i], 3600);
    }
    r = CLI(NULL, "convert", envp, "-o", shardo);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    assert_false(file_exists(stale[0]));
    assert_false(file_exists(stale[1]));
    assert_int_equal(names_with(ld, "kvx-tmp"), 0);
    assert_int_equal(names_with(ld, ".tmp."), 0);
}

/* A report that standard output cannot take (a full disk) is exit 1 with
 * a message, not 0. */
/* PROMISE: CLI-5 */
static void test_stdout_write_error(void **state)
{
    (void)state;
    if (access("/dev/full", W_OK) != 0) skip();
    cli_run r = run_t(NULL, -1, "/dev/full", 20, (const char *const[]){"store", "stat", "--json", base, NULL});
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "standard output"));
    cli_run_free(&r);
    r = run_t(NULL, -1, "/dev/full", 20, (const char *const[]){"store", "stat", base, NULL});
    EXPECT_RC(r, 1);
    cli_run_free(&r);
    r = run_t(NULL, -1, "/dev/full", 20, (const char *const[]){"hash", "-b", "2", "1", "2", NULL});
    EXPECT_RC(r, 1);
    cli_run_free(&r);
    r = run_t(NULL, -1, "/dev/full", 20, (const char *const[]){"store", "--help", NULL});
    EXPECT_RC(r, 1);
    cli_run_free(&r);
    /* The same to a file: 0. */
    char okp[320];
    path_in(okp, sizeof okp, "stat.out");
    r = RUN_TO(okp, "store", "stat", "--json", base);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
}

/* demo opens its --dir store as a writer like put does: --no-wait and
 * --wait N give up naming the holder (it waited forever, saying nothing). */
/* PROMISE: CLI-4 */
static void test_demo_waits_or_not(void **state)
{
    (void)state;
    char dd[320];
    path_in(dd, sizeof dd, "demo-held");
    cli_run r = CLI(NULL, "demo", "--json", "--dir", dd, "--conversations", "1", "--turns", "2");
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    held_writer h = hold_writer(dd);
    double t0 = now_s();
    r = RUN_T(-1, 20, "demo", "--dir", dd, "--no-wait", "--conversations", "1", "--turns", "2");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, h.want));
    assert_true(now_s() - t0 < 5);
    cli_run_free(&r);
    r = RUN_T(-1, 20, "demo", "--dir", dd, "--wait", "0.5", "--conversations", "1", "--turns", "2");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "gave up"));
    assert_non_null(strstr(r.err, h.want));
    cli_run_free(&r);
    close(h.release);
    int st = 0;
    assert_int_equal(waitpid(h.pid, &st, 0), h.pid);
    close(h.ready);
    r = RUN_T(-1, 60, "demo", "--dir", dd, "--no-wait", "--conversations", "1", "--turns", "2");
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    r = CLI(NULL, "demo", "--wait", "soon");
    EXPECT_RC(r, 2);
    cli_run_free(&r);
}

/* Token text of exactly the cap is taken; one byte more is refused (the
 * cap refused exactly 1 GiB, and a lowered cap bit only at 64 KiB). */
/* PROMISE: BOUND-5 */
static void test_text_cap_exact(void **state)
{
    (void)state;
    char text[4098];
    for (int i = 0; i < 1024; i++) memcpy(text + 4 * i, "1 2 ", 4);
    text[4096] = '\0';
    setenv("KVX_CLI_TEXT_CAP", "4KiB", 1);
    cli_run r = CLI(text, "hash", "-b", "2");
    EXPECT_RC(r, 0);
    assert_int_equal(count_substr(r.out, "\n"), 1024);
    cli_run_free(&r);
    text[4096] = '3';
    text[4097] = '\0';
    r = CLI(text, "hash", "-b", "2");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "more than 4.00 KiB"));
    cli_run_free(&r);
    unsetenv("KVX_CLI_TEXT_CAP");
}

static uint64_t file_fp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint64_t fp = 1;
    uint8_t buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) fp = su_mix(fp ^ kvx_fnv1a64(buf, got));
    fclose(f);
    return fp;
}

static int run_cli(const char *args)
{
    char cmd[4000], err[400];
    snprintf(err, sizeof err, "%s/cli.err", su_root);
    snprintf(cmd, sizeof cmd, "%s %s >/dev/null 2>'%s'", KVX_CLI, args, err);
    int st = system(cmd);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128;
    if (rc) { /* what it said, for the log */
        FILE *f = fopen(err, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) print_message("  kvx: %s", line);
        if (f) fclose(f);
    }
    return rc;
}

/*
 * DEFECT (rule 2 "Never destroy what was acknowledged", rule 5 "write
 * anywhere but the named output, which is only ever replaced when it is a
 * regular file" read together: a store's own files are not outputs).
 *
 * Reproducer:
 *   kvx store get DIR -o DIR/shards/0000000000000001.kvx --format v1 HASH
 *   kvx store prefix DIR -o DIR/STORE --format v1 TOKENS...
 * both exit 0: the first replaces an acknowledged shard by a one-block
 * envelope (its other blocks are destroyed; the next writer quarantines
 * the envelope), the second replaces the store's configuration (the store
 * no longer opens: STORE is not rebuildable). cli_out_open (cli/io.c)
 * checks only the output's type.
 *
 * Fix: in the store commands (cli/cmd_store.c), before cli_out_open,
 * resolve the output's directory (realpath of its parent, or fstat of the
 * opened dirfd) and refuse (exit 1, naming the store) when it is DIR or
 * lies under DIR (compare st_dev/st_ino up the parent chain against DIR's),
 * and refuse an output that is the same inode as any file of DIR.
 */
/* PROMISE: BOUND-1 */
static void test_regress_cli_output_inside_store(void **state)
{
    (void)state;
    char dir[300];
    kvx_geometry g = {2, 1, 8, 4, KVX_QUANT_FP16, 0};
    kvx_store *s = su_store(dir, sizeof dir, (su_spec){.capacity = 16 << 20, .geometry = &g});
    enum { NB = 3 };
    uint32_t t[NB * 4];
    uint64_t h[NB];
    for (size_t i = 0; i < NB * 4; i++) t[i] = (uint32_t)(1000 + i * 7);
    kvx_block_hashes(h, t, NB * 4, 4);
    size_t pb = kvx_page_bytes(&g, 4);
    uint8_t *pages = malloc(NB * pb);
    for (size_t i = 0; i < NB * pb; i++) pages[i] = (uint8_t)(i * 13 + 1);
    /* fp16 pages: keep every half finite (exponent bits not all ones) */
    for (size_t i = 1; i < NB * pb; i += 2) pages[i] &= 0x3f;
    assert_int_equal(kvx_store_put(s, t, NB * 4, pages, NB, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    free(pages);
    char names[8][64];
    assert_int_equal(su_list_names(dir, "shards", names, 8), 1);
    char shard[800], cfg[800], args[3000];
    snprintf(shard, sizeof shard, "%s/shards/%s", dir, names[0]);
    snprintf(cfg, sizeof cfg, "%s/STORE", dir);
    uint64_t shard_fp = file_fp(shard), cfg_fp = file_fp(cfg);

    snprintf(args, sizeof args, "store get '%s' -o '%s' --format v1 %016" PRIx64, dir, shard, h[0]);
    int rc_get = run_cli(args);
    int shard_kept = file_fp(shard) == shard_fp;

    char toks[400] = "";
    for (size_t i = 0; i < NB * 4; i++) {
        char w[16];
        snprintf(w, sizeof w, " %u", t[i]);
        strcat(toks, w);
    }
    snprintf(args, sizeof args, "store prefix '%s' -o '%s' --format v1%s", dir, cfg, toks);
    int rc_prefix = run_cli(args);
    int cfg_kept = file_fp(cfg) == cfg_fp;
    print_message("store get -o <its own shard>: exit %d, shard %s; store prefix -o <its STORE>: exit %d, STORE %s\n",
                  rc_get, shard_kept ? "kept" : "REPLACED", rc_prefix, cfg_kept ? "kept" : "REPLACED");
    kvx_store *r = NULL;
    int open_rc = kvx_store_open(&r, dir, NULL, KVX_STORE_READONLY);
    kvx_store_close(r);
    if (!shard_kept || !cfg_kept)
        fail_msg("DEFECT rules 2/5: an output path inside the store replaced %s%s%s (the store now opens with %d)",
                 shard_kept ? "" : "an acknowledged shard", !shard_kept && !cfg_kept ? " and " : "",
                 cfg_kept ? "" : "the store's STORE file", open_rc);
    assert_int_not_equal(rc_get, 0);
    assert_int_not_equal(rc_prefix, 0);

    /* Any store's files, not only the one a command reads: convert (no
     * store of its own) onto the shard, and store get from another store
     * into this one, both exited 0 and replaced the acknowledged shard
     * (the check was in the store commands, against their own store). */
    char env[800], dir2[300];
    snprintf(env, sizeof env, "%s/one.tlkv", su_root);
    snprintf(args, sizeof args, "store get '%s' -o '%s' --format v1 %016" PRIx64, dir, env, h[0]);
    assert_int_equal(run_cli(args), 0);
    snprintf(args, sizeof args, "convert '%s' -o '%s'", env, shard);
    int rc_convert = run_cli(args);
    kvx_store *s2 = su_store(dir2, sizeof dir2, (su_spec){.capacity = 16 << 20, .geometry = &g});
    kvx_store_close(s2);
    snprintf(args, sizeof args, "store get '%s' -o '%s/shards/%s' --format v1 %016" PRIx64, dir2, dir, names[0], h[0]);
    int rc_other = run_cli(args);
    snprintf(args, sizeof args, "convert '%s' -o '%s/index/x'", env, dir);
    int rc_deep = run_cli(args);
    if (file_fp(shard) != shard_fp)
        fail_msg("DEFECT rule 2: convert or another store's get replaced an acknowledged shard (exit %d, %d)",
                 rc_convert, rc_other);
    assert_int_not_equal(rc_convert, 0);
    assert_int_not_equal(rc_other, 0);
    assert_int_not_equal(rc_deep, 0);
    unlink(env);
}

/* The group's setup and teardown: each fixture's, in order. */
static int setup_all(void **state)
{
    if (setup(state)) return -1;
    if (su_setup(state)) return -1;
    return 0;
}

static int teardown_all(void **state)
{
    su_teardown(state);
    teardown(state);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_get_checks_every_page),
        cmocka_unit_test(test_get_unverified_missing_ambiguous),
        cmocka_unit_test(test_prefix_output),
        cmocka_unit_test(test_outputs_never_replace_special_files),
        cmocka_unit_test(test_kill9_leaves_no_temporary),
        cmocka_unit_test(test_stale_tmp_of_own_pid_kept_while_young),
        cmocka_unit_test(test_inputs_are_bounded),
        cmocka_unit_test(test_writers_wait_or_not),
        cmocka_unit_test(test_hints_fit_the_problem),
        cmocka_unit_test(test_demo_trace_bounded),
        cmocka_unit_test(test_outputs_keep_mode),
        cmocka_unit_test(test_output_name_250_bytes),
        cmocka_unit_test(test_stdout_write_error),
        cmocka_unit_test(test_demo_waits_or_not),
        cmocka_unit_test(test_text_cap_exact),
        cmocka_unit_test(test_regress_cli_output_inside_store),
    };
    return cmocka_run_group_tests_name("cli/trust", tests, setup_all, teardown_all);
}
