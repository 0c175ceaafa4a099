/*
 * gpu_fake.h - a GPU in host memory behind io/'s device seam (kvx_gpu_dev,
 * io/gpu_dev.h), so the CPU side of the GPU path runs in every build, on
 * machines without a GPU: planning, the page table, the registered file
 * mapping and its fallback, the landing buffers, every error path.
 *
 * What it models, and checks:
 *  - device memory is host memory (a device address is a host pointer);
 *    allocations are counted (fake.live_allocs) and may be limited
 *    (fake.mem_budget) to refuse landing buffers;
 *  - asynchronous work is deferred: copies, memsets, kernels and event
 *    records queue on their stream and run only when something waits (a
 *    stream or event sync), as on a GPU, so a staging buffer reused or a
 *    mapping let go before its copy ran shows as wrong bytes or as a
 *    violation (fake.violations), not by luck;
 *  - host registration is recorded; unregistering a range that a queued
 *    copy still reads is a violation; read-only registration can be
 *    refused (fake.refuse_ro_after: the Nth and later are refused);
 *  - the kernels are the host builds of the same math
 *    (kvx_gcrc_job_host, kvx_gpu_spectral_job_host);
 *  - failures on demand: the Nth async copy, the CRC launch.
 * Install with fake_install(), restore with fake_uninstall().
 */
#ifndef KVX_GPU_FAKE_H
#define KVX_GPU_FAKE_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "io/gpu_dev.h"

#define FAKE_MAX_ALLOCS 256
#define FAKE_MAX_REGS 64
#define FAKE_MAX_STREAMS 32

enum { FOP_H2D, FOP_MEMSET, FOP_CRC, FOP_EVENT, FOP_SPECTRAL };

typedef struct fake_op {
    int kind;
    uint64_t dev;
    const void *src;
    uint64_t bytes;
    int byte;
    void *event;
    kvx_gpu_crc_job crc;
    kvx_gpu_spectral_job sp;
    struct fake_op *next;
} fake_op;

typedef struct fake_stream {
    fake_op *head, *tail;
    int live;
} fake_stream;

typedef struct fake_event {
    int recorded; /* queued on a stream */
    int done;     /* the stream ran past it */
    fake_stream *stream;
} fake_event;

static struct {
    int n_devices;
    int64_t mem_budget;   /* bytes still allocatable; < 0: unlimited */
    long refuse_ro_after; /* read-only registrations from this one on are refused (1 = all); 0: none */
    long fail_h2d_at;     /* the Nth async copy fails (0: none) */
    int fail_crc;         /* crc_pages fails */
    /* counters and state */
    long n_h2d, n_ro, n_crc, n_spectral, violations;
    long live_allocs, live_regs, live_streams;
    void *allocs[FAKE_MAX_ALLOCS];
    struct {
        const uint8_t *p;
        uint64_t len;
        unsigned flags;
    } regs[FAKE_MAX_REGS];
    fake_stream streams[FAKE_MAX_STREAMS];
    char last_violation[200];
} fake;

static void fake_violation(const char *what)
{
    fake.violations++;
    snprintf(fake.last_violation, sizeof fake.last_violation, "%s", what);
}

static int f_present(void) { return 0; }
static int f_count(int *out)
{
    *out = fake.n_devices;
    return 0;
}
static int f_get_device(int *out)
{
    *out = 0;
    return 0;
}
static int f_set_device(int d) { return d == 0 ? 0 : kvx_fail(KVX_ENOGPU, "fake: no device %d", d); }
static int f_pci_bus_id(char *buf, int len, int d)
{
    (void)d;
    snprintf(buf, (size_t)len, "ffff:ff:1f.7"); /* no such sysfs node: numa node unknown */
    return 0;
}
static int f_malloc(uint64_t *out, uint64_t bytes)
{
    *out = 0;
    if (fake.mem_budget >= 0 && (int64_t)bytes > fake.mem_budget)
        return kvx_fail(KVX_ECAPACITY, "fake cudaMalloc of %llu bytes: out of memory", (unsigned long long)bytes);
    void *p = NULL;
    if (posix_memalign(&p, 256, bytes ? bytes : 1)) return kvx_fail(KVX_ECAPACITY, "fake: host out of memory");
    for (int i = 0; i < FAKE_MAX_ALLOCS; i++)
        if (!fake.allocs[i]) {
            fake.allocs[i] = p;
            fake.live_allocs++;
            if (fake.mem_budget >= 0) fake.mem_budget -= (int64_t)bytes;
            *out = (uint64_t)(uintptr_t)p;
            return 0;
        }
    free(p);
    return kvx_fail(KVX_ECAPACITY, "fake: too many allocations");
}
static void f_free(uint64_t dev)
{
    for (int i = 0; i < FAKE_MAX_ALLOCS; i++)
        if (fake.allocs[i] == (void *)(uintptr_t)dev) {
            free(fake.allocs[i]);
            fake.allocs[i] = NULL;
            fake.live_allocs--;
            return;
        }
    fake_violation("free of an address never allocated");
}
static int f_host_register(void *p, uint64_t bytes, unsigned flags)
{
    if (flags & KVX_GDEV_REG_READONLY) {
        fake.n_ro++;
        if (fake.refuse_ro_after && fake.n_ro >= fake.refuse_ro_after)
            return kvx_fail(KVX_EMEMLOCK, "fake cudaHostRegister of %llu bytes read-only refused",
                            (unsigned long long)bytes);
    }
    for (int i = 0; i < FAKE_MAX_REGS; i++)
        if (!fake.regs[i].p) {
            fake.regs[i].p = p;
            fake.regs[i].len = bytes;
            fake.regs[i].flags = flags;
            fake.live_regs++;
            return 0;
        }
    return kvx_fail(KVX_EMEMLOCK, "fake: too many registrations");
}
static void f_host_unregister(void *p)
{
    for (int i = 0; i < FAKE_MAX_REGS; i++)
        if (fake.regs[i].p == p) {
            /* nothing queued may still read it */
            for (int s = 0; s < FAKE_MAX_STREAMS; s++)
                for (fake_op *o = fake.streams[s].head; o; o = o->next)
                    if (o->kind == FOP_H2D && (const uint8_t *)o->src >= fake.regs[i].p &&
                        (const uint8_t *)o->src < fake.regs[i].p + fake.regs[i].len)
                        fake_violation("unregistered while a queued copy still reads it");
            fake.regs[i].p = NULL;
            fake.live_regs--;
            return;
        }
    fake_violation("unregister of a range never registered");
}

static void fake_run_op(fake_op *o)
{
    switch (o->kind) {
    case FOP_H2D: memcpy((void *)(uintptr_t)o->dev, o->src, o->bytes); break;
    case FOP_MEMSET: memset((void *)(uintptr_t)o->dev, o->byte, o->bytes); break;
    case FOP_CRC: kvx_gcrc_job_host(&o->crc); break;
    case FOP_SPECTRAL: kvx_gpu_spectral_job_host(&o->sp); break;
    case FOP_EVENT: ((fake_event *)o->event)->done = 1; break;
    }
}

/* Runs stream s's queue up to and including until (NULL: all of it). */
static void fake_drain(fake_stream *s, const fake_op *until)
{
    while (s->head) {
        fake_op *o = s->head;
        s->head = o->next;
        if (!s->head) s->tail = NULL;
        fake_run_op(o);
        int last = o == until;
        free(o);
        if (last) return;
    }
}

static int fake_queue(void *stream, fake_op *o)
{
    fake_stream *s = stream;
    if (!s) { /* the legacy default stream: synchronous here */
        fake_run_op(o);
        free(o);
        return 0;
    }
    o->next = NULL;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    return 0;
}

static fake_op *fake_new_op(int kind)
{
    fake_op *o = calloc(1, sizeof *o);
    if (o) o->kind = kind;
    return o;
}

static int f_memset_async(uint64_t dev, int byte, uint64_t bytes, void *stream)
{
    fake_op *o = fake_new_op(FOP_MEMSET);
    if (!o) return -ENOMEM;
    o->dev = dev;
    o->byte = byte;
    o->bytes = bytes;
    return fake_queue(stream, o);
}
static int f_h2d_async(uint64_t dev, const void *src, uint64_t bytes, void *stream)
{
    if (fake.fail_h2d_at && ++fake.n_h2d == fake.fail_h2d_at)
        return kvx_fail(-EIO, "fake cudaMemcpyAsync: injected failure");
    fake_op *o = fake_new_op(FOP_H2D);
    if (!o) return -ENOMEM;
    o->dev = dev;
    o->src = src;
    o->bytes = bytes;
    return fake_queue(stream, o);
}
static int f_h2d(uint64_t dev, const void *src, uint64_t bytes)
{
    memcpy((void *)(uintptr_t)dev, src, bytes);
    return 0;
}
static int f_d2h(void *dst, uint64_t dev, uint64_t bytes)
{
    memcpy(dst, (const void *)(uintptr_t)dev, bytes);
    return 0;
}
static int f_stream_create(void **out)
{
    for (int i = 0; i < FAKE_MAX_STREAMS; i++)
        if (!fake.streams[i].live) {
            fake.streams[i].live = 1;
            fake.live_streams++;
            *out = &fake.streams[i];
            return 0;
        }
    return kvx_fail(KVX_ENOGPU, "fake: too many streams");
}
static void f_stream_destroy(void *s)
{
    fake_stream *fs = s;
    if (fs->head) fake_violation("stream destroyed with work queued");
    fake_drain(fs, NULL);
    fs->live = 0;
    fake.live_streams--;
}
static int f_stream_sync(void *s)
{
    fake_drain(s, NULL);
    return 0;
}
static int f_event_create(void **out, int timing)
{
    (void)timing;
    *out = calloc(1, sizeof(fake_event));
    return *out ? 0 : -ENOMEM;
}
static void f_event_destroy(void *e) { free(e); }
static int f_event_record(void *e, void *stream)
{
    fake_event *ev = e;
    fake_op *o = fake_new_op(FOP_EVENT);
    if (!o) return -ENOMEM;
    o->event = e;
    ev->recorded = 1;
    ev->done = 0;
    ev->stream = stream;
    return fake_queue(stream, o);
}
static int f_event_sync(void *e)
{
    fake_event *ev = e;
    if (!ev->recorded || ev->done || !ev->stream) return 0;
    fake_op *until = NULL;
    for (fake_op *o = ev->stream->head; o; o = o->next)
        if (o->kind == FOP_EVENT && o->event == e) until = o; /* its latest record */
    fake_drain(ev->stream, until);
    return 0;
}
static int f_event_elapsed(float *ms, void *a, void *b)
{
    (void)a, (void)b;
    *ms = 0.001f;
    return 0;
}
static int f_crc_pages(const kvx_gpu_crc_job *job, void *stream)
{
    fake.n_crc++;
    if (fake.fail_crc) return kvx_fail(-EIO, "fake CRC kernel launch: injected failure");
    fake_op *o = fake_new_op(FOP_CRC);
    if (!o) return -ENOMEM;
    o->crc = *job;
    return fake_queue(stream, o);
}
static int f_spectral(const kvx_gpu_spectral_job *job, void *stream)
{
    fake.n_spectral++;
    fake_op *o = fake_new_op(FOP_SPECTRAL);
    if (!o) return -ENOMEM;
    o->sp = *job;
    return fake_queue(stream, o);
}

static const kvx_gpu_dev_ops fake_ops = {
    .present = f_present,
    .count = f_count,
    .get_device = f_get_device,
    .set_device = f_set_device,
    .pci_bus_id = f_pci_bus_id,
    .malloc = f_malloc,
    .free = f_free,
    .host_register = f_host_register,
    .host_unregister = f_host_unregister,
    .memset_async = f_memset_async,
    .h2d_async = f_h2d_async,
    .h2d = f_h2d,
    .d2h = f_d2h,
    .stream_create = f_stream_create,
    .stream_destroy = f_stream_destroy,
    .stream_sync = f_stream_sync,
    .event_create = f_event_create,
    .event_destroy = f_event_destroy,
    .event_record = f_event_record,
    .event_sync = f_event_sync,
    .event_elapsed = f_event_elapsed,
    .crc_pages = f_crc_pages,
    .spectral = f_spectral,
};

/* A fresh fake with one device, no limits, no failures. */
static inline void fake_install(void)
{
    memset(&fake, 0, sizeof fake);
    fake.n_devices = 1;
    fake.mem_budget = -1;
    kvx_gpu_dev = fake_ops;
}

static inline void fake_uninstall(void) { kvx_gpu_dev_reset(); }

/* Runs every queued op (a test's "the GPU caught up"). */
static inline void fake_drain_all(void)
{
    for (int i = 0; i < FAKE_MAX_STREAMS; i++) fake_drain(&fake.streams[i], NULL);
}

#endif
