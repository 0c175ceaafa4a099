/*
 * powercut.h - simulated power loss over the OS seam (common/os.h), for
 * tests. kill -9 keeps the page cache, so it never tests fsync ordering;
 * this does, the way SQLite's crash tests and ALICE do: it records every
 * write, fsync and directory change the store makes through kvx_os and, at
 * a chosen crash point, writes the directory a power cut could leave.
 *
 * The model
 * ---------
 * - Scope: one store directory ("the root"), snapshotted by pc_begin (every
 *   file and entry in it is durable then). Its subdirectories are tracked
 *   (shards/, staging/, quarantine/, any made later through kvx_os.mkdir
 *   or mkdirat), except those named as "copied" (index/: LMDB's files are
 *   outside the seam; see below), which are copied as they are at the
 *   crash point.
 * - Files are tracked by inode (fstat after each open; a file created by an
 *   open with O_CREAT is a new file even when its inode number is reused).
 *   A file has its content as of its last fsync/fdatasync (read from the
 *   real file at that moment) and the list of pwrite/ftruncate calls since.
 * - Directories are tracked by path: the entry set as of the last fsync of
 *   the directory and the list of entry changes since: a create (an open
 *   with O_CREAT that made the file, or a linkat), unlink/unlinkat,
 *   mkdir/mkdirat, rename, rename_noreplace and renameat. A change is
 *   durable once its directory is fsynced (an fsync/fdatasync of a
 *   descriptor opened on it, or dup'd from one: this is how
 *   kvx_os_fsync_dir and kvx_os_fsync_parent work). A rename across two
 *   directories is two changes, the new name in the destination and the
 *   removal in the source, each durable with its own directory's fsync;
 *   while both are pending it happens whole or not at all (a journaled
 *   rename), once one side is durable the other is applied at random (so
 *   a shard fsynced into shards/ may also still be in staging/).
 * - Crash points are the calls that change or sync something: pwrite,
 *   ftruncate, fallocate (a punched range is a write of zeros), fsync, fdatasync, an open with O_CREAT or O_TRUNC, the
 *   renames, unlinks, linkat, mkdir and mkdirat. Crash point k is the instant just before
 *   the k-th such call (numbered from 1 after pc_begin): the call and all
 *   later ones never happen. The hook given to pc_begin runs there.
 * - The post-crash image (pc_image): for every tracked directory, its
 *   durable entries, then each pending entry change in order, each applied
 *   or not at random; for every file that ends up named, its durable
 *   content, then each unsynced write in order: applied, dropped, or, for a
 *   write that crosses a 512-byte boundary of the file, torn there (only
 *   the part before or only the part after the boundary lands); each
 *   unsynced ftruncate applied or not. A file named twice (a linkat, or a
 *   rename half applied) is one file with two names (a hard link) in the
 *   image, as on disk. pc_image with all = 1
 *   applies everything: the state kill -9 would leave (the "twin"), which
 *   pc_compare_live checks against the real directory.
 * - LMDB (index/data.mdb, lock.mdb) does its own I/O outside the seam and
 *   fsyncs its own commit; the model assumes a committed LMDB transaction is
 *   durable when mdb_txn_commit returns, and that no transaction is in
 *   flight at a crash point (crash points are seam calls, made outside
 *   LMDB calls). index/ is therefore copied as it is at the crash point,
 *   except while the store's UNSYNCED mark is in the root (a lagging
 *   index, engine/store_lag.c: commits without LMDB's syncs): then a
 *   power-cut image's index/data.mdb is arbitrary (pc_mangle_lagging_index),
 *   and the image is opened in a new boot (pc_reboot).
 * - Calls that change a tracked directory or file outside the seam cannot
 *   be seen; the ones the seam sees in an untracked place (a create,
 *   rename, unlink or mkdir outside the root, a write to a file the model
 *   does not know) are counted in pc_outside, with the first one described
 *   in pc_outside_what, so a test can insist there are none.
 *
 * Single-threaded: the seam wrappers keep global state without locks (the
 * store's writer path makes its calls from the calling thread).
 */
#ifndef KVX_TEST_POWERCUT_H
#define KVX_TEST_POWERCUT_H

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "common/os.h"

#define PC_SECTOR 512u
#define PC_MAXFD 4096

enum { PC_W_WRITE = 1, PC_W_TRUNC = 2 };
typedef struct pc_wop {
    int kind;
    uint64_t off; /* WRITE: file offset; TRUNC: the new size */
    size_t len;
    uint8_t *data;
} pc_wop;

typedef struct pc_file {
    dev_t dev;
    ino_t ino;
    uint8_t *dur; /* content as of the last fsync */
    size_t dur_len;
    pc_wop *ops; /* unsynced writes and truncates, in order */
    size_t nops, capops;
    uint8_t *img; /* this image's content (built once per image) */
    size_t img_len;
    int img_built;
    char img_at[PATH_MAX]; /* this image's first name for it: later names are hard links */
} pc_file;

enum { PC_T_FILE = 1, PC_T_DIR = 2, PC_T_COPY = 3 };
typedef struct pc_ent {
    char *name;
    int type; /* PC_T_*: idx into pc_files, pc_dirs or pc_copies */
    int idx;
} pc_ent;

enum { PC_C_ADD = 1, PC_C_DEL, PC_C_REN, PC_C_XADD, PC_C_XDEL };
typedef struct pc_change {
    int kind;
    char *name; /* ADD, DEL, XADD, XDEL: the name; REN: from */
    char *to;   /* REN: to */
    int type, idx;
    int ren; /* XADD/XDEL: index into pc_rens */
} pc_change;

typedef struct pc_entset {
    pc_ent *e;
    size_t n, cap;
} pc_entset;

typedef struct pc_dir {
    char *path;
    pc_entset dur; /* as of the last fsync of the directory */
    pc_entset cur; /* as it is now */
    pc_change *pend;
    size_t npend, cappend;
} pc_dir;

typedef struct pc_ren {
    int halves; /* halves still pending (2: neither directory synced) */
    int coin;   /* this image's decision while both are pending; -1 none */
} pc_ren;

typedef void (*pc_hook_fn)(long k, void *ctx);

static pc_file **pc_files;
static size_t pc_nfiles, pc_capfiles;
static pc_dir **pc_dirs;
static size_t pc_ndirs, pc_capdirs;
static char **pc_copies; /* live paths of copied trees */
static size_t pc_ncopies, pc_capcopies;
static const char **pc_copy_names; /* directory names copied as they are */
static pc_ren *pc_rens;
static size_t pc_nrens, pc_caprens;
static struct {
    char *path;
    int file; /* index into pc_files, or -1 */
    int dir;  /* index into pc_dirs, or -1 */
} pc_fd[PC_MAXFD];
static kvx_os_ops pc_real;
static long pc_ops;     /* crash points passed */
static long pc_outside; /* calls the model could not place */
static char pc_outside_what[512];
static pc_hook_fn pc_hook;
static void *pc_hook_ctx;
static int pc_in_hook;
static uint64_t pc_rng;
/* Self-test of a test: with PC_IGNORE_DIR_SYNC / PC_IGNORE_FILE_SYNC set,
 * the model treats those fsyncs as never made (the real call still runs),
 * as if the store had forgotten them; a good crash test must then fail. */
#define PC_IGNORE_DIR_SYNC 1
#define PC_IGNORE_FILE_SYNC 2
static int pc_ignore_sync;

/* ------------------------------------------------------------- helpers */

static inline uint64_t pc_mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

static inline uint64_t pc_rand(void) { return pc_mix(pc_rng++); }

static void *pc_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "powercut: out of memory\n");
        abort();
    }
    return q;
}

static char *pc_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = pc_xrealloc(NULL, n);
    memcpy(d, s, n);
    return d;
}

#define PC_GROW(arr, n, cap)                                                 \
    do {                                                                     \
        if ((n) == (cap)) {                                                  \
            (cap) = (cap) ? (cap) * 2 : 16;                                  \
            (arr) = pc_xrealloc((arr), (cap) * sizeof *(arr));               \
        }                                                                    \
    } while (0)

__attribute__((format(printf, 1, 2))) static void pc_note_outside(const char *fmt, ...)
{
    if (pc_outside++ == 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(pc_outside_what, sizeof pc_outside_what, fmt, ap);
        va_end(ap);
    }
}

/* "//" collapsed, "/." components and a trailing "/" removed. */
static void pc_normalize(char *p)
{
    char *w = p;
    for (const char *r = p; *r;) {
        if (r[0] == '/' && (r[1] == '/' || (r[1] == '.' && (r[2] == '/' || r[2] == '\0')))) {
            r += r[1] == '/' ? 1 : 2;
            continue;
        }
        *w++ = *r++;
    }
    *w = '\0';
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') p[--n] = '\0';
}

/* The absolute path of (dirfd, path); -1 when it cannot be known. */
static int pc_resolve(int dirfd, const char *path, char *out, size_t cap)
{
    int n;
    if (path[0] == '/') {
        n = snprintf(out, cap, "%s", path);
    } else if (dirfd == AT_FDCWD) {
        char cwd[PATH_MAX];
        if (!getcwd(cwd, sizeof cwd)) return -1;
        n = snprintf(out, cap, "%s/%s", cwd, path);
    } else if (dirfd >= 0 && dirfd < PC_MAXFD && pc_fd[dirfd].path) {
        n = snprintf(out, cap, "%s/%s", pc_fd[dirfd].path, path);
    } else {
        return -1;
    }
    if (n < 0 || (size_t)n >= cap) return -1;
    pc_normalize(out);
    return 0;
}

/* Splits an absolute path into its directory (in dir) and base name. */
static const char *pc_split(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 0;
    if (n == 0) n = 1; /* "/x" */
    if (n >= cap) n = cap - 1;
    memcpy(dir, path, n);
    dir[n] = '\0';
    return slash ? slash + 1 : path;
}

/* The newest tracked directory at path (a removed one keeps its path). */
static int pc_dir_find(const char *path)
{
    for (size_t i = pc_ndirs; i-- > 0;)
        if (!strcmp(pc_dirs[i]->path, path)) return (int)i;
    return -1;
}

/* Is path inside (or equal to) a copied tree? */
static int pc_in_copy(const char *path)
{
    for (size_t i = 0; i < pc_ncopies; i++) {
        size_t n = strlen(pc_copies[i]);
        if (!strncmp(path, pc_copies[i], n) && (path[n] == '\0' || path[n] == '/')) return 1;
    }
    return 0;
}

static int pc_is_copy_name(const char *name)
{
    for (const char **c = pc_copy_names; c && *c; c++)
        if (!strncmp(name, *c, strlen(*c))) return 1;
    return 0;
}

static pc_ent *pc_set_find(pc_entset *s, const char *name)
{
    for (size_t i = 0; i < s->n; i++)
        if (!strcmp(s->e[i].name, name)) return &s->e[i];
    return NULL;
}

static void pc_set_put(pc_entset *s, const char *name, int type, int idx)
{
    pc_ent *e = pc_set_find(s, name);
    if (!e) {
        PC_GROW(s->e, s->n, s->cap);
        e = &s->e[s->n++];
        e->name = pc_strdup(name);
    }
    e->type = type;
    e->idx = idx;
}

static void pc_set_del(pc_entset *s, const char *name)
{
    pc_ent *e = pc_set_find(s, name);
    if (!e) return;
    free(e->name);
    size_t i = (size_t)(e - s->e);
    memmove(&s->e[i], &s->e[i + 1], (s->n - i - 1) * sizeof *e);
    s->n--;
}

static void pc_set_copy(pc_entset *dst, const pc_entset *src)
{
    dst->n = 0;
    for (size_t i = 0; i < src->n; i++) pc_set_put(dst, src->e[i].name, src->e[i].type, src->e[i].idx);
}

static void pc_set_free(pc_entset *s)
{
    for (size_t i = 0; i < s->n; i++) free(s->e[i].name);
    free(s->e);
    memset(s, 0, sizeof *s);
}

/* Applies change c to set s (a rename whose source is absent does nothing). */
static void pc_apply_change(pc_entset *s, const pc_change *c)
{
    switch (c->kind) {
    case PC_C_ADD:
    case PC_C_XADD: pc_set_put(s, c->name, c->type, c->idx); break;
    case PC_C_DEL:
    case PC_C_XDEL: pc_set_del(s, c->name); break;
    case PC_C_REN: {
        pc_ent *e = pc_set_find(s, c->name);
        if (!e) break;
        int type = e->type, idx = e->idx;
        pc_set_del(s, c->name);
        pc_set_put(s, c->to, type, idx);
        break;
    }
    }
}

/* Records a change in directory d (its current set follows at once). */
static void pc_change_add(int d, int kind, const char *name, const char *to, int type, int idx, int ren)
{
    pc_dir *D = pc_dirs[d];
    PC_GROW(D->pend, D->npend, D->cappend);
    pc_change *c = &D->pend[D->npend++];
    c->kind = kind;
    c->name = pc_strdup(name);
    c->to = to ? pc_strdup(to) : NULL;
    c->type = type;
    c->idx = idx;
    c->ren = ren;
    pc_apply_change(&D->cur, c);
}

static int pc_dir_new(const char *path)
{
    pc_dir *D = pc_xrealloc(NULL, sizeof *D);
    memset(D, 0, sizeof *D);
    D->path = pc_strdup(path);
    PC_GROW(pc_dirs, pc_ndirs, pc_capdirs);
    pc_dirs[pc_ndirs] = D;
    return (int)pc_ndirs++;
}

static int pc_copy_new(const char *path)
{
    PC_GROW(pc_copies, pc_ncopies, pc_capcopies);
    pc_copies[pc_ncopies] = pc_strdup(path);
    return (int)pc_ncopies++;
}

/* Reads a whole file through fd (any access mode) into *out. */
static int pc_read_fd(int fd, uint8_t **out, size_t *out_len)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    int rfd = open(proc, O_RDONLY | O_CLOEXEC);
    if (rfd < 0) return -errno;
    struct stat st;
    if (fstat(rfd, &st) != 0) {
        int e = -errno;
        close(rfd);
        return e;
    }
    size_t n = (size_t)st.st_size, got = 0;
    uint8_t *b = pc_xrealloc(NULL, n);
    while (got < n) {
        ssize_t r = pread(rfd, b + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(rfd);
    *out = b;
    *out_len = got;
    return 0;
}

static int pc_file_new(const struct stat *st)
{
    pc_file *f = pc_xrealloc(NULL, sizeof *f);
    memset(f, 0, sizeof *f);
    f->dev = st->st_dev;
    f->ino = st->st_ino;
    PC_GROW(pc_files, pc_nfiles, pc_capfiles);
    pc_files[pc_nfiles] = f;
    return (int)pc_nfiles++;
}

/* The newest file object with this inode (inode numbers are reused). */
static int pc_file_by_ino(const struct stat *st)
{
    for (size_t i = pc_nfiles; i-- > 0;)
        if (pc_files[i]->dev == st->st_dev && pc_files[i]->ino == st->st_ino) return (int)i;
    return -1;
}

static void pc_file_clear_ops(pc_file *f)
{
    for (size_t i = 0; i < f->nops; i++) free(f->ops[i].data);
    f->nops = 0;
}

static void pc_file_op(pc_file *f, int kind, uint64_t off, const void *data, size_t len)
{
    PC_GROW(f->ops, f->nops, f->capops);
    pc_wop *w = &f->ops[f->nops++];
    w->kind = kind;
    w->off = off;
    w->len = len;
    w->data = NULL;
    if (data && len) {
        w->data = pc_xrealloc(NULL, len);
        memcpy(w->data, data, len);
    }
}

/* Snapshot of a real directory into tracked directory d (all durable). */
static void pc_snapshot_dir(int d)
{
    DIR *dp = opendir(pc_dirs[d]->path);
    if (!dp) return;
    struct dirent *de;
    while ((de = readdir(dp))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", pc_dirs[d]->path, de->d_name);
        struct stat st;
        if (lstat(path, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            if (pc_is_copy_name(de->d_name)) {
                pc_set_put(&pc_dirs[d]->dur, de->d_name, PC_T_COPY, pc_copy_new(path));
            } else {
                int sub = pc_dir_new(path);
                pc_set_put(&pc_dirs[d]->dur, de->d_name, PC_T_DIR, sub);
                pc_snapshot_dir(sub);
            }
        } else if (S_ISREG(st.st_mode)) {
            int fi = pc_file_new(&st);
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                pc_read_fd(fd, &pc_files[fi]->dur, &pc_files[fi]->dur_len);
                close(fd);
            }
            pc_set_put(&pc_dirs[d]->dur, de->d_name, PC_T_FILE, fi);
        }
    }
    closedir(dp);
    pc_set_copy(&pc_dirs[d]->cur, &pc_dirs[d]->dur);
}

/* ----------------------------------------------------- the seam wrappers */

static void pc_tick(void)
{
    long k = ++pc_ops;
    if (pc_hook && !pc_in_hook) {
        int e = errno;
        pc_in_hook = 1;
        pc_hook(k, pc_hook_ctx);
        pc_in_hook = 0;
        errno = e;
    }
}

static void pc_fd_set(int fd, const char *path, int file, int dir)
{
    if (fd < 0 || fd >= PC_MAXFD) return;
    free(pc_fd[fd].path);
    pc_fd[fd].path = path ? pc_strdup(path) : NULL;
    pc_fd[fd].file = file;
    pc_fd[fd].dir = dir;
}

static int pc_open_common(int dirfd, const char *p, int fl, mode_t m, int at)
{
    char full[PATH_MAX], dir[PATH_MAX];
    int known = pc_resolve(at ? dirfd : AT_FDCWD, p, full, sizeof full) == 0;
    int creat = (fl & O_CREAT) != 0;
    if (creat || (fl & O_TRUNC)) pc_tick();
    struct stat pre;
    int existed = 1;
    if (creat) existed = fstatat(at ? dirfd : AT_FDCWD, p, &pre, AT_SYMLINK_NOFOLLOW) == 0;
    int fd = at ? pc_real.openat(dirfd, p, fl, m) : pc_real.open(p, fl, m);
    if (fd < 0) return fd;
    int e = errno;
    struct stat st;
    int file = -1, d = -1;
    if (fstat(fd, &st) == 0) {
        if (S_ISDIR(st.st_mode)) {
            d = known ? pc_dir_find(full) : -1;
        } else if (S_ISREG(st.st_mode)) {
            const char *base = known ? pc_split(full, dir, sizeof dir) : NULL;
            int pd = known ? pc_dir_find(dir) : -1;
            if (creat && !existed) {
                file = pc_file_new(&st);
                if (pd >= 0) pc_change_add(pd, PC_C_ADD, base, NULL, PC_T_FILE, file, -1);
                else if (!known || !pc_in_copy(full)) pc_note_outside("create of %s", known ? full : p);
            } else {
                file = pc_file_by_ino(&st);
                if (file < 0 && pd >= 0) pc_note_outside("open of %s, a file the model does not know", full);
            }
            if (file >= 0 && existed && (fl & O_TRUNC)) pc_file_op(pc_files[file], PC_W_TRUNC, 0, NULL, 0);
        }
    }
    pc_fd_set(fd, known ? full : NULL, file, d);
    errno = e;
    return fd;
}

static int pc_w_open(const char *p, int fl, mode_t m) { return pc_open_common(AT_FDCWD, p, fl, m, 0); }
static int pc_w_openat(int d, const char *p, int fl, mode_t m) { return pc_open_common(d, p, fl, m, 1); }

static int pc_w_close(int fd)
{
    if (fd >= 0 && fd < PC_MAXFD) pc_fd_set(fd, NULL, -1, -1);
    return pc_real.close(fd);
}

static int pc_fd_file(int fd) { return fd >= 0 && fd < PC_MAXFD && pc_fd[fd].path ? pc_fd[fd].file : -1; }

static ssize_t pc_w_pwrite(int fd, const void *b, size_t n, off_t o)
{
    pc_tick();
    ssize_t r = pc_real.pwrite(fd, b, n, o);
    if (r > 0) {
        int e = errno, f = pc_fd_file(fd);
        if (f >= 0) pc_file_op(pc_files[f], PC_W_WRITE, (uint64_t)o, b, (size_t)r);
        else pc_note_outside("pwrite to fd %d, a file the model does not know", fd);
        errno = e;
    }
    return r;
}

static int pc_w_ftruncate(int fd, off_t len)
{
    pc_tick();
    int r = pc_real.ftruncate(fd, len);
    if (r == 0) {
        int f = pc_fd_file(fd);
        if (f >= 0) pc_file_op(pc_files[f], PC_W_TRUNC, (uint64_t)len, NULL, 0);
        else pc_note_outside("ftruncate of fd %d, a file the model does not know", fd);
    }
    return r;
}

/* A punched range (FALLOC_FL_PUNCH_HOLE) reads as zeros: to the model, a
 * write of zeros, unsynced until the file's next sync (so a cut may drop
 * it, keep it, or tear it at a 512-byte boundary, as a punch of some of
 * its blocks). Other modes change no byte a reader sees. */
static int pc_w_fallocate(int fd, int mode, off_t o, off_t n)
{
    pc_tick();
    int r = pc_real.fallocate(fd, mode, o, n);
    if (r == 0 && (mode & FALLOC_FL_PUNCH_HOLE) && n > 0) {
        int e = errno, f = pc_fd_file(fd);
        uint8_t *z = calloc(1, (size_t)n);
        if (f >= 0 && z)
            pc_file_op(pc_files[f], PC_W_WRITE, (uint64_t)o, z, (size_t)n);
        else if (f < 0)
            pc_note_outside("fallocate of fd %d, a file the model does not know", fd);
        free(z);
        errno = e;
    }
    return r;
}

static void pc_dir_sync(int d)
{
    pc_dir *D = pc_dirs[d];
    for (size_t i = 0; i < D->npend; i++) {
        pc_change *c = &D->pend[i];
        pc_apply_change(&D->dur, c);
        if (c->kind == PC_C_XADD || c->kind == PC_C_XDEL) pc_rens[c->ren].halves--;
        free(c->name);
        free(c->to);
    }
    D->npend = 0;
}

static void pc_after_sync(int fd)
{
    if (fd < 0 || fd >= PC_MAXFD || !pc_fd[fd].path) return;
    if (pc_fd[fd].dir >= 0) {
        if (!(pc_ignore_sync & PC_IGNORE_DIR_SYNC)) pc_dir_sync(pc_fd[fd].dir);
    } else if (pc_fd[fd].file >= 0 && !(pc_ignore_sync & PC_IGNORE_FILE_SYNC)) {
        pc_file *f = pc_files[pc_fd[fd].file];
        uint8_t *b;
        size_t n;
        if (pc_read_fd(fd, &b, &n) == 0) {
            free(f->dur);
            f->dur = b;
            f->dur_len = n;
            pc_file_clear_ops(f);
        } else {
            pc_note_outside("fsync of %s: cannot read it back", pc_fd[fd].path);
        }
    }
}

static int pc_w_fsync(int fd)
{
    pc_tick();
    int r = pc_real.fsync(fd);
    if (r == 0) pc_after_sync(fd);
    return r;
}

static int pc_w_fdatasync(int fd)
{
    pc_tick();
    int r = pc_real.fdatasync(fd);
    if (r == 0) pc_after_sync(fd);
    return r;
}

/* Rename from -> to (absolute paths), after it succeeded. */
static void pc_note_rename(const char *from, const char *to)
{
    char fdir[PATH_MAX], tdir[PATH_MAX];
    const char *fb = pc_split(from, fdir, sizeof fdir), *tb = pc_split(to, tdir, sizeof tdir);
    int fd = pc_dir_find(fdir), td = pc_dir_find(tdir);
    if (fd < 0 || td < 0) {
        if (!(pc_in_copy(from) && pc_in_copy(to)))
            pc_note_outside("rename %s -> %s outside the tracked directories", from, to);
        return;
    }
    pc_ent *e = pc_set_find(&pc_dirs[fd]->cur, fb);
    if (!e) {
        pc_note_outside("rename of %s, a name the model does not know", from);
        return;
    }
    int type = e->type, idx = e->idx;
    if (type == PC_T_DIR) { /* a tracked directory moves: so do the paths under it */
        size_t n = strlen(from);
        for (size_t i = 0; i < pc_ndirs; i++) {
            char *p = pc_dirs[i]->path;
            if (!strncmp(p, from, n) && (p[n] == '\0' || p[n] == '/')) {
                char np[PATH_MAX];
                snprintf(np, sizeof np, "%s%s", to, p + n);
                free(p);
                pc_dirs[i]->path = pc_strdup(np);
            }
        }
    } else if (type == PC_T_COPY) {
        free(pc_copies[idx]);
        pc_copies[idx] = pc_strdup(to);
    }
    if (fd == td) {
        pc_change_add(fd, PC_C_REN, fb, tb, type, idx, -1);
    } else {
        PC_GROW(pc_rens, pc_nrens, pc_caprens);
        pc_rens[pc_nrens].halves = 2;
        pc_rens[pc_nrens].coin = -1;
        int r = (int)pc_nrens++;
        pc_change_add(td, PC_C_XADD, tb, NULL, type, idx, r);
        pc_change_add(fd, PC_C_XDEL, fb, NULL, type, idx, r);
    }
}

static int pc_w_rename(const char *a, const char *b)
{
    pc_tick();
    int r = pc_real.rename(a, b);
    char fa[PATH_MAX], fb[PATH_MAX];
    if (r == 0) {
        int e = errno;
        if (pc_resolve(AT_FDCWD, a, fa, sizeof fa) == 0 && pc_resolve(AT_FDCWD, b, fb, sizeof fb) == 0)
            pc_note_rename(fa, fb);
        errno = e;
    }
    return r;
}

static int pc_w_rename_noreplace(const char *a, const char *b)
{
    pc_tick();
    int r = pc_real.rename_noreplace(a, b);
    char fa[PATH_MAX], fb[PATH_MAX];
    if (r == 0) {
        int e = errno;
        if (pc_resolve(AT_FDCWD, a, fa, sizeof fa) == 0 && pc_resolve(AT_FDCWD, b, fb, sizeof fb) == 0)
            pc_note_rename(fa, fb);
        errno = e;
    }
    return r;
}

static int pc_w_renameat(int da, const char *a, int db, const char *b)
{
    char fa[PATH_MAX], fb[PATH_MAX];
    int ka = pc_resolve(da, a, fa, sizeof fa) == 0, kb = pc_resolve(db, b, fb, sizeof fb) == 0;
    pc_tick();
    int r = pc_real.renameat(da, a, db, b);
    if (r == 0) {
        int e = errno;
        if (ka && kb) pc_note_rename(fa, fb);
        else pc_note_outside("renameat of %s: directory unknown", a);
        errno = e;
    }
    return r;
}

static void pc_note_unlink(int known, const char *full, const char *p)
{
    char dir[PATH_MAX];
    if (!known) {
        pc_note_outside("unlink of %s: directory unknown", p);
        return;
    }
    const char *base = pc_split(full, dir, sizeof dir);
    int d = pc_dir_find(dir);
    if (d >= 0) pc_change_add(d, PC_C_DEL, base, NULL, 0, -1, -1);
    else if (!pc_in_copy(full)) pc_note_outside("unlink of %s outside the tracked directories", full);
}

static int pc_w_unlink(const char *p)
{
    char full[PATH_MAX];
    int known = pc_resolve(AT_FDCWD, p, full, sizeof full) == 0;
    pc_tick();
    int r = pc_real.unlink(p);
    if (r == 0) {
        int e = errno;
        pc_note_unlink(known, full, p);
        errno = e;
    }
    return r;
}

static int pc_w_unlinkat(int d, const char *p, int fl)
{
    char full[PATH_MAX];
    int known = pc_resolve(d, p, full, sizeof full) == 0;
    pc_tick();
    int r = pc_real.unlinkat(d, p, fl);
    if (r == 0) {
        int e = errno;
        pc_note_unlink(known, full, p);
        errno = e;
    }
    return r;
}

static int pc_mkdir_common(int dirfd, const char *p, mode_t m, int at)
{
    char full[PATH_MAX], dir[PATH_MAX];
    int known = pc_resolve(at ? dirfd : AT_FDCWD, p, full, sizeof full) == 0;
    pc_tick();
    int r = at ? pc_real.mkdirat(dirfd, p, m) : pc_real.mkdir(p, m);
    if (r == 0) {
        int e = errno;
        const char *base = known ? pc_split(full, dir, sizeof dir) : p;
        int pd = known ? pc_dir_find(dir) : -1;
        if (pd >= 0) {
            if (pc_is_copy_name(base)) pc_change_add(pd, PC_C_ADD, base, NULL, PC_T_COPY, pc_copy_new(full), -1);
            else pc_change_add(pd, PC_C_ADD, base, NULL, PC_T_DIR, pc_dir_new(full), -1);
        } else if (!known || !pc_in_copy(full)) {
            pc_note_outside("mkdir of %s outside the tracked directories", known ? full : p);
        }
        errno = e;
    }
    return r;
}

static int pc_w_mkdir(const char *p, mode_t m) { return pc_mkdir_common(AT_FDCWD, p, m, 0); }
static int pc_w_mkdirat(int d, const char *p, mode_t m) { return pc_mkdir_common(d, p, m, 1); }

/* A new name for a file the model knows (by inode): a create in the new
 * name's directory, durable with that directory's fsync. */
static int pc_w_linkat(int da, const char *a, int db, const char *b, int fl)
{
    char full[PATH_MAX], dir[PATH_MAX];
    int known = pc_resolve(db, b, full, sizeof full) == 0;
    pc_tick();
    int r = pc_real.linkat(da, a, db, b, fl);
    if (r == 0) {
        int e = errno;
        struct stat st;
        int file = fstatat(db, b, &st, AT_SYMLINK_NOFOLLOW) == 0 ? pc_file_by_ino(&st) : -1;
        const char *base = known ? pc_split(full, dir, sizeof dir) : NULL;
        int pd = known ? pc_dir_find(dir) : -1;
        if (pd >= 0 && file >= 0) pc_change_add(pd, PC_C_ADD, base, NULL, PC_T_FILE, file, -1);
        else if (!known || !pc_in_copy(full))
            pc_note_outside("linkat to %s: a file or directory the model does not know", known ? full : b);
        errno = e;
    }
    return r;
}

/* The second descriptor writes and syncs the same file as the first. */
static int pc_w_dup(int fd)
{
    int r = pc_real.dup(fd);
    if (r >= 0 && fd >= 0 && fd < PC_MAXFD) pc_fd_set(r, pc_fd[fd].path, pc_fd[fd].file, pc_fd[fd].dir);
    return r;
}

/* ------------------------------------------------------------ the image */

static int pc_write_file(const char *path, const uint8_t *b, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return -errno;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(fd, b + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = -errno;
            close(fd);
            return e ? e : -EIO;
        }
        done += (size_t)w;
    }
    return close(fd) ? -errno : 0;
}

static void pc_buf_write(uint8_t **b, size_t *n, uint64_t off, const uint8_t *src, size_t len)
{
    if (off + len > *n) {
        *b = pc_xrealloc(*b, (size_t)(off + len));
        memset(*b + *n, 0, (size_t)(off + len) - *n);
        *n = (size_t)(off + len);
    }
    memcpy(*b + off, src, len);
}

static void pc_buf_trunc(uint8_t **b, size_t *n, uint64_t len)
{
    if (len > *n) {
        *b = pc_xrealloc(*b, (size_t)len);
        memset(*b + *n, 0, (size_t)len - *n);
    }
    *n = (size_t)len;
}

/* A file's content in this image: durable, then its unsynced calls. */
static void pc_file_image(pc_file *f, int all)
{
    if (f->img_built) return;
    f->img_built = 1;
    f->img_len = f->dur_len;
    f->img = pc_xrealloc(NULL, f->dur_len);
    if (f->dur_len) memcpy(f->img, f->dur, f->dur_len);
    for (size_t i = 0; i < f->nops; i++) {
        const pc_wop *w = &f->ops[i];
        if (w->kind == PC_W_TRUNC) {
            if (all || (pc_rand() & 1)) pc_buf_trunc(&f->img, &f->img_len, w->off);
            continue;
        }
        uint64_t first = (w->off / PC_SECTOR + 1) * PC_SECTOR, end = w->off + w->len;
        uint64_t cuts = first < end ? (end - 1 - first) / PC_SECTOR + 1 : 0;
        int pick = all ? 0 : (int)(pc_rand() % (cuts ? 3 : 2));
        if (pick == 0) {
            pc_buf_write(&f->img, &f->img_len, w->off, w->data, w->len);
        } else if (pick == 2) { /* torn: one side of a sector boundary lands */
            uint64_t cut = first + PC_SECTOR * (pc_rand() % cuts);
            if (pc_rand() & 1) pc_buf_write(&f->img, &f->img_len, w->off, w->data, (size_t)(cut - w->off));
            else pc_buf_write(&f->img, &f->img_len, cut, w->data + (cut - w->off), (size_t)(end - cut));
        }
    }
}

static int pc_copy_tree(const char *src, const char *dst)
{
    if (mkdir(dst, 0700) != 0 && errno != EEXIST) return -errno;
    DIR *dp = opendir(src);
    if (!dp) return errno == ENOENT ? 0 : -errno;
    struct dirent *de;
    int rc = 0;
    while (!rc && (de = readdir(dp))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        char s[PATH_MAX], d[PATH_MAX];
        snprintf(s, sizeof s, "%s/%s", src, de->d_name);
        snprintf(d, sizeof d, "%s/%s", dst, de->d_name);
        struct stat st;
        if (lstat(s, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            rc = pc_copy_tree(s, d);
        } else if (S_ISREG(st.st_mode)) {
            int fd = open(s, O_RDONLY | O_CLOEXEC);
            if (fd < 0) continue;
            uint8_t *b;
            size_t n;
            rc = pc_read_fd(fd, &b, &n);
            close(fd);
            if (!rc) {
                rc = pc_write_file(d, b, n);
                free(b);
            }
        }
    }
    closedir(dp);
    return rc;
}

static int pc_image_dir(int d, const char *path, int all)
{
    pc_dir *D = pc_dirs[d];
    pc_entset set = {0};
    pc_set_copy(&set, &D->dur);
    for (size_t i = 0; i < D->npend; i++) {
        const pc_change *c = &D->pend[i];
        int apply = 1;
        if (!all) {
            if ((c->kind == PC_C_XADD || c->kind == PC_C_XDEL) && pc_rens[c->ren].halves == 2) {
                if (pc_rens[c->ren].coin < 0) pc_rens[c->ren].coin = (int)(pc_rand() & 1);
                apply = pc_rens[c->ren].coin;
            } else {
                apply = (int)(pc_rand() & 1);
            }
        }
        if (apply) pc_apply_change(&set, c);
    }
    int rc = 0;
    for (size_t i = 0; i < set.n && !rc; i++) {
        char sub[PATH_MAX];
        snprintf(sub, sizeof sub, "%s/%s", path, set.e[i].name);
        switch (set.e[i].type) {
        case PC_T_FILE: {
            pc_file *f = pc_files[set.e[i].idx];
            if (f->img_at[0]) { /* one inode, several names (linkat): a link, as on disk */
                if (link(f->img_at, sub) != 0) rc = -errno;
                break;
            }
            pc_file_image(f, all);
            rc = pc_write_file(sub, f->img, f->img_len);
            if (!rc) snprintf(f->img_at, sizeof f->img_at, "%s", sub);
            break;
        }
        case PC_T_DIR:
            if (mkdir(sub, 0700) != 0) rc = -errno;
            else rc = pc_image_dir(set.e[i].idx, sub, all);
            break;
        case PC_T_COPY: rc = pc_copy_tree(pc_copies[set.e[i].idx], sub); break;
        }
    }
    pc_set_free(&set);
    return rc;
}

/* Writes the post-crash image of the root into dst (a new directory): a
 * random power loss drawn from seed, or with all = 1 every change applied
 * (what kill -9 would leave). Uses libc only, never the seam. 0 or -errno. */
/* A lagging index (engine/store_lag.c): while the store's UNSYNCED mark
 * is in the root, its writer's LMDB commits skip LMDB's syncs, so a power
 * cut may leave data.mdb as anything: torn, old, or as it was. In an image
 * whose root holds the mark, index/data.mdb is one of (by the image's
 * seed) as copied, cut to a random number of 4 KiB pages (none included),
 * a few pages overwritten with random bytes, or gone. */
static inline int pc_mangle_lagging_index(const char *dst)
{
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%.4000s/UNSYNCED", dst);
    if (access(p, F_OK) != 0) return 0;
    snprintf(p, sizeof p, "%.4000s/index/data.mdb", dst);
    struct stat st;
    if (stat(p, &st) != 0) return 0;
    uint64_t pages = (uint64_t)st.st_size / 4096;
    switch (pc_rand() % 4) {
    case 0: return 0;
    case 1: return truncate(p, (off_t)((pages ? pc_rand() % pages : 0) * 4096)) ? -errno : 0;
    case 2: {
        int fd = open(p, O_WRONLY);
        if (fd < 0) return -errno;
        for (int i = 0; i < 3 && pages; i++) {
            uint8_t junk[4096];
            for (size_t j = 0; j < sizeof junk; j += 8) {
                uint64_t v = pc_rand();
                memcpy(junk + j, &v, 8);
            }
            if (pwrite(fd, junk, sizeof junk, (off_t)((pc_rand() % pages) * 4096)) != (ssize_t)sizeof junk) {
                close(fd);
                return -EIO;
            }
        }
        close(fd);
        return 0;
    }
    default: return unlink(p) ? -errno : 0;
    }
}

static inline int pc_image(const char *dst, uint64_t seed, int all)
{
    pc_rng = pc_mix(seed ^ 0x5043555450574552ull);
    for (size_t i = 0; i < pc_nfiles; i++) {
        free(pc_files[i]->img);
        pc_files[i]->img = NULL;
        pc_files[i]->img_built = 0;
        pc_files[i]->img_at[0] = '\0';
    }
    for (size_t i = 0; i < pc_nrens; i++) pc_rens[i].coin = -1;
    if (mkdir(dst, 0700) != 0) return -errno;
    if (pc_ndirs == 0) return -EINVAL;
    int rc = pc_image_dir(0, dst, all);
    if (!rc && !all) rc = pc_mangle_lagging_index(dst);
    return rc;
}

/* The boot an image is opened in (kvx_os.boot_id): a power cut is a
 * reboot. pc_reboot() starts a new one (a boot id the store never saw),
 * pc_same_boot() goes back to the machine's own (the kill -9 twin, the
 * workload). */
static char pc_boot[64];
static unsigned pc_boots;
static int (*pc_real_boot_id)(char *buf, size_t cap);
static inline int pc_boot_id(char *buf, size_t cap)
{
    if ((size_t)snprintf(buf, cap, "%s", pc_boot) >= cap) {
        errno = ERANGE;
        return -1;
    }
    return 0;
}
static inline void pc_reboot(void)
{
    if (!pc_real_boot_id) pc_real_boot_id = kvx_os.boot_id;
    snprintf(pc_boot, sizeof pc_boot, "powercut-boot-%u-%ld", ++pc_boots, (long)getpid());
    kvx_os.boot_id = pc_boot_id;
}
static inline void pc_same_boot(void)
{
    if (pc_real_boot_id) kvx_os.boot_id = pc_real_boot_id;
}

/* Compares a tree (an image made with all = 1) with the live root, file by
 * file, skipping the names in skip (NULL-terminated; files written outside
 * the seam). 0 when equal; else 1 with what differs in why. */
static int pc_compare_tree(const char *live, const char *img, const char **skip, char *why, size_t cap)
{
    for (int pass = 0; pass < 2; pass++) {
        const char *a = pass ? img : live, *b = pass ? live : img;
        DIR *dp = opendir(a);
        if (!dp) {
            snprintf(why, cap, "cannot list %s", a);
            return 1;
        }
        struct dirent *de;
        int bad = 0;
        while (!bad && (de = readdir(dp))) {
            if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
            int skipped = 0;
            for (const char **s = skip; s && *s; s++) skipped |= !strcmp(*s, de->d_name);
            if (skipped) continue;
            char pa[PATH_MAX], pb[PATH_MAX];
            snprintf(pa, sizeof pa, "%s/%s", a, de->d_name);
            snprintf(pb, sizeof pb, "%s/%s", b, de->d_name);
            struct stat sa, sb;
            if (lstat(pa, &sa) != 0 || lstat(pb, &sb) != 0 || (sa.st_mode & S_IFMT) != (sb.st_mode & S_IFMT)) {
                snprintf(why, cap, "%s is in %s only (or differs in type)", de->d_name, a);
                bad = 1;
            } else if (pass == 0 && S_ISDIR(sa.st_mode)) {
                bad = pc_compare_tree(pa, pb, skip, why, cap);
            } else if (pass == 0 && S_ISREG(sa.st_mode)) {
                uint8_t *ba = NULL, *bb = NULL;
                size_t na = 0, nb = 0;
                int fa = open(pa, O_RDONLY | O_CLOEXEC), fb = open(pb, O_RDONLY | O_CLOEXEC);
                if (fa >= 0) pc_read_fd(fa, &ba, &na);
                if (fb >= 0) pc_read_fd(fb, &bb, &nb);
                if (fa >= 0) close(fa);
                if (fb >= 0) close(fb);
                if (na != nb || (na && memcmp(ba, bb, na))) {
                    snprintf(why, cap, "%s: %zu bytes live, %zu in the image, or different bytes", pa, na, nb);
                    bad = 1;
                }
                free(ba);
                free(bb);
            }
        }
        closedir(dp);
        if (bad) return 1;
    }
    return 0;
}

/* Starts recording under root (absolute; its state now is durable): the
 * directories named in copy (NULL-terminated, e.g. {"index", NULL}; also a
 * directory made later whose name starts with one of them) are copied as
 * they are at the crash point. hook (nullable) runs at each crash point. */
static inline void pc_begin(const char *root, const char **copy, pc_hook_fn hook, void *ctx)
{
    kvx_os_reset();
    pc_real = kvx_os;
    pc_copy_names = copy;
    pc_ops = 0;
    pc_outside = 0;
    pc_outside_what[0] = '\0';
    pc_hook = hook;
    pc_hook_ctx = ctx;
    for (int i = 0; i < PC_MAXFD; i++) {
        pc_fd[i].path = NULL;
        pc_fd[i].file = pc_fd[i].dir = -1;
    }
    char norm[PATH_MAX];
    snprintf(norm, sizeof norm, "%s", root);
    pc_normalize(norm);
    pc_snapshot_dir(pc_dir_new(norm));
    kvx_os.open = pc_w_open;
    kvx_os.openat = pc_w_openat;
    kvx_os.close = pc_w_close;
    kvx_os.pwrite = pc_w_pwrite;
    kvx_os.fsync = pc_w_fsync;
    kvx_os.fdatasync = pc_w_fdatasync;
    kvx_os.ftruncate = pc_w_ftruncate;
    kvx_os.fallocate = pc_w_fallocate;
    kvx_os.rename = pc_w_rename;
    kvx_os.rename_noreplace = pc_w_rename_noreplace;
    kvx_os.renameat = pc_w_renameat;
    kvx_os.unlink = pc_w_unlink;
    kvx_os.unlinkat = pc_w_unlinkat;
    kvx_os.mkdir = pc_w_mkdir;
    kvx_os.mkdirat = pc_w_mkdirat;
    kvx_os.linkat = pc_w_linkat;
    kvx_os.dup = pc_w_dup;
}

/* Stops recording and frees the model. */
static inline void pc_end(void)
{
    kvx_os_reset();
    for (size_t i = 0; i < pc_nfiles; i++) {
        pc_file_clear_ops(pc_files[i]);
        free(pc_files[i]->ops);
        free(pc_files[i]->dur);
        free(pc_files[i]->img);
        free(pc_files[i]);
    }
    for (size_t i = 0; i < pc_ndirs; i++) {
        pc_dir *D = pc_dirs[i];
        for (size_t j = 0; j < D->npend; j++) {
            free(D->pend[j].name);
            free(D->pend[j].to);
        }
        free(D->pend);
        pc_set_free(&D->dur);
        pc_set_free(&D->cur);
        free(D->path);
        free(D);
    }
    for (size_t i = 0; i < pc_ncopies; i++) free(pc_copies[i]);
    for (int i = 0; i < PC_MAXFD; i++) {
        free(pc_fd[i].path);
        pc_fd[i].path = NULL;
    }
    free(pc_files);
    free(pc_dirs);
    free(pc_copies);
    free(pc_rens);
    pc_files = NULL;
    pc_dirs = NULL;
    pc_copies = NULL;
    pc_rens = NULL;
    pc_nfiles = pc_capfiles = pc_ndirs = pc_capdirs = pc_ncopies = pc_capcopies = pc_nrens = pc_caprens = 0;
    pc_hook = NULL;
}

#endif
