/*
 * shard_salvage.c - what a keyed shard file whose checksum failed may
 * still say (format/format.h kvx_shard_salvage_keys): its key table, read
 * as it is, for recovery to keep the deletes it may hold. Never for
 * serving a page: nothing here is proven.
 */
#include "format/format.h"
#include "format/shard_format.h"
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int kvx_shard_salvage_keys(int dirfd, const char *name, kvx_salvaged_key **out, size_t *out_n)
{
    *out = NULL;
    *out_n = 0;
    int fd = kvx_os.openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW, 0);
    if (fd < 0) return kvx_fail(-errno, "%s: cannot open: %s", name, strerror(errno));
    struct stat st;
    uint8_t hdr[KVX_HEADER_BYTES];
    kvx_shard_header h;
    kvx_shard_layout lay;
    int rc = kvx_os.fstat(fd, &st) != 0 ? -errno : 0;
    if (!rc && (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < KVX_HEADER_BYTES))
        rc = kvx_fail(KVX_ETRUNC, "%s: not a regular file of a header's size", name);
    if (!rc) rc = kvx_os_pread_all(fd, hdr, sizeof hdr, 0, NULL);
    if (!rc && memcmp(hdr, KVX_MAGIC, 8) != 0) rc = kvx_fail(KVX_EMAGIC, "magic is not RADX-KVX");
    if (!rc) {
        kvx_header_decode(&h, hdr);
        rc = kvx_shard_header_check(&h);
    }
    if (!rc && !(h.flags & KVX_FLAG_KEYS)) rc = kvx_fail(KVX_EFORMAT, "%s: no key table", name);
    if (!rc && kvx_shard_layout_for(&lay, h.num_blocks, h.flags, h.block_tokens, h.num_layers, h.kv_heads))
        rc = kvx_fail(KVX_EOVERFLOW, "table sizes for %u entries overflow", h.num_blocks);
    /* bounded by the file before anything is allocated (DESIGN.md rule 5) */
    if (!rc) rc = kvx_shard_check_tables(fd, &st, &h, &lay, 0);
    size_t tlen = rc ? 0 : (size_t)(lay.tables_end - KVX_HEADER_BYTES);
    uint8_t *tables = rc ? NULL : malloc(tlen ? tlen : 1);
    if (!rc && !tables) rc = kvx_fail(-ENOMEM, "out of memory for %zu bytes of tables", tlen);
    if (!rc && (rc = kvx_os_pread_all(fd, tables, tlen, KVX_HEADER_BYTES, NULL)))
        rc = kvx_fail(rc == -EIO ? KVX_ETRUNC : rc, "%s: cannot read %zu bytes of tables", name, tlen);
    kvx_salvaged_key *v = rc ? NULL : calloc(h.num_blocks ? h.num_blocks : 1, sizeof *v);
    if (!rc && !v) rc = kvx_fail(-ENOMEM, "out of memory");
    size_t n = 0;
    for (uint32_t i = 0; !rc && i < h.num_blocks; i++) {
        const uint8_t *kr = tables + (lay.key_off - KVX_HEADER_BYTES) + (size_t)i * KVX_KEY_RECORD;
        if (kr[0] == 0) continue; /* no key to read here (a length byte is at most KVX_KEY_MAX) */
        kvx_salvaged_key *k = &v[n++];
        memcpy(k->key, kr + 1, kr[0]);
        k->len = kr[0];
        if (h.flags & KVX_FLAG_SEQ) {
            const uint8_t *q = tables + (lay.seq_off - KVX_HEADER_BYTES) + (size_t)i * 8;
            for (int b = 7; b >= 0; b--) k->seq = k->seq << 8 | q[b];
        }
        if (h.flags & KVX_FLAG_TOMB) k->tomb = tables[(lay.tomb_off - KVX_HEADER_BYTES) + i] == KVX_TOMB_DELETE;
    }
    free(tables);
    kvx_os.close(fd);
    if (rc) {
        free(v);
        return rc;
    }
    *out = v;
    *out_n = n;
    return 0;
}
