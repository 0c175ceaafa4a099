/*
 * prog_hold_writer.c - a second writer for tests/cli/trust.c: opens
 * the store DIR as its writer (kvx_store_open, flags 0: it holds the write
 * lock), says "ready" on stdout, and keeps the store until its stdin ends
 * (the test closes the pipe, or kills it), two minutes at most.
 *
 * usage: prog_hold_writer DIR     exit 0, or 10 when the store did not open
 */
#include <stdio.h>
#include <unistd.h>

#include "kvx.h"

int main(int argc, char **argv)
{
    if (argc != 2) return 2;
    alarm(120); /* never outlives a test that lost track of it */
    kvx_store *s = NULL;
    int rc = kvx_store_open(&s, argv[1], NULL, 0);
    if (rc != 0) {
        fprintf(stderr, "prog_hold_writer: %s: %s\n", argv[1], kvx_last_error());
        return 10;
    }
    printf("ready %ld\n", (long)getpid());
    fflush(stdout);
    char b[64];
    while (read(0, b, sizeof b) > 0) {}
    kvx_store_close(s);
    return 0;
}
