/*
 * store_export.c - views exported as one TLKV envelope.
 *
 * Rule: every page is CRC-checked again before an export, whatever was
 * checked before, and nothing is built when one fails.
 */
#include "store.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

KVX_API int kvx_views_export(void **out_buf, size_t *out_len, kvx_store *s, const kvx_view *views, size_t n,
                             uint16_t version)
{
    if (!out_buf || !out_len || !s || (n && !views)) return kvx_fail(KVX_EINVALID, "kvx_views_export: NULL argument");
    *out_buf = NULL;
    *out_len = 0;
    int krc = kvx_st_kind_check(s, 0, "kvx_views_export"); /* a keyed page is no envelope block */
    if (krc) return krc;
    if (version != KVX_ENVELOPE_V1 && version != KVX_ENVELOPE_V2 && version != KVX_ENVELOPE_V3)
        return kvx_fail(KVX_EVERSION, "kvx_views_export: envelope version %u is not 1, 2 or 3", version);
    if (n > UINT32_MAX) return kvx_fail(KVX_EINVALID, "kvx_views_export: %zu views exceed n_blocks (u32)", n);
    const kvx_geometry *g = &s->g;
    size_t P = kvx_envelope_payload_bytes(version, g), len;
    int rc = kvx_envelope_size(&len, version, g, (uint32_t)n);
    if (rc) return rc;
    /* always re-checked before an export, whatever was checked before */
    for (size_t i = 0; i < n; i++) {
        const void *page;
        if (!views[i].shard) return kvx_fail(KVX_EINVALID, "kvx_views_export: view %zu holds no block", i);
        const kvx_geometry *vg = &kvx_shard_get_info(views[i].shard)->geometry;
        if (vg->num_layers != g->num_layers || vg->kv_heads != g->kv_heads || vg->head_dim != g->head_dim ||
            vg->block_tokens != g->block_tokens || vg->quant != g->quant ||
            views[i].page_bytes != kvx_page_bytes(g, views[i].token_count))
            return kvx_fail(KVX_ESHAPE, "kvx_views_export: view %zu comes from a shard of another geometry", i);
        if (vg->model_signature != g->model_signature)
            return kvx_fail(KVX_EMODEL, "kvx_views_export: view %zu holds KV of model %016llx, this store's is %016llx", i,
                            (unsigned long long)vg->model_signature, (unsigned long long)g->model_signature);
        if ((rc = kvx_shard_page(&page, views[i].shard, views[i].entry, 1)))
            return kvx_fail(rc, "export: block %016llx (coordinate 0x%08x): %s", (unsigned long long)views[i].hash,
                            views[i].coordinate, rc == KVX_EPAGECRC ? "page CRC mismatch" : kvx_strerror(rc));
        /* what is exported is what was checked: a view whose page, hash or
         * token count is not its (shard, entry)'s would export other bytes
         * under a label the check never saw (tests/engine/export.c
         * test_export_view_must_match_entry) */
        kvx_entry e;
        if ((rc = kvx_shard_entry(&e, views[i].shard, views[i].entry))) return rc;
        const char *bad = views[i].page != page                ? "page"
                          : views[i].hash != e.hash             ? "hash"
                          : views[i].token_count != e.token_count ? "token_count"
                                                                 : NULL;
        if (bad)
            return kvx_fail(KVX_EINVALID, "kvx_views_export: views[%zu].%s is not that of its shard's entry %u", i,
                            bad, views[i].entry);
    }
    uint8_t *payloads = malloc(n * P + 1);
    kvx_envelope_block_in *bin = calloc(n + 1, sizeof *bin);
    void *buf = malloc(len);
    size_t ns = (size_t)kvx_scale_count(g);
    size_t elem_bytes = P - (version == KVX_ENVELOPE_V2 ? ns * 4 : 0);
    float *scales = malloc((n * ns + 1) * sizeof *scales);
    rc = payloads && bin && buf && scales ? 0 : kvx_fail(-ENOMEM, "export: out of memory (%zu blocks)", n);
    for (size_t i = 0; !rc && i < n; i++) {
        uint8_t *pl = payloads + i * P;
        rc = kvx_page_to_envelope_payload(pl, version, g, views[i].page, views[i].token_count, views[i].scales);
        bin[i].hash = views[i].hash;
        bin[i].n_tokens = views[i].token_count;
        bin[i].payload = pl;
        if (!rc && version == KVX_ENVELOPE_V2) {
            memcpy(scales + i * ns, pl + elem_bytes, ns * sizeof(float));
            bin[i].scales = scales + i * ns;
        }
    }
    if (!rc) rc = kvx_envelope_export(buf, len, version, g, bin, (uint32_t)n);
    free(payloads);
    free(bin);
    free(scales);
    if (rc) {
        free(buf);
        return rc;
    }
    *out_buf = buf;
    *out_len = len;
    return 0;
}
