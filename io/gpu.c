/*
 * gpu.c - GPU upload: a device arena (one allocation, bump-reserved), copy
 * lanes (a stream each, round-robin, with events that fence a staging
 * buffer's reuse and time its copies and kernels), the device page table,
 * copy-back for verification.
 *
 * Every device call goes through the seam kvx_gpu_dev (gpu_dev.h): the
 * CUDA runtime in a build with the toolkit (gpu_cuda.c), KVX_ENOCUDA
 * without (gpu_nocuda.c), a host-memory fake in tests. So this file, the
 * CPU side of the GPU path, is the same code in every build and is tested
 * without a GPU.
 */
#include "io.h"

#include "common/os.h"
#include "gpu_dev.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#define KVX_GPU_MAX_STREAMS 16
#define KVX_GPU_ALIGN 256u

enum { EV_START = 0, EV_MID = 1, EV_END = 2 };

struct kvx_gpu {
    int device;
    uint64_t arena;
    uint64_t arena_bytes;
    uint64_t used;
    unsigned n_streams;
    void *streams[KVX_GPU_MAX_STREAMS];
    struct gpu_lane {
        void *ev[3];     /* timing events: start, mid (copies done), end (all done) */
        unsigned marked; /* bit per event recorded since the last wait */
    } lanes[KVX_GPU_MAX_LANES];
};

/* The current device belongs to the calling thread: a warmup's own thread
 * starts on device 0 (its events were made there and recorded on another
 * device's streams: cudaEventRecord failed, and GPU 0 got a context), and
 * an engine's thread works on its own GPU. Every call switches to the
 * handle's device for its device work and back before it returns, so kvx
 * never leaves a caller's thread on another GPU. Checked by reading: the
 * one-GPU machines here cannot show two devices. */
int kvx_gpu_dev_enter(kvx_gpu_dev_scope *sc, int device)
{
    sc->switched = 0;
    if (kvx_gpu_dev.get_device(&sc->prev)) {
        kvx_clear_error();
        sc->prev = -1;
    }
    if (sc->prev == device) return 0;
    int rc = kvx_gpu_dev.set_device(device);
    if (rc) return rc;
    sc->switched = 1;
    return 0;
}

void kvx_gpu_dev_leave(const kvx_gpu_dev_scope *sc)
{
    if (sc->switched && sc->prev >= 0) kvx_gpu_dev.set_device(sc->prev);
}

/* Every public call starts here: KVX_ENOCUDA without CUDA, whatever the
 * arguments (IO-15). */
#define NEED_CUDA()                      \
    do {                                 \
        int rc_ = kvx_gpu_dev.present(); \
        if (rc_) return rc_;             \
    } while (0)

int kvx_gpu_count(int *out)
{
    NEED_CUDA();
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_gpu_count: out is NULL");
    int n = 0;
    int rc = kvx_gpu_dev.count(&n);
    if (rc == KVX_ENOCUDA) {
        *out = 0;
        return rc;
    }
    if (rc) { /* no driver, no device: none usable */
        kvx_clear_error();
        n = 0;
    }
    *out = n;
    return 0;
}

int kvx_gpu_need_device(int device)
{
    int n = 0;
    int rc = kvx_gpu_dev.count(&n);
    if (rc) return rc;
    if (n == 0) return kvx_fail(KVX_ENOGPU, "no usable GPU: cudaGetDeviceCount found none");
    if (device < 0 || device >= n)
        return kvx_fail(KVX_ENOGPU, "no usable GPU: device %d does not exist (%d visible)", device, n);
    return 0;
}

int kvx_gpu_numa_node(int *out_node, int device)
{
    NEED_CUDA();
    if (!out_node) return kvx_fail(KVX_EINVALID, "kvx_gpu_numa_node: out_node is NULL");
    *out_node = -1;
    int rc = kvx_gpu_need_device(device);
    if (rc) return rc;
    char bus[64];
    if ((rc = kvx_gpu_dev.pci_bus_id(bus, sizeof bus, device))) return rc;
    unsigned dom, b, d, f;
    if (sscanf(bus, "%x:%x:%x.%x", &dom, &b, &d, &f) != 4)
        return kvx_fail(KVX_ENOTFOUND, "GPU %d: cannot parse PCI bus id '%s'", device, bus);
    char path[128];
    snprintf(path, sizeof path, "/sys/bus/pci/devices/%04x:%02x:%02x.%x/numa_node", dom, b, d, f);
    char text[32];
    if ((rc = kvx_os_read_text(path, text, sizeof text)))
        return kvx_fail(KVX_ENOTFOUND, "GPU %d: %s: %s", device, path, strerror(-rc));
    int node = -1;
    if (sscanf(text, "%d", &node) != 1) node = -1;
    *out_node = node; /* -1: the platform does not say */
    return 0;
}

static int gpu_make(kvx_gpu **out, const kvx_gpu_options *opts);

int kvx_gpu_create(kvx_gpu **out, const kvx_gpu_options *opts)
{
    NEED_CUDA();
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_gpu_create: out is NULL");
    *out = NULL;
    kvx_gpu_options def = KVX_GPU_OPTIONS_INIT;
    if (!opts) opts = &def;
    if (opts->version != KVX_GPU_OPTIONS_VERSION)
        return kvx_fail(KVX_EVERSION, "kvx_gpu_options.version is %u, expected %u", opts->version,
                        KVX_GPU_OPTIONS_VERSION);
    if (opts->streams > KVX_GPU_MAX_STREAMS)
        return kvx_fail(KVX_EINVALID, "kvx_gpu_options.streams %u is above %d", opts->streams, KVX_GPU_MAX_STREAMS);
    int rc = kvx_gpu_need_device(opts->device);
    if (rc) return rc;
    kvx_gpu_dev_scope sc;
    if ((rc = kvx_gpu_dev_enter(&sc, opts->device))) return rc;
    rc = gpu_make(out, opts);
    kvx_gpu_dev_leave(&sc);
    return rc;
}

/* kvx_gpu_create's allocations, on opts->device. */
static int gpu_make(kvx_gpu **out, const kvx_gpu_options *opts)
{
    kvx_gpu *g = calloc(1, sizeof *g);
    if (!g) return kvx_fail(-ENOMEM, "kvx_gpu_create: out of memory");
    g->device = opts->device;
    g->arena_bytes = kvx_align_up(opts->arena_bytes ? opts->arena_bytes : (uint64_t)256 << 20, KVX_GPU_ALIGN);
    g->n_streams = opts->streams ? opts->streams : 4;
    int rc = kvx_gpu_dev.malloc(&g->arena, g->arena_bytes);
    if (rc) {
        free(g);
        return kvx_fail_prefix(rc, "kvx_gpu_create: the arena");
    }
    for (unsigned i = 0; i < g->n_streams; i++) {
        if ((rc = kvx_gpu_dev.stream_create(&g->streams[i]))) {
            g->n_streams = i;
            kvx_gpu_destroy(g);
            return rc;
        }
    }
    *out = g;
    return 0;
}

void kvx_gpu_destroy(kvx_gpu *g)
{
    if (!g || kvx_gpu_dev.present()) return;
    kvx_gpu_dev_scope sc;
    int entered = kvx_gpu_dev_enter(&sc, g->device) == 0;
    for (unsigned i = 0; i < g->n_streams; i++) {
        kvx_gpu_dev.stream_sync(g->streams[i]);
        kvx_gpu_dev.stream_destroy(g->streams[i]);
    }
    for (unsigned i = 0; i < KVX_GPU_MAX_LANES; i++)
        for (unsigned k = 0; k < 3; k++)
            if (g->lanes[i].ev[k]) kvx_gpu_dev.event_destroy(g->lanes[i].ev[k]);
    if (g->arena) kvx_gpu_dev.free(g->arena);
    if (entered) kvx_gpu_dev_leave(&sc);
    free(g);
}

int kvx_gpu_reserve(uint64_t *out_dev, kvx_gpu *g, uint64_t bytes)
{
    NEED_CUDA();
    if (!out_dev || !g) return kvx_fail(KVX_EINVALID, "kvx_gpu_reserve: out_dev or gpu is NULL");
    *out_dev = 0;
    if (bytes > g->arena_bytes - g->used) /* before rounding: near 2^64 it would wrap to 0 */
        return kvx_fail(KVX_ECAPACITY,
                        "GPU arena: %" PRIu64 " bytes wanted, %" PRIu64 " of %" PRIu64
                        " free; use a larger kvx_gpu_options.arena_bytes",
                        bytes, g->arena_bytes - g->used, g->arena_bytes);
    uint64_t need = kvx_align_up(bytes ? bytes : 1, KVX_GPU_ALIGN);
    if (need > g->arena_bytes - g->used)
        return kvx_fail(KVX_ECAPACITY,
                        "GPU arena: %" PRIu64 " bytes wanted, %" PRIu64 " of %" PRIu64
                        " free; use a larger kvx_gpu_options.arena_bytes",
                        need, g->arena_bytes - g->used, g->arena_bytes);
    *out_dev = g->arena + g->used;
    g->used += need;
    return 0;
}

void kvx_gpu_reset(kvx_gpu *g)
{
    if (g && !kvx_gpu_dev.present()) g->used = 0;
}

int kvx_gpu_device(const kvx_gpu *g) { return g && !kvx_gpu_dev.present() ? g->device : -1; }

static int in_arena(const kvx_gpu *g, uint64_t dev, uint64_t bytes)
{
    return dev >= g->arena && bytes <= g->arena_bytes && dev - g->arena <= g->arena_bytes - bytes;
}

void *kvx_gpu_lane_stream(kvx_gpu *g, unsigned lane) { return g->streams[lane % g->n_streams]; }

int kvx_gpu_copy_lane_any(kvx_gpu *g, unsigned lane, uint64_t dev, const void *src, uint64_t bytes)
{
    kvx_gpu_dev_scope sc;
    int rc = kvx_gpu_dev_enter(&sc, g->device);
    if (rc) return rc;
    rc = kvx_gpu_dev.h2d_async(dev, src, bytes, kvx_gpu_lane_stream(g, lane));
    kvx_gpu_dev_leave(&sc);
    return rc;
}

int kvx_gpu_copy_lane(kvx_gpu *g, unsigned lane, uint64_t dev, const void *src, uint64_t bytes)
{
    if (!in_arena(g, dev, bytes))
        return kvx_fail(KVX_EINVALID, "GPU upload: device range 0x%" PRIx64 "+%" PRIu64 " is outside the arena", dev,
                        bytes);
    return kvx_gpu_copy_lane_any(g, lane, dev, src, bytes);
}

int kvx_gpu_lane_mark(kvx_gpu *g, unsigned lane, unsigned which)
{
    if (lane >= KVX_GPU_MAX_LANES || which > EV_END) return kvx_fail(KVX_EINVALID, "GPU lane %u out of range", lane);
    struct gpu_lane *l = &g->lanes[lane];
    kvx_gpu_dev_scope sc;
    int rc = kvx_gpu_dev_enter(&sc, g->device); /* an event is made on its stream's device */
    if (rc) return rc;
    if (!l->ev[which]) rc = kvx_gpu_dev.event_create(&l->ev[which], 1);
    if (!rc) rc = kvx_gpu_dev.event_record(l->ev[which], kvx_gpu_lane_stream(g, lane));
    kvx_gpu_dev_leave(&sc);
    if (!rc) l->marked |= 1u << which;
    return rc;
}

int kvx_gpu_lane_record(kvx_gpu *g, unsigned lane) { return kvx_gpu_lane_mark(g, lane, EV_END); }

static double elapsed(void *a, void *b)
{
    float ms = 0;
    if (kvx_gpu_dev.event_elapsed(&ms, a, b)) {
        kvx_clear_error();
        return 0;
    }
    return ms > 0 ? ms / 1e3 : 0;
}

int kvx_gpu_lane_wait_timed(kvx_gpu *g, unsigned lane, double *copy_s, double *kernel_s)
{
    if (lane >= KVX_GPU_MAX_LANES) return 0;
    struct gpu_lane *l = &g->lanes[lane];
    if (!(l->marked & (1u << EV_END))) return 0;
    int rc = kvx_gpu_dev.event_sync(l->ev[EV_END]);
    if (!rc && (l->marked & (1u << EV_START))) {
        /* start -> mid: the copies; mid -> end: the kernels (when marked) */
        int mid = (l->marked & (1u << EV_MID)) != 0;
        if (copy_s) *copy_s += elapsed(l->ev[EV_START], l->ev[mid ? EV_MID : EV_END]);
        if (kernel_s && mid) *kernel_s += elapsed(l->ev[EV_MID], l->ev[EV_END]);
    }
    l->marked = 0;
    return rc;
}

int kvx_gpu_lane_wait(kvx_gpu *g, unsigned lane) { return kvx_gpu_lane_wait_timed(g, lane, NULL, NULL); }

int kvx_gpu_lane_crc(kvx_gpu *g, unsigned lane, const kvx_gpu_crc_job *job)
{
    kvx_gpu_dev_scope sc;
    int rc = kvx_gpu_dev_enter(&sc, g->device);
    if (rc) return rc;
    rc = kvx_gpu_dev.crc_pages(job, kvx_gpu_lane_stream(g, lane));
    kvx_gpu_dev_leave(&sc);
    return rc;
}

int kvx_gpu_lane_memset(kvx_gpu *g, unsigned lane, uint64_t dev, int byte, uint64_t bytes)
{
    kvx_gpu_dev_scope sc;
    int rc = kvx_gpu_dev_enter(&sc, g->device);
    if (rc) return rc;
    rc = kvx_gpu_dev.memset_async(dev, byte, bytes, kvx_gpu_lane_stream(g, lane));
    kvx_gpu_dev_leave(&sc);
    return rc;
}

int kvx_gpu_alloc(uint64_t *out, kvx_gpu *g, uint64_t bytes)
{
    kvx_gpu_dev_scope sc;
    int rc = kvx_gpu_dev_enter(&sc, g->device);
    if (rc) return rc;
    rc = kvx_gpu_dev.malloc(out, bytes);
    kvx_gpu_dev_leave(&sc);
    return rc;
}

void kvx_gpu_free(kvx_gpu *g, uint64_t dev)
{
    if (!dev) return;
    kvx_gpu_dev_scope sc;
    int entered = kvx_gpu_dev_enter(&sc, g->device) == 0;
    kvx_gpu_dev.free(dev);
    if (entered) kvx_gpu_dev_leave(&sc);
}

int kvx_gpu_h2d(kvx_gpu *g, uint64_t dev, const void *src, uint64_t bytes)
{
    kvx_gpu_dev_scope sc;
    int rc = kvx_gpu_dev_enter(&sc, g->device);
    if (rc) return rc;
    rc = kvx_gpu_dev.h2d(dev, src, bytes);
    kvx_gpu_dev_leave(&sc);
    return rc;
}

int kvx_gpu_d2h(void *dst, kvx_gpu *g, uint64_t dev, uint64_t bytes)
{
    kvx_gpu_dev_scope sc;
    int rc = kvx_gpu_dev_enter(&sc, g->device);
    if (rc) return rc;
    rc = kvx_gpu_dev.d2h(dst, dev, bytes);
    kvx_gpu_dev_leave(&sc);
    return rc;
}

int kvx_gpu_upload(kvx_gpu *g, const uint64_t *dev, const void *const *src, const uint64_t *bytes, size_t n)
{
    NEED_CUDA();
    if (!g || (n && (!dev || !src || !bytes))) return kvx_fail(KVX_EINVALID, "kvx_gpu_upload: a NULL argument");
    for (size_t i = 0; i < n; i++) {
        int rc = kvx_gpu_copy_lane(g, (unsigned)i, dev[i], src[i], bytes[i]);
        if (rc) return rc;
    }
    return 0;
}

int kvx_gpu_sync(kvx_gpu *g)
{
    NEED_CUDA();
    if (!g) return kvx_fail(KVX_EINVALID, "kvx_gpu_sync: gpu is NULL");
    kvx_gpu_dev_scope sc;
    int rc = kvx_gpu_dev_enter(&sc, g->device);
    if (rc) return rc;
    for (unsigned i = 0; !rc && i < g->n_streams; i++) rc = kvx_gpu_dev.stream_sync(g->streams[i]);
    kvx_gpu_dev_leave(&sc);
    return rc;
}

int kvx_gpu_page_table(uint64_t *out_table, kvx_gpu *g, const uint64_t *dev_ptrs, size_t n)
{
    NEED_CUDA();
    if (!out_table || !g || (n && !dev_ptrs)) return kvx_fail(KVX_EINVALID, "kvx_gpu_page_table: a NULL argument");
    *out_table = 0;
    if (n > UINT64_MAX / 8) return kvx_fail(KVX_EOVERFLOW, "kvx_gpu_page_table: n is too large");
    uint64_t t;
    int rc = kvx_gpu_reserve(&t, g, n * 8);
    if (rc) return rc;
    if ((rc = kvx_gpu_h2d(g, t, dev_ptrs, n * 8))) return rc;
    *out_table = t;
    return 0;
}

int kvx_gpu_copy_back(void *dst, kvx_gpu *g, uint64_t dev, uint64_t bytes)
{
    NEED_CUDA();
    if (!dst || !g) return kvx_fail(KVX_EINVALID, "kvx_gpu_copy_back: dst or gpu is NULL");
    if (!in_arena(g, dev, bytes)) return kvx_fail(KVX_EINVALID, "kvx_gpu_copy_back: range is outside the arena");
    return kvx_gpu_d2h(dst, g, dev, bytes);
}

static int host_register(void *p, uint64_t bytes, int device, unsigned flags)
{
    int rc = kvx_gpu_need_device(device);
    if (rc) return rc;
    kvx_gpu_dev_scope sc;
    if ((rc = kvx_gpu_dev_enter(&sc, device))) return rc;
    rc = kvx_gpu_dev.host_register(p, bytes, flags);
    kvx_gpu_dev_leave(&sc);
    return rc;
}

int kvx_gpu_host_register(void *p, uint64_t bytes, int device)
{
    return host_register(p, bytes, device, KVX_GDEV_REG_PORTABLE);
}

int kvx_gpu_host_register_ro(void *p, uint64_t bytes, int device)
{
    return host_register(p, bytes, device, KVX_GDEV_REG_PORTABLE | KVX_GDEV_REG_READONLY);
}

void kvx_gpu_host_unregister(void *p) { kvx_gpu_dev.host_unregister(p); }
