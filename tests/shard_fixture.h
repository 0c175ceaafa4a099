/*
 * shard_fixture.h - the temporary directory of the shard-file tests
 * (test_shard, test_convert): made by the group setup, emptied between
 * tests where needed, removed by the group teardown. The tests count what
 * is in it (dir_entries), because a failed write must leave no temporary
 * file behind. Flat: these tests write plain files only.
 */
#ifndef KVX_SHARD_FIXTURE_H
#define KVX_SHARD_FIXTURE_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

/* "/tmp/kvx_<tag>.XXXXXX"; 0 or -1. */
static inline int fx_mkdtemp(const char *tag)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/kvx_%s.XXXXXX", tag);
    return mkdtemp(tmpdir) ? 0 : -1;
}

/* tmpdir/name, in one static buffer (valid until the next call). */
static inline const char *path_of(const char *name)
{
    static char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, name);
    return p;
}

/* How many names tmpdir holds, "." and ".." aside. */
static inline int dir_entries(void)
{
    DIR *d = opendir(tmpdir);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* Unlinks every file in tmpdir; -1 if it cannot be read. */
static inline int fx_empty_dir(void)
{
    DIR *d = opendir(tmpdir);
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", tmpdir, e->d_name);
        unlink(p);
    }
    closedir(d);
    return 0;
}

static inline void fx_rm_dir(void)
{
    fx_empty_dir();
    rmdir(tmpdir);
}

#endif
