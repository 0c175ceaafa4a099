/*
 * store_apply.c - recovery and reindex: a plan (store_plan.c) carried out
 * under the writer lock (docs/STORE.md "Recovery at open").
 *
 * Rule: the order makes the apply idempotent. Files leave shards/ first
 * (quarantined, or deleted when never acknowledged), durably; only then
 * do staging/'s names go, a commit's mark last and only once every file
 * of its commit is gone (the mark is the only evidence that they were
 * never acknowledged); then the catalog is written in one transaction;
 * then quarantine/'s retention. A crash anywhere leaves the evidence the
 * next plan needs to do the rest, and a step that fails stays for the
 * next recovery (its mark with it). Readers run none of this (rule 8).
 */
#include "store_plan.h"
#include "common/os.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Adds shard f (every entry with a hash) to e under record x. */
static int st_edit_add_file(kvx_cat_edit *e, const st_sealed *x, const kvx_shard *sh)
{
    int rc = kvx_st_register(e, x);
    const kvx_shard_info *in = kvx_shard_get_info(sh);
    for (uint32_t i = 0; !rc && i < in->num_blocks; i++) {
        kvx_entry en;
        if (kvx_shard_entry(&en, sh, i) || !en.hash) continue;
        rc = kvx_cat_edit_add_block(e, en.coordinate, en.hash, x->gen);
    }
    return rc;
}

/* The rebuild's one edit: the catalog emptied (nothing of it is read),
 * every kept file registered with its blocks (a keyed store's: its live
 * set), the counters (a writer's recovery keeps the sound catalog's and
 * counts the shards it named that the plan does not keep), next_gen,
 * next_seq. */
static int st_write_catalog(kvx_store *s, const kvx_st_plan *p, const kvx_cat_stats *carry)
{
    kvx_cat_edit e;
    kvx_cat_edit_init(&e);
    kvx_cat_edit_reset(&e);
    int rc = 0;
    for (uint32_t b = 0; b < ST_SLOTS && !rc; b++) {
        const st_found *f = &p->f[b];
        if (!f->sh) continue;
        const kvx_shard_info *in = kvx_shard_get_info(f->sh);
        st_sealed x = {(uint8_t)b, f->gen, in->flags, in->num_blocks, f->bytes, kvx_st_now_ns(),
                       kvx_st_count_unverified(f->sh), "", 0, NULL, f->ino};
        rc = s->keyed ? kvx_st_register(&e, &x) : st_edit_add_file(&e, &x, f->sh);
    }
    for (size_t i = 0; !rc && i < p->npicks; i++)
        rc = kvx_cat_edit_add_block(&e, KVX_COORD(p->picks[i].b, p->picks[i].idx, 0), p->picks[i].hash,
                                    p->f[p->picks[i].b].gen);
    if (rc) {
        kvx_cat_edit_free(&e);
        return rc;
    }
    kvx_cat_stats delta = {0};
    if (carry) {
        delta = *carry;
        for (uint32_t b = 0; b < ST_SLOTS; b++) {
            if (!s->reg->live[b]) continue;
            int kept = 0;
            for (uint32_t c = 0; c < ST_SLOTS && !kept; c++) kept = p->f[c].sh && p->f[c].gen == s->reg->rec[b].gen;
            delta.dropped_shards += !kept;
        }
    }
    kvx_cat_edit_stats(&e, carry ? &delta : NULL, 0);
    kvx_cat_edit_next_gen(&e, s->next_gen);
    kvx_cat_edit_next_seq(&e, s->next_seq);
    rc = kvx_cat_apply(s->cat, &e); /* builder failures come back here */
    kvx_cat_edit_free(&e);
    return rc;
}

/* Did every shards/ step of commit seq succeed (its mark may go)? */
static int st_commit_done(const kvx_st_plan *p, uint64_t seq)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->steps[i].where == ST_IN_SHARDS && p->steps[i].seq == seq && p->steps[i].failed) return 0;
    return 1;
}

static int st_victim_done(const kvx_st_plan *p, uint64_t gen)
{
    for (size_t i = 0; i < p->n; i++)
        if (p->steps[i].where == ST_IN_SHARDS && p->steps[i].act != ST_ACT_KEEP && p->steps[i].gen == gen &&
            p->steps[i].failed)
            return 0;
    return 1;
}

int kvx_st_plan_apply(kvx_store *s, kvx_st_plan *p)
{
    int first_err = 0;
    char errmsg[600] = "";
#define ST_NOTE_FAIL(x, rc)                                                                                  \
    do {                                                                                                     \
        (x)->failed = 1;                                                                                     \
        if (!first_err) {                                                                                    \
            first_err = (rc);                                                                                \
            snprintf(errmsg, sizeof errmsg, "%s", kvx_last_error());                                         \
        }                                                                                                    \
    } while (0)
    /* 1. out of shards/, durably: quarantined (kvx_st_quarantine fsyncs
     * both directories), then deleted */
    for (size_t i = 0; i < p->n; i++) {
        st_step *x = &p->steps[i];
        if (x->where != ST_IN_SHARDS || x->act != ST_ACT_QUARANTINE || x->deferred) continue;
        char why[600];
        snprintf(why, sizeof why, "recovery: %s", x->why);
        int rc = kvx_st_quarantine(s, x->name, why);
        if (rc) ST_NOTE_FAIL(x, rc);
    }
    int unlinked = 0;
    for (size_t i = 0; i < p->n; i++) {
        st_step *x = &p->steps[i];
        if (x->where != ST_IN_SHARDS || x->act != ST_ACT_DELETE) continue;
        if (kvx_os.unlinkat(s->shardsfd, x->name, 0) == 0 || errno == ENOENT) {
            unlinked++;
            continue;
        }
        int e = errno;
        kvx_fail(-e, "store %s: recovery: unlink shards/%s: %s", s->dir, x->name, strerror(e));
        ST_NOTE_FAIL(x, -e);
    }
    if (unlinked) {
        int rc = kvx_os_fsync_dir(s->shards_path);
        if (rc) { /* the deletes may not last: every mark stays, and says it again next time */
            kvx_fail(rc, "store %s: recovery: fsync shards/: %s", s->dir, strerror(-rc));
            for (size_t i = 0; i < p->n; i++)
                if (p->steps[i].where == ST_IN_SHARDS && p->steps[i].act == ST_ACT_DELETE) ST_NOTE_FAIL(&p->steps[i], rc);
        }
    }
    /* 2. staging/: temporaries, spent drop marks, then commit marks whose
     * files are all gone */
    for (int kind = ST_K_TEMP; kind <= ST_K_COMMIT_MARK; kind++) {
        int removed = 0;
        for (size_t i = 0; i < p->n; i++) {
            st_step *x = &p->steps[i];
            if (x->where != ST_IN_STAGING || x->act != ST_ACT_DELETE || (int)x->kind != kind) continue;
            if ((kind == ST_K_COMMIT_MARK && !st_commit_done(p, x->seq)) ||
                (kind == ST_K_DROP_MARK && !st_victim_done(p, x->gen))) {
                x->failed = 1; /* stays: the evidence for the next recovery */
                continue;
            }
            if (kvx_os.unlinkat(s->stagingfd, x->name, 0) == 0 || errno == ENOENT) {
                removed++;
                continue;
            }
            int e = errno;
            kvx_fail(-e, "store %s: recovery: unlink staging/%s: %s", s->dir, x->name, strerror(e));
            ST_NOTE_FAIL(x, -e);
        }
        if (removed && kind == ST_K_COMMIT_MARK) kvx_os_fsync_dir(s->staging_path); /* else: said again next time */
    }
    /* 3. the catalog, one transaction */
    int rc = 0;
    if (p->rebuild) {
        kvx_cat_stats old, *carry = NULL;
        kvx_cat_snap *snap;
        if (s->index_live && !(p->mode & ST_PLAN_REBUILD) && kvx_cat_snap_begin(s->cat, &snap) == 0) {
            if (kvx_cat_stats_get(snap, &old) == 0) carry = &old;
            kvx_cat_snap_end(snap);
        }
        kvx_clear_error();
        if (p->next_seq > s->next_seq) s->next_seq = p->next_seq; /* above every number in the files */
        for (int b = 0; b < ST_SLOTS; b++) kvx_st_cache_drop(s, (uint32_t)b);
        rc = st_write_catalog(s, p, carry);
        if (!rc) rc = kvx_st_registry_load(s);
    }
    /* 3b. the deletes a damaged keyed file may hold, made durable before
     * it goes (a crash before: it is still in shards/, the next plan does
     * this again); then it goes. If they cannot be written now, it stays
     * in shards/ (not indexed) for the next recovery. */
    int kept_deletes = 1;
    if (!rc && p->ntomb_keys) {
        int t = kvx_st_tombstone_keys(s, p->tomb_keys, p->ntomb_keys);
        if (t) {
            kept_deletes = 0;
            for (size_t i = 0; i < p->n; i++)
                if (p->steps[i].deferred) ST_NOTE_FAIL(&p->steps[i], t);
        }
    }
    for (size_t i = 0; !rc && kept_deletes && i < p->n; i++) {
        st_step *x = &p->steps[i];
        if (!x->deferred) continue;
        char why[600];
        snprintf(why, sizeof why, "recovery: %s", x->why);
        int q = kvx_st_quarantine(s, x->name, why);
        if (q) ST_NOTE_FAIL(x, q);
    }
    /* 4. quarantine/'s retention */
    for (size_t i = 0; !rc && i < p->n; i++) {
        st_step *x = &p->steps[i];
        if (x->where != ST_IN_QUARANTINE || x->act != ST_ACT_DELETE) continue;
        int e = kvx_st_quarantine_expire(s, x->name);
        if (e) {
            kvx_fail(e, "store %s: recovery: remove quarantine/%s: %s", s->dir, x->name, strerror(-e));
            ST_NOTE_FAIL(x, e);
        }
    }
#undef ST_NOTE_FAIL
    kvx_st_plan_report(p, &s->recovery);
    s->recovery.quarantined += s->act_quarantined; /* settled before the plan (store_active.c) */
    s->recovery.deleted_unacked += s->act_deleted;
    if (rc) return rc;
    /* a failed step changes nothing acknowledged: it stays for the next
     * recovery, and the caller hears of it */
    if (first_err)
        return kvx_fail(first_err, "store %s: recovery could not do %" PRIu64 " step(s) (they stay for the next "
                                   "recovery; nothing acknowledged was changed): %s",
                        s->dir, s->recovery.failed, errmsg);
    return 0;
}

/* What a recovery or reindex did, as one line for kvx_last_error() (a
 * note: the call succeeded), or "" when there is nothing to say. */
static void st_note(kvx_store *s)
{
    const kvx_recovery_report *r = &s->recovery;
    if (!r->quarantined && !r->deleted_unacked && !r->left_alone && !r->expired && !r->deleted_dropped) {
        kvx_clear_error();
        return;
    }
    kvx_fail(0, "store %s: recovery moved %" PRIu64 " shard file(s) to quarantine/ (their reasons in "
             "quarantine/<name>.why), deleted %" PRIu64 " file(s) of commits that never answered and %" PRIu64
             " sound victim(s) of committed drops, left %" PRIu64 " entr%s of shards/ or staging/ alone (not "
             "kvx's), and quarantine/'s retention removed %" PRIu64 " old file(s)",
             s->dir, r->quarantined, r->deleted_unacked, r->deleted_dropped, r->left_alone,
             r->left_alone == 1 ? "y" : "ies", r->expired);
}

static int st_plan_and_apply(kvx_store *s, unsigned mode)
{
    kvx_st_plan *p = NULL;
    int rc = kvx_st_plan_make(s, mode, &p);
    if (!rc) rc = kvx_st_plan_apply(s, p);
    kvx_st_plan_free(p);
    return rc;
}

int kvx_st_reindex_locked(kvx_store *s)
{
    kvx_st_discard_pending(&s->own);
    /* the plan reads sealed files: the active shard is sealed first (no
     * other batch owns it: kvx_store_reindex refused a busy one) */
    int rc = kvx_st_active_seal(s);
    /* and an active file a failed seal left (the plan leaves active names
     * alone: its blocks would fall out of the catalog, its byte be reused) */
    if (!rc) rc = kvx_st_active_recover(s);
    if (rc) return rc;
    rc = st_plan_and_apply(s, ST_PLAN_REBUILD);
    /* the rebuilt catalog names every entry of the files: the free log's
     * pages leave it again */
    if (!rc) rc = kvx_st_holes_load(s, 0);
    if (!rc) st_note(s);
    return rc;
}

/* How many batches besides the built-in one hold unflushed blocks, and
 * how many blocks. Under wmu. */
static size_t st_other_busy(kvx_store *s, size_t *blocks)
{
    size_t n = 0;
    *blocks = 0;
    for (const kvx_store_batch *x = s->batches; x; x = x->next)
        if (x != &s->own && st_batch_busy(x)) {
            n++;
            *blocks += x->npend;
        }
    return n;
}

KVX_API int kvx_store_reindex(kvx_store *s)
{
    int rc = kvx_st_writer_check(s, "kvx_store_reindex");
    if (rc) return rc;
    pthread_mutex_lock(&s->wmu);
    /* another batch's sealed files wait in staging/, unpublished, and its
     * open writers hold shard bytes and generations: refused until that
     * batch flushes or is destroyed. (Batches holding only pins are fine:
     * reindex keeps every kept shard's generation, so their pins still
     * name the same files.) */
    size_t nblocks, nbusy = st_other_busy(s, &nblocks);
    if (nbusy) {
        pthread_mutex_unlock(&s->wmu);
        return kvx_fail(KVX_EBUSY,
                        "kvx_store_reindex: %zu other batch(es) hold %zu unflushed block(s) in unpublished shard "
                        "files: flush or destroy them (kvx_store_batch_flush / kvx_store_batch_destroy) first",
                        nbusy, nblocks);
    }
    /* puts not yet flushed are flushed first: a reindex must not drop what
     * the next flush would acknowledge. That next kvx_store_flush, not this
     * reindex, acknowledges them, so their pins (the shards of blocks they
     * found held, and the shards this flush publishes) must last until it
     * returns: saved here and put back after the reindex, which gives
     * every shard a fresh creation time (else the next flush's eviction
     * took a block a put found held: tests/system/powercut.c seed
     * 651158135). */
    kvx_store_batch *x = &s->own;
    for (size_t i = 0; i < x->nsealed; i++) kvx_st_pin(x, x->sealed[i].byte, x->sealed[i].gen);
    for (int k = 0; k < 2; k++)
        if (x->cur[k].w) kvx_st_pin(x, x->cur[k].byte, x->cur[k].gen);
    uint8_t pinned[ST_SLOTS];
    uint64_t pin_gen[ST_SLOTS];
    memcpy(pinned, x->pinned, sizeof pinned);
    memcpy(pin_gen, x->pin_gen, sizeof pin_gen);
    if (st_batch_busy(x)) rc = kvx_st_flush_locked(s, x);
    if (!rc) {
        rc = kvx_st_reindex_locked(s);
        for (int b = 0; b < ST_SLOTS; b++) {
            if (!pinned[b] || x->pinned[b]) continue; /* a pin set since (a shard a flush published) stays */
            x->pinned[b] = 1;
            x->pin_gen[b] = pin_gen[b];
        }
    }
    pthread_mutex_unlock(&s->wmu);
    return rc;
}

/* A store of STORE version 1 or 2 (the previous release) at a writer's
 * open: migrated when its catalog is sound (it loaded, names next_gen and
 * names exactly the files of shards/ once a cut migration's copies are set
 * aside), else KVX_EVERSION naming the version and the fix. */
static int st_migrate_or_refuse(kvx_store *s)
{
    uint64_t *marks = NULL;
    size_t nmarks = 0;
    int rc = kvx_st_commit_marks(s, &marks, &nmarks), current = 0;
    free(marks);
    if (rc) return rc;
    if (s->index_live && nmarks == 0) {
        if ((rc = kvx_st_migrate_leftovers(s))) return rc;
        current = kvx_st_catalog_current(s, 0, NULL, 0, NULL);
        if (current < 0) return current;
    }
    if (!current) return kvx_st_refuse_unmigrated(s);
    return kvx_st_migrate(s);
}

int kvx_st_refuse_unmigrated(const kvx_store *s)
{
    return kvx_fail(KVX_EVERSION,
                    "store %s: STORE version %u (kvx 0.x, before sequence numbers) and its index/ is missing, "
                    "damaged, set aside by reindex or does not name the files in shards/: only its catalog knows "
                    "its deletes, so it cannot be migrated: open it once as the writer with its index/ intact, or "
                    "recreate it: it is a cache",
                    s->dir, s->version);
}

int kvx_st_recover(kvx_store *s)
{
    int rc = kvx_st_registry_load(s);
    if (!rc) rc = kvx_st_registry_refuse_predigest(s);
    /* active shards a writer left (a crash, a failed seal): sealed in
     * place, so the plan reads every shard as a sealed file */
    if (!rc) rc = kvx_st_active_recover(s);
    /* a store of the previous release: migrated from its sound catalog,
     * the only record of its keyed deletes (store_migrate.c), or refused */
    if (!rc && s->version < ST_STORE_SEQ_VERSION) {
        /* its last writer's leftovers first (a temporary, a drop cut after
         * its commit), so that its sound catalog names exactly its files */
        rc = st_plan_and_apply(s, ST_PLAN_STAGING | ST_PLAN_STAGING_ONLY);
        if (!rc) rc = st_migrate_or_refuse(s);
    }
    if (!rc) rc = st_plan_and_apply(s, ST_PLAN_STAGING);
    /* a writer that frees pages in place: STORE version 5 before any page is
     * freed, so a release before holes refuses the store instead of taking
     * a freed page for damage */
    if (!rc && (s->flags & KVX_STORE_HOLES) && !s->keyed && s->version < ST_STORE_HOLES_VERSION) {
        uint32_t old = s->version;
        s->version = ST_STORE_HOLES_VERSION;
        if ((rc = kvx_st_write_store_file(s))) s->version = old;
    }
    /* the free log's pages: out of the catalog, their extents punched */
    if (!rc) rc = kvx_st_holes_load(s, 1);
    if (!rc && s->holes) rc = kvx_st_punch_pending(s);
    /* version 3 becomes 4 by its STORE file alone (nothing to rewrite):
     * from here a release before active shards refuses it */
    if (!rc && s->version < ST_STORE_VERSION) rc = kvx_st_write_store_file(s);
    if (rc) return rc;
    char note[1200]; /* what recovery set aside, for the caller to show */
    st_note(s);
    snprintf(note, sizeof note, "%s", kvx_last_error());
    /* the last writer's mark (store_lag.c): the catalog is whole now
     * (rebuilt, or whole in the page cache); synced, then the mark goes,
     * before anything else commits (the eviction below) */
    if (s->lag_found && (rc = kvx_st_lag_stop(s))) return rc;
    /* a crash between a flush's publication and its eviction leaves the
     * store one shard over: evict now, so repeated crashes cannot add up.
     * Live bytes only: quarantine/'s share is made room for by the next
     * flush or gc, whose evictions a caller hears of (kvx_store_evicted);
     * kvx_store_reindex_dir's handle closes before anyone could ask
     * (found by tests/system/model.c seed 340034), so it does not evict at
     * all: the next writer's open does, and reports it
     * (tests/system/model_blocks.c seed 1021452746, sequence 52) */
    if (!s->no_open_evict && kvx_st_evict(s, 0) != 0) kvx_clear_error();
    if (note[0]) kvx_fail(0, "%s", note);
    else kvx_clear_error();
    return 0;
}

KVX_API int kvx_store_recovery(const kvx_store *s, kvx_recovery_report *out)
{
    if (!s || !out) return kvx_fail(KVX_EINVALID, "kvx_store_recovery: NULL argument");
    *out = s->recovery;
    return 0;
}

int kvx_st_reader_check(kvx_store *s)
{
    /* a keyed store's reader serves what the catalog names only when no
     * file in shards/ is unknown to it: an index/ from elsewhere (an old
     * copy put back) would name a page that a tombstone, or a newer copy,
     * in a file it does not know has replaced. A writer publishing right
     * now is a passing mismatch: asked again. (A block store has neither:
     * every copy of a block is the block, checked by its digest.) */
    if (!s->keyed) return 0;
    uint64_t *marks = NULL;
    size_t nmarks = 0;
    int rc = 0;
    for (int attempt = 0; attempt < 200; attempt++) {
        if (attempt) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
            if ((rc = kvx_st_registry_load(s))) break;
        }
        free(marks);
        marks = NULL;
        if ((rc = kvx_st_commit_marks(s, &marks, &nmarks))) break;
        rc = kvx_st_catalog_current(s, 1, marks, nmarks, NULL);
        if (rc < 0) break;
        if (rc == 1) {
            free(marks);
            return 0;
        }
        rc = 0;
    }
    free(marks);
    if (rc) return rc;
    return kvx_fail(KVX_ESTALE,
                    "store %s: index/ does not name the files in shards/ (an index/ from elsewhere or an older copy, "
                    "files added, removed or swapped, or a writer cut before it updated the index): a reader never "
                    "repairs; open the store once as the writer (its recovery rebuilds the index from the files) or "
                    "run 'kvx store reindex %s'",
                    s->dir, s->dir);
}
