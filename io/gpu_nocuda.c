/*
 * gpu_nocuda.c - the device seam (gpu_dev.h) of a build without the CUDA
 * toolkit: every entry answers KVX_ENOCUDA, so every public GPU call
 * (gpu.c, gpu_spectral.c, a warmup to the GPU) does too, and callers and
 * the Go binding link the same symbols everywhere. gpu_cuda.c is the real
 * one. Tests replace the table with a host-memory fake to run the CPU
 * side of the GPU path here too.
 */
#include "io.h"

#include "gpu_dev.h"

#define NOCUDA()                                                                             \
    kvx_fail(KVX_ENOCUDA, "kvx was built without CUDA: reconfigure with -DKVX_WITH_CUDA=ON " \
                          "where the CUDA toolkit is installed (the host sink still works)")

static int n_present(void) { return NOCUDA(); }
static int n_count(int *out)
{
    *out = 0;
    return NOCUDA();
}
static int n_get_device(int *out)
{
    *out = -1;
    return NOCUDA();
}
static int n_set_device(int device)
{
    (void)device;
    return NOCUDA();
}
static int n_pci_bus_id(char *buf, int len, int device)
{
    (void)buf, (void)len, (void)device;
    return NOCUDA();
}
static int n_malloc(uint64_t *out, uint64_t bytes)
{
    (void)bytes;
    *out = 0;
    return NOCUDA();
}
static void n_free(uint64_t dev) { (void)dev; }
static int n_host_register(void *p, uint64_t bytes, unsigned flags)
{
    (void)p, (void)bytes, (void)flags;
    return NOCUDA();
}
static void n_host_unregister(void *p) { (void)p; }
static int n_memset_async(uint64_t dev, int byte, uint64_t bytes, void *stream)
{
    (void)dev, (void)byte, (void)bytes, (void)stream;
    return NOCUDA();
}
static int n_h2d_async(uint64_t dev, const void *src, uint64_t bytes, void *stream)
{
    (void)dev, (void)src, (void)bytes, (void)stream;
    return NOCUDA();
}
static int n_h2d(uint64_t dev, const void *src, uint64_t bytes)
{
    (void)dev, (void)src, (void)bytes;
    return NOCUDA();
}
static int n_d2h(void *dst, uint64_t dev, uint64_t bytes)
{
    (void)dst, (void)dev, (void)bytes;
    return NOCUDA();
}
static int n_stream_create(void **out)
{
    *out = NULL;
    return NOCUDA();
}
static void n_stream_destroy(void *s) { (void)s; }
static int n_stream_sync(void *s)
{
    (void)s;
    return NOCUDA();
}
static int n_event_create(void **out, int timing)
{
    (void)timing;
    *out = NULL;
    return NOCUDA();
}
static void n_event_destroy(void *e) { (void)e; }
static int n_event_record(void *e, void *stream)
{
    (void)e, (void)stream;
    return NOCUDA();
}
static int n_event_sync(void *e)
{
    (void)e;
    return NOCUDA();
}
static int n_event_elapsed(float *out_ms, void *from, void *to)
{
    (void)from, (void)to;
    *out_ms = 0;
    return NOCUDA();
}
static int n_crc_pages(const kvx_gpu_crc_job *job, void *stream)
{
    (void)job, (void)stream;
    return NOCUDA();
}
static int n_spectral(const kvx_gpu_spectral_job *job, void *stream)
{
    (void)job, (void)stream;
    return NOCUDA();
}

/* the table, once: C11 takes no other object as a static initializer (clang refuses
 * "kvx_gpu_dev = nocuda_ops", which gcc accepted) */
#define NOCUDA_OPS_INIT \
    { \
    .present = n_present, \
    .count = n_count, \
    .get_device = n_get_device, \
    .set_device = n_set_device, \
    .pci_bus_id = n_pci_bus_id, \
    .malloc = n_malloc, \
    .free = n_free, \
    .host_register = n_host_register, \
    .host_unregister = n_host_unregister, \
    .memset_async = n_memset_async, \
    .h2d_async = n_h2d_async, \
    .h2d = n_h2d, \
    .d2h = n_d2h, \
    .stream_create = n_stream_create, \
    .stream_destroy = n_stream_destroy, \
    .stream_sync = n_stream_sync, \
    .event_create = n_event_create, \
    .event_destroy = n_event_destroy, \
    .event_record = n_event_record, \
    .event_sync = n_event_sync, \
    .event_elapsed = n_event_elapsed, \
    .crc_pages = n_crc_pages, \
    .spectral = n_spectral, \
    }

static const kvx_gpu_dev_ops nocuda_ops = NOCUDA_OPS_INIT;

kvx_gpu_dev_ops kvx_gpu_dev = NOCUDA_OPS_INIT;

void kvx_gpu_dev_reset(void) { kvx_gpu_dev = nocuda_ops; }
