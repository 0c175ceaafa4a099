/*
 * test_cli_shard.c - `kvx inspect` and `kvx verify` run as a user runs
 * them, on shards written here with the library's shard writer: every
 * JSON key of inspect against what was written (and the page bytes read
 * back at the reported absolute offset), exit codes 0/1/2, and verify
 * naming each damaged file and entry.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "cli_harness.h"
#include "kvx.h"

static char tmpdir[256];

#define NE 3
static const kvx_geometry G = {2, 1, 8, 4, KVX_QUANT_FP16, 0xdeadbeefull};
static uint8_t pages[NE][2 * 2 * 1 * 4 * 8 * 2];
static uint32_t counts[NE] = {4, 4, 3};
static uint64_t hashes[NE];

static void path_in(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", tmpdir, name);
}

/* Three entries in shard 5: two full blocks with hashes, a partial tail;
 * entry 2 carries spectral id 7. */
static void write_shard(const char *path, uint32_t flags)
{
    uint32_t toks[12];
    for (int i = 0; i < 12; i++) toks[i] = 100 + (uint32_t)i;
    kvx_block_hashes(hashes, toks, 12, 4);
    hashes[2] = 0;
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = G;
    o.shard_id = 5;
    o.max_entries = NE;
    o.flags = flags;
    kvx_shard_writer *w = NULL;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    for (uint32_t i = 0; i < NE; i++) {
        uint64_t pb = kvx_page_bytes(&G, counts[i]);
        for (uint64_t k = 0; k < pb; k++) pages[i][k] = (uint8_t)(i * 31 + k * 7 + 1);
        kvx_entry_in e = {0};
        e.radix_block = (uint16_t)i;
        e.spectral = i == 2 ? 7 : 0;
        e.token_count = counts[i];
        e.page = pages[i];
        e.hash = (flags & KVX_FLAG_HASHES) ? hashes[i] : 0;
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    }
    assert_int_equal(kvx_shard_writer_seal(w), 0);
}

static int setup(void **state)
{
    (void)state;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvx-test-cli-shard-XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    rm_rf(tmpdir);
    return 0;
}

static void flip_byte(const char *path, uint64_t off)
{
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
    b ^= 0x40;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
    close(fd);
}

static jval *inspect_json(const char *path)
{
    cli_run r = CLI(NULL, "inspect", "--json", path);
    EXPECT_RC(r, 0);
    jval *v = jparse(r.out);
    if (!v) fprintf(stderr, "not JSON:\n%s\n", r.out);
    assert_non_null(v);
    cli_run_free(&r);
    return v;
}

static void test_inspect_json(void **state)
{
    (void)state;
    char p[512];
    path_in(p, sizeof p, "a.kvx");
    write_shard(p, KVX_FLAG_HASHES);
    jval *v = inspect_json(p);
    assert_int_equal((int)jget(v, "num_layers")->num, 2);
    assert_int_equal((int)jget(v, "kv_heads")->num, 1);
    assert_int_equal((int)jget(v, "head_dim")->num, 8);
    assert_int_equal((int)jget(v, "num_blocks")->num, 3);
    assert_int_equal((int)jget(v, "block_tokens")->num, 4);
    assert_string_equal(jget(v, "model_signature")->str, "0x00000000deadbeef");
    assert_string_equal(jget(v, "quant_format")->str, "fp16");
    assert_true(((unsigned)jget(v, "flags")->num & KVX_FLAG_HASHES) != 0);
    assert_int_equal((int)jget(v, "spectral_offset")->num, 0);
    double kvoff = jget(v, "kv_data_offset")->num;
    assert_true(kvoff > 0 && (uint64_t)kvoff % 4096 == 0);
    jval *ents = jget(v, "entries");
    assert_non_null(ents);
    assert_int_equal(ents->t, JARR);
    assert_int_equal(ents->n, NE);
    int fd = open(p, O_RDONLY);
    assert_true(fd >= 0);
    for (uint32_t i = 0; i < NE; i++) {
        jval *e = ents->items[i];
        char want[32];
        snprintf(want, sizeof want, "0x%08x", KVX_COORD(5, i, i == 2 ? 7 : 0));
        assert_string_equal(jget(e, "coordinate")->str, want);
        assert_int_equal((int)jget(e, "shard")->num, 5);
        assert_int_equal((int)jget(e, "block")->num, (int)i);
        assert_int_equal((int)jget(e, "spectral")->num, i == 2 ? 7 : 0);
        assert_int_equal((int)jget(e, "token_count")->num, (int)counts[i]);
        uint64_t pb = kvx_page_bytes(&G, counts[i]);
        assert_int_equal((uint64_t)jget(e, "bytes")->num, pb);
        snprintf(want, sizeof want, "0x%08x", kvx_crc32(0, pages[i], pb));
        assert_string_equal(jget(e, "crc32")->str, want);
        snprintf(want, sizeof want, "0x%016llx", (unsigned long long)hashes[i]);
        assert_string_equal(jget(e, "hash")->str, want);
        /* offset is absolute: the page's bytes are there in the file. */
        uint64_t off = (uint64_t)jget(e, "offset")->num;
        assert_true(off >= (uint64_t)kvoff && off % 4096 == 0);
        uint8_t buf[sizeof pages[0]];
        assert_int_equal(pread(fd, buf, pb, (off_t)off), (ssize_t)pb);
        assert_memory_equal(buf, pages[i], pb);
    }
    close(fd);
    jfree(v);

    /* Without a hash table every hash is null. */
    path_in(p, sizeof p, "nohash.kvx");
    write_shard(p, 0);
    v = inspect_json(p);
    ents = jget(v, "entries");
    for (size_t i = 0; i < ents->n; i++) assert_int_equal(jget(ents->items[i], "hash")->t, JNULL);
    jfree(v);
}

static void test_inspect_text_and_errors(void **state)
{
    (void)state;
    char p[512], bad[512];
    path_in(p, sizeof p, "t.kvx");
    write_shard(p, KVX_FLAG_HASHES);
    cli_run r = CLI(NULL, "inspect", p);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "L=2 Hkv=1 D=8 B=4 fp16"));
    assert_non_null(strstr(r.out, "0x05000207")); /* entry 2's coordinate */
    assert_non_null(strstr(r.out, "kv data"));
    cli_run_free(&r);

    /* Not a shard: exit 1, the reason on stderr, nothing on stdout. */
    path_in(bad, sizeof bad, "notashard.kvx");
    FILE *f = fopen(bad, "w");
    fputs("hello, this is not a KVX shard at all, just some text long enough to read a header\n", f);
    fclose(f);
    r = CLI(NULL, "inspect", "--json", bad);
    EXPECT_RC(r, 1);
    assert_string_equal(r.out, "");
    assert_non_null(strstr(r.err, "notashard.kvx"));
    cli_run_free(&r);

    r = CLI(NULL, "inspect", "/nonexistent/x.kvx");
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "ENOENT"));
    cli_run_free(&r);

    r = CLI(NULL, "inspect");
    EXPECT_RC(r, 2);
    cli_run_free(&r);
    r = CLI(NULL, "inspect", p, p);
    EXPECT_RC(r, 2);
    cli_run_free(&r);
    r = CLI(NULL, "inspect", "--frob", p);
    EXPECT_RC(r, 2);
    cli_run_free(&r);
}

static void test_verify(void **state)
{
    (void)state;
    char good[512], bad[512], hdr[512];
    path_in(good, sizeof good, "good.kvx");
    path_in(bad, sizeof bad, "badpage.kvx");
    path_in(hdr, sizeof hdr, "badhdr.kvx");
    write_shard(good, KVX_FLAG_HASHES);
    write_shard(bad, KVX_FLAG_HASHES);
    write_shard(hdr, KVX_FLAG_HASHES);

    cli_run r = CLI(NULL, "verify", good);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "good.kvx: OK"));
    cli_run_free(&r);

    /* Damage a byte inside entry 1's page. */
    jval *v = inspect_json(bad);
    uint64_t off = (uint64_t)jget(jget(v, "entries")->items[1], "offset")->num;
    jfree(v);
    flip_byte(bad, off + 5);
    /* Damage the header (num_layers): structure or meta CRC fails. */
    flip_byte(hdr, 10);

    r = CLI(NULL, "verify", good, bad, hdr);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.out, "good.kvx: OK"));
    assert_non_null(strstr(r.out, "badpage.kvx: BAD entry 1 (coordinate 0x05000100)"));
    assert_null(strstr(r.out, "badpage.kvx: BAD entry 0"));
    assert_non_null(strstr(r.out, "badhdr.kvx: BAD"));
    assert_non_null(strstr(r.err, "2 of 3"));
    cli_run_free(&r);

    r = CLI(NULL, "verify", "--quiet", good);
    EXPECT_RC(r, 0);
    assert_string_equal(r.out, "");
    cli_run_free(&r);

    r = CLI(NULL, "verify", "/nonexistent/x.kvx");
    EXPECT_RC(r, 1);
    cli_run_free(&r);

    r = CLI(NULL, "verify");
    EXPECT_RC(r, 2);
    cli_run_free(&r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inspect_json),
        cmocka_unit_test(test_inspect_text_and_errors),
        cmocka_unit_test(test_verify),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
