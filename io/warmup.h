/*
 * warmup.h - the state of one warmup, shared by warmup.c (planning, the
 * staging loop, host and discard sinks, the report) and warmup_gpu.c (the
 * GPU sink's paths: the registered file mapping, device landing buffers,
 * the CRC on the GPU). Not API.
 */
#ifndef KVX_WARMUP_H
#define KVX_WARMUP_H

#include "io.h"

#include "gpu_dev.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>

#define KVX_WARMUP_MAX_BUFS 64

typedef struct wpage {
    uint32_t shard, entry;
    uint64_t off, bytes, sink_off;
    uint32_t crc;
} wpage;

typedef struct wfail {
    uint32_t shard, entry;
    int code;
} wfail;

/* Where a page stands on the GPU side (w->pstate, input order). */
enum { PS_NONE = 0, PS_GPU = 1 /* handed to the GPU, verdict pending */ };

struct kvx_warmup {
    kvx_warmup_options o;
    kvx_shard **shards;
    size_t n_shards;
    wpage *pages; /* input order */
    size_t n_pages;
    kvx_io_page *rpages; /* run order; tag = index into pages */
    kvx_io_run *runs;
    size_t n_runs;
    uint32_t *staged; /* indexes of the runs the staging loop reads */
    size_t n_staged;
    uint64_t chunk;
    unsigned nbuf;
    kvx_pool *pool;
    kvx_ioq *q;
    uint8_t *bufs[KVX_WARMUP_MAX_BUFS];
    uint64_t sink_bytes;
    uint64_t gpu_base;
    uint64_t *dev_pages;
    /* results */
    wfail *fails;
    size_t n_fails, cap_fails;
    uint64_t good_bytes, good_pages, io_failures, bytes_read, checksum;
    double t0, seconds;
    int rc;
    char why[256]; /* rc's message, from the thread that ran it */
    /* progress, read by other threads */
    _Atomic uint64_t a_bytes, a_pages, a_crc;
    atomic_int a_cancel, a_finished;
    uint64_t bytes_total;
    int warm;       /* the data is in the page cache (resident_fraction) */
    int warm_pread; /* ... and KVX_IO_AUTO switched to the pread workers */
    unsigned qd;    /* reads in flight */
    unsigned lanes; /* CPU threads reading or checking */
    /* the GPU sink */
    int gpu_path;         /* the kvx_gpu_path in use (never AUTO) */
    int gpu_crc;          /* staged runs are checked on the GPU */
    uint8_t *pstate;      /* PS_*, input order */
    kvx_gpu_page *gpages; /* run order, the device's descriptors */
    uint64_t total_chunks;
    uint64_t d_pages, d_acc, d_status; /* device arrays, run order */
    uint64_t landing;                  /* device landing buffers: n_slots of slot_bytes */
    uint64_t slot_bytes;
    unsigned n_slots;
    kvx_gcrc_consts consts;
    kvx_warmup_stages st; /* stage timers and the fallback, filled as it runs */
    /* background thread */
    pthread_t tid;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

/* Names a failed page in the report; -ENOMEM when it cannot. */
static inline int kvx_warmup_add_fail(kvx_warmup *w, const wpage *p, int code)
{
    if (w->n_fails == w->cap_fails) {
        size_t nc = w->cap_fails ? w->cap_fails * 2 : 16;
        void *nf = realloc(w->fails, nc * sizeof *w->fails);
        if (!nf) return -ENOMEM;
        w->fails = (wfail *)nf;
        w->cap_fails = nc;
    }
    w->fails[w->n_fails++] = (wfail){p->shard, p->entry, code};
    return 0;
}

static inline void kvx_warmup_progress_now(kvx_warmup_progress *out, kvx_warmup *w)
{
    out->bytes_done = atomic_load(&w->a_bytes);
    out->bytes_total = w->bytes_total;
    out->pages_done = atomic_load(&w->a_pages);
    out->pages_total = w->n_pages;
    out->crc_failures = atomic_load(&w->a_crc);
    out->finished = atomic_load(&w->a_finished);
    out->seconds = out->finished ? w->seconds : (w->t0 > 0 ? kvx_io_now() - w->t0 : 0);
}

/* The progress callback, when one is due (every ~100 ms). */
static inline void kvx_warmup_tick(kvx_warmup *w, void (*cb)(void *, const kvx_warmup_progress *), void *ctx,
                                   double *next_cb)
{
    if (!cb || kvx_io_now() < *next_cb) return;
    kvx_warmup_progress p;
    kvx_warmup_progress_now(&p, w);
    cb(ctx, &p);
    *next_cb = kvx_io_now() + 0.1;
}

/* warmup_gpu.c */
/* MAPPED: bytes of file per window (64 MiB; at least a run and a page);
 * tests make it small to see many windows through three slots. */
extern uint64_t kvx_wgpu_window_bytes;
/* The path for KVX_SINK_GPU (resolves AUTO); 0 or KVX_EINVALID. */
int kvx_wgpu_choose(kvx_warmup *w);
/* Before the loops: the device arrays and landing buffers of a GPU-CRC
 * path. Where the device has no memory for them, the warmup falls back to
 * STAGING (recorded in w->st), 0 returned. */
int kvx_wgpu_begin(kvx_warmup *w);
/* MAPPED: every window of runs the driver lets us register goes
 * file mapping -> device landing -> CRC kernel -> sink; the runs of the
 * others are left in w->staged for the staging loop. */
int kvx_wgpu_mapped(kvx_warmup *w, void (*cb)(void *, const kvx_warmup_progress *), void *ctx);
/* A staged run landed in staging buffer b: to the GPU (STAGING: its good
 * pages into the arena; STAGING_GPU_CRC: the whole run into landing slot
 * b, then the CRC kernel). */
int kvx_wgpu_deliver(kvx_warmup *w, kvx_io_run *r, unsigned b);
/* Waits for buffer b's copies before its reuse (stage times added). */
int kvx_wgpu_wait(kvx_warmup *w, unsigned b);
/* After the loops and the final sync: the GPU's verdicts read back, pages
 * delivered or failed, w->dev_pages filled. */
int kvx_wgpu_end(kvx_warmup *w, int canceled);
void kvx_wgpu_free(kvx_warmup *w);

#endif
