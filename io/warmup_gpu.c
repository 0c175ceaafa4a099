/*
 * warmup_gpu.c - how a warmup's pages reach the GPU (kvx_gpu_path).
 *
 *  STAGING          the staging loop of warmup.c reads runs into pinned
 *                   buffers; the CPU lanes check each page's CRC-32 as its
 *                   bytes land (fused into the read); the copy engine
 *                   moves the good pages into the arena. A bad page never
 *                   leaves the host.
 *  STAGING_GPU_CRC  the same reads, no CPU check: the whole run goes to a
 *                   device landing slot, the CRC kernel checks its pages
 *                   there, and only the pages that passed are copied (on
 *                   the device) into the arena.
 *  MAPPED           no CPU pass over the bytes at all: runs are grouped in
 *                   windows of up to 64 MiB of one file; each window's
 *                   pages are mapped (a fresh read-only MAP_SHARED mapping
 *                   of the file, so two warmups of one shard never register
 *                   the same range twice) and registered with the driver
 *                   read-only (cudaHostRegisterReadOnly); the copy engine
 *                   reads them straight from the page cache into a landing
 *                   slot, then the CRC kernel and the gather as above.
 *                   Three slots: the next window is mapped and registered
 *                   while one copies and one is checked. A window the
 *                   driver refuses (or whose mapping fails) and every
 *                   window after it go through STAGING (CPU CRC), and the
 *                   refusal is reported (kvx_warmup_stages.fallback).
 *
 * Whatever the path, a page counts as delivered (its page-table slot set,
 * reported good) only when the host has its verdict: the CPU's, or the
 * GPU's read back after the final sync. A page the GPU found bad keeps
 * slot 0 and its arena range untouched (the gather skips it).
 * Device memory beyond the arena: landing slots (3 x 64 MiB for MAPPED,
 * queue_depth + 2 runs for STAGING_GPU_CRC) and 48 bytes per page; when
 * the device cannot give it, the warmup runs STAGING (reported).
 */
#include "warmup.h"

#include "common/os.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>

#define MAPPED_SLOTS 3u

uint64_t kvx_wgpu_window_bytes = (uint64_t)64 << 20;
#define HOST_PAGE 4096u

const char *kvx_gpu_path_name(int path)
{
    switch (path) {
    case KVX_GPU_PATH_AUTO: return "auto";
    case KVX_GPU_PATH_STAGING: return "staging";
    case KVX_GPU_PATH_STAGING_GPU_CRC: return "staging-gpu-crc";
    case KVX_GPU_PATH_MAPPED: return "mapped";
    }
    return "unknown";
}

/* The whole warmup goes through STAGING from now on: why, recorded once. */
static void fall_back(kvx_warmup *w, int code)
{
    if (w->st.fallback) return;
    w->st.fallback = code;
    snprintf(w->st.fallback_why, sizeof w->st.fallback_why, "%s", kvx_last_error());
    kvx_clear_error();
}

static void free_device(kvx_warmup *w)
{
    kvx_gpu *g = w->o.gpu;
    kvx_gpu_free(g, w->d_pages);
    kvx_gpu_free(g, w->d_acc);
    kvx_gpu_free(g, w->d_status);
    kvx_gpu_free(g, w->landing);
    w->d_pages = w->d_acc = w->d_status = w->landing = 0;
}

int kvx_wgpu_choose(kvx_warmup *w)
{
    int path = w->o.gpu_path;
    if (path == KVX_GPU_PATH_AUTO) path = w->warm ? KVX_GPU_PATH_MAPPED : KVX_GPU_PATH_STAGING;
    w->gpu_path = path;
    w->gpu_crc = path == KVX_GPU_PATH_STAGING_GPU_CRC;
    if (path == KVX_GPU_PATH_STAGING || w->n_pages == 0) return 0;
    uint64_t span = HOST_PAGE; /* a window's mapped bytes never exceed its pages' 4 KiB pages */
    for (size_t i = 0; i < w->n_pages; i++) span += kvx_align_up(w->pages[i].bytes, HOST_PAGE);
    if (path == KVX_GPU_PATH_MAPPED) {
        w->n_slots = MAPPED_SLOTS;
        uint64_t win = kvx_wgpu_window_bytes;
        w->slot_bytes = win > w->chunk + HOST_PAGE ? win : w->chunk + HOST_PAGE;
        if (w->slot_bytes > span) w->slot_bytes = span;
    } else {
        w->n_slots = w->nbuf;
        w->slot_bytes = w->chunk;
    }
    w->slot_bytes = kvx_align_up(w->slot_bytes, 256);
    kvx_gpu *g = w->o.gpu;
    uint64_t n = w->n_pages;
    int rc = kvx_gpu_alloc(&w->d_pages, g, n * sizeof(kvx_gpu_page));
    if (!rc) rc = kvx_gpu_alloc(&w->d_acc, g, n * 4);
    if (!rc) rc = kvx_gpu_alloc(&w->d_status, g, n * 4);
    if (!rc) rc = kvx_gpu_alloc(&w->landing, g, (uint64_t)w->n_slots * w->slot_bytes);
    w->pstate = calloc(n, 1);
    w->gpages = calloc(n, sizeof *w->gpages);
    if (!rc && (!w->pstate || !w->gpages)) return kvx_fail(-ENOMEM, "warmup: out of memory");
    if (rc) {
        /* the device cannot hold landing buffers: the CPU checks instead */
        kvx_fail_prefix(rc, "GPU warmup (%s): device memory for %u landing buffers of %" PRIu64 " bytes",
                        kvx_gpu_path_name(path), w->n_slots, w->slot_bytes);
        fall_back(w, rc);
        free_device(w);
        w->gpu_path = KVX_GPU_PATH_STAGING;
        w->gpu_crc = 0;
    }
    return 0;
}

int kvx_wgpu_begin(kvx_warmup *w)
{
    if (!w->landing) return 0;
    kvx_gcrc_consts_init(&w->consts);
    uint64_t chunks = 0;
    for (size_t k = 0; k < w->n_pages; k++) { /* run order: runs' pages are consecutive in rpages */
        const wpage *p = &w->pages[w->rpages[k].tag];
        w->gpages[k] = (kvx_gpu_page){p->off, p->bytes, w->gpu_base + p->sink_off, chunks, p->crc, w->rpages[k].tag};
        chunks += kvx_gcrc_nchunks(p->bytes);
    }
    w->total_chunks = chunks;
    kvx_gpu *g = w->o.gpu;
    int rc = kvx_gpu_h2d(g, w->d_pages, w->gpages, w->n_pages * sizeof *w->gpages);
    if (!rc) rc = kvx_gpu_lane_memset(g, 0, w->d_acc, 0, w->n_pages * 4);
    if (!rc) rc = kvx_gpu_lane_memset(g, 0, w->d_status, 0, w->n_pages * 4);
    if (!rc) rc = kvx_gpu_sync(g);
    return rc;
}

/* The job of pages [p0, p1) (run order) landed at landing, window at win_off. */
static kvx_gpu_crc_job job_of(kvx_warmup *w, uint32_t p0, uint32_t p1, uint64_t landing, uint64_t win_off)
{
    kvx_gpu_crc_job j;
    memset(&j, 0, sizeof j);
    j.pages = w->d_pages;
    j.acc = w->d_acc;
    j.status = w->d_status;
    j.landing = landing;
    j.win_off = win_off;
    j.p0 = p0;
    j.p1 = p1;
    j.c0 = w->gpages[p0].chunk0;
    j.nc = w->gpages[p1 - 1].chunk0 + kvx_gcrc_nchunks(w->gpages[p1 - 1].bytes) - j.c0;
    j.verify = !(w->o.flags & KVX_WARMUP_NO_VERIFY);
    j.consts = w->consts;
    return j;
}

/* Pages [p0, p1) handed to the GPU: verdicts pending, progress counted. */
static void handed(kvx_warmup *w, uint32_t p0, uint32_t p1, uint64_t *bytes)
{
    for (uint32_t k = p0; k < p1; k++) {
        w->pstate[w->gpages[k].tag] = PS_GPU;
        *bytes += w->gpages[k].bytes;
        atomic_fetch_add(&w->a_bytes, w->gpages[k].bytes);
        atomic_fetch_add(&w->a_pages, 1);
    }
}

/* Queues lane's copy of bytes at src to landing, then the job's kernels,
 * fenced by the lane's events (start, mid, end). */
static int launch(kvx_warmup *w, unsigned lane, uint64_t landing, const void *src, uint64_t bytes,
                  const kvx_gpu_crc_job *job)
{
    kvx_gpu *g = w->o.gpu;
    int rc = kvx_gpu_lane_mark(g, lane, 0);
    if (!rc) rc = kvx_gpu_copy_lane_any(g, lane, landing, src, bytes);
    if (!rc) rc = kvx_gpu_lane_mark(g, lane, 1);
    if (!rc) rc = kvx_gpu_lane_crc(g, lane, job);
    if (!rc) rc = kvx_gpu_lane_record(g, lane);
    return rc;
}

/* --- MAPPED --- */

typedef struct slot {
    void *map;
    uint64_t len;
    int busy;
} slot;

/* Waits for slot s's window (copy and kernels), then lets its mapping go. */
static int release(kvx_warmup *w, slot *sl, unsigned s)
{
    if (!sl->busy) return 0;
    double t = kvx_io_now();
    int rc = kvx_gpu_lane_wait_timed(w->o.gpu, s, &w->st.h2d_s, &w->st.crc_gpu_s);
    double t2 = kvx_io_now();
    w->st.sync_s += t2 - t;
    kvx_gpu_host_unregister(sl->map);
    kvx_os.munmap(sl->map, sl->len);
    w->st.register_s += kvx_io_now() - t2;
    sl->busy = 0;
    return rc;
}

/* A fresh read-only mapping of [off, off + len) of fd, registered with
 * the driver read-only; 0, or the refusal (mapping unmapped). */
static int map_window(kvx_warmup *w, int fd, uint64_t off, uint64_t len, void **out)
{
    double t = kvx_io_now();
    int rc = 0;
    void *m = kvx_os.mmap(NULL, (size_t)len, PROT_READ, MAP_SHARED, fd, (off_t)off);
    if (m == MAP_FAILED) {
        rc = kvx_fail(-errno, "GPU warmup: mmap of %" PRIu64 " bytes at %" PRIu64 ": %s", len, off, strerror(errno));
    } else if ((rc = kvx_gpu_host_register_ro(m, len, kvx_gpu_device(w->o.gpu)))) {
        kvx_os.munmap(m, (size_t)len);
    }
    w->st.register_s += kvx_io_now() - t;
    *out = rc ? NULL : m;
    return rc;
}

/* First index past the pages of [p0, p1) that lie inside a file of size
 * bytes (the pages are sorted by offset: those past its end are last). */
static uint32_t in_file(const kvx_warmup *w, uint32_t p0, uint32_t p1, uint64_t size)
{
    while (p1 > p0 && w->gpages[p1 - 1].off + w->gpages[p1 - 1].bytes > size) p1--;
    return p1;
}

int kvx_wgpu_mapped(kvx_warmup *w, void (*cb)(void *, const kvx_warmup_progress *), void *ctx)
{
    if (!w->landing) return 0; /* fell back to STAGING already */
    double next_cb = kvx_io_now() + 0.1;
    slot sl[MAPPED_SLOTS];
    memset(sl, 0, sizeof sl);
    size_t n_keep = 0, i = 0;
    unsigned k = 0;
    int rc = 0;
    while (i < w->n_runs && !rc) {
        kvx_io_run *r0 = &w->runs[i];
        if (atomic_load(&w->a_cancel)) break; /* the rest is neither mapped nor staged */
        if (!r0->file || w->st.fallback) {    /* no file (a tier view's pages), or refused */
            w->staged[n_keep++] = (uint32_t)i++;
            continue;
        }
        /* the window: runs of one file while its pages' 4 KiB span fits a slot */
        uint32_t p0 = (uint32_t)(r0->pages - w->rpages);
        uint64_t a = w->gpages[p0].off & ~(uint64_t)(HOST_PAGE - 1);
        size_t j = i + 1;
        while (j < w->n_runs && w->runs[j].file == r0->file) {
            const kvx_io_run *rj = &w->runs[j];
            const kvx_gpu_page *last = &w->gpages[(rj->pages - w->rpages) + rj->n_pages - 1];
            if (kvx_align_up(last->off + last->bytes, HOST_PAGE) - a > w->slot_bytes) break;
            j++;
        }
        const kvx_io_run *rl = &w->runs[j - 1];
        uint32_t p1 = (uint32_t)(rl->pages - w->rpages) + rl->n_pages;
        struct stat st;
        uint32_t pm = p1;
        if (kvx_os.fstat(r0->file->bfd, &st) == 0) pm = in_file(w, p0, p1, (uint64_t)st.st_size);
        void *m = NULL;
        uint64_t len = 0;
        unsigned s = k % MAPPED_SLOTS;
        if (pm > p0) {
            len = kvx_align_up(w->gpages[pm - 1].off + w->gpages[pm - 1].bytes, HOST_PAGE) - a;
            if ((rc = release(w, &sl[s], s))) break;
            int refused = map_window(w, r0->file->bfd, a, len, &m);
            if (refused) {
                fall_back(w, refused);
                continue; /* this window's runs, and the rest, through staging */
            }
        }
        /* pages past the end of the file (truncated since open): failed here */
        for (uint32_t q = pm; q < p1 && !rc; q++) {
            const wpage *p = &w->pages[w->gpages[q].tag];
            w->io_failures++;
            if (kvx_warmup_add_fail(w, p, KVX_ETRUNC)) rc = kvx_fail(-ENOMEM, "warmup: out of memory");
            atomic_fetch_add(&w->a_bytes, p->bytes);
            atomic_fetch_add(&w->a_pages, 1);
        }
        if (m) {
            uint64_t landing = w->landing + (uint64_t)s * w->slot_bytes;
            kvx_gpu_crc_job job = job_of(w, p0, pm, landing, a);
            sl[s] = (slot){m, len, 1};
            if (!rc) rc = launch(w, s, landing, m, len, &job);
            if (!rc) handed(w, p0, pm, &w->st.mapped_bytes);
            k++;
        }
        i = j;
        kvx_warmup_tick(w, cb, ctx, &next_cb);
    }
    char why[256] = "";
    if (rc) { /* a launch failed: nothing may still read a mapping we let go */
        snprintf(why, sizeof why, "%s", kvx_last_error());
        kvx_gpu_sync(w->o.gpu);
    }
    for (unsigned s = 0; s < MAPPED_SLOTS; s++) {
        int r2 = release(w, &sl[s], s);
        if (!rc) rc = r2;
    }
    w->n_staged = n_keep;
    return why[0] ? kvx_fail(rc, "%s", why) : rc;
}

/* --- staged runs --- */

int kvx_wgpu_wait(kvx_warmup *w, unsigned b)
{
    double t = kvx_io_now();
    int rc = kvx_gpu_lane_wait_timed(w->o.gpu, b, &w->st.h2d_s, &w->st.crc_gpu_s);
    w->st.sync_s += kvx_io_now() - t;
    return rc;
}

/* A page the host found bad (CRC on the CPU, or a read that failed). */
static int host_failed(kvx_warmup *w, const kvx_io_page *pg)
{
    wpage *p = &w->pages[pg->tag];
    if (pg->status == KVX_EPAGECRC)
        atomic_fetch_add(&w->a_crc, 1);
    else
        w->io_failures++;
    atomic_fetch_add(&w->a_bytes, p->bytes);
    atomic_fetch_add(&w->a_pages, 1);
    return kvx_warmup_add_fail(w, p, pg->status) ? kvx_fail(-ENOMEM, "warmup: out of memory") : 0;
}

int kvx_wgpu_deliver(kvx_warmup *w, kvx_io_run *r, unsigned b)
{
    kvx_gpu *g = w->o.gpu;
    int rc = 0;
    if (!w->gpu_crc) { /* STAGING: the CPU checked; good pages to the arena */
        int used = 0;
        for (uint32_t k = 0; k < r->n_pages && !rc; k++) {
            const kvx_io_page *pg = &r->pages[k];
            wpage *p = &w->pages[pg->tag];
            if (pg->status) {
                rc = host_failed(w, pg);
                continue;
            }
            uint64_t dev = w->gpu_base + p->sink_off;
            if (!used) rc = kvx_gpu_lane_mark(g, b, 0);
            if (!rc) rc = kvx_gpu_copy_lane(g, b, dev, r->buf + pg->rel, p->bytes);
            if (rc) break;
            used = 1;
            w->dev_pages[pg->tag] = dev;
            w->good_bytes += p->bytes;
            w->good_pages++;
            w->st.staged_bytes += p->bytes;
            atomic_fetch_add(&w->a_bytes, p->bytes);
            atomic_fetch_add(&w->a_pages, 1);
        }
        if (used && !rc) rc = kvx_gpu_lane_record(g, b);
        return rc;
    }
    /* STAGING_GPU_CRC: the pages that landed (a prefix of the run: a short
     * or failed read loses its tail) go to the GPU, unchecked here */
    uint32_t m = 0;
    while (m < r->n_pages && r->pages[m].status == 0) m++;
    for (uint32_t k = m; k < r->n_pages && !rc; k++) rc = host_failed(w, &r->pages[k]);
    if (rc || m == 0) return rc;
    uint32_t p0 = (uint32_t)(r->pages - w->rpages);
    uint64_t landing = w->landing + (uint64_t)b * w->slot_bytes;
    kvx_gpu_crc_job job = job_of(w, p0, p0 + m, landing, r->off);
    const kvx_io_page *last = &r->pages[m - 1];
    if ((rc = launch(w, b, landing, r->buf, last->rel + last->bytes, &job))) return rc;
    handed(w, p0, p0 + m, &w->st.staged_bytes);
    return 0;
}

int kvx_wgpu_end(kvx_warmup *w, int canceled)
{
    for (unsigned b = 0; b < w->nbuf; b++) { /* events all fired: their times */
        int rc = kvx_wgpu_wait(w, b);
        if (rc) return rc;
    }
    if (!w->pstate || !w->landing) return 0;
    size_t n = w->n_pages, any = 0;
    for (size_t i = 0; i < n; i++) any += w->pstate[i] == PS_GPU;
    if (!any) return 0;
    uint32_t *status = malloc(n * 4);
    if (!status) return kvx_fail(-ENOMEM, "warmup: out of memory");
    int rc = kvx_gpu_d2h(status, w->o.gpu, w->d_status, n * 4);
    for (size_t k = 0; k < n && !rc; k++) {
        const kvx_gpu_page *gp = &w->gpages[k];
        if (w->pstate[gp->tag] != PS_GPU) continue;
        const wpage *p = &w->pages[gp->tag];
        if (status[k] == KVX_GPU_PAGE_GOOD) {
            w->dev_pages[gp->tag] = gp->dst;
            w->good_bytes += p->bytes;
            w->good_pages++;
        } else if (status[k] == KVX_GPU_PAGE_BAD) {
            atomic_fetch_add(&w->a_crc, 1);
            if (kvx_warmup_add_fail(w, p, KVX_EPAGECRC)) rc = kvx_fail(-ENOMEM, "warmup: out of memory");
        } else if (!canceled) { /* handed over, never judged: not delivered */
            w->io_failures++;
            if (kvx_warmup_add_fail(w, p, -EIO)) rc = kvx_fail(-ENOMEM, "warmup: out of memory");
        }
    }
    free(status);
    return rc;
}

void kvx_wgpu_free(kvx_warmup *w)
{
    if (w->o.gpu) free_device(w);
    free(w->pstate);
    free(w->gpages);
}
