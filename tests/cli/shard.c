/*
 * shard.c - cli/cmd_shard.c and cmd_convert.c: `kvx inspect`, `kvx
 * verify` and `kvx convert` run as a user runs them, on shards written
 * with the library's shard writer and on envelopes (the spec's worked
 * example, multi-block v2 and v3): every JSON key of inspect against what
 * was written, exit codes 0/1/2, verify naming each damaged page, convert
 * round trips and refusals.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvx.h"
#include "lib/cli.h"
#include "lib/commit.h"
#include "lib/store.h"

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

/* A file name is bytes, JSON is UTF-8: a name that is not UTF-8 must
 * still give a valid document (each bad byte becomes U+FFFD), and a UTF-8
 * name comes through unchanged. */
static void test_json_names_not_utf8(void **state)
{
    (void)state;
    char p[512];
    path_in(p, sizeof p, "bad\xff\xc3(\xed\xa0\x80.kvx");
    write_shard(p, KVX_FLAG_HASHES);
    cli_run r = CLI(NULL, "inspect", "--json", p);
    jval *v = run_json(&r, 0);
    assert_non_null(strstr(r.out, "bad\\ufffd\\ufffd(\\ufffd\\ufffd\\ufffd.kvx"));
    assert_int_equal((int)jget(v, "num_blocks")->num, 3);
    jfree(v);
    cli_run_free(&r);
    unlink(p);

    path_in(p, sizeof p, "caf\xc3\xa9-\xf0\x9f\x98\x80.kvx");
    write_shard(p, KVX_FLAG_HASHES);
    v = inspect_json(p);
    assert_string_equal(jget(v, "file")->str, p);
    jfree(v);
    unlink(p);
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
    flip_bits(bad, page_offset(bad, 1) + 5, 0x40);
    /* Damage the header (num_layers): structure or meta CRC fails. */
    flip_bits(hdr, 10, 0x40);

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

/* spec/kv-block-hash-and-envelope.txt, "Worked example (v1)": 60 bytes. */
static const uint8_t spec_v1[60] = {
    0x54, 0x4c, 0x4b, 0x56, 0x01, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00,
    0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x66, 0x93,
    0x7b, 0x02, 0xc1, 0xb0, 0x1a, 0xa9, 0x02, 0x00, 0x00, 0x00, 0x00, 0x3c, 0x00, 0x40, 0x00,
    0x42, 0x00, 0x44, 0x00, 0x38, 0x00, 0xbc, 0x00, 0x00, 0x00, 0x34, 0x1c, 0x54, 0x0b, 0x4f,
};

static void test_convert_spec_v1(void **state)
{
    (void)state;
    char env[512], kvx[512], back[512];
    path_in(env, sizeof env, "spec.env");
    path_in(kvx, sizeof kvx, "spec.kvx");
    path_in(back, sizeof back, "spec-back.env");
    write_bytes(env, spec_v1, sizeof spec_v1);

    cli_run r = CLI(NULL, "convert", env, "-o", kvx, "--shard", "3");
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    jval *v = inspect_json(kvx);
    assert_string_equal(jget(v, "quant_format")->str, "fp16");
    assert_int_equal((int)jget(v, "block_tokens")->num, 2);
    assert_int_equal((int)jget(v, "num_blocks")->num, 1);
    jval *e = jget(v, "entries")->items[0];
    assert_string_equal(jget(e, "coordinate")->str, "0x03000000");
    assert_string_equal(jget(e, "hash")->str, "0xa91ab0c1027b9366");
    assert_int_equal((int)jget(e, "token_count")->num, 2);
    assert_int_equal((int)jget(e, "bytes")->num, 16);
    /* With L = Hkv = 1 the page layout equals the payload's: K 1 2 3 4,
     * V 0.5 -1 0 0.25 in f16, at the reported offset. */
    size_t n;
    uint8_t *file = read_bytes(kvx, &n);
    uint64_t off = (uint64_t)jget(e, "offset")->num;
    assert_true(off + 16 <= n);
    assert_memory_equal(file + off, spec_v1 + 40, 16);
    free(file);
    jfree(v);

    /* Back to v1: the same 60 bytes. */
    r = CLI(NULL, "convert", kvx, "-o", back, "--format", "v1");
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    uint8_t *b = read_bytes(back, &n);
    assert_int_equal(n, sizeof spec_v1);
    assert_memory_equal(b, spec_v1, sizeof spec_v1);
    free(b);
}

/* A 3-block v2 envelope (two full blocks with their hashes, a partial
 * tail) made with the library's writer rule. */
static size_t make_v2(uint8_t **out, const kvx_geometry *g)
{
    uint32_t B = g->block_tokens;
    size_t elems = (size_t)g->num_layers * 2 * g->kv_heads * B * g->head_dim;
    size_t ns = (size_t)g->num_layers * 2 * g->kv_heads;
    uint32_t toks[64];
    for (uint32_t i = 0; i < 3 * B; i++) toks[i] = 7 * i + 1;
    uint64_t h[3] = {0, 0, 0};
    kvx_block_hashes(h, toks, 3 * B, B);
    h[2] = 0;
    kvx_envelope_block_in in[3];
    uint8_t *q[3];
    float *sc[3];
    for (int b = 0; b < 3; b++) {
        float *kv = malloc(elems * sizeof *kv);
        for (size_t i = 0; i < elems; i++) kv[i] = (float)((int)((i * 37 + (size_t)b * 11) % 200) - 100) / (float)(13 + b);
        q[b] = malloc(elems);
        sc[b] = malloc(ns * sizeof(float));
        uint32_t nt = b == 2 ? B / 2 : B;
        assert_int_equal(kvx_envelope_quantize_v2(q[b], sc[b], kv, g, nt), 0);
        in[b] = (kvx_envelope_block_in){h[b], nt, q[b], sc[b]};
        free(kv);
    }
    size_t len;
    assert_int_equal(kvx_envelope_size(&len, 2, g, 3), 0);
    *out = malloc(len);
    assert_int_equal(kvx_envelope_export(*out, len, 2, g, in, 3), 0);
    for (int b = 0; b < 3; b++) {
        free(q[b]);
        free(sc[b]);
    }
    return len;
}

/* PROMISE: FORMAT-14 */
static void test_convert_v2_round_trip(void **state)
{
    (void)state;
    kvx_geometry g = {2, 2, 4, 4, KVX_QUANT_E4M3, 0};
    uint8_t *env;
    size_t len = make_v2(&env, &g);
    char ep[512], kp[512], bp[512], v1p[512];
    path_in(ep, sizeof ep, "v2.env");
    path_in(kp, sizeof kp, "v2.kvx");
    path_in(bp, sizeof bp, "v2-back.env");
    path_in(v1p, sizeof v1p, "v2-as-v1.env");
    write_bytes(ep, env, len);

    cli_run r = CLI(NULL, "convert", "-o", kp, ep);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    jval *v = inspect_json(kp);
    assert_string_equal(jget(v, "quant_format")->str, "e4m3");
    assert_true(((unsigned)jget(v, "flags")->num & KVX_FLAG_SCALES) != 0);
    jval *ents = jget(v, "entries");
    assert_int_equal(ents->n, 3);
    assert_string_equal(jget(ents->items[1], "coordinate")->str, "0x00000100");
    assert_int_equal((int)jget(ents->items[2], "token_count")->num, 2);
    jfree(v);

    r = CLI(NULL, "convert", kp, "--format", "v2", "-o", bp);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    size_t n;
    uint8_t *b = read_bytes(bp, &n);
    assert_int_equal(n, len);
    assert_memory_equal(b, env, len);
    free(b);

    /* To v1 works too (f16 of the decoded values) and parses. */
    r = CLI(NULL, "convert", kp, "--format", "v1", "-o", v1p);
    EXPECT_RC(r, 0);
    cli_run_free(&r);
    b = read_bytes(v1p, &n);
    kvx_envelope pe;
    assert_int_equal(kvx_envelope_parse(&pe, b, n, NULL), 0);
    assert_int_equal(pe.version, 1);
    assert_int_equal(pe.n_blocks, 3);
    free(b);
    free(env);
}

/* A v3 envelope (bf16, kvx's extension) with a partial tail block; values
 * exact in f16 unless lossy is set, where element 5 of block 1 (layer 0,
 * K, head 0, token 1, dim 1) becomes bf16 0x0da2 (9.98402083e-31, the
 * bf16 nearest 1e-30). */
static size_t make_v3(uint8_t **outp, const kvx_geometry *g, int lossy)
{
    size_t P = kvx_envelope_payload_bytes(KVX_ENVELOPE_V3, g);
    uint16_t *pl = malloc(P * 3);
    kvx_envelope_block_in in[3];
    for (uint32_t b = 0; b < 3; b++) {
        for (size_t i = 0; i < P / 2; i++)
            pl[b * P / 2 + i] = kvx_f32_to_bf16((float)((int)((i * 7 + b) % 19) - 9) / 8.0f);
        in[b] = (kvx_envelope_block_in){b < 2 ? 0x1111ull * (b + 1) : 0, b < 2 ? g->block_tokens : 2,
                                        pl + b * P / 2, NULL};
    }
    if (lossy) pl[P / 2 + 5] = 0x0DA2;
    size_t len;
    assert_int_equal(kvx_envelope_size(&len, KVX_ENVELOPE_V3, g, 3), 0);
    *outp = malloc(len);
    assert_int_equal(kvx_envelope_export(*outp, len, KVX_ENVELOPE_V3, g, in, 3), 0);
    free(pl);
    return len;
}

/* v3 -> shard -> v3 byte-identical; the shard is BF16 (inspect --json says
 * "bf16", no scale table); -> v1 works while every value fits f16 and is
 * refused (exit 1, the element and its value named, no output) when one
 * does not; v2 always works. */
/* PROMISE: FORMAT-14 */
static void test_convert_v3_round_trip(void **state)
{
    (void)state;
    kvx_geometry g = {2, 2, 4, 4, KVX_QUANT_BF16, 0};
    char ep[512], kp[512], bp[512], v1p[512];
    path_in(ep, sizeof ep, "v3.env");
    path_in(kp, sizeof kp, "v3.kvx");
    path_in(bp, sizeof bp, "v3-back.env");
    path_in(v1p, sizeof v1p, "v3-as-v1.env");
    for (int lossy = 0; lossy < 2; lossy++) {
        uint8_t *env;
        size_t len = make_v3(&env, &g, lossy);
        write_bytes(ep, env, len);
        unlink(kp);
        cli_run r = CLI(NULL, "convert", ep, "-o", kp);
        EXPECT_RC(r, 0);
        cli_run_free(&r);
        jval *v = inspect_json(kp);
        assert_string_equal(jget(v, "quant_format")->str, "bf16");
        assert_true(((unsigned)jget(v, "flags")->num & KVX_FLAG_SCALES) == 0);
        assert_int_equal(jget(v, "entries")->n, 3);
        jfree(v);
        r = CLI(NULL, "convert", kp, "--format", "v3", "-o", bp);
        EXPECT_RC(r, 0);
        cli_run_free(&r);
        size_t n;
        uint8_t *b = read_bytes(bp, &n);
        assert_int_equal(n, len);
        assert_memory_equal(b, env, len);
        free(b);
        unlink(v1p);
        r = CLI(NULL, "convert", kp, "--format", "v1", "-o", v1p);
        if (!lossy) {
            EXPECT_RC(r, 0);
            b = read_bytes(v1p, &n);
            kvx_envelope pe;
            assert_int_equal(kvx_envelope_parse(&pe, b, n, NULL), 0);
            assert_int_equal(pe.version, 1);
            free(b);
        } else {
            EXPECT_RC(r, 1);
            assert_non_null(strstr(r.err, "layer 0, K, head 0, token 1, dim 1"));
            assert_non_null(strstr(r.err, "9.98402083e-31"));
            assert_non_null(strstr(r.err, "0x0da2"));
            assert_non_null(strstr(r.err, "KVX_ELOSSY"));
            assert_false(file_exists(v1p));
        }
        cli_run_free(&r);
        r = CLI(NULL, "convert", kp, "--format", "v2", "-o", v1p);
        EXPECT_RC(r, 0);
        cli_run_free(&r);
        free(env);
    }
}

/* PROMISE: FORMAT-14 */
static void test_convert_refuses_damage(void **state)
{
    (void)state;
    char ep[512], out[512], kp[512];
    path_in(ep, sizeof ep, "damaged.env");
    path_in(out, sizeof out, "damaged-out.kvx");
    path_in(kp, sizeof kp, "damaged.kvx");

    /* A flipped payload byte: the envelope CRC fails. */
    uint8_t bad[60];
    memcpy(bad, spec_v1, 60);
    bad[44] ^= 1;
    write_bytes(ep, bad, 60);
    cli_run r = CLI(NULL, "convert", ep, "-o", out);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "damaged.env"));
    assert_false(file_exists(out));
    cli_run_free(&r);

    /* Truncated. */
    write_bytes(ep, spec_v1, 50);
    r = CLI(NULL, "convert", ep, "-o", out);
    EXPECT_RC(r, 1);
    assert_false(file_exists(out));
    cli_run_free(&r);

    /* A shard with a damaged page does not become an envelope. */
    write_shard(kp, KVX_FLAG_HASHES);
    flip_bits(kp, page_offset(kp, 0), 0x40);
    r = CLI(NULL, "convert", kp, "-o", out, "--format", "v1");
    EXPECT_RC(r, 1);
    assert_false(file_exists(out));
    cli_run_free(&r);

    /* Neither kind of file. */
    write_bytes(ep, "hello world", 11);
    r = CLI(NULL, "convert", ep, "-o", out);
    EXPECT_RC(r, 1);
    assert_non_null(strstr(r.err, "neither"));
    assert_false(file_exists(out));
    cli_run_free(&r);
}

/* PROMISE: CLI-1 */
static void test_convert_usage(void **state)
{
    (void)state;
    char ep[512], kp[512], out[512];
    path_in(ep, sizeof ep, "u.env");
    path_in(kp, sizeof kp, "u.kvx");
    path_in(out, sizeof out, "u-out");
    write_bytes(ep, spec_v1, sizeof spec_v1);
    write_shard(kp, KVX_FLAG_HASHES);
    const char *const cases[][7] = {
        {"convert", ep, NULL},                                 /* no -o */
        {"convert", "-o", out, NULL},                          /* no input */
        {"convert", ep, "-o", out, "--shard", "256", NULL},    /* shard id */
        {"convert", ep, "-o", out, "--format", "v1", NULL},    /* --format for an envelope */
        {"convert", kp, "-o", out, NULL},                      /* shard without --format */
        {"convert", kp, "-o", out, "--format", "v4", NULL},    /* unknown version */
        {"convert", kp, "-o", out, "--shard", "1", NULL},      /* --shard for a shard */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cli_run r = cli_runv(NULL, cases[i]);
        EXPECT_RC(r, 2);
        assert_non_null(strstr(r.err, "kvx convert: "));
        assert_false(file_exists(out));
        cli_run_free(&r);
    }
}

/* An envelope piped in (`... | kvx convert /dev/stdin -o x.kvx`) is read
 * once, to its end: the input is not opened twice (a pipe read twice is
 * empty, a FIFO's second open waits for a writer that never comes). A
 * shard must be a file (it is mapped): from a pipe it is refused by name. */
static int sh_rc(const char *cmd)
{
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

static void test_convert_from_pipe(void **state)
{
    (void)state;
    char ep[512], kp[512], out[512], err[512], cmd[4096];
    path_in(ep, sizeof ep, "pipe.env");
    path_in(kp, sizeof kp, "pipe-src.kvx");
    path_in(out, sizeof out, "pipe.kvx");
    path_in(err, sizeof err, "pipe.err");
    write_bytes(ep, spec_v1, sizeof spec_v1);
    snprintf(cmd, sizeof cmd, "cat '%s' | timeout 20 '%s' convert /dev/stdin -o '%s' --shard 3 2>'%s'",
             ep, KVX_CLI, out, err);
    assert_int_equal(sh_rc(cmd), 0);
    jval *v = inspect_json(out);
    jval *e = jget(v, "entries")->items[0];
    assert_string_equal(jget(e, "hash")->str, "0xa91ab0c1027b9366");
    jfree(v);

    write_shard(kp, KVX_FLAG_HASHES);
    unlink(out);
    snprintf(cmd, sizeof cmd, "cat '%s' | timeout 20 '%s' convert /dev/stdin -o '%s' --format v1 2>'%s'",
             kp, KVX_CLI, out, err);
    assert_int_equal(sh_rc(cmd), 1);
    assert_false(file_exists(out));
    size_t len = 0;
    char *msg = (char *)read_bytes(err, &len);
    msg[len] = '\0';
    assert_non_null(strstr(msg, "regular file"));
    free(msg);
}

static size_t page_bytes_of(uint32_t B) { return 2u * 1 * 1 * B * 4 * 2; }

/* Pages that are a function of (prompt, block): two prompts with equal
 * hashes still have different KV. */
static uint8_t *prompt_pages(uint64_t prompt, size_t nb, uint32_t B)
{
    size_t P = page_bytes_of(B);
    uint8_t *p = malloc(nb * P);
    for (size_t i = 0; i < nb; i++) su_page(p + i * P, P, su_mix(prompt * 977 + i));
    return p;
}

/* The path of the store's only shard. */
static void only_shard(const char *dir, char *out, size_t cap)
{
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s/shards/*.kvx", dir);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    assert_non_null(fgets(out, (int)cap, f));
    pclose(f);
    out[strcspn(out, "\n")] = 0;
}

/* A v2 envelope with a scale that is not finite and > 0 is refused by every
 * store, whatever its quant (it was stored by fp16 and e5m2 stores). */
/* `kvx inspect` names the digest table, lays the scale table after it, and
 * --json gives each entry's digest: the spec's example block [1, 2] has
 * the hashlib digest of test_digest_golden. */
static void test_inspect_shows_digests(void **state)
{
    (void)state;
    char dir[300], shard[600], cmd[1400], out[8192];
    kvx_store *s =
        su_store(dir, sizeof dir, (su_spec){.block_tokens = 2, .capacity = 16 << 20, .shard_bytes = 256 << 10});
    uint32_t t[5] = {1, 2, 3, 4, 5};
    uint8_t *pages = prompt_pages(9, 2, 2);
    assert_int_equal(kvx_store_put(s, t, 5, pages, 2, NULL, NULL), 0);
    assert_int_equal(kvx_store_flush(s), 0);
    kvx_store_close(s);
    free(pages);
    only_shard(dir, shard, sizeof shard);
    snprintf(cmd, sizeof cmd, "%s inspect --json %s", KVX_CLI, shard);
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t got = fread(out, 1, sizeof out - 1, f);
    out[got] = 0;
    assert_int_equal(pclose(f), 0);
    assert_non_null(strstr(out, "\"hash\":\"0xa91ab0c1027b9366\""));
    assert_non_null(strstr(out, "\"digest\":\"34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f\""));
    snprintf(cmd, sizeof cmd, "%s inspect %s", KVX_CLI, shard);
    f = popen(cmd, "r");
    assert_non_null(f);
    got = fread(out, 1, sizeof out - 1, f);
    out[got] = 0;
    assert_int_equal(pclose(f), 0);
    assert_non_null(strstr(out, "digests"));
    assert_non_null(strstr(out, "digest table"));
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

/* A shard holding sequence numbers and tombstones (keyed deletes, no
 * page) inspects, verifies and warms cleanly: inspect shows each entry's
 * sequence number and which are tombstones (text and JSON) and the two
 * tables; verify says OK and counts the tombstones; warmup reads the
 * pages alone. */
static void test_commit_records_shown(void **state)
{
    (void)state;
    char p[512];
    path_in(p, sizeof p, "commit.kvx");
    cm_write(p);
    jval *v = inspect_json(p);
    assert_int_equal((unsigned)jget(v, "flags")->num, CM_FLAGS | KVX_FLAG_META_CRC);
    jval *ents = jget(v, "entries");
    assert_int_equal(ents->n, CM_N);
    for (uint32_t i = 0; i < CM_N; i++) {
        jval *e = ents->items[i];
        assert_int_equal((uint64_t)jget(e, "seq")->num, cm_seqs[i]);
        assert_int_equal(jget(e, "tombstone")->t, JBOOL);
        assert_int_equal(jget(e, "tombstone")->b, cm_lens[i] == 0);
        assert_int_equal((uint32_t)jget(e, "bytes")->num, cm_lens[i]);
    }
    jfree(v);

    cli_run r = CLI(NULL, "inspect", p);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "keys seq tombstones meta-crc"));
    assert_non_null(strstr(r.out, "sequence table"));
    assert_non_null(strstr(r.out, "tombstone table"));
    assert_non_null(strstr(r.out, "  11 tombstone\n")); /* entry 1 */
    assert_non_null(strstr(r.out, "  10\n"));           /* entry 0, a page */
    cli_run_free(&r);

    r = CLI(NULL, "verify", p);
    EXPECT_RC(r, 0);
    assert_non_null(strstr(r.out, "commit.kvx: OK (5 entries, 2 tombstones,"));
    cli_run_free(&r);

    r = CLI(NULL, "warmup", "--sink", "discard", "--io", "pread", "--json", p);
    EXPECT_RC(r, 0);
    v = run_json(&r, 0);
    assert_int_equal((int)jget(v, "pages")->num, CM_PAGES);
    jfree(v);
    cli_run_free(&r);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_inspect_json),
        cmocka_unit_test(test_json_names_not_utf8),
        cmocka_unit_test(test_inspect_text_and_errors),
        cmocka_unit_test(test_verify),
        cmocka_unit_test(test_convert_spec_v1),
        cmocka_unit_test(test_convert_v2_round_trip),
        cmocka_unit_test(test_convert_v3_round_trip),
        cmocka_unit_test(test_convert_refuses_damage),
        cmocka_unit_test(test_convert_usage),
        cmocka_unit_test(test_convert_from_pipe),
        cmocka_unit_test(test_inspect_shows_digests),
        cmocka_unit_test(test_commit_records_shown),
    };
    return cmocka_run_group_tests_name("cli/shard", tests, setup_all, teardown_all);
}
