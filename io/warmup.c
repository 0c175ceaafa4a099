/*
 * warmup.c - bulk warmup: every page of whole shards, read in large
 * sequential runs into a ring of pinned staging buffers, verified, and
 * handed to a sink (discard, host buffer, GPU arena).
 *
 * Shape: one thread drives the executor (ioq.c). queue_depth runs are in
 * flight while that thread verifies and copies the run that just landed,
 * and two spare staging buffers let the next reads start before the copy
 * of the previous ones ends (double buffering; on the GPU a buffer is
 * reused only after its cudaMemcpyAsync's event fired). CRCs never run on
 * the driving thread: pread workers, or io_uring's verify workers, check
 * each run as it lands and (host sink) copy its good pages into the
 * caller's buffer, so checksums and copies use every core. Runs are the
 * writer's layout (pages back to back) cut at chunk_bytes, so the disk
 * sees the same large sequential reads fio does.
 *
 * Cached data: before planning, mincore samples whether the pages are in
 * the page cache. If so (>= 90%), KVX_IO_AUTO without KVX_WARMUP_BUFFERED
 * reads them with buffered pread workers (one per CPU: each reads, checks
 * and copies a run from its own cache), and every buffered path uses 1 MiB
 * runs and 2 per CPU in flight, so staging stays cache-resident. Cold
 * data keeps io_uring, O_DIRECT, 4 MiB runs at queue_depth.
 *
 * A shared-tier view's shard (kvx_shard_mem: pages on the heap, no file)
 * has runs without a file: each is copied into its staging buffer on the
 * driving thread, checked as a landed run, and delivered the same way.
 *
 * kvx_warmup_start runs the same loop on a background thread and exposes
 * progress through atomics, for callers (cgo) that poll instead of taking
 * a callback.
 *
 * The GPU sink's paths (kvx_gpu_path: the registered file mapping, the
 * CRC on the GPU) are in warmup_gpu.c; this file calls them at four
 * points: choosing the path, before the loop (kvx_wgpu_begin,
 * kvx_wgpu_mapped), for each landed run (kvx_wgpu_deliver) and at the
 * end (kvx_wgpu_end).
 */
#include "warmup.h"

#include "common/os.h"
#include "format/format.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#endif

#define SINK_ALIGN 256u
#define MAX_BUFS KVX_WARMUP_MAX_BUFS
#define MAX_THREADS 64u
#define DEFAULT_LANES 16u

static int wpage_cmp(const void *a, const void *b)
{
    const wpage *x = *(const wpage *const *)a, *y = *(const wpage *const *)b;
    if (x->shard != y->shard) return x->shard < y->shard ? -1 : 1;
    return x->off < y->off ? -1 : x->off > y->off;
}

int kvx_warmup_sink_bytes(uint64_t *out, kvx_shard *const *shards, size_t n)
{
    if (!out || (n && !shards)) return kvx_fail(KVX_EINVALID, "kvx_warmup_sink_bytes: a NULL argument");
    uint64_t total = 0;
    for (size_t s = 0; s < n; s++) {
        if (!shards[s]) return kvx_fail(KVX_EINVALID, "warmup input %zu is NULL", s);
        const kvx_shard_info *info = kvx_shard_get_info(shards[s]);
        for (uint32_t i = 0; i < info->num_blocks; i++) {
            kvx_entry e;
            int rc = kvx_shard_entry(&e, shards[s], i);
            if (rc) return rc;
            if (kvx_shard_absent(shards[s], i)) continue; /* a tombstone or a freed page: none to read */
            total = kvx_align_up(total, SINK_ALIGN) + e.bytes;
        }
    }
    *out = total;
    return 0;
}

static void warmup_free(kvx_warmup *w)
{
    if (!w) return;
    kvx_ioq_destroy(w->q);
    kvx_pool_destroy(w->pool);
    for (size_t i = 0; i < w->n_shards; i++) kvx_shard_close(w->shards[i]);
    free(w->shards);
    free(w->pages);
    free(w->rpages);
    free(w->runs);
    free(w->fails);
    free(w->dev_pages);
    free(w->staged);
    kvx_wgpu_free(w);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w);
}

/* Fraction (0..1) of the inputs' page bytes resident in the page cache,
 * sampled with mincore over a mapping of each file: up to 64 windows of
 * 1 MiB per shard spread over its KV data, at most ~4096 in all (a store
 * of many shards gets fewer per shard). -1 when unknown. */
static double resident_fraction(kvx_shard *const *shards, size_t n)
{
    uint64_t seen = 0, in = 0;
    long psz = sysconf(_SC_PAGESIZE);
    const uint64_t win = 1u << 20;
    unsigned char vec[(1u << 20) / 4096];
    if (psz != 4096) return -1;
    uint64_t per = n ? 4096 / n : 1;
    if (per < 1) per = 1;
    if (per > 64) per = 64;
    for (size_t s = 0; s < n; s++) {
        const kvx_shard_info *info = kvx_shard_get_info(shards[s]);
        uint64_t lo = info->kv_data_offset & ~(uint64_t)4095, hi = info->file_size;
        if (hi <= lo || kvx_shard_fd(shards[s]) < 0) continue; /* no file: in memory */
        void *m = kvx_os.mmap(NULL, hi, PROT_READ, MAP_SHARED, kvx_shard_fd(shards[s]), 0);
        if (m == MAP_FAILED) return -1;
        uint64_t span = hi - lo, step = span / per > win ? span / per & ~(uint64_t)4095 : win;
        for (uint64_t off = lo; off < hi; off += step) {
            uint64_t len = hi - off < win ? hi - off : win;
            if (mincore((uint8_t *)m + off, len, vec) != 0) {
                kvx_os.munmap(m, hi);
                return -1;
            }
            uint64_t np = (len + 4095) / 4096;
            for (uint64_t k = 0; k < np; k++) in += vec[k] & 1;
            seen += np;
        }
        kvx_os.munmap(m, hi);
    }
    return seen ? (double)in / (double)seen : -1;
}

/* Copy whose stores bypass the caches (x86-64: SSE2 streaming stores):
 * the sink is written once and not read back here, so streaming saves
 * the read-for-ownership of every destination line and leaves the
 * staging data (the source) in cache. Small copies use memcpy. */
static void copy_stream(uint8_t *dst, const uint8_t *src, uint64_t n)
{
#if defined(__x86_64__) && defined(__SSE2__)
    if (n >= (64u << 10)) {
        uint64_t head = (16 - ((uintptr_t)dst & 15)) & 15;
        memcpy(dst, src, head);
        dst += head;
        src += head;
        n -= head;
        __m128i *d = (__m128i *)(void *)dst;
        const __m128i *sp = (const __m128i *)(const void *)src;
        uint64_t k = n / 64;
        for (uint64_t i = 0; i < k; i++, d += 4, sp += 4) {
            __m128i a = _mm_loadu_si128(sp), b = _mm_loadu_si128(sp + 1);
            __m128i c = _mm_loadu_si128(sp + 2), e = _mm_loadu_si128(sp + 3);
            _mm_stream_si128(d, a);
            _mm_stream_si128(d + 1, b);
            _mm_stream_si128(d + 2, c);
            _mm_stream_si128(d + 3, e);
        }
        _mm_sfence();
        memcpy(dst + k * 64, src + k * 64, n - k * 64);
        return;
    }
#endif
    memcpy(dst, src, n);
}

/* KVX_SINK_HOST: a worker that verified a run copies its good pages into
 * the caller's buffer while the data is still in its cache, so the copy
 * runs in parallel and not on the thread driving the reads. Pages go to
 * disjoint sink ranges: no locking. A bad page's range is left alone. */
static void host_copy(kvx_io_run *r, void *ctx)
{
    kvx_warmup *w = ctx;
    for (uint32_t k = 0; k < r->n_pages; k++) {
        const kvx_io_page *pg = &r->pages[k];
        if (pg->status == 0)
            copy_stream((uint8_t *)w->o.host_buf + w->pages[pg->tag].sink_off, r->buf + pg->rel, pg->bytes);
    }
}

/* CPU lanes by default: one per CPU, at most DEFAULT_LANES. */
static unsigned online_cpus(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > DEFAULT_LANES ? DEFAULT_LANES : (unsigned)n;
}

static int make_staging(kvx_warmup *w)
{
    kvx_pool_options po = KVX_POOL_OPTIONS_INIT;
    po.bytes = w->chunk * w->nbuf;
    po.numa_node = w->o.numa_node;
    po.gpu = w->o.sink == KVX_SINK_GPU && w->o.gpu ? kvx_gpu_device(w->o.gpu) : -1;
    int mode = w->o.io_mode, buffered = (w->o.flags & KVX_WARMUP_BUFFERED) != 0;
    if (w->warm_pread) {
        mode = KVX_IO_PREAD;
        buffered = 1;
    }
    /* CPU checks on the staged runs (the GPU-CRC path leaves them to the GPU) */
    int checks = (!(w->o.flags & KVX_WARMUP_NO_VERIFY) && !w->gpu_crc) || w->o.sink == KVX_SINK_HOST;
    /* pread workers: one lane each on cached data (each reads, checks and
     * copies from its own cache); 4 for the disk unless threads says.
     * Verify workers (io_uring): one per lane. */
    unsigned lanes = w->o.threads ? w->o.threads : online_cpus();
    unsigned nt = w->warm ? lanes : w->o.threads ? w->o.threads : 4;
    unsigned vt = checks ? lanes : 0;
    w->lanes = nt > vt ? nt : vt;
    kvx_ioq_options qo = {mode, w->qd, nt, buffered, NULL, vt};
    int rc = kvx_pool_create(&w->pool, &po);
    if (rc == KVX_EMEMLOCK) {
        /* Locking is an optimization here: carry on unlocked and unregistered. */
        po.flags |= KVX_POOL_NO_MLOCK | KVX_POOL_NO_REGISTER;
        rc = kvx_pool_create(&w->pool, &po);
    }
    if (rc) return rc;
    qo.pool = w->pool;
    rc = kvx_ioq_create(&w->q, &qo);
    if (rc == KVX_EMEMLOCK) {
        w->pool->no_register = 1;
        rc = kvx_ioq_create(&w->q, &qo);
    }
    if (rc) return rc;
    for (unsigned b = 0; b < w->nbuf; b++) {
        rc = kvx_pool_alloc((void **)&w->bufs[b], w->pool, w->chunk);
        if (rc) return rc;
    }
    return 0;
}

static int warmup_new(kvx_warmup **out, kvx_shard *const *shards, size_t n, const kvx_warmup_options *opts)
{
    *out = NULL;
    kvx_warmup_options def = KVX_WARMUP_OPTIONS_INIT, given;
    if (!opts) opts = &def;
    if (opts->version != KVX_WARMUP_OPTIONS_VERSION && opts->version != 1)
        return kvx_fail(KVX_EVERSION, "kvx_warmup_options.version is %u, expected %u (or 1)", opts->version,
                        KVX_WARMUP_OPTIONS_VERSION);
    if (opts->version == 1) { /* a caller built before threads and gpu_path: only its fields are read */
        given = def;
        memcpy(&given, opts, offsetof(kvx_warmup_options, threads));
        given.version = KVX_WARMUP_OPTIONS_VERSION;
        opts = &given;
    }
    if (opts->threads > MAX_THREADS)
        return kvx_fail(KVX_EINVALID, "kvx_warmup_options.threads %u is above %u", opts->threads, MAX_THREADS);
    if (opts->gpu_path < KVX_GPU_PATH_AUTO || opts->gpu_path > KVX_GPU_PATH_MAPPED)
        return kvx_fail(KVX_EINVALID, "kvx_warmup_options.gpu_path %d is not a kvx_gpu_path", opts->gpu_path);
    if (n && !shards) return kvx_fail(KVX_EINVALID, "warmup: shards is NULL");
    if (opts->flags & ~(uint32_t)(KVX_WARMUP_NO_VERIFY | KVX_WARMUP_BUFFERED))
        return kvx_fail(KVX_EINVALID, "kvx_warmup_options.flags has unknown bits 0x%x", opts->flags);
    if (opts->sink != KVX_SINK_DISCARD && opts->sink != KVX_SINK_HOST && opts->sink != KVX_SINK_GPU)
        return kvx_fail(KVX_EINVALID, "kvx_warmup_options.sink %d is not a kvx_sink_kind", opts->sink);
    if (opts->queue_depth > MAX_BUFS - 2)
        return kvx_fail(KVX_EINVALID, "kvx_warmup_options.queue_depth %u is above %d", opts->queue_depth,
                        MAX_BUFS - 2);
    if (opts->sink == KVX_SINK_GPU) {
        int rc = kvx_gpu_count(&(int){0});
        if (rc == KVX_ENOCUDA) return rc; /* before opts->gpu is looked at */
        if (!opts->gpu) return kvx_fail(KVX_EINVALID, "kvx_warmup_options.gpu is NULL with KVX_SINK_GPU");
    }
    uint64_t need;
    int rc = kvx_warmup_sink_bytes(&need, shards, n);
    if (rc) return rc;
    if (opts->sink == KVX_SINK_HOST && (!opts->host_buf || opts->host_buf_bytes < need))
        return kvx_fail(KVX_EINVALID, "kvx_warmup_options.host_buf: %" PRIu64 " bytes given, the inputs need %" PRIu64,
                        opts->host_buf ? opts->host_buf_bytes : 0, need);

    kvx_warmup *w = calloc(1, sizeof *w);
    if (!w) return kvx_fail(-ENOMEM, "warmup: out of memory");
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->o = *opts;
    w->sink_bytes = need;
    w->shards = calloc(n ? n : 1, sizeof *w->shards);
    if (!w->shards) goto nomem;
    for (size_t s = 0; s < n; s++) w->shards[s] = kvx_shard_ref(shards[s]);
    w->n_shards = n;
    size_t total = 0;
    for (size_t s = 0; s < n; s++) total += kvx_shard_get_info(shards[s])->num_blocks;
    w->pages = calloc(total ? total : 1, sizeof *w->pages);
    w->rpages = calloc(total ? total : 1, sizeof *w->rpages);
    w->runs = calloc(total ? total : 1, sizeof *w->runs);
    wpage **order = calloc(total ? total : 1, sizeof *order);
    if (!w->pages || !w->rpages || !w->runs || !order) {
        free(order);
        goto nomem;
    }
    uint64_t sink = 0, biggest = 0;
    for (size_t s = 0; s < n; s++) {
        uint32_t nb = kvx_shard_get_info(shards[s])->num_blocks;
        for (uint32_t i = 0; i < nb; i++) {
            kvx_entry e;
            if (kvx_shard_absent(shards[s], i)) continue; /* a tombstone or a freed page: none to read */
            kvx_shard_entry(&e, shards[s], i); /* checked by sink_bytes */
            wpage *p = &w->pages[w->n_pages];
            sink = kvx_align_up(sink, SINK_ALIGN);
            *p = (wpage){(uint32_t)s, i, e.offset, e.bytes, sink, e.crc32};
            sink += e.bytes;
            w->bytes_total += e.bytes;
            if (kvx_align_up(e.bytes, 4096) + 4096 > biggest) biggest = kvx_align_up(e.bytes, 4096) + 4096;
            order[w->n_pages] = p;
            w->n_pages++;
        }
    }
    qsort(order, w->n_pages, sizeof *order, wpage_cmp);
    w->qd = opts->queue_depth ? opts->queue_depth : 8;
    uint64_t chunk = opts->chunk_bytes ? opts->chunk_bytes : 4u << 20;
    /* Reads that may go through the page cache: are the data there? */
    if (opts->io_mode == KVX_IO_AUTO || opts->io_mode == KVX_IO_PREAD || (opts->flags & KVX_WARMUP_BUFFERED))
        w->warm = resident_fraction(shards, n) >= 0.9;
    if (w->warm) {
        /* Cached reads are memory copies: a few runs in flight suffice, and
         * small runs into few staging buffers stay in the CPU caches, so
         * the CRC and the sink copy read them from there. */
        if (!opts->chunk_bytes) chunk = 1u << 20;
        if (w->qd > 2 * online_cpus()) w->qd = 2 * online_cpus();
        w->warm_pread = opts->io_mode == KVX_IO_AUTO && !(opts->flags & KVX_WARMUP_BUFFERED);
    }
    w->chunk = kvx_align_up(chunk, 4096);
    if (w->chunk < biggest) w->chunk = biggest;
    /* A staging buffer is one pool slot, at most 1 GiB: refuse a larger one
     * before the pool (nbuf of them, touched page by page) is made. */
    if (w->chunk > KVX_IO_REG_CHUNK) {
        free(order);
        warmup_free(w);
        if (opts->chunk_bytes > KVX_IO_REG_CHUNK)
            return kvx_fail(KVX_EINVALID, "kvx_warmup_options.chunk_bytes %u is above 1 GiB, the largest staging buffer",
                            opts->chunk_bytes);
        return kvx_fail(KVX_ECAPACITY, "warmup: a page of %" PRIu64 " bytes does not fit a 1 GiB staging buffer",
                        biggest - 4096);
    }
    w->nbuf = w->qd + 2;
    if (opts->sink == KVX_SINK_GPU && (rc = kvx_wgpu_choose(w))) {
        free(order);
        warmup_free(w);
        return rc;
    }
    rc = make_staging(w);
    if (rc) {
        free(order);
        warmup_free(w);
        return rc;
    }
    /* runs: back-to-back pages of one shard, up to chunk bytes */
    for (size_t i = 0; i < w->n_pages;) {
        wpage *first = order[i];
        kvx_io_file *file = NULL; /* none: a shared-tier view's shard (no file) */
        uint32_t align = 1;
        if (kvx_shard_fd(w->shards[first->shard]) >= 0) {
            rc = kvx_ioq_file(&file, w->q, kvx_shard_fd(w->shards[first->shard]));
            if (rc) {
                free(order);
                warmup_free(w);
                return rc;
            }
            align = file->align;
        }
        uint64_t start = first->off - first->off % align;
        uint64_t end = first->off + first->bytes;
        size_t j = i + 1;
        while (j < w->n_pages && order[j]->shard == first->shard && order[j]->off == kvx_align_up(end, 4096) &&
               kvx_align_up(order[j]->off + order[j]->bytes - start, align) <= w->chunk) {
            end = order[j]->off + order[j]->bytes;
            j++;
        }
        kvx_io_run *r = &w->runs[w->n_runs++];
        r->file = file;
        r->off = start;
        r->want = end - start;
        r->len = kvx_align_up(r->want, align);
        r->verify = !(opts->flags & KVX_WARMUP_NO_VERIFY) && !w->gpu_crc;
        r->fuse = 1;
        r->pages = &w->rpages[i];
        r->n_pages = (uint32_t)(j - i);
        if (opts->sink == KVX_SINK_HOST) {
            r->on_done = host_copy;
            r->on_done_ctx = w;
        }
        for (size_t k = i; k < j; k++) {
            w->rpages[k].rel = order[k]->off - start;
            w->rpages[k].bytes = order[k]->bytes;
            w->rpages[k].crc_want = order[k]->crc;
            w->rpages[k].tag = (uint32_t)(order[k] - w->pages);
        }
        i = j;
    }
    free(order);
    w->staged = calloc(w->n_runs ? w->n_runs : 1, sizeof *w->staged);
    if (!w->staged) goto nomem;
    for (size_t i = 0; i < w->n_runs; i++) w->staged[i] = (uint32_t)i;
    w->n_staged = w->n_runs;
    if (opts->sink == KVX_SINK_GPU) {
        w->dev_pages = calloc(w->n_pages ? w->n_pages : 1, sizeof *w->dev_pages);
        if (!w->dev_pages) goto nomem;
        rc = kvx_gpu_reserve(&w->gpu_base, opts->gpu, need ? need : 1);
        if (rc) {
            warmup_free(w);
            return rc;
        }
    }
    *out = w;
    return 0;
nomem:
    warmup_free(w);
    return kvx_fail(-ENOMEM, "warmup: out of memory");
}

/* A run landed in staging buffer b: deliver its good pages, name the bad. */
static int deliver(kvx_warmup *w, kvx_io_run *r, unsigned b)
{
    if (r->file) w->bytes_read += r->got; /* a file-less run read nothing */
    w->st.read_s += r->read_s;
    w->st.crc_cpu_s += r->crc_s;
    if (w->o.sink == KVX_SINK_GPU) return kvx_wgpu_deliver(w, r, b);
    for (uint32_t k = 0; k < r->n_pages; k++) {
        const kvx_io_page *pg = &r->pages[k];
        wpage *p = &w->pages[pg->tag];
        if (pg->status == 0) {
            if (w->o.sink == KVX_SINK_HOST) {
                /* copied by host_copy as the run was verified */
            } else {
                w->checksum += pg->crc_got;
            }
            w->good_bytes += p->bytes;
            w->good_pages++;
        } else {
            if (pg->status == KVX_EPAGECRC)
                atomic_fetch_add(&w->a_crc, 1);
            else
                w->io_failures++;
            if (kvx_warmup_add_fail(w, p, pg->status)) return kvx_fail(-ENOMEM, "warmup: out of memory");
        }
        atomic_fetch_add(&w->a_bytes, p->bytes);
        atomic_fetch_add(&w->a_pages, 1);
    }
    return 0;
}

/* A run of a shard without a file (kvx_shard_mem): its pages copied into
 * the run's staging buffer, then checked and (host sink) copied out as a
 * run that landed (not in bytes_read: no file was read). */
static void copy_mem_run(kvx_warmup *w, kvx_io_run *r)
{
    int whole = 1;
    for (uint32_t k = 0; k < r->n_pages; k++) {
        const kvx_io_page *pg = &r->pages[k];
        const wpage *p = &w->pages[pg->tag];
        const void *src = NULL;
        if (kvx_shard_page(&src, w->shards[p->shard], p->entry, 0) == 0)
            memcpy(r->buf + pg->rel, src, pg->bytes);
        else
            whole = 0;
    }
    r->status = whole ? 0 : KVX_ETRUNC;
    r->got = whole ? r->want : 0;
    r->crc_fused = 0;
    r->read_s = r->crc_s = 0;
    kvx_io_run_finish(r);
    if (r->on_done) r->on_done(r, r->on_done_ctx);
}

/* The staging loop over w->staged: reads into the staging buffers,
 * delivered as they land, a buffer reused once its run was delivered (on
 * the GPU: once its copies' event fired). */
static int exec_staged(kvx_warmup *w, void (*cb)(void *, const kvx_warmup_progress *), void *ctx, int *canceled)
{
    double next_cb = kvx_io_now() + 0.1;
    unsigned free_bufs[MAX_BUFS], n_free = 0;
    for (unsigned b = 0; b < w->nbuf; b++) free_bufs[n_free++] = w->nbuf - 1 - b;
    kvx_io_run *done[MAX_BUFS];
    size_t next = 0, finished = 0, pushed = 0;
    int rc = 0;
    while (finished < pushed || (next < w->n_staged && !*canceled)) {
        if (!*canceled && atomic_load(&w->a_cancel)) {
            *canceled = 1;
            kvx_ioq_cancel(w->q);
        }
        while (!*canceled && n_free > 0 && next < w->n_staged) {
            unsigned b = free_bufs[--n_free];
            if (w->o.sink == KVX_SINK_GPU && (rc = kvx_wgpu_wait(w, b))) return rc;
            kvx_io_run *r = &w->runs[w->staged[next++]];
            r->buf = w->bufs[b];
            r->owner = (void *)(uintptr_t)b;
            if (!r->file) { /* in memory: no read, delivered now */
                copy_mem_run(w, r);
                rc = deliver(w, r, b);
                free_bufs[n_free++] = b;
                if (rc) return rc;
                continue;
            }
            kvx_ioq_push(w->q, r);
            pushed++;
        }
        kvx_ioq_kick(w->q);
        double t = kvx_io_now();
        int got = kvx_ioq_reap(w->q, done, MAX_BUFS, cb ? 50 : 100);
        w->st.sync_s += kvx_io_now() - t;
        if (got < 0) return got;
        for (int i = 0; i < got; i++) {
            unsigned b = (unsigned)(uintptr_t)done[i]->owner;
            if (done[i]->status != KVX_ECANCELED && (rc = deliver(w, done[i], b))) return rc;
            free_bufs[n_free++] = b;
            finished++;
        }
        kvx_warmup_tick(w, cb, ctx, &next_cb);
    }
    return 0;
}

static int exec(kvx_warmup *w, void (*cb)(void *, const kvx_warmup_progress *), void *ctx)
{
    w->t0 = kvx_io_now();
    int rc = 0, canceled = 0, gpu = w->o.sink == KVX_SINK_GPU;
    kvx_io_run *done[MAX_BUFS];
    if (gpu && (rc = kvx_wgpu_begin(w))) goto out;
    if (gpu && w->gpu_path == KVX_GPU_PATH_MAPPED && (rc = kvx_wgpu_mapped(w, cb, ctx))) goto out;
    if ((rc = exec_staged(w, cb, ctx, &canceled))) goto out;
    if (!canceled && atomic_load(&w->a_cancel)) canceled = 1;
    if (gpu) {
        double t = kvx_io_now();
        rc = kvx_gpu_sync(w->o.gpu);
        w->st.sync_s += kvx_io_now() - t;
        if (!rc) rc = kvx_wgpu_end(w, canceled);
    }
out:
    if (rc) {
        snprintf(w->why, sizeof w->why, "%s", kvx_last_error());
        /* drain what the kernel may still write into staging, and what the
         * copy engine may still read from it */
        kvx_ioq_cancel(w->q);
        while (kvx_ioq_pending(w->q) > 0)
            if (kvx_ioq_reap(w->q, done, MAX_BUFS, -1) < 0) break;
        if (gpu) {
            kvx_gpu_sync(w->o.gpu);
            kvx_clear_error();
        }
    }
    w->seconds = kvx_io_now() - w->t0;
    if (canceled) w->rc = KVX_ECANCELED;
    if (!rc && gpu && w->n_pages) {
        uint64_t table;
        rc = kvx_gpu_page_table(&table, w->o.gpu, w->dev_pages, w->n_pages);
        if (!rc) w->gpu_base = table; /* reported as gpu_page_table */
    }
    if (rc && !w->why[0]) snprintf(w->why, sizeof w->why, "%s", kvx_last_error()); /* the page table's */
    w->rc = rc ? rc : (canceled ? KVX_ECANCELED : 0);
    atomic_store(&w->a_finished, 1);
    if (cb) {
        kvx_warmup_progress p;
        kvx_warmup_progress_now(&p, w);
        cb(ctx, &p);
    }
    return rc ? kvx_fail(rc, "%s", w->why) : 0; /* the reason, past the clean-up's calls */
}

static int fill_report(kvx_warmup_report *out, kvx_warmup *w)
{
    memset(out, 0, sizeof *out);
    out->bytes = w->good_bytes;
    out->pages = w->good_pages;
    out->crc_failures = atomic_load(&w->a_crc);
    out->io_failures = w->io_failures;
    out->bytes_read = w->bytes_read;
    out->seconds = w->seconds;
    out->gbps = w->seconds > 0 ? (double)w->good_bytes / w->seconds / 1e9 : 0;
    out->io_mode = kvx_ioq_mode(w->q);
    out->direct = kvx_ioq_used_direct(w->q);
    out->canceled = w->rc == KVX_ECANCELED;
    out->checksum = w->checksum;
    out->gpu_page_table = w->o.sink == KVX_SINK_GPU && w->n_pages ? w->gpu_base : 0;
    if (w->n_fails) {
        size_t strbytes = 0;
        for (size_t i = 0; i < w->n_fails; i++) strbytes += strlen(kvx_shard_path(w->shards[w->fails[i].shard])) + 1;
        kvx_warmup_failure *f = malloc(w->n_fails * sizeof *f + strbytes);
        if (!f) return kvx_fail(-ENOMEM, "warmup report: out of memory");
        char *s = (char *)(f + w->n_fails);
        for (size_t i = 0; i < w->n_fails; i++) {
            const char *path = kvx_shard_path(w->shards[w->fails[i].shard]);
            size_t len = strlen(path) + 1;
            memcpy(s, path, len);
            f[i] = (kvx_warmup_failure){s, w->fails[i].shard, w->fails[i].entry, w->fails[i].code};
            s += len;
        }
        out->failures = f;
        out->n_failures = w->n_fails;
    }
    return 0;
}

void kvx_warmup_report_free(kvx_warmup_report *r)
{
    if (!r) return;
    free(r->failures);
    r->failures = NULL;
    r->n_failures = 0;
}

int kvx_warmup_run(kvx_warmup_report *out, kvx_shard *const *shards, size_t n, const kvx_warmup_options *opts)
{
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_warmup_run: out is NULL");
    memset(out, 0, sizeof *out);
    kvx_warmup *w;
    int rc = warmup_new(&w, shards, n, opts);
    if (rc) return rc;
    rc = exec(w, w->o.progress, w->o.progress_ctx);
    if (!rc) rc = fill_report(out, w);
    warmup_free(w);
    return rc;
}

static void *bg_main(void *arg)
{
    kvx_warmup *w = arg;
    exec(w, NULL, NULL);
    pthread_mutex_lock(&w->mu);
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int kvx_warmup_start(kvx_warmup **out, kvx_shard *const *shards, size_t n, const kvx_warmup_options *opts)
{
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_warmup_start: out is NULL");
    kvx_warmup *w;
    int rc = warmup_new(&w, shards, n, opts);
    if (rc) return rc;
    w->o.progress = NULL;
    int e = pthread_create(&w->tid, NULL, bg_main, w);
    if (e) {
        warmup_free(w);
        return kvx_fail(-e, "kvx_warmup_start: pthread_create: %s", strerror(e));
    }
    w->started = 1;
    *out = w;
    return 0;
}

int kvx_warmup_get_progress(kvx_warmup_progress *out, kvx_warmup *w)
{
    if (!out || !w) return kvx_fail(KVX_EINVALID, "kvx_warmup_get_progress: a NULL argument");
    kvx_warmup_progress_now(out, w);
    return 0;
}

int kvx_warmup_cancel(kvx_warmup *w)
{
    if (!w) return kvx_fail(KVX_EINVALID, "kvx_warmup_cancel: warmup is NULL");
    atomic_store(&w->a_cancel, 1);
    return 0;
}

int kvx_warmup_wait(kvx_warmup_report *out, kvx_warmup *w, int timeout_ms)
{
    if (!out || !w) return kvx_fail(KVX_EINVALID, "kvx_warmup_wait: a NULL argument");
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&w->mu);
    double deadline = kvx_io_now() + (timeout_ms > 0 ? timeout_ms / 1000.0 : 0);
    while (!atomic_load(&w->a_finished)) {
        if (timeout_ms == 0) break;
        if (timeout_ms < 0) {
            pthread_cond_wait(&w->cv, &w->mu);
            continue;
        }
        double left = deadline - kvx_io_now();
        if (left <= 0) break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long ns = ts.tv_nsec + (long)(left * 1e9);
        ts.tv_sec += ns / 1000000000L;
        ts.tv_nsec = ns % 1000000000L;
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    pthread_mutex_unlock(&w->mu);
    if (!atomic_load(&w->a_finished)) return -ETIMEDOUT;
    if (w->started) {
        pthread_join(w->tid, NULL);
        w->started = 0;
    }
    if (w->rc && w->rc != KVX_ECANCELED) return kvx_fail(w->rc, "%s", w->why); /* the warmup thread's reason */
    return fill_report(out, w);
}

void kvx_warmup_destroy(kvx_warmup *w)
{
    if (!w) return;
    if (w->started) {
        atomic_store(&w->a_cancel, 1);
        pthread_join(w->tid, NULL);
    }
    warmup_free(w);
}

int kvx_warmup_device_pages(const uint64_t **out, size_t *out_n, kvx_warmup *w)
{
    if (!out || !out_n || !w) return kvx_fail(KVX_EINVALID, "kvx_warmup_device_pages: a NULL argument");
    if (!w->dev_pages) return kvx_fail(KVX_EINVALID, "kvx_warmup_device_pages: not a GPU warmup");
    if (!atomic_load(&w->a_finished)) return kvx_fail(KVX_EBUSY, "kvx_warmup_device_pages: still running");
    *out = w->dev_pages;
    *out_n = w->n_pages;
    return 0;
}

int kvx_warmup_get_stages(kvx_warmup_stages *out, kvx_warmup *w)
{
    if (!out || !w) return kvx_fail(KVX_EINVALID, "kvx_warmup_get_stages: a NULL argument");
    if (out->version < 1 || out->version > KVX_WARMUP_STAGES_VERSION)
        return kvx_fail(KVX_EVERSION, "kvx_warmup_stages.version is %u, expected %u", out->version,
                        KVX_WARMUP_STAGES_VERSION);
    if (!atomic_load(&w->a_finished)) return kvx_fail(KVX_EBUSY, "kvx_warmup_get_stages: still running");
    *out = w->st;
    out->version = KVX_WARMUP_STAGES_VERSION;
    out->gpu_path = w->o.sink == KVX_SINK_GPU ? w->gpu_path : 0;
    out->lanes = w->lanes;
    out->seconds = w->seconds;
    return 0;
}
