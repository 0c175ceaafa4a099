/*
 * cmd_store.c - `kvx store ...`: create a persistent prefix cache, put
 * envelopes into it, get blocks back by hash, look up the longest cached
 * prefix of a token sequence, and maintain it (stat, verify, reindex, gc).
 *
 * Every subcommand opens the store, does one thing and closes it, so a
 * script can chain them; `put` answers 0 only after kvx_store_flush has
 * returned 0 (the blocks are durable). Lookups open the store read-only,
 * so they never wait for a writer.
 */
#include "cli.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static int parse_quant(const char *s, uint32_t *out)
{
    if (!strcmp(s, "fp16")) *out = KVX_QUANT_FP16;
    else if (!strcmp(s, "e4m3")) *out = KVX_QUANT_E4M3;
    else if (!strcmp(s, "e5m2")) *out = KVX_QUANT_E5M2;
    else return -1;
    return 0;
}

/* Options of the subcommands whose arguments are all positional: -h and,
 * where json is non-NULL, --json. Returns 1 when the caller must return
 * *rc at once (help shown, or a usage error). */
static int simple_opts(const cli_cmd *self, int argc, char **argv, int *json, int *rc)
{
    static const struct option opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const struct option *o = json ? opts : opts + 1;
    int ch;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, json ? ":jh" : ":h", o, NULL)) != -1) {
        switch (ch) {
        case 'j': *json = 1; break;
        case 'h': cli_print_help(self); *rc = CLI_OK; return 1;
        default: *rc = cli_getopt_error(self, ch, argv); return 1;
        }
    }
    return 0;
}
#define HANDLE_SIMPLE_OPTS(self, argc, argv, json)                     \
    do {                                                               \
        int rc_;                                                       \
        if (simple_opts(self, argc, argv, json, &rc_)) return rc_;     \
    } while (0)

static int open_store(const cli_cmd *self, kvx_store **out, const char *dir, uint32_t flags)
{
    int rc = kvx_store_open(out, dir, NULL, flags);
    if (rc != 0) {
        cli_fail_code(self, rc, "cannot open the store '%s'", dir);
        if (rc == KVX_ENOTFOUND)
            fprintf(stderr, "  hint: make one with 'kvx store create %s --layers L --kv-heads H "
                            "--head-dim D --block-tokens B --quant fp16'\n", dir);
        return CLI_FAIL;
    }
    return CLI_OK;
}

/* -------------------------------------------------------------- create */

static int run_create(const cli_cmd *self, int argc, char **argv)
{
    static const struct option opts[] = {
        {"layers", required_argument, NULL, 'L'},
        {"kv-heads", required_argument, NULL, 'H'},
        {"head-dim", required_argument, NULL, 'D'},
        {"block-tokens", required_argument, NULL, 'B'},
        {"quant", required_argument, NULL, 'q'},
        {"capacity", required_argument, NULL, 'c'},
        {"model-signature", required_argument, NULL, 'm'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    uint64_t v;
    int have = 0, ch;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, ":L:H:D:B:q:c:m:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'L':
        case 'H':
        case 'D':
        case 'B': {
            const char *name = ch == 'L' ? "--layers" : ch == 'H' ? "--kv-heads"
                               : ch == 'D' ? "--head-dim" : "--block-tokens";
            uint64_t max = ch == 'B' ? UINT32_MAX : 65535;
            if (cli_parse_u64(optarg, max, &v) != 0 || v == 0)
                return cli_usage(self, "%s must be a whole number from 1 to %" PRIu64 ", not '%s'",
                                 name, max, optarg);
            if (ch == 'L') o.geometry.num_layers = (uint32_t)v, have |= 1;
            if (ch == 'H') o.geometry.kv_heads = (uint32_t)v, have |= 2;
            if (ch == 'D') o.geometry.head_dim = (uint32_t)v, have |= 4;
            if (ch == 'B') o.geometry.block_tokens = (uint32_t)v, have |= 8;
            break;
        }
        case 'q':
            if (parse_quant(optarg, &o.geometry.quant) != 0)
                return cli_usage(self, "--quant must be fp16, e4m3 or e5m2, not '%s'", optarg);
            have |= 16;
            break;
        case 'c':
            if (cli_parse_size(optarg, &o.capacity_bytes) != 0 || o.capacity_bytes == 0)
                return cli_usage(self, "--capacity must be a size such as 4GiB or 500MB, not '%s'",
                                 optarg);
            break;
        case 'm':
            if (cli_parse_hex64(optarg, &o.geometry.model_signature) != 0)
                return cli_usage(self, "--model-signature must be 1 to 16 hex digits, not '%s'",
                                 optarg);
            break;
        case 'h': cli_print_help(self); return CLI_OK;
        default: return cli_getopt_error(self, ch, argv);
        }
    }
    if (argc - optind != 1) return cli_usage(self, "expected one DIR");
    static const char *missing[] = {"--layers", "--kv-heads", "--head-dim", "--block-tokens",
                                    "--quant"};
    for (int i = 0; i < 5; i++)
        if (!(have & (1 << i))) return cli_usage(self, "%s is required", missing[i]);
    const char *dir = argv[optind];
    kvx_store *s = NULL;
    int rc = kvx_store_create(&s, dir, &o);
    if (rc != 0) return cli_fail_code(self, rc, "cannot create the store '%s'", dir);
    kvx_store_stats st;
    char cap[32];
    if (kvx_store_stat(&st, s) == 0) cli_fmt_size(cap, sizeof cap, st.capacity_bytes);
    else snprintf(cap, sizeof cap, "default");
    kvx_store_close(s);
    printf("created store %s: L=%u Hkv=%u D=%u B=%u %s, capacity %s\n", dir, o.geometry.num_layers,
           o.geometry.kv_heads, o.geometry.head_dim, o.geometry.block_tokens,
           kvx_quant_name(o.geometry.quant), cap);
    return CLI_OK;
}

static const cli_cmd cmd_create = {
    "store create",
    "create a store with a fixed geometry and capacity",
    "Usage: kvx store create DIR --layers L --kv-heads H --head-dim D\n"
    "                        --block-tokens B --quant fp16|e4m3|e5m2\n"
    "                        [--capacity SIZE] [--model-signature HEX]\n"
    "\n"
    "Creates DIR (mode 0700) as a new store. Its geometry and model signature\n"
    "are fixed: opening it with another is refused.\n"
    "\n"
    "Options:\n"
    "  -L, --layers L             layers (1..65535)\n"
    "  -H, --kv-heads H           KV heads (1..65535)\n"
    "  -D, --head-dim D           head dimension (1..65535)\n"
    "  -B, --block-tokens B       tokens per block (the engine uses 16)\n"
    "  -q, --quant Q              page element type: fp16, e4m3 or e5m2\n"
    "  -c, --capacity SIZE        cap on shard bytes, e.g. 4GiB, 500MB\n"
    "                             (default: the library's)\n"
    "  -m, --model-signature HEX  first 8 bytes of the model's SHA-256 (default 0)\n"
    "  -h, --help                 show this help\n"
    "\n"
    "Exit status: 0 success, 1 failure (DIR exists, no permission...), 2 usage\n"
    "error.\n",
    run_create,
};

/* ----------------------------------------------------------------- put */

static int run_put(const cli_cmd *self, int argc, char **argv)
{
    static const struct option opts[] = {
        {"tokens", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *tokfile = NULL;
    int ch;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, ":t:h", opts, NULL)) != -1) {
        switch (ch) {
        case 't': tokfile = optarg; break;
        case 'h': cli_print_help(self); return CLI_OK;
        default: return cli_getopt_error(self, ch, argv);
        }
    }
    if (argc - optind != 2) return cli_usage(self, "expected DIR and ENVELOPE");
    const char *dir = argv[optind], *envp = argv[optind + 1];

    uint32_t *toks = NULL;
    size_t ntok = 0;
    if (tokfile) {
        void *text;
        size_t tl;
        int rc = cli_read_file(&text, &tl, tokfile);
        if (rc != 0) return cli_fail_code(self, rc, "cannot read the token file '%s'", tokfile);
        char *z = realloc(text, tl + 1);
        if (!z) {
            free(text);
            return cli_fail(self, "out of memory");
        }
        z[tl] = '\0';
        if (memchr(z, '\0', tl)) {
            free(z);
            return cli_fail(self, "'%s' holds a NUL byte: it is not whitespace-separated token ids",
                            tokfile);
        }
        const char *bad = NULL;
        rc = cli_parse_tokens(&toks, &ntok, z, &bad);
        if (rc != 0) {
            int e = bad ? cli_fail(self, "'%s' holds '%.20s', which is not a token id (0..%u)",
                                   tokfile, bad, UINT32_MAX)
                        : cli_fail(self, "out of memory");
            free(z);
            return e;
        }
        free(z);
    }
    void *env;
    size_t len;
    int rc = cli_read_file(&env, &len, envp);
    if (rc != 0) {
        free(toks);
        return cli_fail_code(self, rc, "cannot read '%s'", envp);
    }
    kvx_store *s = NULL;
    if (open_store(self, &s, dir, 0) != CLI_OK) {
        free(env);
        free(toks);
        return CLI_FAIL;
    }
    size_t fresh = 0;
    rc = kvx_store_put_envelope(s, env, len, toks, ntok, &fresh);
    if (rc != 0) {
        kvx_store_close(s);
        free(env);
        free(toks);
        return cli_fail_code(self, rc, "cannot put '%s'", envp);
    }
    rc = kvx_store_flush(s);
    if (rc != 0) {
        kvx_store_close(s);
        free(env);
        free(toks);
        return cli_fail_code(self, rc, "the blocks of '%s' could not be made durable", envp);
    }
    kvx_envelope e;
    uint32_t full = 0;
    if (kvx_envelope_parse(&e, env, len, NULL) == 0) {
        for (uint32_t i = 0; i < e.n_blocks; i++) {
            kvx_envelope_block b;
            if (kvx_envelope_block_at(&b, &e, i) == 0 && b.hash != 0) full++;
        }
    }
    kvx_store_close(s);
    free(env);
    free(toks);
    printf("%zu new block(s) of %u full block(s) stored durably in %s\n", fresh, full, dir);
    return CLI_OK;
}

static const cli_cmd cmd_put = {
    "store put",
    "store every full block of an envelope, durably",
    "Usage: kvx store put DIR ENVELOPE [--tokens FILE]\n"
    "\n"
    "Stores every full block of a TLKV envelope (v1 or v2) under its block\n"
    "hash; blocks the store already holds are not written again. The command\n"
    "exits 0 only once the blocks are durable (flushed and published).\n"
    "\n"
    "Options:\n"
    "  -t, --tokens FILE  the sequence's token ids (whitespace separated);\n"
    "                     they fill the lineage, so a lookup serves a block\n"
    "                     only for the exact same prefix. Their block hashes\n"
    "                     must equal the envelope's.\n"
    "  -h, --help         show this help\n"
    "\n"
    "Exit status: 0 blocks durable, 1 failure (bad envelope, wrong geometry,\n"
    "disk full...), 2 usage error.\n",
    run_put,
};

/* ----------------------------------------------------------------- get */

static int run_get(const cli_cmd *self, int argc, char **argv)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        {"format", required_argument, NULL, 'f'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *out = NULL;
    int version = 0, ch;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, ":o:f:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'o': out = optarg; break;
        case 'f':
            if (!strcmp(optarg, "v1")) version = KVX_ENVELOPE_V1;
            else if (!strcmp(optarg, "v2")) version = KVX_ENVELOPE_V2;
            else return cli_usage(self, "--format must be v1 or v2, not '%s'", optarg);
            break;
        case 'h': cli_print_help(self); return CLI_OK;
        default: return cli_getopt_error(self, ch, argv);
        }
    }
    if (argc - optind < 2) return cli_usage(self, "expected DIR and at least one HASH");
    if (!out) return cli_usage(self, "-o ENVELOPE is required");
    if (!version) return cli_usage(self, "--format v1|v2 is required");
    const char *dir = argv[optind];
    size_t n = (size_t)(argc - optind - 1);
    uint64_t *hashes = calloc(n, sizeof *hashes);
    if (!hashes) return cli_fail(self, "out of memory");
    for (size_t i = 0; i < n; i++) {
        if (cli_parse_hex64(argv[optind + 1 + (int)i], &hashes[i]) != 0) {
            free(hashes);
            return cli_usage(self, "'%s' is not a block hash (1 to 16 hex digits)",
                             argv[optind + 1 + (int)i]);
        }
    }
    kvx_store *s = NULL;
    if (open_store(self, &s, dir, KVX_STORE_READONLY) != CLI_OK) {
        free(hashes);
        return CLI_FAIL;
    }
    kvx_geometry g;
    int rc = kvx_store_get_geometry(&g, s);
    kvx_view *views = calloc(n, sizeof *views);
    int *status = calloc(n, sizeof *status);
    kvx_envelope_block_in *bin = calloc(n, sizeof *bin);
    size_t P = kvx_envelope_payload_bytes((uint16_t)version, &g);
    uint64_t ns = kvx_scale_count(&g);
    uint8_t *payloads = NULL;
    float *scales = NULL;
    void *buf = NULL;
    int ret = CLI_FAIL;
    if (rc != 0) {
        cli_fail_code(self, rc, "cannot read the store's geometry");
        goto done;
    }
    if (!views || !status || !bin || !P) {
        cli_fail(self, "out of memory");
        goto done;
    }
    payloads = malloc(n * P);
    scales = malloc(n * ns * sizeof(float));
    if (!payloads || !scales) {
        cli_fail(self, "out of memory (%zu blocks of %zu bytes)", n, P);
        goto done;
    }
    rc = kvx_store_get_hashes(views, status, s, hashes, n);
    if (rc != 0 && rc != KVX_ENOTFOUND) {
        cli_fail_code(self, rc, "lookup failed");
        goto done;
    }
    size_t missing = 0;
    for (size_t i = 0; i < n; i++) {
        if (status[i] != 0) {
            fprintf(stderr, "kvx store get: block 0x%016" PRIx64 " is not in the store (%s)\n",
                    hashes[i], kvx_err_name(status[i]));
            missing++;
        }
    }
    if (missing) {
        fprintf(stderr, "kvx store get: %zu of %zu block(s) missing; nothing written\n", missing, n);
        goto done;
    }
    size_t elem_bytes = P - (version == KVX_ENVELOPE_V2 ? ns * 4 : 0);
    for (size_t i = 0; i < n; i++) {
        uint8_t *pl = payloads + i * P;
        rc = kvx_page_to_envelope_payload(pl, (uint16_t)version, &g, views[i].page,
                                          views[i].token_count, views[i].scales);
        if (rc != 0) {
            cli_fail_code(self, rc, "cannot convert block 0x%016" PRIx64, hashes[i]);
            goto done;
        }
        bin[i].hash = views[i].hash ? views[i].hash : hashes[i];
        bin[i].n_tokens = views[i].token_count;
        bin[i].payload = pl;
        if (version == KVX_ENVELOPE_V2) {
            memcpy(scales + i * ns, pl + elem_bytes, ns * sizeof(float));
            bin[i].scales = scales + i * ns;
        }
    }
    size_t len;
    rc = kvx_envelope_size(&len, (uint16_t)version, &g, (uint32_t)n);
    if (rc == 0 && !(buf = malloc(len))) rc = -12; /* -ENOMEM */
    if (rc == 0) rc = kvx_envelope_export(buf, len, (uint16_t)version, &g, bin, (uint32_t)n);
    if (rc != 0) {
        cli_fail_code(self, rc, "cannot build the envelope");
        goto done;
    }
    rc = cli_write_file_atomic(out, buf, len);
    if (rc != 0) {
        cli_fail_code(self, rc, "cannot write '%s'", out);
        goto done;
    }
    ret = CLI_OK;
done:
    if (views && status)
        for (size_t i = 0; i < n; i++)
            if (status[i] == 0) kvx_view_release(&views[i]);
    free(buf);
    free(payloads);
    free(scales);
    free(bin);
    free(status);
    free(views);
    free(hashes);
    kvx_store_close(s);
    return ret;
}

static const cli_cmd cmd_get = {
    "store get",
    "write blocks named by hash into one envelope",
    "Usage: kvx store get DIR -o ENVELOPE --format v1|v2 HASH...\n"
    "\n"
    "Looks each block up by its chained hash (hex, with or without 0x) and\n"
    "writes them, in the order given, as one TLKV envelope. If any block is\n"
    "missing, each missing hash is named and no file is written.\n"
    "\n"
    "Options:\n"
    "  -o, --output ENVELOPE  where to write (replaced atomically)\n"
    "  -f, --format v1|v2     v1: f16; v2: e4m3 with per-slab scales\n"
    "  -h, --help             show this help\n"
    "\n"
    "Exit status: 0 success, 1 a block is missing or a failure, 2 usage error.\n",
    run_get,
};

/* -------------------------------------------------------------- prefix */

static int run_prefix(const cli_cmd *self, int argc, char **argv)
{
    HANDLE_SIMPLE_OPTS(self, argc, argv, NULL);
    if (argc - optind < 1) return cli_usage(self, "expected DIR and TOKEN...");
    const char *dir = argv[optind];
    size_t n = (size_t)(argc - optind - 1);
    uint32_t *toks = malloc((n ? n : 1) * sizeof *toks);
    if (!toks) return cli_fail(self, "out of memory");
    for (size_t i = 0; i < n; i++) {
        uint64_t t;
        if (cli_parse_u64(argv[optind + 1 + (int)i], UINT32_MAX, &t) != 0) {
            free(toks);
            return cli_usage(self, "token '%s' is not a token id (0..%u)", argv[optind + 1 + (int)i],
                             UINT32_MAX);
        }
        toks[i] = (uint32_t)t;
    }
    kvx_store *s = NULL;
    if (open_store(self, &s, dir, KVX_STORE_READONLY) != CLI_OK) {
        free(toks);
        return CLI_FAIL;
    }
    kvx_geometry g;
    int rc = kvx_store_get_geometry(&g, s);
    size_t full = (rc == 0 && g.block_tokens) ? n / g.block_tokens : 0;
    kvx_view *views = calloc(full ? full : 1, sizeof *views);
    size_t got = 0;
    if (rc == 0 && !views) rc = -12;
    if (rc == 0) rc = kvx_store_prefix(views, &got, s, toks, n, full);
    if (rc == 0) {
        printf("%zu of %zu full block(s) served from the store (%zu of %zu tokens)\n", got, full,
               got * g.block_tokens, n);
        kvx_views_release(views, got);
    }
    free(views);
    free(toks);
    kvx_store_close(s);
    if (rc != 0) return cli_fail_code(self, rc, "prefix lookup failed");
    return CLI_OK;
}

static const cli_cmd cmd_prefix = {
    "store prefix",
    "how many leading blocks of a token sequence the store serves",
    "Usage: kvx store prefix DIR TOKEN...\n"
    "\n"
    "Looks up the longest cached prefix of the token sequence and prints the\n"
    "number of leading full blocks served from the store as its first word:\n"
    "  3 of 4 full block(s) served from the store (48 of 70 tokens)\n"
    "With a lineage table, a block counts only when its stored parent and\n"
    "tokens equal the query's.\n"
    "\n"
    "Options:\n"
    "  -h, --help  show this help\n"
    "\n"
    "Exit status: 0 success (even when nothing is served), 1 failure, 2 usage\n"
    "error.\n",
    run_prefix,
};

/* ---------------------------------------------------------------- stat */

static int run_stat(const cli_cmd *self, int argc, char **argv)
{
    int json = 0;
    HANDLE_SIMPLE_OPTS(self, argc, argv, &json);
    if (argc - optind != 1) return cli_usage(self, "expected one DIR");
    const char *dir = argv[optind];
    kvx_store *s = NULL;
    if (open_store(self, &s, dir, KVX_STORE_READONLY) != CLI_OK) return CLI_FAIL;
    kvx_store_stats st;
    kvx_geometry g;
    int rc = kvx_store_stat(&st, s);
    if (rc == 0) rc = kvx_store_get_geometry(&g, s);
    kvx_store_close(s);
    if (rc != 0) return cli_fail_code(self, rc, "cannot read the store's statistics");
    if (json) {
        cli_json j;
        cli_json_init(&j, stdout);
        cli_json_obj_begin(&j);
        cli_json_key(&j, "blocks");
        cli_json_u64(&j, st.blocks);
        cli_json_key(&j, "bytes");
        cli_json_u64(&j, st.bytes);
        cli_json_key(&j, "shards");
        cli_json_u64(&j, st.shards);
        cli_json_key(&j, "capacity");
        cli_json_u64(&j, st.capacity_bytes);
        cli_json_key(&j, "hits");
        cli_json_u64(&j, st.hits);
        cli_json_key(&j, "misses");
        cli_json_u64(&j, st.misses);
        cli_json_key(&j, "evictions");
        cli_json_u64(&j, st.evictions);
        cli_json_key(&j, "evicted_blocks");
        cli_json_u64(&j, st.evicted_blocks);
        cli_json_key(&j, "compactions");
        cli_json_u64(&j, st.compactions);
        cli_json_key(&j, "num_layers");
        cli_json_u64(&j, g.num_layers);
        cli_json_key(&j, "kv_heads");
        cli_json_u64(&j, g.kv_heads);
        cli_json_key(&j, "head_dim");
        cli_json_u64(&j, g.head_dim);
        cli_json_key(&j, "block_tokens");
        cli_json_u64(&j, g.block_tokens);
        cli_json_key(&j, "quant_format");
        cli_json_str(&j, kvx_quant_name(g.quant) ? kvx_quant_name(g.quant) : "unknown");
        cli_json_key(&j, "model_signature");
        cli_json_hex(&j, g.model_signature, 16);
        cli_json_obj_end(&j);
        cli_json_finish(&j);
        return CLI_OK;
    }
    char a[32], b[32];
    printf("store        %s\n", dir);
    printf("geometry     L=%u Hkv=%u D=%u B=%u %s, model 0x%016" PRIx64 "\n", g.num_layers,
           g.kv_heads, g.head_dim, g.block_tokens,
           kvx_quant_name(g.quant) ? kvx_quant_name(g.quant) : "unknown", g.model_signature);
    printf("blocks       %" PRIu64 "\n", st.blocks);
    printf("bytes        %s of %s capacity (%.1f%%)\n", cli_fmt_size(a, sizeof a, st.bytes),
           cli_fmt_size(b, sizeof b, st.capacity_bytes),
           st.capacity_bytes ? 100.0 * (double)st.bytes / (double)st.capacity_bytes : 0.0);
    printf("shards       %" PRIu64 "\n", st.shards);
    uint64_t look = st.hits + st.misses;
    printf("hits         %" PRIu64 " (%.1f%% of %" PRIu64 " lookups)\n", st.hits,
           look ? 100.0 * (double)st.hits / (double)look : 0.0, look);
    printf("misses       %" PRIu64 "\n", st.misses);
    printf("evictions    %" PRIu64 " shard(s), %" PRIu64 " block(s)\n", st.evictions,
           st.evicted_blocks);
    printf("compactions  %" PRIu64 "\n", st.compactions);
    return CLI_OK;
}

static const cli_cmd cmd_stat = {
    "store stat",
    "blocks, bytes, shards, capacity, hits, misses, evictions",
    "Usage: kvx store stat DIR [--json]\n"
    "\n"
    "Prints the store's geometry and counters.\n"
    "\n"
    "Options:\n"
    "  -j, --json  one JSON object: blocks, bytes, shards, capacity, hits,\n"
    "              misses, evictions, evicted_blocks, compactions, num_layers,\n"
    "              kv_heads, head_dim, block_tokens, quant_format,\n"
    "              model_signature\n"
    "  -h, --help  show this help\n"
    "\n"
    "Exit status: 0 success, 1 failure, 2 usage error.\n",
    run_stat,
};

/* ------------------------------------------- verify / reindex / gc */

static void store_report(void *ctx, const char *what, int code)
{
    const char *dir = ctx;
    printf("%s: BAD: %s (%s)\n", dir, what, kvx_err_name(code));
}

static int run_sverify(const cli_cmd *self, int argc, char **argv)
{
    HANDLE_SIMPLE_OPTS(self, argc, argv, NULL);
    if (argc - optind != 1) return cli_usage(self, "expected one DIR");
    const char *dir = argv[optind];
    kvx_store *s = NULL;
    if (open_store(self, &s, dir, KVX_STORE_READONLY) != CLI_OK) return CLI_FAIL;
    uint64_t bad = 0;
    int rc = kvx_store_verify(s, &bad, store_report, (void *)dir);
    kvx_store_stats st;
    int src = kvx_store_stat(&st, s);
    kvx_store_close(s);
    fflush(stdout);
    if (bad) {
        fprintf(stderr, "kvx store verify: %" PRIu64 " problem(s) in %s\n", bad, dir);
        fprintf(stderr, "  hint: 'kvx store reindex %s' rebuilds the index from the shards\n", dir);
        return CLI_FAIL;
    }
    if (rc != 0) return cli_fail_code(self, rc, "cannot verify '%s'", dir);
    if (src == 0)
        printf("%s: OK (%" PRIu64 " blocks in %" PRIu64 " shard(s))\n", dir, st.blocks, st.shards);
    else
        printf("%s: OK\n", dir);
    return CLI_OK;
}

static const cli_cmd cmd_sverify = {
    "store verify",
    "check every shard and page of a store against its index",
    "Usage: kvx store verify DIR\n"
    "\n"
    "Checks every shard's structure and every page's CRC, and that the index\n"
    "and the shards agree. Each problem is printed on its own line.\n"
    "\n"
    "Options:\n"
    "  -h, --help  show this help\n"
    "\n"
    "Exit status: 0 all good, 1 a problem was found, 2 usage error.\n",
    run_sverify,
};

static int run_reindex(const cli_cmd *self, int argc, char **argv)
{
    HANDLE_SIMPLE_OPTS(self, argc, argv, NULL);
    if (argc - optind != 1) return cli_usage(self, "expected one DIR");
    const char *dir = argv[optind];
    kvx_store *s = NULL;
    if (open_store(self, &s, dir, 0) != CLI_OK) return CLI_FAIL;
    int rc = kvx_store_reindex(s);
    kvx_store_stats st;
    if (rc == 0) rc = kvx_store_stat(&st, s);
    kvx_store_close(s);
    if (rc != 0) return cli_fail_code(self, rc, "cannot reindex '%s'", dir);
    printf("reindexed %s: %" PRIu64 " blocks in %" PRIu64 " shard(s)\n", dir, st.blocks, st.shards);
    return CLI_OK;
}

static const cli_cmd cmd_reindex = {
    "store reindex",
    "rebuild the index from the shards' own tables",
    "Usage: kvx store reindex DIR\n"
    "\n"
    "Rebuilds the LMDB index from the coordinate, hash and lineage tables of\n"
    "the sealed shards, so a lost or damaged index loses no data.\n"
    "\n"
    "Options:\n"
    "  -h, --help  show this help\n"
    "\n"
    "Exit status: 0 success, 1 failure, 2 usage error.\n",
    run_reindex,
};

static int run_gc(const cli_cmd *self, int argc, char **argv)
{
    HANDLE_SIMPLE_OPTS(self, argc, argv, NULL);
    if (argc - optind != 1) return cli_usage(self, "expected one DIR");
    const char *dir = argv[optind];
    kvx_store *s = NULL;
    if (open_store(self, &s, dir, 0) != CLI_OK) return CLI_FAIL;
    kvx_store_stats a, b;
    int rc = kvx_store_stat(&a, s);
    if (rc == 0) rc = kvx_store_gc(s);
    if (rc == 0) rc = kvx_store_stat(&b, s);
    kvx_store_close(s);
    if (rc != 0) return cli_fail_code(self, rc, "gc of '%s' failed", dir);
    char x[32], y[32];
    printf("gc %s: %" PRIu64 " -> %" PRIu64 " shard(s), %s -> %s, %" PRIu64
           " block(s) evicted, %" PRIu64 " compaction(s)\n",
           dir, a.shards, b.shards, cli_fmt_size(x, sizeof x, a.bytes),
           cli_fmt_size(y, sizeof y, b.bytes), b.evicted_blocks - a.evicted_blocks,
           b.compactions - a.compactions);
    return CLI_OK;
}

static const cli_cmd cmd_gc = {
    "store gc",
    "evict to capacity and compact mostly-dead or small shards",
    "Usage: kvx store gc DIR\n"
    "\n"
    "Evicts whole shards, least recently used first, until the store is under\n"
    "its capacity, and rewrites mostly-dead or small shards into new ones.\n"
    "\n"
    "Options:\n"
    "  -h, --help  show this help\n"
    "\n"
    "Exit status: 0 success, 1 failure, 2 usage error.\n",
    run_gc,
};

/* ---------------------------------------------------------- dispatch */

static const cli_cmd *const store_cmds[] = {&cmd_create, &cmd_put,     &cmd_get, &cmd_prefix,
                                            &cmd_stat,   &cmd_sverify, &cmd_reindex, &cmd_gc};
#define N_STORE (sizeof store_cmds / sizeof store_cmds[0])

static void store_help(const cli_cmd *self, FILE *f)
{
    fputs(self->help, f);
    for (size_t i = 0; i < N_STORE; i++)
        fprintf(f, "  %-8s %s\n", store_cmds[i]->name + 6, store_cmds[i]->summary);
    fputs("\nRun 'kvx store COMMAND --help' for the options of a command.\n"
          "Exit status: 0 success, 1 failure or bad data, 2 usage error.\n",
          f);
}

static int run_store(const cli_cmd *self, int argc, char **argv)
{
    if (argc < 2) {
        store_help(self, stderr);
        return CLI_USAGE;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        store_help(self, stdout);
        return CLI_OK;
    }
    for (size_t i = 0; i < N_STORE; i++)
        if (!strcmp(argv[1], store_cmds[i]->name + 6))
            return store_cmds[i]->run(store_cmds[i], argc - 1, argv + 1);
    return cli_usage(self, "unknown store command '%s'", argv[1]);
}

const cli_cmd cli_cmd_store = {
    "store",
    "a persistent prefix cache: create, put, get, prefix, stat, verify, reindex, gc",
    "Usage: kvx store COMMAND DIR [OPTIONS] [ARGS...]\n"
    "\n"
    "A store is a directory holding sealed KVX shards and an LMDB index by\n"
    "coordinate and by chained block hash. It survives restarts: blocks put\n"
    "and flushed are served again after the process (or machine) restarts.\n"
    "\n"
    "Commands:\n",
    run_store,
};
