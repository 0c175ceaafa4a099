"""holes=True: a block store's writer that evicts in place (KVX_STORE_HOLES, docs/STORE.md "Holes"), as Go's
StoreOptions.Holes (bindings/go/holes_test.go)."""
import os

import pytest

import kvx
from conftest import B, GEOM, kv_pages, seq_tokens

NB = 8  # blocks a prompt


# PROMISE: PY-24
def test_holes_evict_in_place(tmp_path):
    """Created and reopened with holes=True: pages are freed in place (the free log DIR/FREED appears, blocks
    are evicted), a prompt read after every put stays whole and byte-exact through the evictions, and every
    other prompt is served whole, as a shorter prefix or not at all, never with a wrong page."""
    d = str(tmp_path / "store")
    st = kvx.Store.create(d, **GEOM, capacity=1 << 20, nosync=True, holes=True)
    want = {}

    def check(s, q):
        toks = seq_tokens(q, NB)
        views = s.prefix(toks)
        for i, v in enumerate(views):
            assert bytes(v) == want[q][i].tobytes(), "prompt %d block %d: a wrong page" % (q, i)
        n = len(views)
        for v in views:
            v.release()
        return n

    nseq = 300
    for q in range(nseq):
        toks = seq_tokens(q, NB)
        want[q] = kv_pages(st, NB, seed=q)
        st.put(toks, want[q])
        st.flush()
        assert check(st, 0) == NB, "after prompt %d the hot prompt lost blocks" % q
    stat = st.stat()
    assert stat["evicted_blocks"] > 0
    assert 0 < stat["freed_bytes"] < stat["bytes"]  # the files' sizes count the pages freed in place
    assert os.path.isfile(os.path.join(d, "FREED"))
    st.close()

    with pytest.raises(kvx.InvalidError, match="KVX_STORE_HOLES"):
        kvx.Store.open(d, readonly=True, holes=True)
    with kvx.Store.open(d, holes=True) as r:
        whole = sum(check(r, q) == NB for q in range(nseq))
        assert 0 < whole < nseq, "%d of %d prompts whole after the evictions" % (whole, nseq)
