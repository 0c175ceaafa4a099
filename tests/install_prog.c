/* install_prog.c - the install test's client: a program built against an
 * installed kvx with nothing but `pkg-config kvx` (tests/install_test.sh).
 * It touches each library libkvx leans on: libcrypto (prefix digests),
 * LMDB and the OS seam (a store created, closed and reopened in DIR).
 *
 *   install_prog DIR   (DIR must not exist yet)
 */
#include <kvx.h>
#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: install_prog DIR\n");
        return 2;
    }
    uint32_t tokens[32];
    for (uint32_t i = 0; i < 32; i++) tokens[i] = i * 7 + 1;
    uint8_t digests[2][KVX_DIGEST_BYTES];
    if (kvx_prefix_digests(digests, tokens, 32, 16) != 2 || memcmp(digests[0], digests[1], KVX_DIGEST_BYTES) == 0) {
        fprintf(stderr, "install_prog: kvx_prefix_digests gave no two distinct digests\n");
        return 1;
    }
    kvx_store_options opts;
    kvx_store_options_init(&opts);
    opts.geometry = (kvx_geometry){.num_layers = 2, .kv_heads = 2, .head_dim = 64, .block_tokens = 16,
                                   .quant = KVX_QUANT_FP16};
    opts.capacity_bytes = 64u << 20;
    kvx_store *st = NULL;
    int rc = kvx_store_create(&st, argv[1], &opts);
    if (rc != 0) {
        fprintf(stderr, "install_prog: kvx_store_create %s: %s\n", argv[1], kvx_strerror(rc));
        return 1;
    }
    kvx_store_close(st);
    rc = kvx_store_open(&st, argv[1], &opts.geometry, 0);
    if (rc != 0) {
        fprintf(stderr, "install_prog: kvx_store_open %s: %s\n", argv[1], kvx_strerror(rc));
        return 1;
    }
    kvx_store_close(st);
    printf("kvx %s: digests and a store work\n", kvx_version());
    return 0;
}
