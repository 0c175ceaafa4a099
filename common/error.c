/*
 * error.c - kvx_strerror, kvx_err_name and the thread-local last-error
 * message. Names and messages come from KVX_ERROR_MAP in kvx.h.
 */
#include "internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char last_error[512];

const char *kvx_version(void) { return KVX_VERSION_STRING; }

const char *kvx_strerror(int code)
{
    switch (code) {
    case KVX_OK: return "success";
#define KVX_ERROR_MSG_(name, value, msg) case KVX_##name: return msg;
    KVX_ERROR_MAP(KVX_ERROR_MSG_)
#undef KVX_ERROR_MSG_
    default: break;
    }
    if (code < 0 && code > -4096) return strerror(-code);
    return "unknown error";
}

const char *kvx_err_name(int code)
{
    switch (code) {
    case KVX_OK: return "KVX_OK";
#define KVX_ERROR_NAME_(name, value, msg) case KVX_##name: return "KVX_" #name;
    KVX_ERROR_MAP(KVX_ERROR_NAME_)
#undef KVX_ERROR_NAME_
    default: break;
    }
    if (code < 0 && code > -4096) {
        const char *n = strerrorname_np(-code);
        if (n) return n;
    }
    return "KVX_EUNKNOWN";
}

const char *kvx_last_error(void) { return last_error; }

void kvx_clear_error(void) { last_error[0] = '\0'; }

/*
 * Both format into a local buffer first and then copy: a caller may pass
 * kvx_last_error() itself as an argument, and formatting into the buffer
 * an argument points into is undefined (overlapping vsnprintf; it printed
 * the prefix twice and lost the reason's start).
 */
int kvx_fail(int code, const char *fmt, ...)
{
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(last_error, msg, sizeof msg);
    return code;
}

int kvx_fail_prefix(int code, const char *fmt, ...)
{
    char msg[sizeof last_error];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    size_t used = n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
    /* appended by hand, cut at the end, never past it; no reason
     * recorded: the prefix alone, not "prefix: " */
    const char *parts[2] = {": ", last_error};
    for (int i = last_error[0] ? 0 : 2; i < 2; i++) {
        size_t len = strnlen(parts[i], sizeof last_error - 1), room = sizeof msg - 1 - used;
        if (len > room) len = room;
        memcpy(msg + used, parts[i], len);
        used += len;
    }
    msg[used] = '\0';
    memcpy(last_error, msg, sizeof msg);
    return code;
}
