/*
 * pool.c - io/pool.c, the pinned buffer pool: slot allocation (alignment,
 * no overlap, reuse, double free and bad frees refused, capacity,
 * exhaustion), two threads on one pool, NUMA placement checked with
 * get_mempolicy on the memory itself, and RLIMIT_MEMLOCK without
 * CAP_IPC_LOCK (a child process): the error names the limit.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "kvx.h"
#include "lib/fault.h"
#include "lib/io.h"

static kvx_pool *mkpool(uint64_t bytes, int node, uint32_t flags)
{
    kvx_pool_options o = KVX_POOL_OPTIONS_INIT;
    o.bytes = bytes;
    o.numa_node = node;
    o.flags = flags;
    kvx_pool *p = NULL;
    assert_int_equal(kvx_pool_create(&p, &o), 0);
    return p;
}

static void test_alloc_free(void **state)
{
    (void)state;
    kvx_pool *p = mkpool(1 << 20, KVX_POOL_NODE_AUTO, 0);
    kvx_pool_info info;
    assert_int_equal(kvx_pool_get_info(&info, p), 0);
    assert_int_equal(info.bytes, 1 << 20);
    assert_int_equal(info.free_bytes, 1 << 20);
    assert_int_equal(info.locked, 1);
    assert_int_equal((uintptr_t)info.base % 4096, 0);

    void *a, *b, *c;
    assert_int_equal(kvx_pool_alloc(&a, p, 1000), 0);
    assert_int_equal(kvx_pool_alloc(&b, p, 8192), 0);
    assert_int_equal(kvx_pool_alloc(&c, p, 4097), 0);
    uint8_t *base = info.base;
    for (void *x = a, **v = (void *[]){a, b, c, NULL}; x; x = *++v) {
        assert_int_equal((uintptr_t)x % 4096, 0);
        assert_true((uint8_t *)x >= base && (uint8_t *)x < base + (1 << 20));
    }
    /* rounded to 4096 each, no overlap */
    assert_true((uint8_t *)b >= (uint8_t *)a + 4096 || (uint8_t *)a >= (uint8_t *)b + 8192);
    assert_true((uint8_t *)c >= (uint8_t *)b + 8192 || (uint8_t *)b >= (uint8_t *)c + 8192);
    memset(a, 1, 4096);
    memset(b, 2, 8192);
    memset(c, 3, 8192);
    assert_int_equal(kvx_pool_get_info(&info, p), 0);
    assert_int_equal(info.free_bytes, (1 << 20) - 4096 - 8192 - 8192);

    /* freeing b and taking 8192 again reuses b's range (first fit) */
    assert_int_equal(kvx_pool_free(p, b, 8192), 0);
    void *b2;
    assert_int_equal(kvx_pool_alloc(&b2, p, 8192), 0);
    assert_ptr_equal(b2, b);
    /* double free and foreign pointers are refused */
    assert_int_equal(kvx_pool_free(p, a, 1000), 0);
    assert_int_equal(kvx_pool_free(p, a, 1000), KVX_EINVALID);
    assert_int_equal(kvx_pool_free(p, (uint8_t *)c + 1, 4096), KVX_EINVALID);
    int local;
    assert_int_equal(kvx_pool_free(p, &local, 4096), KVX_EINVALID);
    /* too big for what is left */
    void *big;
    assert_int_equal(kvx_pool_alloc(&big, p, 1 << 20), KVX_ECAPACITY);
    assert_non_null(strstr(kvx_last_error(), "free"));
    assert_int_equal(kvx_pool_alloc(&big, p, 0), KVX_EINVALID);
    assert_int_equal(kvx_pool_free(p, b2, 8192), 0);
    assert_int_equal(kvx_pool_free(p, c, 4097), 0);
    assert_int_equal(kvx_pool_get_info(&info, p), 0);
    assert_int_equal(info.free_bytes, 1 << 20);
    /* everything merged back: the whole pool is one slot again */
    assert_int_equal(kvx_pool_alloc(&big, p, 1 << 20), 0);
    assert_ptr_equal(big, info.base);
    kvx_pool_destroy(p);
    kvx_pool_destroy(NULL);
}

static void test_options(void **state)
{
    (void)state;
    kvx_pool *p = NULL;
    kvx_pool_options o = KVX_POOL_OPTIONS_INIT;
    o.version = 99;
    assert_int_equal(kvx_pool_create(&p, &o), KVX_EVERSION);
    assert_null(p);
    o = (kvx_pool_options)KVX_POOL_OPTIONS_INIT;
    o.flags = 0x100;
    assert_int_equal(kvx_pool_create(&p, &o), KVX_EINVALID);
    o = (kvx_pool_options)KVX_POOL_OPTIONS_INIT;
    o.numa_node = 4000;
    assert_int_equal(kvx_pool_create(&p, &o), KVX_EINVALID);
    assert_non_null(strstr(kvx_last_error(), "numa_node"));
    /* defaults: 64 MiB */
    assert_int_equal(kvx_pool_create(&p, NULL), 0);
    kvx_pool_info info;
    assert_int_equal(kvx_pool_get_info(&info, p), 0);
    assert_int_equal(info.bytes, 64u << 20);
    kvx_pool_destroy(p);
}

static int node_of(void *addr)
{
    int node = -1;
    if (get_mempolicy(&node, NULL, 0, addr, MPOL_F_NODE | MPOL_F_ADDR) != 0) return -2;
    return node;
}

static void test_numa(void **state)
{
    (void)state;
    if (numa_available() < 0) skip();
    for (int n = 0; n <= numa_max_node(); n++) {
        if (!numa_bitmask_isbitset(numa_all_nodes_ptr, (unsigned)n)) continue;
        if (numa_node_size64(n, NULL) <= 0) continue;
        kvx_pool *p = mkpool(256 << 10, n, 0);
        kvx_pool_info info;
        assert_int_equal(kvx_pool_get_info(&info, p), 0);
        assert_int_equal(info.numa_node, n);
        /* the pages themselves are on n (first, middle, last) */
        uint8_t *b = info.base;
        assert_int_equal(node_of(b), n);
        assert_int_equal(node_of(b + (128 << 10)), n);
        assert_int_equal(node_of(b + (256 << 10) - 1), n);
        kvx_pool_destroy(p);
    }
    /* AUTO without a GPU: the calling thread's node */
    kvx_pool_options o = KVX_POOL_OPTIONS_INIT;
    o.bytes = 64 << 10;
    kvx_pool *p = NULL;
    assert_int_equal(kvx_pool_create(&p, &o), 0);
    kvx_pool_info info;
    assert_int_equal(kvx_pool_get_info(&info, p), 0);
    int cpu = sched_getcpu();
    if (numa_max_node() == 0) assert_int_equal(info.numa_node, numa_node_of_cpu(cpu));
    assert_int_equal(node_of(info.base), info.numa_node);
    kvx_pool_destroy(p);
}

/* Child: lose CAP_IPC_LOCK, set RLIMIT_MEMLOCK to 64 KiB, then check both
 * refusals. Exit codes name the failed check. */
static int drop_ipc_lock(void)
{
    struct __user_cap_header_struct h = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct d[2];
    if (syscall(SYS_capget, &h, d)) return -1;
    d[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    d[CAP_IPC_LOCK / 32].permitted &= ~(1u << (CAP_IPC_LOCK % 32));
    d[CAP_IPC_LOCK / 32].inheritable &= ~(1u << (CAP_IPC_LOCK % 32));
    return syscall(SYS_capset, &h, d) ? -1 : 0;
}

static int memlock_child(void)
{
    if (drop_ipc_lock() != 0) return 10;
    struct rlimit rl = {64 << 10, 64 << 10};
    if (setrlimit(RLIMIT_MEMLOCK, &rl) != 0) return 11;
    kvx_pool_options o = KVX_POOL_OPTIONS_INIT;
    o.bytes = 4 << 20;
    kvx_pool *p = NULL;
    int rc = kvx_pool_create(&p, &o);
    if (rc != KVX_EMEMLOCK) {
        fprintf(stderr, "pool_create under the limit: %d %s\n", rc, kvx_last_error());
        return 12;
    }
    const char *m = kvx_last_error();
    fprintf(stderr, "mlock refusal: %s\n", m);
    if (!strstr(m, "RLIMIT_MEMLOCK") || !strstr(m, "65536 bytes") || !strstr(m, "4194304") ||
        !strstr(m, "needed"))
        return 13;
    if (p) return 14;
    /* Without mlock the pool works; io_uring's registration is still
     * charged to the limit and must be refused the same clear way. */
    o.flags = KVX_POOL_NO_MLOCK;
    if (kvx_pool_create(&p, &o) != 0) return 15;
    kvx_fetch_options fo = KVX_FETCH_OPTIONS_INIT;
    fo.io_mode = KVX_IO_URING;
    kvx_fetch *f = NULL;
    rc = kvx_fetch_create(&f, p, &fo);
    if (rc == -EPERM || rc == -ENOSYS) return 77; /* no io_uring here */
    if (rc != KVX_EMEMLOCK) return 16;
    m = kvx_last_error();
    fprintf(stderr, "registration refusal: %s\n", m);
    if (!strstr(m, "io_uring_register_buffers") || !strstr(m, "RLIMIT_MEMLOCK") || !strstr(m, "4194304"))
        return 17;
    /* The pread path needs no registration. */
    fo.io_mode = KVX_IO_PREAD;
    if (kvx_fetch_create(&f, p, &fo) != 0) return 18;
    kvx_fetch_destroy(f);
    kvx_pool_destroy(p);
    return 0;
}

/* PROMISE: IO-2 */
static void test_memlock_error(void **state)
{
    (void)state;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) _exit(memlock_child());
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 10 || WEXITSTATUS(st) == 77) skip(); /* no capabilities / io_uring here */
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_mode_names(void **state)
{
    (void)state;
    assert_string_equal(kvx_io_mode_name(KVX_IO_URING), "uring");
    assert_string_equal(kvx_io_mode_name(KVX_IO_PREAD), "pread");
    assert_string_equal(kvx_io_mode_name(KVX_IO_AUTO), "auto");
    assert_string_equal(kvx_io_mode_name(42), "unknown");
}

#define IO_BASE_N 40

static const int modes[3] = {KVX_IO_URING, KVX_IO_URING, KVX_IO_PREAD};

static const uint32_t mode_flags[3] = {0, KVX_FETCH_BUFFERED, 0};

static void test_pool_exhausted(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    kvx_pool *p = io_pool(1 << 20);
    void *slots[256];
    size_t ns = 0;
    while (ns < 256 && kvx_pool_alloc(&slots[ns], p, 4096) == 0) ns++;
    assert_int_equal(ns, 256);
    void *x;
    assert_int_equal(kvx_pool_alloc(&x, p, 4096), KVX_ECAPACITY);
    for (int m = 0; m < 3; m++) {
        kvx_fetch *f = io_fetch(p, modes[m], 2, mode_flags[m], 0);
        kvx_fetch_req r[IO_BASE_N];
        size_t n = io_every_page(r, s);
        assert_int_equal(kvx_fetch_submit(f, r, n), KVX_ECAPACITY);
        kvx_fetch_result res[IO_BASE_N];
        assert_int_equal(kvx_fetch_wait(f, res, n, 0), KVX_EINVALID); /* no batch */
        /* one slot free: a batch that needs more still fails whole, and gives it back */
        assert_int_equal(kvx_pool_free(p, slots[ns - 1], 4096), 0);
        assert_int_equal(kvx_fetch_submit(f, r, n), KVX_ECAPACITY);
        assert_int_equal(io_pool_free(p), 4096);
        kvx_fetch_req one = {s, 0};
        kvx_fetch_result r1;
        assert_int_equal(kvx_fetch_submit(f, &one, 1), 0);
        assert_int_equal(kvx_fetch_wait(f, &r1, 1, -1), 0);
        assert_int_equal(r1.status, 0);
        assert_true(io_page_ok(r1.page, 7, 0, r1.bytes));
        kvx_fetch_destroy(f);
        assert_int_equal(kvx_pool_alloc(&slots[ns - 1], p, 4096), 0);
    }
    for (size_t i = 0; i < ns; i++) assert_int_equal(kvx_pool_free(p, slots[i], 4096), 0);
    assert_int_equal(io_pool_free(p), 1 << 20);
    /* misuse of free: double, foreign, unaligned, zero, past the end */
    void *a;
    assert_int_equal(kvx_pool_alloc(&a, p, 8192), 0);
    assert_int_equal(kvx_pool_free(p, a, 8192), 0);
    assert_int_equal(kvx_pool_free(p, a, 8192), KVX_EINVALID);
    int local;
    assert_int_equal(kvx_pool_free(p, &local, 4096), KVX_EINVALID);
    assert_int_equal(kvx_pool_free(p, (uint8_t *)a + 1, 4096), KVX_EINVALID);
    assert_int_equal(kvx_pool_free(p, a, 0), KVX_EINVALID);
    assert_int_equal(kvx_pool_free(p, a, UINT64_MAX), KVX_EINVALID);
    assert_int_equal(kvx_pool_alloc(&a, p, 0), KVX_EINVALID);
    assert_int_equal(kvx_pool_alloc(&a, p, UINT64_MAX), KVX_ECAPACITY);
    assert_int_equal(io_pool_free(p), 1 << 20);
    kvx_pool_destroy(p);
    kvx_shard_close(s);
}

/* kvx.h: "KVX_EINVALID for a range that is not an allocated slot of p".
 * A free that names more than the slot (or a slot and its neighbour)
 * handed a live slot out again: two owners of one range. */
/* PROMISE: IO-1 */
static void test_pool_free_not_a_slot(void **state)
{
    (void)state;
    kvx_pool *p = io_pool(1 << 20);
    void *a, *b, *c;
    assert_int_equal(kvx_pool_alloc(&a, p, 4096), 0);
    assert_int_equal(kvx_pool_alloc(&b, p, 8192), 0);
    assert_int_equal(kvx_pool_alloc(&c, p, 1000), 0);
    assert_int_equal(kvx_pool_free(p, a, 12288), KVX_EINVALID); /* a and b */
    assert_int_equal(kvx_pool_free(p, b, 4096), KVX_EINVALID);  /* half of b */
    assert_int_equal(kvx_pool_free(p, (uint8_t *)b + 4096, 4096), KVX_EINVALID); /* inside b */
    assert_int_equal(kvx_pool_free(p, b, 12288), KVX_EINVALID); /* b and c */
    assert_int_equal(io_pool_free(p), (1 << 20) - 4096 - 8192 - 4096);
    /* b is still b's: a new slot is not inside it */
    void *d;
    assert_int_equal(kvx_pool_alloc(&d, p, 4096), 0);
    assert_true((uint8_t *)d >= (uint8_t *)c + 4096 || (uint8_t *)d + 4096 <= (uint8_t *)a);
    /* the real frees work, lengths as given to alloc (rounded the same way) */
    assert_int_equal(kvx_pool_free(p, b, 8192), 0);
    assert_int_equal(kvx_pool_free(p, b, 8192), KVX_EINVALID);
    assert_int_equal(kvx_pool_free(p, c, 1000), 0);
    assert_int_equal(kvx_pool_free(p, a, 4000), 0);
    assert_int_equal(kvx_pool_free(p, d, 4096), 0);
    assert_int_equal(io_pool_free(p), 1 << 20);
    /* every slot of a full pool, freed in a shuffled order */
    void *sl[256];
    for (int i = 0; i < 256; i++) assert_int_equal(kvx_pool_alloc(&sl[i], p, 4096), 0);
    for (int i = 0; i < 256; i++) assert_int_equal(kvx_pool_free(p, sl[(i * 37) % 256], 4096), 0);
    assert_int_equal(io_pool_free(p), 1 << 20);
    void *all;
    assert_int_equal(kvx_pool_alloc(&all, p, 1 << 20), 0); /* merged back into one range */
    assert_int_equal(kvx_pool_free(p, all, 1 << 20), 0);
    kvx_pool_destroy(p);
}

static void test_two_threads_one_pool(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    kvx_pool *p = io_pool(2 << 20);
    thr t[2] = {{p, s, KVX_IO_URING, 0}, {p, s, KVX_IO_PREAD, 0}};
    pthread_t tid[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&tid[i], NULL, thr_main, &t[i]), 0);
    for (int i = 0; i < 2; i++) pthread_join(tid[i], NULL);
    assert_int_equal(t[0].fails, 0);
    assert_int_equal(t[1].fails, 0);
    assert_int_equal(io_pool_free(p), 2 << 20);
    kvx_pool_destroy(p);
    kvx_shard_close(s);
}

/* PROMISE: IO-2 */
static void test_memlock_tiny(void **state)
{
    (void)state;
    char path[512];
    kvx_shard *s = io_fresh(path, sizeof path);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        alarm(60);
        struct rlimit rl = {65536, 65536};
        if (drop_ipc_lock() || setrlimit(RLIMIT_MEMLOCK, &rl)) _exit(77);
        kvx_pool_options po = KVX_POOL_OPTIONS_INIT;
        po.bytes = 4 << 20;
        kvx_pool *p = NULL;
        if (kvx_pool_create(&p, &po) != KVX_EMEMLOCK) _exit(1);
        if (!strstr(kvx_last_error(), "RLIMIT_MEMLOCK")) _exit(2);
        po.flags = KVX_POOL_NO_MLOCK;
        if (kvx_pool_create(&p, &po)) _exit(3);
        kvx_fetch_options fo = KVX_FETCH_OPTIONS_INIT;
        fo.io_mode = KVX_IO_URING;
        kvx_fetch *f = NULL;
        int rc = kvx_fetch_create(&f, p, &fo);
        if (rc == 0) { /* a kernel that does not charge registration */
            kvx_fetch_destroy(f);
        } else if (rc != KVX_EMEMLOCK) {
            _exit(4);
        }
        kvx_pool_destroy(p);
        po.flags = KVX_POOL_NO_MLOCK | KVX_POOL_NO_REGISTER;
        if (kvx_pool_create(&p, &po)) _exit(5);
        if (kvx_fetch_create(&f, p, &fo)) _exit(6);
        kvx_fetch_req r[IO_BASE_N];
        kvx_fetch_result res[IO_BASE_N];
        size_t n = io_every_page(r, s);
        if (kvx_fetch_submit(f, r, n) || kvx_fetch_wait(f, res, n, -1)) _exit(7);
        for (size_t i = 0; i < n; i++)
            if (res[i].status || !io_page_ok(res[i].page, 7, (uint32_t)i, res[i].bytes)) _exit(8);
        kvx_fetch_destroy(f);
        kvx_pool_destroy(p);
        /* warmup carries on unlocked */
        for (int m = 0; m < 3; m++) {
            kvx_warmup_options o = KVX_WARMUP_OPTIONS_INIT;
            o.io_mode = m;
            kvx_warmup_report rep;
            if (kvx_warmup_run(&rep, &s, 1, &o)) _exit(9);
            if (rep.pages != IO_BASE_N) _exit(10);
            kvx_warmup_report_free(&rep);
        }
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77) {
        kvx_shard_close(s);
        skip();
    }
    if (WEXITSTATUS(st)) fail_msg("memlock child step %d failed", WEXITSTATUS(st));
    kvx_shard_close(s);
}

int main(int argc, char **argv)
{
    if (argc > 1) cmocka_set_test_filter(argv[1]); /* one test by name (a glob) */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_free),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_numa),
        cmocka_unit_test(test_memlock_error),
        cmocka_unit_test(test_mode_names),
        cmocka_unit_test_setup(test_pool_exhausted, os_reset),
        cmocka_unit_test_setup(test_pool_free_not_a_slot, os_reset),
        cmocka_unit_test_setup(test_two_threads_one_pool, os_reset),
        cmocka_unit_test_setup(test_memlock_tiny, os_reset),
    };
    return cmocka_run_group_tests_name("io/pool", tests, io_base_setup, io_base_teardown);
}
