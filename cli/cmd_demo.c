/*
 * cmd_demo.c - `kvx demo`: kvx doing its main job end to end, in under a
 * minute, with no arguments and no input files.
 *
 * It plays an inference engine serving a multi-turn chat workload: a few
 * system prompts shared by many conversations that grow turn by turn. For
 * each prompt the engine asks the store for the longest cached prefix,
 * "computes" the KV of the remaining full blocks, and puts them; each
 * round of turns is flushed (acknowledged). Then the store is closed and
 * opened again (a restart), the later turns are replayed, and the report
 * says how many blocks were served from the store instead of recomputed.
 * Finally the whole store is warmed up into host memory (or the GPU).
 *
 * A page's KV is a deterministic function of its block's chained hash
 * (and so of every token up to the block's end, like real KV), so every
 * page served from the store and every page the warmup delivers is
 * compared byte for byte with a fresh computation: the report says how
 * many matched. `--trace FILE` replays a Mooncake trace instead (one JSON
 * object per line with hash_ids of 512-token blocks; token ids are derived
 * from the hash ids), with a tiny geometry so it stays small on disk.
 */
#include "cli.h"
#include "trace.h"

#include <errno.h>
#include <dirent.h>
#include <ftw.h>
#include <getopt.h>
#include <inttypes.h>
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* -------------------------------------------------- deterministic KV */

static inline uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* The "KV" of the block named by hash: finite f16 values in [-1, 1]
 * (exponents 8..15), or arbitrary non-NaN bytes for 1-byte formats. */
static void make_page(uint8_t *page, uint64_t bytes, uint64_t hash, uint32_t quant)
{
    uint64_t words = bytes / 8, s = hash;
    for (uint64_t i = 0; i < words; i++) {
        uint64_t r = splitmix64(s + i), v = 0;
        if (quant == KVX_QUANT_FP16) {
            for (int k = 0; k < 4; k++) {
                uint64_t x = (r >> (16 * k)) & 0xFFFF;
                uint64_t e = 8 + ((x >> 10) & 7);
                v |= ((x & 0x83FF) | (e << 10)) << (16 * k);
            }
        } else {
            v = r & 0x3F3F3F3F3F3F3F3Full; /* small, never NaN in e4m3 or e5m2 */
        }
        memcpy(page + i * 8, &v, 8);
    }
    for (uint64_t i = words * 8; i < bytes; i++) page[i] = (uint8_t)(splitmix64(s ^ i) & 0x3F);
}

/* --------------------------------------------------------- the engine */

typedef struct demo {
    const cli_cmd *self;
    kvx_geometry g;
    uint64_t page_bytes;
    kvx_store *store;
    double wait; /* --wait SECONDS / --no-wait: < 0 forever, 0 not at all */
    char dir[4096];
    /* scratch */
    uint8_t *pages;
    size_t pages_cap; /* in pages */
    uint8_t *expect;
    uint64_t *hashes;
    size_t hashes_cap;
    kvx_view *views;
    /* counters of the current phase */
    uint64_t prompts, full_blocks, served;
    /* totals */
    uint64_t blocks_written, verified, mismatched;
    int failed;
} demo;

typedef struct phase_stats {
    uint64_t prompts, full_blocks, served;
} phase_stats;

static int grow(demo *d, size_t nfull)
{
    if (nfull <= d->pages_cap) return 0;
    size_t cap = nfull * 2;
    uint8_t *p = realloc(d->pages, cap * d->page_bytes);
    if (!p) return -ENOMEM;
    d->pages = p;
    uint64_t *h = realloc(d->hashes, cap * sizeof *h);
    if (!h) return -ENOMEM;
    d->hashes = h;
    kvx_view *v = realloc(d->views, cap * sizeof *v);
    if (!v) return -ENOMEM;
    d->views = v;
    d->pages_cap = cap;
    return 0;
}

/* One prompt: look up the cached prefix, check the served bytes, compute
 * the rest, put every full block (the store skips what it holds). */
static int serve_prompt(demo *d, const uint32_t *toks, size_t n)
{
    uint32_t B = d->g.block_tokens;
    size_t nfull = n / B;
    d->prompts++;
    if (nfull == 0) return 0;
    int rc = grow(d, nfull);
    if (rc != 0) return cli_fail_code(d->self, rc, "out of memory");
    kvx_block_hashes(d->hashes, toks, n, B);
    size_t got = 0;
    rc = kvx_store_prefix(d->views, &got, d->store, toks, n, nfull);
    if (rc != 0) return cli_fail_code(d->self, rc, "prefix lookup failed");
    d->full_blocks += nfull;
    d->served += got;
    for (size_t i = 0; i < got; i++) {
        make_page(d->expect, d->page_bytes, d->hashes[i], d->g.quant);
        if (d->views[i].page_bytes == d->page_bytes && d->views[i].hash == d->hashes[i] &&
            memcmp(d->views[i].page, d->expect, d->page_bytes) == 0)
            d->verified++;
        else
            d->mismatched++;
        memcpy(d->pages + i * d->page_bytes, d->views[i].page, d->page_bytes);
    }
    kvx_views_release(d->views, got);
    for (size_t i = got; i < nfull; i++)
        make_page(d->pages + i * d->page_bytes, d->page_bytes, d->hashes[i], d->g.quant);
    size_t fresh = 0;
    rc = kvx_store_put(d->store, toks, n, d->pages, nfull, NULL, &fresh);
    if (rc != 0) return cli_fail_code(d->self, rc, "put failed");
    d->blocks_written += fresh;
    return 0;
}

/* Opens the store as its writer: 0, a kvx code not reported yet, or
 * CLI_FAIL after a message. Another writer holding it is waited for as
 * 'kvx store put' does: saying once which pid holds it, at most --wait
 * seconds, not at all with --no-wait. */
static int open_store(demo *d)
{
    int rc = kvx_store_open(&d->store, d->dir, &d->g, KVX_STORE_NOWAIT);
    if (rc != KVX_EBUSY) return rc;
    return cli_store_open_writer_g(d->self, &d->store, d->dir, &d->g, d->wait) == CLI_OK ? 0 : CLI_FAIL;
}

/* The restart's open, after the demo's own close. */
static int reopen(demo *d)
{
    int rc = open_store(d);
    if (rc < 0) cli_fail_code(d->self, rc, "cannot reopen the store after the restart");
    return rc ? CLI_FAIL : 0;
}

static int flush(demo *d)
{
    int rc = kvx_store_flush(d->store);
    if (rc != 0) return cli_fail_code(d->self, rc, "flush failed");
    return 0;
}

static phase_stats take_phase(demo *d)
{
    phase_stats p = {d->prompts, d->full_blocks, d->served};
    d->prompts = d->full_blocks = d->served = 0;
    return p;
}

/* ------------------------------------------------- built-in workload */

typedef struct chat {
    uint32_t *toks;
    size_t n, cap;
} chat;

static int chat_append(chat *c, uint64_t seed, size_t len)
{
    if (c->n + len > c->cap) {
        size_t cap = (c->n + len) * 2;
        uint32_t *t = realloc(c->toks, cap * sizeof *t);
        if (!t) return -ENOMEM;
        c->toks = t;
        c->cap = cap;
    }
    for (size_t i = 0; i < len; i++) c->toks[c->n++] = (uint32_t)(splitmix64(seed * 1000003u + i) % 32000u);
    return 0;
}

#define DEMO_SYSTEM_PROMPTS 3

/* Turn t of conversation c: user message, then the assistant's reply. */
static size_t user_len(uint32_t c, uint32_t t) { return 24 + splitmix64(c * 7919u + t * 104729u) % 64; }
static size_t reply_len(uint32_t c, uint32_t t) { return 32 + splitmix64(c * 15485863u + t * 7u + 1) % 96; }

static int run_builtin(demo *d, uint32_t convs, uint32_t turns, uint32_t restart_turn,
                       int want_bar, phase_stats *before, phase_stats *after)
{
    chat *cs = calloc(convs, sizeof *cs);
    if (!cs) return cli_fail(d->self, "out of memory");
    int rc = 0;
    for (uint32_t c = 0; c < convs && !rc; c++) {
        uint32_t sp = c % DEMO_SYSTEM_PROMPTS;
        /* System prompts of 96, 166 and 236 tokens, shared by every third
         * conversation. */
        rc = chat_append(&cs[c], 0x5157u + sp, 96 + 70 * sp);
    }
    cli_progress bar = {0};
    for (uint32_t t = 0; t < turns && !rc; t++) {
        if (t == 0) cli_progress_begin(&bar, "persist", (uint64_t)convs * restart_turn, 0, want_bar);
        if (t == restart_turn) {
            cli_progress_end(&bar);
            *before = take_phase(d);
            /* The restart: every acknowledged block must come back. */
            kvx_store_close(d->store);
            d->store = NULL;
            rc = reopen(d);
            if (rc != 0) break;
            cli_progress_begin(&bar, "replay", (uint64_t)convs * (turns - restart_turn), 0, want_bar);
        }
        for (uint32_t c = 0; c < convs && !rc; c++) {
            rc = chat_append(&cs[c], ((uint64_t)c << 32) | (t * 2u), user_len(c, t));
            if (!rc) rc = serve_prompt(d, cs[c].toks, cs[c].n);
            if (!rc) rc = chat_append(&cs[c], ((uint64_t)c << 32) | (t * 2u + 1), reply_len(c, t));
            uint64_t done = t < restart_turn ? (uint64_t)t * convs + c + 1
                                             : (uint64_t)(t - restart_turn) * convs + c + 1;
            cli_progress_update(&bar, done);
        }
        if (!rc) rc = flush(d); /* one acknowledgement per round of turns */
    }
    cli_progress_end(&bar);
    if (!rc) *after = take_phase(d);
    for (uint32_t c = 0; c < convs; c++) free(cs[c].toks);
    free(cs);
    return rc ? CLI_FAIL : 0;
}

/* ----------------------------------------------------- trace workload */

/* Each request is acknowledged (flushed) before the next arrives, as an
 * engine would; the store's compaction keeps the shard count bounded. */
#define FLUSH_EVERY 1

/* A trace line holds one request: a few KiB for the longest prompts of a
 * real trace (a 128K-token prompt has 250 hash ids). A longer line is
 * refused before it is parsed, so no line (an endless stream without a
 * newline) grows memory, and one request's pages and tokens stay bounded. */
#define TRACE_LINE_CAP ((size_t)64 << 10)

/* Lines of at most TRACE_LINE_CAP bytes, read from fd into one buffer;
 * all of them together at most limit bytes. */
typedef struct line_reader {
    int fd;
    char *buf;         /* TRACE_LINE_CAP + 1 bytes */
    size_t start, end; /* unread bytes: buf[start, end) */
    uint64_t total;    /* bytes read */
    uint64_t limit;    /* cli_text_cap() */
    int eof;
} line_reader;

/* The next line, without its newline and NUL-terminated in place: 1; 0 at
 * the end of input; -1 a line longer than TRACE_LINE_CAP; -2 the input is
 * longer than the limit; -3 a read error (errno). */
static int next_line(line_reader *lr, char **line, size_t *len)
{
    for (;;) {
        char *p = lr->buf + lr->start;
        size_t have = lr->end - lr->start;
        char *nl = memchr(p, '\n', have);
        if (nl || (lr->eof && have)) {
            size_t n = nl ? (size_t)(nl - p) : have;
            p[n] = '\0';
            *line = p;
            *len = n;
            lr->start += nl ? n + 1 : n;
            return 1;
        }
        if (lr->eof) return 0;
        if (have >= TRACE_LINE_CAP) return -1;
        if (lr->start) {
            memmove(lr->buf, p, have);
            lr->start = 0;
            lr->end = have;
        }
        /* at most one byte past the limit: exactly the limit is taken */
        size_t want = TRACE_LINE_CAP - lr->end;
        if (want > lr->limit + 1 - lr->total) want = (size_t)(lr->limit + 1 - lr->total);
        ssize_t r = read(lr->fd, lr->buf + lr->end, want);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -3;
        if (r == 0) lr->eof = 1;
        lr->end += (size_t)r;
        lr->total += (uint64_t)r;
        if (lr->total > lr->limit) return -2;
    }
}

static int run_trace(demo *d, const char *path, uint64_t max_requests, int want_bar,
                     phase_stats *before, phase_stats *after)
{
    /* A request larger than the store could never be held whole: refused
     * at its line, before its pages or tokens are made. */
    kvx_store_stats ss;
    int src = kvx_store_stat(&ss, d->store);
    if (src != 0) return cli_fail_code(d->self, src, "cannot read the store's capacity");
    line_reader lr = {-1, NULL, 0, 0, 0, cli_text_cap(), 0};
    if (cli_open_input(d->self, path, &lr.fd) != CLI_OK) return CLI_FAIL;
    const char *name = strcmp(path, "-") ? path : "standard input";
    /* Read the requests first, so the restart falls at the middle. */
    trace_req *reqs = NULL;
    size_t n = 0, cap = 0, lineno = 0;
    char *line = NULL;
    size_t len = 0;
    int rc = 0, got = 0;
    json_tokener *tok = json_tokener_new();
    lr.buf = malloc(TRACE_LINE_CAP + 1);
    if (!tok || !lr.buf) rc = cli_fail(d->self, "out of memory");
    else json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    while (!rc && (max_requests == 0 || n < max_requests) && (got = next_line(&lr, &line, &len)) != 0) {
        lineno++;
        if (got < 0) {
            char a[32];
            if (got == -1)
                rc = cli_fail(d->self, "%s:%zu: the line is longer than %s: a trace line holds one "
                              "request (a JSON object)", name, lineno, cli_fmt_size(a, sizeof a, TRACE_LINE_CAP));
            else if (got == -2)
                rc = cli_fail(d->self, "'%s' holds more than %s of trace (the input limit)", name,
                              cli_fmt_size(a, sizeof a, lr.limit));
            else
                rc = cli_fail(d->self, "cannot read '%s': %s", name, strerror(errno));
            break;
        }
        if (cli_trace_blank_line(line)) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            trace_req *nr = realloc(reqs, cap * sizeof *nr);
            if (!nr) {
                rc = cli_fail(d->self, "out of memory");
                break;
            }
            reqs = nr;
        }
        const char *why = "";
        if (cli_trace_parse_line(&reqs[n], tok, line, len, &why) != 0) {
            enum json_tokener_error je = json_tokener_get_error(tok);
            rc = cli_fail(d->self, "%s:%zu: not a Mooncake trace line (%s%s%s; needs \"input_length\" and "
                          "\"hash_ids\": [...])", name, lineno, why,
                          strcmp(why, "not JSON") ? "" : ": ",
                          strcmp(why, "not JSON") ? "" : json_tokener_error_desc(je));
            break;
        }
        trace_req *r = &reqs[n++];
        uint64_t blocks = r->input_length / d->g.block_tokens;
        if (blocks > r->n_ids) blocks = r->n_ids;
        if (blocks > ss.capacity_bytes / d->page_bytes) {
            char a[32], b[32];
            rc = cli_fail(d->self, "%s:%zu: the request's %" PRIu64 " blocks (%s) are more than the "
                          "store's capacity (%s)", name, lineno, blocks,
                          cli_fmt_size(a, sizeof a, blocks * d->page_bytes),
                          cli_fmt_size(b, sizeof b, ss.capacity_bytes));
            break;
        }
    }
    if (tok) json_tokener_free(tok);
    free(lr.buf);
    cli_close_input(lr.fd);
    if (!rc && n == 0) rc = cli_fail(d->self, "the trace '%s' holds no requests", name);
    uint32_t B = d->g.block_tokens;
    uint32_t *toks = NULL;
    size_t tcap = 0;
    cli_progress bar = {0};
    size_t half = n / 2;
    if (!rc) cli_progress_begin(&bar, "persist", half, 0, want_bar);
    for (size_t i = 0; i < n && !rc; i++) {
        if (i == half) {
            cli_progress_end(&bar);
            rc = flush(d);
            if (rc) break;
            *before = take_phase(d);
            kvx_store_close(d->store);
            d->store = NULL;
            rc = reopen(d);
            if (rc != 0) break;
            cli_progress_begin(&bar, "replay", n - half, 0, want_bar);
        }
        trace_req *r = &reqs[i];
        size_t nt = (size_t)r->n_ids * B;
        if (r->input_length < nt) nt = (size_t)r->input_length;
        if (nt > tcap) {
            tcap = nt * 2;
            uint32_t *t = realloc(toks, tcap * sizeof *t);
            if (!t) {
                rc = cli_fail(d->self, "out of memory");
                break;
            }
            toks = t;
        }
        /* Token ids from hash ids: equal ids (equal prefixes) give equal
         * tokens, so the chained hashes reproduce the trace's sharing. */
        for (size_t k = 0; k < nt; k++)
            toks[k] = (uint32_t)(splitmix64(r->ids[k / B] * 0x100000001B3ull + k % B) % 32000u);
        rc = serve_prompt(d, toks, nt);
        if (!rc && (i + 1) % FLUSH_EVERY == 0) rc = flush(d);
        cli_progress_update(&bar, i < half ? i + 1 : i + 1 - half);
    }
    if (!rc) rc = flush(d);
    if (n) cli_progress_end(&bar);
    if (!rc) *after = take_phase(d);
    for (size_t i = 0; i < n; i++) free(reqs[i].ids);
    free(reqs);
    free(toks);
    return rc ? CLI_FAIL : 0;
}

/* ------------------------------------------------------------ warmup */

typedef struct warm_result {
    int ran;
    uint64_t bytes, pages, crc_failures, io_failures, verified, mismatched;
    double seconds, gbps;
    int io_mode, direct;
    const char *sink;
} warm_result;

static void demo_warm_progress(void *ctx, const kvx_warmup_progress *p)
{
    cli_progress *bar = ctx;
    bar->total = p->bytes_total;
    cli_progress_update(bar, p->bytes_done);
}

/* Checks one delivered page against a fresh computation. */
static void check_page(demo *d, warm_result *w, const kvx_entry *e, const void *got)
{
    if (e->bytes != d->page_bytes || e->hash == 0) {
        w->mismatched++;
        return;
    }
    make_page(d->expect, d->page_bytes, e->hash, d->g.quant);
    if (memcmp(got, d->expect, d->page_bytes) == 0)
        w->verified++;
    else
        w->mismatched++;
}

static int warm_store(demo *d, int gpu, int want_bar, warm_result *w)
{
    kvx_shard **shards = NULL;
    size_t n = 0;
    int rc = kvx_store_shards(&shards, &n, d->store);
    if (rc != 0) return cli_fail_code(d->self, rc, "cannot list the store's shards");
    uint64_t sink_bytes = 0, pages = 0;
    for (size_t i = 0; i < n; i++) pages += kvx_shard_get_info(shards[i])->num_blocks;
    rc = kvx_warmup_sink_bytes(&sink_bytes, shards, n);
    uint8_t *host = NULL, *back = NULL;
    kvx_gpu *g = NULL;
    kvx_warmup *wu = NULL;
    kvx_warmup_report rep;
    memset(&rep, 0, sizeof rep);
    int ret = CLI_FAIL;
    if (rc != 0) {
        cli_fail_code(d->self, rc, "cannot size the warmup");
        goto out;
    }
    kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
    cli_progress bar = {0};
    if (!gpu) {
        host = malloc(sink_bytes ? sink_bytes : 1);
        if (!host) {
            cli_fail(d->self, "out of memory for the host sink");
            goto out;
        }
        o.sink = KVX_SINK_HOST;
        o.host_buf = host;
        o.host_buf_bytes = sink_bytes;
        o.progress = demo_warm_progress;
        o.progress_ctx = &bar;
        cli_progress_begin(&bar, "warmup", sink_bytes, 1, want_bar);
        rc = kvx_warmup_run(&rep, shards, n, &o);
        cli_progress_end(&bar);
        w->sink = "host";
    } else {
        kvx_gpu_options go = KVX_GPU_OPTIONS_INIT;
        go.arena_bytes = sink_bytes + 8 * pages + 4096;
        rc = kvx_gpu_create(&g, &go);
        if (rc != 0) {
            cli_fail_code(d->self, rc, "cannot use the GPU (--gpu)");
            goto out;
        }
        o.sink = KVX_SINK_GPU;
        o.gpu = g;
        rc = kvx_warmup_start(&wu, shards, n, &o);
        if (rc == 0) rc = kvx_warmup_wait(&rep, wu, -1);
        w->sink = "gpu";
    }
    if (rc != 0) {
        cli_fail_code(d->self, rc, "warmup failed");
        goto out;
    }
    /* Every delivered page is compared with a fresh computation. */
    const uint64_t *dev = NULL;
    size_t ndev = 0;
    if (gpu) {
        rc = kvx_warmup_device_pages(&dev, &ndev, wu);
        back = malloc(d->page_bytes);
        if (rc != 0 || !back) {
            cli_fail_code(d->self, rc ? rc : -ENOMEM, "cannot read the GPU page table");
            goto out;
        }
    }
    uint64_t off = 0, idx = 0;
    for (size_t i = 0; i < n; i++) {
        const kvx_shard_info *in = kvx_shard_get_info(shards[i]);
        for (uint32_t k = 0; k < in->num_blocks; k++) {
            kvx_entry e;
            int tomb = 0;
            if (kvx_shard_entry_commit(shards[i], k, NULL, &tomb) == 0 && tomb)
                continue; /* no page, no place in the sink (kvx.h, Bulk warmup) */
            uint64_t here = idx++;
            if (kvx_shard_entry(&e, shards[i], k) != 0) {
                w->mismatched++;
                continue;
            }
            if (gpu) {
                if (here < ndev && dev[here] &&
                    kvx_gpu_copy_back(back, g, dev[here], e.bytes <= d->page_bytes ? e.bytes : 0) == 0)
                    check_page(d, w, &e, back);
                else
                    w->mismatched++;
            } else {
                check_page(d, w, &e, host + off);
            }
            off += ((uint64_t)e.bytes + 255) / 256 * 256;
        }
    }
    w->ran = 1;
    w->bytes = rep.bytes;
    w->pages = rep.pages;
    w->crc_failures = rep.crc_failures;
    w->io_failures = rep.io_failures;
    w->seconds = rep.seconds;
    w->gbps = rep.gbps;
    w->io_mode = rep.io_mode;
    w->direct = rep.direct;
    ret = 0;
out:
    kvx_warmup_report_free(&rep);
    kvx_warmup_destroy(wu);
    kvx_gpu_destroy(g);
    free(host);
    free(back);
    for (size_t i = 0; i < n; i++) kvx_shard_close(shards[i]);
    kvx_free(shards);
    return ret;
}

/* -------------------------------------------------------------- main */

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static int dir_is_empty(const char *dir)
{
    int empty = 1;
    DIR *dp = opendir(dir);
    if (!dp) return 0;
    struct dirent *de;
    while ((de = readdir(dp)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) empty = 0;
    closedir(dp);
    return empty;
}

static int run_demo(const cli_cmd *self, int argc, char **argv)
{
    static const struct option opts[] = {
        {"dir", required_argument, NULL, 'd'},
        {"trace", required_argument, NULL, 't'},
        {"gpu", no_argument, NULL, 'g'},
        {"json", no_argument, NULL, 'j'},
        {"conversations", required_argument, NULL, 'c'},
        {"turns", required_argument, NULL, 'T'},
        {"requests", required_argument, NULL, 'r'},
        {"wait", required_argument, NULL, 'W'},
        {"no-wait", no_argument, NULL, 'N'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *dir = NULL, *trace = NULL;
    int gpu = 0, json = 0, ch;
    uint64_t convs = 48, turns = 6, requests = 1000;
    double wait = -1;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, ":d:t:gjc:T:r:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'd': dir = optarg; break;
        case 't': trace = optarg; break;
        case 'g': gpu = 1; break;
        case 'j': json = 1; break;
        case 'c':
            if (cli_parse_u64(optarg, 100000, &convs) != 0 || convs == 0)
                return cli_usage(self, "--conversations must be from 1 to 100000, not '%s'", optarg);
            break;
        case 'T':
            if (cli_parse_u64(optarg, 1000, &turns) != 0 || turns < 2)
                return cli_usage(self, "--turns must be from 2 to 1000, not '%s'", optarg);
            break;
        case 'r':
            if (cli_parse_u64(optarg, UINT32_MAX, &requests) != 0)
                return cli_usage(self, "--requests must be a count (0 = all), not '%s'", optarg);
            break;
        case 'W':
        case 'N':
            if (cli_store_parse_wait(self, ch, optarg, &wait) != CLI_OK) return CLI_USAGE;
            break;
        case 'h': cli_print_help(self); return CLI_OK;
        default: return cli_getopt_error(self, ch, argv, opts);
        }
    }
    if (optind < argc) return cli_usage(self, "unexpected argument '%s'", argv[optind]);

    if (gpu) {
        /* Say so now, not after the whole workload has run. */
        int ngpu = 0;
        int grc = kvx_gpu_count(&ngpu);
        if (grc != 0) return cli_fail_code(self, grc, "the GPU (--gpu) cannot be used");
        if (ngpu == 0) {
            cli_fail(self, "the GPU (--gpu): no usable GPU was found");
            fprintf(stderr, "  hint: run without --gpu to warm up into host memory\n");
            return CLI_FAIL;
        }
    }
    demo d;
    memset(&d, 0, sizeof d);
    d.self = self;
    d.wait = wait;
    /* A small model: L=4, Hkv=2, D=64, B=16, fp16 (32 KiB per block). The
     * trace's blocks are 512 tokens, so its model is tinier still (8 KiB). */
    kvx_geometry g = {4, 2, 64, 16, KVX_QUANT_FP16, 0x6b76782d64656d6full};
    if (trace) g = (kvx_geometry){1, 1, 4, 512, KVX_QUANT_FP16, 0x6b76782d74726163ull};
    d.g = g;
    d.page_bytes = kvx_page_bytes(&g, g.block_tokens);
    d.expect = malloc(d.page_bytes);
    if (!d.expect) return cli_fail(self, "out of memory");

    /* Where the store lives: --dir (kept), or a fresh temp dir (removed). */
    char tmpdir[4096] = "";
    int created = 0;
    if (dir) {
        snprintf(d.dir, sizeof d.dir, "%s", dir);
    } else {
        const char *t = getenv("TMPDIR");
        snprintf(tmpdir, sizeof tmpdir, "%s/kvx-demo-XXXXXX", t && *t ? t : "/tmp");
        if (!mkdtemp(tmpdir)) {
            free(d.expect);
            return cli_fail(self, "cannot make a temporary directory in %s: %s (set TMPDIR or use --dir)",
                            t && *t ? t : "/tmp", strerror(errno));
        }
        if ((size_t)snprintf(d.dir, sizeof d.dir, "%s/store", tmpdir) >= sizeof d.dir) {
            rmdir(tmpdir);
            free(d.expect);
            return cli_fail(self, "the temporary directory's path %s is too long", tmpdir);
        }
    }
    struct stat st;
    int rc;
    if (stat(d.dir, &st) == 0 && S_ISDIR(st.st_mode) && !dir_is_empty(d.dir)) {
        rc = open_store(&d);
        if (rc == CLI_FAIL) goto fail;
        if (rc != 0) {
            cli_fail_code(self, rc, "'%s' is not a store this demo can use", d.dir);
            fprintf(stderr, "  hint: give --dir a new or empty directory, or one a previous "
                            "'kvx demo%s' made\n", trace ? " --trace" : "");
            goto fail;
        }
    } else {
        if (stat(d.dir, &st) == 0 && S_ISDIR(st.st_mode)) rmdir(d.dir); /* empty: create anew */
        kvx_store_options so = KVX_STORE_OPTIONS_INIT;
        so.geometry = g;
        so.capacity_bytes = 4ull << 30;
        rc = kvx_store_create(&d.store, d.dir, &so);
        if (rc != 0) {
            cli_fail_code(self, rc, "cannot create a store in '%s'", d.dir);
            goto fail;
        }
        created = 1;
    }

    double t0 = cli_now();
    phase_stats before = {0, 0, 0}, after = {0, 0, 0};
    if (!json)
        printf("kvx demo: %s, model L=%u Hkv=%u D=%u B=%u fp16 (%" PRIu64 " KiB per block), store %s%s\n",
               trace ? "replaying a Mooncake trace" : "a multi-turn chat workload", g.num_layers,
               g.kv_heads, g.head_dim, g.block_tokens, d.page_bytes / 1024, d.dir,
               created ? "" : " (reused)");
    fflush(stdout);
    if (trace)
        rc = run_trace(&d, trace, requests, !json, &before, &after);
    else
        rc = run_builtin(&d, (uint32_t)convs, (uint32_t)turns, (uint32_t)(turns / 2), !json, &before,
                         &after);
    if (rc != 0) goto fail;

    kvx_store_stats ss;
    rc = kvx_store_stat(&ss, d.store);
    if (rc != 0) {
        cli_fail_code(self, rc, "cannot read the store's statistics");
        goto fail;
    }
    warm_result w;
    memset(&w, 0, sizeof w);
    if (warm_store(&d, gpu, !json, &w) != 0) goto fail;
    double secs = cli_now() - t0;

    double ratio = after.full_blocks ? (double)after.served / (double)after.full_blocks : 0.0;
    uint64_t bytes_written = d.blocks_written * d.page_bytes;
    int bad = d.mismatched || w.mismatched || w.crc_failures || w.io_failures;
    if (json) {
        cli_json j;
        cli_json_init(&j, stdout);
        cli_json_obj_begin(&j);
        cli_json_key(&j, "workload");
        cli_json_str(&j, trace ? "trace" : "built-in");
        cli_json_key(&j, "dir");
        cli_json_str(&j, d.dir);
        cli_json_key(&j, "store_kept");
        cli_json_bool(&j, dir != NULL);
        cli_json_key(&j, "reused_store");
        cli_json_bool(&j, !created);
        cli_json_key(&j, "block_tokens");
        cli_json_u64(&j, g.block_tokens);
        cli_json_key(&j, "page_bytes");
        cli_json_u64(&j, d.page_bytes);
        cli_json_key(&j, "prompts");
        cli_json_u64(&j, before.prompts + after.prompts);
        cli_json_key(&j, "blocks_written");
        cli_json_u64(&j, d.blocks_written);
        cli_json_key(&j, "bytes_written");
        cli_json_u64(&j, bytes_written);
        cli_json_key(&j, "blocks_served_before_restart");
        cli_json_u64(&j, before.served);
        cli_json_key(&j, "restart_prompts");
        cli_json_u64(&j, after.prompts);
        cli_json_key(&j, "restart_full_blocks");
        cli_json_u64(&j, after.full_blocks);
        cli_json_key(&j, "blocks_served");
        cli_json_u64(&j, after.served);
        cli_json_key(&j, "blocks_recomputed");
        cli_json_u64(&j, after.full_blocks - after.served);
        cli_json_key(&j, "restart_prefix_hit_ratio");
        cli_json_double(&j, ratio);
        cli_json_key(&j, "pages_verified");
        cli_json_u64(&j, d.verified);
        cli_json_key(&j, "page_mismatches");
        cli_json_u64(&j, d.mismatched);
        cli_json_key(&j, "store_blocks");
        cli_json_u64(&j, ss.blocks);
        cli_json_key(&j, "store_bytes");
        cli_json_u64(&j, ss.bytes);
        cli_json_key(&j, "store_shards");
        cli_json_u64(&j, ss.shards);
        cli_json_key(&j, "warmup_sink");
        cli_json_str(&j, w.sink);
        cli_json_key(&j, "warmup_bytes");
        cli_json_u64(&j, w.bytes);
        cli_json_key(&j, "warmup_pages");
        cli_json_u64(&j, w.pages);
        cli_json_key(&j, "warmup_seconds");
        cli_json_double(&j, w.seconds);
        cli_json_key(&j, "warmup_gbps");
        cli_json_double(&j, w.gbps);
        cli_json_key(&j, "warmup_io");
        cli_json_str(&j, kvx_io_mode_name(w.io_mode));
        cli_json_key(&j, "warmup_crc_failures");
        cli_json_u64(&j, w.crc_failures);
        cli_json_key(&j, "warmup_pages_verified");
        cli_json_u64(&j, w.verified);
        cli_json_key(&j, "warmup_page_mismatches");
        cli_json_u64(&j, w.mismatched);
        cli_json_key(&j, "seconds");
        cli_json_double(&j, secs);
        cli_json_key(&j, "ok");
        cli_json_bool(&j, !bad);
        cli_json_obj_end(&j);
        cli_json_finish(&j);
    } else {
        char a[32], b[32], r[32];
        printf("\nbefore the restart: %" PRIu64 " prompts, %" PRIu64 " full blocks, %" PRIu64
               " served from the store\n",
               before.prompts, before.full_blocks, before.served);
        printf("written:            %" PRIu64 " blocks, %s, durable at each flush\n",
               d.blocks_written, cli_fmt_size(a, sizeof a, bytes_written));
        printf("restart:            store closed and opened again\n");
        printf("after the restart:  %" PRIu64 " prompts, %" PRIu64 " full blocks: %" PRIu64
               " served from the store, %" PRIu64 " recomputed\n",
               after.prompts, after.full_blocks, after.served, after.full_blocks - after.served);
        printf("prefix hit ratio:   %.1f%% after the restart\n", 100.0 * ratio);
        printf("served pages:       %" PRIu64 " checked byte for byte against recomputed KV, %" PRIu64
               " mismatched\n",
               d.verified, d.mismatched);
        printf("store:              %" PRIu64 " blocks in %" PRIu64 " shard(s), %s\n", ss.blocks,
               ss.shards, cli_fmt_size(b, sizeof b, ss.bytes));
        char label[32];
        snprintf(label, sizeof label, "warmup (%s):", w.sink);
        printf("%-20s%" PRIu64 " pages, %s in %.3f s: %s via %s%s; %" PRIu64
               " pages checked, %" PRIu64 " bad\n",
               label, w.pages, cli_fmt_size(a, sizeof a, w.bytes), w.seconds,
               cli_fmt_rate(r, sizeof r, w.gbps * 1e9), kvx_io_mode_name(w.io_mode),
               w.direct ? " (O_DIRECT)" : "", w.verified,
               w.mismatched + w.crc_failures + w.io_failures);
        printf("total:              %.1f s%s\n", secs,
               dir ? "" : " (the store was in a temporary directory and is removed; --dir keeps it)");
    }
    kvx_store_close(d.store);
    d.store = NULL;
    rc = bad ? cli_fail(self, "some pages came back wrong (see above)") : CLI_OK;
    goto done;
fail:
    rc = CLI_FAIL;
done:
    kvx_store_close(d.store);
    if (tmpdir[0]) nftw(tmpdir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    free(d.pages);
    free(d.hashes);
    free(d.views);
    free(d.expect);
    return rc;
}

const cli_cmd cli_cmd_demo = {
    "demo",
    "see kvx do its job end to end: persist, restart, serve prefixes, warm up",
    "Usage: kvx demo [--dir DIR] [--trace FILE [--requests N]]\n"
    "                [--conversations N] [--turns N] [--gpu] [--json]\n"
    "                [--wait SECONDS | --no-wait]\n"
    "\n"
    "Plays an inference engine serving a multi-turn chat workload (a few\n"
    "system prompts shared by many growing conversations) on a small model\n"
    "(L=4, Hkv=2, D=64, B=16, fp16). Each prompt's longest cached prefix is\n"
    "looked up, the rest of its KV blocks are computed and put in a store,\n"
    "and each round of turns is flushed. Then the store is closed and opened\n"
    "again (a restart), the later turns are replayed and the report says how\n"
    "many blocks were served from the store instead of recomputed. Last, the\n"
    "whole store is warmed up into host memory (the GPU with --gpu) and the\n"
    "rate is reported. A block's KV is a deterministic function of its\n"
    "tokens, so every page served or warmed up is checked byte for byte.\n"
    "\n"
    "Options:\n"
    "  -d, --dir DIR           keep the store in DIR (created if new; a store\n"
    "                          from an earlier demo run is reused). Default: a\n"
    "                          temporary directory, removed at the end\n"
    "  -t, --trace FILE        replay a Mooncake trace (JSON lines with\n"
    "                          input_length and hash_ids of 512-token blocks;\n"
    "                          token ids derived from the hash ids) instead,\n"
    "                          on a model of L=1, Hkv=1, D=4, B=512. FILE is a\n"
    "                          file, a FIFO or '-' (standard input), anything\n"
    "                          else is refused by type; a line longer than\n"
    "                          64 KiB, a trace over 1 GiB and a request with\n"
    "                          more blocks than the store's capacity are\n"
    "                          refused, naming FILE:LINE\n"
    "  -r, --requests N        trace requests to replay (default 1000; 0 = all);\n"
    "                          the restart falls at the middle\n"
    "  -c, --conversations N   conversations of the built-in workload (default 48)\n"
    "  -T, --turns N           turns per conversation (default 6); the restart\n"
    "                          falls at the middle\n"
    "  -g, --gpu               warm up into GPU memory instead of host memory\n"
    "      --wait SECONDS      give up (exit 1) when another writer still holds\n"
    "                          the --dir store after SECONDS (default: wait as\n"
    "                          long as it takes, saying once which pid holds it)\n"
    "      --no-wait           fail at once (exit 1) when another writer holds it\n"
    "  -j, --json              one JSON object: blocks_written, bytes_written,\n"
    "                          restart_prefix_hit_ratio, blocks_served,\n"
    "                          blocks_recomputed, warmup_gbps, pages_verified,\n"
    "                          page_mismatches, ... (no progress bars)\n"
    "  -h, --help              show this help\n"
    "\n"
    "Exit status: 0 success, 1 failure or a page that came back wrong, 2 usage\n"
    "error.\n",
    run_demo,
};
