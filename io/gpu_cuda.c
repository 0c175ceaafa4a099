/*
 * gpu_cuda.c - the device seam (gpu_dev.h) on the CUDA runtime API, plus
 * the kernels of gpu_kernels.cu. Plain C against cuda_runtime_api.h; each
 * entry turns a cudaError_t into a kvx code and a message naming the call,
 * CUDA's description and its error name. CMake builds this file (and the
 * .cu) when the CUDA toolkit is found, gpu_nocuda.c otherwise.
 */
#include "io.h"

#include "gpu_dev.h"

#include <errno.h>
#include <inttypes.h>

#include <cuda_runtime_api.h>

/* gpu_kernels.cu */
int kvx_gk_crc_pages(const kvx_gpu_crc_job *job, cudaStream_t stream);
int kvx_gk_spectral(const kvx_gpu_spectral_job *job, cudaStream_t stream);

static int cuda_fail(int code, cudaError_t e, const char *what)
{
    (void)cudaGetLastError(); /* a non-sticky error is not left for the caller's next call */
    return kvx_fail(code, "%s: %s (%s)", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

static int c_present(void) { return 0; }

static int c_count(int *out)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    *out = 0;
    if (e != cudaSuccess) return cuda_fail(KVX_ENOGPU, e, "no usable GPU (cudaGetDeviceCount)");
    *out = n;
    return 0;
}

static int c_get_device(int *out)
{
    cudaError_t e = cudaGetDevice(out);
    return e == cudaSuccess ? 0 : cuda_fail(KVX_ENOGPU, e, "cudaGetDevice");
}

static int c_set_device(int device)
{
    cudaError_t e = cudaSetDevice(device);
    return e == cudaSuccess ? 0 : cuda_fail(KVX_ENOGPU, e, "cudaSetDevice");
}

static int c_pci_bus_id(char *buf, int len, int device)
{
    cudaError_t e = cudaDeviceGetPCIBusId(buf, len, device);
    return e == cudaSuccess ? 0 : cuda_fail(KVX_ENOGPU, e, "cudaDeviceGetPCIBusId");
}

static int c_malloc(uint64_t *out, uint64_t bytes)
{
    void *p = NULL;
    *out = 0;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kvx_fail(KVX_ECAPACITY, "cudaMalloc of %" PRIu64 " bytes: %s (%s)", bytes, cudaGetErrorString(e),
                        cudaGetErrorName(e));
    }
    *out = (uint64_t)(uintptr_t)p;
    return 0;
}

static void c_free(uint64_t dev) { cudaFree((void *)(uintptr_t)dev); }

static int c_host_register(void *p, uint64_t bytes, unsigned flags)
{
    unsigned f = 0;
    if (flags & KVX_GDEV_REG_PORTABLE) f |= cudaHostRegisterPortable;
    if (flags & KVX_GDEV_REG_READONLY) {
        int dev = 0, ok = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&ok, cudaDevAttrHostRegisterReadOnlySupported, dev) == cudaSuccess && !ok)
            return kvx_fail(-EOPNOTSUPP,
                            "cudaHostRegister of %" PRIu64 " bytes read-only: device %d cannot "
                            "register read-only memory (cudaDevAttrHostRegisterReadOnlySupported 0)",
                            bytes, dev);
        (void)cudaGetLastError();
        f |= cudaHostRegisterReadOnly;
    }
    cudaError_t e = cudaHostRegister(p, bytes, f);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return kvx_fail(KVX_EMEMLOCK, "cudaHostRegister of %" PRIu64 " bytes%s refused: %s (%s)", bytes,
                        flags & KVX_GDEV_REG_READONLY ? " read-only" : "", cudaGetErrorString(e), cudaGetErrorName(e));
    }
    return 0;
}

static void c_host_unregister(void *p)
{
    if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();
}

static int c_memset_async(uint64_t dev, int byte, uint64_t bytes, void *stream)
{
    cudaError_t e = cudaMemsetAsync((void *)(uintptr_t)dev, byte, bytes, (cudaStream_t)stream);
    return e == cudaSuccess ? 0 : cuda_fail(-EIO, e, "cudaMemsetAsync");
}

static int c_h2d_async(uint64_t dev, const void *src, uint64_t bytes, void *stream)
{
    cudaError_t e = cudaMemcpyAsync((void *)(uintptr_t)dev, src, bytes, cudaMemcpyHostToDevice, (cudaStream_t)stream);
    return e == cudaSuccess ? 0 : cuda_fail(-EIO, e, "cudaMemcpyAsync");
}

static int c_h2d(uint64_t dev, const void *src, uint64_t bytes)
{
    cudaError_t e = cudaMemcpy((void *)(uintptr_t)dev, src, bytes, cudaMemcpyHostToDevice);
    return e == cudaSuccess ? 0 : cuda_fail(-EIO, e, "cudaMemcpy host to device");
}

static int c_d2h(void *dst, uint64_t dev, uint64_t bytes)
{
    cudaError_t e = cudaMemcpy(dst, (const void *)(uintptr_t)dev, bytes, cudaMemcpyDeviceToHost);
    return e == cudaSuccess ? 0 : cuda_fail(-EIO, e, "cudaMemcpy device to host");
}

static int c_stream_create(void **out)
{
    cudaStream_t s;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    *out = e == cudaSuccess ? (void *)s : NULL;
    return e == cudaSuccess ? 0 : cuda_fail(KVX_ENOGPU, e, "cudaStreamCreateWithFlags");
}

static void c_stream_destroy(void *s) { cudaStreamDestroy((cudaStream_t)s); }

static int c_stream_sync(void *s)
{
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)s);
    return e == cudaSuccess ? 0 : cuda_fail(-EIO, e, "cudaStreamSynchronize");
}

static int c_event_create(void **out, int timing)
{
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, timing ? cudaEventDefault : cudaEventDisableTiming);
    *out = e == cudaSuccess ? (void *)ev : NULL;
    return e == cudaSuccess ? 0 : cuda_fail(-EIO, e, "cudaEventCreateWithFlags");
}

static void c_event_destroy(void *ev) { cudaEventDestroy((cudaEvent_t)ev); }

static int c_event_record(void *ev, void *stream)
{
    cudaError_t e = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)stream);
    return e == cudaSuccess ? 0 : cuda_fail(-EIO, e, "cudaEventRecord");
}

static int c_event_sync(void *ev)
{
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)ev);
    return e == cudaSuccess ? 0 : cuda_fail(-EIO, e, "cudaEventSynchronize");
}

static int c_event_elapsed(float *out_ms, void *from, void *to)
{
    cudaError_t e = cudaEventElapsedTime(out_ms, (cudaEvent_t)from, (cudaEvent_t)to);
    return e == cudaSuccess ? 0 : cuda_fail(-EIO, e, "cudaEventElapsedTime");
}

static int c_crc_pages(const kvx_gpu_crc_job *job, void *stream) { return kvx_gk_crc_pages(job, (cudaStream_t)stream); }

static int c_spectral(const kvx_gpu_spectral_job *job, void *stream)
{
    return kvx_gk_spectral(job, (cudaStream_t)stream);
}

/* the table, once: C11 takes no other object as a static initializer (clang refuses
 * "kvx_gpu_dev = cuda_ops", which gcc accepted) */
#define CUDA_OPS_INIT \
    { \
    .present = c_present, \
    .count = c_count, \
    .get_device = c_get_device, \
    .set_device = c_set_device, \
    .pci_bus_id = c_pci_bus_id, \
    .malloc = c_malloc, \
    .free = c_free, \
    .host_register = c_host_register, \
    .host_unregister = c_host_unregister, \
    .memset_async = c_memset_async, \
    .h2d_async = c_h2d_async, \
    .h2d = c_h2d, \
    .d2h = c_d2h, \
    .stream_create = c_stream_create, \
    .stream_destroy = c_stream_destroy, \
    .stream_sync = c_stream_sync, \
    .event_create = c_event_create, \
    .event_destroy = c_event_destroy, \
    .event_record = c_event_record, \
    .event_sync = c_event_sync, \
    .event_elapsed = c_event_elapsed, \
    .crc_pages = c_crc_pages, \
    .spectral = c_spectral, \
    }

static const kvx_gpu_dev_ops cuda_ops = CUDA_OPS_INIT;

kvx_gpu_dev_ops kvx_gpu_dev = CUDA_OPS_INIT;

void kvx_gpu_dev_reset(void) { kvx_gpu_dev = cuda_ops; }
