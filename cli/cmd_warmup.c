/*
 * cmd_warmup.c - `kvx warmup`: load whole shards, or every shard of a
 * store, into host memory or the GPU at disk speed, checking every page's
 * CRC on the way, and report bytes, pages, failures and GB/s.
 *
 * The library does the work (kvx_warmup_run: io_uring or pread into
 * pinned staging buffers, double-buffered into the sink); this file picks
 * the sink, draws the progress bar from the library's progress callback
 * (only on a terminal, never with --json) and names each failed page. It
 * opens the inputs itself, so that every one that does not open is named
 * (a store's registered shards included) while the rest is warmed up.
 */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void warm_progress(void *ctx, const kvx_warmup_progress *p)
{
    cli_progress *bar = ctx;
    bar->total = p->bytes_total;
    cli_progress_update(bar, p->bytes_done);
}

/* What could not be opened, named on stderr and kept for --json. */
typedef struct unopened {
    char **paths;
    size_t n;
} unopened;

static void note_unopened(const cli_cmd *self, unopened *u, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void note_unopened(const cli_cmd *self, unopened *u, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvx %s: cannot open '%s': ", self->name, path);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    char **np = realloc(u->paths, (u->n + 1) * sizeof *np);
    if (!np) return;
    u->paths = np;
    if ((np[u->n] = strdup(path))) u->n++;
}

static int push(kvx_shard ***v, size_t *n, size_t *cap, kvx_shard *sh)
{
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 16;
        kvx_shard **nv = realloc(*v, nc * sizeof *nv);
        if (!nv) return -1;
        *v = nv;
        *cap = nc;
    }
    (*v)[(*n)++] = sh;
    return 0;
}

/* The shards of a store directory. The library lists the ones it could
 * open; every registered one it could not is found here and named: each
 * file of shards/ that is not among them and does not open, and then the
 * count of any still unaccounted for (a registered file that is gone). */
static void collect_store(const cli_cmd *self, const char *dir, kvx_shard ***v, size_t *n,
                          size_t *cap, unopened *u)
{
    kvx_store *s = NULL;
    int rc = kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY);
    if (rc != 0) {
        const char *d = kvx_last_error();
        note_unopened(self, u, dir, "%s (%s)", *d ? d : kvx_strerror(rc), kvx_err_name(rc));
        return;
    }
    kvx_store_stats st;
    kvx_shard **got = NULL;
    size_t ngot = 0;
    if ((rc = kvx_store_stat(&st, s)) == 0) rc = kvx_store_shards(&got, &ngot, s);
    kvx_store_close(s); /* the shards hold their own references */
    if (rc != 0) {
        const char *d = kvx_last_error();
        note_unopened(self, u, dir, "%s (%s)", *d ? d : kvx_strerror(rc), kvx_err_name(rc));
        return;
    }
    size_t first = *n;
    for (size_t i = 0; i < ngot; i++) {
        if (push(v, n, cap, got[i]) != 0) {
            for (size_t k = i; k < ngot; k++) kvx_shard_close(got[k]);
            note_unopened(self, u, dir, "out of memory");
            break;
        }
    }
    kvx_free(got);
    if (st.shards <= ngot) return;
    uint64_t missing = st.shards - ngot, named = 0;
    char sp[4096];
    snprintf(sp, sizeof sp, "%s/shards", dir);
    DIR *d = opendir(sp);
    struct dirent *de;
    while (d && named < missing && (de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        int known = 0;
        for (size_t i = first; i < *n && !known; i++) {
            const char *p = kvx_shard_path((*v)[i]);
            const char *b = p ? strrchr(p, '/') : NULL;
            known = p && !strcmp(b ? b + 1 : p, de->d_name);
        }
        if (known) continue;
        char fp[8192];
        snprintf(fp, sizeof fp, "%s/%s", sp, de->d_name);
        struct stat fst;
        if (lstat(fp, &fst) != 0) continue;
        if (!S_ISREG(fst.st_mode)) {
            note_unopened(self, u, fp, "it is %s", cli_file_type(fst.st_mode));
            named++;
            continue;
        }
        kvx_shard *sh = NULL;
        rc = kvx_shard_open(&sh, fp, 0);
        if (rc == 0) {
            kvx_shard_close(sh); /* opens: not one the index names */
            continue;
        }
        const char *e = kvx_last_error();
        note_unopened(self, u, fp, "%s (%s)", *e ? e : kvx_strerror(rc), kvx_err_name(rc));
        named++;
    }
    if (d) closedir(d);
    if (named < missing) {
        char what[64];
        snprintf(what, sizeof what, "%s (%" PRIu64 " registered shard(s))", dir, missing - named);
        note_unopened(self, u, what, "the store's index names them but they could not be opened");
    }
}

static int collect(const cli_cmd *self, char **paths, size_t np, kvx_shard ***out, size_t *out_n,
                   unopened *u)
{
    kvx_shard **v = NULL;
    size_t n = 0, cap = 0;
    for (size_t i = 0; i < np; i++) {
        struct stat st;
        if (stat(paths[i], &st) != 0) {
            note_unopened(self, u, paths[i], "%s", strerror(errno));
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            collect_store(self, paths[i], &v, &n, &cap, u);
            continue;
        }
        if (!S_ISREG(st.st_mode)) {
            /* Judged by type, never opened: a FIFO would block. */
            note_unopened(self, u, paths[i], "it is %s, neither a shard file nor a store directory",
                          cli_file_type(st.st_mode));
            continue;
        }
        kvx_shard *sh = NULL;
        int rc = kvx_shard_open(&sh, paths[i], 0);
        if (rc != 0) {
            const char *d = kvx_last_error();
            note_unopened(self, u, paths[i], "%s (%s)", *d ? d : kvx_strerror(rc), kvx_err_name(rc));
            continue;
        }
        if (push(&v, &n, &cap, sh) != 0) {
            kvx_shard_close(sh);
            for (size_t k = 0; k < n; k++) kvx_shard_close(v[k]);
            free(v);
            return cli_fail(self, "out of memory");
        }
    }
    *out = v;
    *out_n = n;
    return CLI_OK;
}

static int run_warmup(const cli_cmd *self, int argc, char **argv)
{
    static const struct option opts[] = {
        {"sink", required_argument, NULL, 's'},
        {"io", required_argument, NULL, 'i'},
        {"no-verify", no_argument, NULL, 'n'},
        {"json", no_argument, NULL, 'j'},
        {"buffered", no_argument, NULL, 'b'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int sink = KVX_SINK_HOST, io = KVX_IO_AUTO, json = 0, ch;
    uint32_t flags = 0;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, ":s:i:njbh", opts, NULL)) != -1) {
        switch (ch) {
        case 's':
            if (!strcmp(optarg, "host")) sink = KVX_SINK_HOST;
            else if (!strcmp(optarg, "gpu")) sink = KVX_SINK_GPU;
            else if (!strcmp(optarg, "discard")) sink = KVX_SINK_DISCARD;
            else return cli_usage(self, "--sink must be host, gpu or discard, not '%s'", optarg);
            break;
        case 'i':
            if (!strcmp(optarg, "uring")) io = KVX_IO_URING;
            else if (!strcmp(optarg, "pread")) io = KVX_IO_PREAD;
            else if (!strcmp(optarg, "auto")) io = KVX_IO_AUTO;
            else return cli_usage(self, "--io must be uring, pread or auto, not '%s'", optarg);
            break;
        case 'n': flags |= KVX_WARMUP_NO_VERIFY; break;
        case 'b': flags |= KVX_WARMUP_BUFFERED; break;
        case 'j': json = 1; break;
        case 'h': cli_print_help(self); return CLI_OK;
        default: return cli_getopt_error(self, ch, argv, opts);
        }
    }
    if (optind >= argc) return cli_usage(self, "expected at least one DIR or FILE.kvx");

    kvx_shard **shards = NULL;
    size_t n = 0;
    unopened un = {NULL, 0};
    if (collect(self, argv + optind, (size_t)(argc - optind), &shards, &n, &un) != CLI_OK)
        return CLI_FAIL;
    int rc = 0;
    if (un.n && !n) {
        cli_fail(self, "nothing to warm up: %zu input(s) could not be opened", un.n);
        for (size_t i = 0; i < un.n; i++) free(un.paths[i]);
        free(un.paths);
        free(shards);
        return CLI_FAIL;
    }

    uint64_t sink_bytes = 0, pages = 0;
    for (size_t i = 0; i < n; i++) pages += kvx_shard_get_info(shards[i])->num_blocks;
    rc = kvx_warmup_sink_bytes(&sink_bytes, shards, n);
    void *host = NULL;
    kvx_gpu *gpu = NULL;
    int ret = CLI_FAIL;
    kvx_warmup_report rep;
    memset(&rep, 0, sizeof rep);
    if (rc != 0) {
        cli_fail_code(self, rc, "cannot size the sink");
        goto out;
    }
    kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
    o.io_mode = io;
    o.flags = flags;
    o.sink = sink;
    if (sink == KVX_SINK_HOST && sink_bytes) {
        /* The host sink holds every page: refuse what RAM cannot hold. */
        long pg = sysconf(_SC_PAGESIZE), np = sysconf(_SC_PHYS_PAGES);
        uint64_t ram = (pg > 0 && np > 0) ? (uint64_t)pg * (uint64_t)np : 0;
        char a[32], b[32];
        if (ram && sink_bytes > ram / 10 * 8) {
            cli_fail(self, "the pages take %s but this machine has %s of memory",
                     cli_fmt_size(a, sizeof a, sink_bytes), cli_fmt_size(b, sizeof b, ram));
            fprintf(stderr, "  hint: '--sink discard' reads and verifies without keeping the pages\n");
            goto out;
        }
        host = malloc(sink_bytes);
        if (!host) {
            cli_fail(self, "cannot allocate %s for the host sink",
                     cli_fmt_size(a, sizeof a, sink_bytes));
            goto out;
        }
        o.host_buf = host;
        o.host_buf_bytes = sink_bytes;
    } else if (sink == KVX_SINK_HOST) {
        /* Nothing to hold (an empty store, shards of 0 entries or only
         * tombstones): the library still wants a buffer, so give it one
         * of 0 bytes. Empty is not an error: 0 pages are warmed up. */
        static unsigned char none;
        o.host_buf = &none;
        o.host_buf_bytes = 0;
    } else if (sink == KVX_SINK_GPU) {
        kvx_gpu_options go = KVX_GPU_OPTIONS_INIT;
        go.arena_bytes = sink_bytes + 8 * pages + 4096;
        rc = kvx_gpu_create(&gpu, &go);
        if (rc != 0) {
            cli_fail_code(self, rc, "cannot use the GPU");
            if (rc != KVX_ENOGPU && rc != KVX_ENOCUDA)
                fprintf(stderr, "  hint: '--sink host' warms up into host memory\n");
            goto out;
        }
        o.gpu = gpu;
    }
    cli_progress bar = {0};
    cli_progress_begin(&bar, "warmup", 0, 1, !json);
    o.progress = warm_progress;
    o.progress_ctx = &bar;
    rc = kvx_warmup_run(&rep, shards, n, &o);
    cli_progress_end(&bar);
    if (rc != 0) {
        cli_fail_code(self, rc, "warmup failed");
        goto out;
    }
    for (size_t i = 0; i < rep.n_failures; i++) {
        const kvx_warmup_failure *f = &rep.failures[i];
        kvx_entry e;
        uint32_t coord = 0;
        if (f->shard < n && kvx_shard_entry(&e, shards[f->shard], f->entry) == 0) coord = e.coordinate;
        fprintf(stderr, "kvx warmup: %s: entry %u (coordinate 0x%08x): %s (%s)\n",
                f->path ? f->path : "?", f->entry, coord, kvx_strerror(f->code),
                kvx_err_name(f->code));
    }
    const char *sink_name = sink == KVX_SINK_HOST ? "host" : sink == KVX_SINK_GPU ? "gpu" : "discard";
    if (json) {
        cli_json j;
        cli_json_init(&j, stdout);
        cli_json_obj_begin(&j);
        cli_json_key(&j, "bytes");
        cli_json_u64(&j, rep.bytes);
        cli_json_key(&j, "pages");
        cli_json_u64(&j, rep.pages);
        cli_json_key(&j, "crc_failures");
        cli_json_u64(&j, rep.crc_failures);
        cli_json_key(&j, "io_failures");
        cli_json_u64(&j, rep.io_failures);
        cli_json_key(&j, "seconds");
        cli_json_double(&j, rep.seconds);
        cli_json_key(&j, "gbps");
        cli_json_double(&j, rep.gbps);
        cli_json_key(&j, "io");
        cli_json_str(&j, kvx_io_mode_name(rep.io_mode));
        cli_json_key(&j, "direct");
        cli_json_bool(&j, rep.direct);
        cli_json_key(&j, "sink");
        cli_json_str(&j, sink_name);
        cli_json_key(&j, "verified");
        cli_json_bool(&j, !(flags & KVX_WARMUP_NO_VERIFY));
        cli_json_key(&j, "shards");
        cli_json_u64(&j, n);
        cli_json_key(&j, "unopened");
        cli_json_arr_begin(&j);
        for (size_t i = 0; i < un.n; i++) cli_json_str(&j, un.paths[i]);
        cli_json_arr_end(&j);
        cli_json_key(&j, "failures");
        cli_json_arr_begin(&j);
        for (size_t i = 0; i < rep.n_failures; i++) {
            cli_json_obj_begin(&j);
            cli_json_key(&j, "file");
            cli_json_str(&j, rep.failures[i].path ? rep.failures[i].path : "");
            cli_json_key(&j, "entry");
            cli_json_u64(&j, rep.failures[i].entry);
            cli_json_key(&j, "error");
            cli_json_str(&j, kvx_err_name(rep.failures[i].code));
            cli_json_obj_end(&j);
        }
        cli_json_arr_end(&j);
        cli_json_obj_end(&j);
        cli_json_finish(&j);
    } else {
        char a[32], r[32];
        printf("warmed up %" PRIu64 " page(s), %s from %zu shard(s) in %.3f s: %s\n", rep.pages,
               cli_fmt_size(a, sizeof a, rep.bytes), n, rep.seconds,
               cli_fmt_rate(r, sizeof r, rep.gbps * 1e9));
        printf("  io %s%s, sink %s, page CRCs %s; %" PRIu64 " CRC failure(s), %" PRIu64
               " read failure(s)\n",
               kvx_io_mode_name(rep.io_mode), rep.direct ? " (O_DIRECT)" : " (page cache)",
               sink_name, (flags & KVX_WARMUP_NO_VERIFY) ? "not checked" : "checked",
               rep.crc_failures, rep.io_failures);
    }
    ret = (rep.crc_failures || rep.io_failures || un.n) ? CLI_FAIL : CLI_OK;
    if (un.n)
        fprintf(stderr, "kvx warmup: %zu input(s) could not be opened (named above); the rest "
                        "was warmed up\n", un.n);
out:
    for (size_t i = 0; i < un.n; i++) free(un.paths[i]);
    free(un.paths);
    kvx_warmup_report_free(&rep);
    kvx_gpu_destroy(gpu);
    free(host);
    for (size_t i = 0; i < n; i++) kvx_shard_close(shards[i]);
    free(shards);
    return ret;
}

const cli_cmd cli_cmd_warmup = {
    "warmup",
    "load whole shards or a whole store into host or GPU memory at disk speed",
    "Usage: kvx warmup [--sink host|gpu|discard] [--io uring|pread|auto]\n"
    "                  [--no-verify] [--buffered] [--json] DIR|FILE.kvx...\n"
    "\n"
    "Reads every page of the given shard files, or of every live shard of a\n"
    "store directory, in large sequential runs into pinned staging buffers\n"
    "(io_uring, O_DIRECT where the file system allows), checks each page's\n"
    "CRC-32 and copies it to the sink while the next reads are in flight.\n"
    "A page failing its CRC is counted, named and not delivered. A progress\n"
    "bar is drawn on a terminal. Empty is no error: a store with no blocks\n"
    "(or only deletes) and a shard of 0 entries warm up 0 pages, exit 0.\n"
    "\n"
    "Every input that cannot be opened is named on standard error (the rest\n"
    "is still warmed up, and the exit status is 1): a shard file that does\n"
    "not open, a shard a store's index names that does not open or is gone,\n"
    "and a path that is neither a regular file nor a directory (a FIFO or\n"
    "device is refused by type, never opened).\n"
    "\n"
    "Options:\n"
    "  -s, --sink host|gpu|discard  where pages go (default host; discard\n"
    "                               only reads and verifies)\n"
    "  -i, --io uring|pread|auto    read path (default auto: io_uring, else\n"
    "                               buffered pread)\n"
    "  -n, --no-verify              skip the page CRC checks\n"
    "  -b, --buffered               never O_DIRECT (read through the page cache)\n"
    "  -j, --json                   one JSON object: bytes, pages, crc_failures,\n"
    "                               io_failures, seconds, gbps, io, direct, sink,\n"
    "                               verified, shards, unopened (paths),\n"
    "                               failures\n"
    "  -h, --help                   show this help\n"
    "\n"
    "Exit status: 0 every input opened and every page delivered good, 1 an\n"
    "input could not be opened, a page failed or the warmup could not run (no\n"
    "GPU, not enough memory...), 2 usage error.\n",
    run_warmup,
};
