"""Hybrid models (Mamba/GDN, SWA, DSA indexer, DeepSeek V4-class): their
host pools beside the KV pool, through HiCacheStorage's v2 interface
(register_mem_host_pool_v2, batch_exists_v2, batch_get_v2, batch_set_v2),
and the plain controller's batch_get_v2 of KV-derived sidecar pools."""
import array
import random

import pytest

import kvx
from sglang_driver import (MHAHostPool, PoolHitPolicy, PoolName, PoolTransfer, SidecarHostPool,
                           create_dynamic_backend, page_hashes, page_transfer_kv_batch, storage_config)

PAGE = 4
MARK = 0xA7


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


@pytest.fixture
def hybrid(tmp_path):
    kv = MHAHostPool(page_size=PAGE)
    mamba = SidecarHostPool(page_size=PAGE, parts=2, part_bytes=3072)  # temporal + conv state
    indexer = SidecarHostPool(page_size=PAGE, parts=1, part_bytes=1024)
    b = create_dynamic_backend(storage_config(extra(tmp_path / "l3"), model="Qwen/Qwen3-Next-80B-A3B"), kv)
    b.register_mem_host_pool_v2(mamba, PoolName.MAMBA)
    b.register_mem_host_pool_v2(indexer, PoolName.INDEXER)
    for p in range(8):
        kv.fill_page(p, seed=p)
        mamba.fill_page(p, seed=100 + p)
        indexer.fill_page(p, seed=200 + p)
    yield b, kv, mamba, indexer
    b.close()


# PROMISE: ENGINE-18
def test_v2_pools_round_trip(hybrid):
    """batch_set_v2 stores the KV pages and each pool's pages in one durable batch ({pool: [True] * n});
    batch_exists_v2 gives the usable prefix under each pool's hit policy; batch_get_v2 fills each pool's buffers
    with the bytes stored, a page not held leaving its buffers untouched. Before, the base class raised
    NotImplementedError inside the prefetch thread."""
    b, kv, mamba, indexer = hybrid
    ks = keys(4, 1)
    res = b.batch_set_v2([PoolTransfer(PoolName.KV, host_indices=indices(range(4)), keys=ks),
                          PoolTransfer(PoolName.INDEXER, host_indices=indices(range(4)), keys=ks,
                                       indices_from_pool=PoolName.KV),
                          PoolTransfer(PoolName.MAMBA, host_indices=indices([3]), keys=ks[3:])])
    assert res == {PoolName.KV: [True] * 4, PoolName.INDEXER: [True] * 4, PoolName.MAMBA: [True]}
    r = b.batch_exists_v2(ks, [PoolTransfer(PoolName.INDEXER, keys=ks),
                               PoolTransfer(PoolName.MAMBA, keys=ks[3:], hit_policy=PoolHitPolicy.TRAILING_PAGES)])
    assert r.kv_hit_pages == 4
    assert r.extra_pool_hit_pages == {PoolName.KV: 4, PoolName.INDEXER: 4, PoolName.MAMBA: 4}
    kv.mark_pages(range(10, 14), MARK)
    indexer.mark_pages(range(10, 14), MARK)
    mamba.mark_pages([12, 13], MARK)
    got = b.batch_get_v2([PoolTransfer(PoolName.KV, host_indices=indices(range(10, 14)), keys=ks),
                          PoolTransfer(PoolName.INDEXER, host_indices=indices(range(10, 14)), keys=ks),
                          PoolTransfer(PoolName.MAMBA, host_indices=indices([12, 13]), keys=ks[2:])])
    assert got == {PoolName.KV: [True] * 4, PoolName.INDEXER: [True] * 4, PoolName.MAMBA: [False, True]}
    assert [kv.page_bytes_of(p) for p in range(10, 14)] == [kv.page_bytes_of(p) for p in range(4)]
    assert [indexer.page_bytes_of(p) for p in range(10, 14)] == [indexer.page_bytes_of(p) for p in range(4)]
    assert mamba.page_bytes_of(13) == mamba.page_bytes_of(3)
    assert mamba.page_bytes_of(12) == bytes([MARK]) * (2 * 3072)  # no state stored for page 2: untouched
    # v2's KV pages are v1's: the v1 calls see them
    assert b.batch_exists(ks) == 4


# PROMISE: ENGINE-18
def test_v2_hit_policies(hybrid):
    """An ALL_PAGES pool shortens the prefix to its first missing page; a TRAILING_PAGES pool (Mamba state)
    ends the prefix where its window of trailing pages is held; the prefix is the longest every pool can
    restore."""
    b, kv, mamba, indexer = hybrid
    ks = keys(6, 2)
    b.batch_set_v2([PoolTransfer(PoolName.KV, host_indices=indices(range(6)), keys=ks),
                    PoolTransfer(PoolName.INDEXER, host_indices=indices(range(5)), keys=ks[:5]),
                    PoolTransfer(PoolName.MAMBA, host_indices=indices([1, 3]), keys=[ks[1], ks[3]])])
    trail = PoolTransfer(PoolName.MAMBA, keys=ks[5:], hit_policy=PoolHitPolicy.TRAILING_PAGES)
    r = b.batch_exists_v2(ks, [trail])
    assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (4, {PoolName.KV: 6, PoolName.MAMBA: 4})
    r = b.batch_exists_v2(ks, [PoolTransfer(PoolName.INDEXER, keys=ks), trail])
    assert r.kv_hit_pages == 4 and r.extra_pool_hit_pages[PoolName.INDEXER] == 5
    r = b.batch_exists_v2(ks, [PoolTransfer(PoolName.MAMBA, keys=ks[4:], hit_policy=PoolHitPolicy.TRAILING_PAGES)])
    assert r.kv_hit_pages == 0 and r.extra_pool_hit_pages == {PoolName.KV: 6}  # no window of 2 held pages
    assert b.batch_exists_v2(keys(2, 3), [trail]).kv_hit_pages == 0  # no KV page: nothing


# PROMISE: ENGINE-18
def test_plain_controller_reads_kv_derived_sidecars(hybrid):
    """The plain controller's _page_transfer_kv_batch: the KV pages by batch_get_v1, then batch_get_v2 of a
    KV-derived sidecar pool (DSA indexer) with the KV's host indices; the pages counted are the fewer of the
    two."""
    b, kv, mamba, indexer = hybrid
    ks = keys(5, 4)
    assert b.batch_set_v1(ks, indices(range(5))) == [True] * 5
    b.batch_set_v2([PoolTransfer(PoolName.INDEXER, host_indices=indices(range(3)), keys=ks[:3])])
    assert page_transfer_kv_batch(b, ks, indices(range(10, 15)), [PoolName.INDEXER]) == 3
    assert [indexer.page_bytes_of(p) for p in range(10, 13)] == [indexer.page_bytes_of(p) for p in range(3)]
    assert page_transfer_kv_batch(b, ks, indices(range(20, 25)), []) == 5


def test_v2_pool_errors_raise(hybrid, tmp_path):
    """A pool never registered, or one without page buffers, is a programming error: kvx.InvalidError (at
    registration, so the launch fails)."""
    b, kv, mamba, indexer = hybrid
    with pytest.raises(kvx.InvalidError, match="not registered"):
        b.batch_get_v2([PoolTransfer(PoolName.SWA, host_indices=indices([0]), keys=keys(1, 5))])
    with pytest.raises(kvx.InvalidError, match="get_page_buffer_meta"):
        b.register_mem_host_pool_v2(object(), PoolName.SWA)
    assert b.batch_get_v2([]) == {} and b.batch_set_v2([]) == {}
