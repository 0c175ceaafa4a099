/*
 * prog_store_crash.c - the child of tests/system/crash.c: puts, flushes,
 * evicts (small capacity) and compacts (gc) in an endless loop until its
 * parent SIGKILLs it. It keeps a log the parent trusts:
 *   "B <evicted_blocks>"  fsynced BEFORE an operation that may evict
 *   "A <hash>"            each block of a sequence, only after flush == 0
 *   "E <hash>"            an acknowledged block the operation evicted
 *   "C"                   the operation is complete
 * so after a kill the parent knows exactly which acknowledged blocks may
 * be missing (only those an interrupted operation could have evicted, and
 * no more than the store's own evicted_blocks counter grew by).
 *
 * usage: prog_store_crash DIR LOG SEED
 */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pages.h"

static int logfd;

static void logline(const char *s)
{
    size_t n = strlen(s);
    if (write(logfd, s, n) != (ssize_t)n) exit(3);
}

static void logsync(void)
{
    if (fdatasync(logfd) != 0) exit(3);
}

/* Keeps in known[] only the blocks the store still holds; each one an
 * eviction removed is logged as "E <hash>". Returns the new count. */
static size_t drop_evicted(kvx_store *s, uint64_t *known, size_t n)
{
    char line[64];
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        kvx_view v;
        if (kvx_store_get_hash(&v, s, known[i]) == 0) {
            kvx_view_release(&v);
            known[w++] = known[i];
        } else {
            snprintf(line, sizeof line, "E %016" PRIx64 "\n", known[i]);
            logline(line);
        }
    }
    return w;
}

int main(int argc, char **argv)
{
    if (argc != 4) return 2;
    uint64_t seed = strtoull(argv[3], NULL, 10);
    kvx_store *s;
    logfd = open(argv[2], O_WRONLY | O_APPEND | O_CREAT, 0600);
    if (logfd < 0) return 3;
    /* opening as the writer may evict (capacity after an interrupted
     * flush): bracket it like any operation */
    kvx_store_stats st0;
    if (kvx_store_open(&s, argv[1], NULL, KVX_STORE_READONLY) != 0 || kvx_store_stat(&st0, s) != 0) return 4;
    kvx_store_close(s);
    char b0[64];
    snprintf(b0, sizeof b0, "\nB %" PRIu64 "\n", st0.evicted_blocks);
    if (write(logfd, b0, strlen(b0)) != (ssize_t)strlen(b0) || fdatasync(logfd) != 0) return 3;
    if (kvx_store_open(&s, argv[1], NULL, 0) != 0) {
        fprintf(stderr, "child open: %s\n", kvx_last_error());
        return 4;
    }
    /* acknowledged hashes this process knows of (for the eviction scan) */
    size_t cap = 1 << 16, n = 0;
    uint64_t *known = malloc(cap * sizeof *known);
    char line[64];
    /* earlier children's acknowledged blocks: replay the log (A adds, E removes) */
    FILE *f = fopen(argv[2], "r");
    if (f) {
        char buf[128];
        while (fgets(buf, sizeof buf, f)) {
            if (!strchr(buf, '\n')) break; /* torn last line */
            uint64_t x = strtoull(buf + 2, NULL, 16);
            if (buf[0] == 'A') {
                if (n == cap) known = realloc(known, (cap *= 2) * sizeof *known);
                known[n++] = x;
            } else if (buf[0] == 'E') {
                for (size_t i = 0; i < n; i++)
                    if (known[i] == x) known[i--] = known[--n];
            }
        }
        fclose(f);
    }
    /* blocks an interrupted eviction of the previous child removed (the
     * parent has checked they were within that eviction): record them */
    n = drop_evicted(s, known, n);
    logline("C\n");
    logsync();
    for (uint64_t op = 0;; op++) {
        uint64_t r = su_mix(seed * 1000003 + op);
        kvx_store_stats st;
        if (kvx_store_stat(&st, s) != 0) return 5;
        snprintf(line, sizeof line, "B %" PRIu64 "\n", st.evicted_blocks);
        logline(line);
        logsync();
        int rc;
        size_t nb = 1 + r % 6;
        uint32_t t[6 * SU_B];
        uint64_t h[6];
        if (op % 9 == 8) {
            rc = kvx_store_gc(s);
            nb = 0;
        } else {
            uint64_t seq = seed * 100000 + op;
            su_tokens(t, seq, nb, r % 3);
            uint8_t *p = su_pages(t, nb, h, 64);
            rc = kvx_store_put(s, t, nb * SU_B, p, nb, NULL, NULL);
            free(p);
            if (rc == 0) rc = kvx_store_flush(s);
        }
        if (rc != 0) {
            fprintf(stderr, "child op %" PRIu64 ": %s\n", op, kvx_last_error());
            return 6;
        }
        for (size_t i = 0; i < nb; i++) {
            snprintf(line, sizeof line, "A %016" PRIx64 "\n", h[i]);
            logline(line);
            if (n == cap) known = realloc(known, (cap *= 2) * sizeof *known);
            known[n++] = h[i];
        }
        kvx_store_stats st2;
        if (kvx_store_stat(&st2, s) != 0) return 5;
        if (st2.evicted_blocks != st.evicted_blocks) n = drop_evicted(s, known, n);
        logline("C\n");
        logsync();
    }
}
