/*
 * messages.c - the `kvx` command tells the truth about what it did and
 * what helps (cli/cmd_store.c put, get and verify; cli/cmd_warmup.c;
 * cli/cmd_shard.c): empty is not an error; a block in a damaged shard is
 * named as damaged, never as missing; a put that stores nothing, or that
 * no store of that capacity could hold, says why and exits 1; every hint
 * names a command that helps with what was found.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cmocka.h>

#include "kvx.h"
#include "lib/cli.h"

static char tmpdir[256];

/* L=2, Hkv=1, D=8, B=4, fp16; tokens 0..13: three full blocks and a tail. */
static const kvx_geometry G = {2, 1, 8, 4, KVX_QUANT_FP16, 0};

#define NT 14

#define NB 3

static uint32_t toks[NT];

static uint64_t hashes[NB];

static char envp[300], tokp[300];

static void path_in(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", tmpdir, name); }

/* A v1 envelope of nb blocks: hash h[b] (0 = unregistered) and n_tokens[b]
 * tokens each, payloads of finite f16 values that differ per block. */
static size_t make_env(uint8_t **outp, uint32_t nb, const uint64_t *h, const uint32_t *ntok)
{
    size_t P = kvx_envelope_payload_bytes(1, &G);
    uint16_t *pl = calloc(nb ? nb : 1, P);
    kvx_envelope_block_in *in = calloc(nb ? nb : 1, sizeof *in);
    for (uint32_t b = 0; b < nb; b++) {
        for (size_t i = 0; i < P / 2; i++)
            pl[b * P / 2 + i] = kvx_f32_to_f16((float)((int)((i * 5 + b * 3) % 17) - 8) / 4.0f);
        in[b] = (kvx_envelope_block_in){h[b], ntok ? ntok[b] : G.block_tokens, pl + b * P / 2, NULL};
    }
    size_t len;
    assert_int_equal(kvx_envelope_size(&len, 1, &G, nb), 0);
    *outp = malloc(len);
    assert_int_equal(kvx_envelope_export(*outp, len, 1, &G, in, nb), 0);
    free(pl);
    free(in);
    return len;
}

static void write_env(const char *path, uint32_t nb, const uint64_t *h, const uint32_t *ntok)
{
    uint8_t *e;
    size_t n = make_env(&e, nb, h, ntok);
    write_bytes(path, e, n);
    free(e);
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvx-test-cli-messages-XXXXXX");
    if (!mkdtemp(tmpdir)) return -1;
    for (uint32_t i = 0; i < NT; i++) toks[i] = 1000 + i * 3;
    kvx_block_hashes(hashes, toks, NT, G.block_tokens);
    path_in(envp, sizeof envp, "seq.env");
    path_in(tokp, sizeof tokp, "seq.tokens");
    write_env(envp, NB, hashes, NULL);
    FILE *f = fopen(tokp, "w");
    for (uint32_t i = 0; i < NT; i++) fprintf(f, "%u ", toks[i]);
    fclose(f);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rm_rf(tmpdir);
    return 0;
}

static void create_store(const char *dir, const char *capacity)
{
    cli_run r = CLI(NULL, "store", "create", dir, "--layers", "2", "--kv-heads", "1", "--head-dim",
                    "8", "--block-tokens", "4", "--quant", "fp16", "--capacity", capacity);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
}

/* A sealed shard of n entries (0 allowed) at path. */
static void write_shard(const char *path, uint32_t n)
{
    kvx_shard_writer_options o;
    kvx_shard_writer_options_init(&o);
    o.geometry = G;
    o.max_entries = n ? n : 1;
    o.flags = KVX_FLAG_HASHES;
    kvx_shard_writer *w = NULL;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    size_t pb = (size_t)kvx_page_bytes(&G, G.block_tokens);
    uint16_t *page = calloc(1, pb);
    for (uint32_t i = 0; i < n; i++) {
        kvx_entry_in e;
        memset(&e, 0, sizeof e);
        e.radix_block = (uint16_t)i;
        e.token_count = G.block_tokens;
        e.page = page;
        e.hash = hashes[i % NB];
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    }
    free(page);
    assert_int_equal(kvx_shard_writer_seal(w), 0);
}

/* Warmup's --json "pages", exit 0 expected. */
static double warmup_pages(const char *const *args)
{
    cli_run r = cli_runv(NULL, args);
    jval *v = run_json(&r, 0);
    double pages = jget(v, "pages")->num;
    assert_int_equal(jget(v, "crc_failures")->num, 0);
    jfree(v);
    cli_run_free(&r);
    return pages;
}

static void hexs(char *out, size_t cap, uint64_t h) { snprintf(out, cap, "0x%016llx", (unsigned long long)h); }

/* A store holding the NB blocks of seq.env, put with their tokens. */
static void store_with_blocks(const char *dir)
{
    create_store(dir, "64MiB");
    cli_run r = CLI(NULL, "store", "put", dir, envp, "--tokens", tokp);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
}

/* The path of the store's only shard file. */
static void only_shard(char *out, size_t cap, const char *dir)
{
    char sd[400];
    snprintf(sd, sizeof sd, "%s/shards", dir);
    DIR *d = opendir(sd);
    assert_non_null(d);
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        snprintf(out, cap, "%s/%s", sd, de->d_name);
        n++;
    }
    closedir(d);
    assert_int_equal(n, 1);
}

/* get of a block whose shard is damaged, expecting exit 1, naming the
 * block, the shard file and "damaged", never "not in the store". */
static cli_run get_damaged(const char *dir, const char *shard_name, const char *hash, const char *tokens)
{
    char out[320];
    path_in(out, sizeof out, "damaged-get.env");
    cli_run r = tokens ? CLI(NULL, "store", "get", dir, "-o", out, "--format", "v1", "--tokens", tokens, hash)
                       : CLI(NULL, "store", "get", dir, "-o", out, "--format", "v1", hash);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, hash));
    assert_non_null(strstr(r.err, shard_name));
    assert_null(strstr(r.err, "not in the store"));
    assert_false(file_exists(out));
    return r;
}

/* PROMISE: CLI-8 */
static void test_empty_is_not_an_error(void **state)
{
    (void)state;
    char st[320], empty[320], full[320], keyed[320];
    path_in(st, sizeof st, "empty-store");
    create_store(st, "64MiB");
    /* An empty store warms up 0 pages, exit 0, text and JSON. */
    cli_run r = CLI(NULL, "warmup", st);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "warmed up 0 page(s), 0 B from 0 shard(s)"));
    assert_string_equal(r.err, "");
    cli_run_free(&r);
    assert_true(warmup_pages((const char *const[]){"warmup", "--json", st, NULL}) == 0);
    assert_true(warmup_pages((const char *const[]){"warmup", "--json", "--io", "pread", st, NULL}) == 0);
    assert_true(warmup_pages((const char *const[]){"warmup", "--json", "--sink", "discard", st, NULL}) == 0);
    /* verify of an empty store: OK, 0 blocks. */
    r = CLI(NULL, "store", "verify", st);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "OK (0 blocks in 0 shard(s))"));
    cli_run_free(&r);

    /* A shard of 0 entries: verify says OK with 0 entries; warmup of it
     * alone and beside shards with entries counts only the real pages. */
    path_in(empty, sizeof empty, "empty.kvx");
    path_in(full, sizeof full, "three.kvx");
    write_shard(empty, 0);
    write_shard(full, NB);
    r = CLI(NULL, "verify", empty, full);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "OK (0 entries"));
    assert_non_null(strstr(r.out, "OK (3 entries"));
    cli_run_free(&r);
    r = CLI(NULL, "warmup", empty);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "warmed up 0 page(s)"));
    cli_run_free(&r);
    assert_true(warmup_pages((const char *const[]){"warmup", "--json", empty, full, empty, NULL}) == NB);
    assert_true(warmup_pages((const char *const[]){"warmup", "--json", empty, st, full, NULL}) == NB);

    /* A keyed store that holds only a delete (its page compacted away):
     * nothing to warm up, no error. */
    path_in(keyed, sizeof keyed, "keyed");
    r = CLI(NULL, "store", "create", keyed, "--page-bytes", "4096", "--capacity", "64MiB");
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    kvx_store *s = NULL;
    assert_int_equal(kvx_store_open(&s, keyed, NULL, 0), 0);
    uint8_t page[100];
    memset(page, 7, sizeof page);
    kvx_key k = {"the-key", 7};
    const void *pages[1] = {page};
    size_t lens[1] = {sizeof page}, fresh = 0, deleted = 0;
    assert_int_equal(kvx_store_keyed_put(s, NULL, &k, pages, lens, 1, &fresh), 0);
    assert_int_equal(fresh, 1);
    assert_int_equal(kvx_store_flush(s), 0);
    assert_int_equal(kvx_store_keyed_delete(s, &k, 1, &deleted), 0);
    assert_int_equal(deleted, 1);
    kvx_store_close(s);
    r = CLI(NULL, "store", "gc", keyed);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    assert_true(warmup_pages((const char *const[]){"warmup", "--json", keyed, NULL}) == 0);
    r = CLI(NULL, "warmup", keyed);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
}

/* stat and gc of an empty store (their code is cmd_store.c's run_stat and
 * run_gc): exit 0, and they say 0. */
/* PROMISE: CLI-8 */
static void test_stat_and_gc_of_an_empty_store(void **state)
{
    (void)state;
    char st[320];
    path_in(st, sizeof st, "empty-stat-gc");
    create_store(st, "64MiB");
    cli_run r = CLI(NULL, "store", "stat", st);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "blocks       0"));
    cli_run_free(&r);
    r = CLI(NULL, "store", "stat", "--json", st);
    jval *v = run_json(&r, 0);
    assert_true(jget(v, "blocks")->num == 0);
    assert_true(jget(v, "shards")->num == 0);
    jfree(v);
    cli_run_free(&r);
    r = CLI(NULL, "store", "gc", st);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "0 -> 0 shard(s)"));
    cli_run_free(&r);
}

/* A FIFO where warmup expects a shard or a store: refused by type at
 * once, never opened (an open would wait for a writer forever); the other
 * inputs are still warmed up. */
/* PROMISE: CLI-8 */
static void test_warmup_fifo_input(void **state)
{
    (void)state;
    char fifo[320], full[320];
    path_in(fifo, sizeof fifo, "warm.fifo");
    path_in(full, sizeof full, "fifo-beside.kvx");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    write_shard(full, NB);
    cli_run r = CLI(NULL, "warmup", fifo, full);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "FIFO"));
    assert_non_null(strstr(r.out, "warmed up 3 page(s)"));
    cli_run_free(&r);
    r = CLI(NULL, "warmup", fifo);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "FIFO"));
    cli_run_free(&r);
}

/* An envelope input that is a FIFO no process writes to yet reads as
 * empty (inputs never wait): the message says so instead of blaming the
 * contents alone (found by an attack: a writer started late). */
/* PROMISE: CLI-8 */
static void test_fifo_input_without_a_writer(void **state)
{
    (void)state;
    char fifo[320], out[320], st[320];
    path_in(fifo, sizeof fifo, "nowriter.fifo");
    path_in(out, sizeof out, "nowriter.kvx");
    path_in(st, sizeof st, "nowriter-store");
    assert_int_equal(mkfifo(fifo, 0600), 0);
    cli_run r = CLI(NULL, "convert", fifo, "-o", out);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "is empty"));
    assert_non_null(strstr(r.err, "start the writer first"));
    cli_run_free(&r);
    assert_int_equal(access(out, F_OK), -1); /* nothing written */
    create_store(st, "64MiB");
    r = CLI(NULL, "store", "put", st, fifo);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "0 bytes"));
    assert_non_null(strstr(r.err, "start the writer first"));
    cli_run_free(&r);
}

/* PROMISE: CLI-9 */
static void test_get_names_a_damaged_shard(void **state)
{
    (void)state;
    char st[320], shard[1024], h0[24], h2[24], q[600];
    hexs(h0, sizeof h0, hashes[0]);
    hexs(h2, sizeof h2, hashes[2]);

    /* A page that fails its CRC: its block is named damaged with the
     * shard file; gc is what helps; the good blocks still serve. */
    path_in(st, sizeof st, "rot");
    store_with_blocks(st);
    only_shard(shard, sizeof shard, st);
    const char *name = strrchr(shard, '/') + 1;
    flip_bits(shard, page_offset(shard, 0) + 5, 0x20);
    cli_run r = get_damaged(st, name, h0, NULL);
    assert_non_null(strstr(r.err, "damaged"));
    assert_non_null(strstr(r.err, "CRC"));
    assert_non_null(strstr(r.err, "kvx store gc"));
    assert_non_null(strstr(r.err, "quarantine/"));
    cli_run_free(&r);
    r = get_damaged(st, name, h0, tokp);
    assert_non_null(strstr(r.err, "kvx store gc"));
    cli_run_free(&r);
    char out[320];
    path_in(out, sizeof out, "good.env");
    r = CLI(NULL, "store", "get", st, "-o", out, "--format", "v1", h2);
    EXPECT_RC(r, 0);
    cli_run_free(&r);

    /* Cut inside its tables: the file no longer opens. The block is in a
     * damaged shard, named with why; reading never repairs (the file stays
     * where it is, nothing goes to quarantine/). */
    path_in(st, sizeof st, "cut");
    store_with_blocks(st);
    only_shard(shard, sizeof shard, st);
    name = strrchr(shard, '/') + 1;
    assert_int_equal(truncate(shard, 100), 0);
    r = get_damaged(st, name, h0, NULL);
    assert_non_null(strstr(r.err, "damaged"));
    assert_non_null(strstr(r.err, "past the end of the file"));
    assert_non_null(strstr(r.err, "quarantine/"));
    cli_run_free(&r);
    r = get_damaged(st, name, h2, tokp);
    assert_non_null(strstr(r.err, "damaged"));
    cli_run_free(&r);
    assert_true(file_exists(shard));
    snprintf(q, sizeof q, "%s/quarantine", st);
    struct stat sb;
    assert_true(stat(q, &sb) != 0 || sb.st_nlink == 2);

    /* Its header and tables rotted: the meta checksum fails. */
    path_in(st, sizeof st, "meta");
    store_with_blocks(st);
    only_shard(shard, sizeof shard, st);
    name = strrchr(shard, '/') + 1;
    flip_bits(shard, 70, 0x01);
    r = get_damaged(st, name, h0, NULL);
    assert_non_null(strstr(r.err, "damaged"));
    assert_non_null(strstr(r.err, "meta_crc32c"));
    cli_run_free(&r);

    /* The file is gone: said so, and the index's record is what is left. */
    path_in(st, sizeof st, "gone");
    store_with_blocks(st);
    only_shard(shard, sizeof shard, st);
    name = strrchr(shard, '/') + 1;
    assert_int_equal(unlink(shard), 0);
    r = get_damaged(st, name, h0, NULL);
    assert_non_null(strstr(r.err, "gone"));
    assert_non_null(strstr(r.err, "kvx store reindex"));
    cli_run_free(&r);

    /* A directory where the shard file belongs: named by type; kvx leaves
     * it alone, so no hint says a writer moves it. */
    path_in(st, sizeof st, "dir");
    store_with_blocks(st);
    only_shard(shard, sizeof shard, st);
    name = strrchr(shard, '/') + 1;
    assert_int_equal(unlink(shard), 0);
    assert_int_equal(mkdir(shard, 0700), 0);
    r = get_damaged(st, name, h0, NULL);
    assert_non_null(strstr(r.err, "directory"));
    assert_null(strstr(r.err, "quarantine"));
    cli_run_free(&r);

    /* A block that truly is not there is still "not in the store". */
    path_in(st, sizeof st, "plain-miss");
    store_with_blocks(st);
    r = CLI(NULL, "store", "get", st, "-o", out, "--format", "v1", "0x1234");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "not in the store"));
    cli_run_free(&r);
}

/* PROMISE: CLI-10 */
static void test_put_of_unhashed_blocks_says_why(void **state)
{
    (void)state;
    char st[320], zero[320], mixed[320], tail[320], none[320];
    path_in(st, sizeof st, "unhashed");
    create_store(st, "64MiB");
    /* Every full block with hash 0: nothing stored, exit 1, with or
     * without --tokens, saying why and what to do. */
    path_in(zero, sizeof zero, "zero.env");
    const uint64_t z[NB] = {0, 0, 0};
    write_env(zero, NB, z, NULL);
    cli_run r = CLI(NULL, "store", "put", st, zero, "--tokens", tokp);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "nothing stored"));
    assert_non_null(strstr(r.err, "hash 0"));
    assert_non_null(strstr(r.err, "kvx hash"));
    cli_run_free(&r);
    r = CLI(NULL, "store", "put", st, zero);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "hash 0"));
    cli_run_free(&r);
    r = CLI(NULL, "store", "stat", "--json", st);
    jval *v = run_json(&r, 0);
    assert_true(jget(v, "blocks")->num == 0);
    jfree(v);
    cli_run_free(&r);

    /* Some named, one not: the named ones are stored, exit 0, and the
     * result line counts the other. */
    path_in(mixed, sizeof mixed, "mixed.env");
    const uint64_t m[2] = {hashes[0], 0};
    write_env(mixed, 2, m, NULL);
    r = CLI(NULL, "store", "put", st, mixed, "--tokens", tokp);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "1 new block(s) of 1 full block(s)"));
    assert_non_null(strstr(r.out, "1 full block(s) with hash 0"));
    cli_run_free(&r);

    /* Only a partial tail, and no blocks at all: nothing to store is no
     * error. */
    path_in(tail, sizeof tail, "tail.env");
    const uint64_t t[1] = {0};
    const uint32_t tn[1] = {2};
    write_env(tail, 1, t, tn);
    r = CLI(NULL, "store", "put", st, tail);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "0 new block(s) of 0 full block(s)"));
    assert_non_null(strstr(r.out, "1 partial block(s) not stored"));
    cli_run_free(&r);
    path_in(none, sizeof none, "none.env");
    write_env(none, 0, NULL, NULL);
    r = CLI(NULL, "store", "put", st, none);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "0 new block(s) of 0 full block(s)"));
    cli_run_free(&r);
}

/* PROMISE: CLI-11 */
static void test_put_larger_than_the_capacity(void **state)
{
    (void)state;
    char st[320], big[320];
    path_in(st, sizeof st, "small");
    create_store(st, "512KiB");
    /* 300 blocks of 4 KiB pages: more than 512 KiB whatever gc does. */
    enum { N = 300 };
    uint32_t *tk = malloc(N * 4 * sizeof *tk);
    uint64_t *h = malloc(N * sizeof *h);
    for (uint32_t i = 0; i < N * 4; i++) tk[i] = 7 + i;
    kvx_block_hashes(h, tk, N * 4, 4);
    path_in(big, sizeof big, "big.env");
    write_env(big, N, h, NULL);
    free(tk);
    free(h);
    cli_run r = CLI(NULL, "store", "put", st, big);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "larger than the store's whole capacity of 512 KiB"));
    assert_non_null(strstr(r.err, "bytes, more than the store's capacity of 524288 bytes"));
    assert_non_null(strstr(r.err, "--capacity"));
    assert_non_null(strstr(r.err, "smaller envelopes"));
    assert_null(strstr(r.err, "run 'kvx store gc'"));
    assert_non_null(strstr(r.err, "gc cannot make room"));
    cli_run_free(&r);
}

/* PROMISE: CLI-12 */
static void test_verify_hints_name_what_helps(void **state)
{
    (void)state;
    char st[320], shard[1024];
    /* Damaged pages: gc salvages the good blocks; reindex mends nothing
     * there and is not named. */
    path_in(st, sizeof st, "vrot");
    store_with_blocks(st);
    only_shard(shard, sizeof shard, st);
    flip_bits(shard, page_offset(shard, 1) + 3, 0x10);
    cli_run r = CLI(NULL, "store", "verify", st);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "kvx store gc"));
    assert_non_null(strstr(r.err, "good blocks"));
    assert_null(strstr(r.err, "reindex"));
    cli_run_free(&r);
    /* A page past the end of the file (cut between pages): the same. */
    path_in(st, sizeof st, "vcut-pages");
    store_with_blocks(st);
    only_shard(shard, sizeof shard, st);
    assert_int_equal(truncate(shard, (off_t)page_offset(shard, 1)), 0);
    r = CLI(NULL, "store", "verify", st);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "kvx store gc"));
    assert_null(strstr(r.err, "reindex"));
    cli_run_free(&r);
    /* A file that does not open: reindex, saying it quarantines (kept,
     * not deleted), never that it "rebuilds the index" alone. */
    path_in(st, sizeof st, "vcut");
    store_with_blocks(st);
    only_shard(shard, sizeof shard, st);
    assert_int_equal(truncate(shard, 100), 0);
    r = CLI(NULL, "store", "verify", st);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "kvx store reindex"));
    assert_non_null(strstr(r.err, "quarantine/ (kept, not deleted)"));
    assert_null(strstr(r.err, "rebuilds the index from the shards\n"));
    cli_run_free(&r);
    /* ... and the hint is true: reindex moves it there (and exits 1,
     * saying so: a shard was set aside, RECOVER-37). */
    r = CLI(NULL, "store", "reindex", st);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.out, "1 shard file(s) set aside in quarantine/"));
    cli_run_free(&r);
    char q[1200];
    snprintf(q, sizeof q, "%s/quarantine/%s", st, strrchr(shard, '/') + 1);
    assert_true(file_exists(q));
    r = CLI(NULL, "store", "verify", st);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_is_not_an_error),
        cmocka_unit_test(test_stat_and_gc_of_an_empty_store),
        cmocka_unit_test(test_warmup_fifo_input),
        cmocka_unit_test(test_get_names_a_damaged_shard),
        cmocka_unit_test(test_put_of_unhashed_blocks_says_why),
        cmocka_unit_test(test_put_larger_than_the_capacity),
        cmocka_unit_test(test_verify_hints_name_what_helps),
        cmocka_unit_test(test_fifo_input_without_a_writer),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
