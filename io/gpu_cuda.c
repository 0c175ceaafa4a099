/*
 * gpu_cuda.c - GPU upload on the CUDA runtime API: a device arena (one
 * cudaMalloc, bump-allocated), cudaMemcpyAsync on several non-blocking
 * streams from pinned (cudaHostRegister'ed) pool memory, a device page
 * table, and copy-back for verification.
 *
 * Plain C against cuda_runtime_api.h: nothing here needs a kernel, so no
 * nvcc step and no C++ runtime. CMake builds this file when the CUDA
 * toolkit is found, gpu_nocuda.c otherwise.
 */
#include "io.h"

#include "common/os.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda_runtime_api.h>

#define KVX_GPU_MAX_STREAMS 16
#define KVX_GPU_MAX_LANES 64
#define KVX_GPU_ALIGN 256u

struct kvx_gpu {
    int device;
    uint8_t *arena;
    uint64_t arena_bytes;
    uint64_t used;
    unsigned n_streams;
    cudaStream_t streams[KVX_GPU_MAX_STREAMS];
    cudaEvent_t lanes[KVX_GPU_MAX_LANES];
};

static int cuda_fail(int code, cudaError_t e, const char *what)
{
    return kvx_fail(code, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

/* CUDA's current device belongs to the calling thread: a warmup's own
 * thread starts on device 0 (its events were made there and recorded on
 * another device's streams: cudaEventRecord failed, and GPU 0 got a
 * context), and an engine's thread works on its own GPU. Every call
 * switches to the handle's device for its CUDA work and back before it
 * returns, so kvx never leaves a caller's thread on another GPU. Checked
 * by reading: the one-GPU machines here cannot show two devices. */
typedef struct dev_scope {
    int prev;
    int switched;
} dev_scope;

static int dev_enter(dev_scope *sc, int device)
{
    sc->switched = 0;
    if (cudaGetDevice(&sc->prev) != cudaSuccess) {
        (void)cudaGetLastError();
        sc->prev = -1;
    }
    if (sc->prev == device) return 0;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return cuda_fail(KVX_ENOGPU, e, "cudaSetDevice");
    sc->switched = 1;
    return 0;
}

static void dev_leave(const dev_scope *sc)
{
    if (sc->switched && sc->prev >= 0) cudaSetDevice(sc->prev);
}

int kvx_gpu_count(int *out)
{
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_gpu_count: out is NULL");
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky-free error */
        n = 0;
    }
    *out = n;
    return 0;
}

static int need_device(int device)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_fail(KVX_ENOGPU, e, "no usable GPU (cudaGetDeviceCount)");
    }
    if (n == 0) return kvx_fail(KVX_ENOGPU, "no usable GPU: cudaGetDeviceCount found none");
    if (device < 0 || device >= n)
        return kvx_fail(KVX_ENOGPU, "no usable GPU: device %d does not exist (%d visible)", device, n);
    return 0;
}

int kvx_gpu_numa_node(int *out_node, int device)
{
    if (!out_node) return kvx_fail(KVX_EINVALID, "kvx_gpu_numa_node: out_node is NULL");
    *out_node = -1;
    int rc = need_device(device);
    if (rc) return rc;
    char bus[64];
    cudaError_t e = cudaDeviceGetPCIBusId(bus, sizeof bus, device);
    if (e != cudaSuccess) return cuda_fail(KVX_ENOGPU, e, "cudaDeviceGetPCIBusId");
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
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_gpu_create: out is NULL");
    *out = NULL;
    kvx_gpu_options def = KVX_GPU_OPTIONS_INIT;
    if (!opts) opts = &def;
    if (opts->version != KVX_GPU_OPTIONS_VERSION)
        return kvx_fail(KVX_EVERSION, "kvx_gpu_options.version is %u, expected %u", opts->version,
                        KVX_GPU_OPTIONS_VERSION);
    if (opts->streams > KVX_GPU_MAX_STREAMS)
        return kvx_fail(KVX_EINVALID, "kvx_gpu_options.streams %u is above %d", opts->streams,
                        KVX_GPU_MAX_STREAMS);
    int rc = need_device(opts->device);
    if (rc) return rc;
    dev_scope sc;
    if ((rc = dev_enter(&sc, opts->device))) return rc;
    rc = gpu_make(out, opts);
    dev_leave(&sc);
    return rc;
}

/* kvx_gpu_create's allocations, on opts->device. */
static int gpu_make(kvx_gpu **out, const kvx_gpu_options *opts)
{
    kvx_gpu *g = calloc(1, sizeof *g);
    if (!g) return kvx_fail(-ENOMEM, "kvx_gpu_create: out of memory");
    g->device = opts->device;
    g->arena_bytes = kvx_align_up(opts->arena_bytes ? opts->arena_bytes : (uint64_t)256 << 20,
                                  KVX_GPU_ALIGN);
    g->n_streams = opts->streams ? opts->streams : 4;
    cudaError_t e = cudaMalloc((void **)&g->arena, g->arena_bytes);
    if (e != cudaSuccess) {
        free(g);
        return cuda_fail(KVX_ECAPACITY, e, "kvx_gpu_create: cudaMalloc of the arena");
    }
    for (unsigned i = 0; i < g->n_streams; i++) {
        e = cudaStreamCreateWithFlags(&g->streams[i], cudaStreamNonBlocking);
        if (e != cudaSuccess) {
            g->n_streams = i;
            kvx_gpu_destroy(g);
            return cuda_fail(KVX_ENOGPU, e, "cudaStreamCreateWithFlags");
        }
    }
    *out = g;
    return 0;
}

void kvx_gpu_destroy(kvx_gpu *g)
{
    if (!g) return;
    dev_scope sc;
    int entered = dev_enter(&sc, g->device) == 0;
    for (unsigned i = 0; i < g->n_streams; i++) {
        cudaStreamSynchronize(g->streams[i]);
        cudaStreamDestroy(g->streams[i]);
    }
    for (unsigned i = 0; i < KVX_GPU_MAX_LANES; i++)
        if (g->lanes[i]) cudaEventDestroy(g->lanes[i]);
    cudaFree(g->arena);
    if (entered) dev_leave(&sc);
    free(g);
}

int kvx_gpu_reserve(uint64_t *out_dev, kvx_gpu *g, uint64_t bytes)
{
    if (!out_dev || !g) return kvx_fail(KVX_EINVALID, "kvx_gpu_reserve: out_dev or gpu is NULL");
    *out_dev = 0;
    if (bytes > g->arena_bytes - g->used) /* before rounding: near 2^64 it would wrap to 0 */
        return kvx_fail(KVX_ECAPACITY, "GPU arena: %" PRIu64 " bytes wanted, %" PRIu64 " of %" PRIu64
                        " free; use a larger kvx_gpu_options.arena_bytes",
                        bytes, g->arena_bytes - g->used, g->arena_bytes);
    uint64_t need = kvx_align_up(bytes ? bytes : 1, KVX_GPU_ALIGN);
    if (need > g->arena_bytes - g->used)
        return kvx_fail(KVX_ECAPACITY, "GPU arena: %" PRIu64 " bytes wanted, %" PRIu64 " of %" PRIu64
                        " free; use a larger kvx_gpu_options.arena_bytes",
                        need, g->arena_bytes - g->used, g->arena_bytes);
    *out_dev = (uint64_t)(uintptr_t)(g->arena + g->used);
    g->used += need;
    return 0;
}

void kvx_gpu_reset(kvx_gpu *g)
{
    if (g) g->used = 0;
}

int kvx_gpu_device(const kvx_gpu *g) { return g ? g->device : -1; }

static int in_arena(const kvx_gpu *g, uint64_t dev, uint64_t bytes)
{
    uint64_t a = (uint64_t)(uintptr_t)g->arena;
    return dev >= a && bytes <= g->arena_bytes && dev - a <= g->arena_bytes - bytes;
}

int kvx_gpu_copy_lane(kvx_gpu *g, unsigned lane, uint64_t dev, const void *src, uint64_t bytes)
{
    if (!in_arena(g, dev, bytes))
        return kvx_fail(KVX_EINVALID, "GPU upload: device range 0x%" PRIx64 "+%" PRIu64
                        " is outside the arena", dev, bytes);
    dev_scope sc;
    int rc = dev_enter(&sc, g->device);
    if (rc) return rc;
    cudaError_t e = cudaMemcpyAsync((void *)(uintptr_t)dev, src, bytes, cudaMemcpyHostToDevice,
                                    g->streams[lane % g->n_streams]);
    dev_leave(&sc);
    return e == cudaSuccess ? 0 : cuda_fail(-EIO, e, "cudaMemcpyAsync");
}

int kvx_gpu_lane_record(kvx_gpu *g, unsigned lane)
{
    if (lane >= KVX_GPU_MAX_LANES) return kvx_fail(KVX_EINVALID, "GPU lane %u out of range", lane);
    dev_scope sc;
    int rc = dev_enter(&sc, g->device); /* an event is made on its stream's device */
    if (rc) return rc;
    cudaError_t e = cudaSuccess;
    if (!g->lanes[lane]) e = cudaEventCreateWithFlags(&g->lanes[lane], cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(g->lanes[lane], g->streams[lane % g->n_streams]);
    dev_leave(&sc);
    return e == cudaSuccess ? 0 : cuda_fail(-EIO, e, "cudaEventRecord");
}

int kvx_gpu_lane_wait(kvx_gpu *g, unsigned lane)
{
    if (lane >= KVX_GPU_MAX_LANES || !g->lanes[lane]) return 0;
    cudaError_t e = cudaEventSynchronize(g->lanes[lane]);
    return e == cudaSuccess ? 0 : cuda_fail(-EIO, e, "cudaEventSynchronize");
}

int kvx_gpu_upload(kvx_gpu *g, const uint64_t *dev, const void *const *src, const uint64_t *bytes,
                   size_t n)
{
    if (!g || (n && (!dev || !src || !bytes)))
        return kvx_fail(KVX_EINVALID, "kvx_gpu_upload: a NULL argument");
    for (size_t i = 0; i < n; i++) {
        int rc = kvx_gpu_copy_lane(g, (unsigned)i, dev[i], src[i], bytes[i]);
        if (rc) return rc;
    }
    return 0;
}

int kvx_gpu_sync(kvx_gpu *g)
{
    if (!g) return kvx_fail(KVX_EINVALID, "kvx_gpu_sync: gpu is NULL");
    dev_scope sc;
    int rc = dev_enter(&sc, g->device);
    if (rc) return rc;
    for (unsigned i = 0; !rc && i < g->n_streams; i++) {
        cudaError_t e = cudaStreamSynchronize(g->streams[i]);
        if (e != cudaSuccess) rc = cuda_fail(-EIO, e, "cudaStreamSynchronize");
    }
    dev_leave(&sc);
    return rc;
}

int kvx_gpu_page_table(uint64_t *out_table, kvx_gpu *g, const uint64_t *dev_ptrs, size_t n)
{
    if (!out_table || !g || (n && !dev_ptrs))
        return kvx_fail(KVX_EINVALID, "kvx_gpu_page_table: a NULL argument");
    *out_table = 0;
    if (n > UINT64_MAX / 8) return kvx_fail(KVX_EOVERFLOW, "kvx_gpu_page_table: n is too large");
    uint64_t t;
    int rc = kvx_gpu_reserve(&t, g, n * 8);
    if (rc) return rc;
    dev_scope sc;
    if ((rc = dev_enter(&sc, g->device))) return rc;
    cudaError_t e = cudaMemcpy((void *)(uintptr_t)t, dev_ptrs, n * 8, cudaMemcpyHostToDevice);
    dev_leave(&sc);
    if (e != cudaSuccess) return cuda_fail(-EIO, e, "cudaMemcpy of the page table");
    *out_table = t;
    return 0;
}

int kvx_gpu_copy_back(void *dst, kvx_gpu *g, uint64_t dev, uint64_t bytes)
{
    if (!dst || !g) return kvx_fail(KVX_EINVALID, "kvx_gpu_copy_back: dst or gpu is NULL");
    if (!in_arena(g, dev, bytes))
        return kvx_fail(KVX_EINVALID, "kvx_gpu_copy_back: range is outside the arena");
    dev_scope sc;
    int rc = dev_enter(&sc, g->device);
    if (rc) return rc;
    cudaError_t e = cudaMemcpy(dst, (const void *)(uintptr_t)dev, bytes, cudaMemcpyDeviceToHost);
    dev_leave(&sc);
    return e == cudaSuccess ? 0 : cuda_fail(-EIO, e, "cudaMemcpy device to host");
}

int kvx_gpu_host_register(void *p, uint64_t bytes, int device)
{
    int rc = need_device(device);
    if (rc) return rc;
    dev_scope sc;
    if ((rc = dev_enter(&sc, device))) return rc;
    cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterPortable);
    dev_leave(&sc);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kvx_fail(KVX_EMEMLOCK, "pinned pool: cudaHostRegister of %" PRIu64 " bytes refused: %s",
                        bytes, cudaGetErrorString(e));
    }
    return 0;
}

void kvx_gpu_host_unregister(void *p) { cudaHostUnregister(p); }
