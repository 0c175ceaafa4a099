/*
 * format/format.h - what the byte formats offer the layers above them
 * beyond kvx.h (the store's served-page check). Not API.
 */
#ifndef KVX_FORMAT_H
#define KVX_FORMAT_H

#include "common/internal.h"

/* The page of entry index, CRC-checked unless this handle already checked
 * it (a per-page bit, set on the first pass): what every view of the store
 * goes through. KVX_EPAGECRC, or KVX_ETRUNC for a missing page. */
int kvx_shard_page_checked(const void **out_page, const kvx_shard *s, uint32_t index);
/* Entries whose page lies (partly) past the end of the file. */
uint32_t kvx_shard_missing(const kvx_shard *s);

#endif
