/*
 * store_options.c - kvx_store_options_init: the function form of
 * KVX_STORE_OPTIONS_INIT, for callers that cannot use the macro (the Go
 * binding calls it instead of copying the defaults).
 *
 * Rule: it fills exactly what the macro does. capacity_bytes and
 * shard_bytes stay 0, meaning the defaults kvx_store_create decides (64 GiB;
 * capacity/64 clamped to [512 KiB, 1 GiB]), so a shard size derived from a
 * capacity the caller sets afterwards still follows it.
 */
#include "common/internal.h"

void kvx_store_options_init(kvx_store_options *opts)
{
    if (!opts) return;
    *opts = (kvx_store_options)KVX_STORE_OPTIONS_INIT;
}
