/*
 * tmpdir.h - the flat temporary directory of the file tests
 * (tests/format/): made by the group setup (fx_setup), emptied between
 * tests where needed (fx_empty_dir), removed by the group teardown
 * (fx_teardown). The tests count what is in it (dir_entries), because a
 * failed write must leave no temporary file behind. Flat: these tests
 * write plain files only.
 */
#ifndef KVX_TEST_TMPDIR_H
#define KVX_TEST_TMPDIR_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

/* "/tmp/kvx_<tag>.XXXXXX"; 0 or -1. */
static inline int fx_mkdtemp(const char *tag)
{
    if (tmpdir[0]) return 0; /* made already (one directory per program) */
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

/* The group setup and teardown of a test program using tmpdir. */
static inline int fx_setup(void **state)
{
    (void)state;
    return fx_mkdtemp("test_files");
}

static inline int fx_teardown(void **state)
{
    (void)state;
    fx_rm_dir();
    return 0;
}

#endif
