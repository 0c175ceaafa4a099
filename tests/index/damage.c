/*
 * damage.c - DESIGN.md trust rules 3 and 4 for the index (index/check.c,
 * env.c, errors.c): a reader works on a read-only directory (another user,
 * the owner after chmod -R a-w index/, a read-only bind mount); both meta
 * pages and the tree are checked before LMDB trusts data.mdb, each check
 * on its own; the mapping guard catches a fault on a catalog range and
 * lets a foreign one through; and a battery of damage to data.mdb and
 * lock.mdb: no signal, never a wrong byte, the shards kept, reindex
 * restores every block.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <lmdb.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/sigbus.h"
#include "index/index.h"
#include "lib/store.h"

#define NSEQ 24 /* sequences put, NB blocks each */

#define NB 8

#define NFLUSH 4 /* flushes (one shard each, at least) */

#define NOBODY 65534

static void put_seq(kvx_store *s, uint64_t seq)
{
    uint32_t t[NB * SU_B];
    uint64_t h[NB];
    su_tokens(t, seq, NB, 0);
    uint8_t *p = su_pages(t, NB, h, 64);
    int rc = kvx_store_put(s, t, NB * SU_B, p, NB, NULL, NULL);
    if (rc) fprintf(stderr, "put: %s\n", kvx_last_error());
    assert_int_equal(rc, 0);
    free(p);
}

/* A store with NSEQ sequences of NB blocks, flushed NFLUSH times. */
static void filled_store(char *dir, size_t n)
{
    su_new_dir(dir, n);
    kvx_store_options o = KVX_STORE_OPTIONS_INIT;
    o.geometry = su_geometry();
    o.flags = KVX_STORE_NOWAIT;
    kvx_store *s = NULL;
    int rc = kvx_store_create(&s, dir, &o);
    if (rc) fprintf(stderr, "create: %s\n", kvx_last_error());
    assert_int_equal(rc, 0);
    for (uint64_t q = 0; q < NSEQ; q++) {
        put_seq(s, q);
        if ((q + 1) % (NSEQ / NFLUSH) == 0) assert_int_equal(kvx_store_flush(s), 0);
    }
    kvx_store_close(s);
}

static char *path_in(const char *dir, const char *rel)
{
    static char buf[4][600];
    static int k;
    char *b = buf[k++ & 3];
    snprintf(b, sizeof buf[0], "%s/%s", dir, rel);
    return b;
}

static int sh(const char *fmt, ...)
{
    char cmd[2000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return system(cmd);
}

typedef int (*child_fn)(const char *dir, void *arg);

typedef struct child_result {
    int status; /* waitpid status */
    char log[4096];
} child_result;

/* Runs fn(dir, arg) in a forked child with default signal actions (not
 * cmocka's), stderr captured, and a timeout (a hang dies of SIGALRM). */
static child_result run_child(child_fn fn, const char *dir, void *arg, unsigned timeout_s)
{
    child_result r;
    memset(&r, 0, sizeof r);
    char tmpl[] = "/tmp/kvx-ixd-log-XXXXXX";
    int lf = mkstemp(tmpl);
    assert_true(lf >= 0);
    unlink(tmpl);
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        static const int sigs[] = {SIGSEGV, SIGBUS, SIGABRT, SIGILL, SIGFPE, SIGALRM};
        for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) signal(sigs[i], SIG_DFL);
        dup2(lf, 2);
        alarm(timeout_s);
        _exit(fn(dir, arg));
    }
    assert_int_equal(waitpid(pid, &r.status, 0), pid);
    lseek(lf, 0, SEEK_SET);
    ssize_t n = read(lf, r.log, sizeof r.log - 1);
    r.log[n > 0 ? n : 0] = '\0';
    close(lf);
    return r;
}

static const char *status_text(int st)
{
    static char b[64];
    if (WIFSIGNALED(st))
        snprintf(b, sizeof b, "killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(b, sizeof b, "exit %d", WEXITSTATUS(st));
    return b;
}

/* The leading blocks of sequence seq the store serves: their number, -1
 * for an error (fine on a damaged index), -2 when a served block has the
 * wrong hash or bytes (never fine). */
static int served(kvx_store *s, uint64_t seq)
{
    uint32_t t[NB * SU_B];
    uint64_t h[NB];
    kvx_view v[NB];
    su_tokens(t, seq, NB, 0);
    kvx_block_hashes(h, t, NB * SU_B, SU_B);
    size_t n = 0;
    if (kvx_store_prefix(v, &n, s, t, NB * SU_B, NB) != 0) return -1;
    int good = (int)n;
    for (size_t i = 0; i < n; i++) {
        uint8_t want[64];
        su_page(want, sizeof want, h[i]);
        if (v[i].hash != h[i] || v[i].page_bytes != sizeof want || memcmp(v[i].page, want, sizeof want)) good = -2;
    }
    kvx_views_release(v, n);
    return good;
}

enum {
    CH_OK = 0,
    CH_SKIP = 77,
    CH_OPEN = 10,      /* open refused where it must work */
    CH_STAT = 11,      /* stat failed or wrong where it must work */
    CH_PREFIX = 12,    /* a sequence not served in full where it must be */
    CH_VERIFY = 13,    /* verify failed where it must pass */
    CH_WRONG = 20,     /* a wrong byte served: never allowed */
    CH_MESSAGE = 21,   /* an error without the promised message */
    CH_SETUP = 30,     /* the child could not set itself up */
    CH_WRITER_OK = 31, /* a writer opened where it cannot */
};

/* A healthy store, read without write permission: everything works. */
static int reader_full(const char *dir, void *arg)
{
    (void)arg;
    kvx_store *s = NULL;
    int rc = kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY);
    if (rc) {
        fprintf(stderr, "open: %d %s\n", rc, kvx_last_error());
        return CH_OPEN;
    }
    kvx_store_stats st;
    if ((rc = kvx_store_stat(&st, s)) != 0 || st.blocks != NSEQ * NB) {
        fprintf(stderr, "stat: %d %s blocks %llu\n", rc, kvx_last_error(), (unsigned long long)st.blocks);
        return CH_STAT;
    }
    for (uint64_t q = 0; q < NSEQ; q++) {
        int n = served(s, q);
        if (n == -2) return CH_WRONG;
        if (n != NB) {
            fprintf(stderr, "prefix %llu: %d (%s)\n", (unsigned long long)q, n, kvx_last_error());
            return CH_PREFIX;
        }
    }
    uint64_t bad = 99;
    if ((rc = kvx_store_verify(s, &bad, NULL, NULL)) != 0 || bad != 0) {
        fprintf(stderr, "verify: %d bad %llu %s\n", rc, (unsigned long long)bad, kvx_last_error());
        return CH_VERIFY;
    }
    kvx_store_close(s);
    /* a writer cannot open here; it says so and does not crash */
    rc = kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT);
    if (rc == 0) {
        kvx_store_close(s);
        return CH_WRITER_OK;
    }
    return CH_OK;
}

/* setpriv --reuid=65534 --regid=65534 --clear-groups, then reader_full. */
static int reader_as_nobody(const char *dir, void *arg)
{
    if (geteuid() == 0) {
        if (setgroups(0, NULL) != 0 || setresgid(NOBODY, NOBODY, NOBODY) != 0 ||
            setresuid(NOBODY, NOBODY, NOBODY) != 0) {
            fprintf(stderr, "drop privileges: %s\n", strerror(errno));
            return CH_SETUP;
        }
    }
    return reader_full(dir, arg);
}

static void expect_child_ok(child_result r, const char *what)
{
    if (WIFEXITED(r.status) && WEXITSTATUS(r.status) == CH_OK) return;
    fail_msg("%s: child %s\n%s", what, status_text(r.status), r.log);
}

/* Another user, without write permission anywhere in the store (root
 * runs the reader as uid 65534; anyone else reads a store chmod a-w). */
/* PROMISE: RECOVER-2 */
static void test_reader_other_user_no_write(void **state)
{
    (void)state;
    char dir[300];
    filled_store(dir, sizeof dir);
    assert_int_equal(chmod(su_root, 0755), 0);
    if (geteuid() == 0)
        assert_int_equal(sh("chmod -R go+rX,go-w '%s'", dir), 0);
    else
        assert_int_equal(sh("chmod -R a-w '%s'", dir), 0);
    expect_child_ok(run_child(reader_as_nobody, dir, NULL, 60), "reader without write permission");
    sh("chmod -R u+w '%s'", dir);
}

/* The owner after chmod -R a-w index/ (as root: the store belongs to
 * 65534 and the reader runs as 65534, since root ignores modes). With and
 * without lock.mdb (the reader cannot create it: no lock at all). */
/* PROMISE: RECOVER-2 */
static void test_reader_owner_index_chmod(void **state)
{
    (void)state;
    for (int drop_lock = 0; drop_lock < 2; drop_lock++) {
        char dir[300];
        filled_store(dir, sizeof dir);
        assert_int_equal(chmod(su_root, 0755), 0);
        if (drop_lock) assert_int_equal(unlink(path_in(dir, "index/lock.mdb")), 0);
        if (geteuid() == 0) assert_int_equal(sh("chown -R %d:%d '%s'", NOBODY, NOBODY, dir), 0);
        assert_int_equal(sh("chmod -R a-w '%s/index'", dir), 0);
        expect_child_ok(run_child(reader_as_nobody, dir, NULL, 60),
                        drop_lock ? "owner, index/ a-w, no lock.mdb" : "owner, index/ a-w");
        sh("chmod -R u+w '%s'", dir);
    }
}

/* A read-only bind mount of the whole store (needs CAP_SYS_ADMIN: the
 * child enters its own mount namespace, so nothing leaks). */
static int reader_on_ro_mount(const char *dir, void *arg)
{
    if (unshare(CLONE_NEWNS) != 0) return CH_SKIP;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0) return CH_SKIP;
    if (mount(dir, dir, NULL, MS_BIND, NULL) != 0) return CH_SKIP;
    if (mount(NULL, dir, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) != 0) return CH_SKIP;
    int fd = open(path_in(dir, "probe"), O_WRONLY | O_CREAT, 0600);
    if (fd >= 0 || errno != EROFS) {
        fprintf(stderr, "the bind mount is writable\n");
        return CH_SETUP;
    }
    return reader_full(dir, arg);
}

/* PROMISE: RECOVER-2 */
static void test_reader_readonly_bind_mount(void **state)
{
    (void)state;
    char dir[300];
    filled_store(dir, sizeof dir);
    child_result r = run_child(reader_on_ro_mount, dir, NULL, 60);
    if (WIFEXITED(r.status) && WEXITSTATUS(r.status) == CH_SKIP) skip();
    expect_child_ok(r, "reader on a read-only bind mount");
    /* and again with the lock file gone: the reader cannot create it */
    assert_int_equal(unlink(path_in(dir, "index/lock.mdb")), 0);
    expect_child_ok(run_child(reader_on_ro_mount, dir, NULL, 60), "read-only bind mount, no lock.mdb");
}

typedef struct open_expect {
    uint32_t flags;        /* kvx_store_open flags */
    const char *needle[3]; /* each must be in the message (NULL: none) */
} open_expect;

/* Open must fail with KVX_ECORRUPT, its message naming index/data.mdb,
 * the field and reindex. */
static int open_refused(const char *dir, void *arg)
{
    const open_expect *e = arg;
    kvx_store *s = NULL;
    int rc = kvx_store_open(&s, dir, NULL, e->flags);
    if (rc == 0) {
        kvx_store_close(s);
        fprintf(stderr, "opened a damaged index\n");
        return CH_OPEN;
    }
    const char *m = kvx_last_error();
    fprintf(stderr, "rc %d: %s\n", rc, m);
    if (rc != KVX_ECORRUPT || !strstr(m, "index/data.mdb") || !strstr(m, "kvx store reindex")) return CH_MESSAGE;
    for (int i = 0; i < 3; i++)
        if (e->needle[i] && !strstr(m, e->needle[i])) return CH_MESSAGE;
    return CH_OK;
}

static int open_works(const char *dir, void *arg)
{
    const open_expect *e = arg;
    kvx_store *s = NULL;
    int rc = kvx_store_open(&s, dir, NULL, e->flags);
    if (rc) {
        fprintf(stderr, "open: %d %s\n", rc, kvx_last_error());
        return CH_OPEN;
    }
    for (uint64_t q = 0; q < NSEQ; q++) {
        int n = served(s, q);
        if (n == -2) return CH_WRONG;
        if (n != NB) return CH_PREFIX;
    }
    kvx_store_close(s);
    return CH_OK;
}

/* Offsets in an LMDB 0.9 meta page (64-bit), as index.c decodes them. */
#define M_FLAGS 10

#define M_MAGIC 16

#define M_VERSION 20

#define M_PSIZE 40

#define M_FREE_ROOT 80

#define M_MAIN_ROOT 128

#define M_LAST_PG 136

#define M_TXNID 144

static uint64_t file_size(const char *p)
{
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    return (uint64_t)st.st_size;
}

static void poke(const char *file, uint64_t off, const void *v, size_t n)
{
    int fd = open(file, O_WRONLY);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, v, n, (off_t)off), (ssize_t)n);
    close(fd);
}

static void peek(const char *file, uint64_t off, void *v, size_t n)
{
    int fd = open(file, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, v, n, (off_t)off), (ssize_t)n);
    close(fd);
}

/* The meta LMDB uses (larger txnid) and the other one, as byte offsets. */
static void metas(const char *file, uint64_t *newer, uint64_t *older)
{
    uint32_t ps;
    peek(file, M_PSIZE, &ps, 4);
    uint64_t t0, t1;
    peek(file, M_TXNID, &t0, 8);
    peek(file, ps + M_TXNID, &t1, 8);
    *newer = t0 < t1 ? ps : 0;
    *older = t0 < t1 ? 0 : ps;
}

typedef struct meta_case {
    const char *name;
    int which;    /* 0: the newer meta, 1: the older, 2: both */
    uint64_t off; /* field offset within the meta page */
    uint64_t value;
    size_t width;
    const char *needle;
} meta_case;

/* PROMISE: RECOVER-8 */
static void test_meta_page_checks(void **state)
{
    (void)state;
    char pristine[300];
    filled_store(pristine, sizeof pristine);
    const char *pf = path_in(pristine, "index/data.mdb");
    uint64_t size = file_size(pf);
    uint32_t ps;
    peek(pf, M_PSIZE, &ps, 4);
    uint64_t pages = size / ps;
    const meta_case cases[] = {
        {"magic", 0, M_MAGIC, 0xDEADBEEF, 4, "mm_magic"},
        {"version", 0, M_VERSION, 2, 4, "mm_version"},
        {"flags", 0, M_FLAGS, 0, 2, "P_META"},
        {"last page past the end", 0, M_LAST_PG, pages + 5, 8, "mm_last_pg"},
        {"last page huge", 0, M_LAST_PG, UINT64_MAX / 2, 8, "mm_last_pg"},
        {"main root past last page", 0, M_MAIN_ROOT, pages + 100, 8, "main database's root"},
        {"free root past last page", 0, M_FREE_ROOT, pages + 100, 8, "free database's root"},
        {"main root on a meta page", 0, M_MAIN_ROOT, 1, 8, "main database's root"},
        {"both metas: magic", 2, M_MAGIC, 0, 4, "mm_magic"},
        {"older meta: magic (LMDB refuses it too)", 1, M_MAGIC, 0x12345678, 4, "mm_magic"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const meta_case *c = &cases[i];
        for (int writer = 0; writer < 2; writer++) {
            char dir[300];
            su_new_dir(dir, sizeof dir);
            assert_int_equal(sh("cp -a '%s' '%s'", pristine, dir), 0);
            const char *f = path_in(dir, "index/data.mdb");
            uint64_t nw, ol;
            metas(f, &nw, &ol);
            if (c->which != 1) poke(f, nw + c->off, &c->value, c->width);
            if (c->which != 0) poke(f, ol + c->off, &c->value, c->width);
            open_expect e = {writer ? KVX_STORE_NOWAIT : KVX_STORE_READONLY, {c->needle, NULL, NULL}};
            child_result r = run_child(open_refused, dir, &e, 60);
            if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != CH_OK)
                fail_msg("meta case '%s' (%s): %s\n%s", c->name, writer ? "writer" : "reader",
                         status_text(r.status), r.log);
            sh("rm -rf '%s'", dir);
        }
    }

    /* page size: meta 0 names it; a bad one refuses whichever is newer */
    {
        char dir[300];
        su_new_dir(dir, sizeof dir);
        assert_int_equal(sh("cp -a '%s' '%s'", pristine, dir), 0);
        uint32_t bad = 3000;
        poke(path_in(dir, "index/data.mdb"), M_PSIZE, &bad, 4);
        open_expect e = {KVX_STORE_READONLY, {"page size", NULL, NULL}};
        expect_child_ok(run_child(open_refused, dir, &e, 60), "page size 3000");
    }
    /* truncation: inside meta page 1, and to the metas alone */
    static const uint64_t cuts[] = {100, 4096 + 50, 8192};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char dir[300];
        su_new_dir(dir, sizeof dir);
        assert_int_equal(sh("cp -a '%s' '%s'", pristine, dir), 0);
        assert_int_equal(truncate(path_in(dir, "index/data.mdb"), (off_t)cuts[i]), 0);
        for (int writer = 0; writer < 2; writer++) {
            open_expect e = {writer ? KVX_STORE_NOWAIT : KVX_STORE_READONLY, {NULL, NULL, NULL}};
            child_result r = run_child(open_refused, dir, &e, 60);
            if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != CH_OK)
                fail_msg("truncated to %llu (%s): %s\n%s", (unsigned long long)cuts[i], writer ? "writer" : "reader",
                         status_text(r.status), r.log);
        }
    }
    /* empty or missing data.mdb: a reader refuses (and creates nothing) */
    for (int missing = 0; missing < 2; missing++) {
        char dir[300];
        su_new_dir(dir, sizeof dir);
        assert_int_equal(sh("cp -a '%s' '%s'", pristine, dir), 0);
        const char *f = path_in(dir, "index/data.mdb");
        if (missing)
            assert_int_equal(unlink(f), 0);
        else
            assert_int_equal(truncate(f, 0), 0);
        open_expect e = {KVX_STORE_READONLY, {missing ? "missing" : "empty", NULL, NULL}};
        expect_child_ok(run_child(open_refused, dir, &e, 60), missing ? "missing data.mdb" : "empty data.mdb");
        struct stat st;
        if (missing) assert_int_equal(stat(f, &st), -1);
        else assert_int_equal(file_size(f), 0);
    }
    /* the older meta damaged beyond what LMDB checks (it never uses it):
     * the store opens and serves everything */
    {
        char dir[300];
        su_new_dir(dir, sizeof dir);
        assert_int_equal(sh("cp -a '%s' '%s'", pristine, dir), 0);
        const char *f = path_in(dir, "index/data.mdb");
        uint64_t nw, ol, big = pages + 1000;
        metas(f, &nw, &ol);
        poke(f, ol + M_MAIN_ROOT, &big, 8);
        open_expect e = {KVX_STORE_READONLY, {NULL, NULL, NULL}};
        expect_child_ok(run_child(open_works, dir, &e, 60), "older meta damaged");
        e.flags = KVX_STORE_NOWAIT;
        expect_child_ok(run_child(open_works, dir, &e, 60), "older meta damaged, writer");
    }
    sh("rm -rf '%s'", pristine);
}

/* kvx_idx_check_file on its own: the field named, a good file passes. */
static void test_check_file_direct(void **state)
{
    (void)state;
    char dir[300];
    filled_store(dir, sizeof dir);
    const char *ixp = path_in(dir, "index");
    assert_int_equal(kvx_idx_check_file(ixp, dir, 0), 0);
    uint64_t nw, ol;
    metas(path_in(dir, "index/data.mdb"), &nw, &ol);
    uint32_t v = 7;
    poke(path_in(dir, "index/data.mdb"), nw + M_VERSION, &v, 4);
    assert_int_equal(kvx_idx_check_file(ixp, dir, 0), KVX_ECORRUPT);
    const char *m = kvx_last_error();
    assert_non_null(strstr(m, "data.mdb"));
    assert_non_null(strstr(m, "mm_version is 7"));
    assert_non_null(strstr(m, "run 'kvx store reindex"));
    assert_non_null(strstr(m, dir));
}

typedef struct raw_put {
    kvx_index *ix;
    int which;
} raw_put;

static int raw_put_body(MDB_txn *txn, void *ctx)
{
    raw_put *p = ctx;
    kvx_index *ix = p->ix;
    uint32_t key = 7;
    uint8_t junk[40];
    memset(junk, 0xA5, sizeof junk);
    MDB_val k = {4, &key};
    MDB_val v = {0, junk};
    switch (p->which) {
    case 0: v.mv_size = 5; return mdb_put(txn, ix->shards, &k, &v, 0);                   /* short shard */
    case 1: v.mv_size = sizeof(kvx_idx_coord) + 1; return mdb_put(txn, ix->coord, &k, &v, 0); /* long coord */
    case 2: { /* usage whose bitmap does not match n_bits */
        kvx_idx_usage u = {1, 2, 3, 1000, 0};
        uint8_t b[sizeof u + 4];
        memcpy(b, &u, sizeof u);
        MDB_val uv = {sizeof b, b};
        return mdb_put(txn, ix->usage, &k, &uv, 0);
    }
    case 3: { /* a good usage record */
        kvx_idx_usage u = {1, 2, 3, 20, 0};
        uint8_t bits[3] = {0x5A, 0, 0};
        return kvx_idx_put_usage(txn, ix, key, &u, bits, sizeof bits); /* with its crc */
    }
    case 4: { /* good shard and coord records */
        kvx_idx_shard sr = {3, 4096, 5, 6, 7, 0, 0, 0};
        int rc = kvx_idx_put_shard(txn, ix, key, &sr); /* with its crc */
        if (rc) return rc;
        uint32_t c = (7u << 24) | 0x100;
        return kvx_idx_add_block(txn, ix, c, 0x1234, 3);
    }
    case 5: { /* a short coord record under shard byte 7 */
        uint32_t c = (7u << 24) | 0x200;
        MDB_val ck = {4, &c}, cv = {3, junk};
        return mdb_put(txn, ix->coord, &ck, &cv, 0);
    }
    case 6: { /* a short stats record */
        MDB_val sk = {5, "stats"}, sv = {3, junk};
        return mdb_put(txn, ix->meta, &sk, &sv, 0);
    }
    }
    return EINVAL;
}

typedef struct get_ctx {
    kvx_index *ix;
    int rc[8];
    kvx_idx_shard shard;
    kvx_idx_coord coord;
    kvx_idx_usage usage;
    uint8_t bits[16];
    size_t nbits;
} get_ctx;

static int get_all_body(MDB_txn *txn, void *ctx)
{
    get_ctx *g = ctx;
    g->rc[0] = kvx_idx_get_shard(txn, g->ix, 7, &g->shard);
    g->rc[1] = kvx_idx_get_coord(txn, g->ix, 7, &g->coord);
    g->rc[2] = kvx_idx_get_usage(txn, g->ix, 7, &g->usage, g->bits, sizeof g->bits, &g->nbits);
    g->rc[3] = kvx_idx_get_shard(txn, g->ix, 8, &g->shard);
    kvx_idx_stats st;
    g->rc[4] = kvx_idx_get_stats(txn, g->ix, &st);
    return 0;
}

static int del_blocks_body(MDB_txn *txn, void *ctx)
{
    get_ctx *g = ctx;
    uint64_t n = 0;
    return kvx_idx_del_shard_blocks(txn, g->ix, 7, &n);
}

static void test_record_sizes(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    kvx_index *ix = NULL;
    assert_int_equal(kvx_idx_open(&ix, dir, 1, 1), 0);
    raw_put p = {ix, 0};
    for (p.which = 0; p.which < 3; p.which++) assert_int_equal(kvx_idx_write(ix, raw_put_body, &p), 0);
    get_ctx g;
    memset(&g, 0, sizeof g);
    g.ix = ix;
    assert_int_equal(kvx_idx_read(ix, get_all_body, &g), 0);
    assert_int_equal(g.rc[0], MDB_CORRUPTED); /* 5 bytes, not sizeof(kvx_idx_shard) */
    assert_int_equal(g.rc[1], MDB_CORRUPTED); /* one byte too many */
    assert_int_equal(g.rc[2], MDB_CORRUPTED); /* n_bits 1000 with a 4-byte bitmap */
    assert_int_equal(g.rc[3], MDB_NOTFOUND);
    assert_int_equal(kvx_idx_err(g.rc[0], "get shard"), KVX_ECORRUPT);
    assert_non_null(strstr(kvx_last_error(), "kvx store reindex"));
    assert_int_equal(kvx_idx_errp(ix, g.rc[1], "get coord"), KVX_ECORRUPT);
    assert_non_null(strstr(kvx_last_error(), dir));
    assert_non_null(strstr(kvx_last_error(), "/data.mdb"));

    /* good records read back whole */
    for (p.which = 3; p.which < 5; p.which++) assert_int_equal(kvx_idx_write(ix, raw_put_body, &p), 0);
    memset(&g, 0, sizeof g);
    g.ix = ix;
    assert_int_equal(kvx_idx_read(ix, get_all_body, &g), 0);
    assert_int_equal(g.rc[0], 0);
    assert_true(g.shard.gen == 3 && g.shard.file_bytes == 4096 && g.shard.n_entries == 6 && g.shard.flags == 7);
    assert_int_equal(g.rc[2], 0);
    assert_int_equal(g.usage.n_bits, 20);
    assert_int_equal(g.nbits, 3);
    assert_int_equal(g.bits[0], 0x5A);
    assert_int_equal(g.rc[4], 0);

    /* a short coord record: deleting the shard's blocks reports it */
    p.which = 5;
    assert_int_equal(kvx_idx_write(ix, raw_put_body, &p), 0);
    assert_int_equal(kvx_idx_write(ix, del_blocks_body, &g), KVX_ECORRUPT);
    assert_non_null(strstr(kvx_last_error(), "reindex"));
    /* a stats record that is not whole u64 counters */
    p.which = 6;
    assert_int_equal(kvx_idx_write(ix, raw_put_body, &p), 0);
    assert_int_equal(kvx_idx_read(ix, get_all_body, &g), 0);
    assert_int_equal(g.rc[4], MDB_CORRUPTED);

    /* decoders refuse keys of the wrong size too */
    uint8_t kb[8] = {0}, vb[64] = {0};
    MDB_val k3 = {3, kb}, k4 = {4, kb}, k8 = {8, kb}, vs = {sizeof(kvx_idx_shard), vb}, vl = {sizeof(kvx_idx_loc), vb};
    uint32_t b32;
    uint64_t b64;
    kvx_idx_shard sr;
    kvx_idx_loc lc;
    assert_int_equal(kvx_idx_dec_shard(&k3, &vs, &b32, &sr), MDB_CORRUPTED);
    /* all zero: the right sizes, but a crc of 0 (a record written before
     * the checksums) is damaged too */
    assert_int_equal(kvx_idx_dec_shard(&k4, &vs, &b32, &sr), MDB_CORRUPTED);
    assert_int_equal(kvx_idx_dec_loc(&k4, &vl, &b64, &lc), MDB_CORRUPTED);
    assert_int_equal(kvx_idx_dec_loc(&k8, &vl, &b64, &lc), MDB_CORRUPTED);
    kvx_idx_close(ix);
}

typedef struct shape_ctx {
    kvx_index *ix;
    int step;
} shape_ctx;

static int shape_body(MDB_txn *txn, void *ctx)
{
    shape_ctx *c = ctx;
    kvx_index *ix = c->ix;
    int rc = 0;
    switch (c->step) {
    case 0: /* a deep coord tree, hash records with many duplicates (a
               sub-tree of LEAF2 pages) and sub-pages (a few duplicates) */
        for (uint32_t i = 0; i < 120000 && !rc; i++) rc = kvx_idx_add_block(txn, ix, i, su_mix(i % 5000), 1 + i / 5000);
        for (uint32_t i = 0; i < 2000 && !rc; i++) rc = kvx_idx_add_block(txn, ix, (2u << 24) | i, 42, 7);
        break;
    case 1: { /* usage records on overflow pages (65536-entry bitmaps) */
        static uint8_t buf[sizeof(kvx_idx_usage) + 65536 / 8];
        for (uint32_t b = 0; b < 20 && !rc; b++) {
            kvx_idx_usage u = {b, 1, 2, 65536, 0};
            memcpy(buf, &u, sizeof u);
            memset(buf + sizeof u, (int)b, sizeof buf - sizeof u);
            MDB_val k = {4, &b}, v = {sizeof buf, buf};
            rc = mdb_put(txn, ix->usage, &k, &v, 0);
        }
        break;
    }
    case 2: /* frees hundreds of pages at once: a long free list */
        for (uint32_t i = 0; i < 120000 && !rc; i += 2)
            rc = kvx_idx_del_block(txn, ix, i, su_mix(i % 5000), 1 + i / 5000);
        break;
    case 3: { /* and some of the big records go */
        for (uint32_t b = 0; b < 20 && !rc; b += 3) {
            MDB_val k = {4, &b};
            rc = mdb_del(txn, ix->usage, &k, NULL);
        }
        break;
    }
    }
    return rc;
}

static int reopen_ok(const char *dir, void *arg)
{
    (void)arg;
    kvx_index *ix = NULL;
    int rc = kvx_idx_open(&ix, dir, 0, 1);
    if (rc) fprintf(stderr, "reopen: %d %s\n", rc, kvx_last_error());
    kvx_idx_close(ix);
    return rc ? CH_OPEN : CH_OK;
}

static void test_walk_accepts_real_trees(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    for (int step = 0; step < 4; step++) {
        kvx_index *ix = NULL;
        assert_int_equal(kvx_idx_open(&ix, dir, 1, 1), 0);
        shape_ctx c = {ix, step};
        int rc = kvx_idx_write(ix, shape_body, &c);
        if (rc) fail_msg("step %d: %s", step, kvx_last_error());
        MDB_stat ms;
        MDB_txn *txn;
        assert_int_equal(kvx_idx_read_begin(ix, &txn), 0);
        assert_int_equal(mdb_stat(txn, ix->coord, &ms), 0);
        kvx_idx_read_end(ix, txn);
        if (step == 0) assert_true(ms.ms_depth >= 3);
        kvx_idx_close(ix);
        /* a fresh process opens it: the whole walk runs there */
        expect_child_ok(run_child(reopen_ok, dir, NULL, 60), "reopen a healthy index");
    }
}

/* LMDB never writes a page allocated and freed in one transaction: a
 * healthy data.mdb can end before mm_last_pg when its free list names the
 * last pages (mdb.c says so at mm_last_pg). Such a file opens. */
static uint64_t lcg;

static uint64_t lcg_next(void)
{
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return lcg >> 33;
}

static int churn_body(MDB_txn *txn, void *ctx)
{
    kvx_index *ix = ctx;
    int rc = 0;
    uint32_t n = (uint32_t)(lcg_next() % 3000), base = (uint32_t)(lcg_next() % 100000);
    for (uint32_t i = 0; i < n && !rc; i++) rc = kvx_idx_add_block(txn, ix, base + i, (base + i) * 31ull, 1);
    uint32_t m = (uint32_t)(lcg_next() % 4000), b2 = (uint32_t)(lcg_next() % 100000);
    for (uint32_t i = 0; i < m && !rc; i++) rc = kvx_idx_del_block(txn, ix, b2 + i, (b2 + i) * 31ull, 1);
    static uint8_t buf[sizeof(kvx_idx_usage) + 8192];
    if (!rc && lcg_next() % 3 == 0) {
        uint32_t b = (uint32_t)(lcg_next() % 50);
        MDB_val k = {4, &b}, v = {32 + lcg_next() % 8192, buf};
        rc = mdb_put(txn, ix->usage, &k, &v, 0);
    }
    if (!rc && lcg_next() % 3 == 0) {
        uint32_t b = (uint32_t)(lcg_next() % 50);
        MDB_val k = {4, &b};
        rc = mdb_del(txn, ix->usage, &k, NULL);
        if (rc == MDB_NOTFOUND) rc = 0;
    }
    return rc;
}

static void test_short_file_free_tail_opens(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    kvx_index *ix = NULL;
    assert_int_equal(kvx_idx_open(&ix, dir, 1, 1), 0);
    lcg = 1;
    int shorter = 0;
    for (int it = 0; it < 400 && !shorter; it++) {
        assert_int_equal(kvx_idx_write(ix, churn_body, ix), 0);
        MDB_envinfo in;
        MDB_stat ms;
        assert_int_equal(mdb_env_info(ix->env, &in), 0);
        assert_int_equal(mdb_env_stat(ix->env, &ms), 0);
        shorter = (in.me_last_pgno + 1) * ms.ms_psize > file_size(path_in(dir, "data.mdb"));
    }
    kvx_idx_close(ix);
    if (!shorter) skip(); /* this LMDB build never left its last pages unwritten here */
    expect_child_ok(run_child(reopen_ok, dir, NULL, 60), "a file shorter than mm_last_pg, the tail free-listed");
    /* and a file cut one more page is damage */
    uint64_t size = file_size(path_in(dir, "data.mdb"));
    assert_int_equal(truncate(path_in(dir, "data.mdb"), (off_t)(size - 4096)), 0);
    child_result r = run_child(reopen_ok, dir, NULL, 60);
    if (!WIFEXITED(r.status) || WEXITSTATUS(r.status) != CH_OPEN)
        fail_msg("cut one page more: child %s\n%s", status_text(r.status), r.log);
    assert_non_null(strstr(r.log, "past the end of the file"));
}

typedef struct walk_ctx {
    kvx_index *ix;
    uint64_t n;
} walk_ctx;

static int walk_coords_body(MDB_txn *txn, void *ctx)
{
    walk_ctx *w = ctx;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(txn, w->ix->coord, &cur);
    if (rc) return rc;
    MDB_val k, v;
    rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST);
    while (rc == 0) {
        uint32_t c;
        kvx_idx_coord cv;
        if ((rc = kvx_idx_dec_coord(&k, &v, &c, &cv))) break;
        w->n++;
        rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT);
    }
    mdb_cursor_close(cur);
    return rc == MDB_NOTFOUND ? 0 : rc;
}

static int fill_body(MDB_txn *txn, void *ctx)
{
    kvx_index *ix = ctx;
    for (uint32_t i = 0; i < 4000; i++) {
        int rc = kvx_idx_add_block(txn, ix, (1u << 24) | i, su_mix(i), 1);
        if (rc) return rc;
    }
    return 0;
}

/* data.mdb truncated under an open environment: a guarded read is an
 * error naming reindex; an unguarded one reads a zero page and poisons
 * the environment, whose every later transaction is refused. */
static int truncated_under_open(const char *dir, void *arg)
{
    (void)arg;
    kvx_index *ix = NULL;
    if (kvx_idx_open(&ix, dir, 1, 1) != 0) return CH_SETUP;
    if (kvx_idx_write(ix, fill_body, ix) != 0) return CH_SETUP;
    walk_ctx w = {ix, 0};
    if (kvx_idx_read(ix, walk_coords_body, &w) != 0 || w.n != 4000) return CH_SETUP;
    uint32_t ps = 4096;
    char f[600];
    snprintf(f, sizeof f, "%s/data.mdb", dir);
    if (truncate(f, 2 * (off_t)ps) != 0) return CH_SETUP; /* the metas only */
    uint64_t faults = kvx_sigbus_faults();
    w.n = 0;
    int rc = kvx_idx_read(ix, walk_coords_body, &w);
    fprintf(stderr, "guarded: %d %s\n", rc, kvx_last_error());
    if (rc != KVX_ECORRUPT || !strstr(kvx_last_error(), "kvx store reindex") || !strstr(kvx_last_error(), f))
        return CH_MESSAGE;
    if (kvx_sigbus_faults() <= faults) return 40;
    /* a write transaction faults the same way (it reads the tree) */
    rc = kvx_idx_write(ix, fill_body, ix);
    fprintf(stderr, "write: %d %s\n", rc, kvx_last_error());
    if (rc != KVX_ECORRUPT) return 41;
    /* unguarded: a plain read transaction, as engine code does today */
    MDB_txn *txn;
    if (kvx_idx_read_begin(ix, &txn) != 0) return 42;
    uint32_t key = (1u << 24) | 5;
    MDB_val k = {4, &key}, v;
    rc = mdb_get(txn, ix->coord, &k, &v); /* sees zeros: an LMDB error */
    kvx_idx_read_end(ix, txn);
    fprintf(stderr, "unguarded mdb_get: %d\n", rc);
    if (rc == 0) return 43;
    if (!kvx_sigbus_poisoned(ix->guard_slot)) return 44;
    rc = kvx_idx_read_begin(ix, &txn);
    fprintf(stderr, "after poison: %d %s\n", rc, kvx_last_error());
    if (rc != KVX_ECORRUPT || !strstr(kvx_last_error(), "reindex")) return 45;
    if (kvx_idx_write(ix, fill_body, ix) != KVX_ECORRUPT) return 46;
    kvx_idx_close(ix);
    /* and a fresh open refuses the truncated file before LMDB sees it */
    rc = kvx_idx_open(&ix, dir, 1, 1);
    fprintf(stderr, "reopen: %d %s\n", rc, kvx_last_error());
    if (rc != KVX_ECORRUPT || !strstr(kvx_last_error(), "past the end of the file")) return 47;
    return CH_OK;
}

/* PROMISE: RECOVER-8 */
static void test_truncated_under_open_index(void **state)
{
    (void)state;
    char dir[300];
    su_new_dir(dir, sizeof dir);
    assert_int_equal(mkdir(dir, 0700), 0);
    expect_child_ok(run_child(truncated_under_open, dir, NULL, 60), "data.mdb truncated under an open index");
}

static volatile uint8_t sink;

typedef struct touch_ctx {
    const volatile uint8_t *p;
} touch_ctx;

static int touch_body(void *ctx)
{
    touch_ctx *t = ctx;
    sink = *t->p;
    return 5;
}

/* A file of two pages mapped over four: pages 2 and 3 lie past the end. */
static uint8_t *map_short(size_t ps, int *out_fd)
{
    char tmpl[] = "/tmp/kvx-ixd-map-XXXXXX";
    int fd = mkstemp(tmpl);
    assert_true(fd >= 0);
    unlink(tmpl);
    assert_int_equal(ftruncate(fd, (off_t)(2 * ps)), 0);
    uint8_t *m = mmap(NULL, 4 * ps, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(m != MAP_FAILED);
    *out_fd = fd;
    return m;
}

/* PROMISE: RECOVER-8 */
static void test_guard_catalog_ranges(void **state)
{
    (void)state;
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    int fd;
    uint8_t *m = map_short(ps, &fd);
    int slot;
    assert_int_equal(kvx_sigbus_register_catalog(&slot, m, 4 * ps), 0);
    /* inside a guarded body: KVX_ECORRUPT, nothing mapped over the file */
    touch_ctx t = {m + 2 * ps};
    int faulted = 0;
    uint64_t f0 = kvx_sigbus_faults();
    assert_int_equal(kvx_sigbus_run(touch_body, &t, &faulted), KVX_ECORRUPT);
    assert_int_equal(faulted, 1);
    assert_true(kvx_sigbus_faults() > f0);
    assert_false(kvx_sigbus_poisoned(slot));
    /* a body that does not fault returns its own result */
    t.p = m;
    assert_int_equal(kvx_sigbus_run(touch_body, &t, &faulted), 5);
    assert_int_equal(faulted, 0);
    /* nested: the inner run catches its own fault, the outer goes on */
    /* (exercised through kvx_idx_write inside the battery as well) */
    /* the file grows back: the page reads its bytes (not a zero page) */
    assert_int_equal(ftruncate(fd, (off_t)(4 * ps)), 0);
    uint8_t x = 0x77;
    assert_int_equal(pwrite(fd, &x, 1, (off_t)(2 * ps)), 1);
    t.p = m + 2 * ps;
    assert_int_equal(kvx_sigbus_run(touch_body, &t, &faulted), 5);
    assert_int_equal(sink, 0x77);
    /* outside a guarded body: a zero page, and the range is poisoned */
    assert_int_equal(ftruncate(fd, (off_t)(2 * ps)), 0);
    sink = 1;
    sink = *(volatile uint8_t *)(m + 3 * ps);
    assert_int_equal(sink, 0);
    assert_true(kvx_sigbus_poisoned(slot));
    /* moving the slot (a remapped map) clears the mark */
    kvx_sigbus_move(slot, m, 4 * ps);
    assert_false(kvx_sigbus_poisoned(slot));
    kvx_sigbus_unregister(slot);
    munmap(m, 4 * ps);
    close(fd);
}

/* A SIGSEGV just past a catalog range inside a guarded body is caught (a
 * node offset of a damaged page pointing past the map). */
/* PROMISE: FORMAT-13 */
static void test_guard_segv_past_catalog(void **state)
{
    (void)state;
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *m = mmap(NULL, 3 * ps, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    assert_int_equal(munmap(m + ps, 2 * ps), 0); /* a hole past the range */
    int slot;
    assert_int_equal(kvx_sigbus_register_catalog(&slot, m, ps), 0);
    touch_ctx t = {m + ps + 100};
    int faulted = 0;
    assert_int_equal(kvx_sigbus_run(touch_body, &t, &faulted), KVX_ECORRUPT);
    assert_int_equal(faulted, 1);
    kvx_sigbus_unregister(slot);
    munmap(m, ps);
}

/* The same SIGSEGV outside a guarded body is not swallowed. */
static int segv_unguarded(const char *dir, void *arg)
{
    (void)dir;
    (void)arg;
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    uint8_t *m = mmap(NULL, 2 * ps, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED || munmap(m + ps, ps) != 0) return CH_SETUP;
    int slot;
    if (kvx_sigbus_register_catalog(&slot, m, ps) != 0) return CH_SETUP;
    int fd2 = open("/dev/null", O_WRONLY); /* keep ASan's report out of the log */
    dup2(fd2, 2);
    sink = *(volatile uint8_t *)(m + ps + 8);
    return CH_OK; /* surviving is the failure */
}

/* PROMISE: FORMAT-13 */
static void test_guard_foreign_segv_not_swallowed(void **state)
{
    (void)state;
    child_result r = run_child(segv_unguarded, "", NULL, 30);
    if (!WIFSIGNALED(r.status)) fail_msg("child %s instead of dying of SIGSEGV", status_text(r.status));
    assert_int_equal(WTERMSIG(r.status), SIGSEGV);
}

/* Shard ranges keep their behaviour, even inside a guarded body: the
 * faulting page reads as zeros, the body goes on, and the range is marked
 * poisoned (the shard then checks its pages again before handing them
 * out: tests/engine/lookup.c test_truncated_after_checked). */
/* PROMISE: FORMAT-13 */
static void test_guard_shard_range_unchanged(void **state)
{
    (void)state;
    size_t ps = (size_t)sysconf(_SC_PAGESIZE);
    int fd;
    uint8_t *m = map_short(ps, &fd);
    int slot;
    assert_int_equal(kvx_sigbus_register(&slot, m, 4 * ps), 0);
    touch_ctx t = {m + 3 * ps};
    int faulted = 1;
    sink = 9;
    assert_int_equal(kvx_sigbus_run(touch_body, &t, &faulted), 5);
    assert_int_equal(faulted, 0);
    assert_int_equal(sink, 0);
    assert_true(kvx_sigbus_poisoned(slot));
    kvx_sigbus_unregister(slot);
    munmap(m, 4 * ps);
    close(fd);
}

typedef struct file_sum {
    char name[256];
    uint64_t size, sum;
} file_sum;

typedef struct tree_sum {
    file_sum f[64];
    int n;
} tree_sum;

static uint64_t fnv_file(const char *path, uint64_t *out_size)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    uint64_t h = 0xcbf29ce484222325ull, n = 0;
    uint8_t buf[65536];
    ssize_t r;
    while ((r = read(fd, buf, sizeof buf)) > 0) {
        for (ssize_t i = 0; i < r; i++) h = (h ^ buf[i]) * 0x100000001b3ull;
        n += (uint64_t)r;
    }
    close(fd);
    *out_size = n;
    return h;
}

static void sum_dir(tree_sum *t, const char *dir)
{
    t->n = 0;
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) && t->n < 64) {
        if (e->d_name[0] == '.') continue;
        file_sum *f = &t->f[t->n++];
        snprintf(f->name, sizeof f->name, "%s", e->d_name);
        char p[700];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        f->sum = fnv_file(p, &f->size);
    }
    closedir(d);
}

/* Every file of before is in after with the same bytes: "" or what is not. */
static const char *tree_kept(const tree_sum *before, const tree_sum *after)
{
    static char why[400];
    for (int i = 0; i < before->n; i++) {
        int j = 0;
        while (j < after->n && strcmp(after->f[j].name, before->f[i].name)) j++;
        if (j == after->n) {
            snprintf(why, sizeof why, "shards/%s was removed", before->f[i].name);
            return why;
        }
        if (after->f[j].size != before->f[i].size || after->f[j].sum != before->f[i].sum) {
            snprintf(why, sizeof why, "shards/%s changed (%llu -> %llu bytes)", before->f[i].name,
                     (unsigned long long)before->f[i].size, (unsigned long long)after->f[j].size);
            return why;
        }
    }
    return "";
}

static uint64_t rng_next(uint64_t *s)
{
    *s += 0x9E3779B97F4A7C15ull;
    return su_mix(*s);
}

/* One random corruption of file; describes it in desc. */
static void corrupt(const char *file, uint64_t *rng, char *desc, size_t dn)
{
    uint64_t size = file_size(file);
    uint32_t ps = 4096;
    uint64_t pages = size / ps ? size / ps : 1;
    int fd = open(file, O_RDWR);
    assert_true(fd >= 0);
    uint8_t page[4096];
    switch (rng_next(rng) % 7) {
    case 0:
    case 1: { /* byte flips: anywhere, or concentrated in page headers and metas */
        int n = 1 + (int)(rng_next(rng) % 16);
        int headers = (int)(rng_next(rng) % 2);
        size_t len = (size_t)snprintf(desc, dn, "%d byte flip(s)%s at", n, headers ? " in page headers/metas" : "");
        for (int i = 0; i < n; i++) {
            uint64_t off = headers ? (rng_next(rng) % pages) * ps + rng_next(rng) % 160 : rng_next(rng) % size;
            if (off >= size) off = size - 1;
            uint8_t b;
            assert_int_equal(pread(fd, &b, 1, (off_t)off), 1);
            b ^= (uint8_t)(1 + rng_next(rng) % 255);
            assert_int_equal(pwrite(fd, &b, 1, (off_t)off), 1);
            if (len < dn) len += (size_t)snprintf(desc + len, dn - len, " %llu", (unsigned long long)off);
        }
        break;
    }
    case 2: { /* a zeroed page */
        uint64_t pg = rng_next(rng) % pages;
        memset(page, 0, sizeof page);
        assert_int_equal(pwrite(fd, page, ps, (off_t)(pg * ps)), (ssize_t)ps);
        snprintf(desc, dn, "page %llu zeroed", (unsigned long long)pg);
        break;
    }
    case 3: { /* truncation to a random length */
        uint64_t len = rng_next(rng) % size;
        assert_int_equal(ftruncate(fd, (off_t)len), 0);
        snprintf(desc, dn, "truncated to %llu of %llu bytes", (unsigned long long)len, (unsigned long long)size);
        break;
    }
    case 4: { /* a page of 0xFF */
        uint64_t pg = rng_next(rng) % pages;
        memset(page, 0xFF, sizeof page);
        assert_int_equal(pwrite(fd, page, ps, (off_t)(pg * ps)), (ssize_t)ps);
        snprintf(desc, dn, "page %llu set to 0xFF", (unsigned long long)pg);
        break;
    }
    case 5: { /* appended garbage */
        uint64_t len = 1 + rng_next(rng) % (3 * ps);
        for (uint64_t i = 0; i < len; i += 8) {
            uint64_t v = rng_next(rng);
            size_t k = len - i < 8 ? (size_t)(len - i) : 8;
            assert_int_equal(pwrite(fd, &v, k, (off_t)(size + i)), (ssize_t)k);
        }
        snprintf(desc, dn, "%llu bytes of garbage appended", (unsigned long long)len);
        break;
    }
    case 6: { /* a page of random bytes */
        uint64_t pg = rng_next(rng) % pages;
        for (size_t i = 0; i < sizeof page; i += 8) {
            uint64_t v = rng_next(rng);
            memcpy(page + i, &v, 8);
        }
        assert_int_equal(pwrite(fd, page, ps, (off_t)(pg * ps)), (ssize_t)ps);
        snprintf(desc, dn, "page %llu filled with random bytes", (unsigned long long)pg);
        break;
    }
    }
    close(fd);
}

/* After a corruption: a reader (open READONLY, stat, prefix, verify). An
 * error anywhere is fine; a wrong byte is not. */
static int battery_reader(const char *dir, void *arg)
{
    (void)arg;
    kvx_store *s = NULL;
    int rc = kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY);
    if (rc) {
        fprintf(stderr, "reader open: %d %s\n", rc, kvx_last_error());
        return CH_OK;
    }
    kvx_store_stats st;
    rc = kvx_store_stat(&st, s);
    if (rc) fprintf(stderr, "stat: %d %s\n", rc, kvx_last_error());
    for (uint64_t q = 0; q < NSEQ; q++)
        if (served(s, q) == -2) return CH_WRONG;
    uint64_t bad = 0;
    rc = kvx_store_verify(s, &bad, NULL, NULL);
    if (rc) fprintf(stderr, "verify: %d %s\n", rc, kvx_last_error());
    kvx_store_close(s);
    return CH_OK;
}

static int battery_writer(const char *dir, void *arg)
{
    (void)arg;
    kvx_store *s = NULL;
    int rc = kvx_store_open(&s, dir, NULL, KVX_STORE_NOWAIT);
    if (rc) {
        fprintf(stderr, "writer open: %d %s\n", rc, kvx_last_error());
        return CH_OK;
    }
    kvx_store_stats st;
    rc = kvx_store_stat(&st, s);
    if (rc) fprintf(stderr, "stat: %d %s\n", rc, kvx_last_error());
    for (uint64_t q = 0; q < NSEQ; q++)
        if (served(s, q) == -2) return CH_WRONG;
    kvx_store_close(s);
    return CH_OK;
}

/* Then reindex (kvx_store_reindex_dir: the old index is never read) and
 * a reader: everything is served again (DESIGN.md rule 4). */
static int battery_reindex(const char *dir, void *arg)
{
    (void)arg;
    int rc = kvx_store_reindex_dir(dir, KVX_STORE_NOWAIT);
    if (rc) {
        fprintf(stderr, "reindex: %d %s\n", rc, kvx_last_error());
        return CH_OPEN;
    }
    kvx_store *s = NULL;
    if ((rc = kvx_store_open(&s, dir, NULL, KVX_STORE_READONLY)) != 0) {
        fprintf(stderr, "open after reindex: %d %s\n", rc, kvx_last_error());
        return CH_OPEN;
    }
    for (uint64_t q = 0; q < NSEQ; q++) {
        int n = served(s, q);
        if (n == -2) return CH_WRONG;
        if (n != NB) {
            fprintf(stderr, "after reindex, sequence %llu: %d of %d blocks served (%s)\n", (unsigned long long)q, n, NB,
                    kvx_last_error());
            return CH_PREFIX;
        }
    }
    kvx_store_close(s);
    return CH_OK;
}

typedef struct battery_result {
    int ran;
    int n, signals, wrong, shard_changes, not_restored, opened_reader, opened_writer;
    double seconds;
    char report[16384];
    size_t len;
} battery_result;

static battery_result battery;

static void battery_note(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (battery.len < sizeof battery.report)
        battery.len += (size_t)vsnprintf(battery.report + battery.len, sizeof battery.report - battery.len, fmt, ap);
    va_end(ap);
    if (battery.len > sizeof battery.report) battery.len = sizeof battery.report;
}

static void run_battery(void)
{
    if (battery.ran) return;
    battery.ran = 1;
    const char *e = getenv("KVX_BATTERY_SEED");
    uint64_t seed = e ? strtoull(e, NULL, 0) : 0x6b76785f69647821ull;
    e = getenv("KVX_BATTERY_N");
    int n = e ? atoi(e) : 200;
    int verbose = getenv("KVX_BATTERY_VERBOSE") != NULL;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    char pristine[300], work[300];
    filled_store(pristine, sizeof pristine);
    su_new_dir(work, sizeof work);
    tree_sum before, after;
    sum_dir(&before, path_in(pristine, "shards"));
    assert_true(before.n >= 1);
    for (int it = 0; it < n; it++) {
        uint64_t rng = seed ^ ((uint64_t)it * 0xD1B54A32D192ED03ull);
        sh("rm -rf '%s'", work);
        assert_int_equal(sh("cp -a '%s' '%s'", pristine, work), 0);
        char desc[400];
        corrupt(path_in(work, "index/data.mdb"), &rng, desc, sizeof desc);
        static const char *const who[3] = {"reader", "writer", "reindex"};
        static const child_fn fns[3] = {battery_reader, battery_writer, battery_reindex};
        for (int w = 0; w < 3; w++) {
            child_result r = run_child(fns[w], work, NULL, 60);
            if (verbose) printf("%d %s (%s): %s: %.300s\n", it, who[w], desc, status_text(r.status), r.log);
            if (w < 2 && !strstr(r.log, "open:")) *(w ? &battery.opened_writer : &battery.opened_reader) += 1;
            int code = WIFEXITED(r.status) ? WEXITSTATUS(r.status) : -1;
            if (w == 2 && (code == CH_OPEN || code == CH_PREFIX)) {
                battery.not_restored++;
                battery_note("STORE BUG (rule 4: a damaged index is a reindex away) seed=0x%llx iteration %d (%s): "
                             "%s\n%.600s\n",
                             (unsigned long long)seed, it, desc, status_text(r.status), r.log);
            } else if (code != CH_OK && code != CH_WRONG) {
                battery.signals++;
                battery_note("SIGNAL seed=0x%llx iteration %d (%s): %s, %s\n%.600s\n", (unsigned long long)seed, it,
                             desc, who[w], status_text(r.status), r.log);
            } else if (WEXITSTATUS(r.status) == CH_WRONG) {
                battery.wrong++;
                battery_note("WRONG BYTES seed=0x%llx iteration %d (%s): %s served a wrong block\n%.600s\n",
                             (unsigned long long)seed, it, desc, who[w], r.log);
            }
            sum_dir(&after, path_in(work, "shards"));
            const char *why = tree_kept(&before, &after);
            if (*why) {
                battery.shard_changes++;
                battery_note("STORE BUG (engine/store*.c: rule 2, nothing deleted on the word of the index) "
                             "seed=0x%llx iteration %d (%s): after the %s, %s\n%.600s\n",
                             (unsigned long long)seed, it, desc, who[w], why, r.log);
                /* later commands would only repeat it: restore the shards */
                sh("rm -rf '%s/shards' && cp -a '%s/shards' '%s/shards'", work, pristine, work);
            }
        }
    }
    battery.n = n;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    battery.seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("battery: %d corruptions (seed 0x%llx) in %.1f s: reader opened %d, writer opened %d; "
           "%d signal(s), %d wrong-byte(s), %d shard change(s), %d not restored by reindex\n",
           n, (unsigned long long)seed, battery.seconds, battery.opened_reader, battery.opened_writer,
           battery.signals, battery.wrong, battery.shard_changes, battery.not_restored);
    sh("rm -rf '%s' '%s'", work, pristine);
}

/* PROMISE: RECOVER-8 */
static void test_battery_no_signal(void **state)
{
    (void)state;
    run_battery();
    if (battery.signals) fail_msg("%d command(s) died of a signal:\n%s", battery.signals, battery.report);
}

/* PROMISE: RECOVER-8 */
static void test_battery_no_wrong_bytes(void **state)
{
    (void)state;
    run_battery();
    if (battery.wrong) fail_msg("%d command(s) served wrong bytes:\n%s", battery.wrong, battery.report);
}

/* STORE BUG marker: the shards are the store's to keep (DESIGN.md rule 2);
 * the index code only reports damage. A failure here is engine/store*.c. */
/* PROMISE: RECOVER-8 */
static void test_battery_shards_kept_STORE(void **state)
{
    (void)state;
    run_battery();
    if (battery.shard_changes)
        fail_msg("STORE BUG: %d command(s) removed or changed shard files because the index was damaged:\n%s",
                 battery.shard_changes, battery.report);
}

/* STORE marker too: reindex is the store's (engine/store*.c). */
/* PROMISE: RECOVER-8 */
static void test_battery_reindex_restores_STORE(void **state)
{
    (void)state;
    run_battery();
    if (battery.not_restored)
        fail_msg("STORE BUG: after %d corruption(s) reindex did not bring every block back:\n%s", battery.not_restored,
                 battery.report);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reader_other_user_no_write),
        cmocka_unit_test(test_reader_owner_index_chmod),
        cmocka_unit_test(test_reader_readonly_bind_mount),
        cmocka_unit_test(test_meta_page_checks),
        cmocka_unit_test(test_check_file_direct),
        cmocka_unit_test(test_record_sizes),
        cmocka_unit_test(test_walk_accepts_real_trees),
        cmocka_unit_test(test_short_file_free_tail_opens),
        cmocka_unit_test(test_truncated_under_open_index),
        cmocka_unit_test(test_guard_catalog_ranges),
        cmocka_unit_test(test_guard_segv_past_catalog),
        cmocka_unit_test(test_guard_foreign_segv_not_swallowed),
        cmocka_unit_test(test_guard_shard_range_unchanged),
        cmocka_unit_test(test_battery_no_signal),
        cmocka_unit_test(test_battery_no_wrong_bytes),
        cmocka_unit_test(test_battery_shards_kept_STORE),
        cmocka_unit_test(test_battery_reindex_restores_STORE),
    };
    return cmocka_run_group_tests_name("index/damage", tests, su_setup, su_teardown);
}
