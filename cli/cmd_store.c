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

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int parse_quant(const char *s, uint32_t *out)
{
    if (!strcmp(s, "fp16")) *out = KVX_QUANT_FP16;
    else if (!strcmp(s, "e4m3")) *out = KVX_QUANT_E4M3;
    else if (!strcmp(s, "e5m2")) *out = KVX_QUANT_E5M2;
    else if (!strcmp(s, "bf16")) *out = KVX_QUANT_BF16;
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
        default: *rc = cli_getopt_error(self, ch, argv, o); return 1;
        }
    }
    return 0;
}
#define HANDLE_SIMPLE_OPTS(self, argc, argv, json)                     \
    do {                                                               \
        int rc_;                                                       \
        if (simple_opts(self, argc, argv, json, &rc_)) return rc_;     \
    } while (0)

/* The hint for a store that would not open: a lost index is a reindex
 * away, not a new store. */
static const char *open_hint(int rc, const char *dir, char *buf, size_t cap)
{
    struct stat st;
    char p[4096];
    snprintf(p, sizeof p, "%s/STORE", dir);
    int is_store = lstat(p, &st) == 0;
    const char *err = kvx_last_error();
    if (rc == KVX_ENOTFOUND && !is_store) {
        snprintf(buf, cap, "make one with 'kvx store create %s --layers L --kv-heads H "
                           "--head-dim D --block-tokens B --quant fp16'", dir);
    } else if (is_store && (rc == KVX_ENOTFOUND || (err && strstr(err, "index")))) {
        snprintf(buf, cap, "the store's index is missing or damaged: 'kvx store reindex %s' "
                           "rebuilds it from the shards", dir);
    } else if (rc == KVX_EMETACRC || rc == KVX_EPAGECRC || rc == KVX_ECORRUPT || rc == KVX_ETRUNC) {
        snprintf(buf, cap, "'kvx store verify %s' names what is damaged", dir);
    } else {
        return NULL;
    }
    return buf;
}

static int open_store(const cli_cmd *self, kvx_store **out, const char *dir, uint32_t flags)
{
    int rc = kvx_store_open(out, dir, NULL, flags);
    if (rc != 0) {
        char hint[512];
        return cli_fail_code_hint(self, rc, open_hint(rc, dir, hint, sizeof hint),
                                  "cannot open the store '%s'", dir);
    }
    return CLI_OK;
}

/* The pid in DIR/LOCK (the writer holding the store writes it after
 * taking the lock), or 0 when it is not there yet or not running. */
static long lock_holder(const char *dir)
{
    char p[4096], b[32];
    snprintf(p, sizeof p, "%s/LOCK", dir);
    int fd = open(p, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t r = read(fd, b, sizeof b - 1);
    close(fd);
    if (r <= 0) return 0;
    b[r] = '\0';
    char *end;
    long pid = strtol(b, &end, 10);
    if (pid <= 0 || end == b || (*end && *end != '\n')) return 0;
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 0;
    return pid;
}

static void sleep_s(double s)
{
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* --wait SECONDS / --no-wait of the writer commands: wait < 0 forever
 * (the default), 0 not at all. */
#define WAIT_OPTIONS {"wait", required_argument, NULL, 'W'}, {"no-wait", no_argument, NULL, 'N'}
#define WAIT_HELP                                                                               \
    "      --wait SECONDS     give up (exit 1) when another writer still holds\n"               \
    "                         the store after SECONDS (default: wait as long as\n"              \
    "                         it takes, saying once which pid holds it)\n"                      \
    "      --no-wait          fail at once (exit 1) when another writer holds it\n"

static int parse_wait(const cli_cmd *self, int ch, const char *arg, double *wait)
{
    if (ch == 'N') {
        *wait = 0;
        return CLI_OK;
    }
    char *end;
    errno = 0;
    double v = strtod(arg, &end);
    if (errno || end == arg || *end || !(v >= 0) || v > 1e9)
        return cli_usage(self, "--wait must be a number of seconds (0 or more), not '%s'", arg);
    *wait = v;
    return CLI_OK;
}

/* One attempt, as dir's writer, with KVX_STORE_NOWAIT: KVX_EBUSY while
 * another writer holds the store. */
typedef int (*writer_attempt)(void *ctx, const char *dir);

/* Runs attempt every 100 ms while another writer holds dir, up to wait
 * seconds (-1: as long as it takes; 0: once), saying once which pid holds
 * it. open_hint: whether a failure may hint at reindex (never for reindex
 * itself: the hint would name the command that just failed). */
static int as_writer(const cli_cmd *self, const char *dir, double wait, writer_attempt attempt, void *ctx,
                     int with_open_hint)
{
    double start = cli_now();
    int said = 0;
    for (;;) {
        int rc = attempt(ctx, dir);
        if (rc != KVX_EBUSY) {
            if (rc == 0) return CLI_OK;
            char hint[512];
            return cli_fail_code_hint(self, rc, with_open_hint ? open_hint(rc, dir, hint, sizeof hint) : NULL,
                                      "cannot %s the store '%s'", with_open_hint ? "open" : "reindex", dir);
        }
        long pid = lock_holder(dir);
        for (int i = 0; !pid && i < 4; i++) { /* it writes its pid just after locking */
            sleep_s(0.025);
            pid = lock_holder(dir);
        }
        char who[48];
        if (pid) snprintf(who, sizeof who, "pid %ld", pid);
        else snprintf(who, sizeof who, "another process");
        double waited = cli_now() - start;
        if (wait == 0) {
            cli_fail(self, "the store '%s' is held by %s, another writer (--no-wait)", dir, who);
            fprintf(stderr, "  hint: try again when it is done, or use --wait SECONDS\n");
            return CLI_FAIL;
        }
        if (wait > 0 && waited >= wait)
            return cli_fail(self, "gave up after %.1f s: the store '%s' is still held by %s, "
                                  "another writer", waited, dir, who);
        if (!said) {
            fprintf(stderr, "kvx %s: waiting for %s, which holds the store '%s' as its writer...\n",
                    self->name, who, dir);
            said = 1;
        }
        double left = wait > 0 ? wait - waited : 0.1;
        sleep_s(left < 0.1 ? left : 0.1);
    }
}

typedef struct {
    kvx_store **out;
    const kvx_geometry *g;
} open_attempt_ctx;

static int open_attempt(void *ctx, const char *dir)
{
    open_attempt_ctx *c = ctx;
    return kvx_store_open(c->out, dir, c->g, KVX_STORE_NOWAIT);
}

/* Opens dir as its writer (of geometry g when g is non-NULL), waiting for
 * another writer as as_writer says. */
static int open_writer_g(const cli_cmd *self, kvx_store **out, const char *dir,
                         const kvx_geometry *g, double wait)
{
    open_attempt_ctx c = {out, g};
    return as_writer(self, dir, wait, open_attempt, &c, 1);
}

static int open_writer(const cli_cmd *self, kvx_store **out, const char *dir, double wait)
{
    return open_writer_g(self, out, dir, NULL, wait);
}

/* For the other store command files (cmd_tier.c). */
int cli_store_parse_wait(const cli_cmd *self, int ch, const char *arg, double *wait)
{
    return parse_wait(self, ch, arg, wait);
}
int cli_store_open_writer(const cli_cmd *self, kvx_store **out, const char *dir, double wait)
{
    return open_writer(self, out, dir, wait);
}
int cli_store_open_writer_g(const cli_cmd *self, kvx_store **out, const char *dir,
                            const kvx_geometry *g, double wait)
{
    return open_writer_g(self, out, dir, g, wait);
}
int cli_store_open_reader(const cli_cmd *self, kvx_store **out, const char *dir)
{
    return open_store(self, out, dir, KVX_STORE_READONLY);
}

/* -------------------------------------------------------------- create */

/* Creates the store and closes it, giving its capacity as text in cap:
 * CLI_OK, or the exit a failure takes (options no store can have, such as
 * a capacity below one block, are usage errors). */
/* Creates the store; cap gets its capacity and tier (nullable) the tier's
 * URL with the password redacted ("" without one). Neither contacts the
 * tier: the capacity comes from a handle opened with the tier off
 * (kvx_store_stat asks a tier it has not asked yet). */
static int create_store(const cli_cmd *self, const char *dir, const kvx_store_options *o, char *cap, size_t capsz,
                        char *tier, size_t tiersz)
{
    kvx_store *s = NULL;
    int rc = kvx_store_create(&s, dir, o);
    if (rc == KVX_EINVALID || rc == KVX_EOVERFLOW || rc == KVX_EQUANT || rc == KVX_ECAPACITY) {
        const char *why = kvx_last_error();
        return cli_usage(self, "%s", why && *why ? why : kvx_strerror(rc));
    }
    if (rc != 0) return cli_fail_code(self, rc, "cannot create the store '%s'", dir);
    kvx_store_tier t;
    if (tier) snprintf(tier, tiersz, "%s", kvx_store_tier_get(&t, s) == 0 ? t.url : "");
    kvx_store_close(s);
    kvx_store_options ro = KVX_STORE_OPTIONS_INIT;
    ro.flags = KVX_STORE_READONLY;
    ro.tier_url = "off";
    kvx_store_stats st;
    s = NULL;
    if (kvx_store_open_options(&s, dir, &ro) == 0 && kvx_store_stat(&st, s) == 0)
        cli_fmt_size(cap, capsz, st.capacity_bytes);
    else snprintf(cap, capsz, "default");
    kvx_store_close(s);
    return CLI_OK;
}

/* `store create DIR --page-bytes N`: a keyed store (no geometry). */
static int create_keyed(const cli_cmd *self, const char *dir, const kvx_store_options *o, int have)
{
    if (have)
        return cli_usage(self, "--page-bytes makes a keyed store: give no --layers, --kv-heads, --head-dim, "
                               "--block-tokens, --quant or --model-signature with it");
    char cap[32];
    int rc = create_store(self, dir, o, cap, sizeof cap, NULL, 0);
    if (rc != CLI_OK) return rc;
    printf("created keyed store %s: pages of 1..%" PRIu64 " bytes, capacity %s\n", dir, o->page_bytes, cap);
    return CLI_OK;
}

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
        {"page-bytes", required_argument, NULL, 'P'},
        {"tier", required_argument, NULL, 'T'},
        {"tenant", required_argument, NULL, 'n'},
        {"tier-ttl", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    uint64_t v;
    int have = 0, ch;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, ":L:H:D:B:q:c:m:P:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'L':
        case 'H':
        case 'D':
        case 'B': {
            const char *name = ch == 'L' ? "--layers" : ch == 'H' ? "--kv-heads"
                               : ch == 'D' ? "--head-dim" : "--block-tokens";
            uint64_t max = 65535;
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
                return cli_usage(self, "--quant must be fp16, e4m3, e5m2 or bf16, not '%s'", optarg);
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
            have |= 32;
            break;
        case 'P':
            if (cli_parse_size(optarg, &o.page_bytes) != 0 || o.page_bytes == 0)
                return cli_usage(self, "--page-bytes must be a size such as 65536 or 2MiB, not '%s'", optarg);
            break;
        case 'T': o.tier_url = optarg; break;
        case 'n': o.tier_tenant = optarg; break;
        case 't':
            if (cli_parse_tier_ttl(self, optarg, &o.tier_ttl_ms) != CLI_OK) return CLI_USAGE;
            break;
        case 'h': cli_print_help(self); return CLI_OK;
        default: return cli_getopt_error(self, ch, argv, opts);
        }
    }
    if (argc - optind != 1) return cli_usage(self, "expected one DIR");
    if ((o.tier_tenant || o.tier_ttl_ms) && !o.tier_url) return cli_usage(self, "--tenant and --tier-ttl need --tier");
    if (o.page_bytes) return create_keyed(self, argv[optind], &o, have);
    static const char *missing[] = {"--layers", "--kv-heads", "--head-dim", "--block-tokens",
                                    "--quant"};
    for (int i = 0; i < 5; i++)
        if (!(have & (1 << i))) return cli_usage(self, "%s is required", missing[i]);
    const char *dir = argv[optind];
    uint64_t pb = kvx_page_bytes(&o.geometry, o.geometry.block_tokens);
    if (pb == 0 || pb > UINT32_MAX)
        return cli_usage(self, "a block's page (2*L*Hkv*B*D*%zu bytes) must fit in 4 GiB",
                         kvx_quant_elem_size(o.geometry.quant));
    char cap[32], tier[1024];
    int rc = create_store(self, dir, &o, cap, sizeof cap, tier, sizeof tier);
    if (rc != CLI_OK) return rc;
    printf("created store %s: L=%u Hkv=%u D=%u B=%u %s, capacity %s\n", dir, o.geometry.num_layers,
           o.geometry.kv_heads, o.geometry.head_dim, o.geometry.block_tokens,
           kvx_quant_name(o.geometry.quant), cap);
    if (*tier) printf("shared tier %s (in %s/TIER)\n", tier, dir); /* the password as *** */
    return CLI_OK;
}

static const cli_cmd cmd_create = {
    "store create",
    "create a store with a fixed geometry and capacity",
    "Usage: kvx store create DIR --layers L --kv-heads H --head-dim D\n"
    "                        --block-tokens B --quant fp16|e4m3|e5m2|bf16\n"
    "                        [--capacity SIZE] [--model-signature HEX]\n"
    "                        [--tier redis://HOST:PORT[,HOST:PORT...]]\n"
    "                        [--tenant NAME] [--tier-ttl DURATION]\n"
    "       kvx store create DIR --page-bytes N [--capacity SIZE]\n"
    "\n"
    "Creates DIR (mode 0700) as a new store. Its geometry and model signature\n"
    "are fixed: opening it with another is refused. With --page-bytes it is a\n"
    "keyed store instead: pages of 1..N bytes named by an engine's own keys\n"
    "(LMCache, SGLang; docs/ENGINES.md), never served by token prefix.\n"
    "\n"
    "Options:\n"
    "  -L, --layers L             layers (1..65535)\n"
    "  -H, --kv-heads H           KV heads (1..65535)\n"
    "  -D, --head-dim D           head dimension (1..65535)\n"
    "  -B, --block-tokens B       tokens per block, 1..65535 (the engine uses 16)\n"
    "  -q, --quant Q              page element type: fp16, e4m3, e5m2 or bf16\n"
    "                             (bfloat16, the KV dtype of most models)\n"
    "  -c, --capacity SIZE        cap on shard bytes, e.g. 4GiB, 500MB\n"
    "                             (default: the library's)\n"
    "  -m, --model-signature HEX  first 8 bytes of the model's SHA-256 (default 0)\n"
    "  -P, --page-bytes N         a keyed store of pages up to N bytes (an even\n"
    "                             size, e.g. 65536 or 2MiB); no geometry options\n"
    "      --tier URL             a shared tier (Redis Cluster, or one Redis) kept\n"
    "                             in DIR/TIER: redis://[user[:pass]@]host:port,...\n"
    "                             (docs/TIER.md); not contacted here\n"
    "      --tenant NAME          the tier namespace's salt ([A-Za-z0-9._-])\n"
    "      --tier-ttl DURATION    TTL of the values written to the tier: digits\n"
    "                             and a unit (3600, 250ms, 90s, 30m, 12h, 7d), at\n"
    "                             most 2^62 ms; default none\n"
    "  -h, --help                 show this help\n"
    "\n"
    "A geometry or capacity no store can have (a dimension out of range, a\n"
    "page over 4 GiB, a capacity below the smallest a store holds) is a\n"
    "usage error.\n"
    "\n"
    "Exit status: 0 success, 1 failure (DIR exists, no permission...), 2 usage\n"
    "error (including out-of-range geometry or capacity).\n",
    run_create,
};

/* ----------------------------------------------------------------- put */

/* The blocks of an envelope, by what put does with them. */
typedef struct env_counts {
    uint32_t hashed;  /* full blocks with a hash: the ones put stores */
    uint32_t unnamed; /* full blocks with hash 0 (unregistered): never stored */
    uint32_t partial; /* fewer than B tokens: never stored */
    uint32_t block_tokens;
} env_counts;

/* 1 and *c filled when env parses (without a geometry to match), else 0. */
static int count_envelope(env_counts *c, const void *env, size_t len)
{
    memset(c, 0, sizeof *c);
    kvx_envelope e;
    if (kvx_envelope_parse(&e, env, len, NULL) != 0) return 0;
    c->block_tokens = e.geometry.block_tokens;
    for (uint32_t i = 0; i < e.n_blocks; i++) {
        kvx_envelope_block b;
        if (kvx_envelope_block_at(&b, &e, i) != 0) return 0;
        if (b.hash) c->hashed++;
        else if (b.n_tokens == e.geometry.block_tokens) c->unnamed++;
        else c->partial++;
    }
    return 1;
}

/* A failed put (flushed 0) or flush (1) of envp, named. A put larger than
 * the store's whole capacity is no matter for gc: say so, with both sizes. */
static void put_failure(const cli_cmd *self, kvx_store *s, int rc, const char *envp, int flushed)
{
    if (rc != KVX_ECAPACITY) {
        if (flushed) cli_fail_code(self, rc, "the blocks of '%s' could not be made durable", envp);
        else cli_fail_code(self, rc, "cannot put '%s'", envp);
        return;
    }
    char detail[1024], cap[32];
    snprintf(detail, sizeof detail, "%s", kvx_last_error()); /* stat would replace it */
    kvx_store_stats st;
    if (kvx_store_stat(&st, s) == 0) cli_fmt_size(cap, sizeof cap, st.capacity_bytes);
    else snprintf(cap, sizeof cap, "?");
    fprintf(stderr, "kvx %s: cannot put '%s': it is larger than the store's whole capacity of %s: "
                    "%s (%s)\n"
                    "  hint: gc cannot make room for it (it only evicts and compacts what the store "
                    "holds); put the sequence in smaller envelopes, or create a store with a larger "
                    "--capacity (a store's capacity is fixed when it is created)\n",
            self->name, envp, cap, *detail ? detail : kvx_strerror(rc), kvx_err_name(rc));
}

static int run_put(const cli_cmd *self, int argc, char **argv)
{
    static const struct option opts[] = {
        {"tokens", required_argument, NULL, 't'},
        WAIT_OPTIONS,
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *tokfile = NULL;
    double wait = -1;
    int ch;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, ":t:h", opts, NULL)) != -1) {
        switch (ch) {
        case 't': tokfile = optarg; break;
        case 'W':
        case 'N':
            if (parse_wait(self, ch, optarg, &wait) != CLI_OK) return CLI_USAGE;
            break;
        case 'h': cli_print_help(self); return CLI_OK;
        default: return cli_getopt_error(self, ch, argv, opts);
        }
    }
    if (argc - optind != 2) return cli_usage(self, "expected DIR and ENVELOPE");
    const char *dir = argv[optind], *envp = argv[optind + 1];
    if (tokfile && !strcmp(tokfile, "-") && !strcmp(envp, "-"))
        return cli_usage(self, "the envelope and --tokens cannot both be standard input");

    uint32_t *toks = NULL;
    size_t ntok = 0;
    if (tokfile && cli_read_tokens(self, tokfile, &toks, &ntok) != CLI_OK) return CLI_FAIL;
    void *env;
    size_t len;
    if (cli_read_envelope(self, envp, &env, &len) != CLI_OK) {
        free(toks);
        return CLI_FAIL;
    }
    /* What the envelope holds: a block is stored only under its hash, so
     * one whose hash is 0 ("unregistered": a partial tail, or a full block
     * its writer did not name) is never stored. A malformed envelope is
     * left for the library to name. */
    env_counts c;
    int parsed = count_envelope(&c, env, len);
    if (parsed && c.hashed == 0 && c.unnamed) {
        char b[16] = "B";
        snprintf(b, sizeof b, "%u", c.block_tokens);
        cli_fail(self, "nothing stored: the %u full block(s) of '%s' all have block hash 0, which "
                       "marks a block as unregistered; a block is stored only under its chained "
                       "hash%s", c.unnamed, envp,
                 tokfile ? " (--tokens does not name blocks: the envelope's hashes do)" : "");
        fprintf(stderr, "  hint: write the envelope with each full block's chained hash ('kvx hash "
                        "--block-tokens %s TOKEN...' prints them from the tokens)\n", b);
        free(env);
        free(toks);
        return CLI_FAIL;
    }
    kvx_store *s = NULL;
    if (open_writer(self, &s, dir, wait) != CLI_OK) {
        free(env);
        free(toks);
        return CLI_FAIL;
    }
    size_t fresh = 0;
    int rc = kvx_store_put_envelope(s, env, len, toks, ntok, &fresh);
    int flushed = 0;
    if (rc == 0) {
        flushed = 1;
        rc = kvx_store_flush(s);
    }
    if (rc != 0) {
        put_failure(self, s, rc, envp, flushed);
        kvx_store_close(s);
        free(env);
        free(toks);
        return CLI_FAIL;
    }
    kvx_store_close(s);
    free(env);
    free(toks);
    printf("%zu new block(s) of %u full block(s) stored durably in %s", fresh, parsed ? c.hashed : 0,
           dir);
    if (parsed && c.unnamed)
        printf("; %u full block(s) with hash 0 (unregistered) not stored", c.unnamed);
    if (parsed && c.partial)
        printf("; %u partial block(s) not stored (a partial block never is)", c.partial);
    printf("\n");
    return CLI_OK;
}

static const cli_cmd cmd_put = {
    "store put",
    "store every full block of an envelope, durably",
    "Usage: kvx store put DIR ENVELOPE [--tokens FILE] [--wait SECONDS | --no-wait]\n"
    "\n"
    "Stores every full block of a TLKV envelope (v1, v2 or v3) under its block\n"
    "hash; blocks the store already holds are not written again. The command\n"
    "exits 0 only once the blocks are durable (flushed and published).\n"
    "ENVELOPE may be '-' (standard input), a FIFO or a device: it is read to\n"
    "exactly the length its header declares (at most 4 GiB), and refused at\n"
    "its first bad header field. A FIFO that no process has opened for\n"
    "writing yet reads as empty (kvx never waits): start its writer first.\n"
    "\n"
    "Blocks put without --tokens are unverified: they are stored, but a\n"
    "prefix lookup never serves them and a get by hash refuses them, until a\n"
    "put with the tokens stores the verified block.\n"
    "\n"
    "A block is stored only under its chained hash: a partial block, and a\n"
    "full block whose hash is 0 (unregistered), are not stored, and the\n"
    "result line counts them. An envelope of 0 blocks or of partial blocks\n"
    "only stores nothing and exits 0; one whose full blocks all have hash 0\n"
    "stores nothing and exits 1, saying so (--tokens does not name blocks).\n"
    "A put larger than the store's whole capacity exits 1 naming both sizes:\n"
    "gc cannot make room for it; put smaller envelopes, or create a store\n"
    "with a larger --capacity.\n"
    "\n"
    "One writer at a time: while another process writes the store, put waits\n"
    "for it (saying once which pid holds the store) unless told otherwise.\n"
    "\n"
    "Options:\n"
    "  -t, --tokens FILE      the sequence's token ids (whitespace separated;\n"
    "                         '-' reads standard input); they fill the lineage\n"
    "                         and digest, so a lookup serves a block only for\n"
    "                         the exact same prefix. Their block hashes must\n"
    "                         equal the envelope's. At most 1 GiB of text.\n" WAIT_HELP
    "  -h, --help             show this help\n"
    "\n"
    "Exit status: 0 blocks durable, 1 failure (bad envelope, wrong geometry,\n"
    "every full block with hash 0, a put larger than the capacity, disk full,\n"
    "the store held by another writer past --wait...), 2 usage error.\n",
    run_put,
};

/* ----------------------------------------------------------------- get */

/* Why the block named hash could not be served, on stderr (one line, and
 * a hint line where there is something to do). detail is the library's
 * message for this block ("" or NULL: none): for damage it names the
 * shard file and what is wrong with it. */
static void say_unserved(const cli_cmd *self, const char *dir, uint64_t hash, int code,
                         const char *detail)
{
    const char *d = detail && *detail ? detail : kvx_strerror(code);
    switch (code) {
    case KVX_ENOTFOUND:
        fprintf(stderr, "kvx %s: block 0x%016" PRIx64 " is not in the store\n", self->name, hash);
        break;
    case KVX_EAMBIGUOUS:
        fprintf(stderr, "kvx %s: block 0x%016" PRIx64 " is ambiguous: several verified blocks "
                        "share that hash (EAMBIGUOUS)\n  hint: give the prompt's tokens "
                        "(--tokens FILE) to pick the block by digest\n", self->name, hash);
        break;
    case KVX_EUNVERIFIED:
        fprintf(stderr, "kvx %s: block 0x%016" PRIx64 " is held only unverified (stored without "
                        "its tokens), so it is not served (EUNVERIFIED)\n  hint: put the "
                        "envelope again with --tokens FILE\n", self->name, hash);
        break;
    case KVX_EPAGECRC:
    case KVX_EMETACRC:
    case KVX_ECORRUPT:
    case KVX_ETRUNC:
        if (!strncmp(d, "index", 5)) { /* a damaged catalog record, not a shard */
            fprintf(stderr, "kvx %s: block 0x%016" PRIx64 " cannot be looked up: the store's index "
                            "is damaged: %s (%s)\n  hint: 'kvx store reindex %s' rebuilds the "
                            "index from the shard files\n", self->name, hash, d, kvx_err_name(code),
                    dir);
            break;
        }
        /* Readers never repair (DESIGN.md rule 3): say what a writer can do. */
        fprintf(stderr, "kvx %s: block 0x%016" PRIx64 " is in the store, but damaged: %s (%s)\n",
                self->name, hash, d, kvx_err_name(code));
        if (code == KVX_ECORRUPT) /* the shard file cannot be opened or used at all */
            fprintf(stderr, "  hint: no block of that shard file can be served; 'kvx store gc %s' "
                            "(or any writer) moves it to %s/quarantine/ (kept, not deleted); put "
                            "this block again from its source; 'kvx store verify %s' names every "
                            "damaged shard\n", dir, dir, dir);
        else /* a damaged or missing page in a shard that opens */
            fprintf(stderr, "  hint: this block's page is lost; 'kvx store gc %s' copies the "
                            "shard's good blocks into a new shard and moves the damaged file to "
                            "%s/quarantine/ (kept, not deleted); put this block again from its "
                            "source; 'kvx store verify %s' names every damaged page\n", dir, dir,
                    dir);
        break;
    case KVX_EPATH:
        fprintf(stderr, "kvx %s: block 0x%016" PRIx64 " is in the store's index, but its shard "
                        "is not a file kvx reads: %s (%s)\n"
                        "  hint: kvx never moves or deletes what is not a regular file: move it "
                        "out of %s/shards/, then 'kvx store reindex %s' rebuilds the index from "
                        "the files that are there; put the block again from its source\n",
                self->name, hash, d, kvx_err_name(code), dir, dir);
        break;
    case -ENOENT:
        fprintf(stderr, "kvx %s: block 0x%016" PRIx64 " is in the store's index, but its shard "
                        "file is gone: %s (%s)\n"
                        "  hint: the block is lost: put it again from its source; 'kvx store "
                        "reindex %s' rebuilds the index from the files that are there\n",
                self->name, hash, d, kvx_err_name(code), dir);
        break;
    default:
        fprintf(stderr, "kvx %s: block 0x%016" PRIx64 " could not be read: %s (%s)\n", self->name,
                hash, d, kvx_err_name(code));
        if (code == -EAGAIN) fprintf(stderr, "  hint: try again\n");
    }
}

static int parse_format(const cli_cmd *self, const char *arg, int *version)
{
    if (!strcmp(arg, "v1")) *version = KVX_ENVELOPE_V1;
    else if (!strcmp(arg, "v2")) *version = KVX_ENVELOPE_V2;
    else if (!strcmp(arg, "v3")) *version = KVX_ENVELOPE_V3;
    else return cli_usage(self, "--format must be v1, v2 or v3, not '%s'", arg);
    return CLI_OK;
}

/* Exports views as one envelope (every page's CRC checked again by the
 * library) into the output o, opened already; aborts o on failure. */
static int export_views(const cli_cmd *self, const char *dir, kvx_store *s, const kvx_view *views,
                        size_t n, int version, cli_out *o)
{
    void *buf = NULL;
    size_t len = 0;
    int rc = kvx_views_export(&buf, &len, s, views, n, (uint16_t)version);
    if (rc != 0) {
        cli_out_abort(o);
        char hint[512];
        snprintf(hint, sizeof hint, "'kvx store verify %s' names every damaged shard and page", dir);
        return cli_fail_code_hint(self, rc, rc == KVX_EPAGECRC ? hint : NULL,
                                  "cannot export the blocks; nothing written");
    }
    int ret = cli_out_write(self, o, buf, len);
    if (ret == CLI_OK) ret = cli_out_commit(self, o);
    kvx_free(buf);
    return ret;
}

static int run_get(const cli_cmd *self, int argc, char **argv)
{
    static const struct option opts[] = {
        {"output", required_argument, NULL, 'o'},
        {"format", required_argument, NULL, 'f'},
        {"tokens", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *out = NULL, *tokfile = NULL;
    int version = 0, ch;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, ":o:f:t:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'o': out = optarg; break;
        case 'f':
            if (parse_format(self, optarg, &version) != CLI_OK) return CLI_USAGE;
            break;
        case 't': tokfile = optarg; break;
        case 'h': cli_print_help(self); return CLI_OK;
        default: return cli_getopt_error(self, ch, argv, opts);
        }
    }
    if (argc - optind < 2) return cli_usage(self, "expected DIR and at least one HASH");
    if (!out) return cli_usage(self, "-o ENVELOPE is required");
    if (!version) return cli_usage(self, "--format v1|v2|v3 is required");
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
    uint32_t *toks = NULL;
    size_t ntok = 0;
    if (tokfile && cli_read_tokens(self, tokfile, &toks, &ntok) != CLI_OK) {
        free(hashes);
        return CLI_FAIL;
    }
    /* The output first: one that will be refused fails before any work. */
    cli_out o;
    if (cli_out_open(self, &o, out, 0) != CLI_OK) {
        free(toks);
        free(hashes);
        return CLI_FAIL;
    }
    kvx_store *s = NULL;
    if (open_store(self, &s, dir, KVX_STORE_READONLY) != CLI_OK) {
        cli_out_abort(&o);
        free(toks);
        free(hashes);
        return CLI_FAIL;
    }
    kvx_view *views = calloc(n, sizeof *views);
    int *status = malloc(n * sizeof *status);
    uint64_t *chain = NULL;
    size_t nchain = 0, bad = 0;
    int ret = CLI_FAIL;
    if (!views || !status) {
        cli_fail(self, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < n; i++) status[i] = 1; /* not looked up */
    if (tokfile) {
        /* Each HASH names one of the prompt's full blocks; the block ending
         * there is picked by the prompt's digest. */
        kvx_geometry g;
        int rc = kvx_store_get_geometry(&g, s);
        if (rc != 0) {
            cli_fail_code(self, rc, "cannot read the store's geometry");
            goto done;
        }
        size_t B = g.block_tokens;
        nchain = B ? ntok / B : 0;
        chain = malloc((nchain ? nchain : 1) * sizeof *chain);
        if (!chain) {
            cli_fail(self, "out of memory");
            goto done;
        }
        nchain = kvx_block_hashes(chain, toks, ntok, (uint32_t)B);
        for (size_t i = 0; i < n; i++) {
            size_t k = 0;
            while (k < nchain && chain[k] != hashes[i]) k++;
            if (k == nchain) {
                fprintf(stderr, "kvx %s: block 0x%016" PRIx64 " is not one of the %zu full "
                                "block(s) of the tokens in '%s'\n", self->name, hashes[i], nchain,
                        tokfile);
                bad++;
                continue;
            }
            status[i] = kvx_store_get_block(&views[i], s, toks, (k + 1) * B);
            if (status[i] != 0) {
                say_unserved(self, dir, hashes[i], status[i], kvx_last_error());
                bad++;
            }
        }
    } else {
        /* One call per hash, so each block that is not served is named
         * with the library's own words for it (which shard, what damage). */
        for (size_t i = 0; i < n; i++) {
            status[i] = kvx_store_get_hash(&views[i], s, hashes[i]);
            if (status[i] != 0) {
                say_unserved(self, dir, hashes[i], status[i], kvx_last_error());
                bad++;
            }
        }
    }
    if (bad) {
        fprintf(stderr, "kvx %s: %zu of %zu block(s) not served; nothing written\n", self->name,
                bad, n);
        goto done;
    }
    ret = export_views(self, dir, s, views, n, version, &o);
done:
    if (ret != CLI_OK) cli_out_abort(&o); /* nothing written */
    if (views && status)
        for (size_t i = 0; i < n; i++)
            if (status[i] == 0) kvx_view_release(&views[i]);
    free(chain);
    free(status);
    free(views);
    free(toks);
    free(hashes);
    kvx_store_close(s);
    return ret;
}

static const cli_cmd cmd_get = {
    "store get",
    "write blocks named by hash into one envelope",
    "Usage: kvx store get DIR -o ENVELOPE --format v1|v2|v3 [--tokens FILE] HASH...\n"
    "\n"
    "Looks each block up by its chained hash (hex, with or without 0x) and\n"
    "writes them, in the order given, as one TLKV envelope. Every page's\n"
    "CRC-32 is checked again before it is written: a damaged block is named,\n"
    "not exported.\n"
    "\n"
    "By hash alone, a block is served only when exactly one verified block\n"
    "holds the hash. Each block that is not served is named with why: not in\n"
    "the store, ambiguous (several verified blocks share the hash: give\n"
    "--tokens), held only unverified (stored without tokens), or damaged.\n"
    "Then nothing is written.\n"
    "\n"
    "A block in a damaged shard is never called missing: the shard file is\n"
    "named with its damage (a page that fails its CRC or lies past the end of\n"
    "the file; a file that cannot be opened or is not this store's, is gone,\n"
    "or is not a regular file) and what helps. get is a reader and never\n"
    "repairs: 'kvx store gc DIR' copies a damaged shard's good blocks into a\n"
    "new shard, and a writer moves a file that cannot be used to quarantine/\n"
    "(kept, not deleted).\n"
    "\n"
    "With --tokens, each HASH must be the hash of one of the prompt's full\n"
    "blocks, and the block is picked by the prompt's digest: the one whose\n"
    "whole prefix equals the prompt's.\n"
    "\n"
    "Options:\n"
    "  -o, --output ENVELOPE  where to write: a regular file is replaced\n"
    "                         atomically, keeping its permission bits (a killed\n"
    "                         command leaves no temporary file); a FIFO or\n"
    "                         character device is written into (a FIFO nobody\n"
    "                         reads is refused); '-' is standard output; a\n"
    "                         symlink, directory or other kind of file is\n"
    "                         refused and left as it is\n"
    "  -f, --format v1|v2|v3  v1: f16; v2: e4m3 with per-slab scales; v3: bf16\n"
    "                         (kvx's extension, lossless for a bf16 store). A\n"
    "                         bf16 store writes v1 only when every value is\n"
    "                         exact in f16, else exit 1 naming the first value\n"
    "  -t, --tokens FILE      the prompt's token ids (whitespace separated; '-'\n"
    "                         reads standard input; at most 1 GiB of text)\n"
    "  -h, --help             show this help\n"
    "\n"
    "Exit status: 0 success, 1 a block not served (missing, ambiguous,\n"
    "unverified, damaged or in a damaged shard, not in the tokens) or another\n"
    "failure, 2 usage error.\n",
    run_get,
};

/* -------------------------------------------------------------- prefix */

static int run_prefix(const cli_cmd *self, int argc, char **argv)
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
            if (parse_format(self, optarg, &version) != CLI_OK) return CLI_USAGE;
            break;
        case 'h': cli_print_help(self); return CLI_OK;
        default: return cli_getopt_error(self, ch, argv, opts);
        }
    }
    if (argc - optind < 1) return cli_usage(self, "expected DIR and TOKEN...");
    if (out && !version) return cli_usage(self, "-o needs --format v1|v2|v3");
    if (version && !out) return cli_usage(self, "--format applies to -o ENVELOPE");
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
    cli_out o;
    if (out && cli_out_open(self, &o, out, 0) != CLI_OK) {
        free(toks);
        return CLI_FAIL;
    }
    kvx_store *s = NULL;
    if (open_store(self, &s, dir, KVX_STORE_READONLY) != CLI_OK) {
        if (out) cli_out_abort(&o);
        free(toks);
        return CLI_FAIL;
    }
    kvx_geometry g;
    memset(&g, 0, sizeof g);
    int rc = kvx_store_get_geometry(&g, s);
    size_t full = (rc == 0 && g.block_tokens) ? n / g.block_tokens : 0;
    kvx_view *views = calloc(full ? full : 1, sizeof *views);
    size_t got = 0;
    char stopped[1024] = "";
    int ret = CLI_OK;
    if (rc == 0 && !views) rc = -ENOMEM;
    if (rc == 0) {
        rc = kvx_store_prefix(views, &got, s, toks, n, full);
        /* 0 whatever was served; a message when a damaged page ended it. */
        const char *why = kvx_last_error();
        if (rc == 0 && why && *why) snprintf(stopped, sizeof stopped, "%s", why);
    }
    if (rc != 0) {
        if (out) cli_out_abort(&o);
        ret = cli_fail_code(self, rc, "prefix lookup failed");
        got = 0;
    } else if (out) {
        /* Exactly the served blocks, checked again; none: n_blocks = 0. */
        ret = export_views(self, dir, s, views, got, version, &o);
    }
    if (ret == CLI_OK) {
        /* with -o -, standard output holds the envelope alone: the count
         * goes to standard error */
        FILE *say = out && !strcmp(out, "-") ? stderr : stdout;
        fprintf(say, "%zu of %zu full block(s) served from the store (%zu of %zu tokens)\n", got, full,
                got * g.block_tokens, n);
        if (fflush(say) != 0) ret = cli_fail(self, "cannot write to standard output");
        if (*stopped) {
            fprintf(stderr, "kvx %s: the prefix stopped at a damaged block: %s\n", self->name,
                    stopped);
            fprintf(stderr, "  hint: 'kvx store verify %s' names every damaged shard and page\n",
                    dir);
        }
    }
    kvx_views_release(views, got);
    free(views);
    free(toks);
    kvx_store_close(s);
    return ret;
}

static const cli_cmd cmd_prefix = {
    "store prefix",
    "how many leading blocks of a token sequence the store serves",
    "Usage: kvx store prefix DIR [-o ENVELOPE --format v1|v2|v3] TOKEN...\n"
    "\n"
    "Looks up the longest cached prefix of the token sequence and prints the\n"
    "number of leading full blocks served from the store as its first word:\n"
    "  3 of 4 full block(s) served from the store (48 of 70 tokens)\n"
    "A block is served only when its hash, parent, tokens and prefix digest\n"
    "equal the query's. The prefix ends before the first block that is\n"
    "missing, unverified (stored without tokens) or fails its page CRC; a\n"
    "CRC failure is named on standard error, but the exit status stays 0\n"
    "('kvx store verify' is the command that fails on damage).\n"
    "\n"
    "Options:\n"
    "  -o, --output ENVELOPE  also write exactly the served blocks, their\n"
    "                         pages' CRCs checked again, as one envelope (none\n"
    "                         served: a valid envelope of 0 blocks). Written\n"
    "                         like 'kvx store get -o': a regular file is\n"
    "                         replaced atomically, a FIFO or character device\n"
    "                         written into, '-' is standard output (the count\n"
    "                         then goes to standard error), anything else\n"
    "                         refused; never a path inside a store\n"
    "  -f, --format v1|v2|v3  the envelope's version (required with -o; as for\n"
    "                         'kvx store get': v3 is bf16, and a bf16 store\n"
    "                         writes v1 only when every value fits f16)\n"
    "  -h, --help             show this help\n"
    "\n"
    "Exit status: 0 the lookup ran (whatever it served, 0 blocks included),\n"
    "1 failure (not a store, the envelope could not be written...), 2 usage\n"
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
    kvx_store_tier tier;
    int rc = kvx_store_stat(&st, s);
    if (rc == 0) rc = kvx_store_get_geometry(&g, s);
    if (rc == 0) rc = kvx_store_tier_get(&tier, s);
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
        cli_json_key(&j, "quarantined");
        cli_json_u64(&j, st.quarantined);
        cli_json_key(&j, "quarantine_bytes");
        cli_json_u64(&j, st.quarantine_bytes);
        cli_json_key(&j, "freed_bytes");
        cli_json_u64(&j, st.freed_bytes);
        cli_json_key(&j, "unverified");
        cli_json_u64(&j, st.unverified);
        cli_json_key(&j, "kind");
        cli_json_str(&j, st.page_bytes ? "keyed" : "blocks");
        cli_json_key(&j, "page_bytes");
        cli_json_u64(&j, st.page_bytes);
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
        cli_json_key(&j, "tier");
        cli_json_str(&j, tier.url);
        static const char *tk[] = {"tier_hits", "tier_misses", "tier_errors", "tier_bad", "tier_replaced",
                                   "tier_writes", "tier_bytes_up", "tier_bytes_down", "tier_up"};
        const uint64_t tv[] = {st.tier_hits, st.tier_misses, st.tier_errors, st.tier_bad, st.tier_replaced,
                               st.tier_writes, st.tier_bytes_up, st.tier_bytes_down, st.tier_up};
        for (int i = 0; i < 9; i++) {
            cli_json_key(&j, tk[i]);
            cli_json_u64(&j, tv[i]);
        }
        cli_json_obj_end(&j);
        cli_json_finish(&j);
        return CLI_OK;
    }
    char a[32], b[32];
    printf("store        %s\n", dir);
    if (st.page_bytes) {
        printf("kind         keyed pages of 1..%" PRIu64 " bytes (named by the engine's keys)\n", st.page_bytes);
        printf("pages        %" PRIu64 "\n", st.blocks);
    } else {
        printf("geometry     L=%u Hkv=%u D=%u B=%u %s, model 0x%016" PRIx64 "\n", g.num_layers, g.kv_heads,
               g.head_dim, g.block_tokens, kvx_quant_name(g.quant) ? kvx_quant_name(g.quant) : "unknown",
               g.model_signature);
        printf("blocks       %" PRIu64 "\n", st.blocks);
    }
    /* pages freed in place are in the files' sizes, not on the disk nor in the capacity */
    uint64_t live = st.bytes > st.freed_bytes ? st.bytes - st.freed_bytes : 0;
    printf("bytes        %s of %s capacity (%.1f%%)", cli_fmt_size(a, sizeof a, live),
           cli_fmt_size(b, sizeof b, st.capacity_bytes),
           st.capacity_bytes ? 100.0 * (double)live / (double)st.capacity_bytes : 0.0);
    if (st.freed_bytes)
        printf(": the files hold %s, %s of it pages freed in place", cli_fmt_size(a, sizeof a, st.bytes),
               cli_fmt_size(b, sizeof b, st.freed_bytes));
    printf("\n");
    printf("shards       %" PRIu64 "\n", st.shards);
    uint64_t look = st.hits + st.misses;
    printf("hits         %" PRIu64 " (%.1f%% of %" PRIu64 " lookups)\n", st.hits,
           look ? 100.0 * (double)st.hits / (double)look : 0.0, look);
    printf("misses       %" PRIu64 "\n", st.misses);
    printf("evictions    %" PRIu64 " shard(s), %" PRIu64 " block(s)\n", st.evictions,
           st.evicted_blocks);
    printf("compactions  %" PRIu64 "\n", st.compactions);
    printf("unverified   %" PRIu64 " block(s)%s\n", st.unverified,
           st.unverified ? " never served by prefix (stored without tokens, or before the digest: "
                           "'kvx store reindex' derives digests for the latter)"
                         : "");
    char qb[32];
    printf("quarantined  %" PRIu64 " file(s), %s%s\n", st.quarantined, cli_fmt_size(qb, sizeof qb, st.quarantine_bytes),
           st.quarantined ? " in quarantine/ (each has a .why note; counted in the capacity, the oldest removed past a "
                            "quarter of it or 64 files)"
                          : "");
    if (tier.url[0]) {
        printf("tier         %s, %s%s%s\n", tier.url, st.tier_up ? "up" : "DOWN (lookups miss it; nothing fails)",
               tier.tenant[0] ? ", tenant " : "", tier.tenant);
        printf("tier counts  this handle: %" PRIu64 " hits, %" PRIu64 " misses (%" PRIu64 " unanswered, %" PRIu64
               " bad values), %" PRIu64 " replaced, %" PRIu64 " written, %s up, %s down\n",
               st.tier_hits, st.tier_misses, st.tier_errors, st.tier_bad, st.tier_replaced, st.tier_writes,
               cli_fmt_size(a, sizeof a, st.tier_bytes_up), cli_fmt_size(b, sizeof b, st.tier_bytes_down));
    } else {
        printf("tier         none\n");
    }
    return CLI_OK;
}

static const cli_cmd cmd_stat = {
    "store stat",
    "blocks, bytes, shards, capacity, hits, misses, evictions, quarantined",
    "Usage: kvx store stat DIR [--json]\n"
    "\n"
    "Prints the store's geometry and counters.\n"
    "\n"
    "Options:\n"
    "  -j, --json  one JSON object: blocks, bytes, shards, capacity, hits,\n"
    "              misses, evictions, evicted_blocks, compactions, quarantined,\n"
    "              quarantine_bytes, freed_bytes (pages freed in place: bytes\n"
    "              counts them, the capacity does not),\n"
    "              unverified, num_layers,\n"
    "              kv_heads, head_dim, block_tokens, quant_format,\n"
    "              model_signature, tier (the URL, \"\" when none), and this\n"
    "              handle's tier counters: tier_hits, tier_misses, tier_errors,\n"
    "              tier_bad, tier_replaced, tier_writes, tier_bytes_up,\n"
    "              tier_bytes_down, tier_up (1: the tier answers now)\n"
    "  -h, --help  show this help\n"
    "\n"
    "Exit status: 0 success, 1 failure, 2 usage error.\n",
    run_stat,
};

/* ------------------------------------------- verify / reindex / gc */

/* Options of reindex and gc: -h, --wait, --no-wait. Returns 1 when the
 * caller must return *rc at once. */
static int writer_opts(const cli_cmd *self, int argc, char **argv, double *wait, int *rc)
{
    static const struct option opts[] = {
        WAIT_OPTIONS,
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int ch;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        switch (ch) {
        case 'W':
        case 'N':
            if (parse_wait(self, ch, optarg, wait) != CLI_OK) {
                *rc = CLI_USAGE;
                return 1;
            }
            break;
        case 'h': cli_print_help(self); *rc = CLI_OK; return 1;
        default: *rc = cli_getopt_error(self, ch, argv, opts); return 1;
        }
    }
    return 0;
}

typedef struct verify_ctx {
    const char *dir;
    uint64_t pages;  /* damaged or missing pages of shards that open: gc salvages the rest */
    uint64_t files;  /* shard files that cannot be opened or are not this store's */
    uint64_t index;  /* the index and the shards disagree */
    uint64_t others; /* anything else (something not a shard file in shards/...) */
} verify_ctx;

/* Sorts each problem by what can help (the report's own words: "shards/F:
 * entry N: ..." is a page, "shards/F (shard N): ..." a whole file,
 * "index..." or an entry without its index record the index). */
static void store_report(void *ctx, const char *what, int code)
{
    verify_ctx *v = ctx;
    if (code == 0) { /* a note, not a problem */
        printf("%s: %s\n", v->dir, what);
        return;
    }
    printf("%s: BAD: %s (%s)\n", v->dir, what, kvx_err_name(code));
    int entry = !strncmp(what, "shards/", 7) && strstr(what, ": entry ") != NULL;
    if (code == KVX_EPATH) v->others++; /* not a regular file: kvx leaves it alone */
    else if (entry && (code == KVX_EPAGECRC || code == KVX_ETRUNC)) v->pages++;
    else if (!strncmp(what, "index", 5) || (entry && code == KVX_ENOTFOUND)) v->index++;
    else if (!strncmp(what, "shards/", 7) && strstr(what, " (shard ")) v->files++;
    else v->others++;
}

static int run_sverify(const cli_cmd *self, int argc, char **argv)
{
    HANDLE_SIMPLE_OPTS(self, argc, argv, NULL);
    if (argc - optind != 1) return cli_usage(self, "expected one DIR");
    const char *dir = argv[optind];
    kvx_store *s = NULL;
    if (open_store(self, &s, dir, KVX_STORE_READONLY) != CLI_OK) return CLI_FAIL;
    uint64_t bad = 0;
    verify_ctx v = {dir, 0, 0, 0, 0};
    int rc = kvx_store_verify(s, &bad, store_report, &v);
    kvx_store_stats st;
    int src = kvx_store_stat(&st, s);
    kvx_store_close(s);
    fflush(stdout);
    if (bad) {
        /* Each hint names only a command that helps with what was found. */
        fprintf(stderr, "kvx store verify: %" PRIu64 " problem(s) in %s\n", bad, dir);
        if (v.pages)
            fprintf(stderr, "  hint: a page that fails its CRC (or lies past the end of its file) "
                            "cannot be mended, and its block is no longer served; 'kvx store gc %s' "
                            "copies the shard's good blocks into a new shard and moves the damaged "
                            "file to %s/quarantine/ (kept, not deleted); put the lost blocks again "
                            "from their source\n", dir, dir);
        if (v.files)
            fprintf(stderr, "  hint: 'kvx store reindex %s' rebuilds the index from the shard files "
                            "that are there and moves a damaged or foreign shard file to "
                            "%s/quarantine/ (kept, not deleted); the blocks it held are lost: put "
                            "them again from their source\n", dir, dir);
        if (v.index)
            fprintf(stderr, "  hint: 'kvx store reindex %s' rebuilds the index from the shard "
                            "files\n", dir);
        if (v.others)
            fprintf(stderr, "  hint: kvx never moves or deletes what is not a regular file: move "
                            "it out of %s/shards/, then 'kvx store reindex %s' rebuilds the index "
                            "from the files that are there\n", dir, dir);
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
    "and the shards agree. Each problem is printed on its own line; an empty\n"
    "store is OK (0 blocks). A hint names what helps each kind of problem:\n"
    "for damaged or missing pages 'kvx store gc DIR', which copies the\n"
    "shard's good blocks into a new shard; for a shard file that cannot be\n"
    "opened or is not this store's 'kvx store reindex DIR', which rebuilds\n"
    "the index from the files and moves such a file to quarantine/; for an\n"
    "index that disagrees with the shards 'kvx store reindex DIR'. Moved\n"
    "files are kept, never deleted.\n"
    "\n"
    "Options:\n"
    "  -h, --help  show this help\n"
    "\n"
    "Exit status: 0 all good, 1 a problem was found, 2 usage error.\n",
    run_sverify,
};

static int reindex_attempt(void *ctx, const char *dir)
{
    return kvx_store_reindex_dir_report(dir, KVX_STORE_NOWAIT, ctx);
}

/* kvx store reindex --dry-run: the plan, one line a file, or JSON. */
static int reindex_dry_run(const cli_cmd *self, const char *dir, int json)
{
    kvx_store_plan *p = NULL;
    int rc = kvx_store_plan_reindex(&p, dir);
    if (rc) return cli_fail_code(self, rc, "cannot plan a reindex of '%s'", dir);
    kvx_recovery_report r;
    kvx_store_plan_summary(p, &r);
    size_t n = kvx_store_plan_steps(p);
    cli_json j;
    if (json) {
        cli_json_init(&j, stdout);
        cli_json_obj_begin(&j);
        cli_json_key(&j, "store");
        cli_json_str(&j, dir);
        cli_json_key(&j, "dry_run");
        cli_json_bool(&j, 1);
        cli_json_key(&j, "steps");
        cli_json_arr_begin(&j);
    } else {
        printf("plan for %s (dry run: nothing is changed; index/ is not read)\n", dir);
    }
    for (size_t i = 0; i < n; i++) {
        kvx_plan_step x;
        if (kvx_store_plan_step(p, i, &x)) break;
        if (!json) {
            char sz[32];
            printf("  %-10s %s/%s  %s", x.action, x.dir, x.name, cli_fmt_size(sz, sizeof sz, x.bytes));
            if (x.shard_byte >= 0) printf(", byte %" PRId64 ", %" PRIu64 " indexed", x.shard_byte, x.indexed);
            printf(": %s\n", x.reason);
            continue;
        }
        cli_json_obj_begin(&j);
        cli_json_key(&j, "action");
        cli_json_str(&j, x.action);
        cli_json_key(&j, "dir");
        cli_json_str(&j, x.dir);
        cli_json_key(&j, "name");
        cli_json_str(&j, x.name);
        cli_json_key(&j, "bytes");
        cli_json_u64(&j, x.bytes);
        cli_json_key(&j, "shard_byte");
        if (x.shard_byte >= 0) cli_json_i64(&j, x.shard_byte);
        else cli_json_null(&j);
        cli_json_key(&j, "indexed");
        cli_json_u64(&j, x.indexed);
        cli_json_key(&j, "reason");
        cli_json_str(&j, x.reason);
        cli_json_obj_end(&j);
    }
    uint64_t next_seq = kvx_store_plan_next_seq(p);
    kvx_store_plan_free(p);
    if (json) {
        cli_json_arr_end(&j);
        static const char *const keys[] = {"shards_kept", "blocks_indexed", "quarantined", "deleted_unacked",
                                           "deleted_dropped", "temporaries", "left_alone", "expired"};
        const uint64_t vals[] = {r.shards_kept,     r.blocks_indexed, r.quarantined, r.deleted_unacked,
                                 r.deleted_dropped, r.temporaries,    r.left_alone,  r.expired};
        cli_json_key(&j, "summary");
        cli_json_obj_begin(&j);
        for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++) {
            cli_json_key(&j, keys[i]);
            cli_json_u64(&j, vals[i]);
        }
        cli_json_obj_end(&j);
        cli_json_key(&j, "next_seq");
        cli_json_u64(&j, next_seq);
        cli_json_obj_end(&j);
        cli_json_finish(&j);
    } else {
        printf("would keep %" PRIu64 " shard(s) (%" PRIu64 " block(s) indexed), quarantine %" PRIu64
               ", delete %" PRIu64 " never acknowledged and %" PRIu64 " dropped, remove %" PRIu64
               " staging/ file(s), leave %" PRIu64 " alone, expire %" PRIu64 " from quarantine/; next sequence number %"
               PRIu64 "\n",
               r.shards_kept, r.blocks_indexed, r.quarantined, r.deleted_unacked, r.deleted_dropped, r.temporaries,
               r.left_alone, r.expired, next_seq);
    }
    return CLI_OK;
}

/* Reindex never opens the old index: it may be missing, empty, cut short
 * or damaged in any way (kvx_store_reindex_dir moves it aside unread and
 * builds a fresh one from shards/). */
static int run_reindex(const cli_cmd *self, int argc, char **argv)
{
    static const struct option opts[] = {
        WAIT_OPTIONS,
        {"dry-run", no_argument, NULL, 'n'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int ch, dry = 0, json = 0;
    double wait = -1;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, ":nh", opts, NULL)) != -1) {
        switch (ch) {
        case 'W':
        case 'N':
            if (parse_wait(self, ch, optarg, &wait) != CLI_OK) return CLI_USAGE;
            break;
        case 'n': dry = 1; break;
        case 'j': json = 1; break;
        case 'h': cli_print_help(self); return CLI_OK;
        default: return cli_getopt_error(self, ch, argv, opts);
        }
    }
    if (argc - optind != 1) return cli_usage(self, "expected one DIR");
    const char *dir = argv[optind];
    if (json && !dry) return cli_usage(self, "--json goes with --dry-run");
    if (dry) return reindex_dry_run(self, dir, json);
    kvx_recovery_report r;
    memset(&r, 0, sizeof r);
    if (as_writer(self, dir, wait, reindex_attempt, &r, 0) != CLI_OK) return CLI_FAIL;
    printf("reindexed %s: %" PRIu64 " block(s) in %" PRIu64 " shard(s); %" PRIu64
           " shard file(s) set aside in quarantine/, %" PRIu64 " never-acknowledged file(s) deleted, %" PRIu64
           " staging/ file(s) removed, %" PRIu64 " entr%s left alone, %" PRIu64 " expired from quarantine/\n",
           dir, r.blocks_indexed, r.shards_kept, r.quarantined, r.deleted_unacked + r.deleted_dropped, r.temporaries,
           r.left_alone, r.left_alone == 1 ? "y" : "ies", r.expired);
    if (r.quarantined) {
        fprintf(stderr,
                "kvx %s: %" PRIu64 " shard file(s) of '%s' could not be used and are now in %s/quarantine/ (kept, "
                "not served; each reason in <name>.why; 'kvx store reindex --dry-run' shows what a reindex decides "
                "before it acts)\n",
                self->name, r.quarantined, dir, dir);
        return CLI_FAIL;
    }
    return CLI_OK;
}

static const cli_cmd cmd_reindex = {
    "store reindex",
    "rebuild the index from the shards' own tables",
    "Usage: kvx store reindex DIR [--wait SECONDS | --no-wait]\n"
    "       kvx store reindex DIR --dry-run [--json]\n"
    "\n"
    "Rebuilds the LMDB index from the coordinate, hash and lineage tables of\n"
    "the sealed shards, so a lost or damaged index loses no data. The old\n"
    "index is never read: missing, empty, cut short, damaged, or a file where\n"
    "the directory belongs, it is moved aside and removed once the new one\n"
    "is built (put back if the rebuild fails). Shard files that cannot be\n"
    "used (damaged, foreign, a lost claim on a shard byte) move to\n"
    "quarantine/ with their reason; files of a commit that never answered\n"
    "are deleted (never acknowledged). It is a writer: while another process\n"
    "writes the store, it waits (saying once which pid holds the store)\n"
    "unless told otherwise.\n"
    "\n"
    "With --dry-run it prints the plan instead, one line a file (keep,\n"
    "quarantine, delete or leave, and why), and changes nothing: it takes no\n"
    "lock, so it works on a read-only mount and while a writer runs.\n"
    "Each line: the action (keep, quarantine: moved to quarantine/ with its\n"
    "reason; delete: never acknowledged, or the sound victim of a committed\n"
    "drop, or past quarantine/'s retention; leave: not kvx's to touch), the\n"
    "file, its size, for a kept shard its byte and the entries indexed, and\n"
    "why. For example, with one damaged shard and a stray file:\n"
    "\n"
    "  $ kvx store reindex --dry-run /data/kv\n"
    "  plan for /data/kv (dry run: nothing is changed; index/ is not read)\n"
    "    quarantine shards/0000000000000001.kvx  324 KiB: cannot be validated:\n"
    "      meta_crc32c 0x15b7ecba, header and tables give 0x85303fe5 (KVX_EMETACRC)\n"
    "    leave      shards/notes.txt  0 B: not a shard file name: left alone\n"
    "    keep       shards/0000000000000002.kvx  420 KiB, byte 1, 13 indexed: a\n"
    "      valid shard of this store (byte 1, 13 entries, newest commit 2)\n"
    "  would keep 1 shard(s) (13 block(s) indexed), quarantine 1, delete 0 never\n"
    "  acknowledged and 0 dropped, remove 0 staging/ file(s), leave 1 alone,\n"
    "  expire 0 from quarantine/; next sequence number 3\n"
    "\n"
    "(each step is one line; wrapped here). --json prints one object: store,\n"
    "dry_run, steps (each: action, dir, name, bytes, shard_byte or null,\n"
    "indexed, reason), summary (shards_kept, blocks_indexed, quarantined,\n"
    "deleted_unacked, deleted_dropped, temporaries, left_alone, expired) and\n"
    "next_seq.\n"
    "\n"
    "Options:\n"
    WAIT_HELP
    "  -n, --dry-run          print the plan, change nothing\n"
    "      --json             the plan as one JSON object (with --dry-run)\n"
    "  -h, --help             show this help\n"
    "\n"
    "Exit status: 0 success, 1 failure or a shard file set aside in\n"
    "quarantine/ (the result line counts it), or the store still held by\n"
    "another writer past --wait / at once with --no-wait; 2 usage error.\n",
    run_reindex,
};

static int run_gc(const cli_cmd *self, int argc, char **argv)
{
    int ch;
    double wait = -1;
    if (writer_opts(self, argc, argv, &wait, &ch)) return ch;
    if (argc - optind != 1) return cli_usage(self, "expected one DIR");
    const char *dir = argv[optind];
    kvx_store *s = NULL;
    if (open_writer(self, &s, dir, wait) != CLI_OK) return CLI_FAIL;
    kvx_store_stats a, b;
    kvx_recovery_report r;
    char note[1024] = "";
    int rc = kvx_store_stat(&a, s);
    if (rc == 0) rc = kvx_store_gc(s);
    if (rc == 0) snprintf(note, sizeof note, "%s", kvx_last_error()); /* what gc set aside */
    if (rc == 0) rc = kvx_store_recovery(s, &r);
    if (rc == 0) rc = kvx_store_stat(&b, s);
    kvx_store_close(s);
    if (rc != 0) return cli_fail_code(self, rc, "gc of '%s' failed", dir);
    char x[32], y[32];
    printf("gc %s: %" PRIu64 " -> %" PRIu64 " shard(s), %s -> %s, %" PRIu64
           " block(s) dropped (evicted, in a damaged shard, or their chain's head gone), %" PRIu64
           " compaction(s), %" PRIu64 " damaged shard file(s) set aside\n",
           dir, a.shards, b.shards, cli_fmt_size(x, sizeof x, a.bytes),
           cli_fmt_size(y, sizeof y, b.bytes), b.evicted_blocks - a.evicted_blocks,
           b.compactions - a.compactions, r.quarantined);
    /* gc did its job for every other shard: exit 0, and say what it set aside */
    if (note[0]) fprintf(stderr, "kvx %s: note: %s\n", self->name, note);
    return CLI_OK;
}

static const cli_cmd cmd_gc = {
    "store gc",
    "evict to capacity and compact mostly-dead or small shards",
    "Usage: kvx store gc DIR [--wait SECONDS | --no-wait]\n"
    "\n"
    "Evicts whole shards, least recently used first, until the store is under\n"
    "its capacity, and rewrites mostly-dead or small shards into new ones. It\n"
    "is a writer: while another process writes the store, it waits (saying\n"
    "once which pid holds the store) unless told otherwise.\n"
    "\n"
    "Options:\n"
    WAIT_HELP
    "  -h, --help             show this help\n"
    "\n"
    "Exit status: 0 success, 1 failure (or the store still held by another\n"
    "writer past --wait / at once with --no-wait), 2 usage error.\n",
    run_gc,
};

/* ---------------------------------------------------------- dispatch */

static const cli_cmd *const store_cmds[] = {&cmd_create, &cmd_put,     &cmd_get,     &cmd_prefix,     &cmd_stat,
                                            &cmd_sverify, &cmd_reindex, &cmd_gc, &cli_cmd_store_tier};
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
    "a persistent prefix cache: create, put, get, prefix, stat, verify, reindex, gc, tier",
    "Usage: kvx store COMMAND DIR [OPTIONS] [ARGS...]\n"
    "\n"
    "A store is a directory holding sealed KVX shards and an LMDB index by\n"
    "coordinate and by chained block hash. It survives restarts: blocks put\n"
    "and flushed are served again after the process (or machine) restarts.\n"
    "\n"
    "Commands:\n",
    run_store,
};
