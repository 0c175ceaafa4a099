/*
 * options.c - kvx_shard_writer_options_init: the function form of
 * KVX_SHARD_WRITER_OPTIONS_INIT, for callers that cannot use the macro
 * (bindings, languages without C initialisers).
 *
 * Rule: it fills exactly what the macro does. A field left 0 means the
 * default kvx_shard_writer_create documents for it, so the create function
 * stays the one place a default is decided.
 */
#include "common/internal.h"

void kvx_shard_writer_options_init(kvx_shard_writer_options *opts)
{
    if (!opts) return;
    *opts = (kvx_shard_writer_options)KVX_SHARD_WRITER_OPTIONS_INIT;
}
