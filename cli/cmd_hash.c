/*
 * cmd_hash.c - `kvx hash --block-tokens B TOKEN...`: the chained block hash
 * of every full block of a token sequence, one `0x%016x` line per block,
 * exactly as the spec computes it (a partial tail block has no hash).
 */
#include "cli.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static int run_hash(const cli_cmd *self, int argc, char **argv)
{
    static const struct option opts[] = {
        {"block-tokens", required_argument, NULL, 'b'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    uint64_t b = 0;
    int have_b = 0, ch;
    cli_getopt_reset();
    while ((ch = getopt_long(argc, argv, ":b:h", opts, NULL)) != -1) {
        switch (ch) {
        case 'b':
            if (cli_parse_u64(optarg, UINT32_MAX, &b) != 0 || b == 0)
                return cli_usage(self, "--block-tokens must be a whole number from 1 to %u, not '%s'",
                                 UINT32_MAX, optarg);
            have_b = 1;
            break;
        case 'h': cli_print_help(self); return CLI_OK;
        default: return cli_getopt_error(self, ch, argv, opts);
        }
    }
    if (!have_b) return cli_usage(self, "--block-tokens B is required (the engine uses 16)");

    uint32_t *toks = NULL;
    size_t n = 0;
    if (optind < argc) {
        n = (size_t)(argc - optind);
        toks = malloc(n * sizeof *toks);
        if (!toks) return cli_fail(self, "out of memory");
        for (size_t i = 0; i < n; i++) {
            uint64_t t;
            if (cli_parse_u64(argv[optind + (int)i], UINT32_MAX, &t) != 0) {
                free(toks);
                return cli_usage(self, "token '%s' is not a token id (0..%u)", argv[optind + (int)i],
                                 UINT32_MAX);
            }
            toks[i] = (uint32_t)t;
        }
    } else {
        /* No TOKEN arguments: read them from standard input (capped, and
         * stopped at the first byte token text cannot hold). */
        int rc = cli_read_tokens_fd(self, "standard input", 0, CLI_USAGE, &toks, &n);
        if (rc != CLI_OK) return rc;
    }

    size_t nb = n / b;
    uint64_t *h = malloc((nb ? nb : 1) * sizeof *h);
    if (!h) {
        free(toks);
        return cli_fail(self, "out of memory");
    }
    nb = kvx_block_hashes(h, toks, n, (uint32_t)b);
    for (size_t i = 0; i < nb; i++) printf("0x%016" PRIx64 "\n", h[i]);
    free(h);
    free(toks);
    if (fflush(stdout) != 0) return cli_fail(self, "cannot write to standard output");
    return CLI_OK;
}

const cli_cmd cli_cmd_hash = {
    "hash",
    "chained block hashes of a token sequence, one line per full block",
    "Usage: kvx hash --block-tokens B [TOKEN...]\n"
    "\n"
    "Prints the chained block hash (FNV-1a 64 over the parent hash and the\n"
    "block's token ids) of every full block of B tokens, one '0x%016x' line\n"
    "per block. A partial last block has no hash and prints nothing. With no\n"
    "TOKEN arguments, whitespace-separated token ids are read from standard\n"
    "input: at most 1 GiB of text, and reading stops at the first byte that\n"
    "cannot be part of token ids (a NUL, a letter past f...), which is then\n"
    "named.\n"
    "\n"
    "Options:\n"
    "  -b, --block-tokens B  tokens per block (the engine uses 16)\n"
    "  -h, --help            show this help\n"
    "\n"
    "Example:\n"
    "  $ kvx hash --block-tokens 2 1 2 3 4 5\n"
    "  0xa91ab0c1027b9366\n"
    "  0x03df829571605c60\n"
    "\n"
    "Exit status: 0 success, 1 failure (standard input over 1 GiB, a read\n"
    "error), 2 usage error (including standard input that is not token ids).\n",
    run_hash,
};
