/*
 * gpu_spectral.c - spectral steering on the device: one cartridge's psi
 * (all its layers) uploaded once, in two layouts ([d][r] for t = psi^T h,
 * [r][d] so the update's loads are contiguous across a warp), and applied
 * to rows of hidden states already on the device by one fused kernel
 * (gpu_kernels.cu) on the caller's stream.
 *
 * Everything the CPU does (checking the bundle and the arguments, the
 * upload, the job) goes through the device seam, so it is tested without
 * a GPU; kvx_gpu_spectral_job_host is the kernel's result computed on the
 * host, what the tests' fake device runs.
 */
#include "io.h"

#include "gpu_dev.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

struct kvx_gpu_spectral {
    int device;
    uint32_t id, first_layer, n_layers, dim, rank;
    uint64_t psi;   /* f32 [n_layers][dim][rank] */
    uint64_t psi_t; /* f32 [n_layers][rank][dim] */
};

#define MAX_ROWS ((uint64_t)INT32_MAX) /* one block per row at worst: a grid's x limit */

static int bad_bundle(const kvx_spectral *b)
{
    if (b->n_cartridges < 1 || b->n_cartridges > 32)
        return kvx_fail(KVX_ESPECTRAL, "spectral bundle: n_cartridges %u is not 1..32", b->n_cartridges);
    if (!b->n_layers || !b->dim || !b->rank || b->rank > b->dim)
        return kvx_fail(KVX_ESPECTRAL, "spectral bundle: n_layers %u, dim %u, rank %u (each >= 1, rank <= dim)",
                        b->n_layers, b->dim, b->rank);
    for (uint32_t k = 0; k < b->n_cartridges; k++)
        if (b->ids[k] < 1 || b->ids[k] > 32 || (k && b->ids[k] <= b->ids[k - 1]))
            return kvx_fail(KVX_ESPECTRAL, "spectral bundle: cartridge %u has id %u (ids are 1..32, increasing)", k,
                            b->ids[k]);
    return 0;
}

int kvx_gpu_spectral_create(kvx_gpu_spectral **out, int device, const kvx_spectral *bundle, uint32_t cartridge_id)
{
    int rc = kvx_gpu_dev.present();
    if (rc) return rc;
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_gpu_spectral_create: out is NULL");
    *out = NULL;
    if (!bundle || !bundle->ids || !bundle->psi)
        return kvx_fail(KVX_EINVALID, "kvx_gpu_spectral_create: bundle, its ids or its psi is NULL");
    if ((rc = bad_bundle(bundle))) return rc;
    uint32_t k = 0;
    while (k < bundle->n_cartridges && bundle->ids[k] != cartridge_id) k++;
    if (k == bundle->n_cartridges)
        return kvx_fail(KVX_ENOTFOUND, "spectral bundle: no cartridge with id %u (%u cartridges)", cartridge_id,
                        bundle->n_cartridges);
    uint64_t per = (uint64_t)bundle->dim * bundle->rank, n = per * bundle->n_layers;
    if (n > (UINT64_MAX / 8) / bundle->n_cartridges)
        return kvx_fail(KVX_EOVERFLOW, "spectral bundle: psi size overflows");
    const float *psi = bundle->psi + k * n;
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(psi[i]))
            return kvx_fail(KVX_ESPECTRAL,
                            "spectral bundle: cartridge id %u, layer %" PRIu64 ", psi element %" PRIu64
                            " is not finite",
                            cartridge_id, bundle->first_layer + i / per, i % per);
    if ((rc = kvx_gpu_need_device(device))) return rc;
    float *t = malloc(n * sizeof *t);
    kvx_gpu_spectral *sp = calloc(1, sizeof *sp);
    if (!t || !sp) {
        free(t);
        free(sp);
        return kvx_fail(-ENOMEM, "kvx_gpu_spectral_create: out of memory");
    }
    for (uint32_t l = 0; l < bundle->n_layers; l++)
        for (uint32_t i = 0; i < bundle->dim; i++)
            for (uint32_t r = 0; r < bundle->rank; r++)
                t[l * per + (uint64_t)r * bundle->dim + i] = psi[l * per + (uint64_t)i * bundle->rank + r];
    *sp = (kvx_gpu_spectral){device, cartridge_id, bundle->first_layer, bundle->n_layers, bundle->dim, bundle->rank, 0,
                             0};
    kvx_gpu_dev_scope sc;
    if (!(rc = kvx_gpu_dev_enter(&sc, device))) {
        rc = kvx_gpu_dev.malloc(&sp->psi, n * 4);
        if (!rc) rc = kvx_gpu_dev.malloc(&sp->psi_t, n * 4);
        if (!rc) rc = kvx_gpu_dev.h2d(sp->psi, psi, n * 4);
        if (!rc) rc = kvx_gpu_dev.h2d(sp->psi_t, t, n * 4);
        kvx_gpu_dev_leave(&sc);
    }
    free(t);
    if (rc) {
        kvx_gpu_spectral_destroy(sp);
        return rc;
    }
    *out = sp;
    return 0;
}

void kvx_gpu_spectral_destroy(kvx_gpu_spectral *sp)
{
    if (!sp || kvx_gpu_dev.present()) return;
    kvx_gpu_dev_scope sc;
    int entered = kvx_gpu_dev_enter(&sc, sp->device) == 0;
    if (sp->psi) kvx_gpu_dev.free(sp->psi);
    if (sp->psi_t) kvx_gpu_dev.free(sp->psi_t);
    if (entered) kvx_gpu_dev_leave(&sc);
    free(sp);
}

static unsigned elem_size(int dtype) { return dtype == KVX_GPU_F32 ? 4 : 2; }

int kvx_gpu_spectral_apply(kvx_gpu_spectral *sp, uint32_t layer, uint64_t h, uint64_t n_rows, uint64_t row_stride,
                           int dtype, float gamma, void *stream)
{
    int rc = kvx_gpu_dev.present();
    if (rc) return rc;
    if (!sp) return kvx_fail(KVX_EINVALID, "kvx_gpu_spectral_apply: sp is NULL");
    if (layer < sp->first_layer || layer - sp->first_layer >= sp->n_layers)
        return kvx_fail(KVX_EINVALID, "kvx_gpu_spectral_apply: layer %u is outside the bundle's layers %u..%u", layer,
                        sp->first_layer, sp->first_layer + sp->n_layers - 1);
    if (dtype != KVX_GPU_F32 && dtype != KVX_GPU_BF16 && dtype != KVX_GPU_F16)
        return kvx_fail(KVX_EINVALID, "kvx_gpu_spectral_apply: dtype %d is not a kvx_gpu_dtype", dtype);
    if (!(gamma >= 0.0f && gamma <= 1.0f)) /* NaN fails too */
        return kvx_fail(KVX_EINVALID, "kvx_gpu_spectral_apply: gamma %g is outside [0, 1]", (double)gamma);
    if (n_rows == 0) return 0;
    if (row_stride < sp->dim)
        return kvx_fail(KVX_EINVALID, "kvx_gpu_spectral_apply: row_stride %" PRIu64 " is below dim %u", row_stride,
                        sp->dim);
    if (n_rows > MAX_ROWS)
        return kvx_fail(KVX_EINVALID,
                        "kvx_gpu_spectral_apply: n_rows %" PRIu64 " is above %" PRIu64 " (split the batch)", n_rows,
                        MAX_ROWS);
    if (!h || h % elem_size(dtype))
        return kvx_fail(KVX_EINVALID, "kvx_gpu_spectral_apply: h 0x%" PRIx64 " is NULL or not aligned to %u bytes", h,
                        elem_size(dtype));
    if ((n_rows - 1) > (UINT64_MAX / elem_size(dtype) - sp->dim) / row_stride)
        return kvx_fail(KVX_EOVERFLOW, "kvx_gpu_spectral_apply: n_rows x row_stride overflows");
    uint64_t per = (uint64_t)sp->dim * sp->rank, l = layer - sp->first_layer;
    kvx_gpu_spectral_job job = {
        h, n_rows, row_stride, sp->dim, sp->rank, dtype, gamma, sp->psi + l * per * 4, sp->psi_t + l * per * 4};
    kvx_gpu_dev_scope sc;
    if ((rc = kvx_gpu_dev_enter(&sc, sp->device))) return rc;
    rc = kvx_gpu_dev.spectral(&job, stream);
    kvx_gpu_dev_leave(&sc);
    return rc;
}

static float load(const void *h, uint64_t i, int dtype)
{
    if (dtype == KVX_GPU_F32) return ((const float *)h)[i];
    uint16_t v = ((const uint16_t *)h)[i];
    return dtype == KVX_GPU_BF16 ? kvx_bf16_to_f32(v) : kvx_f16_to_f32(v);
}

static void store(void *h, uint64_t i, int dtype, float x)
{
    if (dtype == KVX_GPU_F32)
        ((float *)h)[i] = x;
    else
        ((uint16_t *)h)[i] = dtype == KVX_GPU_BF16 ? kvx_f32_to_bf16(x) : kvx_f32_to_f16(x);
}

int kvx_gpu_spectral_job_host(const kvx_gpu_spectral_job *job)
{
    void *h = (void *)(uintptr_t)job->h;
    const float *psi = (const float *)(uintptr_t)job->psi, *psit = (const float *)(uintptr_t)job->psi_t;
    float *row = malloc(sizeof(float) * (job->dim + job->rank));
    if (!row) return kvx_fail(-ENOMEM, "spectral (host): out of memory");
    float *t = row + job->dim;
    for (uint64_t i = 0; i < job->n; i++) {
        uint64_t base = i * job->stride;
        for (uint32_t j = 0; j < job->dim; j++) row[j] = load(h, base + j, job->dtype);
        for (uint32_t k = 0; k < job->rank; k++) {
            float s = 0;
            for (uint32_t j = 0; j < job->dim; j++) s = fmaf(row[j], psi[(uint64_t)j * job->rank + k], s);
            t[k] = s;
        }
        for (uint32_t j = 0; j < job->dim; j++) {
            float a = 0;
            for (uint32_t k = 0; k < job->rank; k++) a = fmaf(psit[(uint64_t)k * job->dim + j], t[k], a);
            store(h, base + j, job->dtype, fmaf(job->gamma, a, row[j]));
        }
    }
    free(row);
    return 0;
}
