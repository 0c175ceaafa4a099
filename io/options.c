/*
 * options.c - kvx_pool_options_init, kvx_fetch_options_init,
 * kvx_gpu_options_init and kvx_warmup_options_init: the function forms of
 * the data path's *_OPTIONS_INIT macros, for callers that cannot use a
 * macro (the Go binding calls these instead of copying the defaults).
 *
 * Rule: each fills exactly what its macro does. A field left 0 means the
 * default the create function documents for it (64 MiB of pool, a queue
 * depth of 64, ...), so the create function stays the one place a default
 * is decided, and a default that depends on the data (the warmup's chunk
 * size for data already in the page cache) keeps working.
 */
#include "common/internal.h"

void kvx_pool_options_init(kvx_pool_options *opts)
{
    if (!opts) return;
    *opts = (kvx_pool_options)KVX_POOL_OPTIONS_INIT;
}

void kvx_fetch_options_init(kvx_fetch_options *opts)
{
    if (!opts) return;
    *opts = (kvx_fetch_options)KVX_FETCH_OPTIONS_INIT;
}

void kvx_gpu_options_init(kvx_gpu_options *opts)
{
    if (!opts) return;
    *opts = (kvx_gpu_options)KVX_GPU_OPTIONS_INIT;
}

void kvx_warmup_options_init(kvx_warmup_options *opts)
{
    if (!opts) return;
    *opts = (kvx_warmup_options)KVX_WARMUP_OPTIONS_INIT;
}
