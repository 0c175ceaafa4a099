/*
 * redis.h - real redis-server processes for the shared tier's
 * tests: started on free loopback ports in temporary directories, bounded
 * in time (every wait has a deadline), stopped at the end (and at exit,
 * whatever happened). A single server, or a Redis Cluster made with
 * `redis-cli --cluster create` (masters with or without a replica each,
 * node timeout 2000 ms).
 *
 * Where redis-server or redis-cli is missing the test exits 77 (skipped)
 * naming what to install.
 */
#ifndef KVX_TEST_REDIS_FIXTURE_H
#define KVX_TEST_REDIS_FIXTURE_H

#include <arpa/inet.h>
#include <errno.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define RF_MAX 16

typedef struct rf_node {
    int port;
    pid_t pid;
    char dir[256];
    int cluster;
} rf_node;

static rf_node rf_nodes[RF_MAX];
static int rf_n;

static double rf_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void rf_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

static int rf_have(const char *prog)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", prog);
    return system(cmd) == 0;
}

/* Exits 77 unless redis-server and redis-cli are installed. */
static void rf_require(void)
{
    if (!rf_have("redis-server") || !rf_have("redis-cli")) {
        fprintf(stderr, "SKIP: redis-server / redis-cli not installed (apt-get install redis-server redis-tools; "
                        "scripts/install-deps.sh does)\n");
        exit(77);
    }
}

static int rf_port_free(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
    close(fd);
    return ok;
}

/* A free port (and port + 10000, the cluster bus, when bus). */
static int rf_free_port(int bus)
{
    static unsigned seed;
    if (!seed) seed = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
    for (int i = 0; i < 1000; i++) {
        seed = seed * 1103515245u + 12345u;
        int p = 20000 + (int)((seed >> 8) % 30000);
        int taken = 0;
        for (int k = 0; k < rf_n; k++) taken |= rf_nodes[k].port == p || rf_nodes[k].port + 10000 == p;
        if (!taken && rf_port_free(p) && (!bus || rf_port_free(p + 10000))) return p;
    }
    return -1;
}

static redisContext *rf_connect(int port)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c && c->err) {
        redisFree(c);
        return NULL;
    }
    if (c) redisSetTimeout(c, tv);
    return c;
}

/* A command to the server on port; the reply's string (or status, or the
 * integer printed) into out; 0, or -1 when no answer. */
static int rf_cmd(int port, char *out, size_t cap, const char *fmt, ...)
{
    redisContext *c = rf_connect(port);
    if (!c) return -1;
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    int rc = -1;
    if (r) {
        rc = 0;
        if (out && cap) {
            if (r->type == REDIS_REPLY_INTEGER) snprintf(out, cap, "%lld", r->integer);
            else if (r->str) snprintf(out, cap, "%s", r->str);
            else out[0] = '\0';
        }
        if (r->type == REDIS_REPLY_ERROR) rc = -2;
        freeReplyObject(r);
    }
    redisFree(c);
    return rc;
}

static void rf_stop_all(void)
{
    for (int i = 0; i < rf_n; i++) {
        if (rf_nodes[i].pid > 0) {
            kill(rf_nodes[i].pid, SIGCONT);
            kill(rf_nodes[i].pid, SIGKILL);
            waitpid(rf_nodes[i].pid, NULL, 0);
            rf_nodes[i].pid = 0;
        }
        if (rf_nodes[i].dir[0]) {
            char cmd[320];
            snprintf(cmd, sizeof cmd, "rm -rf '%s'", rf_nodes[i].dir);
            if (system(cmd) != 0) {}
            rf_nodes[i].dir[0] = '\0';
        }
    }
    rf_n = 0;
}

/* Starts (or restarts) node n's redis-server; waits (5 s at most) until it
 * answers PING. 0 or -1. */
static int rf_launch(rf_node *n)
{
    char port[16], logf[300];
    snprintf(port, sizeof port, "%d", n->port);
    snprintf(logf, sizeof logf, "%s/redis.log", n->dir);
    pid_t pid = fork();
    if (pid < 0) return -1;
    if (pid == 0) {
        if (n->cluster)
            execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--dir", n->dir, "--logfile", logf, "--daemonize", "no",
                   "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout",
                   "2000", "--repl-diskless-sync-delay", "0", "--cluster-replica-validity-factor", "0",
                   (char *)NULL);
        else
            execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--dir", n->dir, "--logfile", logf, "--daemonize", "no", (char *)NULL);
        _exit(127);
    }
    n->pid = pid;
    double end = rf_now() + 5;
    while (rf_now() < end) {
        char pong[16];
        if (rf_cmd(n->port, pong, sizeof pong, "PING") == 0 && !strcmp(pong, "PONG")) return 0;
        rf_sleep_ms(20);
    }
    return -1;
}

/* A new server; returns its index or -1. */
static int rf_start(int cluster)
{
    static int said;
    if (!said) {
        atexit(rf_stop_all);
        said = 1;
    }
    if (rf_n == RF_MAX) return -1;
    rf_node *n = &rf_nodes[rf_n];
    memset(n, 0, sizeof *n);
    n->cluster = cluster;
    n->port = rf_free_port(cluster);
    snprintf(n->dir, sizeof n->dir, "/tmp/kvx-redis-XXXXXX");
    if (n->port < 0 || !mkdtemp(n->dir)) return -1;
    rf_n++;
    return rf_launch(n) == 0 ? rf_n - 1 : -1;
}

static void rf_kill(int i, int sig)
{
    if (rf_nodes[i].pid <= 0) return;
    kill(rf_nodes[i].pid, sig);
    if (sig == SIGKILL || sig == SIGTERM) {
        waitpid(rf_nodes[i].pid, NULL, 0);
        rf_nodes[i].pid = 0;
    }
}

/* Every node says cluster_state:ok (10 s at most). */
static int rf_cluster_ok(int first, int n)
{
    double end = rf_now() + 10;
    while (rf_now() < end) {
        int ok = 1;
        for (int i = first; i < first + n && ok; i++) {
            if (rf_nodes[i].pid <= 0) continue;
            char info[4096];
            ok = rf_cmd(rf_nodes[i].port, info, sizeof info, "CLUSTER INFO") == 0 &&
                 strstr(info, "cluster_state:ok") != NULL;
        }
        if (ok) return 0;
        rf_sleep_ms(100);
    }
    return -1;
}

/* A cluster of `masters` masters with `replicas` replicas each; returns
 * the index of its first node or -1. */
static int rf_cluster(int masters, int replicas)
{
    int first = rf_n, total = masters * (1 + replicas);
    char cmd[2048];
    int len = snprintf(cmd, sizeof cmd, "redis-cli --cluster create");
    for (int i = 0; i < total; i++) {
        int k = rf_start(1);
        if (k < 0) return -1;
        len += snprintf(cmd + len, sizeof cmd - (size_t)len, " 127.0.0.1:%d", rf_nodes[k].port);
    }
    snprintf(cmd + len, sizeof cmd - (size_t)len, " --cluster-replicas %d --cluster-yes >/dev/null 2>&1", replicas);
    if (system(cmd) != 0) return -1;
    if (rf_cluster_ok(first, total) != 0) return -1;
    /* every replica synchronized (a replica that never was cannot fail over) */
    double end = rf_now() + 15;
    for (int i = first; i < first + total; i++) {
        char info[4096];
        while (rf_now() < end) {
            if (rf_cmd(rf_nodes[i].port, info, sizeof info, "INFO replication") == 0 &&
                (strstr(info, "role:master") || strstr(info, "master_link_status:up")))
                break;
            rf_sleep_ms(50);
        }
    }
    return rf_now() < end ? first : -1;
}

/* The node (index) that owns slot, asking node `ask`; -1 if none. */
static int rf_slot_owner(int first, int n, int slot)
{
    for (int i = first; i < first + n; i++) {
        if (rf_nodes[i].pid <= 0) continue;
        redisContext *c = rf_connect(rf_nodes[i].port);
        if (!c) continue;
        redisReply *r = redisCommand(c, "CLUSTER SLOTS");
        int owner = -1;
        for (size_t k = 0; r && r->type == REDIS_REPLY_ARRAY && k < r->elements; k++) {
            redisReply *e = r->element[k];
            if (slot >= e->element[0]->integer && slot <= e->element[1]->integer) {
                int port = (int)e->element[2]->element[1]->integer;
                for (int j = first; j < first + n; j++)
                    if (rf_nodes[j].port == port) owner = j;
            }
        }
        if (r) freeReplyObject(r);
        redisFree(c);
        return owner;
    }
    return -1;
}

#endif
