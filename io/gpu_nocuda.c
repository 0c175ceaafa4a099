/*
 * gpu_nocuda.c - the GPU calls of a build without the CUDA toolkit: every
 * public call exists and returns KVX_ENOCUDA, so callers and the Go
 * binding link the same symbols everywhere. gpu_cuda.c is the real one.
 */
#include "io.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#define NOCUDA()                                                                             \
    kvx_fail(KVX_ENOCUDA, "kvx was built without CUDA: reconfigure with -DKVX_WITH_CUDA=ON " \
                          "where the CUDA toolkit is installed (the host sink still works)")

int kvx_gpu_count(int *out)
{
    if (out) *out = 0;
    return NOCUDA();
}
int kvx_gpu_numa_node(int *out_node, int device)
{
    (void)device;
    if (out_node) *out_node = -1;
    return NOCUDA();
}
int kvx_gpu_create(kvx_gpu **out, const kvx_gpu_options *opts)
{
    (void)opts;
    if (out) *out = NULL;
    return NOCUDA();
}
void kvx_gpu_destroy(kvx_gpu *g) { (void)g; }
int kvx_gpu_device(const kvx_gpu *g)
{
    (void)g;
    return -1;
}
int kvx_gpu_reserve(uint64_t *out_dev, kvx_gpu *g, uint64_t bytes)
{
    (void)g, (void)bytes;
    if (out_dev) *out_dev = 0;
    return NOCUDA();
}
void kvx_gpu_reset(kvx_gpu *g) { (void)g; }
int kvx_gpu_upload(kvx_gpu *g, const uint64_t *dev, const void *const *src, const uint64_t *bytes,
                   size_t n)
{
    (void)g, (void)dev, (void)src, (void)bytes, (void)n;
    return NOCUDA();
}
int kvx_gpu_sync(kvx_gpu *g)
{
    (void)g;
    return NOCUDA();
}
int kvx_gpu_page_table(uint64_t *out_table, kvx_gpu *g, const uint64_t *dev_ptrs, size_t n)
{
    (void)g, (void)dev_ptrs, (void)n;
    if (out_table) *out_table = 0;
    return NOCUDA();
}
int kvx_gpu_copy_back(void *dst, kvx_gpu *g, uint64_t dev, uint64_t bytes)
{
    (void)dst, (void)g, (void)dev, (void)bytes;
    return NOCUDA();
}
int kvx_gpu_host_register(void *p, uint64_t bytes, int device)
{
    (void)p, (void)bytes, (void)device;
    return KVX_ENOCUDA;
}
void kvx_gpu_host_unregister(void *p) { (void)p; }
int kvx_gpu_copy_lane(kvx_gpu *g, unsigned lane, uint64_t dev, const void *src, uint64_t bytes)
{
    (void)g, (void)lane, (void)dev, (void)src, (void)bytes;
    return NOCUDA();
}
int kvx_gpu_lane_record(kvx_gpu *g, unsigned lane)
{
    (void)g, (void)lane;
    return NOCUDA();
}
int kvx_gpu_lane_wait(kvx_gpu *g, unsigned lane)
{
    (void)g, (void)lane;
    return NOCUDA();
}
