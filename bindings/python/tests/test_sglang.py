"""Contract tests of kvx.integrations.sglang.KvxHiCacheStorage, SGLang
HiCache's storage backend, driven by sglang_driver (a reproduction of
SGLang's dynamic backend loader, cache-controller storage paths and host
pools (ctypes host memory) at the commit docs/ENGINES.md names)."""
import array
import ctypes
import os
import random
import re
import subprocess
import sys
import textwrap
import threading

import pytest

import kvx
from conftest import needs_numpy, np
from kvx.integrations.sglang import KvxHiCacheStorage
from sglang_driver import (MHAHostPool, MLAHostPool, base_class, create_dynamic_backend, generic_page_get,
                           generic_page_set, page_get_zero_copy, page_hashes, page_set_zero_copy, storage_config,
                           storage_hit_query)

PAGE = 4  # tokens per page
MARK = 0xA7  # a byte the tests put in host buffers that nothing may write


def extra(path, **kw):
    e = {"backend_name": "kvx", "module_path": "kvx.integrations.sglang", "class_name": "KvxHiCacheStorage",
         "path": str(path), "page_bytes": 65536, "capacity": "64MiB", "nosync": True}
    e.update(kw)
    return e


def prompt(n_pages, seed=0):
    rng = random.Random(seed)
    return [rng.randrange(150000) for _ in range(n_pages * PAGE)]


def indices(pool, pages):
    out = array.array("q")
    for p in pages:
        out.extend(pool.page_indices(p))
    return out


def run_py(code, timeout=60):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=dict(os.environ), timeout=timeout)


@pytest.fixture
def mha(tmp_path):
    pool = MHAHostPool(page_size=PAGE)
    b = create_dynamic_backend(storage_config(extra(tmp_path / "l3"), tp_rank=1, tp_size=2), pool)
    yield b, pool
    b.close()


# PROMISE: ENGINE-25
def test_dynamic_backend_loads(mha, tmp_path):
    """--hicache-storage-backend dynamic with the issue's extra_config: the class subclasses HiCacheStorage
    (SGLang's, or the stand-in here), is built as (storage_config, kwargs), and its store lives in the rank's
    own directory."""
    b, pool = mha
    assert isinstance(b, base_class()) and isinstance(b, KvxHiCacheStorage)
    assert b.dir == str(tmp_path / "l3" / ("Qwen-Qwen3-8B_tp1of2_" + b.namespace[0]))
    assert re.fullmatch(r"[0-9a-f]{16}", b.namespace[0])
    assert b.mem_pool_host is pool and b.page_bytes == 65536
    cfg = storage_config({"backend_name": "kvx", "module_path": "kvx.integrations.sglang"})
    with pytest.raises(ValueError):
        create_dynamic_backend(cfg, pool)


# PROMISE: ENGINE-11
def test_v1_zero_copy_backup_and_prefetch(mha):
    """Backup: batch_set_v1 from the host pool's page pointers; prefetch: hit query (batch_exists leading
    count), then batch_get_v1 straight into other host pages; every byte arrives."""
    b, pool = mha
    toks = prompt(8)
    hashes = page_hashes(toks, PAGE)
    for p in range(8):
        pool.fill_page(p, seed=p)
    assert page_set_zero_copy(b, hashes, indices(pool, range(8)))
    want = [pool.page_bytes_of(p) for p in range(8)]
    held, n_tok = storage_hit_query(b, toks + [1, 2], PAGE)  # a partial tail page is never queried
    assert held == hashes and n_tok == 8 * PAGE
    assert page_get_zero_copy(b, held, indices(pool, range(16, 24))) == 8
    assert [pool.page_bytes_of(p) for p in range(16, 24)] == want


# PROMISE: ENGINE-13
def test_batch_exists_leading_count(mha):
    b, pool = mha
    hashes = page_hashes(prompt(5, seed=1), PAGE)
    for p in range(5):
        pool.fill_page(p, seed=10 + p)
    b.batch_set_v1([hashes[i] for i in (0, 1, 3)], indices(pool, (0, 1, 3)))
    assert b.batch_exists(hashes) == 2
    assert b.batch_exists(hashes[3:4]) == 1 and b.batch_exists(hashes[2:]) == 0 and b.batch_exists([]) == 0
    assert [b.exists(h) for h in hashes] == [True, True, False, True, False]


# PROMISE: ENGINE-11
def test_v1_partial_miss_leaves_pages_untouched(mha):
    b, pool = mha
    hashes = page_hashes(prompt(3, seed=2), PAGE)
    for p in range(3):
        pool.fill_page(p, seed=20 + p)
    b.batch_set_v1([hashes[0], hashes[2]], indices(pool, (0, 2)))
    pool.mark_pages((10, 11, 12), MARK)
    assert b.batch_get_v1(hashes, indices(pool, (10, 11, 12))) == [True, False, True]
    assert pool.page_bytes_of(10) == pool.page_bytes_of(0) and pool.page_bytes_of(12) == pool.page_bytes_of(2)
    assert pool.page_is_marked(11, MARK)  # the miss: untouched
    assert page_get_zero_copy(b, hashes, indices(pool, (20, 21, 22))) == 1  # the controller stops at the miss


# PROMISE: ENGINE-11
def test_v1_half_held_page(mha):
    """A page whose K part is held but whose V part is gone (evicted, deleted) is False and leaves both of its
    buffers untouched: the K buffer was filled before, though the page was reported missing."""
    b, pool = mha
    hashes = page_hashes(prompt(2, seed=5), PAGE)
    for p in range(2):
        pool.fill_page(p, seed=50 + p)
    assert b.batch_set_v1(hashes, indices(pool, (0, 1))) == [True, True]
    first = b._keys([hashes[0]], "test")[0]
    assert b._store.keyed_delete([b._part_keys([first], 2)[1]]) == 1
    pool.mark_pages((10, 11), MARK)
    assert b.batch_get_v1(hashes, indices(pool, (10, 11))) == [False, True]
    assert pool.page_is_marked(10, MARK)  # K and V untouched
    assert pool.page_bytes_of(11) == pool.page_bytes_of(1)


# PROMISE: ENGINE-12
def test_part_keys_never_collide_with_caller_keys(mha):
    """A page's later buffers are keyed key + NUL + j, which no caller's key can be (a key holding a NUL is
    refused): a page the generic set stored under "<key>/1" (buffer 1's name before) is a page of its own,
    never buffer 1 of page <key> (batch_set_v1 skipped V as held, and batch_get_v1 served it as V)."""
    b, pool = mha
    k = page_hashes(prompt(1, seed=6), PAGE)[0]
    x = bytearray(b"\x5a" * pool.element_bytes())
    assert b.set(k + "/1", x) is True
    pool.fill_page(0, seed=61)
    want = pool.page_bytes_of(0)
    assert b.batch_set_v1([k], indices(pool, [0])) == [True]
    pool.mark_pages([10], 0)
    assert b.batch_get_v1([k], indices(pool, [10])) == [True]
    assert pool.page_bytes_of(10) == want  # K and V are this page's
    assert bytes(b.get(k + "/1")) == bytes(x)
    for bad in (k + "\x001", b"a\x00b"):
        for call in (lambda: b.set(bad, x), lambda: b.batch_exists([bad]), lambda: b.exists(bad),
                     lambda: b.batch_get_v1([bad], indices(pool, [1]))):
            with pytest.raises(kvx.InvalidError, match="NUL"):
                call()


# PROMISE: ENGINE-13
def test_batch_exists_checks_every_buffer_after_a_restart(tmp_path):
    """The buffers per page are recorded in the store with the pages: after a restart, batch_exists and exists
    (called before any v1 call has shown the new instance its pool) check every buffer of a page, so a page
    whose V buffer is gone is not counted (it was, on its K buffer alone, and the get then missed)."""
    cfg = storage_config(extra(tmp_path / "rs"))
    pool = MHAHostPool(page_size=PAGE)
    b = create_dynamic_backend(cfg, pool)
    hashes = page_hashes(prompt(3, seed=7), PAGE)
    for p in range(3):
        pool.fill_page(p, seed=70 + p)
    assert b.batch_set_v1(hashes, indices(pool, range(3))) == [True] * 3
    b.close()
    b = create_dynamic_backend(cfg, MHAHostPool(page_size=PAGE))
    try:
        assert b.batch_exists(hashes) == 3
        v_of_1 = b._part_keys(b._keys([hashes[1]], "test"), 2)[1]
        assert b._store.keyed_delete([v_of_1]) == 1
        assert b.batch_exists(hashes) == 1
        assert [b.exists(h) for h in hashes] == [True, False, True]
    finally:
        b.close()


# PROMISE: ENGINE-12
def test_pages_stored_under_the_old_part_names_are_misses(tmp_path):
    """Pages an earlier kvx stored as "<key>" and "<key>/1" (and no record of the buffers per page) are never
    read as one page now: batch_get_v1 reports the page missing and leaves its buffers untouched, and from
    then on batch_exists does not count it (docs/ENGINES.md: such pages are stored again, the old ones age
    out by eviction)."""
    pool = MHAHostPool(page_size=PAGE)
    b = create_dynamic_backend(storage_config(extra(tmp_path / "old")), pool)
    try:
        k = page_hashes(prompt(1, seed=8), PAGE)[0]
        pool.fill_page(0, seed=80)
        with b._store.batch() as w:
            w.keyed_put([k.encode(), k.encode() + b"/1"],
                        [pool.part_bytes_of(0, 0), pool.part_bytes_of(0, 1)])
        pool.mark_pages([10], MARK)
        assert b.batch_get_v1([k], indices(pool, [10])) == [False]
        assert pool.page_is_marked(10, MARK)
        assert b.batch_exists([k]) == 0 and not b.exists(k)
        assert b.batch_set_v1([k], indices(pool, [0])) == [True]  # stored again, whole
        assert b.batch_exists([k]) == 1
    finally:
        b.close()


# PROMISE: ENGINE-11
def test_mla_one_buffer_per_page(tmp_path):
    pool = MLAHostPool(page_size=PAGE)
    b = create_dynamic_backend(storage_config(extra(tmp_path / "mla"), mla=True), pool)
    try:
        hashes = page_hashes(prompt(4, seed=3), PAGE)
        for p in range(4):
            pool.fill_page(p, seed=30 + p)
        assert page_set_zero_copy(b, hashes, indices(pool, range(4)))
        assert b.batch_exists(hashes) == 4
        assert page_get_zero_copy(b, hashes, indices(pool, range(8, 12))) == 4
        assert [pool.page_bytes_of(p) for p in range(8, 12)] == [pool.page_bytes_of(p) for p in range(4)]
    finally:
        b.close()


# PROMISE: ENGINE-14
def test_generic_get_set(mha):
    """The copying interface: set/get/batch_set/batch_get over flat data pages; a miss is None."""
    b, pool = mha
    hashes = page_hashes(prompt(3, seed=4), PAGE)
    for p in range(3):
        pool.fill_page(p, seed=40 + p)
    assert generic_page_set(b, pool, hashes, indices(pool, range(3))) is True
    assert generic_page_get(b, pool, hashes, indices(pool, range(5, 8))) == 3
    assert [pool.page_bytes_of(p) for p in range(5, 8)] == [pool.page_bytes_of(p) for p in range(3)]
    t = pool.get_dummy_flat_data_page()
    assert b.get(hashes[1], t) is t and t.tobytes() == pool.get_data_page(PAGE).tobytes()
    assert b.get("f" * 64, pool.get_dummy_flat_data_page()) is None
    assert bytes(b.get(hashes[0])) == pool.get_data_page(0).tobytes()
    assert b.set("k", array.array("B", range(10))) is True and b.exists("k")
    got = b.batch_get(["k", "missing"], [bytearray(10), bytearray(10)])
    assert got[0] == bytearray(range(10)) and got[1] is None


def test_bad_input_raises_never_none(mha, tmp_path):
    """Programming errors raise kvx.InvalidError, never return None: bad keys, a page over page_bytes, no host
    pool, keys and page buffers that do not match (runtime failures are answered instead:
    test_sglang_failures.py)."""
    b, pool = mha
    with pytest.raises(kvx.InvalidError):
        b.batch_get_v1([""], indices(pool, [0]))
    with pytest.raises(kvx.InvalidError):
        b.batch_set_v1(["x" * 256], indices(pool, [0]))
    with pytest.raises(kvx.InvalidError):
        b.set("big", bytearray(65537))
    with pytest.raises(kvx.InvalidError):
        b.batch_get_v1(["a", "b"], indices(pool, [0]))  # 2 keys, 1 page of pointers
    bare = KvxHiCacheStorage(storage_config(extra(tmp_path / "bare")), {})
    with pytest.raises(kvx.InvalidError):
        bare.batch_get_v1(["a"], indices(pool, [0]))
    bare.close()
    none = array.array("q")
    assert b.batch_get_v1([], none) == [] and b.batch_set_v1([], none) == []


# PROMISE: ENGINE-24
def test_restart_between_set_and_get(tmp_path):
    """Another process backs pages up and dies without closing; this process (same rank) reopens the store,
    finds them by batch_exists and reads them by batch_get_v1."""
    path = str(tmp_path / "restart")
    r = run_py(f"""
        import array, os, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from sglang_driver import *
        pool = MHAHostPool(page_size={PAGE})
        ex = {{"backend_name": "kvx", "module_path": "kvx.integrations.sglang", "class_name": "KvxHiCacheStorage",
              "path": {path!r}, "page_bytes": 65536, "capacity": "64MiB"}}
        b = create_dynamic_backend(storage_config(ex), pool)
        for p in range(6):
            pool.fill_page(p, seed=50 + p)
        toks = list(range(1000, 1000 + 6 * {PAGE}))
        assert page_set_zero_copy(b, page_hashes(toks, {PAGE}), array.array("q", range(6 * {PAGE})))
        sys.stdout.write(" ".join(pool.page_bytes_of(p).hex() for p in range(6)))
        sys.stdout.flush()
        os._exit(0)
    """)
    assert r.returncode == 0, r.stderr
    want = [bytes.fromhex(h) for h in r.stdout.split()]
    pool = MHAHostPool(page_size=PAGE)
    b = create_dynamic_backend(storage_config(extra(path, nosync=False)), pool)
    try:
        toks = list(range(1000, 1000 + 6 * PAGE))
        held, _ = storage_hit_query(b, toks, PAGE)
        assert len(held) == 6
        assert page_get_zero_copy(b, held, indices(pool, range(6))) == 6
        assert [pool.page_bytes_of(p) for p in range(6)] == want
    finally:
        b.close()


# PROMISE: ENGINE-8
def test_second_process_same_rank_busy(mha, tmp_path):
    """Each rank's process owns its directory: the same rank in another process gets KVX_EBUSY at once,
    another tp rank opens its own."""
    code = f"""
        import sys, kvx
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from sglang_driver import *
        ex = {{"backend_name": "kvx", "module_path": "kvx.integrations.sglang", "class_name": "KvxHiCacheStorage",
              "path": {str(tmp_path / "l3")!r}, "page_bytes": 65536, "capacity": "64MiB"}}
        try:
            create_dynamic_backend(storage_config(ex, tp_rank=RANK, tp_size=2), MHAHostPool())
            print("opened")
        except kvx.BusyError as e:
            print(e.name)
    """
    r = run_py(code.replace("RANK", "1"))
    assert r.returncode == 0 and r.stdout.strip() == "KVX_EBUSY", r.stdout + r.stderr
    r = run_py(code.replace("RANK", "0"))
    assert r.returncode == 0 and r.stdout.strip() == "opened", r.stdout + r.stderr


# PROMISE: ENGINE-24
def test_concurrent_backup_and_prefetch(mha):
    """SGLang's backup and prefetch threads at once, on disjoint host pages."""
    b, pool = mha
    errors = []

    def backup(w):
        try:
            pages = range(w * 4, w * 4 + 4)
            for p in pages:
                pool.fill_page(p, seed=60 + p)
            hashes = page_hashes(prompt(4, seed=100 + w), PAGE)
            for _ in range(3):
                assert page_set_zero_copy(b, hashes, indices(pool, pages))
                dst = range(16 + w * 4, 20 + w * 4)
                assert page_get_zero_copy(b, hashes, indices(pool, dst)) == 4
                assert [pool.page_bytes_of(p) for p in dst] == [pool.page_bytes_of(p) for p in pages]
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=backup, args=(w,)) for w in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors


# PROMISE: ENGINE-25
def test_rank_tag_covers_every_parallel_dimension(tmp_path):
    cfg = storage_config(extra(tmp_path / "tags"), tp_rank=3, tp_size=4, model="org/m", dp_rank=1, dp_size=2)
    cfg.pp_rank, cfg.pp_size, cfg.attn_cp_rank, cfg.attn_cp_size = 1, 2, 0, 2
    b = KvxHiCacheStorage(cfg, {"mem_pool_host": MHAHostPool(page_size=PAGE)})
    assert os.path.basename(b.dir) == "org-m_tp3of4_pp1of2_cp0of2_dp1of2_" + b.namespace[0]
    b.close()
    b = KvxHiCacheStorage(storage_config(extra(tmp_path / "own", per_rank_path=True)), {})
    assert b.dir is None  # named once the host pool is registered (or at the first call)
    b.register_mem_pool_host(MHAHostPool(page_size=PAGE))
    assert b.dir == str(tmp_path / "own")
    b.close()


class _TensorLike:
    """What SGLang hands over when .numpy() cannot (a bf16 host tensor): data_ptr(), numel(), element_size(),
    is_contiguous(), device (torch.Tensor's methods of those names); no buffer protocol."""

    def __init__(self, arr, device="cpu"):
        self.arr, self.device = arr, type("D", (), {"type": device})()  # arr: a ctypes array

    def numpy(self):
        raise TypeError("Got unsupported ScalarType BFloat16")

    def data_ptr(self):
        return ctypes.addressof(self.arr)

    def numel(self):
        return len(self.arr)

    def element_size(self):
        return ctypes.sizeof(self.arr._type_)

    def is_contiguous(self):
        return True


# PROMISE: ENGINE-14
def test_tensor_like_values(mha):
    """set/get of host tensors that only expose data_ptr() (bf16), in place; a GPU tensor is refused."""
    b, _ = mha
    src = (ctypes.c_uint16 * 2048)(*range(2048))
    assert b.set("bf16-page", _TensorLike(src)) is True
    dst = (ctypes.c_uint16 * 2048)()
    t = _TensorLike(dst)
    assert b.get("bf16-page", t) is t and bytes(dst) == bytes(src)
    with pytest.raises(kvx.InvalidError):
        b.set("gpu-page", _TensorLike(src, device="cuda"))


class _StridedHostTensor:
    """What the SGLang adapter gets for a non-contiguous CPU tensor whose .numpy() fails (bf16, the usual KV
    dtype, or one that requires grad): data_ptr/numel/element_size of an expanded view, 64 bytes of storage
    that claim 4096 elements of 2 bytes."""

    class device:
        type = "cpu"

    def __init__(self, backing):
        import ctypes
        self._backing = backing
        self._addr = ctypes.addressof(backing)

    def numpy(self):
        raise TypeError("Got unsupported ScalarType BFloat16")

    def data_ptr(self):
        return self._addr

    def numel(self):
        return 4096

    def element_size(self):
        return 2

    def is_contiguous(self):
        return False

    def stride(self):
        return (0,)


# PROMISE: ENGINE-14
def test_sglang_refuses_a_non_contiguous_pointer_tensor(tmp_path):
    # kvx/integrations/sglang.py _as_buffer's data_ptr() path (a CPU tensor whose .numpy() fails: bf16,
    # requires_grad) took numel * element_size bytes from data_ptr without is_contiguous(): an expanded or
    # strided tensor was stored as wrong KV, and get wrote past its storage.
    import ctypes
    from kvx.integrations.sglang import KvxHiCacheStorage
    from sglang_driver import storage_config
    e = {"path": str(tmp_path / "sg"), "page_bytes": 8192, "capacity": "64MiB", "nosync": True}
    s = KvxHiCacheStorage(storage_config(e), {})
    try:
        assert s.set("k", bytes(range(256)) * 32)
        backing = (ctypes.c_ubyte * 8192)()
        ctypes.memset(backing, 0xAB, 8192)
        with pytest.raises(kvx.InvalidError, match="contiguous"):
            s.get("k", target_location=_StridedHostTensor(backing))
        assert bytes(backing[64:]) == b"\xab" * (8192 - 64), "get wrote past the tensor's storage"
        with pytest.raises(kvx.InvalidError, match="contiguous"):
            s.set("k2", _StridedHostTensor(backing))
    finally:
        s.close()



@needs_numpy
def test_numpy_values(mha):
    """numpy arrays as values and targets (CPU tensors reach the adapter as .numpy() arrays)."""
    b, _ = mha
    src = np.arange(4096, dtype=np.uint16)
    assert b.set("np-page", src) is True
    dst = np.zeros(4096, dtype=np.uint16)
    assert b.get("np-page", dst) is dst and np.array_equal(dst, src)
    assert b.batch_get(["np-page", "missing"], [np.zeros(4096, np.uint16), np.zeros(4096, np.uint16)])[1] is None
