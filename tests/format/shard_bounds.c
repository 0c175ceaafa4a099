/*
 * shard_bounds.c - format/shard_bounds.c: a shard's header is believed
 * only as far as its file backs it (DESIGN.md rule 5; docs/FORMAT.md
 * "Bounded by the file"). An absurd block_tokens is refused at once, a
 * table past the end of the file is refused naming it, tables (and the
 * spectral bundle) that lie in the holes of a sparse file are refused
 * before anything is read or allocated for them, a shard at the limits
 * opens, and no header field set to an extreme value makes open crash or
 * ask for more memory than an address space of 1 GiB of data holds.
 *
 * The memory bounds run in a forked child under RLIMIT_DATA (heap and
 * anonymous mappings; the shard's read-only file mapping does not count),
 * except under AddressSanitizer, whose shadow memory counts: there the
 * codes and messages are checked alone.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "format/format.h"
#include "format/shard_format.h"
#include "kvx.h"
#include "lib/commit.h"
#include "lib/shard.h"

#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#else
#define UNDER_ASAN 0
#endif

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Runs fn(arg) in a child whose heap is limited to limit bytes (no limit
 * under ASan); returns fn's result (its exit status), 100+ when the child
 * did not exit by itself. fn reports with plain checks (a cmocka assert
 * would unwind into the parent's copy of the runner). */
static int in_child(int (*fn)(void *), void *arg, uint64_t limit)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!UNDER_ASAN) {
            struct rlimit rl = {(rlim_t)limit, (rlim_t)limit};
            if (setrlimit(RLIMIT_DATA, &rl) != 0) _exit(99);
        }
        _exit(fn(arg));
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
}

/* Writes len bytes of b at path, then makes the file size bytes long (a
 * sparse tail when size > len: a hole reads as zeros). */
static void write_sparse(const char *path, const uint8_t *b, size_t len, uint64_t size)
{
    write_bytes(path, b, len);
    if (size != len) assert_int_equal(truncate(path, (off_t)size), 0);
}

static void fix_meta_crc(uint8_t *b)
{
    kvx_shard_header h;
    kvx_header_decode(&h, b);
    kvx_shard_layout lay = {0};
    assert_int_equal(kvx_shard_layout_for(&lay, h.num_blocks, h.flags, h.block_tokens, h.num_layers, h.kv_heads), 0);
    kvx_store32(b + KVX_H_META_CRC, kvx_crc32c(kvx_crc32c(0, b, 60), b + 64, lay.tables_end - 64));
}

/* The 8 KiB sparse shard of the report: one entry of one token (a 16-byte
 * zero page at kv offset 0) with a hash and a lineage table of
 * 8 + 4*B bytes, the lineage in a hole; the file ends one page after
 * kv_data_offset, so every table lies within its size. 4096 bytes of
 * header and tables are written into b; returns the file's size. */
static uint64_t sparse_lineage(uint8_t b[4096], uint32_t B)
{
    const uint32_t n = 1;
    memset(b, 0, 4096);
    kvx_shard_header h = {0};
    h.format_version = KVX_FORMAT_VERSION;
    h.num_layers = 1;
    h.kv_heads = 1;
    h.head_dim = 4;
    h.num_blocks = n;
    h.block_tokens = B;
    h.quant = KVX_QUANT_FP16;
    h.flags = KVX_FLAG_HASHES | KVX_FLAG_LINEAGE;
    kvx_shard_layout lay = {0};
    assert_int_equal(kvx_shard_layout_for(&lay, n, h.flags, B, 1, 1), 0);
    h.kv_data_offset = (lay.tables_end + 4095) / 4096 * 4096;
    kvx_header_encode(b, &h);
    uint8_t zero[16] = {0};
    uint8_t *e = b + 64;
    kvx_store32(e + KVX_E_TOKENS, 1);
    kvx_store32(e + KVX_E_BYTES, 16);
    kvx_store32(e + KVX_E_CRC, kvx_crc32(0, zero, 16));
    return h.kv_data_offset + 4096;
}

typedef struct open_case {
    const char *path;
    int code;          /* the code open must give */
    const char *names; /* text the message must hold */
    const char *names2;
} open_case;

/* Child: opens c->path, checks the code and the message. 0 passed, 2 the
 * heap limit was hit (-ENOMEM), 3 another code or message. */
static int open_expect(void *arg)
{
    const open_case *c = arg;
    kvx_shard *s = NULL;
    int rc = kvx_shard_open(&s, c->path, 0);
    if (rc == 0) kvx_shard_close(s);
    if (rc == -ENOMEM) {
        fprintf(stderr, "%s: -ENOMEM (%s)\n", c->path, kvx_last_error());
        return 2;
    }
    if (rc != c->code || (c->names && !strstr(kvx_last_error(), c->names)) ||
        (c->names2 && !strstr(kvx_last_error(), c->names2))) {
        fprintf(stderr, "%s: %s (%s), expected %s naming \"%s\"\n", c->path, kvx_err_name(rc), kvx_last_error(),
                kvx_err_name(c->code), c->names ? c->names : "");
        return 3;
    }
    return 0;
}

/* A header declaring block_tokens 2^28 or 2^32-1 in an 8 KiB sparse file
 * (the lineage table, 1 GiB or 16 GiB, in its hole) asked for twice that
 * in memory and took seconds (kvx verify: 5.6 s and 2.1 GB for 2^28). Now
 * refused at once, KVX_EFORMAT naming the field, its value and the limit,
 * under a 256 MiB heap; and so does `kvx verify`. One past the limit too. */
/* PROMISE: BOUND-7 */
static void test_absurd_block_tokens(void **state)
{
    (void)state;
    static const uint32_t bs[] = {1u << 28, 0xFFFFFFFFu, KVX_MAX_BLOCK_TOKENS + 1};
    for (size_t k = 0; k < sizeof bs / sizeof bs[0]; k++) {
        uint8_t b[4096];
        uint64_t size = sparse_lineage(b, bs[k]);
        const char *path = path_of("absurd.kvx");
        write_sparse(path, b, sizeof b, size);
        /* one page at kv_data_offset: 8 KiB of data in all */
        int fd = open(path, O_WRONLY);
        assert_true(fd >= 0);
        uint8_t zero[16] = {0};
        assert_int_equal(pwrite(fd, zero, 16, (off_t)(size - 4096)), 16);
        close(fd);
        char want[64];
        snprintf(want, sizeof want, "block_tokens %u exceeds %u", bs[k], KVX_MAX_BLOCK_TOKENS);
        open_case c = {path, KVX_EFORMAT, want, NULL};
        double t0 = now_s();
        assert_int_equal(in_child(open_expect, &c, 256u << 20), 0);
        assert_true(now_s() - t0 < 5.0);
        char cmd[1200], out[4096] = "";
        snprintf(cmd, sizeof cmd, "%s%s verify %s 2>&1", UNDER_ASAN ? "" : "ulimit -d 262144; ", KVX_CLI, path);
        FILE *p = popen(cmd, "r");
        assert_non_null(p);
        size_t got = fread(out, 1, sizeof out - 1, p);
        out[got] = '\0';
        int st = pclose(p);
        assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
        assert_non_null(strstr(out, want));
        assert_non_null(strstr(out, "KVX_EFORMAT"));
        unlink(path);
    }
}

/* Writes the block fixture with every block table, sequence numbers and
 * the spectral bundle. */
static void write_blocks(const char *path, uint32_t extra_flags)
{
    fixture f;
    fixture_init(&f, KVX_QUANT_E4M3, ALL_FLAGS | KVX_FLAG_DIGEST | extra_flags, 1);
    kvx_shard_writer_options o = options(&f);
    kvx_shard_writer *w;
    assert_int_equal(kvx_shard_writer_create(&w, path, &o), 0);
    for (int i = 0; i < NENT; i++) {
        kvx_entry_in e = entry_in(&f, i);
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
    }
    kvx_shard_writer_seq_unset(w, 5);
    assert_int_equal(kvx_shard_writer_seal(w), 0);
}

/* Each table of a shard ending past the end of the file (the file cut one
 * byte short of the table's end) is refused with KVX_ETRUNC naming that
 * table, before anything is read for it: the eight tables of a block
 * shard (coordinate, hash, lineage, digest, scale, sequence) and of a
 * keyed one (key, sequence, tombstone). */
/* PROMISE: BOUND-7 */
static void test_table_past_eof(void **state)
{
    (void)state;
    write_blocks(path_of("blocks.kvx"), KVX_FLAG_SEQ);
    cm_write(path_of("keyed.kvx"));
    const char *files[2] = {"blocks.kvx", "keyed.kvx"};
    int seen = 0;
    for (int fi = 0; fi < 2; fi++) {
        size_t len;
        uint8_t *b = read_file(path_of(files[fi]), &len);
        kvx_shard_header h;
        kvx_header_decode(&h, b);
        kvx_shard_layout lay = {0};
        assert_int_equal(kvx_shard_layout_for(&lay, h.num_blocks, h.flags, h.block_tokens, h.num_layers, h.kv_heads),
                         0);
        const struct {
            const char *name;
            uint64_t off, bytes;
        } t[] = {
            {"coordinate table", lay.coord_off, lay.coord_bytes}, {"hash table", lay.hash_off, lay.hash_bytes},
            {"lineage table", lay.lineage_off, lay.lineage_bytes}, {"digest table", lay.digest_off, lay.digest_bytes},
            {"scale table", lay.scale_off, lay.scale_bytes},       {"key table", lay.key_off, lay.key_bytes},
            {"sequence table", lay.seq_off, lay.seq_bytes},        {"tombstone table", lay.tomb_off, lay.tomb_bytes},
        };
        for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
            if (!t[k].bytes) continue;
            seen |= 1 << k;
            int rc = open_bytes(b, (size_t)(t[k].off + t[k].bytes - 1));
            if (rc != KVX_ETRUNC || !strstr(kvx_last_error(), t[k].name) ||
                !strstr(kvx_last_error(), "past the end of the file"))
                fail_msg("%s cut inside its %s: %s (%s)", files[fi], t[k].name, kvx_err_name(rc), kvx_last_error());
        }
        assert_int_equal(open_bytes(b, len), 0);
        free(b);
    }
    assert_int_equal(seen, 0xFF); /* all eight tables were cut */
}

/* Tables within the file's size but in its holes: the lineage table of
 * B = 2^20 (the limit), a scale table of L = Hkv = 4096 (128 MiB an entry),
 * a key table of 65536 entries, and a spectral bundle of 64 MiB, each in a
 * file holding 8 KiB of data. Each is refused with KVX_ETRUNC naming it
 * before it is read or allocated (a 64 MiB heap), where they were read
 * (the scale table's 128 MiB, the bundle's 64 MiB) and checked. */
/* PROMISE: BOUND-7 */
static void test_sparse_tables_refused(void **state)
{
    (void)state;
    uint8_t b[4096];
    struct {
        const char *file, *names, *names2;
        uint64_t size;
    } cases[4];
    /* the lineage table: 4 MiB + 8 */
    cases[0].size = sparse_lineage(b, KVX_MAX_BLOCK_TOKENS);
    write_sparse(path_of("lineage.kvx"), b, sizeof b, cases[0].size);
    cases[0].file = "lineage.kvx";
    cases[0].names = "lineage table (num_blocks 1 x 4194312 bytes: 8 + 4 x block_tokens 1048576)";
    cases[0].names2 = "counts holes";
    /* a scale table: one entry, 8 * 4096 * 4096 bytes */
    memset(b, 0, sizeof b);
    kvx_shard_header h = {.format_version = KVX_FORMAT_VERSION, .num_layers = 4096, .kv_heads = 4096, .head_dim = 1,
                          .num_blocks = 1, .quant = KVX_QUANT_E4M3, .flags = KVX_FLAG_SCALES};
    kvx_shard_layout lay = {0};
    assert_int_equal(kvx_shard_layout_for(&lay, 1, h.flags, 0, 4096, 4096), 0);
    h.kv_data_offset = (lay.tables_end + 4095) / 4096 * 4096;
    kvx_header_encode(b, &h);
    kvx_store32(b + 64 + KVX_E_TOKENS, 1);
    kvx_store32(b + 64 + KVX_E_BYTES, 2u * 4096 * 4096);
    cases[1].size = h.kv_data_offset + 2u * 4096 * 4096;
    write_sparse(path_of("scale.kvx"), b, sizeof b, cases[1].size);
    cases[1].file = "scale.kvx";
    cases[1].names = "scale table (num_blocks 1 x 134217728 bytes: 4 x 2 x num_layers 4096 x kv_heads 4096)";
    cases[1].names2 = NULL;
    /* a key table of 65536 records (16 MiB; the coordinate table 1.5 MiB) */
    memset(b, 0, sizeof b);
    kvx_geometry kg;
    assert_int_equal(kvx_keyed_geometry(&kg, 4096), 0);
    h = (kvx_shard_header){.format_version = KVX_FORMAT_VERSION, .num_layers = (uint16_t)kg.num_layers,
                           .kv_heads = (uint16_t)kg.kv_heads, .head_dim = (uint16_t)kg.head_dim,
                           .num_blocks = KVX_MAX_ENTRIES, .quant = kg.quant, .flags = KVX_FLAG_KEYS};
    assert_int_equal(kvx_shard_layout_for(&lay, KVX_MAX_ENTRIES, h.flags, 0, h.num_layers, h.kv_heads), 0);
    h.kv_data_offset = (lay.tables_end + 4095) / 4096 * 4096;
    kvx_header_encode(b, &h);
    cases[2].size = h.kv_data_offset + 4096;
    write_sparse(path_of("keys.kvx"), b, sizeof b, cases[2].size);
    cases[2].file = "keys.kvx";
    cases[2].names = "key table (num_blocks 65536 x 256 bytes: 256)";
    cases[2].names2 = NULL;
    /* a spectral bundle: 1 cartridge, 1 layer, d = r = 4096 (64 MiB) */
    memset(b, 0, sizeof b);
    h = (kvx_shard_header){.format_version = KVX_FORMAT_VERSION, .num_layers = 1, .kv_heads = 1, .head_dim = 1,
                           .num_blocks = 0, .quant = KVX_QUANT_FP16, .spectral_dim = 4096, .spectral_offset = 64};
    uint64_t blen = kvx_spectral_bundle_bytes(1, 1, 4096, 4096);
    assert_true(blen > (64u << 20));
    h.kv_data_offset = (64 + blen + 4095) / 4096 * 4096;
    kvx_header_encode(b, &h);
    uint8_t *sh = b + 64;
    kvx_store32(sh + KVX_S_COUNT, 1);
    kvx_store32(sh + KVX_S_LAYERS, 1);
    kvx_store32(sh + KVX_S_DIM, 4096);
    kvx_store32(sh + KVX_S_RANK, 4096);
    cases[3].size = h.kv_data_offset;
    write_sparse(path_of("bundle.kvx"), b, sizeof b, cases[3].size);
    cases[3].file = "bundle.kvx";
    cases[3].names = "spectral bundle of 67108904 bytes (spectral_dim 4096)";
    cases[3].names2 = NULL;
    for (int k = 0; k < 4; k++) {
        char path[512];
        snprintf(path, sizeof path, "%s", path_of(cases[k].file));
        open_case c = {path, KVX_ETRUNC, cases[k].names, cases[k].names2};
        if (in_child(open_expect, &c, 64u << 20) != 0) fail_msg("case %s", cases[k].file);
        assert_int_equal(open_expect(&c), 0); /* and in this process */
        unlink(path);
    }
}

/* Writes a shard of block_tokens B (E4M3, L = Hkv = D = 1) with hashes,
 * lineage and digests: with full != 0 a full block (tokens tok, digest
 * made) and a partial one (3 tokens), else n partial blocks (i + 1
 * tokens). Returns the writer's code (create's, or 0). */
static int write_at_limit(const char *path, uint32_t B, int full, uint32_t n, const uint32_t *tok, const uint8_t *page)
{
    kvx_shard_writer_options o = KVX_SHARD_WRITER_OPTIONS_INIT;
    o.geometry = (kvx_geometry){1, 1, 1, B, KVX_QUANT_E4M3, 9};
    o.shard_id = 2;
    o.max_entries = full ? 2 : n;
    o.flags = KVX_FLAG_HASHES | KVX_FLAG_LINEAGE | KVX_FLAG_DIGEST;
    kvx_shard_writer *w;
    int rc = kvx_shard_writer_create(&w, path, &o);
    if (rc) return rc;
    uint64_t parent = 0;
    if (full) {
        uint8_t dg[KVX_DIGEST_BYTES];
        kvx_prefix_digest_next(dg, NULL, tok, B);
        kvx_entry_in e = {.radix_block = 0, .token_count = B, .page = page, .tokens = tok, .digest = dg};
        e.hash = parent = kvx_block_hash(0, tok, B);
        assert_int_equal(kvx_shard_writer_add(w, &e), 0);
        n = 1;
    }
    for (uint32_t i = 0; i < n; i++) {
        kvx_entry_in p = {.radix_block = (uint16_t)(1 + i), .token_count = full ? 3 : i + 1, .page = page,
                          .tokens = tok, .parent = parent};
        assert_int_equal(kvx_shard_writer_add(w, &p), 0);
    }
    return kvx_shard_writer_seal(w);
}

/* A shard at the limits opens: block_tokens 2^20 with hashes, lineage and
 * digests, a full block (its 2^20 tokens and digest read back) and a
 * partial one; its lineage table (8 MiB) is data, so it is read. A shard
 * of 8 partial blocks of that B (a 32 MiB lineage table) opens too; with
 * that table's bytes punched out as holes (what a hole-punching copy may
 * make of zeros) it holds about 40 KiB of data and is refused, KVX_ETRUNC
 * naming the table. block_tokens 2^20 + 1 is refused by the writer
 * (KVX_EINVALID) and by the reader (KVX_EFORMAT, the meta CRC made right). */
/* PROMISE: BOUND-7 */
static void test_limits_open(void **state)
{
    (void)state;
    char path[512], part[512]; /* path_of's buffer is reused */
    snprintf(path, sizeof path, "%s", path_of("limit.kvx"));
    snprintf(part, sizeof part, "%s", path_of("partial.kvx"));
    const uint32_t B = KVX_MAX_BLOCK_TOKENS;
    uint32_t *tok = malloc(sizeof(uint32_t) * B);
    uint8_t *page = malloc(2u * B);
    assert_non_null(tok);
    assert_non_null(page);
    for (uint32_t t = 0; t < B; t++) tok[t] = t * 2654435761u;
    for (uint32_t t = 0; t < 2u * B; t++) page[t] = (uint8_t)(t * 31u + 7u);
    assert_int_equal(write_at_limit(path, B, 1, 0, tok, page), 0);
    kvx_shard *s;
    assert_int_equal(kvx_shard_open(&s, path, KVX_OPEN_VERIFY_PAGES), 0);
    assert_int_equal(kvx_shard_get_info(s)->geometry.block_tokens, B);
    kvx_entry got;
    assert_int_equal(kvx_shard_entry(&got, s, 0), 0);
    assert_true(got.hash == kvx_block_hash(0, tok, B));
    assert_memory_equal(got.tokens, tok, sizeof(uint32_t) * B);
    assert_non_null(got.digest);
    assert_int_equal(kvx_shard_entry(&got, s, 1), 0);
    assert_memory_equal(got.tokens, tok, 3 * sizeof(uint32_t));
    assert_int_equal(got.tokens[3], 0);
    kvx_shard_close(s);

    /* one past the limit */
    assert_int_equal(write_at_limit(path_of("over.kvx"), B + 1, 1, 0, tok, page), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "block_tokens 1048577 exceeds 1048576"));
    size_t len;
    uint8_t *b = read_file(path, &len);
    kvx_store32(b + KVX_H_BLOCK_TOKENS, B + 1);
    assert_int_equal(open_bytes(b, len), KVX_EFORMAT);
    assert_non_null(strstr(kvx_last_error(), "header: block_tokens 1048577 exceeds 1048576"));
    free(b);

    /* partial blocks: the lineage table is most of the file */
    assert_int_equal(write_at_limit(part, B, 0, 8, tok, page), 0);
    assert_int_equal(kvx_shard_open(&s, part, KVX_OPEN_VERIFY_PAGES), 0);
    assert_int_equal(kvx_shard_entry(&got, s, 7), 0);
    assert_memory_equal(got.tokens, tok, 8 * sizeof(uint32_t));
    kvx_shard_close(s);
    b = read_file(part, &len);
    kvx_shard_header h;
    kvx_header_decode(&h, b);
    kvx_shard_layout lay = {0};
    assert_int_equal(kvx_shard_layout_for(&lay, h.num_blocks, h.flags, h.block_tokens, 1, 1), 0);
    free(b);
    int fd = open(part, O_RDWR);
    assert_true(fd >= 0);
    uint64_t from = (lay.lineage_off + 4095) / 4096 * 4096, to = (lay.lineage_off + lay.lineage_bytes) / 4096 * 4096;
    int punched = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)from, (off_t)(to - from)) == 0;
    fsync(fd);
    close(fd);
    if (punched) {
        open_case c = {part, KVX_ETRUNC, "lineage table (num_blocks 8 x 4194312 bytes: 8 + 4 x block_tokens 1048576)",
                       "counts holes"};
        assert_int_equal(open_expect(&c), 0);
    } else {
        print_message("the file system cannot punch holes: that part skipped\n");
    }
    free(tok);
    free(page);
}

/* ---- every header field at its extremes ---------------------------------- */

typedef struct base_file {
    uint8_t *b;
    size_t len;
} base_file;

static const struct field {
    const char *name;
    unsigned off, width;
} fields[] = {
    {"format_version", KVX_H_VERSION, 2}, {"num_layers", KVX_H_LAYERS, 2},
    {"kv_heads", KVX_H_HEADS, 2},         {"head_dim", KVX_H_HEAD_DIM, 2},
    {"num_blocks", KVX_H_NUM_BLOCKS, 4},  {"block_tokens", KVX_H_BLOCK_TOKENS, 4},
    {"model_signature", KVX_H_MODEL_SIG, 8}, {"quant", KVX_H_QUANT, 4},
    {"spectral_dim", KVX_H_SPECTRAL_DIM, 4}, {"spectral_offset", KVX_H_SPECTRAL_OFF, 8},
    {"kv_data_offset", KVX_H_KV_OFF, 8},  {"flags", KVX_H_FLAGS, 4},
    {"meta_crc32c", KVX_H_META_CRC, 4},
};

static const uint64_t extremes[] = {0, 1, 1ull << 15, 0xFFFFull, 1ull << 31, 0xFFFFFFFFull, 1ull << 32, 1ull << 63,
                                    UINT64_MAX};

static void store_width(uint8_t *p, unsigned width, uint64_t v)
{
    if (width == 2) kvx_store16(p, (uint16_t)v);
    else if (width == 4) kvx_store32(p, (uint32_t)v);
    else kvx_store64(p, v);
}

typedef struct mutation_run {
    base_file base[3];
    int variants, opened, refused;
    char detail[600];
} mutation_run;

/* Opens path (size bytes); 0 when open refused it with a kvx code or
 * opened it with every page served, missing (past the end) or failing its
 * CRC, and every table within the file; else 1 with r->detail set. */
static int open_checked(mutation_run *r, const char *path, uint64_t size)
{
    kvx_shard *s = NULL;
    int rc = kvx_shard_open(&s, path, 0);
    if (rc) {
        r->refused++;
        if (rc > -30001 || rc < -30037 || s) {
            snprintf(r->detail, sizeof r->detail, "open: %s (%s)", kvx_err_name(rc), kvx_last_error());
            return 1;
        }
        return 0;
    }
    r->opened++;
    const kvx_shard_info *info = kvx_shard_get_info(s);
    kvx_shard_layout lay = {0};
    int bad = info->file_size != size ||
              kvx_shard_layout_for(&lay, info->num_blocks, info->flags, info->geometry.block_tokens,
                                   info->geometry.num_layers, info->geometry.kv_heads) != 0 ||
              lay.tables_end > size || info->kv_data_offset > size;
    for (uint32_t i = 0; i < info->num_blocks && !bad; i++) {
        kvx_entry e;
        const void *p;
        bad |= kvx_shard_entry(&e, s, i) != 0;
        int prc = kvx_shard_page(&p, s, i, 1);
        bad |= !(prc == 0 || prc == KVX_EPAGECRC || prc == KVX_ETRUNC || prc == KVX_ENOTFOUND);
        bad |= prc == 0 && e.offset + e.bytes > size;
    }
    if (bad) snprintf(r->detail, sizeof r->detail, "opened with a table or page outside its %llu bytes",
                      (unsigned long long)size);
    kvx_shard_close(s);
    return bad;
}

/* Writes variant v of the mutated image b (bf's bytes, header edited) to
 * path and sets *size: bit1, a sparse tail up to 1 TiB; bit2 (with bit1),
 * the header made consistent around the edit as a crafted file would be:
 * the bundle and the KV section moved past the tables the edited header
 * sizes (the part of them the base does not have is a hole), so that no
 * overlap check stops open before the tables; bit0, the meta CRC made
 * right where the tables are at most 64 MiB. 0, 1 to skip the variant, 4
 * on an I/O error. */
static int write_variant(const char *path, const base_file *bf, uint8_t *b, int v, uint64_t *size)
{
    kvx_shard_header h;
    kvx_header_decode(&h, b);
    kvx_shard_layout lay = {0};
    int lay_ok = kvx_shard_layout_for(&lay, h.num_blocks, h.flags, h.block_tokens, h.num_layers, h.kv_heads) == 0;
    *size = v & 2 ? 1ull << 40 : bf->len;
    if (!(v & 4)) {
        if ((v & 1) && lay_ok && lay.tables_end <= bf->len) fix_meta_crc(b);
        FILE *fp = fopen(path, "wb");
        if (!fp || fwrite(b, 1, bf->len, fp) != bf->len || fclose(fp) != 0) return 4;
        if (*size != bf->len && truncate(path, (off_t)*size) != 0) return 4;
        return 0;
    }
    if (!(v & 2) || !lay_ok) return 1;
    kvx_shard_header old;
    kvx_header_decode(&old, bf->b);
    uint64_t blen = old.spectral_offset ? old.kv_data_offset - old.spectral_offset : 0; /* bundle and gap */
    uint64_t kvlen = bf->len - old.kv_data_offset;
    uint64_t so = old.spectral_offset ? (lay.tables_end + 63) / 64 * 64 : 0;
    uint64_t kv = ((so ? so + blen : lay.tables_end) + 4095) / 4096 * 4096;
    if (lay.tables_end > (1ull << 39) || kv + kvlen > *size) return 1;
    if (h.spectral_offset) kvx_store64(b + KVX_H_SPECTRAL_OFF, so);
    kvx_store64(b + KVX_H_KV_OFF, kv);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) return 4;
    uint64_t keep = old.spectral_offset ? old.spectral_offset : old.kv_data_offset; /* header and tables */
    if (keep > lay.tables_end) keep = lay.tables_end;
    int ok = ftruncate(fd, (off_t)*size) == 0 && pwrite(fd, b, (size_t)keep, 0) == (ssize_t)keep &&
             (!blen || pwrite(fd, bf->b + old.spectral_offset, (size_t)blen, (off_t)so) == (ssize_t)blen) &&
             pwrite(fd, bf->b + old.kv_data_offset, (size_t)kvlen, (off_t)kv) == (ssize_t)kvlen;
    if (ok && (v & 1) && lay.tables_end <= (64u << 20)) {
        uint8_t *t = malloc((size_t)lay.tables_end);
        ok = t && pread(fd, t, (size_t)lay.tables_end, 0) == (ssize_t)lay.tables_end;
        if (ok) {
            uint32_t crc = kvx_crc32c(kvx_crc32c(0, b, 60), t + 64, lay.tables_end - 64);
            kvx_store32(b + KVX_H_META_CRC, crc);
            ok = pwrite(fd, b, 64, 0) == 64;
        }
        free(t);
    }
    return close(fd) == 0 && ok ? 0 : 4;
}

/* Child: every field of every base at every extreme, in each variant of
 * write_variant; then the spectral sub-header's fields. */
static int mutate_all(void *arg)
{
    mutation_run *r = arg;
    const char *path = path_of("mut.kvx");
    for (int bi = 0; bi < 3; bi++)
        for (size_t fi = 0; fi < sizeof fields / sizeof fields[0]; fi++)
            for (size_t vi = 0; vi < sizeof extremes / sizeof extremes[0]; vi++)
                for (int v = 0; v < 8; v++) {
                    const base_file *bf = &r->base[bi];
                    uint8_t *b = malloc(bf->len);
                    if (!b) return 4;
                    memcpy(b, bf->b, bf->len);
                    store_width(b + fields[fi].off, fields[fi].width, extremes[vi]);
                    uint64_t size;
                    /* a fixed meta CRC would undo an edit of meta_crc32c itself */
                    int w = write_variant(path, bf, b, fields[fi].off == KVX_H_META_CRC ? v & ~1 : v, &size);
                    free(b);
                    if (w == 1) continue;
                    if (w) return w;
                    r->variants++;
                    if (open_checked(r, path, size)) {
                        fprintf(stderr, "base %d, %s = 0x%llx, variant %d: %s\n", bi, fields[fi].name,
                                (unsigned long long)extremes[vi], v, r->detail);
                        return 1;
                    }
                }
    /* the spectral sub-header of the block base (spectral_dim set to the
     * bundle's dim when that is the field; rank set to dim in odd rounds,
     * the largest bundle for a dim) */
    const base_file *bf = &r->base[0];
    uint64_t so = kvx_load64(bf->b + KVX_H_SPECTRAL_OFF);
    for (unsigned sf = 0; sf < 5; sf++)
        for (size_t vi = 0; vi < sizeof extremes / sizeof extremes[0]; vi++)
            for (int v = 0; v < 4; v++) {
                uint8_t *b = malloc(bf->len);
                if (!b) return 4;
                memcpy(b, bf->b, bf->len);
                kvx_store32(b + so + 4 * sf, (uint32_t)extremes[vi]);
                if (sf == 3) kvx_store32(b + KVX_H_SPECTRAL_DIM, (uint32_t)extremes[vi]);
                if (v & 1) kvx_store32(b + so + KVX_S_RANK, kvx_load32(b + so + KVX_S_DIM));
                uint64_t size;
                int w = write_variant(path, bf, b, v | 1, &size);
                free(b);
                if (w == 1) continue;
                if (w) return w;
                r->variants++;
                if (open_checked(r, path, size)) {
                    fprintf(stderr, "spectral field %u = 0x%llx, variant %d: %s\n", sf,
                            (unsigned long long)extremes[vi], v, r->detail);
                    return 1;
                }
            }
    unlink(path);
    fprintf(stderr, "header extremes: %d files, %d opened, %d refused\n", r->variants, r->opened, r->refused);
    return r->opened > 0 && r->refused > 0 ? 0 : 5;
}

/* Every header field (and the spectral sub-header's) set to 0, 1, 2^15,
 * 2^16-1, 2^31, 2^32-1, 2^32, 2^63 and 2^64-1 (cut to its width), in a
 * block shard with every table and the bundle, a keyed shard with
 * tombstones and a shard without tables, with the meta CRC as it is and
 * made right, in the file as written and with a sparse tail up to 1 TiB:
 * open either refuses with a kvx code or opens a shard whose tables and
 * served pages lie within the file; it never crashes (the ASan build runs
 * it too) and never needs more than a 1 GiB heap (-ENOMEM is a failure:
 * before, a block_tokens of 2^31 in the sparse file asked for 32 GiB). */
/* PROMISE: BOUND-7 */
static void test_header_extremes(void **state)
{
    (void)state;
    write_blocks(path_of("mb.kvx"), KVX_FLAG_SEQ);
    cm_write(path_of("mk.kvx"));
    fixture f;
    fixture_init(&f, KVX_QUANT_FP16, 0, 0);
    assert_int_equal(write_fixture(&f, path_of("m0.kvx")), 0);
    mutation_run *r = calloc(1, sizeof *r);
    assert_non_null(r);
    r->base[0].b = read_file(path_of("mb.kvx"), &r->base[0].len);
    r->base[1].b = read_file(path_of("mk.kvx"), &r->base[1].len);
    r->base[2].b = read_file(path_of("m0.kvx"), &r->base[2].len);
    assert_int_equal(in_child(mutate_all, r, 1ull << 30), 0);
    for (int i = 0; i < 3; i++) free(r->base[i].b);
    free(r);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_absurd_block_tokens, fx_clean),
        cmocka_unit_test_setup(test_table_past_eof, fx_clean),
        cmocka_unit_test_setup(test_sparse_tables_refused, fx_clean),
        cmocka_unit_test_setup(test_limits_open, fx_clean),
        cmocka_unit_test_setup(test_header_extremes, fx_clean),
    };
    return cmocka_run_group_tests_name("format/shard_bounds", tests, fx_setup, fx_teardown);
}
