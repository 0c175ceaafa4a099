/*
 * cmd_convert.c - `kvx convert`: a TLKV envelope becomes a sealed KVX
 * shard, or a shard becomes an envelope (the input's magic decides).
 *
 * The library does the re-layout and quantization; this file makes sure
 * nothing half-written is left behind: a damaged input is refused before
 * anything is written, an envelope input is read only as far as its
 * header says (io.c), and outputs go through cli_out (io.c): a regular
 * file is replaced atomically, a FIFO or device written into, anything
 * else refused.
 */
#include "cli.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ------------------------------------------------------------- convert */

static int run_convert(const cli_cmd *self, int argc, char **argv)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        {"shard", required_argument, NULL, 's'},
        {"format", required_argument, NULL, 'f'},
        {"model-signature", required_argument, NULL, 'm'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *out = NULL;
    uint64_t shard = 0, sig = 0;
    int have_shard = 0, have_sig = 0, version = 0, ch;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, ":o:s:f:m:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'o': out = optarg; break;
        case 's':
            if (cli_parse_u64(optarg, 255, &shard) != 0)
                return cli_usage(self, "--shard must be a shard id from 0 to 255, not '%s'", optarg);
            have_shard = 1;
            break;
        case 'f':
            if (!strcmp(optarg, "v1")) version = KVX_ENVELOPE_V1;
            else if (!strcmp(optarg, "v2")) version = KVX_ENVELOPE_V2;
            else if (!strcmp(optarg, "v3")) version = KVX_ENVELOPE_V3;
            else return cli_usage(self, "--format must be v1, v2 or v3, not '%s'", optarg);
            break;
        case 'm':
            if (cli_parse_hex64(optarg, &sig) != 0)
                return cli_usage(self, "--model-signature must be 1 to 16 hex digits, not '%s'", optarg);
            have_sig = 1;
            break;
        case 'h': cli_print_help(self); return CLI_OK;
        default: return cli_getopt_error(self, ch, argv, opts);
        }
    }
    if (argc - optind != 1) return cli_usage(self, "expected one input file");
    if (!out) return cli_usage(self, "-o FILE is required");
    const char *in = argv[optind];
    const char *name = strcmp(in, "-") ? in : "standard input";

    /* What the input is decides the direction: its magic is read first,
     * once (a pipe cannot be read twice). Nothing blocks: a FIFO no
     * process writes to reads as empty. */
    uint8_t magic[8] = {0};
    size_t got = 0;
    int fd = -1, regular = 0;
    uint64_t size = 0;
    if (cli_read_input_head(self, in, &fd, &regular, &size, magic, sizeof magic, &got) != CLI_OK)
        return CLI_FAIL;
    int is_env = got >= 4 && !memcmp(magic, "TLKV", 4);
    int is_shard = got >= 8 && !memcmp(magic, "RADX-KVX", 8);
    if (!is_env) cli_close_input(fd);
    if (got == 0)
        return cli_fail(self, "'%s' is empty: neither a TLKV envelope nor a KVX shard%s", name, cli_empty_why(in));
    if (!is_env && !is_shard)
        return cli_fail(self, "'%s' is neither a TLKV envelope nor a KVX shard (bad magic)", name);

    if (is_env) {
        if (version) {
            cli_close_input(fd);
            return cli_usage(self, "--format applies to a shard input; the output of an envelope is a shard");
        }
        void *buf = NULL;
        size_t len = 0;
        int rc = cli_read_envelope_fd(self, name, fd, regular, size, magic, got, &buf, &len);
        cli_close_input(fd);
        if (rc != CLI_OK) return CLI_FAIL;
        kvx_envelope env;
        rc = kvx_envelope_parse(&env, buf, len, NULL);
        if (rc != 0) {
            free(buf);
            return cli_fail_code(self, rc, "cannot convert '%s'", name);
        }
        cli_out o;
        if (cli_out_open(self, &o, out, 1) != CLI_OK) {
            free(buf);
            return CLI_FAIL;
        }
        rc = kvx_shard_from_envelope(o.lib_path, buf, len, (uint8_t)shard, sig);
        free(buf);
        if (rc != 0) {
            cli_out_abort(&o);
            return cli_fail_code(self, rc, "cannot convert '%s'", name);
        }
        return cli_out_commit(self, &o);
    }

    if (!regular || !strcmp(in, "-")) {
        struct stat st;
        const char *type = strcmp(in, "-") && stat(in, &st) == 0 ? cli_file_type(st.st_mode) : "a pipe";
        return cli_fail(self, "'%s' is a KVX shard from %s; a shard input must be a regular file "
                              "(it is mapped): save it to a file first", name, type);
    }
    if (have_shard || have_sig)
        return cli_usage(self, "--shard and --model-signature apply to an envelope input");
    if (!version) return cli_usage(self, "--format v1|v2|v3 is required for a shard input");
    cli_out o; /* first: an output that will be refused fails before any work */
    if (cli_out_open(self, &o, out, 0) != CLI_OK) return CLI_FAIL;
    kvx_shard *s = NULL;
    /* Check every page first: a damaged shard must not become an envelope. */
    int rc = kvx_shard_open(&s, in, KVX_OPEN_VERIFY_PAGES);
    void *env = NULL;
    size_t len = 0;
    if (rc == 0) {
        rc = kvx_shard_to_envelope(&env, &len, s, (uint16_t)version);
        kvx_shard_close(s);
    }
    if (rc != 0) {
        cli_out_abort(&o);
        return cli_fail_code(self, rc, "cannot convert '%s'", in);
    }
    rc = cli_out_write(self, &o, env, len);
    if (rc == CLI_OK) rc = cli_out_commit(self, &o);
    kvx_free(env);
    return rc;
}

const cli_cmd cli_cmd_convert = {
    "convert",
    "turn a TLKV envelope into a sealed shard, or a shard into an envelope",
    "Usage: kvx convert ENVELOPE -o FILE.kvx [--shard S] [--model-signature HEX]\n"
    "       kvx convert FILE.kvx -o ENVELOPE --format v1|v2|v3\n"
    "\n"
    "The input's magic decides the direction. An envelope becomes a sealed\n"
    "shard: v1 (f16) gives an FP16 shard, v2 (e4m3 + scales) an E4M3 shard\n"
    "with a scale table, v3 (bf16, kvx's extension) a BF16 shard; block i\n"
    "gets coordinate (S, i, 0) and the envelope's block hash. A shard becomes\n"
    "an envelope with one block per entry. Round trips are lossless: v1 ->\n"
    "shard -> v1, v2 -> shard -> v2 and v3 -> shard -> v3 give the same\n"
    "bytes. A BF16 shard becomes v1 only when every value is exact in f16;\n"
    "otherwise exit 1 naming the first value that is not (v2 and v3 always\n"
    "work). A damaged input is refused and no output file appears.\n"
    "\n"
    "An envelope may come from '-' (standard input), a pipe, a FIFO or a\n"
    "device: it is read to exactly the length its header declares (at most\n"
    "4 GiB) and refused at its first bad header field. Inputs never wait: a\n"
    "FIFO that no process has opened for writing yet reads as empty (start\n"
    "its writer first). A shard input must be a regular file; anything else\n"
    "is refused by type, without waiting.\n"
    "\n"
    "The output is replaced only when it is a regular file: it is written to\n"
    "an unnamed temporary file beside it and renamed into place, so a killed\n"
    "convert leaves nothing behind (where a named temporary file is needed,\n"
    "the next run removes it once its process is gone and ten minutes have\n"
    "passed). The new file keeps the replaced one's permission bits (a 0600\n"
    "file stays 0600), and any name the file system takes (up to 255 bytes)\n"
    "can be written. A FIFO or character device is written into (a FIFO\n"
    "nobody reads is refused at once); '-' is standard output (envelopes\n"
    "only); a symlink, directory or other kind of file is refused and left as\n"
    "it is.\n"
    "\n"
    "Options:\n"
    "  -o, --output FILE          where to write (see above)\n"
    "  -s, --shard S              shard id of the coordinates, 0..255 (default 0)\n"
    "  -m, --model-signature HEX  the shard's model signature (default 0)\n"
    "  -f, --format v1|v2|v3      envelope version to write from a shard\n"
    "  -h, --help                 show this help\n"
    "\n"
    "Exit status: 0 success, 1 bad or unreadable input, or an output that\n"
    "cannot be written or is refused, 2 usage error.\n",
    run_convert,
};
