"""Shared fixtures of the Python binding's tests (run with
`PYTHONPATH=build/python /usr/bin/python3 -m pytest bindings/python/tests`,
or through ctest: the test python_binding)."""
import numpy as np
import pytest

import kvx

# One layer, two KV heads, D = 8, B = 16, fp16: 1 KiB pages.
GEOM = dict(num_layers=1, kv_heads=2, head_dim=8, block_tokens=16)
B = GEOM["block_tokens"]


def seq_tokens(s, n_blocks, extra=5):
    """Token ids of sequence s (as bench_prefix_c.c): n_blocks full blocks plus a partial tail."""
    i = np.arange(n_blocks * B + extra, dtype=np.int64)
    return (((s * 1000003 + i * 7919 + 1) & 0xFFFFFF) + 1).astype(np.uint32)


def kv_pages(store, n_blocks, seed=0):
    """n_blocks fp16 pages of random values, shaped [block][K|V][L][Hkv][B][D]."""
    g = store.geometry
    shape = (n_blocks, 2, g["num_layers"], g["kv_heads"], g["block_tokens"], g["head_dim"])
    a = np.random.default_rng(seed).standard_normal(shape).astype(np.float16)
    assert a.nbytes == n_blocks * store.page_bytes
    return a


@pytest.fixture
def store(tmp_path):
    with kvx.Store.create(str(tmp_path / "store"), **GEOM, nosync=True) as st:
        yield st


@pytest.fixture
def filled(store):
    """The store with sequence 0's four blocks flushed; yields (store, tokens, pages)."""
    toks = seq_tokens(0, 4)
    pages = kv_pages(store, 4)
    assert store.put(toks, pages) == 4
    store.flush()
    return store, toks, pages
