/*
 * reply.c - hiredis reply objects built within a budget (docs/TIER.md
 * "Limits").
 *
 * hiredis's own builders allocate what a reply declares: an array header
 * "*2147483647" is a 16 GiB calloc before one element arrives, each
 * element costs a 48-byte object and a slot (about 20 to 35 times its
 * bytes on the wire), and freeing the array walks every declared slot,
 * seconds of CPU after the call's deadline with the tier's lock held. The
 * wire cut (io_read's max_reply_bytes) bounded the bytes read, not what
 * they cost in memory and time. These builders make the same redisReply
 * objects (freeReplyObject frees them) but charge each allocation against
 * a budget before making it (io_read: twice the wire cap); one that would
 * pass it is refused (NULL: hiredis reports out of memory, the reply is
 * dropped, the key misses). A GET's value costs its length + 49 bytes, a
 * CLUSTER SLOTS map of 16384 ranges with two replicas each about 16 MiB:
 * both fit the smallest budget (32 MiB).
 */
#include "tier.h"

#include <hiredis/hiredis.h>
#include <stdlib.h>
#include <string.h>

static int charge(const redisReadTask *task, uint64_t bytes)
{
    kvx_tier_reply_budget *b = task->privdata;
    if (!b) return 0;
    if (b->used > b->cap || bytes > b->cap - b->used) {
        b->over = 1;
        return -1;
    }
    b->used += bytes;
    return 0;
}

/* Links r into its parent array (hiredis's builders do it too). */
static void *linked(const redisReadTask *task, redisReply *r)
{
    if (task->parent) {
        redisReply *p = task->parent->obj;
        p->element[task->idx] = r;
    }
    return r;
}

static redisReply *object(const redisReadTask *task, int type, uint64_t extra)
{
    if (charge(task, sizeof(redisReply) + extra)) return NULL;
    redisReply *r = calloc(1, sizeof *r);
    if (r) r->type = type;
    return r;
}

static void *make_string(const redisReadTask *task, char *str, size_t len)
{
    redisReply *r = object(task, task->type, (uint64_t)len + 1);
    char *buf = r ? malloc(len + 1) : NULL;
    if (!buf) {
        free(r);
        return NULL;
    }
    memcpy(buf, str, len);
    buf[len] = '\0';
    r->str = buf;
    r->len = len;
    return linked(task, r);
}

static void *make_array(const redisReadTask *task, int elements)
{
    size_t n = elements > 0 ? (size_t)elements : 0;
    redisReply *r = object(task, REDIS_REPLY_ARRAY, (uint64_t)n * sizeof(redisReply *));
    if (!r) return NULL;
    if (n && !(r->element = calloc(n, sizeof *r->element))) {
        free(r);
        return NULL;
    }
    r->elements = n;
    return linked(task, r);
}

static void *make_integer(const redisReadTask *task, long long value)
{
    redisReply *r = object(task, REDIS_REPLY_INTEGER, 0);
    if (!r) return NULL;
    r->integer = value;
    return linked(task, r);
}

static void *make_nil(const redisReadTask *task)
{
    redisReply *r = object(task, REDIS_REPLY_NIL, 0);
    return r ? linked(task, r) : NULL;
}

static redisReplyObjectFunctions budgeted = {make_string, make_array, make_integer, make_nil, freeReplyObject};

void kvx_tier_reply_budget_attach(redisContext *c, kvx_tier_reply_budget *b)
{
    c->reader->fn = &budgeted;
    /* not redisReaderSetPrivdata: its (int) cast of a pointer warns (clang) */
    c->reader->privdata = b;
}
