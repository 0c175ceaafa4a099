/*
 * url.c - the tier's configuration as text: redis:// URLs (a seed list
 * with optional ACL credentials) and the DIR/TIER file.
 *
 * Rule: parsing is strict and bounded (fixed-size fields, every overflow a
 * KVX_EINVALID or KVX_EFORMAT naming the field): the TIER file is input
 * like any other (DESIGN.md rule 5).
 */
#include "tier.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int copy_field(char *dst, size_t cap, const char *src, size_t n)
{
    if (n >= cap) return -1;
    memcpy(dst, src, n);
    dst[n] = '\0';
    return 0;
}

/* n decimal digits and nothing else (no sign, space or "0x"), at most
 * max: 0; else -1 (strtol and strtoull take " +7" and wrap "-1"). */
static int parse_dec(const char *s, size_t n, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (!n) return -1;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (max - d) / 10) return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

int kvx_tier_url_parse(kvx_tier_url *out, const char *url)
{
    memset(out, 0, sizeof *out);
    if (!url) return kvx_fail(KVX_EINVALID, "tier: no URL");
    const char *p = url;
    if (strncmp(p, "redis://", 8)) {
        /* its scheme only: the rest may hold a password (tests/tier/url.c
         * test_url_error_hides_password) */
        size_t n = strspn(url, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+.-");
        if (n > 16 || strncmp(url + n, "://", 3)) n = 0;
        return kvx_fail(KVX_EINVALID, "tier: URL of scheme \"%.*s\": not redis:// (rediss:// and TLS: not with "
                        "hiredis 0.14)", (int)n, url);
    }
    p += 8;
    /* the last '@' (as Python's urlsplit): a password may hold one, a host
     * never; at the first, "redis://u:p@ss@h" was host "ss@h", shown with
     * that part of the password (tests/tier/url.c test_url_password_with_at) */
    const char *at = strrchr(p, '@');
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        const char *uend = colon ? colon : at;
        if (copy_field(out->user, sizeof out->user, p, (size_t)(uend - p)))
            return kvx_fail(KVX_EINVALID, "tier: URL user name too long");
        if (colon && copy_field(out->pass, sizeof out->pass, colon + 1, (size_t)(at - colon - 1)))
            return kvx_fail(KVX_EINVALID, "tier: URL password too long");
        if (!colon && out->user[0]) {
            /* redis://secret@host: a password alone (the default user) */
            memcpy(out->pass, out->user, sizeof out->pass < sizeof out->user ? sizeof out->pass : sizeof out->user);
            out->user[0] = '\0';
        }
        p = at + 1;
    }
    while (*p) {
        if (out->n == KVX_TIER_MAX_SEEDS) return kvx_fail(KVX_EINVALID, "tier: more than %d hosts in the URL", KVX_TIER_MAX_SEEDS);
        size_t len = strcspn(p, ",/");
        const char *colon = NULL;
        for (size_t i = 0; i < len; i++)
            if (p[i] == ':') colon = p + i;
        size_t hl = colon ? (size_t)(colon - p) : len;
        if (!hl) return kvx_fail(KVX_EINVALID, "tier: an empty host in the URL");
        for (size_t i = 0; i < hl; i++)
            if ((unsigned char)p[i] <= ' ' || p[i] == 0x7f)
                return kvx_fail(KVX_EINVALID, "tier: a host name in the URL has a space or control character "
                                "(byte 0x%02x)", (unsigned char)p[i]);
        if (copy_field(out->host[out->n], sizeof out->host[0], p, hl))
            return kvx_fail(KVX_EINVALID, "tier: a host name too long");
        int port = 6379;
        if (colon) {
            uint64_t v = 0;
            if (parse_dec(colon + 1, (size_t)(p + len - colon - 1), 65535, &v) || v < 1)
                return kvx_fail(KVX_EINVALID, "tier: bad port in \"%.*s\" (1..65535, digits only)", (int)len, p);
            port = (int)v;
        }
        out->port[out->n++] = port;
        p += len;
        if (*p == ',') {
            p++;
            continue;
        }
        if (*p == '/') {
            /* a database number: only /0 (a cluster has no others) */
            if (strcmp(p, "/") && strcmp(p, "/0"))
                return kvx_fail(KVX_EINVALID, "tier: database \"%s\": only 0 (Redis Cluster has no other)", p + 1);
            break;
        }
    }
    if (!out->n) return kvx_fail(KVX_EINVALID, "tier: no host in the URL");
    return 0;
}

void kvx_tier_url_redact(char *out, size_t cap, const char *url)
{
    const char *at = url ? strrchr(url, '@') : NULL;
    const char *start = url && !strncmp(url, "redis://", 8) ? url + 8 : url;
    if (!at || !start || at < start) {
        snprintf(out, cap, "%s", url ? url : "");
        return;
    }
    const char *colon = memchr(start, ':', (size_t)(at - start));
    if (!colon) snprintf(out, cap, "redis://***%s", at);
    else snprintf(out, cap, "redis://%.*s:***%s", (int)(colon - start), start, at);
}

int kvx_tier_tenant_check(const char *name)
{
    size_t n = name ? strlen(name) : 0;
    if (!n || n >= KVX_TIER_TENANT_MAX)
        return kvx_fail(KVX_EINVALID, "tier: tenant name must have 1..%d characters", KVX_TIER_TENANT_MAX - 1);
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
              c == '-'))
            return kvx_fail(KVX_EINVALID, "tier: tenant name \"%s\": only letters, digits, '.', '_' and '-'", name);
    }
    return 0;
}

size_t kvx_tier_conf_format(char *buf, size_t cap, const kvx_tier_conf *c)
{
    int n = snprintf(buf, cap, "kvx-tier 1\nurl %s\ntenant %s\nttl_ms %llu\n", c->url, c->tenant[0] ? c->tenant : "-",
                     (unsigned long long)c->ttl_ms);
    return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

int kvx_tier_conf_parse(kvx_tier_conf *out, const char *text)
{
    memset(out, 0, sizeof *out);
    int line = 0, seen = 0;
    const char *p = text;
    while (*p) {
        line++;
        size_t len = strcspn(p, "\n");
        const char *sp = memchr(p, ' ', len);
        if (!sp) return kvx_fail(KVX_EFORMAT, "TIER: line %d has no value", line);
        size_t kl = (size_t)(sp - p), vl = len - kl - 1;
        const char *v = sp + 1;
        if (line == 1) {
            if (kl != 8 || memcmp(p, "kvx-tier", 8) || vl != 1 || *v != '1')
                return kvx_fail(KVX_EFORMAT, "TIER: line 1 is not \"kvx-tier 1\"");
        } else if (kl == 3 && !memcmp(p, "url", 3)) {
            if (copy_field(out->url, sizeof out->url, v, vl)) return kvx_fail(KVX_EFORMAT, "TIER: url too long");
            seen |= 1;
        } else if (kl == 6 && !memcmp(p, "tenant", 6)) {
            if (copy_field(out->tenant, sizeof out->tenant, v, vl))
                return kvx_fail(KVX_EFORMAT, "TIER: tenant too long");
            if (!strcmp(out->tenant, "-")) out->tenant[0] = '\0';
            else if (kvx_tier_tenant_check(out->tenant)) return kvx_fail(KVX_EFORMAT, "TIER: bad tenant name");
        } else if (kl == 6 && !memcmp(p, "ttl_ms", 6)) {
            uint64_t ms = 0;
            if (parse_dec(v, vl, UINT64_MAX, &ms))
                return kvx_fail(KVX_EFORMAT, "TIER: bad ttl_ms \"%.*s\" (digits only, at most 2^64-1)",
                                (int)(vl > 24 ? 24 : vl), v);
            out->ttl_ms = ms;
        } /* unknown keys: a later version's, ignored */
        p += len;
        if (*p == '\n') p++;
    }
    if (!line) return kvx_fail(KVX_EFORMAT, "TIER: empty");
    if (!(seen & 1)) return kvx_fail(KVX_EFORMAT, "TIER: no url line");
    kvx_tier_url u;
    if (kvx_tier_url_parse(&u, out->url)) return kvx_fail_prefix(KVX_EFORMAT, "TIER: url");
    return 0;
}
