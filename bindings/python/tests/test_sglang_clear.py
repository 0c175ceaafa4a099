"""clear(): SGLang's "clear the L3 storage" (after a weight update) must
clear, or raise so SGLang reports the failure; it ignores the value and
logs success, so a False was a lie that kept stale KV."""
import array
import random

import pytest

from sglang_driver import MHAHostPool, create_dynamic_backend, page_hashes, storage_config

PAGE = 4


def extra(path, **kw):
    e = {"backend_name": "kvx", "module_path": "kvx.integrations.sglang", "class_name": "KvxHiCacheStorage",
         "interface_v1": 1, "path": str(path), "page_bytes": 65536, "capacity": "64MiB", "nosync": True}
    e.update(kw)
    return e


def indices(pages):
    out = array.array("q")
    for p in pages:
        out.extend(range(p * PAGE, (p + 1) * PAGE))
    return out


def keys(n, seed):
    rng = random.Random(seed)
    return page_hashes([rng.randrange(150000) for _ in range(n * PAGE)], PAGE)


# PROMISE: ENGINE-19
def test_clear_clears(tmp_path):
    """After clear() no page is held or served, by this backend nor after a restart, and the store takes new
    pages at once; the generic interface's pages go too."""
    cfg = storage_config(extra(tmp_path / "l3"))
    pool = MHAHostPool(page_size=PAGE)
    b = create_dynamic_backend(cfg, pool)
    ks = keys(6, 1)
    for p in range(6):
        pool.fill_page(p, seed=p)
    assert b.batch_set_v1(ks, indices(range(6))) == [True] * 6
    assert b.set("generic", b"x" * 100) is True
    assert b.batch_exists(ks) == 6
    assert b.clear() is True
    assert b.batch_exists(ks) == 0 and not b.exists("generic") and b.get("generic") is None
    pool.mark_pages(range(10, 16), 0xA7)
    assert b.batch_get_v1(ks, indices(range(10, 16))) == [False] * 6
    assert all(pool.page_is_marked(p, 0xA7) for p in range(10, 16))
    assert b.batch_set_v1(ks[:2], indices(range(2))) == [True, True]
    b.close()
    b = create_dynamic_backend(cfg, MHAHostPool(page_size=PAGE))
    try:
        assert b.batch_exists(ks) == 2 and b.batch_exists(ks[2:]) == 0
    finally:
        b.close()


# PROMISE: ENGINE-19
def test_clear_that_cannot_clear_raises(tmp_path):
    """A clear() that cannot run (a closed backend here) raises, so SGLang reports a failure instead of
    logging success."""
    b = create_dynamic_backend(storage_config(extra(tmp_path / "l3")), MHAHostPool(page_size=PAGE))
    b.close()
    with pytest.raises(ValueError, match="closed"):
        b.clear()


# PROMISE: ENGINE-19
def test_mla_clear_by_rank0_clears_every_rank(tmp_path):
    """MLA at TP 2: every rank is told to clear; TP rank 0 clears the one shared store, the follower (which
    holds no store of its own) answers True, and neither rank hits a page after."""
    from sglang_driver import MLAHostPool
    ex = extra(tmp_path / "l3")
    p0, p1 = MLAHostPool(page_size=PAGE), MLAHostPool(page_size=PAGE)
    r0 = create_dynamic_backend(storage_config(ex, tp_rank=0, tp_size=2, mla=True), p0)
    r1 = create_dynamic_backend(storage_config(ex, tp_rank=1, tp_size=2, mla=True), p1)
    try:
        ks = keys(3, 2)
        for p in range(3):
            p0.fill_page(p, seed=p)
        assert r0.batch_set_v1(ks, indices(range(3))) == [True] * 3
        assert r1.batch_exists(ks) == 3
        assert r1.clear() is True and r0.clear() is True
        assert r0.batch_exists(ks) == 0 and r1.batch_exists(ks) == 0
    finally:
        r1.close()
        r0.close()
