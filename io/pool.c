/*
 * pool.c - the pinned buffer pool: one anonymous mapping bound to a NUMA
 * node (mmap + mbind through libnuma's numaif), locked with mlock, and
 * registered with CUDA when a GPU is there. io_uring registration is done
 * per ring by each kvx_fetch (a registration belongs to a ring).
 *
 * Slots are handed out first-fit from a sorted list of free extents. The
 * list never lets an extent cross a 1 GiB boundary, because the kernel
 * caps one fixed buffer at 1 GiB and a READ_FIXED must lie inside one.
 * Batches are few and large, so a short list beats anything cleverer.
 */
#include "io.h"

#include "common/os.h"

#include <errno.h>
#include <inttypes.h>
#include <numa.h>
#include <numaif.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

const char *kvx_io_mode_name(int mode)
{
    switch (mode) {
    case KVX_IO_AUTO: return "auto";
    case KVX_IO_URING: return "uring";
    case KVX_IO_PREAD: return "pread";
    default: return "unknown";
    }
}

static uint64_t locked_now(void)
{
    char text[8192];
    if (kvx_os_read_text("/proc/self/status", text, sizeof text)) return 0;
    const char *line = strstr(text, "\nVmLck:");
    unsigned long long kb = 0;
    if (!line || sscanf(line + 1, "VmLck: %llu kB", &kb) != 1) return 0;
    return (uint64_t)kb * 1024;
}

int kvx_io_memlock_error(const char *what, int err, uint64_t bytes)
{
    struct rlimit rl;
    getrlimit(RLIMIT_MEMLOCK, &rl);
    uint64_t held = locked_now();
    char cur[32];
    if (rl.rlim_cur == RLIM_INFINITY)
        snprintf(cur, sizeof cur, "unlimited");
    else
        snprintf(cur, sizeof cur, "%" PRIu64 " bytes", (uint64_t)rl.rlim_cur);
    return kvx_fail(KVX_EMEMLOCK,
                    "pinned pool: %s of %" PRIu64 " bytes refused (%s): RLIMIT_MEMLOCK is %s "
                    "(ulimit -l), %" PRIu64 " bytes already locked, %" PRIu64
                    " bytes needed; raise the limit (ulimit -l, LimitMEMLOCK=, docker "
                    "--ulimit memlock) or %s",
                    what, bytes, strerror(err), cur, held, held + bytes,
                    strcmp(what, "mlock") == 0 ? "pass KVX_POOL_NO_MLOCK"
                                               : "pass KVX_POOL_NO_REGISTER or use KVX_IO_PREAD");
}

int kvx_pool_create(kvx_pool **out, const kvx_pool_options *opts)
{
    if (!out) return kvx_fail(KVX_EINVALID, "kvx_pool_create: out is NULL");
    *out = NULL;
    kvx_pool_options def = KVX_POOL_OPTIONS_INIT;
    if (!opts) opts = &def;
    if (opts->version != KVX_POOL_OPTIONS_VERSION)
        return kvx_fail(KVX_EVERSION, "kvx_pool_options.version is %u, expected %u", opts->version,
                        KVX_POOL_OPTIONS_VERSION);
    if (opts->flags & ~(uint32_t)(KVX_POOL_NO_MLOCK | KVX_POOL_NO_CUDA | KVX_POOL_NO_REGISTER))
        return kvx_fail(KVX_EINVALID, "kvx_pool_options.flags has unknown bits 0x%x", opts->flags);
    uint64_t bytes = opts->bytes ? opts->bytes : (uint64_t)64 << 20;
    if (bytes > ((uint64_t)1 << 46))
        return kvx_fail(KVX_EINVALID, "kvx_pool_options.bytes %" PRIu64 " is too large", bytes);
    bytes = kvx_align_up(bytes, KVX_IO_SLOT_ALIGN);

    int have_numa = numa_available() >= 0;
    int node = opts->numa_node;
    if (node != KVX_POOL_NODE_AUTO) {
        if (node < 0 || !have_numa || node > numa_max_node() ||
            !numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)node))
            return kvx_fail(KVX_EINVALID, "kvx_pool_options.numa_node %d: no such NUMA node (%d..%d)",
                            node, 0, have_numa ? numa_max_node() : 0);
    } else {
        node = -1;
        if (opts->gpu >= 0) {
            int gn = -1;
            if (kvx_gpu_numa_node(&gn, opts->gpu) == 0) node = gn;
            kvx_clear_error();
        }
        if (node < 0 && have_numa) {
            int cpu = sched_getcpu();
            node = cpu >= 0 ? numa_node_of_cpu(cpu) : -1;
        }
        if (!have_numa) node = -1;
    }

    /* anonymous memory, not a file: libc, not kvx_os (os.h) */
    void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED)
        return kvx_fail(-errno, "pinned pool: mmap of %" PRIu64 " bytes: %s", bytes, strerror(errno));
    if (node >= 0) {
        /* Bind before the first touch so every page is placed on node. */
        unsigned long mask[16] = {0};
        if ((unsigned)node < sizeof mask * 8) {
            mask[node / (8 * sizeof(unsigned long))] |= 1UL << (node % (8 * sizeof(unsigned long)));
            if (mbind(base, bytes, MPOL_BIND, mask, sizeof mask * 8, 0) != 0) {
                int e = errno;
                munmap(base, bytes);
                return kvx_fail(-e, "pinned pool: mbind to NUMA node %d: %s", node, strerror(e));
            }
        }
    }
    kvx_pool *p = calloc(1, sizeof *p);
    if (!p) {
        munmap(base, bytes);
        return kvx_fail(-ENOMEM, "pinned pool: out of memory");
    }
    p->base = base;
    p->bytes = bytes;
    p->node = node;
    p->no_register = (opts->flags & KVX_POOL_NO_REGISTER) != 0;
    pthread_mutex_init(&p->mu, NULL);
    if (!(opts->flags & KVX_POOL_NO_MLOCK)) {
        /* The raw syscall: sanitizers intercept mlock() as a no-op, which
         * would hide exactly the RLIMIT_MEMLOCK refusal callers must see. */
        if (syscall(SYS_mlock, base, (size_t)bytes) != 0) {
            int e = errno;
            int rc = kvx_io_memlock_error("mlock", e, bytes);
            kvx_pool_destroy(p);
            return rc;
        }
        p->locked = 1;
    } else {
        memset(base, 0, bytes); /* place the pages now, on node */
    }
    if (!(opts->flags & KVX_POOL_NO_CUDA) && opts->gpu >= 0) {
        int rc = kvx_gpu_host_register(base, bytes, opts->gpu);
        if (rc == 0)
            p->cuda_registered = 1;
        else if (rc != KVX_ENOCUDA && rc != KVX_ENOGPU) {
            kvx_pool_destroy(p);
            return rc;
        }
        kvx_clear_error();
    }
    size_t nchunks = (size_t)((bytes + KVX_IO_REG_CHUNK - 1) / KVX_IO_REG_CHUNK);
    p->ext = calloc(nchunks + 1, sizeof *p->ext);
    if (!p->ext) {
        kvx_pool_destroy(p);
        return kvx_fail(-ENOMEM, "pinned pool: out of memory");
    }
    p->cap_ext = nchunks + 1;
    p->slot_units = calloc((size_t)(bytes / KVX_IO_SLOT_ALIGN), sizeof *p->slot_units);
    if (!p->slot_units) {
        kvx_pool_destroy(p);
        return kvx_fail(-ENOMEM, "pinned pool: out of memory");
    }
    for (size_t i = 0; i < nchunks; i++) {
        uint64_t off = (uint64_t)i * KVX_IO_REG_CHUNK;
        p->ext[i].off = off;
        p->ext[i].len = bytes - off < KVX_IO_REG_CHUNK ? bytes - off : KVX_IO_REG_CHUNK;
    }
    p->n_ext = nchunks;
    p->free_bytes = bytes;
    *out = p;
    return 0;
}

void kvx_pool_destroy(kvx_pool *p)
{
    if (!p) return;
    if (p->cuda_registered) kvx_gpu_host_unregister(p->base);
    if (p->locked) syscall(SYS_munlock, p->base, (size_t)p->bytes);
    munmap(p->base, p->bytes);
    pthread_mutex_destroy(&p->mu);
    free(p->ext);
    free(p->slot_units);
    free(p);
}

int kvx_pool_get_info(kvx_pool_info *out, kvx_pool *p)
{
    if (!out || !p) return kvx_fail(KVX_EINVALID, "kvx_pool_get_info: out or pool is NULL");
    pthread_mutex_lock(&p->mu);
    out->base = p->base;
    out->bytes = p->bytes;
    out->free_bytes = p->free_bytes;
    out->numa_node = p->node;
    out->locked = p->locked;
    out->cuda_registered = p->cuda_registered;
    pthread_mutex_unlock(&p->mu);
    return 0;
}

int kvx_pool_alloc(void **out, kvx_pool *p, uint64_t bytes)
{
    if (!out || !p) return kvx_fail(KVX_EINVALID, "kvx_pool_alloc: out or pool is NULL");
    *out = NULL;
    if (bytes == 0) return kvx_fail(KVX_EINVALID, "kvx_pool_alloc: bytes is 0");
    if (bytes > KVX_IO_REG_CHUNK)
        return kvx_fail(KVX_ECAPACITY, "kvx_pool_alloc: %" PRIu64 " bytes exceeds the 1 GiB slot limit",
                        bytes);
    bytes = kvx_align_up(bytes, KVX_IO_SLOT_ALIGN);
    pthread_mutex_lock(&p->mu);
    for (size_t i = 0; i < p->n_ext; i++) {
        if (p->ext[i].len < bytes) continue;
        *out = p->base + p->ext[i].off;
        p->slot_units[p->ext[i].off / KVX_IO_SLOT_ALIGN] = (uint32_t)(bytes / KVX_IO_SLOT_ALIGN);
        p->ext[i].off += bytes;
        p->ext[i].len -= bytes;
        if (p->ext[i].len == 0) {
            memmove(&p->ext[i], &p->ext[i + 1], (p->n_ext - i - 1) * sizeof *p->ext);
            p->n_ext--;
        }
        p->free_bytes -= bytes;
        pthread_mutex_unlock(&p->mu);
        return 0;
    }
    uint64_t fr = p->free_bytes;
    pthread_mutex_unlock(&p->mu);
    return kvx_fail(KVX_ECAPACITY,
                    "pinned pool: no free range of %" PRIu64 " bytes (%" PRIu64 " of %" PRIu64
                    " bytes free); use a larger kvx_pool_options.bytes",
                    bytes, fr, p->bytes);
}

int kvx_pool_free(kvx_pool *p, void *ptr, uint64_t bytes)
{
    if (!p || !ptr) return kvx_fail(KVX_EINVALID, "kvx_pool_free: pool or ptr is NULL");
    uint8_t *b = ptr;
    if (b < p->base || b >= p->base + p->bytes || (uint64_t)(b - p->base) % KVX_IO_SLOT_ALIGN)
        return kvx_fail(KVX_EINVALID, "kvx_pool_free: ptr %p is not a slot of this pool", ptr);
    bytes = kvx_align_up(bytes, KVX_IO_SLOT_ALIGN);
    uint64_t off = (uint64_t)(b - p->base);
    if (bytes == 0 || bytes > p->bytes - off || off / KVX_IO_REG_CHUNK != (off + bytes - 1) / KVX_IO_REG_CHUNK)
        return kvx_fail(KVX_EINVALID, "kvx_pool_free: %" PRIu64 " bytes at offset %" PRIu64
                        " is not a slot of this pool", bytes, off);
    pthread_mutex_lock(&p->mu);
    uint32_t *units = &p->slot_units[off / KVX_IO_SLOT_ALIGN];
    if (*units != bytes / KVX_IO_SLOT_ALIGN) {
        uint32_t have = *units;
        pthread_mutex_unlock(&p->mu);
        if (!have)
            return kvx_fail(KVX_EINVALID, "kvx_pool_free: no slot starts at offset %" PRIu64
                            " (free already, or inside another slot)", off);
        return kvx_fail(KVX_EINVALID, "kvx_pool_free: the slot at offset %" PRIu64 " has %" PRIu64
                        " bytes, not %" PRIu64, off, (uint64_t)have * KVX_IO_SLOT_ALIGN, bytes);
    }
    size_t i = 0;
    while (i < p->n_ext && p->ext[i].off < off) i++;
    /* [off, off+bytes) must not overlap a free extent: a double free. */
    if ((i > 0 && p->ext[i - 1].off + p->ext[i - 1].len > off) ||
        (i < p->n_ext && p->ext[i].off < off + bytes)) {
        pthread_mutex_unlock(&p->mu);
        return kvx_fail(KVX_EINVALID, "kvx_pool_free: %" PRIu64 " bytes at offset %" PRIu64
                        " are (partly) free already", bytes, off);
    }
    uint64_t chunk = off / KVX_IO_REG_CHUNK;
    int merge_prev = i > 0 && p->ext[i - 1].off + p->ext[i - 1].len == off &&
                     p->ext[i - 1].off / KVX_IO_REG_CHUNK == chunk;
    int merge_next = i < p->n_ext && p->ext[i].off == off + bytes &&
                     p->ext[i].off / KVX_IO_REG_CHUNK == chunk;
    if (merge_prev && merge_next) {
        p->ext[i - 1].len += bytes + p->ext[i].len;
        memmove(&p->ext[i], &p->ext[i + 1], (p->n_ext - i - 1) * sizeof *p->ext);
        p->n_ext--;
    } else if (merge_prev) {
        p->ext[i - 1].len += bytes;
    } else if (merge_next) {
        p->ext[i].off = off;
        p->ext[i].len += bytes;
    } else {
        if (p->n_ext == p->cap_ext) {
            size_t nc = p->cap_ext * 2;
            void *ne = realloc(p->ext, nc * sizeof *p->ext);
            if (!ne) {
                pthread_mutex_unlock(&p->mu);
                return kvx_fail(-ENOMEM, "kvx_pool_free: out of memory");
            }
            p->ext = ne;
            p->cap_ext = nc;
        }
        memmove(&p->ext[i + 1], &p->ext[i], (p->n_ext - i) * sizeof *p->ext);
        p->ext[i].off = off;
        p->ext[i].len = bytes;
        p->n_ext++;
    }
    *units = 0;
    p->free_bytes += bytes;
    pthread_mutex_unlock(&p->mu);
    return 0;
}

int kvx_pool_buf_index(const kvx_pool *p, const void *ptr, uint64_t len)
{
    const uint8_t *b = ptr;
    if (!p || p->no_register || b < p->base || len == 0 || len > p->bytes ||
        (uint64_t)(b - p->base) > p->bytes - len)
        return -1;
    uint64_t off = (uint64_t)(b - p->base);
    uint64_t c = off / KVX_IO_REG_CHUNK;
    return c == (off + len - 1) / KVX_IO_REG_CHUNK ? (int)c : -1;
}

unsigned kvx_pool_nbufs(const kvx_pool *p)
{
    return (unsigned)((p->bytes + KVX_IO_REG_CHUNK - 1) / KVX_IO_REG_CHUNK);
}
