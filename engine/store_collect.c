/*
 * store_collect.c - kvx_warmup_collect: the shards a warmup reads, named by
 * shard files or store directories. It lives with the store because a
 * directory is opened as a store (read-only); io/ never reaches the store.
 */
#include "common/internal.h"
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int kvx_warmup_collect(kvx_shard ***out_shards, size_t *out_n, const char *const *paths, size_t n_paths)
{
    if (!out_shards || !out_n || (n_paths && !paths))
        return kvx_fail(KVX_EINVALID, "kvx_warmup_collect: a NULL argument");
    *out_shards = NULL;
    *out_n = 0;
    kvx_shard **all = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (size_t i = 0; i < n_paths; i++) {
        struct stat st;
        if (kvx_os.fstatat(AT_FDCWD, paths[i], &st, 0) != 0) {
            int e = errno;
            rc = kvx_fail(-e, "%s: stat: %s", paths[i], strerror(e));
            goto fail;
        }
        kvx_shard **got = NULL;
        size_t n_got = 0;
        kvx_shard *one = NULL;
        if (S_ISDIR(st.st_mode)) {
            kvx_store *s = NULL;
            rc = kvx_store_open(&s, paths[i], NULL, KVX_STORE_READONLY);
            if (rc) goto fail;
            rc = kvx_store_shards(&got, &n_got, s);
            kvx_store_close(s); /* the shards hold their own references */
            if (rc) goto fail;
        } else {
            rc = kvx_shard_open(&one, paths[i], 0);
            if (rc) goto fail;
            got = &one;
            n_got = 1;
        }
        if (n + n_got > cap) {
            size_t nc = (n + n_got) * 2;
            void *na = realloc(all, nc * sizeof *all);
            if (!na) {
                for (size_t k = 0; k < n_got; k++) kvx_shard_close(got[k]);
                if (got != &one) free(got);
                rc = kvx_fail(-ENOMEM, "kvx_warmup_collect: out of memory");
                goto fail;
            }
            all = na;
            cap = nc;
        }
        for (size_t k = 0; k < n_got; k++) all[n++] = got[k];
        if (got != &one) kvx_free(got); /* kvx_store_shards' array */
    }
    *out_shards = all;
    *out_n = n;
    return 0;
fail:
    for (size_t k = 0; k < n; k++) kvx_shard_close(all[k]);
    free(all);
    return rc;
}
