/*
 * prog_store_reader.c - the reader process of tests/system/twoproc.c: opens a
 * store KVX_STORE_READONLY, checks what is there, tells the parent it is
 * ready (a byte on stdout), waits for the parent to publish more (a byte on
 * stdin), then checks that it sees the new blocks byte-exact through the
 * handle it opened before they existed, and that it cannot become a second
 * writer while the parent holds the store.
 *
 * usage: prog_store_reader DIR FIRST_SEQ SECOND_SEQ NBLOCKS
 *        prog_store_reader DIR   (open as a writer, waiting for the lock)
 * exit 0 when every check held; 10+ names the check that failed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "pages.h"

static size_t served(kvx_store *s, uint64_t seq, size_t nb)
{
    uint32_t t[64 * SU_B];
    uint64_t h[64];
    su_tokens(t, seq, nb, 0);
    kvx_block_hashes(h, t, nb * SU_B, SU_B);
    kvx_view v[64];
    size_t n = 0;
    if (kvx_store_prefix(v, &n, s, t, nb * SU_B, 64) != 0) return (size_t)-1;
    for (size_t i = 0; i < n; i++) {
        uint8_t want[64];
        su_page(want, 64, h[i]);
        if (v[i].hash != h[i] || memcmp(v[i].page, want, 64) != 0) return (size_t)-1;
    }
    kvx_views_release(v, n);
    return n;
}

int main(int argc, char **argv)
{
    if (argc == 2) {
        kvx_store *w;
        int rc = kvx_store_open(&w, argv[1], NULL, 0); /* blocks on the flock */
        kvx_store_close(w);
        return rc == 0 ? 0 : 19;
    }
    if (argc != 5) return 2;
    uint64_t a = strtoull(argv[2], NULL, 10), b = strtoull(argv[3], NULL, 10);
    size_t nb = strtoul(argv[4], NULL, 10);
    kvx_store *s;
    if (kvx_store_open(&s, argv[1], NULL, KVX_STORE_READONLY) != 0) return 10;
    if (served(s, a, nb) != nb) return 11;
    if (served(s, b, nb) != 0) return 12;
    kvx_store *w = NULL;
    if (kvx_store_open(&w, argv[1], NULL, KVX_STORE_NOWAIT) != KVX_EBUSY || w) return 13;
    if (write(1, "r", 1) != 1) return 14;
    char c;
    if (read(0, &c, 1) != 1) return 15;
    if (served(s, b, nb) != nb) return 16;
    if (served(s, a, nb) != nb) return 17;
    kvx_store_stats st;
    if (kvx_store_stat(&st, s) != 0 || st.blocks < 2 * nb) return 18;
    kvx_store_close(s);
    return 0;
}
