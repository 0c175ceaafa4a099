/*
 * hash.h - the chained block hash over many sequences at once (library
 * internal; one sequence: kvx_block_hashes in kvx.h).
 */
#ifndef KVX_FORMAT_HASH_H
#define KVX_FORMAT_HASH_H

#include <stddef.h>
#include <stdint.h>

/* The chained hashes of nseq independent sequences: sequence k's full
 * blocks (n_tokens[k] / block_tokens of them) into out[k], exactly what
 * kvx_block_hashes(out[k], tokens[k], n_tokens[k], block_tokens) writes.
 * One sequence's chain is serial (each block's hash is the next one's
 * parent), so the speed comes from hashing up to four sequences' blocks
 * interleaved: their multiply chains overlap in the core. Returns the
 * number of hashes written in all; 0 for block_tokens 0. */
size_t kvx_block_hashes_multi(uint64_t *const *out, const uint32_t *const *tokens, const size_t *n_tokens,
                              size_t nseq, uint32_t block_tokens);

#endif
