"""Store namespaces: a store is named after a digest of what makes its
pages' bytes (model and revision, dtype, page size, layout, the buffers of
a page, MLA/hybrid, the parallel ranks that split the pages), so a changed
layout never reads another layout's pages as its own."""
import array
import json
import logging
import os
import random

import pytest

import kvx
from kvx.integrations import _common
from kvx.integrations.sglang import KvxHiCacheStorage, rank_tag
from sglang_driver import MHAHostPool, MLAHostPool, create_dynamic_backend, page_hashes, storage_config

PAGE = 4


def extra(path, **kw):
    e = {"backend_name": "kvx", "module_path": "kvx.integrations.sglang", "class_name": "KvxHiCacheStorage",
         "interface_v1": 1, "path": str(path), "page_bytes": 65536, "capacity": "64MiB", "nosync": True,
         "revision": "r1"}
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


def open_dir(ex, pool, **cfg):
    b = create_dynamic_backend(storage_config(ex, **cfg), pool)
    d = b.dir
    b.close()
    return d


class LayerFirst(MHAHostPool):
    layout = "layer_first"


# PROMISE: ENGINE-22
def test_each_layout_its_own_store(tmp_path):
    """Pages stored under one dtype are not found under another of the same size (bf16 then fp16: the same
    buffer sizes); the same config finds them again (a restart). Before, the store was chosen by model and
    ranks alone and the fp16 engine read the bf16 pages as its own."""
    ex = extra(tmp_path / "l3")
    pool = MHAHostPool(page_size=PAGE, dtype="torch.bfloat16")
    b = create_dynamic_backend(storage_config(ex), pool)
    ks = keys(3, 1)
    for p in range(3):
        pool.fill_page(p, seed=p)
    assert b.batch_set_v1(ks, indices(range(3))) == [True] * 3
    b.close()
    fp16 = create_dynamic_backend(storage_config(ex), MHAHostPool(page_size=PAGE, dtype="torch.float16"))
    try:
        assert fp16.batch_exists(ks) == 0
        assert fp16.batch_get_v1(ks, indices(range(3))) == [False] * 3
    finally:
        fp16.close()
    again = create_dynamic_backend(storage_config(ex), MHAHostPool(page_size=PAGE, dtype="torch.bfloat16"))
    try:
        assert again.dir == b.dir and again.batch_exists(ks) == 3
    finally:
        again.close()


# PROMISE: ENGINE-22
def test_what_names_a_store(tmp_path):
    """The directory's digest changes with the dtype, the page size in tokens, the host layout, the buffer
    sizes, the revision, the model and (MHA) the TP rank; an MLA store is one for every TP rank, its pp rank
    still apart."""
    ex = extra(tmp_path / "l3")
    base = open_dir(ex, MHAHostPool(page_size=PAGE))
    assert base == open_dir(ex, MHAHostPool(page_size=PAGE))
    assert os.path.basename(base).startswith("Qwen-Qwen3-8B_tp0of1_")
    variants = [open_dir(ex, MHAHostPool(page_size=PAGE, dtype="torch.float16")),
                open_dir(ex, MHAHostPool(page_size=2 * PAGE)),
                open_dir(ex, LayerFirst(page_size=PAGE)),
                open_dir(ex, MHAHostPool(page_size=PAGE, dim=32)),
                open_dir(dict(ex, revision="r2"), MHAHostPool(page_size=PAGE)),
                open_dir(ex, MHAHostPool(page_size=PAGE), model="Qwen/Qwen3-4B"),
                open_dir(ex, MHAHostPool(page_size=PAGE), tp_rank=1, tp_size=2)]
    assert len({base, *variants}) == 1 + len(variants)
    mla = open_dir(ex, MLAHostPool(page_size=PAGE), mla=True, tp_rank=0, tp_size=4)
    assert os.path.basename(mla).startswith("Qwen-Qwen3-8B_mla_")
    cfg = storage_config(ex, mla=True, tp_rank=0, tp_size=4)
    cfg.pp_rank, cfg.pp_size = 1, 2
    b = KvxHiCacheStorage(cfg, {"mem_pool_host": MLAHostPool(page_size=PAGE)})
    try:
        assert "_mla_pp1of2_" in os.path.basename(b.dir) and b.dir != mla
    finally:
        b.close()
    with kvx.Store.open(base, readonly=True) as st:
        rec = json.loads(_common.read_namespace(st))
    assert rec["dtype"] == "torch.bfloat16" and rec["page_tokens"] == PAGE and rec["layout"] == "page_first"
    assert rec["ranks"] == {"tp": [0, 1]} and rec["revision"] == "r1" and rec["buffers"] == [2048, 2048]


# PROMISE: ENGINE-22
def test_revision_from_local_config_files(tmp_path, caplog):
    """A model given as a local path, with no revision: its config files' digest is the revision, so an edited
    config.json opens another store. With neither, the log says so once."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 4096}')
    ex = extra(tmp_path / "l3", revision=None)
    first = open_dir(ex, MHAHostPool(page_size=PAGE), model=str(model))
    assert open_dir(ex, MHAHostPool(page_size=PAGE), model=str(model)) == first
    (model / "config.json").write_text('{"hidden_size": 5120}')
    assert open_dir(ex, MHAHostPool(page_size=PAGE), model=str(model)) != first
    with caplog.at_level(logging.WARNING, logger="kvx.integrations"):
        open_dir(ex, MHAHostPool(page_size=PAGE), model="org/no-such-local-model")
        open_dir(ex, MHAHostPool(page_size=PAGE), model="org/no-such-local-model")
    said = [r for r in caplog.records if "no model revision" in r.getMessage()]
    assert len(said) == 1 and "org/no-such-local-model" in said[0].getMessage()


def _old_store(path, cfg, record=None, n=3):
    """A store under the rank's old name (before namespaces), with n pages and, when given, a namespace
    record. -> the page keys."""
    d = os.path.join(path, rank_tag(cfg))
    os.makedirs(path, exist_ok=True)
    ks = keys(n, 7)
    pool = MHAHostPool(page_size=PAGE)
    with kvx.Store.create(d, page_bytes=65536, capacity=64 << 20, nosync=True) as st:
        with st.batch() as b:
            ks_b = [k.encode() for k in ks]
            b.keyed_put(ks_b + [k + b"\x001" for k in ks_b] + [b"\x00kvx-sglang-parts"],
                        [pool.part_bytes_of(0, 0)] * n + [pool.part_bytes_of(0, 1)] * n + [b"2"])
            if record is not None:
                b.keyed_put([_common.NAMESPACE_KEY], [record])
    return d, ks


# PROMISE: ENGINE-23
def test_old_store_without_record_left_alone_and_logged(tmp_path, caplog):
    """A store under the rank's old name that records no namespace (written before them: its dtype and layout
    are unknown) is left alone, untouched and unread, its path and size logged once."""
    cfg = storage_config(extra(tmp_path / "l3"))
    old, ks = _old_store(str(tmp_path / "l3"), cfg)
    before = sorted(os.listdir(old))
    with caplog.at_level(logging.WARNING, logger="kvx.integrations.sglang"):
        b = create_dynamic_backend(cfg, MHAHostPool(page_size=PAGE))
        try:
            assert b.dir != old and b.batch_exists(ks) == 0
        finally:
            b.close()
        create_dynamic_backend(cfg, MHAHostPool(page_size=PAGE)).close()
    said = [r.getMessage() for r in caplog.records if "left" in r.getMessage()]
    assert len(said) == 1 and old in said[0] and f"({_common.dir_bytes(old)} bytes)" in said[0]
    assert "records no namespace" in said[0]
    assert sorted(os.listdir(old)) == before


# PROMISE: ENGINE-23
def test_old_store_with_matching_record_adopted(tmp_path, caplog):
    """An old-name store that records this very namespace is taken over (renamed to the new name) on the first
    open, its pages served; one recording another namespace is left alone and logged."""
    ex = extra(tmp_path / "l3")
    cfg = storage_config(ex)
    probe = KvxHiCacheStorage(storage_config(extra(tmp_path / "probe")), {"mem_pool_host": MHAHostPool(page_size=PAGE)})
    rec = probe.namespace[1]
    probe.close()
    old, ks = _old_store(str(tmp_path / "l3"), cfg, record=rec)
    b = create_dynamic_backend(cfg, MHAHostPool(page_size=PAGE))
    try:
        assert not os.path.exists(old) and b.batch_exists(ks) == 3
    finally:
        b.close()
    ex2 = extra(tmp_path / "l3b")
    cfg2 = storage_config(ex2)
    other = json.dumps({"kvx_namespace": 1, "dtype": "torch.float16"}).encode()
    old2, ks2 = _old_store(str(tmp_path / "l3b"), cfg2, record=other)
    with caplog.at_level(logging.WARNING, logger="kvx.integrations.sglang"):
        b = create_dynamic_backend(cfg2, MHAHostPool(page_size=PAGE))
    try:
        assert os.path.exists(old2) and b.batch_exists(ks2) == 0
        assert any(old2 in r.getMessage() and "another namespace" in r.getMessage() for r in caplog.records)
    finally:
        b.close()


# PROMISE: ENGINE-22
def test_named_directory_of_another_namespace_refused(tmp_path):
    """per_rank_path: a directory named by hand that holds another namespace's pages is refused with
    kvx.ShapeError at setup (the launch fails), never read."""
    ex = extra(tmp_path / "mine", per_rank_path=True)
    create_dynamic_backend(storage_config(ex), MHAHostPool(page_size=PAGE)).close()
    with pytest.raises(kvx.ShapeError, match="another namespace"):
        create_dynamic_backend(storage_config(ex), MHAHostPool(page_size=PAGE, dtype="torch.float16"))
