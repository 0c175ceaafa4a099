/*
 * test_pool.c - the pinned buffer pool: slot allocation (alignment, no
 * overlap, reuse, double free and bad frees refused, capacity), NUMA
 * placement checked with get_mempolicy on the memory itself, and the
 * RLIMIT_MEMLOCK error: a child process drops CAP_IPC_LOCK and lowers the
 * limit, so both mlock and io_uring buffer registration are refused the
 * way they are for an ordinary user, and the message must name the limit,
 * its value and the bytes needed.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <errno.h>
#include <linux/capability.h>
#include <numa.h>
#include <numaif.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kvx.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_free),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_numa),
        cmocka_unit_test(test_memlock_error),
        cmocka_unit_test(test_mode_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
