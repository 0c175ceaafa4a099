/*
 * errors.c - the rule it keeps: an LMDB result code never leaves index/.
 * Every MDB code (and the positive errno LMDB passes through) becomes a
 * kvx code (0, -errno, KVX_E*) with a message here; damage names
 * index/data.mdb and `kvx store reindex`. A kvx code passes through
 * unchanged, with the message it already has.
 */
#include "index.h"

#include <stdarg.h>
#include <stdio.h>

/* ---------------------------------------------------------------- errors */

static int idx_err(const kvx_index *ix, int rc, const char *what)
{
    if (rc == 0) return 0;
    if (rc < 0 && (rc < MDB_KEYEXIST || rc > MDB_LAST_ERRCODE)) return rc; /* a kvx code, with its message */
    const char *store = ix && ix->store ? ix->store : "DIR";
    const char *dir = ix && ix->path ? ix->path : "DIR/index";
    if (rc > 0) return kvx_fail(-rc, "index %s/data.mdb: %s: %s", dir, what, mdb_strerror(rc));
    switch (rc) {
    case MDB_NOTFOUND: return kvx_fail(KVX_ENOTFOUND, "index: %s: not found", what);
    case MDB_VERSION_MISMATCH: return kvx_fail(KVX_EVERSION, "index: %s: %s", what, mdb_strerror(rc));
    case MDB_MAP_FULL: return kvx_fail(KVX_ECAPACITY, "index: %s: %s", what, mdb_strerror(rc));
    case MDB_READERS_FULL: return kvx_fail(KVX_EBUSY, "index: %s: %s", what, mdb_strerror(rc));
    case MDB_TXN_FULL: /* an edit too large for one transaction: not damage */
        return kvx_fail(KVX_ECAPACITY, "index: %s: %s (one edit holds too many changes)", what, mdb_strerror(rc));
    case MDB_KEYEXIST:
    case MDB_MAP_RESIZED:
    case MDB_TLS_FULL:
    case MDB_DBS_FULL:
    case MDB_BAD_RSLOT:
    case MDB_BAD_VALSIZE:
    case MDB_BAD_DBI: return kvx_fail(KVX_ECORRUPT, "index: %s: %s", what, mdb_strerror(rc));
    default: /* MDB_CORRUPTED, MDB_PAGE_NOTFOUND, MDB_INVALID, MDB_INCOMPATIBLE,
                MDB_CURSOR_FULL, MDB_PAGE_FULL, MDB_BAD_TXN, ...: a damaged file */
        return kvx_fail(KVX_ECORRUPT, "index %s/data.mdb: %s: %s (the index is damaged): run 'kvx store reindex %s'",
                        dir, what, mdb_strerror(rc), store);
    }
}

int kvx_idx_err(int rc, const char *what) { return idx_err(NULL, rc, what); }

int kvx_idx_errp(const kvx_index *ix, int rc, const char *what) { return idx_err(ix, rc, what); }

int kvx_idx_damaged(const kvx_index *ix, const char *fmt, ...)
{
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    const char *store = ix && ix->store ? ix->store : "DIR";
    const char *dir = ix && ix->path ? ix->path : "DIR/index";
    return kvx_fail(KVX_ECORRUPT, "index %s/data.mdb: %s: run 'kvx store reindex %s'", dir, what, store);
}
