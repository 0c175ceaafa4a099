/*
 * cmd_shard.c - the shard file commands `kvx inspect` and `kvx verify`.
 *
 * Each is a thin layer over the public shard API: the library applies every
 * validation rule; this file only decides what a user sees (a readable
 * report, or the JSON keys tools script against) and the exit code.
 */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *quant_str(uint32_t q)
{
    const char *n = kvx_quant_name(q);
    return n ? n : "unknown";
}

static void flags_str(char *buf, size_t cap, uint32_t f)
{
    snprintf(buf, cap, "0x%x%s%s%s%s%s%s%s%s%s", f, f ? " (" : "", (f & KVX_FLAG_HASHES) ? "hashes " : "",
             (f & KVX_FLAG_LINEAGE) ? "lineage " : "", (f & KVX_FLAG_DIGEST) ? "digests " : "",
             (f & KVX_FLAG_SCALES) ? "scales " : "", (f & KVX_FLAG_KEYS) ? "keys " : "",
             (f & KVX_FLAG_SEQ) ? "seq " : "", (f & KVX_FLAG_TOMB) ? "tombstones " : "",
             (f & KVX_FLAG_META_CRC) ? "meta-crc " : "");
    size_t n = strlen(buf);
    if (f && n > 0 && buf[n - 1] == ' ') {
        buf[n - 1] = ')';
    }
}

/* ------------------------------------------------------------- inspect */

static void print_section(const char *name, uint64_t off, uint64_t bytes)
{
    char s[32];
    printf("  %-18s 0x%08" PRIx64 " .. 0x%08" PRIx64 "  %s\n", name, off, off + bytes,
           cli_fmt_size(s, sizeof s, bytes));
}

static int run_inspect(const cli_cmd *self, int argc, char **argv)
{
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int json = 0, ch;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, ":jh", opts, NULL)) != -1) {
        switch (ch) {
        case 'j': json = 1; break;
        case 'h': cli_print_help(self); return CLI_OK;
        default: return cli_getopt_error(self, ch, argv, opts);
        }
    }
    if (argc - optind != 1) return cli_usage(self, "expected one FILE.kvx");
    const char *path = argv[optind];
    if (cli_require_regular(self, path, "a shard") != CLI_OK) return CLI_FAIL;

    kvx_shard *s = NULL;
    int rc = kvx_shard_open(&s, path, 0);
    if (rc != 0) return cli_fail_code(self, rc, "cannot open '%s'", path);
    const kvx_shard_info *in = kvx_shard_get_info(s);
    const kvx_geometry *g = &in->geometry;
    uint64_t n = in->num_blocks;

    if (json) {
        cli_json j;
        cli_json_init(&j, stdout);
        cli_json_obj_begin(&j);
        cli_json_key(&j, "file");
        cli_json_str(&j, path);
        cli_json_key(&j, "file_size");
        cli_json_u64(&j, in->file_size);
        cli_json_key(&j, "format_version");
        cli_json_u64(&j, in->format_version);
        cli_json_key(&j, "num_layers");
        cli_json_u64(&j, g->num_layers);
        cli_json_key(&j, "kv_heads");
        cli_json_u64(&j, g->kv_heads);
        cli_json_key(&j, "head_dim");
        cli_json_u64(&j, g->head_dim);
        cli_json_key(&j, "num_blocks");
        cli_json_u64(&j, n);
        cli_json_key(&j, "block_tokens");
        cli_json_u64(&j, g->block_tokens);
        cli_json_key(&j, "model_signature");
        cli_json_hex(&j, g->model_signature, 16);
        cli_json_key(&j, "quant_format");
        cli_json_str(&j, quant_str(g->quant));
        cli_json_key(&j, "flags");
        cli_json_u64(&j, in->flags);
        cli_json_key(&j, "meta_crc32c");
        cli_json_hex(&j, in->meta_crc32c, 8);
        cli_json_key(&j, "spectral_dim");
        cli_json_u64(&j, in->spectral_dim);
        cli_json_key(&j, "spectral_offset");
        cli_json_u64(&j, in->spectral_offset);
        cli_json_key(&j, "kv_data_offset");
        cli_json_u64(&j, in->kv_data_offset);
        cli_json_key(&j, "entries");
        cli_json_arr_begin(&j);
        for (uint32_t i = 0; i < n; i++) {
            kvx_entry e;
            rc = kvx_shard_entry(&e, s, i);
            if (rc != 0) break;
            cli_json_obj_begin(&j);
            cli_json_key(&j, "coordinate");
            cli_json_hex(&j, e.coordinate, 8);
            cli_json_key(&j, "shard");
            cli_json_u64(&j, KVX_COORD_SHARD(e.coordinate));
            cli_json_key(&j, "block");
            cli_json_u64(&j, KVX_COORD_BLOCK(e.coordinate));
            cli_json_key(&j, "spectral");
            cli_json_u64(&j, KVX_COORD_SPECTRAL(e.coordinate));
            cli_json_key(&j, "token_count");
            cli_json_u64(&j, e.token_count);
            cli_json_key(&j, "offset");
            cli_json_u64(&j, e.offset);
            cli_json_key(&j, "bytes");
            cli_json_u64(&j, e.bytes);
            cli_json_key(&j, "crc32");
            cli_json_hex(&j, e.crc32, 8);
            cli_json_key(&j, "hash");
            if (in->flags & KVX_FLAG_HASHES)
                cli_json_hex(&j, e.hash, 16);
            else
                cli_json_null(&j);
            if (in->flags & KVX_FLAG_LINEAGE) {
                cli_json_key(&j, "parent");
                cli_json_hex(&j, e.parent, 16);
            }
            uint64_t seq = 0;
            int tomb = 0;
            kvx_shard_entry_commit(s, i, &seq, &tomb);
            if (in->flags & KVX_FLAG_SEQ) {
                cli_json_key(&j, "seq");
                cli_json_u64(&j, seq);
            }
            if (in->flags & KVX_FLAG_TOMB) {
                cli_json_key(&j, "tombstone");
                cli_json_bool(&j, tomb);
            }
            if (in->flags & KVX_FLAG_DIGEST) {
                /* the prefix digest as 64 hex digits; null: unverified */
                cli_json_key(&j, "digest");
                if (e.digest) {
                    char hex[2 * KVX_DIGEST_BYTES + 1];
                    for (int k = 0; k < KVX_DIGEST_BYTES; k++) snprintf(hex + 2 * k, 3, "%02x", e.digest[k]);
                    cli_json_str(&j, hex);
                } else {
                    cli_json_null(&j);
                }
            }
            cli_json_obj_end(&j);
        }
        cli_json_arr_end(&j);
        cli_json_obj_end(&j);
        cli_json_finish(&j);
    } else {
        char sz[32], fl[96];
        printf("%s: KVX shard, format 0x%04x, %s\n", path, in->format_version,
               cli_fmt_size(sz, sizeof sz, in->file_size));
        printf("  geometry         L=%u Hkv=%u D=%u B=%u %s\n", g->num_layers, g->kv_heads,
               g->head_dim, g->block_tokens, quant_str(g->quant));
        printf("  model_signature  0x%016" PRIx64 "\n", g->model_signature);
        printf("  blocks           %" PRIu64 " (shard %u)\n", n, in->shard_id);
        flags_str(fl, sizeof fl, in->flags);
        printf("  flags            %s\n", fl);
        if (in->flags & KVX_FLAG_META_CRC) printf("  meta_crc32c      0x%08x\n", in->meta_crc32c);
        printf("sections:\n");
        uint64_t off = 0;
        print_section("header", off, 64);
        off = 64;
        print_section("coordinate table", off, n * 24);
        off += n * 24;
        if (in->flags & KVX_FLAG_HASHES) {
            print_section("hash table", off, n * 8);
            off += n * 8;
        }
        if (in->flags & KVX_FLAG_LINEAGE) {
            print_section("lineage table", off, n * (8 + 4ull * g->block_tokens));
            off += n * (8 + 4ull * g->block_tokens);
        }
        if (in->flags & KVX_FLAG_DIGEST) {
            print_section("digest table", off, n * (uint64_t)KVX_DIGEST_BYTES);
            off += n * (uint64_t)KVX_DIGEST_BYTES;
        }
        if (in->flags & KVX_FLAG_SCALES) {
            print_section("scale table", off, n * kvx_scale_count(g) * 4);
            off += n * kvx_scale_count(g) * 4;
        }
        if (in->flags & KVX_FLAG_KEYS) {
            print_section("key table", off, n * (uint64_t)KVX_KEY_RECORD);
            off += n * (uint64_t)KVX_KEY_RECORD;
        }
        if (in->flags & KVX_FLAG_SEQ) {
            print_section("sequence table", off, n * 8);
            off += n * 8;
        }
        if (in->flags & KVX_FLAG_TOMB) print_section("tombstone table", off, n);
        if (in->spectral_offset) {
            kvx_spectral sp;
            if (kvx_shard_spectral(&sp, s) == 0) {
                uint64_t b = 32 + (uint64_t)sp.n_cartridges *
                                      (8 + 4ull * sp.n_layers * sp.dim * sp.rank);
                print_section("spectral bundle", in->spectral_offset, b);
                printf("    %u cartridge(s), layers %u..%u, d=%u, rank %u\n", sp.n_cartridges,
                       sp.first_layer, sp.first_layer + sp.n_layers - 1, sp.dim, sp.rank);
            }
        }
        print_section("kv data", in->kv_data_offset, in->file_size - in->kv_data_offset);
        printf("entries:\n");
        int seqs = (in->flags & KVX_FLAG_SEQ) != 0;
        printf("  %5s  %-10s  %5s %5s %4s  %6s  %12s  %10s  %-10s  %s\n", "index", "coordinate",
               "shard", "block", "spec", "tokens", "offset", "bytes", "crc32", seqs ? "hash                seq" : "hash");
        for (uint32_t i = 0; i < n; i++) {
            kvx_entry e;
            rc = kvx_shard_entry(&e, s, i);
            if (rc != 0) break;
            char hs[24] = "-", tail[80];
            if (in->flags & KVX_FLAG_HASHES) snprintf(hs, sizeof hs, "0x%016" PRIx64, e.hash);
            uint64_t seq = 0;
            int tomb = 0;
            kvx_shard_entry_commit(s, i, &seq, &tomb);
            if (seqs) snprintf(tail, sizeof tail, "%-18s  %" PRIu64 "%s", hs, seq, tomb ? " tombstone" : "");
            else snprintf(tail, sizeof tail, "%s", hs);
            printf("  %5u  0x%08x  %5u %5u %4u  %6u  %12" PRIu64 "  %10u  0x%08x  %s\n", i,
                   e.coordinate, KVX_COORD_SHARD(e.coordinate), KVX_COORD_BLOCK(e.coordinate),
                   KVX_COORD_SPECTRAL(e.coordinate), e.token_count, e.offset, e.bytes, e.crc32, tail);
        }
    }
    kvx_shard_close(s);
    if (rc != 0) return cli_fail_code(self, rc, "cannot read an entry of '%s'", path);
    if (fflush(stdout) != 0) return cli_fail(self, "cannot write to standard output");
    return CLI_OK;
}

const cli_cmd cli_cmd_inspect = {
    "inspect",
    "show a shard's header, sections and every entry",
    "Usage: kvx inspect [--json] FILE.kvx\n"
    "\n"
    "Opens a KVX shard (checking its structure and meta checksum) and prints\n"
    "its header, where each section lies, and every entry: coordinate (shard,\n"
    "radix block, spectral id), token count, the page's absolute offset and\n"
    "size, its CRC-32 and its chained block hash; with a sequence table its\n"
    "commit's sequence number, and whether it is a tombstone (a keyed delete).\n"
    "\n"
    "Options:\n"
    "  -j, --json  one JSON object: num_layers, kv_heads, head_dim, num_blocks,\n"
    "              block_tokens, model_signature (hex string), quant_format\n"
    "              (\"fp16\", \"e4m3\", \"e5m2\" or \"bf16\"), flags, spectral_offset,\n"
    "              kv_data_offset, and entries: a list of objects with\n"
    "              coordinate (hex string), shard, block, spectral, token_count,\n"
    "              offset, bytes, crc32 (hex string), hash (hex string, or null\n"
    "              without a hash table), seq (with a sequence table) and\n"
    "              tombstone (true/false, with a tombstone table)\n"
    "  -h, --help  show this help\n"
    "\n"
    "Page checksums are not read here; use 'kvx verify' for that. FILE.kvx\n"
    "must be a regular file: a FIFO, device, socket or directory is refused\n"
    "by type, without opening it.\n"
    "Exit status: 0 success, 1 the file cannot be opened, is not a regular\n"
    "file or is malformed, 2 usage error.\n",
    run_inspect,
};

/* -------------------------------------------------------------- verify */

typedef struct verify_ctx {
    const char *path;
    const kvx_shard *s;
} verify_ctx;

static void verify_report(void *ctx, uint32_t index, int code)
{
    verify_ctx *v = ctx;
    kvx_entry e;
    if (kvx_shard_entry(&e, v->s, index) == 0)
        printf("%s: BAD entry %u (coordinate 0x%08x): %s (%s)\n", v->path, index, e.coordinate,
               kvx_strerror(code), kvx_err_name(code));
    else
        printf("%s: BAD entry %u: %s (%s)\n", v->path, index, kvx_strerror(code),
               kvx_err_name(code));
}

static int run_verify(const cli_cmd *self, int argc, char **argv)
{
    static const struct option opts[] = {
        {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int quiet = 0, ch;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, ":qh", opts, NULL)) != -1) {
        switch (ch) {
        case 'q': quiet = 1; break;
        case 'h': cli_print_help(self); return CLI_OK;
        default: return cli_getopt_error(self, ch, argv, opts);
        }
    }
    if (optind >= argc) return cli_usage(self, "expected at least one FILE.kvx");
    int bad_files = 0, files = argc - optind;
    for (int i = optind; i < argc; i++) {
        const char *path = argv[i];
        struct stat st;
        /* Judged by type before anything opens it: a FIFO would block, a
         * device never end. */
        if (stat(path, &st) != 0) {
            printf("%s: BAD: %s\n", path, strerror(errno));
            bad_files++;
            continue;
        }
        if (!S_ISREG(st.st_mode)) {
            printf("%s: BAD: it is %s, not a regular file (a shard must be one)\n", path,
                   cli_file_type(st.st_mode));
            bad_files++;
            continue;
        }
        kvx_shard *s = NULL;
        int rc = kvx_shard_open(&s, path, 0);
        if (rc != 0) {
            const char *d = kvx_last_error();
            printf("%s: BAD: %s (%s)\n", path, *d ? d : kvx_strerror(rc), kvx_err_name(rc));
            bad_files++;
            continue;
        }
        const kvx_shard_info *in = kvx_shard_get_info(s);
        /* Spectral ids 33..255 are reserved: read, and reported here. */
        for (uint32_t k = 0; k < in->num_blocks; k++) {
            kvx_entry e;
            if (kvx_shard_entry(&e, s, k) == 0 && KVX_COORD_SPECTRAL(e.coordinate) > 32)
                printf("%s: note: entry %u (coordinate 0x%08x) uses reserved spectral id %u\n",
                       path, k, e.coordinate, KVX_COORD_SPECTRAL(e.coordinate));
        }
        verify_ctx v = {path, s};
        uint32_t nbad = 0;
        rc = kvx_shard_verify(s, &nbad, verify_report, &v);
        if (rc != 0 || nbad) {
            if (!nbad) printf("%s: BAD: %s (%s)\n", path, kvx_last_error(), kvx_err_name(rc));
            else printf("%s: BAD: %u of %u pages fail their checksum\n", path, nbad, in->num_blocks);
            bad_files++;
        } else if (!quiet) {
            char sz[32], ts[48] = "";
            if (in->flags & KVX_FLAG_TOMB) {
                uint32_t nt = 0;
                for (uint32_t k = 0; k < in->num_blocks; k++) {
                    int tomb = 0;
                    if (kvx_shard_entry_commit(s, k, NULL, &tomb) == 0 && tomb) nt++;
                }
                snprintf(ts, sizeof ts, ", %u tombstone%s", nt, nt == 1 ? "" : "s");
            }
            printf("%s: OK (%u entries%s, %s)\n", path, in->num_blocks, ts,
                   cli_fmt_size(sz, sizeof sz, in->file_size));
        }
        kvx_shard_close(s);
    }
    fflush(stdout);
    if (bad_files) {
        fprintf(stderr, "kvx verify: %d of %d file(s) bad\n", bad_files, files);
        return CLI_FAIL;
    }
    return CLI_OK;
}

const cli_cmd cli_cmd_verify = {
    "verify",
    "check shard files: structure, meta checksum and every page CRC",
    "Usage: kvx verify [--quiet] FILE.kvx...\n"
    "\n"
    "Checks each shard's structure (every validation rule of the format, the\n"
    "header and table checksum) and the CRC-32 of every page. Prints one line\n"
    "per good file and one line per problem: each bad file, and each bad\n"
    "entry with its index, coordinate and reason. A path that is not a\n"
    "regular file (a FIFO, device, socket or directory) is a bad file, named\n"
    "with its type, and is not opened. A shard of 0 entries is good.\n"
    "\n"
    "Options:\n"
    "  -q, --quiet  print only problems\n"
    "  -h, --help   show this help\n"
    "\n"
    "Exit status: 0 every file is good, 1 anything is bad (or not a regular\n"
    "file), 2 usage error.\n",
    run_verify,
};

