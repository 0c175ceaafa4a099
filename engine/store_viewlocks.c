/*
 * store_viewlocks.c - the readers' locks outlive a closed store while a
 * view does (docs/STORE.md "Holes", STORE-27): a view stays valid after
 * kvx_store_close (STORE-5), and the shared flocks on DIR/READERS and
 * shards/ are what keep a writer from punching under it. The store and
 * each shard handle it opens (kvx_st_open_gen) hold one keeper; close
 * hands the keeper the two descriptors; the last handle's release closes
 * them.
 */
#include "store.h"
#include "common/os.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <sys/file.h>

struct st_view_locks {
    atomic_uint refs;
    int fd[2]; /* DIR/READERS and shards/, or -1: given at the store's close */
};

struct st_view_locks *kvx_st_vlocks_new(void)
{
    struct st_view_locks *k = calloc(1, sizeof *k);
    if (!k) return NULL;
    atomic_init(&k->refs, 1); /* the store's */
    k->fd[0] = k->fd[1] = -1;
    return k;
}

static void st_vlocks_drop(void *ctx)
{
    struct st_view_locks *k = ctx;
    if (atomic_fetch_sub_explicit(&k->refs, 1, memory_order_acq_rel) != 1) return;
    for (int i = 0; i < 2; i++)
        if (k->fd[i] >= 0) kvx_os.close(k->fd[i]); /* the last view is gone: the flocks go */
    free(k);
}

void kvx_st_vlocks_attach(kvx_store *s, kvx_shard *sh)
{
    if (!s->vlocks || !sh) return;
    atomic_fetch_add_explicit(&s->vlocks->refs, 1, memory_order_relaxed);
    kvx_shard_on_free(sh, st_vlocks_drop, s->vlocks);
}

void kvx_st_vlocks_keep(kvx_store *s)
{
    struct st_view_locks *k = s->vlocks;
    if (!k) return;
    s->vlocks = NULL;
    if (s->writer) {
        /* still the only writer (its LOCK is held until after this): no
         * other process holds these exclusively, so the tries succeed; a
         * later writer's exclusive try then fails while a view lives */
        if (s->readers_fd >= 0) (void)kvx_os.flock(s->readers_fd, LOCK_SH | LOCK_NB);
        if (s->shardsfd >= 0) (void)kvx_os.flock(s->shardsfd, LOCK_SH | LOCK_NB);
    }
    k->fd[0] = s->readers_fd;
    k->fd[1] = s->shardsfd;
    s->readers_fd = s->shardsfd = -1;
    st_vlocks_drop(k); /* the store's hold: with no view left, closed now */
}
