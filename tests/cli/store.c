/*
 * store.c - cli/cmd_store.c: `kvx store ...` run as a user runs it:
 * create, put an envelope with its tokens, prefix lookups, get blocks back
 * byte for byte, stat (--json), verify, reindex, gc, keyed stores, bf16,
 * and the failure paths (exit 1: missing blocks, wrong geometry, damage;
 * exit 2: bad command lines).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <stdint.h>

#include <cmocka.h>

#include "kvx.h"
#include "lib/cli.h"

static char tmpdir[256];

static char store[300], envp[300], tokp[300], out[300];

/* L=2, Hkv=1, D=8, B=4, fp16; tokens 0..13: three full blocks and a tail. */
static const kvx_geometry G = {2, 1, 8, 4, KVX_QUANT_FP16, 0};

#define NT 14

#define NB 3

static uint32_t toks[NT];

static uint64_t hashes[NB];

static uint8_t *env;

static size_t env_len;

/* A v1 envelope of the NB full blocks, payloads of finite f16 values. */
static size_t make_env(uint8_t **outp, const kvx_geometry *g, const uint64_t *h, uint32_t nb)
{
    size_t P = kvx_envelope_payload_bytes(1, g);
    uint16_t *pl = malloc(P * nb);
    kvx_envelope_block_in in[8];
    for (uint32_t b = 0; b < nb; b++) {
        for (size_t i = 0; i < P / 2; i++)
            pl[b * P / 2 + i] = kvx_f32_to_f16((float)((int)((i * 5 + b * 3) % 17) - 8) / 4.0f);
        in[b] = (kvx_envelope_block_in){h[b], g->block_tokens, pl + b * P / 2, NULL};
    }
    size_t len;
    assert_int_equal(kvx_envelope_size(&len, 1, g, nb), 0);
    *outp = malloc(len);
    assert_int_equal(kvx_envelope_export(*outp, len, 1, g, in, nb), 0);
    free(pl);
    return len;
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvx-test-cli-store-XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    snprintf(store, sizeof store, "%s/store", tmpdir);
    snprintf(envp, sizeof envp, "%s/seq.env", tmpdir);
    snprintf(tokp, sizeof tokp, "%s/seq.tokens", tmpdir);
    snprintf(out, sizeof out, "%s/out.env", tmpdir);
    for (uint32_t i = 0; i < NT; i++) toks[i] = 1000 + i * 3;
    kvx_block_hashes(hashes, toks, NT, G.block_tokens);
    env_len = make_env(&env, &G, hashes, NB);
    write_bytes(envp, env, env_len);
    FILE *f = fopen(tokp, "w");
    for (uint32_t i = 0; i < NT; i++) fprintf(f, "%u%s", toks[i], i % 5 == 4 ? "\n" : " ");
    fclose(f);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rm_rf(tmpdir);
    free(env);
    return 0;
}

static cli_run create_store(const char *dir)
{
    return CLI(NULL, "store", "create", dir, "--layers", "2", "--kv-heads", "1", "--head-dim", "8",
               "--block-tokens", "4", "--quant", "fp16", "--capacity", "64MiB");
}

/* The prefix command's first word. */
static long prefix_blocks(const char *const *tok_args)
{
    const char *argv[64] = {"store", "prefix", store};
    int n = 3;
    for (; *tok_args; tok_args++) argv[n++] = *tok_args;
    argv[n] = NULL;
    cli_run r = cli_runv(NULL, argv);
    EXPECT_RC(r, 0);
    char *end;
    long v = strtol(r.out, &end, 10);
    assert_true(end != r.out && *end == ' ');
    cli_run_free(&r);
    return v;
}

/* PROMISE: CLI-7 */
static void test_store_round_trip(void **state)
{
    (void)state;
    cli_run r = create_store(store);
    EXPECT_RC(r, 0);
    cli_run_free(&r);

    r = CLI(NULL, "store", "put", store, envp, "--tokens", tokp);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "3 new block"));
    cli_run_free(&r);
    /* Putting again writes nothing new. */
    r = CLI(NULL, "store", "put", store, envp, "--tokens", tokp);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "0 new block"));
    cli_run_free(&r);

    /* Prefix: the tokens themselves serve 3 blocks; a longer sequence
     * with the same start serves 3; a change in block 1 serves 1; a
     * change in the first token serves 0. */
    char tk[NT + 8][16];
    const char *args[NT + 8];
    for (int i = 0; i < NT; i++) {
        snprintf(tk[i], sizeof tk[i], "%u", toks[i]);
        args[i] = tk[i];
    }
    args[NT] = NULL;
    assert_int_equal(prefix_blocks(args), 3);
    args[NT] = "5";
    args[NT + 1] = "6";
    args[NT + 2] = NULL;
    assert_int_equal(prefix_blocks(args), 3);
    args[NT] = NULL;
    args[5] = "999999";
    assert_int_equal(prefix_blocks(args), 1);
    args[5] = tk[5];
    args[0] = "7";
    assert_int_equal(prefix_blocks(args), 0);

    /* Get the blocks back, in the given order: same bytes as put. */
    char h0[24], h1[24], h2[24];
    snprintf(h0, sizeof h0, "0x%016llx", (unsigned long long)hashes[0]);
    snprintf(h1, sizeof h1, "%016llx", (unsigned long long)hashes[1]);
    snprintf(h2, sizeof h2, "0x%016llx", (unsigned long long)hashes[2]);
    r = CLI(NULL, "store", "get", store, "-o", out, "--format", "v1", h0, h1, h2);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    size_t n;
    uint8_t *b = read_bytes(out, &n);
    assert_int_equal(n, env_len);
    assert_memory_equal(b, env, env_len);
    free(b);
    /* Reversed order: a valid envelope whose first block is block 2. */
    r = CLI(NULL, "store", "get", store, "-o", out, "--format", "v2", h2, h0);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    b = read_bytes(out, &n);
    kvx_envelope pe;
    kvx_envelope_block blk;
    assert_int_equal(kvx_envelope_parse(&pe, b, n, NULL), 0);
    assert_int_equal(pe.version, 2);
    assert_int_equal(pe.n_blocks, 2);
    assert_int_equal(kvx_envelope_block_at(&blk, &pe, 0), 0);
    assert_true(blk.hash == hashes[2]);
    free(b);

    /* A missing hash: exit 1, named, and no file. */
    unlink(out);
    r = CLI(NULL, "store", "get", store, "-o", out, "--format", "v1", h0, "0x1234");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "0x0000000000001234"));
    assert_false(file_exists(out));
    cli_run_free(&r);

    /* stat --json. */
    r = CLI(NULL, "store", "stat", "--json", store);
    jval *v = run_json(&r, 0);
    const char *keys[] = {"blocks", "bytes", "shards", "capacity", "hits", "misses", "evictions"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        assert_non_null(jget(v, keys[i]));
        assert_int_equal(jget(v, keys[i])->t, JNUM);
    }
    assert_int_equal((int)jget(v, "blocks")->num, 3);
    assert_true(jget(v, "capacity")->num == 64.0 * 1024 * 1024);
    assert_true(jget(v, "bytes")->num >= 3 * (double)kvx_page_bytes(&G, 4));
    assert_true(jget(v, "shards")->num >= 1);
    jfree(v);
    cli_run_free(&r);
    r = CLI(NULL, "store", "stat", store);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "blocks       3"));
    cli_run_free(&r);

    /* Maintenance keeps every block. */
    r = CLI(NULL, "store", "verify", store);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    r = CLI(NULL, "store", "reindex", store);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    r = CLI(NULL, "store", "gc", store);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    args[0] = tk[0];
    assert_int_equal(prefix_blocks(args), 3);
}

/* A store that evicts in place (KVX_STORE_HOLES): stat --json names the
 * freed pages' bytes (bytes counts them), and the human stat reads the
 * live bytes against the capacity, never over 100 %, and says how much
 * of the files' bytes is freed pages. */
/* PROMISE: STORE-26 */
static void test_store_stat_holes(void **state)
{
    (void)state;
    char dir[400];
    snprintf(dir, sizeof dir, "%s/holes", tmpdir);
    kvx_store_options o;
    kvx_store_options_init(&o);
    o.geometry = G;
    o.capacity_bytes = 1 << 20;
    o.flags = KVX_STORE_NOSYNC | KVX_STORE_HOLES;
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_create(&s, dir, &o), 0);
    size_t pb = kvx_page_bytes(&G, G.block_tokens);
    uint8_t *pages = calloc(NB, pb);
    uint32_t t[NB * 4];
    for (uint32_t q = 0; q < 400; q++) {
        for (uint32_t i = 0; i < NB * 4; i++) t[i] = q * 1000 + i + 1;
        assert_int_equal(kvx_store_put(s, t, NB * 4, pages, NB, NULL, NULL), 0);
        assert_int_equal(kvx_store_flush(s), 0);
    }
    free(pages);
    kvx_store_stats st;
    assert_int_equal(kvx_store_stat(&st, s), 0);
    kvx_store_close(s);
    assert_true(st.freed_bytes > 0);

    cli_run r = CLI(NULL, "store", "stat", "--json", dir);
    jval *v = run_json(&r, 0);
    assert_non_null(jget(v, "freed_bytes"));
    double freed = jget(v, "freed_bytes")->num, bytes = jget(v, "bytes")->num, cap = jget(v, "capacity")->num;
    assert_true(freed == (double)st.freed_bytes);
    assert_true(bytes > cap);          /* the files' sizes still count the freed pages */
    assert_true(bytes - freed <= cap); /* what is left is within the capacity */
    jfree(v);
    cli_run_free(&r);
    r = CLI(NULL, "store", "stat", dir);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "pages freed in place"));
    const char *pct = strchr(strstr(r.out, "bytes        "), '(');
    assert_non_null(pct);
    assert_true(strtod(pct + 1, NULL) <= 100.0);
    cli_run_free(&r);
}

/* A bf16 store: create --quant bf16, stat --json says "bf16"; a v3
 * envelope put with tokens comes back byte for byte from get and prefix -o
 * --format v3; v1 works while every value fits f16, else exit 1 naming the
 * first element and its value, with no output; v2 always works. */
static void test_store_bf16(void **state)
{
    (void)state;
    char st[320], e3[320], o1[320];
    snprintf(st, sizeof st, "%s/bf16", tmpdir);
    snprintf(e3, sizeof e3, "%s/seq.v3", tmpdir);
    snprintf(o1, sizeof o1, "%s/out.v1", tmpdir);
    cli_run r = CLI(NULL, "store", "create", st, "--layers", "2", "--kv-heads", "1", "--head-dim", "8",
                    "--block-tokens", "4", "--quant", "bf16", "--capacity", "64MiB");
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "bf16"));
    cli_run_free(&r);
    r = CLI(NULL, "store", "stat", "--json", st);
    jval *v = run_json(&r, 0);
    assert_string_equal(jget(v, "quant_format")->str, "bf16");
    jfree(v);
    cli_run_free(&r);

    kvx_geometry g = G;
    g.quant = KVX_QUANT_BF16;
    size_t P = kvx_envelope_payload_bytes(KVX_ENVELOPE_V3, &g);
    uint16_t *pl = malloc(P * NB);
    kvx_envelope_block_in in[NB];
    for (uint32_t b = 0; b < NB; b++) {
        for (size_t i = 0; i < P / 2; i++)
            pl[b * P / 2 + i] = kvx_f32_to_bf16((float)((int)((i * 5 + b * 3) % 17) - 8) / 4.0f);
        in[b] = (kvx_envelope_block_in){hashes[b], 4, pl + b * P / 2, NULL};
    }
    pl[2 * P / 2 + 3] = 0x5F80; /* block 2, layer 0, K, head 0, token 0, dim 3: 2^64, beyond f16 */
    size_t len;
    assert_int_equal(kvx_envelope_size(&len, KVX_ENVELOPE_V3, &g, NB), 0);
    uint8_t *e = malloc(len);
    assert_int_equal(kvx_envelope_export(e, len, KVX_ENVELOPE_V3, &g, in, NB), 0);
    write_bytes(e3, e, len);
    free(pl);

    r = CLI(NULL, "store", "put", st, e3, "--tokens", tokp);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "3 new block"));
    cli_run_free(&r);
    char h0[24], h1[24], h2[24];
    snprintf(h0, sizeof h0, "0x%016llx", (unsigned long long)hashes[0]);
    snprintf(h1, sizeof h1, "0x%016llx", (unsigned long long)hashes[1]);
    snprintf(h2, sizeof h2, "0x%016llx", (unsigned long long)hashes[2]);
    r = CLI(NULL, "store", "get", st, "-o", out, "--format", "v3", h0, h1, h2);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    size_t n;
    uint8_t *b = read_bytes(out, &n);
    assert_int_equal(n, len);
    assert_memory_equal(b, e, len);
    free(b);

    char tk[NT][16];
    const char *args[NT + 8] = {"store", "prefix", st, "-o", out, "--format", "v3"};
    for (int i = 0; i < NT; i++) {
        snprintf(tk[i], sizeof tk[i], "%u", toks[i]);
        args[7 + i] = tk[i];
    }
    args[7 + NT] = NULL;
    unlink(out);
    r = cli_runv(NULL, args);
    EXPECT_RC(r, 0);
    assert_int_equal(strtol(r.out, NULL, 10), 3);
    cli_run_free(&r);
    b = read_bytes(out, &n);
    assert_int_equal(n, len);
    assert_memory_equal(b, e, len);
    free(b);

    /* v1: blocks 0 and 1 fit f16; block 2 does not */
    r = CLI(NULL, "store", "get", st, "-o", o1, "--format", "v1", h0, h1);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    unlink(o1);
    r = CLI(NULL, "store", "get", st, "-o", o1, "--format", "v1", h0, h2);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "layer 0, K, head 0, token 0, dim 3"));
    assert_non_null(strstr(r.err, "1.84467441e+19"));
    assert_false(file_exists(o1));
    cli_run_free(&r);
    args[5] = "--format";
    args[6] = "v1";
    args[4] = o1;
    r = cli_runv(NULL, args);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "not exactly representable in f16"));
    assert_false(file_exists(o1));
    cli_run_free(&r);
    r = CLI(NULL, "store", "get", st, "-o", o1, "--format", "v2", h0, h2);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    r = CLI(NULL, "store", "get", st, "-o", o1, "--format", "v4", h0);
    EXPECT_RC(r, 2);
    cli_run_free(&r);
    free(e);
}

/* PROMISE: CLI-7 */
static void test_store_failures(void **state)
{
    (void)state;
    char st2[320], other[320], bad_tok[320];
    snprintf(st2, sizeof st2, "%s/store2", tmpdir);
    snprintf(other, sizeof other, "%s/other.env", tmpdir);
    snprintf(bad_tok, sizeof bad_tok, "%s/bad.tokens", tmpdir);
    cli_run r = create_store(st2);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    /* Creating it again fails: it exists. */
    r = create_store(st2);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "store2"));
    cli_run_free(&r);

    /* An envelope of another geometry (D = 4) is refused. */
    kvx_geometry g2 = G;
    g2.head_dim = 4;
    uint8_t *e2;
    size_t l2 = make_env(&e2, &g2, hashes, NB);
    write_bytes(other, e2, l2);
    free(e2);
    r = CLI(NULL, "store", "put", st2, other);
    EXPECT_RC(r, 1);
    cli_run_free(&r);

    /* Tokens whose hashes differ from the envelope's are refused. */
    write_bytes(bad_tok, "1 2 3 4 5 6 7 8 9 10 11 12 13 14\n", 33);
    r = CLI(NULL, "store", "put", st2, envp, "--tokens", bad_tok);
    EXPECT_RC(r, 1);
    cli_run_free(&r);
    /* A token file that is not token ids. */
    write_bytes(bad_tok, "1 2 x\n", 6);
    r = CLI(NULL, "store", "put", st2, envp, "--tokens", bad_tok);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "'x"));
    cli_run_free(&r);
    /* A token file with a NUL byte is refused, not read up to the NUL. */
    write_bytes(bad_tok, "1 2\0 3\n", 7);
    r = CLI(NULL, "store", "put", st2, envp, "--tokens", bad_tok);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "NUL"));
    cli_run_free(&r);
    /* A damaged envelope. */
    uint8_t *d = malloc(env_len);
    memcpy(d, env, env_len);
    d[60] ^= 4;
    write_bytes(other, d, env_len);
    free(d);
    r = CLI(NULL, "store", "put", st2, other);
    EXPECT_RC(r, 1);
    cli_run_free(&r);
    r = CLI(NULL, "store", "stat", "--json", st2);
    jval *v = run_json(&r, 0);
    assert_int_equal((int)jget(v, "blocks")->num, 0); /* nothing got in */
    jfree(v);
    cli_run_free(&r);

    /* Not a store. */
    r = CLI(NULL, "store", "stat", tmpdir);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "kvx store stat: "));
    cli_run_free(&r);
    r = CLI(NULL, "store", "prefix", "/nonexistent/store", "1");
    EXPECT_RC(r, 1);
    cli_run_free(&r);
}

/* Finds a sealed shard file under dir (any depth). */
static int find_shard(char *outp, size_t cap, const char *dir)
{
    DIR *dp = opendir(dir);
    if (!dp) return -1;
    struct dirent *de;
    int found = -1;
    while (found && (de = readdir(dp))) {
        if (de->d_name[0] == '.') continue;
        char p[1024];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat st;
        if (lstat(p, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            found = find_shard(outp, cap, p);
        } else if (S_ISREG(st.st_mode) && st.st_size > 4096) {
            FILE *f = fopen(p, "rb");
            char m[8] = {0};
            if (f && fread(m, 1, 8, f) == 8 && !memcmp(m, "RADX-KVX", 8)) {
                snprintf(outp, cap, "%s", p);
                found = 0;
            }
            if (f) fclose(f);
        }
    }
    closedir(dp);
    return found;
}

static void test_store_verify_finds_damage(void **state)
{
    (void)state;
    char st3[320], shard[1024];
    snprintf(st3, sizeof st3, "%s/store3", tmpdir);
    cli_run r = create_store(st3);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    r = CLI(NULL, "store", "put", st3, envp, "--tokens", tokp);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    assert_int_equal(find_shard(shard, sizeof shard, st3), 0);
    /* Flip a byte of the first page (pages start at kv_data_offset). */
    flip_bits(shard, page_offset(shard, 0) + 3, 0x10);
    r = CLI(NULL, "store", "verify", st3);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.out, "BAD"));
    cli_run_free(&r);
}

/* PROMISE: CLI-1 */
static void test_store_usage(void **state)
{
    (void)state;
    const char *const cases[][12] = {
        {"store", NULL},
        {"store", "frob", store, NULL},
        {"store", "create", store, "--layers", "2", NULL}, /* missing options */
        {"store", "create", store, "--layers", "2", "--kv-heads", "1", "--head-dim", "8", NULL},
        {"store", "create", "x", "-L", "1", "-H", "1", "-D", "1", "--quant", NULL},
        {"store", "create", "x", "-L", "0", NULL},
        {"store", "put", store, NULL},
        {"store", "get", store, "-o", out, "--format", "v1", NULL}, /* no hash */
        {"store", "get", store, "--format", "v1", "abc", NULL},     /* no -o */
        {"store", "get", store, "-o", out, "--format", "v9", "abc", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_run r = cli_runv(NULL, cases[i]);
        EXPECT_RC(r, 2);
        assert_non_null(strstr(r.err, "kvx store"));
        cli_run_free(&r);
    }
    const char *const more[][18] = {
        {"store", "create", "x", "-L", "1", "-H", "1", "-D", "1", "-B", "4", "--quant", "fp8", NULL},
        {"store", "create", "x", "-L", "1", "-H", "1", "-D", "1", "-B", "4", "--quant", "fp16",
         "--capacity", "lots", NULL},
        {"store", "get", store, "-o", out, "--format", "v1", "0xnothex", NULL},
        {"store", "prefix", store, "1", "-2", NULL},
        {"store", "stat", store, "extra", NULL},
    };
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
        cli_run r = cli_runv(NULL, more[i]);
        EXPECT_RC(r, 2);
        cli_run_free(&r);
    }
}

/* `store create --page-bytes`: a keyed store; stat and verify show its
 * pages; block commands refuse it; bad sizes are usage errors. */
/* PROMISE: KEYED-1 */
static void test_store_keyed(void **state)
{
    (void)state;
    char dir[400];
    snprintf(dir, sizeof dir, "%s/keyed", tmpdir);
    cli_run r = CLI(NULL, "store", "create", dir, "--page-bytes", "8KiB", "--capacity", "64MiB");
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "keyed store"));
    cli_run_free(&r);
    /* three pages through the library, as an engine's adapter puts them */
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_open(&s, dir, NULL, 0), 0);
    uint8_t page[8192];
    memset(page, 7, sizeof page);
    kvx_key keys[3] = {{"a", 1}, {"bb", 2}, {"ccc", 3}};
    const void *pages[3] = {page, page, page};
    size_t lens[3] = {8192, 100, 1};
    assert_int_equal(kvx_store_keyed_put(s, NULL, keys, pages, lens, 3, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    r = CLI(NULL, "store", "stat", "--json", dir);
    jval *v = run_json(&r, 0);
    assert_string_equal(jget(v, "kind")->str, "keyed");
    assert_int_equal((int)jget(v, "page_bytes")->num, 8192);
    assert_int_equal((int)jget(v, "blocks")->num, 3);
    jfree(v);
    cli_run_free(&r);
    r = CLI(NULL, "store", "stat", dir);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "keyed pages of 1..8192 bytes"));
    assert_non_null(strstr(r.out, "pages        3"));
    cli_run_free(&r);
    r = CLI(NULL, "store", "verify", dir);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    r = CLI(NULL, "store", "prefix", dir, "1", "2", "3", "4");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "keyed store"));
    cli_run_free(&r);
    char bad[400];
    snprintf(bad, sizeof bad, "%s/keyed-odd", tmpdir);
    r = CLI(NULL, "store", "create", bad, "--page-bytes", "4095");
    EXPECT_RC(r, 2);
    assert_non_null(strstr(r.err, "even"));
    cli_run_free(&r);
    r = CLI(NULL, "store", "create", bad, "--page-bytes", "4096", "--layers", "2");
    EXPECT_RC(r, 2);
    cli_run_free(&r);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_store_round_trip),
        cmocka_unit_test(test_store_bf16),
        cmocka_unit_test(test_store_stat_holes),
        cmocka_unit_test(test_store_failures),
        cmocka_unit_test(test_store_verify_finds_damage),
        cmocka_unit_test(test_store_usage),
        cmocka_unit_test(test_store_keyed),
    };
    return cmocka_run_group_tests_name("cli/store", tests, setup, teardown);
}
